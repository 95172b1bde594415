"""The KV cache: per layer, keys and values of every position seen so far,
stored in fp16 (as llama.cpp does by default). Sliding-window layers keep only
the last `window` positions (a ring buffer); others grow up to the context
length, doubling their storage as needed."""

from __future__ import annotations

import numpy as np

from rkc.ir.errors import RkcError


class ContextFullError(RkcError):
    pass


class KVCache:
    def __init__(self, n_layer: int, windows: list[int], n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.windows = windows
        self.k: list[np.ndarray | None] = [None] * n_layer
        self.v: list[np.ndarray | None] = [None] * n_layer
        self.pos: list[np.ndarray] = [np.zeros(0, np.int64) for _ in range(n_layer)]

    def reset(self) -> None:
        n = len(self.k)
        self.k, self.v = [None] * n, [None] * n
        self.pos = [np.zeros(0, np.int64) for _ in range(n)]

    @property
    def length(self) -> int:
        """Positions 0..length-1 have been through the model (they are contiguous)."""
        return int(self.pos[0][-1]) + 1 if self.pos[0].size else 0

    def truncate(self, n: int) -> bool:
        """Forget positions >= n, keeping 0..n-1 for a prompt that shares them
        (the prefix-reuse hook). False, and nothing changed, when a sliding-window
        layer's ring has already dropped a key a query at position n still sees."""
        if n > self.length:
            return False
        for pos, window in zip(self.pos, self.windows):
            if window and n > 0 and (pos.size == 0 or pos[0] > max(0, n - window + 1)):
                return False
        self.pos = [pos[pos < n] for pos in self.pos]  # storage rows past the kept ones are dead
        return True

    def context(self, layer: int, k: np.ndarray, v: np.ndarray, pos: np.ndarray):
        """Keys, values (fp32) and positions a chunk attends to: the cached ones
        followed by the chunk's own."""
        if pos.size and pos.max() >= self.n_ctx:
            raise ContextFullError(f"context of {self.n_ctx} tokens is full (use --ctx to raise it)")
        n = self.pos[layer].size
        k16, v16 = k.astype(np.float16), v.astype(np.float16)
        if n == 0:
            return k16.astype(np.float32), v16.astype(np.float32), pos.astype(np.int64)
        keys = np.concatenate([self.k[layer][:n], k16]).astype(np.float32)
        values = np.concatenate([self.v[layer][:n], v16]).astype(np.float32)
        return keys, values, np.concatenate([self.pos[layer], pos.astype(np.int64)])

    def append(self, layer: int, k: np.ndarray, v: np.ndarray, pos: np.ndarray) -> None:
        n = self.pos[layer].size
        window = self.windows[layer]
        keep = n + len(pos)
        if window and keep > window:  # ring: drop what no later query can see
            drop = keep - window
            oldk = self.k[layer][:n] if n else k[:0].astype(np.float16)
            oldv = self.v[layer][:n] if n else v[:0].astype(np.float16)
            allk = np.concatenate([oldk, k.astype(np.float16)])[drop:]
            allv = np.concatenate([oldv, v.astype(np.float16)])[drop:]
            self.k[layer], self.v[layer] = allk, allv
            self.pos[layer] = np.concatenate([self.pos[layer], pos.astype(np.int64)])[drop:]
            return
        if self.k[layer] is None or self.k[layer].shape[0] < keep:
            cap = max(keep, 2 * (0 if self.k[layer] is None else self.k[layer].shape[0]), 64)
            for store in (self.k, self.v):
                src = k if store is self.k else v
                grown = np.zeros((cap, *src.shape[1:]), np.float16)
                if store[layer] is not None:
                    grown[:n] = store[layer][:n]
                store[layer] = grown
        self.k[layer][n:keep] = k
        self.v[layer][n:keep] = v
        self.pos[layer] = np.concatenate([self.pos[layer], pos.astype(np.int64)])
