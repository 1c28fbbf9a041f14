"""Exact rewrites that make generated training graphs cheaper to run (used by build_training_graph).

* :func:`flatten_batched_matmuls` (forward, before differentiation): ``MatMul(A[..., K], B[K, N])``
  with ``A`` of rank 3 or more becomes ``Reshape(MatMul(Reshape(A, [-1, K]), B), [..., N])``.
  onnx-ad's reverse rule for a batched ``MatMul`` against a 2-D weight builds the batched outer
  product and reduces it; for the 2-D product the weight gradient is one ``A^T @ G``. Where the
  rows' count is a product of dimensions known to be at least 2, the flattened operand is
  declared with a symbol of its own, which the caller gives the autodiff as never broadcast.
* :func:`simplify_copies` (after differentiation): nodes that copy a whole tensor without moving
  any element become views -- a ``Transpose`` whose permutation moves only axes of size 1
  (onnx-ad's size-1 seed axis) becomes a ``Reshape``, an ``Expand`` to the shape its input has
  already becomes an ``Identity``, and a ``Transpose`` of a ``Transpose`` that undoes it becomes an
  ``Identity`` of the original; nodes whose results nobody reads are dropped; one-element
  operands of broadcasting operators get the rank of the result (``[..., 1] * [1]`` is ~100x
  slower in onnxruntime's CPU kernels than ``[..., 1] * [1, ..., 1]``); a transposed matrix
  product ``Transpose(Reshape(MatMul(A, B)))`` becomes ``Reshape(MatMul(B^T, A^T))``, the
  operand transposes being what onnxruntime folds into ``FusedMatMul`` (the same sums, possibly
  added in another order); a graph output reached through views only is written by the node
  that computes it (onnxruntime would copy the view into the output), in that node's shape
  where the caller accepts one of the same size (``output_views``: a convolution's weight
  gradient as its product's ``[Cout, Cin*k*k]``); a ``Sum`` of zero-padded pieces that tile one
  axis (the gradient of ``unbind``) becomes the ``Concat`` of the pieces.

* :func:`fast_reductions` (after differentiation): a reduction whose input has only
  axes of size 1 after the reduced ones (onnx-ad's seed axis) reduces a view without them, the
  innermost axis then being a reduced one (onnxruntime's CPU reductions are many times slower
  otherwise); with ortagent's CPU kernels, a float32 ``ReduceSum`` over leading axes (a bias's
  gradient) is one ``SumLeadingAxes`` node.

* :func:`masked_softmax_in_parts` (after differentiation, and on inference graphs): a ``Softmax``
  of ``Where(mask, -inf, scores)`` (torch's ``masked_fill(mask, -inf).softmax()``, causal
  attention) is computed without the exponential of the masked scores (see there); with
  ortagent's CPU kernels, a float32 one over the last axis is one ``MaskedSoftmax`` node.

* :func:`explicit_gru_biases` (forward, before differentiation, always): a ``GRU`` with
  ``linear_before_reset=1`` and no bias gets a zero bias, without which onnx-ad's unrolling of
  the node computes another candidate state (see there).
* :func:`promote_mixed_arithmetic` (forward, before differentiation, always): an arithmetic
  node with a floating-point and an integer operand (torch's exporter writes some) gets the
  integer one cast to the floating type, as torch promotes it.
* :func:`batch_unbatched_losses` (forward, before differentiation, always): cross-entropy and
  NLL losses of one unbatched score vector get a batch of one (ONNX defines them batched).
* :func:`vector_products_on_transposes` (every model ortagent hands onnxruntime for training or
  ORTModule's inference, always): a correctness workaround, not a speed-up. onnxruntime 1.31's
  MatMul/Transpose fusion (optimisation level extended and above) computes
  ``MatMul(Transpose(A), v)`` with a vector ``v`` as ``A @ v``: torch's ``mv(w.t(), u)``,
  spectral norm's power iteration, and the input gradient of any matrix-vector product came out
  wrong. The vector becomes a one-column matrix and the product's column is squeezed back.
* :func:`products_over_empty_sums` (where :func:`vector_products_on_transposes` runs): a
  correctness workaround too. onnxruntime's CPU Gemm over an empty sum (``K = 0``) returns its
  ``C`` unscaled by ``beta``, and its fused batched MatMul of a Transpose returns uninitialised
  values; such products of a static shape become zeros (plus ``beta * C``).

The first two work from ONNX shape inference, with symbolic dimensions as well as static ones (the torch
bridge exports symbolic batch and sequence dimensions): a dimension is known when it has a
value or a symbol, and two dimensions with one symbol are equal. A rewrite whose new shape has
symbolic dimensions computes it at run time (``Shape`` and ``Gather``); a decision that needs a
dimension's value (is it 1?) is only taken when the value is static, and a symbolic dimension
is never assumed to be 1. Nodes whose shapes are not known are left alone. Graph inputs and outputs keep their
names, and a value read by a nested subgraph is never removed or renamed. The view rewrites
move no element; the MatMul rewrites compute the same sums, possibly adding in another order
(float32 gradients of a TransformerEncoderLayer agree to 3e-7 relative; the tests hold them
to 1e-6).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ._ad_rules import CPU_KERNELS_DOMAIN as _KERNELS_DOMAIN
from ._onnx_graph import NameAllocator, all_value_names, constant_values, consumed_names

__all__ = ["flatten_batched_matmuls", "seed_axis_round_trips", "simplify_copies", "padded_sums_as_concats",
           "fast_reductions", "pools_at_onnxruntime_sizes", "ceil_mode_pool_outputs",
           "transposes_without_unit_axes",
           "masked_softmax_in_parts", "import_kernels_domain",
           "known_shapes",
           "static_shapes", "explicit_gru_biases", "promote_mixed_arithmetic", "batch_unbatched_losses",
           "ZEROS_ARE_SIZES", "zeros_are_sizes", "mark_zeros_are_sizes", "literal_zero_reshapes",
           "products_over_empty_sums"]

Dims = list  # of int (a static size) or str (a symbol)


def _static(shape: Dims | None) -> bool:
    return shape is not None and all(isinstance(dim, int) for dim in shape)


def static_shapes(model: ModelProto, stand_ins: dict | None = None) -> dict[str, list[int]]:
    """The shapes of :func:`known_shapes` whose every dimension is static."""
    return {name: shape for name, shape in known_shapes(model, stand_ins).items() if _static(shape)}


def known_shapes(model: ModelProto, stand_ins: dict | None = None) -> dict[str, Dims]:
    """Known shapes of the values of ``model``'s main graph (from ONNX shape inference): each
    dimension a static size or a symbol; values with a dimension of unknown size are left out.
    ``stand_ins`` maps a node (by name) to replacement nodes used only for the inference (a node
    that the ONNX checker cannot infer, e.g. the YieldOp)."""
    return {name: dims for name, dims in inferred_dims(model, stand_ins).items() if None not in dims}


def inferred_dims(model: ModelProto, stand_ins: dict | None = None, declared: Sequence = ()) -> dict[str, Dims]:
    """The shapes of :func:`known_shapes`, values of a known rank with dimensions of unknown
    size included (as None). ``declared``: value_info the inference starts from besides the
    model's own (where ONNX's inference knows a dimension only as a fresh unknown, a declared
    symbol stays)."""
    return _dims_of(inferred_values(model, stand_ins, declared))


def _dims_of(values: dict) -> dict[str, Dims]:
    """The shapes of ``values`` (see :func:`inferred_values`), as :func:`inferred_dims` gives them."""
    shapes = _declared_dims([value for value in values.values() if isinstance(value, onnx.ValueInfoProto)])
    shapes.update((name, list(value.dims)) for name, value in values.items() if isinstance(value, onnx.TensorProto))
    return shapes


def inferred_values(model: ModelProto, stand_ins: dict | None = None, declared: Sequence = ()) -> dict:
    """What ONNX shape inference knows of the values of ``model``'s main graph, by name: the
    inputs', outputs' and inferred values' ValueInfoProto, the initializers' TensorProto; empty
    where the inference fails. ``stand_ins`` and ``declared`` as in :func:`inferred_dims`."""
    probe = ModelProto()
    probe.CopyFrom(model)
    if declared:
        present = {value.name for value in (*probe.graph.input, *probe.graph.output, *probe.graph.value_info)}
        probe.graph.value_info.extend(value for value in declared if value.name not in present)
    if stand_ins:
        nodes: list[onnx.NodeProto] = []
        for node in model.graph.node:
            nodes.extend(stand_ins.get(node.name, [node]) if node.name else [node])
        del probe.graph.node[:]
        probe.graph.node.extend(nodes)
    if zeros_are_sizes(probe):
        literal_zero_reshapes(probe)        # (the passes' own views of empty dimensions too)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    graph = inferred.graph
    values: dict = {value.name: value for value in [*graph.input, *graph.value_info, *graph.output]}
    values.update((init.name, init) for init in graph.initializer)
    return values


def _declared_dims(values: Sequence) -> dict[str, Dims]:
    """The shapes the ValueInfos ``values`` declare, by name: each dimension a static size, a
    symbol, or None (unknown); values of unknown rank left out."""
    return {value.name: [int(dim.dim_value) if dim.HasField("dim_value") else (dim.dim_param or None)
                         for dim in value.type.tensor_type.shape.dim]
            for value in values if value.type.tensor_type.HasField("shape")}


def _default_opset(model: ModelProto) -> int:
    """The version of the default ONNX domain ``model`` imports (1 where it imports none)."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)


