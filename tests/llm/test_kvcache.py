"""The KV cache against a plain record of every (position, key, value) seen."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.llm.kvcache import ContextFullError, KVCache


@pytest.mark.parametrize("window", [0, 5])
def test_views_are_what_context_gives_then_the_window(window):
    rng = np.random.default_rng(1)
    cache, plain = KVCache(1, [window], 200), KVCache(1, [window], 200)
    seen_k, seen_p, pos = [], [], 0
    for t in [3, 1, 1, 4, 1, 1, 1, 7, 1, 1, 2, 1, 1, 1, 1, 1, 1, 30, 1, 1]:
        k = rng.standard_normal((t, 2, 4)).astype(np.float32)
        v = rng.standard_normal((t, 2, 4)).astype(np.float32)
        p = np.arange(pos, pos + t)
        want = plain.context(0, k, v, p)
        plain.append(0, k, v, p)
        got = cache.store_and_view(0, k, v, p)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        seen_k += list(k.astype(np.float16).astype(np.float32))
        seen_p += list(p)
        pos += t
        keep = window if window else len(seen_p)
        np.testing.assert_array_equal(cache.pos[0], seen_p[-keep:])
        np.testing.assert_array_equal(cache.k[0], np.asarray(seen_k[-keep:]))
    with pytest.raises(ContextFullError):
        cache.store_and_view(0, k[:1], v[:1], np.asarray([200]))
