"""Data tables of rkc's own emitters: precision codes, the DPU writer geometry per
(input, output) precision, field limits. Every row names its source; rows no
source covers are marked OPEN (docs/npu-emitters.md lists the open questions).
"""

from __future__ import annotations

from dataclasses import dataclass

from rkc.ir.errors import UnsupportedError

# Precision codes of CNA_CONV_CON1 / CORE_MISC_CFG / DPU_DATA_FORMAT / DPU_RDMA
# FEATURE_MODE_CFG (TRM RK3588 Part 1 "RKNN_dpu_data_format", quoted in
# gregordinary/rockchip-npu-notes encodings/k-accumulation.md; hw-matmul.md 3).
PRECISION = {"int4": 6, "int8": 0, "int16": 1, "fp16": 2, "bf16": 3, "int32": 4, "fp32": 5}

# ERDMA_DATA_SIZE / EDATA_SIZE codes: element width of the EW operand.
EDATA_SIZE = {1: 1, 2: 2, 4: 3}  # bytes -> code (0 = 4 bit); sdp-stage-precision.md


@dataclass(frozen=True)
class Writer:
    """How the DPU write DMA lays an output precision out: BS_OW_CFG.SIZE_E_* and
    SURFACE_ADD as a multiple of the DST_SURF_STRIDE field (both in 16-byte units)."""

    size_e: int
    surface_add: int
    source: str


# (input precision, output precision, depthwise) -> writer geometry
WRITERS = {
    ("int8", "int8", False): Writer(1, 2, "Mesa rkt_regcmd.c/rkt_task.c, 537 golden captures"),
    ("int8", "int8", True): Writer(3, 4, "Mesa depthwise, golden captures"),
    ("int8", "int32", False): Writer(7, 8, "rocket-userspace gen_matmul_int8, GEMM captures (8-byte quirk)"),
    ("int8", "fp32", False): Writer(7, 8, "rockchip-npu-notes out-cvt-converter.md (exact cast of int32)"),
    # OPEN (Q27): measured on small single tiles only; `rkc probe` int8_fp16_out asks for more
    ("int8", "fp16", False): Writer(3, 2, "rockchip-npu-notes out-cvt-converter.md 'fp16: 3 / stride*2, C2 8'"),
    ("fp16", "fp32", False): Writer(3, 4, "rocket-userspace gen_matmul_fp16, GEMM captures"),
    ("fp16", "fp16", False): Writer(1, 2, "rocket-userspace fp16->fp16, GEMM captures"),
    ("fp16", "fp16", True): Writer(3, 4, "rocket-userspace gen_conv2d_dw_fp16 (HW-validated)"),
    ("int4", "int16", False): Writer(7, 8, "hw-matmul.md 3.2 'int4: precision 6; output int16 uses size_e 7'"),
}


def writer(in_dtype: str, out_dtype: str, depthwise: bool) -> Writer:
    try:
        return WRITERS[in_dtype, out_dtype, depthwise]
    except KeyError:
        kind = "depthwise" if depthwise else "convolution"
        raise UnsupportedError(f"no known NPU output path for {in_dtype} {kind} -> {out_dtype}") from None


# Field limits the packer alone cannot see (the value fits its field, but the
# hardware is known to misbehave near the edge, or two fields must agree).
CUBE_MAX = 8191  # 13-bit DPU/PPU cube dims hold value-1; 8191 rows/cols corrupt (dpu-lut-activation.md)
CNA_SIZE_MAX = 2047  # 11-bit DATAIN_WIDTH/HEIGHT, DATAOUT_WIDTH
CNA_CHANNEL_MAX = 16384  # DATAIN_CHANNEL_REAL is 14 bits (value-1)
KERNELS_MAX = 16383  # WEIGHT_KERNELS is 14 bits
KERNEL_SIZE_MAX = 31  # WEIGHT_WIDTH/HEIGHT are 5 bits
STRIDE_MAX = 7  # CONV_X/Y_STRIDE are 3 bits
PAD_MAX = 15  # PAD_LEFT/TOP are 4 bits
FEATURE_GRAINS_MAX = 1023  # CONV_CON2.FEATURE_GRAINS is 10 bits
FLAT_ATOMS_MAX = 4096  # atoms per flying DPU task; stays well off the 8191 edge (dpu-lut-activation.md)
EW_STRIDE_MIN = 12  # EW surface stride floor of the conv-main EW path (Mesa; k-accumulation.md)


def check(value: int, limit: int, what: str) -> int:
    if not 0 <= value <= limit:
        raise UnsupportedError(f"{what} = {value} exceeds the NPU limit {limit}")
    return value
