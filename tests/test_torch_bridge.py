"""ortagent.torch.ORTModule against torch eager autograd: losses, every gradient, running
statistics, dropout masks, optimizer runs, accumulation, eval / no_grad, refusals."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter_available():
    import importlib.util

    if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("onnxscript") is None:
        pytest.skip("onnxscript is not installed (torch.onnx's dynamo exporter needs it; "
                    "make test TORCH=1 installs it)")

RTOL = 1e-4


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def _close(actual, expected, what, rtol=RTOL):
    """max |actual - expected| <= rtol * max|expected| (an elementwise rtol is meaningless for
    entries that are zero up to rounding), with an absolute floor of rtol * 1e-2 = 1e-6;
    returns the max abs error."""
    torch = _torch()
    assert actual is not None, f"{what}: no gradient"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    error = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    scale = expected.double().abs().max().item() if expected.numel() else 0.0
    assert error <= rtol * max(scale, 1e-2), f"{what}: max abs error {error:.3g} at scale {scale:.3g}"
    del torch
    return error


def _train_step(model, inputs, loss_fn):
    out = model(*inputs)
    loss = loss_fn(out)
    loss.backward()
    return loss.detach(), out


def _compare(make_model, make_inputs, loss_fn, *, seed=0, steps=1, check_buffers=True, **options):
    """Train eager and bridged copies of one model side by side (same seed before each step, so
    dropout draws the same masks) and compare losses, gradients, buffers; returns max errors.
    ``options`` go to ORTModule."""
    torch = _torch()
    from ortagent.torch import ORTModule

    torch.manual_seed(seed)
    eager = make_model()
    bridged_inner = copy.deepcopy(eager)
    bridged = ORTModule(bridged_inner, **options)
    errors = {"loss": 0.0, "grad": 0.0}
    for step in range(steps):
        inputs = make_inputs(step)
        torch.manual_seed(1000 + step)
        loss_e, _ = _train_step(eager, inputs, loss_fn)
        torch.manual_seed(1000 + step)
        loss_b, _ = _train_step(bridged, inputs, loss_fn)
        errors["loss"] = max(errors["loss"], _close(loss_b, loss_e, f"step {step} loss"))
        for (name, pe), pb in zip(eager.named_parameters(), bridged_inner.parameters()):
            if pe.grad is None:
                assert pb.grad is None, name
                continue
            errors["grad"] = max(errors["grad"], _close(pb.grad, pe.grad, f"step {step} grad {name}"))
        if check_buffers:
            for (name, be), bb in zip(eager.named_buffers(), bridged_inner.buffers()):
                if be.dtype.is_floating_point:
                    _close(bb, be, f"step {step} buffer {name}")
                else:
                    assert torch.equal(bb, be), name
    return eager, bridged, errors


# -- models ------------------------------------------------------------------------------------------

def _mlp():
    nn = _torch().nn
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 10))


def _cnn():
    nn = _torch().nn
    # no bias reaches a train-mode BatchNorm through linear operations only: such a gradient is
    # zero in exact arithmetic and float32 rounding noise (~1e-6) in eager and bridge alike
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.BatchNorm2d(8, momentum=None), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 2 * 2, 5, bias=False), nn.BatchNorm1d(5))


def _char_gpt_demo():
    """demo/train_char_gpt.py as a module: its CharGPT is the one GPT model of the tests, the
    demo and the benchmark."""
    from conftest import load_file_module

    return load_file_module("train_char_gpt", os.path.join(REPO_ROOT, "demo", "train_char_gpt.py"))


def _ce(out):
    torch = _torch()
    target = torch.arange(out.shape[0], device=out.device) % out.shape[-1]
    return torch.nn.functional.cross_entropy(out, target)


# -- tests -------------------------------------------------------------------------------------------

def test_import_ortagent_does_not_import_torch():
    code = "import sys, ortagent; ortagent.TrainingAgent; ortagent.from_dlpack; " \
           "import ortagent.training; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO_ROOT), timeout=120)
    assert result.returncode == 0, result.stderr


def test_mlp_matches_eager_and_grads_accumulate():
    torch = _torch()
    x = torch.randn(6, 20)
    eager, bridged, errors = _compare(_mlp, lambda step: (x,), _ce)
    inner = bridged.module
    first = [p.grad.clone() for p in inner.parameters()]
    _train_step(bridged, (x,), _ce)            # a second backward adds, as in torch
    for p, g in zip(inner.parameters(), first):
        _close(p.grad, 2 * g, "accumulated grad")
    bridged.zero_grad()
    assert all(p.grad is None or not p.grad.any() for p in inner.parameters())
    assert bridged.exported_graphs == 1
    # input gradients, through a second signature (x requires grad)
    xe = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    _ce(eager(xe)).backward()
    _ce(bridged(xb)).backward()
    _close(xb.grad, xe.grad, "input grad")
    assert bridged.exported_graphs == 1         # one export; a second training graph from it
    assert errors["grad"] < 1e-6


def test_tensors_cross_without_copies(monkeypatch):
    """Zero copy: onnxruntime reads the inputs and parameters in torch's memory, the output and
    the first backward's parameter gradients are the buffers onnxruntime wrote (AccumulateGrad
    takes the gradient over), a second backward adds in place."""
    torch = _torch()
    import ortagent.torch as bridge
    from ortagent.torch import _bridge

    fed, produced = [], []
    # (every host output becomes a tensor through host_to_torch, to_torch's CPU branch too)
    to_ort, host_to_torch = _bridge.to_ort, _bridge.host_to_torch

    def spy_in(tensor, *args):
        value = to_ort(tensor, *args)
        if tensor.is_contiguous():     # out.sum()'s gradient is an expanded view: copied
            fed.append((tensor.data_ptr(), value.data_ptr()))
        return value

    def spy_out(value):
        tensor = host_to_torch(value)
        produced.append((value.data_ptr(), tensor.data_ptr()))
        return tensor

    monkeypatch.setattr(_bridge, "to_ort", spy_in)
    monkeypatch.setattr(_bridge, "host_to_torch", spy_out)
    model = bridge.ORTModule(torch.nn.Linear(4, 3))
    x = torch.randn(2, 4)
    out = model(x)
    out.sum().backward()
    assert all(torch_ptr == ort_ptr for torch_ptr, ort_ptr in fed)
    assert x.data_ptr() in {ptr for ptr, _ in fed}
    assert model.module.weight.data_ptr() in {ptr for ptr, _ in fed}
    assert all(ort_ptr == torch_ptr for ort_ptr, torch_ptr in produced)
    assert out.data_ptr() in {ptr for _, ptr in produced}
    grad = model.module.weight.grad
    assert grad.data_ptr() in {ptr for _, ptr in produced}       # the buffer onnxruntime wrote
    before = grad.data_ptr()
    model(torch.randn(2, 4)).sum().backward()
    assert model.module.weight.grad.data_ptr() == before        # accumulated in place


def test_parameters_are_exported_once_and_every_change_of_them_is_seen(monkeypatch):
    """A parameter's OrtValue is kept from call to call (GraphRunner.feed_values): a call
    exports only its user tensors through DLPack. Whatever replaces a parameter's memory, shape
    or dtype, or the parameter itself, is seen by the next call: outputs and gradients equal
    eager's after an optimizer step, ``p.data = ...``, ``copy_``, ``set_`` of another storage,
    a new Parameter object and a double-precision module."""
    torch = _torch()
    from ortagent.torch import ORTModule, _bridge

    exported = []
    to_ort = _bridge.to_ort

    def spy(tensor, *args):
        exported.append(tensor)
        return to_ort(tensor, *args)

    monkeypatch.setattr(_bridge, "to_ort", spy)
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    bridged = ORTModule(copy.deepcopy(eager))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, bridged)]

    def step(check_exports=False):
        x = torch.randn(5, 4)
        exported.clear()
        outs = []
        for model, optimizer in zip((eager, bridged), optimizers):
            optimizer.zero_grad()
            out = model(x)
            out.square().sum().backward()
            optimizer.step()
            outs.append(out)
        _close(outs[1], outs[0], "output")
        for pe, pb in zip(eager.parameters(), bridged.module.parameters()):
            _close(pb.grad, pe.grad, "gradient")
            _close(pb, pe, "parameter after the step")
        if check_exports:           # the input and the output's gradient, no parameter
            assert not any(t is p for t in exported for p in bridged.module.parameters())

    step()
    step(check_exports=True)
    step(check_exports=True)
    first_e, first_b = eager[0], bridged.module[0]
    with torch.no_grad():
        new_weight = torch.randn(8, 4)
        first_e.weight.data = new_weight.clone()        # other memory, same shape
        first_b.weight.data = new_weight.clone()
    step()
    with torch.no_grad():
        first_e.bias.copy_(torch.full((8,), 0.5))       # in place
        first_b.bias.copy_(torch.full((8,), 0.5))
        storage = torch.randn(8)
        first_e.bias.set_(storage.clone())              # another storage through set_
        first_b.bias.set_(storage.clone())
    step()
    last_e, last_b = eager[2], bridged.module[2]
    weight = torch.randn(3, 8)
    last_e.weight = torch.nn.Parameter(weight.clone())  # a new Parameter object
    last_b.weight = torch.nn.Parameter(weight.clone())
    optimizers[:] = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, bridged)]
    step()
    step(check_exports=True)
    eager.double()
    bridged.module.double()
    optimizers[:] = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, bridged)]
    x = torch.randn(5, 4, dtype=torch.float64)
    _close(bridged(x), eager(x), "float64 output")


def test_a_submodule_registered_twice_keeps_its_parameters_and_gets_their_gradients():
    """A submodule reached by two names (CoaT's shared position encodings, a layer reused by
    several blocks), with a BatchNorm in it: torch's functional_call restored it by name, twice,
    and left the trace's fake tensors in the module as its parameters, so the real ones got
    no gradient (silently) and the next call failed."""
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, shared):
            super().__init__()
            self.shared = shared
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return self.fc(self.shared(x)).relu()

    class Shares(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))    # (named first)
            self.blocks = nn.ModuleList([Block(self.encoder), Block(self.encoder)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    eager, bridged, _ = _compare(Shares, lambda step: (torch.randn(5 + step, 6),), lambda out: out.square().mean(),
                                 steps=3)
    inner = bridged.module
    assert all(type(p) is nn.Parameter for p in inner.parameters())
    assert inner.encoder[0].weight is inner.blocks[1].shared[0].weight
    assert inner.encoder[0].weight.grad is not None and type(inner.encoder[1].running_mean) is torch.Tensor


def test_cnn_batchnorm_train_and_eval():
    torch = _torch()
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(4, 3, 8, 8, generator=gen) for _ in range(2)]
    eager, bridged, errors = _compare(_cnn, lambda step: (batches[step],), _ce, steps=2)
    inner = bridged.module
    assert inner[1].num_batches_tracked.item() == 2
    assert not torch.equal(inner[1].running_mean, torch.zeros(8))      # the running stats moved
    eager.eval()
    bridged.eval()
    with torch.no_grad():
        _close(bridged(batches[0]), eager(batches[0]), "eval output")
    # eval with grad enabled: a training graph with the running statistics as inputs
    x = batches[1]
    _ce(eager(x)).backward()
    _ce(bridged(x)).backward()
    for (name, pe), pb in zip(eager.named_parameters(), inner.parameters()):
        _close(pb.grad, pe.grad, f"eval-mode grad {name}")
    assert errors["loss"] <= RTOL


def test_transformer_encoder_layer_no_dropout():
    torch = _torch()
    x = torch.randn(2, 5, 16)
    make = lambda: torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)  # noqa: E731
    _, _, errors = _compare(make, lambda step: (x,), lambda out: (out ** 2).mean())
    assert errors["grad"] < 1e-5


def test_transformer_encoder_layer_with_dropout():
    """All three dropout modules and the attention-weight dropout (scaled_dot_product_attention's
    dropout_p, inside MultiheadAttention) draw the same masks as eager under one seed."""
    torch = _torch()

    x = torch.randn(2, 5, 16)
    make = lambda: torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.2, batch_first=True)  # noqa: E731
    _compare(make, lambda step: (x,), lambda out: (out ** 2).mean(), steps=2)


def test_functional_dropout_and_attention_weights():
    """F.dropout in training mode (here MultiheadAttention's need_weights=True path, which drops
    out the attention weights with it) is exported with a torch-drawn mask too."""
    torch = _torch()

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(16, 2, dropout=0.3, batch_first=True)
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            out, weights = self.mha(x, x, x)
            return torch.nn.functional.dropout(self.lin(out), 0.25, self.training), weights

    x = torch.randn(2, 5, 16)
    _compare(Attention, lambda step: (x,), lambda out: (out[0] ** 2).mean() + out[1].square().sum(), steps=2)


class _LayerDrop:
    """A stack of layers, each skipped when a draw falls below ``layerdrop`` (transformers' BART,
    OPT, Whisper, Wav2Vec2 ...), with dropout after each layer; ``compare`` picks the form of the
    test."""

    @staticmethod
    def make(layerdrop, compare="<"):
        torch = _torch()

        class Stack(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

            def forward(self, x):
                for layer in self.layers:
                    if self.training:
                        if compare == "<":
                            skip = torch.rand([]) < layerdrop
                        elif compare == ">=":                       # kept when the draw reaches it
                            skip = not torch.rand([]) >= layerdrop
                        else:                                       # a uniform_ draw, as a function
                            skip = torch.lt(torch.empty(()).uniform_(0.0, 1.0), layerdrop)
                        if skip:
                            continue
                    x = torch.nn.functional.dropout(torch.tanh(layer(x)), 0.2, self.training)
                return x

        return Stack()


def test_dropout_of_a_channels_last_image_after_a_drop_path_draws_eager_s_mask():
    """A draw fills its tensor in memory order: dropout of a 1x1 convolution's channels-last
    output (Segformer's decode head) must draw its mask in that layout, which torch's meta
    kernels predict as contiguous (the mask was another than eager's); the run on copies that
    finds the layout must leave the generator where it was (its stand-in for a drop path's
    torch.rand drew from it, and every draw after it shifted)."""
    torch = _torch()
    nn = torch.nn

    class DropPathThenImageDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.conv = nn.Conv2d(8, 8, 1)
            self.dropout = nn.Dropout(0.3)

        def forward(self, x):                       # x: (batch, 16 positions, 8 channels)
            keep = 0.5 + torch.rand((x.shape[0], 1, 1), dtype=x.dtype, device=x.device)
            h = x + self.linear(x).div(0.5) * keep.floor_()
            image = h.transpose(1, 2).reshape(x.shape[0], 8, 4, 4)       # channels-last strides
            return self.dropout(self.conv(image))

    _compare(DropPathThenImageDropout, lambda step: (torch.randn(2 + step, 16, 8),), lambda out: out.square().mean(),
             steps=3)


@pytest.mark.parametrize("compare", ["<", ">=", "lt"])
def test_layer_drop_of_zero_traces_and_keeps_eager_s_draws(compare):
    """A branch on ``torch.rand([]) < 0.0`` (transformers' layerdrop at 0, the default of BART,
    OPT, Whisper) is the same for every draw: the trace takes it as a constant, and the draw is
    still made, so the dropout masks after it are eager's (over several steps)."""
    torch = _torch()
    x = torch.randn(4, 8)
    eager, bridged, errors = _compare(lambda: _LayerDrop.make(0.0, compare), lambda step: (x,),
                                      lambda out: (out ** 2).mean(), steps=3)
    assert errors["loss"] < 1e-5


def test_layer_drop_inside_the_draw_s_range_is_refused_with_its_reason():
    """At a layerdrop between 0 and 1 the layers a step runs are chosen at random, which one
    graph cannot hold: refused, saying what to set."""
    torch = _torch()
    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    bridged = ORTModule(_LayerDrop.make(0.3))
    with pytest.raises(OrtNotImplemented, match="layerdrop"):
        bridged(torch.randn(4, 8))
    bridged.eval()                                  # (no draw in eval mode: nothing random)
    assert bridged(torch.randn(4, 8)).shape == (4, 8)


class _Scaled:
    """Custom autograd.Functions whose backward is not their forward's derivative."""

    @staticmethod
    def functions():
        torch = _torch()

        class HalvedGradient(torch.autograd.Function):      # the forward doubles, the backward halves
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 0.5

        class GradientReversal(torch.autograd.Function):    # domain-adversarial training's layer
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                return -grad

        return HalvedGradient, GradientReversal


@pytest.mark.parametrize("which", [0, 1], ids=["halved_gradient", "gradient_reversal"])
def test_custom_autograd_functions_are_refused_rather_than_differentiated_wrongly(which):
    """The exported graph holds a custom Function's forward operations, never its backward: its
    gradient would be the forward's derivative (before: 4x for the halved gradient, +1 for the
    reversal, silently; BLOOM's GeLUFunction gave its MLP zero gradients). Refused, naming the
    Function (unless declared with ``differentiate_forward_of``, below); a Function applied to
    tensors that need no gradient runs as it is."""
    torch = _torch()
    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    function = _Scaled.functions()[which]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, mask):
            weights = function.apply(mask.float())          # nothing here needs a gradient
            return function.apply(self.linear(x)) * weights

    x, mask = torch.randn(3, 4), torch.rand(3, 4) > 0.5
    with pytest.raises(OrtNotImplemented, match=function.__qualname__):
        ORTModule(Model())(x, mask)

    class NoGradient(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, mask):
            return self.linear(x) * function.apply(mask.float())

    _compare(NoGradient, lambda step: (x, mask), lambda out: (out ** 2).mean())


def test_a_function_declared_to_differentiate_its_forward_matches_eager():
    """A custom Function whose backward is its forward's derivative, written to save memory
    (SiLU saving only its input), declared with ``differentiate_forward_of``: ORTModule traces
    its forward's operations and matches eager; the declaration takes Function classes only."""
    torch = _torch()
    from ortagent.errors import OrtInvalidType
    from ortagent.torch import differentiate_forward_of

    @differentiate_forward_of
    class MemorySavingSiLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * torch.sigmoid(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            s = torch.sigmoid(x)
            return grad * s * (1 + x * (1 - s))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.second(MemorySavingSiLU.apply(self.first(x)))

    _compare(Model, lambda step: (torch.randn(4 + step, 6),), lambda out: out.square().mean(), steps=2)
    with pytest.raises(OrtInvalidType):
        differentiate_forward_of(torch.nn.Linear)


def test_gradient_hooks_inside_the_wrapped_module_are_refused_and_hooks_outside_run():
    """onnxruntime computes the backward, so a hook the forward registers on a tensor, or a
    backward hook on a submodule, would never run (before: ignored, the gradient silently not the
    hook's). Both are refused; a backward hook on the ORTModule itself, and hooks on the
    parameters, run as in eager."""
    torch = _torch()
    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Hooked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.linear(x)
            h.register_hook(lambda grad: grad * 0.5)
            return h * x

    x = torch.randn(3, 4)
    with pytest.raises(OrtNotImplemented, match="register_hook"):
        ORTModule(Hooked())(x)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    inner[0].register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 0.5,))
    with pytest.raises(OrtNotImplemented, match="'0' has a backward hook"):
        ORTModule(inner)(x)

    def outside():
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
        model[0].weight.register_hook(lambda grad: grad * 3)
        return model

    torch.manual_seed(0)
    eager = outside()
    bridged = ORTModule(copy.deepcopy(eager))
    bridged.module[0].weight.register_hook(lambda grad: grad * 3)   # (deepcopy keeps no tensor hook)
    for model in (eager, bridged):
        model.register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 0.5,))
    inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    for model, value in zip((eager, bridged), inputs):
        model(value).square().sum().backward()
    torch.testing.assert_close(inputs[1].grad, inputs[0].grad)
    torch.testing.assert_close(bridged.module[0].weight.grad, eager[0].weight.grad)


