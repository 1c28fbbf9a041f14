"""OrtValue: tensors owned by onnxruntime or viewed over caller memory.

NumPy arrays go in and come out without copies on the CPU: a C-contiguous, aligned, native-order
array becomes a tensor over the same bytes (the value keeps the array alive), and ``numpy()`` is a
view whose base is the value. Strings always copy. NumPy itself is imported on first use.
"""

cimport cython
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy, strlen

from operator import index as _index

from ortagent cimport _capi as ort
from ortagent cimport _numpy as npc
from ortagent._element_types cimport *
from ortagent._runtime cimport (
    check, raise_status, ensure_loaded, shared_runtime, live_handle_counts, count_add, HANDLE_VALUE,
)

from ortagent.errors import (
    OrtError, OrtFail, OrtInvalidArgument, OrtInvalidType, OrtNotImplemented, ObjectClosedError,
)


# ---- OrtValue ------------------------------------------------------------------------------------

@cython.final
@cython.freelist(64)
@cython.no_gc_clear          # __dealloc__ releases the handle before memory_owner and session go
cdef class OrtValue:
    """An onnxruntime value (tensor) owned by this object.

    Create one with :meth:`ortvalue_from_numpy`, :meth:`ortvalue_from_shape_and_type` or
    :meth:`from_dlpack`; sessions return them from ``run_with_ort_values`` and IO bindings.
    """

    def __cinit__(self):
        self.elem_type = -1
        self.dims = self.dims_inline

    def __init__(self, *args, **kwargs):
        raise OrtInvalidType(
            "OrtValue cannot be created directly; use OrtValue.ortvalue_from_numpy(), "
            "OrtValue.ortvalue_from_shape_and_type() or OrtValue.from_dlpack()")

    def __dealloc__(self):
        if self.spares is not None and self.handle != NULL and not self.close_requested:
            if self.spares.give_back(self.spare_slot, self.handle):
                self.handle = NULL
                count_add(&_live[<int>HANDLE_VALUE], -1)
        self._release()

    cdef void _release(self) noexcept:
        if self.handle != NULL:
            ort.ReleaseValue(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_VALUE], -1)
        if self.dims != self.dims_inline and self.dims != NULL:
            free(self.dims)
        self.dims = self.dims_inline
        self.memory_owner = None
        self.session = None
        self.spares = None

    cdef int require_handle(self) except -1:
        if self.handle == NULL or self.close_requested:
            raise ObjectClosedError("this OrtValue has been released")
        return 0

    # in_use, exports and close_requested change inside a critical section on the value (the
    # GIL on a GIL build), and the value is released in one: two threads sharing a value can
    # neither lose a count nor both release it.

    cdef int begin_use(self) except -1:
        """A run is about to read or write this value: close() waits for end_use()."""
        cdef bint usable
        with cython.critical_section(self):
            usable = self.handle != NULL and not self.close_requested
            if usable:
                self.in_use += 1
        if not usable:
            self.require_handle()       # raises
        return 0

    cdef void end_use(self) noexcept:
        with cython.critical_section(self):
            self.in_use -= 1
            self._release_if_unused()

    cdef void _release_if_unused(self) noexcept:
        """Release now if close() was asked for and nothing (view, export, run) uses the value.
        Called inside a critical section on the value."""
        if self.close_requested and self.exports == 0 and self.in_use == 0:
            self._release()

    cdef int describe(self) except -1:
        """Read and cache element type, shape, data pointer and device of the tensor."""
        return self.describe_as(-1)

    cdef bint _reserve_dims(self, size_t count) noexcept:
        """Room for `count` dimensions in self.dims; False when out of memory."""
        if self.dims != self.dims_inline:
            free(self.dims)
            self.dims = self.dims_inline
        if count > MAX_INLINE_DIMS:
            self.dims = <int64_t*>malloc(count * sizeof(int64_t))
            if self.dims == NULL:
                self.dims = self.dims_inline
                return False
        return True

    cdef ort.OrtStatus* _type_and_shape(self, ort.ONNXTensorElementDataType* elem,
                                        size_t* count) noexcept:
        """Element type and dimensions (into self.dims) through an OrtTensorTypeAndShapeInfo:
        the way for runtimes older than 1.24. Returns onnxruntime's status."""
        cdef ort.OrtTensorTypeAndShapeInfo* info = NULL
        cdef ort.OrtStatus* status = ort.GetTensorTypeAndShape(self.handle, &info)
        if status != NULL:
            return status
        status = ort.GetTensorElementType(info, elem)
        if status == NULL:
            status = ort.GetDimensionsCount(info, count)
        if status == NULL and not self._reserve_dims(count[0]):
            status = ort.CreateStatus(ort.ORT_FAIL, "out of memory for a tensor's dimensions")
        if status == NULL:
            status = ort.GetDimensions(info, self.dims, count[0])
        ort.ReleaseTensorTypeAndShapeInfo(info)
        return status

    cdef int describe_as(self, int known_memory_kind) except -1:
        """describe(), trusting `known_memory_kind` (>= 0) instead of asking onnxruntime where
        the tensor lives: for outputs of sessions that run on the CPU provider only."""
        self.require_handle()
        if self.elem_type >= 0:
            return 0
        # Described once, by one thread at a time (another one sharing the value waits, then
        # finds it described); elem_type is written last.
        with cython.critical_section(self):
            if self.elem_type < 0:
                self._describe(known_memory_kind)
        return 0

    cdef int _describe(self, int known_memory_kind) except -1:
        cdef int is_tensor = 0
        cdef ort.ONNXTensorElementDataType elem = ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
        cdef size_t count = 0
        cdef const int64_t* shape = NULL
        cdef const ort.OrtMemoryInfo* mem = NULL
        cdef ort.OrtStatus* status
        if ort.ortagent_rt.api_version >= ort.ortagent_since_GetTensorElementTypeAndShapeDataReference:
            # onnxruntime >= 1.24: the element type and a pointer to the value's own shape in
            # one call, where older runtimes allocate and free a type-and-shape object.
            status = ort.GetTensorElementTypeAndShapeDataReference(self.handle, &elem, &shape, &count)
        else:
            status = self._type_and_shape(&elem, &count)
        if status != NULL:
            # Not a tensor (a sequence, a map...), or a real failure: tell them apart.
            ort.ReleaseStatus(status)
            check(ort.HasValue(self.handle, &is_tensor))      # an optional without a value
            if is_tensor:
                check(ort.IsTensor(self.handle, &is_tensor))
            if not is_tensor:
                self.is_tensor_value = False
                self.ndim = 0
                self.elem_type = 0
                return 0
            check(self._type_and_shape(&elem, &count))
            shape = NULL
        self.is_tensor_value = True
        if shape != NULL:
            if not self._reserve_dims(count):
                raise MemoryError()
            memcpy(self.dims, shape, count * sizeof(int64_t))
        self.ndim = <int>count
        status = NULL
        if known_memory_kind >= 0:
            self.memory_kind = known_memory_kind
            self.device_id = 0
        else:
            status = ort.GetTensorMemoryInfo(self.handle, &mem)
            if status == NULL:
                self.memory_kind = memory_kind_of(mem, &self.device_id)
        if status == NULL and elem != ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING:
            status = ort.GetTensorMutableData(self.handle, &self.data)
        elif status == NULL and self._onnx_type() == ort.ONNX_TYPE_SPARSETENSOR:
            return self._describe_sparse()       # strings have no data pointer to fail on
        if status != NULL:
            # A sparse tensor reports a type and shape but has no dense data: not a tensor here.
            try:
                kind = self._onnx_type()
            except BaseException:
                ort.ReleaseStatus(status)
                raise
            if kind == ort.ONNX_TYPE_SPARSETENSOR:
                ort.ReleaseStatus(status)
                return self._describe_sparse()
            check(status)
        self.elem_type = <int>elem
        return 0

    cdef int _describe_sparse(self) noexcept:
        self.is_tensor_value = False
        self.ndim = 0
        self.data = NULL
        self.elem_type = 0                       # last: a described value has elem_type >= 0
        return 0

    # -- construction ----------------------------------------------------------------------------

    @staticmethod
    def ortvalue_from_numpy(numpy_obj, device_type="cpu", device_id=0):
        """A tensor over `numpy_obj`'s memory (no copy) when it is C-contiguous, aligned and in
        native byte order; over a contiguous copy otherwise. The value keeps the array alive.
        Strings are always copied. On a device other than the CPU the data is copied there."""
        device = as_device(device_type, device_id)
        if (<OrtDevice>device).kind != MEMORY_CPU:
            return _device_value_from_numpy(numpy_obj, device)
        ensure_numpy()
        npc.numpy_api()
        cdef list keep = []
        cdef ort.OrtValue* handle = tensor_for_feed(numpy_obj, None, -1, keep)
        owner = keep[len(keep) - 1] if keep else numpy_obj
        cdef OrtValue value = wrap_value(handle, owner, None)
        if npc.PyArray_Check(owner):
            value.readonly = (npc.PyArray_FLAGS(<npc.PyArrayObject*>owner) & npc.NPY_ARRAY_WRITEABLE) == 0
        return value

    @staticmethod
    def ortvalue_from_shape_and_type(shape, element_type, device_type="cpu", device_id=0):
        """A new tensor of `shape` and `element_type` (NumPy dtype, ONNX type number or
        'tensor(...)'), allocated by onnxruntime on the given device; contents uninitialised
        (strings: empty)."""
        device = as_device(device_type, device_id)
        cdef int onnx_type = element_type_from(element_type)
        dims = _checked_shape(shape, element_size(onnx_type))
        if (<OrtDevice>device).kind != MEMORY_CPU:
            return _allocate_device_value(dims, onnx_type, device)
        ensure_loaded()
        cdef ort.OrtAllocator* allocator = NULL
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        return allocate_with(allocator, dims, onnx_type, None)

    # -- inspection --------------------------------------------------------------------------------

    def data_ptr(self):
        """Address of the first element (0 for strings)."""
        self.describe()
        return <size_t>self.data

    def device_name(self):
        """'cpu', 'cuda' or 'cuda_pinned' (onnxruntime spells CUDA 'cuda' too)."""
        self.describe()
        return _DEVICE_NAMES.get(self.memory_kind, "other")

    def device(self):
        """The OrtDevice this tensor lives on."""
        self.describe()
        if self.memory_kind == MEMORY_CUDA:
            return OrtDevice(_ORT_DEVICE_GPU, _ORT_MEM_DEFAULT, self.device_id)
        if self.memory_kind == MEMORY_CUDA_PINNED:
            return OrtDevice(_ORT_DEVICE_CPU, _ORT_MEM_CUDA_PINNED, self.device_id)
        return _CPU_DEVICE

    def shape(self):
        """The tensor's dimensions as a list of ints."""
        self.describe()
        self._require_tensor()
        return [self.dims[i] for i in range(self.ndim)]

    def data_type(self):
        """onnxruntime's type string, e.g. 'tensor(float)', 'seq(tensor(int64))',
        'sparse_tensor(float)'."""
        self.describe()
        if not self.is_tensor_value:
            return type_string(describe_value_type(self))
        return tensor_type_name(self.elem_type)

    def element_type(self):
        """The ONNX element type number (1 = float, 7 = int64, ...)."""
        self.describe()
        self._require_tensor()
        return self.elem_type

    def is_tensor(self):
        self.describe()
        return self.is_tensor_value

    cdef int _onnx_type(self) except -2:
        self.require_handle()
        cdef int present = 0
        cdef ort.ONNXType kind = ort.ONNX_TYPE_UNKNOWN
        check(ort.HasValue(self.handle, &present))
        if not present:
            return -1
        check(ort.GetValueType(self.handle, &kind))
        return <int>kind

    def is_sparse_tensor(self):
        return self._onnx_type() == ort.ONNX_TYPE_SPARSETENSOR

    def is_tensor_sequence(self):
        """Whether this value is a sequence of tensors."""
        if self._onnx_type() != ort.ONNX_TYPE_SEQUENCE:
            return False
        return self.data_type().startswith("seq(tensor(")

    def as_sparse_tensor(self):
        """The SparseTensor this value holds."""
        return sparse_tensor_of(self)

    @staticmethod
    def ort_value_from_sparse_tensor(sparse_tensor):
        """The OrtValue holding a SparseTensor (to feed it to a session)."""
        if not isinstance(sparse_tensor, SparseTensor):
            raise OrtInvalidType(f"expected an ortagent.SparseTensor, got {type(sparse_tensor).__name__}")
        return sparse_tensor.ort_value

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data, onnx_element_type):
        """A tensor over `data`'s memory (no copy) taken as ONNX element type
        `onnx_element_type`, whose item size must be the array's (e.g. uint16 bits as bfloat16)."""
        ensure_numpy()
        np = numpy_module()
        if not isinstance(data, np.ndarray):
            raise OrtInvalidType(f"data must be a numpy.ndarray, got {type(data).__name__}")
        number = _int_argument(onnx_element_type, "onnx_element_type")
        if not 0 < number < 64:
            raise OrtInvalidArgument(f"onnx_element_type must be an ONNX element type, got {number}")
        cdef int elem = number
        cdef int size = element_size(elem)
        if size == 0:
            raise OrtInvalidArgument(f"onnx_element_type {elem} has no fixed item size")
        if data.itemsize != size:
            # onnxruntime's words for the same mistake
            raise OrtFail(f"Items size in the incoming array: {data.itemsize} specified by "
                                     f"onnxtype: {size}")
        array = np.ascontiguousarray(data)
        return value_over_memory(<void*><size_t>array.ctypes.data, list(array.shape), elem, _CPU_DEVICE,
                                 array, not array.flags.writeable)

    def tensor_size_in_bytes(self):
        """Bytes of the tensor's data (OrtApi::GetTensorSizeInBytes, onnxruntime >= 1.23)."""
        self.require_handle()
        cdef size_t size = 0
        check(ort.GetTensorSizeInBytes(self.handle, &size))
        return size

    def has_value(self):
        self.require_handle()
        cdef int out = 0
        check(ort.HasValue(self.handle, &out))
        return bool(out)

    def nbytes(self):
        """Size of the tensor's data in bytes (0 for strings)."""
        self.describe()
        self._require_tensor()
        return _element_count(self) * element_size(self.elem_type)

    def _require_tensor(self):
        if not self.is_tensor_value:
            raise OrtNotImplemented("this OrtValue is not a tensor; ortagent supports tensors only")

    def numpy(self):
        """The tensor as a NumPy array: a view of the same memory on the CPU (keeps this value
        alive), a copy for strings and for device memory."""
        return value_to_numpy(self, True)

    def update_inplace(self, np_arr):
        """Copy `np_arr` (same shape and element type) into this tensor's memory."""
        self.describe()
        self._require_tensor()
        if self.memory_kind not in (MEMORY_CPU, MEMORY_CUDA_PINNED):
            return _update_device_value(self, np_arr)
        np = numpy_module()
        target = value_to_numpy(self, True)
        source = np.asarray(np_arr)
        if source.shape != target.shape:
            raise OrtInvalidArgument(f"update_inplace: shape {source.shape} does not match the "
                                     f"value's shape {target.shape}")
        if self.elem_type == ORTAGENT_ELEM_STRING:
            # numpy() of a string tensor is a copy: refill the tensor itself.
            if self.readonly:
                raise OrtInvalidArgument("update_inplace: this value is read-only")
            if source.dtype.kind not in "OUS":
                raise OrtInvalidArgument(f"update_inplace: dtype {source.dtype} does not match the "
                                         f"value's {self.data_type()}")
            fill_string_tensor(self.handle, source)
            return
        if source.dtype != target.dtype:
            raise OrtInvalidArgument(f"update_inplace: dtype {source.dtype} does not match the "
                                     f"value's {self.data_type()}")
        if self.readonly:
            raise OrtInvalidArgument("update_inplace: this value views read-only memory")
        np.copyto(target, source)

    def close(self):
        """Release the ORT value. Views and DLPack capsules taken earlier stay valid: the memory
        is released when the last of them goes; a run reading or writing the value on another
        thread finishes first. Later calls on this object raise."""
        with cython.critical_section(self):
            if self.exports > 0 or self.in_use > 0:
                self.close_requested = True
            else:
                self._release()

    def __repr__(self):
        if self.handle == NULL:
            return "<OrtValue released>"
        self.describe()
        if not self.is_tensor_value:
            return "<OrtValue non-tensor>"
        return (f"<OrtValue {self.data_type()} shape={self.shape()} on "
                f"{self.device_name()}{':' + str(self.device_id) if self.memory_kind == MEMORY_CUDA else ''}>")

    def __reduce__(self):
        raise OrtInvalidType("OrtValue cannot be pickled; pickle value.numpy() instead")

    # -- DLPack (implemented in _dlpack.pxi) -------------------------------------------------------

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export this tensor as a DLPack capsule (see export_value in _dlpack.pxi)."""
        return export_value(self, stream=stream, max_version=max_version,
                                             dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        """(DLPack device type, device id) of this tensor."""
        return value_device(self)

    @staticmethod
    def from_dlpack(obj, is_bool_tensor=False, *, stream=None):
        """An OrtValue viewing the memory of `obj` (any object with __dlpack__, or a capsule);
        `is_bool_tensor` reads a uint8 tensor as booleans."""
        return from_dlpack(obj, is_bool_tensor, stream=stream)

    def __array__(self, dtype=None, copy=None):
        """numpy.asarray(value) / numpy.array(value): the tensor as numpy() gives it (a view),
        converted to `dtype`, copied when `copy` is True (NumPy's rules otherwise)."""
        array = self.numpy()
        if copy is not None:
            return numpy_module().array(array, dtype=dtype, copy=copy)
        if dtype is not None:
            return numpy_module().asarray(array, dtype=dtype)
        return array

    @staticmethod
    def _from_pointer(data_ptr, shape, element_type, device_type="cpu", device_id=0,
                      owner=None):
        """A tensor over raw memory at `data_ptr` (never dereferenced here); `owner` is kept
        alive. The caller guarantees the memory outlives the value."""
        address = _int_argument(data_ptr, "buffer_ptr")
        if not 0 <= address <= _SIZE_MAX:
            raise OrtInvalidArgument(f"buffer_ptr must be an address in [0, 2**64), got {address}")
        device = as_device(device_type, device_id)
        return value_over_memory(<void*><size_t>address, shape, element_type_from(element_type),
                                 <OrtDevice>device, owner, False)


def output_target(name, device_type, device_id, element_type, shape, buffer_ptr):
    """Where an output is bound (IOBinding.bind_output and the agent's binding alike): the
    OrtDevice onnxruntime allocates it on, or, with `element_type`, `shape` and `buffer_ptr`, an
    OrtValue over the caller's memory that each run writes into."""
    if buffer_ptr is None:
        if element_type is not None or shape is not None:
            raise OrtInvalidArgument(f"output {name!r}: element_type and shape need a buffer_ptr")
        return as_device(device_type, device_id)
    if element_type is None or shape is None:
        raise OrtInvalidArgument(f"output {name!r}: a buffer_ptr needs element_type and shape")
    if buffer_ptr == 0:
        raise OrtInvalidArgument(f"output {name!r}: buffer_ptr must not be 0")
    return OrtValue._from_pointer(buffer_ptr, shape, element_type, device_type, device_id)


cdef inline Py_ssize_t _element_count(OrtValue value):
    cdef Py_ssize_t count = 1
    cdef int i
    for i in range(value.ndim):
        count *= value.dims[i]
    return count


# ---- spare outputs (see _values_decl.pxi) -------------------------------------------------------

@cython.final
cdef class SpareOutputs:
    """A session's preallocated outputs given back by their last owner, one per output slot,
    for the next run of the same output (the TrainingAgent's halves use one each)."""

    def __cinit__(self, Py_ssize_t n_slots):
        if n_slots < 0:
            raise OrtInvalidArgument(f"n_slots must be >= 0, got {n_slots}")
        self.handles = <ort.OrtValue**>calloc(n_slots + 1, sizeof(ort.OrtValue*))
        if self.handles == NULL:
            raise MemoryError()
        self.n_slots = n_slots

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.handles == NULL:
            return
        for i in range(self.n_slots):      # nothing else can reach this object any more
            if self.handles[i] != NULL:
                ort.ReleaseValue(self.handles[i])
        free(self.handles)
        self.handles = NULL

    cdef ort.OrtValue* take(self, Py_ssize_t slot) noexcept:
        cdef ort.OrtValue* handle = NULL
        with cython.critical_section(self):
            if 0 <= slot < self.n_slots:
                handle = self.handles[slot]
                self.handles[slot] = NULL
        return handle

    cdef bint give_back(self, Py_ssize_t slot, ort.OrtValue* handle) noexcept:
        cdef bint kept = False
        with cython.critical_section(self):
            if not self.closed and 0 <= slot < self.n_slots and self.handles[slot] == NULL:
                self.handles[slot] = handle
                kept = True
        return kept

    cdef void adopt(self, OrtValue value, Py_ssize_t slot) noexcept:
        value.spares = self
        value.spare_slot = slot

    cdef void close(self) noexcept:
        cdef Py_ssize_t i
        cdef ort.OrtValue* handle
        with cython.critical_section(self):
            self.closed = True
        for i in range(self.n_slots):
            with cython.critical_section(self):
                handle = self.handles[i]
                self.handles[i] = NULL
            if handle != NULL:
                ort.ReleaseValue(handle)

    def _held(self):
        """How many slots hold a spare (for tests)."""
        cdef Py_ssize_t i, n = 0
        with cython.critical_section(self):
            for i in range(self.n_slots):
                n += self.handles[i] != NULL
        return n


cdef OrtValue wrap_value(ort.OrtValue* handle, object memory_owner, object session):
    cdef OrtValue value = OrtValue.__new__(OrtValue)
    value.handle = handle
    value.memory_owner = memory_owner
    value.session = session
    count_add(&_live[<int>HANDLE_VALUE], 1)
    return value


_INT64_MAX = 2**63 - 1
_SIZE_MAX = 2**64 - 1


def _checked_shape(shape, item_size=0):
    """`shape` as a list of ints: each >= 0, and the tensor (of `item_size`-byte elements, when
    known) small enough for onnxruntime to address."""
    if isinstance(shape, (str, bytes)):
        raise OrtInvalidType(f"shape must be a sequence of ints, got {shape!r}")
    try:
        dims = [_index(d) for d in shape]
    except TypeError as exc:
        raise OrtInvalidType(f"shape must be a sequence of ints, got {shape!r}") from exc
    count = 1
    for d in dims:
        if d < 0:
            raise OrtInvalidArgument(f"shape {dims} has a negative dimension")
        count *= d
    if count * max(item_size, 1) > _INT64_MAX or any([d > _INT64_MAX for d in dims]):
        raise OrtInvalidArgument(f"shape {dims} is too large: a tensor holds at most 2**63 - 1 "
                                 "elements and bytes")
    return dims


cdef OrtValue allocate_with(ort.OrtAllocator* allocator, list dims, int onnx_type, object owner):
    cdef int64_t stack_dims[MAX_INLINE_DIMS]
    cdef int64_t* shape_ptr = stack_dims
    cdef Py_ssize_t n = len(dims), i
    cdef ort.OrtValue* handle = NULL
    if n > MAX_INLINE_DIMS:
        shape_ptr = <int64_t*>malloc(n * sizeof(int64_t))
        if shape_ptr == NULL:
            raise MemoryError()
    cdef ort.OrtStatus* status
    try:
        for i in range(n):
            shape_ptr[i] = dims[i]
        with nogil:
            status = ort.CreateTensorAsOrtValue(allocator, shape_ptr, <size_t>n,
                                                <ort.ONNXTensorElementDataType>onnx_type, &handle)
    finally:
        if shape_ptr != stack_dims:
            free(shape_ptr)
    if status != NULL:
        try:
            check(status)
        except OrtError as exc:
            # onnxruntime's own words (bad_alloc, an overflow) do not say which tensor.
            raise type(exc)(f"cannot allocate a {tensor_type_name(onnx_type)} tensor of shape "
                            f"{dims}: {exc}", exc.code) from exc
    return wrap_value(handle, owner, None)



cdef OrtValue value_over_memory(void* data, object dims, int elem_type, OrtDevice device,
                                object owner, bint readonly):
    """A tensor over caller memory at `data` on `device` (never dereferenced here)."""
    if element_size(elem_type) == 0:             # strings, sub-byte and unknown types
        raise OrtInvalidArgument(f"cannot view memory as {tensor_type_name(elem_type)}")
    dims = _checked_shape(dims, element_size(elem_type))
    if data == NULL and 0 not in dims:
        raise OrtInvalidArgument(f"cannot create a {tensor_type_name(elem_type)} tensor of shape "
                                 f"{dims} over a NULL data pointer")
    cdef Py_ssize_t n = len(dims), i
    cdef int64_t stack_dims[MAX_INLINE_DIMS]
    cdef int64_t* shape_ptr = stack_dims
    cdef size_t count = 1
    cdef ort.OrtValue* handle = NULL
    cdef ort.OrtMemoryInfo* info = device.memory_info()
    cdef ort.OrtStatus* status
    if n > MAX_INLINE_DIMS:
        shape_ptr = <int64_t*>malloc(n * sizeof(int64_t))
        if shape_ptr == NULL:
            raise MemoryError()
    for i in range(n):
        shape_ptr[i] = dims[i]
        count *= <size_t>dims[i]
    status = ort.CreateTensorWithDataAsOrtValue(info, data, count * element_size(elem_type), shape_ptr,
                                                <size_t>n, <ort.ONNXTensorElementDataType>elem_type,
                                                &handle)
    if shape_ptr != stack_dims:
        free(shape_ptr)
    check(status)
    cdef OrtValue value = wrap_value(handle, owner, None)
    value.readonly = readonly
    return value


cdef list bound_output_values(ort.OrtIoBinding* binding, object session):
    """The output values an IoBinding holds, as new OrtValues (sharing the buffers) that keep
    `session` alive, in binding order."""
    cdef ort.OrtAllocator* allocator = NULL
    cdef ort.OrtValue** values = NULL
    cdef size_t count = 0, i
    check(ort.GetAllocatorWithDefaultOptions(&allocator))
    check(ort.GetBoundOutputValues(binding, allocator, &values, &count))
    cdef list result = []
    try:
        for i in range(count):
            result.append(wrap_value(values[i], None, session))
            values[i] = NULL
    finally:
        for i in range(count):
            if values[i] != NULL:
                ort.ReleaseValue(values[i])
        if values != NULL:
            check(ort.AllocatorFree(allocator, values))
    return result


cdef int keep_aliased_feeds_alive_c(list outputs, void** feed_data, PyObject** holders,
                                    Py_ssize_t n_feeds, object session, object skip) except -1:
    """onnxruntime may return a feed itself (a graph input that is also a graph output) or an
    alias of it (Identity, Reshape, ...) as an output sharing the feed's buffer. That buffer may
    be caller memory (a NumPy array, a value over caller memory) that only the feed kept alive:
    such an output keeps the feed's owner (`holders[j]`) alive too, and is read-only where the
    feed was. Outputs that are None or marked in `skip` are left alone."""
    cdef Py_ssize_t i, j
    cdef void* data
    cdef OrtValue value
    cdef object holder
    for i in range(len(outputs)):
        if outputs[i] is None or (skip is not None and skip[i]):
            continue
        value = outputs[i]
        if value.elem_type == 0:                 # described: not a tensor (or no value)
            continue
        data = value.data if value.elem_type > 0 else tensor_data(value.handle)
        if data == NULL:
            continue
        for j in range(n_feeds):
            if feed_data[j] == data and holders[j] != NULL:
                holder = <object>holders[j]
                value.memory_owner = holder
                if type(holder) is OrtValue:
                    value.readonly = value.readonly or (<OrtValue>holder).readonly
                elif npc.PyArray_API != NULL and npc.PyArray_Check(holder) and (
                        npc.PyArray_FLAGS(<npc.PyArrayObject*>holder) & npc.NPY_ARRAY_WRITEABLE) == 0:
                    value.readonly = True
                break
    return 0


cdef int keep_aliased_feeds_alive(list outputs, void** feed_data, Py_ssize_t n_feeds, object holders,
                                  object session, object skip) except -1:
    """keep_aliased_feeds_alive_c with the feeds' owners in a list."""
    cdef Py_ssize_t j
    cdef PyObject** array = <PyObject**>malloc((n_feeds + 1) * sizeof(PyObject*))
    if array == NULL:
        raise MemoryError()
    try:
        for j in range(n_feeds):
            array[j] = <PyObject*>holders[j] if holders[j] is not None else NULL
        return keep_aliased_feeds_alive_c(outputs, feed_data, array, n_feeds, session, skip)
    finally:
        free(array)




@cython.final
@cython.freelist(64)
@cython.no_gc_clear          # __dealloc__ reads the value
cdef class _ExportGuard:
    """Base object of NumPy views (and context of DLPack exports) of an OrtValue."""
    cdef OrtValue value

    def __dealloc__(self):
        cdef OrtValue value = self.value
        if value is not None:
            with cython.critical_section(value):
                value.exports -= 1
                value._release_if_unused()


cdef object export_guard(OrtValue value):
    cdef _ExportGuard guard = _ExportGuard.__new__(_ExportGuard)
    guard.value = value
    with cython.critical_section(value):
        value.exports += 1
    return guard


cdef object value_to_numpy(OrtValue value, bint tracked):
    ensure_numpy()
    npc.numpy_api()
    value.describe()
    if not value.is_tensor_value:
        raise OrtNotImplemented("this OrtValue is not a tensor; ortagent converts tensors only")
    if value.elem_type == ORTAGENT_ELEM_STRING:
        return strings_to_numpy(value.handle, _element_count(value), [value.dims[i] for i in range(value.ndim)])
    if value.memory_kind == MEMORY_CUDA or value.memory_kind == MEMORY_OTHER:
        return _device_value_to_numpy(value)
    cdef npc.npy_intp stack_dims[MAX_INLINE_DIMS]
    cdef npc.npy_intp* dims = stack_dims
    cdef int i
    cdef npc.PyArray_Descr* descr
    cdef int npy_type = npy_type_of(value.elem_type)
    if npy_type >= 0:
        descr = npc.PyArray_DescrFromType(npy_type)
    else:
        dtype = numpy_dtype_for(value.elem_type)
        Py_INCREF(dtype)
        descr = <npc.PyArray_Descr*>dtype
    if value.ndim > MAX_INLINE_DIMS:
        dims = <npc.npy_intp*>malloc(value.ndim * sizeof(npc.npy_intp))
        if dims == NULL:
            raise MemoryError()
    for i in range(value.ndim):
        dims[i] = <npc.npy_intp>value.dims[i]
    cdef Py_ssize_t count = _element_count(value)
    cdef object array = None
    try:
        if count == 0 or value.data == NULL:
            # Nothing to view: NumPy allocates an empty array of the right shape.
            return npc.PyArray_NewFromDescr(&npc.PyArray_Type, descr, value.ndim, dims, NULL,
                                            NULL, 0, NULL)
        array = npc.PyArray_NewFromDescr(
            &npc.PyArray_Type, descr, value.ndim, dims, NULL, value.data,
            npc.NPY_ARRAY_CARRAY_RO if value.readonly else npc.NPY_ARRAY_CARRAY, NULL)
    finally:
        if dims != stack_dims:
            free(dims)
    if tracked:
        base = export_guard(value)
    else:
        with cython.critical_section(value):
            value.exports += 1   # pinned: close() defers to deallocation
        base = value
    Py_INCREF(base)
    npc.PyArray_SetBaseObject(<npc.PyArrayObject*>array, <PyObject*>base)
    return array



cdef int copy_value_tensors(list sources, list destinations) except -1:
    """Copy tensors pairwise with OrtApi::CopyTensors (synchronous, no stream)."""
    cdef Py_ssize_t n = len(sources), i
    cdef OrtValue source, destination
    if n != len(destinations):
        raise OrtInvalidArgument("copy_tensors needs as many destinations as sources")
    for i in range(n):
        source = sources[i]
        destination = destinations[i]
        source.describe()
        destination.describe()
        if not source.is_tensor_value or not destination.is_tensor_value:
            raise OrtNotImplemented("only tensors can be copied")
        if source.elem_type != destination.elem_type:
            raise OrtInvalidArgument(f"cannot copy {tensor_type_name(source.elem_type)} into "
                                     f"{tensor_type_name(destination.elem_type)}")
        if source.shape() != destination.shape():
            raise OrtInvalidArgument(f"cannot copy shape {source.shape()} into {destination.shape()}")
        if destination.readonly:
            raise OrtInvalidArgument("the destination views read-only memory")
    cdef const ort.OrtValue** src = <const ort.OrtValue**>malloc(max(n, 1) * sizeof(void*))
    cdef ort.OrtValue** dst = <ort.OrtValue**>malloc(max(n, 1) * sizeof(void*))
    cdef ort.OrtStatus* status
    cdef ort.OrtEnv* env = shared_runtime().env
    if src == NULL or dst == NULL:
        free(src)
        free(dst)
        raise MemoryError()
    cdef list used = []                 # close() of any of them waits for the copy
    try:
        for i in range(n):
            for value in (sources[i], destinations[i]):
                (<OrtValue>value).begin_use()
                used.append(value)
            src[i] = (<OrtValue>sources[i]).handle
            dst[i] = (<OrtValue>destinations[i]).handle
        with nogil:
            status = ort.CopyTensors(env, src, dst, NULL, <size_t>n)
    finally:
        free(src)
        free(dst)
        for value in used:
            (<OrtValue>value).end_use()
    if status != NULL:
        # onnxruntime's module calls this through its C++ wrapper, whose errors carry the
        # status's message alone (no "[ONNXRuntimeError] : ..." in front)
        raise_status(status, False)
    return 0


# ---- device values (CUDA): through _device.pxi ---------------------------------------------------

def _device_value_from_numpy(numpy_obj, device):
    return device_from_host(numpy_module().asarray(numpy_obj), device)


def _allocate_device_value(dims, onnx_type, device):
    return device_allocate(dims, onnx_type, device)


def _update_device_value(value, np_arr):
    source = OrtValue.ortvalue_from_numpy(numpy_module().asarray(np_arr))
    if source.shape() != value.shape() or source.element_type() != value.element_type():
        raise OrtInvalidArgument(f"update_inplace: {source!r} does not match {value!r}")
    device_copy(source, value)


cdef object _device_value_to_numpy(OrtValue value):
    if value.memory_kind != MEMORY_CUDA:
        raise OrtNotImplemented(f"ortagent cannot read memory of {value!r}")
    return device_to_host(value)


cdef int require_ort_value(object value, str what) except -1:
    if not isinstance(value, OrtValue):
        raise OrtInvalidType(f"{what} must be an ortagent.OrtValue, got {type(value).__name__}")
    return 0
