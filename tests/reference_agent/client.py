"""Run onnxruntime-training 1.19.2's real TrainingAgent from the main test process.

The reference agent lives in a separate environment (onnxruntime-training 1.19.2 cannot share
one with onnxruntime 1.31 or numpy 2), so :func:`run_reference_agent` writes the model, feeds
and gradients to a temporary directory and runs ``run_agent_1192.py`` with that environment's
Python in a subprocess. :func:`reference_python` says which Python that is, or None when there
is none (tests then skip).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "run_agent_1192.py")
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
    grads: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    *,
    optimization_level: str | None = None,
    python: str | None = None,
    timeout: float = 300.0,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(forward outputs, gradients) from the real 1.19.2 agent.

    ``model`` is a ModelProto, serialized bytes or a path; ``feeds`` one array per graph input
    in graph-input order (a mapping is taken in its iteration order); ``grads`` one array per
    YieldOp output, in order. The forward outputs are the YieldOp inputs, the gradients the
    graph outputs. ``optimization_level`` is one of disable/basic/extended/all (default: the
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
