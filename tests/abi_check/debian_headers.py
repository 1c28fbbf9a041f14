"""Fetch genuine C headers from Debian packages, for the ABI tests only.

ortagent never ships or copies onnxruntime's or DLPack's headers: it declares what it uses in
include/ortagent/. To check those declarations, the tests need the genuine headers, and Debian
publishes them (``libonnxruntime-dev`` and ``libdlpack-dev``). This module downloads such a
package with the machine's own ``apt-get``, but with a private sources list, list directory,
package cache and (empty) dpkg status, all under a cache folder: the machine's apt configuration
and state are neither read for packages nor changed. It works as root and as an ordinary user.

The Debian archive to use is the one the machine's apt sources already name (the first
``.../debian`` source that is not a security one), or ``$ORTAGENT_DEBIAN_ARCHIVE`` when set. The
cache folder is ``<repo>/.cache/abi-headers`` or ``$ORTAGENT_ABI_CACHE``; a package extracted
once is reused.

Every reason the download cannot happen (no apt-get, no Debian source, no network, no such
package) raises :class:`Unavailable` with a precise message, which the tests turn into a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO_ROOT / ".cache" / "abi-headers"
STAMP = ".ortagent-extracted"


class Unavailable(Exception):
    """The genuine header cannot be obtained here; the message says why."""


def cache_root() -> Path:
    return Path(os.environ.get("ORTAGENT_ABI_CACHE") or DEFAULT_CACHE)


# ---- the machine's Debian archive -------------------------------------------------------------

def _apt_source_files() -> list[Path]:
    """The machine's sources.list and sources.list.d entries, as apt itself resolves them."""
    try:
        out = subprocess.run(
            ["apt-config", "shell", "SL", "Dir::Etc::SourceList/f", "SP", "Dir::Etc::SourceParts/d"],
            capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"cannot ask apt-config for the machine's apt sources: {exc}") from exc
    values = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        values[key] = shlex.split(value)[0] if value else ""
    files = []
    if values.get("SL"):
        files.append(Path(values["SL"]))
    if values.get("SP"):
        parts = Path(values["SP"])
        if parts.is_dir():
            files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    return [f for f in files if f.is_file()]


def _entries(path: Path):
    """Yield (uri, suites, signed_by) for each deb entry of a one-line or deb822 sources file."""
    text = path.read_text(errors="replace")
    if path.suffix == ".sources":
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            key = None
            for line in stanza.splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                if line[0].isspace() and key:       # continuation line
                    fields[key] += " " + line.strip()
                    continue
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
            if "deb" not in fields.get("types", "").split():
                continue
            if fields.get("enabled", "yes").lower() == "no":
                continue
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split(), fields.get("signed-by", "").strip()
    else:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.match(r"deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)", line)
            if not m:
                continue
            options = dict(o.split("=", 1) for o in (m.group(1) or "").split() if "=" in o)
            yield m.group(2), [m.group(3)], options.get("signed-by", "")


def debian_archive() -> tuple[str, str]:
    """(archive URI, signed-by keyring or "") of the Debian archive this machine already uses."""
    override = os.environ.get("ORTAGENT_DEBIAN_ARCHIVE")
    if override:
        return override.rstrip("/"), ""
    for path in _apt_source_files():
        for uri, suites, signed_by in _entries(path):
            if not uri.rstrip("/").endswith("/debian"):
                continue
            if any("security" in s for s in suites):
                continue
            if signed_by and not signed_by.startswith("/"):
                signed_by = ""          # an inline key block: let apt use its default keyrings
            if signed_by and not Path(signed_by).is_file():
                signed_by = ""
            return uri.rstrip("/"), signed_by
    raise Unavailable("the machine's apt sources name no Debian archive (a '.../debian' URI); "
                      "set ORTAGENT_DEBIAN_ARCHIVE to one")


# ---- private apt ------------------------------------------------------------------------------

