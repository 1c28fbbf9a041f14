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
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    for actual, expected in zip(grads, expected_grads):
        if expected is None:
            expected = torch.zeros_like(actual)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)


# -- AveragePool with ceil_mode, divisor_override ------------------------------------------------

@pytest.mark.parametrize("shape, options", [
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((2, 3, 9, 8), dict(kernel_size=(4, 4), stride=(2, 3), padding=1, count_include_pad=True)),
    ((1, 2, 10, 11), dict(kernel_size=(6, 6), stride=(3, 3), padding=(3, 2))),       # the ceil rule drops a window
    ((3, 9, 8), dict(kernel_size=(4, 4), stride=(2, 3), padding=1)),                 # no batch axis
    ((2, 3, 10), dict(kernel_size=3, stride=2)),
    ((1, 2, 5, 6, 7), dict(kernel_size=(2, 3, 2), stride=(2, 2, 3), padding=(1, 0, 1), count_include_pad=False)),
    ((2, 5, 2, 3), dict(kernel_size=1280)),     # HF EfficientNet's pooler: a window far beyond the input
    ((2, 5, 7), dict(kernel_size=(9, 4), stride=(1, 2), padding=(4, 1))),
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


@pytest.mark.parametrize("pads, shape", [
    ((0, 0, 1, -1), (3, 2, 4)),         # RWKV's time shift on a length-2 axis: the short gradient broadcast
    ((0, 0, 1, -1), (2, 5, 3)),
    ((-1, 2, 0, -2), (2, 4, 6)),        # crops and pads on both sides of two axes
    ((-2, -1), (3, 5)),
])
def test_constant_pad_with_negative_pads(pads, shape):
    """A negative pad crops: its rows get no gradient, and the input's gradient keeps the
    input's shape (onnx-ad's rule left it short along the cropped axis, which onnxruntime
    refused or, on an axis of size 2, broadcast onto the other contributions: wrong gradients
    without a word). The input also reaches the output directly."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(9)

    def padded(x):
        out = F.pad(x, pads) * 3
        if out.shape == x.shape:
            out = out + x
        return out, x.sin()

    _check(padded, torch.randn(*shape))


def test_erfcx_is_refused_rather_than_imprecise():
    """torch.onnx's erfcx is exp(x^2) * (1 - erf(x)): inf * 0 from x of about 9 (log_ndtr,
    which torch decomposes into it, has its own translation: test_torch_small_ops)."""
    import torch

    from ortagent.errors import OrtNotImplemented

    with pytest.raises(OrtNotImplemented):
        _check(torch.special.erfcx, torch.tensor([-8.5, 0.5, 3.0, 12.0]))


def test_power_with_an_integer_exponent_in_float32():
    """x ** 2 exports Pow(x, int64 2); onnx-ad refused it for float32 bases."""
    import torch

    torch.manual_seed(3)
    _check(lambda x, y: (x ** 2) * y + torch.pow(y, 3), torch.randn(4, 5), torch.randn(4, 5))


# -- SplitToSequence (torch.split, unbind, chunk) ----------------------------------------------

@pytest.mark.parametrize("case", ["split_short_last", "split_sizes", "unbind", "unbind_last", "chunk"])
def test_split_and_unbind_sequences(case):
    """torch exports these as SplitToSequence + SequenceAt; the unrolling cuts the pieces with
    one Split (known sizes) or a Slice per element (a symbolic extent)."""
    import torch

    functions = {
        "split_short_last": lambda x: [piece * (i + 1) for i, piece in enumerate(torch.split(x, 2, dim=1))],
        "split_sizes": lambda x: torch.split(x, [1, 3, 1], dim=1)[1].sin(),
        "unbind": lambda x: [row * (i + 1) for i, row in enumerate(torch.unbind(x, 0))],
        "unbind_last": lambda x: torch.unbind(x, 1)[-1] * 2 + torch.unbind(x, 1)[0],
        "chunk": lambda x: torch.chunk(x, 3, dim=-1)[2].exp(),
    }
    torch.manual_seed(4)
    _check(functions[case], torch.randn(4, 5))


@pytest.mark.parametrize("split, keepdims, positions", [
    (2, 1, [0, 1, 2]),          # pieces of 2, 2 and the short 1, on a symbolic extent
    (None, 0, [0, -1]),          # unbind, counted from the end
    ([1, 3, 1], 1, [1, -1]),     # explicit sizes
])
def test_split_to_sequence_on_symbolic_shapes(split, keepdims, positions):
    """The unrolled SplitToSequence on a symbolic split axis (one training graph for every
    extent): each piece and each gradient against numpy."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from ortagent_testkit import training_graphs as tg
    from ortagent.graph_split import split_training_graph
    from ortagent.training import build_training_graph

    nodes, inputs = [], ["x"]
    if split is not None:
        nodes.append(helper.make_node("Constant", [], ["split"], value=numpy_helper.from_array(np.array(split, np.int64))))
        inputs.append("split")
    nodes.append(helper.make_node("SplitToSequence", inputs, ["pieces"], axis=1, keepdims=keepdims))
    outputs = []
    for index, position in enumerate(positions):
        nodes.append(helper.make_node("Constant", [], [f"p{index}"], value=numpy_helper.from_array(np.array(position, np.int64))))
        nodes.append(helper.make_node("SequenceAt", ["pieces", f"p{index}"], [f"y{index}"]))
        outputs.append(helper.make_tensor_value_info(f"y{index}", TensorProto.DOUBLE, None))
    forward = tg.make_model(nodes, [tg.tensor("x", np.float64, [3, "width"])], outputs, [], ms_domain=False)
    training = build_training_graph(forward, [], input_gradients=["x"])
    assert not any(node.op_type.startswith("Sequence") or node.op_type == "SplitToSequence"
                   for node in training.graph.node)
    runner = tg.SplitRunner(split_training_graph(training))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 5))
    if split is None:
        pieces = [x[:, i] for i in range(5)]
    else:
        sizes = split if isinstance(split, list) else [2, 2, 1]
        bounds = np.cumsum([0] + sizes)
        pieces = [x[:, bounds[i]:bounds[i + 1]] for i in range(len(sizes))]
    expected = [pieces[position] for position in positions]
    grads = [rng.standard_normal(piece.shape) for piece in expected]
    ys, (dx,) = runner.run({"x": x}, grads)
    expected_dx = np.zeros_like(x)
    for y, piece, grad, position in zip(ys, expected, grads, positions):
        np.testing.assert_array_equal(y, piece)
        if split is None:
            expected_dx[:, position] += grad
        else:
            start = int(np.cumsum([0] + (split if isinstance(split, list) else [2, 2, 1]))[position % len(pieces)])
            expected_dx[:, start:start + piece.shape[1]] += grad
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-12, atol=1e-12)


