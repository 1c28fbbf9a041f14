"""Train a small character-level GPT through ``ortagent.torch.ORTModule`` (``make demo-torch``).

The text is the source of a module of Python's standard library (``textwrap`` by default):
nothing is downloaded. The same model, from the same initial weights, on the same batches and
under the same seeds (so dropout draws the same masks), is trained twice -- through the bridge
(forward and backward in onnxruntime, AdamW in torch) and in torch eager -- and the two loss
curves are printed and plotted side by side.

Run ``python demo/train_char_gpt.py --help`` for the options. :func:`train` needs neither tqdm nor
matplotlib.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, d: int, heads: int, ctx: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.register_buffer("causal", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = att.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class CharGPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm and a head tied to
    the token embedding."""

    def __init__(self, vocab: int, ctx: int = 32, d: int = 64, heads: int = 4, layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.blocks = nn.Sequential(*[Block(d, heads, ctx, dropout) for _ in range(layers)])
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for module in self.modules():          # GPT-2's initialisation: small logits at the start
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        return self.head(self.lnf(self.blocks(x)))


def load_text(module_name: str = "textwrap") -> str:
    """The source of a standard-library module (it ships with Python)."""
    return inspect.getsource(importlib.import_module(module_name))


@dataclass
class Result:
    bridge_losses: list[float] = field(default_factory=list)
    eager_losses: list[float] = field(default_factory=list)
    bridge_seconds: float = 0.0
    eager_seconds: float = 0.0
    sample: str = ""


def train(text: str, *, steps: int = 300, batch: int = 16, ctx: int = 32, d: int = 64, layers: int = 2,
          lr: float = 3e-3, seed: int = 0, threads: int = 1,
          on_step: Optional[Callable[[int, float, float], None]] = None) -> Result:
    """Train the bridged and the eager model side by side; ``on_step(step, bridge_loss,
    eager_loss)`` after each step."""
    from ortagent.torch import ORTModule, default_session_options

    torch.set_num_threads(threads)
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lookup[c] for c in text], dtype=torch.int64)
    torch.manual_seed(seed)
    eager = CharGPT(len(chars), ctx=ctx, d=d, layers=layers)
    # (ORTModule's default options with this many intra-op threads: onnxruntime's threads spin
    # during a run only, and torch's OpenMP workers are let go before each run)
    options = default_session_options(threads)
    bridged = ORTModule(copy.deepcopy(eager), session_options=options)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (bridged, eager)]
    batches = torch.Generator().manual_seed(seed + 1)
    result = Result()
    for step in range(steps):
        starts = torch.randint(0, len(data) - ctx - 1, (batch,), generator=batches)
        x = torch.stack([data[s:s + ctx] for s in starts])
        y = torch.stack([data[s + 1:s + ctx + 1] for s in starts])
        losses = []
        for model, opt in zip((bridged, eager), optimizers):
            torch.manual_seed(seed * 100003 + step)        # the same dropout masks for both
            began = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
            loss.backward()
            opt.step()
            elapsed = time.perf_counter() - began
            if step == 0:
                pass                                    # the bridge exports in its first step
            elif model is bridged:
                result.bridge_seconds += elapsed
            else:
                result.eager_seconds += elapsed
            losses.append(loss.item())
        result.bridge_losses.append(losses[0])
        result.eager_losses.append(losses[1])
        if on_step is not None:
            on_step(step, losses[0], losses[1])
    # a short sample from the bridged model, in eval mode (a forward-only session)
    bridged.eval()
    idx = data[:ctx].unsqueeze(0).clone()
    out = []
    with torch.no_grad():
        for _ in range(60):
            logits = bridged(idx)[0, -1]
            nxt = int(torch.multinomial(logits.softmax(-1), 1, generator=batches))
            out.append(chars[nxt])
            idx = torch.cat([idx[:, 1:], torch.tensor([[nxt]])], dim=1)
    result.sample = "".join(out)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="textwrap", help="standard-library module whose source is the text")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ctx", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="threads for torch and onnxruntime alike")
    parser.add_argument("--out", default="build/demo/char_gpt_loss.png", help="where the loss plot goes")
    args = parser.parse_args(argv)
    text = load_text(args.module)
    print(f"text: the source of {args.module} ({len(text)} characters, {len(set(text))} distinct)")
    try:
        from tqdm import tqdm
        bar = tqdm(total=args.steps, unit="step")
    except ImportError:
        bar = None

    def on_step(step: int, bridge_loss: float, eager_loss: float) -> None:
        if bar is not None:
            bar.set_postfix(bridge=f"{bridge_loss:.3f}", eager=f"{eager_loss:.3f}")
            bar.update(1)

    result = train(text, steps=args.steps, batch=args.batch, ctx=args.ctx, layers=args.layers,
                   threads=args.threads, on_step=on_step)
    if bar is not None:
        bar.close()
    tail = max(1, args.steps // 10)
    bridge_final = sum(result.bridge_losses[-tail:]) / tail
    eager_final = sum(result.eager_losses[-tail:]) / tail
    print(f"first loss: bridge {result.bridge_losses[0]:.4f}, eager {result.eager_losses[0]:.4f}")
    print(f"final loss (mean of the last {tail} steps): bridge {bridge_final:.4f}, eager {eager_final:.4f}")
    print(f"time in training steps after the first (which exports): bridge {result.bridge_seconds:.2f} s, "
          f"eager {result.eager_seconds:.2f} s ({args.threads} thread(s) each)")
    print(f"sample: {result.sample!r}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(result.eager_losses, label="torch eager", linewidth=2, alpha=0.6)
    ax.plot(result.bridge_losses, label="ortagent.torch.ORTModule", linewidth=1, linestyle="--")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(f"char-level GPT on the source of {args.module}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"loss plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
