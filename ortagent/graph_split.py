"""Split an onnxruntime training graph at its YieldOp into a forward model and a backward model.

Stock onnxruntime has no kernel for ``com.microsoft:YieldOp``, so a training graph in the layout
ORTModule produces cannot be loaded as one session. :func:`split_training_graph` cuts it into
two ordinary ONNX models that together compute exactly what the single graph computes.

The training graph this module accepts
--------------------------------------

* graph inputs: user inputs, then parameters (the split does not need to tell them apart);
* exactly one ``com.microsoft:YieldOp`` node, in the main graph. Its inputs are the *module
  outputs* (what forward returns). Its outputs are the gradients of the differentiable module
  outputs, in order: module output ``i`` has no gradient slot when ``i`` is listed in the int
  list attribute ``non_differentiable_outputs``. The int list attribute ``full_shape_outputs``
  is required (it may be empty) and lists the module outputs whose gradient must have the full
  shape of the output; the others may receive any gradient that broadcasts (ORTModule feeds a
  scalar zero for an unused one). Both attributes index module outputs; every index is in range
  and listed once, and ``#inputs == #outputs + len(non_differentiable_outputs)``;
* graph outputs: whatever the graph lists (ORTModule lists ``<input>_grad`` names).

Anything else raises :class:`~ortagent.errors.TrainingGraphError` with a message naming the
node, attribute, index or value at fault.

What the split guarantees
-------------------------

Forward model
    Nodes: exactly those needed to compute the module outputs (a node is needed when one of its
    outputs, or a value one of its subgraphs reads from the enclosing scope, is needed), plus
    the ``Shape``/``Size`` nodes the backward applies to values the forward computes: they move
    into the forward so that the stash holds a few integers rather than the whole tensor.
    Inputs: the training graph inputs that those nodes or the module outputs read, in
    training-graph order (:attr:`TrainingGraphSplit.forward_input_names`).
    Outputs: the module outputs in YieldOp order -- repeated if the YieldOp repeats a value --
    followed by the stash (:attr:`TrainingGraphSplit.forward_output_names`).

Stash
    The values computed by forward nodes that the backward reads, each once, in the order the
    forward computes them. Never a graph input (the caller feeds those to the backward again),
    never an initializer or the output of a ``Constant`` node (those are copied into every model
    that reads them), never a tensor the backward only takes the shape or size of, and never
    a view (a ``Reshape``, ``Squeeze``, ``Unsqueeze``, ``Flatten`` or ``Identity`` result whose
    shape or axes operand is constant) that is not a module output: the backward computes the
    view again from what it views, which crosses the cut instead (onnxruntime gives a view its
    input's buffer, but copies a view that is a graph output: the forward's flattened MatMul
    inputs were copied that way; a view whose shape the forward computes stays stashed, so
    that no shape crosses the cut for it). A module output the backward reads is part of the
    stash too, so the forward lists it twice; onnxruntime returns one value for both. Nothing
    else is stashed: a value is stashed only if the backward reads it and only a forward node
    produces it.

Backward model
    Nodes: the other nodes the graph outputs need (nodes neither side needs are dropped), and
    the views of forward values it reads (computed on both sides).
    Inputs: every YieldOp output, in order (also those the backward does not read, so the
    gradients can always be fed positionally), then the stash, then the training graph inputs
    the backward reads, in training-graph order
    (:attr:`TrainingGraphSplit.backward_input_names`).
    Outputs: the training graph outputs, in order. A graph output may be a gradient, a stash
    value, a graph input or a constant: it is then both an input and an output of the backward.

Both models keep the training graph's IR version, opset imports (the ``com.microsoft`` import
is dropped from a model that no longer uses that domain), local functions they call, and the
``value_info`` entries of the values they contain. Initializers are copied to each model that
reads them, both if both do; a graph input that also has an initializer (an overridable one)
keeps both on each side that reads it.

Types: the forward model goes through ONNX shape inference; every module output and stash value
must then have a known tensor element type (else ``TrainingGraphError``). The backward's inputs
are typed from that: a gradient gets the element type of its module output, and the output's
shape when the output is listed in ``full_shape_outputs`` (else no shape, so a broadcastable
gradient is accepted); a stash value keeps its forward type and shape; a graph input keeps its
declaration. The backward then goes through shape inference too, which gives the graph outputs
a type where the training graph did not declare one.

Feeding the halves (what an agent does)
    ``forward.run(forward_output_names, {n: feeds[n] for n in forward_input_names})`` returns
    the module outputs then the stash; ``backward.run(graph_output_names, gradients + stash +
    [feeds[n] for n in backward_graph_input_names])`` returns the graph outputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, ValueInfoProto, helper

from ._onnx_graph import (
    CycleError,
    consumed_names,
    describe_node,
    load_model,
    node_subgraphs,
    topological_order,
    used_domains,
    used_functions,
    walk_graphs,
)
from .errors import TrainingGraphError

__all__ = [
    "YIELD_OP_DOMAIN",
    "YIELD_OP_TYPE",
    "TensorInfo",
    "TrainingGraphSplit",
    "split_training_graph",
]

YIELD_OP_DOMAIN = "com.microsoft"
YIELD_OP_TYPE = "YieldOp"
_CONSTANT_DOMAINS = ("", "ai.onnx")
# Operators whose output only describes their input's shape: computed in the forward when their
# input is a forward value, so the stash holds a few integers instead of the whole tensor.
_SHAPE_OPS = ("Shape", "Size")
# Operators whose output is their input viewed in another shape: the backward computes such a
# forward value again from the stashed input (onnxruntime gives the view the input's buffer),
# where a stashed view would be a forward graph output, which onnxruntime copies.
_VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


@dataclass(frozen=True)
class TensorInfo:
    """Element type and shape of a tensor value, as far as the graph tells.

    ``elem_type`` is an ``onnx.TensorProto`` data type (``TensorProto.FLOAT`` ...). ``shape`` is
    ``None`` when even the rank is unknown, else one entry per axis: an ``int`` for a fixed
    extent, a ``str`` for a named symbolic one, ``None`` for an unknown one.
    """

    elem_type: int
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def from_type_proto(cls, type_proto: TypeProto) -> TensorInfo | None:
        """The tensor info of a ``TypeProto``; ``None`` if it is not a tensor of known element type."""
        if type_proto.WhichOneof("value") != "tensor_type":
            return None
        tensor_type = type_proto.tensor_type
        if not tensor_type.elem_type:
            return None
        if not tensor_type.HasField("shape"):
            return cls(tensor_type.elem_type, None)
        dims: list[int | str | None] = []
        for dim in tensor_type.shape.dim:
            which = dim.WhichOneof("value")
            if which == "dim_value":
                dims.append(int(dim.dim_value))
            elif which == "dim_param" and dim.dim_param:
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        return cls(tensor_type.elem_type, tuple(dims))

    def type_proto(self) -> TypeProto:
        """This info as an ONNX ``TypeProto`` (no shape when the rank is unknown)."""
        if self.shape is None:
            type_proto = TypeProto()
            type_proto.tensor_type.elem_type = self.elem_type
            return type_proto
        return helper.make_tensor_type_proto(self.elem_type, list(self.shape))

    @property
    def type_name(self) -> str:
        """The ONNX name of the element type, e.g. ``'FLOAT'``."""
        return TensorProto.DataType.Name(self.elem_type)

    @property
    def numpy_dtype(self) -> np.dtype | None:
        """The NumPy dtype of the element type (``ml_dtypes`` ones for bfloat16/float8), or None."""
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))
        except Exception:
            return None

    def accepts_shape(self, shape: Sequence[int]) -> bool:
        """Whether a concrete shape fits: same rank and equal fixed extents (any rank if unknown)."""
        if self.shape is None:
            return True
        if len(shape) != len(self.shape):
            return False
        return all(not isinstance(want, int) or want == got for want, got in zip(self.shape, shape))


@dataclass(frozen=True, eq=False)
class TrainingGraphSplit:
    """A training graph cut at its YieldOp; see the module docstring for the guarantees.

    All name and index sequences are tuples. Indices of module outputs are YieldOp input
    positions; indices of gradients are YieldOp output positions.
    """

    forward_model: ModelProto
    backward_model: ModelProto
    #: every input of the training graph, in order (what a caller feeds).
    graph_input_names: tuple[str, ...]
    #: the graph inputs the forward model reads, in graph-input order.
    forward_input_names: tuple[str, ...]
    #: the YieldOp inputs, in order (may repeat a name).
    module_output_names: tuple[str, ...]
    #: module output indices without a gradient slot, as the attribute lists them.
    non_differentiable_outputs: tuple[int, ...]
    #: module output indices whose gradient must have the full output shape.
    full_shape_outputs: tuple[int, ...]
    #: the YieldOp outputs, in order: the backward model's first inputs.
    gradient_names: tuple[str, ...]
    #: for each gradient, the index of the module output it belongs to.
    gradient_output_indices: tuple[int, ...]
    #: forward values the backward reads; forward outputs after the module outputs.
    stash_names: tuple[str, ...]
    #: the graph inputs the backward model reads, in graph-input order.
    backward_graph_input_names: tuple[str, ...]
    #: the training graph outputs, in order: the backward model's outputs.
    graph_output_names: tuple[str, ...]
    #: type of each graph input (None when it is not a tensor of known element type).
    graph_input_types: tuple[TensorInfo | None, ...]
    #: type of each module output.
    module_output_types: tuple[TensorInfo, ...]
    #: type of each gradient input: its module output's element type; the output's shape when
    #: the output is in ``full_shape_outputs``, else ``shape=None`` (any broadcastable shape).
    gradient_types: tuple[TensorInfo, ...]
    #: type of each stash value.
    stash_types: tuple[TensorInfo, ...]
    #: type of each graph output (None where neither declared nor inferable).
    graph_output_types: tuple[TensorInfo | None, ...]
    _gradient_of_output: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        mapping = {output: gradient for gradient, output in enumerate(self.gradient_output_indices)}
        object.__setattr__(self, "_gradient_of_output", mapping)

    @property
    def forward_output_names(self) -> tuple[str, ...]:
        """The forward model's outputs: module outputs, then the stash."""
        return self.module_output_names + self.stash_names

    @property
    def backward_input_names(self) -> tuple[str, ...]:
        """The backward model's inputs: gradients, then the stash, then graph inputs."""
        return self.gradient_names + self.stash_names + self.backward_graph_input_names

    @property
    def forward_input_indices(self) -> tuple[int, ...]:
        """Positions in :attr:`graph_input_names` of the forward model's inputs."""
        position = {name: i for i, name in enumerate(self.graph_input_names)}
        return tuple(position[name] for name in self.forward_input_names)

    @property
    def backward_graph_input_indices(self) -> tuple[int, ...]:
        """Positions in :attr:`graph_input_names` of the graph inputs the backward reads."""
        position = {name: i for i, name in enumerate(self.graph_input_names)}
        return tuple(position[name] for name in self.backward_graph_input_names)

    @property
    def differentiable_output_indices(self) -> tuple[int, ...]:
        """Module output indices that have a gradient slot (same order as the gradients)."""
        return self.gradient_output_indices

    def gradient_index(self, output_index: int) -> int | None:
        """The gradient input of module output ``output_index``; None if it is non-differentiable."""
        if not 0 <= output_index < len(self.module_output_names):
            raise IndexError(
                f"module output index {output_index} out of range "
                f"(the module has {len(self.module_output_names)} outputs)"
            )
        return self._gradient_of_output.get(output_index)


