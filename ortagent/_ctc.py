"""torch's CTC loss as ONNX: ortagent's private ``CTCLoss`` operator, its reverse rule for
onnx-ad, and the standard operators both become once the backward is built.

``CTCLoss(log_probs, targets, input_lengths, target_lengths) -> (nll, log_alpha)`` (domain
``ai.ortagent.ad``; attributes ``blank``, ``zero_infinity``, ``flat_targets``) is torch's
``_ctc_loss`` per sample: ``log_probs`` ``[T, N, C]``, targets padded ``[N, S]`` or, with
``flat_targets``, concatenated ``[sum(target_lengths)]``; ``nll`` ``[N]`` is the negative log
likelihood of each sample's target (``inf`` where no alignment exists, 0 there with
``zero_infinity``); ``log_alpha`` ``[T, N, L]`` holds the forward variables the gradient reads.
Its reverse is ``CTCLossGrad(grad_nll, log_probs, targets, input_lengths, target_lengths,
log_alpha) -> grad_log_probs``, torch's gradient: ``(exp(lp) - occupancy) * grad`` at the steps
before a sample's input length and 0 after them, where ``occupancy[t, n, c]`` is the
probability that the alignment emits class ``c`` at step ``t``; NaN for a sample with no
alignment (0 with ``zero_infinity``) and where a log probability is ``-inf``, as torch's
formula gives there. (torch's gradient is not the derivative of the loss in
``log_probs``: it adds ``exp(lp) * grad``, a direction that log_softmax's backward removes, so
that the gradient of the logits is right through log_softmax; ortagent gives torch's.)

Both become standard operators (:func:`ctc_loss_nodes`, :func:`ctc_loss_grad_nodes`): the
targets between blanks (the extended labels, ``L = 2 S + 1`` states), each step's emission
log probabilities gathered for all steps at once, and one ``Scan`` over the steps holding a
``[N, L]`` recursion in log space: forward for ``alpha``, backward (from each sample's last
step) for ``beta``; the occupancy then is ``exp(alpha + beta + nll)``, added up per class with
one ``ScatterElements``. Log probabilities of ``-inf`` and the states no path reaches hold the
finite stand-in ``NEGLIGIBLE`` (``-1e30``), so that no step computes ``-inf - -inf``; a sample
whose likelihood stays near it has no alignment.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

__all__ = ["CTC_LOSS", "CTC_LOSS_GRAD", "register_schemas", "ctc_loss_reverse", "ctc_loss_nodes",
           "ctc_loss_grad_nodes"]

CTC_LOSS = "CTCLoss"
CTC_LOSS_GRAD = "CTCLossGrad"
NEGLIGIBLE = -1e30              # log probability of what cannot happen (a finite -inf)
NO_ALIGNMENT = -1e29            # a log likelihood below this: no alignment exists
_MIN_OPSET = 16                 # ScatterElements with reduction="add"
_registered = False


def register_schemas(domain: str) -> None:
    """Register the ONNX schemas of CTCLoss and CTCLossGrad once, so that torch's exporter knows
    CTCLoss's two outputs and ONNX shape inference their element types."""
    global _registered
    from onnx.defs import OpSchema

    if _registered:
        return
    floats = ["tensor(float)", "tensor(double)"]
    integers = ["tensor(int32)", "tensor(int64)"]
    parameter = OpSchema.FormalParameter
    for name, inputs, outputs in (
            (CTC_LOSS, [("log_probs", "T"), ("targets", "I"), ("input_lengths", "J"), ("target_lengths", "K")],
             [("nll", "T"), ("log_alpha", "T")]),
            (CTC_LOSS_GRAD, [("grad_nll", "T"), ("log_probs", "T"), ("targets", "I"), ("input_lengths", "J"),
                             ("target_lengths", "K"), ("log_alpha", "T")], [("grad_log_probs", "T")])):
        try:
            onnx.defs.get_schema(name, 1, domain)
            continue
        except Exception:
            pass
        onnx.defs.register_schema(OpSchema(
            name, domain, 1,
            doc="torch's CTC loss per sample (see ortagent._ctc)" if name == CTC_LOSS else
                "torch's gradient of the CTC loss in the log probabilities (see ortagent._ctc)",
            inputs=[parameter(n, t) for n, t in inputs], outputs=[parameter(n, t) for n, t in outputs],
            type_constraints=[("T", floats, "log probabilities"), ("I", integers, "targets"),
                              ("J", integers, "input lengths"), ("K", integers, "target lengths")],
            attributes=[OpSchema.Attribute("blank", OpSchema.AttrType.INT, "the blank's class"),
                        OpSchema.Attribute("zero_infinity", OpSchema.AttrType.INT, "0 for no alignment"),
                        OpSchema.Attribute("flat_targets", OpSchema.AttrType.INT, "targets concatenated")]))
    _registered = True


