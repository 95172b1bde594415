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
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from rkc.compiler.fakequant import run_ops, start_env
from rkc.compiler.quantize import load_calibration
from rkc.compiler.reference import run_graph
from rkc.ir.graph import Graph

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
