"""Group 3, agent: one training step (forward to the YieldOp + backward), ortagent's
TrainingAgent vs one run of the same graph without its YieldOp vs onnxruntime-training 1.19.2's
own agent.

Cases: the tiny graph ``out = x * w + bias`` (``ortagent_testkit.training_graphs.mul_add_case``,
float32), an MLP 784-512-10 at batch 64 (forward MatMul/Add/Relu/MatMul/Add, training graph
from ``ortagent.training.build_training_graph``), and two training graphs written by
onnxruntime-training 1.19.2's own ORTModule graph builder (an MLP 784-512-10 and a transformer
layer, ``ortagent_testkit.bench_models``), whose training-only ops ortagent lowers to standard ops while the
1.19.2 agent runs them with its training kernels. Contenders per case, every round, random order:

* ortagent ``TrainingAgent``, state API: ``run_forward(feeds, fetches, state)`` then
  ``run_backward(grads, fetches, state)`` with a fresh ``PartialGraphExecutionState`` per step
  (OrtValue feeds and gradients made once);
* ortagent ``TrainingAgent``, run-id API: ``run_forward(binding, None)`` then
  ``run_backward(grads, run_id)`` (inputs and outputs bound once);
* one ``InferenceSession.run_with_ort_values`` of the *cut* graph: the YieldOp removed, its
  outputs (the output gradients) made graph inputs, its inputs (the module outputs) made graph
  outputs, so one run computes the outputs and all gradients -- what the step would cost
  without a pause between forward and backward; with ortagent's session and with
  onnxruntime's Python;
* onnxruntime-training 1.19.2's ``TrainingAgent`` (pybind, state API, as ORTModule drives it)
  in ``.venv-refagent``: a helper process (benchmarks/refagent_worker.py) that times its own
  bursts of steps with the same model, inputs and session options, idle between bursts.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import _common
from ._harness import BurstServer, PyCalls, Served, run_rounds
from ._report import Group, Row

MLP_SIZES = (64, 784, 512, 10)          # batch, in, hidden, out


def mlp_training_graph(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The training graph and the parameters' initial values (ortagent_testkit.training_graphs's MLP
    forward, at MNIST's sizes)."""
    from ortagent_testkit import training_graphs
    from ortagent.training import build_training_graph

    batch, n_in, hidden, n_out = MLP_SIZES
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32), "W1"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
        numpy_helper.from_array((rng.standard_normal((hidden, n_out)) / np.sqrt(hidden)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.zeros(n_out, np.float32), "b2"),
    ]
    graph = helper.make_graph(
        training_graphs.mlp_forward_nodes(argmax=False), "mlp_784_512_10",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, n_out])], inits)
    forward = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    params = {i.name: numpy_helper.to_array(i) for i in inits}
    return build_training_graph(forward, ["W1", "b1", "W2", "b2"]), params


def cut_yield(model: onnx.ModelProto) -> onnx.ModelProto:
    """The training graph as one inference graph: no YieldOp, its outputs (gradients) graph
    inputs, its inputs (module outputs) graph outputs before the original outputs."""
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    graph = cut.graph
    (node,) = [n for n in graph.node if n.op_type == "YieldOp"]
    non_diff = set()
    for attribute in node.attribute:
        if attribute.name == "non_differentiable_outputs":
            non_diff = set(attribute.ints)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.input,
                                       *inferred.graph.output]}
    differentiable = [name for i, name in enumerate(node.input) if i not in non_diff]
    gradient_inputs = []
    for grad_name, output_name in zip(node.output, differentiable):
        value = onnx.ValueInfoProto()
        value.name = grad_name
        value.type.CopyFrom(types[output_name])
        gradient_inputs.append(value)
    module_outputs = []
    for name in node.input:
        value = onnx.ValueInfoProto()
        value.name = name
        value.type.CopyFrom(types[name])
        module_outputs.append(value)
    graph.node.remove(node)
    drop = set(node.output)
    kept_info = [v for v in graph.value_info if v.name not in drop]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    graph.input.extend(gradient_inputs)
    original_outputs = list(graph.output)
    del graph.output[:]
    graph.output.extend(module_outputs + original_outputs)
    onnx.checker.check_model(cut)
    return cut


