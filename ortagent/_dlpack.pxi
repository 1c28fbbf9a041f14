"""DLPack exchange for OrtValue: ``__dlpack__``, ``__dlpack_device__`` and ``from_dlpack``.

Both directions are zero-copy and O(1): a capsule describes the value's own memory, and an
imported tensor becomes an OrtValue over the producer's memory. Nothing here dereferences the
data pointer, so CUDA buffers are handled the same way as host buffers.

Export (``OrtValue.__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)``)
    * ``max_version`` None (or a major version below 1): a legacy ``"dltensor"`` capsule
      (``DLManagedTensor``). ``max_version`` with major >= 1: a ``"dltensor_versioned"`` capsule
      (``DLManagedTensorVersioned``, version 1.0) whose flags carry READ_ONLY when the value
      views read-only memory (``OrtValue.readonly``, e.g. a non-writeable NumPy array) and
      IS_COPIED when the capsule describes a copy. A legacy capsule cannot say "read-only": a
      read-only value is then exported as a copy (``copy=None``) or refused (``copy=False``).
    * Devices come from the value's memory kind (the memory description's name, never the
      device type alone): CPU -> kDLCPU, CUDA -> kDLCUDA with its device id, CUDA pinned
      (page-locked, host-accessible) memory -> kDLCUDAHost.
    * ``dl_device`` None or equal to the value's device: no change. ``(kDLCPU, 0)`` for a
      pinned value: the same bytes, described as kDLCPU (pinned memory is host memory). For a
      CUDA value, ``(kDLCPU, 0)`` is a copy to the host, made when ``copy`` is True or None;
      ``copy=False`` refuses. Any other device: DLPackError (a BufferError).
    * ``copy=True`` always exports a copy (a host copy for CPU and pinned values, a copy on the
      same CUDA device for CUDA values, a host copy when moving to kDLCPU); ``copy=False`` never
      copies (DLPackError where a copy would be needed); ``None`` copies only when needed.
    * Element types: bool is kDLBool (8 bits), float16 kDLFloat 16, bfloat16 kDLBfloat 16,
      signed/unsigned integers, float32/64 and complex64/128 (kDLComplex 64/128). Strings,
      float8 and 4-bit types have no DLPack 1.0 code: DLPackError.
    * Shapes come with explicit C-contiguous strides (older NumPy needs them). A zero-size
      tensor may carry a NULL data pointer: NumPy and torch accept that.
    * ``stream``: for CPU values only None or -1. For CUDA (and pinned) values None, -1, 1
      (legacy default stream), 2 (per-thread default stream) or a cudaStream_t handle; 0 is
      ambiguous and refused, as the array API standard says. ortagent performs no
      synchronization on export, for any stream: onnxruntime's CUDA execution provider
      synchronizes its compute stream at the end of every Run (unless the run configuration
      ``disable_synchronize_execution_providers`` is "1"), so the data of every value that
      Run or IOBinding hands out is complete when the call returns, and safe to read on any
      stream. With ``disable_synchronize_execution_providers=1`` that guarantee moves to
      ``IOBinding.synchronize_outputs()``, which ortagent's IOBinding calls before it hands
      output values out; values obtained any other way under that setting are the caller's
      to synchronize before exporting them.

Ownership
    The capsule's manager context holds an export guard of the value: while a capsule (or the
    tensor a consumer built from it) lives, the memory stays valid, and ``value.close()`` only
    marks the value closed; the ORT handle is released when the last export is gone. The
    deleter may run on any thread, with or without the GIL (it takes the GIL itself); when the
    interpreter is finalizing it returns at once and leaks the export instead of touching
    Python state. A capsule that is never consumed releases its export when it is collected
    (its destructor calls the deleter only while the capsule still has its unconsumed name).
    Live exports are counted in ``ortagent.live_handles()["dlpack_export"]``.

Import (``from_dlpack(obj, *, stream=None)``)
    ``obj`` is any object with ``__dlpack__`` or a PyCapsule named ``"dltensor"`` or
    ``"dltensor_versioned"``. Producers are asked for ``__dlpack__(stream=..., max_version=(1,
    0))``, and for ``__dlpack__(stream=...)`` when they reject ``max_version`` (TypeError).
    When ``stream`` is given, ``__dlpack_device__()`` decides what is passed: None to host
    producers (kDLCPU, kDLCUDAHost), the caller's ``stream`` to CUDA producers.

    What ``stream`` means on import: it names the stream on which the data will be read, and
    the producer makes its pending work visible to that stream (or does nothing for -1). The
    default, None, stands for the legacy default stream in the standard's words, and producers
    differ in what they do with it (some synchronize nothing). ortagent synchronizes nothing
    either, while onnxruntime's CUDA provider reads inputs on its own compute stream. So before
    a Run reads an imported CUDA tensor, the caller makes sure the producer's work is complete
    (e.g. ``torch.cuda.current_stream().synchronize()``), or runs the CUDA provider on the
    producer's stream (provider option ``user_compute_stream``), or passes the handle of the
    stream onnxruntime computes on as ``stream``. ``stream`` cannot be given with a raw
    capsule (the capsule has been produced already).

    The capsule is marked consumed (renamed ``"used_dltensor[_versioned]"``) and the new
    OrtValue owns a holder that calls the producer's deleter exactly once, when the value (and
    every view or export of it) is gone. Accepted: C-contiguous tensors (NULL strides, or
    strides in C order; extents of 1 and zero-size tensors have free strides), one lane of the
    element types above, devices kDLCPU, kDLCUDA (with its id) and kDLCUDAHost (cuda_pinned).
    A versioned capsule flagged READ_ONLY gives a read-only OrtValue. Anything else is a
    DLPackError, raised before the capsule is touched, so its producer still owns it.
"""

