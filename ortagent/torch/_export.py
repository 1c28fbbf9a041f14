"""Export a module's forward to ONNX for the bridge: :func:`export` and its record,
:class:`ExportedGraph`.

The module runs as a function of ``(user tensors, parameters, buffers, random draws)``
(``torch.func.functional_call``), so parameters and buffers are named graph inputs, never
initializers, and tied weights appear once. An export at static shapes (``dynamic=False``)
serves the call's shapes alone. A dynamic one asks torch.export for symbolic
dimensions on every dimension of the user tensors and draws (``Dim.AUTO``): torch keeps a
dimension symbolic unless the forward pins it (a dimension matched against a weight, or of size
0 or 1), and :class:`ShapeGuard` records which dimensions are symbolic, which symbols are equal
and their ranges, so that one export serves every call whose shapes it accepts. Should torch
fail to export with symbolic dimensions, the export is repeated with the call's static shapes.

Before the export, one discovery run of the forward on meta tensors (or on copies, when some
operation has no meta kernel) finds the forward's random draws and its output structure, and
meets any refusal early; it runs again for each new input shape to find the draws' shapes
(:func:`discover`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from torch import nn

from ortagent._ad_rules import DOMAIN as STOP_GRADIENT_DOMAIN
from ortagent._graph_passes import ceil_mode_pool_outputs, mark_zeros_are_sizes, pools_at_onnxruntime_sizes
from ortagent.errors import OrtInvalidArgument, OrtNotImplemented

from . import _training_ir, _trees
from ._complex import decompose_complex
from ._registry import exporter_core, translation_registry, with_late_translations
from .translations import late_translations, translation_table
from .translations.linalg import without_error_checks
from ._rewrites import BatchStatistics, Layout, Site, Trace, check_all_true, default_generator, tracing

__all__ = ["OPSET", "IR_VERSION", "ShapeGuard", "ExportedGraph", "Discovery", "TraceFailure", "RejectedInput",
           "discover", "export", "same_draws", "inference_model", "STOP_GRADIENT_DOMAIN"]

#: the default-domain opset and IR version of exported graphs (onnxruntime 1.31 rejects IR 14)
OPSET = 18
IR_VERSION = 10

_RANDOM_OPS = {"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli",
               "Multinomial"}


# -- shapes -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShapeGuard:
    """Which input shapes an exported graph computes correctly.

    ``dims`` has one entry per user tensor: a tuple with, per dimension, its fixed size (int) or
    the name of its symbol (str); None for a tensor the graph does not read. ``ranges`` maps
    each symbol to its inclusive (lower, upper) bounds, upper None for unbounded."""

    dims: tuple[tuple[int | str, ...] | None, ...]
    ranges: tuple[tuple[str, int, int | None], ...]

    @property
    def symbolic(self) -> bool:
        return any(isinstance(d, str) for dims in self.dims if dims for d in dims)

    def accepts(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        values: dict[str, int] = {}
        for dims, shape in zip(self.dims, shapes):
            if dims is None:
                continue
            if len(dims) != len(shape):
                return False
            for dim, size in zip(dims, shape):
                if isinstance(dim, int):
                    if dim != size:
                        return False
                elif values.setdefault(dim, size) != size:
                    return False
        for symbol, lower, upper in self.ranges:
            size = values.get(symbol)
            if size is not None and (size < lower or (upper is not None and size > upper)):
                return False
        return True


def _guard(model: Any, input_names: list[str], n_user: int, range_constraints: dict) -> ShapeGuard:
    onnx_inputs = {value.name: value for value in model.graph.input}
    dims: list[tuple[int | str, ...] | None] = []
    for name in input_names[:n_user]:
        value = onnx_inputs.get(name)
        if value is None:
            dims.append(None)
            continue
        entry: list[int | str] = []
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                entry.append(int(dim.dim_value))
            elif dim.dim_param:
                entry.append(dim.dim_param)
            else:
                raise OrtNotImplemented(f"ORTModule: the exported graph's input '{name}' has a dimension of "
                                        "unknown size")
        dims.append(tuple(entry))
    ranges = []
    for symbol, bounds in range_constraints.items():
        ranges.append((str(symbol), _bound(bounds.lower, 0), _bound(bounds.upper, None)))
    return ShapeGuard(tuple(dims), tuple(sorted(ranges)))


def _bound(value: Any, unbounded: int | None) -> int | None:
    """A range bound as an int; infinite bounds (sympy's or torch's int_oo) as ``unbounded``."""
    if getattr(value, "is_finite", True) is False or getattr(value, "is_infinite", False):
        return unbounded
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return unbounded


# -- the record ------------------------------------------------------------------------------------------

class BakedTensor(NamedTuple):
    """A tensor an export baked into its graph: its version counter then, and, where it is a
    module's attribute, the module's ``__dict__`` and the attribute's name (else None)."""

    tensor: torch.Tensor
    version: int
    holder: dict | None
    name: str | None


def _baked_tensors(exported_program: Any, module: nn.Module) -> tuple[BakedTensor, ...]:
    """The tensors ``exported_program`` lifted as constants (torch.export's ``constants``: the
    very tensors the forward read, tensor attributes of ``module``'s submodules among them)."""
    lifted = [value for value in getattr(exported_program, "constants", {}).values()
              if isinstance(value, torch.Tensor)]
    if not lifted:
        return ()
    holders = {id(value): (entries, name) for entries in map(vars, module.modules())
               for name, value in entries.items() if isinstance(value, torch.Tensor)}
    return tuple(BakedTensor(tensor, tensor._version, *holders.get(id(tensor), (None, None))) for tensor in lifted)


