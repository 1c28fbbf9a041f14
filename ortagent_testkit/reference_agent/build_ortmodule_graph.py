"""Build the training graph ORTModule (onnxruntime-training 1.19.2) would run, without torch.

This script runs *inside* an onnxruntime-training 1.19.2 environment (numpy<2, onnx, sympy); the
main test process starts it in a subprocess (see ``client.build_ortmodule_training_graph``)::

    python build_ortmodule_graph.py FORWARD.onnx CONFIG.json OUT.onnx [--info INFO.json]

What ORTModule 1.19.2 does between ``torch.onnx.export`` and the ``TrainingAgent``, and what this
script reproduces (read from ``ortmodule/_graph_transition_manager.py``,
``_graph_execution_manager.py``, ``_training_manager.py`` and ``options.py``):

1. Export: ``torch.onnx.export(..., export_params=False, keep_initializers_as_inputs=True,
   do_constant_folding=False, training=TRAINING, opset_version=17)``. Every parameter and buffer
   is a graph input after the user inputs, with no initializer data; other constants are
   ``Constant`` nodes. Here the forward model comes from ``onnx.helper`` instead: the initializers
   named in the config (``trainable`` then ``buffers``, in the model's initializer order) are
   lifted to graph inputs after the user inputs, and every other initializer becomes a
   ``Constant`` node (``constants_as_nodes``, default on).
2. Post-export: ``SymbolicShapeInference.infer_shapes(model, auto_merge=True,
   guess_output_rank=True)`` (``run_symbolic_shape_infer`` defaults to True). Custom autograd
   functions, ZeRO stage 3 and memory-efficient gradient management only touch graphs that have
   PythonOps or that the user opted into; they do nothing here.
3. ``ORTModule.__init__`` registers ORTModule's custom gradient definitions with the C++
   gradient builder (``CustomGradientRegistry.register_all()``: the ATen ops' gradients --
   embedding, max_pool2d_with_indices, avg_pool2d, ... -- and stop-gradient edges for ATen argmax
   and multinomial). The script loads that module from the installed package by path (its
   package ``__init__`` imports torch; the module itself needs only the pybind module) and calls
   the same ``register_all()``.
4. ``OrtModuleGraphBuilderConfiguration``: ``initializer_names`` = *every* graph input name (user
   inputs and parameters; so the builder's ``user_input_names`` comes out empty),
   ``initializer_names_to_train`` = the graph inputs that require a gradient (parameters and user
   inputs), ``input_names_require_grad`` = the user inputs that require a gradient,
   ``build_gradient_graph`` = True (training mode), ``enable_caching`` = False
   (``enable_grad_acc_optimization``), ``loglevel`` = WARNING, ``use_memory_efficient_gradient`` =
   False.
5. ``TrainingGraphTransformerConfiguration``: ``propagate_cast_ops_config`` (level 1, FLOOD_FILL,
   allow []), ``enable_compute_optimizer`` = True, ``print_input_density`` = False.
6. ``build(config)`` -- ``build(config, input_shapes)`` only with ``use_static_shape`` (default
   False; the shapes are then per *user* input, so ``initializer_names`` is the parameters only).
7. ``get_gradient_model()``; ``GraphOptimizerRegistry.optimize_all`` then applies Python graph
   optimizers registered for the module's device: in 1.19.2 the only one is the ATen efficient
   attention rewrite, registered for CUDA only, so on CPU the gradient model is used as is.

CONFIG.json keys (all optional but ``trainable``): ``trainable`` (list of initializer or graph
input names that require a gradient), ``buffers`` (initializers lifted to graph inputs without a
gradient, e.g. BatchNorm running statistics), ``input_names_require_grad`` (user inputs),
``input_shapes`` (``{user input: shape}``: turns on ``use_static_shape``),
``symbolic_shape_infer`` (default true), ``enable_compute_optimizer`` (default true),
``use_memory_efficient_gradient`` (default false), ``enable_caching`` (default false),
``constants_as_nodes`` (default true), ``register_custom_gradients`` (default true).

``--info`` writes a JSON with the builder's ``GraphInfo`` and what the script did.
"""

from __future__ import annotations

import argparse
import json
import sys

import onnx
from onnx import helper
from onnxruntime.capi import _pybind_state as C

ORT_SEVERITY_WARNING = 2
GRAPH_INFO_FIELDS = (
    "user_input_names", "user_input_grad_names", "initializer_names", "initializer_names_to_train",
    "initializer_grad_names_to_train", "user_output_names", "output_grad_indices_non_differentiable",
    "output_grad_indices_require_full_shape", "module_output_indices_requires_save_for_backward",
    "frontier_node_arg_map", "cached_node_arg_names", "module_output_gradient_name",
)


