"""Constrained decoding: a grammar (a JSON schema, any JSON object, a tool
call) turned into a mask over the vocabulary at every token, so that the
sampler can only pick tokens that keep the text a prefix of something the
grammar accepts. The grammar engine is llguidance (PyPI): it computes the
mask from the tokenizer's token bytes incrementally, ~0.1 ms a token on Gemma
3 270M's 262k vocabulary, with no per-schema index to build (bench/constrain.py
measures it against outlines-core; docs/api.md has the figures).

The mask is a bitmask (one bit per token, 32 to an int32 word, llguidance's
layout); `mask_logits` applies it in place (a numba kernel that writes only
the forbidden tokens: llguidance's numpy helper took 0.6-0.8 ms on 262k
logits, more than the mask itself). The next mask is computed on a thread
of its own while the NPU thread runs the decode step."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from numba import njit

from rkc.runtime.api.errors import RequestError

# Compact JSON (no optional whitespace): a model could otherwise pad forever with spaces and newlines, which the
# grammar allows; ", " and ": " as Python's json.dumps writes them, the form models have seen most.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@njit(cache=True, nogil=True, fastmath=False)
def _mask(logits, bits):  # pragma: no cover (compiled)
    # in place, a word of the mask at a time: a word of all ones (most of them while a string is written) costs
    # its read; only forbidden tokens are written. Against a masked copy (0.21 ms for 262k, 0.33 in the decode
    # loop, its caches cold) or llguidance's numpy helper (0.6-0.8 ms).
    n = min(logits.size, bits.size * 32)
    for w in range(bits.size):
        word = np.uint32(bits[w])
        if word != np.uint32(0xFFFFFFFF):
            for i in range(w * 32, min(w * 32 + 32, n)):
                if not (word >> np.uint32(i & 31)) & np.uint32(1):
                    logits[i] = -np.inf
    for i in range(n, logits.size):
        logits[i] = -np.inf


def mask_logits(logits: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """`logits` (a row, float32 or float64) with every token whose bit is 0 (or beyond the mask) at -inf: in
    place when the row is writable and contiguous (the sampler owns the row it is given), else in a copy."""
    row = logits.reshape(-1)
    if not (row.flags.c_contiguous and row.flags.writeable) or row.dtype not in (np.float32, np.float64):
        row = np.array(row, dtype=np.float64 if row.dtype == np.float64 else np.float32)
    _mask(row, np.ascontiguousarray(bits, dtype=np.int32).reshape(-1))
    return row


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
    the mask), built once per model: 3.5-14 s for a 262k vocabulary on this
    machine (llguidance releases the GIL meanwhile). `prepare()` starts it in
    the background (rkrun serve does at start); `get()` waits for it (or
    builds it, at the first constrained request of the Python API)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer, self._built, self._lock = tokenizer, None, threading.Lock()

    def prepare(self) -> None:
        threading.Thread(target=self.get, name="rkc-grammar-tokenizer", daemon=True).start()

    def get(self):
        with self._lock:
            if self._built is None:
                import llguidance

                tok = self._tokenizer
                self._built = llguidance.LLTokenizer(tok.hf.to_str(), n_vocab=tok.vocab_size,
                                                     eos_token=list(tok.eos_ids))
            return self._built


_masks: ThreadPoolExecutor | None = None
_masks_lock = threading.Lock()


def _mask_thread() -> ThreadPoolExecutor:
    """The thread that computes a request's next mask while the NPU thread runs the decode step (llguidance
    releases the GIL while it computes): on the NPU thread a token costs only the wait, if any, and the apply."""
    global _masks
    with _masks_lock:
        if _masks is None:
            _masks = ThreadPoolExecutor(1, thread_name_prefix="rkc-mask")
        return _masks


class Constraint:
    """One request's grammar state: `logits(raw)` masks, `accept(token)` advances. The mask of the next token
    is computed ahead, from the accept (the first: from the start, while the prompt is prefilled)."""

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
        self._next: Future = _mask_thread().submit(self._fill)

    def _fill(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)

    def logits(self, raw: np.ndarray) -> np.ndarray:
        """`raw`, every token the grammar forbids next at -inf (only EOS once it is complete): in place."""
        if self._next.cancel():  # the mask thread has not begun it (a busy machine): here, at once
            self._fill()
        else:
            self._next.result()
        if self.matcher.is_error():  # a bug of ours (a token accepted that the mask forbade): not the client's
            raise RuntimeError(f"constrained decoding: {self.matcher.get_error()}")
        return mask_logits(raw, self.bits)

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)  # (logits() has waited for the mask)
        self._next = _mask_thread().submit(self._fill)  # (complete: a mask of EOS alone)

    @property
    def complete(self) -> bool:
        """The text so far is a whole sentence of the grammar."""
        return self.matcher.is_accepting()
