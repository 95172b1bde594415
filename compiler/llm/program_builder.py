"""LLM programs -> rkbin steps: NPU segments for the matrix products, CPU steps
for everything else, conversions at the edges, all written through the shared
ModuleBuilder (one copy of the weights, shared by every program).

* Each program (decode = 1 token, prefill_C / score_C = C tokens) is the
  frontend graph with T fixed and its values renamed "<program>/<tensor>".
* Every Linear goes to the NPU as an emitter GEMM (compiler/npu/api.Gemm) named
  after its weight, so every program's GEMM of a weight packs the same bytes
  under the same name. The partitioner (compiler/partition.py) groups Linears
  that no CPU op separates into one segment (q/k/v; gate/up; ...);
  compiler/emitter_ops.lower_segment assembles a segment into one NPU step.
* Conversions at a segment's edges, on the CPU:
    fp16: Cast fp32 -> fp16 (native GEMM layout) before, Cast back after;
    int8 (W8A8): QuantizeRows (int8 per token, scale per row) before; the NPU
          accumulates int8 x int8 in int32; DequantizeRows (row scale x
          per-output-channel weight scale, + bias) after.
* A product whose K exceeds one task's input channels (k_tile_max, 8192) runs
  as one GEMM per K range (compiler/npu/gemm.k_ranges) in the same segment; the
  CPU step after it adds their int32 (exact: the same integer sum) or fp32
  outputs.
* The embedding gather reads the rows it needs straight from the packed NPU
  weights of a tied output head (GatherPacked), or from a host table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from rkc.compiler.module_builder import ModuleBuilder, PlacedBytes
from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.npu.gemm import k_ranges
from rkc.compiler.npu.gemm_int4 import PAIRED_ROWS
from rkc.compiler.npu.placement import place_segment, place_segment_int4
from rkc.compiler.emitter_graph import CHAINABLE, EMIT_OPTIONS, npu_name
from rkc.compiler.emitter_ops import NpuGroup, lower_segment
from rkc.compiler.llm.ffn_fusion import ACTIVATION_LUT, GatedFfn, gated_ffns, operand_rows
from rkc.compiler.partition import partition
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.llm import LlmProgram
from rkc.ir.npu import geometry, layout
from rkc.ir.program import Step
from rkc.ir.types import DType, TensorType
from rkc.runtime.kernels.hadamard import Rotation
from rkc.runtime.llm.weights import Int8Weight, Weight


@dataclass
class EncodedWeight:
    """A matrix as the NPU multiplies it: int8 + per-output-channel scale, or fp16."""

    data: np.ndarray  # [N, K] int8 or fp16; int4: [N, K / 2] bytes, two values each (int4_values)
    scale: np.ndarray | None = None  # [N] fp32 (int8)
    rotation: Rotation | None = None  # int8: the input axis is rotated (data ~ W R; compiler/llm/rotate.py)
    # int8: int8 rows per activation row (2: the value and its int8 residual, run as
    # more rows of the same product; runtime/llm/weights.quantize_rows)
    act_terms: int = 1
    # a Gather-only table encoded into the output as it is lowered, never whole:
    # data (and an int8 scale) are zero-stride stand-ins of their shapes, and
    # this yields its (first row, encoded rows, their scales or None) block by block
    blocks: Callable[[], Iterator[tuple[int, np.ndarray, np.ndarray | None]]] | None = None
    # int4 (W4A8, compiler/llm/int4.py): data holds int4 values, these the scales per
    # K group and output channel [G, N]; `gather` the int8 rows a tied embedding reads
    int4_scales: np.ndarray | None = None
    int4_group: int = 0
    gather: "EncodedWeight | None" = None

    @property
    def kind(self) -> str:
        """The NPU product's precision: int4, int8 or fp16."""
        return "int4" if self.int4_scales is not None else "int8" if self.data.dtype == np.int8 else "fp16"

    def int4_values(self) -> np.ndarray:
        """An int4 matrix's values [N, K] as int8 (`data` holds two per byte, even K in the
        low nibble: a 7B model's int4 weights are 3.5 GB so, 7 GB a value per byte)."""
        n, half = self.data.shape
        if self.data.strides == (0, 0):  # let go once packed for the NPU (LlmLowering.packed)
            return np.broadcast_to(np.int8(0), (n, 2 * half))
        return layout.unpack_nibbles(self.data)

    def as_runtime(self) -> "Int8Weight | Weight":
        """The weight as the runtime's CPU arithmetic computes it (the CPU emulation of the NPU's)."""
        if self.scale is None:
            return Weight(self.data)
        return Int8Weight(self.data, self.scale, self.rotation, self.act_terms)


