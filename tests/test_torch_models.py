"""Real model families through ``ortagent.torch.ORTModule``, built from configs with random
weights (nothing downloaded): transformers' GPT-2 (its LM loss), BERT (a padded attention
mask), Llama (grouped-query attention), Mixtral and Qwen2-MoE (sparse experts), T5, Mistral
(its sliding-window cache), BART and OPT
(their layerdrop draws), BLOOM (its custom GELU autograd.Function), BEiT (SDPA with a learned
bias), LLaVA (a vision-language model and its check of the image tokens); torchvision's ResNet-18
(BatchNorm in training) and MobileNetV3 (depthwise convolutions, squeeze-excitation); timm's
ViT (stochastic depth).

Each trains a few optimizer steps beside the same model in eager torch. Every step starts both
from the same state (the eager copy takes the bridged model's parameters and buffers), so a
difference cannot grow from the one before: the loss, every gradient (each within 1e-4 of its
largest magnitude) and the BatchNorm running statistics are compared, with the same dropout and
stochastic-depth draws under one seed. The input shapes change between steps (batch size,
sequence length), and one export serves them all.
"""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.torch

RTOL = 1e-4


def _torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")
    torch.set_num_threads(1)
    return torch


def _compare_tensor(what, actual, expected, rtol=RTOL):
    torch = _torch()
    assert actual is not None, f"{what}: no gradient"
    error = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    scale = expected.double().abs().max().item() if expected.numel() else 0.0
    assert error <= rtol * max(scale, 1e-3), f"{what}: max abs error {error:.3g} at scale {scale:.3g}"
    del torch


def _train(make_model, make_batch, loss_of, steps, *, lr=1e-3, exports=1):
    """Train an ORTModule and an eager copy side by side; returns the ORTModule."""
    torch = _torch()
    from ortagent.torch import ORTModule

    torch.manual_seed(0)
    inner = make_model().train()
    bridged = ORTModule(inner)
    eager = copy.deepcopy(inner)
    optimizer = torch.optim.AdamW(bridged.parameters(), lr=lr)
    shapes = set()
    for step in range(steps):
        state = copy.deepcopy(inner.state_dict())
        for redraw in range(_REDRAWS + 1):
            inner.load_state_dict(state)                    # (a redrawn batch starts over)
            inner.zero_grad()
            eager.load_state_dict(state)                    # the same state before each step
            eager.zero_grad()
            batch = make_batch(step) if not redraw else make_batch(step, redraw=redraw)
            torch.manual_seed(100 + step)
            shapes.add(tuple(tuple(t.shape) for t in torch.utils._pytree.tree_leaves(batch)
                             if isinstance(t, torch.Tensor)))
            loss = loss_of(_call(bridged, batch))
            loss.backward()
            torch.manual_seed(100 + step)
            expected = loss_of(_call(eager, batch))
            expected.backward()
            _compare_tensor(f"step {step} loss", loss.detach(), expected.detach())
            mismatched = []
            for (name, p_eager), p_bridged in zip(eager.named_parameters(), inner.parameters()):
                if p_eager.grad is None:
                    assert p_bridged.grad is None or not p_bridged.grad.any(), name
                    continue
                try:
                    _compare_tensor(f"step {step} gradient of {name}", p_bridged.grad, p_eager.grad)
                except AssertionError:
                    mismatched.append(name)
            if not mismatched:
                break
            try:
                _against_float64(eager, state, batch, loss_of, step, mismatched, inner)
                break
            except _AtAKink:
                if redraw == _REDRAWS:
                    raise
        for (name, b_eager), b_bridged in zip(eager.named_buffers(), inner.buffers()):
            if b_eager.is_floating_point():
                _compare_tensor(f"step {step} buffer {name}", b_bridged, b_eager, rtol=1e-5)
            else:
                assert torch.equal(b_bridged, b_eager), name
        optimizer.step()
        optimizer.zero_grad()
    # one export for every shape (the Python state of the module is part of the key: see BERT),
    # after the first call's export at its own static shapes when the shapes vary
    assert bridged.exported_graphs == exports + (len(shapes) > 1)
    return bridged


