"""Build and run ort_floor, the C benchmark floor (see ort_floor.c).

    python -m benchmarks.c_floor.build [--out PATH]          build, print the program's path
    python -m benchmarks.c_floor.build --run MODEL [ARGS...]  build, then run it on MODEL

From Python: ``build()`` returns the program's path (rebuilt when a source is newer);
``run(model, *args)`` returns its JSON lines as dicts; ``default_library()`` finds the
onnxruntime library the same way ortagent's loader starts ($ORTAGENT_ORT_LIBRARY, then the
installed wheel's onnxruntime/capi/libonnxruntime.so*, located without importing it).
The program links no onnxruntime: only libdl.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
SOURCE = HERE / "ort_floor.c"
DEFAULT_OUT = REPO_ROOT / "build" / "c_floor" / "ort_floor"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]


class BuildError(RuntimeError):
    pass


def _sources() -> list[Path]:
    return [SOURCE, *sorted((REPO_ROOT / "include" / "ortagent").glob("*.h"))]


def build(out: Path | None = None, cc: str | None = None) -> Path:
    """Compile ort_floor (when missing or older than a source) and return its path.

    `cc` defaults to $CC, then gcc; $CFLAGS adds flags."""
    out = Path(out or DEFAULT_OUT)
    newest = max(p.stat().st_mtime for p in _sources())
    if out.is_file() and out.stat().st_mtime >= newest:
        return out
    compiler = cc or os.environ.get("CC") or "gcc"
    if shutil.which(compiler) is None:
        raise BuildError(f"no C compiler: {compiler} is not installed")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    cmd = [compiler, *CFLAGS, *shlex.split(os.environ.get("CFLAGS", "")),
           f"-I{REPO_ROOT / 'include'}", str(SOURCE), "-o", str(partial), "-ldl"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}\n{proc.stderr}")
    partial.replace(out)
    return out


def _version_key(path: Path):
    return [int(x) for x in re.findall(r"\d+", path.name.split(".so", 1)[-1])]


def default_library() -> Path | None:
    """$ORTAGENT_ORT_LIBRARY, else the installed wheel's libonnxruntime.so.<X.Y.Z>, else None."""
    given = os.environ.get("ORTAGENT_ORT_LIBRARY")
    if given:
        return Path(given)
    spec = importlib.util.find_spec("onnxruntime")   # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder, "capi").glob("libonnxruntime.so*"), key=_version_key)
        if found:
            return found[-1]
    return None


def run(model: Path | str, *args: str, library: Path | str | None = None,
        program: Path | None = None, timeout: float | None = None) -> list[dict]:
    """Run ort_floor on `model`; returns one dict per mode. Raises CalledProcessError (with
    the program's stderr) when it fails."""
    program = program or build()
    library = library or default_library()
    cmd = [str(program), str(model), *args]
    if library is not None:
        cmd += ["--lib", str(library)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def main(argv: list[str]) -> int:
    out = None
    if len(argv) >= 2 and argv[0] == "--out":
        out, argv = Path(argv[1]), argv[2:]
    try:
        program = build(out)
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    if argv and argv[0] == "--run":
        if len(argv) < 2:
            print("usage: python -m benchmarks.c_floor.build [--out PATH] --run MODEL [ARGS...]", file=sys.stderr)
            return 2
        cmd = [str(program), *argv[1:]]
        library = default_library()
        if library is not None and "--lib" not in argv:
            cmd += ["--lib", str(library)]
        return subprocess.call(cmd)
    print(program)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
