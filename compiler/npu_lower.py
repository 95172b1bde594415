"""NPU segments -> NPU steps. Waits for the op emitters (compiler/npu)."""

from __future__ import annotations

from ir.errors import UnsupportedError


def lower_segment(graph, step, builder, precision, program, out_steps, host) -> int:
    raise UnsupportedError("NPU lowering is not available in this build (no emitters)")
