"""compiler/llm/quantize.gptq (the nearest-plane recurrence, transposed and
blocked) against the textbook GPTQ algorithm (Frantar et al., arXiv:2210.17323,
Algorithm 1: columns in act order, each rounding error spread over the later
columns through the upper Cholesky factor of H^-1), written out here in float64
one column at a time; and GPTQ's purpose: a smaller output error on the
calibration inputs than rounding to nearest."""

import numpy as np
import pytest

from rkc.compiler.llm.quantize import GPTQ_DAMP, QMAX, gptq, round_to_nearest, row_scales


def textbook_gptq(w: np.ndarray, h: np.ndarray, scale: np.ndarray, damp: float) -> np.ndarray:
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    order = np.argsort(-np.diag(h), kind="stable")
    w, h = w[:, order], h[np.ix_(order, order)]
    h += np.eye(len(h)) * damp * np.mean(np.diag(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # H^-1 = U^T U, U upper
    q = np.empty(w.shape, np.int8)
    for c in range(w.shape[1]):
        qc = np.clip(np.rint(w[:, c] / scale), -QMAX, QMAX)
        q[:, c] = qc
        err = (w[:, c] - qc * scale) / u[c, c]
        w[:, c + 1:] -= np.outer(err, u[c, c + 1:])
    out = np.empty_like(q)
    out[:, order] = q
    return out


def _case(n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((3 * k // 2, k))
    x[:, 3] *= 25  # a loud input channel (act order takes it first)
    x[:, 5] = 0.9 * x[:, 4] + 0.1 * x[:, 5]  # correlated inputs: where GPTQ's compensation pays
    x[:, 7] = 0.0  # an input never seen
    return w, x


@pytest.mark.parametrize("n, k", [(48, 64), (40, 200), (300, 130)])  # K below, across and past a column block
def test_gptq_is_the_textbook_algorithm(n, k):
    w, x = _case(n, k, seed=n + k)
    h = x.T @ x
    scale = row_scales(w)
    got, want = gptq(w, h, scale), textbook_gptq(w, h, scale, GPTQ_DAMP)
    # the same choices up to float32 rounding at a few half-step ties
    assert np.mean(got != want) < 2e-3
    assert np.max(np.abs(got.astype(int) - want)) <= 1

    def output_error(q):
        return float(np.sum((x @ (w - q * scale[:, None]).T) ** 2))

    assert output_error(got) == pytest.approx(output_error(want), rel=1e-3)
    assert output_error(got) < 0.7 * output_error(round_to_nearest(w, scale))
