"""Layer by layer: the NPU's int8 result (simulator) against the integer model
of the same quantization (compiler/fakequant.py) and against float.

    python tools/int8_layers.py model.onnx --calib calib.npz --inputs in.npz [--input-shape x=1x3x160x160]

For every NPU group (anchor + fused epilogue) of the int8 build it prints:
* `off>1` / `max`: output elements where the NPU differs from the integer model
  fed the NPU's own inputs by more than one step, and the largest difference
  (in output steps): anything here is an arithmetic bug in the lowering, the
  emitters or the simulator, not quantization loss;
* `cos fp32`: cosine of the NPU's result with the float model's tensor (the
  error accumulated up to here);
* `SQNR`: the group's own int8 error, fed float inputs (dB; what the mixed-
  precision choice measures on the calibration set), and its dtype.
Then the graph outputs' cosine with the float model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np



def main(argv=None) -> int:
    from rkc.compiler.build import BuildOptions, build, plan
    from rkc.compiler.fakequant import run_ops, start_env
    from rkc.compiler.frontend.onnx import parse_input_shapes
    from rkc.compiler.mixed_precision import group_sqnr
    from rkc.compiler.emitter_graph import npu_name
    from rkc.compiler.reference import run_graph
    from rkc.runtime import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--calib", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--input-shape", action="append", default=[])
    ap.add_argument("--out", default="out/int8_layers.rkbin")
    args = ap.parse_args(argv)

    options = BuildOptions(precision="int8", calib=args.calib, input_shapes=parse_input_shapes(args.input_shape),
                           int8_only=True)  # the int8 program, even where fp16 throughout models faster
    p = plan(args.model, options)
    graph, groups = p.graph, p.groups
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    build(args.model, args.out, options)
    feeds = dict(np.load(args.inputs))

    ref: dict[str, np.ndarray] = dict(feeds)
    run_graph(graph, feeds, lambda n, v: ref.__setitem__(n, np.asarray(v)))
    known = {**start_env(graph, feeds), **ref}  # constants and the float model's values
    stored: dict[str, np.ndarray] = {}

    def observe(step, read):
        for name in step.outputs:
            stored[name] = np.array(read(name))

    with load(args.out, "sim") as model:
        outputs = model.run(feeds, observe=observe)
    sqnr = group_sqnr(graph, {i: g for i, g in groups.items() if g.dtype == "int8"}, [feeds])

    print(f"{'group':32} {'ops':24} {'dtype':5} {'off>1':>6} {'max':>4} {'cos fp32':>9} {'SQNR':>6}")
    for anchor in sorted({g.anchor for g in groups.values()}):
        g = groups[anchor]
        out = g.output
        got = stored.get(npu_name(out, g.dtype, "int8"))
        if got is None:
            continue
        q = graph.tensors[out].type.quant
        env = dict(known)
        for t in g.reads:
            held = stored.get(npu_name(t, g.dtype, "int8"))
            if held is not None:  # the NPU's own input
                held = held.astype(np.float64)
                tq = graph.tensors[t].type.quant
                env[t] = (held - tq.zero_point) * tq.scale if g.dtype == "int8" else held
        run_ops(graph, g.ops, env, (lambda i, g=g: g) if g.dtype == "int8" else (lambda i: None))
        if g.dtype == "int8":
            model_q = np.rint(np.asarray(env[out], np.float64) / q.scale) + q.zero_point  # run_ops rounded it
            diff = np.abs(model_q.reshape(got.shape) - got.astype(np.float64))
            real = (got.astype(np.float64) - q.zero_point) * q.scale
            off, worst = int((diff > 1).sum()), int(diff.max())
        else:
            real, off, worst = got.astype(np.float64), 0, 0
        a, b = real.ravel(), ref[out].astype(np.float64).ravel()
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
        name = graph.ops[anchor].name or f"{graph.ops[anchor].type}:{out}"
        db = f"{sqnr[anchor]:.1f}" if anchor in sqnr else "-"
        ops = "+".join(graph.ops[j].type for j in g.ops)
        print(f"{name[:32]:32} {ops[:24]:24} {g.dtype:5} {off:6d} {worst:4d} {cos:9.5f} {db:>6}")
    for name, value in outputs.items():
        a, b = value.astype(np.float64).ravel(), ref[name].astype(np.float64).ravel()
        print(f"output {name}: cosine with float {float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)):.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