cimport cython
from cpython.exc cimport PyErr_Clear
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, strcmp, strncmp

from ortagent cimport _capi as ort
from ortagent._element_types cimport *
from ortagent._runtime cimport check, shared_runtime, live_handle_counts, count_add, HANDLE_DLPACK_EXPORT

from operator import index as _index

from ortagent.errors import DLPackError, OrtError, OrtInvalidType



cdef extern from "Python.h":
    # Declared over PyObject* so that the capsule destructor never touches reference counts
    # (it runs while the capsule is being deallocated).
    ctypedef void (*PyCapsule_Destructor)(PyObject*)
    object PyCapsule_New(void* pointer, const char* name, PyCapsule_Destructor destructor)
    bint PyCapsule_CheckExact(object o)
    int capsule_is_valid "PyCapsule_IsValid"(PyObject* capsule, const char* name) noexcept
    void* capsule_pointer "PyCapsule_GetPointer"(PyObject* capsule, const char* name) noexcept
    const char* capsule_name "PyCapsule_GetName"(PyObject* capsule) noexcept
    int capsule_set_name "PyCapsule_SetName"(PyObject* capsule, const char* name) noexcept


cdef extern from *:
    """
    /* True once Python can no longer be entered safely: not initialized, or finalizing. */
    static int ortagent_interpreter_gone(void) {
    #if PY_VERSION_HEX >= 0x030D0000
        return !Py_IsInitialized() || Py_IsFinalizing();
    #else
        return !Py_IsInitialized() || _Py_IsFinalizing();
    #endif
    }
    """
    int ortagent_interpreter_gone() noexcept nogil


cdef extern from *:
    """
    /* The calling thread's pending exception, set aside while a deleter runs Python code. */
    typedef struct { PyObject *type, *value, *traceback; } ortagent_saved_error;
    static void ortagent_save_error(ortagent_saved_error* saved) {
    #if PY_VERSION_HEX >= 0x030C0000
        saved->type = saved->traceback = NULL;
        saved->value = PyErr_GetRaisedException();
    #else
        PyErr_Fetch(&saved->type, &saved->value, &saved->traceback);
    #endif
    }
    static void ortagent_restore_error(ortagent_saved_error* saved) {
    #if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(saved->value);
    #else
        PyErr_Restore(saved->type, saved->value, saved->traceback);
    #endif
    }
    """
    ctypedef struct ortagent_saved_error:
        pass
    void ortagent_save_error(ortagent_saved_error* saved) noexcept
    void ortagent_restore_error(ortagent_saved_error* saved) noexcept


# ---- element types ---------------------------------------------------------------------------

# The element types' DLPack codes, bits and sizes come from the one table
# (include/ortagent/element_types.h, through ortagent._element_types).
_DL_CODE_NAMES = {0: "kDLInt", 1: "kDLUInt", 2: "kDLFloat", 3: "kDLOpaqueHandle",
                  4: "kDLBfloat", 5: "kDLComplex", 6: "kDLBool"}
_DL_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
                    8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev",
                    13: "kDLCUDAManaged", 14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon",
                    17: "kDLMAIA"}


