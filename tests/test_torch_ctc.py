"""torch's CTC loss through ortagent: the private CTCLoss operator (ortagent/_ctc.py) built into
a training graph and run by the TrainingAgent against ``F.ctc_loss`` per sample, loss and
gradient (torch's, with its ``exp(log_probs)`` term), over padded and concatenated targets, both
float types, ``zero_infinity``, another blank, and the edge cases of the recursion: repeated
labels, empty targets, input lengths of 0, alignments that cannot exist, ``-inf`` log
probabilities; then ``nn.CTCLoss`` / ``F.ctc_loss`` in a module through ORTModule against eager,
every reduction and argument form, and the checks torch makes on the lengths' values."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _exporter():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")


def _operator_agent(flat: bool, zero_infinity: bool, blank: int, element_type: int):
    """A TrainingAgent over ``loss = sum(CTCLoss(log_probs * w, ...) * weights)``, differentiated
    in the log probabilities: (feed names, fetch names, agent)."""
    from onnx import TensorProto, helper

    import ortagent
    from ortagent._ad_rules import DOMAIN
    from ortagent._ctc import register_schemas
    from ortagent.training import build_training_graph

    register_schemas(DOMAIN)
    value = helper.make_tensor_value_info
    nodes = [helper.make_node("Mul", ["lp_in", "w"], ["lp"]),
             helper.make_node("CTCLoss", ["lp", "targets", "il", "tl"], ["nll0", "alpha"], domain=DOMAIN, blank=blank,
                              zero_infinity=int(zero_infinity), flat_targets=int(flat)),
             helper.make_node("Reshape", ["nll0", "flat"], ["nll"]),
             helper.make_node("Mul", ["nll", "weights"], ["weighted"]),
             helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "ctc",
        [value("lp_in", element_type, ["T", "N", "C"]), value("w", element_type, []),
         value("targets", TensorProto.INT64, ["Z"] if flat else ["N", "S"]), value("il", TensorProto.INT64, ["N"]),
         value("tl", TensorProto.INT32, ["N"]), value("weights", element_type, ["N"])],
        [value("loss", element_type, [])], initializer=[helper.make_tensor("flat", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 9
    training = build_training_graph(model, ["w"], user_inputs=["lp_in", "targets", "il", "tl", "weights"],
                                    input_gradients=["lp_in"])
    feeds = [v.name for v in training.graph.input]
    fetches = [v.name for v in training.graph.output]
    agent = ortagent.TrainingAgent(training.SerializeToString(), fw_feed_names=feeds, fw_outputs_device_info=["cpu"],
                                   bw_fetches_names=fetches, bw_outputs_device_info=["cpu"] * len(fetches))
    return feeds, fetches, agent


def _case(seed: int, blank: int, double: bool):
    """Log probabilities [12, 5, 6] and targets whose samples hold a repeated label, an empty
    target, an alignment that cannot exist (3 labels in 2 steps), an input length of 0, and
    with seed 2 log probabilities of -inf; padded entries past a target's length hold -100."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    steps, batch, classes, longest = 12, 5, 6, 4
    log_probs = torch.randn(steps, batch, classes, generator=generator, dtype=torch.float64).log_softmax(-1)
    if seed == 2:
        masked = torch.randn(steps, batch, classes, generator=generator, dtype=torch.float64)
        masked[3, 0, 1:3] = float("-inf")
        masked[5:, 4, 4] = float("-inf")
        log_probs = masked.log_softmax(-1)
    labels = [c for c in range(classes) if c != blank]
    targets = torch.tensor(labels)[torch.randint(0, len(labels), (batch, longest), generator=generator)]
    targets[0, 1] = targets[0, 0]
    input_lengths = torch.tensor([12, 10, 2, 0, 9])
    target_lengths = torch.tensor([4, 0 if seed % 2 else 2, 3, 0, 4], dtype=torch.int32)
    for row, length in enumerate(target_lengths.tolist()):
        targets[row, length:] = -100
    return log_probs if double else log_probs.float(), targets, input_lengths, target_lengths


