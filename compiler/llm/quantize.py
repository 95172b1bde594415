"""int8 weights per output channel (row) for W8A8: q int8 [N, K] and one scale
per row, w ~= q * scale[:, None]. The NPU program is the same whatever the
method; the methods differ in the scale and in how each weight is rounded.
A rounding scheme (`rkc compile --int8-rounding`, ROUNDINGS) says which
products each method rounds.

* "rtn":  every weight rounded to nearest.
* "gptq": GPTQ (Frantar et al., 2022, arXiv:2210.17323): the columns are
  rounded one at a time (largest input energy first) and each column's
  rounding error is spread over the columns not rounded yet, weighted by the
  inverse of the input's second moment H = X^T X from calibration — so what is
  minimised is the product's output error on real activations, ||X (W - Q)^T||,
  not each weight's own error. Rows are independent given H, so the work runs
  over blocks of rows, vectorised.

The row scales are max|w| / 127 ("max"), or ("mse") the clipped scale
c * max|w| / 127, c searched over CLIP_GRID per row, that minimises the row's
rounding error sum_j d_j (w_j - q_j s)^2, with d_j the energy of input j
(diag X^T X) when calibration gave it (else 1): a smaller scale rounds most
weights finer at the price of clipping the few largest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.compiler.llm.step_clock import STEPS
from rkc.ir.errors import UnsupportedError

QMAX = 127
METHODS = ("gptq", "rtn")  # how one matrix is rounded (quantize_matrix)


@dataclass(frozen=True)
class Rounding:
    """An int8 rounding scheme: GPTQ on the output head or not, and on the
    other products whose weight name contains one of `body` ("" names them
    all); every other product is rounded to nearest."""

    head: bool
    body: tuple[str, ...]
    summary: str  # for the compile summary and rkc inspect


# the schemes `rkc compile --int8-rounding` offers. GPTQ's cost is its
# calibration X^T X (K^2 per token and input) and its rounding: the head (262k
# rows, a quarter of Gemma 3 270M's int8 error) and the products reading the
# hidden width (q/k/v, gate/up: K = n_embd) are cheap to gather, attn_output's
# and ffn_down's wider inputs (K = 1024, 2048 on Gemma 3 270M) most of the time
HIDDEN_INPUT_KINDS = ("attn_q.", "attn_k.", "attn_v.", "ffn_gate.", "ffn_up.")
ROUNDINGS = {
    "rtn": Rounding(False, (), "every weight rounded to nearest"),
    "head-gptq": Rounding(True, (), "the output head GPTQ-rounded, the other products to nearest"),
    "hidden-gptq": Rounding(True, HIDDEN_INPUT_KINDS,
                            "the head, q/k/v and gate/up GPTQ-rounded, attn_output and ffn_down to nearest"),
    "gptq": Rounding(True, ("",), "every product GPTQ-rounded"),
}


def rounding_scheme(name: str) -> Rounding:
    if name not in ROUNDINGS:
        raise UnsupportedError(f"int8 weight rounding {name!r} is not known (choose {', '.join(ROUNDINGS)})")
    return ROUNDINGS[name]


def method_for(rounding: str, name: str, is_head: bool) -> str:
    """How scheme `rounding` rounds product `name` (quantize_matrix's method)."""
    scheme = rounding_scheme(rounding)
    return "gptq" if (scheme.head if is_head else any(k in name for k in scheme.body)) else "rtn"


# `rkc compile --precision int8` defaults (docs/llm.md): the inputs rotated
# (compiler/llm/rotate.py), round-to-nearest, every product int8. Measured on
# Gemma 3 270M against llama.cpp (issue 14): gptq KL 0.0064, top-1 94.6 %, but
# greedy 3 of 5 prompts (the slow test needs 4) and ~90 CPU s of compile;
# hidden-gptq with SmoothQuant 0.7 KL 0.00649 within 30 CPU s, but greedy 2 of
# 5; and GPTQ on the head (head-gptq and up) takes the synthetic gemma4 int8
# build below its top-1 bound against llama.cpp (0.955 < 0.97, tests/llm/test_gemma4.py)
DEFAULT_ROUNDING = "rtn"
# `--precision int4` (W4A8): GPTQ (damped as int4.GPTQ_DAMP says). Gemma 3 270M
# against llama.cpp on english.txt, the whole text: RTN KL 0.296, GPTQ damped 1 %
# 0.157 (docs/notes/2026-12-06-int4-host-quality.md), damped 50 % 0.125 against
# llama.cpp's Q4_0 requantization's 0.309 (docs/notes/2026-12-06-int4-quality-7b.md).
# No cost at run time (the same bytes and tasks); a compile not told how to round
# narrows it to what its budget allows (compiler/llm/budget.py).
DEFAULT_INT4_ROUNDING = "gptq"


def default_rounding(precision: str) -> str:
    """The weight rounding a precision's build uses unless told (int8: RTN, int4: GPTQ)."""
    return DEFAULT_INT4_ROUNDING if precision == "int4" else DEFAULT_ROUNDING
DEFAULT_FP16_SHARE = 0.0  # of the product groups (0.25 was the unrotated default: 18 of Gemma 3 270M's 72)
DEFAULT_ALPHA_SEARCH = False
SCALES = ("max", "mse")
# which int8 products quantize their input in two int8 rows, the value and its
# int8 residual (runtime/llm/weights.quantize_rows terms=2: ~15-bit activations,
# every product int8, one read of the weights for both rows; docs/llm.md)
RESIDUAL_CHOICES = ("none", "head", "all")
DEFAULT_RESIDUAL = "none"
CLIP_GRID = np.linspace(0.60, 1.0, 21)
GPTQ_DAMP = 0.01  # of the mean diagonal of H (the paper's default)
_COLUMN_BLOCK = 64  # columns rounded before the rest is updated with one matrix product
QUANTIZE_ROWS = 8192  # rows per pass (bounds the working set of the 262k-row output head)


def row_scales(w: np.ndarray) -> np.ndarray:
    amax = np.abs(w).max(axis=1)
    return np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)