@dataclass(frozen=True)
class ExportedGraph:
    """One export: the forward ONNX model and how the bridge feeds and reads it.

    Graph inputs, in order: the user tensors, the parameters and buffers (``state_names``), the
    draws (``n_draw_inputs``); ``used`` says which of these the graph reads (``input_names``
    lists those, in that order). Graph outputs: the module's ``n_outputs`` tensors, then the
    batch statistics (two per ``statistics`` entry: mean and unbiased variance), then the new
    values of in-place updated inputs (``mutated``: indices into the inputs above).
    ``counters`` names the BatchNorm batch counters the bridge adds 1 to after each run.
    ``sites`` are the draws as the export made them (their kinds and counts hold for every
    shape; their layouts for the export's shapes)."""

    model: Any
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    used: tuple[bool, ...]
    n_user: int
    state_names: tuple[str, ...]
    param_names: frozenset[str]
    n_draw_inputs: int
    sites: tuple[Site, ...]
    n_outputs: int
    statistics: tuple[BatchStatistics, ...]
    counters: tuple[str, ...]
    mutated: tuple[int, ...]
    guard: ShapeGuard

    detached_outputs: tuple[int, ...] = ()
    #: for each user input and state tensor (by input name), the outputs whose autograd graph
    #: held it when the forward ran: one torch takes no derivative through (``x > p``,
    #: ``p.detach()``) is in none, where the ONNX graph still shows a path
    autograd_reach: tuple[tuple[str, frozenset[int]], ...] | None = None
    #: the tensors the graph holds as constants: tensor attributes of the module (not parameters
    #: or buffers) and others the forward read, baked in at their values of the export
    constants: tuple[BakedTensor, ...] = ()
    #: the Python branches on tensor values the graph holds as the export took them, whose
    #: conditions it checks: ((file, line), outcome)
    checked_branches: tuple[tuple[tuple[str, int], bool], ...] = ()

    def constants_current(self) -> bool:
        """Whether every tensor the graph baked in is still what the forward would read: the
        same tensor, unchanged since (its version counter), where its module attribute still
        holds it."""
        return all(baked.tensor._version == baked.version
                   and (baked.holder is None or baked.holder.get(baked.name) is baked.tensor)
                   for baked in self.constants)

    @property
    def input_positions(self) -> tuple[int, ...]:
        """Where each graph input sits among the call's tensors (user tensors, state, draws)."""
        return tuple(index for index, used in enumerate(self.used) if used)

    @property
    def non_differentiable_outputs(self) -> list[int]:
        """Indices of the outputs that carry no gradient: cache tensors (``detached_outputs``),
        statistics and updated inputs."""
        return [*self.detached_outputs, *range(self.n_outputs, len(self.output_names))]


@dataclass(frozen=True)
class Discovery:
    """What a run of the forward at given input shapes showed: its draws, its output structure
    and the running statistics it updates."""

    sites: tuple[Site, ...]
    outputs: _trees.Flat
    statistics: tuple[BatchStatistics, ...]
    counters: tuple[str, ...]
    #: see :attr:`ExportedGraph.autograd_reach`
    autograd_reach: tuple[tuple[str, frozenset[int]], ...] = ()
    #: outputs that are a buffer of the module as it is (``return out, self.bn.running_mean``):
    #: (output index, position among the call's tensors and the state)
    buffer_outputs: tuple[tuple[int, int], ...] = ()
    #: the Python branches on tensor values the forward took (see :attr:`.Trace.decisions`)
    decisions: tuple[tuple[tuple[str, int], bool], ...] = ()
    #: the NumPy arrays the forward made tensors of (see :attr:`.Trace.host_constants`)
    host_constants: tuple[Any, ...] = ()


def same_draws(a: Sequence[Site], b: Sequence[Site]) -> bool:
    return [(s.kind, s.n_inputs, len(s.layouts)) for s in a] == [(s.kind, s.n_inputs, len(s.layouts)) for s in b]


# -- the traced function ------------------------------------------------------------------------------