_REDRAWS = 2
#: a ReLU input this close to 0 in float64 (relative to the largest) may fall on either side in
#: float32 (the summation order of a convolution moves it by a few 1e-7): the gradient then has
#: two right answers
_KINK = 1e-5


class _AtAKink(AssertionError):
    """The float64 reference has a ReLU input within float32 rounding of 0: the batch is redrawn
    (a ``make_batch`` that takes ``redraw``), the comparison made again on the new one."""


def _against_float64(eager, state, batch, loss_of, step, names, inner):
    """Gradients that differ from eager float32's by more than RTOL, held to the float64
    gradient instead: no farther from it than four times eager float32's own error (or RTOL).

    Some training states are ill-conditioned in float32 (a BatchNorm channel of a few nearly
    equal values after an optimizer step): there eager float32 itself is percents off the float64
    gradient, and a difference in summation order anywhere moves the result as much."""
    torch = _torch()
    exact = copy.deepcopy(eager).double()
    exact.load_state_dict(state)
    exact.zero_grad()

    def wide(value):
        return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    wide_batch = {k: wide(v) for k, v in batch.items()} if isinstance(batch, dict) else tuple(map(wide, batch))
    margins = []

    def record_margin(module, inputs):
        margins.append((inputs[0].detach().abs().min().item(), inputs[0].detach().abs().max().item()))

    hooks = [module.register_forward_pre_hook(record_margin) for module in exact.modules()
             if isinstance(module, torch.nn.ReLU)]
    torch.manual_seed(100 + step)
    loss_of(_call(exact, wide_batch)).backward()
    for hook in hooks:
        hook.remove()
    params = dict(exact.named_parameters())
    at_a_kink = any(smallest <= _KINK * largest for smallest, largest in margins if largest > 0)
    eager_params = dict(eager.named_parameters())
    bridged_params = dict(zip((n for n, _ in eager.named_parameters()), inner.parameters()))
    for name in names:
        reference = params[name].grad
        scale = reference.abs().max().item()
        eager_error = (eager_params[name].grad.double() - reference).abs().max().item()
        error = (bridged_params[name].grad.double() - reference).abs().max().item()
        if at_a_kink and error > max(4 * eager_error, RTOL * max(scale, 1e-3)):
            raise _AtAKink(f"step {step} gradient of {name}: a ReLU input of the float64 run is within float32 "
                           "rounding of 0")
        assert error <= max(4 * eager_error, RTOL * max(scale, 1e-3)), (
            f"step {step} gradient of {name}: max abs error {error:.3g} to float64 at scale {scale:.3g} "
            f"(eager float32's: {eager_error:.3g})")


def _call(model, batch):
    return model(**batch) if isinstance(batch, dict) else model(*batch)


def _tokens(step, batch, length, vocab, **extra):
    torch = _torch()
    generator = torch.Generator().manual_seed(step)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    return ids, generator


def test_gpt2_lm_loss_with_its_default_cache():
    torch = _torch()
    transformers = pytest.importorskip("transformers")

    def make():
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
        return transformers.GPT2LMHeadModel(config)     # dropout 0.1 and use_cache=True: the defaults

    shapes = [(2, 16), (3, 12), (2, 16)]

    def batch(step):
        ids, _ = _tokens(step, *shapes[step], 128)
        return {"input_ids": ids, "labels": ids}

    model = _train(make, batch, lambda out: out.loss, len(shapes))
    assert model.exported_graphs == 2           # the first call's shapes, then symbolic ones
    ids = batch(0)["input_ids"]
    out = model(input_ids=ids, labels=ids)
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions"       # the ModelOutput, not a dict
    assert type(out.past_key_values).__name__ == "DynamicCache"
    assert not out.past_key_values.layers[0].keys.requires_grad           # the cache comes back detached