@dataclass
class ProgramStats:
    segments: int = 0
    npu_tasks: int = 0
    # (the CPU steps are counted from the built program: compiler/llm/cpu_work.cpu_steps)


def program_graph(base: Graph, program: LlmProgram) -> Graph:
    """`base` with T = the program's rows, values renamed program.tensor(name)
    (constants keep their names: they are shared); optionally only the last row
    reaches the head."""
    name, rows, last_row_only = program.name, program.rows, program.last_row_only
    g = Graph(name=f"{base.name}:{name}", metadata=dict(base.metadata))

    def fix(t: TensorType, n: int) -> TensorType:
        return TensorType(t.dtype, tuple(n if d == "T" else d for d in t.shape), t.quant)

    ren = {}
    for tname, t in base.tensors.items():
        if t.kind == "const":
            g.add_const(tname, t.type, payload=t.payload)
            ren[tname] = tname
    for tname in base.inputs:
        ren[tname] = program.tensor(tname)
        g.add_input(ren[tname], fix(base.tensors[tname].type, rows))
    n_rows = rows
    for op in base.topological_ops():
        inputs = [ren[i] if i else "" for i in op.inputs]
        if last_row_only and op.outputs[0] == "result_norm" and rows > 1:
            last = program.tensor("last_row")
            src = base.tensors[op.inputs[0]].type
            g.add_op("TakeLast", [inputs[0]], [(last, fix(src, 1))])
            inputs[0] = last
            n_rows = 1
        outs = []
        for o in op.outputs:
            ren[o] = program.tensor(o)
            n = n_rows if o in ("result_norm", "logits", "logits_div", "logits_tanh", "logits_capped") else rows
            outs.append((ren[o], fix(base.tensors[o].type, n)))
        attrs = dict(op.attrs)
        if op.type == "Reshape":
            attrs["shape"] = [rows if d == -1 else d for d in attrs["shape"]]
        g.add_op(op.type, inputs, outs, attrs, name=op.name)
    g.outputs = [ren[o] for o in base.outputs]
    g.payloads = base.payloads
    return g


