"""Sequences of a length fixed in the graph, unrolled into plain tensors before differentiation.

torch's ONNX exporter writes ``torch.hstack`` / ``vstack`` / ``dstack`` / ``column_stack`` (and
other list-taking functions) as ``SequenceConstruct`` -> ``SequenceMap`` (a body applied to each
element) -> ``SequenceAt`` at constant positions -> ``Concat``. onnx-ad has no rules for the
sequence operators, but such a sequence is only a list of named tensors: this pass replaces

* ``SequenceMap`` over sequences of known elements by a copy of its body per element,
* ``SequenceAt`` at a constant position of such a sequence by an ``Identity`` of the element,
* ``ConcatFromSequence`` of one by ``Concat`` (``Unsqueeze`` first with ``new_axis=1``),
* ``SequenceLength`` of one by a constant,

and drops the sequence operators left without consumers. ``torch.split`` / ``unbind`` /
``chunk`` export as ``SplitToSequence`` read by ``SequenceAt`` at constant positions; such a
sequence's elements are pieces of one tensor: one ``Split`` (whose reverse is a ``Concat``)
when the sizes of the pieces are known (a constant list of sizes, or the split axis's static
extent), else, for a symbolic extent, one ``Slice`` per position read (``unbind``: followed by
a ``Squeeze``; negative positions only where no size is given). Sequences built by loops are
left alone, and onnx-ad's refusal of them stands. Pure Python over ``onnx``; the rewrite is
exact (it moves no element).

A sequence a ``Loop`` builds by appending one tensor per iteration (``SequenceEmpty`` before
the loop, ``SequenceInsert`` at the end in its body) and that is only concatenated after it
(``ConcatFromSequence`` on axis 0: torch's ``embedding_bag`` stacks its bags so) becomes a scan
output of the loop, which stacks the same tensors on a new leading axis (onnx-ad differentiates
loops with scan outputs): the concatenation is then that stack with its two leading axes
merged (``new_axis=0``) or the stack itself (``new_axis=1``). The tensors must then all have one
shape, which onnxruntime checks.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from ._onnx_graph import NameAllocator, all_value_names, constant_values, consumed_names

__all__ = ["unroll_static_sequences"]

_SEQUENCE_OPS = {"SequenceConstruct", "SequenceMap", "SequenceAt", "ConcatFromSequence", "SequenceLength",
                 "SplitToSequence", "SequenceEmpty"}
_INT64_MAX = 2**63 - 1


def _attribute(node: NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def unroll_static_sequences(model: ModelProto) -> int:
    """Rewrite ``model``'s main graph in place (see the module's docstring); returns how many
    sequence operators were replaced."""
    graph = model.graph
    if not any(node.op_type in _SEQUENCE_OPS and node.domain in ("", "ai.onnx") for node in graph.node):
        return 0
    stacked = _stack_loop_sequences(graph)
    if stacked:
        kept = _without_unused_sequences(graph, list(graph.node))
        del graph.node[:]
        graph.node.extend(kept)
    constants = constant_values(graph)
    names = NameAllocator(all_value_names(graph))
    elements: dict[str, list[str]] = {}        # sequence name -> its element tensors
    rewritten: list[NodeProto] = []
    pieces: dict[str, _Pieces] = {}            # SplitToSequence results -> how to cut them
    if any(node.op_type == "SplitToSequence" for node in graph.node):
        from ._graph_passes import known_shapes

        shapes = known_shapes(model)
        opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)
        for node in graph.node:
            if node.op_type == "SplitToSequence" and node.domain in ("", "ai.onnx") and opset >= 13:
                found = _Pieces.of(node, constants, shapes, names, rewritten)
                if found is not None:
                    pieces[node.output[0]] = found

    def items_of(sequence: str) -> list[str] | None:
        if sequence not in elements and sequence in pieces:
            every = pieces[sequence].every()
            if every is not None:
                elements[sequence] = every
        return elements.get(sequence)

    replaced = 0
    for node in graph.node:
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type == "SequenceConstruct":
            elements[node.output[0]] = list(node.input)
            rewritten.append(node)
            continue
        if standard and node.op_type == "SequenceMap" and items_of(node.input[0]) is not None:
            outputs = _inline_map(node, elements, names, rewritten)
            if outputs is not None:
                elements.update(outputs)
                replaced += 1
                continue
        if standard and node.op_type == "SequenceAt" and node.input[0] in pieces and \
                node.input[0] not in elements and items_of(node.input[0]) is None:
            position = constants.get(node.input[1])
            piece = pieces[node.input[0]].at(int(position)) if position is not None and position.size == 1 else None
            if piece is not None:
                rewritten.append(helper.make_node("Identity", [piece], [node.output[0]], name=node.name))
                replaced += 1
                continue
        if standard and node.op_type == "SequenceAt" and items_of(node.input[0]) is not None:
            position = constants.get(node.input[1])
            items = elements[node.input[0]]
            if position is not None and position.size == 1 and -len(items) <= int(position) < len(items):
                rewritten.append(helper.make_node("Identity", [items[int(position)]], [node.output[0]],
                                                  name=node.name))
                replaced += 1
                continue
        if standard and node.op_type == "ConcatFromSequence" and items_of(node.input[0]) is not None:
            axis, new_axis = _attribute(node, "axis", 0), _attribute(node, "new_axis", 0)
            items = elements[node.input[0]]
            if new_axis:
                axes = names.fresh(node.output[0] + "_axes")
                rewritten.append(helper.make_node("Constant", [], [axes],
                                                  value=numpy_helper.from_array(np.array([axis], np.int64))))
                expanded = []
                for item in items:
                    expanded.append(names.fresh(item + "_unsqueezed"))
                    rewritten.append(helper.make_node("Unsqueeze", [item, axes], [expanded[-1]]))
                items = expanded
            rewritten.append(helper.make_node("Concat", items, [node.output[0]], name=node.name, axis=axis))
            replaced += 1
            continue
        if standard and node.op_type == "SequenceLength" and items_of(node.input[0]) is not None:
            count = np.array(len(elements[node.input[0]]), np.int64)
            rewritten.append(helper.make_node("Constant", [], [node.output[0]], name=node.name,
                                              value=numpy_helper.from_array(count)))
            replaced += 1
            continue
        rewritten.append(node)
    if not replaced:
        return stacked
    del graph.node[:]
    graph.node.extend(_without_unused_sequences(graph, rewritten))
    return replaced + stacked


def _attribute_graph(node: NodeProto, name: str):
    return next((attr.g for attr in node.attribute if attr.name == name), None)


def _stack_loop_sequences(graph) -> int:
    """Turn the sequences Loops build by appending into scan outputs (see the module's
    docstring), in place; returns how many."""
    producers = {name: node for node in graph.node for name in node.output}
    readers: dict[str, list[NodeProto]] = {}
    for node in graph.node:
        for name in consumed_names(node):
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    names = NameAllocator(all_value_names(graph))
    changed = 0
    for loop in list(graph.node):
        if loop.op_type != "Loop" or loop.domain not in ("", "ai.onnx"):
            continue
        body = _attribute_graph(loop, "body")
        carried = len(loop.input) - 2
        for j in reversed(range(carried)):
            initial, final = loop.input[2 + j], loop.output[j]
            start = producers.get(initial)
            users = readers.get(final, [])
            if start is None or start.op_type != "SequenceEmpty" or readers.get(initial) != [loop] \
                    or final in outputs or len(users) != 1 or users[0].op_type != "ConcatFromSequence" \
                    or _attribute(users[0], "axis", 0) != 0:
                continue
            inner_in, inner_out = body.input[2 + j].name, body.output[1 + j].name
            insert = next((node for node in body.node if inner_out in node.output), None)
            inner_readers = [node for node in body.node if inner_in in consumed_names(node)]
            if insert is None or insert.op_type != "SequenceInsert" or len(insert.input) != 2 \
                    or insert.input[0] != inner_in or inner_readers != [insert] \
                    or any(value.name in (inner_in, inner_out) for value in body.output if value.name != inner_out) \
                    or sum(value.name == inner_out for value in body.output) != 1:
                continue
            element_type = body.output[1 + j].type.sequence_type.elem_type.tensor_type.elem_type or \
                next((attr.i for attr in start.attribute if attr.name == "dtype"), 1)
            row = names.fresh(f"{inner_out}_row")
            kept = [node for node in body.node if node is not insert]
            kept.append(helper.make_node("Identity", [insert.input[1]], [row]))
            del body.node[:]
            body.node.extend(kept)
            del body.input[2 + j]
            del body.output[1 + j]
            body.output.append(helper.make_tensor_value_info(row, element_type, None))
            stack = names.fresh(f"{final}_stacked")
            del loop.input[2 + j]
            del loop.output[j]
            loop.output.append(stack)
            concat = users[0]
            position = list(graph.node).index(concat)
            if _attribute(concat, "new_axis", 0):
                made = [helper.make_node("Identity", [stack], [concat.output[0]], name=concat.name)]
            else:
                shape, tail, minus_one, target = (names.fresh(f"{stack}_{part}") for part in
                                                  ("shape", "tail", "minus_one", "target"))
                made = [helper.make_node("Shape", [stack], [shape]),
                        helper.make_node("Constant", [], [minus_one],
                                         value=numpy_helper.from_array(np.array([-1], np.int64))),
                        helper.make_node("Shape", [stack], [tail], start=2),
                        helper.make_node("Concat", [minus_one, tail], [target], axis=0),
                        helper.make_node("Reshape", [stack, target], [concat.output[0]], name=concat.name)]
                del made[0]
            del graph.node[position]
            for offset, node in enumerate(made):
                graph.node.insert(position + offset, node)
            changed += 1
    return changed


class _Pieces:
    """The elements of a ``SplitToSequence`` as pieces of its input, made (into the node list
    being built) when first read: all at once by one ``Split`` when the sizes are known, else
    one ``Slice`` per position read."""

    def __init__(self, node: NodeProto, sizes: list[int] | None, size: int | None, names: NameAllocator,
                 nodes: list[NodeProto]) -> None:
        self.node, self.sizes, self.size, self.names, self.nodes = node, sizes, size, names, nodes
        self.axis = _attribute(node, "axis", 0)
        # without a split operand the pieces have size 1, and keepdims=0 drops their axis
        self.squeeze = len(node.input) < 2 or not node.input[1]
        self.squeeze = self.squeeze and not _attribute(node, "keepdims", 1)
        self.made: list[str] | None = None
        self.sliced: dict[int, str] = {}

    @staticmethod
    def of(node: NodeProto, constants: dict, shapes: dict, names: NameAllocator,
           nodes: list[NodeProto]) -> _Pieces | None:
        data = node.input[0]
        axis = _attribute(node, "axis", 0)
        shape = shapes.get(data)
        extent = None
        if shape is not None and -len(shape) <= axis < len(shape) and isinstance(shape[axis], int):
            extent = shape[axis]
        if len(node.input) > 1 and node.input[1]:
            split = constants.get(node.input[1])
            if split is None or split.ndim > 1 or (split < 0).any():
                return None
            if split.ndim == 1:
                return _Pieces(node, [int(v) for v in split], None, names, nodes)
            size = int(split)
            if size <= 0:
                return None
            if extent is None:
                return _Pieces(node, None, size, names, nodes)
            sizes = [size] * (extent // size) + ([extent % size] if extent % size else [])
            return _Pieces(node, sizes, None, names, nodes)
        if extent is None:
            return _Pieces(node, None, 1, names, nodes)
        return _Pieces(node, [1] * extent, None, names, nodes)

    def _constant(self, stem: str, values: list[int]) -> str:
        name = self.names.fresh(stem)
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=numpy_helper.from_array(np.array(values, np.int64))))
        return name

    def _finished(self, piece: str) -> str:
        if not self.squeeze:
            return piece
        squeezed = self.names.fresh(piece + "_squeezed")
        self.nodes.append(helper.make_node("Squeeze", [piece, self._constant(piece + "_axis", [self.axis])],
                                           [squeezed]))
        return squeezed

    def every(self) -> list[str] | None:
        """Every element (one Split), or None when their count is not known."""
        if self.sizes is None:
            return None
        if self.made is None:
            stem = self.node.output[0]
            outputs = [self.names.fresh(f"{stem}_{index}") for index in range(len(self.sizes))]
            if self.sizes:
                sizes = self._constant(stem + "_sizes", self.sizes)
                self.nodes.append(helper.make_node("Split", [self.node.input[0], sizes], outputs,
                                                   name=self.names.fresh(stem + "_split"), axis=self.axis))
            self.made = [self._finished(output) for output in outputs]
        return self.made

    def at(self, position: int) -> str | None:
        """The element at ``position`` (a Slice of the input), or None where it is not known
        without the sequence's length."""
        if position in self.sliced:
            return self.sliced[position]
        assert self.size is not None
        if position < 0 and self.size != 1:
            return None
        start = position * self.size
        end = start + self.size
        stem = f"{self.node.output[0]}_{position}"
        piece = self.names.fresh(stem)
        self.nodes.append(helper.make_node("Slice", [self.node.input[0], self._constant(stem + "_start", [start]),
                                                     self._constant(stem + "_end", [end if end != 0 else _INT64_MAX]),
                                                     self._constant(stem + "_axes", [self.axis])], [piece]))
        self.sliced[position] = self._finished(piece)
        return self.sliced[position]