def exporter_form(model: onnx.ModelProto, lifted: list[str], constants_as_nodes: bool) -> onnx.ModelProto:
    """The model as torch.onnx.export(export_params=False, keep_initializers_as_inputs=True) hands
    it to ORTModule: ``lifted`` initializers become graph inputs after the existing ones (value
    removed), the other initializers ``Constant`` nodes (or stay initializers)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    existing_inputs = {value.name for value in graph.input}
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    missing = [name for name in lifted if name not in initializers and name not in existing_inputs]
    if missing:
        raise SystemExit(f"not an initializer or graph input of the forward model: {missing}")
    lifted_set = set(lifted)
    order = [tensor.name for tensor in graph.initializer if tensor.name in lifted_set]
    new_inputs = []
    for name in order:
        tensor = initializers[name]
        if name not in existing_inputs:
            new_inputs.append(helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims)))
    constants = []
    kept = []
    for tensor in graph.initializer:
        if tensor.name in lifted_set:
            continue
        if constants_as_nodes and tensor.name not in existing_inputs:
            constants.append(helper.make_node("Constant", [], [tensor.name], name=f"Constant_{tensor.name}",
                                              value=tensor))
        else:
            kept.append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(new_inputs)
    if constants:
        nodes = constants + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
    return model


def symbolic_shape_infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        return SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True), None
    except Exception as error:  # ORTModule would fail; keep going and say so
        return model, f"{type(error).__name__}: {error}"


def register_ortmodule_gradients() -> str:
    """Run ORTModule's ``CustomGradientRegistry.register_all()`` without importing
    ``onnxruntime.training`` (whose ``__init__`` needs torch)."""
    import importlib.util
    import os

    import onnxruntime

    path = os.path.join(os.path.dirname(onnxruntime.__file__), "training", "ortmodule",
                        "_custom_gradient_registry.py")
    spec = importlib.util.spec_from_file_location("_ortmodule_custom_gradient_registry", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.CustomGradientRegistry.register_all()
    return ", ".join(sorted(module.CustomGradientRegistry._GRADIENTS))


def graph_info_dict(info) -> dict:
    result = {}
    for field in GRAPH_INFO_FIELDS:
        if hasattr(info, field):
            value = getattr(info, field)
            result[field] = dict(value) if isinstance(value, dict) or hasattr(value, "items") else list(value)
    return result


def build(forward: onnx.ModelProto, config: dict) -> tuple[onnx.ModelProto, dict]:
    trainable = list(config.get("trainable", []))
    buffers = list(config.get("buffers", []))
    input_names_require_grad = list(config.get("input_names_require_grad", []))
    input_shapes = config.get("input_shapes")
    notes: dict = {}

    initializer_names_in_model = {tensor.name for tensor in forward.graph.initializer}
    lifted = [name for name in trainable + buffers if name in initializer_names_in_model]
    model = exporter_form(forward, lifted, config.get("constants_as_nodes", True))
    if config.get("symbolic_shape_infer", True):
        model, failure = symbolic_shape_infer(model)
        notes["symbolic_shape_infer"] = failure or "ok"

    graph_input_names = [value.name for value in model.graph.input]
    require_grad = set(trainable) | set(input_names_require_grad)
    unknown = sorted(require_grad - set(graph_input_names))
    if unknown:
        raise SystemExit(f"names requiring a gradient are not graph inputs: {unknown}")
    names_require_grad = [name for name in graph_input_names if name in require_grad]
    user_inputs_require_grad = [name for name in graph_input_names if name in set(input_names_require_grad)]
    parameters = [name for name in graph_input_names if name in set(trainable) | set(buffers)]

    if config.get("register_custom_gradients", True):
        notes["custom_gradients"] = register_ortmodule_gradients()
        notes["custom_gradients"] = f"{len(notes['custom_gradients'].split(', '))} registered"

    builder_config = C.OrtModuleGraphBuilderConfiguration()
    if input_shapes is None:
        builder_config.initializer_names = graph_input_names
    else:
        builder_config.initializer_names = parameters
    builder_config.initializer_names_to_train = names_require_grad
    builder_config.input_names_require_grad = user_inputs_require_grad
    builder_config.build_gradient_graph = True
    builder_config.enable_caching = bool(config.get("enable_caching", False))
    builder_config.loglevel = C.Severity.WARNING if hasattr(C, "Severity") else ORT_SEVERITY_WARNING
    builder_config.use_memory_efficient_gradient = bool(config.get("use_memory_efficient_gradient", False))

    transformer_config = C.TrainingGraphTransformerConfiguration()
    transformer_config.propagate_cast_ops_config = C.PropagateCastOpsConfiguration()
    transformer_config.propagate_cast_ops_config.level = 1
    transformer_config.propagate_cast_ops_config.allow = []
    transformer_config.propagate_cast_ops_config.strategy = C.PropagateCastOpsStrategy.FLOOD_FILL
    transformer_config.enable_compute_optimizer = bool(config.get("enable_compute_optimizer", True))
    transformer_config.print_input_density = False

    builder = C.OrtModuleGraphBuilder()
    builder.initialize(model.SerializeToString(), builder_config)
    if input_shapes is None:
        builder.build(transformer_config)
    else:
        user_inputs = [name for name in graph_input_names if name not in set(parameters)]
        builder.build(transformer_config, [list(input_shapes[name]) for name in user_inputs])
    gradient_model = onnx.load_model_from_string(builder.get_gradient_model())
    info = {
        "graph_info": graph_info_dict(builder.get_graph_info()),
        "initializer_names": list(builder_config.initializer_names),
        "initializer_names_to_train": names_require_grad,
        "input_names_require_grad": user_inputs_require_grad,
        "notes": notes,
    }
    return gradient_model, info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("forward")
    parser.add_argument("config")
    parser.add_argument("output")
    parser.add_argument("--info")
    args = parser.parse_args(argv)
    forward = onnx.load(args.forward)
    with open(args.config) as handle:
        config = json.load(handle)
    model, info = build(forward, config)
    onnx.save(model, args.output)
    if args.info:
        with open(args.info, "w") as handle:
            json.dump(info, handle, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