def test_reentrant_checkpoint_is_refused_and_the_other_matches_eager():
    """torch.utils.checkpoint with use_reentrant=True is a custom Function (refused, saying to
    use the other); with use_reentrant=False it is plain operations, differentiated as torch."""
    torch = _torch()
    from torch.utils.checkpoint import checkpoint

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    def make(reentrant):
        class Checkpointed(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6))

            def forward(self, x):
                return checkpoint(self.inner, x, use_reentrant=reentrant) * x

        return Checkpointed()

    x = torch.randn(3, 6)
    with pytest.raises(OrtNotImplemented, match="use_reentrant=False"):
        ORTModule(make(True))(x.requires_grad_())
    _compare(lambda: make(False), lambda step: (x.detach(),), lambda out: (out ** 2).mean())


def test_gpt_block_tied_head():
    torch = _torch()
    char_gpt = _char_gpt_demo().CharGPT
    idx = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(1))

    def loss(logits):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.roll(idx, -1, 1).reshape(-1))

    eager, bridged, errors = _compare(lambda: char_gpt(23, ctx=8, d=16, heads=2, layers=1, dropout=0.1),
                                      lambda step: (idx,), loss, steps=2)
    assert bridged.module.head.weight is bridged.module.wte.weight
    assert errors["grad"] < 1e-5
    # eval mode runs the inference graph, its -inf-masked Softmax computed in parts as in training
    eager.eval()
    bridged.eval()
    with torch.no_grad():
        longer = torch.randint(0, 23, (3, 8), generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(bridged(longer), eager(longer), rtol=1e-5, atol=1e-5)


def test_dropout_statistics_and_seed_reproducibility():
    torch = _torch()
    from ortagent.torch import ORTModule

    p = 0.3
    model = ORTModule(torch.nn.Dropout(p))
    x = torch.ones(200, 100, requires_grad=True)
    torch.manual_seed(7)
    y = model(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())        # d(x * mask)/dx = mask
    torch.manual_seed(7)
    again = model(x)
    assert torch.equal(again, y)
    torch.manual_seed(7)
    assert torch.equal(torch.nn.functional.dropout(x, p), y)       # eager's own draw
    model.eval()
    assert torch.equal(model(x), x)


def test_twenty_optimizer_steps_track_eager():
    torch = _torch()
    from ortagent.torch import ORTModule

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(32, 20, generator=gen)
    y = torch.randint(0, 10, (32,), generator=gen)
    torch.manual_seed(0)
    eager = _mlp()
    bridged = ORTModule(copy.deepcopy(eager))
    losses = []
    for model in (eager, bridged):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        curve = []
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses.append(curve)
    for step, (le, lb) in enumerate(zip(*losses)):
        assert abs(le - lb) <= RTOL * abs(le), (step, le, lb)
    assert losses[1][-1] < 0.5 * losses[1][0]
    sd_e, sd_b = eager.state_dict(), bridged.state_dict()
    assert list(sd_e) == list(sd_b)
    for key in sd_e:
        _close(sd_b[key], sd_e[key], f"state_dict {key}", rtol=1e-3)
    # the wrapped module's keys, also inside a parent, and loading round-trips
    parent = torch.nn.Sequential(bridged, torch.nn.Identity())
    assert list(parent.state_dict()) == [f"0.{key}" for key in sd_e]
    fresh = ORTModule(_mlp())
    fresh.load_state_dict(sd_e)
    assert torch.equal(fresh.module[0].weight, eager[0].weight)
    holder = torch.nn.Sequential(ORTModule(_mlp()))
    holder.load_state_dict(parent.state_dict())
    assert torch.equal(holder[0].module[2].bias, bridged.module[2].bias)


def test_no_grad_and_eval_outputs_equal_eager():
    torch = _torch()
    from ortagent.torch import ORTModule

    torch.manual_seed(0)
    eager = _cnn()
    bridged = ORTModule(copy.deepcopy(eager))
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():                  # train mode, no grad: batch statistics, stats updated
        out_b = bridged(x)
        out_e = eager(x)
    assert not out_b.requires_grad
    _close(out_b, out_e, "no_grad train-mode output")
    _close(bridged.module[1].running_var, eager[1].running_var, "running_var after no_grad")
    eager.eval()
    bridged.eval()
    _close(bridged(x), eager(x), "eval output")


def test_several_outputs_kwargs_and_integer_outputs():
    torch = _torch()
    from ortagent.torch import ORTModule

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(6, 8)
            self.a = torch.nn.Linear(8, 3)
            self.frozen = torch.nn.Linear(8, 2)
            self.frozen.requires_grad_(False)

        def forward(self, x, *, scale=None, double=False):
            h = torch.relu(self.body(x))
            h = h * scale if scale is not None else h
            h += 1.0                                              # in place
            logits = self.a(h) * (2.0 if double else 1.0)
            return {"logits": logits, "pred": logits.argmax(-1), "aux": (self.frozen(h), h)}

    torch.manual_seed(0)
    eager = Heads()
    bridged = ORTModule(copy.deepcopy(eager))
    x = torch.randn(4, 6)
    scale = torch.rand(4, 8)
    results = []
    for model in (eager, bridged):
        out = model(x, scale=scale, double=True)
        assert out["pred"].dtype == torch.int64
        (out["logits"].square().mean() + out["aux"][0].sum() + out["aux"][1].mean()).backward()
        results.append(out)
    assert torch.equal(results[0]["pred"], results[1]["pred"])
    assert not results[1]["pred"].requires_grad
    for (name, pe), pb in zip(eager.named_parameters(), bridged.module.parameters()):
        if pe.grad is None:
            assert pb.grad is None, name
        else:
            _close(pb.grad, pe.grad, name)
    assert bridged.module.frozen.weight.grad is None


def test_refusals_are_clear():
    torch = _torch()
    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class DataDependentDraw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) * torch.bernoulli(torch.sigmoid(x))

    class SizedByAValue(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            # (a branch on a value is taken and checked by the graph; a size read from one is not)
            kept = int((x > 0).sum().item())
            return self.fc(x).reshape(-1)[:kept]

    x = torch.randn(3, 4)
    with pytest.raises(OrtNotImplemented, match="depends on tensor values"):
        ORTModule(DataDependentDraw())(x)
    with pytest.raises(OrtNotImplemented, match="Python decision on a tensor's value") as refusal:
        ORTModule(SizedByAValue())(x)
    assert len(str(refusal.value).splitlines()) <= 26       # (not the whole traced graph)

    class Packs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 5, batch_first=True)

        def forward(self, x, lengths):
            rnn = torch.nn.utils.rnn
            packed = rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            return rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True)[0]

    with pytest.raises(OrtNotImplemented, match="pack_padded_sequence"):     # (was torch.export's TypeError)
        ORTModule(Packs())(torch.randn(3, 6, 4), torch.tensor([6, 3, 4]))
    with pytest.raises(OrtNotImplemented, match="neither a tensor"):
        ORTModule(_TakesAnything())(x, object())
    # an ORTModule inside the module to wrap, there from the start or assigned later (before:
    # a TraceFailure from torch's parameter swap, "cannot assign 'torch.FloatTensor'")
    from ortagent.errors import OrtInvalidArgument

    with pytest.raises(OrtInvalidArgument, match="holds an ORTModule at '1.0'"):
        ORTModule(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(ORTModule(torch.nn.Linear(4, 4)))))
    outer = ORTModule(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    outer(x)
    outer.module[0] = ORTModule(outer.module[0])
    with pytest.raises(OrtInvalidArgument, match="holds an ORTModule at '0'"):
        outer(torch.randn(5, 4))                            # (a new shape: exported again)
    assert isinstance(OrtNotImplemented("x"), NotImplementedError)
    # the refusals left torch as it was: no patched forward, torch.nn.functional and torch._VF restored
    refused = ORTModule(DataDependentDraw())
    with pytest.raises(OrtNotImplemented):
        refused(x)
    assert all("forward" not in sub.__dict__ for sub in refused.modules())
    assert torch.nn.functional.batch_norm.__module__ == "torch.nn.functional"
    assert torch.nn.functional.instance_norm.__module__ == "torch.nn.functional"
    assert "dropout" not in vars(torch._VF) and "feature_dropout" not in vars(torch._VF)
    refused.eval()
    with torch.no_grad():
        assert refused.module.fc(x).shape == (3, 4)


class _TakesAnything:
    """A module whose second argument may be anything (built lazily: torch is imported in tests)."""

    def __new__(cls):
        import torch

        class Module(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)

            def forward(self, x, extra):
                return self.fc(x)

        return Module()


def test_functional_batch_norm_channel_and_alpha_dropouts_match_eager():
    """What the bridge once refused now trains exactly: F.batch_norm(training=True) outside a
    BatchNorm module, channel dropouts, alpha dropouts, InstanceNorm with running statistics
    (outputs, gradients, running buffers, and the same random draws as eager under one seed)."""
    torch = _torch()

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 6, 3, padding=1, bias=False)   # a bias before a norm: no gradient
            self.w = torch.nn.Parameter(torch.rand(6) + 0.5)
            self.b = torch.nn.Parameter(torch.randn(6))
            self.drop2d = torch.nn.Dropout2d(0.3)
            self.alpha = torch.nn.AlphaDropout(0.2)
            self.feature_alpha = torch.nn.FeatureAlphaDropout(0.25)
            self.inorm = torch.nn.InstanceNorm2d(6, track_running_stats=True)
            self.drop1d = torch.nn.Dropout1d(0.4)

        def forward(self, x):
            # (the norms first: after a channel dropout, a dropped channel is constant, and
            # normalizing it amplifies rounding by 1/sqrt(eps) in either implementation)
            y = self.inorm(self.conv(x))
            y = torch.nn.functional.batch_norm(y, None, None, self.w, self.b, training=True)
            y = self.feature_alpha(self.drop2d(y))
            z = self.drop1d(y.flatten(2))
            return self.alpha(z).sum(-1)

    _compare(Mixed, lambda step: (torch.randn(4, 3, 5, 5),),
             lambda out: (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum(), steps=3)


def test_in_place_updates_of_buffers_and_inputs():
    """torch.export turns `self.count.add_(1)` and `acc.mul_(2)` into extra results the ONNX graph
    would drop; the bridge returns them and copies them back, as eager mutates (and the traces
    before the export, here on copies, touch nothing)."""
    torch = _torch()
    from ortagent.torch import ORTModule

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x, acc):
            if x.device.type == "meta":       # no meta kernel: the traces run on copies instead
                raise RuntimeError("not on meta tensors")
            self.count.add_(1)
            acc.mul_(2)
            return torch.relu_(self.lin(x)) * self.count + acc.sum()

    eager = Counting()
    bridged = ORTModule(copy.deepcopy(eager))
    x = torch.randn(2, 3)
    for _ in range(3):
        acc_e, acc_b = torch.ones(3), torch.ones(3)
        out_e, out_b = eager(x, acc_e), bridged(x, acc_b)
        out_e.sum().backward()
        out_b.sum().backward()
        _close(out_b, out_e, "output")
        assert torch.equal(acc_b, acc_e)
    assert bridged.module.count.item() == eager.count.item() == 3
    _close(bridged.module.lin.weight.grad, eager.lin.weight.grad, "grad")


