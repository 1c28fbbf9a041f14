"""Helpers shared by the translation families: constants shaped like a value, static sizes,
axis normalisation, and the StopGradient marker for attaching a known derivative."""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

DOUBLE = 11             # ONNX's element type numbers
FLOAT = 1
INT64 = 7
INT32 = 6
BOOL = 9


def constant(like: Any, value: float) -> Any:
    """A scalar ``value`` of ``like``'s element type."""
    return op.CastLike(op.Constant(value_float=float(value)), like)


def ints(values: Any) -> Any:
    return op.Constant(value_ints=[int(v) for v in values])


def rank(x: Any) -> int:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise OrtNotImplemented("ortagent's translation needs the rank of its operand")
    return len(shape)


def axis(dim: int, size: int) -> int:
    """``dim`` as a non-negative axis of a tensor of rank ``size`` (a 0-d tensor has axis 0)."""
    if size == 0:
        if dim not in (0, -1):
            raise OrtNotImplemented(f"dimension {dim} of a 0-d tensor")
        return 0
    if not -size <= dim < size:
        raise OrtNotImplemented(f"dimension {dim} of a tensor of rank {size}")
    return dim % size


def static_dims(x: Any, axes: Any, what: str) -> list[int]:
    """The sizes of ``x`` along ``axes``, which must be known at export (the bridge then exports
    again with the call's static shapes)."""
    shape = getattr(x, "shape", None)
    sizes = []
    for a in axes:
        size = None if shape is None else shape[a]
        if not isinstance(size, int):
            raise OrtNotImplemented(f"ortagent's translation of {what} needs a static size on axis {a}")
        sizes.append(size)
    return sizes


def safe_softmax(x: Any, axis: int) -> Any:
    """Softmax over ``axis`` that gives zeros to a slice whose values are all ``-inf`` (torch's
    ``_safe_softmax``: an attention row that sees no key), with no NaN in its gradient either
    (the slice's values are replaced before the Softmax)."""
    hidden = op.Cast(op.ReduceMin(op.Cast(op.Equal(x, constant(x, float("-inf"))), to=FLOAT), ints([axis]),
                                  keepdims=1), to=BOOL)
    zero = constant(x, 0.0)
    return op.Where(hidden, zero, op.Softmax(op.Where(hidden, zero, x), axis=axis))


def as_double(x: Any) -> Any:
    return op.Cast(x, to=DOUBLE)


def stop_gradient(x: Any) -> Any:
    """``x``, through which no gradient flows (ortagent's StopGradient marker)."""
    import onnxscript

    from ortagent._ad_rules import DOMAIN
    from .corrections import _register_stop_gradient_schema

    _register_stop_gradient_schema()
    stopped = onnxscript.values.Opset(DOMAIN, 1).StopGradient(x)
    # ONNX shape inference knows nothing of the marker: a Reshape to x's own shape gives the
    # result x's rank, which the autodiff needs
    return op.Reshape(stopped, op.Shape(x))


def with_derivative(x: Any, value: Any, derivative: Any) -> Any:
    """``value`` (a function of ``x``, computed any way) whose gradient is ``derivative`` times
    the incoming one: ``value + derivative * (x - x)`` with the value, the derivative and the
    subtracted ``x`` cut from the gradient, so the value is exact and only the middle ``x``
    carries the gradient."""
    offset = op.Sub(x, stop_gradient(x))            # 0, with derivative 1
    return op.Add(stop_gradient(value), op.Mul(stop_gradient(derivative), offset))
