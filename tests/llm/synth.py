"""Tiny synthetic GGUF LLMs, one per supported architecture, written with
gguf.GGUFWriter: random weights in every supported tensor type, and a small
tokenizer of the kind the real models of that architecture use (SentencePiece
for llama/gemma3, GPT-2 byte-level BPE for qwen2/qwen3)."""

from __future__ import annotations

from pathlib import Path

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


def _add(writer: gguf.GGUFWriter, rng: np.random.Generator, name: str, shape: tuple[int, int] | tuple[int],
         kind: Q, scale: float = 0.1, offset: float = 0.0) -> None:
    if kind in (Q.Q4_K, Q.Q6_K):
        writer.add_tensor(name, _k_quant_blocks(rng, shape[0], shape[1], kind), raw_dtype=kind)
        return
    data = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
    if kind == Q.F32:
        writer.add_tensor(name, data)
    elif kind == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)


# ChatML, the template of the Qwen models (their BPE vocabulary has its markers)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_model(path: str | Path, arch: str, seed: int = 0, chat_template: str | None = None,
                context_length: int = 256) -> Path:
    s = SHAPES[arch]
    rng = np.random.default_rng(seed)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    D, H, Hkv, hd, F, L = s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"], s["n_layer"]
    w.add_name(f"tiny-{arch}")
    w.add_context_length(context_length)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0 if arch != "gemma3" else 1e6)
    if "window" in s:
        w.add_sliding_window(s["window"])
        w.add_sliding_window_pattern(s["swa_pattern"])
    if s["tokenizer"] == "spm":
        tokens, scores, types, ids = spm_vocab(arch)
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
        w.add_add_space_prefix(arch != "gemma3")
    else:
        tokens, types, merges, ids = bpe_vocab()
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
    V = len(tokens)
    _add(w, rng, "token_embd.weight", (V, D), Q.Q8_0, scale=0.5)
    _add(w, rng, "output_norm.weight", (D,), Q.F32, 0.1, 1.0)
    if not s["tied"]:
        _add(w, rng, "output.weight", (V, D), Q.F16, scale=0.2)
    down_types = [Q.Q6_K, Q.Q4_K]
    for il in range(L):
        p = f"blk.{il}"
        _add(w, rng, f"{p}.attn_norm.weight", (D,), Q.F32, 0.1, 1.0)
        _add(w, rng, f"{p}.attn_q.weight", (H * hd, D), Q.Q5_0, 0.15)
        _add(w, rng, f"{p}.attn_k.weight", (Hkv * hd, D), Q.Q5_0, 0.15)
        _add(w, rng, f"{p}.attn_v.weight", (Hkv * hd, D), Q.Q4_0, 0.15)
        if s.get("qkv_bias"):
            _add(w, rng, f"{p}.attn_q.bias", (H * hd,), Q.F32, 0.1)
            _add(w, rng, f"{p}.attn_k.bias", (Hkv * hd,), Q.F32, 0.1)
            _add(w, rng, f"{p}.attn_v.bias", (Hkv * hd,), Q.F32, 0.1)
        if arch in ("qwen3", "gemma3"):
            _add(w, rng, f"{p}.attn_q_norm.weight", (hd,), Q.F32, 0.1, 1.0)
            _add(w, rng, f"{p}.attn_k_norm.weight", (hd,), Q.F32, 0.1, 1.0)
        _add(w, rng, f"{p}.attn_output.weight", (D, H * hd), Q.F16, 0.1)
        _add(w, rng, f"{p}.ffn_norm.weight", (D,), Q.F32, 0.1, 1.0)
        _add(w, rng, f"{p}.ffn_gate.weight", (F, D), Q.BF16 if il % 2 else Q.Q8_0, 0.15)
        _add(w, rng, f"{p}.ffn_up.weight", (F, D), Q.Q4_0, 0.15)
        _add(w, rng, f"{p}.ffn_down.weight", (D, F), down_types[il % 2])
        if arch == "gemma3":
            _add(w, rng, f"{p}.post_attention_norm.weight", (D,), Q.F32, 0.1, 1.0)
            _add(w, rng, f"{p}.post_ffw_norm.weight", (D,), Q.F32, 0.1, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