def test_ddp_over_ortmodule_matches_single_process(tmp_path):
    """DistributedDataParallel(ORTModule(model)), 2 processes, gloo on 127.0.0.1: each rank's
    half-batch gradients, averaged by DDP's hooks (fired by AccumulateGrad), equal one process
    on the whole batch."""
    torch = _torch()
    out = tmp_path / "ddp.pt"
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tests", "torch_ddp_worker.py"), str(out)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert result.returncode == 0, result.stderr[-4000:]
    saved = torch.load(out)
    assert saved["second_step_ok"]
    for name, grad in saved["single"].items():
        _close(saved["ddp"][name], grad, f"DDP grad {name}")


def test_char_gpt_demo_tracks_eager():
    """demo/train_char_gpt.py (make demo-torch), a few steps: the bridge's loss curve is eager's."""
    demo = _char_gpt_demo()
    text = demo.load_text("textwrap")[:4000]
    result = demo.train(text, steps=4, batch=4, ctx=16, d=32, layers=1)
    assert len(result.bridge_losses) == len(result.eager_losses) == 4
    for bridge, eager in zip(result.bridge_losses, result.eager_losses):
        assert abs(bridge - eager) <= RTOL * abs(eager), (bridge, eager)
    assert len(result.sample) == 60


@pytest.mark.cuda
def test_cuda_mlp_and_batchnorm_match_eager():
    """The CUDA path (sessions on the inputs' device, onnxruntime computing on torch's current
    stream): losses, gradients and running statistics against eager on the GPU."""
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    device = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(2)
    images = torch.randn(4, 3, 8, 8, generator=gen).to(device)
    _compare(lambda: _cnn().to(device), lambda step: (images,), _ce, steps=2)
    x = torch.randn(6, 20, generator=gen).to(device)
    _compare(lambda: _mlp().to(device), lambda step: (x,), _ce)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_cuda_autocast_is_honoured(dtype_name):
    """torch.autocast('cuda') around the forward, float16 and bfloat16: the graph computes in
    the autocast dtype where torch's autocast does (outputs in that dtype, as eager's), with
    float32 parameters and gradients that agree with eager under the same autocast."""
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    import copy

    from ortagent.torch import ORTModule

    dtype = getattr(torch, dtype_name)
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv1d(3, 8, 3, padding=1), torch.nn.GELU(), torch.nn.Flatten(),
                              torch.nn.LayerNorm(80), torch.nn.Linear(80, 4)).to(device)
    bridged = ORTModule(copy.deepcopy(net))
    x = torch.randn(5, 3, 10, device=device)
    outputs = []
    for model in (net, bridged):
        with torch.autocast("cuda", dtype=dtype):
            out = model(x.clone().requires_grad_())
        outputs.append(out)
        (out.float() ** 2).sum().backward()
    tolerance = 2e-3 if dtype == torch.float16 else 2e-2
    assert outputs[0].dtype == outputs[1].dtype == dtype
    torch.testing.assert_close(outputs[1].float(), outputs[0].float(), rtol=tolerance, atol=tolerance)
    for (name, expected), got in zip(net.named_parameters(), bridged.parameters()):
        assert got.grad.dtype == torch.float32 and got.grad.device == device, name
        scale = expected.grad.abs().max()
        torch.testing.assert_close(got.grad / scale, expected.grad / scale, rtol=0, atol=2 * tolerance, msg=name)


