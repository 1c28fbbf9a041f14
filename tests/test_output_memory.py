"""Where a TrainingAgent's preallocated outputs live: tensors a caller drops go back to the
agent (SpareOutputs, ortagent/_values.pxi) for the next step to write into, and new tensors come
from the pooled CPU allocator (include/ortagent/cpu_pool.h, ortagent/_cpu_pool.pxi).

What must hold: every value stays right while anything can still see it (held outputs, NumPy
views, an output of another session aliasing it, a closed value); the same tensors go round
when the caller drops each step's outputs; nothing leaks when the agent closes or dies first,
or when outputs are dropped on another thread; and onnxruntime's tensors of every size made on
the pool come back to it, those above the largest size class bypassing the free lists.

Each test reads the pool's counters ("live": blocks handed out and not freed) before and
after, so earlier tests' leftovers do not matter; the counters are process-wide, so the tests
run no agents on other threads meanwhile.
"""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import signal
import subprocess
import threading
import time
import warnings

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import ortagent
from ortagent_testkit import training_graphs as tg
from ortagent._core import _pool_counts as counts
from ortagent._core import _pool_address, _pooled_tensor

REPO_ROOT = Path(__file__).resolve().parents[1]


def delta(before: dict[str, int]) -> dict[str, int]:
    after = counts()
    return {key: after[key] - before[key] for key in after}


def mul_add_model(rows: int, cols: int) -> "tg.onnx.ModelProto":
    """out = x * w + bias with x [rows, cols] f32; gradients of x, w and bias."""
    f32 = np.float32
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "bias"], ["out"]),
        tg.yield_node(["out"], ["out_grad"], [0]),
        helper.make_node("Mul", ["out_grad", "w"], ["x_grad"]),
        helper.make_node("Mul", ["out_grad", "x"], ["gx"]),
        helper.make_node("ReduceSum", ["gx", "axis0"], ["w_grad"], keepdims=0),
        helper.make_node("ReduceSum", ["out_grad", "axis0"], ["bias_grad"], keepdims=0),
    ]
    return tg.make_model(
        nodes,
        [tg.tensor("x", f32, [rows, cols]), tg.tensor("w", f32, [cols]), tg.tensor("bias", f32, [cols])],
        [tg.tensor("x_grad", f32, [rows, cols]), tg.tensor("w_grad", f32, [cols]),
         tg.tensor("bias_grad", f32, [cols])],
        [tg.axes("axis0", [0])], name="mul_add_pool")


def identity_session() -> ortagent.InferenceSession:
    """b = Identity(a), a f32[2, 3]: onnxruntime returns the feed's tensor itself as b."""
    return ortagent.InferenceSession(tg.make_model(
        [helper.make_node("Identity", ["a"], ["b"])], [tg.tensor("a", np.float32, [2, 3])],
        [tg.tensor("b", np.float32, [2, 3])], name="identity", ms_domain=False).SerializeToString())


class Stepper:
    """A TrainingAgent on mul_add_model driven through the state API, checked against NumPy."""

    def __init__(self, rows: int = 2, cols: int = 3, seed: int = 0):
        self.shape = (rows, cols)
        cpu = ortagent.OrtDevice.cpu()
        self.agent = ortagent.TrainingAgent(
            mul_add_model(rows, cols).SerializeToString(), fw_feed_names=["x", "w", "bias"],
            fw_outputs_device_info=[ortagent.OrtDevice(cpu, 0, 0)],
            bw_fetches_names=["x_grad", "w_grad", "bias_grad"],
            bw_outputs_device_info=[ortagent.OrtDevice(cpu, 0, 0)] * 3)
        self.rng = np.random.default_rng(seed)

    def step(self):
        """One forward + backward; returns (forward output, gradients) as OrtValues and the
        NumPy values they must hold."""
        rows, cols = self.shape
        x = self.rng.standard_normal((rows, cols)).astype(np.float32)
        w = self.rng.standard_normal(cols).astype(np.float32)
        bias = self.rng.standard_normal(cols).astype(np.float32)
        g = self.rng.standard_normal((rows, cols)).astype(np.float32)
        state = ortagent.PartialGraphExecutionState()
        fetches: list = []
        self.agent.run_forward([ortagent.OrtValue.ortvalue_from_numpy(a) for a in (x, w, bias)], fetches, state)
        grads: list = []
        self.agent.run_backward([ortagent.OrtValue.ortvalue_from_numpy(g)], grads, state)
        expected = [x * w + bias, g * w, (g * x).sum(0), g.sum(0)]
        return [*fetches, *grads], expected


