"""Run onnxruntime-training 1.19.2's real TrainingAgent from the main test process.

The reference agent lives in a separate environment (onnxruntime-training 1.19.2 cannot share
one with onnxruntime 1.31 or numpy 2), so :func:`run_reference_agent` writes the model, feeds
and gradients to a temporary directory and runs ``run_agent_1192.py`` with that environment's
Python in a subprocess. :func:`reference_python` says which Python that is, or None when there
is none (tests then skip).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "run_agent_1192.py")
BUILD_SCRIPT = os.path.join(HERE, "build_ortmodule_graph.py")
GRAPH_CACHE = os.path.join(REPO_ROOT, ".cache", "ortmodule_graphs")
ENV_VAR = "ORTAGENT_REF_AGENT_PYTHON"
DEFAULT_VENV = ".venv-refagent"


class ReferenceAgentError(RuntimeError):
    """The reference agent's subprocess failed (exception, abort or signal)."""

    def __init__(self, message: str, returncode: int, stderr: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


def reference_python() -> str | None:
    """The Python of an onnxruntime-training 1.19.2 environment, or None.

    ``$ORTAGENT_REF_AGENT_PYTHON`` when set (it must exist), else ``<repo>/.venv-refagent/bin/python``
    when that exists.
    """
    configured = os.environ.get(ENV_VAR)
    if configured:
        return configured if os.path.exists(configured) else None
    candidate = os.path.join(REPO_ROOT, DEFAULT_VENV, "bin", "python")
    return candidate if os.path.exists(candidate) else None


def describe_returncode(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _as_bytes(model) -> bytes:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as handle:
            return handle.read()
    return model.SerializeToString()


def _ordered(values) -> list[np.ndarray]:
    if isinstance(values, Mapping):
        values = list(values.values())
    return [np.asarray(value) for value in values]


def run_reference_agent(
    model,
    feeds: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    grads: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None,
    *,
    optimization_level: str | None = None,
    python: str | None = None,
    timeout: float = 300.0,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(forward outputs, gradients) from the real 1.19.2 agent.

    ``model`` is a ModelProto, serialized bytes or a path; ``feeds`` one array per graph input
    in graph-input order (a mapping is taken in its iteration order); ``grads`` one array per
    YieldOp output, in order, or None to run the forward only (the gradients list comes back
    empty). The forward outputs are the YieldOp inputs, the gradients the graph outputs. ``optimization_level`` is one of disable/basic/extended/all (default: the
    session default). Raises :class:`ReferenceAgentError` when the subprocess fails.
    """
    python = python or reference_python()
    if python is None:
        raise FileNotFoundError(
            f"no onnxruntime-training 1.19.2 Python: set {ENV_VAR} or create {DEFAULT_VENV} in the repository"
        )
    with tempfile.TemporaryDirectory(prefix="ortagent-refagent-") as directory:
        with open(os.path.join(directory, "model.onnx"), "wb") as handle:
            handle.write(_as_bytes(model))
        np.savez(os.path.join(directory, "feeds.npz"), *_ordered(feeds))
        if grads is not None:
            np.savez(os.path.join(directory, "grads.npz"), *_ordered(grads))
        command = [python, SCRIPT, directory]
        if optimization_level is not None:
            command += ["--optimization-level", optimization_level]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if completed.returncode != 0:
            tail = completed.stderr[-4000:]
            raise ReferenceAgentError(
                f"the reference agent failed ({describe_returncode(completed.returncode)}):\n{tail}",
                completed.returncode, completed.stderr,
            )
        with np.load(os.path.join(directory, "outputs.npz")) as archive:
            forward = [archive[key] for key in sorted(k for k in archive.files if k.startswith("forward_"))]
            backward = [archive[key] for key in sorted(k for k in archive.files if k.startswith("backward_"))]
    return forward, backward


def build_ortmodule_training_graph(
    forward_model,
    trainable: Iterable[str],
    input_names_require_grad: Iterable[str] = (),
    *,
    buffers: Iterable[str] = (),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    options: Mapping[str, object] | None = None,
    python: str | None = None,
    timeout: float = 300.0,
    cache: bool = True,
    with_info: bool = False,
):
    """The training graph ORTModule 1.19.2 would run for ``forward_model``, built by its C++
    graph builder in the reference environment (``build_ortmodule_graph.py``, which says what
    ORTModule does and how it is reproduced).

    ``forward_model`` is a ModelProto, bytes or a path; ``trainable`` names the parameters
    (initializers, lifted to graph inputs after the user inputs, as ORTModule's exporter writes
    them); ``buffers`` names initializers lifted without a gradient; ``input_names_require_grad``
    the user inputs that need a gradient; ``input_shapes`` turns on ``use_static_shape``;
    ``options`` adds other keys of the script's config (``symbolic_shape_infer``,
    ``enable_compute_optimizer``, ...). The result is cached under
    ``<repo>/.cache/ortmodule_graphs/<sha256 of model, config and script>.onnx``. Returns the
    ModelProto, or ``(model, info)`` with ``with_info`` (info: the builder's GraphInfo and notes).
    Raises :class:`ReferenceAgentError` when the builder fails.
    """
    import onnx

    config: dict = {
        "trainable": list(trainable),
        "buffers": list(buffers),
        "input_names_require_grad": list(input_names_require_grad),
    }
    if input_shapes is not None:
        config["input_shapes"] = {name: [int(d) for d in shape] for name, shape in input_shapes.items()}
    config.update(options or {})
    model_bytes = _as_bytes(forward_model)
    with open(BUILD_SCRIPT, "rb") as handle:
        script_bytes = handle.read()
    digest = hashlib.sha256()
    for part in (model_bytes, json.dumps(config, sort_keys=True).encode(), script_bytes):
        digest.update(hashlib.sha256(part).digest())
    key = digest.hexdigest()
    graph_path = os.path.join(GRAPH_CACHE, key + ".onnx")
    info_path = os.path.join(GRAPH_CACHE, key + ".json")

    if not (cache and os.path.exists(graph_path) and os.path.exists(info_path)):
        python = python or reference_python()
        if python is None:
            raise FileNotFoundError(
                f"no onnxruntime-training 1.19.2 Python: set {ENV_VAR} or create {DEFAULT_VENV} in the repository"
            )
        os.makedirs(GRAPH_CACHE, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="ortagent-ortmodule-") as directory:
            forward_path = os.path.join(directory, "forward.onnx")
            config_path = os.path.join(directory, "config.json")
            out_path = os.path.join(directory, "training.onnx")
            out_info = os.path.join(directory, "info.json")
            with open(forward_path, "wb") as handle:
                handle.write(model_bytes)
            with open(config_path, "w") as handle:
                json.dump(config, handle)
            completed = subprocess.run(
                [python, BUILD_SCRIPT, forward_path, config_path, out_path, "--info", out_info],
                capture_output=True, text=True, timeout=timeout,
            )
            if completed.returncode != 0:
                raise ReferenceAgentError(
                    f"ORTModule's graph builder failed ({describe_returncode(completed.returncode)}):\n"
                    f"{completed.stderr[-4000:]}",
                    completed.returncode, completed.stderr,
                )
            if not cache:
                with open(out_path, "rb") as handle, open(out_info) as info_handle:
                    model, info = onnx.load_from_string(handle.read()), json.load(info_handle)
                return (model, info) if with_info else model
            # write-then-rename: concurrent builders of one key never see a partial file
            for source, target in ((out_info, info_path), (out_path, graph_path)):
                partial = f"{target}.{os.getpid()}.tmp"
                with open(source, "rb") as src, open(partial, "wb") as dst:
                    dst.write(src.read())
                os.replace(partial, target)
    model = onnx.load(graph_path)
    if not with_info:
        return model
    with open(info_path) as handle:
        return model, json.load(handle)
