""":class:`ORTModule`: a ``torch.nn.Module`` whose forward and backward run in onnxruntime."""

from __future__ import annotations

import inspect
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ortagent.errors import OrtError, OrtInvalidArgument, OrtInvalidType, OrtNotImplemented

from . import _trees
from ._bridge import GraphRunner, ORTFunction, SessionConfig
from ._cache import GraphStore, structure_key
from ._export import Discovery, ExportedGraph, TraceFailure, ambient_autocast, discover, export, same_draws
from ._rewrites import Site, draw_all
from ._leftovers import Leftovers
from ._state import ModuleTree, StateGuard, call_key, walk_module
from .translations.corrections import CHECK_FAILED_INDEX, CONDITION_FAILED_INDEX


__all__ = ["ORTModule"]

_INNER = "_original_module"
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_DEFAULT_MAX_GRAPHS = 8
_MANY_EXPORTS = 8               # warn once when a module has exported this many times
_SITE_SHAPES_KEPT = 16          # the draws' layouts remembered per export, by input shapes
# torch.export is not made to run in two threads at once: exports take turns (runs do not)
_EXPORT_LOCK = threading.RLock()


class FailedValueCheck(OrtInvalidArgument):
    """A check the exported graph makes on values (where eager raises on them) failed."""


def _kept(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _own_saved_tensor_hooks() -> Any:
    """Saved-tensor hooks that keep tensors as they are, around an export's own runs of the
    module (discovery, torch.export's trace): the caller's hooks then see only what the
    ORTModule's autograd node saves. A non-reentrant checkpoint around an ORTModule counts the
    tensors it packs, and recomputes the forward to unpack as many: an export inside it packed
    ten more than the recomputation (which exports nothing) and failed its check."""
    return torch.autograd.graph.saved_tensors_hooks(_kept, _kept)


@dataclass
class _Export:
    """An export, the runner of its sessions, and its draws' layouts by input shapes."""

    exported: ExportedGraph
    runner: GraphRunner
    outputs: _trees.Flat
    #: outputs that are a buffer as it is (:attr:`Discovery.buffer_outputs`): the buffer itself
    #: comes back, after the run's updates, as eager returns it
    buffer_outputs: tuple[tuple[int, int], ...] = ()
    sites: OrderedDict[tuple, tuple[Site, ...]] = field(default_factory=OrderedDict)
    checked: bool = False           # a first call ran (see ORTModule._call's check)
    _layout: _FeedLayout | None = None
    _owners: tuple[tuple[nn.Module, ...], tuple[nn.Module, ...]] | None = None

    @property
    def layout(self) -> _FeedLayout:
        if self._layout is None:
            self._layout = _FeedLayout.of(self.exported)
        return self._layout

    def statistics_owners(self, module: nn.Module, tree: ModuleTree) -> tuple[nn.Module, ...]:
        """The module holding each batch statistics entry's running buffers (``module`` itself
        for buffers of its own), looked up again whenever the tree's modules are not the last
        lookup's (a submodule replaced in place)."""
        if self._owners is None or self._owners[0] != tree.modules:
            owners = []
            for entry in self.exported.statistics:
                path = entry.running_mean.rpartition(".")[0]
                owners.append(module.get_submodule(path) if path else module)
            self._owners = (tree.modules, tuple(owners))
        return self._owners[1]


@dataclass(frozen=True)
class _FeedLayout:
    """Where one export's graph inputs and updated buffers sit in a call's tensors (the user
    tensors, then the module's state as :func:`walk_module` lists it, then the draws), worked
    out once per export: ``positions`` of the graph inputs; per graph input whether it is a
    parameter and whether a user tensor; the ``counters`` to add 1 to; per batch statistics
    entry the positions of its running mean, running variance and batch counter (or None)."""

    positions: tuple[int, ...]
    parameters: tuple[bool, ...]
    user_inputs: tuple[bool, ...]
    counters: tuple[int, ...]
    statistics: tuple[tuple[int, int, int | None], ...]

    @staticmethod
    def of(exported: ExportedGraph) -> _FeedLayout:
        n_user = exported.n_user
        state = {name: n_user + index for index, name in enumerate(exported.state_names)}
        n_user_fed = sum(exported.used[:n_user])
        return _FeedLayout(
            positions=exported.input_positions,
            parameters=tuple(name in exported.param_names for name in exported.input_names),
            user_inputs=tuple(index < n_user_fed for index in range(len(exported.input_names))),
            counters=tuple(state[name] for name in exported.counters),
            statistics=tuple((state[entry.running_mean], state[entry.running_var],
                              state[entry.num_batches_tracked] if entry.num_batches_tracked else None)
                             for entry in exported.statistics))


def _refuse_inner_wrappers(module: nn.Module) -> None:
    """An ORTModule inside the module to wrap cannot be traced through (its parameters live in
    the module it wraps): refused, naming where, rather than failing in torch's parameter swap."""
    pending = [("", module)]
    while pending:
        path, current = pending.pop()
        for name, child in current._modules.items():
            if child is None:
                continue
            where = f"{path}.{name}" if path else name
            if isinstance(child, ORTModule):
                raise OrtInvalidArgument(
                    f"ORTModule: {type(module).__name__} holds an ORTModule at {where!r}: wrap only the outermost "
                    "module (the inner one's forward becomes part of the outer graph), after putting the module "
                    "the inner ORTModule wraps (its .module) back in its place")
            pending.append((where, child))


def _check_outputs(traced: Sequence[torch.Tensor], produced: Sequence[torch.Tensor], name: str) -> None:
    """The first call's outputs have the shapes and dtypes the traced forward had at the same
    shapes (a complex result's: those of its real view): a translation that changed one would
    give other values too."""
    for index, (want, got) in enumerate(zip(traced, produced)):
        shape, dtype = _trees.real_view_meta(want)
        if shape != tuple(got.shape) or dtype != got.dtype:
            raise OrtNotImplemented(f"ORTModule: the graph exported for {name} returns output {index} as "
                                    f"{got.dtype} {tuple(got.shape)} where the forward returns {want.dtype} "
                                    f"{tuple(want.shape)}: torch's ONNX exporter translated it otherwise")


def _running_average(groups: dict[float, tuple[list[torch.Tensor], list[torch.Tensor]]]) -> None:
    """``running = running * (1 - factor) + batch * factor`` for each factor's lists, emptied."""
    with torch.no_grad():
        for factor, (running, batch) in groups.items():
            torch._foreach_mul_(running, 1 - factor)
            torch._foreach_add_(running, batch, alpha=factor)
    groups.clear()


def _input_name(exported: ExportedGraph, index: int) -> str:
    if index < exported.n_user:
        return f"the argument tensor {index}"
    return f"'{exported.state_names[index - exported.n_user]}'"


class _BoundForward:
    """``ORTModule.forward`` bound to one ORTModule: calls run through onnxruntime, and
    ``inspect.signature``, ``__doc__`` and ``__name__`` are the wrapped module's forward's (tools
    such as transformers' Trainer read the signature to choose a dataset's columns)."""

    __slots__ = ("__self__",)

    def __init__(self, owner: ORTModule) -> None:
        self.__self__ = owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__self__._forward(*args, **kwargs)

    @property
    def __wrapped__(self) -> Any:
        return self.__self__._original_module.forward

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.__self__._original_module.forward)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return self.__self__._original_module.forward.__doc__

    @property
    def __name__(self) -> str:
        return "forward"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BoundForward) and other.__self__ is self.__self__

    def __hash__(self) -> int:
        return hash(id(self.__self__))


