"""ortagent's CPU training kernels (include/ortagent/cpu_kernels.h, domain ``ai.ortagent.cpu``).

Each operator is run alone in a session (SessionOptions.add_cpu_training_kernels) and compared
with a float64 evaluation of its formula and with torch (the autograd of ``layer_norm``,
training-mode ``batch_norm``, ``gelu``, ``softmax``, ``relu``, ``hardswish`` and ``hardsigmoid``;
``batch_norm``'s forward, ``softmax`` of -inf-masked scores), over shapes drawn by
hypothesis and the edge cases (one row, one column, empty batches, outputs left unnamed,
several threads); bad input gives a typed ortagent error. Then
the training graphs: ``build_training_graph(cpu_kernels=True)`` uses them only where it may, and
its gradients agree with the standard graph's; ORTModule uses them on the CPU provider by default
and its gradients agree with eager's either way.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from ortagent import OrtFail, OrtInvalidArgument, OrtInvalidGraph, OrtRuntimeException, SessionOptions
from ortagent._core import CPU_TRAINING_KERNELS_DOMAIN, InferenceSession

torch = pytest.importorskip("torch")

DOMAIN = CPU_TRAINING_KERNELS_DOMAIN
CPU = ["CPUExecutionProvider"]


def _kernel_model(op_type: str, inputs: dict[str, list | None], outputs=("dx", "dscale", "dbias"),
                  element_type=TensorProto.FLOAT, **attrs) -> bytes:
    """One node of the domain; input shapes as given (None: every dimension unknown)."""
    node = helper.make_node(op_type, list(inputs), list(outputs), domain=DOMAIN, **attrs)
    graph = helper.make_graph(
        [node], op_type,
        [helper.make_tensor_value_info(name, element_type, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, element_type, None) for name in outputs if name])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=9)
    return model.SerializeToString()


def _options(threads: int = 1) -> SessionOptions:
    options = SessionOptions()
    options.intra_op_num_threads = threads
    options.add_cpu_training_kernels()
    return options


def _layer_norm_case(shape, axis, seed):
    """Inputs of LayerNormalizationGrad and torch's gradients (x, weight, bias) for them."""
    rng = np.random.default_rng(seed)
    normalised = list(shape[axis:])
    x = torch.tensor(rng.standard_normal(shape) * 2 + 0.5, dtype=torch.float32, requires_grad=True)
    weight = torch.tensor(rng.standard_normal(normalised), dtype=torch.float32, requires_grad=True)
    bias = torch.tensor(rng.standard_normal(normalised), dtype=torch.float32, requires_grad=True)
    dy = torch.tensor(rng.standard_normal(shape), dtype=torch.float32)
    torch.nn.functional.layer_norm(x, normalised, weight, bias, 1e-5).backward(dy)
    reduced = tuple(range(axis, len(shape)))
    x64 = x.detach().numpy().astype(np.float64)
    mean = x64.mean(axis=reduced, keepdims=True)
    inv_std = 1 / np.sqrt(x64.var(axis=reduced, keepdims=True) + 1e-5)
    feeds = {"dy": dy.numpy(), "x": x.detach().numpy(), "scale": weight.detach().numpy(),
             "mean": mean.astype(np.float32), "inv_std": inv_std.astype(np.float32)}
    return feeds, (x.grad.numpy(), weight.grad.numpy(), bias.grad.numpy())


def _batch_norm_case(shape, epsilon, seed):
    rng = np.random.default_rng(seed)
    channels = shape[1]
    x = torch.tensor(rng.standard_normal(shape) * 3 + 1, dtype=torch.float32, requires_grad=True)
    weight = torch.tensor(rng.standard_normal(channels), dtype=torch.float32, requires_grad=True)
    bias = torch.tensor(rng.standard_normal(channels), dtype=torch.float32, requires_grad=True)
    dy = torch.tensor(rng.standard_normal(shape), dtype=torch.float32)
    torch.nn.functional.batch_norm(x, None, None, weight, bias, True, 0.1, epsilon).backward(dy)
    reduced = tuple(i for i in range(len(shape)) if i != 1)
    x64 = x.detach().numpy().astype(np.float64)
    feeds = {"dy": dy.numpy(), "x": x.detach().numpy(), "scale": weight.detach().numpy(),
             "mean": x64.mean(axis=reduced).astype(np.float32), "var": x64.var(axis=reduced).astype(np.float32)}
    return feeds, (x.grad.numpy(), weight.grad.numpy(), bias.grad.numpy())


def _layer_norm_reference(feeds, axis):
    """The gradients in float64 from the statistics fed (the kernel's own inputs): for a row of
    one element, or of equal ones, torch's are rounding noise of x - mean times 1 / sqrt(eps)."""
    dy, x, scale = (feeds[name].astype(np.float64) for name in ("dy", "x", "scale"))
    mean, inv_std = feeds["mean"].astype(np.float64), feeds["inv_std"].astype(np.float64)
    reduced = tuple(range(axis, x.ndim))
    xhat = (x - mean) * inv_std
    g = dy * scale
    dx = inv_std * (g - g.mean(axis=reduced, keepdims=True) - xhat * (g * xhat).mean(axis=reduced, keepdims=True))
    batch = tuple(range(axis))
    return dx, (dy * xhat).sum(axis=batch), dy.sum(axis=batch)


