"""Losses written at the trace as torch's CPU kernels compute them, where the graph torch's
exporter makes of torch's own function differs from eager (:mod:`._rewrites` calls these in
the tracing thread only):

* :func:`smoothed_or_soft_cross_entropy`: ``cross_entropy`` with label smoothing or
  probability targets (torch.onnx's graph gave another loss, or an invalid node);
* :func:`gaussian_nll_loss`: torch's shape checks at the trace, its check for a negative
  variance in the graph;
* :func:`multilabel_margin_loss`: a single sample's unreduced loss is 0-d, as torch's;
* :func:`ctc_loss`: torch's CTC loss, which torch.onnx cannot translate, as one
  ``ortagent::ctc_loss`` node per call (the per-sample loss; torch's reductions around it), which
  ortagent's translation writes as its private CTCLoss operator (see :mod:`ortagent._ctc`),
  with torch's argument checks at the trace and its checks of the lengths' values in the graph.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["smoothed_or_soft_cross_entropy", "gaussian_nll_loss", "multilabel_margin_loss", "ctc_loss", "ctc_nll"]


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



@torch.library.custom_op("ortagent::ctc_loss", mutates_args=())
def ctc_nll(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
            target_lengths: torch.Tensor, blank: int, zero_infinity: bool) -> torch.Tensor:
    """torch's CTC loss of each sample (``reduction="none"``): ``log_probs`` ``[T, N, C]``,
    targets padded ``[N, S]`` or concatenated, lengths as tensors. One node in the exported
    graph; its gradient is torch's."""
    return torch.ops.aten.ctc_loss.Tensor(log_probs, targets, input_lengths, target_lengths, blank, 0,
                                          zero_infinity)


@ctc_nll.register_fake
def _ctc_nll_fake(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    return log_probs.new_empty(log_probs.shape[1])


def _ctc_nll_setup(ctx, inputs, output) -> None:
    log_probs, targets, input_lengths, target_lengths, blank, zero_infinity = inputs
    ctx.save_for_backward(log_probs, targets, input_lengths, target_lengths)
    ctx.blank, ctx.zero_infinity = blank, zero_infinity


def _ctc_nll_backward(ctx, grad):
    log_probs, targets, input_lengths, target_lengths = ctx.saved_tensors
    with torch.enable_grad():
        leaf = log_probs.detach().requires_grad_()
        nll = torch.ops.aten.ctc_loss.Tensor(leaf, targets, input_lengths, target_lengths, ctx.blank, 0,
                                             ctx.zero_infinity)
        (grad_log_probs,) = torch.autograd.grad(nll, leaf, grad)
    return grad_log_probs, None, None, None, None, None


ctc_nll.register_autograd(_ctc_nll_backward, setup_context=_ctc_nll_setup)

_CTC_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}     # torch.ctc_loss's integer reductions


def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any, target_lengths: Any,
             blank: int = 0, reduction: Any = "mean", zero_infinity: bool = False) -> torch.Tensor:
    """``F.ctc_loss`` (and ``torch.ctc_loss``, whose reduction is a number) as torch computes
    it: the per-sample losses of :func:`ctc_nll`, divided by the target lengths (at least 1) and
    averaged over the batch (``mean``), summed (``sum``) or kept (``none``). An unbatched call
    (``log_probs`` ``[T, C]``) gives a 0-d loss. Lengths may be tensors or sequences of ints.
    The checks torch makes on shapes and arguments raise here, at the trace; those on the
    lengths' values (input lengths at most ``T``, target lengths within the padded targets or
    adding up to the concatenated ones, none negative) and on the labels within them (each a
    class, which eager does not check) are made by the graph, whose run then fails (:func:`._rewrites.check_all_true`)."""
    from ._rewrites import check_all_true

    if isinstance(reduction, int) and not isinstance(reduction, bool):
        if reduction not in _CTC_REDUCTIONS:
            raise ValueError(f"{reduction} is not a valid value for reduction")
        reduction = _CTC_REDUCTIONS[reduction]
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if log_probs.dim() not in (2, 3):
        raise RuntimeError(f"ctc_loss: log_probs must be 2-D (unbatched) or 3-D, got {log_probs.dim()}-D")
    if not log_probs.is_floating_point():
        raise RuntimeError(f"ctc_loss: log_probs must be floating point, got {log_probs.dtype}")
    unbatched = log_probs.dim() == 2
    classes = log_probs.shape[-1]
    if not 0 <= blank < classes:
        raise RuntimeError(f"ctc_loss: blank must be in label range [0, {classes}), got {blank}")

    def lengths(value: Any, what: str) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value, dtype=torch.long)
        elif value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise RuntimeError(f"ctc_loss: {what} must be integers, got {value.dtype}")
        return value.reshape(1) if unbatched else value

    input_lengths = lengths(input_lengths, "input_lengths")
    target_lengths = lengths(target_lengths, "target_lengths")
    if unbatched:       # (its targets, 1-D, read as one concatenated sequence: its length is checked)
        log_probs = log_probs.unsqueeze(1)
    batch = log_probs.shape[1]
    if input_lengths.shape != (batch,) or target_lengths.shape != (batch,):
        raise RuntimeError(f"ctc_loss: input_lengths and target_lengths must have one entry per sample ({batch}), "
                           f"got shapes {tuple(input_lengths.shape)} and {tuple(target_lengths.shape)}")
    if targets.dim() not in (1, 2) or (targets.dim() == 2 and targets.shape[0] != batch):
        raise RuntimeError(f"ctc_loss: targets must be [{batch}, S] (padded) or 1-D (concatenated), "
                           f"got shape {tuple(targets.shape)}")
    if targets.dim() == 2:
        fit = (target_lengths <= targets.shape[1]).all()
        read = torch.arange(targets.shape[1], device=targets.device) < target_lengths.unsqueeze(1)
    else:
        fit = target_lengths.sum() == targets.shape[0]          # (torch's check: exactly)
        read = torch.ones_like(targets, dtype=torch.bool)
    # (eager reads a label outside the classes from wherever it points; the graph's gather
    # would fail the run with onnxruntime's message: checked here, before the loss)
    labels = ((targets >= 0) & (targets < classes)) | ~read
    valid = ((input_lengths >= 0).all() & (input_lengths <= log_probs.shape[0]).all()
             & (target_lengths >= 0).all() & fit & labels.all())
    log_probs = check_all_true(log_probs, valid)
    nll = ctc_nll(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)
    if reduction == "mean":
        return (nll / target_lengths.clamp(min=1).to(nll.dtype)).mean()
    if reduction == "sum":
        return nll.sum()
    return nll.reshape(()) if unbatched else nll
