"""ORTModule behaves as the module it wraps: names, attributes, methods, the forward's
signature, docstring and repr, train/eval/to/requires_grad_, copies; and the module's plain
Python state (numbers, flags, strings, config objects) is part of each export's key, so
changing it never leaves a stale graph. Each check compares with the bare module."""

from __future__ import annotations

import copy
import inspect
import weakref

import pytest

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def _net():
    import torch

    class Config:
        def __init__(self):
            self.use_extra = False
            self.mode = "sum"

    class Net(torch.nn.Module):
        """A net with settings its forward reads."""

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 4)
            self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 2))
            self.register_buffer("offset", torch.zeros(2))
            self.scale = 2.0
            self.config = Config()

        def forward(self, x, labels=None, *, temperature: float = 1.0):
            """Logits, and a loss when labels are given."""
            out = self.head(self.fc(x) * self.scale) + self.offset
            if self.config.use_extra:
                out = out + 1.0
            if self.config.mode == "mean":
                out = out - out.mean()
            return out / temperature

        def describe(self):
            return f"scale {self.scale}"

    torch.manual_seed(0)
    return Net()


def _close(a, b):
    import torch

    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()


def _matches_eager(model, eager, x, exports):
    """One step of ``model`` (an ORTModule) and ``eager`` on ``x``: the same outputs and every
    parameter's gradient the same, with ``exports`` exports made so far."""
    for module in (model, eager):
        module.zero_grad()
    out, want = model(x), eager(x)
    _close(out, want)
    out.square().sum().backward()
    want.square().sum().backward()
    for got, expected in zip(model.parameters(), eager.parameters()):
        _close(got.grad, expected.grad)
    assert model.exported_graphs == exports


def test_names_match_the_bare_module():
    from ortagent.torch import ORTModule

    net = _net()
    model = ORTModule(net)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in net.named_parameters()]
    assert [n for n, _ in model.named_buffers()] == [n for n, _ in net.named_buffers()]
    assert [n for n, _ in model.named_modules()] == [n for n, _ in net.named_modules()]
    assert list(model.state_dict()) == list(net.state_dict())
    assert all(a is b for a, b in zip(model.parameters(), net.parameters()))
    # inside another module, the names are the wrapped module's under the attribute's name
    import torch

    outer = torch.nn.Module()
    outer.body = ORTModule(_net())
    names = [n for n, _ in outer.named_parameters()]
    assert names == ["body." + n for n, _ in net.named_parameters()]
    assert list(outer.state_dict()) == ["body." + n for n in net.state_dict()]
    outer.load_state_dict({"body." + k: v for k, v in net.state_dict().items()})
    _close(outer.body.fc.weight, net.fc.weight)


def test_attributes_and_methods_reach_the_wrapped_module():
    from ortagent.torch import ORTModule

    net = _net()
    model = ORTModule(net)
    assert model.scale == 2.0 and model.config is net.config and model.fc is net.fc
    assert model.describe() == net.describe()
    model.scale = 3.0                       # a plain attribute of the module, written through
    assert net.scale == 3.0 and "scale" not in vars(model)
    model.new_setting = "x"
    assert net.new_setting == "x"
    del model.new_setting
    assert not hasattr(net, "new_setting")
    with pytest.raises(AttributeError):
        model.no_such_attribute
    assert "describe" in dir(model)


def test_signature_docstring_and_repr_are_the_wrapped_modules():
    from ortagent.torch import ORTModule

    net = _net()
    model = ORTModule(net)
    assert inspect.signature(model.forward) == inspect.signature(net.forward)
    assert list(inspect.signature(model.forward).parameters) == ["x", "labels", "temperature"]
    assert model.forward.__doc__ == net.forward.__doc__
    assert model.__doc__ == net.__doc__
    assert repr(model) == repr(net)


