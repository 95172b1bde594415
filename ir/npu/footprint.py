"""Which bytes a task reads and writes, exactly enough to tell whether two tasks
touch the same bytes of a buffer.

A `Span` is `count` pieces of `length` bytes, `stride` apart: one piece per
channel surface of a feature map (native NC1HWC2 layout: a row band of a map is
one contiguous piece in each surface). compiler/npu/assemble.py uses the spans
to chain the tasks of consecutive layers on one core where no task reads what
another core's job of the same round writes (a row band kept from layer to
layer), instead of one job per layer and core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Span:
    buffer: str
    start: int
    length: int  # bytes of each piece
    count: int = 1
    stride: int = 0  # bytes from one piece's start to the next

    @property
    def end(self) -> int:
        return self.start + (self.count - 1) * self.stride + self.length

    def overlaps(self, other: "Span") -> bool:
        """Whether some byte lies in a piece of both."""
        if self.buffer != other.buffer or self.end <= other.start or other.end <= self.start:
            return False
        if self.count == 1 and other.count == 1:
            return True
        a = self.start + self.stride * np.arange(self.count, dtype=np.int64)
        b = other.start + other.stride * np.arange(other.count, dtype=np.int64)
        return bool(np.any((a[:, None] < b[None, :] + other.length) & (b[None, :] < a[:, None] + self.length)))


@dataclass(frozen=True)
class Access:
    """What one task reads and writes (weights and other constants among the reads)."""

    reads: tuple[Span, ...]
    writes: tuple[Span, ...]


def surfaces_span(buffer: str, offset: int, surfaces: int, surface_bytes: int, dense_surface_bytes: int) -> Span:
    """`surfaces` channel surfaces of a map (or of a view of one: a row band)."""
    return Span(buffer, offset, dense_surface_bytes, surfaces, surface_bytes)


def touches(access: Access) -> list[tuple[str, int, int]]:
    """(buffer, first byte, end) of everything read or written (api.Task.touches)."""
    return [(s.buffer, s.start, s.end) for s in (*access.reads, *access.writes)]
