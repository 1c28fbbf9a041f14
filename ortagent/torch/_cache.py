"""Exported and built graphs kept on disk, so that a restarted job skips the export.

A directory holds one folder per *key*: a digest of the module's structure (its submodules'
classes and the bytecode of their ``forward`` methods, their ``extra_repr``, training modes,
parameter and buffer names, shapes, dtypes and ``requires_grad``), the call's signature (the
structure of the arguments, their constants, each tensor's rank, dtype, device type and
``requires_grad``) and the versions of torch, onnx, onnxscript, onnx-ad and ortagent. Inside,
``export-<n>/`` folders each hold an export for one family of input shapes: ``forward.onnx``,
``export.json`` (the record's layout and its shape guard) and ``training-<digest>.onnx`` for each
set of gradients built. Files are written to a temporary name and renamed, so a reader never
sees half a file; a folder that cannot be read is ignored.

What the key cannot see: code the forward calls outside the modules' ``forward`` methods, and
Python state of the module read by the forward (see :class:`~ortagent.torch.ORTModule`). Point
the cache at a fresh directory after changing such code.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import types
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._export import ExportedGraph, ShapeGuard
from ._rewrites import BatchStatistics, Site
from ._state import StateKey

__all__ = ["GraphStore", "ExportEntry", "structure_key"]

# (2: graphs that bake tensors in are no longer stored; those format 1 stored are not read)
_FORMAT = 2


def _code_digest(code: types.CodeType, digest: Any) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, digest)
        else:
            digest.update(_stable_repr(const).encode())


def _versions() -> str:
    import importlib.metadata

    import ortagent

    parts = [f"ortagent={ortagent.__version__}", f"torch={torch.__version__}"]
    for package in ("onnx", "onnxscript", "onnx-ad"):
        try:
            parts.append(f"{package}={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{package}=none")
    return ",".join(parts)


def _stable_repr(value: Any) -> str:
    """``repr(value)`` with the items of every set in a fixed order: a set of strings (names a
    module keeps in a set, read into the state key) lists them in an order that changes with the
    process's salted string hashes, and the key must be the same in a restarted job."""
    if isinstance(value, StateKey):
        return f"StateKey({_stable_repr(value.values)})"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({{{', '.join(sorted(_stable_repr(item) for item in value))}}})"
    if isinstance(value, tuple):
        return f"({''.join(_stable_repr(item) + ', ' for item in value)})"
    if isinstance(value, list):
        return f"[{', '.join(_stable_repr(item) for item in value)}]"
    return repr(value)


def structure_key(module: nn.Module, signature: Any, extra: str = "") -> str:
    """The digest naming the folder of ``module`` called with ``signature``."""
    digest = hashlib.sha256()
    digest.update(f"format={_FORMAT};{_versions()};{extra}".encode())
    seen: set[type] = set()
    for name, sub in module.named_modules():
        cls = type(sub)
        digest.update(f"|{name}:{cls.__module__}.{cls.__qualname__}:{sub.training}:{sub.extra_repr()}".encode())
        if cls not in seen:
            seen.add(cls)
            forward = getattr(cls, "forward", None)
            code = getattr(forward, "__code__", None)
            if code is not None:
                _code_digest(code, digest)
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        digest.update(f"|{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.requires_grad}".encode())
    digest.update(_stable_repr(signature).encode())
    return digest.hexdigest()[:32]


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _layout_json(exported: ExportedGraph) -> dict:
    return {
        "format": _FORMAT,
        "input_names": list(exported.input_names),
        "output_names": list(exported.output_names),
        "used": list(exported.used),
        "n_user": exported.n_user,
        "state_names": list(exported.state_names),
        "param_names": sorted(exported.param_names),
        "n_draw_inputs": exported.n_draw_inputs,
        "n_outputs": exported.n_outputs,
        "statistics": [asdict(entry) for entry in exported.statistics],
        "counters": list(exported.counters),
        "mutated": list(exported.mutated),
        "detached_outputs": list(exported.detached_outputs),
        "guard": {"dims": [None if dims is None else list(dims) for dims in exported.guard.dims],
                  "ranges": [list(entry) for entry in exported.guard.ranges]},
    }


def _exported_from(layout: dict, model: Any, sites: Sequence[Site]) -> ExportedGraph:
    guard = layout["guard"]
    return ExportedGraph(
        model=model,
        input_names=tuple(layout["input_names"]),
        output_names=tuple(layout["output_names"]),
        used=tuple(bool(used) for used in layout["used"]),
        n_user=int(layout["n_user"]),
        state_names=tuple(layout["state_names"]),
        param_names=frozenset(layout["param_names"]),
        n_draw_inputs=int(layout["n_draw_inputs"]),
        sites=tuple(sites),
        n_outputs=int(layout["n_outputs"]),
        statistics=tuple(BatchStatistics(**entry) for entry in layout["statistics"]),
        counters=tuple(str(name) for name in layout["counters"]),
        mutated=tuple(int(index) for index in layout["mutated"]),
        detached_outputs=tuple(int(index) for index in layout["detached_outputs"]),
        guard=ShapeGuard(tuple(None if dims is None else tuple(dims) for dims in guard["dims"]),
                         tuple((str(s), int(lo), None if hi is None else int(hi)) for s, lo, hi in guard["ranges"])),
    )


class ExportEntry:
    """One export folder: the forward model, its layout and the training graphs built from it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def load_training_graph(self, key: tuple) -> Any:
        path = self.folder / f"training-{_digest(key)}.onnx"
        if not path.is_file():
            return None
        import onnx

        try:
            return onnx.load_model_from_string(path.read_bytes())
        except Exception:
            return None

    def store_training_graph(self, key: tuple, graph: Any) -> None:
        try:
            _write(self.folder / f"training-{_digest(key)}.onnx", graph.SerializeToString())
        except OSError:
            pass                        # a cache that cannot be written is no cache, not an error


def _digest(key: Any) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:24]


class GraphStore:
    """The on-disk cache of one directory."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def find(self, key: str, shapes: Sequence[tuple[int, ...]]) -> tuple[ExportEntry, dict, Any] | None:
        """An export of ``key`` whose guard accepts ``shapes``: its folder, layout and model."""
        import onnx

        folder = self.directory / key
        if not folder.is_dir():
            return None
        for export_folder in sorted(folder.glob("export-*")):
            try:
                layout = json.loads((export_folder / "export.json").read_text())
                if layout.get("format") != _FORMAT:
                    continue
                guard = _exported_from(layout, None, ()).guard
                if not guard.accepts(shapes):
                    continue
                model = onnx.load_model_from_string((export_folder / "forward.onnx").read_bytes())
            except (OSError, ValueError, KeyError, TypeError):
                continue
            except Exception:       # onnx's DecodeError: a damaged file
                continue
            return ExportEntry(export_folder), layout, model
        return None

    def store(self, key: str, exported: ExportedGraph) -> ExportEntry | None:
        folder = self.directory / key
        try:
            folder.mkdir(parents=True, exist_ok=True)
            index = len(list(folder.glob("export-*")))
            while True:
                export_folder = folder / f"export-{index}"
                try:
                    export_folder.mkdir()
                    break
                except FileExistsError:
                    index += 1
            _write(export_folder / "forward.onnx", exported.model.SerializeToString())
            _write(export_folder / "export.json", json.dumps(_layout_json(exported)).encode())
        except OSError:
            return None
        return ExportEntry(export_folder)

    @staticmethod
    def exported(layout: dict, model: Any, sites: Sequence[Site]) -> ExportedGraph:
        return _exported_from(layout, model, sites)
