"""Group 7, torch model families: ``ortagent.torch.ORTModule`` against torch eager on models
built from configs (random weights, nothing downloaded), interleaved in the same rounds.

Per model: the training step (``zero_grad(set_to_none=True)``, forward, loss, ``backward()``; no
optimizer), the forward alone (forward and loss; the graph is dropped unused), and the backward
as their difference; the first call's time split into the export (discovery included; itself
split into discovery, torch.export's trace, the table of translations (once per process), and torch.onnx's decompositions, type
promotion, translation and onnxscript optimizer), the training-graph build (autodiff, lowering, passes) and the session creation (the agent's two
sessions), by thread CPU time. Torch runs with one thread, onnxruntime with 1 intra-op and 1
inter-op thread (the session settings of every group), unless ``--torch-threads`` says otherwise.

Models (issue 24's families, built from configs): torchvision ResNet-18 and MobileNetV3-small on
2x3x64x64 (``--quick``: ResNet-18 only), transformers GPT-2 (2 layers, d64, 4 heads, vocabulary
128) on 2x16 tokens with its LM loss, BERT (2 layers, d64) sequence classification on 4x16 tokens
with one padded sequence, Llama (2 layers, d64, grouped-query attention) on 2x16 tokens, T5 (2+2
layers, d64) on 2x16 tokens with 2x8 labels, and timm's ViT-tiny (2 blocks, patch 8) on
2x3x32x32 when timm is installed; dropout off except in T5 (both sides draw the same masks). ``--torch-models`` picks some. The bridge's
gradients are checked against eager's before timing. Skipped, with the reason, when torch,
torchvision, transformers or onnxscript is missing. This group times the CPU; a CUDA run is not
part of it yet (noted in the group when a CUDA device exists).

Threads: one each by default (thread CPU time, as every single-threaded group);
``--torch-threads N`` gives torch N threads and onnxruntime N intra-op threads and times the wall
clock (the memory children are skipped then). Targets: each model's step <= 1.0x eager's, and
the median of the models' ratios <= 0.85x.

Memory, per model and side, each in a fresh child process (Linux: the kernel's resident-set
counters in ``/proc/self/status``; skipped elsewhere), all above the resident size of the built
model before its first call: the peak of the first call (for ORTModule, the export's and the
sessions' creation), the peak of the next four steps (the high-water mark reset with
``/proc/self/clear_refs`` between), and what stays resident after them (eager: autograd's and the
allocator's retained memory; ORTModule: the exported graph, the two sessions with their arenas
and plans as well), each against eager's; and, apart, what importing the exporter costs.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import time

from . import _common
from ._harness import PyCalls, run_rounds
from ._report import Group, Row, Target

ROUNDS_FULL, ROUNDS_QUICK = 15, 5


def _models(torch, quick: bool):
    """(tag, title, make, args, kwargs, loss_of) of each model, the issue's families built from
    configs: convolution nets with a squared-output loss, transformers models with their own
    loss. Dropout is off where a config has it, except T5's (see there)."""
    import torchvision

    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    square = lambda out: out.square().mean()  # noqa: E731
    own_loss = lambda out: out.loss  # noqa: E731
    cases = [("resnet18", "ResNet-18 2x3x64x64", lambda: torchvision.models.resnet18(num_classes=10),
              (images,), {}, square)]
    if quick:
        return cases
    cases.append(("mobilenet_v3", "MobileNetV3-small 2x3x64x64",
                  lambda: torchvision.models.mobilenet_v3_small(num_classes=10), (images,), {}, square))
    import transformers

    def tokens(seed, batch, length, vocab):
        return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))

    ids = tokens(1, 2, 16, 128)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cases.append(("gpt2", "GPT-2 2 layers d64 2x16", lambda: transformers.GPT2LMHeadModel(config), (),
                  {"input_ids": ids, "labels": ids}, own_loss))
    bert_ids = tokens(2, 4, 16, 200)
    mask = torch.ones_like(bert_ids)
    mask[0, -4:] = 0                                        # one padded sequence
    bert = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   intermediate_size=128, vocab_size=200, max_position_embeddings=64,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   problem_type="single_label_classification")
    cases.append(("bert", "BERT 2 layers d64 4x16, classification",
                  lambda: transformers.BertForSequenceClassification(bert), (),
                  {"input_ids": bert_ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0])}, own_loss))
    llama_ids = tokens(3, 2, 16, 200)
    llama = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=128, vocab_size=200,
                                     max_position_embeddings=64)
    cases.append(("llama", "Llama 2 layers d64 GQA 2x16", lambda: transformers.LlamaForCausalLM(llama), (),
                  {"input_ids": llama_ids, "labels": llama_ids}, own_loss))
    # T5 keeps its default dropout (0.1): with dropout_rate=0.0, torch.onnx (torch 2.14.1) fails to
    # decompose the exported program (a view of a transposed attention product that torch.export
    # found contiguous), and ORTModule refuses the model with that error
    t5 = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, d_ff=128, num_heads=4,
                               vocab_size=200, decoder_start_token_id=0, pad_token_id=0)
    cases.append(("t5", "T5 2+2 layers d64 2x16 -> 2x8", lambda: transformers.T5ForConditionalGeneration(t5), (),
                  {"input_ids": tokens(4, 2, 16, 200), "labels": tokens(5, 2, 8, 200).clamp(min=1)}, own_loss))
    try:
        import timm
    except ImportError:
        return cases
    small = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    cases.append(("vit", "ViT-tiny 2 blocks 2x3x32x32 (timm)",
                  lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32,
                                            patch_size=8, depth=2),
                  (small,), {}, square))
    return cases


