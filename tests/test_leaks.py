"""Leaks over long runs: 100,000 iterations of each kind of call, resident memory measured from
/proc/self/statm after a warm-up, and the live-handle counters back to where they started.

Each check first runs its step in chunks of a few thousand until a chunk leaves the resident set
unchanged (onnxruntime's arenas, the C, NumPy and Python allocators and ortagent's caches have
reached their steady state), then 100,000 times more in ten windows, and decides from the
growth *per window*, not from one before/after sample (see :func:`measure`). The bound is the
one of a single before/after comparison -- 1 MiB over the iterations, under 11 bytes per
iteration -- now asked of the rate at which the resident set keeps growing: a leak of even one
small object per call shows in every window. The measured rate is printed (``-s``) and recorded
as a test property; test_the_detector_flags_a_deliberate_leak shows it catching one.
"""

from __future__ import annotations

import ctypes
import gc
import statistics

import numpy as np
import pytest

from ortagent_testkit import onnx_models as models
import ortagent
from ortagent_testkit import training_graphs as tg
from ortagent import OrtValue
from reliability import KW1192_NAMES, UNDER_ASAN, changed, live, rss_bytes, settled

ITERATIONS = 100_000
WARMUP = 5_000
LIMIT = 1 << 20       # bytes of resident-set growth allowed over ITERATIONS, at a steady rate
WINDOWS = 10          # the measured iterations are run in this many windows
SAMPLES = 3           # resident-set samples per window; a window's level is the least of them


_libc = ctypes.CDLL(None)


def resident() -> int:
    """The resident set after a collection and malloc_trim(0): memory the C allocator keeps
    free for reuse (how much depends on what ran before in the process: a fragmented heap,
    glibc's adaptive mmap threshold) is handed back first, so what remains is memory in use."""
    gc.collect()
    _libc.malloc_trim(0)
    return rss_bytes()


def warm_up(step, chunk, max_chunks=40):
    """Run `step` in chunks until a chunk leaves the resident set where it was (onnxruntime's
    arenas, NumPy's and Python's allocators and ortagent's caches have settled). A real leak
    never settles; it then shows in the measured iterations."""
    previous = None
    for _ in range(max_chunks):
        for _ in range(chunk):
            step()
        now = resident()
        if previous is not None and now <= previous:
            return
        previous = now


class Growth:
    """What :func:`measure` saw: the level of each window and the growth between them."""

    def __init__(self, levels: list[int], iterations: int, samples: list[list[int]]) -> None:
        self.levels = levels
        self.iterations = iterations
        self.samples = samples
        self.steps = [after - before for before, after in zip(levels, levels[1:])]
        self.per_window = int(statistics.median(self.steps))       # the steady rate, bytes a window
        self.overall = levels[-1] - levels[0]
        # the steady rate extrapolated over all the iterations: what LIMIT bounds
        self.extrapolated = self.per_window * len(levels)

    def leaks(self, limit: int = LIMIT) -> bool:
        return self.extrapolated >= limit

    def __str__(self) -> str:
        return (f"{self.iterations} iterations in {len(self.levels)} windows: median growth "
                f"{self.per_window} bytes a window ({self.extrapolated} extrapolated over all the "
                f"iterations, limit {LIMIT}), {self.overall} overall; window levels {self.levels}")


