"""The NPU op declarations agree: every operation of the emitter API has one
emitter, every graph op declared to run on the NPU has a builder and the other
way round, and compiler/npu/api.py stays a leaf (the contract, no implementers)."""

from __future__ import annotations

import subprocess
import sys

from rkc.compiler.npu import api, dispatch, mesa


def test_every_api_operation_has_one_emitter():
    assert set(dispatch.LOWERINGS) == {*api.OPERATIONS, mesa.MesaConv}


def test_api_is_a_leaf():
    """Importing the contract loads no emitter, dispatcher or assembler."""
    code = ("import sys, rkc.compiler.npu.api\n"
            "print(' '.join(m for m in sys.modules if m.startswith('rkc.compiler') and m not in "
            "('rkc.compiler', 'rkc.compiler.npu', 'rkc.compiler.npu.api')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []
