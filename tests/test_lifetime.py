"""Ownership: every ORT handle has one owner, children keep parents alive, counters return to
their baseline, cycles are collected and the interpreter exits quietly with objects alive."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

from ortagent_testkit import onnx_models as models
import ortagent
from conftest import REPO_ROOT


def test_view_outlives_value_and_session(no_leaks):
    session = ortagent.InferenceSession(models.mlp())
    (value,) = session.run_with_ort_values(None, {"x": np.ones((3, 16), np.float32)})
    view = value.numpy()
    expected = view.copy()
    session_ref = weakref.ref(session)
    del value, session
    gc.collect()
    assert session_ref() is not None          # kept by the value behind the view
    np.testing.assert_array_equal(view, expected)
    del view
    gc.collect()
    assert session_ref() is None


def test_value_outlives_closed_session(no_leaks):
    session = ortagent.InferenceSession(models.mlp())
    (value,) = session.run_with_ort_values(None, {"x": np.ones((2, 16), np.float32)})
    expected = value.numpy().copy()
    session.close()
    del session
    gc.collect()
    np.testing.assert_array_equal(value.numpy(), expected)


def test_many_runs_return_to_baseline(no_leaks):
    session = ortagent.InferenceSession(models.multi_io())
    feed = {"a": np.ones((2, 4), np.float32), "b": np.ones((2, 4), np.float32), "k": np.array([2], np.int32)}
    for _ in range(2000):
        session.run(None, feed)
        session.run_with_ort_values(["total"], feed)
    for bad in ({"a": feed["a"]}, {"a": feed["a"], "b": feed["b"], "k": np.ones(1)}, {"zz": 1}):
        with pytest.raises(ortagent.OrtError):
            session.run(None, bad)
    del session


def test_reference_cycles_are_collected(no_leaks):
    class Holder:
        pass

    for _ in range(20):
        holder = Holder()
        holder.session = ortagent.InferenceSession(models.identity())
        holder.options = ortagent.SessionOptions()
        holder.run_options = ortagent.RunOptions()
        holder.values = holder.session.run_with_ort_values(None, {"x": np.ones(1, np.float32)})
        holder.view = holder.values[0].numpy()
        holder.self = holder
        del holder
    gc.collect()


def test_options_and_run_options_are_counted(no_leaks):
    before = ortagent.live_handles()
    so = ortagent.SessionOptions()
    ro = ortagent.RunOptions()
    now = ortagent.live_handles()
    assert now["session_options"] == before["session_options"] + 1
    assert now["run_options"] == before["run_options"] + 1
    del so, ro


def test_interpreter_exit_with_live_objects_is_quiet(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, ortagent
        from ortagent_testkit import onnx_models as models
        session = ortagent.InferenceSession(models.mlp())
        options = ortagent.SessionOptions()
        run_options = ortagent.RunOptions()
        values = session.run_with_ort_values(None, {"x": np.ones((2, 16), np.float32)})
        views = [v.numpy() for v in values]
        own = ortagent.OrtValue.ortvalue_from_numpy(np.arange(10))
        cycle = [session, own]
        cycle.append(cycle)
        print("done")
    """)
    path = tmp_path / "exit_alive.py"
    path.write_text(script)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, str(path)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert result.stderr == ""