@pytest.mark.parametrize("flat", [False, True], ids=["padded", "concatenated"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("blank", [0, 2])
@pytest.mark.parametrize("double", [False, True], ids=["float32", "float64"])
def test_the_operator_matches_torch_per_sample_with_its_gradient(flat, zero_infinity, blank, double):
    import torch
    import torch.nn.functional as F
    from onnx import TensorProto

    import ortagent

    element_type = TensorProto.DOUBLE if double else TensorProto.FLOAT
    dtype = np.float64 if double else np.float32
    feeds, fetches, agent = _operator_agent(flat, zero_infinity, blank, element_type)
    for seed in range(3):
        log_probs, targets, input_lengths, target_lengths = _case(seed, blank, double)
        weights = torch.rand(log_probs.shape[1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        if flat:
            targets = torch.cat([row[:length] for row, length in zip(targets, target_lengths.tolist())])
        leaf = log_probs.detach().double().requires_grad_()
        expected = F.ctc_loss(leaf, targets.clamp(min=0), input_lengths, target_lengths, blank=blank,
                              reduction="none", zero_infinity=zero_infinity)
        (expected * weights).sum().backward()
        values = {"lp_in": log_probs.numpy(), "w": np.array(1.0, dtype), "targets": targets.numpy(),
                  "il": input_lengths.numpy(), "tl": target_lengths.numpy(), "weights": weights.numpy().astype(dtype)}
        state = ortagent.PartialGraphExecutionState()
        outputs, gradients = [], []
        agent.run_forward([values[name] for name in feeds], outputs, state)
        agent.run_backward([np.array(1.0, dtype)], gradients, state)
        loss = float(outputs[0].numpy())
        reference = float((expected.detach() * weights).sum())
        if zero_infinity:
            assert np.isfinite(loss)
            assert loss == pytest.approx(reference, rel=1e-5 if not double else 1e-12)
        else:
            assert loss == np.inf and reference == np.inf      # the sample with no alignment
        gradient = dict(zip(fetches, (g.numpy() for g in gradients)))["lp_in_grad"]
        wanted = leaf.grad.numpy()
        # NaN as torch's: at the steps of a sample with no alignment (zeros with zero_infinity),
        # and where a log probability is -inf
        assert np.array_equal(np.isnan(gradient), np.isnan(wanted))
        assert np.isnan(gradient[:2, 2]).all() != zero_infinity
        np.testing.assert_allclose(np.nan_to_num(gradient), np.nan_to_num(wanted), rtol=1e-4 if not double else 1e-10,
                                   atol=2e-6 if not double else 1e-12)


def _ctc_module(reduction="mean", zero_infinity=False, flat=False, blank=0, lengths_as_lists=False):
    import torch

    class Head(torch.nn.Module):
        """Frames -> class log probabilities -> CTC loss, as a speech model's head computes it."""

        def __init__(self):
            super().__init__()
            self.project = torch.nn.Linear(16, 7)
            self.loss = torch.nn.CTCLoss(blank=blank, reduction=reduction, zero_infinity=zero_infinity)

        def forward(self, frames, labels, input_lengths, target_lengths):
            log_probs = self.project(frames).log_softmax(-1).transpose(0, 1)
            if flat:        # transformers' CTC heads: the labels >= 0, concatenated
                labels = labels.masked_select(labels >= 0)
            if lengths_as_lists:
                input_lengths, target_lengths = input_lengths.tolist(), target_lengths.tolist()
            return self.loss(log_probs, labels, input_lengths, target_lengths)

    return Head()


def _batch(seed, batch=4, steps=20, longest=5, blank=0):
    import torch

    generator = torch.Generator().manual_seed(seed)
    frames = torch.randn(batch, steps, 16, generator=generator)
    labels = torch.randint(1, 7, (batch, longest), generator=generator)
    if blank:
        labels[labels == blank] = 1
    target_lengths = torch.randint(0, longest + 1, (batch,), generator=generator)
    target_lengths[0] = longest
    input_lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=generator)
    input_lengths[0] = steps
    for row, length in enumerate(target_lengths.tolist()):
        labels[row, length:] = -100
    return frames, labels, input_lengths, target_lengths


def _train_beside_eager(make, batches, rtol=1e-4, atol=1e-5):
    """Two steps of SGD of ``make()`` eagerly and through ORTModule from the same weights: the
    losses and every gradient match at each step."""
    import copy

    import torch

    from ortagent.torch import ORTModule

    torch.manual_seed(0)
    eager = make()
    wrapped = ORTModule(copy.deepcopy(eager))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, wrapped)]
    for batch in batches:
        losses = []
        for module, optimizer in zip((eager, wrapped), optimizers):
            optimizer.zero_grad()
            loss = module(*batch)
            (loss.sum() if loss.dim() else loss).backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=rtol, atol=atol)
        for a, e in zip(wrapped.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, e.grad, rtol=rtol, atol=atol)
        for optimizer in optimizers:
            optimizer.step()
    return wrapped


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("flat", [False, True], ids=["padded", "concatenated"])
def test_nn_ctc_loss_trains_beside_eager(reduction, flat):
    """Padded labels (-100 past each length) and transformers' concatenated ones (a
    masked_select, whose length the graph learns at run time), at two batch shapes."""
    _train_beside_eager(lambda: _ctc_module(reduction, flat=flat), [_batch(0), _batch(1, batch=3, steps=24)])


