"""How far each DMA of a task reaches from the address register it starts at,
computed from the sizes and strides programmed in the same task.

One function per address register (`WALKS`), used twice so the two cannot
disagree: by the load-time proof (ir/access.py: the whole extent must lie in
the region the relocation targets) and by the simulator, which performs every
DMA through the `Walk` these functions return (runtime/sim: cna, dpu_rdma,
dpu_x, dpu, ppu).

A `Walk` is elements at ``base + sum(index * stride)`` (strides in bytes, a
signed CNA surface stride may be negative); its bytes are `span()`. A function
returns None when the task's fields say the DMA does not run (a per-channel
operand DMA with DATA_USE=0, ERDMA disabled, SRC_BASE_ADDR outside flying
mode and the combined read), and raises `Undecided` when a field the geometry
depends on holds a value whose meaning is unknown or unwritten: the simulator
refuses such a task where it checks the field; the load-time proof leaves it to
that check (nothing can be proven about an access whose shape is unknown).

Facts: the NC1HWC2 strides of the TRM's notch/stride descriptions and the
readings documented beside each simulator block (runtime/sim/quirks.py Q3, Q4,
Q14, Q16, Q21); precision codes per numerics.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from rkc.ir.npu.hw import ATOM_BYTES
from rkc.ir.npu.registers import BY_NAME, Block

# precision code (CNA_CONV_CON1, DPU_DATA_FORMAT, DPU_RDMA/PPU IN_PRECISION) -> bytes per element
PRECISION_BYTES = {0: 1, 1: 2, 2: 2, 3: 2, 4: 4, 5: 4}  # int8 int16 fp16 bf16 int32 fp32
EDATA_BYTES = {1: 1, 2: 2, 3: 4}  # EW operand size code (EDATA_SIZE / ERDMA_DATA_SIZE) -> bytes
INT4 = 6  # CNA/CORE precision code of nibble-packed int4 (32 channels per atom, hw-matmul.md 2.1)
PPU_RDMA_BYTES = {2: 2}  # PPU_RDMA IN_PRECISION -> bytes (16-bit only: fp16, Q14)
DATA_USE_ALU, DATA_USE_CPEND, DATA_USE_MUL = 1, 2, 4
GROUPED_USE = DATA_USE_ALU | DATA_USE_CPEND | DATA_USE_MUL  # 64-byte groups of 8 channels (Q21)
GROUP_CHANNELS, GROUP_BYTES = 8, 64
OPERAND_BYTES = {DATA_USE_ALU: 4, DATA_USE_MUL: 2}  # dense vectors: int32/fp32 ALU, int16/fp16 MUL
COMB_EW_PAIR = 5  # MRDMA and ERDMA read one operand cube together (Q16)
WRITER_BYTES_PER_SIZE_E = 8  # DPU_BS_OW_CFG SIZE_E: (size_e + 1) x 8 bytes per writer pass (Q4)


class Registers(Protocol):
    """What a walk reads of a task's registers (runtime/sim's TaskRegisters, or
    `ProgrammedRegisters` at load time)."""

    def value(self, name: str) -> int: ...
    def field(self, name: str, field_name: str) -> int: ...
    def signed(self, name: str, field_name: str | None = None) -> int: ...


class Undecided(Exception):
    """A field the walk's geometry depends on has no known meaning (or was not written)."""

    def __init__(self, what: str, register: str) -> None:
        super().__init__(what)
        self.register = register


class ProgrammedRegisters:
    """The values one task writes, by register name (a load-time `Registers`);
    a register the task does not write is `Undecided`."""

    def __init__(self, values: Mapping[str, int]) -> None:
        self.values = values

    def value(self, name: str) -> int:
        try:
            return self.values[name]
        except KeyError:
            raise Undecided("not written by the task", name) from None

    def field(self, name: str, field_name: str) -> int:
        return BY_NAME[name].field(field_name).extract(self.value(name))

    def signed(self, name: str, field_name: str | None = None) -> int:
        if field_name is None:
            value, width = self.value(name), 32
        else:
            f = BY_NAME[name].field(field_name)
            value, width = f.extract(self.value(name)), f.width
        return value - (1 << width) if value >> (width - 1) else value