def test_train_eval_to_requires_grad_and_copies():
    import torch

    from ortagent.torch import ORTModule

    net = _net()
    model = ORTModule(net)
    x = torch.randn(5, 3)
    model.eval()
    assert not net.training and not net.fc.training and not model.training
    model.train()
    assert net.training and net.head[1].training
    model.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    model.requires_grad_(True)
    model.to(torch.float64)
    assert net.fc.weight.dtype == torch.float64
    model.to(torch.float32)
    out = model(x)
    _close(out, net(x))
    twin = copy.deepcopy(model)             # an EMA copy, say: its own module, its own exports
    assert twin.module is not net and twin.exported_graphs == 0
    with torch.no_grad():
        twin.fc.weight.add_(1.0)
    _close(model(x), net(x))
    _close(twin(x), twin.module(x))
    calls = []
    handle = model.register_forward_hook(lambda module, args, output: calls.append(output.shape))
    model(x)
    handle.remove()
    assert calls == [torch.Size([5, 2])]


def test_hooks_registered_or_removed_after_an_export_export_again():
    """A submodule's forward hook (or pre-hook) registered after the first call changes what
    the module computes: the next call exports again and matches eager with the hook, and
    after the hook is removed, eager without it (before, the graph of the first export ran on,
    the hook unseen, or its effect kept after its removal). A backward hook registered later is
    refused at the next call, as one there at the first call is."""
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    net = _net()
    eager = copy.deepcopy(net)
    model = ORTModule(net)
    x = torch.randn(6, 3)

    _matches_eager(model, eager, x, 1)
    scale = [model.module.fc.register_forward_hook(lambda module, args, output: output * 2.0),
             eager.fc.register_forward_hook(lambda module, args, output: output * 2.0)]
    _matches_eager(model, eager, x, 2)
    shift = [model.module.register_forward_pre_hook(lambda module, args: (args[0] + 1.0,)),
             eager.register_forward_pre_hook(lambda module, args: (args[0] + 1.0,))]
    _matches_eager(model, eager, x, 3)
    for handle in scale + shift:
        handle.remove()
    _matches_eager(model, eager, x, 3)        # (the first export's key again: its graph)
    handle = model.module.fc.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    with pytest.raises(OrtNotImplemented, match="backward hook"):
        model(x)
    handle.remove()
    _matches_eager(model, eager, x, 3)


def test_hooked_modules_stay_out_of_the_disk_cache(tmp_path, monkeypatch):
    """The disk cache's key names the modules' classes and their code, not a hook's: a module
    with a forward hook exports without the cache, so another process (here another ORTModule
    on the same folder, its hook registered under the same handle id, as a restarted job's
    would be) whose hook does something else gets its own graph, not the first one's."""
    import torch
    from torch.utils.hooks import RemovableHandle

    from ortagent.torch import ORTModule

    x = torch.randn(6, 3)
    first_id = RemovableHandle.next_id
    for factor in (2.0, 3.0):
        net = _net()
        eager = copy.deepcopy(net)
        eager.fc.register_forward_hook(lambda module, args, output, factor=factor: output * factor)
        monkeypatch.setattr(RemovableHandle, "next_id", first_id)
        net.fc.register_forward_hook(lambda module, args, output, factor=factor: output * factor)
        model = ORTModule(net, cache_dir=tmp_path)
        _close(model(x), eager(x))