def import_kernels_domain(model: ModelProto) -> None:
    """Import the CPU kernels' domain (version 1) into ``model`` where its main graph has a node
    of it and the model does not import it yet."""
    if any(node.domain == _KERNELS_DOMAIN for node in model.graph.node) and \
            not any(entry.domain == _KERNELS_DOMAIN for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_KERNELS_DOMAIN, 1))


def _constant(names: NameAllocator, stem: str, values: list[int]):
    name = names.fresh(stem)
    return name, numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _shape_operand(names: NameAllocator, graph, nodes: list, dims: Dims, source: str, axes: list[int]) -> str:
    """A shape tensor with the dimensions ``dims``: a constant when all are static, else gathered
    at run time from the shape of ``source``, whose axes ``axes`` have those dimensions."""
    if _static(dims):
        name, init = _constant(names, "ortagent_view_shape", dims)
        graph.initializer.append(init)
        return name
    indices, init = _constant(names, "ortagent_view_axes", axes)
    graph.initializer.append(init)
    shape = names.fresh(f"{source}_shape")
    gathered = names.fresh("ortagent_view_shape")
    nodes.append(helper.make_node("Shape", [source], [shape]))
    nodes.append(helper.make_node("Gather", [shape, indices], [gathered], axis=0))
    return gathered


def flatten_batched_matmuls(model: ModelProto, opset: int, element_types: dict[str, int] | None = None,
                            symbols_above_one: Collection[str] = ()) -> list[str]:
    """Rewrite, in place, batched MatMuls against 2-D right operands as 2-D MatMuls. Needs opset
    5+ (Reshape with a shape input). Returns the new symbols known to be at least 2: where the
    flattened rows' count is a product of dimensions that are static and at least 1 or among
    ``symbols_above_one`` (one of them at least 2), the flattened operand's shape is declared
    with a fresh symbol for it (its type from ``element_types``), which ONNX's inference
    carries to the product and its gradient; the caller may pass the symbol to the autodiff as
    one that is never broadcast (the gradient of the flattened operand then needs no run-time
    reduction over the axes that were 1)."""
    if opset < 5:
        return []
    graph = model.graph
    shapes = known_shapes(model)
    names = NameAllocator(all_value_names(graph))
    taken_symbols = _dim_params(model)
    above_one = frozenset(symbols_above_one)
    new_symbols: list[str] = []
    rewritten = 0
    nodes: list = []
    for node in graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        a_shape, b_shape = shapes.get(node.input[0]), shapes.get(node.input[1])
        if a_shape is None or not _static(b_shape) or len(a_shape) < 3 or len(b_shape) != 2 \
                or a_shape[-1] != b_shape[0] or 0 in a_shape:
            nodes.append(node)
            continue
        # a symbolic leading dimension is a batch or sequence length the export left free: the
        # export's ranges keep those at 2 or more, so the -1 below never meets an empty tensor
        rows = int(np.prod(a_shape[:-1])) if _static(a_shape[:-1]) else -1
        flat_shape, flat_init = _constant(names, "ortagent_mm_rows", [rows, a_shape[-1]])
        graph.initializer.append(flat_init)
        flat_a = names.fresh(f"{node.input[0]}_2d")
        flat_y = names.fresh(f"{node.output[0]}_2d")
        out_dims = a_shape[:-1] + [b_shape[1]]
        if _static(out_dims):
            out_shape, out_init = _constant(names, "ortagent_mm_shape", out_dims)
            graph.initializer.append(out_init)
        else:
            leading = _shape_operand(names, graph, nodes, a_shape[:-1], node.input[0], list(range(len(a_shape) - 1)))
            columns, columns_init = _constant(names, "ortagent_mm_columns", [b_shape[1]])
            graph.initializer.append(columns_init)
            out_shape = names.fresh("ortagent_mm_shape")
            nodes.append(helper.make_node("Concat", [leading, columns], [out_shape], axis=0))
        element_type = (element_types or {}).get(node.input[0], 0)
        if rows == -1 and element_type and _product_above_one(a_shape[:-1], above_one):
            symbol = _fresh_symbol(taken_symbols, "ortagent_rows")
            graph.value_info.append(helper.make_tensor_value_info(flat_a, element_type, [symbol, a_shape[-1]]))
            new_symbols.append(symbol)
        nodes.append(helper.make_node("Reshape", [node.input[0], flat_shape], [flat_a]))
        nodes.append(helper.make_node("MatMul", [flat_a, node.input[1]], [flat_y], name=node.name))
        nodes.append(helper.make_node("Reshape", [flat_y, out_shape], [node.output[0]]))
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
    return new_symbols


def _product_above_one(dims: Dims, above_one: frozenset) -> bool:
    """Whether the product of ``dims`` is at least 2 whatever the symbols' values allowed."""
    if not all((isinstance(dim, int) and dim >= 1) or dim in above_one for dim in dims):
        return False
    return any(not isinstance(dim, int) or dim >= 2 for dim in dims)


def _dim_params(model: ModelProto) -> set[str]:
    graph = model.graph
    return {dim.dim_param for value in (*graph.input, *graph.output, *graph.value_info)
            for dim in value.type.tensor_type.shape.dim if dim.dim_param}


def _fresh_symbol(taken: set[str], stem: str) -> str:
    index = len(taken)
    while f"{stem}_{index}" in taken:
        index += 1
    taken.add(f"{stem}_{index}")
    return f"{stem}_{index}"


def _moves_only_unit_axes(shape: Dims, perm: list[int]) -> bool:
    """True when transposing by ``perm`` keeps the order of the axes not known to be 1 (the data
    in memory is then unchanged: the transpose is a reshape, whatever the symbols' values)."""
    kept = [axis for axis in perm if shape[axis] != 1]
    return kept == sorted(kept)


def transposes_without_unit_axes(model: ModelProto, stand_ins: dict | None = None) -> int:
    """Rewrite, in place, each Transpose that moves axes of size 1 (onnx-ad's seed axis) along
    with others as the Transpose of the other axes between two views, where that moves one axis
    and the whole moves several; returns how many. onnxruntime's CPU Transpose copies in blocks
    when one axis moves and element by element otherwise, and the unit axes make a move of one
    axis look like one of several: attention's gradient ``[16, 32, 4, 16, 1]`` by ``[4, 0, 2, 1,
    3]`` took 109 us alone, 22 us as ``[16, 32, 4, 16]`` by ``[0, 2, 1, 3]`` between views, a
    depthwise convolution's ``[2, 576, 1, 2, 2]`` by ``[2, 1, 0, 3, 4]`` 12.5 against 6.1 us;
    where one axis moves already the two views only cost (``[2, 240, 1, 4, 4]`` by ``[1, 2, 0,
    3, 4]``: 3.3 against 7.3 us), so those stay, unless the last axis is a unit axis that stays
    last (onnx-ad's seed axis): onnxruntime's optimiser merges such a Transpose with the
    broadcasting of the batched product it feeds into one that moves the seed axis to the front
    (the demo's attention gradient: ``[16, 32, 4, 16, 1]`` by ``[0, 2, 1, 3, 4]`` became ``[4, 0,
    2, 1, 3]``, 160 us twice per step, 505 -> 237 us of Transposes in the backward session's
    profile once rewritten). The elements' order is the same. Run after :func:`simplify_copies`,
    whose products read such Transposes."""
    graph = model.graph
    if not any(node.op_type == "Transpose" for node in graph.node):
        return 0
    shapes = known_shapes(model, stand_ins)
    names = NameAllocator(all_value_names(graph))
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        in_shape = shapes.get(node.input[0]) if node.op_type == "Transpose" and node.domain in ("", "ai.onnx") \
            else None
        if in_shape is None or 1 not in in_shape:
            nodes.append(node)
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(len(in_shape)))[::-1])
        kept = [axis for axis in range(len(in_shape)) if in_shape[axis] != 1]
        inner = [kept.index(axis) for axis in perm if in_shape[axis] != 1]      # (the others' own perm)
        seed_axis_kept = in_shape[-1] == 1 and perm[-1] == len(perm) - 1
        if _moves_only_unit_axes(in_shape, perm) or (_moves_one_axis(perm) and not seed_axis_kept) \
                or not _moves_one_axis(inner):
            nodes.append(node)          # (simplify_copies makes views of the first kind)
            continue
        nodes.append(_transpose_without_unit_axes(node, in_shape, perm, kept, inner, names, graph, nodes))
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _moves_one_axis(perm: list[int]) -> bool:
    """Whether ``perm`` moves at most one axis (the others keep their order): onnxruntime's CPU
    Transpose copies such a permutation in blocks, any other element by element."""
    return any(all(a < b for a, b in zip(rest, rest[1:])) for rest in
               ([axis for axis in perm if axis != moved] for moved in perm))