def test_mistral_returns_its_sliding_window_cache():
    """Mistral's default cache holds sliding-window layers (the last ``window - 1`` keys and
    values, and the count of tokens seen): trained beside eager over sequences shorter and
    longer than the window, it comes back as eager's cache, layer kinds, tensors and counts."""
    torch = _torch()
    transformers = pytest.importorskip("transformers")
    window = 8

    def make():
        config = transformers.MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                                            max_position_embeddings=64, sliding_window=window)
        return transformers.MistralForCausalLM(config)

    shapes = [(2, 6), (2, 12), (3, 10)]

    def batch(step):
        ids, _ = _tokens(step, *shapes[step], 96)
        return {"input_ids": ids, "labels": ids}

    model = _train(make, batch, lambda out: out.loss, len(shapes))
    eager = copy.deepcopy(model.module)
    for batch_size, length in ((2, 5), (3, 13)):
        ids, _ = _tokens(7, batch_size, length, 96)
        got, expected = model(input_ids=ids).past_key_values, eager(input_ids=ids).past_key_values
        assert [type(layer).__name__ for layer in got.layers] == \
            [type(layer).__name__ for layer in expected.layers] == ["DynamicSlidingWindowLayer"] * 2
        assert got.get_seq_length() == expected.get_seq_length() == length
        for mine, theirs in zip(got.layers, expected.layers):
            assert mine.sliding_window == theirs.sliding_window == window
            assert mine.cumulative_length == theirs.cumulative_length
            assert mine.keys.shape[-2] == min(length, window - 1)
            _compare_tensor("keys", mine.keys, theirs.keys)
            _compare_tensor("values", mine.values, theirs.values)


def test_a_cache_with_layers_the_forward_did_not_write_comes_back_as_eager_s():
    """A DynamicCache made with more layers than the forward writes (AFMoE makes its cache from
    its config's layer types, and a short model writes the first ones only) comes back with
    the layers left empty as empty layers of their kinds (before: an AttributeError from the
    bridge reading an empty layer's keys)."""
    torch = _torch()
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache

    from ortagent.torch import ORTModule

    class Writes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.key = torch.nn.Linear(4, 4)

        def forward(self, x):
            cache = DynamicCache(ddp_cache_data=[(None, None), (None, None, torch.tensor(3)), (None, None)])
            keys = self.key(x).unsqueeze(1)
            cache.update(keys, keys * 2, 0)
            return keys.sum(), cache

    x = torch.randn(2, 5, 4)
    eager = Writes()
    model = ORTModule(copy.deepcopy(eager))
    (loss, got), (want_loss, want) = model(x), eager(x)
    _compare_tensor("loss", loss, want_loss)
    assert [(type(layer).__name__, layer.is_initialized) for layer in got.layers] == \
        [(type(layer).__name__, layer.is_initialized) for layer in want.layers] == \
        [("DynamicLayer", True), ("DynamicSlidingWindowLayer", False), ("DynamicLayer", False)]
    assert got.layers[1].sliding_window == 3
    assert got.get_seq_length() == want.get_seq_length() == 5
    _compare_tensor("keys", got.layers[0].keys, want.layers[0].keys)
    _compare_tensor("values", got.layers[0].values, want.layers[0].values)


