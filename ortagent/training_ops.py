"""Lower the training-only operators of onnxruntime-training graphs to standard ONNX operators.

Training graphs written by onnxruntime-training's ORTModule (up to 1.19.2) hold operators that
only the training build registers -- ``com.microsoft:ReluGrad``, ``SoftmaxGrad_13``,
``LayerNormalizationGrad``, ``ConcatTraining``, ``GatherGrad``, ``BatchNormInternal``,
``ConvGrad``, ``org.pytorch.aten:ATen`` and others. Stock onnxruntime refuses such a graph when
it loads it ("is not a registered function/op"), whatever the execution provider.
:func:`lower_training_ops` rewrites each of them, in place in the node list, into a short
sequence of standard ONNX operators that computes the same outputs under the same names, and
drops the attributes only the training build understands (``__backwardpass`` and the like).

The rewritten graph needs a default-domain opset of at least 16 (ScatterND/ScatterElements
with ``reduction``, CastLike); ORTModule writes 17. Every lowering works without static shapes:
what is not known from the graph's type information is computed at run time (``Shape``,
``Size``), so symbolic batch dimensions stay symbolic.

Operators with no faithful lowering (``PythonOp``/``PythonOpGrad``, the LSTM/GRU training
operators, an ATen operator without a rule, any other training-only operator) raise
:class:`~ortagent.errors.UnsupportedTrainingOpError` naming the node, the operator and what to
do, before any session exists.

Pure Python over the ``onnx`` package (and numpy for constants); no onnxruntime.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, helper, numpy_helper

from ._onnx_graph import NameAllocator, all_value_names, load_model, node_subgraphs
from .errors import UnsupportedTrainingOpError

__all__ = [
    "lower_training_ops",
    "needs_lowering",
    "lowered_operators",
    "UnsupportedTrainingOpError",
]

MS_DOMAIN = "com.microsoft"
ATEN_DOMAINS = ("org.pytorch.aten", MS_DOMAIN)
MIN_OPSET = 16
_INT64_MAX = np.iinfo(np.int64).max
_FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
_NARROW_FLOATS = {TensorProto.FLOAT16, TensorProto.BFLOAT16}

Lowering = Callable[["_Emitter", NodeProto], None]
# (domain, op_type) -> lowering; '' and 'ai.onnx' are one domain
_LOWERINGS: dict[tuple[str, str], Lowering] = {}
# ATen operator name -> lowering (the node's `operator` attribute)
_ATEN_LOWERINGS: dict[str, Lowering] = {}

# Training-only operators that are never lowered, and what to do instead.
_REFUSED = {
    "PythonOp": "a custom torch.autograd.Function runs Python inside the graph; export the module "
                "without it (inline the function's forward) or use ortagent.torch",
    "PythonOpGrad": "the backward of a custom torch.autograd.Function runs Python inside the graph; "
                    "export the module without it",
    "LSTMTraining": "an LSTM's training form has no ONNX equivalent; unroll the recurrence at export",
    "LSTMGrad": "an LSTM's gradient has no ONNX equivalent; unroll the recurrence at export",
    "GRUTraining": "a GRU's training form has no ONNX equivalent; unroll the recurrence at export",
    "GRUGrad": "a GRU's gradient has no ONNX equivalent; unroll the recurrence at export",
    "ConvTransposeGrad": "not lowered yet; use a Conv-based upsampling or open an issue",
    "ResizeGrad": "the adjoint of Resize is not lowered; export the upsampling as ConvTranspose",
    "InPlaceAccumulator": "gradient accumulation buffers are the caller's job with TrainingAgent",
    "InPlaceAccumulatorV2": "gradient accumulation buffers are the caller's job with TrainingAgent",
    "SoftmaxDropoutGrad": "not lowered yet (BiasSoftmaxDropout fusion); build the graph without "
                          "the CUDA fusions",
    "BiasSoftmaxDropout": "not lowered yet (a CUDA fusion); build the graph without the CUDA fusions",
    "TritonOp": "Triton kernels exist only in the training build",
    "FakeQuant": "quantization-aware training ops are not lowered",
    "FakeQuantGrad": "quantization-aware training ops are not lowered",
}
# com.microsoft operators that stock onnxruntime registers and that training graphs use as they are.
_STOCK_CONTRIB_HINTS = ("Fused", "Gelu", "SkipLayerNormalization", "Attention", "QuickGelu")


def _lowers(*op_types: str, domain: str = MS_DOMAIN) -> Callable[[Lowering], Lowering]:
    def register(function: Lowering) -> Lowering:
        for op_type in op_types:
            _LOWERINGS[(domain, op_type)] = function
        return function
    return register


def _lowers_aten(*operators: str) -> Callable[[Lowering], Lowering]:
    def register(function: Lowering) -> Lowering:
        for name in operators:
            _ATEN_LOWERINGS[name] = function
        return function
    return register


def _domain(node: NodeProto) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def _is_aten(node: NodeProto) -> bool:
    return node.op_type == "ATen" and node.domain in ATEN_DOMAINS


def _is_training_only(node: NodeProto) -> bool:
    """Whether stock onnxruntime lacks `node`'s operator (as far as this module can tell)."""
    domain = _domain(node)
    if (domain, node.op_type) in _LOWERINGS or _is_aten(node) or node.op_type in _REFUSED:
        return domain in ("", MS_DOMAIN) or _is_aten(node)
    if domain == MS_DOMAIN:
        if any(hint in node.op_type for hint in _STOCK_CONTRIB_HINTS):
            return False
        return node.op_type.endswith(("Grad", "Training", "Internal", "Internal2"))
    return False


def _training_attribute(attribute: AttributeProto) -> bool:
    return attribute.name.startswith("__")


def lowered_operators() -> list[str]:
    """The operators :func:`lower_training_ops` rewrites, as ``domain:op_type`` (ATen operators
    as ``ATen:<operator>``), sorted."""
    names = [f"{domain or 'ai.onnx'}:{op}" for domain, op in _LOWERINGS]
    names += [f"ATen:{name}" for name in _ATEN_LOWERINGS]
    return sorted(names)


def needs_lowering(model: ModelProto | bytes | str | os.PathLike) -> bool:
    """Whether ``model`` holds a training-only operator or a training-only attribute."""
    proto = load_model(model)
    for graph in _graphs(proto.graph):
        for node in graph.node:
            if _is_training_only(node) or any(_training_attribute(a) for a in node.attribute):
                return True
    return False


def _graphs(graph: GraphProto) -> Iterable[GraphProto]:
    yield graph
    for node in graph.node:
        for sub in node_subgraphs(node):
            yield from _graphs(sub)


def lower_training_ops(model: ModelProto | bytes | str | os.PathLike) -> ModelProto:
    """A copy of ``model`` with every training-only operator rewritten into standard operators.

    ``model`` is an ``onnx.ModelProto`` (not modified), serialized model bytes or a path. The
    YieldOp is kept (it is the split point of :class:`~ortagent.TrainingAgent`). Attributes that
    only the training build understands are dropped from every node. A model without
    training-only operators comes back as an equal copy.

    Raises :class:`~ortagent.errors.UnsupportedTrainingOpError` for an operator that cannot be
    lowered faithfully (the message names the node, the operator and what to do), and
    :class:`~ortagent.errors.TrainingGraphError` when the model's opset is too old.
    """
    source = load_model(model)
    result = ModelProto()
    result.CopyFrom(source)
    opset = _default_opset(result)
    types = _collect_types(result)
    names = NameAllocator(all_value_names(result.graph))
    constants: dict[str, np.ndarray] = {}
    _lower_graph(result.graph, opset, types, constants, names)
    if not any(entry.domain == MS_DOMAIN for entry in result.opset_import):
        if any(_domain(n) == MS_DOMAIN for g in _graphs(result.graph) for n in g.node):
            result.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return result


