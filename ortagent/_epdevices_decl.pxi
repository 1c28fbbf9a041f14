from ortagent cimport _capi as ort


cdef class OrtEpDevice:
    cdef const ort.OrtEpDevice* handle    # owned by the environment; NULL once its library is gone
    cdef const ort.OrtEpDevice* _get(self) except NULL


# The device each of a session's `count` inputs is expected on (OrtEpDevice or None each).