def assert_holds(values, expected):
    for value, want in zip(values, expected, strict=True):
        np.testing.assert_allclose(value.numpy(), want, rtol=1e-6, atol=1e-6)


def warm(stepper: Stepper) -> None:
    """Two steps: the first confirms the fixed output shapes, the second preallocates; both
    steps' outputs are dropped, so the agent holds a spare for each of its four outputs."""
    for _ in range(2):
        values, expected = stepper.step()
        assert_holds(values, expected)
        del values
    gc.collect()


def test_a_step_writes_into_the_outputs_the_previous_step_gave_back():
    stepper = Stepper()
    warm(stepper)
    before = counts()
    addresses = None
    for _ in range(20):
        values, expected = stepper.step()
        assert_holds(values, expected)
        step_addresses = [v.data_ptr() for v in values]
        assert addresses is None or step_addresses == addresses
        addresses = step_addresses
        del values
    # no tensor made or freed: the same four tensors went round
    assert delta(before) == {"live": 0, "reused": 0, "fresh": 0, "kept": 0}


def test_outputs_still_held_are_never_written_again():
    stepper = Stepper(rows=4, cols=5)
    warm(stepper)
    held = [stepper.step() for _ in range(12)]
    for step_values, step_expected in held:   # every step's values intact after later steps
        assert_holds(step_values, step_expected)
    addresses = [v.data_ptr() for step_values, _ in held for v in step_values]
    assert len(set(addresses)) == len(addresses)
    del step_values, step_expected
    gc.collect()
    before = counts()
    del held
    gc.collect()
    # one output per slot waits in the agent for the next step; the other 44 blocks are freed
    assert delta(before)["live"] == -44


def test_a_numpy_view_keeps_its_output_from_being_written_again():
    stepper = Stepper()
    warm(stepper)
    values, expected = stepper.step()
    views = [v.numpy() for v in values]
    addresses = [v.data_ptr() for v in values]
    del values                                 # the views keep the OrtValues
    later, later_expected = stepper.step()
    assert not set(addresses) & {v.data_ptr() for v in later}
    for view, want in zip(views, expected):
        np.testing.assert_allclose(view, want, rtol=1e-6, atol=1e-6)
    assert_holds(later, later_expected)


def test_an_output_fed_to_another_session_and_aliased_is_not_written_again():
    """An Identity session returns its feed's tensor itself as its output: the output keeps
    the agent's output (its memory owner) alive, so the next step cannot take that tensor."""
    stepper = Stepper()
    warm(stepper)
    identity = identity_session()
    values, expected = stepper.step()
    (alias,) = identity.run_with_ort_values(["b"], {"a": values[1]})
    del values
    for _ in range(3):
        later, later_expected = stepper.step()
        assert_holds(later, later_expected)
        del later
    np.testing.assert_allclose(alias.numpy(), expected[1], rtol=1e-6, atol=1e-6)


def test_an_output_bound_to_an_iobinding_is_not_written_again():
    """A binding holds the value it was given (and onnxruntime's binding a copy of the tensor):
    dropping the caller's reference gives nothing back, so later steps leave it alone."""
    stepper = Stepper()
    warm(stepper)
    identity = identity_session()
    binding = identity.io_binding()
    values, expected = stepper.step()
    binding.bind_ortvalue_input("a", values[1])
    binding.bind_output("b")
    del values
    for _ in range(3):
        later, later_expected = stepper.step()
        assert_holds(later, later_expected)
        del later
    identity.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], expected[1], rtol=1e-6, atol=1e-6)


