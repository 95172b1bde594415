"""The mixed-precision plan weighs int8/fp16 crossings (compiler/mixed_precision.py):
an int8 group, or a connected run of them, goes fp16 when the host time of the
crossings it removes exceeds the NPU time fp16 adds, and only then."""

from types import SimpleNamespace

import numpy as np

from rkc.compiler.mixed_precision import CROSSING_S_PER_ELEMENT, group_seconds, merge_islands
from rkc.ir.npu.perf import JobCost, PerfModel, TaskCost


def _group(anchor, reads, output, dtype, macs, precision):
    cost = [JobCost(0, 1, [TaskCost(macs, 1024, precision)])]
    return SimpleNamespace(anchor=anchor, ops=[anchor], reads={r: "native" for r in reads}, output=output,
                           dtype=dtype, result=SimpleNamespace(cost_jobs=lambda chained, c=cost: c))


def _chain(dtypes, elements, macs8, macs16):
    """Groups 0..n-1 in a chain t0 -> g0 -> t1 -> g1 -> ...; the placement as
    given (`dtypes`) and the same groups all in fp16."""
    graph = SimpleNamespace(tensors={f"t{i}": SimpleNamespace(type=SimpleNamespace(shape=(1, elements)))
                                     for i in range(len(dtypes) + 1)})
    placed = {i: _group(i, [f"t{i}"], f"t{i + 1}", d, macs8 if d == "int8" else macs16, d)
              for i, d in enumerate(dtypes)}
    all16 = {i: _group(i, [f"t{i}"], f"t{i + 1}", "fp16", macs16, "fp16") for i in range(len(dtypes))}
    return graph, placed, all16


def test_an_int8_run_between_fp16_groups_goes_fp16_when_the_crossings_cost_more():
    rng = np.random.default_rng(0)
    elements = int(rng.integers(200_000, 400_000))  # two crossings of ~0.3 ms each at 1 ns an element
    graph, placed, all16 = _chain(["fp16", "int8", "int8", "fp16"], elements, macs8=50_000_000, macs16=50_000_000)
    merged = merge_islands(graph, placed, all16)
    # one group at a time moves a crossing but removes none; the run of two removes both
    assert set(merged) == {1, 2}, merged
    added = sum(group_seconds(all16[a]) - group_seconds(placed[a]) for a in (1, 2))
    assert 0 < added < 2 * elements * CROSSING_S_PER_ELEMENT


def test_an_int8_run_stays_int8_when_fp16_costs_more_npu_time_than_the_crossings():
    rng = np.random.default_rng(1)
    elements = int(rng.integers(1_000, 2_000))
    model = PerfModel()
    # fp16 adds ~1 ms of multiply-accumulates per group, the crossings are ~microseconds
    macs16 = int(1e-3 * model.clock_hz * 512)  # fp16: 512 MACs a cycle
    graph, placed, all16 = _chain(["fp16", "int8", "int8", "fp16"], elements, macs8=10_000, macs16=macs16)
    assert merge_islands(graph, placed, all16) == {}
    # and with a crossing cost high enough, the same run goes fp16
    assert set(merge_islands(graph, placed, all16, s_per_element=1e-5)) == {1, 2}


def test_an_int8_group_without_fp16_neighbours_stays_int8():
    graph, placed, all16 = _chain(["int8", "int8", "int8"], 300_000, macs8=10_000, macs16=20_000)
    assert merge_islands(graph, placed, all16) == {}


# -- the whole program in fp16 against the mixed plan ---------------------------------------
def _op(kind, inputs, outputs):
    return SimpleNamespace(type=kind, inputs=inputs, outputs=outputs, present_inputs=lambda i=inputs: list(i))


def _graph(sizes, outputs):
    return SimpleNamespace(inputs=["x"], outputs=outputs,
                           tensors={n: SimpleNamespace(kind="value", type=SimpleNamespace(shape=(1, s)))
                                    for n, s in sizes.items()})


def _placed(op, device, dtype=None):
    return SimpleNamespace(op=op, device=device, dtype=dtype)


def test_host_steps_price_every_crossing_and_every_cpu_op():
    from rkc.compiler.mixed_precision import HOST_S_PER_ELEMENT, HOST_S_PER_STEP, host_steps

    rng = np.random.default_rng(2)
    n = {name: int(rng.integers(1_000, 100_000)) for name in ("x", "a", "b", "c", "y")}
    graph = _graph(n, ["y"])
    placements = [_placed(_op("Conv", ["x"], ["a"]), "npu", "fp16"),  # x in: one crossing
                  _placed(_op("Mul", ["a", "x"], ["b"]), "cpu"),  # a out; the CPU reads a, x, writes b
                  _placed(_op("Concat", ["b"], ["c"]), "cpu"),  # slices of one buffer: no step, b's side
                  _placed(_op("Conv", ["c"], ["y"]), "npu", "int8")]  # c in, y out
    steps = host_steps(graph, placements)
    want = [("crossing", "", n["x"]), ("crossing", "", n["a"]), ("cpu", "Mul", n["a"] + n["x"] + n["b"]),
            ("crossing", "", n["c"]), ("crossing", "", n["y"])]
    assert sorted(s[:3] for s in steps) == sorted(want)
    for s in steps:
        assert s.seconds == HOST_S_PER_STEP + s.elements * HOST_S_PER_ELEMENT


