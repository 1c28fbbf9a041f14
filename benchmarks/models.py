"""Small ONNX models for the benchmarks (C floor and Python side) and their tests.

Each builder returns an ``onnx.ModelProto`` built in code, with an explicit IR version and
opset: onnx >= 1.23 writes IR 14 by default, which onnxruntime 1.31 rejects.

    identity      y = Identity(x)                         x: float32[1]
    add           z = Add(x, y)                           x, y: float32[16]
    multi_io      out_i = Identity(in_i) for even i,      10 inputs, 10 outputs, float32[1]
                          Add(in_i, in_i) for odd i
    mlp           3 x (Gemm 256x256 + bias, Relu)         x: float32[32, 256]

`MODELS` maps those names to builders; ``save_all(folder)`` writes ``<name>.onnx`` files;
``feeds(model)`` makes float32 inputs for a model. Run as a script to write the files:
``python benchmarks/models.py OUT_DIR``.
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


MODELS = {"identity": identity, "add": add, "multi_io": multi_io, "mlp": mlp}


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
        sys.exit("usage: python benchmarks/models.py OUT_DIR")
    for name, path in save_all(Path(sys.argv[1])).items():
        print(name, path)
