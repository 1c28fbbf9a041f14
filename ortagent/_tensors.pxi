"""Raw onnxruntime tensors over NumPy memory, below OrtValue: a tensor over a fed array (with the
per-input view cache that spares creating one when the same array is fed again), string tensors
(always copies), and new NumPy arrays with a tensor over them for outputs onnxruntime writes.
The caller owns each handle returned.
"""

from cpython.object cimport PyObject
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

from ortagent cimport _capi as ort
from ortagent cimport _numpy as npc
from ortagent._element_types cimport ORTAGENT_ELEM_STRING
from ortagent._runtime cimport check, ensure_loaded, shared_runtime

from ortagent.errors import OrtInvalidArgument, OrtInvalidType


cdef bint _numpy_bound = False      # a C flag: checked on every run's output, unlike a global


cdef inline int _numpy_api() except -1:
    """NumPy imported, its C API bound in _core, and `_np` set."""
    global _np, _numpy_bound
    if not _numpy_bound:
        _np = numpy_module()
        npc.numpy_api()
        _numpy_bound = True
    return 0


cdef ort.OrtValue* tensor_for_feed(object feed, object name, int expected_type, list keep) except NULL:
    _numpy_api()
    if not npc.PyArray_Check(feed):
        if isinstance(feed, _np.generic):
            feed = _np.asarray(feed)
            keep.append(feed)
        else:
            where = f"input {name!r}" if name is not None else "the value"
            raise OrtInvalidType(
                f"{where} must be a numpy.ndarray or an OrtValue, got {type(feed).__name__}")
    cdef npc.PyArrayObject* arr = <npc.PyArrayObject*>feed
    cdef int onnx_type = onnx_type_of_array(arr)
    if onnx_type < 0:
        where = f"input {name!r}" if name is not None else "array"
        raise OrtInvalidArgument(f"{where}: NumPy dtype {feed.dtype} has no ONNX tensor equivalent")
    if expected_type >= 0 and onnx_type != expected_type:
        raise OrtInvalidArgument(
            f"input {name!r} expects {tensor_type_name(expected_type)}, got a NumPy array of "
            f"{feed.dtype} ({tensor_type_name(onnx_type)})")
    if onnx_type == ORTAGENT_ELEM_STRING:
        return string_tensor(feed)
    cdef int flags = npc.PyArray_FLAGS(arr)
    if ((flags & npc.NPY_ARRAY_C_CONTIGUOUS) == 0 or (flags & npc.NPY_ARRAY_ALIGNED) == 0
            or not npc.PyArray_ISNOTSWAPPED(arr)):
        feed = _np.ascontiguousarray(feed, dtype=feed.dtype.newbyteorder("="))
        keep.append(feed)
        arr = <npc.PyArrayObject*>feed
    cdef int ndim = npc.PyArray_NDIM(arr)
    cdef int64_t stack_dims[MAX_INLINE_DIMS]
    cdef int64_t* shape_ptr = stack_dims
    cdef npc.npy_intp* np_dims = npc.PyArray_DIMS(arr)
    cdef int i
    cdef ort.OrtValue* handle = NULL
    cdef void* data = npc.PyArray_DATA(arr)
    cdef size_t nbytes = <size_t>npc.PyArray_NBYTES(arr)
    cdef ort.OrtMemoryInfo* info = cpu_memory_info()
    cdef ort.OrtStatus* status
    if ndim > MAX_INLINE_DIMS:
        shape_ptr = <int64_t*>malloc(ndim * sizeof(int64_t))
        if shape_ptr == NULL:
            raise MemoryError()
    for i in range(ndim):
        shape_ptr[i] = np_dims[i]
    status = ort.CreateTensorWithDataAsOrtValue(info, data, nbytes, shape_ptr, <size_t>ndim,
                                                <ort.ONNXTensorElementDataType>onnx_type, &handle)
    if shape_ptr != stack_dims:
        free(shape_ptr)
    check(status)
    return handle


