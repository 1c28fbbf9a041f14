"""What a forward leaves behind when ORTModule traces it, outside its outputs.

ORTModule runs the wrapped forward's Python only to export it (on meta and fake tensors);
later calls run the graph. A forward, or a forward hook of one of its submodules, that keeps a
tensor it computes (``self.last = h``, ``features.append(out)`` in a hook) would keep a
placeholder of the export, never a call's value, and a forward that changes its own plain
state (``self.calls += 1``) changes it per export, not per call. :class:`Leftovers` notes
the modules' attributes before an export; :meth:`Leftovers.check` after it refuses the first
kind (naming where the placeholder was found) and warns of the second. A tensor attribute
the forward replaces (torch's hook-based ``weight_norm`` and ``spectral_norm`` compute the
weight anew before each use), a list of tensors whose items it replaces (an LSTM's
``_flat_weights``, which follow its parameters), or a dict it fills as a cache (LeViT's
attention biases in eval mode) gets its values from before the export back.
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module_base

from ortagent.errors import OrtNotImplemented

from ._state import MODULE_INTERNALS, NOT_PLAIN, plain_key

__all__ = ["Leftovers"]

_ITEMS_LOOKED_AT = 64        # of each container: a capture list's newest items are at its end
_VISITS = 4096               # values looked at under one attribute or hook variable
_DEPTH = 3                   # containers in containers (a dict of lists of tensors)
_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks")
_GLOBAL_HOOK_TABLES = ("_global_forward_pre_hooks", "_global_forward_hooks")


def _placeholder(value: Any) -> bool:
    """A tensor of a trace: fake (torch.export's) or on the meta device (the discovery run's)."""
    if not isinstance(value, torch.Tensor):
        return False
    from torch._subclasses.fake_tensor import is_fake

    return value.is_meta or is_fake(value)


def _found(value: Any, where: str, depth: int = 0, budget: list[int] | None = None) -> Iterator[str]:
    """The places (``where`` and the items' keys) under ``value`` that hold a placeholder."""
    budget = [_VISITS] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        return
    if _placeholder(value):
        yield where
        return
    if depth >= _DEPTH or isinstance(value, (torch.Tensor, nn.Module, str, bytes, type, types.ModuleType)):
        return
    if isinstance(value, dict):
        for key, item in list(value.items())[-_ITEMS_LOOKED_AT:]:
            yield from _found(item, f"{where}[{key!r}]", depth + 1, budget)
    elif isinstance(value, (list, tuple)):
        start = max(len(value) - _ITEMS_LOOKED_AT, 0)
        for index, item in enumerate(value[start:], start):
            yield from _found(item, f"{where}[{index}]", depth + 1, budget)
    elif isinstance(value, (set, frozenset)):
        for item in list(value)[:_ITEMS_LOOKED_AT]:
            yield from _found(item, f"{where} (a set)", depth + 1, budget)
    elif hasattr(value, "__dict__") and not callable(value):
        yield from _found(vars(value), where, depth + 1, budget)


def _hook_holders(hook: Any) -> Iterator[tuple[str, Any]]:
    """What a hook function can store into: its closure's cells, the object of a bound method,
    a partial's arguments, and the names of its module's globals it uses."""
    while isinstance(hook, functools.partial):
        yield from ((f"an argument of {hook.func!r}", arg) for arg in (*hook.args, *hook.keywords.values()))
        hook = hook.func
    owner = getattr(hook, "__self__", None)
    if owner is not None and not isinstance(owner, nn.Module):
        yield f"the {type(owner).__name__} of {hook.__qualname__}", owner
    function = getattr(hook, "__func__", hook)
    code = getattr(function, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:             # (an empty cell)
            continue
    scope = getattr(function, "__globals__", {})
    for name in code.co_names:
        if name in scope:
            yield name, scope[name]


class Leftovers:
    """The wrapped tree's attributes before an export, to check what the export left."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self._modules = tuple(modules)
        self._attributes = [{name: value for name, value in vars(module).items() if name not in MODULE_INTERNALS}
                            for module in self._modules]
        self._plain = [{name: plain_key(value) for name, value in attributes.items()}
                       for attributes in self._attributes]
        # (the items of the lists of tensors, say an LSTM's _flat_weights, which torch.export's
        # swaps of the parameters leave holding placeholders)
        self._lists = [{name: list(value) for name, value in attributes.items()
                        if isinstance(value, list) and value and all(isinstance(item, torch.Tensor) for item in value)}
                       for attributes in self._attributes]
        # (the entries of dicts, which a forward may fill as a cache: timm's LeViT keeps its
        # attention biases by device in eval mode)
        self._dicts = [{name: dict(value) for name, value in attributes.items() if type(value) is dict}
                       for attributes in self._attributes]

    def check(self, root: nn.Module) -> None:
        """Refuse placeholders kept by the forward of ``root`` or its hooks (the module
        attributes that held another value put back first, a new one removed), and warn of
        changed plain values."""
        names = {id(submodule): name for name, submodule in root.named_modules()}
        kept: list[str] = []
        changed: list[str] = []
        for module, before, plain, lists, dicts in zip(self._modules, self._attributes, self._plain, self._lists,
                                                       self._dicts):
            owner = names.get(id(module)) or type(module).__name__
            entries = vars(module)
            for name, value in list(entries.items()):
                if name in MODULE_INTERNALS:
                    continue
                places = list(_found(value, f"{owner}.{name}"))
                if places:
                    previous = before.get(name)
                    if value is not previous and isinstance(value, torch.Tensor) and \
                            isinstance(previous, torch.Tensor) and not _placeholder(previous):
                        # a tensor attribute the forward computes anew before reading it (torch's
                        # weight_norm / spectral_norm / prune hooks, a WeightDrop): its value
                        # before the export is put back
                        entries[name] = previous
                        continue
                    entries_before = dicts.get(name)
                    if entries_before is not None and value is previous:
                        # a dict the forward fills as a cache: its entries from before put back
                        # (the graph computes what an entry held; the next trace fills it again)
                        value.clear()
                        value.update(entries_before)
                        continue
                    items = lists.get(name)
                    if items is not None and isinstance(value, list) and len(value) == len(items) and \
                            not any(map(_placeholder, items)):
                        # a list of tensors whose items were replaced in place: put back
                        previous[:] = items
                        entries[name] = previous
                        continue
                    kept.extend(places)
                    if name not in before:
                        del entries[name]
                    elif value is not previous:
                        entries[name] = previous
                    continue
                old = plain.get(name, NOT_PLAIN)
                new = plain_key(value)
                if new is not NOT_PLAIN and old is not NOT_PLAIN and new != old:
                    changed.append(f"{owner}.{name}")
            for table in _HOOK_TABLES:
                for hook in list(vars(module)[table].values()):
                    for holder, value in _hook_holders(hook):
                        kept.extend(f"{place} (of a {table[1:-1].replace('_', ' ')} on {owner})"
                                    for place in _found(value, holder))
        for table in _GLOBAL_HOOK_TABLES:
            for hook in list((getattr(_module_base, table, None) or {}).values()):
                for holder, value in _hook_holders(hook):
                    kept.extend(f"{place} (of a global {table[8:-1].replace('_', ' ')})"
                                for place in _found(value, holder))
        if kept:
            shown = ", ".join(dict.fromkeys(kept[:6])) + (", ..." if len(kept) > 6 else "")
            raise OrtNotImplemented(
                f"ORTModule: the forward of {type(root).__name__} keeps tensors it computes outside its outputs "
                f"({shown}): ORTModule runs the forward's Python only to export it, and the graph's later runs do "
                "not repeat that, so these would hold placeholders of the export, never a call's values; return "
                "such tensors from the forward (a hook on the ORTModule itself sees its outputs), or run the "
                "module eagerly")
        if changed:
            warnings.warn(
                f"ORTModule: the forward of {type(root).__name__} changed {', '.join(changed[:6])} while it was "
                "exported: the graph's runs do not repeat the forward's Python, so such state changes per export, "
                "not per call (and each new value exports again)", RuntimeWarning, stacklevel=5)
