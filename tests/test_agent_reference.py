"""ortagent's TrainingAgent against onnxruntime-training 1.19.2's own TrainingAgent.

The real agent runs in its own environment through ``ortagent_testkit/reference_agent/client.py`` (these tests
skip, saying why, when there is none). Same graph, same feeds, same output gradients, same
graph optimization level on both sides; the forward outputs and every gradient must be
bit-identical, through each of ortagent's constructor forms. The tolerance policy is the one of
test_reference_split.py (FINDINGS.md): double-precision Tanh and Sigmoid kernels changed between
1.19.2 and 1.31 (a few ulp in a plain InferenceSession too), so graphs of doubles that use them
are compared with rtol 1e-13; and 1.19.2 has no double FusedMatMul, so double graphs run at the
'basic' level on both sides.

Our forward outputs are read *after* the backward: 1.19.2's own are overwritten by then (its
runner copies them right after the forward), ours must still hold the forward's values.
"""

from __future__ import annotations

import numpy as np
import pytest

import ortagent
from ortagent_testkit import training_graphs as tg
from agent_driver import FORMS, Driver
from ortagent_testkit.reference_agent.client import reference_python, run_reference_agent

pytestmark = pytest.mark.skipif(
    reference_python() is None,
    reason="no onnxruntime-training 1.19.2 environment: set ORTAGENT_REF_AGENT_PYTHON or create "
           ".venv-refagent (make refagent, or python3 -m venv .venv-refagent && .venv-refagent/bin/pip "
           "install onnxruntime-training-cpu==1.19.2 'numpy<2' onnx)",
)

COMPARABLE = tg.REFERENCE_COMPARABLE
KERNELS_CHANGED_SINCE_1192 = tg.KERNELS_CHANGED_SINCE_1192
DTYPES = [pytest.param(np.float32, id="float32"), pytest.param(np.float64, id="float64")]


def _levels(dtype):
    """(the reference's level name, ortagent session options) for a graph of `dtype`."""
    options = ortagent.SessionOptions()
    if np.dtype(dtype) == np.float64:
        options.graph_optimization_level = ortagent.GraphOptimizationLevel.ORT_ENABLE_BASIC
        return "basic", options
    options.graph_optimization_level = ortagent.GraphOptimizationLevel.ORT_ENABLE_ALL
    return "all", options


def compare_with_reference_agent(case: tg.TrainingCase, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = case.make_feeds(rng)
    gradients = case.make_gradients(rng, case.reference(feeds))
    level, options = _levels(case.dtype)
    ref_outputs, ref_results = run_reference_agent(
        case.model, [feeds[name] for name in case.input_names], gradients, optimization_level=level)
    assert len(ref_outputs) == len(case.module_output_names)
    assert len(ref_results) == len(case.graph_output_names)
    ops = {node.op_type for node in case.model.graph.node}
    exact = not (case.dtype == np.float64 and ops & KERNELS_CHANGED_SINCE_1192)
    for form in FORMS:
        driver = Driver.for_model(case.model, form, session_options=options)
        run = driver.forward(feeds)
        results = driver.backward(run, gradients)
        outputs = run.numpy_outputs()              # after the backward
        pairs = list(zip(["forward " + n for n in case.module_output_names], outputs, ref_outputs))
        pairs += list(zip(["backward " + n for n in case.graph_output_names], results, ref_results))
        for name, ours, theirs in pairs:
            where = f"{case.name} {form}: {name}"
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
            if exact or ours.dtype.kind != "f":
                assert ours.tobytes() == theirs.tobytes(), f"{where}: not bit-identical"
            else:
                np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-15, err_msg=where)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("builder", COMPARABLE, ids=[b.__name__ for b in COMPARABLE])
def test_hand_built_graphs_agree_with_1192_agent(builder, dtype):
    compare_with_reference_agent(builder(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_family_graphs_agree_with_1192_agent(seed, dtype):
    compare_with_reference_agent(tg.random_case(seed, dtype), seed)


def test_scalar_gradient_for_full_shape_output_1192_accepts_ours_refuses():
    """1.19.2 takes a scalar gradient for a full-shape output and returns wrongly shaped
    gradients (x_grad [3] instead of [2, 3]); ortagent refuses it before running."""
    case = tg.mul_add_case(np.float32)
    feeds = case.make_feeds(np.random.default_rng(1))
    scalar = np.asarray(1.0, np.float32)
    _, ref_results = run_reference_agent(case.model, [feeds[n] for n in case.input_names], [scalar])
    assert ref_results[0].shape != feeds["x"].shape          # their x_grad: silently wrong
    driver = Driver.for_model(case.model, "kw1192")
    run = driver.forward(feeds)
    with pytest.raises(ortagent.OrtInvalidArgument, match=r"must have the output's full shape \[2, 3\], got \[\]"):
        driver.backward(run, [scalar])
    full = np.ones((2, 3), np.float32)
    _, ref_full = run_reference_agent(case.model, [feeds[n] for n in case.input_names], [full])
    results = driver.backward(run, [full])                    # the run is still resumable
    assert all(ours.tobytes() == theirs.tobytes() for ours, theirs in zip(results, ref_full))
