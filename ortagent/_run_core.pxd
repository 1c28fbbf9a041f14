# cython: language_level=3
from cpython.object cimport PyObject
from ortagent cimport _capi as ort
from ortagent._tensors cimport FeedView


cdef enum:
    # At most this many runs of one session use caches at once (one lane each, see RunLane);
    # further concurrent runs take the uncached path.
    MAX_RUN_LANES = 8


# One set of a session's run caches. A run holds one lane from begin_run to end_run, so
# concurrent runs (threads sharing a session) each get their own; a thread gets the lane it
# used last when that one is free. Lanes are made as concurrent runs first need them and live
# as long as the session.
cdef struct RunLane:
    bint busy                      # a run holds this lane
    unsigned long owner            # the thread that held it last
    PyObject** feed_keys           # per feed place: the key object seen there last
    Py_ssize_t* feed_key_positions # ... and the input position it named
    FeedView* feed_views           # per input: tensor over the array fed last
    # Per output of at most COPY_OUT_MAX_BYTES (_session.pyx): a tensor made once that
    # onnxruntime writes into and run() copies out of into a new NumPy array (creating and
    # releasing a tensor over each new array cost more than copying a few bytes). The lane's
    # run is the only one using them, and it preallocates an output at most once (an output
    # asked for twice gets none), so no busy flag is needed.
    ort.OrtValue** scratch
    void** scratch_data
    # An IoBinding of the lane's own, for runs that feed the very tensors of the lane's feed
    # views and whose outputs all go to scratch tensors (a loop feeding the same arrays):
    # RunWithBinding skips the per-call name strings and value copies of Run (~830 of ~10,600
    # instructions on Identity). Bound inputs are recorded by position with their feed view's
    # serial; bound outputs by position, in order. n_bound_inputs < 0: nothing bound.
    ort.OrtIoBinding* binding
    unsigned long long* bound_serials   # per feedable input: serial bound, 0 if not bound
    Py_ssize_t* bound_outputs           # output positions bound, in order
    Py_ssize_t n_bound_inputs
    Py_ssize_t n_bound_outputs
    bint binding_refused           # a bind failed, or binds did not pay: no binding
    Py_ssize_t n_binds             # binds made, and runs through the binding
    Py_ssize_t n_bound_runs


cdef enum:
    # The one stack-size constant: a run with up to this many inputs and as many outputs keeps
    # its C arrays on the stack (RunStack); a larger one makes one heap allocation.
    RUN_STACK_SLOTS = 16


# A run's C arrays, per input and per output, in one place: on the stack for small runs,
# else one heap block (`heap`). run_arrays_init sets them up, run_arrays_release frees them.
cdef struct RunArrays:
    const char** in_names
    ort.OrtValue** in_values
    Py_ssize_t* in_created         # per input: what the run did for it (FEED_* in _session.pyx)
    PyObject** in_refs             # a reference of ours to each feed while the GIL is released
    void** in_data                 # each feed tensor's data pointer (to spot outputs aliasing it)
    PyObject** in_holders          # what owns each feed's memory
    const char** out_names
    ort.OrtValue** out_values
    Py_ssize_t* out_positions      # per requested output: its position in the model
    PyObject** out_arrays          # per output: the NumPy array written into, or NULL
    void* heap


cdef struct RunStack:
    const char* in_names[RUN_STACK_SLOTS]
    ort.OrtValue* in_values[RUN_STACK_SLOTS]
    Py_ssize_t in_created[RUN_STACK_SLOTS]
    PyObject* in_refs[RUN_STACK_SLOTS]
    void* in_data[RUN_STACK_SLOTS]
    PyObject* in_holders[RUN_STACK_SLOTS]
    const char* out_names[RUN_STACK_SLOTS]
    ort.OrtValue* out_values[RUN_STACK_SLOTS]
    Py_ssize_t out_positions[RUN_STACK_SLOTS]
    PyObject* out_arrays[RUN_STACK_SLOTS]


cdef int run_arrays_init(RunArrays* arrays, RunStack* stack, Py_ssize_t n_in, Py_ssize_t n_out) except -1
cdef void run_arrays_release(RunArrays* arrays) noexcept
# OrtApi::Run with the GIL released, between interruptible_begin and end_run_call.
cdef ort.OrtStatus* run_nogil(ort.OrtSession* session, ort.OrtRunOptions* options, RunArrays* arrays,
                              Py_ssize_t n_in, Py_ssize_t n_out) noexcept
# OrtApi::RunWithBinding with the GIL released (then SynchronizeBoundOutputs when asked).
cdef ort.OrtStatus* run_binding_nogil(ort.OrtSession* session, ort.OrtRunOptions* options,
                                      ort.OrtIoBinding* binding, bint synchronize) noexcept
# After a run: Ctrl-C handling (interruptible_end), releasing `status` if that raises.
cdef int end_run_call(ort.OrtRunOptions* used, bint registered, ort.OrtStatus* status) except -1
# A lane with nothing cached yet, for a session of n_feedable feedable inputs and n_out outputs;
# NULL when memory is short (the run goes uncached).
cdef RunLane* lane_new(Py_ssize_t n_feedable, Py_ssize_t n_out) noexcept
# Release the lane's IoBinding (its bound values with it); nothing is bound afterwards.
cdef void lane_drop_binding(RunLane* lane) noexcept
# Release what the lane holds (its first n_feedable feed caches, n_out scratch tensors) and it.
cdef void lane_free(RunLane* lane, Py_ssize_t n_feedable, Py_ssize_t n_out) noexcept
