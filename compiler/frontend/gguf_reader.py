"""gguf's GGUFReader, minus the cost of numpy.memmap views.

GGUFReader parses the metadata by taking a view of its memmap per value: a
262144-token vocabulary is ~1M views, and numpy.memmap's __getitem__ and
__array_finalize__ make each ~10x dearer than a plain array's (Gemma 3 270M:
12.6 s of CPU for the reader, 3.9 s with plain views). The views here come
from a plain ndarray over the same mapping, so tensor data stays in the
mapped file (no copy); every field and tensor is the reader's own
(tests/llm/test_gguf_reader.py compares them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf.gguf_reader import GGUFReader


class MappedGgufReader(GGUFReader):
    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: str | None = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:  # self.data (the memmap) is set before the first call
            plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
        dt = np.dtype(dtype)
        count = int(count)
        arr = plain[offset:offset + dt.itemsize * count].view(dt)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))