@dataclass(frozen=True)
class Walk:
    """Elements at base + sum(index * stride) for index < shape; strides in bytes."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    itemsize: int

    def span(self) -> tuple[int, int]:
        """Bytes [lo, hi) the walk touches, relative to its base (lo <= 0 only for
        negative strides). An empty shape touches nothing: (0, 0)."""
        if any(n <= 0 for n in self.shape):
            return 0, 0
        lo = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides)) + self.itemsize
        return lo, hi


def _bytes(table: dict[int, int], code: int, what: str, register: str) -> int:
    if code not in table:
        raise Undecided(f"{what}={code} has no known element size", register)
    return table[code]


def _cube(channels: int, height: int, width: int, itemsize: int, line_atoms: int, surface_bytes: int,
          surfaces: range | None = None) -> Walk:
    """An NC1HWC2 cube (lines of `line_atoms` atoms, surfaces `surface_bytes` apart),
    all its surfaces or those of `surfaces`."""
    n = len(surfaces) if surfaces is not None else -(-channels // (ATOM_BYTES // itemsize))
    return Walk((n, height, width, ATOM_BYTES // itemsize),
                (surface_bytes, line_atoms * ATOM_BYTES, ATOM_BYTES, itemsize), itemsize)


# -- CNA ------------------------------------------------------------------------------------------------
def cna_feature(r: Registers) -> Walk:
    """The feature DMA: an NC1HWC2 cube, or (ARGB_IN) LINE_STRIDE-byte rows of one channel (Q3)."""
    w, h = r.field("CNA_FC_DATA_SIZE0", "DMA_WIDTH"), r.field("CNA_FC_DATA_SIZE0", "DMA_HEIGHT")
    line = r.field("CNA_DMA_CON1", "LINE_STRIDE")
    if r.field("CNA_CONV_CON1", "ARGB_IN"):
        return Walk((h, w), (line, 1), 1)
    code = r.field("CNA_CONV_CON1", "IN_PRECISION")
    channels = r.field("CNA_DATA_SIZE1", "DATAIN_CHANNEL")
    if code == INT4:  # whole bytes of two channels each: the walk reads the atom's 16 bytes
        itemsize, c2 = 1, 2 * ATOM_BYTES
    else:
        itemsize = _bytes(PRECISION_BYTES, code, "IN_PRECISION", "CNA_CONV_CON1")
        c2 = ATOM_BYTES // itemsize
    if channels % c2:
        raise Undecided(f"DATAIN_CHANNEL={channels} is not a whole number of {c2}-channel atoms", "CNA_DATA_SIZE1")
    surf = r.signed("CNA_DMA_CON2", "SURF_STRIDE")
    if r.field("CNA_CONV_CON1", "GROUP_LINE_OFF"):
        row_atoms, surface_atoms = line, surf + w
    else:  # group-line fetch: dense lines (LINE_STRIDE = 4 x width, Q3)
        row_atoms, surface_atoms = w, surf + line
    return Walk((channels // c2, h, w, ATOM_BYTES // itemsize),
                (surface_atoms * ATOM_BYTES, row_atoms * ATOM_BYTES, ATOM_BYTES, itemsize), itemsize)


def cna_weights(r: Registers) -> Walk:
    """The weight DMA: WEIGHT_BYTES contiguous bytes."""
    return Walk((r.field("CNA_WEIGHT_SIZE0", "WEIGHT_BYTES"),), (1,), 1)


# -- DPU --------------------------------------------------------------------------------------------------
def _dpu_cube(r: Registers) -> tuple[int, int, int]:
    return (r.field("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", "CHANNEL") + 1,
            r.field("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", "HEIGHT") + 1,
            r.field("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", "WIDTH") + 1)


def dpu_write(r: Registers) -> Walk:
    """The WDMA write-back: whole writer passes of SIZE_E (Q4), surfaces DST_SURF_STRIDE apart."""
    c = r.field("DPU_DATA_CUBE_CHANNEL", "CHANNEL") + 1
    h = r.field("DPU_DATA_CUBE_HEIGHT", "HEIGHT") + 1
    w = r.field("DPU_DATA_CUBE_WIDTH", "WIDTH") + 1
    itemsize = _bytes(PRECISION_BYTES, r.field("DPU_DATA_FORMAT", "OUT_PRECISION"), "OUT_PRECISION",
                      "DPU_DATA_FORMAT")
    per_pass, rest = divmod((r.field("DPU_BS_OW_CFG", "SIZE_E_0") + 1) * WRITER_BYTES_PER_SIZE_E, itemsize)
    if rest:
        raise Undecided(f"SIZE_E_0 is not a whole number of {itemsize}-byte channels", "DPU_BS_OW_CFG")
    channels = -(-c // per_pass) * per_pass
    line = w + r.field("DPU_DATA_CUBE_NOTCH_ADDR", "NOTCH_ADDR_0")
    return _cube(channels, h, w, itemsize, line, r.value("DPU_DST_SURF_STRIDE"))


def _operand(dma: str) -> Callable[[Registers], Walk | None]:
    cfg, use_field = f"DPU_RDMA_RDMA_{dma}_CFG", f"{dma}_DATA_USE"

    def walk(r: Registers) -> Walk | None:
        """The stage's per-channel operands: dense vectors, or 64-byte groups of 8 channels (Q21)."""
        use = r.field(cfg, use_field)
        if not use:
            return None
        channels = r.field("DPU_DATA_CUBE_CHANNEL", "CHANNEL") + 1
        if use == GROUPED_USE:
            return Walk((-(-channels // GROUP_CHANNELS) * GROUP_BYTES,), (1,), 1)
        itemsize = _bytes(OPERAND_BYTES, use, use_field, cfg)
        return Walk((channels,), (itemsize,), itemsize)

    return walk


bs_operand = _operand("BRDMA")
bn_operand = _operand("NRDMA")


def _ew_itemsize(r: Registers) -> int:
    return _bytes(EDATA_BYTES, r.field("DPU_RDMA_RDMA_ERDMA_CFG", "ERDMA_DATA_SIZE"), "ERDMA_DATA_SIZE",
                  "DPU_RDMA_RDMA_ERDMA_CFG")


def _ew_line(r: Registers, width: int) -> int:
    return width + r.field("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", "EW_LINE_NOTCH_ADDR")


def mrdma(r: Registers) -> Walk | None:
    """SRC_BASE_ADDR: the main data in flying mode, or the even operand surfaces of
    the combined per-pixel EW read (COMB_USE=5, Q16); neither: unused."""
    c, h, w = _dpu_cube(r)
    comb = r.field("DPU_RDMA_RDMA_FEATURE_MODE_CFG", "COMB_USE")
    if r.field("DPU_RDMA_RDMA_FEATURE_MODE_CFG", "FLYING_MODE"):
        itemsize = _bytes(PRECISION_BYTES, r.field("DPU_RDMA_RDMA_FEATURE_MODE_CFG", "IN_PRECISION"),
                          "IN_PRECISION", "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
        line = w + r.field("DPU_RDMA_RDMA_SRC_DMA_CFG", "LINE_NOTCH_ADDR")
        surface = line * h + r.field("DPU_RDMA_RDMA_SURF_NOTCH", "SURF_NOTCH_ADDR")
        return _cube(c, h, w, itemsize, line, surface * ATOM_BYTES)
    erdma_cfg = "DPU_RDMA_RDMA_ERDMA_CFG"
    if comb != COMB_EW_PAIR or r.field(erdma_cfg, "ERDMA_DISABLE") or r.field(erdma_cfg, "ERDMA_DATA_MODE") != 1:
        return None
    itemsize = _ew_itemsize(r)
    line = _ew_line(r, w)
    step = line * h + r.field("DPU_RDMA_RDMA_SURF_NOTCH", "SURF_NOTCH_ADDR")
    n = -(-c // (ATOM_BYTES // itemsize))
    return _cube(c, h, w, itemsize, line, step * ATOM_BYTES, range(0, n, 2))


def erdma(r: Registers) -> Walk | None:
    """The EW operand: per channel, a per-pixel cube, or its odd surfaces in the
    combined read (Q16); None while ERDMA is disabled."""
    cfg = "DPU_RDMA_RDMA_ERDMA_CFG"
    if r.field(cfg, "ERDMA_DISABLE"):
        return None
    c, h, w = _dpu_cube(r)
    itemsize = _ew_itemsize(r)
    mode = r.field(cfg, "ERDMA_DATA_MODE")
    if mode == 0:
        return Walk((c,), (itemsize,), itemsize)
    if mode != 1:
        raise Undecided(f"ERDMA_DATA_MODE={mode} is neither per channel nor per pixel", cfg)
    line = _ew_line(r, w)
    comb = r.field("DPU_RDMA_RDMA_FEATURE_MODE_CFG", "COMB_USE")
    if comb == COMB_EW_PAIR:
        step = line * h + r.field("DPU_RDMA_RDMA_EW_SURF_NOTCH", "EW_SURF_NOTCH")
        n = -(-c // (ATOM_BYTES // itemsize))
        return _cube(c, h, w, itemsize, line, step * ATOM_BYTES, range(1, n, 2))
    if comb:
        raise Undecided(f"COMB_USE={comb} is not a known operand read (0 or 5)", "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    return _cube(c, h, w, itemsize, line,
                 r.field("DPU_RDMA_RDMA_EW_SURF_STRIDE", "EW_SURF_STRIDE") * ATOM_BYTES)


# -- PPU --------------------------------------------------------------------------------------------------
def _ppu_itemsize(r: Registers) -> int:
    return _bytes(PPU_RDMA_BYTES, r.field("PPU_RDMA_RDMA_DATA_FORMAT", "IN_PRECISION"), "IN_PRECISION",
                  "PPU_RDMA_RDMA_DATA_FORMAT")


def ppu_read(r: Registers) -> Walk:
    """PPU_RDMA: an NC1HWC2 cube, line and surface strides in bytes."""
    w = r.field("PPU_RDMA_RDMA_CUBE_IN_WIDTH", "CUBE_IN_WIDTH") + 1
    h = r.field("PPU_RDMA_RDMA_CUBE_IN_HEIGHT", "CUBE_IN_HEIGHT") + 1
    c = r.field("PPU_RDMA_RDMA_CUBE_IN_CHANNEL", "CUBE_IN_CHANNEL") + 1
    itemsize = _ppu_itemsize(r)
    n = -(-c // (ATOM_BYTES // itemsize))
    return Walk((n, h, w, ATOM_BYTES // itemsize), (r.value("PPU_RDMA_RDMA_SRC_SURF_STRIDE"),
                                                    r.value("PPU_RDMA_RDMA_SRC_LINE_STRIDE"), ATOM_BYTES,
                                                    itemsize), itemsize)


def ppu_write(r: Registers) -> Walk:
    """The pooled cube: surfaces DST_SURF_STRIDE bytes apart, lines of out width + NOTCH_ADDR atoms."""
    w = r.field("PPU_DATA_CUBE_OUT_WIDTH", "CUBE_OUT_WIDTH") + 1
    h = r.field("PPU_DATA_CUBE_OUT_HEIGHT", "CUBE_OUT_HEIGHT") + 1
    c = r.field("PPU_DATA_CUBE_OUT_CHANNEL", "CUBE_OUT_CHANNEL") + 1
    itemsize = _ppu_itemsize(r)
    line = w + r.field("PPU_OPERATION_MODE_CFG", "NOTCH_ADDR")
    return _cube(c, h, w, itemsize, line, r.value("PPU_DST_SURF_STRIDE"))


# address register -> (the block whose op-enable bit runs its DMA, the walk)
WALKS: dict[str, tuple[Block, Callable[[Registers], Walk | None]]] = {
    "CNA_FEATURE_DATA_ADDR": (Block.CNA, cna_feature),
    "CNA_DCOMP_ADDR0": (Block.CNA, cna_weights),
    "DPU_DST_BASE_ADDR": (Block.DPU, dpu_write),
    "DPU_RDMA_RDMA_SRC_BASE_ADDR": (Block.DPU_RDMA, mrdma),
    "DPU_RDMA_RDMA_BS_BASE_ADDR": (Block.DPU_RDMA, bs_operand),
    "DPU_RDMA_RDMA_BN_BASE_ADDR": (Block.DPU_RDMA, bn_operand),
    "DPU_RDMA_RDMA_EW_BASE_ADDR": (Block.DPU_RDMA, erdma),
    "PPU_DST_BASE_ADDR": (Block.PPU, ppu_write),
    "PPU_RDMA_RDMA_SRC_BASE_ADDR": (Block.PPU_RDMA, ppu_read),
}
