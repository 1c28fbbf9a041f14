"""Training semantics decided before the export: what a traced forward runs in place of torch's
own kernels, and only in the thread that traces.

An export (and the discovery run before it) traces the wrapped module's forward inside
:func:`tracing`. While a trace is active in a thread:

* **random draws become graph inputs** ("sites"). Dropout in all its forms (``torch._VF``'s
  ``dropout``, ``feature_dropout``, ``alpha_dropout``, ``feature_alpha_dropout`` and their
  in-place forms, which every ``torch.nn.functional`` dropout and ``nn.Dropout*`` module
  reaches), dropout inside ``scaled_dot_product_attention``, and the primitive draws a forward
  makes itself (``Tensor.bernoulli_(p)`` into a fresh tensor, as timm's DropPath and
  torchvision's StochasticDepth do; ``uniform_``, ``normal_``, ``rand``, ``randn_like``, ...)
  are recorded in call order with their shapes, strides and dtypes. Before each forward the
  bridge replays the same draws with torch's generator (:func:`draw`), exactly as eager's CPU
  kernels make them, and feeds them to the graph: under ``torch.manual_seed`` a CPU run sees
  eager's values.
* **BatchNorm with batch statistics** (``F.batch_norm(training=True)``, hence ``nn.BatchNorm*``
  in training mode) is an explicit mean / variance computation with exact gradients; the batch
  statistics of a module's running buffers are extra outputs, and the bridge applies torch's
  running-average rule to the buffers after the run. Instance norms that track running
  statistics in training (``F.instance_norm`` with buffers) are normalized by torch's own
  function without the buffers, and their running averages are updated the same way.
* **What torch does not differentiate is cut from the gradient**: a floating-point result
  computed without autograd from values that require grad (``.detach()``, ``.data``, a
  ``torch.no_grad()`` block inside the forward) passes through :func:`stop_gradient`, which the
  exporter writes as ``ai.ortagent.ad:StopGradient`` and the autodiff treats as a constant.

The functions ``torch._VF`` and ``torch.nn.functional`` look up at call time are replaced for
as long as any thread traces, by wrappers that call torch's own function unless their thread is
tracing: other threads' eager modules run exactly as before, during an export too. The rest
(draws, cuts) goes through a :class:`~torch.overrides.TorchFunctionMode`, which is per thread by
construction.
"""

from __future__ import annotations

import inspect
import math
import random
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ortagent.errors import OrtInvalidArgument, OrtInvalidType, OrtNotImplemented

from ._losses import ctc_loss, gaussian_nll_loss, multilabel_margin_loss, smoothed_or_soft_cross_entropy
from ._strided import as_strided

__all__ = ["Layout", "Site", "Trace", "tracing", "draw", "draw_all", "stop_gradient", "batch_norm_training",
           "BatchStatistics", "default_generator"]


# -- what a traced forward records -----------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Shape, strides and dtype of a tensor the bridge creates before a run."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @staticmethod
    def of(tensor: torch.Tensor) -> Layout:
        return Layout(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)


@dataclass(frozen=True)
class Site:
    """One random draw of a traced forward: ``kind`` names the recipe (see :func:`draw`),
    ``layouts`` the tensors it needs, ``params`` its scalar arguments, ``n_inputs`` how many
    graph inputs it feeds. ``pinned`` is the generator's state when the forward had set it
    itself before the draw (``torch.manual_seed`` inside the forward, ``freeze_rng_state``),
    else None: the draw then takes the generator's next numbers."""

    kind: str
    layouts: tuple[Layout, ...]
    params: tuple[Any, ...]
    n_inputs: int = 1
    pinned: Any = None


@dataclass(frozen=True)
class BatchStatistics:
    """The running buffers a training-mode BatchNorm of the forward updates: the state names of
    ``running_mean``, ``running_var`` and ``num_batches_tracked`` (or None), and the momentum
    the call passed (a BatchNorm module's own ``momentum`` is read at each update instead)."""

    running_mean: str
    running_var: str
    num_batches_tracked: str | None
    momentum: float | None


@dataclass
class Trace:
    """What one traced run of the forward records or consumes.

    ``phase`` is ``"discover"`` (random draws run as themselves, their sites are recorded) or
    ``"export"`` (each site returns the next of ``supplied``, the graph inputs for the draws).
    ``state_names`` maps ``id()`` of the parameter and buffer tensors the trace runs with to
    their names; ``user_inputs`` holds the ``id()`` of the user tensors. A discovery watches
    ``generator`` (the default generator of the module's device): a site met while its seed is
    not ``start_seed`` is one the forward seeded itself. (The seed, not the whole state: other
    threads may draw from the generator meanwhile; a forward that seeds it with the seed it
    already has is not told apart.)"""

    phase: str
    state_names: dict[int, str]
    user_inputs: frozenset[int] = frozenset()
    supplied: Sequence[torch.Tensor] = ()
    generator: Any = None
    start_seed: int | None = None
    # the device of a discovery's stand-ins for factory draws: its tensors' (meta, or the
    # real device for a run on copies)
    stand_in_device: Any = "meta"
    sites: list[Site] = field(default_factory=list)
    statistics: list[BatchStatistics] = field(default_factory=list)
    statistic_values: list[torch.Tensor] = field(default_factory=list)
    counters: list[str] = field(default_factory=list)
    # the conditions an export's forward checks with torch._check_tensor_all, and those of the
    # Python branches it takes on tensor values (see _TraceMode)
    checks: list[torch.Tensor] = field(default_factory=list)
    # the Python branches on tensor values a discovery saw, in call order: (the forward's
    # line, the outcome); an export is given a discovery's and takes them in order (decide)
    decisions: list[tuple[tuple[str, int], bool]] = field(default_factory=list)
    next_decision: int = 0
    # the branches an export took on values it did not know, whose conditions the graph checks
    checked_branches: list[tuple[tuple[str, int], bool]] = field(default_factory=list)
    # the tensors the forward makes from NumPy arrays (torch.tensor(array), ...): a
    # discovery's copies of the arrays, which an export is given and compares its own with
    host_constants: list[Any] = field(default_factory=list)
    next_host_constant: int = 0
    # id -> tensor of the host draws' tensors (see _host_site), and whether one is being drawn
    host_draws: dict[int, torch.Tensor] = field(default_factory=dict)
    in_host_draw: bool = False
    next_supplied: int = 0
    # uniform draws of the forward (id -> (the tensor, its version then, low, high)) and the
    # comparisons of one with a number inside its range (id -> the result): see _decide
    uniform: dict[int, tuple[Any, int, float, float]] = field(default_factory=dict)
    random_choices: dict[int, Any] = field(default_factory=dict)
    # the trace's ``t.data`` values (id -> (the value, t)): an update of one updates t
    data_aliases: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def decide(self, line: tuple[str, int]) -> bool | None:
        """The outcome the discovery saw of the next branch on a tensor value made at ``line``
        (the branches made at other lines between are passed), or None."""
        for index in range(self.next_decision, len(self.decisions)):
            if self.decisions[index][0] == line:
                self.next_decision = index + 1
                return self.decisions[index][1]
        return None

    def site(self, site: Site) -> list[torch.Tensor] | None:
        """Record ``site`` (discovery: None, the caller computes a stand-in), or return the
        graph inputs that stand for it (export)."""
        if self.phase == "discover":
            if self.generator is not None and self.generator.initial_seed() != self.start_seed:
                site = Site(site.kind, site.layouts, site.params, site.n_inputs, self.generator.get_state())
            self.sites.append(site)
            return None
        start = self.next_supplied
        self.next_supplied += site.n_inputs
        if self.next_supplied > len(self.supplied):
            raise OrtNotImplemented("ORTModule: the forward draws more random values in the export than it did "
                                    "when it was first traced (its random calls depend on something that "
                                    "changed between two runs)")
        return list(self.supplied[start:self.next_supplied])


_local = threading.local()