cdef inline int _onnx_type_for(ortagent_dl_data_type dtype) noexcept nogil:
    """The ONNX element type of a DLPack data type, -1 when ortagent has none for it."""
    cdef int elem_type
    cdef const ortagent_element_info* info
    if dtype.lanes != 1:
        return -1
    for elem_type in range(1, <int>ORTAGENT_ELEM_COUNT):
        info = ortagent_element_info_of(elem_type)
        if info.dl_bits != 0 and info.dl_bits == dtype.bits and info.dl_code == dtype.code:
            return elem_type
    return -1


cdef str _dtype_text(ortagent_dl_data_type dtype):
    code = _DL_CODE_NAMES.get(dtype.code, f"code {dtype.code}")
    return f"{code} with {dtype.bits} bits and {dtype.lanes} lane{'s' if dtype.lanes != 1 else ''}"


cdef str _device_text(int device_type, int device_id):
    return f"{_DL_DEVICE_NAMES.get(device_type, f'device type {device_type}')}:{device_id}"


# ---- export ----------------------------------------------------------------------------------

cdef void _drop_export(void* manager_ctx) noexcept:
    """Release one export's context (GIL held; any pending exception is preserved)."""
    cdef ortagent_saved_error saved
    ortagent_save_error(&saved)
    Py_XDECREF(<PyObject*>manager_ctx)
    count_add(&_live[<int>HANDLE_DLPACK_EXPORT], -1)
    ortagent_restore_error(&saved)


cdef void _delete_legacy(ortagent_dl_managed_tensor* managed) noexcept nogil:
    """The deleter of exported DLManagedTensors: callable from any thread, GIL held or not."""
    if managed == NULL or ortagent_interpreter_gone():
        return      # after finalization: leak rather than touch a dead interpreter
    with gil:
        _drop_export(managed.manager_ctx)
    free(managed)


cdef void _delete_versioned(ortagent_dl_managed_tensor_versioned* managed) noexcept nogil:
    """The deleter of exported DLManagedTensorVersioned (same rules as _delete_legacy)."""
    if managed == NULL or ortagent_interpreter_gone():
        return
    with gil:
        _drop_export(managed.manager_ctx)
    free(managed)


cdef void _legacy_capsule_destructor(PyObject* capsule) noexcept:
    # Consumed capsules are renamed "used_dltensor": their consumer owns the tensor now.
    cdef ortagent_dl_managed_tensor* managed
    if capsule_is_valid(capsule, ORTAGENT_DLPACK_CAPSULE):
        managed = <ortagent_dl_managed_tensor*>capsule_pointer(capsule, ORTAGENT_DLPACK_CAPSULE)
        if managed != NULL and managed.deleter != NULL:
            managed.deleter(managed)


cdef void _versioned_capsule_destructor(PyObject* capsule) noexcept:
    cdef ortagent_dl_managed_tensor_versioned* managed
    if capsule_is_valid(capsule, ORTAGENT_DLPACK_VERSIONED_CAPSULE):
        managed = <ortagent_dl_managed_tensor_versioned*>capsule_pointer(
            capsule, ORTAGENT_DLPACK_VERSIONED_CAPSULE)
        if managed != NULL and managed.deleter != NULL:
            managed.deleter(managed)


