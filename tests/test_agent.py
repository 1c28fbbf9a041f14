"""ortagent's TrainingAgent on stock onnxruntime: gradients, many runs, threads, memory, GIL,
RunOptions -- through both API generations and every constructor form.

Every graph is built in code (``training_graphs``); forward outputs and gradients are checked
against hand-written float64 NumPy references and central finite differences. Misuse and bad
input are in test_agent_errors.py, agreement with onnxruntime-training 1.19.2's own agent in
test_agent_reference.py, the CUDA EP in test_agent_cuda.py.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import ortagent
from ortagent_testkit import training_graphs as tg
from agent_driver import (
    DEVICE_SPELLINGS,
    FORMS,
    STATE_FORMS,
    AgentRunner,
    Driver,
    graph_names,
    make_agent,
    orthogonal,
    slow_training_graph,
)
from gil_ticks import assert_releases_gil

F64 = tg.TOLERANCE[np.dtype(np.float64)]

# (form, device spelling, feeds as OrtValue or as NumPy): every state form with every device
# spelling, and the run-id API with both kinds of feeds.
VARIANTS = [(form, spelling, spelling != "string") for form in STATE_FORMS for spelling in DEVICE_SPELLINGS]
VARIANTS += [("run_id", "string", True), ("run_id", "string", False)]
VARIANT_IDS = [f"{form}-{spelling}-{'values' if values else 'numpy'}" for form, spelling, values in VARIANTS]


def basic_level() -> ortagent.SessionOptions:
    """Session options at the 'basic' level: onnxruntime's MatMulScaleFusion (extended and up)
    folds a constant scalar Mul into FusedMatMul's *float* alpha, which rounds a double scale to
    float32 (FINDINGS.md); the family graphs have frozen scalar parameters, so their float64
    checks run below that level."""
    options = ortagent.SessionOptions()
    options.graph_optimization_level = ortagent.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return options


def assert_matches_reference(case: tg.TrainingCase, feeds, gradients, outputs, results) -> None:
    expected_outputs = case.reference(feeds)
    assert len(outputs) == len(expected_outputs)
    for name, got, want in zip(case.module_output_names, outputs, expected_outputs):
        assert got.shape == np.shape(want), name
        if got.dtype.kind == "f":
            assert got.dtype == case.dtype, name
            np.testing.assert_allclose(got, want, **F64, err_msg=f"forward {name}")
        else:
            assert got.dtype == np.asarray(want).dtype, name
            np.testing.assert_array_equal(got, want, err_msg=f"forward {name}")
    expected = case.reference_gradients(feeds, gradients)
    assert len(results) == len(case.graph_output_names)
    for name, got, want in zip(case.graph_output_names, results, expected):
        assert got.shape == np.shape(want), name
        np.testing.assert_allclose(got, want, **F64, err_msg=f"backward {name}")


def check_case(case: tg.TrainingCase, driver: Driver, seed: int = 0) -> None:
    """Forward + backward through the agent against NumPy, then finite differences."""
    rng = np.random.default_rng(seed)
    feeds = case.make_feeds(rng)
    run = driver.forward(feeds)
    outputs = run.numpy_outputs()
    gradients = case.make_gradients(rng, outputs)
    results = driver.backward(run, gradients)
    assert_matches_reference(case, feeds, gradients, outputs, results)
    if case.gradient_of:
        tg.check_finite_differences(case, AgentRunner(driver), feeds, gradients)


# -- gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form,spelling,as_values", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("builder", tg.HAND_BUILT, ids=[b.__name__ for b in tg.HAND_BUILT])
def test_hand_built_graphs_match_numpy_and_finite_differences(builder, form, spelling, as_values):
    """The canonical x*y+bias graph, an MLP with ReLU and an int64 output, several module
    outputs, a repeated output, an output with no gradient path, constants on both sides, an
    input only the backward reads, pass-through outputs and control flow: through the agent."""
    case = builder()
    driver = Driver(make_agent(case.model, form, spelling=spelling), form, graph_names(case.model), as_values)
    check_case(case, driver)


@pytest.mark.parametrize("form", FORMS)
def test_model_from_a_file_path(form, tmp_path):
    case = tg.mlp_case()
    path = tmp_path / "mlp_training.onnx"
    path.write_bytes(case.model.SerializeToString())
    check_case(case, Driver(make_agent(str(path), form), form, graph_names(case.model)))


@pytest.mark.parametrize("seed", range(6))
def test_family_graphs_from_build_training_graph(seed):
    """Training graphs generated from random forward models by build_training_graph."""
    case = tg.random_case(seed)
    form = FORMS[seed % len(FORMS)]
    check_case(case, Driver.for_model(case.model, form, as_values=bool(seed % 2), session_options=basic_level()),
               seed)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), form=st.sampled_from(FORMS))
def test_family_graphs_hypothesis(seed, form):
    case = tg.random_case(seed)
    check_case(case, Driver.for_model(case.model, form, session_options=basic_level()), seed)


def test_float32_graph_is_computed_in_float32():
    case = tg.mlp_case(np.float32)
    driver = Driver.for_model(case.model, "state7")
    rng = np.random.default_rng(3)
    feeds = case.make_feeds(rng)
    run = driver.forward(feeds)
    outputs = run.numpy_outputs()
    gradients = case.make_gradients(rng, outputs)
    results = driver.backward(run, gradients)
    assert [o.dtype for o in outputs] == [np.float32, np.int64]
    assert all(r.dtype == np.float32 for r in results)
    wide = {name: value.astype(np.float64) for name, value in feeds.items()}
    for got, want in zip(results, case.reference_gradients(wide, [g.astype(np.float64) for g in gradients])):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# -- argument forms ----------------------------------------------------------------------------


def test_state_form_reorders_feeds_gradients_and_fetches():
    """fw_feed_names, bw_feed_names and bw_fetches_names in an order of the caller's choosing;
    fw_fetches_names a subset of the module outputs."""
    case = tg.multi_output_case()
    agent = ortagent.TrainingAgent(case.model.SerializeToString(), ["w", "x"], ["s"], ["cpu"],
                                   ["s_grad", "a_grad"], ["w_grad", "x_grad"], ["cpu", "cpu"])
    rng = np.random.default_rng(5)
    feeds = case.make_feeds(rng)
    state = ortagent.PartialGraphExecutionState()
    fetches: list = []
    agent.run_forward([feeds["w"], feeds["x"]], fetches, state)
    a, s = case.reference(feeds)
    assert len(fetches) == 1
    np.testing.assert_allclose(fetches[0].numpy(), s, **F64)
    ga, gs = rng.standard_normal(3), np.asarray(rng.standard_normal())
    results: list = []
    agent.run_backward([gs, ga], results, state)
    x_grad, w_grad = case.reference_gradients(feeds, [ga, gs])
    np.testing.assert_allclose(results[0].numpy(), w_grad, **F64)
    np.testing.assert_allclose(results[1].numpy(), x_grad, **F64)


def test_kw1192_subset_of_backward_fetches_and_positional_form():
    case = tg.mlp_case()
    model = case.model.SerializeToString()
    rng = np.random.default_rng(6)
    feeds = case.make_feeds(rng)
    logits, _ = case.reference(feeds)
    gradient = rng.standard_normal(logits.shape)
    expected = dict(zip(case.graph_output_names, case.reference_gradients(feeds, [gradient])))
    positional = ortagent.TrainingAgent(model, case.input_names, ["cpu", "cpu"], ["b2_grad", "W1_grad"],
                                        ["cpu", "cpu"], None, ["CPUExecutionProvider"], None, 0)
    keywords = ortagent.TrainingAgent(model, fw_feed_names=case.input_names, fw_outputs_device_info=["cpu"] * 2,
                                      bw_fetches_names=["b2_grad", "W1_grad"], bw_outputs_device_info=["cpu"] * 2)
    for agent in (positional, keywords):
        state = ortagent.PartialGraphExecutionState()
        fetches: list = []
        agent.run_forward([feeds[n] for n in case.input_names], fetches, state)
        assert len(fetches) == 2          # every YieldOp input, the int64 one included
        np.testing.assert_array_equal(fetches[1].numpy(), np.argmax(logits, axis=1))
        results: list = []
        agent.run_backward([gradient], results, state)
        np.testing.assert_allclose(results[0].numpy(), expected["b2_grad"], **F64)
        np.testing.assert_allclose(results[1].numpy(), expected["W1_grad"], **F64)


def test_run_id_api_bound_outputs_and_preallocated_buffers():
    """Gradients land in the outputs bound to the run's binding: a subset, in binding order,
    and into a caller's buffer when one is bound."""
    case = tg.mul_add_case()
    agent = ortagent.TrainingAgent(case.model.SerializeToString())
    rng = np.random.default_rng(7)
    feeds = case.make_feeds(rng)
    binding = agent.io_binding()
    for name in case.input_names:
        binding.bind_cpu_input(name, feeds[name])
    buffer = np.full(3, np.nan)
    binding.bind_output("bias_grad", "cpu")
    binding.bind_ortvalue_output("w_grad", ortagent.OrtValue.ortvalue_from_numpy(buffer))
    outputs, run_id = agent.run_forward(binding, ortagent.RunOptions())
    gradient = rng.standard_normal((2, 3))
    agent.run_backward([ortagent.OrtValue.ortvalue_from_numpy(gradient)], run_id)
    _, w_grad, bias_grad = case.reference_gradients(feeds, [gradient])
    bias_result, w_result = binding.get_outputs()
    np.testing.assert_allclose(bias_result.numpy(), bias_grad, **F64)
    np.testing.assert_allclose(buffer, w_grad, **F64)          # written in place
    np.testing.assert_allclose(binding.get_outputs_as_numpy()[1], w_grad, **F64)
    np.testing.assert_allclose(outputs[0].numpy(), case.reference(feeds)[0], **F64)


