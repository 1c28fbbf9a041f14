"""ORTModule against torch eager on the operators whose gradients come from ortagent's own
reverse rules and graph rewrites (ortagent/_ad_rules.py, _static_sequences.py, _graph_passes.py)
rather than from onnx-ad: every output and every input gradient, for a fixed random output
gradient, on shapes chosen to hit each rule's corner (windows that overhang the input, splits
whose last piece is short, ...). Each case fails if the rule is wrong: the reference is torch's
own autograd."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def _check(function, *inputs, grad_inputs=None):
    """Run ``function`` eagerly and through ORTModule on copies of ``inputs`` (floating-point
    ones require grad unless ``grad_inputs`` says which); compare outputs and gradients."""
    import torch
    from torch.utils import _pytree as pytree

    from ortagent.torch import ORTModule

    class Wrapped(torch.nn.Module):
        def forward(self, *args):
            return function(*args)

    def fresh():
        copies = []
        for index, value in enumerate(inputs):
            copy = value.detach().clone()
            wanted = copy.is_floating_point() if grad_inputs is None else index in grad_inputs
            copies.append(copy.requires_grad_(wanted))
        return copies

    def run(module):
        args = fresh()
        outputs = [leaf for leaf in pytree.tree_leaves(module(*args)) if isinstance(leaf, torch.Tensor)]
        generator = torch.Generator().manual_seed(0)
        weights = [torch.randn(out.shape, generator=generator, dtype=out.dtype) for out in outputs]
        loss = sum((out * weight).sum() for out, weight in zip(outputs, weights) if out.requires_grad)
        wanted = [arg for arg in args if arg.requires_grad]
        grads = torch.autograd.grad(loss, wanted, allow_unused=True)
        return [out.detach() for out in outputs], grads

    expected_outputs, expected_grads = run(Wrapped())
    outputs, grads = run(ORTModule(Wrapped()))
    assert len(outputs) == len(expected_outputs)
    for actual, expected in zip(outputs, expected_outputs):
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    for actual, expected in zip(grads, expected_grads):
        if expected is None:
            expected = torch.zeros_like(actual)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)


# -- AveragePool with ceil_mode, divisor_override ------------------------------------------------

@pytest.mark.parametrize("shape, options", [
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((2, 3, 9, 8), dict(kernel_size=(4, 4), stride=(2, 3), padding=1, count_include_pad=True)),
    ((1, 2, 10, 11), dict(kernel_size=(6, 6), stride=(3, 3), padding=(3, 2))),       # the ceil rule drops a window
    ((3, 9, 8), dict(kernel_size=(4, 4), stride=(2, 3), padding=1)),                 # no batch axis
    ((2, 3, 10), dict(kernel_size=3, stride=2)),
    ((1, 2, 5, 6, 7), dict(kernel_size=(2, 3, 2), stride=(2, 2, 3), padding=(1, 0, 1), count_include_pad=False)),
])
def test_average_pooling_with_ceil_mode(shape, options):
    """AveragePool(ceil_mode=1): the last windows overhang the input (onnx-ad refuses them)."""
    import torch
    import torch.nn.functional as F

    pool = {3: F.avg_pool1d, 4: F.avg_pool2d, 5: F.avg_pool3d}[len(shape)]
    if len(shape) == 3 and isinstance(options["kernel_size"], tuple):
        pool = F.avg_pool2d                     # (an unbatched image)
    torch.manual_seed(1)
    _check(lambda x: pool(x, ceil_mode=True, **options), torch.randn(*shape))


@pytest.mark.parametrize("shape, options", [
    ((1, 3, 9, 9), dict(kernel_size=3, stride=1, padding=1, ceil_mode=True, count_include_pad=False, divisor_override=2)),
    ((2, 3, 9, 8), dict(kernel_size=(4, 4), stride=(2, 3), padding=1, divisor_override=3)),
    ((3, 9, 8), dict(kernel_size=(4, 4), stride=(2, 3), padding=1, ceil_mode=True, divisor_override=3)),
    ((1, 2, 5, 6, 7), dict(kernel_size=(2, 3, 2), stride=(2, 2, 3), padding=(1, 0, 1), ceil_mode=True,
                           divisor_override=5)),
])
def test_average_pooling_with_a_divisor_override(shape, options):
    """divisor_override, which torch.onnx's own translation drops (it ran and differed)."""
    import torch
    import torch.nn.functional as F

    pool = F.avg_pool3d if len(shape) == 5 else F.avg_pool2d
    torch.manual_seed(2)
    _check(lambda x: pool(x, **options), torch.randn(*shape))


def test_erfcx_is_refused_rather_than_imprecise():
    """torch.onnx's erfcx is exp(x^2) * (1 - erf(x)): -inf where torch's log_ndtr is -39."""
    import torch

    from ortagent.errors import OrtNotImplemented

    with pytest.raises(OrtNotImplemented):
        _check(torch.special.log_ndtr, torch.tensor([-8.5, 0.5, 3.0]))


def test_power_with_an_integer_exponent_in_float32():
    """x ** 2 exports Pow(x, int64 2); onnx-ad refused it for float32 bases."""
    import torch

    torch.manual_seed(3)
    _check(lambda x, y: (x ** 2) * y + torch.pow(y, 3), torch.randn(4, 5), torch.randn(4, 5))