def _attributes(node) -> dict:
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {"blank": int(values.get("blank", 0)), "zero_infinity": int(values.get("zero_infinity", 0)),
            "flat_targets": int(values.get("flat_targets", 0))}


def ctc_loss_reverse(ctx, node, grads):
    """onnx-ad's reverse rule for CTCLoss: one CTCLossGrad node (the log probabilities only; the
    targets and lengths are integers, and ``log_alpha`` is never differentiated)."""
    from onnx_ad._build import UnsupportedOperator

    if len(grads) > 1 and grads[1] is not None:
        raise UnsupportedOperator("CTCLoss's forward variables are not differentiated")
    log_probs = node.input[0]
    if grads[0] is None or not ctx.asked_for(log_probs):
        return [None] * len(node.input)
    dy = ctx.b.op("Squeeze", [ctx.full(grads[0], node.output[0]), ctx.b.ints([-1])], stem="ctc_dy")
    grad = ctx.b.op(CTC_LOSS_GRAD, [dy, *node.input[:4], node.output[1]], stem="ctc_grad", domain=node.domain,
                    **_attributes(node))
    return [ctx.b.op("Unsqueeze", [grad, ctx.b.ints([-1])], stem="ctc_adjoint")] + [None] * (len(node.input) - 1)


class _Nodes:
    """A list of nodes under one name stem, with constants made on demand."""

    def __init__(self, stem: str, element_type: int) -> None:
        self.stem = stem
        self.element_type = element_type
        self.nodes: list = []
        self._count = 0

    def name(self, part: str) -> str:
        self._count += 1
        return f"{self.stem}/{part}_{self._count}"

    def op(self, op_type: str, inputs: list[str], part: str | None = None, out: str | None = None, **attrs) -> str:
        result = out or self.name(part or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [result], **attrs))
        return result

    def ints(self, values: list[int]) -> str:
        return self.op("Constant", [], "ints", value=helper.make_tensor("v", TensorProto.INT64, [len(values)], values))

    def int(self, value: int) -> str:
        return self.op("Constant", [], "int", value=helper.make_tensor("v", TensorProto.INT64, [], [value]))

    def real(self, value: float) -> str:
        return self.op("Constant", [], "real", value=helper.make_tensor("v", self.element_type, [], [value]))

    def unsqueeze(self, x: str, axes: list[int]) -> str:
        return self.op("Unsqueeze", [x, self.ints(axes)])

    def lse(self, terms: list[str], part: str) -> str:
        """``log(sum(exp(terms)))`` of same-shaped finite terms, the largest taken out first."""
        largest = self.op("Max", terms, f"{part}_max")
        exps = [self.op("Exp", [self.op("Sub", [term, largest])]) for term in terms]
        total = self.op("Sum", exps) if len(exps) > 1 else exps[0]
        return self.op("Add", [self.op("Log", [total]), largest], part)