def model_case(torch, tag: str):
    """(title, make, args, kwargs, loss_of) of the model ``tag`` of this group."""
    for case_tag, title, make, args, kwargs, loss_of in _models(torch, quick=False):
        if case_tag == tag:
            return title, make, args, kwargs, loss_of
    raise SystemExit(f"no model {tag!r} in group 7")


def _resident_mb() -> tuple[float, float]:
    """(resident size, its high-water mark) of this process in MiB, from /proc/self/status."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024.0
    return values["VmRSS"], values["VmHWM"]


def _memory_child(tag: str, side: str) -> dict:
    """Run in a child: one model, one side, resident sizes around its first call and its steps."""
    import torch

    torch.set_num_threads(1)
    _, make, args, kwargs, loss_of = model_case(torch, tag)
    imports = 0.0
    if side == "bridge":                    # what importing the exporter costs, apart
        unloaded, _ = _resident_mb()
        import onnxscript  # noqa: F401
        import torch.onnx._internal.exporter._core  # noqa: F401

        from ortagent.torch import ORTModule
        imports = _resident_mb()[0] - unloaded
    torch.manual_seed(0)
    model = make().train()
    if side == "bridge":
        model = ORTModule(model, session_options=_common.ortagent_options())

    def step():
        model.zero_grad(set_to_none=True)
        loss_of(model(*args, **kwargs)).backward()

    before, _ = _resident_mb()
    step()
    _, first_peak = _resident_mb()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")                    # resets VmHWM to the current resident size
    for _ in range(4):
        step()
    resident, later_peak = _resident_mb()
    return {"first_peak": first_peak - before, "later_peak": later_peak - before, "resident": resident - before,
            "imports": imports}


def _memory(tag: str) -> dict[str, dict] | str:
    """Both sides' figures for ``tag``, or why they could not be measured."""
    if not os.path.exists("/proc/self/clear_refs"):
        return "no /proc/self/clear_refs (Linux only)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    figures = {}
    for side in ("eager", "bridge"):
        child = subprocess.run([sys.executable, "-m", "benchmarks.group_torch_models", "--memory", tag, side],
                               cwd=root, capture_output=True, text=True, timeout=600)
        if child.returncode:
            return f"the {side} child failed: {child.stderr.strip().splitlines()[-1:]}"
        figures[side] = json.loads(child.stdout.strip().splitlines()[-1])
    return figures


def _memory_note(title: str, figures: dict[str, dict] | str) -> str:
    if isinstance(figures, str):
        return f"{title}: memory not measured ({figures})"
    eager, bridge = figures["eager"], figures["bridge"]
    parts = []
    for key, what in (("first_peak", "first-call peak"), ("later_peak", "peak of the next 4 steps"),
                      ("resident", "resident after them")):
        ratio = bridge[key] / eager[key] if eager[key] > 0.5 else float("nan")
        parts.append(f"{what} {bridge[key]:.0f} vs {eager[key]:.0f} MiB ({ratio:.2f}x)")
    return (f"{title}: memory, ORTModule vs eager: " + "; ".join(parts)
            + f" (before these, importing torch.onnx's exporter, onnxscript and ortagent.torch: {bridge['imports']:.0f} MiB)")


