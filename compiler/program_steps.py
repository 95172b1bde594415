"""Lower partitioned steps into the steps of one rkbin program.

* a CPU step runs one kernel (runtime/kernels) on host tensors; an op that
  only selects its input's values (MaxPool, nearest Resize: compiler/quantize.py
  selects_values; int8 at its input's scale) runs on the NPU copies themselves,
  in their dtype, with no conversion around it;
* a Concat or Split over the channels of native maps on the NPU is no step at
  all: its pieces are channel slices of one buffer (ModuleBuilder.add_views),
  each producer writing its slice and each consumer reading its own;
* attention's probabilities between two NPU products (a Reshape of the first's
  fp16 scores, Softmax over the keys, a Reshape to the second's 2-D A) are one
  step from the scores' NPU copy into atoms of the same layout (ScaledSoftmax:
  runtime/kernels/softmax_jit.py), or, with a Transpose of the last two axes
  before the second's run-time B, into the B's weights (SoftmaxTranspose);
* ops that only move elements between fp16 NPU groups (the qkv map cut into
  per-head operands, the heads' products put back into a map) are one gather
  per result, its index map composed at compile time (compiler/relayout.py;
  the gathers whose sources are all on the NPU when one is due: one step),
  or a view where the result is a run of its source's bytes as they lie (or
  each of its sources a run of the result's: the sources' producers write it);
* an NPU segment becomes one NPU step (compiler/emitter_ops.py);
* a tensor crossing between the two gets an explicit conversion step the
  first time the other side needs it: host -> NPU (Cast to fp16, or
  QuantizeLinear to int8, into the NPU native layout) and NPU -> host (Cast /
  DequantizeLinear back). Tensors flowing from one NPU segment to the next stay
  on the NPU. NPU tensors live in the scratch region; their lifetimes (first
  and last step that touch them) feed the memory plan.

Graph-kind agnostic: it reads only the ir.Graph, the partition and the NPU groups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from rkc.compiler import cost, relayout
from rkc.compiler.module_builder import ModuleBuilder, quant_dict
from rkc.compiler.emitter_graph import npu_layout, npu_name, relaid_name
from rkc.compiler.emitter_ops import NpuGroup, lower_segment, segment_groups
from rkc.compiler.passes.edit import consumers, only_consumer
from rkc.compiler.quantize import selects_values
from rkc.compiler.partition import Step as PartStep
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph, PayloadRef
from rkc.ir.npu import geometry
from rkc.ir.program import Step
from rkc.ir.types import DType, PerTensorQuant


@dataclass
class LowerStats:
    cpu_steps: int = 0
    views: list[int] = field(default_factory=list)  # Concat / Split ops that became slices of one buffer
    npu_tasks: int = 0
    conversions: int = 0


def _json_attrs(op) -> dict:
    for key, value in op.attrs.items():
        if isinstance(value, PayloadRef):
            raise UnsupportedError(f"op {op.describe()}: attribute {key} refers to a payload; "
                                   "the CPU kernel cannot take it")
    attrs = dict(op.attrs)
    json.dumps(attrs)  # everything a CPU step carries must be plain data
    return attrs


@dataclass
class _Lowering:
    graph: Graph
    builder: ModuleBuilder
    precision: str
    program: str
    groups: dict[int, NpuGroup] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    on_host: set[str] = field(default_factory=set)
    on_npu: dict[str, str] = field(default_factory=dict)  # NPU buffer -> its layout
    copies: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # IR tensor -> [(buffer, dtype)]
    stats: LowerStats = field(default_factory=LowerStats)
    absorbed: set[int] = field(default_factory=set)  # CPU ops an earlier op's step already ran
    gathers: dict[int, list] = field(default_factory=dict)  # op index -> relayout.Result made there

    # -- host side ----------------------------------------------------------------------
    def host(self, name: str) -> None:
        """Make `name` readable on the host: a constant, or a copy back from the NPU."""
        if not name or name in self.on_host:
            return
        t = self.graph.tensors[name]
        if t.kind == "const":
            self.builder.host_const(name, self.graph.payloads[t.payload])
        elif name in self.copies:
            self.builder.host_tensor(name, t.type.shape, t.type.dtype)
            self.convert_from_npu(name)
        else:
            self.builder.host_tensor(name, t.type.shape, t.type.dtype, quant_dict(t.type.quant, self.graph.payloads))
        self.on_host.add(name)

    def produced_on_host(self, name: str) -> None:
        t = self.graph.tensors[name]
        self.builder.host_tensor(name, t.type.shape, t.type.dtype, quant_dict(t.type.quant, self.graph.payloads))
        self.on_host.add(name)

    # -- NPU side -----------------------------------------------------------------------
    def npu_tensor(self, name: str, layout: str, dtype_name: str, buffer: str | None = None) -> None:
        t = self.graph.tensors[name]
        if not t.type.is_static:
            raise UnsupportedError(f"tensor {name!r} needs a static shape on the NPU")
        dtype = DType(dtype_name)
        quant = None
        if dtype is DType.INT8:
            q = t.type.quant
            if not isinstance(q, PerTensorQuant):
                raise UnsupportedError(f"tensor {name!r} has no int8 scale")
            quant = {"scale": q.scale, "zero_point": q.zero_point}
        buffer = buffer or npu_name(name, dtype_name, self.precision)
        self.builder.scratch_tensor(self.program, buffer, t.type.shape, dtype, layout,
                                    geometry.nbytes(t.type.shape, layout, dtype.itemsize), quant)
        self.on_npu[buffer] = layout
        self.copies.setdefault(name, []).append((buffer, dtype_name))

    def to_npu(self, name: str, layout: str, dtype: str) -> None:
        """Make `name` readable on the NPU in `layout` and `dtype` (before the next NPU step).
        A [1, C, 1, 1] tensor read as a native map (run-time depthwise weights) is a second
        copy beside its GEMM row, written by the host."""
        relaid = (layout == "native" and npu_layout(self.graph, name) == "native-gemm") or layout == "native-weights"
        target = relaid_name(name, layout, dtype, self.precision) if relaid else npu_name(name, dtype, self.precision)
        if target in self.on_npu:
            if self.on_npu[target] != layout:
                raise UnsupportedError(f"tensor {name!r} is read by the NPU in two layouts")
            return
        self.host(name)
        self.npu_tensor(name, layout, dtype, target)
        if dtype == "int8":
            scale, zp = self._qparams(name)
            self.add(Step(kind="cpu", name=f"to_npu:{name}", op="QuantizeLinear", inputs=[name, scale, zp],
                          outputs=[target], stats=self._conversion_stats(name)))
        else:
            self.add(Step(kind="cpu", name=f"to_npu:{name}", op="Cast", inputs=[name], outputs=[target],
                          attrs={"to": DType.FP16.value}, stats=self._conversion_stats(name)))
        self.stats.conversions += 1

    def convert_from_npu(self, name: str) -> None:
        source, dtype = self.copies[name][0]  # the copy a producing group wrote
        t = self.graph.tensors[name]
        if dtype == "int8":
            scale, zp = self._qparams(name)
            self.add(Step(kind="cpu", name=f"from_npu:{name}", op="DequantizeLinear", inputs=[source, scale, zp],
                          outputs=[name], stats=self._conversion_stats(name)))
        else:
            self.add(Step(kind="cpu", name=f"from_npu:{name}", op="Cast", inputs=[source], outputs=[name],
                          attrs={"to": t.type.dtype.value}, stats=self._conversion_stats(name)))
        self.stats.conversions += 1

    def _qparams(self, name: str) -> tuple[str, str]:
        q = self.graph.tensors[name].type.quant
        base = npu_name(name, "int8", self.precision)
        scale, zp = f"{base}.scale", f"{base}.zp"
        if scale not in self.builder.tensors:
            self.builder.host_const(scale, np.array(q.scale, np.float32))
            self.builder.host_const(zp, np.array(q.zero_point, np.int8))
        return scale, zp

    def _conversion_stats(self, name: str) -> dict:
        return {"conversion": True, "macs": 0, "ddr_bytes": cost.tensor_bytes(self.graph, name)}

    # -- steps --------------------------------------------------------------------------
    def add(self, step: Step) -> None:
        self.builder.append_step(self.program, self.steps, step)

    def in_place_dtype(self, op) -> str | None:
        """The NPU dtype `op` can run in on its input's NPU copy, writing its output's
        (None: it runs on host tensors): an op that selects values (quantize.selects_values;
        int8: at one shared scale), its input already a native map on the NPU, every NPU
        reader of its output reading it as a native map. A depthwise convolution the NPU
        refuses (a window over fewer than 4 rows, hardware question Q2) runs in place on
        fp16 copies too: computed in float32 from the fp16 values and rounded once, as the
        Cast, Conv, Cast it replaces (runtime/kernels/depthwise_jit.py reads the atoms)."""
        selects = selects_values(op)
        if not (selects or self.depthwise_on_constants(op)) or len(op.outputs) != 1:
            return None
        src, out = op.inputs[0], op.outputs[0]
        dtype = next((d for _, d in self.copies.get(src, [])), None)
        if dtype is None or self.on_npu.get(npu_name(src, dtype, self.precision)) != "native":
            return None
        if not selects and dtype != "fp16":
            return None
        qa, qb = self.graph.tensors[src].type.quant, self.graph.tensors[out].type.quant
        if dtype == "int8" and not (isinstance(qa, PerTensorQuant) and qa == qb):
            return None
        if npu_layout(self.graph, out) != "native" or self.graph.tensors[out].type.shape[0] != 1:
            return None
        if not all(g.reads.get(out, "native") == "native" for g in self.groups.values()):
            return None
        return dtype

    def depthwise_on_constants(self, op) -> bool:
        """A 2-D Conv with one filter per channel ([C, 1, kh, kw]) and constant weights and bias."""
        if op.type != "Conv" or len(op.inputs) < 2 or not op.inputs[1]:
            return False
        x, w = self.graph.tensors[op.inputs[0]].type.shape, self.graph.tensors[op.inputs[1]].type.shape
        consts = [self.graph.tensors[n].payload is not None for n in op.inputs[1:] if n]
        return (len(x) == 4 and len(w) == 4 and w[1] == 1 and w[0] == x[1] == int(op.attrs.get("group", 1))
                and all(consts))

    def as_views(self, op) -> bool:
        """Lower a channel Concat / Split of native NPU maps as slices of one buffer."""
        if op.type not in ("Concat", "Split") or "" in op.inputs[:1] + op.outputs:
            return False
        if op.type == "Concat":
            whole, pieces = op.outputs[0], list(op.inputs)
        else:
            whole, pieces = op.inputs[0], list(op.outputs)
        shape = self.graph.tensors[whole].type.shape
        axis = int(op.attrs.get("axis", 0))
        if len(shape) != 4 or axis % 4 != 1 or len(set(pieces)) != len(pieces):
            return False
        known = [whole] if op.type == "Split" else pieces
        dtype = next((d for t in known for _, d in self.copies.get(t, [])), None)
        if dtype is None:
            return False  # nothing of it on the NPU: the CPU does it
        buf = {t: npu_name(t, dtype, self.precision) for t in (whole, *pieces)}
        if any(buf[t] in self.on_npu and self.on_npu[buf[t]] != "native" for t in known):
            return False
        if op.type == "Split" and buf[whole] not in self.on_npu:
            return False
        if any(npu_layout(self.graph, t) != "native" or self.graph.tensors[t].type.shape[0] != 1
               for t in (whole, *pieces)):
            return False
        per_atom = 16 // DType(dtype).itemsize  # channels in one 16-byte atom (ir/npu/layout.py)
        channels = [int(self.graph.tensors[t].type.shape[1]) for t in pieces]
        if any(c % per_atom for c in channels):
            return False
        if dtype == "int8":
            quants = {self.graph.tensors[t].type.quant for t in (whole, *pieces)}
            if len(quants) != 1 or not isinstance(next(iter(quants)), PerTensorQuant):
                return False
        for t in pieces if op.type == "Concat" else ():
            self.to_npu(t, "native", dtype)  # a piece made on the CPU is converted into its slice
        for t in pieces[:-1] if op.type == "Concat" else ():
            # a piece whose padding spills into the next slice (a 136-channel fp16 conv writes
            # 144) has it overwritten there (ModuleBuilder.spill_covered): nothing else may read it
            info = self.builder.tensors[buf[t]]
            if info.nbytes > self.builder.declared[buf[t]] and only_consumer(self.graph, t) is not op:
                return False
        surface = int(shape[2]) * int(shape[3]) * 16
        offsets = np.cumsum([0, *channels])[:-1] // per_atom * surface
        parts = [(buf[t], buf[whole], int(o)) for t, o in zip(pieces, offsets)]
        made = [whole] if op.type == "Concat" else pieces
        if not self.builder.add_views(parts, [buf[t] for t in made]):
            return False
        for t in made:
            self.npu_tensor(t, "native", dtype)
        return True

    def softmax_chain(self, op) -> tuple | None:
        """(the Softmax, its scale, the indices of the ops it absorbs, the result P, the layout
        the NPU reads P in) when `op` starts attention's probabilities between two NPU
        products: the first's fp16 output S [M, N] (held as GEMM output atoms) [times a scalar
        constant] [reshaped to [1, .., M, N]], Softmax over the last axis, [Reshape to [M, N]]
        read only by fp16 NPU groups as a GEMM's A (the scores' own layout, "native-gemm";
        heads.transposed_product makes this the case), or Transpose of the last two axes
        [, Reshape to [N, M]] read only as run-time weights; each op the previous one's only
        reader."""
        graph = self.graph
        if op.type not in ("Mul", "Reshape", "Softmax") or not op.inputs or len(op.outputs) != 1:
            return None
        src, scale, chain = op.inputs[0], 1.0, [op]
        if op.type == "Mul":
            consts = [graph.const_value(t) for t in op.inputs]
            if len(op.inputs) != 2 or sum(c is not None for c in consts) != 1:
                return None
            value = next(c for c in consts if c is not None)
            if np.size(value) != 1 or not np.isfinite(value).all():
                return None
            src, scale = op.inputs[1 if consts[0] is not None else 0], float(np.reshape(value, -1)[0])
            chain.append(only_consumer(graph, op.outputs[0]))
        buffer = npu_name(src, "fp16", self.precision)
        if (buffer, "fp16") not in self.copies.get(src, []) or self.on_npu.get(buffer) != "native-gemm":
            return None
        shape = tuple(graph.tensors[src].type.shape)
        if len(shape) != 2:
            return None
        m, n = shape
        if chain[-1] is not None and chain[-1].type == "Reshape":
            chain.append(only_consumer(graph, chain[-1].outputs[0]))
        softmax = chain[-1]
        if softmax is None or softmax.type != "Softmax":
            return None
        scores = tuple(graph.tensors[softmax.inputs[0]].type.shape)
        rank = len(scores)
        if scores != (1,) * (rank - 2) + shape or int(softmax.attrs.get("axis", -1)) % rank != rank - 1:
            return None
        after, read_as, want = only_consumer(graph, softmax.outputs[0]), "native-gemm", (m, n)
        if after is not None and after.type == "Transpose" \
                and list(after.attrs.get("perm", [])) == [*range(rank - 2), rank - 1, rank - 2]:
            chain.append(after)
            after, read_as, want = only_consumer(graph, after.outputs[0]), "native-weights", (n, m)
        if after is not None and after.type == "Reshape":
            chain.append(after)
        p = chain[-1].outputs[0]
        if tuple(graph.tensors[p].type.shape) != want:
            return None
        index = {id(o): i for i, o in enumerate(graph.ops)}
        readers = [self.groups.get(index[id(r)]) for r in consumers(graph, p)]
        if not readers or p in graph.outputs or any(g is None or g.reads.get(p) != read_as or g.dtype != "fp16"
                                                    for g in readers):
            return None
        if any(index[id(o)] in self.groups for o in chain):
            return None
        return softmax, scale, [index[id(o)] for o in chain[1:]], p, read_as

    def softmax_probabilities(self, op) -> bool:
        """Lower attention's probabilities (softmax_chain) as one step: ScaledSoftmax into P's
        GEMM atoms, or SoftmaxTranspose into P^T's run-time weights."""
        chain = self.softmax_chain(op)
        if chain is None:
            return False
        softmax, scale, after, p, read_as = chain
        if read_as == "native-weights":
            kind, target = "SoftmaxTranspose", relaid_name(p, read_as, "fp16", self.precision)
        else:
            kind, target = "ScaledSoftmax", npu_name(p, "fp16", self.precision)
        self.npu_tensor(p, read_as, "fp16", target)
        src = op.inputs[0] if op.type != "Mul" or self.graph.const_value(op.inputs[0]) is None else op.inputs[1]
        self.add(Step(kind="cpu", name=softmax.name or f"{kind}:{p}", op=kind,
                      inputs=[npu_name(src, "fp16", self.precision)], outputs=[target], attrs={"scale": scale},
                      stats={"op": "Softmax", "macs": cost.op_macs(self.graph, softmax),
                             "ddr_bytes": cost.op_ddr_bytes(self.graph, softmax)}))
        self.absorbed.update(after)
        self.stats.cpu_steps += 1
        return True

    def byte_slice(self, result, target: str) -> int | None:
        """The byte offset in its one source at which `result`'s elements lie exactly as
        `target`'s native layout holds them (each element its own, no padding between or
        after them), so `target` can be a view of those bytes (YOLO11n's per-head Q^T, an
        [M, K] GEMM operand, is K channels of the qkv map); None otherwise."""
        if len(result.sources) != 1 or result.scale != 1.0:
            return None
        src = self.builder.tensors[npu_name(result.sources[0], "fp16", self.precision)]
        dst = self.builder.tensors[target]
        into = geometry.native_positions(dst.shape, dst.layout, dst.nbytes)
        if into.size * 2 != dst.nbytes:
            return None
        delta = geometry.native_positions(src.shape, src.layout, src.nbytes)[result.index.reshape(-1)] - into
        if delta.min() != delta.max() or delta[0] < 0 or delta[0] * 2 % 16:  # a view starts on an atom
            return None
        return int(delta[0]) * 2

    def source_slices(self, result, target: str) -> list[tuple[str, int]] | None:
        """(source buffer, byte offset in `target`) for each of `result`'s several sources
        when each lies whole in `target`'s native layout as a run of its own bytes as they lie
        (each element its own, no padding): the attention heads' transposed products, each a
        channel slice of the map that puts them together. The sources then are slices of
        `target`, which their producers write in place; None otherwise."""
        if len(result.sources) < 2 or result.scale != 1.0:
            return None
        dst = self.builder.tensors[target]
        into = geometry.native_positions(dst.shape, dst.layout, dst.nbytes)
        if into.size * 2 != dst.nbytes:
            return None
        index, first, slices = result.index.reshape(-1), 0, []
        for source in result.sources:
            buffer = npu_name(source, "fp16", self.precision)
            src = self.builder.tensors[buffer]
            at = geometry.native_positions(src.shape, src.layout, src.nbytes)
            mine = np.flatnonzero((index >= first) & (index < first + at.size))
            if at.size * 2 != src.nbytes or mine.size != at.size:
                return None
            delta = into[mine] - at[index[mine] - first]
            if delta.min() != delta.max() or delta[0] < 0 or delta[0] * 2 % 16:  # a slice starts on an atom
                return None
            slices.append((buffer, int(delta[0]) * 2))
            first += at.size
        return slices

    def gather(self, result) -> None:
        """A relayout.Result into each layout the fp16 NPU groups read it in, and with it
        every later result whose sources are all on the NPU by now: one Relayout step for
        them all (YOLO11n's K and V^T of each head and V's map, five gathers from the qkv
        map: one hold of the buffers and one dispatch instead of five, ~10-15 us each)."""
        moves = self.gather_targets(result)
        if not moves:
            return
        ready = {b for copies in self.copies.values() for b, d in copies if d == "fp16"}
        for later in (r for results in self.gathers.values() for r in results):
            if later is not result and all(npu_name(t, "fp16", self.precision) in ready for t in later.sources):
                moves += self.gather_targets(later)
        sources = list(dict.fromkeys(t for _, r in moves for t in r.sources))
        sizes = {t: int(np.prod(self.graph.tensors[t].type.shape, dtype=np.int64)) for t in sources}
        first = dict(zip(sources, np.cumsum([0, *sizes.values()])[:-1].tolist()))
        indexes = []
        for target, r in moves:  # each result's element numbers over all the step's sources
            index = f"{target}.relayout"
            if index not in self.builder.tensors:
                starts = np.cumsum([0, *(sizes[t] for t in r.sources)])
                which = np.searchsorted(starts, r.index, side="right") - 1
                shift = np.array([first[t] - s for t, s in zip(r.sources, starts)], np.int64)
                self.builder.host_const(index, (r.index + shift[which]).astype(np.int32))
            indexes.append(index)
        scales = [r.scale for _, r in moves]
        self.add(Step(kind="cpu", name="relayout:" + "+".join(r.tensor for _, r in moves), op="Relayout",
                      inputs=[*(npu_name(t, "fp16", self.precision) for t in sources), *indexes],
                      outputs=[target for target, _ in moves], attrs={"scale": scales[0] if len(moves) == 1 else scales},
                      stats={"conversion": True, "macs": 0,
                             "ddr_bytes": sum(cost.tensor_bytes(self.graph, r.tensor) * 2 for _, r in moves)}))
        self.stats.conversions += len(moves)

    def gather_targets(self, result) -> list[tuple[str, object]]:
        """(NPU buffer, result) for each layout the fp16 NPU groups read `result` in that is
        not yet on the NPU and needs moves: a buffer that is a run of a source's bytes, or
        whose sources are runs of its own, becomes a view instead (no step)."""
        layouts = {g.reads[result.tensor] for g in self.groups.values()
                   if result.tensor in g.reads and g.dtype == "fp16"}
        moves = []
        for layout_name in sorted(layouts):
            relaid = (layout_name == "native" and npu_layout(self.graph, result.tensor) == "native-gemm") \
                or layout_name == "native-weights"
            target = relaid_name(result.tensor, layout_name, "fp16", self.precision) if relaid \
                else npu_name(result.tensor, "fp16", self.precision)
            if target in self.on_npu:
                continue
            self.npu_tensor(result.tensor, layout_name, "fp16", target)
            offset = self.byte_slice(result, target)
            if offset is not None and self.builder.add_views(
                    [(target, npu_name(result.sources[0], "fp16", self.precision), offset)], [target]):
                continue  # no step: the readers read the source's bytes
            slices = self.source_slices(result, target)
            if slices is not None and self.builder.add_views([(b, target, o) for b, o in slices], [target]):
                continue  # no step: the sources' producers write the target's bytes
            moves.append((target, result))
        return moves

    def moved_between_groups(self, op) -> bool:
        """Lower a moving op (relayout.MOVES) that did not become a view as gathers, when
        its inputs are fp16 NPU copies and only fp16 NPU groups read its outputs."""
        if op.type not in relayout.MOVES:
            return False
        data = [t for t in op.inputs if t and self.graph.const_value(t) is None]
        if not data or any((npu_name(t, "fp16", self.precision), "fp16") not in self.copies.get(t, [])
                           or self.on_npu.get(npu_name(t, "fp16", self.precision)) not in ("native", "native-gemm")
                           for t in data):
            return False
        index = {id(o): i for i, o in enumerate(self.graph.ops)}
        for t in op.outputs:
            readers = [self.groups.get(index[id(r)]) for r in consumers(self.graph, t)]
            if t in self.graph.outputs or not readers or any(g is None or g.dtype != "fp16" or t not in g.reads
                                                              for g in readers):
                return False
        for result in relayout.one_op(self.graph, op):
            self.gather(result)
        return True

    def cpu_op(self, index: int) -> None:
        op = self.graph.ops[index]
        if index in self.absorbed:
            for result in self.gathers.get(index, []):
                self.gather(result)
            return
        if self.softmax_probabilities(op):
            return
        if self.as_views(op):
            self.stats.views.append(index)
            return
        if self.moved_between_groups(op):
            return
        dtype = self.in_place_dtype(op)
        if dtype is not None:
            src, out = op.inputs[0], op.outputs[0]
            for name in op.inputs[1:]:
                self.host(name)  # a Resize's scales or sizes
            self.npu_tensor(out, "native", dtype)
            self.add(Step(kind="cpu", name=op.name or f"{op.type}:{out}", op=op.type,
                          inputs=[npu_name(src, dtype, self.precision), *op.inputs[1:]],
                          outputs=[npu_name(out, dtype, self.precision)], attrs=_json_attrs(op),
                          stats={"op": op.type, "macs": cost.op_macs(self.graph, op),
                                 "ddr_bytes": cost.op_ddr_bytes(self.graph, op)}))
            self.stats.cpu_steps += 1
            return
        for name in op.present_inputs():
            self.host(name)
        for name in op.outputs:
            self.produced_on_host(name)
        self.add(Step(kind="cpu", name=op.name or f"{op.type}:{op.outputs[0]}", op=op.type,
                      inputs=list(op.inputs), outputs=list(op.outputs), attrs=_json_attrs(op),
                      stats={"op": op.type, "macs": cost.op_macs(self.graph, op),
                             "ddr_bytes": cost.op_ddr_bytes(self.graph, op)}))
        self.stats.cpu_steps += 1

    def segment(self, part: PartStep, groups: dict[int, NpuGroup], number: int) -> None:
        ordered = segment_groups(part.ops, groups)
        produced = {g.npu_name(g.output, self.precision) for g in ordered}
        for g in ordered:
            for name, layout in g.reads.items():
                if g.read_name(name, self.precision) not in produced:
                    self.to_npu(name, layout, g.dtype)
        for g in ordered:
            self.npu_tensor(g.output, g.output_layout, g.dtype)
            self.builder.mark_written(g.npu_name(g.output, self.precision))  # its jobs run in this order
        lowered = lower_segment(self.graph, ordered, self.builder, f"segment {number}", self.precision)
        self.builder.append_segment(self.program, self.steps, lowered)
        self.stats.npu_tasks += lowered.step.stats["tasks"]


def lower_program(graph: Graph, steps: list[PartStep], builder: ModuleBuilder, precision: str,
                  groups: dict[int, NpuGroup] | None = None, program: str = "main") -> LowerStats:
    work = _Lowering(graph, builder, precision, program, groups or {})
    fp16_groups = {i: g for i, g in work.groups.items() if g.dtype == "fp16"}
    roots = {g.output for g in fp16_groups.values() if g.output_layout in ("native", "native-gemm")}
    moved, work.gathers = relayout.plan(graph, [s.ops[0] for s in steps if s.device != "npu"], roots,
                                        lambda i, t: i in fp16_groups and t in fp16_groups[i].reads)
    work.absorbed |= moved
    for name in graph.inputs:
        work.host(name)
    segments = 0
    for step in steps:
        if step.device == "npu":
            segments += 1
            work.segment(step, groups or {}, segments)
        else:
            work.cpu_op(step.ops[0])
    for name in graph.outputs:
        work.host(name)
    builder.program(program, list(graph.inputs), list(graph.outputs), work.steps)
    return work.stats
