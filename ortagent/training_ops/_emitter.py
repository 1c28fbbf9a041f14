"""The Emitter: builds the standard-op replacement of one training-op node."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from onnx import NodeProto, TensorProto, TypeProto, helper, numpy_helper

from .._onnx_graph import NameAllocator
from ..errors import UnsupportedTrainingOpError

INT64_MAX = np.iinfo(np.int64).max
NARROW_FLOATS = {TensorProto.FLOAT16, TensorProto.BFLOAT16}


class Emitter:
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
        if elem is not None and elem not in NARROW_FLOATS and elem != TensorProto.STRING:
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
        if elem in NARROW_FLOATS:
            wide = [self.cast_to(n, TensorProto.FLOAT) for n in names]
            self.op("Cast", compute(*wide), out=out, to=elem)
        else:
            self.write(compute(*names), out)


def in_compute_type(e: Emitter, name: str) -> str:
    """`name` in float32 when it is float16/bfloat16 (the kernels compute in float32)."""
    return e.cast_to(name, TensorProto.FLOAT) if e.elem_type(name) in NARROW_FLOATS else name
