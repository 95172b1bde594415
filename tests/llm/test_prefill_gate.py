"""Gemma 4's per-layer gate stretch of many rows (runtime/llm/prefill_per_layer.gate_tiles:
act(gate) * a Pick of the per-layer inputs, read in place) against a float64 reference: the gate
from int32 or fp16 atoms, GELU (tanh form) or SiLU, the up row a strided slice of a host
[rows, layers, K] tensor, into int8 (Hadamard, no factor) or fp16 atoms; row counts that fill
tiles and leave a partial one. Tolerances as tests/llm/test_prefill_ffn.py states them (the
same arithmetic): fp16 codes the reference's rounding or a neighbour; int8 scales within 1e-5
relative, codes within 1, at most 0.5 % of them off; padding rows zeroed."""

from __future__ import annotations

import numpy as np
import pytest
from llm.test_prefill_ffn import NO_PARTIAL, _act, _in_edge, _operand, assert_int8_codes

from rkc.runtime.kernels.hadamard import compiled_form, make_rotation, rotate
from rkc.runtime.llm import prefill_fused as pf
from rkc.runtime.llm.prefill_kernels import ACT_GELU_TANH, ACT_SILU, LANES
from rkc.runtime.llm.prefill_per_layer import gate_tiles
from rkc.runtime.llm.threads import over_ranges
from rkc.runtime.plan import BoTensor

F32 = np.float32


@pytest.mark.parametrize("rows", [16, 37, 128])
@pytest.mark.parametrize("k", [64, 256])
@pytest.mark.parametrize("edges", [("int32", "int8"), ("fp16", "fp16"), ("int32", "fp16")])
@pytest.mark.parametrize("act", [ACT_GELU_TANH, ACT_SILU])
def test_gate_tiles_match_a_float64_reference(rows, k, edges, act):
    rng = np.random.default_rng(rows * k + act + len(edges[0]))
    g_src, g_rs, g_ch, g_b, g = _in_edge(rng, rows, k, edges[0], False, 1)
    layers, index = 5, 3
    per_layer = (rng.standard_normal((rows, layers, k)) * 2).astype(F32)
    want = _act(g, act) * per_layer[:, index].astype(np.float64)
    out_bt, _, out_host = _operand(rows, k, edges[1], 3)
    form = compiled_form(make_rotation(k, "auto"), k)
    assert form.factor is None  # a power of two: Hadamard blocks only
    scale = np.full(rows, np.nan, F32)
    out_kind, dst = (pf.OUT_HALF, out_bt.atoms.view(np.uint16)) if edges[1] == "fp16" else (pf.OUT_QUANT,
                                                                                               out_bt.atoms)
    in_kind = pf.IN_HALF if edges[0] == "fp16" else pf.IN_DEQUANT
    consts = (in_kind, g_src, NO_PARTIAL, g_rs, g_ch, g_b, False, per_layer[:, index], act, rows, k, out_kind, dst,
              form.signs, form.block, form.norm, scale, np.zeros((0, 0), F32))
    over_ranges(lambda lo, hi: gate_tiles(*consts, lo, hi), -(-rows // LANES))  # tiles shared by the threads
    stored = out_bt.atoms.shape[1]
    if edges[1] == "fp16":
        got = BoTensor(out_bt.info, out_host).reader(np.float32)()
        ref = want.astype(np.float16)
        ulps = np.abs(got.astype(np.float16).view(np.int16).astype(np.int32) - ref.view(np.int16).astype(np.int32))
        assert ulps.max() <= 1
        return
    y = rotate(want, make_rotation(k, "auto"))
    assert_int8_codes(out_bt, scale, y, rows, stored, k)