def test_replaced_submodules_and_assigned_forwards_export_again():
    """A submodule replaced after the first call by one of another class (Tanh by ReLU), or a
    forward assigned to a submodule instance (as libraries that wrap a forward do), changes what
    the module computes: the next call exports again and matches eager (before, the first
    export's graph ran on). A replacement of the same class and settings reuses the export; a
    replaced Dropout with another drop rate does not (its state is read from the new module)."""
    import torch

    from ortagent.torch import ORTModule

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2), torch.nn.Dropout(0.0))
    eager = copy.deepcopy(net)
    model = ORTModule(net)
    x = torch.randn(5, 4)

    _matches_eager(model, eager, x, 1)
    model.module[1], eager[1] = torch.nn.ReLU(), torch.nn.ReLU()
    _matches_eager(model, eager, x, 2)
    for sequential in (model.module, eager):
        sequential[1].forward = lambda t: t * 3.0
    _matches_eager(model, eager, x, 3)
    for sequential in (model.module, eager):
        del sequential[1].forward
    _matches_eager(model, eager, x, 3)                                # (the ReLU's export again)
    model.module[0], eager[0] = copy.deepcopy(eager[0]), eager[0]      # (same class, new object)
    _matches_eager(model, eager, x, 3)
    model.module[3], eager[3] = torch.nn.Dropout(1.0), torch.nn.Dropout(1.0)
    _matches_eager(model, eager, x, 4)                                # (everything dropped: zero outputs either way)

    class Scale(torch.nn.Module):
        """Equal to every other Scale, as a module class may declare."""

        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def forward(self, x):
            return x * self.factor

        def __eq__(self, other):
            return isinstance(other, Scale)

        __hash__ = torch.nn.Module.__hash__

    model.module[3], eager[3] = Scale(2.0), Scale(2.0)
    _matches_eager(model, eager, x, 5)
    model.module[3], eager[3] = Scale(3.0), Scale(3.0)
    _matches_eager(model, eager, x, 6)      # (another object: its factor is read, not the old one's)


def test_tensor_attributes_updated_or_replaced_export_again(tmp_path):
    """A tensor attribute the forward reads (not a parameter or buffer) is baked into the graph
    as a constant: updated in place or replaced after an export, the next call exports again
    and matches eager (before, the old value ran on). Such graphs are not kept in the disk
    cache: another module with another value under the same key exports its own."""
    import torch

    from ortagent.torch import ORTModule

    class Scaled(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.scale = torch.tensor(scale)

        def forward(self, x):
            return self.fc(x) * self.scale

    torch.manual_seed(0)
    net = Scaled(2.0)
    eager = copy.deepcopy(net)
    model = ORTModule(net, cache_dir=tmp_path)
    x = torch.randn(3, 4)

    _matches_eager(model, eager, x, 1)
    _matches_eager(model, eager, x, 1)
    for module in (model.module, eager):
        module.scale.fill_(3.0)
    _matches_eager(model, eager, x, 2)
    model.module.scale, eager.scale = torch.tensor(5.0), torch.tensor(5.0)
    _matches_eager(model, eager, x, 3)
    pending = [model(x), eager(x)]          # (a forward whose backward comes after the change)
    model.module.scale, eager.scale = torch.tensor(6.0), torch.tensor(6.0)
    _matches_eager(model, eager, x, 4)
    for out in pending:
        out.square().sum().backward()
    _close(model.fc.weight.grad, eager.fc.weight.grad)
    torch.manual_seed(0)
    other = Scaled(7.0)
    _matches_eager(ORTModule(copy.deepcopy(other), cache_dir=tmp_path), other, x, 1)


def test_changed_python_state_exports_again_never_a_stale_graph():
    import torch

    from ortagent.torch import ORTModule

    net = _net()
    eager = copy.deepcopy(net)
    model = ORTModule(net)
    x = torch.randn(6, 3)

    def check():
        out = model(x, temperature=0.5)
        out.square().sum().backward()
        expected = eager(x, temperature=0.5)
        expected.square().sum().backward()
        _close(out.detach(), expected.detach())
        for a, b in zip(net.parameters(), eager.parameters()):
            _close(a.grad, b.grad)
            a.grad = None
            b.grad = None

    check()
    assert model.exported_graphs == 1
    for change in (lambda m: setattr(m, "scale", 3.0),                  # a number
                   lambda m: setattr(m.config, "use_extra", True),      # a flag in a config object
                   lambda m: setattr(m.config, "mode", "mean")):        # a string
        change(net)
        change(eager)
        check()
    assert model.exported_graphs == 4
    net.scale = 2.0                          # back to an earlier state: that export serves again
    eager.scale = 2.0
    check()
    assert model.exported_graphs == 5       # (scale 2.0 with the later flags is a new state)
    check()
    assert model.exported_graphs == 5


@pytest.mark.parametrize("layers", ["mlp", "conv"])
def test_float16_autocast_on_the_cpu_is_honoured(layers):
    """torch.autocast('cpu', dtype=torch.float16) around the forward: the exported graph casts
    where torch's autocast does (its output is float16 as eager's), the parameters and their
    gradients stay float32, and both agree with eager under the same autocast to float16's
    precision; an export made under autocast is not reused outside it."""
    import copy

    import torch

    from ortagent.torch import ORTModule

    torch.manual_seed(0)
    if layers == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                  torch.nn.Linear(16, 4))
        x = torch.randn(5, 8)
    else:
        net = torch.nn.Sequential(torch.nn.Conv1d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                  torch.nn.Linear(80, 4))
        x = torch.randn(5, 3, 10)
    bridged = ORTModule(copy.deepcopy(net))
    outputs = []
    for model in (net, bridged):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x.clone().requires_grad_())
        outputs.append(out)
        (out.float() ** 2).sum().backward()
    assert outputs[0].dtype == outputs[1].dtype == torch.float16
    torch.testing.assert_close(outputs[1], outputs[0], rtol=2e-3, atol=2e-3)
    for (name, expected), got in zip(net.named_parameters(), bridged.parameters()):
        assert got.dtype == got.grad.dtype == torch.float32, name
        scale = expected.grad.abs().max()
        torch.testing.assert_close(got.grad / scale, expected.grad / scale, rtol=0, atol=3e-3, msg=name)
    plain = bridged(x)
    assert plain.dtype == torch.float32 and bridged.exported_graphs == 2
    _close(plain.detach(), net(x).detach())


