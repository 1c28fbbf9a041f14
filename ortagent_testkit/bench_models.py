"""Small ONNX models for the benchmarks (C floor and Python side) and their tests.

Each builder returns an ``onnx.ModelProto`` built in code, with an explicit IR version and
opset: onnx >= 1.23 writes IR 14 by default, which onnxruntime 1.31 rejects.

    identity      y = Identity(x)                         x: float32[1]
    add           z = Add(x, y)                           x, y: float32[16]
    multi_io      out_i = Identity(in_i) for even i,      10 inputs, 10 outputs, float32[1]
                          Add(in_i, in_i) for odd i
    mlp           3 x (Gemm 256x256 + bias, Relu)         x: float32[32, 256]

and, for the agent group's ORTModule training graphs, ``ortmodule_mlp`` (784-512-10, batch 64)
and ``transformer_layer`` (pre-norm, 4 heads, d 128, batch 8, sequence 32).

`MODELS` maps those names to builders; ``save_all(folder)`` writes ``<name>.onnx`` files;
``feeds(model)`` makes float32 inputs for a model. Run as a script to write the files:
``python -m ortagent_testkit.bench_models OUT_DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 17


def _model(nodes, inputs, outputs, name, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ortagent-benchmarks")
    onnx.checker.check_model(model)
    return model


def _f32(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def identity(size: int = 1) -> onnx.ModelProto:
    return _model([helper.make_node("Identity", ["x"], ["y"])],
                  [_f32("x", [size])], [_f32("y", [size])], "identity")


def add(size: int = 16) -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", "y"], ["z"])],
                  [_f32("x", [size]), _f32("y", [size])], [_f32("z", [size])], "add")


def multi_io(count: int = 10, size: int = 1) -> onnx.ModelProto:
    nodes, inputs, outputs = [], [], []
    for i in range(count):
        inputs.append(_f32(f"in_{i}", [size]))
        outputs.append(_f32(f"out_{i}", [size]))
        if i % 2 == 0:
            nodes.append(helper.make_node("Identity", [f"in_{i}"], [f"out_{i}"]))
        else:
            nodes.append(helper.make_node("Add", [f"in_{i}", f"in_{i}"], [f"out_{i}"]))
    return _model(nodes, inputs, outputs, "multi_io")


def mlp(layers: int = 3, width: int = 256, batch: int = 32, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "x"
    for k in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = (rng.standard_normal(width) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        nodes.append(helper.make_node("Gemm", [current, f"w{k}", f"b{k}"], [f"h{k}"]))
        out = "y" if k == layers - 1 else f"a{k}"
        nodes.append(helper.make_node("Relu", [f"h{k}"], [out]))
        current = out
    return _model(nodes, [_f32("x", [batch, width])], [_f32("y", [batch, width])], "mlp", inits)


def large_output(nbytes: int = 64 << 20) -> onnx.ModelProto:
    """y = Expand(x, shape): a float32[1] input, an output of `nbytes` (64 MiB): what returning
    a large output costs (not in MODELS: the call-overhead blocks and the C floor's tests stay
    on the small models)."""
    count = nbytes // 4
    shape = numpy_helper.from_array(np.array([count], np.int64), "shape")
    return _model([helper.make_node("Expand", ["x", "shape"], ["y"])],
                  [_f32("x", [1])], [_f32("y", [count])], "large_output", [shape])


def _normal_init(rng, name: str, shape, scale: float) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


ORTMODULE_MLP_FEED = (64, 784)              # batch, features
TRANSFORMER_FEED = (8, 32, 128)             # batch, sequence, model dimension


def ortmodule_mlp(sizes=(784, 512, 10), seed: int = 0) -> onnx.ModelProto:
    """nn.Sequential(Linear, ReLU, Linear) as ORTModule's exporter writes it (Gemm, transB=1):
    the forward model ORTModule's graph builder turns into its training graph."""
    rng = np.random.default_rng(seed)
    n_in, hidden, n_out = sizes
    inits = [_normal_init(rng, "fc1.weight", (hidden, n_in), n_in ** -0.5),
             _normal_init(rng, "fc1.bias", (hidden,), 0.01),
             _normal_init(rng, "fc2.weight", (n_out, hidden), hidden ** -0.5),
             _normal_init(rng, "fc2.bias", (n_out,), 0.01)]
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["logits"], transB=1)]
    # ORTModule exports every input dimension as dynamic
    return _model(nodes, [_f32("x", ["batch", n_in])], [_f32("logits", ["batch", n_out])],
                  "ortmodule_mlp", inits)


