"""ONNX models built in code for the binding tests (no binary fixtures).

Every model sets ir_version and opsets explicitly: onnx >= 1.23 writes IR 14 by default, which
onnxruntime 1.31 rejects.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 17

# numpy dtype name -> ONNX element type, for the dtypes ORT's CPU Identity kernel supports
DTYPES = {
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
    "bool": TensorProto.BOOL,
    "string": TensorProto.STRING,
}


def make_model(nodes, inputs, outputs, initializers=(), name="g", opset=OPSET, **kwargs):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", opset)], **kwargs)
    onnx.checker.check_model(model)
    return model


def vinfo(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def identity(elem_type=TensorProto.FLOAT, shape=(1,)):
    return make_model([helper.make_node("Identity", ["x"], ["y"])],
                      [vinfo("x", elem_type, list(shape))], [vinfo("y", elem_type, list(shape))])


def add(shape=(16,), elem_type=TensorProto.FLOAT):
    return make_model([helper.make_node("Add", ["a", "b"], ["c"])],
                      [vinfo("a", elem_type, list(shape)), vinfo("b", elem_type, list(shape))],
                      [vinfo("c", elem_type, list(shape))])


def mlp(sizes=(16, 32, 8), batch="N", seed=0):
    """MatMul + Add + Relu layers with weights as initializers; last layer without Relu."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "x"
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (rng.standard_normal(fan_out) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"]))
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], ["y" if last else f"pre{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"pre{i}"], [f"h{i}"]))
            current = f"h{i}"
    model = make_model(nodes, [vinfo("x", TensorProto.FLOAT, [batch, sizes[0]])],
                       [vinfo("y", TensorProto.FLOAT, [batch, sizes[-1]])], inits)
    return model


def multi_io():
    """Three inputs of different dtypes, four outputs."""
    nodes = [
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Mul", ["a", "b"], ["prod"]),
        helper.make_node("Cast", ["k"], ["k_float"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["sum"], ["total"], keepdims=0),
        helper.make_node("Shape", ["prod"], ["shape"]),
        helper.make_node("Mul", ["sum", "k_float"], ["scaled"]),
    ]
    return make_model(
        nodes,
        [vinfo("a", TensorProto.FLOAT, ["B", 4]), vinfo("b", TensorProto.FLOAT, ["B", 4]),
         vinfo("k", TensorProto.INT32, [1])],
        [vinfo("scaled", TensorProto.FLOAT, ["B", 4]), vinfo("total", TensorProto.FLOAT, []),
         vinfo("shape", TensorProto.INT64, [2]), vinfo("prod", TensorProto.FLOAT, ["B", 4])])


def symbolic_dims():
    """Symbolic and unknown dimensions: x[batch, seq, 8] -> y = x + 1, z = transpose."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Add", ["x", "one"], ["y"]),
             helper.make_node("Transpose", ["x"], ["z"], perm=[2, 1, 0])]
    unknown = helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, None, None])
    return make_model(nodes, [vinfo("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                      [vinfo("y", TensorProto.FLOAT, ["batch", "seq", 8]), unknown], [one])


def strings():
    """String identity and a string Concat (s followed by its reverse)."""
    nodes = [helper.make_node("Identity", ["s"], ["same"]),
             helper.make_node("Unsqueeze", ["s", "axis1"], ["s2"]),
             helper.make_node("ReverseSequence", ["s2", "lens"], ["rev"], batch_axis=1, time_axis=0),
             helper.make_node("Concat", ["s2", "rev"], ["both"], axis=0)]
    return make_model(nodes, [vinfo("s", TensorProto.STRING, ["N"]), vinfo("lens", TensorProto.INT64, [1])],
                      [vinfo("same", TensorProto.STRING, ["N"]), vinfo("both", TensorProto.STRING, [None, 1])],
                      [numpy_helper.from_array(np.array([1], np.int64), "axis1")])


def overridable_initializer():
    """y = x * scale with `scale` an initializer that is also a graph input (overridable)."""
    scale = numpy_helper.from_array(np.array([2.0], np.float32), "scale")
    return make_model([helper.make_node("Mul", ["x", "scale"], ["y"])],
                      [vinfo("x", TensorProto.FLOAT, [3]), vinfo("scale", TensorProto.FLOAT, [1])],
                      [vinfo("y", TensorProto.FLOAT, [3])], [scale])


def slow_loop(iterations=200, size=256):
    """A Loop of MatMuls that takes a noticeable time on one thread (for GIL/terminate tests)."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((size, size)) / size).astype(np.float32), "w")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "w"], ["mm"]),
         helper.make_node("Tanh", ["mm"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [vinfo("i", TensorProto.INT64, []), vinfo("cond_in", TensorProto.BOOL, []),
         vinfo("h_in", TensorProto.FLOAT, [size, size])],
        [vinfo("cond_out", TensorProto.BOOL, []), vinfo("h_out", TensorProto.FLOAT, [size, size])])
    trip = numpy_helper.from_array(np.array(iterations, np.int64), "trip")
    cond = numpy_helper.from_array(np.array(True), "cond")
    loop = helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)
    return make_model([loop], [vinfo("x", TensorProto.FLOAT, [size, size])],
                      [vinfo("y", TensorProto.FLOAT, [size, size])], [w, trip, cond])


def with_metadata():
    model = identity()
    model.producer_name = "ortagent-tests"
    model.domain = "test.domain"
    model.model_version = 7
    model.doc_string = "a described model"
    model.graph.doc_string = "the graph"
    helper.set_model_props(model, {"author": "tests", "purpose": "metadata"})
    return model


def random_array(dtype_name, shape, rng):
    """Random data of a dtype (ml_dtypes for bfloat16, str objects for strings)."""
    if dtype_name == "string":
        words = ["", "a", "bc", "déjà", "日本", "x" * 40]
        return np.array([words[i % len(words)] for i in rng.integers(0, 100, size=int(np.prod(shape)))],
                        dtype=object).reshape(shape)
    if dtype_name == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype_name == "bfloat16":
        import ml_dtypes
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(dtype_name)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
