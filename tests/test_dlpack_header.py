"""include/ortagent/dlpack_abi.h against a genuine dlpack/dlpack.h.

The genuine header is Debian's libdlpack-dev (trixie, DLPack 1.0), fetched at test time into
.cache/abi-headers/ (tests/abi_check/debian_headers.py); the tests skip, saying why, when it
cannot be fetched or gcc is missing. tests/abi_check/check_dlpack_abi.c compiles both headers
in one translation unit and checks the version, every enumerator, the flag bits, and every
struct's size, alignment, field offsets, sizes and (where both use one C type) field types.
This file also checks that every enumerator of the genuine header is declared, and that the
checks fail on deliberately wrong declarations.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import load_file_module


HERE = Path(__file__).resolve().parent
ctools = load_file_module("ortagent_tests_ctools", HERE / "abi_check" / "ctools.py")
debian = load_file_module("ortagent_tests_debian_headers", HERE / "abi_check" / "debian_headers.py")
CHECK_C = HERE / "abi_check" / "check_dlpack_abi.c"
DLPACK_ABI_H = ctools.INCLUDE / "ortagent" / "dlpack_abi.h"

# The Python array API's DLPack capsule names (not part of dlpack.h).
CAPSULES = {
    "CAPSULE": "dltensor",
    "USED_CAPSULE": "used_dltensor",
    "VERSIONED_CAPSULE": "dltensor_versioned",
    "USED_VERSIONED_CAPSULE": "used_dltensor_versioned",
}


@pytest.fixture(scope="module")
def genuine() -> tuple[Path, str]:
    ctools.gcc()
    try:
        header, origin = debian.dlpack_header()
    except debian.Unavailable as exc:
        pytest.skip(f"no genuine dlpack/dlpack.h: {exc}")
    return header, origin


def _include_root(header: Path) -> Path:
    return header.parent.parent     # the folder that holds dlpack/dlpack.h


def _build(header: Path, include: Path, workdir: Path) -> subprocess.CompletedProcess:
    return ctools.compile_c([*ctools.C_STD, f"-I{_include_root(header)}", f"-I{include}",
                             str(CHECK_C), "-o", str(workdir / "check_dlpack_abi")])


def _declared_lists(include: Path) -> dict[str, list[tuple[str, str, int]]]:
    src = ('#include "ortagent/dlpack_abi.h"\n'
           "#define D(suffix, name, value) @E device suffix name value @END\n"
           "#define C(suffix, name, value) @E code suffix name value @END\n"
           "ORTAGENT_DL_DEVICE_TYPES(D)\nORTAGENT_DL_TYPE_CODES(C)\n")
    out = " ".join(ctools.preprocess(src, [include]).split())
    lists: dict[str, list[tuple[str, str, int]]] = {"device": [], "code": []}
    for m in re.finditer(r"@E (\w+) (\w+) (\w+) (\d+) @END", out):
        lists[m.group(1)].append((m.group(2), m.group(3), int(m.group(4))))
    return lists


def _genuine_enum(header: Path, typedef: str) -> dict[str, int]:
    """Enumerators of the genuine `typedef enum {...} <typedef>;` (C view of the header)."""
    text = ctools.preprocess('#include "dlpack/dlpack.h"\n', [_include_root(header)])
    m = re.search(r"typedef\s+enum\s*(?:\w+\s*)?\{([^}]*)\}\s*" + typedef + r"\s*;", text)
    assert m, f"no enum {typedef} in {header}"
    values, next_value = {}, 0
    for item in m.group(1).split(","):
        item = item.strip()
        if not item:
            continue
        name, _, value = item.partition("=")
        if value.strip():
            next_value = int(value.strip().rstrip("uU"), 0)
        values[name.strip()] = next_value
        next_value += 1
    return values


def test_dlpack_abi_matches_genuine_header(genuine, tmp_path, request):
    header, origin = genuine
    proc = _build(header, ctools.INCLUDE, tmp_path)
    assert proc.returncode == 0, f"dlpack_abi.h disagrees with {origin}:\n{proc.stderr}"
    run = subprocess.run([str(tmp_path / "check_dlpack_abi")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    capsules = {line.split()[1]: line.split()[2] for line in lines if line.startswith("capsule ")}
    assert capsules == CAPSULES
    structs = [line for line in lines if line.startswith("struct ")]
    assert len(structs) == 6, structs
    lists = _declared_lists(ctools.INCLUDE)
    ctools.report(request.config,
                  f"dlpack_abi.h vs {origin}: version {lines[0].split()[1]}, "
                  f"{len(lists['device'])} device types, {len(lists['code'])} type codes, "
                  f"2 flags, {len(structs)} structs (size, alignment, fields) verified")


@pytest.mark.parametrize("kind, typedef", [("device", "DLDeviceType"), ("code", "DLDataTypeCode")])
def test_every_genuine_enumerator_is_declared(genuine, kind, typedef):
    header, origin = genuine
    theirs = _genuine_enum(header, typedef)
    ours = {name: value for _, name, value in _declared_lists(ctools.INCLUDE)[kind]}
    assert ours == theirs, (f"{typedef}: missing {sorted(set(theirs) - set(ours))}, "
                            f"not in {origin}: {sorted(set(ours) - set(theirs))}")


MUTATIONS = {
    "enumerator value": ("E(CUDA_HOST, kDLCUDAHost, 3)", "E(CUDA_HOST, kDLCUDAHost, 4)",
                         "value of ORTAGENT_DL_CUDA_HOST differs"),
    "field type": ("    int32_t ndim;", "    int64_t ndim;",
                   "ortagent_dl_tensor.ndim differs"),
    "field order": ("    uint8_t code;               /* an ortagent_dl_type_code */\n"
                    "    uint8_t bits;",
                    "    uint8_t bits;\n    uint8_t code;",
                    "offset of ortagent_dl_data_type.code differs"),
    "missing field": ("    uint64_t flags;             /* ORTAGENT_DLPACK_FLAG_* */\n", "",
                      "size of ortagent_dl_managed_tensor_versioned differs"),
    "flag bit": ("#define ORTAGENT_DLPACK_FLAG_IS_COPIED ((uint64_t)1 << 1)",
                 "#define ORTAGENT_DLPACK_FLAG_IS_COPIED ((uint64_t)1 << 2)",
                 "ORTAGENT_DLPACK_FLAG_IS_COPIED differs"),
    "version": ("#define ORTAGENT_DLPACK_MINOR_VERSION 0", "#define ORTAGENT_DLPACK_MINOR_VERSION 1",
                "ORTAGENT_DLPACK_MINOR_VERSION differs"),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_dlpack_check_fails_on_wrong_declaration(genuine, tmp_path, case):
    header, _ = genuine
    old, new, message = MUTATIONS[case]
    include = tmp_path / "include"
    (include / "ortagent").mkdir(parents=True)
    (include / "ortagent" / "dlpack_abi.h").write_text(
        ctools.mutated(DLPACK_ABI_H.read_text(), old, new))
    proc = _build(header, include, tmp_path)
    assert proc.returncode != 0, f"a wrong declaration ({case}) compiled"
    assert message in proc.stderr, proc.stderr


def test_enumerator_completeness_check_can_fail(genuine, tmp_path):
    header, _ = genuine
    (tmp_path / "ortagent").mkdir()
    (tmp_path / "ortagent" / "dlpack_abi.h").write_text(ctools.mutated(
        DLPACK_ABI_H.read_text(), "    E(MAIA, kDLMAIA, 17)\n", "\n"))
    ours = {name for _, name, _ in _declared_lists(tmp_path)["device"]}
    assert set(_genuine_enum(header, "DLDeviceType")) - ours == {"kDLMAIA"}
