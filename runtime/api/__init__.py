"""rkc's Python API: `rkc.load(path)` -> an LlmModel (generate, chat) or an
OnnxModel (run). docs/api.md shows how to use them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rkc.ir.rkbin import Rkbin
    from rkc.runtime.api.llm import LlmModel
    from rkc.runtime.api.onnx import OnnxModel


def load(path: "str | Path | Rkbin", device: str = "auto", cores: int = 3, ctx: int | None = None,
         cache_slots: int = 2, chat_template: str | None = None, warm_up: bool = True) -> "LlmModel | OnnxModel":
    """Open a compiled model. device: auto (the NPU if this machine has one,
    else the simulator), sim or rocket. LLMs only: ctx (context size, default
    the model's), cache_slots (conversations whose KV the prefix cache keeps),
    chat_template (Jinja, replacing the GGUF's or the built-in one), warm_up
    (compile the host kernels now, not in the first request; a line on stderr
    says when they compile: the first run on a machine)."""
    # deferred: `import rkc` stays free of numpy and the runtime; an ONNX model does not load the LLM engine (numba)
    from rkc.ir.rkbin import Rkbin, read_rkbin

    rk = path if isinstance(path, Rkbin) else read_rkbin(path)
    if rk.module.metadata.get("model_kind") == "llm":
        from rkc.runtime.api.llm import LlmModel
        from rkc.runtime.llm.engine import LlmEngine

        engine = LlmEngine(rk, device, cores)
        try:
            if warm_up:
                engine.warm_up(on_compile=lambda: print("rkc: compiling host kernels (first run only)...",
                                                        file=sys.stderr, flush=True))
            return LlmModel(engine, ctx, cache_slots, chat_template)
        except BaseException:
            engine.close()
            raise
    from rkc.runtime.api.onnx import OnnxModel

    return OnnxModel(rk, device, cores)