def _transpose_without_unit_axes(node, in_shape: Dims, perm: list[int], kept: list[int], inner: list[int], names,
                                 graph, nodes: list):
    source = node.input[0]
    squeezed = names.fresh(f"{source}_without_units")
    moved = names.fresh(f"{node.output[0]}_without_units")
    shape_name = _shape_operand(names, graph, nodes, [in_shape[axis] for axis in kept], source, kept)
    nodes.append(helper.make_node("Reshape", [source, shape_name], [squeezed]))
    nodes.append(helper.make_node("Transpose", [squeezed], [moved], perm=inner))
    out_shape = [in_shape[axis] for axis in perm]
    out_name = _shape_operand(names, graph, nodes, out_shape, source, perm)
    return helper.make_node("Reshape", [moved, out_name], list(node.output), name=node.name)


def seed_axis_round_trips(model: ModelProto, keep: frozenset = frozenset()) -> int:
    """``Squeeze(Unsqueeze(x, [-1]), [-1])``, through Identity nodes, is ``x``: each such Squeeze
    becomes ``Identity(x)`` (onnxruntime removes it) and the Unsqueeze, when nothing else reads
    it, is dropped. onnx-ad carries a trailing seed axis of 1 through the backward, and each
    node that computes without it (the CPU kernels, ConvGrad's products) takes it off and puts
    it back: MobileNetV3-small's backward had about 190 such pairs. Any shape: adding a last axis
    and removing it moves nothing. Returns the number of Squeezes rewritten."""
    graph = model.graph
    constants = constant_values(graph)
    producers = {out: node for node in graph.node for out in node.output if out}

    def last_axis_only(node) -> bool:
        return _constant_axes(node, constants) == [-1]

    count = 0
    for node in graph.node:
        if node.op_type != "Squeeze" or node.domain not in ("", "ai.onnx") or not last_axis_only(node):
            continue
        source = producers.get(node.input[0])
        while source is not None and source.op_type == "Identity" and source.domain in ("", "ai.onnx"):
            source = producers.get(source.input[0])
        if source is None or source.op_type != "Unsqueeze" or source.domain not in ("", "ai.onnx") \
                or not last_axis_only(source):
            continue
        node.op_type = "Identity"
        original = source.input[0]
        del node.input[:]
        node.input.append(original)
        del node.attribute[:]
        count += 1
    if count:
        _drop_dead(graph, list(graph.node), keep)
    return count


def simplify_copies(model: ModelProto, stand_ins: dict | None = None, keep: frozenset = frozenset(),
                    rounds: int = 3, output_views: Collection[str] = ()) -> int:
    """Rewrite, in place, full-tensor copies that move no element into views (see the module
    docstring) and drop dead nodes, for up to ``rounds`` rounds (a rewrite can enable another:
    a Transpose that became a Reshape completes a transposed product); returns the number of
    nodes rewritten or dropped. Nodes of the op types in ``keep`` are never dropped. The graph
    outputs named in ``output_views`` may change shape (static, the same size, row-major): one
    reached through views of a computed value whose shape differs is then written by that
    node in its own shape, which the output declares (its reader views it back)."""
    total = 0
    for _ in range(rounds):
        changed = _simplify_round(model, stand_ins, keep, frozenset(output_views))
        total += changed
        if not changed:
            break
    return total


def _simplify_round(model: ModelProto, stand_ins: dict | None, keep: frozenset, output_views: frozenset) -> int:
    graph = model.graph
    shapes = known_shapes(model, stand_ins)
    names = NameAllocator(all_value_names(graph))
    producers = {out: node for node in graph.node for out in node.output if out}
    initializers = {init.name: init for init in graph.initializer}
    constants = None            # (read only when a Sum adds Pad results)
    count = 0
    nodes: list[onnx.NodeProto] = []
    uses = _use_counts(graph.node, graph)
    for node in graph.node:
        replacement = None
        product = _transposed_product(node, shapes, producers, uses, names, graph)
        if product:
            nodes.extend(product)
            count += 1
            continue
        if node.domain in ("", "ai.onnx") and node.op_type == "Transpose" and node.input[0] in shapes:
            in_shape = shapes[node.input[0]]
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"),
                        list(range(len(in_shape)))[::-1])
            inner = producers.get(node.input[0])
            inner_perm = None
            if inner is not None and inner.op_type == "Transpose" and inner.domain in ("", "ai.onnx"):
                inner_perm = next((list(a.ints) for a in inner.attribute if a.name == "perm"), None)
            if inner is not None and inner_perm is not None and len(inner_perm) == len(perm) and \
                    [inner_perm[axis] for axis in perm] == list(range(len(perm))):
                replacement = helper.make_node("Identity", [inner.input[0]], list(node.output))
            elif _moves_only_unit_axes(in_shape, perm):
                out_shape = [in_shape[axis] for axis in perm]
                shape_name = _shape_operand(names, graph, nodes, out_shape, node.input[0], perm)
                replacement = helper.make_node("Reshape", [node.input[0], shape_name], list(node.output))
        elif node.domain in ("", "ai.onnx") and node.op_type == "Expand" and node.input[0] in shapes \
                and node.output[0] in shapes:
            in_shape, out_shape = shapes[node.input[0]], shapes[node.output[0]]
            if in_shape == out_shape:
                replacement = helper.make_node("Identity", [node.input[0]], list(node.output))
            elif _static(in_shape) and _static(out_shape) and int(np.prod(in_shape)) == int(np.prod(out_shape)):
                shape_name, init = _constant(names, "ortagent_view_shape", out_shape)
                graph.initializer.append(init)
                replacement = helper.make_node("Reshape", [node.input[0], shape_name], list(node.output))
        if _adds_pads(node, producers):
            constants = constant_values(graph) if constants is None else constants
            replacement = _padded_sum_as_concat(node, shapes, producers, constants)
        if replacement is None and node.domain in ("", "ai.onnx") and node.op_type in _BROADCASTING:
            count += _full_rank_scalars(node, shapes, names, graph, initializers, nodes)
        if replacement is not None:
            replacement.name = node.name
            nodes.append(replacement)
            count += 1
        else:
            nodes.append(node)
    count += _produce_outputs_directly(graph, nodes, shapes, keep, names, output_views)
    if count:
        products = _transposed_products(graph, nodes, shapes, names)
        if products:            # (a product's Reshape to an output's shape: written directly)
            count += products + _produce_outputs_directly(graph, nodes, shapes, keep, names, output_views)
    count += _drop_dead(graph, nodes, keep)
    return count


def _use_counts(nodes, graph) -> dict[str, int]:
    """How many times each value is read: by ``nodes`` (their subgraphs included) and as a
    graph output."""
    uses: dict[str, int] = {}
    for node in nodes:
        for name in consumed_names(node):
            uses[name] = uses.get(name, 0) + 1
    for value in graph.output:
        uses[value.name] = uses.get(value.name, 0) + 1
    return uses


def _transposed_products(graph, nodes: list, shapes: dict, names) -> int:
    """:func:`_transposed_product` once more for the Transposes of ``nodes`` (the round's
    rewritten list), each replaced in place; returns how many. The round's pass over the nodes
    judged each Transpose by the nodes as they were: a Transpose rewritten into a Reshape, or a
    Squeeze of a weight gradient's Transpose that :func:`_produce_outputs_directly` removed, can
    complete a product behind it. Done now, the next round finds nothing left (ResNet-18's,
    MobileNetV3's and GPT-2's builds took a third round, 0.02-0.09 s, for one such product)."""
    producers = {out: node for node in nodes for out in node.output if out}
    uses = _use_counts(nodes, graph)
    count = 0
    for position in reversed(range(len(nodes))):
        node = nodes[position]
        if node.op_type == "Transpose":
            made = _transposed_product(node, shapes, producers, uses, names, graph)
            if made:
                nodes[position:position + 1] = made
                count += 1
    return count


_REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                         "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"})