def ambient_autocast() -> tuple[tuple[str, torch.dtype], ...]:
    """The ``torch.autocast`` regions the calling thread is in, as (device type, dtype) pairs:
    part of an export's key, and re-entered inside the traced forward, where torch.export
    records them (an autocast entered around ``torch.export`` itself is not recorded)."""
    return tuple((device, torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")
                 if torch.is_autocast_enabled(device))


class _Shared(list):
    """A list that copies of its holder share (torch.export runs the forward of a copy of the
    module it is given): what an export's trace hands back to the caller."""

    def __copy__(self) -> _Shared:
        return self

    def __deepcopy__(self, memo: dict) -> _Shared:
        return self


class _Functional(nn.Module):
    """The wrapped module as a function of (user tensors, parameters and buffers, draws)."""

    def __init__(self, module: nn.Module, inputs: _trees.Flat, state_names: Sequence[str], phase: str,
                 generator: Any = None, stand_in_device: Any = "meta", seen: Discovery | None = None) -> None:
        super().__init__()
        self.seen = seen            # (an export's: what the discovery saw of the values)
        self.checked_branches = _Shared()       # (the last run's: see Trace.checked_branches)
        self.generator = generator
        self.stand_in_device = stand_in_device
        self.target = [module]          # a list: not a submodule, so nothing of it is lifted
        self.inputs = inputs
        self.state_names = list(state_names)
        self.phase = phase
        self.trace: Trace | None = None
        self.outputs: _trees.Flat | None = None
        self.autocast = ambient_autocast()

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n_user, n_state = len(self.inputs.tensors), len(self.state_names)
        state = dict(zip(self.state_names, flat[n_user:n_user + n_state]))
        trace = Trace(self.phase, {id(tensor): name for name, tensor in state.items()},
                      frozenset(id(tensor) for tensor in flat[:n_user]), supplied=flat[n_user + n_state:],
                      generator=self.generator,
                      start_seed=None if self.generator is None else self.generator.initial_seed(),
                      stand_in_device=self.stand_in_device)
        if self.seen is not None:
            trace.decisions = list(self.seen.decisions)
            trace.host_constants = list(self.seen.host_constants)
        args, kwargs = self.inputs.rebuild(flat[:n_user])
        with _state_slots_kept(self.target[0]), tracing(trace), contextlib.ExitStack() as regions:
            for device, dtype in self.autocast:
                regions.enter_context(torch.autocast(device, dtype=dtype))
            result = torch.func.functional_call(self.target[0], state, tuple(args), dict(kwargs))
        self.trace = trace
        self.checked_branches[:] = trace.checked_branches
        self.outputs = with_checks(_trees.flatten(result, "the forward's result", caches=True), trace.checks)
        return (*self.outputs.tensors, *trace.statistic_values)


def with_checks(outputs: _trees.Flat, checks: Sequence[torch.Tensor]) -> _trees.Flat:
    """``outputs`` with the first that is a number tensor (not a cache's) passed through
    ``ortagent::check_all_true`` over the forward's ``torch._check_tensor_all`` conditions
    (torch.onnx would drop them) and those of its Python branches on tensor values: the graph's
    run fails where one is false, where eager raises or would take the other branch."""
    if not checks:
        return outputs
    tensors = list(outputs.tensors)
    index = next((i for i, t in enumerate(tensors) if i not in outputs.detached and t.dtype != torch.bool
                  and not t.is_complex()), None)
    if index is None:
        raise OrtNotImplemented("ORTModule: the forward checks a condition on tensor values "
                                "(torch._check_tensor_all, or a Python branch on a tensor's value) and returns "
                                "no number tensor that the exported graph could make its check on")
    condition = torch.stack(list(checks)).all() if len(checks) > 1 else checks[0]
    tensors[index] = check_all_true(tensors[index], condition)
    return replace(outputs, tensors=tuple(tensors))


@contextlib.contextmanager
def _state_slots_kept(root: nn.Module) -> Any:
    """Every module's parameters and buffers put back as they were after the block.
    ``functional_call`` swaps the call's tensors in by name and restores by name: a submodule
    registered under two names (CoaT's shared position encodings, a layer reused by several
    blocks) is swapped twice, the second time saving the first swap's tensor as the
    "original", and the restore left that one in the module: the model kept the trace's fake
    tensors as its parameters, and its real ones got no gradient."""
    saved = [(module, dict(module._parameters), dict(module._buffers)) for module in root.modules()]
    try:
        yield
    finally:
        for module, parameters, buffers in saved:
            module._parameters.update(parameters)
            module._buffers.update(buffers)


def _traced(tensor: torch.Tensor, graded: bool, kind: str = "export") -> torch.Tensor:
    """The tensor a trace runs with: detached (on the meta device for a discovery's first try,
    a copy for its second, itself for the export). A floating-point user input or parameter
    requires grad, whatever the original's setting: results that still have no autograd history
    are then the ones torch never differentiates (detach, no_grad), which the trace cuts from
    the gradient, and one export serves every choice of which tensors require grad."""
    if kind == "meta":
        copy = tensor.detach().to("meta")
    elif kind == "copy":
        copy = tensor.detach().clone()
    else:
        copy = tensor.detach()
    if graded and tensor.is_floating_point():
        copy = copy.requires_grad_(True)
    return copy


def _graded(inputs: _trees.Flat, state: dict[str, torch.Tensor], param_names: set[str], all_graded: bool) -> list[bool]:
    """Which traced tensors require grad: every user input and parameter (``all_graded``), or
    those that do in this call (for a forward that refuses inputs requiring grad where it
    does not differentiate, e.g. BatchNorm's running buffers passed as arguments)."""
    if all_graded:
        return [True] * len(inputs.tensors) + [name in param_names for name in state]
    return [t.requires_grad for t in inputs.tensors] + [t.requires_grad and name in param_names
                                                        for name, t in state.items()]


class TraceFailure(OrtNotImplemented):
    """The forward raised (not an ortagent refusal) while the bridge traced it."""


class RejectedInput(TraceFailure, OrtInvalidArgument):
    """The forward raised ValueError on the call's own values while the bridge ran it on copies
    of them (as eager raises on them: an image token count that does not match the images'):
    a ValueError to the caller, and a TraceFailure to ORTModule's retry."""

    default_code = OrtInvalidArgument.default_code


@contextlib.contextmanager
def collector_paused() -> Any:
    """Keep Python's garbage collector out of the block: the objects alive when it starts are
    frozen (``gc.freeze``, ``gc.unfreeze`` at the end) and automatic collections are off
    (``gc.disable``, ``gc.enable`` at the end). An export allocates enough objects (FX graphs,
    fake tensors, the ONNX IR) to set off hundreds of collections. Two of them were full ones
    that walked every object of the process -- torch's, transformers', the model's, ~450k of
    them -- to find the few hundred the export left as garbage (0.38-0.47 s of ResNet-18's
    first call on this project's test machine, 0.05-0.07 s with the objects frozen). And the
    export's temporaries that were alive at a middle-generation collection moved to the oldest
    generation and counted towards the next full collection, which then came in the middle of
    training: ~280 steps into ``make demo-torch``, 140-180 ms in one step, 5-7% of the bridge's
    300 steps; with the collector paused it does not come in 1200. The garbage the export
    leaves is collected by the first collection after it. Where the collector is disabled or
    the process froze objects of its own (a server about to fork), nothing is touched:
    unfreezing would release theirs. The switch is the process's, as the collector is: another
    thread's allocations meet no collection while an export runs either."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


class _UnbackedNoise(logging.Filter):
    """Drops torch.export's warning, in the exporting thread, that it found no user code for
    the unknown value of a branch the trace decided (see :meth:`._rewrites._TraceMode._branch`)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread or not str(record.msg).startswith("Unable to find user code")


@contextlib.contextmanager
def _unbacked_noise_dropped() -> Any:
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    noise = _UnbackedNoise()
    logger.addFilter(noise)
    try:
        yield
    finally:
        logger.removeFilter(noise)


@contextlib.contextmanager
def _generator_kept(generator: Any) -> Any:
    """A trace runs the forward's own seeding (``torch.manual_seed`` in the forward) for real:
    put the generator back as it was when the forward changed its seed. A forward that leaves
    it changed is refused: the bridge draws before the run, and eager's generator would differ
    afterwards."""
    seed, state = generator.initial_seed(), generator.get_state()
    try:
        yield
    finally:
        changed = generator.initial_seed() != seed
        if changed:
            generator.set_state(state)
    if changed:
        raise OrtNotImplemented("ORTModule: the forward seeds torch's random generator (torch.manual_seed) and "
                                "leaves it changed; the bridge draws before the run and cannot leave the "
                                "generator as eager would")


def discover(module: nn.Module, inputs: _trees.Flat, state: dict[str, torch.Tensor],
             device: torch.device, all_graded: bool = True) -> Discovery:
    """Run the forward once, outside any export, to learn its draws and output structure and to
    meet a refusal early. Tries meta tensors first (nothing computed, nothing touched), then
    copies of the real tensors (in-place updates in the forward touch nothing of the caller's)."""
    _refuse_backward_hooks(module)
    flat = [*inputs.tensors, *state.values()]
    param_names = {name for name, _ in module.named_parameters()}
    graded = _graded(inputs, state, param_names, all_graded)
    generator = default_generator(device)
    # (autocast casts only tensors of its own device type: under it, meta tensors would give
    # the outputs the wrong dtype)
    for kind in ("meta", "copy") if not ambient_autocast() else ("copy",):
        functional = _Functional(module, inputs, list(state), "discover", generator,
                                 stand_in_device="meta" if kind == "meta" else device)
        leaves = [_traced(tensor, grad, kind) for tensor, grad in zip(flat, graded)]
        try:
            with _generator_kept(generator), torch.enable_grad():
                functional(*leaves)
        except (OrtNotImplemented, OrtInvalidArgument):
            raise
        except Exception as exc:
            if kind == "copy":
                failure = RejectedInput if isinstance(exc, ValueError) else TraceFailure
                raise failure(f"ORTModule: the forward of {type(module).__name__} fails when the bridge "
                              f"traces it: {type(exc).__name__}: {exc}") from exc
            continue
        assert functional.trace is not None and functional.outputs is not None
        trace = functional.trace
        if kind == "meta" and any(len(layout.shape) >= 4 for site in trace.sites for layout in site.layouts):
            # a draw fills its tensor in memory order, and torch's meta kernels can predict
            # another layout than its CPU kernels give for images (a 1x1 convolution of a
            # channels-last input: contiguous on meta, channels-last from mkldnn; Segformer's
            # decode head): the draws' layouts come from a run on copies of the real tensors
            continue
        names = _input_names(len(inputs.tensors), state)
        reach = autograd_reach(functional.outputs.tensors, leaves)
        buffers = {id(leaf): position for position, (leaf, name) in enumerate(zip(leaves, names))
                   if position >= len(inputs.tensors) and name not in param_names}
        buffer_outputs = tuple((index, buffers[id(out)]) for index, out in enumerate(functional.outputs.tensors)
                               if id(out) in buffers)
        return Discovery(tuple(trace.sites), functional.outputs, tuple(trace.statistics), tuple(trace.counters),
                         tuple(zip(names, reach)), buffer_outputs, tuple(trace.decisions),
                         tuple(trace.host_constants))
    raise AssertionError("unreachable")


def _input_names(n_user: int, state: dict[str, torch.Tensor]) -> list[str]:
    """The graph's names of the call's tensors and the module's state, in order."""
    return [f"input_{i}" for i in range(n_user)] + list(state)


def autograd_reach(outputs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor]) -> list[frozenset[int]]:
    """For each of ``leaves``, the indices of the ``outputs`` whose autograd graph holds it:
    the tensors whose gradient torch leaves None when the loss reads only the other outputs.
    One walk over the graph, each node's leaves as a bit mask."""
    bits = {id(leaf): 1 << index for index, leaf in enumerate(leaves) if leaf.requires_grad}
    masks: dict[Any, int] = {}

    def mask_of(root: Any) -> int:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in masks:
                continue
            variable = getattr(node, "variable", None)         # an AccumulateGrad: a leaf
            if variable is not None:
                masks[node] = bits.get(id(variable), 0)
                continue
            following = [edge[0] for edge in node.next_functions if edge[0] is not None]
            if expanded:
                mask = 0
                for child in following:
                    mask |= masks[child]
                masks[node] = mask
                continue
            stack.append((node, True))
            stack.extend((child, False) for child in following if child not in masks)
        return masks[root]

    reached = [mask_of(out.grad_fn) if out.grad_fn is not None else bits.get(id(out), 0) for out in outputs]
    return [frozenset(index for index, mask in enumerate(reached) if mask & bit)
            for bit in (1 << position for position in range(len(leaves)))]


