"""The DPU epilogue of a convolution / GEMM task: from the op's quantization and
`Epilogue` to a `DpuPlan` (register values + per-channel constant bytes), and a
numpy model of the arithmetic the plan asks the DPU for.

Integer path (int8 MACs, int32 accumulator `acc`), in DPU stage order:

    v = acc                                  (+ OW_OP * window sum: weight zero point)
    BS  ALU: v += A[c]                       bias - input_zp * sum(w - w_zp), from BRDMA
    BS  MUL: v = sat32(rne(v * C[c] >> s))   per-channel requant multiplier (int16)
    BS  ReLU / ReLU-X: v = max(v, 0); v = min(v, cmp)
    BN  PReLU: v = v < 0 ? rne(v * a >> t) : v   LeakyReLU's slope (MUL_PRELU)
    EW  ALU: v += rne((r + off) * m >> t)    residual r (int8) brought to v's units
    EW  ReLU / ReLU-X                        (the activation moves here with a residual)
    OUT_CVT: out = sat8(rne(v * mul >> shift) + zp_out)  | int32: sat32(v) | fp32: float(v)

Float path (fp16 MACs, fp32 accumulator): bias add, ReLU/ReLU-X in BS; residual
add/mul in EW; or a LUT activation (BN maps x to the table index, EW looks it up,
OUT_CVT decodes the fixed-point result); OUT_CVT narrows to fp16 when asked.

Sources for each stage's semantics: Mesa rkt_regcmd.c (bias ALU, OUT_CVT, fused
ADD's EW), gregordinary/rockchip-npu-notes encodings/out-cvt-converter.md (rounding,
offset after shift, BS MUL per-channel group layout), dpu-lut-activation.md (LUT),
k-accumulation.md (fp16 EW words). Choices no source settles are listed in
docs/npu-emitters.md as open hardware questions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from rkc.compiler.npu import api, formats, lut as lutmod
from rkc.compiler.npu.quant import multiplier_pair, requantize, rne_shift, saturate
from rkc.compiler.npu.regfile import RegisterFile
from rkc.ir.errors import UnsupportedError

_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
# EW_ALU_ALGO: 0 max, 1 min, 2 add (NVDLA SDP; rockchip-npu-notes dpu-lut-activation.md "Max and Min")
EW_ALU_ALGO = {"max": 0, "min": 1, "add": 2}

BS_GROUP_CHANNELS = 8  # BRDMA_DATA_USE=7: one 64-byte group per 8 channels
BS_GROUP_BYTES = 64  # int32 A[8] @0, int16 B[8] @32, int16 C[8] @48 (out-cvt-converter.md)
PER_CHANNEL_SHIFT = 15  # BS MUL shift of the per-channel requant: C[c] is a Q15 fraction
PER_CHANNEL_RANGE = 128  # largest / smallest per-channel multiplier the BS MUL resolves to 0.2 %


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def f16_bits(x: float) -> int:
    return int(np.array(x, np.float16).view(np.uint16))


@dataclass
class DpuPlan:
    in_dtype: str
    out_dtype: str
    channels: int
    depthwise: bool
    writer: formats.Writer
    # BS stage
    bs_data: np.ndarray | None = None  # per-channel A (int32 / fp32 words) or the group layout (uint8)
    bs_groups: bool = False  # BRDMA data use 7 (bias + multiplier) instead of 1 (bias only)
    bs_mul: np.ndarray | None = None  # C[c] (int16) when bs_groups
    bs_shift: int = 0
    act_stage: str = "bs"  # where ReLU / ReLU-X run: "bs" or "ew"
    relu: bool = False
    relux: int | None = None  # raw compare value (int32 for integer, fp32 bits for float)
    relux_value: float | int | None = None
    ow_op: int = 0  # signed weight zero-point compensation (integer path)
    # EW stage
    residual: api.Residual | None = None
    ew_mul: int = 1
    ew_shift: int = 0
    ew_offset: int = 0
    lut: lutmod.LutPlan | None = None
    lut_index: tuple[int, int] | None = None  # integer datapath (Q22, probes only): BN (mul, shift) to the index
    # LeakyReLU on BN's multiplier in PReLU mode (negative values only): the fp16 slope,
    # or on an integer datapath (mul, shift)
    prelu: float | tuple[int, int] | None = None
    # OUT_CVT
    out_mul: int = 1
    out_shift: int = 0
    out_offset: int = 0
    narrow_fp16: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def integer(self) -> bool:
        return self.in_dtype in ("int8", "int4")

    # -- constants -----------------------------------------------------------------
    def bs_bytes(self) -> bytes | None:
        return None if self.bs_data is None else self.bs_data.tobytes()

    def bs_offset(self, channel0: int) -> int:
        """Byte offset of channel `channel0`'s operands in the BS constant buffer."""
        if self.bs_groups:
            if channel0 % BS_GROUP_CHANNELS:
                raise UnsupportedError(f"per-channel tile starts at channel {channel0}, not a multiple of 8")
            return channel0 // BS_GROUP_CHANNELS * BS_GROUP_BYTES
        return channel0 * 4

    # -- the arithmetic --------------------------------------------------------------
    def apply(self, acc: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
        """What the DPU writes for accumulator `acc` (channels first: [C, ...]) and the
        residual operand as stored (same shape). Integer outputs are exact; float
        outputs are the ideal result the hardware approximates (fp16-level)."""
        shape = (-1,) + (1,) * (acc.ndim - 1)
        if self.integer:
            v = np.asarray(acc, np.int64)
            if self.bs_data is not None:
                v = v + self._bias_a().reshape(shape)
            if self.bs_groups:
                v = saturate(rne_shift(v * self.bs_mul.astype(np.int64).reshape(shape), self.bs_shift), "int32")
            if self.act_stage == "bs":
                v = self._activate(v)
            if self.prelu is not None:
                v = np.where(v < 0, saturate(rne_shift(v * self.prelu[0], self.prelu[1]), "int32"), v)
            if self.residual is not None:
                r = rne_shift((np.asarray(residual, np.int64) + self.ew_offset) * self.ew_mul, self.ew_shift)
                v = _COMBINE[self.residual.op](v, r)
                if self.act_stage == "ew":
                    v = self._activate(v)
            if self.lut is not None:  # Q22: the ideal table value at the BN index, as a Q0.15 entry
                spec = self.lut.spec
                index = rne_shift(v * self.lut_index[0], self.lut_index[1])
                f = self.lut.function(index / self.lut.index_scale)
                v = np.rint((f - spec.lo) / 2.0 ** spec.s_exp * (1 << lutmod.Q_BITS)).astype(np.int64)
            if self.out_dtype == "int8":
                return requantize(v, self.out_mul, self.out_shift, self.out_offset).astype(np.int8)
            if self.out_dtype == "fp16":  # Q27's reading: OUT_CVT's integer result, cast to fp16
                return requantize(v, self.out_mul, self.out_shift, self.out_offset, "int32").astype(np.float16)
            if self.out_dtype == "int32":
                return saturate(v, "int32").astype(np.int32)
            if self.out_dtype == "int16":  # int4 sums: the emitter bounds K so none leaves int16 (Q23)
                if v.size and (v.min() < -32768 or v.max() > 32767):
                    raise UnsupportedError("an int4 partial leaves int16 (its K segment is too long)")
                return v.astype(np.int16)
            return saturate(v, "int32").astype(np.float32)
        v = np.asarray(acc, np.float64)
        if self.bs_data is not None:
            v = v + self.bs_data.view(np.float32).astype(np.float64).reshape(shape)
        if self.act_stage == "bs":
            v = self._activate(v)
        if self.prelu is not None:
            v = np.where(v < 0, v * float(np.float16(self.prelu)), v)
        if self.residual is not None:
            v = _COMBINE[self.residual.op](v, np.asarray(residual, np.float64))
            if self.act_stage == "ew":
                v = self._activate(v)
        if self.lut is not None:
            v = self.lut.function(v)
        return v.astype(np.float16 if self.out_dtype == "fp16" else np.float32)

    def _bias_a(self) -> np.ndarray:
        if self.bs_groups:
            groups = self.bs_data.reshape(-1, BS_GROUP_BYTES)
            return groups[:, :32].copy().view("<i4").reshape(-1)[:self.channels].astype(np.int64)
        return self.bs_data.view("<i4").astype(np.int64)[:self.channels]

    def _activate(self, v: np.ndarray) -> np.ndarray:
        if self.relu:
            v = np.maximum(v, 0)
        if self.relux_value is not None:
            v = np.minimum(v, self.relux_value)
        return v

    # -- registers ---------------------------------------------------------------------
    def write(self, r: RegisterFile, bs_buffer: str | None, channel0: int) -> None:
        """BS/BN/EW/OUT_CVT/LUT registers and the matching DPU_RDMA operand setup
        (not the cube geometry, which the caller writes)."""
        in_p, out_p = formats.PRECISION[self.in_dtype], formats.PRECISION[self.out_dtype]
        r.set("DPU_DATA_FORMAT", OUT_PRECISION=out_p, IN_PRECISION=in_p, PROC_PRECISION=in_p,
              BS_MUL_SHIFT_VALUE_NEG=self.bs_shift if self.bs_groups else 0,
              BN_MUL_SHIFT_VALUE_NEG=self.lut_index[1] if self.lut_index else
              (self.prelu[1] if isinstance(self.prelu, tuple) else 0))
        bs_act = self.act_stage == "bs"
        has_bs = self.bs_data is not None
        r.set("DPU_BS_CFG", BS_ALU_ALGO=2 if has_bs else 0, BS_ALU_SRC=int(has_bs),
              BS_RELUX_EN=int(bs_act and self.relux is not None),
              BS_RELU_BYPASS=int(not (bs_act and (self.relu or self.relux is not None))),
              BS_MUL_BYPASS=int(not self.bs_groups), BS_ALU_BYPASS=int(not has_bs),
              BS_BYPASS=int(not (has_bs or self.bs_groups or (bs_act and (self.relu or self.relux is not None)))))
        if bs_act and self.relux is not None:
            r.set("DPU_BS_RELUX_CMP_VALUE", BS_RELUX_CMP_DAT=self.relux)
        if self.bs_groups:
            r.set("DPU_BS_MUL_CFG", BS_MUL_SHIFT_VALUE=self.bs_shift, BS_MUL_SRC=1)
        size_e = self.writer.size_e
        r.set("DPU_BS_OW_CFG", SIZE_E_2=size_e, SIZE_E_1=size_e, SIZE_E_0=size_e, OD_BYPASS=int(self.ow_op == 0))
        if self.ow_op:
            r.set("DPU_BS_OW_OP", OW_OP=self.ow_op & 0xFFFF)
        if self.lut_index is not None:
            self.lut.write_bn_integer(r, *self.lut_index)
        elif self.lut is not None:
            self.lut.write_bn(r)
        elif self.prelu is not None:
            # the multiplier on negative values only (MUL_PRELU), ALU bypassed
            r.set("DPU_BN_CFG", BN_ALU_BYPASS=1, BN_MUL_PRELU=1, BN_RELU_BYPASS=1)
            if self.integer:
                r.set("DPU_BN_MUL_CFG", BN_MUL_OPERAND=self.prelu[0] & 0xFFFF, BN_MUL_SHIFT_VALUE=self.prelu[1])
            else:
                r.set("DPU_BN_MUL_CFG", BN_MUL_OPERAND=f16_bits(self.prelu))
        else:
            r.set("DPU_BN_CFG", BN_RELU_BYPASS=1, BN_MUL_BYPASS=1, BN_ALU_BYPASS=1, BN_BYPASS=1)
        self._write_ew(r)
        if self.lut is not None and not self.integer:
            self.lut.write_out_cvt(r)
        else:  # an integer path's table entry is requantized like an accumulator (Q22)
            r.set("DPU_OUT_CVT_OFFSET", OUT_CVT_OFFSET=self.out_offset & 0xFFFFFFFF)
            r.set("DPU_OUT_CVT_SCALE", FP32TOFP16_EN=int(self.narrow_fp16), OUT_CVT_SCALE=self.out_mul)
            r.set("DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=self.out_shift)
        if self.lut is not None:
            self.lut.write_tables(r)
        if has_bs or self.bs_groups:
            r.set("DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=7 if self.bs_groups else 1)
            r.address("DPU_RDMA_RDMA_BS_BASE_ADDR", bs_buffer, self.bs_offset(channel0))

    def _write_ew(self, r: RegisterFile) -> None:
        ew_act = self.act_stage == "ew"
        relu_bypass = int(not (ew_act and (self.relu or self.relux is not None)))
        if self.residual is None:
            if self.lut is not None:
                return  # LutPlan.write_bn wrote the EW word of the LUT path
            r.set("DPU_EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_BYPASS=1,
                  EW_BYPASS=1)
            r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)
            return
        relux = int(ew_act and self.relux is not None)
        op = self.residual.op
        size = formats.EDATA_SIZE[self.residual.tensor.itemsize]
        common = dict(EW_DATA_MODE=1, EDATA_SIZE=size, EW_RELUX_EN=relux, EW_RELU_BYPASS=relu_bypass,
                      EW_LUT_BYPASS=1, EW_OP_SRC=1)
        if self.integer:
            # Mesa's fused-ADD word (rkt_regcmd.c): per-pixel 8-bit operand, converter
            # live, (r + offset) * scale >> shift first (EW_CVT_TYPE=1); MUL multiplies
            # instead of the ALU (EW_OP_TYPE)
            if op == "mul":
                r.set("DPU_EW_CFG", EW_CVT_TYPE=1, EW_OP_TYPE=1, **common)
            else:
                r.set("DPU_EW_CFG", EW_CVT_TYPE=1, EW_ALU_ALGO=EW_ALU_ALGO[op], **common)
            r.set("DPU_EW_CVT_OFFSET_VALUE", EW_OP_CVT_OFFSET=self.ew_offset & 0xFFFFFFFF)
            r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SHIFT=self.ew_shift, EW_OP_CVT_SCALE=self.ew_mul)
        elif op == "mul":
            # fp16 operand multiply, converter bypassed (dpu-lut-activation.md: 0x108003C4)
            r.set("DPU_EW_CFG", EW_OP_CVT_BYPASS=1, EW_OP_TYPE=1, **common)
            r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)
        else:
            # fp16 add / max / min, converter live (k-accumulation.md 0x108202C0 and its
            # 0x108002C0 / 0x108102C0 siblings); an fp32 partial is the same word with
            # a 32-bit operand (the "precision-safe" K-accumulation variant)
            r.set("DPU_EW_CFG", EW_ALU_ALGO=EW_ALU_ALGO[op], **common)
            r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)
        if ew_act and self.relux is not None:
            r.set("DPU_EW_RELUX_CMP_VALUE", EW_RELUX_CMP_DAT=self.relux)


