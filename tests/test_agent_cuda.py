"""The TrainingAgent's core checks on the CUDA execution provider.

Marked ``cuda``: conftest skips them, with its reason, where no CUDA EP can be created. Where one
can, both sessions run on ``CUDAExecutionProvider`` and these tests show that gradients still
match NumPy, that the stash stays on the device between forward and backward, that outputs land
on the device asked for (``fw_outputs_device_info`` / ``bw_outputs_device_info`` / bound outputs:
"cuda:0" vs "cpu"), and that runs in flight, threads, memory accounting, forward-output
stability, the GIL and RunOptions behave as on the CPU.

``ORTAGENT_AGENT_CUDA_DRYRUN=1`` runs the same tests on the CPU provider with "cpu" wherever they
would ask for "cuda:0" (no marker, so nothing skips): it checks the tests' own logic on machines
without a GPU; the device placement they prove needs the real run.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

import ortagent
from ortagent_testkit import training_graphs as tg
from agent_driver import FORMS, STATE_FORMS, Driver, graph_names, make_agent, orthogonal, slow_training_graph
from gil_ticks import assert_releases_gil

DRY_RUN = os.environ.get("ORTAGENT_AGENT_CUDA_DRYRUN") == "1"
if not DRY_RUN:
    pytestmark = pytest.mark.cuda
PROVIDERS = ["CPUExecutionProvider"] if DRY_RUN else ["CUDAExecutionProvider", "CPUExecutionProvider"]
DEVICE = "cpu" if DRY_RUN else "cuda:0"            # where "on the device" means
DEVICE_NAME = "cpu" if DRY_RUN else "cuda"          # what OrtValue.device_name() says there
# float64 everywhere (float32 MatMuls may run in TF32 on the GPU); CUDA kernels reduce in
# another order than NumPy, so not the CPU tests' 1e-12.
TOLERANCE = dict(rtol=1e-9, atol=1e-11)

CASES = [tg.mul_add_case, tg.mlp_case, tg.multi_output_case, tg.repeated_output_case, tg.no_gradient_path_case,
         tg.constants_both_sides_case, tg.backward_only_input_case, tg.passthrough_outputs_case,
         tg.control_flow_case]


def cuda_driver(case: tg.TrainingCase, form: str, fw_device: str = "cpu", bw_device: str = "cpu",
                as_values: bool = True) -> Driver:
    """A Driver on the CUDA EP with forward outputs on `fw_device` and gradients on `bw_device`
    (run-id API: every graph output bound to `bw_device`)."""
    agent = make_agent(case.model, form, fw_device=fw_device, bw_device=bw_device, providers=PROVIDERS)
    names = graph_names(case.model)
    bind = {name: bw_device for name in names.outputs} if form == "run_id" else None
    return Driver(agent, form, names, as_values, bind)


def _state(driver: Driver, run):
    """The PartialGraphExecutionState of a run (the run-id API keeps it inside the agent)."""
    return driver.agent._runs[run.handle] if driver.form == "run_id" else run.handle


def _check_against_numpy(case, feeds, gradients, outputs, results):
    for name, got, want in zip(case.module_output_names, outputs, case.reference(feeds)):
        assert got.shape == np.shape(want), name
        if got.dtype.kind == "f":
            np.testing.assert_allclose(got, want, **TOLERANCE, err_msg=f"forward {name}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"forward {name}")
    for name, got, want in zip(case.graph_output_names, results, case.reference_gradients(feeds, gradients)):
        assert got.shape == np.shape(want), name
        np.testing.assert_allclose(got, want, **TOLERANCE, err_msg=f"backward {name}")


def test_agent_sessions_run_on_cuda():
    driver = cuda_driver(tg.mlp_case(), "run_id")
    assert driver.agent.get_providers()[0] == PROVIDERS[0]
    assert driver.agent.forward_session.get_providers()[0] == PROVIDERS[0]
    assert driver.agent.backward_session.get_providers()[0] == PROVIDERS[0]


@pytest.mark.parametrize("placement", ["host", "device"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("builder", CASES, ids=[b.__name__ for b in CASES])
def test_gradients_on_cuda_match_numpy_and_land_where_asked(builder, form, placement):
    case = builder()
    target = "cpu" if placement == "host" else DEVICE
    driver = cuda_driver(case, form, fw_device=target, bw_device=target)
    rng = np.random.default_rng(0)
    feeds = case.make_feeds(rng)
    run = driver.forward(feeds)
    if form != "run_id":        # the run-id API leaves module outputs where onnxruntime makes them
        expected_fw = "cpu" if target == "cpu" else DEVICE_NAME
        assert [value.device_name() for value in run.outputs] == [expected_fw] * len(run.outputs)
    # the stash stays where onnxruntime produced it (whatever the caller asked for its outputs)
    planned = [d.name for d in driver.agent._engine.forward_output_devices[len(case.module_output_names):]]
    assert _state(driver, run).stash_devices == planned, "the stash moved"
    assert set(planned) <= {DEVICE_NAME}, f"ops of {case.name} ran off the device: {planned}"
    outputs = run.numpy_outputs()
    gradients = case.make_gradients(rng, outputs)
    values = driver.backward_values(run, gradients)
    expected_bw = "cpu" if target == "cpu" else DEVICE_NAME
    assert [value.device_name() for value in values] == [expected_bw] * len(values)
    _check_against_numpy(case, feeds, gradients, outputs, [value.numpy() for value in values])


@pytest.mark.parametrize("form", STATE_FORMS)
def test_mixed_output_devices(form):
    """One module output on the device, the other on the host; gradients split likewise."""
    case = tg.mlp_case()
    names = graph_names(case.model)
    fw = [DEVICE, "cpu"]
    bw = ["cpu", DEVICE, "cpu", DEVICE]
    if form == "state7":
        agent = ortagent.TrainingAgent(case.model.SerializeToString(), names.inputs, names.module_outputs, fw,
                                       names.gradients, names.outputs, bw, providers=PROVIDERS)
    else:
        agent = ortagent.TrainingAgent(case.model.SerializeToString(), fw_feed_names=names.inputs,
                                       fw_outputs_device_info=fw, bw_fetches_names=names.outputs,
                                       bw_outputs_device_info=bw, providers=PROVIDERS)
    driver = Driver(agent, form, names)
    rng = np.random.default_rng(1)
    feeds = case.make_feeds(rng)
    run = driver.forward(feeds)
    assert [v.device_name() for v in run.outputs] == [DEVICE_NAME, "cpu"]
    outputs = run.numpy_outputs()
    gradients = case.make_gradients(rng, outputs)
    values = driver.backward_values(run, gradients)
    assert [v.device_name() for v in values] == [DEVICE_NAME if d != "cpu" else "cpu" for d in bw]
    _check_against_numpy(case, feeds, gradients, outputs, [v.numpy() for v in values])


@pytest.mark.parametrize("form", FORMS)
def test_device_feeds_and_device_gradients(form):
    """Inputs and output gradients already on the device go in without a host copy."""
    case = tg.mlp_case()
    driver = cuda_driver(case, form, fw_device=DEVICE, bw_device=DEVICE)
    rng = np.random.default_rng(2)
    feeds = case.make_feeds(rng)
    on_device = {name: ortagent.OrtValue.ortvalue_from_numpy(value, *DEVICE.split(":")[:1],
                                                             int(DEVICE.partition(":")[2] or 0))
                 for name, value in feeds.items()}
    assert all(value.device_name() == DEVICE_NAME for value in on_device.values())
    if form == "run_id":
        binding = driver.new_binding()
        for name, value in on_device.items():
            binding.bind_ortvalue_input(name, value)
        outputs, run_id = driver.agent.run_forward(binding, None)
    else:
        state = ortagent.PartialGraphExecutionState()
        outputs = []
        driver.agent.run_forward([on_device[name] for name in case.input_names], outputs, state)
    host_outputs = [value.numpy() for value in outputs]
    gradients = case.make_gradients(rng, host_outputs)
    device_grads = [ortagent.OrtValue.ortvalue_from_numpy(g, *DEVICE.split(":")[:1], int(DEVICE.partition(":")[2] or 0))
                    for g in gradients]
    if form == "run_id":
        driver.agent.run_backward(device_grads, run_id)
        results = binding.get_outputs()
    else:
        results = []
        driver.agent.run_backward(device_grads, results, state)
    _check_against_numpy(case, feeds, gradients, host_outputs, [value.numpy() for value in results])


@pytest.mark.parametrize("order", ["reverse", "random"])
@pytest.mark.parametrize("form", FORMS)
def test_twenty_runs_in_flight_on_cuda(form, order):
    case = tg.mlp_case()
    driver = cuda_driver(case, form, fw_device=DEVICE, bw_device=DEVICE)
    rng = np.random.default_rng(3)
    feeds = [case.make_feeds(rng) for _ in range(20)]
    gradients = [case.make_gradients(rng, case.reference(f)) for f in feeds]
    alone = [driver.run(f, g) for f, g in zip(feeds, gradients)]
    runs = [driver.forward(f) for f in feeds]
    for run in runs:
        assert _state(driver, run).stash_devices == [DEVICE_NAME] * 2
    indices = list(range(20))[::-1] if order == "reverse" else list(np.random.default_rng(4).permutation(20))
    for i in indices:
        results = driver.backward(runs[i], gradients[i])
        for got, want in zip(results, alone[i][1]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
        _check_against_numpy(case, feeds[i], gradients[i], runs[i].numpy_outputs(), results)
    if form == "run_id":
        assert driver.agent.runs_in_flight == 0


@pytest.mark.parametrize("form", ["state7", "run_id"])
def test_threads_on_cuda(form):
    case = tg.mlp_case()
    driver = cuda_driver(case, form, fw_device=DEVICE, bw_device="cpu")
    rng = np.random.default_rng(5)
    feeds = [case.make_feeds(rng) for _ in range(12)]
    gradients = [case.make_gradients(rng, case.reference(f)) for f in feeds]
    alone = [driver.run(f, g) for f, g in zip(feeds, gradients)]
    results: dict = {}
    failures: list = []

    def work(mine):
        try:
            runs = {i: driver.forward(feeds[i]) for i in mine}
            for i in reversed(mine):
                results[i] = driver.backward(runs[i], gradients[i])
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(list(range(k, 12, 3)),)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    for i in range(12):
        for got, want in zip(results[i], alone[i][1]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def _live(kind: str) -> int:
    gc.collect()
    return ortagent.live_handles()[kind]


@pytest.mark.parametrize("form", STATE_FORMS)
def test_stash_on_device_is_released(form, no_leaks):
    case = tg.mlp_case()
    driver = cuda_driver(case, form, fw_device=DEVICE, bw_device=DEVICE, as_values=False)
    rng = np.random.default_rng(6)
    feeds = case.make_feeds(rng)
    gradients = case.make_gradients(rng, case.reference(feeds))
    values = _live("value")
    run = driver.forward(feeds)
    assert run.handle.stash_devices == [DEVICE_NAME, DEVICE_NAME]
    assert _live("value") - values == 4
    del run.outputs
    results = driver.backward_values(run, gradients)
    assert run.handle.stash_devices == []
    assert _live("value") - values == len(results)
    del results
    run = driver.forward(feeds)
    del run
    assert _live("value") == values


def test_close_releases_pending_device_runs(no_leaks):
    case = tg.mlp_case()
    driver = cuda_driver(case, "run_id", bw_device=DEVICE, as_values=False)
    feeds = case.make_feeds(np.random.default_rng(7))
    values, states = _live("value"), _live("run_state")
    for _ in range(3):
        driver.forward(feeds)
    assert driver.agent.runs_in_flight == 3 and _live("run_state") - states == 3
    driver.agent.close()
    assert driver.agent.runs_in_flight == 0
    assert _live("value") == values and _live("run_state") == states


@pytest.mark.parametrize("form", FORMS)
def test_device_forward_outputs_stay_valid_after_backward(form):
    case = tg.multi_output_case()             # the backward reads module output a
    driver = cuda_driver(case, form, fw_device=DEVICE, bw_device=DEVICE)
    rng = np.random.default_rng(8)
    feeds = [case.make_feeds(rng) for _ in range(4)]
    gradients = [case.make_gradients(rng, case.reference(f)) for f in feeds]
    run = driver.forward(feeds[0])
    before = run.numpy_outputs()
    driver.backward(run, gradients[0])
    for f, g in zip(feeds[1:], gradients[1:]):
        driver.run(f, g)
    after = run.numpy_outputs()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, after))


def test_host_agent_refuses_device_outputs_even_where_cuda_exists():
    """The check is about the agent's own providers, not what the build offers."""
    case = tg.mul_add_case()
    with pytest.raises(ortagent.OrtInvalidArgument, match="needs the CUDAExecutionProvider"):
        ortagent.TrainingAgent(case.model.SerializeToString(), fw_feed_names=case.input_names,
                               fw_outputs_device_info=["cuda:0"], bw_fetches_names=case.graph_output_names,
                               bw_outputs_device_info=["cpu"] * 3, providers=["CPUExecutionProvider"])


