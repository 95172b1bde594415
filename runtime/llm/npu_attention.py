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

The softmax is the host attention's own compiled float32 kernel
(prefill_kernels.softmax_columns: scale, causal and window mask, max, exp,
sum, normalisation) over the keys each block of query rows can see, between
a transposing read of the scores and the fp16 rounding into the
probabilities' kernels, threaded over blocks (runtime/llm/threads.py). (The
model's Attention op has no soft-capping: Gemma 2's is not supported by the
frontend.) tests/llm/test_npu_attention.py checks the whole
attention on the simulator against a float64 numpy attention.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.ir.npu import layout
from rkc.ir.npu.geometry import GEMM_ROW_ALIGN
from rkc.runtime.half import narrow_bits
from rkc.runtime.llm.prefill_kernels import softmax_columns
from rkc.runtime.llm.threads import over_ranges

KEY_ALIGN = layout.CHANNEL_GROUP  # key slots come in whole 32-channel weight rows (the probabilities' channels)
KG = layout.kernel_group_for(2)  # fp16 kernels per weight group (16)
C2_HALF = layout.c2_for(2)  # fp16 channels per atom (8)
C2_FLOAT = layout.c2_for(4)  # fp32 channels per atom (4)
_JIT = {"cache": True, "nogil": True, "fastmath": False}


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


HIDDEN = np.iinfo(np.int64).max  # an empty slot's position: past every query, so no query sees it


class LayerCache:
    """One layer's KV cache in the layouts the products read: per KV head, the
    keys as the scores' weights and the values as V^T (fp16, `slots` slots;
    the flat arrays are the NPU buffers' host views), and each slot's
    position. A full-attention layer's slot is its position (the products
    read the prefix a program covers); a window layer's slots are a ring
    (slot = position mod slots), which must hold the window and a chunk."""

    def __init__(self, keys: list[np.ndarray], values: list[np.ndarray], slots: int, head_dim: int,
                 value_dim: int, window: int = 0) -> None:
        k_elems, v_elems = cache_elements(slots, head_dim, value_dim)
        if len(keys) != len(values) or any(k.size < k_elems for k in keys) or any(v.size < v_elems for v in values):
            raise ValueError(f"a cache of {slots} slots needs {k_elems} / {v_elems} fp16 elements a head")
        self.keys, self.values = [k.view(np.float16) for k in keys], [v.view(np.float16) for v in values]
        self.slots, self.head_dim, self.value_dim, self.window = slots, head_dim, value_dim, window
        self.positions = np.full(slots, HIDDEN, np.int64)

    def store(self, k: np.ndarray, v: np.ndarray, pos: np.ndarray) -> None:
        """The chunk's keys k [T, Hkv, D] and values v [T, Hkv, Dv] at positions
        pos [T] (ascending), rounded to fp16 into their slots."""
        pos = np.asarray(pos, np.int64)
        if self.window:
            if self.slots < self.window + len(pos) - 1:
                raise ValueError(f"a ring of {self.slots} slots cannot hold a window of {self.window} and a "
                                 f"chunk of {len(pos)}")
            slot = pos % self.slots
        else:
            if pos.size and pos[-1] >= self.slots:
                raise ValueError(f"position {int(pos[-1])} is past the cache's {self.slots} slots")
            slot = pos
        k_at, v_at = key_offsets(slot, self.head_dim), value_offsets(slot, self.value_dim)
        for h, (kc, vc) in enumerate(zip(self.keys, self.values)):
            kc[k_at] = k[:, h]
            vc[v_at] = v[:, h]
        self.positions[slot] = pos

    def covered(self, slots: int) -> np.ndarray:
        """The positions of the first `slots` slots (a program's products read them)."""
        return self.positions[:slots]


def write_queries(q: np.ndarray, head0: int, group: int, out: np.ndarray) -> None:
    """Heads head0 .. head0 + group of q [T, H, D] float32 as the fp16 feature
    Q [T * group, D] (rows in (token, head) order) into `out` (flat fp16)."""
    t, _, d = q.shape
    _queries_into(np.ascontiguousarray(q, np.float32).view(np.uint32), head0, group, feature_rows(t * group), out.view(np.uint16))