class _Labels:
    """What both lowerings compute from the targets: the extended labels ``[N, L]``, the additive
    masks of the skip transitions, the emissions ``[T, N, L]``, the lengths as int64 and alpha
    before the first step."""

    def __init__(self, b: _Nodes, log_probs: str, targets: str, input_lengths: str, target_lengths: str,
                 blank: int, flat_targets: bool) -> None:
        i64 = TensorProto.INT64
        self.input_lengths = b.op("Cast", [input_lengths], "input_lengths", to=i64)
        self.target_lengths = b.op("Cast", [target_lengths], "target_lengths", to=i64)
        targets = b.op("Cast", [targets], "targets", to=i64)
        zero, one, blank_id = b.int(0), b.int(1), b.int(blank)
        lengths_column = b.unsqueeze(self.target_lengths, [1])                          # [N, 1]
        if flat_targets:
            longest = b.op("ReduceMax", [b.op("Concat", [self.target_lengths, b.ints([0])], axis=0)], keepdims=0)
            ends = b.op("CumSum", [self.target_lengths, zero])
            starts = b.op("Sub", [ends, self.target_lengths])
            positions = b.op("Add", [b.unsqueeze(starts, [1]),
                                     b.unsqueeze(b.op("Range", [zero, longest, one]), [0])])     # [N, S]
            source = b.op("Concat", [targets, b.ints([blank])], axis=0)      # (never empty)
            last = b.op("Sub", [b.op("Size", [source]), one])
            gathered = b.op("Gather", [source, b.op("Min", [positions, last])], axis=0)
        else:
            longest = b.op("Squeeze", [b.op("Slice", [b.op("Shape", [targets]), b.ints([1]), b.ints([2])])])
            gathered = targets
        steps = b.unsqueeze(b.op("Range", [zero, longest, one]), [0])                     # [1, S]
        inside = b.op("Less", [steps, lengths_column])
        padded = b.op("Where", [inside, gathered, blank_id], "padded_targets")            # [N, S]
        # the extended labels: blank, t0, blank, t1, ..., t(S-1), blank
        pairs_shape = b.op("Concat", [b.op("Shape", [padded]), b.ints([1])], axis=0)
        blanks = b.op("Expand", [blank_id, pairs_shape])
        pairs = b.op("Concat", [blanks, b.unsqueeze(padded, [2])], axis=2)                # [N, S, 2]
        interleaved = b.op("Reshape", [pairs, b.op("Concat", [b.op("Shape", [self.target_lengths]), b.ints([-1])],
                                                    axis=0)])
        column_shape = b.op("Concat", [b.op("Shape", [self.target_lengths]), b.ints([1])], axis=0)
        self.column_shape = column_shape
        self.labels = b.op("Concat", [interleaved, b.op("Expand", [blank_id, column_shape])], axis=1,
                           part="extended_labels")                                       # [N, L]
        # a path may skip into state s from s - 2 where their labels differ (never into a blank's
        # state, whose s - 2 is a blank too; into a label equal to the blank's class, as torch)
        none_before = b.op("Expand", [b.int(-1), b.op("Concat", [b.op("Shape", [self.target_lengths]),
                                                                   b.ints([2])], axis=0)])
        two_before = b.op("Slice", [b.op("Concat", [none_before, self.labels], axis=1), b.ints([0]), b.ints([-2]),
                                    b.ints([1])])
        no_skip = b.op("Equal", [self.labels, two_before])
        free, negligible = b.real(0.0), b.real(NEGLIGIBLE)
        self.free, self.negligible = free, negligible
        self.skip_into = b.op("Where", [no_skip, negligible, free], "skip_into")        # [N, L], 0 or NEGLIGIBLE
        # emissions: log_probs at each step for each state's label, -inf made NEGLIGIBLE
        log_probs_shape = b.op("Shape", [log_probs])
        self.steps_shape = b.op("Slice", [log_probs_shape, b.ints([0]), b.ints([1])])  # [T]
        by_step = b.op("Expand", [b.unsqueeze(self.labels, [0]),
                                  b.op("Concat", [self.steps_shape, b.op("Shape", [self.labels])], axis=0)])
        self.labels_by_step = by_step                                                   # [T, N, L]
        self.emissions = b.op("Max", [b.op("GatherElements", [log_probs, by_step], axis=2), negligible],
                              "emissions")
        self.states_shape = b.op("Shape", [self.labels])
        self.state_index = b.unsqueeze(b.op("Range", [zero, b.op("Gather", [self.states_shape, one]), one]), [0])
        # alpha before the first step: 0 at the first state, NEGLIGIBLE elsewhere
        first = b.op("Equal", [self.state_index, zero])
        self.start = b.op("Expand", [b.op("Where", [first, free, negligible]), self.states_shape], "start")