def fast_reductions(model: ModelProto, stand_ins: dict | None = None, kernel: bool = False) -> int:
    """Rewrite reductions into the forms onnxruntime computes fast (in place, main graph);
    returns how many were rewritten.

    Reductions of a tensor whose axes after the last reduced one are all of static size 1
    (onnx-ad's seed axis: a LayerNorm's gradient sums ``[B, T, D, 1]`` over ``D``) reduce a view
    without those axes, which a view puts back: onnxruntime's CPU kernels take a strided path
    when the reduced axis is not the innermost one, 18x slower for ``[16, 32, 64, 1]`` over
    axis 2 (137 against 7.4 us) and 4x for ``[2, 16, 32, 32, 1]`` over ``[0, 2, 3]``. The
    same reduction (onnxruntime's faster kernel may add in another order).

    With ``kernel`` (sessions with ortagent's CPU kernels), a float32 ``ReduceSum`` over the
    leading axes ``0 .. k - 1`` (a bias's gradient sums the rows it was broadcast over) becomes
    one ``ai.ortagent.cpu:SumLeadingAxes`` node, unit tail or not: onnxruntime's ReduceSum splits
    the rows between its threads, 5x its one-thread time on two threads (``[512, 192]`` over
    axis 0: 72 against 14 us; the kernel 10-12 us on either). Its output keeps its name, and is
    declared where ONNX inferred it (the kernel has no shape inference); the node (named like the
    ReduceSum, or afresh) gets the ReduceSum as its stand-in in ``stand_ins``."""
    graph = model.graph
    values = inferred_values(model, stand_ins)
    dims = _dims_of(values)
    constants = constant_values(graph)
    names = NameAllocator(all_value_names(graph))
    node_names = NameAllocator({node.name for node in graph.node if node.name})
    declared = {value.name for value in [*graph.value_info, *graph.output]} if kernel else set()
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        made = None
        if node.domain in ("", "ai.onnx") and node.op_type in _REDUCTIONS:
            if kernel:
                made = _leading_sum_kernel(node, values, constants, graph, declared)
                if made is not None:
                    made[0].name = node.name or node_names.fresh("ortagent_sum_leading_axes")
                    if stand_ins is not None:
                        stand_ins[made[0].name] = [node]    # (for the shape inference of later passes)
            if made is None:
                made = _reduction_without_unit_tail(node, dims.get(node.input[0]), constants, names, graph,
                                                    _default_opset(model) >= 14)
        if made:
            nodes.extend(made)
            count += 1
        else:
            nodes.append(node)
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
        import_kernels_domain(model)
    return count


def _leading_sum_kernel(node, values: dict, constants: dict, graph, declared: set) -> list | None:
    """``[SumLeadingAxes]`` for a float32 ``ReduceSum`` over axes ``0 .. k - 1`` of an input of
    known rank, else None; its output is declared (and added to ``declared``) where it was not."""
    source = values.get(node.input[0])
    if node.op_type != "ReduceSum" or not isinstance(source, onnx.ValueInfoProto) \
            or source.type.tensor_type.elem_type != onnx.TensorProto.FLOAT \
            or not source.type.tensor_type.HasField("shape"):
        return None
    rank = len(source.type.tensor_type.shape.dim)
    axes = _constant_axes(node, constants)
    if axes is None or not rank or any(not -rank <= axis < rank for axis in axes):
        return None
    axes = sorted({axis % rank for axis in axes})
    if axes != list(range(len(axes))):
        return None
    keepdims = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
    output = values.get(node.output[0])
    if node.output[0] not in declared and isinstance(output, onnx.ValueInfoProto) \
            and output.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
        graph.value_info.append(output)
        declared.add(node.output[0])
    return [helper.make_node("SumLeadingAxes", [node.input[0]], list(node.output),
                             domain=_KERNELS_DOMAIN, axes=len(axes), keepdims=int(bool(keepdims)))]


def _constant_axes(node, constants: dict) -> list[int] | None:
    """The ``axes`` of a node that reads them from a constant input (Squeeze and Unsqueeze from
    opset 13, reductions from 18) or from an attribute (before); None where they are absent,
    empty or not constant."""
    if len(node.input) > 1 and node.input[1]:
        axes = constants.get(node.input[1])
        return [int(axis) for axis in np.ravel(axes)] if axes is not None and axes.size else None
    return next((list(a.ints) for a in node.attribute if a.name == "axes"), None) or None


def _reduction_without_unit_tail(node, shape: Dims | None, constants: dict, names, graph,
                                 states_allowzero: bool) -> list | None:
    if shape is None or not shape:
        return None
    rank = len(shape)
    from_input = len(node.input) > 1 and bool(node.input[1])
    axes = _constant_axes(node, constants)
    if axes is None:
        return None
    axes = sorted(axis % rank for axis in axes)
    tail = shape[axes[-1] + 1:]
    if not tail or any(dim != 1 for dim in tail):
        return None
    keepdims = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
    kept = rank - len(tail)
    out_rank = kept if keepdims else kept - len(axes)
    view, view_init = _constant(names, "ortagent_untailed_shape", [0] * kept)
    back, back_init = _constant(names, "ortagent_tailed_shape", [0] * out_rank + [1] * len(tail))
    graph.initializer.extend([view_init, back_init])
    untailed = names.fresh(f"{node.input[0]}_untailed")
    reduced = names.fresh(f"{node.output[0]}_untailed")
    inputs = [untailed, *node.input[1:]]
    reduction = onnx.NodeProto()
    reduction.CopyFrom(node)
    if from_input:
        axes_name, axes_init = _constant(names, "ortagent_untailed_axes", axes)
        graph.initializer.append(axes_init)
        inputs[1] = axes_name
    else:
        for attribute in reduction.attribute:
            if attribute.name == "axes":
                del attribute.ints[:]
                attribute.ints.extend(axes)
    del reduction.input[:]
    reduction.input.extend(inputs)
    reduction.output[0] = reduced
    # (the zeros copy the dimensions: allowzero=0 stated where the opset has it, see
    # literal_zero_reshapes)
    copies = {"allowzero": 0} if states_allowzero else {}
    return [helper.make_node("Reshape", [node.input[0], view], [untailed], **copies), reduction,
            helper.make_node("Reshape", [reduced, back], [node.output[0]], **copies)]


_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten"})


def _produce_outputs_directly(graph, nodes: list, shapes: dict, keep: frozenset, names,
                              output_views: frozenset = frozenset()) -> int:
    """A graph output reached from a computed value through view operators only (Reshape,
    Squeeze, Unsqueeze, Identity, Flatten), each value read once, with the output's shape
    already: the computing node writes the graph output itself and the views go. onnxruntime
    copies a view into a graph output's buffer (a weight gradient, every step); this way
    nothing is copied. A MatMul whose operands and result have only leading axes of 1 beyond
    the output's two becomes a 2-D MatMul of views of its operands for this; failing that, an
    output in ``output_views`` takes the computed value's static shape (same size). Returns the
    number of view nodes removed."""
    producers = {out: node for node in nodes for out in node.output if out}
    uses = _use_counts(nodes, graph)
    outputs = [value.name for value in graph.output]
    graph_inputs = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    removed: set[int] = set()
    for name in outputs:
        if outputs.count(name) != 1 or name not in shapes:
            continue
        chain = []
        current = producers.get(name)
        while current is not None and current.op_type in _VIEWS and current.domain in ("", "ai.onnx"):
            chain.append(current)
            source = current.input[0]
            if uses.get(source) != 1 or source in graph_inputs or source in outputs:
                chain = []
                break
            current = producers.get(source)
        if not chain or current is None or current.op_type in keep or current.op_type in _VIEWS:
            continue
        source = chain[-1].input[0]
        if any(id(node) in removed for node in chain):
            continue
        if not _same_count_same_shape(shapes.get(source), shapes[name]) \
                and not _matmul_to_2d(current, shapes, shapes[name], nodes, names, graph):
            own = shapes.get(source)
            if name not in output_views or not (_static(own) and _static(shapes[name])) \
                    or int(np.prod(own)) != int(np.prod(shapes[name])):
                continue
            _declare_output_shape(graph, name, own)
            shapes[name] = list(own)
        for position, out in enumerate(current.output):
            if out == source:
                current.output[position] = name
        removed.update(id(node) for node in chain)
    if removed:
        nodes[:] = [node for node in nodes if id(node) not in removed]
    return len(removed)


def _declare_output_shape(graph, name: str, dims: list[int]) -> None:
    for value in graph.output:
        if value.name == name:
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for dim in dims:
                shape.dim.add().dim_value = dim


def _same_count_same_shape(source: Dims | None, target: Dims) -> bool:
    """Whether a value of shape ``source`` that views carry (same element count) to ``target``
    has ``target``'s shape: the same dimensions, where ``source`` may have a symbol for one
    static dimension of ``target`` (ONNX's inference lost it; the element count fixes it, unless
    another dimension is 0)."""
    if source is None or len(source) != len(target):
        return False
    differing = [(a, b) for a, b in zip(source, target) if a != b]
    return not differing or (len(differing) == 1 and isinstance(differing[0][0], str) and _static(target)
                             and 0 not in target)


def _matrix_view(name: str, shape: Dims, names: NameAllocator, graph, made: list, shapes: dict) -> str:
    """The 2-D view of operand ``name`` (of ``shape``, all leading axes 1): a Reshape appended to
    ``made``, its result's shape recorded. A symbolic dimension of the matrix is read off the
    operand's shape at run time."""
    shape_name = _shape_operand(names, graph, made, shape[-2:], name, [len(shape) - 2, len(shape) - 1])
    matrix = names.fresh(f"{name}_2d")
    made.append(helper.make_node("Reshape", [name, shape_name], [matrix]))
    shapes[matrix] = shape[-2:]
    return matrix


