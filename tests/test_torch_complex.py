"""Complex results of an ORTModule forward against torch eager: torch.onnx writes a complex
tensor as a real one with a trailing axis of 2, the bridge views the graph's output back as
complex and hands the real view of torch's complex gradient to the graph's backward; the
inverse onesided DFT (irfft, hfft) is differentiated by ortagent's own reverse rule. Each case
compares every output (real and imaginary parts) and every parameter and input gradient with
torch's own autograd, so a wrong view, a wrong gradient convention or a wrong rule fails."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def _close(actual, expected, what):
    import torch

    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, eager {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual.resolve_conj()), torch.view_as_real(expected.resolve_conj())
    scale = max(float(expected.abs().max()), 1.0)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")


class _Spectra:
    """A Linear, then the onesided spectrum of its output and a real signal made back from a
    scaled copy of that spectrum (irfft with the given length and norm)."""

    def __new__(cls, features, n, norm, dtype=None):
        import torch

        class Spectra(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(features, features)
                self.gain = torch.nn.Parameter(torch.linspace(0.5, 1.5, features // 2 + 1))

            def forward(self, x):
                h = self.linear(x)
                spectrum = torch.fft.rfft(h, norm=norm)
                signal = torch.fft.irfft(spectrum * self.gain, n=n, norm=norm)
                return spectrum, signal

        torch.manual_seed(0)
        module = Spectra()
        return module.to(dtype) if dtype is not None else module


def _run(module, x, loss):
    """The outputs and the gradients of ``loss(outputs)`` w.r.t. the parameters and ``x``,
    eagerly and through ORTModule (from copies of the same state)."""
    import copy

    import torch

    from ortagent.torch import ORTModule

    results = []
    for wrap in (False, True):
        inner = copy.deepcopy(module)
        model = ORTModule(inner) if wrap else inner
        leaf = x.detach().clone().requires_grad_(True)
        outputs = model(leaf)
        wanted = [*inner.parameters(), leaf]
        grads = torch.autograd.grad(loss(outputs), wanted, allow_unused=True)
        grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wanted)]
        results.append(([o.detach() for o in outputs], grads))
    return results


def _weighted(outputs):
    """A real loss with fixed weights on each output's real view (real and imaginary parts)."""
    import torch

    generator = torch.Generator().manual_seed(7)
    total = 0
    for out in outputs:
        view = torch.view_as_real(out) if out.is_complex() else out
        total = total + (view * torch.randn(view.shape, generator=generator, dtype=view.dtype)).sum()
    return total


@pytest.mark.parametrize("features, n, norm", [(8, None, None), (7, None, None), (8, 9, "ortho"),
                                               (9, 9, "forward"), (6, 5, "ortho")])
def test_rfft_and_irfft_of_a_linear_match_eager(features, n, norm):
    import torch

    module = _Spectra(features, n, norm)
    x = torch.randn(3, features, generator=torch.Generator().manual_seed(1))
    (eager_out, eager_grads), (ort_out, ort_grads) = _run(module, x, _weighted)
    assert ort_out[0].dtype == torch.complex64 and ort_out[1].dtype == torch.float32
    for index, (a, e) in enumerate(zip(ort_out, eager_out)):
        _close(a, e, f"output {index}")
    names = [name for name, _ in module.named_parameters()] + ["x"]
    for name, a, e in zip(names, ort_grads, eager_grads):
        _close(a, e, f"gradient of {name}")


@pytest.mark.parametrize("part", ["abs", "real", "imag", "conj", "angle"])
def test_complex_result_gradient_from_a_real_loss(part):
    """torch hands back grad = dL/dRe + i dL/dIm for a real loss L: the bridge's gradient of
    the real view must give the parameters eager's gradients, whatever view of the complex
    result the loss reads (a conjugate one carries torch's conj bit)."""
    import torch

    losses = {
        "abs": lambda outs: (outs[0].abs() ** 2).sum() + outs[0].abs().sum(),
        "real": lambda outs: (outs[0].real * torch.arange(outs[0].shape[-1])).sum(),
        "imag": lambda outs: (outs[0].imag ** 3).sum(),
        "conj": lambda outs: (outs[0].conj() * (1 + 2j)).real.sum() + outs[1].sum(),
        "angle": lambda outs: outs[0][:, 1:-1].angle().sum(),
    }
    module = _Spectra(8, None, "ortho")
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    (_, eager_grads), (_, ort_grads) = _run(module, x, losses[part])
    for index, (a, e) in enumerate(zip(ort_grads, eager_grads)):
        _close(a, e, f"gradient {index} ({part})")


