"""ortagent/_capi.pxd (Cython's view of the ORT ABI) against include/ortagent/ort_abi.h (C's).

Every OrtApi function is declared twice: once in the header's X-list (slot, since, return type,
name, parameters), which the C compiler uses for each call through ORTAGENT_CALL, and once in
the .pxd, which Cython uses to type the arguments it passes. A .pxd signature that disagrees
with the header compiles to a call whose arguments C converts silently where the types are
compatible (and fails under -Werror=incompatible-pointer-types where they are not, see
setup.py). This test reads both files and requires them to agree on every function: the same
names, return types and parameter types, and ORTAGENT_CALL exactly for the slots no newer than
ORTAGENT_API_FLOOR (ORTAGENT_CALL_NEWER for the others). It also fails on a deliberately wrong
declaration (the negative tests at the end).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PXD = ROOT / "ortagent" / "_capi.pxd"
HEADER = ROOT / "include" / "ortagent" / "ort_abi.h"

_PXD_FUNCTION = re.compile(
    r'^\s*(?P<ret>[\w\s\*]+?)\s*\b(?P<name>\w+)\s+"(?P<macro>ORTAGENT_(?:CALL(?:_NEWER)?|COMPILE_CALL))\((?P<cname>\w+)\)"'
    r"\((?P<params>[^)]*)\)\s*$")
_X_ENTRY = re.compile(r"X\(\s*(?P<slot>\d+),\s*(?P<since>\d+),\s*(?P<ret>[^,]+?),\s*(?P<name>\w+),\s*"
                      r"\((?P<params>[^()]*)\)\)", re.S)
# words that end a type, never a parameter's name
_TYPE_WORDS = {"const", "unsigned", "signed", "int", "char", "long", "short", "float", "double", "void",
               "size_t", "int64_t", "uint32_t"}


def _type(text: str) -> str:
    """A C type in one spelling: single spaces, `*` attached to what it follows."""
    text = " ".join(text.replace("*", " * ").split())
    return text.replace(" *", "*")


def _parameter_type(text: str) -> str:
    """The type of one parameter, without its name (the header names the newer slots' ones)."""
    words = _type(text)
    match = re.fullmatch(r"(?P<type>.*[\w*])\s+(?P<name>[A-Za-z_]\w*)", words)
    if match and match.group("name") not in _TYPE_WORDS:
        return match.group("type")
    return words


def _parameters(text: str) -> list[str]:
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    return [_parameter_type(part) for part in text.split(",")]


def pxd_functions(text: str) -> dict[str, tuple[str, str, list[str]]]:
    """name -> (macro, return type, parameter types) from the .pxd's extern block."""
    found = {}
    for line in text.splitlines():
        match = _PXD_FUNCTION.match(line)
        if match is None:
            continue
        assert match.group("name") == match.group("cname"), f"{match.group('name')} calls {match.group('cname')}"
        found[match.group("name")] = (match.group("macro"), _type(match.group("ret")),
                                      _parameters(match.group("params")))
    return found


def header_functions(text: str) -> tuple[int, dict[str, tuple[int, int, str, list[str]]]]:
    """(ORTAGENT_API_FLOOR, name -> (slot, since, return type, parameter types, whether the
    function is in the OrtCompileApi table))."""
    floor = int(re.search(r"#define ORTAGENT_API_FLOOR (\d+)", text).group(1))
    body = re.sub(r"/\*.*?\*/", " ", text, flags=re.S).replace("\\\n", " ")
    found = {}
    # each X-list is one (joined) #define line: its entries belong to the table it names
    for line in body.splitlines():
        compile_table = line.startswith("#define ORTAGENT_COMPILE_")
        for match in _X_ENTRY.finditer(line):
            found[match.group("name")] = (int(match.group("slot")), int(match.group("since")),
                                          _type(match.group("ret")), _parameters(match.group("params")),
                                          compile_table)
    return floor, found


def disagreements(pxd_text: str, header_text: str) -> list[str]:
    floor, header = header_functions(header_text)
    pxd = pxd_functions(pxd_text)
    problems = []
    for name in sorted(set(pxd) | set(header)):
        if name not in header:
            problems.append(f"{name}: declared in _capi.pxd, not in ort_abi.h")
            continue
        if name not in pxd:
            problems.append(f"{name}: declared in ort_abi.h, not in _capi.pxd")
            continue
        macro, ret, params = pxd[name]
        _, since, header_ret, header_params, compile_table = header[name]
        expected_macro = ("ORTAGENT_COMPILE_CALL" if compile_table
                          else "ORTAGENT_CALL" if since <= floor else "ORTAGENT_CALL_NEWER")
        if macro != expected_macro:
            problems.append(f"{name}: since 1.{since} needs {expected_macro}, the .pxd uses {macro}")
        if ret != header_ret:
            problems.append(f"{name}: returns {ret!r} in _capi.pxd, {header_ret!r} in ort_abi.h")
        if params != header_params:
            problems.append(f"{name}: parameters {params} in _capi.pxd, {header_params} in ort_abi.h")
    return problems


def test_pxd_and_header_declare_the_same_functions():
    pxd_text, header_text = PXD.read_text(), HEADER.read_text()
    _, header = header_functions(header_text)
    assert len(pxd_functions(pxd_text)) >= 100 and len(header) >= 100   # the parsers found them
    assert disagreements(pxd_text, header_text) == []


@pytest.mark.parametrize("wrong,expected", [
    # a pointer level lost
    (("OrtStatus* Run \"ORTAGENT_CALL(Run)\"(OrtSession*, const OrtRunOptions*, const char* const*, "
      "const OrtValue* const*, size_t, const char* const*, size_t, OrtValue**)",
      "OrtStatus* Run \"ORTAGENT_CALL(Run)\"(OrtSession*, const OrtRunOptions*, const char* const*, "
      "const OrtValue* const*, size_t, const char* const*, size_t, OrtValue*)"), "Run: parameters"),
    # a const dropped
    (("OrtStatus* IsTensor \"ORTAGENT_CALL(IsTensor)\"(const OrtValue*, int*)",
      "OrtStatus* IsTensor \"ORTAGENT_CALL(IsTensor)\"(OrtValue*, int*)"), "IsTensor: parameters"),
    # a newer slot called as if every runtime had it
    (("\"ORTAGENT_CALL_NEWER(CopyTensors)\"", "\"ORTAGENT_CALL(CopyTensors)\""), "CopyTensors: since 1.23"),
    # a compile-table slot called through the OrtApi table
    (("\"ORTAGENT_COMPILE_CALL(CompileModel)\"", "\"ORTAGENT_CALL_NEWER(CompileModel)\""),
     "CompileModel: since 1.22 needs ORTAGENT_COMPILE_CALL"),
    # a plain-value slot with a wrong return type
    (("uint32_t HardwareDevice_VendorId", "int HardwareDevice_VendorId"), "HardwareDevice_VendorId: returns"),
    # a function the header does not declare
    (("OrtStatus* IsTensor \"ORTAGENT_CALL(IsTensor)\"(const OrtValue*, int*)",
      "OrtStatus* IsTensorX \"ORTAGENT_CALL(IsTensorX)\"(const OrtValue*, int*)"), "IsTensorX: declared in"),
])
def test_a_wrong_declaration_is_found(wrong, expected):
    old, new = wrong
    pxd_text = PXD.read_text()
    assert old in pxd_text
    problems = disagreements(pxd_text.replace(old, new), HEADER.read_text())
    assert any(problem.startswith(expected) for problem in problems), problems