# -- planning ------------------------------------------------------------------------
@dataclass(frozen=True)
class DpuRequest:
    in_dtype: str  # MAC precision: "int8" or "fp16"
    output: api.Feature
    channels: int
    input_quant: api.Quant | None
    weight_quant: api.Quant | None
    weight_sums: np.ndarray  # per output channel: sum of (w - w_zp) over the reduction
    epilogue: api.Epilogue
    depthwise: bool = False
    partial: bool = False  # a K-split partial: raw accumulator only (the rest runs later)
    integer_lut: bool = False  # EmitOptions.integer_lut (Q22, `rkc probe` only)
    integer_fp16_out: bool = False  # EmitOptions.integer_fp16_out (Q27, `rkc probe` only)


def plan(req: DpuRequest) -> DpuPlan:
    if req.in_dtype == "int8":
        return _plan_integer(req)
    if req.in_dtype == "fp16":
        return _plan_float(req)
    if req.in_dtype == "int4":
        return _plan_int4(req)
    raise UnsupportedError(f"no NPU convolution over {req.in_dtype} inputs")


def _plan_int4(req: DpuRequest) -> DpuPlan:
    """int4 x int4 -> int16, the sum passed through untouched: the only int4 output
    the documents describe (Q23); scales, bias and activations run where the
    partials are combined (gemm_int4.py)."""
    ep = req.epilogue
    if req.output.dtype != "int16" or req.depthwise or req.input_quant or req.weight_quant or \
            ep.bias is not None or ep.activation is not None or ep.residual is not None:
        raise UnsupportedError("an int4 convolution writes its raw int16 sum only (no quantization, bias, "
                               "activation or residual on the NPU)")
    return DpuPlan("int4", "int16", req.channels, False, formats.writer("int4", "int16", False))


