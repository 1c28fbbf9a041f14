"""ortagent's linear-algebra translations (ortagent/torch/translations/linalg.py) and the reverse
rules of com.microsoft:Inverse and Det (ortagent/_ad_rules.py): a Linear layer whose output is
reshaped to (batches of) square matrices, made well-conditioned, then inverted, solved against,
factorised; outputs and every parameter gradient through ORTModule against torch eager, for
several shapes, both triangles, both sides, and matrices where the gradient must stay finite
(a singular determinant) or the ``info`` output must say that a factorisation failed."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def _net(n, batch, head):
    """A module: x (rows, 4) -> Linear -> (rows, *batch, n, n) matrices + 3 I -> head(matrices)."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            count = n * n
            for size in batch:
                count *= size
            self.linear = torch.nn.Linear(4, count)
            self.rhs = torch.nn.Parameter(torch.randn(n, 2))

        def forward(self, x):
            matrices = self.linear(x).reshape(x.shape[0], *batch, n, n)
            matrices = matrices + 3.0 * torch.eye(n)
            return head(matrices, self.rhs)

    return Net


def _compare(n, head, batch=(), rows=3, seed=0, rtol=2e-4):
    """Outputs and every parameter gradient of ``head`` through ORTModule against eager."""
    import torch
    from torch.utils import _pytree as pytree

    from ortagent.torch import ORTModule

    torch.manual_seed(seed)
    net_class = _net(n, batch, head)
    eager = net_class()
    wrapped = net_class()
    wrapped.load_state_dict(eager.state_dict())
    x = torch.randn(rows, 4)

    def run(module):
        result = module(x)
        outputs = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        generator = torch.Generator().manual_seed(seed + 1)
        loss = sum((out * torch.randn(out.shape, generator=generator)).sum()
                   for out in outputs if out.is_floating_point())
        loss.backward()
        return outputs

    expected = run(eager)
    actual = run(ORTModule(wrapped))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        if e.is_floating_point():
            torch.testing.assert_close(a, e, rtol=rtol, atol=rtol * max(1.0, float(e.detach().abs().max())))
        else:
            assert torch.equal(a, e)
    eager_params = dict(eager.named_parameters())
    compared = 0
    for name, param in wrapped.named_parameters():
        reference = eager_params[name].grad
        if reference is None:
            assert param.grad is None or not param.grad.any(), name
            continue
        assert param.grad is not None, name
        torch.testing.assert_close(param.grad, reference, rtol=rtol,
                                   atol=rtol * max(1.0, float(reference.abs().max())))
        compared += 1
    assert compared >= 1


@pytest.mark.parametrize("n,batch", [(3, ()), (5, ()), (4, (2,))])
def test_inverse(n, batch):
    import torch

    _compare(n, lambda m, rhs: torch.linalg.inv(m), batch=batch)


@pytest.mark.parametrize("n,batch", [(3, ()), (4, (2,))])
def test_inverse_ex_and_its_info(n, batch):
    import torch

    _compare(n, lambda m, rhs: torch.linalg.inv_ex(m), batch=batch)


def test_solve_matrix_vector_and_right_hand():
    import torch

    _compare(3, lambda m, rhs: torch.linalg.solve(m, rhs))
    _compare(3, lambda m, rhs: torch.linalg.solve(m, rhs[:, 0]))
    _compare(3, lambda m, rhs: torch.linalg.solve(m, rhs.mT, left=False))
    _compare(4, lambda m, rhs: torch.linalg.solve_ex(m, rhs), batch=(2,))


def test_tensorinv_and_tensorsolve():
    import torch

    _compare(4, lambda m, rhs: torch.linalg.tensorinv(m[0].reshape(4, 2, 2), ind=1))
    _compare(4, lambda m, rhs: torch.linalg.tensorsolve(m[0], rhs[:, 0]))


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("unitriangular", [False, True])
def test_triangular_solves_read_one_triangle(upper, unitriangular):
    import torch

    _compare(3, lambda m, rhs: torch.linalg.solve_triangular(m, rhs, upper=upper, unitriangular=unitriangular))
    _compare(4, lambda m, rhs: torch.linalg.solve_triangular(m, rhs.mT, upper=upper, left=False,
                                                             unitriangular=unitriangular), batch=(2,))
    _compare(4, lambda m, rhs: torch.triangular_solve(rhs, m, upper=upper, transpose=True,
                                                      unitriangular=unitriangular)[0])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(upper):
    import torch

    # a triangular factor, and a full one (torch reads one triangle, differentiates the whole)
    _compare(3, lambda m, rhs: torch.cholesky_solve(rhs, torch.linalg.cholesky(m @ m.mT, upper=upper), upper=upper))
    _compare(4, lambda m, rhs: torch.cholesky_solve(rhs, m, upper=upper), batch=(2,))
    _compare(3, lambda m, rhs: torch.cholesky_inverse(m, upper=upper))


@pytest.mark.parametrize("n,batch", [(3, ()), (5, (2,))])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(n, batch, upper):
    import torch

    _compare(n, lambda m, rhs: torch.linalg.cholesky(m @ m.mT + m, upper=upper), batch=batch)
    _compare(n, lambda m, rhs: torch.linalg.cholesky_ex(m @ m.mT, upper=upper), batch=batch)