@pytest.mark.parametrize("dynamic", [None, True])
def test_one_export_serves_every_batch_and_sequence_length(dynamic):
    """A transformer trained on batches of varying size and sequence length: by default the
    first call's export is specialised to its shapes and the second shape's has symbolic
    dimensions, which serves every later shape; with ``dynamic=True`` the first export does
    (shapes, gradients and dropout masks as eager's)."""
    torch = _torch()

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(40, 16)
            self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
            self.head = torch.nn.Linear(16, 5)

        def forward(self, ids, mask):
            return self.head(self.layer(self.embed(ids), src_key_padding_mask=mask))

    shapes = [(4, 7), (3, 9), (5, 7), (2, 13), (4, 7), (6, 3)]

    def inputs(step):
        batch, length = shapes[step]
        mask = torch.zeros(batch, length, dtype=torch.bool)
        mask[0, length - 2:] = True
        return torch.randint(0, 40, (batch, length)), mask

    eager, bridged, errors = _compare(Tagger, inputs, lambda out: (out * out).mean(), steps=len(shapes),
                                      dynamic=dynamic)
    guards = [entry.exported.guard for entries in bridged._exports.values() for entry in entries]
    assert [guard.symbolic for guard in guards] == ([False, True] if dynamic is None else [True])
    assert bridged.exported_graphs == len(guards)
    assert errors["grad"] < 1e-5


def test_static_exports_one_for_each_shape():
    """``dynamic=False``: every shape its own export at static shapes (a repeated shape reuses
    its export); ``dynamic`` is checked."""
    torch = _torch()
    from ortagent.errors import OrtInvalidType
    from ortagent.torch import ORTModule

    batches = [6, 3, 6, 5]
    eager, bridged, errors = _compare(_mlp, lambda step: (torch.randn(batches[step], 20),), _ce,
                                      steps=len(batches), dynamic=False)
    assert bridged.exported_graphs == 3
    assert not any(entry.exported.guard.symbolic for entries in bridged._exports.values() for entry in entries)
    assert errors["grad"] < 1e-6
    with pytest.raises(OrtInvalidType, match="dynamic"):
        ORTModule(_mlp(), dynamic="auto")


def test_a_second_shape_the_exporter_cannot_make_symbolic_exports_static(monkeypatch):
    """A second batch size where torch.export cannot trace symbolic dimensions (AlexNet's
    feature stack ends in an AdaptiveAvgPool2d whose size it cannot solve for): the static
    retry traces the call's shapes (torch.export marks the tensors a failed symbolic try traced,
    which made the retry fail the same way when it reused them), and later shapes of that
    signature are traced static without trying symbolic dimensions again."""
    torch = _torch()
    nn = torch.nn
    from ortagent.torch import _export

    traces = []
    trace = _export._torch_export

    def counted(*args):
        traces.append(args[-1] is not None)
        return trace(*args)

    monkeypatch.setattr(_export, "_torch_export", counted)

    def alexnet_like():
        return nn.Sequential(nn.Conv2d(3, 4, 11, 4, 2), nn.MaxPool2d(3, 2), nn.Conv2d(4, 4, 5, padding=2),
                             nn.MaxPool2d(3, 2), nn.Conv2d(4, 4, 3, padding=1), nn.MaxPool2d(3, 2),
                             nn.AdaptiveAvgPool2d(6), nn.Flatten(), nn.Linear(144, 10))

    batches = [2, 3, 1]
    eager, bridged, errors = _compare(alexnet_like, lambda step: (torch.randn(batches[step], 3, 64, 64),), _ce,
                                      steps=len(batches))
    assert bridged.exported_graphs == 3
    assert not any(entry.exported.guard.symbolic for entries in bridged._exports.values() for entry in entries)
    assert traces == [False, True, False, False]       # (the symbolic try only once)
    assert errors["grad"] < 1e-5


