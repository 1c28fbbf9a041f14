"""Lowerings of the activation, softmax and dropout gradients."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import NodeProto, TensorProto

from ._emitter import Emitter
from ._registry import Lowering, lowers


@lowers("ReluGrad")
def _relu_grad(e: Emitter, node: NodeProto) -> None:
    dy, x = e.input(0), e.input(1)
    positive = e.op("Greater", x, e.scalar(0, x))
    e.op("Where", positive, dy, e.scalar(0, dy), out=e.output(0))


@lowers("LeakyReluGrad")
def _leaky_relu_grad(e: Emitter, node: NodeProto) -> None:
    dy, y = e.input(0), e.input(1)
    alpha = float(e.attr("alpha", 0.01))
    positive = e.op("Greater", y, e.scalar(0, y))
    e.op("Where", positive, dy, e.op("Mul", dy, e.scalar(alpha, dy)), out=e.output(0))


@lowers("SigmoidGrad")
def _sigmoid_grad(e: Emitter, node: NodeProto) -> None:
    def compute(dy: str, y: str) -> str:
        return e.op("Mul", e.op("Mul", dy, y), e.op("Sub", e.scalar(1, y), y))
    e.in_float(compute, e.input(0), e.input(1), out=e.output(0))


@lowers("TanhGrad")
def _tanh_grad(e: Emitter, node: NodeProto) -> None:
    def compute(dy: str, y: str) -> str:
        return e.op("Mul", dy, e.op("Sub", e.scalar(1, y), e.op("Mul", y, y)))
    e.in_float(compute, e.input(0), e.input(1), out=e.output(0))


def _gelu_derivative(e: Emitter, x: str) -> str:
    """d/dx of x * Phi(x): Phi(x) + x * phi(x)."""
    scaled = e.op("Mul", x, e.scalar(np.sqrt(0.5), x))
    if e.elem_type(x) == TensorProto.DOUBLE:
        # onnxruntime has no double Erf kernel (nor had the training build a double GeluGrad)
        erf = e.op("CastLike", e.op("Erf", e.cast_to(scaled, TensorProto.FLOAT)), x)
    else:
        erf = e.op("Erf", scaled)
    cdf = e.op("Mul", e.scalar(0.5, x), e.op("Add", e.scalar(1, x), erf))
    pdf = e.op("Mul", e.op("Exp", e.op("Mul", e.op("Mul", x, x), e.scalar(-0.5, x))),
               e.scalar(1.0 / np.sqrt(2.0 * np.pi), x))
    return e.op("Add", cdf, e.op("Mul", x, pdf))


def _fast_gelu_derivative(e: Emitter, x: str) -> str:
    """d/dx of the tanh approximation 0.5 x (1 + tanh(a (x + g x^3)))."""
    a, g = np.sqrt(2.0 / np.pi), 0.044715
    x2 = e.op("Mul", x, x)
    inner = e.op("Mul", e.op("Mul", x, e.op("Add", e.scalar(1, x), e.op("Mul", x2, e.scalar(g, x)))),
                 e.scalar(a, x))
    t = e.op("Tanh", inner)
    # d inner / dx = a (1 + 3 g x^2)
    dinner = e.op("Mul", e.op("Add", e.scalar(1, x), e.op("Mul", x2, e.scalar(3 * g, x))), e.scalar(a, x))
    one_minus_t2 = e.op("Sub", e.scalar(1, x), e.op("Mul", t, t))
    total = e.op("Add", e.op("Add", e.scalar(1, x), t), e.op("Mul", e.op("Mul", x, one_minus_t2), dinner))
    return e.op("Mul", e.scalar(0.5, x), total)


def _gelu_family(derivative: Callable[[Emitter, str], str], with_bias: bool) -> Lowering:
    def lower(e: Emitter, node: NodeProto) -> None:
        def compute(dy: str, x: str, *bias: str) -> str:
            if bias:
                x = e.typed_like(e.op("Add", x, bias[0]), x)
            return e.op("Mul", dy, derivative(e, x))
        names = [e.input(0), e.input(1)] + ([e.input(2)] if with_bias else [])
        e.in_float(compute, *names, out=e.output(0))
    return lower


lowers("GeluGrad")(_gelu_family(_gelu_derivative, False))
lowers("BiasGeluGrad_dX")(_gelu_family(_gelu_derivative, True))
lowers("FastGeluGrad")(_gelu_family(_fast_gelu_derivative, False))
lowers("BiasFastGeluGrad_dX")(_gelu_family(_fast_gelu_derivative, True))


@lowers("QuickGeluGrad")
def _quick_gelu_grad(e: Emitter, node: NodeProto) -> None:
    alpha = float(e.attr("alpha", 1.702))

    def compute(dy: str, x: str) -> str:
        ax = e.op("Mul", x, e.scalar(alpha, x))
        s = e.op("Sigmoid", ax)
        factor = e.op("Add", e.scalar(1, x), e.op("Mul", ax, e.op("Sub", e.scalar(1, x), s)))
        return e.op("Mul", dy, e.op("Mul", s, factor))
    e.in_float(compute, e.input(0), e.input(1), out=e.output(0))


# ---------------------------------------------------------------------------------------------
# softmax


def _softmax_axes(e: Emitter, opset13: bool, like: str) -> str:
    axis = int(e.attr("axis", -1 if opset13 else 1))
    if opset13:
        return e.ints([axis])
    return e.axes_from(axis, like)        # pre-13 Softmax: the input coerced to 2-D at `axis`


def _softmax_grad(opset13: bool) -> Lowering:
    def lower(e: Emitter, node: NodeProto) -> None:
        dy, y = e.input(0), e.input(1)
        axes = _softmax_axes(e, opset13, y)

        def compute(dy: str, y: str) -> str:
            total = e.reduce_sum(e.op("Mul", dy, y), axes, keepdims=1)
            return e.op("Mul", y, e.op("Sub", dy, total))
        e.in_float(compute, dy, y, out=e.output(0))
    return lower


def _log_softmax_grad(opset13: bool) -> Lowering:
    def lower(e: Emitter, node: NodeProto) -> None:
        dy, y = e.input(0), e.input(1)
        axes = _softmax_axes(e, opset13, y)

        def compute(dy: str, y: str) -> str:
            total = e.reduce_sum(dy, axes, keepdims=1)
            return e.op("Sub", dy, e.op("Mul", e.op("Exp", y), total))
        e.in_float(compute, dy, y, out=e.output(0))
    return lower


lowers("SoftmaxGrad_13")(_softmax_grad(True))
lowers("SoftmaxGrad")(_softmax_grad(False))
lowers("LogSoftmaxGrad_13")(_log_softmax_grad(True))
lowers("LogSoftmaxGrad")(_log_softmax_grad(False))


# ---------------------------------------------------------------------------------------------
# dropout


def _dropout_backward(e: Emitter, dy: str, mask: str, ratio: str | None, training: str | None,
                      out: str) -> None:
    """dx = mask ? dy / (1 - ratio) : 0; dy itself where ratio is 0 or training_mode is false."""
    ratio_value = e.constant(ratio)
    # the kernel computes 1 - ratio in float32 whatever the data type
    ratio_f = e.const(np.float32(0.5)) if ratio is None else e.op("Cast", ratio, to=TensorProto.FLOAT)
    training_value = e.constant(training)
    if training is not None and training_value is not None and not bool(np.all(training_value)):
        e.op("Identity", dy, out=out)
        return
    if ratio_value is not None and float(np.asarray(ratio_value).reshape(-1)[0]) == 0.0:
        e.op("Identity", dy, out=out)
        return
    kept = e.op("Div", dy, e.op("CastLike", e.op("Sub", e.const(np.float32(1)), ratio_f), dy))
    if ratio_value is None and ratio is not None:
        # a ratio known only at run time: 0 means the kernel passes dy through
        keep = e.op("Or", mask, e.op("Equal", ratio_f, e.const(np.float32(0))))
    else:
        keep = mask
    if training is not None and training_value is None:
        dropped = e.op("Where", keep, kept, e.scalar(0, dy))
        e.op("Where", training, dropped, dy, out=out)
    else:
        e.op("Where", keep, kept, e.scalar(0, dy), out=out)


@lowers("DropoutGrad")
def _dropout_grad(e: Emitter, node: NodeProto) -> None:
    _dropout_backward(e, e.input(0), e.input(1), e.input(2), e.input(3), e.output(0))


@lowers("BitmaskDropoutGrad")
def _bitmask_dropout_grad(e: Emitter, node: NodeProto) -> None:
    dy, packed = e.input(0), e.input(1)
    shifts = e.const(np.arange(32, dtype=np.uint32))
    words = e.op("Unsqueeze", packed, e.ints([-1]))
    bits = e.op("Mod", e.op("BitShift", words, shifts, direction="RIGHT"), e.const(np.uint32(2)))
    flat = e.op("Reshape", bits, e.ints([-1]))
    count = e.op("Reshape", e.op("Size", dy), e.ints([1]))
    first = e.op("Slice", flat, e.ints([0]), count)
    mask = e.op("Cast", e.op("Reshape", first, e.op("Shape", dy)), to=TensorProto.BOOL)
    _dropout_backward(e, dy, mask, e.input(2), e.input(3), e.output(0))
