"""The README's Python blocks run, in order, in one namespace (as a reader would paste them).

A block whose first line is ``# requires: torch``, ``# requires: ortmodule`` (torch and
onnxscript) or ``# requires: cuda`` is skipped, with the
reason, where that is unavailable; the other blocks still run.
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import REPO_ROOT, cuda_unavailable_reason

README = os.path.join(REPO_ROOT, "README.md")


def python_blocks():
    text = open(README, encoding="utf-8").read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def unavailable(requirement: str) -> str | None:
    if requirement == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            return "torch is not installed"
        return None
    if requirement == "ortmodule":          # ortagent.torch: torch and the dynamo exporter's onnxscript
        import importlib.util

        missing = [name for name in ("torch", "onnxscript") if importlib.util.find_spec(name) is None]
        return f"{' and '.join(missing)} not installed" if missing else None
    if requirement == "cuda":
        return cuda_unavailable_reason()
    return f"unknown requirement {requirement!r}"


def test_readme_has_examples():
    assert len(python_blocks()) >= 8


def test_readme_python_blocks_run(capsys):
    namespace: dict = {"__name__": "readme"}
    skipped = []
    for number, block in enumerate(python_blocks(), 1):
        first = block.splitlines()[0] if block.strip() else ""
        match = re.match(r"#\s*requires:\s*(\w+)", first)
        if match:
            reason = unavailable(match.group(1))
            if reason:
                skipped.append(f"block {number} ({match.group(1)}): {reason}")
                continue
        try:
            exec(compile(block, f"README.md block {number}", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"README block {number} failed: {type(exc).__name__}: {exc}\n{block}")
    with capsys.disabled():
        for line in skipped:
            print(f"\nskipped README {line}")
