"""Drive ortagent's TrainingAgent through each of its API forms with NumPy in and out.

The agent tests run the same checks through every constructor form the seed API has:

* ``state7``: ``TrainingAgent(model, fw_feed_names, fw_fetches_names, fw_outputs_device_info,
  bw_feed_names, bw_fetches_names, bw_outputs_device_info)`` (onnxruntime-training 1.8 - 1.18);
* ``kw1192``: the onnxruntime-training 1.19.2 keywords ``fw_feed_names, fw_outputs_device_info,
  bw_fetches_names, bw_outputs_device_info`` (+ ``local_rank``);
* ``run_id``: ``TrainingAgent(model, session_options, providers)`` with ``io_binding()``,
  ``run_forward(binding, run_options) -> (outputs, run_id)`` and ``run_backward(grads, run_id)``.

Device infos are spelled three ways: ``ortagent.OrtDevice``, strings, and onnxruntime's own
``OrtDevice`` (a look-alike object when onnxruntime's Python module is not installed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

import ortagent

FORMS = ("state7", "kw1192", "run_id")
STATE_FORMS = ("state7", "kw1192")
DEVICE_SPELLINGS = ("ortdevice", "string", "ort_like")


class LookAlikeDevice:
    """Shaped like onnxruntime's OrtDevice: device_type(), mem_type(), device_id()."""

    def __init__(self, device_type: int, mem_type: int, device_id: int):
        self._type, self._mem, self._id = device_type, mem_type, device_id

    def device_type(self):
        return self._type

    def mem_type(self):
        return self._mem

    def device_id(self):
        return self._id


def device_info(spelling: str, device: str = "cpu"):
    """One device entry, spelled as asked ('cpu', 'cuda:0', 'cuda:1', 'cuda_pinned')."""
    if spelling == "string":
        return device
    if spelling == "ortdevice":
        return ortagent.OrtDevice.parse(device)
    kind, _, index = device.partition(":")
    try:
        from onnxruntime.capi import _pybind_state as C
    except ImportError:
        device_type, mem_type = {"cpu": (0, 0), "cuda": (1, 0), "cuda_pinned": (0, 1)}[kind]
        return LookAlikeDevice(device_type, mem_type, int(index or 0))
    if kind == "cuda_pinned":
        if hasattr(C.OrtDevice, "cuda_pinned_memory"):          # onnxruntime before 1.23
            return C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.cuda_pinned_memory(), int(index or 0))
        # 1.23+: host-accessible GPU memory (memory type 1 aborts the process in OrtDevice())
        return C.OrtDevice(C.OrtDevice.gpu(), 5, int(index or 0))
    device_type = C.OrtDevice.cpu() if kind == "cpu" else C.OrtDevice.cuda()
    return C.OrtDevice(device_type, C.OrtDevice.default_memory(), int(index or 0))


@dataclass
class GraphNames:
    inputs: list[str]
    module_outputs: list[str]
    gradients: list[str]
    outputs: list[str]


def graph_names(model: onnx.ModelProto) -> GraphNames:
    node = next(n for n in model.graph.node if n.op_type == "YieldOp")
    return GraphNames([v.name for v in model.graph.input], list(node.input), list(node.output),
                      [v.name for v in model.graph.output])


