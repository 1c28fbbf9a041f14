"""Binary elementwise operators torch.onnx cannot translate: ``fmax``, ``fmin``, ``copysign``
and ``hypot``.

Each picks or combines its operands with Where, Abs and Sqrt, so the gradient takes torch's
branch: ``fmax``/``fmin`` share a tie's gradient evenly and ignore a NaN operand (the other
one is the result and takes the whole gradient, where torch also gives one to the NaN operand
itself: the one difference, confined to NaN inputs), ``copysign`` moves the gradient of ``|a|`` to the
result with ``b``'s sign (0 at ``a == 0``) and none to ``b``.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ._common import DOUBLE, INT32, constant, stop_gradient


def _nan_ignoring(first_wins: Any) -> Any:
    def pick(a: Any, b: Any) -> Any:
        b = op.CastLike(b, a)
        keep_a = op.Or(first_wins(a, b), op.IsNaN(b))
        picked = op.Where(keep_a, a, b)
        # a tie shares the gradient evenly, as torch does; (a + b) / 2 is then a itself
        half_each = op.Mul(op.Add(a, b), constant(a, 0.5))
        return op.Where(op.Equal(a, b), half_each, picked)

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


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.fmax.default: _nan_ignoring(op.GreaterOrEqual),
        aten.fmin.default: _nan_ignoring(op.LessOrEqual),
        aten.copysign.Tensor: copysign,
        aten.copysign.Scalar: copysign,
        aten.hypot.default: hypot,
        torch.ops.prims.frexp.default: frexp,
    }