def test_autocast_is_refused_by_name():
    """bfloat16 autocast on the CPU: onnxruntime's CPU provider lacks the kernels."""
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    model = ORTModule(_net())
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(OrtNotImplemented) as error:
        model(torch.randn(2, 3))
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in str(error.value) and "CPU provider" in str(error.value)
    assert model.exported_graphs == 0
    x = torch.randn(2, 3)
    _close(model(x).detach(), model.module(x).detach())        # outside autocast it runs


def test_lazy_modules_materialize_as_eager():
    """Lazy* modules get their parameters from one eager call on the first batch (same weights
    as eager from the same seed); buffers (running statistics) count one step, not two."""
    import torch

    from ortagent.torch import ORTModule

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.LazyConv2d(4, 3), torch.nn.LazyBatchNorm2d(), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.LazyLinear(2))

    net, eager = make(), make()
    model = ORTModule(net)
    x = torch.randn(3, 2, 6, 6)
    for step in range(2):
        out = model(x)
        out.square().sum().backward()
        expected = eager(x)
        expected.square().sum().backward()
        _close(out.detach(), expected.detach())
        for a, b in zip(net.parameters(), eager.parameters()):
            assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-4 * max(b.grad.abs().max().item(), 1e-2))
        for a, b in zip(net.buffers(), eager.buffers()):
            assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
    assert type(net[0]) is torch.nn.Conv2d and model.exported_graphs == 1


def _trees_to_walk():
    """Module trees whose walk order has corners: a shared submodule, tied weights, a None
    parameter and buffer, a non-persistent buffer, torchvision's and a parametrized module,
    and a class that walks its own way."""
    import torch
    from torch import nn

    shared = nn.Linear(4, 4)
    tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    holes = nn.Linear(4, 4)
    holes.register_parameter("unused", None)
    holes.register_buffer("missing", None)
    holes.register_buffer("scratch", torch.zeros(3), persistent=False)
    parametrized = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))

    class OwnWalk(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.BatchNorm1d(2)

        def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
            return reversed(list(super().named_parameters(prefix, recurse, remove_duplicate)))

    class OwnModules(nn.Module):         # (lists its submodules last to first)
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.Tanh())

        def named_modules(self, memo=None, prefix="", remove_duplicate=True):
            return reversed(list(super().named_modules(memo, prefix, remove_duplicate)))

    trees = [nn.Sequential(shared, nn.ReLU(), shared, nn.Sequential(shared, holes)), tied, parametrized,
             nn.Sequential(nn.Linear(2, 2), OwnWalk()), nn.Sequential(nn.Linear(2, 2), OwnModules())]
    torchvision = pytest.importorskip("torchvision")
    trees.append(torchvision.models.mobilenet_v3_small(num_classes=5))
    return trees


