"""Tests of ortagent.training.build_training_graph, checked through the split on stock onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ortagent_testkit import training_graphs as tg
from ortagent_testkit.training_graphs import check_against_reference, check_finite_differences
from ortagent.errors import OrtInvalidArgument, OrtInvalidType, OrtNotImplemented
from ortagent.graph_split import split_training_graph
from ortagent.training import build_training_graph

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_ad")


def mlp_forward(dtype=np.float64, seed=0):
    """x [N, 3] -> logits [N, 2] and argmax [N] (int64); W1, b1, W2, b2 are initializers."""
    rng = np.random.default_rng(seed)
    params = {"W1": rng.standard_normal((3, 5)), "b1": rng.standard_normal(5),
              "W2": rng.standard_normal((5, 2)), "b2": rng.standard_normal(2)}
    elem = tg._ELEM[np.dtype(dtype)]
    model = tg.make_model(
        tg.mlp_forward_nodes(), [helper.make_tensor_value_info("x", elem, ["N", 3])],
        [helper.make_tensor_value_info("logits", elem, ["N", 2]),
         helper.make_tensor_value_info("pred", TensorProto.INT64, ["N"])],
        [numpy_helper.from_array(v.astype(dtype), k) for k, v in params.items()], name="mlp", ms_domain=False)
    return model, params


def _yield(model):
    return next(node for node in model.graph.node if node.op_type == "YieldOp")


def _attr(node, name):
    for attr in node.attribute:
        if attr.name == name:
            return list(attr.ints)
    return None


def test_layout_follows_ortmodule():
    forward, params = mlp_forward()
    model = build_training_graph(forward, ["W1", "b1", "W2"], input_gradients=["x"])
    graph = model.graph
    assert [v.name for v in graph.input] == ["x", "W1", "b1", "W2"]
    assert [v.name for v in graph.output] == ["x_grad", "W1_grad", "b1_grad", "W2_grad"]
    assert [init.name for init in graph.initializer if init.name in params] == ["b2"]  # stays an initializer
    node = _yield(model)
    assert node.domain == "com.microsoft"
    assert list(node.input) == ["logits", "pred"]
    assert list(node.output) == ["logits_grad"]
    assert _attr(node, "non_differentiable_outputs") == [1]  # int64 output, automatically
    assert _attr(node, "full_shape_outputs") == [0, 1]
    assert {(o.domain, o.version) for o in model.opset_import} >= {("", tg.OPSET), ("com.microsoft", 1)}
    assert model.ir_version == tg.IR_VERSION
    for value in graph.output:
        assert value.type.tensor_type.elem_type == TensorProto.DOUBLE
    # the forward model is left alone
    assert [v.name for v in forward.graph.input] == ["x"]


def _mlp_reference(f, params, glog):
    h = f["x"] @ f["W1"] + f["b1"]
    r = np.maximum(h, 0)
    logits = r @ f["W2"] + params["b2"]
    dh = (glog @ f["W2"].T) * (h > 0)
    return logits, {"x_grad": dh @ f["W1"].T, "W1_grad": f["x"].T @ dh, "b1_grad": dh.sum(0),
                    "W2_grad": r.T @ glog}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mlp_gradients_match_numpy(dtype):
    forward, params = mlp_forward(dtype)
    model = build_training_graph(forward, ["W1", "b1", "W2"], input_gradients=["x"])
    split = split_training_graph(model)
    runner = tg.SplitRunner(split)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((6, 3)).astype(dtype),
             **{k: params[k].astype(dtype) for k in ("W1", "b1", "W2")}}
    glog = rng.standard_normal((6, 2)).astype(dtype)
    (logits, pred), results = runner.run(feeds, [glog])
    want_logits, want = _mlp_reference({k: v.astype(np.float64) for k, v in feeds.items()}, params,
                                       glog.astype(np.float64))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits, want_logits, **tol)
    np.testing.assert_array_equal(pred, np.argmax(logits, axis=1))
    for name, got in zip(split.graph_output_names, results):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want[name], **tol, err_msg=name)


def test_user_input_order_and_parameter_inputs():
    forward, params = mlp_forward()
    # a parameter that is a graph input (not an initializer), and an extra user input
    forward.graph.input.append(helper.make_tensor_value_info("W1", TensorProto.DOUBLE, [3, 5]))
    forward.graph.initializer.remove(next(i for i in forward.graph.initializer if i.name == "W1"))
    forward.graph.input.append(helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1]))
    model = build_training_graph(forward, ["b2", "W1"], user_inputs=["unused", "x"])
    assert [v.name for v in model.graph.input] == ["unused", "x", "b2", "W1"]
    assert [v.name for v in model.graph.output] == ["b2_grad", "W1_grad"]


def test_parameter_without_gradient_path_gets_zeros():
    d = np.float64
    forward = tg.make_model([helper.make_node("Mul", ["x", "w"], ["y"])], [tg.tensor("x", d, [2])],
                            [tg.tensor("y", d, [2])], [tg.const("w", [2.0, 3.0], d), tg.const("v", [1.0, 1.0, 1.0], d)],
                            ms_domain=False)
    split = split_training_graph(build_training_graph(forward, ["w", "v"]))
    _, (w_grad, v_grad) = tg.SplitRunner(split).run({"x": np.array([1.0, 2.0]), "w": np.array([2.0, 3.0]),
                                                     "v": np.ones(3)}, [np.array([1.0, 1.0])])
    np.testing.assert_array_equal(w_grad, [1.0, 2.0])
    np.testing.assert_array_equal(v_grad, np.zeros(3))


def test_explicit_non_differentiable_output_and_full_shape():
    d = np.float64
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]), helper.make_node("Tanh", ["y"], ["t"])]
    forward = tg.make_model(nodes, [tg.tensor("x", d, [2])], [tg.tensor("y", d, [2]), tg.tensor("t", d, [2])],
                            [tg.const("w", [2.0, 3.0], d)], ms_domain=False)
    model = build_training_graph(forward, ["w"], non_differentiable_outputs=[0], full_shape_outputs=[1])
    node = _yield(model)
    assert list(node.output) == ["t_grad"]
    assert _attr(node, "non_differentiable_outputs") == [0]
    assert _attr(node, "full_shape_outputs") == [1]
    split = split_training_graph(model)
    x = np.array([0.3, -0.2])
    g = np.array([1.0, -2.0])
    _, (w_grad,) = tg.SplitRunner(split).run({"x": x, "w": np.array([2.0, 3.0])}, [g])
    np.testing.assert_allclose(w_grad, g * (1 - np.tanh(x * [2.0, 3.0]) ** 2) * x, rtol=1e-12)


def test_repeated_and_passthrough_outputs():
    """A forward output listed twice and an output that is a graph input still train correctly."""
    d = np.float64
    forward = tg.make_model([helper.make_node("Mul", ["x", "w"], ["y"])], [tg.tensor("x", d, [2])],
                            [tg.tensor("y", d, [2]), tg.tensor("y", d, [2]), tg.tensor("x", d, [2])],
                            [tg.const("w", [2.0, 3.0], d)], ms_domain=False)
    model = build_training_graph(forward, ["w"], input_gradients=["x"])
    split = split_training_graph(model)
    assert len(split.module_output_names) == 3 and len(split.gradient_names) == 3
    x, w = np.array([1.0, 2.0]), np.array([2.0, 3.0])
    g = [np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([10.0, 20.0])]
    outputs, (x_grad, w_grad) = tg.SplitRunner(split).run({"x": x, "w": w}, g)
    np.testing.assert_array_equal(outputs[2], x)
    np.testing.assert_allclose(w_grad, 1.5 * x)
    np.testing.assert_allclose(x_grad, 1.5 * w + g[2])


def test_opset_12_spelling():
    d = np.float32
    forward = tg.make_model([helper.make_node("Mul", ["x", "w"], ["y"])], [tg.tensor("x", d, [2])],
                            [tg.tensor("y", d, [2])], [tg.const("w", [2.0, 3.0], d)], opset=12, ms_domain=False)
    model = build_training_graph(forward, ["w"])
    assert all(n.op_type not in ("Unsqueeze", "Squeeze") or len(n.input) == 1 for n in model.graph.node
               if n.output[0] in ("w_grad",) or n.input[0] in ("y_grad",))
    _, (w_grad,) = tg.SplitRunner(split_training_graph(model)).run(
        {"x": np.array([1.0, 2.0], d), "w": np.array([2.0, 3.0], d)}, [np.ones(2, d)])
    np.testing.assert_array_equal(w_grad, [1.0, 2.0])


ARGUMENT_ERRORS = {
    "unknown_trainable": (dict(trainable=["nope"]), OrtInvalidArgument, r"'nope' is neither an initializer"),
    "duplicate_trainable": (dict(trainable=["W1", "W1"]), OrtInvalidArgument, r"lists 'W1' more than once"),
    "integer_trainable": (dict(trainable=["int_param"]), OrtInvalidArgument, r"'int_param' has element type INT64"),
    "user_inputs_missing": (dict(trainable=["W1"], user_inputs=[]), OrtInvalidArgument, r"missing: \['x'\]"),
    "user_inputs_extra": (dict(trainable=["W1"], user_inputs=["x", "W2"]), OrtInvalidArgument,
                          r"not non-trainable graph inputs: \['W2'\]"),
    "input_gradient_not_user_input": (dict(trainable=["W1"], input_gradients=["W2"]), OrtInvalidArgument,
                                      r"'W2', which is not a user input"),
    "non_diff_out_of_range": (dict(trainable=["W1"], non_differentiable_outputs=[5]), OrtInvalidArgument,
                              r"index 5 is out of range"),
    "full_shape_out_of_range": (dict(trainable=["W1"], full_shape_outputs=[2]), OrtInvalidArgument,
                                r"full_shape_outputs index 2 is out of range"),
    "nothing_to_differentiate": (dict(trainable=[]), OrtInvalidArgument, r"nothing to differentiate"),
}


@pytest.mark.parametrize("name", sorted(ARGUMENT_ERRORS))
def test_argument_errors(name):
    kwargs, error, message = ARGUMENT_ERRORS[name]
    forward, _ = mlp_forward()
    forward.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "int_param"))
    with pytest.raises(error, match=message):
        build_training_graph(forward, **kwargs)


def test_training_graph_as_forward_is_refused():
    with pytest.raises(OrtInvalidArgument, match="already contains a YieldOp"):
        build_training_graph(tg.mul_add_case().model, ["w"])


def test_gradient_name_collision_is_refused():
    d = np.float64
    nodes = [helper.make_node("Mul", ["x", "w"], ["w_grad"])]
    forward = tg.make_model(nodes, [tg.tensor("x", d, [2])], [tg.tensor("w_grad", d, [2])],
                            [tg.const("w", [1.0, 1.0], d)], ms_domain=False)
    with pytest.raises(OrtInvalidArgument, match="'w_grad' is already used"):
        build_training_graph(forward, ["w"])


def test_operator_without_derivative_is_refused():
    """A differentiated value reaching an operator with no rule raises OrtNotImplemented."""
    d = np.float32
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]),
             helper.make_node("MaxRoiPool", ["y", "rois"], ["pooled"], pooled_shape=[1, 1])]
    forward = tg.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                            [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 1, 1, 1])],
                            [tg.const("w", np.ones((1, 1, 2, 2)), d), tg.const("rois", [[0, 0, 0, 1, 1]], d)],
                            ms_domain=False)
    with pytest.raises(OrtNotImplemented, match="MaxRoiPool"):
        build_training_graph(forward, ["w"])


# -- the random family ------------------------------------------------------------------------


def _check_family(seed: int, finite_differences: bool = False) -> None:
    case = tg.random_case(seed)
    runner, feeds, gradients = check_against_reference(case, seed)
    if finite_differences:
        check_finite_differences(case, runner, feeds, gradients, seed)


@pytest.mark.parametrize("seed", range(12))
def test_family_with_finite_differences(seed):
    _check_family(seed, finite_differences=True)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=2**31 - 1))
def test_family_matches_numpy(seed):
    _check_family(seed)


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=0, max_value=2**31 - 1))
def test_family_float32(seed):
    case = tg.random_case(seed, np.float32)
    check_against_reference(case, seed)


# -- the exact rewrites (optimize=True) -------------------------------------------------------------


def _gradients_of(model, case, seed):
    runner = tg.SplitRunner(split_training_graph(model))
    rng = np.random.default_rng(seed)
    feeds = case.make_feeds(rng)
    outputs, stash = runner.run_forward(feeds)
    gradients = case.make_gradients(rng, outputs)
    return outputs, runner.run_backward(feeds, gradients, stash)


def _copies(model):
    return sum(node.op_type in ("Transpose", "Expand") for node in model.graph.node)


@pytest.mark.parametrize("seed", range(12))
def test_rewrites_leave_gradients_unchanged(seed):
    """optimize=True (the default) against onnx-ad's graph as generated: the same outputs and
    gradients (to 1e-12 relative in float64: the rewrites move no element), fewer copies."""
    case = tg.random_case(seed)
    family = tg.random_forward_model(seed)
    plain = build_training_graph(family.model, family.trainable, input_gradients=family.input_gradients,
                                 optimize=False)
    outputs, grads = _gradients_of(case.model, case, seed)
    plain_outputs, plain_grads = _gradients_of(plain, case, seed)
    for got, want in zip(outputs + grads, plain_outputs + plain_grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    assert _copies(case.model) <= _copies(plain)


def test_batched_matmul_against_a_weight_is_flattened():
    """[B, T, K] @ [K, N] is differentiated as a 2-D product: no batched outer product of the
    weight gradient (and the same gradients as without the rewrite, to 1e-6 in float32)."""
    d = np.float32
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 5)).astype(d)
    forward = tg.make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tg.tensor("x", d, [2, 3, 4])],
                            [tg.tensor("y", d, [2, 3, 5])], [numpy_helper.from_array(w, "w")], ms_domain=False)
    models = [build_training_graph(forward, ["w"], input_gradients=["x"], optimize=flag) for flag in (True, False)]
    ranks = []
    for model in models:
        inferred = onnx_shape_inference(model)
        ranks.append(max(len(inferred.get(out, ())) for node in model.graph.node if node.op_type == "MatMul"
                         for out in node.output))
    assert ranks[0] < ranks[1]
    x = rng.standard_normal((2, 3, 4)).astype(d)
    g = rng.standard_normal((2, 3, 5)).astype(d)
    results = [tg.SplitRunner(split_training_graph(model)).run({"x": x, "w": w}, [g])[1] for model in models]
    for got, want, ref in zip(results[0], results[1], [g @ w.T, np.einsum("btk,btn->kn", x, g)]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _yield_stand_ins(model):
    """The graph passes' ``stand_ins`` for a training graph: its YieldOp as Identity nodes."""
    yield_op = _yield(model)
    return {yield_op.name: [helper.make_node("Identity", [i], [o]) for i, o in zip(yield_op.input, yield_op.output)]}


