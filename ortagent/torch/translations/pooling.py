"""Pooling: adaptive pooling (``adaptive_max_pool1d/2d/3d``, ``adaptive_avg_pool3d``), which
torch.onnx cannot translate, and average pooling with ``divisor_override``, which it translates
wrongly.

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

torch.onnx's translation of ``aten.avg_pool2d`` / ``avg_pool3d`` ignores ``divisor_override``
(it writes the AveragePool of the other arguments, dividing by the window's element count),
so ``F.avg_pool2d(x, 3, divisor_override=2)`` would run and differ from torch. Here each
window's sum is divided by the given divisor: the sums are a Conv with a kernel of ones over
the channels folded into the batch, with the padding grown at the end by stride - 1 when
``ceil_mode`` lets the last windows overhang (a Conv takes any padding; an AveragePool's must be
smaller than its kernel), and the surplus last windows are sliced off to
torch's output sizes, written out from the input's. Without ``divisor_override`` the translation is
torch.onnx's own.

``adaptive_avg_pool1d`` goes through the same table as the 3-d pool (torch.onnx's translation
fails in onnxruntime on an empty batch).

``F.unfold`` (``aten.im2col``) and ``F.fold`` (``aten.col2im``), which torch.onnx writes with a
Reshape onnxruntime rejects for an empty batch, are a constant table too: with the spatial
sizes known at export, kernel offset ``k`` of block ``l`` reads flat position
``(row_l + k_row) * padded_width + column_l + k_column`` of the zero-padded input. ``unfold``
reads those positions with a GatherElements (its gradient a scatter-add); ``fold``, its
adjoint, scatter-adds the blocks' entries at the same positions (ScatterElements with
``reduction="add"``, linear, its gradient a GatherElements) and crops the padding.

``fractional_max_pool2d/3d``: each plane's windows start where torch's kernel puts them,
``trunc((i + u) alpha) - trunc(u alpha)`` with ``alpha = (size - k) / (out - 1)`` computed in the
input's float type and the last window at ``size - k``, from the plane's random sample ``u``
(the bridge draws the samples as torch does: :mod:`ortagent.torch._rewrites`). The windows'
flat positions are GatherElements reads; ArgMax picks the first maximum (torch's) and the
value is read again at that index, so the gradient goes to it alone.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
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


def _spread(value: Any, count: int, default: Sequence[int]) -> list[int]:
    if value is None or (not isinstance(value, int) and not list(value)):
        return list(default)
    if isinstance(value, int):
        return [value] * count
    values = list(value)
    return values * count if len(values) == 1 else values


def _avg_pool_with_divisor(spatial: int, own: Callable) -> Callable:
    def avg_pool(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: Any = None) -> Any:
        if divisor_override is None:
            return own(x, kernel_size, stride, padding, ceil_mode, count_include_pad)
        kernel = _spread(kernel_size, spatial, ())
        strides = _spread(stride, spatial, kernel)
        pads = _spread(padding, spatial, [0] * spatial)
        ends = [pad + (step - 1 if ceil_mode else 0) for pad, step in zip(pads, strides)]
        unbatched = len(x.shape) == spatial + 1
        if unbatched:           # (pooling wants a batch axis)
            x = op.Unsqueeze(x, op.Constant(value_ints=[0]))
        axes = op.Constant(value_ints=list(range(2, 2 + spatial)))
        sizes = op.Gather(op.Shape(x), axes, axis=0)
        # the channels folded into the batch, summed by a Conv with a kernel of ones
        folded = op.Reshape(x, op.Concat(op.Constant(value_ints=[-1, 1]), sizes, axis=0))
        ones = op.CastLike(op.Reshape(op.Constant(value_floats=[1.0] * math.prod(kernel)),
                                      op.Constant(value_ints=[1, 1, *kernel])), x)
        summed = op.Conv(folded, ones, pads=pads + ends, strides=strides)
        extents = _pooled_sizes(sizes, kernel, strides, pads, ceil_mode)
        kept = op.Slice(summed, op.Constant(value_ints=[0] * spatial), extents, axes)
        scale = op.CastLike(op.Constant(value_float=1.0 / float(divisor_override)), x)
        leading = op.Slice(op.Shape(x), op.Constant(value_ints=[0]), op.Constant(value_ints=[2]))
        result = op.Mul(op.Reshape(kept, op.Concat(leading, extents, axis=0)), scale)
        return op.Squeeze(result, op.Constant(value_ints=[0])) if unbatched else result

    return avg_pool


def _pooled_sizes(sizes: Any, kernel: list[int], strides: list[int], pads: list[int], ceil_mode: bool) -> Any:
    """torch's output sizes of a pooling of spatial ``sizes`` (int64, one per axis): ``(size +
    2 pad - kernel [+ stride - 1 with ceil_mode]) // stride + 1``, less the last window where
    ceil_mode starts it in the end padding. (Written out rather than read from the pool's
    Shape: below opset 22 ONNX infers such a pool one window longer, and at static shapes
    torch.onnx's optimizer folds that size into the graph.)"""
    def vector(values: list[int]) -> Any:
        return op.Constant(value_ints=[int(v) for v in values])

    reach = op.Sub(op.Add(sizes, vector([2 * pad for pad in pads])), vector(kernel))
    if ceil_mode:
        reach = op.Add(reach, vector([stride - 1 for stride in strides]))
    counts = op.Add(op.Div(reach, vector(strides)), vector([1] * len(kernel)))
    if not ceil_mode:
        return counts
    last_start = op.Mul(op.Sub(counts, vector([1] * len(kernel))), vector(strides))
    in_padding = op.GreaterOrEqual(last_start, op.Add(sizes, vector(pads)))
    return op.Sub(counts, op.Cast(in_padding, to=INT64))


def _pair(value: Any) -> list[int]:
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return values * 2 if len(values) == 1 else values


def _block_positions(size: list[int], kernel: list[int], dilation: list[int], padding: list[int],
                     stride: list[int], what: str) -> tuple[np.ndarray, list[int], int]:
    """(positions (kernel cells, blocks) in the flat padded plane, padded sizes, block count)."""
    padded = [n + 2 * p for n, p in zip(size, padding)]
    blocks = [(n - d * (k - 1) - 1) // s + 1 for n, k, d, s in zip(padded, kernel, dilation, stride)]
    if min(blocks) <= 0:
        raise OrtNotImplemented(f"ortagent's {what}: no block fits (sizes {size}, kernel {kernel})")
    rows = np.arange(blocks[0])[:, None] * stride[0]
    columns = np.arange(blocks[1])[None, :] * stride[1]
    cells = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            cells.append(((rows + i * dilation[0]) * padded[1] + columns + j * dilation[1]).reshape(-1))
    return np.stack(cells).astype(np.int64), padded, blocks[0] * blocks[1]


def im2col(x: Any, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> Any:
    n = rank(x)
    if n not in (3, 4):
        raise OrtNotImplemented(f"ortagent's unfold: input of rank {n}")
    kernel, dilations, pads, strides = (_pair(v) for v in (kernel_size, dilation, padding, stride))
    channels, height, width = static_dims(x, range(n - 3, n), "unfold")
    positions, padded, count = _block_positions([height, width], kernel, dilations, pads, strides, "unfold")
    lead = [0] * (n - 2)
    shape = list(x.shape)
    if 0 in shape[:n - 3]:
        # an empty batch: an empty result (the reverse of the reads would reshape with -1)
        return op.Expand(op.ReduceSum(x, keepdims=0), ints(shape[:n - 3] + [channels * positions.shape[0], count]))
    x = op.Pad(x, ints(lead + pads + lead + pads))
    flat = op.Reshape(x, ints(lead + [padded[0] * padded[1]]), allowzero=0)   # (0: copy)
    # GatherElements (its reverse a ScatterElements add) over the positions spread to every
    # plane: the reverse of a Gather reshapes with -1, which fails on an empty batch
    table = op.Constant(value=_tensor(positions.reshape(-1)))
    index = op.Expand(table, op.Concat(op.Slice(op.Shape(flat), ints([0]), ints([n - 2])), ints([positions.size]),
                                      axis=0))
    gathered = op.GatherElements(flat, index, axis=n - 2)                      # (..., C, cells * blocks)
    return op.Reshape(gathered, ints([0] * (n - 3) + [channels * positions.shape[0], count]), allowzero=0)


def col2im(x: Any, output_size: Any, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> Any:
    n = rank(x)
    if n not in (2, 3):
        raise OrtNotImplemented(f"ortagent's fold: input of rank {n}")
    size, kernel, dilations, pads, strides = (_pair(v) for v in (output_size, kernel_size, dilation, padding, stride))
    rows, count = static_dims(x, range(n - 2, n), "fold")
    positions, padded, blocks = _block_positions(size, kernel, dilations, pads, strides, "fold")
    cells = positions.shape[0]
    if rows % cells or count != blocks:
        raise OrtNotImplemented(f"ortagent's fold: input of shape {list(x.shape)} does not fit kernel {kernel}, "
                                f"output {size}")
    lead = [0] * (n - 2)
    channels = rows // cells
    shape = list(x.shape)
    if 0 in shape[:n - 2]:
        # an empty batch: an empty result (the reverse of the scatter would reshape with -1)
        return op.Expand(op.ReduceSum(x, keepdims=0), ints(shape[:n - 2] + [channels] + size))
    values = op.Reshape(x, ints(lead + [channels, cells * count]))
    index = op.Expand(op.Constant(value=_tensor(positions.reshape(-1))), op.Shape(values))
    plane = op.Expand(op.CastLike(op.Constant(value_float=0.0), x),
                      op.Concat(op.Slice(op.Shape(values), ints([0]), ints([n - 1])), ints([padded[0] * padded[1]]),
                                axis=0))
    summed = op.ScatterElements(plane, index, values, axis=n - 1, reduction="add")
    image = op.Reshape(summed, ints(lead + [channels] + padded))
    return op.Slice(image, ints(pads), ints([pads[0] + size[0], pads[1] + size[1]]), ints([n - 1, n]))


def _fractional_max(spatial: int):
    what = f"fractional_max_pool{spatial}d"
    # which of a plane's random samples sets each spatial axis's windows (torch's kernels: 2-d
    # reads (W, H), 3-d reads (T, H, W))
    sample_of_axis = [1, 0] if spatial == 2 else [0, 1, 2]

    def fractional_max_pool(x: Any, kernel_size: Any, output_size: Any, random_samples: Any) -> tuple[Any, Any]:
        n = rank(x)
        if n != spatial + 2:
            raise OrtNotImplemented(f"ortagent's {what}: input of rank {n} (a batch axis is needed)")
        kernel = [int(k) for k in kernel_size]
        outs = [int(o) for o in output_size]
        sizes = static_dims(x, range(2, n), what)
        if any(o < 1 for o in outs) or any(o + k - 1 > s for o, k, s in zip(outs, kernel, sizes)):
            raise OrtNotImplemented(f"ortagent's {what}: output {outs} with kernel {kernel} on {sizes}")
        samples = op.CastLike(random_samples, x)
        strides = [int(np.prod(sizes[d + 1:])) for d in range(spatial)]
        flat_positions = None
        for d in range(spatial):
            size, out, k = sizes[d], outs[d], kernel[d]
            u = op.Slice(samples, ints([sample_of_axis[d]]), ints([sample_of_axis[d] + 1]), ints([2]))   # (N, C, 1)
            if out > 1:
                # torch's intervals, in the input's float type as its kernel computes them:
                # trunc((i + u) alpha) - trunc(u alpha), the last one fixed at size - k
                alpha = op.CastLike(op.Constant(value_float=float(np.float32(size - k) / np.float32(out - 1))), x)
                steps = op.CastLike(op.Constant(value=_tensor(np.arange(out, dtype=np.float32))), x)
                first = op.Cast(op.Floor(op.Mul(op.Add(steps, u), alpha)), to=INT64)
                starts = op.Sub(first, op.Cast(op.Floor(op.Mul(u, alpha)), to=INT64))           # (N, C, out)
                last = op.Constant(value=_tensor(np.array([0] * (out - 1) + [1], dtype=bool)))
                starts = op.Where(last, op.Constant(value_int=size - k), starts)
            else:
                starts = op.Expand(op.Constant(value_ints=[size - k]), op.Shape(u))
            rows = _spread_axis(starts, k, strides[d], d, spatial)
            flat_positions = rows if flat_positions is None else op.Add(flat_positions, rows)
        cells, window = int(np.prod(outs)), int(np.prod(kernel))
        positions = op.Reshape(flat_positions, ints([0, 0, cells * window]), allowzero=0)    # (0: copy)
        plane = op.Reshape(x, ints([0, 0, int(np.prod(sizes))]), allowzero=0)
        windows = op.Reshape(op.GatherElements(plane, positions, axis=2), ints([0, 0, cells, window]), allowzero=0)
        chosen = op.ArgMax(windows, axis=3, keepdims=1)                                       # first maximum
        index = op.GatherElements(op.Reshape(positions, ints([0, 0, cells, window]), allowzero=0), chosen, axis=3)
        index = op.Reshape(index, ints([0, 0, cells]), allowzero=0)
        values = op.GatherElements(plane, index, axis=2)          # the gradient goes to the index
        out_shape = ints([0, 0] + outs)
        return op.Reshape(values, out_shape, allowzero=0), op.Reshape(index, out_shape, allowzero=0)

    return fractional_max_pool


def _spread_axis(starts: Any, k: int, stride: int, d: int, spatial: int) -> Any:
    """The flat offsets along axis ``d`` of every (output cell, kernel offset) pair, laid out as
    (N, C, out_0, ..., out_{s-1}, k_0, ..., k_{s-1}) with size 1 on the other axes."""
    rows = op.Add(op.Unsqueeze(starts, ints([3])), op.Constant(value=_tensor(np.arange(k, dtype=np.int64))))
    rows = op.Mul(rows, op.Constant(value_int=stride))                                    # (N, C, out, k)
    # out goes to axis 2 + d, k to axis 2 + spatial + d
    before_out = list(range(2, 2 + d))
    between = list(range(2 + d + 1, 2 + spatial + d))
    after_k = list(range(2 + spatial + d + 1, 2 + 2 * spatial))
    rows = op.Unsqueeze(rows, ints(before_out)) if before_out else rows
    rows = op.Unsqueeze(rows, ints(between)) if between else rows
    return op.Unsqueeze(rows, ints(after_k)) if after_k else rows


def translations() -> dict:
    import torch
    from onnxscript.function_libs.torch_lib.ops import nn as torchlib_nn

    aten = torch.ops.aten
    return {
        aten.adaptive_max_pool1d.default: _adaptive_max(1),
        aten.adaptive_max_pool2d.default: _adaptive_max(2),
        aten.adaptive_max_pool3d.default: _adaptive_max(3),
        aten.adaptive_avg_pool1d.default: _adaptive_avg(1),
        aten.adaptive_avg_pool3d.default: _adaptive_avg(3),
        aten._adaptive_avg_pool3d.default: _adaptive_avg(3),
        aten.avg_pool2d.default: _avg_pool_with_divisor(2, torchlib_nn.aten_avg_pool2d),
        aten.avg_pool3d.default: _avg_pool_with_divisor(3, torchlib_nn.aten_avg_pool3d),
        aten.fractional_max_pool2d.default: _fractional_max(2),
        aten.fractional_max_pool3d.default: _fractional_max(3),
        aten.im2col.default: im2col,
        aten.col2im.default: col2im,
    }
