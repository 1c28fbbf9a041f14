"""InferenceSession, with the names and behaviour of onnxruntime's Python class and the cost of
calling the C API directly (the run's C arrays and cache lanes are in _run_core).

Input and output names are encoded once when the session is created; a run builds its C arrays
on the stack (heap beyond 16 entries), creates tensors over the NumPy feeds, releases the GIL
around ``OrtApi::Run`` and returns NumPy views of the buffers ORT produced.
"""

import enum
import os

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_GetItem
from cpython.list cimport PyList_New, PyList_SET_ITEM, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsSsize_t
from cpython.object cimport PyObject
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.ref cimport Py_INCREF, Py_DECREF, Py_XDECREF
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport strlen, strcpy, memset

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, ensure_loaded, shared_runtime, live_handle_counts, count_add, interruptible_begin,
    HANDLE_SESSION, HANDLE_SESSION_OPTIONS, HANDLE_RUN_OPTIONS, HANDLE_VALUE, HANDLE_IO_BINDING,
    encode_text, take_ort_string,
)

from ortagent._runtime import get_available_providers, ALL_PROVIDERS as _ALL_PROVIDERS
from ortagent.errors import (
    OrtError, OrtFail, OrtInvalidArgument, OrtInvalidType, OrtNotImplemented, ObjectClosedError, ProviderError,
)


cdef enum:
    # Outputs larger than this are left to onnxruntime even when their shape is fixed. A new
    # NumPy array of a few MiB or more is a fresh mmap whose pages fault in on every run
    # (64 MiB: 10.4 ms a run against 4.7 ms with onnxruntime's arena reusing its memory);
    # below glibc's default mmap threshold (128 KiB) it comes from the heap, and small outputs
    # are where sparing onnxruntime's allocation matters.
    PREALLOCATE_MAX_BYTES = 65536
    # Fixed outputs up to this size go through a scratch tensor of the run's lane (RunLane.scratch)
    # and one memcpy into a new array: on Identity f32[1] that is ~1,200 instructions a run less
    # than a new tensor over each new array (CreateTensorWithDataAsOrtValue + ReleaseValue).
    COPY_OUT_MAX_BYTES = 1024


# ---- metadata ------------------------------------------------------------------------------------

cdef inline bint _asked_twice(const Py_ssize_t* positions, Py_ssize_t n, Py_ssize_t i) noexcept:
    """Whether output position positions[i] stands anywhere else in positions[:n]."""
    cdef Py_ssize_t j
    for j in range(n):
        if j != i and positions[j] == positions[i]:
            return True
    return False


# ---- feeds and run status (the run's C arrays and Run itself: _run_core) ----------------------------

cdef extern from "Python.h":
    Py_ssize_t PyDict_GET_SIZE(object mapping)      # (not in Cython's cpython.dict)


cdef bint _absent_optional(object feed) except -1:
    """Whether a feed for an input of an optional type means "no element": None, as in
    onnxruntime's Python API, or an OrtValue without a value (an optional a model output). Such an
    input is left out of Run, which onnxruntime reads as an optional without an element; feeding
    the empty value itself crashes its Run."""
    cdef int present = 1
    if feed is None:
        return True
    if type(feed) is OrtValue:
        (<OrtValue>feed).require_handle()
        check(ort.HasValue((<OrtValue>feed).handle, &present))
    return not present


# ---- InferenceSession ----------------------------------------------------------------------------

cdef char* _copy_c_string(bytes text) except NULL:
    cdef char* copy = <char*>malloc(PyBytes_GET_SIZE(text) + 1)
    if copy == NULL:
        raise MemoryError()
    strcpy(copy, PyBytes_AS_STRING(text))
    return copy


