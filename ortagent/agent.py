"""TrainingAgent: run an ORTModule training graph forward until its YieldOp, hand back the module
outputs, and later resume backward from the YieldOp with the output gradients -- on stock
onnxruntime.

Both generations of onnxruntime-training's agent are served by one class:

* state API (onnxruntime-training 1.8 - 1.19.2)::

      agent = TrainingAgent(model, fw_feed_names, fw_fetches_names, fw_outputs_device_info,
                            bw_feed_names, bw_fetches_names, bw_outputs_device_info)
      # or the 1.19.2 keyword form:
      agent = TrainingAgent(model, fw_feed_names=..., fw_outputs_device_info=...,
                            bw_fetches_names=..., bw_outputs_device_info=...)
      state = PartialGraphExecutionState()
      outputs = []
      agent.run_forward(feeds, outputs, state)      # outputs filled in place
      grads = []
      agent.run_backward(output_grads, grads, state)

* run-id API (the io_binding generation)::

      agent = TrainingAgent(model)
      binding = agent.io_binding()
      binding.bind_cpu_input("x", x); ...; binding.bind_output("w_grad")
      outputs, run_id = agent.run_forward(binding, run_options)
      agent.run_backward(output_grads, run_id)
      gradients = binding.get_outputs()

The graph is split once, at construction (see :mod:`ortagent.graph_split`); each half runs as an
ordinary session with the GIL released.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

from ortagent._core import (
    IOBinding,
    OrtDevice,
    OrtValue,
    PartialGraphExecutionState,
    RunOptions,
    SessionOptions,
    _AgentEngine,
    _AgentHotPath,
    as_device,
    output_target,
)
from ortagent.errors import (
    ObjectClosedError,
    OrtInvalidArgument,
    OrtInvalidType,
    UnknownRunError,
)
from ortagent._onnx_graph import load_model, name_list
from ortagent.graph_split import TrainingGraphSplit, split_training_graph
from ortagent.training_ops import lower_training_ops, needs_lowering

__all__ = ["TrainingAgent", "PartialGraphExecutionState", "TrainingIOBinding"]

_STATE_FORM = ("fw_feed_names", "fw_fetches_names", "fw_outputs_device_info", "bw_feed_names",
               "bw_fetches_names", "bw_outputs_device_info")
_FORM_1192 = ("fw_feed_names", "fw_outputs_device_info", "bw_fetches_names", "bw_outputs_device_info")
_SESSION_ARGS = ("session_options", "providers", "provider_options")


def _parse_arguments(args: tuple, kwargs: dict) -> dict:
    """Map the three constructor forms onto one set of named arguments."""
    named = dict(kwargs)
    if "sess_options" in named:
        named.setdefault("session_options", named.pop("sess_options"))
    positional = list(args)
    if positional and (positional[0] is None or isinstance(positional[0], SessionOptions)) or (
            not positional and not any(k in named for k in _STATE_FORM)):
        form: tuple = ()
    elif any(k in named for k in ("fw_fetches_names", "bw_feed_names")) or (
            len(positional) >= 6 and isinstance(positional[4], (list, tuple))):
        form = _STATE_FORM
    else:
        form = _FORM_1192
    order = form + _SESSION_ARGS + (("local_rank",) if form is _FORM_1192 else ())
    if len(positional) > len(order):
        raise OrtInvalidType(f"TrainingAgent takes at most {len(order) + 1} positional arguments")
    for name, value in zip(order, positional):
        if name in named:
            raise OrtInvalidType(f"TrainingAgent got two values for {name!r}")
        named[name] = value
    unknown = set(named) - set(_STATE_FORM) - set(_SESSION_ARGS) - {"local_rank"}
    if unknown:
        raise OrtInvalidType(f"TrainingAgent got unexpected arguments {sorted(unknown)}")
    named["_form"] = form
    return named


def _devices(value: Any, count: int, what: str) -> list[OrtDevice | None]:
    if value is None:
        return [None] * count
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise OrtInvalidType(f"{what} must be a list with one device per fetch")
    devices = list(value)
    if len(devices) < count:
        raise OrtInvalidArgument(f"{what} has {len(devices)} entries for {count} fetches; "
                                 "give one device per fetch")
    return [as_device(device) for device in devices[:count]]


def _position_map(names: list[str], known: Sequence[str], what: str, role: str) -> list[int]:
    positions = []
    for name in names:
        if name not in known:
            raise OrtInvalidArgument(f"{what}: {name!r} is not {role}; expected names among "
                                     f"{list(dict.fromkeys(known))}")
        positions.append(list(known).index(name))
    if len(set(names)) != len(names):
        raise OrtInvalidArgument(f"{what} lists a name twice: {names}")
    return positions


class TrainingAgent(_AgentHotPath):
    """Runs a training graph (ORTModule layout, one ``com.microsoft:YieldOp``) on stock
    onnxruntime, forward until the YieldOp and, later, backward from it.

    ``TrainingAgent(path_or_bytes, session_options=None, providers=None, provider_options=None)``
    gives the run-id API; the state API's constructors (seven positional arguments, or the
    onnxruntime-training 1.19.2 keywords ``fw_feed_names``, ``fw_outputs_device_info``,
    ``bw_fetches_names``, ``bw_outputs_device_info``) name the feeds and fetches and where the
    fetches go. Without names, feeds are all graph inputs in graph order, forward fetches all
    module outputs (YieldOp inputs), backward feeds one gradient per YieldOp output and backward
    fetches all graph outputs.

    Training-only operators of onnxruntime-training (``ReluGrad``, ``SoftmaxGrad_13``,
    ``ConcatTraining``, ...) are first rewritten into standard operators
    (:func:`ortagent.training_ops.lower_training_ops`); one that cannot be raises
    :class:`~ortagent.UnsupportedTrainingOpError` naming the node.

    Invalid graphs raise :class:`~ortagent.TrainingGraphError` at construction (where
    onnxruntime's own agent crashes or misleads), misuse of runs raises
    :class:`~ortagent.RunStateError`.
    """

    def __init__(self, path_or_bytes: Any, *args: Any, **kwargs: Any) -> None:
        named = _parse_arguments(args, kwargs)
        model = load_model(path_or_bytes)
        if needs_lowering(model):          # an ORTModule graph with training-only operators
            model = lower_training_ops(model)
        self._split: TrainingGraphSplit = split_training_graph(model)
        split = self._split
        self._engine = _AgentEngine(split, named.get("session_options"), named.get("providers"),
                                    named.get("provider_options"))
        self._lock = threading.Lock()
        self._runs: dict[int, PartialGraphExecutionState] = {}
        self._run_ids = itertools.count(1)
        form = named["_form"]
        graph_inputs = split.graph_input_names
        module_outputs = split.module_output_names
        feed_names = name_list(named["fw_feed_names"], "fw_feed_names") if form else list(graph_inputs)
        self._feed_positions = _position_map(feed_names, graph_inputs, "fw_feed_names", "a graph input")
        needed = set(split.forward_input_names) | set(split.backward_graph_input_names)
        missing = [name for name in graph_inputs if name in needed and name not in feed_names]
        if missing:
            raise OrtInvalidArgument(f"fw_feed_names lacks graph inputs the graph reads: {missing}")
        if form is _STATE_FORM:
            fetch_names = name_list(named["fw_fetches_names"], "fw_fetches_names")
            self._fetch_positions = [self._module_output_position(name) for name in fetch_names]
            grad_names = name_list(named["bw_feed_names"], "bw_feed_names")
            self._grad_order = _position_map(grad_names, split.gradient_names, "bw_feed_names",
                                             "a YieldOp output (an output gradient)")
            if sorted(self._grad_order) != list(range(len(split.gradient_names))):
                raise OrtInvalidArgument(f"bw_feed_names must list every YieldOp output once: "
                                         f"{list(split.gradient_names)}")
        else:
            self._fetch_positions = list(range(len(module_outputs)))
            self._grad_order = list(range(len(split.gradient_names)))
        if form:
            output_names = name_list(named["bw_fetches_names"], "bw_fetches_names")
        else:
            output_names = list(split.graph_output_names)
        self._output_positions = _position_map(output_names, split.graph_output_names,
                                               "bw_fetches_names", "a graph output")
        self._fetch_devices = _devices(named.get("fw_outputs_device_info"), len(self._fetch_positions),
                                       "fw_outputs_device_info")
        self._output_devices = _devices(named.get("bw_outputs_device_info"),
                                        len(self._output_positions), "bw_outputs_device_info")
        # graph inputs only the backward reads: onnxruntime sees them only then, when the run can
        # no longer be given another value, so they are checked when the forward takes them
        forward_reads = set(split.forward_input_names)
        self._backward_only = [(split.graph_input_names.index(name), name, info)
                               for name, info in zip(split.graph_input_names, split.graph_input_types)
                               if name in split.backward_graph_input_names and name not in forward_reads
                               and info is not None]
        for what, names, devices in (("fw_outputs_device_info", [module_outputs[p] for p in self._fetch_positions],
                                      self._fetch_devices),
                                     ("bw_outputs_device_info", output_names, self._output_devices)):
            for name, device in zip(names, devices):
                self._check_reachable(device, f"{what} entry for {name!r}")
        # Per-call work prepared once: where each module output goes, and whether feeds, fetches
        # and gradients come in graph order already (no reordering per call then).
        self._forward_targets: list[OrtDevice | None] = [None] * len(module_outputs)
        for position, device in zip(self._fetch_positions, self._fetch_devices):
            self._forward_targets[position] = device
        self._feeds_in_order = self._feed_positions == list(range(len(graph_inputs)))
        self._fetches_in_order = self._fetch_positions == list(range(len(module_outputs)))
        self._grads_in_order = self._grad_order == list(range(len(split.gradient_names)))
        # run_forward / run_backward (_AgentHotPath) serve the state API's usual call in C
        self._enable_hot_path(self._engine, self._feeds_in_order and self._fetches_in_order
                              and not self._backward_only, self._grads_in_order,
                              self._forward_targets, self._output_positions, self._output_devices)

    def _check_reachable(self, device, what: str) -> None:
        """Refuse an output device that no session provider can place values on: onnxruntime
        would silently leave the value on the CPU instead."""
        if device is not None and device.name != "cpu" and \
                "CUDAExecutionProvider" not in self._engine.providers:
            raise OrtInvalidArgument(
                f"{what}: {device!r} needs the CUDAExecutionProvider, but this agent runs on "
                f"{self._engine.providers}")

    def _module_output_position(self, name: str) -> int:
        if name not in self._split.module_output_names:
            raise OrtInvalidArgument(
                f"fw_fetches_names: {name!r} is not a module output (a YieldOp input); expected names "
                f"among {list(self._split.module_output_names)}")
        return self._split.module_output_names.index(name)

    # -- properties --------------------------------------------------------------------------------

    @property
    def split(self) -> TrainingGraphSplit:
        """How the graph was split (names of feeds, stash, gradients, outputs; both models)."""
        return self._split

    @property
    def forward_session(self):
        return self._engine.forward_session

    @property
    def backward_session(self):
        return self._engine.backward_session

    def get_providers(self) -> list[str]:
        return self._engine.providers

    @property
    def runs_in_flight(self) -> int:
        """Run ids whose forward ran and whose backward has not (run-id API)."""
        return len(self._runs)

    @property
    def _closed(self) -> bool:
        """The agent's one closed flag is its engine's."""
        return self._engine.closed

    def _require_open(self) -> None:
        if self._closed:
            raise ObjectClosedError("this TrainingAgent has been closed")

    # -- dispatch between the two generations -------------------------------------------------------

    # run_forward and run_backward are _AgentHotPath's: the state API's usual call runs in C
    # there, every other call comes here

    def _run_forward(self, feeds_or_iobinding: Any, fetches_or_run_options: Any = None,
                     state: PartialGraphExecutionState | None = None,
                     cache: Any = None) -> tuple[list[OrtValue], int] | None:
        """run_forward beyond the direct path (see _AgentHotPath.run_forward): names reordered."""
        if self._closed:
            self._require_open()
        feeds_type = type(feeds_or_iobinding)
        if (feeds_type is list or feeds_type is tuple) and type(state) is PartialGraphExecutionState \
                and type(fetches_or_run_options) is list:
            # the state API with plain lists (reordered here when the names ask for it)
            if self._feeds_in_order and len(feeds_or_iobinding) == len(self._feed_positions):
                graph_inputs = feeds_or_iobinding if feeds_type is list else list(feeds_or_iobinding)
            else:
                graph_inputs = self._graph_inputs_from_feeds(feeds_or_iobinding)
            if self._backward_only:
                self._check_backward_only_inputs(graph_inputs)
            outputs = self._engine.forward(state, graph_inputs, None, self._forward_targets)
            fetches_or_run_options[:] = outputs if self._fetches_in_order else \
                [outputs[p] for p in self._fetch_positions]
            return None
        if isinstance(feeds_or_iobinding, TrainingIOBinding):
            if state is not None:
                raise OrtInvalidType("run_forward(iobinding, run_options) takes no state")
            return self._run_forward_bound(feeds_or_iobinding, fetches_or_run_options)
        if isinstance(feeds_or_iobinding, IOBinding) or (
                state is None and hasattr(feeds_or_iobinding, "bind_output")):
            # ortagent's or onnxruntime's session IOBinding: name it rather than ask for a state
            raise OrtInvalidType("use agent.io_binding() for the bindings of a TrainingAgent, not a "
                                 f"session's IOBinding ({type(feeds_or_iobinding).__module__}."
                                 f"{type(feeds_or_iobinding).__qualname__})")
        if not isinstance(state, PartialGraphExecutionState):
            raise OrtInvalidType("run_forward(feeds, fetches, state) needs an "
                                 f"ortagent.PartialGraphExecutionState, got {type(state).__name__}")
        fetches = fetches_or_run_options
        if not isinstance(fetches, list):
            raise OrtInvalidType(f"fetches must be a list (filled in place), got {type(fetches).__name__}")
        outputs = self._engine_forward(state, self._graph_inputs_from_feeds(feeds_or_iobinding), None)
        fetches[:] = [outputs[p] for p in self._fetch_positions]
        return None

    def _run_backward(self, feeds_or_grads: Sequence[Any], fetches_or_run_id: Any,
                      state: PartialGraphExecutionState | None = None) -> None:
        """run_backward beyond the direct path (see _AgentHotPath.run_backward): names reordered."""
        if self._closed:
            self._require_open()
        if type(state) is PartialGraphExecutionState and type(fetches_or_run_id) is list \
                and type(feeds_or_grads) is list and self._grads_in_order:
            # the state API, gradients in order (what run_backward's direct path explains)
            fetches_or_run_id[:] = self._engine._backward_planned(state, feeds_or_grads,
                                                                  self._plan_of_state_api(), None)
            return
        if state is None and not isinstance(fetches_or_run_id, list):
            self._run_backward_by_id(feeds_or_grads, fetches_or_run_id)
            return
        if not isinstance(state, PartialGraphExecutionState):
            raise OrtInvalidType("run_backward(feeds, fetches, state) needs an "
                                 f"ortagent.PartialGraphExecutionState, got {type(state).__name__}")
        fetches = fetches_or_run_id
        if not isinstance(fetches, list):
            raise OrtInvalidType(f"fetches must be a list (filled in place), got {type(fetches).__name__}")
        gradients = self._ordered_gradients(feeds_or_grads)
        fetches[:] = self._engine._backward_planned(state, gradients, self._plan_of_state_api(), None)

    # -- state API helpers ---------------------------------------------------------------------------

    def _graph_inputs_from_feeds(self, feeds) -> list:
        if isinstance(feeds, (str, bytes, dict)) or not isinstance(feeds, Sequence):
            raise OrtInvalidType(f"feeds must be a list of OrtValues (one per fw_feed_names entry), "
                                 f"got {type(feeds).__name__}")
        if len(feeds) != len(self._feed_positions):
            raise OrtInvalidArgument(f"expected {len(self._feed_positions)} feeds (fw_feed_names), "
                                     f"got {len(feeds)}")
        graph_inputs: list = [None] * len(self._split.graph_input_names)
        for position, feed in zip(self._feed_positions, feeds):
            graph_inputs[position] = feed
        return graph_inputs

    def _ordered_gradients(self, grads) -> list:
        if isinstance(grads, (str, bytes, dict)) or not isinstance(grads, Sequence):
            raise OrtInvalidType(f"the gradients must be a list of OrtValues, got {type(grads).__name__}")
        grads = list(grads)
        if len(grads) != len(self._grad_order):
            raise OrtInvalidArgument(
                f"expected {len(self._grad_order)} gradients (one per YieldOp output: "
                f"{list(self._split.gradient_names)}), got {len(grads)}")
        ordered: list = [None] * len(grads)
        for given, position in enumerate(self._grad_order):
            ordered[position] = grads[given]
        return ordered

    def _check_backward_only_inputs(self, graph_inputs) -> None:
        for position, name, info in self._backward_only:
            value = graph_inputs[position]
            if isinstance(value, OrtValue):
                elem_type, shape = value.element_type(), value.shape()
                matches = elem_type == info.elem_type
                got = value.data_type()
            elif hasattr(value, "dtype") and hasattr(value, "shape"):
                shape = list(value.shape)
                matches = info.numpy_dtype is None or value.dtype == info.numpy_dtype
                got = f"a NumPy array of {value.dtype}"
            else:
                continue        # the engine reports what it cannot feed
            if not matches:
                raise OrtInvalidArgument(f"input {name!r} (read by the backward only) expects "
                                         f"tensor({info.type_name.lower()}), got {got}")
            if not info.accepts_shape(shape):
                raise OrtInvalidArgument(f"input {name!r} (read by the backward only) has shape {list(shape)}; "
                                         f"the graph declares {list(info.shape or ())}")

    def _engine_forward(self, state, graph_inputs, run_options):
        if run_options is not None and not isinstance(run_options, RunOptions):
            raise OrtInvalidType(f"run_options must be ortagent.RunOptions, got {type(run_options).__name__}")
        if self._backward_only:
            self._check_backward_only_inputs(graph_inputs)
        return self._engine.forward(state, graph_inputs, run_options, self._forward_targets)

    # -- run-id API ----------------------------------------------------------------------------------

    def io_binding(self) -> TrainingIOBinding:
        """A binding for the training graph's inputs and outputs (run-id API)."""
        self._require_open()
        return TrainingIOBinding(self)

    def _run_forward_bound(self, binding: TrainingIOBinding, run_options):
        if binding._agent is not self:
            raise OrtInvalidArgument("this binding belongs to another TrainingAgent")
        graph_inputs = binding._graph_inputs()
        state = PartialGraphExecutionState()
        outputs = self._engine_forward(state, graph_inputs, run_options)
        state.binding = binding
        with self._lock:
            # under the lock: itertools.count is not thread-safe without the GIL
            run_id = next(self._run_ids)
            state.run_id = run_id
            if not self._closed:
                self._runs[run_id] = state
                return list(outputs), run_id
        # close() ran while this forward did: it could not release a run not yet registered
        state.release()
        raise ObjectClosedError("this TrainingAgent was closed while the forward ran; the run is released")

    def _take_run(self, run_id) -> PartialGraphExecutionState:
        with self._lock:
            state = self._runs.pop(run_id, None)
        if state is None:
            raise UnknownRunError(f"no run with id {run_id!r} is waiting for its backward in this agent "
                                  "(unknown, already resumed, or released)")
        return state

    def _run_backward_by_id(self, grads, run_id):
        state = self._take_run(run_id)
        binding: TrainingIOBinding = state.binding
        try:
            plan = binding._output_plan()
            if type(grads) is not list or not self._grads_in_order:
                grads = self._ordered_gradients(grads)
            outputs = self._engine._backward_planned(state, grads, plan, None)
        except BaseException:
            if state.waiting_for_backward:
                with self._lock:
                    self._runs[run_id] = state      # still resumable
            raise
        binding._set_results(outputs)

    def release_run(self, run_id) -> None:
        """Free a run that will never be resumed (its stash and the inputs it holds)."""
        self._take_run(run_id).release()

    def close(self) -> None:
        """Release every pending run and both sessions."""
        if not self._engine.close():        # closed before (the flag is set once, atomically)
            return
        # a forward of the run-id API registers its run under the lock only while the engine is
        # open, so every run it registered is here
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for state in runs:
            state.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __reduce__(self):
        raise OrtInvalidType("TrainingAgent cannot be pickled")


class TrainingIOBinding:
    """Inputs and outputs of a TrainingAgent's training graph, bound once and reused across runs
    (the names and methods of onnxruntime's IOBinding). Gradients of the last backward resumed
    from a run of this binding land in its bound outputs: see :meth:`get_outputs`."""

    def __init__(self, agent: TrainingAgent):
        self._agent = agent
        self._inputs: dict[str, OrtValue] = {}
        self._outputs: dict[str, object] = {}       # name -> OrtDevice or OrtValue, in order
        self._results: list[OrtValue] = []
        # what runs need, rebuilt only when a binding changes
        self._input_plan: list | None = None
        self._output_plan_cache = None      # the engine's plan of the bound outputs

    def _graph_input_type(self, name: str) -> int | None:
        split = self._agent._split
        if name not in split.graph_input_names:
            raise OrtInvalidArgument(f"unknown input name {name!r}; the training graph's inputs are "
                                     f"{list(split.graph_input_names)}")
        info = split.graph_input_types[split.graph_input_names.index(name)]
        return None if info is None else info.elem_type

    def _check_output_type(self, name: str, value: OrtValue) -> None:
        """A caller's buffer must have the output's element type (onnxruntime's own error, at the
        backward, does not name the output)."""
        split = self._agent._split
        info = split.graph_output_types[split.graph_output_names.index(name)]
        if info is not None and value.element_type() != info.elem_type:
            raise OrtInvalidArgument(f"output {name!r} is tensor({info.type_name.lower()}), got a value of "
                                     f"{value.data_type()}")

    def _check_output(self, name: str) -> None:
        split = self._agent._split
        if name not in split.graph_output_names:
            raise OrtInvalidArgument(f"unknown output name {name!r}; the training graph's outputs are "
                                     f"{list(split.graph_output_names)}")

    def bind_ortvalue_input(self, name: str, value: OrtValue) -> None:
        expected = self._graph_input_type(name)
        if not isinstance(value, OrtValue):
            raise OrtInvalidType(f"input {name!r} must be an OrtValue, got {type(value).__name__}")
        if expected is not None and value.element_type() != expected:
            raise OrtInvalidArgument(f"input {name!r} expects element type {expected}, got "
                                     f"{value.data_type()}")
        self._inputs[name] = value
        self._input_plan = None

    def bind_cpu_input(self, name: str, arr_on_cpu) -> None:
        self._graph_input_type(name)
        self.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(arr_on_cpu))

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr) -> None:
        self._graph_input_type(name)
        if buffer_ptr is None or buffer_ptr == 0:
            raise OrtInvalidArgument(f"input {name!r}: buffer_ptr must not be 0")
        self.bind_ortvalue_input(name, OrtValue._from_pointer(buffer_ptr, shape, element_type,
                                                              device_type, device_id))

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None) -> None:
        self._check_output(name)
        target = output_target(name, device_type, device_id, element_type, shape, buffer_ptr)
        if isinstance(target, OrtDevice):
            self._agent._check_reachable(target, f"output {name!r}")
        else:
            self._check_output_type(name, target)
        self._output_plan_cache = None
        self._outputs[name] = target

    def bind_ortvalue_output(self, name: str, value: OrtValue) -> None:
        self._check_output(name)
        if not isinstance(value, OrtValue):
            raise OrtInvalidType(f"output {name!r} must be an OrtValue, got {type(value).__name__}")
        self._check_output_type(name, value)
        self._outputs[name] = value
        self._output_plan_cache = None

    def clear_binding_inputs(self) -> None:
        self._inputs = {}
        self._input_plan = None

    def clear_binding_outputs(self) -> None:
        self._outputs = {}
        self._output_plan_cache = None
        self._results = []

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: inputs are bound to the sessions at each run."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: each backward synchronizes its outputs before returning."""

    def get_outputs(self) -> list[OrtValue]:
        """The gradients of the last backward resumed from a run of this binding, in the order
        the outputs were bound (all graph outputs when none were bound)."""
        return list(self._results)

    def get_outputs_as_numpy(self) -> list:
        return [value.numpy() for value in self._results]

    def copy_outputs_to_cpu(self) -> list:
        return [value.numpy().copy() for value in self._results]

    # -- for the agent -------------------------------------------------------------------------------

    def _graph_inputs(self) -> list:
        """The bound values in graph-input order (the list is the engine's to read, not change)."""
        if self._input_plan is None:
            split = self._agent._split
            needed = set(split.forward_input_names) | set(split.backward_graph_input_names)
            missing = [name for name in split.graph_input_names if name in needed and name not in self._inputs]
            if missing:
                raise OrtInvalidArgument(f"inputs {missing} of the training graph are not bound")
            self._input_plan = [self._inputs.get(name) for name in split.graph_input_names]
        return self._input_plan

    def _output_plan(self):
        """Where a backward's outputs go: the engine's plan for the bound outputs (all graph
        outputs, where onnxruntime produces them, when none are bound)."""
        if self._output_plan_cache is None:
            index = self._agent._split.graph_output_names.index
            if not self._outputs:
                count = len(self._agent._split.graph_output_names)
                positions, targets = list(range(count)), [None] * count
            else:
                positions, targets = [index(name) for name in self._outputs], list(self._outputs.values())
            self._output_plan_cache = self._agent._engine._plan_outputs(positions, targets)
        return self._output_plan_cache

    def _set_results(self, outputs: list) -> None:
        self._results = outputs