def test_cholesky_info_names_the_first_minor_that_is_not_positive_definite():
    import torch

    from ortagent.torch import ORTModule

    class Factor(torch.nn.Module):
        def forward(self, a):
            return torch.linalg.cholesky_ex(a)

    a = torch.eye(4).repeat(3, 1, 1)
    a[1, 2, 2] = -1.0
    a[2, 0, 0] = 0.0
    _, info = ORTModule(Factor())(a)
    assert torch.equal(info, torch.linalg.cholesky_ex(a).info)
    assert info.tolist() == [0, 3, 1]


def test_inverse_info_tells_a_singular_matrix():
    import torch

    from ortagent.torch import ORTModule

    class Invert(torch.nn.Module):
        def forward(self, a):
            return torch.linalg.inv_ex(a)

    a = torch.eye(3).repeat(2, 1, 1)
    a[1] = 0.0
    _, info = ORTModule(Invert())(a)
    assert info[0] == 0 and info[1] != 0
    assert (info != 0).tolist() == (torch.linalg.inv_ex(a).info != 0).tolist()


@pytest.mark.parametrize("n,batch", [(1, ()), (3, ()), (4, (2,))])
def test_det_slogdet_logdet(n, batch):
    import torch

    _compare(n, lambda m, rhs: torch.linalg.det(m), batch=batch)
    _compare(n, lambda m, rhs: torch.linalg.slogdet(m), batch=batch)
    _compare(n, lambda m, rhs: torch.logdet(m @ m.mT), batch=batch)


@pytest.mark.parametrize("rows", [[[0.0, 2.0, 3.0], [0.0, 4.0, 7.0], [0.0, -1.0, 2.0]],
                                  [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                                  [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]]])
def test_det_gradient_at_singular_and_regular_matrices_is_torchs(rows):
    """At an exactly singular matrix torch's gradient is 0 (not the adjugate, nonzero for these
    two of rank 2): the same here, finite, where det(A) inverse(A)^T would be 0 * inf. The
    singular matrices have a zero column or row, which every LU factorisation sees exactly; a
    matrix singular only through its elimination (one row twice another) is not compared:
    torch's float32 LU on some CPUs ends with a pivot of about 1e-7 instead of 0 (det 3.6e-7,
    hence about the adjugate), on others with 0."""
    import torch

    from ortagent.torch import ORTModule

    class Det(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor(rows))

        def forward(self, scale):
            return torch.linalg.det(self.a * scale)

    eager, wrapped = Det(), Det()
    scale = torch.ones(())
    eager(scale).backward()
    ORTModule(wrapped)(scale).backward()
    assert wrapped.a.grad is not None and torch.isfinite(wrapped.a.grad).all()
    torch.testing.assert_close(wrapped.a.grad, eager.a.grad, rtol=1e-5, atol=1e-5)


def test_det_gradient_of_a_large_matrix_is_refused():
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Det(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.eye(17))

        def forward(self, scale):
            return torch.linalg.det(self.a * scale)

    with pytest.raises(OrtNotImplemented, match="Det"):
        ORTModule(Det())(torch.ones(()))


def test_what_has_no_exact_composition_stays_refused():
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Pinv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.randn(4, 3))

        def forward(self, scale):
            return torch.linalg.pinv(self.a * scale)

    with pytest.raises(OrtNotImplemented):
        ORTModule(Pinv())(torch.ones(()))


def _compare_inputs(function, *inputs, rtol=2e-4):
    """``function`` of the given tensors through ORTModule against eager: outputs and the
    gradients of the floating-point inputs."""
    import torch

    from ortagent.torch import ORTModule

    class Wrapped(torch.nn.Module):
        def forward(self, *tensors):
            return function(*tensors)

    def run(module):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        result = module(*leaves)
        outputs = list(result) if isinstance(result, tuple) else [result]
        generator = torch.Generator().manual_seed(7)
        loss = sum((out * torch.randn(out.shape, generator=generator)).sum() for out in outputs)
        loss.backward()
        return [o.detach() for o in outputs], [t.grad for t in leaves if t.requires_grad]

    (expected, expected_grads), (actual, grads) = run(Wrapped()), run(ORTModule(Wrapped()))
    for a, e in list(zip(actual, expected)) + list(zip(grads, expected_grads)):
        torch.testing.assert_close(a, e, rtol=rtol, atol=rtol * max(1.0, float(e.abs().max())))


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3), (3, 5), (5, 3)])
def test_lu_unpack(shape):
    import torch

    torch.manual_seed(3)
    lu, pivots = torch.linalg.lu_factor(torch.randn(shape))
    assert (pivots != torch.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype)).any()     # real swaps
    _compare_inputs(lambda f, p: torch.lu_unpack(f, p), lu, pivots)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve(left, adjoint):
    import torch

    torch.manual_seed(4)
    lu, pivots = torch.linalg.lu_factor(torch.randn(2, 4, 4) + 2.0 * torch.eye(4))
    b = torch.randn(2, 4, 3) if left else torch.randn(2, 3, 4)
    _compare_inputs(lambda f, p, rhs: torch.linalg.lu_solve(f, p, rhs, left=left, adjoint=adjoint), lu, pivots, b)
