"""Training graphs in the ORTModule layout, built in code, each with a NumPy reference.

Every builder returns a :class:`TrainingCase`: the ``onnx.ModelProto`` of a training graph
(graph inputs = user inputs then parameters, one ``com.microsoft:YieldOp`` after the module
outputs, graph outputs = gradients), what a test needs to feed it, and float64 reference
functions written out by hand (analytic forward and gradients, no autodiff library).

The hand-built cases spell out their backward node by node, so the split is tested on graphs
that do not come from ``ortagent.training``. :func:`random_case` instead draws a small forward
model from a family of op chains and turns it into a training graph with
:func:`ortagent.training.build_training_graph`; its reference comes from a NumPy interpreter
of the same op list with hand-written derivative rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 17

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


@dataclass
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    kind: str = "float"  # "float" (standard normal), "bool"

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "bool":
            return np.asarray(rng.random(self.shape) < 0.5)
        return np.asarray(rng.standard_normal(self.shape), dtype=self.dtype)


@dataclass
class TrainingCase:
    """A training graph and what it takes to drive and check it.

    ``reference(feeds)`` returns the module outputs (float64 where differentiable);
    ``reference_gradients(feeds, grads)`` returns the graph outputs for output gradients
    ``grads`` (one per differentiable module output, in order). ``gradient_of`` maps a graph
    output to the graph input it is the gradient of, for finite-difference checks.
    """

    name: str
    model: onnx.ModelProto
    inputs: list[InputSpec]
    module_output_names: list[str]
    differentiable: list[bool]
    graph_output_names: list[str]
    reference: Callable[[dict], list[np.ndarray]]
    reference_gradients: Callable[[dict, list[np.ndarray]], list[np.ndarray]]
    gradient_of: dict[str, str] = field(default_factory=dict)
    expected_stash: set[str] | None = None
    expected_forward_inputs: list[str] | None = None
    expected_backward_graph_inputs: list[str] | None = None
    dtype: np.dtype = np.dtype(np.float64)

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def make_feeds(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {spec.name: spec.sample(rng) for spec in self.inputs}

    def make_gradients(self, rng: np.random.Generator, outputs: list[np.ndarray]) -> list[np.ndarray]:
        """Random output gradients shaped like the differentiable outputs."""
        return [
            np.asarray(rng.standard_normal(np.shape(out)), dtype=self.dtype)
            for out, diff in zip(outputs, self.differentiable)
            if diff
        ]


# -- construction helpers -------------------------------------------------------------------


def make_model(nodes, inputs, outputs, initializers=(), value_info=(), name="training_graph", opset=OPSET,
               ms_domain=True) -> onnx.ModelProto:
    """A model with explicit IR version and opsets (onnx's defaults are too new for onnxruntime)."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), initializer=list(initializers),
                              value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)]
    if ms_domain:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def yield_node(inputs, outputs, full_shape_outputs, non_differentiable_outputs=None, name="YieldOp",
               domain="com.microsoft") -> onnx.NodeProto:
    node = helper.make_node("YieldOp", list(inputs), list(outputs), domain=domain, name=name)
    if full_shape_outputs is not None:
        node.attribute.append(
            helper.make_attribute("full_shape_outputs", list(full_shape_outputs), attr_type=AttributeProto.INTS))
    if non_differentiable_outputs is not None:
        node.attribute.append(helper.make_attribute(
            "non_differentiable_outputs", list(non_differentiable_outputs), attr_type=AttributeProto.INTS))
    return node


def tensor(name, dtype, shape):
    return helper.make_tensor_value_info(name, _ELEM[np.dtype(dtype)], list(shape))


def const(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def axes(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


# -- hand-built cases ------------------------------------------------------------------------


def mul_add_case(dtype=np.float64) -> TrainingCase:
    """out = x * w + bias, with x [2, 3] a user input and w, bias [3] parameters."""
    dtype = np.dtype(dtype)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "bias"], ["out"]),
        yield_node(["out"], ["out_grad"], [0]),
        helper.make_node("Mul", ["out_grad", "w"], ["x_grad"]),
        helper.make_node("Mul", ["out_grad", "x"], ["gx"]),
        helper.make_node("ReduceSum", ["gx", "axis0"], ["w_grad"], keepdims=0),
        helper.make_node("ReduceSum", ["out_grad", "axis0"], ["bias_grad"], keepdims=0),
    ]
    model = make_model(
        nodes,
        [tensor("x", dtype, [2, 3]), tensor("w", dtype, [3]), tensor("bias", dtype, [3])],
        [tensor("x_grad", dtype, [2, 3]), tensor("w_grad", dtype, [3]), tensor("bias_grad", dtype, [3])],
        [axes("axis0", [0])],
        name="mul_add",
    )

    def reference(f):
        return [f["x"] * f["w"] + f["bias"]]

    def gradients(f, g):
        (gout,) = g
        return [gout * f["w"], (gout * f["x"]).sum(0), gout.sum(0)]

    return TrainingCase(
        "mul_add", model,
        [InputSpec("x", (2, 3), dtype), InputSpec("w", (3,), dtype), InputSpec("bias", (3,), dtype)],
        ["out"], [True], ["x_grad", "w_grad", "bias_grad"], reference, gradients,
        gradient_of={"x_grad": "x", "w_grad": "w", "bias_grad": "bias"},
        expected_stash=set(), expected_forward_inputs=["x", "w", "bias"],
        expected_backward_graph_inputs=["x", "w"], dtype=dtype,
    )


