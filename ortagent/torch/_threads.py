"""Sharing the CPUs between torch's OpenMP threads and onnxruntime's intra-op threads.

A training step through ORTModule alternates torch's work (the loss, the optimizer, the
bridge's draws) with onnxruntime's runs. On Linux, torch's CPU parallelism is GNU OpenMP,
whose worker threads spin after each parallel region before they sleep (about 8.5 ms on the
2-CPU host of benchmarks/README, longer than a small model's whole run): through a run that
follows torch's work, torch's idle workers hold the CPUs onnxruntime's threads would compute
on. Sleeping onnxruntime threads (``session.intra_op.allow_spinning=0``) then gain little from
the second CPU, and spinning ones lose more (both pools spin on one CPU).

Before each CPU run, :func:`release_torch_workers` asks torch's OpenMP runtime to let its
workers go (OpenMP 5.0's ``omp_pause_resource_all``: libgomp ends the calling thread's
team; the next parallel region starts new workers, ~0.05-0.1 ms, and work whose per-thread
buffers were the old workers' makes them anew: ResNet-18's eager step alone after each release
86 -> 94 ms, the demo's 11.1 -> 11.3 ms; README, "ORTModule"). The
sessions' threads, now alone, spin during a run and stop at its end
(:func:`default_session_options`), so torch's work after the run has the CPUs to itself.
`make demo-torch` at 2 threads: 1.07-1.12x eager's step with sleeping threads and torch's
workers kept, 0.93-0.96x with both (benchmarks/README, eleventh session). Only libgomp, the
runtime of torch's Linux builds, is asked: another runtime (LLVM's libomp on macOS, Intel's)
or none leaves everything as it was, with sleeping onnxruntime threads.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Callable

import torch

__all__ = ["default_session_options", "release_torch_workers", "torch_workers_releasable"]

_OMP_PAUSE_SOFT = 1             # (omp_pause_resource_t: omp_pause_soft)


@functools.cache
def _pause_all() -> Callable[[int], int] | None:
    """libgomp's ``omp_pause_resource_all`` from the copy torch loaded, or None."""
    if not torch.backends.openmp.is_available():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libgomp" in line}
    except OSError:
        return None
    paths = {path for path in paths if os.path.basename(path).startswith("libgomp")}
    if len(paths) != 1:         # (none, or two runtimes: which one torch's regions use is unknown)
        return None
    try:
        library = ctypes.CDLL(paths.pop(), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        pause = library.omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int
    return pause


def torch_workers_releasable() -> bool:
    """Whether :func:`release_torch_workers` can act in this process (torch on libgomp)."""
    return _pause_all() is not None


def release_torch_workers(session_threads: int) -> None:
    """Let torch's idle OpenMP workers of the calling thread go before an onnxruntime run on
    ``session_threads`` intra-op threads (0: onnxruntime's choice, one per core), where both
    torch and the run use more than one thread; otherwise nothing."""
    if session_threads == 1 or (session_threads == 0 and (os.cpu_count() or 1) < 2):
        return
    pause = _pause_all()
    if pause is not None and torch.get_num_threads() > 1:
        pause(_OMP_PAUSE_SOFT)  # (-1 inside a parallel region: nothing to release there)


def default_session_options(threads: int = 0) -> Any:
    """The session options ORTModule uses when given none: onnxruntime's defaults with
    ``threads`` intra-op threads (0: onnxruntime's choice); the threads spin during a run and
    stop at its end where torch's workers can be released before it
    (:func:`torch_workers_releasable`), else they sleep between nodes, since threads that spin
    on after a run take the CPUs torch's threads need next."""
    from ortagent._core import SessionOptions

    options = SessionOptions()
    options.intra_op_num_threads = threads
    if torch_workers_releasable():
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
    else:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options
