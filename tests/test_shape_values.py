"""Shape values computed once per symbol (ortagent._shape_values), against onnxruntime running the
graph as written, and training graphs built with it against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortagent_testkit import training_graphs as tg
from ortagent._shape_values import share_shape_values
from ortagent.graph_split import split_training_graph
from ortagent.training import build_training_graph

INT64_MAX = np.iinfo(np.int64).max
SIZES = [(1, 1), (2, 3), (3, 5), (0, 2), (4, 1)]


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _heads_nodes(x="x", y="y"):
    """x[n, t, 8] split into two heads of 4 and put back, every shape read at run time as
    torch.onnx writes it: Shape, Gather, Unsqueeze, Concat, and a Slice, a Shape with bounds
    and static arithmetic (2 * 4) on the way back."""
    return [
        helper.make_node("Shape", [x], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n_"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t_"], axis=0),
        helper.make_node("Unsqueeze", ["n_", "ax0"], ["n1"]),
        helper.make_node("Unsqueeze", ["t_", "ax0"], ["t1"]),
        helper.make_node("Concat", ["n1", "t1", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", [x, "target"], ["h"]),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["ht"], ["s2"]),
        helper.make_node("Slice", ["s2", "minus2", "end"], ["tail"]),
        helper.make_node("Shape", ["ht"], ["lead"], start=0, end=1),
        helper.make_node("Gather", ["s2", "i1"], ["n_heads"], axis=0),
        helper.make_node("Gather", ["tail", "minus1"], ["width"], axis=0),
        helper.make_node("Mul", ["n_heads", "width"], ["joined"]),
        helper.make_node("Gather", ["tail", "i0"], ["t_again"], axis=0),
        helper.make_node("Unsqueeze", ["t_again", "ax0"], ["t2"]),
        helper.make_node("Unsqueeze", ["joined", "ax0"], ["joined1"]),
        helper.make_node("Concat", ["lead", "t2", "joined1"], ["back_shape"], axis=0),
        helper.make_node("Transpose", ["ht"], ["hb"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["hb", "back_shape"], [y]),
    ]


def _heads_constants():
    return [_ints("i0", 0), _ints("i1", 1), _ints("ax0", [0]), _ints("heads", [2, 4]), _ints("minus2", [-2]),
            _ints("end", [INT64_MAX]), _ints("minus1", -1)]


def _forward_model():
    """The heads graph, plus what must keep its name: a shape value that is a graph output
    (``dims``), one read by an If branch (``target``), and a NonZero whose count is a symbol
    only its result has."""
    d = np.float32
    then_branch = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["b"])], "then", [],
                                    [tg.tensor("b", d, ["n", "t", 2, 4])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["xn"]),
                                     helper.make_node("Reshape", ["xn", "target"], ["c"])], "else", [],
                                    [tg.tensor("c", d, ["n", "t", 2, 4])])
    nodes = _heads_nodes(y="r") + [
        helper.make_node("Tanh", ["r"], ["y"]),
        helper.make_node("Concat", ["lead", "tail"], ["dims"], axis=0),
        helper.make_node("Equal", ["n_", "n_"], ["always"]),
        helper.make_node("If", ["always"], ["z"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"]),
        helper.make_node("Shape", ["where"], ["where_shape"]),
        helper.make_node("Gather", ["where_shape", "i1"], ["count"], axis=0),
        helper.make_node("Unsqueeze", ["count", "ax0"], ["count1"]),
    ]
    outputs = [tg.tensor("y", d, ["n", "t", 8]), helper.make_tensor_value_info("dims", TensorProto.INT64, [3]),
               tg.tensor("z", d, ["n", "t", 2, 4]), helper.make_tensor_value_info("count1", TensorProto.INT64, [1])]
    return tg.make_model(nodes, [tg.tensor("x", d, ["n", "t", 8])], outputs,
                         _heads_constants() + [tg.const("zero", 0.0, d)], ms_domain=False)


def _run(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _count(model, op_type):
    return sum(node.op_type == op_type for node in model.graph.node)


def test_each_symbol_is_read_once_and_the_results_are_unchanged():
    plain = _forward_model()
    shared = onnx.ModelProto()
    shared.CopyFrom(plain)
    assert share_shape_values(shared) > 0
    onnx.checker.check_model(shared)
    # n and t are read off x (together where both are wanted), and the NonZero's count off its
    # result: each Shape reads the axes wanted only
    reads = [node for node in shared.graph.node if node.op_type == "Shape"]
    assert {node.input[0] for node in reads} == {"x", "where"} and len(reads) <= 3
    assert all({a.name for a in node.attribute} == {"start", "end"} for node in reads)
    assert not any(node.op_type in ("Gather", "Unsqueeze", "Slice", "Mul", "Equal") for node in shared.graph.node)
    assert len(shared.graph.node) < len(plain.graph.node)
    assert {value.name for value in shared.graph.output} == {value.name for value in plain.graph.output}
    rng = np.random.default_rng(0)
    for n, t in SIZES:
        x = rng.standard_normal((n, t, 8)).astype(np.float32)
        for got, want in zip(_run(shared, {"x": x}), _run(plain, {"x": x})):
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(_run(shared, {"x": x})[0], np.tanh(x), rtol=1e-6, atol=1e-7)


def test_a_symbol_known_only_later_is_not_read_early():
    """A shape value whose symbol first appears on a later tensor stays computed as written
    (reading the symbol there would need a value not yet computed)."""
    d = np.float32
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"]),
             helper.make_node("Shape", ["where"], ["ws"]),
             helper.make_node("Concat", ["s", "ws"], ["both"], axis=0)]
    model = tg.make_model(nodes, [tg.tensor("x", d, ["n"])], [helper.make_tensor_value_info("both", TensorProto.INT64, [3])],
                          [tg.const("zero", 0.0, d)], ms_domain=False)
    shared = onnx.ModelProto()
    shared.CopyFrom(model)
    share_shape_values(shared)
    x = np.array([1.0, -1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(_run(shared, {"x": x})[0], _run(model, {"x": x})[0])
    np.testing.assert_array_equal(_run(shared, {"x": x})[0], [3, 1, 2])


@pytest.mark.parametrize("positions, folded", [([1, -2], True), ([3, 3], False)],
                         ids=["scatter", "repeated-index"])
def test_pads_scattered_from_static_comparisons_become_a_constant(positions, folded):
    """Pads as ortagent's slice gradient writes them over symbolic data: a static extent read off
    the data, clamped with Less/Greater/Where, scattered into zeros. The pads become a constant
    (a ScatterElements with a repeated index is left as written, ONNX leaves its result open)."""
    d = np.float32
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
             helper.make_node("Less", ["s", "i3"], ["small"]),
             helper.make_node("Greater", ["s", "i3"], ["large"]),
             helper.make_node("Where", ["small", "s", "i3"], ["low"]),
             helper.make_node("Where", ["large", "i0v", "low"], ["before"]),
             helper.make_node("Sub", ["s", "before"], ["after"]),
             helper.make_node("Concat", ["before", "after"], ["updates"], axis=0),
             helper.make_node("ScatterElements", ["zeros", "positions", "updates"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["y"])]
    model = tg.make_model(nodes, [tg.tensor("x", d, ["n", 2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                          helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
                          [_ints("i3", [3]), _ints("i0v", [0]), _ints("zeros", [0, 0, 0, 0]),
                           _ints("positions", positions)], ms_domain=False)
    shared = onnx.ModelProto()
    shared.CopyFrom(model)
    share_shape_values(shared)
    assert (_count(shared, "ScatterElements") == 0) == folded
    if folded:
        assert not any(node.op_type in ("Less", "Greater", "Where", "Shape") for node in shared.graph.node)
    x = np.arange(8, dtype=d).reshape(4, 2)
    for got, want in zip(_run(shared, {"x": x}), _run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


# -- in training graphs (input_symbols_checked) -------------------------------------------------------

def _trainable_forward(d=np.float64):
    """y = tanh(split_heads(x) * w) put back, w [2, 4] a weight per head and column."""
    nodes = _heads_nodes(y="r")
    heads = next(i for i, node in enumerate(nodes) if node.output[0] == "h")
    nodes.insert(heads + 1, helper.make_node("Mul", ["h", "w"], ["hw"]))
    nodes[heads + 2] = helper.make_node("Transpose", ["hw"], ["ht"], perm=[0, 2, 1, 3])
    nodes.append(helper.make_node("Tanh", ["r"], ["y"]))
    w = np.linspace(-1.5, 1.5, 8).reshape(2, 4).astype(d)
    return tg.make_model(nodes, [tg.tensor("x", d, ["n", "t", 8])], [tg.tensor("y", d, ["n", "t", 8])],
                         _heads_constants() + [numpy_helper.from_array(w, "w")], ms_domain=False), w


@pytest.mark.parametrize("n, t", [size for size in SIZES if 0 not in size])    # (see the note below)
def test_training_graph_reads_each_symbol_once_and_keeps_its_gradients(n, t):
    """Gradients bit for bit those of the graph without the rewrite, and numpy's. (An empty
    batch is left out: onnx-ad's own graph reshapes the empty seed-axis gradient with a -1 and
    fails on it with or without the rewrite.)"""
    forward, w = _trainable_forward()
    checked = build_training_graph(forward, ["w"], input_gradients=["x"], input_symbols_checked=True)
    plain = build_training_graph(forward, ["w"], input_gradients=["x"])
    assert len(checked.graph.node) < len(plain.graph.node)
    # each half reads n and t off its own input x (together where a value has them side by side,
    # alone where it does not), the backward too: the stash keeps no shape for it
    halves = split_training_graph(checked)
    assert _count(halves.forward_model, "Shape") <= 3 and _count(halves.backward_model, "Shape") <= 3
    assert _count(plain, "Shape") > 4
    assert set(halves.stash_names) <= {"h", "y"}
    rng = np.random.default_rng(n * 10 + t)
    x = rng.standard_normal((n, t, 8))
    g = rng.standard_normal((n, t, 8))
    results = [tg.SplitRunner(split_training_graph(model)).run({"x": x, "w": w}, [g]) for model in (checked, plain)]
    (y,), (x_grad, w_grad) = results[0]
    for got, want in zip([y, x_grad, w_grad], [*results[1][0], *results[1][1]]):
        np.testing.assert_array_equal(got, want)
    scaled = x.reshape(n, t, 2, 4) * w
    dy = (g * (1 - np.tanh(scaled.reshape(n, t, 8)) ** 2)).reshape(n, t, 2, 4)
    np.testing.assert_allclose(y, np.tanh(scaled).reshape(n, t, 8), rtol=1e-12)
    np.testing.assert_allclose(x_grad, (dy * w).reshape(n, t, 8), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w_grad, (dy * x.reshape(n, t, 2, 4)).sum(axis=(0, 1)), rtol=1e-10, atol=1e-12)


def test_a_gradient_that_may_be_broadcast_is_not_given_its_output_shape():
    """An output outside ``full_shape_outputs`` may get a gradient of a broadcastable shape: the
    shapes read off it at run time are not replaced by the output's."""
    forward, w = _trainable_forward()
    model = build_training_graph(forward, ["w"], input_gradients=["x"], full_shape_outputs=[],
                                 input_symbols_checked=True)
    n, t = 3, 2
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, t, 8))
    g = rng.standard_normal((1, 1, 8))
    (y,), (x_grad, w_grad) = tg.SplitRunner(split_training_graph(model)).run({"x": x, "w": w}, [g])
    full = np.broadcast_to(g, (n, t, 8))
    scaled = x.reshape(n, t, 2, 4) * w
    dy = (full * (1 - np.tanh(scaled.reshape(n, t, 8)) ** 2)).reshape(n, t, 2, 4)
    np.testing.assert_allclose(x_grad, (dy * w).reshape(n, t, 8), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w_grad, (dy * x.reshape(n, t, 2, 4)).sum(axis=(0, 1)), rtol=1e-10, atol=1e-12)


def test_the_size_of_a_static_tensor_becomes_a_constant():
    """``Size`` of a tensor whose shape is static is a constant (BatchNorm's gradient divides by
    the batch's element count: MobileNetV3-small's training graph had 88 Size nodes at static
    shapes); a Size over a symbolic dimension is left to run. The results are unchanged."""
    nodes = [helper.make_node("Size", ["x"], ["count"]),
             helper.make_node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["x", "count_f"], ["y"]),
             helper.make_node("Size", ["z"], ["z_count"]),
             helper.make_node("Cast", ["z_count"], ["z_count_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["z", "z_count_f"], ["w"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [tg.tensor("x", np.float32, [2, 3, 4]), tg.tensor("z", np.float32, ["n", 3])],
                          [tg.tensor("y", np.float32, [2, 3, 4]), tg.tensor("w", np.float32, ["n", 3])]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    before = model.SerializeToString()
    assert share_shape_values(model) > 0
    assert [node.input[0] for node in model.graph.node if node.op_type == "Size"] == ["z"]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
             "z": rng.standard_normal((5, 3)).astype(np.float32)}
    want = ort.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, e in zip(got, want):
        np.testing.assert_array_equal(a, e)
