"""The TrainingAgent engine: a training graph split at its YieldOp, run as two sessions, and the
state machine of each run.

A run's forward computes the module outputs and the stash (forward values the backward reads);
the stash stays in the run's state, where onnxruntime produced it, until the backward consumes
it or the state is released. Runs are independent: any number may be in flight and they may be
resumed in any order, from any thread. Both halves release the GIL.

One run, one PartialGraphExecutionState, one phase; only the state's transitions change it::

                claim_forward              publish
        NEW ----------------> FORWARD ------------> WAITING <------------+
                                 |                   |   |               |
                                 | abort             |   | claim_backward | abort
                                 v       release     |   v               | (stash intact)
                              FINISHED <-------------+  BACKWARD --------+
                                 ^                          |            |
                                 +--------------------------+            | finish, retained
                                            finish                       | (stash kept)
                                                                         +--> WAITING

``release()`` moves NEW or WAITING to FINISHED (and refuses a running state); FINISHED is
final, so a state serves one forward and one backward -- or, once ``retain()`` was called,
one forward and any number of backwards until it is released (torch's ``retain_graph``). A
claim that finds another phase raises RunStateError and changes nothing, so two threads never
run one half of one run. The agent's
closed flag is the engine's (``_AgentEngine.closed``): set once by close(), checked before a
claim.

Every forward and backward, whatever the caller, goes through one method each
(``forward_run`` / ``backward_run``): claim, run, publish or finish, abort on failure. The run
itself is chosen per call:

* preallocating: both sessions on the CPU provider only, every feed an OrtValue, every output
  wanted where onnxruntime puts it (the CPU), no RunOptions: ``OrtApi::Run`` over C arrays
  prepared at construction, outputs of fixed shape written into tensors made (or given back)
  here. The half's _Preallocation says who may do that: the one run that claimed it;
* CPU: ``OrtApi::Run`` with feeds converted as needed and caller buffers written in place;
* devices: otherwise an ``OrtIoBinding`` made for the call, with each output bound to the device
  asked for (or, for the stash, to the device onnxruntime produces it on), so nothing crosses
  between host and device unless a caller asked for it.

The state API's usual call reaches the engine straight from ``_AgentHotPath`` (C, no Python
frame); every other call goes through ``TrainingAgent`` first, which reorders feeds, fetches
and gradients into graph order and then calls the same two methods.
"""

cimport cython
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport strcpy
from cpython.list cimport PyList_New, PyList_SET_ITEM, PyList_SetSlice
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, shared_runtime, live_handle_counts, count_add, HANDLE_RUN_STATE
from ortagent.errors import OrtInvalidArgument, OrtInvalidType, RunStateError, ObjectClosedError


_PHASE_TEXT = {PHASE_NEW: "not started", PHASE_FORWARD: "running its forward",
               PHASE_WAITING: "waiting for its backward", PHASE_BACKWARD: "running its backward",
               PHASE_FINISHED: "finished (backward done or released)"}


