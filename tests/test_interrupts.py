"""Interrupts: ``RunOptions.terminate`` set from another thread stops a long run -- through
``run``, ``run_with_ort_values``, an IOBinding, a TrainingAgent forward -- with a typed error, only
the runs using those RunOptions stop, and everything keeps working afterwards (other runs in
flight included). Ctrl-C (SIGINT) in a subprocess: during a TrainingAgent backward (the run stays
resumable), with the caller's own RunOptions, and while a worker thread runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortagent_testkit import onnx_models as models
import ortagent
from ortagent_testkit import training_graphs as tg
from agent_driver import orthogonal, slow_training_graph
from conftest import REPO_ROOT

SIZE = 64
FOREVER = 10**9          # Loop trips: hours of work unless stopped


@pytest.fixture(scope="module")
def slow_session():
    return ortagent.InferenceSession(models.slow_loop(iterations=FOREVER, size=SIZE))


def _stop_after(options, seconds=0.3):
    timer = threading.Timer(seconds, lambda: setattr(options, "terminate", True))
    timer.start()
    return timer


def _quietly():
    """onnxruntime logs every terminated run as an error: keep the test output readable."""
    previous = ortagent.get_default_logger_severity()
    ortagent.set_default_logger_severity(4)
    return previous


@pytest.mark.parametrize("call", ["run", "run_with_ort_values", "iobinding"])
def test_terminate_stops_a_long_run_and_the_session_works_on(slow_session, call, no_leaks):
    x = orthogonal(SIZE, 1)
    options = ortagent.RunOptions()
    binding = None
    if call == "iobinding":
        binding = slow_session.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y")
    previous = _quietly()
    try:
        timer = _stop_after(options)
        with pytest.raises(ortagent.OrtFail, match="terminate flag") as info:
            if call == "run":
                slow_session.run(None, {"x": x}, options)
            elif call == "run_with_ort_values":
                slow_session.run_with_ort_values(None, {"x": ortagent.OrtValue.ortvalue_from_numpy(x)}, options)
            else:
                slow_session.run_with_iobinding(binding, options)
        timer.join()
    finally:
        ortagent.set_default_logger_severity(previous)
    assert info.value.code == 1
    del info
    options.terminate = False
    # the same session, binding and options compute correctly on a short run
    quick = ortagent.InferenceSession(models.slow_loop(iterations=3, size=SIZE))
    reference = quick.run(None, {"x": x})[0]
    assert quick.run(None, {"x": x}, options)[0].tolist() == reference.tolist()
    if binding is not None:
        quick_binding = quick.io_binding()
        quick_binding.bind_cpu_input("x", x)
        quick_binding.bind_output("y")
        quick.run_with_iobinding(quick_binding, options)
        assert quick_binding.copy_outputs_to_cpu()[0].tolist() == reference.tolist()
        binding.close()


def test_terminate_stops_only_the_runs_using_those_options(slow_session):
    """Two long runs on one session from two threads with their own RunOptions, and two short
    runs sharing the first RunOptions: terminating the first options stops its long run (and
    later runs with it) while the other long run goes on until its own options stop it."""
    x = orthogonal(SIZE, 2)
    first, second = ortagent.RunOptions(), ortagent.RunOptions()
    outcome: dict = {}

    def run(name, options):
        try:
            slow_session.run(None, {"x": x}, options)
            outcome[name] = "finished"
        except ortagent.OrtFail as exc:
            outcome[name] = "terminated" if "terminate" in str(exc) else repr(exc)
        except BaseException as exc:
            outcome[name] = repr(exc)

    previous = _quietly()
    try:
        threads = {name: threading.Thread(target=run, args=(name, options), daemon=True)
                   for name, options in (("first", first), ("second", second))}
        for thread in threads.values():
            thread.start()
        _stop_after(first, 0.2).join()
        threads["first"].join(timeout=60)
        assert outcome == {"first": "terminated"}, outcome
        assert threads["second"].is_alive()                    # untouched by the first options
        with pytest.raises(ortagent.OrtFail, match="terminate flag"):
            slow_session.run(None, {"x": x}, first)            # still set: refused at once
        second.terminate = True
        threads["second"].join(timeout=60)
        assert outcome == {"first": "terminated", "second": "terminated"}, outcome
    finally:
        ortagent.set_default_logger_severity(previous)


def test_terminate_stops_an_agent_forward_and_runs_in_flight_survive(no_leaks):
    model, reference = slow_training_graph(size=SIZE)
    agent = ortagent.TrainingAgent(model.SerializeToString())
    x, w = orthogonal(SIZE, 3), orthogonal(SIZE, 4)
    trips = np.array(2, np.int64)

    def binding_with(trip_count):
        binding = agent.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_cpu_input("w", w)
        binding.bind_cpu_input("trips", np.array(trip_count, np.int64))
        return binding

    waiting = []
    for _ in range(3):                                          # runs in flight before the stop
        (y,), run_id = agent.run_forward(binding_with(2), None)
        waiting.append(run_id)
    options = ortagent.RunOptions()
    previous = _quietly()
    try:
        timer = _stop_after(options)
        with pytest.raises(ortagent.OrtFail, match="terminate flag"):
            agent.run_forward(binding_with(FOREVER), options)
        timer.join()
    finally:
        ortagent.set_default_logger_severity(previous)
    assert agent.runs_in_flight == 3
    y_grad = orthogonal(SIZE, 5)
    want_y, want_x_grad = reference(x, w, trips, y_grad)
    for run_id in reversed(waiting):
        binding = binding_with(2)
        agent.run_backward([y_grad], run_id)
    options.terminate = False
    binding = binding_with(2)
    (y,), run_id = agent.run_forward(binding, options)
    np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-4, atol=1e-4)
    agent.run_backward([y_grad], run_id)
    np.testing.assert_allclose(binding.get_outputs()[0].numpy(), want_x_grad, rtol=1e-4, atol=1e-4)
    assert agent.runs_in_flight == 0
    agent.close()


def _slow_backward_graph(size: int):
    """Forward y = x @ w (quick); backward x_grad = y_grad @ (w^T)^trips (a Loop: as long as
    `trips` says). `trips` is a graph input only the backward reads."""
    info = helper.make_tensor_value_info

    body = helper.make_graph(
        [helper.make_node("MatMul", ["g_in", "wT"], ["g_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [info("i", TensorProto.INT64, []), info("cond_in", TensorProto.BOOL, []),
                 info("g_in", TensorProto.FLOAT, [size, size])],
        [info("cond_out", TensorProto.BOOL, []), info("g_out", TensorProto.FLOAT, [size, size])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             tg.yield_node(["y"], ["y_grad"], [0]),
             helper.make_node("Transpose", ["w"], ["wT"], perm=[1, 0]),
             helper.make_node("Loop", ["trips", "cond", "y_grad"], ["x_grad"], body=body)]
    return tg.make_model(
        nodes, [info("x", TensorProto.FLOAT, [size, size]), info("w", TensorProto.FLOAT, [size, size]),
                info("trips", TensorProto.INT64, [])],
        [info("x_grad", TensorProto.FLOAT, [size, size])],
        [numpy_helper.from_array(np.array(True), "cond")], name="slow_backward")


def _run_script(tmp_path, body: str):
    script = tmp_path / "interrupt.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, threading
        # as in an interactive interpreter (a CI job may start Python with SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {os.path.join(REPO_ROOT, 'tests')!r})
        import numpy as np, ortagent
        def sigint_in(seconds):
            threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    """) + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("api", ["state", "run_id"])