cdef object _new_capsule(void* data, int device_type, int device_id, int ndim,
                         const int64_t* dims, int elem_type, object context, bint versioned,
                         uint64_t flags):
    """A capsule describing `data` (C-contiguous, `dims`, `elem_type`); `context` is kept
    alive until the deleter runs. One allocation holds the struct, the shape and the strides."""
    cdef size_t header = (sizeof(ortagent_dl_managed_tensor_versioned) if versioned
                          else sizeof(ortagent_dl_managed_tensor))
    header = (header + 7) & ~(<size_t>7)
    cdef char* block = <char*>malloc(header + 2 * <size_t>ndim * sizeof(int64_t))
    if block == NULL:
        raise MemoryError()
    cdef ortagent_dl_managed_tensor_versioned* versioned_tensor = NULL
    cdef ortagent_dl_managed_tensor* legacy_tensor = NULL
    cdef ortagent_dl_tensor* tensor
    if versioned:
        versioned_tensor = <ortagent_dl_managed_tensor_versioned*>block
        versioned_tensor.version.major = ORTAGENT_DLPACK_MAJOR_VERSION
        versioned_tensor.version.minor = ORTAGENT_DLPACK_MINOR_VERSION
        versioned_tensor.manager_ctx = <void*>context
        versioned_tensor.deleter = _delete_versioned
        versioned_tensor.flags = flags
        tensor = &versioned_tensor.dl_tensor
    else:
        legacy_tensor = <ortagent_dl_managed_tensor*>block
        legacy_tensor.manager_ctx = <void*>context
        legacy_tensor.deleter = _delete_legacy
        tensor = &legacy_tensor.dl_tensor
    cdef int64_t* shape = <int64_t*>(block + header)
    cdef int64_t* strides = shape + ndim
    cdef int64_t step = 1
    cdef int i
    for i in range(ndim - 1, -1, -1):
        shape[i] = dims[i]
        strides[i] = step
        step *= dims[i] if dims[i] > 1 else 1
    tensor.data = data
    tensor.device.device_type = <ortagent_dl_device_type>device_type
    tensor.device.device_id = device_id
    tensor.ndim = ndim
    cdef const ortagent_element_info* info = ortagent_element_info_of(elem_type)
    tensor.dtype.code = info.dl_code
    tensor.dtype.bits = info.dl_bits
    tensor.dtype.lanes = 1
    tensor.shape = shape
    tensor.strides = strides
    tensor.byte_offset = 0
    Py_INCREF(context)
    try:
        if versioned:
            capsule = PyCapsule_New(block, ORTAGENT_DLPACK_VERSIONED_CAPSULE,
                                    _versioned_capsule_destructor)
        else:
            capsule = PyCapsule_New(block, ORTAGENT_DLPACK_CAPSULE, _legacy_capsule_destructor)
    except BaseException:
        Py_XDECREF(<PyObject*>context)
        free(block)
        raise
    count_add(&_live[<int>HANDLE_DLPACK_EXPORT], 1)
    return capsule


@cython.final
cdef class _HostCopy:
    """A malloc-ed host buffer: the manager context of an exported copy."""
    cdef void* data

    def __dealloc__(self):
        free(self.data)
        self.data = NULL


cdef inline size_t _byte_size(OrtValue value) noexcept:
    cdef size_t count = 1
    cdef int i
    for i in range(value.ndim):
        count *= <size_t>value.dims[i]
    return count * <size_t>ortagent_element_info_of(value.elem_type).item_size


cdef object _host_copy(OrtValue value, void** data):
    """A host copy of a host-accessible (CPU or pinned) value's bytes."""
    cdef size_t nbytes = _byte_size(value)
    cdef _HostCopy buffer = _HostCopy.__new__(_HostCopy)
    buffer.data = malloc(nbytes if nbytes else 1)
    if buffer.data == NULL:
        raise MemoryError()
    if nbytes:
        value.begin_use()                # close() on another thread waits for the copy
        try:
            with nogil:
                memcpy(buffer.data, value.data, nbytes)
        finally:
            value.end_use()
    data[0] = buffer.data
    return buffer


cdef object _device_to_host_copy(OrtValue value, void** data):
    """A host copy of a CUDA value (through the values module's device-to-NumPy copy)."""
    try:
        array = value_to_numpy(value, False)
    except OrtError as exc:
        raise DLPackError(f"cannot copy the CUDA tensor to the host for DLPack: {exc}") from exc
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    data[0] = <void*><uintptr_t>array.__array_interface__["data"][0]
    return array


cdef object _device_copy(OrtValue value, void** data):
    """A copy of a CUDA value on its own device; returns the export context of the copy."""
    cdef OrtValue twin
    try:
        twin = OrtValue.ortvalue_from_shape_and_type(
            [value.dims[i] for i in range(value.ndim)], value.elem_type, "cuda", value.device_id)
        copy_value_tensors([value], [twin])
        twin.describe()
    except OrtError as exc:
        raise DLPackError(f"cannot copy the CUDA tensor on its device for DLPack: {exc}") from exc
    data[0] = twin.data
    return export_guard(twin)


cdef inline int _dl_device_type(OrtValue value) noexcept:
    if value.memory_kind == MEMORY_CPU:
        return ORTAGENT_DL_CPU
    if value.memory_kind == MEMORY_CUDA:
        return ORTAGENT_DL_CUDA
    if value.memory_kind == MEMORY_CUDA_PINNED:
        return ORTAGENT_DL_CUDA_HOST
    return 0


