"""What every benchmark group shares: paths, the session options, the C floor, settings."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
# where `make bench` leaves its results (latest.json, latest.md, latest.png): a build artefact
RESULTS_DIR = REPO_ROOT / "build" / "bench"

# NumPy's OpenBLAS starts a worker thread per extra CPU, which spins at times (perf: ~5% of the
# samples of two threads running tiny models on 2 CPUs). Nothing timed here calls BLAS, and on a
# small machine that worker takes CPU time from the threads being measured; set before any
# benchmark imports NumPy (every entry point -- bench, callgrind_counts, threads_probe -- imports
# this module first; a value set by the caller wins).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The same session settings everywhere: C floor, ortagent, onnxruntime's Python, 1.19.2 agent.
INTRA_OP_THREADS = 1
INTER_OP_THREADS = 1
SESSION_SETTINGS = {"intra_op_threads": INTRA_OP_THREADS, "inter_op_threads": INTER_OP_THREADS,
                    "execution_mode": "sequential", "graph_optimization_level": "ORT_ENABLE_ALL"}


@dataclass
class Settings:
    quick: bool
    burst_s: float
    rounds: dict[str, int]
    workdir: Path
    seed: int = 0
    clock: str = "cpu"      # for the single-threaded groups (calls, values, agent)
    wait_quiet_s: float = 0.0   # how long the threads group waits for a quiet machine
    extra: dict = field(default_factory=dict)

    @classmethod
    def make(cls, quick: bool, workdir: Path, rounds_scale: float = 1.0,
             burst_ms: float | None = None, clock: str = "cpu") -> Settings:
        if quick:
            rounds = {"calls": 7, "values": 7, "agent": 7, "threads": 7, "startup": 4, "torch": 5}
            burst = 0.01
        else:
            rounds = {"calls": 41, "values": 31, "agent": 31, "threads": 31, "startup": 15, "torch": 21}
            burst = 0.03
        rounds = {k: max(2, int(round(v * rounds_scale))) for k, v in rounds.items()}
        return cls(quick, burst if burst_ms is None else burst_ms / 1e3, rounds, workdir,
                   clock=clock)


def background_busy(seconds: float = 1.0) -> float | None:
    """CPUs kept busy by other processes: /proc/stat over `seconds` while this one sleeps."""
    def read():
        with open("/proc/stat") as handle:
            fields = [int(x) for x in handle.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]), idle
    try:
        total0, idle0 = read()
        time.sleep(seconds)
        total1, idle1 = read()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    if total <= 0:
        return None
    return round((1 - (idle1 - idle0) / total) * (os.cpu_count() or 1), 2)


def wait_quiet(limit_s: float, busy_limit: float = 0.3) -> float | None:
    """Wait (up to limit_s) until other processes keep fewer than busy_limit CPUs busy;
    returns the last measurement."""
    deadline = time.monotonic() + limit_s
    busy = background_busy()
    while busy is not None and busy >= busy_limit and time.monotonic() < deadline:
        busy = background_busy(2.0)
    return busy


def load_module(name: str, path: Path):
    """Import a file that lives outside any package as a module (the demos)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def c_floor():
    from .c_floor import build

    return build


def ortagent_options():
    import ortagent

    options = ortagent.SessionOptions()
    options.intra_op_num_threads = INTRA_OP_THREADS
    options.inter_op_num_threads = INTER_OP_THREADS
    options.execution_mode = ortagent.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ortagent.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def onnxruntime_options():
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = INTRA_OP_THREADS
    options.inter_op_num_threads = INTER_OP_THREADS
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def onnxruntime_session(model_bytes: bytes):
    import onnxruntime

    return onnxruntime.InferenceSession(model_bytes, onnxruntime_options(),
                                        providers=["CPUExecutionProvider"])


def child_env() -> dict:
    """Environment for child Pythons: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env