@dataclass
class LlmLowering:
    builder: ModuleBuilder
    precision: str
    matrices: dict[str, EncodedWeight]  # Linear weight name -> encoded
    vectors: dict[str, np.ndarray]  # fp32 constants CPU steps read (norms, biases, rope factors)
    gather_table: str  # the Gather's table constant
    head_weight: str  # the output head's weight constant
    stats: dict[str, ProgramStats] = field(default_factory=dict)
    # every program's GEMM of a weight packs it once (the programs share their weights)
    emit_options: api.EmitOptions = field(default_factory=lambda: dataclasses.replace(EMIT_OPTIONS, pack_cache={}))

    # -- constants, shared by every program ------------------------------------------------
    def host_const(self, name: str, value: np.ndarray) -> str:
        if name not in self.builder.tensors:
            self.builder.host_const(name, np.ascontiguousarray(value))
        return name

    def rotation_inputs(self, rot: Rotation | None) -> tuple[list[str], dict]:
        """The constants and attrs by which a CPU step applies `rot` (runtime/llm/kernels.rotation_of)."""
        if rot is None:
            return [], {}
        name = f"rotation.{rot.size}"
        ins = [self.host_const(f"{name}.signs", rot.signs.astype(np.float32))]
        if rot.factor is not None:
            ins.append(self.host_const(f"{name}.factor", rot.factor.astype(np.float32)))
        return ins, {"rotation": "hadamard", "block": rot.block}

    def release(self) -> None:
        """Let the encoded matrices and their packed copies go once every
        program is lowered: the builder holds the bytes it writes."""
        self.matrices = {}
        self.emit_options.pack_cache.clear()

    def packed(self, weight: str) -> None:
        """`weight`'s every GEMM is packed (the pack cache holds its NPU bytes,
        the builder places them): its int8/fp16 matrix is let go, leaving a
        zero-stride stand-in of its shape and dtype, so the encoded matrices
        and their packed copies are never all held at once. Later programs
        find the pack in the cache (their GEMMs of a weight share its name
        and bytes; a repack would be refused as a second, different copy)."""
        enc = self.matrices[weight]
        if self.emit_options.pack_cache is None or enc.data.strides == (0, 0):
            return
        self.matrices[weight] = dataclasses.replace(enc, data=np.broadcast_to(enc.data.dtype.type(0),
                                                                             enc.data.shape))

    def placed_packs(self, consts: set[str]) -> None:
        """The pack cache's bytes of weights `consts` (constant names) that the
        builder has written out give way to its stand-ins: later programs find
        them placed, and the packed bytes are not held to the end."""
        cache = self.emit_options.pack_cache
        if cache is None:
            return
        for key, (packed, k_offsets, sums) in list(cache.items()):
            const = f"{key[0]}.weights"
            if const in consts and not isinstance(packed, PlacedBytes):
                standin = self.builder.placed(const)
                if standin is not None:
                    cache[key] = standin, k_offsets, sums

    def streamed_table(self, name: str) -> EncodedWeight:
        """A Gather-only table placed as a host constant, encoded block by
        block straight into the builder's host region (EncodedWeight.blocks);
        its int8 scales, a vector, are kept for the step that follows."""
        enc = self.matrices[name]
        if enc.blocks is None:
            return enc
        write = self.builder.host_const_blocks(name, enc.data.shape, enc.data.dtype)
        scales = []
        for _, rows, scale in enc.blocks():
            write(rows)
            scales.append(scale)
        enc = dataclasses.replace(enc, blocks=None,
                                  scale=np.concatenate(scales) if enc.scale is not None else None)
        self.matrices[name] = enc
        return enc

    def takes_epilogue(self, graph: Graph, op: int) -> bool:
        """Linear `op` can fuse an FFN epilogue: one GEMM, no K split whose
        partials the CPU adds (the epilogue would see a partial sum)."""
        x, w = graph.ops[op].inputs[:2]
        m, k = (int(d) for d in graph.tensors[x].type.shape)
        return len(k_ranges(m, k, self.matrices[w].data.shape[0], "fp16", EMIT_OPTIONS)) == 1

    def lower(self, graph: Graph, program: str) -> None:
        on_npu = {i for i, op in enumerate(graph.ops) if op.type == "Linear"}
        # fp16 FFNs whose gate and up products take the activation and the gating multiply
        # in their epilogues; int8/int4 ones keep the boundary (ffn_fusion.py)
        ffns = [f for f in gated_ffns(graph, lambda w: self.matrices[w].kind == "fp16")
                if self.takes_epilogue(graph, f.gate) and self.takes_epilogue(graph, f.up)]
        for f in ffns:
            on_npu.update(f.inner)
        steps = partition(graph, lambda i: i in on_npu)
        run = _ProgramLowering(self, graph, program, ffns={i: f for f in ffns for i in (f.gate, f.up, f.down)})
        for name in graph.inputs:
            run.host_value(name)
        for part in steps:
            if part.device == "npu":
                run.segment(part.ops)
            else:
                run.cpu_op(part.ops[0])
        self.builder.program(program, list(graph.inputs), list(graph.outputs), run.steps)
        self.stats[program] = run.stats