def test_complex128_from_float64_and_inference():
    import torch

    from ortagent.torch import ORTModule

    module = _Spectra(6, None, None, dtype=torch.float64)
    x = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (eager_out, eager_grads), (ort_out, ort_grads) = _run(module, x, _weighted)
    assert ort_out[0].dtype == torch.complex128
    for a, e in zip([*ort_out, *ort_grads], [*eager_out, *eager_grads]):
        _close(a, e, "float64 model")
    with torch.no_grad():           # the inference session's outputs are viewed as complex too
        spectrum, signal = ORTModule(module)(x)
        expected = module(x)
    _close(spectrum, expected[0], "inference spectrum")
    _close(signal, expected[1], "inference signal")


@pytest.mark.parametrize("function", ["view_as_complex", "polar", "fft", "irfftn", "hfft", "fft2_padded",
                                      "ihfft2_padded", "pad", "conj_physical", "unsqueeze"])
def test_complex_ops_of_inputs_match_eager(function):
    """Input gradients through complex-valued ops and the multi-axis inverse onesided DFT; a
    complex unsqueeze, which failed in torch.onnx (Llama 4's rotary embedding)."""
    import torch

    from ortagent.torch import ORTModule

    functions = {
        "view_as_complex": lambda a, b: torch.view_as_complex(torch.stack([a, b], -1)) * (2 - 1j),
        "polar": lambda a, b: torch.polar(a.abs() + 0.5, b),
        "fft": lambda a, b: torch.fft.fft(a * b, dim=0),
        "irfftn": lambda a, b: torch.fft.irfftn(torch.complex(a, b), s=(4, 7), dim=(0, 1), norm="ortho"),
        "hfft": lambda a, b: torch.fft.hfft(torch.complex(a, b), n=5),
        # complex pads and conjugations, which torch.onnx translates only through real views
        "fft2_padded": lambda a, b: torch.fft.fft2(a * b, s=(3, 7), norm="ortho"),
        "ihfft2_padded": lambda a, b: torch.fft.ihfft2(a - b, s=(6, 5)),
        "pad": lambda a, b: torch.nn.functional.pad(torch.fft.fft(a + b), (1, 2, 0, 1)),
        "conj_physical": lambda a, b: torch.conj_physical(torch.fft.rfft(a)) * torch.fft.rfft(b),
        # Llama 4's rotary embedding: complex frequencies unsqueezed to broadcast over the heads
        # (torch.onnx has no complex unsqueeze: written through the real view)
        "unsqueeze": lambda a, b: torch.view_as_real(
            torch.view_as_complex(torch.stack([a, b], -1)).unsqueeze(0).unsqueeze(-2) *
            torch.polar(torch.ones(4, 1, 4), b.unsqueeze(1))).flatten(-2),
    }

    class Wrapped(torch.nn.Module):
        def forward(self, a, b):
            return functions[function](a, b)

    generator = torch.Generator().manual_seed(4)
    a, b = torch.randn(4, 4, generator=generator), torch.randn(4, 4, generator=generator)
    results = []
    for model in (Wrapped(), ORTModule(Wrapped())):
        leaves = [a.clone().requires_grad_(True), b.clone().requires_grad_(True)]
        out = model(*leaves)
        results.append((out.detach(), torch.autograd.grad(_weighted([out]), leaves)))
    (e_out, e_grads), (o_out, o_grads) = results
    _close(o_out, e_out, f"{function} output")
    for index, (g, e) in enumerate(zip(o_grads, e_grads)):
        _close(g, e, f"{function} gradient {index}")


def test_complex_arguments_and_complex32_results_are_refused():
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Scale(torch.nn.Module):
        def forward(self, z):
            return z * 2

    with pytest.raises(OrtNotImplemented, match="complex tensors cross only as results"):
        ORTModule(Scale())(torch.randn(3, dtype=torch.complex64))

    class Half(torch.nn.Module):
        def forward(self, x):
            return x.chalf()

    with pytest.raises(OrtNotImplemented, match="complex32"):
        ORTModule(Half())(torch.randn(3, 2, requires_grad=True))


def test_sweep_compares_imaginary_parts_and_weights_them():
    """The op sweep's comparison (tests/torch_sweep.py) reads complex outputs through their
    real views: a wrong imaginary part is a difference, and a complex output has a loss weight."""
    import torch

    torch_sweep = pytest.importorskip("torch_sweep")
    z = torch.complex(torch.randn(5), torch.randn(5))
    assert torch_sweep._compare_tensors("output", [z.clone()], [z], None) is None
    assert torch_sweep._compare_tensors("output", [z.conj().resolve_conj()], [z], None) is not None
    assert torch_sweep._compare_tensors("output", [z.real.clone()], [z], None) is not None
    weights = torch_sweep._loss_weights([z], 0)
    assert weights[0] is not None and weights[0].shape == (5, 2) and weights[0].dtype == torch.float32
