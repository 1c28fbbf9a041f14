"""ortagent's translations of the aten operators torch.onnx cannot translate
(ortagent/torch/translations): each runs through ORTModule and matches torch eager on its
outputs (integers exactly) and on every gradient, on cases the op_db sweep's first samples do
not reach: ties, 0-d inputs, keepdim, other dimensions and sizes, negative arguments."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def _run(function, *inputs, seed=0):
    """(outputs, gradients) of ``function`` eagerly and through ORTModule, from the same inputs
    and the same random output weights."""
    import torch
    from torch.utils import _pytree as pytree

    from ortagent.torch import ORTModule

    class Wrapped(torch.nn.Module):
        def forward(self, *tensors):
            return function(*tensors)

    def one(module):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        result = module(*leaves)
        outputs = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        generator = torch.Generator().manual_seed(seed)
        loss = sum((out * torch.randn(out.shape, generator=generator)).sum()
                   for out in outputs if out.is_floating_point())
        grads = torch.autograd.grad(loss, [t for t in leaves if t.requires_grad], allow_unused=True)
        return result, [o.detach() for o in outputs], grads

    return one(Wrapped()), one(ORTModule(Wrapped()))


def _assert_same(function, *inputs, rtol=1e-4, atol=1e-5):
    import torch

    (eager_result, expected, expected_grads), (result, actual, grads) = _run(function, *inputs)
    assert type(result) is type(eager_result)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        if e.is_floating_point():
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol * max(1.0, float(e[e.isfinite()].abs().max())
                                                                        if e.isfinite().any() else 1.0),
                                       equal_nan=True)
        else:
            assert torch.equal(a, e)
    for a, e in zip(grads, expected_grads):
        if e is None:
            assert a is None or not a.any()
            continue
        scale = float(e[e.isfinite()].abs().max()) if e.isfinite().any() else 1.0
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)


# -- pooling ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["max1d", "max2d", "max3d", "avg3d", "max2d_unbatched", "max2d_indices"])
def test_adaptive_pools_with_uneven_windows(case):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(1)
    function, shape = {
        "max1d": (lambda x: F.adaptive_max_pool1d(x, 4), (2, 3, 11)),
        "max2d": (lambda x: F.adaptive_max_pool2d(x, (3, 5)), (2, 3, 7, 9)),
        "max3d": (lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)), (1, 2, 5, 7, 3)),
        "avg3d": (lambda x: F.adaptive_avg_pool3d(x, (3, 2, 4)), (2, 2, 7, 5, 9)),
        "max2d_unbatched": (lambda x: F.adaptive_max_pool2d(x, 4), (3, 6, 10)),
        "max2d_indices": (lambda x: F.adaptive_max_pool2d(x, (2, 3), return_indices=True), (2, 3, 5, 7)),
    }[case]
    _assert_same(function, torch.randn(shape))


@pytest.mark.parametrize("case", ["no_bias", "no_bias_unbatched", "bias_groups_dilation", "same_padding"])
def test_conv3d_with_and_without_bias(case):
    """A Conv3d with ``bias=False`` (every convolution of torchvision's video ResNets):
    torch.onnx's translation gave onnxruntime a bias it refuses."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(2)
    weight = torch.randn(4, 3, 3, 5, 5)
    grouped = torch.randn(6, 2, 3, 3, 3)
    function, inputs = {
        "no_bias": (lambda x, w: F.conv3d(x, w, stride=(1, 2, 2), padding=(1, 2, 2)),
                    (torch.randn(2, 3, 4, 9, 9), weight)),
        "no_bias_unbatched": (lambda x, w: F.conv3d(x, w, padding=1), (torch.randn(3, 4, 7, 6), weight)),
        "bias_groups_dilation": (lambda x, w, b: F.conv3d(x, w, b, padding=(0, 2, 1), dilation=(1, 2, 1), groups=2),
                                 (torch.randn(2, 4, 5, 8, 7), grouped, torch.randn(6))),
        "same_padding": (lambda x, w: F.conv3d(x, w, padding="same"), (torch.randn(2, 3, 4, 9, 9), weight)),
    }[case]
    _assert_same(function, *inputs)


# -- reductions and scans -------------------------------------------------------------------------

def test_amax_amin_aminmax_of_0d_tensors_and_ties():
    import torch

    scalar = torch.tensor(1.5)
    _assert_same(lambda x: (torch.amax(x), torch.amin(x, 0), torch.amax(x, 0, keepdim=True)), scalar)
    tied = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.5]])
    _assert_same(lambda x: torch.aminmax(x, dim=1, keepdim=True), tied)
    _assert_same(lambda x: torch.aminmax(x), tied)


