from ortagent cimport _capi as ort


# The phases of one training run (see the diagram in _agent.pxi's docstring).
cdef enum RunPhase:
    PHASE_NEW = 0           # not used yet
    PHASE_FORWARD = 1       # its forward is running
    PHASE_WAITING = 2       # forward done, stash held, backward pending
    PHASE_BACKWARD = 3      # its backward is running
    PHASE_FINISHED = 4      # backward done, forward failed, or released: nothing held


# One run's state machine: the only code that changes `phase`. Each transition moves the phase
# inside a critical section on the state, so two threads can never both claim one run.
cdef class PartialGraphExecutionState:
    cdef object __weakref__
    cdef RunPhase phase
    cdef _AgentEngine engine           # the agent whose forward filled this state
    cdef list gradient_shapes          # shape of the module output of each gradient (checks them)
    cdef list stash                    # OrtValues the backward reads, where ORT produced them
    cdef list backward_inputs          # the caller's graph inputs the backward reads again
    cdef bint keep_stash               # retain(): a backward leaves the run WAITING, stash kept
    cdef public object run_id          # set by the run-id API
    cdef public object binding         # set by the run-id API: where gradients land
    # NEW -> FORWARD, else RunStateError (a state serves one forward).
    cdef int claim_forward(self) except -1
    # FORWARD -> WAITING, with what the backward needs (set before the phase publishes it).
    cdef void publish(self, _AgentEngine engine, list gradient_shapes, list stash,
                      list backward_inputs) noexcept
    # WAITING -> BACKWARD for `engine`'s backward, else RunStateError (the phase unchanged).
    cdef int claim_backward(self, _AgentEngine engine) except -1
    # BACKWARD -> FINISHED: the backward ran; what the run held is dropped. A retained run goes
    # back to WAITING instead, holding its stash for another backward.
    cdef void finish(self) noexcept
    # Undo a claim after a failure: FORWARD -> FINISHED (nothing was published, the state is
    # spent), BACKWARD -> WAITING (the stash is intact: the run stays resumable).
    cdef void abort(self) noexcept
    # The typed "waiting for its backward" query (agent.py and the torch bridge read it).
    cdef bint waiting(self) noexcept
    cdef void _drop(self) noexcept


# Who may preallocate one half's outputs and change its preallocation facts: one run at a time
# claims it (a run that finds it held runs without preallocating). Owned by the engine, per half.
cdef class _Preallocation:
    cdef bint enabled                  # off once a preallocated run failed where a plain one ran
    cdef bint held                     # a run holds it (changed inside a critical section)
    cdef SpareOutputs spares           # preallocated outputs given back, per session output
    cdef list fixed_gradient_shapes    # forward only: gradient shapes shared once all are fixed
    cdef bint claim(self) noexcept
    cdef void give_up(self) noexcept


# Where one backward's outputs go: graph outputs chosen once (the hot path's fetches, a binding's
# bound outputs), with their names and backward-session slots as C arrays.
cdef class _OutputPlan:
    cdef _AgentEngine engine           # owns the names borrowed in `names`
    cdef Py_ssize_t n_out
    cdef char** names                  # borrowed from the engine's graph_output_names
    cdef Py_ssize_t* slots             # backward-session output position of each
    cdef list positions                # graph-output index of each
    cdef list targets                  # None, an OrtDevice or a caller's OrtValue, per output
    cdef bint on_cpu                   # every target is host memory: OrtApi::Run serves it
    cdef bint prepared                 # ... and none is a caller's value: the preallocating run


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
    cdef readonly bint closed                 # the agent's one closed flag (close(): set once)
    # -- C data prepared once for the preallocating run --------------------------------------
    cdef Py_ssize_t* forward_input_pos_c      # graph-input index of each forward input
    cdef Py_ssize_t* backward_input_pos_c     # graph-input index of each graph input the backward reads
    cdef Py_ssize_t* forward_output_slot_c    # session output position of each forward output
    cdef bint* forward_output_twice_c         # that forward output name is listed twice
    cdef ort.OrtAllocator* allocator          # the pooled CPU allocator (_cpu_pool)
    cdef _Preallocation forward_prealloc      # each half's preallocation, claimed per run
    cdef _Preallocation backward_prealloc
    cdef int require_open(self) except -1
    # The forward of a run: claim, run, publish (abort on failure). `targets`: None (every
    # module output where onnxruntime produces it) or one OrtDevice / None per module output.
    cdef list forward_run(self, PartialGraphExecutionState state, list graph_inputs, object run_options,
                          list targets)
    # The backward of a run: claim, run, finish (abort on failure).
    cdef list backward_run(self, PartialGraphExecutionState state, list gradients, _OutputPlan plan,
                           object run_options)
    cdef list run_forward_prepared(self, PartialGraphExecutionState state, list graph_inputs)
    cdef list run_backward_prepared(self, PartialGraphExecutionState state, list gradients,
                                    _OutputPlan plan)
    cdef int check_gradients(self, PartialGraphExecutionState state, list gradients) except -1
    cdef _OutputPlan output_plan(self, list output_positions, list output_targets)


# The state API's entry points (TrainingAgent derives from this class): run_forward and
# run_backward hand the call a training loop makes -- lists in graph order, a
# PartialGraphExecutionState -- straight to the engine, and any other call (reordering names,
# the run-id API, mistakes to explain) to the TrainingAgent's methods (_run_forward /
# _run_backward), which reorder and then call the same engine methods.
cdef class _AgentHotPath:
    cdef _AgentEngine hot_engine              # None: no direct path (set by _enable_hot_path)
    cdef bint hot_forward                     # feeds and fetches need no reordering
    cdef bint hot_backward                    # gradients need no reordering
    cdef Py_ssize_t n_hot_feeds
    cdef list hot_targets                     # None, or the forward's module output targets
    cdef _OutputPlan hot_plan                 # where the backward's fetches go