def test_one_walk_lists_modules_parameters_and_buffers_as_torch_does():
    """A call walks the module tree once (ortagent.torch._state.walk_module): its modules,
    parameters and buffers are torch's own lists, in torch's order, every tensor once."""
    from ortagent.torch._state import walk_module

    for tree in _trees_to_walk():
        walked = walk_module(tree)
        assert walked.modules == tuple(tree.modules())
        expected = [value for _, value in tree.named_parameters()] + [value for _, value in tree.named_buffers()]
        assert len(walked.state) == len(expected)
        assert all(a is b for a, b in zip(walked.state, expected))


def test_a_call_of_tensors_flattens_as_torchs_pytree_does():
    """ortagent.torch._trees.flatten_call keeps the structure of calls passing only tensors:
    what it gives equals torch's pytree flattening of (args, kwargs) for every such call,
    keyword order included, and calls with other leaves take torch's pytree."""
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import _trees

    a, b, c = torch.randn(2), torch.nn.Parameter(torch.randn(3)), torch.randn(1)
    calls = [((a,), {}), ((a, b), {}), ((), {"x": a, "y": b}), ((), {"y": b, "x": a}), ((a,), {"mask": c}),
             ((a, None), {}), ((a,), {"n": 3}), (([a, b],), {}), ((a,), {"x": {"y": c}})]
    for _ in range(2):                  # (the second time from the kept structures)
        for args, kwargs in calls:
            fast = _trees.flatten_call(args, kwargs)
            slow = _trees.flatten((tuple(args), dict(kwargs)), "the arguments")
            assert fast.spec == slow.spec
            assert fast.constants == slow.constants and fast.tensor_positions == slow.tensor_positions
            assert len(fast.tensors) == len(slow.tensors)
            assert all(x is y for x, y in zip(fast.tensors, slow.tensors))
            rebuilt_args, rebuilt_kwargs = fast.rebuild(fast.tensors)
            assert len(rebuilt_args) == len(args) and list(rebuilt_kwargs) == list(kwargs)
            assert all(x is y for x, y in zip(rebuilt_args, args) if isinstance(y, torch.Tensor))
    with pytest.raises(OrtNotImplemented, match="layout"):
        _trees.flatten_call((a.to_sparse(),), {})