# -- GIL and RunOptions on the device ----------------------------------------------------------

SIZE = 512


def _calibrated_trips(driver, x, w, target_s=0.15):
    per_trip = np.inf
    for trips in (50, 200):
        start = time.perf_counter()
        driver.forward({"x": x, "w": w, "trips": np.array(trips, np.int64)})
        per_trip = min(per_trip, (time.perf_counter() - start) / trips)
    return np.array(int(np.clip(target_s / per_trip, 50, 200000)), np.int64)


def test_gil_is_released_on_cuda():
    model, _ = slow_training_graph(SIZE)
    driver = Driver(make_agent(model, "run_id", providers=PROVIDERS), "run_id", graph_names(model), False,
                    {"x_grad": DEVICE})
    x, w = orthogonal(SIZE, 9), orthogonal(SIZE, 10)
    trips = _calibrated_trips(driver, x, w)
    runs, backwards = [], []
    assert_releases_gil(lambda: runs.append(driver.forward({"x": x, "w": w, "trips": trips})), "forward")
    assert_releases_gil(lambda: backwards.append(driver.backward(runs[0], [np.eye(SIZE, dtype=np.float32)])),
                        "backward")
    (results,) = backwards
    # float32 MatMuls may run in TF32 on the GPU and thousands of them drift: no value check here
    assert results[0].shape == (SIZE, SIZE) and np.isfinite(results[0]).all()


def test_terminate_on_cuda():
    model, _ = slow_training_graph(SIZE)
    agent = make_agent(model, "run_id", providers=PROVIDERS)
    binding = agent.io_binding()
    binding.bind_cpu_input("x", orthogonal(SIZE, 11))
    binding.bind_cpu_input("w", orthogonal(SIZE, 12))
    binding.bind_cpu_input("trips", np.array(10**9, np.int64))
    options = ortagent.RunOptions()
    timer = threading.Timer(0.3, lambda: setattr(options, "terminate", True))
    timer.start()
    with pytest.raises(ortagent.OrtError, match="terminate"):
        agent.run_forward(binding, options)
    timer.join()
    assert agent.runs_in_flight == 0
    options.terminate = False
    binding.bind_cpu_input("trips", np.array(2, np.int64))
    outputs, run_id = agent.run_forward(binding, options)
    agent.run_backward([np.eye(SIZE, dtype=np.float32)], run_id)
    assert binding.get_outputs()[0].shape() == [SIZE, SIZE]
