"""Train a ``torch.nn.Module`` with onnxruntime: :class:`ORTModule`.

``ORTModule(module)`` wraps a module. Calling it exports the module (once per input signature)
with torch's dynamo ONNX exporter, parameters and buffers as named graph inputs, builds the
training graph with :func:`ortagent.training.build_training_graph`, and runs the forward and,
on ``.backward()``, the backward in onnxruntime through a :class:`~ortagent.TrainingAgent`
(state API, one :class:`~ortagent.PartialGraphExecutionState` per forward, held by a
``torch.autograd.Function``). Gradients reach ``param.grad`` through torch's own
AccumulateGrad, so optimizers, ``zero_grad``, gradient accumulation and hooks (DDP's included)
work as on the wrapped module. In eval mode, or under ``torch.no_grad()``, the forward model
alone runs in an :class:`~ortagent.InferenceSession`.

Tensors cross between torch and onnxruntime only by DLPack, without copies (inputs,
parameters, outputs, output gradients and parameter gradients); a non-contiguous tensor is
made contiguous first. ``import ortagent`` never imports torch: this module imports it.

Training semantics are decided before the export, never left to the exporter's defaults:

* ``BatchNorm1d/2d/3d`` in training mode (or without running statistics) is exported as an
  explicit batch mean / variance computation; the batch statistics are extra outputs with no
  gradient, and ``running_mean``, ``running_var`` and ``num_batches_tracked`` are updated in
  the torch buffers with torch's rule (momentum, or the cumulative average when ``momentum``
  is None; the unbiased variance).
* ``nn.Dropout``, ``F.dropout`` and ``scaled_dot_product_attention(dropout_p>0)`` (so also the
  attention-weight dropout of ``nn.MultiheadAttention``, either path) in training mode are
  exported as ``x * mask`` (attention: explicit softmax attention whose weights are masked);
  the mask (0 or ``1/(1-p)``) is an extra input drawn by torch's generator before each forward,
  in call order, the way torch draws it on the CPU (into ``empty_like(x)``): under
  ``torch.manual_seed`` a CPU run draws the same masks as eager.
* Anything the bridge cannot run faithfully is refused with :class:`~ortagent.OrtNotImplemented`
  at the first call of a signature: a functional ``F.batch_norm(training=True)``, channel and
  alpha dropouts in training, ``SyncBatchNorm``, instance norms with running statistics in
  training, grouped-query attention with dropout, random operators or training-mode
  ``Dropout`` / ``BatchNormalization`` nodes left in the exported graph, in-place updates of
  parameters, non-tensor outputs, double backward and ``retain_graph``.
"""

from __future__ import annotations

import math
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
import torch.nn.functional as F

from ortagent.errors import OrtInvalidArgument, OrtNotImplemented, RunStateError

__all__ = ["ORTModule", "export_forward_model", "OPSET", "IR_VERSION"]

#: the default-domain opset and IR version of exported graphs (onnxruntime 1.31 rejects IR 14)
OPSET = 18
IR_VERSION = 10

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_RANDOM_OPS = {"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli",
               "Multinomial"}
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CHANNEL_DROPOUTS = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


# -- flattening of inputs and outputs -------------------------------------------------------------

_LEAF = object()


