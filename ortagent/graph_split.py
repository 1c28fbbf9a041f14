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
    that reads them), and never a tensor the backward only takes the shape or size of. A module output the backward reads is part of the stash too, so the
    forward lists it twice; onnxruntime returns one value for both. Nothing else is stashed:
    a value is stashed only if the backward reads it and only a forward node produces it.

Backward model
    Nodes: the other nodes the graph outputs need (nodes neither side needs are dropped).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
    return _Splitter(load_model(model)).split()


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


class _Splitter:
    def __init__(self, model: ModelProto) -> None:
        self.model = model
        self.graph = model.graph

    # -- validation and indexing -------------------------------------------------------------

    def _index(self) -> None:
        graph = self.graph
        self.inputs: list[ValueInfoProto] = list(graph.input)
        self.input_names = [value.name for value in self.inputs]
        seen: set[str] = set()
        for name in self.input_names:
            if not name:
                raise TrainingGraphError("the training graph has a graph input with an empty name")
            if name in seen:
                raise TrainingGraphError(f"graph input '{name}' is listed more than once")
            seen.add(name)
        self.input_set = set(self.input_names)
        self.initializers = {init.name: init for init in graph.initializer}
        self.sparse_initializers = {sparse.values.name: sparse for sparse in graph.sparse_initializer}
        self.constants = set(self.initializers) | set(self.sparse_initializers)
        self.nodes: list[NodeProto] = list(graph.node)
        self.output_names = [value.name for value in graph.output]
        if not self.output_names:
            raise TrainingGraphError(
                "the training graph has no outputs: its backward would compute nothing "
                "(a training graph lists the gradients it computes as graph outputs)"
            )
        for name in self.output_names:
            if not name:
                raise TrainingGraphError("the training graph has a graph output with an empty name")

        # Find the YieldOp and reject any YieldOp elsewhere.
        yields: list[int] = []
        for index, node in enumerate(self.nodes):
            if node.op_type != YIELD_OP_TYPE:
                continue
            if node.domain != YIELD_OP_DOMAIN:
                domain = node.domain or "ai.onnx (the default domain)"
                raise TrainingGraphError(
                    f"{describe_node(node)} is in domain '{domain}'; the YieldOp of a training "
                    f"graph must be in domain '{YIELD_OP_DOMAIN}'"
                )
            yields.append(index)
        for node in self.nodes:
            for sub in node_subgraphs(node):
                for inner_graph in walk_graphs(sub):
                    for inner in inner_graph.node:
                        if inner.op_type == YIELD_OP_TYPE:
                            raise TrainingGraphError(
                                f"{describe_node(inner)} is inside a subgraph of {describe_node(node)}; "
                                "the YieldOp must be a node of the main graph"
                            )
        if not yields:
            raise TrainingGraphError(
                f"the training graph has no {YIELD_OP_DOMAIN}:{YIELD_OP_TYPE} node, so there is no "
                "point where forward ends and backward begins; an inference graph cannot be used "
                "with TrainingAgent (onnxruntime-training 1.19.2 accepted such a graph, ran all "
                "of it as the forward and failed only in run_backward)"
            )
        if len(yields) > 1:
            listed = ", ".join(describe_node(self.nodes[i]) for i in yields)
            raise TrainingGraphError(
                f"the training graph has {len(yields)} YieldOp nodes ({listed}); "
                "exactly one is supported"
            )
        self.yield_index = yields[0]
        self.yield_node = self.nodes[self.yield_index]

        # Single assignment: every value has one definition.
        self.producer: dict[str, int] = {}
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if not name:
                    continue
                if name in self.input_set:
                    raise TrainingGraphError(f"value '{name}' is a graph input and also produced by {describe_node(node)}")
                if name in self.constants:
                    raise TrainingGraphError(f"value '{name}' is an initializer and also produced by {describe_node(node)}")
                if name in self.producer:
                    other = self.nodes[self.producer[name]]
                    raise TrainingGraphError(
                        f"value '{name}' is produced twice, by {describe_node(other)} and by {describe_node(node)}"
                    )
                self.producer[name] = index

    def _read_yield(self) -> None:
        node = self.yield_node
        where = describe_node(node)
        self.module_outputs = list(node.input)
        self.gradients = list(node.output)
        if not self.module_outputs:
            raise TrainingGraphError(f"{where} has no inputs: the module has no outputs to return")
        for position, name in enumerate(self.module_outputs):
            if not name:
                raise TrainingGraphError(f"{where}: input {position} (a module output) has an empty name")
        for position, name in enumerate(self.gradients):
            if not name:
                raise TrainingGraphError(f"{where}: output {position} (a gradient) has an empty name")
        count = len(self.module_outputs)

        full_shape = _ints_attribute(node, "full_shape_outputs")
        if full_shape is None:
            raise TrainingGraphError(
                f"{where} lacks the required attribute 'full_shape_outputs' (a list of module "
                "output indices whose gradient must have the output's full shape; it may be empty)"
            )
        non_diff = _ints_attribute(node, "non_differentiable_outputs") or ()
        for attr_name, indices in (("non_differentiable_outputs", non_diff), ("full_shape_outputs", full_shape)):
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
        if count != len(self.gradients) + len(non_diff):
            raise TrainingGraphError(
                f"{where} has {count} input(s) (module outputs), {len(non_diff)} of them "
                f"non-differentiable, so it needs {count - len(non_diff)} output(s) (gradients), "
                f"but it has {len(self.gradients)}"
            )
        self.non_differentiable = tuple(non_diff)
        self.full_shape = tuple(full_shape)
        non_diff_set = set(non_diff)
        self.gradient_output_indices = tuple(i for i in range(count) if i not in non_diff_set)
        self.gradient_set = set(self.gradients)

    # -- the two closures --------------------------------------------------------------------

    def _closure(self, roots: Sequence[str], forward: bool,
                 descend: Callable[[int, str], bool]) -> tuple[set[int], set[str], set[str]]:
        """(nodes, graph inputs, constants) that `roots` need, walking back from them.

        A YieldOp output ends the walk: an error on the forward side (a cycle through the
        YieldOp), a leaf on the backward side. `descend(index, name)` decides whether the node
        producing `name` joins the closure (its inputs are then walked too)."""
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
            if name in self.gradient_set:
                if not forward:
                    continue
                raise TrainingGraphError(
                    f"module output '{origin}' (a YieldOp input) depends on the YieldOp output "
                    f"'{name}': a cycle through the YieldOp, the forward part could only run "
                    "after the gradients it produces are known"
                )
            if name in self.input_set:
                inputs.add(name)
                if name in self.constants:
                    constants.add(name)
            elif name in self.constants:
                constants.add(name)
            elif name in self.producer:
                index = self.producer[name]
                if index not in nodes and descend(index, name):
                    nodes.add(index)
                    for used in reversed(consumed_names(self.nodes[index])):
                        stack.append((used, origin))
            else:
                what = "it" if name == origin else f"it needs '{name}', which"
                if forward:
                    raise TrainingGraphError(
                        f"module output '{origin}' (a YieldOp input) cannot be computed: {what} "
                        "is not produced by any node and is neither a graph input nor an initializer"
                    )
                raise TrainingGraphError(
                    f"graph output '{origin}' cannot be computed: {what} is not produced by any "
                    "node and is neither a graph input, an initializer nor a YieldOp output"
                )
        return nodes, inputs, constants

    def _forward_closure(self) -> None:
        nodes, inputs, constants = self._closure(self.module_outputs, True, lambda index, name: True)
        self.forward_nodes = nodes
        self.forward_inputs = [name for name in self.input_names if name in inputs]
        self.forward_constants = constants

    def _backward_closure(self) -> None:
        stash: set[str] = set()

        def descend(index: int, name: str) -> bool:
            node = self.nodes[index]
            if index in self.forward_nodes and not _is_constant_node(node):
                stash.add(name)             # computed by the forward: crosses the cut
                return False
            if self._is_shape_of_forward_value(node):
                # Stash the small shape tensor rather than the tensor it describes.
                self.forward_nodes.add(index)
                stash.add(name)
                return False
            return True

        nodes, inputs, constants = self._closure(self.output_names, False, descend)
        self.backward_nodes = nodes
        self.backward_inputs = [name for name in self.input_names if name in inputs]
        self.backward_constants = constants
        self.stash_set = stash

    def _is_shape_of_forward_value(self, node: NodeProto) -> bool:
        if node.op_type not in _SHAPE_OPS or node.domain not in _CONSTANT_DOMAINS or not node.input:
            return False
        index = self.producer.get(node.input[0])
        return index is not None and index in self.forward_nodes and not _is_constant_node(self.nodes[index])

    def _ordered(self, indices: set[int], side: str) -> list[NodeProto]:
        nodes = [self.nodes[i] for i in sorted(indices)]
        try:
            return topological_order(nodes)
        except CycleError as exc:
            raise TrainingGraphError(f"the {side} part of the training graph has a cycle: {exc}") from exc

    # -- types -------------------------------------------------------------------------------

    def _declared_types(self) -> dict[str, TypeProto]:
        types = _types_of(self.graph)
        for init in self.graph.initializer:
            types.setdefault(init.name, _tensor_type_proto(init.data_type, init.dims))
        for sparse in self.graph.sparse_initializer:
            types.setdefault(sparse.values.name, _tensor_type_proto(sparse.values.data_type, sparse.dims))
        for node in self.nodes:
            if _is_constant_node(node) and node.output:
                constant_type = _constant_node_type(node)
                if constant_type is not None:
                    types.setdefault(node.output[0], constant_type)
        return types

    def _tensor_info_for(self, name: str, type_proto: TypeProto | None, role: str) -> TensorInfo:
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

    # -- assembling the models ---------------------------------------------------------------

    def _copy_model(self, graph: GraphProto, nodes: list[NodeProto], functions: list[onnx.FunctionProto]) -> ModelProto:
        source = self.model
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

    def _graph(
        self,
        suffix: str,
        nodes: list[NodeProto],
        inputs: list[ValueInfoProto],
        outputs: list[ValueInfoProto],
        constants: set[str],
    ) -> GraphProto:
        graph = GraphProto()
        graph.name = f"{self.graph.name or 'training_graph'}_{suffix}"
        graph.node.extend(nodes)
        graph.input.extend(inputs)
        graph.output.extend(outputs)
        graph.initializer.extend(init for init in self.graph.initializer if init.name in constants)
        graph.sparse_initializer.extend(s for s in self.graph.sparse_initializer if s.values.name in constants)
        produced = {out for node in nodes for out in node.output if out}
        boundary = {value.name for value in inputs} | {value.name for value in outputs}
        graph.value_info.extend(
            value for value in self.graph.value_info if value.name in produced and value.name not in boundary
        )
        return graph

    def split(self) -> TrainingGraphSplit:
        self._index()
        self._read_yield()
        self._forward_closure()
        self._backward_closure()
        forward_nodes = self._ordered(self.forward_nodes, "forward")
        backward_nodes = self._ordered(self.backward_nodes, "backward")
        declared = self._declared_types()
        input_by_name = {value.name: value for value in self.inputs}

        # Stash in the order the forward computes it.
        stash: list[str] = []
        for node in forward_nodes:
            for name in node.output:
                if name in self.stash_set and name not in stash:
                    stash.append(name)

        # Forward model, typed by declaration and inference.
        functions = list(self.model.functions)
        forward_functions = used_functions(forward_nodes, functions)
        forward_outputs = self.module_outputs + stash
        forward_graph = self._graph(
            "forward",
            forward_nodes,
            [input_by_name[name] for name in self.forward_inputs],
            [_value_info(name, declared.get(name)) for name in forward_outputs],
            self.forward_constants,
        )
        forward_model = self._copy_model(forward_graph, forward_nodes, forward_functions)
        inferred_forward = _types_of(_infer(forward_model, "forward").graph)
        forward_types = {
            name: _merge_types(declared.get(name), inferred_forward.get(name)) for name in set(forward_outputs)
        }
        module_types = tuple(
            self._tensor_info_for(name, forward_types[name], f"module output {i}")
            for i, name in enumerate(self.module_outputs)
        )
        stash_types = tuple(self._tensor_info_for(name, forward_types[name], "stash value") for name in stash)
        del forward_model.graph.output[:]
        forward_model.graph.output.extend(_value_info(name, forward_types[name]) for name in forward_outputs)

        # Gradient types come from the module outputs.
        full_shape = set(self.full_shape)
        gradient_types: list[TensorInfo] = []
        for gradient, output_index in zip(self.gradients, self.gradient_output_indices):
            module_type = module_types[output_index]
            shape = module_type.shape if output_index in full_shape else None
            info = TensorInfo(module_type.elem_type, shape)
            stated = TensorInfo.from_type_proto(declared[gradient]) if gradient in declared else None
            if stated is not None and stated.elem_type != info.elem_type:
                raise TrainingGraphError(
                    f"gradient '{gradient}' (YieldOp output {len(gradient_types)}) is declared as "
                    f"{stated.type_name} but its module output '{self.module_outputs[output_index]}' "
                    f"is {info.type_name}; a gradient has the element type of its output"
                )
            gradient_types.append(info)

        # Backward model.
        backward_functions = used_functions(backward_nodes, functions)
        backward_inputs = (
            [_value_info(name, info.type_proto()) for name, info in zip(self.gradients, gradient_types)]
            + [_value_info(name, forward_types[name]) for name in stash]
            + [input_by_name[name] for name in self.backward_inputs]
        )
        backward_graph = self._graph(
            "backward",
            backward_nodes,
            backward_inputs,
            [_value_info(value.name, value.type if _has_type(value) else None) for value in self.graph.output],
            self.backward_constants,
        )
        backward_model = self._copy_model(backward_graph, backward_nodes, backward_functions)
        inferred_backward = _types_of(_infer(backward_model, "backward").graph)
        output_types: list[TensorInfo | None] = []
        for value in backward_model.graph.output:
            merged = _merge_types(value.type if _has_type(value) else None, inferred_backward.get(value.name))
            if merged is not None and not _has_type(value):
                value.type.CopyFrom(merged)
            output_types.append(None if merged is None else TensorInfo.from_type_proto(merged))

        return TrainingGraphSplit(
            forward_model=forward_model,
            backward_model=backward_model,
            graph_input_names=tuple(self.input_names),
            forward_input_names=tuple(self.forward_inputs),
            module_output_names=tuple(self.module_outputs),
            non_differentiable_outputs=self.non_differentiable,
            full_shape_outputs=self.full_shape,
            gradient_names=tuple(self.gradients),
            gradient_output_indices=self.gradient_output_indices,
            stash_names=tuple(stash),
            backward_graph_input_names=tuple(self.backward_inputs),
            graph_output_names=tuple(self.output_names),
            graph_input_types=tuple(TensorInfo.from_type_proto(value.type) for value in self.inputs),
            module_output_types=module_types,
            gradient_types=tuple(gradient_types),
            stash_types=stash_types,
            graph_output_types=tuple(output_types),
        )
