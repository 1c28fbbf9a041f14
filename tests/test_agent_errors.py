"""TrainingAgent misuse and bad input: a typed ortagent exception naming what is wrong, where
onnxruntime-training 1.19.2's own agent crashes, aborts or silently computes garbage
(ortagent_testkit/reference_agent/FINDINGS.md). After every error the agent keeps working -- the next valid
call succeeds and gives the right numbers -- and no ORT handle is left behind (``no_leaks``).
"""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest
from onnx import helper

import ortagent
from ortagent_testkit import training_graphs as tg
from ortagent.graph_split import split_training_graph
from conftest import cuda_unavailable_reason
from agent_driver import FORMS, STATE_FORMS, Driver, device_info, graph_names, make_agent

F64 = tg.TOLERANCE[np.dtype(np.float64)]
CASE = tg.mul_add_case()             # out = x * w + bias; out is a full-shape output
MODEL = CASE.model.SerializeToString()


def _feeds(seed=0):
    rng = np.random.default_rng(seed)
    feeds = CASE.make_feeds(rng)
    return feeds, [rng.standard_normal((2, 3))]


def assert_works(driver: Driver, seed: int = 1) -> None:
    """A full valid run on `driver`'s agent gives the NumPy reference."""
    feeds, gradients = _feeds(seed)
    outputs, results = driver.run(feeds, gradients)
    np.testing.assert_allclose(outputs[0], CASE.reference(feeds)[0], **F64)
    for got, want in zip(results, CASE.reference_gradients(feeds, gradients)):
        np.testing.assert_allclose(got, want, **F64)


def assert_resumes(driver: Driver, run, feeds, gradients) -> None:
    """`run` is still waiting for its backward, and a valid backward completes it correctly."""
    results = driver.backward(run, gradients)
    for got, want in zip(results, CASE.reference_gradients(feeds, gradients)):
        np.testing.assert_allclose(got, want, **F64)


def _live_handles() -> dict:
    gc.collect()
    return ortagent.live_handles()


def _driver_without_leaks(form: str):
    """A Driver for CASE whose agent is dropped at teardown, and then every ORT handle the
    test created must be gone (pytest keeps fixture values, so ``no_leaks`` cannot see this)."""
    before = _live_handles()
    driver = Driver.for_model(CASE.model, form)
    yield driver
    driver.agent = None
    after = _live_handles()
    leaked = {k: after[k] - before[k] for k in before if after[k] != before[k]}
    assert not leaked, f"live handles changed: {leaked}"


@pytest.fixture(params=FORMS)
def driver(request):
    yield from _driver_without_leaks(request.param)


@pytest.fixture(params=STATE_FORMS)
def state_driver(request):
    yield from _driver_without_leaks(request.param)


# -- malformed training graphs: TrainingGraphError at construction -----------------------------