def _batch_norm_reference(feeds, epsilon):
    dy, x, scale, mean, var = (feeds[name].astype(np.float64) for name in ("dy", "x", "scale", "mean", "var"))
    view = [1, -1] + [1] * (x.ndim - 2)
    reduced = tuple(i for i in range(x.ndim) if i != 1)
    inv_std = 1 / np.sqrt(var + epsilon)
    xhat = (x - mean.reshape(view)) * inv_std.reshape(view)
    dbias, dscale = dy.sum(axis=reduced), (dy * xhat).sum(axis=reduced)
    count = x.size / x.shape[1]
    dx = (scale * inv_std).reshape(view) * (dy - (dbias / count).reshape(view) - xhat * (dscale / count).reshape(view))
    return dx, dscale, dbias


def _assert_gradients(got, expected, what):
    for name, g, e in zip(("dX", "dscale", "dbias"), got, expected):
        scale = max(1.0, float(np.abs(e).max(initial=0.0)))
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-5 * scale, err_msg=f"{what}: {name}")


def _layer_norm_inputs(shape, axis):
    rows = list(shape[:axis]) + [1] * (len(shape) - axis)
    return {"dy": list(shape), "x": list(shape), "scale": list(shape[axis:]), "mean": rows, "inv_std": rows}


def _batch_norm_inputs(shape):
    return {"dy": list(shape), "x": list(shape), "scale": [shape[1]], "mean": [shape[1]], "var": [shape[1]]}


shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, axis_seed=st.integers(0, 10), seed=st.integers(0, 2**16))
@example(shape=[6, 1], axis_seed=1, seed=0)     # rows of one element: dX is 0 (a fused multiply-add was not)
def test_layer_norm_grad_matches_float64(shape, axis_seed, seed):
    axis = axis_seed % len(shape)
    feeds, _ = _layer_norm_case(shape, axis, seed)
    session = InferenceSession(_kernel_model("LayerNormalizationGrad", _layer_norm_inputs(shape, axis), axis=axis),
                               _options(), CPU)
    _assert_gradients(session.run(None, feeds), _layer_norm_reference(feeds, axis), f"{shape} axis {axis}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 9), min_size=2, max_size=5), seed=st.integers(0, 2**16),
       epsilon=st.sampled_from([1e-5, 1e-3, 0.1]))
def test_batch_norm_grad_matches_float64(shape, seed, epsilon):
    assume(np.prod(shape) // shape[1] > 1)      # (torch, making the inputs, refuses one value per channel)
    feeds, _ = _batch_norm_case(shape, epsilon, seed)
    session = InferenceSession(_kernel_model("BatchNormTrainingGrad", _batch_norm_inputs(shape), epsilon=epsilon),
                               _options(), CPU)
    _assert_gradients(session.run(None, feeds), _batch_norm_reference(feeds, epsilon), f"{shape} epsilon {epsilon}")


@pytest.mark.parametrize("shape, axis", [([16, 32, 64], 2), ([8, 197, 192], 2), ([2, 5, 7, 3], 1)])
def test_layer_norm_grad_matches_torch(shape, axis):
    feeds, expected = _layer_norm_case(shape, axis, 11)
    session = InferenceSession(_kernel_model("LayerNormalizationGrad", _layer_norm_inputs(shape, axis), axis=axis),
                               _options(), CPU)
    _assert_gradients(session.run(None, feeds), expected, f"{shape} axis {axis}")


@pytest.mark.parametrize("shape", [[2, 16, 32, 32], [8, 96, 4, 4], [5, 7], [3, 4, 2, 3, 2]])
def test_batch_norm_grad_matches_torch(shape):
    feeds, expected = _batch_norm_case(shape, 1e-5, 11)
    session = InferenceSession(_kernel_model("BatchNormTrainingGrad", _batch_norm_inputs(shape), epsilon=1e-5),
                               _options(), CPU)
    _assert_gradients(session.run(None, feeds), expected, f"{shape}")


@pytest.mark.parametrize("shape, axis", [([16, 32, 64], 2), ([3, 1000], 1), ([600, 33], 1), ([2, 5, 7, 3], 1),
                                         ([1, 1], 1), ([4, 1], 0)])
def test_layer_norm_grad_large_and_degenerate_rows(shape, axis):
    """Rows longer than the 8 floats a loop step takes, with a tail; rows split into several
    work blocks (600 x 33); a negative axis attribute; a single element."""
    feeds, _ = _layer_norm_case(shape, axis, 7)
    expected = _layer_norm_reference(feeds, axis)
    for attribute in (axis, axis - len(shape)):
        session = InferenceSession(_kernel_model("LayerNormalizationGrad", _layer_norm_inputs(shape, axis),
                                                 axis=attribute), _options(), CPU)
        _assert_gradients(session.run(None, feeds), expected, f"{shape} axis {attribute}")


@pytest.mark.parametrize("op_type, case", [("LayerNormalizationGrad", (_layer_norm_case, [1000, 96], 1)),
                                           ("BatchNormTrainingGrad", (_batch_norm_case, [4, 16, 33, 33], 1e-5))])
def test_results_do_not_depend_on_the_thread_count(op_type, case):
    """Work is split over the session's threads from 65536 elements on (these are above), each
    LayerNorm block with partial sums of its own added in block order: one thread and four give
    the same bits."""
    make, shape, parameter = case
    feeds, _ = make(shape, parameter, 3)
    inputs = _layer_norm_inputs(shape, 1) if op_type == "LayerNormalizationGrad" else _batch_norm_inputs(shape)
    attrs = {"axis": 1} if op_type == "LayerNormalizationGrad" else {"epsilon": parameter}
    results = [InferenceSession(_kernel_model(op_type, inputs, **attrs), _options(threads), CPU).run(None, feeds)
               for threads in (1, 4)]
    for one, four in zip(*results):
        np.testing.assert_array_equal(one, four)


@pytest.mark.parametrize("op_type", ["LayerNormalizationGrad", "BatchNormTrainingGrad"])
def test_unnamed_parameter_gradients_are_not_computed(op_type):
    if op_type == "LayerNormalizationGrad":
        feeds, _ = _layer_norm_case([5, 12], 1, 4)
        expected = _layer_norm_reference(feeds, 1)
        inputs, attrs = _layer_norm_inputs([5, 12], 1), {"axis": 1}
    else:
        feeds, _ = _batch_norm_case([3, 4, 5], 1e-5, 4)
        expected = _batch_norm_reference(feeds, 1e-5)
        inputs, attrs = _batch_norm_inputs([3, 4, 5]), {"epsilon": 1e-5}
    for outputs in (("dx", "", ""), ("dx", "dscale", ""), ("dx", "", "dbias")):
        session = InferenceSession(_kernel_model(op_type, inputs, outputs, **attrs), _options(), CPU)
        got = session.run(None, feeds)
        wanted = [e for name, e in zip(outputs, expected) if name]
        _assert_gradients(got, wanted, f"{op_type} {outputs}")


def test_empty_batches_give_zero_parameter_gradients():
    session = InferenceSession(_kernel_model("LayerNormalizationGrad", _layer_norm_inputs([0, 6], 1), axis=1),
                               _options(), CPU)
    empty = np.zeros((0, 6), np.float32)
    dx, dscale, dbias = session.run(None, {"dy": empty, "x": empty, "scale": np.ones(6, np.float32),
                                           "mean": np.zeros((0, 1), np.float32),
                                           "inv_std": np.zeros((0, 1), np.float32)})
    assert dx.shape == (0, 6) and not dscale.any() and not dbias.any()
    session = InferenceSession(_kernel_model("BatchNormTrainingGrad", _batch_norm_inputs([0, 3, 2])),
                               _options(), CPU)
    empty = np.zeros((0, 3, 2), np.float32)
    dx, dscale, dbias = session.run(None, {"dy": empty, "x": empty, "scale": np.ones(3, np.float32),
                                           "mean": np.zeros(3, np.float32), "var": np.ones(3, np.float32)})
    assert dx.shape == (0, 3, 2) and not dscale.any() and not dbias.any()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 9), min_size=2, max_size=5), seed=st.integers(0, 2**16),
       epsilon=st.sampled_from([1e-5, 1e-3, 0.1]))
