"""ONNX translations of torch's average pooling with ``divisor_override``
(``custom_translation_table``).

torch.onnx's translation of ``aten.avg_pool2d`` / ``avg_pool3d`` ignores ``divisor_override``
(it writes the AveragePool of the other arguments, dividing by the window's element count),
so ``F.avg_pool2d(x, 3, divisor_override=2)`` would run and differ from torch. Here each
window's sum is divided by the given divisor: the sums are a Conv with a kernel of ones over
the channels folded into the batch, with the padding grown at the end by stride - 1 when
``ceil_mode`` lets the last windows overhang (a Conv takes any padding; an AveragePool's must be
smaller than its kernel), and the surplus last windows the ceil rule drops are sliced off to
the shape torch.onnx's own pooling has. Without ``divisor_override`` the translation is
torch.onnx's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["pool_translations"]


def _spread(value: Any, count: int, default: Sequence[int]) -> list[int]:
    if value is None or (not isinstance(value, int) and not list(value)):
        return list(default)
    if isinstance(value, int):
        return [value] * count
    values = list(value)
    return values * count if len(values) == 1 else values


def pool_translations() -> dict[Any, Callable]:
    import torch
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import nn as torchlib_nn

    def make(spatial: int, own: Callable) -> Callable:
        def avg_pool(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
                     count_include_pad: bool = True, divisor_override: Any = None) -> Any:
            pooled = own(x, kernel_size, stride, padding, ceil_mode, count_include_pad)
            if divisor_override is None:
                return pooled
            kernel = _spread(kernel_size, spatial, ())
            strides = _spread(stride, spatial, kernel)
            pads = _spread(padding, spatial, [0] * spatial)
            ends = [pad + (step - 1 if ceil_mode else 0) for pad, step in zip(pads, strides)]
            unbatched = len(x.shape) == spatial + 1
            if unbatched:           # (pooling wants a batch axis)
                x = op.Unsqueeze(x, op.Constant(value_ints=[0]))
                pooled = op.Unsqueeze(pooled, op.Constant(value_ints=[0]))
            axes = op.Constant(value_ints=list(range(2, 2 + spatial)))
            # the channels folded into the batch, summed by a Conv with a kernel of ones
            folded = op.Reshape(x, op.Concat(op.Constant(value_ints=[-1, 1]),
                                             op.Gather(op.Shape(x), axes, axis=0), axis=0))
            ones = op.CastLike(op.Reshape(op.Constant(value_floats=[1.0] * math.prod(kernel)),
                                          op.Constant(value_ints=[1, 1, *kernel])), x)
            summed = op.Conv(folded, ones, pads=pads + ends, strides=strides)
            extents = op.Gather(op.Shape(pooled), axes, axis=0)
            kept = op.Slice(summed, op.Constant(value_ints=[0] * spatial), extents, axes)
            scale = op.CastLike(op.Constant(value_float=1.0 / float(divisor_override)), x)
            result = op.Mul(op.Reshape(kept, op.Shape(pooled)), scale)
            return op.Squeeze(result, op.Constant(value_ints=[0])) if unbatched else result

        return avg_pool

    aten = torch.ops.aten
    return {aten.avg_pool2d.default: make(2, torchlib_nn.aten_avg_pool2d),
            aten.avg_pool3d.default: make(3, torchlib_nn.aten_avg_pool3d)}
