"""ORTModule's export translates torch.export's training IR without torch.onnx's retrace where
the program allows it (ortagent/torch/_training_ir.py): in-place updates of private
intermediates, conversions and a few composite operators rewritten in the graph. Each case runs
through ORTModule and matches torch eager on its outputs and every gradient, and takes the path
it should: the rewrite where it is sound (writes through a slice or an element of a new tensor
scattered back, a ``no_grad`` region inlined), torch.onnx's retrace (``run_decompositions``)
where an update is seen through another view, changes the element type, or updates a region's
input. And the
rewritten programs of torchvision's ResNet-18 and MobileNetV3 give the same ONNX graph as the
retrace."""

from __future__ import annotations

import collections

import pytest

from test_torch_translations import _assert_same

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


@pytest.fixture
def retraces(monkeypatch):
    """The number of torch.onnx retraces (``ExportedProgram.run_decompositions``) so far."""
    import torch

    calls = collections.Counter()
    original = torch.export.ExportedProgram.run_decompositions

    def counted(self, *args, **kwargs):
        calls["retrace"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    return calls


def _chain(x, w):
    y = x @ w
    y.add_(x).mul_(0.5)                 # updates of an update's result
    return y.relu_()


def _read_before_and_viewed_after(x):
    y = x.sin()
    total = y.sum()                     # before the update: the old values
    y.mul_(2)
    return y.view(-1), y.t(), total


def _conversions_and_composites(a, b):
    wide = a.to(torch_dtype("float64")) * 2
    same = b.to(torch_dtype("float32"))
    both = (a > 0) & (b > 0)
    return wide, same + torch_min(a, b), both, adaptive_avg_pool2d(a.reshape(1, 1, *a.shape), 1)


def _no_grad_region(x):
    import torch

    y = x * 2
    with torch.no_grad():
        scale = y.abs().amax().to(torch.float64)
        scale.add_(1)                   # an update inside the region, of the region's own result
    return y / scale.float()            # no gradient through the scale


def _writes_through_views(x):
    shifted = x.new_zeros(x.shape)      # transformers' shift of decoder inputs, on floats
    shifted[:, 1:] = x[:, :-1].clone()
    shifted[:, 0] = 0.5
    shifted[:, 2:4].mul_(3)
    shifted.masked_fill_(shifted > 1.0, 1.0)
    return shifted * x


def _masked_and_scalar_updates(x):
    y = x.clone()
    y.masked_fill_(x > 0.5, 0.0)
    y.add_(2)
    count = (x > 0).to(torch_dtype("int64"))
    count.add_(1)
    return y, count


def _sequential_relu_inplace(x, block):
    out = block(x)
    out += x                                        # a residual's in-place sum
    return out.relu_()


def _block():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(inplace=True),
                               torch.nn.Conv2d(4, 3, 3, padding=1))


def torch_dtype(name):
    import torch

    return getattr(torch, name)


def torch_min(a, b):
    import torch

    return torch.min(a, b)                          # aten::min.other, composite: minimum


def adaptive_avg_pool2d(x, size):
    import torch.nn.functional as F

    return F.adaptive_avg_pool2d(x, size)


@pytest.mark.parametrize("case", ["chain", "read_before_viewed_after", "conversions_and_composites",
                                  "masked_and_scalar_updates", "sequential_relu_inplace", "no_grad_region",
                                  "writes_through_views"])
def test_rewritten_programs_match_eager_without_the_retrace(case, retraces):
    import torch

    torch.manual_seed(0)
    function, inputs = {
        "chain": (_chain, (torch.randn(4, 4), torch.randn(4, 4))),
        "read_before_viewed_after": (_read_before_and_viewed_after, (torch.randn(3, 5),)),
        "conversions_and_composites": (_conversions_and_composites, (torch.randn(4, 6), torch.randn(4, 6))),
        "masked_and_scalar_updates": (_masked_and_scalar_updates, (torch.rand(5, 3),)),
        "no_grad_region": (_no_grad_region, (torch.randn(4, 6),)),
        "writes_through_views": (_writes_through_views, (torch.randn(4, 6),)),
        "sequential_relu_inplace": (lambda x, block=_block(): _sequential_relu_inplace(x, block),
                                    (torch.randn(2, 3, 6, 6),)),
    }[case]
    _assert_same(function, *inputs)
    assert retraces["retrace"] == 0


def _update_through_a_view_read_again(x):
    y = x * 1
    column = y[:, :1]
    column.mul_(3)
    return y + column.sum()             # the view read after its update


def _write_through_a_view_of_a_view(x):
    y = x * 1
    y[1:, 2:4].mul_(3)
    return y


