"""The Python state of a wrapped module that an export bakes in, as a key.

An export traces the forward once: every number, flag or string the forward reads from its
modules (``self.scale``, ``self.use_extra``, ``config.use_cache``, a drop rate) becomes a
constant of the graph. :class:`StateGuard` records where such values live, the plain
attributes of every submodule and of the plain objects they hold (``config``), and reads them
again on each call into a tuple that joins the export's key: a changed value selects (or
makes) another export, never a stale graph.

Plain values are ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
enums, ``torch.dtype`` / ``torch.device``, and tuples, lists, sets and dicts of them (lists
and dicts are read as tuples). Other values (tensors, modules, functions, objects) are not
part of the key: tensors are graph inputs, modules are walked, and the behaviour of functions
and arbitrary objects cannot be compared (README, "ORTModule", lists this).
"""

from __future__ import annotations

import copy
import enum
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as _module_base

__all__ = ["MODULE_INTERNALS", "NOT_PLAIN", "ModuleTree", "StateGuard", "StateKey", "call_key", "plain_key",
           "walk_module"]

_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, enum.Enum)
_MISSING = object()
_NESTED_DEPTH = 1          # plain objects held by modules (configs) are read one level deep


def _plain(value: Any) -> Any:
    """``value`` as a hashable key, or ``_MISSING`` when it is not plain."""
    if isinstance(value, (bool, int, float, complex)):
        return (type(value), value)          # 1, 1.0 and True are equal, but not the same constant
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_plain(item) for item in value]
        if any(item is _MISSING for item in items):
            return _MISSING
        if isinstance(value, (set, frozenset)):
            return (type(value).__name__, frozenset(items))
        return (type(value).__name__, tuple(items))
    if isinstance(value, dict):
        items = [(_plain(key), _plain(item)) for key, item in value.items()]
        if any(key is _MISSING or item is _MISSING for key, item in items):
            return _MISSING
        return ("dict", tuple(items))
    return _MISSING


#: what :func:`plain_key` gives a value that is not plain
NOT_PLAIN = _MISSING
plain_key = _plain


def _is_plain_object(value: Any) -> bool:
    """An object whose attributes a forward may read as settings (a config): not a module,
    tensor, function, class or module object."""
    if isinstance(value, (nn.Module, torch.Tensor, type)) or callable(value):
        return False
    return hasattr(value, "__dict__") and isinstance(vars(value), dict)


MODULE_INTERNALS = frozenset(vars(nn.Module()))      # nn.Module's own bookkeeping (hooks, training)
#: attributes of held objects that record the object's identity in this process, not a setting
#: a forward reads: transformers' GenerationConfig keeps ``hash(self)``, which differs from one
#: process to the next (str hashes are salted), so in the key it made every restarted job miss
#: the disk cache
_IDENTITY_ATTRIBUTES = frozenset({"_original_object_hash"})


class StateKey:
    """The plain values as a key: a tuple whose hash is computed once (a call hashes its
    export's key every time)."""

    __slots__ = ("values", "_hash")

    def __init__(self, values: tuple) -> None:
        self.values = values
        self._hash = hash(values)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateKey) and (self is other or self.values == other.values)

    def __repr__(self) -> str:
        return f"StateKey({self.values!r})"


class StateGuard:
    """Where the wrapped module's plain Python state lives, and its values as a key.

    Made once per module tree: the attributes holding plain values then are read on each call
    (an attribute added later, or one that held a tensor or object then, is not). A call reads
    the values with one ``itemgetter`` per holder and compares them with the last call's (a
    few microseconds for a transformer with its config); the key is rebuilt only on a change."""

    def __init__(self, module: nn.Module) -> None:
        places: dict[int, tuple[dict, list[str]]] = {}
        seen: set[int] = set()

        def visit(holder: Any, depth: int, internals: frozenset) -> None:
            if id(holder) in seen:
                return
            seen.add(id(holder))
            entries = vars(holder)
            for name, value in list(entries.items()):
                if name in internals:
                    continue
                if _plain(value) is not _MISSING:
                    places.setdefault(id(holder), (entries, []))[1].append(name)
                elif depth < _NESTED_DEPTH and _is_plain_object(value):
                    visit(value, depth + 1, _IDENTITY_ATTRIBUTES)

        for submodule in module.modules():
            visit(submodule, 0, MODULE_INTERNALS)
        self._readers = tuple((entries, names, operator.itemgetter(*names)) for entries, names in places.values())
        self._modules = tuple(module.modules())
        #: the classes of the tree's modules, in order: part of the export key (a submodule
        #: replaced by one of another class, say Tanh by ReLU, computes something else)
        self.structure = tuple(type(submodule) for submodule in self._modules)
        self._last: tuple[Any, StateKey] = (_MISSING, StateKey(()))

    def covers(self, modules: tuple[nn.Module, ...]) -> bool:
        """Whether the guard was made for this tree of modules (``ModuleTree.modules``): the same
        module objects in the same order, by identity (a module class may define ``__eq__``);
        ~1.5 µs for ResNet-18's 68 modules."""
        return len(modules) == len(self._modules) and all(map(operator.is_, modules, self._modules))

    def key(self) -> StateKey:
        """The values of the plain attributes, in the order they were found."""
        try:
            values = tuple([read(entries) for entries, _, read in self._readers])
        except KeyError:            # an attribute was deleted
            values = None
        last_values, last_key = self._last
        if values is not None and values == last_values:
            return last_key
        key = StateKey(tuple(_plain(entries.get(name, _MISSING)) for entries, names, _ in self._readers
                             for name in names))
        if values is not None:
            # a copy of the containers among the values, so that a change made in place shows
            self._last = (copy.deepcopy(values), key)
        return key


