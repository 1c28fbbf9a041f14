"""The run core: the one place where InferenceSession.run / run_with_ort_values, IOBinding
and both halves of the TrainingAgent call onnxruntime. Callers fill a RunCall and a run's C
arrays (RunArrays: on the stack for small runs, one heap block otherwise) and call run_core;
they choose, and nothing else, how each feed is held and where each output goes. The lanes of
a session's run caches live here too (RunLane, one per concurrent run; see _run_core_decl.pxi).

The contract:

* Feed holding. Each feed has one FeedHold: HOLD_BORROWED (a caller's OrtValue, marked in use
  so that its close() waits, and referenced), HOLD_CREATED (a tensor made for this run, over an
  array or a converted container), HOLD_CACHED (the lane's feed view of that input) or
  HOLD_BY_CALLER (the caller holds and releases it itself: the agent's hot path). in_refs holds
  a reference to every feed object for as long as the GIL is released, so another thread
  changing the caller's dict or list cannot free memory onnxruntime reads; in_holders names
  what owns each feed's memory (the feed, or its contiguous copy). release_feeds lets go of
  them all, by that one rule, for every caller.
* Output policies. Each output has one OutputPolicy: OUT_ORT (onnxruntime allocates),
  OUT_NEW_ARRAY (a new NumPy array of the fixed type and shape, written through a tensor over
  it), OUT_SCRATCH (the lane's scratch tensor, copied into a new array: small outputs),
  OUT_SPARE (a tensor given back by an earlier run's output, else one from the pool; it goes
  back to the spares when its last owner drops it), OUT_CALLER (the caller's OrtValue, written
  in place and returned as is) and OUT_DEVICE (bound to a device in an IoBinding). run_core
  makes the buffers, runs, and turns each into its result; a failed run releases them.
* One retry rule (retry_wanted). A run that fails with ORT_INVALID_ARGUMENT while onnxruntime
  wrote into buffers of ours (OUT_NEW_ARRAY, OUT_SCRATCH, OUT_SPARE, or device buffers an
  IoBinding kept from an earlier run) runs once more with onnxruntime allocating those outputs
  (the binding's device outputs re-bound): onnxruntime reports an output shape that does not
  fit the buffer given with that code. When the second run succeeds, the declared shapes do
  not hold and the caller's preallocation flag goes off. Any other code (a kernel's failure,
  a terminated run, Ctrl-C) is raised at once, and a caller's own buffers are never retried.
* Interrupts. The call (both runs, if retried) sits between one interruptible_begin and one
  interruptible_end: Ctrl-C on the main thread terminates the run and raises KeyboardInterrupt.
* Error remapping. A failed run raises the ortagent.errors exception of its code; an invalid
  argument where a fed OrtValue has another element type than its input names that input
  (onnxruntime's message does not).
* Alias keep-alive. Outputs onnxruntime allocated may be a feed itself or an alias of it (a
  graph input that is also an output, Identity): such an output keeps the feed's memory owner
  alive and is read-only where the feed was (keep_aliased_feeds_alive_c). Outputs written into
  buffers of ours or the caller's never alias a feed and are left alone.
* Ownership. Every output onnxruntime produced is owned by a Python object before anything can
  raise, so none leaks; everything the run made is released on every path.
"""

cimport cython
from cpython.list cimport PyList_New, PyList_SET_ITEM, PyList_GET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF, Py_XDECREF
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport memset, strcmp

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, shared_runtime, interruptible_begin, interruptible_end
from ortagent.errors import OrtInvalidArgument



# ---- a run's C arrays and the calls ------------------------------------------------------------------

# The arrays of a run that has none (n_in = n_out = 0: an IoBinding's run, everything in the
# binding): zero, and never written, since every loop over them runs zero times.
cdef RunArrays NO_RUN_ARRAYS