@pytest.mark.parametrize("dynamic, failing, exports, kinds", [
    (None, "static", 2, [True]),        # the first export, at static shapes, fails: symbolic
    (None, "symbolic", 1, [False]),
    (True, "symbolic", 2, [False]),     # a symbolic one that fails: the call's static shapes
    (True, "static", 1, [True]),
    (False, "static", 1, None),         # asked for static shapes, which fail: refused
    (False, "symbolic", 1, [False]),
])
def test_a_graph_onnxruntime_cannot_run_is_exported_the_other_way(monkeypatch, dynamic, failing, exports, kinds):
    """The first call of an export onnxruntime fails to load: one with symbolic dimensions is
    exported again at the call's static shapes, and by default one at static shapes again with
    symbolic dimensions; static shapes asked for (dynamic=False) are refused when they fail.
    (onnxruntime's failure is stood in for by one raised at session creation.)"""
    torch = _torch()
    from ortagent.errors import OrtFail, OrtNotImplemented
    from ortagent.torch import ORTModule, _bridge

    build = _bridge.GraphRunner._build

    def fails_for_one_kind(runner, *args, **kwargs):
        if runner.exported.guard.symbolic == (failing == "symbolic"):
            raise OrtFail(f"a {failing} graph onnxruntime cannot load")
        return build(runner, *args, **kwargs)

    monkeypatch.setattr(_bridge.GraphRunner, "_build", fails_for_one_kind)
    torch.manual_seed(0)
    net = _mlp()
    bridged = ORTModule(copy.deepcopy(net), dynamic=dynamic)
    x = torch.randn(5, 20)
    if kinds is None:
        with pytest.raises(OrtNotImplemented, match="cannot load"):
            bridged(x)
        assert bridged.exported_graphs == exports
        return
    _ce(bridged(x)).backward()
    _ce(net(x)).backward()
    for expected, got in zip(net.parameters(), bridged.parameters()):
        _close(got.grad, expected.grad, "gradient")
    assert [entry.exported.guard.symbolic for entries in bridged._exports.values() for entry in entries] == kinds
    assert bridged.exported_graphs == exports


def _scaled_class(torch):
    """A module whose forward takes a number besides its tensor (each new number exports)."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x, scale):
            return torch.tanh(self.fc(x)) * scale

    return Scaled


def test_exports_are_bounded_and_warn(monkeypatch):
    """A non-tensor argument that changes every call exports each time: a warning at the
    eighth export (third here), and at most max_graphs exports kept (least recently used out)."""
    torch = _torch()
    import ortagent.torch._module as module_impl
    from ortagent.torch import ORTModule

    Scaled = _scaled_class(torch)
    monkeypatch.setattr(module_impl, "_MANY_EXPORTS", 3)
    model = ORTModule(Scaled(), max_graphs=2)
    x = torch.randn(4, 3)
    with torch.no_grad():
        model(x, 1.0)
        model(x, 2.0)
        with pytest.warns(RuntimeWarning, match="exported 3 graphs"):
            model(x, 3.0)
        model(x, 3.0)                               # kept: no export
        assert model.exported_graphs == 3
        model(x, 1.0)                               # evicted (least recently used): exported again
        assert model.exported_graphs == 4
        torch.testing.assert_close(model(x, 2.5), model.module(x, 2.5))
    with pytest.raises(ValueError, match="max_graphs"):
        ORTModule(Scaled(), max_graphs=0)


def test_evicted_export_runs_a_pending_backward():
    """A forward made on an export that later calls evict (max_graphs) still runs its
    backward, with eager's gradients; the evicted export's runner goes with its last output."""
    torch = _torch()
    import gc
    import weakref
    from ortagent.torch import ORTModule

    torch.manual_seed(0)
    eager = _scaled_class(torch)()
    model = ORTModule(copy.deepcopy(eager), max_graphs=1)
    x = torch.randn(4, 3)
    pending = model(x, 2.0)
    runner = weakref.ref(next(iter(model._exports.values()))[0].runner)
    later = model(x, 3.0)                                 # evicts the 2.0 export
    assert model.exported_graphs == 2 and len(model._exports) == 1
    (pending.square().sum() + later.sum()).backward()
    (eager(x, 2.0).square().sum() + eager(x, 3.0).sum()).backward()
    for expected, got in zip(eager.parameters(), model.parameters()):
        _close(got.grad, expected.grad, "gradient")
    del pending
    gc.collect()
    assert runner() is None


def test_graph_rewrites_keep_transformer_gradients():
    """build_training_graph's rewrites (optimize=True) on an exported TransformerEncoderLayer:
    the same gradients as onnx-ad's graph as generated, to 1e-6 relative (not bit for bit: the
    2-D weight-gradient MatMul sums in another order), with far fewer copies."""
    np = pytest.importorskip("numpy")
    torch = _torch()
    from ortagent import OrtValue, PartialGraphExecutionState, TrainingAgent
    from ortagent.torch import export_forward_model
    from ortagent.training import build_training_graph

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0)
    x = torch.randn(6, 3, 32)
    info = export_forward_model(layer, (x,))
    names = list(info.input_names)
    params = dict(layer.named_parameters())
    feeds = [x.numpy()] + [params[name].detach().numpy() for name in names[1:]]
    seed = np.random.default_rng(0).standard_normal((6, 3, 32)).astype(np.float32)
    results, copies = [], []
    for optimize in (False, True):
        graph = build_training_graph(info.model, names[1:], user_inputs=names[:1], optimize=optimize)
        copies.append(sum(node.op_type in ("Transpose", "Expand") for node in graph.graph.node))
        agent = TrainingAgent(graph.SerializeToString())
        state, outputs, grads = PartialGraphExecutionState(), [], []
        agent.run_forward([OrtValue.ortvalue_from_numpy(f) for f in feeds], outputs, state)
        agent.run_backward([OrtValue.ortvalue_from_numpy(seed)], grads, state)
        results.append([value.numpy().copy() for value in grads])
    for plain, rewritten in zip(*results):
        assert np.abs(rewritten - plain).max() <= 1e-6 * np.abs(plain).max()
    assert copies[1] < copies[0] / 2, copies


def test_exports_leave_other_threads_eager_modules_alone():
    """While one thread exports ORTModules (dropout, BatchNorm, attention dropout), another
    thread's eager training loop with the same kinds of layers runs torch's own kernels: no
    error, BatchNorm's outputs and running statistics exactly those of the same loop run alone,
    dropout outputs that are torch's (each element 0 or twice the input)."""
    torch = _torch()
    import threading

    from ortagent.torch import ORTModule

    def eager_net():
        torch.manual_seed(7)
        return torch.nn.ModuleDict({"bn": torch.nn.BatchNorm1d(16), "drop": torch.nn.Dropout(0.5),
                                    "attn": torch.nn.MultiheadAttention(16, 2, dropout=0.3, batch_first=True)})

    inputs = [torch.randn(8, 16) for _ in range(4)]

    def eager_loop(net, steps, failures, records):
        try:
            for step in range(steps):
                x = inputs[step % len(inputs)]
                y = net["bn"](x)
                dropped = net["drop"](y)
                attended, _ = net["attn"](y[None], y[None], y[None], need_weights=False)
                attended.sum().backward()
                records.append((y.detach().clone(), dropped.detach().clone(),
                                net["bn"].running_mean.clone(), net["bn"].running_var.clone()))
        except BaseException as exc:        # the test reports it
            failures.append(exc)

    alone: list = []
    eager_loop(eager_net(), 40, [], alone)

    failures: list = []
    concurrent: list = []
    worker = threading.Thread(target=eager_loop, args=(eager_net(), 40, failures, concurrent))

    class Exported(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(16)
            self.drop = torch.nn.Dropout(0.5)
            self.attn = torch.nn.MultiheadAttention(16, 2, dropout=0.3, batch_first=True)

        def forward(self, x):
            y = self.drop(self.bn(x))
            return self.attn(y[None], y[None], y[None])[0]

    worker.start()
    for size in (8, 1, 3):                  # a static, then a dynamic export, then ... each a trace
        model = ORTModule(Exported())
        model(torch.randn(size if size > 1 else 2, 16)).sum().backward()
        model.module.train(False)
        model(torch.randn(4, 16))
    worker.join()
    assert not failures, failures
    assert len(concurrent) == len(alone)
    for (y, dropped, mean, var), (y0, _, mean0, var0) in zip(concurrent, alone):
        assert torch.equal(y, y0) and torch.equal(mean, mean0) and torch.equal(var, var0)
        kept = dropped != 0
        assert torch.allclose(dropped[kept], 2 * y[kept])
    assert "dropout" not in vars(torch._VF)
    assert torch.nn.functional.batch_norm.__module__ == "torch.nn.functional"


def test_disk_cache_skips_the_export_of_a_restarted_job(tmp_path, monkeypatch):
    """With cache_dir, a second ORTModule over a module of the same structure (a restarted
    job) loads the exported and built graphs instead of exporting: same losses and gradients;
    a module of another structure, or a damaged cache file, exports anew."""
    torch = _torch()
    import ortagent.torch._module as module_impl
    from ortagent.torch import ORTModule

    def make(hidden=16):
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.BatchNorm1d(hidden), torch.nn.GELU(),
                                   torch.nn.Dropout(0.2), torch.nn.Linear(hidden, 2))

    x = torch.randn(5, 6)

    def step(model):
        torch.manual_seed(11)
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    first = ORTModule(make(), cache_dir=tmp_path)
    expected = step(first)
    assert first.exported_graphs == 1
    folders = list(tmp_path.iterdir())
    assert len(folders) == 1 and list(folders[0].glob("export-0/training-*.onnx"))

    def no_export(*args, **kwargs):
        raise AssertionError("exported although the graph is on disk")

    with monkeypatch.context() as patch:
        patch.setattr(module_impl, "export", no_export)
        restarted = ORTModule(make(), cache_dir=tmp_path)
        loss, grads = step(restarted)
    torch.testing.assert_close(loss, expected[0], rtol=0, atol=0)
    for got, want in zip(grads, expected[1]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    eager = make()
    torch.testing.assert_close(step(eager)[0], expected[0], rtol=1e-5, atol=1e-6)

    other = ORTModule(make(hidden=8), cache_dir=tmp_path)            # another structure: its own folder
    step(other)
    assert len(list(tmp_path.iterdir())) == 2
    for path in tmp_path.rglob("forward.onnx"):
        path.write_bytes(b"damaged")
    damaged = ORTModule(make(), cache_dir=tmp_path)
    torch.testing.assert_close(step(damaged)[0], expected[0], rtol=0, atol=0)


def test_disk_cache_key_ignores_a_held_objects_hash_of_itself(tmp_path, monkeypatch):
    """transformers' GenerationConfig records ``hash(self)`` (salted, so another number in each
    process): a restarted job whose module holds such an object still finds its graphs on disk,
    while a changed setting of the same object still makes a new export."""
    torch = _torch()
    import ortagent.torch._module as module_impl
    from ortagent.torch import ORTModule

    class Settings:
        def __init__(self, identity, scale):
            self._original_object_hash = identity
            self.scale = scale

    class Scaled(torch.nn.Module):
        def __init__(self, identity, scale=2.0):
            super().__init__()
            torch.manual_seed(5)
            self.linear = torch.nn.Linear(4, 3)
            self.settings = Settings(identity, scale)

        def forward(self, x):
            return self.linear(x) * self.settings.scale

    x = torch.randn(2, 4)
    first = ORTModule(Scaled(identity=12345), cache_dir=tmp_path)
    expected = first(x)
    with monkeypatch.context() as patch:
        patch.setattr(module_impl, "export", lambda *a, **k: (_ for _ in ()).throw(AssertionError("exported")))
        restarted = ORTModule(Scaled(identity=-987654321), cache_dir=tmp_path)
        torch.testing.assert_close(restarted(x), expected, rtol=0, atol=0)
    rescaled = ORTModule(Scaled(identity=12345, scale=3.0), cache_dir=tmp_path)
    torch.testing.assert_close(rescaled(x), expected * 1.5, rtol=1e-6, atol=1e-6)
    assert rescaled.exported_graphs == 1


def test_what_real_models_use_and_return():
    """Boolean-mask assignment into an input, a TransformerEncoder with a causal mask and a
    padding mask in training, torchvision-style stochastic depth (a Bernoulli row mask drawn as
    eager draws it), grouped and depthwise convolutions (their weight gradients), and outputs
    as OrderedDict and namedtuple keep their types."""
    torch = _torch()
    import collections

    from ortagent.torch import ORTModule

    Pair = collections.namedtuple("Pair", "logits features")

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, groups=2)
            self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
            layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, images, mask):
            images = images.clone()
            images[images > 1.5] = 0.0                         # boolean-mask assignment
            features = self.depthwise(self.conv(images))       # [B, 8, H, W]
            keep = torch.empty(features.shape[0], 1, 1, 1).bernoulli_(0.8) / 0.8   # stochastic depth
            features = features * keep + features
            tokens = features.flatten(2).transpose(1, 2)       # [B, H*W, 8]
            length = tokens.shape[1]
            causal = torch.ones(length, length, dtype=torch.bool).triu(1)
            encoded = self.encoder(tokens, mask=causal, src_key_padding_mask=mask, is_causal=True)
            logits = self.head(encoded.mean(1))
            return collections.OrderedDict(out=Pair(logits, encoded))

    def inputs(step):
        batch = 3 + step
        mask = torch.zeros(batch, 16, dtype=torch.bool)
        mask[0, -3:] = True
        return torch.randn(batch, 4, 4, 4), mask

    def loss(out):
        assert type(out) is collections.OrderedDict and type(out["out"]) is Pair
        return out["out"].logits.square().mean() + out["out"].features.square().mean()

    eager, bridged, errors = _compare(Mixed, inputs, loss, steps=2)
    assert bridged.exported_graphs == 2         # the first call's static shapes, then symbolic ones
    images, mask = inputs(0)
    before = images.clone()
    torch.manual_seed(5)
    bridged(images, mask)
    assert torch.equal(images, before)                      # the clone was written, not the input

    class Clamp(torch.nn.Module):                           # writes into its input, as eager does
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            x[x > 0.5] = 0.5
            return self.fc(x)

    torch.manual_seed(0)
    clamp = Clamp()
    x = torch.randn(5, 4)
    expected_x = x.clone()
    expected = clamp(expected_x)
    out = ORTModule(clamp)(x)
    assert torch.equal(x, expected_x)
    _close(out.detach(), expected.detach(), "output")