def test_a_hybrid_model_s_cache_of_linear_attention_layers_comes_back_as_eager_s():
    """Hybrid models (Qwen3.5, Qwen3-Next, Nemotron-H; Falcon-H1 and Jamba with an attention
    part) return a DynamicCache of linear-attention layers, their convolution and recurrent
    states: it comes back with eager's layer classes, states, flags and keys (before: refused,
    unless the model was called with use_cache=False)."""
    torch = _torch()
    pytest.importorskip("transformers")
    from transformers import cache_utils

    from ortagent.torch import ORTModule

    class Hybrid(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(4, 4, 3, padding=2)
            self.key = torch.nn.Linear(4, 4)

        def forward(self, x):                               # x: batch, 4, time
            cache = cache_utils.DynamicCache()
            cache.layers = [cache_utils.LinearAttentionLayer(),
                            cache_utils.LinearAttentionAndFullAttentionLayer(number_of_states=2)]
            mixed = self.conv(x)[..., :x.shape[-1]]
            cache.layers[0].update_conv_state(x, conv_kernel_size=3)
            cache.layers[0].update_recurrent_state(mixed.tanh().sum(-1))
            cache.layers[1].update_conv_state(mixed, state_idx=1, conv_kernel_size=3)
            keys = self.key(mixed.transpose(1, 2)).unsqueeze(1)
            cache.update(keys, keys * 2, 1)
            return mixed.square().mean() + keys.sum(), cache

    x = torch.randn(2, 4, 6)
    eager = Hybrid()
    model = ORTModule(copy.deepcopy(eager))
    (loss, got), (want_loss, want) = model(x), eager(x)
    _compare_tensor("loss", loss, want_loss)
    assert [type(layer).__name__ for layer in got.layers] == [type(layer).__name__ for layer in want.layers]
    for mine, theirs in zip(got.layers, want.layers):
        for attribute in ("is_conv_states_initialized", "is_recurrent_states_initialized", "has_previous_state",
                          "conv_kernel_size"):
            assert getattr(mine, attribute) == getattr(theirs, attribute), attribute
        for attribute in ("conv_states", "recurrent_states"):
            for index, value in getattr(theirs, attribute).items():
                if value is None:
                    assert getattr(mine, attribute)[index] is None
                else:
                    _compare_tensor(attribute, getattr(mine, attribute)[index], value)
    _compare_tensor("keys", got.layers[1].keys, want.layers[1].keys)
    assert got.get_seq_length(1) == want.get_seq_length(1) == 6
    loss.backward()


@pytest.mark.parametrize("family", ["bart", "opt"])
def test_transformers_models_that_draw_for_layerdrop_train_beside_eager(family):
    """BART and OPT draw ``torch.rand([])`` per layer in training to skip it below their
    layerdrop (0 by default): the branch is the same for every draw and traces as such, the draw
    still made, so the dropout after it keeps eager's masks (before: a TraceFailure, 'Tensor.item()
    cannot be called on meta tensors')."""
    torch = _torch()
    transformers = pytest.importorskip("transformers")

    def make():
        if family == "bart":
            config = transformers.BartConfig(vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1,
                                             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                             decoder_ffn_dim=64, max_position_embeddings=64)
            return transformers.BartForConditionalGeneration(config)
        config = transformers.OPTConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64)
        return transformers.OPTForCausalLM(config)

    shapes = [(2, 10), (3, 8)]

    def batch(step):
        ids, generator = _tokens(step, *shapes[step], 96)
        if family == "bart":
            return {"input_ids": ids, "labels": torch.randint(3, 96, (shapes[step][0], 5), generator=generator)}
        return {"input_ids": ids, "labels": ids}

    _train(make, batch, lambda out: out.loss, len(shapes))


def test_bloom_with_its_custom_gelu_function():
    """BLOOM's MLP applies a custom autograd.Function (GeLUFunction) whose backward is the exact
    derivative of its tanh GELU: ortagent knows it (``differentiate_forward_of``) and traces its
    forward's operations (refused before; before that, its weights got zero gradients
    silently)."""
    transformers = pytest.importorskip("transformers")

    def make():
        return transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=96, hidden_size=32, n_layer=2,
                                                                      n_head=2))

    shapes = [(2, 8), (2, 5), (3, 8)]

    def batch(step):
        ids, _ = _tokens(step, *shapes[step], 96)
        return {"input_ids": ids, "labels": ids}

    _train(make, batch, lambda out: out.loss, len(shapes))


