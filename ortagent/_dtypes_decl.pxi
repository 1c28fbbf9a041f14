from ortagent cimport _numpy as npc

cdef enum:
    # Dimensions held inline (in fixed arrays) before a heap allocation is needed.
    MAX_INLINE_DIMS = 8

# NumPy imported and the type tables filled (idempotent; first call imports NumPy).
# The numpy module (after ensure_numpy).
# ONNX element type of a NumPy array, -1 when it has none (ensure_numpy first).
# NumPy's builtin type number for an ONNX element type, -1 if NumPy has none.
# The NumPy dtype for an ONNX element type (ml_dtypes' for float8/bfloat16), else OrtNotImplemented.
# 'float' for 1, ...; '' when `elem_type` is not an element type.
# 'tensor(float)' style name of an ONNX element type.
# Bytes per element of ONNX element type `elem_type` (0 for strings, sub-byte and unknown types).
# Whether NumPy has a builtin type for ONNX element type `elem_type`.
