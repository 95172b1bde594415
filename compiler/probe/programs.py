"""The probe programs, one function each, and the probe table.

Programs are built with rkc's own op emitters (compiler/npu) and deterministic
data; where the result is an exact integer product the NPU's values are also
checked against numpy. Where a probe tests a reading the emitter deliberately
avoids (a 1-row map, no int8 slack bank), it asks for that program through the
EmitOptions fields that exist for open hardware questions (min_input_rows,
int8_slack_banks); the defaults are the safe readings.
"""

from __future__ import annotations

import numpy as np

from dataclasses import replace

from rkc.compiler.npu import api, epilogue
from rkc.compiler.npu.conv_core import data_entries, feature_strides
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.probe import Probe, ProbeRun
from rkc.compiler.probe import emitted
from rkc.ir.npu.regcmd import decode, encode
from rkc.runtime.device import Device

SEED = 20261130


def _int8(shape, salt: int) -> np.ndarray:
    return np.random.default_rng(SEED + salt).integers(-128, 128, shape).astype(np.int8)


def _fp16(shape, salt: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(SEED + salt).standard_normal(shape) * scale).astype(np.float16)


def _run(device: Device, name: str, results: list[api.EmitResult], inputs: dict, outputs: dict[str, api.Feature],
         chained: bool = False, exact: dict[str, np.ndarray] | None = None,
         view=lambda name, values: values) -> ProbeRun:
    """Run the program; outputs as raw bytes (NPU vs simulator) and, for
    `exact`, the decoded values next to the exact result."""
    program = emitted.place(results, inputs, name)
    placed = emitted.run(device, program, chained)
    try:
        raw = {out: placed.read(program.handles[f.buffer]) for out, f in outputs.items()}
    finally:
        placed.free()
    got = {out: view(out, emitted.feature_values(outputs[out], raw[out])) for out in outputs}
    return ProbeRun({f"{name}:{out}": raw[out] for out in outputs}, {},
                    {f"{name}:{out}": (got[out], want) for out, want in (exact or {}).items()})


def _gemm_int8(device: Device, name: str, m: int, k: int, n: int, options: api.EmitOptions,
               chained: bool = False) -> ProbeRun:
    a, b = _int8((m, k), 1), _int8((k, n), 2)
    A = api.Feature.gemm("A", 0, m, k, "int8")
    C = api.Feature.gemm("C", 0, m, n, "int32")
    result = emit(api.Gemm(A, b, C, m, name=name), options)
    rows = api.gemm_rows(m)
    apad = np.zeros((rows, k), np.int8)
    apad[:m] = a
    return _run(device, name, [result], {"A": (A, apad.T[:, :, None])}, {"C": C}, chained,
                {"C": a.astype(np.int64) @ b.astype(np.int64)},
                view=lambda _, v: v[:, :m, 0].T.astype(np.int64))


def gemv_m1(device: Device) -> ProbeRun:
    """int8 GEMV as a 1x1 convolution of a 1x1 map (K=256, N=128), no padding to 4 rows."""
    k, n = 256, 128
    a, w = _int8((k, 1, 1), 3), _int8((n, 1, 1, k), 4)
    A, C = api.Feature("A", 0, k, 1, 1, "int8"), api.Feature("C", 0, n, 1, 1, "int32")
    result = emit(api.Conv2D(A, w, C, name="gemv_m1"), api.EmitOptions(min_input_rows=1))
    return _run(device, "gemv_m1", [result], {"A": (A, a)}, {"C": C}, exact={
        "C": (w[:, 0, 0, :].astype(np.int64) @ a[:, 0, 0].astype(np.int64))[:, None, None]},
        view=lambda _, v: v.astype(np.int64))


def chain_int8(device: Device) -> ProbeRun:
    """int8 GEMM M=4 K=64 N=4096 as 8 tasks of 512 columns in one job, one chained kick."""
    return _gemm_int8(device, "chain_int8", 4, 64, 4096, api.EmitOptions(cores=1, n_tile_max=512), chained=True)


def chain_fp16(device: Device) -> ProbeRun:
    """fp16 GEMM M=4 K=64 N=1024 as 8 tasks of 128 columns in one job, one chained kick."""
    m, k, n = 4, 64, 1024
    a, b = _fp16((m, k), 5), _fp16((k, n), 6, 1 / 8)
    A, C = api.Feature.gemm("A", 0, m, k, "fp16"), api.Feature.gemm("C", 0, m, n, "fp32")
    result = emit(api.Gemm(A, b, C, m, name="chain_fp16"), api.EmitOptions(cores=1, n_tile_max=128))
    return _run(device, "chain_fp16", [result], {"A": (A, a.T[:, :, None])}, {"C": C}, chained=True)


