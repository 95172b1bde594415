"""ONNX models -> ir.Graph.

1. read the model (external data next to it), fix dynamic input dims from
   `input_shapes` (`--input-shape name=1x3x224x224`), turn named inputs into
   uint8 NHWC images with their normalisation in the graph (`--image-input`);
2. infer shapes with onnx.shape_inference and fold constant subgraphs by
   evaluating them with onnx.reference (never re-implementing an op), until
   nothing changes (folding a Shape makes a Reshape target constant, which
   makes more shapes known, ...);
3. translate to the IR: attributes that older opsets kept as attributes but
   newer ones take as inputs become constant inputs (one form per op for the
   rest of the compiler), ONNX dtype enums become IR dtype names, legacy
   Softmax semantics are made explicit;
4. verify with the ops' shape rules (compiler/ops), which cross-checks ONNX's
   own inference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from rkc.compiler.ops import OPS, infer_for
from rkc.ir.errors import FormatError, UnsupportedError, VerifyError
from rkc.ir.graph import Graph, Op
from rkc.ir.types import DType, TensorType, check_tensor_size
from rkc.runtime.kernels import KERNELS, LOWERING_ONLY

MIN_OPSET = 7  # older files are rejected; opsets 7-10 (e.g. the onnx `light_*` models) are read as well
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}
# kept as ops even on constant inputs: compiler/qdq.py reads the model's own
# integers and scales from them (and onnx.reference has no DequantizeLinear
# before opset 19)
QUANTIZATION = {"QuantizeLinear", "DequantizeLinear"}
# attributes kept for old opsets that carry no meaning at inference
LEGACY_IGNORED = {"consumed_inputs", "is_test", "spatial"}


def _onnx():
    # onnx is deferred, here and in every function below that imports from it: a heavy library (protobuf, its
    # reference evaluator) that `rkc --help` and IR text or GGUF compiles must not load
    import onnx

    return onnx


def _dtype_table() -> dict[int, DType]:
    tp = _onnx().TensorProto
    return {tp.FLOAT: DType.FP32, tp.FLOAT16: DType.FP16, tp.DOUBLE: DType.FP64,
            tp.INT8: DType.INT8, tp.UINT8: DType.UINT8, tp.INT16: DType.INT16, tp.UINT16: DType.UINT16,
            tp.INT32: DType.INT32, tp.INT64: DType.INT64, tp.BOOL: DType.BOOL}


def ir_dtype(elem_type: int, what: str) -> DType:
    table = _dtype_table()
    if elem_type not in table:
        name = _onnx().TensorProto.DataType.Name(elem_type) if elem_type else "unknown"
        raise UnsupportedError(f"{what}: element type {name} is not supported")
    return table[elem_type]


# -- reading ------------------------------------------------------------------------
def read_model(path: Path):
    onnx = _onnx()
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise FormatError(f"{path}: not a readable ONNX model ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'truncated or corrupt'})") from None
    if not model.graph.node and not model.graph.output:
        raise FormatError(f"{path}: not an ONNX model (empty graph)")
    newest = _onnx().defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version < MIN_OPSET:
            raise UnsupportedError(f"{path}: ONNX opset {imp.version} is too old (rkc reads opset {MIN_OPSET}+)")
        if imp.domain in ("", "ai.onnx") and imp.version > newest:
            raise UnsupportedError(f"{path}: ONNX opset {imp.version} is newer than any this onnx knows "
                                   f"(up to {newest})")
    seen: set[str] = set()
    for init in model.graph.initializer:
        if init.name in seen:
            raise FormatError(f"{path}: initializer {init.name!r} is defined twice")
        seen.add(init.name)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedError(f"{path}: op {node.domain}.{node.op_type} (node {node.name!r}) is not supported "
                                   "(only the default ONNX domain is)")
    return model


def default_opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 21


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """["x=1x3x224x224", ...] -> {"x": (1, 3, 224, 224)}."""
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) <= 0:
            raise UnsupportedError(f"--input-shape {spec!r}: expected NAME=D0xD1x... with positive sizes")
        shapes[name] = shape
    return shapes


def _real_inputs(graph) -> list:
    inits = {i.name for i in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def fix_input_shapes(model, shapes: Mapping[str, Sequence[int]], source: str) -> None:
    inputs = {i.name: i for i in _real_inputs(model.graph)}
    for name, dims in shapes.items():
        if name not in inputs:
            raise UnsupportedError(f"{source}: --input-shape names {name!r}, the model's inputs are "
                                   f"{', '.join(inputs) or 'none'}")
        shape = inputs[name].type.tensor_type.shape
        if len(shape.dim) != len(dims):
            raise UnsupportedError(f"{source}: input {name!r} has rank {len(shape.dim)}, --input-shape gives "
                                   f"{len(dims)} dims")
        for d, v in zip(shape.dim, dims):
            if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != v:
                raise UnsupportedError(f"{source}: input {name!r} has fixed dims "
                                       f"{[x.dim_value or '?' for x in shape.dim]}, --input-shape gives {list(dims)}")
            d.Clear()
            d.dim_value = v


def parse_image_inputs(specs: Sequence[str]) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """["images=0,0,0/255,255,255", ...] -> {"images": ((0, 0, 0), (255, 255, 255))}: per-channel mean
    and standard deviation of the pixels (rknn-toolkit2's mean_values / std_values)."""
    images = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        mean, slash, std = rest.partition("/")
        try:
            means, stds = tuple(float(v) for v in mean.split(",")), tuple(float(v) for v in std.split(","))
        except ValueError:
            means = stds = ()
        if not sep or not slash or not name or not means or len(means) != len(stds) or min(stds) <= 0:
            raise UnsupportedError(f"--image-input {spec!r}: expected NAME=M0,M1,M2/S0,S1,S2 (per-channel mean "
                                   "and a positive standard deviation of the pixels)")
        images[name] = (means, stds)
    return images


def take_image_inputs(model, images: Mapping[str, tuple[Sequence[float], Sequence[float]]], source: str) -> None:
    """Each named float NCHW input becomes a uint8 NHWC image of the same name
    (the layout cameras and decoders give, and the vendor's runtime takes), and
    the graph starts with its normalisation: Transpose to NCHW, Cast to float,
    Sub the mean, Div by the standard deviation, per channel. The runtime reads
    the pixels once into the first NPU segment's map (runtime/feature_edges.py)."""
    from onnx import TensorProto, helper, numpy_helper  # deferred (see _onnx)

    inputs = {i.name: i for i in _real_inputs(model.graph)}
    for name, (mean, std) in images.items():
        if name not in inputs:
            raise UnsupportedError(f"{source}: --image-input names {name!r}, the model's inputs are "
                                   f"{', '.join(inputs) or 'none'}")
        tensor = inputs[name].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim]
        if tensor.elem_type != TensorProto.FLOAT or len(dims) != 4 or min(dims) <= 0 or dims[1] != len(mean):
            raise UnsupportedError(f"{source}: --image-input {name!r}: the input must be a float32 N x C x H x W "
                                   f"map with static sizes and C = {len(mean)} (the values given), not {dims}")
        n, c, h, w = dims
        inner = f"{name}:normalised"
        for node in model.graph.node:
            node.input[:] = [inner if i == name else i for i in node.input]
        for out in model.graph.output:
            if out.name == name:
                raise UnsupportedError(f"{source}: --image-input {name!r} is also a model output")
        shape = [1, c, 1, 1]
        model.graph.initializer.extend([
            numpy_helper.from_array(np.asarray(mean, np.float32).reshape(shape), f"{name}:mean"),
            numpy_helper.from_array(np.asarray(std, np.float32).reshape(shape), f"{name}:std")])
        nodes = [helper.make_node("Transpose", [name], [f"{name}:nchw"], perm=[0, 3, 1, 2], name=f"{name}:nchw"),
                 helper.make_node("Cast", [f"{name}:nchw"], [f"{name}:float"], to=TensorProto.FLOAT,
                                  name=f"{name}:float"),
                 helper.make_node("Sub", [f"{name}:float", f"{name}:mean"], [f"{name}:centred"],
                                  name=f"{name}:centred"),
                 helper.make_node("Div", [f"{name}:centred", f"{name}:std"], [inner], name=inner)]
        for node in reversed(nodes):
            model.graph.node.insert(0, node)
        inputs[name].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.UINT8, [n, h, w, c]))


