"""Adaptive pooling (``adaptive_max_pool1d/2d/3d``, ``adaptive_avg_pool3d``), which torch.onnx
cannot translate.

Output cell ``i`` of an axis of input size ``n`` and output size ``m`` reads the window
``[floor(i*n/m), ceil((i+1)*n/m))``, as torch's kernels do. With the spatial sizes known at
export, every window's flat spatial positions are a constant table padded to the largest
window; one Gather reads all windows at once, a reduction over the last axis pools them:

* max: padding repeats the window's first position, which changes neither the maximum nor the
  first position of the maximum; ArgMax maps back through the table to torch's indices (flat
  over the spatial axes of one plane).
* average: padding positions carry weight 0, the others ``1 / window size``.

Gather, ReduceMax and Mul/ReduceSum are differentiated by the autodiff (a Gather's reverse adds
the gradients of repeated positions, so a repeated first position still gets its whole share).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import INT64, ints, rank, static_dims


def _windows(size: int, out: int) -> list[range]:
    return [range((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def _table(sizes: list[int], outs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(positions, counts): for every output cell (in C order), the flat spatial positions of
    its window padded with the first one, and the window's true size."""
    strides = [int(np.prod(sizes[d + 1:])) for d in range(len(sizes))]
    per_axis = [_windows(n, m) for n, m in zip(sizes, outs)]
    cells = []
    for windows in itertools.product(*per_axis):
        cells.append([sum(p * s for p, s in zip(point, strides)) for point in itertools.product(*windows)])
    widest = max(len(c) for c in cells)
    positions = np.array([c + [c[0]] * (widest - len(c)) for c in cells], dtype=np.int64)
    counts = np.array([len(c) for c in cells], dtype=np.int64)
    return positions, counts


def _gathered(x: Any, spatial: int, output_size: Any, what: str) -> tuple[Any, np.ndarray, np.ndarray, Any]:
    """(windows: (..., cells, widest), positions, counts, output shape)."""
    n = rank(x)
    outs = [int(s) for s in (output_size if isinstance(output_size, (list, tuple)) else [output_size] * spatial)]
    if n not in (spatial + 1, spatial + 2) or len(outs) != spatial:
        raise OrtNotImplemented(f"ortagent's {what}: input of rank {n}, output size {output_size}")
    sizes = static_dims(x, range(n - spatial, n), what)
    if any(o <= 0 for o in outs) or any(s <= 0 for s in sizes):
        raise OrtNotImplemented(f"ortagent's {what}: empty input or output ({sizes} -> {outs})")
    positions, counts = _table(sizes, outs)
    lead = [0] * (n - spatial)          # Reshape's 0 keeps a leading size (an empty batch too)
    flat = op.Reshape(x, ints(lead + [int(np.prod(sizes))]))
    gathered = op.Gather(flat, op.Constant(value=_tensor(positions)), axis=n - spatial)
    return gathered, positions, counts, ints(lead + outs)


def _tensor(array: np.ndarray) -> Any:
    import onnx

    return onnx.numpy_helper.from_array(array)


def _adaptive_max(spatial: int):
    what = f"adaptive_max_pool{spatial}d"

    def adaptive_max_pool(x: Any, output_size: Any) -> tuple[Any, Any]:
        gathered, positions, _, out_shape = _gathered(x, spatial, output_size, what)
        last = rank(x) - spatial + 1
        values = op.ReduceMax(gathered, ints([last]), keepdims=0)
        chosen = op.ArgMax(gathered, axis=last, keepdims=0)           # (..., cells)
        cells, widest = positions.shape
        offsets = op.Constant(value=_tensor(np.arange(cells, dtype=np.int64) * widest))
        indices = op.Gather(op.Constant(value=_tensor(positions.reshape(-1))), op.Add(chosen, offsets), axis=0)
        return op.Reshape(values, out_shape), op.Reshape(op.Cast(indices, to=INT64), out_shape)

    return adaptive_max_pool


def _adaptive_avg(spatial: int):
    what = f"adaptive_avg_pool{spatial}d"

    def adaptive_avg_pool(x: Any, output_size: Any) -> Any:
        shape = list(getattr(x, "shape", None) or [])
        if 0 in shape[:rank(x) - spatial]:
            # an empty batch: an empty result (a Reshape of an empty tensor cannot infer sizes)
            outs = output_size if isinstance(output_size, (list, tuple)) else [output_size] * spatial
            return op.Expand(op.ReduceSum(x, keepdims=0), ints(shape[:rank(x) - spatial] + list(outs)))
        gathered, positions, counts, out_shape = _gathered(x, spatial, output_size, what)
        last = rank(x) - spatial + 1
        width = positions.shape[1]
        weights = np.where(np.arange(width)[None, :] < counts[:, None], 1.0 / counts[:, None], 0.0)
        scaled = op.Mul(gathered, op.CastLike(op.Constant(value=_tensor(weights.astype(np.float32))), x))
        return op.Reshape(op.ReduceSum(scaled, ints([last]), keepdims=0), out_shape)

    return adaptive_avg_pool


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {
        aten.adaptive_max_pool1d.default: _adaptive_max(1),
        aten.adaptive_max_pool2d.default: _adaptive_max(2),
        aten.adaptive_max_pool3d.default: _adaptive_max(3),
        aten.adaptive_avg_pool3d.default: _adaptive_avg(3),
        aten._adaptive_avg_pool3d.default: _adaptive_avg(3),
    }
