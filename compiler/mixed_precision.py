"""Mixed precision for --precision int8: which NPU operations stay in fp16.

Hybrid quantization in the manner of rknn-toolkit2, chosen by a measured
criterion rather than by hand: on the calibration samples, every int8 NPU
group (an anchor and its fused epilogue, compiler/emitter_ops.py) is run alone
with float inputs, int8 arithmetic (inputs at their scales, int8 weights,
output rounded to its scale: compiler/fakequant.py) and compared with the float
result. The signal-to-quantization-noise ratio of that output,

    SQNR = 10 log10( sum(y^2) / sum((y_int8 - y)^2) )   over all samples,

is the group's own int8 error, whatever its cause: an activation whose range
is set by a few extreme values, weights that int8 represents badly, a very
coarse output step. Groups below `SQNR_MIN_DB` run in fp16 on the NPU; the
rest stay int8. The threshold is a measured choice (docs/onnx.md): at 8 bits a
well-behaved layer sits at 35-45 dB; on the PP-OCR detector, 11 of 60 groups
measure below 32 dB (20-31 dB), and with them in fp16 its output goes from
cosine 0.985-0.992 to 0.996-0.997 against onnxruntime over four inputs.

A segment holds one dtype, so every tensor between an int8 and an fp16 group
crosses through the host. `merge_islands` then weighs those crossings against
the NPU: int8 runs next to fp16 groups go fp16 where that is cheaper overall.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

from rkc.compiler.cost import max_pool_host_seconds, op_macs
from rkc.compiler.emitter_ops import plan_npu_seconds
from rkc.compiler.fakequant import run_ops, start_env
from rkc.compiler.quantize import MOVES_VALUES, load_calibration, selects_values
from rkc.compiler.reference import run_graph
from rkc.ir.graph import Graph
from rkc.ir.npu.perf import PerfModel

SQNR_MIN_DB = 32.0


def group_sqnr(graph: Graph, groups: Mapping[int, object], samples: Sequence[Mapping[str, np.ndarray]]
               ) -> dict[int, float]:
    """SQNR (dB) of every int8 group's output, each group fed float inputs."""
    anchors = {g.anchor: g for g in groups.values()}
    signal = {a: 0.0 for a in anchors}
    noise = {a: 0.0 for a in anchors}
    for feeds in samples:
        env = start_env(graph, feeds)
        run_graph(graph, feeds, lambda name, value: env.__setitem__(name, value))
        for a, g in anchors.items():
            local = dict(env)
            run_ops(graph, g.ops, local, lambda i, g=g: g)  # output rounded to its scale
            y = np.asarray(env[g.output], np.float64)
            yq = np.asarray(local[g.output], np.float64)
            signal[a] += float(np.sum(y * y))
            noise[a] += float(np.sum((yq - y) ** 2))
    return {a: 10 * np.log10(max(signal[a], 1e-30) / max(noise[a], 1e-30)) for a in anchors}


def fp16_groups(graph: Graph, groups: Mapping[int, object], samples: Sequence[Mapping[str, np.ndarray]],
                threshold_db: float = SQNR_MIN_DB) -> dict[int, float]:
    """Anchors of the groups to run in fp16, with their int8 SQNR."""
    return {a: db for a, db in group_sqnr(graph, groups, samples).items() if db < threshold_db}


def choose_fp16(graph: Graph, groups: Mapping[int, object], calib) -> dict[int, str]:
    """The fp16 anchors of an int8 build calibrated from `calib` (an .npz path),
    with the reason `rkc compile --explain` shows."""
    samples = load_calibration(calib, graph)
    int8 = {i: g for i, g in groups.items() if getattr(g, "dtype", "int8") == "int8"}
    return {a: f"its int8 SQNR on the calibration set is {db:.1f} dB, below {SQNR_MIN_DB:g} dB"
            for a, db in fp16_groups(graph, int8, samples).items()}


# -- weighing the crossings -----------------------------------------------------------------
# Host CPU seconds per element of a tensor crossing between an int8 and an fp16 group:
# the runtime recodes it between the two NPU layouts (int8 16-lane atoms, fp16 8-lane),
# one or two passes at ~0.4-0.8 ns an element on this machine (docs/notes/
# 2026-12-06-vision-host-time-3.md), plus a segment split (a submission) on the NPU side.
# Measured on PP-OCR det (docs/notes/2026-12-06-ppocr-precision-plan.md): ~1 ns an element.
CROSSING_S_PER_ELEMENT = 1.0e-9


def group_seconds(group, model: PerfModel | None = None) -> float:
    """A group's modelled NPU time submitted alone with hardware chaining (its kicks included)."""
    return (model or PerfModel()).submission_seconds(group.result.cost_jobs(chained=True))


def _numel(graph: Graph, name: str) -> int:
    return int(np.prod(graph.tensors[name].type.shape, dtype=np.int64))