def measure(step, iterations: int = ITERATIONS, windows: int = WINDOWS, samples: int = SAMPLES) -> Growth:
    """Run `step` `iterations` times in `windows` windows and say how the resident set grew.

    A window's level is the least of `samples` resident-set samples taken through it: what the
    process holds for good, without the transient peaks a sample can land on (onnxruntime's
    error path, for one, leaves a few hundred KiB to a few MiB in the heap now and then and
    hands it back a little later). The steady growth is the *median* of the growths from one
    window's level to the next.

    Why this still catches a real leak: memory leaked at some rate per call raises the level
    by that rate times the window's iterations in every window, so every step between windows,
    and thus their median, shows it (test_the_detector_flags_a_deliberate_leak). What it no
    longer fails on is what made the single before/after comparison flaky on a loaded machine:
    a one-time step of the level (the C heap fragmenting once, an allocator arena kept: steps of
    1 to 4 MiB were seen in clean runs) or a peak moves one or two of the steps, not their
    median. What no resident-set check sees, this one or the single comparison, is a leak small
    enough to fit in memory the allocators already hold free (Python's pools, the C heap's free
    chunks) until it has filled it; the live-handle counters are exact for ortagent's own
    handles."""
    samples = max(min(samples, iterations // windows), 1)
    per_sample = max(iterations // (windows * samples), 1)
    seen = []
    for _ in range(windows):
        window = []
        for _ in range(samples):
            for _ in range(per_sample):
                step()
            window.append(resident())
        seen.append(window)
    return Growth([min(window) for window in seen], per_sample * samples * windows, seen)


def check_steady(step, record_property, iterations=ITERATIONS, warmup=WARMUP):
    """Warm up, then :func:`measure`; the steady growth must stay under LIMIT (scaled to the
    iterations) and the live handles must come back to the steady state's."""
    warm_up(step, warmup)
    handles = live()        # what the steady state holds (e.g. a binding's last outputs)
    growth = measure(step, iterations)
    record_property("rss_growth_bytes", growth.extrapolated)
    record_property("rss_window_levels", growth.levels)
    print(f"\n{growth}")
    if not UNDER_ASAN:       # (AddressSanitizer's quarantine keeps freed memory resident)
        assert not growth.leaks(), f"the resident set keeps growing: {growth} (samples {growth.samples})"
    assert not changed(handles, settled(handles)), changed(handles, live())
    return growth


@pytest.fixture(scope="module")
def add():
    return ortagent.InferenceSession(models.add(shape=(3,)))


@pytest.fixture(scope="module")
def training_model():
    return tg.mul_add_case().model.SerializeToString()


def test_run(add, record_property):
    a, b = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    feed = {"a": a, "b": b}

    def step():
        (c,) = add.run(None, feed)
        assert c[2] == 3.0

    check_steady(step, record_property)


def test_run_with_new_arrays_and_ort_values(add, record_property):
    b = OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))

    def step():
        (c,) = add.run_with_ort_values(["c"], {"a": np.arange(3, dtype=np.float32), "b": b})
        assert c.numpy()[2] == 3.0

    check_steady(step, record_property)


def test_iobinding_runs(add, record_property):
    binding = add.io_binding()
    binding.bind_cpu_input("a", np.arange(3, dtype=np.float32))
    binding.bind_cpu_input("b", np.ones(3, np.float32))
    binding.bind_output("c")

    def step():
        add.run_with_iobinding(binding)
        (c,) = binding.get_outputs()
        assert c.numpy()[2] == 3.0

    check_steady(step, record_property)


def test_failing_runs(add, record_property):
    """Errors raised by onnxruntime (a wrong extent) and by ortagent (a wrong dtype)."""
    wrong_extent = {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    wrong_dtype = {"a": np.ones(3), "b": np.ones(3)}

    def step():
        for feed in (wrong_extent, wrong_dtype):
            try:
                add.run(None, feed)
            except ortagent.OrtInvalidArgument:
                pass
            else:
                raise AssertionError("the run should have failed")

    check_steady(step, record_property, iterations=ITERATIONS // 2)


def _deliberate_leak() -> dict:
    """test_the_detector_flags_a_deliberate_leak's measurement (run in a fresh interpreter)."""
    add = ortagent.InferenceSession(models.add(shape=(3,)))
    feed = {"a": np.arange(3, dtype=np.float32), "b": np.ones(3, np.float32)}
    iterations = ITERATIONS // 5
    kept: list = []

    def clean():
        (c,) = add.run(None, feed)
        assert c[2] == 3.0

    def keeps_the_output():
        (c,) = add.run(None, feed)
        kept.append(c)

    warm_up(clean, WARMUP)
    results = {}
    for name, step in (("clean", clean), ("leaking", keeps_the_output)):
        growth = measure(step, iterations)
        kept.clear()
        results[name] = {"levels": growth.levels, "samples": growth.samples, "iterations": growth.iterations}
    return results


@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer's quarantine keeps freed memory resident")
def test_the_detector_flags_a_deliberate_leak(record_property):
    """The detector against a leak put there on purpose: test_run's step keeping each call's
    output array (a NumPy array over the memory onnxruntime allocated for the output, a few
    hundred bytes a call) is flagged, with growth in every window; the same step without the
    leak is not. A fifth of test_run's iterations, with the bound scaled to a fifth: the same
    bound per iteration (LIMIT over ITERATIONS, under 11 bytes). Measured in a fresh
    interpreter: in this one, after the torch bridge's tests, Python's allocator holds enough
    free memory (pools that freed objects left partly empty) for the leak's ~2 MB to fill
    unseen -- 143 KB of growth was measured, under the bound: the blind spot :func:`measure`
    names, which a fresh heap does not have."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO_ROOT, TESTS_DIR

    code = ("import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import test_leaks; "
            "print(json.dumps(test_leaks._deliberate_leak()))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, TESTS_DIR,
                                                                     os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code, TESTS_DIR, REPO_ROOT], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    limit = LIMIT * (ITERATIONS // 5) // ITERATIONS
    results = {name: Growth(**found) for name, found in json.loads(done.stdout.splitlines()[-1]).items()}
    for name, growth in results.items():
        record_property(f"{name}_bytes_per_window", growth.per_window)
        print(f"\n{name}: {growth}")
    assert not results["clean"].leaks(limit), results["clean"]
    assert results["leaking"].leaks(limit), results["leaking"]
    assert min(results["leaking"].steps) > 0, results["leaking"]     # in every window, not in one


def test_values_and_dlpack(record_property):
    array = np.arange(6, dtype=np.float32).reshape(2, 3)

    def step():
        value = OrtValue.ortvalue_from_numpy(array)
        back = np.from_dlpack(value)                          # export, consumed by NumPy
        imported = ortagent.from_dlpack(back)                 # import
        value.__dlpack__(max_version=(1, 0))                  # a capsule nobody consumes
        fresh = OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
        assert imported.data_ptr() == array.ctypes.data and fresh.shape() == [2, 3]

    check_steady(step, record_property)


def test_string_tensors(record_property):
    words = np.array(["a", "bc", "déjà"], dtype=object)

    def step():
        assert OrtValue.ortvalue_from_numpy(words).numpy()[2] == "déjà"

    check_steady(step, record_property, iterations=ITERATIONS // 2)


def test_agent_steps_run_id(training_model, record_property):
    agent = ortagent.TrainingAgent(training_model)
    feeds = tg.mul_add_case().make_feeds(np.random.default_rng(0))
    binding = agent.io_binding()
    for name in ("x", "w", "bias"):
        binding.bind_cpu_input(name, feeds[name])
    gradient = [np.ones((2, 3))]

    def step():
        _, run_id = agent.run_forward(binding, None)
        agent.run_backward(gradient, run_id)

    check_steady(step, record_property)
    assert agent.runs_in_flight == 0


def test_agent_steps_state_api(training_model, record_property):
    agent = ortagent.TrainingAgent(training_model, **KW1192_NAMES)
    feeds = tg.mul_add_case().make_feeds(np.random.default_rng(0))
    values = [OrtValue.ortvalue_from_numpy(feeds[n]) for n in ("x", "w", "bias")]
    gradient = [OrtValue.ortvalue_from_numpy(np.ones((2, 3)))]

    def step():
        state = ortagent.PartialGraphExecutionState()
        outputs: list = []
        agent.run_forward(values, outputs, state)
        results: list = []
        agent.run_backward(gradient, results, state)

    check_steady(step, record_property)


def test_abandoned_runs_are_released_on_close(training_model, record_property):
    """Runs forwarded and never resumed: the agent's close() frees them (run states and the
    values they hold), and doing so again and again does not grow the process."""
    feeds = tg.mul_add_case().make_feeds(np.random.default_rng(0))
    gc.collect()
    handles = live()

    def cycle(runs=2_000):
        agent = ortagent.TrainingAgent(training_model)
        binding = agent.io_binding()
        for name in ("x", "w", "bias"):
            binding.bind_cpu_input(name, feeds[name])
        for _ in range(runs):
            agent.run_forward(binding, None)
        assert agent.runs_in_flight == runs
        assert live()["run_state"] - handles["run_state"] == runs
        agent.close()
        assert agent.runs_in_flight == 0
        assert live()["run_state"] == handles["run_state"]

    growth = check_steady(cycle, record_property, iterations=20, warmup=2)
    assert not changed(handles, settled(handles))
    print(f"20 cycles of 2,000 abandoned runs: {growth}")


def test_abandoned_states_are_released_when_dropped(training_model, record_property):
    agent = ortagent.TrainingAgent(training_model, **KW1192_NAMES)
    feeds = tg.mul_add_case().make_feeds(np.random.default_rng(0))
    values = [OrtValue.ortvalue_from_numpy(feeds[n]) for n in ("x", "w", "bias")]

    def step():
        agent.run_forward(values, [], ortagent.PartialGraphExecutionState())   # never resumed

    check_steady(step, record_property)
