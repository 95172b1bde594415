"""The performance model against silicon: every published RK3588 measurement
whose workload rkc can build (bench/published.py), modelled like for like
(same cores via `rkc compile --cores`, same NPU clock, precision and the
board's DRAM bandwidth) and printed beside the measured figure with their
ratio (> 1: the model is more optimistic than silicon). Two columns of
modelled figures: "before" (ir/npu/perf.py without the terms issue 19 added,
PerfModel.plain()) and "now" (the model as it is).

Compiled programs are cached in --workdir (outside git). The LLM rows compile
a synthetic Qwen2.5-1.5B cut to --layers layers and EXTRAPOLATE to full depth
as bench/scale.py does.

    python bench/silicon.py [--json] [--workdir /tmp/rkc-bench] [--layers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from catalog import compiled_onnx, onnx_models  # noqa: E402
from published import PUBLISHED, RKLLM_TTFT_128_BY_SIZE, Published  # noqa: E402
from rkc.compiler.inspect import planned_jobs  # noqa: E402
from rkc.ir.npu.perf import JobCost, PerfModel  # noqa: E402
from rkc.ir.rkbin import read_rkbin  # noqa: E402

GEMM = (512, 3840, 4096)  # M, K, N of rocket-userspace's figure


def steps_seconds(steps, model: PerfModel, kick_per_job: bool) -> float:
    """Modelled seconds of some steps, kicked as the measured runtime kicks: once per job (a
    hardware chain, whether rkc would chain the segment or not) or once per task."""
    return sum(model.submission_seconds(
        [JobCost(j.lane, 1 if kick_per_job else len(j.tasks), j.tasks) for j in planned_jobs(s, chaining=False)])
        for s in steps if s.kind == "npu")


def onnx_seconds(row: Published, model: PerfModel, work: Path) -> float:
    """Modelled seconds of one inference of rkc's program for `row`'s cores."""
    entry = {m.name: m for m in onnx_models(work)}[row.workload]
    # like for like: the published figure's precision, even where rkc would build fp16 instead
    path, _ = compiled_onnx(entry, row.precision, row.cores, work, int8_only=True)
    return steps_seconds(read_rkbin(path).module.program("main").steps, model, row.chained)


def gemm_seconds(row: Published, model: PerfModel, work: Path) -> float:
    """Modelled seconds of rkc's GEMM program (stock rocket: a kick per task), weights resident in DDR."""
    from rkc.compiler.emitter_graph import emit_options
    from rkc.compiler.npu import api
    from rkc.compiler.npu.dispatch import emit

    m, k, n = GEMM
    out = "fp32" if row.precision == "fp16" else "int32"
    b = np.zeros((k, n), np.float16 if row.precision == "fp16" else np.int8)
    result = emit(api.Gemm(api.Feature.gemm("A", 0, m, k, row.precision), b, api.Feature.gemm("C", 0, m, n, out),
                           m, name="gemm"), emit_options(row.cores))
    return model.submission_seconds(result.cost_jobs(chained=False))


_LLM: dict = {}


def llm_seconds(row: Published, model: PerfModel, work: Path, layers: int) -> float:
    """Modelled NPU seconds of one decode token or one prefill chunk, full depth (extrapolated)."""
    from scale import extrapolate  # bench/scale.py: head + n_layer x the mean compiled layer

    from catalog import compiled
    from llm.synth import REAL, write_real
    from rkc.compiler.llm.report import layer_key, phase

    name, program = row.workload.split(":")
    if name not in _LLM:
        gguf = work / f"{name}-{layers}l.gguf"
        if not gguf.exists():
            write_real(gguf, name, "q8_0", layers)
        out = work / f"{name}-{layers}l-{row.precision}-{row.cores}core.rkbin"
        compiled(gguf, out, ["--precision", row.precision, "--cores", str(row.cores), "--int8-rounding", "rtn",
                             "--fp16-share", "0"])
        _LLM[name] = read_rkbin(out).module
    module = _LLM[name]
    figures = phase(module, module.program(program), model)
    if row.chained:  # the per-layer times, kicked once per job
        for key, layer in figures.per_layer.items():
            steps = [s for s in module.program(program).steps if s.kind == "npu" and layer_key(s) == key]
            layer["npu_us"] = steps_seconds(steps, model, True) * 1e6
    return extrapolate(figures.per_layer, "npu_us", REAL[name]["n_layer"]) * 1e-6


def modelled(row: Published, model: PerfModel, work: Path, layers: int) -> float:
    """The modelled figure in the row's unit."""
    model = replace(model, clock_hz=row.clock_hz, dram_bytes_per_s=row.dram_bytes_per_s)
    if row.workload == "submit":
        return model.kick_overhead_s * 1e6
    if row.workload.startswith("gemm_"):
        return 2 * np.prod(GEMM) / gemm_seconds(row, model, work) / 1e9
    if ":" in row.workload:
        seconds = llm_seconds(row, model, work, layers)
        return 1 / seconds if row.unit == "tokens/s" else seconds * 1e3
    seconds = onnx_seconds(row, model, work)
    return 1 / seconds if row.unit == "fps" else seconds * 1e3


def optimism(row: Published, value: float) -> float:
    """How much faster the model says it is than silicon measured (> 1: optimistic)."""
    if row.low is not None and row.low <= value <= row.value:
        return 1.0  # inside the published range
    measured = row.value if row.low is None or value > row.value else row.low
    faster_is_larger = row.unit in ("fps", "GOP/s", "tokens/s")
    return value / measured if faster_is_larger else measured / value