def onnx_shape_inference(model):
    from ortagent._graph_passes import static_shapes

    return static_shapes(model, _yield_stand_ins(model))


def test_weight_gradient_is_written_by_its_matmul():
    """The weight gradient of ``x @ W`` comes out of one MatMul in W's layout: no Transpose of
    the product, and no view copied into the graph output (the MatMul writes W_grad itself)."""
    d = np.float32
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 5)).astype(d)
    forward = tg.make_model([helper.make_node("MatMul", ["x", "W"], ["y"])], [tg.tensor("x", d, [3, 4])],
                            [tg.tensor("y", d, [3, 5])], [numpy_helper.from_array(w, "W")], ms_domain=False)
    model = build_training_graph(forward, ["W"])
    producer = next(node for node in model.graph.node if "W_grad" in node.output)
    assert producer.op_type == "MatMul"
    x = rng.standard_normal((3, 4)).astype(d)
    g = rng.standard_normal((3, 5)).astype(d)
    (w_grad,) = tg.SplitRunner(split_training_graph(model)).run({"x": x, "W": w}, [g])[1]
    np.testing.assert_allclose(w_grad, x.T @ g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("linear", [False, True], ids=["x@W", "x@W^T"])
@pytest.mark.parametrize("rank", [2, 3])
def test_weight_gradient_of_symbolic_activations_is_written_by_its_matmul(rank, linear):
    """The same with symbolic batch (and sequence) sizes, as ORTModule's graphs have them: ONNX's
    inference then knows only one of the product's two dimensions (the flattened activations'
    shape is computed at run time), and the static shape of the output gives the other. No
    Squeeze copy into the output: the MatMul writes W_grad itself. ``x@W^T`` is torch's Linear as
    torch.onnx writes it (a Transpose of the weight, then MatMul): the product comes out in W's
    layout instead of being transposed afterwards."""
    d = np.float32
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 4) if linear else (4, 6)).astype(d)
    dims = ["batch", "time"][:rank - 1]
    nodes = [helper.make_node("MatMul", ["x", "Wt" if linear else "W"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])]
    if linear:
        nodes.insert(0, helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]))
    forward = tg.make_model(nodes, [tg.tensor("x", d, [*dims, 4])], [tg.tensor("y", d, [*dims, 6])],
                            [numpy_helper.from_array(w, "W")], ms_domain=False)
    model = build_training_graph(forward, ["W"], input_gradients=["x"])
    producer = next(node for node in model.graph.node if "W_grad" in node.output)
    assert producer.op_type == "MatMul"
    big_transposes = [node for node in model.graph.node if node.op_type == "Transpose" and len(_perm_of(node)) > 2]
    assert not big_transposes, "the weight gradient is transposed after its product"
    x = rng.standard_normal((2, 3, 4)[3 - rank:]).astype(d)
    g = rng.standard_normal((*x.shape[:-1], 6)).astype(d)
    (y,), (x_grad, w_grad) = tg.SplitRunner(split_training_graph(model)).run({"x": x, "W": w}, [g])
    weight = w.T if linear else w
    dh = g * (1 - np.tanh(x @ weight) ** 2)
    want = x.reshape(-1, 4).T @ dh.reshape(-1, 6)
    np.testing.assert_allclose(w_grad, want.T if linear else want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x_grad, dh @ weight.T, rtol=1e-5, atol=1e-5)


def _perm_of(node) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), [])


