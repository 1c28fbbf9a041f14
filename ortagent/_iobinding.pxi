"""IOBinding: inputs and outputs bound to a session once and reused across runs, with the
names and behaviour of onnxruntime's IOBinding. A run goes through the run core (_run_core.run_core,
with this binding and its retry rule); InferenceSession.run_with_iobinding calls run_in here.
"""

cimport cython
from cpython.object cimport PyObject
from libc.stdlib cimport malloc, free

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, shared_runtime, live_handle_counts, count_add, interruptible_begin, HANDLE_IO_BINDING, encode_text,
)
from ortagent.errors import OrtInvalidArgument, OrtInvalidType, ObjectClosedError



# ---- IOBinding -----------------------------------------------------------------------------------

_SYNC_DISABLED_KEY = "disable_synchronize_execution_providers"


cdef bint _disables_sync(object run_options):
    return (run_options is not None
            and (<RunOptions>run_options)._config_entries.get(_SYNC_DISABLED_KEY) == "1")


cdef int _rebind_device_outputs(object binding) except -1:
    """The run core's retry for an IOBinding: fresh buffers for the outputs bound to devices."""
    (<IOBinding>binding).rebind_device_outputs(True)
    return 0


@cython.final
cdef class _BoundOutput:
    """One output binding: to a device (ORT allocates; `device` set) or to a given value
    (the caller's buffer; `value` set)."""