def test_batch_norm_forward_matches_torch(shape, seed, epsilon):
    """The training-mode forward: the batch's mean and biased variance per channel, and the
    normalised output, against torch's batch_norm (its running buffers are updated with the
    unbiased variance, which ORTModule derives from this one)."""
    assume(np.prod(shape) // shape[1] > 1)
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.standard_normal(shape) * 3 + 1, dtype=torch.float32)
    weight = torch.tensor(rng.standard_normal(shape[1]), dtype=torch.float32)
    bias = torch.tensor(rng.standard_normal(shape[1]), dtype=torch.float32)
    expected = torch.nn.functional.batch_norm(x, None, None, weight, bias, True, 0.1, epsilon).numpy()
    reduced = [0, *range(2, len(shape))]
    session = InferenceSession(_kernel_model("BatchNormTraining", {"x": shape, "scale": [shape[1]], "B": [shape[1]]},
                                             ("y", "mean", "var"), epsilon=epsilon), _options(), CPU)
    y, mean, var = session.run(None, {"x": x.numpy(), "scale": weight.numpy(), "B": bias.numpy()})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mean, x.double().mean(reduced).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(var, x.double().var(reduced, unbiased=False).numpy(), rtol=1e-4, atol=1e-5)


def test_batch_norm_forward_of_an_empty_batch_has_no_statistics():
    session = InferenceSession(_kernel_model("BatchNormTraining", {"x": [0, 3, 2], "scale": [3], "B": [3]},
                                             ("y", "mean", "var")), _options(), CPU)
    y, mean, var = session.run(None, {"x": np.zeros((0, 3, 2), np.float32), "scale": np.ones(3, np.float32),
                                      "B": np.zeros(3, np.float32)})
    assert y.shape == (0, 3, 2) and np.isnan(mean).all() and np.isnan(var).all()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, seed=st.integers(0, 2**16), spread=st.sampled_from([0.5, 3.0, 20.0]))
def test_gelu_grad_matches_torch(shape, seed, spread):
    """Against torch's gelu backward and a float64 evaluation, over inputs out to where the
    density underflows (|x| > 13): the kernel evaluates the exponential and the CDF with its own
    polynomials (dX within 1.6e-7 of the float64 value at dY = 1)."""
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.standard_normal(shape) * spread, dtype=torch.float32, requires_grad=True)
    dy = torch.tensor(rng.standard_normal(shape), dtype=torch.float32)
    torch.nn.functional.gelu(x).backward(dy)
    x64 = x.detach().numpy().astype(np.float64)
    cdf = 0.5 * np.vectorize(math.erfc)(-x64 / np.sqrt(2))
    session = InferenceSession(_kernel_model("GeluGrad", {"dy": shape, "x": shape}, ("dx",)), _options(), CPU)
    (dx,) = session.run(None, {"dy": dy.numpy(), "x": x.detach().numpy()})
    exact = dy.numpy() * (cdf + x64 * np.exp(-x64 * x64 / 2) / np.sqrt(2 * np.pi))
    scale = np.abs(dy.numpy())
    np.testing.assert_array_less(np.abs(dx - exact), 2e-6 * np.abs(exact) + 3e-7 * scale + 1e-30)
    np.testing.assert_array_less(np.abs(dx - x.grad.numpy()), 1e-5 * np.abs(exact) + 5e-7 * scale + 1e-30)