# -- NegativeLogLikelihoodLoss ---------------------------------------------------------------

@pytest.mark.parametrize("reduction, weighted, ignore, spatial", [
    ("none", False, False, False), ("sum", True, True, False), ("mean", True, True, True),
    ("mean", False, False, False), ("none", True, True, True), ("mean", True, False, False),
])
def test_nll_loss(reduction, weighted, ignore, spatial):
    """nll_loss (and cross_entropy, whose SoftmaxCrossEntropyLoss body calls it): the gradient
    is the output gradient scattered to each target class, weighted, 0 at ignored targets."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(6)
    shape, target_shape = ((4, 5, 3, 2), (4, 3, 2)) if spatial else ((6, 5), (6,))
    x = torch.randn(*shape)
    target = torch.randint(0, 5, target_shape)
    if ignore:
        target.view(-1)[::3] = 2
    weight = torch.rand(5) + 0.5
    options = dict(reduction=reduction, ignore_index=2 if ignore else -100)

    def loss(x, target, weight):
        return (F.nll_loss(F.log_softmax(x, 1), target, weight=weight if weighted else None, **options),
                F.cross_entropy(x * 2, target, weight=weight if weighted else None, **options))

    _check(loss, x, target, weight, grad_inputs={0})


# -- ScatterElements with reduction mul / min / max ----------------------------------------------

@pytest.mark.parametrize("reduce", ["prod", "amin", "amax"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_with_ties_and_zeros(reduce, include_self):
    """scatter_reduce prod/amin/amax: ties between candidates share the gradient (as torch);
    a product's zeros (one, and two at one position) get the exact gradient."""
    import torch

    torch.manual_seed(7)
    x = torch.randn(4, 3)
    index = torch.tensor([[0, 1, 2], [0, 1, 2], [3, 1, 0], [3, 3, 0], [2, 2, 2]])
    src = torch.randn(5, 3)
    src[1, 0] = src[0, 0]               # a tie at [0, 0]
    extreme = 5.0 if reduce == "amax" else -5.0
    src[2, 1] = src[0, 1] = extreme      # two updates tie at [1, 1]
    if include_self:
        x[3, 1] = src[3, 1] = extreme    # the data ties with an update at [3, 1]
        # (not without include_self: torch then still counts the data it left out among the
        # ties and gives the update half the gradient; ortagent gives it all)
    if reduce == "prod":
        src[2, 2] = 0.0                 # the only zero at [0, 2]
        src[3, 2] = 0.0                 # a second one there
        src[4, 0] = 0.0                 # the only zero at [2, 0]
        x[1, 1] = 0.0                   # a zero in the data
    _check(lambda x, index, src: x.scatter_reduce(0, index, src, reduce, include_self=include_self),
           x, index, src, grad_inputs={0, 2})