cdef OrtValue _exportable(object value):
    if not isinstance(value, OrtValue):
        raise OrtInvalidType(f"expected an OrtValue, got {type(value).__name__}")
    cdef OrtValue v = <OrtValue>value
    v.describe()
    if not v.is_tensor_value:
        raise DLPackError("this OrtValue is not a tensor; DLPack carries tensors only")
    if _dl_device_type(v) == 0:
        raise DLPackError(f"this OrtValue lives on a device DLPack export does not support "
                          f"({v.device_name()})")
    return v


cdef int _check_stream(object stream, int memory_kind) except -1:
    if stream is None:
        return 0
    if type(stream) is bool or not isinstance(stream, int):
        raise DLPackError(f"stream must be None or an int, got {type(stream).__name__}")
    if memory_kind == MEMORY_CPU:
        if stream == -1:
            return 0
        raise DLPackError(f"stream must be None (or -1) for a CPU tensor, got {stream}")
    if stream == 0:
        raise DLPackError("stream 0 is ambiguous for CUDA and not allowed by the DLPack protocol: "
                          "use 1 (legacy default stream), 2 (per-thread default stream), -1 (no "
                          "synchronization) or a cudaStream_t handle")
    if stream < -1:
        raise DLPackError(f"invalid CUDA stream {stream}")
    return 0


def value_device(value):
    """``__dlpack_device__()`` of an OrtValue: (DLPack device type, device id)."""
    cdef OrtValue v = _exportable(value)
    return (_dl_device_type(v), v.device_id if v.memory_kind != MEMORY_CPU else 0)


def export_value(value, *, stream=None, max_version=None, dl_device=None, copy=None):
    """``__dlpack__`` of an OrtValue: a DLPack capsule over its memory (or over a copy), as the
    module docstring describes."""
    cdef OrtValue v = _exportable(value)
    cdef int device_type = _dl_device_type(v)
    cdef int device_id = v.device_id if v.memory_kind != MEMORY_CPU else 0
    cdef bint versioned = False
    cdef bint must_copy = False
    cdef bint to_host = False
    cdef uint64_t flags = 0
    cdef void* data = v.data
    cdef const ortagent_element_info* info = ortagent_element_info_of(v.elem_type)
    if info == NULL or info.dl_bits == 0:
        raise DLPackError(f"{tensor_type_name(v.elem_type)} has no DLPack data type")
    _check_stream(stream, v.memory_kind)
    if max_version is not None:
        try:
            if isinstance(max_version, (str, bytes)) or len(max_version) != 2:
                raise TypeError
            versioned = _index(max_version[0]) >= 1
        except (TypeError, IndexError, KeyError) as exc:
            raise DLPackError(f"max_version must be a (major, minor) tuple, got "
                              f"{max_version!r}") from exc
    if copy is not None and copy is not True and copy is not False:
        raise DLPackError(f"copy must be True, False or None, got {copy!r}")
    if dl_device is not None:
        try:
            if len(dl_device) != 2:
                raise TypeError
            wanted_type = _index(dl_device[0])
            wanted_id = _index(dl_device[1])
        except (TypeError, IndexError, KeyError) as exc:
            raise DLPackError(f"dl_device must be a (device type, device id) tuple, got "
                              f"{dl_device!r}") from exc
        if wanted_type != device_type or wanted_id != device_id:
            if wanted_type == ORTAGENT_DL_CPU and wanted_id == 0:
                if v.memory_kind == MEMORY_CUDA_PINNED:
                    device_type, device_id = ORTAGENT_DL_CPU, 0     # host memory already
                elif copy is False:
                    raise DLPackError(
                        f"exporting this {_device_text(device_type, device_id)} tensor to the "
                        "CPU needs a copy, and copy=False forbids it")
                else:
                    to_host = True
            else:
                raise DLPackError(
                    f"cannot export a {_device_text(device_type, device_id)} tensor to "
                    f"{_device_text(wanted_type, wanted_id)}: ortagent moves data only to the "
                    "CPU (with a copy)")
    if v.readonly and not versioned and not to_host and copy is not True:
        # A legacy capsule cannot say "read-only": hand out a copy rather than writable memory.
        if copy is False:
            raise DLPackError("this OrtValue views read-only memory, which a legacy (unversioned) "
                              "DLPack capsule cannot signal; pass max_version=(1, 0) or allow a "
                              "copy")
        must_copy = True
    if copy is True:
        must_copy = True

    if to_host:
        context = _device_to_host_copy(v, &data)
        device_type, device_id = ORTAGENT_DL_CPU, 0
        flags = ORTAGENT_DLPACK_FLAG_IS_COPIED
    elif must_copy:
        if v.memory_kind == MEMORY_CUDA:
            context = _device_copy(v, &data)
        else:
            context = _host_copy(v, &data)
            device_type, device_id = ORTAGENT_DL_CPU, 0
        flags = ORTAGENT_DLPACK_FLAG_IS_COPIED
    else:
        context = export_guard(v)
        if v.readonly:
            flags = ORTAGENT_DLPACK_FLAG_READ_ONLY
    return _new_capsule(data, device_type, device_id, v.ndim, v.dims, v.elem_type, context,
                        versioned, flags)


