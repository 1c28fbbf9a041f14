"""Helpers shared by the ABI tests: running gcc, reading declarations through the C
preprocessor, parsing the genuine OrtApi table, and reporting lines in pytest's summary."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INCLUDE = REPO_ROOT / "include"
HERE = Path(__file__).resolve().parent
C_STD = ["-std=c11", "-Wall", "-Werror"]


def gcc() -> str:
    path = shutil.which("gcc")
    if path is None:
        pytest.skip("gcc is not installed: the ABI checks compile C")
    return path


def compile_c(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([gcc(), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def preprocess(source: str, includes: list[Path], comments: bool = False) -> str:
    """Text of `source` after the C preprocessor (no line markers)."""
    args = ["-E", "-P", *C_STD, "-x", "c", *(f"-I{p}" for p in includes)]
    if comments:
        args.append("-C")
    proc = subprocess.run([gcc(), *args, "-"], input=source, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"preprocessing failed:\n{proc.stderr}")
    return proc.stdout


# ---- our declarations -------------------------------------------------------------------------

@dataclass(frozen=True)
class Declared:
    name: str
    slot: int
    since: int
    group: str      # "floor" or "newer"
    ret: str


# X-lists of ort_abi.h by table: list macro -> group name
API_LISTS = {"ORTAGENT_ORT_FLOOR_FUNCTIONS": "floor", "ORTAGENT_ORT_NEWER_FUNCTIONS": "newer",
             "ORTAGENT_ORT_NEWER_VALUE_FUNCTIONS": "value",
             "ORTAGENT_ORT_NEWER_VOID_FUNCTIONS": "void"}
COMPILE_LISTS = {"ORTAGENT_COMPILE_FUNCTIONS": "compile",
                 "ORTAGENT_COMPILE_VOID_FUNCTIONS": "compile_void"}


def declared_functions(include: Path = INCLUDE, table: str = "OrtApi") -> list[Declared]:
    """Every function of the X-lists of one table (OrtApi: ORTAGENT_ORT_*_FUNCTIONS;
    OrtCompileApi: ORTAGENT_COMPILE_*_FUNCTIONS), as the preprocessor sees them."""
    lists = API_LISTS if table == "OrtApi" else COMPILE_LISTS
    src = '#include "ortagent/ort_abi.h"\n' + "".join(
        f"#define X_{group}(slot, since, ret, name, params) @FN {group} name slot since ret @END\n"
        f"{macro}(X_{group})\n" for macro, group in lists.items())
    out = " ".join(preprocess(src, [include]).split())
    found = []
    for m in re.finditer(r"@FN (\w+) (\w+) (\d+) (\d+) (.*?) @END", out):
        found.append(Declared(m.group(2), int(m.group(3)), int(m.group(4)), m.group(1),
                              m.group(5).replace(" *", "*")))
    if not found:
        raise AssertionError(f"no {table} function found in ort_abi.h's X-lists")
    return found


def declared_enums(include: Path = INCLUDE) -> dict[str, list[tuple[str, int]]]:
    """Every enum of ORTAGENT_ENUMS and ORTAGENT_NEWER_ENUMS: type -> [(enumerator, value)]."""
    src = ('#include "ortagent/ort_abi.h"\n'
           "#define E(name, value) @EV name (value)\n"
           "#define L(type) @ET type ORTAGENT_ENUM_##type(E)\n"
           "#define N(type, since) L(type)\n"
           "ORTAGENT_ENUMS(L)\nORTAGENT_NEWER_ENUMS(N)\n")
    out = " ".join(preprocess(src, [include]).split())
    enums: dict[str, list[tuple[str, int]]] = {}
    current = None
    for m in re.finditer(r"@ET (\w+)|@EV (\w+) \(\s*(-?\s*\d+)\s*\)", out):
        if m.group(1):
            current = enums.setdefault(m.group(1), [])
        else:
            current.append((m.group(2), int(m.group(3).replace(" ", ""))))
    return enums


def newer_enum_versions(include: Path = INCLUDE) -> dict[str, int]:
    """type -> the API version that added it, for the enums of ORTAGENT_NEWER_ENUMS."""
    src = ('#include "ortagent/ort_abi.h"\n'
           "#define N(type, since) @NE type since @END\nORTAGENT_NEWER_ENUMS(N)\n")
    out = " ".join(preprocess(src, [include]).split())
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"@NE (\w+) (\d+) @END", out)}


def declared_macros(names: list[str], include: Path, header: str) -> dict[str, str]:
    src = f'#include "{header}"\n' + "".join(f'@M "{n}" {n} @END\n' for n in names)
    out = " ".join(preprocess(src, [include]).split())
    return {m.group(1): m.group(2) for m in re.finditer(r'@M "(\w+)" (.*?) @END', out)}


# ---- the genuine header -----------------------------------------------------------------------

@dataclass(frozen=True)
class Member:
    name: str
    since: int | None   # from the member's "\since Version 1.N" doc comment, when it has one


def header_api_version(header: Path) -> int:
    out = preprocess(f'#include "{header}"\n@V ORT_API_VERSION @END\n', [header.parent])
    m = re.search(r"@V (\d+) @END", out)
    if not m:
        raise AssertionError(f"{header} defines no numeric ORT_API_VERSION")
    return int(m.group(1))


_SINCE = re.compile(r"\\since\s+Version\s+1\.(\d+)")


def genuine_members(header: Path, struct: str = "OrtApi") -> list[Member]:
    """The members of the genuine `struct OrtApi`, in order, each with its documented
    "\\since Version 1.N" when the doc comment right before it has one.

    The header is preprocessed with comments kept (so every declaration macro is expanded
    into a plain function pointer member); the member name is the identifier in the first
    `(*name)` of each declaration. The caller validates the result with the compiler
    (see validate_members), so a parsing mistake cannot go unnoticed.
    """
    text = preprocess(f'#include "{header}"\n', [header.parent], comments=True)
    start = re.search(rf"^\s*struct\s+{struct}\s*\{{", text, re.M)
    if not start:
        raise AssertionError(f"no 'struct {struct} {{' in {header}")
    i = start.end()
    members: list[Member] = []
    pending = None
    depth = 0
    decl: list[str] = []
    while i < len(text):
        if text.startswith("/*", i):
            j = text.index("*/", i) + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = len(text) if j < 0 else j
        else:
            j = -1
        if j >= 0:
            m = _SINCE.search(text, i, j)
            if m:
                pending = int(m.group(1))
            i = j
            continue
        c = text[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "}" and depth == 0:
            return members
        elif c == ";" and depth == 0:
            d = "".join(decl)
            m = re.search(r"\(\s*(?:__attribute__\s*\(\(.*?\)\)\s*)?\*\s*(\w+)\s*\)", d)
            if not m:
                raise AssertionError(f"cannot read an OrtApi member from: {d.strip()[:200]}")
            members.append(Member(m.group(1), pending))
            pending = None
            decl = []
            i += 1
            continue
        decl.append(c)
        i += 1
    raise AssertionError(f"unterminated struct {struct}")


def validate_members(header: Path, members: list[Member], workdir: Path,
                     struct: str = "OrtApi") -> None:
    """Prove the parsed member list is the genuine table: every name at its index, nothing
    else in the struct."""
    lines = [f'#include "{header.name}"', "#include <stddef.h>"]
    for k, mem in enumerate(members):
        lines.append(f"_Static_assert(offsetof({struct}, {mem.name}) == {k} * sizeof(void*), "
                     f'"parsed member {k} is not {mem.name}");')
    lines.append(f"_Static_assert(sizeof({struct}) == {len(members)} * sizeof(void*), "
                 f'"{struct} has members the parser missed");')
    lines.append("int main(void) { return 0; }")
    src = workdir / f"members_{struct}.c"
    src.write_text("\n".join(lines) + "\n")
    proc = compile_c([*C_STD, f"-I{header.parent}", "-c", str(src), "-o",
                      str(workdir / f"members_{struct}.o")])
    if proc.returncode != 0:
        raise AssertionError(f"the parsed {struct} member list does not match the compiled "
                             f"struct:\n{proc.stderr[-3000:]}")


# ---- since versions ---------------------------------------------------------------------------

def since_problems(declared: list[Declared], members: list[Member], version: int):
    """Compare every declared `since` with what the genuine header tells.

    Returns (problems, exact, bounded, unverified):
      exact      the member's own doc comment says "\\since Version 1.N" and N == since;
      bounded    no doc comment on the member: since lies between the nearest documented
                 versions before and after it in the (append-only) table;
      unverified since > the header's ORT_API_VERSION (the slot must lie past its table).
    """
    problems, exact, bounded, unverified = [], [], [], []
    documented = [(k, m.since) for k, m in enumerate(members) if m.since is not None]
    for d in declared:
        if d.since > version:
            if d.slot < len(members):
                problems.append(f"{d.name}: since 1.{d.since} is newer than the header "
                                f"(1.{version}), yet the header has slot {d.slot} "
                                f"({members[d.slot].name})")
            else:
                unverified.append(d)
            continue
        if d.slot >= len(members) or members[d.slot].name != d.name:
            problems.append(f"{d.name}: since 1.{d.since} <= 1.{version} but the header has "
                            f"no {d.name} at slot {d.slot}")
            continue
        doc = members[d.slot].since
        if doc is not None:
            if doc != d.since:
                problems.append(f"{d.name}: declared since 1.{d.since}, the header documents "
                                f"1.{doc}")
            else:
                exact.append(d)
            continue
        low = max((s for k, s in documented if k <= d.slot), default=1)
        high = min((s for k, s in documented if k >= d.slot), default=version)
        if not low <= d.since <= high:
            problems.append(f"{d.name}: declared since 1.{d.since}, but slot {d.slot} lies "
                            f"between slots documented as 1.{low} and 1.{high}")
        else:
            bounded.append(d)
    return problems, exact, bounded, unverified


# ---- reporting --------------------------------------------------------------------------------

class _Summary:
    """A pytest plugin, registered on first use, that prints collected lines at the end of the
    run (in the terminal summary, so they show in every run, captured or not)."""

    name = "ortagent-abi-summary"

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.lines:
            terminalreporter.write_sep("-", "ortagent ABI verification")
            for line in self.lines:
                terminalreporter.write_line(line)


def report(config, line: str) -> None:
    """Show `line` in the test's own output (-s, -rA) and in the run's terminal summary."""
    print(line)
    pm = config.pluginmanager
    plugin = pm.get_plugin(_Summary.name)
    if plugin is None:
        plugin = _Summary()
        pm.register(plugin, _Summary.name)
    if line not in plugin.lines:
        plugin.lines.append(line)


def mutated(text: str, old: str, new: str) -> str:
    """`text` with the one occurrence of `old` replaced (a negative test whose mutation no
    longer applies must fail, not pass vacuously)."""
    count = text.count(old)
    if count != 1:
        raise AssertionError(f"mutation target occurs {count} times (expected 1): {old!r}")
    return text.replace(old, new)