def test_gelu_grad_tails_and_knees():
    """Every float of a dense grid, zero, |x| = sqrt(2) (where an earlier CDF changed
    formulas), the tails and beyond where the density underflows, with and without a partial
    last step of 32: within 1.6e-7 of the float64 value (dY = 1; torch's gelu backward is
    2.2e-7 off on this grid), the same bits in the baseline and x86-64-v3 builds (no fused
    multiply-adds)."""
    x = np.concatenate([np.linspace(-20, 20, 40001), [-np.sqrt(2), np.sqrt(2), 0.0, -1e-30, 1e-30]])
    for count in (x.size, x.size - 3, x.size - 21):
        grid = x[:count].astype(np.float32)
        session = InferenceSession(_kernel_model("GeluGrad", {"dy": [count], "x": [count]}, ("dx",)), _options(), CPU)
        (dx,) = session.run(None, {"dy": np.ones(count, np.float32), "x": grid})
        x64 = grid.astype(np.float64)
        exact = 0.5 * np.vectorize(math.erfc)(-x64 / np.sqrt(2)) + x64 * np.exp(-x64 * x64 / 2) / np.sqrt(2 * np.pi)
        assert np.abs(dx - exact).max() < 1.6e-7


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_softmax_grad_matches_torch(shape, seed):
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.standard_normal(shape) * 3, dtype=torch.float32, requires_grad=True)
    dy = torch.tensor(rng.standard_normal(shape), dtype=torch.float32)
    y = torch.softmax(x, -1)
    y.backward(dy)
    session = InferenceSession(_kernel_model("SoftmaxGrad", {"dy": shape, "y": shape}, ("dx",)), _options(), CPU)
    (dx,) = session.run(None, {"dy": dy.numpy(), "y": y.detach().numpy()})
    y64, dy64 = y.detach().numpy().astype(np.float64), dy.numpy().astype(np.float64)
    exact = y64 * (dy64 - (dy64 * y64).sum(-1, keepdims=True))
    np.testing.assert_allclose(dx, exact, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-4, atol=1e-6)