def _check_slice_gradient(runner, x, window, rng):
    """The slice's value is x[window]; its gradient the output gradient there, zeros elsewhere."""
    g = rng.standard_normal(x[window].shape)
    (y,), (dx,) = runner.run({"x": x}, [g])
    np.testing.assert_array_equal(y, x[window])
    expected = np.zeros_like(x)
    expected[window] = g
    np.testing.assert_array_equal(dx, expected)


@pytest.mark.parametrize("starts, ends, axes, computed", [
    ([1], [-1], [1], False),                 # trim both ends of a symbolic axis
    ([-3, 0], [100, 2], [1, 0], False),      # a negative start, an end past the extent
    ([0], [-1], [-1], False),                # a negative axis
    ([1], [0], [1], True),                   # starts computed from the data's shape (len - 2)
])
def test_slice_of_symbolic_data_keeps_the_backward_symbolic(starts, ends, axes, computed):
    """A Slice of data without a static shape (onnx-ad's own rule needs one): ortagent's rule
    pads the gradient back with pads computed in the graph, so one training graph serves
    every shape; the gradient is the output gradient in the sliced window, zeros elsewhere."""
    d = np.float64
    nodes = [helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array(axes, np.int64)))]
    if computed:
        # starts = shape(x)[1] - 2, ends = shape(x)[1]: the last two columns
        nodes += [helper.make_node("Shape", ["x"], ["shape"]),
                  helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array([1], np.int64))),
                  helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array([2], np.int64))),
                  helper.make_node("Gather", ["shape", "one"], ["width"], axis=0),
                  helper.make_node("Sub", ["width", "two"], ["starts"]),
                  helper.make_node("Identity", ["width"], ["ends"])]
    else:
        nodes += [helper.make_node("Constant", [], ["starts"], value=numpy_helper.from_array(np.array(starts, np.int64))),
                  helper.make_node("Constant", [], ["ends"], value=numpy_helper.from_array(np.array(ends, np.int64)))]
    nodes.append(helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]))
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["batch", "length"])], [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], [],
                            ms_domain=False)
    runner = tg.SplitRunner(split_training_graph(build_training_graph(forward, [], input_gradients=["x"])))
    rng = np.random.default_rng(0)
    for shape in [(3, 7), (5, 4), (2, 9)]:
        x = rng.standard_normal(shape)
        if computed:
            window = (slice(None), slice(shape[1] - 2, shape[1]))
        else:
            window = [slice(None)] * 2
            for start, end, axis in zip(starts, ends, axes):
                window[axis % 2] = slice(start, end)
            window = tuple(window)
        _check_slice_gradient(runner, x, window, rng)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads, axes", [([2, 1], [1]), ([1, 0, 2, 2], [0, 1]), ([0, 3, 1, 0], [-1, 0])])
def test_copying_pad_modes_are_differentiated(mode, pads, axes):
    """Pad in reflect, edge and wrap mode (onnx-ad differentiates only constant mode): the
    gradient is the transpose of the padding map, here built from numpy.pad (the same modes)
    applied to each basis vector, times the output gradient; on symbolic input shapes."""
    d = np.float64
    nodes = [helper.make_node("Constant", [], ["pads"], value=numpy_helper.from_array(np.array(pads, np.int64))),
             helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array(axes, np.int64))),
             helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], mode=mode)]
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["rows", "columns"])],
                            [tg.tensor("y", d, ["padded_rows", "padded_columns"])], [], opset=18, ms_domain=False)
    runner = tg.SplitRunner(split_training_graph(build_training_graph(forward, [], input_gradients=["x"])))
    rng = np.random.default_rng(1)
    widths = [(0, 0), (0, 0)]
    for position, axis in enumerate(axes):
        widths[axis % 2] = (pads[position], pads[len(axes) + position])
    numpy_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    for shape in [(4, 5), (5, 7)]:         # (reflect needs pads shorter than the axis)
        x = rng.standard_normal(shape)
        expected_y = np.pad(x, widths, mode=numpy_mode)
        g = rng.standard_normal(expected_y.shape)
        basis = np.eye(x.size).reshape(x.size, *shape)
        jacobian = np.stack([np.pad(e, widths, mode=numpy_mode).ravel() for e in basis])   # [x.size, y.size]
        (y,), (dx,) = runner.run({"x": x}, [g])
        np.testing.assert_array_equal(y, expected_y)
        np.testing.assert_allclose(dx, (jacobian @ g.ravel()).reshape(shape), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([0], [100], [1], [2]),                   # x[:, ::2]
    ([-1], [-100], [0], [-1]),                # x[::-1] (flip)
    ([5, 1], [-100, 100], [1, 0], [-2, 3]),   # both axes, a start past the end, negative steps
    ([1, -2], [-1, 0], [0, 1], [1, -1]),      # a step of 1 beside a negative one
])
def test_strided_slice_is_differentiated(starts, ends, axes, steps):
    """Slice with steps other than 1 (onnx-ad refuses them): the gradient is the output
    gradient scattered back to the rows read, against numpy's slicing on symbolic shapes."""
    d = np.float64
    nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))
             for name, values in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    nodes.append(helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"]))
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["rows", "columns"])],
                            [tg.tensor("y", d, ["sliced_rows", "sliced_columns"])], [], ms_domain=False)
    runner = tg.SplitRunner(split_training_graph(build_training_graph(forward, [], input_gradients=["x"])))
    rng = np.random.default_rng(2)
    for shape in [(4, 5), (6, 3)]:
        x = rng.standard_normal(shape)
        window = [slice(None), slice(None)]
        for start, end, axis, step in zip(starts, ends, axes, steps):
            window[axis % 2] = slice(start, end, step)
        window = tuple(window)
        _check_slice_gradient(runner, x, window, rng)


def test_pow_with_an_integer_exponent_is_differentiated_in_its_base():
    """x ** 3 with an int64 exponent (as torch exports x ** 3): d/dx = 3 x^2, and no gradient
    is asked of the exponent."""
    d = np.float64
    nodes = [helper.make_node("Constant", [], ["three"], value=numpy_helper.from_array(np.array(3, np.int64))),
             helper.make_node("Pow", ["x", "three"], ["y"])]
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["rows", 3])], [tg.tensor("y", d, ["rows", 3])], [],
                            ms_domain=False)
    runner = tg.SplitRunner(split_training_graph(build_training_graph(forward, [], input_gradients=["x"])))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3))
    g = rng.standard_normal((4, 3))
    (y,), (dx,) = runner.run({"x": x}, [g])
    np.testing.assert_allclose(y, x ** 3, rtol=1e-12)
    np.testing.assert_allclose(dx, 3 * x ** 2 * g, rtol=1e-12)


def test_sequences_of_fixed_length_are_unrolled_and_differentiated():
    """SequenceConstruct -> SequenceMap (a body per element) -> ConcatFromSequence(new_axis)
    / SequenceAt / SequenceLength, as torch exports hstack and friends: onnx-ad has no rules for
    sequence operators, so the fixed-length sequence is unrolled into tensors first; gradients
    against the closed form, on symbolic shapes."""
    d = np.float64
    body = helper.make_graph([helper.make_node("Mul", ["t", "t"], ["squared"])], "square",
                             [tg.tensor("t", d, ["rows", 3])], [tg.tensor("squared", d, ["rows", 3])])
    nodes = [helper.make_node("SequenceConstruct", ["x", "y"], ["pair"]),
             helper.make_node("SequenceMap", ["pair"], ["squares"], body=body),
             helper.make_node("ConcatFromSequence", ["squares"], ["stacked"], axis=0, new_axis=1),
             helper.make_node("SequenceLength", ["pair"], ["count"]),
             helper.make_node("Cast", ["count"], ["count_float"], to=TensorProto.DOUBLE),
             helper.make_node("Mul", ["stacked", "count_float"], ["z"]),
             helper.make_node("Constant", [], ["last"], value=numpy_helper.from_array(np.array(-1, np.int64))),
             helper.make_node("SequenceAt", ["squares", "last"], ["w"])]
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["rows", 3]), tg.tensor("y", d, ["rows", 3])],
                            [tg.tensor("z", d, [2, "rows", 3]), tg.tensor("w", d, ["rows", 3])], [], ms_domain=False)
    training = build_training_graph(forward, [], input_gradients=["x", "y"])
    assert not any(node.op_type.startswith("Sequence") for node in training.graph.node)
    runner = tg.SplitRunner(split_training_graph(training))
    rng = np.random.default_rng(4)
    for rows in (2, 5):
        x, y = rng.standard_normal((rows, 3)), rng.standard_normal((rows, 3))
        gz, gw = rng.standard_normal((2, rows, 3)), rng.standard_normal((rows, 3))
        (z, w), (dx, dy) = runner.run({"x": x, "y": y}, [gz, gw])
        np.testing.assert_allclose(z, 2 * np.stack([x * x, y * y]), rtol=1e-12)
        np.testing.assert_allclose(w, y * y, rtol=1e-12)
        np.testing.assert_allclose(dx, 2 * 2 * x * gz[0], rtol=1e-12)
        np.testing.assert_allclose(dy, 2 * 2 * y * gz[1] + 2 * y * gw, rtol=1e-12)