# -- shape inference and constant folding -------------------------------------------
def infer_shapes(model, source: str):
    onnx = _onnx()
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        pass  # data propagation trips over some valid models (e.g. Size in opset 21): try without
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception as exc:
        raise FormatError(f"{source}: ONNX shape inference failed: {str(exc).strip().splitlines()[-1]}") from None


def _static_shape(value_info) -> tuple[int, ...] | None:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(d.dim_value)
    return tuple(dims)


def _evaluate(node, values: Mapping[str, np.ndarray], opset: int) -> list[np.ndarray]:
    """Run one node on constant inputs with onnx's reference evaluator."""
    onnx = _onnx()
    from onnx import helper, numpy_helper  # deferred (see _onnx)
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Constant":
        return [_constant_value(node)]
    inputs = [i for i in node.input if i]
    graph = helper.make_graph([node], "fold", [], [onnx.ValueInfoProto(name=o) for o in node.output if o],
                              [numpy_helper.from_array(np.asarray(values[i]), i) for i in dict.fromkeys(inputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    results = ReferenceEvaluator(model).run(None, {})
    return [np.asarray(r) for r in results]


def _constant_value(node) -> np.ndarray:
    from onnx import helper, numpy_helper  # deferred (see _onnx)

    attr = node.attribute[0]
    value = helper.get_attribute_value(attr)
    if attr.name == "value":
        return numpy_helper.to_array(value)
    if attr.name in ("value_float", "value_int"):
        return np.array(value, dtype=np.float32 if attr.name == "value_float" else np.int64)
    if attr.name in ("value_floats", "value_ints"):
        return np.array(value, dtype=np.float32 if attr.name == "value_floats" else np.int64)
    raise UnsupportedError(f"Constant {node.name!r}: {attr.name} constants are not supported")


SMALL_CONSTANT = 64  # elements: constants up to this size stay visible to ONNX's data propagation


def _skeleton(model, consts: Mapping[str, np.ndarray]):
    """A copy of `model` whose large constants are typed graph inputs instead of
    initializers: shape inference then never serialises megabytes of weights."""
    from onnx import helper, numpy_helper  # deferred (see _onnx)

    onnx = _onnx()
    skel = onnx.ModelProto()
    skel.CopyFrom(model)
    g = skel.graph
    del g.initializer[:]
    del g.value_info[:]
    real = [i.name for i in _real_inputs(model.graph)]
    kept_inputs = [i for i in model.graph.input if i.name in real]
    del g.input[:]
    g.input.extend(kept_inputs)
    for name, value in consts.items():
        if value.size <= SMALL_CONSTANT:
            g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            g.input.append(helper.make_tensor_value_info(name, elem, value.shape))
    return skel


def _packed_bits() -> dict[int, int]:
    """Bits per element of the ONNX types stored packed (those this onnx release knows)."""
    from onnx import TensorProto  # deferred (see _onnx)

    widths = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}
    return {getattr(TensorProto, name): bits for name, bits in widths.items() if hasattr(TensorProto, name)}


def _initializer(init, source: str) -> np.ndarray:
    """An initializer's value; its declared shape bounded and matched by its data."""
    from onnx import helper, numpy_helper  # deferred (see _onnx)

    try:
        itemsize = helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    except Exception:
        raise FormatError(f"{source}: initializer {init.name!r} has unknown data type {init.data_type}") from None
    try:
        check_tensor_size(list(init.dims), itemsize, f"{source}: initializer {init.name!r}")
        if any(d < 0 for d in init.dims):
            raise FormatError(f"{source}: initializer {init.name!r} has negative dimensions {list(init.dims)}")
        count, packed = int(np.prod(init.dims, dtype=object)), _packed_bits()
        # 4- and 2-bit types are packed in raw_data (two or four to a byte), unpacked to a byte each by numpy
        needs = -(-count * packed[init.data_type] // 8) if init.data_type in packed else count * itemsize
        if init.HasField("raw_data") and len(init.raw_data) != needs:
            raise FormatError(f"{source}: initializer {init.name!r} has {len(init.raw_data)} bytes of data, but "
                              f"shape {list(init.dims)} needs {needs}")
        return numpy_helper.to_array(init)
    except (FormatError, VerifyError):
        raise
    except Exception as exc:  # data that does not match the declared shape and type
        raise FormatError(f"{source}: initializer {init.name!r} is malformed ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def _check_shapes(value_infos, source: str) -> None:
    """Every shape ONNX inferred, bounded before anything of that size exists."""
    from onnx import helper  # deferred (see _onnx)

    for vi in value_infos:
        shape = _static_shape(vi)
        if shape is not None:
            try:
                itemsize = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).itemsize
            except Exception:
                itemsize = 1
            check_tensor_size(shape, itemsize, f"{source}: tensor {vi.name!r}")


def _fold_size_bound(node, values: Mapping[str, np.ndarray], shapes, source: str) -> None:
    """Refuse a fold whose result would exceed the tensor limit, before evaluating it
    (ConstantOfShape and Expand take their output shape from a constant input)."""
    for out in node.output:
        if out and shapes.get(out) is not None:
            check_tensor_size(shapes[out], 1, f"{source}: {node.op_type} {node.name!r} output {out!r}")
    if node.op_type in ("ConstantOfShape", "Expand", "Tile") and len(node.input) >= (1 if node.op_type ==
                                                                                       "ConstantOfShape" else 2):
        arg = values.get(node.input[0 if node.op_type == "ConstantOfShape" else 1])
        if arg is None:
            return
        dims = [int(d) for d in np.asarray(arg).reshape(-1)]
        if node.op_type != "ConstantOfShape":
            base = list(np.shape(values.get(node.input[0], np.zeros(0))))
            if node.op_type == "Tile":
                dims = [a * b for a, b in zip(base, dims)]
            else:
                width = max(len(base), len(dims))
                base = [1] * (width - len(base)) + base
                dims = [1] * (width - len(dims)) + dims
                dims = [max(a, b) for a, b in zip(base, dims)]
        check_tensor_size(dims, 1, f"{source}: {node.op_type} {node.name!r}")


def fold_constants(model, source: str):
    """Replace every node computable at compile time by a constant; repeat with
    fresh shape inference until nothing changes.

    Returns (model, constants): the model holds the remaining nodes with
    inferred value_info and no initializer data; `constants` maps every
    constant tensor name to its value."""
    opset = default_opset(model)
    input_names = {i.name for i in _real_inputs(model.graph)}
    consts = {i.name: _initializer(i, source) for i in model.graph.initializer if i.name not in input_names}
    nodes = list(model.graph.node)
    while True:
        skel = _skeleton(model, consts)
        del skel.graph.node[:]
        skel.graph.node.extend(nodes)
        skel = infer_shapes(skel, source)
        infos = [*skel.graph.input, *skel.graph.value_info, *skel.graph.output]
        _check_shapes(infos, source)
        shapes = {vi.name: _static_shape(vi) for vi in infos}
        keep, changed = [], False
        for node in nodes:
            present = [i for i in node.input if i]
            values = consts
            foldable = node.op_type not in NONDETERMINISTIC | QUANTIZATION and all(i in consts for i in present)
            if node.op_type in ("Shape", "Size") and present and shapes.get(present[0]) is not None:
                foldable = True
                values = {present[0]: np.zeros(shapes[present[0]], np.float32)}  # only its shape is read
            if not foldable or any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute):
                keep.append(node)
                continue
            _fold_size_bound(node, values, shapes, source)
            try:
                results = _evaluate(node, values, opset)
            except (UnsupportedError, VerifyError):
                raise
            except Exception as exc:
                raise FormatError(f"{source}: folding constant {node.op_type} {node.name!r} failed: "
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
            for name, value in zip(node.output, results):
                if name:
                    declared = shapes.get(name)
                    if declared is not None and value.shape != declared and value.size == int(np.prod(declared)):
                        value = value.reshape(declared)  # e.g. a scalar the evaluator returned as [1]
                    consts[name] = value
            changed = True
        if not changed:
            used = {i for n in nodes for i in n.input} | {o.name for o in model.graph.output}
            return skel, {k: v for k, v in consts.items() if k in used}
        nodes = keep


# -- translation ----------------------------------------------------------------------
_DIM_NAME = re.compile(r"[^A-Za-z0-9_]")


def _dim(d) -> int | str:
    if d.HasField("dim_value") and d.dim_value >= 0:
        return int(d.dim_value)
    name = _DIM_NAME.sub("_", d.dim_param) if d.dim_param else "unk"
    return name if name[0].isalpha() or name[0] == "_" else "d_" + name


def _type_of(value_info, what: str) -> TensorType | None:
    t = value_info.type
    if not t.HasField("tensor_type"):
        raise UnsupportedError(f"{what}: only tensors are supported (not sequences, maps or optionals)")
    tt = t.tensor_type
    if not tt.elem_type:
        return None
    dtype = ir_dtype(tt.elem_type, what)
    if not tt.HasField("shape"):
        return None
    return TensorType(dtype, tuple(_dim(d) for d in tt.shape.dim))


def _attr_value(node, attr, opset: int):
    from onnx import AttributeProto, helper, numpy_helper  # deferred (see _onnx)

    where = f"op {node.op_type} {node.name!r}"
    if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        raise UnsupportedError(f"{where}: subgraph attributes (control flow) are not supported")
    if attr.type in (AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTO,
                     AttributeProto.TYPE_PROTOS, AttributeProto.TENSORS):
        raise UnsupportedError(f"{where}: attribute {attr.name} of this kind is not supported")
    value = helper.get_attribute_value(attr)
    if attr.type == AttributeProto.TENSOR:
        array = numpy_helper.to_array(value)
        if array.size != 1:
            raise UnsupportedError(f"{where}: tensor attribute {attr.name} with {array.size} elements")
        return array.reshape(-1)[0].item()
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


# ONNX ops whose attribute became an input in a later opset:
# op -> (first opset taking it as an input, [(attribute, input index, dtype or None for "like input 0")])
ATTRIBUTES_TO_INPUTS = {
    "Slice": (10, [("starts", 1, np.int64), ("ends", 2, np.int64), ("axes", 3, np.int64)]),
    "Squeeze": (13, [("axes", 1, np.int64)]),
    "Unsqueeze": (13, [("axes", 1, np.int64)]),
    "Split": (13, [("split", 1, np.int64)]),
    "Clip": (11, [("min", 1, None), ("max", 2, None)]),
    "Pad": (11, [("pads", 1, np.int64), ("value", 2, None)]),
    **{op: (18, [("axes", 1, np.int64)]) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                                    "ReduceL1", "ReduceL2", "ReduceSumSquare")},
    "ReduceSum": (13, [("axes", 1, np.int64)]),
}


class _Translator:
    def __init__(self, model, consts: Mapping[str, np.ndarray], inputs: Sequence[str], source: str) -> None:
        self.model = model
        self.input_names = list(inputs)
        self.consts = consts
        self.source = source
        self.opset = default_opset(model)
        self.g = Graph(name=model.graph.name or Path(source).stem)
        self.types: dict[str, TensorType | None] = {}
        self.infer = infer_for(self.g)
        self.fresh = 0

    def run(self) -> Graph:
        og = self.model.graph
        for vi in [*og.input, *og.value_info, *og.output]:
            self.types[vi.name] = _type_of(vi, f"tensor {vi.name!r}")
        self.g.metadata["opset"] = self.opset
        if self.model.producer_name:
            self.g.metadata["producer"] = self.model.producer_name
        for name in self.input_names:
            t = self.types.get(name)
            if t is None:
                raise UnsupportedError(f"{self.source}: input {name!r} has no type")
            self.g.add_input(name, t)
        for name, value in self.consts.items():
            self.add_const(name, value)
        for node in og.node:
            self.node(node)
        self.g.outputs = [o.name for o in og.output]
        for name in self.g.outputs:
            if name not in self.g.tensors:
                raise FormatError(f"{self.source}: graph output {name!r} is never produced")
        self.g.verify(self.infer)
        return self.g

    def add_const(self, name: str, value: np.ndarray) -> str:
        value = np.ascontiguousarray(value)
        try:
            dtype = DType.from_numpy(value.dtype)
        except ValueError:
            raise UnsupportedError(f"{self.source}: constant {name!r}: element type {value.dtype} "
                                   "is not supported") from None
        self.g.add_const(name, TensorType(dtype, tuple(value.shape)), value)
        return name

    def new_name(self, base: str) -> str:
        while True:
            self.fresh += 1
            name = f"{base}.rkc{self.fresh}"
            if name not in self.g.tensors:
                return name

    def node(self, node) -> None:
        check_known(node.op_type, f"{self.source}: node {node.name!r}")
        attrs = {}
        for a in node.attribute:
            if a.name in LEGACY_IGNORED:
                continue
            attrs[a.name] = _attr_value(node, a, self.opset)
            if a.type == a.TENSOR:  # a one-element tensor became a scalar: keep its type
                attrs["dtype"] = ir_dtype(a.t.data_type, f"op {node.op_type} attribute {a.name}").value
        inputs = list(node.input)
        while inputs and not inputs[-1]:
            inputs.pop()
        self.lift_attributes(node, inputs, attrs)
        self.translate_dtypes(node.op_type, attrs)
        if node.op_type in ("Softmax", "LogSoftmax", "Hardmax") and self.opset < 13:
            self.legacy_softmax(node, inputs, attrs)
            return
        if node.op_type == "Split" and len(inputs) < 2 and "num_outputs" not in attrs:
            attrs["num_outputs"] = len(node.output)
        self.emit(node.op_type, inputs, list(node.output), attrs, node.name or None)

    def lift_attributes(self, node, inputs: list[str], attrs: dict) -> None:
        rule = ATTRIBUTES_TO_INPUTS.get(node.op_type)
        if rule is None or self.opset >= rule[0]:
            return
        for attr, index, dtype in rule[1]:
            if attr not in attrs:
                continue
            value = attrs.pop(attr)
            if dtype is None:
                like = self.g.tensors[inputs[0]].type.dtype.numpy
                array = np.array(value, dtype=like)
            else:
                array = np.array(value, dtype=dtype)
            while len(inputs) < index:
                inputs.append("")
            name = self.add_const(self.new_name(f"{node.output[0]}.{attr}"), array)
            if len(inputs) == index:
                inputs.append(name)
            else:
                inputs[index] = name

    @staticmethod
    def translate_dtypes(op_type: str, attrs: dict) -> None:
        for key in ("to", "output_dtype"):
            if key in attrs and isinstance(attrs[key], int) and (op_type != "QuantizeLinear" or attrs[key]):
                attrs[key] = ir_dtype(attrs[key], f"op {op_type} attribute {key}").value
        if op_type == "QuantizeLinear" and attrs.get("output_dtype") == 0:
            del attrs["output_dtype"]

    def legacy_softmax(self, node, inputs, attrs) -> None:
        """Before opset 13, Softmax flattened the input to 2-D at `axis`; say so
        explicitly with Flatten and Reshape unless that is already the last axis."""
        x = self.g.tensors[inputs[0]].type
        rank = len(x.shape)
        axis = int(attrs.get("axis", 1)) % max(rank, 1)
        if axis == rank - 1 or rank <= 1:
            self.emit(node.op_type, inputs, list(node.output), {"axis": rank - 1 if rank else 0}, node.name or None)
            return
        flat = self.new_name(node.output[0])
        soft = self.new_name(node.output[0])
        shape = self.add_const(self.new_name(f"{node.output[0]}.shape"),
                               np.array([d if isinstance(d, int) else 0 for d in x.shape], np.int64))
        self.emit("Flatten", inputs[:1], [flat], {"axis": axis}, None)
        self.emit(node.op_type, [flat], [soft], {"axis": 1}, node.name or None)
        self.emit("Reshape", [soft, shape], list(node.output), {}, None)

    def emit(self, op_type: str, inputs: list[str], outputs: list[str], attrs: dict, name: str | None) -> None:
        for i in inputs:
            if i and i not in self.g.tensors:
                raise FormatError(f"{self.source}: node {name!r} ({op_type}) reads {i!r} before it is produced")
        probe = Op(op_type, inputs, outputs, attrs, name)
        ours = self.infer(probe, [self.g.tensors[i].type if i else None for i in inputs])
        decls = []
        for k, out in enumerate(outputs):
            if not out:
                raise UnsupportedError(f"{self.source}: node {name!r} ({op_type}) skips an optional output")
            t = self.types.get(out)
            if t is None or (ours is not None and k < len(ours) and not _all_known(t) and _all_known(ours[k])):
                t = ours[k] if ours is not None and k < len(ours) else None
            if t is None:
                raise UnsupportedError(f"{self.source}: cannot infer the type of {out!r} ({op_type}); "
                                       "fix dynamic dimensions with --input-shape")
            decls.append((out, t))
        self.g.add_op(op_type, inputs, decls, attrs, name)


def _all_known(t: TensorType) -> bool:
    return t.is_static


def check_known(op_type: str, where: str) -> None:
    """An op rkc neither lowers nor has a CPU kernel for is a one-line error."""
    if op_type not in OPS and (op_type not in KERNELS or op_type in LOWERING_ONLY):
        raise UnsupportedError(f"{where}: ONNX op {op_type} is not supported by rkc")


def check_attribute_types(node, opset: int, where: str) -> None:
    """Each attribute has the type ONNX's schema of the op declares (an int where
    a list of ints belongs would reach the shape rules as garbage)."""
    onnx = _onnx()
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:
        return  # no schema (check_known has judged the op itself)
    for attr in node.attribute:
        declared = schema.attributes.get(attr.name)
        if declared is None:
            if attr.name in LEGACY_IGNORED:
                continue
            raise FormatError(f"{where}: {node.op_type} has no attribute {attr.name!r} in opset {opset}")
        if attr.type != declared.type:
            got = onnx.AttributeProto.AttributeType.Name(attr.type)
            want = onnx.AttributeProto.AttributeType.Name(declared.type)
            raise FormatError(f"{where}: {node.op_type} attribute {attr.name} is {got}, the op takes {want}")


def bind_inputs(model, values: Mapping[str, np.ndarray], source: str) -> None:
    """Turn graph inputs into constants with the given values (like binding
    weights that a model takes as inputs); they then fold like initializers."""
    from onnx import numpy_helper  # deferred (see _onnx)

    inputs = {i.name: i for i in _real_inputs(model.graph)}
    for name, value in values.items():
        if name not in inputs:
            raise UnsupportedError(f"{source}: cannot bind {name!r}: the model's inputs are {', '.join(inputs)}")
        model.graph.input.remove(inputs[name])
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))


def load(path: Path, input_shapes: Mapping[str, Sequence[int]] | None = None,
         bind: Mapping[str, np.ndarray] | None = None,
         image_inputs: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None) -> Graph:
    source = str(path)
    model = read_model(path)
    if bind:
        bind_inputs(model, bind, source)
    if input_shapes:
        fix_input_shapes(model, input_shapes, source)
    if image_inputs:
        take_image_inputs(model, image_inputs, source)
    opset = default_opset(model)
    for node in model.graph.node:
        if node.op_type != "Constant" and node.op_type not in NONDETERMINISTIC:
            check_known(node.op_type, f"{source}: node {node.name!r}")
        check_attribute_types(node, opset, f"{source}: node {node.name!r}")
    inputs = [i.name for i in _real_inputs(model.graph)]
    model, consts = fold_constants(model, source)
    try:
        return _Translator(model, consts, inputs, source).run()
    except VerifyError as exc:
        raise VerifyError(f"{source}: {exc}") from None
