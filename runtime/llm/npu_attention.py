"""The host's side of prefill attention on the NPU (compiler/llm/npu_attention.py
emits the products): where a KV head's cached keys and values, a chunk's
queries, scores, probabilities and output live in the layouts the two fp16
GEMMs read and write, and the softmax between them.

Per KV head, M = C * G query rows in (token, head) order, P key slots:
* queries Q [M, D]: fp16 GEMM feature (NC1HWC2, C = D, H = M rounded to 4);
* keys: the GEMM's weights, one kernel of D channels per slot (fp16 weights
  layout: groups of 16 kernels, each D / 32 tiles of [16 kernels][32 channels]);
* values V^T [Dv, P]: fp16 GEMM feature (C = slots, H = Dv);
* scores S [M, P]: fp32 feature (C = P, H = M rounded to 4, C2 = 4);
* probabilities: the second GEMM's weights, one kernel of P channels per query
  row (fp16 weights layout), written by `softmax_into_probs` from S in place,
  rows past M zeroed (the GEMM reads whole kernel groups);
* output O^T [Dv, M]: fp32 feature (C = M, H = Dv, C2 = 4).

The softmax is one compiled float32 pass set per row (scale, optional
soft-capping, causal and window mask, max, exp, sum, normalisation, the fp16
rounding into the probabilities' kernel), threaded over rows
(runtime/llm/threads.py). tests/llm/test_npu_attention.py checks the whole
attention on the simulator against a float64 numpy attention.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.ir.npu import layout
from rkc.ir.npu.geometry import GEMM_ROW_ALIGN
from rkc.runtime.half import narrow_bits
from rkc.runtime.llm.prefill_kernels import exp_into
from rkc.runtime.llm.threads import over_ranges

KEY_ALIGN = layout.CHANNEL_GROUP  # key slots come in whole 32-channel weight rows (the probabilities' channels)
KG = layout.kernel_group_for(2)  # fp16 kernels per weight group (16)
C2_HALF = layout.c2_for(2)  # fp16 channels per atom (8)
C2_FLOAT = layout.c2_for(4)  # fp32 channels per atom (4)
_JIT = {"cache": True, "nogil": True}


def feature_rows(rows: int) -> int:
    """Rows a GEMM feature of `rows` rows occupies (geometry.GEMM_ROW_ALIGN)."""
    return layout.align(rows, GEMM_ROW_ALIGN)


# -- offsets (elements) of the layouts above ---------------------------------------------------
def key_offsets(slots: np.ndarray, head_dim: int) -> np.ndarray:
    """[len(slots), D] offsets of each slot's key in a K cache."""
    if head_dim % KEY_ALIGN:  # a partial last channel tile would change the order within a group
        raise ValueError(f"head_dim {head_dim}: the K cache takes multiples of {KEY_ALIGN}")
    s = np.asarray(slots, np.int64)[:, None]
    c = np.arange(head_dim, dtype=np.int64)[None, :]
    return s // KG * KG * head_dim + c // KEY_ALIGN * KG * KEY_ALIGN + s % KG * KEY_ALIGN + c % KEY_ALIGN


def value_offsets(slots: np.ndarray, value_dim: int) -> np.ndarray:
    """[len(slots), Dv] offsets of each slot's value in a V^T cache."""
    height = feature_rows(value_dim)
    s = np.asarray(slots, np.int64)[:, None]
    r = np.arange(value_dim, dtype=np.int64)[None, :]
    return s // C2_HALF * height * C2_HALF + r * C2_HALF + s % C2_HALF


def cache_elements(slots: int, head_dim: int, value_dim: int) -> tuple[int, int]:
    """fp16 elements of one KV head's K and V caches of `slots` slots."""
    return layout.align(slots, KG) * head_dim, layout.align(slots, C2_HALF) * feature_rows(value_dim)


def probs_elements(query_rows: int, keys: int) -> int:
    """fp16 elements of the probabilities (whole kernel groups of query rows)."""
    return layout.align(query_rows, KG) * keys


