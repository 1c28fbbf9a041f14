"""Small structural helpers over ``onnx`` graphs, shared by the graph split and the builder.

Nothing here knows about training graphs: these functions load models, walk nested subgraphs,
find the outer-scope names a node reads, order nodes topologically, hand out fresh value names
and check lists of value names given as arguments. Pure Python over the ``onnx`` package; no onnxruntime.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, numpy_helper

from .errors import OrtInvalidProtobuf, OrtInvalidType, OrtNoSuchFile

__all__ = [
    "load_model",
    "node_subgraphs",
    "walk_graphs",
    "outer_scope_names",
    "consumed_names",
    "topological_order",
    "CycleError",
    "used_domains",
    "used_functions",
    "describe_node",
    "NameAllocator",
    "all_value_names",
    "name_list",
]


def load_model(model: ModelProto | bytes | bytearray | str | os.PathLike) -> ModelProto:
    """A ``ModelProto`` from a model object (returned as is), serialized bytes or a file path."""
    if isinstance(model, ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        proto = ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as exc:  # protobuf raises its own DecodeError
            raise OrtInvalidProtobuf(f"the bytes given are not a serialized ONNX model: {exc}") from exc
        return proto
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise OrtNoSuchFile(f"no ONNX model file at '{path}'")
        try:
            return onnx.load(path)
        except Exception as exc:
            raise OrtInvalidProtobuf(f"'{path}' is not a readable ONNX model: {exc}") from exc
    raise OrtInvalidType(
        "expected an onnx.ModelProto, serialized model bytes or a path, got "
        f"{type(model).__name__}"
    )


def node_subgraphs(node: NodeProto) -> tuple[GraphProto, ...]:
    """The subgraphs held by a node's attributes (the branches of If, the body of Loop/Scan).
    (The graph passes ask this of every node, several times: a node without attributes, most
    of them, answers without a generator.)"""
    attributes = node.attribute
    if not attributes:
        return ()
    subgraphs: list[GraphProto] = []
    for attr in attributes:
        if attr.type == AttributeProto.GRAPH:
            subgraphs.append(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            subgraphs.extend(attr.graphs)
    return tuple(subgraphs)


def walk_graphs(graph: GraphProto) -> Iterator[GraphProto]:
    """``graph`` and every graph nested in it, depth first."""
    yield graph
    for node in graph.node:
        for sub in node_subgraphs(node):
            yield from walk_graphs(sub)


def _defined_in(graph: GraphProto) -> set[str]:
    names = {value.name for value in graph.input}
    names.update(init.name for init in graph.initializer)
    names.update(sparse.values.name for sparse in graph.sparse_initializer)
    for node in graph.node:
        names.update(out for out in node.output if out)
    return names


def outer_scope_names(graph: GraphProto) -> set[str]:
    """Names a subgraph reads without defining them: values of the enclosing scopes."""
    defined = _defined_in(graph)
    used: set[str] = set()
    for node in graph.node:
        used.update(name for name in node.input if name)
        for sub in node_subgraphs(node):
            used.update(outer_scope_names(sub))
    used.update(value.name for value in graph.output if value.name)
    return used - defined


def constant_values(graph: GraphProto, outer: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The values ``graph`` holds as constants: its initializers and standard ``Constant``
    nodes with a tensor ``value``, over the ``outer`` scope's."""
    values = dict(outer or {})
    for init in graph.initializer:
        values[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.type == AttributeProto.TENSOR:
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def consumed_names(node: NodeProto) -> list[str]:
    """What a node reads from its scope: its inputs, then its subgraphs' outer-scope names.

    Empty input names (omitted optional inputs) are skipped; each name appears once.
    """
    seen: dict[str, None] = dict.fromkeys(node.input)
    seen.pop("", None)
    for sub in node_subgraphs(node):
        for name in sorted(outer_scope_names(sub)):
            seen.setdefault(name, None)
    return list(seen)


class CycleError(ValueError):
    """Raised by :func:`topological_order` with the nodes that could not be ordered."""

    def __init__(self, message: str, nodes: Sequence[NodeProto]) -> None:
        super().__init__(message)
        self.nodes = list(nodes)


def topological_order(nodes: Sequence[NodeProto]) -> list[NodeProto]:
    """The nodes in an order where every producer comes before its consumers.

    Stable: among the nodes that are ready, the one listed first goes first, so an already
    sorted list comes back unchanged. Dependencies on values produced outside ``nodes`` are
    ignored. Raises :class:`CycleError` when the nodes depend on each other in a cycle.
    """
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer[out] = index
    waiting_on = [0] * len(nodes)
    consumers: list[list[int]] = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        deps = {producer[name] for name in consumed_names(node) if name in producer}
        deps.discard(index)
        waiting_on[index] = len(deps)
        for dep in deps:
            consumers[dep].append(index)
    ready = [index for index, count in enumerate(waiting_on) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for consumer in consumers[index]:
            waiting_on[consumer] -= 1
            if waiting_on[consumer] == 0:
                heapq.heappush(ready, consumer)
    if len(order) != len(nodes):
        stuck = [nodes[i] for i in range(len(nodes)) if waiting_on[i] > 0]
        names = ", ".join(describe_node(node) for node in stuck[:5])
        raise CycleError(f"nodes depend on each other in a cycle: {names}", stuck)
    return [nodes[i] for i in order]


def describe_node(node: NodeProto) -> str:
    """A short human description of a node for error messages."""
    op = f"{node.domain}:{node.op_type}" if node.domain else node.op_type
    if node.name:
        return f"{op} node '{node.name}'"
    outputs = ", ".join(repr(out) for out in node.output if out)
    return f"{op} node producing {outputs}" if outputs else f"{op} node (unnamed)"


def used_domains(nodes: Iterable[NodeProto], functions: Sequence[onnx.FunctionProto] = ()) -> set[str]:
    """Operator domains used by ``nodes``, their subgraphs and the local functions they call."""
    by_key = {(func.domain, func.name): func for func in functions}
    domains: set[str] = set()
    seen_functions: set[tuple[str, str]] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        domains.add(node.domain or "")
        for sub in node_subgraphs(node):
            pending.extend(sub.node)
        key = (node.domain, node.op_type)
        if key in by_key and key not in seen_functions:
            seen_functions.add(key)
            pending.extend(by_key[key].node)
    return domains


def used_functions(nodes: Iterable[NodeProto], functions: Sequence[onnx.FunctionProto]) -> list[onnx.FunctionProto]:
    """The local functions that ``nodes`` call, directly or through other functions."""
    by_key = {(func.domain, func.name): func for func in functions}
    kept: set[tuple[str, str]] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        for sub in node_subgraphs(node):
            pending.extend(sub.node)
        key = (node.domain, node.op_type)
        if key in by_key and key not in kept:
            kept.add(key)
            pending.extend(by_key[key].node)
    return [func for func in functions if (func.domain, func.name) in kept]


def all_value_names(graph: GraphProto) -> set[str]:
    """Every value name used anywhere in ``graph`` and its subgraphs (inputs, outputs, nodes)."""
    names: set[str] = set()
    for sub in walk_graphs(graph):
        names.update(value.name for value in sub.input)
        names.update(value.name for value in sub.output)
        names.update(value.name for value in sub.value_info)
        names.update(init.name for init in sub.initializer)
        names.update(sparse.values.name for sparse in sub.sparse_initializer)
        for node in sub.node:
            names.update(node.input)
            names.update(node.output)
    names.discard("")
    return names


class NameAllocator:
    """Hands out value names that collide with nothing already taken."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)
        # per stem, the suffix its search starts from: every suffix below it is taken (names
        # are never given back), so a stem asked for thousands of times is not searched from 1
        self._next_suffix: dict[str, int] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._taken

    def reserve(self, name: str) -> None:
        """Mark an exact name as used; it must be free."""
        if name in self._taken:
            raise ValueError(f"the name '{name}' is already used")
        self._taken.add(name)

    def fresh(self, stem: str) -> str:
        """``stem`` itself when free, else ``stem`` with the first free numeric suffix."""
        if stem not in self._taken:
            self._taken.add(stem)
            return stem
        counter = self._next_suffix.get(stem, 1)
        while f"{stem}_{counter}" in self._taken:
            counter += 1
        name = f"{stem}_{counter}"
        self._taken.add(name)
        self._next_suffix[stem] = counter + 1
        return name


def name_list(value: object, what: str, *, unordered: bool = False) -> list[str]:
    """`value`, a sequence of str names (a set too where `unordered`), as a list; a str itself
    (which would be iterated character by character) or a non-str name is an OrtInvalidType
    naming the argument `what`."""
    accepted = (Sequence, set, frozenset) if unordered else Sequence
    if isinstance(value, (str, bytes)) or not isinstance(value, accepted):
        raise OrtInvalidType(f"{what} must be a list of names, got {type(value).__name__}")
    names = list(value)
    for name in names:
        if not isinstance(name, str):
            raise OrtInvalidType(f"{what} must hold str names, got {name!r}")
    return names