def read_output(flat: np.ndarray, query_rows: int, value_dim: int) -> np.ndarray:
    """O [M, Dv] float32 from the fp32 O^T feature (C = M, H = Dv)."""
    height = feature_rows(value_dim)
    groups = -(-query_rows // C2_FLOAT)
    atoms = flat[:groups * height * C2_FLOAT].reshape(groups, height, C2_FLOAT)
    return atoms[:, :value_dim].transpose(0, 2, 1).reshape(groups * C2_FLOAT, value_dim)[:query_rows]


# -- the softmax -------------------------------------------------------------------------------
_HALF_NORMAL_MIN = np.uint32(113 << 23)  # float32 bits of 2^-14, fp16's smallest normal
_HALF_REBIAS = np.uint32((((15 - 127) << 23) + 0xFFF) & 0xFFFFFFFF)  # (uint32 sums wrap: numba widens, the low 16 bits stay)
_DENORMAL_MAGIC = np.uint32(126 << 23)  # float32 0.5: x + 0.5 leaves x's fp16 denormal in the low bits, rounded to even


@njit(cache=True, nogil=True, fastmath=False)
def _halves_of_units(x, lo, hi, shifted, out):
    """out[j] = fp16 bits of x[j] for j in [lo, hi), x float32 in [0, 1],
    rounded to nearest even as numpy's astype rounds (tests/llm/
    test_npu_attention.py checks it against numpy): the normal range by
    re-biasing the exponent and rounding the dropped 13 bits, denormals by the
    float addition of 0.5, with a select and no branch, so the loop vectorises
    (runtime/half.narrow_bits keeps NaN payloads at the cost of a select the
    vectoriser refuses; a probability has none). `shifted`: scratch like x."""
    for j in range(lo, hi):
        shifted[j] = x[j] + np.float32(0.5)
    xb, sb = x.view(np.uint32), shifted.view(np.uint32)
    for j in range(lo, hi):
        u = xb[j]
        normal = (u + _HALF_REBIAS + ((u >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
        out[j] = np.uint16(normal if u >= _HALF_NORMAL_MIN else sb[j] - _DENORMAL_MAGIC)


@njit(**_JIT)
def _scores_columns(scores, score_rows, c0, c1, lo, hi, out):
    """out[j - lo, c - c0] = S[c, j] for query rows c in [c0, c1), keys j in
    [lo, hi): S's fp32 feature (atoms of four keys of one row) transposed to
    the [keys, rows] buffer softmax_columns runs over."""
    n = c1 - c0
    for j in range(lo, hi):
        src = ((j // C2_FLOAT) * score_rows + c0) * C2_FLOAT + j % C2_FLOAT
        row = out[j - lo]
        for c in range(n):
            row[c] = scores[src + c * C2_FLOAT]


@njit(**_JIT)
def _columns_into_probs(s, lo, hi, c0, c1, keys, probs, shifted, halves):
    """The probabilities s [hi - lo, c1 - c0] (keys x query rows c0.. c1, c0 a
    multiple of KG) as fp16 into those rows' kernels of `probs` (bits), every
    key outside [lo, hi) and every padding kernel up to the group's end 0."""
    n = c1 - c0
    for j in range(hi - lo):
        _halves_of_units(s[j], 0, n, shifted, halves[j])
    for grp in range(c0 // KG, -(-c1 // KG)):
        base = grp * KG * keys
        first = grp * KG - c0
        real = min(KG, n - first)  # the group's kernels that are rows of this block
        for j0 in range(0, keys, KEY_ALIGN):
            tile = probs[base + j0 * KG:base + (j0 + KEY_ALIGN) * KG]  # [KG kernels][32 keys]
            for jj in range(KEY_ALIGN):
                j = j0 + jj
                if lo <= j < hi:
                    src = halves[j - lo]
                    for rr in range(real):
                        tile[rr * KEY_ALIGN + jj] = src[first + rr]
                    for rr in range(real, KG):
                        tile[rr * KEY_ALIGN + jj] = 0
                else:
                    for rr in range(KG):
                        tile[rr * KEY_ALIGN + jj] = 0


@njit(**_JIT)
def _queries_into(q, head0, group, rows, out):
    """out: the fp16 feature (bits) of Q [M, D], M = T * group rows in (token,
    head) order from heads head0.. of q [T, H, D] (float32 bits); pad rows
    zeroed. Row by row: each source row is read once, contiguously, and
    written as D / 8 atoms (2.8x the atom-major order's speed, measured)."""
    t_, _, d = q.shape
    m = t_ * group
    for r in range(rows):
        for c1 in range(d // C2_HALF):
            dst = (c1 * rows + r) * C2_HALF
            if r < m:
                src = q[r // group, head0 + r % group]
                for lane in range(C2_HALF):
                    out[dst + lane] = narrow_bits(src[c1 * C2_HALF + lane])
            else:
                for lane in range(C2_HALF):
                    out[dst + lane] = 0


BLOCK_ROWS = 24 * KG  # query rows per softmax block: 64 tokens of a 6-head group


def softmax_into_probs(scores: np.ndarray, probs: np.ndarray, keys: int, kpos: np.ndarray, qpos: np.ndarray,
                       scale: float, window: int = 0) -> None:
    """Each query row's softmax over its visible keys, from the fp32 scores S
    (flat, C = keys, H = feature_rows(M)) into the probabilities' kernels
    (flat fp16 bits, probs_elements(M, keys)). kpos [keys]: each slot's key
    position (an unused slot: a position past every query, so hidden); qpos
    [M]: each query row's position. A row sees key j when kpos[j] <= qpos and,
    with a window, qpos - kpos[j] < window; every row must see one.

    By blocks of BLOCK_ROWS query rows, threaded: the block's scores over the
    keys some row of it can see (kpos ascending: a linear cache, empty slots
    last; else a ring, every slot) transposed into a [keys, rows] buffer,
    prefill_kernels.softmax_columns (the host attention's softmax: scale,
    mask, max, exp, sum, division in float32) over it, and the result
    rounded to fp16 into the rows' kernels."""
    m = qpos.size
    if keys % KEY_ALIGN or probs.size < probs_elements(m, keys):
        raise ValueError(f"probabilities of {m} rows x {keys} keys: keys must be a multiple of {KEY_ALIGN} "
                         f"and the buffer {probs_elements(m, keys)} elements")
    kp = np.ascontiguousarray(kpos, np.int64)
    qp = np.ascontiguousarray(qpos, np.int64)
    s = scores.reshape(-1).view(np.float32)
    p = probs.reshape(-1).view(np.uint16)
    rows = feature_rows(m)
    spans = bool(np.all(kp[1:] >= kp[:-1]))
    blocks = -(-m // BLOCK_ROWS)

    def run(first: int, last: int) -> None:
        for b in range(first, last):
            c0, c1 = b * BLOCK_ROWS, min(m, (b + 1) * BLOCK_ROWS)
            lo, hi = 0, keys
            if spans:
                block = qp[c0:c1]
                hi = int(np.searchsorted(kp, block.max(), side="right"))
                lo = int(np.searchsorted(kp, block.min() - window, side="right")) if window else 0
            buf = np.empty((hi - lo, c1 - c0), np.float32)
            _scores_columns(s, rows, c0, c1, lo, hi, buf)
            softmax_columns(buf, np.float32(scale), kp[lo:hi], qp[c0:c1], int(window))
            _columns_into_probs(buf, lo, hi, c0, c1, keys, p, np.empty(c1 - c0, np.float32),
                                np.empty((hi - lo, c1 - c0), np.uint16))
    over_ranges(run, blocks)
