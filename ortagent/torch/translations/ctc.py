"""``ortagent::ctc_loss`` (torch's CTC loss per sample, see :func:`ortagent.torch._losses.ctc_loss`)
as ortagent's private ``CTCLoss`` operator, whose recursion and gradient :mod:`ortagent._ctc`
writes in standard operators once the backward is built."""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ._common import rank


def ctc_loss(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int,
             zero_infinity: bool) -> Any:
    import onnxscript

    from ortagent._ad_rules import DOMAIN
    from ortagent._ctc import CTC_LOSS, register_schemas

    register_schemas(DOMAIN)
    private = onnxscript.values.Opset(DOMAIN, 1)
    nll, _ = getattr(private, CTC_LOSS)(log_probs, targets, input_lengths, target_lengths, blank=int(blank),
                                        zero_infinity=int(bool(zero_infinity)),
                                        flat_targets=int(rank(targets) == 1), _num_outputs=2)
    # shape inference knows the element type from the schema, the rank from this
    return op.Reshape(nll, op.Constant(value_ints=[-1]))


def translations() -> dict:
    import torch

    from .. import _losses  # noqa: F401 (defines the operator)

    return {torch.ops.ortagent.ctc_loss.default: ctc_loss}