cdef ort.OrtValue* feed_view(FeedView* cache, object feed, object name, int expected_type,
                             list keep, bint* from_cache) except NULL:
    from_cache[0] = False
    cdef npc.PyArrayObject* arr
    cdef int flags, ndim, i, onnx_type
    cdef npc.npy_intp* np_dims
    cdef bint eligible = False
    if npc.PyArray_API != NULL and npc.PyArray_Check(feed):
        arr = <npc.PyArrayObject*>feed
        flags = npc.PyArray_FLAGS(arr)
        ndim = npc.PyArray_NDIM(arr)
        eligible = ((flags & npc.NPY_ARRAY_C_CONTIGUOUS) != 0 and (flags & npc.NPY_ARRAY_ALIGNED) != 0
                    and npc.PyArray_ISNOTSWAPPED(arr) and ndim <= MAX_INLINE_DIMS
                    and npc.PyArray_TYPE(arr) != npc.NPY_OBJECT)
        if eligible and cache.value != NULL and cache.data == npc.PyArray_DATA(arr) \
                and cache.ndim == ndim and cache.nbytes == <size_t>npc.PyArray_NBYTES(arr):
            np_dims = npc.PyArray_DIMS(arr)
            for i in range(ndim):
                if cache.dims[i] != np_dims[i]:
                    break
            else:
                onnx_type = onnx_type_of_array(arr)
                if onnx_type == cache.elem_type and (expected_type < 0 or onnx_type == expected_type):
                    cache.users += 1
                    from_cache[0] = True
                    return cache.value
    cdef ort.OrtValue* handle = tensor_for_feed(feed, name, expected_type, keep)
    if eligible and cache.users == 0:
        # Keep this one for the next run, replacing the previous array's.
        if cache.value != NULL:
            ort.ReleaseValue(cache.value)
        arr = <npc.PyArrayObject*>feed
        cache.value = handle
        cache.serial += 1
        cache.data = npc.PyArray_DATA(arr)
        cache.nbytes = <size_t>npc.PyArray_NBYTES(arr)
        cache.elem_type = onnx_type_of_array(arr)
        cache.ndim = npc.PyArray_NDIM(arr)
        np_dims = npc.PyArray_DIMS(arr)
        for i in range(cache.ndim):
            cache.dims[i] = np_dims[i]
        cache.users = 1
        from_cache[0] = True
    return handle


cdef void* tensor_data(ort.OrtValue* handle) noexcept:
    """The data address of a tensor value; NULL for non-tensors, empty tensors or on error."""
    cdef void* data = NULL
    cdef int present = 0
    # An optional output without a value claims to be a tensor, and reading its data crashes
    # onnxruntime (1.31): ask whether there is a value first.
    cdef ort.OrtStatus* status = ort.HasValue(handle, &present)
    if status == NULL and not present:
        return NULL
    if status == NULL:
        status = ort.GetTensorMutableData(handle, &data)
    if status != NULL:
        ort.ReleaseStatus(status)
        return NULL
    return data


cdef void release_feed_view(FeedView* cache) noexcept:
    cache.users -= 1


cdef void clear_feed_view(FeedView* cache) noexcept:
    if cache.value != NULL and cache.users == 0:
        ort.ReleaseValue(cache.value)
        cache.value = NULL
        cache.serial += 1


cdef object new_output_array(int elem_type, int ndim, const int64_t* dims,
                             ort.OrtValue** tensor_out):
    _numpy_api()
    cdef npc.npy_intp npy_dims[MAX_INLINE_DIMS]
    cdef int i
    if ndim > MAX_INLINE_DIMS or not has_builtin_numpy_type(elem_type):
        raise OrtInvalidArgument(f"no preallocated NumPy output for {tensor_type_name(elem_type)} "
                                 f"of rank {ndim}")
    for i in range(ndim):
        npy_dims[i] = <npc.npy_intp>dims[i]
    array = npc.PyArray_NewFromDescr(&npc.PyArray_Type, npc.PyArray_DescrFromType(npy_type_of(elem_type)),
                                     ndim, npy_dims, NULL, NULL, 0, NULL)
    check(ort.CreateTensorWithDataAsOrtValue(
        cpu_memory_info(), npc.PyArray_DATA(<npc.PyArrayObject*>array),
        <size_t>npc.PyArray_NBYTES(<npc.PyArrayObject*>array), dims, <size_t>ndim,
        <ort.ONNXTensorElementDataType>elem_type, tensor_out))
    return array


cdef object new_array_from(int elem_type, int ndim, const int64_t* dims, const void* data, size_t nbytes):
    """A new C-contiguous NumPy array (type and shape as in new_output_array) holding a copy of
    the `nbytes` bytes at `data` (InferenceSession.run's small outputs, see _session.pxi)."""
    _numpy_api()
    cdef npc.npy_intp npy_dims[MAX_INLINE_DIMS]
    cdef int i
    if ndim > MAX_INLINE_DIMS or not has_builtin_numpy_type(elem_type):
        raise OrtInvalidArgument(f"no NumPy array for {tensor_type_name(elem_type)} of rank {ndim}")
    for i in range(ndim):
        npy_dims[i] = <npc.npy_intp>dims[i]
    array = npc.PyArray_NewFromDescr(&npc.PyArray_Type, npc.PyArray_DescrFromType(npy_type_of(elem_type)),
                                     ndim, npy_dims, NULL, NULL, 0, NULL)
    if <size_t>npc.PyArray_NBYTES(<npc.PyArrayObject*>array) != nbytes:
        raise OrtInvalidArgument("new_array_from: the array and the data differ in size")
    memcpy(npc.PyArray_DATA(<npc.PyArrayObject*>array), data, nbytes)
    return array