def test_squeeze_over_several_dims_keeps_the_others():
    import torch

    x = torch.randn(1, 3, 1, 2, 1)
    _assert_same(lambda t: t.squeeze((0, 1, 4)), x)
    _assert_same(lambda t: (t.squeeze(3), t.squeeze(-1)), x)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod_through_zeros_and_cummax_cummin_ties(dim):
    import torch

    torch.manual_seed(2)
    x = torch.randn(5, 13)
    x[2, 4] = 0.0
    x[0, 7] = 0.0
    _assert_same(lambda t: torch.cumprod(t, dim), x)
    tied = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 4.0, 4.0], [2.0, 2.0, 0.5, 0.5, 7.0, 1.0, 1.0]])
    _assert_same(lambda t: (torch.cummax(t, dim), torch.cummin(t, dim)), tied if dim else tied.t().contiguous())


# -- order statistics -----------------------------------------------------------------------------

def test_median_of_a_tensor_shares_the_gradient_among_ties():
    import torch

    tied = torch.tensor([[3.0, 1.0, 2.0], [2.0, 5.0, 2.0]])        # lower median 2, three times
    _assert_same(torch.median, tied)
    _assert_same(torch.nanmedian, torch.tensor([float("nan"), 4.0, 1.0, 4.0, float("nan"), 9.0]))
    _assert_same(torch.median, torch.randn(4, 6))


@pytest.mark.parametrize("keepdim", [False, True])
def test_median_kthvalue_along_a_dimension(keepdim):
    import torch

    torch.manual_seed(3)
    x = torch.randn(4, 7, 5)
    _assert_same(lambda t: torch.median(t, 1, keepdim=keepdim), x)
    _assert_same(lambda t: torch.kthvalue(t, 3, 0, keepdim=keepdim), x)
    _assert_same(lambda t: torch.kthvalue(t, 5, -1, keepdim=keepdim), x)
    with_nan = x.clone()
    with_nan[1, 2, 3] = float("nan")
    with_nan[2, 1:5, 0] = float("nan")
    _assert_same(lambda t: torch.nanmedian(t, 1, keepdim=keepdim), with_nan)


def test_kthvalue_and_median_of_a_0d_tensor():
    import torch

    scalar = torch.tensor(0.25)
    _assert_same(lambda t: (torch.kthvalue(t, 1), torch.median(t, 0)), scalar)


# -- elementwise ------------------------------------------------------------------------------------

def test_fmax_fmin_copysign_hypot_with_nan_ties_and_signed_zeros():
    import torch

    a = torch.tensor([1.0, 5.0, 2.0, -3.0, 0.0, 4.0])
    b = torch.tensor([2.0, 1.0, 7.0, -3.0, -0.0, -1.0])
    _assert_same(lambda x, y: (torch.fmax(x, y), torch.fmin(x, y)), a, b)
    # a NaN operand is ignored (its own gradient is where ortagent and torch part: see elementwise.py)
    nan = float("nan")
    _assert_same(lambda x, y: (torch.fmax(x, y.detach()), torch.fmin(x, y.detach())),
                 torch.tensor([1.0, 3.0, nan]), torch.tensor([nan, 2.0, nan]))
    _assert_same(lambda x, y: torch.copysign(x, y), torch.tensor([1.0, -2.0, 0.0, 3.0, -4.0, 5.0]), b.nan_to_num())
    _assert_same(lambda x: torch.copysign(x, -1.0), torch.randn(5))
    _assert_same(lambda x, y: torch.hypot(x, y), torch.randn(3, 4), torch.randn(4))