def _matmul_to_2d(node, shapes: dict, wanted: list[int], nodes: list, names, graph) -> bool:
    """Make ``node`` (a MatMul whose operands and result have only leading axes of 1) a 2-D
    MatMul of 2-D views of its operands, when its 2-D result has the shape ``wanted``."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
        return False
    a_shape, b_shape = shapes.get(node.input[0]), shapes.get(node.input[1])
    out_shape = shapes.get(node.output[0])
    if a_shape is None or b_shape is None or out_shape is None or min(len(a_shape), len(b_shape)) < 2:
        return False
    if any(dim != 1 for dim in a_shape[:-2] + b_shape[:-2] + out_shape[:-2]) \
            or not _same_count_same_shape(out_shape[-2:], wanted):
        return False
    position = nodes.index(node)
    for index, shape in enumerate((a_shape, b_shape)):
        if len(shape) == 2:
            continue
        made: list = []
        node.input[index] = _matrix_view(node.input[index], shape, names, graph, made, shapes)
        nodes[position:position] = made
        position += len(made)
    shapes[node.output[0]] = list(wanted)
    return True


def _perm(node) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _through_identities(name: str, producers: dict, uses: dict):
    """The node computing ``name`` past Identity nodes, each read once (None if another reads
    one of them, or if nothing computes it)."""
    node = producers.get(name)
    while node is not None and node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
        if uses.get(node.input[0]) != 1:
            return None
        node = producers.get(node.input[0])
    return node


def _transposed_product(node, shapes, producers, uses, names, graph) -> list | None:
    """``Transpose(Reshape(MatMul(A, B)))`` that only swaps the product's two matrix axes
    (moving axes of size 1 aside) becomes ``Reshape(MatMul(B^T, A^T))``: the product written in
    the layout wanted (a weight gradient ``[N, K]`` rather than ``[K, N]`` then transposed).
    The operand transposes are what onnxruntime folds into ``FusedMatMul``. Applies when the
    MatMul and the Reshape feed nothing else (Identity nodes between them are looked through)
    and all leading axes are 1. The product's two matrix dimensions come from the Reshape's
    static shape; ONNX's inference may know only one of them (a symbol for the other, where
    the operand's shape was computed at run time): the element count then fixes the other."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or uses.get(node.input[0]) != 1:
        return None
    reshape = _through_identities(node.input[0], producers, uses)
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain not in ("", "ai.onnx") \
            or uses.get(reshape.output[0]) != 1 or uses.get(reshape.input[0]) != 1:
        return None
    matmul = _through_identities(reshape.input[0], producers, uses)
    if matmul is None or matmul.op_type != "MatMul" or matmul.domain not in ("", "ai.onnx") \
            or uses.get(matmul.output[0]) != 1:
        return None
    a_name, b_name = matmul.input[0], matmul.input[1]
    a_shape, b_shape = shapes.get(a_name), shapes.get(b_name)
    m_shape, r_shape, t_shape = (shapes.get(matmul.output[0]), shapes.get(reshape.output[0]),
                                 shapes.get(node.output[0]))
    if None in (a_shape, b_shape, m_shape, r_shape, t_shape) or min(len(a_shape), len(b_shape)) < 2:
        return None
    if any(dim != 1 for dim in a_shape[:-2] + b_shape[:-2] + m_shape[:-2]):
        return None
    if not (_static(r_shape) and _static(t_shape)):
        return None
    big = [axis for axis, dim in enumerate(r_shape) if dim != 1]
    if len(big) != 2:
        return None
    rows, cols = r_shape[big[0]], r_shape[big[1]]
    product_dims = m_shape[-2:]
    if rows in (0, 1) or cols in (0, 1) or not (product_dims == [rows, cols]
                                      or (product_dims[0] == rows and isinstance(product_dims[1], str))
                                      or (product_dims[1] == cols and isinstance(product_dims[0], str))):
        return None
    perm = _perm(node) or list(range(len(r_shape)))[::-1]
    if [axis for axis in perm if r_shape[axis] != 1] != [big[1], big[0]]:
        return None
    made = []
    operands = []
    for name, shape in ((b_name, b_shape), (a_name, a_shape)):
        if len(shape) > 2:
            name = _matrix_view(name, shape, names, graph, made, shapes)
        else:
            source = producers.get(name)
            if source is not None and source.op_type == "Transpose" and source.domain in ("", "ai.onnx") \
                    and (_perm(source) or [1, 0]) == [1, 0]:
                operands.append(source.input[0])    # (the operand already transposed: its source)
                continue
        swapped = names.fresh(f"{name}_T")
        made.append(helper.make_node("Transpose", [name], [swapped], perm=[1, 0]))
        shapes[swapped] = shapes[name][::-1]
        operands.append(swapped)
    product = names.fresh(f"{node.output[0]}_product")
    made.append(helper.make_node("MatMul", operands, [product], name=matmul.name))
    shapes[product] = [cols, rows]
    shape_name, init = _constant(names, "ortagent_view_shape", t_shape)
    graph.initializer.append(init)
    made.append(helper.make_node("Reshape", [product, shape_name], list(node.output), name=node.name))
    return made


_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where",
                           "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"})


