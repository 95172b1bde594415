"""Load an LLM rkbin and run its programs (one forward step over a chunk of
tokens). Everything per program is resolved once at load time — kernels,
weight views, step argument lists — so a token costs only the kernels."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ir.errors import FormatError, UnsupportedError
from ir.llm import LlmConfig
from ir.rkbin import Rkbin, read_rkbin
from runtime.llm.kernels import KERNELS
from runtime.llm.kvcache import KVCache
from runtime.llm.tokenizer import LlmTokenizer
from runtime.llm.weights import Int8Weight, Weight

_NUMPY = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}


@dataclass
class _Bound:
    kernel: Any
    args: list[tuple[bool, Any]]  # (is_weight, weight object or value name)
    outputs: list[str]
    attrs: dict[str, Any]


class LlmEngine:
    def __init__(self, source: "str | Path | Rkbin") -> None:
        rk = source if isinstance(source, Rkbin) else read_rkbin(source)
        path = rk.path
        meta = rk.module.metadata
        if meta.get("model_kind") != "llm":
            raise FormatError(f"{path}: not an LLM rkbin")
        self.path = Path(path)
        self.module = rk.module
        self.cfg = LlmConfig.from_dict(meta["llm"])
        self.precision = meta.get("precision")
        self.chunks = sorted(int(c) for c in meta.get("prefill_chunks", [1]))
        self.placement = meta.get("placement", {})
        if "tokenizer" not in rk.blobs:
            raise FormatError(f"{path}: LLM rkbin without a tokenizer")
        self.tokenizer = LlmTokenizer.from_json(bytes(rk.blobs["tokenizer"]).decode())
        self.weights = self._load_weights(rk)
        self.programs = {p.name: self._bind(p) for p in rk.module.programs}

    def _load_weights(self, rk) -> dict[str, Any]:
        blob = rk.blobs[self.module.region("weights").blob]
        raw: dict[str, np.ndarray] = {}
        infos = {t.name: t for t in self.module.tensors if t.region == "weights"}
        for t in infos.values():
            if t.dtype not in _NUMPY:
                raise FormatError(f"{self.path}: weight {t.name} has unsupported dtype {t.dtype}")
            raw[t.name] = blob[t.offset:t.offset + t.nbytes].view(_NUMPY[t.dtype]).reshape(t.shape)
        out: dict[str, Any] = {}
        for name, t in infos.items():
            if t.quant:
                out[name] = Int8Weight(raw[name], raw[t.quant["scale"]])
            elif t.dtype != "int8":
                out[name] = Weight(raw[name])
        return out

    def _bind(self, program) -> list[_Bound]:
        bound = []
        for s in program.steps:
            if s.kind != "cpu":
                raise UnsupportedError(f"{self.path}: NPU steps in LLM programs are not supported by this runtime")
            if s.op not in KERNELS:
                raise FormatError(f"{self.path}: step {s.name!r} uses unknown kernel {s.op!r}")
            args = [(True, self.weights[i]) if i in self.weights else (False, i) for i in s.inputs]
            bound.append(_Bound(KERNELS[s.op], args, s.outputs, s.attrs))
        return bound

    def new_cache(self, n_ctx: int) -> KVCache:
        windows = [self.cfg.swa_window if self.cfg.is_swa(i) else 0 for i in range(self.cfg.n_layer)]
        return KVCache(self.cfg.n_layer, windows, n_ctx)

    def run(self, program: str, tokens: np.ndarray, positions: np.ndarray, cache: KVCache) -> np.ndarray:
        values: dict[str, Any] = {"tokens": np.asarray(tokens, np.int32), "positions": np.asarray(positions, np.int32)}
        for b in self.programs[program]:
            ins = [a if w else values[a] for w, a in b.args]
            for name, v in zip(b.outputs, b.kernel(ins, b.attrs, cache)):
                values[name] = v
        return values["logits"]
