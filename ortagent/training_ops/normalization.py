"""Lowerings of the layer norm and batch norm training ops."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, numpy_helper

from ._emitter import Emitter, in_compute_type
from ._registry import lowers


def _layer_norm_backward(e: Emitter, dy: str, x_hat: str, scale: str, inv_std: str, centered: bool) -> None:
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


@lowers("LayerNormalizationGrad")
def _layer_norm_grad(e: Emitter, node: NodeProto) -> None:
    dy, x, scale, mean, inv_std = (in_compute_type(e, e.input(i)) for i in range(5))
    x_hat = e.op("Mul", e.op("Sub", x, mean), inv_std)
    _layer_norm_backward(e, dy, x_hat, scale, inv_std, centered=True)


@lowers("SimplifiedLayerNormalizationGrad")
def _simplified_layer_norm_grad(e: Emitter, node: NodeProto) -> None:
    dy, x, scale, inv_std = (in_compute_type(e, e.input(i)) for i in range(4))
    x_hat = e.op("Mul", x, inv_std)
    _layer_norm_backward(e, dy, x_hat, scale, inv_std, centered=False)


@lowers("InvertibleLayerNormalizationGrad")
def _invertible_layer_norm_grad(e: Emitter, node: NodeProto) -> None:
    dy, y, scale, bias, inv_std = (in_compute_type(e, e.input(i)) for i in range(5))
    x_hat = e.op("Div", e.op("Sub", y, bias), scale)
    _layer_norm_backward(e, dy, x_hat, scale, inv_std, centered=True)


def _per_channel(e: Emitter, vector: str, like: str) -> str:
    """A [C] vector reshaped to [1, C, 1, ...] to broadcast over `like` (N, C, spatial...)."""
    rank = e.rank(like)
    if rank is not None:
        return e.op("Reshape", vector, e.ints([1, -1] + [1] * (rank - 2)))
    ones = e.op("ConstantOfShape", e.op("Shape", e.op("Shape", like, start=2)),
                value=numpy_helper.from_array(np.array([1], np.int64)))
    return e.op("Reshape", vector, e.op("Concat", e.ints([1, -1]), ones, axis=0))


@lowers("BatchNormInternal")
def _batch_norm_internal(e: Emitter, node: NodeProto) -> None:
    x, scale, bias, running_mean, running_var = (e.input(i) for i in range(5))
    epsilon = float(e.attr("epsilon", 1e-5))
    momentum = float(e.attr("momentum", 0.9))
    if not int(e.attr("training_mode", 1)):
        e.op("BatchNormalization", x, scale, bias, running_mean, running_var, out=e.output(0), epsilon=epsilon)
        return
    axes = e.channel_axes(x)
    xu = in_compute_type(e, x)
    count = e.count_over(xu, axes)
    mean = e.op("Div", e.reduce_sum(xu, axes, keepdims=1), count)
    centered = e.op("Sub", xu, mean)
    var = e.op("Div", e.reduce_sum(e.op("Mul", centered, centered), axes, keepdims=1), count)
    inv_std = e.op("Reciprocal", e.op("Sqrt", e.op("Add", var, e.scalar(epsilon, var))))
    normalized = e.op("Mul", centered, inv_std)
    y = e.op("Add", e.op("Mul", normalized, _per_channel(e, in_compute_type(e, scale), x)), _per_channel(e, in_compute_type(e, bias), x))
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


@lowers("BatchNormalizationGrad")
def _batch_norm_grad(e: Emitter, node: NodeProto) -> None:
    dy, x, scale, saved_mean, saved_inv_std = (e.input(i) for i in range(5))
    axes = e.channel_axes(x)
    dyu, xu = in_compute_type(e, dy), in_compute_type(e, x)
    mean = _per_channel(e, in_compute_type(e, saved_mean), x)
    inv_std = _per_channel(e, in_compute_type(e, saved_inv_std), x)
    x_hat = e.op("Mul", e.op("Sub", xu, mean), inv_std)
    d_bias = e.reduce_sum(dyu, axes, keepdims=0)
    d_scale = e.reduce_sum(e.op("Mul", dyu, x_hat), axes, keepdims=0)
    if e.output(0):
        count = e.count_over(xu, axes)
        inner = e.op("Sub", e.op("Sub", e.op("Mul", dyu, count), _per_channel(e, d_bias, x)),
                     e.op("Mul", x_hat, _per_channel(e, d_scale, x)))
        factor = e.op("Div", e.op("Mul", _per_channel(e, in_compute_type(e, scale), x), inv_std), count)
        e.op("CastLike", e.op("Mul", factor, inner), x, out=e.output(0))
    if e.output(1):
        e.op("CastLike", d_scale, scale, out=e.output(1))
    if e.output(2):
        e.op("CastLike", d_bias, scale, out=e.output(2))