def _refuse_backward_hooks(module: nn.Module) -> None:
    """Backward hooks of the wrapped module's submodules (or global ones) would never run:
    onnxruntime computes the backward. Refused, naming the first."""
    from torch.nn.modules import module as module_base

    if getattr(module_base, "_global_backward_hooks", None) or getattr(module_base, "_global_backward_pre_hooks", None):
        raise OrtNotImplemented("ORTModule: a global module backward hook is registered "
                                "(register_module_full_backward_hook); onnxruntime's backward would not call it")
    for name, submodule in module.named_modules():
        if getattr(submodule, "_backward_hooks", None) or getattr(submodule, "_backward_pre_hooks", None):
            raise OrtNotImplemented(
                f"ORTModule: the submodule {name or type(module).__name__!r} has a backward hook "
                "(register_full_backward_hook or register_full_backward_pre_hook); onnxruntime's backward would not "
                "call it, so the gradient would not be the hook's. Remove it from the wrapped module, or hook the "
                "ORTModule itself")


# -- the export ----------------------------------------------------------------------------------------

def export(module: nn.Module, inputs: _trees.Flat, *, dynamic: bool = True, all_graded: bool = True,
           opset: int = OPSET, ir_version: int = IR_VERSION) -> tuple[ExportedGraph, Discovery]:
    """Export ``module(*args, **kwargs)`` (``inputs`` flattened) in its current training mode,
    with symbolic dimensions (``dynamic``) and tracing every input as requiring grad
    (``all_graded``; see :func:`_graded`). Python's garbage collector is kept out of it
    (:func:`collector_paused`)."""
    if importlib.util.find_spec("onnxscript") is None:
        raise OrtNotImplemented("ORTModule exports with torch.onnx.export(dynamo=True), which needs the "
                                "onnxscript package: pip install onnxscript (or ortagent[torch])")
    with collector_paused():
        return _export(module, inputs, dynamic, all_graded, opset, ir_version)


