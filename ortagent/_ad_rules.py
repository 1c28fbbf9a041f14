"""The derivative rules ortagent gives onnx-ad for operators onnx-ad does not know.

:func:`ortagent.training.build_training_graph` differentiates with onnx-ad, whose rules are a
table keyed by operator type. ortagent adds entries for operators of its own domain
``ai.ortagent.ad`` only (never replacing one of onnx-ad's), through :func:`prepare`, and
:func:`finish` turns those operators into standard ones once the backward is built:

* ``StopGradient(x)``: ``x`` unchanged, no gradient to ``x`` (torch's ``detach``; the torch
  bridge writes it where torch's autograd would not differentiate). Becomes ``Identity``.
* ``Convolution``: a standard ``Conv`` that :func:`prepare` renamed (default opset 16 and up),
  whose reverse is one ``com.microsoft:ConvGrad`` node, lowered to standard operators by
  :func:`ortagent.training_ops.lower_training_ops` after differentiation. Unlike onnx-ad's own
  Conv rule it needs no static shape (batch, channel and spatial dimensions may be symbolic)
  and differentiates grouped and depthwise convolutions with respect to their weight. Becomes
  ``Conv`` again.
* ``ConvolutionTranspose``: a standard ``ConvTranspose`` renamed likewise (explicit pads, no
  ``output_shape``), which onnx-ad differentiates only with respect to its input. A transposed
  convolution is the adjoint of the ``Conv`` with the same weight and attributes, so its input
  gradient is that ``Conv`` of the output gradient, its weight gradient the weight gradient of
  that ``Conv`` (a ``ConvGrad`` whose output gradient is the forward's input), and its bias
  gradient the output gradient summed over batch and space. Becomes ``ConvTranspose`` again.

* ``BatchNormTraining(X, scale, B) -> (Y, mean, var)`` (attributes ``epsilon``, ``axes``):
  BatchNorm over the batch's own statistics, as torch's training-mode BatchNorm; the torch
  bridge writes one for each. Its reverse is torch's formula, a few reductions (see
  :func:`_batch_norm_training_reverse`), where differentiating the statistics' operations one by
  one gave tens of nodes per BatchNorm (ResNet-18's and MobileNetV3's backward graphs were most
  of their nodes). Becomes those operations in standard ONNX (:func:`_batch_norm_training_nodes`).

Two of onnx-ad's rules are extended, not replaced. ``Pad`` in ``reflect``, ``edge`` and ``wrap``
modes (torch's ReflectionPad, ReplicationPad and CircularPad), which onnx-ad refuses: the
gradient is the output gradient's centre plus, on each padded axis (last first), the padded
rows accumulated onto the rows they copied (reversed for reflect, summed onto the edge row for
edge, onto the opposite end for wrap); the pads must be constant and not negative. And
``Slice``: onnx-ad computes the zero padding that undoes a slice from the data's static shape,
and refuses a slice of data without one, with computed starts, or with steps other than 1.
Where it refuses so, ortagent's rule computes the padding in the graph (``Shape`` of the data,
the starts clamped as Slice clamps them, the slice's length from its gradient), so backward
graphs keep symbolic batch and sequence dimensions, also inside the function bodies onnx-ad
expands (``SoftmaxCrossEntropyLoss``); a strided slice (``x[::2]``, ``flip``) scatters the
gradient rows back to the positions they were read from. Axes and steps must be constants;
without axes, starts of a length shape inference cannot tell (computed in a loop body, as in
torch's embedding_bag) slice the first that many axes, counted at run time.

Two more are extended: ``Pow``, whose integer exponent (torch writes ``x ** 2`` with an int64
one) onnx-ad tried to differentiate and refused for float32 bases; and ``AveragePool`` with
``ceil_mode=1`` (its last windows may overhang the input) or padding, whose gradient spreads the output
gradient, divided by onnxruntime's own divisor per window, back over each window's elements
inside the input (see :func:`_padded_average_pool_reverse`).

``DFT`` is extended to the inverse onesided transform (torch's ``irfft``, ``hfft`` and the last
axis of their 2-d and n-d forms), which onnx-ad refuses: its reverse is the forward onesided
transform of the output gradient, scaled by ``1/n``, with the bins that stand for two in the
full spectrum doubled (see :func:`_c2r_dft_reverse`).

``ScatterElements`` with ``reduction`` mul, min or max (torch's ``scatter_reduce`` prod, amin,
amax), which onnx-ad refuses as not linear, gets the gradients torch gives (see
:func:`_reducing_scatter_reverse`). ``NegativeLogLikelihoodLoss`` gets a reverse rule of its own (onnx-ad would expand it into the
specification's function body, in which it cannot place its seed axis): see
:func:`_nll_loss_reverse`.

``GatherND`` whose indices have a length known only at run time (torch's ``x[mask]`` and
``masked_select``: NonZero's positions, transposed), which onnx-ad refuses without a static
indices shape, is differentiated as onnx-ad does (ScatterND adding the gradient at the
positions) from the index depth alone (see :func:`_gather_nd_reverse_or_counted`). And where a
broadcast operand's dimensions are known only at run time, the gradient summed back to it is
reshaped to its shape and the one seed axis written as 1, where onnx-ad writes -1, which a
Reshape cannot resolve once a dimension is 0 (a mask selecting nothing; see
:func:`_unbroadcast_at_run_time`).

``LayerNormalization`` over float32 (opset 17 and up) reports its ``Mean`` and ``InvStdDev``:
:func:`prepare` names those outputs where the node leaves them out, and the reverse rule
standardizes the input with them (``(x - mean) * inv_std``, two passes) where onnx-ad's
computed the statistics again (two reductions and five more passes over the input); the
gradient's formula is onnx-ad's (see :func:`_layer_norm_parts_from_statistics`).

With ortagent's CPU gradient kernels asked for (``build_training_graph(cpu_kernels=True)``,
see :func:`differentiating`; the graph then runs on onnxruntime's CPU provider with
``SessionOptions.add_cpu_training_kernels()``), these gradients are one node of the domain
``ai.ortagent.cpu`` each (include/ortagent/cpu_kernels.h), float32 only: a LayerNormalization's
(``LayerNormalizationGrad`` over the statistics it reports, where its scale has the normalised
dimensions' shape), a BatchNormTraining's over every axis but the channels
(``BatchNormTrainingGrad``; :func:`finish` writes its forward as the kernels' ``BatchNormTraining``
too), a GELU's of the erf form (``GeluGrad``: :func:`prepare` collapses the five nodes torch's
exporter writes into a private ``ErfGelu`` whose reverse it is, and :func:`finish` writes it as
onnxruntime's ``com.microsoft:Gelu``), Relu's, HardSwish's and HardSigmoid's (``ReluGrad``, ``HardSwishGrad``,
``HardSigmoidGrad`` from the activation's input), and a Softmax's over the last axis
(``SoftmaxGrad`` from its output). The kernels' one forward operator besides those,
``MaskedSoftmax``, is written after differentiation by
:func:`ortagent._graph_passes.masked_softmax_in_parts`. Other graphs are as without the kernels.

``HardSwish``'s derivative is replaced by torch's (see :func:`_hard_swish_derivative`).

``ReduceMean``'s rule divides by the reduced count as ``Size(x) / max(Size(y), 1)``, so
that a mean over an empty batch runs (see :func:`_reduce_reverse_or_empty_mean`).

``ReduceProd``'s rule is replaced: onnx-ad writes the product of the other elements as
``y / x``, inf or NaN where ``x`` is zero; ortagent's counts the zeros of each reduced slice
and is exact at them, as torch's ``prod`` backward is (see :func:`_reduce_prod_reverse`).

``Det``'s rule is replaced too: onnx-ad gives a determinant a zero gradient; ortagent's is the
cofactor matrix, for a static order up to 16 (see :func:`_det_reverse`). onnxruntime's contrib
``com.microsoft:Inverse`` (torch's ``linalg.inv``, see ortagent/torch/translations/linalg.py)
gets the rule ``-Y^T g Y^T`` (see :func:`_inverse_reverse`).

At ties and bounds three of onnx-ad's rules follow torch's conventions instead of their own
(see :func:`_clip_reverse_or_strict` and :func:`_extremum_reverse_or_halved`): ``Clip`` passes
no gradient where the input equals a constant bound (torch's ``clamp``, ``hardtanh``,
``relu6``), and a two-operand ``Max`` or ``Min`` gives each operand half of a tie's gradient
(torch's ``maximum``, ``minimum``, ``clamp`` with tensor bounds). Only the values at a tie or
bound change, and only in the backward: Clip's rule builds two nodes fewer than onnx-ad's,
Max's and Min's six more (the tie test and a comparison per operand).

ONNX shape inference does not know these operators, so :func:`prepare` declares each one's
result type (inferred before the renaming, or that of its operand) for onnx-ad's shape queries.

Pure Python over ``onnx`` and ``onnx-ad``.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager

import numpy as np
import onnx
from onnx import ModelProto, ValueInfoProto

from ._ctc import CTC_LOSS, CTC_LOSS_GRAD, ctc_loss_grad_nodes, ctc_loss_nodes, ctc_loss_reverse
from ._onnx_graph import NameAllocator, all_value_names, constant_values, walk_graphs
from .errors import OrtNotImplemented

__all__ = ["DOMAIN", "STOP_GRADIENT", "BATCH_NORM_TRAINING", "CPU_KERNELS_DOMAIN", "CPU_KERNEL_OPS", "prepare",
           "finish", "uses_private_ops", "differentiating", "kernel_outputs_like"]

DOMAIN = "ai.ortagent.ad"
STOP_GRADIENT = "StopGradient"
CONVOLUTION = "Convolution"
CONVOLUTION_TRANSPOSE = "ConvolutionTranspose"
BATCH_NORM_TRAINING = "BatchNormTraining"
GELU = "ErfGelu"        # x * cdf(x), written as torch's exporter writes it (see _collapse_gelus)
_PRIVATE = {STOP_GRADIENT, CONVOLUTION, CONVOLUTION_TRANSPOSE, BATCH_NORM_TRAINING, GELU, CTC_LOSS, CTC_LOSS_GRAD}
# ortagent's CPU gradient kernels (include/ortagent/cpu_kernels.h), emitted only on request
# (see differentiating); a session runs them once SessionOptions.add_cpu_training_kernels() was called
CPU_KERNELS_DOMAIN = "ai.ortagent.cpu"
# for each operator, the input each output is shaped like (for shape inference and declarations)
CPU_KERNEL_OUTPUTS_LIKE = {"LayerNormalizationGrad": (1, 2, 2), "BatchNormTrainingGrad": (1, 2, 2),
                           "GeluGrad": (1,), "BatchNormTraining": (0, 1, 1), "ReluGrad": (1,),
                           "HardSwishGrad": (1,), "HardSigmoidGrad": (1,), "SoftmaxGrad": (1,),
                           "MaskedSoftmax": (0,)}
# the activations whose gradient is one node of the CPU kernels: operator -> kernel
_ACTIVATION_KERNELS = {"Relu": "ReluGrad", "HardSwish": "HardSwishGrad", "HardSigmoid": "HardSigmoidGrad"}
CPU_KERNEL_OPS = frozenset(CPU_KERNEL_OUTPUTS_LIKE)
_CONV_GRAD_OPSET = 16           # the lowering of ConvGrad needs it
_MS_DOMAIN = "com.microsoft"


def kernel_outputs_like(node) -> tuple[int, ...] | None:
    """For a node the CPU kernels' graphs hold that ONNX's shape inference does not know (the
    kernels, and the ``com.microsoft:Gelu`` a collapsed GELU's forward becomes), the input each
    output is shaped like; None for others."""
    if node.domain == CPU_KERNELS_DOMAIN:
        return CPU_KERNEL_OUTPUTS_LIKE.get(node.op_type)
    if node.domain == _MS_DOMAIN and node.op_type == "Gelu":
        return (0,)
    return None


_registered = False
_lock = threading.Lock()


def _stop_gradient_reverse(ctx, node, grads):      # onnx-ad's rule signature
    return [None] * len(node.input)


def _stop_gradient_forward(ctx, node, tangents):
    return [None] * len(node.output)


def _output_gradient(ctx, node, grads, stem):
    """(inputs padded to three, which of them a gradient is asked of, the output's gradient
    without its trailing seed axis), or None when no gradient is asked of any input."""
    inputs = list(node.input) + [""] * (3 - len(node.input))
    wanted = [bool(name) and ctx.asked_for(name) for name in inputs[:3]]
    if not any(wanted):
        return None
    return inputs, wanted, _without_seed_axis(ctx, grads[0], node.output[0], stem)


def _without_seed_axis(ctx, grad, output, stem):
    """The gradient of ``output`` (full-shaped) without its trailing seed axis."""
    return ctx.b.op("Squeeze", [ctx.full(grad, output), ctx.b.ints([-1])], stem=stem)


def _kernel_node(ctx, op_type: str, operands: list[str], stem: str, outputs: int = 1, **attrs):
    """One node of ortagent's CPU kernels (named, for the passes' shape-inference stand-ins);
    its output name, or names when ``outputs`` > 1."""
    result = ctx.b.op(op_type, operands, outputs=outputs, stem=f"{stem}_grad", domain=CPU_KERNELS_DOMAIN, **attrs)
    ctx.b.nodes[-1].name = ctx.b.name(f"{stem}_grad_node")
    return result


def _unary_kernel_reverse(ctx, node, grads, op_type: str, operand: str, stem: str, **attrs):
    """The reverse of a one-input operator as one kernel node of (dY, ``operand``) -> dX."""
    dy = _without_seed_axis(ctx, grads[0], node.output[0], f"{stem}_dy")
    return [_with_seed_axis(ctx, _kernel_node(ctx, op_type, [dy, operand], stem, **attrs), f"{stem}_adjoint")]


def _with_seed_axis(ctx, name, stem):
    return ctx.b.op("Unsqueeze", [name, ctx.b.ints([-1])], stem=stem)


def _conv_grad(ctx, operands, attrs, keep, stem):
    """One com.microsoft:ConvGrad node over (dY, X, W) giving (dX, dW, dB); the outputs ``keep``
    does not ask for are left unnamed (so the lowering does not compute them) and returned as
    None."""
    outputs = ctx.b.op("ConvGrad", operands, outputs=3, stem=stem, domain=_MS_DOMAIN, **attrs)
    grad_node = ctx.b.nodes[-1]
    for index, asked in enumerate(keep):
        if not asked:
            grad_node.output[index] = ""
    return [name if asked else None for name, asked in zip(outputs, keep)]


def _convolution_reverse(ctx, node, grads):
    """dX, dW and dB of a convolution from one ConvGrad node (only the wanted outputs named)."""
    found = _output_gradient(ctx, node, grads, "conv_dy")
    if found is None:
        return [None] * len(node.input)
    inputs, wanted, dy = found
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
    keep = [wanted[index] and index < len(node.input) for index in range(3)]
    gradients = _conv_grad(ctx, [dy, inputs[0], inputs[1]], attrs, keep, "conv_grad")
    return [None if name is None else _with_seed_axis(ctx, name, "conv_adjoint")
            for name in gradients[:len(node.input)]]


_CONV_ATTRIBUTES = ("kernel_shape", "strides", "pads", "dilations", "group")


def _convolution_transpose_reverse(ctx, node, grads):
    """dX, dW and dB of a transposed convolution through its adjoint Conv (see the module's
    docstring)."""
    found = _output_gradient(ctx, node, grads, "convt_dy")
    if found is None:
        return [None] * len(node.input)
    inputs, wanted, dy = found
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name in _CONV_ATTRIBUTES}
    contributions: list = [None] * len(node.input)
    if wanted[0]:
        # (the adjoint Conv has the input's extent when output_padding < stride, which
        # onnxruntime's ConvTranspose requires; torch allows up to the dilation)
        dx = ctx.b.op("Conv", [dy, inputs[1]], stem="convt_dx", **attrs)
        contributions[0] = _with_seed_axis(ctx, dx, "convt_adjoint")
    if wanted[1]:
        dw = _conv_grad(ctx, [inputs[0], dy, inputs[1]], attrs, [False, True, False], "convt_grad")[1]
        contributions[1] = _with_seed_axis(ctx, dw, "convt_adjoint")
    if len(node.input) > 2 and wanted[2]:
        axes = ctx.b.ints([0, *range(2, ctx.rank(node.input[0]))])
        db = ctx.b.op("ReduceSum", [dy, axes], keepdims=0, stem="convt_db")
        contributions[2] = _with_seed_axis(ctx, db, "convt_adjoint")
    return contributions


_INT64_MAX = 2**63 - 1


def _pad_reverse_or_copying(constant_rule):
    def reverse(ctx, node, grads):
        from onnx_ad._build import UnsupportedOperator, attribute

        mode = attribute(node, "mode", "constant")
        if isinstance(mode, bytes):
            mode = mode.decode()
        if mode == "constant" or ctx.opset < 11:
            return _cropped_rows_restored(ctx, node, constant_rule(ctx, node, grads))
        if mode not in ("reflect", "edge", "wrap"):
            raise UnsupportedOperator(f"Pad in mode {mode!r} is not differentiated")
        return _copying_pad_reverse(ctx, node, grads, mode)

    reverse.__wrapped__ = constant_rule
    return reverse


def _constant_pad_widths(ctx, node) -> tuple[list[int], list[int]] | None:
    """(before, after) per axis of a Pad's input, or None where its pads or axes are not constants."""
    rank = ctx.rank(node.input[0])
    pads = ctx.integers(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    axes = ctx.integers(node.input[3]) if len(node.input) > 3 and node.input[3] else list(range(rank))
    if pads is None or axes is None:
        return None
    before, after = [0] * rank, [0] * rank
    for position, axis in enumerate(axes):
        before[axis % rank], after[axis % rank] = pads[position], pads[len(axes) + position]
    return before, after


def _cropped_rows_restored(ctx, node, gradients: list) -> list:
    """onnx-ad's constant Pad reverse with the rows a negative pad cropped given back as zeros:
    its Slice undoes only the positive pads, so a crop left the input's gradient short along
    that axis (torch's `F.pad(x, (0, 0, 1, -1))`, RWKV's time shift: a gradient one row short,
    which onnxruntime's Sum then broadcast onto the other contributions where that axis had
    size 2, silently)."""
    from onnx_ad._build import UnsupportedOperator

    if gradients[0] is None:
        return gradients
    widths = _constant_pad_widths(ctx, node)      # (before opset 11 the pads are an attribute: None)
    if widths is None or min(widths[0] + widths[1]) >= 0:
        return gradients            # (onnx-ad's rule refuses pads that are not constants)
    if ctx.opset < 18:
        raise UnsupportedOperator("Pad with negative pads (cropping) is differentiated from opset 18 on")
    before, after = widths
    # (the axes named: a gradient may carry axes after the input's own)
    restore = [max(-width, 0) for width in before] + [max(-width, 0) for width in after]
    gradients = list(gradients)
    gradients[0] = ctx.b.op("Pad", [gradients[0], ctx.b.ints(restore), "", ctx.b.ints(range(len(before)))],
                            mode="constant", stem="pad_cropped_rows")
    return gradients


def _copying_pad_reverse(ctx, node, grads, mode):
    """Reverse of Pad(mode=reflect|edge|wrap): undo one axis at a time, the last padded first
    (Pad over several axes is the composition of one-axis pads, each copying the rows of the
    one before)."""
    from onnx_ad._build import UnsupportedOperator

    widths = _constant_pad_widths(ctx, node)
    if widths is None:
        raise UnsupportedOperator("Pad is differentiable only with constant pads and a constant 'axes' operand")
    if min(widths[0] + widths[1]) < 0:
        raise UnsupportedOperator("Pad with negative pads (cropping) is differentiated only in constant mode")
    grad = ctx.full(grads[0], node.output[0])

    def cut(value, start, end, axis):
        return ctx.b.op("Slice", [value, ctx.b.ints([start]), ctx.b.ints([end]), ctx.b.ints([axis])],
                        stem="pad_rows")

    def flip(value, axis):
        return ctx.b.op("Slice", [value, ctx.b.ints([-1]), ctx.b.ints([-_INT64_MAX]), ctx.b.ints([axis]),
                                  ctx.b.ints([-1])], stem="pad_flip")

    def add_rows(value, start, end, extra, axis):
        """``value`` with ``extra`` added to its rows start:end on ``axis`` (end 0: to the end)."""
        parts = [cut(value, 0, start, axis)] if start != 0 else []
        parts.append(ctx.b.op("Add", [cut(value, start, end if end != 0 else _INT64_MAX, axis), extra],
                              stem="pad_accumulated"))
        if end != 0:
            parts.append(cut(value, end, _INT64_MAX, axis))
        return parts[0] if len(parts) == 1 else ctx.b.op("Concat", parts, axis=axis, stem="pad_rows_joined")

    for axis in reversed(range(len(widths[0]))):       # (one-axis pads commute)
        before, after = widths[0][axis], widths[1][axis]
        if not before and not after:
            continue
        head = cut(grad, 0, before, axis) if before else None
        tail = cut(grad, -after, _INT64_MAX, axis) if after else None
        grad = cut(grad, before, -after if after else _INT64_MAX, axis)
        if mode == "edge":
            if head is not None:
                grad = add_rows(grad, 0, 1, ctx.b.op("ReduceSum", [head, ctx.b.ints([axis])], keepdims=1), axis)
            if tail is not None:
                grad = add_rows(grad, -1, 0, ctx.b.op("ReduceSum", [tail, ctx.b.ints([axis])], keepdims=1), axis)
        elif mode == "reflect":     # head rows copy x[before..1], tail rows x[L-2..L-1-after]
            if head is not None:
                grad = add_rows(grad, 1, before + 1, flip(head, axis), axis)
            if tail is not None:
                grad = add_rows(grad, -after - 1, -1, flip(tail, axis), axis)
        else:                        # wrap: head rows copy x[L-before:], tail rows x[:after]
            if head is not None:
                grad = add_rows(grad, -before, 0, head, axis)
            if tail is not None:
                grad = add_rows(grad, 0, after, tail, axis)
    return [grad] + [None] * (len(node.input) - 1)


def _concat_reverse_or_measured(static_rule):
    """Concat's reverse where an operand's extent along the axis is not declared (a size that
    depends on values, as the tokens a mixture-of-experts layer routes to an expert: JetMoE):
    each operand's gradient is sliced between offsets summed from the operands' extents,
    measured with Shape at run time."""
    def reverse(ctx, node, grads):
        from onnx_ad._build import UnsupportedOperator

        try:
            return static_rule(ctx, node, grads)
        except UnsupportedOperator as refusal:
            if "concatenated extent" not in str(refusal) or ctx.opset < 10:
                raise
        axis = next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "axis")
        axis %= ctx.rank(node.output[0])
        seeded = ctx.full(grads[0], node.output[0])
        begin, contributions = ctx.b.ints([0]), []
        for name in node.input:
            shape = ctx.shapes.shape(name)
            extent = ctx.b.ints([shape[axis]]) if shape is not None and isinstance(shape[axis], int) else \
                ctx.b.op("Gather", [ctx.shape_of(name), ctx.b.ints([axis])], axis=0, stem="concat_extent")
            end = ctx.b.op("Add", [begin, extent], stem="concat_end")
            contributions.append(ctx.b.op("Slice", [seeded, begin, end, ctx.b.ints([axis])], stem="concat_part"))
            begin = end
        return contributions

    reverse.__wrapped__ = static_rule
    return reverse


