"""gguf's GGUFReader, minus the cost of numpy.memmap views.

GGUFReader parses the metadata by taking a view of its memmap per value: a
262144-token vocabulary is ~1M views, and numpy.memmap's __getitem__ and
__array_finalize__ make each ~10x dearer than a plain array's (Gemma 3 270M:
12.6 s of CPU for the reader, 3.9 s with plain views). The views here come
from a plain ndarray over the same mapping, so tensor data stays in the
mapped file (no copy); every field and tensor is the reader's own
(tests/llm/test_gguf_reader.py compares them).

An array field is parsed in one pass: a scalar array as one view (GGUFReader
takes one per element, 262144 each for a vocabulary's scores and types), a
string array's lengths read with struct (Gemma 3 270M: the reader's 3.8 s of
CPU became 0.35 s).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from gguf.constants import GGUFValueType
from gguf.gguf_reader import GGUFReader

_U64 = struct.Struct("<Q")


class MappedGgufReader(GGUFReader):
    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: str | None = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:  # self.data (the memmap) is set before the first call
            plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
        dt = np.dtype(dtype)
        count = int(count)
        arr = plain[offset:offset + dt.itemsize * count].view(dt)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[np.ndarray], list[int], list]:
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        count, offs = int(alen[0]), orig_offs + 12
        itype = GGUFValueType(raw_itype[0])
        nptype = self.gguf_scalar_to_np.get(itype)
        if count == 0 or (nptype is None and itype != GGUFValueType.STRING):
            return super()._get_field_parts(orig_offs, raw_type)
        types = [GGUFValueType.ARRAY, itype]
        if nptype is not None:  # one part holding every element (contents() flattens the parts)
            values = self._get(offs, nptype, count)
            if len(values) != count:
                raise ValueError(f"array of {count} values runs past the end of the file")
            return 12 + values.nbytes, [raw_itype, alen, values], [2], types
        plain = self.__dict__["_plain"]
        buf = memoryview(plain)
        parts: list[np.ndarray] = [raw_itype, alen]
        for _ in range(count):
            (n,) = _U64.unpack_from(buf, offs)
            if offs + 8 + n > len(plain):
                raise ValueError("string runs past the end of the file")
            parts += (plain[offs:offs + 8].view(np.uint64), plain[offs + 8:offs + 8 + n])
            offs += 8 + n
        return offs - orig_offs, parts, list(range(3, len(parts), 2)), types
