"""Lowerings of the cross-entropy and negative log-likelihood training ops."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper, numpy_helper

from ._emitter import Emitter
from ._registry import lowers


def _ignored_labels(e: Emitter, label: str, ignore_index: str | None) -> tuple[str | None, str]:
    """(where the label is ignored, or None; the labels with ignored ones replaced by 0), int64."""
    label = e.int64(label)
    if ignore_index is None:
        return None, label
    value = e.constant(ignore_index)
    if value is not None:
        target = e.const(np.int64(np.asarray(value).reshape(-1)[0]))
    else:
        target = e.op("Reshape", e.int64(ignore_index), e.ints([]))
    ignored = e.op("Equal", label, target)
    return ignored, e.op("Where", ignored, e.const(np.int64(0)), label)


def _sample_weights(e: Emitter, weight: str | None, ignored: str | None, safe_label: str, like: str) -> str:
    """Each sample's weight (weight[label], or 1), 0 where its label is ignored, in `like`'s type."""
    if weight:
        w = e.op("Gather", e.cast_like(weight, like), safe_label, axis=0)
    else:
        w = e.op("Expand", e.scalar(1, like), e.op("Shape", safe_label))
    if ignored is not None:
        w = e.op("Where", ignored, e.scalar(0, like), w)
    return w


def _nll(e: Emitter, log_prob: str, label: str, weight: str | None, ignore_index: str | None,
         reduction: str) -> str:
    """The negative log-likelihood loss of `log_prob` [N, C, D...] at `label` [N, D...]."""
    ignore_value = e.constant(ignore_index)
    if ignore_index is None or ignore_value is not None:
        # ONNX's own operator when ignore_index is a constant
        constant = None if ignore_value is None else int(np.asarray(ignore_value).reshape(-1)[0])
        return e.op("NegativeLogLikelihoodLoss", log_prob, label, weight, reduction=reduction,
                    ignore_index=constant)
    ignored, safe_label = _ignored_labels(e, label, ignore_index)
    picked = e.op("Squeeze", e.op("GatherElements", log_prob, e.op("Unsqueeze", safe_label, e.ints([1])), axis=1),
                  e.ints([1]))
    w = _sample_weights(e, weight, ignored, safe_label, log_prob)
    losses = e.op("Neg", e.op("Mul", picked, w))
    if reduction == "none":
        return losses
    total = e.op("ReduceSum", losses, keepdims=0)
    if reduction == "sum":
        return total
    return e.op("Div", total, e.op("ReduceSum", w, keepdims=0))


def _wider(first: int, second: int) -> int:
    return max((first, second), key=lambda t: np.dtype(helper.tensor_dtype_to_np_dtype(t)).itemsize)


@lowers("SoftmaxCrossEntropyLossInternal")
def _sce_loss_internal(e: Emitter, node: NodeProto) -> None:
    scores, labels, weights, ignore_index = e.input(0), e.input(1), e.input(2), e.input(3)
    output_type = e.attr("output_type")
    scores_type = e.elem_type(scores)
    reduction = e.attr("reduction", "mean")
    cast_back = bool(output_type) and output_type != scores_type
    if cast_back:
        if scores_type is None:
            raise e.error("output_type is set but the element type of the scores is not declared")
        wide = _wider(scores_type, output_type)       # computed in the wider type
        if wide != scores_type:
            scores = e.cast_to(scores, wide)
            weights = e.cast_to(weights, wide) if weights else None
    log_prob = e.op("LogSoftmax", scores, axis=1)
    loss = _nll(e, log_prob, labels, weights, ignore_index, reduction)
    for out, value in ((e.output(0), loss), (e.output(1), log_prob)):
        if not out:
            continue
        if cast_back:
            e.op("Cast", value, out=out, to=output_type)
        else:
            e.write(value, out)


@lowers("NegativeLogLikelihoodLossInternal", "NegativeLogLikelihoodLossInternal2")
def _nll_loss_internal(e: Emitter, node: NodeProto) -> None:
    loss = _nll(e, e.input(0), e.input(1), e.input(2), e.input(3), e.attr("reduction", "mean"))
    e.write(loss, e.output(0))


@lowers("SoftmaxCrossEntropyLossInternalGrad", "SoftmaxCrossEntropyLossGrad")
def _sce_loss_internal_grad(e: Emitter, node: NodeProto) -> None:
    dy, log_prob, label, weight = e.input(0), e.input(1), e.input(2), e.input(3)
    if node.op_type == "SoftmaxCrossEntropyLossGrad":       # the older form: ignore_index attribute
        attribute = e.attr("ignore_index")
        ignore_index = None if attribute is None else e.const(np.int64(attribute))
        bias = None
    else:
        ignore_index, bias = e.input(4), e.input(5)
    reduction = e.attr("reduction", "mean")
    output_type = e.attr("output_type")
    lp = log_prob
    lp_type = e.elem_type(log_prob)
    if output_type and lp_type and output_type != lp_type:
        wide = _wider(lp_type, output_type)
        if wide != lp_type:
            lp = e.cast_to(lp, wide)
    ignored, safe_label = _ignored_labels(e, label, ignore_index)
    dyu = e.cast_like(dy, lp)
    w = _sample_weights(e, weight, ignored, safe_label, lp)
    if reduction == "mean":
        d_loss = e.op("Div", e.op("Mul", dyu, w), e.op("ReduceSum", w, keepdims=0))
    else:
        d_loss = e.op("Mul", dyu, w)
    # one-hot of the labels along axis 1: classes shaped [C, 1, ..., 1] against labels [N, 1, D...]
    classes = e.op("Range", e.const(np.int64(0)), e.op("Squeeze", e.op("Shape", lp, start=1, end=2), e.ints([0])),
                   e.const(np.int64(1)))
    trailing = e.op("ConstantOfShape", e.op("Shape", e.op("Shape", safe_label, start=1)),
                    value=numpy_helper.from_array(np.array([1], np.int64)))
    column = e.op("Reshape", classes, e.op("Concat", e.ints([-1]), trailing, axis=0))
    one_hot = e.op("CastLike", e.op("Equal", column, e.op("Unsqueeze", safe_label, e.ints([1]))), lp)
    grad = e.op("Mul", e.op("Unsqueeze", d_loss, e.ints([1])), e.op("Sub", e.op("Exp", lp), one_hot))
    if bias:
        grad = e.op("Add", grad, e.cast_like(bias, grad))
    target_type = output_type or lp_type
    if target_type:
        if target_type == e.elem_type(lp):
            e.write(grad, e.output(0))
        else:
            e.op("Cast", grad, out=e.output(0), to=target_type)
    else:
        e.op("CastLike", grad, log_prob, out=e.output(0))
