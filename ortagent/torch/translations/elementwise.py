"""Binary elementwise operators torch.onnx cannot translate: ``fmax``, ``fmin``, ``copysign``,
``hypot``, (float32) ``nextafter``, and ``rsub`` of a Python number (``1.0 - mask``), whose
decomposition torch.onnx cannot run for an integer tensor (XLNet's ``1.0 - attention_mask``).

Each picks or combines its operands with Where, Abs and Sqrt, so the gradient takes torch's
branch: ``fmax``/``fmin`` share a tie's gradient evenly and ignore a NaN operand (the other
one is the result and takes the whole gradient, where torch also gives one to the NaN operand
itself: the one difference, confined to NaN inputs), ``copysign`` moves the gradient of ``|a|`` to the
result with ``b``'s sign (0 at ``a == 0``) and none to ``b``.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import DOUBLE, FLOAT, INT32, INT64, constant, stop_gradient


def _nan_ignoring(extreme: Any) -> Any:
    def pick(a: Any, b: Any) -> Any:
        b = op.CastLike(b, a)
        # a NaN operand is replaced by the other one; Max/Min's rule (ortagent/_ad_rules.py)
        # halves a tie's gradient, as torch does (the value stays exact: a mean of the tied
        # operands overflowed beyond half the largest float)
        return extreme(op.Where(op.IsNaN(a), b, a), op.Where(op.IsNaN(b), a, b))

    return pick


def copysign(a: Any, b: Any) -> Any:
    if isinstance(b, (int, float)):
        b = op.Constant(value_float=float(b))
    magnitude = op.Abs(a)
    sign_source = op.CastLike(b, magnitude)
    # b's sign bit: negative, or -0.0 (whose reciprocal is -inf)
    negative = op.Or(op.Less(sign_source, constant(magnitude, 0.0)),
                     op.Equal(op.Reciprocal(sign_source), constant(magnitude, float("-inf"))))
    return op.Where(negative, op.Neg(magnitude), magnitude)


def hypot(a: Any, b: Any) -> Any:
    b = op.CastLike(b, a)
    return op.Sqrt(op.Add(op.Mul(a, a), op.Mul(b, b)))


def frexp(x: Any) -> tuple[Any, Any]:
    """(mantissa, exponent) with ``x = mantissa * 2^exponent``, ``0.5 <= |mantissa| < 1``
    (0, inf and NaN keep exponent 0). The exponent from log2 is corrected by one either way
    where rounding put the mantissa out of its range; the mantissa is ``x`` times a constant
    factor, so its gradient is ``2^-exponent``, as torch's."""
    xd = op.Cast(x, to=DOUBLE)
    magnitude = op.Abs(xd)
    regular = op.And(op.Greater(magnitude, constant(xd, 0.0)), op.Not(op.IsInf(xd)))
    safe = op.Where(regular, magnitude, constant(xd, 1.0))
    exponent = op.Add(op.Floor(op.Div(op.Log(safe), constant(xd, 0.6931471805599453))), constant(xd, 1.0))
    for _ in range(2):
        scaled = op.Div(safe, op.Pow(constant(xd, 2.0), exponent))
        exponent = op.Add(exponent, op.Sub(op.Cast(op.GreaterOrEqual(scaled, constant(xd, 1.0)), to=DOUBLE),
                                           op.Cast(op.Less(scaled, constant(xd, 0.5)), to=DOUBLE)))
    exponent = op.Where(regular, exponent, constant(xd, 0.0))
    factor = op.CastLike(op.Pow(constant(xd, 2.0), op.Neg(exponent)), x)
    return op.Mul(x, stop_gradient(factor)), op.Cast(exponent, to=INT32)    # int32, as torch


_FLOAT32_MAX = 3.4028234663852886e38