def _passthrough_model():
    """y is the graph input itself and z = Identity(x): onnxruntime may hand back outputs that
    share the feed's buffer."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z"]), helper.make_node("Reshape", ["x", "shape"], ["r"])],
        "passthrough", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [6])],
        initializer=[__import__("onnx").numpy_helper.from_array(np.array([6], np.int64), "shape")])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("api", ["run", "run_with_ort_values", "iobinding"])
def test_outputs_sharing_a_feed_buffer_keep_the_feed_alive(api, no_leaks):
    session = ortagent.InferenceSession(_passthrough_model())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = x.copy()
    if api == "run":
        outputs = session.run(None, {"x": x})
    elif api == "run_with_ort_values":
        outputs = [v.numpy() for v in session.run_with_ort_values(None, {"x": x})]
    else:
        binding = session.io_binding()
        binding.bind_cpu_input("x", x)
        for name in ("x", "z", "r"):
            binding.bind_output(name)
        session.run_with_iobinding(binding)
        outputs = [v.numpy() for v in binding.get_outputs()]
        binding.clear_binding_inputs()
        del binding
    if api == "run":
        # run() copies an output over a feed's memory, as onnxruntime's run() does: writing to
        # the feed afterwards changes no result
        assert not any(np.shares_memory(out, x) for out in outputs)
        x[...] = -7.0
    else:
        # the case under test: onnxruntime returned at least one output over x's own memory
        assert any(out.ctypes.data == x.ctypes.data for out in outputs)
    del x
    gc.collect()
    # overwrite freed memory with other allocations, then read the outputs
    junk = [np.full(6, -1.0, np.float32) for _ in range(200)]
    for out in outputs:
        np.testing.assert_array_equal(out.reshape(2, 3), expected)
    del junk, outputs, session


# ---- close() while a run on another thread uses the object --------------------------------------
#
# A run releases the GIL, so another thread can close what it reads or writes. close() of a value
# fed to the run, bound to an IOBinding or written by the run, and close() of the binding itself,
# must wait for the run (the memory onnxruntime reads stays alive), and afterwards the closed
# object refuses use with ObjectClosedError. Under `make asan` (CI runs this file there) a
# use-after-free would be reported.

SLOW_SIZE = 192
_slow = {}


def _calibrated(key: str, seconds_of, trips: int) -> tuple[int, float]:
    """(loop trips, seconds) for a run of about 0.3 s here, found once per ``key`` by doubling
    ``trips`` until ``seconds_of(trips)`` (a warm run) takes 0.1 s: long enough that close()
    from another thread lands while it runs, short enough for CI."""
    if key not in _slow:
        most = trips * 2**8
        while True:
            elapsed = seconds_of(trips)
            if elapsed >= 0.1 or trips >= most:
                break
            trips *= 2
        _slow[key] = (trips * 3, elapsed * 3)
    return _slow[key]


def _slow_loop_seconds(trips: int) -> float:
    import time

    x = np.eye(SLOW_SIZE, dtype=np.float32)
    session = ortagent.InferenceSession(models.slow_loop(iterations=trips, size=SLOW_SIZE))
    session.run(None, {"x": x})     # a session's first run pays one-time costs: not timed
    started = time.perf_counter()
    session.run(None, {"x": x})
    elapsed = time.perf_counter() - started
    session.close()
    return elapsed


def _slow_trips():
    return _calibrated("slow_loop", _slow_loop_seconds, 50)[0]


def _slow_session():
    return ortagent.InferenceSession(models.slow_loop(iterations=_slow_trips(), size=SLOW_SIZE))


def _loop_reference(session, x):
    return session.run(None, {"x": x})[0]


def _close_during(run, close, started_event):
    """Run `run` on a thread, call `close` once it has started (and is still running), and
    return (run's result, whether the run was still going when close() returned)."""
    import threading

    box = {}

    def target():
        try:
            box["result"] = run()
        except BaseException as exc:      # reported below
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    started_event()
    close()
    closed_while_running = thread.is_alive()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"], closed_while_running


def _wait_running():
    import time

    time.sleep(_calibrated("slow_loop", _slow_loop_seconds, 50)[1] / 6)


@pytest.mark.parametrize("how", ["run", "run_with_ort_values"])
def test_value_fed_to_a_run_closed_from_another_thread(how, no_leaks):
    session = _slow_session()
    x = np.random.default_rng(0).standard_normal((SLOW_SIZE, SLOW_SIZE)).astype(np.float32) / SLOW_SIZE
    expected = _loop_reference(session, x.copy())
    value = ortagent.OrtValue.ortvalue_from_numpy(x.copy())
    del x

    def run():
        outputs = getattr(session, how)(None, {"x": value})
        return outputs[0] if how == "run" else outputs[0].numpy()

    result, overlapped = _close_during(run, value.close, _wait_running)
    assert overlapped, "the run ended before close(): make the loop longer"
    np.testing.assert_array_equal(result, expected)
    with pytest.raises(ortagent.ObjectClosedError):
        value.numpy()
    with pytest.raises(ortagent.ObjectClosedError):
        session.run(None, {"x": value})


def test_iobinding_closed_during_its_run(no_leaks):
    session = _slow_session()
    x = np.random.default_rng(1).standard_normal((SLOW_SIZE, SLOW_SIZE)).astype(np.float32) / SLOW_SIZE
    expected = _loop_reference(session, x)
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    out = ortagent.OrtValue.ortvalue_from_shape_and_type([SLOW_SIZE, SLOW_SIZE], np.float32)
    binding.bind_ortvalue_output("y", out)
    _, overlapped = _close_during(lambda: session.run_with_iobinding(binding), binding.close, _wait_running)
    assert overlapped
    np.testing.assert_array_equal(out.numpy(), expected)     # the run completed into our buffer
    with pytest.raises(ortagent.ObjectClosedError):
        session.run_with_iobinding(binding)
    with pytest.raises(ortagent.ObjectClosedError):
        binding.bind_cpu_input("x", x)


@pytest.mark.parametrize("which", ["input", "output"])
def test_bound_value_closed_during_and_after_a_run(which, no_leaks):
    session = _slow_session()
    x = np.random.default_rng(2).standard_normal((SLOW_SIZE, SLOW_SIZE)).astype(np.float32) / SLOW_SIZE
    expected = _loop_reference(session, x)
    binding = session.io_binding()
    x_value = ortagent.OrtValue.ortvalue_from_numpy(x.copy())
    out = ortagent.OrtValue.ortvalue_from_shape_and_type([SLOW_SIZE, SLOW_SIZE], np.float32)
    binding.bind_ortvalue_input("x", x_value)
    binding.bind_ortvalue_output("y", out)
    target = x_value if which == "input" else out
    kept = out.numpy() if which == "input" else None         # a view keeps the output readable
    _, overlapped = _close_during(lambda: session.run_with_iobinding(binding), target.close, _wait_running)
    assert overlapped
    if kept is not None:
        np.testing.assert_array_equal(kept, expected)
    # the value stays bound but is closed: the next run refuses, it does not read freed memory
    with pytest.raises(ortagent.ObjectClosedError):
        session.run_with_iobinding(binding)


def _agent_forward_seconds(agent, x, w, trips: int) -> float:
    """A warm forward of agent_driver's slow training graph at ``trips``. (Not slow_loop's
    calibration: its values decay to zeros through subnormal floats, so its time is mostly a
    fixed cost on some CPUs, while this loop's grows with the trips.)"""
    import time

    binding = agent.io_binding()
    for name, array in (("x", x), ("w", w), ("trips", np.array(trips, np.int64))):
        binding.bind_cpu_input(name, array)
    binding.bind_output("x_grad")
    for _ in range(2):                 # the first run pays one-time costs: the second is timed
        started = time.perf_counter()
        _, run_id = agent.run_forward(binding, None)
        elapsed = time.perf_counter() - started
        agent.run_backward([np.zeros_like(x)], run_id)
    return elapsed


def test_agent_feed_closed_during_forward(no_leaks):
    from agent_driver import orthogonal, slow_training_graph

    model, reference = slow_training_graph(size=SLOW_SIZE)
    agent = ortagent.TrainingAgent(model.SerializeToString())
    x = orthogonal(SLOW_SIZE, 3)
    w = orthogonal(SLOW_SIZE, 4)
    trips, seconds = _calibrated("agent", lambda n: _agent_forward_seconds(agent, x, w, n), 16)
    trips = np.array(trips, np.int64)
    values = {name: ortagent.OrtValue.ortvalue_from_numpy(array.copy())
              for name, array in (("x", x), ("w", w), ("trips", trips))}
    binding = agent.io_binding()
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    binding.bind_output("x_grad")

    def forward():
        return agent.run_forward(binding, None)

    def wait_running():
        import time

        time.sleep(seconds / 6)

    (outputs, run_id), overlapped = _close_during(forward, values["x"].close, wait_running)
    assert overlapped, "the forward ended before close(): make the loop longer"
    y_grad = np.ones((SLOW_SIZE, SLOW_SIZE), np.float32)
    expected_y, expected_x_grad = reference(x, w, trips, y_grad)
    np.testing.assert_allclose(outputs[0].numpy(), expected_y, rtol=1e-3, atol=1e-3)
    agent.run_backward([y_grad], run_id)
    np.testing.assert_allclose(binding.get_outputs()[0].numpy(), expected_x_grad, rtol=1e-3, atol=1e-3)
    with pytest.raises(ortagent.ObjectClosedError):
        values["x"].numpy()
    agent.close()