def test_ctc_loss_with_zero_infinity_another_blank_and_list_lengths():
    import torch

    impossible = _batch(2)
    impossible[3][1] = 5
    impossible[2][1] = 4        # 5 labels in 4 steps: no alignment
    impossible[1][1] = torch.tensor([1, 2, 3, 4, 5])
    _train_beside_eager(lambda: _ctc_module(zero_infinity=True), [impossible])
    _train_beside_eager(lambda: _ctc_module("sum", blank=3), [_batch(3, blank=3)])
    _train_beside_eager(lambda: _ctc_module(lengths_as_lists=True), [_batch(4)])


def test_ctc_loss_argument_forms():
    """Unbatched log probabilities (a 0-d loss), torch.ctc_loss with its integer reduction, int32
    lengths and targets, log probabilities that are not normalised (torch's gradient, not the
    derivative, is what both give), float64."""
    import torch
    import torch.nn.functional as F

    from test_torch_translations import _assert_same

    torch.manual_seed(5)
    log_probs = torch.randn(10, 3, 5).log_softmax(-1)
    targets = torch.randint(1, 5, (3, 4))
    input_lengths, target_lengths = torch.tensor([10, 7, 9]), torch.tensor([4, 2, 3])
    _assert_same(lambda lp, t: F.ctc_loss(lp, t, torch.tensor(10), torch.tensor(3), reduction="none"),
                 log_probs[:, 0], targets[0, :3])
    _assert_same(lambda lp, t: F.ctc_loss(lp, t, torch.tensor(10), torch.tensor(3)), log_probs[:, 0], targets[0, :3])
    _assert_same(lambda lp, t, il, tl: torch.ctc_loss(lp, t, il, tl, 0, 2, False), log_probs, targets,
                 input_lengths, target_lengths)
    _assert_same(lambda lp, t, il, tl: F.ctc_loss(lp, t, il, tl), log_probs, targets.int(), input_lengths.int(),
                 target_lengths.int())
    _assert_same(lambda lp, t, il, tl: F.ctc_loss(lp, t, il, tl, reduction="sum"), torch.randn(10, 3, 5), targets,
                 input_lengths, target_lengths)
    _assert_same(lambda lp, t, il, tl: F.ctc_loss(lp, t, il, tl, reduction="none"), log_probs.double(), targets,
                 input_lengths, target_lengths, rtol=1e-9, atol=1e-12)


def test_ctc_loss_keeps_torch_s_checks_on_the_lengths():
    """Eager raises RuntimeError on an input length past the log probabilities, a target length
    past the padded targets, a negative length, and concatenated targets of another total
    length; the graph checks the same and fails its run (FailedValueCheck) where it would
    otherwise read past its tensors or silently wrap a negative index. Arguments known at the
    trace (blank out of range) fail the first call as eager's do."""
    import torch
    import torch.nn.functional as F

    from ortagent.errors import OrtError
    from ortagent.torch import ORTModule
    from ortagent.torch._module import FailedValueCheck

    class Loss(torch.nn.Module):
        def __init__(self, blank=0):
            super().__init__()
            self.blank = blank

        def forward(self, log_probs, targets, input_lengths, target_lengths):
            return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=self.blank)

    log_probs = torch.randn(8, 2, 5).log_softmax(-1).requires_grad_()
    targets = torch.tensor([[1, 2, 3], [2, 2, 4]])
    good = (torch.tensor([8, 6]), torch.tensor([3, 2]))
    wrapped = ORTModule(Loss())
    torch.testing.assert_close(wrapped(log_probs, targets, *good), Loss()(log_probs, targets, *good))
    flat = targets.flatten()
    for bad in [(targets, torch.tensor([9, 6]), good[1]), (targets, good[0], torch.tensor([4, 2])),
                (targets, torch.tensor([8, -1]), good[1]), (targets, good[0], torch.tensor([-1, 2])),
                (flat, good[0], torch.tensor([3, 2]))]:
        with pytest.raises(RuntimeError):
            Loss()(log_probs, *bad)
        with pytest.raises(FailedValueCheck, match="ctc_loss's lengths"):
            wrapped(log_probs, *bad)
    torch.testing.assert_close(wrapped(log_probs, targets, *good), Loss()(log_probs, targets, *good))
    with pytest.raises(RuntimeError):
        Loss(blank=5)(log_probs, targets, *good)
    with pytest.raises((OrtError, RuntimeError), match="blank must be in label range"):
        ORTModule(Loss(blank=5))(log_probs, targets, *good)