def _shift_body(b: _Nodes, labels: "_Labels", forward: bool, skip: str, final: str | None) -> onnx.GraphProto:
    """The Scan body of one step of the recursion over states, in log space: forward, state s
    from s, s - 1 and s - 2 (where the skip is allowed) of the previous step plus the step's
    emission; backward, from s, s + 1 and s + 2 of the next step with the next step's
    emissions, restarting from ``final`` at a sample's last step. The shifts are Pads (negative
    at the far end) filled with NEGLIGIBLE; the body's constants live in the outer graph."""
    toward = 1 if forward else -1       # (later states take from earlier ones, or the reverse)
    one, two = b.ints([0, toward, 0, -toward]), b.ints([0, 2 * toward, 0, -2 * toward])
    body = _Nodes(b.stem + "/step", b.element_type)
    carried, emission = body.name("carried"), body.name("emission")
    inputs = [helper.make_tensor_value_info(carried, b.element_type, None),
              helper.make_tensor_value_info(emission, b.element_type, None)]
    source = carried if forward else body.op("Add", [carried, emission])
    shifted_1 = body.op("Pad", [source, one, labels.negligible], mode="constant")
    shifted_2 = body.op("Add", [body.op("Pad", [source, two, labels.negligible], mode="constant"), skip])
    combined = body.lse([source, shifted_1, shifted_2], "combined")
    if forward:
        updated = body.op("Add", [combined, emission], "updated")
    else:
        last = body.name("last")
        inputs.append(helper.make_tensor_value_info(last, TensorProto.BOOL, None))
        updated = body.op("Where", [last, final, combined], "updated")
    seen = body.op("Identity", [updated], "seen")
    outputs = [helper.make_tensor_value_info(updated, b.element_type, None),
               helper.make_tensor_value_info(seen, b.element_type, None)]
    return helper.make_graph(body.nodes, body.stem, inputs, outputs)


def _log_likelihood(b: _Nodes, labels: _Labels, log_alpha: str) -> str:
    """Each sample's log likelihood ``[N]`` from the forward variables: the states of the last
    label and the blank after it at the sample's last step (the start, ``[0, NEGLIGIBLE, ...]``,
    for an input length of 0)."""
    alphas = b.op("Concat", [b.unsqueeze(labels.start, [0]), log_alpha], axis=0)               # [T + 1, N, L]
    at = b.op("Expand", [b.op("Reshape", [labels.input_lengths, b.ints([1, -1, 1])]),
                         b.op("Concat", [b.ints([1]), labels.states_shape], axis=0)])
    last = b.op("Squeeze", [b.op("GatherElements", [alphas, at], axis=0), b.ints([0])])  # [N, L]
    two = b.int(2)
    end = b.op("Mul", [labels.target_lengths, two])
    final_blank = b.op("GatherElements", [last, b.unsqueeze(end, [1])], axis=1)
    last_label = b.op("GatherElements", [last, b.unsqueeze(b.op("Max", [b.op("Sub", [end, b.int(1)]), b.int(0)]),
                                                           [1])], axis=1)
    empty = b.unsqueeze(b.op("Equal", [labels.target_lengths, b.int(0)]), [1])
    last_label = b.op("Where", [empty, labels.negligible, last_label])
    return b.op("Squeeze", [b.lse([final_blank, last_label], "final"), b.ints([1])], "log_likelihood")


def ctc_loss_nodes(node, element_type: int, opset: int) -> list:
    """``node`` (a CTCLoss) as standard operators: the forward recursion in one Scan."""
    _check_opset(opset)
    attrs = _attributes(node)
    b = _Nodes(node.name or node.output[0], element_type)
    log_probs = node.input[0]
    labels = _Labels(b, log_probs, *node.input[1:4], attrs["blank"], bool(attrs["flat_targets"]))
    body = _shift_body(b, labels, True, labels.skip_into, None)
    log_alpha = node.output[1] if len(node.output) > 1 and node.output[1] else b.name("log_alpha")
    b.nodes.append(helper.make_node("Scan", [labels.start, labels.emissions], [b.name("alpha_last"), log_alpha],
                                    body=body, num_scan_inputs=1))
    nll = b.op("Neg", [_log_likelihood(b, labels, log_alpha)], "raw_nll")
    none = b.op("Less", [b.op("Neg", [nll]), b.real(NO_ALIGNMENT)], "no_alignment")
    b.op("Where", [none, b.real(0.0 if attrs["zero_infinity"] else float("inf")), nll], out=node.output[0])
    return b.nodes


