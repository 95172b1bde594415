"""A plain numpy implementation of the supported decoder architectures, straight
from the GGUF file (no rkc graph, no rkc kernels): the independent reference the
compiled models are checked against, and a tool to debug against llama.cpp.

Written from the architecture descriptions (llama.cpp src/models/*.cpp), in
float64 so its own rounding does not hide a bug in the code under test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rkc.compiler.frontend.gguf import GgufFile
from rkc.ir.llm import LlmConfig


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, pos: np.ndarray, cfg: LlmConfig, base: float, scale: float,
         freq_factors: np.ndarray | None, dims: int | None = None) -> np.ndarray:
    """x [T, H, hd]; rotate the first rope_dims (or `dims`) of each head."""
    d = dims or cfg.rope_dims
    theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if freq_factors is not None:
        theta = theta / freq_factors
    ang = (pos.astype(np.float64) * scale)[:, None] * theta[None, :]  # [T, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    if cfg.rope_mode == "neox":
        a, b = x[..., : d // 2], x[..., d // 2: d]
        out[..., : d // 2] = a * cos - b * sin
        out[..., d // 2: d] = a * sin + b * cos
    else:
        a, b = x[..., 0:d:2], x[..., 1:d:2]
        out[..., 0:d:2] = a * cos - b * sin
        out[..., 1:d:2] = a * sin + b * cos
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row, as W8A8 defines it: in float32 (scale = max|x| / 127,
    round half to even), so that values on a rounding edge round alike."""
    x32 = x.astype(np.float32)
    amax = np.abs(x32).max(axis=-1)
    scale = np.where(amax > 0, amax / np.float32(127), np.float32(1))
    q = np.clip(np.rint(x32 / scale[:, None]), -127, 127)
    return q.astype(np.float64), scale.astype(np.float64)


def quantize_terms(x: np.ndarray, terms: int) -> np.ndarray:
    """x as `terms` int8 rows per row, summed (W8A8 with residual terms): term t
    quantizes per row what the terms before it left, the residual in float32."""
    x32, out = x.astype(np.float32), np.zeros(x.shape)
    for _ in range(terms):
        q, s = quantize_rows(x32)
        out += q * s[:, None]
        x32 = x32 - (q * s[:, None]).astype(np.float32)
    return out


