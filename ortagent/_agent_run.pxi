"""How the agent engine runs one half of a split graph through the session layer's run core:
OrtApi::Run with the engine's prepared C arrays (and outputs of fixed shape preallocated), or
an OrtIoBinding made for the call when outputs go to devices or caller buffers; plus the checks
of gradient shapes. Nothing here knows about run states: _agent.pxi owns those.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, shared_runtime
from ortagent.errors import OrtInvalidArgument



cdef bint _all_preallocated(RunArrays* a, list positions) noexcept:
    """Whether _run_hot wrote every output at `positions` into a preallocated tensor (OUT_SPARE)."""
    cdef Py_ssize_t i
    for i in range(len(positions)):
        if a.out_policy[<Py_ssize_t>positions[i]] != OUT_SPARE:
            return False
    return True


cdef list _run_hot(InferenceSession session, RunArrays* a, Py_ssize_t n_in, Py_ssize_t n_out,
                   const Py_ssize_t* slots, const bint* twice, bint* preallocate,
                   ort.OrtAllocator* allocator, SpareOutputs spares, bint owned):
    """The run core over arrays the caller filled and holds (inputs, their owners in
    a.in_holders, output names); returns the outputs as OrtValues.

    Policies: outputs whose element type and shape the model fixes (the session's FixedOutput
    at slots[i]) and a run confirmed are OUT_SPARE: onnxruntime writes into the tensor a caller
    gave back to `spares` for that slot (dropping an earlier run's output), else a new one from
    `allocator` (the pooled CPU allocator); either way it goes back to `spares` when its last
    owner drops it. Names listed twice (twice[i]) and the rest are OUT_ORT. The retry rule may
    turn `preallocate` off (see _run_core). A run that does not own the session's caches
    (`owned` false) preallocates nothing. Afterwards a.out_policy tells which outputs were
    preallocated (_all_preallocated)."""
    cdef Py_ssize_t i
    cdef FixedOutput* fixed
    cdef bint preallocating = owned and preallocate[0]
    cdef RunCall call
    cdef OrtValue value
    for i in range(n_in):
        a.in_hold[i] = HOLD_BY_CALLER           # the engine holds the feeds and lets them go
    for i in range(n_out):
        set_output(a, i, a.out_names[i], slots[i], OUT_ORT)
        if preallocating:
            fixed = &session.fixed_outputs[slots[i]]
            if fixed.elem_type >= 0 and fixed.confirmed and (twice == NULL or not twice[i]):
                a.out_policy[i] = OUT_SPARE
    init_call(&call, session, NULL, n_in, n_out)
    call.spares = <PyObject*>spares
    call.allocator = allocator
    call.preallocate = preallocate
    outputs = run_core(session, &call, a)
    for i in range(n_out if owned else 0):
        fixed = &session.fixed_outputs[slots[i]]
        if fixed.elem_type >= 0 and not fixed.confirmed and outputs[i] is not None:
            value = outputs[i]
            value.describe_as(MEMORY_CPU)
            session._confirm_fixed_output(fixed, value)
    return outputs


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


cdef list _run(InferenceSession session, char** input_names, list feeds, int* input_types,
               char** output_names, Py_ssize_t n_out, object preallocated, object run_options):
    """The run core with OrtApi::Run over prepared names: outputs come back as OrtValues on the
    CPU (OUT_ORT), or written into the caller's values given in `preallocated` (OUT_CALLER)."""
    cdef Py_ssize_t n_in = len(feeds), i, n_ready = 0, n_set = 0
    cdef RunStack stack
    cdef RunArrays a
    cdef RunCall call
    cdef list keep = []
    cdef Py_ssize_t kept
    cdef bint ran = False
    a.heap = NULL
    session.begin_run(False)
    try:
        run_arrays_init(&a, &stack, n_in, n_out)
        for i in range(n_in):
            a.in_names[i] = input_names[i]
            a.in_slots[i] = -1
            feed = feeds[i]
            if type(feed) is OrtValue:
                hold_value(&a, i, feed)
            else:
                kept = len(keep)
                a.in_values[i] = tensor_for_feed(feed, input_names[i].decode(), input_types[i], keep)
                a.in_hold[i] = HOLD_CREATED
                Py_INCREF(feed)
                a.in_refs[i] = <PyObject*>feed
                a.in_holders[i] = <PyObject*>keep[len(keep) - 1] if len(keep) > kept else <PyObject*>feed
            n_ready += 1
        for i in range(n_out):
            set_output(&a, i, output_names[i], -1, OUT_ORT)
            n_set += 1
            if preallocated is not None and type(preallocated[i]) is OrtValue:
                hold_output(&a, i, preallocated[i])
        init_call(&call, session, NULL if run_options is None else (<RunOptions>run_options).handle,
                  n_in, n_out)
        ran = True
        return run_core(session, &call, &a)
    finally:
        if not ran:
            release_outputs(&a, n_set, NULL, NULL)
        release_feeds(&a, n_ready, NULL)
        run_arrays_release(&a)
        session.end_run(False)


cdef OrtValue _copy_to(OrtValue value, object target):
    """`value` on the device `target` (an OrtDevice: a copy unless it is there already), or
    copied into `target` (an OrtValue)."""
    if isinstance(target, OrtDevice):
        if value.device() == target:
            return value
        destination = OrtValue.ortvalue_from_shape_and_type(value.shape(), value.element_type(), target)
    else:
        destination = target
    device_copy(value, destination)
    return destination


cdef list _run_bound(InferenceSession session, char** input_names, list feeds, int* input_types,
                     char** output_names, list targets, object run_options):
    """The run core with a binding made for this call: inputs bound as given, output i bound to
    targets[i] (an OrtDevice: OUT_DEVICE, onnxruntime allocates there; an OrtValue: OUT_CALLER,
    written into). A name listed twice is bound once and its value returned for each listing."""
    cdef ort.OrtIoBinding* binding = NULL
    cdef Py_ssize_t n_in = len(feeds), i, k, n_ready = 0, n_set = 0
    cdef RunStack stack
    cdef RunArrays a
    cdef RunCall call
    cdef bint ran = False
    a.heap = NULL
    session.begin_run(False)
    try:
        # A name listed twice (a module output the backward also reads) is bound once, to the
        # target of its last listing -- the stash's, where onnxruntime produces it, so the stash
        # never leaves the device -- and copied for an earlier listing that wants it elsewhere.
        bound_targets = {}
        for i in range(len(targets)):
            bound_targets[output_names[i]] = targets[i]
        order = list(bound_targets)     # distinct output names, in binding order
        run_arrays_init(&a, &stack, n_in, len(order))
        check(ort.CreateIoBinding(session.handle, &binding))
        for i in range(n_in):
            feed = feeds[i]
            if type(feed) is not OrtValue:
                feed = OrtValue.ortvalue_from_numpy(feed)
                if input_types[i] >= 0 and (<OrtValue>feed).element_type() != input_types[i]:
                    raise OrtInvalidArgument(
                        f"input {input_names[i].decode()!r} expects {tensor_type_name(input_types[i])}, "
                        f"got {(<OrtValue>feed).data_type()}")
            a.in_names[i] = input_names[i]
            a.in_slots[i] = -1
            hold_value(&a, i, feed)
            n_ready += 1
            check(ort.BindInput(binding, input_names[i], a.in_values[i]))
        for k in range(len(order)):
            name = order[k]
            target = bound_targets[name]
            set_output(&a, k, <char*>name, -1, OUT_DEVICE)
            n_set += 1
            if isinstance(target, OrtDevice):
                check(ort.BindOutputToDevice(binding, name, (<OrtDevice>target).memory_info()))
            else:
                hold_output(&a, k, target)
                check(ort.BindOutput(binding, name, a.out_values[k]))
        init_call(&call, session, NULL if run_options is None else (<RunOptions>run_options).handle,
                  n_in, len(order))
        call.binding = binding
        call.synchronize = True
        call.bound_results = True
        ran = True
        by_name = dict(zip(order, run_core(session, &call, &a)))
        results = []
        for i in range(len(targets)):
            value = by_name[output_names[i]]
            if targets[i] is not bound_targets[output_names[i]]:
                value = _copy_to(value, targets[i])
            results.append(value)
        return results
    finally:
        if not ran:
            release_outputs(&a, n_set, NULL, NULL)
        release_feeds(&a, n_ready, NULL)
        run_arrays_release(&a)
        if binding != NULL:
            ort.ReleaseIoBinding(binding)
        session.end_run(False)
