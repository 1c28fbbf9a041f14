"""Train a ``torch.nn.Module`` with onnxruntime: :class:`ORTModule`.

``ORTModule(module)`` wraps a module. Its first call exports the module with torch's dynamo
ONNX exporter (parameters and buffers as named graph inputs; at the call's shapes, and with
symbolic dimensions once a call comes at other shapes: ``dynamic``), builds the training graph with :func:`ortagent.training.build_training_graph`,
and runs the forward and, on ``.backward()``, the backward in onnxruntime through a
:class:`~ortagent.TrainingAgent` (state API, one :class:`~ortagent.PartialGraphExecutionState`
per forward, held by a ``torch.autograd.Function``). Gradients reach ``param.grad`` through
torch's own AccumulateGrad, so optimizers, ``zero_grad``, gradient accumulation and hooks
(DDP's included) work as on the wrapped module. In eval mode, or under ``torch.no_grad()``,
the forward model alone runs in an :class:`~ortagent.InferenceSession`.

One export serves every call with the same structure of arguments, constants, tensor ranks,
dtypes, devices, ``requires_grad`` flags, training modes and plain module state (numbers,
flags, strings of the module, its submodules and their configs), at any shapes it accepts (see
:class:`~ortagent.torch._export.ShapeGuard`); a call it does not accept exports again. The
exports kept are bounded (least recently used out), and can be kept on disk across runs
(``cache_dir``).

Tensors cross between torch and onnxruntime only by DLPack, without copies (inputs,
parameters, outputs, output gradients and parameter gradients); a non-contiguous tensor is
made contiguous first. ``import ortagent`` never imports torch: this package imports it.

The modules, one concern each:

* :mod:`._trees`: arguments and results as flat tensor lists (torch's pytree, so output
  containers keep their types);
* :mod:`._rewrites`: the training semantics decided before the export (random draws made by
  torch and fed to the graph, BatchNorm's batch statistics, torch's non-differentiable values),
  active only in the tracing thread;
* :mod:`._export`: the export and its record, :class:`~._export.ExportedGraph`;
* :mod:`._cache`: exported and built graphs on disk;
* :mod:`._state`: the wrapped module's plain Python state, read on each call as part of the
  export's key;
* :mod:`._threads`: the CPUs shared between torch's OpenMP workers and onnxruntime's
  intra-op threads (:func:`default_session_options`);
* :mod:`._bridge`: the sessions of one export and the autograd function;
* :mod:`._module`: :class:`ORTModule`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from . import _trees
from ._export import IR_VERSION, OPSET, export
from ._module import ORTModule
from ._rewrites import differentiate_forward_of
from ._threads import default_session_options

__all__ = ["ORTModule", "default_session_options", "differentiate_forward_of", "export_forward_model", "OPSET", "IR_VERSION"]


def export_forward_model(module: nn.Module, args: tuple = (), kwargs: dict | None = None) -> Any:
    """The forward ONNX model :class:`ORTModule` trains for ``module(*args, **kwargs)`` (in the
    module's current training mode), with ortagent's StopGradient markers where torch would not
    differentiate, and its record (:class:`~ortagent.torch._export.ExportedGraph`: input and
    output names, the random draws fed as inputs, batch statistics, the shape guard)."""
    exported, _ = export(module, _trees.flatten((tuple(args), dict(kwargs or {})), "the arguments"))
    return exported
