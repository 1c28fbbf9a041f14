"""Extremes whose gradient torch routes otherwise than the autodiff's rule for the operator
torch.onnx writes, where they differ at a tie.

* ``max(x, dim)`` / ``min(x, dim)``: torch.onnx writes ReduceMax (ReduceMin) beside ArgMax
  (ArgMin), and a reduction shares a tie's gradient among all the tied elements, where torch
  gives it whole to the position the returned index names (the first of them). Here the value
  is gathered at that index, so the gradient goes there; ``amax``/``amin`` and the
  whole-tensor ``max()``/``min()``, which torch shares evenly, keep the reduction.
* ``clamp``, ``clamp_min``, ``clamp_max`` with tensor bounds (torch's export also writes a
  number bound this way, as a 0-d constant tensor): torch.onnx writes a Clip for a 0-d bound
  and Max/Min otherwise, where torch's convention depends on whether the bound is a number
  (no gradient at the bound, as ortagent's Clip rule) or a tensor (a tie's gradient shared
  between the input and the bound, as ortagent's Max/Min rules). Here a constant bound gives
  a Clip and a tensor bound of any shape a Max/Min. (Where a tensor ``min`` equals ``max``,
  or a bound is NaN, torch's gradient is a formula of its own, which this does not follow.)

Ties between the operands of ``maximum``/``minimum`` and the bounds of Clip need no
translation: ortagent's reverse rules for Max, Min and Clip (:mod:`ortagent._ad_rules`) give
torch's gradients there.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ._common import axis, ints, rank


def _at_extreme_index(arg_extreme: Any) -> Any:
    def select(x: Any, dim: int, keepdim: bool = False) -> tuple[Any, Any]:
        n = rank(x)
        if n == 0:
            return op.Identity(x), op.Constant(value_int=0)
        d = axis(dim, n)
        index = arg_extreme(x, axis=d, keepdims=1)           # the first extreme, as torch's
        value = op.GatherElements(x, index, axis=d)
        if not keepdim:
            value, index = op.Squeeze(value, ints([d])), op.Squeeze(index, ints([d]))
        return value, index

    return select


def _from_a_number(bound: Any) -> bool:
    """Whether ``bound`` is a 0-d constant of the graph (torch's export writes a number bound
    of clamp as a 0-d tensor, a Cast of a Constant), not a tensor the caller passed."""
    shape = getattr(bound, "shape", None)
    if shape is None or len(shape) != 0:
        return False
    for _ in range(4):
        if getattr(bound, "const_value", None) is not None:
            return True
        producer = bound.producer() if hasattr(bound, "producer") else None
        if producer is None:
            return False
        if producer.op_type == "Constant":
            return True
        if producer.op_type not in ("Cast", "CastLike", "Identity") or not producer.inputs:
            return False
        bound = producer.inputs[0]
    return False


def _tensor_bounds(x: Any, low: Any = None, high: Any = None) -> Any:
    bounds = [b for b in (low, high) if b is not None]
    if not bounds:
        return op.Identity(x)
    if all(_from_a_number(b) for b in bounds):
        # a number bound: Clip, which keeps a tie's gradient off as torch does for numbers
        return op.Clip(x, None if low is None else op.CastLike(low, x), None if high is None else op.CastLike(high, x))
    # tensor bounds: torch shares a tie between the input and the bound, as Max and Min do
    # (min == max, or a NaN bound, aside: there torch's formula is its own)
    clamped = x
    if low is not None:
        clamped = op.Max(clamped, op.CastLike(low, x))
    if high is not None:
        clamped = op.Min(clamped, op.CastLike(high, x))
    return clamped


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.max.dim: _at_extreme_index(op.ArgMax),
        aten.min.dim: _at_extreme_index(op.ArgMin),
        aten.clamp.Tensor: _tensor_bounds,
        aten.clamp_min.Tensor: lambda x, low: _tensor_bounds(x, low, None),
        aten.clamp_max.Tensor: lambda x, high: _tensor_bounds(x, None, high),
    }