cdef int run_arrays_init(RunArrays* arrays, RunStack* stack, Py_ssize_t n_in, Py_ssize_t n_out) except -1:
    arrays.heap = NULL
    if n_in <= RUN_STACK_SLOTS and n_out <= RUN_STACK_SLOTS:
        arrays.in_names = stack.in_names
        arrays.in_values = stack.in_values
        arrays.in_hold = stack.in_hold
        arrays.in_slots = stack.in_slots
        arrays.in_refs = stack.in_refs
        arrays.in_data = stack.in_data
        arrays.in_holders = stack.in_holders
        arrays.out_names = stack.out_names
        arrays.out_values = stack.out_values
        arrays.out_slots = stack.out_slots
        arrays.out_policy = stack.out_policy
        arrays.out_objects = stack.out_objects
        return 0
    # every item fits in a pointer's size (the enums too): carve them from one block
    cdef size_t n_i = <size_t>max(n_in, 1), n_o = <size_t>max(n_out, 1)
    cdef char** block = <char**>malloc((7 * n_i + 5 * n_o) * sizeof(void*))
    if block == NULL:
        raise MemoryError()
    arrays.heap = block
    arrays.in_names = <const char**>block
    arrays.in_values = <ort.OrtValue**>(block + n_i)
    arrays.in_hold = <FeedHold*>(block + 2 * n_i)
    arrays.in_slots = <Py_ssize_t*>(block + 3 * n_i)
    arrays.in_refs = <PyObject**>(block + 4 * n_i)
    arrays.in_data = <void**>(block + 5 * n_i)
    arrays.in_holders = <PyObject**>(block + 6 * n_i)
    arrays.out_names = <const char**>(block + 7 * n_i)
    arrays.out_values = <ort.OrtValue**>(block + 7 * n_i + n_o)
    arrays.out_slots = <Py_ssize_t*>(block + 7 * n_i + 2 * n_o)
    arrays.out_policy = <OutputPolicy*>(block + 7 * n_i + 3 * n_o)
    arrays.out_objects = <PyObject**>(block + 7 * n_i + 4 * n_o)
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


# ---- feeds and outputs held by a run ---------------------------------------------------------------

cdef int hold_value(RunArrays* a, Py_ssize_t i, object value) except -1:
    (<OrtValue>value).begin_use()               # close() waits for this run
    Py_INCREF(value)
    a.in_refs[i] = <PyObject*>value
    a.in_holders[i] = <PyObject*>value
    a.in_values[i] = (<OrtValue>value).handle
    a.in_hold[i] = HOLD_BORROWED
    return 0


cdef void release_feeds(RunArrays* a, Py_ssize_t n, RunLane* lane) noexcept:
    cdef Py_ssize_t i
    cdef FeedHold hold
    for i in range(n):
        hold = a.in_hold[i]
        if hold == HOLD_BY_CALLER:
            continue
        if hold == HOLD_CREATED:
            ort.ReleaseValue(a.in_values[i])
        elif hold == HOLD_CACHED:
            release_feed_view(&lane.feed_views[a.in_slots[i]])
        else:                                   # HOLD_BORROWED: the caller's OrtValue
            (<OrtValue>a.in_refs[i]).end_use()
        Py_XDECREF(a.in_refs[i])
        a.in_refs[i] = NULL


cdef int hold_output(RunArrays* a, Py_ssize_t i, object value) except -1:
    (<OrtValue>value).begin_use()
    Py_INCREF(value)
    a.out_objects[i] = <PyObject*>value
    a.out_values[i] = (<OrtValue>value).handle
    a.out_policy[i] = OUT_CALLER
    return 0


cdef void _give_back_spare(PyObject* spares, Py_ssize_t slot, ort.OrtValue* handle) noexcept:
    if spares == NULL or not (<SpareOutputs>spares).give_back(slot, handle):
        ort.ReleaseValue(handle)


cdef void release_outputs(RunArrays* a, Py_ssize_t n, RunLane* lane, PyObject* spares) noexcept:
    cdef Py_ssize_t i
    cdef OutputPolicy policy
    for i in range(n):
        policy = a.out_policy[i]
        if a.out_values[i] != NULL:
            if policy == OUT_SPARE:
                _give_back_spare(spares, a.out_slots[i], a.out_values[i])
            elif policy == OUT_ORT or policy == OUT_NEW_ARRAY or policy == OUT_DEVICE:
                ort.ReleaseValue(a.out_values[i])
            # OUT_SCRATCH: the lane's; OUT_CALLER: the caller's
            a.out_values[i] = NULL
        if a.out_objects[i] != NULL:
            if policy == OUT_CALLER:
                (<OrtValue>a.out_objects[i]).end_use()
            Py_DECREF(<object>a.out_objects[i])
            a.out_objects[i] = NULL