def nextafter(x: Any, y: Any) -> Any:
    """The float32 next to ``x`` toward ``y`` (``y`` itself when equal, NaN with a NaN), by
    arithmetic in float64, where every float32 and its neighbours' spacing are exact: the
    spacing above ``|x| = m 2^e`` (1 <= m < 2) is ``2^(e-23)``, below it the same unless ``|x|``
    is a power of two (then half), and never under the subnormal spacing ``2^-149``. float64
    inputs are refused (their neighbours need bit access ONNX's opset 18 lacks). The
    gradient is torch's: 1 to ``x`` where it differs from ``y`` (and is finite), none to ``y``."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or getattr(dtype, "name", "") != "FLOAT":
        raise OrtNotImplemented("ortagent's nextafter supports float32 tensors only")
    xd, yd = op.Cast(x, to=DOUBLE), op.Cast(op.CastLike(y, x), to=DOUBLE)
    xd = op.Where(op.Equal(yd, yd), xd, xd)                 # (broadcast to the result's shape)
    two = constant(xd, 2.0)
    magnitude = op.Abs(xd)
    regular = op.And(op.Greater(magnitude, constant(xd, 0.0)), op.Not(op.IsInf(xd)))
    safe = op.Where(regular, magnitude, constant(xd, 1.0))
    exponent = op.Floor(op.Div(op.Log(safe), constant(xd, 0.6931471805599453)))
    for _ in range(2):          # log2's rounding corrected: 2^e <= |x| < 2^(e+1)
        power = op.Pow(two, exponent)
        exponent = op.Add(exponent, op.Sub(op.Cast(op.GreaterOrEqual(safe, op.Mul(power, two)), to=DOUBLE),
                                           op.Cast(op.Less(safe, power), to=DOUBLE)))
    power = op.Pow(two, exponent)
    tiniest = op.Pow(two, constant(xd, -149.0))
    above = op.Max(op.Mul(power, op.Pow(two, constant(xd, -23.0))), tiniest)
    below = op.Where(op.Equal(safe, power), op.Max(op.Mul(power, op.Pow(two, constant(xd, -24.0))), tiniest), above)
    up = op.Greater(yd, xd)
    away = op.Equal(up, op.Greater(xd, constant(xd, 0.0)))               # moving away from zero
    step = op.Where(away, above, below)
    moved = op.Where(up, op.Add(xd, step), op.Sub(xd, step))
    moved = op.Where(op.Equal(xd, constant(xd, 0.0)), op.Where(up, tiniest, op.Neg(tiniest)), moved)
    largest = constant(xd, _FLOAT32_MAX)
    moved = op.Where(op.IsInf(xd), op.Where(up, op.Neg(largest), largest), moved)
    value = op.Where(op.Equal(xd, yd), yd, moved)
    value = op.Where(op.Or(op.IsNaN(xd), op.IsNaN(yd)), constant(xd, float("nan")), value)
    value = op.CastLike(value, x)
    finite = op.Where(op.IsInf(x), constant(x, 0.0), x)
    offset = op.Where(op.Equal(x, op.CastLike(y, x)), constant(x, 0.0), op.Sub(finite, stop_gradient(finite)))
    return op.Add(stop_gradient(value), offset)


_INTEGRAL = {"BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64"}


def rsub_scalar(x: Any, other: Any, alpha: Any = 1) -> Any:
    """``other - alpha * x`` for a number ``other``, in torch's promoted type: an integer or
    boolean tensor with a float number computes in the default float type, a boolean one with
    integers in int64."""
    import torch

    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise OrtNotImplemented("rsub: ortagent's translation needs the element type of its tensor")
    if dtype.name in _INTEGRAL and (isinstance(other, float) or isinstance(alpha, float)):
        x = op.Cast(x, to=DOUBLE if torch.get_default_dtype() == torch.float64 else FLOAT)
    elif dtype.name == "BOOL":
        x = op.Cast(x, to=INT64)

    def number(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OrtNotImplemented(f"rsub of a {type(value).__name__}")
        literal = op.Constant(value_int=value) if isinstance(value, int) else op.Constant(value_float=value)
        return op.CastLike(literal, x)

    scaled = x if alpha == 1 else op.Mul(x, number(alpha))
    return op.Sub(number(other), scaled)


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.fmax.default: _nan_ignoring(op.Max),
        aten.fmin.default: _nan_ignoring(op.Min),
        aten.copysign.Tensor: copysign,
        aten.copysign.Scalar: copysign,
        aten.hypot.default: hypot,
        torch.ops.prims.frexp.default: frexp,
        aten.nextafter.default: nextafter,
        aten.rsub.Scalar: rsub_scalar,
    }