def _flatten(value: Any, leaves: list, where: str) -> Any:
    """A template of ``value`` (tuples, lists and dicts of tensors and constants) whose tensors
    are replaced by their index in ``leaves``."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return (_LEAF, len(leaves) - 1)
    if isinstance(value, (tuple, list)):
        items = tuple(_flatten(item, leaves, where) for item in value)
        return (type(value), items)
    if isinstance(value, dict):
        return (dict, tuple((key, _flatten(item, leaves, where)) for key, item in value.items()))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("const", value)
    raise OrtNotImplemented(f"ORTModule: {where} of type {type(value).__name__} is not supported "
                            "(tensors, constants, and tuples, lists and dicts of them are)")


def _unflatten(template: Any, leaves: Sequence) -> Any:
    kind, payload = template
    if kind is _LEAF:
        return leaves[payload]
    if kind == "const":
        return payload
    if kind is dict:
        return {key: _unflatten(item, leaves) for key, item in payload}
    items = [_unflatten(item, leaves) for item in payload]
    if kind is tuple or kind is list:
        return kind(items)
    return kind(*items)     # a namedtuple


# -- training-mode rewrites -----------------------------------------------------------------------

class _Recorder(threading.local):
    """What the patched modules read and write while one trace (discovery or export) runs."""

    def __init__(self) -> None:
        self.mode: str | None = None        # "discover" or "export"
        self.dropouts: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, float]] = []
        self.masks: Sequence[torch.Tensor] = ()
        self.mask_index = 0
        self.stats: list[torch.Tensor] = []
        self.stat_modules: list[nn.Module] = []


_recorder = _Recorder()
# traces patch torch.nn.functional (process-wide): one at a time
_EXPORT_LOCK = threading.RLock()


def _batch_norm_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """BatchNorm with batch statistics, as explicit operations with exact gradients."""
    if x.dim() < 2:
        raise OrtInvalidArgument(f"BatchNorm expects an input of 2 or more dimensions, got {x.dim()}")
    channels = x.shape[1]
    dims = [0] + list(range(2, x.dim()))
    count = x.numel() // channels
    if count <= 1 and _recorder.mode is not None:
        raise OrtInvalidArgument(f"expected more than 1 value per channel when training, got input size {list(x.shape)}")
    view = [1, channels] + [1] * (x.dim() - 2)
    mean = x.mean(dim=dims, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=dims, keepdim=True)
    y = centered * torch.rsqrt(var + self.eps)
    if self.affine:
        y = y * self.weight.reshape(view) + self.bias.reshape(view)
    if self.training and self.track_running_stats:
        _recorder.stats.append(mean.reshape(channels).detach())
        _recorder.stats.append((var.reshape(channels) * (count / max(count - 1, 1))).detach())
        _recorder.stat_modules.append(self)
    return y


def _dropout_site(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout of ``x`` as ``x * mask``, the mask an input of the exported graph. In discovery,
    record the mask's shape, strides and dtype: torch draws into ``empty_like(x)``, which keeps
    x's strides, and so does the bridge."""
    if _recorder.mode == "discover":
        _recorder.dropouts.append((tuple(x.shape), torch.empty_like(x).stride(), x.dtype, float(p)))
        return x
    mask = _recorder.masks[_recorder.mask_index]
    _recorder.mask_index += 1
    return x * mask


def _dropout_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    return _dropout_site(x, self.p)


def _functional_dropout(original: Callable) -> Callable:
    """``F.dropout`` in training mode (MultiheadAttention's attention weights with
    ``need_weights=True``, user code) becomes a mask site; otherwise torch's own."""
    def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        if training and p > 0:
            return _dropout_site(input, p)
        return original(input, p, training, inplace)
    return dropout


def _attention(original: Callable) -> Callable:
    """``scaled_dot_product_attention`` with ``dropout_p > 0`` becomes explicit attention whose
    weights are multiplied by a mask site ([..., L, S], drawn as torch's CPU math kernel draws
    it); without dropout, torch's own."""
    def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> torch.Tensor:
        if dropout_p <= 0:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        if enable_gqa or query.shape[:-2] != key.shape[:-2]:
            raise OrtNotImplemented("ORTModule: scaled_dot_product_attention with dropout needs query and "
                                    "key of the same batch shape (no grouped-query attention)")
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
        weights = _dropout_site(scores.softmax(dim=-1).contiguous(), dropout_p)
        return weights @ value
    return attention


def _refusing(function: Callable, name: str, is_random: Callable[..., bool]) -> Callable:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if is_random(*args, **kwargs):
            raise OrtNotImplemented(
                f"ORTModule: {name} in training mode is not supported (it would be exported with "
                "inference semantics or run with another random generator); use nn.BatchNorm / "
                "nn.Dropout modules or F.dropout")
        return function(*args, **kwargs)
    return guarded


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