cdef Py_ssize_t _prepare_outputs(RunCall* c, RunArrays* a) except -1:
    """Make the buffers of our own policies (OUT_NEW_ARRAY, OUT_SCRATCH, OUT_SPARE); returns
    how many outputs onnxruntime writes into a buffer of ours."""
    cdef Py_ssize_t i, slot, n_ours = 0
    cdef FixedOutput* fixed
    cdef OutputPolicy policy
    cdef ort.OrtAllocator* allocator = NULL
    for i in range(c.n_out):
        policy = a.out_policy[i]
        if policy == OUT_ORT or policy == OUT_CALLER or policy == OUT_DEVICE:
            continue
        slot = a.out_slots[i]
        fixed = &c.fixed[slot]
        if policy == OUT_SCRATCH:
            if c.lane.scratch[slot] == NULL:
                check(ort.GetAllocatorWithDefaultOptions(&allocator))
                check(ort.CreateTensorAsOrtValue(allocator, fixed.dims, <size_t>fixed.ndim,
                                                 <ort.ONNXTensorElementDataType>fixed.elem_type,
                                                 &c.lane.scratch[slot]))
                check(ort.GetTensorMutableData(c.lane.scratch[slot], &c.lane.scratch_data[slot]))
            a.out_values[i] = c.lane.scratch[slot]
        elif policy == OUT_NEW_ARRAY:
            array = new_output_array(fixed.elem_type, fixed.ndim, fixed.dims, &a.out_values[i])
            Py_INCREF(array)
            a.out_objects[i] = <PyObject*>array
        else:                                   # OUT_SPARE
            if c.spares != NULL:
                a.out_values[i] = (<SpareOutputs>c.spares).take(slot)
            if a.out_values[i] == NULL:
                check(ort.CreateTensorAsOrtValue(c.allocator, fixed.dims, <size_t>fixed.ndim,
                                                 <ort.ONNXTensorElementDataType>fixed.elem_type,
                                                 &a.out_values[i]))
        n_ours += 1
    return n_ours


cdef void _drop_ours(RunCall* c, RunArrays* a) noexcept:
    """Before the retry: release the buffers of our own policies; onnxruntime allocates those
    outputs now (OUT_ORT)."""
    cdef Py_ssize_t i
    cdef OutputPolicy policy
    for i in range(c.n_out):
        policy = a.out_policy[i]
        if policy == OUT_NEW_ARRAY:
            ort.ReleaseValue(a.out_values[i])
            Py_XDECREF(a.out_objects[i])
            a.out_objects[i] = NULL
        elif policy == OUT_SPARE:
            _give_back_spare(c.spares, a.out_slots[i], a.out_values[i])
        elif policy != OUT_SCRATCH:
            continue
        a.out_values[i] = NULL
        a.out_policy[i] = OUT_ORT


# ---- the run ---------------------------------------------------------------------------------------

cdef bint retry_wanted(ort.OrtStatus* status, Py_ssize_t n_ours, bint kept_device) noexcept:
    """The one retry rule (module docstring): onnxruntime refused a buffer of ours."""
    return (status != NULL and (n_ours > 0 or kept_device)
            and ort.GetErrorCode(status) == ort.ORT_INVALID_ARGUMENT)


cdef ort.OrtStatus* _call(RunCall* c, RunArrays* a, ort.OrtRunOptions* options, bint lane_bound) noexcept:
    cdef unsigned int before
    cdef ort.OrtStatus* status
    if not c.flush_denormals:
        return _call_here(c, a, options, lane_bound)
    before = ortagent_flush_denormals_begin()
    status = _call_here(c, a, options, lane_bound)
    ortagent_flush_denormals_end(before)
    return status


cdef ort.OrtStatus* _call_here(RunCall* c, RunArrays* a, ort.OrtRunOptions* options, bint lane_bound) noexcept:
    cdef ort.OrtStatus* status
    if lane_bound:
        status = run_binding_nogil(c.session, options, c.lane.binding, False)
        if status != NULL:
            c.lane.n_bound_inputs = -1          # bind afresh next time
        return status
    if c.binding != NULL:
        return run_binding_nogil(c.session, options, c.binding, c.synchronize)
    return run_nogil(c.session, options, a, c.n_in, c.n_out)


