"""Losses written at the trace as torch's CPU kernels compute them, where the graph torch's
exporter makes of torch's own function differs from eager (:mod:`._rewrites` calls these in
the tracing thread only):

* :func:`smoothed_or_soft_cross_entropy`: ``cross_entropy`` with label smoothing or
  probability targets (torch.onnx's graph gave another loss, or an invalid node);
* :func:`gaussian_nll_loss`: torch's shape checks at the trace, its check for a negative
  variance in the graph;
* :func:`multilabel_margin_loss`: a single sample's unreduced loss is 0-d, as torch's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["smoothed_or_soft_cross_entropy", "gaussian_nll_loss", "multilabel_margin_loss"]


def smoothed_or_soft_cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                                    ignore_index: int, reduction: str, smoothing: float,
                                    soft: bool) -> torch.Tensor:
    """Cross entropy with probability targets (``soft``) or with label smoothing over class
    indices, in the operations and normalisations of torch's CPU kernel: probabilities are
    smoothed towards the uniform distribution and a mean divides by the number of rows; with
    class indices the loss is ``(1 - s) * nll + s / C * smooth``, where ``smooth`` sums the
    (weighted) negative log probabilities of every class, ignored targets contribute nothing,
    and a mean divides by the targets' total weight (their count without weights)."""
    class_dim = 0 if input.dim() == 1 else 1
    classes = input.shape[class_dim]
    log_probs = torch.log_softmax(input, class_dim)
    per_class = None
    if weight is not None:
        shape = [1] * input.dim()
        shape[class_dim] = classes
        per_class = weight.reshape(shape)
    if soft:
        if smoothing > 0.0:
            target = target * (1.0 - smoothing) + smoothing / classes
        terms = log_probs * target if per_class is None else log_probs * target * per_class
        if reduction == "none":
            return -terms.sum(class_dim)
        if reduction == "sum":
            return -terms.sum()
        return -terms.sum() / (input.numel() // classes if classes else 0)   # 0 rows: NaN, as torch
    nll = F.nll_loss(log_probs, target, weight, ignore_index=ignore_index, reduction=reduction)
    smooth = -(log_probs.sum(class_dim) if per_class is None else (log_probs * per_class).sum(class_dim))
    ignored = target == ignore_index
    smooth = smooth.masked_fill(ignored, 0.0)
    if reduction == "mean":
        if weight is None:
            total = (~ignored).sum()
        else:
            total = weight[target.masked_fill(ignored, 0)].masked_fill(ignored, 0.0).sum()
        smooth = smooth.sum() / total
    elif reduction == "sum":
        smooth = smooth.sum()
    return (1.0 - smoothing) * nll + smooth * (smoothing / classes)


def gaussian_nll_loss(input: torch.Tensor, target: torch.Tensor, var: Any, full: bool = False,
                       eps: float = 1e-6, reduction: str = "mean") -> torch.Tensor:
    """torch's Gaussian negative log likelihood, with its checks: the shape checks here at the
    trace (as torch makes them), the check for a negative variance in the graph
    (:func:`._rewrites.check_nonnegative`: the run fails rather than return a number where eager raises).
    The variance is clamped at ``eps`` outside autograd, as torch does, so its gradient is taken
    at the clamped value."""
    if not isinstance(var, torch.Tensor):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = torch.full_like(input, float(var))
    if var.size() != input.size():
        if input.size()[:-1] == var.size():
            var = torch.unsqueeze(var, -1)
        elif not (input.dim() == var.dim()
                  and sum(v for i, v in zip(input.size(), var.size()) if i != v) == 1):
            # (one axis where var has size 1 and the input another: var broadcasts over it)
            raise ValueError("var is of incorrect size")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    from ._rewrites import check_nonnegative, stop_gradient

    var = check_nonnegative(var)
    clamped = var + stop_gradient(var.clamp(min=eps) - var)
    loss = 0.5 * (torch.log(clamped) + (input - target) ** 2 / clamped)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss


def multilabel_margin_loss(input: torch.Tensor, target: torch.Tensor, size_average: Any = None,
                            reduce: Any = None, reduction: str = "mean") -> torch.Tensor:
    """torch's multilabel margin loss, whose per-sample loss of a single sample (a 1-D input,
    ``reduction="none"``) is a 0-d tensor as torch's kernel returns it: the decomposition the
    exporter traces returns shape ``[1]`` there."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    if input.dim() == 1 and target.dim() == 1 and reduction == "none":
        loss = F.multilabel_margin_loss(input.unsqueeze(0), target.unsqueeze(0), reduction="none")
        return loss.reshape(())
    return F.multilabel_margin_loss(input, target, reduction=reduction)

