"""Gemma 4 E2B on the modelled NPU: a synthetic GGUF with E2B's exact widths
(tests/llm/synth.py REAL["gemma-4-e2b"], random Q8_0 weights, made here and
deleted, never committed), compiled by `rkc compile --precision int8` in a
child process (time, peak RSS), its modelled decode and prefill-512 figures
(compiler/llm/report.py, what `rkc inspect --json` prints) beside

* the seed report's measured llama.cpp-over-rocket figures (gemma-4-E2B-it-Q8_0,
  RK3588 at 1 GHz: pp512 46.7 t/s, tg128 6.5 t/s; the vendor stack 51.4 / 8.3),
* the vendor's RKLLM (rknn-llm doc/benchmark.md v1.3.0: Gemma4 E2B 11.12 t/s
  decode, 599 ms to the first token),
* the DRAM roofline: the bytes of the weights a decoded token must read / 25 GB/s.

The machine is shared, so the model is a miniature with one layer of each of
E2B's four kinds: sliding and full layers with their own KV cache, and sliding
and full layers reading an earlier layer's cache (double-wide FFN). Full-depth
figures are EXTRAPOLATED as head + sum over kinds of (E2B's count of the kind x
the compiled layer of the kind), and say so; the per-layer embeddings'
projection (layer 0's segment) is compiled at the miniature's 4 layers, its
other 31 layers' bytes added at the DRAM rate. --layers full compiles all 35
layers (a ~5 GB GGUF in the temporary directory, deleted after; ~5 min CPU):
then nothing is extrapolated.

    python bench/gemma4_e2b.py [--layers mini|full] [--json out.json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the llm test package (a namespace package) instead of bench/, whose llm.py would shadow it
sys.path[:] = [str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from llm.synth import REAL, write_gguf, write_real  # noqa: E402
from rkc.compiler.llm.report import MODEL, figures, phase  # noqa: E402
from rkc.ir.atomic import write_atomic  # noqa: E402
from rkc.ir.rkbin import read_rkbin  # noqa: E402

MODEL_NAME = "gemma-4-e2b"
SEED = {"pp512": 46.7, "tg": 6.5, "vendor_pp512": 51.4, "vendor_tg": 8.3}  # ../shared/seeds/000_719362e6a1b833e0.txt
_spec = importlib.util.spec_from_file_location("published", ROOT / "bench" / "published.py")
_published = sys.modules["published"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(_published)
RKLLM = {"tg": _published.BY_KEY["rkllm_gemma4_e2b_decode"].value,  # rknn-llm doc/benchmark.md v1.3.0
         "ttft_ms": _published.BY_KEY["rkllm_gemma4_e2b_ttft"].value}
# the miniature's layers: (sliding?, reads an earlier layer's cache?) -> E2B's count of such layers
KINDS = {(True, False): "own sliding", (False, False): "own full", (True, True): "shared sliding",
         (False, True): "shared full"}


def e2b_counts(spec: dict) -> dict[str, int]:
    first_shared = spec["n_layer"] - spec["shared"]
    counts = {k: 0 for k in KINDS.values()}
    for il, swa in enumerate(spec["swa_pattern"]):
        counts[KINDS[swa, il >= first_shared]] += 1
    return counts


def miniature(spec: dict) -> dict:
    """E2B's widths, 4 layers: own sliding, own full, shared sliding, shared full."""
    s = dict(spec, n_layer=4, swa_pattern=[True, False, True, False], shared=2)
    s["layer_n_ff"] = [spec["n_ff"]] * 2 + [2 * spec["n_ff"]] * 2
    return s


def weight_bytes_per_token(spec: dict) -> int:
    """int8 bytes of every matrix a decoded token multiplies by (the head
    included; the gathered tables' rows are read on the CPU, a few KB)."""
    D, H, Hkv, P, L = spec["n_embd"], spec["n_head"], spec["n_head_kv"], spec["per_layer"], spec["n_layer"]
    first_shared = L - spec["shared"]
    total = spec["n_vocab"] * D + L * P * D  # head, per-layer projection
    for il, swa in enumerate(spec["swa_pattern"]):
        hd = spec["head_dim_swa"] if swa else spec["head_dim"]
        total += 2 * D * H * hd + 3 * D * spec["layer_n_ff"][il] + 2 * D * P  # q, o, FFN, gate, proj
        if il < first_shared:
            total += 2 * D * Hkv * hd  # k, v
    return total


def extrapolated(per_layer: dict, key: str, counts: dict[str, int]) -> float:
    kinds = list(KINDS.values())
    rest = sum(v[key] for k, v in per_layer.items() if not k.startswith("layer "))
    return rest + sum(counts[kinds[i]] * per_layer[f"layer {i}"][key] for i in range(4))