cdef bint _lane_binding_ready(RunCall* c, RunArrays* a) except -1:
    """Whether RunWithBinding on the lane's binding runs exactly this run: in sync when it
    holds this run's feed-view tensors (same positions, same serials) and scratch outputs
    (same positions, same order). Out of sync, an eligible run binds afresh: every feed a
    feed view's tensor (HOLD_CACHED) and every output a scratch tensor (OUT_SCRATCH). Binding
    stops for good when a bind fails or binds stop paying (more than one bind per four bound
    runs: a caller changing arrays or output names from call to call)."""
    cdef RunLane* lane = c.lane
    cdef Py_ssize_t i, position, n_in = c.n_in, n_out = c.n_out
    cdef bint in_sync = n_in == lane.n_bound_inputs and n_out == lane.n_bound_outputs
    for i in range(n_in):
        if a.in_hold[i] != HOLD_CACHED:
            return False
        position = a.in_slots[i]
        if lane.bound_serials[position] != lane.feed_views[position].serial:
            in_sync = False
    for i in range(n_out):
        if a.out_policy[i] != OUT_SCRATCH:
            return False
        if in_sync and lane.bound_outputs[i] != a.out_slots[i]:
            in_sync = False
    if in_sync:
        lane.n_bound_runs += 1
        return True
    if lane.binding_refused:
        return False
    if lane.n_binds >= 4 and lane.n_binds * 4 > lane.n_bound_runs:
        lane.binding_refused = True
        lane_drop_binding(lane)
        return False
    cdef ort.OrtStatus* status = NULL
    lane.n_bound_inputs = -1
    if lane.binding == NULL:
        status = ort.CreateIoBinding(c.session, &lane.binding)
    else:
        ort.ClearBoundInputs(lane.binding)
        ort.ClearBoundOutputs(lane.binding)
    memset(lane.bound_serials, 0, <size_t>c.n_feedable * sizeof(unsigned long long))
    i = 0
    while status == NULL and i < n_in:
        status = ort.BindInput(lane.binding, a.in_names[i], a.in_values[i])
        position = a.in_slots[i]
        lane.bound_serials[position] = lane.feed_views[position].serial
        i += 1
    i = 0
    while status == NULL and i < n_out:
        status = ort.BindOutput(lane.binding, a.out_names[i], a.out_values[i])
        lane.bound_outputs[i] = a.out_slots[i]
        i += 1
    if status != NULL:
        ort.ReleaseStatus(status)
        lane.binding_refused = True
        lane_drop_binding(lane)
        return False
    lane.n_binds += 1
    lane.n_bound_runs += 1
    lane.n_bound_inputs = n_in
    lane.n_bound_outputs = n_out
    return True


cdef inline void _list_replace(list items, Py_ssize_t i, object item) noexcept:
    """items[i] = item for an index known to be in range."""
    cdef PyObject* old = PyList_GET_ITEM(items, i)
    Py_INCREF(item)
    PyList_SET_ITEM(items, i, item)
    Py_XDECREF(old)


cdef int _keep_aliases(object owner, RunCall* c, RunArrays* a, list outputs) except -1:
    cdef Py_ssize_t i
    for i in range(c.n_in):
        a.in_data[i] = tensor_data(a.in_values[i])
    return keep_aliased_feeds_alive_c(outputs, a.in_data, a.in_holders, c.n_in, owner, None)


