"""Synthetic GGUF LLMs written with gguf.GGUFWriter: random weights, and a
small tokenizer of the kind the real models of that architecture use
(SentencePiece for llama/gemma3, GPT-2 byte-level BPE for qwen2/qwen3).

* SHAPES: a tiny model per supported architecture, its weights in every
  supported tensor type (the "tiny" mix);
* REAL: the exact shapes and metadata of Qwen2.5-1.5B, Qwen3-1.7B, Llama-3.2-1B
  and Gemma-3-1B, in Q8_0 or a Q4_K_M-like Q4_K/Q6_K mix, optionally cut to
  their first layers (bench/synth_gguf.py, the slow scale tests).

Tensors are generated one at a time while the file is written (the writer
holds only their sizes), so a 1.5B model is made in bounded memory."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType

WORDS = ["the", "of", "and", "to", "in", "is", "that", "it", "was", "for", "on", "are", "with", "as", "be",
         "at", "by", "this", "from", "or", "an", "he", "she", "we", "they", "one", "all", "there", "ing", "er",
         "ed", "tion", "hello", "world", "model", "token", "cat", "dog", "run", "time"]

# architecture -> shapes and quirks of its tiny model
SHAPES = {
    "llama": dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=256, n_layer=2, tokenizer="spm",
                  tied=False),
    "qwen2": dict(n_embd=64, n_head=4, n_head_kv=1, head_dim=16, n_ff=256, n_layer=2, tokenizer="bpe",
                  tied=True, qkv_bias=True),
    "qwen3": dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=256, n_layer=2, tokenizer="bpe",
                  tied=False),
    "gemma3": dict(n_embd=64, n_head=4, n_head_kv=1, head_dim=32, n_ff=256, n_layer=3, tokenizer="spm",
                   tied=True, window=6, swa_pattern=[True, True, False]),
}

# The real models' hyperparameters, from their published config.json (Hugging
# Face: Qwen/Qwen2.5-1.5B, Qwen/Qwen3-1.7B, meta-llama/Llama-3.2-1B,
# google/gemma-3-1b-pt), under the GGUF keys llama.cpp's converter writes.
# Llama 3.2's rope_scaling (llama3: factor 32, low/high frequency factors 1/4,
# original context 8192) reaches GGUF as the rope_freqs.weight tensor.
REAL = {
    "qwen2.5-1.5b": dict(arch="qwen2", n_embd=1536, n_head=12, n_head_kv=2, head_dim=128, n_ff=8960, n_layer=28,
                         n_vocab=151936, context=32768, rope_base=1e6, eps=1e-6, tokenizer="bpe", tied=True,
                         qkv_bias=True),
    "qwen3-1.7b": dict(arch="qwen3", n_embd=2048, n_head=16, n_head_kv=8, head_dim=128, n_ff=6144, n_layer=28,
                       n_vocab=151936, context=40960, rope_base=1e6, eps=1e-6, tokenizer="bpe", tied=True),
    "llama-3.2-1b": dict(arch="llama", n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192, n_layer=16,
                         n_vocab=128256, context=131072, rope_base=500000.0, eps=1e-5, tokenizer="spm", tied=True,
                         llama3_rope=dict(factor=32.0, low=1.0, high=4.0, original=8192)),
    # sliding window 512 on 5 of every 6 layers (llama.cpp's gemma3 pattern), local RoPE base 10000
    "gemma-3-1b": dict(arch="gemma3", n_embd=1152, n_head=4, n_head_kv=1, head_dim=256, n_ff=6912, n_layer=26,
                       n_vocab=262144, context=32768, rope_base=1e6, eps=1e-6, tokenizer="spm", tied=True,
                       window=512),
}
# Gemma 4 E2B's text decoder, from its published config (google/gemma-4-E2B
# config.json, text_config: hidden_size 1536, 35 layers, 8 heads, 1 KV head,
# head_dim 256 / global_head_dim 512, intermediate_size 6144 doubled on the
# KV-shared layers (use_double_wide_mlp), hidden_size_per_layer_input 256,
# num_kv_shared_layers 20, sliding_window 512, every 5th layer full attention,
# rope_theta 1e6 (full, proportional, partial_rotary_factor 0.25) / 1e4
# (sliding), final_logit_softcapping 30, vocab 262144), under the GGUF keys
# llama.cpp's converter writes (also listed by a gemma-4-E2B GGUF's metadata:
# gemma4.attention.shared_kv_layers 20, key_length 512 / key_length_swa 256,
# rope.dimension_count 512 / _swa 256, embedding_length_per_layer_input 256)
_E2B_LAYERS = 35
REAL["gemma-4-e2b"] = dict(
    arch="gemma4", n_embd=1536, n_head=8, n_head_kv=1, head_dim=512, head_dim_swa=256, n_ff=6144,
    n_layer=_E2B_LAYERS, n_vocab=262144, context=131072, rope_base=1e6, rope_base_swa=1e4, eps=1e-6,
    tokenizer="spm", tied=True, window=512, swa_pattern=[il % 5 < 4 for il in range(_E2B_LAYERS)], shared=20,
    per_layer=256, layer_n_ff=[6144 * (2 if il >= 15 else 1) for il in range(_E2B_LAYERS)], softcap=30.0,
    features=("ple", "shared", "p_rope", "out_scale", "softcap", "wide_ff"))
# larger shapes, written on request only (bench/synth_gguf.py), never by the tests: Qwen2.5-7B
# (its config.json), too large for the 32-bit IOVA window in int8 (7.6 GB of weights), int4's case
LARGE = {
    "qwen2.5-7b": dict(arch="qwen2", n_embd=3584, n_head=28, n_head_kv=4, head_dim=128, n_ff=18944, n_layer=28,
                       n_vocab=152064, context=32768, rope_base=1e6, eps=1e-6, tokenizer="bpe", tied=False,
                       qkv_bias=True),
}
MIXES = ("q8_0", "q4_k_m")

# Gemma 4 (llama.cpp src/models/gemma4.cpp): a tiny model per feature
# combination. Every variant interleaves sliding layers (16-wide heads, full
# RoPE, base 1e4) with full layers (32-wide heads, base 1e6); the last pre-shared
# layer is full and the one before it sliding, as in E2B (so a shared layer's
# source is the same under llama.cpp's reuse rule and Hugging Face's), except in
# gemma4-kv-rule (GEMMA4_SHAPES), where the rules part.
#   ple: per-layer embeddings (table, projection, per-layer gates), width 32
#   shared: the last 3 layers read the KV caches of layers 1 (sliding) and 2 (full)
#   v_is_k: full layers have no V projection (V = K's projection)
#   p_rope: proportional RoPE on full layers (rope_freqs: a quarter rotated;
#           without it rope_freqs is all ones, plain RoPE: llama.cpp requires the tensor)
#   out_scale: blk.N.layer_output_scale
#   softcap: final logit soft-capping at 10 (without it the key is absent and
#            llama.cpp's default of 30 applies)
#   wide_ff: per-layer FFN widths (the shared layers twice as wide, as in E2B)
_GEMMA4_TINY = dict(arch="gemma4", n_embd=64, n_head=4, n_head_kv=1, head_dim=32, head_dim_swa=16, n_ff=128,
                    n_layer=6, tokenizer="spm", tied=True, window=6,
                    swa_pattern=[True, True, False, True, True, False], rope_base=1e6, rope_base_swa=1e4)
GEMMA4_ALL = ("ple", "shared", "v_is_k", "p_rope", "out_scale", "softcap", "wide_ff")
GEMMA4_VARIANTS = {
    "gemma4": GEMMA4_ALL,  # everything E2B has
    "gemma4-plain": (),  # only the interleaved sliding / full layers with their own head sizes and RoPE
    "gemma4-ple": ("ple", "out_scale"),
    "gemma4-shared": ("shared", "v_is_k", "p_rope", "softcap", "wide_ff"),
    "gemma4-kv-rule": ("shared",),
}
# variants' own shapes: gemma4-kv-rule's own-cache layers end sliding, sliding
# (the only full layer is layer 1), so its 2 shared sliding layers read layer 2
# under llama.cpp's rule (first shared - 2) and layer 3 under Hugging Face's
# (the last earlier sliding layer)
GEMMA4_SHAPES = {"gemma4-kv-rule": dict(swa_pattern=[True, False, True, True, True, True], shared=2)}


def gemma4_spec(features: tuple[str, ...], **shapes) -> dict:
    """A Gemma 4 spec with the named features (GEMMA4_ALL) on `shapes`."""
    s = {**_GEMMA4_TINY, **shapes, "features": tuple(features)}
    unknown = set(features) - set(GEMMA4_ALL)
    if unknown:
        raise ValueError(f"unknown Gemma 4 features {sorted(unknown)}")
    L = s["n_layer"]
    s.setdefault("shared", 3 if "shared" in features else 0)
    if "wide_ff" in features and "layer_n_ff" not in s:
        s["layer_n_ff"] = [s["n_ff"] * (2 if il >= L - s["shared"] else 1) for il in range(L)]
    s.setdefault("per_layer", 32 if "ple" in features else 0)
    if "softcap" in features:
        s.setdefault("softcap", 10.0)
    return s


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (a published table)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def spm_vocab(style: str) -> tuple[list[str], list[float], list[int], dict[str, int]]:
    """SentencePiece vocabulary: specials, 256 byte tokens, then word pieces and
    all their prefixes (so llama.cpp's bigram merging can reach every piece)."""
    if style == "gemma3":
        specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
        ids = {"pad": 0, "eos": 1, "bos": 2, "unk": 3}
    else:
        specials = ["<unk>", "<s>", "</s>"]
        ids = {"unk": 0, "bos": 1, "eos": 2}
    tokens = list(specials)
    types = [3] * len(specials)
    types[ids["unk"]] = 2
    scores = [0.0] * len(specials)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)
        scores.append(0.0)
    # every character is a piece of its own, as in a real SentencePiece vocabulary
    pieces: list[str] = sorted(set("".join(WORDS)) | {"\u2581"})
    for w in WORDS:
        for text in ("\u2581" + w, w):
            for i in range(1, len(text) + 1):
                if text[:i] not in pieces:
                    pieces.append(text[:i])
    for i, p in enumerate(sorted(pieces, key=lambda p: (len(p), p))):
        tokens.append(p)
        types.append(1)
        scores.append(-float(i))  # shorter pieces merge first
    tokens.append("<start_of_turn>")
    types.append(3)
    scores.append(0.0)
    return tokens, scores, types, ids