def strides(device: Device) -> ProbeRun:
    """int8 3x3 convolution, padded, over a 40-channel 9x13 map whose channel
    surfaces sit 64 bytes further apart than dense (LINE_STRIDE and SURF_STRIDE
    both matter), int32 out."""
    c, h, w, o = 40, 9, 13, 24
    x, wt = _int8((c, h, w), 7), _int8((o, 3, 3, c), 8)
    X = api.Feature("X", 0, c, h, w, "int8", surface_stride=h * w * 16 + 64)
    Y = api.Feature("Y", 0, o, h, w, "int32")
    result = emit(api.Conv2D(X, wt, Y, padding=(1, 1, 1, 1), name="strides"))
    xp = np.pad(x.astype(np.int64), ((0, 0), (1, 1), (1, 1)))
    want = np.zeros((o, h, w), np.int64)
    for dy in range(3):
        for dx in range(3):
            want += np.einsum("oc,chw->ohw", wt[:, dy, dx, :].astype(np.int64), xp[:, dy:dy + h, dx:dx + w])
    return _run(device, "strides", [result], {"X": (X, x)}, {"Y": Y}, exact={"Y": want},
                view=lambda _, v: v.astype(np.int64))


def n_near_8192(device: Device) -> ProbeRun:
    """int8 GEMM M=4 K=32 N=8160 as one task: a DPU output cube of 8160 channels
    (the largest multiple of 32 whose padded cube the emitter's 13-bit field check allows)."""
    return _gemm_int8(device, "n_near_8192", 4, 32, 8160, api.EmitOptions(cores=1, n_tile_max=8160))


def k_over_8192(device: Device) -> ProbeRun:
    """fp16 GEMM M=48 K=8300 N=48: K split over tasks, the partials added on the NPU."""
    m, k, n = 48, 8300, 48
    a, b = _fp16((m, k), 9), _fp16((k, n), 10, 1 / np.sqrt(k))
    A, C = api.Feature.gemm("A", 0, m, k, "fp16"), api.Feature.gemm("C", 0, m, n, "fp16")
    result = emit(api.Gemm(A, b, C, m, name="k_over_8192"), api.EmitOptions(cores=1))
    return _run(device, "k_over_8192", [result], {"A": (A, a.T[:, :, None])}, {"C": C})


def lut(device: Device) -> ProbeRun:
    """sigmoid through the DPU lookup table on an fp16 map spanning [-8, 8]."""
    c, h, w = 16, 4, 32
    x = np.linspace(-8, 8, c * h * w).reshape(c, h, w).astype(np.float16)
    X, Y = api.Feature("X", 0, c, h, w, "fp16"), api.Feature("Y", 0, c, h, w, "fp16")
    result = emit(api.Activation(X, Y, "sigmoid", name="lut"))
    return _run(device, "lut", [result], {"X": (X, x)}, {"Y": Y})


