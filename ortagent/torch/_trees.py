"""The arguments and results of an :class:`~ortagent.torch.ORTModule` call as flat tensor lists.

torch's pytree does the flattening, so every container it knows keeps its type on the way out:
tuples, lists, dicts, ``OrderedDict``, namedtuples, ``torch.return_types`` structs and the
containers libraries register with it (transformers' ``ModelOutput`` subclasses and caches).
A non-tensor leaf is a constant of the call: it is part of the call's signature (inputs) or of
the exported graph's layout (outputs).

Results may also hold key/value caches that torch's pytree does not know: transformers'
``DynamicCache`` and ``EncoderDecoderCache`` (what its models return with ``use_cache=True``,
their default) come back as caches of the same type over the graph's key and value tensors,
detached: the bridge gives them no gradient (a training loop does not backpropagate through a
cache it was returned). A sliding-window layer (Mistral's default cache) also returns, from
the graph, the count of tokens it has seen, which its windowed keys no longer tell.

A complex tensor (complex64, complex128) in a result crosses as its real view: torch.onnx's
exporter writes a complex value as a real one with a trailing axis of 2 (real, imaginary), so the
graph returns ``torch.view_as_real`` of what the forward returns, and :func:`complex_results`
views it back as complex. The gradient torch hands back for the complex result then reaches
the graph's backward as the real view of that gradient (``torch.view_as_complex``'s own
backward), which, with torch's convention ``dL/dRe + i dL/dIm`` for a real loss ``L``, is the
gradient of the real view. Complex arguments, and complex32 (``chalf``) results, are refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

from ortagent.errors import OrtNotImplemented

# non-tensor leaves that are plain values: they take part in a signature by equality
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                   torch.layout, torch.memory_format, enum.Enum, type(Ellipsis), slice)


class _Cache:
    """A cache object of a result, as a pytree node of its tensors (ortagent's own class: the
    registration changes nothing for anyone else's pytrees). ``context`` is what rebuilds it."""

    def __init__(self, kind: str, tensors: list[torch.Tensor], context: Any) -> None:
        self.kind = kind
        self.tensors = tensors
        self.context = context


pytree.register_pytree_node(
    _Cache, lambda cache: (cache.tensors, (cache.kind, cache.context)),
    lambda tensors, context: _Cache(context[0], list(tensors), context[1]))


def _dynamic_cache_tensors(cache: Any) -> tuple[list[torch.Tensor], Any]:
    """A DynamicCache's tensors, layer by layer, and a context naming each layer's kind:
    ``None`` for a full layer (keys, values), the window for a sliding-window layer (keys,
    values, and the count of tokens it has seen, an int64 scalar computed in the graph: its
    keys keep only the last ``window - 1`` of them), an :class:`_EmptyLayer` for a layer not
    written to (no tensors), a :class:`_LinearLayer` for a hybrid model's linear-attention
    layer."""
    layers = getattr(cache, "layers", None)
    if layers is None:                          # transformers 4.x: key_cache / value_cache lists
        pairs = list(zip(cache.key_cache, cache.value_cache))
        return [tensor for pair in pairs for tensor in pair], (None,) * len(pairs)
    tensors: list[torch.Tensor] = []
    kinds: list[Any] = []
    for layer in layers:
        kind = type(layer).__name__
        if kind in ("DynamicLayer", "DynamicSlidingWindowLayer") and not getattr(layer, "is_initialized", True):
            # a layer the forward wrote nothing to (AFMoE's cache made from its config):
            # rebuilt as one, of its kind
            kinds.append(_EmptyLayer(int(layer.sliding_window) if kind == "DynamicSlidingWindowLayer" else None))
        elif kind == "DynamicSlidingWindowLayer" and not getattr(layer, "record_past", False):
            seen = layer.cumulative_length
            tensors += [layer.keys, layer.values,
                        torch.full((), seen, dtype=torch.int64, device=layer.keys.device)]
            kinds.append(int(layer.sliding_window))
        elif kind == "DynamicLayer":
            tensors += [layer.keys, layer.values]
            kinds.append(None)
        elif kind in _LINEAR_LAYERS and not getattr(layer, "record_past", False):
            kinds.append(_linear_layer_tensors(layer, kind, tensors))
        else:
            raise OrtNotImplemented(f"ORTModule: a DynamicCache with {kind} layers is not returned by the bridge "
                                    "(DynamicLayer, DynamicSlidingWindowLayer and linear-attention caches are); a training step "
                                    "needs no cache: call the model with use_cache=False")
    return tensors, tuple(kinds)


#: the layers of hybrid models' caches (Qwen3.5, Qwen3-Next, Nemotron-H: a linear-attention
#: layer's convolution and recurrent states; Falcon-H1, Jamba: with a full-attention part)
_LINEAR_LAYERS = ("LinearAttentionLayer", "LinearAttentionAndFullAttentionLayer")
_STATE_FLAGS = {"conv_states": "is_conv_states_initialized", "recurrent_states": "is_recurrent_states_initialized"}


class _EmptyLayer(NamedTuple):
    """A cache layer the forward wrote nothing to: its window (None: a full layer)."""

    window: int | None

    tensor_count = 0


class _LinearLayer(NamedTuple):
    """A linear-attention cache layer: its class's name, number of states, the (attribute,
    index) of each state among its tensors, kernel sizes, previous-state flags, and whether
    the attention part's keys and values follow the states."""

    kind: str
    states_count: int
    states: tuple[tuple[str, int], ...]
    kernels: tuple
    previous: tuple
    attention: bool

    @property
    def tensor_count(self) -> int:
        return len(self.states) + 2 * self.attention


def _linear_layer_tensors(layer: Any, kind: str, tensors: list[torch.Tensor]) -> _LinearLayer:
    """Append a linear-attention layer's states (and its attention part's keys and values) to
    ``tensors``; return its context."""
    states = []
    for attribute in _STATE_FLAGS:
        for index, value in sorted(getattr(layer, attribute).items()):
            if isinstance(value, torch.Tensor):
                tensors.append(value)
                states.append((attribute, index))
    attention = kind == "LinearAttentionAndFullAttentionLayer" and bool(getattr(layer, "is_initialized", False))
    if attention:
        tensors += [layer.keys, layer.values]
    return _LinearLayer(kind, int(layer.number_of_states), tuple(states), tuple(sorted(layer.conv_kernel_size.items())),
                        tuple(sorted(layer.has_previous_state.items())), attention)


def _linear_layer(context: _LinearLayer, tensors: list[torch.Tensor]) -> Any:
    from transformers import cache_utils

    layer = getattr(cache_utils, context.kind)(number_of_states=context.states_count)
    for (attribute, index), value in zip(context.states, tensors):
        getattr(layer, attribute)[index] = value
        getattr(layer, _STATE_FLAGS[attribute])[index] = True
        if layer.device is None:
            layer.dtype, layer.device = value.dtype, value.device
    layer.conv_kernel_size.update(context.kernels)
    layer.has_previous_state.update(context.previous)
    if context.attention:
        keys, values = tensors[len(context.states):context.tensor_count]
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return layer


def _layer_tensor_count(window: Any) -> int:
    if isinstance(window, (_EmptyLayer, _LinearLayer)):
        return window.tensor_count
    return 2 if window is None else 3


def _cache_tensor_count(kinds: tuple) -> int:
    return sum(map(_layer_tensor_count, kinds))


def _dynamic_cache(tensors: list[torch.Tensor], kinds: tuple) -> Any:
    from transformers.cache_utils import DynamicCache

    entries, seen, linear, position = [], [], [], 0
    for window in kinds:
        if isinstance(window, _LinearLayer):
            # (an empty layer in its place, replaced below)
            linear.append((len(entries), _linear_layer(window, tensors[position:position + window.tensor_count])))
            entries.append((None, None))
            position += window.tensor_count
        elif isinstance(window, _EmptyLayer):
            entries.append((None, None) if window.window is None else (None, None, torch.tensor(window.window)))
        elif window is None:
            entries.append((tensors[position], tensors[position + 1]))
            position += 2
        else:
            entries.append((tensors[position], tensors[position + 1], torch.tensor(window)))
            seen.append((len(entries) - 1, int(tensors[position + 2])))
            position += 3
    cache = DynamicCache(entries) if entries else DynamicCache()
    for index, count in seen:           # (the window holds the last tokens; the count is of all of them)
        cache.layers[index].cumulative_length = count
    for index, layer in linear:
        cache.layers[index] = layer
    return cache


def _encoder_decoder_cache_tensors(cache: Any) -> tuple[list[torch.Tensor], Any]:
    own, own_kinds = _dynamic_cache_tensors(cache.self_attention_cache)
    cross, cross_kinds = _dynamic_cache_tensors(cache.cross_attention_cache)
    return own + cross, (own_kinds, cross_kinds)


def _encoder_decoder_cache(tensors: list[torch.Tensor], context: Any) -> Any:
    from transformers.cache_utils import EncoderDecoderCache

    own_kinds, cross_kinds = context
    split = _cache_tensor_count(own_kinds)
    return EncoderDecoderCache(_dynamic_cache(tensors[:split], own_kinds), _dynamic_cache(tensors[split:], cross_kinds))


# cache types by qualified name: (flatten to tensors and a context, rebuild)
_CACHE_TYPES = {
    "transformers.cache_utils.DynamicCache": (_dynamic_cache_tensors, _dynamic_cache),
    "transformers.cache_utils.EncoderDecoderCache": (_encoder_decoder_cache_tensors, _encoder_decoder_cache),
}


def _as_cache(leaf: Any) -> Any:
    kind = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
    entry = _CACHE_TYPES.get(kind)
    if entry is None:
        return leaf
    tensors, context = entry[0](leaf)
    return _Cache(kind, [t.detach() for t in tensors], context)


def _from_cache(node: Any) -> Any:
    if not isinstance(node, _Cache):
        return node
    return _CACHE_TYPES[node.kind][1](node.tensors, node.context)


@dataclass(frozen=True)
class Flat:
    """A flattened structure: its tensors in order, and what rebuilds it.

    ``spec`` is the pytree structure; ``constants`` holds every non-tensor leaf as
    ``(leaf position, value)``; ``tensor_positions`` the leaf position of each tensor;
    ``detached`` the indices (into ``tensors``) of cache tensors, which carry no gradient."""

    tensors: tuple[torch.Tensor, ...]
    spec: pytree.TreeSpec
    constants: tuple[tuple[int, Any], ...]
    tensor_positions: tuple[int, ...]
    detached: tuple[int, ...] = ()
    caches: bool = False            # whether cache objects were flattened (rebuilt as such)

    def rebuild(self, tensors: Any) -> Any:
        """The structure with ``tensors`` in the places of the flattened ones."""
        return rebuild(self.spec, self.constants, self.tensor_positions, tensors, self.caches)


def flatten(value: Any, what: str, caches: bool = False) -> Flat:
    """Flatten ``value``; a leaf that is neither a tensor nor a plain constant is refused.
    ``caches``: a result, whose cache objects are flattened too and whose complex tensors cross
    as real views."""
    detached_leaves: set[int] = set()
    found_caches = False
    if caches:
        value = pytree.tree_map(_as_cache, value)
        position = 0
        for node in pytree.tree_leaves(value, is_leaf=lambda x: isinstance(x, _Cache)):
            if isinstance(node, _Cache):
                found_caches = True
                detached_leaves.update(range(position, position + len(node.tensors)))
                position += len(node.tensors)
            else:
                position += 1
    leaves, spec = pytree.tree_flatten(value)
    tensors: list[torch.Tensor] = []
    positions: list[int] = []
    constants: list[tuple[int, Any]] = []
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            _check_tensor(leaf, what, result=caches)
            tensors.append(leaf)
            positions.append(position)
        elif isinstance(leaf, _CONSTANT_TYPES):
            constants.append((position, leaf))
        else:
            raise OrtNotImplemented(
                f"ORTModule: {what} holds a {type(leaf).__module__}.{type(leaf).__qualname__}, which is "
                "neither a tensor, a plain constant nor a container torch's pytree knows "
                "(register it with torch.utils._pytree.register_pytree_node)")
    detached = tuple(index for index, position in enumerate(positions) if position in detached_leaves)
    return Flat(tuple(tensors), spec, tuple(constants), tuple(positions), detached, found_caches)


#: torch's own tensor types: a call's arguments of these take the short way (a subclass may
#: flatten itself), and their DLPack export is torch's C function (a subclass may define
#: ``__dlpack__`` or ``__torch_function__`` of its own: it goes through ``Tensor.__dlpack__``)
_PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
#: the structures of calls whose arguments are all tensors, by (positional count, keyword names)
_TENSOR_CALL_SPECS: dict[tuple, tuple[pytree.TreeSpec, tuple[int, ...]]] = {}


def flatten_call(args: tuple, kwargs: dict) -> Flat:
    """``flatten((args, kwargs))`` of a call's arguments. Most calls pass tensors and nothing
    else (``model(x)``, ``model(input_ids=ids, labels=ids)``): their structure is the same
    for every call with the same number of positional arguments and the same keywords, so it
    is made once and kept, and the tensors are the leaves in order (torch's pytree lists a
    dict's values in its order), each checked as :func:`flatten` checks it."""
    tensors = (*args, *kwargs.values())
    if any(type(value) not in _PLAIN_TENSOR_TYPES for value in tensors):
        return flatten((tuple(args), dict(kwargs)), "the arguments")
    shape = (len(args), tuple(kwargs))
    known = _TENSOR_CALL_SPECS.get(shape)
    if known is None:
        flat = flatten((tuple(args), dict(kwargs)), "the arguments")
        if len(flat.tensors) == len(tensors) and all(a is b for a, b in zip(flat.tensors, tensors)):
            _TENSOR_CALL_SPECS[shape] = (flat.spec, flat.tensor_positions)
        return flat
    for tensor in tensors:
        _check_tensor(tensor, "the arguments")
    return Flat(tensors, known[0], (), known[1])


def _check_tensor(tensor: torch.Tensor, what: str, result: bool = False) -> None:
    """Tensors onnxruntime can hold: strided (dense), not quantized or nested, and complex only in
    a ``result`` (as its real view), complex32 excepted."""
    if tensor.layout != torch.strided or getattr(tensor, "is_nested", False):
        raise OrtNotImplemented(f"ORTModule: {what} holds a tensor of layout {tensor.layout}; only dense "
                                "(strided) tensors cross into onnxruntime")
    if tensor.is_quantized:
        raise OrtNotImplemented(f"ORTModule: {what} holds a {tensor.dtype} tensor; onnxruntime has no quantized "
                                "torch tensors")
    if tensor.is_complex():
        if not result:
            raise OrtNotImplemented(f"ORTModule: {what} holds a {tensor.dtype} tensor; complex tensors cross only "
                                    "as results (pass torch.view_as_real of the argument and view it as complex "
                                    "inside the forward)")
        if tensor.dtype not in _REAL_OF_COMPLEX:
            raise OrtNotImplemented(f"ORTModule: {what} holds a {tensor.dtype} tensor; complex results cross as "
                                    "real views of complex64 or complex128 only (onnxruntime has no complex32 "
                                    "kernels: return a complex64 result, or torch.view_as_real of it)")


# a complex dtype and the dtype of its real view
_REAL_OF_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def real_view_meta(tensor: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype with which the exported graph returns the result ``tensor``: its
    own, or for a complex one, its real view's (a trailing axis of 2)."""
    if tensor.is_complex():
        return (*tensor.shape, 2), _REAL_OF_COMPLEX[tensor.dtype]
    return tuple(tensor.shape), tensor.dtype


def complex_results(traced: tuple[torch.Tensor, ...], produced: list[torch.Tensor]) -> list[torch.Tensor]:
    """The graph's outputs ``produced`` as the forward returns them: where the traced result is
    complex, the output is its real view, which becomes the complex tensor (a view of it:
    torch's autograd hands the real view of the complex result's gradient back through it)."""
    results = list(produced)
    for index, want in enumerate(traced):
        if not want.is_complex():
            continue
        got = results[index]
        if got.dtype != _REAL_OF_COMPLEX[want.dtype] or got.dim() != want.dim() + 1 or got.shape[-1] != 2:
            raise OrtNotImplemented(f"ORTModule: the exported graph returns the complex result {index} as "
                                    f"{got.dtype} {tuple(got.shape)}, not as the real view of a {want.dtype} "
                                    "tensor (a trailing axis of 2)")
        if not got.is_contiguous():
            got = got.contiguous()
        results[index] = torch.view_as_complex(got)
    return results


def rebuild(spec: pytree.TreeSpec, constants: tuple[tuple[int, Any], ...], tensor_positions: tuple[int, ...],
            tensors: Any, caches: bool = True) -> Any:
    """The structure ``spec`` with its constants and ``tensors`` as leaves; ``caches``: whether
    it holds cache nodes, made into the caches they stand for."""
    if spec.is_leaf() and tensor_positions:
        return next(iter(tensors))              # (a forward that returns one tensor)
    leaves: list[Any] = [None] * spec.num_leaves
    for position, value in constants:
        leaves[position] = value
    for position, tensor in zip(tensor_positions, tensors):
        leaves[position] = tensor
    result = pytree.tree_unflatten(leaves, spec)
    if not caches:
        return result
    return pytree.tree_map(_from_cache, result, is_leaf=lambda node: isinstance(node, _Cache))


def signature_of(flat: Flat) -> tuple:
    """What decides whether an exported graph can serve a call, shapes aside: the structure,
    the constants (with their types: ``1`` and ``True`` are equal, but not the same argument),
    and each tensor's rank, dtype and device."""
    return (flat.spec, tuple((position, type(value), value) for position, value in flat.constants),
            tuple((tensor.dim(), tensor.dtype, tensor.device) for tensor in flat.tensors))