def _cases(settings):
    from ortagent_testkit import training_graphs

    tiny = training_graphs.mul_add_case(np.float32)
    rng = np.random.default_rng(settings.seed)
    tiny_feeds = [np.ascontiguousarray(tiny.make_feeds(rng)[n]) for n in tiny.input_names]
    tiny_grads = [rng.standard_normal((2, 3)).astype(np.float32)]
    mlp, params = mlp_training_graph(settings.seed)
    batch, n_in, _, n_out = MLP_SIZES
    mlp_inputs = [v.name for v in mlp.graph.input]
    mlp_feeds = [rng.standard_normal((batch, n_in)).astype(np.float32) if n == "x" else params[n]
                 for n in mlp_inputs]
    mlp_grads = [rng.standard_normal((batch, n_out)).astype(np.float32)]
    return [("tiny", "x*w+bias", tiny.model, tiny_feeds, tiny_grads),
            ("mlp", "MLP 784-512-10 b64", mlp, mlp_feeds, mlp_grads), *_ortmodule_cases(settings)]


ORTMODULE_CASES = (("om-mlp", "ORTModule MLP 784-512-10 b64", "ortmodule_mlp", "ORTMODULE_MLP_FEED"),
                   ("om-layer", "ORTModule transformer layer d128 b8 s32", "transformer_layer",
                    "TRANSFORMER_FEED"))


def _ortmodule_cases(settings):
    """Training graphs written by onnxruntime-training 1.19.2's ORTModule graph builder (training
    ops: ReluGrad; LayerNormalizationGrad, SoftmaxGrad_13, GeluGrad, ConcatTraining), which
    ortagent lowers to standard ops. Built in .venv-refagent; none without it."""
    from ortagent_testkit import bench_models as models
    from ortagent_testkit.reference_agent.client import build_ortmodule_training_graph, reference_python

    if reference_python() is None:
        return []
    rng = np.random.default_rng(settings.seed + 1)
    cases = []
    for tag, title, builder, feed_shape in ORTMODULE_CASES:
        forward = getattr(models, builder)()
        params = {i.name: numpy_helper.to_array(i) for i in forward.graph.initializer}
        graph = build_ortmodule_training_graph(forward, list(params))
        known = {"x": rng.standard_normal(getattr(models, feed_shape)).astype(np.float32), **params}
        feeds = [np.ascontiguousarray(known[v.name]) for v in graph.graph.input]
        output_shape = list(getattr(models, feed_shape))
        if builder == "ortmodule_mlp":
            output_shape[-1] = 10
        grads = [rng.standard_normal(output_shape).astype(np.float32)]
        cases.append((tag, title, graph, feeds, grads))
    return cases