@dataclass
class _ProgramLowering:
    llm: LlmLowering
    graph: Graph
    program: str
    steps: list[Step] = field(default_factory=list)
    stats: ProgramStats = field(default_factory=ProgramStats)
    ffns: dict[int, GatedFfn] = field(default_factory=dict)  # product op -> its fused FFN (ffn_fusion.py)

    @property
    def builder(self) -> ModuleBuilder:
        return self.llm.builder

    def host_value(self, name: str) -> None:
        t = self.graph.tensors[name]
        self.builder.host_tensor(name, t.type.shape, t.type.dtype)

    def add(self, step: Step) -> None:
        self.builder.append_step(self.program, self.steps, step)

    def scratch(self, name: str, shape, dtype: DType) -> None:
        self.builder.scratch_tensor(self.program, name, shape, dtype, "native-gemm",
                                    geometry.nbytes(shape, "native-gemm", dtype.itemsize))

    # -- CPU ops -----------------------------------------------------------------------------
    def cpu_op(self, index: int) -> None:
        op = self.graph.ops[index]
        inputs = list(op.inputs)
        attrs = dict(op.attrs)
        kernel = op.type
        for i, name in enumerate(inputs):
            t = self.graph.tensors.get(name)
            if t is None or t.kind != "const":
                continue
            if op.type == "Gather" and i == 0:
                kernel, inputs, attrs = self._gather(name, inputs, attrs)
                break
            self.llm.host_const(name, self.llm.vectors[name])
        for name in op.outputs:
            self.host_value(name)
        self.add(Step(kind="cpu", name=op.outputs[0], op=kernel, inputs=inputs, outputs=list(op.outputs),
                      attrs=attrs))

    def _gather(self, table: str, inputs: list[str], attrs: dict):
        enc = self.llm.matrices[table]
        ids = inputs[1]
        if enc.gather is not None:  # an int4 head: the embedding is gathered from its own int8 rows
            data = self.llm.host_const(f"{table}.rows", enc.gather.data)
            scale = self.llm.host_const(f"{table}.rows.scale", enc.gather.scale)
            return "GatherRows", [data, ids, scale], {}
        if table == self.llm.head_weight:
            # tied head: read rows from its packed NPU weights (no second copy)
            packed = f"{_op_name(table)}.weights"
            attrs = {"packed": packed, "rows": int(enc.data.shape[0]), "cols": int(enc.data.shape[1]),
                     "dtype": str(enc.data.dtype)}
            extra = [self.llm.host_const(f"{table}.scale", enc.scale)] if enc.scale is not None else []
            rot, rot_attrs = self.llm.rotation_inputs(enc.rotation)  # rows are rotated back
            return "GatherPacked", [ids, *extra, *rot], attrs | rot_attrs
        enc = self.llm.streamed_table(table)
        data = self.llm.host_const(table, enc.data)
        extra = [self.llm.host_const(f"{table}.scale", enc.scale)] if enc.scale is not None else []
        rot, rot_attrs = self.llm.rotation_inputs(enc.rotation)
        return "GatherRows", [data, ids, *extra, *rot], rot_attrs

    # -- NPU segments ------------------------------------------------------------------------
    def segment(self, ops: list[int]) -> None:
        fused = {j for i in ops if i in self.ffns for j in self.ffns[i].inner}
        ops = [i for i in ops if i not in fused]  # the products; fused ops ride in their epilogues
        kinds = {self.llm.matrices[self.graph.ops[i].inputs[1]].kind for i in ops}
        if len(kinds) != 1:
            raise UnsupportedError(f"segment of {len(ops)} products mixes {' and '.join(sorted(kinds))} weights")
        if kinds == {"int4"}:
            self.segment_int4(ops)
            return
        int8 = kinds.pop() == "int8"  # a segment runs in its weights' precision (int8 builds keep some in fp16)
        dev = DType.INT8 if int8 else DType.FP16
        products: list[tuple[int, str, str, api.Gemm]] = []  # (op, weight, output piece, GEMM)
        converted: dict[str, str] = {}
        terms_of: dict[str, int] = {}
        outputs = []
        for i in ops:
            op = self.graph.ops[i]
            x, w = op.inputs[0], op.inputs[1]
            terms = self.llm.matrices[w].act_terms if int8 else 1
            if terms_of.setdefault(x, terms) != terms:
                raise UnsupportedError(f"{w}: its input {x} is quantized in {terms_of[x]} int8 rows for another "
                                       f"product of the segment, {terms} for this one")
            # an input quantized in T terms is T x the rows on the NPU (one read of the weights)
            m, k = (int(d) for d in self.graph.tensors[x].type.shape)
            m *= terms
            ffn = self.ffns.get(i)
            inside = ffn is not None and i == ffn.down  # reads the gated product the segment wrote
            if x not in converted and not inside:
                self.scratch(npu_name(x), [m, k], dev)
                if int8:
                    self.host_value_named(f"{x}.rowscale", [m], DType.FP32)
                    rot, rot_attrs = self.llm.rotation_inputs(self.llm.matrices[w].rotation)
                    term_attrs = {"terms": terms} if terms > 1 else {}
                    self.add(Step(kind="cpu", name=f"to_npu:{x}", op="QuantizeRows", inputs=[x, *rot],
                                  outputs=[npu_name(x), f"{x}.rowscale"], attrs=rot_attrs | term_attrs))
                else:
                    self.add(Step(kind="cpu", name=f"to_npu:{x}", op="Cast", inputs=[x], outputs=[npu_name(x)],
                                  attrs={"to": "fp16"}))
                converted[x] = npu_name(x)
            y = op.outputs[0]
            # a gate writes act(gate), an up writes act(gate) * up: values only the segment reads
            epi_of_ffn = None
            if ffn is not None and i == ffn.gate:
                y = self.graph.ops[ffn.act].outputs[0]
                epi_of_ffn = {"activation": ACTIVATION_LUT[self.graph.ops[ffn.act].type]}
            elif ffn is not None and i == ffn.up:
                y = self.graph.ops[ffn.mul].outputs[0]
                gated = api.Feature.gemm(npu_name(self.graph.ops[ffn.act].outputs[0]), 0, operand_rows(m),
                                         self.llm.matrices[self.graph.ops[ffn.gate].inputs[1]].data.shape[0],
                                         "fp16").view(rows=api.gemm_rows(m))
                epi_of_ffn = {"residual": api.Residual(gated, "mul")}
            enc = self.llm.matrices[w]
            n = enc.data.shape[0]
            bias = op.inputs[2] if len(op.inputs) > 2 else None
            # K above one task's channels: one GEMM per K range, whose int32 (int8)
            # or fp32 (fp16) outputs the CPU step after the segment adds (int8
            # partials cannot be summed on the NPU; fp16 ones could, for 12+ rows,
            # but the emitter's accumulator scratch is named per GEMM, not per
            # program, and the programs of an LLM share their GEMMs' names)
            parts = k_ranges(m, k, n, dev.value, EMIT_OPTIONS)
            out_dtype = (DType.INT32 if int8 else DType.FP16) if len(parts) == 1 else \
                (DType.INT32 if int8 else DType.FP32)
            pieces = [y] if len(parts) == 1 else [f"{y}.k{p}" for p in range(len(parts))]
            b = enc.data.T  # a view: the emitter packs it, no [K, N] copy per program
            for (k0, kt), piece in zip(parts, pieces):
                out = npu_name(piece)
                c = api.Feature.gemm(out, 0, m, n, out_dtype.value)
                if ffn is not None and i == ffn.gate:
                    # the up product's EW operand: surfaces of at least the EW stride floor (Q16),
                    # as an M tile of a taller map is (ffn_fusion.operand_rows)
                    c = api.Feature.gemm(out, 0, operand_rows(m), n, out_dtype.value).view(rows=c.height)
                self.scratch(out, [operand_rows(m) if c.surface_stride else m, n], out_dtype)
                epi = api.NO_EPILOGUE
                if (bias and not int8 and k0 == 0) or epi_of_ffn:
                    epi = api.Epilogue(bias=self.llm.vectors[bias].astype(np.float32) if bias and k0 == 0 else None,
                                       **(epi_of_ffn or {}))
                a = api.Feature.gemm(npu_name(x), 0, m, k, dev.value)
                if len(parts) > 1:
                    a = a.view(channel0=k0, channels=kt)
                gemm = api.Gemm(a, b[k0:k0 + kt], c, m,
                                name=_op_name(w) + (f".k{k0}" if len(parts) > 1 else ""), epilogue=epi)
                products.append((i, w, piece, gemm))
            if epi_of_ffn is None:
                outputs.append((y, x, w, bias, [npu_name(piece) for piece in pieces], terms))
        groups = self._emit_products(products, dev)
        for w in dict.fromkeys(w for _, w, _, _ in products):  # packed: the encoded matrices can go
            self.llm.packed(w)
        # the products read inputs converted before the segment and write their own outputs
        # a fused FFN's products read what the earlier ones wrote: jobs in order, not one per core
        lowered = lower_segment(self.graph, groups, self.builder, f"segment {self.stats.segments + 1}",
                                "int8" if int8 else "fp16", independent=not fused)
        self.builder.append_segment(self.program, self.steps, lowered)
        self.llm.placed_packs({c.name for g in groups for c in g.result.constants})
        self.stats.segments += 1
        self.stats.npu_tasks += lowered.step.stats["tasks"]
        for y, x, w, bias, outs, terms in outputs:
            self.host_value(y)
            if int8:
                scale = self.llm.host_const(f"{w}.scale", self.llm.matrices[w].scale)
                ins = [*outs, f"{x}.rowscale", scale] + ([self.llm.host_const(bias, self.llm.vectors[bias])]
                                                         if bias else [])
                attrs = ({"partials": len(outs)} if len(outs) > 1 else {}) | ({"terms": terms} if terms > 1 else {})
                self.add(Step(kind="cpu", name=f"from_npu:{y}", op="DequantizeRows", inputs=ins, outputs=[y],
                              attrs=attrs))
            elif len(outs) > 1:
                self.add(Step(kind="cpu", name=f"from_npu:{y}", op="SumPartials", inputs=outs, outputs=[y]))
            else:
                self.add(Step(kind="cpu", name=f"from_npu:{y}", op="Cast", inputs=outs, outputs=[y],
                              attrs={"to": "fp32"}))

    def segment_int4(self, ops: list[int]) -> None:
        """W4A8 products (compiler/llm/int4.py): QuantizeNibbles writes each input as
        two int4 rows per token; the NPU writes one int16 partial per K group
        (compiler/npu/gemm_int4.py); CombineInt4 scales and sums them (+ bias)."""
        products: list[tuple[int, str, str, api.GemmInt4]] = []
        converted: set[str] = set()
        outputs = []
        pairs = self._int4_pairs(ops)
        for i in ops:
            op = self.graph.ops[i]
            x, w = op.inputs[0], op.inputs[1]
            enc = self.llm.matrices[w]
            m, k = (int(d) for d in self.graph.tensors[x].type.shape)
            if k % layout.INT4_C2:
                raise UnsupportedError(f"{w}: int4 products need K % 32 == 0, K = {k}")
            pair = pairs.get(x, 0)
            pair_attrs = {"pair_group": pair} if pair else {}
            rows = (PAIRED_ROWS if pair else 2) * m  # the hi and lo nibble rows of each token (of two groups if paired)
            if x not in converted:
                # the int4 operand's bytes, as an int8 GEMM operand of K / 2 columns (int4_rows.packed_rows)
                self.scratch(npu_name(x), [rows, k // 2], DType.INT8)
                self.host_value_named(f"{x}.rowscale", [m], DType.FP32)
                rot, rot_attrs = self.llm.rotation_inputs(enc.rotation)
                self.add(Step(kind="cpu", name=f"to_npu:{x}", op="QuantizeNibbles", inputs=[x, *rot],
                              outputs=[npu_name(x), f"{x}.rowscale"], attrs={**rot_attrs, **pair_attrs}))
                converted.add(x)
            y = op.outputs[0]
            n = enc.data.shape[0]
            segment = 2 * pair if pair else enc.int4_group
            gemm = api.GemmInt4(api.Feature.gemm(npu_name(x), 0, rows, k, "int4"), enc.int4_values().T, None, rows,
                                segment, _op_name(w), row_split=pair)
            self.scratch(npu_name(y), [rows, gemm.segments * gemm.n_padded], DType.INT16)
            gemm = dataclasses.replace(gemm, c=api.Feature.gemm(npu_name(y), 0, rows,
                                                                gemm.segments * gemm.n_padded, "int16"))
            products.append((i, w, y, gemm))
            bias = op.inputs[2] if len(op.inputs) > 2 else None
            outputs.append((y, x, w, bias, pair_attrs))
        groups = self._emitted(products, place_segment_int4([g for *_, g in products], self.llm.emit_options),
                               "int4")
        for w in dict.fromkeys(w for _, w, _, _ in products):
            self.llm.packed(w)
        lowered = lower_segment(self.graph, groups, self.builder, f"segment {self.stats.segments + 1}", "int4",
                                independent=True)
        self.builder.append_segment(self.program, self.steps, lowered)
        self.llm.placed_packs({c.name for g in groups for c in g.result.constants})
        self.stats.segments += 1
        self.stats.npu_tasks += lowered.step.stats["tasks"]
        for y, x, w, bias, pair_attrs in outputs:
            self.host_value(y)
            scales = self.llm.host_const(f"{w}.int4_scales", self.llm.matrices[w].int4_scales)
            ins = [npu_name(y), f"{x}.rowscale", scales] + ([self.llm.host_const(bias, self.llm.vectors[bias])]
                                                            if bias else [])
            self.add(Step(kind="cpu", name=f"from_npu:{y}", op="CombineInt4", inputs=ins, outputs=[y],
                          attrs=pair_attrs))

    def _int4_pairs(self, ops: list[int]) -> dict[str, int]:
        """Inputs whose nibble rows carry two K groups per NPU segment (int4_rows.pair_rows),
        input -> group length: the head's, when it has two groups or more. A weight's
        packing is one for every program, and the head alone reads one row in decode
        and prefill (the last) alike, whose 4 stored rows hold 2 used: paired, its
        partials carry no padding rows and half the tasks; the score programs' many
        rows pay twice the head's MACs for it. The other products' prefill rows
        would pay that in every chunk."""
        readers: dict[str, set[str]] = {}
        for i in ops:
            x, w = self.graph.ops[i].inputs[:2]
            readers.setdefault(x, set()).add(w)
        head = self.llm.head_weight
        return {x: self.llm.matrices[head].int4_group for x, ws in readers.items()
                if ws == {head} and self.llm.matrices[head].int4_group < int(self.graph.tensors[x].type.shape[1])}

    def _emit_products(self, products: list[tuple[int, str, str, api.Gemm]], dev: DType) -> list[NpuGroup]:
        """The segment's GEMMs, their output channels placed over the cores together
        (compiler/npu/placement.py), each lowered to its tasks."""
        try:
            placed = place_segment([g for *_, g in products], self.llm.emit_options,
                                   per_task_kicks=not CHAINABLE[dev.value])
        except UnsupportedError as exc:
            raise UnsupportedError(f"{products[0][1]}: the NPU cannot run this product ({exc})") from None
        return self._emitted(products, placed, dev.value)

    def _emitted(self, products: list[tuple], placed: list, precision: str) -> list[NpuGroup]:
        """Each placed product (int8/fp16 Gemm or GemmInt4) lowered to its tasks, as the group of its op."""
        groups = []
        for (i, w, piece, _), gemm in zip(products, placed):
            try:
                result = emit(gemm, self.llm.emit_options)
            except UnsupportedError as exc:
                raise UnsupportedError(f"{w}: the NPU cannot run this product ({exc})") from None
            x = self.graph.ops[i].inputs[0]
            ffn = self.ffns.get(i)
            covers = [i, ffn.act] if ffn and i == ffn.gate else [i, ffn.mul] if ffn and i == ffn.up else [i]
            groups.append(NpuGroup(i, covers, {x: "native-gemm"}, piece, "native-gemm", result, precision))
        return groups

    def host_value_named(self, name: str, shape, dtype: DType) -> None:
        self.builder.host_tensor(name, shape, dtype)


def _op_name(weight: str) -> str:
    return weight[: -len(".weight")] if weight.endswith(".weight") else weight
