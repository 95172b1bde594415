"""`rkc compile`'s one entry point for every model kind.

`compile_model` recognises the model's kind (compiler/frontend.detect_kind),
checks that every option given applies to that kind and precision (OPTIONS:
each option declared once, with where it applies), fills in the defaults (the
precision per kind: DEFAULT_PRECISION) and runs the kind's pipeline
(COMPILERS): the graph compiler (compiler/build.py) for ONNX and IR text, the
LLM compiler (compiler/llm/build.py) for GGUF. An option meant for another kind
is an OptionError, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from rkc.compiler.build import BuildOptions, Progress, build
from rkc.compiler.frontend import detect_kind
from rkc.compiler.frontend.onnx import parse_image_inputs, parse_input_shapes
from rkc.compiler.llm.build import (DEFAULT_CHUNKS, MAX_DEFAULT_JOBS, PARALLEL_MIN_GGUF_BYTES, LlmCompileOptions,
                                    compile_gguf, default_jobs)
from rkc.compiler.llm.prefill_fp16 import AUTO_MAX_COPY_BYTES, DEFAULT_PREFILL_FP16, PREFILL_FP16_CHOICES
from rkc.compiler.llm.quantize import DEFAULT_FP16_SHARE, DEFAULT_INT4_ROUNDING, DEFAULT_RESIDUAL, DEFAULT_ROUNDING, \
    RESIDUAL_CHOICES, ROUNDINGS
from rkc.compiler.llm.rotate import CHOICES as ROTATIONS, DEFAULT_ROTATION
from rkc.compiler.llm.smooth import DEFAULT_ALPHA
from rkc.compiler.precision import DEFAULT_PRECISION, KIND_NAMES, KINDS, PRECISION_KINDS, PRECISIONS
from rkc.ir.errors import OptionError
from rkc.ir.npu import hw

GRAPHS = ("onnx", "ir")  # the kinds compiler/build.py compiles
INT8 = ("int8",)
INT4 = ("int4",)
INTEGER = ("int8", "int4")  # W8A8 and W4A8 share the weights' preparation (rounding, rotation)
CORE_CHOICES = tuple(str(n) for n in range(1, hw.CORES + 1))
JOB_CHOICES = tuple(str(n) for n in range(1, 17))


@dataclass(frozen=True)
class Option:
    """One `rkc compile` option: `name` is its keyword in compile_model (and the
    CLI parameter), `flag` how it is typed, `kinds`/`precisions` where it applies.
    `value` says what it takes: "flag", "path", "text", float, a (lo, hi) float
    range, or a tuple of choices; `repeat` for an option given many times."""

    name: str
    flag: str
    kinds: tuple[str, ...]
    help: str
    value: object = "text"
    precisions: tuple[str, ...] = PRECISIONS
    default: str | None = None  # shown in --help
    metavar: str | None = None
    repeat: bool = False

    def kind_names(self) -> str:
        return " and ".join(KIND_NAMES[k] for k in self.kinds)

    def where(self) -> str:
        """Where the option applies, for --help ("GGUF LLM, int8"); empty: everywhere."""
        kinds = "" if self.kinds == KINDS else self.kind_names()
        precision = "" if self.precisions == PRECISIONS else "/".join(self.precisions)
        return ", ".join(p for p in (kinds, precision) if p)


OPTIONS: tuple[Option, ...] = (
    Option("precision", "--precision", KINDS,
           "NPU number format: fp16 (no calibration) or int8 (per-channel weights; ONNX: per-tensor "
           "activations, calibrated; GGUF: per-token activations), or int4 (GGUF only: 4-bit weights in "
           "groups along K, int8 activations as two nibble rows).", PRECISIONS,
           default=", ".join(f"{p} for {KIND_NAMES[k]}" for k, p in DEFAULT_PRECISION.items())),
    Option("calib", "--calib", GRAPHS, "calibration set: .npz with one array per input, leading axis over samples.",
           "path", INT8),
    Option("int8_only", "--int8-only", GRAPHS,
           "keep the program int8 (the SQNR rule's groups aside) even where the whole program in fp16 "
           "models faster; without it rkc builds such a program in fp16, the more accurate, and says so.",
           "flag", INT8),
    Option("input_shapes", "--input-shape", ("onnx",), "fix the dynamic dimensions of an input (repeatable).",
           metavar="NAME=1x3x224x224", repeat=True),
    Option("image_inputs", "--image-input", ("onnx",), "take a float NCHW input as a uint8 NHWC image, normalised "
           "per channel by (pixel - mean) / std as the model's first steps (repeatable; the calibration set "
           "holds such images too).", metavar="NAME=M0,M1,M2/S0,S1,S2", repeat=True),
    Option("cores", "--cores", KINDS, "NPU cores the program's tasks are spread over (1 keeps every task on one "
           "core: what single-core published figures measure).", CORE_CHOICES, default=str(hw.CORES)),
    Option("jobs", "--jobs", ("gguf",), "host threads the layers are read, smoothed and encoded on (the "
           "rkbin's bytes do not depend on it; 1: one layer at a time, the least memory).", JOB_CHOICES,
           default=f"1 for a GGUF under {PARALLEL_MIN_GGUF_BYTES >> 30} GiB, else the usable cores, at most "
                   f"{MAX_DEFAULT_JOBS}: {default_jobs(PARALLEL_MIN_GGUF_BYTES)} here"),
    Option("kernel_ppu_irq", "--kernel-ppu-irq", GRAPHS,
           "the target kernel completes PPU tasks (rocket 1.3, kernel/patches/0005; rkc doctor says): fp16 max "
           "pooling runs on the PPU instead of the CPU. The rkbin records it and will not load on an older "
           "kernel.", "flag"),
    Option("npu_attention", "--npu-attention", GRAPHS,
           "split attention's batched products of two run-time tensors (YOLO11n's C2PSA) per head even where "
           "a head's product then stays on the CPU. Without it they are split where every head's products "
           "run on the NPU as fp16 GEMMs (the softmax between them one host pass, "
           "docs/notes/2026-12-06-yolo11-attention.md), else they run batched on the CPU.",
           "flag"),
    Option("explain", "--explain", GRAPHS, "list every op, where it runs and why.", "flag"),
    Option("cpu_only", "--cpu-only", GRAPHS, "place every op on the CPU (for debugging and references).", "flag"),
    Option("prefill_chunks", "--prefill-chunks", ("gguf",),
           "prompt chunk sizes, each with a precompiled prefill program, all kept. Not given: the default's "
           "larger chunks are left out where their activations would not fit beside the weights in the NPU's "
           "IOVA window.", default=",".join(map(str, DEFAULT_CHUNKS)), metavar="SIZES"),
    Option("smooth_alpha", "--smooth-alpha", ("gguf",), "SmoothQuant migration strength (0 disables).", float,
           INT8, default=str(DEFAULT_ALPHA)),
    Option("keep_fp16", "--keep-fp16", ("gguf",),
           "comma-separated weight names (substrings, e.g. ffn_down) whose products stay fp16 (a hybrid).",
           precisions=INT8, metavar="NAMES"),
    Option("prefill_fp16", "--prefill-fp16", ("gguf",),
           "the products the prompt's multi-row programs run in fp16, from an fp16 copy of their weights that "
           "only they read (+2 bytes a copied weight; decode reads the int8 weights either way): all (every "
           "product but the output head: no per-token codes on the prompt's path), ffn (the FFN's: one NPU "
           "segment, no host stretch), none, or auto (all, else ffn, the first whose copy adds at most "
           f"{AUTO_MAX_COPY_BYTES >> 20} MiB).", PREFILL_FP16_CHOICES, INT8, default=DEFAULT_PREFILL_FP16),
    Option("int8_rounding", "--int8-rounding", ("gguf",),
           "weight rounding (gptq: error-compensating, on the calibration text; head-gptq: gptq on the output "
           "head only; hidden-gptq: on the head, q/k/v and gate/up; round-to-nearest elsewhere).",
           tuple(ROUNDINGS), INTEGER, default=f"{DEFAULT_ROUNDING} for int8, {DEFAULT_INT4_ROUNDING} for int4"),
    Option("fp16_share", "--fp16-share", ("gguf",),
           "this share of the product groups stays fp16, those noisiest in int8 on the calibration text "
           "(a measured hybrid; 0: all int8).", (0.0, 1.0), INT8, default=str(DEFAULT_FP16_SHARE)),
    Option("int8_rotation", "--int8-rotation", ("gguf",),
           "randomised Hadamard rotation of each product's input before int8 (kron: one flat transform per row; "
           "hartley: the Hartley matrix of K's odd part, fewer multiply-adds; auto: kron while its factor is "
           "narrow, else hartley; block: block-diagonal; none).", ROTATIONS, INT8, default=DEFAULT_ROTATION),
    Option("int4_group", "--int4-group", ("gguf",),
           "K per int4 weight group, each its own scale and NPU task (auto: the longest groups whose int16 "
           "partials stay in range).", ("auto", "32", "64", "128", "256", "512", "1024"), INT4, default="auto"),
    Option("int4_keep", "--int4-keep", ("gguf",),
           "comma-separated weight names (substrings, e.g. ffn_down) whose products stay int8 (mixed precision).",
           precisions=INT4, metavar="NAMES"),
    Option("int8_residual", "--int8-residual", ("gguf",),
           "products whose input is quantized as two int8 rows, the value and its int8 residual (~15-bit "
           "activations, still int8 products, one weight read): none, the output head, or all.",
           RESIDUAL_CHOICES, INT8, default=DEFAULT_RESIDUAL),
)
BY_NAME = {o.name: o for o in OPTIONS}


def check_options(kind: str, precision: str, given: Mapping[str, object]) -> None:
    """Raise OptionError for the first option given that does not apply to this
    kind of model or this precision."""
    if precision not in PRECISIONS:
        raise OptionError(f"--precision {precision!r}: choose from {', '.join(PRECISIONS)}")
    for name in given:
        option = BY_NAME.get(name)
        if option is None:
            raise OptionError(f"rkc compile has no option {name!r}")
        if kind not in option.kinds:
            raise OptionError(f"{option.flag} applies to {option.kind_names()} models only, not {KIND_NAMES[kind]}")
        if precision not in option.precisions:
            raise OptionError(f"{option.flag} applies to --precision {'/'.join(option.precisions)} only, "
                              f"not {precision}")
    if kind not in PRECISION_KINDS[precision]:
        raise OptionError(f"--precision {precision} applies to "
                          f"{' and '.join(KIND_NAMES[k] for k in PRECISION_KINDS[precision])} models only, "
                          f"not {KIND_NAMES[kind]}")


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise OptionError(f"--prefill-chunks {text!r} is not a comma-separated list of sizes") from None


def _compile_graph(source: Path, output: Path, precision: str, given: Mapping[str, object],
                   progress: Progress) -> list[str]:
    options = BuildOptions(precision=precision, input_shapes=parse_input_shapes(given.get("input_shapes", ())),
                           image_inputs=parse_image_inputs(given.get("image_inputs", ())),
                           calib=given.get("calib"), cpu_only=bool(given.get("cpu_only")),
                           cores=int(given.get("cores", hw.CORES)), ppu_irq=bool(given.get("kernel_ppu_irq")),
                           npu_attention=True if given.get("npu_attention") else None,
                           int8_only=bool(given.get("int8_only")))
    report = build(source, output, options, progress)
    lines = report.summary()
    if given.get("explain"):
        if report.ppu:
            lines.append("max pooling: fp16 pools on the PPU (--kernel-ppu-irq: needs a kernel with "
                         "kernel/patches/0005), the others on the DPU")
        elif any(p.device == "npu" and p.op.type == "MaxPool" for p in report.placements):
            lines.append("max pooling: on the DPU (one-hot depthwise convolutions keeping the element-wise max; "
                         "completes on stock rocket)")
        lines.append("ops (device, op, reason):")
        lines += [f"  {p.device:3s}  {p.op.describe():50s}  {p.reason}" for p in report.placements]
    return lines


def _compile_llm(source: Path, output: Path, precision: str, given: Mapping[str, object],
                 progress: Progress) -> list[str]:
    options = LlmCompileOptions(precision=precision, cores=int(given.get("cores", hw.CORES)))
    if "jobs" in given:
        options = replace(options, jobs=int(given["jobs"]))
    if "prefill_chunks" in given:
        options = replace(options, prefill_chunks=_sizes(str(given["prefill_chunks"])))
    if "smooth_alpha" in given:
        options = replace(options, smooth_alpha=float(given["smooth_alpha"]))
    if "keep_fp16" in given:
        options = replace(options, keep_fp16=tuple(k.strip() for k in str(given["keep_fp16"]).split(",")
                                                   if k.strip()))
    if "prefill_fp16" in given:
        options = replace(options, prefill_fp16=str(given["prefill_fp16"]))
    if "int8_rounding" in given:
        options = replace(options, rounding=str(given["int8_rounding"]), rounding_auto=False)
    if "fp16_share" in given:
        options = replace(options, fp16_share=float(given["fp16_share"]))
    if "int8_rotation" in given:
        options = replace(options, rotation=str(given["int8_rotation"]))
    if "int8_residual" in given:
        options = replace(options, residual=str(given["int8_residual"]))
    if "int4_group" in given:
        options = replace(options, int4_group=0 if given["int4_group"] == "auto" else int(given["int4_group"]))
    if "int4_keep" in given:
        options = replace(options, int4_keep=tuple(k.strip() for k in str(given["int4_keep"]).split(",")
                                                   if k.strip()))
    return compile_gguf(source, output, options, progress).lines


# model kind -> its pipeline (source, output, precision, options given, progress) -> summary lines
COMPILERS: dict[str, Callable[..., list[str]]] = {
    "onnx": _compile_graph,
    "ir": _compile_graph,
    "gguf": _compile_llm,
}


def compile_model(source: str | Path, output: str | Path | None = None, given: Mapping[str, object] | None = None,
                  progress: Progress = lambda stage: None) -> list[str]:
    """Compile any model rkc reads into an .rkbin (default: `source` with .rkbin);
    `given` holds only the options the user gave (OPTIONS names). Returns the
    summary lines."""
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(2, "No such file", str(source))
    given = dict(given or {})
    kind = detect_kind(source)
    precision = str(given.pop("precision", None) or DEFAULT_PRECISION[kind])
    check_options(kind, precision, given)
    out = Path(output) if output else source.with_suffix(".rkbin")
    return COMPILERS[kind](source, out, precision, given, progress)
