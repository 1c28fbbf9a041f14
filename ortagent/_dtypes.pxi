"""Element types: names, sizes and the bridge to NumPy's dtypes.

Every element type's facts come from the one table in include/ortagent/element_types.h; this
module adds NumPy's type numbers (builtin types, and ml_dtypes' for the float8/bfloat16 family
when that package is installed). NumPy itself is imported on first use (ensure_numpy).
"""

from ortagent cimport _capi as ort
from ortagent cimport _numpy as npc
from ortagent._element_types cimport *

from ortagent.errors import OrtInvalidArgument, OrtInvalidType, OrtNotImplemented

# ---- element types ---------------------------------------------------------------------------

cdef str element_type_name(int elem_type):
    """'float' for 1, ...; '' when `elem_type` is not an element type."""
    cdef const ortagent_element_info* info = ortagent_element_info_of(elem_type)
    return info.name.decode() if info != NULL else ""


cdef str tensor_type_name(int elem_type):
    cdef str name = element_type_name(elem_type)
    return f"tensor({name})" if name else f"tensor(undefined:{elem_type})"


def _tensor_type_names():
    """{'tensor(float)': 1, ...} for every element type."""
    return {f"tensor({element_type_name(t)})": t for t in range(1, <int>ORTAGENT_ELEM_COUNT)}


_TENSOR_TYPES = _tensor_type_names()


# ---- NumPy bridge ------------------------------------------------------------------------------

cdef bint _numpy_ready = False
_np = None
# NumPy type number -> ONNX element type, for NumPy's own types.
cdef int[32] _NPY_TO_ONNX
# ONNX element type -> NumPy type number (-1: not a builtin NumPy type).
cdef int[<int>ORTAGENT_ELEM_COUNT] _ONNX_TO_NPY
# ml_dtypes: type number (dynamic) -> ONNX type, and ONNX type -> dtype object.
_user_type_to_onnx = {}
_onnx_to_user_dtype = {}
_ml_dtypes_state = [None]   # None: not tried, False: not installed, module otherwise


cdef int ensure_numpy() except -1:
    global _numpy_ready, _np
    if _numpy_ready:
        return 0
    import numpy
    npc.numpy_api()
    _np = numpy
    cdef int i
    for i in range(32):
        _NPY_TO_ONNX[i] = -1
    for i in range(<int>ORTAGENT_ELEM_COUNT):
        _ONNX_TO_NPY[i] = -1
    pairs = (
        (npc.NPY_FLOAT, ORTAGENT_ELEM_FLOAT), (npc.NPY_UINT8, ORTAGENT_ELEM_UINT8),
        (npc.NPY_INT8, ORTAGENT_ELEM_INT8), (npc.NPY_UINT16, ORTAGENT_ELEM_UINT16),
        (npc.NPY_INT16, ORTAGENT_ELEM_INT16), (npc.NPY_INT32, ORTAGENT_ELEM_INT32),
        (npc.NPY_INT64, ORTAGENT_ELEM_INT64), (npc.NPY_BOOL, ORTAGENT_ELEM_BOOL),
        (npc.NPY_HALF, ORTAGENT_ELEM_FLOAT16), (npc.NPY_DOUBLE, ORTAGENT_ELEM_DOUBLE),
        (npc.NPY_UINT32, ORTAGENT_ELEM_UINT32), (npc.NPY_UINT64, ORTAGENT_ELEM_UINT64),
        (npc.NPY_CFLOAT, ORTAGENT_ELEM_COMPLEX64), (npc.NPY_CDOUBLE, ORTAGENT_ELEM_COMPLEX128),
    )
    for npy, onnx_type in pairs:
        _NPY_TO_ONNX[npy] = onnx_type
        _ONNX_TO_NPY[onnx_type] = npy
    # C long / long long are both 64 bits here: map the one NPY_INT64 is not.
    _NPY_TO_ONNX[<int>npc.NPY_LONG] = (ORTAGENT_ELEM_INT64 if numpy.dtype("long").itemsize == 8
                                       else ORTAGENT_ELEM_INT32)
    _NPY_TO_ONNX[<int>npc.NPY_ULONG] = (ORTAGENT_ELEM_UINT64 if numpy.dtype("ulong").itemsize == 8
                                        else ORTAGENT_ELEM_UINT32)
    _NPY_TO_ONNX[<int>npc.NPY_LONGLONG] = ORTAGENT_ELEM_INT64
    _NPY_TO_ONNX[<int>npc.NPY_ULONGLONG] = ORTAGENT_ELEM_UINT64
    _numpy_ready = True
    return 0