def _masked_scores(shape, seed, masked_fraction):
    """Scores with -inf at random positions (``masked_fraction`` of them), one row masked
    entirely, one +inf, one NaN and one score far below its row's largest (where there are rows
    enough for them)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    rows = x.reshape(-1, shape[-1])
    rows[rng.random(rows.shape) < masked_fraction] = -np.inf
    if rows.shape[0] >= 5:
        rows[1] = -np.inf
        rows[2, 0] = np.inf
        rows[3, -1] = np.nan
        rows[4, 0] = rows[4].max() - 100 if np.isfinite(rows[4]).any() else rows[4, 0]
    return x


def _softmax64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x64 = x.astype(np.float64)
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 19), min_size=1, max_size=4), seed=st.integers(0, 2**16),
       masked_fraction=st.sampled_from([0.0, 0.3, 0.9]))
@example(shape=[16, 4, 32, 32], seed=0, masked_fraction=0.5)
def test_masked_softmax_matches_torch(shape, seed, masked_fraction):
    """The softmax over the last axis of scores with -inf in them (rows in groups of four with
    a last group short of rows; rows not a multiple of 8 long): masked positions and positions
    more than 87 below the row's largest exactly 0, NaN where torch has NaN (a row all -inf, a
    row with +inf or NaN), the rest within float rounding of float64 and of torch."""
    x = _masked_scores(shape, seed, masked_fraction)
    session = InferenceSession(_kernel_model("MaskedSoftmax", {"x": shape}, ("y",)), _options(), CPU)
    (y,) = session.run(None, {"x": x})
    expected = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert (y[np.isneginf(x) & finite] == 0).all()
    with np.errstate(invalid="ignore"):
        far = finite & (x - np.nanmax(np.where(np.isnan(x), -np.inf, x), -1, keepdims=True) < -87)
    assert (y[far] == 0).all()
    np.testing.assert_allclose(y[finite], _softmax64(x)[finite], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y[finite], expected[finite], rtol=1e-5, atol=1e-7)


def test_masked_softmax_does_not_depend_on_the_thread_count():
    """Rows split into blocks over the session's threads (here 4096 rows of 33): the same bits
    with one thread and four, and those of the rows computed alone."""
    x = _masked_scores([4096, 33], 5, 0.4)
    model = _kernel_model("MaskedSoftmax", {"x": [4096, 33]}, ("y",))
    one, four = (InferenceSession(model, _options(threads), CPU).run(None, {"x": x})[0] for threads in (1, 4))
    np.testing.assert_array_equal(one, four)
    few = InferenceSession(_kernel_model("MaskedSoftmax", {"x": [3, 33]}, ("y",)), _options(), CPU)
    np.testing.assert_array_equal(few.run(None, {"x": x[1001:1004]})[0], one[1001:1004])


def _leading_sum_bound(x: np.ndarray, axes: int) -> np.ndarray:
    """The kernel's worst-case rounding per output element: runs of 64 rows added one after
    another, each run's total added to its group's (groups of 4096 rows), the groups' totals
    added in order -- at most that many additions, each off by half an ulp of float32, of
    partial sums no larger than the sum of the magnitudes."""
    rows = int(np.prod(x.shape[:axes]))
    runs = min(-(-rows // 64), 64)
    additions = min(rows, 64) + runs + -(-rows // 4096)
    return additions * 2.0 ** -24 * np.abs(x.astype(np.float64)).sum(axis=tuple(range(axes)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=4), axes_seed=st.integers(0, 10),
       keepdims=st.booleans(), seed=st.integers(0, 2**16))
@example(shape=[9000, 77], axes_seed=0, keepdims=False, seed=0)     # three groups of rows; a partial block
@example(shape=[16, 32, 256, 1], axes_seed=1, keepdims=True, seed=0)    # a bias's gradient with the seed axis
def test_sum_leading_axes_matches_float64_and_torch(shape, axes_seed, keepdims, seed):
    """ReduceSum over the first ``axes`` axes: torch's shape, and values within the kernel's
    worst-case rounding of the float64 sum (and within twice that of torch's)."""
    axes = 1 + axes_seed % len(shape)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3 + 1
    session = InferenceSession(_kernel_model("SumLeadingAxes", {"x": shape}, ("y",), axes=axes,
                                             keepdims=int(keepdims)), _options(), CPU)
    (y,) = session.run(None, {"x": x})
    expected = torch.from_numpy(x).sum(dim=tuple(range(axes)), keepdim=keepdims).numpy()
    assert y.shape == expected.shape
    bound = _leading_sum_bound(x, axes).reshape(y.shape)
    exact = x.astype(np.float64).sum(axis=tuple(range(axes))).reshape(y.shape)
    assert (np.abs(y - exact) <= bound).all()
    assert (np.abs(y - expected) <= 2 * bound + 1e-30).all()


def test_sum_leading_axes_does_not_depend_on_the_thread_count():
    """Work items are (group of 4096 rows, block of 64 columns), whatever the threads: the same
    bits with one thread and four, for several groups and a partial block."""
    x = np.random.default_rng(3).standard_normal((9000, 200)).astype(np.float32)
    model = _kernel_model("SumLeadingAxes", {"x": [9000, 200]}, ("y",), axes=1, keepdims=0)
    one, four = (InferenceSession(model, _options(threads), CPU).run(None, {"x": x})[0] for threads in (1, 4))
    np.testing.assert_array_equal(one, four)


def test_sum_leading_axes_of_empty_tensors_and_bad_axes():
    """No rows: zeros; no columns: an empty result; more axes than X has, or no axes
    attribute: a typed error."""
    session = InferenceSession(_kernel_model("SumLeadingAxes", {"x": None}, ("y",), axes=2, keepdims=1),
                               _options(), CPU)
    np.testing.assert_array_equal(session.run(None, {"x": np.ones((0, 3, 4), np.float32)})[0], np.zeros((1, 1, 4)))
    assert session.run(None, {"x": np.ones((2, 3, 0), np.float32)})[0].shape == (1, 1, 0)
    with pytest.raises(OrtInvalidArgument, match="fewer dimensions than the axes to sum"):
        session.run(None, {"x": np.ones(3, np.float32)})
    with pytest.raises(OrtRuntimeException, match="the attribute axes .* is required"):
        InferenceSession(_kernel_model("SumLeadingAxes", {"x": [2, 3]}, ("y",)), _options(), CPU)
    kept = InferenceSession(_kernel_model("SumLeadingAxes", {"x": [2, 3]}, ("y",), axes=1), _options(), CPU)
    assert kept.run(None, {"x": np.ones((2, 3), np.float32)})[0].shape == (1, 3)     # keepdims: 1 by default


def _activation_slopes(kind, x, alpha=1 / 6, beta=0.5):
    if kind == "ReluGrad":
        return (x > 0).astype(np.float64)
    if kind == "HardSwishGrad":
        return np.where(x < 3, np.where(x > -3, x / 3 + 0.5, 0.0), 1.0)
    line = alpha * x + beta
    return np.where((line > 0) & (line < 1), alpha, 0.0)


@pytest.mark.parametrize("kind, torch_fn", [("ReluGrad", torch.relu), ("HardSwishGrad", torch.nn.functional.hardswish),
                                            ("HardSigmoidGrad", torch.nn.functional.hardsigmoid)])
@pytest.mark.parametrize("shape", [[7], [2, 3, 5, 5], [64, 130]])
def test_activation_grads_match_torch_and_their_rules(kind, torch_fn, shape):
    """Each activation's gradient from its input, on values that include the knees (0 for Relu;
    -3 and 3, where torch's derivatives switch): against torch's backward and against the
    float64 slope of the rule it replaces (HardSigmoid with torch's alpha 1/6 and beta 0.5)."""
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:4] = [0.0, -3.0, 3.0, 1.5][:x.size]
    dy = rng.standard_normal(shape).astype(np.float32)
    attrs = {"alpha": 1 / 6, "beta": 0.5} if kind == "HardSigmoidGrad" else {}
    session = InferenceSession(_kernel_model(kind, {"dy": shape, "x": shape}, ("dx",), **attrs), _options(), CPU)
    (dx,) = session.run(None, {"dy": dy, "x": x})
    np.testing.assert_allclose(dx, dy * _activation_slopes(kind, x.astype(np.float64)), rtol=1e-6, atol=1e-7)
    tensor = torch.tensor(x, requires_grad=True)
    torch_fn(tensor).backward(torch.tensor(dy))
    np.testing.assert_allclose(dx, tensor.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_relu_grad_selects_like_torch():
    """Relu's gradient is dY or 0, never 0 * dY: an infinite or NaN dY where X <= 0 gives 0."""
    session = InferenceSession(_kernel_model("ReluGrad", {"dy": [4], "x": [4]}, ("dx",)), _options(), CPU)
    (dx,) = session.run(None, {"dy": np.array([np.inf, np.nan, np.inf, 2.0], np.float32),
                               "x": np.array([-1.0, 0.0, 1.0, 1.0], np.float32)})
    np.testing.assert_array_equal(dx, [0.0, 0.0, np.inf, 2.0])


# ---- bad input ------------------------------------------------------------------------------------


def _unknown_shapes(op_type):
    names = ("dy", "x", "scale", "mean", "inv_std" if op_type == "LayerNormalizationGrad" else "var")
    return {name: None for name in names}


@pytest.mark.parametrize("case, feeds, message", [
    ("LayerNormalizationGrad", {"dy": (4, 6), "x": (4, 5), "scale": (6,), "mean": (4, 1), "inv_std": (4, 1)},
     "dY and X differ in shape"),
    ("LayerNormalizationGrad", {"dy": (4, 6), "x": (4, 6), "scale": (5,), "mean": (4, 1), "inv_std": (4, 1)},
     "scale does not have one element per normalised element"),
    ("LayerNormalizationGrad", {"dy": (4, 6), "x": (4, 6), "scale": (6,), "mean": (3, 1), "inv_std": (4, 1)},
     "one element per normalised row"),
    ("BatchNormTrainingGrad", {"dy": (2, 3), "x": (2, 3), "scale": (3,), "mean": (2,), "var": (3,)},
     "one element per channel"),
    ("BatchNormTrainingGrad", {"dy": (3,), "x": (3,), "scale": (3,), "mean": (3,), "var": (3,)},
     "X must be [N, C, ...]"),
])
def test_inconsistent_inputs_are_refused(case, feeds, message):
    session = InferenceSession(_kernel_model(case, _unknown_shapes(case)), _options(), CPU)
    with pytest.raises(OrtInvalidArgument, match=message.replace("[", r"\[").replace("]", r"\]")):
        session.run(None, {name: np.ones(shape, np.float32) for name, shape in feeds.items()})


@pytest.mark.parametrize("op_type, inputs", [("MaskedSoftmax", ("x",)), ("SoftmaxGrad", ("dy", "y"))])
def test_a_softmax_of_a_scalar_is_refused(op_type, inputs):
    session = InferenceSession(_kernel_model(op_type, {name: None for name in inputs}, ("out",)), _options(), CPU)
    with pytest.raises(OrtInvalidArgument, match="must have an axis to normalise over"):
        session.run(None, {name: np.ones((), np.float32) for name in inputs})
    empty = session.run(None, {name: np.ones((3, 0), np.float32) for name in inputs})[0]
    assert empty.shape == (3, 0)


def test_an_axis_outside_the_input_is_refused():
    session = InferenceSession(_kernel_model("LayerNormalizationGrad", _unknown_shapes("LayerNormalizationGrad"),
                                             axis=3), _options(), CPU)
    feeds = {"dy": np.ones((2, 3), np.float32), "x": np.ones((2, 3), np.float32), "scale": np.ones(3, np.float32),
             "mean": np.ones((2, 1), np.float32), "inv_std": np.ones((2, 1), np.float32)}
    with pytest.raises(OrtInvalidArgument, match="axis is outside"):
        session.run(None, feeds)


def test_only_float32_is_accepted():
    """The kernels declare float32 inputs: onnxruntime refuses a double graph when it loads it."""
    model = _kernel_model("LayerNormalizationGrad", _layer_norm_inputs([2, 3], 1), element_type=TensorProto.DOUBLE,
                          axis=1)
    with pytest.raises(OrtInvalidGraph, match="tensor\\(double\\)"):
        InferenceSession(model, _options(), CPU)


def test_a_session_without_the_kernels_names_the_operator():
    model = _kernel_model("LayerNormalizationGrad", _layer_norm_inputs([2, 3], 1), axis=1)
    with pytest.raises(OrtFail, match="ai.ortagent.cpu:LayerNormalizationGrad"):
        InferenceSession(model, SessionOptions(), CPU)


def test_options_remember_the_kernels_and_copies_keep_them():
    options = SessionOptions()
    assert not options.has_cpu_training_kernels
    options.add_cpu_training_kernels()
    options.add_cpu_training_kernels()          # a second call adds nothing
    copied = copy.copy(options)
    assert copied.has_cpu_training_kernels
    feeds, expected = _layer_norm_case([3, 4], 1, 0)
    session = InferenceSession(_kernel_model("LayerNormalizationGrad", _layer_norm_inputs([3, 4], 1), axis=1),
                               copied, CPU)
    _assert_gradients(session.run(None, feeds), expected, "copied options")


# ---- in training graphs ---------------------------------------------------------------------------


def _norm_model(element_type=TensorProto.FLOAT) -> onnx.ModelProto:
    """x [B, 6] -> Gemm -> LayerNormalization (axis -1) -> Relu -> y, with parameters as
    initializers; opset 17."""
    rng = np.random.default_rng(0)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(element_type)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(dtype), name)
             for name, shape in (("w", (6, 8)), ("b", (8,)), ("gamma", (8,)), ("beta", (8,)))]
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", element_type, ["B", 6])],
                              [helper.make_tensor_value_info("y", element_type, ["B", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _gradients(graph: onnx.ModelProto, feeds: dict[str, np.ndarray], dy: np.ndarray, options) -> list[np.ndarray]:
    """The training graph's gradient outputs, its two halves run as an agent runs them."""
    from ortagent.graph_split import split_training_graph

    split = split_training_graph(graph)
    forward = InferenceSession(split.forward_model.SerializeToString(), options, CPU)
    backward = InferenceSession(split.backward_model.SerializeToString(), options, CPU)
    outputs = forward.run(None, {name: feeds[name] for name in split.forward_input_names})
    values = [dy, *outputs[len(split.module_output_names):],
              *(feeds[name] for name in split.backward_graph_input_names)]
    return backward.run(None, dict(zip(split.backward_input_names, values)))


def test_training_graph_uses_the_kernels_only_when_asked_and_agrees():
    from ortagent.training import build_training_graph

    model = _norm_model()
    trainable = ["w", "b", "gamma", "beta"]
    plain = build_training_graph(model, trainable)
    fused = build_training_graph(model, trainable, cpu_kernels=True)
    assert not any(node.domain == DOMAIN for node in plain.graph.node)
    assert sorted(node.op_type for node in fused.graph.node if node.domain == DOMAIN) == [
        "LayerNormalizationGrad", "ReluGrad", "SumLeadingAxes"]
    assert any(opset.domain == DOMAIN for opset in fused.opset_import)
    assert len(fused.graph.node) < len(plain.graph.node)
    rng = np.random.default_rng(1)
    feeds = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    feeds["x"] = rng.standard_normal((5, 6)).astype(np.float32)
    dy = rng.standard_normal((5, 8)).astype(np.float32)
    expected = _gradients(plain, feeds, dy, SessionOptions())
    got = _gradients(fused, feeds, dy, _options())
    for name, g, e in zip(trainable, got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5, err_msg=name)


def _gelu_model(element_type=TensorProto.FLOAT, extra_reader=False) -> onnx.ModelProto:
    """x [B, 6] -> MatMul -> GELU as torch's exporter writes it (x * (0.5 * (1 + erf(x / sqrt(2)))))
    -> y; with ``extra_reader`` the erf's result is an output too (the GELU must stay apart)."""
    rng = np.random.default_rng(0)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(element_type)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((6, 8)).astype(dtype), "w")]
    inits += [onnx.numpy_helper.from_array(np.array(value, dtype=dtype), name)
              for name, value in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Div", ["h", "sqrt2"], ["t"]),
             helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["half", "a"], ["cdf"]),
             helper.make_node("Mul", ["h", "cdf"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", element_type, ["B", 8])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("e", element_type, ["B", 8]))
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", element_type, ["B", 6])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_gelus_become_one_gradient_node_only_with_the_kernels():
    from ortagent.training import build_training_graph

    model = _gelu_model()
    plain = build_training_graph(model, ["w"])
    fused = build_training_graph(model, ["w"], cpu_kernels=True)
    assert not any(node.domain == DOMAIN for node in plain.graph.node)
    assert [node.op_type for node in fused.graph.node if node.domain == DOMAIN] == ["GeluGrad"]
    # the forward is onnxruntime's one-pass GELU, and the backward reads no CDF
    assert [(node.domain, node.op_type) for node in fused.graph.node if node.op_type in ("Gelu", "Erf")] == \
        [("com.microsoft", "Gelu")]
    assert not any(node.domain == "ai.ortagent.ad" for node in fused.graph.node)
    rng = np.random.default_rng(2)
    feeds = {"w": onnx.numpy_helper.to_array(model.graph.initializer[0]),
             "x": (rng.standard_normal((5, 6)) * 2).astype(np.float32)}
    dy = rng.standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(_gradients(fused, feeds, dy, _options())[0],
                               _gradients(plain, feeds, dy, SessionOptions())[0], rtol=1e-5, atol=1e-5)


def test_convolutions_are_ortagent_s_also_where_gelus_collapse():
    """The GELUs' collapse (with the kernels) writes the node list anew; the Conv nodes of the
    same graph still become ortagent's Convolution (ConvGrad, grouped weights, symbolic
    shapes), found after the collapse, not renamed in copies the graph no longer holds."""
    from ortagent import _ad_rules

    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")]
    inits += [onnx.numpy_helper.from_array(np.array(value, np.float32), name)
              for name, value in (("sqrt2", math.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),      # then torch's erf GELU
             helper.make_node("Div", ["h", "sqrt2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["half", "a"], ["cdf"]),
             helper.make_node("Mul", ["h", "cdf"], ["y"])]
    graph = helper.make_graph(nodes, "conv_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4, 6, 6])], inits)
    for cpu_kernels in (False, True):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        _ad_rules.prepare(model, cpu_kernels=cpu_kernels)
        kinds = [(node.domain, node.op_type) for node in model.graph.node]
        assert (_ad_rules.DOMAIN, _ad_rules.CONVOLUTION) in kinds and ("", "Conv") not in kinds, (cpu_kernels, kinds)
        assert ((_ad_rules.DOMAIN, _ad_rules.GELU) in kinds) == cpu_kernels


@pytest.mark.parametrize("element_type, extra_reader", [(TensorProto.DOUBLE, False), (TensorProto.FLOAT, True)])
def test_gelus_the_kernel_cannot_take_stay_apart(element_type, extra_reader):
    """A double GELU, or one whose erf another node reads, keeps the standard gradient."""
    from ortagent.training import build_training_graph

    fused = build_training_graph(_gelu_model(element_type, extra_reader), ["w"],
                                 non_differentiable_outputs=[1] if extra_reader else None, cpu_kernels=True)
    assert not any(node.domain == DOMAIN for node in fused.graph.node)


def test_a_double_graph_keeps_standard_operators():
    from ortagent.training import build_training_graph

    fused = build_training_graph(_norm_model(TensorProto.DOUBLE), ["w", "b", "gamma", "beta"], cpu_kernels=True)
    assert not any(node.domain == DOMAIN for node in fused.graph.node)


class _Mobile(torch.nn.Module):
    """A MobileNetV3 block: depthwise convolution, BatchNorm, HardSwish, squeeze-excitation with
    Relu and HardSigmoid."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(3, 8, 1)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)   # (BatchNorm follows)
        self.norm = torch.nn.BatchNorm2d(8)
        self.squeeze = torch.nn.Conv2d(8, 4, 1)
        self.excite = torch.nn.Conv2d(4, 8, 1)

    def forward(self, x):
        h = torch.nn.functional.hardswish(self.norm(self.depthwise(self.expand(x))))
        gate = torch.nn.functional.hardsigmoid(self.excite(torch.relu(self.squeeze(h.mean((2, 3), keepdim=True)))))
        return h * gate


class _Attention(torch.nn.Module):
    """Self-attention with a Softmax over the last axis and one over another axis (which keeps
    the standard gradient), GELU feed-forward and LayerNorm."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.norm = torch.nn.LayerNorm(8)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = q @ k.transpose(-1, -2) / 8 ** 0.5
        mixed = torch.softmax(scores, -1) @ v + torch.softmax(scores, 1) @ v
        return self.out(torch.nn.functional.gelu(self.norm(mixed)))


class _CausalAttention(torch.nn.Module):
    """Causal self-attention: scores masked with -inf (``MaskedSoftmax`` in the forward)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.out = torch.nn.Linear(8, 8)
        self.register_buffer("causal", torch.tril(torch.ones(5, 5, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~self.causal, float("-inf"))
        return self.out(torch.softmax(scores, -1) @ v)


class _Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.batch_norm = torch.nn.BatchNorm2d(8)
        self.linear = torch.nn.Linear(8 * 5 * 5, 16)
        self.layer_norm = torch.nn.LayerNorm(16)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.batch_norm(self.conv(x))).flatten(1)
        return self.out(torch.nn.functional.gelu(self.layer_norm(self.linear(h))))


class _ConvNeXt(torch.nn.Module):
    """A ConvNeXt block: depthwise 7x7 convolution, LayerNorm over channels last, GELU
    feed-forward, layer scale, residual (a grouped Conv in a graph whose GELUs the kernels
    collapse: the collapse wrote the node list anew, and the Conv, renamed in a copy, went to
    onnx-ad's rule, which refuses a grouped Conv's weight)."""

    def __init__(self):
        super().__init__()
        self.depthwise = torch.nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.norm = torch.nn.LayerNorm(8)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
        self.scale = torch.nn.Parameter(torch.full((8, 1, 1), 0.5))

    def forward(self, x):
        h = self.depthwise(x).permute(0, 2, 3, 1)
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(h)))).permute(0, 3, 1, 2)
        return x + self.scale * h


@pytest.mark.parametrize("cpu_kernels", [None, True, False])
@pytest.mark.parametrize("net, kernels", [
    (_Norms, {"LayerNormalizationGrad", "BatchNormTrainingGrad", "GeluGrad", "BatchNormTraining", "ReluGrad",
              "SumLeadingAxes"}),
    (_Mobile, {"BatchNormTrainingGrad", "BatchNormTraining", "ReluGrad", "HardSwishGrad", "HardSigmoidGrad"}),
    (_Attention, {"SoftmaxGrad", "LayerNormalizationGrad", "GeluGrad", "SumLeadingAxes"}),
    (_CausalAttention, {"MaskedSoftmax", "SoftmaxGrad", "SumLeadingAxes"}),
    (_ConvNeXt, {"LayerNormalizationGrad", "GeluGrad", "SumLeadingAxes"})])
def test_ortmodule_matches_eager_with_and_without_the_kernels(cpu_kernels, net, kernels, monkeypatch):
    pytest.importorskip("onnxscript")
    from ortagent.torch import ORTModule, _bridge

    graphs = []
    original = _bridge.GraphRunner._training_graph

    def capture(self, *args, **kwargs):
        graphs.append(original(self, *args, **kwargs))
        return graphs[-1]

    monkeypatch.setattr(_bridge.GraphRunner, "_training_graph", capture)
    torch.manual_seed(0)
    eager = net().train()
    bridged = ORTModule(copy.deepcopy(eager), cpu_kernels=cpu_kernels)
    for step, batch in enumerate((4, 4, 6)):
        shape = (batch, 5, 8) if net in (_Attention, _CausalAttention) else \
            (batch, 8, 6, 6) if net is _ConvNeXt else (batch, 3, 5, 5)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(step)) * 2 + 1
        inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        for model, tensor in zip((eager, bridged), inputs):
            model.zero_grad()
            model(tensor).square().sum().backward()
        # (sums over the batch: rounding relative to the largest element, not to each one)
        for (name, expected), got in zip([("x", inputs[0]), *eager.named_parameters()],
                                         [inputs[1], *bridged.parameters()]):
            scale = max(1.0, float(expected.grad.abs().max()))
            torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=2e-6 * scale, msg=name)
    used = {node.op_type for graph in graphs for node in graph.graph.node if node.domain == DOMAIN}
    assert used == (set() if cpu_kernels is False else kernels)


def test_ortmodule_refuses_the_kernels_off_the_cpu_provider():
    pytest.importorskip("onnxscript")
    from ortagent.torch import ORTModule

    bridged = ORTModule(torch.nn.LayerNorm(4), cpu_kernels=True, providers=["CUDAExecutionProvider"])
    with pytest.raises(OrtInvalidArgument, match="CPU provider alone"):
        bridged(torch.randn(2, 4, requires_grad=True)).sum().backward()


def test_ortmodule_leaves_the_callers_options_unchanged():
    pytest.importorskip("onnxscript")
    from ortagent.torch import ORTModule

    options = SessionOptions()
    bridged = ORTModule(torch.nn.LayerNorm(4), session_options=options)
    bridged(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert not options.has_cpu_training_kernels
