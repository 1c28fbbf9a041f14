"""Pairwise distances torch.onnx cannot translate: ``cdist`` (``aten._cdist_forward``) and
``pdist`` (``aten._pdist_forward``), and ``nonzero_static`` (which torch's ``combinations``
decomposes to).

Distances are the p-norms of the pairwise differences through ortagent's own vector norm
(:mod:`.corrections`), whose gradient is torch's, 0 at a zero distance included; ``pdist``
reads its pairs ``i < j`` (row-major, as torch orders them) with constant Gathers; with fewer
than two rows there is no pair, and the result is an empty vector (zeros expanded from the
input's sum, so the input still gets its zero gradient).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxscript import opset18 as op

from ._common import INT64, ints, rank, static_dims


def _norm() -> Any:
    import torch

    from . import corrections

    return corrections.translations()[torch.ops.aten.linalg_vector_norm.default]


def cdist(x1: Any, x2: Any, p: float = 2.0, compute_mode: Any = None) -> Any:
    n = rank(x1)
    differences = op.Sub(op.Unsqueeze(x1, ints([n - 1])), op.Unsqueeze(x2, ints([n - 2])))   # (..., P, R, M)
    return _norm()(differences, float(p), [-1], False)


def pdist(x: Any, p: float = 2.0) -> Any:
    (count,) = static_dims(x, [0], "pdist")
    if count < 2:
        empty = op.Mul(op.ReduceSum(x, keepdims=0), op.CastLike(op.Constant(value_float=0.0), x))
        return op.Expand(empty, ints([0]))
    first, second = np.triu_indices(count, k=1)
    import onnx

    rows = op.Constant(value=onnx.numpy_helper.from_array(first.astype(np.int64)))
    columns = op.Constant(value=onnx.numpy_helper.from_array(second.astype(np.int64)))
    differences = op.Sub(op.Gather(x, rows, axis=0), op.Gather(x, columns, axis=0))
    return _norm()(differences, float(p), [-1], False)


def nonzero_static(x: Any, size: int, fill_value: int = -1) -> Any:
    """The first ``size`` positions of nonzero entries, one row each, padded with ``fill_value``."""
    n = rank(x)
    found = op.Transpose(op.NonZero(x), perm=[1, 0])                                   # (nnz, n)
    padding = op.Expand(op.Constant(value_int=int(fill_value)), ints([int(size), n]))
    return op.Cast(op.Slice(op.Concat(found, padding, axis=0), ints([0]), ints([int(size)]), ints([0])), to=INT64)


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten._cdist_forward.default: cdist,
        aten._pdist_forward.default: pdist,
        aten.nonzero_static.default: nonzero_static,
    }
