"""Interleaved timing for the benchmarks: contenders sampled in short bursts, in rounds.

This machine (like most shared or power-managed ones) changes speed every few seconds, so
figures from separate runs, or even from one contender timed for ten seconds and then the
next, are not comparable. Every group therefore runs its contenders in *rounds*: one burst of
each contender (about ``burst_s`` seconds of calls), in a shuffled order, then the next round.
A contender's figure is the median over rounds of its per-call time; a ratio between two
contenders is the median over rounds of the ratio of their bursts in the same round (paired),
so a change of speed between rounds cancels out.

Contenders:

Each burst is timed with two clocks: the wall clock and the CPU time of the thread that ran it.
On a machine shared with other work the wall clock also counts the time other processes had
the CPU (here it spread the same burst over 1.6-3.5 µs per call while the CPU time stayed within
1.6-1.75 µs), so single-threaded groups report CPU time by default (``--clock``); the threads
and start-up groups always report wall time.

* :class:`PyCalls` -- ``fn(*args)`` called ``n`` times in a loop compiled for its arity (no
  lambda or ``*args`` unpacking in the timed loop; the loop itself costs a few tens of ns per
  call, shown by the ``harness`` rows of the call-overhead group).
* :class:`Served` -- a burst run by another process that times itself and answers on a pipe:
  ``ort_floor --serve`` (the C floor) or ``refagent_worker.py`` (onnxruntime-training 1.19.2).
  The process stays alive and idle between bursts; its start-up is never timed.
* :class:`Threaded` -- ``k`` Python threads each calling its own ``fn(*args)`` ``n`` times,
  released together by a barrier; the figure is wall time (first start to last end) divided
  by all calls, i.e. the inverse of throughput.
* :class:`FreshProcess` -- one new interpreter per sample, which reports a time measured
  inside itself (the start-up group).
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from itertools import repeat

perf_ns = time.perf_counter_ns
cpu_ns = time.thread_time_ns

# -- the timed loops ---------------------------------------------------------------------------

_LOOPS: dict[int, Callable] = {}


def call_loop(arity: int) -> Callable:
    """``loop(n, fn, a0, ..., a{arity-1})`` -> (wall ns, thread CPU ns) of n calls
    ``fn(a0, ...)``."""
    loop = _LOOPS.get(arity)
    if loop is None:
        names = ", ".join(f"a{i}" for i in range(arity))
        params = f"n, fn{', ' + names if arity else ''}"
        source = (f"def loop({params}):\n"
                  f"    cpu = cpu_ns()\n"
                  f"    start = perf_ns()\n"
                  f"    for _ in repeat(None, n):\n"
                  f"        fn({names})\n"
                  f"    wall = perf_ns() - start\n"
                  f"    return wall, cpu_ns() - cpu\n")
        namespace = {"perf_ns": perf_ns, "cpu_ns": cpu_ns, "repeat": repeat}
        exec(compile(source, f"<call_loop {arity}>", "exec"), namespace)
        loop = _LOOPS[arity] = namespace["loop"]
    return loop


class Contender:
    """One thing timed. ``key`` is unique in its group; ``label`` is what the table shows;
    ``side`` says whose it is (``C``, ``ortagent``, ``onnxruntime``, ``ort-training 1.19.2``,
    ``harness``)."""

    def __init__(self, key: str, label: str, side: str) -> None:
        self.key = key
        self.label = label
        self.side = side
        self.n = 1

    def burst(self, n: int) -> tuple[float, float]:
        """(wall ns, CPU ns) of n calls."""
        raise NotImplementedError

    def calibrate(self, burst_s: float, warmup: int = 3) -> None:
        """Choose n so that one burst lasts about burst_s of CPU time (the wall clock would
        give fewer calls per burst while other processes share the CPU)."""
        for _ in range(warmup):
            self.burst(1)
        n, elapsed = 1, 0.0
        floor_ns = min(burst_s * 1e9 / 4, 5e6)
        while True:
            elapsed = min(self.burst(n))
            if elapsed >= floor_ns or n >= 1 << 26:
                break
            n *= 2 if elapsed * 8 > floor_ns else 8
        per_call = max(elapsed / n, 1.0)
        self.n = max(1, int(round(burst_s * 1e9 / per_call)))

    def sample(self) -> tuple[float, float]:
        """(wall, CPU) ns per call of one burst. One untimed call comes first: the first call
        after other contenders ran meets cold caches, a cost of the interleaving itself, which
        would otherwise weigh more on contenders with fewer calls per burst."""
        self.burst(1)
        wall, cpu = self.burst(self.n)
        return wall / self.n, cpu / self.n

    def close(self) -> None:
        pass


class PyCalls(Contender):
    def __init__(self, key, label, side, fn, *args) -> None:
        super().__init__(key, label, side)
        self.fn = fn
        self.args = args
        self.loop = call_loop(len(args))

    def burst(self, n: int) -> tuple[float, float]:
        return self.loop(n, self.fn, *self.args)


class ServerError(RuntimeError):
    pass


class BurstServer:
    """A process that times bursts itself: it prints one JSON line when ready, then answers
    each ``NAME N`` line on its stdin with a JSON line holding ``ns`` (elapsed for N calls) and
    ``cpu_ns`` (the CPU time of the thread that ran them)."""

    def __init__(self, command: Sequence[str], *, env=None, cwd=None, what: str = "") -> None:
        self.what = what or command[0]
        self.proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, env=env, cwd=cwd)
        self.ready = self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise ServerError(f"{self.what} stopped ({self.proc.returncode}): "
                              f"{self.proc.stderr.read()[-3000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise ServerError(f"{self.what}: {reply['error']}")
        return reply

    def burst(self, name: str, n: int) -> tuple[float, float]:
        self.proc.stdin.write(f"{name} {n}\n")
        self.proc.stdin.flush()
        reply = self._reply()
        return float(reply["ns"]), float(reply["cpu_ns"])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


class Served(Contender):
    def __init__(self, key, label, side, server: BurstServer, name: str) -> None:
        super().__init__(key, label, side)
        self.server = server
        self.name = name

    def burst(self, n: int) -> tuple[float, float]:
        return self.server.burst(self.name, n)


class Threaded(Contender):
    """``len(calls)`` threads; thread i runs ``calls[i] = (fn, args)`` n times."""

    def __init__(self, key, label, side, calls: Sequence[tuple[Callable, tuple]]) -> None:
        super().__init__(key, label, side)
        self.calls = list(calls)

    def burst(self, n: int) -> tuple[float, float]:
        k = len(self.calls)
        starts = [0] * k
        ends = [0] * k
        errors: list[BaseException] = []
        barrier = threading.Barrier(k)

        def work(i: int) -> None:
            fn, args = self.calls[i]
            loop = call_loop(len(args))
            try:
                barrier.wait()
                starts[i] = perf_ns()
                loop(n, fn, *args)
                ends[i] = perf_ns()
            except BaseException as exc:  # noqa: BLE001 - reported in the caller
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(k)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        wall = max(ends) - min(starts)            # wall time of n calls in each thread
        return wall, wall

    def sample(self) -> tuple[float, float]:
        """ns of wall time per call, all threads together (the inverse of throughput); no
        CPU time (the wall time is given twice)."""
        per_call = self.burst(self.n)[0] / (self.n * len(self.calls))
        return per_call, per_call


class FreshProcess(Contender):
    """One interpreter per sample running ``code``; the code prints a JSON object whose
    ``seconds`` and ``cpu_seconds`` entries are the sample (wall clock, CPU time of its main
    thread). Other entries of the last sample are kept in ``info``."""

    def __init__(self, key, label, side, code: str, *, python: str | None = None, env=None,
                 cwd=None) -> None:
        super().__init__(key, label, side)
        self.command = [python or sys.executable, "-c", code]
        self.env = env
        self.cwd = cwd
        self.info: dict = {}

    def calibrate(self, burst_s: float, warmup: int = 1) -> None:
        for _ in range(warmup):
            self.sample()

    def sample(self) -> tuple[float, float]:
        proc = subprocess.run(self.command, capture_output=True, text=True, env=self.env,
                              cwd=self.cwd, timeout=300)
        if proc.returncode != 0:
            raise ServerError(f"{self.label}: exit {proc.returncode}: {proc.stderr[-3000:]}")
        self.info = json.loads(proc.stdout.strip().splitlines()[-1])
        return float(self.info["seconds"]) * 1e9, float(self.info["cpu_seconds"]) * 1e9


# -- rounds ------------------------------------------------------------------------------------


class NullProgress:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str):
    """A tqdm bar on stderr, or a silent stand-in when tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return NullProgress()
    return tqdm(total=total, desc=desc, unit="burst", file=sys.stderr, leave=True,
                dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")


class Samples(dict):
    """key -> ns per call of each round (index = round), by the chosen clock; ``other`` holds
    the other clock's, ``clock`` names the chosen one."""

    def __init__(self, clock: str, chosen: dict, other: dict) -> None:
        super().__init__(chosen)
        self.clock = clock
        self.other = other


def run_rounds(blocks: Sequence[Sequence[Contender]], rounds: int, burst_s: float, *,
               desc: str, seed: int = 0, clock: str = "wall") -> Samples:
    """Calibrate every contender, then ``rounds`` rounds. A round visits the blocks in order and
    the contenders of each block in a fresh random order, one burst each. Returns, per key, the
    ns per call of each round by ``clock`` ("wall" or "cpu"), the other clock's alongside."""
    contenders = [c for block in blocks for c in block]
    keys = [c.key for c in contenders]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate contender keys in {desc}")
    bar = progress_bar(len(contenders) * (rounds + 1), desc)
    rng = random.Random(seed)
    gc.collect()
    gc.freeze()             # what exists now is never scanned again: less collector noise
    try:
        for c in contenders:
            c.calibrate(burst_s)
            bar.update(1)
        wall: dict[str, list[float]] = {k: [] for k in keys}
        cpu: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(rounds):
            for block in blocks:
                order = list(block)
                rng.shuffle(order)
                for c in order:
                    w, t = c.sample()
                    wall[c.key].append(w)
                    cpu[c.key].append(t)
                    bar.update(1)
    finally:
        bar.close()
        gc.unfreeze()
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', not {clock!r}")
    return Samples(clock, cpu, wall) if clock == "cpu" else Samples(clock, wall, cpu)


# -- statistics --------------------------------------------------------------------------------


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, statistics.median(values), q3


def summary(values: Sequence[float]) -> dict:
    q1, med, q3 = quartiles(values)
    return {"median": med, "q1": q1, "q3": q3, "min": min(values), "max": max(values),
            "n": len(values)}


def paired(a: Sequence[float], b: Sequence[float], fn=lambda x, y: x / y) -> list[float]:
    """fn(a_r, b_r) for each round r."""
    if len(a) != len(b):
        raise ValueError("paired samples of different lengths")
    return [fn(x, y) for x, y in zip(a, b)]
