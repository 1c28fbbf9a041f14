"""Sparse tensors (onnxruntime.SparseTensor's names): COO and CSR(C) values over NumPy memory,
made and read through the C API's sparse tensor calls.

A SparseTensor made from numeric NumPy arrays views them (no copy; it keeps them alive); one of
strings holds UTF-8 copies (the C API's Fill calls). Reading back (``values()``, the indices of a
view) gives read-only NumPy views of the tensor's memory, as onnxruntime's do (strings: new
object arrays). On the CPU only: see SparseTensor.to_cuda.
"""

import enum

cimport cython
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

from ortagent cimport _capi as ort
from ortagent cimport _numpy as npc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from ortagent._element_types cimport ortagent_element_info, ortagent_element_info_of, ORTAGENT_ELEM_STRING
from ortagent._runtime cimport check, ensure_loaded, shared_runtime

from ortagent.errors import OrtInvalidArgument, OrtInvalidType, OrtNotImplemented, OrtFail




class OrtSparseFormat(enum.IntEnum):
    """Layouts of a sparse tensor (values of onnxruntime's enum)."""
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


cdef int _elem_of_dtype(object dtype) except -1:
    """The ONNX element type of a NumPy dtype with a fixed item size (no strings)."""
    cdef const ortagent_element_info* info
    name = dtype.name
    for number in range(1, 64):
        info = ortagent_element_info_of(number)
        if info != NULL and info.name != NULL and info.item_size > 0 and not info.from_ml_dtypes \
                and info.numpy_name.decode() == name:
            return number
    raise OrtNotImplemented(f"sparse tensors of NumPy dtype {name} cannot be made through ortagent "
                            "(numeric NumPy types only)")


cdef object _sparse_dtype_of(int elem):
    cdef const ortagent_element_info* info = ortagent_element_info_of(elem)
    if info == NULL or info.item_size <= 0 or info.from_ml_dtypes or elem == ORTAGENT_ELEM_STRING:
        raise OrtNotImplemented(f"sparse values of ONNX element type {elem} cannot be read as NumPy arrays")
    return numpy_module().dtype(info.numpy_name.decode())


cdef tuple _type_and_shape(ort.OrtTensorTypeAndShapeInfo* info):
    """(element type, shape) of a type-and-shape info, which this releases."""
    cdef ort.ONNXTensorElementDataType elem = ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
    cdef size_t count = 0
    cdef int64_t* dims = NULL
    try:
        check(ort.GetTensorElementType(info, &elem))
        check(ort.GetDimensionsCount(info, &count))
        dims = <int64_t*>malloc((count + 1) * sizeof(int64_t))
        if dims == NULL:
            raise MemoryError()
        check(ort.GetDimensions(info, dims, count))
        return <int>elem, [dims[i] for i in range(count)]
    finally:
        free(dims)
        ort.ReleaseTensorTypeAndShapeInfo(info)


cdef object _copy_out(const void* data, int elem, list shape):
    """A new NumPy array holding a copy of `shape` items of `elem` at `data`."""
    result = numpy_module().empty(shape, dtype=_sparse_dtype_of(elem))
    cdef size_t nbytes = <size_t>result.nbytes
    if nbytes:
        memcpy(<void*><size_t>result.ctypes.data, data, nbytes)
    return result


cdef object _view_out(OrtValue owner, const void* data, int elem, list shape):
    """A read-only NumPy view of `shape` items of `elem` at `data`, memory `owner` holds (and is
    pinned for: its close() defers to deallocation while the view lives), as onnxruntime's."""
    ensure_numpy()                   # (before npy_type_of, whose table NumPy's import fills)
    npc.numpy_api()
    cdef int npy_type = npy_type_of(elem)
    if npy_type < 0 or elem == ORTAGENT_ELEM_STRING:
        return _copy_out(data, elem, shape)
    cdef Py_ssize_t ndim = len(shape), i, count = 1
    cdef object array = None
    cdef npc.npy_intp* dims = <npc.npy_intp*>malloc((ndim + 1) * sizeof(npc.npy_intp))
    if dims == NULL:
        raise MemoryError()
    try:
        for i in range(ndim):
            dims[i] = shape[i]
            count *= shape[i]
        if count == 0 or data == NULL:
            return _copy_out(data, elem, shape)
        array = npc.PyArray_NewFromDescr(&npc.PyArray_Type, npc.PyArray_DescrFromType(npy_type), <int>ndim,
                                         dims, NULL, <void*>data, npc.NPY_ARRAY_CARRAY_RO, NULL)
    finally:
        free(dims)
    owner.exports += 1
    Py_INCREF(owner)
    npc.PyArray_SetBaseObject(<npc.PyArrayObject*>array, <PyObject*>owner)
    return array