def _slice_reverse_or_symbolic(static_rule):
    def reverse(ctx, node, grads):
        from onnx_ad._build import UnsupportedOperator

        try:
            return static_rule(ctx, node, grads)
        except UnsupportedOperator:
            if len(node.input) < 3 or ctx.opset < 10:
                raise
            return _symbolic_slice_reverse(ctx, node, grads)

    reverse.__wrapped__ = static_rule
    return reverse


def _slice_start(ctx, begin, extent, highest):
    """A Slice start as Slice reads it: counted from the end when negative, then clamped to
    [0, highest] (int64 tensors)."""
    zero = ctx.b.ints([0])
    begin = ctx.b.op("Where", [ctx.b.op("Less", [begin, zero]), ctx.b.op("Add", [begin, extent]), begin],
                     stem="slice_from_end")
    return ctx.b.op("Min", [ctx.b.op("Max", [begin, zero]), highest], stem="slice_begin")


def _strided_slice_reverse(ctx, data, starts, axes, steps, seeded):
    """The gradient of a Slice with steps other than 1 (``x[::2]``, ``flip``): on each sliced
    axis, last first, the gradient rows are scattered to the positions they were read from,
    ``start + i * step`` with the start clamped as Slice clamps it for the step's sign, into
    zeros of the data's extent on that axis."""
    rank = ctx.rank(data)
    zero_value = onnx.helper.make_tensor("zero", ctx.dtype(data), [1], [0])
    begins = ctx.b.op("Cast", [starts], to=onnx.TensorProto.INT64, stem="slice_starts")
    grad = seeded
    for position in reversed(range(len(axes))):
        axis, step = axes[position], steps[position]
        extent = ctx.b.op("Gather", [ctx.shape_of(data), ctx.b.ints([axis])], axis=0, stem="slice_extent")
        begin = ctx.b.op("Gather", [begins, ctx.b.ints([position])], axis=0, stem="slice_start")
        # a positive step starts within [0, extent], a negative one within [0, extent - 1]
        highest = extent if step > 0 else ctx.b.op("Sub", [extent, ctx.b.ints([1])], stem="slice_last")
        begin = _slice_start(ctx, begin, extent, highest)
        grad_shape = ctx.b.op("Shape", [grad], stem="slice_grad_shape")
        length = ctx.b.op("Squeeze", [ctx.b.op("Gather", [grad_shape, ctx.b.ints([axis])], axis=0)], stem="slice_length")
        steps_taken = ctx.b.op("Range", [ctx.b.constant(0, onnx.TensorProto.INT64, ()), length,
                                         ctx.b.constant(1, onnx.TensorProto.INT64, ())], stem="slice_steps")
        positions = ctx.b.op("Add", [begin, ctx.b.op("Mul", [steps_taken, ctx.b.ints([step])])], stem="slice_positions")
        others = [a for a in range(rank + 1) if a != axis]          # (the seed axis included)
        positions = ctx.b.op("Unsqueeze", [positions, ctx.b.ints(others)], stem="slice_positions_along")
        index = ctx.b.op("Expand", [positions, grad_shape], stem="slice_index")
        target = ctx.b.op("ScatterElements", [grad_shape, ctx.b.ints([axis]), extent], axis=0, stem="slice_target")
        zeros = ctx.b.op("ConstantOfShape", [target], value=zero_value, stem="slice_zeros")
        grad = ctx.b.op("ScatterElements", [zeros, index, grad], axis=axis, stem="slice_scattered")
    return grad


