# cython: language_level=3
"""The TrainingAgent engine: a training graph split at its YieldOp, run as two sessions.

A run's forward computes the module outputs and the stash (forward values the backward reads);
the stash stays in the run's state, where onnxruntime produced it, until the backward consumes
it or the state is released. Runs are independent: any number may be in flight and they may be
resumed in any order, from any thread. Both halves release the GIL.

Two ways to call onnxruntime, chosen per call:
* CPU: when both sessions run on the CPU provider only and every output is wanted on the CPU
  (or in a caller's CPU buffer), ``OrtApi::Run`` with C arrays prepared at construction;
* devices: otherwise an ``OrtIoBinding`` made for the call, with each output bound to the device
  asked for (or, for the stash, to the device onnxruntime produces it on), so nothing crosses
  between host and device unless a caller asked for it.
"""

cimport cython
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport strcpy

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, shared_runtime, live_handle_counts, HANDLE_RUN_STATE, interruptible_begin,
    interruptible_end,
)
from ortagent._dtypes cimport tensor_type_name
from ortagent._memory cimport OrtDevice, MEMORY_CPU, MEMORY_CUDA, MEMORY_CUDA_PINNED, memory_kind_of
from ortagent._tensors cimport tensor_data, tensor_for_feed
from ortagent._values cimport OrtValue, wrap_value, keep_aliased_feeds_alive, bound_output_values
from ortagent._options cimport RunOptions
from ortagent._session cimport (
    InferenceSession, RunArrays, RunStack, RUN_STACK_SLOTS, run_arrays_init, run_arrays_release,
    run_nogil, run_binding_nogil, end_run_call, check_run_status,
)
from ortagent._memory import as_device
from ortagent._providers import strict_providers
from ortagent.errors import (
    OrtError, OrtInvalidArgument, OrtInvalidType, RunStateError, ObjectClosedError,
)

ort.ortagent_rt = shared_runtime()
cdef Py_ssize_t* _live = live_handle_counts()

cdef enum RunPhase:
    PHASE_NEW = 0           # not used yet
    PHASE_FORWARD = 1       # forward running
    PHASE_WAITING = 2       # forward done, stash held, backward pending
    PHASE_BACKWARD = 3      # backward running
    PHASE_FINISHED = 4      # backward done or released: nothing held

_PHASE_TEXT = {PHASE_NEW: "not started", PHASE_FORWARD: "running its forward",
               PHASE_WAITING: "waiting for its backward", PHASE_BACKWARD: "running its backward",
               PHASE_FINISHED: "finished (backward done or released)"}


@cython.final
cdef class PartialGraphExecutionState:
    """The state of one training run between its forward and its backward.

    Create one per run and pass it to ``TrainingAgent.run_forward`` then ``run_backward``; it
    serves one forward and one backward. It holds the stash (the forward values the backward
    needs) and the graph inputs the backward reads again; they are freed when the backward
    completes, when :meth:`release` is called, or when the state is dropped.
    """

    def __cinit__(self):
        self.phase = PHASE_NEW
        _live[<int>HANDLE_RUN_STATE] += 1

    def __dealloc__(self):
        _live[<int>HANDLE_RUN_STATE] -= 1

    cdef void drop(self) noexcept:
        self.stash = None
        self.backward_inputs = None
        self.gradient_shapes = None
        self.phase = PHASE_FINISHED

    def release(self):
        """Free what this run holds; its backward can then no longer run."""
        if self.phase == PHASE_FORWARD or self.phase == PHASE_BACKWARD:
            raise RunStateError("this run is executing; release it after the call returns")
        self.drop()

    @property
    def status(self):
        """'not started', 'waiting for its backward', 'finished ...', ..."""
        return _PHASE_TEXT[self.phase]

    @property
    def stash_size(self):
        """Number of stashed values this run holds."""
        return 0 if self.stash is None else len(self.stash)

    @property
    def stash_devices(self):
        """Where each stashed value lives ('cpu', 'cuda', 'cuda_pinned'), in stash order."""
        return [] if self.stash is None else [(<OrtValue>value).device_name() for value in self.stash]

    def __reduce__(self):
        raise OrtInvalidType("PartialGraphExecutionState cannot be pickled")