# -- GRU ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    dict(num_layers=2, bias=False),                        # linear_before_reset without a bias
    dict(num_layers=1, bias=True, batch_first=True),
    dict(num_layers=1, bias=False, bidirectional=True),
])
def test_gru(options):
    """nn.GRU exports an ONNX GRU with linear_before_reset=1, which onnx-ad unrolls; without a
    bias its unrolling computed another candidate state (the outputs differed) until the pass
    gives the node a zero bias. Outputs, the input's and every weight's gradient."""
    import torch

    torch.manual_seed(8)
    gru = torch.nn.GRU(3, 4, **options)
    weights = [parameter.detach().clone() for parameter in gru.parameters()]

    def run(x, *weights):
        state = dict(zip((name for name, _ in gru.named_parameters()), weights))
        return torch.func.functional_call(gru, state, (x,))

    _check(run, torch.randn(5, 2, 3), *weights)


def test_lstm_with_a_projection_is_refused_and_without_one_matches():
    """torch.onnx writes nn.LSTM(proj_size=...) as an ONNX LSTM, which has no projection (onnxruntime
    refuses its initial cell state; once typed, it would compute another LSTM): refused at the first
    call with the reason. The same LSTM without a projection matches eager."""
    import torch
    import ortagent.torch as ot
    from ortagent.errors import OrtNotImplemented

    torch.manual_seed(10)
    x = torch.randn(2, 5, 4)
    with pytest.raises(OrtNotImplemented, match="proj_size"):
        ot.ORTModule(torch.nn.LSTM(4, 8, proj_size=3, batch_first=True))(x)
    lstm = torch.nn.LSTM(4, 8, batch_first=True)
    torch.testing.assert_close(ot.ORTModule(lstm)(x)[0], lstm(x)[0])


# -- integer operands of floating-point arithmetic ------------------------------------------------

def test_masked_variance_divides_by_an_integer_count():
    """torch.masked.var/std export a Div of a float sum by an int64 count (onnxruntime refused
    the graph); the pass casts the count as torch promotes it."""
    import torch

    torch.manual_seed(9)
    x = torch.randn(4, 5, 3)
    mask = torch.rand(4, 5, 3) > 0.3
    _check(lambda x, mask: (torch.masked.var(x, 1, mask=mask), torch.masked.std(x, None)), x, mask,
           grad_inputs={0})


# -- sequences built in loops (embedding_bag) ---------------------------------------------------