def _symbolic_slice_reverse(ctx, node, grads):
    """The gradient of a Slice with step 1 as a Pad of the output's gradient, the pads computed
    at run time: before = the clamped start, after = extent - start - the slice's length."""
    from onnx_ad._build import UnsupportedOperator

    data = node.input[0]
    rank = ctx.rank(data)
    starts = node.input[1]
    count = ctx.integers(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    if len(node.input) > 3 and node.input[3] and count is None:
        raise UnsupportedOperator("Slice is differentiable only with a constant 'axes' operand")
    steps = ctx.integers(node.input[4]) if len(node.input) > 4 and node.input[4] else None
    if len(node.input) > 4 and node.input[4] and steps is None:
        raise UnsupportedOperator("Slice is differentiable only with a constant 'steps' operand")
    seeded = ctx.full(grads[0], node.output[0])
    axes_value = None
    if count is None:
        width = ctx.shapes.shape(starts)
        if width is None or len(width) != 1 or not isinstance(width[0], int):
            if steps is not None:
                raise UnsupportedOperator("Slice without axes is differentiable only with starts of a known length")
            # the first len(starts) axes, counted at run time (starts computed in a loop body)
            axes_value = ctx.b.op("Range", [ctx.b.constant(0, onnx.TensorProto.INT64, ()),
                                            ctx.b.op("Size", [starts], stem="slice_count"),
                                            ctx.b.constant(1, onnx.TensorProto.INT64, ())], stem="slice_axes")
            count = []
        else:
            count = list(range(width[0]))
    axes = [a % rank for a in count]
    if steps is not None and any(step != 1 for step in steps):
        return [_strided_slice_reverse(ctx, data, starts, axes, steps, seeded)] + [None] * (len(node.input) - 1)
    if axes_value is None:
        axes_value = ctx.b.ints(axes)
    extents = ctx.b.op("Gather", [ctx.shape_of(data), axes_value], axis=0, stem="slice_extents")
    lengths = ctx.b.op("Gather", [ctx.b.op("Shape", [seeded], stem="slice_grad_shape"), axes_value],
                       axis=0, stem="slice_lengths")
    begin = ctx.b.op("Cast", [starts], to=onnx.TensorProto.INT64, stem="slice_starts")
    begin = _slice_start(ctx, begin, extents, extents)
    after = ctx.b.op("Sub", [ctx.b.op("Sub", [extents, begin]), lengths], stem="slice_after")
    # pads for rank + 1 axes (the trailing seed axis is not padded): befores, then afters
    positions = ctx.b.op("Concat", [axes_value, ctx.b.op("Add", [axes_value, ctx.b.ints([rank + 1])])], axis=0,
                         stem="slice_pad_positions")
    pads = ctx.b.op("ScatterElements", [ctx.b.ints([0] * (2 * (rank + 1))), positions,
                                        ctx.b.op("Concat", [begin, after], axis=0)],
                    axis=0, stem="slice_pads")
    padded = ctx.b.op("Pad", [seeded, pads], mode="constant", stem="slice_padded")
    return [padded] + [None] * (len(node.input) - 1)


def _pow_reverse_or_integer(rule):
    """onnx-ad's Pow rule builds the exponent's derivative (``y log a``) even where no
    gradient is asked of the exponent, and refuses it when the exponent is of another type
    than the base (torch writes ``x ** 2`` with an int64 exponent): then only the base's
    gradient ``b a^(b-1)`` is built, the integer exponent cast to the base's type."""
    def reverse(ctx, node, grads):
        exponent = node.input[1]
        if ctx.is_float(exponent) and ctx.shapes.dtype(exponent) == ctx.shapes.dtype(node.input[0]) \
                and ctx.asked_for(exponent):
            return rule(ctx, node, grads)
        from onnx_ad.rules import _pow_d_base

        seeded = ctx.b.op("Mul", [grads[0], ctx.lift(_pow_d_base(ctx, node))], stem="pow_base")
        return [ctx.unbroadcast(seeded, ctx.rank(node.output[0]), node.input[0]), None]

    reverse.__wrapped__ = rule
    return reverse


def _average_pool_reverse_or_padded(rule):
    def reverse(ctx, node, grads):
        from onnx_ad._build import attribute

        if not attribute(node, "ceil_mode", 0) and not any(attribute(node, "pads", None) or []):
            return rule(ctx, node, grads)
        # (with padding, onnx-ad's ConvTranspose names the input's extent in output_shape,
        # for which ONNX's shape inference returns a rank-2 shape when the input is smaller
        # than the full transposed convolution: onnxruntime then refuses the graph)
        return _padded_average_pool_reverse(ctx, node, grads)

    reverse.__wrapped__ = rule
    return reverse


def _padded_average_pool_reverse(ctx, node, grads):
    """The gradient of an AveragePool with ``ceil_mode=1``, whose last windows may overhang
    the input (and its padding), which onnx-ad refuses, or with padding (onnx-ad's rule then
    makes a graph onnxruntime cannot load, see the caller). The pooling is linear,
    ``y[o] = W(x)[o] / d[o]`` with ``W`` the sum over each window's elements inside the input
    and ``d[o]`` a divisor fixed by the position alone, so ``dx = W^T(dy / d)``.

    A window is a box, so ``W`` is separable: per spatial axis a 0/1 matrix ``M[i, o]`` (input
    position ``i`` lies in window ``o``: ``0 <= i - (o * stride - pad_begin) < kernel``), built
    at run time from the two extents, so they may be symbolic. ``W^T`` is then one MatMul per
    axis, whose cost does not grow with the kernel (a ConvTranspose with a kernel of ones did:
    HF EfficientNet's 1280-wide pool over a 2 x 2 map spread every value over 1280 x 1280
    positions, 37 s a backward). ``1 / d`` is read off the node itself: AveragePool of ones
    (one image of one channel, the node's own attributes, so the divisor is onnxruntime's,
    whatever its rule for padding and overhang) divided by the count of input elements in each
    window (the product of ``M``'s column sums)."""
    from onnx_ad._build import UnsupportedOperator, attribute

    x, y = node.input[0], node.output[0]
    auto_pad = attribute(node, "auto_pad", "NOTSET")
    pads = attribute(node, "pads", None)
    if auto_pad not in ("NOTSET", "VALID") or (auto_pad == "VALID" and pads and any(pads)):
        raise UnsupportedOperator(f"AveragePool with auto_pad={auto_pad} and ceil_mode=1 is not differentiated")
    kernel = list(attribute(node, "kernel_shape"))
    spatial = len(kernel)
    strides = list(attribute(node, "strides", None) or [1] * spatial)
    dilations = list(attribute(node, "dilations", None) or [1] * spatial)
    if any(d != 1 for d in dilations):         # (AveragePool has dilations from opset 19 on)
        raise UnsupportedOperator("AveragePool with dilations and ceil_mode or padding is not differentiated")
    pads = list(pads or [0] * (2 * spatial))
    dtype = ctx.dtype(x)
    rank = 2 + spatial
    zero, one = ctx.b.ints([0]), ctx.b.ints([1])

    def scalar(value):
        return ctx.b.constant(value, onnx.TensorProto.INT64, ())

    def extent(name, axis, stem):
        """The size of ``name`` along ``axis``, a 0-d tensor."""
        return ctx.b.op("Gather", [ctx.shape_of(name), scalar(axis)], axis=0, stem=stem)

    def membership(axis):
        """M for spatial axis ``axis``: [input extent, output extent], x's element type."""
        positions = ctx.b.op("Range", [scalar(0), extent(x, 2 + axis, "avgpool_in_extent"), scalar(1)],
                             stem="avgpool_positions")
        windows = ctx.b.op("Range", [scalar(0), extent(y, 2 + axis, "avgpool_out_extent"), scalar(1)],
                           stem="avgpool_windows")
        starts = ctx.b.op("Sub", [ctx.b.op("Mul", [windows, scalar(strides[axis])]), scalar(pads[axis])],
                          stem="avgpool_starts")
        offsets = ctx.b.op("Sub", [ctx.b.op("Unsqueeze", [positions, one]), ctx.b.op("Unsqueeze", [starts, zero])],
                           stem="avgpool_offsets")                                  # [in, out]
        inside = ctx.b.op("And", [ctx.b.op("GreaterOrEqual", [offsets, scalar(0)]),
                                  ctx.b.op("Less", [offsets, scalar(kernel[axis])])],
                          stem="avgpool_inside")
        return ctx.b.op("Cast", [inside], to=dtype, stem="avgpool_membership")

    matrices = [membership(axis) for axis in range(spatial)]

    # 1/d: AveragePool of ones (the node's attributes) over the count of input elements per window
    in_extents = ctx.b.op("Gather", [ctx.shape_of(x), ctx.b.ints(list(range(2, rank)))], axis=0,
                          stem="avgpool_in_extents")
    image = ctx.b.op("Concat", [ctx.b.ints([1, 1]), in_extents], axis=0, stem="avgpool_one_image")
    ones = ctx.b.op("ConstantOfShape", [image], value=onnx.helper.make_tensor("one", dtype, [1], [1]),
                    stem="avgpool_ones")
    averaged = ctx.b.op("AveragePool", [ones], stem="avgpool_of_ones",
                        **{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
    counted = None
    for axis, matrix in enumerate(matrices):
        sums = ctx.b.op("ReduceSum", [matrix, zero], keepdims=0, stem="avgpool_window_counts")
        shape = [1] * rank
        shape[2 + axis] = -1
        sums = ctx.b.op("Reshape", [sums, ctx.b.ints(shape)], stem="avgpool_counts_axis")
        counted = sums if counted is None else ctx.b.op("Mul", [counted, sums], stem="avgpool_counts")
    reciprocal = ctx.b.op("Div", [averaged, counted], stem="avgpool_reciprocal")

    g = ctx.b.op("Squeeze", [ctx.full(grads[0], y), ctx.b.ints([-1])], stem="avgpool_grad")
    dx = ctx.b.op("Mul", [g, reciprocal], stem="avgpool_scaled")
    for axis, matrix in enumerate(matrices):
        # the axis last, its windows summed into the input positions, the axis back in place
        order = [a for a in range(rank) if a != 2 + axis] + [2 + axis]
        back = [order.index(a) for a in range(rank)]
        moved = dx if axis == spatial - 1 else ctx.b.op("Transpose", [dx], perm=order, stem="avgpool_axis_last")
        spread = ctx.b.op("MatMul", [moved, ctx.b.op("Transpose", [matrix], perm=[1, 0])], stem="avgpool_spread")
        dx = spread if axis == spatial - 1 else ctx.b.op("Transpose", [spread], perm=back, stem="avgpool_axis_back")
    return [_with_seed_axis(ctx, dx, "avgpool_adjoint")]


def _dft_reverse_or_c2r(rule):
    def reverse(ctx, node, grads):
        from onnx_ad._build import attribute

        if attribute(node, "inverse", 0) and attribute(node, "onesided", 0):
            return _c2r_dft_reverse(ctx, node, grads)
        return rule(ctx, node, grads)

    reverse.__wrapped__ = rule
    return reverse


def _c2r_dft_reverse(ctx, node, grads):
    """The gradient of an inverse onesided DFT (complex to real, IRFFT): ``x`` holds the bins
    ``0 .. n//2`` of a Hermitian spectrum (a trailing (re, im) axis), ``y`` the real signal of
    length ``n`` (``[..., n, 1]``, as onnxruntime returns it):

        y[t] = (1/n) (Re x[0] + sum_{0<k<n/2} 2 Re(x[k] w^kt) + [n even] Re x[n/2] (-1)^t),
        w = exp(2 pi i / n)

    (the imaginary parts of bin 0 and, for even n, bin n/2 are not read). So dL/dRe x[k] =
    (c_k/n) sum_t g[t] cos(2 pi k t / n) and dL/dIm x[k] = -(c_k/n) sum_t g[t] sin(2 pi k t / n),
    with c_k = 2 for the bins that stand for two (all but bin 0 and, for even n, bin n/2) and 1
    for the others: the forward onesided DFT of ``g`` with each bin scaled by ``c_k / n``,
    which is what torch's ``_fft_c2r`` backward computes. Needs static shapes, a constant
    ``dft_length`` and ``n//2 + 1`` input bins (what torch hands the exporter: it resizes
    the spectrum first)."""
    from onnx_ad._build import UnsupportedOperator
    from onnx_ad.rules import _dft, _dft_axis, _seed_back, _seed_front

    x, y = node.input[0], node.output[0]
    shape_in, shape_out = ctx.shapes.static(x), ctx.shapes.static(y)
    if shape_in is None or shape_out is None:
        raise UnsupportedOperator("an inverse onesided DFT needs declared shapes to be differentiated in reverse")
    axis, as_input = _dft_axis(ctx, node)
    bins = shape_in[axis]
    length = 2 * (bins - 1)
    if len(node.input) > 1 and node.input[1]:
        given = ctx.integers(node.input[1])
        if given is None:
            raise UnsupportedOperator("an inverse onesided DFT is differentiable in reverse only with a "
                                      "constant dft_length")
        length = given[0]
    rank = len(shape_in)
    if shape_in[-1] != 2 or shape_out[-1] != 1 or shape_out[axis] != length or bins != length // 2 + 1:
        raise UnsupportedOperator(f"an inverse onesided DFT is differentiated in reverse only from a complex "
                                  f"input of n//2 + 1 bins to a real signal of n; here {shape_in} to "
                                  f"{shape_out} with n = {length}")
    dtype = ctx.dtype(x)
    g = _seed_front(ctx, ctx.full(grads[0], y), rank)               # [seeds, ..., n, 1]
    spectrum = _dft(ctx, g, axis, as_input, onesided=1)             # [seeds, ..., n//2 + 1, 2]
    weights = np.full(bins, 2.0 / length)
    weights[0] = 1.0 / length
    if length % 2 == 0:
        weights[-1] = 1.0 / length
    weight = ctx.b.constant(weights, dtype, (bins,) + (1,) * (rank - axis - 1))
    scaled = ctx.b.op("Mul", [spectrum, weight], stem="c2r_adjoint")
    return [_seed_back(ctx, scaled, rank)] + [None] * (len(node.input) - 1)


def _zeros_like(ctx, name, dtype, stem):
    """Zeros of ``name``'s shape, of element type ``dtype``."""
    return ctx.b.op("ConstantOfShape", [ctx.b.op("Shape", [name])],
                    value=onnx.helper.make_tensor("zero", dtype, [1], [0]), stem=stem)


def _nll_loss_forward(ctx, node, tangents):
    from onnx_ad._build import UnsupportedOperator

    raise UnsupportedOperator("NegativeLogLikelihoodLoss is differentiated in reverse mode only")


def _nll_loss_reverse(ctx, node, grads):
    """The gradient of NegativeLogLikelihoodLoss (torch's nll_loss, also inside the
    SoftmaxCrossEntropyLoss body), which onnx-ad expands into the specification's function body
    and then cannot place its seed axis in. With ``c[n, d] = w[t[n, d]]`` (1 without weights)
    on the targets that are not ``ignore_index`` and 0 on those that are, the loss is
    ``-x[n, t[n, d], d] * c[n, d]``, summed or divided by ``sum(c)`` (mean); so the input's
    gradient is ``-g' c`` scattered to the target class of each position and 0 elsewhere, with
    ``g'`` the output gradient (none), broadcast (sum), or divided by ``sum(c)`` (mean), and 0
    at an ignored target even where ``sum(c)`` is 0. The weights get no gradient (torch does
    not differentiate them either)."""
    from onnx_ad._build import UnsupportedOperator, attribute

    x, target = node.input[0], node.input[1]
    weight = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if weight is not None and ctx.asked_for(weight):
        raise UnsupportedOperator("NegativeLogLikelihoodLoss is not differentiated in its weights")
    if not ctx.asked_for(x):
        return [None] * len(node.input)
    reduction = attribute(node, "reduction", "mean")
    ignore_index = attribute(node, "ignore_index", None)
    dtype = ctx.dtype(x)
    target = ctx.b.op("Cast", [target], to=onnx.TensorProto.INT64, stem="nll_target")
    if ignore_index is not None:
        ignored = ctx.b.op("Equal", [target, ctx.b.constant(ignore_index, onnx.TensorProto.INT64, ())], stem="nll_ignored")
        target = ctx.b.op("Where", [ignored, ctx.b.constant(0, onnx.TensorProto.INT64, ()), target], stem="nll_safe_target")
    zero, one = ctx.constant(0.0, dtype), ctx.constant(1.0, dtype)
    if weight is not None:
        coefficient = ctx.b.op("Gather", [weight, target], axis=0, stem="nll_weights")
    else:
        coefficient = ctx.b.op("Expand", [one, ctx.b.op("Shape", [target])], stem="nll_ones")
    if ignore_index is not None:
        coefficient = ctx.b.op("Where", [ignored, zero, coefficient], stem="nll_kept")
    g = ctx.b.op("Squeeze", [ctx.full(grads[0], node.output[0]), ctx.b.ints([-1])], stem="nll_grad")
    if reduction == "mean":
        g = ctx.b.op("Div", [g, ctx.b.op("ReduceSum", [coefficient], keepdims=0, stem="nll_total_weight")],
                     stem="nll_mean_grad")
    elif reduction not in ("sum", "none"):
        raise UnsupportedOperator(f"NegativeLogLikelihoodLoss with reduction={reduction!r} is not differentiated")
    scale = ctx.b.op("Neg", [ctx.b.op("Mul", [g, coefficient])], stem="nll_scale")
    if ignore_index is not None:
        # an ignored target's gradient is 0, as torch's, also when every target is ignored
        # (a mean over no weight: torch's loss is NaN, its gradient 0)
        scale = ctx.b.op("Where", [ignored, zero, scale], stem="nll_scale_kept")
    zeros = _zeros_like(ctx, x, dtype, "nll_zeros")
    axis = ctx.b.ints([1])
    dx = ctx.b.op("ScatterElements", [zeros, ctx.b.op("Unsqueeze", [target, axis]),
                                      ctx.b.op("Unsqueeze", [scale, axis])], axis=1, stem="nll_dx")
    return [_with_seed_axis(ctx, dx, "nll_adjoint")] + [None] * (len(node.input) - 1)


def _reduce_reverse_or_empty_mean(rule):
    """onnx-ad's ReduceMean rule, with the count the mean divides its gradient by
    taken as ``Size(x) / max(Size(y), 1)``: onnx-ad's integer ``Size(x) / Size(y)`` fails the
    run where the result is empty (RMSNorm or LayerNorm over an empty batch, as torch allows)."""
    def reverse(ctx, node, grads):
        from onnx_ad.rules import _reduction_axes

        axes, keepdims = _reduction_axes(ctx, node)
        if not axes:
            return rule(ctx, node, grads)
        x, y = node.input[0], node.output[0]
        seeded = ctx.full(grads[0], y)
        if not keepdims:
            seeded = ctx.unsqueeze(seeded, axes)
        outputs = ctx.b.op("Max", [ctx.b.op("Size", [y]), ctx.b.constant(1, onnx.TensorProto.INT64, ())])
        count = ctx.b.op("Cast", [ctx.b.op("Div", [ctx.b.op("Size", [x]), outputs])], to=ctx.dtype(x, y))
        return [ctx.b.op("Div", [ctx.full(seeded, x), count], stem="mean_adjoint")]

    reverse.__wrapped__ = rule
    return reverse


def _scatter_elements_reverse_or_reducing(rule):
    def reverse(ctx, node, grads):
        from onnx_ad._build import attribute

        if attribute(node, "reduction", "none") not in ("mul", "min", "max"):
            return rule(ctx, node, grads)
        return _reducing_scatter_reverse(ctx, node, grads)

    reverse.__wrapped__ = rule
    return reverse


def _reducing_scatter_reverse(ctx, node, grads):
    """The gradient of ScatterElements with ``reduction`` mul, min or max (torch's
    ``scatter_reduce`` prod / amin / amax), which onnx-ad refuses as not linear. ``y[p]`` is
    ``data[p]`` combined with every update ``u[i]`` whose index points at ``p``:

    * min / max, as torch: the gradient is shared equally between the candidates equal to
      ``y[p]`` (``data[p]`` and the updates), ``g[p] / count[p]`` each;
    * mul: ``d data[p] = g[p] * prod(u[i] -> p)``, computed as the same scatter over ``data``
      with its zeros replaced by 1, divided by that data; ``d u[i] = g[p] * y[p] / u[i]``,
      except for an update that is the only zero among those at ``p``, whose gradient is
      ``g[p]`` times the scatter with that zero replaced by 1 (exact at zeros, as torch).

    One tie differs from torch: with ``include_self=False`` torch still counts the data it
    left out among the candidates when it equals the result (the updates then get half the
    gradient); the graph here no longer holds that data, and the updates get all of it."""
    from onnx_ad._build import attribute

    data, indices, updates = node.input[0], node.input[1], node.input[2]
    y = node.output[0]
    reduction = attribute(node, "reduction")
    axis = attribute(node, "axis", 0)
    dtype = ctx.dtype(data)
    zero, one = ctx.constant(0.0, dtype), ctx.constant(1.0, dtype)
    g = ctx.b.op("Squeeze", [ctx.full(grads[0], y), ctx.b.ints([-1])], stem="scatter_grad")

    def scatter(target, values, how):
        return ctx.b.op("ScatterElements", [target, indices, values], axis=axis, reduction=how, stem="scatter_acc")

    def gather(values):
        return ctx.b.op("GatherElements", [values, indices], axis=axis, stem="scatter_gathered")

    def as_float(condition):
        return ctx.b.op("Cast", [condition], to=dtype, stem="scatter_mask")

    if reduction in ("min", "max"):
        data_wins = as_float(ctx.b.op("Equal", [data, y]))
        update_wins = as_float(ctx.b.op("Equal", [updates, gather(y)]))
        count = ctx.b.op("Add", [data_wins, scatter(_zeros_like(ctx, y, dtype, "scatter_zeros"), update_wins, "add")],
                         stem="scatter_ties")
        share = ctx.b.op("Div", [g, ctx.b.op("Max", [count, one])], stem="scatter_share")
        to_data = ctx.b.op("Mul", [data_wins, share], stem="scatter_to_data")
        to_updates = ctx.b.op("Mul", [update_wins, gather(share)], stem="scatter_to_updates")
    else:
        data_zero = ctx.b.op("Equal", [data, zero])
        data_or_one = ctx.b.op("Where", [data_zero, one, data], stem="scatter_data_nonzero")
        others = ctx.b.op("Div", [scatter(data_or_one, updates, "mul"), data_or_one], stem="scatter_update_product")
        to_data = ctx.b.op("Mul", [g, others], stem="scatter_to_data")
        update_zero = ctx.b.op("Equal", [updates, zero])
        zeros_at = scatter(_zeros_like(ctx, y, dtype, "scatter_zeros"), as_float(update_zero), "add")
        single = ctx.b.op("And", [update_zero, ctx.b.op("Equal", [gather(zeros_at), one])], stem="scatter_single_zero")
        without_it = scatter(data, ctx.b.op("Where", [single, one, updates]), "mul")
        plain = ctx.b.op("Div", [gather(ctx.b.op("Mul", [g, y])), ctx.b.op("Where", [update_zero, one, updates])])
        to_updates = ctx.b.op("Where", [single, gather(ctx.b.op("Mul", [g, without_it])), plain],
                              stem="scatter_to_updates")
    return [_with_seed_axis(ctx, to_data, "scatter_adjoint") if ctx.asked_for(data) else None, None,
            _with_seed_axis(ctx, to_updates, "scatter_adjoint") if ctx.asked_for(updates) else None]


def _reduce_prod_reverse(ctx, node, grads):
    """The gradient of ReduceProd, exact at zeros as torch's: each element gets the output
    gradient times the product of the other elements of its slice. onnx-ad writes that
    product as ``y / x``, which is inf or NaN wherever ``x`` is zero (torch's ``prod`` on a
    tensor holding zeros got a wrong gradient, silently). Here the zeros of each reduced slice
    are counted: none, ``y / x``; exactly one, the product of the slice's other elements at
    the zero (ReduceProd over the slice with its zeros replaced by 1) and 0 elsewhere; two
    or more, 0 everywhere. Axes as onnx-ad reads them (attribute, or a constant input from
    opset 18; all axes when none are given; none with ``noop_with_empty_axes``); a 0-d
    input passes its gradient through (onnx-ad's axis arithmetic divided by its rank 0)."""
    from onnx_ad.rules import _reduction_axes

    seeded = ctx.full(grads[0], node.output[0])
    if ctx.rank(node.input[0]) == 0:        # a 0-d input (torch: prod(x, 0) of a scalar): y is x
        return [seeded] + [None] * (len(node.input) - 1)
    axes, keepdims = _reduction_axes(ctx, node)
    if not axes:                            # nothing reduced: y is x
        return [seeded] + [None] * (len(node.input) - 1)
    if not keepdims:
        seeded = ctx.unsqueeze(seeded, axes)
    x = node.input[0]
    dtype = ctx.dtype(node.output[0], x)
    zero, one = ctx.constant(0.0, dtype), ctx.constant(1.0, dtype)
    is_zero = ctx.b.op("Equal", [x, zero], stem="prod_is_zero")
    nonzero = ctx.b.op("Where", [is_zero, one, x], stem="prod_nonzero")
    if ctx.opset >= 18:
        rest = ctx.b.op("ReduceProd", [nonzero, ctx.b.ints(axes)], keepdims=1, stem="prod_rest")
    else:
        rest = ctx.b.op("ReduceProd", [nonzero], axes=list(axes), keepdims=1, stem="prod_rest")
    zeros = ctx.reduce_sum(ctx.b.op("Cast", [is_zero], to=dtype, stem="prod_zero_mask"), axes, keepdims=1)
    at_zero = ctx.b.op("Where", [ctx.b.op("Equal", [zeros, one]), rest, zero], stem="prod_at_zero")
    elsewhere = ctx.b.op("Where", [ctx.b.op("Equal", [zeros, zero]), ctx.b.op("Div", [rest, nonzero]), zero],
                         stem="prod_elsewhere")
    weight = ctx.b.op("Where", [is_zero, at_zero, elsewhere], stem="prod_others")
    return [ctx.full(ctx.b.op("Mul", [ctx.lift(weight), seeded]), x)] + [None] * (len(node.input) - 1)


_COFACTOR_LIMIT = 16     # largest order whose Det gradient is built from its n^2 minors


def _det_reverse(ctx, node, grads):
    """Det's gradient: the output gradient times the cofactor matrix of ``A`` (the transposed
    adjugate, ``det(A) * inverse(A)^T`` where ``A`` is invertible), each cofactor the signed
    determinant of a minor, so no inverse is needed and nothing is 0 * inf. Where the
    determinant is exactly 0 the gradient is 0, as torch's is (its rule scales a solve by the
    determinant; the adjugate there would be the true derivative, but not torch's). onnx-ad
    lists Det among the operators a derivative does not flow through (a silent zero); this rule
    replaces it for matrices of an order known at export up to ``_COFACTOR_LIMIT`` (all minors
    at once: two Gathers drop one row and one column each, one batched Det), and refuses the
    gradient of larger or symbolic orders rather than give a wrong one."""
    from onnx_ad._build import UnsupportedOperator

    a = node.input[0]
    if not ctx.asked_for(a):
        return [None]
    shape = ctx.shapes.shape(a)
    n = shape[-1] if shape else None
    if not isinstance(n, int) or n > _COFACTOR_LIMIT:
        raise UnsupportedOperator(f"Det (torch's det, logdet, slogdet) is differentiated for matrices of a static "
                                  f"order up to {_COFACTOR_LIMIT} only (its gradient is built from the cofactors); "
                                  f"this one has order {n}")
    r = len(shape)
    dtype = ctx.dtype(node.output[0], a)
    g = ctx.b.op("Squeeze", [ctx.full(grads[0], node.output[0]), ctx.b.ints([-1])], stem="det_dy")
    g = ctx.b.op("Unsqueeze", [g, ctx.b.ints([-2, -1])], stem="det_dy_matrix")
    if n == 0:          # an empty matrix (determinant 1): an empty gradient
        cofactors = a
    elif n == 1:
        cofactors = ctx.b.op("Expand", [ctx.constant(1.0, dtype), ctx.b.op("Shape", [a])], stem="det_cofactors")
    else:
        others = ctx.b.constant([[k for k in range(n) if k != i] for i in range(n)], onnx.TensorProto.INT64)
        rows = ctx.b.op("Gather", [a, others], axis=r - 2, stem="det_minor_rows")        # (..., n, n-1, n)
        minors = ctx.b.op("Gather", [rows, others], axis=r, stem="det_minor_cols")      # (..., n, n-1, n, n-1)
        minors = ctx.b.op("Transpose", [minors], perm=[*range(r - 2), r - 2, r, r - 1, r + 1], stem="det_minors")
        signs = ctx.b.constant([[(-1.0) ** (i + j) for j in range(n)] for i in range(n)], dtype)
        cofactors = ctx.b.op("Mul", [ctx.b.op("Det", [minors], stem="det_minor_dets"), signs], stem="det_cofactors")
    # torch's gradient at a matrix whose determinant is exactly 0 is 0 (its rule scales the
    # solve by the determinant), not the adjugate: the same here
    det = ctx.b.op("Unsqueeze", [node.output[0], ctx.b.ints([-2, -1])], stem="det_matrix")
    singular = ctx.b.op("Equal", [det, ctx.constant(0.0, dtype)], stem="det_singular")
    cofactors = ctx.b.op("Where", [singular, ctx.constant(0.0, dtype), cofactors], stem="det_cofactors_or_zero")
    grad = ctx.b.op("Mul", [g, cofactors], stem="det_times_cofactors")
    return [_with_seed_axis(ctx, grad, "det_adjoint")]


def _batch_norm_axes(node) -> list[int]:
    return next(list(a.ints) for a in node.attribute if a.name == "axes")


def _batch_norm_epsilon(node) -> float:
    return next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)


def _batch_norm_training_reverse(ctx, node, grads):
    """torch's BatchNorm gradient: with ``x_hat = (x - mean) / sqrt(var + eps)`` and ``n`` the
    count per channel, ``dB = sum(dY)``, ``dscale = sum(dY x_hat)`` and ``dX = scale /
    sqrt(var + eps) * (dY - dB / n - x_hat dscale / n)``, sums over ``axes``. The batch
    statistics are outputs the bridge never differentiates (they update the running buffers):
    a gradient asked of them is refused rather than dropped. With ortagent's CPU kernels (see
    :func:`differentiating`), a float32 BatchNorm over every axis but the channels is one
    ``BatchNormTrainingGrad`` node."""
    from onnx_ad._build import UnsupportedOperator

    if any(grad is not None for grad in grads[1:]):
        raise UnsupportedOperator("BatchNormTraining's batch statistics are not differentiated")
    found = _output_gradient(ctx, node, grads, "batch_norm_dy")
    if found is None:
        return [None] * len(node.input)
    inputs, wanted, dy = found
    x, scale = node.input[0], node.input[1]
    axes = _batch_norm_axes(node)
    shape = ctx.shapes.shape(x)
    if (_cpu_kernels() and scale and len(node.output) >= 3 and node.output[1] and node.output[2]
            and ctx.shapes.dtype(x) == onnx.TensorProto.FLOAT and shape is not None
            and axes == [0, *range(2, len(shape))]):
        result = _fused_gradient(ctx, "BatchNormTrainingGrad", [dy, x, scale, node.output[1], node.output[2]],
                                 wanted, "batch_norm", epsilon=_batch_norm_epsilon(node))
        return result[:len(node.input)]
    view = ctx.b.ints([1, -1] + [1] * (len(axes) - 1))
    dtype = ctx.dtype(x)
    mean = ctx.b.op("Reshape", [node.output[1], view], stem="batch_norm_mean")
    variance = ctx.b.op("Reshape", [node.output[2], view], stem="batch_norm_var")
    inv_std = ctx.b.op("Reciprocal", [ctx.b.op("Sqrt", [ctx.b.op("Add", [
        variance, ctx.constant(_batch_norm_epsilon(node), dtype)])])], stem="batch_norm_inv_std")
    x_hat = ctx.b.op("Mul", [ctx.b.op("Sub", [x, mean]), inv_std], stem="batch_norm_x_hat")
    sum_dy = ctx.reduce_sum(dy, axes, keepdims=1)
    sum_dy_x_hat = ctx.reduce_sum(ctx.b.op("Mul", [dy, x_hat]), axes, keepdims=1)
    flat = ctx.b.ints([-1])
    result = [None, None, None]
    if wanted[0]:
        count = ctx.b.op("Div", [ctx.b.op("Cast", [ctx.b.op("Size", [x])], to=dtype),
                                 ctx.b.op("Cast", [ctx.b.op("Size", [scale])], to=dtype)], stem="batch_norm_count")
        inner = ctx.b.op("Sub", [ctx.b.op("Sub", [dy, ctx.b.op("Div", [sum_dy, count])]),
                                 ctx.b.op("Mul", [x_hat, ctx.b.op("Div", [sum_dy_x_hat, count])])])
        factor = ctx.b.op("Mul", [ctx.b.op("Reshape", [scale, view]), inv_std])
        result[0] = ctx.b.op("Mul", [factor, inner], stem="batch_norm_dx")
    if wanted[1]:
        result[1] = ctx.b.op("Reshape", [sum_dy_x_hat, flat], stem="batch_norm_dscale")
    if wanted[2]:
        result[2] = ctx.b.op("Reshape", [sum_dy, flat], stem="batch_norm_dbias")
    return [None if name is None else _with_seed_axis(ctx, name, "batch_norm_adjoint") for name in result]


def _batch_norm_training_nodes(node, opset: int, element_type: int | None = None) -> list:
    """``node`` (a BatchNormTraining) as standard operators: mean, centred square mean, the
    normalised input scaled and shifted, and the flat statistics under the node's own output
    names. For a float or double input normalised over every axis but the channels (torch's
    BatchNorm1d/2d/3d), the normalisation is onnxruntime's inference-mode BatchNormalization
    fed the batch's statistics: one pass over the input instead of three, computed as
    torch's CPU kernel computes it (``x * (scale / std) + (bias - mean * scale / std)``)."""
    make = onnx.helper.make_node
    x, scale, bias = node.input[:3]
    y, mean_out, var_out = node.output[:3]
    axes = _batch_norm_axes(node)
    stem = (node.name or y) + "/"
    name = lambda part: stem + part      # noqa: E731
    if (element_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) and opset >= 9 and scale and bias
            and axes == [0, *range(2, len(axes) + 1)]):
        return _batch_norm_by_inference_node(node, opset, make, name)
    nodes = [make("Constant", [], [name("axes")], value=onnx.helper.make_tensor("axes", onnx.TensorProto.INT64,
                                                                                 [len(axes)], axes)),
             make("Constant", [], [name("view")], value=onnx.helper.make_tensor(
                 "view", onnx.TensorProto.INT64, [len(axes) + 1], [1, -1] + [1] * (len(axes) - 1))),
             make("Constant", [], [name("flat")], value=onnx.helper.make_tensor("flat", onnx.TensorProto.INT64,
                                                                                 [1], [-1])),
             make("Constant", [], [name("epsilon")], value=onnx.helper.make_tensor(
                 "epsilon", onnx.TensorProto.FLOAT, [], [_batch_norm_epsilon(node)]))]

    def mean_of(source, out):
        if opset >= 18:
            return make("ReduceMean", [source, name("axes")], [out], keepdims=1)
        return make("ReduceMean", [source], [out], axes=axes, keepdims=1)

    nodes += [mean_of(x, name("mean")),
              make("Sub", [x, name("mean")], [name("centered")]),
              make("Mul", [name("centered"), name("centered")], [name("squared")]),
              mean_of(name("squared"), name("var")),
              make("CastLike", [name("epsilon"), name("var")], [name("eps")]),
              make("Add", [name("var"), name("eps")], [name("var_eps")]),
              make("Sqrt", [name("var_eps")], [name("std")]),
              make("Reciprocal", [name("std")], [name("inv_std")]),
              make("Mul", [name("centered"), name("inv_std")], [name("x_hat")]),
              make("Reshape", [scale, name("view")], [name("scale")]),
              make("Reshape", [bias, name("view")], [name("bias")]),
              make("Mul", [name("x_hat"), name("scale")], [name("scaled")]),
              make("Add", [name("scaled"), name("bias")], [y])]
    if mean_out:
        nodes.append(make("Reshape", [name("mean"), name("flat")], [mean_out]))
    if var_out:
        nodes.append(make("Reshape", [name("var"), name("flat")], [var_out]))
    return nodes


def _fusable_batch_norm(node, element_type: int | None, top_level: bool) -> bool:
    """Whether the CPU kernels' BatchNormTraining computes ``node``: float32, scale and bias
    given, normalised over every axis but the channels, in the main graph (the kernels' nodes
    are declared there only)."""
    axes = _batch_norm_axes(node)
    return (top_level and element_type == onnx.TensorProto.FLOAT and len(node.input) >= 3 and all(node.input[:3])
            and axes == [0, *range(2, len(axes) + 1)])


def _batch_norm_by_inference_node(node, opset: int, make, name) -> list:
    x, scale, bias = node.input[:3]
    y, mean_out, var_out = node.output[:3]
    axes = _batch_norm_axes(node)
    nodes = [make("Constant", [], [name("axes")], value=onnx.helper.make_tensor("axes", onnx.TensorProto.INT64,
                                                                                 [len(axes)], axes)),
             make("Constant", [], [name("flat")], value=onnx.helper.make_tensor("flat", onnx.TensorProto.INT64,
                                                                                 [1], [-1]))]

    def mean_of(source, out):
        if opset >= 18:
            return make("ReduceMean", [source, name("axes")], [out], keepdims=1)
        return make("ReduceMean", [source], [out], axes=axes, keepdims=1)

    mean_flat, var_flat = mean_out or name("mean_flat"), var_out or name("var_flat")
    return nodes + [mean_of(x, name("mean")),
                    make("Sub", [x, name("mean")], [name("centered")]),
                    make("Mul", [name("centered"), name("centered")], [name("squared")]),
                    mean_of(name("squared"), name("var")),
                    make("Reshape", [name("mean"), name("flat")], [mean_flat]),
                    make("Reshape", [name("var"), name("flat")], [var_flat]),
                    make("BatchNormalization", [x, scale, bias, mean_flat, var_flat], [y],
                         epsilon=_batch_norm_epsilon(node))]


def _fused_gradient(ctx, op_type: str, operands: list[str], wanted: list[bool], stem: str, **attrs) -> list:
    """One node of ortagent's CPU kernels computing (dX, dscale, dbias) from ``operands``: dX
    always, the others only where ``wanted`` (an output left unnamed is not computed); the
    gradients asked for get the seed axis back, the others are None."""
    outputs = _kernel_node(ctx, op_type, operands, stem, outputs=3, **attrs)
    grad_node = ctx.b.nodes[-1]
    for index in (1, 2):
        if not wanted[index]:
            grad_node.output[index] = ""
    return [_with_seed_axis(ctx, name, f"{stem}_adjoint") if asked else None
            for name, asked in zip(outputs, wanted)]


def _layer_norm_reverse_or_fused(rule):
    """onnx-ad's LayerNormalization rule, or with ortagent's CPU kernels (see
    :func:`differentiating`) one ``LayerNormalizationGrad`` node over the statistics the forward
    node reports (named by :func:`prepare`) for a float32 LayerNormalization whose scale has the
    normalised dimensions' shape."""
    def reverse(ctx, node, grads):
        if not _cpu_kernels() or any(grad is not None for grad in grads[1:]) or not _fusable_layer_norm(ctx, node):
            return rule(ctx, node, grads)
        found = _output_gradient(ctx, node, grads, "layer_norm_dy")
        if found is None:
            return [None] * len(node.input)
        inputs, wanted, dy = found
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        result = _fused_gradient(ctx, "LayerNormalizationGrad",
                                 [dy, node.input[0], node.input[1], node.output[1], node.output[2]],
                                 wanted, "layer_norm", axis=axis)
        return result[:len(node.input)]
    return reverse


def _fusable_layer_norm(ctx, node) -> bool:
    x = node.input[0]
    if len(node.input) < 2 or not node.input[1] or len(node.output) < 3 or not node.output[1] \
            or not node.output[2] or ctx.shapes.dtype(x) != onnx.TensorProto.FLOAT:
        return False
    shape, scale_shape = ctx.shapes.shape(x), ctx.shapes.shape(node.input[1])
    if shape is None or scale_shape is None or not shape:
        return False
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1) % len(shape)
    normalised = shape[axis:]
    return len(scale_shape) == len(normalised) and all(
        s is not None and (d is None or d == s) for d, s in zip(normalised, scale_shape))