cdef list _collect(object owner, RunCall* c, RunArrays* a, bint ok):
    """Own every output onnxruntime produced (before anything can raise); on success, the
    results of every policy, aliases of feeds kept alive."""
    cdef Py_ssize_t i, slot, n_out = c.n_out, n_ort = 0
    cdef OutputPolicy policy
    cdef FixedOutput* fixed
    cdef object item
    cdef list results
    if c.bound_results:
        if not ok:
            return None
        results = bound_output_values(c.binding, owner)
        for i in range(n_out):
            if a.out_policy[i] == OUT_CALLER:
                _list_replace(results, i, None)
        _keep_aliases(owner, c, a, results)
        for i in range(n_out):
            if a.out_policy[i] == OUT_CALLER:
                _list_replace(results, i, <object>a.out_objects[i])
        return results
    results = PyList_New(n_out)
    for i in range(n_out):
        policy = a.out_policy[i]
        item = None
        if (policy == OUT_ORT or policy == OUT_SPARE) and a.out_values[i] != NULL:
            item = wrap_value(a.out_values[i], None, owner)
            a.out_values[i] = NULL
            if policy == OUT_SPARE:
                (<SpareOutputs>c.spares).adopt(<OrtValue>item, a.out_slots[i])
            else:
                n_ort += 1
        Py_INCREF(item)
        PyList_SET_ITEM(results, i, item)
    if not ok:
        return results
    if c.outputs_on_cpu and n_ort > 0:
        for i in range(n_out):
            if a.out_policy[i] == OUT_ORT and results[i] is not None:
                (<OrtValue>results[i]).describe_as(MEMORY_CPU)
    if n_ort > 0 and c.n_in > 0:        # buffers of ours or the caller's never alias a feed
        _keep_aliases(owner, c, a, results)
    if n_ort < n_out:
        for i in range(n_out):
            policy = a.out_policy[i]
            if policy == OUT_NEW_ARRAY or policy == OUT_CALLER:
                _list_replace(results, i, <object>a.out_objects[i])
            elif policy == OUT_SCRATCH:
                slot = a.out_slots[i]
                fixed = &c.fixed[slot]
                a.out_values[i] = NULL
                _list_replace(results, i, new_array_from(fixed.elem_type, fixed.ndim, fixed.dims,
                                                         c.lane.scratch_data[slot], fixed.nbytes))
    return results


cdef int _raise_run_error(ort.OrtStatus* status, RunCall* c, RunArrays* a) except -1:
    """check(status); where onnxruntime refuses a fed OrtValue's element type without naming
    the input, raise naming it."""
    cdef Py_ssize_t i, j
    cdef OrtValue value
    cdef int expected
    try:
        check(status)
    except OrtInvalidArgument as exc:
        for i in range(c.n_in):
            if a.in_holders[i] == NULL or type(<object>a.in_holders[i]) is not OrtValue:
                continue
            expected = -1
            for j in range(c.n_inputs):
                if strcmp(c.input_names[j], a.in_names[i]) == 0:
                    expected = c.input_types[j]
                    break
            value = <OrtValue>a.in_holders[i]
            value.describe()
            if expected >= 0 and value.is_tensor_value and value.elem_type != expected:
                name = a.in_names[i].decode()
                raise OrtInvalidArgument(f"input {name!r} expects {tensor_type_name(expected)}, got an "
                                         f"OrtValue of {tensor_type_name(value.elem_type)}") from exc
        raise
    return 0


cdef list run_core(object owner, RunCall* c, RunArrays* a):
    cdef Py_ssize_t n_ours = 0
    cdef ort.OrtStatus* status = NULL
    cdef ort.OrtRunOptions* used = NULL
    cdef bint registered = False, lane_bound = False
    cdef list results
    try:
        if c.binding == NULL:
            n_ours = _prepare_outputs(c, a)
            lane_bound = c.lane_binding and n_ours == c.n_out and _lane_binding_ready(c, a)
        used = interruptible_begin(c.options, &registered)
        try:
            status = _call(c, a, used, lane_bound)
            if retry_wanted(status, n_ours, c.rebind != NULL):
                ort.ReleaseStatus(status)
                status = NULL
                if c.rebind != NULL:
                    c.rebind(<object>c.rebind_owner)
                else:
                    _drop_ours(c, a)
                    lane_bound = False
                status = _call(c, a, used, lane_bound)
                if status == NULL and c.preallocate != NULL:
                    with cython.critical_section(owner):    # runs of other lanes read it
                        c.preallocate[0] = False
            if c.binding != NULL and not c.bound_results:
                results = None                  # all is in the binding: nothing to collect
            else:
                results = _collect(owner, c, a, status == NULL)
        except BaseException:
            end_run_call(used, registered, status)      # releases status if it raises
            if status != NULL:
                ort.ReleaseStatus(status)
            raise
        end_run_call(used, registered, status)
        if status != NULL:
            _raise_run_error(status, c, a)
        return results
    finally:
        release_outputs(a, c.n_out, c.lane, c.spares)


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
