"""``as_strided`` as torch means it, for the trace (:mod:`._rewrites` calls this in the tracing
thread only).

``x.as_strided(size, stride, storage_offset)`` reads ``x``'s storage: element ``i`` of the
result is the storage's element at ``storage_offset + sum(i_k * stride_k)``, the offset
defaulting to ``x``'s own. torch.onnx's translation reads ``x``'s elements in logical order
instead, which is the same only for a contiguous ``x`` at its own offset: on a transposed view
(Longformer's chunked attention, whose query and key arrive transposed) it gave other values
and gradients, silently. Here such an ``x`` is first written into an image of its storage
block (ScatterElements of its elements to their positions) and the result gathered from the
image at the positions asked for, so values and gradients are torch's (the gather's gradient
adds up where windows overlap, as torch's ``as_strided`` backward does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ortagent.errors import OrtNotImplemented

__all__ = ["as_strided"]


def _positions(size: Sequence[Any], stride: Sequence[Any], device: torch.device) -> torch.Tensor:
    """The storage position (from 0) of each element of a tensor of ``size`` and ``stride``."""
    positions = torch.zeros((), dtype=torch.long, device=device)
    for axis, (extent, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = extent
        positions = positions + torch.arange(extent, device=device).reshape(shape) * step
    return positions.expand(tuple(size)) if len(size) else positions


def _fills_a_block(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements fill a block of its storage once each: its strides, in
    increasing order, those of a contiguous tensor of its sizes in that order (axes of size 1
    aside)."""
    if x.numel() == 0:
        return True
    expected = 1
    for step, extent in sorted((step, extent) for extent, step in zip(x.shape, x.stride()) if extent != 1):
        if step != expected:
            return False
        expected *= extent
    return True


def as_strided(function: Any, x: torch.Tensor, size: Sequence[Any], stride: Sequence[Any],
               storage_offset: Any = None) -> torch.Tensor:
    """``function(x, size, stride, storage_offset)`` (``torch.as_strided`` or the method) with
    torch's meaning on any ``x`` whose elements fill a block of its storage once each."""
    own_offset = x.storage_offset()
    if x.is_contiguous() and (storage_offset is None or storage_offset == own_offset):
        return function(x, size, stride, storage_offset)      # (torch.onnx's translation is right here)
    if not _fills_a_block(x):
        raise OrtNotImplemented(
            "ORTModule: as_strided of a view whose elements do not fill a block of its storage once each (a "
            "slice with gaps, an expanded tensor): the result reads storage the graph does not hold")
    size, stride = list(size), list(stride)
    start = 0 if storage_offset is None else storage_offset - own_offset
    last = start + sum((extent - 1) * step for extent, step in zip(size, stride) if extent > 0)
    empty = any(extent == 0 for extent in size)
    if not empty and (start < 0 or last >= x.numel()):
        raise OrtNotImplemented(
            f"ORTModule: as_strided reads storage positions {start}..{last} relative to its input, whose "
            f"{x.numel()} elements are all the graph holds")
    flat = x.reshape(-1)
    image = torch.zeros_like(flat).scatter(0, _positions(x.shape, x.stride(), x.device).reshape(-1), flat)
    return image[start + _positions(size, stride, x.device)]