def test_a_parameter_registered_after_an_export_exports_again():
    """The number of parameters and buffers is part of an export's key: one registered later
    (here a buffer the forward reads) gives a new export, never inputs fed one place off."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            extra = getattr(self, "extra", None)
            return self.fc(x) if extra is None else self.fc(x) + extra

    from ortagent.torch import ORTModule

    net = Net()
    bridged = ORTModule(net)
    x = torch.randn(2, 3)
    bridged(x).sum().backward()
    net.register_buffer("extra", torch.full((3,), 5.0))
    out = bridged(x)
    torch.testing.assert_close(out, net.fc(x) + 5.0)
    assert bridged.exported_graphs == 2


def test_retain_graph_backwards_and_autograd_grad_as_eager():
    """Several backwards through one forward (a loss per head with retain_graph, then
    torch.autograd.grad of another loss) accumulate eager's gradients; the run's stash is kept
    only while torch keeps the graph, and a backward after the graph was freed is refused with
    a typed error naming retain_graph, as eager refuses it."""
    import torch

    from ortagent.errors import RunStateError
    from ortagent.torch import ORTModule

    eager = _net()
    model = ORTModule(copy.deepcopy(eager))
    x = torch.randn(5, 3, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_()
    results = {}
    for name, module, inputs in (("ort", model, x), ("eager", eager, x_eager)):
        out = module(inputs)
        out[:, 0].square().sum().backward(retain_graph=True)
        out[:, 1].exp().sum().backward(retain_graph=True)
        (slope,) = torch.autograd.grad(out.tanh().sum(), inputs, retain_graph=True)
        out.sum().backward()
        results[name] = (out, slope, inputs.grad, [p.grad for p in module.parameters()])
        if module is model:
            assert out.grad_fn.state is None        # the last backward freed the run
            with pytest.raises(RunStateError, match="retain_graph=True"):
                out.sum().backward()
    (out, slope, x_grad, grads), (want, want_slope, want_x_grad, want_grads) = results["ort"], results["eager"]
    _close(out, want)
    _close(slope, want_slope)
    _close(x_grad, want_x_grad)
    for got, expected in zip(grads, want_grads):
        _close(got, expected)
    kept = model(x)
    kept.sum().backward(retain_graph=True)
    assert kept.grad_fn.state.retained and kept.grad_fn.state.waiting_for_backward
    state = weakref.ref(kept.grad_fn.state)
    del kept
    assert state() is None                          # (freed with the graph)


def test_what_the_loss_does_not_reach_keeps_no_gradient_as_eager():
    """A head whose output the loss leaves unused, an input that reaches only that head, a
    submodule the forward never calls, and parameters the forward reads only through a
    comparison or ``detach()`` get no gradient (None), as eagerly: AdamW then leaves their
    weights alone (a zero gradient would decay them and move their moments). A head used with a
    zero factor, a parameter the forward rounds (whose derivative torch takes as zero) and
    ``copysign``'s sign operand get zeros, as eager's."""
    import torch

    from ortagent.torch import ORTModule

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = torch.nn.Linear(3, 4)
            self.first = torch.nn.Linear(4, 2)
            self.second = torch.nn.Linear(4, 3)
            self.side = torch.nn.Linear(2, 3)
            self.spare = torch.nn.Linear(3, 3)      # (as BartForCausalLM's cross-attention)
            self.steps = torch.nn.Parameter(torch.full((4,), 2.2))
            self.threshold = torch.nn.Parameter(torch.full((4,), 0.1))
            self.gain = torch.nn.Parameter(torch.full((4,), 1.5))
            self.sign = torch.nn.Parameter(torch.tensor([1.0, -1.0, 1.0, -1.0]))

        def forward(self, x, extra):
            hidden = torch.relu(self.trunk(x)) * self.steps.round()
            hidden = hidden * (hidden > self.threshold) * self.gain.detach() + torch.copysign(hidden, self.sign)
            return self.first(hidden), self.second(hidden) + self.side(extra)

    torch.manual_seed(0)
    eager = TwoHeads()
    model = ORTModule(copy.deepcopy(eager))
    optimizers = {module: torch.optim.AdamW(module.parameters(), lr=0.1, weight_decay=0.5)
                  for module in (eager, model)}
    for losses in (lambda a, b: a.square().sum(),
                   lambda a, b: a.sum() + 0.0 * b.sum(),
                   lambda a, b: b.exp().sum()):
        results = []
        for module in (eager, model):
            optimizers[module].zero_grad()
            x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
            extra = torch.randn(5, 2, generator=torch.Generator().manual_seed(2)).requires_grad_()
            losses(*module(x, extra)).backward()
            results.append((x.grad, extra.grad, [p.grad for p in module.parameters()]))
            optimizers[module].step()
        (x_grad, extra_grad, grads), (want_x, want_extra, want_grads) = results[1], results[0]
        for got, want in zip((x_grad, extra_grad, *grads), (want_x, want_extra, *want_grads)):
            assert (got is None) == (want is None)
            if want is not None:
                _close(got, want)
    for got, want in zip(model.parameters(), eager.parameters()):
        _close(got, want)


def test_a_backward_that_creates_a_graph_is_refused_not_dropped():
    """A backward with create_graph=True (a gradient penalty, a Hessian) raises OrtNotImplemented:
    onnxruntime's gradients carry no graph, so the penalty's share of the gradient would be
    lost without a word and a Hessian through the module would be zero. The module's first-order
    gradients stay eager's, and the run is not spent by the refusal."""
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    eager = _net()
    model = ORTModule(copy.deepcopy(eager))
    slopes = []
    for module in (eager, model):
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
        out = module(x).tanh().sum()
        if module is model:
            with pytest.raises(OrtNotImplemented, match="create_graph"):
                torch.autograd.grad(out, x, create_graph=True)
        slopes.append(torch.autograd.grad(out, x)[0])
    _close(slopes[1], slopes[0])
    with pytest.raises(OrtNotImplemented, match="create_graph"):
        torch.autograd.functional.hessian(lambda v: model(v).tanh().sum(), torch.randn(2, 3))


