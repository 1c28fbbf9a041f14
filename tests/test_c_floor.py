"""The C benchmark floor (benchmarks/c_floor/ort_floor.c) builds, runs and reports sane JSON.

No timing is asserted: only that every mode ran the requested number of calls, and that
failures (a missing model, a library that is not onnxruntime) exit non-zero with a message.
Skips with the reason when gcc or an onnxruntime library is missing.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.c_floor import build as floor
from conftest import api_newest
from ortagent_testkit import bench_models as models

MODES = ["run", "run-read", "run-prealloc", "binding", "binding-prealloc", "is-tensor", "noop"]




@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None and not os.environ.get("CC"):
        pytest.skip("gcc is not installed: ort_floor is a C program")
    try:
        return floor.build(tmp_path_factory.mktemp("c_floor") / "ort_floor")
    except floor.BuildError as exc:
        pytest.fail(f"ort_floor does not build:\n{exc}")


@pytest.fixture(scope="module")
def library() -> Path:
    lib = floor.default_library()
    if lib is None:
        pytest.skip("no onnxruntime library: set ORTAGENT_ORT_LIBRARY or install onnxruntime")
    if not lib.is_file():
        pytest.skip(f"ORTAGENT_ORT_LIBRARY={lib} is not a file")
    return lib


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    models.save_all(folder)
    return folder


@pytest.mark.parametrize("name, inputs, outputs", [("identity", 1, 1), ("mlp", 1, 1),
                                                   ("multi_io", 10, 10)])
def test_floor_reports_every_mode(program, library, model_dir, name, inputs, outputs):
    results = floor.run(model_dir / f"{name}.onnx", "--iterations", "20", "--repeat", "3",
                        "--warmup", "2", library=library, program=program, timeout=300)
    assert [r["mode"] for r in results] == MODES
    for r in results:
        assert r["model"] == f"{name}.onnx"
        assert r["iterations"] == 20
        assert r["repeat"] == 3
        assert len(r["samples"]) == 3
        assert all(math.isfinite(s) and s > 0 for s in r["samples"]), r
        assert min(r["samples"]) <= r["ns_per_call"] <= max(r["samples"])
        assert r["min_ns_per_call"] == min(r["samples"])
        assert (r["inputs"], r["outputs"]) == (inputs, outputs)
        assert r["intra_op_threads"] == 1 and r["execution_mode"] == "sequential"
        assert r["opt_level"] == "all"
        assert r["ort_version"].startswith("1.")
        assert r["api_version"] == min(int(r["ort_version"].split(".")[1]), api_newest())


def test_floor_calibrates_iterations_from_seconds(program, library, model_dir):
    (r,) = floor.run(model_dir / "identity.onnx", "--modes", "binding", "--seconds", "0.01",
                     "--repeat", "2", library=library, program=program, timeout=300)
    assert r["mode"] == "binding" and r["iterations"] >= 1 and len(r["samples"]) == 2


def test_floor_options_reach_the_session(program, library, model_dir):
    (r,) = floor.run(model_dir / "add.onnx", "--modes", "run", "--iterations", "5", "--repeat",
                     "1", "--threads", "2", "--parallel", "--opt-level", "basic", "--config",
                     "session.intra_op.allow_spinning=0", library=library, program=program,
                     timeout=300)
    assert (r["intra_op_threads"], r["execution_mode"], r["opt_level"]) == (2, "parallel",
                                                                            "basic")
    assert (r["inputs"], r["outputs"]) == (2, 1)


def _fails(program: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout
    assert proc.stdout == ""
    return proc


def test_floor_fails_on_missing_model(program, library, tmp_path):
    proc = _fails(program, str(tmp_path / "missing.onnx"), "--lib", str(library))
    assert "CreateSession" in proc.stderr and "ORT_NO_SUCHFILE" in proc.stderr, proc.stderr


def test_floor_fails_on_invalid_model(program, library, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    proc = _fails(program, str(bad), "--lib", str(library))
    assert "CreateSession" in proc.stderr, proc.stderr


def test_floor_fails_on_a_library_that_is_not_onnxruntime(program, model_dir):
    libc = next((p for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"), Path("/lib64/libc.so.6"),
                             Path("/usr/lib/libc.so.6")) if p.is_file()), None)
    if libc is None:
        pytest.skip("no libc.so.6 found to stand in for a wrong library")
    proc = _fails(program, str(model_dir / "identity.onnx"), "--lib", str(libc))
    assert "OrtGetApiBase" in proc.stderr, proc.stderr


def test_floor_fails_on_usage_errors(program, library, model_dir):
    model = str(model_dir / "identity.onnx")
    assert _fails(program, model, "--lib", str(library), "--modes", "bogus").returncode == 2
    assert _fails(program, model, "--lib", str(library), "--iterations", "0").returncode == 2
    assert _fails(program, "--lib", str(library)).returncode == 2


def test_floor_needs_a_library(program, model_dir, monkeypatch):
    monkeypatch.delenv("ORTAGENT_ORT_LIBRARY", raising=False)
    proc = subprocess.run([str(program), str(model_dir / "identity.onnx")], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "ORTAGENT_ORT_LIBRARY" in proc.stderr, proc.stderr


def test_models_have_explicit_ir_and_opset():
    for name, builder in models.MODELS.items():
        m = builder()
        assert m.ir_version == models.IR_VERSION, name
        assert [(o.domain, o.version) for o in m.opset_import] == [("", models.OPSET)], name