cdef int npy_type_of(int elem_type) noexcept:
    """NumPy's builtin type number for an ONNX element type, -1 if NumPy has none."""
    cdef unsigned int index = <unsigned int>elem_type
    if index >= <unsigned int>ORTAGENT_ELEM_COUNT:
        return -1
    return _ONNX_TO_NPY[index]


cdef object _ml_dtypes():
    if _ml_dtypes_state[0] is None:
        try:
            import ml_dtypes
        except ImportError:
            _ml_dtypes_state[0] = False
        else:
            _ml_dtypes_state[0] = ml_dtypes
            for onnx_type in range(1, <int>ORTAGENT_ELEM_COUNT):
                info = ortagent_element_info_of(onnx_type)
                if not info.from_ml_dtypes:
                    continue
                dtype = _np.dtype(getattr(ml_dtypes, info.numpy_name.decode()))
                _user_type_to_onnx[dtype.num] = onnx_type
                _onnx_to_user_dtype[onnx_type] = dtype
    return _ml_dtypes_state[0]


cdef int onnx_type_of_array(npc.PyArrayObject* arr) except -2:
    """ONNX element type of a NumPy array, -1 when it has no ONNX equivalent."""
    cdef int type_num = npc.PyArray_TYPE(arr)
    if type_num < 32 and _NPY_TO_ONNX[type_num] >= 0:
        return _NPY_TO_ONNX[type_num]
    if type_num == npc.NPY_OBJECT or type_num == npc.NPY_UNICODE or type_num == npc.NPY_STRING:
        return ORTAGENT_ELEM_STRING
    if type_num >= npc.NPY_USERDEF and _ml_dtypes():
        return _user_type_to_onnx.get(type_num, -1)
    return -1


cdef object numpy_dtype_for(int elem_type):
    ensure_numpy()
    cdef const ortagent_element_info* info = ortagent_element_info_of(elem_type)
    if npy_type_of(elem_type) >= 0 or elem_type == ORTAGENT_ELEM_STRING:
        return _np.dtype(info.numpy_name.decode())
    if info != NULL and info.from_ml_dtypes:
        if not _ml_dtypes():
            raise OrtNotImplemented(
                f"{tensor_type_name(elem_type)} values need the ml_dtypes package for NumPy: "
                "pip install ml_dtypes")
        return _onnx_to_user_dtype[elem_type]
    raise OrtNotImplemented(f"{tensor_type_name(elem_type)} has no NumPy equivalent")


def element_type_from(element_type):
    """An ONNX element type (int) from an int, a 'tensor(float)' string or a NumPy dtype-like."""
    if element_type is None:
        # numpy.dtype(None) is float64: never what a caller who forgot the type meant.
        raise OrtInvalidType("element_type is required: a NumPy dtype, an ONNX type number or "
                             "'tensor(...)', got None")
    if isinstance(element_type, int) and not isinstance(element_type, bool):
        if ortagent_element_info_of(element_type) != NULL:
            return element_type
        raise OrtInvalidArgument(f"unknown ONNX element type {element_type}")
    if isinstance(element_type, str) and element_type.startswith("tensor("):
        if element_type in _TENSOR_TYPES:
            return _TENSOR_TYPES[element_type]
        raise OrtInvalidArgument(f"unknown tensor type {element_type!r}")
    ensure_numpy()
    try:
        dtype = _np.dtype(element_type)
    except (TypeError, ValueError) as exc:
        raise OrtInvalidType(f"element_type must be a NumPy dtype, an ONNX type number or "
                             f"'tensor(...)', got {element_type!r}") from exc
    probe = _np.empty(0, dtype=dtype)
    cdef int onnx_type = onnx_type_of_array(<npc.PyArrayObject*>probe)
    if onnx_type < 0:
        raise OrtInvalidArgument(f"NumPy dtype {dtype} has no ONNX tensor equivalent")
    return onnx_type



cdef int element_size(int elem_type) noexcept:
    """Bytes per element; 0 for strings, sub-byte types and unknown numbers."""
    cdef const ortagent_element_info* info = ortagent_element_info_of(elem_type)
    return info.item_size if info != NULL else 0


cdef bint has_builtin_numpy_type(int elem_type) noexcept:
    return elem_type != ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING and npy_type_of(elem_type) >= 0


def numpy_dtype_for_element_type(int elem_type):
    return numpy_dtype_for(elem_type)



cdef object numpy_module():
    """The numpy module (imported by ensure_numpy)."""
    ensure_numpy()
    return _np
