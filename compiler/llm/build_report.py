"""What an LLM compile reports: the stage figures (CompileReport), the int8
and int4 encodings in words and as module metadata (rkc inspect reads it),
the quantize stage's CPU by step, and the process's peak memory."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rkc.compiler.llm.calibrate import Calibration
from rkc.compiler.llm.program_builder import EncodedWeight
from rkc.compiler.llm.quantize import rounding_scheme
from rkc.compiler.llm.rotate import NONE

if TYPE_CHECKING:
    from rkc.compiler.llm.build import LlmCompileOptions


@dataclass
class CompileReport:
    lines: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # the process's CPU time (user + system) per stage
    peak_rss: dict[str, int] = field(default_factory=dict)  # bytes, the process's peak at the end of each stage
    quantization: dict = field(default_factory=dict)  # int8: how (module metadata, rkc inspect)

    def say(self, text: str) -> None:
        self.lines.append(text)


def report_int8(matrices: dict[str, EncodedWeight], options: LlmCompileOptions, cal: Calibration | None,
                 alpha: float | dict[str, float], report: CompileReport) -> None:
    report.say(f"int8: weights per output channel, {options.scales} scales, rounded by {options.rounding} "
               f"({rounding_scheme(options.rounding).summary}); "
               f"{rotation_summary(matrices, options.rotation)}; {residual_summary(matrices)}")
    report.quantization = {"smooth_alpha": alpha, "rounding": options.rounding, "scales": options.scales,
                           "residual": options.residual,
                           "rotation": options.rotation, "rotation_forms": rotation_forms(matrices),
                           "calibration": Path(options.calibration).name if cal is not None else None,
                           "keep_fp16": list(options.keep_fp16)}


def report_int4(matrices: dict[str, EncodedWeight], options: LlmCompileOptions, report: CompileReport) -> None:
    """Which products run int4 and which stay int8 (rkc inspect shows each NPU layer's dtype)."""
    four = sorted(n for n, e in matrices.items() if e.int4_scales is not None)
    eight = sorted(n for n, e in matrices.items() if e.int4_scales is None and e.scale is not None
                   and e.blocks is None and n not in gathered_only(matrices))
    nbytes = sum(matrices[n].data.size + matrices[n].int4_scales.nbytes for n in four)
    groups = sorted({(2 * matrices[n].data.shape[1], matrices[n].int4_group) for n in four})
    report.say(f"int4: {len(four)} products W4A8 (int4 weights in groups along K, a scale per group and output "
               f"channel: {', '.join(f'K={k}: {g}' for k, g in groups)}; int8 activations as two nibble rows): "
               f"{nbytes / 1e6:.1f} MB"
               + (f"; {len(eight)} kept int8 ({', '.join(options.int4_keep)})" if options.int4_keep else ""))
    report.quantization["int4"] = {"group": options.int4_group or "auto", "groups": {str(k): g for k, g in groups},
                                   "products": len(four), "keep_int8": eight,
                                   "weight_bytes": nbytes}


def gathered_only(matrices: dict[str, EncodedWeight]) -> set[str]:
    return {n for n, e in matrices.items() if e.blocks is not None}


def residual_summary(matrices: dict[str, EncodedWeight]) -> str:
    two = sum(1 for e in matrices.values() if e.act_terms == 2)
    if not two:
        return "activations one int8 row per token"
    return f"activations of {two} products two int8 rows per token (value + residual, one weight read)"


def rotation_forms(matrices: dict[str, EncodedWeight]) -> dict[str, str]:
    """Input width -> the rotation's construction (e.g. "640": "H20 (x) H32")."""
    from rkc.runtime.kernels.hadamard import describe

    return {str(k): describe(r) for k, r in sorted({e.rotation.size: e.rotation for e in matrices.values()
                                                    if e.rotation is not None}.items())}


def rotation_summary(matrices: dict[str, EncodedWeight], kind: str) -> str:
    if kind == NONE:
        return "inputs not rotated"
    forms = ", ".join(f"K={k}: {f}" for k, f in rotation_forms(matrices).items())
    return f"inputs rotated ({kind}: {forms})"


def peak_rss() -> int:
    """This process's peak resident bytes: VmHWM, its own memory's high-water
    mark since exec. getrusage's ru_maxrss also counts the parent's high-water
    mark when the parent spawned it by vfork (Python's subprocess does): a
    bench that wrote a 5 GB GGUF first would lend the compile its peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def step_summary(steps: dict[str, float], total: float) -> str:
    """The quantize stage's CPU seconds by step (compiler/llm/step_clock.py), largest first;
    calibration's reading of the weights is part of calibration, given apart."""
    steps = dict(steps)
    read = steps.pop("calibration read", 0.0)
    if "calibration" in steps:
        steps["calibration"] -= read
        steps["calibration read"] = read
    steps["other"] = max(0.0, total - sum(steps.values()))
    ranked = sorted(steps.items(), key=lambda kv: -kv[1])
    return "quantize CPU by step: " + ", ".join(f"{k} {v:.1f} s" for k, v in ranked)


