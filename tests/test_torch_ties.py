"""Gradients at ties and bounds: inputs with repeated values and values exactly at a clamp's
bounds (small integers cast to float), through ORTModule, compared with torch eager on every
output and every gradient. torch's conventions there differ by operator (a clamp passes no
gradient at a number bound, ``maximum`` halves a tie, ``max(dim)`` gives it to the returned
index, ``amax`` shares it evenly), and the autodiff's rules for the ONNX operators the
exporter writes had their own."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def _outputs_and_grads(module, inputs, seed):
    import torch
    from torch.utils import _pytree as pytree

    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    result = module(*leaves)
    outputs = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
    generator = torch.Generator().manual_seed(seed)
    # random weights per output element, so a gradient sent to the wrong tied element shows
    loss = sum((out * torch.randn(out.shape, generator=generator)).sum() for out in outputs if out.is_floating_point())
    grads = torch.autograd.grad(loss, [t for t in leaves if t.requires_grad], allow_unused=True)
    return [o.detach() for o in outputs], grads


def _assert_same(function, *inputs, seed=0):
    """``function``'s outputs and gradients through ORTModule equal torch eager's (floats to
    rounding, integers exactly; a tie's gradient sent elsewhere is off by a whole weight)."""
    import torch

    from ortagent.torch import ORTModule

    class Wrapped(torch.nn.Module):
        def forward(self, *tensors):
            return function(*tensors)

    expected, expected_grads = _outputs_and_grads(Wrapped(), inputs, seed)
    actual, grads = _outputs_and_grads(ORTModule(Wrapped()), inputs, seed)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        if e.is_floating_point():
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            assert torch.equal(a, e)
    assert len(grads) == len(expected_grads)
    for index, (a, e) in enumerate(zip(grads, expected_grads)):
        if e is None:
            assert a is None or not a.any()
            continue
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, equal_nan=True, msg=lambda m: f"gradient {index}: {m}")