def test_module_outputs_keep_their_declared_types():
    """The forward's output declarations survive as the training graph's value_info (the module
    outputs cross the YieldOp; the split needs their types even where shape inference cannot
    find them, e.g. torch's unfold on an empty batch)."""
    d = np.float32
    forward = tg.make_model([helper.make_node("Relu", ["x"], ["y"])], [tg.tensor("x", d, ["batch", 3])],
                            [tg.tensor("y", d, ["batch", 3])], [], ms_domain=False)
    training = build_training_graph(forward, [], input_gradients=["x"])
    declared = {value.name: value for value in training.graph.value_info}
    assert declared["y"] == forward.graph.output[0]


def _product_of_the_others(x, axes):
    """d prod(x over axes) / d x at each element, by brute force: the product of its slice with
    that element replaced by 1 (numpy, no division)."""
    others = np.empty_like(x)
    for position in np.ndindex(*x.shape):
        replaced = x.copy()
        replaced[position] = 1.0
        others[position] = np.broadcast_to(np.prod(replaced, axis=axes, keepdims=True), x.shape)[position]
    return others


@pytest.mark.parametrize("opset, axes, keepdims, noop", [
    (13, [1], 0, 0),              # axes as an attribute
    (13, None, 1, 0),             # every axis, attribute spelling
    (18, [0, 2], 1, 0),           # axes as an input
    (18, [-1], 0, 0),             # a negative axis
    (18, None, 0, 0),             # no axes input: every axis
    (18, None, 1, 1),             # no axes with noop_with_empty_axes: y is x
])
def test_reduce_prod_is_differentiated_exactly_at_zeros(opset, axes, keepdims, noop):
    """ReduceProd's gradient is the product of the other elements of each reduced slice
    (onnx-ad wrote it y / x, inf or NaN at zeros): slices without zeros, with one zero (only it
    gets a gradient) and with two (none does), negative values, on symbolic shapes; against
    numpy by brute force."""
    d = np.float64
    nodes, operands, attributes = [], ["x"], dict(keepdims=keepdims)
    if noop:
        attributes["noop_with_empty_axes"] = 1
    if axes is not None and opset >= 18:
        nodes.append(helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array(axes, np.int64))))
        operands.append("axes")
    elif axes is not None:
        attributes["axes"] = axes
    nodes.append(helper.make_node("ReduceProd", operands, ["y"], **attributes))
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["a", "b", "c"])],
                            [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], [], opset=opset,
                            ms_domain=False)
    runner = tg.SplitRunner(split_training_graph(build_training_graph(forward, [], input_gradients=["x"])))
    rng = np.random.default_rng(4)
    reduced = None if noop else (tuple(a % 3 for a in axes) if axes is not None else (0, 1, 2))
    for shape, zeros in [((3, 4, 5), [(0, 1, 2)]),                                 # one zero
                         ((3, 4, 5), [(0, 1, 2), (1, 2, 2), (2, 3, 4), (2, 3, 0)]),  # one, one, two (same row)
                         ((2, 3, 2), [(0, 0, 0), (1, 2, 1)]),
                         ((2, 3, 2), [])]:
        x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        for position in zeros:
            x[position] = 0.0
        expected_y = x if reduced is None else np.prod(x, axis=reduced, keepdims=bool(keepdims))
        g = rng.standard_normal(expected_y.shape)
        (y,), (dx,) = runner.run({"x": x}, [g])
        np.testing.assert_allclose(y, expected_y, rtol=1e-12)
        if reduced is None:
            np.testing.assert_array_equal(dx, g)
            continue
        g_broadcast = np.broadcast_to(g if keepdims else np.expand_dims(g, reduced), shape)
        expected = g_broadcast * _product_of_the_others(x, reduced)
        assert np.all(np.isfinite(dx))
        np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-15)


def test_an_autodiff_value_named_like_a_gradient_output_is_renamed():
    """The YieldOp's outputs are named ``<output>_grad``, but the autodiff names its own values
    from stems (``conv_grad`` for the outputs of ortagent's ConvGrad): a module output named
    ``conv`` had two values named ``conv_grad``, the input gradient and the output's gradient,
    and one of them was lost without an error."""
    d = np.float32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 5)).astype(d)
    w = rng.standard_normal((4, 3, 3, 3)).astype(d)
    forward = tg.make_model([helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1])],
                            [tg.tensor("x", d, [2, 3, 5, 5])], [tg.tensor("conv", d, [2, 4, 5, 5])],
                            [numpy_helper.from_array(w, "w")], ms_domain=False)
    model = build_training_graph(forward, ["w"], input_gradients=["x"])
    produced = [name for graph_node in model.graph.node for name in graph_node.output if name]
    assert len(produced) == len(set(produced)), sorted({n for n in produced if produced.count(n) > 1})
    g = rng.standard_normal((2, 4, 5, 5)).astype(d)
    (out,), grads = tg.SplitRunner(split_training_graph(model)).run({"x": x, "w": w}, [g])
    torch = pytest.importorskip("torch")
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    expected = torch.nn.functional.conv2d(tx, tw, padding=1)
    expected.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[0], tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads[1], tw.grad.numpy(), rtol=1e-4, atol=1e-4)


# -- broadcasting undone by axes fixed at build time (symbols_above_one) ------------------------------

def _broadcasting_forward(d):
    """x[n, t, 4] against operands broadcast along the symbols and along static 1s: a bias [4],
    a scale [1, 1, 4], a per-sample gate [n, 1, 1] and a per-position weight [t, 4]."""
    nodes = [helper.make_node("Add", ["x", "bias"], ["a"]),
             helper.make_node("Mul", ["a", "scale"], ["b"]),
             helper.make_node("Mul", ["b", "gate"], ["c"]),
             helper.make_node("Sub", ["c", "position"], ["y"])]
    inputs = [tg.tensor("x", d, ["n", "t", 4]), tg.tensor("gate", d, ["n", 1, 1]),
              tg.tensor("position", d, ["t", 4])]
    params = [numpy_helper.from_array(np.linspace(-1, 1, 4).astype(d), "bias"),
              numpy_helper.from_array(np.linspace(0.5, 2, 4).astype(d).reshape(1, 1, 4), "scale")]
    return tg.make_model(nodes, inputs, [tg.tensor("y", d, ["n", "t", 4])], params, ms_domain=False)


