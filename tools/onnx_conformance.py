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
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np


RTOL, ATOL = 1e-2, 1e-3


@dataclass
class CaseResult:
    name: str
    ops: list[str]
    ok: bool
    reason: str = ""
    npu_ops: tuple[str, ...] = ()  # op types that ran on the NPU (simulator)


def claimed_cases():
    """(name, model, data_sets, ops) for every node case whose ops rkc claims."""
    from onnx.backend.test.loader import load_model_tests

    from rkc.compiler.ops import OPS

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


def run_case(name: str, model, data_sets, precision: str, workdir: Path, npu_ops: list | None = None,
             bind_weights: bool = False) -> str:
    """'' when every data set matches, else the first reason. Op types placed
    on the NPU are appended to `npu_ops`. With `bind_weights`, every input
    after the first is compiled in as a constant (the suite passes weights as
    inputs; the NPU needs them at compile time): only cases with one data set."""
    import onnx

    from rkc.compiler.build import BuildOptions, build
    from rkc.ir.errors import RkcError
    from rkc.runtime.loader import load

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
    bound = {}
    if bind_weights:
        if len(data_sets) != 1 or len(in_names) < 2:
            return "skip"
        bound = dict(zip(in_names[1:], data_sets[0][0][1:]))
        in_names = in_names[:1]
        data_sets = [(ins[:1], outs) for ins, outs in data_sets]
        shapes = {k: v for k, v in shapes.items() if k not in bound}
    try:
        report = build(path, out, BuildOptions(precision=precision, input_shapes=shapes, bind=bound))
    except RkcError as exc:
        return f"compile: {exc}".replace(str(path), name)
    if npu_ops is not None:
        npu_ops += sorted({p.op.type for p in report.placements if p.device == "npu"})
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


def run_suite(precision: str = "fp16", only_op: str | None = None, bind_weights: bool = False) -> list[CaseResult]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, data_sets, ops in claimed_cases():
            if only_op and only_op not in ops:
                continue
            on_npu: list[str] = []
            reason = run_case(name, model, data_sets, precision, Path(tmp), on_npu, bind_weights)
            if reason == "skip":
                continue
            results.append(CaseResult(name, ops, not reason, reason, tuple(on_npu)))
    return results


def per_op(results: list[CaseResult]) -> dict[str, tuple[int, int, int]]:
    """op -> (cases passed, cases, cases where the op ran on the NPU)."""
    table: dict[str, list[int]] = {}
    for r in results:
        for op in r.ops:
            if op == "Constant":
                continue
            row = table.setdefault(op, [0, 0, 0])
            row[0] += r.ok
            row[1] += 1
            row[2] += op in r.npu_ops
    return {op: tuple(v) for op, v in sorted(table.items())}


MODES = {"as given": False, "weights bound": True}


def markdown(runs: dict[str, list[CaseResult]], precision: str) -> str:
    lines = [
        "# ONNX backend node tests through rkc",
        "",
        "Generated by `python tools/onnx_conformance.py --markdown docs/onnx-conformance.md` "
        "(tests/conformance/test_onnx_node_suite.py checks that this list is current).",
        f"Every case of `onnx.backend.test` (kind \"node\") whose ops rkc claims is compiled with "
        f"`--precision {precision}` and run (NPU segments on the simulator, CPU steps in numpy); outputs must "
        f"match within rtol {RTOL}, atol {ATOL} (integer and bool outputs exactly).",
        "",
        "Two modes: *as given* feeds every input at run time, as the suite does; *weights bound* compiles "
        "every input after the first in as a constant (the suite passes weights as inputs, and the NPU needs "
        "them at compile time), so convolutions and matrix products reach the NPU.",
        "",
    ]
    for mode, results in runs.items():
        table = per_op(results)
        passed = sum(r.ok for r in results)
        lines += [
            f"## {mode}",
            "",
            f"**{mode}: {passed} of {len(results)} cases pass**; "
            f"{sum(bool(r.npu_ops) for r in results)} ran (part of) their graph on the NPU simulator.",
            "",
            "| op | pass/total | cases with the op on the NPU |",
            "|---|---|---|",
            *[f"| {op} | {p}/{t} | {n} |" for op, (p, t, n) in table.items()],
            "",
        ]
    lines += [
        "## Failures and their reasons",
        "",
        "Out of scope by design: element types rkc does not carry (float8, int4/int2, uint32/uint64, "
        "bfloat16 on the ONNX path), sequences and optionals, training-mode Dropout and "
        "BatchNormalization, shapes that depend on run-time values (rkc compiles static shapes), and "
        "antialiased Resize.",
        "",
        "| mode | case | reason |",
        "|---|---|---|",
    ]
    for mode, results in runs.items():
        lines += [f"| {mode} | {r.name} | {r.reason.replace('|', '/')} |" for r in results if not r.ok]
    return "\n".join(lines) + "\n"


def documented_failures(text: str) -> dict[tuple[str, str], str]:
    """{(mode, case): reason} from the failure table of docs/onnx-conformance.md."""
    part = text.split("## Failures and their reasons", 1)[-1]
    rows = {}
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("test_"):
            rows[(cells[0], cells[1])] = cells[2]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp16", choices=["fp16", "int8"])
    parser.add_argument("--op", help="only cases using this op")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report (docs/onnx-conformance.md)")
    parser.add_argument("--bind-weights", action="store_true", help="print the weights-bound mode")
    args = parser.parse_args()
    runs = {mode: run_suite(args.precision, args.op, bind) for mode, bind in MODES.items()}
    if args.markdown:
        from rkc.ir.atomic import write_atomic

        write_atomic(args.markdown, markdown(runs, args.precision))
    results = runs["weights bound" if args.bind_weights else "as given"]
    table = per_op(results)
    passed = sum(r.ok for r in results)
    if args.json:
        print(json.dumps({"passed": passed, "total": len(results), "per_op": table,
                          "failures": {r.name: r.reason for r in results if not r.ok}}, indent=1))
        return
    print(f"mode: {'weights bound' if args.bind_weights else 'as given'}")
    print(f"{'op':24s} pass/total  on NPU")
    for op, (p, t, n) in table.items():
        print(f"{op:24s} {p:4d}/{t:<4d}  {n}")
    print(f"all claimed cases: {passed}/{len(results)} passed")
    for r in results:
        if not r.ok:
            print(f"FAIL {r.name}: {r.reason}")


if __name__ == "__main__":
    main()