def bpe_vocab() -> tuple[list[str], list[int], list[str], dict[str, int]]:
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges: list[str] = []
    for w in WORDS:
        for text in (b2u[32] + w, w):
            for i in range(2, len(text) + 1):
                left, right = text[: i - 1], text[i - 1]
                if text[:i] not in tokens:
                    tokens.append(text[:i])
                    merges.append(f"{left} {right}")
    types = [1] * len(tokens)
    ids = {}
    for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        ids[name] = len(tokens)
        tokens.append(name)
        types.append(3)
    return tokens, types, merges, {"eos": ids["<|endoftext|>"], "bos": ids["<|endoftext|>"]}




def _k_quant_blocks(rng: np.random.Generator, rows: int, cols: int, kind: Q) -> np.ndarray:
    """Random but well-formed Q4_K / Q6_K blocks (gguf cannot quantize to them)."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    if kind == Q.Q4_K:  # d, dmin (f16) lead the block
        raw[:, 0:2] = np.full(n, 0.002, np.float16).view(np.uint8).reshape(n, 2)
        raw[:, 2:4] = np.full(n, 0.001, np.float16).view(np.uint8).reshape(n, 2)
    else:  # Q6_K: int8 scales at 192..208, d (f16) last
        raw[:, 192:208] = rng.integers(-12, 13, size=(n, 16)).astype(np.int8).view(np.uint8)
        raw[:, 208:210] = np.full(n, 0.0005, np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


ROW_CHUNK = 16384  # rows generated at a time (bounds the f32 working set of a 262k-row table)


def _q8_0_blocks(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    """Random Q8_0 blocks made directly (uniform int8, one f16 scale giving the
    values standard deviation `scale`): far faster than quantizing normals."""
    n = rows * cols // 32
    raw = np.empty((n, 34), np.uint8)
    raw[:, 0:2] = np.full(n, scale * np.sqrt(3) / 127, np.float16).view(np.uint8).reshape(n, 2)
    raw[:, 2:] = rng.integers(-127, 128, size=(n, 32), dtype=np.int8).view(np.uint8)
    return raw.reshape(rows, cols // 32 * 34)


def _tensor(rng: np.random.Generator, shape: tuple[int, ...], kind: Q, scale: float, offset: float,
            direct: bool = False) -> np.ndarray:
    """Random values of `shape` stored as `kind` (raw bytes for block types);
    `direct`: Q8_0 blocks drawn as blocks (big models), not quantized normals."""
    if kind in (Q.Q4_K, Q.Q6_K):
        return _k_quant_blocks(rng, shape[0], shape[1], kind)
    if direct and kind == Q.Q8_0 and offset == 0:
        return _q8_0_blocks(rng, shape[0], shape[1], scale)
    if kind in (Q.F32, Q.F16):
        values = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
        return values if kind == Q.F32 else values.astype(np.float16)
    parts = []
    for r0 in range(0, shape[0], ROW_CHUNK):
        rows = (min(ROW_CHUNK, shape[0] - r0),) + tuple(shape[1:])
        part = gguf.quants.quantize((rng.standard_normal(rows) * scale + offset).astype(np.float32), kind)
        parts.append(np.ascontiguousarray(part).view(np.uint8))  # BF16 comes back as uint16
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


# ChatML, the template of the Qwen models (their BPE vocabulary has its markers)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _nbytes(shape: tuple[int, ...], kind: Q) -> int:
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return int(np.prod(shape)) // block * size


def _tiny_type(role: str, layer: int, n_layer: int, cols: int) -> Q:
    """The tiny models' mix: every tensor type rkc reads."""
    return {"token_embd": Q.Q8_0, "output": Q.F16, "attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q4_0,
            "attn_output": Q.F16, "ffn_gate": Q.BF16 if layer % 2 else Q.Q8_0, "ffn_up": Q.Q4_0,
            "ffn_down": (Q.Q6_K, Q.Q4_K)[layer % 2] if cols % 256 == 0 else Q.Q8_0,
            "per_layer_token_embd": Q.Q8_0, "per_layer_model_proj": Q.F16, "inp_gate": Q.Q8_0, "proj": Q.F16}[role]