def test_disk_cache_key_is_the_same_in_another_process():
    """The folder name of an export must not depend on the process: a module keeping names in a
    set (as transformers' GPT-2 does) got another key under each salted string hash, so a
    restarted job exported again. The key of one module and call, computed under two hash seeds."""
    _torch()
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from ortagent.torch import _trees\n"
        "from ortagent.torch._cache import structure_key\n"
        "from ortagent.torch._state import StateGuard\n"
        "class Named(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(3, 2)\n"
        "        self.tied = {'alpha.weight', 'beta.bias', 'gamma', 'delta.kernel', 'epsilon'}\n"
        "    def forward(self, x):\n"
        "        return self.linear(x) if 'gamma' in {'gamma', 'zeta', 'eta', 'theta'} else x\n"
        "module = Named()\n"
        "print(structure_key(module, (StateGuard(module).key(),)))\n"
    )
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        keys.add(done.stdout.strip())
    assert len(keys) == 1, keys


def test_declared_shapes_that_contradict_onnx_inference_are_replaced():
    """The export's check of torch.onnx's declared shapes: a declaration of another rank (the
    unreduced NLL loss declared a scalar) or another static size is replaced by what ONNX
    infers; a symbolic one that agrees is kept."""
    pytest.importorskip("torch")
    import onnx
    from onnx import TensorProto, helper

    from ortagent.torch._export import _repair_declared_shapes

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"]),
         helper.make_node("Abs", ["z"], ["w"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, [])],
        value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5]),
                    helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert sorted(_repair_declared_shapes(model)) == ["w", "y"]
    declared = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
                for v in [*model.graph.value_info, *model.graph.output]}
    assert declared == {"y": ["batch", 4], "z": ["batch", 4], "w": ["batch", 4]}
    onnx.checker.check_model(model)


def test_exports_share_one_table_of_translations(monkeypatch):
    """torch.onnx's table of translations (torchlib's and ours) is built once per process, not
    on every export; where the exporter's entry point that takes one is missing, the public
    torch.onnx.export makes the same graph."""
    torch = _torch()
    from torch.onnx._internal.exporter import _registration

    from ortagent.torch import _export, _training_ir

    # (torch.onnx's preparation of the program on both sides: the public call has no other)
    monkeypatch.setattr(_training_ir, "translate", lambda *args: None)
    x = torch.randn(2, 20)
    _export.export(_mlp(), _export._trees.flatten(((x,), {}), "the arguments"))           # (the table exists now)
    built = []
    original = _registration.ONNXRegistry.from_torchlib
    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib",
                        classmethod(lambda cls, *a, **k: built.append(1) or original(*a, **k)))
    module = _cnn()
    inputs = _export._trees.flatten(((torch.randn(2, 3, 8, 8),), {}), "the arguments")
    shared, _ = _export.export(module, inputs)
    assert built == []
    monkeypatch.setattr(_export, "exporter_core", lambda: None)
    public, _ = _export.export(module, inputs)
    assert built == [1]
    assert shared.model.graph == public.model.graph


def test_translation_table_defers_signatures_and_matches_torch_onnx():
    """The table of translations the exports share is torch.onnx's own (the same functions for
    the same operators, in the same order, the same complex flags) with torchlib's signatures
    worked out when the exporter first asks for an operator: a model's export signs the
    functions of its own operators, each signature the one torch.onnx makes, and no other."""
    torch = _torch()
    from ortagent.torch import _export, _registry

    lazy = _registry._lazy_registry(_export.OPSET)
    assert lazy is not None, "torch.onnx's internals are not those the deferred table reads"
    eager = _registry.eager_registry(_export.OPSET)

    def listed(registry):
        return {name: [(meta.onnx_function, meta.is_complex, meta.is_custom) for meta in metas]
                for name, metas in registry.functions.items()}

    assert listed(lazy) == listed(eager)
    unsigned = len(lazy.unsigned)
    assert unsigned > 300
    conv = torch.ops.aten.convolution.default
    lazy_metas, eager_metas = lazy.get_decomps(conv), eager.get_decomps(conv)
    assert [str(meta.signature) for meta in lazy_metas] == [str(meta.signature) for meta in eager_metas]
    assert all(meta.signature is not None for meta in lazy_metas)
    assert len(lazy.unsigned) == unsigned - len(lazy_metas)

    shared = _registry.translation_registry(_export.OPSET, _export.translation_table)
    waiting = dict(shared.unsigned)
    x = torch.randn(2, 3, 8, 8)
    _export.export(_cnn(), _export._trees.flatten(((x,), {}), "the arguments"))
    signed = [meta for key, meta in waiting.items() if key not in shared.unsigned]
    assert all(meta.signature is not None for meta in signed)
    assert len(signed) < 40 and len(shared.unsigned) > 300


def test_translation_table_drops_a_function_whose_signature_fails():
    """As torch.onnx leaves out a torchlib function whose signature it cannot work out, the
    deferred table drops it when it is first asked for, and an operator left with none
    leaves the table (torch.onnx's decomposition step refuses empty entries)."""
    torch = _torch()
    from torch.onnx._internal.exporter import _decomp

    from ortagent.torch import _export, _registry

    registry = _registry._lazy_registry(_export.OPSET)
    name, (meta,) = next((name, metas) for name, metas in registry.functions.items()
                         if len(metas) == 1 and id(metas[0]) in registry.unsigned)
    meta.onnx_function = object()
    assert registry.get_decomps(meta.fx_target) == []
    assert name not in registry.functions
    assert meta.fx_target not in set(_decomp.get_onnx_implemented_overloads(registry))
    relu = torch.ops.aten.relu.default
    assert len(registry.get_decomps(relu)) == 1


