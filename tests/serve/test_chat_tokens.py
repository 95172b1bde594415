"""A rendered chat's token ids, a stretch between added tokens at a time with
earlier stretches remembered (runtime/api/chat_tokens.py), are the
tokenizer's own encode of the whole text: both tokenizer kinds, control
tokens where a template writes them and where a user does, stretches that
start or end with spaces and newlines, a stretch met again, the memo full."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.api.chat_tokens import ChatTokens
from rkc.runtime.llm.tokenizer import LlmTokenizer

WORDS = ["the", "cat", " and", "dog ", "\n", "  ", "run", "world", "é", "日本", "<", "|", ">", "im", "_start"]


def texts(specials: list[str], rng: np.random.Generator, n: int) -> list[str]:
    out = []
    for _ in range(n):
        parts = []
        for _ in range(int(rng.integers(1, 12))):
            if rng.random() < 0.3:
                parts.append(specials[int(rng.integers(len(specials)))])
            else:
                parts.append("".join(rng.choice(WORDS, int(rng.integers(1, 6)))))
        out.append("".join(parts))
    return out


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "llama"])
def test_chat_tokens_are_the_tokenizers(arch, synth_gguf):
    tok = LlmTokenizer.from_gguf(str(synth_gguf(arch)))
    specials = [t.content for t in tok.hf.get_added_tokens_decoder().values()]
    assert specials
    chat = ChatTokens(tok, capacity=8)
    rng = np.random.default_rng(len(arch))
    cases = texts(specials, rng, 150)
    for text in cases + cases[::-1]:  # the second pass meets its stretches again (and the memo overflows)
        assert chat.encode(text) == tok.encode(text, special=True), repr(text)
    assert len(chat.memo) <= 8


def test_a_chats_next_turn_reuses_its_earlier_messages(synth_gguf):
    from llm.synth import CHATML
    from rkc.runtime.api.llm import render_chat

    tok = LlmTokenizer.from_gguf(str(synth_gguf("qwen3")))
    chat = ChatTokens(tok)
    first = [{"role": "system", "content": "the cat and the dog " * 20}, {"role": "user", "content": "hello"}]
    second = first + [{"role": "assistant", "content": "the world"}, {"role": "user", "content": "and the dog?"}]
    for messages in (first, second):
        text = render_chat(CHATML, messages)
        assert chat.encode(text) == tok.encode(text, special=True)
    calls = []
    tok.encode = lambda text, **kw: calls.append(text) or LlmTokenizer.encode(tok, text, **kw)
    chat.encode(render_chat(CHATML, second + [{"role": "assistant", "content": "run"}]))
    assert calls == ["assistant\nrun"]  # only the new message's stretch was tokenized
