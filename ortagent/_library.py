"""Where to find the onnxruntime shared library, in the order ortagent tries them.

1. ``ORTAGENT_ORT_LIBRARY``: a path to a ``libonnxruntime.so*`` file. When set, nothing else is
   tried: an explicit choice that fails should fail loudly, not fall back to another runtime.
2. The installed ``onnxruntime`` / ``onnxruntime-gpu`` wheel: ``onnxruntime/capi/libonnxruntime.so*``
   located through the import system *without importing* the ``onnxruntime`` package (its
   import costs ~0.3 s and loads a second, separate copy of the runtime).
3. The system's ``libonnxruntime.so.1`` (resolved by the dynamic loader).

Pure Python and free of side effects; ``ortagent._runtime`` does the loading.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re

ENV_VARIABLE = "ORTAGENT_ORT_LIBRARY"
SYSTEM_SONAME = "libonnxruntime.so.1"

INSTALL_HINT = (
    "install onnxruntime with ortagent's extras: `pip install ortagent[cpu]` (onnxruntime) or "
    "`pip install ortagent[gpu]` (onnxruntime-gpu) -- never both in one environment -- or set "
    f"{ENV_VARIABLE} to the path of a libonnxruntime.so"
)


def _version_key(path: str) -> tuple[int, ...]:
    match = re.search(r"\.so((?:\.\d+)*)$", path)
    digits = match.group(1).strip(".") if match else ""
    return tuple(int(part) for part in digits.split(".") if part)


def wheel_library_paths() -> list[str]:
    """``libonnxruntime.so*`` files of the installed onnxruntime wheel, newest version first."""
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[str] = []
    for package_dir in spec.submodule_search_locations:
        found.extend(glob.glob(os.path.join(package_dir, "capi", "libonnxruntime.so*")))
    return sorted(set(found), key=_version_key, reverse=True)


def candidate_paths() -> tuple[list[str], bool]:
    """The paths to try, in order, and whether they come from the environment variable."""
    explicit = os.environ.get(ENV_VARIABLE)
    if explicit:
        return [explicit], True
    return wheel_library_paths() + [SYSTEM_SONAME], False