def _default_opset(model: ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 1


def _collect_types(model: ModelProto) -> dict[str, TypeProto]:
    """Every value type the model declares or onnx can infer (training ops stop inference only
    downstream of their outputs where nothing is declared)."""
    types: dict[str, TypeProto] = {}

    def take(graph: GraphProto) -> None:
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.WhichOneof("value") is not None:
                types.setdefault(value.name, value.type)
        for init in graph.initializer:
            types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))

    for graph in _graphs(model.graph):
        take(graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is only a help: lowerings fall back to run-time shapes
        return types
    for graph in _graphs(inferred.graph):
        for value in graph.value_info:
            if value.type.WhichOneof("value") is not None and value.name not in types:
                types[value.name] = value.type
    return types


def _constant_values(graph: GraphProto, outer: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    values = dict(outer)
    for init in graph.initializer:
        values[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and _domain(node) == "" and len(node.output) == 1:
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.type == AttributeProto.TENSOR:
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def _lower_graph(graph: GraphProto, opset: int, types: dict[str, TypeProto],
                 outer_constants: dict[str, np.ndarray], names: NameAllocator) -> None:
    constants = _constant_values(graph, outer_constants)
    producers = {}
    for node in graph.node:
        for position, output in enumerate(node.output):
            if output:
                producers[output] = (node, position)
    rewritten: list[NodeProto] = []
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                _lower_graph(attribute.g, opset, types, constants, names)
            elif attribute.type == AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    _lower_graph(sub, opset, types, constants, names)
        lowering = _lowering_for(node)
        if lowering is None:
            if _is_training_only(node):
                _refuse(node)
            _strip_training_attributes(node)
            rewritten.append(node)
            continue
        if opset < MIN_OPSET:
            from .errors import TrainingGraphError
            raise TrainingGraphError(
                f"node {node.name!r} ({node.domain or 'ai.onnx'}:{node.op_type}) needs lowering, which "
                f"needs a default opset of at least {MIN_OPSET}; the model imports opset {opset} "
                "(export it with opset 17, as ORTModule does)")
        emitter = _Emitter(node, opset, types, constants, producers, names)
        lowering(emitter, node)
        rewritten.extend(emitter.nodes)
    del graph.node[:]
    graph.node.extend(rewritten)


def _lowering_for(node: NodeProto) -> Lowering | None:
    if _is_aten(node):
        operator = _string_attribute(node, "operator")
        lowering = _ATEN_LOWERINGS.get(operator or "")
        if lowering is None:
            raise UnsupportedTrainingOpError(
                f"node {node.name!r} is ATen operator {operator!r} (overload "
                f"{_string_attribute(node, 'overload_name')!r}), which ortagent cannot lower to ONNX "
                f"operators; lowered ATen operators: {sorted(_ATEN_LOWERINGS)}. Export the module so "
                "that this operation is written with standard ONNX operators",
                node_name=node.name, op_type=f"ATen:{operator}")
        return lowering
    return _LOWERINGS.get((_domain(node), node.op_type))


def _refuse(node: NodeProto) -> None:
    advice = _REFUSED.get(node.op_type, "ortagent has no lowering for it; build the graph without it "
                                        "or open an issue with the model")
    raise UnsupportedTrainingOpError(
        f"node {node.name!r} is {node.domain or 'ai.onnx'}:{node.op_type}, a training-only operator "
        f"that stock onnxruntime cannot run and ortagent does not lower: {advice}",
        node_name=node.name, op_type=node.op_type)


def _strip_training_attributes(node: NodeProto) -> None:
    kept = [a for a in node.attribute if not _training_attribute(a)]
    if len(kept) != len(node.attribute):
        del node.attribute[:]
        node.attribute.extend(kept)


def _string_attribute(node: NodeProto, name: str) -> str | None:
    for attribute in node.attribute:
        if attribute.name == name:
            value = helper.get_attribute_value(attribute)
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


# ---------------------------------------------------------------------------------------------


class _Emitter:
    """Builds the replacement of one node: fresh names, constants, and the new nodes in order."""

    def __init__(self, node: NodeProto, opset: int, types: dict[str, TypeProto],
                 constants: dict[str, np.ndarray], producers: dict, names: NameAllocator) -> None:
        self.node = node
        self.opset = opset
        self.types = types
        self.constants = constants
        self.producers = producers
        self.names = names
        self.nodes: list[NodeProto] = []
        self.stem = (node.name or node.op_type).replace("/", "_")

    # -- the node being lowered ---------------------------------------------------------------

    def input(self, index: int) -> str | None:
        """The node's input `index`, or None when absent or empty."""
        if index < len(self.node.input) and self.node.input[index]:
            return self.node.input[index]
        return None

    def output(self, index: int) -> str | None:
        """The node's output `index`, or None when not asked for."""
        if index < len(self.node.output) and self.node.output[index]:
            return self.node.output[index]
        return None

    def attr(self, name: str, default=None):
        """The attribute's value, or `default` (a float default is rounded to float32, as a
        stored FLOAT attribute would be)."""
        for attribute in self.node.attribute:
            if attribute.name == name:
                value = helper.get_attribute_value(attribute)
                return value.decode() if isinstance(value, bytes) else value
        if isinstance(default, float):
            return float(np.float32(default))
        return default

    def error(self, reason: str) -> UnsupportedTrainingOpError:
        node = self.node
        return UnsupportedTrainingOpError(
            f"node {node.name!r} ({node.domain or 'ai.onnx'}:{node.op_type}) cannot be lowered: {reason}",
            node_name=node.name, op_type=node.op_type)

    # -- what is known about values ---------------------------------------------------------------

    def elem_type(self, name: str) -> int | None:
        type_proto = self.types.get(name)
        if type_proto is not None and type_proto.HasField("tensor_type") and type_proto.tensor_type.elem_type:
            return type_proto.tensor_type.elem_type
        if name in self.constants:
            return helper.np_dtype_to_tensor_dtype(self.constants[name].dtype)
        return None

    def shape(self, name: str) -> list[int | None] | None:
        """The static shape of `name` (None for unknown dims), or None when even the rank is unknown."""
        if name in self.constants:
            return list(self.constants[name].shape)
        type_proto = self.types.get(name)
        if type_proto is None or not type_proto.HasField("tensor_type"):
            return None
        tensor = type_proto.tensor_type
        if not tensor.HasField("shape"):
            return None
        return [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor.shape.dim]

    def rank(self, *names: str | None) -> int | None:
        for name in names:
            if name:
                shape = self.shape(name)
                if shape is not None:
                    return len(shape)
        return None

    def constant(self, name: str | None) -> np.ndarray | None:
        return None if name is None else self.constants.get(name)

    def producer(self, name: str) -> tuple[NodeProto, int] | None:
        return self.producers.get(name)

    # -- emitting -------------------------------------------------------------------------------

    def op(self, op_type: str, *inputs: str | None, out: str | Sequence[str] | None = None,
           outputs: int = 1, domain: str = "", **attributes) -> str | list[str]:
        """Append a node; returns its output name (or names when `outputs` > 1 or `out` is a list)."""
        if out is None:
            out_names = [self.names.fresh(f"{self.stem}/{op_type}") for _ in range(outputs)]
        elif isinstance(out, str):
            out_names = [out]
        else:
            out_names = [name or "" for name in out]
        attributes = {key: value for key, value in attributes.items() if value is not None}
        self.nodes.append(helper.make_node(
            op_type, [name or "" for name in inputs], out_names,
            name=self.names.fresh(f"{self.stem}/{op_type}"), domain=domain or None, **attributes))
        if isinstance(out, str) or (out is None and outputs == 1):
            return out_names[0]
        return out_names

    def rename(self, value: str, out: str) -> None:
        """Make the node that computed `value` (a fresh name) write `out` instead: no Identity copy."""
        for node in self.nodes:
            for position, name in enumerate(node.output):
                if name == value:
                    node.output[position] = out
            for position, name in enumerate(node.input):
                if name == value:
                    node.input[position] = out
        if value in self.constants:
            self.constants[out] = self.constants.pop(value)

    def produced_here(self, value: str) -> bool:
        return any(value in node.output for node in self.nodes)

    def write(self, value: str, out: str) -> None:
        """`value` under the name `out` (renamed when this lowering computed it, else an Identity)."""
        if self.produced_here(value):
            self.rename(value, out)
        else:
            self.op("Identity", value, out=out)

    def cast_like(self, value: str, like: str, out: str | None = None) -> str:
        """`value` in `like`'s element type (no node when both are known to agree)."""
        known = self.elem_type(like)
        if known is not None and known == self.elem_type(value):
            if out is None:
                return value
            self.write(value, out)
            return out
        return self.op("CastLike", value, like, out=out)

    def typed_like(self, value: str, like: str) -> str:
        """Note that `value` has `like`'s element type (where known); returns `value`."""
        elem = self.elem_type(like)
        if elem is not None:
            self.types[value] = helper.make_tensor_type_proto(elem, None)
        return value

    def int64(self, value: str) -> str:
        """`value` as int64 (no node when it is known to be int64 already)."""
        if self.elem_type(value) == TensorProto.INT64:
            return value
        return self.op("Cast", value, to=TensorProto.INT64)

    def const(self, value, dtype=None) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self.names.fresh(f"{self.stem}/const")
        self.nodes.append(helper.make_node(
            "Constant", [], [name], name=self.names.fresh(f"{self.stem}/Constant"),
            value=numpy_helper.from_array(array, name)))
        self.constants[name] = array
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def scalar(self, value: float, like: str) -> str:
        """A scalar `value` of `like`'s element type."""
        elem = self.elem_type(like)
        if elem is not None and elem not in _NARROW_FLOATS and elem != TensorProto.STRING:
            return self.const(np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem)))
        return self.op("CastLike", self.const(np.asarray(value, dtype=np.float32)), like)

    def zeros(self, shape: str, like: str) -> str:
        """Zeros of shape `shape` (an int64 tensor) and `like`'s element type."""
        return self.op("Expand", self.scalar(0, like), shape)

    def cast_to(self, name: str, elem: int) -> str:
        return self.op("Cast", name, to=elem)

    def reduce_sum(self, data: str, axes: str | None, keepdims: int, out: str | None = None) -> str:
        """ReduceSum over `axes` (an int64 tensor name; None = all axes)."""
        if axes is None:
            return self.op("ReduceSum", data, out=out, keepdims=keepdims)
        return self.op("ReduceSum", data, axes, out=out, keepdims=keepdims)

    def axes_from(self, axis: int, like: str) -> str:
        """The axes [axis, ..., rank-1] of `like` as an int64 tensor (static when the rank is known)."""
        rank = self.rank(like)
        if rank is not None:
            start = axis + rank if axis < 0 else axis
            return self.ints(range(start, rank))
        rank_t = self.op("Size", self.op("Shape", like))
        if axis < 0:
            start = self.op("Add", rank_t, self.const(np.int64(axis)))
        else:
            start = self.const(np.int64(axis))
        return self.op("Range", start, rank_t, self.const(np.int64(1)))

    def axes_before(self, axis: int, like: str) -> str:
        """The axes [0, ..., axis-1] of `like` (axis may be negative)."""
        if axis >= 0:
            return self.ints(range(axis))
        rank = self.rank(like)
        if rank is not None:
            return self.ints(range(axis + rank))
        rank_t = self.op("Size", self.op("Shape", like))
        stop = self.op("Add", rank_t, self.const(np.int64(axis)))
        return self.op("Range", self.const(np.int64(0)), stop, self.const(np.int64(1)))

    def channel_axes(self, like: str) -> str:
        """The axes [0, 2, 3, ..., rank-1] of `like` (all but the channel axis)."""
        rank = self.rank(like)
        if rank is not None:
            return self.ints([0, *range(2, rank)])
        return self.op("Concat", self.ints([0]), self.axes_from(2, like), axis=0)

    def count_over(self, like: str, axes: str) -> str:
        """The number of elements of `like` along `axes`, as a scalar of `like`'s type."""
        sizes = self.op("Gather", self.op("Shape", like), axes, axis=0)
        count = self.op("ReduceProd", sizes, keepdims=0)
        return self.op("CastLike", count, like)

    def in_float(self, compute: Callable[..., str], *names: str, out: str) -> None:
        """Run `compute` on `names` in float32 when the first is float16/bfloat16, else as is,
        writing `out` (the kernels of the narrow types accumulate in float32)."""
        elem = self.elem_type(names[0])
        if elem in _NARROW_FLOATS:
            wide = [self.cast_to(n, TensorProto.FLOAT) for n in names]
            self.op("Cast", compute(*wide), out=out, to=elem)
        else:
            self.write(compute(*names), out)


# ---------------------------------------------------------------------------------------------
# activations


@_lowers("ReluGrad")
def _relu_grad(e: _Emitter, node: NodeProto) -> None:
    dy, x = e.input(0), e.input(1)
    positive = e.op("Greater", x, e.scalar(0, x))
    e.op("Where", positive, dy, e.scalar(0, dy), out=e.output(0))


@_lowers("LeakyReluGrad")
def _leaky_relu_grad(e: _Emitter, node: NodeProto) -> None:
    dy, y = e.input(0), e.input(1)
    alpha = float(e.attr("alpha", 0.01))
    positive = e.op("Greater", y, e.scalar(0, y))
    e.op("Where", positive, dy, e.op("Mul", dy, e.scalar(alpha, dy)), out=e.output(0))


@_lowers("SigmoidGrad")
def _sigmoid_grad(e: _Emitter, node: NodeProto) -> None:
    def compute(dy: str, y: str) -> str:
        return e.op("Mul", e.op("Mul", dy, y), e.op("Sub", e.scalar(1, y), y))
    e.in_float(compute, e.input(0), e.input(1), out=e.output(0))


@_lowers("TanhGrad")
def _tanh_grad(e: _Emitter, node: NodeProto) -> None:
    def compute(dy: str, y: str) -> str:
        return e.op("Mul", dy, e.op("Sub", e.scalar(1, y), e.op("Mul", y, y)))
    e.in_float(compute, e.input(0), e.input(1), out=e.output(0))


def _gelu_derivative(e: _Emitter, x: str) -> str:
    """d/dx of x * Phi(x): Phi(x) + x * phi(x)."""
    scaled = e.op("Mul", x, e.scalar(np.sqrt(0.5), x))
    if e.elem_type(x) == TensorProto.DOUBLE:
        # onnxruntime has no double Erf kernel (nor had the training build a double GeluGrad)
        erf = e.op("CastLike", e.op("Erf", e.cast_to(scaled, TensorProto.FLOAT)), x)
    else:
        erf = e.op("Erf", scaled)
    cdf = e.op("Mul", e.scalar(0.5, x), e.op("Add", e.scalar(1, x), erf))
    pdf = e.op("Mul", e.op("Exp", e.op("Mul", e.op("Mul", x, x), e.scalar(-0.5, x))),
               e.scalar(1.0 / np.sqrt(2.0 * np.pi), x))
    return e.op("Add", cdf, e.op("Mul", x, pdf))


def _fast_gelu_derivative(e: _Emitter, x: str) -> str:
    """d/dx of the tanh approximation 0.5 x (1 + tanh(a (x + g x^3)))."""
    a, g = np.sqrt(2.0 / np.pi), 0.044715
    x2 = e.op("Mul", x, x)
    inner = e.op("Mul", e.op("Mul", x, e.op("Add", e.scalar(1, x), e.op("Mul", x2, e.scalar(g, x)))),
                 e.scalar(a, x))
    t = e.op("Tanh", inner)
    # d inner / dx = a (1 + 3 g x^2)
    dinner = e.op("Mul", e.op("Add", e.scalar(1, x), e.op("Mul", x2, e.scalar(3 * g, x))), e.scalar(a, x))
    one_minus_t2 = e.op("Sub", e.scalar(1, x), e.op("Mul", t, t))
    total = e.op("Add", e.op("Add", e.scalar(1, x), t), e.op("Mul", e.op("Mul", x, one_minus_t2), dinner))
    return e.op("Mul", e.scalar(0.5, x), total)


def _gelu_family(derivative: Callable[[_Emitter, str], str], with_bias: bool) -> Lowering:
    def lower(e: _Emitter, node: NodeProto) -> None:
        def compute(dy: str, x: str, *bias: str) -> str:
            if bias:
                x = e.typed_like(e.op("Add", x, bias[0]), x)
            return e.op("Mul", dy, derivative(e, x))
        names = [e.input(0), e.input(1)] + ([e.input(2)] if with_bias else [])
        e.in_float(compute, *names, out=e.output(0))
    return lower


_lowers("GeluGrad")(_gelu_family(_gelu_derivative, False))
_lowers("BiasGeluGrad_dX")(_gelu_family(_gelu_derivative, True))
_lowers("FastGeluGrad")(_gelu_family(_fast_gelu_derivative, False))
_lowers("BiasFastGeluGrad_dX")(_gelu_family(_fast_gelu_derivative, True))


@_lowers("QuickGeluGrad")
def _quick_gelu_grad(e: _Emitter, node: NodeProto) -> None:
    alpha = float(e.attr("alpha", 1.702))

    def compute(dy: str, x: str) -> str:
        ax = e.op("Mul", x, e.scalar(alpha, x))
        s = e.op("Sigmoid", ax)
        factor = e.op("Add", e.scalar(1, x), e.op("Mul", ax, e.op("Sub", e.scalar(1, x), s)))
        return e.op("Mul", dy, e.op("Mul", s, factor))
    e.in_float(compute, e.input(0), e.input(1), out=e.output(0))


# ---------------------------------------------------------------------------------------------
# softmax


def _softmax_axes(e: _Emitter, opset13: bool, like: str) -> str:
    axis = int(e.attr("axis", -1 if opset13 else 1))
    if opset13:
        return e.ints([axis])
    return e.axes_from(axis, like)        # pre-13 Softmax: the input coerced to 2-D at `axis`


def _softmax_grad(opset13: bool) -> Lowering:
    def lower(e: _Emitter, node: NodeProto) -> None:
        dy, y = e.input(0), e.input(1)
        axes = _softmax_axes(e, opset13, y)

        def compute(dy: str, y: str) -> str:
            total = e.reduce_sum(e.op("Mul", dy, y), axes, keepdims=1)
            return e.op("Mul", y, e.op("Sub", dy, total))
        e.in_float(compute, dy, y, out=e.output(0))
    return lower


def _log_softmax_grad(opset13: bool) -> Lowering:
    def lower(e: _Emitter, node: NodeProto) -> None:
        dy, y = e.input(0), e.input(1)
        axes = _softmax_axes(e, opset13, y)

        def compute(dy: str, y: str) -> str:
            total = e.reduce_sum(dy, axes, keepdims=1)
            return e.op("Sub", dy, e.op("Mul", e.op("Exp", y), total))
        e.in_float(compute, dy, y, out=e.output(0))
    return lower


_lowers("SoftmaxGrad_13")(_softmax_grad(True))
_lowers("SoftmaxGrad")(_softmax_grad(False))
_lowers("LogSoftmaxGrad_13")(_log_softmax_grad(True))
_lowers("LogSoftmaxGrad")(_log_softmax_grad(False))


# ---------------------------------------------------------------------------------------------
# dropout


def _dropout_backward(e: _Emitter, dy: str, mask: str, ratio: str | None, training: str | None,
                      out: str) -> None:
    """dx = mask ? dy / (1 - ratio) : 0; dy itself where ratio is 0 or training_mode is false."""
    ratio_value = e.constant(ratio)
    # the kernel computes 1 - ratio in float32 whatever the data type
    ratio_f = e.const(np.float32(0.5)) if ratio is None else e.op("Cast", ratio, to=TensorProto.FLOAT)
    training_value = e.constant(training)
    if training is not None and training_value is not None and not bool(np.all(training_value)):
        e.op("Identity", dy, out=out)
        return
    if ratio_value is not None and float(np.asarray(ratio_value).reshape(-1)[0]) == 0.0:
        e.op("Identity", dy, out=out)
        return
    kept = e.op("Div", dy, e.op("CastLike", e.op("Sub", e.const(np.float32(1)), ratio_f), dy))
    if ratio_value is None and ratio is not None:
        # a ratio known only at run time: 0 means the kernel passes dy through
        keep = e.op("Or", mask, e.op("Equal", ratio_f, e.const(np.float32(0))))
    else:
        keep = mask
    if training is not None and training_value is None:
        dropped = e.op("Where", keep, kept, e.scalar(0, dy))
        e.op("Where", training, dropped, dy, out=out)
    else:
        e.op("Where", keep, kept, e.scalar(0, dy), out=out)


@_lowers("DropoutGrad")
def _dropout_grad(e: _Emitter, node: NodeProto) -> None:
    _dropout_backward(e, e.input(0), e.input(1), e.input(2), e.input(3), e.output(0))


@_lowers("BitmaskDropoutGrad")
def _bitmask_dropout_grad(e: _Emitter, node: NodeProto) -> None:
    dy, packed = e.input(0), e.input(1)
    shifts = e.const(np.arange(32, dtype=np.uint32))
    words = e.op("Unsqueeze", packed, e.ints([-1]))
    bits = e.op("Mod", e.op("BitShift", words, shifts, direction="RIGHT"), e.const(np.uint32(2)))
    flat = e.op("Reshape", bits, e.ints([-1]))
    count = e.op("Reshape", e.op("Size", dy), e.ints([1]))
    first = e.op("Slice", flat, e.ints([0]), count)
    mask = e.op("Cast", e.op("Reshape", first, e.op("Shape", dy)), to=TensorProto.BOOL)
    _dropout_backward(e, dy, mask, e.input(2), e.input(3), e.output(0))


# ---------------------------------------------------------------------------------------------
# gathers, slices, concat/split


def _normalized_indices(e: _Emitter, indices: str, size: str) -> str:
    """`indices` as int64 with negative entries wrapped by `size` (an int64 scalar)."""
    indices = e.int64(indices)
    negative = e.op("Less", indices, e.const(np.int64(0)))
    return e.op("Where", negative, e.op("Add", indices, size), indices)


@_lowers("GatherGrad")
def _gather_grad(e: _Emitter, node: NodeProto) -> None:
    shape, indices, dy = e.input(0), e.input(1), e.input(2)
    shape = e.int64(shape)
    axis = int(e.attr("axis", 0))
    size = e.op("Squeeze", e.op("Slice", shape, e.ints([axis]), e.ints([axis + 1 if axis != -1 else _INT64_MAX])),
                e.ints([0]))
    idx = _normalized_indices(e, indices, size)
    if axis == 0:
        index = e.op("Unsqueeze", idx, e.ints([-1]))
        e.op("ScatterND", e.zeros(shape, dy), index, dy, out=e.output(0), reduction="add")
        return
    # [pre, q, post] -> [q, pre, post]; scatter the q rows into [s, pre, post]; transpose back
    pre = e.op("ReduceProd", e.op("Slice", shape, e.ints([0]), e.ints([axis])), keepdims=1)
    post_start = axis + 1 if axis != -1 else _INT64_MAX
    post = e.op("ReduceProd", e.op("Slice", shape, e.ints([post_start]), e.ints([_INT64_MAX])), keepdims=1)
    count = e.op("Reshape", e.op("Size", idx), e.ints([1]))
    dy3 = e.op("Reshape", dy, e.op("Concat", pre, count, post, axis=0))
    dyt = e.op("Transpose", dy3, perm=[1, 0, 2])
    zeros = e.zeros(e.op("Concat", e.op("Reshape", size, e.ints([1])), pre, post, axis=0), dy)
    index = e.op("Reshape", idx, e.ints([-1, 1]))
    scattered = e.op("ScatterND", zeros, index, dyt, reduction="add")
    back = e.op("Transpose", scattered, perm=[1, 0, 2])
    e.op("Reshape", back, shape, out=e.output(0))


@_lowers("GatherElementsGrad")
def _gather_elements_grad(e: _Emitter, node: NodeProto) -> None:
    dy, shape, indices = e.input(0), e.input(1), e.input(2)
    shape = e.int64(shape)
    axis = int(e.attr("axis", 0))
    e.op("ScatterElements", e.zeros(shape, dy), indices, dy, out=e.output(0), axis=axis, reduction="add")


@_lowers("GatherNDGrad")
def _gather_nd_grad(e: _Emitter, node: NodeProto) -> None:
    shape, indices, update = e.input(0), e.input(1), e.input(2)
    shape = e.int64(shape)
    batch_dims = int(e.attr("batch_dims", 0))
    indices = e.int64(indices)
    if batch_dims:
        rank = e.rank(node.input[1])
        if rank is None:
            raise e.error("batch_dims > 0 needs the rank of the indices, which the graph does not declare")
        # prepend each position's batch coordinates to its index tuple
        index_shape = e.op("Shape", indices, end=rank - 1)
        columns = []
        for dim in range(batch_dims):
            extent = e.op("Slice", e.op("Shape", indices), e.ints([dim]), e.ints([dim + 1]))
            steps = e.op("Range", e.const(np.int64(0)), e.op("Squeeze", extent, e.ints([0])), e.const(np.int64(1)))
            view = [1] * (rank - 1)
            view[dim] = -1
            column = e.op("Expand", e.op("Reshape", steps, e.ints(view)), index_shape)
            columns.append(e.op("Unsqueeze", column, e.ints([-1])))
        indices = e.op("Concat", *columns, indices, axis=-1)
    e.op("ScatterND", e.zeros(shape, update), indices, update, out=e.output(0), reduction="add")


@_lowers("SliceGrad")
def _slice_grad(e: _Emitter, node: NodeProto) -> None:
    dy, shape = e.input(0), e.input(1)
    shape = e.int64(shape)
    extra = [e.input(i) for i in range(2, 6)]
    # the flat positions the slice took, found by slicing a tensor of positions the same way
    count = e.op("ReduceProd", shape, keepdims=1)
    positions = e.op("Reshape", e.op("Range", e.const(np.int64(0)), e.op("Squeeze", count, e.ints([0])),
                                     e.const(np.int64(1))), shape)
    taken = e.op("Slice", positions, *extra)
    flat_zeros = e.zeros(count, dy)
    flat = e.op("ScatterElements", flat_zeros, e.op("Reshape", taken, e.ints([-1])),
                e.op("Reshape", dy, e.ints([-1])), axis=0)
    e.op("Reshape", flat, shape, out=e.output(0))


@_lowers("ConcatTraining")
def _concat_training(e: _Emitter, node: NodeProto) -> None:
    axis = int(e.attr("axis"))
    inputs = [name for name in node.input if name]
    e.op("Concat", *inputs, out=e.output(0), axis=axis)
    lengths = e.output(1)
    if lengths:
        end = axis + 1 if axis != -1 else None
        pieces = [e.op("Shape", name, start=axis, end=end) for name in inputs]
        e.op("Concat", *pieces, out=lengths, axis=0)


@_lowers("SplitTraining")
def _split_training(e: _Emitter, node: NodeProto) -> None:
    data, split = e.input(0), e.input(1)
    axis = int(e.attr("axis", 0))
    outputs = list(node.output)
    split_value = e.constant(split)
    if split is None or (split_value is not None and split_value.size == 0):
        if e.opset >= 18:
            e.op("Split", data, out=outputs, axis=axis, num_outputs=len(outputs))
        else:
            e.op("Split", data, out=outputs, axis=axis)
        return
    e.op("Split", data, e.int64(split), out=outputs, axis=axis)


# ---------------------------------------------------------------------------------------------
# element-wise arithmetic with broadcasting


def _sum_to_shape(e: _Emitter, grad: str, target: str, out: str) -> None:
    """`grad` summed over the axes along which a tensor of `target`'s shape was broadcast."""
    grad_shape, target_shape = e.shape(grad), e.shape(target)
    if grad_shape is not None and grad_shape == target_shape and None not in grad_shape:
        e.op("Identity", grad, out=out)
        return
    shape = e.op("Shape", target)
    axes = _broadcast_axes(e, shape, e.op("Shape", grad))
    summed = e.op("ReduceSum", grad, axes, keepdims=1, noop_with_empty_axes=1)
    e.op("Reshape", summed, shape, out=out)


def _padded_shape(e: _Emitter, shape: str, rank: str) -> str:
    """`shape` with ones in front up to `rank` entries."""
    missing = e.op("Sub", rank, e.op("Size", shape))
    ones = e.op("ConstantOfShape", e.op("Reshape", missing, e.ints([1])),
                value=numpy_helper.from_array(np.array([1], np.int64)))
    return e.op("Concat", ones, shape, axis=0)


def _broadcast_axes(e: _Emitter, shape: str, out_shape: str) -> str:
    """The axes of `out_shape` along which a tensor of `shape` (right-aligned) was broadcast."""
    rank = e.op("Size", out_shape)
    padded = _padded_shape(e, shape, rank)
    differs = e.op("Not", e.op("Equal", padded, out_shape))
    return e.op("Reshape", e.op("NonZero", differs), e.ints([-1]))


@_lowers("DivGrad")
def _div_grad(e: _Emitter, node: NodeProto) -> None:
    dy, a, b = e.input(0), e.input(1), e.input(2)
    da, db = e.output(0), e.output(1)
    if da:
        _sum_to_shape(e, e.op("Div", dy, b), a, da)
    if db:
        quotient = e.op("Div", e.op("Div", e.op("Mul", dy, a), b), b)
        _sum_to_shape(e, e.op("Neg", quotient), b, db)


@_lowers("BroadcastGradientArgs")
def _broadcast_gradient_args(e: _Emitter, node: NodeProto) -> None:
    a_shape = e.op("Cast", e.input(0), to=TensorProto.INT64)
    b_shape = e.op("Cast", e.input(1), to=TensorProto.INT64)
    rank = e.op("Max", e.op("Size", a_shape), e.op("Size", b_shape))
    pa, pb = _padded_shape(e, a_shape, rank), _padded_shape(e, b_shape, rank)
    positions = e.op("Range", e.const(np.int64(0)), rank, e.const(np.int64(1)))
    same = e.op("Equal", pa, pb)
    for shape, padded, out in ((a_shape, pa, e.output(0)), (b_shape, pb, e.output(1))):
        if not out:
            continue
        # the kernel lists an axis for an input when its dim is 1 and the other's is not, and
        # every leading axis the input lacks (whatever the other's dim there)
        lacking = e.op("Less", positions, e.op("Sub", rank, e.op("Size", shape)))
        stretched = e.op("And", e.op("Equal", padded, e.const(np.int64(1))), e.op("Not", same))
        broadcast = e.op("Or", lacking, stretched)
        axes = e.op("Compress", positions, broadcast, axis=0)
        # listed from the last axis to the first, as the kernel does
        e.op("Slice", axes, e.ints([-1]), e.ints([np.iinfo(np.int64).min]), e.ints([0]), e.ints([-1]), out=out)


@_lowers("ReduceSumTraining")
def _reduce_sum_training(e: _Emitter, node: NodeProto) -> None:
    e.op("ReduceSum", *[name for name in node.input], out=e.output(0),
         keepdims=int(e.attr("keepdims", 1)), noop_with_empty_axes=int(e.attr("noop_with_empty_axes", 0)))


@_lowers("Scale")
def _scale(e: _Emitter, node: NodeProto) -> None:
    data, factor = e.input(0), e.input(1)
    # the kernel reads the factor as float32 and scales down by its float32 reciprocal
    factor = e.op("Reshape", e.op("Cast", factor, to=TensorProto.FLOAT), e.ints([]))
    if int(e.attr("scale_down", 0)):
        factor = e.op("Reciprocal", factor)
    e.op("Mul", data, e.cast_like(factor, data), out=e.output(0))


@_lowers("ScaledSum")
def _scaled_sum(e: _Emitter, node: NodeProto) -> None:
    terms = []
    for index in range(3):
        name = e.input(index)
        if name is None:
            continue
        terms.append(e.op("Mul", name, e.scalar(float(e.attr(f"scale_{index}")), name)))
    total = terms[0]
    for term in terms[1:-1]:
        total = e.op("Add", total, term)
    e.op("Add", total, terms[-1], out=e.output(0))


@_lowers("BatchScale")
def _batch_scale(e: _Emitter, node: NodeProto) -> None:
    data = e.input(0)
    for index in range(len(node.output)):
        if e.output(index):
            e.op("Mul", data, e.scalar(float(e.attr(f"scale_{index}")), data), out=e.output(index))


# ---------------------------------------------------------------------------------------------
# normalizations


def _layer_norm_backward(e: _Emitter, dy: str, x_hat: str, scale: str, inv_std: str, centered: bool) -> None:
    """X_grad (and scale_grad, bias_grad when asked) of a layer norm at axis, given x_hat."""
    axis = int(e.attr("axis", -1))
    axes = e.axes_from(axis, x_hat)
    outer = e.axes_before(axis, x_hat)
    count = e.count_over(x_hat, axes)
    b = e.op("Mul", e.op("Mul", dy, scale), inv_std)
    c_mean = e.op("Div", e.reduce_sum(e.op("Mul", b, x_hat), axes, keepdims=1), count)
    dx = e.op("Sub", b, e.op("Mul", x_hat, c_mean))
    if centered:
        b_mean = e.op("Div", e.reduce_sum(b, axes, keepdims=1), count)
        dx = e.op("Sub", dx, b_mean)
    outputs = [e.output(0), e.output(1), e.output(2) if centered else None]
    results = [dx, None, None]
    if outputs[1]:
        results[1] = e.op("ReduceSum", e.op("Mul", dy, x_hat), outer, keepdims=0, noop_with_empty_axes=1)
    if outputs[2]:
        results[2] = e.op("ReduceSum", dy, outer, keepdims=0, noop_with_empty_axes=1)
    targets = [e.input(1), e.input(2), e.input(2)]
    for out, result, like in zip(outputs, results, targets):
        if out:
            e.cast_like(result, like, out=out)


def _in_u(e: _Emitter, name: str) -> str:
    """`name` in float32 when it is float16/bfloat16 (the kernels compute in float32)."""
    return e.cast_to(name, TensorProto.FLOAT) if e.elem_type(name) in _NARROW_FLOATS else name


@_lowers("LayerNormalizationGrad")
def _layer_norm_grad(e: _Emitter, node: NodeProto) -> None:
    dy, x, scale, mean, inv_std = (_in_u(e, e.input(i)) for i in range(5))
    x_hat = e.op("Mul", e.op("Sub", x, mean), inv_std)
    _layer_norm_backward(e, dy, x_hat, scale, inv_std, centered=True)


@_lowers("SimplifiedLayerNormalizationGrad")
def _simplified_layer_norm_grad(e: _Emitter, node: NodeProto) -> None:
    dy, x, scale, inv_std = (_in_u(e, e.input(i)) for i in range(4))
    x_hat = e.op("Mul", x, inv_std)
    _layer_norm_backward(e, dy, x_hat, scale, inv_std, centered=False)


@_lowers("InvertibleLayerNormalizationGrad")
def _invertible_layer_norm_grad(e: _Emitter, node: NodeProto) -> None:
    dy, y, scale, bias, inv_std = (_in_u(e, e.input(i)) for i in range(5))
    x_hat = e.op("Div", e.op("Sub", y, bias), scale)
    _layer_norm_backward(e, dy, x_hat, scale, inv_std, centered=True)


def _per_channel(e: _Emitter, vector: str, like: str) -> str:
    """A [C] vector reshaped to [1, C, 1, ...] to broadcast over `like` (N, C, spatial...)."""
    rank = e.rank(like)
    if rank is not None:
        return e.op("Reshape", vector, e.ints([1, -1] + [1] * (rank - 2)))
    ones = e.op("ConstantOfShape", e.op("Shape", e.op("Shape", like, start=2)),
                value=numpy_helper.from_array(np.array([1], np.int64)))
    return e.op("Reshape", vector, e.op("Concat", e.ints([1, -1]), ones, axis=0))


@_lowers("BatchNormInternal")
def _batch_norm_internal(e: _Emitter, node: NodeProto) -> None:
    x, scale, bias, running_mean, running_var = (e.input(i) for i in range(5))
    epsilon = float(e.attr("epsilon", 1e-5))
    momentum = float(e.attr("momentum", 0.9))
    if not int(e.attr("training_mode", 1)):
        e.op("BatchNormalization", x, scale, bias, running_mean, running_var, out=e.output(0), epsilon=epsilon)
        return
    axes = e.channel_axes(x)
    xu = _in_u(e, x)
    count = e.count_over(xu, axes)
    mean = e.op("Div", e.reduce_sum(xu, axes, keepdims=1), count)
    centered = e.op("Sub", xu, mean)
    var = e.op("Div", e.reduce_sum(e.op("Mul", centered, centered), axes, keepdims=1), count)
    inv_std = e.op("Reciprocal", e.op("Sqrt", e.op("Add", var, e.scalar(epsilon, var))))
    normalized = e.op("Mul", centered, inv_std)
    y = e.op("Add", e.op("Mul", normalized, _per_channel(e, _in_u(e, scale), x)), _per_channel(e, _in_u(e, bias), x))
    e.op("CastLike", y, x, out=e.output(0))
    flat_mean = e.op("Reshape", mean, e.ints([-1]))
    flat_var = e.op("Reshape", var, e.ints([-1]))
    for out, running, batch in ((e.output(1), running_mean, flat_mean), (e.output(2), running_var, flat_var)):
        if out:
            kept = e.op("Mul", running, e.scalar(momentum, running))
            fresh = e.op("Mul", e.op("CastLike", batch, running), e.scalar(1.0 - momentum, running))
            e.op("Add", kept, fresh, out=out)
    if e.output(3):
        e.op("CastLike", flat_mean, running_mean, out=e.output(3))
    if e.output(4):
        e.op("CastLike", e.op("Reshape", inv_std, e.ints([-1])), running_var, out=e.output(4))


@_lowers("BatchNormalizationGrad")
def _batch_norm_grad(e: _Emitter, node: NodeProto) -> None:
    dy, x, scale, saved_mean, saved_inv_std = (e.input(i) for i in range(5))
    axes = e.channel_axes(x)
    dyu, xu = _in_u(e, dy), _in_u(e, x)
    mean = _per_channel(e, _in_u(e, saved_mean), x)
    inv_std = _per_channel(e, _in_u(e, saved_inv_std), x)
    x_hat = e.op("Mul", e.op("Sub", xu, mean), inv_std)
    d_bias = e.reduce_sum(dyu, axes, keepdims=0)
    d_scale = e.reduce_sum(e.op("Mul", dyu, x_hat), axes, keepdims=0)
    if e.output(0):
        count = e.count_over(xu, axes)
        inner = e.op("Sub", e.op("Sub", e.op("Mul", dyu, count), _per_channel(e, d_bias, x)),
                     e.op("Mul", x_hat, _per_channel(e, d_scale, x)))
        factor = e.op("Div", e.op("Mul", _per_channel(e, _in_u(e, scale), x), inv_std), count)
        e.op("CastLike", e.op("Mul", factor, inner), x, out=e.output(0))
    if e.output(1):
        e.op("CastLike", d_scale, scale, out=e.output(1))
    if e.output(2):
        e.op("CastLike", d_bias, scale, out=e.output(2))


# ---------------------------------------------------------------------------------------------
# convolution and pooling


def _spatial_rank(e: _Emitter, *names: str | None) -> int:
    kernel = e.attr("kernel_shape")
    if kernel:
        return len(kernel)
    rank = e.rank(*names)
    if rank is None:
        raise e.error("the number of spatial dimensions is unknown (no kernel_shape attribute and no "
                      "declared rank); declare the input's shape in the graph")
    return rank - 2


def _explicit_pads(e: _Emitter, spatial: int) -> list[int]:
    auto_pad = e.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        raise e.error(f"auto_pad={auto_pad!r} is not lowered; export the convolution with explicit pads")
    pads = list(e.attr("pads", [0] * (2 * spatial)))
    return [0] * (2 * spatial) if auto_pad == "VALID" else pads


def _fit_to_shape(e: _Emitter, value: str, target: str, out: str, leading: int = 0) -> None:
    """`value` cut or padded with zeros at the end of each spatial axis to the shape of `target`
    (input rows no window reached have a zero gradient); the first `leading` axes are kept."""
    target_shape = e.op("Shape", target)
    if leading:
        target_shape = e.op("Concat", e.op("Shape", value, end=leading),
                            e.op("Slice", target_shape, e.ints([leading]), e.ints([_INT64_MAX])), axis=0)
    rank = e.op("Shape", target_shape)
    zeros = e.op("ConstantOfShape", rank, value=numpy_helper.from_array(np.array([0], np.int64)))
    cut = e.op("Slice", value, zeros, target_shape)
    missing = e.op("Sub", target_shape, e.op("Shape", cut))
    e.op("Pad", cut, e.op("Concat", zeros, missing, axis=0), out=out)


def _begin_pads(pads: list[int]) -> list[int]:
    """ConvTranspose pads that crop only the leading padding: the trailing padding the forward
    used partly or not at all is cut by :func:`_fit_to_shape` instead."""
    spatial = len(pads) // 2
    return pads[:spatial] + [0] * spatial


@_lowers("ConvGrad")
def _conv_grad(e: _Emitter, node: NodeProto) -> None:
    dy, x, w = e.input(0), e.input(1), e.input(2)
    spatial = _spatial_rank(e, x, w, dy)
    strides = list(e.attr("strides", [1] * spatial))
    dilations = list(e.attr("dilations", [1] * spatial))
    group = int(e.attr("group", 1))
    pads = _explicit_pads(e, spatial)
    kernel = e.attr("kernel_shape")
    dx, dw, db = e.output(0), e.output(1), e.output(2)
    if db:
        e.reduce_sum(dy, e.ints([0, *range(2, spatial + 2)]), keepdims=0, out=db)
    if dx:
        partial = e.op("ConvTranspose", dy, w, strides=strides, pads=_begin_pads(pads), dilations=dilations,
                       group=group)
        _fit_to_shape(e, partial, x, dx)
    if dw:
        moved = [1, 0, *range(2, spatial + 2)]
        if group == 1:
            xt = e.op("Transpose", x, perm=moved)                    # [Cin, N, spatial]
            dyt = e.op("Transpose", dy, perm=moved)                  # [Cout, N, out spatial]
        else:
            # batch = input channel within its group, channels = (group, sample)
            grouped = e.op("Concat", e.op("Shape", x, end=1), e.ints([group, -1]), e.op("Shape", x, start=2), axis=0)
            x5 = e.op("Transpose", e.op("Reshape", x, grouped), perm=[2, 1, 0, *range(3, spatial + 3)])
            xt = e.op("Reshape", x5, e.op("Concat", e.ints([0, -1]), e.op("Shape", x, start=2), axis=0))
            dgrouped = e.op("Concat", e.op("Shape", dy, end=1), e.ints([group, -1]), e.op("Shape", dy, start=2),
                            axis=0)
            dy5 = e.op("Transpose", e.op("Reshape", dy, dgrouped), perm=[1, 2, 0, *range(3, spatial + 3)])
            dyt = e.op("Reshape", dy5, e.op("Concat", e.ints([-1]), e.op("Shape", dy, end=1), e.op("Shape", dy, start=2),
                                             axis=0))
        correlated = e.op("Conv", xt, dyt, strides=dilations, dilations=strides, pads=pads, group=group)
        full = e.op("Transpose", correlated, perm=moved)             # [Cout, Cin/group, >= kernel]
        if kernel:
            ends = e.ints(list(kernel))
        else:
            ends = e.op("Shape", w, start=2)
        e.op("Slice", full, e.ints([0] * spatial), ends, e.ints(range(2, spatial + 2)), out=dw)


def _input_shape_of_pool(e: _Emitter, what: str) -> str:
    """The shape of the pooled input, read from the forward pool node (through its index
    output for MaxPool) or from the gradient's declared static shape."""
    node = e.node
    if node.op_type == "MaxPoolGrad" and e.input(1):
        found = e.producer(node.input[1])
        if found is not None and found[0].op_type == "MaxPool" and found[1] == 1:
            pool = found[0]
            for attribute in pool.attribute:
                if attribute.name == "storage_order" and attribute.i != 0:
                    raise e.error("MaxPool with storage_order=1 (column-major indices) is not lowered")
            return e.op("Shape", pool.input[0])
    out = e.output(0)
    shape = e.shape(out) if out else None
    if shape is not None and None not in shape:
        return e.ints(shape)
    raise e.error(f"the shape of the pooled input is unknown ({what}); declare the gradient's shape")


@_lowers("MaxPoolGrad", domain="")
def _max_pool_grad(e: _Emitter, node: NodeProto) -> None:
    dy, indices = e.input(0), e.input(1)
    shape = _input_shape_of_pool(e, "no MaxPool producing the indices was found")
    count = e.op("ReduceProd", shape, keepdims=1)
    flat = e.op("ScatterElements", e.zeros(count, dy), e.op("Reshape", indices, e.ints([-1])),
                e.op("Reshape", dy, e.ints([-1])), axis=0, reduction="add")
    e.op("Reshape", flat, shape, out=e.output(0))


def _average_pool_backward(e: _Emitter, dy: str, input_shape: str, kernel: list[int], strides: list[int],
                           pads: list[int], count_include_pad: bool, out: str) -> None:
    """Each output gradient spread evenly over its window, one (n, c) plane at a time."""
    spatial_shape = e.op("Slice", input_shape, e.ints([2]), e.ints([_INT64_MAX]))
    window = e.op("CastLike", e.const(np.ones([1, 1, *kernel], dtype=np.float32)), dy)
    if count_include_pad:
        divisor = e.scalar(float(np.prod(kernel)), dy)
    else:
        # the number of input elements (pads excluded) in each window
        ones = e.op("Expand", e.scalar(1, dy), e.op("Concat", e.ints([1, 1]), spatial_shape, axis=0))
        divisor = e.op("Conv", ones, window, strides=strides, pads=pads)
    scaled = e.op("Div", dy, divisor)
    planes = e.op("Reshape", scaled, e.op("Concat", e.ints([-1, 1]), e.op("Shape", dy, start=2), axis=0))
    spread = e.op("ConvTranspose", planes, window, strides=strides, pads=_begin_pads(pads))
    target = e.zeros(e.op("Concat", e.ints([1, 1]), spatial_shape, axis=0), dy)
    full = e.names.fresh(f"{e.stem}/full")
    _fit_to_shape(e, spread, target, full, leading=2)
    e.op("Reshape", full, input_shape, out=out)


@_lowers("AveragePoolGrad", domain="")
def _average_pool_grad(e: _Emitter, node: NodeProto) -> None:
    kernel = list(e.attr("kernel_shape"))
    spatial = len(kernel)
    strides = list(e.attr("strides", [1] * spatial))
    pads = _explicit_pads(e, spatial)
    shape = _input_shape_of_pool(e, "AveragePoolGrad does not receive it")
    _average_pool_backward(e, e.input(0), shape, kernel, strides, pads, bool(e.attr("count_include_pad", 0)),
                           e.output(0))


# ---------------------------------------------------------------------------------------------
# losses


def _ignored_labels(e: _Emitter, label: str, ignore_index: str | None) -> tuple[str | None, str]:
    """(where the label is ignored, or None; the labels with ignored ones replaced by 0), int64."""
    label = e.int64(label)
    if ignore_index is None:
        return None, label
    value = e.constant(ignore_index)
    if value is not None:
        target = e.const(np.int64(np.asarray(value).reshape(-1)[0]))
    else:
        target = e.op("Reshape", e.int64(ignore_index), e.ints([]))
    ignored = e.op("Equal", label, target)
    return ignored, e.op("Where", ignored, e.const(np.int64(0)), label)


def _sample_weights(e: _Emitter, weight: str | None, ignored: str | None, safe_label: str, like: str) -> str:
    """Each sample's weight (weight[label], or 1), 0 where its label is ignored, in `like`'s type."""
    if weight:
        w = e.op("Gather", e.cast_like(weight, like), safe_label, axis=0)
    else:
        w = e.op("Expand", e.scalar(1, like), e.op("Shape", safe_label))
    if ignored is not None:
        w = e.op("Where", ignored, e.scalar(0, like), w)
    return w


def _nll(e: _Emitter, log_prob: str, label: str, weight: str | None, ignore_index: str | None,
         reduction: str) -> str:
    """The negative log-likelihood loss of `log_prob` [N, C, D...] at `label` [N, D...]."""
    ignore_value = e.constant(ignore_index)
    if ignore_index is None or ignore_value is not None:
        # ONNX's own operator when ignore_index is a constant
        constant = None if ignore_value is None else int(np.asarray(ignore_value).reshape(-1)[0])
        return e.op("NegativeLogLikelihoodLoss", log_prob, label, weight, reduction=reduction,
                    ignore_index=constant)
    ignored, safe_label = _ignored_labels(e, label, ignore_index)
    picked = e.op("Squeeze", e.op("GatherElements", log_prob, e.op("Unsqueeze", safe_label, e.ints([1])), axis=1),
                  e.ints([1]))
    w = _sample_weights(e, weight, ignored, safe_label, log_prob)
    losses = e.op("Neg", e.op("Mul", picked, w))
    if reduction == "none":
        return losses
    total = e.op("ReduceSum", losses, keepdims=0)
    if reduction == "sum":
        return total
    return e.op("Div", total, e.op("ReduceSum", w, keepdims=0))


def _wider(first: int, second: int) -> int:
    return max((first, second), key=lambda t: np.dtype(helper.tensor_dtype_to_np_dtype(t)).itemsize)


@_lowers("SoftmaxCrossEntropyLossInternal")
def _sce_loss_internal(e: _Emitter, node: NodeProto) -> None:
    scores, labels, weights, ignore_index = e.input(0), e.input(1), e.input(2), e.input(3)
    output_type = e.attr("output_type")
    scores_type = e.elem_type(scores)
    reduction = e.attr("reduction", "mean")
    cast_back = bool(output_type) and output_type != scores_type
    if cast_back:
        if scores_type is None:
            raise e.error("output_type is set but the element type of the scores is not declared")
        wide = _wider(scores_type, output_type)       # computed in the wider type
        if wide != scores_type:
            scores = e.cast_to(scores, wide)
            weights = e.cast_to(weights, wide) if weights else None
    log_prob = e.op("LogSoftmax", scores, axis=1)
    loss = _nll(e, log_prob, labels, weights, ignore_index, reduction)
    for out, value in ((e.output(0), loss), (e.output(1), log_prob)):
        if not out:
            continue
        if cast_back:
            e.op("Cast", value, out=out, to=output_type)
        else:
            e.write(value, out)


@_lowers("NegativeLogLikelihoodLossInternal", "NegativeLogLikelihoodLossInternal2")
def _nll_loss_internal(e: _Emitter, node: NodeProto) -> None:
    loss = _nll(e, e.input(0), e.input(1), e.input(2), e.input(3), e.attr("reduction", "mean"))
    e.write(loss, e.output(0))


@_lowers("SoftmaxCrossEntropyLossInternalGrad", "SoftmaxCrossEntropyLossGrad")
def _sce_loss_internal_grad(e: _Emitter, node: NodeProto) -> None:
    dy, log_prob, label, weight = e.input(0), e.input(1), e.input(2), e.input(3)
    if node.op_type == "SoftmaxCrossEntropyLossGrad":       # the older form: ignore_index attribute
        attribute = e.attr("ignore_index")
        ignore_index = None if attribute is None else e.const(np.int64(attribute))
        bias = None
    else:
        ignore_index, bias = e.input(4), e.input(5)
    reduction = e.attr("reduction", "mean")
    output_type = e.attr("output_type")
    lp = log_prob
    lp_type = e.elem_type(log_prob)
    if output_type and lp_type and output_type != lp_type:
        wide = _wider(lp_type, output_type)
        if wide != lp_type:
            lp = e.cast_to(lp, wide)
    ignored, safe_label = _ignored_labels(e, label, ignore_index)
    dyu = e.cast_like(dy, lp)
    w = _sample_weights(e, weight, ignored, safe_label, lp)
    if reduction == "mean":
        d_loss = e.op("Div", e.op("Mul", dyu, w), e.op("ReduceSum", w, keepdims=0))
    else:
        d_loss = e.op("Mul", dyu, w)
    # one-hot of the labels along axis 1: classes shaped [C, 1, ..., 1] against labels [N, 1, D...]
    classes = e.op("Range", e.const(np.int64(0)), e.op("Squeeze", e.op("Shape", lp, start=1, end=2), e.ints([0])),
                   e.const(np.int64(1)))
    trailing = e.op("ConstantOfShape", e.op("Shape", e.op("Shape", safe_label, start=1)),
                    value=numpy_helper.from_array(np.array([1], np.int64)))
    column = e.op("Reshape", classes, e.op("Concat", e.ints([-1]), trailing, axis=0))
    one_hot = e.op("CastLike", e.op("Equal", column, e.op("Unsqueeze", safe_label, e.ints([1]))), lp)
    grad = e.op("Mul", e.op("Unsqueeze", d_loss, e.ints([1])), e.op("Sub", e.op("Exp", lp), one_hot))
    if bias:
        grad = e.op("Add", grad, e.cast_like(bias, grad))
    target_type = output_type or lp_type
    if target_type:
        if target_type == e.elem_type(lp):
            e.write(grad, e.output(0))
        else:
            e.op("Cast", grad, out=e.output(0), to=target_type)
    else:
        e.op("CastLike", grad, log_prob, out=e.output(0))


# ---------------------------------------------------------------------------------------------
# ATen operators that ORTModule's exporter writes


def _aten_flag(e: _Emitter, index: int, default: int = 0) -> int:
    name = e.input(index)
    if name is None:
        return default
    value = e.constant(name)
    if value is None:
        raise e.error(f"input {index} of ATen {e.attr('operator')!r} must be a constant")
    return int(np.asarray(value).reshape(-1)[0])


def _aten_ints(e: _Emitter, index: int, default: list[int]) -> list[int]:
    name = e.input(index)
    if name is None:
        return default
    value = e.constant(name)
    if value is None:
        raise e.error(f"input {index} of ATen {e.attr('operator')!r} must be a constant")
    return [int(v) for v in np.asarray(value).reshape(-1)]


@_lowers_aten("embedding")
def _aten_embedding(e: _Emitter, node: NodeProto) -> None:
    weight, indices = e.input(0), e.input(1)
    e.op("Gather", weight, indices, out=e.output(0), axis=0)


@_lowers_aten("embedding_backward")
def _aten_embedding_backward(e: _Emitter, node: NodeProto) -> None:
    grad, indices, num_weights = e.input(0), e.input(1), e.input(2)
    padding_idx = _aten_flag(e, 3, -1)
    scale_by_frequency = _aten_flag(e, 4, 0)
    indices = e.int64(indices)
    rows = e.op("Reshape", e.int64(num_weights), e.ints([1]))
    width = e.op("Shape", grad, start=-1)
    flat_index = e.op("Reshape", indices, e.ints([-1, 1]))
    flat_grad = e.op("Reshape", grad, e.op("Concat", e.ints([-1]), width, axis=0))
    if padding_idx >= 0:
        keep = e.op("Not", e.op("Equal", flat_index, e.const(np.int64(padding_idx))))
        flat_grad = e.op("Where", keep, flat_grad, e.scalar(0, grad))
    if scale_by_frequency:
        ones = e.op("Expand", e.scalar(1, grad), e.op("Shape", flat_index))
        counts = e.op("ScatterND", e.zeros(e.op("Concat", rows, e.ints([1]), axis=0), grad), flat_index, ones,
                      reduction="add")
        flat_grad = e.op("Div", flat_grad, e.op("GatherND", counts, flat_index))
    table = e.zeros(e.op("Concat", rows, width, axis=0), grad)
    e.op("ScatterND", table, flat_index, flat_grad, out=e.output(0), reduction="add")


def _pool_arguments(e: _Emitter, first: int, defaults_stride_from_kernel: bool = True):
    kernel = _aten_ints(e, first, [])
    strides = _aten_ints(e, first + 1, []) or list(kernel)
    padding = _aten_ints(e, first + 2, [0] * len(kernel))
    if len(padding) == 1:
        padding = padding * len(kernel)
    if len(strides) == 1:
        strides = strides * len(kernel)
    if len(kernel) == 1:
        kernel = kernel * 2
        strides = strides if len(strides) == 2 else strides * 2
        padding = padding if len(padding) == 2 else padding * 2
    return kernel, strides, padding + padding


@_lowers_aten("max_pool2d_with_indices")
def _aten_max_pool2d(e: _Emitter, node: NodeProto) -> None:
    x = e.input(0)
    kernel, strides, pads = _pool_arguments(e, 1)
    dilation = _aten_ints(e, 4, [1, 1])
    dilation = dilation * 2 if len(dilation) == 1 else dilation
    ceil_mode = _aten_flag(e, 5, 0)
    values = e.output(0) or e.names.fresh(f"{e.stem}/values")
    onnx_indices = e.names.fresh(f"{e.stem}/onnx_indices")
    e.op("MaxPool", x, out=[values, onnx_indices], kernel_shape=kernel, strides=strides, pads=pads,
         dilations=dilation, ceil_mode=ceil_mode)
    if e.output(1):
        # ONNX indices run over the whole NCHW tensor, ATen's within each (n, c) plane
        plane = e.op("ReduceProd", e.op("Shape", x, start=2), keepdims=0)
        e.op("Mod", onnx_indices, plane, out=e.output(1))


@_lowers_aten("max_pool2d_with_indices_backward")
def _aten_max_pool2d_backward(e: _Emitter, node: NodeProto) -> None:
    grad, x, indices = e.input(0), e.input(1), e.input(7)
    if indices is None:
        raise e.error("the indices input (7) is missing")
    # ATen's indices run within each (n, c) plane: scatter into [N, C, H*W]
    planes = e.op("Concat", e.op("Shape", grad, end=2), e.ints([-1]), axis=0)
    flat_grad = e.op("Reshape", grad, planes)
    flat_index = e.op("Reshape", e.int64(indices), planes)
    plane_size = e.op("ReduceProd", e.op("Shape", x, start=2), keepdims=1)
    zeros = e.zeros(e.op("Concat", e.op("Shape", x, end=2), plane_size, axis=0), grad)
    scattered = e.op("ScatterElements", zeros, flat_index, flat_grad, axis=2, reduction="add")
    e.op("Reshape", scattered, e.op("Shape", x), out=e.output(0))


@_lowers_aten("avg_pool2d")
def _aten_avg_pool2d(e: _Emitter, node: NodeProto) -> None:
    x = e.input(0)
    kernel, strides, pads = _pool_arguments(e, 1)
    ceil_mode = _aten_flag(e, 4, 0)
    count_include_pad = _aten_flag(e, 5, 1)
    if e.input(6) is not None:
        raise e.error("divisor_override is not lowered")
    e.op("AveragePool", x, out=e.output(0), kernel_shape=kernel, strides=strides, pads=pads,
         ceil_mode=ceil_mode, count_include_pad=count_include_pad)


@_lowers_aten("avg_pool2d_backward")
def _aten_avg_pool2d_backward(e: _Emitter, node: NodeProto) -> None:
    grad, x = e.input(0), e.input(1)
    kernel, strides, pads = _pool_arguments(e, 2)
    if _aten_flag(e, 5, 0):
        raise e.error("ceil_mode is not lowered for the average pool gradient")
    count_include_pad = bool(_aten_flag(e, 6, 1))
    if e.input(7) is not None:
        raise e.error("divisor_override is not lowered")
    _average_pool_backward(e, grad, e.op("Shape", x), kernel, strides, pads, count_include_pad, e.output(0))


def _adaptive_pool_matrix(e: _Emitter, size: str, bins: str) -> str:
    """The [bins, size] matrix averaging each adaptive-pooling bin: bin i covers
    [floor(i*size/bins), ceil((i+1)*size/bins)) (int64 scalars in, float32 matrix out)."""
    one = e.const(np.int64(1))
    index = e.op("Range", e.const(np.int64(0)), bins, one)
    start = e.op("Div", e.op("Mul", index, size), bins)
    stop = e.op("Div", e.op("Sub", e.op("Add", e.op("Mul", e.op("Add", index, one), size), bins), one), bins)
    position = e.op("Range", e.const(np.int64(0)), size, one)
    column = e.ints([-1, 1])
    inside = e.op("And", e.op("GreaterOrEqual", position, e.op("Reshape", start, column)),
                  e.op("Less", position, e.op("Reshape", stop, column)))
    width = e.op("Cast", e.op("Reshape", e.op("Sub", stop, start), column), to=TensorProto.FLOAT)
    return e.op("Div", e.op("Cast", inside, to=TensorProto.FLOAT), width)


def _dim(e: _Emitter, value: str, axis: int) -> str:
    return e.op("Squeeze", e.op("Shape", value, start=axis, end=axis + 1), e.ints([0]))


def _adaptive_matrices(e: _Emitter, x: str, pooled_h: str, pooled_w: str, like: str) -> tuple[str, str]:
    rows = e.cast_like(_adaptive_pool_matrix(e, _dim(e, x, 2), pooled_h), like)
    cols = e.cast_like(_adaptive_pool_matrix(e, _dim(e, x, 3), pooled_w), like)
    return rows, cols


@_lowers_aten("_adaptive_avg_pool2d")
def _aten_adaptive_avg_pool2d(e: _Emitter, node: NodeProto) -> None:
    x = e.input(0)
    size = _aten_ints(e, 1, [])
    if len(size) == 1:
        size = size * 2
    if size == [1, 1]:
        e.op("GlobalAveragePool", x, out=e.output(0))
        return
    if len(size) != 2:
        raise e.error(f"output_size {size} is not two sizes")
    # Y = P_h @ X @ P_w^T with P the bin-averaging matrices (bins may overlap)
    rows, cols = _adaptive_matrices(e, x, e.const(np.int64(size[0])), e.const(np.int64(size[1])), x)
    e.op("MatMul", e.op("MatMul", rows, x), e.op("Transpose", cols, perm=[1, 0]), out=e.output(0))


@_lowers_aten("_adaptive_avg_pool2d_backward")
def _aten_adaptive_avg_pool2d_backward(e: _Emitter, node: NodeProto) -> None:
    grad, x = e.input(0), e.input(1)
    shape = e.shape(grad)
    if shape is not None and len(shape) == 4 and shape[2:] == [1, 1]:
        plane = e.op("CastLike", e.op("ReduceProd", e.op("Shape", x, start=2), keepdims=0), grad)
        e.op("Expand", e.op("Div", grad, plane), e.op("Shape", x), out=e.output(0))
        return
    # dX = P_h^T @ dY @ P_w, the bins read from the gradient's own shape
    rows, cols = _adaptive_matrices(e, x, _dim(e, grad, 2), _dim(e, grad, 3), grad)
    e.op("MatMul", e.op("MatMul", e.op("Transpose", rows, perm=[1, 0]), grad), cols, out=e.output(0))