cdef list encoded_strings(object arr, bint* has_nul):
    """UTF-8 bytes of every item of `arr` (str or bytes), in C order. `has_nul` NULL: an item
    holding a NUL character is refused (the callers that hand onnxruntime C strings); otherwise
    has_nul[0] says whether any item holds one."""
    encoded = []
    if has_nul != NULL:
        has_nul[0] = False
    for item in arr.ravel(order="C").tolist():
        if isinstance(item, bytes):
            data = item
        elif isinstance(item, str):
            try:
                data = item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise OrtInvalidArgument(f"string {item!r} cannot be encoded as UTF-8: {exc}") from None
        else:
            raise OrtInvalidType(f"string tensors hold str or bytes, got {type(item).__name__}")
        if b"\0" in data:
            if has_nul == NULL:
                # The C API takes NUL-terminated strings here: the rest would be dropped silently.
                raise OrtInvalidArgument(f"string {item!r} contains a NUL character, which onnxruntime's "
                                         "C API cannot store here")
            has_nul[0] = True
        encoded.append(data)
    return encoded


cdef int _fill_strings(ort.OrtValue* handle, list encoded, bint has_nul) except -1:
    """Fill a string tensor of len(encoded) items. Strings without NUL characters go to
    OrtApi::FillStringTensor in one call (C strings); when any holds a NUL, every item is written
    with its length into a buffer of OrtApi::GetResizedStringTensorElementBuffer instead."""
    cdef Py_ssize_t n = len(encoded), i
    cdef char* buffer = NULL
    cdef bytes item
    if has_nul:
        for i in range(n):
            item = <bytes>encoded[i]
            check(ort.GetResizedStringTensorElementBuffer(handle, <size_t>i, <size_t>len(item), &buffer))
            if len(item):
                memcpy(buffer, <const char*>item, <size_t>len(item))
        return 0
    cdef const char** pointers = <const char**>malloc(max(n, 1) * sizeof(char*))
    if pointers == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            pointers[i] = <const char*>(<bytes>encoded[i])
        check(ort.FillStringTensor(handle, pointers, <size_t>n))
    finally:
        free(pointers)
    return 0


cdef ort.OrtValue* string_tensor(object arr) except NULL:
    """A new ORT string tensor holding UTF-8 copies of `arr`'s items (str, bytes or objects);
    the caller owns it."""
    ensure_loaded()      # this can be a process's first call into onnxruntime
    cdef bint has_nul = False
    encoded = encoded_strings(arr, &has_nul)
    cdef ort.OrtAllocator* allocator = NULL
    cdef ort.OrtValue* handle = NULL
    cdef int64_t stack_dims[MAX_INLINE_DIMS]
    cdef int64_t* dims = stack_dims
    cdef Py_ssize_t ndim = len(arr.shape), i
    if ndim > MAX_INLINE_DIMS:
        dims = <int64_t*>malloc(ndim * sizeof(int64_t))
        if dims == NULL:
            raise MemoryError()
    try:
        for i in range(ndim):
            dims[i] = arr.shape[i]
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        check(ort.CreateTensorAsOrtValue(allocator, dims, <size_t>ndim,
                                         ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING, &handle))
    finally:
        if dims != stack_dims:
            free(dims)
    try:
        _fill_strings(handle, encoded, has_nul)
    except BaseException:
        ort.ReleaseValue(handle)
        raise
    return handle


cdef int fill_string_tensor(ort.OrtValue* handle, object arr) except -1:
    """Refill a string tensor with UTF-8 copies of `arr`'s items (the same count)."""
    cdef bint has_nul = False
    encoded = encoded_strings(arr, &has_nul)
    return _fill_strings(handle, encoded, has_nul)


cdef object strings_to_numpy(ort.OrtValue* handle, Py_ssize_t count, list shape):
    """A new NumPy object array of `shape` with the `count` strings of a string tensor, decoded."""
    cdef size_t total = 0
    check(ort.GetStringTensorDataLength(handle, &total))
    cdef char* buffer = <char*>malloc(total + 1)
    cdef size_t* offsets = <size_t*>malloc((count + 1) * sizeof(size_t))
    if buffer == NULL or offsets == NULL:
        free(buffer)
        free(offsets)
        raise MemoryError()
    try:
        if count:
            check(ort.GetStringTensorContent(handle, buffer, total, offsets, <size_t>count))
        offsets[count] = total
        items = [buffer[offsets[i]:offsets[i + 1]].decode("utf-8", "replace") for i in range(count)]
    finally:
        free(buffer)
        free(offsets)
    result = numpy_module().empty(count, dtype=object)
    result[:] = items
    return result.reshape(shape)