def mlp_forward_nodes(argmax: bool = True) -> list[onnx.NodeProto]:
    """The forward of the two-layer MLP the tests and benchmarks train: x @ W1 + b1 -> h,
    relu -> r, r @ W2 + b2 -> logits and, with `argmax`, their argmax ``pred`` [N] (int64).
    Used by mlp_case, test_training_builder.py's forward model and benchmarks/group_agent.py."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["z"]),
        helper.make_node("Add", ["z", "b2"], ["logits"]),
    ]
    if argmax:
        nodes.append(helper.make_node("ArgMax", ["logits"], ["pred"], axis=1, keepdims=0))
    return nodes


def mlp_case(dtype=np.float64) -> TrainingCase:
    """Two-layer MLP with ReLU; outputs the logits and their argmax (int64, non-differentiable)."""
    dtype = np.dtype(dtype)
    nodes = [
        *mlp_forward_nodes(),
        yield_node(["logits", "pred"], ["logits_grad"], [0, 1], [1]),
        helper.make_node("Transpose", ["r"], ["rT"], perm=[1, 0]),
        helper.make_node("MatMul", ["rT", "logits_grad"], ["W2_grad"]),
        helper.make_node("ReduceSum", ["logits_grad", "axis0"], ["b2_grad"], keepdims=0),
        helper.make_node("Transpose", ["W2"], ["W2T"], perm=[1, 0]),
        helper.make_node("MatMul", ["logits_grad", "W2T"], ["dr"]),
        helper.make_node("Greater", ["h", "zero"], ["active"]),
        helper.make_node("Where", ["active", "dr", "zero"], ["dh"]),
        helper.make_node("Transpose", ["x"], ["xT"], perm=[1, 0]),
        helper.make_node("MatMul", ["xT", "dh"], ["W1_grad"]),
        helper.make_node("ReduceSum", ["dh", "axis0"], ["b1_grad"], keepdims=0),
    ]
    model = make_model(
        nodes,
        [tensor("x", dtype, [4, 3]), tensor("W1", dtype, [3, 5]), tensor("b1", dtype, [5]),
         tensor("W2", dtype, [5, 2]), tensor("b2", dtype, [2])],
        [tensor("W1_grad", dtype, [3, 5]), tensor("b1_grad", dtype, [5]), tensor("W2_grad", dtype, [5, 2]),
         tensor("b2_grad", dtype, [2])],
        [axes("axis0", [0]), const("zero", 0.0, dtype)],
        name="mlp",
    )

    def forward(f):
        h = f["x"] @ f["W1"] + f["b1"]
        r = np.maximum(h, 0)
        logits = r @ f["W2"] + f["b2"]
        return h, r, logits

    def reference(f):
        _, _, logits = forward(f)
        return [logits, np.argmax(logits, axis=1).astype(np.int64)]

    def gradients(f, g):
        (glog,) = g
        h, r, _ = forward(f)
        dh = (glog @ f["W2"].T) * (h > 0)
        return [f["x"].T @ dh, dh.sum(0), r.T @ glog, glog.sum(0)]

    specs = [InputSpec("x", (4, 3), dtype), InputSpec("W1", (3, 5), dtype), InputSpec("b1", (5,), dtype),
             InputSpec("W2", (5, 2), dtype), InputSpec("b2", (2,), dtype)]
    return TrainingCase(
        "mlp", model, specs, ["logits", "pred"], [True, False],
        ["W1_grad", "b1_grad", "W2_grad", "b2_grad"], reference, gradients,
        gradient_of={"W1_grad": "W1", "b1_grad": "b1", "W2_grad": "W2", "b2_grad": "b2"},
        expected_stash={"h", "r"}, expected_forward_inputs=["x", "W1", "b1", "W2", "b2"],
        expected_backward_graph_inputs=["x", "W2"], dtype=dtype,
    )


def multi_output_case(dtype=np.float64) -> TrainingCase:
    """Two module outputs: a = tanh(x * w) and s = sum(a * a); the backward reads module output a."""
    dtype = np.dtype(dtype)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t"]),
        helper.make_node("Tanh", ["t"], ["a"]),
        helper.make_node("Mul", ["a", "a"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["s"], keepdims=0),
        yield_node(["a", "s"], ["a_grad", "s_grad"], [0, 1]),
        helper.make_node("Mul", ["s_grad", "two"], ["gs2"]),
        helper.make_node("Mul", ["gs2", "a"], ["ds"]),
        helper.make_node("Add", ["a_grad", "ds"], ["da"]),
        helper.make_node("Mul", ["a", "a"], ["a2"]),
        helper.make_node("Sub", ["one", "a2"], ["dtanh"]),
        helper.make_node("Mul", ["da", "dtanh"], ["dt"]),
        helper.make_node("Mul", ["dt", "w"], ["x_grad"]),
        helper.make_node("Mul", ["dt", "x"], ["w_grad"]),
    ]
    model = make_model(
        nodes,
        [tensor("x", dtype, [3]), tensor("w", dtype, [3])],
        [tensor("x_grad", dtype, [3]), tensor("w_grad", dtype, [3])],
        [const("two", 2.0, dtype), const("one", 1.0, dtype)],
        name="multi_output",
    )

    def reference(f):
        a = np.tanh(f["x"] * f["w"])
        return [a, np.sum(a * a)]

    def gradients(f, g):
        ga, gs = g
        a = np.tanh(f["x"] * f["w"])
        dt = (ga + 2 * gs * a) * (1 - a * a)
        return [dt * f["w"], dt * f["x"]]

    return TrainingCase(
        "multi_output", model, [InputSpec("x", (3,), dtype), InputSpec("w", (3,), dtype)],
        ["a", "s"], [True, True], ["x_grad", "w_grad"], reference, gradients,
        gradient_of={"x_grad": "x", "w_grad": "w"},
        expected_stash={"a"}, expected_forward_inputs=["x", "w"], expected_backward_graph_inputs=["x", "w"],
        dtype=dtype,
    )


def repeated_output_case(dtype=np.float64) -> TrainingCase:
    """The YieldOp lists y = sigmoid(x * w) twice; each occurrence gets its own gradient."""
    dtype = np.dtype(dtype)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t"]),
        helper.make_node("Sigmoid", ["t"], ["y"]),
        yield_node(["y", "y"], ["y_grad_0", "y_grad_1"], [0, 1]),
        helper.make_node("Add", ["y_grad_0", "y_grad_1"], ["gy"]),
        helper.make_node("Sub", ["one", "y"], ["one_minus_y"]),
        helper.make_node("Mul", ["y", "one_minus_y"], ["dsig"]),
        helper.make_node("Mul", ["gy", "dsig"], ["dt"]),
        helper.make_node("Mul", ["dt", "x"], ["w_grad"]),
    ]
    model = make_model(
        nodes, [tensor("x", dtype, [2, 2]), tensor("w", dtype, [2, 2])], [tensor("w_grad", dtype, [2, 2])],
        [const("one", 1.0, dtype)], name="repeated_output",
    )

    def reference(f):
        y = 1 / (1 + np.exp(-f["x"] * f["w"]))
        return [y, y]

    def gradients(f, g):
        y = 1 / (1 + np.exp(-f["x"] * f["w"]))
        return [(g[0] + g[1]) * y * (1 - y) * f["x"]]

    return TrainingCase(
        "repeated_output", model, [InputSpec("x", (2, 2), dtype), InputSpec("w", (2, 2), dtype)],
        ["y", "y"], [True, True], ["w_grad"], reference, gradients, gradient_of={"w_grad": "w"},
        expected_stash={"y"}, expected_forward_inputs=["x", "w"], expected_backward_graph_inputs=["x"],
        dtype=dtype,
    )


def no_gradient_path_case(dtype=np.float64) -> TrainingCase:
    """A parameter v that no output depends on (zero gradient) and an unused YieldOp output."""
    dtype = np.dtype(dtype)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["y"]),
        helper.make_node("Add", ["x", "one"], ["z"]),
        yield_node(["y", "z"], ["y_grad", "z_grad"], [0, 1]),
        helper.make_node("Mul", ["y_grad", "x"], ["w_grad"]),
        helper.make_node("Shape", ["v"], ["v_shape"]),
        helper.make_node("ConstantOfShape", ["v_shape"], ["v_grad"],
                         value=numpy_helper.from_array(np.zeros(1, dtype=dtype))),
    ]
    model = make_model(
        nodes, [tensor("x", dtype, [2, 3]), tensor("w", dtype, [2, 3]), tensor("v", dtype, [4])],
        [tensor("w_grad", dtype, [2, 3]), tensor("v_grad", dtype, [4])], [const("one", 1.0, dtype)],
        name="no_gradient_path",
    )

    def reference(f):
        return [f["x"] * f["w"], f["x"] + 1]

    def gradients(f, g):
        return [g[0] * f["x"], np.zeros(4, dtype)]

    return TrainingCase(
        "no_gradient_path", model,
        [InputSpec("x", (2, 3), dtype), InputSpec("w", (2, 3), dtype), InputSpec("v", (4,), dtype)],
        ["y", "z"], [True, True], ["w_grad", "v_grad"], reference, gradients,
        gradient_of={"w_grad": "w", "v_grad": "v"},
        expected_stash=set(), expected_forward_inputs=["x", "w"], expected_backward_graph_inputs=["x", "v"],
        dtype=dtype,
    )


def constants_both_sides_case(dtype=np.float64) -> TrainingCase:
    """A Constant node k and an initializer c read by both the forward and the backward."""
    dtype = np.dtype(dtype)
    k = np.array([0.5, -1.0, 2.0], dtype=dtype)
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(k)),
        helper.make_node("Add", ["x", "k"], ["t"]),
        helper.make_node("Mul", ["t", "w"], ["u"]),
        helper.make_node("Mul", ["u", "c"], ["v"]),
        helper.make_node("Mul", ["p", "k"], ["q"]),
        helper.make_node("Add", ["v", "q"], ["y"]),
        yield_node(["y"], ["y_grad"], [0]),
        helper.make_node("Mul", ["y_grad", "c"], ["gy"]),
        helper.make_node("Mul", ["gy", "w"], ["x_grad"]),
        helper.make_node("Mul", ["gy", "t"], ["w_grad"]),
        helper.make_node("Mul", ["y_grad", "k"], ["p_grad"]),
    ]
    model = make_model(
        nodes, [tensor("x", dtype, [3]), tensor("w", dtype, [3]), tensor("p", dtype, [3])],
        [tensor("x_grad", dtype, [3]), tensor("w_grad", dtype, [3]), tensor("p_grad", dtype, [3])],
        [const("c", 3.0, dtype)], name="constants_both_sides",
    )

    def reference(f):
        return [(f["x"] + k) * f["w"] * 3.0 + f["p"] * k]

    def gradients(f, g):
        (gy,) = g
        return [gy * 3.0 * f["w"], gy * 3.0 * (f["x"] + k), gy * k]

    return TrainingCase(
        "constants_both_sides", model,
        [InputSpec("x", (3,), dtype), InputSpec("w", (3,), dtype), InputSpec("p", (3,), dtype)],
        ["y"], [True], ["x_grad", "w_grad", "p_grad"], reference, gradients,
        gradient_of={"x_grad": "x", "w_grad": "w", "p_grad": "p"},
        expected_stash={"t"}, expected_forward_inputs=["x", "w", "p"], expected_backward_graph_inputs=["w"],
        dtype=dtype,
    )


def backward_only_input_case(dtype=np.float64) -> TrainingCase:
    """A graph input s that only the backward reads (a per-element weight of the gradient)."""
    dtype = np.dtype(dtype)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["y"]),
        yield_node(["y"], ["y_grad"], [0]),
        helper.make_node("Mul", ["y_grad", "s"], ["gs"]),
        helper.make_node("Mul", ["gs", "x"], ["w_grad"]),
    ]
    model = make_model(
        nodes, [tensor("x", dtype, [2, 3]), tensor("s", dtype, [2, 3]), tensor("w", dtype, [2, 3])],
        [tensor("w_grad", dtype, [2, 3])], name="backward_only_input",
    )

    def reference(f):
        return [f["x"] * f["w"]]

    def gradients(f, g):
        return [g[0] * f["s"] * f["x"]]

    return TrainingCase(
        "backward_only_input", model,
        [InputSpec("x", (2, 3), dtype), InputSpec("s", (2, 3), dtype), InputSpec("w", (2, 3), dtype)],
        ["y"], [True], ["w_grad"], reference, gradients, gradient_of={},
        expected_stash=set(), expected_forward_inputs=["x", "w"], expected_backward_graph_inputs=["x", "s"],
        dtype=dtype,
    )


def passthrough_outputs_case(dtype=np.float64) -> TrainingCase:
    """Graph outputs that are a forward value, a graph input, a gradient and a module output."""
    dtype = np.dtype(dtype)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("Tanh", ["h"], ["y"]),
        yield_node(["y"], ["y_grad"], [0]),
        helper.make_node("Mul", ["y", "y"], ["y2"]),
        helper.make_node("Sub", ["one", "y2"], ["dtanh"]),
        helper.make_node("Mul", ["y_grad", "dtanh"], ["dh"]),
        helper.make_node("Mul", ["dh", "x"], ["w_grad"]),
    ]
    model = make_model(
        nodes, [tensor("x", dtype, [3]), tensor("w", dtype, [3])],
        [tensor("w_grad", dtype, [3]), tensor("h", dtype, [3]), tensor("x", dtype, [3]),
         tensor("y_grad", dtype, [3]), tensor("y", dtype, [3])],
        [const("one", 1.0, dtype)], name="passthrough_outputs",
    )

    def reference(f):
        return [np.tanh(f["x"] * f["w"])]

    def gradients(f, g):
        h = f["x"] * f["w"]
        y = np.tanh(h)
        return [g[0] * (1 - y * y) * f["x"], h, f["x"], g[0], y]

    return TrainingCase(
        "passthrough_outputs", model, [InputSpec("x", (3,), dtype), InputSpec("w", (3,), dtype)],
        ["y"], [True], ["w_grad", "h", "x", "y_grad", "y"], reference, gradients,
        gradient_of={"w_grad": "w"},
        expected_stash={"h", "y"}, expected_forward_inputs=["x", "w"], expected_backward_graph_inputs=["x"],
        dtype=dtype,
    )


def control_flow_case(dtype=np.float64) -> TrainingCase:
    """If nodes on both sides whose branches read outer-scope values (a stash value, a gradient)."""
    dtype = np.dtype(dtype)
    elem = _ELEM[dtype]

    def branch(name, nodes, output):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, elem, [3])])

    forward_then = branch("fw_then", [helper.make_node("Tanh", ["h"], ["y_then"])], "y_then")
    forward_else = branch("fw_else", [helper.make_node("Neg", ["h"], ["y_else"])], "y_else")
    backward_then = branch("bw_then", [
        helper.make_node("Mul", ["y", "y"], ["y2"]),
        helper.make_node("Sub", ["one", "y2"], ["dtanh"]),
        helper.make_node("Mul", ["y_grad", "dtanh"], ["dh_then"]),
    ], "dh_then")
    backward_else = branch("bw_else", [helper.make_node("Neg", ["y_grad"], ["dh_else"])], "dh_else")
    # A Loop in the backward whose body reads the outer gradient: x_grad = sum over 2 trips of dh * w / 2.
    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Mul", ["dh", "w"], ["dhw"]),
            helper.make_node("Mul", ["dhw", "half"], ["dhw_half"]),
            helper.make_node("Add", ["acc_in", "dhw_half"], ["acc_out"]),
        ],
        "loop_body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", elem, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", elem, [3])],
    )
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("If", ["flag"], ["y"], then_branch=forward_then, else_branch=forward_else),
        yield_node(["y"], ["y_grad"], [0]),
        helper.make_node("If", ["flag"], ["dh"], then_branch=backward_then, else_branch=backward_else),
        helper.make_node("Mul", ["dh", "x"], ["w_grad"]),
        helper.make_node("Loop", ["trips", "true", "zeros3"], ["x_grad"], body=loop_body),
    ]
    model = make_model(
        nodes, [tensor("x", dtype, [3]), helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
                tensor("w", dtype, [3])],
        [tensor("x_grad", dtype, [3]), tensor("w_grad", dtype, [3])],
        [const("one", 1.0, dtype), const("half", 0.5, dtype), const("zeros3", np.zeros(3), dtype),
         numpy_helper.from_array(np.array(2, dtype=np.int64), "trips"),
         numpy_helper.from_array(np.array(True), "true")],
        name="control_flow",
    )

    def reference(f):
        h = f["x"] * f["w"]
        return [np.tanh(h) if f["flag"] else -h]

    def gradients(f, g):
        h = f["x"] * f["w"]
        dh = g[0] * (1 - np.tanh(h) ** 2) if f["flag"] else -g[0]
        return [dh * f["w"], dh * f["x"]]

    return TrainingCase(
        "control_flow", model,
        [InputSpec("x", (3,), dtype), InputSpec("flag", (), np.dtype(bool), kind="bool"),
         InputSpec("w", (3,), dtype)],
        ["y"], [True], ["x_grad", "w_grad"], reference, gradients,
        gradient_of={"x_grad": "x", "w_grad": "w"},
        expected_stash={"y"}, expected_forward_inputs=["x", "flag", "w"],
        expected_backward_graph_inputs=["x", "flag", "w"], dtype=dtype,
    )


HAND_BUILT = [
    mul_add_case,
    mlp_case,
    multi_output_case,
    repeated_output_case,
    no_gradient_path_case,
    constants_both_sides_case,
    backward_only_input_case,
    passthrough_outputs_case,
    control_flow_case,
]

# The hand-built cases onnxruntime-training 1.19.2's own agent can run (the others hit its
# limitations: reference_agent/FINDINGS.md, test_reference_split.py::test_reference_agent_limitations);
# test_reference_split.py and test_agent_reference.py compare ortagent with it on these.
REFERENCE_COMPARABLE = [
    mul_add_case,
    mlp_case,
    multi_output_case,
    repeated_output_case,
    constants_both_sides_case,
    backward_only_input_case,
]
KERNELS_CHANGED_SINCE_1192 = {"Tanh", "Sigmoid"}  # for double tensors: not bit-identical with 1.19.2


# -- the random family -----------------------------------------------------------------------

_UNARY = ("Relu", "Tanh", "Sigmoid")
_BINARY = ("Add", "Mul", "Sub")
_FAMILY_OPS = ("MatMul",) + _BINARY + _UNARY + ("ReduceSum",)


def _unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum a broadcast result's gradient back to an operand's shape."""
    while grad.ndim > len(shape):
        grad = grad.sum(0)
    for axis, extent in enumerate(shape):
        if extent == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis, keepdims=True)
    return grad