cdef list _dense_shape_of(object dense_shape):
    try:
        shape = [int(d) for d in dense_shape]
    except (TypeError, ValueError):
        raise OrtInvalidType(f"dense_shape must be a sequence of ints, got {dense_shape!r}") from None
    if any([d < 0 for d in shape]):
        raise OrtInvalidArgument(f"dense_shape must not have negative dimensions: {shape}")
    return shape


cdef object _c_array(object array, str what, object dtype=None):
    np = numpy_module()
    if not isinstance(array, np.ndarray):
        raise OrtInvalidType(f"{what} must be a numpy.ndarray, got {type(array).__name__}")
    if dtype is not None and array.dtype != dtype:
        raise OrtInvalidArgument(f"{what} must be {np.dtype(dtype).name}, got {array.dtype}")
    return np.ascontiguousarray(array)


cdef int _check_device(object ort_device) except -1:
    if ort_device is None:
        return 0
    name = ort_device.device_name() if hasattr(ort_device, "device_name") else None
    kind = getattr(ort_device, "device_type", None)
    kind = kind() if callable(kind) else kind
    if name not in (None, "cpu") or kind not in (None, 0, "cpu"):
        raise OrtNotImplemented("ortagent makes sparse tensors on the CPU only")
    return 0


cdef int64_t* _int64s(object numbers) except NULL:
    """A new C array (the caller frees it) of the ints in `numbers`."""
    cdef Py_ssize_t n = len(numbers), i
    cdef int64_t* result = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    if result == NULL:
        raise MemoryError()
    for i in range(n):
        result[i] = numbers[i]
    return result


cdef bint _holds_strings(object values):
    return values.dtype.kind in "USO"


cdef ort.OrtValue* _with_values(list dense, object values) except NULL:
    """A new sparse tensor over the numeric `values` (not copied); its indices are set next."""
    cdef int elem = _elem_of_dtype(values.dtype)
    cdef int64_t* dense_c = _int64s(dense)
    cdef int64_t* values_shape = NULL
    cdef ort.OrtValue* handle = NULL
    try:
        values_shape = _int64s(values.shape)
        check(ort.CreateSparseTensorWithValuesAsOrtValue(
            cpu_memory_info(), <void*><size_t>values.ctypes.data, dense_c, <size_t>len(dense), values_shape,
            <size_t>values.ndim, <ort.ONNXTensorElementDataType>elem, &handle))
    finally:
        free(dense_c)
        free(values_shape)
    return handle


cdef ort.OrtValue* _with_strings(list dense, object values, object first, object second) except NULL:
    """A new sparse tensor holding UTF-8 copies of the strings `values` and of its indices: COO
    `first` (`second` None), or CSR inner `first` and outer `second`."""
    encoded = encoded_strings(values, NULL)      # the C API takes C strings here
    cdef Py_ssize_t n = len(encoded), i
    cdef const char** pointers = <const char**>malloc((n + 1) * sizeof(char*))
    cdef int64_t* dense_c = NULL
    cdef int64_t* values_shape = NULL
    cdef ort.OrtAllocator* allocator = NULL
    cdef ort.OrtValue* handle = NULL
    try:
        if pointers == NULL:
            raise MemoryError()
        for i in range(n):
            pointers[i] = <const char*>(<bytes>encoded[i])
        dense_c = _int64s(dense)
        values_shape = _int64s(values.shape)
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        check(ort.CreateSparseTensorAsOrtValue(allocator, dense_c, <size_t>len(dense),
                                               ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING, &handle))
        if second is None:
            check(ort.FillSparseTensorCoo(handle, cpu_memory_info(), values_shape, <size_t>values.ndim, pointers,
                                          <int64_t*><size_t>first.ctypes.data, <size_t>first.size))
        else:
            check(ort.FillSparseTensorCsr(handle, cpu_memory_info(), values_shape, <size_t>values.ndim, pointers,
                                          <int64_t*><size_t>first.ctypes.data, <size_t>first.size,
                                          <int64_t*><size_t>second.ctypes.data, <size_t>second.size))
    except BaseException:
        if handle != NULL:
            ort.ReleaseValue(handle)
        raise
    finally:
        free(pointers)
        free(dense_c)
        free(values_shape)
    return handle


