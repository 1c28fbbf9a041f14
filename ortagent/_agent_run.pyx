# cython: language_level=3
"""How the agent engine runs one half of a split graph through the session layer's run core:
OrtApi::Run with the engine's prepared C arrays (and outputs of fixed shape preallocated), or
an OrtIoBinding made for the call when outputs go to devices or caller buffers; plus the checks
of gradient shapes. Nothing here knows about run states: _agent.pyx owns those.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, shared_runtime, interruptible_begin
from ortagent._dtypes cimport tensor_type_name
from ortagent._memory cimport OrtDevice, MEMORY_CPU
from ortagent._tensors cimport tensor_data, tensor_for_feed
from ortagent._values cimport (
    OrtValue, SpareOutputs, wrap_value, keep_aliased_feeds_alive, keep_aliased_feeds_alive_c, bound_output_values,
)
from ortagent._options cimport RunOptions
from ortagent._session cimport InferenceSession, FixedOutput, check_run_status
from ortagent._run_core cimport (
    RunArrays, RunStack, RUN_STACK_SLOTS, run_arrays_init, run_arrays_release, run_nogil, run_binding_nogil,
    end_run_call,
)
from ortagent.errors import OrtInvalidArgument

ort.ortagent_rt = shared_runtime()


cdef bint _all_preallocated(RunArrays* a, list positions) noexcept:
    """Whether _run_hot preallocated every output at `positions` (its flags in out_positions)."""
    cdef Py_ssize_t i
    for i in range(len(positions)):
        if a.out_positions[<Py_ssize_t>positions[i]] == 0:
            return False
    return True


cdef list _run_hot(InferenceSession session, RunArrays* a, Py_ssize_t n_in, Py_ssize_t n_out,
                   const Py_ssize_t* slots, const bint* twice, bint* preallocate,
                   ort.OrtAllocator* allocator, SpareOutputs spares, bint owned):
    """OrtApi::Run of prepared arrays (inputs, their owners in a.in_holders, output names) with
    the GIL released; returns the outputs as OrtValues.

    Outputs whose element type and shape the model fixes (the session's FixedOutput at
    slots[i]) and a run confirmed get a tensor before the run, and onnxruntime writes into it:
    cheaper than onnxruntime allocating the output inside Run. The tensor is the one a caller
    gave back to `spares` for that slot (dropping an earlier run's output), else a new one from
    `allocator` (the pooled CPU allocator); either way it goes back to `spares` when its last
    owner drops it. a.out_positions[i] comes back 1 for those, 0 for the others. Names listed
    twice (twice[i]) are left to onnxruntime. If a run with preallocated outputs fails, it runs
    again without; when that succeeds, the fixed shapes do not hold and `preallocate` goes off.
    A run that does not own the session's caches (`owned` false) preallocates nothing."""
    cdef Py_ssize_t i, n_pre = 0
    cdef FixedOutput* fixed
    cdef ort.OrtStatus* status = NULL
    cdef ort.OrtRunOptions* options = NULL
    cdef bint registered = False
    cdef OrtValue value
    cdef object item
    for i in range(n_out):
        a.out_values[i] = NULL
        a.out_positions[i] = 0
    try:
        if owned and preallocate[0]:
            for i in range(n_out):
                fixed = &session.fixed_outputs[slots[i]]
                if fixed.elem_type >= 0 and fixed.confirmed and (twice == NULL or not twice[i]):
                    a.out_values[i] = spares.take(slots[i])
                    if a.out_values[i] == NULL:
                        check(ort.CreateTensorAsOrtValue(allocator, fixed.dims, <size_t>fixed.ndim,
                                                         <ort.ONNXTensorElementDataType>fixed.elem_type,
                                                         &a.out_values[i]))
                    a.out_positions[i] = 1
                    n_pre += 1
        options = interruptible_begin(NULL, &registered)
        status = run_nogil(session.handle, options, a, n_in, n_out)
        if status != NULL and n_pre > 0:
            ort.ReleaseStatus(status)
            for i in range(n_out):
                if a.out_values[i] != NULL:
                    ort.ReleaseValue(a.out_values[i])
                    a.out_values[i] = NULL
                a.out_positions[i] = 0
            n_pre = 0
            status = run_nogil(session.handle, options, a, n_in, n_out)
            if status == NULL:
                preallocate[0] = False
        # own every output before anything can raise, so none leaks
        outputs = PyList_New(n_out)
        for i in range(n_out):
            item = wrap_value(a.out_values[i], None, session) if a.out_values[i] != NULL else None
            a.out_values[i] = NULL
            if a.out_positions[i] == 1:
                spares.adopt(<OrtValue>item, slots[i])
            Py_INCREF(item)
            PyList_SET_ITEM(outputs, i, item)
        end_run_call(options, registered, status)
        if status != NULL:
            check_run_status(status, session, _names(<char**>a.in_names, n_in),
                             [<object>a.in_holders[i] for i in range(n_in)])
        for i in range(n_out if owned else 0):
            fixed = &session.fixed_outputs[slots[i]]
            if fixed.elem_type >= 0 and not fixed.confirmed and outputs[i] is not None:
                value = outputs[i]
                value.describe_as(MEMORY_CPU)
                session._confirm_fixed_output(fixed, value)
        if n_pre < n_out:       # a preallocated output never shares a feed's memory
            for i in range(n_in):
                a.in_data[i] = tensor_data(a.in_values[i])
            keep_aliased_feeds_alive_c(outputs, a.in_data, a.in_holders, n_in, session, None)
        return outputs
    finally:
        for i in range(n_out):
            if a.out_values[i] != NULL:
                ort.ReleaseValue(a.out_values[i])
                a.out_values[i] = NULL


cdef tuple _shape_of(OrtValue value, bint on_cpu):
    """A tensor's shape as a tuple of ints, without a Python method call."""
    value.describe_as(MEMORY_CPU if on_cpu else -1)
    return tuple([value.dims[i] for i in range(value.ndim)])


cdef bint _gradient_fits(OrtValue gradient, int elem_type, bint full_shape, tuple shape) except -1:
    """Whether a gradient has the element type and the shape (the full one, or one that
    broadcasts to it) its module output asks for; False sends the caller to the explaining path."""
    gradient.describe()
    if gradient.elem_type != elem_type:
        return False
    cdef Py_ssize_t rank = len(shape), i
    cdef int64_t have, want
    if full_shape:
        if gradient.ndim != rank:
            return False
        for i in range(rank):
            if gradient.dims[i] != <int64_t>shape[i]:
                return False
        return True
    if gradient.ndim > rank:
        return False
    for i in range(1, gradient.ndim + 1):
        have = gradient.dims[gradient.ndim - i]
        want = <int64_t>shape[rank - i]
        if have != 1 and have != want:
            return False
    return True


cdef bint _broadcasts_to(object shape, object target):
    if len(shape) > len(target):
        return False
    for have, want in zip(reversed(list(shape)), reversed(list(target))):
        if have != 1 and have != want:
            return False
    return True


cdef int _hold_aliased_inputs(list outputs, ort.OrtValue** in_values, list holders, object session,
                              object preallocated) except -1:
    """Outputs sharing a feed's buffer keep the feed's owner alive (see keep_aliased_feeds_alive);
    outputs written into the caller's own values are left alone."""
    cdef Py_ssize_t n_in = len(holders), j
    cdef void* stack[RUN_STACK_SLOTS]
    cdef void** in_data = stack
    if n_in > RUN_STACK_SLOTS:
        in_data = <void**>malloc(n_in * sizeof(void*))
        if in_data == NULL:
            raise MemoryError()
    try:
        for j in range(n_in):
            in_data[j] = tensor_data(in_values[j])
        skip = None
        if preallocated is not None:
            skip = [type(target) is OrtValue for target in preallocated]
        keep_aliased_feeds_alive(outputs, in_data, n_in, holders, session, skip)
        return 0
    finally:
        if in_data != stack:
            free(in_data)


cdef list _names(char** names, Py_ssize_t count):
    return [names[i].decode() for i in range(count)]


cdef list _run(InferenceSession session, char** input_names, list feeds, int* input_types,
               char** output_names, Py_ssize_t n_out, object preallocated, object run_options):
    """OrtApi::Run over prepared names (the session layer's run core): outputs come back as
    OrtValues on the CPU (or written into the caller's values given in `preallocated`)."""
    cdef Py_ssize_t n_in = len(feeds), i, n_ready = 0
    cdef RunStack stack
    cdef RunArrays a
    cdef ort.OrtRunOptions* run_options_c = NULL
    cdef bint registered = False
    cdef ort.OrtStatus* status
    cdef list keep = []
    cdef list holders = [None] * n_in      # what keeps each feed's memory alive
    cdef list used = []                    # the caller's values this run reads or writes
    cdef Py_ssize_t kept
    if run_options is not None:
        run_options_c = (<RunOptions>run_options).handle
    a.heap = NULL
    session.begin_run(False)
    try:
        run_arrays_init(&a, &stack, n_in, n_out)
        for i in range(n_in):
            a.in_names[i] = input_names[i]
            feed = feeds[i]
            if type(feed) is OrtValue:
                (<OrtValue>feed).begin_use()            # close() waits for this run
                used.append(feed)
                a.in_values[i] = (<OrtValue>feed).handle
                a.in_created[i] = 0
                holders[i] = feed
            else:
                kept = len(keep)
                a.in_values[i] = tensor_for_feed(feed, input_names[i].decode(), input_types[i], keep)
                a.in_created[i] = 1
                holders[i] = keep[len(keep) - 1] if len(keep) > kept else feed
            n_ready += 1
        for i in range(n_out):
            a.out_names[i] = output_names[i]
            a.out_values[i] = NULL
            if preallocated is not None and preallocated[i] is not None \
                    and type(preallocated[i]) is OrtValue:
                (<OrtValue>preallocated[i]).begin_use()
                used.append(preallocated[i])
                a.out_values[i] = (<OrtValue>preallocated[i]).handle
        run_options_c = interruptible_begin(run_options_c, &registered)
        status = run_nogil(session.handle, run_options_c, &a, n_in, n_out)
        results = [None] * n_out
        for i in range(n_out):
            if preallocated is not None and type(preallocated[i]) is OrtValue:
                results[i] = preallocated[i]
            elif a.out_values[i] != NULL:
                results[i] = wrap_value(a.out_values[i], None, session)
        end_run_call(run_options_c, registered, status)
        if status != NULL:
            check_run_status(status, session, _names(input_names, n_in), feeds)
        _hold_aliased_inputs(results, a.in_values, holders, session, preallocated)
        return results
    finally:
        for i in range(n_ready):
            if a.in_created[i]:
                ort.ReleaseValue(a.in_values[i])
        for value in used:
            (<OrtValue>value).end_use()
        run_arrays_release(&a)
        session.end_run(False)


cdef OrtValue _copy_to(OrtValue value, object target):
    """`value` on the device `target` (an OrtDevice: a copy unless it is there already), or
    copied into `target` (an OrtValue)."""
    from ortagent._device import copy
    if isinstance(target, OrtDevice):
        if value.device() == target:
            return value
        destination = OrtValue.ortvalue_from_shape_and_type(value.shape(), value.element_type(), target)
    else:
        destination = target
    copy(value, destination)
    return destination


cdef list _run_bound(InferenceSession session, char** input_names, list feeds, int* input_types,
                     char** output_names, list targets, object run_options):
    """OrtApi::RunWithBinding with a binding made for this call: inputs bound as given, output i
    bound to targets[i] (an OrtDevice: onnxruntime allocates there; an OrtValue: written into).
    A name listed twice is bound once and its value returned for each listing."""
    cdef ort.OrtIoBinding* binding = NULL
    cdef Py_ssize_t i
    cdef ort.OrtRunOptions* run_options_c = NULL
    cdef bint registered = False
    cdef ort.OrtStatus* status
    cdef list created = []
    cdef list bound = []            # the OrtValue bound for each feed
    cdef list used = []             # the caller's values this run reads or writes
    cdef ort.OrtValue* in_stack[RUN_STACK_SLOTS]
    cdef ort.OrtValue** in_values = in_stack
    if run_options is not None:
        run_options_c = (<RunOptions>run_options).handle
    session.begin_run(False)
    try:
        check(ort.CreateIoBinding(session.handle, &binding))
        for i in range(len(feeds)):
            feed = feeds[i]
            if type(feed) is not OrtValue:
                feed = OrtValue.ortvalue_from_numpy(feed)
                if input_types[i] >= 0 and (<OrtValue>feed).element_type() != input_types[i]:
                    raise OrtInvalidArgument(
                        f"input {input_names[i].decode()!r} expects {tensor_type_name(input_types[i])}, "
                        f"got {(<OrtValue>feed).data_type()}")
                created.append(feed)
            (<OrtValue>feed).begin_use()                # close() waits for this run
            used.append(feed)
            check(ort.BindInput(binding, input_names[i], (<OrtValue>feed).handle))
            bound.append(feed)
        # A name listed twice (a module output the backward also reads) is bound once, to the
        # target of its last listing -- the stash's, where onnxruntime produces it, so the stash
        # never leaves the device -- and copied for an earlier listing that wants it elsewhere.
        bound_targets = {}
        for i in range(len(targets)):
            bound_targets[output_names[i]] = targets[i]
        order = list(bound_targets)     # distinct output names, in binding order
        for name in order:
            target = bound_targets[name]
            if isinstance(target, OrtDevice):
                check(ort.BindOutputToDevice(binding, name, (<OrtDevice>target).memory_info()))
            else:
                (<OrtValue>target).begin_use()
                used.append(target)
                check(ort.BindOutput(binding, name, (<OrtValue>target).handle))
        run_options_c = interruptible_begin(run_options_c, &registered)
        status = run_binding_nogil(session.handle, run_options_c, binding, True)
        end_run_call(run_options_c, registered, status)
        if status != NULL:
            check_run_status(status, session, _names(input_names, len(feeds)), feeds)
        by_name = dict(zip(order, bound_output_values(binding, session)))
        if len(bound) > RUN_STACK_SLOTS:
            in_values = <ort.OrtValue**>malloc(len(bound) * sizeof(void*))
            if in_values == NULL:
                raise MemoryError()
        for i in range(len(bound)):
            in_values[i] = (<OrtValue>bound[i]).handle
        for name in order:
            if type(bound_targets[name]) is OrtValue:
                by_name[name] = bound_targets[name]     # written in place: the caller's value
        results = list(by_name.values())
        _hold_aliased_inputs(results, in_values, bound, session, list(bound_targets.values()))
        results = []
        for i in range(len(targets)):
            value = by_name[output_names[i]]
            if targets[i] is not bound_targets[output_names[i]]:
                value = _copy_to(value, targets[i])
            results.append(value)
        return results
    finally:
        if in_values != in_stack:
            free(in_values)
        if binding != NULL:
            ort.ReleaseIoBinding(binding)
        for value in used:
            (<OrtValue>value).end_use()
        session.end_run(False)
