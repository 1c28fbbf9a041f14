"""Real ORTModule training graphs on ortagent's TrainingAgent against onnxruntime-training 1.19.2's own agent.

Every entry of ``ortmodule_zoo`` is turned into the training graph ORTModule 1.19.2 would run
(its C++ graph builder, in the reference environment; cached under .cache/ortmodule_graphs), run
by the real 1.19.2 TrainingAgent (forward outputs and every gradient, random output gradients),
and by ortagent's ``TrainingAgent`` in each of its API forms (run-id API and the two state-API
constructors, see ``agent_driver.FORMS``). ortagent lowers the training-only com.microsoft ops
(ReluGrad, ConvGrad, ...) to standard ONNX ops itself (``ortagent.training_ops``).

Tolerances by the entry's class: rtol 1e-5 / atol 1e-6, conv 1e-4 / 1e-5. Dropout draws its masks
from each runtime's own RNG, so the dropout entry is compared with ratio 0 (exactly comparable),
and with ratio 0.5 by the mask's keep rate and by checking forward and gradients against the
run's own mask -- on both runtimes. Entries the real agent cannot run (ATen needs torch; 1.19.2's
CPU AveragePoolGrad is broken) are checked against their NumPy references, or, where the entry
names a ``reference_equivalent`` (ATen pooling), against the real agent running that equivalent
graph of plain ONNX ops (same parameters, feeds and output gradients); a test records that the
real agent still fails on them.

The first run builds the graphs (about 1 s each) and runs the reference agent (about 0.5 s per
run); both are cached, so later runs take a few seconds.
"""

from __future__ import annotations

import functools
import hashlib
import os

import numpy as np
import pytest

import agent_driver as ad
import ortmodule_zoo as zoo
from ortagent_testkit.reference_agent.client import (
    GRAPH_CACHE,
    SCRIPT,
    ReferenceAgentError,
    build_ortmodule_training_graph,
    reference_python,
    run_reference_agent,
)

pytestmark = pytest.mark.skipif(
    reference_python() is None,
    reason="no onnxruntime-training 1.19.2 environment to build ORTModule graphs and run its agent: "
           "set ORTAGENT_REF_AGENT_PYTHON or run `make refagent` (.venv-refagent with "
           "onnxruntime-training-cpu==1.19.2, numpy<2, onnx)",
)

ENTRIES = {entry.name: entry for entry in zoo.zoo()}
COMPARED = [name for name, entry in ENTRIES.items() if entry.reference_broken is None]
NUMPY_CHECKED = [name for name, entry in ENTRIES.items() if entry.numpy_reference is not None]
EQUIVALENT_CHECKED = [name for name, entry in ENTRIES.items() if entry.reference_equivalent is not None]
DROPOUT = [name for name, entry in ENTRIES.items() if entry.dropout_ratio_input is not None]
SEED = 0