# -- special functions ------------------------------------------------------------------------------

def test_gamma_family_over_negative_and_large_arguments():
    import torch

    x = torch.linspace(-9.7, 9.9, 120)
    _assert_same(torch.lgamma, x)
    _assert_same(torch.digamma, x)
    _assert_same(torch.lgamma, torch.linspace(0.1, 3000.0, 50))
    for n in (1, 2, 3):
        _assert_same(lambda t, n=n: torch.polygamma(n, t), torch.linspace(-4.7, 12.0, 80))
    _assert_same(lambda t: torch.mvlgamma(t, 3), torch.linspace(1.2, 9.0, 30))


def test_digamma_and_lgamma_values_at_their_poles_are_torch_s():
    import torch

    from ortagent.torch import ORTModule

    class Poles(torch.nn.Module):
        def forward(self, x):
            return torch.digamma(x), torch.lgamma(x)

    x = torch.tensor([0.0, -1.0, -2.0, 1.0, 2.0, -0.5])
    with torch.no_grad():
        for actual, expected in zip(ORTModule(Poles())(x), Poles()(x)):
            torch.testing.assert_close(actual, expected, equal_nan=True)


def test_erfinv_ndtri_and_bessel_functions():
    import torch

    u = torch.linspace(-0.999, 0.999, 101)
    _assert_same(torch.erfinv, u)
    _assert_same(torch.special.ndtri, (u + 1) / 2)
    wide = torch.linspace(-40.0, 40.0, 161)
    for function in (torch.i0, torch.special.i0e, torch.special.i1, torch.special.i1e):
        _assert_same(function, wide)


# -- attention --------------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths", [(5, 7), (9, 4), (6, 6)])
def test_causal_attention_with_unequal_lengths(lengths):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(4)
    q_len, kv_len = lengths
    q, k, v = torch.randn(2, 3, q_len, 8), torch.randn(2, 3, kv_len, 8), torch.randn(2, 3, kv_len, 4)
    _assert_same(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v)
    _assert_same(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, scale=0.3), q[0], k[0], v[0])
    _assert_same(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True),
                 torch.randn(2, 6, q_len, 8), k, v)


