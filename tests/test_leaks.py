"""Leaks over long runs: 100,000 iterations of each kind of call, resident memory measured from
/proc/self/statm after a warm-up, and the live-handle counters back to where they started.

Each check first runs its step in chunks of a few thousand until a chunk leaves the resident set
unchanged (onnxruntime's arenas, the C, NumPy and Python allocators and ortagent's caches have
reached their steady state), then 100,000 times more, sampling the resident set (after
``malloc_trim``) ten times, and requires it to have grown by less than 1 MiB -- under 11 bytes
per iteration, so a leak of even one small object per call shows. The measured growth is printed (``-s``) and
recorded as a test property.
"""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

import onnx_models as models
import ortagent
import training_graphs as tg
from ortagent import OrtValue
from reliability import KW1192_NAMES, UNDER_ASAN, changed, live, rss_bytes, settled

ITERATIONS = 100_000
WARMUP = 5_000
LIMIT = 1 << 20       # bytes of resident-set growth allowed over ITERATIONS


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


def check_steady(step, record_property, iterations=ITERATIONS, warmup=WARMUP, samples=10):
    """Warm up, then run `step` `iterations` times in `samples` chunks; the growth is the least
    resident set of the last three chunks minus the resident set before them (allocator noise
    of a few hundred KiB comes and goes; a leak grows in every sample)."""
    warm_up(step, warmup)
    handles = live()        # what the steady state holds (e.g. a binding's last outputs)
    start = resident()
    seen = []
    per_chunk = max(iterations // samples, 1)
    for _ in range(samples):
        for _ in range(per_chunk):
            step()
        seen.append(resident())
    growth = min(seen[-3:]) - start
    record_property("rss_growth_bytes", growth)
    print(f"\n{per_chunk * samples} iterations: resident set grew by {growth} bytes")
    if not UNDER_ASAN:       # (AddressSanitizer's quarantine keeps freed memory resident)
        assert growth < LIMIT, f"resident set grew by {growth} bytes over {iterations} iterations ({seen})"
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
    print(f"20 cycles of 2,000 abandoned runs: resident set grew by {growth} bytes")


def test_abandoned_states_are_released_when_dropped(training_model, record_property):
    agent = ortagent.TrainingAgent(training_model, **KW1192_NAMES)
    feeds = tg.mul_add_case().make_feeds(np.random.default_rng(0))
    values = [OrtValue.ortvalue_from_numpy(feeds[n]) for n in ("x", "w", "bias")]

    def step():
        agent.run_forward(values, [], ortagent.PartialGraphExecutionState())   # never resumed

    check_steady(step, record_property)