@cython.final
cdef class SparseTensor:
    """A sparse tensor: ``SparseTensor.sparse_coo_from_numpy(dense_shape, values, indices)`` or
    ``sparse_csr_from_numpy(dense_shape, values, inner, outer)``; feed it to a session through
    ``OrtValue.ort_value_from_sparse_tensor``, or read a session's sparse output with
    ``OrtValue.as_sparse_tensor``."""
    cdef readonly object ort_value      # the ortagent.OrtValue holding it

    def __init__(self, *args, **kwargs):
        raise OrtInvalidType("make a SparseTensor with SparseTensor.sparse_coo_from_numpy(), "
                             "sparse_csr_from_numpy() or OrtValue.as_sparse_tensor()")

    @staticmethod
    def sparse_coo_from_numpy(dense_shape, values, coo_indices, ort_device=None):
        """COO: `values` (nnz) with int64 `coo_indices`, either nnz linear indices or an
        (nnz, rank) array of coordinates. The tensor views both arrays (numeric values), or holds
        copies (strings: str, bytes or objects holding either)."""
        ensure_loaded()
        _check_device(ort_device)
        dense = _dense_shape_of(dense_shape)
        values = _c_array(values, "values")
        indices = _c_array(coo_indices, "coo_indices", "int64")
        if _holds_strings(values):
            return _wrap(wrap_value(_with_strings(dense, values, indices, None), None, None))
        cdef ort.OrtValue* handle = _with_values(dense, values)
        try:
            check(ort.UseCooIndices(handle, <int64_t*><size_t>indices.ctypes.data, <size_t>indices.size))
        except BaseException:
            ort.ReleaseValue(handle)
            raise
        return _wrap(wrap_value(handle, (values, indices), None))

    @staticmethod
    def sparse_csr_from_numpy(dense_shape, values, inner_indices, outer_indices, ort_device=None):
        """CSR: `values` (nnz), int64 `inner_indices` (the column of each value) and
        `outer_indices` (rows + 1 offsets into them). The tensor views the three arrays (numeric
        values), or holds copies (strings)."""
        ensure_loaded()
        _check_device(ort_device)
        dense = _dense_shape_of(dense_shape)
        values = _c_array(values, "values")
        inner = _c_array(inner_indices, "inner_indices", "int64")
        outer = _c_array(outer_indices, "outer_indices", "int64")
        if _holds_strings(values):
            return _wrap(wrap_value(_with_strings(dense, values, inner, outer), None, None))
        cdef ort.OrtValue* handle = _with_values(dense, values)
        try:
            check(ort.UseCsrIndices(handle, <int64_t*><size_t>inner.ctypes.data, <size_t>inner.size,
                                    <int64_t*><size_t>outer.ctypes.data, <size_t>outer.size))
        except BaseException:
            ort.ReleaseValue(handle)
            raise
        return _wrap(wrap_value(handle, (values, inner, outer), None))

    cdef ort.OrtValue* _handle(self) except NULL:
        cdef OrtValue value = self.ort_value
        value.require_handle()
        return value.handle

    def format(self):
        cdef ort.OrtSparseFormat fmt = ort.ORT_SPARSE_UNDEFINED
        check(ort.GetSparseTensorFormat(self._handle(), &fmt))
        return OrtSparseFormat(<int>fmt)

    def values(self):
        """The values (nnz of them): a read-only view (strings: a new object array of str)."""
        cdef ort.OrtTensorTypeAndShapeInfo* info = NULL
        cdef const void* data = NULL
        cdef ort.OrtValue* handle = self._handle()
        check(ort.GetSparseTensorValuesTypeAndShape(handle, &info))
        elem, shape = _type_and_shape(info)
        if elem == ORTAGENT_ELEM_STRING:                # decoded: an object array of str
            count = 1
            for extent in shape:
                count *= extent
            return strings_to_numpy(handle, count, shape)
        check(ort.GetSparseTensorValues(handle, &data))
        return _view_out(self.ort_value, data, elem, shape)

    def dense_shape(self):
        cdef ort.OrtTensorTypeAndShapeInfo* info = NULL
        check(ort.GetTensorTypeAndShape(self._handle(), &info))
        return _type_and_shape(info)[1]

    def data_type(self):
        """'sparse_tensor(float)' style name of the values' type."""
        cdef ort.OrtTensorTypeAndShapeInfo* info = NULL
        check(ort.GetSparseTensorValuesTypeAndShape(self._handle(), &info))
        elem = _type_and_shape(info)[0]
        cdef const ortagent_element_info* entry = ortagent_element_info_of(elem)
        return f"sparse_tensor({entry.name.decode() if entry != NULL and entry.name != NULL else elem})"

    def device_name(self):
        """'cpu': ortagent makes sparse tensors on the CPU only (and the C API reports no memory
        location for a sparse value)."""
        return "cpu"

    cdef object _indices(self, ort.OrtSparseIndicesFormat which):
        cdef ort.OrtTensorTypeAndShapeInfo* info = NULL
        cdef const void* data = NULL
        cdef size_t count = 0
        cdef ort.OrtValue* handle = self._handle()
        check(ort.GetSparseTensorIndicesTypeShape(handle, which, &info))
        elem, shape = _type_and_shape(info)
        check(ort.GetSparseTensorIndices(handle, which, &count, &data))
        return _view_out(self.ort_value, data, elem, shape)

    def as_coo_view(self):
        """COO indices: ``view.indices()``."""
        self._require_format(OrtSparseFormat.ORT_SPARSE_COO, "COO")
        return _IndicesView(indices=self._indices(ort.ORT_SPARSE_COO_INDICES))

    def as_csrc_view(self):
        """CSR indices: ``view.inner()``, ``view.outer()``."""
        self._require_format(OrtSparseFormat.ORT_SPARSE_CSRC, "CSR(C)")
        return _IndicesView(inner=self._indices(ort.ORT_SPARSE_CSR_INNER_INDICES),
                            outer=self._indices(ort.ORT_SPARSE_CSR_OUTER_INDICES))

    def as_blocksparse_view(self):
        self._require_format(OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE, "BlockSparse")
        return _IndicesView(indices=self._indices(ort.ORT_SPARSE_BLOCK_SPARSE_INDICES))

    def _require_format(self, expected, name):
        if self.format() != expected:
            # onnxruntime's own words for the same mistake
            raise OrtFail(f"This sparse tensor does not contain {name} format")

    def to_cuda(self, ort_device):
        raise OrtNotImplemented("ortagent keeps sparse tensors on the CPU: to_cuda is not implemented "
                                "(the C API could fill a sparse tensor made by a CUDA allocator from "
                                "this one's CPU data; ortagent has not bound that path)")

    def __repr__(self):
        return f"SparseTensor({self.data_type()}, format={self.format().name}, dense_shape={self.dense_shape()})"

    def __reduce__(self):
        raise OrtInvalidType("SparseTensor cannot be pickled")


