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
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, helper

from .._onnx_graph import NameAllocator, all_value_names, constant_values, load_model, node_subgraphs
from ..errors import TrainingGraphError, UnsupportedTrainingOpError
from . import activations, aten, convolution, losses, normalization, tensors  # noqa: F401  (they register)
from ._emitter import Emitter
from ._registry import (
    ATEN_LOWERINGS, LOWERINGS, MIN_OPSET, MS_DOMAIN, REFUSED, Lowering, domain_of, is_aten, is_training_only,
    training_attribute,
)

__all__ = [
    "lower_training_ops",
    "needs_lowering",
    "lowered_operators",
    "UnsupportedTrainingOpError",
]


def lowered_operators() -> list[str]:
    """The operators :func:`lower_training_ops` rewrites, as ``domain:op_type`` (ATen operators
    as ``ATen:<operator>``), sorted."""
    names = [f"{domain or 'ai.onnx'}:{op}" for domain, op in LOWERINGS]
    names += [f"ATen:{name}" for name in ATEN_LOWERINGS]
    return sorted(names)


def needs_lowering(model: ModelProto | bytes | str | os.PathLike) -> bool:
    """Whether ``model`` holds a training-only operator or a training-only attribute."""
    proto = load_model(model)
    for graph in _graphs(proto.graph):
        for node in graph.node:
            if is_training_only(node) or any(training_attribute(a) for a in node.attribute):
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
        if any(domain_of(n) == MS_DOMAIN for g in _graphs(result.graph) for n in g.node):
            result.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return result


def _default_opset(model: ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 1


# Stock operators (of onnxruntime's contrib domains) that ONNX's shape inference does not know:
# the element type of each output, "in0" for that of input 0, an int for a TensorProto type, or
# ("stash_type", default) for the type the attribute names. Training graphs keep such outputs
# as values the backward reads, and the split must know their types.
_IN0 = "in0"
_STASH = ("stash_type", TensorProto.FLOAT)
_STOCK_OUTPUT_TYPES: dict[tuple[str, str], tuple] = {
    ("", "SimplifiedLayerNormalization"): (_IN0, _STASH),
    (MS_DOMAIN, "SkipLayerNormalization"): (_IN0, TensorProto.FLOAT, TensorProto.FLOAT, _IN0),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): (_IN0, TensorProto.FLOAT, TensorProto.FLOAT, _IN0),
    (MS_DOMAIN, "BiasDropout"): (_IN0, TensorProto.BOOL),
    (MS_DOMAIN, "BitmaskDropout"): (_IN0, TensorProto.UINT32),
    (MS_DOMAIN, "BitmaskBiasDropout"): (_IN0, TensorProto.UINT32),
    **{(MS_DOMAIN, op): (_IN0,) for op in ("FusedMatMul", "FusedGemm", "FusedConv", "Gelu", "FastGelu",
                                          "BiasGelu", "QuickGelu", "BiasSoftmax", "TransposeMatMul")},
}


def _collect_types(model: ModelProto) -> dict[str, TypeProto]:
    """Every value type the model declares or onnx can infer, completed with the output types
    of the stock contrib operators onnx does not know (added to the model's value_info too)."""
    types: dict[str, TypeProto] = {}
    for graph in _graphs(model.graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.WhichOneof("value") is not None:
                types.setdefault(value.name, value.type)
        for init in graph.initializer:
            types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    for _ in range(4):           # each round lets inference run past the outputs typed in the last
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # inference is only a help: lowerings fall back to run-time shapes
            break
        for graph in _graphs(inferred.graph):
            for value in graph.value_info:
                if value.type.WhichOneof("value") is not None and value.name not in types:
                    types[value.name] = value.type
        if not _type_stock_outputs(model, types):
            break
    return types


def _type_stock_outputs(model: ModelProto, types: dict[str, TypeProto]) -> bool:
    """Declare the element types of stock contrib outputs that nothing types yet; whether any was."""
    added = False
    for node in model.graph.node:
        rule = _STOCK_OUTPUT_TYPES.get((domain_of(node), node.op_type))
        if rule is None:
            continue
        for name, kind in zip(node.output, rule):
            if not name or name in types:
                continue
            if kind == _IN0:
                source = types.get(node.input[0]) if node.input else None
                if source is None or not source.HasField("tensor_type"):
                    continue
                elem = source.tensor_type.elem_type
            elif isinstance(kind, tuple):
                elem = next((a.i for a in node.attribute if a.name == kind[0]), kind[1])
            else:
                elem = kind
            value = helper.make_tensor_value_info(name, elem, None)
            model.graph.value_info.append(value)
            types[name] = value.type
            added = True
    return added


def _lower_graph(graph: GraphProto, opset: int, types: dict[str, TypeProto],
                 outer_constants: dict[str, np.ndarray], names: NameAllocator) -> None:
    constants = constant_values(graph, outer_constants)
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
            if is_training_only(node):
                _refuse(node)
            _strip_training_attributes(node)
            rewritten.append(node)
            continue
        if opset < MIN_OPSET:
            raise TrainingGraphError(
                f"node {node.name!r} ({node.domain or 'ai.onnx'}:{node.op_type}) needs lowering, which "
                f"needs a default opset of at least {MIN_OPSET}; the model imports opset {opset} "
                "(export it with opset 17, as ORTModule does)")
        emitter = Emitter(node, opset, types, constants, producers, names)
        lowering(emitter, node)
        rewritten.extend(emitter.nodes)
    del graph.node[:]
    graph.node.extend(rewritten)


def _lowering_for(node: NodeProto) -> Lowering | None:
    if is_aten(node):
        operator = _string_attribute(node, "operator")
        lowering = ATEN_LOWERINGS.get(operator or "")
        if lowering is None:
            raise UnsupportedTrainingOpError(
                f"node {node.name!r} is ATen operator {operator!r} (overload "
                f"{_string_attribute(node, 'overload_name')!r}), which ortagent cannot lower to ONNX "
                f"operators; lowered ATen operators: {sorted(ATEN_LOWERINGS)}. Export the module so "
                "that this operation is written with standard ONNX operators",
                node_name=node.name, op_type=f"ATen:{operator}")
        return lowering
    return LOWERINGS.get((domain_of(node), node.op_type))


def _refuse(node: NodeProto) -> None:
    advice = REFUSED.get(node.op_type, "ortagent has no lowering for it; build the graph without it "
                                        "or open an issue with the model")
    raise UnsupportedTrainingOpError(
        f"node {node.name!r} is {node.domain or 'ai.onnx'}:{node.op_type}, a training-only operator "
        f"that stock onnxruntime cannot run and ortagent does not lower: {advice}",
        node_name=node.name, op_type=node.op_type)


def _strip_training_attributes(node: NodeProto) -> None:
    kept = [a for a in node.attribute if not training_attribute(a)]
    if len(kept) != len(node.attribute):
        del node.attribute[:]
        node.attribute.extend(kept)


def _string_attribute(node: NodeProto, name: str) -> str | None:
    for attribute in node.attribute:
        if attribute.name == name:
            value = helper.get_attribute_value(attribute)
            return value.decode() if isinstance(value, bytes) else str(value)
    return None