class _ForwardDescriptor:
    def __get__(self, owner: ORTModule | None, cls: type | None = None) -> Any:
        if owner is None:
            return ORTModule._forward
        return _BoundForward(owner)


class ORTModule(nn.Module):
    """Run ``module``'s forward and backward in onnxruntime; see :mod:`ortagent.torch`.

    ``providers`` and ``session_options`` go to every session created (default: the CPU
    provider, or the CUDA provider on the inputs' CUDA device; :func:`ortagent.torch.default_session_options`,
    whose intra-op threads spin only during a run, where torch's idle OpenMP workers are let go
    before each long enough CPU run, or else sleep between nodes: threads spinning on after a
    run would take the CPUs torch's own threads need in the same step). ``max_graphs`` bounds the
    exports kept in memory (least recently used first out; each serves a family of input
    shapes). ``dynamic`` chooses which shapes an export serves, as ``torch.compile``'s
    argument does: None (default), the first export is specialised to the first call's
    shapes and the first call at other shapes exports again with every dimension symbolic,
    which then serves every shape; True, every export has symbolic dimensions from the first;
    False, every shape gets an export of its own. ``cache_dir`` (default: the environment variable ``ORTAGENT_TORCH_CACHE_DIR``,
    else no disk cache) keeps exported and built graphs on disk, so that a restarted job skips
    the export. ``cpu_kernels`` chooses whether the graphs compute the float32 gradients of
    LayerNorm, BatchNorm (its training-mode forward too), GELU, Softmax, Relu, HardSwish and
    HardSigmoid with ortagent's CPU training kernels, one operator each (README, "CPU training
    kernels"): None (default), wherever the sessions run on the CPU
    provider alone; False, never (standard ONNX operators); True, always (an error where the
    sessions do not run on the CPU provider alone). Parameters and buffers are the wrapped
    module's own, and ``state_dict`` / ``load_state_dict`` use its keys.
    """

    def __init__(self, module: nn.Module, *, providers: Sequence[Any] | None = None,
                 session_options: Any = None, max_graphs: int = _DEFAULT_MAX_GRAPHS,
                 cache_dir: str | os.PathLike | None = None, dynamic: bool | None = None,
                 cpu_kernels: bool | None = None) -> None:
        if not isinstance(module, nn.Module):
            raise OrtInvalidArgument(f"ORTModule wraps a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, ORTModule):
            raise OrtInvalidArgument("the module is an ORTModule already")
        _refuse_inner_wrappers(module)
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int):
            raise OrtInvalidType(f"max_graphs must be an int, got {type(max_graphs).__name__}")
        if max_graphs < 1:
            raise OrtInvalidArgument(f"max_graphs must be 1 or more, got {max_graphs}")
        if dynamic is not None and not isinstance(dynamic, bool):
            raise OrtInvalidType(f"dynamic must be True, False or None, got {type(dynamic).__name__}")
        if cpu_kernels is not None and not isinstance(cpu_kernels, bool):
            raise OrtInvalidType(f"cpu_kernels must be True, False or None, got {type(cpu_kernels).__name__}")
        super().__init__()
        self._original_module = module
        self.register_state_dict_post_hook(ORTModule._strip_prefix)
        self.register_load_state_dict_pre_hook(ORTModule._add_prefix)
        self._config = SessionConfig(providers, session_options, cpu_kernels)
        self._max_graphs = max_graphs
        self._dynamic = dynamic
        if cache_dir is None:
            cache_dir = os.environ.get("ORTAGENT_TORCH_CACHE_DIR") or None
        self._store = GraphStore(cache_dir) if cache_dir is not None else None
        self._exports: OrderedDict[tuple, list[_Export]] = OrderedDict()
        self._export_count = 0
        self._exact_grads = False
        # signatures whose symbolic export torch.export failed (their later shapes go static at once)
        self._static_signatures: set[tuple] = set()
        self._state_guard: StateGuard | None = None
        # the wrapped module's docstring (the forward's signature and docstring: _BoundForward)
        self.__doc__ = module.__doc__
        self._forwarding = True       # attribute writes not ORTModule's own reach the wrapped module

    @property
    def module(self) -> nn.Module:
        """The wrapped module."""
        return self._original_module

    # -- the module it wraps: attributes, names, signature -----------------------------------------

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules")
            inner = modules.get(_INNER) if modules is not None else None
            if inner is None:
                raise
            return getattr(inner, name)

    def _is_own(self, name: str) -> bool:
        return (not self.__dict__.get("_forwarding", False) or name in self.__dict__
                or hasattr(type(self), name) or name in self._modules)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._is_own(name):
            super().__setattr__(name, value)
        else:
            setattr(self._original_module, name, value)

    def __delattr__(self, name: str) -> None:
        if self._is_own(name):
            super().__delattr__(name)
        else:
            delattr(self._original_module, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._original_module)))

    def __repr__(self) -> str:
        return repr(self._original_module)

    def __getstate__(self) -> dict:
        """A copy (``copy.deepcopy``, an EMA model) or a pickle holds the wrapped module and
        the settings; it exports again on its first call (sessions are not copied)."""
        state = dict(self.__dict__)
        state["_exports"] = OrderedDict()
        state["_state_guard"] = None
        state["_export_count"] = 0
        return state

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Any:
        return self._original_module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Any:
        return self._original_module.named_buffers(prefix, recurse, remove_duplicate)

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True) -> Any:
        return self._original_module.named_modules(memo, prefix, remove_duplicate)

    # state_dict() and load_state_dict() use the wrapped module's keys (no "_original_module."),
    # also when this ORTModule sits inside another module
    @staticmethod
    def _strip_prefix(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        inner = prefix + _INNER + "."
        items = list(state_dict.items())
        state_dict.clear()
        for key, value in items:
            state_dict[prefix + key[len(inner):] if key.startswith(inner) else key] = value

    @staticmethod
    def _add_prefix(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
        inner = prefix + _INNER + "."
        items = list(state_dict.items())
        state_dict.clear()
        for key, value in items:
            if key.startswith(prefix) and not key.startswith(inner):
                key = inner + key[len(prefix):]
            state_dict[key] = value

    @property
    def exported_graphs(self) -> int:
        """How many exports this module made (each serves one family of input shapes)."""
        return self._export_count

    def _signature(self, flat: _trees.Flat, tree: ModuleTree) -> tuple:
        """The export key of a call; ``tree``: the wrapped module's tree, walked once per call
        (the number of its parameters and buffers is part of the key: one registered since
        the export would shift the graph inputs; so are its modules' classes and hooks: :func:`call_key`)."""
        module = self._original_module
        guard = self._state_guard
        if guard is None or not guard.covers(tree.modules):
            # (submodules added or replaced since the guard was made: their classes and plain
            # state join the key from this call on)
            guard = self._state_guard = StateGuard(module)
        key = (_trees.signature_of(flat), tuple(sub.training for sub in tree.modules), len(tree.state),
               guard.structure, guard.key(), ambient_autocast(), call_key(tree.modules))
        if self._exact_grads:
            key += (tuple(t.requires_grad for t in flat.tensors), tuple(p.requires_grad for p in module.parameters()))
        return key

    # -- finding or making the export for a call -------------------------------------------------

    def _export_for(self, flat: _trees.Flat, tree: ModuleTree) -> _Export:
        shapes = tuple(tuple(t.shape) for t in flat.tensors)
        with _EXPORT_LOCK:
            key = self._signature(flat, tree)
            entries = self._exports.get(key)
            if entries is not None:
                self._exports.move_to_end(key)
                for entry in list(entries):
                    if not entry.exported.constants_current():
                        # a tensor its graph baked in (a tensor attribute the forward reads) was
                        # updated or replaced since: the graph computes with the old values
                        # (dropped, not closed: see _evict)
                        entries.remove(entry)
                    elif entry.exported.guard.accepts(shapes):
                        return entry
            # (by default, symbolic once a second shape shows the shapes vary: an export with
            # symbolic dimensions traces several times slower than one at static shapes)
            dynamic = self._dynamic if self._dynamic is not None else bool(entries)
            dynamic = dynamic and key not in self._static_signatures
            try:
                entry = self._new_export(flat, key, dynamic=dynamic)
                if dynamic and not entry.exported.guard.symbolic:
                    self._static_signatures.add(key)
            except TraceFailure:
                if self._exact_grads:
                    raise
                # the forward refuses some input marked as requiring grad: from now on, trace
                # with each call's own requires_grad settings (and tell exports apart by them)
                kept = self._exports.copy()
                self._exact_grads = True
                self._exports.clear()
                key = self._signature(flat, tree)
                try:
                    entry = self._new_export(flat, key, dynamic=bool(self._dynamic))
                except TraceFailure:
                    # it fails either way (this call's input, say): the exports stay as they were
                    self._exact_grads = False
                    self._exports.clear()
                    self._exports.update(kept)
                    raise
            self._exports.setdefault(key, []).append(entry)
            self._evict()
            return entry

    def _export_again(self, flat: _trees.Flat, broken: _Export, dynamic: bool) -> _Export:
        """An export that onnxruntime cannot run: export this signature again, with the call's
        static shapes for one with symbolic dimensions (a translation that only holds for static
        shapes), with symbolic dimensions for one at static shapes."""
        with _EXPORT_LOCK:
            key = self._signature(flat, walk_module(self._original_module))
            entries = self._exports.get(key, [])
            if broken in entries:
                entries.remove(broken)
            entry = self._new_export(flat, key, dynamic=dynamic)
            self._exports.setdefault(key, []).append(entry)
            self._evict()
            return entry

    def _evict(self) -> None:
        """Forget the least recently used exports beyond ``max_graphs``. Exports dropped here
        (or for a changed baked tensor, a trace that needs exact requires_grad, a graph
        onnxruntime cannot run) are never closed: a forward already made on one may still run
        its backward, and its sessions go with the last autograd node holding its runner."""
        count = sum(len(entries) for entries in self._exports.values())
        while count > self._max_graphs:
            key = next(iter(self._exports))
            entries = self._exports[key]
            entries.pop(0)
            if not entries:
                del self._exports[key]
            count -= 1

    def _device(self, flat: _trees.Flat) -> torch.device:
        module = self._original_module
        devices = {t.device for t in flat.tensors} | {p.device for p in module.parameters()} | \
            {b.device for b in module.buffers()}
        if len(devices) > 1:
            raise OrtInvalidArgument(f"ORTModule: inputs, parameters and buffers are on several devices: {devices}")
        return devices.pop() if devices else torch.device("cpu")

    def _new_export(self, flat: _trees.Flat, key: tuple, dynamic: bool) -> _Export:
        module = self._original_module
        _refuse_inner_wrappers(module)              # (one may have been assigned since)
        device = self._device(flat)
        self._config.check_kernels(device)
        # (the disk cache's key names the modules' classes and their code, not hooks' or an
        # instance's own forward: a module with any exports without it)
        store = self._store if self._store is not None and not call_key(walk_module(module).modules) else None
        # (the export draws nothing from torch's generators: the draws made before each run
        # are then the ones eager would make from the same seed)
        store_key = structure_key(module, key, f"dynamic={dynamic}") if store is not None else ""
        found = store.find(store_key, [tuple(t.shape) for t in flat.tensors]) if store is not None else None
        leftovers = Leftovers(walk_module(module).modules)
        if found is not None:
            entry_folder, layout, model = found
            state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
            with _own_saved_tensor_hooks():
                discovery = discover(module, flat, state, device, not self._exact_grads)
            exported = replace(GraphStore.exported(layout, model, discovery.sites),
                               autograd_reach=discovery.autograd_reach)
            cache = entry_folder
        else:
            with _own_saved_tensor_hooks():
                exported, discovery = export(module, flat, dynamic=dynamic, all_graded=not self._exact_grads)
            # (a graph that baked tensors in is kept in memory only: another process's tensors
            # may hold other values under the same key)
            cache = store.store(store_key, exported) if store is not None and not exported.constants else None
        leftovers.check(module)
        self._export_count += 1
        if self._export_count == _MANY_EXPORTS:
            warnings.warn(f"ORTModule has exported {self._export_count} graphs for {type(module).__name__}: each "
                          "new input rank, dtype, device, non-tensor argument, training mode, plain attribute "
                          "value of the module (a number, flag or string its forward may read) or shape the "
                          "earlier exports do not accept exports anew", RuntimeWarning, stacklevel=4)
        runner = GraphRunner(exported, self._config, device, cache)
        entry = _Export(exported, runner, discovery.outputs, discovery.buffer_outputs)
        entry.sites[tuple(tuple(t.shape) for t in flat.tensors)] = discovery.sites
        return entry

    def _sites_for(self, entry: _Export, flat: _trees.Flat) -> tuple[Site, ...]:
        """The draws' layouts at this call's shapes (a discovery run on meta tensors for shapes
        not seen yet)."""
        if not entry.exported.n_draw_inputs:
            return ()
        shapes = tuple(tuple(t.shape) for t in flat.tensors)
        sites = entry.sites.get(shapes)
        if sites is not None:
            return sites
        module = self._original_module
        state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        device = self._device(flat)
        with _EXPORT_LOCK, _own_saved_tensor_hooks():
            leftovers = Leftovers(walk_module(module).modules)
            found: Discovery = discover(module, flat, state, device, not self._exact_grads)
            leftovers.check(module)
        if not same_draws(found.sites, entry.exported.sites):
            raise OrtInvalidArgument(f"ORTModule: at input shapes {list(shapes)} the forward of "
                                     f"{type(module).__name__} makes other random draws than at the shapes it "
                                     "was exported with; its random calls depend on the shapes in a way the "
                                     "export did not record")
        entry.sites[shapes] = found.sites
        while len(entry.sites) > _SITE_SHAPES_KEPT:
            entry.sites.popitem(last=False)
        return found.sites

    # -- the call ---------------------------------------------------------------------------------

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        flat = _trees.flatten_call(args, kwargs)
        self._check_autocast(flat)
        tree = walk_module(self._original_module)
        if any(isinstance(sub, nn.modules.lazy.LazyModuleMixin) for sub in tree.modules):
            self._materialize_lazy(args, kwargs, tree.modules)
            tree = walk_module(self._original_module)       # (the parameters just made)
        entry = self._export_for(flat, tree)
        if entry.checked:
            return self._call(entry, flat, tree)
        # the first call of an export: its training graph runs forward and backward once on its
        # own first; should onnxruntime fail to load or run what the export made, an export with
        # symbolic dimensions is made again with static ones and, by default, one at static
        # shapes with symbolic ones; failing again, it is refused
        try:
            result = self._call(entry, flat, tree, check=True)
        except FailedValueCheck:
            raise
        except OrtNotImplemented as exc:
            if "Could not find an implementation" not in str(exc):
                raise
            # onnxruntime's own words, with what they mean here
            dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in (*flat.tensors, *tree.state)
                             if t.is_floating_point()})
            raise OrtNotImplemented(
                f"ORTModule: onnxruntime's providers for {type(self._original_module).__name__} have no kernel for "
                f"a node of its graph at the element types it computes in ({', '.join(dtypes)}: float64 and "
                f"bfloat16 lack many on the CPU): {exc}") from exc
        except OrtError as exc:
            symbolic = entry.exported.guard.symbolic
            if not symbolic and self._dynamic is not None:
                raise self._cannot_run(exc) from exc
            entry = self._export_again(flat, entry, dynamic=not symbolic)
            try:
                result = self._call(entry, flat, tree, check=True)
            except OrtNotImplemented:
                raise
            except OrtError as static_exc:
                raise self._cannot_run(static_exc) from static_exc
        entry.checked = True
        return result

    forward = _ForwardDescriptor()

    def _materialize_lazy(self, args: tuple, kwargs: dict, modules: tuple[nn.Module, ...]) -> None:
        """``Lazy*`` modules (``nn.LazyLinear``, ...) infer their parameters' shapes on their
        first call: that call runs once in eager torch, without gradients, before the export.
        Buffers it updated (running statistics) and torch's CPU random generator are put back,
        so the step that follows is the one the export runs (the parameters are drawn from the
        generator as eager's first call draws them; a dropout mask of that first step then
        comes from the same state and differs from eager's, which follows the parameters')."""
        module = self._original_module
        lazies = [m for m in modules if isinstance(m, nn.modules.lazy.LazyModuleMixin)
                  and m.has_uninitialized_params()]
        if not lazies:
            return
        saved = [(b, b.detach().clone()) for b in module.buffers()
                 if not isinstance(b, nn.parameter.UninitializedBuffer)]

        def keep_materialized(lazy: nn.Module, _args: Any) -> None:
            # (runs after the lazy module's own hook has made its parameters and buffers)
            saved.extend((b, b.detach().clone()) for b in lazy.buffers(recurse=False))

        hooks = [lazy.register_forward_pre_hook(keep_materialized) for lazy in lazies]
        generator = torch.random.get_rng_state()
        try:
            with torch.no_grad():
                module(*args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
            torch.random.set_rng_state(generator)
            with torch.no_grad():
                for buffer, value in saved:
                    buffer.copy_(value)
        self._state_guard = None            # the materialized modules' state is read from now on

    def _check_autocast(self, flat: _trees.Flat) -> None:
        """torch.autocast around the forward is honoured (the export records its casts, see
        :func:`._export.ambient_autocast`), except where onnxruntime's provider lacks the kernels:
        bfloat16 on the CPU, refused naming autocast and the provider."""
        if not (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")):
            return                  # (the common case, without walking the parameters)
        device = self._device(flat)
        if not torch.is_autocast_enabled(device.type):
            return
        dtype = torch.get_autocast_dtype(device.type)
        if device.type == "cuda" or dtype == torch.float16:
            return
        raise OrtNotImplemented(
            f"ORTModule: torch.autocast('{device.type}', dtype={dtype}) around the forward of "
            f"{type(self._original_module).__name__} is not supported: onnxruntime's CPU provider lacks most "
            "bfloat16 kernels (MatMul, Gemm, Conv), so the graph autocast makes cannot run there. Use "
            "dtype=torch.float16 on the CPU, autocast on CUDA, or call the ORTModule outside autocast")

    def _cannot_run(self, exc: Exception) -> OrtNotImplemented:
        return OrtNotImplemented(f"ORTModule: onnxruntime cannot run the graph exported for "
                                 f"{type(self._original_module).__name__} ({type(exc).__name__}: {exc})")

    def _call(self, entry: _Export, flat: _trees.Flat, tree: ModuleTree, check: bool = False) -> Any:
        """Run one call through ``entry``; ``tree``: the wrapped module's, walked for this call.
        ``check``: the export's first call, whose training graph runs once forward and backward
        on its own first (an error there, unlike one in torch's backward later, can still be
        answered by another export or a refusal)."""
        module = self._original_module
        exported = entry.exported
        runner = entry.runner
        layout = entry.layout
        sites = self._sites_for(entry, flat)
        everything = [*flat.tensors, *tree.state]
        updated_parameters: list[tuple[int, torch.Tensor]] = []
        for index in exported.mutated:
            if index >= exported.n_user and exported.state_names[index - exported.n_user] in exported.param_names:
                # the graph reads the value before the update: a copy (whose gradient reaches the
                # parameter) keeps it while the parameter takes the new one after the run
                updated_parameters.append((index, everything[index]))
                everything[index] = everything[index].clone()
            elif everything[index].requires_grad:
                raise OrtNotImplemented(f"ORTModule: the forward updates {_input_name(exported, index)} in place, "
                                        "and it requires grad; in-place updates of tensors that require grad are "
                                        "not supported")
        if sites:
            everything += draw_all(sites, runner.device)
        feeds = [everything[position] for position in layout.positions]
        names = exported.input_names
        trainable = tuple(name for name, tensor, is_param in zip(names, feeds, layout.parameters)
                          if is_param and tensor.requires_grad)
        input_gradients = tuple(name for name, tensor, is_user in zip(names, feeds, layout.user_inputs)
                                if is_user and tensor.requires_grad and tensor.dtype in _FLOAT_DTYPES)
        try:
            if torch.is_grad_enabled() and (trainable or input_gradients):
                plan = runner.agent(trainable, input_gradients, feeds)
                if check:
                    runner.check(plan, feeds)
                outputs = ORTFunction.apply(runner, plan, *feeds)
            else:
                outputs = runner.run_inference(feeds)
        except OrtInvalidArgument as exc:
            if f"idx={CONDITION_FAILED_INDEX}" in str(exc):
                branches = "; ".join(f"{file}:{line} taken as {outcome}"
                                     for (file, line), outcome in exported.checked_branches)
                raise FailedValueCheck(
                    f"ORTModule: a condition the forward of {type(module).__name__} checks on values is "
                    "false for this input, where eager raises or takes another branch: torch._check_tensor_all "
                    "(transformers' torch_compilable_check that the image tokens match the image features), "
                    "ctc_loss's lengths and labels (input lengths at most the log probabilities' length, target "
                    "lengths within the targets, none negative, labels within the classes), or a Python branch "
                    "on a tensor's value, which the graph holds as the export took it (transformers' CTC heads: "
                    "`if labels.max() >= vocab_size: raise ValueError`); the graph's check stopped the run"
                    + (f". The branches this graph holds: {branches}" if branches else "")) from exc
            if f"idx={CHECK_FAILED_INDEX}" not in str(exc):
                raise
            raise FailedValueCheck(
                f"ORTModule: a value the forward of {type(module).__name__} requires to be non-negative has a "
                "negative entry (F.gaussian_nll_loss / nn.GaussianNLLLoss: var has negative entry/entries, "
                "where eager raises ValueError); the graph's check stopped the run") from exc
        n_out = exported.n_outputs
        n_stats = 2 * len(exported.statistics)
        if check:
            _check_outputs(entry.outputs.tensors, outputs[:n_out], type(module).__name__)
        if exported.mutated:
            for index, parameter in updated_parameters:
                everything[index] = parameter.data          # (as .data's update: no version bump)
            with torch.no_grad():
                for index, value in zip(exported.mutated, outputs[n_out + n_stats:]):
                    everything[index].copy_(value)
        if layout.counters:
            with torch.no_grad():
                torch._foreach_add_([everything[position] for position in layout.counters], 1)
        if n_stats:
            self._update_running_stats(entry, tree, everything, outputs[n_out:n_out + n_stats])
        results = _trees.complex_results(entry.outputs.tensors, outputs[:n_out])
        for index, position in entry.buffer_outputs:
            results[index] = everything[position]
        return entry.outputs.rebuild(results)

    def _update_running_stats(self, entry: _Export, tree: ModuleTree, everything: list[torch.Tensor],
                              stats: Sequence[torch.Tensor]) -> None:
        """torch's running-average rule on the buffers of each training-mode BatchNorm (after
        ``num_batches_tracked`` was counted): ``running = running * (1 - f) + batch * f``, one
        pair of foreach operations per distinct factor ``f``."""
        exported = entry.exported
        owners = entry.statistics_owners(self._original_module, tree)
        groups: dict[float, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        pending: set[int] = set()
        for index, (entry_stats, positions, owner) in enumerate(zip(exported.statistics, entry.layout.statistics,
                                                                    owners)):
            mean_position, var_position, counter_position = positions
            # a norm module's momentum is read now (a schedule may change it between steps)
            if isinstance(owner, nn.modules.batchnorm._BatchNorm):
                momentum = owner.momentum
            elif isinstance(owner, nn.modules.instancenorm._InstanceNorm):
                momentum = owner.momentum if owner.momentum is not None else 0.0
            else:
                momentum = entry_stats.momentum
            if momentum is None:
                counter = everything[counter_position] if counter_position is not None else None
                factor = 1.0 / float(counter) if counter is not None and float(counter) > 0 else 0.0
            else:
                factor = float(momentum)
            if mean_position in pending:
                _running_average(groups)        # a norm module run twice: its updates in turn
                pending.clear()
            pending.add(mean_position)
            running_mean, running_var = everything[mean_position], everything[var_position]
            mean, var = stats[2 * index], stats[2 * index + 1]
            if mean.dtype != running_mean.dtype or var.dtype != running_var.dtype:
                mean, var = mean.to(running_mean.dtype), var.to(running_var.dtype)
            running, batch = groups.setdefault(factor, ([], []))
            running += (running_mean, running_var)
            batch += (mean, var)
        _running_average(groups)