def _layer_norm_parts_from_statistics(parts):
    """onnx-ad's LayerNormalization statistics step ``parts(ctx, node) -> (axes, standardized,
    inv_std)``, reading the ``Mean`` and ``InvStdDev`` the forward node reports (named by
    :func:`prepare`) instead of computing both again: ``standardized = (x - mean) * inv_std``.
    A node without them keeps onnx-ad's computation; the rule's gradient formula is onnx-ad's."""
    def from_statistics(ctx, node):
        x = node.input[0]
        rank = ctx.rank(x)
        if len(node.output) < 3 or not node.output[1] or not node.output[2] or rank is None:
            return parts(ctx, node)
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1) % rank
        inv_std = node.output[2]
        standardized = ctx.b.op("Mul", [ctx.b.op("Sub", [x, node.output[1]]), inv_std], stem="standardized")
        return list(range(axis, rank)), standardized, inv_std
    return from_statistics


_SQRT_2 = float(np.float32(np.sqrt(2.0)))


def _collapse_gelus(model: ModelProto, known: dict[str, ValueInfoProto]) -> None:
    """Each float32 GELU of the erf form as torch's exporter writes it, ``y = x * (0.5 * (1 +
    erf(x / sqrt(2))))`` (Div, Erf, Add, Mul, Mul; either operand order), whose intermediate
    values nothing else reads, becomes one private ``ErfGelu(x) -> y`` node: its reverse is one
    ``GeluGrad`` of ortagent's CPU kernels from ``x`` alone (the autodiff of the five nodes gave
    about eight elementwise nodes over the activation and kept the CDF for the backward), and
    :func:`finish` writes it as onnxruntime's ``com.microsoft:Gelu`` (one pass, where the five
    nodes took five)."""
    graph = model.graph
    constants = _scalar_constants(graph)
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    producer = {out: node for node in graph.node for out in node.output}

    def only_reader(name):
        readers = consumers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in outputs else None

    def other(node, name):
        return node.input[1] if node.input[0] == name else node.input[0]

    replaced: dict[int, onnx.NodeProto] = {}
    for erf in graph.node:
        if erf.op_type != "Erf" or erf.domain not in ("", "ai.onnx") or len(erf.input) != 1:
            continue
        div = producer.get(erf.input[0])
        if div is None or div.op_type != "Div" or div.domain not in ("", "ai.onnx") \
                or not np.isclose(constants.get(div.input[1], 0.0), _SQRT_2, rtol=1e-6, atol=0):
            continue
        x = div.input[0]
        source = known.get(x)
        if source is None or source.type.tensor_type.elem_type != onnx.TensorProto.FLOAT or only_reader(div.output[0]) is not erf:
            continue
        add = only_reader(erf.output[0])
        if add is None or add.op_type != "Add" or constants.get(other(add, erf.output[0])) != 1.0:
            continue
        half = only_reader(add.output[0])
        if half is None or half.op_type != "Mul" or constants.get(other(half, add.output[0])) != 0.5:
            continue
        product = only_reader(half.output[0])
        if product is None or product.op_type != "Mul" or other(product, half.output[0]) != x:
            continue
        chain = (div, erf, add, half, product)
        if any(id(node) in replaced for node in chain):
            continue
        gelu = onnx.helper.make_node(GELU, [x], [product.output[0]], name=product.name or erf.name, domain=DOMAIN)
        replaced.update((id(node), None) for node in chain)
        replaced[id(product)] = gelu
    if not replaced:
        return
    kept = []
    for node in graph.node:
        if id(node) not in replaced:
            kept.append(node)
        elif replaced[id(node)] is not None:
            kept.append(replaced[id(node)])
    del graph.node[:]
    graph.node.extend(kept)
    for node in graph.node:
        if node.domain == DOMAIN and node.op_type == GELU:
            for output in node.output:
                _declare(model, output, known.get(node.input[0]))
    if not any(entry.domain == DOMAIN for entry in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))