def transformer_layer(dim: int = 128, heads: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A pre-norm transformer layer (LayerNorm, multi-head self-attention with Softmax, LayerNorm,
    GELU feed-forward, residuals), the head split written with Shape/Gather/Concat/Reshape as a
    torch export writes it: the forward model of the agent benchmark's ORTModule graph."""
    rng = np.random.default_rng(seed)
    head = dim // heads
    inits = [numpy_helper.from_array(np.ones(dim, np.float32), "ln1.weight"),
             numpy_helper.from_array(np.zeros(dim, np.float32), "ln1.bias"),
             _normal_init(rng, "qkv.weight", (dim, 3 * dim), dim ** -0.5),
             _normal_init(rng, "qkv.bias", (3 * dim,), 0.01),
             _normal_init(rng, "proj.weight", (dim, dim), dim ** -0.5),
             _normal_init(rng, "proj.bias", (dim,), 0.01),
             numpy_helper.from_array(np.ones(dim, np.float32), "ln2.weight"),
             numpy_helper.from_array(np.zeros(dim, np.float32), "ln2.bias"),
             _normal_init(rng, "fc1.weight", (dim, 4 * dim), dim ** -0.5),
             _normal_init(rng, "fc1.bias", (4 * dim,), 0.01),
             _normal_init(rng, "fc2.weight", (4 * dim, dim), (4 * dim) ** -0.5),
             _normal_init(rng, "fc2.bias", (dim,), 0.01)]
    consts = {"split": np.array([dim] * 3, np.int64), "zero": np.array(0, np.int64),
              "one": np.array(1, np.int64), "heads_dims": np.array([heads, head], np.int64),
              "dim": np.array([dim], np.int64), "scale": np.array(np.sqrt(head), np.float32),
              "axes0": np.array([0], np.int64)}
    nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))
             for name, value in consts.items()]

    def node(op, inputs, outputs, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, **attrs))

    # all three outputs, as ORTModule's layer_norm symbolic writes them (its gradient reads them)
    node("LayerNormalization", ["x", "ln1.weight", "ln1.bias"], ["h1", "ln1.mean", "ln1.inv_std"], axis=-1,
         epsilon=1e-5)
    node("MatMul", ["h1", "qkv.weight"], ["qkv0"])
    node("Add", ["qkv0", "qkv.bias"], ["qkv"])
    node("Split", ["qkv", "split"], ["q0", "k0", "v0"], axis=-1)
    node("Shape", ["x"], ["xs"])
    node("Gather", ["xs", "zero"], ["b"], axis=0)
    node("Gather", ["xs", "one"], ["s"], axis=0)
    node("Unsqueeze", ["b", "axes0"], ["b1"])
    node("Unsqueeze", ["s", "axes0"], ["s1"])
    node("Concat", ["b1", "s1", "heads_dims"], ["split_shape"], axis=0)
    node("Concat", ["b1", "s1", "dim"], ["merged_shape"], axis=0)
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        node("Reshape", [f"{name}0", "split_shape"], [f"{name}4"])
        node("Transpose", [f"{name}4"], [f"{name}t"], perm=perm)
    node("MatMul", ["qt", "kt"], ["scores0"])
    node("Div", ["scores0", "scale"], ["scores"])
    node("Softmax", ["scores"], ["probs"], axis=-1)
    node("MatMul", ["probs", "vt"], ["ctx0"])
    node("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3])
    node("Reshape", ["ctx1", "merged_shape"], ["ctx"])
    node("MatMul", ["ctx", "proj.weight"], ["att0"])
    node("Add", ["att0", "proj.bias"], ["att"])
    node("Add", ["x", "att"], ["r1"])
    node("LayerNormalization", ["r1", "ln2.weight", "ln2.bias"], ["h2", "ln2.mean", "ln2.inv_std"], axis=-1,
         epsilon=1e-5)
    node("MatMul", ["h2", "fc1.weight"], ["f0"])
    node("Add", ["f0", "fc1.bias"], ["f1"])
    node("Gelu", ["f1"], ["g"], domain="com.microsoft")
    node("MatMul", ["g", "fc2.weight"], ["f2"])
    node("Add", ["f2", "fc2.bias"], ["f3"])
    node("Add", ["r1", "f3"], ["y"])
    graph = helper.make_graph(nodes, "transformer_layer", [_f32("x", ["batch", "seq", dim])],
                              [_f32("y", ["batch", "seq", dim])], initializer=inits)
    model = helper.make_model(graph, ir_version=IR_VERSION, producer_name="ortagent-benchmarks",
                              opset_imports=[helper.make_opsetid("", OPSET),
                                             helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    return model


MODELS = {"identity": identity, "add": add, "multi_io": multi_io, "mlp": mlp}
# forward models of the agent group's ORTModule training graphs (not run by the C floor)
ORTMODULE_MODELS = {"ortmodule_mlp": ortmodule_mlp, "transformer_layer": transformer_layer}


def save(name: str, folder: Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.onnx"
    onnx.save(MODELS[name](), str(path))
    return path


def save_all(folder: Path) -> dict[str, Path]:
    return {name: save(name, folder) for name in MODELS}


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic float32 inputs of the model's (static) input shapes."""
    rng = np.random.default_rng(seed)
    result = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else 1
                for d in value.type.tensor_type.shape.dim]
        result[value.name] = rng.standard_normal(dims).astype(np.float32)
    return result


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m ortagent_testkit.bench_models OUT_DIR")
    for name, path in save_all(Path(sys.argv[1])).items():
        print(name, path)
