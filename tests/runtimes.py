"""Other onnxruntime releases' shared libraries, for loader tests (API floor, version refusal).

`runtime_library("1.20.1")` downloads the CPU wheel of that release with pip (once, into
<repo>/.cache/ort-runtimes/) and extracts libonnxruntime.so.<version>. Returns None, with the
reason in `last_failure`, when that is impossible here (no network, no such wheel).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO_ROOT, ".cache", "ort-runtimes")
last_failure: dict[str, str] = {}


def runtime_library(version: str) -> str | None:
    target_dir = os.path.join(CACHE, version)
    target = os.path.join(target_dir, f"libonnxruntime.so.{version}")
    if os.path.exists(target):
        return target
    os.makedirs(target_dir, exist_ok=True)
    wheels = glob.glob(os.path.join(target_dir, "onnxruntime-*.whl"))
    if not wheels:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", target_dir, f"onnxruntime=={version}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        wheels = glob.glob(os.path.join(target_dir, "onnxruntime-*.whl"))
        if result.returncode != 0 or not wheels:
            last_failure[version] = (result.stderr or result.stdout).strip().splitlines()[-1:] and \
                (result.stderr or result.stdout).strip().splitlines()[-1] or "pip download failed"
            return None
    with zipfile.ZipFile(wheels[0]) as archive:
        members = [m for m in archive.namelist() if os.path.basename(m).startswith("libonnxruntime.so")]
        if not members:
            last_failure[version] = f"{os.path.basename(wheels[0])} holds no libonnxruntime.so"
            return None
        with archive.open(members[0]) as source, open(target + ".part", "wb") as sink:
            sink.write(source.read())
    os.replace(target + ".part", target)
    return target
