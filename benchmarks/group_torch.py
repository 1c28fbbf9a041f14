"""Group 6, torch: one training step of a torch module through ``ortagent.torch.ORTModule``
against the same step in torch eager, interleaved in the same rounds.

A step is ``zero_grad(set_to_none=True)``, the forward, a loss in torch (mean of squares, or
cross-entropy for the GPT block), ``backward()`` into ``param.grad`` -- no optimizer. Torch runs
with ``torch.set_num_threads(1)``, onnxruntime with 1 intra-op and 1 inter-op thread (the
session settings of every group), so the thread CPU time measures all the work of either side.

Cases: MLP 784-512-10 at batch 64; ``nn.TransformerEncoderLayer(d_model=256, nhead=8,
dim_feedforward=1024, dropout=0)`` on [seq 64, batch 8, 256]; a GPT-2 block (token and position
embeddings, pre-LN causal self-attention with 4 heads, GELU MLP, final LayerNorm, head tied to
the embedding) with d=128, vocabulary 256, context 64, batch 8. Both copies start from the same
weights; the bridge's gradients are checked against eager's before timing (and exported then:
the export is not timed). Skipped, with the reason, when torch or onnxscript is missing.
"""

from __future__ import annotations

import copy
import time

from . import _common
from ._harness import PyCalls, run_rounds
from ._report import Group, Row

ROUNDS_FULL, ROUNDS_QUICK = 21, 5


def _gpt_block(vocab=256, d=128, heads=4, ctx=64):
    """One pre-LN GPT-2 block with token/position embeddings and a tied head: the demo's CharGPT
    (demo/train_char_gpt.py) with one layer and no dropout."""
    demo = _common.load_module("train_char_gpt", _common.REPO_ROOT / "demo" / "train_char_gpt.py")
    return demo.CharGPT(vocab, ctx=ctx, d=d, heads=heads, layers=1, dropout=0.0)


def _cases(torch):
    nn = torch.nn
    gen = torch.Generator().manual_seed(0)
    square = lambda out: out.square().mean()  # noqa: E731
    idx = torch.randint(0, 256, (8, 64), generator=gen)
    target = torch.roll(idx, -1, 1).reshape(-1)

    def gpt_loss(logits):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)

    return [
        ("mlp", "MLP 784-512-10 b64",
         lambda: nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)),
         torch.randn(64, 784, generator=gen), square),
        ("transformer", "TransformerEncoderLayer d256 b8 s64",
         lambda: nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0),
         torch.randn(64, 8, 256, generator=gen), square),
        ("gpt", "GPT-2 block d128 b8 s64 (tied head)", lambda: _gpt_block(), idx, gpt_loss),
    ]


def run(settings) -> Group:
    started = time.perf_counter()
    rounds = settings.rounds.get("torch", ROUNDS_QUICK if settings.quick else ROUNDS_FULL)
    group = Group("torch", "6. torch: one training step, ORTModule vs torch eager (ms per step)",
                  rounds=rounds, burst_s=settings.burst_s, clock=settings.clock)
    try:
        import onnxscript  # noqa: F401
        import torch
    except ImportError as exc:
        group.skipped = f"{exc.name} is not installed (make bench TORCH=1 installs torch and onnxscript)"
        return group
    from ortagent.torch import ORTModule

    torch.set_num_threads(1)
    blocks = []
    labels = {}
    for tag, title, make, x, loss_fn in _cases(torch):
        torch.manual_seed(0)
        eager = make()
        bridged = ORTModule(copy.deepcopy(eager), session_options=_common.ortagent_options())

        def step(model, x=x, loss_fn=loss_fn):
            model.zero_grad(set_to_none=True)
            loss_fn(model(x)).backward()

        step(eager)
        step(bridged)                              # exports and checks
        worst = 0.0
        for pe, pb in zip(eager.parameters(), bridged.module.parameters()):
            scale = max(pe.grad.abs().max().item(), 1e-2)
            worst = max(worst, (pe.grad - pb.grad).abs().max().item() / scale)
        if worst > 1e-4:
            raise AssertionError(f"{tag}: the bridge's gradients differ from eager's ({worst:.2g} relative)")
        group.notes.append(f"{title}: largest gradient difference to eager {worst:.1e} "
                           "(relative to the gradient's largest entry)")
        labels[tag] = title
        blocks.append([PyCalls(f"{tag}/eager", f"{title}: torch eager step", "torch", step, eager),
                       PyCalls(f"{tag}/bridge", f"{title}: ORTModule step", "ortagent", step, bridged)])
    samples = run_rounds(blocks, rounds, settings.burst_s, desc="6/6 torch", seed=settings.seed,
                         clock=settings.clock)
    for tag, title in labels.items():
        group.rows.append(Row(f"{tag}/eager", f"{title}: torch eager step", "torch", samples[f"{tag}/eager"], unit="ms",
                              other=samples.other[f"{tag}/eager"]))
        group.rows.append(Row(f"{tag}/bridge", f"{title}: ORTModule step", "ortagent",
                              samples[f"{tag}/bridge"], ref=f"{tag}/eager", ref_name="torch eager", unit="ms",
                              other=samples.other[f"{tag}/bridge"]))
    group.ratio_target("torch_mlp", "ORTModule MLP step within 1.5x of torch eager's",
                       "mlp/bridge", "mlp/eager", 1.5)
    group.ratio_target("torch_transformer", "ORTModule TransformerEncoderLayer step within 1.5x of eager's",
                       "transformer/bridge", "transformer/eager", 1.5)
    group.seconds = time.perf_counter() - started
    return group