def _plan_integer(req: DpuRequest) -> DpuPlan:
    out, ep, n = req.output, req.epilogue, req.channels
    out_dtype = "int32" if req.partial else out.dtype
    # fp16 output is open (Q27): the requantized integer result, cast to fp16
    scaled = ("int8", "fp16") if req.integer_fp16_out and not req.depthwise else ("int8",)
    if out_dtype not in ("int32", "fp32") + scaled:
        raise UnsupportedError(f"int8 convolution cannot write {out_dtype} (int8, int32 or fp32)")
    if ep.lut is not None and req.integer_lut and not req.partial:
        return _plan_integer_lut(req)
    p = DpuPlan("int8", out_dtype, n, req.depthwise, formats.writer("int8", out_dtype, req.depthwise))
    if req.depthwise and out_dtype != "int8":
        raise UnsupportedError("int8 depthwise convolution writes int8 only (the int32 writer is unproven)")
    wq = req.weight_quant or api.Quant(1.0)
    iq = req.input_quant or api.Quant(1.0)
    if wq.per_channel and wq.zero_point:
        raise UnsupportedError("per-channel weights must be symmetric (zero point 0)")
    if not -32768 <= -wq.zero_point <= 32767:
        raise UnsupportedError(f"weight zero point {wq.zero_point} out of range")
    p.ow_op = -wq.zero_point
    if req.partial:
        # a K-split partial writes the raw accumulator (the weight zero point is
        # still applied by OW); the CPU step that sums the partials runs the rest
        return p
    bias = np.zeros(n, np.int64) if ep.bias is None else np.asarray(ep.bias, np.int64)
    if bias.shape != (n,):
        raise UnsupportedError(f"bias has shape {bias.shape}, expected ({n},)")
    a = bias - iq.zero_point * np.asarray(req.weight_sums, np.int64)
    if np.abs(a).max(initial=0) >= 1 << 31:
        raise UnsupportedError("bias after zero-point correction does not fit int32")
    if out_dtype in scaled:
        if out.quant is None or iq is None:
            raise UnsupportedError(f"{out_dtype} output of an int8 convolution needs input, weight and output "
                                   "quantization")
        p.narrow_fp16 = out_dtype == "fp16"  # the fp32->fp16 converter, as on the float datapath
        m = iq.scales(1)[0] * wq.scales(n) / out.quant.scale
        if wq.per_channel:
            # after the BS multiplier v is in one unit for every channel (1/gain output
            # steps), so a residual, ReLU-X or OUT_CVT treat it like the per-tensor case
            c, shift, gain = per_channel_multipliers(m)
            p.bs_groups, p.bs_mul, p.bs_shift = True, c, shift
            p.out_mul, p.out_shift = multiplier_pair(gain, "requant gain")
            acc_scale = 1.0 / gain  # v units per output step
            p.bs_data = _group_bytes(a, c, n)
        else:
            p.out_mul, p.out_shift = multiplier_pair(float(m[0]), "requant scale")
            acc_scale = 1.0 / float(m[0])
            p.bs_data = a.astype("<i4") if a.any() else None
        p.out_offset = out.quant.zero_point
        real_per_step = out.quant.scale / acc_scale
    else:
        p.bs_data = a.astype("<i4") if a.any() else None
        real_per_step = iq.scales(1)[0] * wq.scales(1)[0] if not wq.per_channel else None
    _integer_activation(p, ep, real_per_step)
    if ep.residual is not None:
        _integer_residual(p, req, real_per_step)
    return p


