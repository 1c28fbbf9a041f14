"""``scaled_dot_product_attention`` with ``is_causal=True``, which torch.onnx translates only for
equal query and key lengths of 4-d tensors, and without it on tensors of another rank than 4
(which torch.onnx refuses), and torch's CPU flash-attention kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``), whose second output torch.onnx gets wrong
(it returns the attention's input where torch returns each query's logsumexp).

torch's causal mask is the lower triangle aligned at the top left: query ``i`` sees keys
``0..i`` whatever the two lengths, so no row is ever fully masked and a plain Softmax is
torch's. The other forms (no mask, an explicit mask, dropout) keep torch.onnx's translation.
"""

from __future__ import annotations

import math
from typing import Any

from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import INT64, constant, ints, rank, safe_softmax, stop_gradient


def _repeat_heads(x: Any, times: int, n: int) -> Any:
    """``x`` (..., heads, length, E) with each head repeated ``times`` times in place, as
    torch's grouped-query attention does (``repeat_interleave`` on dim -3)."""
    expanded = op.Unsqueeze(x, ints([n - 2]))                   # (..., heads, 1, length, E)
    shape = op.Shape(expanded)
    target = op.Concat(op.Slice(shape, ints([0]), ints([n - 2])), ints([times]),
                       op.Slice(shape, ints([n - 1]), ints([n + 1])), axis=0)
    repeated = op.Expand(expanded, target)
    merged = op.Concat(op.Slice(shape, ints([0]), ints([n - 3])), ints([-1]),
                       op.Slice(shape, ints([n - 1]), ints([n + 1])), axis=0)
    return op.Reshape(repeated, merged)


def _scores(query: Any, key: Any, scale: Any, is_causal: bool, n: int) -> Any:
    """``query @ key^T * scale`` (by default ``1 / sqrt(E)``), ``-inf`` above the top-left
    aligned diagonal when ``is_causal``."""
    if scale is None:
        width = query.shape[n - 1]
        if isinstance(width, int):
            factor = constant(query, 1.0 / math.sqrt(width))
        else:
            factor = op.Reciprocal(op.Sqrt(op.CastLike(op.Gather(op.Shape(query), ints([n - 1]), axis=0), query)))
    else:
        factor = constant(query, float(scale))
    order = list(range(n - 2)) + [n - 1, n - 2]
    scores = op.Mul(op.MatMul(query, op.Transpose(key, perm=order)), factor)
    if not is_causal:
        return scores
    query_length = op.Gather(op.Shape(query), op.Constant(value_int=n - 2), axis=0)
    key_length = op.Gather(op.Shape(key), op.Constant(value_int=n - 2), axis=0)
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    rows = op.Unsqueeze(op.Range(zero, query_length, one), ints([1]))
    columns = op.Range(zero, key_length, one)
    visible = op.LessOrEqual(op.Cast(columns, to=INT64), op.Cast(rows, to=INT64))       # (L, S)
    return op.Where(visible, scores, constant(scores, float("-inf")))


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
    n = rank(query)
    if (not is_causal and n == 4) or dropout_p:
        from onnxscript.function_libs.torch_lib.ops.nn import aten_scaled_dot_product_attention

        return aten_scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                 enable_gqa)
    if attn_mask is not None and is_causal:
        raise OrtNotImplemented("scaled_dot_product_attention with both is_causal and attn_mask")
    if n < 2 or rank(key) != n or rank(value) != n:
        raise OrtNotImplemented("scaled_dot_product_attention: query, key and value of different ranks")
    if enable_gqa and n >= 3:
        heads, kv_heads = query.shape[n - 3], key.shape[n - 3]
        if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads % kv_heads:
            raise OrtNotImplemented("grouped-query attention needs static head counts, a multiple of each other")
        if heads != kv_heads:
            key = _repeat_heads(key, heads // kv_heads, n)
            value = _repeat_heads(value, heads // kv_heads, n)
    scores = _scores(query, key, scale, is_causal, n)
    if is_causal:
        return op.MatMul(op.Softmax(scores, axis=-1), value)
    # (query, key and value of another rank than 4, which torchlib's translation refuses:
    # timm's windowed attention (Twins, NesT, Hiera) passes 3-d or 5-d ones; torch's math, a
    # row that sees no key attending to nothing)
    return op.MatMul(safe_softmax(_masked(scores, attn_mask), -1), value)


def _masked(scores: Any, attn_mask: Any) -> Any:
    """``scores`` with SDPA's ``attn_mask`` applied: a boolean mask hides with ``-inf``, another
    is added."""
    if attn_mask is None:
        return scores
    if getattr(attn_mask, "dtype", None) is not None and attn_mask.dtype.name == "BOOL":
        return op.Where(attn_mask, scores, constant(scores, float("-inf")))
    return op.Add(scores, op.CastLike(attn_mask, scores))


def flash_attention_for_cpu(query: Any, key: Any, value: Any, dropout_p: float = 0.0, is_causal: bool = False,
                            attn_mask: Any = None, scale: Any = None) -> tuple[Any, Any]:
    """torch's CPU flash attention kernel: (output, logsumexp of each query's scores), the
    second not differentiable in torch (cut from the gradient here)."""
    if dropout_p:
        raise OrtNotImplemented("_scaled_dot_product_flash_attention_for_cpu with dropout")
    n = rank(query)
    if n != 4 or rank(key) != 4 or rank(value) != 4:
        raise OrtNotImplemented("_scaled_dot_product_flash_attention_for_cpu needs 4-d query, key and value")
    scores = _masked(_scores(query, key, scale, is_causal, n), attn_mask)
    largest = stop_gradient(op.ReduceMax(scores, ints([-1]), keepdims=1))
    total = op.ReduceSum(op.Exp(op.Sub(scores, largest)), ints([-1]), keepdims=1)
    logsumexp = op.Squeeze(op.Add(largest, op.Log(total)), ints([-1]))
    return op.MatMul(op.Softmax(scores, axis=-1), value), stop_gradient(logsumexp)


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {aten.scaled_dot_product_attention.default: scaled_dot_product_attention,
            aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu}