@cython.final
@cython.no_gc_clear          # __dealloc__ releases the binding before its session goes
cdef class IOBinding(SessionBinding):
    """Inputs and outputs bound to a session once and reused across runs
    (onnxruntime.IOBinding's names and behaviour).

    Safe by default: onnxruntime keeps the buffer it allocated for an output bound to a device
    and, in the next run, overwrites it (same shape) or fails (another shape). ortagent re-binds
    such outputs before every run, so values returned by :meth:`get_outputs` are never changed
    by a later run and output shapes may vary from run to run. Pass
    ``reuse_output_buffers=True`` to ``session.io_binding()`` for onnxruntime's behaviour: the
    same buffers are written run after run (values handed out change with each run, and the
    output shapes must stay the same).
    """

    def __cinit__(self):
        self.bound_inputs = {}
        self.bound_outputs = []
        self.bound_values = ()

    def __init__(self, session, bint reuse_output_buffers=False):
        if not isinstance(session, InferenceSession):
            raise OrtInvalidType(f"IOBinding needs an ortagent.InferenceSession, got {type(session).__name__}")
        (<InferenceSession>session).require_open()
        check(ort.CreateIoBinding((<InferenceSession>session).handle, &self.handle))
        count_add(&_live[<int>HANDLE_IO_BINDING], 1)
        self.session = session
        self.reuse_output_buffers = reuse_output_buffers

    def __dealloc__(self):
        self._release_handle()

    cdef void _release_handle(self) noexcept:
        # Taken in a critical section: of close() and the end of a run on two threads, one
        # releases.
        cdef ort.OrtIoBinding* handle
        with cython.critical_section(self):
            handle = self.handle
            self.handle = NULL
        if handle != NULL:
            ort.ReleaseIoBinding(handle)
            count_add(&_live[<int>HANDLE_IO_BINDING], -1)

    cdef int require_open(self) except -1:
        if self.handle == NULL or self.close_pending:
            raise ObjectClosedError("this IOBinding has been closed")
        self.session.require_open()
        return 0

    cdef int _bindings_changed(self) except -1:
        """Rebuild the tuple of values bound now (what a run marks in use)."""
        values = list(self.bound_inputs.values())
        for item in self.bound_outputs:
            if (<_BoundOutput>item).value is not None:
                values.append((<_BoundOutput>item).value)
        values = tuple(values)
        with cython.critical_section(self):     # begin_run reads it in one
            self.bound_values = values
        return 0

    cdef tuple begin_run(self):
        """A run starts: the binding and every value bound to it stay alive until end_run
        (close() of either waits); a value closed since it was bound is an ObjectClosedError.
        Returns the values marked (a binding changed by another thread meanwhile does not
        change what this run releases)."""
        cdef tuple used
        with cython.critical_section(self):
            used = self.bound_values
        cdef Py_ssize_t i, n = len(used)
        for i in range(n):
            try:
                (<OrtValue>used[i]).begin_use()
            except BaseException:
                while i > 0:
                    i -= 1
                    (<OrtValue>used[i]).end_use()
                raise
        with cython.critical_section(self):
            self.runs_in_flight += 1
        return used

    cdef void end_run(self, tuple used) noexcept:
        cdef bint closing
        for item in used:
            (<OrtValue>item).end_use()
        with cython.critical_section(self):
            self.runs_in_flight -= 1
            closing = self.close_pending and self.runs_in_flight == 0
        if closing:
            self._release()

    cdef void _release(self) noexcept:
        self._release_handle()
        with cython.critical_section(self):
            self.bound_inputs = {}
            self.bound_outputs = []
            self.bound_values = ()

    def close(self):
        """Release the binding and the values it keeps alive. A run using the binding on
        another thread finishes first."""
        cdef bint closing
        with cython.critical_section(self):
            self.close_pending = True
            closing = self.runs_in_flight == 0
        if closing:
            self._release()

    cdef bytes _input_name(self, object name):
        if name not in self.session.input_index:
            raise OrtInvalidArgument(
                f"unknown input name {name!r}; the model's inputs are {list(self.session.input_index)}")
        return encode_text(name, "input name")

    cdef bytes _output_name(self, object name):
        if name not in self.session.output_index:
            raise OrtInvalidArgument(
                f"unknown output name {name!r}; the model's outputs are {list(self.session.output_index)}")
        return encode_text(name, "output name")

    # -- inputs ------------------------------------------------------------------------------------

    def bind_ortvalue_input(self, name, value):
        """Bind an OrtValue as input `name` (kept alive by this binding)."""
        self.require_open()
        require_ort_value(value, f"input {name!r}")
        cdef OrtValue v = value
        v.require_handle()
        encoded = self._input_name(name)
        expected = self.session.input_elem_types[<Py_ssize_t>self.session.input_index[name]]
        v.describe()
        if not v.is_tensor_value:
            check_feedable(v, name)
        if expected >= 0 and v.elem_type != expected:
            raise OrtInvalidArgument(f"input {name!r} expects {tensor_type_name(expected)}, got a value of "
                                     f"{tensor_type_name(v.elem_type)}")
        check(ort.BindInput(self.handle, encoded, v.handle))
        self.bound_inputs[name] = value
        self._bindings_changed()
        self.inputs_verified = False
        self.outputs_stale = True

    def bind_cpu_input(self, name, arr_on_cpu):
        """Bind a NumPy array as input `name` without copying it (a contiguous copy when needed)."""
        self.require_open()
        self.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(arr_on_cpu))

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        """Bind memory at `buffer_ptr` on a device (e.g. a torch or cupy tensor's data pointer) as
        input `name`. The caller keeps the memory alive while the binding uses it."""
        self.require_open()
        if buffer_ptr == 0:
            raise OrtInvalidArgument(f"input {name!r}: buffer_ptr must not be 0")
        value = OrtValue._from_pointer(buffer_ptr, shape, element_type, device_type, device_id)
        self.bind_ortvalue_input(name, value)

    def clear_binding_inputs(self):
        self.require_open()
        ort.ClearBoundInputs(self.handle)
        self.bound_inputs = {}
        self._bindings_changed()
        self.inputs_verified = False
        self.outputs_stale = True

    # -- outputs -----------------------------------------------------------------------------------

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None):
        """Bind output `name` to a device (onnxruntime allocates it there) or, with
        `element_type`, `shape` and `buffer_ptr`, to caller memory that each run writes into."""
        self.require_open()
        encoded = self._output_name(name)
        cdef _BoundOutput bound = _BoundOutput.__new__(_BoundOutput)
        bound.name = encoded
        target = output_target(name, device_type, device_id, element_type, shape, buffer_ptr)
        if isinstance(target, OrtDevice):
            check(ort.BindOutputToDevice(self.handle, encoded, (<OrtDevice>target).memory_info()))
            bound.device = target
        else:
            value = target
            self._check_output_type(name, value)
            check(ort.BindOutput(self.handle, encoded, (<OrtValue>value).handle))
            bound.value = value
        self._remember_output(bound)

    def bind_ortvalue_output(self, name, value):
        """Bind an OrtValue as output `name`: each run writes into its buffer."""
        self.require_open()
        require_ort_value(value, f"output {name!r}")
        cdef OrtValue v = value
        v.require_handle()
        encoded = self._output_name(name)
        if v.readonly:
            raise OrtInvalidArgument(f"output {name!r}: the value views read-only memory")
        self._check_output_type(name, v)
        check(ort.BindOutput(self.handle, encoded, v.handle))
        cdef _BoundOutput bound = _BoundOutput.__new__(_BoundOutput)
        bound.name = encoded
        bound.value = value
        self._remember_output(bound)

    cdef int _check_output_type(self, object name, OrtValue value) except -1:
        """A caller's buffer must have the output's element type (onnxruntime's own error does not
        name the output)."""
        declared = self.session._outputs_meta[<Py_ssize_t>self.session.output_index[name]].type
        value.describe()
        given = tensor_type_name(value.elem_type)
        if declared.startswith("tensor(") and given != declared:
            raise OrtInvalidArgument(f"output {name!r} is {declared}, got a value of {given}")
        return 0

    cdef _remember_output(self, _BoundOutput bound):
        for i, existing in enumerate(self.bound_outputs):
            if (<_BoundOutput>existing).name == bound.name:
                self.bound_outputs[i] = bound
                self._bindings_changed()
                return
        self.bound_outputs.append(bound)
        self._bindings_changed()

    def clear_binding_outputs(self):
        self.require_open()
        ort.ClearBoundOutputs(self.handle)
        self.bound_outputs = []
        self._bindings_changed()

    cdef bint has_device_outputs(self):
        for item in self.bound_outputs:
            if (<_BoundOutput>item).device is not None:
                return True
        return False

    cdef bint rebind_device_outputs(self, bint always) except -1:
        """Before a run: give the outputs bound to a device fresh buffers when values were
        handed out since the last run (so a run never changes them: the IoBinding overwrite trap)
        or inputs were bound again (their shapes may differ); `always` forces it. Returns whether
        it re-bound."""
        cdef _BoundOutput bound
        if self.reuse_output_buffers or not (always or self.outputs_stale):
            return False
        for item in self.bound_outputs:
            bound = <_BoundOutput>item
            if bound.device is not None:
                check(ort.BindOutputToDevice(self.handle, bound.name,
                                             (<OrtDevice>bound.device).memory_info()))
        self.outputs_stale = False
        return True

    # -- running ---------------------------------------------------------------------------------

    cdef int run_in(self, InferenceSession session, object run_options) except -1:
        """session.run_with_iobinding(self, run_options): the run, GIL released."""
        cdef IOBinding bound = self
        if bound.session is not session:
            raise OrtInvalidArgument("this IOBinding belongs to another session")
        cdef ort.OrtRunOptions* run_options_c = NULL
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                raise OrtInvalidType(f"run_options must be ortagent.RunOptions, got "
                                     f"{type(run_options).__name__}")
            run_options_c = (<RunOptions>run_options).handle
        bound.require_open()
        if not bound.bound_outputs:
            raise OrtInvalidArgument("this IOBinding has no outputs bound: bind_output() or "
                                     "bind_ortvalue_output() first")
        if not bound.inputs_verified:
            unbound = [arg.name for arg in session._inputs_meta if arg.name not in bound.bound_inputs
                       and not arg.type.startswith("optional(")]
            if unbound:
                raise OrtInvalidArgument(f"required inputs {unbound} are not bound to this IOBinding")
            bound.inputs_verified = True
        cdef bint rebound = bound.rebind_device_outputs(False)
        cdef RunCall call
        cdef bint kept_device = not rebound and bound.has_device_outputs()
        session.begin_run(False)
        cdef tuple used
        try:
            used = bound.begin_run()            # close() of the binding or its values waits
        except BaseException:
            session.end_run(False)
            raise
        try:
            init_call(&call, session, run_options_c, 0, 0)
            call.binding = bound.handle
            if kept_device:
                # device buffers kept from the last run: the retry rule gives them fresh ones
                call.rebind = _rebind_device_outputs
                call.rebind_owner = <PyObject*>bound
            run_core(session, &call, &NO_RUN_ARRAYS)    # all is in the binding
        finally:
            bound.end_run(used)
            session.end_run(False)
        bound.outputs_unsynchronized = _disables_sync(run_options)
        return 0

    # -- results -----------------------------------------------------------------------------------

    cdef list output_values(self):
        """The bound outputs as new OrtValue objects (sharing the buffers), in binding order."""
        self.require_open()
        if self.outputs_unsynchronized:
            self.synchronize_outputs()
        self.outputs_stale = True      # handed out: the next run must not write into them
        result = bound_output_values(self.handle, self.session)
        # An output may be a bound input itself (or an alias of one): keep that input's memory.
        # An output written into a caller's buffer (bind_ortvalue_output, bind_output with a
        # buffer_ptr) keeps that buffer's owner: binding the output again, or closing the
        # binding, must not free memory a value handed out still reads.
        inputs = list(self.bound_inputs.values())
        for bound in self.bound_outputs:
            if (<_BoundOutput>bound).value is not None:
                inputs.append((<_BoundOutput>bound).value)
        cdef Py_ssize_t n_inputs = len(inputs), j
        cdef void** input_data = <void**>malloc((n_inputs + 1) * sizeof(void*))
        if input_data == NULL:
            raise MemoryError()
        try:
            for j in range(n_inputs):
                input_data[j] = tensor_data((<OrtValue>inputs[j]).handle)
            keep_aliased_feeds_alive(result, input_data, n_inputs, inputs, self.session, None)
        finally:
            free(input_data)
        return result

    def get_outputs(self):
        """The outputs of the last run as OrtValues, in binding order."""
        return self.output_values()

    def get_outputs_as_numpy(self):
        """The outputs as NumPy arrays: views of CPU outputs, copies of device outputs."""
        return [value_to_numpy(<OrtValue>value, True) for value in self.output_values()]

    def copy_outputs_to_cpu(self):
        """The outputs copied into new NumPy arrays (never views)."""
        result = []
        for value in self.output_values():
            array = value_to_numpy(<OrtValue>value, True)
            result.append(array.copy() if array.base is not None else array)
        return result

    def synchronize_inputs(self):
        """Wait until inputs copied to devices are in place."""
        self.require_open()
        cdef ort.OrtIoBinding* handle = self.handle
        with nogil:
            check(ort.SynchronizeBoundInputs(handle))

    def synchronize_outputs(self):
        """Wait until the devices have finished writing the outputs."""
        self.require_open()
        cdef ort.OrtIoBinding* handle = self.handle
        with nogil:
            check(ort.SynchronizeBoundOutputs(handle))
        self.outputs_unsynchronized = False

    def __reduce__(self):
        raise OrtInvalidType("IOBinding cannot be pickled")