def ctc_loss_grad_nodes(node, element_type: int, opset: int) -> list:
    """``node`` (a CTCLossGrad) as standard operators: the backward recursion in one Scan, the
    occupancy of each class at each step, and torch's gradient from it."""
    _check_opset(opset)
    attrs = _attributes(node)
    grad_nll, log_probs, targets, input_lengths, target_lengths, log_alpha = node.input[:6]
    b = _Nodes(node.name or node.output[0], element_type)
    labels = _Labels(b, log_probs, targets, input_lengths, target_lengths, attrs["blank"],
                     bool(attrs["flat_targets"]))
    # a skip from s to s + 2 is allowed where one into s + 2 is
    skip_from = b.op("Pad", [labels.skip_into, b.ints([0, -2, 0, 2]), labels.negligible], "skip_from",
                     mode="constant")
    # beta at each sample's last step: 0 at the last label and the blank after it
    end = b.unsqueeze(b.op("Mul", [labels.target_lengths, b.int(2)]), [1])                # [N, 1]
    at_end = b.op("Equal", [labels.state_index, end])
    at_last_label = b.op("And", [b.op("Equal", [labels.state_index, b.op("Sub", [end, b.int(1)])]),
                                 b.op("Greater", [end, b.int(0)])])
    final = b.op("Where", [b.op("Or", [at_end, at_last_label]), labels.free, labels.negligible], "final")
    # the next step's emissions at each step (after the last any: there every sample restarts or
    # is past its end), and each sample's last step
    next_emissions = b.op("Slice", [b.op("Concat", [labels.emissions, b.unsqueeze(final, [0])], axis=0),
                                    b.ints([1]), b.ints([2 ** 62]), b.ints([0])])
    step = b.op("Range", [b.int(0), b.op("Squeeze", [labels.steps_shape]), b.int(1)])
    step_column = b.op("Reshape", [step, b.ints([-1, 1, 1])])                               # [T, 1, 1]
    lengths_row = b.op("Reshape", [labels.input_lengths, b.ints([1, -1, 1])])               # [1, N, 1]
    last_step = b.op("Equal", [step_column, b.op("Sub", [lengths_row, b.int(1)])])
    last_step = b.op("Expand", [last_step, b.op("Concat", [labels.steps_shape, labels.column_shape], axis=0)])
    body = _shift_body(b, labels, False, skip_from, final)
    log_beta = b.name("log_beta")
    b.nodes.append(helper.make_node("Scan", [final, next_emissions, last_step], [b.name("beta_first"), log_beta],
                                    body=body, num_scan_inputs=2, scan_input_directions=[1, 1],
                                    scan_output_directions=[1]))
    log_likelihood = _log_likelihood(b, labels, log_alpha)
    none = b.op("Less", [log_likelihood, b.real(NO_ALIGNMENT)], "no_alignment")
    safe = b.op("Where", [none, labels.free, log_likelihood])
    occupancy = b.op("Exp", [b.op("Sub", [b.op("Add", [log_alpha, log_beta]),
                                          b.op("Reshape", [safe, b.ints([1, -1, 1])])])], "occupancy")
    zeros = b.op("Expand", [labels.free, b.op("Shape", [log_probs])])
    by_class = b.op("ScatterElements", [zeros, labels.labels_by_step, occupancy],
                    "by_class", axis=2, reduction="add")
    grad = b.op("Mul", [b.op("Sub", [b.op("Exp", [log_probs]), by_class]),
                        b.op("Reshape", [grad_nll, b.ints([1, -1, 1])])])
    # torch's formula divides by exp(log_probs): NaN where a log probability is -inf
    impossible_class = b.op("Equal", [log_probs, b.real(float("-inf"))])
    grad = b.op("Where", [impossible_class, b.real(float("nan")), grad])
    live = b.op("Less", [step_column, lengths_row], "live")                                 # [T, N, 1]
    none_row = b.op("Reshape", [none, b.ints([1, -1, 1])])
    grad = b.op("Where", [none_row, b.real(0.0 if attrs["zero_infinity"] else float("nan")), grad])
    b.op("Where", [live, grad, labels.free], out=node.output[0])
    return b.nodes


def _check_opset(opset: int) -> None:
    if opset < _MIN_OPSET:
        from .errors import OrtNotImplemented

        raise OrtNotImplemented(f"CTCLoss needs ONNX opset {_MIN_OPSET} or later (ScatterElements' "
                                f"reduction), the graph imports opset {opset}")
