"""Shared fixtures: onnxruntime's own Python module as the reference, live-handle accounting, and
the CUDA / torch skips (with their reasons)."""

from __future__ import annotations

import functools
import gc
import os
import sys

import pytest

# The model builders the tests share with the benchmarks are the ortagent_testkit package at the
# repository root, found through pyproject.toml's pytest ``pythonpath``; this folder's own helpers
# (agent_driver, reliability, ...) through pytest's rootdir-relative import of this conftest.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def load_file_module(name: str, path):
    """Import a Python file that lives outside any package (tests/abi_check, demo/), once."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def api_newest() -> int:
    """ORTAGENT_API_NEWEST of include/ortagent/ort_abi.h: the OrtApi version ortagent asks for
    from runtimes that have it."""
    import re

    with open(os.path.join(REPO_ROOT, "include", "ortagent", "ort_abi.h")) as header:
        return int(re.search(r"#define ORTAGENT_API_NEWEST (\d+)", header.read()).group(1))


@pytest.fixture(scope="session")
def ort_ref():
    """onnxruntime's own Python module (the reference the binding is compared against)."""
    return pytest.importorskip("onnxruntime", reason="onnxruntime's Python module is not installed")


def reference_session(ort_ref, model, **kwargs):
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort_ref.InferenceSession(data, providers=["CPUExecutionProvider"], **kwargs)


@pytest.fixture
def no_leaks():
    """Assert that the test leaves as many live ORT handles as it found."""
    import ortagent

    gc.collect()
    before = ortagent.live_handles()
    yield
    gc.collect()
    after = ortagent.live_handles()
    leaked = {k: after[k] - before[k] for k in before if after[k] != before[k]}
    assert not leaked, f"live handles changed: {leaked}"


@functools.lru_cache(maxsize=None)
def cuda_unavailable_reason() -> str | None:
    """None when a CUDA execution provider can be created, else why not."""
    import ortagent

    if "CUDAExecutionProvider" not in ortagent.get_available_providers():
        return "this onnxruntime build has no CUDAExecutionProvider"
    previous = ortagent.get_default_logger_severity()
    ortagent.set_default_logger_severity(4)   # the probe's failure is reported here, not logged
    try:
        from ortagent_testkit import onnx_models

        with ortagent.strict_providers():
            ortagent.InferenceSession(onnx_models.identity().SerializeToString(),
                                      providers=["CUDAExecutionProvider"])
    except ortagent.OrtError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"no CUDA execution provider can be created here: {first_line}"
    finally:
        ortagent.set_default_logger_severity(previous)
    return None


def pytest_collection_modifyitems(config, items):
    cuda_items = [item for item in items if "cuda" in item.keywords]
    if cuda_items:
        reason = cuda_unavailable_reason()
        if reason:
            for item in cuda_items:
                item.add_marker(pytest.mark.skip(reason=reason))
    torch_items = [item for item in items if "torch" in item.keywords]
    if torch_items:
        try:
            import torch  # noqa: F401
        except ImportError:
            for item in torch_items:
                item.add_marker(pytest.mark.skip(
                    reason="torch is not installed (make test TORCH=1, which .ci/run sets, installs "
                           "its CPU build)"))
