"""Prefill attention: the host's products (runtime/llm/prefill_attention.py,
today's path) against attention's products on the NPU
(compiler/llm/npu_attention.py: the two fp16 GEMMs per KV head, modelled by
ir/npu/perf.py) with the host's remaining work (runtime/llm/npu_attention.py:
the chunk's queries and new cache rows written in the products' layouts, the
softmax into the probabilities, the output read back), per model shape and
chunk, a chunk at position 0, every layer. Host figures are this process's
CPU seconds (the threads' included: the machine is shared, wall time is
not the host's), the fastest of --repeat; the modelled NPU time is the
products' alone (two submissions a layer). Also the compiler's choice
(`npu_attention.on_npu`: modelled NPU time against the host at its peak).

    python bench/prefill_attention.py [--chunks 32 128 512] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rkc.compiler.llm.npu_attention import (HOST_PEAK_FLOPS, AttentionShape, host_product_macs,
                                            modelled_seconds, on_npu)
from rkc.runtime import blas
from rkc.runtime.llm import npu_attention as host
from rkc.runtime.llm.prefill_attention import attend_blocks

# (name, layers, query heads, kv heads, head dim): the shapes of bench/llm.py's models
MODELS = [("Qwen2.5-1.5B", 28, 12, 2, 128), ("Gemma 3 270M", 18, 4, 1, 256), ("Gemma 3 1B", 26, 4, 1, 256)]


def _best(run, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    return best


def measure(layers: int, heads: int, kv_heads: int, head_dim: int, rows: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    g = heads // kv_heads
    slots = max(host.KEY_ALIGN, -(-rows // host.KEY_ALIGN) * host.KEY_ALIGN)
    shape = AttentionShape(rows, g, head_dim, head_dim, slots)
    q = rng.standard_normal((rows, heads, head_dim), np.float32)
    k = rng.standard_normal((rows, kv_heads, head_dim), np.float32).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((rows, kv_heads, head_dim), np.float32).astype(np.float16).astype(np.float32)
    pos = np.arange(rows)
    out = np.empty((rows, heads * head_dim), np.float32)

    def cpu() -> None:
        attend_blocks(q, k, v, pos, pos, np.float32(head_dim ** -0.5), 0, out)

    m = shape.query_rows
    k_elems, v_elems = host.cache_elements(slots, head_dim, head_dim)
    cache = host.LayerCache([np.zeros(k_elems, np.float16) for _ in range(kv_heads)],
                            [np.zeros(v_elems, np.float16) for _ in range(kv_heads)], slots, head_dim, head_dim)
    qf = [np.zeros(head_dim * host.feature_rows(m), np.float16) for _ in range(kv_heads)]
    scores = [rng.standard_normal(slots * host.feature_rows(m), np.float32) for _ in range(kv_heads)]
    probs = [np.zeros(host.probs_elements(m, slots), np.uint16) for _ in range(kv_heads)]
    o = [rng.standard_normal(-(-m // 4) * 4 * host.feature_rows(head_dim), np.float32) for _ in range(kv_heads)]
    qpos = np.repeat(pos, g)

    def npu_host() -> None:
        cache.store(k, v, pos)  # before the scores: the new keys and values, the queries
        for h in range(kv_heads):
            host.write_queries(q, h * g, g, qf[h])
        for h in range(kv_heads):  # between the products
            host.softmax_into_probs(scores[h], probs[h], slots, cache.covered(slots), qpos, head_dim ** -0.5)
        for h in range(kv_heads):  # after the values
            out.reshape(rows, kv_heads, g * head_dim)[:, h] = \
                host.read_output(o[h], m, head_dim).reshape(rows, g * head_dim)

    cpu_s, npu_host_s = _best(cpu, repeat), _best(npu_host, repeat)
    npu_s = modelled_seconds(shape, kv_heads)
    return {"rows": rows, "slots": slots, "host_products_ms": 1e3 * layers * cpu_s,
            "npu_path_host_ms": 1e3 * layers * npu_host_s, "npu_products_modelled_ms": 1e3 * layers * npu_s,
            "host_peak_products_ms": 1e3 * layers * 2 * host_product_macs(shape, kv_heads) / HOST_PEAK_FLOPS,
            "chosen": "npu" if on_npu(shape, kv_heads) else "host"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = []
    with blas.one_thread():  # as the plans run host kernels (runtime/blas.py)
        for name, layers, heads, kv_heads, head_dim in MODELS:
            for rows in args.chunks:
                results.append({"model": name, **measure(layers, heads, kv_heads, head_dim, rows, args.repeat)})
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print("| model (all layers, chunk at position 0) | chunk | host attention today, CPU ms | NPU path: host CPU ms "
          "| + modelled NPU ms | host saved - NPU added, ms | chosen |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        gain = r["host_products_ms"] - r["npu_path_host_ms"] - r["npu_products_modelled_ms"]
        print(f"| {r['model']} | {r['rows']} | {r['host_products_ms']:.1f} | {r['npu_path_host_ms']:.1f} | "
              f"{r['npu_products_modelled_ms']:.2f} | {gain:+.1f} | {r['chosen']} |")


if __name__ == "__main__":
    main()