def _plan_integer_lut(req: DpuRequest) -> DpuPlan:
    """A lookup-table activation on the integer datapath (hardware question Q22; only
    `rkc probe` asks for it): BS adds the bias, BN's integer multiply scales the
    accumulator (real value acc * s_in * s_w) to the table index, the EW stage looks
    the Q0.15 entry up, OUT_CVT requantizes it to int8. Per-tensor weights, no
    residual or clip: the smallest program that asks the question."""
    out, ep, n = req.output, req.epilogue, req.channels
    wq, iq = req.weight_quant or api.Quant(1.0), req.input_quant
    if out.dtype != "int8" or out.quant is None or iq is None or wq.per_channel or wq.zero_point \
            or ep.residual is not None or ep.clip_range is not None:
        raise UnsupportedError("an integer-path lookup table takes per-tensor symmetric weights, quantized "
                               "input and int8 output, and no residual or clip")
    p = DpuPlan("int8", "int8", n, req.depthwise, formats.writer("int8", "int8", req.depthwise))
    bias = np.zeros(n, np.int64) if ep.bias is None else np.asarray(ep.bias, np.int64)
    a = bias - iq.zero_point * np.asarray(req.weight_sums, np.int64)
    p.bs_data = a.astype("<i4") if a.any() else None
    p.lut = lutmod.plan(ep.lut)
    p.lut_index = multiplier_pair(float(iq.scales(1)[0] * wq.scales(1)[0]) * p.lut.index_scale, "LUT index scale")
    spec = p.lut.spec
    p.out_mul, p.out_shift = multiplier_pair(2.0 ** spec.s_exp / (1 << lutmod.Q_BITS) / out.quant.scale,
                                             "LUT output scale")
    p.out_offset = out.quant.zero_point + round(spec.lo / out.quant.scale)
    return p