def test_an_output_fed_to_the_next_step_is_read_before_it_is_given_back():
    """A recurrent loop: each step's forward output is the next step's x. The feed is in use
    (and referenced by the caller) while the step runs, so no output of that step lands on it."""
    stepper = Stepper()
    warm(stepper)
    rng = np.random.default_rng(7)
    w = rng.standard_normal(3).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    g = np.ones((2, 3), np.float32)
    x_value = ortagent.OrtValue.ortvalue_from_numpy(rng.standard_normal((2, 3)).astype(np.float32))
    for _ in range(6):
        x = x_value.numpy().copy()
        state = ortagent.PartialGraphExecutionState()
        fetches: list = []
        stepper.agent.run_forward([x_value, ortagent.OrtValue.ortvalue_from_numpy(w),
                                   ortagent.OrtValue.ortvalue_from_numpy(bias)], fetches, state)
        grads: list = []
        stepper.agent.run_backward([ortagent.OrtValue.ortvalue_from_numpy(g)], grads, state)
        np.testing.assert_allclose(fetches[0].numpy(), x * w + bias, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(grads[1].numpy(), (g * x).sum(0), rtol=1e-6, atol=1e-6)
        x_value = fetches[0]                   # the previous x goes back to the agent now
        del fetches, grads, state


def test_a_closed_output_is_freed_not_given_back():
    stepper = Stepper()
    warm(stepper)
    values, expected = stepper.step()
    before = counts()
    values[0].close()                          # a closed value may still be bound or aliased
    assert delta(before)["live"] == -1
    del values                                 # the other three go back to the agent
    values, expected = stepper.step()          # three given back, one new from the pool
    assert_holds(values, expected)
    assert delta(before) == {"live": 0, "reused": 1, "fresh": 0, "kept": 0}


def test_a_closed_agent_frees_its_spares_and_takes_nothing_back():
    idle, busy = Stepper(), Stepper(seed=3)
    warm(idle)                                 # holds a spare for each of its 4 outputs
    warm(busy)
    values, expected = busy.step()             # busy's spares are in use
    before = counts()
    idle.agent.close()
    assert delta(before)["live"] == -4
    busy.agent.close()
    assert delta(before)["live"] == -4
    assert_holds(values, expected)             # outputs stay valid after their agent closes
    del values
    gc.collect()
    assert delta(before)["live"] == -8


def test_outputs_outlive_their_agent_and_their_numpy_views_outlive_them():
    stepper = Stepper()
    warm(stepper)
    values, expected = stepper.step()
    arrays = [v.numpy() for v in values]
    before = counts()
    del stepper
    gc.collect()
    assert_holds(values, expected)
    del values
    gc.collect()
    assert delta(before)["live"] == 0          # the NumPy views still hold the tensors
    for array, want in zip(arrays, expected):
        np.testing.assert_allclose(array, want, rtol=1e-6, atol=1e-6)
    del arrays, array
    gc.collect()
    # the agent is gone: its spares went with it, and what the views held is freed
    assert delta(before)["live"] == -4


def test_outputs_dropped_on_another_thread_come_back():
    stepper = Stepper()
    warm(stepper)
    values, expected = stepper.step()
    assert_holds(values, expected)
    addresses = [v.data_ptr() for v in values]
    before = counts()
    box = [values]
    del values
    worker = threading.Thread(target=box.clear)
    worker.start()
    worker.join()
    values, expected = stepper.step()
    assert_holds(values, expected)
    assert [v.data_ptr() for v in values] == addresses
    assert delta(before) == {"live": 0, "reused": 0, "fresh": 0, "kept": 0}


def test_agents_stepping_on_two_threads_keep_their_outputs_apart():
    steppers = [Stepper(seed=1), Stepper(rows=3, cols=7, seed=2)]
    for stepper in steppers:
        warm(stepper)
    before = counts()
    failures: list = []

    def work(stepper):
        try:
            for _ in range(200):
                values, expected = stepper.step()
                assert_holds(values, expected)
        except BaseException as error:        # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in steppers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    gc.collect()
    assert delta(before)["live"] == 0


@pytest.mark.parametrize("nbytes", [1, 64, 65, 4096, 65536, 65537, 1 << 20])
def test_a_tensor_of_any_size_round_trips_through_the_pool(nbytes):
    """Tensors made by onnxruntime (CreateTensorAsOrtValue) on the pool: sizes up to 64 KiB
    come back to a free list, larger ones are malloc'd and freed each time. The whole buffer
    is written and read back (an overrun shows under the ASan build)."""
    gc.collect()
    before = counts()
    for round_ in range(3):
        value = _pooled_tensor(nbytes)
        assert value.device_name() == "cpu"
        assert value.shape() == [nbytes]
        assert value.data_ptr() % 64 == 0
        array = value.numpy()
        array[:] = np.arange(nbytes, dtype=np.uint8) + round_
        np.testing.assert_array_equal(value.numpy(), (np.arange(nbytes) + round_).astype(np.uint8))
        del value, array
    change = delta(before)
    assert change["live"] == 0
    if nbytes <= 65536:
        assert change["fresh"] + change["reused"] == 3 and change["reused"] >= 2, change
        assert change["kept"] in (0, 1), change
    else:
        assert change == {"live": 0, "reused": 0, "fresh": 3, "kept": 0}


def test_pooled_outputs_export_through_dlpack():
    stepper = Stepper()
    stepper.step()
    values, expected = stepper.step()
    for value, want in zip(values, expected):
        assert value.device_name() == "cpu"
        np.testing.assert_allclose(np.from_dlpack(value), want, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def hold_pool_lock(tmp_path_factory):
    """hold_pool_lock(True/False): take or release the pool's lock from outside ortagent.

    The shipped modules have no such hook: tests/pool_lock.c is compiled here against
    include/ortagent/cpu_pool.h and given the pool's address (_core._pool_address())."""
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("gcc is not installed: this test compiles tests/pool_lock.c")
    library = tmp_path_factory.mktemp("pool_lock") / "pool_lock.so"
    result = subprocess.run([compiler, "-std=gnu11", "-Wall", "-Werror", "-Wno-unused-function", "-shared",
                             "-fPIC", "-I", str(REPO_ROOT / "include"), "-o", str(library),
                             str(REPO_ROOT / "tests" / "pool_lock.c"), "-lpthread"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    helper_lib = ctypes.CDLL(str(library))
    helper_lib.ortagent_test_hold_pool_lock.argtypes = [ctypes.c_void_p, ctypes.c_int]
    helper_lib.ortagent_test_hold_pool_lock.restype = None
    pool = _pool_address()
    assert pool, "the pool's address is NULL"
    return lambda hold: helper_lib.ortagent_test_hold_pool_lock(pool, int(hold))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_child_forked_while_the_pool_is_locked_can_still_allocate(hold_pool_lock):
    """A fork while another thread is inside the pool's Alloc or Free (here: the lock held on
    purpose) must not leave the child with a lock nobody will release."""
    counts()                                   # the pool exists before the fork
    hold_pool_lock(True)
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a process with threads may deadlock the child:
            # the very case this test makes sure the pool survives
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:                           # the child: allocate and free through the pool
            try:
                value = _pooled_tensor(64)
                value.numpy()[:] = 7
                ok = bool((value.numpy() == 7).all())
                del value
                os._exit(0 if ok else 1)
            except BaseException:
                os._exit(2)
    finally:
        hold_pool_lock(False)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the pool's lock")
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