def _ties(*shape, low=-2, high=3, seed=0):
    """Small integers as floats: most values repeat, and many sit exactly at -1, 0 or 1."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=generator).float()


# -- bounds -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["clamp", "clamp_min", "clamp_max", "clip", "clamp_min_only", "clamp_max_only",
                                  "hardtanh", "hardtanh_wide", "relu6", "clamp_inverted", "clamp_empty_range",
                                  "nn_hardtanh", "nn_relu6"])
def test_number_bounds_pass_no_gradient_at_the_bound(case):
    import torch
    import torch.nn.functional as F

    function = {
        "clamp": lambda x: torch.clamp(x, -1, 1),
        "clamp_min": lambda x: torch.clamp_min(x, 1.0),
        "clamp_max": lambda x: torch.clamp_max(x, -1.0),
        "clip": lambda x: torch.clip(x, 0.0, 2.0),
        "clamp_min_only": lambda x: x.clamp(min=0.0),
        "clamp_max_only": lambda x: x.clamp(max=0.0),
        "hardtanh": F.hardtanh,
        "hardtanh_wide": lambda x: F.hardtanh(x, -2.0, 2.0),
        "relu6": lambda x: F.relu6(x * 3),
        "clamp_inverted": lambda x: torch.clamp(x, 1.0, -1.0),
        "clamp_empty_range": lambda x: torch.clamp(x, 0.0, 0.0),
        "nn_hardtanh": torch.nn.Hardtanh(-1.0, 1.0),
        "nn_relu6": lambda x: torch.nn.ReLU6()(x + 4),
    }[case]
    _assert_same(function, _ties(5, 7))


@pytest.mark.parametrize("case", ["hardswish", "nn_hardswish_scaled", "hardswish_infinite"])
def test_hardswish_takes_torch_slope_at_its_knees(case):
    """torch's hardswish_backward: 0 up to -3 included, x / 3 + 1/2 between, 1 from 3 on; the
    values of -4..4 hit both knees and each piece. (At NaN torch's own kernel disagrees with
    itself: 1 on its scalar path, NaN on its vectorized one; not compared.)"""
    import torch
    import torch.nn.functional as F

    x = _ties(5, 7, low=-4, high=5)
    if case == "hardswish_infinite":
        x[0, :2] = torch.tensor([float("inf"), -float("inf")])
    function = {"hardswish": F.hardswish, "hardswish_infinite": F.hardswish,
                "nn_hardswish_scaled": lambda x: torch.nn.Hardswish()(x * 1.5)}[case]
    _assert_same(function, x)


def test_hardtanh_keeps_the_gradient_of_nan_as_torch():
    import torch
    import torch.nn.functional as F

    x = torch.tensor([[-1.0, 0.0, 1.0, float("nan"), 2.0, -1.0]])
    _assert_same(F.hardtanh, x)
    _assert_same(lambda t: F.relu6(t + 5), x)


@pytest.mark.parametrize("case", ["clamp_min", "clamp_max", "clamp_both", "broadcast_min", "scalar_tensor_min",
                                  "buffer_bound"])
def test_tensor_bounds_share_a_tie_as_torch(case):
    import torch

    x = _ties(4, 6)
    low, high = _ties(4, 6, low=-2, high=0, seed=1), _ties(4, 6, low=0, high=3, seed=2)
    function, inputs = {
        "clamp_min": (torch.clamp_min, (x, low)),
        "clamp_max": (torch.clamp_max, (x, high)),
        "clamp_both": (torch.clamp, (x, low, high)),
        "broadcast_min": (torch.clamp_min, (x, _ties(6, seed=3))),
        "scalar_tensor_min": (torch.clamp_min, (x, torch.tensor(1.0))),
        "buffer_bound": (lambda t: torch.clamp_max(t, torch.tensor(0.0)), (x,)),
    }[case]
    _assert_same(function, *inputs)


# -- two operands -----------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["maximum", "minimum", "broadcast", "nan", "fmax", "fmin", "max_binary",
                                  "same_operand", "fmax_extreme_values", "fmin_extreme_values"])
def test_elementwise_extremes_halve_a_tie(case):
    import torch

    a, b = _ties(4, 6, seed=4), _ties(4, 6, seed=5)
    nan = float("nan")
    extreme = torch.tensor([3e38, -3e38, 1e-45, 2.0, -1e-45, 2.0, -3e38, 3e38])
    function, inputs = {
        "maximum": (torch.maximum, (a, b)),
        "minimum": (torch.minimum, (a, b)),
        "broadcast": (lambda p, q: (torch.maximum(p, q), torch.minimum(q, p)), (a, _ties(6, seed=6))),
        "nan": (torch.maximum, (torch.tensor([1.0, nan, 1.0, nan, 2.0]), torch.tensor([nan, 1.0, 1.0, nan, 3.0]))),
        "fmax": (torch.fmax, (a, b)),
        "fmin": (torch.fmin, (a, b)),
        "max_binary": (torch.max, (a, b)),
        "same_operand": (lambda p: torch.minimum(p, p), (a,)),
        # ties of the largest and the smallest floats: the value stays exact
        "fmax_extreme_values": (torch.fmax, (extreme, extreme.flip(0))),
        "fmin_extreme_values": (torch.fmin, (extreme, extreme.flip(0))),
    }[case]
    _assert_same(function, *inputs)


# -- reductions -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["max_dim", "min_dim", "max_dim0", "min_keepdim", "max_negative_dim",
                                  "max_dim_values_only", "max_dim_3d", "max_dim_0d", "max_dim_int"])
def test_extreme_along_a_dimension_gives_a_tie_to_the_returned_index(case):
    import torch

    x = _ties(5, 6, low=0, high=3)
    function, inputs = {
        "max_dim": (lambda t: torch.max(t, 1), (x,)),
        "min_dim": (lambda t: torch.min(t, 1), (x,)),
        "max_dim0": (lambda t: torch.max(t, 0), (x,)),
        "min_keepdim": (lambda t: torch.min(t, 1, keepdim=True), (x,)),
        "max_negative_dim": (lambda t: t.max(dim=-1), (x,)),
        "max_dim_values_only": (lambda t: torch.max(t, 1).values * 2, (x,)),
        "max_dim_3d": (lambda t: torch.max(t.reshape(5, 3, 2), 1), (x,)),
        "max_dim_0d": (lambda t: torch.max(t.sum(), 0), (x,)),
        "max_dim_int": (lambda t: torch.max(t.long(), 1).values.float() + torch.min(t, 1).values, (x,)),
    }[case]
    _assert_same(function, *inputs)


@pytest.mark.parametrize("case", ["amax", "amin", "amax_dims", "max_all", "min_all", "aminmax"])
def test_reductions_share_a_tie_evenly(case):
    import torch

    x = _ties(5, 6, low=0, high=3)
    function = {
        "amax": lambda t: torch.amax(t, 1),
        "amin": lambda t: torch.amin(t, 0),
        "amax_dims": lambda t: torch.amax(t.reshape(5, 3, 2), (0, 2)),
        "max_all": torch.max,
        "min_all": torch.min,
        "aminmax": lambda t: torch.aminmax(t, dim=1),
    }[case]
    _assert_same(function, x)


@pytest.mark.parametrize("case", ["sort", "sort_descending", "median_all",
                                  "nanmedian_dim", "max_pool", "relu", "abs", "leaky_relu", "cummax", "cummin"])
def test_other_selections_at_ties(case):
    import torch
    import torch.nn.functional as F

    x = _ties(4, 7, low=-1, high=2)
    function = {
        "sort": lambda t: torch.sort(t, 1),
        "sort_descending": lambda t: torch.sort(t, 1, descending=True),
        "median_all": torch.median,
        "nanmedian_dim": lambda t: torch.nanmedian(t, 0),
        "max_pool": lambda t: F.max_pool1d(t[None], 2),
        "relu": F.relu,
        "abs": torch.abs,
        "leaky_relu": F.leaky_relu,
        "cummax": lambda t: torch.cummax(t, 1),
        "cummin": lambda t: torch.cummin(t, 1),
    }[case]
    _assert_same(function, x)


@pytest.mark.parametrize("case", ["topk", "topk_smallest", "kthvalue", "median_dim"])
def test_order_statistics_send_a_tie_to_the_index_they_return(case):
    """Which of tied elements torch's topk and kthvalue return is their kernel's choice (a
    quickselect), not a rule ortagent can follow (median's too); the values are torch's, the indices name
    elements of that value, and the gradient goes to the elements named, as torch's does."""
    import torch

    from ortagent.torch import ORTModule

    function = {"topk": lambda t: torch.topk(t, 3, 1), "topk_smallest": lambda t: torch.topk(t, 3, 1, largest=False),
                "kthvalue": lambda t: torch.kthvalue(t, 3, 1), "median_dim": lambda t: torch.median(t, 1)}[case]

    class Wrapped(torch.nn.Module):
        def forward(self, t):
            return function(t)

    x = _ties(6, 7, low=-1, high=2)
    (expected_values, _), _ = _outputs_and_grads(Wrapped(), [x], 0)
    (values, indices), (grad,) = _outputs_and_grads(ORTModule(Wrapped()), [x], 0)
    assert torch.equal(values, expected_values)
    assert torch.equal(x.gather(1, indices.reshape(6, -1)).reshape(values.shape), values)
    weights = torch.randn(values.shape, generator=torch.Generator().manual_seed(0))
    expected_grad = torch.zeros_like(x).scatter_add(1, indices.reshape(6, -1), weights.reshape(6, -1))
    torch.testing.assert_close(grad, expected_grad)


def test_the_check_sees_a_tie_sent_elsewhere():
    """The comparison can fail: eager max(dim) against the evenly shared amax of the same
    values differs exactly at the ties."""
    import torch

    x = _ties(5, 6, low=0, high=3)
    expected, expected_grads = _outputs_and_grads(lambda t: torch.max(t, 1).values, [x], 0)
    actual, grads = _outputs_and_grads(lambda t: torch.amax(t, 1), [x], 0)
    torch.testing.assert_close(actual[0], expected[0])
    assert not torch.allclose(grads[0], expected_grads[0])


def test_onnx_clip_max_min_rules_at_ties():
    """The same rules on the ONNX road (a forward ONNX model through build_training_graph, no
    torch export): Clip passes no gradient where its input equals a constant bound (a NaN
    input keeps it, as torch's hardtanh), a two-operand Max or Min halves a tie between its
    operands and gives a NaN's gradient to both, checked against numpy."""
    import numpy as np
    from onnx import helper, numpy_helper
    from ortagent_testkit import training_graphs as tg

    from ortagent.graph_split import split_training_graph
    from ortagent.training import build_training_graph

    d = np.float64
    nodes = [helper.make_node("Constant", [], ["low"], value=numpy_helper.from_array(np.array(-1.0, d))),
             helper.make_node("Constant", [], ["high"], value=numpy_helper.from_array(np.array(1.0, d))),
             helper.make_node("Clip", ["x", "low", "high"], ["clipped"]),
             helper.make_node("Max", ["a", "b"], ["larger"]),
             helper.make_node("Min", ["a", "b"], ["smaller"])]
    forward = tg.make_model(nodes, [tg.tensor(name, d, ["n"]) for name in ("x", "a", "b")],
                            [tg.tensor(name, d, ["n"]) for name in ("clipped", "larger", "smaller")], [],
                            opset=18, ms_domain=False)
    runner = tg.SplitRunner(split_training_graph(build_training_graph(forward, [], input_gradients=["x", "a", "b"])))
    nan = float("nan")
    x = np.array([-2.0, -1.0, -0.5, 0.0, 1.0, 3.0, nan, 1.0])
    a = np.array([1.0, 2.0, 2.0, -1.0, nan, 0.0, 5.0, nan])
    b = np.array([1.0, 1.0, 3.0, -1.0, 0.0, 0.0, nan, nan])
    rng = np.random.default_rng(0)
    g = [rng.standard_normal(8) for _ in range(3)]
    outputs, (dx, da, db) = runner.run({"x": x, "a": a, "b": b}, g)
    np.testing.assert_array_equal(outputs[1], np.where(np.isnan(a) | np.isnan(b), nan, np.maximum(a, b)))
    np.testing.assert_array_equal(dx, np.where((x <= -1) | (x >= 1), 0.0, g[0]))

    def share(mine, other, loses):
        return np.where(loses(mine, other), 0.0, np.where(mine == other, 0.5, 1.0))

    with np.errstate(invalid="ignore"):
        expected_da = g[1] * share(a, b, np.less) + g[2] * share(a, b, np.greater)
        expected_db = g[1] * share(b, a, np.less) + g[2] * share(b, a, np.greater)
    np.testing.assert_allclose(da, expected_da, rtol=1e-15, atol=0)
    np.testing.assert_allclose(db, expected_db, rtol=1e-15, atol=0)
