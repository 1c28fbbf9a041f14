# cython: language_level=3
from ortagent cimport _capi as ort
from ortagent._session cimport InferenceSession, FixedOutput
from ortagent._values cimport SpareOutputs


cdef class PartialGraphExecutionState:
    cdef object __weakref__
    cdef int phase                     # RunPhase
    cdef _AgentEngine engine           # the agent whose forward filled this state
    cdef list gradient_shapes          # shape of the module output of each gradient (checks them)
    cdef list stash                    # OrtValues the backward reads, where ORT produced them
    cdef list backward_inputs          # the caller's graph inputs the backward reads again
    cdef public object run_id          # set by the run-id API
    cdef public object binding         # set by the run-id API: where gradients land
    cdef void drop(self) noexcept
    # Move from phase `expected` to `new` atomically (a critical section on the state); returns
    # the phase found, so the move happened only when that is `expected`.
    cdef int move(self, int expected, int new) noexcept


cdef class _AgentEngine:
    cdef object __weakref__
    cdef readonly object split
    cdef readonly InferenceSession forward_session
    cdef readonly InferenceSession backward_session
    cdef Py_ssize_t n_graph_inputs
    cdef Py_ssize_t n_forward_inputs
    cdef Py_ssize_t n_module_outputs
    cdef Py_ssize_t n_stash
    cdef Py_ssize_t n_gradients
    cdef Py_ssize_t n_backward_graph_inputs
    cdef Py_ssize_t n_graph_outputs
    # names encoded once, owned here
    cdef char** forward_input_names
    cdef char** forward_output_names   # module outputs, then the stash
    cdef char** backward_input_names   # gradients, stash, graph inputs
    cdef char** graph_output_names
    cdef int* forward_input_types
    cdef int* backward_graph_input_types
    cdef int* backward_feed_types      # gradients, stash (-1: unchecked), graph inputs
    cdef list forward_input_positions  # graph-input index of each forward input
    cdef list backward_input_positions # graph-input index of each graph input the backward reads
    cdef list gradient_types
    cdef list gradient_output_positions  # module output index of each gradient
    cdef list gradient_output_names      # ... and its name (for messages)
    cdef list gradient_full_shape
    cdef readonly dict graph_output_index
    cdef readonly bint cpu_only
    cdef readonly list forward_output_devices   # where ORT produces each forward output
    cdef readonly list graph_output_devices     # where ORT produces each graph output
    cdef bint closed
    # -- the state API's hot path (forward_hot / backward_hot): C data prepared once ------------
    cdef Py_ssize_t* forward_input_pos_c      # graph-input index of each forward input
    cdef Py_ssize_t* backward_input_pos_c     # graph-input index of each graph input the backward reads
    cdef Py_ssize_t* forward_output_slot_c    # session output position of each forward output
    cdef bint* forward_output_twice_c         # that forward output name is listed twice
    cdef bint prealloc_forward                # off once a preallocated forward failed where a plain one ran
    cdef bint prealloc_backward
    cdef list fixed_gradient_shapes           # gradient_shapes shared by every run once all are fixed
    cdef ort.OrtAllocator* allocator          # the pooled CPU allocator (_cpu_pool)
    cdef SpareOutputs forward_spares          # preallocated outputs given back, per session output
    cdef SpareOutputs backward_spares
    cdef int require_open(self) except -1
    cdef int forward_hot(self, PartialGraphExecutionState state, list graph_inputs, list fetches) except -1
    cdef int backward_hot(self, PartialGraphExecutionState state, list gradients, list fetches,
                          char** output_names, Py_ssize_t* output_slots, Py_ssize_t n_out) except -1
    cpdef list forward(self, PartialGraphExecutionState state, list graph_inputs, object run_options,
                      list module_output_targets)
    cdef int check_gradients(self, PartialGraphExecutionState state, list gradients) except -1
    cpdef list backward(self, PartialGraphExecutionState state, list gradients, list output_positions,
                       list output_targets, object run_options)


# The state API's entry points (TrainingAgent derives from this class): run_forward and
# run_backward take the hot path in C when the call is the common one -- list feeds in graph
# order, OrtValues, a fresh PartialGraphExecutionState, every output on the CPU -- and hand any
# other call to the TrainingAgent's general methods (_run_forward / _run_backward).
cdef class _AgentHotPath:
    cdef _AgentEngine hot_engine              # None: no hot path (set by _enable_hot_path)
    cdef bint hot_forward
    cdef bint hot_backward
    cdef Py_ssize_t n_hot_feeds
    cdef Py_ssize_t n_hot_outputs
    cdef char** hot_output_names              # borrowed from the engine's graph_output_names
    cdef Py_ssize_t* hot_output_slots         # backward-session output position of each fetch