def _q8_type(role: str, layer: int, n_layer: int, cols: int) -> Q:
    return Q.Q8_0


def _q4_k_m_type(role: str, layer: int, n_layer: int, cols: int) -> Q:
    """llama.cpp's Q4_K_M choice: Q6_K for the output head (the embedding when
    tied) and for attn_v / ffn_down of the layers use_more_bits picks (the first
    and last eighth, every third in between), Q4_K elsewhere; K-quants need rows
    of whole 256-value super-blocks, else Q4_K -> Q5_0 and Q6_K -> Q8_0."""
    more = layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2
    kind = Q.Q6_K if role in ("output", "token_embd") or (role in ("attn_v", "ffn_down") and more) else Q.Q4_K
    if cols % 256:
        kind = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}[kind]
    return kind


def _f16_type(role: str, layer: int, n_layer: int, cols: int) -> Q:
    """Every matrix F16: llama.cpp then multiplies without quantizing its
    activations to 8 bits (its Q8 activation blocks move tiny random models'
    near-ties), the fair reference for an fp16 comparison."""
    return Q.F16


TYPE_MIXES: dict[str, Callable[[str, int, int, int], Q]] = {"tiny": _tiny_type, "q8_0": _q8_type,
                                                            "q4_k_m": _q4_k_m_type, "f16": _f16_type}


