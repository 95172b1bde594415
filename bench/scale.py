"""Real-size LLMs: per synthetic 1-2B model (tests/llm/synth.py REAL, random
weights), compile time and peak RSS of `rkc compile` (a child process, measured
by getrusage), rkbin size, and the modelled figures of the compiled programs
(compiler/llm/report.py: what `rkc inspect --json` prints) next to the DRAM
roofline (weight bytes per token / 25 GB/s) and the vendor's published RK3588
w8a8 figures (rknn-llm doc/benchmark.md, v1.3.0).

Models are cut to their first --layers layers (the machine is shared); the
full-depth decode/prefill figures are EXTRAPOLATED as head + n_layer x the mean
compiled layer, and say so. Compile time and RSS are of the cut model.

    PYTHONPATH=$PWD python bench/scale.py [--models qwen2.5-1.5b ...] [--layers 2] [--precision int8]
        [--rounding rtn] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the llm test package (a namespace package) instead of bench/, whose llm.py would shadow it
sys.path[:] = [str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from llm.synth import REAL, write_real  # noqa: E402
from rkc.compiler.llm.report import MODEL, figures, phase  # noqa: E402
from rkc.ir.rkbin import read_rkbin  # noqa: E402

# rknn-llm doc/benchmark.md v1.3.0, RK3588 w8a8: decode tokens/s, first-token ms at 128 tokens
VENDOR = {"qwen2.5-1.5b": {"tg": 16.69, "ttft128_ms": 378.0}}
VENDOR_OTHERS = "vendor, other sizes: TinyLlama 1.1B 24.43 t/s, Qwen3-0.6B 32.91 t/s (w8a8 decode)"


def matrix_elements(spec: dict, layers: int) -> int:
    """Weights every decoded token reads (the products' matrices and the head)."""
    D, H, Hkv, hd, F = spec["n_embd"], spec["n_head"], spec["n_head_kv"], spec["head_dim"], spec["n_ff"]
    per_layer = D * H * hd * 2 + 2 * D * Hkv * hd + 3 * D * F
    return layers * per_layer + spec["n_vocab"] * D


def compile_child(gguf: Path, out: Path, precision: str, rounding: str | None) -> tuple[float, int, str]:
    """(seconds, peak RSS bytes, report) of `rkc compile` in a child process."""
    cmd = [str(Path(sys.executable).with_name("rkc")), "compile", str(gguf), "-o", str(out),
           "--precision", precision]
    if precision == "int8" and rounding:
        cmd += ["--int8-rounding", rounding, "--fp16-share", "0"]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - t0
        log.seek(0)
        text = log.read()
    if child.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{text}")
    return seconds, usage.ru_maxrss * 1024, text


def extrapolate(per_layer: dict, key: str, n_layer: int) -> float:
    layers = [v[key] for k, v in per_layer.items() if k.startswith("layer ")]
    rest = sum(v[key] for k, v in per_layer.items() if not k.startswith("layer "))
    return rest + n_layer * sum(layers) / len(layers)


def measure(model: str, layers: int, precision: str, rounding: str | None, mix: str, work: Path) -> dict:
    spec = REAL[model]
    gguf = write_real(work / f"{model}.gguf", model, mix, layers)
    out = work / f"{model}-{precision}.rkbin"
    seconds, rss, log = compile_child(gguf, out, precision, rounding)
    module = read_rkbin(out).module
    fig = figures(module)
    dec = fig["decode"]
    L = spec["n_layer"]
    item = 1 if precision == "int8" else 2
    weights_full = matrix_elements(spec, L) * item
    npu_s = extrapolate(dec["per_layer"], "npu_us", L) * 1e-6
    pre = phase(module, module.program("prefill_128"))
    pre_s = extrapolate(pre.per_layer, "npu_us", L) * 1e-6
    row = {"model": model, "precision": precision, "rounding": rounding or "default", "mix": mix,
           "layers_compiled": layers, "n_layer": L, "compile_s": round(seconds, 1), "peak_rss_gb": rss / 1e9,
           "rkbin_mb": out.stat().st_size / 1e6,
           "decode_segments": dec["segments_per_token"], "decode_tasks": dec["tasks_per_token"],
           "decode_kicks": dec["kicks_per_token"],
           "ddr_bytes_per_token": dec["ddr_bytes_per_token"],
           "weight_bytes_compiled": matrix_elements(spec, layers) * item,
           "ddr_bytes_per_token_full_extrapolated": extrapolate(dec["per_layer"], "ddr_bytes", L),
           "weight_bytes_full": weights_full,
           "tg_modelled_full_extrapolated": 1 / npu_s,
           "tg_roofline_full": MODEL.dram_bytes_per_s / weights_full,
           "pp128_modelled_full_extrapolated": 128 / pre_s,
           "compile_log": log.strip().splitlines()[-4:]}
    row["tg_share_of_roofline"] = row["tg_modelled_full_extrapolated"] / row["tg_roofline_full"]
    if model in VENDOR:
        row["vendor_tg"] = VENDOR[model]["tg"]
        row["vendor_pp128"] = 128 / (VENDOR[model]["ttft128_ms"] / 1e3)
    out.unlink()
    gguf.unlink()
    return row


def table(rows: list[dict]) -> str:
    head = ("model", "prec", "L", "compile s", "peak GB", "rkbin MB", "seg/tok", "tasks/tok", "kicks/tok",
            "DDR/tok MB", "weights MB", "tg* t/s", "roofline t/s", "tg/roof", "pp128* t/s", "vendor tg", "vendor pp128")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join(str(x) for x in (
            r["model"], r["precision"], f"{r['layers_compiled']}/{r['n_layer']}", r["compile_s"],
            f"{r['peak_rss_gb']:.2f}", f"{r['rkbin_mb']:.0f}", r["decode_segments"], r["decode_tasks"],
            r["decode_kicks"], f"{r['ddr_bytes_per_token'] / 1e6:.0f} ({r['ddr_bytes_per_token_full_extrapolated'] / 1e6:.0f}*)",
            f"{r['weight_bytes_compiled'] / 1e6:.0f} ({r['weight_bytes_full'] / 1e6:.0f})",
            f"{r['tg_modelled_full_extrapolated']:.2f}", f"{r['tg_roofline_full']:.2f}",
            f"{r['tg_share_of_roofline']:.0%}", f"{r['pp128_modelled_full_extrapolated']:.0f}",
            r.get("vendor_tg", "-"), f"{r['vendor_pp128']:.0f}" if "vendor_pp128" in r else "-")))
    lines.append("L: layers compiled / the model's. Per-token counts and DDR bytes are of the compiled (cut) "
                 "model; (x*) and every * column: extrapolated to full depth (head + n_layer x mean layer). "
                 + VENDOR_OTHERS)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Gemma 4's layers differ by kind (sliding/full, own/shared KV): bench/gemma4_e2b.py extrapolates per kind
    uniform = sorted(m for m, s in REAL.items() if s["arch"] != "gemma4")
    ap.add_argument("--models", nargs="+", default=uniform, choices=uniform)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--precision", nargs="+", default=["int8"], choices=["int8", "fp16"])
    ap.add_argument("--rounding", default="rtn", help="int8 rounding (rtn, or 'default' for the compiler's)")
    ap.add_argument("--mix", default="q8_0", choices=["q8_0", "q4_k_m"])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rkc-scale-") as tmp:
        for model in args.models:
            for precision in args.precision:
                rows.append(measure(model, args.layers, precision, None if args.rounding == "default"
                                    else args.rounding, args.mix, Path(tmp)))
                print(f"{model} {precision}: compiled in {rows[-1]['compile_s']} s", file=sys.stderr)
    print(table(rows))
    if args.json:
        from rkc.ir.atomic import write_atomic

        write_atomic(args.json, json.dumps(rows, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
