"""Lowerings of the ATen operators ORTModule's exporter writes (embedding, pooling)."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto

from ._emitter import Emitter
from ._registry import lowers_aten
from .convolution import average_pool_backward


def _aten_flag(e: Emitter, index: int, default: int = 0) -> int:
    name = e.input(index)
    if name is None:
        return default
    value = e.constant(name)
    if value is None:
        raise e.error(f"input {index} of ATen {e.attr('operator')!r} must be a constant")
    return int(np.asarray(value).reshape(-1)[0])


def _aten_ints(e: Emitter, index: int, default: list[int]) -> list[int]:
    name = e.input(index)
    if name is None:
        return default
    value = e.constant(name)
    if value is None:
        raise e.error(f"input {index} of ATen {e.attr('operator')!r} must be a constant")
    return [int(v) for v in np.asarray(value).reshape(-1)]


@lowers_aten("embedding")
def _aten_embedding(e: Emitter, node: NodeProto) -> None:
    weight, indices = e.input(0), e.input(1)
    e.op("Gather", weight, indices, out=e.output(0), axis=0)


@lowers_aten("embedding_backward")
def _aten_embedding_backward(e: Emitter, node: NodeProto) -> None:
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


def _pair(values: list[int]) -> list[int]:
    """An ATen int[2] argument given as one int (the same for both spatial axes)."""
    return values * 2 if len(values) == 1 else values


def _pool_arguments(e: Emitter, first: int):
    """ATen's kernel_size, stride and padding (inputs first..first+2) for a 2-D pool: kernel and
    strides as two ints (no stride: the kernel size), the pads as ONNX's four."""
    kernel = _pair(_aten_ints(e, first, []))
    strides = _pair(_aten_ints(e, first + 1, [])) or list(kernel)
    padding = _pair(_aten_ints(e, first + 2, [0]))
    return kernel, strides, padding + padding


@lowers_aten("max_pool2d_with_indices")
def _aten_max_pool2d(e: Emitter, node: NodeProto) -> None:
    x = e.input(0)
    kernel, strides, pads = _pool_arguments(e, 1)
    dilation = _pair(_aten_ints(e, 4, [1, 1]))
    ceil_mode = _aten_flag(e, 5, 0)
    values = e.output(0) or e.names.fresh(f"{e.stem}/values")
    onnx_indices = e.names.fresh(f"{e.stem}/onnx_indices")
    e.op("MaxPool", x, out=[values, onnx_indices], kernel_shape=kernel, strides=strides, pads=pads,
         dilations=dilation, ceil_mode=ceil_mode)
    if e.output(1):
        # ONNX indices run over the whole NCHW tensor, ATen's within each (n, c) plane
        plane = e.op("ReduceProd", e.op("Shape", x, start=2), keepdims=0)
        e.op("Mod", onnx_indices, plane, out=e.output(1))


@lowers_aten("max_pool2d_with_indices_backward")
def _aten_max_pool2d_backward(e: Emitter, node: NodeProto) -> None:
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


@lowers_aten("avg_pool2d")
def _aten_avg_pool2d(e: Emitter, node: NodeProto) -> None:
    x = e.input(0)
    kernel, strides, pads = _pool_arguments(e, 1)
    ceil_mode = _aten_flag(e, 4, 0)
    count_include_pad = _aten_flag(e, 5, 1)
    if e.input(6) is not None:
        raise e.error("divisor_override is not lowered")
    e.op("AveragePool", x, out=e.output(0), kernel_shape=kernel, strides=strides, pads=pads,
         ceil_mode=ceil_mode, count_include_pad=count_include_pad)


@lowers_aten("avg_pool2d_backward")
def _aten_avg_pool2d_backward(e: Emitter, node: NodeProto) -> None:
    grad, x = e.input(0), e.input(1)
    kernel, strides, pads = _pool_arguments(e, 2)
    if _aten_flag(e, 5, 0):
        raise e.error("ceil_mode is not lowered for the average pool gradient")
    count_include_pad = bool(_aten_flag(e, 6, 1))
    if e.input(7) is not None:
        raise e.error("divisor_override is not lowered")
    average_pool_backward(e, grad, e.op("Shape", x), kernel, strides, pads, count_include_pad, e.output(0))


def _adaptive_pool_matrix(e: Emitter, size: str, bins: str) -> str:
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


def _dim(e: Emitter, value: str, axis: int) -> str:
    return e.op("Squeeze", e.op("Shape", value, start=axis, end=axis + 1), e.ints([0]))


def _adaptive_matrices(e: Emitter, x: str, pooled_h: str, pooled_w: str, like: str) -> tuple[str, str]:
    rows = e.cast_like(_adaptive_pool_matrix(e, _dim(e, x, 2), pooled_h), like)
    cols = e.cast_like(_adaptive_pool_matrix(e, _dim(e, x, 3), pooled_w), like)
    return rows, cols


@lowers_aten("_adaptive_avg_pool2d")
def _aten_adaptive_avg_pool2d(e: Emitter, node: NodeProto) -> None:
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


@lowers_aten("_adaptive_avg_pool2d_backward")
def _aten_adaptive_avg_pool2d_backward(e: Emitter, node: NodeProto) -> None:
    grad, x = e.input(0), e.input(1)
    shape = e.shape(grad)
    if shape is not None and len(shape) == 4 and shape[2:] == [1, 1]:
        plane = e.op("CastLike", e.op("ReduceProd", e.op("Shape", x, start=2), keepdims=0), grad)
        e.op("Expand", e.op("Div", grad, plane), e.op("Shape", x), out=e.output(0))
        return
    # dX = P_h^T @ dY @ P_w, the bins read from the gradient's own shape
    rows, cols = _adaptive_matrices(e, x, _dim(e, grad, 2), _dim(e, grad, 3), grad)
    e.op("MatMul", e.op("MatMul", e.op("Transpose", rows, perm=[1, 0]), grad), cols, out=e.output(0))