@pytest.mark.parametrize("n, t", [(2, 3), (5, 2), (3, 7)])
def test_symbols_above_one_fix_the_broadcast_axes_at_build_time(n, t):
    """With the symbols named (sizes >= 2, as ORTModule guarantees), the backward sums each
    broadcast operand's gradient over axes fixed in the graph (no NonZero, fewer nodes) and
    gives the same gradients as the run-time axes and as numpy."""
    d = np.float64
    forward = _broadcasting_forward(d)
    trainable = ["bias", "scale"]
    grads_of = ["x", "gate", "position"]
    fixed = build_training_graph(forward, trainable, input_gradients=grads_of, symbols_above_one=["n", "t"])
    runtime = build_training_graph(forward, trainable, input_gradients=grads_of)
    assert not any(node.op_type == "NonZero" for node in fixed.graph.node)
    assert any(node.op_type == "NonZero" for node in runtime.graph.node)
    assert len(fixed.graph.node) < len(runtime.graph.node)
    rng = np.random.default_rng(n * 10 + t)
    feeds = {"x": rng.standard_normal((n, t, 4)), "gate": rng.standard_normal((n, 1, 1)),
             "position": rng.standard_normal((t, 4))}
    g = rng.standard_normal((n, t, 4))
    bias = np.linspace(-1, 1, 4)
    scale = np.linspace(0.5, 2, 4).reshape(1, 1, 4)
    expected = {"x": g * scale * feeds["gate"],
                "gate": (g * (feeds["x"] + bias) * scale).sum(axis=(1, 2), keepdims=True),
                "position": -g.sum(axis=0),
                "bias": (g * scale * feeds["gate"]).sum(axis=(0, 1)),
                "scale": (g * (feeds["x"] + bias) * feeds["gate"]).sum(axis=(0, 1), keepdims=True)}
    order = grads_of + trainable
    for model in (fixed, runtime):
        (y,), gradients = tg.SplitRunner(split_training_graph(model)).run(
            {**feeds, "bias": bias, "scale": scale}, [g])
        np.testing.assert_allclose(y, (feeds["x"] + bias) * scale * feeds["gate"] - feeds["position"], rtol=1e-12)
        for name, got in zip(order, gradients):
            assert got.shape == expected[name].shape, name
            np.testing.assert_allclose(got, expected[name], rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("n, t", [(2, 3), (3, 2)])
@pytest.mark.parametrize("above_one", [["n", "t"], ["n"]], ids=["both", "n only"])
def test_flattened_rows_of_symbols_above_one_are_never_broadcast(n, t, above_one):
    """A Linear over [n, t, K] is flattened to a 2-D MatMul of [n*t, K]; when n and t are both
    named at least 2, so is the rows' count, and the input gradient of the flattened operand
    needs no run-time unbroadcasting (Shape, Equal, NonZero and a copying ReduceSum). With t
    not named (it may be 1 or 0), that count is not known to be above one and the run-time
    axes stay. Either way the gradients are numpy's."""
    d = np.float64
    rng = np.random.default_rng(n * 10 + t)
    w = rng.standard_normal((6, 4))
    forward = tg.make_model([helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
                             helper.make_node("MatMul", ["x", "Wt"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
                            [tg.tensor("x", d, ["n", "t", 4])], [tg.tensor("y", d, ["n", "t", 6])],
                            [numpy_helper.from_array(w, "W")], ms_domain=False)
    model = build_training_graph(forward, ["W"], input_gradients=["x"], symbols_above_one=above_one)
    run_time_axes = [node for node in model.graph.node if node.op_type == "NonZero"]
    assert bool(run_time_axes) == (above_one == ["n"])
    x = rng.standard_normal((n, t, 4))
    g = rng.standard_normal((n, t, 6))
    (y,), (x_grad, w_grad) = tg.SplitRunner(split_training_graph(model)).run({"x": x, "W": w}, [g])
    dh = g * (1 - np.tanh(x @ w.T) ** 2)
    np.testing.assert_allclose(y, np.tanh(x @ w.T), rtol=1e-12)
    np.testing.assert_allclose(x_grad, dh @ w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w_grad, dh.reshape(-1, 6).T @ x.reshape(-1, 4), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("symbols", ["n", ["n", 2], 3])
def test_symbols_above_one_must_be_names(symbols):
    with pytest.raises(OrtInvalidType, match="symbols_above_one"):
        build_training_graph(_broadcasting_forward(np.float32), ["bias"], symbols_above_one=symbols)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axes, keepdims, rewritten", [
    ([2], 1, True), ([-2], 0, True), ([0, 2], 1, True),     # the seed axis of 1 after the reduced axis
    ([1], 1, False),                                          # an axis of 5 after it: a strided reduction
    ([3], 1, False),                                          # the unit axis itself reduced
])
def test_fast_reductions(op, opset, axes, keepdims, rewritten):
    """A reduction whose input has only axes of size 1 after the reduced ones reduces a view
    without them (onnxruntime's CPU kernels are many times slower when the innermost axis is
    not reduced), with the same result, shape and values, as the original node, at any size of
    the symbolic axes."""
    import ortagent
    from ortagent._graph_passes import fast_reductions

    d = np.float32
    as_input = opset >= 18 or op == "ReduceSum"
    inputs = ["x", "axes"] if as_input else ["x"]
    attributes = {"keepdims": keepdims} if as_input else {"keepdims": keepdims, "axes": axes}
    nodes = [helper.make_node(op, inputs, ["y"], **attributes), helper.make_node("Identity", ["y"], ["z"])]
    initializers = [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if as_input else []
    model = helper.make_model(
        helper.make_graph(nodes, "g", [tg.tensor("x", d, ["batch", 5, "width", 1])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializers),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    before = model.SerializeToString()
    assert fast_reductions(model) == int(rewritten)
    reduction = next(node for node in model.graph.node if node.op_type == op)
    assert (reduction.input[0] != "x") == rewritten
    rng = np.random.default_rng(3)
    for shape in [(2, 5, 7, 1), (1, 5, 1, 1), (3, 5, 16, 1)]:
        x = rng.standard_normal(shape).astype(d)
        want = ortagent.InferenceSession(before).run(None, {"x": x})[0]
        got = ortagent.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("dtype, axes, keepdims, kernel", [
    (np.float32, [0], 1, True), (np.float32, [1, 0], 0, True), (np.float32, [-4, 1, 2], 1, True),
    (np.float32, [0, 1, 2, 3], 0, True),                   # every axis: a scalar
    (np.float32, [1], 1, False), (np.float32, [0, 2], 1, False),     # not the leading axes
    (np.float64, [0, 1], 1, False),                          # the kernel is float32's
])
def test_fast_reductions_sum_leading_axes_with_the_kernels(opset, dtype, axes, keepdims, kernel):
    """With the CPU kernels, a float32 ReduceSum over the leading axes (negative ones counted
    from the end) is one SumLeadingAxes node writing the same output, declared as ONNX infers it,
    with the ReduceSum as its stand-in for later shape inference, and computing ReduceSum's
    values at any size of the symbolic axes; other reductions stay onnxruntime's."""
    import ortagent
    from ortagent._graph_passes import fast_reductions

    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=keepdims, name="bias_sum"),
             helper.make_node("Identity", ["y"], ["z"])]
    element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = helper.make_model(
        helper.make_graph(nodes, "g", [tg.tensor("x", dtype, ["batch", 5, "width", 1])],
                          [helper.make_tensor_value_info("z", element, None)],
                          [numpy_helper.from_array(np.array(axes, np.int64), "axes")]),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    before = model.SerializeToString()
    stand_ins: dict = {}
    fast_reductions(model, stand_ins, kernel=True)
    kernels = [node for node in model.graph.node if node.op_type == "SumLeadingAxes"]
    assert len(kernels) == int(kernel)
    if kernel:
        assert kernels[0].output[0] == "y" and kernels[0].name == "bias_sum"
        assert [node.op_type for node in stand_ins["bias_sum"]] == ["ReduceSum"]
        assert "y" in {value.name for value in model.graph.value_info}
        assert any(entry.domain == "ai.ortagent.cpu" for entry in model.opset_import)
    options = ortagent.SessionOptions()
    options.add_cpu_training_kernels()
    rng = np.random.default_rng(4)
    for shape in [(2, 5, 7, 1), (1, 5, 1, 1), (70, 5, 16, 1)]:
        x = rng.standard_normal(shape).astype(dtype)
        want = ortagent.InferenceSession(before).run(None, {"x": x})[0]
        got = ortagent.InferenceSession(model.SerializeToString(), options).run(None, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- gradients written in the layout their product computes (gradient_views) --------------------------

@pytest.mark.parametrize("group, w_shape", [(1, (4, 3, 3, 3)), (1, (5, 3, 1, 1)), (3, (6, 1, 3, 3))],
                         ids=["3x3", "1x1", "depthwise"])
def test_gradient_views_let_the_product_write_the_weight_gradient(group, w_shape):
    """With gradient_views, a convolution's weight gradient is the graph output of the product
    that computes it, in that product's shape (the same elements in W's row-major order), where
    otherwise a Reshape copies it into W's shape; the values are the same."""
    d = np.float32
    rng = np.random.default_rng(sum(w_shape) + group)
    w = rng.standard_normal(w_shape).astype(d)
    pads = [1, 1, 1, 1] if w_shape[2] == 3 else [0, 0, 0, 0]
    forward = tg.make_model([helper.make_node("Conv", ["x", "W"], ["c"], pads=pads, group=group,
                                              kernel_shape=list(w_shape[2:])),
                             helper.make_node("Tanh", ["c"], ["y"])],
                            [tg.tensor("x", d, ["n", 3, 5, 6])], [tg.tensor("y", d, ["n", w_shape[0], 5, 6])],
                            [numpy_helper.from_array(w, "W")], ms_domain=False)
    viewed = build_training_graph(forward, ["W"], input_gradients=["x"], gradient_views=True)
    plain = build_training_graph(forward, ["W"], input_gradients=["x"])
    declared = {value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in viewed.graph.output}
    assert [value.type.tensor_type.shape.dim[-1].dim_value for value in plain.graph.output if value.name == "W_grad"] \
        == [w_shape[-1]]
    producer = next(node for node in viewed.graph.node if "W_grad" in node.output)
    if group == 1:      # the window product: one Gemm in [Cout, Cin*k*k]
        assert producer.op_type == "Gemm" and declared["W_grad"] == [w_shape[0], int(np.prod(w_shape[1:]))]
    assert int(np.prod(declared["W_grad"])) == w.size
    x = rng.standard_normal((2, 3, 5, 6)).astype(d)
    g = rng.standard_normal((2, w_shape[0], 5, 6)).astype(d)
    got = tg.SplitRunner(split_training_graph(viewed)).run({"x": x, "W": w}, [g])
    want = tg.SplitRunner(split_training_graph(plain)).run({"x": x, "W": w}, [g])
    np.testing.assert_array_equal(got[0][0], want[0][0])
    np.testing.assert_array_equal(got[1][0], want[1][0])
    np.testing.assert_array_equal(got[1][1].reshape(w_shape), want[1][1])


# -- Softmax of -inf-masked scores (masked_softmax_in_parts) --------------------------------------------

def _masked_softmax_model(opset, filled, axis, filler, dtype):
    elem = tg._ELEM[np.dtype(dtype)]
    operands = ["mask", "filler", "s"] if filled == 1 else ["mask", "s", "filler"]
    nodes = [helper.make_node("Where", operands, ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=axis)]
    return helper.make_model(
        helper.make_graph(nodes, "g", [tg.tensor("s", dtype, ["b", 3, "n", "n"]),
                                       helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", "n"])],
                          [helper.make_tensor_value_info("y", elem, None)],
                          [numpy_helper.from_array(np.array(filler, dtype), "filler")]),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("filled, axis", [(1, -1), (2, -1), (1, 2)])
def test_masked_softmax_is_computed_without_the_masked_exponentials(filled, axis, opset, dtype, kernel):
    """A Softmax of ``Where(mask, -inf, s)`` becomes its parts (no Softmax node left), or with
    the CPU kernels one ``MaskedSoftmax`` where it is float32 over the last axis, with the
    original node's values as onnxruntime computes them: the same zeros at masked positions, NaN
    in a row masked entirely, and -inf or +inf scores giving what they gave."""
    import ortagent
    from ortagent._graph_passes import masked_softmax_in_parts

    model = _masked_softmax_model(opset, filled, axis, -np.inf, dtype)
    before = model.SerializeToString()
    assert masked_softmax_in_parts(model, kernel=kernel) == 1
    assert not any(node.op_type == "Softmax" for node in model.graph.node)
    fused = kernel and dtype == np.float32 and axis == -1
    assert [node.op_type for node in model.graph.node][-1] == ("MaskedSoftmax" if fused else "Div")
    options = ortagent.SessionOptions()
    options.add_cpu_training_kernels()
    rng = np.random.default_rng(opset + filled)
    for b, n in [(2, 5), (1, 1), (3, 8)]:
        s = (rng.standard_normal((b, 3, n, n)) * 4).astype(dtype)
        mask = ~np.tril(np.ones((n, n), bool)) if filled == 1 else np.tril(np.ones((n, n), bool))
        s[0, 0, 0, 0] = -np.inf                      # an unmasked -inf score
        if n > 2:
            s[-1, 1, 2, 1] = np.inf                  # and a +inf one
            masked_row = ~np.zeros(n, bool) if filled == 1 else np.zeros(n, bool)
            mask[1] = masked_row                     # a row masked entirely (axis -1)
        want = ortagent.InferenceSession(before).run(None, {"s": s, "mask": mask})[0]
        got = ortagent.InferenceSession(model.SerializeToString(), options).run(None, {"s": s, "mask": mask})[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got == 0, want == 0)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("filler", [np.finfo(np.float32).min, np.inf, 0.0])
def test_softmax_of_a_finite_mask_keeps_its_node(filler):
    """finfo.min (HF's additive masks): a row masked entirely is uniform, not 0, so the node stays."""
    from ortagent._graph_passes import masked_softmax_in_parts

    model = _masked_softmax_model(17, 1, -1, filler, np.float32)
    assert masked_softmax_in_parts(model) == 0
    assert [node.op_type for node in model.graph.node] == ["Where", "Softmax"]


def test_masked_softmaxes_share_their_constants():
    """Attention layers share one zero per element type and one axes operand per axis, not a
    pair of initializers per Softmax; the values are each Softmax's own."""
    import ortagent
    from ortagent._graph_passes import masked_softmax_in_parts

    model = _masked_softmax_model(18, 1, -1, -np.inf, np.float32)
    graph = model.graph
    graph.node.extend([helper.make_node("Mul", ["t", "two"], ["t2"]),
                       helper.make_node("Softmax", ["t2"], ["y2"], axis=-1),
                       helper.make_node("Where", ["mask", "filler", "y2"], ["t3"]),
                       helper.make_node("Softmax", ["t3"], ["y3"], axis=-1),
                       helper.make_node("Where", ["mask", "filler", "y3"], ["t4"]),
                       helper.make_node("Softmax", ["t4"], ["y4"], axis=2)])
    graph.initializer.append(numpy_helper.from_array(np.array(2, np.float32), "two"))
    graph.output.extend([helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y4",)])
    before = model.SerializeToString()
    assert masked_softmax_in_parts(model) == 3          # (t2 is not a Where: its Softmax stays)
    added = [init.name for init in graph.initializer if init.name.startswith("ortagent_softmax")]
    assert sorted(name.rsplit("_", 1)[0] if name[-1].isdigit() else name for name in added) == \
        ["ortagent_softmax_axis", "ortagent_softmax_axis", "ortagent_softmax_zero"], added
    rng = np.random.default_rng(3)
    s = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    mask = ~np.tril(np.ones((5, 5), bool))
    want = ortagent.InferenceSession(before).run(None, {"s": s, "mask": mask})
    got = ortagent.InferenceSession(model.SerializeToString()).run(None, {"s": s, "mask": mask})
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-12)


def test_masked_softmax_in_a_training_graph():
    """Causal attention scores through the training graph: outputs and gradients of the
    rewritten graph against onnx-ad's graph as generated (optimize=False keeps the Softmax)."""
    d = np.float32
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((4, 4)) * 0.5).astype(d)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "xt"], ["s"]),
             helper.make_node("Where", ["mask", "minus_inf", "s"], ["t"]),
             helper.make_node("Softmax", ["t"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"])]
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["b", "n", 4]),
                                    helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", "n"])],
                            [tg.tensor("y", d, ["b", "n", 4])],
                            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(-np.inf, d), "minus_inf")],
                            ms_domain=False)
    models = [build_training_graph(forward, ["w"], input_gradients=["x"], optimize=flag) for flag in (True, False)]
    assert [sum(node.op_type == "Softmax" for node in model.graph.node) for model in models] == [0, 1]
    x = rng.standard_normal((2, 6, 4)).astype(d)
    mask = ~np.tril(np.ones((6, 6), bool))
    g = rng.standard_normal((2, 6, 4)).astype(d)
    results = [tg.SplitRunner(split_training_graph(model)).run({"x": x, "w": w, "mask": mask}, [g])
               for model in models]
    for got, want in zip([*results[0][0], *results[0][1]], [*results[1][0], *results[1][1]]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- Sum of zero-padded pieces as a Concat (simplify_copies) -------------------------------------------

def _padded_sum_model(pieces, fill=0.0, mode="constant"):
    """Sum over ``pieces`` [(input length along axis 1, pads before, pads after)] of Pad(x_i)."""
    d = np.float32
    nodes, inputs, inits = [], [], [numpy_helper.from_array(np.array(fill, d), "fill")]
    for index, (length, before, after) in enumerate(pieces):
        inputs.append(tg.tensor(f"x{index}", d, ["b", length, 3]))
        inits.append(numpy_helper.from_array(np.array([0, before, 0, 0, after, 0], np.int64), f"pads{index}"))
        nodes.append(helper.make_node("Pad", [f"x{index}", f"pads{index}", "fill"], [f"p{index}"], mode=mode))
    nodes.append(helper.make_node("Sum", [f"p{index}" for index in range(len(pieces))], ["y"]))
    return helper.make_model(helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                               inits), opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("pieces, fill, mode, concatenated", [
    ([(1, 0, 2), (1, 1, 1), (1, 2, 0)], 0.0, "constant", True),      # unbind's gradient
    ([(2, 3, 0), (3, 0, 2)], 0.0, "constant", True),                 # out of order, uneven
    ([(1, 0, 2), (1, 2, 0)], 0.0, "constant", False),                # a gap
    ([(2, 0, 1), (2, 1, 0)], 0.0, "constant", False),                # an overlap
    ([(1, 0, 1), (1, 1, 0)], 1.0, "constant", False),                # padded with ones
    ([(1, 0, 1), (1, 1, 0)], 0.0, "edge", False),                    # not zeros
])
def test_sum_of_padded_pieces_becomes_a_concat(pieces, fill, mode, concatenated):
    """A Sum of pieces zero-padded along one axis that tile it is their Concat, with the same
    values; gaps, overlaps and other padding are left as they are."""
    import ortagent
    from ortagent._graph_passes import simplify_copies

    model = _padded_sum_model(pieces, fill, mode)
    before = model.SerializeToString()
    simplify_copies(model)
    kinds = [node.op_type for node in model.graph.node]
    assert (kinds == ["Concat"]) == concatenated, kinds
    rng = np.random.default_rng(len(pieces))
    for batch in (1, 4):
        feeds = {f"x{index}": rng.standard_normal((batch, length, 3)).astype(np.float32)
                 for index, (length, _, _) in enumerate(pieces)}
        want = ortagent.InferenceSession(before).run(None, feeds)[0]
        got = ortagent.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("linear", [False, True], ids=["x@W", "x@W^T"])
def test_simplify_copies_finishes_the_products_in_one_round(linear):
    """One round of simplify_copies leaves nothing for a second: the weight gradient's product
    that a Transpose rewritten in the round (or a view removed at its end) completes is written
    in the same round, and its operand transposes cancel the ones already there (torch's Linear,
    ``x@W^T``, took three rounds). The same gradients as the graph as generated."""
    from ortagent._graph_passes import simplify_copies

    d = np.float32
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 4) if linear else (4, 6)).astype(d)
    nodes = [helper.make_node("MatMul", ["x", "Wt" if linear else "W"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])]
    if linear:
        nodes.insert(0, helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]))
    forward = tg.make_model(nodes, [tg.tensor("x", d, [3, 4])], [tg.tensor("y", d, [3, 6])],
                            [numpy_helper.from_array(w, "W")], ms_domain=False)
    generated = build_training_graph(forward, ["W"], input_gradients=["x"], optimize=False)
    model = build_training_graph(forward, ["W"], input_gradients=["x"], optimize=False)
    stand_ins = _yield_stand_ins(model)
    assert simplify_copies(model, stand_ins, rounds=1) > 0
    assert simplify_copies(model, stand_ins, rounds=1) == 0
    assert next(node for node in model.graph.node if "W_grad" in node.output).op_type == "MatMul"
    x = rng.standard_normal((3, 4)).astype(d)
    g = rng.standard_normal((3, 6)).astype(d)
    got, want = [tg.SplitRunner(split_training_graph(graph)).run({"x": x, "W": w}, [g])[1]
                 for graph in (model, generated)]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_unbind_gradient_is_a_concat():
    """``q, k, v = x.unbind(1)`` as Slice + Squeeze: the gradient of x is one Concat of the three
    slices' gradients (no Pad), equal to the graph as generated."""
    d = np.float32
    nodes, inits = [], [numpy_helper.from_array(np.array([1], np.int64), "axis")]
    for index, name in enumerate("qkv"):
        inits += [numpy_helper.from_array(np.array([index], np.int64), f"start{index}"),
                  numpy_helper.from_array(np.array([index + 1], np.int64), f"end{index}")]
        nodes += [helper.make_node("Slice", ["x", f"start{index}", f"end{index}", "axis"], [f"{name}_slice"]),
                  helper.make_node("Squeeze", [f"{name}_slice", "axis"], [name])]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    forward = tg.make_model(nodes, [tg.tensor("x", d, [4, 3, 5])], [tg.tensor("y", d, [4, 5])], inits,
                            ms_domain=False)
    models = [build_training_graph(forward, [], input_gradients=["x"], optimize=flag) for flag in (True, False)]
    kinds = [[node.op_type for node in model.graph.node] for model in models]
    assert "Pad" not in kinds[0] and "Concat" in kinds[0] and "Pad" in kinds[1]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 5)).astype(d)
    g = rng.standard_normal((4, 5)).astype(d)
    (got,), (want,) = [tg.SplitRunner(split_training_graph(model)).run({"x": x}, [g])[1] for model in models]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np.stack([g * x[:, 1], g * x[:, 0], g], axis=1), rtol=1e-6)