class _IndicesView:
    """The indices of a sparse tensor in one format (read-only views)."""

    def __init__(self, **arrays):
        self._arrays = arrays

    def indices(self):
        return self._arrays["indices"]

    def inner(self):
        return self._arrays["inner"]

    def outer(self):
        return self._arrays["outer"]


cdef SparseTensor _wrap(object value):
    cdef SparseTensor tensor = SparseTensor.__new__(SparseTensor)
    tensor.ort_value = value
    return tensor


def sparse_tensor_of(value):
    """The SparseTensor of an OrtValue that holds one (OrtValue.as_sparse_tensor)."""
    if not isinstance(value, OrtValue):
        raise OrtInvalidType(f"expected an ortagent.OrtValue, got {type(value).__name__}")
    cdef OrtValue v = value
    v.require_handle()
    cdef ort.ONNXType kind = ort.ONNX_TYPE_UNKNOWN
    check(ort.GetValueType(v.handle, &kind))
    if kind != ort.ONNX_TYPE_SPARSETENSOR:
        raise OrtInvalidArgument("this OrtValue does not hold a sparse tensor")
    return _wrap(value)


def is_sparse(value):
    """Whether an ortagent.OrtValue holds a sparse tensor."""
    if not isinstance(value, OrtValue):
        return False
    cdef OrtValue v = value
    v.require_handle()
    cdef ort.ONNXType kind = ort.ONNX_TYPE_UNKNOWN
    check(ort.GetValueType(v.handle, &kind))
    return kind == ort.ONNX_TYPE_SPARSETENSOR