def _inline_map(node: NodeProto, elements: dict[str, list[str]], names: NameAllocator,
                nodes: list[NodeProto]) -> dict[str, list[str]] | None:
    """The body of ``node`` (a SequenceMap) copied once per element into ``nodes``; returns
    its output sequences' elements, or None (nothing added) where it cannot be unrolled."""
    body = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "body"), None)
    if body is None or body.initializer:
        return None                         # (initializers of its own: left to onnx-ad)
    length = len(elements[node.input[0]])
    operands = []
    for name in node.input:
        if name in elements:
            if len(elements[name]) != length:
                return None
            operands.append(elements[name])
        else:
            operands.append([name] * length)      # a tensor: the same for every element
    outputs: dict[str, list[str]] = {name: [] for name in node.output}
    stem = node.output[0]
    for index in range(length):
        renamed = {value.name: operands[position][index] for position, value in enumerate(body.input)}
        nodes.extend(_copied(body.node, renamed, names, f"{stem}_{index}"))
        for sequence, value in zip(node.output, body.output):
            outputs[sequence].append(renamed.get(value.name, value.name))
    return outputs


def _copied(body_nodes, renamed: dict[str, str], names: NameAllocator, stem: str) -> list[NodeProto]:
    """Copies of ``body_nodes`` whose every defined name is fresh (``renamed`` gains them), in
    nested graphs too (If branches, Loop bodies), so that copies never share a name."""
    copies = []
    for body_node in body_nodes:
        copy = NodeProto()
        copy.CopyFrom(body_node)
        copy.name = names.fresh(f"{stem}_{body_node.name or body_node.op_type}")
        copy.input[:] = [renamed.get(name, name) for name in body_node.input]
        for name in body_node.output:
            if name:
                renamed[name] = names.fresh(f"{stem}_{name}")
        copy.output[:] = [renamed.get(name, name) for name in body_node.output]
        for attr in copy.attribute:
            subgraphs = [attr.g] if attr.type == 5 else list(attr.graphs) if attr.type == 10 else []
            for subgraph in subgraphs:
                scope = dict(renamed)
                for value in subgraph.input:
                    scope[value.name] = names.fresh(f"{stem}_{value.name}")
                    value.name = scope[value.name]
                inner = _copied(list(subgraph.node), scope, names, stem)
                del subgraph.node[:]
                subgraph.node.extend(inner)
                for value in subgraph.output:
                    value.name = scope.get(value.name, value.name)
        copies.append(copy)
    return copies


def _without_unused_sequences(graph, nodes: list[NodeProto]) -> list[NodeProto]:
    """``nodes`` (in order) less the sequence operators whose results nothing reads any more."""
    needed = {value.name for value in graph.output}
    kept = []
    for node in reversed(nodes):
        if node.op_type in _SEQUENCE_OPS and node.domain in ("", "ai.onnx") and \
                not any(name in needed for name in node.output):
            continue
        kept.append(node)
        needed.update(consumed_names(node))
    kept.reverse()
    return kept
