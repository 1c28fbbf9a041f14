"""The short summary of a benchmark run: a few rows of its tables as ratios against onnxruntime's
Python API and against the C floor.

    python -m benchmarks.summary [build/bench/latest.json | -]

Reads the ``latest.json`` that ``python -m benchmarks.bench`` (``make bench``) writes and prints a
dated Markdown table (the one benchmarks/README.md carries). Every figure is a median over the
run's rounds; a ratio is the median of the per-round ratios (both contenders timed in the same
round), so it need not equal the ratio of the two medians. bench.py writes the same table to
``summary.md`` next to ``latest.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from . import _common

# (what, group, ortagent's row, the comparison row, the C floor's row); the comparison is
# onnxruntime's Python API, or onnxruntime-training 1.19.2's agent for the training steps
ROWS = (
    ("`run`, Identity float32[1]", "calls", "identity/oa-run", "identity/ort-run", "identity/c-run"),
    ("IoBinding run, Identity (floor: C `RunWithBinding`)", "calls", "identity/oa-iobinding",
     "identity/ort-iobinding", "identity/c-binding"),
    ("`run`, per extra input+output pair", "calls", "pair/oa-run", "pair/ort-run", "pair/c-run"),
    ("`run`, MLP 3x256 batch 32", "calls", "mlp/oa-run", "mlp/ort-run", "mlp/c-run"),
    ("`run`, 64 MiB output", "calls", "large/oa-run", "large/ort-run", "large/c-run"),
    ("serving loop: a new feed dict and array each `run` (Identity)", "calls", "serving/oa-run",
     "serving/ort-run", "identity/c-run"),
    ("`OrtValue.ortvalue_from_numpy`, 4 B", "values", "4 B/oa-from-numpy", "4 B/ort-from-numpy", None),
    ("DLPack export, 4 B", "values", "4 B/oa-dlpack-export", "4 B/ort-dlpack-export", None),
    ("TrainingAgent step, x*w+bias (vs the 1.19.2 agent; floor: C `Run` of each half)", "agent",
     "tiny/oa-state", "tiny/ref", "tiny/c-halves"),
    ("TrainingAgent step, MLP 784-512-10 batch 64 (vs the 1.19.2 agent)", "agent", "mlp/oa-state",
     "mlp/ref", "mlp/c-halves"),
    ("`import ortagent` (ms; vs `import onnxruntime`)", "startup", "ortagent", "onnxruntime", None),
)


def _samples(group: dict, key: str | None) -> tuple[list[float], str] | None:
    for row in group["rows"] if key else ():
        if row["key"] == key:
            unit = row["unit"]
            return row[f"samples_{unit}"], unit
    return None


def _ratio(a: list[float] | None, b: list[float] | None) -> float | None:
    """The median of the per-round ratios a/b (rows of one block share their rounds)."""
    if not a or not b or len(a) != len(b):
        return None
    return statistics.median(x / y for x, y in zip(a, b) if y)


def _time(value: float, unit: str) -> str:
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:,.{digits}f}" + (" ms" if unit == "ms" else "")


def summary_rows(result: dict) -> list[list[str]]:
    groups = {group["name"]: group for group in result["groups"]}
    rows = []
    for what, group_name, ours, theirs, floor in ROWS:
        group = groups.get(group_name)
        found = [_samples(group, key) if group else None for key in (ours, theirs, floor)]
        if found[0] is None:
            continue
        unit = found[0][1]
        columns = [what]
        for item in found:
            columns.append(_time(statistics.median(item[0]), unit) if item else "")
        for other in found[1:]:
            ratio = _ratio(found[0][0], other[0]) if other else None
            columns.append(f"{ratio:.2f}x" if ratio is not None else "")
        rows.append(columns)
    return rows


def markdown(result: dict) -> str:
    machine = result.get("machine", {})
    head = (f"Run {result.get('created', '?')}{' (--quick)' if result.get('quick') else ''}: "
            f"{machine.get('cpu_model', '?')}, {machine.get('cpus_usable', '?')} usable CPUs, Python "
            f"{machine.get('python', '?')}, onnxruntime {machine.get('onnxruntime_python', '?')}, commit "
            f"{machine.get('commit', '?')}{' (with uncommitted changes)' if machine.get('uncommitted') else ''}; "
            f"{result.get('settings', {}).get('clock', 'cpu')} clock for the single-threaded groups. "
            "Times in µs unless marked, medians over rounds; ratios are medians of per-round ratios.")
    lines = [head, "",
             "| call | ortagent | onnxruntime | C floor | ortagent / onnxruntime | ortagent / C floor |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += ["| " + " | ".join(columns) + " |" for columns in summary_rows(result)]
    counts = result.get("summary")
    if counts:
        lines += ["", f"Targets: {counts.get('PASS', 0)} PASS, {counts.get('MISS', 0)} MISS, "
                      f"{counts.get('n/a', 0)} n/a (every target and its figures: latest.md)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", nargs="?", type=Path, default=_common.RESULTS_DIR / "latest.json",
                        help="a latest.json of python -m benchmarks.bench (default build/bench/latest.json; "
                             "- reads standard input)")
    args = parser.parse_args(argv)
    if str(args.result) == "-":
        text = sys.stdin.read()
    elif args.result.is_file():
        text = args.result.read_text()
    else:
        parser.error(f"{args.result} does not exist: run `make bench` (or python -m benchmarks.bench) first")
    print(markdown(json.loads(text)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