@dataclass
class _Step:
    op: str
    inputs: list[str]
    output: str


@dataclass
class FamilyModel:
    """A random forward model and the op list it was built from (for the NumPy reference)."""

    model: onnx.ModelProto
    steps: list[_Step]
    user_inputs: list[InputSpec]
    params: dict[str, np.ndarray]
    trainable: list[str]
    outputs: list[str]
    int_output: str | None
    input_gradients: list[str]


def random_forward_model(seed: int, dtype=np.float64) -> FamilyModel:
    """A chain of 1-6 ops from MatMul/Add/Mul/Sub/Relu/Tanh/Sigmoid/ReduceSum on x [B, D]."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    batch, width = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    user = [InputSpec("x", (batch, width), dtype)]
    params: dict[str, np.ndarray] = {}
    steps: list[_Step] = []
    nodes = []
    axis_constants = []
    current, shape = "x", (batch, width)
    values = [("x", shape)]
    for index in range(int(rng.integers(1, 7))):
        op = str(rng.choice(_FAMILY_OPS))
        out = f"v{index}"
        if op == "MatMul":
            new_width = int(rng.integers(1, 6))
            name = f"W{index}"
            params[name] = (rng.standard_normal((shape[1], new_width)) / np.sqrt(shape[1])).astype(dtype)
            steps.append(_Step(op, [current, name], out))
            nodes.append(helper.make_node("MatMul", [current, name], [out]))
            shape = (shape[0], new_width)
        elif op in _BINARY:
            name = f"p{index}"
            pshape = [(shape[1],), (1, shape[1]), shape, ()][int(rng.integers(0, 4))]
            params[name] = rng.standard_normal(pshape).astype(dtype)
            first = bool(rng.integers(0, 2))
            operands = [name, current] if first else [current, name]
            steps.append(_Step(op, operands, out))
            nodes.append(helper.make_node(op, operands, [out]))
        elif op in _UNARY:
            steps.append(_Step(op, [current], out))
            nodes.append(helper.make_node(op, [current], [out]))
        else:  # ReduceSum over the feature axis, keeping it
            name = f"axes{index}"
            axis_constants.append(axes(name, [1]))
            steps.append(_Step(op, [current], out))
            nodes.append(helper.make_node("ReduceSum", [current, name], [out], keepdims=1))
            shape = (shape[0], 1)
        current = out
        values.append((out, shape))
    outputs = [current]
    if len(values) > 2 and rng.integers(0, 2):
        # a second output: an intermediate value
        outputs.insert(0, values[int(rng.integers(1, len(values) - 1))][0])
    int_output = None
    if rng.integers(0, 2):
        int_output = "argmax"
        nodes.append(helper.make_node("ArgMax", [current], ["argmax"], axis=1, keepdims=1))
    param_names = list(params)
    trainable = [name for name in param_names if rng.random() < 0.8]
    if not trainable and param_names:
        trainable = param_names[:1]
    input_gradients = ["x"] if (rng.integers(0, 2) or not trainable) else []
    shapes = dict(values)
    initializers = [numpy_helper.from_array(value, name) for name, value in params.items()] + axis_constants
    graph_outputs = [helper.make_tensor_value_info(name, _ELEM[dtype], list(shapes[name])) for name in outputs]
    if int_output:
        graph_outputs.append(helper.make_tensor_value_info("argmax", TensorProto.INT64, [shapes[current][0], 1]))
    model = make_model(nodes, [tensor("x", dtype, [batch, width])], graph_outputs, initializers,
                       name=f"family_{seed}", ms_domain=False)
    return FamilyModel(model, steps, user, params, trainable, outputs, int_output, input_gradients)


def _family_forward(steps: list[_Step], env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = dict(env)
    for step in steps:
        a = [env[name] for name in step.inputs]
        if step.op == "MatMul":
            env[step.output] = a[0] @ a[1]
        elif step.op == "Add":
            env[step.output] = a[0] + a[1]
        elif step.op == "Mul":
            env[step.output] = a[0] * a[1]
        elif step.op == "Sub":
            env[step.output] = a[0] - a[1]
        elif step.op == "Relu":
            env[step.output] = np.maximum(a[0], 0)
        elif step.op == "Tanh":
            env[step.output] = np.tanh(a[0])
        elif step.op == "Sigmoid":
            env[step.output] = 1 / (1 + np.exp(-a[0]))
        elif step.op == "ReduceSum":
            env[step.output] = a[0].sum(axis=1, keepdims=True)
    return env


def _family_backward(steps: list[_Step], env: dict[str, np.ndarray], seeds: dict[str, np.ndarray]):
    adj: dict[str, np.ndarray] = {}
    for name, seed in seeds.items():
        adj[name] = adj.get(name, 0) + seed
    for step in reversed(steps):
        if step.output not in adj:
            continue
        g = adj[step.output]
        a = [env[name] for name in step.inputs]
        y = env[step.output]
        contributions = []
        if step.op == "MatMul":
            contributions = [g @ a[1].T, a[0].T @ g]
        elif step.op == "Add":
            contributions = [g, g]
        elif step.op == "Sub":
            contributions = [g, -g]
        elif step.op == "Mul":
            contributions = [g * a[1], g * a[0]]
        elif step.op == "Relu":
            contributions = [g * (a[0] > 0)]
        elif step.op == "Tanh":
            contributions = [g * (1 - y * y)]
        elif step.op == "Sigmoid":
            contributions = [g * y * (1 - y)]
        elif step.op == "ReduceSum":
            contributions = [np.broadcast_to(g, a[0].shape)]
        for name, value, contribution in zip(step.inputs, a, contributions):
            contribution = _unbroadcast(np.asarray(contribution), np.shape(value))
            adj[name] = adj.get(name, 0) + contribution
    return adj


def random_case(seed: int, dtype=np.float64) -> TrainingCase:
    """A random family model turned into a training graph by ``build_training_graph``."""
    from ortagent.training import build_training_graph

    dtype = np.dtype(dtype)
    family = random_forward_model(seed, dtype)
    model = build_training_graph(family.model, family.trainable, input_gradients=family.input_gradients)
    inputs = list(family.user_inputs) + [InputSpec(name, family.params[name].shape, dtype) for name in family.trainable]
    frozen = {name: value for name, value in family.params.items() if name not in family.trainable}
    module_outputs = family.outputs + ([family.int_output] if family.int_output else [])
    differentiable = [True] * len(family.outputs) + ([False] if family.int_output else [])
    gradient_targets = family.input_gradients + family.trainable

    def reference(f):
        env = _family_forward(family.steps, {**frozen, **f})
        outs = [env[name] for name in family.outputs]
        if family.int_output:
            outs.append(np.argmax(env[family.outputs[-1]], axis=1, keepdims=True).astype(np.int64))
        return outs

    def gradients(f, g):
        env = _family_forward(family.steps, {**frozen, **f})
        seeds: dict[str, np.ndarray] = {}
        for name, grad in zip(family.outputs, g):
            seeds[name] = seeds.get(name, 0) + grad
        adj = _family_backward(family.steps, env, seeds)
        return [np.asarray(adj.get(name, np.zeros_like(f[name])), dtype=dtype).reshape(np.shape(f[name]))
                for name in gradient_targets]

    return TrainingCase(
        f"family_{seed}", model, inputs, module_outputs, differentiable,
        [f"{name}_grad" for name in gradient_targets], reference, gradients,
        gradient_of={f"{name}_grad": name for name in gradient_targets}, dtype=dtype,
    )


# -- running a split with stock onnxruntime --------------------------------------------------


# onnxruntime's MatMulScaleFusion folds a scalar Mul into FusedMatMul's float ``alpha``
# attribute, which rounds a double scale to float32 (relative error ~1e-8 in a double graph).
PRECISION_LOSING_OPTIMIZERS = ("MatMulScaleFusion",)


def cpu_session(model: onnx.ModelProto, optimization_level=None, keep_precision=True):
    """An onnxruntime CPU session for ``model`` (onnxruntime imported lazily).

    ``keep_precision`` disables the optimizers that lose precision in double graphs.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if optimization_level is not None:
        options.graph_optimization_level = optimization_level
    disabled = list(PRECISION_LOSING_OPTIMIZERS) if keep_precision else None
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=disabled)


