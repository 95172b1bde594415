"""The PC: fetch a task's regcmd, apply its register writes, and at the
op-enable word run the blocks it enables (TRM ch. 36 'PC'; Linux rocket_job.c).

One kick = what the kernel starts with PC_BASE_ADDRESS / PC_REGISTER_AMOUNTS /
TASK_CON: stock rocket kicks every task on its own (TASK_NUMBER = 1, the tail's
link ignored); a hardware chain kicks the first task with TASK_NUMBER = n and
the PC follows each tail's PC_BASE_ADDRESS / PC_REGISTER_AMOUNTS.

The PC fetches PC_DATA_AMOUNT + 1 units of 128 bits. A task ends at its
op-enable entry, which must come right after the 0x0041 marker (TRM: 'before
op_en, 64'h0041_xxxx_xxxx_xxxx must be set').
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rkc.ir.npu.regcmd import ENTRY_BYTES, PC_AMOUNT_MAX, EntryKind
from rkc.ir.npu.registers import OP_ENABLE_BITS, Block
from rkc.runtime.sim import cbuf as cbuf_mod
from rkc.runtime.sim import cna, core, dpu, dpu_rdma, ppu
from rkc.runtime.sim.errors import (AlignmentError, FieldError, GeometryError, HangError, NoWritebackError,
                                PcAmountError, QuirkRejection, SimError, UnknownRegisterError,
                                UnsupportedError)
from rkc.runtime.sim.memory import IovaSpace, Region
from rkc.runtime.sim.quirks import Quirks
from rkc.runtime.sim.regfile import RegisterFile, TaskRegisters, decode_cached
from rkc.runtime.sim.stats import TaskStats

FETCH_UNIT = 2 * ENTRY_BYTES  # the PC reads 128 bits at a time
LUT_ENTRIES = 513
BIT1 = 1 << 1  # names no block (Q9)

# registers a regcmd may not write: read-only status, the per-block op-enables
# (the 0x0081 word starts blocks), and what the kernel programs per kick
_FORBIDDEN = {
    "PC_VERSION", "PC_VERSION_NUM", "PC_OPERATION_ENABLE", "PC_INTERRUPT_MASK", "PC_INTERRUPT_CLEAR",
    "PC_INTERRUPT_STATUS", "PC_INTERRUPT_RAW_STATUS", "PC_TASK_CON", "PC_TASK_DMA_BASE_ADDR",
    "PC_TASK_STATUS", "CNA_S_STATUS", "CNA_S_POINTER", "CNA_OPERATION_ENABLE", "CORE_S_STATUS",
    "CORE_S_POINTER", "CORE_OPERATION_ENABLE", "DPU_S_STATUS", "DPU_OPERATION_ENABLE",
    "DPU_RDMA_RDMA_S_STATUS", "DPU_RDMA_RDMA_OPERATION_ENABLE", "PPU_S_STATUS", "PPU_OPERATION_ENABLE",
    "PPU_RDMA_RDMA_S_STATUS", "PPU_RDMA_RDMA_OPERATION_ENABLE",
}
_S_POINTERS = {"DPU_S_POINTER", "DPU_RDMA_RDMA_S_POINTER", "PPU_S_POINTER", "PPU_RDMA_RDMA_S_POINTER"}
S_POINTER_PINGPONG = 0xE  # POINTER_PP_MODE | EXECUTER_PP_EN | POINTER_PP_EN, as the kernel sets CNA/CORE


@dataclass
class CoreState:
    """One NPU core: its register file, CBUF contents and LUT memory."""

    index: int
    regs: RegisterFile = field(default_factory=RegisterFile)
    cbuf: cbuf_mod.Cbuf = field(default_factory=cbuf_mod.Cbuf)
    lut: np.ndarray = field(default_factory=lambda: np.zeros((2, LUT_ENTRIES), np.int16))
    lut_cursor: tuple[int, int, int] = (0, 0, 0)  # (write?, table, address)


@dataclass
class Link:
    """The next-task pointer a tail programmed (None fields: not written)."""

    address: int | None
    amount: int | None


@dataclass
class FetchedTask:
    """One task as the PC fetched it."""

    regs: TaskRegisters
    enable: int
    enable_entry: int
    link: Link
    lut_written: set
    # the task's whole effect on the core's LUT memory when it depends on nothing
    # before it (None: it does, e.g. a data write before any LUT_ACCESS_CFG)
    lut_effect: tuple | None = None

    @property
    def nbytes(self) -> int:
        """Rough memory held (for the operand cache's budget)."""
        return 200 * (len(self.regs.values) + len(self.lut_written))


def _fetch_region(mem: IovaSpace, iova: int, amount: int) -> Region:
    if iova % FETCH_UNIT:
        raise AlignmentError(f"regcmd address {iova:#x} is not 16-byte aligned", register="PC_BASE_ADDRESS")
    if not 0 <= amount <= PC_AMOUNT_MAX:
        raise PcAmountError(f"PC_DATA_AMOUNT={amount} does not fit 16 bits", register="PC_REGISTER_AMOUNTS")
    nbytes = (amount + 1) * FETCH_UNIT
    try:
        return mem.region(iova, nbytes, "PC regcmd fetch", fetch=True)
    except SimError as exc:
        raise exc.located(register="PC_BASE_ADDRESS")


def fetch_task(state: CoreState, mem: IovaSpace, iova: int, amount: int) -> FetchedTask:
    """Fetch and decode the task at `iova`, applying its register (and LUT) writes
    to the core. A regcmd stream runs again and again unchanged (every token of a
    model), so its decoding is kept with the bytes it came from (opcache.py) and
    replayed: the same register values, the same LUT contents and cursor."""
    region = _fetch_region(mem, iova, amount)
    task = mem.cache.lookup(region.bo.handle, region.offset, region.nbytes, "regcmd")
    if task is not None:
        state.regs.values.update(task.regs.values)
        tables, addrs, values, cursor = task.lut_effect
        state.lut[tables, addrs] = values
        if cursor is not None:
            state.lut_cursor = cursor
        return task
    task = decode_task(state, region.data().view("<u8"))
    if task.lut_effect is not None:
        mem.cache.store(region.bo.handle, region.offset, region.nbytes, "regcmd", task)
    return task


def decode_task(state: CoreState, entries: np.ndarray) -> FetchedTask:
    """Apply entries up to the op-enable word; returns what the task programmed."""
    regs = TaskRegisters()
    lut_written: set = set()
    lut_self_contained = None  # set by the task's first LUT access register write
    previous_kind = None
    for i, raw in enumerate(entries.tolist()):
        d = decode_cached(raw)
        kind = d.kind
        if kind is EntryKind.NOP:
            previous_kind = kind
            continue
        if kind is EntryKind.MARKER:
            previous_kind = kind
            continue
        if kind is EntryKind.OP_ENABLE:
            if d.problems:
                raise FieldError("; ".join(d.problems), entry=i, register="PC_OPERATION_ENABLE")
            if previous_kind is not EntryKind.MARKER:
                raise HangError("op-enable without the 0x0041 marker entry right before it (TRM)",
                                entry=i, register="PC_OPERATION_ENABLE")
            link = Link(regs.values.get("PC_BASE_ADDRESS"), regs.values.get("PC_REGISTER_AMOUNTS"))
            effect = None
            if lut_self_contained is not False:
                cells = sorted(lut_written)
                tables = np.array([t for t, _ in cells], np.intp)
                addrs = np.array([a for _, a in cells], np.intp)
                cursor = state.lut_cursor if lut_self_contained else None  # None: left as it was
                effect = (tables, addrs, state.lut[tables, addrs].copy(), cursor)
            return FetchedTask(regs, d.value, i, link, lut_written, effect)
        if kind in (EntryKind.UNKNOWN_TARGET, EntryKind.UNKNOWN_REGISTER):
            raise UnknownRegisterError(f"{d.problems[0]} (entry {raw:#018x})", entry=i,
                                       register=f"target {d.target:#06x} offset {d.offset:#06x}")
        reg = d.register
        if d.problems:
            raise FieldError(f"{'; '.join(d.problems)} (value {d.value:#x})", entry=i, register=reg.name)
        name = reg.name
        if name in _FORBIDDEN:
            raise UnsupportedError("a regcmd may not write this register (read-only, a per-block op-enable, "
                                   "or programmed by the kernel per kick)", entry=i, register=name)
        if name in _S_POINTERS and d.value != S_POINTER_PINGPONG:
            raise UnsupportedError(f"S_POINTER={d.value:#x}: only 0xE (ping-pong by pointer, as the kernel "
                                   "programs CNA/CORE) is modelled", entry=i, register=name)
        if name == "PC_BASE_ADDRESS" and d.fields["PC_SEL"]:
            raise UnsupportedError("PC_SEL=1 (slave mode) from a regcmd", entry=i, register=name)
        if name == "DPU_LUT_ACCESS_DATA":
            if lut_self_contained is None:
                lut_self_contained = False  # writes where an earlier task left the cursor
            _lut_write(state, d.value, i, lut_written)
        elif name == "DPU_LUT_ACCESS_CFG":
            if lut_self_contained is None:
                lut_self_contained = True
            f = d.fields
            state.lut_cursor = (f["LUT_ACCESS_TYPE"], f["LUT_TABLE_ID"], f["LUT_ADDR"])
        regs.record(reg, d.value, i)
        state.regs.write(reg, d.value)
        previous_kind = kind
    raise HangError(f"no op-enable entry within the {len(entries)} fetched entries (the PC fetch amount "
                    "ends before the task does, or the task has no tail)", register="PC_REGISTER_AMOUNTS")


def _lut_write(state: CoreState, value: int, entry: int, written: set) -> None:
    write, table, addr = state.lut_cursor
    if not write:  # every stream writes CFG=0 then DATA=0: a read-mode data write changes nothing
        return
    if addr >= LUT_ENTRIES:
        raise FieldError(f"LUT address {addr} is past the {LUT_ENTRIES}-entry table", entry=entry,
                         register="DPU_LUT_ACCESS_DATA")
    state.lut[table, addr] = np.int16(value - 65536 if value & 0x8000 else value)
    written.add((table, addr))
    state.lut_cursor = (write, table, addr + 1)


def _blocks(enable: int) -> set[Block]:
    return {b for b, bit in OP_ENABLE_BITS.items() if enable & bit}


def execute(state: CoreState, mem: IovaSpace, quirks: Quirks, task: FetchedTask, stats: TaskStats) -> None:
    """Run the blocks the op-enable word starts."""
    r = task.regs
    enable = task.enable
    where = dict(entry=task.enable_entry, register="PC_OPERATION_ENABLE")
    if enable & BIT1:
        raise QuirkRejection("op-enable bit 1 names no known block (Q9)", **where)
    blocks = _blocks(enable)
    if (Block.CNA in blocks) != (Block.CORE in blocks):
        raise HangError("CNA and CORE run only together (one feeds the other)", **where)
    if Block.DPU in blocks and Block.DPU_RDMA not in blocks:
        raise HangError("the DPU without DPU_RDMA: rocket hangs on an unprogrammed DPU-RDMA (mrdma-trap, Q9)",
                        **where)
    if Block.DPU_RDMA in blocks and Block.DPU not in blocks:
        raise HangError("DPU_RDMA without the DPU has no consumer", **where)
    if Block.PPU_RDMA in blocks and Block.PPU not in blocks:
        raise HangError("PPU_RDMA without the PPU has no consumer", **where)
    _check_completion(r, quirks, blocks, enable, where)

    # IEEE arithmetic on the NPU never traps: NaN/inf in bytes a task reads (e.g.
    # uninitialised padding channels) flow through silently, as numpy must here
    with np.errstate(invalid="ignore", over="ignore"):
        main = None
        if Block.CNA in blocks:
            main = _convolution(state, mem, quirks, r, stats)
        if Block.DPU in blocks:
            _dpu(mem, quirks, r, main, stats, (state.lut, task.lut_written))
        if Block.PPU in blocks:
            ppu.run(r, mem, quirks, blocks, stats)


def _check_completion(r: TaskRegisters, quirks: Quirks, blocks: set, enable: int, where: dict) -> None:
    """The task must raise an interrupt the kernel completes tasks on (Q12):
    stock rocket waits for the DPU's, which it raises when it writes to memory."""
    if "DPU" in quirks.completion_blocks and Block.DPU in blocks:
        if r.field("DPU_FEATURE_MODE_CFG", "OUTPUT_MODE") & 2:
            return
        if "PPU" not in quirks.completion_blocks or Block.PPU not in blocks:
            raise NoWritebackError("the DPU does not write to memory (OUTPUT_MODE bit 1 clear); rocket "
                                   "completes a task on the DPU write-back interrupt (Q12)",
                                   entry=r.entry("DPU_FEATURE_MODE_CFG"), register="DPU_FEATURE_MODE_CFG")
    if "PPU" in quirks.completion_blocks and Block.PPU in blocks:
        return
    if Block.DPU not in blocks:
        raise NoWritebackError("the task never raises the DPU interrupt rocket completes a task on "
                               f"(op-enable {enable:#x}); the job would time out (Q12)", **where)


def _convolution(state: CoreState, mem: IovaSpace, quirks: Quirks, r: TaskRegisters,
                 stats: TaskStats) -> dpu.DpuInput:
    conv = cna.fetch_conv(r, mem, quirks)
    use = cbuf_mod.plan(r, conv, quirks)
    data_key = tuple(r.value(n) for n in (
        "CNA_FEATURE_DATA_ADDR", "CNA_CONV_CON1", "CNA_DATA_SIZE0", "CNA_DATA_SIZE1", "CNA_FC_DATA_SIZE0",
        "CNA_DMA_CON1", "CNA_DMA_CON2", "CNA_PAD_CON0", "CNA_PAD_CON1", "CNA_DATA_SIZE2", "CNA_DATA_SIZE3"))
    fetched_w, fetched_d = state.cbuf.resolve(r, conv, use, data_key)
    channels = core.check_core(r, conv, quirks)
    want_sum = not r.field("DPU_BS_OW_CFG", "OD_BYPASS")
    if want_sum and not r.field("CORE_MISC_CFG", "QD_EN"):
        raise HangError("CPEND needs the feature sums the CORE computes only with QD_EN=1",
                        entry=r.entry("CORE_MISC_CFG"), register="CORE_MISC_CFG")
    acc = core.convolve(conv, channels, want_sum)
    data = core.truncate(r, acc.data, quirks)
    stats.precision = conv.prec.name
    stats.macs += acc.macs
    stats.cbuf_banks = use.data_banks + use.weight_banks
    if fetched_d:
        stats.dma_read["CNA_FEATURE"] += conv.feature_bytes
    if fetched_w:
        stats.dma_read["CNA_WEIGHT"] += conv.weight_bytes
    valid = conv.kernels if conv.mode == "direct" else conv.channels
    return dpu.DpuInput(data, conv.prec, conv.mode, valid, acc.window_sum)


def _dpu(mem: IovaSpace, quirks: Quirks, r: TaskRegisters, main: dpu.DpuInput | None,
         stats: TaskStats, lut_state: tuple) -> None:
    fm = dpu.feature_mode(r)
    m = dpu_rdma.mode(r)
    geom = dpu.geometry(r, quirks)
    w, h, c, _ = geom
    flying = main is None
    if bool(fm["FLYING_MODE"]) != flying or m.flying != flying:
        raise FieldError(f"FLYING_MODE (DPU {fm['FLYING_MODE']}, DPU_RDMA {int(m.flying)}) must be "
                         f"{int(flying)}: the DPU's main data comes from "
                         f"{'MRDMA' if flying else 'the convolution'}",
                         entry=r.entry("DPU_FEATURE_MODE_CFG"), register="DPU_FEATURE_MODE_CFG")
    if m.mrdma and not flying and not m.comb:
        raise HangError("MRDMA is enabled (MRDMA_DISABLE=0) but has no source: no flying mode and no "
                        "combined operand read; the job hangs (mrdma-trap)",
                        entry=r.entry("DPU_RDMA_RDMA_FEATURE_MODE_CFG"),
                        register="DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    if flying and not m.mrdma:
        raise HangError("flying mode with MRDMA disabled: the DPU has no main data",
                        entry=r.entry("DPU_RDMA_RDMA_FEATURE_MODE_CFG"),
                        register="DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    dpu_rdma.check_cube(r, w, h, c)
    if flying:
        data, prec, nread = dpu_rdma.main_data(r, mem, m, w, h, c)
        stats.dma_read["MRDMA"] += nread
        main = dpu.DpuInput(data, prec, "flying", c)
    else:
        want = 3 if main.mode == "depthwise" else 0
        if fm["CONV_MODE"] != want:
            raise FieldError(f"CONV_MODE={fm['CONV_MODE']} but the CORE runs a {main.mode} convolution",
                             entry=r.entry("DPU_FEATURE_MODE_CFG"), register="DPU_FEATURE_MODE_CFG")
        if main.data.shape[0] != c:
            raise GeometryError(f"DPU CHANNEL+1={c} differs from the CORE's {main.data.shape[0]} output channels",
                           entry=r.entry("DPU_DATA_CUBE_CHANNEL"), register="DPU_DATA_CUBE_CHANNEL")
    traffic = dpu.run(r, mem, quirks, main, m, geom, lut_state)
    for k, v in traffic.read.items():
        stats.dma_read[k] += v
    stats.dma_written["DPU_WDMA"] += traffic.written
