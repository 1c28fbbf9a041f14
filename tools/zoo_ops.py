"""Which ops the real ORTModule training graphs of tests/ortmodule_zoo.py contain.

Usage: python tools/zoo_ops.py [--out /tmp/zoo_ops.md] [--run-reference] [ENTRY ...]

For each zoo entry: builds its training graph with onnxruntime-training 1.19.2's ORTModule graph
builder (``ortagent_testkit/reference_agent/client.py``; cached under .cache/ortmodule_graphs), lists the ops
it contains as ``domain:op``, marks those stock onnxruntime (the one installed here) has no schema
for, and says which ops the entry was written to draw out but did not get. With
``--run-reference`` it also runs each graph through the real 1.19.2 TrainingAgent (random feeds
and output gradients) and says whether that worked. Writes a Markdown table (``--out``) and
prints it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))     # ortmodule_zoo, the tests' ORTModule zoo
sys.path.insert(0, ROOT)                            # ortagent_testkit

import ortmodule_zoo as zoo  # noqa: E402
from ortagent_testkit.reference_agent.client import (  # noqa: E402
    ReferenceAgentError,
    build_ortmodule_training_graph,
    run_reference_agent,
)


def last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or "Exception" in line:
            return line[-200:].replace("|", "/")
    return lines[-1][-200:].replace("|", "/") if lines else "(no message: killed by a signal?)"


def reference_run(entry: zoo.ZooEntry, graph) -> str:
    rng = np.random.default_rng(0)
    feeds = entry.feeds_for(graph, rng)
    try:
        outputs, _ = run_reference_agent(graph, feeds, None)      # forward only: the output shapes
    except ReferenceAgentError as error:
        return "no: " + last_error_line(error.stderr)
    grads = zoo.output_gradients(graph, outputs, rng)
    try:
        run_reference_agent(graph, feeds, grads)
    except ReferenceAgentError as error:
        return "no: " + last_error_line(error.stderr)
    return "yes"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="*")
    parser.add_argument("--out", default="/tmp/zoo_ops.md")
    parser.add_argument("--run-reference", action="store_true")
    args = parser.parse_args(argv)

    entries = [zoo.entry(name) for name in args.entries] if args.entries else zoo.zoo()
    schemas = zoo.stock_schemas()
    rows = []
    union: set[str] = set()
    for entry in entries:
        started = time.perf_counter()
        try:
            graph, info = build_ortmodule_training_graph(entry.model, with_info=True, **entry.build_kwargs())
        except ReferenceAgentError as error:
            rows.append((entry.name, "build failed: " + last_error_line(error.stderr), "", "", "", ""))
            continue
        built = time.perf_counter() - started
        training = zoo.training_only_ops(graph, schemas)
        union.update(training)
        present = zoo.present_ops(graph)
        missing = [op for op in entry.wanted_ops if op not in present]
        others = [name for name in zoo.op_types(graph) if name not in training]
        notes = info.get("notes", {})
        shape_note = notes.get("symbolic_shape_infer", "")
        ran = reference_run(entry, graph) if args.run_reference else "not run"
        if ran.startswith("no") and entry.reference_broken:
            ran = "no: " + entry.reference_broken
        rows.append((entry.name, ", ".join(training) or "(none)", ", ".join(missing) or "-", ran,
                     ", ".join(others), f"{built:.1f}s" + ("" if shape_note in ("ok", "") else
                                                          f"; symbolic shape inference failed ({shape_note})")))

    lines = [
        "# Ops in the ORTModule (onnxruntime-training 1.19.2) training graphs of tests/ortmodule_zoo.py",
        "",
        "training-only: ops the stock onnxruntime here has no schema for (YieldOp aside)."
        if schemas is not None else "training-only: non-ONNX-domain ops (onnxruntime not importable here).",
        "",
        "| entry | training-only ops | wanted, not emitted | real agent runs it | other ops | build |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "All training-only ops drawn out: " + ", ".join(sorted(union))]
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as handle:
        handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
