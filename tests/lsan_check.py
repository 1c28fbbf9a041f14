"""LeakSanitizer over ortagent workloads (run by ``make asan`` with the ASan build on PYTHONPATH).

A Python process is full of memory LeakSanitizer cannot tell from a leak at exit (the interpreter
does not free everything), so the check is targeted: the workload (sessions, runs, IOBinding,
DLPack both ways, strings, TrainingAgent runs resumed, released and abandoned at close, errors)
runs ``rounds`` times, everything is dropped, and ``__lsan_do_recoverable_leak_check`` reports
the unreachable blocks at that point. The check is run with 1 and with 5 rounds: it fails if a
report names ortagent or onnxruntime in an allocation stack, or if the leaked bytes grow with
the number of rounds.

``python lsan_check.py``: run both checks in subprocesses (LD_PRELOAD of gcc's libasan and
libstdc++, detect_leaks=1) and print the verdict. ``python lsan_check.py --rounds N``: the
workload itself (inside such a process).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def workload() -> None:
    import numpy as np

    import ortagent
    from ortagent import OrtValue
    from ortagent_testkit import onnx_models as models
    from ortagent_testkit import training_graphs as tg

    session = ortagent.InferenceSession(models.mlp())
    x = np.ones((2, 16), np.float32)
    for _ in range(50):
        session.run(None, {"x": x})
        session.run_with_ort_values(None, {"x": OrtValue.ortvalue_from_numpy(x)})
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    session.run_with_iobinding(binding)
    binding.get_outputs_as_numpy()
    binding.bind_ortvalue_output("y", OrtValue.ortvalue_from_numpy(np.zeros((2, 8), np.float32)))
    binding.bind_cpu_input("x", x)
    session.run_with_iobinding(binding)
    binding.get_outputs()
    value = OrtValue.ortvalue_from_numpy(np.arange(6.0))
    np.from_dlpack(value)
    value.__dlpack__(max_version=(1, 0))          # never consumed
    ortagent.from_dlpack(np.arange(3))
    OrtValue.ortvalue_from_numpy(np.array(["a", "déjà"], dtype=object)).numpy()
    case = tg.mul_add_case()
    agent = ortagent.TrainingAgent(case.model.SerializeToString())
    feeds = case.make_feeds(np.random.default_rng(0))
    agent_binding = agent.io_binding()
    for name in ("x", "w", "bias"):
        agent_binding.bind_cpu_input(name, feeds[name])
    for _ in range(20):
        _, run_id = agent.run_forward(agent_binding, None)
        agent.run_backward([np.ones((2, 3))], run_id)
    _, released = agent.run_forward(agent_binding, None)
    agent.release_run(released)
    agent.run_forward(agent_binding, None)        # abandoned: freed by close()
    agent.close()
    for bad in ({"x": np.ones((2, 3), np.float32)}, {"x": np.ones((2, 16))}):
        try:
            session.run(None, bad)
        except ortagent.OrtError:
            pass


def run_rounds(rounds: int) -> None:
    sys.path.insert(0, ROOT)      # ortagent_testkit's model builders
    for _ in range(rounds):
        workload()
    gc.collect()
    print("LSAN-CHECK-BEGINS", file=sys.stderr, flush=True)
    ctypes.CDLL(None).__lsan_do_recoverable_leak_check()


def check(rounds: int) -> tuple[int, str]:
    preload = " ".join(subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True,
                                      check=True).stdout.strip() for name in ("libasan.so", "libstdc++.so"))
    env = dict(os.environ, LD_PRELOAD=preload, PYTHONMALLOC="malloc",
               ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1", LSAN_OPTIONS="exitcode=0")
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--rounds", str(rounds)],
                            capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode != 0 or "LSAN-CHECK-BEGINS" not in result.stderr:
        raise SystemExit(f"the workload failed ({result.returncode}):\n{result.stderr[-4000:]}")
    report = result.stderr.split("LSAN-CHECK-BEGINS", 1)[1]
    match = re.search(r"SUMMARY: AddressSanitizer: (\d+) byte\(s\) leaked", report)
    return (int(match.group(1)) if match else 0), report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args()
    if args.rounds is not None:
        run_rounds(args.rounds)
        return
    one, report_one = check(1)
    five, report_five = check(5)
    ours = [line for line in (report_one + report_five).splitlines()
            if re.search(r"ortagent|onnxruntime", line) and "#" in line]
    print(f"LeakSanitizer: {one} bytes unreachable after 1 round, {five} after 5 rounds; "
          f"{len(ours)} stack frames in ortagent or onnxruntime")
    if ours or five > one:
        print(report_five)
        raise SystemExit("LeakSanitizer found leaks that involve ortagent/onnxruntime or grow with the workload")


if __name__ == "__main__":
    main()
