"""Operands decoded from memory, kept while the bytes they came from are unchanged.

Converting weights from the native layout (a transposing copy plus a widening
cast) costs more than multiplying them for a GEMV, and a model runs the same
weights on every token. So the blocks decode an operand once and keep it here,
keyed by the bytes it came from (BO, byte range) and how it was decoded (the
`form`: layout, precision, shape). Sound because every way a BO's contents can
change drops the entries that read them:

* an NPU write (DPU/PPU write-back) drops every entry overlapping the bytes it
  writes (`IovaSpace.strided(writable=True)`);
* the CPU can write a BO only between prepare_cpu_access and finish_cpu_access
  (outside that bracket its host view is read-only, and the NPU may not touch
  it inside), so `finish_cpu_access` starts a new write generation of the BO
  (part of every key) and drops all its entries;
* freeing a BO drops its entries.

Entries are read-only arrays (nobody mutates a shared operand by accident) and
the least recently used ones go once the total passes the byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable

import numpy as np

DEFAULT_BUDGET = 2 << 30  # a 270M-parameter model's weights as float32, with room to spare


class OperandCache:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET) -> None:
        self.budget = budget_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple, np.ndarray] = OrderedDict()  # LRU order, oldest first
        self._by_bo: dict[int, set[tuple]] = {}  # handle -> keys of its entries
        self._generation: dict[int, int] = {}  # handle -> write generation

    def generation(self, handle: int) -> int:
        return self._generation.get(handle, 0)

    def get(self, handle: int, offset: int, nbytes: int, form: Hashable,
            build: Callable[[], np.ndarray]) -> np.ndarray:
        """The operand decoded by `build` from BO bytes [offset, offset + nbytes)."""
        value = self.lookup(handle, offset, nbytes, form)
        if value is None:
            value = build()
            self.store(handle, offset, nbytes, form, value)
        return value

    def lookup(self, handle: int, offset: int, nbytes: int, form: Hashable):
        key = (handle, offset, nbytes, self.generation(handle), form)
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def store(self, handle: int, offset: int, nbytes: int, form: Hashable, value) -> None:
        """Keep `value` (an array, made read-only, or an object with `nbytes`)."""
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        size = value.nbytes
        if size > self.budget:
            return
        key = (handle, offset, nbytes, self.generation(handle), form)
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = value
        self._by_bo.setdefault(handle, set()).add(key)
        self.nbytes += size
        self._evict()

    def written(self, handle: int, start: int, end: int) -> None:
        """The NPU wrote BO bytes [start, end): drop what was decoded from them."""
        keys = self._by_bo.get(handle)
        if keys:
            for key in [k for k in keys if k[1] < end and start < k[1] + k[2]]:
                self._drop(key)

    def released(self, handle: int) -> None:
        """The CPU handed the BO back (finish_cpu_access) and may have changed any
        byte: a new write generation, nothing decoded before it is valid."""
        self._generation[handle] = self.generation(handle) + 1
        for key in list(self._by_bo.get(handle, ())):
            self._drop(key)

    def forget(self, handle: int) -> None:
        """The BO is gone."""
        for key in list(self._by_bo.get(handle, ())):
            self._drop(key)
        self._by_bo.pop(handle, None)
        self._generation.pop(handle, None)

    def _drop(self, key: tuple) -> None:
        value = self._entries.pop(key)
        self.nbytes -= value.nbytes
        keys = self._by_bo[key[0]]
        keys.discard(key)
        if not keys:
            del self._by_bo[key[0]]

    def _evict(self) -> None:
        while self.nbytes > self.budget:
            self._drop(next(iter(self._entries)))