@cython.final
cdef class InferenceSession:
    """A loaded model, run with NumPy arrays or OrtValues.

    ``InferenceSession(path_or_bytes, sess_options=None, providers=None, provider_options=None)``
    where `path_or_bytes` is a file path, the serialized model, or an ``onnx.ModelProto``, and
    `providers` lists provider names or ``(name, options)`` tuples in order of precedence
    (default: CPU only). The CPU provider is always available as the last resort.
    """

    def __cinit__(self):
        self.lane_keeps = [[] for _ in range(MAX_RUN_LANES)]
        self.input_index = {}
        self.output_index = {}
        self._inputs_meta = []
        self._outputs_meta = []
        self._overridable_meta = []

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, *,
                 bint strict_providers=False, **kwargs):
        if self.handle != NULL:
            raise OrtInvalidArgument("InferenceSession is already initialised")
        ensure_loaded()
        if sess_options is None:
            sess_options = SessionOptions()
        elif not isinstance(sess_options, SessionOptions):
            raise OrtInvalidType(f"sess_options must be ortagent.SessionOptions, got "
                                 f"{type(sess_options).__name__}")
        per_session_threads_refused(sess_options)
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            self._model_bytes = bytes(path_or_bytes)
        elif isinstance(path_or_bytes, (str, os.PathLike)):
            self._model_path = os.fsencode(path_or_bytes)
            if b"\0" in self._model_path:
                raise OrtInvalidArgument("model path must not contain NUL characters")
        elif hasattr(path_or_bytes, "SerializeToString"):
            self._model_bytes = path_or_bytes.SerializeToString()
        else:
            raise OrtInvalidType("path_or_bytes must be a path, bytes or an onnx.ModelProto, got "
                                 f"{type(path_or_bytes).__name__}")
        self._sess_options = effective_options(sess_options, kwargs, self._model_path, self._model_bytes)
        self.flush_denormals = (<SessionOptions>self._sess_options)._config_entries.get(
            "session.set_denormal_as_zero") == "1"
        self._strict = strict_providers or strict_scope.get()
        self._fallback = True
        self._create_with_fallback(normalise_providers(providers, provider_options, self._strict))
        self._read_io_metadata()

    cdef _create_with_fallback(self, list requested):
        """Create the session (replacing any held) with onnxruntime's provider fallback (see
        _providers.create_session)."""
        cdef list registered = []
        cdef bint fell_back = False
        cdef ort.OrtSession* session = create_session(
            (<SessionOptions>self._sess_options).handle, self._model_path, self._model_bytes, requested,
            self._strict, self._fallback, registered, &fell_back)
        self._release_handle()
        self.handle = session
        count_add(&_live[<int>HANDLE_SESSION], 1)
        if fell_back:
            self._fallback = False          # onnxruntime falls back once
        # providers added to the options for devices come first (onnxruntime lists them so)
        added = [name for name in (<SessionOptions>self._sess_options)._device_providers
                 if name not in [n for n, _ in registered]]
        registered[:0] = [(name, {}) for name in added]
        self._providers = [name for name, _ in registered]
        self.cpu_only = self._providers == [CPU_PROVIDER]
        self._provider_options = [settings for _, settings in registered]

    cdef int _read_io_metadata(self) except -1:
        """Encode names once and read types: inputs (then overridable initializers, which may
        also be fed by name) and outputs."""
        cdef size_t n_in = 0, n_out = 0, n_over = 0, i
        cdef ort.OrtAllocator* allocator = NULL
        cdef char* name_c = NULL
        cdef ort.OrtTypeInfo* type_info = NULL
        cdef int elem = -1
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        check(ort.SessionGetInputCount(self.handle, &n_in))
        check(ort.SessionGetOutputCount(self.handle, &n_out))
        check(ort.SessionGetOverridableInitializerCount(self.handle, &n_over))
        self.input_names_c = <char**>calloc(n_in + n_over + 1, sizeof(char*))
        self.output_names_c = <char**>calloc(n_out + 1, sizeof(char*))
        self.input_elem_types = <int*>calloc(n_in + n_over + 1, sizeof(int))
        self.fixed_outputs = <FixedOutput*>calloc(n_out + 1, sizeof(FixedOutput))
        self.feed_kinds = <char*>calloc(n_in + n_over + 1, sizeof(char))
        self._input_descs = []
        self.n_required_inputs = 0
        if (self.feed_kinds == NULL or self.input_names_c == NULL or self.output_names_c == NULL or self.input_elem_types == NULL
                or self.fixed_outputs == NULL):
            raise MemoryError()
        for i in range(n_in + n_over):
            if i < n_in:
                check(ort.SessionGetInputName(self.handle, i, allocator, &name_c))
            else:
                check(ort.SessionGetOverridableInitializerName(self.handle, i - n_in, allocator, &name_c))
            name = take_ort_string(name_c, allocator)
            self.input_names_c[i] = _copy_c_string(name.encode("utf-8"))
            self.n_feedable = i + 1
            if i < n_in:
                check(ort.SessionGetInputTypeInfo(self.handle, i, &type_info))
            else:
                check(ort.SessionGetOverridableInitializerTypeInfo(self.handle, i - n_in, &type_info))
            try:
                arg = node_arg(name, type_info, &elem)
            finally:
                ort.ReleaseTypeInfo(type_info)
            (self._inputs_meta if i < n_in else self._overridable_meta).append(arg)
            self.input_elem_types[i] = elem
            self._input_descs.append(parse_type_string(arg.type))
            # string tensors take np.void arrays too, which need converting
            if elem >= 0 and elem != 8:
                self.feed_kinds[i] = FEED_PLAIN
            elif i < n_in and self._input_descs[i][0] == "optional":
                self.feed_kinds[i] = FEED_OPTIONAL
            else:
                self.feed_kinds[i] = FEED_CONVERTED
            if i < n_in and self.feed_kinds[i] != FEED_OPTIONAL:
                self.n_required_inputs += 1
            self.input_index[name] = i
        self.n_inputs = n_in
        for i in range(n_out):
            check(ort.SessionGetOutputName(self.handle, i, allocator, &name_c))
            name = take_ort_string(name_c, allocator)
            self.output_names_c[i] = _copy_c_string(name.encode("utf-8"))
            self.n_outputs = i + 1
            check(ort.SessionGetOutputTypeInfo(self.handle, i, &type_info))
            try:
                arg = node_arg(name, type_info, &elem)
            finally:
                ort.ReleaseTypeInfo(type_info)
            self._outputs_meta.append(arg)
            self.output_index[name] = i
            self._plan_fixed_output(i, arg, elem)
        self.preallocate_outputs = True
        return 0

    cdef int _plan_fixed_output(self, Py_ssize_t position, object arg, int elem) except -1:
        """Mark the output at `position` fixed when the model gives it a plain tensor type with
        a builtin NumPy equivalent and a shape of known, non-zero dimensions, at most
        PREALLOCATE_MAX_BYTES in all. An output that is
        also a graph input is never fixed: onnxruntime hands such an output back as the feed
        itself, without writing into a buffer given for it."""
        cdef FixedOutput* fixed = &self.fixed_outputs[position]
        cdef Py_ssize_t d
        cdef int64_t nbytes = element_size(elem)
        fixed.elem_type = -1
        shape = arg.shape
        if (elem < 0 or not has_builtin_numpy_type(elem) or arg.type.startswith("sparse_")
                or shape is None or len(shape) > MAX_INLINE_DIMS or arg.name in self.input_index):
            return 0
        for d in range(len(shape)):
            if type(shape[d]) is not int or shape[d] <= 0 or shape[d] > PREALLOCATE_MAX_BYTES:
                return 0
            nbytes *= <int64_t>shape[d]
            if nbytes > PREALLOCATE_MAX_BYTES:
                return 0
            fixed.dims[d] = shape[d]
        fixed.ndim = <int>len(shape)
        fixed.nbytes = <size_t>nbytes
        fixed.elem_type = elem
        return 0

    def __dealloc__(self):
        self._release_handle()
        cdef Py_ssize_t i
        if self.input_names_c != NULL:
            for i in range(self.n_feedable):
                free(self.input_names_c[i])
            free(self.input_names_c)
            self.input_names_c = NULL
        if self.output_names_c != NULL:
            for i in range(self.n_outputs):
                free(self.output_names_c[i])
            free(self.output_names_c)
            self.output_names_c = NULL
        free(self.input_elem_types)
        self.input_elem_types = NULL
        free(self.fixed_outputs)
        self.fixed_outputs = NULL
        for i in range(self.n_lanes):
            lane_free(self.lanes[i], self.n_feedable, self.n_outputs)
            self.lanes[i] = NULL
        self.n_lanes = 0
        free(self.feed_kinds)
        self.feed_kinds = NULL

    cdef void _release_handle(self) noexcept:
        cdef ort.OrtSession* closing = self.handle
        self.handle = NULL
        self._release_session(closing)

    cdef void _release_session(self, ort.OrtSession* closing) noexcept:
        cdef int k
        for k in range(self.n_lanes):
            lane_drop_binding(self.lanes[k])       # bindings belong to the session released
        if closing != NULL:
            ort.ReleaseSession(closing)
            count_add(&_live[<int>HANDLE_SESSION], -1)

    cdef int require_open(self) except -1:
        if self.handle == NULL or self.close_pending:
            raise ObjectClosedError("this InferenceSession has been closed")
        return 0

    # begin_run, end_run, close and set_providers change the run count, the close and replace
    # flags and the cache owner inside a critical section on the session: nothing on a GIL
    # build, where the GIL held throughout does the same; on a free-threaded build the
    # session's own lock, held for these few C statements only (never across Run).

    cdef int begin_run(self, bint claim) except -1:
        cdef int took = -1, k, free_lane = -1
        cdef unsigned long me = PyThread_get_thread_ident() if claim else 0
        with cython.critical_section(self):
            if self.handle != NULL and not self.close_pending and not self.replacing:
                self.runs_in_flight += 1
                took = 0
                if claim:
                    for k in range(self.n_lanes):
                        if not self.lanes[k].busy:
                            if self.lanes[k].owner == me:
                                free_lane = k
                                break
                            if free_lane < 0:
                                free_lane = k
                    if free_lane < 0 and self.n_lanes < MAX_RUN_LANES and self.fixed_outputs != NULL:
                        self.lanes[self.n_lanes] = lane_new(self.n_feedable, self.n_outputs)
                        if self.lanes[self.n_lanes] != NULL:
                            free_lane = self.n_lanes
                            self.n_lanes += 1
                    if free_lane >= 0:
                        self.lanes[free_lane].busy = True
                        self.lanes[free_lane].owner = me
                        took = free_lane + 1
        if took < 0:
            self.require_open()
            raise OrtInvalidArgument("a run cannot start while set_providers() replaces the session "
                                     "on another thread")
        return took

    cdef void end_run(self, int lane) noexcept:
        cdef ort.OrtSession* closing = NULL
        with cython.critical_section(self):
            self.runs_in_flight -= 1
            if lane > 0:
                self.lanes[lane - 1].busy = False
            if self.close_pending and self.runs_in_flight == 0:
                closing = self.handle
                self.handle = NULL
        if closing != NULL:
            self._release_session(closing)

    def close(self):
        """Release the session. Runs in flight on other threads finish first; values already
        returned stay valid."""
        cdef ort.OrtSession* closing = NULL
        with cython.critical_section(self):
            self.close_pending = True
            if self.runs_in_flight == 0:
                closing = self.handle
                self.handle = NULL
        if closing != NULL:
            self._release_session(closing)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # -- metadata --------------------------------------------------------------------------------

    def get_inputs(self):
        """Inputs as NodeArg(name, type, shape)."""
        return list(self._inputs_meta)

    def get_outputs(self):
        return list(self._outputs_meta)

    def get_overridable_initializers(self):
        return list(self._overridable_meta)

    def get_providers(self):
        """Execution providers registered for this session, in order of precedence."""
        return list(self._providers)

    def get_provider_options(self):
        """{provider: {option: value}}; for CUDA the full effective option set."""
        result = {}
        for name, settings in zip(self._providers, self._provider_options):
            result[name] = effective_cuda_options(settings) if name == CUDA_PROVIDER else dict(settings)
        return result

    def get_session_options(self):
        return self._sess_options

    def get_modelmeta(self):
        self.require_open()
        return read_model_metadata(self.handle)

    # -- running -----------------------------------------------------------------------------------

    cdef int output_positions(self, object output_names, const char** names_out,
                              Py_ssize_t* positions_out, Py_ssize_t capacity) except -1:
        cdef Py_ssize_t i = 0
        if output_names is None:
            for i in range(self.n_outputs):
                names_out[i] = self.output_names_c[i]
                positions_out[i] = i
            return <int>self.n_outputs
        for name in output_names:
            if i >= capacity:
                raise OrtInvalidArgument("too many output names")
            position = self.output_index.get(name)
            if position is None:
                raise OrtInvalidArgument(
                    f"unknown output name {name!r}; the model's outputs are {list(self.output_index)}")
            names_out[i] = self.output_names_c[<Py_ssize_t>position]
            positions_out[i] = <Py_ssize_t>position
            i += 1
        return <int>i

    cdef int _confirm_fixed_output(self, FixedOutput* fixed, OrtValue value) except -1:
        """After a run where onnxruntime allocated a fixed output: preallocate it from now on
        if it came out with exactly the declared type and shape, never again if not. (Runs of
        other lanes read these fields: they change inside the critical section.)"""
        cdef int d
        cdef bint same = value.elem_type == fixed.elem_type and value.ndim == fixed.ndim
        if same:
            for d in range(fixed.ndim):
                if value.dims[d] != fixed.dims[d]:
                    same = False
                    break
        with cython.critical_section(self):
            if same:
                fixed.confirmed = True
            else:
                fixed.elem_type = -1
        return 0

    def run(self, output_names, input_feed, run_options=None):
        """Run the model. `input_feed` maps input names to NumPy arrays (or OrtValues); returns a
        list of NumPy arrays for `output_names` (None = all outputs, in model order), none of
        them a copy: small outputs of fixed type and shape are new arrays onnxruntime wrote
        into, the others views of onnxruntime's output buffers."""
        return self._run(output_names, input_feed, run_options, True)

    def _run_binding_stats(self):
        """(binds made, runs through a lane's binding, whether a lane stopped binding, how
        many lanes hold a binding now), summed over the session's run lanes: for tests of
        run()'s binding path. (Bindings are the session's, released with it, and not counted
        in live_handles(), like its other caches.)"""
        cdef int k
        cdef Py_ssize_t binds = 0, bound_runs = 0, held = 0
        cdef bint refused = False
        for k in range(self.n_lanes):
            binds += self.lanes[k].n_binds
            bound_runs += self.lanes[k].n_bound_runs
            refused = refused or self.lanes[k].binding_refused
            held += self.lanes[k].binding != NULL
        return binds, bound_runs, refused, held

    def _run_lanes(self):
        """How many run lanes the session has made (for tests)."""
        return self.n_lanes

    def run_with_ort_values(self, output_names, input_dict, run_options=None):
        """Like run(), returning OrtValues (outputs stay where onnxruntime produced them)."""
        return self._run(output_names, input_dict, run_options, False)

    cdef list _run(self, object output_names, object input_feed, object run_options, bint as_numpy):
        """run() and run_with_ort_values(): the feeds held and the output policies chosen here,
        the run itself in _run_core.run_core."""
        if not isinstance(input_feed, dict):
            raise OrtInvalidType(f"input_feed must be a dict of name -> array, got "
                                 f"{type(input_feed).__name__}")
        cdef ort.OrtRunOptions* run_options_c = NULL
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                raise OrtInvalidType(f"run_options must be ortagent.RunOptions, got "
                                     f"{type(run_options).__name__}")
            run_options_c = (<RunOptions>run_options).handle
        cdef Py_ssize_t n_in = PyDict_GET_SIZE(input_feed)
        if output_names is not None and type(output_names) is not list and type(output_names) is not tuple:
            if isinstance(output_names, (str, bytes)):
                raise OrtInvalidType(f"output_names must be a list of names or None, not a string "
                                     f"({output_names!r})")
            try:
                output_names = list(output_names)
            except TypeError:
                raise OrtInvalidType(f"output_names must be a list of names or None, got "
                                     f"{type(output_names).__name__}") from None
        if output_names is not None and len(output_names) == 0:
            output_names = None                 # onnxruntime: no names means every output
        cdef Py_ssize_t n_out_capacity = self.n_outputs if output_names is None else len(output_names)
        cdef RunStack stack
        cdef RunArrays a
        cdef RunCall call
        cdef Py_ssize_t kept
        cdef bint from_cache = False
        cdef bint preallocating
        cdef FixedOutput* fixed
        cdef Py_ssize_t i, n_ready = 0, n_out = 0, n_required = 0, cursor = 0
        cdef PyObject* key = NULL
        cdef PyObject* item = NULL
        cdef PyObject* position
        cdef object feed
        cdef list keep = None
        cdef list results
        cdef OrtValue value
        # The run's lane of caches (see RunLane): a run without one (every lane busy) looks
        # every name up, makes a tensor for every array and lets onnxruntime allocate every
        # output.
        cdef int lane_number = self.begin_run(True)
        cdef bint claimed = lane_number > 0
        cdef RunLane* lane = NULL
        if claimed:
            lane = self.lanes[lane_number - 1]
            keep = self.lane_keeps[lane_number - 1]

        a.heap = NULL
        try:
            run_arrays_init(&a, &stack, n_in, n_out_capacity)
            # Feed holding (see _run_core): each feed's FeedHold, a reference to it in in_refs.
            while n_ready < n_in and PyDict_Next(input_feed, &cursor, &key, &item):
                # Callers usually pass the same key objects in the same order: compare the key
                # with the one seen at this place last time before looking the name up.
                if claimed and n_ready < self.n_feedable and lane.feed_keys[n_ready] == key:
                    i = lane.feed_key_positions[n_ready]
                else:
                    position = PyDict_GetItem(self.input_index, <object>key)
                    if position == NULL:
                        raise OrtInvalidArgument(
                            f"unknown input name {<object>key!r}; the model's inputs are {list(self.input_index)}")
                    i = PyLong_AsSsize_t(<object>position)
                    if claimed and n_ready < self.n_feedable:
                        Py_INCREF(<object>key)
                        Py_XDECREF(lane.feed_keys[n_ready])
                        lane.feed_keys[n_ready] = key
                        lane.feed_key_positions[n_ready] = i
                feed = <object>item                 # a reference of ours from here on
                if self.feed_kinds[i] == FEED_OPTIONAL and _absent_optional(feed):
                    continue                    # onnxruntime's None: the input is left out
                if i < self.n_inputs and self.feed_kinds[i] != FEED_OPTIONAL:
                    n_required += 1
                a.in_names[n_ready] = self.input_names_c[i]
                a.in_slots[n_ready] = i
                if type(feed) is OrtValue:
                    if not (<OrtValue>feed).is_tensor_value:
                        (<OrtValue>feed).describe()      # once: afterwards a tensor skips this
                        if not (<OrtValue>feed).is_tensor_value:
                            check_feedable(<OrtValue>feed, <object>key)
                    hold_value(&a, n_ready, feed)
                else:
                    if keep is None:
                        keep = []
                    kept = len(keep)
                    if (self.feed_kinds[i] != FEED_PLAIN or type(feed) is list or type(feed) is tuple
                            or feed is None):
                        # a list, a sequence, a map, an optional, a string tensor: converted
                        a.in_values[n_ready] = value_for_feed(feed, self._input_descs[i], <object>key, keep)
                        from_cache = False
                    elif claimed:
                        a.in_values[n_ready] = feed_view(&lane.feed_views[i], feed, <object>key,
                                                         self.input_elem_types[i], keep, &from_cache)
                    else:
                        a.in_values[n_ready] = tensor_for_feed(feed, <object>key, self.input_elem_types[i], keep)
                        from_cache = False
                    a.in_hold[n_ready] = HOLD_CACHED if from_cache else HOLD_CREATED
                    Py_INCREF(feed)
                    a.in_refs[n_ready] = <PyObject*>feed
                    # what owns the memory the tensor describes: the feed, or its copy (kept
                    # alive by `keep` until this call returns)
                    a.in_holders[n_ready] = <PyObject*>keep[len(keep) - 1] if len(keep) > kept else <PyObject*>feed
                n_ready += 1
            if n_required < self.n_required_inputs:
                self._raise_missing_inputs(input_feed)
            # Output policies: a small fixed output (type and shape confirmed by a run) goes
            # through the lane's scratch tensor, a larger one into a new array; the rest, and
            # names asked for twice, are onnxruntime's to allocate.
            n_out = self.output_positions(output_names, a.out_names, a.out_slots, n_out_capacity)
            preallocating = claimed and as_numpy and self.cpu_only and self.preallocate_outputs
            for i in range(n_out):
                set_output(&a, i, a.out_names[i], a.out_slots[i], OUT_ORT)
                if preallocating:
                    fixed = &self.fixed_outputs[a.out_slots[i]]
                    if (fixed.elem_type >= 0 and fixed.confirmed
                            and (output_names is None or not _asked_twice(a.out_slots, n_out, i))):
                        a.out_policy[i] = OUT_SCRATCH if fixed.nbytes <= COPY_OUT_MAX_BYTES else OUT_NEW_ARRAY
            init_call(&call, self, run_options_c, n_ready, n_out)
            call.lane = lane
            call.outputs_on_cpu = self.cpu_only
            call.preallocate = &self.preallocate_outputs
            # (RunWithBinding leaves out the parameters of the LoRA adapters active in the run
            # options, which onnxruntime's C Run adds as feeds: such runs take Run.)
            call.lane_binding = claimed and (run_options is None or not (<RunOptions>run_options)._adapters)
            results = run_core(self, &call, &a)
            if claimed and self.cpu_only:
                for i in range(n_out):
                    fixed = &self.fixed_outputs[a.out_slots[i]]
                    if fixed.elem_type >= 0 and not fixed.confirmed and a.out_policy[i] == OUT_ORT \
                            and results[i] is not None:
                        self._confirm_fixed_output(fixed, <OrtValue>results[i])
            if as_numpy:
                for i in range(n_out):
                    if a.out_policy[i] != OUT_ORT:
                        continue                    # a new array already
                    value = results[i]
                    value.describe()
                    if not value.is_tensor_value:
                        _list_replace(results, i, python_from_value(value))
                    elif value.memory_owner is not None:
                        # an alias of a feed (a graph input that is also an output, an
                        # Identity of one): a copy, as onnxruntime's run() returns, so that
                        # the caller's later writes to the feed do not change the result
                        _list_replace(results, i, value_to_numpy(value, False).copy())
                    else:
                        _list_replace(results, i, value_to_numpy(value, False))
            return results
        finally:
            release_feeds(&a, n_ready, lane)
            run_arrays_release(&a)
            if claimed and PyList_GET_SIZE(keep):
                del keep[:]                         # the copies made for this run's feeds
            self.end_run(lane_number)

    def io_binding(self, bint reuse_output_buffers=False):
        """A new IOBinding for this session (see IOBinding)."""
        return IOBinding(self, reuse_output_buffers)

    def run_with_iobinding(self, iobinding, run_options=None):
        """Run with the inputs and outputs bound in `iobinding` (GIL released)."""
        if not isinstance(iobinding, SessionBinding):
            raise OrtInvalidType(f"iobinding must be an ortagent.IOBinding (session.io_binding()), got "
                                 f"{type(iobinding).__name__}")
        (<SessionBinding>iobinding).run_in(self, run_options)

    def _raise_missing_inputs(self, input_feed):
        missing = [arg.name for arg in self._inputs_meta
                   if arg.name not in input_feed and not arg.type.startswith("optional(")]
        # onnxruntime's words, which callers match
        raise OrtInvalidArgument(f"Required inputs ({missing}) are missing from input feed ({list(input_feed)}).")

    # -- onnxruntime's other session methods -----------------------------------------------------

    def set_providers(self, providers=None, provider_options=None):
        """Create the session again with these providers (same model and options)."""
        self.require_open()
        cdef bint busy
        with cython.critical_section(self):
            busy = self.runs_in_flight > 0 or self.replacing
            if not busy:
                self.replacing = True       # runs refuse to start until the new handle is in
        if busy:
            raise OrtInvalidArgument("set_providers() while runs are in flight on other threads")
        try:
            requested = normalise_providers(providers, provider_options, self._strict)
            if not (self._strict or strict_scope.get()):
                available = get_available_providers()
                for name, _ in requested:
                    if name not in available and name not in _ALL_PROVIDERS:
                        # onnxruntime warns, then its recreation fails (set_providers does not
                        # fall back the way the constructor does): the session keeps its providers
                        warn_unavailable(name, available)
                        raise OrtFail(f"Unknown Provider Type: {name}")
            self._create_with_fallback(requested)
        finally:
            with cython.critical_section(self):
                self.replacing = False

    def enable_fallback(self):
        """Let a failed creation (set_providers) retry on the fallback providers (the default)."""
        self._fallback = True

    def disable_fallback(self):
        self._fallback = False

    def end_profiling(self):
        """End profiling: the profile file's name ('' when profiling was off)."""
        self.require_open()
        return end_profiling(self.handle)

    def set_ep_dynamic_options(self, options):
        """Pass {key: value} options to the session's execution providers now."""
        self.require_open()
        set_dynamic_options(self.handle, options)

    def get_provider_graph_assignment_info(self):
        """[OrtEpAssignedSubgraph] (needs 'session.record_ep_graph_assignment_info' = '1')."""
        self.require_open()
        return read_graph_assignment(self.handle)

    def get_input_memory_infos(self):
        """Where each input is expected (OrtMemoryInfo per input; onnxruntime >= 1.23)."""
        self.require_open()
        return session_memory_infos(self.handle, <size_t>self.n_inputs, True)

    def get_input_epdevices(self):
        """The OrtEpDevice each input is expected on (onnxruntime >= 1.23)."""
        self.require_open()
        return session_input_devices(self.handle, <size_t>self.n_inputs)

    def get_output_memory_infos(self):
        self.require_open()
        return session_memory_infos(self.handle, <size_t>self.n_outputs, False)

    def get_profiling_start_time_ns(self):
        self.require_open()
        return profiling_start_ns(self.handle)

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None):
        """Run on another thread and call ``callback(results, user_data, error_text)`` there."""
        self.require_open()
        from ortagent import _async
        _async.start(self, output_names, input_feed, callback, user_data, run_options)

    def __reduce__(self):
        raise OrtInvalidType("InferenceSession cannot be pickled")


cdef class SessionBinding:
    """What InferenceSession.run_with_iobinding runs: IOBinding (_iobinding.pxi, included after
    this file) implements run_in."""

    cdef int run_in(self, InferenceSession session, object run_options) except -1:
        raise NotImplementedError