def test_bert_with_a_padded_attention_mask():
    torch = _torch()
    transformers = pytest.importorskip("transformers")

    def make():
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                         intermediate_size=128, vocab_size=200, max_position_embeddings=64)
        return transformers.BertForSequenceClassification(config)

    shapes = [(3, 12), (4, 9), (3, 14)]

    def batch(step):
        ids, generator = _tokens(step, *shapes[step], 200)
        mask = torch.ones_like(ids)
        mask[0, -4:] = 0                                    # padding
        return {"input_ids": ids, "attention_mask": mask,
                "labels": torch.randint(0, 2, (ids.shape[0],), generator=generator)}

    # the forward sets config.problem_type on its first call (during the export): the second
    # call sees other module state and exports again, once (the graph traced from the first
    # state need not be the one for the second)
    model = _train(make, batch, lambda out: out.loss, len(shapes), exports=2)
    assert model.config.problem_type == "single_label_classification"


def test_llama_with_grouped_query_attention():
    transformers = pytest.importorskip("transformers")

    def make():
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=128, vocab_size=200,
                                          max_position_embeddings=64)
        return transformers.LlamaForCausalLM(config)

    shapes = [(2, 10), (2, 7), (3, 10)]

    def batch(step):
        ids, _ = _tokens(step, *shapes[step], 200)
        return {"input_ids": ids, "labels": ids}

    _train(make, batch, lambda out: out.loss, len(shapes))


def test_llava_vision_language_model_and_its_image_token_check():
    """LLaVA (a CLIP vision tower, a projector, a Llama text model), whose image features take
    the image tokens' places after transformers' check that their counts agree
    (torch_compilable_check: torch._check_tensor_all under export, which torch.onnx could not
    translate, so it was refused): it trains beside eager over changing batch sizes and text
    lengths, and an input with an image token short stops the run with a ValueError, as eager
    raises (the graph keeps the check)."""
    torch = _torch()
    transformers = pytest.importorskip("transformers")
    image_token, patches = 100, 16

    def make():
        vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, image_size=32, patch_size=8)
        text = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        max_position_embeddings=128)
        config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_id=image_token,
                                          vision_feature_layer=-1)
        return transformers.LlavaForConditionalGeneration(config)

    shapes = [(2, 6), (3, 9), (2, 4)]

    def batch(step, images=patches):
        ids, generator = _tokens(step, shapes[step][0], shapes[step][1] + patches, 99)
        ids[:, 1:1 + images] = image_token
        pixels = torch.randn(shapes[step][0], 3, 32, 32, generator=generator)
        return {"input_ids": ids, "pixel_values": pixels, "labels": ids}

    # (the first call sets state its second call's key sees, as BERT's: two exports)
    model = _train(make, batch, lambda out: out.loss, len(shapes), exports=2)
    short = batch(0, images=patches - 1)
    with pytest.raises(ValueError, match="image tokens"):
        model.module(**short)
    with pytest.raises(ValueError, match="torch._check_tensor_all"):
        model(**short)
    # at a shape no export serves yet (one sample): a ValueError too, and that shape's export
    # then serves a good input
    unseen, good = ({key: value[:1] for key, value in batch(1, images=images).items()}
                    for images in (patches - 1, patches))
    with pytest.raises(ValueError, match="image tokens"):
        model(**unseen)
    torch.testing.assert_close(model(**good).loss, model.module(**good).loss)
    torch.testing.assert_close(model(**batch(0)).loss, model.module(**batch(0)).loss)


