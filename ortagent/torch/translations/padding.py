"""``F.pad`` (``aten.pad``) in the two modes torch.onnx's single Pad gets wrong:

* ``circular``: onnxruntime's Pad in ``wrap`` mode fails on an empty tensor ("Unexpected mode
  of 3"); here each padded dimension is the Concat of its last ``left`` entries, the tensor
  and its first ``right`` entries (Slices, no static size needed);
* ``replicate`` with negative pads (cropping): the autodiff differentiates a Pad with
  negative pads only in constant mode, and an ``edge`` Pad cannot pad an axis cropped to
  nothing, where torch still replicates the edge; here each padded axis is a Gather of the
  positions torch reads, ``clamp(j - left, 0, size - 1)`` (static sizes).

Circular cropping comes first and the padding copies from the cropped tensor, as torch does.
Slice, Concat and Gather are differentiated by the autodiff; the other modes (and replicate
without cropping) keep torch.onnx's translation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import ints, rank, static_dims

_END = 2 ** 62          # a Slice end past every size


def _pairs(x: Any, pad: Any) -> list[tuple[int, int, int]]:
    """(axis, left, right) for each padded dimension, the last dimension first."""
    pads = [int(p) for p in pad]
    n = rank(x)
    if len(pads) % 2 or len(pads) // 2 > n:
        raise OrtNotImplemented(f"F.pad: {len(pads)} pads for a tensor of rank {n}")
    return [(n - 1 - i, pads[2 * i], pads[2 * i + 1]) for i in range(len(pads) // 2)]


def _cropped(x: Any, pairs: list[tuple[int, int, int]]) -> Any:
    """``x`` with the negative pads cropped (a Slice result has no static rank: take it first)."""
    for a, left, right in pairs:
        if left < 0 or right < 0:
            x = op.Slice(x, ints([max(-left, 0)]), ints([right if right < 0 else _END]), ints([a]))
    return x


def pad(x: Any, pad: Any, mode: str = "constant", value: Any = None) -> Any:
    pairs = _pairs(x, pad) if mode in ("circular", "replicate") else []
    if mode == "circular":
        x = _cropped(x, pairs)
        for a, left, right in pairs:
            parts = []
            if left > 0:
                parts.append(op.Slice(x, ints([-left]), ints([_END]), ints([a])))
            parts.append(x)
            if right > 0:
                parts.append(op.Slice(x, ints([0]), ints([right]), ints([a])))
            if len(parts) > 1:
                x = op.Concat(*parts, axis=a)
        return x
    if mode == "replicate" and any(p < 0 for _, left, right in pairs for p in (left, right)):
        # torch's rule: output j of an axis reads input clamp(j - left, 0, size - 1)
        sizes = static_dims(x, [a for a, _, _ in pairs], "replicate padding with negative pads")
        for (a, left, right), size in zip(pairs, sizes):
            if size + left + right < 0 or (size == 0 and size + left + right > 0):
                raise OrtNotImplemented(f"F.pad: pads ({left}, {right}) on a dimension of size {size}")
            reads = np.clip(np.arange(size + left + right) - left, 0, max(size - 1, 0)).astype(np.int64)
            x = op.Gather(x, op.Constant(value=onnx.numpy_helper.from_array(reads)), axis=a)
        return x
    from onnxscript.function_libs.torch_lib.ops.nn import aten_pad

    return aten_pad(x, pad, mode, value)


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {aten.pad.default: pad}
