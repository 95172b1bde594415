"""Steps that only reshape a host tensor (runtime/execute.py VIEW_OPS): from the second run
on a reshape of their input, when that holds whatever the run (their other inputs the
program's constants); their first run goes through the kernel and its shape check."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rkc.ir.errors import RkcError
from rkc.ir.program import Program, Step, TensorInfo
from rkc.runtime.execute import run_program


def _model(shape_out):
    """x [2, 3, 4] -> Flatten -> f [2, 12] -> Reshape(constant s) -> r [4, 6];
    x -> Shape -> n (computed) ; f -> Reshape(n) -> back [2, 3, 4]."""
    consts = np.array(shape_out, np.int64)
    tensors = {t.name: t for t in [
        TensorInfo("x", [2, 3, 4], "fp32"), TensorInfo("f", [2, 12], "fp32"),
        TensorInfo("s", [2], "int64", "row", "consts", 0, 16), TensorInfo("r", [4, 6], "fp32"),
        TensorInfo("n", [3], "int64"), TensorInfo("back", [2, 3, 4], "fp32")]}
    steps = [Step("cpu", "flat", op="Flatten", inputs=["x"], outputs=["f"], attrs={"axis": 1}),
             Step("cpu", "re", op="Reshape", inputs=["f", "s"], outputs=["r"]),
             Step("cpu", "shape", op="Shape", inputs=["x"], outputs=["n"]),
             Step("cpu", "back", op="Reshape", inputs=["f", "n"], outputs=["back"])]
    model = SimpleNamespace(tensors=tensors, bos={}, device=None, host_regions={"consts": consts.view(np.uint8)},
                            schedules={}, prepared_submits={})
    return model, Program("main", ["x"], ["r", "back"], steps)


def test_a_reshape_of_constants_becomes_a_view_and_keeps_numpys_result():
    model, program = _model([4, 6])
    rng = np.random.default_rng(0)
    for _ in range(3):  # the first run through the kernels, the next ones through the views
        x = rng.standard_normal((2, 3, 4)).astype(np.float32)
        out, _ = run_program(model, program, {"x": x})
        np.testing.assert_array_equal(out["r"], x.reshape(4, 6))
        np.testing.assert_array_equal(out["back"], x)
        assert not np.shares_memory(out["r"], x) and not np.shares_memory(out["back"], x)
    # Flatten and the constant Reshape are views; the Reshape to a computed shape is not
    assert sorted(model.schedules[id(program)].views) == [0, 1]


def test_a_declared_shape_no_kernel_gives_fails_the_first_run():
    model, program = _model([4, 6])
    model.tensors["r"] = TensorInfo("r", [3, 8], "fp32")  # a crafted module: the constant says [4, 6]
    with pytest.raises(RkcError, match="came out"):
        run_program(model, program, {"x": np.zeros((2, 3, 4), np.float32)})
    assert 1 not in model.schedules[id(program)].views


def test_feeds_taken_as_they_are_only_when_check_feeds_would_take_them_unchanged():
    from rkc.runtime.execute import InputError

    model, program = _model([4, 6])
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    for _ in range(2):  # the first run checked by check_feeds, the second taken straight
        out, _ = run_program(model, program, {"x": x})
        np.testing.assert_array_equal(out["back"], x)
    assert model.schedules[id(program)].fed is not None
    out, _ = run_program(model, program, {"x": x.astype(np.float64)})  # converted, as check_feeds does
    assert out["back"].dtype == np.float32
    np.testing.assert_array_equal(out["back"], x)
    out, _ = run_program(model, program, {"x": x.tolist()})  # not an array: converted
    np.testing.assert_array_equal(out["back"], x)
    for bad in ({"x": x, "y": x}, {"y": x}, {"x": x[:1]}, {"x": x.astype(np.int32)}, {"x": x.reshape(4, 6)}):
        with pytest.raises(InputError):
            run_program(model, program, bad)
