"""Run every probe of ``probe_agent_1192.py`` in its own subprocess and report how each ended.

Runs with any Python (it only starts subprocesses)::

    python ortagent_testkit/reference_agent/run_probes.py [--json OUT.json] [PROBE ...]

The reference environment is the one ``client.reference_python()`` finds. For each probe it
prints the exit status (or the signal that killed it), the last step reached and the probe's
result line; ``FINDINGS.md`` summarizes a run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from client import describe_returncode, reference_python  # noqa: E402

PROBE_SCRIPT = os.path.join(HERE, "probe_agent_1192.py")


def run_probe(python: str, name: str, timeout: float = 120.0) -> dict:
    try:
        completed = subprocess.run([python, PROBE_SCRIPT, name], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"probe": name, "ended": f"timed out after {timeout:.0f} s (hang)", "returncode": None}
    steps = [line[len("step: "):] for line in completed.stdout.splitlines() if line.startswith("step: ")]
    results = [line[len("RESULT: "):] for line in completed.stdout.splitlines() if line.startswith("RESULT: ")]
    stderr_lines = [line for line in completed.stderr.splitlines() if line.strip()]
    return {
        "probe": name,
        "ended": describe_returncode(completed.returncode),
        "returncode": completed.returncode,
        "last_step": steps[-1] if steps else None,
        "result": json.loads(results[0]) if results else None,
        "stderr_tail": stderr_lines[-3:],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probes", nargs="*")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args(argv)
    python = reference_python()
    if python is None:
        print("no onnxruntime-training 1.19.2 Python (see client.py)", file=sys.stderr)
        return 2
    names = args.probes or subprocess.run([python, PROBE_SCRIPT, "--list"], capture_output=True, text=True,
                                          check=True).stdout.split()
    records = []
    for name in names:
        record = run_probe(python, name)
        records.append(record)
        print(f"== {name}: {record['ended']}; last step: {record.get('last_step')}")
        if record.get("result") is not None:
            print(f"   result: {json.dumps(record['result'])[:600]}")
        if record.get("returncode") not in (0, None) and record.get("stderr_tail"):
            print(f"   stderr: {' | '.join(record['stderr_tail'])[:600]}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(records, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