class _FirstCall:
    """Thread CPU seconds spent in the export, the graph build and the session creation of the
    calls made while it is active."""

    def __init__(self) -> None:
        self.spans: dict[str, float] = {}

    def __enter__(self):
        from ortagent import agent
        from ortagent.torch import _bridge, _module

        self._patched = []
        targets = [(_module, "discover", "export"), (_module, "export", "export"),
                   (_bridge.GraphRunner, "_training_graph", "graph build"), (agent, "TrainingAgent", "sessions")]
        targets += self._export_parts()
        for owner, attr, key in targets:
            original = getattr(owner, attr)
            raw = vars(owner).get(attr, original) if isinstance(owner, type) else original
            self._patched.append((owner, attr, raw))
            timed = self._timed(original, key)
            setattr(owner, attr, staticmethod(timed) if isinstance(raw, classmethod) else timed)
        return self

    @staticmethod
    def _export_parts():
        """The export's parts, timed inside it (their spans are part of "export"): ortagent's
        discovery run, torch.export's trace, and torch.onnx's steps on the traced program (its
        decompositions, which trace the program once more; its type promotion; the table of
        translations, built once per process (ortagent.torch._registry: onnxscript's torchlib
        imported, signatures left for first use); the translation; onnxscript's optimizer).
        Private torch.onnx names: a part that moved is left out rather than failing the group."""
        import torch
        from ortagent.torch import _export

        parts = [(_export, "discover", "export: discovery"), (torch.export, "export", "export: torch.export"),
                 (torch.export.ExportedProgram, "run_decompositions", "export: decompositions"),
                 (_export, "translation_registry", "export: table of translations")]
        try:
            from torch.onnx._internal.exporter import _core, _fx_passes, _onnx_program
        except ImportError:
            return parts
        for owner, attr, key in ((_fx_passes, "insert_type_promotion_nodes", "export: type promotion"),
                                 (_core, "_exported_program_to_onnx_program", "export: translation"),
                                 (_onnx_program.ONNXProgram, "optimize", "export: onnxscript optimizer")):
            if hasattr(owner, attr):
                parts.append((owner, attr, key))
        return parts

    def _timed(self, original, key):
        def timed(*args, **kwargs):
            started = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.spans[key] = self.spans.get(key, 0.0) + time.thread_time() - started
        return timed

    def __exit__(self, *exc):
        for owner, attr, original in self._patched:
            setattr(owner, attr, original)