cdef char** _encode_names(object names) except NULL:
    cdef Py_ssize_t n = len(names), i
    cdef char** result = <char**>calloc(n + 1, sizeof(char*))
    if result == NULL:
        raise MemoryError()
    for i in range(n):
        encoded = names[i].encode("utf-8")
        result[i] = <char*>malloc(len(encoded) + 1)
        if result[i] == NULL:
            _free_names(result, n)
            raise MemoryError()
        strcpy(result[i], encoded)
    return result


cdef void _free_names(char** names, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    if names == NULL:
        return
    for i in range(n):
        free(names[i])
    free(names)


cdef list _output_devices(InferenceSession session, Py_ssize_t count, object fallback):
    """Where the session produces each output: OrtApi::SessionGetMemoryInfoForOutputs when the
    runtime has it (1.23+), else the device of the session's first provider."""
    cdef const ort.OrtMemoryInfo** infos = <const ort.OrtMemoryInfo**>calloc(count + 1, sizeof(void*))
    cdef ort.OrtStatus* status
    cdef int device_id = 0
    cdef Py_ssize_t i
    if infos == NULL:
        raise MemoryError()
    try:
        status = ort.SessionGetMemoryInfoForOutputs(session.handle, infos, <size_t>count)
        if status != NULL:
            ort.ReleaseStatus(status)
            return [fallback] * count
        devices = []
        for i in range(count):
            if infos[i] == NULL:
                devices.append(fallback)
                continue
            kind = memory_kind_of(infos[i], &device_id)
            if kind == MEMORY_CUDA:
                devices.append(as_device(f"cuda:{device_id}"))
            elif kind == MEMORY_CUDA_PINNED:
                devices.append(as_device("cuda_pinned"))
            else:
                devices.append(as_device("cpu"))
        return devices
    finally:
        free(infos)


cdef object _session_device(InferenceSession session):
    providers = session.get_providers()
    if providers and providers[0] == "CUDAExecutionProvider":
        options = session._provider_options[0]
        return as_device(f"cuda:{int(options.get('device_id', '0'))}")
    return as_device("cpu")


cdef bint _is_cpu_target(object target):
    """True for outputs ortagent may let OrtApi::Run place: default (None), the CPU, or a
    caller's value in CPU memory."""
    if target is None:
        return True
    if isinstance(target, OrtDevice):
        return (<OrtDevice>target).kind == MEMORY_CPU
    (<OrtValue>target).describe()
    return (<OrtValue>target).memory_kind == MEMORY_CPU


@cython.final
cdef class _AgentEngine:
    """Two sessions over a split training graph, and the C data to run them."""

    def __init__(self, split, sess_options=None, providers=None, provider_options=None):
        self.split = split
        # Training on providers other than those asked for is never what the caller meant: the
        # agent's sessions refuse (ProviderError) rather than fall back as InferenceSession does.
        with strict_providers():
            self.forward_session = InferenceSession(split.forward_model, sess_options, providers,
                                                    provider_options)
            self.backward_session = InferenceSession(split.backward_model, sess_options, providers,
                                                     provider_options)
        self.n_graph_inputs = len(split.graph_input_names)
        self.n_forward_inputs = len(split.forward_input_names)
        self.n_module_outputs = len(split.module_output_names)
        self.n_stash = len(split.stash_names)
        self.n_gradients = len(split.gradient_names)
        self.n_backward_graph_inputs = len(split.backward_graph_input_names)
        self.n_graph_outputs = len(split.graph_output_names)
        self.forward_input_names = _encode_names(split.forward_input_names)
        self.forward_output_names = _encode_names(split.forward_output_names)
        self.backward_input_names = _encode_names(split.backward_input_names)
        self.graph_output_names = _encode_names(split.graph_output_names)
        self.forward_input_types = <int*>calloc(self.n_forward_inputs + 1, sizeof(int))
        self.backward_graph_input_types = <int*>calloc(self.n_backward_graph_inputs + 1, sizeof(int))
        if self.forward_input_types == NULL or self.backward_graph_input_types == NULL:
            raise MemoryError()
        cdef Py_ssize_t i
        for i, name in enumerate(split.forward_input_names):
            self.forward_input_types[i] = self.forward_session.input_elem_types[
                <Py_ssize_t>self.forward_session.input_index[name]]
        for i, name in enumerate(split.backward_graph_input_names):
            self.backward_graph_input_types[i] = self.backward_session.input_elem_types[
                <Py_ssize_t>self.backward_session.input_index[name]]
        self.forward_input_positions = list(split.forward_input_indices)
        self.backward_input_positions = list(split.backward_graph_input_indices)
        self.gradient_types = [info.elem_type for info in split.gradient_types]
        # element type of each backward input, checked when a feed is converted: gradients,
        # then the stash (produced by the forward: not checked), then graph inputs
        cdef Py_ssize_t n_backward_inputs = self.n_gradients + self.n_stash + self.n_backward_graph_inputs
        self.backward_feed_types = <int*>calloc(n_backward_inputs + 1, sizeof(int))
        if self.backward_feed_types == NULL:
            raise MemoryError()
        for i in range(n_backward_inputs):
            if i < self.n_gradients:
                self.backward_feed_types[i] = self.gradient_types[i]
            elif i < self.n_gradients + self.n_stash:
                self.backward_feed_types[i] = -1
            else:
                self.backward_feed_types[i] = self.backward_graph_input_types[i - self.n_gradients - self.n_stash]
        self.gradient_output_positions = list(split.gradient_output_indices)
        self.gradient_output_names = [split.module_output_names[i] for i in split.gradient_output_indices]
        self.gradient_full_shape = [split.gradient_output_indices[g] in split.full_shape_outputs
                                    for g in range(self.n_gradients)]
        self.graph_output_index = {name: i for i, name in enumerate(split.graph_output_names)}
        self.cpu_only = (self.forward_session.get_providers() == ["CPUExecutionProvider"]
                         and self.backward_session.get_providers() == ["CPUExecutionProvider"])
        forward_default = _session_device(self.forward_session)
        backward_default = _session_device(self.backward_session)
        self.forward_output_devices = _output_devices(
            self.forward_session, self.n_module_outputs + self.n_stash, forward_default)
        self.graph_output_devices = _output_devices(
            self.backward_session, self.n_graph_outputs, backward_default)

    def __dealloc__(self):
        _free_names(self.forward_input_names, self.n_forward_inputs)
        _free_names(self.forward_output_names, self.n_module_outputs + self.n_stash)
        _free_names(self.backward_input_names, self.n_gradients + self.n_stash + self.n_backward_graph_inputs)
        _free_names(self.graph_output_names, self.n_graph_outputs)
        free(self.forward_input_types)
        free(self.backward_graph_input_types)
        free(self.backward_feed_types)

    cdef int require_open(self) except -1:
        if self.closed:
            raise ObjectClosedError("this TrainingAgent has been closed")
        return 0

    def close(self):
        self.closed = True
        self.forward_session.close()
        self.backward_session.close()

    @property
    def providers(self):
        return self.forward_session.get_providers()

    # -- forward -----------------------------------------------------------------------------------

    cpdef list forward(self, PartialGraphExecutionState state, list graph_inputs, object run_options,
                      list module_output_targets):
        """Run the forward of a new run: `graph_inputs` holds one OrtValue or ndarray per training
        graph input, in graph order; `module_output_targets` one OrtDevice (or None for where
        onnxruntime produces it) per module output. Returns the module outputs."""
        self.require_open()
        if len(graph_inputs) != self.n_graph_inputs:
            raise OrtInvalidArgument(f"expected {self.n_graph_inputs} graph inputs, got {len(graph_inputs)}")
        if state.phase != PHASE_NEW:
            raise RunStateError(
                f"this PartialGraphExecutionState is {_PHASE_TEXT[state.phase]}; a state serves one "
                "forward and one backward: create a new one for each run")
        # Claim the state before anything that can let another thread in.
        state.phase = PHASE_FORWARD
        cdef list targets
        cdef bint on_cpu = self.cpu_only
        try:
            feeds = [graph_inputs[p] for p in self.forward_input_positions]
            targets = list(module_output_targets) if module_output_targets is not None else \
                [None] * self.n_module_outputs
            if on_cpu:
                for target in targets:
                    if not _is_cpu_target(target):
                        on_cpu = False
                        break
            if on_cpu:
                outputs = _run(self.forward_session, self.forward_input_names, feeds,
                               self.forward_input_types, self.forward_output_names,
                               self.n_module_outputs + self.n_stash, None, run_options)
            else:
                for i in range(self.n_module_outputs):
                    if targets[i] is None:
                        targets[i] = self.forward_output_devices[i]
                targets.extend(self.forward_output_devices[self.n_module_outputs:])
                outputs = _run_bound(self.forward_session, self.forward_input_names, feeds,
                                     self.forward_input_types, self.forward_output_names, targets,
                                     run_options)
        except BaseException:
            state.drop()
            raise
        module_outputs = outputs[:self.n_module_outputs]
        state.engine = self
        # only the shapes (to check the gradients): the module outputs themselves belong to the
        # caller and are freed when the caller drops them, not held until the backward
        state.gradient_shapes = [_shape_of(<OrtValue>module_outputs[i], self.cpu_only)
                                 for i in self.gradient_output_positions]
        state.stash = outputs[self.n_module_outputs:]
        state.backward_inputs = [graph_inputs[p] for p in self.backward_input_positions]
        state.phase = PHASE_WAITING
        return module_outputs

    # -- backward ----------------------------------------------------------------------------------

    cdef int check_gradients(self, PartialGraphExecutionState state, list gradients) except -1:
        """Count, element type and shape of each gradient, checked before anything runs."""
        cdef Py_ssize_t g
        cdef OrtValue value
        if len(gradients) != self.n_gradients:
            raise OrtInvalidArgument(
                f"expected {self.n_gradients} gradients (one per YieldOp output: "
                f"{list(self.split.gradient_names)}), got {len(gradients)}")
        for g in range(self.n_gradients):
            gradient = gradients[g]
            output_shape = state.gradient_shapes[g]
            if type(gradient) is OrtValue and _gradient_fits(<OrtValue>gradient, self.gradient_types[g],
                                                             self.gradient_full_shape[g], output_shape):
                continue        # the common case, checked in C
            output_name = self.gradient_output_names[g]
            output_shape = list(output_shape)
            if type(gradient) is OrtValue:
                value = gradient
                value.describe()
                elem_type = value.elem_type
                shape = value.shape()
            elif hasattr(gradient, "dtype") and hasattr(gradient, "shape"):
                elem_type = OrtValue.ortvalue_from_numpy(gradient).element_type() if gradient.dtype.kind in "biufcV" else 8
                shape = list(gradient.shape)
            else:
                raise OrtInvalidType(f"gradient {g} (for output {output_name!r}) must be an OrtValue or a "
                                     f"numpy.ndarray, got {type(gradient).__name__}")
            expected_type = self.gradient_types[g]
            if elem_type != expected_type:
                raise OrtInvalidArgument(
                    f"gradient {g} (for output {output_name!r}) must be {tensor_type_name(expected_type)}, "
                    f"got {tensor_type_name(elem_type)}")
            if self.gradient_full_shape[g]:
                if list(shape) != list(output_shape):
                    raise OrtInvalidArgument(
                        f"gradient {g} (for output {output_name!r}) must have the output's full shape "
                        f"{output_shape}, got {list(shape)}")
            elif not _broadcasts_to(shape, output_shape):
                raise OrtInvalidArgument(
                    f"gradient {g} (for output {output_name!r}) of shape {list(shape)} does not broadcast "
                    f"to the output's shape {output_shape}")
        return 0

    cpdef list backward(self, PartialGraphExecutionState state, list gradients, list output_positions,
                       list output_targets, object run_options):
        """Resume a run: `gradients` (one per YieldOp output) + the stash -> the graph outputs at
        `output_positions`, each placed per `output_targets` (None: where onnxruntime produces
        it; an OrtDevice; or an OrtValue to write into)."""
        self.require_open()
        if state.phase != PHASE_WAITING or state.engine is not self:
            if state.phase == PHASE_WAITING:
                raise RunStateError("this run belongs to another TrainingAgent")
            raise RunStateError(
                f"cannot run backward: this run is {_PHASE_TEXT[state.phase]}"
                + ("; run_forward must come first" if state.phase == PHASE_NEW else ""))
        # Claim the run before anything that can let another thread in (a second backward of
        # the same state from another thread then fails instead of running twice).
        state.phase = PHASE_BACKWARD
        cdef Py_ssize_t n_out = len(output_positions), i
        cdef char** names = NULL
        cdef int* feed_types = self.backward_feed_types
        cdef bint on_cpu = self.cpu_only
        try:
            self.check_gradients(state, gradients)
            feeds = gradients + state.stash + state.backward_inputs
            names = <char**>malloc((n_out + 1) * sizeof(char*))
            if names == NULL:
                raise MemoryError()
            for target in output_targets:
                if not _is_cpu_target(target):
                    on_cpu = False
            for i in range(n_out):
                names[i] = self.graph_output_names[<Py_ssize_t>output_positions[i]]
            if on_cpu:
                outputs = _run(self.backward_session, self.backward_input_names, feeds, feed_types,
                               names, n_out, output_targets, run_options)
            else:
                targets = [t if t is not None else self.graph_output_devices[<Py_ssize_t>p]
                           for t, p in zip(output_targets, output_positions)]
                outputs = _run_bound(self.backward_session, self.backward_input_names, feeds,
                                     feed_types, names, targets, run_options)
        except BaseException:
            # A failed backward leaves the run resumable (e.g. after fixing a gradient) unless
            # the failure came from onnxruntime mid-run; the stash is intact either way.
            state.phase = PHASE_WAITING
            raise
        finally:
            free(names)
        state.drop()
        return outputs


cdef tuple _shape_of(OrtValue value, bint on_cpu):
    """A tensor's shape as a tuple of ints, without a Python method call."""
    value.describe_as(MEMORY_CPU if on_cpu else -1)
    return tuple([value.dims[i] for i in range(value.ndim)])


cdef bint _gradient_fits(OrtValue gradient, int elem_type, bint full_shape, tuple shape) except -1:
    """Whether a gradient has the element type and the shape (the full one, or one that
    broadcasts to it) its module output asks for; False sends the caller to the explaining path."""
    gradient.describe()
    if gradient.elem_type != elem_type:
        return False
    cdef Py_ssize_t rank = len(shape), i
    cdef int64_t have, want
    if full_shape:
        if gradient.ndim != rank:
            return False
        for i in range(rank):
            if gradient.dims[i] != <int64_t>shape[i]:
                return False
        return True
    if gradient.ndim > rank:
        return False
    for i in range(1, gradient.ndim + 1):
        have = gradient.dims[gradient.ndim - i]
        want = <int64_t>shape[rank - i]
        if have != 1 and have != want:
            return False
    return True


cdef bint _broadcasts_to(object shape, object target):
    if len(shape) > len(target):
        return False
    for have, want in zip(reversed(list(shape)), reversed(list(target))):
        if have != 1 and have != want:
            return False
    return True


cdef int _hold_aliased_inputs(list outputs, ort.OrtValue** in_values, list holders, object session,
                              object preallocated) except -1:
    """Outputs sharing a feed's buffer keep the feed's owner alive (see keep_aliased_feeds_alive);
    outputs written into the caller's own values are left alone."""
    cdef Py_ssize_t n_in = len(holders), j
    cdef void* stack[RUN_STACK_SLOTS]
    cdef void** in_data = stack
    if n_in > RUN_STACK_SLOTS:
        in_data = <void**>malloc(n_in * sizeof(void*))
        if in_data == NULL:
            raise MemoryError()
    try:
        for j in range(n_in):
            in_data[j] = tensor_data(in_values[j])
        skip = None
        if preallocated is not None:
            skip = [type(target) is OrtValue for target in preallocated]
        keep_aliased_feeds_alive(outputs, in_data, n_in, holders, session, skip)
        return 0
    finally:
        if in_data != stack:
            free(in_data)


cdef list _names(char** names, Py_ssize_t count):
    return [names[i].decode() for i in range(count)]


cdef list _run(InferenceSession session, char** input_names, list feeds, int* input_types,
               char** output_names, Py_ssize_t n_out, object preallocated, object run_options):
    """OrtApi::Run over prepared names (the session layer's run core): outputs come back as
    OrtValues on the CPU (or written into the caller's values given in `preallocated`)."""
    cdef Py_ssize_t n_in = len(feeds), i, n_ready = 0
    cdef RunStack stack
    cdef RunArrays a
    cdef ort.OrtRunOptions* run_options_c = NULL
    cdef bint registered = False
    cdef ort.OrtStatus* status
    cdef list keep = []
    cdef list holders = [None] * n_in      # what keeps each feed's memory alive
    cdef list used = []                    # the caller's values this run reads or writes
    cdef Py_ssize_t kept
    if run_options is not None:
        run_options_c = (<RunOptions>run_options).handle
    a.heap = NULL
    session.begin_run()
    try:
        run_arrays_init(&a, &stack, n_in, n_out)
        for i in range(n_in):
            a.in_names[i] = input_names[i]
            feed = feeds[i]
            if type(feed) is OrtValue:
                (<OrtValue>feed).begin_use()            # close() waits for this run
                used.append(feed)
                a.in_values[i] = (<OrtValue>feed).handle
                a.in_created[i] = 0
                holders[i] = feed
            else:
                kept = len(keep)
                a.in_values[i] = tensor_for_feed(feed, input_names[i].decode(), input_types[i], keep)
                a.in_created[i] = 1
                holders[i] = keep[len(keep) - 1] if len(keep) > kept else feed
            n_ready += 1
        for i in range(n_out):
            a.out_names[i] = output_names[i]
            a.out_values[i] = NULL
            if preallocated is not None and preallocated[i] is not None \
                    and type(preallocated[i]) is OrtValue:
                (<OrtValue>preallocated[i]).begin_use()
                used.append(preallocated[i])
                a.out_values[i] = (<OrtValue>preallocated[i]).handle
        run_options_c = interruptible_begin(run_options_c, &registered)
        status = run_nogil(session.handle, run_options_c, &a, n_in, n_out)
        results = [None] * n_out
        for i in range(n_out):
            if preallocated is not None and type(preallocated[i]) is OrtValue:
                results[i] = preallocated[i]
            elif a.out_values[i] != NULL:
                results[i] = wrap_value(a.out_values[i], None, session)
        end_run_call(run_options_c, registered, status)
        if status != NULL:
            check_run_status(status, session, _names(input_names, n_in), feeds)
        _hold_aliased_inputs(results, a.in_values, holders, session, preallocated)
        return results
    finally:
        for i in range(n_ready):
            if a.in_created[i]:
                ort.ReleaseValue(a.in_values[i])
        for value in used:
            (<OrtValue>value).end_use()
        run_arrays_release(&a)
        session.end_run()


cdef OrtValue _copy_to(OrtValue value, object target):
    """`value` on the device `target` (an OrtDevice: a copy unless it is there already), or
    copied into `target` (an OrtValue)."""
    from ortagent._device import copy
    if isinstance(target, OrtDevice):
        if value.device() == target:
            return value
        destination = OrtValue.ortvalue_from_shape_and_type(value.shape(), value.element_type(), target)
    else:
        destination = target
    copy(value, destination)
    return destination


cdef list _run_bound(InferenceSession session, char** input_names, list feeds, int* input_types,
                     char** output_names, list targets, object run_options):
    """OrtApi::RunWithBinding with a binding made for this call: inputs bound as given, output i
    bound to targets[i] (an OrtDevice: onnxruntime allocates there; an OrtValue: written into).
    A name listed twice is bound once and its value returned for each listing."""
    cdef ort.OrtIoBinding* binding = NULL
    cdef Py_ssize_t i
    cdef ort.OrtRunOptions* run_options_c = NULL
    cdef bint registered = False
    cdef ort.OrtStatus* status
    cdef list created = []
    cdef list bound = []            # the OrtValue bound for each feed
    cdef list used = []             # the caller's values this run reads or writes
    cdef ort.OrtValue* in_stack[RUN_STACK_SLOTS]
    cdef ort.OrtValue** in_values = in_stack
    if run_options is not None:
        run_options_c = (<RunOptions>run_options).handle
    session.begin_run()
    try:
        check(ort.CreateIoBinding(session.handle, &binding))
        for i in range(len(feeds)):
            feed = feeds[i]
            if type(feed) is not OrtValue:
                feed = OrtValue.ortvalue_from_numpy(feed)
                if input_types[i] >= 0 and (<OrtValue>feed).element_type() != input_types[i]:
                    raise OrtInvalidArgument(
                        f"input {input_names[i].decode()!r} expects {tensor_type_name(input_types[i])}, "
                        f"got {(<OrtValue>feed).data_type()}")
                created.append(feed)
            (<OrtValue>feed).begin_use()                # close() waits for this run
            used.append(feed)
            check(ort.BindInput(binding, input_names[i], (<OrtValue>feed).handle))
            bound.append(feed)
        # A name listed twice (a module output the backward also reads) is bound once, to the
        # target of its last listing -- the stash's, where onnxruntime produces it, so the stash
        # never leaves the device -- and copied for an earlier listing that wants it elsewhere.
        bound_targets = {}
        for i in range(len(targets)):
            bound_targets[output_names[i]] = targets[i]
        order = list(bound_targets)     # distinct output names, in binding order
        for name in order:
            target = bound_targets[name]
            if isinstance(target, OrtDevice):
                check(ort.BindOutputToDevice(binding, name, (<OrtDevice>target).memory_info()))
            else:
                (<OrtValue>target).begin_use()
                used.append(target)
                check(ort.BindOutput(binding, name, (<OrtValue>target).handle))
        run_options_c = interruptible_begin(run_options_c, &registered)
        status = run_binding_nogil(session.handle, run_options_c, binding, True)
        end_run_call(run_options_c, registered, status)
        if status != NULL:
            check_run_status(status, session, _names(input_names, len(feeds)), feeds)
        by_name = dict(zip(order, bound_output_values(binding, session)))
        if len(bound) > RUN_STACK_SLOTS:
            in_values = <ort.OrtValue**>malloc(len(bound) * sizeof(void*))
            if in_values == NULL:
                raise MemoryError()
        for i in range(len(bound)):
            in_values[i] = (<OrtValue>bound[i]).handle
        for name in order:
            if type(bound_targets[name]) is OrtValue:
                by_name[name] = bound_targets[name]     # written in place: the caller's value
        results = list(by_name.values())
        _hold_aliased_inputs(results, in_values, bound, session, list(bound_targets.values()))
        results = []
        for i in range(len(targets)):
            value = by_name[output_names[i]]
            if targets[i] is not bound_targets[output_names[i]]:
                value = _copy_to(value, targets[i])
            results.append(value)
        return results
    finally:
        if in_values != in_stack:
            free(in_values)
        if binding != NULL:
            ort.ReleaseIoBinding(binding)
        for value in used:
            (<OrtValue>value).end_use()
        session.end_run()