@pytest.mark.parametrize("mode, weighted", [("sum", True), ("sum", False), ("mean", False), ("max", False)])
def test_embedding_bag(mode, weighted):
    """F.embedding_bag exports a Loop that appends one row per bag to a sequence, concatenated
    after it; the unrolling makes the rows a scan output of the loop, which onnx-ad
    differentiates (its Slice with starts computed in the body gets its axes at run time).
    An empty bag included; the weight's and the per-sample weights' gradients."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(10)
    weight = torch.randn(10, 4)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 3, 3, 6])           # bag 1 is empty
    per_sample = torch.rand(8) + 0.5

    if weighted:
        _check(lambda w, i, o, p: F.embedding_bag(i, w, o, mode=mode, per_sample_weights=p),
               weight, indices, offsets, per_sample, grad_inputs={0, 3})
    else:
        _check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), weight, indices, offsets, grad_inputs={0})


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_of_one_unbatched_sample(reduction):
    """cross_entropy / nll_loss of one score vector [C] and a 0-d target: ONNX defines the
    losses batched only, so the pass gives them a batch of one."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(11)
    scores, target = torch.randn(5), torch.tensor(3)
    _check(lambda x, t: (F.cross_entropy(x, t, reduction=reduction),
                         F.nll_loss(F.log_softmax(x * 3, 0), t, reduction=reduction)),
           scores, target, grad_inputs={0})


# -- ReduceProd: the product of the other elements, exact at zeros --------------------------------

def _with_zeros(shape, zeros, seed=0):
    """A tensor of values away from 0 (some negative), with 0 written at ``zeros``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    values = torch.rand(shape, generator=generator) + 0.5
    signs = torch.where(torch.rand(shape, generator=generator) < 0.3, -1.0, 1.0)
    values = values * signs
    for position in zeros:
        values[position] = 0.0
    return values


@pytest.mark.parametrize("zeros", [
    [],                                        # zero-free: y / x
    [(1, 2)],                                  # one zero: only it gets a gradient
    [(0, 1), (2, 3)],                          # two zeros: every gradient is 0
], ids=["zero_free", "one_zero", "two_zeros"])
def test_prod_of_all_elements(zeros):
    """torch.prod(x) (ReduceProd over every axis): onnx-ad's y / x rule gave inf/NaN at zeros."""
    import torch

    _check(lambda x: torch.prod(x), _with_zeros((3, 4), zeros))


@pytest.mark.parametrize("dim, keepdim", [(1, False), (1, True), (0, False), (-1, True)])
def test_prod_along_a_dimension_with_zeros_in_some_slices(dim, keepdim):
    """torch.prod(x, dim, keepdim): per reduced slice, none, one and two zeros side by side."""
    import torch

    x = _with_zeros((4, 5), [])
    if dim in (1, -1):
        x[1, 2] = 0.0                          # row 1: one zero
        x[2, 0] = x[2, 4] = 0.0                # row 2: two zeros
        x[3, 1] = x[3, 2] = x[3, 3] = 0.0      # row 3: three zeros (row 0 has none)
    else:
        x[0, 1] = 0.0                          # column 1: one zero
        x[1, 3] = x[3, 3] = 0.0                # column 3: two zeros
    _check(lambda value: torch.prod(value, dim, keepdim=keepdim), x)


def test_prod_of_a_zero_dimensional_tensor():
    """torch.prod of a 0-d tensor, zero or not: the gradient is the output gradient."""
    import torch

    _check(lambda x, z: torch.prod(x) + torch.prod(z), torch.tensor(-1.5), torch.tensor(0.0))


def test_prod_inside_a_larger_graph():
    """The exact weight multiplies an output gradient that is not all ones, on a 3-d input
    reduced along its middle axis, with the input reached through another operation."""
    import torch

    x = _with_zeros((2, 3, 4), [(0, 1, 2), (1, 0, 0), (1, 2, 0)], seed=3)
    _check(lambda value, scale: torch.prod(value * scale, 1).sin(), x, torch.tensor(1.25))


