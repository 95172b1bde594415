"""Constrained decoding: a grammar (a JSON schema, any JSON object, a tool
call) turned into a mask over the vocabulary at every token, so that the
sampler can only pick tokens that keep the text a prefix of something the
grammar accepts. The grammar engine is llguidance (PyPI): it computes the
mask from the tokenizer's token bytes incrementally, ~0.1 ms a token on Gemma
3 270M's 262k vocabulary, with no per-schema index to build (bench/constrain.py
measures it against outlines-core; docs/api.md has the figures).

The mask is a bitmask (one bit per token, 32 to an int32 word, llguidance's
layout); `masked_logits` applies it in the same pass that widens the logits
to the float64 the sampler works in (a numba kernel: numpy's bitmask apply
took ~0.5-0.7 ms on 262k logits, more than the mask itself)."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
from numba import njit

from rkc.runtime.api.errors import RequestError

# Compact JSON (no optional whitespace): a model could otherwise pad forever with spaces and newlines, which the
# grammar allows; ", " and ": " as Python's json.dumps writes them, the form models have seen most.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@njit(cache=True, nogil=True)
def _masked(logits, bits, out):  # pragma: no cover (compiled)
    n = min(logits.size, bits.size * 32)
    for w in range(bits.size):
        word = np.uint32(bits[w])
        base = w * 32
        top = min(base + 32, n)
        if word == np.uint32(0xFFFFFFFF):
            for i in range(base, top):
                out[i] = logits[i]
        elif word == 0:
            for i in range(base, top):
                out[i] = -np.inf
        else:
            for i in range(base, top):
                out[i] = logits[i] if (word >> np.uint32(i - base)) & np.uint32(1) else -np.inf
    for i in range(n, out.size):
        out[i] = -np.inf


def masked_logits(logits: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """float64 logits with every token whose bit is 0 (or beyond the mask) at -inf."""
    logits = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
    out = np.empty(logits.size, np.float64)
    _masked(logits, np.ascontiguousarray(bits, dtype=np.int32).reshape(-1), out)
    return out


def json_grammar(schema: dict[str, Any] | bool | None, param: str = "response_format") -> str:
    """llguidance's grammar for JSON text matching `schema` (None: any JSON object); `param`: the request field
    an unusable schema is blamed on."""
    import llguidance  # deferred: only constrained requests need it

    schema = {"type": "object"} if schema is None else schema
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    except (ValueError, TypeError) as exc:
        raise RequestError(f"{param}: the JSON schema is not supported: {exc}", param) from None


class GrammarTokenizer:
    """llguidance's view of a model's tokenizer (every token's bytes, trees for
    the mask), built once per model on first use: ~4 s for a 262k vocabulary."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer, self._built, self._lock = tokenizer, None, threading.Lock()

    def get(self):
        with self._lock:
            if self._built is None:
                import llguidance

                tok = self._tokenizer
                self._built = llguidance.LLTokenizer(tok.hf.to_str(), n_vocab=tok.vocab_size,
                                                     eos_token=list(tok.eos_ids))
            return self._built


class Constraint:
    """One request's grammar state: `logits(raw)` masks, `accept(token)` advances."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str, param: str) -> None:
        import llguidance

        lltok = tokenizer.get()
        error = llguidance.LLMatcher.validate_grammar(grammar, lltok)
        if error:
            raise RequestError(f"{param}: the grammar is not usable: {error}", param)
        self.matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
        if self.matcher.is_error():
            raise RequestError(f"{param}: {self.matcher.get_error()}", param)
        self.bits = np.full((lltok.vocab_size + 31) // 32, -1, np.int32)

    def logits(self, raw: np.ndarray) -> np.ndarray:
        """float64 logits, every token the grammar forbids next at -inf (only EOS once it is complete)."""
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
        if self.matcher.is_error():  # a bug of ours (a token accepted that the mask forbade): not the client's
            raise RuntimeError(f"constrained decoding: {self.matcher.get_error()}")
        return masked_logits(raw, self.bits)

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)

    @property
    def complete(self) -> bool:
        """The text so far is a whole sentence of the grammar."""
        return self.matcher.is_accepting()