def _scalar_constants(graph) -> dict[str, float]:
    """The one-element float constants of ``graph`` (initializers and Constant nodes), by name."""
    return {name: float(value.reshape(-1)[0]) for name, value in constant_values(graph).items()
            if value.dtype in (np.float32, np.float64) and value.size == 1}


def _gelu_node(node) -> onnx.NodeProto:
    """A private ``ErfGelu(x) -> y`` as onnxruntime's contrib ``com.microsoft:Gelu`` (the erf form;
    :func:`finish` imports the domain)."""
    return onnx.helper.make_node("Gelu", [node.input[0]], [node.output[0]], name=node.name, domain=_MS_DOMAIN)


def _gelu_reverse(ctx, node, grads):
    """dX = dY * (cdf(x) + x * pdf(x)) as one GeluGrad node (private ErfGelu nodes are made only
    for graphs that run ortagent's CPU kernels)."""
    if not ctx.asked_for(node.input[0]):
        return [None]
    return _unary_kernel_reverse(ctx, node, grads, "GeluGrad", node.input[0], "gelu")


def _activation_reverse_or_fused(rule):
    """An activation's rule, or with ortagent's CPU kernels (float32) one node computing dX from
    dY and the activation's input (``_ACTIVATION_KERNELS``): onnx-ad's rule computes the slope
    (two to six nodes) and multiplies."""
    def reverse(ctx, node, grads):
        x = node.input[0]
        if not _cpu_kernels() or ctx.shapes.dtype(x) != onnx.TensorProto.FLOAT or not ctx.asked_for(x):
            return rule(ctx, node, grads)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name in ("alpha", "beta")}
        return _unary_kernel_reverse(ctx, node, grads, _ACTIVATION_KERNELS[node.op_type], x, "activation", **attrs)
    return reverse


