"""First request after a fresh install against a warm server: the host
kernels (numba, runtime/llm/jit.py and friends) compile on first use unless
the load warms them (rkc.load(warm_up=...)). Per rkbin, three processes on
the null device, each loading the model and then sending two identical
requests (a prompt, greedy, `--tokens` tokens):

* cold: an empty numba cache (a fresh NUMBA_CACHE_DIR), as after `pip install`;
* cached: the same cache dir again, as any later run;
* the warm reference is the second request of the cached process.

Printed per process: the load time, the first and the second request's time
to first token (prefill) and decode time per token; the target is the cold
process's first TTFT <= 2x the warm TTFT (load time stated apart).

    python bench/first_request.py out/gemma-int8.rkbin out/gemma-fp16.rkbin [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROMPT = "The three primary colours are"


def one_process(rkbin: str, tokens: int, warm_up: bool) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    import rkc

    model = rkc.load(rkbin, device="null", **({} if warm_up else {"warm_up": False}))
    load_s, load_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    out = {"load_s": load_s, "load_cpu_s": load_cpu_s, "requests": []}
    for _ in range(2):
        t, c = time.perf_counter(), time.process_time()
        stream = model.generate(PROMPT, max_tokens=tokens, temperature=0, ignore_eos=True, stream=True)
        first = None
        for _piece in stream:
            if first is None:
                first, first_cpu = time.perf_counter() - t, time.process_time() - c
        total = time.perf_counter() - t
        tm = model.timings
        out["requests"].append({"ttft_s": first, "ttft_cpu_s": first_cpu, "prefill_s": tm.prefill_s, "total_s": total,
                                "decode_ms_per_token": 1e3 * tm.decode_s / max(tm.generated - 1, 1)})
    model.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rkbins", nargs="*")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--no-warm-up", action="store_true", help="load without compiling the kernels first")
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_process(args.child, args.tokens, not args.no_warm_up)))
        return
    results = {}
    for rkbin in args.rkbins:
        with tempfile.TemporaryDirectory(prefix="rkc-numba-") as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}
            runs = {}
            for name in ("cold", "cached"):
                cmd = [sys.executable, __file__, "--child", rkbin, "--tokens", str(args.tokens)]
                if args.no_warm_up:
                    cmd.append("--no-warm-up")
                runs[name] = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                                       text=True).stdout)
        warm = runs["cached"]["requests"][1]
        for name, r in runs.items():
            first = r["requests"][0]
            print(f"{os.path.basename(rkbin)} {name:6s}: load {r['load_s']:6.2f} s ({r['load_cpu_s']:6.2f} s CPU), "
                  f"first request TTFT {first['ttft_s'] * 1e3:8.1f} ms ({first['ttft_s'] / warm['ttft_s']:5.1f}x "
                  f"warm; CPU {first['ttft_cpu_s'] / warm['ttft_cpu_s']:5.1f}x), decode "
                  f"{first['decode_ms_per_token']:6.2f} ms/token; warm TTFT {warm['ttft_s'] * 1e3:.1f} ms, "
                  f"decode {warm['decode_ms_per_token']:.2f} ms/token")
        results[rkbin] = runs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