def test_a_forward_that_keeps_what_it_computes_is_refused_and_its_state_changes_warned():
    """ORTModule runs the forward's Python only to export it: tensors that the forward or a
    forward hook keeps outside its outputs (a hook's capture list, ``self.last = h``, a list
    attribute) would hold the export's placeholders, so the call is refused with
    OrtNotImplemented naming them, and an attribute set by the forward is put back. A plain
    value the forward changes (a call counter) is warned of. Hooks that hand their captures
    back through the forward's outputs (timm's feature hooks), tensor attributes the forward
    recomputes before use (hook-based weight_norm) and a dict the forward fills as a cache
    (timm's LeViT in eval mode) match eager, at a second shape too."""
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    class Net(torch.nn.Module):
        def __init__(self, keep=None):
            super().__init__()
            self.body = torch.nn.Linear(3, 4)
            self.head = torch.nn.Linear(4, 2)
            self.keep = keep
            self.last = None
            self.norms = []
            self.calls = 0
            self.features = {}

        def forward(self, x):
            hidden = torch.tanh(self.body(x))
            if self.keep == "attribute":
                self.last = hidden.detach()
            elif self.keep == "list":
                self.norms.append(hidden.detach().norm())
            elif self.keep == "count":
                self.calls += 1
            out = self.head(hidden)
            return (out, self.features.pop("body")) if self.features else out

    x = torch.randn(5, 3)
    captured = []
    hooked = Net()
    hooked.body.register_forward_hook(lambda module, args, out: captured.append(out))
    for model, where in ((hooked, "captured"), (Net("attribute"), "Net.last"), (Net("list"), "Net.norms[0]")):
        wrapped = ORTModule(model)
        with pytest.raises(OrtNotImplemented, match=r"keeps tensors it computes outside its outputs \(" +
                           where.replace(".", r"\.").replace("[", r"\[")):
            wrapped(x)
        assert model.last is None
    counting = ORTModule(Net("count"))
    with pytest.warns(RuntimeWarning, match=r"changed Net\.calls while it was exported"):
        counting(x)

    class Cached(torch.nn.Module):
        """Fills a dict attribute as a cache in eval mode (timm's LeViT: attention biases by device)."""

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)
            self.bias = torch.nn.Parameter(torch.randn(2))
            self.cache = {}

        def forward(self, x):
            if self.training:
                return self.fc(x) + self.bias.exp()
            if x.device.type not in self.cache:
                self.cache[x.device.type] = self.bias.exp()
            return self.fc(x) + self.cache[x.device.type]

    eager = Cached().eval()
    model = ORTModule(copy.deepcopy(eager))
    for rows in (5, 7):                     # (the second shape exports again: the cache is traced anew)
        _close(model(torch.ones(rows, 3)), eager(torch.ones(rows, 3)))
    assert model.cache == {}

    def featured():
        torch.manual_seed(0)
        net = Net()
        net.body.register_forward_hook(lambda module, args, out: net.features.update(body=out))
        torch.nn.utils.weight_norm(net.head)
        return net

    eager, model = featured(), featured()
    wrapped = ORTModule(model)
    for module in (eager, wrapped):
        out, feature = module(x)
        (out.square().sum() + feature.sum()).backward()
    from torch._subclasses.fake_tensor import is_fake

    assert not is_fake(model.head.weight) and not model.head.weight.is_meta
    for got, want in zip(model.parameters(), eager.parameters()):
        _close(got.grad, want.grad)