def _densenet_stem(pool_device):
    """A DenseNet block's start: the stem's map, a max pool, two dense layers whose maps
    are concatenated with everything before them, then the next layer. With the pool on
    the CPU (int8 maps: the PPU pools fp16 only) or on the NPU."""
    sizes = {"x": 150_528, "a": 802_816, "p": 200_704, "b": 100_352, "c": 301_056, "d": 100_352,
             "e": 401_408, "y": 1_000}
    ops = [("Conv", ["x"], ["a"]), ("MaxPool", ["a"], ["p"]), ("Conv", ["p"], ["b"]),
           ("Concat", ["p", "b"], ["c"]), ("Conv", ["c"], ["d"]), ("Concat", ["c", "d"], ["e"]),
           ("Conv", ["e"], ["y"])]
    dtype = "int8" if pool_device == "cpu" else "fp16"
    placements = [_placed(_op(kind, i, o), pool_device if kind == "MaxPool" else "cpu" if kind == "Concat"
                          else "npu", dtype) for kind, i, o in ops]
    for p in placements:
        p.op.attrs = {}
    return _graph(sizes, ["y"]), placements


def test_a_pool_on_an_npu_map_and_the_maps_concatenated_with_it_cross_nothing():
    """The CPU max pool runs on the int8 map in place and writes its slice of the
    concatenation's buffer: the model's input and output are the only crossings (before,
    the buffers took the pool's side, the CPU's, and every reader crossed)."""
    from rkc.compiler.cost import max_pool_host_seconds
    from rkc.compiler.mixed_precision import host_steps

    graph, placements = _densenet_stem("cpu")
    steps = host_steps(graph, placements)
    assert [s[:3] for s in steps] == [("crossing", "", 150_528), ("in place", "MaxPool", 802_816),
                                      ("crossing", "", 1_000)]
    assert steps[1].seconds == max_pool_host_seconds("int8", 802_816)


def test_the_weighing_ranks_an_int8_plan_with_a_cpu_pool_above_fp16_that_costs_npu_time():
    """DenseNet-121 with PPU pools (stop 47's regression): fp16 pools on the NPU, but its
    NPU time is longer by more than the int8 plan's one CPU pool costs the host, so the
    int8 plan stays."""
    from rkc.compiler.mixed_precision import program_seconds, whole_fp16_wins

    npu = lambda graph, placements, groups: groups["seconds"]  # noqa: E731  (the plans' modelled NPU time)
    int8 = (*_densenet_stem("cpu"), {"seconds": 8.2e-3})
    fp16 = (*_densenet_stem("npu"), {"seconds": 8.2e-3 + 0.4e-3})
    host8, host16 = program_seconds(*int8, npu_seconds=npu)[1], program_seconds(*fp16, npu_seconds=npu)[1]
    assert host16 < host8 < host16 + 0.4e-3
    assert whole_fp16_wins(int8, fp16, npu_seconds=npu) == ""
    # with fp16 as fast on the NPU, its cheaper host side wins
    assert whole_fp16_wins(int8, (*fp16[:2], {"seconds": 8.2e-3}), npu_seconds=npu)


def _groups_alone(graph, placements, groups) -> float:
    """NPU time of these stand-in groups (no emitted tasks to form segments from): each alone."""
    return sum(group_seconds(g) for g in {g.anchor: g for g in groups.values()}.values())


def test_the_whole_program_goes_fp16_only_when_it_models_cheaper():
    from rkc.compiler.mixed_precision import whole_fp16_wins

    rng = np.random.default_rng(3)
    size = int(rng.integers(400_000, 800_000))
    graph = _graph({"x": size, "a": size, "y": size}, ["y"])
    ops = [_op("Conv", ["x"], ["a"]), _op("Conv", ["a"], ["y"])]
    mixed_groups = {0: _group(0, ["x"], "a", "int8", 1_000_000, "int8"),
                    1: _group(1, ["a"], "y", "fp16", 1_000_000, "fp16")}
    mixed = (graph, [_placed(ops[0], "npu", "int8"), _placed(ops[1], "npu", "fp16")], mixed_groups)
    # fp16 throughout drops the int8 -> fp16 crossing of `a` at the NPU time the model gives it
    for macs16, wins in ((1_000_000, True), (int(2e-3 * PerfModel().clock_hz * 512), False)):
        whole_groups = {i: _group(i, [op.inputs[0]], op.outputs[0], "fp16", macs16, "fp16")
                        for i, op in enumerate(ops)}
        whole = (graph, [_placed(op, "npu", "fp16") for op in ops], whole_groups)
        why = whole_fp16_wins(mixed, whole, npu_seconds=_groups_alone)
        assert bool(why) == wins, why
        if wins:
            assert "int8 plan models" in why and "more accurate" in why