# -- LayerNormalization's gradient from the statistics its forward reports -------------------------------

def _layer_norm_reference(x, scale, bias, dy, axis, eps):
    """dX, dScale, dB of LayerNormalization, in float64 numpy."""
    axes = tuple(range(axis, x.ndim))
    lead = tuple(range(axis))
    mean = x.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    x_hat = (x - mean) * inv_std
    g = dy * scale
    dx = inv_std * (g - g.mean(axis=axes, keepdims=True) - x_hat * (g * x_hat).mean(axis=axes, keepdims=True))
    return dx, (dy * x_hat).sum(axis=lead), dy.sum(axis=lead)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis, bias", [(-1, True), (1, True), (2, False)])
def test_layer_norm_gradient_reads_the_forward_statistics(axis, bias, dtype):
    """A float32 LayerNormalization reports its Mean and InvStdDev, and the backward reads them
    instead of computing the statistics again (two ReduceMeans per LayerNorm, not four); float64
    keeps onnx-ad's rule. Gradients against numpy in float64."""
    rng = np.random.default_rng(abs(axis) + 3 * bias)
    shape = (3, 4, 5)
    normalized = shape[axis % 3:]
    scale = (rng.standard_normal(normalized) + 1).astype(dtype)
    b = rng.standard_normal(normalized).astype(dtype)
    inputs = ["x", "scale", "b"] if bias else ["x", "scale"]
    forward = tg.make_model([helper.make_node("LayerNormalization", inputs, ["y"], axis=axis, epsilon=1e-3)],
                            [tg.tensor("x", dtype, ["n", 4, 5])], [tg.tensor("y", dtype, ["n", 4, 5])],
                            [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(b, "b")][:len(inputs) - 1],
                            ms_domain=False, opset=17)
    model = build_training_graph(forward, inputs[1:], input_gradients=["x"])
    norm = next(node for node in model.graph.node if node.op_type == "LayerNormalization")
    split = split_training_graph(model)
    reductions = sum(node.op_type == "ReduceMean" for node in split.backward_model.graph.node)
    if dtype == np.float32:
        assert len([name for name in norm.output if name]) == 3 and reductions == 2
    else:
        assert len([name for name in norm.output if name]) == 1 and reductions == 4
    x = rng.standard_normal(shape).astype(dtype) * 2 + 1
    dy = rng.standard_normal(shape).astype(dtype)
    feeds = {"x": x, "scale": scale, "b": b}
    outputs, grads = tg.SplitRunner(split).run({k: feeds[k] for k in inputs}, [dy])
    want = _layer_norm_reference(x.astype(np.float64), scale.astype(np.float64), None, dy.astype(np.float64),
                                 axis % 3, 1e-3)
    tolerance = 2e-5 if dtype == np.float32 else 1e-10
    assert len(grads) == len(inputs)            # (x's first, then the trainables in order)
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