def _digest(*parts) -> str:
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, np.ndarray):
            part = str((part.dtype.str, part.shape)).encode() + np.ascontiguousarray(part).tobytes()
        elif isinstance(part, str):
            part = part.encode()
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def cached_reference(graph, feeds: list, grads: list | None):
    """run_reference_agent, memoized on disk by the graph, the arrays and the runner script."""
    with open(SCRIPT, "rb") as handle:
        script = handle.read()
    key = _digest(graph.SerializeToString(), script, "grads" if grads is not None else "forward-only",
                  *feeds, *(grads or []))
    path = os.path.join(GRAPH_CACHE, f"reference-{key}.npz")
    if os.path.exists(path):
        with np.load(path) as archive:
            forward = [archive[k] for k in sorted(k for k in archive.files if k.startswith("f"))]
            backward = [archive[k] for k in sorted(k for k in archive.files if k.startswith("b"))]
        return forward, backward
    forward, backward = run_reference_agent(graph, feeds, grads)
    os.makedirs(GRAPH_CACHE, exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp.npz"
    arrays = {f"f{i:04d}": a for i, a in enumerate(forward)}
    arrays.update({f"b{i:04d}": a for i, a in enumerate(backward)})
    np.savez(partial, **arrays)
    os.replace(partial, path)
    return forward, backward


@functools.lru_cache(maxsize=None)
def training_graph(name: str):
    entry = ENTRIES[name]
    return build_ortmodule_training_graph(entry.model, **entry.build_kwargs())


class Case:
    """One entry's graph, feeds, output gradients and the reference results (the real agent's,
    or the entry's NumPy reference where the real agent cannot run the graph)."""

    def __init__(self, name: str, ratio: float | None = None):
        self.entry = ENTRIES[name]
        self.graph = training_graph(name)
        self.names = ad.graph_names(self.graph)
        rng = np.random.default_rng(SEED)
        overrides = {}
        if ratio is not None:
            overrides[self.entry.dropout_ratio_input] = np.array(ratio, np.float32)
        self.feeds = self.entry.feeds_for(self.graph, rng, **overrides)
        feed_list = [self.feeds[n] for n in self.names.inputs]
        if self.entry.reference_broken is None:
            forward, _ = cached_reference(self.graph, feed_list, None)
            self.grads = zoo.output_gradients(self.graph, forward, rng)
            self.ref_outputs, self.ref_gradients = cached_reference(self.graph, feed_list, self.grads)
        elif self.entry.reference_equivalent is not None:
            # the real agent runs the equivalent plain-ONNX graph: same inputs, outputs and gradients
            twin = ENTRIES[self.entry.reference_equivalent]
            twin_graph = training_graph(twin.name)
            twin_names = ad.graph_names(twin_graph)
            assert (twin_names.inputs, twin_names.module_outputs, twin_names.outputs) == \
                (self.names.inputs, self.names.module_outputs, self.names.outputs), twin.name
            twin_params, params = twin.parameter_values(), self.entry.parameter_values()
            assert twin_params.keys() == params.keys()
            assert all(np.array_equal(twin_params[k], params[k]) for k in params), f"{twin.name}: other parameters"
            forward, _ = cached_reference(twin_graph, feed_list, None)
            self.grads = zoo.output_gradients(self.graph, forward, rng)
            self.ref_outputs, self.ref_gradients = cached_reference(twin_graph, feed_list, self.grads)
        else:
            forward, _ = self.entry.numpy_reference(self.feeds, None)
            self.grads = zoo.output_gradients(self.graph, [np.asarray(o, np.float32) for o in forward], rng)
            self.ref_outputs, self.ref_gradients = self.entry.numpy_reference(self.feeds, self.grads)

    def run_ortagent(self, form: str, runs: int = 1):
        """(outputs, gradients) of one agent in ``form``; with ``runs`` > 1 a list of them, all
        from the same agent."""
        driver = ad.Driver.for_model(self.graph, form)
        results = [driver.run(self.feeds, self.grads) for _ in range(runs)]
        return results[0] if runs == 1 else results


@functools.lru_cache(maxsize=None)
def case(name: str, ratio: float | None = None) -> Case:
    return Case(name, ratio)


def assert_all_close(names, ours, theirs, rtol, atol, what):
    assert len(ours) == len(theirs), f"{what}: {len(ours)} values, the reference has {len(theirs)}"
    for name, mine, ref in zip(names, ours, theirs):
        mine, ref = np.asarray(mine), np.asarray(ref)
        assert mine.shape == ref.shape, f"{what} {name}: shape {mine.shape}, reference {ref.shape}"
        if mine.dtype.kind in "fc":
            np.testing.assert_allclose(mine, ref, rtol=rtol, atol=atol, err_msg=f"{what} {name}")
        else:
            assert mine.dtype == ref.dtype, f"{what} {name}: dtype {mine.dtype}, reference {ref.dtype}"
            np.testing.assert_array_equal(mine, ref, err_msg=f"{what} {name}")


@pytest.mark.parametrize("form", ad.FORMS)
@pytest.mark.parametrize("name", COMPARED)
def test_matches_reference_agent(name, form):
    """Forward outputs and every gradient agree with the real 1.19.2 agent (dropout: ratio 0)."""
    entry = ENTRIES[name]
    this = case(name, 0.0 if entry.dropout_ratio_input else None)
    outputs, gradients = this.run_ortagent(form)
    for value, ref in zip(outputs, this.ref_outputs):
        assert np.asarray(value).dtype == np.asarray(ref).dtype
    assert_all_close(this.names.module_outputs, outputs, this.ref_outputs, entry.rtol, entry.atol, "output")
    assert_all_close(this.names.outputs, gradients, this.ref_gradients, entry.rtol, entry.atol, "gradient")


@pytest.mark.parametrize("form", ad.FORMS)
@pytest.mark.parametrize("name", NUMPY_CHECKED)
def test_matches_numpy_reference(name, form):
    """Entries the real agent cannot run: ortagent against the entry's float64 NumPy reference."""
    this = case(name)
    outputs, gradients = this.run_ortagent(form)
    assert_all_close(this.names.module_outputs, outputs, this.ref_outputs, 1e-4, 1e-5, "output")
    assert_all_close(this.names.outputs, gradients, this.ref_gradients, 1e-4, 1e-5, "gradient")


@pytest.mark.parametrize("form", ad.FORMS)
@pytest.mark.parametrize("name", EQUIVALENT_CHECKED)
def test_matches_equivalent_graph_on_reference_agent(name, form):
    """Entries the real agent cannot run (ATen pooling): ortagent on the entry's graph against the
    real 1.19.2 agent on the equivalent graph of plain ONNX ops (MaxPool, AveragePool,
    GlobalAveragePool with the same parameters), same feeds and output gradients."""
    this = case(name)
    outputs, gradients = this.run_ortagent(form)
    assert_all_close(this.names.module_outputs, outputs, this.ref_outputs, 1e-4, 1e-5, "output")
    assert_all_close(this.names.outputs, gradients, this.ref_gradients, 1e-4, 1e-5, "gradient")


@pytest.mark.parametrize("name", NUMPY_CHECKED + EQUIVALENT_CHECKED)
def test_reference_agent_still_cannot_run(name):
    """Records why these entries are checked against NumPy or an equivalent graph: the real agent
    fails (or returns a wrongly shaped gradient) on them. When this starts passing, compare with it
    instead."""
    this = case(name)
    feed_list = [this.feeds[n] for n in this.names.inputs]
    try:
        _, gradients = run_reference_agent(this.graph, feed_list, this.grads)
    except ReferenceAgentError:
        return
    shapes = [np.shape(g) for g in gradients]
    expected = [np.shape(g) for g in this.ref_gradients]
    assert shapes != expected, f"the reference agent now runs {name}: {ENTRIES[name].reference_broken} is stale"


# --- dropout ----------------------------------------------------------------------------------------------

RATIO = 0.5


def _dropout_expectations(entry: zoo.ZooEntry, feeds: dict, grads: list, mask: np.ndarray, ratio: float):
    """(y, {gradient name: value}) of the dropout entry computed from a given mask, in float64:
    h = x @ w1, dropped = mask * h / (1 - r), y = dropped @ w2."""
    params = entry.parameter_values()
    x = feeds["x"].astype(np.float64)
    w1 = params["fc1.weight"].astype(np.float64)
    w2 = params["fc2.weight"].astype(np.float64)
    dy = grads[0].astype(np.float64)
    keep = mask.astype(np.float64) / (1.0 - ratio)
    dropped = (x @ w1) * keep
    d_h = (dy @ w2.T) * keep
    return dropped @ w2, {"x_grad": d_h @ w1.T, "fc1.weight_grad": x.T @ d_h, "fc2.weight_grad": dropped.T @ dy}


def _check_dropout_run(entry, names, feeds, grads, outputs, gradients, who):
    y, mask = outputs
    assert mask.dtype == np.bool_ and mask.shape == (feeds["x"].shape[0], 32), who
    keep_rate = mask.mean()
    # 256 Bernoulli(0.5) draws: the standard deviation of the rate is 0.031; 0.2 is 6 sigma
    assert abs(keep_rate - (1 - RATIO)) < 0.2, f"{who}: keep rate {keep_rate}"
    expected_y, expected_grads = _dropout_expectations(entry, feeds, grads, mask, RATIO)
    np.testing.assert_allclose(y, expected_y, rtol=1e-4, atol=1e-5, err_msg=f"{who}: y from its own mask")
    for name, value in zip(names.outputs, gradients):
        np.testing.assert_allclose(value, expected_grads[name], rtol=1e-4, atol=1e-5,
                                   err_msg=f"{who}: {name} from its own mask")


@pytest.mark.parametrize("name", DROPOUT)
def test_dropout_reference_agent_semantics(name):
    """The checks ortagent's dropout runs get, made on the real agent: they hold there."""
    this = case(name, RATIO)
    _check_dropout_run(this.entry, this.names, this.feeds, this.grads, this.ref_outputs, this.ref_gradients,
                       "reference agent")


@pytest.mark.parametrize("form", ad.FORMS)
@pytest.mark.parametrize("name", DROPOUT)
def test_dropout_masks_and_gradients(name, form):
    """Ratio 0.5: ortagent's mask keeps about half, and its forward output and gradients are
    those of its own mask (mask * dy / (1 - r)); two runs of one agent draw different masks."""
    this = case(name, RATIO)
    (outputs, gradients), (again, again_gradients) = this.run_ortagent(form, runs=2)
    _check_dropout_run(this.entry, this.names, this.feeds, this.grads, outputs, gradients, f"ortagent {form}")
    _check_dropout_run(this.entry, this.names, this.feeds, this.grads, again, again_gradients,
                       f"ortagent {form}, second run")
    assert not np.array_equal(outputs[1], again[1]), "two runs of one agent drew the same dropout mask"


def test_zoo_draws_out_training_ops():
    """The graphs contain what the zoo is for: the training-only ops each entry was written to
    draw out (a change in the builder or the zoo shows up here)."""
    missing = {}
    for name, entry in ENTRIES.items():
        present = zoo.present_ops(training_graph(name))
        absent = [op for op in entry.wanted_ops if op not in present]
        if absent:
            missing[name] = absent
    assert not missing, f"ops the builder did not emit: {missing}"
