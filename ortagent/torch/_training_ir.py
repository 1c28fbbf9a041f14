"""torch.export's training IR translated to ONNX without torch's second trace.

torch.onnx prepares an exported program for its translation by tracing it once more
(``ExportedProgram.run_decompositions`` with a table of the decompositions of every operator
that has no ONNX translation): 0.6-0.8 s of a ResNet-18's or a GPT-2's first call on this
project's test machine, with 0.1 s more to build that table, as long as the export itself. The
retrace does three things: it decomposes the operators without a translation, it removes
in-place updates (functionalization), and it inlines the higher-order operators of regions
(``torch.no_grad()``, autocast). Most training IRs ORTModule exports need little of it: every
operator but a few has a translation, the in-place updates are of intermediate results nothing
else sees (``relu_``, a residual's ``+=``, ``x[:, 1:] = y`` into a new tensor), and the regions
are ``no_grad`` blocks.

:func:`translate` rewrites those few things in the FX graph itself and hands the program to the
translation. It changes the graph only after checking all of it, and only for what it knows to
be the retrace's own result: an in-place update of an intermediate that no view sees before the
last update becomes its out-of-place form, read by the uses that follow it; a write through a
slice or an element of such an intermediate, a view nothing else reads, becomes the view's new
values scattered into a copy; a conversion (``Tensor.to``) that changes nothing is its input
and one that does is ``_to_copy``; a few composite operators become the operators their
composite implementation calls; a ``torch.no_grad()`` region's operators take its place. A
program with anything else (an update of an input, a buffer, a view read again or a view of a
view, an autocast region, an operator with neither a translation nor a rewrite here) is left as
it was, and goes through torch.onnx's whole preparation.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

__all__ = ["translate"]

_aten = torch.ops.aten

#: the assertions torch.onnx removes before its translation
_ASSERTIONS = frozenset(
    overload for packet in ("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range_for_size")
    for overload in (getattr(getattr(_aten, packet, None), name, None) for name in ("default", "msg"))
    if overload is not None)

#: composite operators whose composite implementation calls one operator on the same arguments
_SAME_ARGUMENTS = {
    "aten::__and__.Tensor": "bitwise_and.Tensor",
    "aten::__or__.Tensor": "bitwise_or.Tensor",
    "aten::__xor__.Tensor": "bitwise_xor.Tensor",
    "aten::min.other": "minimum.default",
    "aten::max.other": "maximum.default",
}

_CONVERSIONS = frozenset({"aten::to.dtype", "aten::to.dtype_layout", "aten::to.device", "aten::to.other"})

#: the views an in-place update may write through, and the operators that write them back
_SCATTERS = {view: scatter for view, scatter in (
    (getattr(getattr(_aten, "slice", None), "Tensor", None), getattr(getattr(_aten, "slice_scatter", None), "default", None)),
    (getattr(getattr(_aten, "select", None), "int", None), getattr(getattr(_aten, "select_scatter", None), "default", None)))
    if view is not None and scatter is not None}

#: the region whose operators the retrace inlines as they are (``torch.no_grad()`` blocks and
#: the like: the gradients they cut are cut by the trace's own markers; autocast regions,
#: whose operators the retrace recasts, are not among them)
_GRAD_MODE_REGION = getattr(getattr(torch.ops, "higher_order", None), "wrap_with_set_grad_enabled", None)


def translate(program: Any, registry: Any, opset: int) -> Any:
    """torch.onnx's translation of ``program`` (a training IR from ``torch.export.export``,
    rewritten in place) at ``opset``, with ``registry``'s translations; None, the program left
    as it was, where it needs torch.onnx's retrace or these internals of torch.onnx are not
    there as expected (another torch)."""
    try:
        from torch.onnx._internal.exporter import _core, _fx_passes
    except ImportError:
        return None
    translate_program = getattr(_core, "_exported_program_to_onnx_program", None)
    if translate_program is None or getattr(registry, "opset_version", opset) != opset or not all(
            hasattr(_fx_passes, name) for name in ("insert_type_promotion_nodes", "remove_assertion_nodes")):
        return None
    graph_module = program.graph_module
    plan = _plan(graph_module.graph, registry)
    if plan is None:
        return None
    renamed = _apply(graph_module.graph, plan)
    for spec in program.graph_signature.output_specs:
        name = getattr(spec.arg, "name", None)
        if name in renamed:
            spec.arg.name = renamed[name]
    graph_module.recompile()
    # (torch.onnx's own preparation after its retrace: explicit type promotions, no assertions;
    # with the dimensions of size 0 or 1 kept symbolic, as there)
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        if _promotes_some_type(graph_module):
            _fx_passes.insert_type_promotion_nodes(graph_module)
        program._graph_module = _fx_passes.remove_assertion_nodes(graph_module)
    translated = translate_program(program, registry=registry)
    # (the translation imports the domains its nodes use: a program of no operator, an eval-mode
    # dropout's, would import none, and its output-fixing Identity would then have no opset)
    translated.model.graph.opset_imports.setdefault("", opset)
    return translated


def _promotes_some_type(graph_module: torch.fx.GraphModule) -> bool:
    """Whether torch.onnx's type promotion pass would cast some operand of ``graph_module``
    (nested graphs included); True where that cannot be told. The pass runs the whole program
    again on fake tensors (0.02-0.21 s of the benchmark models' first calls) to insert casts
    where an operator's operands differ from the dtype its promotion rule gives them, which in
    six of group 7's seven models is nowhere. Asked of the same rules on the values the export
    recorded (``meta["val"]``): while no operand is cast, those are the values the pass sees."""
    try:
        from torch.onnx._internal.fx import type_utils
        from torch.onnx._internal.fx.passes import type_promotion
        table = type_promotion.TypePromotionTable()
        rule_of = type_promotion.get_type_promotion_rule
    except (ImportError, AttributeError):
        return True

    def value(arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            if "val" not in arg.meta:
                raise LookupError(arg.name)
            return arg.meta["val"]
        if isinstance(arg, (list, tuple)):
            return type(arg)(value(item) for item in arg)
        return arg

    def cast(arg: Any, dtype: torch.dtype | None) -> bool:
        if dtype is None:
            return False
        if isinstance(arg, (list, tuple)):
            return any(cast(item, dtype) for item in arg)
        if isinstance(arg, torch.Tensor):
            return arg.dtype != dtype
        own = type_utils.from_scalar_type_to_torch_dtype(type(arg))     # (Python and symbolic numbers)
        if own is None:
            raise TypeError(type(arg).__name__)
        return own != dtype

    try:
        for module in graph_module.modules():
            for node in module.graph.nodes:
                if node.op != "call_function" or (rule := rule_of(node, table)) is None:
                    continue
                args, kwargs = value(node.args), {name: value(arg) for name, arg in node.kwargs.items()}
                dtypes = rule.preview_type_promotion(args, kwargs)
                if any(cast(arg, dtypes.args_dtypes.get(index)) for index, arg in enumerate(args)) \
                        or any(cast(arg, dtypes.kwargs_dtypes.get(name)) for name, arg in kwargs.items()):
                    return True
    except Exception:       # (anything unforeseen: the pass decides)
        return True
    return False


# -- the check ----------------------------------------------------------------------------------------

def _plan(graph: torch.fx.Graph, registry: Any) -> dict[torch.fx.Node, Any] | None:
    """The rewrite of each node that needs one, or None when the program needs the retrace: the
    node's replacement operator; None (the node is its input); for a write through a view, the
    pair (the update's out-of-place operator, the scatter that writes the view back); for a
    grad-mode region, its body's own plan (a dict)."""
    plan: dict[torch.fx.Node, Any] = {}
    updates: dict[torch.fx.Node, list[torch.fx.Node]] = {}     # an updated tensor: its updates, in order
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function":
            return None
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            body = _region_body(node) if target is _GRAD_MODE_REGION else None
            body_plan = _plan(body.graph, registry) if body is not None else None
            if body_plan is None:
                return None
            plan[node] = body_plan
            continue
        if not isinstance(target, torch._ops.OpOverload):
            continue                                    # getitem, arithmetic of symbolic sizes
        if target in _ASSERTIONS:
            continue
        name = target.name()
        if target._schema.is_mutable:
            replacement = _out_of_place(target)
            if replacement is None or not _same_types(node) or not registry.is_registered(replacement):
                return None
            scatter = _scatter(node)
            if scatter is not None:
                if not registry.is_registered(scatter):
                    return None
                replacement = (replacement, scatter)
            plan[node] = replacement
            updates.setdefault(_updated(node, through_view=scatter is not None), []).append(node)
        elif name in _CONVERSIONS:
            replacement = _conversion(node)
            if replacement is False or (replacement is not None and not registry.is_registered(replacement)):
                return None
            plan[node] = replacement
        elif name in _SAME_ARGUMENTS:
            replacement = _overload(_SAME_ARGUMENTS[name])
            if replacement is None or not registry.is_registered(replacement):
                return None
            plan[node] = replacement
        elif name == "aten::adaptive_avg_pool2d" and not registry.is_registered(target):
            if not _global_pool(node) or not registry.is_registered(_aten.mean.dim):
                return None
            plan[node] = _aten.mean.dim
        elif not registry.is_registered(target):
            return None
    if updates:
        position = {node: index for index, node in enumerate(graph.nodes)}
        if not all(_private(tensor, tensor_updates, position, plan) for tensor, tensor_updates in updates.items()):
            return None
    return plan


def _region_body(node: torch.fx.Node) -> Any:
    """The graph module a grad-mode region runs, where the region is one to inline: its body
    read from the program's own attributes, its results read one by one (``getitem``)."""
    if len(node.args) < 2 or node.kwargs or not isinstance(node.args[1], torch.fx.Node) or node.args[1].op != "get_attr":
        return None
    owner = node.graph.owning_module
    body = getattr(owner, node.args[1].target, None) if owner is not None else None
    if not isinstance(body, torch.fx.GraphModule):
        return None
    if not all(user.target is operator.getitem and isinstance(user.args[1], int) for user in node.users):
        return None
    return body


def _overload(qualified: str) -> Any:
    packet_name, _, overload_name = qualified.partition(".")
    packet = getattr(_aten, packet_name, None)
    return getattr(packet, overload_name, None) if packet is not None else None


def _out_of_place(target: Any) -> Any:
    """The out-of-place form of an in-place operator that updates its first argument alone and
    returns it (``relu_`` -> ``relu``), or None."""
    schema = target._schema
    arguments = schema.arguments
    if not arguments or not _writes(arguments[0]) or any(_writes(argument) for argument in arguments[1:]):
        return None
    if len(schema.returns) != 1 or schema.returns[0].alias_info is None:
        return None
    namespace, _, name = schema.name.partition("::")
    if namespace != "aten" or not name.endswith("_") or name.startswith("_"):
        return None
    replacement = _overload(f"{name[:-1]}.{target._overloadname}")
    if replacement is None or replacement._schema.is_mutable:
        return None
    if [a.name for a in replacement._schema.arguments] != [a.name for a in arguments]:
        return None
    return replacement


def _same_types(node: torch.fx.Node) -> bool:
    """Whether the out-of-place form of the in-place ``node`` computes in the updated tensor's
    element type, as the update does: each other tensor is of that type or of a lower kind
    (bool below integers below floating point), and a Python number is of its kind or lower."""
    updated = _value(node.args[0])
    if updated is None or updated.is_complex():
        return False
    rank = _kind(updated.dtype)
    for argument in [*node.args[1:], *node.kwargs.values()]:
        if isinstance(argument, torch.fx.Node):
            value = _value(argument)
            if value is None or value.dtype != updated.dtype and _kind(value.dtype) >= rank:
                return False
        elif isinstance(argument, (bool, int, float)):
            if _kind(type(argument)) > rank:
                return False
        elif argument is not None:
            return False
    return True


def _kind(dtype: Any) -> int:
    """0 for bool, 1 for integers, 2 for floating point, 3 otherwise (complex)."""
    if dtype in (torch.bool, bool):
        return 0
    if dtype is int or isinstance(dtype, torch.dtype) and not dtype.is_floating_point and not dtype.is_complex:
        return 1
    if dtype is float or isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return 2
    return 3


def _writes(argument: Any) -> bool:
    return argument.alias_info is not None and argument.alias_info.is_write


def _aliases(target: Any) -> bool:
    """Whether the operator's results may be views of its arguments."""
    return any(value.alias_info is not None for value in target._schema.returns)


def _scatter(node: torch.fx.Node) -> Any:
    """For an in-place ``node`` that writes into a slice or an element of a tensor, through a
    view read by nothing else (``x[:, 1:] = y``, ``x[..., 0] = v``): the operator that writes
    the view's new values into a copy of the tensor (``slice_scatter``, ``select_scatter``), as
    the retrace's functionalization does; else None."""
    view = node.args[0]
    if not isinstance(view, torch.fx.Node) or node.users or view.op != "call_function" or len(view.users) != 1:
        return None
    return _SCATTERS.get(view.target)


def _updated(node: torch.fx.Node, through_view: bool) -> Any:
    """The tensor the in-place ``node`` updates: its first argument (or the tensor that argument
    views, for a write ``through_view``, see :func:`_scatter`), or the tensor that an update
    returning its first argument updated."""
    tensor = node.args[0]
    if through_view:
        tensor = tensor.args[0]
    while isinstance(tensor, torch.fx.Node) and tensor.op == "call_function" and \
            isinstance(tensor.target, torch._ops.OpOverload) and tensor.target._schema.is_mutable:
        tensor = tensor.args[0]
    return tensor


def _private(tensor: Any, tensor_updates: list[torch.fx.Node], position: dict[torch.fx.Node, int],
             plan: dict[torch.fx.Node, Any]) -> bool:
    """Whether the updates of ``tensor`` are of an intermediate result that nothing else sees:
    computed by an operator whose results are new tensors (not an input, parameter, buffer or
    constant, nor a view), and whose views, of it or of an update's result, are all taken after
    its last update."""
    if not isinstance(tensor, torch.fx.Node) or not _new_tensor(tensor, plan):
        return False
    last = max(position[update] for update in tensor_updates)
    written_views = {update.args[0] for update in tensor_updates if isinstance(plan[update], tuple)}
    for value in (tensor, *tensor_updates):
        for user in value.users:
            if user in tensor_updates or user in written_views or user.op == "output" or \
                    user.target is operator.getitem:
                continue
            if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
                return False
            if _aliases_argument(user, value) and position[user] < last:
                return False
    return True


def _aliases_argument(user: torch.fx.Node, value: torch.fx.Node) -> bool:
    """Whether ``user`` takes ``value`` where its schema aliases or writes it."""
    schema = user.target._schema
    for index, argument in enumerate(schema.arguments):
        given = user.args[index] if index < len(user.args) else user.kwargs.get(argument.name)
        taken = given is value or isinstance(given, (list, tuple)) and any(item is value for item in given)
        if taken and argument.alias_info is not None:
            return True
    return False


def _new_tensor(node: torch.fx.Node, plan: dict[torch.fx.Node, Any]) -> bool:
    """Whether ``node`` computes a tensor of its own (no view, no input), as ``plan`` rewrites it."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return False
    target = plan.get(node, node.target)
    return isinstance(target, torch._ops.OpOverload) and not _aliases(target) and not target._schema.is_mutable


def _conversion(node: torch.fx.Node) -> Any:
    """A ``Tensor.to``: None where it changes nothing (it is its input), ``_to_copy`` where it
    changes the element type, False otherwise (another device: the retrace)."""
    source = node.args[0]
    given, made = _value(source), _value(node)
    if given is None or made is None or given.device != made.device or given.layout != made.layout:
        return False
    if given.dtype == made.dtype:
        return None
    return _aten._to_copy.default


def _global_pool(node: torch.fx.Node) -> bool:
    """``adaptive_avg_pool2d`` to 1x1, which its composite implementation computes as a mean
    over the last two dimensions."""
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    return isinstance(size, (list, tuple)) and len(size) == 2 and all(
        isinstance(s, int) and s == 1 for s in size)


def _value(node: Any) -> Any:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


# -- the rewrite --------------------------------------------------------------------------------------

def _apply(graph: torch.fx.Graph, plan: dict[torch.fx.Node, Any]) -> dict[str, str]:
    """Rewrite the nodes of ``plan``; the names of the nodes replaced, to those of their
    replacements (the program's signature names its outputs)."""
    renamed: dict[str, str] = {}
    for node, replacement in list(plan.items()):
        if isinstance(replacement, dict):
            del plan[node]
            renamed.update(_inline(graph, node, replacement))
    position = {node: index for index, node in enumerate(graph.nodes)}
    for node, replacement in plan.items():
        source = node.args[0]
        if isinstance(replacement, tuple):
            # a write through a view: the view's new values, written into a copy of the tensor
            replacement, scatter = replacement
            view, source = source, source.args[0]
            written = _insert_before(node, replacement, node.args, node.kwargs, node.meta)
            result = _insert_before(node, scatter, (source, written, *view.args[1:]), view.kwargs, source.meta)
            _read_after(source, result, node, position)
        elif replacement is None:
            result = source
        else:
            if replacement is _aten._to_copy.default:
                args, kwargs = (source,), {"dtype": _value(node).dtype}
            elif replacement is _aten.mean.dim:
                args, kwargs = (source, [-1, -2], True), {}
            else:
                args, kwargs = node.args, node.kwargs
            result = _insert_before(node, replacement, args, kwargs, node.meta)
            if node.target._schema.is_mutable:
                # the update's result, read by the uses of the tensor that follow the update
                _read_after(source, result, node, position)
        position.setdefault(result, position[node])
        node.replace_all_uses_with(result)
        renamed[node.name] = result.name
        graph.erase_node(node)
    for old, new in list(renamed.items()):      # (a replacement replaced in its turn)
        while new in renamed:
            new = renamed[new]
        renamed[old] = new
    return renamed


def _insert_before(node: torch.fx.Node, target: Any, args: tuple, kwargs: dict, meta: dict) -> torch.fx.Node:
    """A call of ``target`` put before ``node``, with a copy of ``meta`` (its value's fake tensor
    and the rest, which type promotion and the translation read)."""
    with node.graph.inserting_before(node):
        made = node.graph.call_function(target, tuple(args), dict(kwargs))
    made.meta = dict(meta)
    return made


def _read_after(tensor: torch.fx.Node, updated: torch.fx.Node, update: torch.fx.Node,
                position: dict[torch.fx.Node, int]) -> None:
    """The uses of ``tensor`` that follow ``update`` read ``updated`` instead (nodes made by the
    rewrite, without a position, come before it)."""
    for user in [user for user in tensor.users if position.get(user, -1) > position[update]]:
        user.replace_input_with(tensor, updated)


def _inline(graph: torch.fx.Graph, region: torch.fx.Node, body_plan: dict[torch.fx.Node, Any]) -> dict[str, str]:
    """Put the operators of the grad-mode ``region`` (its body rewritten by ``body_plan``) in its
    place; the names of the reads of its results, to those of the values they read."""
    body = _region_body(region)
    _apply(body.graph, body_plan)
    placeholders = [node for node in body.graph.nodes if node.op == "placeholder"]
    with graph.inserting_before(region):
        results = graph.graph_copy(body.graph, dict(zip(placeholders, region.args[2:])))
    if not isinstance(results, (list, tuple)):
        results = (results,)
    renamed = {}
    for read in list(region.users):
        value = results[read.args[1]]
        read.replace_all_uses_with(value)
        renamed[read.name] = value.name
        graph.erase_node(read)
    attribute = region.args[1]
    graph.erase_node(region)
    if not attribute.users:
        graph.erase_node(attribute)
    return renamed