# -- many runs in flight, threads --------------------------------------------------------------


def _inputs_for_runs(case: tg.TrainingCase, count: int, seed: int):
    rng = np.random.default_rng(seed)
    feeds = [case.make_feeds(rng) for _ in range(count)]
    gradients = [case.make_gradients(rng, case.reference(f)) for f in feeds]
    return feeds, gradients


def _same_bits(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(
        g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes() for g, w in zip(got, want))


@pytest.mark.parametrize("order", ["reverse", "random"])
@pytest.mark.parametrize("form", FORMS)
def test_twenty_runs_in_flight(form, order, no_leaks):
    """20 forwards with different inputs, then the backwards in reverse or random order: each
    run gets exactly what it gets alone, and nothing is held afterwards."""
    case = tg.mlp_case()
    driver = Driver.for_model(case.model, form)
    feeds, gradients = _inputs_for_runs(case, 20, seed=11)
    alone = [driver.run(f, g) for f, g in zip(feeds, gradients)]
    shared = driver.new_binding() if form == "run_id" else None   # re-bound before each forward
    runs = [driver.forward(f, binding=shared) for f in feeds]
    if form == "run_id":
        assert driver.agent.runs_in_flight == 20
        assert len({run.handle for run in runs}) == 20
    for run, (outputs, _) in zip(runs, alone):
        assert _same_bits(run.numpy_outputs(), outputs)
    indices = list(range(20))[::-1] if order == "reverse" else list(np.random.default_rng(12).permutation(20))
    for i in indices:
        results = driver.backward(runs[i], gradients[i])
        assert _same_bits(results, alone[i][1]), f"run {i}"
        assert_matches_reference(case, feeds[i], gradients[i], alone[i][0], results)
    if form == "run_id":
        assert driver.agent.runs_in_flight == 0
    else:
        assert all(run.handle.status.startswith("finished") and run.handle.stash_size == 0 for run in runs)


@pytest.mark.parametrize("form", FORMS)
def test_threads_drive_separate_runs_of_one_agent(form, no_leaks):
    """Four threads, each with its own runs (all forwards, then the backwards in reverse),
    on one agent at once: results bit-identical to the single-threaded ones."""
    case = tg.mlp_case()
    driver = Driver.for_model(case.model, form)
    threads_count, per_thread = 4, 6
    feeds, gradients = _inputs_for_runs(case, threads_count * per_thread, seed=13)
    alone = [driver.run(f, g) for f, g in zip(feeds, gradients)]
    results: dict[int, tuple] = {}
    failures: list = []
    barrier = threading.Barrier(threads_count)

    def work(k: int) -> None:
        try:
            mine = range(k * per_thread, (k + 1) * per_thread)
            barrier.wait()
            for _ in range(3):
                runs = {i: driver.forward(feeds[i]) for i in mine}
                outputs = {i: runs[i].numpy_outputs() for i in mine}
                for i in reversed(mine):
                    results[i] = (outputs[i], driver.backward(runs[i], gradients[i]))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    for i, (outputs, grads) in enumerate(alone):
        assert _same_bits(results[i][0], outputs), f"forward of run {i}"
        assert _same_bits(results[i][1], grads), f"backward of run {i}"
    if form == "run_id":
        assert driver.agent.runs_in_flight == 0


class _SlowShape(np.ndarray):
    """A gradient whose ``shape`` takes a while (and lets other threads run) when read."""

    @property
    def shape(self):
        time.sleep(0.02)
        return np.asarray(self).shape


@pytest.mark.parametrize("form", STATE_FORMS)
def test_one_state_resumed_from_two_threads_runs_once(form):
    """Two threads race to resume the same state while the gradients are being checked:
    exactly one backward runs, the other gets RunStateError (the state is claimed before
    anything can let another thread in)."""
    case = tg.mlp_case()
    driver = Driver.for_model(case.model, form)
    feeds, gradients = _inputs_for_runs(case, 1, seed=14)
    gradient = gradients[0][0].view(_SlowShape)
    for _ in range(3):
        run = driver.forward(feeds[0])
        outcomes: list = []
        barrier = threading.Barrier(2)

        def resume():
            barrier.wait()
            try:
                driver.agent.run_backward([gradient], [], run.handle)
                outcomes.append("ok")
            except ortagent.RunStateError:
                outcomes.append("refused")

        threads = [threading.Thread(target=resume) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["ok", "refused"]


# -- memory ------------------------------------------------------------------------------------


def _live(kind: str) -> int:
    gc.collect()
    return ortagent.live_handles()[kind]


@pytest.mark.parametrize("form", STATE_FORMS)
def test_stash_is_released_after_backward_and_on_release_or_drop(form, no_leaks):
    case = tg.mlp_case()                               # stash: h and r
    driver = Driver.for_model(case.model, form, as_values=False)
    feeds, gradients = _inputs_for_runs(case, 1, seed=15)
    values, states = _live("value"), _live("run_state")

    run = driver.forward(feeds[0])
    assert run.handle.stash_size == 2 and run.handle.status == "waiting for its backward"
    assert run.handle.stash_devices == ["cpu", "cpu"]
    assert _live("value") - values == 2 + 2            # two module outputs, two stashed values
    assert _live("run_state") - states == 1
    del run.outputs                                    # the state holds the stash, not the outputs
    assert _live("value") - values == 2
    results = driver.backward_values(run, gradients[0])
    assert run.handle.stash_size == 0 and run.handle.status.startswith("finished")
    assert run.handle.stash_devices == []
    assert _live("value") - values == len(results)     # only the gradients remain
    del results
    assert _live("value") == values

    run = driver.forward(feeds[0])
    outputs = run.outputs
    del run.outputs
    run.handle.release()                               # freed without a backward
    assert run.handle.stash_size == 0
    assert _live("value") - values == len(outputs)
    del outputs
    assert _live("value") == values

    run = driver.forward(feeds[0])
    del run                                            # dropping the state frees everything
    assert _live("value") == values and _live("run_state") == states


def test_run_id_release_and_close_free_pending_runs(no_leaks):
    """A pending run holds its module outputs, its stash and (through its binding) its inputs;
    release_run frees one run's share, backward another's, close() all the rest."""
    case = tg.mlp_case()
    driver = Driver.for_model(case.model, "run_id", as_values=False)
    feeds, gradients = _inputs_for_runs(case, 4, seed=16)
    values, states = _live("value"), _live("run_state")
    runs = [driver.forward(f) for f in feeds]          # one binding per run
    ids = [run.handle for run in runs]
    binding = runs[1].binding
    del runs
    held = _live("value") - values
    assert held % 4 == 0 and held // 4 >= 2 + 2         # per run: outputs, stash, bound inputs
    per_run = held // 4
    assert _live("run_state") - states == 4 and driver.agent.runs_in_flight == 4
    driver.agent.release_run(ids[0])
    assert _live("value") - values == 3 * per_run and driver.agent.runs_in_flight == 3
    driver.agent.run_backward(gradients[1], ids[1])
    results = binding.get_outputs_as_numpy()
    assert_matches_reference(case, feeds[1], gradients[1], case.reference(feeds[1]), results)
    del binding, results
    assert _live("value") - values == 2 * per_run and driver.agent.runs_in_flight == 2
    driver.agent.close()                                 # releases the two pending runs
    assert driver.agent.runs_in_flight == 0
    assert _live("value") == values and _live("run_state") == states
    with pytest.raises(ortagent.ObjectClosedError):
        driver.agent.run_backward(gradients[2], ids[2])
    driver.agent.close()                                 # idempotent


def test_context_manager_closes_agent_and_its_runs(no_leaks):
    case = tg.mul_add_case()
    feeds, _ = _inputs_for_runs(case, 1, seed=17)
    with make_agent(case.model, "run_id") as agent:
        driver = Driver(agent, "run_id", graph_names(case.model))
        driver.forward(feeds[0])
        assert agent.runs_in_flight == 1
    assert agent.runs_in_flight == 0
    with pytest.raises(ortagent.ObjectClosedError):
        driver.forward(feeds[0])


# -- values handed out stay valid --------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("builder", [tg.mul_add_case, tg.multi_output_case], ids=["mul_add", "multi_output"])
def test_forward_outputs_stay_valid_after_backward(builder, form):
    """onnxruntime-training 1.19.2 reuses the memory of the YieldOp inputs during backward, so a
    forward output read after backward holds other numbers (FINDINGS.md). Here zero-copy views
    of the forward outputs taken before backward keep their values through backward and later
    runs."""
    case = builder(np.float32)
    driver = Driver.for_model(case.model, form)
    feeds, gradients = _inputs_for_runs(case, 6, seed=18)
    run = driver.forward(feeds[0])
    views = [value.numpy() for value in run.outputs]
    assert all(view.ctypes.data == value.data_ptr() for view, value in zip(views, run.outputs))
    copies = [view.copy() for view in views]
    driver.backward(run, gradients[0])
    for f, g in zip(feeds[1:], gradients[1:]):
        driver.run(f, g)
    assert _same_bits(views, copies)
    assert _same_bits([value.numpy() for value in run.outputs], copies)


def _alias_case() -> tg.TrainingCase:
    """Outputs onnxruntime returns as aliases of a feed's buffer: module outputs that are a
    Reshape / Identity of a graph input, a stashed Reshape of a graph input the backward does
    not read itself, and graph outputs that are a gradient's Identity or a graph input.

    y = x * w, xr = reshape(x, [6]), wi = w; x_grad = gy * w + reshape(gxr), w_grad = gy * x + gwi.
    """
    dtype = np.float64
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["y"]),
        helper.make_node("Reshape", ["x", "flat"], ["xr"]),
        helper.make_node("Identity", ["w"], ["wi"]),
        helper.make_node("Reshape", ["x", "tall"], ["xs"]),
        tg.yield_node(["y", "xr", "wi"], ["y_grad", "xr_grad", "wi_grad"], [0, 1, 2]),
        helper.make_node("Reshape", ["xs", "wide"], ["x_back"]),
        helper.make_node("Mul", ["y_grad", "x_back"], ["gyx"]),
        helper.make_node("Add", ["gyx", "wi_grad"], ["w_grad"]),
        helper.make_node("Mul", ["y_grad", "w"], ["gyw"]),
        helper.make_node("Reshape", ["xr_grad", "wide"], ["gxr"]),
        helper.make_node("Add", ["gyw", "gxr"], ["x_grad"]),
        helper.make_node("Identity", ["y_grad"], ["y_grad_out"]),
    ]
    shape = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("flat", [6]), ("tall", [3, 2]), ("wide", [2, 3]))]
    model = tg.make_model(
        nodes, [tg.tensor("x", dtype, [2, 3]), tg.tensor("w", dtype, [2, 3])],
        [tg.tensor("x_grad", dtype, [2, 3]), tg.tensor("w_grad", dtype, [2, 3]), tg.tensor("y_grad_out", dtype, [2, 3]),
         tg.tensor("w", dtype, [2, 3])],
        shape, name="aliases")

    def reference(f):
        return [f["x"] * f["w"], f["x"].reshape(6), f["w"]]

    def gradients(f, g):
        gy, gxr, gwi = g
        return [gy * f["w"] + gxr.reshape(2, 3), gy * f["x"] + gwi, gy, f["w"]]

    return tg.TrainingCase(
        "aliases", model, [tg.InputSpec("x", (2, 3), np.dtype(dtype)), tg.InputSpec("w", (2, 3), np.dtype(dtype))],
        ["y", "xr", "wi"], [True, True, True], ["x_grad", "w_grad", "y_grad_out", "w"], reference, gradients,
        gradient_of={"x_grad": "x", "w_grad": "w"})


