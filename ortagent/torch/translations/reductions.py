"""Reductions and shape reductions torch.onnx cannot translate: ``amax``/``amin`` of a 0-d
tensor (torch.onnx's ReduceMax over axis 0 of a scalar is invalid ONNX), ``aminmax``, and
``squeeze`` over several dimensions.

ReduceMax and ReduceMin share the gradient evenly among tied extrema, as torch's amax, amin
and aminmax do; Squeeze and Identity carry their gradients unchanged.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ._common import axis, ints, rank


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


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.amax.default: _extremum(op.ReduceMax),
        aten.amin.default: _extremum(op.ReduceMin),
        aten.aminmax.default: aminmax,
        aten.squeeze.dims: squeeze_dims,
        aten.squeeze.dim: squeeze_dims,
    }
