"""Complex values in an exported program that torch.onnx cannot translate as they are.

torch.onnx (torchlib) writes a complex tensor as a real one with a trailing axis of 2 and has
complex translations of the FFTs and of ``view_as_real``/``view_as_complex``, but none of
``constant_pad_nd``, ``_conj_physical`` and ``unsqueeze`` on complex inputs (Llama 4 unsqueezes
its complex rotary frequencies over the heads): torch's 2-d and n-d FFTs with
a size ``s`` larger than the input pad the complex spectrum between transforms, and ``ihfft2``
/ ``ihfftn`` conjugate it. :func:`decompose_complex` writes both through the real view (a pad
that leaves the (real, imaginary) axis alone; the imaginary part negated; an axis inserted
before it), after decomposing
the FFT operators in which they hide (and ``F.pad`` of a complex tensor, which is one). A program without them is returned unchanged, so no
other model's export changes.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["decompose_complex"]

_aten = torch.ops.aten


def _complex_pad(x: torch.Tensor, pad: list, value: Any = 0.0) -> Any:
    if not x.is_complex():
        return NotImplemented           # (a real pad stays as it is)
    if value != 0:
        return NotImplemented           # (a complex fill value: left to torch.onnx, which refuses it)
    padded = _aten.constant_pad_nd.default(torch.view_as_real(x), [0, 0, *pad], 0.0)
    return torch.view_as_complex(padded)


def _complex_conj(x: torch.Tensor) -> Any:
    if not x.is_complex():
        return NotImplemented
    parts = torch.view_as_real(x)
    return torch.view_as_complex(torch.stack([parts[..., 0], -parts[..., 1]], -1))


def _complex_unsqueeze(x: torch.Tensor, dim: int) -> Any:
    if not x.is_complex():
        return NotImplemented
    dim = dim if dim >= 0 else dim + x.dim() + 1       # (of the complex tensor's rank + 1)
    return torch.view_as_complex(_aten.unsqueeze.default(torch.view_as_real(x), dim))


_REWRITES = {_aten.constant_pad_nd.default: _complex_pad, _aten._conj_physical.default: _complex_conj,
             _aten.unsqueeze.default: _complex_unsqueeze}


def _is_complex(node: Any) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.is_complex()


def decompose_complex(program: Any) -> Any:
    """``program`` (a ``torch.export.ExportedProgram``) with its FFT operators decomposed and
    complex pads and conjugations written through real views; ``program`` itself when it has
    none of them."""
    ffts = set()
    rewrites = False
    for node in program.graph.nodes:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            continue
        if target.name().startswith("aten::fft_") or (target == _aten.pad.default and _is_complex(node)):
            ffts.add(target)
        elif target in _REWRITES and any(_is_complex(arg) for arg in node.args if isinstance(arg, torch.fx.Node)):
            rewrites = True
    if not ffts and not rewrites:
        return program
    # torch's table of decompositions, narrowed to the FFT operators found (every other
    # operator is kept for torch.onnx to translate as it would), and the two rewrites
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if op not in ffts:
            del table[op]
    for op, rewrite in _REWRITES.items():
        table[op] = rewrite
    return program.run_decompositions(table)
