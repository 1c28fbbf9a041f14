"""The run core's one retry rule (ortagent/_run_core.pxi), the same for InferenceSession.run,
the TrainingAgent's halves and IOBinding: a run that fails with INVALID_ARGUMENT while
onnxruntime wrote into buffers of ours runs once more with onnxruntime allocating them; any
other failure is raised at once.

Before the run core, run() and the agent's hot path ran a failed run again after *any* error
once they had preallocated an output, so a kernel failing on the caller's data (FAIL) ran
twice, while IOBinding retried on INVALID_ARGUMENT only. The runs onnxruntime made are counted
in its profile (one ``model_run`` event per Run, failed runs included).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import ortagent
from ortagent_testkit import training_graphs as tg
from ortagent.errors import OrtFail, OrtInvalidArgument


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _profiled(tmp_path, name):
    options = ortagent.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.fspath(tmp_path / name)
    return options


def _model_runs(profile_file):
    with open(profile_file) as handle:
        return sum(1 for event in json.load(handle) if event.get("name") == "model_run")


def _fixed_and_reshape():
    """y = x + x of fixed shape [4] (preallocated once a run confirms it) and z = Reshape(x, s),
    which fails (FAIL, not INVALID_ARGUMENT) when s does not fit x."""
    return _model(
        [helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Reshape", ["x", "s"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])


def test_session_runs_a_failing_kernel_once_with_preallocated_outputs(tmp_path):
    session = ortagent.InferenceSession(_fixed_and_reshape(), _profiled(tmp_path, "session"))
    x = np.arange(4, dtype=np.float32)
    good, bad = np.array([2, 2], np.int64), np.array([3, 3], np.int64)
    for _ in range(3):          # the first run confirms y's shape, the next ones preallocate it
        y, z = session.run(None, {"x": x, "s": good})
    np.testing.assert_array_equal(y, x + x)
    with pytest.raises(OrtFail, match="Reshape"):
        session.run(None, {"x": x, "s": bad})
    y, z = session.run(["y", "z"], {"x": x, "s": good})
    np.testing.assert_array_equal(y, x + x)
    np.testing.assert_array_equal(z, x.reshape(2, 2))
    assert y.base is None       # still preallocated: a new array onnxruntime wrote into
    assert _model_runs(session.end_profiling()) == 5        # 3 + the failed one, once + 1


def test_session_retries_a_refused_preallocated_output_once_and_stops_preallocating(tmp_path):
    # y is declared [2] but follows x's length: a run with 3 elements refuses the preallocated
    # buffer with INVALID_ARGUMENT, runs again with onnxruntime allocating, and the session
    # stops preallocating.
    model = _model([helper.make_node("Add", ["x", "x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    session = ortagent.InferenceSession(model, _profiled(tmp_path, "refused"))
    two, three = np.ones(2, np.float32), np.arange(3, dtype=np.float32)
    for _ in range(2):
        (y,) = session.run(None, {"x": two})
    assert y.base is None
    (y,) = session.run(None, {"x": three})
    np.testing.assert_array_equal(y, three + three)
    (y,) = session.run(None, {"x": two})
    np.testing.assert_array_equal(y, two + two)
    assert y.base is not None   # onnxruntime's buffer: preallocation is off
    assert _model_runs(session.end_profiling()) == 2 + 2 + 1


def test_a_bad_feed_with_preallocated_outputs_names_the_input():
    # INVALID_ARGUMENT from a feed: the retry runs and fails the same way; the error names it.
    session = ortagent.InferenceSession(_fixed_and_reshape())
    x = np.arange(4, dtype=np.float32)
    for _ in range(2):
        session.run(None, {"x": x, "s": np.array([2, 2], np.int64)})
    wrong = ortagent.OrtValue.ortvalue_from_numpy(np.arange(4, dtype=np.float64))
    with pytest.raises(OrtInvalidArgument, match="input 'x' expects tensor\\(float\\)"):
        session.run(None, {"x": wrong, "s": np.array([2, 2], np.int64)})
    (y, _) = session.run(None, {"x": x, "s": np.array([2, 2], np.int64)})
    np.testing.assert_array_equal(y, x + x)


def _mul_add_with_reshape():
    """mul_add plus a second, non-differentiable module output r = Reshape(x, s)."""
    f32 = np.float32
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "bias"], ["out"]),
        helper.make_node("Reshape", ["x", "s"], ["r"]),
        tg.yield_node(["out", "r"], ["out_grad"], [0], non_differentiable_outputs=[1]),
        helper.make_node("Mul", ["out_grad", "w"], ["x_grad"]),
        helper.make_node("Mul", ["out_grad", "x"], ["gx"]),
        helper.make_node("ReduceSum", ["gx", "axis0"], ["w_grad"], keepdims=0),
        helper.make_node("ReduceSum", ["out_grad", "axis0"], ["bias_grad"], keepdims=0),
    ]
    return tg.make_model(
        nodes,
        [tg.tensor("x", f32, [2, 3]), tg.tensor("w", f32, [3]), tg.tensor("bias", f32, [3]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [tg.tensor("x_grad", f32, [2, 3]), tg.tensor("w_grad", f32, [3]), tg.tensor("bias_grad", f32, [3])],
        [tg.axes("axis0", [0])], name="mul_add_reshape")


def test_agent_runs_a_failing_forward_once_with_preallocated_outputs(tmp_path):
    cpu = ortagent.OrtDevice.cpu()
    device = ortagent.OrtDevice(cpu, 0, 0)
    agent = ortagent.TrainingAgent(
        _mul_add_with_reshape().SerializeToString(), fw_feed_names=["x", "w", "bias", "s"],
        fw_outputs_device_info=[device, device], bw_fetches_names=["x_grad", "w_grad", "bias_grad"],
        bw_outputs_device_info=[device] * 3, session_options=_profiled(tmp_path, "agent"))
    rng = np.random.default_rng(0)
    x, w, bias = (rng.standard_normal(shape).astype(np.float32) for shape in ((2, 3), (3,), (3,)))
    value = ortagent.OrtValue.ortvalue_from_numpy
    feeds = [value(x), value(w), value(bias), value(np.array([3, 2], np.int64))]
    gradient = np.ones((2, 3), np.float32)

    def step(inputs):
        state = ortagent.PartialGraphExecutionState()
        fetches = []
        agent.run_forward(inputs, fetches, state)
        grads = []
        agent.run_backward([value(gradient)], grads, state)
        return fetches, grads

    for _ in range(3):          # the first step confirms out's shape, the next ones preallocate it
        fetches, grads = step(feeds)
    np.testing.assert_allclose(fetches[0].numpy(), x * w + bias, rtol=1e-6)
    np.testing.assert_array_equal(fetches[1].numpy(), x.reshape(3, 2))
    np.testing.assert_allclose(grads[1].numpy(), (gradient * x).sum(0), rtol=1e-6)
    with pytest.raises(OrtFail, match="Reshape"):
        step(feeds[:3] + [value(np.array([4, 4], np.int64))])
    fetches, grads = step(feeds)
    np.testing.assert_allclose(fetches[0].numpy(), x * w + bias, rtol=1e-6)
    assert _model_runs(agent.forward_session.end_profiling()) == 5      # 3 + the failed one + 1
