"""Load an rkbin onto a Device: one BO per region (host regions stay in host
memory), blobs copied in, every relocation applied; then run programs.
(The module is `loader` so that the package-level `runtime.load` function
keeps its name.)

    model = runtime.load("model.rkbin")           # device="auto"
    outputs = model.run({"x": array})             # the first program
    model.run(feeds, program="decode")            # another program of the file

Works for any rkbin (ONNX or LLM): it knows only ir.program.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from rkc.ir.errors import FormatError, RkcError
from rkc.ir.npu.regcmd import ENTRY_BYTES
from rkc.ir.program import PPU_COMPLETION_KEY, Module, TensorInfo
from rkc.ir.rkbin import Rkbin, read_rkbin
from rkc.runtime.device import BufferObject, Device
from rkc.runtime.execute import prepare_program, run_program
from rkc.runtime.host_memory import keep_freed_memory
from rkc.runtime.module_check import check_module

GUARD_BYTES = 4096  # one page at IOVA 0 that no job lists (see _place_guard)
VALUE_SHIFT = 16  # a regcmd entry's value field is bits 47..16
VALUE_MASK = 0xFFFF_FFFF << VALUE_SHIFT


class LoadedModel:
    """An rkbin resident on a device. Use as a context manager or call close()."""

    def __init__(self, rkbin: Rkbin, device: Device | None, own_device: bool = False) -> None:
        self.rkbin = rkbin
        self.module: Module = rkbin.module
        self.device = device
        self._own_device = own_device
        self.bos: dict[str, BufferObject] = {}
        self.guard: BufferObject | None = None
        self.host_regions: dict[str, np.ndarray] = {}
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in self.module.tensors}
        self.last_run = None  # execute.RunStats of the latest run
        self.prepared_submits: dict[int, Callable[[], None]] = {}  # NPU step id -> execute.py's prepared submit
        self.schedules: dict[int, object] = {}  # program id -> execute.py's schedule (ONNX: made at load)
        check_module(self.module)
        check_kernel_features(self.module, device)
        if self.module.metadata.get("model_kind") != "llm":
            keep_freed_memory()  # an ONNX program's CPU steps: megabyte arrays reused, not faulted in every run
        try:
            self._place_guard()
            self._place_regions()
            self._apply_relocations()
            if self.device is not None and self.module.metadata.get("model_kind") != "llm":
                for program in self.module.programs:  # what its first run would otherwise work out
                    prepare_program(self, program)
        except BaseException:
            self.close()
            raise

    def _place_guard(self) -> None:
        """Both allocators (rocket's drm_mm, the simulator's) give the first BO
        IOVA 0, so an address register a task uses but the file left at 0
        (unrelocated) would reach the model's first region. A guard page there
        that no job lists makes such a use a refused access (the simulator
        checks every DMA against the job's lists) and, on a board, a write into
        memory nobody reads instead of into the weights."""
        if self.device is not None and needs_device(self.module):
            self.guard = self.device.create_guard_bo(GUARD_BYTES)

    def _place_regions(self) -> None:
        for region in self.module.regions:
            blob = self.rkbin.blobs[region.blob] if region.blob else None
            if region.kind == "host":
                self.host_regions[region.name] = blob if blob is not None else np.zeros(region.size, np.uint8)
                continue
            if self.device is None:
                raise FormatError(f"region {region.name!r} needs a device")
            bo = self.device.create_bo(region.size)
            self.bos[region.name] = bo
            if blob is not None:
                self.device.prepare_cpu_access(bo)
                bo.host[:blob.size] = blob
                self.device.finish_cpu_access(bo)

    def _apply_relocations(self) -> None:
        by_region: dict[str, list] = {}
        for rel in self.module.relocations:
            by_region.setdefault(rel.region, []).append(rel)
        for region, rels in by_region.items():
            bo = self.bos[region]
            self.device.prepare_cpu_access(bo)
            entries = bo.host[:bo.size - bo.size % ENTRY_BYTES].view("<u8")
            for rel in rels:
                address = self.bos[rel.target].iova + rel.offset
                if address >= 1 << 32:
                    raise FormatError(f"relocation to {rel.target!r}+{rel.offset} leaves the 32-bit IOVA window")
                old = int(entries[rel.entry])
                entries[rel.entry] = (old & ~VALUE_MASK & 0xFFFF_FFFF_FFFF_FFFF) | (address << VALUE_SHIFT)
            self.device.finish_cpu_access(bo)

    # -- running ----------------------------------------------------------------------
    @property
    def programs(self) -> list[str]:
        return [p.name for p in self.module.programs]

    def run(self, feeds: Mapping[str, np.ndarray], program: str | None = None,
            observe=None, fp16_outputs: bool = False) -> dict[str, np.ndarray]:
        """`observe(step, read)`: called after every step (debugging, tools/int8_layers.py).
        `fp16_outputs`: outputs the NPU computed in fp16 come back as float16 (execute.run_program)."""
        prog = self.module.programs[0] if program is None else self.module.program(program)
        outputs, self.last_run = run_program(self, prog, feeds, observe, fp16_outputs)
        return outputs

    def close(self) -> None:
        """Free every BO (and the device if this model opened it), even when
        one of them fails (a lost device): the first error is raised after."""
        first: BaseException | None = None
        owned = [*self.bos.values(), *([self.guard] if self.guard is not None else [])]
        self.bos.clear()
        self.guard = None
        closers = [lambda bo=bo: self.device.free_bo(bo) for bo in owned]
        if self._own_device and self.device is not None:
            closers.append(self.device.close)
            self._own_device = False
        for close in closers:
            try:
                close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> "LoadedModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_kernel_features(module: Module, device: Device | None) -> None:
    """Refuse a program whose tasks the device's kernel would never complete."""
    if device is not None and module.metadata.get(PPU_COMPLETION_KEY) and not device.completes_ppu:
        raise RkcError(f"this rkbin runs max pooling on the PPU (compiled with --kernel-ppu-irq), but the "
                       f"{device.kind} device's kernel never completes PPU tasks: use rocket 1.3 "
                       f"(kernel/patches/0005) or recompile without --kernel-ppu-irq")


def needs_device(module: Module) -> bool:
    """False for an rkbin of CPU steps only (everything in host memory)."""
    return any(r.kind != "host" for r in module.regions) or any(
        s.kind == "npu" for p in module.programs for s in p.steps)


def load(path: str | Path, device: Device | str = "auto", quiet: bool = True) -> LoadedModel:
    """Read and validate an rkbin, then place it on `device` (a Device, or
    "auto" | "sim" | "rocket")."""
    rkbin = read_rkbin(path)
    if device == "auto" and not needs_device(rkbin.module):
        return LoadedModel(rkbin, None)  # CPU steps only: no NPU involved
    if isinstance(device, str):
        from rkc.runtime.devices import open_device  # deferred: the simulator and the rocket driver, when named

        return LoadedModel(rkbin, open_device(device, quiet=quiet), own_device=True)
    return LoadedModel(rkbin, device)