def merge_islands(graph: Graph, groups: Mapping[int, object], fp16_groups_of: Mapping[int, object],
                  s_per_element: float = CROSSING_S_PER_ELEMENT) -> dict[int, str]:
    """Anchors of int8 `groups` (a mixed placement) that should compute in fp16 too:
    a group goes fp16 when the host time of the int8/fp16 crossings it removes, at
    `s_per_element` an element, exceeds the NPU time fp16 adds to it (modelled, from
    `fp16_groups_of`: the same graph placed with every group in fp16), repeated until
    no group gains. fp16 only ever replaces int8, so no group's error grows."""
    anchors = {g.anchor: g for g in groups.values()}
    dtype = {a: g.dtype for a, g in anchors.items()}
    produced = {g.output: a for a, g in anchors.items()}
    edges: dict[int, list[tuple[int, int]]] = {a: [] for a in anchors}  # anchor -> (neighbour, elements)
    for a, g in anchors.items():
        for name in g.reads:
            p = produced.get(name)
            if p is not None and p != a:
                n = _numel(graph, name)
                edges[a].append((p, n))
                edges[p].append((a, n))
    cost = {}
    for a, g in anchors.items():
        g16 = fp16_groups_of.get(a)
        if dtype[a] == "int8" and g16 is not None and g16.anchor == a and g16.dtype == "fp16" \
                and g16.ops == g.ops:
            cost[a] = (group_seconds(g), group_seconds(g16))
    def gain(run: set[int]) -> tuple[float, float]:
        """(host seconds saved, NPU seconds added) if the int8 groups of `run` went fp16."""
        host = sum(n * s_per_element * ((dtype[b] != "int8") - (dtype[b] != "fp16"))
                   for a in run for b, n in edges[a] if b not in run)
        return host, sum(cost[a][1] - cost[a][0] for a in run)

    chosen: dict[int, str] = {}
    changed = True
    while changed:  # each change lowers the modelled total, so this ends
        changed = False
        # single groups first, then whole connected int8 runs (a run whose ends both
        # touch fp16 gains nothing from one group at a time)
        runs = [{a} for a in cost if dtype[a] == "int8"] + _int8_runs(cost, edges, dtype)
        for run in runs:
            if any(dtype[a] != "int8" for a in run):
                continue
            host, npu = gain(run)
            if host > npu:
                for a in run:
                    dtype[a] = "fp16"
                    chosen[a] = (f"fp16 with its int8 run of {len(run)} group(s): the int8/fp16 crossings "
                                 f"removed save {host * 1e3:.2f} ms of host time, fp16 adds "
                                 f"{npu * 1e3:+.2f} ms of NPU time")
                changed = True
    return chosen


def _int8_runs(candidates, edges, dtype) -> list[set[int]]:
    """Connected sets of int8 groups that may go fp16 (graph edges between groups)."""
    seen: set[int] = set()
    runs = []
    for a in candidates:
        if a in seen or dtype[a] != "int8":
            continue
        run, todo = set(), [a]
        while todo:
            x = todo.pop()
            if x in run:
                continue
            run.add(x)
            todo += [b for b, _ in edges[x] if b in candidates and dtype[b] == "int8" and b not in run]
        seen |= run
        runs.append(run)
    return runs


# -- the whole program in fp16 ----------------------------------------------------------------
def _side(placement) -> str:
    return f"npu-{placement.dtype}" if placement.device == "npu" else "cpu"


# Host CPU seconds per element a host step converts, or reads and writes: PP-OCRv4 det 480's
# fp16 and mixed int8 programs, 15.9 M and 20.4 M elements, measured 7.8 and 9.9 ms of CPU on
# the null device (docs/notes/2026-12-06-ppocr-npu-plan.md): 0.49 ns an element both.
HOST_S_PER_ELEMENT = 0.5e-9
# Host CPU seconds of a step's own work around its kernel (the interpreter, the BO's CPU-access
# bracket, the views, the kernel's dispatch): ~7 us around a ~3 us kernel per edge step
# (docs/notes/2026-12-07-small-models-host.md); DenseNet-121's [1, 1000] logits dequantized
# measured 33 us at load 11 (docs/notes/2026-12-07-cnn-host-rows.md).
HOST_S_PER_STEP = 10e-6
# Host CPU seconds per multiply-add of a convolution or matrix product left on the CPU (a
# placement where the emitter refuses a layer, e.g. SqueezeNet's last 1x1 convolution in fp16:
# 86.5 M multiply-adds measured 2.6 ms of CPU on the null device, 2026-12-07): element counts
# alone priced it at 0.1 ms and chose the fp16 program, which then ran 3.2 ms against 0.7.
HOST_S_PER_MAC = 3e-11
_PRODUCTS = ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose", "MatMul", "Gemm", "MatMulInteger",
             "QLinearMatMul")


class HostStep(NamedTuple):
    what: str  # "crossing" (a conversion between sides), "cpu" (an op on host tensors), "in place"
    op: str  # the op type ("" for a crossing)
    elements: int  # the elements it converts, or reads and writes
    seconds: float  # modelled host CPU time


