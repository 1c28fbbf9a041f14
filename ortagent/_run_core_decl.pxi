from cpython.object cimport PyObject
from ortagent cimport _capi as ort
from libc.stdint cimport int64_t

cdef extern from "ortagent/fp_env.h" nogil:
    unsigned int ortagent_flush_denormals_begin()
    void ortagent_flush_denormals_end(unsigned int before)


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
    # Per output of at most COPY_OUT_MAX_BYTES (_session.pxi): a tensor made once that
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


# How the run holds feed i, and so what release_feeds does for it once the run is over.
cdef enum FeedHold:
    HOLD_BORROWED = 0      # the caller's OrtValue (in_refs[i]): begin_use'd, end_use'd after
    HOLD_CREATED = 1       # a tensor made for this run: released after
    HOLD_CACHED = 2        # the lane's feed view of input in_slots[i]: release_feed_view after
    HOLD_BY_CALLER = 3     # the core's caller holds it and lets it go (the agent's hot path)


# Where output i is written: the one allocation policy per output that run_core carries out.
cdef enum OutputPolicy:
    OUT_ORT = 0            # onnxruntime allocates it; returned as an OrtValue
    OUT_NEW_ARRAY = 1      # into a new NumPy array (out_objects[i]) through a tensor over it
    OUT_SCRATCH = 2        # into the lane's scratch tensor, copied into a new NumPy array after
    OUT_SPARE = 3          # into a tensor from the spares (else the pool), which it goes back to
    OUT_CALLER = 4         # into the caller's OrtValue (out_objects[i]), returned as is
    OUT_DEVICE = 5         # bound to a device in the call's IoBinding: onnxruntime allocates there


# An output whose element type and shape the model fixes. A run lets onnxruntime write it
# into a buffer of ours (OUT_NEW_ARRAY, OUT_SCRATCH, OUT_SPARE) once a run has produced
# exactly that shape.
cdef struct FixedOutput:
    int elem_type                  # ONNX element type; -1: not fixed, onnxruntime allocates it
    bint confirmed                 # a run produced this type and shape
    int ndim
    int64_t dims[MAX_INLINE_DIMS]
    size_t nbytes


# A run's C arrays, per input and per output, in one place: on the stack for small runs,
# else one heap block (`heap`). run_arrays_init sets them up, run_arrays_release frees them.
# Each field means one thing for every caller.
cdef struct RunArrays:
    const char** in_names
    ort.OrtValue** in_values
    FeedHold* in_hold              # per feed: how the run holds it (FeedHold)
    Py_ssize_t* in_slots           # per feed: its input position in the session
    PyObject** in_refs             # per feed: a reference the run holds to the caller's object
    void** in_data                 # per feed: its tensor's data pointer (to spot outputs aliasing it)
    PyObject** in_holders          # per feed: what owns its memory (borrowed)
    const char** out_names
    ort.OrtValue** out_values
    Py_ssize_t* out_slots          # per output: its position in the session's outputs
    OutputPolicy* out_policy       # per output: where it is written (OutputPolicy)
    PyObject** out_objects         # per output: a reference the run holds to the object it is
                                   # written into (OUT_NEW_ARRAY, OUT_SCRATCH: the array;
                                   # OUT_CALLER: the caller's OrtValue), else NULL
    void* heap


cdef struct RunStack:
    const char* in_names[RUN_STACK_SLOTS]
    ort.OrtValue* in_values[RUN_STACK_SLOTS]
    FeedHold in_hold[RUN_STACK_SLOTS]
    Py_ssize_t in_slots[RUN_STACK_SLOTS]
    PyObject* in_refs[RUN_STACK_SLOTS]
    void* in_data[RUN_STACK_SLOTS]
    PyObject* in_holders[RUN_STACK_SLOTS]
    const char* out_names[RUN_STACK_SLOTS]
    ort.OrtValue* out_values[RUN_STACK_SLOTS]
    Py_ssize_t out_slots[RUN_STACK_SLOTS]
    OutputPolicy out_policy[RUN_STACK_SLOTS]
    PyObject* out_objects[RUN_STACK_SLOTS]


# One call of run_core: the session's C data, how to call onnxruntime, and what the output
# policies need. The caller fills it (see InferenceSession.init_call) and the RunArrays.
cdef struct RunCall:
    ort.OrtSession* session
    ort.OrtRunOptions* options     # the caller's run options, or NULL
    Py_ssize_t n_in                # feeds in the arrays
    Py_ssize_t n_out               # outputs in the arrays
    # the session's feedable inputs (names and ONNX element types), for error messages
    char** input_names
    const int* input_types
    Py_ssize_t n_inputs
    FixedOutput* fixed             # per session output: type and shape of our buffers
    RunLane* lane                  # the run's lane (OUT_SCRATCH, the lane's binding), or NULL
    bint lane_binding              # the lane's IoBinding may run this call (see lane_binding_ready)
    Py_ssize_t n_feedable          # the session's feedable inputs (the lane's size)
    PyObject* spares               # SpareOutputs for OUT_SPARE (borrowed), or NULL
    ort.OrtAllocator* allocator    # OUT_SPARE's allocator when no spare is there
    bint* preallocate              # the caller's flag, cleared when a retry shows our buffers refused
    bint outputs_on_cpu            # OUT_ORT outputs are host memory (described as such)
    # An IoBinding the caller bound (its own, or one made for the call): RunWithBinding on it.
    ort.OrtIoBinding* binding
    bint synchronize               # SynchronizeBoundOutputs after a bound run
    bint flush_denormals           # FTZ and DAZ on the calling thread for the run (fp_env.h)
    bint bound_results             # read the bound outputs back as the results (in out_* order)
    # The binding holds device buffers from an earlier run (OUT_DEVICE): the retry gives it
    # fresh ones through rebind(rebind_owner).
    int (*rebind)(object) except -1
    PyObject* rebind_owner


# Hold feed i of the arrays: an OrtValue of the caller (HOLD_BORROWED: begin_use, a reference).
# Let go of feeds [0, n) as their FeedHold says (lane: the run's lane, for HOLD_CACHED).
# The run: the output policies carried out, the call (Run or RunWithBinding) with the GIL
# released between interruptible_begin and end, the retry rule, error remapping, outputs
# owned and kept alias-safe. Returns the outputs (None where onnxruntime gave none); on
# error, raises with everything the run made released. `owner` is the InferenceSession.
# The retry rule (one for every caller): see the module docstring.
# OrtApi::Run with the GIL released, between interruptible_begin and end_run_call.
# OrtApi::RunWithBinding with the GIL released (then SynchronizeBoundOutputs when asked).
# After a run: Ctrl-C handling (interruptible_end), releasing `status` if that raises.
# A lane with nothing cached yet, for a session of n_feedable feedable inputs and n_out outputs;
# NULL when memory is short (the run goes uncached).
# Release the lane's IoBinding (its bound values with it); nothing is bound afterwards.
# Release what the lane holds (its first n_feedable feed caches, n_out scratch tensors) and it.


# Output i of the arrays: its name, session position and policy, nothing written yet.
cdef inline void set_output(RunArrays* a, Py_ssize_t i, const char* name, Py_ssize_t slot,
                            OutputPolicy policy) noexcept:
    a.out_names[i] = name
    a.out_slots[i] = slot
    a.out_policy[i] = policy
    a.out_values[i] = NULL
    a.out_objects[i] = NULL
# Output i is written into the caller's OrtValue `value` (OUT_CALLER): begin_use, a reference.
# Let go of what the arrays hold for outputs [0, n) (after a failure before run_core).