@pytest.mark.parametrize("case", ["3d", "5d_float_mask", "5d_bool_mask_with_a_hidden_row", "3d_gqa"])
def test_attention_on_other_ranks_than_four(case):
    """scaled_dot_product_attention on 3-d and 5-d query, key and value (timm's windowed
    attention in Twins, NesT, Hiera): torch.onnx's translation takes 4-d ones only. A row
    whose keys are all masked attends to nothing (zeros, no NaN in the gradient), as torch."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(7)
    if case == "3d":
        q, k, v = torch.randn(3, 5, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 4)
        _assert_same(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=0.4), q, k, v)
    elif case == "5d_float_mask":
        q, k, v = torch.randn(2, 2, 3, 4, 8), torch.randn(2, 2, 3, 4, 8), torch.randn(2, 2, 3, 4, 8)
        bias = torch.randn(2, 1, 4, 4)
        _assert_same(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), q, k, v, bias)
    elif case == "5d_bool_mask_with_a_hidden_row":
        q, k, v = torch.randn(2, 2, 3, 4, 8), torch.randn(2, 2, 3, 5, 8), torch.randn(2, 2, 3, 5, 8)
        mask = torch.rand(4, 5) > 0.4
        mask[1] = False
        mask[0, 0] = True
        _assert_same(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask), q, k, v)
    else:
        q, k, v = torch.randn(4, 5, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
        _assert_same(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True), q, k, v)


# -- rsub -------------------------------------------------------------------------------------------

def test_number_minus_a_tensor_in_torch_promoted_type():
    """``1.0 - mask`` of an integer mask (XLNet's input mask): torch.onnx's decomposition of
    rsub failed on it; the result's type is torch's (float for a float number, the tensor's
    own otherwise), alpha included."""
    import torch

    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    x = torch.randn(2, 3)
    _assert_same(lambda m, t: ((1.0 - m) * t, 3 - m, 2.5 - t, torch.rsub(t, 2.0, alpha=3),
                               torch.rsub(m, 1.5, alpha=2)), mask, x)


# -- mixture of experts ------------------------------------------------------------------------------

@pytest.mark.parametrize("counts", [(3, 0, 4, 2), (0, 0, 9, 0), (2, 2, 2, 1)])
def test_grouped_matrix_product_of_experts(counts):
    """transformers' grouped product (``transformers::grouped_mm_fallback``, what its experts
    run under export): rows sorted by expert, each expert's span multiplied by its weight;
    empty experts, and rows past the last span (zeros). Eager runs transformers' own loop and
    its registered backward."""
    import torch

    pytest.importorskip("transformers")
    moe = pytest.importorskip("transformers.integrations.moe")
    product = getattr(moe, "_grouped_mm_fallback", None)
    if product is None or not hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        pytest.skip("this transformers has no grouped_mm_fallback operator")
    torch.manual_seed(6)
    offs = torch.tensor(counts).cumsum(0)
    x, w = torch.randn(10, 8), torch.randn(len(counts), 8, 5)
    _assert_same(lambda a, b, o: torch.ops.transformers.grouped_mm_fallback(a, b, o), x, w, offs)


# -- torch.return_types ------------------------------------------------------------------------------

def test_return_types_come_back_as_torch_returns_them():
    import torch

    x = torch.randn(3, 5)
    _assert_same(lambda t: torch.max(t, 1), x)
    _assert_same(lambda t: torch.sort(t, 1), x)
    _assert_same(lambda t: torch.topk(t, 2), x)
    _assert_same(lambda t: torch.kthvalue(t, 2, 1), x)


# -- as_strided ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["transposed", "overlapping_windows_of_a_transposed_view", "offset_slice",
                                  "explicit_offset", "contiguous_windows", "method_and_function"])
def test_as_strided_reads_storage_as_torch(case):
    """``as_strided`` reads its input's storage, not its logical order: on a transposed view
    torch.onnx's translation read other elements (Longformer's chunked attention differed
    silently, its gradients 4e-3 off); overlapping windows add up their gradients."""
    import torch

    torch.manual_seed(3)
    x = torch.randn(6, 4)
    functions = {
        "transposed": lambda t: t.t().as_strided((3, 4), (1, 3)),
        # Longformer's _chunk: a view of a transposed tensor, windows overlapping by half
        "overlapping_windows_of_a_transposed_view":
            lambda t: t.t().reshape(2, 2, 6).as_strided((2, 3, 2, 2), (1, 4, 2, 8)),
        "offset_slice": lambda t: t[2:].t().as_strided((2, 2), (1, 4)),
        "explicit_offset": lambda t: t[1:].as_strided((2, 3), (4, 1), 6),
        "contiguous_windows": lambda t: t.reshape(-1).as_strided((5, 8), (4, 1)),
        "method_and_function": lambda t: torch.as_strided(t.t(), (4, 2), (2, 5), 1) * t.t().as_strided((4, 2), (1, 2)),
    }
    _assert_same(functions[case], x)


def test_as_strided_of_a_view_with_gaps_is_refused():
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Gapped(torch.nn.Module):
        def forward(self, t):
            return t[:, ::2].as_strided((2, 2), (1, 2))

    with pytest.raises(OrtNotImplemented, match="do not fill a block"):
        ORTModule(Gapped())(torch.randn(4, 4))
