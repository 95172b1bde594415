"""`rkc inspect --svg` on a ResNet-50-class ONNX model (onnx's bundled
light_resnet50): the picture Graphviz drew (read back from the SVG) shows each
NPU segment with its op count, precision, tasks and bytes, the CPU ops and the
layout conversions as notes, tensors' bytes on the edges, input to output."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from rkc.compiler.build import BuildOptions, build
from rkc.ir.rkbin import read_rkbin
from real_models import real_models
from svg_picture import read_svg

BIN = Path(sys.executable).parent
RESNET = {m.name: m for m in real_models()}.get("light_resnet50")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
@pytest.mark.skipif(RESNET is None, reason="the onnx package's light_resnet50 is not installed")
def test_resnet50_picture(tmp_path):
    build(RESNET.path, tmp_path / "r.rkbin", BuildOptions())
    r = subprocess.run([str(BIN / "rkc"), "inspect", str(tmp_path / "r.rkbin"), "--svg", str(tmp_path / "r.svg"),
                        "--png", str(tmp_path / "r.png")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    program = read_rkbin(tmp_path / "r.rkbin").module.programs[0]
    pic = read_svg(tmp_path / "r.svg")
    assert pic.clusters == {}, "no repeated layers named blk.N: nothing folded"
    steps = {int(n.removeprefix("step")): lines for n, lines in pic.nodes.items() if n.startswith("step")}
    assert sorted(steps) == list(range(len(program.steps)))
    segment = 0
    for i, s in enumerate(program.steps):
        lines = steps[i]
        if s.kind == "npu":
            segment += 1
            ops = sum(len(layer["op"].split("+")) for layer in s.stats["layers"])
            assert lines[0] == f"NPU segment {segment} (fp16)", lines
            assert f"{ops} op{'s' if ops > 1 else ''}, {s.stats['tasks']} task{'s' if s.stats['tasks'] > 1 else ''}" \
                in lines, lines
            if ops > 4:  # a long segment counts its ops per type
                assert "Conv" in lines[1], lines
        elif s.name.startswith(("to_npu:", "from_npu:")):
            assert lines[0].startswith(s.name.split(":")[0] + ": " + s.op), lines
        else:
            assert lines[0] == s.op, lines
    assert segment >= 2 and {"MaxPool", "Softmax"} <= {lines[0] for lines in steps.values()}
    assert all(label.endswith(" B") for label in pic.edges.values())
    g = nx.DiGraph(list(pic.edges))
    assert nx.has_path(g, f"in:{program.inputs[0]}", f"out:{program.outputs[0]}")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