def _softmax_reverse_or_fused(rule):
    """Softmax's rule, or with ortagent's CPU kernels one ``SoftmaxGrad`` node from the output
    for a float32 softmax over the last axis (onnx-ad's rule: Mul, ReduceSum, Sub, Mul)."""
    def reverse(ctx, node, grads):
        x, y = node.input[0], node.output[0]
        shape = ctx.shapes.shape(x)
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        if (not _cpu_kernels() or ctx.opset < 13 or ctx.shapes.dtype(x) != onnx.TensorProto.FLOAT or not shape
                or axis % len(shape) != len(shape) - 1 or not ctx.asked_for(x)):
            return rule(ctx, node, grads)
        return _unary_kernel_reverse(ctx, node, grads, "SoftmaxGrad", y, "softmax")
    return reverse


def _hard_swish_derivative(ctx, node, x, y, dtype):
    """HardSwish's derivative as torch's ``hardswish_backward`` takes it: 0 up to -3 (included),
    ``x / 3 + 1/2`` between -3 and 3, 1 from 3 on (and at NaN, as torch's scalar path; its
    vectorized path gives NaN). onnx-ad's (``hard_sigmoid(x) + x * slope``, the same values at
    the knees) recomputes the HardSigmoid with its clipping and takes two passes more over the
    input."""
    line = ctx.b.op("Add", [ctx.b.op("Div", [x, ctx.constant(3.0, dtype)]), ctx.constant(0.5, dtype)])
    inside = ctx.b.op("Where", [ctx.b.op("Greater", [x, ctx.constant(-3.0, dtype)]), line, ctx.constant(0.0, dtype)])
    return ctx.b.op("Where", [ctx.b.op("Less", [x, ctx.constant(3.0, dtype)]), inside, ctx.constant(1.0, dtype)],
                    stem="hard_swish_slope")