@cython.final
cdef class PartialGraphExecutionState:
    """The state of one training run between its forward and its backward.

    Create one per run and pass it to ``TrainingAgent.run_forward`` then ``run_backward``; it
    serves one forward and one backward (any number of backwards after :meth:`retain`). It holds
    the stash (the forward values the backward needs) and the graph inputs the backward reads
    again; they are freed when the backward completes (unless retained), when :meth:`release`
    is called, or when the state is dropped. A backward that fails leaves the run waiting
    (resumable); a forward that fails leaves it finished.
    """

    def __cinit__(self):
        self.phase = PHASE_NEW
        count_add(&_live[<int>HANDLE_RUN_STATE], 1)

    def __dealloc__(self):
        count_add(&_live[<int>HANDLE_RUN_STATE], -1)

    # -- the transitions (see the module docstring) ----------------------------------------------

    cdef int claim_forward(self) except -1:
        cdef RunPhase found
        with cython.critical_section(self):
            found = self.phase
            if found == PHASE_NEW:
                self.phase = PHASE_FORWARD
        if found != PHASE_NEW:
            raise RunStateError(
                f"this PartialGraphExecutionState is {_PHASE_TEXT[found]}; a state serves one "
                "forward and one backward: create a new one for each run")
        return 0

    cdef void publish(self, _AgentEngine engine, list gradient_shapes, list stash,
                      list backward_inputs) noexcept:
        # Only the thread holding the FORWARD claim writes these; the phase change (inside the
        # critical section) publishes them to the thread that claims the backward.
        self.engine = engine
        self.gradient_shapes = gradient_shapes
        self.stash = stash
        self.backward_inputs = backward_inputs
        with cython.critical_section(self):
            self.phase = PHASE_WAITING

    cdef int claim_backward(self, _AgentEngine engine) except -1:
        cdef RunPhase found
        with cython.critical_section(self):
            found = self.phase
            if found == PHASE_WAITING and self.engine is engine:
                self.phase = PHASE_BACKWARD
        if found == PHASE_WAITING:
            if self.engine is engine:
                return 0
            raise RunStateError("this run belongs to another TrainingAgent")
        raise RunStateError(
            f"cannot run backward: this run is {_PHASE_TEXT[found]}"
            + ("; run_forward must come first" if found == PHASE_NEW else ""))

    cdef void finish(self) noexcept:
        cdef bint keep
        with cython.critical_section(self):
            keep = self.keep_stash
            if keep:
                self.phase = PHASE_WAITING
        if not keep:
            self._drop()

    cdef void abort(self) noexcept:
        cdef RunPhase found
        with cython.critical_section(self):
            found = self.phase
            if found == PHASE_BACKWARD:
                self.phase = PHASE_WAITING
        if found == PHASE_FORWARD:
            self._drop()

    cdef bint waiting(self) noexcept:
        return self.phase == PHASE_WAITING

    cdef void _drop(self) noexcept:
        # Only the thread holding the run's claim (or its last owner) gets here.
        self.stash = None
        self.backward_inputs = None
        self.gradient_shapes = None
        with cython.critical_section(self):
            self.phase = PHASE_FINISHED

    # -- Python ------------------------------------------------------------------------------------

    def release(self):
        """Free what this run holds; its backward can then no longer run."""
        cdef RunPhase found
        with cython.critical_section(self):
            found = self.phase
            if found != PHASE_FORWARD and found != PHASE_BACKWARD:
                self.phase = PHASE_FINISHED     # no forward or backward can claim it now
        if found == PHASE_FORWARD or found == PHASE_BACKWARD:
            raise RunStateError("this run is executing; release it after the call returns")
        self._drop()

    def retain(self):
        """Keep what this run holds after each backward, so that its backward can run again
        (with other gradients: torch's ``retain_graph``); :meth:`release` (or dropping the
        state) frees it. Refused on a finished run, which holds nothing."""
        cdef RunPhase found
        with cython.critical_section(self):
            found = self.phase
            if found != PHASE_FINISHED:
                self.keep_stash = True
        if found == PHASE_FINISHED:
            raise RunStateError("cannot retain this run: it is finished (backward done or released)")

    @property
    def retained(self):
        """True once :meth:`retain` was called."""
        return self.keep_stash

    @property
    def waiting_for_backward(self):
        """True from the end of the forward until a backward claims the run or it is released
        (a failed backward returns it here)."""
        return self.phase == PHASE_WAITING

    @property
    def status(self):
        """'not started', 'waiting for its backward', 'finished ...', ... (for people; code
        reads :attr:`waiting_for_backward`)."""
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


@cython.final
cdef class _Preallocation:
    """One half's preallocation: whether it is on, the outputs given back for reuse, and which
    run may use and change them (the one that claimed it)."""

    def __cinit__(self, Py_ssize_t n_slots):
        self.enabled = True
        self.spares = SpareOutputs(n_slots)

    cdef bint claim(self) noexcept:
        cdef bint took = False
        with cython.critical_section(self):
            if not self.held:
                self.held = True
                took = True
        return took

    cdef void give_up(self) noexcept:
        with cython.critical_section(self):
            self.held = False


