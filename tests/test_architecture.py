"""The README's architecture section against the real imports of ortagent's modules.

The section's "layers" block lists every module of ``ortagent/`` in one layer, bottom to top, and
the imports that go up a layer (at Python level, on first use; there are none). This test reads
the imports themselves -- ``cimport`` / ``import`` / ``include`` lines of the ``.pyx``/``.pxd``
files (a ``.pxd`` and its ``.pyx`` are one module; an included ``.pxi`` file counts as part of its
includer), the ``ast`` of the ``.py`` files -- and checks that:

* every module of the package is in exactly one layer, and every listed module exists;
* every import of an ``ortagent.*`` module reaches a module that exists;
* a ``cimport`` and a load-time import (at module level, not inside a function) reach only the
  module's own layer or a lower one;
* an import inside a function that reaches a higher layer is one of the block's upward edges,
  and every upward edge the block lists exists in the code;
* the module names the diagram and the module list of the section mention all exist;
* ``_core.pyx`` includes its concerns, and ``_core.pxd`` their declarations, in the order of
  the section's "_core includes" block, and the compiled ``_core`` exports no C function.

So a new module, a new upward import or a module moved in the code fails here until the README
says so.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT

ROOT = Path(REPO_ROOT)
PACKAGE = ROOT / "ortagent"
README = ROOT / "README.md"

_CYTHON_LINE = re.compile(
    r"^(?P<indent>[ \t]*)(?:"
    r"from\s+(?P<source>[\w.]+)\s+(?P<kind>cimport|import)\s+(?P<names>[^#]*)"
    r"|(?P<plain>cimport|import)\s+(?P<modules>[\w., ]+)"
    r"|include\s+[\"'](?P<include>[^\"']+)[\"'])")


class Edge:
    """One import of a module by another: C level (cimport) or Python level, at load time or
    inside a function (lazy)."""

    def __init__(self, source: str, target: str, c_level: bool, lazy: bool, where: str) -> None:
        self.source, self.target, self.c_level, self.lazy, self.where = source, target, c_level, lazy, where

    def __repr__(self) -> str:
        kind = "cimport" if self.c_level else "lazy import" if self.lazy else "import"
        return f"{self.source} -> {self.target} ({kind}, {self.where})"


def _module_name(path: Path) -> str:
    """The layer list's name of the module a file belongs to: ``_session`` for _session.pyx and
    _session.pxd, ``agent.py`` for a Python module, ``torch/`` for anything in a subpackage."""
    relative = path.relative_to(PACKAGE)
    if len(relative.parts) > 1:
        return relative.parts[0] + "/"
    if path.suffix == ".py":
        return path.name
    if path.suffix == ".pxd" and not path.with_suffix(".pyx").exists():
        return path.name                     # declarations only: _capi.pxd
    return path.stem


def package_modules() -> dict[str, list[Path]]:
    """Every module of the package and its source files (included files are added while the
    includer's imports are read)."""
    modules: dict[str, list[Path]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        if "__pycache__" in path.parts or path.suffix not in (".py", ".pyx", ".pxd"):
            continue
        modules.setdefault(_module_name(path), []).append(path)
    return modules


MISSING = "?"     # the prefix of a target that names no module of the package


def _target(dotted: str) -> str | None:
    """The module an absolute import of ``dotted`` reaches inside the package (``?name`` when
    no such module exists), or None outside the package."""
    parts = dotted.split(".")
    if parts[0] != "ortagent" or len(parts) < 2:
        return None
    first = PACKAGE / parts[1]
    if first.is_dir():
        return parts[1] + "/"
    if (first.with_suffix(".py")).exists():
        return parts[1] + ".py"
    if first.with_suffix(".pyx").exists():
        return parts[1]
    if first.with_suffix(".pxd").exists():
        return parts[1] + ".pxd"
    return MISSING + parts[1]


def _cython_edges(module: str, path: Path, seen: set[Path]) -> list[Edge]:
    edges = []
    seen.add(path)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = _CYTHON_LINE.match(line)
        if not match:
            continue
        where = f"{path.relative_to(ROOT)}:{number}"
        lazy = bool(match.group("indent"))
        if match.group("include"):
            included = (path.parent / match.group("include")).resolve()
            if included not in seen:
                edges += _cython_edges(module, included, seen)
            continue
        if match.group("source"):
            c_level = match.group("kind") == "cimport"
            if match.group("source") == "ortagent":          # from ortagent cimport _capi as ort
                names = re.findall(r"[A-Za-z_]\w*", match.group("names").split(" as ")[0])
                targets = [_target(f"ortagent.{name}") for name in names[:1]]
            else:
                targets = [_target(match.group("source"))]
        else:
            c_level = match.group("plain") == "cimport"
            targets = [_target(part.strip().split(" ")[0]) for part in match.group("modules").split(",")]
        edges += [Edge(module, target, c_level, lazy, where) for target in targets if target]
    return edges


def _python_edges(module: str, path: Path) -> list[Edge]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    relative = path.relative_to(PACKAGE)
    package = ["ortagent", *relative.parts[:-1]]
    edges = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                continue                                   # annotations only: never executed
            where = f"{path.relative_to(ROOT)}:{getattr(child, 'lineno', '?')}"
            if isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                dotted = ".".join([*base, *([child.module] if child.module else [])])
                if dotted == "ortagent":                     # from ortagent import _values
                    targets = [_target(f"ortagent.{alias.name}") for alias in child.names]
                else:
                    targets = [_target(dotted)]
                edges.extend(Edge(module, t, False, lazy, where) for t in targets if t)
            elif isinstance(child, ast.Import):
                edges.extend(Edge(module, t, False, lazy, where)
                             for t in (_target(alias.name) for alias in child.names) if t)
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return edges


def import_edges(*, everything: bool = False) -> list[Edge]:
    """Every import between two different modules of the package; with ``everything`` also the
    imports of a module by itself and of modules that do not exist."""
    edges = []
    for module, paths in package_modules().items():
        seen: set[Path] = set()
        for path in paths:
            if path.suffix == ".py":
                edges += _python_edges(module, path)
            elif path not in seen:
                edges += _cython_edges(module, path, seen)
    if everything:
        return edges
    return [edge for edge in edges if edge.target != edge.source and not edge.target.startswith(MISSING)]


def _architecture_section() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^### Architecture\n(.*?)(?=^#{2,3} |\Z)", text, flags=re.S | re.M)
    assert match, "README.md has no '### Architecture' section"
    return match.group(1)


def readme_layers() -> tuple[list[tuple[str, list[str]]], set[tuple[str, str]]]:
    """The layers block: [(layer, [modules])] bottom to top, and the upward edges it lists."""
    blocks = re.findall(r"```\n(layers, bottom to top.*?)```", _architecture_section(), flags=re.S)
    assert len(blocks) == 1, "the architecture section needs one block starting 'layers, bottom to top'"
    layers, upward = [], set()
    for line in blocks[0].splitlines()[1:]:
        if not line.strip():
            continue
        if line.startswith("up, on first use:"):
            if line.split(":", 1)[1].strip() == "none":
                continue
            for group in line.split(":", 1)[1].split(";"):
                source, targets = group.split("->")
                upward |= {(source.strip(), target.strip()) for target in targets.split(",")}
            continue
        name, *modules = line.split()
        layers.append((name, modules))
    return layers, upward


def layer_of() -> dict[str, int]:
    index: dict[str, int] = {}
    for number, (_, modules) in enumerate(readme_layers()[0]):
        for module in modules:
            assert module not in index, f"{module} is listed in two layers"
            index[module] = number
    return index


def test_every_module_is_in_one_layer():
    listed = layer_of()
    actual = set(package_modules())
    assert not actual - set(listed), f"modules missing from the README's layers block: {sorted(actual - set(listed))}"
    assert not set(listed) - actual, f"the README's layers block lists modules that do not exist: {sorted(set(listed) - actual)}"


def test_the_import_reader_sees_the_known_edges():
    """The reader of imports itself: edges every version of the package has."""
    edges = {(e.source, e.target, e.c_level) for e in import_edges()}
    assert ("_core", "_capi.pxd", True) in edges          # from _session.pxi, an included file
    assert ("_core", "_runtime", True) in edges
    assert ("_runtime", "errors.py", False) in edges
    assert ("agent.py", "_core", False) in edges
    assert any(e.lazy and not e.c_level for e in import_edges())


def test_every_import_of_the_package_resolves():
    """An import of a module that is gone (``ortagent._session`` after the merge) is an error,
    not an edge the other checks skip."""
    missing = [edge for edge in import_edges(everything=True) if edge.target.startswith(MISSING)]
    assert not missing, "imports of modules the package does not have:\n" + "\n".join(map(repr, missing))


def test_the_core_does_not_import_itself():
    """The concerns of _core reach each other by name, never through an import of _core."""
    own = [edge for edge in import_edges(everything=True) if edge.source == edge.target == "_core"]
    assert not own, "imports of _core inside _core:\n" + "\n".join(map(repr, own))


def test_no_load_time_import_goes_up_a_layer():
    layers = layer_of()
    names = [name for name, _ in readme_layers()[0]]
    wrong = [f"{edge!r}: layer {names[layers[edge.source]]} uses layer {names[layers[edge.target]]}"
             for edge in import_edges()
             if not edge.lazy or edge.c_level
             if layers[edge.target] > layers[edge.source]]
    assert not wrong, "imports against the README's layers:\n" + "\n".join(wrong)


def test_upward_imports_are_the_listed_ones():
    layers = layer_of()
    _, listed = readme_layers()
    actual = {(e.source, e.target) for e in import_edges()
              if e.lazy and not e.c_level and layers[e.target] > layers[e.source]}
    assert not actual - listed, f"upward imports the README does not list: {sorted(actual - listed)}"
    assert not listed - actual, f"upward imports the README lists that the code does not make: {sorted(listed - actual)}"


def test_modules_named_in_the_section_exist():
    section = _architecture_section()
    named = set(re.findall(r"\b(_?[a-z][a-z_]*)\.(?:pyx|pxd|pxi)\b", section))
    named |= set(re.findall(r"(?<!include/)ortagent/(_?[a-z][a-z_]*)\b(?!\.h\b)", section))   # not C headers
    missing = sorted(name for name in named
                     if not any((PACKAGE / f"{name}{suffix}").exists() for suffix in (".pyx", ".pxd", ".pxi", ".py", "")))
    assert not missing, f"the architecture section names modules that do not exist: {missing}"


@pytest.mark.parametrize("module", ["_core", "agent.py"])
def test_a_wrong_layer_list_is_caught(module):
    """The check can fail: moving a module to the bottom layer breaks a rule."""
    layers = layer_of()
    layers[module] = 0
    edges = [e for e in import_edges() if (not e.lazy or e.c_level) and layers[e.target] > layers[e.source]]
    assert edges, f"moving {module} to the bottom layer went unnoticed"


def readme_core_includes() -> list[str]:
    """The "_core includes" block: the concerns of _core, bottom to top."""
    blocks = re.findall(r"```\n(_core includes, bottom to top.*?)```", _architecture_section(), flags=re.S)
    assert len(blocks) == 1, "the architecture section needs one block starting '_core includes, bottom to top'"
    return [name for line in blocks[0].splitlines()[1:] if line.strip() for name in line.split()[1:]]


def _includes(path: Path) -> list[str]:
    return [match.group("include") for match in map(_CYTHON_LINE.match, path.read_text(encoding="utf-8").splitlines())
            if match and match.group("include")]


def test_core_includes_its_concerns_in_the_readme_order():
    listed = readme_core_includes()
    assert _includes(PACKAGE / "_core.pyx") == listed
    concerns = {path.name for path in PACKAGE.glob("*.pxi") if not path.name.endswith("_decl.pxi")}
    assert concerns == set(listed), f"concerns not in the README's block: {sorted(concerns - set(listed))}"


def test_core_declarations_follow_the_same_order():
    """_core.pxd includes the declarations of each concern that has some, in the same order."""
    expected = [name.replace(".pxi", "_decl.pxi") for name in readme_core_includes()
                if (PACKAGE / name.replace(".pxi", "_decl.pxi")).exists()]
    assert _includes(PACKAGE / "_core.pxd") == expected
    assert set(expected) == {path.name for path in PACKAGE.glob("*_decl.pxi")}


def test_the_core_exports_no_c_function():
    """_core.pxd declares types only: a module-level cdef function declared there would become a
    C interface other extensions could cimport (Cython lists it in __pyx_capi__). _runtime's
    declarations are that interface, so its table exists: the check can tell."""
    from ortagent import _core, _runtime

    assert not hasattr(_core, "__pyx_capi__"), sorted(getattr(_core, "__pyx_capi__", {}))
    assert "encode_text" in _runtime.__pyx_capi__


_FUNCTION_LINE = re.compile(r"^\s*(?:async\s+)?(?:def|cdef|cpdef)\b[^(=]*?(\w+)\s*\(")


def _enclosing_function(path: Path, line: int) -> str | None:
    lines = path.read_text(encoding="utf-8").splitlines()[:line]
    for text in reversed(lines):
        match = _FUNCTION_LINE.match(text)
        if match:
            return match.group(1)
    return None


def test_tracebacks_name_the_right_file_and_function():
    """A frame of _core names the included file and the function its line is in. Cython caches
    a frame's code object by line number; without C lines in the key (setup.py), a frame of one
    .pxi could take the cached file and name of another file's function on the same line (seen:
    copy_tensors in _device.pxi shown as the CUDA-options helper of _providers.pxi once a CUDA
    value had failed on a CPU-only machine)."""
    import traceback

    import numpy as np

    import ortagent

    host = ortagent.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))
    try:                                   # fails on a machine without CUDA: frames get cached
        ortagent.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32), "cuda")
    except ortagent.OrtError:
        pass
    calls = [(lambda: ortagent.copy_tensors([host], [host, host]),
              {("_device.pxi", "copy_tensors"), ("_values.pxi", "copy_value_tensors")}),
             (lambda: ortagent.OrtValue.ortvalue_from_shape_and_type([2], np.float32, "no device"),
              {("_values.pxi", "ortvalue_from_shape_and_type")}),
             (lambda: ortagent.InferenceSession(b"not a model"), {("_session.pxi", "__init__")})]
    for call, expected in calls:
        with pytest.raises(ortagent.OrtError) as caught:
            call()
        frames = [frame for frame in traceback.extract_tb(caught.value.__traceback__)
                  if frame.filename.endswith(".pxi")]
        seen = {(Path(frame.filename).name, frame.name.split(" (")[0].rsplit(".", 1)[-1]) for frame in frames}
        assert expected <= seen, f"expected frames {sorted(expected)}, the traceback has {sorted(seen)}"
        for frame in frames:
            name = frame.name.split(" (")[0].rsplit(".", 1)[-1]
            assert _enclosing_function(PACKAGE / Path(frame.filename).name, frame.lineno) == name, (
                f"frame {frame.filename}:{frame.lineno} says {frame.name!r}")