# -- gradients of outputs outside full_shape_outputs ------------------------------------------------------

def _broadcast_gradient_forward(kind, d=np.float64):
    rng = np.random.default_rng(7)
    w, b = rng.standard_normal((4, 5)), rng.standard_normal(5)
    nodes = {"bias": [helper.make_node("Add", ["x", "b"], ["y"])],
             "matmul": [helper.make_node("MatMul", ["x", "w"], ["y"])],
             "transpose": [helper.make_node("MatMul", ["x", "w"], ["h"]),
                           helper.make_node("Transpose", ["h"], ["y"], perm=[1, 0])],
             "flatten": [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "flat"], ["y"])]}[kind]
    width = 5 if kind == "bias" else 4
    y_shape = {"bias": ["n", 5], "matmul": ["n", 5], "transpose": [5, "n"], "flatten": ["m"]}[kind]
    forward = tg.make_model(nodes, [tg.tensor("x", d, ["n", width])], [tg.tensor("y", d, y_shape)],
                            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                             numpy_helper.from_array(np.array([-1], np.int64), "flat")], ms_domain=False)
    return forward, {"w": w, "b": b}, width, ["b"] if kind == "bias" else ["w"]


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "as-generated"])
@pytest.mark.parametrize("kind", ["bias", "matmul", "transpose", "flatten"])
def test_a_broadcast_gradient_is_expanded_to_its_output(kind, optimize):
    """An output outside full_shape_outputs may get a gradient that only broadcasts to it (a
    scalar, a row): the results are those of the gradient broadcast to the output's shape. The
    autodiff's rules take every seed for full-shaped: before, a bias's gradient summed the
    gradient's one row instead of the output's three, and products and views of the gradient
    failed in onnxruntime."""
    forward, params, width, trainable = _broadcast_gradient_forward(kind)
    model = build_training_graph(forward, trainable, input_gradients=["x"], full_shape_outputs=[], optimize=optimize)
    runner = tg.SplitRunner(split_training_graph(model))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, width))
    feeds = {"x": x, **{name: params[name] for name in trainable}}
    (y,), _ = runner.run(feeds, [np.ones((3, 5)).T if kind == "transpose" else np.ones(15 if kind == "flatten" else (3, 5))])
    shapes = [(), (1,)] + ([(1, 1), (1, y.shape[1]), (y.shape[0], 1)] if y.ndim == 2 else [])
    for shape in shapes:
        g = rng.standard_normal(shape)
        _, got = runner.run(feeds, [g])
        _, want = runner.run(feeds, [np.ascontiguousarray(np.broadcast_to(g, y.shape))])
        for a, e in zip(got, want):
            assert a.shape == e.shape
            np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12)


# -- pools of ceil_mode=1 at onnxruntime's sizes (pools_at_onnxruntime_sizes) -------------------------------

_CEIL_POOLS = [
    # (op, input shape, attributes, what becomes of it: "fixed" where ONNX's rule below opset 22
    # counts one window more than onnxruntime's kernel writes, "agree" where both count the same)
    ("AveragePool", [1, 2, 5, 6, 7], dict(kernel_shape=[2, 3, 2], strides=[2, 2, 3], pads=[1, 0, 1, 1, 0, 1],
                                          count_include_pad=0), "fixed"),
    ("AveragePool", [1, 2, 10, 11], dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1],
                                         count_include_pad=1), "fixed"),
    ("MaxPool", [1, 1, 5, 5], dict(kernel_shape=[2, 2], strides=[3, 3], pads=[1, 1, 1, 1], dilations=[2, 2]), "fixed"),
    ("LpPool", [1, 2, 5, 5], dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], p=2), "fixed"),
    ("AveragePool", [1, 2, 9, 9], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "agree"),
    # a stride longer than the kernel: the last window ends inside the input, no pads express it
    ("MaxPool", [1, 1, 6, 6], dict(kernel_shape=[1, 1], strides=[4, 4]), "left"),
]