def split_training_graph(model: ModelProto | bytes | str | os.PathLike) -> TrainingGraphSplit:
    """Validate a training graph and split it at its YieldOp.

    ``model`` is an ``onnx.ModelProto`` (not modified), serialized model bytes or the path of an
    ONNX file. Raises :class:`~ortagent.errors.TrainingGraphError` for a graph that is not in the
    layout described in this module's docstring.
    """
    return _split(load_model(model))


# ---------------------------------------------------------------------------------------------


def _has_type(value: ValueInfoProto) -> bool:
    return value.type.WhichOneof("value") is not None


def _tensor_type_proto(elem_type: int, dims: Sequence[int]) -> TypeProto:
    return helper.make_tensor_type_proto(elem_type, list(dims))


def _value_info(name: str, type_proto: TypeProto | None) -> ValueInfoProto:
    value = ValueInfoProto()
    value.name = name
    if type_proto is not None:
        value.type.CopyFrom(type_proto)
    return value


def _ints_attribute(node: NodeProto, name: str) -> tuple[int, ...] | None:
    for attr in node.attribute:
        if attr.name == name:
            if attr.type != AttributeProto.INTS:
                kind = AttributeProto.AttributeType.Name(attr.type)
                raise TrainingGraphError(
                    f"{describe_node(node)}: attribute '{name}' must be a list of ints, "
                    f"it is of type {kind}"
                )
            return tuple(int(i) for i in attr.ints)
    return None