def per_channel_multipliers(m: np.ndarray) -> tuple[np.ndarray, int, float]:
    """The per-channel requantization m[c] = C[c] / 2^shift * gain (BS MUL, then
    OUT_CVT): C[c] int16 relative to the largest channel, one shift and one gain.

    C[c] carries each channel's multiplier with 0.5 / C[c] relative error, so a
    channel whose multiplier is far below the largest one comes out wrong (a
    BN-folded dead channel: C rounds to 0 or 1 and its bias-only output lands
    tens of steps off). Multipliers must stay within PER_CHANNEL_RANGE of the
    largest (C >= 256, error <= 0.2 %); the quantizer floors weight scales to
    that range. The shift keeps the BS result at least 2^8 finer than an output
    step (gain <= 2^-8) so its rounding adds nothing visible; a larger BS result
    only saturates int32 where the int8 output saturates anyway."""
    mmax = float(m.max())
    if not (mmax > 0 and np.isfinite(mmax)) or float(m.min()) <= 0:
        raise UnsupportedError(f"per-channel requantization scales must be positive and finite "
                               f"(range {float(m.min()):.3g}..{mmax:.3g})")
    if float(m.min()) < mmax / PER_CHANNEL_RANGE:
        raise UnsupportedError(f"per-channel weight scales span {mmax / float(m.min()):.3g}x, more than the "
                               f"{PER_CHANNEL_RANGE}x the 16-bit BS multiplier resolves (floor the smallest)")
    shift = min(PER_CHANNEL_SHIFT, int(np.floor(np.log2(2.0 ** -8 * 32767 / mmax))))
    if shift < 0:
        raise UnsupportedError(f"per-channel requantization scale {mmax:.3g} is too large for the DPU")
    c = np.rint(m / mmax * 32767).astype(np.int64)
    return c, shift, mmax * (1 << shift) / 32767