class SplitRunner:
    """Runs the two halves of a :class:`~ortagent.graph_split.TrainingGraphSplit` like an agent."""

    def __init__(self, split, optimization_level=None, keep_precision=True):
        self.split = split
        self.forward = cpu_session(split.forward_model, optimization_level, keep_precision)
        self.backward = cpu_session(split.backward_model, optimization_level, keep_precision)

    def run_forward(self, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(module outputs, stash) for the graph-input feeds."""
        split = self.split
        outputs = self.forward.run(None, {name: feeds[name] for name in split.forward_input_names})
        count = len(split.module_output_names)
        return outputs[:count], outputs[count:]

    def run_backward(self, feeds: dict[str, np.ndarray], gradients: list[np.ndarray],
                     stash: list[np.ndarray]) -> list[np.ndarray]:
        split = self.split
        values = list(gradients) + list(stash) + [feeds[name] for name in split.backward_graph_input_names]
        return self.backward.run(None, dict(zip(split.backward_input_names, values)))

    def run(self, feeds, gradients):
        outputs, stash = self.run_forward(feeds)
        return outputs, self.run_backward(feeds, gradients, stash)


# -- checks shared by the test modules -------------------------------------------------------

TOLERANCE = {np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12), np.dtype(np.float32): dict(rtol=1e-5, atol=1e-5)}


def check_against_reference(case: TrainingCase, seed: int = 0) -> tuple[SplitRunner, dict, list]:
    """Split, run both halves on random feeds and gradients, compare with the NumPy reference."""
    from ortagent.graph_split import split_training_graph

    rng = np.random.default_rng(seed)
    split = split_training_graph(case.model)
    runner = SplitRunner(split)
    feeds = case.make_feeds(rng)
    reference_feeds = {name: value.astype(np.float64) if value.dtype.kind == "f" else value
                       for name, value in feeds.items()}
    expected_outputs = case.reference(reference_feeds)
    outputs, stash = runner.run_forward(feeds)
    assert len(outputs) == len(expected_outputs)
    tolerance = TOLERANCE[case.dtype]
    for name, got, want in zip(case.module_output_names, outputs, expected_outputs):
        assert got.shape == np.shape(want), name
        if got.dtype.kind == "f":
            assert got.dtype == case.dtype, name
            np.testing.assert_allclose(got, want, **tolerance, err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
    gradients = case.make_gradients(rng, outputs)
    results = runner.run_backward(feeds, gradients, stash)
    expected = case.reference_gradients(reference_feeds, [g.astype(np.float64) for g in gradients])
    assert len(results) == len(case.graph_output_names)
    for name, got, want in zip(case.graph_output_names, results, expected):
        assert got.shape == np.shape(want), name
        np.testing.assert_allclose(got, want, **tolerance, err_msg=name)
    return runner, feeds, gradients


def check_finite_differences(case: TrainingCase, runner: SplitRunner, feeds: dict, gradients: list,
                             seed: int = 1, eps: float = 1e-6) -> None:
    """<gradient, v> against the central difference of sum_i <g_i, y_i> along a random v."""
    import pytest

    rng = np.random.default_rng(seed)
    results = dict(zip(case.graph_output_names, runner.run(feeds, gradients)[1]))

    def weighted_outputs(values):
        outputs, _ = runner.run_forward(values)
        diff = [out for out, is_diff in zip(outputs, case.differentiable) if is_diff]
        return sum(float(np.sum(g * y)) for g, y in zip(gradients, diff))

    for output_name, input_name in case.gradient_of.items():
        direction = rng.standard_normal(np.shape(feeds[input_name]))
        plus, minus = dict(feeds), dict(feeds)
        plus[input_name] = np.asarray(feeds[input_name] + eps * direction)
        minus[input_name] = np.asarray(feeds[input_name] - eps * direction)
        numeric = (weighted_outputs(plus) - weighted_outputs(minus)) / (2 * eps)
        analytic = float(np.sum(results[output_name] * direction))
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-7), output_name
