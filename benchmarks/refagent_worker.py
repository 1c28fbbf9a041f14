"""Time onnxruntime-training 1.19.2's own TrainingAgent, in bursts, for benchmarks/group_agent.py.

Runs *inside* the onnxruntime-training 1.19.2 environment (``.venv-refagent``: numpy<2, no
onnx needed); the benchmark driver starts it and talks to it over pipes::

    python refagent_worker.py DIR

``DIR`` holds ``model.onnx`` (a training graph with a com.microsoft:YieldOp), ``feeds.npz``
(one array per graph input, graph order, keys arr_0, arr_1, ...), ``grads.npz`` (one array per
YieldOp output) and ``meta.json`` (``fw_feed_names``, ``fw_fetch_count``, ``bw_fetch_names``).

The session gets the benchmarks' options (1 intra-op and 1 inter-op thread, sequential, all
optimisations) and the CPU provider; the agent is built as ORTModule builds it (the pybind
``TrainingAgent`` over the session, CPU devices for every fetch). The feeds and gradients become
``OrtValueVector`` s once. One step is what a training step costs the agent::

    state = PartialGraphExecutionState(); fetches = OrtValueVector()
    agent.run_forward(feeds, fetches, state, None)
    grads_out = OrtValueVector(); agent.run_backward(grads, grads_out, state)

Protocol: one JSON line ``{"ready": true, ...}`` once set up, then for each stdin line
``step N`` one JSON line ``{"ns": T, "cpu_ns": C}`` (T = elapsed ns of N steps, C = CPU time
of this thread in them), until ``quit`` or EOF.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from itertools import repeat

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as C


def _ordered(path: str) -> list:
    with np.load(path) as archive:
        keys = sorted(archive.files, key=lambda key: int(key.split("_")[-1]))
        return [np.ascontiguousarray(archive[key]) for key in keys]


def _cpu():
    return C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)


def _vector(arrays) -> "C.OrtValueVector":
    vector = C.OrtValueVector()
    for array in arrays:
        vector.push_back(C.OrtValue.ortvalue_from_numpy(array, _cpu()))
    return vector


def main(argv) -> int:
    directory = argv[1]
    with open(os.path.join(directory, "meta.json")) as handle:
        meta = json.load(handle)
    with open(os.path.join(directory, "model.onnx"), "rb") as handle:
        model_bytes = handle.read()
    feeds = _ordered(os.path.join(directory, "feeds.npz"))
    grads = _ordered(os.path.join(directory, "grads.npz"))

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    agent = C.TrainingAgent(session._sess, list(meta["fw_feed_names"]),
                            [_cpu()] * meta["fw_fetch_count"], list(meta["bw_fetch_names"]),
                            [_cpu()] * len(meta["bw_fetch_names"]), 0)
    feed_vector = _vector(feeds)
    grad_vector = _vector(grads)
    keep = (feeds, grads)

    State, Vector = C.PartialGraphExecutionState, C.OrtValueVector
    run_forward, run_backward = agent.run_forward, agent.run_backward

    def step():
        state = State()
        fetches = Vector()
        run_forward(feed_vector, fetches, state, None)
        outputs = Vector()
        run_backward(grad_vector, outputs, state)
        return outputs

    # one checked step: the driver compares these with ortagent's
    outputs = step()
    checksums = [float(np.asarray(outputs[i].numpy(), dtype=np.float64).sum())
                 for i in range(len(outputs))]
    gc.collect()
    gc.freeze()
    perf_ns, cpu_ns = time.perf_counter_ns, time.thread_time_ns
    print(json.dumps({"ready": True, "onnxruntime": ort.__version__, "checksums": checksums}),
          flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if len(words) != 2 or words[0] != "step" or not words[1].isdigit() or int(words[1]) < 1:
            print(json.dumps({"error": f"expected 'step N', got {line.strip()!r}"}), flush=True)
            continue
        n = int(words[1])
        cpu = cpu_ns()
        start = perf_ns()
        for _ in repeat(None, n):
            step()
        elapsed = perf_ns() - start
        cpu = cpu_ns() - cpu
        print(json.dumps({"ns": elapsed, "cpu_ns": cpu}), flush=True)
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