def _constant_node_type(node: NodeProto) -> TypeProto | None:
    """The type of a ``Constant`` node's output, read from its attribute."""
    for attr in node.attribute:
        if attr.name == "value" and attr.type == AttributeProto.TENSOR:
            return _tensor_type_proto(attr.t.data_type, attr.t.dims)
        if attr.name == "value_float":
            return _tensor_type_proto(TensorProto.FLOAT, [])
        if attr.name == "value_int":
            return _tensor_type_proto(TensorProto.INT64, [])
        if attr.name == "value_floats":
            return _tensor_type_proto(TensorProto.FLOAT, [len(attr.floats)])
        if attr.name == "value_ints":
            return _tensor_type_proto(TensorProto.INT64, [len(attr.ints)])
        if attr.name == "value_string":
            return _tensor_type_proto(TensorProto.STRING, [])
        if attr.name == "value_strings":
            return _tensor_type_proto(TensorProto.STRING, [len(attr.strings)])
    return None


def _is_constant_node(node: NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in _CONSTANT_DOMAINS and not node.input


def _merge_types(declared: TypeProto | None, inferred: TypeProto | None) -> TypeProto | None:
    """Prefer what the graph declares; take the inferred shape where the declaration has none."""
    if declared is None or declared.WhichOneof("value") is None:
        return inferred
    if declared.WhichOneof("value") != "tensor_type" or inferred is None:
        return declared
    if not declared.tensor_type.elem_type:
        return inferred if inferred.WhichOneof("value") == "tensor_type" else declared
    if declared.tensor_type.HasField("shape"):
        return declared
    if (
        inferred.WhichOneof("value") == "tensor_type"
        and inferred.tensor_type.elem_type == declared.tensor_type.elem_type
        and inferred.tensor_type.HasField("shape")
    ):
        return inferred
    return declared


def _types_of(graph: GraphProto) -> dict[str, TypeProto]:
    types: dict[str, TypeProto] = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if _has_type(value):
            types.setdefault(value.name, value.type)
    return types


def _describe_type(type_proto: TypeProto | None) -> str:
    if type_proto is None or type_proto.WhichOneof("value") is None:
        return "no type"
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        elem = type_proto.tensor_type.elem_type
        return f"tensor of {TensorProto.DataType.Name(elem)}" if elem else "tensor of unknown element type"
    return kind.replace("_type", "")


def _infer(model: ModelProto, side: str) -> ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise TrainingGraphError(f"ONNX shape inference failed on the {side} part of the training graph: {exc}") from exc


# -- the split as passes ----------------------------------------------------------------------
#
# split_training_graph runs five passes, each a function from the records of the passes before
# it to a new frozen record; no pass changes an earlier record:
#
#   _index_graph     model -> _GraphIndex    validate names, locate the YieldOp, map producers
#   _read_yield      index -> _YieldInfo     the YieldOp's inputs, outputs and attributes
#   _compute_cut     ... -> _Cut             which nodes, inputs and constants each half needs
#   _build_forward   ... -> _Forward         the forward model and the types crossing the cut
#   _build_backward  ... -> _Backward        the backward model and its output types


@dataclass(frozen=True)
class _GraphIndex:
    """The training graph's names and nodes, validated (first pass)."""

    model: ModelProto
    graph: GraphProto
    inputs: tuple[ValueInfoProto, ...]
    input_names: tuple[str, ...]
    input_set: frozenset[str]
    #: names of the initializers and sparse initializers
    constants: frozenset[str]
    nodes: tuple[NodeProto, ...]
    output_names: tuple[str, ...]
    #: position in `nodes` of the one YieldOp
    yield_index: int
    #: value name -> position in `nodes` of the node producing it
    producer: Mapping[str, int]
    #: value name -> the type the graph declares for it (value_info, initializers, Constant nodes)
    declared: Mapping[str, TypeProto]


@dataclass(frozen=True)
class _YieldInfo:
    """What the YieldOp says about the module outputs and their gradients (second pass)."""

    module_outputs: tuple[str, ...]
    gradients: tuple[str, ...]
    non_differentiable: tuple[int, ...]
    full_shape: tuple[int, ...]
    #: for each gradient, the index of its module output
    gradient_output_indices: tuple[int, ...]
    gradient_set: frozenset[str]


class _Closure(NamedTuple):
    """What a set of values needs, walking back from them: node positions, graph inputs, constants."""

    nodes: frozenset[int]
    inputs: frozenset[str]
    constants: frozenset[str]


@dataclass(frozen=True)
class _Cut:
    """The nodes, inputs and constants of each half, and the stash between them (third pass)."""

    #: in topological order
    forward_nodes: tuple[NodeProto, ...]
    #: in graph-input order
    forward_inputs: tuple[str, ...]
    forward_constants: frozenset[str]
    backward_nodes: tuple[NodeProto, ...]
    backward_inputs: tuple[str, ...]
    backward_constants: frozenset[str]
    #: in the order the forward computes it
    stash: tuple[str, ...]


@dataclass(frozen=True)
class _Forward:
    """The forward model with typed outputs (fourth pass)."""

    model: ModelProto
    #: module output or stash name -> its type (declared, completed by inference)
    output_types: Mapping[str, TypeProto | None]
    module_types: tuple[TensorInfo, ...]
    stash_types: tuple[TensorInfo, ...]


@dataclass(frozen=True)
class _Backward:
    """The backward model with typed inputs and outputs (fifth pass)."""

    model: ModelProto
    gradient_types: tuple[TensorInfo, ...]
    output_types: tuple[TensorInfo | None, ...]


def _split(model: ModelProto) -> TrainingGraphSplit:
    index = _index_graph(model)
    yield_info = _read_yield(index)
    cut = _compute_cut(index, yield_info)
    forward = _build_forward(index, yield_info, cut)
    backward = _build_backward(index, yield_info, cut, forward)
    return _assemble(index, yield_info, cut, forward, backward)


# -- pass 1: index the graph ------------------------------------------------------------------


def _index_graph(model: ModelProto) -> _GraphIndex:
    graph = model.graph
    inputs = tuple(graph.input)
    input_names = tuple(value.name for value in inputs)
    _check_input_names(input_names)
    input_set = frozenset(input_names)
    constants = frozenset(init.name for init in graph.initializer) | frozenset(
        sparse.values.name for sparse in graph.sparse_initializer
    )
    nodes = tuple(graph.node)
    output_names = tuple(value.name for value in graph.output)
    _check_output_names(output_names)
    yield_index = _find_yield(nodes)
    producer = _producers(nodes, input_set, constants)
    return _GraphIndex(
        model=model,
        graph=graph,
        inputs=inputs,
        input_names=input_names,
        input_set=input_set,
        constants=constants,
        nodes=nodes,
        output_names=output_names,
        yield_index=yield_index,
        producer=MappingProxyType(producer),
        declared=MappingProxyType(_declared_types(graph, nodes)),
    )


def _check_input_names(input_names: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in input_names:
        if not name:
            raise TrainingGraphError("the training graph has a graph input with an empty name")
        if name in seen:
            raise TrainingGraphError(f"graph input '{name}' is listed more than once")
        seen.add(name)


def _check_output_names(output_names: Sequence[str]) -> None:
    if not output_names:
        raise TrainingGraphError(
            "the training graph has no outputs: its backward would compute nothing "
            "(a training graph lists the gradients it computes as graph outputs)"
        )
    for name in output_names:
        if not name:
            raise TrainingGraphError("the training graph has a graph output with an empty name")


def _find_yield(nodes: Sequence[NodeProto]) -> int:
    """The position of the one YieldOp of the main graph; rejects any other YieldOp."""
    yields: list[int] = []
    for index, node in enumerate(nodes):
        if node.op_type != YIELD_OP_TYPE:
            continue
        if node.domain != YIELD_OP_DOMAIN:
            domain = node.domain or "ai.onnx (the default domain)"
            raise TrainingGraphError(
                f"{describe_node(node)} is in domain '{domain}'; the YieldOp of a training "
                f"graph must be in domain '{YIELD_OP_DOMAIN}'"
            )
        yields.append(index)
    _check_no_yield_in_subgraphs(nodes)
    if not yields:
        raise TrainingGraphError(
            f"the training graph has no {YIELD_OP_DOMAIN}:{YIELD_OP_TYPE} node, so there is no "
            "point where forward ends and backward begins; an inference graph cannot be used "
            "with TrainingAgent (onnxruntime-training 1.19.2 accepted such a graph, ran all "
            "of it as the forward and failed only in run_backward)"
        )
    if len(yields) > 1:
        listed = ", ".join(describe_node(nodes[i]) for i in yields)
        raise TrainingGraphError(
            f"the training graph has {len(yields)} YieldOp nodes ({listed}); exactly one is supported"
        )
    return yields[0]


def _check_no_yield_in_subgraphs(nodes: Sequence[NodeProto]) -> None:
    for node in nodes:
        for sub in node_subgraphs(node):
            for inner_graph in walk_graphs(sub):
                for inner in inner_graph.node:
                    if inner.op_type == YIELD_OP_TYPE:
                        raise TrainingGraphError(
                            f"{describe_node(inner)} is inside a subgraph of {describe_node(node)}; "
                            "the YieldOp must be a node of the main graph"
                        )


def _producers(nodes: Sequence[NodeProto], input_set: frozenset[str], constants: frozenset[str]) -> dict[str, int]:
    """Value name -> producing node position; checks single assignment (one definition per value)."""
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if not name:
                continue
            if name in input_set:
                raise TrainingGraphError(f"value '{name}' is a graph input and also produced by {describe_node(node)}")
            if name in constants:
                raise TrainingGraphError(f"value '{name}' is an initializer and also produced by {describe_node(node)}")
            if name in producer:
                other = nodes[producer[name]]
                raise TrainingGraphError(
                    f"value '{name}' is produced twice, by {describe_node(other)} and by {describe_node(node)}"
                )
            producer[name] = index
    return producer


def _declared_types(graph: GraphProto, nodes: Sequence[NodeProto]) -> dict[str, TypeProto]:
    types = _types_of(graph)
    for init in graph.initializer:
        types.setdefault(init.name, _tensor_type_proto(init.data_type, init.dims))
    for sparse in graph.sparse_initializer:
        types.setdefault(sparse.values.name, _tensor_type_proto(sparse.values.data_type, sparse.dims))
    for node in nodes:
        if _is_constant_node(node) and node.output:
            constant_type = _constant_node_type(node)
            if constant_type is not None:
                types.setdefault(node.output[0], constant_type)
    return types


# -- pass 2: the YieldOp ----------------------------------------------------------------------


def _read_yield(index: _GraphIndex) -> _YieldInfo:
    node = index.nodes[index.yield_index]
    where = describe_node(node)
    module_outputs = tuple(node.input)
    gradients = tuple(node.output)
    _check_yield_names(where, module_outputs, gradients)
    count = len(module_outputs)
    full_shape = _ints_attribute(node, "full_shape_outputs")
    if full_shape is None:
        raise TrainingGraphError(
            f"{where} lacks the required attribute 'full_shape_outputs' (a list of module "
            "output indices whose gradient must have the output's full shape; it may be empty)"
        )
    non_diff = _ints_attribute(node, "non_differentiable_outputs") or ()
    _check_output_indices(where, "non_differentiable_outputs", non_diff, count)
    _check_output_indices(where, "full_shape_outputs", full_shape, count)
    if count != len(gradients) + len(non_diff):
        raise TrainingGraphError(
            f"{where} has {count} input(s) (module outputs), {len(non_diff)} of them "
            f"non-differentiable, so it needs {count - len(non_diff)} output(s) (gradients), "
            f"but it has {len(gradients)}"
        )
    non_diff_set = set(non_diff)
    return _YieldInfo(
        module_outputs=module_outputs,
        gradients=gradients,
        non_differentiable=non_diff,
        full_shape=full_shape,
        gradient_output_indices=tuple(i for i in range(count) if i not in non_diff_set),
        gradient_set=frozenset(gradients),
    )


def _check_yield_names(where: str, module_outputs: Sequence[str], gradients: Sequence[str]) -> None:
    if not module_outputs:
        raise TrainingGraphError(f"{where} has no inputs: the module has no outputs to return")
    for position, name in enumerate(module_outputs):
        if not name:
            raise TrainingGraphError(f"{where}: input {position} (a module output) has an empty name")
    for position, name in enumerate(gradients):
        if not name:
            raise TrainingGraphError(f"{where}: output {position} (a gradient) has an empty name")


def _check_output_indices(where: str, attr_name: str, indices: Sequence[int], count: int) -> None:
    """Every index of a YieldOp attribute names a module output, once."""
    seen: set[int] = set()
    for index in indices:
        if index < 0:
            raise TrainingGraphError(
                f"{where}: attribute '{attr_name}' has the negative index {index}; "
                "indices count module outputs (YieldOp inputs) from 0"
            )
        if index >= count:
            raise TrainingGraphError(
                f"{where}: attribute '{attr_name}' has index {index}, out of range: "
                f"the YieldOp has {count} input(s) (module outputs)"
            )
        if index in seen:
            raise TrainingGraphError(f"{where}: attribute '{attr_name}' lists index {index} more than once")
        seen.add(index)


# -- pass 3: the cut --------------------------------------------------------------------------


def _compute_cut(index: _GraphIndex, yield_info: _YieldInfo) -> _Cut:
    forward = _closure(index, yield_info, yield_info.module_outputs, True, lambda position, name: True)
    backward, moved, stash_set = _backward_closure(index, yield_info, forward.nodes)
    forward_nodes = _ordered(index, forward.nodes | moved, "forward")
    backward_nodes = _ordered(index, backward.nodes, "backward")
    stash: list[str] = []
    for node in forward_nodes:
        for name in node.output:
            if name in stash_set and name not in stash:
                stash.append(name)
    return _Cut(
        forward_nodes=forward_nodes,
        forward_inputs=tuple(name for name in index.input_names if name in forward.inputs),
        forward_constants=forward.constants,
        backward_nodes=backward_nodes,
        backward_inputs=tuple(name for name in index.input_names if name in backward.inputs),
        backward_constants=backward.constants,
        stash=tuple(stash),
    )


def _backward_closure(
    index: _GraphIndex, yield_info: _YieldInfo, forward_nodes: frozenset[int]
) -> tuple[_Closure, frozenset[int], frozenset[str]]:
    """The backward's closure, the shape nodes it moves into the forward, and the stash (unordered).

    Walking back from the graph outputs, a value a forward node computes ends the walk and is
    stashed, unless it is a view of constant shape that is not a module output (the view joins
    the backward and the walk goes on to what it views); a ``Shape``/``Size`` of a forward
    value (or of a value such a moved node computes) moves into the forward, and its small
    result is stashed instead."""
    moved: set[int] = set()
    stash: set[str] = set()
    module_outputs = frozenset(yield_info.module_outputs)

    def in_forward(position: int) -> bool:
        return (position in forward_nodes or position in moved) and not _is_constant_node(index.nodes[position])

    def constant(name: str) -> bool:
        """An operand both halves have without a stash: empty, an initializer, a Constant node's."""
        producer = index.producer.get(name)
        return not name or name in index.constants or (producer is not None
                                                       and _is_constant_node(index.nodes[producer]))

    def descend(position: int, name: str) -> bool:
        node = index.nodes[position]
        if in_forward(position):
            if node.op_type in _VIEW_OPS and node.domain in _CONSTANT_DOMAINS \
                    and name not in module_outputs and all(map(constant, node.input[1:])):
                return True             # viewed again in the backward, from its stashed input
            stash.add(name)             # computed by the forward: crosses the cut
            return False
        if node.op_type in _SHAPE_OPS and node.domain in _CONSTANT_DOMAINS and node.input:
            source = index.producer.get(node.input[0])
            if source is not None and in_forward(source):
                moved.add(position)     # stash the small shape tensor, not the tensor it describes
                stash.add(name)
                return False
        return True

    closure = _closure(index, yield_info, index.output_names, False, descend)
    return closure, frozenset(moved), frozenset(stash)


def _closure(index: _GraphIndex, yield_info: _YieldInfo, roots: Sequence[str], forward: bool,
             descend: Callable[[int, str], bool]) -> _Closure:
    """(nodes, graph inputs, constants) that `roots` need, walking back from them.

    A YieldOp output ends the walk: an error on the forward side (a cycle through the YieldOp),
    a leaf on the backward side. `descend(position, name)` decides whether the node producing
    `name` joins the closure (its inputs are then walked too)."""
    nodes: set[int] = set()
    inputs: set[str] = set()
    constants: set[str] = set()
    visited: set[str] = set()
    stack = [(name, name) for name in reversed(roots)]
    while stack:
        name, origin = stack.pop()
        if name in visited:
            continue
        visited.add(name)
        if name in yield_info.gradient_set:
            if forward:
                raise _cycle_error(origin, name)
            continue
        if name in index.input_set or name in index.constants:
            if name in index.input_set:
                inputs.add(name)
            if name in index.constants:
                constants.add(name)
        elif name in index.producer:
            position = index.producer[name]
            if position not in nodes and descend(position, name):
                nodes.add(position)
                stack.extend((used, origin) for used in reversed(consumed_names(index.nodes[position])))
        else:
            raise _unreachable_error(origin, name, forward)
    return _Closure(frozenset(nodes), frozenset(inputs), frozenset(constants))


def _cycle_error(origin: str, name: str) -> TrainingGraphError:
    return TrainingGraphError(
        f"module output '{origin}' (a YieldOp input) depends on the YieldOp output "
        f"'{name}': a cycle through the YieldOp, the forward part could only run "
        "after the gradients it produces are known"
    )


def _unreachable_error(origin: str, name: str, forward: bool) -> TrainingGraphError:
    what = "it" if name == origin else f"it needs '{name}', which"
    if forward:
        return TrainingGraphError(
            f"module output '{origin}' (a YieldOp input) cannot be computed: {what} "
            "is not produced by any node and is neither a graph input nor an initializer"
        )
    return TrainingGraphError(
        f"graph output '{origin}' cannot be computed: {what} is not produced by any "
        "node and is neither a graph input, an initializer nor a YieldOp output"
    )


def _ordered(index: _GraphIndex, positions: frozenset[int], side: str) -> tuple[NodeProto, ...]:
    nodes = [index.nodes[i] for i in sorted(positions)]
    try:
        return tuple(topological_order(nodes))
    except CycleError as exc:
        raise TrainingGraphError(f"the {side} part of the training graph has a cycle: {exc}") from exc


# -- pass 4: the forward model ----------------------------------------------------------------


def _build_forward(index: _GraphIndex, yield_info: _YieldInfo, cut: _Cut) -> _Forward:
    """The forward model, typed by declaration and inference; the types of what crosses the cut."""
    outputs = yield_info.module_outputs + cut.stash
    input_by_name = {value.name: value for value in index.inputs}
    graph = _graph(
        index,
        "forward",
        cut.forward_nodes,
        [input_by_name[name] for name in cut.forward_inputs],
        [_value_info(name, index.declared.get(name)) for name in outputs],
        cut.forward_constants,
    )
    functions = used_functions(cut.forward_nodes, list(index.model.functions))
    model = _copy_model(index.model, graph, cut.forward_nodes, functions)
    inferred = _types_of(_infer(model, "forward").graph)
    types = {name: _merge_types(index.declared.get(name), inferred.get(name)) for name in set(outputs)}
    module_types = tuple(
        _tensor_info_for(name, types[name], f"module output {i}") for i, name in enumerate(yield_info.module_outputs)
    )
    stash_types = tuple(_tensor_info_for(name, types[name], "stash value") for name in cut.stash)
    del model.graph.output[:]
    model.graph.output.extend(_value_info(name, types[name]) for name in outputs)
    return _Forward(model, MappingProxyType(types), module_types, stash_types)


def _tensor_info_for(name: str, type_proto: TypeProto | None, role: str) -> TensorInfo:
    kind = None if type_proto is None else type_proto.WhichOneof("value")
    if kind not in (None, "tensor_type"):
        raise TrainingGraphError(
            f"{role} '{name}' is a {_describe_type(type_proto)}, not a tensor; only tensors "
            "can cross between the forward and the backward part"
        )
    info = None if type_proto is None else TensorInfo.from_type_proto(type_proto)
    if info is None:
        raise TrainingGraphError(
            f"the element type of {role} '{name}' is unknown: it is not declared in the "
            "training graph (value_info) and ONNX shape inference cannot determine it, but "
            "the value crosses between the forward and the backward part, which needs it"
        )
    return info


# -- pass 5: the backward model ---------------------------------------------------------------


def _build_backward(index: _GraphIndex, yield_info: _YieldInfo, cut: _Cut, forward: _Forward) -> _Backward:
    """The backward model: gradients typed from their module outputs, outputs completed by inference."""
    gradient_types = _gradient_types(index, yield_info, forward)
    input_by_name = {value.name: value for value in index.inputs}
    inputs = (
        [_value_info(name, info.type_proto()) for name, info in zip(yield_info.gradients, gradient_types)]
        + [_value_info(name, forward.output_types[name]) for name in cut.stash]
        + [input_by_name[name] for name in cut.backward_inputs]
    )
    outputs = [_value_info(value.name, value.type if _has_type(value) else None) for value in index.graph.output]
    graph = _graph(index, "backward", cut.backward_nodes, inputs, outputs, cut.backward_constants)
    model = _copy_model(index.model, graph, cut.backward_nodes,
                        used_functions(cut.backward_nodes, list(index.model.functions)))
    inferred = _types_of(_infer(model, "backward").graph)
    output_types: list[TensorInfo | None] = []
    for value in model.graph.output:
        merged = _merge_types(value.type if _has_type(value) else None, inferred.get(value.name))
        if merged is not None and not _has_type(value):
            value.type.CopyFrom(merged)
        output_types.append(None if merged is None else TensorInfo.from_type_proto(merged))
    return _Backward(model, gradient_types, tuple(output_types))


def _gradient_types(index: _GraphIndex, yield_info: _YieldInfo, forward: _Forward) -> tuple[TensorInfo, ...]:
    """Each gradient's type: its module output's element type, and its shape if full-shape."""
    full_shape = set(yield_info.full_shape)
    gradient_types: list[TensorInfo] = []
    for gradient, output_index in zip(yield_info.gradients, yield_info.gradient_output_indices):
        module_type = forward.module_types[output_index]
        shape = module_type.shape if output_index in full_shape else None
        info = TensorInfo(module_type.elem_type, shape)
        declared = index.declared.get(gradient)
        stated = TensorInfo.from_type_proto(declared) if declared is not None else None
        if stated is not None and stated.elem_type != info.elem_type:
            raise TrainingGraphError(
                f"gradient '{gradient}' (YieldOp output {len(gradient_types)}) is declared as "
                f"{stated.type_name} but its module output '{yield_info.module_outputs[output_index]}' "
                f"is {info.type_name}; a gradient has the element type of its output"
            )
        gradient_types.append(info)
    return tuple(gradient_types)


# -- assembling -------------------------------------------------------------------------------


def _graph(
    index: _GraphIndex,
    suffix: str,
    nodes: Sequence[NodeProto],
    inputs: Sequence[ValueInfoProto],
    outputs: Sequence[ValueInfoProto],
    constants: frozenset[str],
) -> GraphProto:
    source = index.graph
    graph = GraphProto()
    graph.name = f"{source.name or 'training_graph'}_{suffix}"
    graph.node.extend(nodes)
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.initializer.extend(init for init in source.initializer if init.name in constants)
    graph.sparse_initializer.extend(s for s in source.sparse_initializer if s.values.name in constants)
    produced = {out for node in nodes for out in node.output if out}
    boundary = {value.name for value in inputs} | {value.name for value in outputs}
    graph.value_info.extend(
        value for value in source.value_info if value.name in produced and value.name not in boundary
    )
    return graph


def _copy_model(source: ModelProto, graph: GraphProto, nodes: Sequence[NodeProto],
                functions: list[onnx.FunctionProto]) -> ModelProto:
    model = ModelProto()
    model.ir_version = source.ir_version
    for attribute in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        if source.HasField(attribute):
            setattr(model, attribute, getattr(source, attribute))
    model.metadata_props.extend(source.metadata_props)
    domains = used_domains(nodes, functions)
    for opset in source.opset_import:
        if opset.domain == YIELD_OP_DOMAIN and YIELD_OP_DOMAIN not in domains:
            continue
        model.opset_import.add().CopyFrom(opset)
    model.functions.extend(functions)
    model.graph.CopyFrom(graph)
    return model


def _assemble(index: _GraphIndex, yield_info: _YieldInfo, cut: _Cut, forward: _Forward,
              backward: _Backward) -> TrainingGraphSplit:
    from ._graph_passes import products_over_empty_sums, vector_products_on_transposes

    # (onnxruntime 1.31 computes a transposed matrix times a vector, and products over an
    # empty sum, wrong: see there)
    for model in (forward.model, backward.model):
        vector_products_on_transposes(model)
        products_over_empty_sums(model)
    return TrainingGraphSplit(
        forward_model=forward.model,
        backward_model=backward.model,
        graph_input_names=index.input_names,
        forward_input_names=cut.forward_inputs,
        module_output_names=yield_info.module_outputs,
        non_differentiable_outputs=yield_info.non_differentiable,
        full_shape_outputs=yield_info.full_shape,
        gradient_names=yield_info.gradients,
        gradient_output_indices=yield_info.gradient_output_indices,
        stash_names=cut.stash,
        backward_graph_input_names=cut.backward_inputs,
        graph_output_names=index.output_names,
        graph_input_types=tuple(TensorInfo.from_type_proto(value.type) for value in index.inputs),
        module_output_types=forward.module_types,
        gradient_types=backward.gradient_types,
        stash_types=forward.stash_types,
        graph_output_types=backward.output_types,
    )