def run(settings) -> Group:
    started = time.perf_counter()
    rounds = settings.rounds.get("torch_models", ROUNDS_QUICK if settings.quick else ROUNDS_FULL)
    threads = int(settings.extra.get("torch_threads", 1))
    dynamic = settings.extra.get("torch_dynamic")
    wanted = settings.extra.get("torch_models")
    # a thread's CPU time misses the other threads' work: several threads are timed by the wall
    clock = settings.clock if threads == 1 else "wall"
    group = Group("torch_models", f"7. torch model families: ORTModule vs torch eager (ms), {threads} "
                  f"thread{'s' if threads > 1 else ''} each" + (", symbolic shapes from the first call" if dynamic else ""),
                  rounds=rounds, burst_s=settings.burst_s, clock=clock)
    try:
        import onnxscript  # noqa: F401
        import torch
        import torchvision  # noqa: F401
        if not settings.quick:
            import transformers  # noqa: F401
    except ImportError as exc:
        group.skipped = f"{exc.name} is not installed (make bench TORCH=1 installs the torch extras)"
        return group
    from ortagent.torch import ORTModule, default_session_options

    torch.set_num_threads(threads)
    # (ORTModule's default options at this many threads: onnxruntime's threads spin during a run
    # only, torch's OpenMP workers let go before it; see README, "ORTModule")
    options = default_session_options(threads)
    if torch.cuda.is_available():
        group.notes.append("a CUDA device exists; this group times the CPU only (CUDA runs are not part of it yet)")
    models = _models(torch, settings.quick)
    unknown = sorted(set(wanted or ()) - {case[0] for case in models})
    if unknown:
        group.skipped = f"--torch-models names {unknown}, not models of this run: {[case[0] for case in models]}"
        return group
    blocks, labels = [], {}
    for tag, title, make, args, kwargs, loss_of in models:
        if wanted and tag not in wanted:
            continue
        torch.manual_seed(0)
        eager = make().train()
        bridged = ORTModule(copy.deepcopy(eager), session_options=options, dynamic=dynamic)

        def forward(model, args=args, kwargs=kwargs, loss_of=loss_of):
            model.zero_grad(set_to_none=True)
            return loss_of(model(*args, **kwargs))

        def step(model, forward=forward):
            forward(model).backward()

        wall = time.perf_counter()
        torch.manual_seed(1)                # the same dropout masks on both sides
        with _FirstCall() as first:
            step(bridged)
        wall = time.perf_counter() - wall
        torch.manual_seed(1)
        step(eager)
        worst = 0.0
        for pe, pb in zip(eager.parameters(), bridged.module.parameters()):
            if pe.grad is None:
                continue
            scale = max(pe.grad.abs().max().item(), 1e-2)
            worst = max(worst, (pe.grad - pb.grad).abs().max().item() / scale)
        if worst > 1e-3:
            raise AssertionError(f"{tag}: the bridge's gradients differ from eager's ({worst:.2g} relative)")
        parts = ", ".join(f"{key[len('export: '):]} {seconds:.2f} s" for key, seconds in first.spans.items()
                          if key.startswith("export: "))
        split = ", ".join(f"{key} {seconds:.2f} s" + (f" ({parts})" if key == "export" and parts else "")
                          for key, seconds in first.spans.items() if not key.startswith("export: "))
        group.notes.append(f"{title}: first call {wall:.2f} s wall ({split}, thread CPU); largest gradient "
                           f"difference to eager {worst:.1e}")
        if threads == 1:                    # (resident sizes do not depend on the threads)
            group.notes.append(_memory_note(title, _memory(tag)))
        labels[tag] = title
        blocks.append([PyCalls(f"{tag}/eager", f"{title}: eager step", "torch", step, eager),
                       PyCalls(f"{tag}/bridge", f"{title}: ORTModule step", "ortagent", step, bridged),
                       PyCalls(f"{tag}/eager_fw", f"{title}: eager forward", "torch", forward, eager),
                       PyCalls(f"{tag}/bridge_fw", f"{title}: ORTModule forward", "ortagent", forward, bridged)])
    samples = run_rounds(blocks, rounds, settings.burst_s, desc="7 torch models", seed=settings.seed,
                         clock=clock)
    for tag, title in labels.items():
        for kind, what in (("", "step"), ("_fw", "forward")):
            group.rows.append(Row(f"{tag}/eager{kind}", f"{title}: eager {what}", "torch",
                                  samples[f"{tag}/eager{kind}"], unit="ms", other=samples.other[f"{tag}/eager{kind}"]))
            group.rows.append(Row(f"{tag}/bridge{kind}", f"{title}: ORTModule {what}", "ortagent",
                                  samples[f"{tag}/bridge{kind}"], ref=f"{tag}/eager{kind}", ref_name="torch eager",
                                  unit="ms", other=samples.other[f"{tag}/bridge{kind}"]))
        backward = {side: [s - f for s, f in zip(samples[f"{tag}/{side}"], samples[f"{tag}/{side}_fw"])]
                    for side in ("eager", "bridge")}
        group.rows.append(Row(f"{tag}/eager_bw", f"{title}: eager backward (step - forward)", "torch",
                              backward["eager"], unit="ms"))
        group.rows.append(Row(f"{tag}/bridge_bw", f"{title}: ORTModule backward (step - forward)", "ortagent",
                              backward["bridge"], ref=f"{tag}/eager_bw", ref_name="torch eager", unit="ms"))
    _targets(group, labels, threads)
    group.seconds = time.perf_counter() - started
    return group


def _targets(group: Group, labels: dict[str, str], threads: int) -> None:
    """Issue 24's targets: each model's step <= 1.0x eager's, and the median of the models'
    step ratios <= 0.85x (each ratio the median of its per-round ratios)."""
    suffix = "" if threads == 1 else f"_{threads}threads"
    where = "" if threads == 1 else f", {threads} threads each"
    medians = []
    for tag, title in labels.items():
        target = group.ratio_target(f"torch_{tag}{suffix}", f"ORTModule {title} step <= 1.0x eager's{where}",
                                    f"{tag}/bridge", f"{tag}/eager", 1.0)
        if target.value is not None:
            medians.append(target.value)
    if len(medians) > 1:
        group.targets.append(Target(f"torch_models_median{suffix}",
                                    f"ORTModule step, median over the {len(medians)} models, <= 0.85x eager's{where}",
                                    statistics.median(medians), 0.85, "<=", "x",
                                    detail=f"best {min(medians):.2f}x, worst {max(medians):.2f}x"))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--memory":
        print(json.dumps(_memory_child(sys.argv[2], sys.argv[3])))
    else:
        sys.exit("usage: python -m benchmarks.group_torch_models --memory TAG eager|bridge")