def _export(module: nn.Module, inputs: _trees.Flat, dynamic: bool, all_graded: bool, opset: int,
            ir_version: int) -> tuple[ExportedGraph, Discovery]:
    params = dict(module.named_parameters())
    state = {**params, **dict(module.named_buffers())}
    device = next((t.device for t in (*inputs.tensors, *state.values())), torch.device("cpu"))
    discovery = discover(module, inputs, state, device, all_graded)
    sites = discovery.sites
    draws = [layout.empty(device).fill_(1) for site in sites for layout in _site_layouts(site)]
    input_names = _input_names(len(inputs.tensors), state) + \
        [f"draw_{i}" for i in range(len(draws))]
    graded = _graded(inputs, state, set(params), all_graded)
    n_user = len(inputs.tensors)
    program = None
    failure: Exception | None = None
    for symbolic in ((True, False) if dynamic else (False,)):
        # (fresh aliases for each try: torch.export marks the tensors it traced with symbolic
        # dimensions, and a static retry on the same objects would trace them symbolic again)
        flat = [_traced(t, grad) for t, grad in zip([*inputs.tensors, *state.values()], graded)] + \
            [draw.detach() for draw in draws]
        functional = _Functional(module, inputs, list(state), "export", seen=discovery)
        dynamic_shapes = None
        if symbolic:
            auto = torch.export.Dim.AUTO
            dynamic_shapes = (tuple(
                {axis: auto for axis in range(t.dim())} if (i < n_user or i >= n_user + len(state)) and t.dim() else None
                for i, t in enumerate(flat)),)
        try:
            with _generator_kept(default_generator(device)), _unbacked_noise_dropped():
                program, exported_program = _torch_export(functional, flat, input_names, opset, dynamic_shapes)
            break
        except (OrtNotImplemented, OrtInvalidArgument):
            raise
        except Exception as exc:  # the exporter's own errors: try static shapes, then refuse
            failure = exc
    if program is None:
        assert failure is not None
        raise OrtNotImplemented(f"ORTModule: torch.onnx.export (dynamo) failed for {type(module).__name__}: "
                                f"{_exporter_failure(failure)}") from failure
    model = program.model_proto
    model.ir_version = ir_version
    mark_zeros_are_sizes(model)         # (torch's shapes hold sizes: a 0 is an empty dimension)
    _static_literals(model)
    pools_at_onnxruntime_sizes(model)
    _repair_declared_shapes(model)
    _check_exported(model, any(sub.training for sub in module.modules()))
    n_outputs = len(discovery.outputs.tensors)
    n_stats = 2 * len(discovery.statistics)
    if len(model.graph.output) != n_outputs + n_stats:
        raise OrtNotImplemented(f"ORTModule: the exported graph has {len(model.graph.output)} outputs, "
                                f"expected {n_outputs + n_stats}")
    mutated = _mutation_outputs(program, model, input_names, flat, set(params))
    onnx_inputs = {value.name for value in model.graph.input}
    exported = ExportedGraph(
        model=model,
        input_names=tuple(name for name in input_names if name in onnx_inputs),
        output_names=tuple(value.name for value in model.graph.output),
        used=tuple(name in onnx_inputs for name in input_names),
        n_user=n_user,
        state_names=tuple(state),
        param_names=frozenset(params),
        n_draw_inputs=len(draws),
        sites=tuple(sites),
        n_outputs=n_outputs,
        statistics=discovery.statistics,
        counters=discovery.counters,
        mutated=tuple(mutated),
        guard=_guard(model, input_names, n_user, dict(exported_program.range_constraints)),
        detached_outputs=discovery.outputs.detached,
        autograd_reach=discovery.autograd_reach,
        constants=_baked_tensors(exported_program, module),
        checked_branches=tuple(functional.checked_branches),
    )
    return exported, discovery


