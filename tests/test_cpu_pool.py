"""The pooled CPU allocator (include/ortagent/cpu_pool.h, ortagent._cpu_pool) behind a
TrainingAgent's preallocated outputs: blocks freed by one step serve the next, every value is
right while earlier steps' outputs are still held, outputs outlive their agent, blocks return
from any thread; and tensors of every size made on the pool by onnxruntime itself, those
above the largest size class bypassing the free lists.

Each test reads the pool's counters before and after, so earlier tests' leftovers do not
matter; the counters are process-wide, so the tests run no agents on other threads meanwhile.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from onnx import helper

import ortagent
import training_graphs as tg
from ortagent._cpu_pool import _pool_counts as counts
from ortagent._cpu_pool import _pooled_tensor


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


def test_a_step_reuses_the_blocks_the_previous_step_freed():
    stepper = Stepper()
    values, expected = stepper.step()          # first run: confirms the fixed output shapes
    assert_holds(values, expected)
    del values
    values, expected = stepper.step()          # preallocates from here on
    assert_holds(values, expected)
    del values
    before = counts()
    for _ in range(20):
        values, expected = stepper.step()
        assert_holds(values, expected)
        del values
    change = delta(before)
    # four outputs a step (out, x_grad, w_grad, bias_grad), each from a freed block
    assert change["reused"] == 80, change
    assert change["fresh"] == 0, change
    assert change["live"] == 0, change


def test_outputs_held_across_steps_never_share_a_block():
    stepper = Stepper(rows=4, cols=5)
    stepper.step()
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
    assert delta(before)["live"] == -48


def test_outputs_outlive_their_agent_and_their_numpy_views_outlive_them():
    stepper = Stepper()
    stepper.step()
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
    assert delta(before)["live"] == -4


def test_blocks_freed_on_another_thread_return_to_the_pool():
    stepper = Stepper()
    stepper.step()
    values, expected = stepper.step()
    assert_holds(values, expected)
    before = counts()
    box = [values]
    del values
    worker = threading.Thread(target=box.clear)
    worker.start()
    worker.join()
    change = delta(before)
    assert change["live"] == -4
    assert change["kept"] == 4
    values, expected = stepper.step()
    assert_holds(values, expected)
    assert delta(before)["reused"] == 4


def test_agents_stepping_on_two_threads_share_the_pool_safely():
    steppers = [Stepper(seed=1), Stepper(rows=3, cols=7, seed=2)]
    for stepper in steppers:
        stepper.step()
    gc.collect()
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
    change = delta(before)
    assert change["live"] == 0, change
    assert change["reused"] + change["fresh"] == 2 * 200 * 4


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
