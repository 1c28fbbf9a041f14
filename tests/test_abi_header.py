"""include/ortagent/ort_abi.h against a genuine onnxruntime_c_api.h.

The genuine headers are Debian's libonnxruntime-dev from two suites, trixie (onnxruntime 1.21)
and experimental (the newest Debian packages: 1.27.1 when written), fetched at test time into
.cache/abi-headers/ by tests/abi_check/debian_headers.py; nothing of them is kept in the
repository. Every test against a genuine header runs once per header. The tests skip, saying why, when it cannot be fetched or gcc is missing.

What is checked (tests/abi_check/check_ort_abi.c does the C part):
  - every declared slot index and signature that the header's API version covers, every enum
    value, the OrtApiBase layout, ortagent_allocator_v1 against OrtAllocator's first
    members (the pooled CPU allocator, include/ortagent/cpu_pool.h, is handed to onnxruntime as one),
    and ortagent_custom_op_v16 against OrtCustomOp's members up to KernelComputeV2 (ortagent's
    CPU kernels, include/ortagent/cpu_kernels.h, are registered as such operators);
  - every declared `since` against the header: a slot the header's version covers must be
    there (under its name), and its `since` must match the member's "\\since" doc comment, or
    lie between the documented versions around it; a slot newer than the header must lie past
    its table, and is reported as "unverified: <name> slot <n> since 1.<v>";
  - that these checks fail on a deliberately wrong declaration (negative self-tests).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import load_file_module


HERE = Path(__file__).resolve().parent
ctools = load_file_module("ortagent_tests_ctools", HERE / "abi_check" / "ctools.py")
debian = load_file_module("ortagent_tests_debian_headers", HERE / "abi_check" / "debian_headers.py")
CHECK_C = HERE / "abi_check" / "check_ort_abi.c"
ORT_ABI_H = ctools.INCLUDE / "ortagent" / "ort_abi.h"


# ---- without the genuine header ---------------------------------------------------------------

def _consistency_problems(include: Path) -> list[str]:
    """What is wrong with ort_abi.h under `include` on its own terms (no genuine header)."""
    declared = ctools.declared_functions(include)
    macros = ctools.declared_macros(["ORTAGENT_API_FLOOR", "ORTAGENT_API_NEWEST"],
                                    include, "ortagent/ort_abi.h")
    floor, newest = int(macros["ORTAGENT_API_FLOOR"]), int(macros["ORTAGENT_API_NEWEST"])
    compile_declared = ctools.declared_functions(include, "OrtCompileApi")
    problems = []
    names = [d.name for d in declared + compile_declared]
    if len(set(names)) != len(names):
        problems.append(f"names declared twice: {sorted({n for n in names if names.count(n) > 1})}")
    for table in (declared, compile_declared):
        slots = [d.slot for d in table]
        if len(set(slots)) != len(slots):
            problems.append(f"slots declared twice: {sorted({s for s in slots if slots.count(s) > 1})}")
    for d in declared:
        if d.group == "floor" and d.since > floor:
            problems.append(f"{d.name} (since 1.{d.since}) is newer than ORTAGENT_API_FLOOR "
                            f"({floor}): it belongs in ORTAGENT_ORT_NEWER_FUNCTIONS")
        if d.group != "floor" and d.since <= floor:
            problems.append(f"{d.name} (since 1.{d.since}) is no newer than the floor: it "
                            "belongs in ORTAGENT_ORT_FLOOR_FUNCTIONS")
        if d.group == "newer" and d.ret != "OrtStatus*":
            problems.append(f"{d.name} is in the newer list but returns {d.ret}; ort_call.h's "
                            "stand-in can only return an OrtStatus*")
        if d.group == "value" and d.ret in ("void", "OrtStatus*"):
            problems.append(f"{d.name} is in the newer value list but returns {d.ret}: it "
                            "belongs in the newer list of its return type")
        if d.group == "void" and d.ret != "void":
            problems.append(f"{d.name} is in the newer void list but returns {d.ret}")
    for d in compile_declared:
        if d.since <= floor:
            problems.append(f"OrtCompileApi::{d.name} (since 1.{d.since}) is no newer than the "
                            "floor, yet the compile table exists only from 1.22")
        if d.group == "compile" and d.ret != "OrtStatus*":
            problems.append(f"OrtCompileApi::{d.name} returns {d.ret}: it belongs in "
                            "ORTAGENT_COMPILE_VOID_FUNCTIONS")
        if d.group == "compile_void" and d.ret != "void":
            problems.append(f"OrtCompileApi::{d.name} is in the void list but returns {d.ret}")
    for d in declared + compile_declared:
        if d.since > newest:
            problems.append(f"{d.name} (since 1.{d.since}) is newer than ORTAGENT_API_NEWEST")
    if max(d.since for d in declared + compile_declared) != newest:
        problems.append(f"ORTAGENT_API_NEWEST is {newest}, the newest declared slot is "
                        f"1.{max(d.since for d in declared + compile_declared)}")
    # Each table is append-only: a later slot never belongs to an older version.
    for table in (declared, compile_declared):
        by_slot = sorted(table, key=lambda d: d.slot)
        for a, b in zip(by_slot, by_slot[1:]):
            if b.since < a.since:
                problems.append(f"{b.name} (slot {b.slot}, since 1.{b.since}) comes after "
                                f"{a.name} (slot {a.slot}, since 1.{a.since})")
    return problems


def test_declarations_are_consistent():
    problems = _consistency_problems(ctools.INCLUDE)
    assert not problems, "\n".join(problems)


INCONSISTENT = {
    "floor slot newer than the floor": ("X(254, 15, const char*, GetBuildInfoString",
                                        "X(254, 21, const char*, GetBuildInfoString",
                                        "GetBuildInfoString (since 1.21) is newer than"),
    "since out of slot order": ("X(133,  5, OrtStatus*, RunWithBinding",
                                "X(133,  1, OrtStatus*, RunWithBinding",
                                "RunWithBinding (slot 133, since 1.1) comes after"),
    "slot declared twice": ("X( 10,  1, OrtStatus*, CreateSessionOptions",
                            "X(  9,  1, OrtStatus*, CreateSessionOptions",
                            "slots declared twice: [9]"),
    "value slot returning a status": ("X(313, 22, const char*, EpDevice_EpVendor",
                                      "X(313, 22, OrtStatus*, EpDevice_EpVendor",
                                      "EpDevice_EpVendor is in the newer value list"),
    "compile slot declared twice": ("X( 9, 23, OrtStatus*, ModelCompilationOptions_SetFlags",
                                    "X( 8, 23, OrtStatus*, ModelCompilationOptions_SetFlags",
                                    "slots declared twice: [8]"),
    "compile since out of slot order": ("X( 8, 22, OrtStatus*, CompileModel",
                                        "X( 8, 24, OrtStatus*, CompileModel",
                                        "ModelCompilationOptions_SetFlags (slot 9, since 1.23) comes after"),
}


@pytest.mark.parametrize("case", list(INCONSISTENT))
def test_consistency_check_can_fail(tmp_path, case):
    old, new, message = INCONSISTENT[case]
    (tmp_path / "ortagent").mkdir()
    (tmp_path / "ortagent" / "ort_abi.h").write_text(
        ctools.mutated(ORT_ABI_H.read_text(), old, new))
    problems = _consistency_problems(tmp_path)
    assert any(message in p for p in problems), problems


def test_declared_enums_are_int_sized(tmp_path):
    enums = ctools.declared_enums()
    assert enums, "no enum found through ORTAGENT_ENUMS"
    src = tmp_path / "enums.c"
    src.write_text('#include "ortagent/ort_abi.h"\n' + "".join(
        f'_Static_assert(sizeof({t}) == sizeof(int), "{t} is not int-sized");\n'
        for t in enums))
    proc = ctools.compile_c([*ctools.C_STD, f"-I{ctools.INCLUDE}", "-c", str(src),
                             "-o", str(tmp_path / "enums.o")])
    assert proc.returncode == 0, proc.stderr


CALLS = {
    "floor slot": ("ORTAGENT_CALL(Run)", True),
    "newer slot through CALL_NEWER": ("ORTAGENT_CALL_NEWER(CopyTensors)", True),
    "newer slot through CALL": ("ORTAGENT_CALL(CopyTensors)", False),
}


@pytest.mark.parametrize("case", list(CALLS))
def test_call_macros_refuse_newer_slots_at_compile_time(tmp_path, case):
    expr, ok = CALLS[case]
    src = tmp_path / "call.c"
    src.write_text('#include "ortagent/ort_call.h"\n'
                   f"void* use(void) {{ return (void*){expr}; }}\n")
    proc = ctools.compile_c([*ctools.C_STD, "-Wno-unused-function", f"-I{ctools.INCLUDE}", "-c",
                             str(src), "-o", str(tmp_path / "call.o")])
    assert (proc.returncode == 0) == ok, proc.stderr


# ---- against the genuine header ---------------------------------------------------------------

class Genuine:
    def __init__(self, header: Path, origin: str, version: int, members, compile_members):
        self.header, self.origin, self.version, self.members = header, origin, version, members
        # the genuine struct OrtCompileApi's members ([] when the header predates it, 1.22)
        self.compile_members = compile_members


# One genuine header per Debian suite, or only the one $ORTAGENT_ORT_C_API_HEADER names.
HEADER_SOURCES = (["given"] if os.environ.get("ORTAGENT_ORT_C_API_HEADER")
                  else list(debian.ORT_HEADER_SUITES))


@pytest.fixture(scope="module", params=HEADER_SOURCES)
def genuine(tmp_path_factory, request) -> Genuine:
    ctools.gcc()
    try:
        header, origin = debian.onnxruntime_c_api_header(request.param)
    except debian.Unavailable as exc:
        pytest.skip(f"no genuine onnxruntime_c_api.h ({request.param}): {exc}")
    version = ctools.header_api_version(header)
    members = ctools.genuine_members(header)
    workdir = tmp_path_factory.mktemp("members")
    ctools.validate_members(header, members, workdir)
    compile_members = []
    if version >= 22:
        compile_members = ctools.genuine_members(header, "OrtCompileApi")
        ctools.validate_members(header, compile_members, workdir, "OrtCompileApi")
    return Genuine(header, origin, version, members, compile_members)


def _write_checkable(folder: Path, declared, version: int) -> None:
    lines = ["/* generated by tests/test_abi_header.py */"]
    for d in declared:
        body = "x" if d.since <= version else ""
        lines.append(f"#define ORTAGENT_IF_CHECKABLE_{d.name}(x) {body}")
    (folder / "ort_checkable.h").write_text("\n".join(lines) + "\n")


def _build_check(genuine: Genuine, include: Path, workdir: Path) -> subprocess.CompletedProcess:
    """Compile check_ort_abi.c against the genuine header and the ort_abi.h under `include`."""
    declared = (ctools.declared_functions(include)
                + ctools.declared_functions(include, "OrtCompileApi"))
    _write_checkable(workdir, declared, genuine.version)
    return ctools.compile_c([*ctools.C_STD, f"-I{genuine.header.parent}", f"-I{include}",
                             f"-I{workdir}", str(CHECK_C), "-o", str(workdir / "check_ort_abi")])


def test_ort_abi_matches_genuine_header(genuine, tmp_path, request):
    proc = _build_check(genuine, ctools.INCLUDE, tmp_path)
    assert proc.returncode == 0, f"ort_abi.h disagrees with {genuine.origin}:\n{proc.stderr}"
    run = subprocess.run([str(tmp_path / "check_ort_abi")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert f"api_version {genuine.version}" in lines
    assert f"table {len(genuine.members)}" in lines
    assert "api_base ok" in lines
    assert "allocator_v1 ok" in lines
    assert "custom_op_v16 ok" in lines

    declared = ctools.declared_functions()
    expected_slots = {f"slot {d.name} {d.slot} {d.since} {d.slot}"
                      for d in declared if d.since <= genuine.version}
    checked_slots = {line for line in lines if line.startswith("slot ")}
    assert checked_slots == expected_slots, (
        f"missing: {sorted(expected_slots - checked_slots)}; "
        f"unexpected: {sorted(checked_slots - expected_slots)}")
    compile_declared = ctools.declared_functions(table="OrtCompileApi")
    expected_compile = {f"compile_slot {d.name} {d.slot} {d.since} {d.slot}"
                        for d in compile_declared if d.since <= genuine.version}
    checked_compile = {line for line in lines if line.startswith("compile_slot ")}
    assert checked_compile == expected_compile, (
        f"missing: {sorted(expected_compile - checked_compile)}; "
        f"unexpected: {sorted(checked_compile - expected_compile)}")

    enums = ctools.declared_enums()
    enum_since = ctools.newer_enum_versions()
    expected_enums = {f"enum {t} {n} {v}" for t, values in enums.items() for n, v in values
                      if enum_since.get(t, 0) <= genuine.version}
    checked_enums = {line for line in lines if line.startswith("enum ")}
    assert checked_enums == expected_enums

    ctools.report(request.config,
                  f"ort_abi.h vs {genuine.origin} (ORT_API_VERSION {genuine.version}, "
                  f"{len(genuine.members)} slots): {len(checked_slots)} of {len(declared)} "
                  f"declared slots verified (index + signature), {len(checked_compile)} of "
                  f"{len(compile_declared)} OrtCompileApi slots, "
                  f"{len({line.split()[1] for line in checked_enums})} of {len(enums)} enums / "
                  f"{len(checked_enums)} values verified, OrtApiBase layout, OrtAllocator's "
                  "version-1 members and OrtCustomOp's members up to version 16 verified")


def test_since_versions_agree_with_genuine_header(genuine, request):
    declared = ctools.declared_functions()
    problems, exact, bounded, unverified = ctools.since_problems(declared, genuine.members,
                                                                 genuine.version)
    compile_declared = ctools.declared_functions(table="OrtCompileApi")
    more = ctools.since_problems(compile_declared, genuine.compile_members, genuine.version)
    problems += [f"OrtCompileApi::{p}" for p in more[0]]
    exact, bounded, unverified = exact + more[1], bounded + more[2], unverified + more[3]
    assert not problems, "\n".join(problems)
    ctools.report(request.config,
                  f"ort_abi.h since versions: {len(exact)} match the header's \\since docs, "
                  f"{len(bounded)} lie within the documented versions around them, "
                  f"{len(unverified)} newer than the header")
    for d in sorted(unverified, key=lambda d: d.slot):
        ctools.report(request.config, f"unverified: {d.name} slot {d.slot} since 1.{d.since}")


@pytest.mark.parametrize("declared_since, member_since", [(12, 14), (13, None)])
def test_since_check_can_fail(genuine, declared_since, member_since):
    """A wrong `since` is caught both on a documented member and on an undocumented one."""
    declared = ctools.declared_functions()
    if member_since is None:
        # An undocumented member whose neighbours bound its version: RunWithBinding (1.5).
        target = next(d for d in declared if d.name == "RunWithBinding")
    else:
        target = next(d for d in declared if d.slot < len(genuine.members)
                      and genuine.members[d.slot].since == member_since)
    wrong = [ctools.Declared(d.name, d.slot, declared_since, d.group, d.ret) if d == target else d
             for d in declared]
    problems, *_ = ctools.since_problems(wrong, genuine.members, genuine.version)
    assert any(p.startswith(target.name + ":") for p in problems), problems


MUTATIONS = {
    "slot index": ("X(  9,  1, OrtStatus*, Run,", "X( 10,  1, OrtStatus*, Run,",
                   "slot index of Run differs"),
    "parameter type": ("GetErrorCode, (const OrtStatus*)", "GetErrorCode, (OrtStatus*)",
                       "signature of GetErrorCode differs"),
    "parameter count": ("ReleaseValue, (OrtValue*)", "ReleaseValue, (OrtValue*, int)",
                        "signature of ReleaseValue differs"),
    "return type": ("X(  2,  1, const char*, GetErrorMessage",
                    "X(  2,  1, char*, GetErrorMessage", "signature of GetErrorMessage differs"),
    "enum value": ("E(ORT_ENABLE_ALL, 99)", "E(ORT_ENABLE_ALL, 3)",
                   "value of ORT_ENABLE_ALL differs"),
    "newer enum value": ("E(OrtDeviceMemoryType_HOST_ACCESSIBLE, 5)",
                         "E(OrtDeviceMemoryType_HOST_ACCESSIBLE, 4)",
                         "value of OrtDeviceMemoryType_HOST_ACCESSIBLE differs"),
    "newer value slot index": ("X(313, 22, const char*, EpDevice_EpVendor",
                               "X(314, 22, const char*, EpDevice_EpVendor",
                               "slot index of EpDevice_EpVendor differs"),
    "newer value return type": ("X(308, 22, uint32_t, HardwareDevice_VendorId",
                                "X(308, 22, int32_t, HardwareDevice_VendorId",
                                "signature of HardwareDevice_VendorId differs"),
    "compile slot index": ("X( 8, 22, OrtStatus*, CompileModel",
                           "X( 7, 22, OrtStatus*, CompileModel",
                           "slot index of OrtCompileApi::CompileModel differs"),
    "compile parameter type": ("(OrtModelCompilationOptions* options, uint32_t flags)",
                               "(OrtModelCompilationOptions* options, int flags)",
                               "signature of OrtCompileApi::ModelCompilationOptions_SetFlags differs"),
    "missing function": ("GetBuildInfoString, (void)", "GetBuildInfoStrings, (void)",
                         "GetBuildInfoStrings"),
    # A slot claimed as old enough for the header must be there.
    "since too old": ("X(386, 23, OrtStatus*, CopyTensors", "X(386, 21, OrtStatus*, CopyTensors",
                      "CopyTensors"),
    "api base layout": (
        "const void* (*get_api)(uint32_t api_version);  /* NULL when the runtime is older */\n"
        "    const char* (*get_version_string)(void);       /* \"1.N.P\" */",
        "const char* (*get_version_string)(void);\n    const void* (*get_api)(uint32_t);",
        "offset of ortagent_api_base"),
    "allocator member order": (
        "    void* (*Alloc)(struct ortagent_allocator_v1* self, size_t size);\n"
        "    void (*Free)(struct ortagent_allocator_v1* self, void* p);",
        "    void (*Free)(struct ortagent_allocator_v1* self, void* p);\n"
        "    void* (*Alloc)(struct ortagent_allocator_v1* self, size_t size);",
        "offset of ortagent_allocator_v1.Alloc"),
    "allocator member type": ("    uint32_t version;\n    void* (*Alloc)",
                              "    uint64_t version;\n    void* (*Alloc)",
                              "ortagent_allocator_v1.version"),
    "custom op member order": (
        "    size_t (*GetInputTypeCount)(const ortagent_custom_op_v16* op);\n"
        "    ONNXTensorElementDataType (*GetOutputType)(const ortagent_custom_op_v16* op, size_t index);",
        "    ONNXTensorElementDataType (*GetOutputType)(const ortagent_custom_op_v16* op, size_t index);\n"
        "    size_t (*GetInputTypeCount)(const ortagent_custom_op_v16* op);",
        "ortagent_custom_op_v16.GetInputTypeCount"),
    "custom op member signature": (
        "    OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);",
        "    OrtStatus* (*KernelComputeV2)(void* kernel, const OrtKernelContext* context);",
        "OrtCustomOp.KernelComputeV2"),
    "custom op member missing": (
        "    int (*GetVariadicOutputHomogeneity)(const ortagent_custom_op_v16* op);\n", "",
        "ortagent_custom_op_v16"),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_ort_abi_check_fails_on_wrong_declaration(genuine, tmp_path, case):
    old, new, message = MUTATIONS[case]
    include = tmp_path / "include"
    (include / "ortagent").mkdir(parents=True)
    (include / "ortagent" / "ort_abi.h").write_text(
        ctools.mutated(ORT_ABI_H.read_text(), old, new))
    copy_tensors = next(d for d in ctools.declared_functions() if d.name == "CopyTensors")
    if case.startswith(("newer", "compile")) and genuine.version < 23:
        pytest.skip(f"{genuine.origin} (1.{genuine.version}) predates the declarations this "
                    "mutation changes (1.22/1.23): they are checked against newer headers")
    if case == "since too old" and copy_tensors.since <= genuine.version:
        pytest.skip(f"{genuine.origin} has CopyTensors (1.23), so claiming it older cannot break "
                    "the build; the header-version check runs against the trixie header, and "
                    "test_since_check_can_fail covers wrong `since` values of existing slots")
    proc = _build_check(genuine, include, tmp_path)
    assert proc.returncode != 0, f"a wrong declaration ({case}) compiled"
    assert message in proc.stderr, proc.stderr