def mse_row_scales(w: np.ndarray, energy: np.ndarray | None = None) -> np.ndarray:
    """Per row, the clipped scale of CLIP_GRID with the least (energy-weighted) rounding error."""
    full = row_scales(w)
    d = np.ones(w.shape[1], np.float32) if energy is None else np.asarray(energy, np.float32)
    d = d / max(float(d.mean()), 1e-30)
    best = full.copy()
    for r0 in range(0, w.shape[0], QUANTIZE_ROWS):
        rows = slice(r0, min(w.shape[0], r0 + QUANTIZE_ROWS))
        wr, sr = w[rows], full[rows]
        best_err = np.full(wr.shape[0], np.inf, np.float32)
        for c in CLIP_GRID[::-1]:  # from 1.0 down: ties keep the unclipped scale
            s = (sr * np.float32(c))[:, None]
            e = wr - np.clip(np.rint(wr / s), -QMAX, QMAX) * s
            err = (e * e) @ d
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best[rows] = np.where(better, s[:, 0], best[rows])
    return best


def round_to_nearest(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """In row blocks: a 262k-row head would otherwise hold three fp32 temporaries of its size."""
    q = np.empty(w.shape, np.int8)
    for r0 in range(0, w.shape[0], QUANTIZE_ROWS):
        rows = slice(r0, r0 + QUANTIZE_ROWS)
        q[rows] = np.clip(np.rint(w[rows] / scale[rows, None]), -QMAX, QMAX)
    return q


def quantize_matrix(w: np.ndarray, method: str = "rtn", hessian: np.ndarray | None = None,
                    scales: str = "max") -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [N, K], scale fp32 [N]) for a float matrix [N, K]."""
    if method not in METHODS:
        raise UnsupportedError(f"int8 weight rounding {method!r} is not known (choose {' or '.join(METHODS)})")
    if scales not in SCALES:
        raise UnsupportedError(f"int8 weight scales {scales!r} are not known (choose {' or '.join(SCALES)})")
    w = np.asarray(w, np.float32)
    if scales == "mse":
        scale = mse_row_scales(w, np.diag(hessian) if hessian is not None else None)
    else:
        scale = row_scales(w)
    if method == "rtn" or hessian is None:
        return round_to_nearest(w, scale), scale
    return gptq(w, hessian, scale), scale


def _gptq_factor(h: np.ndarray, damp: float) -> np.ndarray:
    """G with G[i, j] = V[i, j] / V[j, j] for the upper factor V of H = V V^T
    (H damped on the diagonal): V = P chol(P H P) P, P the reversal. With
    H^-1 = U^T U (GPTQ's factor) V = U^-1, so GPTQ's column updates through U
    are the nearest-plane recurrence through V (below): no inverse is formed."""
    h = h + np.eye(len(h)) * damp * np.mean(np.diag(h))
    v = np.linalg.cholesky(np.ascontiguousarray(h[::-1, ::-1]))[::-1, ::-1]
    return (v / np.diag(v)[None, :]).astype(np.float32)


# the last few factors by Hessian (kept alive, so an id stays unique): the
# products reading one input share one X^T X, and a head is rounded in row blocks
_FACTORS: dict[int, tuple[np.ndarray, float, np.ndarray, np.ndarray, np.ndarray]] = {}


def _factor_for(hessian: np.ndarray, damp: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, dead inputs, G) of a Hessian, computed once per Hessian and damping."""
    hit = _FACTORS.get(id(hessian))
    if hit is not None and hit[0] is hessian and hit[1] == damp:
        return hit[2], hit[3], hit[4]
    h = np.array(hessian, np.float64)
    dead = np.diag(h) <= 0  # inputs never seen: their weights cannot matter
    h[dead, dead] = 1.0
    order = np.argsort(-np.diag(h), kind="stable")  # "act order": loud inputs first
    g = _gptq_factor(h[np.ix_(order, order)], damp)
    if len(_FACTORS) >= 4:
        _FACTORS.pop(next(iter(_FACTORS)))
    _FACTORS[id(hessian)] = (hessian, damp, order, dead, g)
    return order, dead, g


def gptq(w: np.ndarray, hessian: np.ndarray, scale: np.ndarray, damp: float = GPTQ_DAMP,
         levels: tuple[int, int] = (-QMAX, QMAX)) -> np.ndarray:
    """GPTQ rounding of w [N, K] to int8 with the given per-row scales, as the
    nearest-plane recurrence it equals: column j (in act order) is rounded
    from w_j + sum_{i<j} G[i, j] d_i, d_i = w_i - q_i s the rounding errors of
    the columns before it. The work runs transposed ([K, rows]: a column is
    one contiguous row, each step a vector operation over all rows); a block
    of columns takes the earlier blocks' errors in one matrix product.
    `scale` is per row [N] or per weight [N, K] (int4's groups along K);
    `levels` the integer range (int4: -8, 7)."""
    with STEPS.step("gptq factor"):
        order, dead, g = _factor_for(hessian, damp)
    with STEPS.step("gptq"):
        return _gptq_rows(w, scale, levels, order, dead, g)


def _gptq_rows(w: np.ndarray, scale: np.ndarray, levels: tuple[int, int], order: np.ndarray, dead: np.ndarray,
               g: np.ndarray) -> np.ndarray:
    n, k = w.shape
    q = np.empty((n, k), np.int8)
    for r0 in range(0, n, QUANTIZE_ROWS):
        r1 = min(n, r0 + QUANTIZE_ROWS)
        orig = np.ascontiguousarray(w[r0:r1][:, order].T)  # [K, rows]
        orig[dead[order]] = 0.0
        per_weight = scale.ndim == 2
        s = np.ascontiguousarray(scale[r0:r1][:, order].T) if per_weight else scale[r0:r1]
        qt = np.empty(orig.shape, np.int8)
        d = np.empty(orig.shape, np.float32)
        for c0 in range(0, k, _COLUMN_BLOCK):
            c1 = min(k, c0 + _COLUMN_BLOCK)
            target = orig[c0:c1] + g[:c0, c0:c1].T @ d[:c0] if c0 else orig[c0:c1].copy()
            for c in range(c0, c1):
                col = target[c - c0] + g[c0:c, c] @ d[c0:c] if c > c0 else target[0]
                sc = s[c] if per_weight else s
                qc = np.clip(np.rint(col / sc), *levels)
                qt[c] = qc
                d[c] = orig[c] - qc * sc
        q[r0:r1, order] = qt.T
    return q
