"""Shape values computed once per symbol (a rewrite used by build_training_graph).

A training graph with symbolic dimensions computes the same few shapes over and over: the
exporter reads ``Shape`` of a tensor, picks an element with ``Gather``, ``Unsqueeze``-s it and
``Concat``-s it with constants for every view of a batch- or sequence-sized tensor; onnx-ad's
reverse rules read the ``Shape`` of forward values (kept from the forward for the backward) to
give each gradient its operand's shape, and append its seed axis with another ``Concat``. A
GPT-2 of two layers runs about 400 such nodes per training step (onnxruntime spends about a
microsecond on each), when the graph has two symbols.

:func:`share_shape_values` works out, from ONNX shape inference, the value of every small
integer tensor those nodes compute, element by element, as a static size or a symbolic
dimension. A value with no symbol becomes a constant; a value with symbols is computed once:
each symbol is read once, ``Shape(t, start=axis, end=axis + 1)`` of the first tensor ``t`` that
has it (a graph input where one has it), and each distinct value is one ``Concat`` of those and
constants. The nodes that computed the value are then unread and dropped. In a training graph
the forward and the backward each compute their own (the backward reads the graph inputs
again, which the caller feeds it anyway), so that the forward keeps no shape for the backward
but a symbol it alone has (a flattened ``[n * t, K]`` tensor's rows). ONNX's inference loses
symbols that torch.export had (a ``Reshape`` to ``[-1, 64]`` gets a fresh unknown where torch
knows ``s0*s1``): the exporter's declared shapes of the forward's values are given back to it.

It relies on every dimension that ONNX shape inference gives one symbol being equal at run time,
which holds when the inputs fed agree with the symbols the graph inputs declare (one size per
symbol): only a caller that checks that before each run (ORTModule's shape guard does) should
apply it. The values followed are int64 (and bool) tensors of rank 0 or 1 computed by
``Shape``, ``Size`` (of a tensor of static shape), ``Gather``, ``Unsqueeze``, ``Squeeze``, ``Concat``, ``Slice``, ``Identity``,
``Cast``, ``ScatterElements``, integer arithmetic and comparisons on static elements; other nodes are left as they are, and a
symbolic element is never assumed to have a particular size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ._graph_passes import _drop_dead, inferred_dims
from ._onnx_graph import NameAllocator, all_value_names, consumed_names, node_subgraphs, outer_scope_names, topological_order

__all__ = ["share_shape_values"]

Element = int | str     # a static integer, or a symbolic dimension by its name


@dataclass(frozen=True)
class _Known:
    """The value of a small int64 or bool tensor: its elements, and whether it is a scalar."""

    elements: tuple[Element, ...]
    scalar: bool
    boolean: bool = False

    @property
    def static(self) -> bool:
        return all(isinstance(element, int) for element in self.elements)


_MAX_ELEMENTS = 64
_FOLLOWED = frozenset({"Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Identity", "Cast",
                       "Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Equal", "Less", "Greater", "Not", "Where",
                       "ScatterElements"})


def _attribute(node, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _constant_known(tensor) -> _Known | None:
    if tensor.data_type not in (TensorProto.INT64, TensorProto.BOOL) or len(tensor.dims) > 1:
        return None
    array = numpy_helper.to_array(tensor)
    if array.size > _MAX_ELEMENTS:
        return None
    return _Known(tuple(int(v) for v in array.reshape(-1)), array.ndim == 0, tensor.data_type == TensorProto.BOOL)


def _ints(known: _Known | None) -> list[int] | None:
    """The elements of a static int64 value, as a list (a scalar is a list of one)."""
    if known is None or known.boolean or not known.static:
        return None
    return list(known.elements)  # type: ignore[arg-type]


def _axes(node, values: dict, opset: int) -> list[int] | None:
    """The ``axes`` of an Unsqueeze or Squeeze (an attribute before opset 13, an input after);
    [] when absent."""
    if opset < 13:
        return list(_attribute(node, "axes", []))
    if len(node.input) < 2 or not node.input[1]:
        return []
    return _ints(values.get(node.input[1]))


def _elementwise(op_type: str, a: _Known, b: _Known) -> _Known | None:
    if a.boolean or b.boolean:
        return None
    if len(a.elements) != len(b.elements) and 1 not in (len(a.elements), len(b.elements)):
        return None
    n = max(len(a.elements), len(b.elements))
    left = a.elements * n if len(a.elements) == 1 else a.elements
    right = b.elements * n if len(b.elements) == 1 else b.elements
    scalar = a.scalar and b.scalar
    if op_type == "Equal":
        out = []
        for x, y in zip(left, right):
            if isinstance(x, int) and isinstance(y, int):
                out.append(int(x == y))
            elif x == y:                # one symbol: the same size
                out.append(1)
            else:
                return None
        return _Known(tuple(out), scalar, boolean=True)
    if not (a.static and b.static):
        return None
    if op_type in ("Less", "Greater"):
        compare = (lambda x, y: x < y) if op_type == "Less" else (lambda x, y: x > y)
        return _Known(tuple(int(compare(x, y)) for x, y in zip(left, right)), scalar, boolean=True)
    results = []
    for x, y in zip(left, right):
        if op_type == "Add":
            results.append(x + y)
        elif op_type == "Sub":
            results.append(x - y)
        elif op_type == "Mul":
            results.append(x * y)
        elif op_type == "Div":
            if y == 0:
                return None
            quotient = abs(x) // abs(y)     # C++ integer division: towards zero
            results.append(quotient if (x >= 0) == (y >= 0) else -quotient)
        elif op_type == "Max":
            results.append(max(x, y))
        else:
            results.append(min(x, y))
    return _Known(tuple(results), scalar)


def _value_of(node, values: dict, shapes: dict, opset: int) -> _Known | None:
    """The value ``node``'s (first) output has, when its inputs' values are known."""
    op = node.op_type
    ins = [values.get(name) if name else None for name in node.input]
    if op == "Shape":
        dims = shapes.get(node.input[0])
        if dims is None:
            return None
        rank = len(dims)
        start, end = _attribute(node, "start", 0), _attribute(node, "end", rank)
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        picked = dims[start:end]
        if any(dim is None for dim in picked) or len(picked) > _MAX_ELEMENTS:
            return None
        return _Known(tuple(picked), False)
    if op == "Size":
        dims = shapes.get(node.input[0])
        if dims is None or not all(isinstance(dim, int) for dim in dims):
            return None
        return _Known((int(np.prod(dims, dtype=np.int64)),), True)
    if op in ("Identity",) and ins[0] is not None:
        return ins[0]
    if op == "Cast":
        source = ins[0]
        target = _attribute(node, "to")
        if source is None:
            return None
        if (target == TensorProto.INT64 and not source.boolean) or (target == TensorProto.BOOL and source.boolean):
            return source
        return None
    if op == "Gather":
        data, indices = ins[0], _ints(ins[1]) if len(ins) > 1 else None
        if data is None or data.scalar or indices is None or _attribute(node, "axis", 0) not in (0, -1):
            return None
        n = len(data.elements)
        picked = []
        for index in indices:
            index = index + n if index < 0 else index
            if not 0 <= index < n:
                return None
            picked.append(data.elements[index])
        return _Known(tuple(picked), ins[1].scalar, data.boolean)
    if op == "Unsqueeze":
        data, axes = ins[0], _axes(node, values, opset)
        if data is None or not data.scalar or axes not in ([0], [-1]):
            return None
        return _Known(data.elements, False, data.boolean)
    if op == "Squeeze":
        data, axes = ins[0], _axes(node, values, opset)
        if data is None or data.scalar or len(data.elements) != 1 or axes not in ([], [0], [-1]):
            return None
        return _Known(data.elements, True, data.boolean)
    if op == "Concat":
        if _attribute(node, "axis") not in (0, -1) or any(v is None or v.scalar for v in ins) \
                or len({v.boolean for v in ins}) != 1:
            return None
        elements = tuple(element for v in ins for element in v.elements)
        return _Known(elements, False, ins[0].boolean) if len(elements) <= _MAX_ELEMENTS else None
    if op == "Slice":
        data = ins[0]
        bounds = [_ints(v) for v in ins[1:]]
        if data is None or data.scalar or len(bounds) < 2 or any(b is None for b in bounds) \
                or any(len(b) != 1 for b in bounds):
            return None
        start, end = bounds[0][0], bounds[1][0]
        if len(bounds) > 2 and bounds[2][0] not in (0, -1):
            return None
        if len(bounds) > 3 and bounds[3][0] != 1:
            return None
        return _Known(data.elements[start:end], False, data.boolean)
    if op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater"):
        if len(ins) != 2 or ins[0] is None or ins[1] is None:
            return None
        return _elementwise(op, ins[0], ins[1])
    if op == "Neg":
        ints = _ints(ins[0])
        return None if ints is None else _Known(tuple(-x for x in ints), ins[0].scalar)
    if op == "Not":
        data = ins[0]
        if data is None or not data.boolean:
            return None
        return _Known(tuple(1 - x for x in data.elements), data.scalar, True)  # type: ignore[operator]
    if op == "Where":
        condition, a, b = (ins + [None, None, None])[:3]
        if condition is None or a is None or b is None or not condition.boolean or a.boolean != b.boolean:
            return None
        n = max(len(condition.elements), len(a.elements), len(b.elements))
        if any(len(v.elements) not in (1, n) for v in (condition, a, b)):
            return None

        def at(v: _Known, i: int) -> Element:
            return v.elements[0] if len(v.elements) == 1 else v.elements[i]

        picked = tuple(at(a, i) if at(condition, i) else at(b, i) for i in range(n))
        return _Known(picked, condition.scalar and a.scalar and b.scalar, a.boolean)
    if op == "ScatterElements":       # (ortagent's slice gradient writes a Pad's pads so)
        data, indices, updates = (ins + [None, None, None])[:3]
        positions = _ints(indices)
        if data is None or data.scalar or positions is None or updates is None or updates.scalar \
                or len(positions) != len(updates.elements) or data.boolean != updates.boolean \
                or _attribute(node, "axis", 0) not in (0, -1) or _attribute(node, "reduction", b"none") not in (b"none", "none"):
            return None
        n = len(data.elements)
        positions = [p + n if p < 0 else p for p in positions]
        if any(not 0 <= p < n for p in positions) or len(set(positions)) != len(positions):
            return None
        elements = list(data.elements)
        for p, element in zip(positions, updates.elements):
            elements[p] = element
        return _Known(tuple(elements), False, data.boolean)
    return None


class _Builder:
    """Makes the canonical tensors: one per symbol, one per constant, one per distinct value."""

    def __init__(self, graph, names: NameAllocator, sources: dict[str, tuple[str, int, int]]) -> None:
        self.graph = graph
        self.names = names
        self.sources = sources
        self.nodes: list = []
        self._made: dict[tuple, str] = {}

    def tensor(self, known: _Known, before: int) -> str | None:
        """The canonical tensor of ``known`` for a node at position ``before``: None when a
        symbol of it has no source produced before that position. (The first node asking for a
        value is the earliest one that has it.)"""
        if known.static:
            return self._constant(known)
        key = (known.elements, known.scalar, known.boolean)
        if key in self._made:
            return self._made[key]
        if known.boolean or any(isinstance(e, str) and (e not in self.sources or self.sources[e][2] >= before)
                                  for e in known.elements):
            return None
        elif known.scalar:
            name = self.names.fresh("ortagent_dim")
            self.nodes.append(helper.make_node("Squeeze", [self._symbol(known.elements[0])], [name],
                                               name=self.names.fresh("ortagent_dim_scalar")))
        else:
            # runs of static sizes become constants; symbols read off consecutive axes of one
            # tensor are read together
            runs: list[list] = []
            for element in known.elements:
                last = runs[-1] if runs else None
                if isinstance(element, int):
                    if last is not None and last[0] == "ints":
                        last[1].append(element)
                    else:
                        runs.append(["ints", [element]])
                    continue
                source, axis, _ = self.sources[element]
                if last is not None and last[0] == "dims" and last[1] == source and last[3] == axis:
                    last[3] = axis + 1
                else:
                    runs.append(["dims", source, axis, axis + 1])
            pieces = [self._constant(_Known(tuple(run[1]), False)) if run[0] == "ints" else self._dims(*run[1:])
                      for run in runs]
            if len(pieces) == 1:
                name = pieces[0]
            else:
                name = self.names.fresh("ortagent_shape")
                self.nodes.append(helper.make_node("Concat", pieces, [name], axis=0,
                                                   name=self.names.fresh("ortagent_shape_concat")))
        self._made[key] = name
        return name

    def _symbol(self, symbol: str) -> str:
        """A 1-D int64 tensor holding the size of ``symbol``, read off its source."""
        source, axis, _ = self.sources[symbol]
        return self._dims(source, axis, axis + 1)

    def _dims(self, source: str, start: int, end: int) -> str:
        """``Shape(source, start, end)``, made once."""
        key = ("dims", source, start, end)
        if key not in self._made:
            name = self.names.fresh("ortagent_dims")
            self.nodes.append(helper.make_node("Shape", [source], [name], start=start, end=end,
                                               name=self.names.fresh("ortagent_dims_read")))
            self._made[key] = name
        return self._made[key]

    def _constant(self, known: _Known) -> str:
        """The initializer holding the static value ``known``, made once."""
        key = (known.elements, known.scalar, known.boolean)
        if key not in self._made:
            array = np.array(known.elements, dtype=np.bool_ if known.boolean else np.int64)
            name = self.names.fresh("ortagent_shape_constant")
            self.graph.initializer.append(numpy_helper.from_array(array.reshape(()) if known.scalar else array, name))
            self._made[key] = name
        return self._made[key]


def share_shape_values(model: ModelProto, stand_ins: dict | None = None, keep: frozenset = frozenset(),
                       declared: Sequence = (), cut: str | None = None) -> int:
    """Rewrite ``model`` in place so that each shape value is computed once (module docstring).

    ``stand_ins`` as :func:`ortagent._graph_passes.known_shapes` (a YieldOp gradient that may be
    broadcast must get no shape from them); ``keep``: op types kept even when nothing reads them;
    ``declared``: value_info known to hold (the exporter's symbolic shapes of the forward's
    values, which ONNX's inference does not always find again); ``cut``: the name of the node
    between a training graph's forward and backward (its YieldOp). Returns how many nodes fewer
    the graph has."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 15:      # (Shape has no start and end before opset 15)
        return 0
    shapes = inferred_dims(model, stand_ins, declared)
    if not shapes:
        return 0
    values: dict[str, _Known] = {}
    for init in graph.initializer:
        known = _constant_known(init)
        if known is not None:
            values[init.name] = known
    followed: dict[str, tuple[int, _Known]] = {}     # value -> (its node's position, its value)
    for position, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or not node.output[0]:
            continue
        if node.op_type == "Constant":
            tensor = _attribute(node, "value")
            known = _constant_known(tensor) if tensor is not None else None
            if known is not None:
                values[node.output[0]] = known
        elif node.op_type in _FOLLOWED:
            known = _value_of(node, values, shapes, opset)
            if known is not None:
                values[node.output[0]] = known
                followed[node.output[0]] = (position, known)
    if not followed:
        return 0

    # each symbol is read off the first tensor that has it (a graph input before any node's result)
    initializer_names = {init.name for init in graph.initializer}
    sources: dict[str, tuple[str, int, int]] = {}    # symbol -> (tensor, axis, its producer's position)

    def offer(name: str, position: int) -> None:
        if name in followed or name in initializer_names:
            return
        for axis, dim in enumerate(shapes.get(name) or ()):
            if isinstance(dim, str):
                sources.setdefault(dim, (name, axis, position))

    for value in graph.input:
        offer(value.name, -1)
    for position, node in enumerate(graph.node):
        for name in node.output:
            if name:
                offer(name, position)

    # a training graph's two halves each compute their own copies (the backward's from the
    # graph inputs where it can), rather than keep the forward's for the backward
    forward = _forward_nodes(graph, cut)
    written = "backward" if forward is not None else "forward"  # the side that writes the graph outputs
    nodes = list(graph.node)
    sides = ["forward" if forward is None or position in forward else "backward" for position in range(len(nodes))]
    names = NameAllocator(all_value_names(graph))
    builders = {side: _Builder(graph, names, sources) for side in ("forward", "backward")}
    readers: dict[str, set[str]] = {name: set() for name in followed}
    for position, node in enumerate(nodes):
        for name in node.input:
            if name in readers:
                readers[name].add(sides[position])
    outer = {name: sides[position] for position, node in enumerate(nodes) for sub in node_subgraphs(node)
             for name in outer_scope_names(sub)}
    outputs = {value.name for value in graph.output}
    for name in readers:
        if name in outer or name in outputs:
            readers[name].add(outer.get(name, written))
    replacement: dict[tuple[str, str], str] = {}
    replaced: set[str] = set()
    for name, (position, known) in followed.items():
        canonical = {side: builders[side].tensor(known, before=position) for side in sorted(readers[name])}
        if None in canonical.values():
            continue
        replaced.add(name)
        replacement.update(((name, side), tensor) for side, tensor in canonical.items())
    if not replaced:
        return 0
    for position, node in enumerate(nodes):
        for index, name in enumerate(node.input):
            if name in replaced:
                node.input[index] = replacement[(name, sides[position])]
    # a value read by a nested subgraph or written to a graph output keeps its name: an
    # Identity of the canonical tensor writes it
    kept = [helper.make_node("Identity", [replacement[(name, outer.get(name, written))]], [name],
                             name=names.fresh("ortagent_shape_kept"))
            for name in sorted(replaced) if name in outer or name in outputs]
    remaining = [node for node in nodes if not (len(node.output) == 1 and node.output[0] in replaced)]
    made = builders["forward"].nodes + builders["backward"].nodes
    _drop_dead(graph, topological_order(remaining + made + kept), keep)
    return len(nodes) - len(graph.node)


def _forward_nodes(graph, cut: str | None) -> set[int] | None:
    """The positions of the nodes that the node named ``cut`` needs, itself included: a training
    graph's forward; None when there is no such node."""
    nodes = list(graph.node)
    start = next((position for position, node in enumerate(nodes) if node.name == cut), None)
    if start is None:
        return None
    producers = {out: position for position, node in enumerate(nodes) for out in node.output if out}
    needed, stack = {start}, [start]
    while stack:
        for name in consumed_names(nodes[stack.pop()]):
            producer = producers.get(name)
            if producer is not None and producer not in needed:
                needed.add(producer)
                stack.append(producer)
    return needed
