"""Lowerings of ConvGrad and the pooling gradients."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, numpy_helper

from ._emitter import INT64_MAX, Emitter
from ._registry import domain_of, lowers


def _spatial_rank(e: Emitter, *names: str | None) -> int:
    kernel = e.attr("kernel_shape")
    if kernel:
        return len(kernel)
    rank = e.rank(*names)
    if rank is None:
        raise e.error("the number of spatial dimensions is unknown (no kernel_shape attribute and no "
                      "declared rank); declare the input's shape in the graph")
    return rank - 2


def _explicit_pads(e: Emitter, spatial: int) -> list[int]:
    auto_pad = e.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        raise e.error(f"auto_pad={auto_pad!r} is not lowered; export the convolution with explicit pads")
    pads = list(e.attr("pads", [0] * (2 * spatial)))
    return [0] * (2 * spatial) if auto_pad == "VALID" else pads


def _fit_to_shape(e: Emitter, value: str, target: str, out: str, leading: int = 0) -> None:
    """`value` cut or padded with zeros at the end of each spatial axis to the shape of `target`
    (input rows no window reached have a zero gradient); the first `leading` axes are kept."""
    target_shape = e.op("Shape", target)
    if leading:
        target_shape = e.op("Concat", e.op("Shape", value, end=leading),
                            e.op("Slice", target_shape, e.ints([leading]), e.ints([INT64_MAX])), axis=0)
    rank = e.op("Shape", target_shape)
    zeros = e.op("ConstantOfShape", rank, value=numpy_helper.from_array(np.array([0], np.int64)))
    cut = e.op("Slice", value, zeros, target_shape)
    missing = e.op("Sub", target_shape, e.op("Shape", cut))
    e.op("Pad", cut, e.op("Concat", zeros, missing, axis=0), out=out)


def _begin_pads(pads: list[int]) -> list[int]:
    """ConvTranspose pads that crop only the leading padding: the trailing padding the forward
    used partly or not at all is cut by :func:`_fit_to_shape` instead."""
    spatial = len(pads) // 2
    return pads[:spatial] + [0] * spatial


@lowers("ConvGrad")
def _conv_grad(e: Emitter, node: NodeProto) -> None:
    dy, x, w = e.input(0), e.input(1), e.input(2)
    spatial = _spatial_rank(e, x, w, dy)
    strides = list(e.attr("strides", [1] * spatial))
    dilations = list(e.attr("dilations", [1] * spatial))
    group = int(e.attr("group", 1))
    pads = _explicit_pads(e, spatial)
    kernel = e.attr("kernel_shape")
    dx, dw, db = e.output(0), e.output(1), e.output(2)
    if db:
        e.reduce_sum(dy, e.ints([0, *range(2, spatial + 2)]), keepdims=0, out=db)
    if dx:
        if all(stride == 1 for stride in strides):
            # at stride 1 every window step reaches the end of the padded input, so the
            # transposed convolution with the forward's pads has x's shape exactly: no cut, no
            # zero padding, no copies of the gradient (a stride leaves (x + pads - d(k-1) - 1)
            # mod stride trailing rows of the padding unused, a count known at run time only)
            e.op("ConvTranspose", dy, w, strides=strides, pads=pads, dilations=dilations, group=group, out=dx)
        else:
            partial = e.op("ConvTranspose", dy, w, strides=strides, pads=_begin_pads(pads), dilations=dilations,
                           group=group)
            _fit_to_shape(e, partial, x, dx)
    if dw:
        static = _static_weight(e, w)
        if kernel and static and not (group > 1 and e.shape(w)[1] == 1):
            _weight_gradient_from_windows(e, dy, x, w, list(kernel), strides, pads, dilations, group, dw)
        elif static:
            # depthwise: the correlation's result is in W's order already (its transpose moves an
            # axis of 1); the Reshape states W's static shape, which the cut cannot show
            full = e.names.fresh(f"{e.stem}/dW")
            _weight_gradient_by_correlation(e, dy, x, w, spatial, strides, pads, dilations, group, full)
            e.op("Reshape", full, e.ints(e.shape(w)), out=dw)
        else:
            _weight_gradient_by_correlation(e, dy, x, w, spatial, strides, pads, dilations, group, dw)


def _static_weight(e: Emitter, w: str) -> bool:
    shape = e.shape(w)
    return shape is not None and None not in shape and all(dim > 0 for dim in shape)


def _weight_gradient_from_windows(e: Emitter, dy: str, x: str, w: str, kernel: list[int], strides: list[int],
                                  pads: list[int], dilations: list[int], group: int, out: str) -> None:
    """dW as one matrix product per group, written in W's own [Cout, Cin/group, k...] order:
    dW[o, (c, k)] = sum over (sample, output position) of dY[o] * (the input window at k).

    The windows come from one Conv of each input plane with an identity kernel (output channel
    k picks kernel position k, with the forward's strides, pads and dilations), so the window
    matrix has the forward's output positions exactly. Only the activations are rearranged
    (sample next to position); the gradient itself, which is Cout*Cin*k values however small
    the activations are, is produced in place by a Gemm (one group) or a batched MatMul."""
    cout, per_group = e.shape(w)[0], e.shape(w)[1]
    taps = int(np.prod(kernel))
    if taps == 1 and all(stride == 1 for stride in strides) and not any(pads):
        windows = x         # a 1x1 kernel at stride 1 without padding: each window is one input element
    else:
        identity = np.eye(taps, dtype=np.float32).reshape(taps, 1, *kernel)
        planes = e.op("Reshape", x, e.op("Concat", e.ints([-1, 1]), e.op("Shape", x, start=2), axis=0))
        windows = e.op("Conv", planes, e.cast_like(e.const(identity), x), strides=strides, pads=pads,
                       dilations=dilations)                        # [N*Cin, taps, out spatial]
    samples = e.op("Shape", dy, end=1)
    positions = e.op("ReduceProd", e.op("Shape", dy, start=2), keepdims=1)
    if group == 1:
        # [N, Cin*taps, P] -> [Cin*taps, N*P]; [N, Cout, P] -> [Cout, N*P]
        columns = e.op("Reshape", windows, e.op("Concat", samples, e.ints([per_group * taps]), positions, axis=0))
        columns = e.op("Reshape", e.op("Transpose", columns, perm=[1, 0, 2]), e.ints([per_group * taps, -1]))
        rows = e.op("Reshape", dy, e.op("Concat", samples, e.ints([cout]), positions, axis=0))
        rows = e.op("Reshape", e.op("Transpose", rows, perm=[1, 0, 2]), e.ints([cout, -1]))
        flat = e.op("Gemm", rows, columns, transB=1)                # [Cout, Cin*taps]
    else:
        # [N, G, Cin/G*taps, P] -> [G, N*P, Cin/G*taps]; [N, G, Cout/G, P] -> [G, Cout/G, N*P]
        columns = e.op("Reshape", windows, e.op("Concat", samples, e.ints([group, per_group * taps]), positions,
                                                axis=0))
        columns = e.op("Reshape", e.op("Transpose", columns, perm=[1, 2, 0, 3]), e.ints([group, per_group * taps, -1]))
        columns = e.op("Transpose", columns, perm=[0, 2, 1])         # (onnxruntime folds it into the product)
        rows = e.op("Reshape", dy, e.op("Concat", samples, e.ints([group, cout // group]), positions, axis=0))
        rows = e.op("Reshape", e.op("Transpose", rows, perm=[1, 2, 0, 3]), e.ints([group, cout // group, -1]))
        flat = e.op("MatMul", rows, columns)                        # [G, Cout/G, Cin/G*taps]
    e.op("Reshape", flat, e.ints(e.shape(w)), out=out)


def _weight_gradient_by_correlation(e: Emitter, dy: str, x: str, w: str, spatial: int, strides: list[int],
                                    pads: list[int], dilations: list[int], group: int, out: str) -> None:
    """dW as a Conv of the input (samples as channels) with the output gradient as its kernel:
    needs no static shape, but gives [Cin/group, Cout, >= k...], transposed and cut to W's
    shape afterwards (a copy of the whole gradient unless Cin/group is 1)."""
    kernel = e.attr("kernel_shape")
    moved = [1, 0, *range(2, spatial + 2)]
    if group == 1:
        xt = e.op("Transpose", x, perm=moved)                    # [Cin, N, spatial]
        dyt = e.op("Transpose", dy, perm=moved)                  # [Cout, N, out spatial]
    else:
        # batch = input channel within its group, channels = (group, sample)
        grouped = e.op("Concat", e.op("Shape", x, end=1), e.ints([group, -1]), e.op("Shape", x, start=2), axis=0)
        x5 = e.op("Transpose", e.op("Reshape", x, grouped), perm=[2, 1, 0, *range(3, spatial + 3)])
        xt = e.op("Reshape", x5, e.op("Concat", e.ints([0, -1]), e.op("Shape", x, start=2), axis=0))
        dgrouped = e.op("Concat", e.op("Shape", dy, end=1), e.ints([group, -1]), e.op("Shape", dy, start=2),
                        axis=0)
        dy5 = e.op("Transpose", e.op("Reshape", dy, dgrouped), perm=[1, 2, 0, *range(3, spatial + 3)])
        dyt = e.op("Reshape", dy5, e.op("Concat", e.ints([-1]), e.op("Shape", dy, end=1), e.op("Shape", dy, start=2),
                                         axis=0))
    correlated = e.op("Conv", xt, dyt, strides=dilations, dilations=strides, pads=pads, group=group)
    full = e.op("Transpose", correlated, perm=moved)             # [Cout, Cin/group, >= kernel]
    if kernel:
        ends = e.ints(list(kernel))
    else:
        ends = e.op("Shape", w, start=2)
    e.op("Slice", full, e.ints([0] * spatial), ends, e.ints(range(2, spatial + 2)), out=out)


def _forward_pool(e: Emitter, op_type: str) -> NodeProto | None:
    """The forward pooling node of this gradient node: found through MaxPool's index output, or
    by the gradient builder's naming (``<forward node>_Grad/...`` computing ``<input>_grad``)."""
    node = e.node
    if op_type == "MaxPool" and e.input(1):
        found = e.producer(node.input[1])
        if found is not None and found[0].op_type == "MaxPool" and found[1] == 1:
            return found[0]
    candidates = [n for n, _ in e.producers.values() if n.op_type == op_type and domain_of(n) == ""]
    unique = {id(n): n for n in candidates}.values()
    forward_name = node.name.split("_Grad/")[0] if "_Grad/" in node.name else None
    out = e.output(0)
    for candidate in unique:
        if forward_name and candidate.name == forward_name:
            return candidate
    for candidate in unique:
        if out and candidate.input and out == f"{candidate.input[0]}_grad":
            return candidate
    return None


def _input_shape_of_pool(e: Emitter, op_type: str) -> str:
    """The shape of the pooled input: Shape of the forward pool node's input, or the gradient's
    declared static shape."""
    pool = _forward_pool(e, op_type)
    if pool is not None:
        for attribute in pool.attribute:
            if attribute.name == "storage_order" and attribute.i != 0:
                raise e.error("MaxPool with storage_order=1 (column-major indices) is not lowered")
        return e.op("Shape", pool.input[0])
    out = e.output(0)
    shape = e.shape(out) if out else None
    if shape is not None and None not in shape:
        return e.ints(shape)
    raise e.error(f"the shape of the pooled input is unknown: no forward {op_type} node was found for it and "
                  "the gradient's shape is not declared")


@lowers("MaxPoolGrad", domain="")
def _max_pool_grad(e: Emitter, node: NodeProto) -> None:
    dy, indices = e.input(0), e.input(1)
    shape = _input_shape_of_pool(e, "MaxPool")
    count = e.op("ReduceProd", shape, keepdims=1)
    flat = e.op("ScatterElements", e.zeros(count, dy), e.op("Reshape", indices, e.ints([-1])),
                e.op("Reshape", dy, e.ints([-1])), axis=0, reduction="add")
    e.op("Reshape", flat, shape, out=e.output(0))


def average_pool_backward(e: Emitter, dy: str, input_shape: str, kernel: list[int], strides: list[int],
                           pads: list[int], count_include_pad: bool, out: str) -> None:
    """Each output gradient spread evenly over its window, one (n, c) plane at a time."""
    spatial_shape = e.op("Slice", input_shape, e.ints([2]), e.ints([INT64_MAX]))
    window = e.op("CastLike", e.const(np.ones([1, 1, *kernel], dtype=np.float32)), dy)
    if count_include_pad:
        divisor = e.scalar(float(np.prod(kernel)), dy)
    else:
        # the number of input elements (pads excluded) in each window
        ones = e.op("Expand", e.scalar(1, dy), e.op("Concat", e.ints([1, 1]), spatial_shape, axis=0))
        divisor = e.op("Conv", ones, window, strides=strides, pads=pads)
    scaled = e.op("Div", dy, divisor)
    planes = e.op("Reshape", scaled, e.op("Concat", e.ints([-1, 1]), e.op("Shape", dy, start=2), axis=0))
    spread = e.op("ConvTranspose", planes, window, strides=strides, pads=_begin_pads(pads))
    target = e.zeros(e.op("Concat", e.ints([1, 1]), spatial_shape, axis=0), dy)
    full = e.names.fresh(f"{e.stem}/full")
    _fit_to_shape(e, spread, target, full, leading=2)
    e.op("Reshape", full, input_shape, out=out)


@lowers("AveragePoolGrad", domain="")
def _average_pool_grad(e: Emitter, node: NodeProto) -> None:
    kernel = list(e.attr("kernel_shape"))
    spatial = len(kernel)
    strides = list(e.attr("strides", [1] * spatial))
    pads = _explicit_pads(e, spatial)
    if int(e.attr("ceil_mode", 0)):
        raise e.error("ceil_mode=1 is not lowered for the average pool gradient")
    shape = _input_shape_of_pool(e, "AveragePool")
    average_pool_backward(e, e.input(0), shape, kernel, strides, pads, bool(e.attr("count_include_pad", 0)),
                           e.output(0))