def padded_sums_as_concats(model: ModelProto, stand_ins: dict | None = None, keep: frozenset = frozenset()) -> int:
    """The ``Sum``-of-padded-pieces rewrite of :func:`simplify_copies` alone, in place, for a
    graph whose pads have become constants since (:func:`ortagent._shape_values.share_shape_values`
    computes those of ortagent's slice gradient over symbolic data); returns how many. Shape
    inference runs only when some ``Sum`` adds ``Pad`` results."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output if out}
    candidates = [node for node in graph.node if _adds_pads(node, producers)]
    if not candidates:
        return 0
    shapes, constants = known_shapes(model, stand_ins), constant_values(graph)
    count = 0
    for node in candidates:
        replacement = _padded_sum_as_concat(node, shapes, producers, constants)
        if replacement is not None:
            replacement.name = node.name
            node.CopyFrom(replacement)
            count += 1
    if count:
        _drop_dead(graph, list(graph.node), keep)
    return count


def _adds_pads(node, producers: dict) -> bool:
    """A ``Sum`` whose every input is a ``Pad`` result: the candidates of
    :func:`_padded_sum_as_concat`."""
    return node.op_type == "Sum" and node.domain in ("", "ai.onnx") and \
        all(getattr(producers.get(name), "op_type", None) == "Pad" for name in node.input)


def _padded_sum_as_concat(node, shapes: dict, producers: dict, constants: dict):
    """``Sum`` of zero-padded pieces that tile one axis (onnx-ad's gradient of the slices of one
    tensor: ``q, k, v = qkv.unbind(0)`` gives three copies of ``qkv``'s size, two thirds zeros)
    as the ``Concat`` of the pieces in their order, or None. Each piece must be a constant-mode
    ``Pad`` by constant zeros of a value whose length along the axis is static, padded on that
    axis only, the pieces' other dimensions known and equal; adding zeros changes no value
    (only the sign of a zero: ``-0 + 0`` is ``+0``, the Concat keeps ``-0`` as torch does)."""
    pieces = []       # (pads before, pads after, the padded value, its shape), padded on `axes`
    axes: set[int] = set()
    for name in node.input:
        pad = producers.get(name)
        if pad is None or pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") or not 2 <= len(pad.input) <= 3:
            return None
        mode = next((helper.get_attribute_value(a) for a in pad.attribute if a.name == "mode"), b"constant")
        pads = constants.get(pad.input[1])
        fill = constants.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(())
        shape = shapes.get(pad.input[0])
        if mode not in (b"constant", "constant") or pads is None or fill is None or np.any(fill != 0) \
                or shape is None or pads.size != 2 * len(shape) or np.any(pads < 0):
            return None
        rank = len(shape)
        padded = [axis for axis in range(rank) if pads[axis] or pads[axis + rank]]
        if len(padded) != 1:
            return None
        axes.add(padded[0])
        pieces.append((int(pads[padded[0]]), int(pads[padded[0] + rank]), pad.input[0], shape))
    if len(axes) != 1:
        return None
    (axis,) = axes
    others = [[dim for position, dim in enumerate(shape) if position != axis] for _, _, _, shape in pieces]
    if any(len(shape) != len(pieces[0][3]) or not isinstance(shape[axis], int) for _, _, _, shape in pieces) \
            or any(dims != others[0] for dims in others):
        return None
    pieces.sort(key=lambda piece: piece[0])
    total = pieces[0][0] + pieces[0][3][axis] + pieces[0][1]
    position = 0
    for before, after, _, shape in pieces:
        if before != position or before + shape[axis] + after != total:
            return None
        position += shape[axis]
    if position != total:
        return None
    return helper.make_node("Concat", [name for _, _, name, _ in pieces], list(node.output), axis=axis)


def _full_rank_scalars(node, shapes, names, graph, initializers, nodes) -> int:
    """Give one-element operands of a broadcasting node the rank of its result: onnxruntime's CPU
    broadcasting is ~100x slower for ``[..., 1] * [1]`` (or a rank-0 scalar) than for
    ``[..., 1] * [1, ..., 1]``, and onnx-ad's seed axis makes every gradient end in a 1. The
    values are unchanged; a constant gets a reshaped copy, a computed value a Reshape view."""
    ranks = [len(shapes[name]) for name in node.input if name in shapes]
    if len(ranks) != len([name for name in node.input if name]) or not ranks:
        return 0
    rank = max(ranks)
    changed = 0
    for position, name in enumerate(node.input):
        shape = shapes.get(name)
        if shape is None or len(shape) >= rank or not _static(shape) or int(np.prod(shape)) != 1:
            continue
        if name in initializers:
            new_name = names.fresh(f"{name}_rank{rank}")
            array = numpy_helper.to_array(initializers[name]).reshape([1] * rank)
            init = numpy_helper.from_array(array, new_name)
            graph.initializer.append(init)
            initializers[new_name] = init
        else:
            new_name = names.fresh(f"{name}_rank{rank}")
            shape_name, init = _constant(names, "ortagent_view_shape", [1] * rank)
            graph.initializer.append(init)
            nodes.append(helper.make_node("Reshape", [name, shape_name], [new_name]))
        shapes[new_name] = [1] * rank
        node.input[position] = new_name
        changed += 1
    return changed


def _drop_dead(graph, nodes, keep) -> int:
    """Keep the nodes whose results reach a graph output (or that are in ``keep``)."""
    needed = {value.name for value in graph.output}
    alive = []
    for node in reversed(nodes):
        if node.op_type in keep or any(out in needed for out in node.output if out):
            alive.append(node)
            needed.update(consumed_names(node))
    alive.reverse()
    dropped = len(nodes) - len(alive)
    del graph.node[:]
    graph.node.extend(alive)
    used = {name for node in alive for name in consumed_names(node)} | {v.name for v in graph.output} \
        | {v.name for v in graph.input}
    kept_inits = [init for init in graph.initializer if init.name in used]
    if len(kept_inits) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept_inits)
    return dropped


def masked_softmax_in_parts(model: ModelProto, kernel: bool = False) -> int:
    """Rewrite, in place (main graph), each ``Softmax`` (opset 13 and up) of ``t = Where(mask,
    -inf, scores)`` (or ``Where(keep, scores, -inf)``; the filler a float constant whose elements
    are all ``-inf``) into its parts, in which the masked positions never reach the exponential:
    ``d = t - ReduceMax(t)``, ``e = Where(mask, 0, Exp(Where(mask, 0, d)))``, ``y = e /
    ReduceSum(e)`` over the softmax's axis; returns how many. onnxruntime's CPU Softmax computes
    ``exp(-inf - max)`` through subnormal floats, which this machine's CPU handles on a slow path
    (the demo's causal attention ``[16, 4, 32, 32]``: ~400 us a Softmax against ~70 us
    unmasked); the parts take about a fifth of that. The values are the Softmax's up to the
    exponential's rounding: masked positions are exactly 0, and a row masked entirely is NaN
    (``-inf - -inf``), as torch's is. A finite filler (``finfo.min``) is left alone: there a
    row masked entirely is uniform, not 0. With ``kernel`` (sessions with ortagent's CPU
    kernels), a float32 Softmax over the last axis becomes one ``ai.ortagent.cpu:MaskedSoftmax``
    node of ``t`` instead (the same values, row by row in one node; half the time of the
    parts)."""
    graph = model.graph
    opset = _default_opset(model)
    if opset < 13 or not any(node.op_type == "Softmax" for node in graph.node):
        return 0
    producers = {out: node for node in graph.node for out in node.output if out}
    constants = constant_values(graph)
    names = NameAllocator(all_value_names(graph))
    ranks = {value.name: len(value.type.tensor_type.shape.dim) for value in [*graph.input, *graph.value_info]
             if value.type.tensor_type.HasField("shape")} if kernel else None
    shared: dict[tuple, str] = {}       # one zero per element type, one axes operand per axis
    nodes: list = []
    count = 0
    for node in graph.node:
        parts = _masked_softmax_parts(node, producers, constants, names, graph, shared, opset, ranks)
        if parts is None:
            nodes.append(node)
        else:
            nodes.extend(parts)
            count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
        import_kernels_domain(model)
    return count


def _masked_softmax_parts(node, producers, constants, names, graph, shared, opset, ranks) -> list | None:
    """The nodes that replace ``node`` (see :func:`masked_softmax_in_parts`), or None; ``ranks``
    (value name to rank) where the kernel may be used, else None."""
    if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
        return None
    where = producers.get(node.input[0])
    if where is None or where.op_type != "Where" or where.domain not in ("", "ai.onnx"):
        return None
    filled = next((position for position in (1, 2) if _all_negative_infinity(constants.get(where.input[position]))),
                  None)
    if filled is None:
        return None
    dtype = constants[where.input[filled]].dtype
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    if ranks is not None and dtype == np.float32 and (axis == -1 or axis == ranks.get(node.input[0], 0) - 1):
        return [helper.make_node("MaskedSoftmax", [node.input[0]], list(node.output),
                                 name=node.name or names.fresh(f"{node.output[0]}_softmax"), domain=_KERNELS_DOMAIN)]
    zero = _shared_constant(shared, graph, names, "ortagent_softmax_zero", np.zeros((), dtype))
    axes = _shared_constant(shared, graph, names, "ortagent_softmax_axis", np.array([axis], np.int64))
    stem = node.output[0]
    part = lambda suffix: names.fresh(f"{stem}_{suffix}")      # noqa: E731
    t, mask = node.input[0], where.input[0]

    def masked_to_zero(value, out):
        operands = [mask, zero, value] if filled == 1 else [mask, value, zero]
        return helper.make_node("Where", operands, [out])

    largest, shifted, kept, exponential, masked, total = (part(suffix) for suffix in (
        "max", "shifted", "shifted_kept", "exp", "exp_kept", "sum"))
    reduce_max = (helper.make_node("ReduceMax", [t, axes], [largest], keepdims=1) if opset >= 18
                  else helper.make_node("ReduceMax", [t], [largest], axes=[axis], keepdims=1))
    return [reduce_max,
            helper.make_node("Sub", [t, largest], [shifted]),
            masked_to_zero(shifted, kept),
            helper.make_node("Exp", [kept], [exponential]),
            masked_to_zero(exponential, masked),
            helper.make_node("ReduceSum", [masked, axes], [total], keepdims=1),
            helper.make_node("Div", [masked, total], list(node.output), name=node.name)]


def _shared_constant(shared: dict, graph, names, stem: str, value: np.ndarray) -> str:
    """The name of an initializer holding ``value``, added to ``graph`` the first time a pass
    asks for that value (``shared`` remembers them)."""
    key = (value.dtype.str, value.shape, value.tobytes())
    if key not in shared:
        shared[key] = names.fresh(stem)
        graph.initializer.append(numpy_helper.from_array(value, shared[key]))
    return shared[key]


def _all_negative_infinity(value) -> bool:
    return (value is not None and value.dtype in (np.float32, np.float64) and value.size > 0
            and bool(np.all(np.isneginf(value))))


def explicit_gru_biases(model: ModelProto) -> int:
    """Give every ``GRU`` with ``linear_before_reset=1`` and no bias operand a zero bias, in
    place; returns how many. onnx-ad unrolls a GRU into a Scan over its equations and applies
    ``linear_before_reset`` only where the node has a bias: without one it computes the
    candidate state from ``(r * h) R`` instead of ``r * (h R)`` -- torch's ``nn.GRU(bias=False)``
    exports exactly that node, and its outputs and gradients differed. With a zero bias the
    unrolled equations are the node's own; the values are unchanged."""
    graph = model.graph
    names = NameAllocator(all_value_names(graph))
    types = {value.name: value.type.tensor_type.elem_type for value in [*graph.input, *graph.value_info]}
    types.update({init.name: init.data_type for init in graph.initializer})
    given = 0
    for node in graph.node:
        if node.op_type != "GRU" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if not attrs.get("linear_before_reset") or (len(node.input) > 3 and node.input[3]):
            continue
        hidden = attrs.get("hidden_size")
        elem_type = types.get(node.input[0]) or types.get(node.input[1])
        if not hidden or not elem_type:
            continue
        directions = 2 if attrs.get("direction", b"forward") in (b"bidirectional", "bidirectional") else 1
        bias = names.fresh(f"{node.name or 'gru'}_zero_bias")
        zeros = np.zeros((directions, 6 * hidden), dtype=helper.tensor_dtype_to_np_dtype(elem_type))
        graph.initializer.append(numpy_helper.from_array(zeros, bias))
        inputs = list(node.input) + [""] * (4 - len(node.input))
        inputs[3] = bias
        del node.input[:]
        node.input.extend(inputs)
        given += 1
    return given


_PROMOTING = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Mod"})
_INTEGER_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                            onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.BOOL})
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.BFLOAT16})


