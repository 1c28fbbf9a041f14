"""The op_db ops that torch.onnx translated into graphs onnxruntime could not run, or could not
translate at all, and that ortagent now translates (ortagent/torch/translations: pooling's
unfold/fold, padding, scatters, special's log_ndtr, selection's mode, reductions'
segment_reduce and vecdot, elementwise's nextafter, attention's CPU flash kernel, sampling's
grid_sample on volumes): each runs
through ORTModule and matches torch eager on its outputs and every gradient, on op_db's own
samples and on cases those samples miss (strides, dilations, ties, extreme arguments, empty
batches); the ops refused instead are refused with their reason."""

from __future__ import annotations

import pytest

from test_torch_translations import _assert_same

pytestmark = pytest.mark.torch

SMALL_OPS = ["nn.functional.unfold", "nn.functional.adaptive_avg_pool1d", "nn.functional.pad.circular",
             "nn.functional.pad.replicate_negative", "nn.functional.pdist", "linalg.vecdot",
             "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu", "index_reduce.mean", "index_reduce.prod",
             "index_reduce.amin", "index_reduce.amax", "put", "diagonal_scatter", "special.log_ndtr", "nextafter",
             "mode", "_segment_reduce.lengths", "_segment_reduce.offsets", "grid_sampler_3d",
             "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d"]


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def test_op_db_first_samples_match():
    pytest.importorskip("expecttest", reason="torch's test databases need expecttest (make test TORCH=1)")
    import torch_sweep

    ops = torch_sweep.op_infos(SMALL_OPS)
    outcomes = list(torch_sweep.op_outcomes(ops, samples=1))
    assert {o.name for o in outcomes} == set(SMALL_OPS)
    bad = [f"{o.name}: {o.status} {o.detail[:200]}" for o in outcomes if o.status != "match"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("shape,options", [
    ((2, 3, 7, 6), dict(kernel_size=(3, 2), dilation=(2, 1), padding=(1, 2), stride=(2, 3))),
    ((3, 5, 5), dict(kernel_size=2, stride=1)),
    ((1, 2, 4, 4), dict(kernel_size=4)),
])
def test_unfold_and_fold_with_strides_dilations_and_padding(shape, options):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(*shape)
    _assert_same(lambda t: F.unfold(t, **options), x)
    columns = F.unfold(x, **options)
    size = tuple(shape[-2:])
    _assert_same(lambda c: F.fold(c, size, **options), torch.randn_like(columns))
    _assert_same(lambda t: torch.nn.Fold(size, **options)(torch.nn.Unfold(**options)(t)), x)


def test_unfold_and_fold_of_an_empty_batch():
    import torch
    import torch.nn.functional as F

    _assert_same(lambda t: F.unfold(t, 2), torch.randn(0, 2, 4, 4))
    _assert_same(lambda c: F.fold(c, (4, 4), 2), torch.randn(0, 8, 9))


def test_circular_and_replicate_padding_with_crops():
    import torch
    import torch.nn.functional as F

    torch.manual_seed(1)
    x = torch.randn(2, 3, 5, 6)
    for pads in ([2, 1, 1, 3], [-1, 2, 0, -2], [0, 0, 4, 4]):
        _assert_same(lambda t: F.pad(t, pads, mode="circular"), x)
    _assert_same(lambda t: F.pad(t, [-2, 3], mode="circular"), x[0])
    for pads in ([-6, 2, 1, -3], [3, -5, -4, 2]):
        _assert_same(lambda t: F.pad(t, pads, mode="replicate"), x)
    _assert_same(lambda t: F.pad(t, [-2, 4], mode="replicate"), x[0])
    _assert_same(lambda t: F.pad(t, [1, 2], mode="circular"), torch.randn(0, 3, 4))


def test_log_ndtr_over_its_whole_range():
    """The erf series, the asymptotic tail and log1p above 0, and the seams between them."""
    import torch

    x = torch.tensor([-60.0, -20.0, -9.0, -6.0001, -6.0, -5.9999, -3.0, -1e-3, 0.0, 1e-3, 2.0, 5.9, 6.1,
                      9.0, 15.0])
    # (rtol 1e-4 for the gradient: torch's float32 exp(-x^2/2 - log_ndtr(x)) at -60 is itself
    # 1e-5 off, a difference of two numbers near 1800)
    _assert_same(torch.special.log_ndtr, x, atol=0.0)


def test_nextafter_at_powers_of_two_subnormals_zeros_and_infinities():
    import numpy as np
    import torch

    f = np.finfo(np.float32)
    values = [0.0, -0.0, 1.0, -1.0, 2.0, 0.75, 1e-40, -1e-45, float(f.tiny), float(f.max), -float(f.max),
              float("inf"), -float("inf"), float("nan"), 3.0e38, 2.0 ** -126, 2.0 ** -127, 12345.678]
    x = torch.tensor(values).repeat_interleave(len(values))
    y = torch.tensor(values).repeat(len(values))
    finite = x.isfinite()
    (_, expected, _), (_, actual, _) = _run_plain(torch.nextafter, x, y)
    assert torch.equal(actual.isnan(), expected.isnan())
    assert torch.equal(actual[~expected.isnan()], expected[~expected.isnan()])
    _assert_same(torch.nextafter, x[finite].reshape(-1, len(values)), y[finite].reshape(-1, len(values)))

    from ortagent.errors import OrtNotImplemented

    with pytest.raises(OrtNotImplemented, match="float32"):
        _assert_same(torch.nextafter, torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))