_FAILURE_LINES = 24


def _exporter_failure(failure: Exception) -> str:
    """The exporter's error in a few lines (some hold the whole traced graph: the chained
    exception keeps it), with what it means for a forward that decides on a tensor's value."""
    lines = str(failure).splitlines()
    text = "\n".join(lines[:_FAILURE_LINES])
    if len(lines) > _FAILURE_LINES:
        text += f"\n[... {len(lines) - _FAILURE_LINES} more lines: see the exception this one was raised from]"
    text = f"{type(failure).__name__}: {text}"
    if "GuardOnDataDependentSymNode" in text or "data-dependent" in text:
        text = ("the forward takes a Python decision on a tensor's value (Tensor.item(), bool(tensor), "
                "tolist(), a shape computed from values), which one exported graph cannot hold for every "
                "input; write it with tensor operations (torch.where, masks) or take the decision outside "
                "the ORTModule. " + text)
    return text


def _static_literals(model: Any) -> None:
    """Dimensions torch.export pinned to a size reach the ONNX graph as symbols named by that
    size ("784"): make them static (in place)."""
    from ortagent._onnx_graph import walk_graphs

    for graph in walk_graphs(model.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param.isdigit():
                    dim.dim_value = int(dim.dim_param)


def _repair_declared_shapes(model: Any) -> list[str]:
    """The shapes torch.onnx declares for the graph's values, checked against ONNX's own shape
    inference; a declaration of another rank, or another static size, than ONNX infers is
    replaced by ONNX's (in place), and the names of the values returned. The autodiff trusts
    the declarations: torch.onnx declared the unreduced NLL loss over a symbolic batch
    (``nll_loss(..., reduction="none")`` of ``[s0, C]``, inside ``cross_entropy`` too) a
    scalar, and the values computed from it likewise, so the gradients reaching the loss were
    summed to one number (a per-token loss weighted by a mask: input gradients 0.65 off
    torch's)."""
    import onnx

    graph = model.graph
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    # (ONNX infers the pools of ceil_mode=1 below opset 22 by the rule before torch's, which
    # onnxruntime's kernels follow at every opset: a last window starting in the padding is
    # dropped; the declared shapes of those are kept)
    kept = ceil_mode_pool_outputs(probe)
    retained = [value for value in probe.graph.value_info if value.name in kept]
    del probe.graph.value_info[:]
    probe.graph.value_info.extend(retained)
    for value in probe.graph.output:
        if value.name not in kept:
            value.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True).graph
    except Exception:
        return []
    found = {value.name: value.type.tensor_type for value in [*inferred.value_info, *inferred.output]
             if value.type.tensor_type.HasField("shape")}
    repaired = []
    for value in [*graph.value_info, *graph.output]:
        declared, onnx_says = value.type.tensor_type, found.get(value.name)
        if onnx_says is None or not declared.HasField("shape") or not _shapes_conflict(declared.shape, onnx_says.shape):
            continue
        declared.shape.CopyFrom(onnx_says.shape)
        repaired.append(value.name)
    return repaired


def _shapes_conflict(declared: Any, inferred: Any) -> bool:
    if len(declared.dim) != len(inferred.dim):
        return True
    return any(a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value != b.dim_value
               for a, b in zip(declared.dim, inferred.dim))


def _site_layouts(site: Site) -> list:
    """The layouts of a site's graph inputs (alpha dropout feeds a scale and a shift of one
    layout; a factory's value is made from its arguments)."""
    if site.kind == "factory":
        function, args, kwargs = site.params
        made = function(*args, **{**kwargs, "device": "meta"})
        return [Layout.of(made)]
    return [site.layouts[0]] * site.n_inputs