def dense_rotation(k: int, kind: str) -> np.ndarray:
    """R [k, k] with x R = rkc's rotate(x): diag(signs) (F^T (x) H_n / sqrt(n)),
    H_n by Sylvester's doubling (rkc applies it by a fast transform)."""
    from rkc.runtime.kernels.hadamard import make_rotation

    rot = make_rotation(k, kind)
    h = np.ones((1, 1))
    while len(h) < rot.block:
        h = np.block([[h, h], [h, -h]])
    f = np.eye(k // rot.block) if rot.factor is None else rot.factor.astype(np.float64)
    return rot.signs.astype(np.float64)[:, None] * np.kron(f.T, h / np.sqrt(rot.block))  # diag(signs) @ ...


ARITHMETICS = ("exact", "w8a8", "w4a8", "fp16")
W4A8_GROUP = 256  # rkc compile --precision int4's weight groups along K
W4A8_ACT = 119  # int8 activations split into two nibbles: |a| <= 119


@dataclass
class ReferenceModel:
    """`arith`: "exact" (float64), or the arithmetic a precision defines for the
    matrix products: "w8a8" (int8 weights per output channel, int8 activations
    per token, exact integer sums) or "fp16" (fp16 weights and activations)."""

    cfg: LlmConfig
    w: dict[str, np.ndarray]
    arith: str = "exact"
    keep_fp16: tuple[str, ...] = ()  # with "w8a8": weights named so use fp16 arithmetic
    # with "w8a8": the products whose input is quantized in two int8 terms (value +
    # residual): "none", "head" or "all" (rkc compile --int8-residual)
    residual: str = "none"
    # with "w8a8": per input width K, the orthogonal R [K, K] each product's input
    # and weight rows are rotated by before rounding to int8 (rotated W8A8)
    rotations: dict[int, np.ndarray] = field(default_factory=dict)
    # per layer: keys [P, Hkv, hd], values, positions [P]
    k_cache: list[list[np.ndarray]] = field(default_factory=list)
    v_cache: list[list[np.ndarray]] = field(default_factory=list)
    pos_cache: list[list[int]] = field(default_factory=list)
    # w4a8 with a tied head: the embedding rows, int8 per row (not the head's int4 weights)
    embed: np.ndarray | None = None

    @classmethod
    def load(cls, path: str, arith: str = "exact", keep_fp16: tuple[str, ...] = (),
             rotation: str = "none", residual: str = "none") -> "ReferenceModel":
        """rotation (w8a8): "none", or a kind of runtime/kernels/hadamard.make_rotation,
        whose parameters (signs, block, factor) are turned into a dense matrix here."""
        if arith not in ARITHMETICS:  # else it would run as the float model and a check could pass unseen
            raise ValueError(f"reference arithmetic {arith!r} is not one of {ARITHMETICS}")
        gf = GgufFile(path)
        cfg = gf.config()
        w = {name: gf.dequantize(name).astype(np.float64) for name in gf.tensors}
        rotations = {}
        for name in list(w):
            # the product weights (a separate embedding table is not one)
            product = name != "token_embd.weight" or "output.weight" not in w
            if w[name].ndim == 2 and arith == "w8a8" and any(k in name for k in keep_fp16):
                w[name] = w[name].astype(np.float16).astype(np.float64)
            elif w[name].ndim == 2 and arith == "w8a8" and rotation != "none" and product:
                k = w[name].shape[1]
                r = rotations.setdefault(k, dense_rotation(k, rotation))
                q, s = quantize_rows(w[name] @ r)
                w[name] = (q * s[:, None]) @ r.T  # in the original basis: x W^T = (x R)(W R)^T
            elif w[name].ndim == 2 and arith == "w8a8":
                q, s = quantize_rows(w[name])
                w[name] = q * s[:, None]
            elif w[name].ndim == 2 and arith == "fp16":
                w[name] = w[name].astype(np.float16).astype(np.float64)
            elif w[name].ndim == 2 and arith == "w4a8" and not product:  # a Gather-only table: int8 rows
                q, s = quantize_rows(w[name])
                w[name] = q * s[:, None]
            elif w[name].ndim == 2 and arith == "w4a8":
                if name == "token_embd.weight":
                    q, s = quantize_rows(w[name])
                    embed = q * s[:, None]
                k = w[name].shape[1]
                r = rotations.setdefault(k, dense_rotation(k, rotation)) if rotation != "none" else np.eye(k)
                # the weights as rkc rounds them (compiler/llm/int4.py, tested on its own)
                from rkc.compiler.llm.int4 import quantize_weight
                w[name] = quantize_weight((w[name] @ r).astype(np.float32), W4A8_GROUP).dequantized() @ r.T
        if residual not in ("none", "head", "all"):
            raise ValueError(f"reference residual {residual!r}")
        model = cls(cfg, w, arith, tuple(keep_fp16), residual, rotations)
        model.embed = locals().get("embed")
        return model

    def reset(self) -> None:
        n = self.cfg.n_layer
        self.k_cache, self.v_cache, self.pos_cache = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]

    def lin(self, x: np.ndarray, name: str) -> np.ndarray:
        if self.arith == "w8a8" and any(k in name for k in self.keep_fp16):
            x = x.astype(np.float16).astype(np.float64)
        elif self.arith == "w8a8":
            head = name in ("output", "token_embd")  # the output head (tied or not): _head's products
            terms = 2 if self.residual == "all" or (self.residual == "head" and head) else 1
            r = self.rotations.get(x.shape[-1])
            x = quantize_terms(x, terms) if r is None else quantize_terms(x @ r, terms) @ r.T
        elif self.arith == "w4a8":  # int8 per row in [-119, 119] (two nibble rows on the NPU)
            r = self.rotations.get(x.shape[-1])
            xr = x if r is None else x @ r
            x32 = xr.astype(np.float32)  # in float32, as W8A8's quantize_rows
            amax = np.abs(x32).max(axis=-1, keepdims=True)
            s = np.where(amax > 0, amax / np.float32(W4A8_ACT), np.float32(1))
            xr = np.clip(np.rint(x32 / s), -W4A8_ACT, W4A8_ACT).astype(np.float64) * s
            x = xr if r is None else xr @ r.T
        elif self.arith == "fp16":
            x = x.astype(np.float16).astype(np.float64)
        y = x @ self.w[f"{name}.weight"].T
        if f"{name}.bias" in self.w:
            y = y + self.w[f"{name}.bias"]
        return y

    @staticmethod
    def to_cache(a: np.ndarray) -> np.ndarray:
        """A K or V entry as the runtime's fp16 cache holds it (from the fp32 it computes)."""
        return a.astype(np.float32).astype(np.float16).astype(np.float64)

    def forward(self, tokens: list[int], start: int) -> np.ndarray:
        """Logits [T, vocab] for tokens at positions start.., appending to the cache."""
        cfg, w = self.cfg, self.w
        if not self.k_cache:
            self.reset()
        T = len(tokens)
        pos = np.arange(start, start + T)
        table = w["token_embd.weight"] if self.embed is None else self.embed
        x = table[np.asarray(tokens)] * cfg.embed_scale
        if cfg.traits.per_layer:
            return self._gemma4(x, tokens, pos)
        for il in range(cfg.n_layer):
            p = f"blk.{il}"
            h = rms_norm(x, w[f"{p}.attn_norm.weight"], cfg.rms_eps)
            q = self.lin(h, f"{p}.attn_q").reshape(T, cfg.n_head, cfg.head_dim)
            k = self.lin(h, f"{p}.attn_k").reshape(T, cfg.n_head_kv, cfg.head_dim)
            v = self.lin(h, f"{p}.attn_v").reshape(T, cfg.n_head_kv, cfg.head_dim_v)
            if cfg.qk_norm:
                q = rms_norm(q, w[f"{p}.attn_q_norm.weight"], cfg.rms_eps)
                k = rms_norm(k, w[f"{p}.attn_k_norm.weight"], cfg.rms_eps)
            base, scale = cfg.layer_rope(il)
            ff = w.get("rope_freqs.weight") if not cfg.is_swa(il) else None
            q, k = rope(q, pos, cfg, base, scale, ff), rope(k, pos, cfg, base, scale, ff)
            if self.arith != "exact":  # the runtime keeps its KV cache in fp16, as llama.cpp does
                k, v = self.to_cache(k), self.to_cache(v)
            self.k_cache[il].append(k)
            self.v_cache[il].append(v)
            self.pos_cache[il].extend(pos.tolist())
            K = np.concatenate(self.k_cache[il])
            V = np.concatenate(self.v_cache[il])
            kpos = np.asarray(self.pos_cache[il])
            group = cfg.n_head // cfg.n_head_kv
            out = np.zeros((T, cfg.n_head, cfg.head_dim_v))
            for hh in range(cfg.n_head):
                s = (q[:, hh, :] @ K[:, hh // group, :].T) * cfg.attn_scale  # [T, P]
                allowed = kpos[None, :] <= pos[:, None]
                if cfg.is_swa(il):
                    allowed &= (pos[:, None] - kpos[None, :]) < cfg.swa_window
                s = np.where(allowed, s, -np.inf)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ V[:, hh // group, :]
            a = self.lin(out.reshape(T, -1), f"{p}.attn_output")
            if cfg.post_norms:
                a = rms_norm(a, w[f"{p}.post_attention_norm.weight"], cfg.rms_eps)
            x = x + a
            h = rms_norm(x, w[f"{p}.ffn_norm.weight"], cfg.rms_eps)
            act = gelu_tanh if cfg.ffn_act == "gelu_tanh" else silu
            f = self.lin(act(self.lin(h, f"{p}.ffn_gate")) * self.lin(h, f"{p}.ffn_up"), f"{p}.ffn_down")
            if cfg.post_norms:
                f = rms_norm(f, w[f"{p}.post_ffw_norm.weight"], cfg.rms_eps)
            x = x + f
        return self._head(x)

    def _head(self, x: np.ndarray) -> np.ndarray:
        cfg, w = self.cfg, self.w
        x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
        logits = self.lin(x, "output" if "output.weight" in w else "token_embd")
        if cfg.logit_softcap:
            logits = np.tanh(logits / cfg.logit_softcap) * cfg.logit_softcap
        return logits

    def _attend(self, q: np.ndarray, il: int, pos: np.ndarray) -> np.ndarray:
        """q [T, H, hd] over the cache of layer il's KV source: [T, H * hd]."""
        cfg, src = self.cfg, self.cfg.kv_layer(il)
        K, V = np.concatenate(self.k_cache[src]), np.concatenate(self.v_cache[src])
        kpos = np.asarray(self.pos_cache[src])
        H, Hkv = q.shape[1], K.shape[1]
        out = np.zeros((len(q), H, V.shape[-1]))
        allowed = kpos[None, :] <= pos[:, None]
        if cfg.is_swa(il):
            allowed &= (pos[:, None] - kpos[None, :]) < cfg.swa_window
        for hh in range(H):
            s = np.where(allowed, (q[:, hh, :] @ K[:, hh // (H // Hkv), :].T) * cfg.attn_scale, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ V[:, hh // (H // Hkv), :]
        return out.reshape(len(q), -1)

    def _gemma4(self, x: np.ndarray, tokens: list[int], pos: np.ndarray) -> np.ndarray:
        """Gemma 4 (llama.cpp src/models/gemma4.cpp), from x = the scaled embeddings."""
        cfg, w, T = self.cfg, self.w, len(tokens)
        L, P, D = cfg.n_layer, cfg.n_embd_per_layer, cfg.n_embd
        if P:
            rows = w["per_layer_token_embd.weight"][np.asarray(tokens)].reshape(T, L, P) * math.sqrt(P)
            proj = (self.lin(x, "per_layer_model_proj") / math.sqrt(D)).reshape(T, L, P)
            per_layer = (rms_norm(proj, w["per_layer_proj_norm.weight"], cfg.rms_eps) + rows) / math.sqrt(2)
        for il in range(L):
            p = f"blk.{il}"
            H, Hkv, (hd, _) = cfg.n_head_of(il), cfg.n_head_kv_of(il), cfg.head_dim_of(il)
            base, scale = cfg.layer_rope(il)
            ff = w["rope_freqs.weight"] if not cfg.is_swa(il) else None

            def rot(t):
                return rope(t, pos, cfg, base, scale, ff, cfg.rope_dims_of(il))

            h = rms_norm(x, w[f"{p}.attn_norm.weight"], cfg.rms_eps)
            q = rot(rms_norm(self.lin(h, f"{p}.attn_q").reshape(T, H, hd), w[f"{p}.attn_q_norm.weight"], cfg.rms_eps))
            if cfg.kv_layer(il) == il:
                k = self.lin(h, f"{p}.attn_k").reshape(T, Hkv, hd)
                v = self.lin(h, f"{p}.attn_v").reshape(T, Hkv, hd) if f"{p}.attn_v.weight" in w else k
                k = rot(rms_norm(k, w[f"{p}.attn_k_norm.weight"], cfg.rms_eps))
                v = rms_norm(v, 1.0, cfg.rms_eps)
                if self.arith != "exact":  # the runtime keeps its KV cache in fp16, as llama.cpp does
                    k, v = self.to_cache(k), self.to_cache(v)
                self.k_cache[il].append(k)
                self.v_cache[il].append(v)
                self.pos_cache[il].extend(pos.tolist())
            a = self.lin(self._attend(q, il, pos), f"{p}.attn_output")
            x = x + rms_norm(a, w[f"{p}.post_attention_norm.weight"], cfg.rms_eps)
            h = rms_norm(x, w[f"{p}.ffn_norm.weight"], cfg.rms_eps)
            f = self.lin(gelu_tanh(self.lin(h, f"{p}.ffn_gate")) * self.lin(h, f"{p}.ffn_up"), f"{p}.ffn_down")
            x = x + rms_norm(f, w[f"{p}.post_ffw_norm.weight"], cfg.rms_eps)
            if P:
                g = self.lin(gelu_tanh(self.lin(x, f"{p}.inp_gate")) * per_layer[:, il], f"{p}.proj")
                x = x + rms_norm(g, w[f"{p}.post_norm.weight"], cfg.rms_eps)
            if f"{p}.layer_output_scale.weight" in w:
                x = x * w[f"{p}.layer_output_scale.weight"]
        return self._head(x)

    def greedy(self, tokens: list[int], n: int) -> list[int]:
        self.reset()
        logits = self.forward(tokens, 0)
        out = []
        pos = len(tokens)
        for _ in range(n):
            t = int(np.argmax(logits[-1]))
            out.append(t)
            logits = self.forward([t], pos)
            pos += 1
        return out
