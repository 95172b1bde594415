"""The KV cache against a plain record of every (position, key, value) seen."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.llm.kvcache import ROLLBACK, ContextFullError, KVCache


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



@pytest.mark.parametrize("window", [0, 5])
def test_half_rows_are_the_fp32_rows(window):
    """store_half returns the entries store_and_view would (as fp16: the
    same values, in the same order, C-contiguous) as the window slides and
    the buffers grow, whichever of the two stored the chunks before."""
    rng = np.random.default_rng(2)
    cache = KVCache(1, [window], 300)
    pos = 0
    for i, t in enumerate([3, 1, 1, 70, 1, 1, 2, 1, 1, 1, 130, 1, 1]):
        k, v = rng.standard_normal((2, t, 2, 4)).astype(np.float32)
        p = np.arange(pos, pos + t)
        if i % 2:
            k16, v16, kpos = cache.store_half(0, k, v, p)
            keys, values, seen = cache.shared(0)
            assert k16.dtype == v16.dtype == np.float16 and k16.flags.c_contiguous and v16.flags.c_contiguous
            for half, full in ((k16, keys), (v16, values)):
                np.testing.assert_array_equal(half.astype(np.float32), full)
            np.testing.assert_array_equal(kpos, seen)
        else:
            cache.store_and_view(0, k, v, p)
        pos += t


@pytest.mark.parametrize("window", [0, 5, 40])
def test_fp32_rows_behind_half_stores_are_what_fp32_stores_give(window):
    """store_half writes only the fp16 rows (the fp32 ones are synced when
    next read): whatever mix of decode steps (store_half), prefill chunks
    (store_and_view), truncations and fp32 reads (context, shared, k, v)
    follows, every fp32 value read equals what a cache that only ever
    stored through store_and_view gives, bit for bit, as the window slides
    and the buffers grow."""
    rng = np.random.default_rng(3 + window)
    cache, plain = KVCache(1, [window], 400), KVCache(1, [window], 400)
    pos, reads = 0, 0
    for i in range(160):
        t = int(rng.choice([1, 1, 1, 1, 2, 9, 33]))
        k, v = rng.standard_normal((2, t, 2, 4)).astype(np.float32)
        p = np.arange(pos, pos + t)
        if rng.random() < 0.1:
            k2, v2 = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
            for got, want in zip(cache.context(0, k2, v2, p[:1]), plain.context(0, k2, v2, p[:1])):
                np.testing.assert_array_equal(got, want)
            reads += 1
        want = plain.store_and_view(0, k, v, p)
        if t == 1 or rng.random() < 0.3:
            k16, v16, kpos = cache.store_half(0, k, v, p)
            np.testing.assert_array_equal(k16.astype(np.float32), want[0])
            np.testing.assert_array_equal(v16.astype(np.float32), want[1])
            np.testing.assert_array_equal(kpos, want[2])
            if rng.random() < 0.3:
                for got, w in zip(cache.shared(0), want):
                    np.testing.assert_array_equal(got, w)
                reads += 1
        else:
            for got, w in zip(cache.store_and_view(0, k, v, p), want):
                np.testing.assert_array_equal(got, w)
            reads += 1
        pos += t
        if rng.random() < 0.05 and pos > 10:
            np.testing.assert_array_equal(cache.k[0], plain.k[0])  # (every fp32 row synced, then forgotten)
            n = pos - int(rng.integers(1, 4))
            assert cache.truncate(n) == plain.truncate(n)
            pos = cache.length
        if rng.random() < 0.1:
            np.testing.assert_array_equal(cache.k[0], plain.k[0])
            np.testing.assert_array_equal(cache.v[0], plain.v[0])
            reads += 1
        if pos + 40 > 400:
            break
    assert reads > 10


def _buffers(cache: KVCache, layer: int) -> list[np.ndarray]:
    return [cache._k[layer], cache._v[layer], cache._k16[layer], cache._v16[layer], cache._pos[layer]]


@pytest.mark.parametrize("window", [0, 5, 40])
def test_a_reset_cache_stores_into_its_buffers_and_reads_what_a_fresh_one_does(window):
    """After reset, the next request stores into the buffers the last one grew
    (the same arrays: nothing allocated, nothing copied to grow) and every
    value read equals a fresh cache's, bit for bit, whatever stale rows the
    last request left behind (large values, from longer chunks)."""
    rng = np.random.default_rng(11 + window)
    cache = KVCache(2, [window, 0], 300)
    pos = 0
    for t in (128, 72, 1, 1, 1):
        k, v = (1e4 * rng.standard_normal((2, t, 2, 4))).astype(np.float32)
        for layer in (0, 1):
            cache.store_and_view(layer, k, v, np.arange(pos, pos + t))
        pos += t
    held, nbytes = [_buffers(cache, layer) for layer in (0, 1)], cache.nbytes
    cache.reset()
    assert cache.length == 0 and cache.nbytes == nbytes and cache.pos[0].size == 0
    fresh, pos = KVCache(2, [window, 0], 300), 0
    for i, t in enumerate((33, 9, 1, 1, 2, 1, 1, 64, 1, 1)):
        k, v = rng.standard_normal((2, t, 2, 4)).astype(np.float32)
        p = np.arange(pos, pos + t)
        for layer in (0, 1):
            if t == 1 and i % 2:
                got, want = cache.store_half(layer, k, v, p), fresh.store_half(layer, k, v, p)
            else:
                got, want = cache.store_and_view(layer, k, v, p), fresh.store_and_view(layer, k, v, p)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        pos += t
    for layer in (0, 1):
        assert all(a is b for a, b in zip(_buffers(cache, layer), held[layer]))
        np.testing.assert_array_equal(cache.k[layer], fresh.k[layer])
        np.testing.assert_array_equal(cache.v[layer], fresh.v[layer])
        np.testing.assert_array_equal(cache.pos[layer], fresh.pos[layer])
    cache.release()
    assert cache.nbytes == 0 and cache.length == 0
    cache.store_and_view(0, k, v, np.arange(t))  # (a released cache stores again from nothing)
    assert cache.length == t


@pytest.mark.parametrize("window", [0, 5, 300])
def test_expect_sizes_the_buffers_once_for_a_prompt(window):
    """After expect(n), a prompt's chunks never re-grow a buffer: the first
    chunk makes buffers with room for n (no more than the context, a window
    layer's slide room); a reset cache too small for the next prompt grows
    at expect, before it stores; a truncated one keeps its live entries."""
    rng = np.random.default_rng(5)
    n_ctx, chunk = 700, 128
    cache = KVCache(1, [window], n_ctx)

    def prompt(n: int, start: int = 0) -> None:
        made, pos = None, start
        while pos < n:
            t = min(chunk, n - pos)
            k, v = rng.standard_normal((2, t, 2, 4)).astype(np.float32)
            cache.store_and_view(0, k, v, np.arange(pos, pos + t))
            made = made or _buffers(cache, 0)
            assert all(a is b for a, b in zip(_buffers(cache, 0), made)), pos  # no growth within the prompt
            pos += t

    cache.expect(200)
    prompt(200)
    cap = len(cache._k[0])
    assert cap >= min(200, 2 * window + ROLLBACK + chunk if window else 200) and cap <= n_ctx
    cache.reset()
    cache.expect(650)
    grown = min(650, 2 * window + ROLLBACK if window else n_ctx, n_ctx)
    assert len(cache._k[0]) == max(cap, grown)  # (a window layer holding enough keeps its buffers)
    prompt(650)
    assert len(cache._k[0]) <= n_ctx
    keys = cache.k[0][:]
    if not window:
        assert cache.truncate(100)
        cache.expect(n_ctx)
        np.testing.assert_array_equal(cache.k[0], keys[:100])
        prompt(n_ctx, 100)
    assert max(len(b) for b in _buffers(cache, 0)) <= n_ctx


@pytest.mark.parametrize("window", [5, 40])
def test_a_window_layer_goes_back_up_to_rollback_positions(window):
    """truncate(n) holds for every n from the end back ROLLBACK positions
    past the window's reach, whatever mix of chunks and decode steps stored
    them and wherever the slides fell (a chat's next turn may leave the
    cached tokens a reply before their end), and not further back; after it
    the layer gives the views, keys and positions a cache that only ever
    stored positions 0..n-1 gives, bit for bit, through later stores too."""
    rng = np.random.default_rng(21 + window)
    went_back = 0
    for trial in range(16):
        chunks = [int(t) for t in rng.choice([1, 1, 1, 3, 16, 40], size=int(rng.integers(4, 30)))]
        k_all, v_all = rng.standard_normal((2, sum(chunks) + 60, 2, 4)).astype(np.float32)
        cache, pos = KVCache(1, [window], 2000), 0
        for t in chunks:
            p = np.arange(pos, pos + t)
            (cache.store_half if t == 1 else cache.store_and_view)(0, k_all[p], v_all[p], p)
            pos += t
        n = max(1, pos - int(rng.integers(0, ROLLBACK + 40)))
        if not cache.truncate(n):
            # (ROLLBACK held before the live ones, whose first a query at the end sees)
            assert pos - n > ROLLBACK + 1 and cache.length == pos
            continue
        assert cache.length == n
        fresh, q = KVCache(1, [window], 2000), 0
        for t in chunks:
            if q + t > n:
                break
            p = np.arange(q, q + t)
            fresh.store_and_view(0, k_all[p], v_all[p], p)
            q += t
        if q < n:
            p = np.arange(q, n)
            fresh.store_and_view(0, k_all[p], v_all[p], p)
        for t in (1, 7, 1):
            p = np.arange(n, n + t)
            got, want = cache.store_and_view(0, k_all[p], v_all[p], p), fresh.store_and_view(0, k_all[p], v_all[p], p)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
            n += t
        np.testing.assert_array_equal(cache.pos[0], fresh.pos[0])
        np.testing.assert_array_equal(cache.k[0], fresh.k[0])
        went_back += pos - n + 9 > window + 1  # (the 9 stored since) back past what the window alone reaches
    assert went_back >= 4
