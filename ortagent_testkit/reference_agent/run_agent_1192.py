"""Run a training graph through onnxruntime-training 1.19.2's own TrainingAgent (state API).

This script runs *inside* an onnxruntime-training 1.19.2 environment (numpy<2, onnx); the main
test process never imports it, it starts it in a subprocess (see ``client.py``)::

    python run_agent_1192.py DIR [--optimization-level disable|basic|extended|all]

``DIR`` holds ``model.onnx`` (a training graph with a com.microsoft:YieldOp), ``feeds.npz``
(one array per graph input, in graph-input order, keys ``arr_0, arr_1, ...``) and
``grads.npz`` (one array per YieldOp output, in order, same keys; without it only the forward
runs and no backward fetches are written). The script builds the
C++ ``TrainingAgent`` over an ``InferenceSession`` on the CPU provider, runs forward until the
YieldOp, then backward with the given gradients on the same ``PartialGraphExecutionState``,
and writes ``outputs.npz``: ``forward_0000, ...`` (the forward fetches: the YieldOp inputs) and
``backward_0000, ...`` (the backward fetches: the graph outputs), plus ``info.json`` with the
names and the onnxruntime version.

torch is not needed: the ``onnxruntime.training.ortmodule`` wrapper is bypassed and the pybind
classes are used directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as C

OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def cpu_device():
    return C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)


def yield_node(model: onnx.ModelProto):
    for node in model.graph.node:
        if node.op_type == "YieldOp":
            return node
    return None


def ort_values(arrays, keep_alive: list):
    """An OrtValueVector over CPU copies of ``arrays`` (the arrays stay referenced by keep_alive)."""
    vector = C.OrtValueVector()
    for array in arrays:
        array = np.ascontiguousarray(array)
        keep_alive.append(array)
        vector.push_back(C.OrtValue.ortvalue_from_numpy(array, cpu_device()))
    return vector


def make_agent(model_bytes: bytes, fw_feed_names, fw_fetch_count, bw_fetch_names, optimization_level=None):
    """(InferenceSession, TrainingAgent) as ORTModule builds them, every output on the CPU."""
    options = ort.SessionOptions()
    if optimization_level is not None:
        options.graph_optimization_level = OPTIMIZATION_LEVELS[optimization_level]
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    agent = C.TrainingAgent(
        session._sess,
        list(fw_feed_names),
        [cpu_device()] * fw_fetch_count,
        list(bw_fetch_names),
        [cpu_device()] * len(bw_fetch_names),
        0,
    )
    return session, agent


def load_ordered(path: str) -> list:
    with np.load(path) as archive:
        keys = sorted(archive.files, key=lambda key: int(key.split("_")[-1]))
        return [archive[key] for key in keys]


def run(directory: str, optimization_level=None) -> None:
    model_path = os.path.join(directory, "model.onnx")
    with open(model_path, "rb") as handle:
        model_bytes = handle.read()
    model = onnx.load_from_string(model_bytes)
    node = yield_node(model)
    fw_feed_names = [value.name for value in model.graph.input]
    fw_fetch_count = len(node.input) if node is not None else 0
    bw_fetch_names = [value.name for value in model.graph.output]
    feeds = load_ordered(os.path.join(directory, "feeds.npz"))
    grads_path = os.path.join(directory, "grads.npz")
    grads = load_ordered(grads_path) if os.path.exists(grads_path) else None

    session, agent = make_agent(model_bytes, fw_feed_names, fw_fetch_count, bw_fetch_names, optimization_level)
    keep_alive: list = []
    state = C.PartialGraphExecutionState()
    forward_fetches = C.OrtValueVector()
    agent.run_forward(ort_values(feeds, keep_alive), forward_fetches, state, None)
    # Copy now: the fetches are views of buffers that the backward run may reuse (1.19.2 plans
    # the YieldOp inputs' memory as free once forward is over; see FINDINGS.md).
    forward = [np.array(forward_fetches[i].numpy(), copy=True) for i in range(len(forward_fetches))]
    if grads is None:       # forward only (the state is dropped unfinished)
        backward = []
    else:
        backward_fetches = C.OrtValueVector()
        agent.run_backward(ort_values(grads, keep_alive), backward_fetches, state)
        backward = [np.array(backward_fetches[i].numpy(), copy=True) for i in range(len(backward_fetches))]

    arrays = {f"forward_{i:04d}": value for i, value in enumerate(forward)}
    arrays.update({f"backward_{i:04d}": value for i, value in enumerate(backward)})
    np.savez(os.path.join(directory, "outputs.npz"), **arrays)
    info = {
        "onnxruntime": ort.__version__,
        "forward_names": list(node.input) if node is not None else [],
        "backward_names": bw_fetch_names,
    }
    with open(os.path.join(directory, "info.json"), "w") as handle:
        json.dump(info, handle)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--optimization-level", choices=sorted(OPTIMIZATION_LEVELS), default=None)
    args = parser.parse_args(argv)
    run(args.directory, args.optimization_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