@cython.final
cdef class _OutputPlan:
    """Where one backward's outputs go (see _agent_decl.pxi)."""

    def __dealloc__(self):
        free(self.names)
        free(self.slots)


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
        # the preallocating run's C data (run_forward_prepared, run_backward_prepared)
        cdef Py_ssize_t n_forward_outputs = self.n_module_outputs + self.n_stash
        self.forward_input_pos_c = <Py_ssize_t*>calloc(self.n_forward_inputs + 1, sizeof(Py_ssize_t))
        self.backward_input_pos_c = <Py_ssize_t*>calloc(self.n_backward_graph_inputs + 1, sizeof(Py_ssize_t))
        self.forward_output_slot_c = <Py_ssize_t*>calloc(n_forward_outputs + 1, sizeof(Py_ssize_t))
        self.forward_output_twice_c = <bint*>calloc(n_forward_outputs + 1, sizeof(bint))
        if (self.forward_input_pos_c == NULL or self.backward_input_pos_c == NULL
                or self.forward_output_slot_c == NULL or self.forward_output_twice_c == NULL):
            raise MemoryError()
        for i in range(self.n_forward_inputs):
            self.forward_input_pos_c[i] = self.forward_input_positions[i]
        for i in range(self.n_backward_graph_inputs):
            self.backward_input_pos_c[i] = self.backward_input_positions[i]
        forward_output_names = list(split.forward_output_names)
        for i in range(n_forward_outputs):
            name = forward_output_names[i]
            self.forward_output_slot_c[i] = self.forward_session.output_index[name]
            self.forward_output_twice_c[i] = forward_output_names.count(name) > 1
        self.allocator = pooled_cpu_allocator()
        self.forward_prealloc = _Preallocation(self.forward_session.n_outputs)
        self.backward_prealloc = _Preallocation(self.backward_session.n_outputs)

    def __dealloc__(self):
        _free_names(self.forward_input_names, self.n_forward_inputs)
        _free_names(self.forward_output_names, self.n_module_outputs + self.n_stash)
        _free_names(self.backward_input_names, self.n_gradients + self.n_stash + self.n_backward_graph_inputs)
        _free_names(self.graph_output_names, self.n_graph_outputs)
        free(self.forward_input_types)
        free(self.backward_graph_input_types)
        free(self.backward_feed_types)
        free(self.forward_input_pos_c)
        free(self.backward_input_pos_c)
        free(self.forward_output_slot_c)
        free(self.forward_output_twice_c)

    cdef int require_open(self) except -1:
        if self.closed:
            raise ObjectClosedError("this TrainingAgent has been closed")
        return 0

    def close(self):
        """Close the agent (once; True the first time): no run starts after this; both sessions
        close when their runs in flight end, and the spare outputs are freed."""
        cdef bint was_closed
        with cython.critical_section(self):
            was_closed = self.closed
            self.closed = True
        if was_closed:
            return False
        self.forward_prealloc.spares.close()
        self.backward_prealloc.spares.close()
        self.forward_session.close()
        self.backward_session.close()
        return True

    @property
    def providers(self):
        return self.forward_session.get_providers()

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, PartialGraphExecutionState state, list graph_inputs, object run_options,
                list module_output_targets):
        """Run the forward of a new run: `graph_inputs` holds one OrtValue or ndarray per training
        graph input, in graph order; `module_output_targets` one OrtDevice (or None for where
        onnxruntime produces it) per module output, or None. Returns the module outputs."""
        return self.forward_run(state, graph_inputs, run_options, module_output_targets)

    cdef list forward_run(self, PartialGraphExecutionState state, list graph_inputs, object run_options,
                          list targets):
        cdef Py_ssize_t i
        cdef bint on_cpu = self.cpu_only, prepared
        cdef list outputs, gradient_shapes = None, backward_inputs
        self.require_open()
        if len(graph_inputs) != self.n_graph_inputs:
            raise OrtInvalidArgument(f"expected {self.n_graph_inputs} graph inputs, got {len(graph_inputs)}")
        state.claim_forward()       # before anything that can let another thread in
        try:
            if on_cpu and targets is not None:
                for target in targets:
                    if not _is_cpu_target(target):
                        on_cpu = False
                        break
            prepared = on_cpu and run_options is None
            if prepared:
                for i in range(self.n_forward_inputs):
                    if type(graph_inputs[self.forward_input_pos_c[i]]) is not OrtValue:
                        prepared = False
                        break
            if prepared:
                outputs = self.run_forward_prepared(state, graph_inputs)
                gradient_shapes = state.gradient_shapes
            else:
                feeds = [graph_inputs[p] for p in self.forward_input_positions]
                if on_cpu:
                    outputs = _run(self.forward_session, self.forward_input_names, feeds,
                                   self.forward_input_types, self.forward_output_names,
                                   self.n_module_outputs + self.n_stash, None, run_options)
                else:
                    placed = list(targets) if targets is not None else [None] * self.n_module_outputs
                    for i in range(self.n_module_outputs):
                        if placed[i] is None:
                            placed[i] = self.forward_output_devices[i]
                    placed.extend(self.forward_output_devices[self.n_module_outputs:])
                    outputs = _run_bound(self.forward_session, self.forward_input_names, feeds,
                                         self.forward_input_types, self.forward_output_names, placed,
                                         run_options)
                # only the shapes (to check the gradients): the module outputs themselves belong
                # to the caller and are freed when the caller drops them, not held until the backward
                gradient_shapes = [_shape_of(<OrtValue>outputs[i], self.cpu_only)
                                   for i in self.gradient_output_positions]
        except BaseException:
            state.abort()
            raise
        if self.n_stash:
            stash = outputs[self.n_module_outputs:]
            del outputs[self.n_module_outputs:]
        else:
            stash = []
        backward_inputs = PyList_New(self.n_backward_graph_inputs)
        for i in range(self.n_backward_graph_inputs):
            feed = graph_inputs[self.backward_input_pos_c[i]]
            Py_INCREF(feed)
            PyList_SET_ITEM(backward_inputs, i, feed)
        state.publish(self, gradient_shapes, stash, backward_inputs)
        return outputs

    cdef list run_forward_prepared(self, PartialGraphExecutionState state, list graph_inputs):
        """The forward's OrtApi::Run over the prepared C arrays, every feed an OrtValue (see
        _run_hot); sets state.gradient_shapes (the run's claim makes them this thread's)."""
        cdef Py_ssize_t n_in = self.n_forward_inputs, n_out = self.n_module_outputs + self.n_stash
        cdef Py_ssize_t i, n_used = 0
        cdef RunStack stack
        cdef RunArrays a
        cdef bint begun = False
        cdef _Preallocation prealloc = self.forward_prealloc
        cdef bint owned = prealloc.claim()
        cdef InferenceSession session = self.forward_session
        cdef object feed
        cdef list outputs
        a.heap = NULL
        try:
            session.begin_run(False)
            begun = True
            run_arrays_init(&a, &stack, n_in, n_out)
            for i in range(n_in):
                feed = graph_inputs[self.forward_input_pos_c[i]]
                (<OrtValue>feed).begin_use()            # close() waits for this run
                Py_INCREF(feed)                         # the caller's list may change meanwhile
                a.in_holders[i] = <PyObject*>feed
                n_used += 1
                a.in_names[i] = self.forward_input_names[i]
                a.in_values[i] = (<OrtValue>feed).handle
            for i in range(n_out):
                a.out_names[i] = self.forward_output_names[i]
            outputs = _run_hot(session, &a, n_in, n_out, self.forward_output_slot_c,
                               self.forward_output_twice_c, &prealloc.enabled, self.allocator,
                               prealloc.spares, owned)
            if owned and prealloc.fixed_gradient_shapes is not None and _all_preallocated(
                    &a, self.gradient_output_positions):
                state.gradient_shapes = prealloc.fixed_gradient_shapes     # never changed: shared
            else:
                state.gradient_shapes = [_shape_of(<OrtValue>outputs[i], True)
                                         for i in self.gradient_output_positions]
                if owned and _all_preallocated(&a, self.gradient_output_positions):
                    prealloc.fixed_gradient_shapes = state.gradient_shapes
            return outputs
        finally:
            for i in range(n_used):
                (<OrtValue>a.in_holders[i]).end_use()
                Py_DECREF(<object>a.in_holders[i])
            run_arrays_release(&a)
            if begun:
                session.end_run(0)
            if owned:
                prealloc.give_up()

    # -- backward ----------------------------------------------------------------------------------

    cdef _OutputPlan output_plan(self, list output_positions, list output_targets):
        """The plan for backwards that fetch the graph outputs at `output_positions`, each
        placed per `output_targets` (None: where onnxruntime produces it; an OrtDevice; or an
        OrtValue to write into)."""
        cdef _OutputPlan plan = _OutputPlan.__new__(_OutputPlan)
        cdef Py_ssize_t n = len(output_positions), i, position
        if len(output_targets) != n:
            raise OrtInvalidArgument(f"{n} outputs but {len(output_targets)} targets")
        plan.engine = self
        plan.n_out = n
        plan.positions = list(output_positions)
        plan.targets = list(output_targets)
        plan.names = <char**>calloc(n + 1, sizeof(char*))
        plan.slots = <Py_ssize_t*>calloc(n + 1, sizeof(Py_ssize_t))
        if plan.names == NULL or plan.slots == NULL:
            raise MemoryError()
        for i in range(n):
            position = plan.positions[i]
            if not 0 <= position < self.n_graph_outputs:
                raise OrtInvalidArgument(f"no graph output at position {position}")
            plan.names[i] = self.graph_output_names[position]
            plan.slots[i] = self.backward_session.output_index[self.split.graph_output_names[position]]
        plan.on_cpu = self.cpu_only
        plan.prepared = self.cpu_only
        for target in plan.targets:
            if not _is_cpu_target(target):
                plan.on_cpu = False
            if target is not None and type(target) is not OrtDevice:
                plan.prepared = False           # a caller's value: written in place by _run
        plan.prepared = plan.prepared and plan.on_cpu
        return plan

    def backward(self, PartialGraphExecutionState state, list gradients, list output_positions,
                 list output_targets, object run_options):
        """Resume a run: `gradients` (one per YieldOp output) + the stash -> the graph outputs at
        `output_positions`, each placed per `output_targets` (None: where onnxruntime produces
        it; an OrtDevice; or an OrtValue to write into)."""
        self.require_open()
        return self.backward_run(state, gradients, self.output_plan(output_positions, output_targets),
                                 run_options)

    def _backward_planned(self, PartialGraphExecutionState state, list gradients, _OutputPlan plan,
                          object run_options):
        """backward() with a plan made once by _plan_outputs (the run-id API's bindings)."""
        return self.backward_run(state, gradients, plan, run_options)

    def _plan_outputs(self, list output_positions, list output_targets):
        return self.output_plan(output_positions, output_targets)

    cdef list backward_run(self, PartialGraphExecutionState state, list gradients, _OutputPlan plan,
                           object run_options):
        cdef Py_ssize_t i
        cdef bint prepared
        cdef list outputs
        self.require_open()
        if plan.engine is not self:
            raise OrtInvalidArgument("this output plan belongs to another TrainingAgent")
        # Claim the run before anything that can let another thread in (a second backward of
        # the same state from another thread then fails instead of running twice).
        state.claim_backward(self)
        try:
            self.check_gradients(state, gradients)
            prepared = plan.prepared and run_options is None
            if prepared:
                for i in range(self.n_gradients):
                    if type(gradients[i]) is not OrtValue:
                        prepared = False
                        break
            if prepared:
                for i in range(self.n_backward_graph_inputs):
                    if type(state.backward_inputs[i]) is not OrtValue:   # fed as NumPy to the forward
                        prepared = False
                        break
            if prepared:
                outputs = self.run_backward_prepared(state, gradients, plan)
            else:
                feeds = gradients + state.stash + state.backward_inputs
                if plan.on_cpu:
                    outputs = _run(self.backward_session, self.backward_input_names, feeds,
                                   self.backward_feed_types, plan.names, plan.n_out, plan.targets,
                                   run_options)
                else:
                    placed = [t if t is not None else self.graph_output_devices[<Py_ssize_t>p]
                              for t, p in zip(plan.targets, plan.positions)]
                    outputs = _run_bound(self.backward_session, self.backward_input_names, feeds,
                                         self.backward_feed_types, plan.names, placed, run_options)
        except BaseException:
            # A failed backward leaves the run resumable (e.g. after fixing a gradient) unless
            # the failure came from onnxruntime mid-run; the stash is intact either way.
            state.abort()
            raise
        state.finish()
        return outputs

    cdef list run_backward_prepared(self, PartialGraphExecutionState state, list gradients,
                                    _OutputPlan plan):
        """The backward's OrtApi::Run over the prepared C arrays, every feed an OrtValue (see
        _run_hot)."""
        cdef Py_ssize_t n_g = self.n_gradients, n_out = plan.n_out, i, n_held = 0
        cdef Py_ssize_t n_in = n_g + self.n_stash + self.n_backward_graph_inputs
        cdef RunStack stack
        cdef RunArrays a
        cdef bint begun = False
        cdef _Preallocation prealloc = self.backward_prealloc
        cdef bint owned = prealloc.claim()
        cdef InferenceSession session = self.backward_session
        cdef object feed
        cdef list stash = state.stash, backward_inputs = state.backward_inputs
        a.heap = NULL
        try:
            session.begin_run(False)
            begun = True
            run_arrays_init(&a, &stack, n_in, n_out)
            for i in range(n_in):
                if i < n_g:
                    feed = gradients[i]
                elif i < n_g + self.n_stash:
                    feed = stash[i - n_g]
                else:
                    feed = backward_inputs[i - n_g - self.n_stash]
                (<OrtValue>feed).begin_use()
                Py_INCREF(feed)
                a.in_holders[i] = <PyObject*>feed
                n_held += 1
                a.in_names[i] = self.backward_input_names[i]
                a.in_values[i] = (<OrtValue>feed).handle
            for i in range(n_out):
                a.out_names[i] = plan.names[i]
            return _run_hot(session, &a, n_in, n_out, plan.slots, NULL, &prealloc.enabled,
                            self.allocator, prealloc.spares, owned)
        finally:
            for i in range(n_held):
                (<OrtValue>a.in_holders[i]).end_use()
                Py_DECREF(<object>a.in_holders[i])
            run_arrays_release(&a)
            if begun:
                session.end_run(0)
            if owned:
                prealloc.give_up()

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