def _torch_export(functional: _Functional, flat: list[torch.Tensor], input_names: list[str], opset: int,
                  dynamic_shapes: Any) -> Any:
    """torch.export (non-strict: the forward runs as Python, so the rewrites apply), then the
    ONNX translation of that program. Exporting first ourselves keeps torch.export's own
    decisions: a dimension torch pins (matched against a weight) is static in the graph, and a
    free one keeps the range torch proved for it."""
    with warnings.catch_warnings(), torch.enable_grad(), without_error_checks():
        warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.onnx")
        exported_program = torch.export.export(functional, tuple(flat), dynamic_shapes=dynamic_shapes, strict=False)
        exported_program = decompose_complex(exported_program)
        program = _onnx_program(exported_program, input_names, opset)
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    return program, exported_program


def _onnx_program(exported_program: Any, input_names: list[str], opset: int) -> Any:
    """torch.onnx's translation of ``exported_program``, then onnxscript's optimizer in one
    round without its pattern rewrites (:func:`_optimize`), then the graph inputs named
    ``input_names`` (after the optimizer, as torch.onnx does: its pass that keeps a graph input
    from being a graph output renames the input).
    torch.onnx.export builds its table of translations (torchlib's, then ours) anew on every
    call, 0.4-0.7 s; the exporter's own entry point takes a table, so one built per process
    (:mod:`._registry`) serves every export. Where that entry point is not there as expected
    (another torch), the public call does the same work. torch.onnx would run the optimizer
    for two rounds (fold constants, rewrite, drop unused nodes): the second changed no
    operator of the benchmark models' training graphs but a few Identity nodes, which
    onnxruntime removes, and cost 0.03-0.16 s of each first call."""
    core = exporter_core()
    if core is None:
        program = torch.onnx.export(exported_program, (), dynamo=True, opset_version=opset, optimize=False,
                                    verbose=False, report=False, custom_translation_table=translation_table())
    else:
        registry = with_late_translations(translation_registry(opset, translation_table), late_translations)
        try:
            program = _training_ir.translate(exported_program, registry, opset)
        except Exception:       # (the program, rewritten or not, is still torch.onnx's to prepare)
            program = None
        if program is None:
            program = core.export(exported_program, registry=registry, opset_version=opset, optimize=False,
                                  verbose=False, report=False)
    if program is not None:
        _optimize(program.model)
        for value, name in zip(program.model.graph.inputs, input_names):
            value.name = name
    return program


def _optimize(model: Any) -> None:
    """onnxscript's optimizer on the translated ``model`` (onnx_ir, in place), one round and
    without its pattern rewrites: functions inlined, constants folded (with ONNX's shape
    inference), unused nodes, functions and opsets dropped, constants lifted to initializers,
    duplicate initializers and common subexpressions merged, names fixed. The rewrites (about 30
    rules, each tried on every node) took 0.09-0.25 s of each first export of the benchmark
    models and rewrote 0 to 34 nodes of each (a zero Conv bias dropped, Reshape and Unsqueeze
    pairs merged, a Flatten as a Reshape, a multiplication by one dropped), all of which the
    graph build's passes or onnxruntime's own optimizer do again: without them the seven models'
    losses and gradients came out bit-identical and their steps as fast (within 1%, interleaved
    in one process). Where onnxscript or onnx_ir lack a public name used here, onnxscript's whole
    optimizer runs instead."""
    try:
        import onnx_ir.passes.common as common
        from onnxscript.optimizer import fold_constants_ir
        passes = [common.RemoveUnusedNodesPass(), common.RemoveUnusedFunctionsPass(),
                  common.RemoveUnusedOpsetsPass(),
                  common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
                  common.LiftSubgraphInitializersToMainGraphPass(), common.DeduplicateInitializersPass(),
                  common.CommonSubexpressionEliminationPass(), common.OutputFixPass(), common.NameFixPass()]
        inline = common.InlinePass()
    except (ImportError, AttributeError, TypeError):
        import onnxscript.optimizer

        onnxscript.optimizer.optimize(model, num_iterations=1)
        return
    inline(model)
    fold_constants_ir(model, onnx_shape_inference=True)
    for step in passes:
        step(model)


_SAME_VALUE = {"aten::copy", "aten::clone", "aten::alias", "aten::detach", "aten::lift_fresh_copy"}


def _translated_name(graph: Any, name: str, produced: set[str]) -> str:
    """The ONNX value holding the FX value ``name``: itself, or where its node only copies a
    value (``copy(dst, src)`` of the same type, as torch.onnx writes ``buffer.copy_(src)``:
    torchlib returns ``src`` and no node makes ``name``), the value it copies."""
    nodes = {node.name: node for node in graph.nodes}
    for _ in range(8):
        node = nodes.get(name)
        if name in produced or node is None or not isinstance(node.target, torch._ops.OpOverload) \
                or node.target._schema.name not in _SAME_VALUE:
            return name
        source = node.args[1] if node.target._schema.name == "aten::copy" else node.args[0]
        meta, source_meta = node.meta.get("val"), getattr(source, "meta", {}).get("val")
        if not isinstance(source, torch.fx.Node) or not isinstance(meta, torch.Tensor) \
                or not isinstance(source_meta, torch.Tensor) or source_meta.dtype != meta.dtype \
                or source_meta.shape != meta.shape:
            return name
        name = source.name
    return name


