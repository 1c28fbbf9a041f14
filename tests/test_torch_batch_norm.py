"""Training-mode BatchNorm through ORTModule: one BatchNormTraining node whose gradient ortagent
writes itself (ortagent._ad_rules), against torch eager: outputs, every gradient (input,
weight, bias, the layers before it) and the running buffers, over changing batch sizes."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

from ortagent.torch import ORTModule, _bridge  # noqa: E402


def _net(dims: int, affine: bool):
    conv = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dims]
    norm = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}[dims]
    return torch.nn.Sequential(conv(3, 4, 3, padding=1), norm(4, affine=affine), torch.nn.Tanh(), conv(4, 2, 1))


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_matches_eager_over_batch_sizes(dims, affine):
    torch.manual_seed(0)
    eager = _net(dims, affine).train()
    bridged = ORTModule(copy.deepcopy(eager))
    for step, batch in enumerate((2, 3, 5)):
        x = torch.randn(batch, 3, *([5] * dims), generator=torch.Generator().manual_seed(step)) * 3 + 1
        inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        weights = None
        for model, tensor in zip((eager, bridged), inputs):
            model.zero_grad()
            out = model(tensor)
            if weights is None:
                weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + step))
            (out * weights).sum().backward()
            if model is eager:
                expected = out.detach()
            else:
                torch.testing.assert_close(out.detach(), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(inputs[1].grad, inputs[0].grad, rtol=1e-4, atol=1e-5)
        for (name, p_eager), p_bridged in zip(eager.named_parameters(), bridged.parameters()):
            torch.testing.assert_close(p_bridged.grad, p_eager.grad, rtol=1e-4, atol=1e-5, msg=name)
        for (name, b_eager), b_bridged in zip(eager.named_buffers(), bridged.buffers()):
            torch.testing.assert_close(b_bridged, b_eager, rtol=1e-5, atol=1e-6, msg=name)
    assert bridged.exported_graphs == 2         # the first call's static shapes, then symbolic ones


def test_batch_norm_is_one_node_with_a_short_backward():
    """The training graph of one BatchNorm2d holds a few tens of nodes, not the ~130 that
    differentiating its statistics operation by operation gave."""
    graphs = []
    original = _bridge.GraphRunner._training_graph

    def capture(self, *args, **kwargs):
        graphs.append(original(self, *args, **kwargs))
        return graphs[-1]

    bridged = ORTModule(torch.nn.BatchNorm2d(8).train())
    try:
        _bridge.GraphRunner._training_graph = capture
        bridged(torch.randn(2, 8, 6, 6, requires_grad=True)).square().sum().backward()
    finally:
        _bridge.GraphRunner._training_graph = original
    assert len(graphs) == 1 and len(graphs[0].graph.node) < 100, len(graphs[0].graph.node)


def test_running_statistics_of_a_norm_run_twice_and_of_several_momenta():
    """The running statistics, updated after each step for all BatchNorms at once, follow
    eager's: a BatchNorm applied twice in one forward (its two updates in turn), one with
    momentum None (a cumulative average by its batch counter), and a momentum changed between
    steps."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)
            self.twice = torch.nn.BatchNorm2d(3)
            self.cumulative = torch.nn.BatchNorm2d(3, momentum=None)
            self.other = torch.nn.BatchNorm2d(3, momentum=0.3)

        def forward(self, x):
            y = self.twice(self.conv(x))
            y = self.twice(torch.tanh(y) * 2 + 1)
            return self.other(self.cumulative(y))

    torch.manual_seed(0)
    eager = Net().train()
    bridged = ORTModule(copy.deepcopy(eager))
    for step in range(4):
        if step == 2:
            eager.other.momentum = bridged.module.other.momentum = 0.05
        x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(step)) * 2 + 1
        for model in (eager, bridged):
            model.zero_grad()
            model(x).square().sum().backward()
        for (name, b_eager), b_bridged in zip(eager.named_buffers(), bridged.buffers()):
            torch.testing.assert_close(b_bridged, b_eager, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name}")


def test_a_buffer_the_forward_returns_comes_back_updated_and_as_itself():
    """A forward that returns buffers as they are (a BatchNorm's running mean, which ORTModule
    updates after the run; a counter and an average it updates in the graph): each comes back
    as eager's does, the buffer itself after the step's update (before: the running mean came
    back as a copy of its value before the update), in training and in eval mode."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(3)
            self.register_buffer("calls", torch.zeros(()))
            self.register_buffer("average", torch.zeros(3))

        def forward(self, x):
            self.calls.add_(1)
            with torch.no_grad():
                self.average.mul_(0.9).add_(0.1 * x.mean(0))
            return self.norm(x), self.norm.running_mean, self.calls, self.average

    torch.manual_seed(0)
    eager = Net()
    bridged = ORTModule(copy.deepcopy(eager))
    for step, training in enumerate((True, True, False)):
        x = torch.randn(4 + step, 3, generator=torch.Generator().manual_seed(step)) * 2 + 1
        results = []
        for model in (eager, bridged):
            model.train(training)
            out = model(x)
            if training:
                out[0].square().sum().backward()
            results.append(out)
        (want, *want_buffers), (got, *got_buffers) = results
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for name, value, expected in zip(("running_mean", "calls", "average"), got_buffers, want_buffers):
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name}")
        module = bridged.module
        assert got_buffers[0] is module.norm.running_mean and got_buffers[1] is module.calls
        assert got_buffers[2] is module.average