def compare(work: Path, layers: int) -> list[dict]:
    rows = []
    for row in PUBLISHED:
        before = modelled(row, PerfModel.plain(), work, layers)
        now = modelled(row, PerfModel(), work, layers)
        rows.append({"key": row.key, "what": row.what, "precision": row.precision, "cores": row.cores,
                     "clock_hz": row.clock_hz, "dram_bytes_per_s": row.dram_bytes_per_s, "unit": row.unit,
                     "chained": row.chained, "low": row.low,
                     "measured": row.value, "modelled_before": before, "modelled_now": now,
                     "optimism_before": optimism(row, before), "optimism_now": optimism(row, now),
                     "clock_note": row.clock_note, "source": row.source})
        print(f"{row.key}: done", file=sys.stderr, flush=True)
    return rows


def decoder_weights(layers: int, hidden: int, inter: int, q: int, kv: int) -> int:
    """Matrix weights of a dense decoder: Q, K, V, O and a gated MLP per layer (embeddings and head aside)."""
    return layers * (2 * hidden * q + 2 * hidden * kv + 3 * hidden * inter)


def ttft_by_size(compared: list[dict], tokens: int = 128) -> dict:
    """The vendor's first-token times over model size (bench/published.py RKLLM_TTFT_128_BY_SIZE) fitted
    as a fixed part + a part proportional to the decoder's matrix weights (least squares), the rate of
    that part, and rkc's modelled Qwen2.5-1.5B prefill beside it: which of the two parts the model misses."""
    names = [r[0] for r in RKLLM_TTFT_128_BY_SIZE]
    ttft_ms = np.array([r[1] for r in RKLLM_TTFT_128_BY_SIZE])
    weights = np.array([decoder_weights(*r[2:]) for r in RKLLM_TTFT_128_BY_SIZE], float)
    ms_per_weight, fixed_ms = np.polyfit(weights, ttft_ms, 1)
    rate = 2 * tokens / (ms_per_weight * 1e-3)  # ops/s of the part that grows with the work
    qwen = next(r for r in compared if r["key"] == "rkllm_qwen25_ttft")
    qwen_weights = weights[names.index("Qwen2.5-1.5B")]
    modelled_ms = qwen["modelled_now"]
    return {"fixed_ms": float(fixed_ms), "ms_per_billion_weights": float(ms_per_weight * 1e9),
            "silicon_ops_per_s": float(rate), "models": [
                {"model": n, "weights": int(w), "ttft_ms": float(t), "fit_ms": float(fixed_ms + ms_per_weight * w),
                 "ops_per_s": float(2 * tokens * w / (t * 1e-3))} for n, w, t in zip(names, weights, ttft_ms)],
            "rkc_modelled_ms": modelled_ms, "rkc_ops_per_s": float(2 * tokens * qwen_weights / (modelled_ms * 1e-3)),
            "rkc_plus_fixed_ms": float(fixed_ms + modelled_ms), "measured_ms": qwen["measured"],
            "optimism_with_fixed": float(qwen["measured"] / (fixed_ms + modelled_ms))}


def ttft_table(split: dict) -> str:
    lines = ["| model (RKLLM, RK3588 w8a8, 128 tokens) | decoder matrix weights | TTFT ms | fit ms | ops/s |",
             "|---|---|---|---|---|"]
    for m in split["models"]:
        lines.append(f"| {m['model']} | {m['weights'] / 1e9:.2f} B | {m['ttft_ms']:.1f} | {m['fit_ms']:.0f} | "
                     f"{m['ops_per_s'] / 1e12:.2f} T |")
    lines.append(f"fit: TTFT = {split['fixed_ms']:.0f} ms + {split['ms_per_billion_weights']:.0f} ms per billion "
                 f"weights; the growing part runs at {split['silicon_ops_per_s'] / 1e12:.2f} TOPS on silicon, rkc "
                 f"models Qwen2.5-1.5B's at {split['rkc_ops_per_s'] / 1e12:.2f} TOPS ({split['rkc_modelled_ms']:.0f} "
                 f"ms NPU); with the fixed part added, {split['rkc_plus_fixed_ms']:.0f} ms against "
                 f"{split['measured_ms']:g} ms measured ({split['optimism_with_fixed']:.2f}x).")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = ("measurement", "prec", "cores", "NPU clock", "DRAM GB/s", "kicks", "measured", "modelled before",
            "modelled now", "model/silicon before", "model/silicon now")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(str(x) for x in (
            r["what"], r["precision"] or "-", r["cores"], f"{r['clock_hz'] / 1e6:.0f} MHz",
            f"{r['dram_bytes_per_s'] / 1e9:g}", "per job" if r["chained"] else "per task",
            (f"{r['low']:g}-" if r["low"] else "") + f"{r['measured']:g} {r['unit']}",
            f"{r['modelled_before']:.4g}", f"{r['modelled_now']:.4g}", f"{r['optimism_before']:.2f}x",
            f"{r['optimism_now']:.2f}x")) + " |")
    lines.append("model/silicon: how much faster the model is than the measurement (> 1: optimistic; 1.00x "
                 "inside a published range). kicks: as the measured runtime kicks (the vendor's chains). "
                 "LLM rows extrapolated from a cut model (bench/scale.py).")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/rkc-bench"),
                    help="compiled programs are kept and reused here (outside git)")
    ap.add_argument("--layers", type=int, default=2, help="LLM layers compiled (the rest extrapolated)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = compare(args.workdir, args.layers)
    split = ttft_by_size(rows)
    if args.json:
        print(json.dumps({"rows": rows, "ttft_by_size": split}, indent=1))
        return
    print(table(rows))
    print()
    print(ttft_table(split))
    for r in rows:
        print(f"- {r['what']}: clock {r['clock_note']}; source {r['source']}")


if __name__ == "__main__":
    main()