def promote_mixed_arithmetic(model: ModelProto, types: dict[str, int] | None = None) -> int:
    """Cast the integer operand of an arithmetic node whose other operand is floating point to
    that type, in place (main graph); returns how many operands. ONNX arithmetic wants one
    type, and torch's exporter writes some decompositions with an integer count (``masked.var``
    divides by a count summed from int64 ones), which onnxruntime refuses to load; torch
    promotes the integer to the floating type, as this does. ``types`` (value name -> element
    type, from an earlier shape inference of the model) saves inferring them again."""
    graph = model.graph
    if not any(node.op_type in _PROMOTING for node in graph.node):
        return 0
    if types is None:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:
            return 0
        types = {value.name: value.type.tensor_type.elem_type
                 for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    types = {**types, **{init.name: init.data_type for init in graph.initializer}}
    names = NameAllocator(all_value_names(graph))
    nodes: list = []
    promoted = 0
    for node in graph.node:
        if node.op_type in _PROMOTING and node.domain in ("", "ai.onnx") and len(node.input) == 2:
            kinds = [types.get(name, 0) for name in node.input]
            floating = [kind for kind in kinds if kind in _FLOAT_TYPES]
            if floating and any(kind in _INTEGER_TYPES for kind in kinds) and len(set(floating)) == 1:
                for position, kind in enumerate(kinds):
                    if kind in _INTEGER_TYPES:
                        cast = names.fresh(f"{node.input[position]}_as_float")
                        nodes.append(helper.make_node("Cast", [node.input[position]], [cast], to=floating[0]))
                        node.input[position] = cast
                        promoted += 1
        nodes.append(node)
    if promoted:
        del graph.node[:]
        graph.node.extend(nodes)
    return promoted


def batch_unbatched_losses(model: ModelProto) -> int:
    """Give ``SoftmaxCrossEntropyLoss`` / ``NegativeLogLikelihoodLoss`` nodes whose scores are
    one vector ``[C]`` (torch's cross_entropy of one unbatched sample) a batch of one, in
    place; returns how many. ONNX defines these losses for ``[N, C, ...]`` only (onnxruntime
    cannot run the unbatched node, and onnx-ad cannot type its function body): the scores and
    the target get a leading axis of 1, and unreduced results lose it again. The values are
    unchanged (a mean over one sample is that sample)."""
    graph = model.graph
    nodes = [node for node in graph.node if node.op_type in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")
             and node.domain in ("", "ai.onnx")]
    if not nodes:
        return 0
    shapes = known_shapes(model)
    names = NameAllocator(all_value_names(graph))
    axis, axis_init = _constant(names, "ortagent_batch_axis", [0])
    rewritten: list = []
    batched = 0
    losses = {id(node) for node in nodes}
    for node in graph.node:
        if id(node) not in losses:
            rewritten.append(node)
            continue
        shape, target = shapes.get(node.input[0]), shapes.get(node.input[1]) if len(node.input) > 1 else None
        if shape is None or len(shape) != 1 or target is None or len(target) != 0:
            rewritten.append(node)
            continue
        for position in (0, 1):
            lifted = names.fresh(f"{node.input[position]}_batched")
            rewritten.append(helper.make_node("Unsqueeze", [node.input[position], axis], [lifted]))
            node.input[position] = lifted
        reduction = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "reduction"), b"mean")
        squeezed = [0] if reduction in (b"none", "none") else []
        if len(node.output) > 1 and node.output[1]:
            squeezed.append(1)          # SoftmaxCrossEntropyLoss's log_prob
        finals = []
        for index in squeezed:
            inner = names.fresh(f"{node.output[index]}_batched")
            finals.append(helper.make_node("Squeeze", [inner, axis], [node.output[index]]))
            node.output[index] = inner
        rewritten.append(node)
        rewritten.extend(finals)
        batched += 1
    if batched:
        graph.initializer.append(axis_init)
        del graph.node[:]
        graph.node.extend(rewritten)
    return batched


_POOLS = frozenset({"AveragePool", "MaxPool", "LpPool"})


def pools_at_onnxruntime_sizes(model: ModelProto) -> int:
    """Give, in place, each pooling node with ``ceil_mode=1`` whose output size ONNX's rule
    before opset 22 and onnxruntime's kernels disagree on, padding under which both agree;
    returns how many nodes changed. Below opset 22 ONNX counts a last window that starts in the
    end padding, which onnxruntime's kernels (at every opset) and torch drop: at static shapes
    onnxruntime's own shape inference then gives the pool one window more per such axis than
    its kernel writes, and a graph that meets that value with another of the kernel's size
    fails to load (a Mul of the pool and its gradient), or takes the inferred size for a
    constant (a Slice to ``Shape(pool)``). On such an axis the end padding becomes the
    last kept window's overhang past the input, under which ONNX's ceil counts exactly the
    kernel's windows; the values are the same, since no window that is kept reaches beyond
    that overhang (an average's divisor, with ``count_include_pad``, counts up to the window's
    end either way). Nodes with ``auto_pad``, input sizes not known at export, or a last window
    ending inside the input (a stride longer than the kernel) are left alone."""
    if _default_opset(model) >= 22 or not any(node.op_type in _POOLS for node in model.graph.node):
        return 0
    shapes = _declared_dims([*model.graph.input, *model.graph.value_info])
    changed = 0
    for node in model.graph.node:
        if node.op_type not in _POOLS or node.domain not in ("", "ai.onnx"):
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        shape = shapes.get(node.input[0])
        if not attributes.get("ceil_mode") or attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") \
                or shape is None or not all(isinstance(size, int) for size in shape[2:]):
            continue
        sizes = shape[2:]
        spatial = len(sizes)
        kernel = list(attributes["kernel_shape"])
        strides = list(attributes.get("strides") or [1] * spatial)
        dilations = list(attributes.get("dilations") or [1] * spatial)
        pads = list(attributes.get("pads") or [0] * (2 * spatial))
        new_pads = _onnxruntime_pads(sizes, kernel, strides, dilations, pads)
        if new_pads is None or new_pads == pads:
            continue
        kept = [a for a in node.attribute if a.name != "pads"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("pads", new_pads)])
        changed += 1
    return changed


def ceil_mode_pool_outputs(model: ModelProto) -> set[str]:
    """The outputs of ``model``'s pooling nodes with ``ceil_mode=1`` whose size ONNX's shape
    inference computes by its rule before opset 22 (see :func:`pools_at_onnxruntime_sizes`)."""
    if _default_opset(model) >= 22:
        return set()
    return {node.output[0] for node in model.graph.node
            if node.op_type in _POOLS and node.domain in ("", "ai.onnx")
            and any(attr.name == "ceil_mode" and attr.i for attr in node.attribute)}


