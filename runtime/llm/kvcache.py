"""The KV cache: per layer, keys and values of every position seen so far,
rounded to fp16 (as llama.cpp keeps them by default). Sliding-window layers
keep only the last `window` positions; others grow up to the context length,
doubling their storage as needed, or at once to what a prompt will store
(`expect`). `reset` forgets the entries but keeps the buffers, so the next
request reuses the capacity the last one grew; `release` gives it back.

The rounded values are held as fp32, in one buffer per layer, so that
attention reads the cache in place (`store_and_view`): no per-token copy or
conversion of the whole cache. The same values are also held as fp16
(`store_half`), for decode attention: a one-row query reads every cached
entry once, and at long positions reading the cache from DRAM is most of
its time; the fp16 rows are half the bytes, widened exactly in registers
as the kernel reads them (runtime/llm/decode_attention.py), so it sees the
fp32 values the fp32 rows hold. A decode step (`store_half`) writes
only the fp16 rows: nothing in decode reads the fp32 ones, and writing a
cold fp32 row into each layer cost more than the rest of the store (~1 ms
of a Gemma 3 270M token at position 512). The fp32 rows behind are widened
from the fp16 ones (numpy's cast, the values `store_and_view` wrote) when
something next reads them (`_sync`: a prefill chunk, `context`, `shared`,
`k`/`v`). A window layer's buffers slide:
entries no query can see any more are dropped by moving the live ones to
the front when the buffer is full. The last ROLLBACK positions before a
window layer's live ones are held too (moved with them; attention never
reads them): `truncate` may then go back to any of them, so a chat's next
turn that leaves the cached tokens up to ROLLBACK positions before their end
(a reply cut by a stop string, or one that reads back as other tokens)
still reuses the prefix, where a window layer holding its window alone
could go back one position."""

from __future__ import annotations

import numpy as np

from rkc.ir.errors import RkcError
from rkc.runtime.llm.prefill_channels import store_rows

_CHANNEL_MAJOR_ROWS = 16  # a chunk this long may come tokens innermost (runtime/llm/prefill_channels.py)
# positions a window layer holds before its live ones, for truncate (a chat turn's reply that the
# next prompt does not repeat token for token); 64 rows of each window layer (~3 MB on Gemma 3 270M)
ROLLBACK = 64


class ContextFullError(RkcError):
    pass