def _llama3_rope_factors(head_dim: int, base: float, factor: float, low: float, high: float,
                         original: int) -> np.ndarray:
    """Llama 3's rope_scaling as the per-frequency divisors llama.cpp stores in rope_freqs.weight."""
    freqs = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    low_wl, high_wl = original / low, original / high
    smooth = (original / wavelen - low) / (high - low)
    out = np.where(wavelen < high_wl, 1.0, np.where(wavelen > low_wl, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def _p_rope_factors(head_dim: int, fraction: float = 0.25) -> np.ndarray:
    """Proportional RoPE as llama.cpp's rope_freqs divisors: the first `fraction`
    of the frequencies (of a head_dim-wide rotation) turn, the rest are divided
    by 1e30, i.e. stand still."""
    n = head_dim // 2
    out = np.full(n, 1e30, np.float32)
    out[: int(fraction * n)] = 1.0
    return out


def _plan_gemma4(s: dict, n_vocab: int, mix: str) -> Iterator[tuple[str, tuple[int, ...], Q, float, float]]:
    D, H, Hkv, L = s["n_embd"], s["n_head"], s["n_head_kv"], s["n_layer"]
    n_total, P, feats = s.get("n_layer_full", L), s["per_layer"], s["features"]
    kind = TYPE_MIXES[mix]
    first_shared = L - s["shared"]
    yield "token_embd.weight", (n_vocab, D), kind("token_embd", 0, n_total, D), 0.5, 0.0
    if P:
        yield "per_layer_token_embd.weight", (n_vocab, L * P), kind("per_layer_token_embd", 0, n_total, L * P), \
            0.5, 0.0
        yield "per_layer_model_proj.weight", (L * P, D), kind("per_layer_model_proj", 0, n_total, D), 0.15, 0.0
        yield "per_layer_proj_norm.weight", (P,), Q.F32, 0.1, 1.0
    yield "output_norm.weight", (D,), Q.F32, 0.1, 1.0
    yield "rope_freqs.weight", (s["head_dim"] // 2,), Q.F32, 0.0, 0.0
    for il in range(L):
        p, swa = f"blk.{il}", s["swa_pattern"][il]
        hd = s["head_dim_swa"] if swa else s["head_dim"]
        F = s.get("layer_n_ff", [s["n_ff"]] * L)[il]
        yield f"{p}.attn_norm.weight", (D,), Q.F32, 0.1, 1.0
        yield f"{p}.attn_q.weight", (H * hd, D), kind("attn_q", il, n_total, D), 0.15, 0.0
        yield f"{p}.attn_q_norm.weight", (hd,), Q.F32, 0.1, 1.0
        if il < first_shared:
            yield f"{p}.attn_k.weight", (Hkv * hd, D), kind("attn_k", il, n_total, D), 0.15, 0.0
            if swa or "v_is_k" not in feats:
                yield f"{p}.attn_v.weight", (Hkv * hd, D), kind("attn_v", il, n_total, D), 0.15, 0.0
            yield f"{p}.attn_k_norm.weight", (hd,), Q.F32, 0.1, 1.0
        yield f"{p}.attn_output.weight", (D, H * hd), kind("attn_output", il, n_total, H * hd), 0.1, 0.0
        yield f"{p}.post_attention_norm.weight", (D,), Q.F32, 0.1, 1.0
        yield f"{p}.ffn_norm.weight", (D,), Q.F32, 0.1, 1.0
        yield f"{p}.ffn_gate.weight", (F, D), kind("ffn_gate", il, n_total, D), 0.15, 0.0
        yield f"{p}.ffn_up.weight", (F, D), kind("ffn_up", il, n_total, D), 0.15, 0.0
        yield f"{p}.ffn_down.weight", (D, F), kind("ffn_down", il, n_total, F), 0.1, 0.0
        yield f"{p}.post_ffw_norm.weight", (D,), Q.F32, 0.1, 1.0
        if P:
            yield f"{p}.inp_gate.weight", (P, D), kind("inp_gate", il, n_total, D), 0.15, 0.0
            yield f"{p}.proj.weight", (D, P), kind("proj", il, n_total, P), 0.15, 0.0
            yield f"{p}.post_norm.weight", (D,), Q.F32, 0.1, 1.0
        if "out_scale" in feats:
            yield f"{p}.layer_output_scale.weight", (1,), Q.F32, 0.2, 1.0


def _gemma4_metadata(w: gguf.GGUFWriter, s: dict) -> None:
    """The keys llama.cpp's gemma4 loader reads beyond the common ones."""
    w.add_key_length_swa(s["head_dim_swa"])
    w.add_value_length_swa(s["head_dim_swa"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_dimension_count_swa(s["head_dim_swa"])
    w.add_rope_freq_base_swa(s["rope_base_swa"])
    w.add_shared_kv_layers(s["shared"])
    w.add_embedding_length_per_layer_input(s["per_layer"])
    if s.get("softcap"):
        w.add_final_logit_softcapping(s["softcap"])


def _plan(s: dict, n_vocab: int, mix: str) -> Iterator[tuple[str, tuple[int, ...], Q, float, float]]:
    """(name, numpy shape, type, scale, offset) of every tensor, in file order."""
    if s["arch"] == "gemma4":
        yield from _plan_gemma4(s, n_vocab, mix)
        return
    D, H, Hkv, hd, F, L = s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"], s["n_layer"]
    n_total = s.get("n_layer_full", L)
    kind = TYPE_MIXES[mix]
    yield "token_embd.weight", (n_vocab, D), kind("token_embd", 0, n_total, D), 0.5, 0.0
    yield "output_norm.weight", (D,), Q.F32, 0.1, 1.0
    if not s["tied"]:
        yield "output.weight", (n_vocab, D), kind("output", 0, n_total, D), 0.2, 0.0
    if "llama3_rope" in s:
        yield "rope_freqs.weight", (hd // 2,), Q.F32, 0.0, 0.0
    for il in range(L):
        p = f"blk.{il}"
        yield f"{p}.attn_norm.weight", (D,), Q.F32, 0.1, 1.0
        yield f"{p}.attn_q.weight", (H * hd, D), kind("attn_q", il, n_total, D), 0.15, 0.0
        yield f"{p}.attn_k.weight", (Hkv * hd, D), kind("attn_k", il, n_total, D), 0.15, 0.0
        yield f"{p}.attn_v.weight", (Hkv * hd, D), kind("attn_v", il, n_total, D), 0.15, 0.0
        if s.get("qkv_bias"):
            yield f"{p}.attn_q.bias", (H * hd,), Q.F32, 0.1, 0.0
            yield f"{p}.attn_k.bias", (Hkv * hd,), Q.F32, 0.1, 0.0
            yield f"{p}.attn_v.bias", (Hkv * hd,), Q.F32, 0.1, 0.0
        if s["arch"] in ("qwen3", "gemma3"):
            yield f"{p}.attn_q_norm.weight", (hd,), Q.F32, 0.1, 1.0
            yield f"{p}.attn_k_norm.weight", (hd,), Q.F32, 0.1, 1.0
        yield f"{p}.attn_output.weight", (D, H * hd), kind("attn_output", il, n_total, H * hd), 0.1, 0.0
        yield f"{p}.ffn_norm.weight", (D,), Q.F32, 0.1, 1.0
        yield f"{p}.ffn_gate.weight", (F, D), kind("ffn_gate", il, n_total, D), 0.15, 0.0
        yield f"{p}.ffn_up.weight", (F, D), kind("ffn_up", il, n_total, D), 0.15, 0.0
        yield f"{p}.ffn_down.weight", (D, F), kind("ffn_down", il, n_total, F), 0.1, 0.0
        if s["arch"] == "gemma3":
            yield f"{p}.post_attention_norm.weight", (D,), Q.F32, 0.1, 1.0
            yield f"{p}.post_ffw_norm.weight", (D,), Q.F32, 0.1, 1.0


def _pad_vocab(tokens: list[str], types: list[int], scores: list[float] | None, n_vocab: int) -> None:
    """Fill a small vocabulary up to the real model's size with unused pieces
    (as real vocabularies carry reserved tokens): same table sizes, same head."""
    if n_vocab < len(tokens):
        raise ValueError(f"vocabulary of {n_vocab} is smaller than the synthetic tokenizer's {len(tokens)}")
    for i in range(n_vocab - len(tokens)):
        tokens.append(f"<unused{i}>")
        types.append(5)
        if scores is not None:
            scores.append(-1e9)


def write_gguf(path: str | Path, spec: dict, mix: str = "tiny", seed: int = 0, name: str | None = None,
               chat_template: str | None = None, context_length: int | None = None,
               tensor_shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """A GGUF with `spec`'s shapes and metadata (SHAPES / REAL entries) and
    random weights in the `mix` tensor types, written tensor by tensor.
    tensor_shapes: tensors written with another shape (numpy order) than the
    architecture gives them (hostile files)."""
    s = spec
    arch = s["arch"]
    rng = np.random.default_rng(seed)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    D, H, Hkv, hd, F, L = s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"], s["n_layer"]
    w.add_name(name or f"tiny-{arch}")
    w.add_context_length(context_length or s.get("context", 256))
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(s.get("layer_n_ff", F))
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(s.get("eps", 1e-6))
    w.add_rope_freq_base(s.get("rope_base", 10000.0 if arch != "gemma3" else 1e6))
    if arch == "gemma4":
        _gemma4_metadata(w, s)
    if "window" in s:
        w.add_sliding_window(s["window"])
        if "swa_pattern" in s:
            w.add_sliding_window_pattern(s["swa_pattern"])
    if s["tokenizer"] == "spm":
        tokens, scores, types, ids = spm_vocab("gemma3" if arch == "gemma4" else arch)
        _pad_vocab(tokens, types, scores, s.get("n_vocab", len(tokens)))
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(ids["bos"])
        w.add_eos_token_id(ids["eos"])
        w.add_unk_token_id(ids["unk"])
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(arch not in ("gemma3", "gemma4"))
    else:
        tokens, types, merges, ids = bpe_vocab()
        _pad_vocab(tokens, types, None, s.get("n_vocab", len(tokens)))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(ids["bos"])
        w.add_eos_token_id(ids["eos"])
        w.add_add_bos_token(True)  # so --tokenize and perplexity have a BOS to put first
    if chat_template:
        w.add_chat_template(chat_template)
    plan = [(t, (tensor_shapes or {}).get(t, shape), *rest) for t, shape, *rest in _plan(s, len(tokens), mix)]
    for tname, shape, kind, _, _ in plan:
        dtype = {Q.F32: np.float32, Q.F16: np.float16}.get(kind, np.uint8)
        raw = dtype is np.uint8
        w.add_tensor_info(tname, _byte_shape(shape, kind) if raw else shape, np.dtype(dtype), _nbytes(shape, kind),
                          raw_dtype=kind if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, shape, kind, scale, offset in plan:
        if tname == "rope_freqs.weight" and arch == "gemma4":
            data = _p_rope_factors(hd, 0.25 if "p_rope" in s["features"] else 1.0)
        elif tname == "rope_freqs.weight":
            r = s["llama3_rope"]
            data = _llama3_rope_factors(hd, s["rope_base"], r["factor"], r["low"], r["high"], r["original"])
        else:
            data = _tensor(rng, shape, kind, scale, offset, direct=mix != "tiny")
        w.write_tensor_data(data)
    w.close()
    return path


def _byte_shape(shape: tuple[int, ...], kind: Q) -> tuple[int, ...]:
    """numpy-order byte shape of a block tensor (rows, bytes per row), as the writer takes raw data."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return shape[:-1] + (shape[-1] // block * size,)


def write_model(path: str | Path, arch: str, seed: int = 0, chat_template: str | None = None,
                context_length: int = 256, tensor_shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """The tiny model of `arch` (SHAPES); tensor_shapes: see write_gguf."""
    return write_gguf(path, {"arch": arch, **SHAPES[arch]}, "tiny", seed, chat_template=chat_template,
                      context_length=context_length, tensor_shapes=tensor_shapes)


def write_gemma4(path: str | Path, variant: str, mix: str = "tiny", seed: int = 0, context_length: int = 256) -> Path:
    """The tiny Gemma 4 model of `variant` (GEMMA4_VARIANTS) in the `mix` tensor types."""
    spec = gemma4_spec(GEMMA4_VARIANTS[variant], **GEMMA4_SHAPES.get(variant, {}))
    return write_gguf(path, spec, mix, seed, name=f"tiny-{variant}-{mix}", context_length=context_length)


def write_real(path: str | Path, model: str, mix: str = "q8_0", layers: int | None = None, seed: int = 0) -> Path:
    """A REAL model's shapes and metadata with random weights, optionally only
    its first `layers` layers (the type mix still follows the full depth)."""
    s = dict({**REAL, **LARGE}[model])
    s["n_layer_full"] = s["n_layer"]
    if layers is not None:
        if not 0 < layers <= s["n_layer"]:
            raise ValueError(f"{model} has {s['n_layer']} layers, cannot keep {layers}")
        s["n_layer"] = layers
        if s["arch"] == "gemma4":  # the first layers: own KV caches, until the full model's shared ones begin
            s["swa_pattern"], s["layer_n_ff"] = s["swa_pattern"][:layers], s["layer_n_ff"][:layers]
            s["shared"] = max(0, layers - (REAL[model]["n_layer"] - REAL[model]["shared"]))
    return write_gguf(path, s, mix, seed, name=f"synthetic-{model}-{mix}" + (f"-{layers}l" if layers else ""))