def measure(work: Path, full: bool = False) -> dict:
    scale = _load_scale()
    spec = REAL[MODEL_NAME]
    counts = e2b_counts(spec)
    if full:
        gguf = write_real(work / f"{MODEL_NAME}.gguf", MODEL_NAME, "q8_0")
    else:
        gguf = write_gguf(work / f"{MODEL_NAME}-mini.gguf", miniature(spec), "q8_0",
                          name=f"synthetic-{MODEL_NAME}-mini")
    out = work / f"{MODEL_NAME}-{'full' if full else 'mini'}-int8.rkbin"
    seconds, cpu_seconds, rss, log = scale.compile_child(gguf, out, "int8", None)
    gguf.unlink()  # E2B's full Q8_0 file is ~5 GB
    module = read_rkbin(out).module
    dec = figures(module)["decode"]
    pre = phase(module, module.program("prefill_512")).per_layer
    if full:  # every layer compiled: the modelled programs' own sums
        tg_s, pp_s, ddr = (sum(v[key] for v in per_layer.values()) for per_layer, key in
                           ((dec["per_layer"], "npu_us"), (pre, "npu_us"), (dec["per_layer"], "ddr_bytes")))
        tg_s, pp_s = tg_s * 1e-6, pp_s * 1e-6
    else:
        D, P = spec["n_embd"], spec["per_layer"]
        missing = (spec["n_layer"] - 4) * P * D  # the per-layer projection's other rows (int8 bytes)
        tg_s = extrapolated(dec["per_layer"], "npu_us", counts) * 1e-6 + missing / MODEL.dram_bytes_per_s
        pp_s = extrapolated(pre, "npu_us", counts) * 1e-6 + missing / MODEL.dram_bytes_per_s
        ddr = extrapolated(dec["per_layer"], "ddr_bytes", counts) + missing
    weights = weight_bytes_per_token(spec)
    row = {"model": MODEL_NAME, "precision": "int8", "full_depth": full,
           "layers_compiled": f"all {spec['n_layer']}" if full else "4 (one per kind)",
           "kinds": counts, "compile_s": round(seconds, 1), "compile_cpu_s": round(cpu_seconds, 1),
           "peak_rss_gb": round(rss / 1e9, 2),
           "rkbin_mb": round(out.stat().st_size / 1e6, 1),
           "decode_ddr_bytes_per_token_extrapolated": int(ddr), "weight_bytes_per_token": weights,
           "tg_modelled_extrapolated": 1 / tg_s, "pp512_modelled_extrapolated": 512 / pp_s,
           "ttft512_ms_modelled_extrapolated": pp_s * 1e3,
           "tg_roofline": MODEL.dram_bytes_per_s / weights,
           "seed": SEED, "rkllm": RKLLM, "compile_log": log.strip().splitlines()[-4:]}
    row["tg_share_of_roofline"] = row["tg_modelled_extrapolated"] / row["tg_roofline"]
    return row


def table(r: dict) -> str:
    lines = ["| | pp512 t/s | tg t/s | TTFT 512 ms | decode DDR MB/token |", "|---|---|---|---|---|",
             f"| rkc modelled* (int8, 1 GHz, 25 GB/s) | {r['pp512_modelled_extrapolated']:.1f} | "
             f"{r['tg_modelled_extrapolated']:.2f} | {r['ttft512_ms_modelled_extrapolated']:.0f} | "
             f"{r['decode_ddr_bytes_per_token_extrapolated'] / 1e6:.0f} |",
             f"| DRAM roofline (weights a token reads: {r['weight_bytes_per_token'] / 1e6:.0f} MB) | - | "
             f"{r['tg_roofline']:.2f} | - | {r['weight_bytes_per_token'] / 1e6:.0f} |",
             f"| seed: llama.cpp + rocket, measured | {SEED['pp512']} | {SEED['tg']} | - | - |",
             f"| seed: vendor stack, measured | {SEED['vendor_pp512']} | {SEED['vendor_tg']} | - | - |",
             f"| RKLLM v1.3.0 benchmark.md | - | {RKLLM['tg']} | {RKLLM['ttft_ms']:.0f} (its prompt) | - |",
             "",
             (f"* FULL DEPTH: all 35 layers compiled ({r['kinds']}), nothing extrapolated; tg = "
              if r["full_depth"] else
              f"* extrapolated from a 4-layer miniature (one layer per kind: {r['kinds']}); tg = ") +
             f"{r['tg_share_of_roofline']:.1%} of the roofline. Compile: {r['compile_s']} s "
             f"({r['compile_cpu_s']} s CPU), "
             f"peak {r['peak_rss_gb']} GB, rkbin {r['rkbin_mb']} MB."]
    return "\n".join(lines)


def _load_scale():
    """bench/scale.py's compile_child (a child `rkc compile`, its time and peak RSS)."""
    spec = importlib.util.spec_from_file_location("rkc_bench_scale", ROOT / "bench" / "scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="write the rkbin here (else a temporary directory)")
    ap.add_argument("--layers", choices=("mini", "full"), default="mini",
                    help="the 4-layer miniature, extrapolated (default), or all 35 layers")
    args = ap.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        row = measure(args.keep, args.layers == "full")
    else:
        with tempfile.TemporaryDirectory(prefix="rkc-e2b-") as tmp:
            row = measure(Path(tmp), args.layers == "full")
    print(table(row))
    if args.json:
        write_atomic(args.json, json.dumps(row, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