def test_wav2vec2_ctc_with_spec_augment_trains_beside_eager():
    """transformers' Wav2Vec2ForCTC given labels (padded with -100; the head concatenates them
    with masked_select, checks ``labels.max() < vocab_size`` in Python and takes the CTC loss)
    and SpecAugment on (its time and feature spans drawn from NumPy's generator in the forward,
    which the bridge now draws before each run as eager's forward would): the losses and every
    gradient match eager under the same NumPy seed, over two input lengths. Before, the label
    check refused the model, and without labels the graph kept the spans of its export for
    every call. A label past the vocabulary stops the run as eager raises."""
    import copy

    import torch

    from ortagent.torch import ORTModule
    from ortagent.torch._module import FailedValueCheck

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=32,
        conv_dim=(32, 32, 32), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
        layerdrop=0.0, final_dropout=0.0, mask_time_prob=0.3, mask_time_length=2, mask_feature_prob=0.2,
        mask_feature_length=4, ctc_zero_infinity=True)
    eager = transformers.Wav2Vec2ForCTC(config).train()
    inner = copy.deepcopy(eager)
    wrapped = ORTModule(inner)
    for step, samples in enumerate((1600, 2400, 1600)):
        generator = torch.Generator().manual_seed(step)
        audio = torch.randn(2, samples, generator=generator)
        labels = torch.randint(1, 32, (2, 5), generator=generator)
        labels[1, 3:] = -100
        losses = []
        for module in (wrapped, eager):
            np.random.seed(step)
            torch.manual_seed(step)
            module.zero_grad()
            loss = module(audio, labels=labels).loss
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-4)
        for (name, e), a in zip(eager.named_parameters(), inner.parameters()):
            if e.grad is None:
                assert a.grad is None, name
                continue
            scale = float(e.grad.abs().max())
            assert float((a.grad - e.grad).abs().max()) <= 1e-4 * max(scale, 1e-3), name
    labels[0, 0] = 32
    with pytest.raises(ValueError, match="Label values must be"):
        eager(audio[:, :1600], labels=labels)
    with pytest.raises(FailedValueCheck):
        wrapped(audio[:, :1600], labels=labels)


def test_wav2vec2_adapter_layerdrop_drawn_from_numpy():
    """Wav2Vec2's adapter draws ``np.random.random()`` per layer and skips the layer above its
    layerdrop: at layerdrop 0 the branch is the same for every draw (it traces so, the draw
    still made before each run so that NumPy's stream, and the SpecAugment spans drawn from it,
    stay eager's); above 0 the layers are chosen at random, refused (before: the trace's draw
    became the graph's fixed choice of layers, silently)."""
    import copy

    import torch

    from ortagent.errors import OrtNotImplemented
    from ortagent.torch import ORTModule

    transformers = pytest.importorskip("transformers")

    def make(layerdrop):
        torch.manual_seed(0)
        config = transformers.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=32,
            conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
            final_dropout=0.0, mask_time_prob=0.3, mask_time_length=2, layerdrop=layerdrop, add_adapter=True,
            num_adapter_layers=2, output_hidden_size=32)
        return transformers.Wav2Vec2ForCTC(config).train()

    eager = make(0.0)
    wrapped = ORTModule(copy.deepcopy(eager))
    audio = torch.randn(2, 1200, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[1, 2, 3], [4, 5, -100]])
    for step in range(2):
        losses, left = [], []
        for module in (wrapped, eager):
            np.random.seed(step)
            losses.append(module(audio, labels=labels).loss)
            left.append(np.random.random())     # where each left NumPy's stream
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-4)
        assert left[0] == left[1]
    with pytest.raises(OrtNotImplemented, match="np.random.random"):
        ORTModule(make(0.5))(audio, labels=labels)