def test_torch_workers_are_let_go_before_long_runs(monkeypatch):
    """Before a CPU run whose kind last took 1 ms or more, with torch and the sessions both on
    more than one thread, torch's idle OpenMP workers are let go (libgomp's team of the calling
    thread ends: one thread fewer in the process), and torch starts new ones for its next
    parallel work, which computes as before. A one-thread session keeps them, and so do short
    runs (ORTModule's step measured: the bridge asks only for runs that took long enough)."""
    torch = _torch()
    from ortagent.torch import ORTModule, _bridge, _threads

    if not _threads.torch_workers_releasable():
        pytest.skip("torch's OpenMP runtime here is not libgomp: its workers are left as they are")
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1 << 20)

        def threads():
            return len(os.listdir("/proc/self/task"))

        want = x * 1.5
        x.mul_(1.0)                             # (a parallel region: torch's team of two)
        with_team = threads()
        _threads.release_torch_workers(1)
        assert threads() == with_team
        _threads.release_torch_workers(2)
        assert threads() == with_team - 1
        assert torch.equal(x * 1.5, want) and threads() == with_team

        asked = []
        monkeypatch.setattr(_bridge, "release_torch_workers", asked.append)
        model = ORTModule(_mlp())
        inputs = torch.randn(2, 20)
        model(inputs).sum().backward()          # (the first call's check measures the runs)
        asked.clear()                           # (on a loaded machine its runs can take 1 ms)
        monkeypatch.setattr(_bridge, "_RELEASE_ABOVE", 10.0)
        model(inputs).sum().backward()
        assert asked == []
        monkeypatch.setattr(_bridge, "_RELEASE_ABOVE", 0.0)
        model(inputs).sum().backward()
        assert asked == [0, 0]                  # (forward and backward; onnxruntime's thread count)
    finally:
        torch.set_num_threads(previous)


def test_default_sessions_spin_only_in_runs_and_given_options_are_kept():
    """Without session options, ORTModule's sessions let onnxruntime's intra-op threads spin
    only during a run where torch's OpenMP workers can be let go before it, and sleep between
    runs otherwise (threads spinning on after a run take the CPUs torch's own threads need in
    the same step); options the caller gives are used as they are."""
    torch = _torch()
    import ortagent
    from ortagent.torch import ORTModule, _threads

    x = torch.randn(2, 20)
    default = ORTModule(_mlp())
    default(x).sum().backward()
    (entry,) = [entry for entries in default._exports.values() for entry in entries]
    options = entry.runner.config.options()
    if _threads.torch_workers_releasable():
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
        assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    else:
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"

    given = ortagent.SessionOptions()
    given.intra_op_num_threads = 1
    kept = ORTModule(_mlp(), session_options=given)
    kept(x).sum().backward()
    (entry,) = [entry for entries in kept._exports.values() for entry in entries]
    assert entry.runner.config.options() is given


def test_a_failed_export_gives_the_collector_back():
    """An export that fails (the forward raises while traced) leaves the collector on and
    nothing frozen."""
    import gc

    torch = _torch()
    from ortagent.torch import _export

    class Refuses(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no")

    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(_export.TraceFailure, match="ValueError: no"):
        _export.export(Refuses(), _export._trees.flatten(((torch.randn(2, 3),), {}), "the arguments"))
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_forward_that_raises_on_one_call_keeps_the_exports():
    """A call whose own arguments make the forward raise ValueError while it is traced (eager
    raises on them too) is refused with a ValueError (an OrtInvalidArgument), and the exports
    made before stay: the next call reuses them (before, the refusal cleared every export and
    kept tracing each call's exact requires_grad)."""
    torch = _torch()
    from ortagent.torch import ORTModule, _export

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x, scale):
            if scale < 0:
                raise ValueError("a negative scale")
            return self.linear(x) * scale

    model = ORTModule(Scaled())
    x = torch.randn(5, 4)
    model(x, 1.0).sum().backward()
    model(x, 2.0).sum().backward()
    assert model.exported_graphs == 2
    with pytest.raises(ValueError):
        Scaled()(x, -1.0)
    with pytest.raises(ValueError, match="a negative scale") as refused:        # (eager's type too)
        model(x, -1.0)
    assert isinstance(refused.value, _export.TraceFailure)
    assert not model._exact_grads and sum(len(entries) for entries in model._exports.values()) == 2
    torch.testing.assert_close(model(x, 2.0), model.module(x, 2.0))
    assert model.exported_graphs == 2


def test_graph_builds_pause_the_collector(monkeypatch):
    """The training graph's build and the sessions' creation run with the collector paused, as
    exports do, and leave it on."""
    import gc

    import ortagent.training

    torch = _torch()
    from ortagent.torch import ORTModule

    seen = []
    original = ortagent.training.build_training_graph
    monkeypatch.setattr(ortagent.training, "build_training_graph",
                        lambda *a, **k: seen.append((gc.isenabled(), gc.get_freeze_count() > 0)) or original(*a, **k))
    model = ORTModule(_mlp())
    model(torch.randn(2, 20)).sum().backward()
    assert seen == [(False, True)]
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("before", ["collecting", "frozen by the caller", "collector disabled"])
def test_exports_pause_the_collector_only_while_they_run(monkeypatch, before):
    """An export moves the objects alive when it starts out of the collector's reach
    (gc.freeze) and turns automatic collections off while it runs, and puts both back at its
    end; a process that froze objects of its own, or disabled the collector, is left as it was
    (unfreezing would release the caller's)."""
    import gc

    torch = _torch()
    from ortagent.torch import _export

    during = []
    original = torch.export.export
    monkeypatch.setattr(torch.export, "export",
                        lambda *a, **k: during.append((gc.get_freeze_count(), gc.isenabled())) or original(*a, **k))
    enabled = gc.isenabled()
    if before == "frozen by the caller":
        gc.freeze()
    elif before == "collector disabled":
        gc.disable()
    try:
        count = gc.get_freeze_count()
        assert (count > 0) == (before == "frozen by the caller")
        _export.export(_mlp(), _export._trees.flatten(((torch.randn(2, 20),), {}), "the arguments"))
        after = gc.get_freeze_count()
        # (a frozen object that dies leaves the count: the caller's may only shrink)
        if before == "collecting":
            assert during[0][0] > 0 and not during[0][1] and after == 0
        elif before == "frozen by the caller":
            assert during[0][0] <= count and during[0][1] and 0 < after <= count
        else:
            assert during == [(0, False)] and after == 0
        assert gc.isenabled() == (before != "collector disabled")
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def _update_under_no_grad(kind):
    def function(x):
        torch = _torch()
        y = x * 2
        if kind == "detach_ with grad":
            y.detach_()
            return y * x
        with torch.no_grad():
            if kind == "mul_":
                y.mul_(0.5)
            elif kind == "imul":
                y *= 0.5
            elif kind == "setitem":
                y[0] = 1.0
            elif kind in ("clamp_", "clamp_ of large values"):
                y.clamp_(-0.5, 0.5)
            elif kind == "view":
                y[:, :2].add_(3.0)
            elif kind == "detach_":
                y.detach_()
        return y * x
    return function


def test_parameters_updated_in_place_by_the_forward_match_eager():
    """A forward that updates a parameter in place outside autograd (Gemma 3n clamps its AltUp
    coefficients with ``weight.data.clamp_``; ``weight.mul_`` under no_grad) leaves the
    parameter with the new value and takes the gradient at it, not through the update, as
    eager does: over optimizer steps, in training and eval (before: refused)."""
    torch = _torch()
    from ortagent.torch import ORTModule

    class Updates(torch.nn.Module):
        def __init__(self, how):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 2)
            self.how = how

        def forward(self, x):
            hidden = torch.tanh(self.fc(x))
            if self.how == "data":
                self.head.weight.data.clamp_(-0.2, 0.2)
            else:
                with torch.no_grad():
                    self.head.weight.mul_(0.5)
            return self.head(hidden), self.head.weight

    for how in ("data", "no_grad"):
        torch.manual_seed(0)
        eager = Updates(how)
        model = ORTModule(copy.deepcopy(eager))
        optimizers = [torch.optim.SGD(module.parameters(), lr=0.1) for module in (eager, model)]
        for step in range(3):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))
            results = []
            for module, optimizer in zip((eager, model), optimizers):
                optimizer.zero_grad()
                out, weight = module(x)
                (out.square().sum() + weight.sum()).backward()
                # (eager returns the parameter itself, which the step then updates)
                results.append([out, weight.detach().clone(), *(p.grad for p in module.parameters())])
                optimizer.step()
            for got, want in zip(results[1], results[0]):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        eager.eval()
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(model(x)[0], eager(x)[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.head.weight, eager.head.weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["mul_", "imul", "setitem", "clamp_", "clamp_ of large values", "view", "detach_",
                                  "detach_ with grad"])
def test_in_place_updates_under_no_grad_keep_torch_s_gradient(kind):
    """torch changes the values an in-place update makes under no_grad and records nothing: the
    gradient reaches the tensor as though the update were not there (y * x with y = 2x halved
    under no_grad: 3x, where differentiating through the update gives 2x). A detach_, under
    no_grad or not, cuts it (the bridge differentiated through both before: 4x for torch's 2x)."""
    torch = _torch()
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")
    from test_torch_translations import _assert_same

    torch.manual_seed(0)
    # (large values: the new values are taken exactly, not as old + (new - old), which rounds
    # 2e8 + (0.5 - 2e8) to 0 in float32)
    scale = 1e8 if kind == "clamp_ of large values" else 1.0
    _assert_same(_update_under_no_grad(kind), torch.randn(4, 6) * scale)


def test_updates_through_data_reach_the_tensor():
    """``t.data.op_(...)`` changes ``t`` in eager. The trace's ``.data`` was a new value, so the
    update changed nothing the graph read (a weight clipped through ``.data`` in the forward:
    outputs and gradients of the unclipped weight, silently, and the parameter left as it was).
    A buffer's update now reaches the buffer (copied back after the run, as eager's), and so
    does a parameter's, whose gradient is taken at the clipped value (the clip is outside
    autograd, as eager's); before, it was refused."""
    torch = _torch()

    class Counted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("count", torch.zeros(4))

        def forward(self, x):
            self.count.data.add_(1.0)
            return self.linear(x) * self.count

    x = torch.randn(3, 4)
    eager, bridged, errors = _compare(Counted, lambda step: (x,), lambda out: (out ** 2).mean(), steps=2)
    assert torch.equal(bridged.module.count, torch.full((4,), 2.0)) and torch.equal(eager.count, bridged.module.count)

    class Clipped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            self.linear.weight.data.clamp_(-0.1, 0.1)
            return self.linear(x)

    eager, bridged, errors = _compare(Clipped, lambda step: (x,), lambda out: (out ** 2).mean(), steps=3)
    assert bridged.module.linear.weight.abs().max() <= 0.1
    assert torch.equal(eager.linear.weight, bridged.module.linear.weight)


def test_a_gradient_inside_the_forward_is_refused_with_its_reason():
    """A gradient penalty (torch.autograd.grad with create_graph inside the forward) cannot be
    one exported forward: refused, naming the call (before: torch.export's 'fake tensor in the
    exported program constant's list')."""
    torch = _torch()
    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Penalized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x):
            score = self.linear(torch.tanh(x)).sum()
            (slope,) = torch.autograd.grad(score, x, create_graph=True)
            return score + slope.square().sum()

    with pytest.raises(OrtNotImplemented, match="torch.autograd.grad"):
        ORTModule(Penalized())(torch.randn(3, 4, requires_grad=True))


