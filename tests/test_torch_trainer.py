"""transformers' Trainer trains an ORTModule-wrapped model as it trains the bare one: a GPT-2
built from a config, a small in-memory datasets.Dataset with extra columns (Trainer keeps only
the columns the forward's signature names: remove_unused_columns left at its default), AdamW
with a linear schedule, gradient clipping, a few logged steps; the same losses as the same
Trainer on the bare model. And with gradient checkpointing enabled (torch.utils.checkpoint:
the export records the forward once; onnxruntime's backward keeps what it needs)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch


def _losses(model, folder):
    import transformers

    class Logged(transformers.TrainerCallback):
        def __init__(self):
            self.losses = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    logged = Logged()
    args = transformers.TrainingArguments(output_dir=str(folder), per_device_train_batch_size=4, max_steps=4,
                                          logging_steps=1, learning_rate=1e-3, report_to=[], save_strategy="no",
                                          seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_dataset(), callbacks=[logged])
    trainer.train()
    return logged.losses


def _dataset():
    import datasets
    import torch

    generator = torch.Generator().manual_seed(0)
    rows = []
    for index in range(16):
        ids = torch.randint(0, 64, (12,), generator=generator).tolist()
        rows.append({"input_ids": ids, "labels": ids, "text": "a column the forward does not take", "idx": index})
    return datasets.Dataset.from_list(rows)


def _gpt2(checkpointing):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient_checkpointing"])
def test_trainer_trains_an_ortmodule_as_the_bare_model(tmp_path, checkpointing):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (make test TORCH=1)")
    pytest.importorskip("transformers")
    pytest.importorskip("datasets", reason="the Trainer test needs datasets (make test TORCH=1)")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (make test TORCH=1)")
    from ortagent.torch import ORTModule

    torch.set_num_threads(1)
    expected = _losses(_gpt2(checkpointing), tmp_path / "eager")
    wrapped = ORTModule(_gpt2(checkpointing))
    got = _losses(wrapped, tmp_path / "ortmodule")
    assert len(got) == len(expected) == 4
    assert got == pytest.approx(expected, rel=1e-5)
    assert wrapped.exported_graphs == 1
