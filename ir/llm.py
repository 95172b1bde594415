"""What a decoder-only LLM is, as data: the hyperparameters read from a GGUF
file's metadata, with the per-architecture traits the metadata leaves implicit.

Shared by the GGUF frontend (to build the graph), the runtime (KV cache sizes,
sliding windows) and the numpy reference in the tests; and the programs of an
LLM rkbin (names, rows, which logits), which the compiler writes into the
metadata and the runtime chooses from. The traits follow
llama.cpp's model definitions (ggml-org/llama.cpp, src/models/{llama,qwen2,
qwen3,gemma3}.cpp and src/llama-model.cpp rope types): facts, restated here.
"""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Iterable, Mapping

from rkc.ir.errors import FormatError, UnsupportedError


@dataclass(frozen=True)
class ArchTraits:
    rope_mode: str  # "norm": rotate adjacent pairs (x0,x1); "neox": rotate (x_i, x_{i+d/2})
    ffn_act: str  # activation of the gate branch: "silu" or "gelu_tanh"
    qk_norm: bool  # per-head RMSNorm of q and k before RoPE
    post_norms: bool  # RMSNorm after attention and after the FFN (Gemma 2/3)
    embed_scale: bool  # embeddings multiplied by sqrt(n_embd) (Gemma)
    swa_pattern: int = 0  # every n-th layer is global, the others use the sliding window
    rope_base_swa: float = 10000.0  # RoPE base of sliding-window layers
    # Gemma 4: per-layer head sizes / FFN widths / RoPE dims (sliding vs full
    # layers), KV sharing, per-layer embeddings, V RMS-normed, q.k unscaled
    per_layer: bool = False


ARCH_TRAITS: dict[str, ArchTraits] = {
    "llama": ArchTraits(rope_mode="norm", ffn_act="silu", qk_norm=False, post_norms=False, embed_scale=False),
    "qwen2": ArchTraits(rope_mode="neox", ffn_act="silu", qk_norm=False, post_norms=False, embed_scale=False),
    "qwen3": ArchTraits(rope_mode="neox", ffn_act="silu", qk_norm=True, post_norms=False, embed_scale=False),
    "gemma3": ArchTraits(rope_mode="neox", ffn_act="gelu_tanh", qk_norm=True, post_norms=True, embed_scale=True,
                         swa_pattern=6),
    "gemma4": ArchTraits(rope_mode="neox", ffn_act="gelu_tanh", qk_norm=True, post_norms=True, embed_scale=True,
                         per_layer=True),
}