@pytest.mark.parametrize("case", ["mv_of_transpose", "matmul_of_transpose"])
def test_a_transposed_matrix_times_a_vector(case):
    """onnxruntime 1.31's MatMul/Transpose fusion computes Transpose(A) @ v with a vector v as
    A @ v (optimisation level extended and above). ortagent writes the vector as a one-column
    matrix in every graph it hands onnxruntime, so ``mv(w.t(), u)`` and its gradients are
    torch's, in training and in eval mode."""
    torch = _torch()
    from ortagent.torch import ORTModule

    u = torch.randn(6)

    class Product(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(6, 6))

        def forward(self, x):
            product = torch.mv(self.w.t(), x) if case == "mv_of_transpose" else self.w.transpose(0, 1) @ x
            return product * u

    x = torch.randn(6)
    _compare(Product, lambda step: (x,), lambda out: (out ** 2).sum())
    torch.manual_seed(0)
    eager = Product().eval()
    bridged = ORTModule(copy.deepcopy(eager)).eval()
    with torch.no_grad():
        torch.testing.assert_close(bridged(x), eager(x))


@pytest.mark.parametrize("flavour", ["hook", "parametrization"])
def test_spectral_norm_trains_beside_eager(flavour):
    """Spectral norm's power iteration writes its vectors into buffers under no_grad (``out=``
    of ``normalize``, a ``copy_``) from products with the transposed weight: the written values
    carry no gradient, the buffers come back updated, and the products are onnxruntime's right
    ones (before: outputs 0.58 and gradients ~50 off eager's, the buffers wrong)."""
    torch = _torch()

    def make():
        linear = torch.nn.Linear(6, 6)
        normed = torch.nn.utils.spectral_norm(linear) if flavour == "hook" else \
            torch.nn.utils.parametrizations.spectral_norm(linear)
        return torch.nn.Sequential(normed, torch.nn.Tanh())

    x = torch.randn(3, 6)
    _compare(make, lambda step: (x,), lambda out: (out ** 2).sum(), steps=3)


def test_values_written_under_no_grad_carry_no_gradient():
    """``torch.mul(w, 2, out=buffer)`` under no_grad writes values with no gradient (torch
    records nothing): the graph wrote the computation into the buffer and differentiated
    through it (a gradient 8.2 off eager's)."""
    torch = _torch()

    class Written(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))
            self.register_buffer("doubled", torch.ones(4))

        def forward(self, x):
            with torch.no_grad():
                torch.mul(self.w, 2, out=self.doubled)
            return x * self.doubled * self.w

    x = torch.randn(3, 4)
    _compare(Written, lambda step: (x,), lambda out: out.sum(), steps=2)


def test_a_python_branch_on_a_tensor_value_is_taken_and_checked_by_the_graph():
    """``if labels.max() >= 10: raise`` (transformers' CTC heads) and a branch on the values the
    forward computes: the export takes each as the discovery saw it (before: refused, a
    data-dependent decision), and the graph checks the condition: an input that would take a
    branch the other way stops the run (FailedValueCheck, a ValueError), never runs the branch
    the graph holds; the graph serves the inputs that agree afterwards."""
    torch = _torch()
    from ortagent.torch import ORTModule
    from ortagent.torch._module import FailedValueCheck

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x, labels):
            if labels.max() >= 10:
                raise ValueError("labels past the classes")
            y = self.linear(x)
            if (y.abs() > 100).any():
                y = y.clamp(-100, 100)
            return (y * labels.unsqueeze(1)).sum()

    torch.manual_seed(0)
    eager = Head()
    wrapped = ORTModule(copy.deepcopy(eager))
    x = torch.randn(2, 4)
    for labels in (torch.tensor([1, 2]), torch.tensor([9, 0])):
        got, want = wrapped(x, labels), eager(x, labels)
        got.backward()
        want.backward()
        _close(got, want, "loss")
        for a, e in zip(wrapped.parameters(), eager.parameters()):
            _close(a.grad, e.grad, "gradient")
    with pytest.raises(ValueError, match="labels past"):
        eager(x, torch.tensor([3, 10]))
    with pytest.raises(FailedValueCheck, match="Python branch on a tensor's value") as failure:
        wrapped(x, torch.tensor([3, 10]))
    # (the message names the branches the graph holds, by line)
    assert "test_torch_bridge.py" in str(failure.value) and "taken as False" in str(failure.value)
    with pytest.raises(FailedValueCheck):
        wrapped(x * 1000, torch.tensor([1, 2]))      # eager clamps: the graph does not hold that branch
    _close(wrapped(x, torch.tensor([4, 5])), eager(x, torch.tensor([4, 5])), "loss")
    assert wrapped.exported_graphs == 1


def test_tensors_made_from_numpy_arrays():
    """A NumPy array made the same way at each call is a constant of the graph; one drawn from
    NumPy's generator in the forward (which one graph would hold for every call) is refused
    with its reason, where before the graph silently kept the first draw."""
    torch = _torch()
    import numpy as np

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Scaled(torch.nn.Module):
        def __init__(self, draw):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)
            self.draw = draw

        def forward(self, x):
            scale = np.random.rand(3) if self.draw else np.arange(1, 4) / 2
            return self.linear(x) * torch.tensor(scale, dtype=x.dtype)

    x = torch.randn(2, 3)
    fixed = Scaled(False)
    _close(ORTModule(copy.deepcopy(fixed))(x), fixed(x), "output")
    with pytest.raises(OrtNotImplemented, match="NumPy array .* changed between two runs"):
        ORTModule(Scaled(True))(x)


def test_a_branch_in_a_loop_known_in_one_pass_and_not_the_next():
    """The same line branches on a value the export knows (a shape-derived tensor) and then on
    one it does not: each takes the discovery's outcome of its own pass."""
    torch = _torch()
    from ortagent.torch import ORTModule

    class Loop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)

        def forward(self, x):
            for probe in (torch.tensor(float(x.shape[0])), x.sum()):
                if probe > 0:
                    x = self.linear(x)
                else:
                    x = -x
            return x.sum()

    torch.manual_seed(1)
    eager = Loop()
    wrapped = ORTModule(copy.deepcopy(eager))
    x = torch.randn(4, 3)
    if x.sum() > 0:
        x = -x                  # the second pass takes its else branch at the export
    _close(wrapped(x), eager(x), "loss")
    _close(wrapped(x * 2), eager(x * 2), "loss")


def test_numbers_drawn_from_python_and_numpy_generators_in_the_forward():
    """``x * random.uniform(0.5, 1.5)`` reads each call's draw, made by the bridge before the
    run from Python's generator as eager's forward makes it (before: the trace's draw, a
    constant); a seeding inside the forward is refused."""
    torch = _torch()
    import random

    import numpy as np

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Jitter(torch.nn.Module):
        def __init__(self, seeds=False):
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)
            self.seeds = seeds

        def forward(self, x):
            if self.seeds:
                np.random.seed(0)
            return self.linear(x) * random.uniform(0.5, 1.5) + np.random.uniform(-1.0, 1.0)

    torch.manual_seed(2)
    eager = Jitter()
    wrapped = ORTModule(copy.deepcopy(eager))
    x = torch.randn(4, 3)
    for seed in range(3):
        outputs = []
        for module in (wrapped, eager):
            random.seed(seed)
            np.random.seed(seed)
            outputs.append(module(x))
            outputs.append(torch.tensor([random.random(), np.random.random()]))
        _close(outputs[0], outputs[2], "output")
        assert torch.equal(outputs[1], outputs[3])          # both streams left where eager's are
    with pytest.raises(OrtNotImplemented, match="seeds numpy's random generator"):
        ORTModule(Jitter(seeds=True))(x)


def test_the_trace_imports_nothing_of_transformers():
    """The trace's patch of transformers' SpecAugment draw reads the modules already imported
    without asking transformers' lazy packages for a name (which imported every modeling module,
    0.9 s of each first call in a process that imported transformers)."""
    torch = _torch()
    import sys

    pytest.importorskip("transformers")
    import transformers  # noqa: F401

    from ortagent.torch import ORTModule

    before = {name for name in sys.modules if name.startswith("transformers.")}
    ORTModule(torch.nn.Linear(3, 2))(torch.randn(4, 3)).sum().backward()
    assert {name for name in sys.modules if name.startswith("transformers.")} == before