def _run_plain(function, *inputs):
    from test_torch_translations import _run

    (eager, expected, grads), (result, actual, ort_grads) = _run(function, *inputs)
    return (eager, expected[0], grads), (result, actual[0], ort_grads)


@pytest.mark.parametrize("dim,keepdim", [(-1, False), (0, True), (1, False)])
def test_mode_with_ties_takes_the_smallest_value_at_its_last_position(dim, keepdim):
    import torch

    torch.manual_seed(3)
    x = torch.randint(0, 3, (4, 7, 3)).float()
    _assert_same(lambda t: torch.mode(t, dim, keepdim), x)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 0.5])
def test_segment_reduce_with_empty_segments(reduce, initial):
    import torch

    torch.manual_seed(4)
    data = torch.randn(6, 2)
    lengths = torch.tensor([0, 2, 1, 0, 3])
    offsets = torch.tensor([0, 0, 2, 3, 3, 6])
    _assert_same(lambda d, n: torch.segment_reduce(d, reduce, lengths=n, initial=initial), data, lengths)
    _assert_same(lambda d, o: torch.segment_reduce(d, reduce, offsets=o, initial=initial), data, offsets)


def test_segment_reduce_keeps_torch_s_check_on_the_lengths():
    """torch raises when the lengths do not add up to the data's length; the graph must not
    return a number then."""
    import torch

    from ortagent.errors import OrtError
    from ortagent.torch import ORTModule

    class Segments(torch.nn.Module):
        def forward(self, data, lengths):
            return torch.segment_reduce(data, "sum", lengths=lengths)

    module = ORTModule(Segments())
    data = torch.randn(5, requires_grad=True)
    torch.testing.assert_close(module(data, torch.tensor([2, 3])), Segments()(data, torch.tensor([2, 3])))
    for wrong in (torch.tensor([2, 2]), torch.tensor([4, 3]), torch.tensor([6, -1])):
        with pytest.raises(RuntimeError):
            Segments()(data, wrong)
        with pytest.raises(OrtError):
            module(data, wrong)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amin", "amax"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_with_repeated_indices(reduce, include_self):
    import torch

    torch.manual_seed(5)
    x = torch.randn(4, 3)
    source = torch.randn(5, 3)
    index = torch.tensor([0, 2, 0, 3, 2])
    _assert_same(lambda t, s, i: t.index_reduce(0, i, s, reduce, include_self=include_self), x, source, index)
    _assert_same(lambda t, s, i: t.index_reduce(1, i, s, reduce, include_self=include_self),
                 torch.randn(3, 4), torch.randn(3, 5), index)