def _graph(yield_nodes, module_outputs=("out",)) -> bytes:
    """mul_add's nodes with other YieldOp node(s); `module_outputs` are extra forward values."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "bias"], ["out"])]
    nodes += list(yield_nodes)
    nodes += [helper.make_node("Mul", ["out_grad", "w"], ["x_grad"])]
    return tg.make_model(
        nodes, [tg.tensor("x", np.float64, [2, 3]), tg.tensor("w", np.float64, [3]), tg.tensor("bias", np.float64, [3])],
        [tg.tensor("x_grad", np.float64, [2, 3])]).SerializeToString()


MALFORMED = {
    # 1.19.2: constructs, runs the whole graph as "forward", fails or "succeeds" in backward
    "no_yield": (_graph([helper.make_node("Identity", ["out"], ["out_grad"])]), r"no com\.microsoft:YieldOp"),
    "two_yields": (_graph([tg.yield_node(["out"], ["out_grad"], [0], name="first"),
                           tg.yield_node(["xw"], ["xw_grad"], [0], name="second")]), r"2 YieldOp nodes"),
    "full_shape_missing": (_graph([tg.yield_node(["out"], ["out_grad"], None)]),
                           r"required attribute 'full_shape_outputs'"),
    "full_shape_out_of_range": (_graph([tg.yield_node(["out"], ["out_grad"], [3])]),
                                r"'full_shape_outputs' has index 3, out of range"),
    "full_shape_negative": (_graph([tg.yield_node(["out"], ["out_grad"], [-1])]),
                            r"'full_shape_outputs' has the negative index -1"),
    # 1.19.2 aborts the process (SIGABRT in the schema's type inference) on these two
    "non_differentiable_out_of_range": (_graph([tg.yield_node(["out", "xw"], ["out_grad"], [0], [2])]),
                                        r"'non_differentiable_outputs' has index 2, out of range"),
    "non_differentiable_negative": (_graph([tg.yield_node(["out", "xw"], ["out_grad"], [0], [-1])]),
                                    r"'non_differentiable_outputs' has the negative index -1"),
    "gradient_count_mismatch": (_graph([tg.yield_node(["out", "xw"], ["out_grad"], [0])]),
                                r"needs 2 output\(s\).*has 1"),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_graph_is_refused_at_construction(name, form, no_leaks):
    model, message = MALFORMED[name]
    with pytest.raises(ortagent.TrainingGraphError, match=message) as info:
        if form == "run_id":
            ortagent.TrainingAgent(model)
        elif form == "kw1192":
            ortagent.TrainingAgent(model, fw_feed_names=["x", "w", "bias"], fw_outputs_device_info=["cpu"] * 2,
                                   bw_fetches_names=["x_grad"], bw_outputs_device_info=["cpu"])
        else:
            ortagent.TrainingAgent(model, ["x", "w", "bias"], ["out"], ["cpu"], ["out_grad"], ["x_grad"], ["cpu"])
    assert isinstance(info.value, ortagent.OrtInvalidGraph) and isinstance(info.value, ValueError)
    assert_works(Driver.for_model(CASE.model, form))


# -- gradients: checked before anything runs ---------------------------------------------------


@pytest.mark.parametrize("count", [0, 2])
def test_wrong_number_of_gradients(driver, count):
    feeds, gradients = _feeds()
    run = driver.forward(feeds)
    with pytest.raises(ortagent.OrtInvalidArgument, match=rf"expected 1 gradients.*'out_grad'.*got {count}"):
        driver.backward(run, [gradients[0]] * count)
    assert_resumes(driver, run, feeds, gradients)
    assert_works(driver)


def test_gradient_of_wrong_dtype(driver):
    """1.19.2 does not check; the first consuming kernel fails (or not) later."""
    feeds, gradients = _feeds()
    run = driver.forward(feeds)
    with pytest.raises(ortagent.OrtInvalidArgument,
                       match=r"gradient 0 \(for output 'out'\) must be tensor\(double\), got tensor\(float\)"):
        driver.backward(run, [gradients[0].astype(np.float32)])
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"gradient 0 \(for output 'out'\).*tensor\(int64\)"):
        driver.backward(run, [np.ones((2, 3), np.int64)])
    assert_resumes(driver, run, feeds, gradients)


@pytest.mark.parametrize("shape", [(3, 2), (3,), (1, 3), (2, 3, 1), ()], ids=str)
def test_full_shape_gradient_of_wrong_shape(driver, shape):
    """``out`` is in full_shape_outputs: anything but [2, 3] is refused before running --
    including a scalar, which 1.19.2 silently accepts (and returns x_grad of shape [3])."""
    feeds, gradients = _feeds()
    run = driver.forward(feeds)
    with pytest.raises(ortagent.OrtInvalidArgument, match=re.escape(
            f"gradient 0 (for output 'out') must have the output's full shape [2, 3], got {list(shape)}")):
        driver.backward(run, [np.ones(shape)])
    assert_resumes(driver, run, feeds, gradients)


def _not_full_shape_model() -> bytes:
    """mul_add with an empty full_shape_outputs: any gradient that broadcasts to [2, 3] goes."""
    model = tg.mul_add_case().model
    node = next(n for n in model.graph.node if n.op_type == "YieldOp")
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("full_shape_outputs", [], attr_type=helper.AttributeProto.INTS))
    return model.SerializeToString()


@pytest.mark.parametrize("form", FORMS)
def test_broadcastable_gradient_for_an_output_not_in_full_shape_outputs(form, no_leaks):
    """Not in full_shape_outputs: a gradient that broadcasts is passed to the backward as it is
    (ORTModule feeds a scalar zero for an unused output); the result is what the backward
    graph computes from it, run directly on onnxruntime."""
    model = _not_full_shape_model()
    driver = Driver(make_agent(model, form), form, graph_names(CASE.model))
    direct = tg.SplitRunner(split_training_graph(model))
    feeds, _ = _feeds()
    for gradient in (np.asarray(1.5), np.array([1.0, -2.0, 0.5]), np.ones((2, 1))):
        outputs, results = driver.run(feeds, [gradient])
        _, expected = direct.run(feeds, [gradient])
        assert [r.shape for r in results] == [e.shape for e in expected]
        for got, want in zip(results, expected):
            np.testing.assert_array_equal(got, want)
    run = driver.forward(feeds)
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"of shape \[4\] does not broadcast to the output's "
                                                          r"shape \[2, 3\]"):
        driver.backward(run, [np.ones(4)])
    driver.backward(run, [np.ones((2, 3))])


def test_gradient_that_is_not_a_tensor(driver):
    feeds, gradients = _feeds()
    run = driver.forward(feeds)
    with pytest.raises(ortagent.OrtInvalidType, match=r"gradient 0 \(for output 'out'\) must be an OrtValue or a "
                                                      r"numpy\.ndarray, got list"):
        if driver.form == "run_id":
            driver.agent.run_backward([[1.0, 2.0]], run.handle)
        else:
            driver.agent.run_backward([[1.0, 2.0]], [], run.handle)
    assert_resumes(driver, run, feeds, gradients)


# -- runs used out of order --------------------------------------------------------------------


def test_state_forward_twice(state_driver):
    feeds, gradients = _feeds()
    run = state_driver.forward(feeds)
    with pytest.raises(ortagent.RunStateError, match="waiting for its backward.*create a new one for each run"):
        state_driver.agent.run_forward([feeds[n] for n in CASE.input_names], [], run.handle)
    assert_resumes(state_driver, run, feeds, gradients)
    with pytest.raises(ortagent.RunStateError, match="finished"):     # nor after its backward
        state_driver.agent.run_forward([feeds[n] for n in CASE.input_names], [], run.handle)
    assert_works(state_driver)


def test_state_backward_twice_and_without_forward(state_driver):
    feeds, gradients = _feeds()
    run = state_driver.forward(feeds)
    assert_resumes(state_driver, run, feeds, gradients)
    with pytest.raises(ortagent.RunStateError, match=r"this run is finished"):
        state_driver.backward(run, gradients)
    fresh = ortagent.PartialGraphExecutionState()
    with pytest.raises(ortagent.RunStateError, match=r"not started; run_forward must come first"):
        state_driver.agent.run_backward(gradients, [], fresh)
    released = state_driver.forward(feeds)
    released.handle.release()
    with pytest.raises(ortagent.RunStateError, match=r"finished \(backward done or released\)"):
        state_driver.backward(released, gradients)
    assert_works(state_driver)


def test_state_of_another_agent(state_driver):
    feeds, gradients = _feeds()
    other = Driver.for_model(CASE.model, state_driver.form)
    run = other.forward(feeds)
    with pytest.raises(ortagent.RunStateError, match="belongs to another TrainingAgent"):
        state_driver.backward(run, gradients)
    assert_resumes(other, run, feeds, gradients)
    assert_works(state_driver)


@pytest.mark.parametrize("state", [None, {}, "state", 0], ids=repr)
def test_state_api_needs_a_state_and_a_fetch_list(state_driver, state):
    feeds, gradients = _feeds()
    values = [feeds[n] for n in CASE.input_names]
    with pytest.raises(ortagent.OrtInvalidType, match="PartialGraphExecutionState"):
        state_driver.agent.run_forward(values, [], state)
    with pytest.raises(ortagent.OrtInvalidType, match="PartialGraphExecutionState"):
        state_driver.agent.run_backward(gradients, [], state)
    with pytest.raises(ortagent.OrtInvalidType, match="fetches must be a list"):
        state_driver.agent.run_forward(values, (), ortagent.PartialGraphExecutionState())
    assert_works(state_driver)


def test_unknown_finished_and_released_run_ids(no_leaks):
    driver = Driver.for_model(CASE.model, "run_id")
    feeds, gradients = _feeds()
    agent = driver.agent
    for run_id in (999, "1", None, -1):
        with pytest.raises(ortagent.UnknownRunError, match="no run with id"):
            agent.run_backward(gradients, run_id)
    finished = driver.forward(feeds)
    assert_resumes(driver, finished, feeds, gradients)
    with pytest.raises(ortagent.UnknownRunError, match=rf"no run with id {finished.handle}"):
        driver.backward(finished, gradients)
    released = driver.forward(feeds)
    agent.release_run(released.handle)
    with pytest.raises(ortagent.UnknownRunError) as info:
        driver.backward(released, gradients)
    assert isinstance(info.value, ortagent.RunStateError) and isinstance(info.value, LookupError)
    with pytest.raises(ortagent.UnknownRunError):
        agent.release_run(released.handle)
    assert agent.runs_in_flight == 0
    assert_works(driver)


# -- names and devices: checked at construction ------------------------------------------------

NAMES = dict(fw_feed_names=["x", "w", "bias"], fw_fetches_names=["out"], fw_outputs_device_info=["cpu"],
             bw_feed_names=["out_grad"], bw_fetches_names=["x_grad", "w_grad", "bias_grad"],
             bw_outputs_device_info=["cpu"] * 3)


def _state7(**changes):
    named = {**NAMES, **changes}
    return ortagent.TrainingAgent(MODEL, *[named[k] for k in ("fw_feed_names", "fw_fetches_names",
                                                             "fw_outputs_device_info", "bw_feed_names",
                                                             "bw_fetches_names", "bw_outputs_device_info")])


def _kw1192(**changes):
    named = {**NAMES, **changes}
    return ortagent.TrainingAgent(MODEL, **{k: named[k] for k in ("fw_feed_names", "fw_outputs_device_info",
                                                                   "bw_fetches_names", "bw_outputs_device_info")})


BAD_ARGUMENTS = [
    # 1.19.2: RuntimeError "Error mapping feeds" / "Error mapping output names"
    ("feed_not_a_graph_input", dict(fw_feed_names=["x", "w", "b"]), "fw_feed_names: 'b' is not a graph input"),
    ("fetch_not_a_graph_output", dict(bw_fetches_names=["x_grad", "xw"], bw_outputs_device_info=["cpu"] * 2),
     "bw_fetches_names: 'xw' is not a graph output"),
    ("feed_missing", dict(fw_feed_names=["x", "w"]), r"fw_feed_names lacks graph inputs the graph reads: \['bias'\]"),
    ("fetch_twice", dict(bw_fetches_names=["w_grad", "w_grad"], bw_outputs_device_info=["cpu"] * 2),
     "bw_fetches_names lists a name twice"),
    # 1.19.2 aborts the process (SIGABRT) when a device list is shorter than its fetches
    ("fw_devices_short", dict(fw_outputs_device_info=[]), "fw_outputs_device_info has 0 entries for 1 fetches"),
    ("bw_devices_short", dict(bw_outputs_device_info=["cpu"] * 2), "bw_outputs_device_info has 2 entries for 3 fetches"),
    ("fw_devices_not_a_list", dict(fw_outputs_device_info="cpu"), "fw_outputs_device_info must be a list"),
    ("unknown_device", dict(bw_outputs_device_info=["cpu", "tpu", "cpu"]), "unknown device 'tpu'"),
    ("names_not_a_list", dict(fw_feed_names="x"), "fw_feed_names must be a list of names"),
]
STATE7_ONLY = [
    ("fetch_not_a_module_output", dict(fw_fetches_names=["xw"]), "fw_fetches_names: 'xw' is not a module output"),
    ("gradient_name_unknown", dict(bw_feed_names=["x_grad"]), "bw_feed_names: 'x_grad' is not a YieldOp output"),
]


BAD_ARGUMENT_CASES = [pytest.param(build, *case, id=f"{form}-{case[0]}") for form, build in (("state7", _state7), ("kw1192", _kw1192))
                      for case in BAD_ARGUMENTS + (STATE7_ONLY if build is _state7 else [])]


@pytest.mark.parametrize("build,name,changes,message", BAD_ARGUMENT_CASES)
def test_bad_names_and_device_lists(build, name, changes, message, no_leaks):
    with pytest.raises((ortagent.OrtInvalidArgument, ortagent.OrtInvalidType), match=message):
        build(**changes)
    agent = build()
    assert_works(Driver(agent, "state7" if build is _state7 else "kw1192", graph_names(CASE.model)))


def test_longer_device_lists_are_accepted_like_1192(no_leaks):
    """ORTModule appends entries of its own; the extra ones are ignored."""
    agent = _kw1192(fw_outputs_device_info=["cpu"] * 3, bw_outputs_device_info=["cpu"] * 5)
    assert_works(Driver(agent, "kw1192", graph_names(CASE.model)))


def test_constructor_argument_mistakes(no_leaks):
    with pytest.raises(ortagent.OrtInvalidType, match="unexpected arguments"):
        ortagent.TrainingAgent(MODEL, fw_feed_names=["x", "w", "bias"], fw_outputs_device_info=["cpu"],
                               bw_fetches_names=["x_grad"], bw_outputs_device_info=["cpu"], bw_grads=[])
    with pytest.raises(ortagent.OrtInvalidType, match="two values for 'fw_feed_names'"):
        ortagent.TrainingAgent(MODEL, ["x", "w", "bias"], ["cpu"], ["x_grad"], ["cpu"],
                               fw_feed_names=["x", "w", "bias"])
    with pytest.raises(ortagent.OrtInvalidType, match="at most"):
        ortagent.TrainingAgent(MODEL, *([None] * 12))


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="a CUDA EP works here: cuda:0 is reachable")
@pytest.mark.parametrize("device", ["cuda:0", "cuda_pinned"])
@pytest.mark.parametrize("spelling", ["string", "ortdevice", "ort_like"])
def test_device_no_provider_can_reach(device, spelling, no_leaks):
    """A CPU-only agent asked for outputs on a CUDA device used to hand back CPU values
    silently; the entry is now refused, naming the output and the providers."""
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"entry for 'out'.*needs the CUDAExecutionProvider"):
        _kw1192(fw_outputs_device_info=[device_info(spelling, device)])
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"entry for 'w_grad'.*needs the CUDAExecutionProvider"):
        _state7(bw_outputs_device_info=["cpu", device_info(spelling, device), "cpu"])
    agent = ortagent.TrainingAgent(MODEL)
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"output 'x_grad'.*needs the CUDAExecutionProvider"):
        agent.io_binding().bind_output("x_grad", device)
    assert_works(Driver(agent, "run_id", graph_names(CASE.model)))


# -- feeds and bindings ------------------------------------------------------------------------


def test_state_api_feed_mistakes(state_driver):
    feeds, _ = _feeds()
    values = [feeds[n] for n in CASE.input_names]
    agent = state_driver.agent
    with pytest.raises(ortagent.OrtInvalidArgument, match="expected 3 feeds"):
        agent.run_forward(values[:2], [], ortagent.PartialGraphExecutionState())
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"input 'w' expects tensor\(double\)"):
        agent.run_forward([values[0], values[1].astype(np.float32), values[2]], [],
                          ortagent.PartialGraphExecutionState())
    with pytest.raises(ortagent.OrtInvalidType, match=r"input 'bias' must be a numpy\.ndarray or an OrtValue"):
        agent.run_forward([values[0], values[1], "bias"], [], ortagent.PartialGraphExecutionState())
    with pytest.raises(ortagent.OrtInvalidType, match="feeds must be a list"):
        agent.run_forward(feeds, [], ortagent.PartialGraphExecutionState())
    assert_works(state_driver)


def test_binding_mistakes(no_leaks):
    driver = Driver.for_model(CASE.model, "run_id")
    feeds, _ = _feeds()
    binding = driver.agent.io_binding()
    with pytest.raises(ortagent.OrtInvalidArgument, match="unknown input name 'xx'"):
        binding.bind_cpu_input("xx", feeds["x"])
    with pytest.raises(ortagent.OrtInvalidArgument, match="input 'x' expects element type 11"):
        binding.bind_cpu_input("x", feeds["x"].astype(np.float32))
    with pytest.raises(ortagent.OrtInvalidArgument, match="unknown output name 'out'"):
        binding.bind_output("out")
    binding.bind_cpu_input("x", feeds["x"])
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"inputs \['w', 'bias'\] of the training graph are not bound"):
        driver.agent.run_forward(binding, None)
    other = Driver.for_model(CASE.model, "run_id")
    with pytest.raises(ortagent.OrtInvalidArgument, match="belongs to another TrainingAgent"):
        other.agent.run_forward(binding, None)
    with pytest.raises(ortagent.OrtInvalidType, match="run_options must be ortagent.RunOptions"):
        binding.bind_cpu_input("w", feeds["w"])
        binding.bind_cpu_input("bias", feeds["bias"])
        driver.agent.run_forward(binding, "fast")
    assert driver.agent.runs_in_flight == 0
    assert_works(driver)


def test_session_iobinding_instead_of_the_agents(no_leaks):
    """1.19.2-style code passing a session's IOBinding is told to use agent.io_binding()."""
    driver = Driver.for_model(CASE.model, "run_id")
    ours = driver.agent.forward_session.io_binding()
    with pytest.raises(ortagent.OrtInvalidType, match=r"use agent\.io_binding\(\).*ortagent\._core\.IOBinding"):
        driver.agent.run_forward(ours, None)
    del ours
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(tg.make_model([helper.make_node("Identity", ["x"], ["y"])],
                                                 [tg.tensor("x", np.float64, [1])],
                                                 [tg.tensor("y", np.float64, [1])]).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    with pytest.raises(ortagent.OrtInvalidType, match=r"use agent\.io_binding\(\).*onnxruntime.*IOBinding"):
        driver.agent.run_forward(session.io_binding(), ort.RunOptions())
    assert_works(driver)


# -- closed agent ------------------------------------------------------------------------------


def test_closed_agent(driver):
    feeds, gradients = _feeds()
    pending = driver.forward(feeds)
    binding = driver.agent.io_binding()
    driver.agent.close()
    with pytest.raises(ortagent.ObjectClosedError, match="closed"):
        driver.forward(feeds)
    with pytest.raises(ortagent.ObjectClosedError, match="closed"):
        driver.backward(pending, gradients)
    with pytest.raises(ortagent.ObjectClosedError, match="closed"):
        driver.agent.io_binding()
    with pytest.raises(ortagent.ObjectClosedError, match="closed"):
        driver.agent.run_forward(binding, None)
    assert isinstance(ortagent.ObjectClosedError("x"), RuntimeError)
    driver.agent.close()
    assert_works(Driver.for_model(CASE.model, driver.form))


@pytest.mark.parametrize("as_values", [False, True], ids=["numpy", "values"])
@pytest.mark.parametrize("form", FORMS)
def test_input_read_only_by_the_backward_is_checked_at_forward(form, as_values, no_leaks):
    """onnxruntime sees such an input only in the backward, when the run can no longer take
    another value: a wrong dtype or shape used to pass the forward and make every backward
    of that run fail. It is refused by the forward, naming the input."""
    case = tg.backward_only_input_case()            # s: read by the backward only
    driver = Driver.for_model(case.model, form, as_values=as_values)
    feeds = case.make_feeds(np.random.default_rng(2))
    for bad, message in ((feeds["s"].astype(np.float32), r"input 's'.*expects.*(tensor\(double\)|element type 11)"),
                         (np.ones((3, 2)), r"input 's' \(read by the backward only\) has shape \[3, 2\]; "
                                           r"the graph declares \[2, 3\]")):
        with pytest.raises(ortagent.OrtInvalidArgument, match=message):
            driver.forward({**feeds, "s": bad})
        if form == "run_id":
            assert driver.agent.runs_in_flight == 0
    gradient = np.random.default_rng(3).standard_normal((2, 3))
    outputs, results = driver.run(feeds, [gradient])
    np.testing.assert_allclose(results[0], case.reference_gradients(feeds, [gradient])[0], **F64)
