"""Tests of ortagent.graph_split: the halves run on stock onnxruntime and match NumPy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ortagent_testkit import training_graphs as tg
from ortagent_testkit.training_graphs import check_against_reference, check_finite_differences
from ortagent.errors import OrtInvalidProtobuf, OrtInvalidType, OrtNoSuchFile, TrainingGraphError
from ortagent.graph_split import TensorInfo, TrainingGraphSplit, split_training_graph

pytest.importorskip("onnxruntime")

def _cases(dtypes=(np.float64,)):
    return [pytest.param(builder, dtype, id=f"{builder.__name__}-{np.dtype(dtype).name}")
            for builder in tg.HAND_BUILT for dtype in dtypes]


# -- running the halves ---------------------------------------------------------------------


@pytest.mark.parametrize("builder,dtype", _cases((np.float64, np.float32)))
def test_halves_match_numpy(builder, dtype):
    check_against_reference(builder(dtype))


@pytest.mark.parametrize("builder,dtype", _cases())
def test_gradients_match_finite_differences(builder, dtype):
    case = builder(dtype)
    if not case.gradient_of:
        pytest.skip("this case's graph outputs are not gradients of a graph input")
    runner, feeds, gradients = check_against_reference(case)
    check_finite_differences(case, runner, feeds, gradients)


def test_control_flow_both_branches():
    case = tg.control_flow_case()
    split = split_training_graph(case.model)
    runner = tg.SplitRunner(split)
    rng = np.random.default_rng(3)
    for flag in (True, False):
        feeds = case.make_feeds(rng)
        feeds["flag"] = np.array(flag)
        outputs, results = runner.run(feeds, [rng.standard_normal(3)])
        np.testing.assert_allclose(outputs[0], case.reference(feeds)[0], rtol=1e-12)


def test_reference_fails_on_wrong_gradient():
    """The comparison can fail: a backward with a wrong rule is caught."""
    case = tg.mul_add_case()
    for node in case.model.graph.node:
        if node.output[0] == "x_grad":
            node.op_type = "Add"
    with pytest.raises(AssertionError):
        check_against_reference(case)


# -- the split's structure --------------------------------------------------------------------


@pytest.mark.parametrize("builder", tg.HAND_BUILT)
def test_stash_and_inputs_are_minimal(builder):
    case = builder()
    split = split_training_graph(case.model)
    assert set(split.stash_names) == case.expected_stash
    assert len(split.stash_names) == len(set(split.stash_names))
    assert list(split.forward_input_names) == case.expected_forward_inputs
    assert list(split.backward_graph_input_names) == case.expected_backward_graph_inputs
    graph_inputs = set(split.graph_input_names)
    constants = {init.name for init in case.model.graph.initializer}
    constants |= {node.output[0] for node in case.model.graph.node if node.op_type == "Constant"}
    assert not set(split.stash_names) & (graph_inputs | constants)


@pytest.mark.parametrize("builder", tg.HAND_BUILT)
def test_model_interfaces(builder):
    case = builder()
    split = split_training_graph(case.model)
    forward, backward = split.forward_model, split.backward_model
    assert [v.name for v in forward.graph.input] == list(split.forward_input_names)
    assert [v.name for v in forward.graph.output] == list(split.module_output_names + split.stash_names)
    assert split.forward_output_names == split.module_output_names + split.stash_names
    assert [v.name for v in backward.graph.input] == list(split.backward_input_names)
    assert split.backward_input_names[: len(split.gradient_names)] == split.gradient_names
    assert [v.name for v in backward.graph.output] == case.graph_output_names
    assert list(split.graph_output_names) == case.graph_output_names
    assert list(split.graph_input_names) == case.input_names
    assert list(split.module_output_names) == case.module_output_names
    for model in (forward, backward):
        assert model.ir_version == case.model.ir_version
        assert all(node.op_type != "YieldOp" for node in model.graph.node)
        assert "com.microsoft" not in {opset.domain for opset in model.opset_import}
        onnx.checker.check_model(model)
    # every input of both halves is typed
    for value in list(forward.graph.input) + list(backward.graph.input):
        assert value.type.tensor_type.elem_type, value.name
    idx = split.forward_input_indices
    assert tuple(split.graph_input_names[i] for i in idx) == split.forward_input_names
    idx = split.backward_graph_input_indices
    assert tuple(split.graph_input_names[i] for i in idx) == split.backward_graph_input_names


def test_gradient_index_mapping_and_types():
    split = split_training_graph(tg.mlp_case().model)
    assert split.non_differentiable_outputs == (1,)
    assert split.full_shape_outputs == (0, 1)
    assert split.gradient_output_indices == (0,)
    assert split.differentiable_output_indices == (0,)
    assert split.gradient_index(0) == 0
    assert split.gradient_index(1) is None
    with pytest.raises(IndexError):
        split.gradient_index(2)
    assert split.module_output_types == (TensorInfo(TensorProto.DOUBLE, (4, 2)), TensorInfo(TensorProto.INT64, (4,)))
    assert split.gradient_types == (TensorInfo(TensorProto.DOUBLE, (4, 2)),)
    assert split.gradient_types[0].numpy_dtype == np.float64
    assert split.gradient_types[0].accepts_shape((4, 2))
    assert not split.gradient_types[0].accepts_shape((2, 4))
    assert split.stash_types == (TensorInfo(TensorProto.DOUBLE, (4, 5)),) * 2
    assert split.graph_output_types[0] == TensorInfo(TensorProto.DOUBLE, (3, 5))
    assert split.graph_input_types[0] == TensorInfo(TensorProto.DOUBLE, (4, 3))
    assert isinstance(split, TrainingGraphSplit)


def test_gradient_without_full_shape_accepts_broadcastable_gradient():
    case = tg.mul_add_case()
    node = next(n for n in case.model.graph.node if n.op_type == "YieldOp")
    for attr in node.attribute:
        if attr.name == "full_shape_outputs":
            del attr.ints[:]
    split = split_training_graph(case.model)
    assert split.gradient_types == (TensorInfo(TensorProto.DOUBLE, None),)
    assert not split.backward_model.graph.input[0].type.tensor_type.HasField("shape")
    runner = tg.SplitRunner(split)
    feeds = case.make_feeds(np.random.default_rng(0))
    _, results = runner.run(feeds, [np.array(0.0)])  # ORTModule's stand-in for a missing gradient
    for result in results:
        assert not result.any()


def test_repeated_module_output_is_listed_twice():
    split = split_training_graph(tg.repeated_output_case().model)
    assert split.module_output_names == ("y", "y")
    assert split.forward_output_names == ("y", "y", "y")
    assert split.gradient_names == ("y_grad_0", "y_grad_1")
    assert split.gradient_output_indices == (0, 1)


def test_constants_copied_to_both_sides():
    split = split_training_graph(tg.constants_both_sides_case().model)
    for model in (split.forward_model, split.backward_model):
        assert "c" in {init.name for init in model.graph.initializer}
        assert any(node.op_type == "Constant" and node.output[0] == "k" for node in model.graph.node)
    assert "k" not in split.stash_names and "c" not in split.stash_names


def test_backward_reads_only_shape_of_forward_value():
    """A Shape node of the backward moves into the forward: the shape is stashed, not the tensor."""
    d = np.float64
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("Tanh", ["h"], ["y"]),
        tg.yield_node(["y"], ["y_grad"], [0]),
        helper.make_node("Shape", ["h"], ["h_shape"]),
        helper.make_node("Mul", ["y_grad", "x"], ["gx"]),
        helper.make_node("Reshape", ["gx", "h_shape"], ["w_grad"]),
        helper.make_node("Neg", ["h"], ["dead"]),  # read by nothing: dropped, h not stashed for it
    ]
    model = tg.make_model(nodes, [tg.tensor("x", d, [2, 3]), tg.tensor("w", d, [2, 3])], [tg.tensor("w_grad", d, [2, 3])])
    split = split_training_graph(model)
    assert split.stash_names == ("h_shape",)
    assert split.stash_types == (TensorInfo(TensorProto.INT64, (2,)),)
    assert "Shape" in [node.op_type for node in split.forward_model.graph.node]
    assert all(node.op_type != "Neg" for model_ in (split.forward_model, split.backward_model) for node in model_.graph.node)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3)), "w": rng.standard_normal((2, 3))}
    g = rng.standard_normal((2, 3))
    _, (w_grad,) = tg.SplitRunner(split).run(feeds, [g])
    np.testing.assert_array_equal(w_grad, g * feeds["x"])


def test_backward_views_what_the_forward_viewed():
    """A view the backward reads (a flattened MatMul input) is computed again in the backward
    from what it views, which is stashed instead: the forward's outputs hold no view, which
    onnxruntime would copy. A view that is a module output is stashed as the output itself."""
    d = np.float64
    nodes = [
        helper.make_node("Tanh", ["x"], ["h"]),                                   # [2, 3, 4]
        helper.make_node("Reshape", ["h", "flat"], ["h2"]),                       # [6, 4]
        helper.make_node("Unsqueeze", ["h2", "axis0"], ["h3"]),                   # [1, 6, 4]
        helper.make_node("MatMul", ["h3", "w"], ["m"]),                           # [1, 6, 5]
        helper.make_node("Squeeze", ["m", "axis0"], ["y"]),                       # [6, 5], a module output
        tg.yield_node(["y"], ["y_grad"], [0]),
        helper.make_node("Unsqueeze", ["y_grad", "axis0"], ["g3"]),
        helper.make_node("Transpose", ["h3"], ["h3t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h3t", "g3"], ["w_grad3"]),
        helper.make_node("Squeeze", ["w_grad3", "axis0"], ["w_grad"]),
        helper.make_node("Mul", ["y", "y"], ["y_sq"]),                              # reads the module output
        helper.make_node("ReduceSum", ["y_sq"], ["s"], keepdims=0),
    ]
    model = tg.make_model(nodes, [tg.tensor("x", d, [2, 3, 4]), tg.tensor("w", d, [4, 5])],
                          [tg.tensor("w_grad", d, [4, 5]), tg.tensor("s", d, [])],
                          [tg.const("flat", [6, 4], np.int64), tg.const("axis0", [0], np.int64)])
    split = split_training_graph(model)
    assert split.stash_names == ("h", "y")
    backward_ops = [node.op_type for node in split.backward_model.graph.node]
    assert "Reshape" in backward_ops and backward_ops.count("Unsqueeze") == 2
    assert "Reshape" in [node.op_type for node in split.forward_model.graph.node]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 4)), "w": rng.standard_normal((4, 5))}
    g = rng.standard_normal((6, 5))
    (y,), (w_grad, s) = tg.SplitRunner(split).run(feeds, [g])
    flat = np.tanh(feeds["x"]).reshape(6, 4)
    np.testing.assert_allclose(y, flat @ feeds["w"], rtol=1e-12)
    np.testing.assert_allclose(w_grad, flat.T @ g, rtol=1e-12)
    np.testing.assert_allclose(s, np.sum(y * y), rtol=1e-12)


def test_graph_output_that_is_an_initializer_and_a_graph_input():
    d = np.float64
    nodes = [helper.make_node("Neg", ["x"], ["y"]), tg.yield_node(["y"], ["y_grad"], [0]),
             helper.make_node("Neg", ["y_grad"], ["x_grad"])]
    model = tg.make_model(nodes, [tg.tensor("x", d, [2])],
                          [tg.tensor("x_grad", d, [2]), tg.tensor("c", d, [2]), tg.tensor("x", d, [2])],
                          [tg.const("c", [1.0, 2.0], d)])
    split = split_training_graph(model)
    assert split.stash_names == ()
    assert split.backward_graph_input_names == ("x",)
    _, results = tg.SplitRunner(split).run({"x": np.array([3.0, 4.0])}, [np.array([1.0, -1.0])])
    np.testing.assert_array_equal(results[0], [-1.0, 1.0])
    np.testing.assert_array_equal(results[1], [1.0, 2.0])
    np.testing.assert_array_equal(results[2], [3.0, 4.0])


def test_module_output_that_is_a_graph_input():
    d = np.float64
    nodes = [tg.yield_node(["x"], ["x_out_grad"], [0]), helper.make_node("Identity", ["x_out_grad"], ["x_grad"])]
    model = tg.make_model(nodes, [tg.tensor("x", d, [2])], [tg.tensor("x_grad", d, [2])])
    split = split_training_graph(model)
    assert split.forward_input_names == ("x",)
    assert split.stash_names == () and split.backward_graph_input_names == ()
    outputs, results = tg.SplitRunner(split).run({"x": np.array([1.0, 2.0])}, [np.array([5.0, 6.0])])
    np.testing.assert_array_equal(outputs[0], [1.0, 2.0])
    np.testing.assert_array_equal(results[0], [5.0, 6.0])


def test_contrib_op_in_backward_keeps_domain_import():
    """A com.microsoft node other than YieldOp keeps the import on its side only."""
    f = np.float32
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]), tg.yield_node(["y"], ["y_grad"], [0]),
             helper.make_node("Gelu", ["y_grad"], ["w_grad"], domain="com.microsoft")]
    model = tg.make_model(nodes, [tg.tensor("x", f, [3]), tg.tensor("w", f, [3])], [tg.tensor("w_grad", f, [3])])
    split = split_training_graph(model)
    assert "com.microsoft" not in {o.domain for o in split.forward_model.opset_import}
    assert "com.microsoft" in {o.domain for o in split.backward_model.opset_import}
    assert split.graph_output_types == (TensorInfo(TensorProto.FLOAT, (3,)),)
    g = np.array([0.5, -1.0, 2.0], dtype=f)
    _, (w_grad,) = tg.SplitRunner(split).run({"x": np.ones(3, f), "w": np.ones(3, f)}, [g])
    from math import erf, sqrt
    np.testing.assert_allclose(w_grad, [v * 0.5 * (1 + erf(v / sqrt(2))) for v in g], rtol=1e-6)


def test_overridable_initializer_input():
    """A graph input that also has an initializer keeps both on each side that reads it."""
    case = tg.mul_add_case()
    case.model.graph.initializer.append(numpy_helper.from_array(np.ones(3), "w"))
    split = split_training_graph(case.model)
    for model in (split.forward_model, split.backward_model):
        assert "w" in {init.name for init in model.graph.initializer}
        assert "w" in {value.name for value in model.graph.input}
    check_against_reference(case)


def test_input_forms(tmp_path):
    model = tg.mlp_case().model
    before = model.SerializeToString()
    from_proto = split_training_graph(model)
    assert model.SerializeToString() == before  # not modified
    from_bytes = split_training_graph(before)
    path = tmp_path / "training.onnx"
    onnx.save(model, path)
    for other in (from_bytes, split_training_graph(path), split_training_graph(str(path))):
        assert other.forward_model.SerializeToString() == from_proto.forward_model.SerializeToString()
        assert other.backward_model.SerializeToString() == from_proto.backward_model.SerializeToString()
        assert other.stash_names == from_proto.stash_names
    with pytest.raises(OrtNoSuchFile):
        split_training_graph(tmp_path / "missing.onnx")
    with pytest.raises(OrtInvalidProtobuf):
        split_training_graph(b"\xff\xff not a model")
    with pytest.raises(OrtInvalidType):
        split_training_graph(42)


# -- validation -------------------------------------------------------------------------------


def _simple(yield_nodes=None, extra_nodes=(), outputs=None, value_info=(), inputs=None):
    """y = x * w, YieldOp, w_grad = y_grad * x: with parts replaceable per test."""
    d = np.float64
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"])]
    nodes += yield_nodes if yield_nodes is not None else [tg.yield_node(["y"], ["y_grad"], [0])]
    nodes += [helper.make_node("Mul", ["y_grad", "x"], ["w_grad"])]
    nodes += list(extra_nodes)
    inputs = inputs if inputs is not None else [tg.tensor("x", d, [3]), tg.tensor("w", d, [3])]
    outputs = outputs if outputs is not None else [tg.tensor("w_grad", d, [3])]
    model = tg.make_model(nodes, inputs, outputs, value_info=value_info)
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    return model


def _ints(name, values):
    return helper.make_attribute(name, list(values), attr_type=AttributeProto.INTS)


def test_simple_model_is_valid():
    split = split_training_graph(_simple())
    assert split.gradient_names == ("y_grad",)


INVALID = {
    "no_yield": (lambda: _simple(yield_nodes=[helper.make_node("Identity", ["y"], ["y_grad"])]),
                 r"no com\.microsoft:YieldOp node.*inference graph cannot be used"),
    "two_yields": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], [0], name="first"),
                                                tg.yield_node(["y"], ["other"], [0], name="second")]),
                   r"2 YieldOp nodes.*'first'.*'second'"),
    "wrong_domain": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], [0], domain="")]),
                     r"domain 'ai\.onnx.*must be in domain 'com\.microsoft'"),
    "other_domain": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], [0], domain="ai.onnx.ml")]),
                     r"domain 'ai\.onnx\.ml'"),
    "missing_full_shape": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], None)]),
                           r"lacks the required attribute 'full_shape_outputs'"),
    "full_shape_not_ints": (lambda: _simple(yield_nodes=[helper.make_node(
        "YieldOp", ["y"], ["y_grad"], domain="com.microsoft", full_shape_outputs=0)]),
        r"'full_shape_outputs' must be a list of ints.*INT"),
    "full_shape_out_of_range": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], [1])]),
                                r"'full_shape_outputs' has index 1, out of range.*1 input"),
    "full_shape_negative": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], [-1])]),
                            r"'full_shape_outputs' has the negative index -1"),
    "full_shape_duplicate": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], [0, 0])]),
                             r"'full_shape_outputs' lists index 0 more than once"),
    "non_diff_out_of_range": (lambda: _simple(yield_nodes=[tg.yield_node(["y", "x"], ["y_grad"], [0], [2])]),
                              r"'non_differentiable_outputs' has index 2, out of range.*2 input"),
    "non_diff_negative": (lambda: _simple(yield_nodes=[tg.yield_node(["y", "x"], ["y_grad"], [0], [-2])]),
                          r"'non_differentiable_outputs' has the negative index -2"),
    "non_diff_duplicate": (lambda: _simple(yield_nodes=[tg.yield_node(["y", "x", "w"], ["y_grad"], [0], [1, 1])]),
                           r"'non_differentiable_outputs' lists index 1 more than once"),
    "count_mismatch": (lambda: _simple(yield_nodes=[tg.yield_node(["y", "x"], ["y_grad"], [0])]),
                       r"2 input\(s\).*0 of them non-differentiable.*needs 2 output\(s\).*has 1"),
    "count_mismatch_non_diff": (lambda: _simple(yield_nodes=[tg.yield_node(["y"], ["y_grad"], [0], [0])]),
                                r"1 of them non-differentiable.*needs 0 output\(s\).*has 1"),
    "no_yield_inputs": (lambda: _simple(yield_nodes=[tg.yield_node([], ["y_grad"], [])]), r"has no inputs"),
    "empty_gradient_name": (lambda: _simple(yield_nodes=[tg.yield_node(["y", "y"], ["y_grad", ""], [0])]),
                            r"output 1 \(a gradient\) has an empty name"),
    "cycle": (lambda: _simple(yield_nodes=[tg.yield_node(["y2"], ["y_grad"], [0])],
                              extra_nodes=[helper.make_node("Add", ["y", "y_grad"], ["y2"])]),
              r"module output 'y2'.*depends on the YieldOp output 'y_grad'.*cycle"),
    "undefined_output": (lambda: _simple(outputs=[tg.tensor("w_grad", np.float64, [3]),
                                                  tg.tensor("nowhere", np.float64, [3])]),
                         r"graph output 'nowhere' cannot be computed"),
    "output_needs_undefined": (lambda: _simple(extra_nodes=[helper.make_node("Add", ["w_grad", "ghost"], ["b_grad"])],
                                               outputs=[tg.tensor("b_grad", np.float64, [3])]),
                               r"graph output 'b_grad' cannot be computed: it needs 'ghost'"),
    "module_output_undefined": (lambda: _simple(yield_nodes=[tg.yield_node(["ghost"], ["y_grad"], [0])]),
                                r"module output 'ghost' \(a YieldOp input\) cannot be computed"),
    "yield_in_subgraph": (lambda: _simple(extra_nodes=[helper.make_node(
        "If", ["cond"], ["branch_out"],
        then_branch=helper.make_graph([tg.yield_node(["y"], ["inner"], [0], name="inner_yield")], "then", [],
                                      [tg.tensor("inner", np.float64, [3])]),
        else_branch=helper.make_graph([helper.make_node("Identity", ["y"], ["other"])], "else", [],
                                      [tg.tensor("other", np.float64, [3])]))]),
        r"'inner_yield' is inside a subgraph of If node"),
    "produced_twice": (lambda: _simple(extra_nodes=[helper.make_node("Neg", ["x"], ["w_grad"])]),
                       r"value 'w_grad' is produced twice"),
    "shadows_input": (lambda: _simple(extra_nodes=[helper.make_node("Neg", ["y"], ["x"])]),
                      r"value 'x' is a graph input and also produced by Neg"),
    "no_outputs": (lambda: _simple(outputs=[]), r"no outputs"),
    "gradient_type_conflict": (lambda: _simple(value_info=[tg.tensor("y_grad", np.float32, [3])]),
                               r"gradient 'y_grad'.*declared as FLOAT.*'y' is DOUBLE"),
    "unknown_module_output_type": (lambda: _simple(yield_nodes=[
        helper.make_node("Opaque", ["x"], ["mystery"], domain="example.custom"),
        tg.yield_node(["mystery"], ["y_grad"], [0])]),
        r"element type of module output 0 'mystery' is unknown"),
    "unknown_non_differentiable_output_type": (lambda: _simple(extra_nodes=[
        helper.make_node("Opaque", ["x"], ["mystery"], domain="example.custom"),
        helper.make_node("Add", ["mystery", "w_grad"], ["m_grad"])],
        yield_nodes=[tg.yield_node(["y", "mystery"], ["y_grad"], [0], [1])],
        outputs=[tg.tensor("m_grad", np.float64, [3])]),
        r"element type of module output 1 'mystery' is unknown"),
    "sequence_crossing": (lambda: _simple(extra_nodes=[
        helper.make_node("SequenceConstruct", ["x", "w"], ["seq"]),
        helper.make_node("SequenceAt", ["seq", "zero_index"], ["picked"]),
        helper.make_node("Add", ["picked", "w_grad"], ["p_grad"]),
        helper.make_node("Constant", [], ["zero_index"], value=numpy_helper.from_array(np.array(0, np.int64)))],
        yield_nodes=[tg.yield_node(["y", "seq"], ["y_grad"], [0], [1])],
        outputs=[tg.tensor("p_grad", np.float64, [3])]),
        r"module output 1 'seq' is a sequence, not a tensor"),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_training_graphs(name):
    build, message = INVALID[name]
    with pytest.raises(TrainingGraphError, match=message):
        split_training_graph(build())


def test_training_graph_error_is_a_value_error():
    with pytest.raises(ValueError):
        split_training_graph(_simple(yield_nodes=[]))


def test_unknown_stash_type_in_forward_node():
    """A stash value of unknown element type (a custom op's second output) is refused."""
    d = np.float64
    nodes = [
        helper.make_node("Opaque", ["x"], ["hidden"], domain="example.custom"),
        helper.make_node("Mul", ["x", "w"], ["y"]),
        helper.make_node("Identity", ["hidden"], ["hidden_copy"]),
        helper.make_node("Add", ["y", "hidden_copy"], ["z"]),
        tg.yield_node(["z"], ["z_grad"], [0]),
        helper.make_node("Mul", ["z_grad", "hidden"], ["w_grad"]),
    ]
    model = tg.make_model(nodes, [tg.tensor("x", d, [3]), tg.tensor("w", d, [3])], [tg.tensor("w_grad", d, [3])],
                          value_info=[tg.tensor("z", d, [3])])
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    with pytest.raises(TrainingGraphError, match=r"element type of stash value 'hidden' is unknown"):
        split_training_graph(model)
