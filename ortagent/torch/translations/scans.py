"""Cumulative operators torch.onnx cannot translate: ``cumprod``, ``cummax`` and ``cummin``.

All three are scans of an associative combination along one axis of a size known at export,
computed in ``ceil(log2(n))`` steps (each position combines with the one ``2^k`` before it;
positions before the start combine with the identity):

* cumprod: Mul, whose gradient the autodiff takes exactly, also through zeros (torch's own
  backward special-cases them);
* cummax / cummin: the later of two values wins unless the earlier is strictly larger
  (smaller), torch's rule for ties, and carries its index along; the value passes through
  Where, so its gradient goes to the one position whose value it is, as torch's scatter of the
  gradient to the indices does.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ._common import INT64, axis, constant, ints, rank, static_dims


def _shifted(x: Any, step: int, fill: Any, dim: int, length: int) -> Any:
    """``x`` moved ``step`` positions later along ``dim``, the first ``step`` positions ``fill``."""
    head = op.Slice(x, ints([0]), ints([length - step]), ints([dim]))
    filler = op.Expand(fill, op.Shape(op.Slice(x, ints([0]), ints([step]), ints([dim]))))
    return op.Concat(filler, head, axis=dim)


def cumprod(x: Any, dim: int, dtype: Any = None) -> Any:
    n = rank(x)
    d = axis(dim, n)
    (length,) = static_dims(x, [d], "cumprod") if n else (1,)
    if dtype is not None:
        from .corrections import _onnx_type

        x = op.Cast(x, to=_onnx_type(dtype))
    if n == 0:
        return op.Identity(x)
    one = constant(x, 1.0)
    step = 1
    while step < length:
        x = op.Mul(x, _shifted(x, step, one, d, length))
        step *= 2
    return x


def _cumulative_extremum(larger: bool) -> Any:
    def cumulative(x: Any, dim: int) -> tuple[Any, Any]:
        n = rank(x)
        if n == 0:
            return op.Identity(x), op.Constant(value_int=0)
        d = axis(dim, n)
        (length,) = static_dims(x, [d], "cummax" if larger else "cummin")
        positions = ints(range(length))
        shape = [1] * n
        shape[d] = length
        index = op.Expand(op.Reshape(positions, ints(shape)), op.Shape(x))
        start = constant(x, float("-inf") if larger else float("inf"))
        none = op.Constant(value_int=-1)
        step = 1
        while step < length:
            earlier = _shifted(x, step, start, d, length)
            earlier_index = _shifted(index, step, none, d, length)
            wins = op.Greater(earlier, x) if larger else op.Less(earlier, x)
            x = op.Where(wins, earlier, x)
            index = op.Where(wins, earlier_index, index)
            step *= 2
        return x, op.Cast(index, to=INT64)

    return cumulative


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.cumprod.default: cumprod,
        aten.cummax.default: _cumulative_extremum(True),
        aten.cummin.default: _cumulative_extremum(False),
    }
