"""Compile-time weight preparation for an LLM: dequantize the GGUF blocks
(gguf.quants) to fp32, in numpy order. Encoding for the NPU (int8 per output
channel or fp16) happens in compiler/llm/build.py; packing into the native
weight layout in the GEMM emitter."""

from __future__ import annotations

import re
import sys
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Iterable, Iterator, MutableMapping, TypeVar

import click
import numpy as np

from rkc.compiler.frontend.gguf import DEQUANT_ROWS, GgufFile
from rkc.runtime.llm.weights import Weight

T = TypeVar("T")
_LAYER = re.compile(r"^blk\.(\d+)\.")


@contextmanager
def progress(items: Iterable[T], label: str, show: bool | None = None) -> Iterator[Iterable[T]]:
    """click's progress bar over `items` on a terminal (stderr); `show` None:
    only when stderr is a tty, so logs and pipes stay quiet."""
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        yield items
        return
    with click.progressbar(list(items), label=label, file=sys.stderr, show_pos=True) as bar:
        yield bar


def layer_of(name: str) -> int:
    """The transformer layer of a weight (blk.N.*), -1 for the others."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def by_layer(names: list[str]) -> list[list[str]]:
    """`names` grouped by transformer layer (blk.N.*), the rest first."""
    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(layer_of(name), []).append(name)
    return [groups[k] for k in sorted(groups)]


def dequantize_all(gf: GgufFile, names: list[str], show_progress: bool | None = False) -> dict[str, np.ndarray]:
    out = {}
    with progress(by_layer(names), "dequantize layers", show_progress) as layers:
        for group in layers:
            out.update((name, gf.dequantize(name)) for name in group)
    return out


class LazyWeights(MutableMapping):
    """fp32 weights dequantized from the memory-mapped GGUF when read, never
    held: a compile that reads each weight once (fp16, or int8 without a float
    run of the whole model) streams the model instead of copying it all to fp32.
    Arrays written into it (an in-place transform) are kept. `tables` (the
    gather-only tables) are RowTables: read as rows, never whole."""

    def __init__(self, gf: GgufFile, names: list[str], tables: Iterable[str] = ()) -> None:
        self.gf, self.written = gf, {}
        self.tables = {name: RowTable(gf, name) for name in tables}
        self.names = list(names) + [n for n in self.tables if n not in names]

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.written:
            return self.written[name]
        if name in self.tables:
            return self.tables[name]
        if name not in self.names:
            raise KeyError(name)
        return self.gf.dequantize(name)

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """fp32 rows of a 2-D weight, only those read from the file."""
        return self.source(name).rows(ids)

    def source(self, name: str) -> "RowSource":
        """A 2-D weight as a row source (rows(), blocks()): what was written
        into it, or its rows read from the file (never a whole fp32 copy)."""
        if name in self.written:
            return ArrayRows(self.written[name])
        if name not in self.names:
            raise KeyError(name)
        return self.tables[name] if name in self.tables else RowTable(self.gf, name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.written[name] = value
        if name not in self.names:
            self.names.append(name)

    def __delitem__(self, name: str) -> None:
        self.names.remove(name)
        self.written.pop(name, None)
        self.tables.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.names))

    def __len__(self) -> int:
        return len(self.names)


class RowSource(ABC):
    """A matrix read in rows (rows(ids or slice) -> fp32), `shape` [N, K]."""

    shape: tuple[int, ...]

    @abstractmethod
    def rows(self, ids: np.ndarray | slice) -> np.ndarray:
        """The fp32 rows at ids (an index array or a slice)."""

    def blocks(self, n: int = DEQUANT_ROWS) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, fp32 rows) of n rows at a time."""
        for r0 in range(0, self.shape[0], n):
            yield r0, self.rows(slice(r0, r0 + n))


class RowTable(RowSource):
    """A 2-D weight of the memory-mapped GGUF read in rows: a table that is
    only gathered from (Gemma 4's per-layer token embeddings: 262144 x 8960 for
    E2B, 9.4 GB in fp32) or a matrix encoded in row blocks (a 262k-row tied
    head), never held whole in fp32."""

    def __init__(self, gf: GgufFile, name: str) -> None:
        self.gf, self.name = gf, name
        self.shape = gf.shape(name)

    def rows(self, ids: np.ndarray | slice) -> np.ndarray:
        return self.gf.dequantize_rows(self.name, ids if isinstance(ids, slice) else np.asarray(ids, np.int64))


class ArrayRows(RowSource):
    """A matrix in memory as a row source (RowTable's rows() and blocks())."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape = array.shape

    def rows(self, ids: np.ndarray | slice) -> np.ndarray:
        return np.asarray(self.array[ids], np.float32)


def row_source(w: "np.ndarray | RowSource") -> RowSource:
    """A matrix (in memory or a row source) as a row source."""
    return w if isinstance(w, RowSource) else ArrayRows(np.asarray(w))


def gather_only_tables(graph) -> list[str]:
    """Constants the graph only gathers rows of (no product reads them)."""
    products = {op.inputs[1] for op in graph.ops if op.type == "Linear"}
    return sorted({op.inputs[0] for op in graph.ops if op.type == "Gather"} - products)


def runtime_weight(w):
    """A float weight as the CPU kernels read it (a RowTable gathers its own rows)."""
    return w if isinstance(w, RowTable) else Weight(w)
