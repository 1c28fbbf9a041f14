"""The split halves on stock onnxruntime against onnxruntime-training 1.19.2's real TrainingAgent.

The real agent runs in its own environment (see ``ortagent_testkit/reference_agent/client.py``); these tests skip
when there is none. Both sides use the same graph optimization level, so the same kernels run and
the results must be bit-identical -- except double-precision Tanh and Sigmoid, whose CPU kernels
changed between 1.19.2 and 1.31 (up to a few ulp on their own, in a plain InferenceSession too).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ortagent_testkit import training_graphs as tg
from ortagent.graph_split import split_training_graph
from ortagent_testkit.reference_agent.client import ReferenceAgentError, reference_python, run_reference_agent

pytestmark = pytest.mark.skipif(
    reference_python() is None,
    reason="no onnxruntime-training 1.19.2 environment: set ORTAGENT_REF_AGENT_PYTHON or create "
           ".venv-refagent (python3 -m venv .venv-refagent && .venv-refagent/bin/pip install "
           "onnxruntime-training-cpu==1.19.2 'numpy<2' onnx)",
)

COMPARABLE = tg.REFERENCE_COMPARABLE
KERNELS_CHANGED_SINCE_1192 = tg.KERNELS_CHANGED_SINCE_1192


def _levels(dtype):
    """(reference level name, our level): 1.19.2 has no double FusedMatMul, so doubles run 'basic'."""
    if np.dtype(dtype) == np.float64:
        return "basic", ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return "all", ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def compare_with_reference(case: tg.TrainingCase, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = case.make_feeds(rng)
    reference_level, our_level = _levels(case.dtype)
    split = split_training_graph(case.model)
    runner = tg.SplitRunner(split, our_level, keep_precision=False)
    outputs, stash = runner.run_forward(feeds)
    gradients = case.make_gradients(rng, outputs)
    results = runner.run_backward(feeds, gradients, stash)
    ref_outputs, ref_results = run_reference_agent(
        case.model, [feeds[name] for name in case.input_names], gradients, optimization_level=reference_level)

    ops = {node.op_type for node in case.model.graph.node}
    exact = not (case.dtype == np.float64 and ops & KERNELS_CHANGED_SINCE_1192)
    pairs = list(zip(["forward " + n for n in case.module_output_names], outputs, ref_outputs))
    pairs += list(zip(["backward " + n for n in case.graph_output_names], results, ref_results))
    assert len(ref_outputs) == len(outputs) and len(ref_results) == len(results)
    for name, ours, theirs in pairs:
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, name
        if exact or ours.dtype.kind != "f":
            assert ours.tobytes() == theirs.tobytes(), f"{name}: not bit-identical"
        else:
            np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("builder", COMPARABLE, ids=[b.__name__ for b in COMPARABLE])
def test_hand_built_graphs_match_reference_agent(builder, dtype):
    compare_with_reference(builder(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("seed", range(6))
def test_random_family_matches_reference_agent(seed, dtype):
    compare_with_reference(tg.random_case(seed, dtype), seed)


@pytest.mark.parametrize("builder,error", [
    # graph outputs not computed after the YieldOp (a forward value, a graph input, a YieldOp output,
    # a zero gradient): the backward fetch fails in ExecutionFrame::UpdateFetches
    (tg.no_gradient_path_case, r"IsAllocated\(\) was false"),
    (tg.passthrough_outputs_case, r"IsAllocated\(\) was false"),
    # a subgraph after the YieldOp that reads a YieldOp output: the session aborts while loading
    (tg.control_flow_case, r"signal SIGABRT"),
])
def test_reference_agent_limitations(builder, error):
    """Graphs our split runs (see test_graph_split) but the real 1.19.2 agent cannot."""
    case = builder(np.float32)
    rng = np.random.default_rng(0)
    feeds = case.make_feeds(rng)
    outputs, _ = tg.SplitRunner(split_training_graph(case.model)).run_forward(feeds)
    with pytest.raises(ReferenceAgentError, match=error):
        run_reference_agent(case.model, [feeds[n] for n in case.input_names], case.make_gradients(rng, outputs))
