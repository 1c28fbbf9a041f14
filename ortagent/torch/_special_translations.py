"""Special functions torch.onnx translates without torch's precision, refused at the export
(``custom_translation_table``).

torch.onnx writes ``aten.special_erfcx`` (and so ``special.log_ndtr``, which torch decomposes
into it) as ``exp(x^2) * (1 - erf(x))``: the product overflows to ``inf * 0`` from ``x`` of about
9 and loses every digit of ``1 - erf(x)`` well before (``log_ndtr(-8.5)`` comes out as ``-inf``,
torch's is -39.0). ONNX has no scaled complementary error function, so rather than a graph that
runs and differs from torch, the export of these functions is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ortagent.errors import OrtNotImplemented

__all__ = ["special_translations"]


def special_translations() -> dict[Any, Callable]:
    import torch

    def erfcx(x: Any) -> Any:
        raise OrtNotImplemented("ORTModule: torch.special.erfcx (also inside special.log_ndtr) has no "
                                "ONNX translation with torch's precision (exp(x^2) * erfc(x) overflows "
                                "and cancels); it is not supported")

    return {torch.ops.aten.special_erfcx.default: erfcx}
