"""GGUF LLM -> rkbin. The stages:

  load (frontend graph) -> dequantize -> [int8: calibrate + SmoothQuant]
  -> encode (int8 per-channel / int4 groups / fp16: compiler/llm/encode.py)
  -> one program per phase (decode,
  prefill_C, score_C), lowered with compiler/llm/program_builder.py through the shared
  ModuleBuilder -> write (atomically), tokenizer JSON as a blob.

Programs: "decode" (1 token), "prefill_C" (C tokens, logits of the last one)
and "score_C" (C tokens, every row's logits: perplexity). Module metadata
(read by runtime/llm/engine.py): model_kind = "llm", llm = LlmConfig dict,
precision, prefill_chunks, placement.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from rkc.compiler.emitter_graph import emit_options
from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
from rkc.compiler.inspect import npu_figures
from rkc.compiler.llm.build_report import CompileReport, peak_rss, report_int4, report_int8, step_summary
from rkc.compiler.llm.calibrated_choices import alpha_histogram, keep_noisiest_fp16, search_alphas
from rkc.compiler.llm.budget import CALIBRATION_BUDGET_S, GPTQ_BUDGET_S, HESSIAN_BUDGET_BYTES, affordable_rounding, \
    calibration_tokens, gptq_cost
from rkc.compiler.llm.calibrate import CALIBRATION_TEXT, MAX_TOKENS as CALIBRATION_MAX_TOKENS, \
    WINDOW as CALIBRATION_WINDOW, Calibration, calibrate
from rkc.compiler.llm.cpu_work import cpu_steps
from rkc.compiler.llm.encode import encode_int4, encode_rows, streamed_rows
from rkc.compiler.llm.int4 import AUTO_GROUP
from rkc.compiler.llm.prefill_fp16 import DEFAULT_PREFILL_FP16, copied_kind, copied_weights, copy_bytes, copy_name, \
    prefill_fp16_line, with_copies
from rkc.compiler.llm.program_builder import EncodedWeight, LlmLowering, program_graph
from rkc.compiler.llm.quantize import (DEFAULT_ALPHA_SEARCH, DEFAULT_FP16_SHARE, DEFAULT_RESIDUAL, RESIDUAL_CHOICES,
                                       ROUNDINGS, SCALES, default_rounding, method_for,
                                       rounding_scheme)
from rkc.compiler.llm.rotate import DEFAULT_ROTATION, rotate_hessian, rotation_for
from rkc.compiler.llm.smooth import DEFAULT_ALPHA, smooth
from rkc.compiler.llm.step_clock import STEPS
from rkc.compiler.llm.weights import (LazyWeights, RowSource, RowTable, by_layer, dequantize_all,
                                      gather_only_tables, progress as progress_bar, row_source)
from rkc.compiler.memplan import IOVA_WINDOW
from rkc.compiler.module_builder import ModuleBuilder
from rkc.compiler.precision import DEFAULT_PRECISION, PRECISIONS
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.llm import DECODE, LlmProgram, program_plan
from rkc.ir.npu import hw
from rkc.ir.rkbin import write_rkbin
from rkc.runtime.llm.tokenizer import LlmTokenizer

T, R = TypeVar("T"), TypeVar("R")
# the compiler's prefill chunks (LlmCompileOptions.prefill_chunks None); 64: 33-64 new tokens (a chat's
# next turn) in one run, not 32 + a padded 32
DEFAULT_CHUNKS = (1, 32, 64, 128, 512)
# int8 products named here stay fp16 (e.g. ("ffn_down",)), besides the measured
# hybrid of `fp16_share` (docs/llm.md)
DEFAULT_KEEP_FP16: tuple[str, ...] = ()
# the default worker count's ceiling: each worker holds one more layer in fp32
# (a 1-2B model's layer is ~0.2 GB), and an 8 GB board's host has 4 big cores
MAX_DEFAULT_JOBS = 4
# below this GGUF size the default is one worker: measured on a 2-core host,
# Gemma 3 270M (0.25 GB) compiles 2-3 s slower in fp16 with 2 workers (14.4 vs
# 16.9 s, 16.8 vs 19.0 s, alternated) and no faster in int8, while Qwen2.5-1.5B
# (1.6 GB) gains 9 % and Gemma 4 E2B (4.9 GB) 11 % (docs/performance.md)
PARALLEL_MIN_GGUF_BYTES = 1 << 30


def default_jobs(gguf_bytes: int) -> int:
    """Host threads `rkc compile` encodes layers on unless told: one for a GGUF
    under PARALLEL_MIN_GGUF_BYTES, else the cores this process may run on (its
    affinity, not the machine's count), at most MAX_DEFAULT_JOBS."""
    if gguf_bytes < PARALLEL_MIN_GGUF_BYTES:
        return 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this OS
        usable = os.cpu_count() or 1
    return max(1, min(usable, MAX_DEFAULT_JOBS))


@dataclass
class LlmCompileOptions:
    precision: str = DEFAULT_PRECISION["gguf"]
    # prompt chunk sizes, each with a prefill program (1 always); None: the compiler's choice,
    # DEFAULT_CHUNKS, whose larger chunks give way to the IOVA window (prefill_chunks())
    prefill_chunks: tuple[int, ...] | None = None
    smooth_alpha: float = DEFAULT_ALPHA  # int8 only; 0 disables SmoothQuant
    # int8 only: products whose weight name contains one of these stay fp16 (hybrid)
    keep_fp16: tuple[str, ...] = DEFAULT_KEEP_FP16
    # int8 only: the weights the multi-row programs read from an fp16 copy (compiler/llm/prefill_fp16.py):
    # all (every product's but the head's), ffn, none (decode's int8), auto (all or ffn while the copy is small)
    prefill_fp16: str = DEFAULT_PREFILL_FP16
    # int8 and int4: how weights are rounded (compiler/llm/quantize.py); "": the precision's
    # default, which compile_gguf lowers when GPTQ's estimate is over budget (compiler/llm/budget.py)
    rounding: str = ""
    rounding_auto: bool = False  # set when rounding was "": the precision's default, not the user's
    scales: str = "max"  # int8 only: how the per-row weight scales are chosen (max or mse)
    calibration: Path = CALIBRATION_TEXT  # int8 only: the text calibration runs the float model on
    calibration_tokens: int = CALIBRATION_MAX_TOKENS  # at most this many of it (compile_gguf: within budget)
    # int8 only: this share of the product groups (one NPU segment each: q+k+v,
    # gate+up, attn_output, ffn_down) stays fp16, the groups whose int8 output is
    # noisiest on the calibration text (a measured hybrid; never the output head)
    fp16_share: float = DEFAULT_FP16_SHARE
    # int8 only: SmoothQuant alpha chosen per product group from calibrated_choices.ALPHA_GRID, the
    # one whose int8 output is least noisy on the calibration text
    alpha_search: bool = DEFAULT_ALPHA_SEARCH
    # int8 only: the orthogonal rotation of each product's input (compiler/llm/rotate.py):
    # kron, block or none
    rotation: str = DEFAULT_ROTATION
    # int8 only: the products whose input is quantized in two int8 rows (value +
    # residual): none, the output head, or all (compiler/llm/quantize.RESIDUAL_CHOICES)
    residual: str = DEFAULT_RESIDUAL
    # int4 only: K per weight group (= the int4 GEMM's K segment; AUTO_GROUP: the fewest
    # groups whose int16 partials these weights keep in range) and the products
    # (weight name substrings) kept int8 (mixed precision, compiler/llm/int4.py)
    int4_group: int = AUTO_GROUP
    int4_keep: tuple[str, ...] = ()
    cores: int = hw.CORES  # NPU cores the programs' tasks are spread over (rkc compile --cores)
    # host threads the layers are encoded on (rkc compile --jobs); the bytes do not depend on it
    jobs: int | None = None  # None: default_jobs(the GGUF's size)


    def __post_init__(self) -> None:
        if not self.rounding:
            self.rounding = default_rounding(self.precision)
            self.rounding_auto = True


def _matrix_names(graph: Graph) -> set[str]:
    """Constants read as matrices (Linear weights, Gather tables)."""
    names = set()
    for op in graph.ops:
        if op.type == "Linear":
            names.add(op.inputs[1])
        elif op.type == "Gather":
            names.add(op.inputs[0])
    return names


def _product_names(graph: Graph) -> set[str]:
    return {op.inputs[1] for op in graph.ops if op.type == "Linear"}


def _smoothed_hessian(h: np.ndarray, s: np.ndarray | None, cache: dict) -> np.ndarray:
    """X^T X of the input x / s a smoothed product sees (one per shared input)."""
    if s is None:
        return h
    key = (id(h), s.tobytes())
    if key not in cache:
        cache[key] = h / np.outer(s, s)
    return cache[key]


def encode_matrices(graph: Graph, weights: Mapping[str, np.ndarray], options: LlmCompileOptions,
                    cal: Calibration | None, factors: dict[str, np.ndarray]) -> dict[str, EncodedWeight]:
    """Every matrix in the form the NPU multiplies it: fp16, or int8 per output
    channel rounded by `options.rounding` (GPTQ uses the calibration's X^T X,
    in the smoothed and rotated coordinates); an int8 product's input axis is
    rotated by `options.rotation` first (a Gather-only table is not)."""
    out: dict[str, EncodedWeight] = {}
    cache: dict = {}
    linear, head = _product_names(graph), _head_name(graph)
    gathered = {op.inputs[0] for op in graph.ops if op.type == "Gather"}
    with progress_bar(by_layer(sorted(_matrix_names(graph))), "encode layers") as layers:
        for group in layers:
            for name in group:
                _encode(name, weights[name], name in linear, name == head, options, cal, factors, cache, out,
                        tied=name in gathered)
    return out


def _encode(name: str, w: "np.ndarray | RowSource", is_product: bool, is_head: bool, options: LlmCompileOptions,
            cal: Calibration | None, factors: dict[str, np.ndarray], cache: dict,
            out: dict[str, EncodedWeight], tied: bool = True) -> None:
    """One matrix (in memory, or a row source never read whole) encoded into
    `out`: fp16, or int8 rounded as options.rounding rounds it (the head or
    the body), a product's input axis rotated first (a Gather-only table is not)."""
    source = row_source(w)
    # a table only gathered from, read from the file: encoded as it is written out
    encode = streamed_rows if not is_product and isinstance(w, RowTable) else encode_rows
    if _precision_of(name, options) == "fp16":
        out[name] = encode(source, "fp16")
        return
    method = method_for(options.rounding, name, is_head)
    h = cal.hessians.get(name) if cal is not None and _needs_hessians(options) else None
    if h is not None:
        h = _smoothed_hessian(h, factors.get(name), cache)
    if encode is streamed_rows:
        out[name] = streamed_rows(source, "int8", method, h, options.scales)
        return
    rot = rotation_for(source.shape[1], options.rotation, options.precision) if is_product else None
    if rot is not None and h is not None:
        key = ("rotated", id(h))
        if key not in cache:
            with STEPS.step("rotate"):
                cache[key] = (h, rotate_hessian(h, rot))  # h kept alive: its id stays unique
        h = cache[key][1]
    if is_product and _precision_of(name, options) == "int4":
        # the int8 rows a tied embedding gathers (an untied head's would go unread: 545 MB on a 7B)
        out[name] = encode_int4(source, options.int4_group, rot, h if method == "gptq" else None,
                                gather=encode_rows(source, "int8") if is_head and tied else None)
        return
    out[name] = encode_rows(source, "int8", rot, method, h, options.scales)


def _integer(options: LlmCompileOptions) -> bool:
    """int8 and int4 builds share calibration, SmoothQuant and rotation (int4 products are W4A8)."""
    return options.precision in ("int8", "int4")


def _measures_whole_model(options: LlmCompileOptions) -> bool:
    """Whether preparing the weights runs the whole model with int8 products
    (the alpha search, the hybrid's noise measurement)."""
    return options.precision == "int8" and (options.alpha_search or options.fp16_share > 0)


def _needs_hessians(options: LlmCompileOptions) -> bool:
    scheme = rounding_scheme(options.rounding)
    return scheme.head or bool(scheme.body) or options.scales != "max"


def _hessian_names(graph: Graph, options: LlmCompileOptions) -> set[str]:
    """The products whose input's X^T X calibration gathers: those GPTQ rounds
    (every product for mse scales, which weigh each input by its energy)."""
    head = _head_name(graph)
    return {n for n in _product_names(graph)
            if options.scales != "max" or method_for(options.rounding, n, n == head) == "gptq"}


def _head_name(graph: Graph) -> str:
    """The output head's weight (the product that writes the logits)."""
    return next(op.inputs[1] for op in graph.ops if op.type == "Linear" and op.outputs[0] == "logits")


# bits a weight of each NPU precision takes in the weights region
WEIGHT_BITS = {"int4": 4, "int8": 8, "fp16": 16}


def check_npu_weights_fit(graph: Graph, options: LlmCompileOptions, window: int = IOVA_WINDOW) -> None:
    """Refuse, before minutes of quantizing, a model whose products' weights alone
    (no padding, no activations: a lower bound) cannot be mapped in the NPU's 32-bit
    IOVA window; the written module is checked whole at the end (check_iova_window)."""
    products = {op.inputs[1] for op in graph.ops if op.type == "Linear" and graph.tensors[op.inputs[1]].kind == "const"}
    need = sum(int(np.prod(graph.tensors[w].type.shape)) * WEIGHT_BITS[_precision_of(w, options)] // 8
               for w in products)
    need += copy_bytes(graph, prefill_copies(graph, options))
    if need >= window:
        raise UnsupportedError(
            f"the model's {options.precision} NPU weights need at least {need / 2**20:.0f} MiB, more than the "
            f"{window / 2**20:.0f} MiB the NPU's 32-bit IOVA window holds"
            + ("; --precision int4 stores half the bytes" if options.precision != "int4" else ""))


def prefill_copies(graph: Graph, options: LlmCompileOptions) -> list[str]:
    """The FFN weights whose fp16 copy the multi-row programs read (prefill_fp16.py)."""
    return copied_weights(graph, options.precision, options.prefill_fp16, options.keep_fp16)


def _encode_copies(names: Iterable[str], weights: Mapping[str, "np.ndarray | RowSource"],
                   out: dict[str, EncodedWeight]) -> None:
    """The fp16 copies of (smoothed) FFN weights `names` into `out`."""
    for name in names:
        out[copy_name(name)] = encode_rows(row_source(weights[name]), "fp16")


def _precision_of(name: str, options: LlmCompileOptions) -> str:
    if options.precision == "int8" and any(k in name for k in options.keep_fp16):
        return "fp16"
    if options.precision == "int4" and any(k in name for k in options.int4_keep):
        return "int8"
    return options.precision


def prepare_weights(graph: Graph, cfg, tokenizer: LlmTokenizer, weights: dict[str, np.ndarray],
                    options: LlmCompileOptions, report: CompileReport | None = None
                    ) -> tuple[dict[str, EncodedWeight], dict[str, np.ndarray]]:
    """fp32 weights -> (encoded matrices, fp32 vectors): for int8, calibrate,
    SmoothQuant (folded into the norms / producing rows) and round. `weights`
    is consumed (smoothed in place); LazyWeights stream (prepare_streamed).
    On one BLAS thread, whoever calls: calibration's products are [64, K] x
    [K, N]; measured on Gemma 3 270M (this 2-core machine, shared), OpenBLAS's
    2 threads took 59.9 s of CPU (182.7 s wall) to one thread's 8.2 s (22.0 s
    wall). And a float product's bits depend on the thread count, so the CPU
    emulation (tests, tools/llm_quant_eval.py) gets the compile's weights."""
    report = report or CompileReport()
    with threadpool_limits(limits=1, user_api="blas"):
        matrices, vectors = _prepare_weights(graph, cfg, tokenizer, weights, options, report)
    _report_prefill_fp16(graph, matrices, options, report)
    return matrices, vectors


def _report_prefill_fp16(graph: Graph, matrices: dict[str, EncodedWeight], options: LlmCompileOptions,
                         report: CompileReport) -> None:
    """An int8 build's prefill products (prefill_fp16.py): one report line, and rkc inspect's entry."""
    if options.precision != "int8":
        return
    copies = [w for w in prefill_copies(graph, options) if copy_name(w) in matrices]
    kind = copied_kind(graph, options.precision, options.prefill_fp16, options.keep_fp16) if copies else "none"
    extra = sum(matrices[copy_name(w)].data.nbytes for w in copies)
    report.quantization["prefill_fp16"] = {"choice": options.prefill_fp16, "products": kind,
                                           "copies": len(copies), "extra_weight_bytes": extra}
    report.say(prefill_fp16_line(report.quantization["prefill_fp16"]))


def _prepare_weights(graph: Graph, cfg, tokenizer: LlmTokenizer, weights: dict[str, np.ndarray],
                     options: LlmCompileOptions, report: CompileReport | None
                     ) -> tuple[dict[str, EncodedWeight], dict[str, np.ndarray]]:
    if isinstance(weights, LazyWeights):
        return prepare_streamed(graph, cfg, tokenizer, weights, options, report)
    report = report or CompileReport()
    cal, factors = None, {}
    alpha: float | dict[str, float] = options.smooth_alpha
    if _integer(options) and (options.smooth_alpha > 0 or _needs_hessians(options)):
        cal = calibrate(graph, cfg, weights, tokenizer, hessians=_hessian_names(graph, options),
                        text=Path(options.calibration).read_text(), max_tokens=options.calibration_tokens)
        if options.alpha_search:
            alpha = search_alphas(graph, cfg, tokenizer, weights, cal, options, _product_names(graph), _head_name(graph))
            report.say(f"int8: SmoothQuant alpha per product group, least int8 output noise on the calibration "
                       f"text: {alpha_histogram(alpha)}")
        if options.alpha_search or options.smooth_alpha > 0:
            factors = smooth(graph, weights, cal.ranges, alpha)
            report.say(f"int8: SmoothQuant on {len(factors)} matrices, "
                       f"calibrated on {Path(options.calibration).name} ({cal.tokens} tokens)")
    matrices = encode_matrices(graph, weights, options, cal, factors)
    if _integer(options):
        _set_residual_terms(graph, matrices, options)
        report_int8(matrices, options, cal, alpha, report)
        if options.fp16_share > 0:
            keep_noisiest_fp16(graph, cfg, tokenizer, weights, matrices, options, report, _head_name(graph))
    vectors = {n: weights[n].astype(np.float32) for n in weights if n not in matrices}
    _encode_copies([w for w in prefill_copies(graph, options) if matrices[w].kind != "fp16"], weights, matrices)
    return matrices, vectors


def prepare_streamed(graph: Graph, cfg, tokenizer: LlmTokenizer, weights: LazyWeights, options: LlmCompileOptions,
                     report: CompileReport | None = None) -> tuple[dict[str, EncodedWeight], dict[str, np.ndarray]]:
    """What prepare_weights computes, one layer at a time from the mapped file:
    calibration runs layer by layer, then each layer's weights are read in
    fp32, smoothed and encoded, and let go; a matrix SmoothQuant leaves alone
    (a tied head, a Gather table) is encoded in row blocks (rows are rounded
    independently), so no whole fp32 copy of it is made either. Not for the
    schemes that measure the whole int8 model (alpha search, fp16 share)."""
    report = report or CompileReport()
    if options.alpha_search or options.fp16_share > 0:
        raise ValueError("the alpha search and the fp16 hybrid measure the whole model: use prepare_weights")
    cal = None
    if _integer(options) and (options.smooth_alpha > 0 or _needs_hessians(options)):
        with STEPS.step("calibration"):
            cal = calibrate(graph, cfg, weights, tokenizer, hessians=_hessian_names(graph, options),
                            text=Path(options.calibration).read_text(), max_tokens=options.calibration_tokens)
    consumers = graph.consumers()
    linear, head = _product_names(graph), _head_name(graph)
    gathered = {op.inputs[0] for op in graph.ops if op.type == "Gather"}
    matrix_names = _matrix_names(graph)
    smoothable = {n for n in linear if len(consumers[n]) == 1}
    copies = set(prefill_copies(graph, options))
    matrices: dict[str, EncodedWeight] = {}
    copied: dict[str, EncodedWeight] = {}
    vectors: dict[str, np.ndarray] = {}
    factors: dict[str, np.ndarray] = {}
    cache: dict = {}  # shared by the workers: a race computes an entry twice, the same values

    def layer(group: list[str]) -> tuple[dict[str, EncodedWeight], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """One layer's weights read, smoothed and encoded (its own names only)."""
        with STEPS.step("read"):
            held = {n: weights[n] for n in group if n not in matrix_names or n in smoothable}
        done, floats = {}, {}
        with STEPS.step("smooth"):
            smoothed = smooth(graph, held, cal.ranges, options.smooth_alpha) \
                if cal is not None and options.smooth_alpha > 0 else {}
        for name in group:
            if name not in matrix_names:
                floats[name] = held[name].astype(np.float32)
            else:  # one SmoothQuant leaves alone (a tied head, a Gather table): from the file in row blocks
                w = held[name] if name in held else weights.source(name)
                _encode(name, w, name in linear, name == head, options, cal, smoothed, cache, done,
                        tied=name in gathered)
        fp16 = {}
        _encode_copies([n for n in group if n in copies],  # a matrix SmoothQuant left alone: from the file
                       {n: held[n] if n in held else weights.source(n) for n in group if n in copies}, fp16)
        return done, floats, smoothed, fp16

    with progress_bar(by_layer(list(weights)), "quantize layers") as layers:
        # jobs None: a caller other than compile_gguf (which resolves it from the GGUF's size)
        for done, floats, smoothed, fp16 in in_order(layer, layers, options.jobs or 1):
            matrices.update(done)
            vectors.update(floats)
            factors.update(smoothed)
            copied.update(fp16)
    if cal is not None and options.smooth_alpha > 0:
        report.say(f"int8: SmoothQuant on {len(factors)} matrices, "
                   f"calibrated on {Path(options.calibration).name} ({cal.tokens} tokens)")
    if _integer(options):
        _set_residual_terms(graph, matrices, options)
        report_int8(matrices, options, cal, options.smooth_alpha, report)
    return matrices | copied, vectors


def in_order(work: Callable[[T], R], items: Iterable[T], jobs: int) -> Iterator[R]:
    """work(item) for every item, results in the items' order; with jobs > 1
    on that many threads (numpy lets the GIL go in dequantizing, rotating and
    rounding), at most `jobs` items in flight, so memory stays a few layers'."""
    if jobs <= 1:
        yield from map(work, items)
        return
    with ThreadPoolExecutor(jobs, thread_name_prefix="rkc-encode") as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(work, item))
            if len(pending) >= jobs:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _set_residual_terms(graph: Graph, matrices: dict[str, EncodedWeight], options: LlmCompileOptions) -> None:
    """Two int8 activation terms (value + residual) for the products options.residual names."""
    if options.residual not in RESIDUAL_CHOICES:
        raise UnsupportedError(f"int8 residual {options.residual!r} is not known (choose "
                               f"{', '.join(RESIDUAL_CHOICES)})")
    head = _head_name(graph)
    for name in _product_names(graph):
        enc = matrices[name]
        if enc.scale is not None and (options.residual == "all" or (options.residual == "head" and name == head)):
            matrices[name] = replace(enc, act_terms=2)


def within_budget(graph: Graph, options: LlmCompileOptions, report: CompileReport) -> LlmCompileOptions:
    """`options` with the calibration cut to its time budget and, when the rounding
    was the precision's default, GPTQ narrowed to what fits its budget
    (compiler/llm/budget.py), each change one report line."""
    if not _integer(options):
        return options
    tokens = calibration_tokens(graph, options.calibration_tokens, CALIBRATION_WINDOW)
    if tokens < options.calibration_tokens:
        report.say(f"{options.precision}: calibration on at most {tokens} tokens of the text "
                   f"(more would take over {CALIBRATION_BUDGET_S / 60:.0f} CPU min on a model this size)")
        options = replace(options, calibration_tokens=tokens)
    if options.rounding_auto:
        scheme, _ = affordable_rounding(graph, options.rounding)
        if scheme != options.rounding:
            report.say(f"{options.precision}: rounding {scheme} ({rounding_scheme(scheme).summary}), not the default "
                       f"{options.rounding}: GPTQ would need {gptq_cost(graph, options.rounding).describe()} "
                       f"(budget {HESSIAN_BUDGET_BYTES / 2**30:.0f} GiB, {GPTQ_BUDGET_S / 60:.0f} min; "
                       f"--int8-rounding to choose)")
            options = replace(options, rounding=scheme)
    return options


def prefill_chunks(options: LlmCompileOptions) -> tuple[tuple[int, ...], bool]:
    """The prefill chunks to lower (ascending, 1 always among them) and whether
    they give way to the IOVA window: the compiler's choice (options.prefill_chunks
    None: DEFAULT_CHUNKS) does; chunks given, whatever they are, are all kept
    (a module past the window is then refused once built)."""
    sizes = DEFAULT_CHUNKS if options.prefill_chunks is None else options.prefill_chunks
    chunks = tuple(sorted(set(sizes) | {1}))
    if any(c <= 0 for c in chunks):
        raise UnsupportedError(f"prefill chunk sizes must be positive, got {list(sizes)}")
    return chunks, options.prefill_chunks is None


def lower_programs(graph: Graph, plan: list[LlmProgram], builder: ModuleBuilder, lowering: LlmLowering,
                   give_way: bool, copies: list[str] = ()) -> list[int]:
    """Lower `plan`'s programs (ascending rows: a chunk's prefill and score
    programs together) into `builder`, each with its metadata. With `give_way`,
    a chunk whose scratch and regcmd, estimated per row from the smaller
    chunks', would pass the IOVA window beside what is mapped already is left
    out, with every larger one (a chunk's scratch grows with its rows: a 7B
    int4's 512-chunk needs 893 MiB beside 3371 of weights). The multi-row
    programs read the fp16 copies of weights `copies` (prefill_fp16.py).
    The chunks left out."""
    scratch_per_row, regcmd_per_row, left_out, decided = 0.0, 0.0, [], set()
    chunk_start = (1, builder.regcmd.size)  # the rows of the chunk being lowered, the regcmd before it
    with progress_bar(plan, "lower programs") as programs:
        for program in programs:
            if give_way and program.rows > 1 and program.rows not in decided:
                decided.add(program.rows)
                if chunk_start[0] > 1:  # the previous chunk's programs' regcmd, per row
                    regcmd_per_row = (builder.regcmd.size - chunk_start[1]) / chunk_start[0]
                chunk_start = (program.rows, builder.regcmd.size)
                grows = (scratch_per_row + regcmd_per_row) * program.rows
                if left_out or builder.mapped_bytes() + grows >= IOVA_WINDOW:
                    left_out.append(program.rows)
            if program.rows in left_out:
                continue
            g = program_graph(graph, program)
            lowering.lower(with_copies(g, copies) if program.rows > 1 else g, program.name)
            builder.metadata["programs"][program.name] = program.metadata()
            if program.rows > 1:
                scratch_per_row = max(scratch_per_row, builder.scratch_bytes(program.name) / program.rows)
    return left_out


def compile_gguf(path: str | Path, out: str | Path, options: LlmCompileOptions,
                 progress: Callable[[str], None] = lambda stage: None) -> CompileReport:
    """`progress(stage)` is called as each stage starts (rkc compile -v)."""
    report = CompileReport()
    t0, cpu0 = time.perf_counter(), time.process_time()
    if options.precision not in PRECISIONS:
        raise UnsupportedError(f"precision {options.precision!r} is not supported (choose {' or '.join(PRECISIONS)})")
    folder = Path(out).parent
    if not folder.is_dir():  # before minutes of work: the regions are spooled there as they are made
        raise FileNotFoundError(2, "No such folder for the output", str(folder))
    if options.jobs is None:
        options = replace(options, jobs=default_jobs(Path(path).stat().st_size))
    chunks, give_way = prefill_chunks(options)

    def lap(stage: str, following: str | None = None) -> None:
        report.seconds[stage] = time.perf_counter() - t0 - sum(report.seconds.values())
        report.cpu_seconds[stage] = time.process_time() - cpu0 - sum(report.cpu_seconds.values())
        report.peak_rss[stage] = peak_rss()
        if following:
            progress(following)

    progress("load")
    gf = GgufFile(path)
    graph = graph_from_gguf(gf)
    cfg = gf.config()
    check_npu_weights_fit(graph, options)
    tokenizer = LlmTokenizer.from_gguf_fields(
        gf.take_tokenizer_fields(), str(path))
    lap("load", "dequantize")
    tables = gather_only_tables(graph)
    consts = [n for n, t in graph.tensors.items() if t.kind == "const" and n not in tables]
    # the schemes that measure the whole int8 model on the calibration text need
    # every weight in fp32 at once; the others stream (prepare_streamed). A table
    # that is only gathered from is never whole in fp32 (RowTable).
    if _measures_whole_model(options):
        weights = {**dequantize_all(gf, consts, None), **{name: RowTable(gf, name) for name in tables}}
    else:
        weights = LazyWeights(gf, consts, tables)
    lap("dequantize", "quantize")
    if _integer(options) and (options.rounding not in ROUNDINGS or options.scales not in SCALES):
        raise UnsupportedError(f"int8 weights: rounding {options.rounding!r} / scales {options.scales!r} not known "
                               f"(rounding: {', '.join(ROUNDINGS)}; scales: {' or '.join(SCALES)})")
    options = within_budget(graph, options, report)
    STEPS.take()
    matrices, vectors = prepare_weights(graph, cfg, tokenizer, weights, options, report)
    steps = STEPS.take()
    copies = [w for w in prefill_copies(graph, options) if copy_name(w) in matrices]
    kept = sorted(n for n in matrices if _precision_of(n, options) != options.precision and n not in
                  {copy_name(w) for w in copies})
    if options.precision == "int4":
        report_int4(matrices, options, report)
    elif kept:
        report.say(f"int8: {len(kept)} products kept fp16 ({', '.join(options.keep_fp16)}): "
                   f"{sum(matrices[n].data.nbytes for n in kept) / 1e6:.1f} MB")
    del weights
    lap("quantize", "lower")
    report.say(step_summary(steps, report.cpu_seconds["quantize"]))
    head = _head_name(graph)
    gather = [op for op in graph.ops if op.type == "Gather"][0].inputs[0]
    placement = {"prefill": "npu", "decode": "npu",
                 "reason": "every matrix product on the NPU; norms, RoPE, attention over the KV cache, "
                           "softmax and the conversions at segment edges on the CPU"}
    builder = ModuleBuilder(metadata={
        "model_kind": "llm", "llm": cfg.to_dict(), "precision": options.precision,
        "prefill_chunks": list(chunks), "placement": placement, "quantization": report.quantization,
        "source": Path(path).name, "cores": options.cores,
        "name": graph.name, "producer": "rkc", "programs": {}},
        spool_dir=folder)  # the weights and host tables go to disk as they are made
    lowering = LlmLowering(builder, options.precision, matrices, vectors, gather, head,
                           emit_options=replace(emit_options(options.cores), pack_cache={}))
    plan = program_plan(chunks)
    left_out = lower_programs(graph, plan, builder, lowering, give_way, copies)
    if left_out:
        chunks = tuple(c for c in chunks if c not in left_out)
        builder.metadata["prefill_chunks"] = list(chunks)
        plan = [p for p in plan if p.rows not in left_out]
        report.say(f"prefill chunks {', '.join(map(str, left_out))} left out: their activations would "
                   f"not fit beside the weights in the NPU's {IOVA_WINDOW / 2**30:.0f} GiB IOVA window "
                   f"(--prefill-chunks chooses)")
    lap("lower", "write")
    lowering.release()
    del matrices, vectors
    module, blobs, _plans = builder.finish()
    for program in module.programs:  # a run's modelled NPU time, which runtime/llm/generate.chunk_plan weighs
        module.metadata["programs"][program.name]["modelled_npu_s"] = npu_figures(program.steps).seconds_chained
    blobs = {**blobs, "tokenizer": np.frombuffer(tokenizer.to_json().encode(), np.uint8)}
    size = write_rkbin(out, module, blobs)
    lap("write")
    weight_bytes = int(blobs["weights"].size) if "weights" in blobs else 0
    d = lowering.stats[DECODE]
    report.say(f"{Path(path).name}: {cfg.arch}, {cfg.n_layer} layers, vocab {cfg.n_vocab}; "
               f"{options.precision} NPU weights {weight_bytes / 1e6:.1f} MB (one copy for {len(plan)} programs)")
    report.say(f"decode: {d.segments} NPU segments, {d.npu_tasks} tasks, "
               f"{cpu_steps(module.program(DECODE))} CPU steps per token")
    for program in plan:
        if program.last_row_only:
            p = lowering.stats[program.name]
            report.say(f"{program.name}: {p.segments} NPU segments, {p.npu_tasks} tasks, "
                       f"{cpu_steps(module.program(program.name))} CPU steps")
    report.say(f"placement: {placement['reason']}")
    report.say("stages: " + ", ".join(f"{k} {v:.1f} s (cpu {report.cpu_seconds[k]:.1f} s, peak "
                                      f"{report.peak_rss[k] / 1e9:.2f} GB)" for k, v in report.seconds.items()))
    report.say(f"wrote {out} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return report