cdef class _AgentHotPath:
    """The state API's entry points of :class:`ortagent.TrainingAgent` (its base class).

    ``run_forward`` and ``run_backward`` hand the call a training loop makes every step --
    ``run_forward(feeds, fetches, state)`` with feeds in graph-input order and a
    PartialGraphExecutionState, ``run_backward(grads, fetches, state)`` with gradients in YieldOp
    order -- to the engine without a Python frame. Every other call (the run-id API, names to
    reorder, mistakes to explain) goes to the TrainingAgent's methods, which reorder and call
    the same engine methods: the direct path is the general path minus the reordering."""

    def _enable_hot_path(self, _AgentEngine engine, bint forward, bint backward, list forward_targets,
                         list output_positions, list output_targets):
        """Called once by TrainingAgent.__init__: `forward` / `backward` tell whether the agent's
        names need no reordering (feeds, fetches and gradients in graph order, no input the
        forward must check for the backward); `forward_targets` and `output_targets` are where
        the fetches go, `output_positions` the graph outputs fetched."""
        self.hot_plan = engine.output_plan(output_positions, output_targets)
        # None: every module output where onnxruntime puts it (on a CPU-only agent, that is
        # also where any CPU target asks for it)
        self.hot_targets = None
        for target in forward_targets:
            if target is not None and not (engine.cpu_only and _is_cpu_target(target)):
                self.hot_targets = list(forward_targets)
                break
        self.n_hot_feeds = engine.n_graph_inputs
        self.hot_forward = forward
        self.hot_backward = backward
        self.hot_engine = engine

    def run_forward(self, feeds_or_iobinding, fetches_or_run_options=None, state=None, cache=None):
        """State API: ``run_forward(feeds, fetches, state)`` fills `fetches` in place with the
        forward outputs. Run-id API: ``run_forward(iobinding, run_options)`` returns
        ``(outputs, run_id)``."""
        cdef list outputs
        if (self.hot_forward and type(state) is PartialGraphExecutionState
                and type(feeds_or_iobinding) is list and type(fetches_or_run_options) is list
                and len(<list>feeds_or_iobinding) == self.n_hot_feeds):
            outputs = self.hot_engine.forward_run(state, feeds_or_iobinding, None, self.hot_targets)
            PyList_SetSlice(fetches_or_run_options, 0, len(<list>fetches_or_run_options), outputs)
            return None
        return self._run_forward(feeds_or_iobinding, fetches_or_run_options, state, cache)

    def run_backward(self, feeds_or_grads, fetches_or_run_id, state=None):
        """State API: ``run_backward(feeds, fetches, state)`` fills `fetches` with the graph
        outputs. Run-id API: ``run_backward(backward_output_grads, run_id)``: the gradients land
        in the outputs bound to the run's io binding (``iobinding.get_outputs()``)."""
        cdef list outputs
        if (self.hot_backward and type(state) is PartialGraphExecutionState
                and type(feeds_or_grads) is list and type(fetches_or_run_id) is list):
            outputs = self.hot_engine.backward_run(state, feeds_or_grads, self.hot_plan, None)
            PyList_SetSlice(fetches_or_run_id, 0, len(<list>fetches_or_run_id), outputs)
            return None
        return self._run_backward(feeds_or_grads, fetches_or_run_id, state)

    def _plan_of_state_api(self):
        """The output plan of run_backward's state API (TrainingAgent's reordering path)."""
        return self.hot_plan