class KVCache:
    def __init__(self, n_layer: int, windows: list[int], n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.windows = windows
        self.release()

    def release(self) -> None:
        """Forget every entry and drop the buffers: their memory goes back
        (nbytes 0); the next store allocates again."""
        n = len(self.windows)
        self._k: list[np.ndarray | None] = [None] * n  # [capacity, kv heads, head dim] fp32 (fp16 values)
        self._v: list[np.ndarray | None] = [None] * n
        self._k16: list[np.ndarray | None] = [None] * n  # the same values as fp16
        self._v16: list[np.ndarray | None] = [None] * n
        self._bits: list[tuple | None] = [None] * n  # the fp16 buffers' uint16 views (the compiled kernels' form)
        self._pos: list[np.ndarray] = [np.zeros(0, np.int64)] * n
        self.reset()

    def reset(self) -> None:
        """Forget every entry, keeping the buffers: the next request stores
        into the capacity the last one grew, with no allocation, page faults
        or growing copies (~11 ms of Gemma 3 270M's 200-token prompt when
        every request started from nothing). The buffers stay memory in use
        (nbytes counts them) until `release`. Rows past the live ones hold
        stale values, as after a slide or a truncation: nothing reads them."""
        n = len(self.windows)
        self._start = [0] * n  # live entries: [start, end)
        self._end = [0] * n
        self._held = [0] * n  # rows [held, end) hold consecutive positions (a window layer's before start: ROLLBACK's)
        self._synced = [0] * n  # rows [.., synced) of the fp32 buffers hold their values; [synced, end) fp16 only
        self._views: list[tuple | None] = [None] * n  # what the layer's last store returned
        # its rows [lo, hi) of the buffers (hi -1: set by share); two int lists, no tuple a store
        self._span_lo, self._span_hi = [0] * n, [-1] * n
        self._expected = 0

    def expect(self, entries: int) -> None:
        """The stores that follow bring each layer to `entries` positions (a
        prompt's prefill): a buffer too small for them grows to them now,
        once (no copy when the cache was reset), and one made later takes
        their room at once, so no chunk of the prompt re-grows a buffer."""
        self._expected = entries
        for layer, store in enumerate(self._k):
            if store is not None:
                kept = self._end[layer] - self._kept(layer)
                cap = self._limit(layer, max(kept, entries), kept, 0)
                if cap > len(store):
                    self._grow(layer, store.shape[1:], self._v[layer].shape[1:], cap)

    # -- what a layer holds -------------------------------------------------------------
    def live(self, layer: int) -> int:
        """Entries the layer holds (a window layer: at most its window)."""
        return self._end[layer] - self._start[layer]

    @property
    def nbytes(self) -> int:
        """Host memory the cache's buffers take (their capacity)."""
        return sum(a.nbytes for store in (self._k, self._v, self._k16, self._v16, self._pos) for a in store if a is not None)

    @property
    def length(self) -> int:
        """Positions 0..length-1 have been through the model (they are contiguous)."""
        s, e = self._start[0], self._end[0]
        return int(self._pos[0][e - 1]) + 1 if e > s else 0

    def truncate(self, n: int) -> bool:
        """Forget positions >= n, keeping 0..n-1 for a prompt that shares them
        (the prefix-reuse hook). A window layer goes back to the rows it holds
        before its live ones (ROLLBACK). False, and nothing changed, when a
        sliding-window layer no longer holds a key a query at position n sees."""
        if n > self.length:
            return False
        for layer, window in enumerate(self.windows):
            pos = self._pos[layer][self._held[layer]:self._end[layer]]
            if window and n > 0 and (pos.size == 0 or pos[0] > max(0, n - window + 1)):
                return False
        for layer, window in enumerate(self.windows):
            h, e = self._held[layer], self._end[layer]
            # held positions ascend, so those below n are a prefix of them
            end = h + int(np.count_nonzero(self._pos[layer][h:e] < n))
            self._end[layer] = end
            self._start[layer] = max(h, end - window) if window else self._start[layer]
            self._synced[layer] = min(self._synced[layer], end)
        return True

    @property
    def k(self) -> list[np.ndarray | None]:
        self._sync_all()
        return [None if k is None else k[s:e] for k, s, e in zip(self._k, self._start, self._end)]

    @property
    def v(self) -> list[np.ndarray | None]:
        self._sync_all()
        return [None if v is None else v[s:e] for v, s, e in zip(self._v, self._start, self._end)]

    @property
    def pos(self) -> list[np.ndarray]:
        return [p[s:e] for p, s, e in zip(self._pos, self._start, self._end)]

    def _check(self, pos: np.ndarray) -> None:
        # (one position: its value, not a reduction, ~5 us of a decode step's store)
        if pos.size and (int(pos[0]) if pos.size == 1 else pos.max()) >= self.n_ctx:
            raise ContextFullError(f"context of {self.n_ctx} tokens is full (use --ctx to raise it)")

    # -- attention's view -----------------------------------------------------------------
    def context(self, layer: int, k: np.ndarray, v: np.ndarray, pos: np.ndarray):
        """Keys, values (fp32) and positions a chunk attends to: the cached ones
        followed by the chunk's own (new arrays; the cache is unchanged)."""
        self._check(pos)
        self._sync(layer)
        s, e = self._start[layer], self._end[layer]
        # C order whatever k and v's layout (an NPU output is column-major): numpy's
        # contractions round according to the operands' strides, and the CPU
        # emulation's arrays are row-major
        k16, v16 = k.astype(np.float16).astype(np.float32, order="C"), v.astype(np.float16).astype(np.float32, order="C")
        if e == s:
            return k16, v16, pos.astype(np.int64)
        return (np.concatenate([self._k[layer][s:e], k16]), np.concatenate([self._v[layer][s:e], v16]),
                np.concatenate([self._pos[layer][s:e], pos.astype(np.int64)]))

    def append(self, layer: int, k: np.ndarray, v: np.ndarray, pos: np.ndarray) -> None:
        self.store_and_view(layer, k, v, pos)

    def store_and_view(self, layer: int, k: np.ndarray, v: np.ndarray, pos: np.ndarray):
        """Append the chunk, then return what `context` returns (the entries
        cached before it, then its own) as views of the cache, valid until the
        next store into this layer. Into an empty layer: the chunk's own
        values in C order (as `context` gives them; numpy's contractions
        round according to the operands' strides)."""
        self._store(layer, k, v, pos)
        return self._views[layer]

    def store_half(self, layer: int, k: np.ndarray, v: np.ndarray, pos: np.ndarray):
        """store_and_view, the keys and values as views of the fp16 buffers
        (the same entries, C-contiguous rows of the same shape)."""
        s, e = self._store(layer, k, v, pos, fp32=False)
        return self._k16[layer][s:e], self._v16[layer][s:e], self._pos[layer][s:e]

    def half_row(self, layer: int, pos: np.ndarray, k_shape: tuple, v_shape: tuple) -> tuple[int, int]:
        """store_half of one row [1, *k_shape] / [1, *v_shape] at `pos` [1]
        but for writing it: (s, e), the rows its query sees [s, e) of
        half_buffers(layer), the caller writing the row's fp16 values into
        row e - 1 (a fused attention stretch writes them in its compiled call)."""
        return self._append(layer, k_shape, v_shape, pos)

    def half_buffers(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The layer's fp16 keys, values (whole buffers) and positions."""
        return self._k16[layer], self._v16[layer], self._pos[layer]

    def half_bits(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """half_buffers with the keys and values as their fp16 bits (uint16
        views made once per buffer: a decode step's compiled call takes them
        with no view made per layer)."""
        k, v = self._bits[layer]
        return k, v, self._pos[layer]

    def _store(self, layer: int, k: np.ndarray, v: np.ndarray, pos: np.ndarray, fp32: bool = True) -> tuple[int, int]:
        """Append the chunk (`fp32`: into the fp32 rows too, after the rows
        behind it are synced); the rows its queries see: [s, e) of the buffers."""
        s, e = self._append(layer, k.shape[1:], v.shape[1:], pos)
        t = len(pos)
        k16, v16 = self._k16[layer][e - t:e], self._v16[layer][e - t:e]
        if not fp32:
            k16[...], v16[...] = k, v  # numpy's fp32 -> fp16 cast (astype's), into the rows
            return s, e
        self._sync(layer, e - t)
        k32, v32 = self._k[layer][e - t:e], self._v[layer][e - t:e]
        for x, rows16, rows32 in ((k, k16, k32), (v, v16, v32)):
            # a prefill chunk read in the NPU's layout (tokens innermost): one compiled pass,
            # numpy's rounding, vector conversions (numpy's fp16 casts do not vectorise: ~3.5 ns a value for both)
            if t < _CHANNEL_MAJOR_ROWS or not store_rows(x, rows16, rows32):
                rows16[...] = x
                rows32[...] = rows16
        self._synced[layer] = e
        return s, e

    def _append(self, layer: int, k_shape: tuple, v_shape: tuple, pos: np.ndarray) -> tuple[int, int]:
        """Room for the chunk's rows and the bookkeeping of storing them
        (positions, the window, the view); the rows its queries see: [s, e)
        of the buffers, the chunk's own the last len(pos)."""
        self._check(pos)
        t = len(pos)
        self._reserve(layer, k_shape, v_shape, t)
        s, e = self._start[layer], self._end[layer]
        self._pos[layer][e:e + t] = pos
        self._end[layer] = e + t
        window = self.windows[layer]
        if window and e + t - s > window:  # what no later query can see
            self._start[layer] = e + t - window
        # into an empty layer, the chunk alone: the buffer's rows are the chunk's values
        # rounded to fp16, C-contiguous, as `context` gives them (no second conversion)
        self._views[layer] = self._k[layer][s:e + t], self._v[layer][s:e + t], self._pos[layer][s:e + t]
        self._span_lo[layer], self._span_hi[layer] = s, e + t
        return s, e + t

    def shared(self, layer: int):
        """What `layer`'s last store returned (keys, values, positions: the
        entries before its last chunk and the chunk's own), for a later layer
        of the same step that attends over this layer's cache (KV sharing);
        a window layer may since have dropped entries its chunk's first
        queries still see, so the view, not the live entries, is what they read."""
        view = self._views[layer]
        if view is None:
            raise RkcError(f"layer {layer}'s KV cache is read before the layer stored a chunk")
        self._sync(layer)
        return view

    def shared_half(self, layer: int):
        """What `shared` returns, the keys and values as views of the fp16
        buffers (the same entries, nothing synced: a decode step's shared
        layers read the rows their source's store_half wrote); None when
        `share` set the view."""
        s, e = self._span_lo[layer], self._span_hi[layer]
        if e < 0:
            return self.shared(layer) if self._views[layer] is None else None  # (never stored: shared's error)
        return self._k16[layer][s:e], self._v16[layer][s:e], self._pos[layer][s:e]

    def _sync(self, layer: int, e: int | None = None) -> None:
        """The fp32 rows behind the fp16 rows only `store_half` wrote (up to
        row e, else all), widened from them (numpy's cast: the values a fp32
        store writes)."""
        a, e = self._synced[layer], self._end[layer] if e is None else e
        if a < e:
            self._k[layer][a:e], self._v[layer][a:e] = self._k16[layer][a:e], self._v16[layer][a:e]
            self._synced[layer] = e

    def _sync_all(self) -> None:
        for layer in range(len(self.windows)):
            self._sync(layer)

    def share(self, layer: int, view: tuple) -> None:
        """Make `view` what shared(layer) returns: a run that takes the model
        one layer at a time (compile-time calibration) gives a later layer the
        view `layer`'s store left at the same chunk."""
        self._views[layer] = view
        self._span_hi[layer] = -1

    def _reserve(self, layer: int, k_shape: tuple, v_shape: tuple, t: int) -> None:
        """Room for t more entries after the live ones."""
        store = self._k[layer]
        s, e = self._start[layer], self._end[layer]
        if store is not None and e + t <= len(store):
            return
        first = self._kept(layer)
        if store is not None and e - first + t <= len(store):  # slide the kept entries to the front
            for buf in (store, self._v[layer], self._k16[layer], self._v16[layer], self._pos[layer]):
                buf[:e - first] = buf[first:e].copy()
            self._held[layer], self._start[layer], self._end[layer] = 0, s - first, e - first
            self._synced[layer] = max(0, self._synced[layer] - first)  # the rows moved with their state
            return
        # twice the last buffer (amortised growth), or what the prompt is expected to store
        store = self._k[layer]
        kept = e - first
        cap = max(kept + t, 0 if store is None else 2 * len(store), 64, self._expected)
        self._grow(layer, k_shape, v_shape, self._limit(layer, cap, kept, t))

    def _kept(self, layer: int) -> int:
        """The first row a slide or growth keeps: the live ones and up to
        ROLLBACK held before them."""
        return max(self._held[layer], self._start[layer] - ROLLBACK)

    def _limit(self, layer: int, cap: int, kept: int, t: int) -> int:
        """`cap` rows, at most what the layer can use for `kept` + t entries
        (a window layer: the window, ROLLBACK and room to slide; the context)."""
        window = self.windows[layer]
        if window:
            cap = min(cap, 2 * window + ROLLBACK + t)
        return max(min(cap, self.n_ctx), kept + t)  # (kept + t <= n_ctx: distinct positions below it)

    def _grow(self, layer: int, k_shape: tuple, v_shape: tuple, cap: int) -> None:
        """New buffers of `cap` rows for the layer, its kept entries moved to their front."""
        store, s, e = self._k[layer], self._start[layer], self._end[layer]
        first = self._kept(layer) if store is not None else s
        ks = np.zeros((cap, *k_shape), np.float32)
        vs = np.zeros((cap, *v_shape), np.float32)
        ks16, vs16 = np.zeros(ks.shape, np.float16), np.zeros(vs.shape, np.float16)
        ps = np.zeros(cap, np.int64)
        kept = e - first
        if store is not None and kept:
            ks[:kept], vs[:kept], ps[:kept] = store[first:e], self._v[layer][first:e], self._pos[layer][first:e]
            ks16[:kept], vs16[:kept] = self._k16[layer][first:e], self._v16[layer][first:e]
        self._k[layer], self._v[layer], self._pos[layer] = ks, vs, ps
        self._k16[layer], self._v16[layer] = ks16, vs16
        self._bits[layer] = ks16.view(np.uint16), vs16.view(np.uint16)
        self._synced[layer] = max(0, self._synced[layer] - first) if store is not None else 0
        self._held[layer], self._start[layer], self._end[layer] = 0, s - first, e - first
