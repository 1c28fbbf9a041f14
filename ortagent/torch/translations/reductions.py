"""Reductions and shape reductions torch.onnx cannot translate: ``amax``/``amin`` of a 0-d
tensor (torch.onnx's ReduceMax over axis 0 of a scalar is invalid ONNX), ``aminmax``, and
``squeeze`` over several dimensions; and ``linalg.vecdot`` (torch.onnx's translation fails in
onnxruntime for vectors of length 0), a ReduceSum of the product; ``_segment_reduce`` along
axis 0 (a ScatterElements with the reduction, each element sent to its segment).

ReduceMax and ReduceMin share the gradient evenly among tied extrema, as torch's amax, amin
and aminmax do; Squeeze and Identity carry their gradients unchanged.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import BOOL, INT64, axis, ints, rank


def _extremum(reduce: Any) -> Any:
    def extremum(x: Any, dim: Any = (), keepdim: bool = False) -> Any:
        n = rank(x)
        dims = [dim] if isinstance(dim, int) else list(dim or [])
        if n == 0:
            return op.Identity(x)           # every dimension of a scalar is the scalar
        axes = sorted({axis(d, n) for d in dims}) or list(range(n))
        return reduce(x, ints(axes), keepdims=1 if keepdim else 0)

    return extremum


def aminmax(x: Any, dim: Any = None, keepdim: bool = False) -> tuple[Any, Any]:
    n = rank(x)
    if n == 0:
        return op.Identity(x), op.Identity(x)
    axes = list(range(n)) if dim is None else [axis(dim, n)]
    keep = 1 if keepdim else 0
    if dim is None and not keepdim:
        return op.ReduceMin(x, ints(axes), keepdims=0), op.ReduceMax(x, ints(axes), keepdims=0)
    return op.ReduceMin(x, ints(axes), keepdims=keep), op.ReduceMax(x, ints(axes), keepdims=keep)


def squeeze_dims(x: Any, dims: Any) -> Any:
    """torch's ``squeeze(x, dims)``: the listed dimensions of size 1 are removed, the others
    kept; the sizes must be known at export (a symbolic size is never 1 in torch.export)."""
    n = rank(x)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if n == 0:
        return op.Identity(x)
    shape = x.shape
    ones = sorted({a for a in (axis(d, n) for d in dims) if isinstance(shape[a], int) and shape[a] == 1})
    if not ones:
        return op.Identity(x)
    return op.Squeeze(x, ints(ones))


def vecdot(x: Any, y: Any, dim: int = -1) -> Any:
    """The real vecdot: the sum of ``x * y`` over ``dim`` (after broadcasting)."""
    product = op.Mul(x, y)
    n = max(rank(x), rank(y))
    d = axis(dim, n)
    shape = getattr(product, "shape", None)
    if shape is not None and len(shape) == n and shape[d] == 0:
        # an empty sum: zeros shaped as the result (a ReduceSum over a zero-length axis
        # differentiates into a Reshape onnxruntime rejects)
        kept = [a for a in range(n) if a != d]
        zeros = op.Mul(op.ReduceSum(product, keepdims=0), op.CastLike(op.Constant(value_float=0.0), product))
        return op.Expand(zeros, op.Gather(op.Shape(product), ints(kept), axis=0)) if kept else zeros
    return op.ReduceSum(product, ints([d]), keepdims=0)


_SEGMENT_SCATTER = {"sum": "add", "mean": "add", "prod": "mul", "max": "max", "min": "min"}
_SEGMENT_START = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}


def segment_reduce(data: Any, reduce: str, lengths: Any = None, indices: Any = None, offsets: Any = None,
                   axis: int = 0, unsafe: bool = False, initial: Any = None) -> Any:
    """torch's ``_segment_reduce`` over axis 0 with 1-d ``lengths`` or ``offsets``: each
    segment starts from ``initial`` (or the reduction's identity) and takes in its elements by
    a ScatterElements with the matching reduction; the mean divides by the segment's length,
    an empty segment's mean being ``initial``, or NaN without one, as torch's kernel.

    torch checks (unless ``unsafe``) that the lengths are non-negative and add up to the
    data's length. The graph keeps that check: where it fails, every segment index is sent
    out of range, so onnxruntime's ScatterElements fails the run instead of returning a number."""
    if reduce not in _SEGMENT_SCATTER:
        raise OrtNotImplemented(f"_segment_reduce with reduce={reduce!r}")
    if indices is not None or (lengths is None) == (offsets is None):
        raise OrtNotImplemented("_segment_reduce with indices, or without exactly one of lengths and offsets")
    bounds = lengths if lengths is not None else offsets
    if rank(bounds) != 1 or axis != 0:
        raise OrtNotImplemented("_segment_reduce: only 1-d lengths or offsets (segments along axis 0)")
    zero, one = op.Constant(value_ints=[0]), op.Constant(value_ints=[1])
    if offsets is not None:
        offsets = op.Cast(offsets, to=INT64)
        lengths = op.Sub(op.Slice(offsets, one, ints([2 ** 62])), op.Slice(offsets, zero, ints([-1])))
    lengths = op.Cast(lengths, to=INT64)
    ends = op.CumSum(lengths, op.Constant(value_int=0))
    count = op.Gather(op.Shape(data), zero, axis=0)                                   # (1,)
    positions = op.Range(op.Constant(value_int=0), op.Squeeze(count, zero), op.Constant(value_int=1))
    # segment of element i: how many segments end at or before i
    segment = op.ReduceSum(op.Cast(op.LessOrEqual(op.Unsqueeze(ends, zero), op.Unsqueeze(positions, one)), to=INT64),
                           one, keepdims=0)
    segments = op.Shape(lengths)
    if not unsafe:
        total = op.ReduceSum(lengths, keepdims=1)
        valid = op.And(op.Equal(total, count),
                       op.Not(op.Cast(op.ReduceMax(op.Cast(op.Less(lengths, zero), to=INT64), keepdims=1), to=BOOL)))
        # (a ReduceMax of no lengths is the smallest int64: no negative length)
        segment = op.Where(valid, segment, op.Add(op.Squeeze(segments, zero), op.Squeeze(count, zero)))
    n = rank(data)
    trailing = ints(list(range(1, n))) if n > 1 else None
    index = op.Expand(op.Unsqueeze(segment, trailing) if n > 1 else segment, op.Shape(data))
    start = float(initial) if initial is not None else _SEGMENT_START[reduce]
    out_shape = op.Concat(segments, op.Slice(op.Shape(data), one, ints([2 ** 62])), axis=0)
    base = op.Expand(op.CastLike(op.Constant(value_float=start), data), out_shape)
    result = op.ScatterElements(base, index, data, axis=0, reduction=_SEGMENT_SCATTER[reduce])
    if reduce == "mean":
        size = op.CastLike(op.Unsqueeze(lengths, trailing) if n > 1 else lengths, data)
        empty = op.Equal(size, op.CastLike(op.Constant(value_float=0.0), data))
        divided = op.Div(result, op.Where(empty, op.CastLike(op.Constant(value_float=1.0), data), size))
        fill = op.CastLike(op.Constant(value_float=start if initial is not None else float("nan")), data)
        result = op.Where(empty, fill, divided)
    return result


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.amax.default: _extremum(op.ReduceMax),
        aten.amin.default: _extremum(op.ReduceMin),
        aten.aminmax.default: aminmax,
        aten.squeeze.dims: squeeze_dims,
        aten.squeeze.dim: squeeze_dims,
        aten.linalg_vecdot.default: vecdot,
        aten.segment_reduce.default: segment_reduce,
    }
