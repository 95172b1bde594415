"""Run the ONNX backend node test suite through rkc: compile each case whose
ops rkc claims (compiler/ops), run it (NPU segments on the simulator, CPU steps
in numpy) and compare with the suite's expected outputs.

    python tools/onnx_conformance.py [--precision fp16] [--op Conv] [--json]

Prints pass/total per op and every failure with its reason. Tolerance: fp16
rtol 1e-2, atol 1e-3 (integer and bool outputs exactly). Known failures, with
reasons, are listed in docs/onnx-conformance.md; tests/conformance checks the
run against that list.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RTOL, ATOL = 1e-2, 1e-3


@dataclass
class CaseResult:
    name: str
    ops: list[str]
    ok: bool
    reason: str = ""


def claimed_cases():
    """(name, model, data_sets, ops) for every node case whose ops rkc claims."""
    from onnx.backend.test.loader import load_model_tests

    from compiler.ops import OPS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    for case in cases:
        if case.model is None:
            continue
        ops = sorted({n.op_type for n in case.model.graph.node})
        if ops and all(op in OPS or op == "Constant" for op in ops) and any(op in OPS for op in ops):
            yield case.name, case.model, case.data_sets, ops


def _compare(name: str, got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"output {name}: shape {list(got.shape)}, expected {list(want.shape)}"
    if want.dtype.kind in "fc":
        if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True):
            err = np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64)))
            return f"output {name}: max abs error {err:.3g}"
        return ""
    if not np.array_equal(got, want):
        return f"output {name}: {int(np.sum(got != want))} of {want.size} elements differ"
    return ""


def run_case(name: str, model, data_sets, precision: str, workdir: Path) -> str:
    """'' when every data set matches, else the first reason."""
    import onnx

    from compiler.build import BuildOptions, build
    from ir.errors import RkcError
    from runtime.loader import load

    from onnx import numpy_helper

    path = workdir / f"{name}.onnx"
    onnx.save(model, str(path))
    out = workdir / f"{name}.rkbin"
    inits = {i.name for i in model.graph.initializer}
    in_names = [i.name for i in model.graph.input if i.name not in inits]
    data_sets = [([numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x) for x in ins],
                  [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x) for x in outs])
                 for ins, outs in data_sets]
    # like a user with --input-shape: fix dynamic input dims to the shapes the data has
    shapes = {n: tuple(a.shape) for n, a, vi in zip(in_names, data_sets[0][0], _real_inputs(model))
              if any(not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim) and a.ndim}
    try:
        build(path, out, BuildOptions(precision=precision, input_shapes=shapes))
    except RkcError as exc:
        return f"compile: {exc}".replace(str(path), name)
    out_names = [o.name for o in model.graph.output]
    try:
        with load(out, "auto") as compiled:
            for inputs, expected in data_sets:
                got = compiled.run(dict(zip(in_names, inputs)))
                for oname, want in zip(out_names, expected):
                    reason = _compare(oname, np.asarray(got[oname]), np.asarray(want))
                    if reason:
                        return reason
    except RkcError as exc:
        return f"run: {exc}"
    except Exception as exc:  # a kernel bug: report it as the case's failure
        return f"run: {type(exc).__name__}: {exc}"
    return ""


def _real_inputs(model) -> list:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def run_suite(precision: str = "fp16", only_op: str | None = None) -> list[CaseResult]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, data_sets, ops in claimed_cases():
            if only_op and only_op not in ops:
                continue
            reason = run_case(name, model, data_sets, precision, Path(tmp))
            results.append(CaseResult(name, ops, not reason, reason))
    return results


def per_op(results: list[CaseResult]) -> dict[str, tuple[int, int]]:
    table: dict[str, list[int]] = {}
    for r in results:
        for op in r.ops:
            if op == "Constant":
                continue
            row = table.setdefault(op, [0, 0])
            row[0] += r.ok
            row[1] += 1
    return {op: (p, t) for op, (p, t) in sorted(table.items())}


def markdown(results: list[CaseResult], precision: str) -> str:
    table = per_op(results)
    passed = sum(r.ok for r in results)
    lines = [
        "# ONNX backend node tests through rkc",
        "",
        "Generated by `python tools/onnx_conformance.py --markdown docs/onnx-conformance.md` "
        "(tests/conformance/test_onnx_node_suite.py checks that this list is current).",
        f"Every case of `onnx.backend.test` (kind \"node\") whose ops rkc claims is compiled with "
        f"`--precision {precision}` and run; outputs must match within rtol {RTOL}, atol {ATOL} "
        "(integer and bool outputs exactly).",
        "",
        f"**{passed} of {len(results)} cases pass.**",
        "",
        "| op | pass/total |",
        "|---|---|",
        *[f"| {op} | {p}/{t} |" for op, (p, t) in table.items()],
        "",
        "## Failures and their reasons",
        "",
        "Out of scope by design: element types rkc does not carry (float8, int4/int2, uint32/uint64, "
        "bfloat16 on the ONNX path), sequences and optionals, training-mode Dropout and "
        "BatchNormalization, shapes that depend on run-time values (rkc compiles static shapes), and "
        "antialiased Resize.",
        "",
        "| case | reason |",
        "|---|---|",
        *[f"| {r.name} | {r.reason.replace('|', '/')} |" for r in results if not r.ok],
    ]
    return "\n".join(lines) + "\n"


def documented_failures(text: str) -> dict[str, str]:
    """{case: reason} from the failure table of docs/onnx-conformance.md."""
    part = text.split("## Failures and their reasons", 1)[-1]
    rows = {}
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("test_"):
            rows[cells[0]] = cells[1]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp16", choices=["fp16", "int8"])
    parser.add_argument("--op", help="only cases using this op")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report (docs/onnx-conformance.md)")
    args = parser.parse_args()
    results = run_suite(args.precision, args.op)
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, args.precision))
    table = per_op(results)
    passed = sum(r.ok for r in results)
    if args.json:
        print(json.dumps({"passed": passed, "total": len(results), "per_op": table,
                          "failures": {r.name: r.reason for r in results if not r.ok}}, indent=1))
        return
    print(f"{'op':24s} pass/total")
    for op, (p, t) in table.items():
        print(f"{op:24s} {p}/{t}")
    print(f"all claimed cases: {passed}/{len(results)} passed")
    for r in results:
        if not r.ok:
            print(f"FAIL {r.name}: {r.reason}")


if __name__ == "__main__":
    main()