def _onnxruntime_pads(sizes, kernel, strides, dilations, pads) -> list[int] | None:
    """Pads under which ONNX's ceil rule counts the windows onnxruntime's kernel writes, or
    None where no such pads exist."""
    spatial = len(sizes)
    new_pads = list(pads)
    for axis, (size, k, stride, dilation) in enumerate(zip(sizes, kernel, strides, dilations)):
        begin, end = pads[axis], pads[axis + spatial]
        extent = (k - 1) * dilation + 1
        counted = -(-(size + begin + end - extent) // stride) + 1          # ONNX's ceil rule
        written = counted - 1 if (counted - 1) * stride >= size + begin else counted
        if written == counted:
            continue
        overhang = (written - 1) * stride + extent - size - begin
        if overhang < 0:
            return None
        new_pads[axis + spatial] = overhang
    return new_pads


def vector_products_on_transposes(model: ModelProto) -> int:
    """Rewrite, in place, each main-graph ``MatMul(T, v)`` whose first operand a ``Transpose``
    makes and whose second is of rank 1 as ``Squeeze(MatMul(T, Unsqueeze(v, -1)), -1)``, which
    onnxruntime computes right (see the module docstring); returns the number rewritten. Ranks
    come from the model's declarations, else from ONNX shape inference; a product whose
    operand's rank is unknown is left alone."""
    graph = model.graph
    transposed = {node.output[0] for node in graph.node
                  if node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and node.output}
    candidates = [node for node in graph.node if node.op_type == "MatMul" and node.domain in ("", "ai.onnx")
                  and len(node.input) == 2 and node.input[0] in transposed]
    if not candidates or _default_opset(model) < 13:
        return 0
    ranks = {value.name: len(value.type.tensor_type.shape.dim)
             for value in (*graph.input, *graph.value_info, *graph.output) if value.type.tensor_type.HasField("shape")}
    ranks.update((init.name, len(init.dims)) for init in graph.initializer)
    if any(node.input[1] not in ranks for node in candidates):
        ranks.update((name, len(dims)) for name, dims in inferred_dims(model).items())
    vectors = {id(node) for node in candidates if ranks.get(node.input[1]) == 1}
    if not vectors:
        return 0
    names = NameAllocator(all_value_names(graph))
    axis, init = _constant(names, "ortagent_last_axis", [-1])
    graph.initializer.append(init)
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if id(node) not in vectors:
            nodes.append(node)
            continue
        column, product = names.fresh(f"{node.input[1]}_column"), names.fresh(f"{node.output[0]}_column")
        nodes += [helper.make_node("Unsqueeze", [node.input[1], axis], [column]),
                  helper.make_node("MatMul", [node.input[0], column], [product], name=node.name),
                  helper.make_node("Squeeze", [product, axis], [node.output[0]])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(vectors)


def _constant_value(name: str, initializers: dict, producers: dict) -> np.ndarray | None:
    """The value of ``name`` where an initializer or a standard ``Constant`` node (with a tensor
    ``value``) holds it, else None (only that value is converted, not every initializer)."""
    init = initializers.get(name)
    if init is not None:
        return numpy_helper.to_array(init)
    node = producers.get(name)
    if node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        return None if value is None else numpy_helper.to_array(value)
    return None


#: operators whose output sizes depend on tensor values: a graph holding one may meet a size 0
#: at run time whatever its inputs' shapes
_DATA_DEPENDENT_SIZES = frozenset({"NonZero", "Compress", "Unique", "NonMaxSuppression", "StringSplit"})
#: operators whose integer output holds only entries taken from their (first) input's
_SIZE_SELECTIONS = frozenset({"Gather", "GatherElements", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Identity",
                              "Cast", "Expand", "Tile", "Flatten"})
#: operators that make sizes of sizes (all their inputs sizes)
_SIZE_ARITHMETIC = frozenset({"Concat", "Mul", "Add", "Div", "Max", "Min"})


#: metadata entry of a model whose Reshape shapes hold sizes only, a 0 never meaning ONNX's "copy
#: this dimension": ORTModule's exports (torch has no such meaning) and the graphs built from them
ZEROS_ARE_SIZES = "ortagent.reshape_zeros_are_sizes"


def zeros_are_sizes(model: ModelProto) -> bool:
    """Whether ``model`` is marked with :data:`ZEROS_ARE_SIZES`."""
    return any(entry.key == ZEROS_ARE_SIZES for entry in model.metadata_props)


def mark_zeros_are_sizes(model: ModelProto) -> None:
    """Mark ``model`` with :data:`ZEROS_ARE_SIZES` and set ``allowzero`` where its Reshapes
    need it (:func:`literal_zero_reshapes`)."""
    if not zeros_are_sizes(model):
        onnx.helper.set_model_props(model, {**{e.key: e.value for e in model.metadata_props}, ZEROS_ARE_SIZES: "1"})
    literal_zero_reshapes(model)


def literal_zero_reshapes(model: ModelProto) -> int:
    """Set ``allowzero=1`` on the main-graph ``Reshape`` nodes whose shape can hold a 0 that
    means a size; returns how many were set. For graphs whose zeros are sizes (see
    :data:`ZEROS_ARE_SIZES`; a graph from elsewhere may mean "copy" by a 0). ONNX reads a 0 in
    a Reshape's shape as "this input dimension" unless ``allowzero`` is set, but the shapes
    torch and ortagent's passes write hold sizes: an empty batch's ``[0, 2] -> [2, 0]`` became
    ``[2, 2]``, and ONNX's shape inference (which the passes read) misread the same. Set on a
    Reshape whose shape is a constant with a 0 and no negative entry, and, in a graph with an operator of
    data-dependent output size (a boolean mask's ``NonZero``: a selection may be empty at run
    time), on one whose shape is made of sizes only (``Shape``, selections from it, sums and
    products of sizes, constants without negative entries). A Reshape that states ``allowzero``
    says what it means and is left (ortagent's own copies of dimensions state ``allowzero=0``),
    and so is a shape with a -1: onnx-ad writes ``[0, 0, -1]`` meaning "copy", and ONNX refuses
    a -1 beside ``allowzero=1``."""
    if _default_opset(model) < 14:
        return 0
    graph = model.graph
    reshapes = [node for node in graph.node if node.op_type == "Reshape" and node.domain in ("", "ai.onnx")
                and len(node.input) == 2 and not any(a.name == "allowzero" for a in node.attribute)]
    if not reshapes:
        return 0
    dynamic = any(node.op_type in _DATA_DEPENDENT_SIZES for node in graph.node)
    producers = {name: node for node in graph.node for name in node.output}
    initializers = {init.name: init for init in graph.initializer}
    sizes_only: dict[str, bool] = {}

    def constant(name: str) -> np.ndarray | None:
        return _constant_value(name, initializers, producers)

    def holds_sizes(name: str) -> bool:
        known = sizes_only.get(name)
        if known is not None:
            return known
        sizes_only[name] = False            # (a graph has no cycles; this only ends a bad one)
        value = constant(name)
        node = producers.get(name)
        if value is not None:
            result = not (value < 0).any()
        elif node is None or node.domain not in ("", "ai.onnx"):
            result = False
        elif node.op_type in ("Shape", "Size"):
            result = True
        elif node.op_type in _SIZE_SELECTIONS:
            result = holds_sizes(node.input[0])
        elif node.op_type in _SIZE_ARITHMETIC:
            result = all(holds_sizes(operand) for operand in node.input if operand)
        else:
            result = False
        sizes_only[name] = result
        return result

    count = 0
    for node in reshapes:
        value = constant(node.input[1])
        if value is not None:
            literal = bool((value == 0).any()) and not (value < 0).any()
        else:
            literal = dynamic and holds_sizes(node.input[1])
        if literal:
            node.attribute.append(helper.make_attribute("allowzero", 1))
            count += 1
    return count


def products_over_empty_sums(model: ModelProto) -> int:
    """Rewrite, in place, each main-graph ``MatMul`` and ``Gemm`` whose summed dimension is
    statically 0 so that onnxruntime computes no empty sum; returns the number rewritten. A
    correctness workaround: onnxruntime 1.31's CPU Gemm over an empty sum returns its ``C``
    unscaled by ``beta`` (``torch.addmm(c, a[5, 0], b[0, 10], beta=0.2)`` came out as ``c``),
    and its ``FusedMatMul`` (a batched MatMul of a Transpose, fused by its optimiser) returns
    uninitialised values (``addbmm``'s gradient over ``[5, 0, 5]`` batches: NaN or noise).
    The product becomes zeros of its static shape (``Expand`` of a 0), plus ``beta * C`` for a
    Gemm with a ``C``; a product whose shape is not static is left. Only graphs with a
    statically empty dimension among their inputs or initializers are looked at (the shapes
    come from ONNX shape inference)."""
    graph = model.graph
    products = [node for node in graph.node if node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx")]
    if not products:
        return 0
    empty = any(dim.HasField("dim_value") and dim.dim_value == 0
                for value in graph.input for dim in value.type.tensor_type.shape.dim)
    if not (empty or any(0 in init.dims for init in graph.initializer)):
        return 0
    dims = inferred_dims(model)
    chosen = {}
    for node in products:
        shape, out = dims.get(node.input[0]), dims.get(node.output[0])
        if not shape or not _static(out):
            continue
        trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0) if node.op_type == "Gemm" else 0
        summed = shape[-2] if trans_a and len(shape) == 2 else shape[-1]
        if summed == 0:
            chosen[id(node)] = out
    if not chosen:
        return 0
    names = NameAllocator(all_value_names(graph))
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        out = chosen.get(id(node))
        if out is None:
            nodes.append(node)
            continue
        zero, typed, shape_name = (names.fresh(f"{node.output[0]}_{part}") for part in ("zero", "typed_zero", "shape"))
        graph.initializer.extend([numpy_helper.from_array(np.array(0.0, dtype=np.float32), zero),
                                  numpy_helper.from_array(np.array(out, dtype=np.int64), shape_name)])
        nodes.append(helper.make_node("CastLike", [zero, node.input[0]], [typed]))
        c = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else ""
        if not c:
            nodes.append(helper.make_node("Expand", [typed, shape_name], [node.output[0]], name=node.name))
            continue
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
        zeros, beta_name, cast, scaled = (names.fresh(f"{node.output[0]}_{part}")
                                          for part in ("zeros", "beta", "beta_cast", "term"))
        graph.initializer.append(numpy_helper.from_array(np.array(beta, dtype=np.float32), beta_name))
        nodes += [helper.make_node("Expand", [typed, shape_name], [zeros], name=node.name),
                  helper.make_node("CastLike", [beta_name, c], [cast]),
                  helper.make_node("Mul", [c, cast], [scaled]),
                  helper.make_node("Add", [zeros, scaled], [node.output[0]])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(chosen)
