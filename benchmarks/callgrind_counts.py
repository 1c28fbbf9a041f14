"""Instruction counts per call, with valgrind's callgrind: the stable evidence next to the timed
benchmarks (on a shared, noisy machine a time moves by 2x between runs, an instruction count
by a few instructions).

    .venv/bin/python -m benchmarks.callgrind_counts              # every case
    .venv/bin/python -m benchmarks.callgrind_counts --cases run,agent-tiny --calls 4000

(from the repository root: ``benchmarks`` is a package, and ortagent_testkit sits next to it).

Each case runs in a child process under ``valgrind --tool=callgrind`` (PYTHONHASHSEED=0), which
warms up with a plain loop and then makes ``--calls`` calls as
``collections.deque(itertools.starmap(step, repeat((), N)), maxlen=0)``. Two counts per case:

* ``loop``: collection toggled on CPython's ``deque_extend``, i.e. only the measured loop: the
  whole call as Python code sees it (argument building, the call, the results), plus the ~80
  instructions per item of starmap/deque themselves;
* ``symbol``: collection toggled on one function (``--toggle-collect``), e.g. the Cython wrapper
  of ``InferenceSession.run`` (what was measured before) or ``run_nogil`` (OrtApi::Run plus
  the GIL release and re-acquisition: the part that is onnxruntime's). The warm-up calls go
  through that function too, so its count is divided by warm-up + calls.

Numbers are instructions per call (Ir). Nothing here is timed.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import _common  # isort: skip  (first: it sets OPENBLAS_NUM_THREADS before NumPy loads)
from .c_floor import build as c_floor

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WARMUP = 50

# case -> (what it measures, [(label, toggle symbol or None for the loop)])
CASES = {
    "run": ("ortagent InferenceSession.run(None, {'x': f32[1]}) on Identity", [
        ("loop", None),
        ("symbol: InferenceSession.run wrapper", "__pyx_pw_8ortagent_5_core_16InferenceSession_*run"),
    ]),
    "iobinding": ("ortagent InferenceSession.run_with_iobinding on Identity f32[1] (input bound once, "
                  "output bound to the CPU)", [("loop", None)]),
    "ort-run": ("onnxruntime InferenceSession.run(None, {'x': f32[1]}) on Identity", [("loop", None)]),
    "agent-tiny": ("ortagent TrainingAgent step, state API, x*w+bias f32 (forward + backward)", [
        ("loop", None),
        ("symbol: _AgentEngine.forward_run", "__pyx_f_8ortagent_5_core_12_AgentEngine_forward_run"),
        ("symbol: _AgentEngine.backward_run", "__pyx_f_8ortagent_5_core_12_AgentEngine_backward_run"),
    ]),
    "c-run": ("the C floor: OrtApi::Run on Identity f32[1] (benchmarks/c_floor, mode run)",
              [("symbol: time_calls (the timed loop)", "time_calls")]),
    "c-run-prealloc": ("the C floor: OrtApi::Run into preallocated outputs (mode run-prealloc)",
                       [("symbol: time_calls (the timed loop)", "time_calls")]),
    "ref-agent-tiny": ("onnxruntime-training 1.19.2's TrainingAgent step, x*w+bias f32 (.venv-refagent, "
                       "refagent_worker.py)", [("difference of two runs of 1x and 3x --calls steps", "diff")]),
    "serving": ("ortagent run on Identity f32[1] with a fresh NumPy feed each call", [("loop", None)]),
}


# ---- the child: builds one case and runs it --------------------------------------------------------

def _identity_bytes() -> bytes:
    from ortagent_testkit import bench_models as models

    return models.identity().SerializeToString()


def _step(case: str):
    import numpy as np
    if case in ("run", "serving"):
        import ortagent
        session = ortagent.InferenceSession(_identity_bytes(), _common.ortagent_options())
        if case == "run":
            feed = {"x": np.ones(1, np.float32)}
            return lambda run=session.run: run(None, feed)
        ones = np.ones
        return lambda run=session.run: run(None, {"x": ones(1, np.float32)})
    if case == "iobinding":
        import ortagent
        session = ortagent.InferenceSession(_identity_bytes(), _common.ortagent_options())
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", ortagent.OrtValue.ortvalue_from_numpy(np.ones(1, np.float32)))
        binding.bind_output("y", "cpu")
        return lambda run=session.run_with_iobinding: run(binding)
    if case == "ort-run":
        import onnxruntime
        session = onnxruntime.InferenceSession(_identity_bytes(), _common.onnxruntime_options(),
                                               providers=["CPUExecutionProvider"])
        feed = {"x": np.ones(1, np.float32)}
        return lambda run=session.run: run(None, feed)
    if case == "agent-tiny":
        from ortagent_testkit import training_graphs
        from ortagent import OrtDevice, OrtValue, PartialGraphExecutionState, TrainingAgent
        tc = training_graphs.mul_add_case(np.float32)
        rng = np.random.default_rng(0)
        feeds = tc.make_feeds(rng)
        values = [OrtValue.ortvalue_from_numpy(feeds[n]) for n in tc.input_names]
        grads = [OrtValue.ortvalue_from_numpy(np.ones((2, 3), np.float32))]
        cpu = OrtDevice.cpu()
        agent = TrainingAgent(tc.model.SerializeToString(), fw_feed_names=tc.input_names,
                              fw_outputs_device_info=[OrtDevice(cpu, 0, 0)],
                              bw_fetches_names=tc.graph_output_names,
                              bw_outputs_device_info=[OrtDevice(cpu, 0, 0)] * 3,
                              session_options=_common.ortagent_options())

        def step(agent=agent, State=PartialGraphExecutionState):
            state = State()
            fetches: list = []
            agent.run_forward(values, fetches, state)
            outputs: list = []
            agent.run_backward(grads, outputs, state)
            return outputs
        return step
    raise SystemExit(f"unknown case {case!r}")


def child(case: str, calls: int) -> None:
    step = _step(case)
    for _ in range(WARMUP):
        step()
    collections.deque(itertools.starmap(step, itertools.repeat((), calls)), maxlen=0)


# ---- the parent -----------------------------------------------------------------------------------

def _c_floor_command(case: str, calls: int, tmp: str) -> list[str]:
    """ort_floor timing `calls` calls once (no warm-up: its count is exactly the calls')."""
    model = Path(tmp) / "identity.onnx"
    model.write_bytes(_identity_bytes())
    return [str(c_floor.build()), str(model), "--lib", str(c_floor.default_library()), "--threads", "1",
            "--inter-threads", "1", "--opt-level", "all", "--modes", case[2:], "--iterations",
            str(calls), "--repeat", "1", "--warmup", "0"]


def _ref_agent_count(calls: int) -> tuple[float, dict]:
    """The 1.19.2 agent's step: its worker loops in Python with no C function of its own to
    toggle on, so count whole runs of `calls` and 3 x `calls` steps and divide the difference."""
    import json

    import numpy as np

    from ortagent_testkit import training_graphs
    from ortagent_testkit.reference_agent.client import reference_python
    python = reference_python()
    if python is None:
        raise SystemExit("ref-agent-tiny: no .venv-refagent (make refagent)")
    case = training_graphs.mul_add_case(np.float32)
    feeds = case.make_feeds(np.random.default_rng(0))
    totals, objects = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "model.onnx").write_bytes(case.model.SerializeToString())
        np.savez(folder / "feeds.npz", *[feeds[n] for n in case.input_names])
        np.savez(folder / "grads.npz", np.ones((2, 3), np.float32))
        (folder / "meta.json").write_text(json.dumps({
            "fw_feed_names": case.input_names, "fw_fetch_count": 1,
            "bw_fetch_names": case.graph_output_names}))
        for n in (calls, 3 * calls):
            out = folder / f"callgrind.{n}.out"
            done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python,
                                   str(HERE / "refagent_worker.py"), str(folder)],
                                  input=f"step {WARMUP}\nstep {n}\nquit\n", capture_output=True, text=True,
                                  env=dict(os.environ, PYTHONHASHSEED="0"), cwd=ROOT)
            if done.returncode != 0:
                raise SystemExit(f"ref-agent-tiny: valgrind failed:\n{done.stderr[-3000:]}")
            totals.append(int(re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M).group(1)))
            objects.append(_by_object(out))
    per_object = {name: (objects[1].get(name, 0) - objects[0].get(name, 0)) / (2 * calls)
                  for name in set(objects[0]) | set(objects[1])}
    return (totals[1] - totals[0]) / (2 * calls), per_object


