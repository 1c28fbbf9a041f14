"""Order statistics torch.onnx cannot translate: ``kthvalue``, ``median`` and ``nanmedian``
(over all elements or along one dimension), and ``mode`` (pairwise counts: the most frequent
value, the smallest among ties, at its last position, as torch's CPU kernel).

All select with TopK (smallest first), whose gradient the autodiff routes to the selected
position. The whole-tensor ``median`` and ``nanmedian`` share their gradient evenly among the
elements equal to the result, as torch does; along a dimension the gradient goes to the one
position the returned index names, as torch's does. ``nanmedian`` sorts NaN last (as +inf) and
takes the lower median of the others: a slice of NaN only is NaN.

``masked_select`` (the elements a boolean mask picks, a length known only at run time) is
GatherND at NonZero's positions.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ._common import BOOL, INT64, axis, constant, ints, rank, static_dims, stop_gradient


def _ascending(x: Any, count: Any, dim: int) -> tuple[Any, Any]:
    values, indices = op.TopK(x, op.Reshape(count, ints([1])), axis=dim, largest=0, sorted=1)
    return values, indices


def _pick(values: Any, indices: Any, position: Any, dim: int, keepdim: bool) -> tuple[Any, Any]:
    """The entries at ``position`` along ``dim`` (a tensor broadcastable to one slice, rank kept)."""
    value = op.GatherElements(values, position, axis=dim)
    index = op.GatherElements(indices, position, axis=dim)
    if not keepdim:
        value, index = op.Squeeze(value, ints([dim])), op.Squeeze(index, ints([dim]))
    return value, op.Cast(index, to=INT64)


def _slice_position(x: Any, dim: int, position: Any) -> Any:
    """``position`` (an int64 tensor of one slice's shape with ``dim`` kept) spread over every slice."""
    one_slice = op.Shape(op.Slice(x, ints([0]), ints([1]), ints([dim])))
    return op.Expand(position, one_slice)


def kthvalue(x: Any, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Any, Any]:
    n = rank(x)
    if n == 0:
        return op.Identity(x), op.Constant(value_int=0)
    d = axis(dim, n)
    values, indices = _ascending(x, op.Constant(value_int=int(k)), d)
    position = _slice_position(values, d, op.Constant(value_ints=[int(k) - 1]))
    return _pick(values, indices, position, d, keepdim)


def _lower_median_position(count: Any) -> Any:
    """(count - 1) // 2 for an int64 count >= 1 (0 for an empty count)."""
    one = op.Constant(value_int=1)
    return op.Div(op.Max(op.Sub(count, one), op.Constant(value_int=0)), op.Constant(value_int=2))


def _evenly_among_equal(x: Any, result: Any) -> Any:
    """``result`` (the value of some elements of ``x``) whose gradient is shared evenly among
    the elements of ``x`` equal to it."""
    result = stop_gradient(result)
    matches = op.Equal(x, result)
    count = op.ReduceSum(op.CastLike(matches, x), keepdims=0)
    offset = op.Where(matches, op.Sub(x, stop_gradient(x)), constant(x, 0.0))      # 0, not NaN - NaN
    share = op.Div(op.ReduceSum(offset, keepdims=0), stop_gradient(op.Max(count, constant(x, 1.0))))
    return op.Add(result, share)


def _whole(ignore_nan: bool) -> Any:
    def median(x: Any) -> Any:
        flat = op.Reshape(x, ints([-1]))
        size = op.Size(flat)
        if ignore_nan:
            nan = op.IsNaN(flat)
            keys = op.Where(nan, constant(x, float("inf")), flat)
            count = op.ReduceSum(op.Cast(op.Not(nan), to=INT64), keepdims=0)
        else:
            keys, count = flat, size
        position = _lower_median_position(count)
        values, _ = _ascending(keys, op.Add(position, op.Constant(value_int=1)), 0)
        value = op.Gather(values, position, axis=0)
        if ignore_nan:
            value = op.Where(op.Equal(count, op.Constant(value_int=0)), constant(x, float("nan")), value)
        else:
            # torch's median is NaN when any element is NaN
            any_nan = op.Cast(op.ReduceMax(op.Cast(op.IsNaN(flat), to=INT64), keepdims=0), to=BOOL)
            value = op.Where(any_nan, constant(x, float("nan")), value)
        return _evenly_among_equal(x, value)

    return median


def _along(ignore_nan: bool) -> Any:
    def median(x: Any, dim: int = -1, keepdim: bool = False) -> tuple[Any, Any]:
        n = rank(x)
        if n == 0:
            return op.Identity(x), op.Constant(value_int=0)
        d = axis(dim, n)
        (length,) = static_dims(x, [d], "median" if not ignore_nan else "nanmedian")
        nan = op.IsNaN(x)
        keys = op.Where(nan, constant(x, float("inf")), x)
        values, indices = _ascending(keys, op.Constant(value_int=length), d)
        values = op.GatherElements(x, indices, axis=d)      # the NaNs back, and the gradient's path
        if ignore_nan:
            count = op.ReduceSum(op.Cast(op.Not(nan), to=INT64), ints([d]), keepdims=1)
            position = _lower_median_position(count)
        else:
            # any NaN makes the slice's median NaN: then torch returns a NaN's position
            has_nan = op.ReduceMax(op.Cast(nan, to=INT64), ints([d]), keepdims=1)
            lower = _slice_position(x, d, op.Constant(value_ints=[(length - 1) // 2]))
            first_nan = op.ReduceSum(op.Cast(op.Not(nan), to=INT64), ints([d]), keepdims=1)
            position = op.Where(op.Cast(has_nan, to=BOOL), first_nan, lower)
        return _pick(values, indices, position, d, keepdim)

    return median


def mode(x: Any, dim: int = -1, keepdim: bool = False) -> tuple[Any, Any]:
    """torch's mode along ``dim``: the most frequent value (the smallest among equally frequent
    ones) and the last position holding it, through which the gradient flows. Frequencies come
    from comparing every pair of a slice's entries (memory quadratic in the slice's length)."""
    n = rank(x)
    if n == 0:
        return op.Identity(x), op.Constant(value_int=0)
    d = axis(dim, n)
    (length,) = static_dims(x, [d], "mode")
    pairs = op.Equal(op.Unsqueeze(x, ints([d + 1])), op.Unsqueeze(x, ints([d])))        # axes d, d + 1
    counts = op.ReduceSum(op.CastLike(pairs, x), ints([d + 1]), keepdims=0)
    frequent = op.Equal(counts, op.ReduceMax(counts, ints([d]), keepdims=1))
    value = op.ReduceMin(op.Where(frequent, x, constant(x, float("inf"))), ints([d]), keepdims=1)
    positions = op.Reshape(op.Range(op.Constant(value_int=0), op.Constant(value_int=length), op.Constant(value_int=1)),
                           ints([length] + [1] * (n - d - 1)))
    at = op.Where(op.Equal(x, value), positions, op.Constant(value_int=-1))
    index = op.ReduceMax(at, ints([d]), keepdims=1)
    values = op.GatherElements(x, index, axis=d)
    if not keepdim:
        values, index = op.Squeeze(values, ints([d])), op.Squeeze(index, ints([d]))
    return values, op.Cast(index, to=INT64)


def masked_select(x: Any, mask: Any) -> Any:
    """The elements of ``x`` where ``mask`` holds (both broadcast to one shape), in row-major
    order, as one flat tensor of a length known at run time: GatherND at NonZero's positions,
    whose gradient scatters back to them (:mod:`ortagent._ad_rules`)."""
    x_full = op.Expand(x, op.Shape(mask))
    mask_full = op.Expand(mask, op.Shape(x_full))
    if max(rank(x), rank(mask)) == 0:
        x_full, mask_full = op.Reshape(x_full, ints([1])), op.Reshape(mask_full, ints([1]))
    positions = op.Transpose(op.NonZero(mask_full), perm=[1, 0])
    return op.GatherND(x_full, positions)


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.kthvalue.default: kthvalue,
        aten.median.default: _whole(False),
        aten.nanmedian.default: _whole(True),
        aten.median.dim: _along(False),
        aten.nanmedian.dim: _along(True),
        aten.mode.default: mode,
        aten.masked_select.default: masked_select,
    }