def _strip_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Parameters that are graph inputs must not also be initializers (ORTModule layout)."""
    inputs = {v.name for v in model.graph.input}
    kept = [i for i in model.graph.initializer if i.name not in inputs]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def _contenders(tag, title, model, feeds, grads, settings, servers, checks):
    import ortagent
    from ortagent import OrtDevice, OrtValue, PartialGraphExecutionState, TrainingAgent

    from ortagent.training_ops import lower_training_ops

    # the agents get the graph as it is (an ORTModule graph is lowered inside); the plain
    # sessions below and the C floor get its lowered form
    model = _strip_initializers(model)
    model_bytes = model.SerializeToString()
    lowered = lower_training_ops(model)
    input_names = [v.name for v in model.graph.input]
    output_names = [v.name for v in model.graph.output]
    (yield_node,) = [n for n in model.graph.node if n.op_type == "YieldOp"]
    values = [OrtValue.ortvalue_from_numpy(a) for a in feeds]
    grad_values = [OrtValue.ortvalue_from_numpy(g) for g in grads]
    cpu = OrtDevice.cpu()

    state_agent = TrainingAgent(model_bytes, fw_feed_names=input_names,
                                fw_outputs_device_info=[OrtDevice(cpu, 0, 0)] * len(yield_node.input),
                                bw_fetches_names=output_names,
                                bw_outputs_device_info=[OrtDevice(cpu, 0, 0)] * len(output_names),
                                session_options=_common.ortagent_options())

    def state_step(agent=state_agent, State=PartialGraphExecutionState):
        state = State()
        fetches: list = []
        agent.run_forward(values, fetches, state)
        outputs: list = []
        agent.run_backward(grad_values, outputs, state)
        return outputs

    id_agent = TrainingAgent(model_bytes, session_options=_common.ortagent_options())
    binding = id_agent.io_binding()
    for name, value in zip(input_names, values):
        binding.bind_ortvalue_input(name, value)
    for name in output_names:
        binding.bind_output(name, "cpu")

    def run_id_step(agent=id_agent, binding=binding):
        _, run_id = agent.run_forward(binding, None)
        agent.run_backward(grad_values, run_id)

    cut = cut_yield(lowered)
    cut_bytes = cut.SerializeToString()
    cut_inputs = [v.name for v in cut.graph.input]
    cut_outputs = [v.name for v in cut.graph.output]
    oa_single = ortagent.InferenceSession(cut_bytes, _common.ortagent_options())
    oa_feed = dict(zip(cut_inputs, values + grad_values))
    import onnxruntime

    ort_single = _common.onnxruntime_session(cut_bytes)
    ort_feed = dict(zip(cut_inputs, [onnxruntime.OrtValue.ortvalue_from_numpy(a)
                                     for a in feeds + grads]))

    # the two halves of ortagent's split as plain sessions: what the agent's own work adds to
    split = state_agent.split
    fw = ortagent.InferenceSession(split.forward_model.SerializeToString(), _common.ortagent_options())
    bw = ortagent.InferenceSession(split.backward_model.SerializeToString(), _common.ortagent_options())
    fw_outputs = [v.name for v in split.forward_model.graph.output]
    bw_inputs = [v.name for v in split.backward_model.graph.input]
    bw_outputs = list(split.graph_output_names)
    known = dict(zip(input_names, values))
    fw_feed = {name: known[name] for name in split.forward_input_names}
    known.update(zip(split.gradient_names, grad_values))

    def two_runs():
        env = dict(known)
        env.update(zip(fw_outputs, fw.run_with_ort_values(fw_outputs, fw_feed)))
        return bw.run_with_ort_values(bw_outputs, {name: env[name] for name in bw_inputs})

    # the same gradients from all of them
    expect = [v.numpy() for v in state_step()]
    run_id_step()
    got = {"run-id API": [v.numpy() for v in binding.get_outputs()],
           "single run": [v.numpy() for v in oa_single.run_with_ort_values(cut_outputs, oa_feed)
                          ][len(yield_node.input):],
           "two plain runs": [v.numpy() for v in two_runs()],
           "onnxruntime single run": [v.numpy() for v in ort_single.run_with_ort_values(
               cut_outputs, ort_feed)][len(yield_node.input):]}
    for what, arrays in got.items():
        for a, b in zip(expect, arrays):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"{tag}: {what}")
    checks[tag] = [float(np.asarray(a, np.float64).sum()) for a in expect]

    single_key = f"{tag}/oa-single"
    plan = [
        (PyCalls(f"{tag}/oa-state", f"{title}: ortagent TrainingAgent step (state API)", "ortagent",
                 state_step), single_key, f"{tag}/ref"),
        (PyCalls(f"{tag}/oa-run-id", f"{title}: ortagent TrainingAgent step (run-id API)",
                 "ortagent", run_id_step), single_key, f"{tag}/ref"),
        (PyCalls(f"{tag}/oa-two-runs", f"{title}: ortagent forward + backward halves as 2 sessions",
                 "ortagent", two_runs), single_key, None),
        (PyCalls(single_key, f"{title}: ortagent single run, YieldOp cut", "ortagent",
                 oa_single.run_with_ort_values, cut_outputs, oa_feed), None, f"{tag}/ort-single"),
        (PyCalls(f"{tag}/ort-single", f"{title}: onnxruntime single run, YieldOp cut",
                 "onnxruntime", ort_single.run_with_ort_values, cut_outputs, ort_feed),
         single_key, None),
    ]

    from ortagent_testkit.reference_agent.client import reference_python

    python = reference_python()
    if python is not None:
        folder = settings.workdir / f"refagent-{tag}"
        folder.mkdir()
        (folder / "model.onnx").write_bytes(model_bytes)
        np.savez(folder / "feeds.npz", *feeds)
        np.savez(folder / "grads.npz", *grads)
        (folder / "meta.json").write_text(json.dumps({
            "fw_feed_names": input_names, "fw_fetch_count": len(yield_node.input),
            "bw_fetch_names": output_names}))
        server = BurstServer([python, str(_common.BENCH_DIR / "refagent_worker.py"), str(folder)],
                             what=f"onnxruntime-training 1.19.2 worker ({tag})")
        servers.append(server)
        np.testing.assert_allclose(server.ready["checksums"], checks[tag], rtol=1e-3, atol=1e-3,
                                   err_msg=f"{tag}: the 1.19.2 agent's gradients differ")
        plan.append((Served(f"{tag}/ref", f"{title}: onnxruntime-training 1.19.2 TrainingAgent step",
                            "ort-training 1.19.2", server, "step"), single_key, None))

    # the C floor of the split: Run of the forward half + Run of the backward half, each in its
    # own ort_floor --serve process (float32 inputs of the right shapes; values do not matter)
    # ort_floor gives every symbolic dimension one value (--dim): the graph's symbolic input
    # dimensions must all have one value in the feeds (an ORTModule graph's batch), else no floor
    floor = _common.c_floor()
    library = floor.default_library()
    dim = _single_symbolic_value(model, feeds)
    if library is not None and dim is not None:
        program = floor.build()
        for half, half_model in (("fw", split.forward_model), ("bw", split.backward_model)):
            path = settings.workdir / f"{tag}-{half}.onnx"
            path.write_bytes(half_model.SerializeToString())
            server = BurstServer([str(program), str(path), "--serve", "--lib", str(library),
                                  "--dim", str(dim)], what=f"ort_floor {tag} {half}")
            servers.append(server)
            plan.append((Served(f"{tag}/c-{half}", f"{title}: C Run of the {half} half", "C",
                                server, "run"), None, HIDDEN))
    return plan


HIDDEN = "(hidden)"     # a contender whose samples only feed a derived row


def _single_symbolic_value(model: onnx.ModelProto, feeds) -> int | None:
    """The one value the graph's symbolic input dimensions take in `feeds` (1 when there are
    none), or None when they take several."""
    values = {feed.shape[d] for value_info, feed in zip(model.graph.input, feeds)
              for d, dim in enumerate(value_info.type.tensor_type.shape.dim) if not dim.HasField("dim_value")}
    return 1 if not values else values.pop() if len(values) == 1 else None


def run(settings) -> Group:
    started = time.perf_counter()
    group = Group("agent", "3. agent: one training step, forward + backward (µs per step)",
                  rounds=settings.rounds["agent"], burst_s=settings.burst_s,
                  clock=settings.clock)
    servers: list[BurstServer] = []
    checks: dict = {}
    try:
        plans = [_contenders(*case, settings, servers, checks) for case in _cases(settings)]
        samples = run_rounds([[c for c, _, _ in plan] for plan in plans], settings.rounds["agent"],
                             settings.burst_s, desc="3/5 agent", seed=settings.seed,
                             clock=settings.clock)
    finally:
        for server in servers:
            server.close()
    keys = set(samples)
    for plan in plans:
        for contender, ref, peer in plan:
            if peer == HIDDEN:
                continue
            group.rows.append(Row(contender.key, contender.label, contender.side,
                                  samples[contender.key], ref=ref,
                                  peer=peer if peer in keys else None,
                                  ref_name="ortagent single run",
                                  peer_name=("the 1.19.2 agent" if peer and peer.endswith("/ref")
                                             else "onnxruntime"),
                                  other=samples.other[contender.key]))
        tag = plan[0][0].key.split("/")[0]
        if f"{tag}/c-fw" in samples:
            title = plan[0][0].label.split(": ")[0]
            both = [[f + b for f, b in zip(data[f"{tag}/c-fw"], data[f"{tag}/c-bw"])]
                    for data in (samples, samples.other)]
            group.rows.append(Row(f"{tag}/c-halves", f"{title}: C floor, Run of each half (sum)",
                                  "C", both[0], ref=f"{tag}/oa-single",
                                  ref_name="ortagent single run", other=both[1]))
    if any("1.19.2" in s.what for s in servers):
        version = next(s for s in servers if "1.19.2" in s.what).ready.get("onnxruntime", "?")
        group.notes.append(f"the reference agent is onnxruntime-training {version} in its own "
                           "environment; its kernels are that release's, not 1.31's")
    else:
        group.notes.append("onnxruntime-training 1.19.2 is not installed here (make refagent): "
                           "the reference agent's rows and target are missing")
    floor_note = ""
    if "tiny/c-fw" in samples:
        floor_note = ("C floor of the two halves: "
                      f"{statistics.median(group.samples('tiny/c-halves')) / 1e3:.2f} µs, "
                      f"1.19.2 agent: {statistics.median(samples['tiny/ref']) / 1e3:.2f} µs"
                      if "tiny/ref" in samples else "")
    # the target: 0.9x the real agent's step (by instructions, python -m benchmarks.callgrind_counts
    # --cases agent-tiny,ref-agent-tiny, 0.89x; the time is noisier: see benchmarks/README.md)
    group.ratio_target("tiny_vs_ref_agent",
                       "ortagent tiny step (state API) <= 0.9x the 1.19.2 agent's step",
                       "tiny/oa-state", "tiny/ref", 0.9, detail=floor_note)
    med = statistics.median
    single = med(samples["mlp/oa-single"]) / 1e3
    group.ratio_target("mlp_vs_single_run",
                       "ortagent MLP step (state API) within 3% of one run of the cut graph",
                       "mlp/oa-state", "mlp/oa-single", 1.03,
                       detail=f"single run {single:.1f} µs; step "
                              f"{med(samples['mlp/oa-state']) / 1e3:.1f} µs; step vs the two "
                              f"halves as plain sessions "
                              f"{med(group.ratio('mlp/oa-state', 'mlp/oa-two-runs')):.3f}x")
    if med(samples["mlp/oa-single"]) > med(samples["mlp/oa-two-runs"]):
        group.notes.append(
            "the cut MLP graph runs slower than its two halves: with the whole graph in one "
            "session ORT's optimiser fuses the Transposes of the backward into FusedMatMul nodes "
            "that are slower here; the single run is not a lower bound for the step")
    for tag, title, _, _ in ORTMODULE_CASES:
        if f"{tag}/ref" in samples:
            group.ratio_target(f"{tag}_vs_ref_agent",
                               f"ortagent step on the lowered {title} graph <= 1.1x the 1.19.2 agent "
                               "on the original", f"{tag}/oa-state", f"{tag}/ref", 1.1)
    group.seconds = time.perf_counter() - started
    return group