def ppu_pool(device: Device) -> ProbeRun:
    """2x2 max pooling of an fp16 map on the PPU (a PPU-only task)."""
    c, h, w = 16, 8, 8
    x = _fp16((c, h, w), 11)
    X, Y = api.Feature("X", 0, c, h, w, "fp16"), api.Feature("Y", 0, c, h // 2, w // 2, "fp16")
    result = emit(api.Pool(X, Y, "max", (2, 2), (2, 2), name="ppu_pool"), api.EmitOptions(ppu_completes=True))
    want = x.reshape(c, h // 2, 2, w // 2, 2).max(axis=(2, 4))
    return _run(device, "ppu_pool", [result], {"X": (X, x)}, {"Y": Y}, exact={"Y": want})


def cbuf_slack(device: Device) -> ProbeRun:
    """int8 GEMM M=600 K=1024 N=64 whose M tiles fill their CBUF data banks
    completely (no slack bank)."""
    return _gemm_int8(device, "cbuf_slack", 600, 1024, 64, api.EmitOptions(cores=1, int8_slack_banks=0))


def weight_reuse(device: Device) -> ProbeRun:
    """int8 GEMM M=300 K=1000 N=70: several M tiles in one job, the weights kept
    in CBUF (WEIGHT_REUSE) after the first."""
    return _gemm_int8(device, "weight_reuse", 300, 1000, 70, api.EmitOptions(cores=1))


def _int4(shape, salt: int) -> np.ndarray:
    return np.random.default_rng(SEED + salt).integers(-8, 8, shape).astype(np.int8)


def _gemm_int4(device: Device, name: str, a: np.ndarray, b: np.ndarray, segment: int, rows: int,
               options: api.EmitOptions, reading=lambda exact: exact) -> ProbeRun:
    """int4 GEMM partials per K segment, int16 out, next to numpy's exact partials
    as the reading under test turns them into int16 (`reading`)."""
    m, k = a.shape
    n = b.shape[1]
    A = api.Feature("A", 0, k, rows, 1, "int4")
    probe = api.GemmInt4(A, b, None, m, segment, name)
    C = api.Feature("C", 0, probe.segments * probe.n_padded, rows, 1, "int16")
    result = emit(api.GemmInt4(A, b, C, m, segment, name), options)
    apad = np.zeros((rows, k), np.int8)
    apad[:m] = a
    want = np.stack([a[:, k0:k0 + segment].astype(np.int64) @ b[k0:k0 + segment].astype(np.int64)
                     for k0 in range(0, k, segment)], axis=1)

    def view(_, v):
        return v[:, :m, 0].T.reshape(m, probe.segments, probe.n_padded)[:, :, :n].astype(np.int64)

    return _run(device, name, [result], {"A": (A, apad.T[:, :, None])}, {"C": C}, exact={"C": reading(want)},
                view=view)


def int4_gemm(device: Device) -> ProbeRun:
    """int4 GEMM M=8 K=512 N=128 as two K segments of 256 (int16 partials): the
    nibble order of A and B, the int16 output writer (size_e 7)."""
    return _gemm_int4(device, "int4_gemm", _int4((8, 512), 12), _int4((512, 128), 13), 256, 8, api.DEFAULT_OPTIONS)


def _int4_overflowing() -> tuple[np.ndarray, np.ndarray]:
    """K=1024 in one task: rows whose sums reach +-65536 and +-40000-ish, and one in range."""
    k, n = 1024, 64
    a = np.full((4, k), -8, np.int8)
    a[1] = 7
    a[2, ::2] = 7
    a[3] = _int4((k,), 14)
    b = np.full((k, n), -8, np.int8)
    b[:, 32:] = _int4((k, 32), 15)
    return a, b


def int4_overflow(device: Device) -> ProbeRun:
    """int4 GEMM M=4 K=1024 N=64 in ONE task (segment 1024, which compiles never emit):
    sums beyond int16 (up to 65536); compared with the saturating reading."""
    a, b = _int4_overflowing()
    return _gemm_int4(device, "int4_overflow", a, b, 1024, 4, api.EmitOptions(int4_segment_max=1024),
                      lambda v: np.clip(v, -32768, 32767))


def int4_overflow_wrap(device: Device) -> ProbeRun:
    """The same program, compared with the wrapping reading."""
    a, b = _int4_overflowing()
    return _gemm_int4(device, "int4_overflow_wrap", a, b, 1024, 4, api.EmitOptions(int4_segment_max=1024),
                      lambda v: (v + 32768) % 65536 - 32768)


def int4_gemv_m1(device: Device) -> ProbeRun:
    """int4 GEMV: a 1-row map (M=1, not padded to 4), K=256 N=128."""
    return _gemm_int4(device, "int4_gemv_m1", _int4((1, 256), 16), _int4((256, 128), 17), 256, 1,
                      api.EmitOptions(min_input_rows=1))


def lut_int8(device: Device) -> ProbeRun:
    """An int8 1x1 convolution (K=32, 16 channels) with the sigmoid table on its
    integer datapath: BS passes the int32 accumulator, BN's integer multiply makes
    the index (acc * 2^-10 real, x 2048 index units: mul 2^14, shift 13), the EW
    stage looks the entry up, OUT_CVT requantizes it to int8 (scale 1/256, zero
    point -128). Beside it the fp16 program of the same function (the validated
    fp16 LUT, the same index values exactly); the int8 result must be the fp16
    one requantized, within one step."""
    c, h, w, n = 32, 4, 8, 16
    x = _int8((c, h, w), 18)
    wt = np.random.default_rng(SEED + 19).integers(-3, 4, (n, 1, 1, c)).astype(np.int8)
    s_in, s_w, out_q = 2.0 ** -4, 2.0 ** -6, api.Quant(1 / 256, -128)
    X8 = api.Feature("X8", 0, c, h, w, "int8", api.Quant(s_in))
    Y8 = api.Feature("Y8", 0, n, h, w, "int8", out_q)
    X16, Y16 = api.Feature("X16", 0, c, h, w, "fp16"), api.Feature("Y16", 0, n, h, w, "fp16")
    sigmoid = api.Epilogue(activation="sigmoid")
    int8 = emit(api.Conv2D(X8, wt, Y8, weight_quant=api.Quant(s_w), epilogue=sigmoid, name="lut_int8"),
                api.EmitOptions(cores=1, integer_lut=True))
    fp16 = emit(api.Conv2D(X16, (wt * s_w).astype(np.float16), Y16, epilogue=sigmoid, name="lut_int8.fp16"),
                api.EmitOptions(cores=1))
    program = emitted.place([int8, fp16], {"X8": (X8, x), "X16": (X16, (x * s_in).astype(np.float16))}, "lut_int8")
    placed = emitted.run(device, program, False)
    try:
        raw = {f.buffer: placed.read(program.handles[f.buffer]) for f in (Y8, Y16)}
    finally:
        placed.free()
    got = emitted.feature_values(Y8, raw["Y8"]).astype(np.int64)
    f16 = emitted.feature_values(Y16, raw["Y16"]).astype(np.float64)
    want = np.clip(np.rint(f16 / out_q.scale) + out_q.zero_point, -128, 127)
    return ProbeRun({f"lut_int8:{b}": data for b, data in raw.items()}, close={"lut_int8:Y8": (got, want, 1.0)})



def _fp16_out_gemms(name: str, m: int, k: int, n: int, options: api.EmitOptions, salt: int):
    """One int8 GEMM C = A B with per-channel weight scales, emitted twice over the
    same A: int32 out (modelled, exact) and fp16 out through the per-channel BS
    multiplier and OUT_CVT (Q27). The fp16 result counts steps of a per-tensor
    power of two `step` chosen so that |C| stays below 2048 steps (fp16 holds
    those integers exactly; the source's program was range-limited there)."""
    a, b = _int8((m, k), salt), _int8((k, n), salt + 1)
    s_a = 2.0 ** -5
    s_w = np.random.default_rng(SEED + salt + 2).uniform(2.0 ** -8, 2.0 ** -7, n)
    real = (a.astype(np.int64) @ b.astype(np.int64)) * s_a * s_w
    step = 2.0 ** np.ceil(np.log2(np.abs(real).max() / 1500))
    A = api.Feature.gemm(f"{name}.A", 0, m, k, "int8", api.Quant(s_a))
    C32 = api.Feature.gemm(f"{name}.C32", 0, m, n, "int32")
    C16 = api.Feature.gemm(f"{name}.C16", 0, m, n, "fp16", api.Quant(step))
    wq = api.Quant(tuple(float(s) for s in s_w))
    i32 = emit(api.Gemm(A, b, C32, m, wq, name=f"{name}.i32"), options)
    f16 = emit(api.Gemm(A, b, C16, m, wq, name=f"{name}.f16"), replace(options, integer_fp16_out=True))
    plan = epilogue.plan(epilogue.DpuRequest("int8", C16, n, A.quant, wq, b.sum(axis=0, dtype=np.int64),
                                             api.NO_EPILOGUE, integer_fp16_out=True))
    apad = np.zeros((api.gemm_rows(m), k), np.int8)
    apad[:m] = a
    return [i32, f16], {A.buffer: (A, apad.T[:, :, None])}, (C32, C16), a @ b.astype(np.int64), plan, s_a * s_w, step


def int8_fp16_out(device: Device) -> ProbeRun:
    """fp16 output straight from int8 GEMMs (OUT_PRECISION 2, FP32TOFP16_EN, writer
    size_e 3 / surface x2, C2 8) with the per-channel dequant scale in BS (C[c] and
    shift, Q21) and OUT_CVT (one gain): 'tiles' M=300 K=1000 N=160 on one core (2 M
    tiles x 3 N tiles of <= 64), 'cores' M=64 K=512 N=384 split over 3 cores. In the
    same submit each product is also written as int32 (modelled, checked against
    numpy). The fp16 values must be the epilogue's reading applied to the board's
    int32 (exactly: integers below 2048 are exact in fp16), and, times the step,
    the host's dequantization of the int32 within the requant's bound: half a step
    + 2^-8 of a step for the BS rounding, + 2^-8 of the largest value for C[c]'s
    16-bit resolution (<= 2^-9 relative, per_channel_multipliers)."""
    cases = {"tiles": (300, 1000, 160, api.EmitOptions(cores=1, n_tile_max=64), 40),
             "cores": (64, 512, 384, api.EmitOptions(cores=3), 44)}
    built = {case: _fp16_out_gemms(f"int8_fp16_out.{case}", *shape) for case, shape in cases.items()}
    results = [r for b in built.values() for r in b[0]]
    inputs = {buf: v for b in built.values() for buf, v in b[1].items()}
    program = emitted.place(results, inputs, "int8_fp16_out")
    placed = emitted.run(device, program, False)
    try:
        raw = {f.buffer: placed.read(program.handles[f.buffer]) for b in built.values() for f in b[2]}
    finally:
        placed.free()
    exact, close = {}, {}
    for case, (_, _, (C32, C16), product, plan, scale, step) in built.items():
        m = product.shape[0]
        acc = emitted.feature_values(C32, raw[C32.buffer])[:, :m, 0].astype(np.int64)  # [N, M]
        got = emitted.feature_values(C16, raw[C16.buffer])[:, :m, 0].astype(np.float64)
        want = acc.T * scale
        exact[f"{case}:int32"] = (acc.T, product)
        exact[f"{case}:fp16"] = (got, plan.apply(acc).astype(np.float64))
        tolerance = step * (0.5 + 2.0 ** -8) + 2.0 ** -8 * float(np.abs(want).max())
        close[f"{case}:dequant"] = (got.T * step, want, tolerance)
    return ProbeRun({f"int8_fp16_out:{b}": data for b, data in raw.items()},
                    exact={f"int8_fp16_out.{k}": v for k, v in exact.items()},
                    close={f"int8_fp16_out.{k}": v for k, v in close.items()})


def _patched(task: api.Task, updates: dict[str, dict[str, int]]) -> api.Task:
    """`task` with the named fields of some registers rewritten in its regcmd."""
    entries = task.regcmd.copy()
    seen = set()
    for d in decode(entries):
        if d.register is not None and d.register.name in updates:
            value = d.register.pack({**d.fields, **updates[d.register.name]})
            entries[d.index] = encode(d.target, d.offset, value)
            seen.add(d.register.name)
    if seen != set(updates):
        raise ValueError(f"the task writes no {sorted(set(updates) - seen)}")
    return replace(task, regcmd=entries)


def deconv_x2(device: Device) -> ProbeRun:
    """Nearest x2 upsampling as a depthwise deconvolution: fp16, 32 channels, 8x8 ->
    16x16, a 2x2 kernel of ones with DECONV set and DECONV_X/Y_STRIDE 2 (written
    as CONV_X/Y_STRIDE are). The candidate reading under test: the CNA reads the
    8x8 map (DATAIN, DMA sizes and strides its own) and convolves the map with
    stride-1 zeros between its pixels, padded by the kernel minus one (PAD 1) on
    every side, so every output pixel sees exactly one input pixel: the output
    geometry is that of a 2x2 convolution over the (2H-1)x(2W-1) zero-stuffed map.
    The reference is numpy's nearest x2."""
    c, h, w = 32, 8, 8
    x = _fp16((c, h, w), 20)
    X = api.Feature("X", 0, c, h, w, "fp16")
    stuffed = api.Feature("X", 0, c, 2 * h - 1, 2 * w - 1, "fp16")  # the geometry the CNA convolves
    Y = api.Feature("Y", 0, c, 2 * h, 2 * w, "fp16")
    result = emit(api.Conv2D(stuffed, np.ones((2, 2, c), np.float16), Y, padding=(1, 1, 1, 1), depthwise=True,
                             name="deconv_x2"), api.EmitOptions(cores=1))
    if len(result.tasks) != 1:
        raise ValueError(f"deconv_x2: expected one task, the emitter made {len(result.tasks)}")
    line, surface = feature_strides(X)
    task = _patched(result.tasks[0], {
        "CNA_CONV_CON1": {"DECONV": 1},
        "CNA_CONV_CON3": {"DECONV_X_STRIDE": 2, "DECONV_Y_STRIDE": 2},
        "CNA_DATA_SIZE0": {"DATAIN_WIDTH": w, "DATAIN_HEIGHT": h},
        "CNA_FC_DATA_SIZE0": {"DMA_WIDTH": w, "DMA_HEIGHT": h},
        "CNA_DMA_CON1": {"LINE_STRIDE": line},
        "CNA_DMA_CON2": {"SURF_STRIDE": surface},
        "CNA_CBUF_CON1": {"DATA_ENTRIES": data_entries(X)}})
    result = replace(result, tasks=[task])
    return _run(device, "deconv_x2", [result], {"X": (X, x)}, {"Y": Y},
                exact={"Y": x.repeat(2, axis=1).repeat(2, axis=2)})


def argb_image(device: Device) -> ProbeRun:
    """A 3-channel fp16 image read as packed pixels (3 interleaved values per pixel,
    no 16-byte atoms): the fp16 3x3 convolution (32 outputs, pad 1) the emitter
    makes for a 16x8 image, with CNA_CONV_CON1's ARGB_IN = 8 | (3 - 1),
    GROUP_LINE_OFF and NONALIGN_DMA set (Mesa's 1-channel mode, one step per extra
    channel, as an RK3576 reading has it) and the feature DMA pointed at the packed
    image: its row pitch given in bytes (Mesa's 1-channel unit) in one program and in
    16-byte units in another, beside the normal program on the atom layout in the
    same submit. A reading holds where its result is the normal program's."""
    c, h, w, n = 3, 8, 16, 32
    x = _fp16((c, h, w), 21)
    wt = (np.random.default_rng(SEED + 22).standard_normal((n, 3, 3, c)) / 4).astype(np.float16)
    row = w * c * 2  # bytes of one packed row
    packed = np.ascontiguousarray(x.transpose(1, 2, 0)).view(np.uint8).reshape(-1)
    X = api.Feature("X", 0, c, h, w, "fp16")
    Y = api.Feature("Y", 0, n, h, w, "fp16")
    results, outputs = [emit(api.Conv2D(X, wt, Y, padding=(1, 1, 1, 1), name="argb_image.atoms"),
                             api.EmitOptions(cores=1))], {"Y": Y}
    inputs = {"X": (X, x)}
    for unit, line in (("bytes", row), ("granules", row // 16)):
        P = api.Feature(f"P_{unit}", 0, c, h, w, "fp16")  # a buffer at least as large as the packed image
        out = api.Feature(f"Y_{unit}", 0, n, h, w, "fp16")
        result = emit(api.Conv2D(P, wt, out, padding=(1, 1, 1, 1), name=f"argb_image.{unit}"),
                      api.EmitOptions(cores=1))
        if len(result.tasks) != 1:
            raise ValueError(f"argb_image: expected one task, the emitter made {len(result.tasks)}")
        task = _patched(result.tasks[0], {
            "CNA_CONV_CON1": {"ARGB_IN": 8 | (c - 1), "GROUP_LINE_OFF": 1, "NONALIGN_DMA": 1},
            "CNA_DMA_CON1": {"LINE_STRIDE": line},
            "CNA_DMA_CON2": {"SURF_STRIDE": line * h}})
        results.append(replace(result, tasks=[task]))
        outputs[f"Y_{unit}"] = out
        inputs[P.buffer] = (P, x)
    program = emitted.place(results, inputs, "argb_image")
    contents = program.case.contents[0]
    for unit in ("bytes", "granules"):  # the packed image over the atom layout place() wrote
        handle = program.handles[f"P_{unit}"]
        raw = np.zeros(program.case.sizes[handle], np.uint8)
        raw[:packed.size] = packed
        contents[handle] = raw.tobytes()
    placed = emitted.run(device, program, False)
    try:
        raw = {name: placed.read(program.handles[f.buffer]) for name, f in outputs.items()}
    finally:
        placed.free()
    want = emitted.feature_values(Y, raw["Y"]).astype(np.float64)
    tolerance = 1e-3 * float(np.abs(want).max()) + 1e-3  # fp16 sums in another order (Q20)
    return ProbeRun({f"argb_image:{k}": v for k, v in raw.items()},
                    close={f"argb_image:Y_{unit}": (emitted.feature_values(outputs[f"Y_{unit}"], raw[f"Y_{unit}"])
                                                    .astype(np.float64), want, tolerance)
                           for unit in ("bytes", "granules")})


def prelu(device: Device) -> ProbeRun:
    """LeakyReLU as the compiler fuses it: an fp16 3x3 convolution whose BN stage
    multiplies negative values only (MUL_PRELU) by 0.1, and the int8 one (an integer
    multiplier and shift), next to the simulator's reading of the NVDLA X2 stage."""
    c, h, w, n = 16, 6, 9, 16
    ep = api.Epilogue(activation="leaky_relu", slope=0.1)
    X, Y = api.Feature("X", 0, c, h, w, "fp16"), api.Feature("Y", 0, n, h, w, "fp16")
    fp16 = emit(api.Conv2D(X, _fp16((n, 3, 3, c), 22, 1 / 12), Y, padding=(1, 1, 1, 1), epilogue=ep, name="prelu"))
    X8 = api.Feature("X8", 0, c, h, w, "int8", api.Quant(0.05, 3))
    Y8 = api.Feature("Y8", 0, n, h, w, "int8", api.Quant(0.5, -10))
    int8 = emit(api.Conv2D(X8, _int8((n, 3, 3, c), 23), Y8, padding=(1, 1, 1, 1), weight_quant=api.Quant(0.02),
                           epilogue=ep, name="prelu.int8"))
    return _run(device, "prelu", [fp16, int8], {"X": (X, _fp16((c, h, w), 24)), "X8": (X8, _int8((c, h, w), 25))},
                {"Y": Y, "Y8": Y8})


def avg_exclude_pad(device: Device) -> ProbeRun:
    """A pad-excluding 3x3/2 average pool as the compiler lowers it (compiler/npu/pool.py
    `_avg_rescaled`): a depthwise convolution of ones whose EW stage multiplies each sum
    by a constant per-pixel map of 1/count, fp16 (the validated multiply word) and int8
    (the converter-live multiply word the int8 element-wise Mul uses, unmeasured)."""
    c, h, w = 40, 11, 13
    oh, ow = 6, 7
    X, Y = api.Feature("X", 0, c, h, w, "fp16"), api.Feature("Y", 0, c, oh, ow, "fp16")
    fp16 = emit(api.Pool(X, Y, "avg", (3, 3), (2, 2), (1, 1, 1, 1), "avg.fp16", count_padding=False))
    X8 = api.Feature("X8", 0, c, h, w, "int8", api.Quant(0.05, 3))
    Y8 = api.Feature("Y8", 0, c, oh, ow, "int8", api.Quant(0.04, -6))
    int8 = emit(api.Pool(X8, Y8, "avg", (3, 3), (2, 2), (1, 1, 1, 1), "avg.int8", count_padding=False))
    return _run(device, "avg_exclude_pad", [fp16, int8], {"X": (X, _fp16((c, h, w), 26)),
                                                           "X8": (X8, _int8((c, h, w), 27))}, {"Y": Y, "Y8": Y8})


def _max_pool_reference(x: np.ndarray, k: int, s: int, pad: int) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    oh, ow = (xp.shape[1] - k) // s + 1, (xp.shape[2] - k) // s + 1
    return np.max([xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s] for i in range(k) for j in range(k)],
                  axis=0)


def max_taps(device: Device) -> ProbeRun:
    """Max pooling as the compiler lowers it without the PPU (compiler/npu/pool.py
    `_max_as_taps`): one-hot depthwise convolutions padded with the dtype's minimum
    (CNA PAD_VALUE), each keeping the EW stage's max (ALU algo 0) of its result and
    the running result read back through ERDMA, DATA_REUSE across the taps of a tile.
    An int8 3x3/2 pool of 80 channels (two bands, the second a partial group) and an
    fp16 5x5/1 pool (YOLO's SPPF), against numpy's exact maxima."""
    x8, x16 = _int8((80, 11, 13), 26), _fp16((32, 9, 10), 27, 4.0)
    q = api.Quant(0.05, -3)
    X8, Y8 = api.Feature("X8", 0, 80, 11, 13, "int8", q), api.Feature("Y8", 0, 80, 6, 7, "int8", q)
    X16, Y16 = api.Feature("X16", 0, 32, 9, 10, "fp16"), api.Feature("Y16", 0, 32, 9, 10, "fp16")
    int8 = emit(api.Pool(X8, Y8, "max", (3, 3), (2, 2), (1, 1, 1, 1), name="max_taps"))
    fp16 = emit(api.Pool(X16, Y16, "max", (5, 5), (1, 1), (2, 2, 2, 2), name="max_taps.fp16"))
    return _run(device, "max_taps", [int8, fp16], {"X8": (X8, x8), "X16": (X16, x16)}, {"Y8": Y8, "Y16": Y16},
                exact={"Y8": _max_pool_reference(x8, 3, 2, 1), "Y16": _max_pool_reference(x16, 5, 1, 2)})


def upsample_x2(device: Device) -> ProbeRun:
    """Nearest x2 as the compiler lowers a Resize (compiler/npu/upsample.py): fp16,
    64 channels, 12x10 -> 24x20 on 3 cores; its row copies write with a line pitch of
    two lines (NOTCH_ADDR = width), the Q4 reading the compiler depends on."""
    c, h, w = 64, 12, 10
    x = _fp16((c, h, w), 21)
    X, Y = api.Feature("X", 0, c, h, w, "fp16"), api.Feature("Y", 0, c, 2 * h, 2 * w, "fp16")
    result = emit(api.Upsample(X, Y, "upsample_x2"))
    return _run(device, "upsample_x2", [result], {"X": (X, x)}, {"Y": Y},
                exact={"Y": x.repeat(2, axis=1).repeat(2, axis=2)})


def gate_chain(device: Device) -> ProbeRun:
    """A squeeze-excite gate as the compiler lowers it (compiler/emitter_builders._gate_conv):
    an fp16 1x1 convolution reads a GEMM row (4 rows, 1 column) at row stride 4 and writes
    the gate as a one-position map S, and in the same chained job a 1x1 depthwise
    convolution of a 40x6x9 map reads S as its weights (the CNA's weight DMA after the
    earlier task's DPU write, as a feature read after a write). Compared with numpy."""
    k, c, h, w = 16, 40, 6, 9
    a, x = _fp16((k,), 23), _fp16((c, h, w), 24)
    w1 = (np.random.default_rng(SEED + 25).standard_normal((c, 1, 1, k)) / 4).astype(np.float16)
    A = api.Feature.gemm("A", 0, 1, k, "fp16")
    S, X, Y = api.Feature("S", 0, c, 1, 1, "fp16"), api.Feature("X", 0, c, h, w, "fp16"), \
        api.Feature("Y", 0, c, h, w, "fp16")
    one_core = api.EmitOptions(cores=1)
    excite = emit(api.Conv2D(A, w1, S, stride=(A.height, 1), name="gate_chain.excite"), one_core)
    product = emit(api.Conv2D(X, np.zeros((1, 1, c), np.float16), Y, depthwise=True, weights_buffer="S",
                              name="gate_chain.mul"), one_core)
    rows = np.zeros((k, A.height, 1), np.float16)
    rows[:, 0, 0] = a
    gate = (w1[:, 0, 0, :].astype(np.float64) @ a.astype(np.float64)).astype(np.float16)
    want = x.astype(np.float64) * gate.astype(np.float64)[:, None, None]
    run = _run(device, "gate_chain", [excite, product], {"A": (A, rows), "X": (X, x)}, {"Y": Y}, chained=True)
    got = emitted.feature_values(Y, run.outputs["gate_chain:Y"]).astype(np.float64)
    tolerance = 2e-3 * float(np.abs(want).max())  # fp16 rounding of the gate and the product
    return replace(run, close={"gate_chain:Y": (got, want, tolerance)})


PROBES: tuple[Probe, ...] = (
    Probe("gemv_m1", "Q2", "a 1x1 convolution of a 1-row map (M=1 GEMV) computes correctly",
          {"min_feature_rows": 1}, gemv_m1,
          "M=1 works on this board: GEMV needs no padding to 4 rows (quirks.min_feature_rows=1)",
          "M=1 is wrong on this board: keep padding GEMV to 4 rows"),
    Probe("chain_int8", "Q1", "int8 tasks after the first of a hardware-chained kick compute correctly",
          {"chained_integer_tasks": "allow"}, chain_int8,
          "int8 chains are right on this board: quirks.chained_integer_tasks can be 'allow'",
          "int8 chains are wrong on this board: keep one kick per int8 task", needs_chaining=True),
    Probe("chain_fp16", "Q1", "fp16 tasks chained in one kick compute correctly (control for chain_int8)",
          {}, chain_fp16, "fp16 chains are right on this board, as assumed",
          "fp16 chains are wrong on this board: chaining itself is broken here", needs_chaining=True),
    Probe("strides", "Q3", "CNA LINE_STRIDE/SURF_STRIDE are 16-byte units with the group-line model",
          {}, strides, "the stride model holds", "the stride model is wrong: see the differing outputs"),
    Probe("n_near_8192", "Q6", "a DPU output cube of 8160 channels in one task is written correctly",
          {"max_dpu_cube": 8192}, n_near_8192, "cubes up to 8160 channels work: quirks.max_dpu_cube can grow",
          "cubes near 8192 corrupt output: keep max_dpu_cube at 4096"),
    Probe("k_over_8192", "Q20", "K > 8192 split over tasks, partials added on the NPU, matches the simulator",
          {}, k_over_8192, "the K split matches the simulator's accumulation", "the K split differs on the board"),
    Probe("lut", "", "the DPU LUT (LE/LO tables, index shift, slopes) matches the simulator's sigmoid",
          {}, lut, "LUT activations are bit-exact with the simulator", "LUT activations differ from the model"),
    Probe("ppu_pool", "Q12", "a PPU-only pooling task completes and pools like the simulator",
          {"completion_blocks": ("DPU", "PPU")}, ppu_pool,
          "PPU tasks complete and pool as modelled", "PPU-only tasks do not complete (or pool differently) here"),
    Probe("cbuf_slack", "Q6", "an int8 feature tile with W=1 fills its CBUF banks without a slack bank",
          {"int8_width1_slack_bank": False}, cbuf_slack,
          "no slack bank needed: quirks.int8_width1_slack_bank can be False",
          "the slack bank is needed: keep int8_width1_slack_bank"),
    Probe("int4_gemm", "Q23", "int4 GEMM: A and B nibbles low first, int16 partials written with size_e 7",
          {}, int4_gemm, "the int4 layouts and writer hold (the exact partials match)",
          "the int4 program differs: see the differing outputs (nibble order, writer)"),
    Probe("int4_overflow", "Q23", "an int4 sum beyond int16 saturates",
          {"int4_int16_overflow": "saturate"}, int4_overflow,
          "int4 sums saturate at int16: quirks.int4_int16_overflow can be 'saturate' (K per task stays bounded)",
          "int4 sums do not saturate (see int4_overflow_wrap)"),
    Probe("int4_overflow_wrap", "Q23", "an int4 sum beyond int16 wraps",
          {"int4_int16_overflow": "wrap"}, int4_overflow_wrap,
          "int4 sums wrap at int16: quirks.int4_int16_overflow can be 'wrap'",
          "int4 sums do not wrap; if neither reading agrees the accumulator is wider (compare the raw bytes)"),
    Probe("int4_gemv_m1", "Q2", "an int4 GEMV over a 1-row map (M=1) computes correctly",
          {"min_feature_rows": 1}, int4_gemv_m1,
          "int4 M=1 works on this board", "int4 M=1 is wrong on this board: keep padding to 4 rows"),
    Probe("weight_reuse", "", "WEIGHT_REUSE keeps weights in CBUF across the tasks of a job",
          {}, weight_reuse, "weight reuse across tasks works", "weight reuse across tasks gives wrong results"),
    Probe("prelu", "Q25", "BN's multiplier in PReLU mode scales negative values only (LeakyReLU, fp16 and int8)",
          {}, prelu, "LeakyReLU epilogues are bit-exact with the simulator",
          "MUL_PRELU acts differently here: LeakyReLU epilogues are wrong on this board"),
    Probe("avg_exclude_pad", "", "the EW stage multiplies a depthwise convolution's sums by a constant "
          "per-pixel map (a pad-excluding average pool, fp16 and int8)", {}, avg_exclude_pad,
          "pad-excluding averages are bit-exact with the simulator",
          "the EW multiply acts differently here: keep pad-excluding averages on the CPU (compare fp16 and int8)"),
    Probe("max_taps", "", "the EW stage keeps the max (ALU algo 0) of a one-hot depthwise convolution and its "
          "ERDMA operand, int8 and fp16, padded with the minimum (max pooling without the PPU)", {}, max_taps,
          "max pooling as DPU taps is exact on this board, as modelled",
          "the EW max, the minimum padding or DATA_REUSE across taps acts differently here: keep max pools on "
          "the CPU (compare the raw bytes)"),
    Probe("upsample_x2", "Q4", "the DPU writes lines of width + NOTCH_ADDR atoms (nearest x2 Resize's row copies)",
          {}, upsample_x2, "the notch reading holds: nearest x2 Resize on the NPU is right on this board",
          "the notch is read differently here: the NPU's nearest x2 Resize is wrong on this board (compare bytes)"),
    Probe("lut_int8", "Q22", "the LUT runs on an int8 convolution's integer datapath (BN integer index, "
          "OUT_CVT to int8)", {}, lut_int8,
          "int8 LUT epilogues work as programmed: int8 groups with SiLU/sigmoid could stay int8 (Q22 reading)",
          "the int8 LUT program differs: keep table groups in fp16", simulated=False),
    Probe("int8_fp16_out", "Q27", "an int8 GEMM of several tiles and cores writes fp16 (OUT_PRECISION 2, size_e 3) "
          "through the per-channel BS multiplier and OUT_CVT", {}, int8_fp16_out,
          "int8 GEMMs can write dequantized fp16 beyond single tiles: an int8 FFN's gate/up could feed an fp16 "
          "segment without the host (Q27 reading to record)",
          "fp16 output of an int8 GEMM is wrong here (compare the exact and dequant checks): keep int32 out and "
          "the host's dequantization", simulated=False),
    Probe("deconv_x2", "Q24", "a depthwise deconvolution (DECONV, stride 2, 2x2 ones) is nearest x2 "
          "upsampling", {}, deconv_x2,
          "DECONV zero-stuffs the input as read here: nearest Resize x2 can run on the NPU (Q24 reading)",
          "DECONV does not act as read here: keep nearest Resize on the CPU (compare the raw bytes)",
          simulated=False),
    Probe("gate_chain", "", "a task reads as its weights what an earlier task of its chained job wrote "
          "(a squeeze-excite gate: strided 1x1 convolution, then the gate's depthwise product)", {}, gate_chain,
          "weights written by an earlier task are read as written: squeeze-excite gates stay on the NPU",
          "the product saw stale weights: gates must cross through the host (emitter_graph.npu_layout)",
          needs_chaining=True),
    Probe("argb_image", "Q26", "the CNA reads a packed 3-channel image (ARGB_IN 8 | 2, GROUP_LINE_OFF, "
          "NONALIGN_DMA) into a direct fp16 convolution", {}, argb_image,
          "the packed image reads as written (the agreeing program's row-pitch unit): the model input can be "
          "handed to the NPU as pixels, without the host's atom layout (Q26 reading to record)",
          "the packed read differs (see which of Y_bytes / Y_granules): keep the host's image edge", simulated=False),
)
