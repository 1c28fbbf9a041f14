# cython: language_level=3
from ortagent cimport _capi as ort
from ortagent._values cimport OrtValue

# The type descriptor (see _containers.pyx) of a type info (borrowed, not released).
cdef object describe_type(const ort.OrtTypeInfo* info)
# Whether the session's plain path (a NumPy array for a tensor input) takes `feed`.
cdef bint is_plain_tensor_feed(object feed, object desc)
# A new value (owned by the caller) for `feed` given to an input described by `desc`; arrays the
# value views are appended to `keep`, to be kept alive as long as the value.
cdef ort.OrtValue* value_for_feed(object feed, object desc, object name, list keep) except NULL
# A value as onnxruntime's run() returns it: NumPy array, list, dict, or None.
cdef object python_from_value(OrtValue value)
# An OrtValue fed or bound as an input must hold a value (OrtNotImplemented otherwise).
cdef int check_feedable(OrtValue value, object name) except -1
