# cython: language_level=3
"""The run core that InferenceSession, IOBinding and the agent engine share: a run's C arrays
(RunArrays: on the stack for small runs, one heap block otherwise), OrtApi::Run and
RunWithBinding with the GIL released, the Ctrl-C bookkeeping after a run, and the lanes of a
session's run caches (RunLane, one per concurrent run; see _run_core.pxd)."""

from cpython.object cimport PyObject
from cpython.ref cimport Py_XDECREF
from libc.stdlib cimport malloc, free, calloc

from ortagent cimport _capi as ort
from ortagent._runtime cimport shared_runtime, interruptible_end
from ortagent._tensors cimport FeedView, clear_feed_view

ort.ortagent_rt = shared_runtime()


# ---- a run's C arrays and the calls ------------------------------------------------------------------

cdef int run_arrays_init(RunArrays* arrays, RunStack* stack, Py_ssize_t n_in, Py_ssize_t n_out) except -1:
    arrays.heap = NULL
    if n_in <= RUN_STACK_SLOTS and n_out <= RUN_STACK_SLOTS:
        arrays.in_names = stack.in_names
        arrays.in_values = stack.in_values
        arrays.in_created = stack.in_created
        arrays.in_refs = stack.in_refs
        arrays.in_data = stack.in_data
        arrays.in_holders = stack.in_holders
        arrays.out_names = stack.out_names
        arrays.out_values = stack.out_values
        arrays.out_positions = stack.out_positions
        arrays.out_arrays = stack.out_arrays
        return 0
    # every array holds pointer-sized items: carve them from one block
    cdef size_t n_i = <size_t>max(n_in, 1), n_o = <size_t>max(n_out, 1)
    cdef char** block = <char**>malloc((6 * n_i + 4 * n_o) * sizeof(void*))
    if block == NULL:
        raise MemoryError()
    arrays.heap = block
    arrays.in_names = <const char**>block
    arrays.in_values = <ort.OrtValue**>(block + n_i)
    arrays.in_created = <Py_ssize_t*>(block + 2 * n_i)
    arrays.in_refs = <PyObject**>(block + 3 * n_i)
    arrays.in_data = <void**>(block + 4 * n_i)
    arrays.in_holders = <PyObject**>(block + 5 * n_i)
    arrays.out_names = <const char**>(block + 6 * n_i)
    arrays.out_values = <ort.OrtValue**>(block + 6 * n_i + n_o)
    arrays.out_positions = <Py_ssize_t*>(block + 6 * n_i + 2 * n_o)
    arrays.out_arrays = <PyObject**>(block + 6 * n_i + 3 * n_o)
    return 0


cdef void run_arrays_release(RunArrays* arrays) noexcept:
    free(arrays.heap)
    arrays.heap = NULL


cdef ort.OrtStatus* run_nogil(ort.OrtSession* session, ort.OrtRunOptions* options, RunArrays* arrays,
                              Py_ssize_t n_in, Py_ssize_t n_out) noexcept:
    cdef ort.OrtStatus* status
    with nogil:
        status = ort.Run(session, options, arrays.in_names, <const ort.OrtValue* const*>arrays.in_values,
                         <size_t>n_in, arrays.out_names, <size_t>n_out, arrays.out_values)
    return status


cdef ort.OrtStatus* run_binding_nogil(ort.OrtSession* session, ort.OrtRunOptions* options,
                                      ort.OrtIoBinding* binding, bint synchronize) noexcept:
    cdef ort.OrtStatus* status
    with nogil:
        status = ort.RunWithBinding(session, options, binding)
        if status == NULL and synchronize:
            status = ort.SynchronizeBoundOutputs(binding)
    return status


cdef int end_run_call(ort.OrtRunOptions* used, bint registered, ort.OrtStatus* status) except -1:
    try:
        interruptible_end(used, registered)
    except BaseException:
        if status != NULL:
            ort.ReleaseStatus(status)
        raise
    return 0


# ---- run lanes (see RunLane) -----------------------------------------------------------------------

cdef RunLane* lane_new(Py_ssize_t n_feedable, Py_ssize_t n_out) noexcept:
    """A lane with nothing cached yet; NULL when memory is short (the run goes uncached)."""
    cdef RunLane* lane = <RunLane*>calloc(1, sizeof(RunLane))
    if lane == NULL:
        return NULL
    lane.n_bound_inputs = -1
    lane.feed_keys = <PyObject**>calloc(n_feedable + 1, sizeof(PyObject*))
    lane.feed_key_positions = <Py_ssize_t*>calloc(n_feedable + 1, sizeof(Py_ssize_t))
    lane.feed_views = <FeedView*>calloc(n_feedable + 1, sizeof(FeedView))
    lane.bound_serials = <unsigned long long*>calloc(n_feedable + 1, sizeof(unsigned long long))
    lane.scratch = <ort.OrtValue**>calloc(n_out + 1, sizeof(ort.OrtValue*))
    lane.scratch_data = <void**>calloc(n_out + 1, sizeof(void*))
    lane.bound_outputs = <Py_ssize_t*>calloc(n_out + 1, sizeof(Py_ssize_t))
    if (lane.feed_keys == NULL or lane.feed_key_positions == NULL or lane.feed_views == NULL
            or lane.bound_serials == NULL or lane.scratch == NULL or lane.scratch_data == NULL
            or lane.bound_outputs == NULL):
        lane_free(lane, 0, 0)
        return NULL
    return lane


cdef void lane_drop_binding(RunLane* lane) noexcept:
    if lane.binding != NULL:
        ort.ReleaseIoBinding(lane.binding)
        lane.binding = NULL
    lane.n_bound_inputs = -1


cdef void lane_free(RunLane* lane, Py_ssize_t n_feedable, Py_ssize_t n_out) noexcept:
    """Release what the lane holds (its first n_feedable feed caches, n_out scratch tensors)."""
    cdef Py_ssize_t i
    lane_drop_binding(lane)
    for i in range(n_feedable):
        clear_feed_view(&lane.feed_views[i])
        Py_XDECREF(lane.feed_keys[i])
    for i in range(n_out):
        if lane.scratch[i] != NULL:
            ort.ReleaseValue(lane.scratch[i])
    free(lane.feed_keys)
    free(lane.feed_key_positions)
    free(lane.feed_views)
    free(lane.bound_serials)
    free(lane.scratch)
    free(lane.scratch_data)
    free(lane.bound_outputs)
    free(lane)