def test_longformer_with_its_chunked_sliding_window_attention():
    """Longformer's local attention cuts the sequence into overlapping chunks with
    ``as_strided`` on a transposed view, whose storage order torch.onnx's translation ignored
    (the trace now gathers from the storage: see ortagent/torch/_strided.py), and decides
    ``is_global_attn = mask.any().item()`` in Python (a branch the graph now checks); before,
    refused for that branch, and wrong (gradients 4e-3 off) once past it."""
    transformers = pytest.importorskip("transformers")

    def make():
        config = transformers.LongformerConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                               intermediate_size=64, vocab_size=99, attention_window=4,
                                               max_position_embeddings=64)
        return transformers.LongformerForMaskedLM(config)

    shapes = [(2, 8), (3, 12)]

    def batch(step):
        ids, _ = _tokens(step, *shapes[step], 99)
        return {"input_ids": ids, "labels": ids}

    _train(make, batch, lambda out: out.loss, len(shapes))


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_mixture_of_experts_routing(family):
    """Mixtral's and Qwen2-MoE's sparse experts (top-2 of 4 per token; Qwen2-MoE adds a gated
    shared expert): transformers routes the tokens and runs its grouped product, a custom
    operator ortagent translates (ortagent/torch/translations/experts.py); which expert gets
    how many rows changes with every batch. The routers' load-balancing loss is on as well."""
    transformers = pytest.importorskip("transformers")

    def make():
        common = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=64, vocab_size=100, max_position_embeddings=64, output_router_logits=True)
        if family == "mixtral":
            return transformers.MixtralForCausalLM(transformers.MixtralConfig(
                num_local_experts=4, num_experts_per_tok=2, **common))
        return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            **common))

    shapes = [(2, 10), (2, 7), (3, 10)]

    def batch(step):
        ids, _ = _tokens(step, *shapes[step], 100)
        return {"input_ids": ids, "labels": ids}

    # (the first call installs transformers' hooks that collect the router logits: the module
    # the second call sees differs, and is exported again, as BERT's head)
    model = _train(make, batch, lambda out: out.loss, len(shapes), exports=2)
    assert model(**batch(0)).aux_loss is not None


def test_t5_encoder_decoder():
    transformers = pytest.importorskip("transformers")
    torch = _torch()

    def make():
        config = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, d_ff=128,
                                       num_heads=4, vocab_size=200, decoder_start_token_id=0, pad_token_id=0)
        return transformers.T5ForConditionalGeneration(config)

    def batch(step):
        ids, generator = _tokens(step, 2, 10 - step, 200)
        return {"input_ids": ids, "labels": torch.randint(1, 200, (2, 7), generator=generator)}

    model = _train(make, batch, lambda out: out.loss, 3)
    out = model(**batch(0))
    assert type(out.past_key_values).__name__ == "EncoderDecoderCache"


def test_beit_with_its_default_sdpa_attention_and_relative_position_bias():
    """BEiT adds a learned relative position bias as SDPA's float mask and views the attention's
    transposed result; torch.onnx's re-trace of the export picked another SDPA kernel layout than
    the export and failed (refused, before)."""
    transformers = pytest.importorskip("transformers")
    torch = _torch()

    def make():
        config = transformers.BeitConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, image_size=32, patch_size=8, num_labels=3,
                                         use_relative_position_bias=True, drop_path_rate=0.1)
        return transformers.BeitForImageClassification(config)

    sizes = [2, 3, 2]

    def batch(step):
        (pixels,) = _images(step, sizes[step], size=32)
        return {"pixel_values": pixels, "labels": torch.arange(sizes[step]) % 3}

    # (the classification head sets config.problem_type on its first call: a second export, as BERT's)
    model = _train(make, batch, lambda out: out.loss, len(sizes), exports=2)
    assert model.config._attn_implementation == "sdpa"


def _images(step, batch, size=64):
    torch = _torch()
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(step)),)


def test_resnet18_batchnorm_in_training():
    torchvision = pytest.importorskip("torchvision")
    sizes = [2, 3, 2]
    model = _train(lambda: torchvision.models.resnet18(num_classes=10),
                   lambda step, redraw=0: _images(step + 1000 * redraw, sizes[step]),
                   lambda out: out.square().mean(), len(sizes))
    assert model.exported_graphs == 2           # the first call's shapes, then symbolic ones


def test_mobilenet_v3_depthwise_convolutions():
    torchvision = pytest.importorskip("torchvision")
    _train(lambda: torchvision.models.mobilenet_v3_small(num_classes=10),
           lambda step, redraw=0: _images(step + 1000 * redraw, 2),
           lambda out: out.square().mean(), 2)


def test_vit_with_stochastic_depth():
    timm = pytest.importorskip("timm")

    def make():
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32,
                                 patch_size=8, depth=2, drop_path_rate=0.2, drop_rate=0.1)

    sizes = [2, 3, 2]
    _train(make, lambda step: _images(step, sizes[step], size=32), lambda out: out.square().mean(), len(sizes))