def test_masked_prod_with_zeros():
    """torch.masked._ops.prod: masked-out elements count as 1, so a masked zero is no zero."""
    import torch

    x = _with_zeros((3, 4), [(0, 1), (1, 1), (1, 3), (2, 0), (2, 2)], seed=5)
    mask = torch.tensor([[True, True, False, True],
                         [True, True, True, False],
                         [True, False, True, True]])
    _check(lambda value: torch.masked._ops.prod(value, 1, mask=mask), x)


# -- Det: the cofactor matrix, not a zero gradient -------------------------------------------------

@pytest.mark.parametrize("function", ["det", "logdet"])
def test_determinant_gradient_is_the_cofactor_matrix_not_zero(function):
    """onnx-ad gives Det a zero derivative (torch.det / torch.logdet trained with a zero
    gradient); ortagent's rule is the cofactor matrix, torch's gradient."""
    import torch

    x = torch.tensor([[2.0, 0.5, 0.0], [0.25, 1.5, -0.5], [0.0, 0.75, 1.0]])
    _check(getattr(torch, function), x)


def test_determinant_gradient_of_a_large_matrix_is_refused_rather_than_zero():
    """Beyond the cofactor rule's order the gradient is refused, never left at zero."""
    import torch

    from ortagent.errors import OrtNotImplemented

    x = torch.eye(17) + 0.01 * torch.arange(17.0 * 17).reshape(17, 17) / 289
    with pytest.raises(OrtNotImplemented, match="Det"):
        _check(torch.det, x)


def test_determinant_without_a_gradient_still_runs():
    """A Det no gradient flows through (its matrix a constant input) is not refused."""
    import torch

    x = torch.tensor([[2.0, 0.5], [0.25, 1.5]])
    _check(lambda a, s: torch.det(a) * s, x, torch.tensor(1.5), grad_inputs=[1])