# ---- import ----------------------------------------------------------------------------------

@cython.final
@cython.freelist(32)
cdef class _DLPackImport:
    """Owner of a consumed DLPack tensor: calls the producer's deleter once, when it dies."""
    cdef void* managed
    cdef bint versioned

    def __dealloc__(self):
        cdef void* managed = self.managed
        self.managed = NULL
        if managed == NULL:
            return
        if self.versioned:
            if (<ortagent_dl_managed_tensor_versioned*>managed).deleter != NULL:
                (<ortagent_dl_managed_tensor_versioned*>managed).deleter(
                    <ortagent_dl_managed_tensor_versioned*>managed)
        elif (<ortagent_dl_managed_tensor*>managed).deleter != NULL:
            (<ortagent_dl_managed_tensor*>managed).deleter(<ortagent_dl_managed_tensor*>managed)


# OrtDevice per (DLPack device type, id), made once.
cdef dict _dlpack_devices = {}

cdef OrtDevice _device_for(int device_type, int device_id):
    key = (device_type, device_id)
    device = _dlpack_devices.get(key)
    if device is not None:
        return <OrtDevice>device
    if device_id < 0:
        raise DLPackError(f"invalid DLPack device id {device_id}")
    if device_type == ORTAGENT_DL_CPU:
        device = OrtDevice(0, 0, 0)
    elif device_type == ORTAGENT_DL_CUDA:
        device = OrtDevice(1, 0, device_id)
    elif device_type == ORTAGENT_DL_CUDA_HOST:
        device = OrtDevice(0, 1, device_id)
    else:
        raise DLPackError(f"DLPack device {_device_text(device_type, device_id)} is not supported: "
                          "ortagent imports kDLCPU, kDLCUDA and kDLCUDAHost tensors")
    _dlpack_devices[key] = device
    return <OrtDevice>device


cdef object _capsule_from(object obj, object stream):
    """Ask a producer for a capsule, passing the stream its device allows."""
    try:
        export = obj.__dlpack__
    except AttributeError:
        raise OrtInvalidType(f"{type(obj).__name__} does not support DLPack (no __dlpack__ "
                             "method), and is not a DLPack capsule") from None
    call_stream = None
    cdef int device_type
    if stream is not None:
        # Only CUDA producers take a stream; host producers must get None.
        device_of = getattr(obj, "__dlpack_device__", None)
        if device_of is None:
            call_stream = stream
        else:
            device_type = _producer_device(obj, device_of)
            if device_type == ORTAGENT_DL_CUDA:
                call_stream = stream
    try:
        try:
            return export(stream=call_stream, max_version=(1, 0))
        except TypeError:
            # A producer that predates DLPack 1.0 keywords.
            return export(stream=call_stream)
    except (OrtError, MemoryError):
        raise
    except Exception as exc:
        # Whatever the producer raised, the exchange failed: one exception type for callers.
        raise DLPackError(f"{type(obj).__name__}.__dlpack__ failed: {type(exc).__name__}: {exc}") from exc


cdef int _producer_device(object obj, object device_of) except -1:
    """The DLPack device type a producer's ``__dlpack_device__()`` reports, checked to be one
    ortagent imports (DLPackError otherwise, also for a malformed answer)."""
    try:
        device = device_of()
    except (OrtError, MemoryError):
        raise
    except Exception as exc:
        raise DLPackError(f"{type(obj).__name__}.__dlpack_device__ failed: {type(exc).__name__}: "
                          f"{exc}") from exc
    try:
        if isinstance(device, (str, bytes)) or len(device) != 2:
            raise TypeError
        device_type = _index(device[0])
        device_id = _index(device[1])
    except (TypeError, IndexError, KeyError) as exc:
        raise DLPackError(f"{type(obj).__name__}.__dlpack_device__() must return a (device type, "
                          f"device id) pair of ints, got {device!r}") from exc
    if not (-2**31 <= device_type < 2**31 and -2**31 <= device_id < 2**31):
        raise DLPackError(f"{type(obj).__name__}.__dlpack_device__() returned an out-of-range "
                          f"device {device!r}")
    _device_for(device_type, device_id)      # refuse unsupported devices early
    return device_type