# -- the tree, walked once per call ------------------------------------------------------------------

class ModuleTree(NamedTuple):
    """One walk of a module tree: ``modules`` as ``module.modules()`` lists them, ``state`` the
    parameters then the buffers as ``named_parameters()`` and ``named_buffers()`` list them
    (each tensor once, ``None`` entries left out): the order of an export's ``state_names``."""

    modules: tuple[nn.Module, ...]
    state: list[torch.Tensor]


#: nn.Module's methods that decide the order of its modules, parameters and buffers
_WALK_METHODS = ("named_modules", "modules", "_named_members", "named_parameters", "named_buffers")
_walks_as_nn_module: dict[type, bool] = {}


def _standard_walk(cls: type) -> bool:
    """Whether ``cls`` lists its modules, parameters and buffers as nn.Module does (kept)."""
    standard = all(getattr(cls, name, None) is getattr(nn.Module, name) for name in _WALK_METHODS)
    _walks_as_nn_module[cls] = standard
    return standard


def walk_module(root: nn.Module) -> ModuleTree:
    """The tree of ``root`` in one pass over its ``_modules``, ``_parameters`` and ``_buffers``
    dictionaries: what ``modules()``, ``named_parameters()`` and ``named_buffers()`` give, in
    their order, at a fraction of their cost (a call of a transformer with 50 modules spent
    140 µs in those three; each call walks the tree, so a leaf module costs a few dictionary
    reads and no function call). A tree with a module class that walks its own way (one
    overriding ``named_modules`` or ``named_parameters``) is walked by those methods."""
    modules: list[nn.Module] = []
    seen: set[int] = set()
    standard = True
    pending = [root]            # (a stack, not a recursive closure: a closure that calls
    while pending:              # itself is a reference cycle, garbage for the collector each call)
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        modules.append(module)
        walks = _walks_as_nn_module.get(type(module))     # (read inline: a call per module costs)
        if walks is None:
            walks = _standard_walk(type(module))
        standard = walks and standard
        children = module._modules
        if children:
            pending.extend([child for child in reversed(children.values()) if child is not None])
    if not standard:
        return ModuleTree(tuple(root.modules()), [value for _, value in root.named_parameters()]
                          + [value for _, value in root.named_buffers()])
    parameters = [value for module in modules for value in module._parameters.values() if value is not None]
    buffers = [value for module in modules for value in module._buffers.values() if value is not None]
    return ModuleTree(tuple(modules), _each_once(parameters) + _each_once(buffers))


def call_key(modules: Sequence[nn.Module]) -> tuple:
    """What decides the code a call of each of ``modules`` (a :class:`ModuleTree`'s, by
    position) runs besides its class, as a key: for each module that has any, its own
    ``forward`` (one assigned to the instance, as libraries that wrap a module's forward do)
    and the handle ids of its forward pre, forward, backward pre and backward hooks; and the
    same of torch's global module hooks. An export runs the forward hooks there were and bakes
    what they did to the values into its graph, and refuses backward hooks; a hook registered
    or removed since (a new handle id, or one gone), or a forward assigned, makes the key
    another, so the next call exports again rather than run a graph with a hook's effect the
    module no longer has, or without one it has. A call reads five dictionary entries per
    module (ResNet-18's 68 modules: ~14 µs, three times the `training` flags' read)."""
    called = [(index, entries.get("forward"), tuple(entries["_forward_pre_hooks"]), tuple(entries["_forward_hooks"]),
               tuple(entries["_backward_pre_hooks"]), tuple(entries["_backward_hooks"]))
              for index, entries in enumerate(map(vars, modules))
              if "forward" in entries or entries["_forward_pre_hooks"] or entries["_forward_hooks"]
              or entries["_backward_pre_hooks"] or entries["_backward_hooks"]]
    tables = [getattr(_module_base, name, None) for name in _GLOBAL_HOOK_TABLES]
    if any(tables):
        called.append((-1, None, *(tuple(table or ()) for table in tables)))
    return tuple(called)


_GLOBAL_HOOK_TABLES = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                       "_global_backward_hooks")


def _each_once(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """``values`` without repeats, each at its first place (named_parameters and named_buffers
    each drop a tensor held twice, a tied weight)."""
    unique = {id(value): value for value in values}     # (a repeat keeps the first key's place)
    return values if len(unique) == len(values) else list(unique.values())
