from ortagent cimport _capi as ort


cdef class IOBinding(SessionBinding):
    cdef object __weakref__
    cdef ort.OrtIoBinding* handle
    cdef readonly InferenceSession session
    cdef dict bound_inputs                      # name -> OrtValue, kept alive while bound
    cdef list bound_outputs                     # [_BoundOutput] in binding order
    cdef readonly bint reuse_output_buffers
    cdef bint outputs_stale                     # re-bind device outputs before the next run
    cdef bint inputs_verified                   # every required input is bound
    cdef bint outputs_unsynchronized            # last run disabled the end-of-run device sync
    cdef Py_ssize_t runs_in_flight              # changed with the GIL held
    cdef bint close_pending                     # close() asked for while a run was in flight
    cdef int require_open(self) except -1
    cdef tuple bound_values                     # bound_inputs' and bound outputs' values
    cdef int _bindings_changed(self) except -1
    cdef tuple begin_run(self)
    cdef void end_run(self, tuple used) noexcept
    cdef void _release_handle(self) noexcept
    cdef void _release(self) noexcept
    cdef bytes _input_name(self, object name)
    cdef bytes _output_name(self, object name)
    cdef _remember_output(self, _BoundOutput bound)
    cdef int _check_output_type(self, object name, OrtValue value) except -1
    cdef bint has_device_outputs(self)
    cdef bint rebind_device_outputs(self, bint always) except -1
    cdef list output_values(self)


cdef class _BoundOutput:
    cdef bytes name
    cdef object device
    cdef object value