cdef OrtValue _import_capsule(object capsule, bint as_bool=False):
    if not PyCapsule_CheckExact(capsule):
        raise DLPackError(f"__dlpack__ returned a {type(capsule).__name__}, not a DLPack capsule")
    cdef PyObject* raw = <PyObject*>capsule
    cdef const char* name = capsule_name(raw)
    cdef bint versioned
    if name == NULL:
        PyErr_Clear()
        raise DLPackError("not a DLPack capsule (the capsule has no name)")
    if strcmp(name, ORTAGENT_DLPACK_VERSIONED_CAPSULE) == 0:
        versioned = True
    elif strcmp(name, ORTAGENT_DLPACK_CAPSULE) == 0:
        versioned = False
    elif strncmp(name, b"used_", 5) == 0:
        raise DLPackError(f"this DLPack capsule was already consumed (its name is "
                          f"{name.decode('utf-8', 'replace')!r}); a capsule can be imported "
                          "only once: ask the producer for a new one")
    else:
        raise DLPackError(f"not a DLPack capsule: its name is {name.decode('utf-8', 'replace')!r}, "
                          "expected 'dltensor' or 'dltensor_versioned'")
    cdef void* managed = capsule_pointer(raw, name)
    if managed == NULL:
        PyErr_Clear()
        raise DLPackError("the DLPack capsule holds no tensor")
    cdef ortagent_dl_tensor* tensor
    cdef bint readonly = False
    cdef ortagent_dl_managed_tensor_versioned* versioned_tensor
    if versioned:
        versioned_tensor = <ortagent_dl_managed_tensor_versioned*>managed
        if versioned_tensor.version.major != ORTAGENT_DLPACK_MAJOR_VERSION:
            raise DLPackError(
                f"DLPack {versioned_tensor.version.major}.{versioned_tensor.version.minor} "
                f"tensors are not supported: ortagent reads DLPack "
                f"{ORTAGENT_DLPACK_MAJOR_VERSION}.x")
        readonly = (versioned_tensor.flags & ORTAGENT_DLPACK_FLAG_READ_ONLY) != 0
        tensor = &versioned_tensor.dl_tensor
    else:
        tensor = &(<ortagent_dl_managed_tensor*>managed).dl_tensor

    # Check everything before taking the capsule over: on error the producer keeps it.
    cdef int elem_type = _onnx_type_for(tensor.dtype)
    if elem_type < 0:
        raise DLPackError(f"DLPack data type {_dtype_text(tensor.dtype)} is not supported")
    if as_bool and elem_type == ORTAGENT_ELEM_UINT8:
        # onnxruntime's is_bool_tensor: booleans that travelled as uint8 (one byte each); it
        # leaves other types as they are
        elem_type = ORTAGENT_ELEM_BOOL
    cdef OrtDevice device = _device_for(tensor.device.device_type, tensor.device.device_id)
    cdef int ndim = tensor.ndim
    if ndim < 0 or (ndim > 0 and tensor.shape == NULL):
        raise DLPackError(f"malformed DLPack tensor (ndim {ndim}, shape "
                          f"{'NULL' if tensor.shape == NULL else 'set'})")
    cdef size_t item = <size_t>ortagent_element_info_of(elem_type).item_size
    cdef size_t count = 1
    cdef int64_t expected = 1
    cdef bint empty = False
    cdef bint contiguous = True
    cdef int i
    for i in range(ndim):
        if tensor.shape[i] < 0:
            raise DLPackError(f"DLPack tensor has a negative extent: shape "
                              f"{[tensor.shape[j] for j in range(ndim)]}")
        if tensor.shape[i] == 0:
            empty = True
    if tensor.strides != NULL and not empty:
        for i in range(ndim - 1, -1, -1):
            if tensor.shape[i] != 1 and tensor.strides[i] != expected:
                contiguous = False
                break
            expected *= tensor.shape[i]
        if not contiguous:
            raise DLPackError(
                f"only C-contiguous DLPack tensors can be viewed: shape "
                f"{[tensor.shape[j] for j in range(ndim)]} has strides "
                f"{[tensor.strides[j] for j in range(ndim)]} (in elements); make the tensor "
                "contiguous first (e.g. .contiguous() or numpy.ascontiguousarray)")
    for i in range(ndim):
        if tensor.shape[i] and count > (<size_t>-1) // item // <size_t>tensor.shape[i]:
            raise DLPackError("DLPack tensor is too large to address")
        count *= <size_t>tensor.shape[i]
    if count and tensor.data == NULL:
        raise DLPackError(f"DLPack tensor of shape {[tensor.shape[j] for j in range(ndim)]} has a NULL "
                          "data pointer")
    cdef char* data = <char*>tensor.data + tensor.byte_offset
    if count and (<uintptr_t>data) % item != 0:
        raise DLPackError(f"DLPack tensor data at {<uintptr_t>data:#x} is not aligned to its "
                          f"{item}-byte elements")

    # The ORT tensor first: if onnxruntime refuses it, the producer still owns the capsule.
    cdef _DLPackImport holder = _DLPackImport.__new__(_DLPackImport)
    cdef ort.OrtMemoryInfo* info = device.memory_info()
    cdef ort.OrtValue* handle = NULL
    cdef ort.OrtStatus* status = ort.CreateTensorWithDataAsOrtValue(
        info, <void*>data, count * item, tensor.shape, <size_t>ndim,
        <ort.ONNXTensorElementDataType>elem_type, &handle)
    if status != NULL:
        try:
            check(status)
        except OrtError as exc:
            where = _device_text(tensor.device.device_type, tensor.device.device_id)
            raise DLPackError(f"onnxruntime cannot hold this DLPack tensor "
                              f"({_dtype_text(tensor.dtype)} on {where}): {exc}") from exc
    if capsule_set_name(raw, ORTAGENT_DLPACK_USED_VERSIONED_CAPSULE if versioned
                        else ORTAGENT_DLPACK_USED_CAPSULE) != 0:
        ort.ReleaseValue(handle)
        raise DLPackError("cannot mark the DLPack capsule as consumed")
    # The capsule is ours now: the holder calls the producer's deleter once, when it dies.
    holder.managed = managed
    holder.versioned = versioned
    cdef OrtValue value
    try:
        value = wrap_value(handle, holder, None)
    except BaseException:
        ort.ReleaseValue(handle)
        raise
    value.readonly = readonly
    return value


