"""Probe how onnxruntime-training 1.19.2's TrainingAgent reacts to bad graphs and misuse.

Runs *inside* an onnxruntime-training 1.19.2 environment, one probe per process (several of
them crash the process)::

    python probe_agent_1192.py PROBE      # one probe; prints 'step:' lines, then 'RESULT: {json}'
    python probe_agent_1192.py --list     # the probe names

``run_probes.py`` runs every probe in its own subprocess and records how each one ended. What
the probes found is written down in ``FINDINGS.md``.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import run_agent_1192 as agent_runner
from onnxruntime.capi import _pybind_state as C

F = np.float32
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3)).astype(F)
W = RNG.standard_normal(3).astype(F)
B = RNG.standard_normal(3).astype(F)
G = RNG.standard_normal((2, 3)).astype(F)


def step(message: str) -> None:
    print(f"step: {message}", flush=True)


def yield_op(inputs, outputs, full_shape=(0,), non_diff=None, domain="com.microsoft", name="YieldOp"):
    node = helper.make_node("YieldOp", list(inputs), list(outputs), domain=domain, name=name)
    if full_shape is not None:
        node.attribute.append(helper.make_attribute("full_shape_outputs", list(full_shape),
                                                    attr_type=AttributeProto.INTS))
    if non_diff is not None:
        node.attribute.append(helper.make_attribute("non_differentiable_outputs", list(non_diff),
                                                    attr_type=AttributeProto.INTS))
    return node


def mul_add(yield_nodes=None, extra_outputs=()):
    """out = x * w + bias; x_grad, w_grad, bias_grad (float32, x [2, 3], w and bias [3])."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "bias"], ["out"])]
    nodes += yield_nodes if yield_nodes is not None else [yield_op(["out"], ["out_grad"])]
    nodes += [
        helper.make_node("Mul", ["out_grad", "w"], ["x_grad"]),
        helper.make_node("Mul", ["out_grad", "x"], ["gx"]),
        helper.make_node("ReduceSum", ["gx", "axis0"], ["w_grad"], keepdims=0),
        helper.make_node("ReduceSum", ["out_grad", "axis0"], ["bias_grad"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "mul_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("x_grad", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w_grad", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("bias_grad", TensorProto.FLOAT, [3])] + list(extra_outputs),
        [numpy_helper.from_array(np.array([0], np.int64), "axis0")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def expected_grads(g=G):
    return [g * W, (g * X).sum(0), g.sum(0)]


FEED_NAMES = ["x", "w", "bias"]
FETCH_NAMES = ["x_grad", "w_grad", "bias_grad"]


class Run:
    """An agent over a model plus helpers that record what happened."""

    def __init__(self, model, fw_feed_names=FEED_NAMES, fw_fetch_count=1, bw_fetch_names=FETCH_NAMES,
                 fw_devices=None, bw_devices=None):
        self.keep: list = []
        step("create InferenceSession")
        options = agent_runner.ort.SessionOptions()
        self.session = agent_runner.ort.InferenceSession(model.SerializeToString(), options,
                                                         providers=["CPUExecutionProvider"])
        step("create TrainingAgent")
        device = agent_runner.cpu_device()
        self.agent = C.TrainingAgent(
            self.session._sess, list(fw_feed_names),
            [device] * fw_fetch_count if fw_devices is None else fw_devices,
            list(bw_fetch_names),
            [device] * len(bw_fetch_names) if bw_devices is None else bw_devices, 0)
        step("agent created")

    def forward(self, state, feeds=(X, W, B)):
        fetches = C.OrtValueVector()
        step("run_forward")
        self.agent.run_forward(agent_runner.ort_values(feeds, self.keep), fetches, state, None)
        values = [np.array(fetches[i].numpy(), copy=True) for i in range(len(fetches))]
        step(f"forward returned {len(values)} fetches: {[(str(v.dtype), list(v.shape)) for v in values]}")
        return values, fetches

    def backward(self, state, grads=(G,)):
        fetches = C.OrtValueVector()
        step("run_backward")
        self.agent.run_backward(agent_runner.ort_values(grads, self.keep), fetches, state)
        values = [np.array(fetches[i].numpy(), copy=True) for i in range(len(fetches))]
        step(f"backward returned {len(values)} fetches: {[(str(v.dtype), list(v.shape)) for v in values]}")
        return values


def _close(values, expected):
    return len(values) == len(expected) and all(
        np.shape(a) == np.shape(b) and np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(values, expected))


def full_round(model=None, grads=(G,), **kwargs):
    run = Run(model or mul_add(), **kwargs)
    state = C.PartialGraphExecutionState()
    forward, _ = run.forward(state)
    backward = run.backward(state, grads)
    return {"forward_correct": _close(forward, [X * W + B]), "backward": [v.tolist() for v in backward],
            "backward_correct": _close(backward, expected_grads())}


PROBES = {}


def probe(function):
    PROBES[function.__name__] = function
    return function


# -- baseline and what the API needs --------------------------------------------------------


@probe
def baseline():
    return full_round()


@probe
def forward_fetches_include_non_differentiable():
    """MLP-like graph with an int64 argmax output marked non-differentiable."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["out"]),
             helper.make_node("ArgMax", ["out"], ["pred"], axis=1, keepdims=0),
             yield_op(["out", "pred"], ["out_grad"], full_shape=(0, 1), non_diff=(1,)),
             helper.make_node("Mul", ["out_grad", "x"], ["w_grad_full"]),
             helper.make_node("ReduceSum", ["w_grad_full", "axis0"], ["w_grad"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                     helper.make_tensor_value_info("w", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("w_grad", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array([0], np.int64), "axis0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    run = Run(model, ["x", "w"], 2, ["w_grad"])
    state = C.PartialGraphExecutionState()
    forward, _ = run.forward(state, (X, W))
    backward = run.backward(state)
    return {"forward_count": len(forward), "forward_dtypes": [str(v.dtype) for v in forward],
            "pred_correct": bool(np.array_equal(forward[1], np.argmax(X * W, axis=1))),
            "backward_correct": _close(backward, [(G * X).sum(0)])}


@probe
def forward_outputs_after_backward():
    """Are the forward fetches (zero-copy views) still intact after run_backward?"""
    run = Run(mul_add())
    state = C.PartialGraphExecutionState()
    _, fetches = run.forward(state)
    view = fetches[0].numpy()
    intact_before = bool(np.array_equal(view, X * W + B))
    run.backward(state)
    return {"intact_after_forward": intact_before,
            "intact_after_backward": bool(np.array_equal(fetches[0].numpy(), X * W + B))}


@probe
def fw_device_info_too_short():
    return full_round(fw_devices=[])


@probe
def fw_device_info_longer():
    return full_round(fw_devices=[agent_runner.cpu_device()] * 4)


@probe
def bw_device_info_too_short():
    return full_round(bw_devices=[])


@probe
def fw_feed_names_missing_one():
    run = Run(mul_add(), fw_feed_names=["x", "w"])
    state = C.PartialGraphExecutionState()
    forward, _ = run.forward(state, (X, W))
    return {"forward": [v.tolist() for v in forward]}


@probe
def fw_feed_names_unknown():
    return full_round(fw_feed_names=["x", "w", "nope"])


@probe
def feeds_fewer_than_names():
    run = Run(mul_add())
    state = C.PartialGraphExecutionState()
    forward, _ = run.forward(state, (X, W))
    return {"forward": [v.tolist() for v in forward]}


@probe
def bw_fetch_names_subset():
    run = Run(mul_add(), bw_fetch_names=["w_grad"])
    state = C.PartialGraphExecutionState()
    run.forward(state)
    backward = run.backward(state)
    return {"backward_correct": _close(backward, [expected_grads()[1]])}


@probe
def bw_fetch_name_intermediate():
    run = Run(mul_add(), bw_fetch_names=["gx"])
    state = C.PartialGraphExecutionState()
    run.forward(state)
    backward = run.backward(state)
    return {"backward_correct": _close(backward, [G * X])}


@probe
def bw_fetch_name_unknown():
    return full_round(bw_fetch_names=["x_grad", "nope"])


# -- malformed training graphs ----------------------------------------------------------------


@probe
def no_yield():
    model = mul_add(yield_nodes=[helper.make_node("Identity", ["out"], ["out_grad"])])
    return full_round(model, fw_fetch_count=0)


@probe
def no_yield_no_gradients():
    model = mul_add(yield_nodes=[helper.make_node("Identity", ["out"], ["out_grad"])])
    return full_round(model, grads=(), fw_fetch_count=0)


@probe
def no_yield_no_backward_fetches():
    model = mul_add(yield_nodes=[helper.make_node("Identity", ["out"], ["out_grad"])])
    run = Run(model, fw_fetch_count=0, bw_fetch_names=[])
    state = C.PartialGraphExecutionState()
    forward, _ = run.forward(state)
    backward = run.backward(state, ())
    return {"forward_count": len(forward), "backward_count": len(backward)}


@probe
def two_yields():
    model = mul_add(yield_nodes=[yield_op(["out"], ["mid"], name="first"),
                                 yield_op(["mid"], ["out_grad"], name="second")])
    return full_round(model)


@probe
def non_differentiable_out_of_range():
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], non_diff=(5,))]))


@probe
def non_differentiable_negative():
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], non_diff=(-1,))]))


@probe
def non_differentiable_out_of_range_consistent_count():
    """Counts agree (2 inputs, 1 output, 1 index) but the index is 5."""
    return full_round(mul_add(yield_nodes=[yield_op(["out", "xw"], ["out_grad"], non_diff=(5,))]), fw_fetch_count=2)


@probe
def non_differentiable_negative_consistent_count():
    return full_round(mul_add(yield_nodes=[yield_op(["out", "xw"], ["out_grad"], non_diff=(-1,))]), fw_fetch_count=2)


@probe
def non_differentiable_duplicate_consistent_count():
    """3 inputs, 1 output, non_differentiable_outputs = [1, 1]."""
    return full_round(mul_add(yield_nodes=[yield_op(["out", "xw", "x"], ["out_grad"], non_diff=(1, 1))]),
                      fw_fetch_count=3)


@probe
def full_shape_out_of_range():
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], full_shape=(5,))]))


@probe
def full_shape_negative():
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], full_shape=(-1,))]))


@probe
def full_shape_duplicate():
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], full_shape=(0, 0))]))


@probe
def full_shape_missing():
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], full_shape=None)]))


@probe
def count_mismatch():
    """Two module outputs, one gradient, nothing marked non-differentiable."""
    return full_round(mul_add(yield_nodes=[yield_op(["out", "xw"], ["out_grad"], full_shape=(0,))]), fw_fetch_count=2)


@probe
def count_mismatch_non_differentiable():
    """One module output marked non-differentiable but still given a gradient slot."""
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], non_diff=(0,))]))


# -- wrong gradients ---------------------------------------------------------------------------


@probe
def gradients_none():
    return full_round(grads=())


@probe
def gradients_too_many():
    return full_round(grads=(G, G))


@probe
def gradient_wrong_dtype():
    return full_round(grads=(G.astype(np.float64),))


@probe
def gradient_wrong_shape_full_shape():
    return full_round(grads=(G.T.copy(),))


@probe
def gradient_scalar_full_shape():
    return full_round(grads=(np.array(1.0, F),))


@probe
def gradient_scalar_not_full_shape():
    result = full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], full_shape=())]),
                        grads=(np.array(1.0, F),))
    ones = np.ones((2, 3), F)
    result["matches_broadcast_ones"] = _close([np.array(v) for v in result["backward"]],
                                              [ones * W, X.sum(0), np.full(3, 1.0, F)])
    return result


@probe
def gradient_wrong_shape_not_full_shape():
    return full_round(mul_add(yield_nodes=[yield_op(["out"], ["out_grad"], full_shape=())]), grads=(G.T.copy(),))


# -- state misuse -----------------------------------------------------------------------------


@probe
def forward_twice_same_state():
    run = Run(mul_add())
    state = C.PartialGraphExecutionState()
    run.forward(state)
    second, _ = run.forward(state, (X * 2, W, B))
    backward = run.backward(state)
    return {"second_forward_correct": _close(second, [2 * X * W + B]),
            "backward_uses_second_inputs": _close(backward, [G * W, (G * 2 * X).sum(0), G.sum(0)]),
            "backward_uses_first_inputs": _close(backward, expected_grads())}


@probe
def backward_twice_same_state():
    run = Run(mul_add())
    state = C.PartialGraphExecutionState()
    run.forward(state)
    first = run.backward(state)
    second = run.backward(state, (2 * G,))
    return {"first_correct": _close(first, expected_grads()), "second_correct": _close(second, expected_grads(2 * G)),
            "second": [v.tolist() for v in second]}


@probe
def backward_without_forward():
    run = Run(mul_add())
    state = C.PartialGraphExecutionState()
    backward = run.backward(state)
    return {"backward": [v.tolist() for v in backward], "backward_correct": _close(backward, expected_grads())}


@probe
def state_reused_after_backward():
    run = Run(mul_add())
    state = C.PartialGraphExecutionState()
    run.forward(state)
    run.backward(state)
    forward, _ = run.forward(state, (3 * X, W, B))
    backward = run.backward(state, (G,))
    return {"forward_correct": _close(forward, [3 * X * W + B]),
            "backward_correct": _close(backward, [G * W, (G * 3 * X).sum(0), G.sum(0)])}


@probe
def two_states_interleaved():
    run = Run(mul_add())
    first, second = C.PartialGraphExecutionState(), C.PartialGraphExecutionState()
    run.forward(first)
    run.forward(second, (2 * X, W, B))
    backward_first = run.backward(first)
    backward_second = run.backward(second)
    return {"first_correct": _close(backward_first, expected_grads()),
            "second_correct": _close(backward_second, [G * W, (G * 2 * X).sum(0), G.sum(0)])}


def main(argv) -> int:
    if argv[1:] == ["--list"]:
        print("\n".join(PROBES))
        return 0
    name = argv[1]
    try:
        result = {"outcome": "returned", **PROBES[name]()}
    except Exception as exc:  # the point is to see which exception, so catch them all
        lines = str(exc).strip().splitlines()
        result = {"outcome": "exception", "type": type(exc).__name__,
                  "message": lines[0] if lines else "", "detail": lines[1:4],
                  "where": traceback.extract_tb(exc.__traceback__)[-1].line}
    print("RESULT: " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
