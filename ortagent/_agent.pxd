# cython: language_level=3
from ortagent._session cimport InferenceSession


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
    cdef int require_open(self) except -1
    cpdef list forward(self, PartialGraphExecutionState state, list graph_inputs, object run_options,
                      list module_output_targets)
    cdef int check_gradients(self, PartialGraphExecutionState state, list gradients) except -1
    cpdef list backward(self, PartialGraphExecutionState state, list gradients, list output_positions,
                       list output_targets, object run_options)