def default_generator(device: torch.device) -> Any:
    """torch's default generator of ``device`` (the one eager's random kernels draw from)."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def _current() -> Trace | None:
    return getattr(_local, "trace", None)


# -- the draws, as eager makes them ------------------------------------------------------------------

_ALPHA = 1.7580993408473766     # the SELU alpha of torch's alpha dropout


def _noise(layout: Layout, p: float, device: torch.device, generator: Any) -> torch.Tensor:
    return layout.empty(device).bernoulli_(1 - p, generator=generator)


# torch.rand_like(x) and its kin draw as these in-place methods on an empty_like(x)
_LIKE_AS_METHOD = {"rand_like": ("uniform_", (0.0, 1.0)), "randn_like": ("normal_", (0.0, 1.0))}


def draw(site: Site, device: torch.device, generator: Any = None) -> list[torch.Tensor]:
    """The tensors of one site, drawn from ``generator`` (default: the device's default
    generator) as eager draws them on the CPU."""
    kind, params = site.kind, site.params
    if kind == "dropout":           # empty_like / feature noise, bernoulli_(1 - p), div_(1 - p)
        (p,) = params
        return [_noise(site.layouts[0], p, device, generator).div_(1 - p)]
    if kind == "alpha_dropout":     # the same draw, mapped to a scale and a shift
        (p,) = params
        a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
        noise = _noise(site.layouts[0], p, device, generator)
        shift = noise.add(-1).mul_(_ALPHA * a).add_(_ALPHA * a * p)
        return [noise.mul_(a), shift]
    if kind == "method":            # an in-place random method on a fresh tensor
        name, args, kwargs = params
        return [getattr(site.layouts[0].empty(device), name)(*args, **kwargs, generator=generator)]
    if kind == "like":              # torch.rand_like(x), ...: only x's layout matters
        function, args, kwargs = params
        target = site.layouts[0].empty(device)
        if function.__name__ == "randint_like":
            low, high = (0, args[0]) if len(args) == 1 else args[:2]
            return [target.random_(int(low), int(high), generator=generator)]
        name, arguments = _LIKE_AS_METHOD[function.__name__]
        return [getattr(target, name)(*arguments, generator=generator)]
    if kind == "factory":           # torch.rand(3, 4), ...
        function, args, kwargs = params
        return [function(*args, **{**kwargs, "device": device, "generator": generator})]
    if kind == "host":              # a NumPy or Python draw of the forward (see _host_site)
        function, args, kwargs = params
        return [torch.as_tensor(function(*args, **kwargs)).to(device=device, dtype=site.layouts[0].dtype)]
    raise AssertionError(f"unknown site kind {kind!r}")


def draw_all(sites: Sequence[Site], device: torch.device) -> list[torch.Tensor]:
    """Every site's tensors in order: sites the forward pinned to a generator state it set
    itself draw from a generator in that state (consecutive sites pinned to one state continue
    its stream), the others from the device's default generator, which the pinned draws leave
    untouched, as the forward that restores the state after seeding leaves it in eager."""
    drawn: list[torch.Tensor] = []
    pinned_state = None
    pinned_generator = None
    for site in sites:
        generator = None
        if site.pinned is not None:
            if pinned_state is None or not torch.equal(pinned_state, site.pinned):
                pinned_generator = torch.Generator(device=device)
                pinned_generator.set_state(site.pinned)
                pinned_state = site.pinned
            generator = pinned_generator
        else:
            pinned_state = None
        drawn.extend(draw(site, device, generator))
    return drawn


# -- dropout: torch._VF's kernels --------------------------------------------------------------------

def _dropout_site(trace: Trace, input: torch.Tensor, p: float, train: bool, *, feature: bool, alpha: bool,
                  inplace: bool, original: Callable) -> torch.Tensor:
    """One of torch's four dropout kernels, as graph arithmetic on drawn inputs."""
    if not 0 <= p <= 1:
        raise OrtInvalidArgument(f"dropout probability has to be between 0 and 1, but got {p}")
    if p == 0 or not train or input.numel() == 0:
        return input
    if p == 1:                      # no draw: the input times a zero scalar
        zero = torch.zeros((), dtype=input.dtype, device=input.device)
        return input.mul_(zero) if inplace else input * zero
    if feature:
        if input.dim() < 2:
            raise OrtInvalidArgument("Feature dropout requires at least 2 dimensions in the input")
        shape = (input.shape[0], input.shape[1]) + (1,) * (input.dim() - 2)
        layout = Layout(shape, torch.empty(shape, device="meta").stride(), input.dtype)
    else:
        layout = Layout(tuple(input.shape), torch.empty_like(input, device="meta").stride(), input.dtype)
    site = Site("alpha_dropout" if alpha else "dropout", (layout,), (float(p),), 2 if alpha else 1)
    drawn = trace.site(site)
    if drawn is None:
        return input.clone() if not inplace else input
    result = input.mul_(drawn[0]) if inplace else input * drawn[0]
    return result.add_(drawn[1]) if alpha else result


_VF_DROPOUTS = {
    # name: (feature, alpha, inplace)
    "dropout": (False, False, False), "dropout_": (False, False, True),
    "feature_dropout": (True, False, False), "feature_dropout_": (True, False, True),
    "alpha_dropout": (False, True, False), "alpha_dropout_": (False, True, True),
    "feature_alpha_dropout": (True, True, False), "feature_alpha_dropout_": (True, True, True),
}


def _vf_dropout(name: str, original: Callable) -> Callable:
    feature, alpha, inplace = _VF_DROPOUTS[name]

    def dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        trace = _current()
        if trace is None:
            return original(input, p, train)
        return _dropout_site(trace, input, float(p), bool(train), feature=feature, alpha=alpha, inplace=inplace,
                             original=original)
    return dropout


# -- BatchNorm with batch statistics ------------------------------------------------------------------

