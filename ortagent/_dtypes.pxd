# cython: language_level=3
from ortagent cimport _numpy as npc

cdef enum:
    # Dimensions held inline (in fixed arrays) before a heap allocation is needed.
    MAX_INLINE_DIMS = 8

# NumPy imported and the type tables filled (idempotent; first call imports NumPy).
cdef int ensure_numpy() except -1
# The numpy module (after ensure_numpy).
cdef object numpy_module()
# ONNX element type of a NumPy array, -1 when it has none (ensure_numpy first).
cdef int onnx_type_of_array(npc.PyArrayObject* arr) except -2
# NumPy's builtin type number for an ONNX element type, -1 if NumPy has none.
cdef int npy_type_of(int elem_type) noexcept
# The NumPy dtype for an ONNX element type (ml_dtypes' for float8/bfloat16), else OrtNotImplemented.
cdef object numpy_dtype_for(int elem_type)
# 'float' for 1, ...; '' when `elem_type` is not an element type.
cdef str element_type_name(int elem_type)
# 'tensor(float)' style name of an ONNX element type.
cdef str tensor_type_name(int elem_type)
# Bytes per element of ONNX element type `elem_type` (0 for strings, sub-byte and unknown types).
cdef int element_size(int elem_type) noexcept
# Whether NumPy has a builtin type for ONNX element type `elem_type`.
cdef bint has_builtin_numpy_type(int elem_type) noexcept
