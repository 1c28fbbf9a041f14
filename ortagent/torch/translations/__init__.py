"""ortagent's ONNX translations of aten operators, handed to torch.onnx's dynamo exporter as its
``custom_translation_table``.

Two kinds live here, one module per family of operators:

* corrections of torch.onnx's own translations where they differ from torch
  (:mod:`.corrections`), and ortagent's StopGradient marker;
* translations of operators torch.onnx cannot translate at all, so that ``ORTModule`` covers
  more than the exporter: :mod:`.reductions` (amax/amin of 0-d tensors, squeeze over several
  dims, ...), :mod:`.scans` (cumprod, cummax, cummin, ...), :mod:`.pooling` (adaptive pools),
  :mod:`.elementwise` (fmax, fmin, copysign, hypot, ...), :mod:`.special` (lgamma, digamma,
  erfinv, Bessel functions, ...), :mod:`.selection` (kthvalue, median, mode, ...) and
  :mod:`.attention`; and :mod:`.linalg` (inverses, solves, Cholesky, slogdet); :mod:`.scatters`
  (index_reduce, put, diagonal_scatter, ...), :mod:`.padding` (circular padding, replicate
  padding with negative pads), :mod:`.sampling` (grid_sample on volumes) and :mod:`.experts`
  (grouped matrix products of mixture-of-experts layers, transformers' included).
* corrections of where torch.onnx's translation sends a tie's gradient (:mod:`.extrema`:
  ``max``/``min`` along a dimension, ``clamp`` with tensor bounds).

Every translation is written with standard ONNX operators that the autodiff (onnx-ad and
:mod:`ortagent._ad_rules`) already differentiates, so none needs a reverse rule of its own;
where the derivative of a composition would be less accurate than the function's known
derivative, the translation attaches that derivative with the StopGradient marker
(:func:`._common.with_derivative`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["translation_table", "late_translations"]


def translation_table() -> dict[Any, Callable]:
    """Every translation of every family, keyed by aten operator overload."""
    from . import attention, corrections, ctc, distances, elementwise, pooling, reductions, scans, selection, special

    table: dict[Any, Callable] = {}
    for family in (corrections, elementwise, pooling, reductions, scans, selection, special, attention, distances,
                   ctc):
        table.update(family.translations())
    from . import linalg
    table.update(linalg.translations())
    from . import padding, sampling, scatters
    for family in (scatters, padding, sampling):
        table.update(family.translations())
    from . import extrema
    table.update(extrema.translations())
    table.update(late_translations())
    return table


def late_translations() -> dict[Any, Callable]:
    """The translations of operators that other libraries register when imported, possibly
    after the first export built the table (see :func:`ortagent.torch._registry.with_late_translations`)."""
    from . import experts

    return experts.late_translations()