@pytest.mark.parametrize("shape", [(5,), (4, 5), (3, 5, 2, 3)], ids=["one-sample", "batch", "spatial"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("targets", ["indices", "probabilities"])
def test_cross_entropy_with_label_smoothing_or_probabilities_matches_torch(shape, weighted, reduction, targets):
    """module_db's CrossEntropyLoss samples with label_smoothing and class-index targets gave a
    loss 0.148 off torch's (at 6.2) without a word, and torch.onnx wrote an invalid node for
    probability targets; both are now written as torch's kernel computes them. The index targets
    hold ignored ones (ignore_index=1), which the smoothing term and the weighted mean skip."""
    torch = pytest.importorskip("torch")
    from ortagent.torch import ORTModule

    generator = torch.Generator().manual_seed(len(shape) + 10 * weighted)
    logits = torch.randn(shape, generator=generator) * 2
    classes = shape[0] if len(shape) == 1 else shape[1]
    weight = torch.rand(classes, generator=generator) + 0.5 if weighted else None
    if targets == "indices":
        target_shape = () if len(shape) == 1 else (shape[0], *shape[2:])
        target = torch.randint(0, classes, target_shape, generator=generator)
        kwargs = {}
        if target.numel() > 1:      # (a lone ignored target makes the mean NaN)
            target.view(-1)[0] = 1
            kwargs = {"ignore_index": 1}
    else:
        target = torch.softmax(torch.randn(shape, generator=generator), 0 if len(shape) == 1 else 1)
        kwargs = {}
    for smoothing in (0.0, 0.15) if targets == "probabilities" else (0.15, 1.0):
        loss = torch.nn.CrossEntropyLoss(weight=weight, reduction=reduction, label_smoothing=smoothing, **kwargs)
        plain = logits.clone().requires_grad_()
        bridged = logits.clone().requires_grad_()
        expected = loss(plain, target)
        got = ORTModule(loss)(bridged, target)
        grad = torch.randn(expected.shape, generator=generator)
        expected.backward(grad)
        got.backward(grad)
        torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bridged.grad, plain.grad, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("shape", [(6, 5), (2, 5, 3)], ids=["tokens", "spatial"])
def test_unreduced_loss_weighted_by_a_mask_matches_torch(loss, shape):
    """A per-token loss (``reduction="none"``) weighted by a mask, as masked language-model
    losses are: torch.onnx declared the unreduced loss over a symbolic batch a scalar, and the
    autodiff summed its gradient to one number (input gradients 0.65 off torch's)."""
    torch = pytest.importorskip("torch")
    from ortagent.torch import ORTModule

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(shape, generator=generator)
    target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=generator)
    mask = torch.rand(target.shape, generator=generator)
    function = getattr(torch.nn.functional, loss)

    class Masked(torch.nn.Module):
        def forward(self, scores, labels, weights):
            if loss == "nll_loss":
                scores = torch.log_softmax(scores, 1)
            return (function(scores, labels, reduction="none") * weights).sum() / weights.sum()

    plain = logits.clone().requires_grad_()
    bridged = logits.clone().requires_grad_()
    expected = Masked()(plain, target, mask)
    got = ORTModule(Masked())(bridged, target, mask)
    expected.backward()
    got.backward()
    torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bridged.grad, plain.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_cross_entropy_over_only_ignored_targets_has_torch_gradient(smoothing, weighted):
    """A batch whose targets are all ignore_index (padding only, a prompt-only chunk): torch's
    mean loss is NaN and its gradient 0; the NLL rule divided by the zero total weight and made
    every gradient NaN, which an optimizer step spreads into the weights."""
    torch = pytest.importorskip("torch")
    from ortagent.torch import ORTModule

    logits = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
    weight = torch.rand(4, generator=torch.Generator().manual_seed(6)) if weighted else None
    target = torch.full((3,), -100)
    loss = torch.nn.CrossEntropyLoss(weight=weight, label_smoothing=smoothing)
    plain = logits.clone().requires_grad_()
    bridged = logits.clone().requires_grad_()
    expected = loss(plain, target)
    got = ORTModule(loss)(bridged, target)
    expected.backward()
    got.backward()
    assert torch.isnan(expected) and torch.isnan(got)
    torch.testing.assert_close(bridged.grad, plain.grad)
    assert not bridged.grad.any()


# -- boolean-mask selection: GatherND at NonZero's positions ------------------------------------------

def _rows_where(x, mask):
    return x[mask] * 3                              # mask over the leading axes: whole rows


def _elements_where(x, mask):
    return (x[mask > 0] ** 2).sum()                 # a mask computed in the graph


def _write_where(x, mask):
    y = x * 1
    y[mask] = x[mask] * 3                           # written through the mask (an index_put)
    return y * x


def _masked_select(x, mask):
    return torch_masked_select(x, mask) * 2


def _masked_select_broadcast(x, mask):
    return torch_masked_select(x, mask[0]).cumsum(0)    # the mask broadcast over x's rows


def torch_masked_select(x, mask):
    import torch

    return torch.masked_select(x, mask)


@pytest.mark.parametrize("function, mask_of", [
    (_rows_where, lambda x: x[..., 0] > 0),
    (_elements_where, lambda x: x - 0.3),
    (_write_where, lambda x: x > 0.2),
    (_masked_select, lambda x: x.abs() < 0.8),
    (_masked_select_broadcast, lambda x: x.abs() < 0.8),
    (_masked_select, lambda x: x > 100),            # nothing selected
])
def test_boolean_mask_selection(function, mask_of):
    """``x[mask]`` and ``masked_select`` select a number of elements known only at run time
    (GatherND at NonZero's transposed positions), which onnx-ad's GatherND rule refuses for
    want of a static indices shape; ortagent's rule needs only the index depth and scatters
    the gradient back to the selected positions."""
    import torch

    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(5))
    _check(function, x, mask_of(x), grad_inputs={0})


