"""The sessions behind one exported graph, and the autograd function that runs them.

A :class:`GraphRunner` owns what runs one :class:`~ortagent.torch._export.ExportedGraph`: an
:class:`~ortagent.InferenceSession` of the forward (eval mode, ``torch.no_grad()``) and one
:class:`~ortagent.TrainingAgent` per set of tensors that need a gradient. The training graph is
built once with the export's symbolic dimensions and serves every shape the export accepts;
only when the autodiff needs static shapes for some operator is it built again per input shape
(a small cache of those). Built training graphs can be kept on disk (:mod:`._cache`).

:class:`ORTFunction` is the ``torch.autograd.Function``: its forward runs the agent's forward
(state API, one :class:`~ortagent.PartialGraphExecutionState` in the context), its backward
resumes it from the output gradients. Tensors cross by DLPack without copies.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import torch
from torch.utils.dlpack import from_dlpack as _torch_from_dlpack
from torch.utils.dlpack import to_dlpack as _torch_to_dlpack

from ortagent._core import PartialGraphExecutionState, from_dlpack
from ortagent.errors import OrtInvalidArgument, OrtNotImplemented, RunStateError

from ._export import IR_VERSION, ExportedGraph, collector_paused, inference_model
from ._threads import default_session_options, release_torch_workers
from ._trees import _PLAIN_TENSOR_TYPES

__all__ = ["GraphRunner", "AgentPlan", "ORTFunction", "SessionConfig", "to_ort", "to_torch"]

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_SPECIALIZED_GRAPHS = 8         # training graphs kept per runner when the autodiff needs static shapes


_DLPACK_CPU = 1                 # DLPack's device type of host memory
_DLPACK_VERSION = (1, 0)


def _plain_cpu(tensor: torch.Tensor) -> bool:
    """Whether :func:`to_ort` exports ``tensor`` with ``to_dlpack`` directly (see there)."""
    return type(tensor) in _PLAIN_TENSOR_TYPES and tensor.is_cpu and tensor.layout is torch.strided \
        and not tensor.is_conj()


def to_ort(tensor: torch.Tensor, stream: int | None = None) -> Any:
    """An OrtValue over the tensor's memory. For a CUDA tensor, ``stream`` is the stream
    onnxruntime computes on: torch makes its pending work on the tensor visible to it.

    A plain strided CPU tensor (most calls: every parameter, every step) is exported with
    ``torch.utils.dlpack.to_dlpack`` directly: ``Tensor.__dlpack__``'s checks in Python cost
    about 2 µs a tensor, and none of them applies to it (its gradient flag does not cross, it
    has no conjugate bit and no stream)."""
    if _plain_cpu(tensor):
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        return from_dlpack(_torch_to_dlpack(tensor))
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if stream is not None and tensor.device.type == "cuda":
        return from_dlpack(tensor, stream=stream)
    return from_dlpack(tensor)


#: torch's C function behind ``torch.utils.dlpack.from_dlpack`` for a capsule (the Python
#: function first asks whether its argument is a capsule or a DLPack producer)
_tensor_of_capsule = getattr(torch._C, "_from_dlpack", _torch_from_dlpack)


def to_torch(value: Any) -> torch.Tensor:
    """A tensor over the OrtValue's memory (on a CUDA device, ordered after onnxruntime's
    work by the stream torch names in the DLPack exchange)."""
    if value.__dlpack_device__()[0] == _DLPACK_CPU:
        return host_to_torch(value)
    return _torch_from_dlpack(value)


def host_to_torch(value: Any) -> torch.Tensor:
    """:func:`to_torch` of an OrtValue known to be in host memory (a CPU session's output)."""
    return _tensor_of_capsule(value.__dlpack__(max_version=_DLPACK_VERSION))


@dataclass(frozen=True)
class SessionConfig:
    """What every session of one ORTModule is created with. ``cpu_kernels``: whether training
    graphs use ortagent's CPU gradient kernels (None: wherever the sessions run on the CPU
    provider alone)."""

    providers: Sequence[Any] | None
    session_options: Any
    cpu_kernels: bool | None = None

    def __deepcopy__(self, memo: dict) -> SessionConfig:
        # a copied ORTModule creates its sessions with the same providers and options
        return self

    def options(self, cpu_kernels: bool = False) -> Any:
        """The caller's session options, else :func:`._threads.default_session_options`
        (onnxruntime's defaults, with intra-op threads that spin only during a run where torch's
        OpenMP workers are released before it, and sleep between nodes otherwise: a training
        step interleaves torch's own work with onnxruntime's runs, and threads that spin on after
        a run take the CPUs torch's threads then need; 2 threads each on 2 CPUs: ResNet-18's
        eager forward in the same process 10-12 ms with onnxruntime's threads asleep, 39-45 ms
        with them spinning). With ``cpu_kernels``, ortagent's CPU gradient kernels are added
        (to a copy of the caller's options: theirs are left as they were)."""
        options = self.session_options
        if options is None:
            options = default_session_options()
        elif cpu_kernels:
            options = copy.copy(options)
        if cpu_kernels:
            options.add_cpu_training_kernels()
        return options

    def check_kernels(self, device: torch.device) -> None:
        """Refuse ``cpu_kernels=True`` where the sessions cannot run them (before exporting)."""
        if self.cpu_kernels and not (device.type == "cpu" and self.kernels_usable(self.providers_for(device))):
            raise OrtInvalidArgument("ORTModule(cpu_kernels=True): ortagent's CPU gradient kernels run on "
                                     "onnxruntime's CPU provider alone, with ortagent's SessionOptions; this module "
                                     f"runs on {device} with providers {self.providers_for(device)}")

    def providers_for(self, device: torch.device, stream: int | None = None) -> list:
        """The providers of sessions on ``device`` (``stream``: torch's CUDA stream onnxruntime computes on)."""
        if self.providers is not None:
            return list(self.providers)
        if device.type == "cuda":
            return [("CUDAExecutionProvider", {"device_id": str(device.index or 0),
                                               "has_user_compute_stream": "1",
                                               "user_compute_stream": str(stream)}),
                    "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def kernels_usable(self, providers: Sequence[Any]) -> bool:
        """Whether sessions with ``providers`` and these options can run ortagent's CPU kernels:
        the CPU provider alone, and ortagent's SessionOptions (or none given) that choose no
        provider of their own (devices or a selection policy)."""
        names = [provider[0] if isinstance(provider, tuple) else provider for provider in providers]
        options = self.session_options
        return (all(name == "CPUExecutionProvider" for name in names)
                and (options is None or (hasattr(options, "add_cpu_training_kernels") and not options.has_providers())))


@dataclass(frozen=True)
class AgentPlan:
    """A training agent and how one call feeds it: ``feed_order`` indexes the graph inputs the
    agent reads in its order, ``non_differentiable`` lists module outputs without a gradient,
    ``gradient_slots`` the graph input each gradient output belongs to, ``gradient_views`` the
    shape each gradient is viewed as (its input's, where the graph writes it in another one of
    the same size) or None."""

    agent: Any
    feed_order: tuple[int, ...]
    non_differentiable: tuple[int, ...]
    gradient_slots: tuple[int, ...]
    gradient_views: tuple[tuple[int, ...] | None, ...]
    #: the call's tensors (positions among the feeds) the backward reads again, and the module
    #: outputs it reads (stashed): saved for backward, so that an in-place change of one between
    #: the forward and the backward meets torch's own check, as an eager module's saved tensors do
    backward_reads: tuple[int, ...] = ()
    stashed_outputs: tuple[int, ...] = ()
    #: for each gradient output, the module outputs (indices) whose gradients it is computed
    #: from, and those its input reaches in the forward: a gradient none of whose sources, or
    #: none of whose reached outputs, gets a gradient in a backward is None there, as eager's
    #: gradient of a tensor the loss does not reach (a parameter no output reaches: always)
    gradient_sources: tuple[frozenset[int], ...] = ()
    gradient_reach: tuple[frozenset[int], ...] = ()
    #: the wall seconds the last forward and backward runs took (0.0: none yet), for
    #: :meth:`GraphRunner.before_run`
    run_seconds: list[float] = field(default_factory=lambda: [0.0, 0.0], compare=False)


class GraphRunner:
    """The sessions that run one exported graph on one device."""

    def __init__(self, exported: ExportedGraph, config: SessionConfig, device: torch.device,
                 cache: Any = None) -> None:
        self.exported = exported
        self.config = config
        self.device = device
        self.cache = cache
        self._lock = threading.Lock()
        self._session: Any = None
        self._agents: dict[tuple, AgentPlan] = {}
        self._specialized: OrderedDict[tuple, AgentPlan] = OrderedDict()
        self._symbolic_failed: set[tuple] = set()
        # CUDA: onnxruntime computes on torch's current stream of the device (captured now), and
        # torch orders its work on the tensors it hands over before that stream (DLPack's
        # stream argument). With the caller's own providers the stream is not known: torch's
        # current stream is synchronized before each run instead.
        self.stream: int | None = None
        if device.type == "cuda" and config.providers is None:
            self.stream = torch.cuda.current_stream(device).cuda_stream
        # the graph inputs that are the module's parameters and buffers: the same tensors
        # call after call, whose OrtValues are kept (see feed_values)
        n_user, n_state = exported.n_user, len(exported.state_names)
        self._state_inputs = frozenset(index for index, position in enumerate(exported.input_positions)
                                       if n_user <= position < n_user + n_state)
        self._kept_values: dict[int, tuple] = {}
        # (a CPU session's outputs are in host memory: no device to ask each of them about)
        self.to_torch = host_to_torch if device.type == "cpu" else to_torch
        self._inference_seconds = 0.0           # (the last inference run's wall time)
        # the sessions' intra-op threads (0: onnxruntime's choice), for release_torch_workers
        self.session_threads = 0 if config.session_options is None else config.session_options.intra_op_num_threads

    # -- sessions -------------------------------------------------------------------------------

    def _providers(self) -> list:
        return self.config.providers_for(self.device, self.stream)

    def _ort_device(self) -> str:
        return f"cuda:{self.device.index or 0}" if self.device.type == "cuda" else "cpu"

    def before_run(self, last_seconds: float = 0.0) -> None:
        """Ready a run whose kind last took ``last_seconds``: on CUDA, torch's pending work on
        the device is ordered before it; on the CPU, torch's idle OpenMP workers are let go
        where the run is long enough to gain from the CPUs they hold (``_RELEASE_ABOVE``)."""
        if self.device.type == "cuda":
            if self.stream is None:
                torch.cuda.current_stream(self.device).synchronize()
        elif last_seconds >= _RELEASE_ABOVE:
            release_torch_workers(self.session_threads)

    def to_ort(self, tensor: torch.Tensor) -> Any:
        return to_ort(tensor, self.stream)

    def feed_values(self, feeds: Sequence[torch.Tensor], order: Sequence[int]) -> list:
        """OrtValues over ``feeds[i]`` for each graph input ``i`` in ``order``. A parameter's or
        buffer's is kept and given again while the input is the same tensor over the same
        memory, shape and dtype (an optimizer updates it in place, which the value sees): a
        call of a model with 36 parameters spent about 100 µs exporting them through DLPack.
        Kept only for plain contiguous CPU tensors, the ones :func:`to_ort` views directly
        (a CUDA tensor's export orders torch's stream before onnxruntime's each time)."""
        kept = self._kept_values
        state_inputs = self._state_inputs
        values = []
        for index in order:
            tensor = feeds[index]
            if index not in state_inputs:
                values.append(to_ort(tensor, self.stream))
                continue
            entry = kept.get(index)
            if entry is not None and entry[0] is tensor and entry[1] == tensor.data_ptr() \
                    and entry[2] == tensor.shape and entry[3] is tensor.dtype and tensor.is_contiguous():
                values.append(entry[4])
                continue
            value = to_ort(tensor, self.stream)
            if _plain_cpu(tensor) and tensor.is_contiguous():
                kept[index] = (tensor, tensor.data_ptr(), tensor.shape, tensor.dtype, value)
            else:
                kept.pop(index, None)
            values.append(value)
        return values

    def inference_session(self) -> Any:
        with self._lock:
            if self._session is None:
                from ortagent._core import strict_providers
                from ortagent._core import InferenceSession

                with strict_providers():        # the module's device, or an error: never another
                    self._session = InferenceSession(inference_model(self.exported.model).SerializeToString(),
                                                     self.config.options(), self._providers())
            return self._session

    def run_inference(self, feeds: list[torch.Tensor]) -> list[torch.Tensor]:
        session = self.inference_session()
        names = self.exported.input_names
        self.before_run(self._inference_seconds)
        began = perf_counter()
        if self.device.type == "cuda":
            binding = session.io_binding()
            for name, tensor in zip(names, feeds):
                binding.bind_ortvalue_input(name, self.to_ort(tensor))
            for name in self.exported.output_names:
                binding.bind_output(name, "cuda", self.device.index or 0)
            session.run_with_iobinding(binding)
            outputs = binding.get_outputs()
        else:
            values = self.feed_values(feeds, range(len(feeds)))
            outputs = session.run_with_ort_values(None, dict(zip(names, values)))
        self._inference_seconds = perf_counter() - began
        return list(map(self.to_torch, outputs))

    # -- training agents -----------------------------------------------------------------------------

    def agent(self, trainable: tuple[str, ...], input_gradients: tuple[str, ...],
              feeds: Sequence[torch.Tensor]) -> AgentPlan:
        """The agent computing the gradients of ``trainable`` parameters and ``input_gradients``
        user inputs (graph input names), for a call with the graph inputs ``feeds`` (their
        shapes matter only where the autodiff needs static ones)."""
        key = (trainable, input_gradients)
        with self._lock:
            plan = self._agents.get(key)
            if plan is not None:
                return plan
            shapes = tuple(tuple(tensor.shape) for tensor in feeds)
            specialized_key = (key, shapes)
            plan = self._specialized.get(specialized_key)
            if plan is not None:
                self._specialized.move_to_end(specialized_key)
                return plan
            if key not in self._symbolic_failed:
                try:
                    plan = self._build(trainable, input_gradients, None)
                except OrtNotImplemented:
                    # some operator's derivative needs static shapes: build at this call's
                    # shapes (its own refusal, if any, is the one the caller sees)
                    if not self.exported.guard.symbolic:
                        raise
                    self._symbolic_failed.add(key)
                else:
                    self._agents[key] = plan
                    return plan
            plan = self._build(trainable, input_gradients, shapes)
            self._specialized[specialized_key] = plan
            while len(self._specialized) > _SPECIALIZED_GRAPHS:
                self._specialized.popitem(last=False)
            return plan

    def check(self, plan: AgentPlan, feeds: Sequence[torch.Tensor]) -> None:
        """Run ``plan``'s agent forward and backward once on ``feeds``, outside autograd, with
        zero output gradients: errors of the graph show now rather than in torch's backward."""
        state = PartialGraphExecutionState()
        outputs: list = []
        self.before_run()
        began = perf_counter()
        plan.agent.run_forward([self.to_ort(feeds[i].detach()) for i in plan.feed_order], outputs, state)
        plan.run_seconds[0] = perf_counter() - began
        non_differentiable = set(plan.non_differentiable)
        zeros = [torch.zeros_like(to_torch(value)) for index, value in enumerate(outputs)
                 if index not in non_differentiable]
        began = perf_counter()
        plan.agent.run_backward([self.to_ort(grad) for grad in zeros], [], state)
        plan.run_seconds[1] = perf_counter() - began

    @collector_paused()                 # (as an export's: see there)
    def _build(self, trainable: tuple[str, ...], input_gradients: tuple[str, ...],
               shapes: tuple[tuple[int, ...], ...] | None) -> AgentPlan:
        from ortagent.agent import TrainingAgent

        graph = None
        cpu_kernels = self._cpu_kernels()
        # (a graph with the kernels runs only where they are registered: one cache entry each)
        cache_key = (trainable, input_gradients, shapes) + (("cpu_kernels",) if cpu_kernels else ())
        if self.cache is not None:
            graph = self.cache.load_training_graph(cache_key)
        if graph is None:
            graph = self._training_graph(trainable, input_gradients, shapes, cpu_kernels)
            if self.cache is not None:
                self.cache.store_training_graph(cache_key, graph)
        names = list(self.exported.input_names)
        yield_node = next(node for node in graph.graph.node if node.op_type == "YieldOp")
        fetches = list(yield_node.input)
        outputs = [value.name for value in graph.graph.output]
        device = self._ort_device()
        agent = TrainingAgent(graph.SerializeToString(),
                              fw_feed_names=[value.name for value in graph.graph.input],
                              fw_fetches_names=fetches,
                              fw_outputs_device_info=[device] * len(fetches),
                              bw_feed_names=list(yield_node.output),
                              bw_fetches_names=outputs,
                              bw_outputs_device_info=[device] * len(outputs),
                              session_options=self.config.options(cpu_kernels),
                              providers=self._providers())
        non_differentiable: list[int] = []
        for attr in yield_node.attribute:
            if attr.name == "non_differentiable_outputs":
                non_differentiable = sorted(attr.ints)
        split = agent.split
        stash = set(split.stash_names)
        differentiable = [index for index in range(len(fetches)) if index not in non_differentiable]
        return AgentPlan(agent,
                         tuple(names.index(value.name) for value in graph.graph.input),
                         tuple(non_differentiable),
                         tuple(names.index(name) for name in (*input_gradients, *trainable)),
                         _gradient_views(graph, (*input_gradients, *trainable)),
                         tuple(names.index(name) for name in split.backward_graph_input_names),
                         tuple(index for index, name in enumerate(split.module_output_names) if name in stash),
                         *_gradient_sources(graph, yield_node, differentiable, (*input_gradients, *trainable),
                                            self.exported.autograd_reach))

    def _cpu_kernels(self) -> bool:
        """Whether this device's training graphs use ortagent's CPU gradient kernels (a
        ``cpu_kernels=True`` that cannot be met was refused before the export)."""
        if self.config.cpu_kernels is False:
            return False
        return self.device.type == "cpu" and self.config.kernels_usable(self._providers())

    def _training_graph(self, trainable: tuple[str, ...], input_gradients: tuple[str, ...],
                        shapes: tuple[tuple[int, ...], ...] | None, cpu_kernels: bool = False) -> Any:
        from ortagent.training import build_training_graph

        model = self.exported.model
        if shapes is not None:
            model = specialize(model, self.exported.input_names, shapes)
        names = self.exported.input_names
        return build_training_graph(
            model, trainable,
            user_inputs=[name for name in names if name not in trainable],
            input_gradients=input_gradients,
            non_differentiable_outputs=self.exported.non_differentiable_outputs,
            ir_version=IR_VERSION,
            symbols_above_one=self._symbols_above_one() if shapes is None else (),
            input_symbols_checked=True, gradient_views=True, cpu_kernels=cpu_kernels)

    def _symbols_above_one(self) -> list[str]:
        """The inputs' symbols whose lower bound is 2 or more: every call's shapes pass the
        guard first (ORTModule exports again for shapes it does not accept), so each is at
        least 2 whenever the graph runs."""
        guard = self.exported.guard
        named = {dim for dims in guard.dims if dims for dim in dims if isinstance(dim, str)}
        return sorted(symbol for symbol, lower, _ in guard.ranges if symbol in named and lower >= 2)

    def close(self) -> None:
        with self._lock:
            plans = [*self._agents.values(), *self._specialized.values()]
            self._agents.clear()
            self._specialized.clear()
            self._kept_values.clear()
            session, self._session = self._session, None
        for plan in plans:
            plan.agent.close()
        if session is not None:
            session.close()


def _gradient_sources(graph: Any, yield_node: Any, differentiable: Sequence[int], differentiated: Sequence[str],
                      autograd_reach: Sequence[tuple[str, frozenset[int]]] | None = None,
                      ) -> tuple[tuple[frozenset[int], ...], tuple[frozenset[int], ...]]:
    """For each output of the training ``graph`` (the gradient of the input ``differentiated``
    names at its place), the module outputs whose gradients it is computed from (the
    ``yield_node``'s outputs: those of the ``differentiable`` module outputs, in order), and the
    differentiable module outputs its input reaches in the forward. An input that reaches no
    differentiable output is not in any graph of the loss. The ONNX graph does not show whether
    torch differentiates a path: ``x > p`` and ``p.detach()`` reach an output there, where torch
    gives ``p`` None, and ``round(p)``, ``copysign``'s sign operand or a nearest ``grid_sample``'s
    grid do too, where torch gives zeros; ``autograd_reach`` (the outputs whose autograd graph
    held each input when the forward ran eagerly, by name) tells them apart."""
    from ortagent._onnx_graph import consumed_names

    reads = [(tuple(consumed_names(node)), tuple(node.output)) for node in graph.graph.node if node is not yield_node]
    backward = _flow(reads, {name: 1 << bit for bit, name in enumerate(yield_node.output)})
    forward = _flow(reads, {name: 1 << bit for bit, name in enumerate(differentiated)})
    outputs = [forward.get(yield_node.input[index], 0) for index in differentiable]
    held = dict(autograd_reach) if autograd_reach is not None else {}
    sources, reach = [], []
    for bit, output in enumerate(graph.graph.output):
        mask = backward.get(output.name, 0)
        sources.append(frozenset(differentiable[index] for index in range(len(differentiable)) if mask >> index & 1))
        reached = frozenset(differentiable[index] for index, mask in enumerate(outputs) if mask >> bit & 1)
        name = differentiated[bit]
        reach.append(reached & held[name] if name in held else reached)
    return tuple(sources), tuple(reach)


def _flow(reads: Sequence[tuple[tuple[str, ...], tuple[str, ...]]], seeds: dict[str, int]) -> dict[str, int]:
    """The bit masks of ``seeds`` passed on from each node's inputs to its outputs (``reads``:
    the nodes' input and output names) until nothing changes: one pass where the nodes are in
    order, as ONNX asks, and another that changes nothing."""
    masks = dict(seeds)
    changed = True
    while changed:
        changed = False
        for inputs, outputs in reads:
            mask = 0
            for name in inputs:
                mask |= masks.get(name, 0)
            if mask:
                for name in outputs:
                    before = masks.get(name, 0)
                    if before | mask != before:
                        masks[name] = before | mask
                        changed = True
    return masks


def _gradient_views(graph: Any, differentiated: Sequence[str]) -> tuple:
    """For each gradient output of the training ``graph`` (in order, of its ``differentiated``
    inputs), the static shape of its input where the output declares another one, else None."""
    from ortagent.graph_split import TensorInfo

    def dims(value: Any) -> tuple[int, ...] | None:
        info = TensorInfo.from_type_proto(value.type)
        if info is None or info.shape is None or not all(isinstance(dim, int) for dim in info.shape):
            return None
        return info.shape  # type: ignore[return-value]

    inputs = {value.name: dims(value) for value in graph.graph.input}
    views = []
    for name, output in zip(differentiated, graph.graph.output):
        wanted, written = inputs.get(name), dims(output)
        views.append(wanted if wanted is not None and written is not None and written != wanted else None)
    return tuple(views)


def specialize(model: Any, input_names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> Any:
    """A copy of ``model`` whose inputs ``input_names`` have the static ``shapes``; symbols are
    replaced by their values wherever they appear, other symbolic dimensions are cleared for
    shape inference to fill in."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    values: dict[str, int] = {}
    inputs = {value.name: value for value in copy.graph.input}
    for name, shape in zip(input_names, shapes):
        value = inputs.get(name)
        if value is None:
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, shape):
            if dim.dim_param:
                values[dim.dim_param] = size
            dim.dim_value = size
    for value in [*copy.graph.value_info, *copy.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                size = values.get(dim.dim_param)
                if size is None:
                    size = _evaluate(dim.dim_param, values)
                if size is None:
                    dim.ClearField("dim_param")
                else:
                    dim.dim_value = size
    return copy


def _evaluate(expression: str, values: dict[str, int]) -> int | None:
    import sympy

    try:
        result = sympy.sympify(expression).subs(values)
    except (sympy.SympifyError, TypeError, ValueError):
        return None
    return int(result) if result.is_Integer else None


#: runs shorter than this (seconds, the kind's last run) keep torch's OpenMP workers: letting
#: them go and starting new ones costs torch's next parallel work 0.05-0.1 ms or more, more
#: than a run of a few hundred microseconds gains from a second CPU
_RELEASE_ABOVE = 1e-3


#: in a backward: whether torch keeps the graph after it (``retain_graph``), the engine's answer
#: that torch's own compiled functions ask for too; a torch without the query keeps nothing
_graph_kept = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: False)


class ORTFunction(torch.autograd.Function):
    """A forward through the agent, with its backward resumed from the output gradients.

    The run's stash lives as long as torch keeps the graph: a backward with ``retain_graph``
    (or ``create_graph``) retains the run for another backward, one without frees it when it
    returns, and a graph dropped unused frees it with this node's context."""

    @staticmethod
    def forward(ctx: Any, runner: GraphRunner, plan: AgentPlan, *feeds: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = PartialGraphExecutionState()
        outputs: list = []
        values = runner.feed_values(feeds, plan.feed_order)
        run_seconds = plan.run_seconds
        runner.before_run(run_seconds[0])
        began = perf_counter()
        plan.agent.run_forward(values, outputs, state)
        run_seconds[0] = perf_counter() - began
        results = tuple(map(runner.to_torch, outputs))
        ctx.save_for_backward(*[feeds[index] for index in plan.backward_reads],
                              *[results[index] for index in plan.stashed_outputs])
        ctx.state = state
        ctx.runner = runner
        ctx.plan = plan
        ctx.n_feeds = len(feeds)
        ctx.output_meta = [(r.shape, r.dtype, r.device) for r in results]
        ctx.set_materialize_grads(False)    # (an output the loss does not reach: None, see backward)
        if plan.non_differentiable:
            ctx.mark_non_differentiable(*[results[i] for i in plan.non_differentiable])
        return results

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor | None) -> tuple:
        if torch.is_grad_enabled():
            # create_graph: eager's gradients would carry a graph of their own; onnxruntime's
            # have none, so a loss built on them (a gradient penalty) would lose its share of the
            # gradient without a word, and a Hessian through them would be zero
            raise OrtNotImplemented(
                "ORTModule: a backward with create_graph=True (for a gradient penalty, a Hessian or "
                "Hessian-vector product, MAML's inner step, torch.autograd.functional.hessian) is not "
                "supported: onnxruntime computes the gradients outside torch's autograd, so they cannot be "
                "differentiated again; run this module eagerly for it")
        state = ctx.state
        if state is None:
            raise RunStateError("ORTModule: the backward of this forward already ran and freed what it kept; pass "
                                "retain_graph=True to the first backward to run another one (as for eager modules)")
        ctx.saved_tensors                   # (torch's error where one was changed in place since)
        keep = _graph_kept()
        if keep and not state.retained:
            state.retain()
        plan: AgentPlan = ctx.plan
        runner: GraphRunner = ctx.runner
        non_differentiable = plan.non_differentiable
        grads = []
        for index, grad in enumerate(grad_outputs):
            if non_differentiable and index in non_differentiable:
                continue
            if grad is None:
                shape, dtype, device = ctx.output_meta[index]
                grad = torch.zeros(shape, dtype=dtype, device=device)
            grads.append(runner.to_ort(grad))
        fetches: list = []
        run_seconds = plan.run_seconds
        runner.before_run(run_seconds[1])
        began = perf_counter()
        plan.agent.run_backward(grads, fetches, state)
        run_seconds[1] = perf_counter() - began
        if not keep:
            ctx.state = None                # (a retained run's stash goes with it)
        result: list = [None] * (2 + ctx.n_feeds)
        tensor = runner.to_torch
        unreached = {index for index, grad in enumerate(grad_outputs) if grad is None}
        for feed_index, view, value, sources, reach in zip(plan.gradient_slots, plan.gradient_views, fetches,
                                                           plan.gradient_sources, plan.gradient_reach):
            if reach <= unreached or (sources and sources <= unreached):
                continue                    # (the loss does not reach the input: None, as eager)
            result[2 + feed_index] = tensor(value) if view is None else tensor(value).view(view)
        return tuple(result)