def test_ctrl_c_during_an_agent_backward_leaves_the_run_resumable(tmp_path, api):
    model = _slow_backward_graph(64)
    (tmp_path / "slow_backward.onnx").write_bytes(model.SerializeToString())
    result = _run_script(tmp_path, f"""
        agent = ortagent.TrainingAgent({str(tmp_path / 'slow_backward.onnx')!r})
        rng = np.random.default_rng(0)
        x, w = (rng.standard_normal((64, 64)) / 8).astype(np.float32), np.eye(64, dtype=np.float32)
        trips = np.array({FOREVER}, np.int64)              # changed in place before resuming
        grad = np.ones((64, 64), np.float32)
        if {api!r} == "state":
            state = ortagent.PartialGraphExecutionState()
            agent.run_forward([ortagent.OrtValue.ortvalue_from_numpy(a) for a in (x, w, trips)], [], state)
            resume = lambda: agent.run_backward([grad], [], state)
        else:
            binding = agent.io_binding()
            for name, array in (("x", x), ("w", w), ("trips", trips)):
                binding.bind_cpu_input(name, array)
            _, run_id = agent.run_forward(binding, None)
            resume = lambda: agent.run_backward([grad], run_id)
        sigint_in(0.5)
        try:
            resume()
            print("completed")
        except KeyboardInterrupt:
            print("interrupted")
        print(agent.runs_in_flight)
        trips[...] = 3                                     # the stash and inputs are intact
        resume()
        print(agent.runs_in_flight, "resumed")
    """)
    assert result.returncode == 0, result.stderr
    in_flight = "1" if api == "run_id" else "0"
    assert result.stdout.split() == ["interrupted", in_flight, "0", "resumed"], result.stdout + result.stderr


def test_ctrl_c_with_the_callers_run_options_leaves_them_usable(tmp_path):
    result = _run_script(tmp_path, f"""
        from ortagent_testkit import onnx_models as models
        slow = ortagent.InferenceSession(models.slow_loop(iterations={FOREVER}, size=64))
        quick = ortagent.InferenceSession(models.slow_loop(iterations=2, size=64))
        x = np.eye(64, dtype=np.float32)
        options = ortagent.RunOptions()
        options.logid = "mine"
        sigint_in(0.5)
        try:
            slow.run(None, {{"x": x}}, options)
        except KeyboardInterrupt:
            print("interrupted")
        print(options.terminate, quick.run(None, {{"x": x}}, options)[0].shape)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "False", "(64,", "64)"], result.stdout + result.stderr


def test_ctrl_c_while_a_worker_thread_runs(tmp_path):
    """SIGINT reaches the main thread (waiting in join); the worker's run is not stopped by it
    (runs on other threads are left alone) but by its own RunOptions; the process exits cleanly."""
    result = _run_script(tmp_path, f"""
        from ortagent_testkit import onnx_models as models
        slow = ortagent.InferenceSession(models.slow_loop(iterations={FOREVER}, size=64))
        options = ortagent.RunOptions()
        outcome, done = [], threading.Event()
        def work():
            try:
                slow.run(None, {{"x": np.eye(64, dtype=np.float32)}}, options)
                outcome.append("finished")
            except ortagent.OrtFail:
                outcome.append("terminated")
            finally:
                done.set()
        worker = threading.Thread(target=work)
        worker.start()
        sigint_in(0.5)
        try:
            done.wait()
        except KeyboardInterrupt:
            # (not Thread.join: before Python 3.13 a join interrupted by Ctrl-C can leave
            # is_alive() wrongly False)
            print("interrupted", not done.is_set())
        ortagent.set_default_logger_severity(4)
        options.terminate = True
        done.wait()
        worker.join()
        print(outcome[0])
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "True", "terminated"], result.stdout + result.stderr
