"""Fuzz rkrun serve's HTTP API from its OpenAPI description (/openapi.json,
runtime/serve/openapi.py) with schemathesis, in-process against the ASGI app
(the tiny synthetic chat model of bench/server.py on the null device, a
context of 48 so that no generation is long): for each operation, requests
that fit the schema (positive) and requests that break it (negative), each
sent and its status counted. Target: no 5xx and no exception out of the app.

    PYTHONPATH=$PWD python tools/api_fuzz.py [--examples 200] [--seed 0] [--json out.json]

--examples: per operation and mode (the two POST routes x positive/negative
and the three GET routes; the GETs have no inputs to vary: one request each).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fuzz(app, examples: int, seed: int) -> dict:
    """{"requests", "by": {"OP mode status": count}, "server_errors": [first few], "accepted_negatives":
    [the first few requests outside the description answered 2xx], "seconds"}."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    counts: Counter = Counter()
    bad: list[str] = []
    accepted: list[str] = []
    t0 = time.monotonic()
    for result in schema.get_all_operations():
        op = result.ok()
        has_inputs = op.body or op.query or op.path_parameters
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if has_inputs else (GenerationMode.POSITIVE,):
            @hypothesis_seed(seed)
            @settings(max_examples=examples if has_inputs else 1, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case) -> None:
                # an exception out of the app is raised here: the run fails. The timeout is schemathesis'
                # 10 s raised: a valid chat generates to the end of its context, which on a busy 2-core
                # machine once took longer (CI, 2026-12-06); the fuzz is for 5xx, not latency
                r = case.call(timeout=120)
                counts[f"{op.label} {mode.value} {r.status_code}"] += 1
                if r.status_code >= 500 and len(bad) < 5:
                    bad.append(f"{op.label} {case.body!r:.200} -> {r.status_code} {r.text[:200]}")
                if mode is GenerationMode.NEGATIVE and r.status_code < 300 and len(accepted) < 5:
                    # outside the description yet answered: what the description or the checks miss
                    accepted.append(f"{op.label} {case.media_type} headers={case.headers!r:.120} query={case.query!r:.80} "
                                    f"body={case.body!r:.300} -> {r.status_code}")
            run()
    return {"requests": sum(counts.values()), "by": dict(sorted(counts.items())),
            "server_errors": bad, "accepted_negatives": accepted, "seconds": round(time.monotonic() - t0, 1)}


def tiny_app(folder: Path, ctx: int = 48):
    """The app of the tiny chat model on the null device; stop its worker with app.state.worker.stop()."""
    import importlib.util

    import rkc

    from rkc.runtime.serve.app import create_app

    # bench/server.py by its path: bench/ on sys.path would shadow tests' modules of the same names
    spec = importlib.util.spec_from_file_location("rkc_bench_server", ROOT / "bench/server.py")
    bench_server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_server)
    return create_app(rkc.load(bench_server.tiny_chat_model(folder, (1, 4, 16)), device="null", ctx=ctx))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        app = tiny_app(Path(d))
        try:
            row = fuzz(app, args.examples, args.seed)
        finally:
            app.state.worker.stop()
    row.update(examples=args.examples, seed=args.seed)
    fives = sum(v for k, v in row["by"].items() if int(k.rsplit(" ", 1)[1]) >= 500)
    print(f"rkrun serve API fuzzed from its OpenAPI description (schemathesis, seed {args.seed}, "
          f"{args.examples} examples per operation and mode): {row['requests']} requests in {row['seconds']} s, "
          f"{fives} answered 5xx (target 0)")
    for k, v in row["by"].items():
        print(f"  {k:48} {v:6}")
    for b in row["server_errors"]:
        print("  5xx:", b)
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
