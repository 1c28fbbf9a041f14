"""The hand-written stubs match the compiled modules (mypy.stubtest), and typical use of the
public API type-checks under `mypy --strict`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

MODULES = ["ortagent._runtime", "ortagent._core"]


def mypy_available():
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not installed (it is in the test extra: pip install .[test])")


def run(command):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=600)


def test_package_ships_stubs_and_py_typed():
    package = os.path.join(REPO_ROOT, "ortagent")
    assert os.path.exists(os.path.join(package, "py.typed"))
    for module in MODULES:
        assert os.path.exists(os.path.join(package, module.split(".")[1] + ".pyi")), module


def test_stubs_match_the_extension_modules():
    mypy_available()
    result = run([sys.executable, "-m", "mypy.stubtest", *MODULES, "--mypy-config-file", "pyproject.toml",
                  "--allowlist", os.path.join("tests", "stubtest_allowlist.txt")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_typical_use_type_checks_strictly():
    mypy_available()
    result = run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                  "--config-file", "pyproject.toml", os.path.join("tests", "typing", "usage.py")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_strict_check_can_fail(tmp_path):
    """A misuse the stubs forbid must be reported (the check is not vacuous)."""
    mypy_available()
    bad = tmp_path / "bad_usage.py"
    bad.write_text("import ortagent\n"
                   "session = ortagent.InferenceSession(b'')\n"
                   "shape: str = session.get_inputs()[0].name.upper() + 1\n"
                   "value = ortagent.OrtValue.ortvalue_from_numpy(None)\n"
                   "n: str = value.shape()\n")
    result = run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                  "--config-file", "pyproject.toml", str(bad)])
    assert result.returncode != 0
    assert "Unsupported operand" in result.stdout or "incompatible" in result.stdout.lower()