_FUNCTIONAL_GUARDS = {
    "dropout1d": lambda *a, **k: bool(_arg(a, k, 2, "training", True)) and _arg(a, k, 1, "p", 0.5) > 0,
    "dropout2d": lambda *a, **k: bool(_arg(a, k, 2, "training", True)) and _arg(a, k, 1, "p", 0.5) > 0,
    "dropout3d": lambda *a, **k: bool(_arg(a, k, 2, "training", True)) and _arg(a, k, 1, "p", 0.5) > 0,
    "alpha_dropout": lambda *a, **k: bool(_arg(a, k, 2, "training", False)) and _arg(a, k, 1, "p", 0.5) > 0,
    "feature_alpha_dropout": lambda *a, **k: bool(_arg(a, k, 2, "training", False)) and _arg(a, k, 1, "p", 0.5) > 0,
    "batch_norm": lambda *a, **k: bool(_arg(a, k, 5, "training", False)),
}
# functional forms rewritten (not refused) during traces
_FUNCTIONAL_REWRITES = {"dropout": _functional_dropout, "scaled_dot_product_attention": _attention}


class _Patched:
    """Rewrite the training-mode modules of ``module`` for one trace and guard the functional
    forms that cannot be rewritten; everything is restored on exit."""

    def __init__(self, module: nn.Module, mode: str) -> None:
        self.module = module
        self.mode = mode
        self.patched: list[nn.Module] = []
        self.saved: dict[str, Callable] = {}

    def __enter__(self) -> _Patched:
        try:
            self._patch()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _patch(self) -> None:
        for name, sub in self.module.named_modules():
            if isinstance(sub, nn.SyncBatchNorm) and sub.training:
                raise OrtNotImplemented(f"ORTModule: SyncBatchNorm '{name}' in training mode is not supported")
            if isinstance(sub, _BATCH_NORMS) and (sub.training or not sub.track_running_stats):
                sub.forward = types.MethodType(_batch_norm_forward, sub)  # type: ignore[method-assign]
                self.patched.append(sub)
            elif isinstance(sub, _CHANNEL_DROPOUTS) and sub.training and sub.p > 0:
                raise OrtNotImplemented(
                    f"ORTModule: {type(sub).__name__} '{name}' in training mode is not supported "
                    "(only nn.Dropout is exported with a torch-drawn mask)")
            elif isinstance(sub, nn.Dropout) and sub.training and sub.p > 0:
                sub.forward = types.MethodType(_dropout_forward, sub)  # type: ignore[method-assign]
                self.patched.append(sub)
            elif isinstance(sub, _INSTANCE_NORMS) and sub.training and sub.track_running_stats:
                raise OrtNotImplemented(
                    f"ORTModule: {type(sub).__name__} '{name}' with track_running_stats in training "
                    "mode is not supported")
        for fname, is_random in _FUNCTIONAL_GUARDS.items():
            function = getattr(F, fname)
            self.saved[fname] = function
            setattr(F, fname, _refusing(function, f"torch.nn.functional.{fname}", is_random))
        for fname, rewrite in _FUNCTIONAL_REWRITES.items():
            function = getattr(F, fname)
            self.saved[fname] = function
            setattr(F, fname, rewrite(function))
        _recorder.mode = self.mode
        _recorder.dropouts = []
        _recorder.mask_index = 0
        _recorder.stats = []
        _recorder.stat_modules = []

    def __exit__(self, *exc_info: Any) -> None:
        for sub in self.patched:
            sub.__dict__.pop("forward", None)
        for fname, function in self.saved.items():
            setattr(F, fname, function)
        _recorder.mode = None
        _recorder.masks = ()


# -- export ---------------------------------------------------------------------------------------