def _count(case: str, symbol: str | None, calls: int) -> float:
    if case == "ref-agent-tiny":
        return _ref_agent_count(calls)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        if case.startswith("c-"):
            target = _c_floor_command(case, calls, tmp)
        else:
            target = [sys.executable, "-m", "benchmarks.callgrind_counts", "--child", case, str(calls)]
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
                   f"--toggle-collect={symbol or 'deque_extend'}", *target]
        env = dict(os.environ, PYTHONHASHSEED="0",
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{case}: valgrind failed ({done.returncode}):\n{done.stderr[-3000:]}")
        text = out.read_text()
        match = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        total = int(match.group(1)) if match else 0
        per_object = _by_object(out)
    divisor = calls if symbol is None or case.startswith("c-") else calls + WARMUP
    return total / divisor, {name: count / divisor for name, count in per_object.items()}


def _by_object(out: Path) -> dict[str, int]:
    """Exclusive instructions per ELF object (libonnxruntime, libpython, our extensions, libc,
    ...), from callgrind_annotate."""
    done = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", str(out)],
                          capture_output=True, text=True)
    counts: dict[str, int] = collections.Counter()
    current = "?"
    for line in done.stdout.splitlines():
        # "  1,234 (5.00%)  file:function [object]"; the object is left out when it is the
        # previous line's
        match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(\S.*?)(?:\s+\[(.+)\])?\s*$", line)
        if match and "PROGRAM TOTALS" not in line:
            if match.group(3):
                current = _object_name(match.group(3))
            counts[current] += int(match.group(1).replace(",", ""))
    return dict(counts)


def _object_name(path: str) -> str:
    name = Path(path).name
    for prefix, short in (("libonnxruntime", "libonnxruntime (ORT's C library)"),
                          ("onnxruntime_pybind11_state", "onnxruntime_pybind11_state (ORT + pybind)"),
                          ("libpython", "libpython"), ("libc.so", "libc"), ("libstdc++", "libstdc++"),
                          ("_multiarray_umath", "numpy"), ("ld-linux", "ld.so")):
        if name.startswith(prefix):
            return short
    if name.startswith("_") and ".cpython-" in name:
        return "ortagent " + name.split(".")[0]
    return name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {list(CASES)}")
    parser.add_argument("--calls", type=int, default=3000, help="measured calls per case (default 3000)")
    parser.add_argument("--loop-only", action="store_true", help="only the loop count of each case")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    for case in args.cases.split(","):
        title, counts = CASES[case]
        print(f"{case}: {title}")
        for label, symbol in counts:
            if args.loop_only and symbol is not None:
                continue
            per_call, per_object = _count(case, symbol, args.calls)
            print(f"    {per_call:>10,.0f} Ir/call  {label}", flush=True)
            for name, count in sorted(per_object.items(), key=lambda item: -item[1]):
                if count >= 10:
                    print(f"        {count:>10,.0f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