def _batch_norm(original: Callable) -> Callable:
    def batch_norm(input: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                   weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, training: bool = False,
                   momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
        trace = _current()
        if trace is None or not training:
            return original(input, running_mean, running_var, weight, bias, training, momentum, eps)
        return _batch_norm_training(trace, input, running_mean, running_var, weight, bias, momentum, eps)
    return batch_norm


def _batch_norm_training(trace: Trace, x: torch.Tensor, running_mean: torch.Tensor | None,
                         running_var: torch.Tensor | None, weight: torch.Tensor | None,
                         bias: torch.Tensor | None, momentum: float | None, eps: float) -> torch.Tensor:
    """BatchNorm over the batch's own statistics, as one :func:`batch_norm_training` node (whose
    derivative ortagent writes itself, see :mod:`ortagent._ad_rules`), with the statistics
    recorded for the running buffers."""
    if x.dim() < 2:
        if x.numel() == 0:          # (eager reads no channel axis and returns the empty input)
            raise OrtNotImplemented("ORTModule: BatchNorm of an empty 1-d input is not supported")
        raise OrtInvalidArgument(f"BatchNorm expects an input of 2 or more dimensions, got {x.dim()}")
    channels = x.shape[1]
    count = x.numel() // channels if channels else 0
    if count == 1:
        raise OrtInvalidArgument(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
    if weight is None:
        weight = torch.ones(channels, dtype=x.dtype, device=x.device)
    if bias is None:
        bias = torch.zeros(channels, dtype=x.dtype, device=x.device)
    if count == 0:
        # an empty batch, as torch: an empty result, zero gradients for weight and bias, and
        # running statistics left as they are (the batch counter still counts it)
        _, shape = _channel_axes(x, x.dim())
        return x * weight.reshape(shape) + bias.reshape(shape)
    y, mean, var = batch_norm_training(x, weight, bias, float(eps), x.dim())
    if (running_mean is None) != (running_var is None):
        raise OrtNotImplemented("ORTModule: batch_norm with only one of running_mean / running_var")
    if running_mean is not None and running_var is not None:
        names = (trace.state_names.get(id(running_mean)), trace.state_names.get(id(running_var)))
        if names[0] is None or names[1] is None:
            raise OrtNotImplemented("ORTModule: batch_norm in training mode updates running statistics that are "
                                    "not buffers of the module; only a module's own buffers are updated")
        counter = names[0].rsplit(".", 1)[0] + ".num_batches_tracked" if "." in names[0] else "num_batches_tracked"
        trace.statistics.append(BatchStatistics(names[0], names[1],
                                                counter if counter in trace.state_names.values() else None,
                                                None if momentum is None else float(momentum)))
        trace.statistic_values.append(mean)
        trace.statistic_values.append(var * (count / max(count - 1, 1)))
    return y


def _cross_entropy(original: Callable) -> Callable:
    """cross_entropy with label smoothing or probability targets, written while tracing as
    torch's kernel computes it (:func:`._losses.smoothed_or_soft_cross_entropy`): the exporter's own
    graph gave a loss up to 0.148 off torch's with smoothing (module_db's CrossEntropyLoss
    samples) and an invalid node with probability targets. Plain class-index targets keep the
    exporter's translation."""
    def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                      size_average: Any = None, ignore_index: int = -100, reduce: Any = None,
                      reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
        soft = isinstance(target, torch.Tensor) and input.shape == target.shape and target.is_floating_point()
        if _current() is None or not (soft or label_smoothing > 0.0) or not 0.0 <= label_smoothing <= 1.0 \
                or (soft and ignore_index >= 0) or input.dim() < 1:
            # torch's own function, and its checks for what it refuses
            return original(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        if size_average is not None or reduce is not None:
            reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"{reduction} is not a valid value for reduction")
        return smoothed_or_soft_cross_entropy(input, target, weight, ignore_index, reduction,
                                               float(label_smoothing), soft)
    return cross_entropy


def _instance_norm(original: Callable) -> Callable:
    def instance_norm(input: torch.Tensor, running_mean: torch.Tensor | None = None,
                      running_var: torch.Tensor | None = None, weight: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None, use_input_stats: bool = True, momentum: float = 0.1,
                      eps: float = 1e-5) -> torch.Tensor:
        trace = _current()
        if trace is None or not use_input_stats or running_mean is None:
            return original(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
        # the normalization itself without the buffers (torch updates them in place inside its
        # kernel); the running averages from the per-instance statistics, as torch computes them
        result = original(input, None, None, weight, bias, True, momentum, eps)
        if running_var is None:
            raise OrtNotImplemented("ORTModule: instance_norm with running_mean but no running_var")
        names = (trace.state_names.get(id(running_mean)), trace.state_names.get(id(running_var)))
        if names[0] is None or names[1] is None:
            raise OrtNotImplemented("ORTModule: instance_norm in training mode updates running statistics that "
                                    "are not buffers of the module; only a module's own buffers are updated")
        dims = list(range(2, input.dim()))
        count = math.prod(input.shape[2:])
        per_instance = input.detach().mean(dim=dims)
        centered = input.detach() - per_instance.reshape(*per_instance.shape, *([1] * len(dims)))
        variance = (centered * centered).mean(dim=dims) * (count / max(count - 1, 1))
        trace.statistics.append(BatchStatistics(names[0], names[1], None, float(momentum)))
        trace.statistic_values.append(per_instance.mean(dim=0))
        trace.statistic_values.append(variance.mean(dim=0))
        return result
    return instance_norm


# -- dropout inside attention -------------------------------------------------------------------------

def _attention(original: Callable) -> Callable:
    """``scaled_dot_product_attention`` with ``dropout_p > 0``: attention written out, its
    softmax weights through torch's dropout kernel (a site), as torch's CPU math path computes
    it; without dropout, torch's own."""
    def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> torch.Tensor:
        trace = _current()
        if trace is None or dropout_p <= 0:
            result = original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)
            # under a trace: torch's kernels lay the result out as (batch, heads, L, E) or, its
            # CPU flash kernel, as a transpose of (batch, L, heads, E); which one runs depends on
            # grad mode and the mask, so torch.onnx's re-trace can pick another than the export
            # did, and a `transpose(1, 2).contiguous().view(...)` that was a view under one
            # layout fails under the other (transformers' BEiT). A contiguous copy (recorded:
            # `contiguous()` of a contiguous tensor is not) has one layout in both, and is free
            # in ONNX.
            return result if trace is None else result.clone(memory_format=torch.contiguous_format)
        if enable_gqa and query.dim() >= 3 and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        factor = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        scores = (query @ key.transpose(-2, -1)) * factor
        if is_causal:
            causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask
        weights = scores.softmax(dim=-1).contiguous()
        dropped = _dropout_site(trace, weights, float(dropout_p), True, feature=False, alpha=False, inplace=False,
                                original=_ORIGINAL_VF["dropout"])
        return dropped @ value
    return attention


# -- the replaced functions, while any thread traces -----------------------------------------------

_ORIGINAL_VF: dict[str, Callable] = {}
_install_lock = threading.Lock()
_installed = 0
_saved: list[tuple[Any, str, Any]] = []


def _install() -> None:
    global _installed
    with _install_lock:
        _installed += 1
        if _installed > 1:
            return
        vf = torch._VF
        for name in _VF_DROPOUTS:
            original = getattr(vf, name)
            _ORIGINAL_VF[name] = original
            _saved.append((vf, name, vf.__dict__.get(name, _MISSING)))
            setattr(vf, name, _vf_dropout(name, original))
        for name, rewrite in (("batch_norm", _batch_norm), ("instance_norm", _instance_norm),
                              ("scaled_dot_product_attention", _attention), ("cross_entropy", _cross_entropy)):
            original = getattr(F, name)
            _saved.append((F, name, original))
            setattr(F, name, rewrite(original))
        function = torch.autograd.Function
        _saved.append((function, "apply", function.__dict__.get("apply", _MISSING)))
        function.apply = _function_apply(inspect.getattr_static(function, "apply"))
        for module in [m for name, m in list(sys.modules.items()) if name.startswith(_HOST_DRAW_MODULES)]:
            for name in _HOST_DRAWS:
                # (the module's own dict: transformers' lazy packages import their submodules
                # when asked for a name they lack, 0.9 s for all of them)
                original = getattr(module, "__dict__", {}).get(name)
                if callable(original):
                    _saved.append((module, name, original))
                    setattr(module, name, _host_draw(original))
        for module, name, bounds in _host_uniforms():
            original = getattr(module, name)
            _saved.append((module, name, original))
            setattr(module, name, _host_uniform(original, bounds))
        for module in (np.random, random):
            _saved.append((module, "seed", module.seed))
            module.seed = _host_seed(module.seed)


# -- NumPy draws of the libraries: transformers' SpecAugment -------------------------------------------

#: functions of other libraries that draw from NumPy's global generator, with the module names
#: they are found under: transformers' SpecAugment spans (wav2vec2 and the speech models that
#: copy it), drawn in training where mask_time_prob or mask_feature_prob is above 0
_HOST_DRAWS = ("_compute_mask_indices",)
_HOST_DRAW_MODULES = ("transformers.models.",)


def _host_site(trace: Trace, original: Callable, args: tuple, kwargs: dict, dtype: Any = None) -> torch.Tensor:
    """The tensor of a host draw (``original(*args, **kwargs)``, drawn from NumPy's or Python's
    generator): in a discovery drawn now, both generators put back as they were after it (the
    trace draws nothing of the caller's streams), and recorded as a site; in an export the
    graph input that stands for it. The bridge calls ``original`` before each run."""
    if trace.phase == "export":
        drawn = trace.site(Site("host", (), (original, args, kwargs)))
        assert drawn is not None
        tensor = drawn[0]
    else:
        states = np.random.get_state(), random.getstate()
        trace.in_host_draw = True
        try:
            tensor = torch.as_tensor(original(*args, **kwargs), dtype=dtype)
        finally:
            trace.in_host_draw = False
            np.random.set_state(states[0])
            random.setstate(states[1])
        trace.site(Site("host", (Layout.of(tensor),), (original, tuple(args), dict(kwargs))))
        tensor = tensor.to(trace.stand_in_device)
    trace.host_draws[id(tensor)] = tensor
    return tensor


def _forward_draw_trace() -> Trace | None:
    """The calling thread's trace where the caller of the patched NumPy or Python function
    (two frames up) is the forward's code: None outside a trace, inside a host draw (its own
    draws are the site's) and for a call made by torch or ortagent (their draws are their own)."""
    trace = _current()
    if trace is None or trace.in_host_draw or sys._getframe(2).f_code.co_filename.startswith(_LIBRARY_DIRS):
        return None
    return trace


def _host_uniforms() -> list[tuple[Any, str, Callable]]:
    """(module, name, bounds) of the scalar uniform draws of NumPy's and Python's global
    generators; ``bounds(*args, **kwargs)`` gives (low, high) for a call that draws one number,
    None for one that draws an array (whose tensor _TraceMode._from_data compares)."""
    def numpy_unit(size: Any = None) -> tuple[float, float] | None:
        return (0.0, 1.0) if size is None else None

    def numpy_rand(*dims: Any) -> tuple[float, float] | None:
        return None if dims else (0.0, 1.0)

    def numpy_uniform(low: Any = 0.0, high: Any = 1.0, size: Any = None) -> tuple[float, float] | None:
        scalars = all(isinstance(b, int | float) and not isinstance(b, bool) for b in (low, high))
        return (float(low), float(high)) if size is None and scalars else None

    def python_unit() -> tuple[float, float]:
        return 0.0, 1.0

    def python_uniform(a: Any, b: Any) -> tuple[float, float] | None:
        scalars = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
        return (float(min(a, b)), float(max(a, b))) if scalars else None

    return [(np.random, "random", numpy_unit), (np.random, "random_sample", numpy_unit),
            (np.random, "rand", numpy_rand), (np.random, "uniform", numpy_uniform),
            (random, "random", python_unit), (random, "uniform", python_uniform)]


def _host_uniform(original: Callable, bounds: Callable) -> Callable:
    """``original`` (one of _host_uniforms) in the tracing thread: a number drawn is a site
    (the bridge draws it before each run, keeping NumPy's and Python's streams as eager's
    forward leaves them) whose value enters the trace as a 0-d tensor of the default dtype, a
    draw uniform over its bounds for _TraceMode._decide: ``if np.random.random() >
    layerdrop`` at layerdrop 0 (transformers' Wav2Vec2 adapter, Data2VecAudio, WavLM) is the
    same for every draw and traces so; inside the range it is a random choice, refused; and
    arithmetic with it reads each call's draw (before, the trace's draw was a constant of
    the graph). A draw of exactly its lower bound (a chance of 2^-53) is taken as not made."""
    def host_uniform(*args: Any, **kwargs: Any) -> Any:
        trace = _forward_draw_trace()
        if trace is None:
            return original(*args, **kwargs)
        try:
            range_ = bounds(*args, **kwargs)
        except TypeError:
            range_ = None
        if range_ is None:
            return original(*args, **kwargs)
        tensor = _host_site(trace, original, args, kwargs, torch.get_default_dtype())
        low, high = range_
        trace.uniform[id(tensor)] = (tensor, tensor._version, math.nextafter(low, math.inf), high)
        return tensor

    host_uniform.__wrapped__ = original      # type: ignore[attr-defined]
    return host_uniform


def _host_seed(original: Callable) -> Callable:
    """NumPy's or Python's ``seed`` refused in the tracing thread: the bridge makes the
    forward's draws from those generators before the run, from their streams as they are, and
    cannot replay a seeding inside the forward (eager's draws after it would be the seed's)."""
    def host_seed(*args: Any, **kwargs: Any) -> Any:
        if _forward_draw_trace() is None:
            return original(*args, **kwargs)
        raise OrtNotImplemented(
            f"ORTModule: the forward seeds {original.__module__.split('.')[0]}'s random generator; the bridge "
            "draws the forward's NumPy and Python random numbers before each run and cannot replay a seeding "
            "inside it. Seed outside the forward")

    host_seed.__wrapped__ = original         # type: ignore[attr-defined]
    return host_seed


def _host_draw(original: Callable) -> Callable:
    """``original`` (a NumPy draw, see _HOST_DRAWS) made a site in the tracing thread: the
    bridge calls it before each run, as eager's forward would (the same draws from NumPy's
    generator, in the same order), and feeds its array to the graph; the trace gets the array
    as a tensor, which ``torch.tensor`` passes through (_TraceMode). Its arguments must be
    known before the run (shapes and numbers, no tensor)."""
    def host_draw(*args: Any, **kwargs: Any) -> Any:
        trace = _current()
        if trace is None or trace.in_host_draw:
            return original(*args, **kwargs)
        if any(True for _ in _tensors_in((*args, *kwargs.values()))):
            raise OrtNotImplemented(
                f"ORTModule: the forward draws {original.__module__}.{original.__name__} from NumPy's generator "
                "with a tensor argument (SpecAugment's spans given an attention mask computed in the forward); "
                "the bridge makes such draws before the run, from arguments known then. Call the model without "
                "attention_mask, pass the mask indices in yourself (mask_time_indices), or set "
                "config.mask_time_prob = config.mask_feature_prob = 0")
        return _host_site(trace, original, args, kwargs)

    host_draw.__wrapped__ = original         # type: ignore[attr-defined]
    return host_draw


# -- custom autograd.Functions whose backward is their forward's derivative -------------------------

#: torch.autograd.Function subclasses declared to have their forward's derivative as their
#: backward (:func:`differentiate_forward_of`): a trace runs their forward's operations with
#: gradients on, so the exported graph differentiates them; any other custom Function that
#: gets values needing a gradient is refused
_FORWARD_DIFFERENTIATED: set[type] = set()
_forward_differentiated_lock = threading.Lock()
#: the same, known to ortagent by qualified name (their libraries are not imported for it):
#: transformers' BLOOM GeLU, whose backward is the exact derivative of its tanh GELU
_KNOWN_FORWARD_DIFFERENTIATED = frozenset({"transformers.models.bloom.modeling_bloom.GeLUFunction"})


def _differentiates_forward(cls: type) -> bool:
    return cls in _FORWARD_DIFFERENTIATED or f"{cls.__module__}.{cls.__qualname__}" in _KNOWN_FORWARD_DIFFERENTIATED


def differentiate_forward_of(function: type) -> type:
    """Declare that ``function`` (a ``torch.autograd.Function`` subclass) computes in its
    ``backward`` exactly the derivative of its ``forward`` -- a Function written to save memory
    or time, not to change the gradient -- so that ORTModule may trace its forward's operations
    and differentiate them itself. ORTModule refuses every other custom Function applied to
    values that need a gradient (a straight-through estimator or a gradient reversal must not be
    differentiated through its forward). Returns ``function``, so it works as a decorator."""
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        raise OrtInvalidType(f"differentiate_forward_of takes a torch.autograd.Function subclass, got {function!r}")
    with _forward_differentiated_lock:
        _FORWARD_DIFFERENTIATED.add(function)
    return function


class _InlineContext:
    """What a Function's forward may call on its ``ctx`` when ORTModule runs it inline: saving
    and marking record nothing (the graph's own autodiff needs none of it)."""

    def __init__(self, args: tuple) -> None:
        self.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


def _function_apply(original: Any) -> Any:
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _current() is not None and _differentiates_forward(cls):
            ctx = _InlineContext(args)
            with torch.enable_grad():
                if getattr(cls, "setup_context", None) is torch.autograd.function._SingleLevelFunction.setup_context:
                    return cls.forward(ctx, *args, **kwargs)
                output = cls.forward(*args, **kwargs)
                cls.setup_context(ctx, args, output)
                return output
        return original.__get__(None, cls)(*args, **kwargs)
    return classmethod(apply)


def _uninstall() -> None:
    global _installed
    with _install_lock:
        _installed -= 1
        if _installed:
            return
        while _saved:
            owner, name, value = _saved.pop()
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_MISSING = object()


# -- cuts and primitive draws: a function mode of the tracing thread ---------------------------------

@torch.library.custom_op("ortagent::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged, with no gradient to it in the exported graph (a StopGradient node)."""
    return x.clone()


@stop_gradient.register_fake
def _stop_gradient_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _channel_axes(x: torch.Tensor, rank: int) -> tuple[list[int], list[int]]:
    """(the axes BatchNorm reduces over, the shape that broadcasts a per-channel vector)."""
    return [0, *range(2, rank)], [1, x.shape[1]] + [1] * (rank - 2)


@torch.library.custom_op("ortagent::batch_norm_training", mutates_args=())
def batch_norm_training(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                        rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BatchNorm over the batch's own statistics: (normalised ``x`` scaled by ``weight`` and
    shifted by ``bias`` per channel (axis 1), the batch mean and the biased batch variance per
    channel). ``rank`` is ``x.dim()``, kept in the exported node. In the exported graph one
    node, whose gradient ortagent writes as torch's (a few reductions) instead of differentiating
    the statistics' operations one by one (tens of nodes per BatchNorm)."""
    dims, view = _channel_axes(x, rank)
    mean = x.mean(dim=dims, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=dims, keepdim=True)
    y = centered * torch.rsqrt(var + eps) * weight.reshape(view) + bias.reshape(view)
    return y, mean.reshape(-1), var.reshape(-1)


@batch_norm_training.register_fake
def _batch_norm_training_fake(x, weight, bias, eps, rank):
    return torch.empty_like(x), x.new_empty(x.shape[1]), x.new_empty(x.shape[1])


def _batch_norm_training_setup(ctx, inputs, output) -> None:
    x, weight, bias, eps, rank = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.eps, ctx.rank = eps, rank


def _batch_norm_training_backward(ctx, grad_y, grad_mean, grad_var):
    """torch's BatchNorm gradient (the statistics' own gradients, which the bridge never asks
    for, included for completeness)."""
    x, weight, mean, var = ctx.saved_tensors
    dims, view = _channel_axes(x, ctx.rank)
    count = x.numel() // max(x.shape[1], 1)
    inv_std = torch.rsqrt(var.reshape(view) + ctx.eps)
    x_hat = (x - mean.reshape(view)) * inv_std
    grad_x = grad_weight = grad_bias = None
    if grad_y is not None:
        sum_dy = grad_y.sum(dim=dims, keepdim=True)
        sum_dy_xhat = (grad_y * x_hat).sum(dim=dims, keepdim=True)
        grad_x = weight.reshape(view) * inv_std * (grad_y - sum_dy / count - x_hat * sum_dy_xhat / count)
        grad_weight, grad_bias = sum_dy_xhat.reshape(-1), sum_dy.reshape(-1)
    extra = torch.zeros_like(x)
    if grad_mean is not None:
        extra = extra + grad_mean.reshape(view) / count
    if grad_var is not None:
        extra = extra + grad_var.reshape(view) * 2.0 * (x - mean.reshape(view)) / count
    grad_x = extra if grad_x is None else grad_x + extra
    return grad_x, grad_weight, grad_bias, None, None


batch_norm_training.register_autograd(_batch_norm_training_backward, setup_context=_batch_norm_training_setup)


@torch.library.custom_op("ortagent::check_nonnegative", mutates_args=())
def check_nonnegative(x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged, in a graph whose run fails where an entry of ``x`` is negative (a check
    eager makes in Python on the values, which the graph keeps)."""
    if bool((x < 0).any()):
        raise ValueError("ortagent::check_nonnegative: a negative entry")
    return x.clone()


@check_nonnegative.register_fake
def _check_nonnegative_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


check_nonnegative.register_autograd(lambda ctx, grad: grad)


@torch.library.custom_op("ortagent::check_all_true", mutates_args=())
def check_all_true(x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged, in a graph whose run fails where ``condition`` (a boolean scalar) is
    false: the conditions the forward checks with ``torch._check_tensor_all``, which the graph
    keeps (torch.onnx drops the exported program's runtime assertions)."""
    if not bool(condition):
        raise ValueError("ortagent::check_all_true: a false condition")
    return x.clone()


@check_all_true.register_fake
def _check_all_true_fake(x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


check_all_true.register_autograd(lambda ctx, grad: (grad, None))


# in-place random methods whose result depends only on the tensor's layout and scalar arguments
_RANDOM_METHODS = {torch.Tensor.bernoulli_, torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.random_,
                   torch.Tensor.exponential_, torch.Tensor.geometric_, torch.Tensor.log_normal_,
                   torch.Tensor.cauchy_}
_RANDOM_LIKE = {torch.rand_like, torch.randn_like, torch.randint_like}
_RANDOM_FACTORIES = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal}
# tensors made from data (torch.from_numpy is not seen by a function mode)
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
# fractional max pooling draws its samples inside torch's function: drawn before the call
# (spatial dims by function)
_FRACTIONAL_POOLS = {F.fractional_max_pool2d: 2, F.fractional_max_pool2d_with_indices: 2, F._fractional_max_pool2d: 2,
                     F.fractional_max_pool3d: 3, F.fractional_max_pool3d_with_indices: 3, F._fractional_max_pool3d: 3}
# draws whose distribution depends on tensor values: they cannot be made before the run
_RANDOM_FROM_DATA = {torch.bernoulli, torch.Tensor.bernoulli, torch.multinomial, torch.Tensor.multinomial,
                     torch.poisson, torch.binomial, torch.rrelu, F.rrelu, torch.rrelu_, torch._standard_gamma,
                     torch._sample_dirichlet}
_INTERNAL_NORMS = {torch.native_batch_norm, torch.ops.aten._native_batch_norm_legit,
                   torch.ops.aten._native_batch_norm_legit.default, torch.ops.aten._native_batch_norm_legit.no_stats,
                   torch.ops.aten._batch_norm_with_update, torch.ops.aten._batch_norm_with_update.default,
                   # (the torch.* functions of the same kernels: op_db calls torch._native_batch_norm_legit)
                   *(getattr(torch, name) for name in ("_native_batch_norm_legit",
                                                       "_native_batch_norm_legit_no_training", "_batch_norm_impl_index",
                                                       "cudnn_batch_norm", "miopen_batch_norm")
                     if hasattr(torch, name))}
_LINEAR_CROSS_ENTROPY = getattr(F, "linear_cross_entropy", None)     # (torch 2.14 and later)
_PACK_PADDED_SEQUENCE = getattr(torch, "_pack_padded_sequence", None)
_DATA_DESCRIPTOR = torch.Tensor.data
# comparisons of two values, by the relation each tests (see _TraceMode._decide)
_COMPARISONS = {torch.Tensor.__lt__: "<", torch.Tensor.lt: "<", torch.lt: "<", torch.less: "<",
                torch.Tensor.__le__: "<=", torch.Tensor.le: "<=", torch.le: "<=", torch.less_equal: "<=",
                torch.Tensor.__gt__: ">", torch.Tensor.gt: ">", torch.gt: ">", torch.greater: ">",
                torch.Tensor.__ge__: ">=", torch.Tensor.ge: ">=", torch.ge: ">=", torch.greater_equal: ">="}
_COUNTER_READS = {torch.Tensor.__float__, torch.Tensor.item}
_AUTOGRAD_CALLS = {torch.autograd.grad: "torch.autograd.grad", torch.autograd.backward: "torch.autograd.backward",
                   torch.Tensor.backward: "Tensor.backward"}


def _is_data_getter(func: Any) -> bool:
    return getattr(func, "__self__", None) is _DATA_DESCRIPTOR and getattr(func, "__name__", "") == "__get__"


def _tensors_in(values: Any) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors_in(value)


def _function_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


class _TraceMode(TorchFunctionMode):
    """Intercepts the tracing thread's torch calls made by the forward's own code."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
            if func in _INTERNAL_NORMS:
                raise OrtNotImplemented(f"ORTModule: {func} called directly is not supported; use F.batch_norm or "
                                        "the BatchNorm modules")
            return func(*args, **kwargs)
        if _is_data_getter(func):
            tensor = args[0]
            if not (tensor.requires_grad and tensor.is_floating_point()):
                return tensor           # (the same values, no gradient either way: updates reach it)
            alias = stop_gradient(tensor)
            self.trace.data_aliases[id(alias)] = (alias, tensor)
            return alias
        if args and isinstance(args[0], torch.Tensor) and _updates_in_place(func) \
                and self.trace.data_aliases.get(id(args[0]), (None,))[0] is args[0] and func not in _METADATA_UPDATES:
            return self._update_through_data(func, args, kwargs)
        if func in _FROM_DATA and args:
            return self._from_data(func, args, kwargs)
        if func in (torch.as_strided, torch.Tensor.as_strided) and args:
            return as_strided(func, *args, **kwargs)
        if func in _RANDOM_METHODS or func in _RANDOM_LIKE or func in _RANDOM_FACTORIES:
            drawn = self._draw(func, args, kwargs)
            self._note_uniform(func, args, kwargs, drawn)
            return drawn
        if func in _COMPARISONS and len(args) == 2 and not kwargs:
            return self._decide(func, args)
        if func is torch.Tensor._is_all_true and (self.trace.phase == "export" or args[0].device.type == "meta"):
            # torch._check_tensor_all (transformers' torch_compilable_check: a VLM's image tokens
            # against its image features): the exported program would assert it on an unbacked
            # value that torch.onnx cannot translate and drops; the condition is kept for the
            # graph to check (_export.with_checks) and the trace goes on as if it held (so does a
            # discovery on meta tensors, which has no values to check)
            if self.trace.phase == "export":
                self.trace.checks.append(args[0].all())
            return torch.tensor(True)
        if func in _AUTOGRAD_CALLS:
            raise OrtNotImplemented(
                f"ORTModule: the forward calls {_AUTOGRAD_CALLS[func]} (a gradient inside the forward: a gradient "
                "penalty, an input-gradient regularizer); the exported graph holds one forward and differentiates "
                "it once. Compute that term outside the ORTModule, or on the module unwrapped")
        if func is torch.Tensor.register_hook:
            raise OrtNotImplemented(
                "ORTModule: the forward registers a gradient hook on a tensor (Tensor.register_hook); onnxruntime's "
                "backward would not call it, so the gradient would not be the hook's. Register hooks on the "
                "parameters outside the forward (those run, on the gradients ORTModule hands back), or apply the "
                "hook's change as torch operations")
        if func is torch.Tensor.__bool__ and id(args[0]) in self.trace.random_choices \
                and self.trace.random_choices[id(args[0])] is args[0]:
            raise OrtNotImplemented(
                "ORTModule: the forward takes a Python branch on a random draw compared with a number inside "
                "its range (transformers' layerdrop: `torch.rand([]) < layerdrop`, `np.random.random() > "
                "layerdrop`, skipping a layer at random); one graph cannot choose its layers at random. Set that "
                "probability to 0 (e.g. "
                "config.encoder_layerdrop = config.decoder_layerdrop = 0.0, config.layerdrop = 0.0) to train "
                "through ORTModule")
        if func is F.embedding:
            return _embedding(*args, **kwargs)
        if func in _FRACTIONAL_POOLS and len(args) <= 5 and kwargs.get("_random_samples") is None:
            return func(*args, **{**kwargs, "_random_samples": self._fractional_samples(func, args[0])})
        if func is F.gaussian_nll_loss:
            return gaussian_nll_loss(*args, **kwargs)
        if func is F.multilabel_margin_loss:
            return multilabel_margin_loss(*args, **kwargs)
        if func is F.ctc_loss or func is torch.ctc_loss:
            return ctc_loss(*args, **kwargs)
        if func is _PACK_PADDED_SEQUENCE:
            raise OrtNotImplemented(
                "ORTModule: pack_padded_sequence (a PackedSequence for nn.RNN / nn.LSTM / nn.GRU) is not "
                "supported: its batch sizes come from the values of the lengths, which one exported graph "
                "cannot hold for every call. Run the recurrent layer on the padded batch (masking the padded "
                "steps' outputs), or outside the ORTModule")
        if func is _LINEAR_CROSS_ENTROPY and kwargs.get("options") is not None:
            # the chunked path saves memory in eager (gradients made in the forward, a backward
            # that mutates them); the graph computes the same loss by the reference path
            return func(*args, **{**kwargs, "options": None})
        if func is torch.lstm and _projects(args):
            raise OrtNotImplemented("ORTModule: nn.LSTM with proj_size is not supported: torch's ONNX exporter "
                                    "writes an ONNX LSTM, which has no projection of the hidden state, so the "
                                    "graph does not compute torch's LSTM")
        if func in _INTERNAL_NORMS:
            raise OrtNotImplemented(f"ORTModule: {_function_name(func)} called directly is not supported (torch's "
                                    "ONNX exporter returns its saved statistics otherwise than the CPU kernel); use "
                                    "F.batch_norm or the BatchNorm modules")
        if func in _RANDOM_FROM_DATA:
            raise OrtNotImplemented(f"ORTModule: {_function_name(func)} draws random numbers whose distribution "
                                    "depends on tensor values computed in the forward; the bridge can only make "
                                    "draws that depend on shapes and constants before the run")
        if func in _COUNTER_READS or func is torch.Tensor.add_:
            counter = self.trace.state_names.get(id(args[0]), "")
            if counter.endswith("num_batches_tracked"):
                # BatchNorm's batch counter: the bridge adds to it after the run (as the graph
                # could not: a result nobody reads is dropped from it), and its value for
                # momentum=None is read then: any value does in the trace
                if func is torch.Tensor.add_:
                    if len(args) != 2 or kwargs or args[1] != 1:
                        raise OrtNotImplemented(f"ORTModule: '{counter}' is updated other than by 1")
                    self.trace.counters.append(counter)
                    return args[0]
                return 1.0
        if func is torch.Tensor.__bool__ and _called_from(_DETECT_CAUSAL):
            # nn.Transformer*'s is_causal detection compares the mask's values with a causal
            # mask; its answer only picks a kernel, so the mask as given is applied instead
            return False
        if (func is torch.Tensor.__bool__ or (func is torch.Tensor.item and args and args[0].dtype == torch.bool)) \
                and len(args) == 1 and not kwargs:
            # (a boolean's item() is its truth value, which only a branch can read)
            return self._branch(func, args[0])
        if args and id(args[0]) in self.trace.user_inputs and _updates_in_place(func):
            # the trace marks every floating-point input as requiring grad (so that one export
            # serves all requires_grad settings); an input a call updates in place requires none
            with torch.no_grad():
                return func(*args, **kwargs)
        if func is torch.Tensor.detach_ and args[0].requires_grad and args[0].is_floating_point():
            # the graph's value from here on is the tensor through stop_gradient (the update
            # itself, detach, is the identity in the graph, which autodiff went through)
            with torch.no_grad():
                args[0].copy_(stop_gradient(args[0]))
            return func(*args, **kwargs)
        if not torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor) and args[0].requires_grad \
                and args[0].is_floating_point() and _updates_in_place(func) and func not in _METADATA_UPDATES:
            return _update_without_gradient(func, args, kwargs)
        if isinstance(kwargs.get("out"), torch.Tensor) and not torch.is_grad_enabled():
            written = _written_without_gradient(func, args, kwargs)
            if written is not None:
                return written
        if not torch.is_grad_enabled() and any(t.requires_grad for t in _tensors_in((*args, *kwargs.values()))):
            function = _custom_function_running()
            if function is not None:
                raise OrtNotImplemented(
                    f"ORTModule: the forward applies the custom autograd.Function "
                    f"{function.__module__}.{function.__qualname__}; the exported graph would hold the operations "
                    "of its forward and not its backward, whose gradient can differ (a straight-through estimator, "
                    "a gradient reversal). Write it with torch operations (ORTModule differentiates those as torch "
                    "does) or apply it outside the ORTModule; torch.utils.checkpoint works with use_reentrant=False")
        result = func(*args, **kwargs)
        return self._cut(args, kwargs, result)

    @staticmethod
    def _cut(args: tuple, kwargs: dict, result: Any) -> Any:
        """Floating-point results without autograd history computed from operands that have one
        (no_grad, detach, integer round trips) pass through stop_gradient, so the exported
        graph's gradient agrees with torch's."""
        if isinstance(result, tuple):
            items = [_TraceMode._cut(args, kwargs, item) for item in result]
            if all(new is old for new, old in zip(items, result)):
                return result
            if hasattr(result, "_fields"):                      # a namedtuple
                return type(result)(*items)
            return tuple(items) if type(result) is tuple else type(result)(items)   # torch.return_types
        if not isinstance(result, torch.Tensor) or result.requires_grad or not result.is_floating_point():
            return result
        if any(t.requires_grad for t in _tensors_in((*args, *kwargs.values()))):
            return stop_gradient(result)
        return result

    def _fractional_samples(self, func: Any, input: torch.Tensor) -> torch.Tensor:
        """The uniform samples fractional max pooling draws inside torch's function (where this
        mode no longer sees it), drawn here as the same ``torch.rand`` call torch makes, so the
        bridge replays it."""
        spatial = _FRACTIONAL_POOLS[func]
        batch = 1 if input.dim() == spatial + 1 else input.size(0)
        shape = (batch, input.size(-spatial - 1), spatial)
        site = Site("factory", (), (torch.rand, shape, {"dtype": input.dtype}))
        drawn = self.trace.site(site)
        if drawn is None:           # a discovery: any samples do
            return torch.full(shape, 0.5, dtype=input.dtype, device=input.device)
        return drawn[0]

    def _update_through_data(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An in-place update of ``t.data`` (``w.data.clamp_(...)``): in eager it changes ``t``
        itself, recording no gradient. The trace's ``.data`` is ``t`` through stop_gradient, a
        new value: the update is made to ``t`` as an update under no_grad (a parameter's is then
        refused by the export, a buffer's or an input's copied back), and the alias takes the
        new values."""
        alias, original = self.trace.data_aliases[id(args[0])]
        with torch.no_grad():
            result = _update_without_gradient(func, (original, *args[1:]), kwargs)
            alias.copy_(original)
        return alias if result is original else result

    def _note_uniform(self, func: Any, args: tuple, kwargs: dict, drawn: Any) -> None:
        """Record a draw uniform over a known range (``torch.rand``, ``rand_like``,
        ``uniform_``) for :meth:`_decide`."""
        if func is torch.rand or func is torch.rand_like:
            low, high = 0.0, 1.0
        elif func is torch.Tensor.uniform_:
            low = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
            high = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
        else:
            return
        if isinstance(drawn, torch.Tensor) and drawn.is_floating_point() \
                and all(isinstance(b, int | float) and not isinstance(b, bool) for b in (low, high)):
            self.trace.uniform[id(drawn)] = (drawn, drawn._version, float(low), float(high))

    def _from_data(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``torch.tensor(data)`` and its kin. A host draw's tensor (see _host_draw) passes
        through, converted as asked. A tensor made from a NumPy array becomes a constant of
        the graph: the array is compared with the one the discovery saw at that call, and a
        forward whose arrays change between two runs (drawn from NumPy's generator, a clock) is
        refused, where one graph would hold one of them for every call."""
        data = args[0]
        drawn = self.trace.host_draws.get(id(data))
        if drawn is not None and drawn is data:
            return data.to(device=kwargs.get("device") or data.device, dtype=kwargs.get("dtype") or data.dtype)
        if isinstance(data, np.ndarray | np.generic):
            if self.trace.phase != "export":
                self.trace.host_constants.append(np.array(data, copy=True))
            else:
                index = self.trace.next_host_constant
                self.trace.next_host_constant += 1
                seen = self.trace.host_constants[index] if index < len(self.trace.host_constants) else None
                if seen is None or seen.shape != np.shape(data) or seen.dtype != np.asarray(data).dtype \
                        or not np.array_equal(seen, data, equal_nan=seen.dtype.kind in "fc"):
                    raise OrtNotImplemented(
                        f"ORTModule: the forward makes a tensor from a NumPy array ({_function_name(func)}) whose "
                        "values changed between two runs of the forward (drawn from NumPy's random generator, "
                        "read from a clock or a counter); the exported graph would hold one of them for every "
                        "call. Make the array outside the forward and pass it in as a tensor, or draw it with "
                        "torch's random functions (which the bridge draws anew for each call)")
        return func(*args, **kwargs)

    def _branch(self, func: Any, tensor: torch.Tensor) -> bool:
        """A Python branch on a tensor's value (transformers' CTC heads: ``if labels.max() >=
        vocab_size: raise ValueError``; Longformer's ``is_global_attn = mask.any().item()``). A
        discovery on copies records its outcome by the forward's line; the export, where the value is not known, takes the outcome the
        discovery saw at that line and keeps the condition for the graph to check
        (:func:`._export.with_checks`): the run fails where an input would take the branch the
        other way, rather than run the branch the graph holds."""
        if self.trace.phase != "export":
            outcome = func(tensor)
            if tensor.device.type != "meta":
                self.trace.decisions.append((_forward_line(), outcome))
            return outcome
        # (taken in step with the discovery's at this line, also where the export knows the
        # value: a branch in a loop may be known in one pass and not in the next)
        line = _forward_line()
        outcome = self.trace.decide(line)
        failure: Exception | None = None
        try:
            known = func(tensor)
            if isinstance(known, bool):
                return known
        except Exception as exc:        # (item() gives an unknown SymBool, bool() refuses)
            if not _data_dependent(exc):
                raise
            failure = exc
        if outcome is None:
            if failure is not None:
                raise failure
            return known
        condition = (tensor != 0).reshape(())
        self.trace.checks.append(condition if outcome else condition.logical_not())
        self.trace.checked_branches.append((line, outcome))
        return outcome

    def _decide(self, func: Any, args: tuple) -> Any:
        """A comparison of a uniform draw with a number: where the number lies outside the
        draw's range the answer is the same for every draw (``torch.rand([]) < 0.0``, which
        transformers' layerdrop makes at layerdrop 0) and is that constant, so a Python branch
        on it traces; the draw itself is still made, as eager makes it. Inside the range the
        answer is random; a branch on it is refused (see ``__torch_function__``)."""
        drawn, bound, op = args[0], args[1], _COMPARISONS[func]
        if not isinstance(drawn, torch.Tensor) and isinstance(args[1], torch.Tensor):
            drawn, bound = args[1], args[0]             # torch.lt(0.5, u): u > 0.5
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
        entry = self.trace.uniform.get(id(drawn)) if isinstance(drawn, torch.Tensor) else None
        if entry is None or entry[0] is not drawn or entry[1] != drawn._version \
                or isinstance(bound, bool) or not isinstance(bound, int | float):
            return func(*args)
        _, _, low, high = entry          # (high included: a low-precision draw may round up to it)
        outcome = {"<": False if bound <= low else True if bound > high else None,
                   "<=": False if bound < low else True if bound >= high else None,
                   ">": True if bound < low else False if bound >= high else None,
                   ">=": True if bound <= low else False if bound > high else None}[op]
        if outcome is None:
            result = func(*args)
            self.trace.random_choices[id(result)] = result
            return result
        if drawn.dim() == 0:
            return torch.tensor(outcome)    # (a constant torch.export can branch on)
        return torch.full_like(drawn, outcome, dtype=torch.bool)

    def _draw(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A primitive random draw: a site whose values the bridge makes before the run."""
        if kwargs.get("generator") is not None:
            raise OrtNotImplemented(f"ORTModule: {_function_name(func)} with an explicit generator in the "
                                    "forward; the bridge draws from torch's default generator")
        if func in _RANDOM_METHODS:
            target = args[0]
            if any(True for _ in _tensors_in((*args[1:], *kwargs.values()))):
                raise OrtNotImplemented(f"ORTModule: {_function_name(func)} with tensor parameters draws values "
                                        "that depend on data computed in the forward")
            site = Site("method", (Layout.of(target),), (func.__name__, tuple(args[1:]), dict(kwargs)))
            drawn = self.trace.site(site)
            return target if drawn is None else target.copy_(drawn[0])
        if func in _RANDOM_LIKE:
            if any(True for _ in _tensors_in((*args[1:], *kwargs.values()))):
                raise OrtNotImplemented(f"ORTModule: {_function_name(func)} with tensor parameters draws values "
                                        "that depend on data computed in the forward")
            site = Site("like", (Layout.of(args[0]),), (func, tuple(args[1:]), dict(kwargs)))
        else:
            if any(True for _ in _tensors_in((*args, *kwargs.values()))):
                raise OrtNotImplemented(f"ORTModule: {_function_name(func)} with tensor arguments draws values "
                                        "that depend on data computed in the forward")
            concrete = tuple(int(a) if isinstance(a, torch.SymInt) else a for a in args)
            site = Site("factory", (), (func, concrete, {k: v for k, v in kwargs.items() if k != "device"}))
        drawn = self.trace.site(site)
        if drawn is None:           # a discovery: a stand-in that draws nothing
            if func in _RANDOM_LIKE:
                return torch.empty_like(args[0], dtype=kwargs.get("dtype"))
            device = self.trace.stand_in_device
            if device == "meta":
                return func(*args, **{**kwargs, "device": device})
            # (on a real device, from a generator of its own: the default one must not move)
            return func(*args, **{**kwargs, "device": device, "generator": torch.Generator(device=device)})
        if kwargs.get("requires_grad"):
            return drawn[0].detach().requires_grad_(True)
        return drawn[0]


_IN_PLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                     "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}


#: in-place methods that change no value
_METADATA_UPDATES = frozenset({torch.Tensor.detach_, torch.Tensor.requires_grad_, torch.Tensor.share_memory_})


def _update_without_gradient(func: Any, args: tuple, kwargs: dict) -> Any:
    """An in-place update, under no_grad, of a tensor that requires grad: torch changes the
    values and records nothing, so the gradient reaches the tensor's earlier value as though
    the update were not there. The update is made on a copy, and the tensor takes the copy's
    values through stop_gradient plus ``old - stop_gradient(old)``, a zero (exactly, where the
    old value is finite; 0 where it is not) whose derivative is 1 (written as the update itself,
    the graph differentiated through it: a gradient 2x where torch's was 3x). An update that
    changes the shape or type is made as it is."""
    target = args[0]
    updated = target.detach().clone()
    result = func(updated, *args[1:], **kwargs)          # (self, or None for __setitem__)
    if updated.shape != target.shape or updated.dtype != target.dtype:
        return func(*args, **kwargs)
    passthrough = torch.where(torch.isfinite(target), target - stop_gradient(target), torch.zeros_like(target))
    target.copy_(stop_gradient(updated) + passthrough)
    return target if result is updated else result


def _written_without_gradient(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """``torch.f(..., out=t)`` under no_grad from operands that require grad (spectral norm's
    power iteration writes its vectors into buffers so): torch records nothing, so the values
    written into ``t`` carry no gradient. The export would write the computation into ``t``
    and differentiate through it; the result is computed apart and written through
    stop_gradient. None where nothing requires grad or the result would not fit ``t`` as is."""
    out = kwargs["out"]
    operands = {key: value for key, value in kwargs.items() if key != "out"}
    if out.requires_grad or not any(t.requires_grad for t in _tensors_in((*args, *operands.values()))):
        return None
    result = func(*args, **operands)
    if not isinstance(result, torch.Tensor) or result.shape != out.shape or result.dtype != out.dtype:
        return None
    out.copy_(stop_gradient(result) if result.is_floating_point() else result)
    return out


def _updates_in_place(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return name in _IN_PLACE_DUNDERS or (name.endswith("_") and not name.startswith("_"))


def _embedding(input: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None,
               max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> torch.Tensor:
    """``F.embedding`` with torch's gradient: a plain gather differentiates into every row it
    read, where torch gives the ``padding_idx`` row no gradient and, with
    ``scale_grad_by_freq``, divides each row's gradient by its count in the batch. Both are
    written with stop_gradient around the same values."""
    if max_norm is not None:
        raise OrtNotImplemented("ORTModule: F.embedding / nn.Embedding with max_norm renormalizes rows of the "
                                "weight in place during the forward, which the bridge does not do")
    if sparse and weight.requires_grad:
        raise OrtNotImplemented("ORTModule: F.embedding / nn.Embedding with sparse=True (sparse gradients); the "
                                "bridge gives dense ones")
    result = F.embedding(input, weight)
    if not weight.requires_grad:
        return result
    if padding_idx is not None:
        if padding_idx < 0:
            padding_idx += weight.shape[0]
        result = torch.where((input == padding_idx).unsqueeze(-1), stop_gradient(result), result)
    if scale_grad_by_freq:
        flat = input.reshape(-1)
        counts = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device).scatter_add(
            0, flat, torch.ones(flat.shape, dtype=weight.dtype, device=weight.device))
        scale = F.embedding(input, counts.unsqueeze(-1)).reciprocal()
        frozen = stop_gradient(result)
        result = frozen + (result - frozen) * scale
    return result


def _projects(lstm_args: tuple) -> bool:
    """Whether a torch.lstm call has a projection (nn.LSTM's proj_size): its initial state (h, c) then
    has h of the projected size, smaller than c's hidden size."""
    for arg in lstm_args:
        if isinstance(arg, (tuple, list)) and len(arg) == 2 and all(isinstance(t, torch.Tensor) for t in arg):
            return arg[0].shape[-1] != arg[1].shape[-1]
    return False


def _called_from(code: Any) -> bool:
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


_DETECT_CAUSAL = torch.nn.modules.transformer._detect_is_causal_mask.__code__
_LIBRARY_DIRS = tuple(str(path) + "/" for path in (Path(torch.__file__).parent, Path(__file__).parents[1]))


def _forward_line() -> tuple[str, int]:
    """(file, line) of the caller's nearest frame outside torch and ortagent: the forward's
    line that made the call."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame = frame.f_back
    return ("", 0) if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def _data_dependent(exc: Exception) -> bool:
    """Whether ``exc`` is torch.export's refusal of a value it does not know at the trace."""
    return any(kind.__name__ in ("GuardOnDataDependentSymNode", "DataDependentOutputException")
               for kind in type(exc).__mro__)


def _custom_function_running() -> type | None:
    """The custom ``torch.autograd.Function`` whose forward the caller runs inside (torch runs a
    Function's forward with gradients off, from its C++ ``apply``: a frame of that Function's
    ``forward``), or None. The Functions torch makes for custom operators (``torch._library``:
    the operator is one node of the export, its backward registered with it) are not counted."""
    frame = sys._getframe(2)
    for _ in range(64):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == "forward":
            function = _function_of(code)
            if function is not None and not function.__module__.startswith("torch._library"):
                return function
        frame = frame.f_back
    return None


_FORWARD_CODES: dict[Any, type | None] = {}


def _function_of(code: Any) -> type | None:
    """The ``torch.autograd.Function`` subclass whose ``forward`` has ``code``, or None."""
    if code not in _FORWARD_CODES:
        found = None
        pending = list(torch.autograd.Function.__subclasses__())
        while pending and found is None:
            cls = pending.pop()
            pending.extend(cls.__subclasses__())
            if getattr(cls.__dict__.get("forward"), "__code__", None) is code or \
                    getattr(getattr(cls.__dict__.get("forward"), "__func__", None), "__code__", None) is code:
                found = cls
        _FORWARD_CODES[code] = found
    return _FORWARD_CODES[code]


@contextmanager
def tracing(trace: Trace) -> Iterator[Trace]:
    """Run the forward's trace in this thread with the rewrites above."""
    if _current() is not None:
        raise OrtNotImplemented("ORTModule: a module's forward calls another ORTModule while it is exported "
                                "(nested ORTModules are not supported)")
    _install()
    _local.trace = trace
    try:
        with _TraceMode(trace):
            yield trace
    finally:
        _local.trace = None
        _uninstall()