def _report_layer_norm_statistics(model: ModelProto, known: dict[str, ValueInfoProto]) -> None:
    """Name the ``Mean`` and ``InvStdDev`` outputs of float32 LayerNormalization nodes (opset 17
    and up) that leave them out, for the reverse rule to read (float32: both are float32 then,
    whatever the ``stash_type``)."""
    if _default_opset(model) < 17:
        return
    names = NameAllocator(all_value_names(model.graph))
    for node in model.graph.node:
        source = known.get(node.input[0]) if node.input else None
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or source is None \
                or source.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            continue
        outputs = list(node.output) + [""] * (3 - len(node.output))
        for index, stem in ((1, "mean"), (2, "inv_std")):
            if not outputs[index]:
                outputs[index] = names.fresh(f"{node.name or node.output[0]}_{stem}")
        del node.output[:]
        node.output.extend(outputs)


def _register() -> None:
    global _registered
    with _lock:
        if _registered:
            return
        from onnx_ad import rules

        # (ortagent only builds reverse-mode graphs; StopGradient's forward rule is as trivial)
        for op_type, reverse, forward in ((STOP_GRADIENT, _stop_gradient_reverse, _stop_gradient_forward),
                                          (CONVOLUTION, _convolution_reverse, None),
                                          (CONVOLUTION_TRANSPOSE, _convolution_transpose_reverse, None),
                                          (BATCH_NORM_TRAINING, _batch_norm_training_reverse, None),
                                          (GELU, _gelu_reverse, None),
                                          (CTC_LOSS, ctc_loss_reverse, None)):
            if op_type in rules.REVERSE or op_type in rules.FORWARD:
                raise RuntimeError(f"onnx-ad defines a rule for {op_type} itself; ortagent's private "
                                   "operator of that name would shadow it")
            rules.REVERSE[op_type] = reverse
            if forward is not None:
                rules.FORWARD[op_type] = forward
        rules.REVERSE["Slice"] = _slice_reverse_or_symbolic(rules.REVERSE["Slice"])
        rules.REVERSE["Concat"] = _concat_reverse_or_measured(rules.REVERSE["Concat"])
        rules.REVERSE["Pad"] = _pad_reverse_or_copying(rules.REVERSE["Pad"])
        rules.REVERSE["Pow"] = _pow_reverse_or_integer(rules.REVERSE["Pow"])
        rules.REVERSE["AveragePool"] = _average_pool_reverse_or_padded(rules.REVERSE["AveragePool"])
        rules.REVERSE["DFT"] = _dft_reverse_or_c2r(rules.REVERSE["DFT"])
        rules.REVERSE["ScatterElements"] = _scatter_elements_reverse_or_reducing(rules.REVERSE["ScatterElements"])
        rules.REVERSE["ReduceProd"] = _reduce_prod_reverse       # replaces onnx-ad's y / x
        rules.REVERSE["ReduceMean"] = _reduce_reverse_or_empty_mean(rules.REVERSE["ReduceMean"])
        rules.REVERSE["Det"] = _det_reverse                     # replaces onnx-ad's zero gradient
        rules.REVERSE.setdefault(INVERSE, _inverse_reverse)     # com.microsoft:Inverse (torch.linalg.inv)
        rules.REVERSE["Clip"] = _clip_reverse_or_strict(rules.REVERSE["Clip"])
        rules.REVERSE["GatherND"] = _gather_nd_reverse_or_counted(rules.REVERSE["GatherND"])
        rules.DERIVATIVE["HardSwish"] = _hard_swish_derivative    # replaces onnx-ad's (torch's ties)
        for activation in _ACTIVATION_KERNELS:
            rules.REVERSE[activation] = _activation_reverse_or_fused(rules.REVERSE[activation])
        rules.REVERSE["Softmax"] = _softmax_reverse_or_fused(rules.REVERSE["Softmax"])
        # (onnx-ad's LayerNormalization rules look their statistics step up by this name)
        rules._layer_norm_parts = _layer_norm_parts_from_statistics(rules._layer_norm_parts)
        rules.REVERSE["LayerNormalization"] = _layer_norm_reverse_or_fused(rules.REVERSE["LayerNormalization"])
        for extremum in ("Max", "Min"):
            rules.REVERSE[extremum] = _extremum_reverse_or_halved(rules.REVERSE[extremum])
        # (a forward rule too: onnx-ad expands an operator without one into its function body)
        if "NegativeLogLikelihoodLoss" not in rules.REVERSE:
            rules.REVERSE["NegativeLogLikelihoodLoss"] = _nll_loss_reverse
            rules.FORWARD.setdefault("NegativeLogLikelihoodLoss", _nll_loss_forward)
        from onnx_ad._build import Context

        Context.unbroadcast = _unbroadcast_with_known_symbols(Context.unbroadcast)
        Context.reshape_like = _reshape_like_with_one_seed(Context.reshape_like)
        _registered = True


# -- what ortagent's call of the reverse mode knows: one seed, symbols above one -------------------------

_reverse_state = threading.local()  # while ortagent's reverse runs: .dims, .above_one (see differentiating)


@contextmanager
def differentiating(dims: dict[str, list[int | str]], symbols_above_one: Collection[str] = (),
                    cpu_kernels: bool = False) -> Iterator[None]:
    """The facts ortagent's call of onnx-ad's reverse mode (in this thread) lets onnx-ad use:

    * One seed direction (build_training_graph seeds each module output with a trailing axis of
      1): a gradient reshaped like a value of symbolic shape gets that value's shape and 1
      (onnx-ad writes -1, which ONNX's shape inference cannot resolve: the seed axis was then
      of unknown size downstream, and the Transposes that only move it stayed copies). The
      seed count onnx-ad reads off a seed's shape is left as it is: zero gradients made from it
      stay in the backward (a constant count would move them into the forward, and keep them
      alive until the backward).
    * ``symbols_above_one``: dimension names the caller knows to be at least 2 at run time,
      hence never broadcast, with ``dims`` the forward's values whose every dimension is known
      (a static size or a symbol, as :func:`ortagent._graph_passes.known_shapes` gives them). A
      gradient reaching an operand that was broadcast is summed over axes decided now wherever
      each of the operand's dimensions is a static size or such a symbol; onnx-ad otherwise
      computes the axes at run time from the operand's shape (Shape, Equal, NonZero, a ReduceSum
      over those axes, which copies the gradient even where nothing was broadcast, and a
      Reshape).
    * ``cpu_kernels``: the graph will run on onnxruntime's CPU provider with ortagent's CPU
      gradient kernels registered (``SessionOptions.add_cpu_training_kernels``): the float32
      gradients the module docstring lists are one node of the domain :data:`CPU_KERNELS_DOMAIN`
      each instead of two to a dozen standard ones."""
    _reverse_state.dims, _reverse_state.above_one = dims, frozenset(symbols_above_one)
    _reverse_state.cpu_kernels = cpu_kernels
    try:
        yield
    finally:
        _reverse_state.dims = _reverse_state.above_one = None
        _reverse_state.cpu_kernels = False


def _active() -> bool:
    return getattr(_reverse_state, "dims", None) is not None


def _cpu_kernels() -> bool:
    return bool(getattr(_reverse_state, "cpu_kernels", False))


def _reshape_like_with_one_seed(original):
    def reshape_like(ctx, value, primal):
        if not _active() or ctx.shapes.static(primal) is not None:
            return original(ctx, value, primal)
        target = ctx.b.op("Concat", [ctx.shape_of(primal), ctx.b.ints([1])], axis=0, stem="like")
        return ctx.b.op("Reshape", [value, target])
    return reshape_like


def _unbroadcast_with_known_symbols(original):
    def unbroadcast(ctx, value, source_rank, target):
        dims = getattr(_reverse_state, "dims", None)
        named = dims.get(target) if dims is not None else None
        declared = ctx.shapes.shape(target)
        if ctx.shapes.static(target) is not None:           # onnx-ad's own static path
            return original(ctx, value, source_rank, target)
        if (named is None or declared is None or len(declared) != len(named) or source_rank < len(named)
                or not all(isinstance(d, int) or d in _reverse_state.above_one for d in named)):
            return _unbroadcast_at_run_time(ctx, value, source_rank, target) if _active() \
                else original(ctx, value, source_rank, target)
        lead = source_rank - len(named)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(named) if d == 1]
        if not axes:
            return value
        reduced = ctx.reduce_sum(value, axes, keepdims=1)
        return reduced if lead == 0 else ctx.squeeze(reduced, list(range(lead)))
    return unbroadcast


def _unbroadcast_at_run_time(ctx, value, source_rank, target):
    """onnx-ad's unbroadcast where the target's dimensions are known only at run time: summed
    over the axes where the target's size is 1 (found at run time), then given the target's
    shape and the one seed axis. onnx-ad writes that last axis as -1, which no Reshape can
    resolve once a dimension is 0 (``x[mask]`` selecting nothing)."""
    from onnx_ad._build import UnsupportedOperator

    lead = source_rank - ctx.rank(target)
    if lead < 0:
        raise UnsupportedOperator(f"{target!r} has rank {ctx.rank(target)}, more than the rank {source_rank} "
                                  "of the value it feeds")
    shape = ctx.shape_of(target)
    padded = shape if lead == 0 else ctx.b.op("Concat", [ctx.b.ints([1] * lead), shape], axis=0, stem="padded")
    axes = ctx.squeeze(ctx.b.op("NonZero", [ctx.b.op("Equal", [padded, ctx.b.ints([1])])]), [0])
    reduced = ctx.reduce_sum(value, axes, keepdims=1)
    return ctx.b.op("Reshape", [reduced, ctx.b.op("Concat", [shape, ctx.b.ints([1])], axis=0, stem="restore")])


def uses_private_ops(model: ModelProto) -> bool:
    return any(node.domain == DOMAIN for graph in walk_graphs(model.graph) for node in graph.node)


def _default_opset(model: ModelProto) -> int:
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)