def _scribble() -> list[np.ndarray]:
    """Allocate and fill many small arrays, so freed buffers get other contents."""
    gc.collect()
    return [np.full(16, -7.0) for _ in range(4000)]


@pytest.mark.parametrize("as_values", [False, True], ids=["numpy", "values"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("builder", [_alias_case, tg.passthrough_outputs_case], ids=["aliases", "passthrough"])
def test_outputs_aliasing_caller_memory_outlive_the_callers_arrays(builder, form, as_values, no_leaks):
    """onnxruntime hands back a feed (or a Reshape/Identity of it) as an output that shares the
    feed's buffer -- the caller's NumPy memory. Such outputs, and a stashed alias of an input,
    must keep that memory alive after the caller drops its arrays (they used to dangle)."""
    case = builder()
    driver = Driver.for_model(case.model, form, as_values=as_values)
    rng = np.random.default_rng(19)
    feeds = case.make_feeds(rng)
    gradients = case.make_gradients(rng, case.reference(feeds))
    run = driver.forward({name: value.copy() for name, value in feeds.items()})   # temporaries
    junk = _scribble()
    outputs = [value.numpy().copy() for value in run.outputs]
    results = driver.backward_values(run, [g.copy() for g in gradients])
    del run
    junk += _scribble()
    assert_matches_reference(case, feeds, gradients, outputs, [value.numpy() for value in results])


# -- GIL, RunOptions ---------------------------------------------------------------------------


SLOW_SIZE = 256


@pytest.fixture(scope="module")
def slow_graph():
    return slow_training_graph(SLOW_SIZE)


@pytest.mark.parametrize("form", ["state7", "run_id"])
def test_gil_is_released_in_forward_and_backward(form, slow_graph):
    model, reference = slow_graph
    driver = Driver.for_model(model, form, as_values=False)
    x, w = np.random.default_rng(20).standard_normal((SLOW_SIZE, SLOW_SIZE)).astype(np.float32), orthogonal(SLOW_SIZE, 21)
    # enough MatMuls for a few tenths of a second per half on this machine (calibrated on the
    # fastest of a few short runs: a busy machine makes the first ones slow)
    per_trip = np.inf
    for _ in range(4):
        start = time.perf_counter()
        driver.forward({"x": x, "w": w, "trips": np.array(30, np.int64)})
        per_trip = min(per_trip, (time.perf_counter() - start) / 30)
    trips = np.array(int(np.clip(0.3 / per_trip, 100, 20000)), np.int64)
    y_grad = np.random.default_rng(22).standard_normal((SLOW_SIZE, SLOW_SIZE)).astype(np.float32)
    runs = []
    assert_releases_gil(lambda: runs.append(driver.forward({"x": x, "w": w, "trips": trips})), "forward")
    results = []
    assert_releases_gil(lambda: results.append(driver.backward(runs[0], [y_grad])), "backward")
    y, x_grad = reference(x, w, trips, y_grad)
    np.testing.assert_allclose(runs[0].numpy_outputs()[0], y, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(results[0][0], x_grad, rtol=1e-3, atol=1e-3)


def test_run_options_terminate_and_tag_pass_through(slow_graph, capfd, no_leaks):
    """terminate set from another thread stops a long forward with a typed error (the run tag
    appears in onnxruntime's log line for it); with terminate cleared the agent works on."""
    model, reference = slow_graph
    agent = ortagent.TrainingAgent(model.SerializeToString())
    binding = agent.io_binding()
    x, w = np.ones((SLOW_SIZE, SLOW_SIZE), np.float32), orthogonal(SLOW_SIZE, 23)
    binding.bind_cpu_input("x", x)
    binding.bind_cpu_input("w", w)
    binding.bind_cpu_input("trips", np.array(10**8, np.int64))       # hours, unless stopped
    options = ortagent.RunOptions()
    options.logid = "agent-terminate-probe"
    timer = threading.Timer(0.3, lambda: setattr(options, "terminate", True))
    severity = ortagent.get_default_logger_severity()
    ortagent.set_default_logger_severity(2)                          # errors reach stderr
    try:
        timer.start()
        start = time.perf_counter()
        with pytest.raises(ortagent.OrtError, match="terminate") as info:
            agent.run_forward(binding, options)
        elapsed = time.perf_counter() - start
        timer.join()
    finally:
        ortagent.set_default_logger_severity(severity)
    assert isinstance(info.value, RuntimeError)
    assert 0.1 < elapsed < 30, elapsed
    assert agent.runs_in_flight == 0
    assert "onnxruntime:agent-terminate-probe," in capfd.readouterr().err
    with pytest.raises(ortagent.OrtError, match="terminate"):          # still set: refused at once
        agent.run_forward(binding, options)
    options.terminate = False
    binding.bind_cpu_input("trips", np.array(3, np.int64))
    outputs, run_id = agent.run_forward(binding, options)
    y_grad = np.eye(SLOW_SIZE, dtype=np.float32)
    agent.run_backward([y_grad], run_id)
    y, x_grad = reference(x, w, 3, y_grad)
    np.testing.assert_allclose(outputs[0].numpy(), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(binding.get_outputs()[0].numpy(), x_grad, rtol=1e-5, atol=1e-5)
    assert agent.runs_in_flight == 0


def test_engine_device_path_binds_a_stashed_module_output_once_and_copies_for_the_caller():
    """The per-call IoBinding path (what every CUDA run takes), driven on the CPU through the
    engine: a module output the backward also reads is listed twice (module output, stash).
    It is bound once, where the stash wants it, and copied into what the caller asked for
    (here a caller's buffer), so the stash never moves for the caller's sake."""
    case = tg.multi_output_case()                      # module outputs a, s; stash: a
    agent = make_agent(case.model, "run_id")
    engine = agent._engine
    rng = np.random.default_rng(24)
    feeds = case.make_feeds(rng)
    buffer = np.full(3, np.nan)
    # a cuda_pinned target for s sends the forward down the IoBinding path; on a CPU-only
    # session onnxruntime leaves the value on the CPU
    targets = [ortagent.OrtValue.ortvalue_from_numpy(buffer), ortagent.OrtDevice.parse("cuda_pinned")]
    state = ortagent.PartialGraphExecutionState()
    outputs = engine.forward(state, [feeds[n] for n in case.input_names], None, targets)
    a, s = case.reference(feeds)
    assert outputs[0] is targets[0]                    # the caller's value, written in place
    np.testing.assert_allclose(buffer, a, **F64)
    np.testing.assert_allclose(outputs[1].numpy(), s, **F64)
    assert state.stash_size == 1 and state.stash_devices == ["cpu"]
    buffer[:] = 0                                      # the caller's buffer is not the stash
    gradients = [rng.standard_normal(3), np.asarray(rng.standard_normal())]
    results = engine.backward(state, gradients, [0, 1], [None, None], None)
    for got, want in zip(results, case.reference_gradients(feeds, gradients)):
        np.testing.assert_allclose(got.numpy(), want, **F64)


def test_close_while_a_forward_runs_releases_that_run(slow_graph, no_leaks):
    """close() from another thread while a run-id forward runs: the forward's run cannot be
    resumed any more, so it is released (ObjectClosedError) instead of staying registered in
    the closed agent with its stash."""
    model, _ = slow_graph
    agent = ortagent.TrainingAgent(model.SerializeToString())
    binding = agent.io_binding()
    binding.bind_cpu_input("x", orthogonal(SLOW_SIZE, 25))
    binding.bind_cpu_input("w", orthogonal(SLOW_SIZE, 26))
    binding.bind_cpu_input("trips", np.array(40, np.int64))
    agent.release_run(agent.run_forward(binding, None)[1])     # warm: first-run costs are not trips
    start = time.perf_counter()
    agent.release_run(agent.run_forward(binding, None)[1])
    per_trip = (time.perf_counter() - start) / 40
    binding.bind_cpu_input("trips", np.array(int(np.clip(1.0 / per_trip, 40, 40000)), np.int64))
    outcome: list = []

    def forward():
        try:
            outcome.append(agent.run_forward(binding, None))
        except ortagent.ObjectClosedError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=forward)
    thread.start()
    time.sleep(0.15)
    agent.close()
    thread.join()
    assert agent.runs_in_flight == 0
    assert outcome == ["this TrainingAgent was closed while the forward ran; the run is released"], \
        "the forward ended before close(): make it longer"
    del outcome                                  # no_leaks then checks every handle kind


@pytest.mark.parametrize("form", FORMS)
def test_backward_does_not_need_the_callers_forward_outputs(form):
    """The caller may close or drop the forward outputs before the backward (the state keeps
    only their shapes, and its own handle on a module output the backward reads)."""
    case = tg.multi_output_case()                      # the backward reads module output a
    driver = Driver.for_model(case.model, form)
    rng = np.random.default_rng(27)
    feeds = case.make_feeds(rng)
    gradients = case.make_gradients(rng, case.reference(feeds))
    run = driver.forward(feeds)
    for value in run.outputs:
        value.close()
    del run.outputs
    results = driver.backward(run, gradients)
    assert_matches_reference(case, feeds, gradients, case.reference(feeds), results)


@pytest.mark.parametrize("api", ["state", "run_id"])
def test_ctrl_c_during_a_long_agent_run_raises_keyboard_interrupt(tmp_path, api):
    """SIGINT while the main thread is in a forward that would take many minutes: the run stops
    at the next node boundary, KeyboardInterrupt surfaces, and the agent keeps working. (Without
    ortagent's handler the subprocess would hit its timeout.) Backward runs through the same
    call path as forward."""
    import subprocess
    import textwrap

    from conftest import REPO_ROOT

    script = tmp_path / "interrupt_agent.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, threading
        # as in an interactive interpreter (a CI job may start Python with SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {os.path.join(REPO_ROOT, 'tests')!r})
        import numpy as np, ortagent
        from agent_driver import slow_training_graph
        model, _ = slow_training_graph(size=128)
        agent = ortagent.TrainingAgent(model.SerializeToString())
        x = np.eye(128, dtype=np.float32)
        w = np.eye(128, dtype=np.float32)
        def feeds(trips):
            return [ortagent.OrtValue.ortvalue_from_numpy(a) for a in (x, np.array(trips, np.int64), w)]
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            if {api!r} == "state":
                agent.run_forward(feeds(10_000_000), [], ortagent.PartialGraphExecutionState())
            else:
                binding = agent.io_binding()
                for name, value in zip(("x", "trips", "w"), feeds(10_000_000)):
                    binding.bind_ortvalue_input(name, value)
                agent.run_forward(binding, None)
            print("completed")
        except KeyboardInterrupt:
            print("interrupted")
        state = ortagent.PartialGraphExecutionState()
        outputs, gradients = [], []
        agent.run_forward(feeds(2), outputs, state)
        agent.run_backward([ortagent.OrtValue.ortvalue_from_numpy(np.ones((128, 128), np.float32))], gradients, state)
        print(gradients[0].shape(), agent.runs_in_flight)
    """))
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "[128,", "128]", "0"]