def test_boolean_mask_selection_of_another_count_reuses_the_export():
    """The selected count is a run-time length of one export: masks selecting different numbers
    of rows give torch's outputs and gradients without exporting again."""
    import torch

    from ortagent.torch import ORTModule, _module

    class Selected(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 3)

        def forward(self, x, mask):
            chosen = self.linear(x)[mask]                   # [count, 3]
            return (chosen * chosen).sum()

    torch.manual_seed(0)
    eager = Selected()
    bridged = ORTModule(Selected())
    bridged.module.load_state_dict(eager.state_dict())
    counts = []
    generator = torch.Generator().manual_seed(2)
    for threshold in (0.2, 0.5, 0.8):
        x = torch.randn(3, 7, 6, generator=generator)
        mask = torch.rand(3, 7, generator=generator) > threshold
        counts.append(int(mask.sum()))
        expected, got = eager(x, mask), bridged(x, mask)
        expected.backward()
        got.backward()
        torch.testing.assert_close(got.detach(), expected.detach(), rtol=RTOL, atol=1e-5)
        for mine, theirs in zip(bridged.module.parameters(), eager.parameters()):
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=RTOL, atol=1e-5)
            mine.grad = theirs.grad = None
    assert len(set(counts)) == 3
    assert sum(len(entries) for entries in bridged._exports.values()) == 1


def test_empty_selections_and_empty_batches_match_eager():
    """A 0 in a Reshape's shape is a size, not ONNX's "copy this dimension": a boolean mask
    that selects nothing at run time (the export made with rows selected) and a batch of 0
    rows exported as such give torch's outputs and gradients (before: onnxruntime refused the
    reshapes, their 0 read as another dimension)."""
    import torch

    from ortagent.torch import ORTModule

    class Regrouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(2, 3)

        def forward(self, x, mask):
            chosen = self.linear(x[mask])                               # [count, 4]
            pairs = chosen.reshape(chosen.shape[0], 2, 2).transpose(1, 2)
            return self.head(pairs).sum(0), self.head(pairs).amax(1)

    torch.manual_seed(0)
    eager = Regrouped()
    bridged = ORTModule(Regrouped())
    bridged.module.load_state_dict(eager.state_dict())
    x = torch.randn(6, 4)
    for selected in ([0, 2, 3], [1, 4], [], [5]):
        mask = torch.zeros(6, dtype=torch.bool)
        mask[selected] = True
        got, expected = bridged(x, mask), eager(x, mask)
        for mine, theirs in zip(got, expected):
            torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=1e-6)
        (got[0].sum() + got[1].square().sum()).backward()
        (expected[0].sum() + expected[1].square().sum()).backward()
        for mine, theirs in zip(bridged.module.parameters(), eager.parameters()):
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=RTOL, atol=1e-6)
            mine.grad = theirs.grad = None
    assert bridged.exported_graphs == 1

    mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    for dynamic in (False, True):
        bridged = ORTModule(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)),
                            dynamic=dynamic)
        bridged.module.load_state_dict(mlp.state_dict())
        for rows in (2, 5, 0):
            x = torch.randn(rows, 3, requires_grad=True)
            x_eager = x.detach().clone().requires_grad_()
            got, expected = bridged(x), mlp(x_eager)
            torch.testing.assert_close(got, expected)
            got.square().sum().backward()
            expected.square().sum().backward()
            torch.testing.assert_close(x.grad, x_eager.grad)
            for mine, theirs in zip(bridged.module.parameters(), mlp.parameters()):
                torch.testing.assert_close(mine.grad, theirs.grad, rtol=RTOL, atol=ATOL)
                mine.grad = theirs.grad = None


# -- Concat of operands whose extent depends on values ---------------------------------------------

def test_concatenation_of_rows_chosen_by_value():
    """``torch.cat`` of rows a mask selects (a mixture-of-experts layer's tokens for one expert:
    JetMoE) has no declared extent on the joined axis even at static shapes: the reverse slices
    each operand's gradient at offsets measured with Shape when the graph runs (before: refused,
    'Concat is differentiable in reverse only where the concatenated extent ... is declared')."""
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=generator)
    y = torch.randn(2, 3, generator=generator)
    _check(lambda x, y: torch.cat([(x * 2)[x[:, 0] > 0], y.tanh(), x[x[:, 1] < 0.5] ** 2], dim=0), x, y)
    _check(lambda x, y: torch.cat([y.t(), x[x[:, 0] > 0].t()], dim=1), x, y)