class _Functional(nn.Module):
    """The wrapped module as a function of (user tensors, parameters, buffers, dropout masks)."""

    def __init__(self, module: nn.Module, template: Any, n_inputs: int, state_names: list[str],
                 n_masks: int) -> None:
        super().__init__()
        self.target = [module]          # a list: not a submodule, so nothing of it is lifted
        self.template = template
        self.n_inputs = n_inputs
        self.state_names = state_names
        self.n_masks = n_masks
        self.output_template: Any = None
        self.n_outputs = 0

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n_state = len(self.state_names)
        inputs = flat[:self.n_inputs]
        state = dict(zip(self.state_names, flat[self.n_inputs:self.n_inputs + n_state]))
        _recorder.masks = flat[self.n_inputs + n_state:]
        _recorder.mask_index = 0
        _recorder.stats = []
        _recorder.stat_modules = []
        args, kwargs = _unflatten(self.template, inputs)
        result = torch.func.functional_call(self.target[0], state, tuple(args), dict(kwargs))
        leaves: list[torch.Tensor] = []
        self.output_template = _flatten(result, leaves, "an output")
        self.n_outputs = len(leaves)
        return (*leaves, *_recorder.stats)


def export_forward_model(module: nn.Module, args: tuple = (), kwargs: dict | None = None,
                         *, opset: int = OPSET, ir_version: int = IR_VERSION):
    """The forward ONNX model :class:`ORTModule` trains for ``module(*args, **kwargs)`` (in the
    module's current training mode), and a description of its inputs and outputs: a dict with
    ``model`` (``onnx.ModelProto``), ``input_names``, ``output_names``, ``stat_outputs`` (batch
    statistics) and ``dropout_masks`` (shapes, dtypes, probabilities of the mask inputs)."""
    return _export(module, args, kwargs or {}, opset, ir_version)[0]


def _discover(module: nn.Module, state: dict[str, torch.Tensor], args: Any, kwargs: Any) -> list:
    """Run the module once with patched modules to learn the dropout calls (their order and input
    shapes) and to meet any refusal before the export. Tries meta tensors first (nothing is
    computed, nothing is touched), then copies of the real ones under no_grad (so in-place
    updates in the forward touch nothing of the caller's)."""
    leaves: list[torch.Tensor] = []
    template = _flatten((args, kwargs), leaves, "an argument")
    for kind in ("meta", "copy"):
        try:
            with _Patched(module, "discover"), torch.no_grad():
                traced_state = {name: _stand_in(value, kind) for name, value in state.items()}
                traced_args, traced_kwargs = _unflatten(template, [_stand_in(leaf, kind) for leaf in leaves])
                torch.func.functional_call(module, traced_state, tuple(traced_args), dict(traced_kwargs))
                return list(_recorder.dropouts)
        except (OrtNotImplemented, OrtInvalidArgument):
            raise
        except Exception:
            if kind == "copy":
                raise
    return []


def _stand_in(tensor: torch.Tensor, kind: str) -> torch.Tensor:
    """A tensor like ``tensor`` for a trace: on the meta device, or a detached copy."""
    return tensor.detach().to("meta") if kind == "meta" else tensor.detach().clone()


def _export(module: nn.Module, args: tuple, kwargs: dict, opset: int, ir_version: int):
    with _EXPORT_LOCK:
        return _export_unlocked(module, args, kwargs, opset, ir_version)