@dataclass(frozen=True)
class LlmConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key/query head size
    head_dim_v: int
    n_ff: int
    n_vocab: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_scale: float  # position multiplier of global layers (1 / linear scaling factor)
    rope_dims: int  # leading dimensions of each head that RoPE rotates
    rope_mode: str
    ffn_act: str
    qk_norm: bool
    post_norms: bool
    embed_scale: float  # 1.0 when the architecture does not scale
    attn_scale: float  # multiplies q.k
    swa_window: int  # 0: no sliding window
    swa_layers: tuple[bool, ...] = field(default_factory=tuple)
    rope_base_swa: float = 10000.0
    logit_softcap: float = 0.0
    # per layer (empty: every layer has the uniform value above); Gemma 4
    layer_n_head: tuple[int, ...] = ()
    layer_n_head_kv: tuple[int, ...] = ()
    layer_head_dim: tuple[int, ...] = ()  # K = V head size
    layer_n_ff: tuple[int, ...] = ()
    layer_rope_dims: tuple[int, ...] = ()
    kv_source: tuple[int, ...] = ()  # the layer whose KV cache each layer attends over (itself unless shared)
    n_embd_per_layer: int = 0  # width of each layer's per-layer embedding (0: none)
    v_norm: bool = False  # V RMS-normed (no weight) before the cache

    @property
    def traits(self) -> ArchTraits:
        return ARCH_TRAITS[self.arch]

    def n_head_of(self, layer: int) -> int:
        return self.layer_n_head[layer] if self.layer_n_head else self.n_head

    def n_head_kv_of(self, layer: int) -> int:
        return self.layer_n_head_kv[layer] if self.layer_n_head_kv else self.n_head_kv

    def head_dim_of(self, layer: int) -> tuple[int, int]:
        """(key/query, value) head size of `layer`."""
        if self.layer_head_dim:
            return self.layer_head_dim[layer], self.layer_head_dim[layer]
        return self.head_dim, self.head_dim_v

    def n_ff_of(self, layer: int) -> int:
        return self.layer_n_ff[layer] if self.layer_n_ff else self.n_ff

    def rope_dims_of(self, layer: int) -> int:
        return self.layer_rope_dims[layer] if self.layer_rope_dims else self.rope_dims

    def kv_layer(self, layer: int) -> int:
        """The layer whose KV cache `layer` reads (itself unless it shares an earlier one's)."""
        return self.kv_source[layer] if self.kv_source else layer

    def cache_windows(self) -> list[int]:
        """Per layer, the sliding window its KV cache keeps (0: all of it, or
        nothing at all for a layer that reads an earlier layer's cache)."""
        return [self.swa_window if self.is_swa(i) and self.kv_layer(i) == i else 0 for i in range(self.n_layer)]

    def is_swa(self, layer: int) -> bool:
        return bool(self.swa_window) and bool(self.swa_layers[layer])

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(base, position scale) of RoPE in `layer`."""
        if self.is_swa(layer):
            return self.rope_base_swa, 1.0
        return self.rope_base, self.rope_scale

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["swa_layers"] = [int(x) for x in self.swa_layers]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Any, where: str = "metadata \"llm\"") -> "LlmConfig":
        """The description an LLM rkbin carries, every field's type and range checked
        (the runtime sizes its KV cache and RoPE tables from it)."""
        if not isinstance(d, Mapping):
            raise FormatError(f"{where}: expected an object, got {type(d).__name__}")
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(d) - set(names))
        missing = [n for n, f in names.items() if n not in d and f.default is MISSING and f.default_factory is MISSING]
        if unknown or missing:
            raise FormatError(f"{where}: {'unknown' if unknown else 'missing'} field {(unknown or missing)[0]!r}")
        hints = typing.get_type_hints(cls)
        values = {name: _config_value(f"{where}.{name}", hints[name], value) for name, value in d.items()}
        cfg = cls(**values)
        problem = cfg._problem()
        if problem:
            raise FormatError(f"{where}: {problem}")
        return cfg

    def _problem(self) -> str | None:
        if self.arch not in ARCH_TRAITS:
            return f"unknown architecture {self.arch!r:.40}"
        if self.n_layer > INT_RANGES["block_count"][1]:
            return f"n_layer = {self.n_layer} is more than {INT_RANGES['block_count'][1]}"
        if min(self.n_embd, self.n_head, self.n_head_kv, self.head_dim, self.head_dim_v, self.n_vocab) < 1:
            return "a size (n_embd, heads, head dims, n_vocab) is 0"
        if self.n_head % self.n_head_kv:
            return f"{self.n_head} heads do not share {self.n_head_kv} KV heads evenly"
        if self.swa_window and len(self.swa_layers) != self.n_layer:
            return f"swa_layers names {len(self.swa_layers)} layers, not n_layer = {self.n_layer}"
        if self.rope_mode not in ("norm", "neox") or self.ffn_act not in ("silu", "gelu_tanh"):
            return f"rope_mode {self.rope_mode!r:.20} / ffn_act {self.ffn_act!r:.20} unknown"
        return self._per_layer_problem()

    def _per_layer_problem(self) -> str | None:
        """The per-layer arrays (Gemma 4): empty or one value per layer, sizes
        >= 1, heads sharing KV heads evenly, a KV source no later than its layer."""
        for name in ("layer_n_head", "layer_n_head_kv", "layer_head_dim", "layer_n_ff", "layer_rope_dims", "kv_source"):
            values = getattr(self, name)
            if values and len(values) != self.n_layer:
                return f"{name} names {len(values)} layers, not n_layer = {self.n_layer}"
        for layer in range(self.n_layer if any((self.layer_n_head, self.layer_n_head_kv, self.kv_source)) else 0):
            heads, kv_heads, (dim, _) = self.n_head_of(layer), self.n_head_kv_of(layer), self.head_dim_of(layer)
            if min(heads, kv_heads, dim, self.n_ff_of(layer)) < 1 or heads % kv_heads:
                return f"layer {layer}: {heads} heads, {kv_heads} KV heads, head size {dim}: not a valid attention"
            if not 0 <= self.kv_layer(layer) <= layer or self.rope_dims_of(layer) > dim:
                return f"layer {layer}: KV source {self.kv_layer(layer)} / RoPE dims {self.rope_dims_of(layer)} invalid"
        return None


# (lowest, highest) of each integer hyperparameter: past these no model exists
# and sizes computed from them (KV cache, RoPE tables) would not fit memory
INT_RANGES: dict[str, tuple[int, int]] = {
    "block_count": (0, 1024),  # 0: embeddings straight to the head (the tests' smallest model)
    "embedding_length": (1, 1 << 16), "attention.head_count": (1, 1024),
    "attention.head_count_kv": (1, 1024), "attention.key_length": (1, 1024), "attention.value_length": (1, 1024),
    "feed_forward_length": (1, 1 << 18), "context_length": (1, 1 << 21), "rope.dimension_count": (1, 1024),
    "attention.sliding_window": (0, 1 << 21),
    "attention.key_length_swa": (1, 1024), "attention.value_length_swa": (1, 1024),
    "rope.dimension_count_swa": (1, 1024),
}
TOKEN_ID_KEYS = ("bos", "eos", "eot", "unknown", "padding", "separator")


def _config_value(where: str, tp: Any, value: Any) -> Any:
    """One LlmConfig field from JSON: ints in [0, 2^31), finite numbers, strings, flags."""
    if tp is bool:
        if not isinstance(value, bool):
            raise FormatError(f"{where}: expected true/false, got {value!r:.40}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
            raise FormatError(f"{where}: expected an integer in [0, 2^31), got {value!r:.40}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise FormatError(f"{where}: expected a finite number, got {value!r:.40}")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise FormatError(f"{where}: expected a string, got {value!r:.40}")
    elif typing.get_args(tp)[0] is bool:  # swa_layers: a flag per layer (written as 0/1)
        if not isinstance(value, list) or not all(v in (0, 1) for v in value) or len(value) > 1 << 16:
            raise FormatError(f"{where}: expected a list of 0/1 flags")
        value = tuple(bool(v) for v in value)
    else:  # a per-layer integer array (Gemma 4)
        if not isinstance(value, list) or len(value) > 1 << 16:
            raise FormatError(f"{where}: expected a list of integers, one per layer")
        value = tuple(_config_value(f"{where}[{i}]", int, v) for i, v in enumerate(value))
    return value


def _checked_int(path: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{path}: {key} is {value!r:.40}, not an integer")
    lo, hi = INT_RANGES[key.split(".", 1)[1]]
    if not lo <= value <= hi:
        raise FormatError(f"{path}: {key} = {value} is outside {lo}..{hi}")
    return value


def _checked_float(path: str, key: str, value: Any, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FormatError(f"{path}: {key} is {value!r:.40}, not a number")
    value = float(value)
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        raise FormatError(f"{path}: {key} = {value} must be finite and {'> 0' if positive else '>= 0'}")
    return value


def check_token_ids(kv: Mapping[str, Any], n_vocab: int, path: str = "model") -> None:
    """The tokenizer's special token ids are integers naming tokens of the vocabulary."""
    for name in TOKEN_ID_KEYS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in kv:
            value = kv[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_vocab:
                raise FormatError(f"{path}: {key} = {value!r:.40} is not a token id (vocabulary of {n_vocab})")


def config_from_gguf(kv: Mapping[str, Any], n_vocab: int, path: str = "model") -> LlmConfig:
    """Build the config from GGUF key/values (plain Python values), every
    hyperparameter checked for type, range and agreement with the others."""
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCH_TRAITS:
        raise UnsupportedError(f"{path}: architecture {arch!r} is not supported "
                               f"(supported: {', '.join(ARCH_TRAITS)})")
    traits = ARCH_TRAITS[arch]

    def raw(key: str, default: Any = None) -> Any:
        full = f"{arch}.{key}"
        if full in kv:
            return kv[full]
        if default is None:
            raise FormatError(f"{path}: GGUF metadata lacks {full}")
        return default

    def get(key: str, default: Any = None) -> int:
        value = raw(key, default)
        if isinstance(value, list) and traits.per_layer and value:
            value = max(value)  # the uniform field is the widest; the per-layer ones come after
        if isinstance(value, list):  # per-layer list: rkc needs it uniform
            if not value or len({repr(v) for v in value}) != 1:
                raise UnsupportedError(f"{path}: per-layer values of {arch}.{key} are not supported")
            value = value[0]
        return _checked_int(path, f"{arch}.{key}", value)

    def number(key: str, default: float, positive: bool = True) -> float:
        full = f"{arch}.{key}"
        return _checked_float(path, full, kv.get(full, default), positive)

    n_embd = get("embedding_length")
    n_head = get("attention.head_count")
    n_layer = get("block_count")
    n_head_kv = get("attention.head_count_kv", n_head)
    if n_head_kv > n_head or n_head % n_head_kv:
        raise FormatError(f"{path}: {n_head_kv} KV heads do not divide the {n_head} attention heads")
    head_dim = get("attention.key_length", max(n_embd // n_head, 1))
    head_dim_v = get("attention.value_length", head_dim)
    n_ff = get("feed_forward_length")
    rope_dims = get("rope.dimension_count", head_dim)
    if rope_dims > head_dim or rope_dims % 2:
        raise FormatError(f"{path}: RoPE rotates {rope_dims} dimensions of a {head_dim}-wide head (must be even, "
                          "at most the head)")
    check_token_ids(kv, n_vocab, path)
    scaling = kv.get(f"{arch}.rope.scaling.type", "none")
    factor = kv.get(f"{arch}.rope.scaling.factor", 1.0)
    factor = _checked_float(path, f"{arch}.rope.scaling.factor", factor, positive=False) or 1.0
    if scaling not in ("none", "linear") and factor != 1.0:
        raise UnsupportedError(f"{path}: RoPE scaling {scaling!r} is not supported")
    window = get("attention.sliding_window", 0) if f"{arch}.attention.sliding_window" in kv else 0
    swa_layers: tuple[bool, ...] = ()
    per_layer: dict[str, Any] = {}
    if traits.per_layer:
        per_layer = _per_layer_fields(kv, arch, n_layer, path)
        swa_layers = per_layer.pop("swa_layers") if window else ()
    elif window and traits.swa_pattern:
        pattern = kv.get(f"{arch}.attention.sliding_window_pattern", traits.swa_pattern)
        if isinstance(pattern, list):
            swa_layers = tuple(bool(x) for x in pattern)
        else:
            # llama.cpp set_swa_pattern: layer il slides unless il % n == n - 1
            # a period longer than the model is legal (a model cut to its first layers)
            if isinstance(pattern, bool) or not isinstance(pattern, int) or not 0 <= pattern < 2 ** 31:
                raise FormatError(f"{path}: {arch}.attention.sliding_window_pattern is {pattern!r:.40}")
            n = pattern
            swa_layers = tuple(n == 0 or (il % n) < n - 1 for il in range(n_layer))
    elif window:
        window = 0  # the architecture has no sliding-window layers in llama.cpp
    if swa_layers and len(swa_layers) != n_layer:
        raise FormatError(f"{path}: sliding-window pattern has {len(swa_layers)} entries for {n_layer} layers")
    if traits.per_layer:
        attn_scale = 1.0  # llama.cpp gemma4: q.k unscaled (the q/k norms set the scale)
    elif arch == "gemma3":
        # llama.cpp gemma3.cpp: 1/sqrt(n_embd/n_head) for the 62-layer (27B) model, else 1/sqrt(head_dim)
        attn_scale = 1.0 / math.sqrt(n_embd / n_head if n_layer == 62 else head_dim)
    else:
        attn_scale = 1.0 / math.sqrt(head_dim)
    return LlmConfig(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=int(n_head_kv),
        head_dim=head_dim, head_dim_v=head_dim_v, n_ff=n_ff, n_vocab=n_vocab,
        context_length=get("context_length", 2048),
        rms_eps=number("attention.layer_norm_rms_epsilon", 1e-5),
        rope_base=number("rope.freq_base", 10000.0),
        rope_scale=1.0 / factor,
        rope_dims=rope_dims,
        rope_mode=traits.rope_mode, ffn_act=traits.ffn_act, qk_norm=traits.qk_norm,
        post_norms=traits.post_norms,
        embed_scale=math.sqrt(n_embd) if traits.embed_scale else 1.0,
        attn_scale=attn_scale, swa_window=window, swa_layers=swa_layers,
        rope_base_swa=number("rope.freq_base_swa", traits.rope_base_swa),
        # absent from a gemma4 file, llama.cpp's hparams default of 30 applies
        logit_softcap=number("final_logit_softcapping", 30.0 if traits.per_layer else 0.0, positive=False),
        **per_layer,
    )


def _per_layer_fields(kv: Mapping[str, Any], arch: str, n_layer: int, path: str) -> dict[str, Any]:
    """Gemma 4's per-layer hyperparameters (llama.cpp llama_model_gemma4
    load_arch_hparams and its llama_hparams): sliding layers take the *_swa
    head size and RoPE dims, full layers the plain ones; head counts and FFN
    widths may be per-layer arrays; the last shared_kv_layers layers read the
    KV cache of a fixed earlier layer (llama.cpp's reuse rule, below)."""
    def key(name: str) -> str:
        return f"{arch}.{name}"

    experts = kv.get(key("expert_count"), 0)
    if experts:
        raise UnsupportedError(f"{path}: {arch} mixture-of-experts ({experts!r:.20} experts) is not supported")

    def layers(name: str, default: Any = None) -> tuple[int, ...]:
        value = kv.get(key(name), default)
        if value is None:
            raise FormatError(f"{path}: GGUF metadata lacks {key(name)}")
        values = value if isinstance(value, list) else [value] * n_layer
        if len(values) != n_layer:
            raise FormatError(f"{path}: {key(name)} has {len(values)} entries for {n_layer} layers")
        return tuple(_checked_int(path, key(name), v) for v in values)

    pattern = kv.get(key("attention.sliding_window_pattern"), False)
    pattern = pattern if isinstance(pattern, list) else [pattern] * n_layer  # llama.cpp get_key_or_arr
    if len(pattern) != n_layer or any(not isinstance(p, (bool, int)) for p in pattern):
        raise FormatError(f"{path}: {key('attention.sliding_window_pattern')} is not one flag per layer")
    swa = tuple(bool(p) for p in pattern)

    def scalar(name: str, default: Any = None) -> int:
        value = kv.get(key(name), default)
        if value is None:
            raise FormatError(f"{path}: GGUF metadata lacks {key(name)}")
        return _checked_int(path, key(name), value)

    hd_full, hd_swa = scalar("attention.key_length"), scalar("attention.key_length_swa")
    if scalar("attention.value_length", hd_full) != hd_full or scalar("attention.value_length_swa", hd_swa) != hd_swa:
        raise UnsupportedError(f"{path}: {arch} needs value heads the size of key heads (llama.cpp requires it)")
    rot_full, rot_swa = scalar("rope.dimension_count", hd_full), scalar("rope.dimension_count_swa", hd_swa)
    head_dim = tuple(hd_swa if s else hd_full for s in swa)
    rope_dims = tuple(rot_swa if s else rot_full for s in swa)
    for il, (hd, rd) in enumerate(zip(head_dim, rope_dims)):
        if rd > hd or rd % 2:
            raise FormatError(f"{path}: layer {il}: RoPE rotates {rd} dimensions of a {hd}-wide head")
    n_head = layers("attention.head_count")
    n_head_kv = layers("attention.head_count_kv", kv.get(key("attention.head_count")))
    for il, (h, hkv) in enumerate(zip(n_head, n_head_kv)):
        if hkv > h or h % hkv:
            raise FormatError(f"{path}: layer {il}: {hkv} KV heads do not divide the {h} attention heads")
    shared = kv.get(key("attention.shared_kv_layers"), 0)
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < max(n_layer, 1):
        raise FormatError(f"{path}: {key('attention.shared_kv_layers')} = {shared!r:.20} (of {n_layer} layers)")
    first_shared = n_layer - shared
    # llama.cpp's KV reuse (llama-model.cpp, the gemma3n/gemma4 layer_reuse_cb):
    # a shared sliding layer reads layer first_shared - 2, a shared full layer
    # first_shared - 1, whatever kind those are; not the last earlier layer of
    # its own kind (Hugging Face's rule), which differs when the layers before
    # the shared ones do not end sliding, full (tests/llm/test_gemma4.py
    # gemma4-kv-rule pins it against the installed llama.cpp)
    source = [il if il < first_shared else first_shared - (2 if swa[il] else 1) for il in range(n_layer)]
    for il, src in enumerate(source):
        if src < 0 or swa[src] != swa[il]:
            raise FormatError(f"{path}: layer {il} would read layer {src}'s KV cache, which is not of its kind "
                              f"(sliding / full) or does not exist")
        if head_dim[src] != head_dim[il] or n_head_kv[src] != n_head_kv[il]:
            raise FormatError(f"{path}: layer {il} reads layer {src}'s KV cache, whose heads differ")
    per_layer_embd = kv.get(key("embedding_length_per_layer_input"), 0)
    if isinstance(per_layer_embd, bool) or not isinstance(per_layer_embd, int) or not 0 <= per_layer_embd <= 1 << 16:
        raise FormatError(f"{path}: {key('embedding_length_per_layer_input')} = {per_layer_embd!r:.20}")
    return dict(swa_layers=swa, layer_n_head=n_head, layer_n_head_kv=n_head_kv, layer_head_dim=head_dim,
                layer_n_ff=layers("feed_forward_length"), layer_rope_dims=rope_dims, kv_source=tuple(source),
                n_embd_per_layer=per_layer_embd, v_norm=True)


# -- the programs of an LLM rkbin -------------------------------------------------------
DECODE = "decode"  # one token; its logits


@dataclass(frozen=True)
class LlmProgram:
    """One program of an LLM rkbin: it takes `rows` tokens a run; with
    `last_row_only` only the last row reaches the head (prefill: the next token),
    else every row's logits come back (decode, score: perplexity)."""

    name: str
    rows: int
    last_row_only: bool
    npu_s: float | None = field(default=None, compare=False)  # modelled NPU seconds a run (None: not recorded)

    def metadata(self) -> dict[str, Any]:
        """Its entry in the rkbin's metadata["programs"]."""
        entry: dict[str, Any] = {"rows": self.rows, "last_row_only": self.last_row_only}
        if self.npu_s is not None:
            entry["modelled_npu_s"] = self.npu_s
        return entry

    def tensor(self, name: str) -> str:
        """The program's own copy of graph value `name` (constants are shared)."""
        return f"{self.name}/{name}"


def program_plan(chunks: Iterable[int]) -> list[LlmProgram]:
    """Every program of a file built for prefill chunk sizes `chunks`: decode,
    then prefill_C and score_C for each C > 1."""
    plan = [LlmProgram(DECODE, 1, False)]
    for c in sorted(set(chunks)):
        if c > 1:
            plan += [LlmProgram(f"prefill_{c}", c, True), LlmProgram(f"score_{c}", c, False)]
    return plan


def programs_in(metadata: Mapping[str, Any], path: str = "rkbin") -> dict[str, LlmProgram]:
    """The program table the compiler wrote into an LLM rkbin's metadata."""
    table = metadata.get("programs")
    try:
        programs = {name: LlmProgram(name, int(p["rows"]), bool(p["last_row_only"]),
                                     float(p["modelled_npu_s"]) if p.get("modelled_npu_s") is not None else None)
                    for name, p in table.items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        raise FormatError(f"{path}: LLM rkbin without a valid program table (metadata \"programs\")") from None
    if DECODE not in programs:
        raise FormatError(f"{path}: LLM rkbin without a {DECODE!r} program")
    return programs


def choose_program(programs: Mapping[str, LlmProgram], rows: int, all_logits: bool) -> LlmProgram:
    """The program that runs a chunk of `rows` tokens, returning every row's
    logits or only the last one's (one token: decode, whose one row is both)."""
    for p in programs.values():
        if p.rows == rows and (rows == 1 or p.last_row_only != all_logits):
            return p
    raise FormatError(f"the rkbin has no {rows}-token program returning {'every row' if all_logits else 'the last row'}")
