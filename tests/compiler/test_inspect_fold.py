"""compiler/inspect/fold.py on hand-made programs: which steps are layers,
which layers share a structure, and what the words on a kind say."""

from __future__ import annotations

from rkc.compiler.inspect.fold import differences, find_layers, layer_kinds, ranges
from rkc.ir.program import Program, Step


def _layer(n: int, window: int, prev: str, prefix: str = "blk") -> list[Step]:
    p = f"p/{prefix}.{n}"
    return [Step("cpu", f"{p}.norm", op="RMSNorm", inputs=[prev, f"{prefix}.{n}.norm.weight"], outputs=[f"{p}.norm"]),
            Step("cpu", f"{p}.attn", op="Attention", inputs=[f"{p}.norm", "p/positions"], outputs=[f"{p}.attn"],
                 attrs={"window": window, "layer": n}),
            Step("cpu", f"{p}.out", op="Add", inputs=[f"{p}.attn", prev], outputs=[f"{p}.out"])]


def _program(windows: list[int]) -> Program:
    steps = [Step("cpu", "p/embd", op="GatherRows", inputs=["table", "p/tokens"], outputs=["p/embd"])]
    prev = "p/embd"
    for n, w in enumerate(windows):
        steps += _layer(n, w, prev)
        prev = f"p/blk.{n}.out"
    steps.append(Step("cpu", "p/result_norm", op="RMSNorm", inputs=[prev, "output_norm.weight"],
                      outputs=["p/result_norm"]))
    return Program("p", ["p/tokens", "p/positions"], ["p/result_norm"], steps)


def test_layers_and_kinds():
    program = _program([4, 4, 0, 4, 4, 0, 4])
    layers = find_layers(program)
    assert [layer.index for layer in layers] == list(range(7))
    assert [layer.steps for layer in layers][:2] == [[1, 2, 3], [4, 5, 6]]
    kinds = layer_kinds(program, layers)
    # layer 0 reads the embedding, the others the layer before: the same structure all the same
    assert [[layer.index for layer in k.layers] for k in kinds] == [[0, 1, 3, 4, 6], [2, 5]]
    assert differences(program, kinds) == [["sliding-window attention (window 4)"], ["full attention"]]
    same = _program([0, 0, 0])
    one = layer_kinds(same, find_layers(same))
    assert len(one) == 1 and len(one[0].layers) == 3 and differences(same, one) == [[]]


def test_no_layers_no_folding():
    assert find_layers(_program([4])) == []  # one layer is no repetition
    program = _program([4, 4, 4])
    program.steps.insert(4, Step("cpu", "p/between", op="Relu", inputs=["p/blk.0.out"], outputs=["p/between"]))
    assert find_layers(program) == []  # a step of no layer between layers
    program = _program([4, 4])
    program.steps[2], program.steps[5] = program.steps[5], program.steps[2]  # layers interleaved
    assert find_layers(program) == []
    onnx_like = Program("main", ["x"], ["y"], [Step("cpu", "n1", op="Relu", inputs=["x"], outputs=["y"])])
    assert find_layers(onnx_like) == []


def test_ranges():
    assert ranges([0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12]) == "0-4, 6-10, 12"
    assert ranges([5, 11, 17]) == "5, 11, 17"
    assert ranges([3]) == "3"


def test_kinds_that_read_alike_are_told_apart():
    program = _program([4, 4, 4])
    add = program.steps[6]  # layer 1's residual Add reads its norm instead of its attention
    add.inputs = ["p/blk.1.norm", add.inputs[1]]
    kinds = layer_kinds(program, find_layers(program))
    assert [[layer.index for layer in k.layers] for k in kinds] == [[0, 2], [1]]
    assert differences(program, kinds) == [[], ["unlike blk.0: Add blk.1.out"]]


def test_steps_of_no_layer_inside_a_layer_belong_to_it():
    """Gemma 4: the per-layer embedding's product shares layer 0's segment (one step writing
    both), and its other steps run between layer 0's; Pick's index is the layer's own slice."""
    program = _program([4, 4, 4])
    for n, at in ((2, 8), (1, 5), (0, 2)):  # after its norm, each layer picks its slice of the per-layer inputs
        program.steps.insert(at, Step("cpu", f"p/blk.{n}.pl", op="Pick", inputs=["p/per_layer"],
                                      outputs=[f"p/blk.{n}.pl"], attrs={"index": n}))
    program.steps[1].outputs.append("p/per_layer_proj")  # layer 0's norm also writes the embedding's value
    program.steps.insert(2, Step("cpu", "p/per_layer", op="Scale", inputs=["p/per_layer_proj"],
                                 outputs=["p/per_layer"], attrs={"factor": 0.5}))
    layers = find_layers(program)
    assert [layer.steps for layer in layers] == [[1, 2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 12, 13]]
    kinds = layer_kinds(program, layers)
    assert [[layer.index for layer in k.layers] for k in kinds] == [[0], [1, 2]]
    assert differences(program, kinds) == [["unlike blk.1: RMSNorm blk.0.norm"], []]