def _view_taken_before_the_update(x):
    y = x * 2
    flat = y.view(-1)
    y.add_(1)                           # seen through ``flat``
    return flat


def _update_of_a_narrower_type(x):
    y = x * 2
    y.add_(x.double())                  # float32 += float64 stays float32; add() would not
    return y


def _update_in_a_no_grad_region(x):
    import torch

    weights = (x > 0).float() + 1
    with torch.no_grad():
        weights.mul_(0.5)               # the region's input: the retrace makes it functional
    return weights * x


def _uneven_adaptive_pool(x):
    return adaptive_avg_pool2d(x, (2, 3))


@pytest.mark.parametrize("function", [_update_through_a_view_read_again, _write_through_a_view_of_a_view,
                                      _view_taken_before_the_update,
                                      _update_of_a_narrower_type, _update_in_a_no_grad_region,
                                      _uneven_adaptive_pool])
def test_programs_the_rewrite_cannot_take_go_through_the_retrace(function, retraces):
    import torch

    torch.manual_seed(0)
    _assert_same(function, torch.randn(2, 3, 4, 6) if function is _uneven_adaptive_pool else torch.randn(4, 6))
    assert retraces["retrace"] >= 1


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_torchvision_graphs_are_those_of_the_retrace(name, monkeypatch, retraces):
    pytest.importorskip("torchvision")
    import torch
    import torchvision

    from ortagent.torch import ORTModule, _training_ir

    def exported_graph(retrace: bool):
        torch.manual_seed(0)
        module = getattr(torchvision.models, name)(num_classes=5).train()
        bridged = ORTModule(module)
        with monkeypatch.context() as patch:
            if retrace:
                patch.setattr(_training_ir, "translate", lambda *args: None)
            bridged(torch.randn(2, 3, 32, 32)).sum().backward()
        (entry,), = bridged._exports.values()
        model = entry.exported.model
        # (the retrace decomposes flatten into a view, a Reshape; translated directly it stays
        # ONNX's Flatten, the same view)
        return (collections.Counter("Reshape" if node.op_type == "Flatten" else node.op_type
                                    for node in model.graph.node),
                [str(value.type) for value in model.graph.output], entry.exported.guard,
                {key: p.grad for key, p in module.named_parameters()})

    direct = exported_graph(retrace=False)
    assert retraces["retrace"] == 0
    retraced = exported_graph(retrace=True)
    assert retraces["retrace"] == 1
    assert direct[:3] == retraced[:3]
    for key, grad in retraced[3].items():
        torch.testing.assert_close(direct[3][key], grad, rtol=1e-4, atol=1e-5)


def _same_types(x, w):
    return (x @ w).relu() * 0.5 + x.sum(-1, keepdim=True) - (x > 0.0).float()


def _integer_comparison(x, w):
    return x * (x > 0)                          # (the 0 becomes a float tensor, the mask a float)


def _int_and_float(x, w):
    return x * (w > 0).sum() + x                # (an int64 count times a float tensor)


def _half_and_float(x, w):
    return x * w[0].to(torch_dtype("float16"))


def _integer_scalar(x, w):
    return (x + 2) @ w


def _in_a_no_grad_region(x, w):
    import torch

    with torch.no_grad():
        scale = w.abs().max().to(torch.float64)
    return x * scale


@pytest.mark.parametrize("function, casts", [(_same_types, False), (_integer_comparison, True),
                                             (_int_and_float, True), (_half_and_float, True),
                                             (_integer_scalar, True), (_in_a_no_grad_region, True)])
def test_type_promotion_is_skipped_only_where_it_casts_nothing(function, casts):
    """The export skips torch.onnx's type promotion pass (a rerun of the program on fake
    tensors) where it would cast no operand: the prediction from the recorded values agrees with
    what the pass does to the program, casting or not."""
    import torch
    from torch.onnx._internal.exporter import _fx_passes

    from ortagent.torch._training_ir import _promotes_some_type

    class Module(torch.nn.Module):
        def forward(self, x, w):
            return function(x, w)

    x, w = torch.randn(3, 4), torch.randn(4, 4)
    graph_module = torch.export.export(Module(), (x, w), strict=False).graph_module
    predicted = _promotes_some_type(graph_module)
    before = [(node.op, node.target) for module in graph_module.modules() for node in module.graph.nodes]
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        _fx_passes.insert_type_promotion_nodes(graph_module)
    after = [(node.op, node.target) for module in graph_module.modules() for node in module.graph.nodes]
    assert predicted == (after != before) == casts, (predicted, len(before), len(after))
