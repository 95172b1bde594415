"""Generated tokens' log-probabilities (runtime/llm/generate.TokenLogprob) in
the shapes OpenAI's API gives them: a chat choice's {"content": [{token,
logprob, bytes, top_logprobs}]}, a completion choice's {tokens,
token_logprobs, top_logprobs, text_offset}. A stream gives each chunk the
tokens generated since the previous one."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rkc.runtime.llm.generate import TokenLogprob

Piece = Callable[[int], tuple[str, "list[int] | None"]]  # a token's text and bytes (LlmTokenizer.token_piece)


def chat_logprobs(picked: Sequence[TokenLogprob], piece: Piece) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text, raw = piece(token)
        return {"token": text, "logprob": logprob, "bytes": raw}
    return {"content": [{**entry(p.token, p.logprob), "top_logprobs": [entry(t, lp) for t, lp in p.top]}
                        for p in picked]}


def completion_logprobs(picked: Sequence[TokenLogprob], piece: Piece, offset: int = 0) -> dict[str, Any]:
    """`offset`: the characters of completion text before these tokens (a stream's earlier chunks)."""
    tokens, offsets = [], []
    for p in picked:
        offsets.append(offset)
        text = piece(p.token)[0]
        tokens.append(text)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [p.logprob for p in picked],
            "top_logprobs": [{piece(t)[0]: lp for t, lp in p.top} for p in picked], "text_offset": offsets}


def shaped(kind: str, picked: Sequence[TokenLogprob] | None, piece: Piece, offset: int = 0) -> dict[str, Any] | None:
    """A choice's "logprobs" for `kind` (chat or completion): None when none were asked for."""
    if picked is None:
        return None
    return chat_logprobs(picked, piece) if kind == "chat" else completion_logprobs(picked, piece, offset)