def _group_bytes(a: np.ndarray, c: np.ndarray, n: int) -> np.ndarray:
    groups = -(-n // BS_GROUP_CHANNELS)
    buf = np.zeros((groups, BS_GROUP_BYTES), np.uint8)
    a32 = np.zeros(groups * BS_GROUP_CHANNELS, "<i4")
    a32[:n] = a
    c16 = np.zeros(groups * BS_GROUP_CHANNELS, "<i2")
    c16[:n] = c
    buf[:, 0:32] = a32.view(np.uint8).reshape(groups, 32)
    buf[:, 48:64] = c16.view(np.uint8).reshape(groups, 16)
    return buf.reshape(-1)


def _leaky(p: DpuPlan, ep: api.Epilogue) -> None:
    """LeakyReLU on BN's multiplier in PReLU mode: ahead of the EW stage, so not with a residual."""
    if ep.residual is not None:
        raise UnsupportedError("LeakyReLU runs in the BN stage, before a residual's EW stage")
    if not 0 < ep.slope < 1:
        raise UnsupportedError(f"LeakyReLU slope {ep.slope} outside (0, 1)")
    p.prelu = multiplier_pair(ep.slope, "LeakyReLU slope") if p.integer else float(ep.slope)


def _integer_activation(p: DpuPlan, ep: api.Epilogue, real_per_step: float | None) -> None:
    rng = ep.clip_range
    if ep.lut is not None:
        raise UnsupportedError(f"{ep.lut} on an int8 path: LUT activations need fp16")
    if ep.slope is not None:
        _leaky(p, ep)
        return
    if rng is None:
        return
    lo, hi = rng
    if lo != 0:
        raise UnsupportedError(f"clip({lo}, {hi}) on an integer path: only a lower bound of 0 is supported")
    p.relu = True
    if hi != float("inf"):
        if real_per_step is None:
            raise UnsupportedError("a clip bound needs a per-tensor scale on the integer path")
        p.relux_value = int(round(hi / real_per_step))
        p.relux = p.relux_value & 0xFFFFFFFF


def _integer_residual(p: DpuPlan, req: DpuRequest, real_per_step: float | None) -> None:
    """The second operand r (int8, its own quant) on the EW stage: add / max / min
    bring it to v's units, rne((r - zp_r) * m >> t); mul takes (r - zp_r) as is and
    folds its scale into OUT_CVT."""
    res = req.epilogue.residual
    if res.tensor.dtype != "int8" or res.tensor.quant is None or real_per_step is None:
        raise UnsupportedError("an int8 element-wise operand needs int8 data with per-tensor quantization")
    if res.op not in _COMBINE:
        raise UnsupportedError(f"element-wise {res.op!r} is not an NPU operation")
    p.residual = res
    p.act_stage = "ew"
    p.ew_offset = -res.tensor.quant.zero_point
    if res.op == "mul":
        p.ew_mul, p.ew_shift = 1, 0
        if p.out_dtype == "int8":
            m = real_per_step * res.tensor.quant.scale / req.output.quant.scale
            p.out_mul, p.out_shift = multiplier_pair(m, "product scale")
        if p.relux_value is not None:
            raise UnsupportedError("a clip bound after an int8 multiply is not supported")
    else:
        p.ew_mul, p.ew_shift = multiplier_pair(res.tensor.quant.scale / real_per_step, "operand scale")


def _plan_float(req: DpuRequest) -> DpuPlan:
    out, ep, n = req.output, req.epilogue, req.channels
    out_dtype = "fp32" if req.partial else out.dtype
    if out_dtype not in ("fp16", "fp32"):
        raise UnsupportedError(f"fp16 convolution cannot write {out_dtype} (fp16 or fp32)")
    if req.depthwise and n % 32:
        raise UnsupportedError(f"fp16 depthwise needs channels in multiples of 32, got {n}")
    p = DpuPlan("fp16", out_dtype, n, req.depthwise, formats.writer("fp16", out_dtype, req.depthwise))
    p.narrow_fp16 = out_dtype == "fp16"
    if req.partial:
        return p  # raw fp32 partial; the K-accumulation adds the rest
    if ep.bias is not None:
        bias = np.asarray(ep.bias, np.float32)
        if bias.shape != (n,):
            raise UnsupportedError(f"bias has shape {bias.shape}, expected ({n},)")
        p.bs_data = bias.astype("<f4")
    rng = ep.clip_range
    if ep.residual is not None:
        if ep.residual.tensor.dtype not in ("fp16", "fp32") or \
                (ep.residual.tensor.dtype == "fp32" and ep.residual.op != "add"):
            raise UnsupportedError("an fp16 path's residual is an fp16 tensor (or an fp32 partial to add)")
        if ep.residual.op not in _COMBINE:
            raise UnsupportedError(f"element-wise {ep.residual.op!r} is not an NPU operation")
        p.residual, p.act_stage = ep.residual, "ew"
    if rng is not None:
        lo, hi = rng
        if lo != 0:
            raise UnsupportedError(f"clip({lo}, {hi}): only a lower bound of 0 is supported on the NPU")
        p.relu = True
        if hi != float("inf"):
            p.relux_value, p.relux = hi, f32_bits(hi)
    if ep.slope is not None:
        _leaky(p, ep)
    if ep.lut is not None:
        if ep.residual is not None:
            raise UnsupportedError("a LUT activation and a residual cannot share the EW stage")
        if out_dtype != "fp16":
            raise UnsupportedError("a LUT activation writes fp16")
        p.lut = lutmod.plan(ep.lut)
    return p