def make_agent(model, form: str, *, spelling: str = "string", fw_device: str = "cpu",
               bw_device: str = "cpu", session_options=None, providers=None):
    """A TrainingAgent over ``model`` (a ModelProto, bytes or a path) built in ``form``."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model) if isinstance(model, str) \
        else onnx.load_from_string(model)
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    names = graph_names(proto)
    fw_devices = [device_info(spelling, fw_device) for _ in names.module_outputs]
    bw_devices = [device_info(spelling, bw_device) for _ in names.outputs]
    if form == "state7":
        return ortagent.TrainingAgent(source, names.inputs, names.module_outputs, fw_devices, names.gradients,
                                      names.outputs, bw_devices, session_options=session_options,
                                      providers=providers)
    if form == "kw1192":
        return ortagent.TrainingAgent(source, fw_feed_names=names.inputs, fw_outputs_device_info=fw_devices,
                                      bw_fetches_names=names.outputs, bw_outputs_device_info=bw_devices,
                                      session_options=session_options, providers=providers, local_rank=0)
    if form == "run_id":
        return ortagent.TrainingAgent(source, session_options, providers)
    raise ValueError(form)


class Run:
    """One forward in flight: the state or run id, the binding, the forward outputs."""

    def __init__(self, handle, binding, outputs):
        self.handle = handle
        self.binding = binding
        self.outputs = outputs

    def numpy_outputs(self) -> list[np.ndarray]:
        return [value.numpy().copy() for value in self.outputs]


class Driver:
    """Runs forward and backward of one agent in its form. Feeds are given as a dict of arrays;
    with ``as_values`` they go in as OrtValues, else as NumPy arrays (both are accepted)."""

    def __init__(self, agent, form: str, names: GraphNames, as_values: bool = True, bind_outputs=None):
        self.agent = agent
        self.form = form
        self.names = names
        self.as_values = as_values
        self.bind_outputs = bind_outputs     # run-id API: {output name: device} to bind, or None

    @classmethod
    def for_model(cls, model: onnx.ModelProto, form: str, as_values: bool = True, **kwargs) -> Driver:
        return cls(make_agent(model, form, **kwargs), form, graph_names(model), as_values)

    def _value(self, array):
        array = np.asarray(array)
        return ortagent.OrtValue.ortvalue_from_numpy(array) if self.as_values else array

    def new_binding(self):
        binding = self.agent.io_binding()
        for name, device in (self.bind_outputs or {}).items():
            binding.bind_output(name, device)
        return binding

    def forward(self, feeds: dict[str, np.ndarray], binding=None, run_options=None) -> Run:
        if self.form == "run_id":
            binding = binding or self.new_binding()
            for name in self.names.inputs:
                if self.as_values:
                    binding.bind_ortvalue_input(name, self._value(feeds[name]))
                else:
                    binding.bind_cpu_input(name, feeds[name])
            outputs, run_id = self.agent.run_forward(binding, run_options)
            return Run(run_id, binding, outputs)
        state = ortagent.PartialGraphExecutionState()
        outputs: list = []
        self.agent.run_forward([self._value(feeds[name]) for name in self.names.inputs], outputs, state)
        return Run(state, None, outputs)

    def backward_values(self, run: Run, gradients) -> list:
        grads = [self._value(g) for g in gradients]
        if self.form == "run_id":
            self.agent.run_backward(grads, run.handle)
            return run.binding.get_outputs()
        results: list = []
        self.agent.run_backward(grads, results, run.handle)
        return results

    def backward(self, run: Run, gradients) -> list[np.ndarray]:
        return [value.numpy().copy() for value in self.backward_values(run, gradients)]

    def run(self, feeds, gradients) -> tuple[list[np.ndarray], list[np.ndarray]]:
        handle = self.forward(feeds)
        outputs = handle.numpy_outputs()
        return outputs, self.backward(handle, gradients)


class AgentRunner:
    """The interface of ``training_graphs.SplitRunner`` over a Driver, so that
    ``check_finite_differences`` runs through the agent."""

    def __init__(self, driver: Driver):
        self.driver = driver

    def run_forward(self, feeds):
        run = self.driver.forward(feeds)
        outputs = run.numpy_outputs()
        if self.driver.form == "run_id":
            self.driver.agent.release_run(run.handle)   # never resumed
        return outputs, None

    def run(self, feeds, gradients):
        return self.driver.run(feeds, gradients)


def slow_training_graph(size: int = 256):
    """A training graph that takes a noticeable time on both sides: y = x @ w^trips (a Loop of
    MatMuls, ``trips`` a graph input read by both halves), and x_grad = y_grad @ (w^T)^trips.

    Returns ``(model, reference)`` where ``reference(x, w, trips, y_grad)`` gives
    ``(y, x_grad)`` in float64.
    """
    from onnx import TensorProto, helper, numpy_helper

    from ortagent_testkit import training_graphs as tg

    def info(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, shape)

    def body(name, carried, other, out):
        return helper.make_graph(
            [helper.make_node("MatMul", [carried, other], [out]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"])],
            name,
            [info("i", TensorProto.INT64, []), info("cond_in", TensorProto.BOOL, []),
             info(carried, TensorProto.FLOAT, [size, size])],
            [info("cond_out", TensorProto.BOOL, []), info(out, TensorProto.FLOAT, [size, size])])

    nodes = [
        helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body("forward_body", "h_in", "w", "h_out")),
        tg.yield_node(["y"], ["y_grad"], [0]),
        helper.make_node("Transpose", ["w"], ["wT"], perm=[1, 0]),
        helper.make_node("Loop", ["trips", "cond", "y_grad"], ["x_grad"],
                         body=body("backward_body", "g_in", "wT", "g_out")),
    ]
    model = tg.make_model(
        nodes,
        [info("x", TensorProto.FLOAT, [size, size]), info("trips", TensorProto.INT64, []),
         info("w", TensorProto.FLOAT, [size, size])],
        [info("x_grad", TensorProto.FLOAT, [size, size])],
        [numpy_helper.from_array(np.array(True), "cond")], name="slow_training_graph")

    def reference(x, w, trips, y_grad):
        power = np.linalg.matrix_power(w.astype(np.float64), int(trips))
        return x.astype(np.float64) @ power, y_grad.astype(np.float64) @ power.T

    return model, reference


def orthogonal(size: int, seed: int) -> np.ndarray:
    """A random orthogonal float32 matrix (repeated products neither blow up nor vanish)."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((size, size)))
    return q.astype(np.float32)
