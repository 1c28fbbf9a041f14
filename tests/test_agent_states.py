"""The run state machine of a PartialGraphExecutionState (the diagram in ortagent/_agent.pxi):
every transition and every refusal, through the direct path (names in graph order) and through
TrainingAgent's reordering path, with the numbers checked against NumPy.

The semantics tested are those of the seed API and DESIGN.md: a state serves one forward and one
backward; the run's memory is freed when its backward completes or it is released; a failed
backward leaves the run resumable; a refused call (closed agent, wrong feed count, another
agent's run) changes nothing.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import ortagent
from ortagent_testkit import training_graphs as tg
from agent_driver import STATE_FORMS, Driver, orthogonal, slow_training_graph

F64 = tg.TOLERANCE[np.dtype(np.float64)]
CASE = tg.mul_add_case()             # out = x * w + bias (inputs x, w, bias; float64)
REORDERED = ["bias", "x", "w"]       # fw_feed_names that send run_forward through agent.py


def _feeds(seed):
    rng = np.random.default_rng(seed)
    return CASE.make_feeds(rng), [rng.standard_normal((2, 3))]


def _agent(order):
    names = list(CASE.input_names) if order == "graph" else REORDERED
    return ortagent.TrainingAgent(CASE.model.SerializeToString(), fw_feed_names=names,
                                  fw_outputs_device_info=["cpu"],
                                  bw_fetches_names=list(CASE.graph_output_names),
                                  bw_outputs_device_info=["cpu"] * len(CASE.graph_output_names)), names


def _values(feeds, names):
    return [ortagent.OrtValue.ortvalue_from_numpy(feeds[n]) for n in names]


def _gradient_values(gradients):
    return [ortagent.OrtValue.ortvalue_from_numpy(g) for g in gradients]


def _check_forward(outputs, feeds):
    np.testing.assert_allclose(outputs[0].numpy(), CASE.reference(feeds)[0], **F64)


def _check_backward(results, feeds, gradients):
    for got, want in zip(results, CASE.reference_gradients(feeds, gradients)):
        np.testing.assert_allclose(got.numpy(), want, **F64)


def _phase(state):
    return state.status, state.waiting_for_backward, state.stash_size


NEW = ("not started", False, 0)
FINISHED = ("finished (backward done or released)", False, 0)


@pytest.mark.parametrize("order", ["graph", "reordered"])
def test_a_run_goes_new_waiting_finished(order, no_leaks):
    agent, names = _agent(order)
    feeds, gradients = _feeds(1)
    state = ortagent.PartialGraphExecutionState()
    assert _phase(state) == NEW
    outputs: list = []
    agent.run_forward(_values(feeds, names), outputs, state)
    _check_forward(outputs, feeds)
    assert state.waiting_for_backward and state.status == "waiting for its backward"
    assert state.stash_size == 0          # mul_add's backward reads graph inputs only
    results: list = []
    agent.run_backward(_gradient_values(gradients), results, state)
    _check_backward(results, feeds, gradients)
    assert _phase(state) == FINISHED
    agent.close()


@pytest.mark.parametrize("feed_kind", ["ortvalue", "numpy"])
@pytest.mark.parametrize("order", ["graph", "reordered"])
def test_a_failed_forward_aborts_to_finished_and_the_state_is_spent(order, feed_kind, no_leaks):
    """abort from FORWARD: the claim was taken, the run failed (onnxruntime or the feed
    conversion refused a float32 w), nothing was published: the state is finished and holds
    nothing; it cannot be used again, and the agent runs a new state correctly."""
    agent, names = _agent(order)
    feeds, gradients = _feeds(2)
    bad = dict(feeds, w=feeds["w"].astype(np.float32))
    given = _values(bad, names) if feed_kind == "ortvalue" else [bad[n] for n in names]
    state = ortagent.PartialGraphExecutionState()
    with pytest.raises(ortagent.OrtInvalidArgument, match="'w'"):
        agent.run_forward(given, [], state)
    assert _phase(state) == FINISHED
    with pytest.raises(ortagent.RunStateError, match="finished.*create a new one for each run"):
        agent.run_forward(_values(feeds, names), [], state)
    with pytest.raises(ortagent.RunStateError, match="cannot run backward: this run is finished"):
        agent.run_backward(_gradient_values(gradients), [], state)
    fresh = ortagent.PartialGraphExecutionState()
    outputs: list = []
    results: list = []
    agent.run_forward(_values(feeds, names), outputs, fresh)
    agent.run_backward(_gradient_values(gradients), results, fresh)
    _check_forward(outputs, feeds)
    _check_backward(results, feeds, gradients)
    agent.close()


def _multi_output_agent(order):
    """The two-output case (its stash holds a module output), its feed names in graph order or
    reversed, and an agent for it."""
    case = tg.multi_output_case()
    names = list(case.input_names)
    if order == "reordered":
        names = names[::-1]
    agent = ortagent.TrainingAgent(case.model.SerializeToString(), fw_feed_names=names,
                                   fw_outputs_device_info=["cpu"] * 2,
                                   bw_fetches_names=list(case.graph_output_names),
                                   bw_outputs_device_info=["cpu"] * len(case.graph_output_names))
    return case, names, agent


@pytest.mark.parametrize("order", ["graph", "reordered"])
def test_a_failed_backward_aborts_to_waiting_and_resumes(order, no_leaks):
    """abort from BACKWARD: a gradient of the wrong shape, then of the wrong element type, is
    refused; the run is waiting again with what it held, and the right gradient completes it."""
    case, names, agent = _multi_output_agent(order)
    rng = np.random.default_rng(3)
    feeds = case.make_feeds(rng)
    gradients = case.make_gradients(rng, case.reference(feeds))
    state = ortagent.PartialGraphExecutionState()
    outputs: list = []
    agent.run_forward([ortagent.OrtValue.ortvalue_from_numpy(feeds[n]) for n in names], outputs, state)
    held = state.stash_size
    assert held >= 1 and state.waiting_for_backward
    wrong_shape = [np.zeros(np.shape(g) + (2,)) for g in gradients]
    with pytest.raises(ortagent.OrtInvalidArgument, match="gradient 0"):
        agent.run_backward(_gradient_values(wrong_shape), [], state)
    assert _phase(state) == ("waiting for its backward", True, held)
    wrong_type = [np.asarray(g, np.float32) for g in gradients]
    with pytest.raises(ortagent.OrtInvalidArgument, match="must be tensor\\(double\\)"):
        agent.run_backward(_gradient_values(wrong_type), [], state)
    assert _phase(state) == ("waiting for its backward", True, held)
    results: list = []
    agent.run_backward(_gradient_values(gradients), results, state)
    for got, want in zip(results, case.reference_gradients(feeds, gradients)):
        np.testing.assert_allclose(got.numpy(), want, **F64)
    assert _phase(state) == FINISHED
    agent.close()


@pytest.mark.parametrize("order", ["graph", "reordered"])
def test_a_retained_run_resumes_again_until_released(order, no_leaks):
    """retain() (torch's retain_graph): each backward leaves the run waiting with its stash, so
    the backward runs again with other gradients, each as a fresh run's; release() ends it. A
    finished state cannot be retained."""
    case, names, agent = _multi_output_agent(order)
    rng = np.random.default_rng(6)
    feeds = case.make_feeds(rng)
    state = ortagent.PartialGraphExecutionState()
    assert not state.retained
    agent.run_forward([ortagent.OrtValue.ortvalue_from_numpy(feeds[n]) for n in names], [], state)
    state.retain()
    held = state.stash_size
    assert held >= 1 and state.retained
    for _ in range(3):
        gradients = case.make_gradients(rng, case.reference(feeds))
        results: list = []
        agent.run_backward(_gradient_values(gradients), results, state)
        for got, want in zip(results, case.reference_gradients(feeds, gradients)):
            np.testing.assert_allclose(got.numpy(), want, **F64)
        assert _phase(state) == ("waiting for its backward", True, held)
    state.release()
    assert _phase(state) == FINISHED
    with pytest.raises(ortagent.RunStateError, match="cannot run backward: this run is finished"):
        agent.run_backward(_gradient_values(gradients), [], state)
    with pytest.raises(ortagent.RunStateError, match="cannot retain this run: it is finished"):
        state.retain()
    agent.close()


@pytest.mark.parametrize("order", ["graph", "reordered"])
def test_refused_calls_change_nothing(order, no_leaks):
    """A call refused before its claim leaves the state as it was: a wrong feed count, another
    agent's backward, a closed agent. The state then serves the agent it belongs to."""
    agent, names = _agent(order)
    other, _ = _agent(order)
    feeds, gradients = _feeds(4)
    state = ortagent.PartialGraphExecutionState()
    with pytest.raises(ortagent.OrtInvalidArgument, match="expected 3 feeds"):
        agent.run_forward(_values(feeds, names)[:2], [], state)
    assert _phase(state) == NEW
    with pytest.raises(ortagent.RunStateError, match="not started; run_forward must come first"):
        agent.run_backward(_gradient_values(gradients), [], state)
    assert _phase(state) == NEW
    other.close()
    with pytest.raises(ortagent.ObjectClosedError, match="TrainingAgent has been closed"):
        other.run_forward(_values(feeds, names), [], state)
    assert _phase(state) == NEW
    outputs: list = []
    agent.run_forward(_values(feeds, names), outputs, state)
    third, _ = _agent(order)
    with pytest.raises(ortagent.RunStateError, match="belongs to another TrainingAgent"):
        third.run_backward(_gradient_values(gradients), [], state)
    assert state.waiting_for_backward
    with pytest.raises(ortagent.ObjectClosedError, match="TrainingAgent has been closed"):
        other.run_backward(_gradient_values(gradients), [], state)
    assert state.waiting_for_backward
    results: list = []
    agent.run_backward(_gradient_values(gradients), results, state)
    _check_forward(outputs, feeds)
    _check_backward(results, feeds, gradients)
    third.close()
    agent.close()


def test_release_is_final_and_idempotent(no_leaks):
    agent, names = _agent("graph")
    feeds, gradients = _feeds(5)
    unused = ortagent.PartialGraphExecutionState()
    unused.release()                                # NEW -> FINISHED
    assert _phase(unused) == FINISHED
    with pytest.raises(ortagent.RunStateError, match="finished"):
        agent.run_forward(_values(feeds, names), [], unused)
    state = ortagent.PartialGraphExecutionState()
    agent.run_forward(_values(feeds, names), [], state)
    state.release()                                 # WAITING -> FINISHED
    state.release()
    assert _phase(state) == FINISHED
    with pytest.raises(ortagent.RunStateError, match="finished"):
        agent.run_backward(_gradient_values(gradients), [], state)
    agent.close()


def test_closing_twice_and_the_one_closed_flag(no_leaks):
    """The agent's closed flag is its engine's: close() sets it once (True the first time),
    and every way in refuses after it."""
    agent, names = _agent("graph")
    feeds, gradients = _feeds(6)
    state = ortagent.PartialGraphExecutionState()
    outputs: list = []
    agent.run_forward(_values(feeds, names), outputs, state)
    assert not agent._engine.closed
    agent.close()
    assert agent._engine.closed and agent._closed
    agent.close()
    assert agent._engine.close() is False
    with pytest.raises(ortagent.ObjectClosedError):
        agent.run_backward(_gradient_values(gradients), [], state)
    assert state.waiting_for_backward               # refused, not consumed
    state.release()
    _check_forward(outputs, feeds)                  # outputs outlive their agent


# -- transitions that race a running half ------------------------------------------------------

SLOW_SIZE = 192


def _slow_agent():
    model, reference = slow_training_graph(SLOW_SIZE)
    driver = Driver.for_model(model, STATE_FORMS[0])
    x, w = orthogonal(SLOW_SIZE, 31), orthogonal(SLOW_SIZE, 32)
    # calibrate: enough trips that a forward takes about a second on this machine
    feeds = {"x": x, "w": w, "trips": np.array(40, np.int64)}
    driver.forward(feeds).handle.release()
    start = time.perf_counter()
    driver.forward(feeds).handle.release()
    per_trip = (time.perf_counter() - start) / 40
    feeds["trips"] = np.array(int(np.clip(1.0 / per_trip, 40, 40000)), np.int64)
    return driver, feeds, reference


def _forward_on_a_thread(driver, feeds, state):
    outcome: list = []

    def forward():
        outputs: list = []
        try:
            driver.agent.run_forward([driver._value(feeds[n]) for n in driver.names.inputs], outputs, state)
            outcome.append(outputs)
        except Exception as exc:        # reported to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=forward)
    thread.start()
    deadline = time.monotonic() + 5
    while state.status == "not started" and time.monotonic() < deadline:
        time.sleep(0.001)
    return thread, outcome


def test_release_and_a_second_forward_during_a_forward_are_refused(no_leaks):
    driver, feeds, reference = _slow_agent()
    state = ortagent.PartialGraphExecutionState()
    thread, outcome = _forward_on_a_thread(driver, feeds, state)
    assert state.status == "running its forward", "the forward ended too soon: make it longer"
    assert not state.waiting_for_backward
    with pytest.raises(ortagent.RunStateError, match="this run is executing"):
        state.release()
    with pytest.raises(ortagent.RunStateError, match="running its forward.*create a new one"):
        driver.agent.run_forward([driver._value(feeds[n]) for n in driver.names.inputs], [], state)
    with pytest.raises(ortagent.RunStateError, match="cannot run backward: this run is running its forward"):
        driver.agent.run_backward([driver._value(np.ones((SLOW_SIZE, SLOW_SIZE), np.float32))], [], state)
    thread.join()
    assert state.waiting_for_backward, outcome
    y, _ = reference(feeds["x"], feeds["w"], feeds["trips"], feeds["x"])
    np.testing.assert_allclose(outcome[0][0].numpy(), y, rtol=1e-3, atol=1e-3)
    state.release()
    driver.agent.close()


def test_close_during_a_forward_leaves_the_run_waiting_but_refuses_its_backward(no_leaks):
    """close() while a state-API forward runs: the forward (past its claim) completes with the
    right outputs, since the sessions close only when their runs end; the run is then waiting,
    its backward is refused (the agent is closed), and release() frees it."""
    driver, feeds, reference = _slow_agent()
    state = ortagent.PartialGraphExecutionState()
    thread, outcome = _forward_on_a_thread(driver, feeds, state)
    assert state.status == "running its forward", "the forward ended too soon: make it longer"
    driver.agent.close()
    thread.join()
    assert state.waiting_for_backward, outcome
    y, _ = reference(feeds["x"], feeds["w"], feeds["trips"], feeds["x"])
    np.testing.assert_allclose(outcome[0][0].numpy(), y, rtol=1e-3, atol=1e-3)
    with pytest.raises(ortagent.ObjectClosedError, match="TrainingAgent has been closed"):
        driver.agent.run_backward([driver._value(np.ones((SLOW_SIZE, SLOW_SIZE), np.float32))], [], state)
    assert state.waiting_for_backward
    state.release()
    assert _phase(state) == FINISHED
