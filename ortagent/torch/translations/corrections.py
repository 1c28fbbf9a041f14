"""ONNX translations of aten operators that replace torch.onnx's own where its translation has
another gradient, or loses precision, compared with torch (``custom_translation_table``).

Each function receives the operator's arguments as torch's ONNX exporter passes them (symbolic
tensors, Python numbers) and builds its result with onnxscript's operators; the exporter inlines
what it builds. The differences they remove were found by the sweep over torch's OpInfo
database (tests/torch_sweep.py):

* ``aten.log_sigmoid``: torch.onnx writes ``Log(Sigmoid(x))``, which loses the value where the
  sigmoid rounds to 0 or 1 (``-inf`` below about -88; a relative error of 1e-4 near -10);
  here ``-Softplus(-x)``, whose gradient is ``sigmoid(-x)`` as torch's.
* ``aten._safe_softmax`` (torch's attention softmax, 0 over a row that is all ``-inf``): the
  softmax of such a row is NaN before the exporter's ``Where`` picks 0, and the backward of the
  softmax turns the row's gradient into NaN; here the row is replaced by zeros before the
  softmax, so its gradient is 0 as torch's.
* ``aten.linalg_vector_norm`` (``torch.norm``, ``F.normalize``, ...): at a zero vector the
  derivative of the root is infinite and its product with the zero derivative of the sum NaN,
  where torch's gradient is 0; here the root is taken of 1 where the sum is 0 (and the result
  set to 0 there), and likewise ``|x|^p`` of 1 where an entry is 0, so the gradient is 0 as
  torch's.
* ``aten.scatter_reduce`` with ``reduce="mean"``: torch.onnx writes a plain ScatterElements
  (the last write wins, no mean); here the sum over the scattered values (and ``self`` when
  ``include_self``) divided by their count, positions no index reaches keeping ``self``.
* ``aten.layer_norm`` / ``aten.native_layer_norm`` with a float16 input and float32 parameters (torch.autocast
  leaves a LayerNorm's parameters float32, and torch's kernel takes the mix): ONNX's
  LayerNormalization wants one type; here it computes in the parameters' type, the result cast
  back to the input's.
* ``aten.logit`` with ``eps``: torch's kernel takes ``eps`` below ``eps`` and else ``1 - eps``
  above ``1 - eps``; torch.onnx clamps the other way round, which differs where ``eps > 0.5``
  (the interval is empty: torch gives ``logit(eps)`` below ``eps``, torch.onnx ``logit(1 -
  eps)`` everywhere).
* ``aten.conv3d`` without a bias: torch.onnx's translation feeds Conv a zero bias of shape
  ``[out_channels, 2]``, which onnxruntime refuses (every Conv3d with ``bias=False``: the video
  ResNets); here Conv gets no bias.
* ``ortagent::check_all_true``: its first input, in a graph whose run fails where its
  condition is false (the forward's ``torch._check_tensor_all`` checks, see :mod:`._rewrites`).
* ``ortagent::stop_gradient``: the StopGradient marker of ortagent's domain
  (:mod:`._rewrites`); ``ortagent::check_nonnegative``: its input, in a graph whose run fails
  where an entry is negative (a Gather far out of range), for checks eager makes on values.
* ``ortagent::batch_norm_training`` (every training-mode BatchNorm, see :mod:`._rewrites`):
  one ``BatchNormTraining`` node of ortagent's domain, which :mod:`ortagent._ad_rules`
  differentiates and then writes as standard operators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ortagent._ad_rules import DOMAIN as STOP_GRADIENT_DOMAIN

__all__ = ["translations", "CHECK_FAILED_INDEX", "CONDITION_FAILED_INDEX"]

# the index a failed ``ortagent::check_nonnegative`` gathers at: onnxruntime's error names it,
# which tells that failure from any other (ortagent.torch._module words it for the user)
CHECK_FAILED_INDEX = 2 ** 40
# and a failed ``ortagent::check_all_true``'s
CONDITION_FAILED_INDEX = 2 ** 41

_registered = False


def _register_stop_gradient_schema() -> None:
    """The ONNX schema of StopGradient, registered once so the exporter knows its one output."""
    global _registered
    import onnx
    from onnx.defs import OpSchema

    if _registered:
        return
    try:
        onnx.defs.get_schema("StopGradient", 1, STOP_GRADIENT_DOMAIN)
    except Exception:
        floats = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]
        onnx.defs.register_schema(OpSchema(
            "StopGradient", STOP_GRADIENT_DOMAIN, 1,
            doc="The input, unchanged; the value carries no gradient (ortagent's marker for torch's detach).",
            inputs=[OpSchema.FormalParameter("input", "T")],
            outputs=[OpSchema.FormalParameter("output", "T")],
            type_constraints=[("T", floats, "floating-point tensors")]))
    _registered = True


_batch_norm_registered = False


def _register_batch_norm_schema() -> None:
    """The ONNX schema of ortagent's BatchNormTraining, registered once so the exporter and
    ONNX shape inference know its three outputs and their element type."""
    global _batch_norm_registered
    import onnx
    from onnx.defs import OpSchema

    from ortagent._ad_rules import BATCH_NORM_TRAINING

    if _batch_norm_registered:
        return
    try:
        onnx.defs.get_schema(BATCH_NORM_TRAINING, 1, STOP_GRADIENT_DOMAIN)
    except Exception:
        floats = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]
        onnx.defs.register_schema(OpSchema(
            BATCH_NORM_TRAINING, STOP_GRADIENT_DOMAIN, 1,
            doc="BatchNorm over the batch's statistics (axes: every axis but 1): the normalised "
                "input scaled and shifted per channel, the batch mean and the biased batch variance.",
            inputs=[OpSchema.FormalParameter("X", "T"), OpSchema.FormalParameter("scale", "T"),
                    OpSchema.FormalParameter("B", "T")],
            outputs=[OpSchema.FormalParameter("Y", "T"), OpSchema.FormalParameter("mean", "T"),
                     OpSchema.FormalParameter("var", "T")],
            type_constraints=[("T", floats, "floating-point tensors")],
            attributes=[OpSchema.Attribute("epsilon", OpSchema.AttrType.FLOAT, "added to the variance"),
                        OpSchema.Attribute("axes", OpSchema.AttrType.INTS, "the reduced axes")]))
    _batch_norm_registered = True


def _dims(dim: Any) -> list[int] | None:
    if dim is None:
        return None
    if isinstance(dim, int):
        return [dim]
    dims = list(dim)
    return dims or None


def translations() -> dict[Any, Callable]:
    import onnxscript
    from onnxscript import opset18 as op

    from ._common import safe_softmax as _safe_softmax

    _register_stop_gradient_schema()
    marker = onnxscript.values.Opset(STOP_GRADIENT_DOMAIN, 1)

    def stop_gradient(x: Any) -> Any:
        return marker.StopGradient(x)

    _register_batch_norm_schema()

    def batch_norm_training(x: Any, weight: Any, bias: Any, eps: float, rank: int) -> Any:
        y, mean, var = marker.BatchNormTraining(x, weight, bias, epsilon=float(eps),
                                                axes=[0, *range(2, rank)], _num_outputs=3)
        # shape inference knows the element types from the schema, the ranks from these
        flat = op.Constant(value_ints=[-1])
        return op.Reshape(y, op.Shape(x)), op.Reshape(mean, flat), op.Reshape(var, flat)

    def log_sigmoid(x: Any) -> Any:
        return op.Neg(op.Softplus(op.Neg(x)))

    def safe_softmax(x: Any, dim: int, dtype: Any = None) -> Any:
        if dtype is not None:
            x = op.Cast(x, to=_onnx_type(dtype))
        return _safe_softmax(x, dim)

    def vector_norm(x: Any, ord: float = 2.0, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
        if dtype is not None:
            x = op.Cast(x, to=_onnx_type(dtype))
        dims = _dims(dim)
        axes = op.Constant(value_ints=dims) if dims is not None else None
        zero = op.CastLike(op.Constant(value_float=0.0), x)
        one = op.CastLike(op.Constant(value_float=1.0), x)
        keep = 1 if keepdim else 0
        if dims is None and not keepdim:
            x = op.Reshape(x, op.Constant(value_ints=[-1]))
            axes = op.Constant(value_ints=[0])
        magnitude = op.Abs(x)
        if ord == float("inf"):
            return op.ReduceMax(magnitude, axes, keepdims=keep)
        if ord == float("-inf"):
            return op.ReduceMin(magnitude, axes, keepdims=keep)
        if ord == 0:
            nonzero = op.Cast(op.Not(op.Equal(x, zero)), to=1)
            return op.CastLike(op.ReduceSum(nonzero, axes, keepdims=keep), x)
        if ord == 1:
            return op.ReduceSum(magnitude, axes, keepdims=keep)
        if ord == 2:
            total = op.ReduceSum(op.Mul(x, x), axes, keepdims=keep)
        else:
            # |x|^p, with the power taken of 1 where x is 0 (its derivative there is infinite
            # for p < 1; torch's gradient at a zero entry is 0)
            zeros = op.Equal(x, zero)
            powered = op.Pow(op.Where(zeros, one, magnitude), op.CastLike(op.Constant(value_float=float(ord)), x))
            total = op.ReduceSum(op.Where(zeros, zero, powered), axes, keepdims=keep)
        empty = op.Equal(total, zero)
        safe = op.Where(empty, one, total)
        root = op.Sqrt(safe) if ord == 2 else op.Pow(safe, op.CastLike(op.Constant(value_float=1.0 / ord), x))
        return op.Where(empty, zero, root)

    def scatter_reduce(x: Any, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Any:
        if reduce != "mean":
            from onnxscript.function_libs.torch_lib.ops.core import aten_scatter_reduce

            return aten_scatter_reduce(x, dim, index, src, reduce, include_self=include_self)
        zero = op.CastLike(op.Constant(value_float=0.0), x)
        one = op.CastLike(op.Constant(value_float=1.0), x)
        ones = op.Expand(one, op.Shape(src))
        if include_self:
            base, counted = x, op.Expand(one, op.Shape(x))
        else:
            # the positions an index reaches start from 0 and count from 0
            base = op.ScatterElements(x, index, op.Expand(zero, op.Shape(src)), axis=dim)
            counted = op.Expand(zero, op.Shape(x))
        total = op.ScatterElements(base, index, src, axis=dim, reduction="add")
        count = op.ScatterElements(counted, index, ones, axis=dim, reduction="add")
        return op.Div(total, op.Max(count, one))

    def native_layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                          eps: float = 1e-5) -> Any:
        axis = -len(normalized_shape)
        if weight is None:
            weight = op.Expand(op.CastLike(op.Constant(value_float=1.0), x),
                               op.Constant(value_ints=list(normalized_shape)))
        if bias is None:
            bias = op.Expand(op.CastLike(op.Constant(value_float=0.0), weight),
                             op.Constant(value_ints=list(normalized_shape)))
        # in the parameters' type (autocast leaves them float32 for a float16 input, as torch's
        # mixed-type kernel does), and the result in the input's
        y, mean, rstd = op.LayerNormalization(op.CastLike(x, weight), weight, bias, axis=axis, epsilon=float(eps))
        return op.CastLike(y, x), mean, rstd

    def layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                   cudnn_enable: bool = True) -> Any:
        return native_layer_norm(x, normalized_shape, weight, bias, eps)[0]

    def conv3d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
               groups: int = 1) -> Any:
        def triple(value: Any) -> list[int]:
            return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * 3

        unbatched = len(x.shape) == 4                  # (C, D, H, W): torch's conv3d takes it
        if unbatched:
            x = op.Unsqueeze(x, op.Constant(value_ints=[0]))
        operands = (x, weight) if bias is None else (x, weight, bias)
        y = op.Conv(*operands, strides=triple(stride), pads=triple(padding) * 2, dilations=triple(dilation),
                    group=int(groups))
        return op.Squeeze(y, op.Constant(value_ints=[0])) if unbatched else y

    def failing_where(x: Any, failed: Any, failed_index: int) -> Any:
        # x plus a Gather from a one-element constant at index 0, or far out of range (at
        # failed_index, which onnxruntime's error then names) where ``failed`` (an int64 0 or 1)
        # is 1: the run fails there (ONNX has no assertion)
        index = op.Mul(failed, op.Constant(value_int=failed_index))
        zero = op.Gather(op.CastLike(op.Constant(value_floats=[0.0]), x), index, axis=0)
        return op.Add(x, zero)

    def check_all_true(x: Any, condition: Any) -> Any:
        return failing_where(x, op.Cast(op.Not(op.Cast(condition, to=9)), to=7), CONDITION_FAILED_INDEX)

    def check_nonnegative(x: Any) -> Any:
        negative = op.ReduceMax(op.Cast(op.Less(x, op.CastLike(op.Constant(value_float=0.0), x)), to=7),
                                keepdims=0)
        return failing_where(x, negative, CHECK_FAILED_INDEX)

    def logit(x: Any, eps: float | None = None) -> Any:
        one = op.CastLike(op.Constant(value_float=1.0), x)
        if eps is not None:
            low = op.CastLike(op.Constant(value_float=float(eps)), x)
            high = op.CastLike(op.Constant(value_float=1.0 - float(eps)), x)
            # torch's kernel: below eps -> eps, else above 1 - eps -> 1 - eps (in this order)
            x = op.Where(op.Less(x, low), low, op.Where(op.Greater(x, high), high, x))
        return op.Log(op.Div(x, op.Sub(one, x)))

    aten = torch.ops.aten
    return {
        torch.ops.ortagent.check_nonnegative.default: check_nonnegative,
        aten.logit.default: logit,
        aten.conv3d.default: conv3d,
        torch.ops.ortagent.check_all_true.default: check_all_true,
        aten.scatter_reduce.two: scatter_reduce,
        torch.ops.ortagent.stop_gradient.default: stop_gradient,
        torch.ops.ortagent.batch_norm_training.default: batch_norm_training,
        aten.log_sigmoid.default: log_sigmoid,
        aten.native_layer_norm.default: native_layer_norm,
        aten.layer_norm.default: layer_norm,
        aten._safe_softmax.default: safe_softmax,
        aten.linalg_vector_norm.default: vector_norm,
    }


_ONNX_TYPES = {torch.float32: 1, torch.float64: 11, torch.float16: 10, torch.bfloat16: 16}


def _onnx_type(dtype: Any) -> int:
    if isinstance(dtype, int):
        return dtype
    return _ONNX_TYPES[dtype]