def test_put_diagonal_scatter_and_the_refused_as_strided_scatter():
    import torch

    from ortagent.errors import OrtNotImplemented

    torch.manual_seed(6)
    x = torch.randn(3, 4)
    _assert_same(lambda t, s, i: t.put(i, s, accumulate=True), x, torch.randn(5), torch.tensor([0, -1, 5, 0, 11]))
    _assert_same(lambda t, s, i: t.put(i, s), x, torch.randn(3), torch.tensor([1, -2, 7]))
    _assert_same(lambda t, s: torch.diagonal_scatter(t, s, 1), x, torch.randn(3))
    _assert_same(lambda t, s: torch.diagonal_scatter(t, s, -1, 1, 0), x, torch.randn(3))
    _assert_same(lambda t, s: torch.diagonal_scatter(t, s, 0, 0, 2), torch.randn(3, 2, 4), torch.randn(2, 3))
    with pytest.raises(OrtNotImplemented, match="gradcheck"):
        _assert_same(lambda t, s: torch.as_strided_scatter(t, s, (2, 2), (1, 3), 1), torch.randn(3, 3),
                     torch.randn(2, 2))


def test_flash_attention_kernel_returns_the_logsumexp():
    import torch

    torch.manual_seed(7)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    for causal in (False, True):
        _assert_same(lambda a, b, c: kernel(a, b, c, is_causal=causal), q, k, v)
    _assert_same(lambda a, b, c: kernel(a, b, c, scale=0.3), q, k, v)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_on_volumes(mode, padding_mode, align_corners):
    """Grid points inside and outside the volume (zeros padding reads 0 there, border clamps),
    through aten's grid_sampler_3d as op_db calls it, and through F.grid_sample."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(8)
    x = torch.randn(2, 3, 4, 5, 6)
    grid = torch.rand(2, 3, 2, 4, 3) * 2.4 - 1.2
    modes = {"bilinear": 0, "nearest": 1}
    paddings = {"zeros": 0, "border": 1}
    _assert_same(lambda a, g: torch.grid_sampler_3d(a, g, modes[mode], paddings[padding_mode], align_corners),
                 x, grid)
    _assert_same(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
                 x, grid)


def test_grid_sample_on_volumes_refuses_reflection_padding():
    import torch
    import torch.nn.functional as F

    from ortagent.errors import OrtNotImplemented

    with pytest.raises(OrtNotImplemented, match="reflection"):
        _assert_same(lambda a, g: torch.grid_sampler_3d(a, g, 0, 2, False),
                     torch.randn(1, 1, 2, 3, 4), torch.rand(1, 2, 2, 2, 3) * 2 - 1)


def test_fractional_max_pools_with_their_random_samples():
    """The windows follow torch's intervals computed from the plane's samples (in float32, as
    torch's kernel), values and indices, the gradient to the index."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(9)
    samples = torch.rand(2, 3, 2)
    _assert_same(lambda a: F.fractional_max_pool2d(a, (2, 3), output_size=(7, 5), _random_samples=samples,
                                                   return_indices=True), torch.randn(2, 3, 23, 17))
    samples = torch.rand(2, 2, 3)
    _assert_same(lambda a: F.fractional_max_pool3d(a, (2, 3, 2), output_size=(5, 4, 3), _random_samples=samples,
                                                   return_indices=True), torch.randn(2, 2, 13, 11, 9))
    samples = torch.rand(1, 3, 2)
    _assert_same(lambda a: F.fractional_max_pool2d(a, 3, output_size=1, _random_samples=samples),
                 torch.randn(1, 3, 9, 9))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("full", [False, True])
def test_gaussian_nll_loss_matches_with_its_shapes_and_clamp(reduction, full):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(10)
    x, target = torch.randn(4, 3), torch.randn(4, 3)
    _assert_same(lambda i, t, v: F.gaussian_nll_loss(i, t, v, full=full, reduction=reduction), x, target,
                 torch.rand(4, 3) * 2)
    # one variance per sample (the last axis dropped, or of size 1); variances under eps clamped
    _assert_same(lambda i, t, v: F.gaussian_nll_loss(i, t, v, reduction=reduction), x, target, torch.rand(4))
    _assert_same(lambda i, t, v: F.gaussian_nll_loss(i, t, v, eps=0.1, reduction=reduction), x, target,
                 torch.tensor([[0.0], [0.05], [1.0], [2.0]]))


def test_gaussian_nll_loss_keeps_torch_s_check_on_a_negative_variance():
    """Eager raises ValueError on a negative variance; the graph fails its run there (an
    OrtInvalidArgument, a ValueError too, whose message says what eager's says) rather than
    return a number."""
    import torch

    from ortagent.torch import ORTModule

    loss = ORTModule(torch.nn.GaussianNLLLoss())
    x, target, var = torch.randn(4, 2), torch.randn(4, 2), torch.rand(4, 2) + 0.1
    torch.testing.assert_close(loss(x, target, var), torch.nn.GaussianNLLLoss()(x, target, var))
    negative = var.clone()
    negative[2, 1] = -0.5
    with pytest.raises(ValueError):
        torch.nn.GaussianNLLLoss()(x, target, negative)
    with pytest.raises(ValueError, match="var has negative entry"):
        loss(x, target, negative)
    torch.testing.assert_close(loss(x, target, var), torch.nn.GaussianNLLLoss()(x, target, var))
    # the first call of a graph fails so too (not as a graph onnxruntime cannot run)
    with pytest.raises(ValueError, match="var has negative entry"):
        ORTModule(torch.nn.GaussianNLLLoss())(x, target, negative)


def test_a_tensor_check_of_the_forward_is_kept_in_the_graph():
    """``torch._check_tensor_all`` in the forward (transformers' ``torch_compilable_check``:
    a vision-language model's image tokens against its image features) exported, where
    torch.onnx had no translation of the assertion's ``_is_all_true`` (LLaVA was refused). The
    graph keeps the check: an input that fails it, at a shape the export already serves (no
    trace runs then), stops the run with a ValueError as eager raises, and the next call works."""
    import copy

    import torch

    from ortagent.torch import ORTModule

    class Placeholders(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.project = torch.nn.Linear(3, 4)

        def forward(self, ids, features):
            mask = ids == 9
            torch._check_tensor_all(mask.sum() == features.shape[0] * features.shape[1])
            hidden = self.embed(ids).masked_scatter(mask.unsqueeze(-1), self.project(features))
            return hidden.tanh()

    torch.manual_seed(0)
    eager = Placeholders()
    model = ORTModule(copy.deepcopy(eager))

    def inputs(batch, length, placeholders):
        ids = torch.randint(0, 9, (batch, length), generator=torch.Generator().manual_seed(length))
        ids[:, 1:1 + placeholders] = 9
        return ids, torch.randn(batch, placeholders, 3, requires_grad=True)

    for batch, length, placeholders in ((2, 7, 3), (3, 9, 2), (2, 7, 3)):
        ids, features = inputs(batch, length, placeholders)
        results = []
        for module in (eager, model):
            given = features.detach().clone().requires_grad_()
            out = module(ids, given)
            out.square().sum().backward()
            results.append((out, given.grad, [p.grad.clone() for p in module.parameters()]))
            module.zero_grad()
        (want, want_grad, want_params), (got, got_grad, got_params) = results
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_grad, want_grad)
        for a, b in zip(got_params, want_params):
            torch.testing.assert_close(a, b)
    ids, features = inputs(2, 7, 3)
    ids[0, 1] = 0                                   # one placeholder short
    with pytest.raises(RuntimeError):
        eager(ids, features)
    with pytest.raises(ValueError, match="torch._check_tensor_all"):
        model(ids, features)
    ids, features = inputs(2, 7, 3)
    torch.testing.assert_close(model(ids, features), eager(ids, features))