@pytest.mark.parametrize("op_type, shape, attributes, outcome", _CEIL_POOLS)
def test_ceil_mode_pools_get_pads_under_which_onnx_counts_the_kernels_windows(op_type, shape, attributes, outcome):
    """At static shapes, ONNX's inference below opset 22 counts a last window starting in the end
    padding that onnxruntime's kernel drops; the new pads make the two agree, with the same
    values (count_include_pad's divisors included)."""
    import onnx

    import ortagent
    from ortagent._graph_passes import pools_at_onnxruntime_sizes

    node = helper.make_node(op_type, ["x"], ["y"], ceil_mode=1, **attributes)
    model = helper.make_model(
        helper.make_graph([node], "g", [tg.tensor("x", np.float32, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    before = model.SerializeToString()
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    (want,) = ortagent.InferenceSession(before).run(None, {"x": x})

    def inferred(m):
        out = onnx.shape_inference.infer_shapes(m).graph.output[0]
        return tuple(d.dim_value for d in out.type.tensor_type.shape.dim)

    assert (inferred(model) == want.shape) == (outcome == "agree")
    assert pools_at_onnxruntime_sizes(model) == (outcome == "fixed")
    (got,) = ortagent.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
    assert (inferred(model) == want.shape) == (outcome != "left")
    if outcome != "fixed":
        assert model.SerializeToString() == before


def test_an_unbatched_loss_beside_a_constant_node_gets_its_batch():
    """batch_unbatched_losses reads only the loss nodes' inputs: a graph holding a Constant node
    (no inputs) failed with an IndexError before; the loss of one unbatched sample is
    torch's/numpy's."""
    import ortagent
    from ortagent._graph_passes import batch_unbatched_losses

    nodes = [helper.make_node("Constant", [], ["shift"], value=numpy_helper.from_array(np.float32(0.5))),
             helper.make_node("Add", ["x", "shift"], ["scores"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "target"], ["loss"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [tg.tensor("x", np.float32, [5]),
                                       helper.make_tensor_value_info("target", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    assert batch_unbatched_losses(model) == 1
    x = np.array([0.3, -1.2, 2.0, 0.1, 0.7], np.float32)
    (loss,) = ortagent.InferenceSession(model.SerializeToString()).run(None, {"x": x, "target": np.int64(2)})
    scores = x.astype(np.float64) + 0.5
    expected = -(scores[2] - np.log(np.exp(scores).sum()))
    assert loss.shape == () and abs(float(loss) - expected) < 1e-6


# -- Transposes that move unit axes with others (transposes_without_unit_axes) -------------------------

@pytest.mark.parametrize("shape, perm, rewritten", [
    ([16, 32, 4, 16, 1], [4, 0, 2, 1, 3], 1),        # attention's gradient, the seed axis moved to the front
    (["b", "t", 4, 16, 1], [4, 0, 2, 1, 3], 1),      # the same at symbolic sizes
    ([2, 576, 1, 2, 2], [2, 1, 0, 3, 4], 1),         # a depthwise convolution's gradient
    ([1, 6, 1, 4], [3, 2, 0, 1], 1),
    ([2, 576, 1, 2, 2], [1, 2, 0, 3, 4], 0),         # moves one axis already
    ([16, 32, 4, 16, 1], [0, 2, 1, 3, 4], 1),        # so does this one, but the seed axis stays last
    ([2, 1, 3, 1, 5], [4, 3, 2, 1, 0], 0),           # the others alone still move several
    ([3, 1, 4], [1, 0, 2], 0),                       # moves only the unit axis: left to simplify_copies
])
def test_transposes_of_unit_axes_move_the_others_alone(shape, perm, rewritten):
    """A Transpose whose unit axes make a move of one axis one of several becomes a view without
    them, the Transpose of the other axes and a view to the output's shape; the result is the
    same array, and other Transposes stay."""
    import ortagent
    from ortagent._graph_passes import transposes_without_unit_axes

    model = helper.make_model(
        helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], perm=perm)], "g",
                          [tg.tensor("x", np.float32, shape)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    assert transposes_without_unit_axes(model) == rewritten
    if rewritten:
        transposes = [node for node in model.graph.node if node.op_type == "Transpose"]
        assert len(transposes) == 1 and len(transposes[0].attribute[0].ints) == sum(d != 1 for d in shape)
    sizes = {"b": 3, "t": 5}
    x = np.random.default_rng(0).standard_normal([sizes.get(d, d) for d in shape]).astype(np.float32)
    (y,) = ortagent.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.transpose(perm))


# -- the seed axis taken off and put back (seed_axis_round_trips) -------------------------------------

@pytest.mark.parametrize("opset", [11, 18])
def test_seed_axis_round_trips_are_removed(opset):
    """Squeeze(Unsqueeze(x, [-1]), [-1]) through an Identity is x; a Squeeze of another axis, or of
    an Unsqueeze of another axis, stays, and the results are the same arrays."""
    import ortagent
    from ortagent._graph_passes import seed_axis_round_trips

    def axes_op(op_type, source, target, axes):
        if opset >= 13:
            return [helper.make_node("Constant", [], [target + "_axes"],
                                     value=numpy_helper.from_array(np.array(axes, np.int64))),
                    helper.make_node(op_type, [source, target + "_axes"], [target])]
        return [helper.make_node(op_type, [source], [target], axes=axes)]

    nodes = [*axes_op("Unsqueeze", "x", "seeded", [-1]),
             helper.make_node("Identity", ["seeded"], ["alias"]),
             *axes_op("Squeeze", "alias", "back", [-1]),               # a round trip
             helper.make_node("Relu", ["back"], ["y"]),
             *axes_op("Unsqueeze", "x", "front", [0]),
             *axes_op("Squeeze", "front", "z", [0])]                  # another axis: stays
    model = helper.make_model(
        helper.make_graph(nodes, "g", [tg.tensor("x", np.float32, [3, 4])],
                          [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "z")]),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    assert seed_axis_round_trips(model) == 1
    assert [node.op_type for node in model.graph.node if node.op_type in ("Squeeze", "Unsqueeze")] == \
        ["Unsqueeze", "Squeeze"]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y, z = ortagent.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(z, x)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["fresh", "reserve"]), st.sampled_from(["a", "b", "a_1", "a_3", "b_2"])),
                max_size=40))
def test_name_allocator_gives_the_first_free_suffix(steps):
    """NameAllocator.fresh keeps a search start per stem (the graph passes ask one stem
    thousands of times); whatever was taken before or reserved since, each name it gives is
    new and is the stem itself or the stem with its first free suffix, as a search from 1 gives."""
    from ortagent._onnx_graph import NameAllocator

    names = NameAllocator(["b_1"])
    taken = {"b_1"}
    for action, name in steps:
        if action == "reserve":
            if name in taken:
                with pytest.raises(ValueError):
                    names.reserve(name)
            else:
                names.reserve(name)
                taken.add(name)
            continue
        expected = name
        counter = 1
        while expected in taken:
            expected = f"{name}_{counter}"
            counter += 1
        assert names.fresh(name) == expected
        taken.add(expected)


@pytest.mark.parametrize("batch", [None, 3], ids=["vector", "batched_matrix"])
def test_transposed_matrix_times_vector_is_computed_right_by_onnxruntime(batch):
    """onnxruntime 1.31 fuses Transpose into MatMul (FusedMatMul, optimisation level extended
    and above) and then computes Transpose(A) @ v, v a vector, as A @ v. With the vector written
    as a one-column matrix (what the split models and ORTModule's inference model get), the
    product agrees with numpy at onnxruntime's default optimisation level."""
    import onnx

    from ortagent import InferenceSession
    from ortagent._graph_passes import vector_products_on_transposes

    rng = np.random.default_rng(0)
    shape = [6, 6] if batch is None else [batch, 6, 6]
    a = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(6).astype(np.float32)
    perm = [1, 0] if batch is None else [0, 2, 1]
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["a"], ["t"], perm=perm), helper.make_node("MatMul", ["t", "v"], ["y"])],
        "transposed_product", [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape),
                               helper.make_tensor_value_info("v", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape[:-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    assert vector_products_on_transposes(model) == 1
    onnx.checker.check_model(model)
    (got,) = InferenceSession(model.SerializeToString()).run(None, {"a": a, "v": v})
    np.testing.assert_allclose(got, np.swapaxes(a, -1, -2) @ v, rtol=1e-5, atol=1e-5)
    assert vector_products_on_transposes(model) == 0            # (the product reads no Transpose now)


@pytest.mark.parametrize("case", ["gemm_with_c", "gemm_transposed", "batched_matmul_of_transpose"])
def test_products_over_an_empty_sum_are_computed_right_by_onnxruntime(case):
    """onnxruntime 1.31's CPU Gemm over an empty sum (K = 0) returns C unscaled by beta, and its
    FusedMatMul (a batched MatMul of a Transpose) returns uninitialised values there; with the
    products rewritten (what the split models and ORTModule's inference model get), the results
    are numpy's: beta * C, and zeros."""
    import onnx

    from ortagent import InferenceSession
    from ortagent._graph_passes import products_over_empty_sums

    rng = np.random.default_rng(0)
    if case == "batched_matmul_of_transpose":
        feeds = {"a": rng.standard_normal((5, 0, 5)).astype(np.float32),
                 "b": rng.standard_normal((5, 0, 10)).astype(np.float32)}
        nodes = [helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]), helper.make_node("MatMul", ["t", "b"], ["y"])]
        expected = np.swapaxes(feeds["a"], 1, 2) @ feeds["b"]
    else:
        transposed = case == "gemm_transposed"
        feeds = {"a": rng.standard_normal((0, 5) if transposed else (5, 0)).astype(np.float32),
                 "b": rng.standard_normal((0, 10)).astype(np.float32),
                 "c": rng.standard_normal((1, 10)).astype(np.float32)}
        nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.6, beta=0.2, transA=int(transposed))]
        expected = 0.2 * np.broadcast_to(feeds["c"], (5, 10))
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info(name, TensorProto.FLOAT, value.shape)
                                            for name, value in feeds.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, expected.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    assert products_over_empty_sums(model) == 1
    onnx.checker.check_model(model)
    for _ in range(3):
        (got,) = InferenceSession(model.SerializeToString()).run(None, feeds)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert products_over_empty_sums(model) == 0
