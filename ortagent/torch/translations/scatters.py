"""Writes into a tensor at computed positions, which torch.onnx cannot translate:
``index_reduce`` (prod, mean, amin, amax), ``put`` (``Tensor.put``, accumulating or not),
``index_fill`` (torch's decomposition writes a repeated index more than once: see there),
``diagonal_scatter``; and ``as_strided_scatter`` is refused with its reason (torch's gradient
with respect to the input is wrong: it fails torch's own gradcheck, so no correct graph can
match eager).

Each is one ScatterElements:

* ``index_reduce(x, dim, index, source, reduce)`` is ``scatter_reduce`` with ``index`` spread
  over ``source``'s shape along ``dim``; the mean and the reducing scatters (mul, min, max) and
  their gradients are those of ``scatter_reduce`` (:mod:`.corrections`, the reverse rule of a
  reducing ScatterElements in :mod:`ortagent._ad_rules`).
* ``put`` scatters into the flattened tensor (negative indices counted from the end), with
  ``reduction="add"`` when it accumulates.
* ``diagonal_scatter`` and ``as_strided_scatter`` write ``src`` at flat positions that the
  static shape fixes at export: a constant table shaped as ``src``, built with numpy's own
  diagonal of the position grid (the same order as torch's ``diagonal``), or from ``size``,
  ``stride`` and ``storage_offset`` over the input as a contiguous tensor (how torch.export
  sees every tensor). Positions written twice (a stride of 0) have no defined order in
  torch: refused.

A ScatterElements without reduction is linear: the autodiff gives the written positions of
the input no gradient and ``src`` the gradient gathered at its positions, as torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import BOOL, INT64, axis, constant, ints, rank, static_dims


def _tensor(array: np.ndarray) -> Any:
    import onnx

    return onnx.numpy_helper.from_array(array)


def _scatter_reduce() -> Any:
    import torch

    from . import corrections

    return corrections.translations()[torch.ops.aten.scatter_reduce.two]


def index_reduce(x: Any, dim: int, index: Any, source: Any, reduce: str, include_self: bool = True) -> Any:
    n = rank(x)
    if n == 0:
        # one element: a ScatterElements over the tensor as a vector of one
        position = op.Reshape(op.Cast(index, to=INT64), ints([1]))
        flat = _scatter_reduce()(op.Reshape(x, ints([1])), 0, position, op.Reshape(source, ints([1])), reduce,
                                 include_self) if reduce == "mean" else None
        if flat is None:
            return _scatter_reduce()(x, 0, position, source, reduce, include_self)
        return op.Reshape(flat, ints([]))
    d = axis(dim, n)
    spread = op.Reshape(op.Cast(index, to=INT64), ints([1] * d + [-1] + [1] * (n - d - 1)))
    expanded = op.Expand(spread, op.Shape(source))
    return _scatter_reduce()(x, d, expanded, source, reduce, include_self)


def index_fill(x: Any, dim: int, index: Any, value: Any) -> Any:
    """``x`` with ``value`` along ``dim`` at ``index``, as a ``Where`` over a mask of the filled
    positions: each filled position once, however often ``index`` names it. (torch decomposes
    index_fill into index_copy of the expanded value, whose gradient with respect to ``value``
    counts a repeated index once per repetition; torch's own sums over the unique positions.)"""
    n = rank(x)
    flat = n == 0
    if flat:
        x = op.Reshape(x, ints([1]))
    d = axis(dim, max(n, 1))
    extent = op.Shape(x, start=d, end=d + 1)
    positions = op.Reshape(op.Cast(index, to=INT64), ints([-1]))
    none = op.ConstantOfShape(extent, value=_tensor(np.zeros(1, np.int64)))
    marks = op.Expand(op.Constant(value_int=1), op.Shape(positions))
    chosen = op.Cast(op.ScatterElements(none, positions, marks, axis=0), to=BOOL)     # [extent]
    chosen = op.Reshape(chosen, ints([-1] + [1] * (max(n, 1) - d - 1)))                # along dim, broadcast
    fill = op.CastLike(value, x) if hasattr(value, "shape") else constant(x, value)
    filled = op.Where(chosen, fill, x)
    return op.Reshape(filled, ints([])) if flat else filled


def put(x: Any, index: Any, source: Any, accumulate: bool = False) -> Any:
    flat = op.Reshape(x, ints([-1]))
    positions = op.Reshape(op.Cast(index, to=INT64), ints([-1]))
    count = op.Size(x)
    positions = op.Where(op.Less(positions, op.Constant(value_int=0)), op.Add(positions, count), positions)
    values = op.Reshape(source, ints([-1]))
    if accumulate:
        written = op.ScatterElements(flat, positions, values, axis=0, reduction="add")
    else:
        written = op.ScatterElements(flat, positions, values, axis=0)
    return op.Reshape(written, op.Shape(x))


def _scatter_at(x: Any, src: Any, positions: np.ndarray, what: str) -> Any:
    if np.unique(positions).size != positions.size:
        raise OrtNotImplemented(f"ortagent's {what}: the view writes some positions twice (torch leaves the "
                                "order of such writes undefined)")
    flat = op.Reshape(x, ints([-1]))
    table = op.Constant(value=_tensor(positions.reshape(-1).astype(np.int64)))
    written = op.ScatterElements(flat, table, op.Reshape(src, ints([-1])), axis=0)
    return op.Reshape(written, op.Shape(x))


def _grid(x: Any, what: str) -> np.ndarray:
    shape = static_dims(x, range(rank(x)), what)
    return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)


def diagonal_scatter(x: Any, src: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    n = rank(x)
    positions = np.diagonal(_grid(x, "diagonal_scatter"), int(offset), axis(dim1, n), axis(dim2, n))
    return _scatter_at(x, src, positions, "diagonal_scatter")


def as_strided_scatter(x: Any, src: Any, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    raise OrtNotImplemented(
        "ORTModule: as_strided_scatter is refused: torch's own gradient with respect to its input is not the "
        "derivative (it keeps the gradient at the written positions and drops it elsewhere; "
        "torch.autograd.gradcheck fails on it), so a correct graph would differ from eager")


def _as_strided_scatter(x: Any, src: Any, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    """The derivative-correct translation, kept for the day torch's gradient is fixed."""
    total = _grid(x, "as_strided_scatter").size
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    positions = np.full(size, int(storage_offset or 0), dtype=np.int64)
    for d, (extent, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = extent
        positions = positions + (np.arange(extent, dtype=np.int64) * step).reshape(shape)
    if positions.size and (positions.min() < 0 or positions.max() >= total):
        raise OrtNotImplemented("ortagent's as_strided_scatter: the view reaches outside the input")
    return _scatter_at(x, src, positions, "as_strided_scatter")


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.index_reduce.default: index_reduce,
        aten.index_fill.int_Tensor: index_fill,
        aten.index_fill.int_Scalar: index_fill,
        aten.put.default: put,
        aten.diagonal_scatter.default: diagonal_scatter,
        aten.as_strided_scatter.default: as_strided_scatter,
    }
