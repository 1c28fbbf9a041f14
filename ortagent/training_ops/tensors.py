"""Lowerings of the gather/slice/concat/split adjoints and of the broadcasting arithmetic ops."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto, numpy_helper

from ._emitter import INT64_MAX, Emitter
from ._registry import lowers


def _normalized_indices(e: Emitter, indices: str, size: str) -> str:
    """`indices` as int64 with negative entries wrapped by `size` (an int64 scalar)."""
    indices = e.int64(indices)
    negative = e.op("Less", indices, e.const(np.int64(0)))
    return e.op("Where", negative, e.op("Add", indices, size), indices)


@lowers("GatherGrad")
def _gather_grad(e: Emitter, node: NodeProto) -> None:
    shape, indices, dy = e.input(0), e.input(1), e.input(2)
    shape = e.int64(shape)
    axis = int(e.attr("axis", 0))
    size = e.op("Squeeze", e.op("Slice", shape, e.ints([axis]), e.ints([axis + 1 if axis != -1 else INT64_MAX])),
                e.ints([0]))
    idx = _normalized_indices(e, indices, size)
    if axis == 0:
        index = e.op("Unsqueeze", idx, e.ints([-1]))
        e.op("ScatterND", e.zeros(shape, dy), index, dy, out=e.output(0), reduction="add")
        return
    # [pre, q, post] -> [q, pre, post]; scatter the q rows into [s, pre, post]; transpose back
    pre = e.op("ReduceProd", e.op("Slice", shape, e.ints([0]), e.ints([axis])), keepdims=1)
    post_start = axis + 1 if axis != -1 else INT64_MAX
    post = e.op("ReduceProd", e.op("Slice", shape, e.ints([post_start]), e.ints([INT64_MAX])), keepdims=1)
    count = e.op("Reshape", e.op("Size", idx), e.ints([1]))
    dy3 = e.op("Reshape", dy, e.op("Concat", pre, count, post, axis=0))
    dyt = e.op("Transpose", dy3, perm=[1, 0, 2])
    zeros = e.zeros(e.op("Concat", e.op("Reshape", size, e.ints([1])), pre, post, axis=0), dy)
    index = e.op("Reshape", idx, e.ints([-1, 1]))
    scattered = e.op("ScatterND", zeros, index, dyt, reduction="add")
    back = e.op("Transpose", scattered, perm=[1, 0, 2])
    e.op("Reshape", back, shape, out=e.output(0))


@lowers("GatherElementsGrad")
def _gather_elements_grad(e: Emitter, node: NodeProto) -> None:
    dy, shape, indices = e.input(0), e.input(1), e.input(2)
    shape = e.int64(shape)
    axis = int(e.attr("axis", 0))
    e.op("ScatterElements", e.zeros(shape, dy), indices, dy, out=e.output(0), axis=axis, reduction="add")


@lowers("GatherNDGrad")
def _gather_nd_grad(e: Emitter, node: NodeProto) -> None:
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


@lowers("SliceGrad")
def _slice_grad(e: Emitter, node: NodeProto) -> None:
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


@lowers("ConcatTraining")
def _concat_training(e: Emitter, node: NodeProto) -> None:
    axis = int(e.attr("axis"))
    inputs = [name for name in node.input if name]
    e.op("Concat", *inputs, out=e.output(0), axis=axis)
    lengths = e.output(1)
    if lengths:
        end = axis + 1 if axis != -1 else None
        pieces = [e.op("Shape", name, start=axis, end=end) for name in inputs]
        e.op("Concat", *pieces, out=lengths, axis=0)


@lowers("SplitTraining")
def _split_training(e: Emitter, node: NodeProto) -> None:
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


def _sum_to_shape(e: Emitter, grad: str, target: str, out: str) -> None:
    """`grad` summed over the axes along which a tensor of `target`'s shape was broadcast."""
    grad_shape, target_shape = e.shape(grad), e.shape(target)
    if grad_shape is not None and grad_shape == target_shape and None not in grad_shape:
        e.op("Identity", grad, out=out)
        return
    shape = e.op("Shape", target)
    axes = _broadcast_axes(e, shape, e.op("Shape", grad))
    summed = e.op("ReduceSum", grad, axes, keepdims=1, noop_with_empty_axes=1)
    e.op("Reshape", summed, shape, out=out)


def _padded_shape(e: Emitter, shape: str, rank: str) -> str:
    """`shape` with ones in front up to `rank` entries."""
    missing = e.op("Sub", rank, e.op("Size", shape))
    ones = e.op("ConstantOfShape", e.op("Reshape", missing, e.ints([1])),
                value=numpy_helper.from_array(np.array([1], np.int64)))
    return e.op("Concat", ones, shape, axis=0)


def _broadcast_axes(e: Emitter, shape: str, out_shape: str) -> str:
    """The axes of `out_shape` along which a tensor of `shape` (right-aligned) was broadcast."""
    rank = e.op("Size", out_shape)
    padded = _padded_shape(e, shape, rank)
    differs = e.op("Not", e.op("Equal", padded, out_shape))
    return e.op("Reshape", e.op("NonZero", differs), e.ints([-1]))


@lowers("DivGrad")
def _div_grad(e: Emitter, node: NodeProto) -> None:
    dy, a, b = e.input(0), e.input(1), e.input(2)
    da, db = e.output(0), e.output(1)
    if da:
        _sum_to_shape(e, e.op("Div", dy, b), a, da)
    if db:
        quotient = e.op("Div", e.op("Div", e.op("Mul", dy, a), b), b)
        _sum_to_shape(e, e.op("Neg", quotient), b, db)


@lowers("BroadcastGradientArgs")
def _broadcast_gradient_args(e: Emitter, node: NodeProto) -> None:
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


@lowers("ReduceSumTraining")
def _reduce_sum_training(e: Emitter, node: NodeProto) -> None:
    e.op("ReduceSum", *[name for name in node.input], out=e.output(0),
         keepdims=int(e.attr("keepdims", 1)), noop_with_empty_axes=int(e.attr("noop_with_empty_axes", 0)))


@lowers("Scale")
def _scale(e: Emitter, node: NodeProto) -> None:
    data, factor = e.input(0), e.input(1)
    # the kernel reads the factor as float32 and scales down by its float32 reciprocal
    factor = e.op("Reshape", e.op("Cast", factor, to=TensorProto.FLOAT), e.ints([]))
    if int(e.attr("scale_down", 0)):
        factor = e.op("Reciprocal", factor)
    e.op("Mul", data, e.cast_like(factor, data), out=e.output(0))


@lowers("ScaledSum")
def _scaled_sum(e: Emitter, node: NodeProto) -> None:
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


@lowers("BatchScale")
def _batch_scale(e: Emitter, node: NodeProto) -> None:
    data = e.input(0)
    for index in range(len(node.output)):
        if e.output(index):
            e.op("Mul", data, e.scalar(float(e.attr(f"scale_{index}")), data), out=e.output(index))