def _run(what: str, cmd: list[str], cwd: Path | None = None, timeout: int = 600) -> str:
    """stdout + stderr of a command that must succeed (Unavailable otherwise)."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise Unavailable(f"{cmd[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"{what} timed out after {timeout} s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise Unavailable(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout + proc.stderr


class _PrivateApt:
    """apt-get with its own sources, lists, cache and status, in one folder."""

    def __init__(self, folder: Path, suite: str):
        self.folder = folder
        self.suite = suite
        self.sources = folder / "sources.list"
        self.lists = folder / "lists"
        self.cache = folder / "cache"
        self.status = folder / "status"
        self.prefs = folder / "preferences.d"

    def options(self) -> list[str]:
        opts = {
            "Dir::Etc::SourceList": self.sources,
            "Dir::Etc::SourceParts": "/dev/null",
            "Dir::Etc::Preferences": "/dev/null",
            "Dir::Etc::PreferencesParts": self.prefs,
            "Dir::State::Lists": self.lists,
            "Dir::State::status": self.status,
            "Dir::Cache": self.cache,
            "Debug::NoLocking": "1",
            "Acquire::Languages": "none",
            "Acquire::Retries": "2",
            "APT::Get::List-Cleanup": "0",
        }
        if os.geteuid() == 0:
            # As root apt hands downloads to the '_apt' user, which cannot write to a private
            # folder owned by root; download as root rather than be warned about it.
            opts["APT::Sandbox::User"] = "root"
        return [a for k, v in opts.items() for a in ("-o", f"{k}={v}")]

    def prepare(self) -> None:
        uri, signed_by = debian_archive()
        for d in (self.lists / "partial", self.cache / "archives" / "partial", self.prefs):
            d.mkdir(parents=True, exist_ok=True)
        self.status.touch()
        opt = f"[signed-by={signed_by}] " if signed_by else ""
        line = f"deb {opt}{uri} {self.suite} main\n"
        if not self.sources.is_file() or self.sources.read_text() != line:
            self.sources.write_text(line)

    def update(self) -> list[str]:
        """Refresh the private lists; returns apt's warnings (apt-get update exits 0 when a
        source could not be reached)."""
        out = _run(f"apt-get update (private lists for {self.suite})",
                   ["apt-get", "-q", *self.options(), "update"])
        return [line for line in out.splitlines() if line.startswith(("W:", "E:"))]

    def download(self, package: str, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob(f"{package}_*.deb"):
            old.unlink()
        _run(f"apt-get download {package} ({self.suite})",
             ["apt-get", "-q", *self.options(), "download", package], cwd=dest)
        debs = sorted(dest.glob(f"{package}_*.deb"))
        if len(debs) != 1:
            raise Unavailable(f"apt-get download {package} left {len(debs)} .deb files in {dest}")
        return debs[0]


@contextlib.contextmanager
def _locked(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def fetch_package(package: str, expect: str, suite: str = "trixie") -> tuple[Path, str]:
    """Extract Debian's `package` from `suite` and return (root of the extracted tree, .deb name).

    `expect` is a path inside the package (e.g. "usr/include/dlpack/dlpack.h") whose presence
    marks a finished extraction, so a later call reuses it without any download.
    """
    if shutil.which("apt-get") is None:
        raise Unavailable("apt-get is not installed (needed to fetch the genuine header)")
    if shutil.which("dpkg-deb") is None:
        raise Unavailable("dpkg-deb is not installed (needed to unpack the genuine header)")
    base = cache_root() / suite
    root = base / "root" / package
    stamp = root / STAMP
    try:
        with _locked(base):
            if stamp.is_file() and (root / expect).is_file():
                return root, stamp.read_text().strip()
            apt = _PrivateApt(base / "apt", suite)
            apt.prepare()
            try:
                deb = apt.download(package, base / "debs")
            except Unavailable:
                warnings = apt.update()         # no lists yet, or stale ones
                try:
                    deb = apt.download(package, base / "debs")
                except Unavailable as exc:
                    if warnings:
                        raise Unavailable(f"{exc}; apt-get update said: "
                                          + " ".join(warnings[-3:])) from exc
                    raise
            partial = root.with_name(root.name + ".partial")
            for stale in (root, partial):
                if stale.exists():
                    shutil.rmtree(stale)
            partial.mkdir(parents=True)
            _run(f"dpkg-deb -x {deb.name}", ["dpkg-deb", "-x", str(deb), str(partial)])
            if not (partial / expect).is_file():
                raise Unavailable(f"{deb.name} has no {expect}")
            (partial / STAMP).write_text(deb.name + "\n")
            partial.rename(root)
            return root, deb.name
    except OSError as exc:
        raise Unavailable(f"cannot use the cache folder {base}: {exc}") from exc


ORT_HEADER = "usr/include/onnxruntime/onnxruntime_c_api.h"
DLPACK_HEADER = "usr/include/dlpack/dlpack.h"


# Debian suites the ABI test reads onnxruntime_c_api.h from: the stable release (onnxruntime
# 1.21, a fixed baseline) and experimental, which carries Debian's newest packaging of
# onnxruntime (1.27.1 when this was written) and so covers the slots newer than 1.21.
ORT_HEADER_SUITES = ("trixie", "experimental")


def onnxruntime_c_api_header(suite: str = "trixie") -> tuple[Path, str]:
    """(path of a genuine onnxruntime_c_api.h from Debian's `suite`, where it came from).

    ``$ORTAGENT_ORT_C_API_HEADER`` names a header to use instead of any suite's.
    """
    given = os.environ.get("ORTAGENT_ORT_C_API_HEADER")
    if given:
        if not Path(given).is_file():
            raise Unavailable(f"ORTAGENT_ORT_C_API_HEADER={given} is not a file")
        return Path(given), given
    root, deb = fetch_package("libonnxruntime-dev", ORT_HEADER, suite=suite)
    return root / ORT_HEADER, f"{deb} ({suite})"


def dlpack_header() -> tuple[Path, str]:
    """(path of a genuine dlpack/dlpack.h, where it came from); ``$ORTAGENT_DLPACK_HEADER``
    names one to use instead."""
    given = os.environ.get("ORTAGENT_DLPACK_HEADER")
    if given:
        if not Path(given).is_file():
            raise Unavailable(f"ORTAGENT_DLPACK_HEADER={given} is not a file")
        return Path(given), given
    root, deb = fetch_package("libdlpack-dev", DLPACK_HEADER)
    return root / DLPACK_HEADER, deb


if __name__ == "__main__":
    for fn in (onnxruntime_c_api_header, dlpack_header):
        try:
            print(*fn())
        except Unavailable as exc:
            print("unavailable:", exc)