def host_steps(graph: Graph, placements: Sequence[object]) -> list[HostStep]:
    """The host steps one inference of a placement costs, as the lowering makes them
    (compiler/program_steps.py), each priced by what it does:

    * a conversion each time a tensor crosses to a side that reads it (the CPU's float32
      tensors, int8 NPU maps, fp16 NPU maps; the model's inputs and outputs are on the CPU's
      side): its elements at HOST_S_PER_ELEMENT, plus HOST_S_PER_STEP;
    * a CPU op on host tensors: the elements it reads and writes at HOST_S_PER_ELEMENT, a
      convolution's or matrix product's multiply-adds at HOST_S_PER_MAC, plus HOST_S_PER_STEP;
    * an op that selects values (MaxPool, nearest Resize) on an NPU map runs on that map in
      place, in its dtype, with no conversion around it (a max pool at cost.max_pool_host_seconds);
    * a Concat or Split is slices of one buffer, no step: where a piece is on the NPU the
      buffer is on the side of the first such piece (a piece the CPU made crosses into its
      slice: DenseNet's stem pool into its first block's maps), else the CPU's."""
    side: dict[str, str] = {name: "cpu" for name in graph.inputs}
    seen: dict[str, set[str]] = {}
    steps: list[HostStep] = []

    def read(name: str, by: str) -> None:
        if graph.tensors[name].kind == "const":
            return
        have = seen.setdefault(name, {side.get(name, "cpu")})
        if by not in have:
            have.add(by)
            n = _numel(graph, name)
            steps.append(HostStep("crossing", "", n, HOST_S_PER_STEP + n * HOST_S_PER_ELEMENT))

    for p in placements:
        op = p.op
        inputs = [n for n in op.present_inputs() if graph.tensors[n].kind != "const"]
        if op.type in MOVES_VALUES and p.device != "npu":
            s = next((x for x in (side.get(n, "cpu") for n in inputs) if x != "cpu"), "cpu")
        elif p.device != "npu" and selects_values(op) and len(op.outputs) == 1 and inputs \
                and side.get(inputs[0], "cpu") != "cpu":
            s = side[inputs[0]]
            n = _numel(graph, inputs[0])
            seconds = max_pool_host_seconds(s.removeprefix("npu-"), n) if op.type == "MaxPool" else \
                HOST_S_PER_STEP + (n + sum(_numel(graph, o) for o in op.outputs)) * HOST_S_PER_ELEMENT
            steps.append(HostStep("in place", op.type, n, seconds))
            inputs = inputs[1:]  # (a Resize's scales or sizes: host tensors)
        else:
            s = _side(p)
            if s == "cpu":
                n = sum(_numel(graph, t) for t in (*inputs, *op.outputs) if graph.tensors[t].kind != "const")
                macs = op_macs(graph, op) if op.type in _PRODUCTS else 0
                steps.append(HostStep("cpu", op.type, n,
                                      HOST_S_PER_STEP + n * HOST_S_PER_ELEMENT + macs * HOST_S_PER_MAC))
        for name in inputs:
            read(name, s)
        for name in op.outputs:
            side[name] = s
    for name in graph.outputs:
        read(name, "cpu")
    return steps



def program_seconds(graph: Graph, placements: Sequence[object], groups: Mapping[int, object],
                    npu_seconds=plan_npu_seconds) -> tuple[float, float]:
    """(NPU, host) seconds of a placement as the plan weighs it: its segments' jobs as
    they will be submitted (`npu_seconds`) and its `host_steps`."""
    return npu_seconds(graph, placements, groups), sum(s.seconds for s in host_steps(graph, placements))


def whole_fp16_wins(planned: tuple, whole: tuple, npu_seconds=plan_npu_seconds) -> str:
    """Why the whole program in fp16 (`whole`: graph, placements, groups of the fp16
    build) is cheaper than the int8 plan (`planned`, all int8 or mixed), NPU and host
    time as `program_seconds` models them, or "" when it is not. fp16 never loses
    accuracy to the int8 groups it replaces (fp16 keeps 11 significant bits where int8
    keeps a 256-step scale per tensor): where the fp16 program models faster, an int8
    build gets it. fp16 segments chain their kicks (Q1), which is where it wins on
    kick-bound programs such as MobileNetV2."""
    npu_m, host_m = program_seconds(*planned, npu_seconds)
    npu_f, host_f = program_seconds(*whole, npu_seconds)
    if npu_f + host_f >= npu_m + host_m:
        return ""
    return (f"the int8 plan models {(npu_m + host_m) * 1e3:.2f} ms (NPU {npu_m * 1e3:.2f} + host "
            f"{host_m * 1e3:.2f}), the whole program in fp16 {(npu_f + host_f) * 1e3:.2f} ms (NPU "
            f"{npu_f * 1e3:.2f} + host {host_f * 1e3:.2f}), and fp16 is the more accurate")