def _export_unlocked(module: nn.Module, args: tuple, kwargs: dict, opset: int, ir_version: int):
    import importlib.util

    import onnx

    if importlib.util.find_spec("onnxscript") is None:
        raise OrtNotImplemented("ORTModule exports with torch.onnx.export(dynamo=True), which needs the "
                                "onnxscript package: pip install onnxscript (or ortagent[torch])")

    leaves: list[torch.Tensor] = []
    template = _flatten((tuple(args), dict(kwargs)), leaves, "an argument")
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    state = {**params, **buffers}
    dropouts = _discover(module, state, args, kwargs)
    devices = [leaf.device for leaf in leaves] + [value.device for value in state.values()]
    device = devices[0] if devices else torch.device("cpu")
    masks = [torch.ones(shape, dtype=dtype, device=device) for shape, _, dtype, _ in dropouts]
    functional = _Functional(module, template, len(leaves), list(state), len(masks))
    input_names = [f"input_{i}" for i in range(len(leaves))] + list(state) + \
        [f"dropout_mask_{i}" for i in range(len(masks))]
    flat = [leaf.detach() for leaf in leaves] + [value.detach() for value in state.values()] + masks
    # the output count is known only after a trace: one cheap traced call on meta tensors first
    # (on copies when some operation has no meta kernel)
    for kind in ("meta", "copy"):
        try:
            with _Patched(module, "export"), torch.no_grad():
                functional(*[_stand_in(value, kind) for value in flat])
            break
        except (OrtNotImplemented, OrtInvalidArgument):
            raise
        except Exception:
            if kind == "copy":
                raise
    n_outputs = functional.n_outputs
    output_template = functional.output_template
    stat_modules = list(_recorder.stat_modules)
    n_stats = len(_recorder.stats)
    output_names = [f"output_{i}" for i in range(n_outputs)] + \
        [f"batch_{'mean' if i % 2 == 0 else 'var'}_{i // 2}" for i in range(n_stats)]
    try:
        with _Patched(module, "export"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated", category=FutureWarning)
            program = torch.onnx.export(functional, tuple(flat), dynamo=True, input_names=input_names,
                                        output_names=output_names, opset_version=opset, optimize=True,
                                        verbose=False, report=False)
    except (OrtNotImplemented, OrtInvalidArgument):
        raise
    except Exception as exc:
        raise OrtNotImplemented(f"ORTModule: torch.onnx.export (dynamo) failed for "
                                f"{type(module).__name__}: {type(exc).__name__}: {exc}") from exc
    if program is None:
        raise OrtNotImplemented(f"ORTModule: torch.onnx.export returned no program for {type(module).__name__}")
    model = program.model_proto
    model.ir_version = ir_version
    _check_exported(model, any(sub.training for sub in module.modules()))
    onnx_inputs = {value.name for value in model.graph.input}
    if len(model.graph.output) != len(output_names):
        raise OrtNotImplemented(f"ORTModule: the exported graph has {len(model.graph.output)} outputs, "
                                f"expected {len(output_names)}")
    mutations = _mutation_outputs(program, model, input_names, flat, set(params))
    info = {
        "model": model,
        "input_names": [name for name in input_names if name in onnx_inputs],
        "output_names": [value.name for value in model.graph.output],
        "stat_outputs": list(range(n_outputs, n_outputs + n_stats + len(mutations))),
        "dropout_masks": dropouts,
    }
    layout = {
        "n_inputs": len(leaves),
        "state_names": list(state),
        "param_names": list(params),
        "n_outputs": n_outputs,
        "output_template": output_template,
        "stat_modules": stat_modules,
        "n_stats": n_stats,
        "mutated_inputs": mutations,
        "used": [name in onnx_inputs for name in input_names],
        "output_dtypes": [onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
                          for value in model.graph.output],
    }
    return info, layout


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
        if name in param_names or flat[index].requires_grad:
            raise OrtNotImplemented(f"ORTModule: the module updates '{name}' in place in its forward; "
                                    "in-place updates of parameters or of inputs that require grad are "
                                    "not supported")
        source = spec.arg.name
        if source not in produced or name not in types:
            raise OrtNotImplemented(f"ORTModule: the module updates '{name}' in place, and the exported "
                                    "graph lost the new value")
        target = f"updated_{index}"
        graph.node.append(helper.make_node("Identity", [source], [target], name=f"ortagent_{target}"))
        value = graph.output.add()
        value.name = target
        value.type.CopyFrom(types[name])
        mutated.append(index)
    return mutated


def _check_exported(model, training: bool) -> None:
    """Refuse exported graphs whose training semantics would be wrong."""
    from ortagent._onnx_graph import walk_graphs

    for graph in walk_graphs(model.graph):
        for node in graph.node:
            if node.op_type in _RANDOM_OPS:
                raise OrtNotImplemented(f"ORTModule: the exported graph draws random numbers in node "
                                        f"'{node.name}' ({node.op_type}); only nn.Dropout is supported")
            if training and node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
                raise OrtNotImplemented(f"ORTModule: the exported graph has a Dropout node '{node.name}' "
                                        "with a training_mode input; use nn.Dropout modules")
            if node.op_type == "BatchNormalization" and any(
                    attr.name == "training_mode" and attr.i for attr in node.attribute):
                raise OrtNotImplemented(f"ORTModule: the exported graph has a training-mode "
                                        f"BatchNormalization node '{node.name}'")


# -- the autograd function -------------------------------------------------------------------------

def _to_ort(tensor: torch.Tensor, stream: int | None = None):
    """An OrtValue over the tensor's memory. For a CUDA tensor, ``stream`` is the stream
    onnxruntime computes on: torch makes its pending work on the tensor visible to it."""
    from ortagent._dlpack import from_dlpack

    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if stream is not None and tensor.device.type == "cuda":
        return from_dlpack(tensor, stream=stream)
    return from_dlpack(tensor)


def _to_torch(value) -> torch.Tensor:
    return torch.utils.dlpack.from_dlpack(value)


class _Graph:
    """One export (one input signature and training mode) and the sessions that run it."""

    def __init__(self, info: dict, layout: dict, owner: ORTModule, device: torch.device) -> None:
        self.info = info
        self.layout = layout
        self.owner = owner
        self.device = device
        self.session: Any = None
        self.agents: dict[tuple, Any] = {}
        self.used = layout["used"]
        # CUDA: onnxruntime computes on torch's current stream of the device (captured now), and
        # torch orders its work on the tensors it hands over before that stream (DLPack's
        # stream argument). With the caller's own providers the stream is not known: torch's
        # current stream is synchronized before each run instead.
        self.stream: int | None = None
        if device.type == "cuda" and owner._providers is None:
            self.stream = torch.cuda.current_stream(device).cuda_stream

    def _providers(self) -> list:
        if self.owner._providers is not None:
            return list(self.owner._providers)
        if self.device.type == "cuda":
            return [("CUDAExecutionProvider", {"device_id": str(self.device.index or 0),
                                               "has_user_compute_stream": "1",
                                               "user_compute_stream": str(self.stream)}),
                    "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def before_run(self) -> None:
        if self.device.type == "cuda" and self.stream is None:
            torch.cuda.current_stream(self.device).synchronize()

    def to_ort(self, tensor: torch.Tensor):
        return _to_ort(tensor, self.stream)

    def _ort_device(self) -> str:
        return f"cuda:{self.device.index or 0}" if self.device.type == "cuda" else "cpu"

    def inference_session(self):
        if self.session is None:
            from ortagent._providers import strict_providers
            from ortagent._session import InferenceSession

            with strict_providers():        # the module's device, or an error: never another
                self.session = InferenceSession(self.info["model"].SerializeToString(),
                                                self.owner._session_options, self._providers())
        return self.session

    def run_inference(self, feeds: list[torch.Tensor]) -> list[torch.Tensor]:
        session = self.inference_session()
        names = self.info["input_names"]
        self.before_run()
        if self.device.type == "cuda":
            binding = session.io_binding()
            for name, tensor in zip(names, feeds):
                binding.bind_ortvalue_input(name, self.to_ort(tensor))
            for name in self.info["output_names"]:
                binding.bind_output(name, "cuda", self.device.index or 0)
            session.run_with_iobinding(binding)
            outputs = binding.get_outputs()
        else:
            outputs = session.run_with_ort_values(None, {name: _to_ort(t) for name, t in zip(names, feeds)})
        return [_to_torch(value) for value in outputs]

    def agent(self, trainable: tuple[str, ...], input_gradients: tuple[str, ...]):
        key = (trainable, input_gradients)
        agent = self.agents.get(key)
        if agent is None:
            from ortagent.agent import TrainingAgent
            from ortagent.training import build_training_graph

            names = self.info["input_names"]
            graph = build_training_graph(
                self.info["model"], trainable,
                user_inputs=[name for name in names if name not in trainable],
                input_gradients=input_gradients,
                non_differentiable_outputs=self.info["stat_outputs"],
                ir_version=IR_VERSION)
            device = self._ort_device()
            yield_node = next(node for node in graph.graph.node if node.op_type == "YieldOp")
            fetches = list(yield_node.input)
            grad_names = list(yield_node.output)
            outputs = [value.name for value in graph.graph.output]
            agent = TrainingAgent(graph.SerializeToString(),
                                  fw_feed_names=[value.name for value in graph.graph.input],
                                  fw_fetches_names=fetches,
                                  fw_outputs_device_info=[device] * len(fetches),
                                  bw_feed_names=grad_names,
                                  bw_fetches_names=outputs,
                                  bw_outputs_device_info=[device] * len(outputs),
                                  session_options=self.owner._session_options,
                                  providers=self._providers())
            non_diff = set()
            for attr in yield_node.attribute:
                if attr.name == "non_differentiable_outputs":
                    non_diff = set(attr.ints)
            feed_order = [names.index(value.name) for value in graph.graph.input]
            agent = (agent, feed_order, sorted(non_diff))
            self.agents[key] = agent
        return agent


class _ORTFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, graph: _Graph, plan: tuple, *feeds: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from ortagent._agent import PartialGraphExecutionState

        agent, feed_order, non_diff, grad_slots = plan
        state = PartialGraphExecutionState()
        outputs: list = []
        values = [graph.to_ort(feeds[i]) for i in feed_order]
        graph.before_run()
        agent.run_forward(values, outputs, state)
        results = tuple(_to_torch(value) for value in outputs)
        ctx.state = state
        ctx.graph = graph
        ctx.agent = agent
        ctx.non_diff = non_diff
        ctx.grad_slots = grad_slots
        ctx.n_feeds = len(feeds)
        ctx.output_meta = [(r.shape, r.dtype, r.device) for r in results]
        ctx.mark_non_differentiable(*[results[i] for i in non_diff])
        return results

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple:
        state = ctx.state
        if state is None or state.status != "waiting for its backward":
            raise RunStateError("ORTModule: the backward of this forward already ran (retain_graph "
                                "and a second backward through the same forward are not supported)")
        non_diff = set(ctx.non_diff)
        grads = []
        for index, grad in enumerate(grad_outputs):
            if index in non_diff:
                continue
            if grad is None:
                shape, dtype, device = ctx.output_meta[index]
                grad = torch.zeros(shape, dtype=dtype, device=device)
            grads.append(ctx.graph.to_ort(grad))
        fetches: list = []
        ctx.graph.before_run()
        ctx.agent.run_backward(grads, fetches, state)
        ctx.state = None
        result: list = [None] * (2 + ctx.n_feeds)
        for feed_index, value in zip(ctx.grad_slots, fetches):
            result[2 + feed_index] = _to_torch(value)
        return tuple(result)


# -- the module -------------------------------------------------------------------------------------

_INNER = "_original_module"
_MANY_EXPORTS = 8          # warn once when this many input signatures have been exported


class ORTModule(nn.Module):
    """Run ``module``'s forward and backward in onnxruntime; see the module docstring.

    ``providers`` and ``session_options`` go to every session created (default: the CPU provider,
    or the CUDA provider on the inputs' CUDA device). Parameters and buffers are the wrapped
    module's own, and ``state_dict`` / ``load_state_dict`` use its keys.
    """

    def __init__(self, module: nn.Module, *, providers: Sequence[Any] | None = None,
                 session_options: Any = None) -> None:
        if not isinstance(module, nn.Module):
            raise OrtInvalidArgument(f"ORTModule wraps a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, ORTModule):
            raise OrtInvalidArgument("the module is an ORTModule already")
        super().__init__()
        self._original_module = module
        self.register_state_dict_post_hook(ORTModule._strip_prefix)
        self.register_load_state_dict_pre_hook(ORTModule._add_prefix)
        self._providers = providers
        self._session_options = session_options
        self._graphs: dict[tuple, _Graph] = {}

    @property
    def module(self) -> nn.Module:
        """The wrapped module."""
        return self._original_module

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
        """How many input signatures have been exported so far."""
        return len(self._graphs)

    def _signature(self, leaves: list[torch.Tensor], template: Any) -> tuple:
        module = self._original_module
        return (tuple((tuple(t.shape), t.dtype, t.device) for t in leaves), repr(template),
                tuple(sub.training for sub in module.modules()),
                tuple(p.requires_grad for p in module.parameters()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self._original_module
        leaves: list[torch.Tensor] = []
        template = _flatten((tuple(args), dict(kwargs)), leaves, "an argument")
        key = self._signature(leaves, template)
        graph = self._graphs.get(key)
        if graph is None:
            devices = {t.device for t in leaves} | {p.device for p in module.parameters()}
            if len(devices) > 1:
                raise OrtInvalidArgument(f"ORTModule: inputs and parameters are on several devices: {devices}")
            device = devices.pop() if devices else torch.device("cpu")
            # the export must not move torch's generators: the masks drawn below are then the
            # ones eager would draw from the same seed
            cuda = [device.index or 0] if device.type == "cuda" else []
            with _EXPORT_LOCK, torch.random.fork_rng(devices=cuda):
                info, layout = _export(module, args, kwargs, OPSET, IR_VERSION)
            graph = _Graph(info, layout, self, device)
            self._graphs[key] = graph
            if len(self._graphs) == _MANY_EXPORTS:
                warnings.warn(f"ORTModule has exported {_MANY_EXPORTS} graphs for "
                              f"{type(module).__name__}: each new input shape (or dtype, device, "
                              "non-tensor argument, training mode) exports and builds anew, and "
                              "every graph stays cached; pad inputs to a few fixed shapes",
                              RuntimeWarning, stacklevel=2)
        layout = graph.layout
        state = [value for _, value in module.named_parameters()] + [value for _, value in module.named_buffers()]
        masks = [self._draw_mask(shape, stride, dtype, p, graph.device)
                 for shape, stride, dtype, p in graph.info["dropout_masks"]]
        everything = [*leaves, *state, *masks]
        feeds = [tensor for tensor, used in zip(everything, graph.used) if used]
        names = graph.info["input_names"]
        param_names = set(layout["param_names"])
        user_names = set(names[:sum(graph.used[:layout["n_inputs"]])])
        trainable = tuple(name for name, tensor in zip(names, feeds)
                          if name in param_names and tensor.requires_grad)
        input_gradients = tuple(name for name, tensor in zip(names, feeds)
                                if name in user_names and tensor.requires_grad
                                and tensor.dtype in _FLOAT_DTYPES)
        if torch.is_grad_enabled() and (trainable or input_gradients):
            agent, feed_order, non_diff = graph.agent(trainable, input_gradients)
            wanted = list(input_gradients) + list(trainable)
            grad_slots = [names.index(name) for name in wanted]
            plan = (agent, feed_order, non_diff, grad_slots)
            outputs = _ORTFunction.apply(graph, plan, *feeds)
        else:
            outputs = graph.run_inference(feeds)
        n_out = layout["n_outputs"]
        n_stats = layout["n_stats"]
        if n_stats:
            self._update_running_stats(layout["stat_modules"], outputs[n_out:n_out + n_stats])
        if layout["mutated_inputs"]:
            with torch.no_grad():
                for index, value in zip(layout["mutated_inputs"], outputs[n_out + n_stats:]):
                    everything[index].copy_(value)
        return _unflatten(layout["output_template"], outputs[:n_out])

    @staticmethod
    def _draw_mask(shape: tuple, stride: tuple, dtype: torch.dtype, p: float,
                   device: torch.device) -> torch.Tensor:
        # the draw torch's CPU dropout makes: bernoulli(1 - p) into empty_like(input), scaled
        mask = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        if p >= 1:
            return mask.zero_()
        return mask.bernoulli_(1 - p).div_(1 - p)

    @staticmethod
    def _update_running_stats(modules: list[Any], stats: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for index, bn in enumerate(modules):
                mean, var = stats[2 * index], stats[2 * index + 1]
                bn.num_batches_tracked.add_(1)
                if bn.momentum is None:
                    factor = 1.0 / float(bn.num_batches_tracked)
                else:
                    factor = bn.momentum
                bn.running_mean.mul_(1 - factor).add_(mean.to(bn.running_mean.dtype), alpha=factor)
                bn.running_var.mul_(1 - factor).add_(var.to(bn.running_var.dtype), alpha=factor)
