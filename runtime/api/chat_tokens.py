"""Token ids of rendered chats, a message at a time: a chat's next turn
repeats the whole conversation, and tokenizing it again was a cached turn's
largest cost outside the engine (0.5-0.7 ms of ~3 for a 470-token chat on
the null device, bench/server.py).

The tokenizer (Hugging Face `tokenizers`) first cuts a text at its added
tokens (the control tokens a chat template writes around each message, and
user-defined ones), leftmost and longest first, and tokenizes each stretch
between them on its own. So the ids of a text are the ids of its stretches
and added tokens in order, and a stretch seen before (a message of an
earlier turn) is looked up, not tokenized again. tests/serve/test_chat_tokens.py
holds the equality with the tokenizer's own encode.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

from rkc.runtime.llm.tokenizer import LlmTokenizer


class ChatTokens:
    """encode(text) == tokenizer.encode(text, special=True), a stretch between
    added tokens tokenized once while it stays among the last `capacity` used."""

    def __init__(self, tokenizer: LlmTokenizer, capacity: int = 256) -> None:
        self.tokenizer, self.capacity = tokenizer, capacity
        added = {t.content: i for i, t in tokenizer.hf.get_added_tokens_decoder().items() if t.content}
        self.added = added
        # longest first: at a position, the alternation takes the longest added token there (the tokenizer's rule)
        names = sorted(added, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        self.memo: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()  # chat() may be called from several threads (one generates, the others fail)

    def encode(self, text: str) -> list[int]:
        tok = self.tokenizer
        ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
        if self.split is None:
            return ids + tok.encode(text, add_bos=False, special=True)
        for i, part in enumerate(self.split.split(text)):
            if i % 2:  # an added token (the split's captured group)
                ids.append(self.added[part])
            elif part:
                ids += self._stretch(part)
        return ids

    def _stretch(self, text: str) -> list[int]:
        with self._lock:
            got = self.memo.get(text)
            if got is not None:
                self.memo.move_to_end(text)
                return got
        got = self.tokenizer.encode(text, add_bos=False, special=True)
        with self._lock:
            self.memo[text] = got
            if len(self.memo) > self.capacity:
                self.memo.popitem(last=False)
        return got