def test_in_place_changes_before_the_backward_meet_torch_s_check():
    """Between a forward and its backward, an in-place change of a tensor the backward reads
    (an input, or an output the backward reads again) raises torch's error, as eager's saved
    tensors do, instead of a gradient computed from the changed values; a change of a tensor
    the backward does not read passes, with eager's gradients."""
    import torch

    from ortagent.torch import ORTModule

    class Squash(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)
            self.shift = torch.nn.Parameter(torch.zeros(3))

        def forward(self, x, offset):
            return torch.tanh(self.fc(x)), offset + self.shift

    torch.manual_seed(0)
    eager = Squash()
    model = ORTModule(copy.deepcopy(eager))
    changes = {"the output": lambda out, x, offset: out[0].mul_(2),
               "an input": lambda out, x, offset: x.add_(1),
               "an unread input": lambda out, x, offset: offset.add_(1)}
    for what, change in changes.items():
        for module in (model, eager):
            module.zero_grad()
            x, offset = torch.randn(4, 3, generator=torch.Generator().manual_seed(1)), torch.ones(4, 3)
            out = module(x, offset)
            change(out, x, offset)
            loss = out[0].sum() + out[1].square().sum()
            if what == "an unread input":
                loss.backward()
            else:
                with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                    loss.backward()
        if what == "an unread input":
            for got, expected in zip(model.parameters(), eager.parameters()):
                _close(got.grad, expected.grad)


def test_checkpoints_and_saved_tensor_hooks_around_the_module():
    """torch.utils.checkpoint around an ORTModule (non-reentrant, its export inside the first
    checkpointed call; and reentrant) and save_on_cpu hooks give eager's gradients: the export's
    own runs of the module pack nothing through the caller's hooks, so the checkpoint's
    recomputation saves as many tensors as the forward did."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from ortagent.torch import ORTModule

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    model = ORTModule(copy.deepcopy(eager))
    calls = [lambda module, x: checkpoint(module, x, use_reentrant=False),
             lambda module, x: checkpoint(module, x, use_reentrant=True)]
    for call in calls:
        x = torch.randn(3, 4, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        for module in (model, eager):
            module.zero_grad()
        call(model, x).square().sum().backward()
        call(eager, x_eager).square().sum().backward()
        _close(x.grad, x_eager.grad)
        for got, expected in zip(model.parameters(), eager.parameters()):
            _close(got.grad, expected.grad)
    with torch.autograd.graph.save_on_cpu():
        _matches_eager(model, eager, torch.randn(3, 4), 1)


def test_models_in_float64_and_bfloat16_are_refused_in_words():
    """A float64 model whose graph needs a kernel onnxruntime's CPU provider lacks (Erf, for
    GELU) and a bfloat16 model (which the autodiff cannot take) are refused with
    OrtNotImplemented saying so, where onnxruntime's bare "Could not find an implementation"
    and the autodiff's KeyError came through before; float16 trains beside eager."""
    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

    x = torch.randn(5, 8)
    with pytest.raises(OrtNotImplemented, match=r"no kernel for a node .*\(float64: .*Could not find an implementation"):
        ORTModule(net().double())(x.double())
    with pytest.raises(OrtNotImplemented, match="computes in bfloat16"):
        ORTModule(net().bfloat16())(x.bfloat16())
    eager = net().half()
    model = ORTModule(copy.deepcopy(eager))
    out, want = model(x.half()), eager(x.half())
    torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)
