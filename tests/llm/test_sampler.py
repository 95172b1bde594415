"""The sampler's top-k selection (generate.top_order) is the stable sort's
prefix it replaces, so a seeded draw picks the same token: ties (broken by
index), signed zeros, infinities, NaNs, k of 1, within and past the vocabulary,
float32 rows as the engine gives them and float64 ones."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.llm.generate import Sampler, top_order


def _rows(rng):
    n = 5000
    yield rng.standard_normal(n)
    yield np.round(rng.standard_normal(n) * 2) / 2  # many ties, at the k-th value too
    tied = np.zeros(n)
    tied[[7, 3000, 11]] = [1.0, 1.0, -0.0]
    yield tied  # all but two equal: the k-th value's ties fill the selection
    special = rng.standard_normal(n)
    special[[1, 50, 400]] = [np.inf, -np.inf, np.inf]
    yield special
    with_nan = rng.standard_normal(n)
    with_nan[[9, 99]] = np.nan
    yield with_nan
    late_nan = rng.standard_normal(n)
    late_nan[n - 1] = np.nan  # past every block the heap screens whole
    yield late_nan
    yield np.arange(n, dtype=np.float64)  # ascending: every value enters the heap
    yield -np.arange(n, dtype=np.float64)  # descending: none after the first k


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 2, 40, 63, 64, 65, 4999, 5000, 6000, 0])
def test_top_order_is_the_stable_sorts_prefix(k, dtype):
    rng = np.random.default_rng(k)
    for logits in _rows(rng):
        logits = logits.astype(dtype)  # (the engine's logits are float32)
        want = np.argsort(-logits, kind="stable")
        want = want if k <= 0 else want[:k]
        np.testing.assert_array_equal(top_order(logits, k), want)


def test_seeded_draws_are_unchanged():
    """The draws of the sampler against the same sampler over the full sort."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(262144) * 3).astype(np.float32)
    logits[::1000] = logits.max()  # ties at the top
    for temperature, k, p in ((0.8, 40, 0.95), (1.0, 1, 1.0), (0.5, 200, 0.5)):
        got = Sampler(temperature, k, p, seed=3)
        want = Sampler(temperature, k, p, seed=3)
        for _ in range(5):
            x = np.asarray(logits, np.float64)
            order = np.argsort(-x, kind="stable")[:k]
            z = x[order] / temperature
            q = np.exp(z - z.max())
            q /= q.sum()
            if p < 1.0:
                keep = int(np.searchsorted(np.cumsum(q), p) + 1)
                order, q = order[:keep], q[:keep] / q[:keep].sum()
            assert got(logits) == int(order[want.rng.choice(len(order), p=q)])


def test_greedy_is_the_argmax_of_the_float64_logits():
    """A greedy token: the first maximum, as numpy's argmax of the widened row
    (float32 widens exactly; a NaN is the maximum numpy's argmax finds)."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        logits = (rng.standard_normal((1, 262144)) * 3).astype(np.float32)
        logits[0, rng.integers(0, 262144, 3)] = logits.max()  # tied maxima: the first wins
        if rng.random() < 0.3:
            logits[0, rng.integers(0, 262144)] = np.nan
        assert Sampler(0.0)(logits) == int(np.argmax(logits.astype(np.float64)))
