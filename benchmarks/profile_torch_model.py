"""Where a model family's training step spends its time, by operator: onnxruntime's profiler
(the ORTModule's two sessions, by ONNX operator type) against torch's profiler (eager, by aten
operator's self CPU time), one thread each, steps after a warm-up.

    python -m benchmarks.profile_torch_model mobilenet_v3 [--steps 10] [--top 15]

The models are group 7's (:mod:`benchmarks.group_torch_models`). onnxruntime's profile is read
from the JSON files its sessions write when they close (``kernel_time`` events of category
``Node``, which carry the operator type in ``args.op_name``); the runs of the warm-up are left
out by their ``model_run`` spans. The two profilers measure differently (torch's counts its
dispatcher's time into each op, onnxruntime's counts the kernel alone, and both add a cost of
their own to every op they record, which weighs most on graphs of many small nodes): compare
shares, orders of magnitude and the counts (aten calls against onnxruntime nodes run per
step), not single milliseconds.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tempfile

from . import _common
from .group_torch_models import model_case

WARMUP = 3


def _stepper(model, args, kwargs, loss_of):
    def step():
        model.zero_grad(set_to_none=True)
        loss_of(model(*args, **kwargs)).backward()
    return step


def eager_profile(torch, make, args, kwargs, loss_of, steps: int) -> dict[str, tuple[float, float]]:
    """aten operator -> (self CPU milliseconds, calls) per step."""
    torch.manual_seed(0)
    step = _stepper(make().train(), args, kwargs, loss_of)
    for _ in range(WARMUP):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(steps):
            step()
    return {event.key: (event.self_cpu_time_total / 1e3 / steps, event.count / steps)
            for event in profile.key_averages()}


def _session_profile(path: str, steps: int) -> tuple[collections.Counter, collections.Counter]:
    """(ONNX operator type -> kernel microseconds, operator type -> nodes) of one session's
    last ``steps`` runs (the first call also runs each session once to check the graph)."""
    with open(path) as handle:
        events = json.load(handle)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(runs) < steps + WARMUP:
        raise SystemExit(f"{path}: {len(runs)} runs, expected at least {steps + WARMUP}")
    start = runs[-steps][0]
    spent: collections.Counter = collections.Counter()
    nodes: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time") and event["ts"] >= start:
            op = event.get("args", {}).get("op_name", "?")
            spent[op] += event["dur"]
            nodes[event["name"]] = op
    return spent, collections.Counter(nodes.values())


def bridge_profile(torch, make, args, kwargs, loss_of, steps: int) -> tuple[dict[str, tuple[float, float]], int]:
    """ONNX operator type -> (kernel milliseconds, nodes run) per step over both sessions; the
    number of profile files read."""
    from ortagent.torch import ORTModule

    with tempfile.TemporaryDirectory() as folder:
        options = _common.ortagent_options()
        options.profile_file_prefix = os.path.join(folder, "ortmodule")
        options.enable_profiling = True
        torch.manual_seed(0)
        model = ORTModule(make().train(), session_options=options)
        step = _stepper(model, args, kwargs, loss_of)
        for _ in range(WARMUP + steps):
            step()
        del model, step
        import gc

        gc.collect()
        files = glob.glob(os.path.join(folder, "ortmodule*.json"))
        total: collections.Counter = collections.Counter()
        nodes: collections.Counter = collections.Counter()
        for path in files:
            spent, counted = _session_profile(path, steps)
            total.update(spent)
            nodes.update(counted)
    return {op: (us / 1e3 / steps, nodes[op]) for op, us in total.items()}, len(files)


def _table(title: str, spent: dict[str, tuple[float, float]], top: int, counted: str) -> list[str]:
    whole = sum(ms for ms, _ in spent.values())
    count = sum(n for _, n in spent.values())
    lines = [f"{title}: {whole:.1f} ms and {count:.0f} {counted} per step",
             f"  {'operator':<44} {'ms/step':>8} {'share':>6} {counted:>6}"]
    for op, (ms, n) in sorted(spent.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"  {op[:44]:<44} {ms:8.2f} {ms / whole:6.1%} {n:6.0f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", help="resnet18, mobilenet_v3 or gpt2")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    options = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    title, make, args, kwargs, loss_of = model_case(torch, options.tag)
    eager = eager_profile(torch, make, args, kwargs, loss_of, options.steps)
    bridge, files = bridge_profile(torch, make, args, kwargs, loss_of, options.steps)
    if files != 2:
        raise SystemExit(f"expected the profiles of the agent's two sessions, found {files}")
    print(f"{title}, {options.steps} steps after {WARMUP} warm-up steps, one thread each")
    print("\n".join(_table("torch eager (torch.profiler, self CPU by aten op)", eager, options.top, "calls")))
    print("\n".join(_table("ORTModule (onnxruntime profiler, kernel time by ONNX op, both sessions)", bridge,
                           options.top, "nodes")))


if __name__ == "__main__":
    main()