def _mutation_outputs(program: Any, model: Any, input_names: list[str], flat: list[torch.Tensor],
                      param_names: set[str]) -> list[int]:
    """In-place updates of inputs or buffers (``self.count += 1``): torch.export turns them into
    extra results that the ONNX graph drops. Make each one a graph output (after the others) and
    return the flat indices of the updated inputs, in that order; the caller copies the new values
    back. Parameters updated in place, or other extra results, are refused."""
    from onnx import helper
    from torch.export.graph_signature import InputKind, OutputKind

    signature = program.exported_program.graph_signature
    placeholders = [spec.arg.name for spec in signature.input_specs if spec.kind == InputKind.USER_INPUT]
    graph = model.graph
    produced = {name for node in graph.node for name in node.output} | {value.name for value in graph.input}
    types = {value.name: value.type for value in graph.input}
    mutated = []
    for spec in signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            continue
        if spec.kind != OutputKind.USER_INPUT_MUTATION or spec.target not in placeholders:
            raise OrtNotImplemented(f"ORTModule: the exported program has a {spec.kind.name} result, "
                                    "which the bridge cannot apply")
        index = placeholders.index(spec.target)
        name = input_names[index]
        source = _translated_name(program.exported_program.graph, spec.arg.name, produced)
        if source not in produced or name not in types:
            raise OrtNotImplemented(f"ORTModule: the module updates '{name}' in place, and the exported "
                                    "graph lost the new value")
        if name in param_names:
            _updated_parameter_without_gradient(model, name, source)
        target = f"updated_{index}"
        graph.node.append(helper.make_node("Identity", [source], [target], name=f"ortagent_{target}"))
        value = graph.output.add()
        value.name = target
        value.type.CopyFrom(types[name])
        mutated.append(index)
    return mutated


def _updated_parameter_without_gradient(model: Any, parameter: str, updated: str) -> None:
    """A parameter the forward updates in place (``weight.data.clamp_(...)``, as Gemma 3n's
    AltUp coefficients; ``weight.mul_(s)`` under no_grad) is, for eager's autograd, the leaf
    with its new value: the gradient is taken at the new value, and not through the update.
    The nodes that read ``updated`` (the new value) read ``parameter + StopGradient(updated -
    parameter)`` instead: the same value (exactly, where the update kept an entry), whose
    derivative with respect to the parameter is the identity."""
    from onnx import helper

    graph = model.graph
    difference, stopped, value = (f"ortagent_{kind}_{parameter}".replace(".", "_")
                                  for kind in ("update", "update_stopped", "updated"))
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name == updated:
                node.input[position] = value
    for output in graph.output:             # (returned as it is: the returned value is the new one)
        if output.name == updated:
            graph.node.append(helper.make_node("Identity", [value], [updated + "_returned"]))
            output.name = updated + "_returned"
    added = [helper.make_node("Sub", [updated, parameter], [difference], name=difference),
             helper.make_node("StopGradient", [difference], [stopped], name=stopped, domain=STOP_GRADIENT_DOMAIN),
             helper.make_node("Add", [parameter, stopped], [value], name=value)]
    nodes = list(graph.node)
    after = next(index for index, node in enumerate(nodes) if updated in node.output) + 1
    nodes[after:after] = added              # (right after the update: before every node reading it)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(entry.domain == STOP_GRADIENT_DOMAIN for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(STOP_GRADIENT_DOMAIN, 1))


def _check_exported(model: Any, training: bool) -> None:
    """Refuse exported graphs whose training semantics would be wrong."""
    from ortagent._onnx_graph import walk_graphs

    for graph in walk_graphs(model.graph):
        for node in graph.node:
            if node.op_type in _RANDOM_OPS:
                raise OrtNotImplemented(f"ORTModule: the exported graph draws random numbers in node "
                                        f"'{node.name}' ({node.op_type}), from a random operation the bridge "
                                        "does not replay (one inside a torch function, or one whose "
                                        "distribution depends on tensor values)")
            if training and node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
                raise OrtNotImplemented(f"ORTModule: the exported graph has a Dropout node '{node.name}' "
                                        "with a training_mode input")
            if node.op_type == "BatchNormalization" and any(
                    attr.name == "training_mode" and attr.i for attr in node.attribute):
                raise OrtNotImplemented(f"ORTModule: the exported graph has a training-mode "
                                        f"BatchNormalization node '{node.name}'")


def inference_model(model: Any) -> Any:
    """The forward model as onnxruntime runs it: StopGradient markers become Identity, and a
    Softmax of scores masked with -inf is computed in parts (see
    :func:`ortagent._graph_passes.masked_softmax_in_parts`), as in the training graph."""
    import onnx

    from ortagent import _ad_rules
    from ortagent._graph_passes import (
        literal_zero_reshapes, masked_softmax_in_parts, products_over_empty_sums, vector_products_on_transposes,
        zeros_are_sizes,
    )

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _ad_rules.finish(copy)
    masked_softmax_in_parts(copy)
    vector_products_on_transposes(copy)     # (onnxruntime 1.31 computes A^T v wrong: see there)
    products_over_empty_sums(copy)          # (and products over an empty sum)
    if zeros_are_sizes(copy):
        literal_zero_reshapes(copy)
    return copy
