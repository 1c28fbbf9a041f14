"""Grouped matrix products, the expert layers of mixture-of-experts models, which torch.onnx
cannot translate: transformers' ``transformers::grouped_mm_fallback``, the custom operator its
experts call under export, a 2-d input by a 3-d stack of weights. (torch's own
``aten._grouped_mm`` cannot be exported in float32: its meta kernel refuses that type.)

The input's rows come sorted by expert: ``offs`` holds each expert's end row (cumulative
counts), so expert ``i`` multiplies rows ``offs[i-1]`` (0 for the first) up to ``offs[i]`` by
``weight[i]``; rows past the last end are zeros. Written as every expert's product with every
row, ``(E, S, N)``, each row then summed over the one expert whose span holds it: no weight is
gathered per row (``(S, K, N)``), and the autodiff gives each expert's weight the gradient of
its own rows. It costs ``E`` times the products of the grouped kernel.
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import INT64, constant, ints, rank


def _grouped_product(input: Any, weight: Any, offs: Any) -> Any:
    if rank(input) != 2 or rank(weight) != 3:
        raise OrtNotImplemented("grouped_mm_fallback: ortagent translates a 2-d input by a 3-d stack of "
                                "weights (with offs)")
    ends = op.Cast(offs, to=INT64)                                           # (E,)
    starts = op.Concat(ints([0]), op.Slice(ends, ints([0]), ints([-1])), axis=0)
    rows = op.Range(op.Constant(value_int=0), op.Gather(op.Shape(input), op.Constant(value_int=0), axis=0),
                    op.Constant(value_int=1))                                # (S,)
    rows = op.Unsqueeze(rows, ints([0]))                                     # (1, S)
    member = op.And(op.GreaterOrEqual(rows, op.Unsqueeze(starts, ints([1]))),
                    op.Less(rows, op.Unsqueeze(ends, ints([1]))))            # (E, S)
    products = op.MatMul(input, weight)                                      # (E, S, N)
    picked = op.Where(op.Unsqueeze(member, ints([2])), products, constant(products, 0.0))
    return op.ReduceSum(picked, ints([0]), keepdims=0)                       # (S, N)


def grouped_mm_fallback(input: Any, weight: Any, offs: Any) -> Any:
    return _grouped_product(input, weight, offs)


def late_translations() -> dict[Any, Any]:
    """Translations of operators that libraries register when imported (which can be after the
    first export built the table): transformers' grouped product."""
    import torch

    try:
        return {torch.ops.transformers.grouped_mm_fallback.default: grouped_mm_fallback}
    except (AttributeError, RuntimeError):
        return {}