def write_queries(q: np.ndarray, out: np.ndarray) -> None:
    """q [M, D] float32 -> fp16 feature `out` (flat, >= D / 8 * rows * 8 elements)."""
    m, d = q.shape
    rows = feature_rows(m)
    atoms = out[:d // C2_HALF * rows * C2_HALF].reshape(d // C2_HALF, rows, C2_HALF)
    atoms[:, :m] = q.astype(np.float16).reshape(m, d // C2_HALF, C2_HALF).transpose(1, 0, 2)
    atoms[:, m:] = 0


def read_output(flat: np.ndarray, query_rows: int, value_dim: int) -> np.ndarray:
    """O [M, Dv] float32 from the fp32 O^T feature (C = M, H = Dv)."""
    height = feature_rows(value_dim)
    groups = -(-query_rows // C2_FLOAT)
    atoms = flat[:groups * height * C2_FLOAT].reshape(groups, height, C2_FLOAT)
    return atoms[:, :value_dim].transpose(0, 2, 1).reshape(groups * C2_FLOAT, value_dim)[:query_rows]


# -- the softmax -------------------------------------------------------------------------------
@njit(**_JIT)
def _softmax_rows(scores, score_rows, probs, keys, kpos, qpos, scale, softcap, window, lo, hi):
    """Rows [lo, hi) of S (fp32 feature, `score_rows` rows) -> their kernels of
    the probabilities (fp16 bits); rows from len(qpos) on are zeroed."""
    t = np.empty(keys, np.float32)
    e = np.empty(keys, np.float32)
    bits = np.empty(keys, np.int32)
    neg = np.float32(-np.inf)
    for r in range(lo, hi):
        base = (r // KG) * KG * keys + (r % KG) * KEY_ALIGN
        if r >= qpos.size:
            for j in range(keys):
                probs[base + (j // KEY_ALIGN) * KG * KEY_ALIGN + j % KEY_ALIGN] = 0
            continue
        q = qpos[r]
        top = neg
        for j in range(keys):
            v = scores[((j // C2_FLOAT) * score_rows + r) * C2_FLOAT + j % C2_FLOAT] * scale
            if softcap != 0:
                v = np.float32(softcap * np.tanh(v / softcap))
            if kpos[j] > q or (window != 0 and q - kpos[j] >= window):
                v = neg
            t[j] = v
            if v > top:
                top = v
        for j in range(keys):
            t[j] = t[j] - top
        exp_into(t, e, bits)
        total = np.float32(0.0)
        for j in range(keys):
            if t[j] == neg:  # hidden: an exact zero (exp_into clamps -inf to exp(-87))
                e[j] = np.float32(0.0)
            total += e[j]
        inv = np.float32(1.0) / total
        for j in range(keys):
            e[j] = e[j] * inv
        ebits = e.view(np.uint32)
        for j in range(keys):
            probs[base + (j // KEY_ALIGN) * KG * KEY_ALIGN + j % KEY_ALIGN] = narrow_bits(ebits[j])


def softmax_into_probs(scores: np.ndarray, probs: np.ndarray, keys: int, kpos: np.ndarray, qpos: np.ndarray,
                       scale: float, softcap: float = 0.0, window: int = 0) -> None:
    """Each query row's softmax over its visible keys, from the fp32 scores S
    (flat, C = keys, H = feature_rows(M)) into the probabilities' kernels
    (flat fp16 bits, probs_elements(M, keys)). kpos [keys]: each slot's key
    position (an unused slot: a position past every query, so hidden); qpos
    [M]: each query row's position. A row sees key j when kpos[j] <= qpos and,
    with a window, qpos - kpos[j] < window; every row must see one."""
    m = qpos.size
    if keys % KEY_ALIGN or probs.size < probs_elements(m, keys):
        raise ValueError(f"probabilities of {m} rows x {keys} keys: keys must be a multiple of {KEY_ALIGN} "
                         f"and the buffer {probs_elements(m, keys)} elements")
    kp = np.ascontiguousarray(kpos, np.int64)
    qp = np.ascontiguousarray(qpos, np.int64)
    s = scores.reshape(-1).view(np.float32)
    p = probs.reshape(-1).view(np.uint16)
    rows = feature_rows(m)
    total = layout.align(m, KG)

    def run(lo: int, hi: int) -> None:
        _softmax_rows(s, rows, p, keys, kp, qp, np.float32(scale), np.float32(softcap), int(window), lo, hi)
    over_ranges(run, total)
