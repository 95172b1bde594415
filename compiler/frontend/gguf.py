"""GGUF LLM -> ir.Graph, driven by the file's metadata (ir/llm.py).

The graph computes one forward step over T new tokens (T is symbolic): inputs
`tokens` int32[T] and `positions` int32[T]; output `logits` fp32[T, vocab].
Attention ops read and extend the KV cache of their layer (attribute `layer`),
which the runtime owns. Weights are constants whose payloads are the file's
own bytes (memory-mapped GGUF blocks, BlockQuant type) — referenced by name,
never inlined; the compiler dequantizes and re-lays them out.

Op vocabulary (CPU kernels in runtime/kernels/llm.py):
  Gather(table, ids)            rows of a [V, D] table
  Scale(x) {factor}             x * factor
  RMSNorm(x, w) {epsilon}       over the last axis
  Linear(x, W[, b])             x @ W.T (+ b), W is [out, in] as GGUF stores it
  Reshape(x) {shape}            -1 allowed once
  RoPE(x, positions) {base, scale, dims, mode}
  Attention(q, k, v, positions) {layer, scale, window, kv_heads}  causal, over the cache
  SiLU / GeluTanh / Tanh (x), Mul(a, b), Add(a, b)
Gemma 4 (llama.cpp src/models/gemma4.cpp) adds:
  RMSNormPlain(x) {epsilon}     RMSNorm without a weight (V before the cache)
  AttentionShared(q, positions) {layer, source, scale, window}  attends over layer
                                `source`'s KV cache (KV sharing), adds nothing to it
  Pick(x) {index}               x[:, index] of [T, L, P]: one layer's per-layer input
  ScaleBy(x, s)                 x * s, s a one-element constant (the layer output scale)
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path
from typing import Any

import numpy as np

from rkc.ir.errors import FormatError, UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.llm import LlmConfig, config_from_gguf
from rkc.ir.types import BlockQuant, DType, TensorType

# GGML tensor types rkc reads: F32/F16/BF16 as plain arrays, the rest as blocks
PLAIN_TYPES = {"F32": DType.FP32, "F16": DType.FP16, "BF16": DType.BF16}
BLOCK_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K")
SUPPORTED_TYPES = (*PLAIN_TYPES, *BLOCK_TYPES)
DEQUANT_ROWS = 4096  # rows dequantized at a time (a 262k-row table would need ~3x its fp32 size at once)


class GgufFile:
    """A GGUF file's metadata (plain values, tokenizer arrays excepted) and tensors."""

    def __init__(self, path: str | Path) -> None:
        # deferred: the reader stands on the gguf library (heavy), which `rkc --help` must not load
        from rkc.compiler.frontend.gguf_reader import MappedGgufReader

        self.path = Path(path)
        try:
            self.reader = MappedGgufReader(self.path)
        except Exception as exc:  # the reader raises many kinds on damage
            raise FormatError(f"{self.path}: truncated or corrupt GGUF ({type(exc).__name__}: {exc})") from None
        self.kv: dict[str, Any] = {}
        for key, fld in self.reader.fields.items():
            if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "scores", "token_type", "merges")):
                continue  # large arrays: read on demand by the tokenizer
            self.kv[key] = fld.contents()
        self.tensors = {t.name: t for t in self.reader.tensors}

    def take_tokenizer_fields(self) -> dict[str, Any]:
        """The tokenizer.* fields as plain values (vocabulary arrays included);
        the reader's own copies are let go (its ~1M numpy views of a 262k-token
        vocabulary hold ~370 MB through a whole compile)."""
        keys = [k for k in self.reader.fields if k.startswith("tokenizer.")]
        fields = {k: self.reader.fields[k].contents() for k in keys}
        for k in keys:
            del self.reader.fields[k]
        return fields

    def type_name(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def shape(self, name: str) -> tuple[int, ...]:
        """numpy order (GGUF lists ne0 first)."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

    def n_vocab(self) -> int:
        """The embedding table's rows, one per token of the tokenizer's vocabulary (as llama.cpp requires)."""
        if "token_embd.weight" not in self.tensors:
            raise FormatError(f"{self.path}: no token_embd.weight tensor")
        rows = self.shape("token_embd.weight")[0]
        tokens = self.reader.fields.get("tokenizer.ggml.tokens")
        if tokens is not None and len(tokens.data) != rows:
            raise FormatError(f"{self.path}: token_embd.weight has {rows} rows, but the vocabulary has "
                              f"{len(tokens.data)} tokens")
        return rows

    def config(self) -> LlmConfig:
        return config_from_gguf(self.kv, self.n_vocab(), str(self.path))

    def raw(self, name: str) -> np.ndarray:
        return self.tensors[name].data

    def release(self, raw: np.ndarray) -> None:
        """Drop the process's mapping of the file pages under `raw` (a view of
        the mapped file that has been read): resident file pages count in the
        RSS, and a compile reads each weight once, so a 5 GB GGUF would
        otherwise stay resident as it is read. The mapping is read-only, so
        MADV_DONTNEED loses nothing: a later read faults the pages back in from
        the page cache. Pages shared with a neighbouring tensor are dropped too
        (the same refault)."""
        mapped = self.reader.data
        mm = getattr(mapped, "_mmap", None)
        if mm is None or raw.size == 0 or not hasattr(mm, "madvise"):
            return
        base = mapped.ctypes.data - mapped.offset % mmap.ALLOCATIONGRANULARITY
        start = raw.ctypes.data - base
        if not 0 <= start < len(mm):
            return  # not a view of this mapping
        first = start - start % mmap.PAGESIZE
        end = min(len(mm), -(-(start + raw.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE)
        mm.madvise(mmap.MADV_DONTNEED, first, end - first)

    def dequantize_rows(self, name: str, rows: slice | np.ndarray) -> np.ndarray:
        """fp32 rows of a 2-D tensor (a slice or row ids), the others not read;
        a slice's file pages are let go once read (release)."""
        import gguf  # deferred (see __init__)

        t = self.tensors[name]
        if len(self.shape(name)) != 2 or t.tensor_type.name not in SUPPORTED_TYPES:
            return self.dequantize(name)[rows]
        raw = np.asarray(t.data)[rows]
        values = np.asarray(gguf.quants.dequantize(raw, t.tensor_type), np.float32)
        if isinstance(rows, slice) and not np.shares_memory(values, raw):  # (plain F32: its own pages)
            self.release(raw)
        return values.reshape(-1, self.shape(name)[1])

    def dequantize(self, name: str, dtype: type = np.float32) -> np.ndarray:
        """fp32 values in numpy order, whatever the stored type, held as `dtype`
        (fp16: the fp32 values rounded, without a whole fp32 copy)."""
        import gguf  # deferred (see __init__)

        t = self.tensors[name]
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise UnsupportedError(f"{self.path}: tensor {name} has type {kind}, which rkc does not support "
                                   f"(supported: {', '.join(SUPPORTED_TYPES)})")
        shape = self.shape(name)
        raw = np.asarray(t.data)  # a view of the memory-mapped file
        if raw.ndim < 2 or raw.shape[0] <= DEQUANT_ROWS:
            values = np.asarray(gguf.quants.dequantize(raw, t.tensor_type), dtype=np.float32)
            values = values.astype(dtype, copy=False).reshape(shape)
            if np.shares_memory(values, raw):  # a plain F32 tensor: its own pages, kept
                return values
            self.release(raw)
            return values
        # in row blocks into one array: gguf's temporaries stay a block's size
        out = np.empty((raw.shape[0], int(np.prod(shape)) // raw.shape[0]), dtype)
        for r0 in range(0, raw.shape[0], DEQUANT_ROWS):
            out[r0:r0 + DEQUANT_ROWS] = gguf.quants.dequantize(raw[r0:r0 + DEQUANT_ROWS], t.tensor_type)
            self.release(raw[r0:r0 + DEQUANT_ROWS])
        return out.reshape(shape)


class _Builder:
    """Adds the ops of one forward step to a Graph, naming tensors after GGUF's."""

    def __init__(self, gf: GgufFile, cfg: LlmConfig) -> None:
        self.gf, self.cfg = gf, cfg
        self.g = Graph(name=gf.kv.get("general.name") or gf.path.stem)
        self._consts: set[str] = set()

    def const(self, name: str, need: tuple[int, ...], required: bool = True) -> str | None:
        """The tensor as a graph constant; `need`: the shape (numpy order) the architecture and the
        hyperparameters give it, checked before anything reads it (a wrong one is one FormatError line)."""
        if name not in self.gf.tensors:
            if required:
                raise FormatError(f"{self.gf.path}: missing tensor {name}")
            return None
        shape = self.gf.shape(name)
        if shape != tuple(need):
            raise FormatError(f"{self.gf.path}: tensor {name} has shape {list(shape)}, but this {self.cfg.arch} model "
                              f"(its hyperparameters) needs {list(need)}")
        if name in self._consts:
            return name
        kind = self.gf.type_name(name)
        if kind in PLAIN_TYPES:
            # the reader hands BF16 out as raw bytes: view every plain type by its width
            data = np.asarray(self.gf.raw(name)).reshape(-1).view(PLAIN_TYPES[kind].numpy).reshape(shape)
            self.g.add_const(name, TensorType(PLAIN_TYPES[kind], shape), data)
        elif kind in BLOCK_TYPES:
            self.g.add_const(name, TensorType(DType.FP32, shape, BlockQuant(kind)), np.asarray(self.gf.raw(name)))
        else:
            raise UnsupportedError(f"{self.gf.path}: tensor {name} has type {kind}, which rkc does not support "
                                   f"(supported: {', '.join(SUPPORTED_TYPES)})")
        self._consts.add(name)
        return name

    def op(self, type_: str, inputs: list[str], out: str, shape: tuple, attrs: dict | None = None) -> str:
        self.g.add_op(type_, inputs, [(out, TensorType(DType.FP32, shape))], attrs)
        return out

    def linear(self, x: str, weight: str, out: str, n_in: int, n_out: int) -> str:
        """x [T, n_in] @ weight.T -> [T, n_out] (GGUF stores W as [n_out, n_in])."""
        w = self.const(f"{weight}.weight", (n_out, n_in))
        b = self.const(f"{weight}.bias", (n_out,), required=False)
        return self.op("Linear", [x, w] + ([b] if b else []), out, ("T", n_out))

    def rms(self, x: str, weight: str, out: str, shape: tuple) -> str:
        w = self.const(weight, (shape[-1],))
        return self.op("RMSNorm", [x, w], out, shape, {"epsilon": self.cfg.rms_eps})

    def build(self) -> Graph:
        cfg, g = self.cfg, self.g
        T, D = "T", cfg.n_embd
        for key, value in cfg.to_dict().items():
            g.metadata[f"llm_{key}"] = value if not isinstance(value, bool) else int(value)
        g.add_input("tokens", TensorType(DType.INT32, (T,)))
        g.add_input("positions", TensorType(DType.INT32, (T,)))
        emb = self.const("token_embd.weight", (cfg.n_vocab, D))
        x = self.op("Gather", [emb, "tokens"], "embd", (T, D))
        if cfg.embed_scale != 1.0:
            x = self.op("Scale", [x], "embd_scaled", (T, D), {"factor": cfg.embed_scale})
        if cfg.traits.per_layer:
            per_layer = self.per_layer_inputs(x) if cfg.n_embd_per_layer else None
            for il in range(cfg.n_layer):
                x = self.gemma4_layer(il, x, per_layer)
        for il in range(cfg.n_layer if not cfg.traits.per_layer else 0):
            x = self.layer(il, x)
        x = self.rms(x, "output_norm.weight", "result_norm", (T, D))
        head = "output" if "output.weight" in self.gf.tensors else "token_embd"
        logits = self.linear(x, head, "logits", D, cfg.n_vocab)
        if cfg.logit_softcap:
            c = cfg.logit_softcap
            s = self.op("Scale", [logits], "logits_div", (T, cfg.n_vocab), {"factor": 1.0 / c})
            s = self.op("Tanh", [s], "logits_tanh", (T, cfg.n_vocab))
            logits = self.op("Scale", [s], "logits_capped", (T, cfg.n_vocab), {"factor": c})
        g.outputs.append(logits)
        return g

    def layer(self, il: int, x: str) -> str:
        cfg, T, D = self.cfg, "T", self.cfg.n_embd
        p = f"blk.{il}"
        H, Hkv, hd, hdv = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
        h = self.rms(x, f"{p}.attn_norm.weight", f"{p}.attn_norm", (T, D))
        q = self.linear(h, f"{p}.attn_q", f"{p}.q", D, H * hd)
        k = self.linear(h, f"{p}.attn_k", f"{p}.k", D, Hkv * hd)
        v = self.linear(h, f"{p}.attn_v", f"{p}.v", D, Hkv * hdv)
        q = self.op("Reshape", [q], f"{p}.q_heads", (T, H, hd), {"shape": [-1, H, hd]})
        k = self.op("Reshape", [k], f"{p}.k_heads", (T, Hkv, hd), {"shape": [-1, Hkv, hd]})
        v = self.op("Reshape", [v], f"{p}.v_heads", (T, Hkv, hdv), {"shape": [-1, Hkv, hdv]})
        if cfg.qk_norm:
            q = self.rms(q, f"{p}.attn_q_norm.weight", f"{p}.q_normed", (T, H, hd))
            k = self.rms(k, f"{p}.attn_k_norm.weight", f"{p}.k_normed", (T, Hkv, hd))
        base, scale = cfg.layer_rope(il)
        rope = {"base": base, "scale": scale, "dims": cfg.rope_dims, "mode": cfg.rope_mode}
        freqs = None if cfg.is_swa(il) else self.const("rope_freqs.weight", (cfg.rope_dims // 2,), required=False)
        q = self.op("RoPE", [q, "positions"] + ([freqs] if freqs else []), f"{p}.q_rope", (T, H, hd), rope)
        k = self.op("RoPE", [k, "positions"] + ([freqs] if freqs else []), f"{p}.k_rope", (T, Hkv, hd), rope)
        window = cfg.swa_window if cfg.is_swa(il) else 0
        a = self.op("Attention", [q, k, v, "positions"], f"{p}.attn", (T, H * hdv),
                    {"layer": il, "scale": cfg.attn_scale, "window": window, "kv_heads": Hkv})
        a = self.linear(a, f"{p}.attn_output", f"{p}.attn_out", H * hdv, D)
        if cfg.post_norms:
            a = self.rms(a, f"{p}.post_attention_norm.weight", f"{p}.attn_post_norm", (T, D))
        x = self.op("Add", [a, x], f"{p}.attn_residual", (T, D))
        h = self.rms(x, f"{p}.ffn_norm.weight", f"{p}.ffn_norm", (T, D))
        gate = self.linear(h, f"{p}.ffn_gate", f"{p}.gate", D, cfg.n_ff)
        up = self.linear(h, f"{p}.ffn_up", f"{p}.up", D, cfg.n_ff)
        act = {"silu": "SiLU", "gelu_tanh": "GeluTanh"}[cfg.ffn_act]
        gate = self.op(act, [gate], f"{p}.gate_act", (T, cfg.n_ff))
        hid = self.op("Mul", [gate, up], f"{p}.ffn_hidden", (T, cfg.n_ff))
        f = self.linear(hid, f"{p}.ffn_down", f"{p}.ffn_out", cfg.n_ff, D)
        if cfg.post_norms:
            f = self.rms(f, f"{p}.post_ffw_norm.weight", f"{p}.ffn_post_norm", (T, D))
        return self.op("Add", [f, x], f"{p}.out", (T, D))


    # -- Gemma 4 ------------------------------------------------------------------------------
    def per_layer_inputs(self, x: str) -> str:
        """[T, L, P]: every layer's per-layer input, from the per-layer token
        table's rows (sqrt(P)-scaled) and the scaled embedding's projection
        (1/sqrt(D)-scaled, RMS-normed), summed and scaled by 1/sqrt(2)."""
        cfg, T, D = self.cfg, "T", self.cfg.n_embd
        L, P = cfg.n_layer, cfg.n_embd_per_layer
        table = self.const("per_layer_token_embd.weight", (cfg.n_vocab, L * P))
        rows = self.op("Gather", [table, "tokens"], "per_layer_rows", (T, L * P))
        rows = self.op("Scale", [rows], "per_layer_rows_scaled", (T, L * P), {"factor": math.sqrt(P)})
        rows = self.op("Reshape", [rows], "per_layer_tokens", (T, L, P), {"shape": [-1, L, P]})
        proj = self.linear(x, "per_layer_model_proj", "per_layer_proj", D, L * P)
        proj = self.op("Scale", [proj], "per_layer_proj_scaled", (T, L * P), {"factor": 1.0 / math.sqrt(D)})
        proj = self.op("Reshape", [proj], "per_layer_proj_heads", (T, L, P), {"shape": [-1, L, P]})
        proj = self.rms(proj, "per_layer_proj_norm.weight", "per_layer_proj_normed", (T, L, P))
        both = self.op("Add", [proj, rows], "per_layer_sum", (T, L, P))
        return self.op("Scale", [both], "per_layer_inputs", (T, L, P), {"factor": 1.0 / math.sqrt(2.0)})

    def gemma4_layer(self, il: int, x: str, per_layer: str | None) -> str:
        cfg, T, D = self.cfg, "T", self.cfg.n_embd
        p = f"blk.{il}"
        H, Hkv, (hd, _) = cfg.n_head_of(il), cfg.n_head_kv_of(il), cfg.head_dim_of(il)
        h = self.rms(x, f"{p}.attn_norm.weight", f"{p}.attn_norm", (T, D))
        base, scale = cfg.layer_rope(il)
        rope = {"base": base, "scale": scale, "dims": cfg.rope_dims_of(il), "mode": cfg.rope_mode}
        freqs = (self.const("rope_freqs.weight", (cfg.rope_dims_of(il) // 2,), required=False)
                 if not cfg.is_swa(il) else None)
        extra = [freqs] if freqs else []
        q = self.linear(h, f"{p}.attn_q", f"{p}.q", D, H * hd)
        q = self.op("Reshape", [q], f"{p}.q_heads", (T, H, hd), {"shape": [-1, H, hd]})
        q = self.rms(q, f"{p}.attn_q_norm.weight", f"{p}.q_normed", (T, H, hd))
        q = self.op("RoPE", [q, "positions", *extra], f"{p}.q_rope", (T, H, hd), rope)
        window = cfg.swa_window if cfg.is_swa(il) else 0
        attrs = {"layer": il, "scale": cfg.attn_scale, "window": window, "kv_heads": Hkv}
        if cfg.kv_layer(il) == il:
            k = self.linear(h, f"{p}.attn_k", f"{p}.k", D, Hkv * hd)
            k = self.op("Reshape", [k], f"{p}.k_heads", (T, Hkv, hd), {"shape": [-1, Hkv, hd]})
            if f"{p}.attn_v.weight" in self.gf.tensors:
                v = self.linear(h, f"{p}.attn_v", f"{p}.v", D, Hkv * hd)
                v = self.op("Reshape", [v], f"{p}.v_heads", (T, Hkv, hd), {"shape": [-1, Hkv, hd]})
            else:
                v = k  # no V projection: V is K's projection (before K's norm and RoPE)
            k = self.rms(k, f"{p}.attn_k_norm.weight", f"{p}.k_normed", (T, Hkv, hd))
            v = self.op("RMSNormPlain", [v], f"{p}.v_normed", (T, Hkv, hd), {"epsilon": cfg.rms_eps})
            k = self.op("RoPE", [k, "positions", *extra], f"{p}.k_rope", (T, Hkv, hd), rope)
            a = self.op("Attention", [q, k, v, "positions"], f"{p}.attn", (T, H * hd), attrs)
        else:
            a = self.op("AttentionShared", [q, "positions"], f"{p}.attn", (T, H * hd),
                        attrs | {"source": cfg.kv_layer(il)})
        a = self.linear(a, f"{p}.attn_output", f"{p}.attn_out", H * hd, D)
        a = self.rms(a, f"{p}.post_attention_norm.weight", f"{p}.attn_post_norm", (T, D))
        x = self.op("Add", [a, x], f"{p}.attn_residual", (T, D))
        n_ff = cfg.n_ff_of(il)
        h = self.rms(x, f"{p}.ffn_norm.weight", f"{p}.ffn_norm", (T, D))
        gate = self.linear(h, f"{p}.ffn_gate", f"{p}.gate", D, n_ff)
        up = self.linear(h, f"{p}.ffn_up", f"{p}.up", D, n_ff)
        gate = self.op("GeluTanh", [gate], f"{p}.gate_act", (T, n_ff))
        f = self.linear(self.op("Mul", [gate, up], f"{p}.ffn_hidden", (T, n_ff)), f"{p}.ffn_down", f"{p}.ffn_out",
                        n_ff, D)
        f = self.rms(f, f"{p}.post_ffw_norm.weight", f"{p}.ffn_post_norm", (T, D))
        x = self.op("Add", [f, x], f"{p}.ffn_residual", (T, D))
        if per_layer is not None:
            P = cfg.n_embd_per_layer
            g = self.linear(x, f"{p}.inp_gate", f"{p}.pl_gate", D, P)
            g = self.op("GeluTanh", [g], f"{p}.pl_gate_act", (T, P))
            mine = self.op("Pick", [per_layer], f"{p}.pl_input", (T, P), {"index": il})
            g = self.linear(self.op("Mul", [g, mine], f"{p}.pl_gated", (T, P)), f"{p}.proj", f"{p}.pl_proj", P, D)
            g = self.rms(g, f"{p}.post_norm.weight", f"{p}.pl_post_norm", (T, D))
            x = self.op("Add", [x, g], f"{p}.pl_residual", (T, D))
        out_scale = self.const(f"{p}.layer_output_scale.weight", (1,), required=False)
        if out_scale:
            x = self.op("ScaleBy", [x, out_scale], f"{p}.out", (T, D))
        return x


def check_moe(gf: GgufFile) -> None:
    """A mixture-of-experts file (router tensors) is refused in one line."""
    routers = [n for n in gf.tensors if n.endswith(".ffn_gate_inp.weight")]
    if routers:
        raise UnsupportedError(f"{gf.path}: mixture-of-experts layers ({routers[0]}, {len(routers)} routers) "
                               "are not supported")


def check_tensor_types(gf: GgufFile) -> None:
    for name in gf.tensors:
        kind = gf.type_name(name)
        if kind not in SUPPORTED_TYPES:
            raise UnsupportedError(f"{gf.path}: tensor {name} has type {kind}, which rkc does not support "
                                   f"(supported: {', '.join(SUPPORTED_TYPES)})")


def graph_from_gguf(gf: GgufFile) -> Graph:
    cfg = gf.config()
    check_moe(gf)
    check_tensor_types(gf)
    graph = _Builder(gf, cfg).build()
    graph.verify()
    return graph


def load(path: Path) -> Graph:
    return graph_from_gguf(GgufFile(path))
