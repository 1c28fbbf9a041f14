from cpython.object cimport PyObject
from ortagent cimport _capi as ort
from libc.stdint cimport int64_t


cdef enum FeedKind:
    FEED_CONVERTED = 0      # converted by _containers (a sequence, a map, a string tensor)
    FEED_PLAIN = 1          # a NumPy array feeds it as is
    FEED_OPTIONAL = 2       # a graph input of an optional type: None (or an empty value) leaves it out


cdef class InferenceSession:
    cdef object __weakref__
    cdef ort.OrtSession* handle
    cdef readonly object _sess_options          # the SessionOptions given (or a default one)
    cdef list _providers
    cdef object _model_path                     # the model's path (bytes) or None
    cdef object _model_bytes                    # the serialized model or None
    cdef bint _fallback                         # retry failed creations on the fallback providers
    cdef bint _strict                           # strict_providers: unusable providers are errors
    cdef list _input_descs                      # per feedable input: its type descriptor (_containers)
    cdef char* feed_kinds                       # per feedable input: a FeedKind
    cdef list _provider_options
    cdef Py_ssize_t n_inputs                    # graph inputs
    cdef Py_ssize_t n_required_inputs           # graph inputs that are not of an optional type
    cdef Py_ssize_t n_feedable                  # inputs + overridable initializers
    cdef Py_ssize_t n_outputs
    # Names encoded once at creation; owned (malloc'ed) by the session.
    cdef char** input_names_c                   # n_feedable names: inputs, then initializers
    cdef char** output_names_c
    cdef int* input_elem_types                  # ONNX element type per input, -1 if not a tensor
    cdef FixedOutput* fixed_outputs             # per output (see FixedOutput)
    cdef bint flush_denormals                   # the options' session.set_denormal_as_zero is "1": see fp_env.h
    cdef bint preallocate_outputs               # off once a preallocated run failed where
                                                # an onnxruntime-allocated one succeeded
    cdef dict input_index                       # name -> position
    cdef dict output_index
    cdef list _inputs_meta
    cdef list _outputs_meta
    cdef list _overridable_meta
    cdef readonly bint cpu_only                 # the CPU provider only: outputs are host memory
    # Changed inside a critical section on the session (with the GIL on a GIL build):
    cdef Py_ssize_t runs_in_flight
    cdef bint close_pending
    cdef bint replacing                         # set_providers() is replacing the handle
    # The run caches, one lane per concurrent run (see RunLane): lanes[:n_lanes] are made.
    # Which lanes are busy changes inside the critical section; a lane's contents belong to the
    # run holding it. The fixed outputs' type and shape change inside the critical section (a
    # run holding a lane, or an agent run holding its half's _agent._Preallocation, confirms them).
    cdef RunLane* lanes[MAX_RUN_LANES]
    cdef int n_lanes
    # Per lane: the copies its run's feeds needed (a list made once, not per call), emptied as
    # the run ends.
    cdef list lane_keeps
    cdef int require_open(self) except -1
    # A run starts (ObjectClosedError once closed): counted in runs_in_flight so that close()
    # waits for it. With `claim`, returns the number of the lane the run took (index + 1; lane
    # 1 also owns the session-wide flags), or 0 when every lane is busy.
    cdef int begin_run(self, bint claim) except -1
    # The run ended: `lane` is what begin_run returned.
    cdef void end_run(self, int lane) noexcept
    cdef int output_positions(self, object output_names, const char** names_out,
                              Py_ssize_t* positions_out, Py_ssize_t capacity) except -1
    cdef int _read_io_metadata(self) except -1
    cdef _create_with_fallback(self, list requested)
    cdef int _plan_fixed_output(self, Py_ssize_t position, object arg, int elem) except -1
    cdef int _confirm_fixed_output(self, FixedOutput* fixed, OrtValue value) except -1
    cdef void _release_handle(self) noexcept
    # Release `closing` (the session's handle, already detached) and the lanes' bindings of it.
    cdef void _release_session(self, ort.OrtSession* closing) noexcept
    cdef list _run(self, object output_names, object input_feed, object run_options, bint as_numpy)


# What run_with_iobinding runs (IOBinding, _iobinding_decl.pxi, implements run_in).
cdef class SessionBinding:
    cdef int run_in(self, InferenceSession session, object run_options) except -1


# A RunCall (see _run_core) for a run of `session`: its handle and facts, every output policy's
# extra off (no lane, spares, binding or retry hook); the caller sets what its run uses.
cdef inline void init_call(RunCall* call, InferenceSession session, ort.OrtRunOptions* options,
                           Py_ssize_t n_in, Py_ssize_t n_out) noexcept:
    call.session = session.handle
    call.options = options
    call.n_in = n_in
    call.n_out = n_out
    call.input_names = session.input_names_c
    call.input_types = session.input_elem_types
    call.n_inputs = session.n_feedable
    call.fixed = session.fixed_outputs
    call.lane = NULL
    call.lane_binding = False
    call.n_feedable = session.n_feedable
    call.spares = NULL
    call.allocator = NULL
    call.preallocate = NULL
    call.outputs_on_cpu = False
    call.binding = NULL
    call.synchronize = False
    call.flush_denormals = session.flush_denormals
    call.bound_results = False
    call.rebind = NULL
    call.rebind_owner = NULL