def from_dlpack(obj, is_bool_tensor=False, *, stream=None):
    """An OrtValue over the memory of `obj`: any object with ``__dlpack__`` or a DLPack capsule.
    No copy is made; see the module docstring for devices, dtypes, layouts and ``stream``.
    `is_bool_tensor` (onnxruntime's argument) reads a uint8 tensor as booleans."""
    if PyCapsule_CheckExact(obj):
        if stream is not None:
            raise DLPackError("stream cannot be applied to a DLPack capsule that has already "
                              "been produced; pass the producing object instead")
        return _import_capsule(obj, is_bool_tensor)
    return _import_capsule(_capsule_from(obj, stream), is_bool_tensor)


def is_dlpack_uint8_tensor(capsule):
    """Whether an unconsumed DLPack capsule holds uint8 data (booleans exported by onnxruntime
    travel as uint8, so its callers ask before importing with is_bool_tensor)."""
    if not PyCapsule_CheckExact(capsule):
        raise OrtInvalidType(f"expected a DLPack capsule, got {type(capsule).__name__}")
    cdef PyObject* raw = <PyObject*>capsule
    cdef const char* name = capsule_name(raw)
    cdef ortagent_dl_tensor* tensor
    if name == NULL:
        PyErr_Clear()
    if name != NULL and strcmp(name, ORTAGENT_DLPACK_VERSIONED_CAPSULE) == 0:
        tensor = &(<ortagent_dl_managed_tensor_versioned*>capsule_pointer(raw, name)).dl_tensor
    elif name != NULL and strcmp(name, ORTAGENT_DLPACK_CAPSULE) == 0:
        tensor = &(<ortagent_dl_managed_tensor*>capsule_pointer(raw, name)).dl_tensor
    else:
        raise DLPackError("not an unconsumed DLPack capsule")
    return _onnx_type_for(tensor.dtype) == ORTAGENT_ELEM_UINT8