def prepare(model: ModelProto, cpu_kernels: bool = False) -> None:
    """Make ``model`` ready for onnx-ad with ortagent's rules (in place): rename the operators
    ortagent differentiates itself, register the rules, and declare each private operator's
    result type. With ``cpu_kernels``, float32 GELUs become one private ``ErfGelu`` node each (see
    :func:`_collapse_gelus`)."""
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            if node.domain == DOMAIN and node.op_type not in _PRIVATE:
                raise OrtNotImplemented(
                    f"node '{node.name}' uses {DOMAIN}:{node.op_type}, which ortagent does not define")
    convolutions = _convolutions(model)
    _register()         # (also Slice's symbolic rule, needed inside onnx-ad's function expansions)
    _declare_inverses(model)
    normalizing = any(node.op_type == "LayerNormalization" for node in model.graph.node)
    gelus = cpu_kernels and any(node.op_type == "Erf" for node in model.graph.node)
    if not normalizing and not convolutions and not gelus and not uses_private_ops(model):
        return
    known = _known_types(model)     # (the statistics' new outputs change no type read below)
    if gelus:
        _collapse_gelus(model, known)
    if normalizing:
        _report_layer_norm_statistics(model, known)
    # (looked up again: the GELUs' collapse writes the node list anew, and a node found before
    # it would be renamed in a copy the graph no longer holds)
    convolutions = _convolutions(model)
    if not convolutions and not uses_private_ops(model):
        return
    for node, private in convolutions:
        node.op_type = private
        node.domain = DOMAIN
        _declare(model, node.output[0], known.get(node.output[0]))
    if not any(entry.domain == DOMAIN for entry in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    for node in model.graph.node:
        if node.domain == DOMAIN and node.op_type == BATCH_NORM_TRAINING:
            for output, like in zip(node.output, (node.input[0], node.input[1], node.input[1])):
                if output:
                    _declare(model, output, known.get(like))
        elif node.domain == DOMAIN and node.op_type == CTC_LOSS and node.input[0] in known:
            # the per-sample losses [N] and the forward variables [T, N, L], of the log probabilities' type
            element_type = known[node.input[0]].type.tensor_type.elem_type
            for output, rank in zip(node.output, (1, 3)):
                if output:
                    _declare(model, output, onnx.helper.make_tensor_value_info(output, element_type, [None] * rank))
    for _ in range(8):      # a chain of markers needs one round per link
        known = _known_types(model)
        added = False
        for node in model.graph.node:
            if node.domain == DOMAIN and node.op_type == STOP_GRADIENT:
                added |= _declare(model, node.output[0], known.get(node.input[0]))
        if not added:
            return


def _convolutions(model: ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """The main graph's Conv nodes, and ConvTranspose nodes of explicit pads, each with the
    private operator ortagent differentiates it as (none below opset 16: no ConvGrad there)."""
    if _default_opset(model) < _CONV_GRAD_OPSET:
        return []
    found = []
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type == "Conv":
            found.append((node, CONVOLUTION))
        elif node.domain in ("", "ai.onnx") and node.op_type == "ConvTranspose" and _explicit(node):
            found.append((node, CONVOLUTION_TRANSPOSE))
    return found


def _explicit(node) -> bool:
    """A ConvTranspose with explicit pads and no output_shape (its adjoint Conv is then fixed by
    the attributes)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    auto_pad = attrs.get("auto_pad", b"NOTSET").decode()
    return "output_shape" not in attrs and (auto_pad == "NOTSET" or (auto_pad == "VALID" and not attrs.get("pads")))


def _known_types(model: ModelProto) -> dict[str, ValueInfoProto]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    return {value.name: value for value in [*inferred.graph.input, *inferred.graph.value_info,
                                            *inferred.graph.output] if value.type.tensor_type.elem_type}


def _declare(model: ModelProto, name: str, source: ValueInfoProto | None) -> bool:
    """Declare ``name``'s type as that of ``source``, unless declared already or unknown."""
    if source is None or any(value.name == name for value in [*model.graph.value_info, *model.graph.output]):
        return False
    value = ValueInfoProto()
    value.CopyFrom(source)
    value.name = name
    model.graph.value_info.append(value)
    return True


_STANDARD = {STOP_GRADIENT: "Identity", CONVOLUTION: "Conv", CONVOLUTION_TRANSPOSE: "ConvTranspose"}
# the private operators finish() writes as several standard nodes each
_CTC_LOWERINGS = {CTC_LOSS: ctc_loss_nodes, CTC_LOSS_GRAD: ctc_loss_grad_nodes}
_LOWERED = {BATCH_NORM_TRAINING, *_CTC_LOWERINGS}


def finish(model: ModelProto, element_types: dict[str, int] | None = None, cpu_kernels: bool = False) -> None:
    """Replace ``model``'s private operators by standard ones (in place). ``element_types``:
    element types of values known from the forward model, besides those ``model`` declares.
    With ``cpu_kernels``, a float32 BatchNormTraining over every axis but the channels becomes
    the ``BatchNormTraining`` of ortagent's CPU kernels (one node and two passes over the input
    for the statistics, one for the normalisation) instead of about seven standard nodes."""
    opset = _default_opset(model)
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            if node.domain == DOMAIN and node.op_type in _STANDARD:
                node.op_type = _STANDARD[node.op_type]
                node.domain = ""
        if any(node.domain == DOMAIN and node.op_type == GELU for node in graph.node):
            rewritten = [_gelu_node(node) if node.domain == DOMAIN and node.op_type == GELU else node
                         for node in graph.node]
            del graph.node[:]
            graph.node.extend(rewritten)
            if not any(entry.domain == _MS_DOMAIN for entry in model.opset_import):
                model.opset_import.append(onnx.helper.make_opsetid(_MS_DOMAIN, 1))
        if any(node.domain == DOMAIN and node.op_type in _LOWERED for node in graph.node):
            types = dict(element_types or {})
            types.update((value.name, value.type.tensor_type.elem_type)
                         for value in [*graph.input, *graph.value_info, *graph.output]
                         if value.type.tensor_type.elem_type)
            types.update((init.name, init.data_type) for init in graph.initializer)
            expanded = []
            for node in graph.node:
                if node.domain != DOMAIN or node.op_type not in _LOWERED:
                    expanded.append(node)
                elif node.op_type in _CTC_LOWERINGS:
                    operand = node.input[0 if node.op_type == CTC_LOSS else 1]
                    expanded.extend(_CTC_LOWERINGS[node.op_type](node, types.get(operand, onnx.TensorProto.FLOAT),
                                                                 opset))
                elif cpu_kernels and _fusable_batch_norm(node, types.get(node.input[0]), graph is model.graph):
                    expanded.append(onnx.helper.make_node("BatchNormTraining", node.input[:3], node.output[:3],
                                                         name=node.name, domain=CPU_KERNELS_DOMAIN,
                                                         epsilon=_batch_norm_epsilon(node)))
                else:
                    expanded.extend(_batch_norm_training_nodes(node, opset, types.get(node.input[0])))
            del graph.node[:]
            graph.node.extend(expanded)
    kept = [opset for opset in model.opset_import if opset.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)


INVERSE = "Inverse"     # com.microsoft:Inverse, the batched matrix inverse


def _inverse_reverse(ctx, node, grads):
    """com.microsoft:Inverse's gradient: ``-Y^T g Y^T`` with ``Y`` the inverse, the transposes
    over the last two axes (every leading axis a batch)."""
    a, y = node.input[0], node.output[0]
    if not ctx.asked_for(a):
        return [None]
    r = ctx.rank(a)
    g = ctx.b.op("Squeeze", [ctx.full(grads[0], y), ctx.b.ints([-1])], stem="inverse_dy")
    y_t = ctx.b.op("Transpose", [y], perm=[*range(r - 2), r - 1, r - 2], stem="inverse_t")
    grad = ctx.b.op("Neg", [ctx.b.op("MatMul", [ctx.b.op("MatMul", [y_t, g]), y_t])], stem="inverse_transposed_product")
    return [_with_seed_axis(ctx, grad, "inverse_adjoint")]


def _declare_inverses(model: ModelProto) -> None:
    """Declare each com.microsoft:Inverse result's type (its operand's), which ONNX shape
    inference does not know, for onnx-ad's shape queries."""
    inverses = [node for node in model.graph.node if node.domain == _MS_DOMAIN and node.op_type == INVERSE]
    if not inverses:
        return
    known = _known_types(model)
    for node in inverses:
        source = known.get(node.input[0])
        declared = [value for value in model.graph.value_info if value.name == node.output[0]]
        if source is not None and declared and not declared[0].type.tensor_type.elem_type:
            declared[0].type.CopyFrom(source.type)       # the exporter declared it without a type
        else:
            _declare(model, node.output[0], source)


def _clip_reverse_or_strict(rule):
    """torch's ``hardtanh``, ``relu6`` and ``clamp`` with number bounds (the exporter writes
    each as a Clip with constant bounds) pass no gradient where the input equals a bound, and
    onnx-ad's Clip rule passes it there: where no gradient is asked of the bounds, the input's
    gradient is kept where ``not (x <= min or x >= max)`` (hardtanh's mask; a NaN input keeps
    it, where torch's clamp gives NaN none). With a bound to differentiate, onnx-ad's rule."""
    def reverse(ctx, node, grads):
        from onnx_ad.rules import _mask

        x, bounds = node.input[0], [(i, name) for i, name in enumerate(node.input[1:3], 1) if name]
        if not bounds or any(ctx.asked_for(name) for _, name in bounds):
            return rule(ctx, node, grads)
        outside = None
        for index, name in bounds:
            beyond = ctx.b.op("LessOrEqual" if index == 1 else "GreaterOrEqual", [x, name], stem="clip_at_or_beyond")
            outside = beyond if outside is None else ctx.b.op("Or", [outside, beyond], stem="clip_outside")
        zero = ctx.constant(0.0, ctx.dtype(node.output[0], x))
        kept = ctx.b.op("Where", [_mask(ctx, outside), zero, grads[0]], stem="clip_strict")
        return [kept] + [None] * (len(node.input) - 1)

    reverse.__wrapped__ = rule
    return reverse


def _gather_nd_reverse_or_counted(rule):
    """GatherND with indices of a length known only at run time (torch's boolean-mask
    indexing, ``x[mask]``: NonZero's positions, transposed), which onnx-ad refuses for want of
    a static indices shape: its adjoint needs only the index depth, the last dimension, which
    shape inference knows (the mask's rank). The gradient is onnx-ad's, ScatterND-adding the
    output gradient into zeros at the gathered positions (made non-negative)."""
    def reverse(ctx, node, grads):
        from onnx_ad._build import UnsupportedOperator, attribute

        data, indices = node.input[0], node.input[1]
        declared = ctx.shapes.shape(indices)
        if ctx.shapes.static(indices) is not None or declared is None or not declared \
                or declared[-1] is None or attribute(node, "batch_dims", 0) or ctx.opset < 16:
            return rule(ctx, node, grads)
        depth = int(declared[-1])
        if depth > ctx.rank(data):
            raise UnsupportedOperator(f"GatherND with an index depth of {depth} into data of rank {ctx.rank(data)}")
        extents = ctx.b.op("Slice", [ctx.shape_of(data), ctx.b.ints([0]), ctx.b.ints([depth])], stem="extents")
        positive = ctx.b.op("Where", [ctx.b.op("Less", [indices, ctx.b.ints([0])]),
                                      ctx.b.op("Add", [indices, extents]), indices], stem="positive_indices")
        return [ctx.b.op("ScatterND", [ctx.zeros(data), positive, ctx.full(grads[0], node.output[0])],
                         reduction="add", stem="a_gathernd"), None]

    reverse.__wrapped__ = rule
    return reverse


def _extremum_reverse_or_halved(rule):
    """A two-operand Max or Min (torch's ``maximum``, ``minimum``, ``clamp_min`` and
    ``clamp_max`` with tensor bounds) gives, as torch does, each operand the whole gradient
    where it wins, half of it at a tie, and both the whole where either is NaN (torch masks out
    only the operand that strictly loses); onnx-ad's rule gives a tie's whole gradient to the
    first operand. Max or Min of more operands: onnx-ad's rule."""
    def reverse(ctx, node, grads):
        from onnx_ad.rules import _mask

        if len(node.input) != 2 or grads[0] is None:
            return rule(ctx, node, grads)
        a, b = node.input
        dtype = ctx.dtype(node.output[0], a, b)
        zero, rank = ctx.constant(0.0, dtype), ctx.rank(node.output[0])
        tie = ctx.b.op("Equal", [a, b], stem="extremum_tie")
        shared = ctx.b.op("Where", [_mask(ctx, tie), ctx.b.op("Mul", [grads[0], ctx.constant(0.5, dtype)]), grads[0]],
                          stem="extremum_shared")
        loses = "Less" if node.op_type == "Max" else "Greater"
        contributions = []
        for mine, other in ((a, b), (b, a)):
            if not ctx.asked_for(mine):
                contributions.append(None)
                continue
            lost = ctx.b.op(loses, [mine, other], stem="extremum_loses")
            contributions.append(ctx.unbroadcast(ctx.b.op("Where", [_mask(ctx, lost), zero, shared],
                                                          stem="extremum_grad"), rank, mine))
        return contributions

    reverse.__wrapped__ = rule
    return reverse
