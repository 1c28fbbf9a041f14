"""Device memory through onnxruntime: allocating CUDA and CUDA-pinned tensors, and copying
between host and device, without any CUDA library of ortagent's own.

onnxruntime's C API hands out a device allocator only through a session that uses the device's
execution provider, so each CUDA device gets a small helper session (an Identity model on the
CUDA provider). Copies use OrtApi::CopyTensors where the runtime has it and a data transfer for
the devices is registered; otherwise they run that Identity model with an IoBinding whose input
is the source and whose output is bound to the destination, so onnxruntime performs the copy.
Pinned memory is host memory and is copied with NumPy.
"""

cimport cython
from ortagent cimport _capi as ort
from ortagent._element_types cimport ORTAGENT_ELEM_STRING
from ortagent._runtime cimport check, shared_runtime, live_handle_counts, count_add, HANDLE_ALLOCATOR
from ortagent.errors import OrtError, OrtInvalidArgument, OrtInvalidType, OrtNotImplemented, OrtEPFail


# Identity models by ONNX element type, serialized once.
_identity_models = {}
# device index -> _CudaDevice
_cuda_devices = {}
# Whether OrtApi::CopyTensors could copy between host and CUDA here (None: not tried yet).
_copy_tensors_works = [None]


def _identity_model(int elem_type):
    data = _identity_models.get(elem_type)
    if data is None:
        from onnx import helper
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "ortagent_copy",
                                  [helper.make_tensor_value_info("x", elem_type, None)],
                                  [helper.make_tensor_value_info("y", elem_type, None)])
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
        data = _identity_models[elem_type] = model.SerializeToString()
    return data


@cython.final
@cython.no_gc_clear          # __dealloc__ releases the allocator before its session goes
cdef class _Allocator:
    """An OrtAllocator created for a session; tensors it allocated keep it (and the session)
    alive, since onnxruntime only holds a plain pointer to it."""
    cdef ort.OrtAllocator* handle
    cdef object session

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseAllocator(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_ALLOCATOR], -1)


cdef class _CudaDevice:
    """Helper sessions and allocators of one CUDA device."""
    cdef int index
    cdef dict sessions          # element type -> InferenceSession (Identity on CUDA)
    cdef dict allocators        # MemoryKind -> _Allocator

    def __init__(self, int index):
        self.index = index
        self.sessions = {}
        self.allocators = {}

    cdef InferenceSession session_for(self, int elem_type):
        session = self.sessions.get(elem_type)
        if session is None:
            try:
                with strict_providers():        # a CPU session would hand out host memory
                    session = InferenceSession(_identity_model(elem_type), helper_options(), providers=[
                        ("CUDAExecutionProvider", {"device_id": str(self.index)})])
            except OrtError as exc:
                raise OrtEPFail(f"CUDA memory on device {self.index} needs a working CUDA execution "
                                f"provider: {exc}") from exc
            self.sessions[elem_type] = session
        return <InferenceSession>session

    cdef _Allocator allocator_for(self, OrtDevice device):
        holder = self.allocators.get(device.kind)
        if holder is None:
            session = self.session_for(1)
            holder = _Allocator.__new__(_Allocator)
            check(ort.CreateAllocator((<InferenceSession>session).handle, device.memory_info(),
                                      &(<_Allocator>holder).handle))
            count_add(&_live[<int>HANDLE_ALLOCATOR], 1)
            (<_Allocator>holder).session = session
            self.allocators[device.kind] = holder
        return <_Allocator>holder


cdef _CudaDevice _cuda_device(int index):
    device = _cuda_devices.get(index)
    if device is None:
        device = _cuda_devices[index] = _CudaDevice(index)
    return <_CudaDevice>device


def device_allocate(dims, int elem_type, OrtDevice device):
    """A new tensor allocated by onnxruntime on a CUDA device or in pinned host memory."""
    if device.kind not in (MEMORY_CUDA, MEMORY_CUDA_PINNED):
        raise OrtNotImplemented(f"ortagent cannot allocate on {device!r}")
    if elem_type == ORTAGENT_ELEM_STRING:
        raise OrtInvalidArgument("string tensors live on the CPU only")
    cdef _Allocator allocator = _cuda_device(device.index).allocator_for(device)
    return allocate_with(allocator.handle, list(dims), elem_type, allocator)


cdef int _copy_with_binding(OrtValue source, OrtValue destination, int device_index) except -1:
    cdef InferenceSession session = _cuda_device(device_index).session_for(source.elem_type)
    binding = session.io_binding()
    try:
        binding.bind_ortvalue_input("x", source)
        binding.bind_ortvalue_output("y", destination)
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
    finally:
        binding.close()
    return 0


def device_copy(OrtValue source not None, OrtValue destination not None):
    """Copy `source` into `destination` (same shape and type) across host and CUDA memory."""
    source.describe()
    destination.describe()
    cdef bint source_host = source.memory_kind in (MEMORY_CPU, MEMORY_CUDA_PINNED)
    cdef bint destination_host = destination.memory_kind in (MEMORY_CPU, MEMORY_CUDA_PINNED)
    if source.elem_type != destination.elem_type or source.shape() != destination.shape():
        raise OrtInvalidArgument(f"cannot copy {source!r} into {destination!r}")
    if source_host and destination_host:
        ensure_numpy()
        import numpy
        numpy.copyto(value_to_numpy(destination, True), value_to_numpy(source, True))
        return
    device_index = source.device_id if not source_host else destination.device_id
    if _copy_tensors_works[0] is not False and shared_runtime().api_version >= ort.ortagent_since_CopyTensors:
        try:
            copy_value_tensors([source], [destination])
            _copy_tensors_works[0] = True
            return
        except OrtError:
            if _copy_tensors_works[0]:
                raise
            _copy_tensors_works[0] = False
    _copy_with_binding(source, destination, device_index)


def device_to_host(OrtValue value not None):
    """A NumPy copy of a device tensor."""
    ensure_numpy()
    import numpy
    value.describe()
    array = numpy.empty(value.shape(), dtype=numpy_dtype_for_element_type(value.elem_type))
    host = OrtValue.ortvalue_from_numpy(array)
    device_copy(value, host)
    return array


def device_from_host(array, OrtDevice device):
    """A new device tensor holding a copy of a NumPy array."""
    ensure_numpy()
    host = OrtValue.ortvalue_from_numpy(array)
    shape = host.shape()
    target = device_allocate(shape, host.element_type(), device)
    device_copy(host, target)
    return target


def copy_tensors(src, dst, stream=None):
    """onnxruntime.copy_tensors: copy each tensor of `src` into the tensor of `dst` at the same
    place (same shapes and types, any devices; OrtApi::CopyTensors, onnxruntime >= 1.23)."""
    if stream is not None:
        raise OrtNotImplemented("ortagent does not expose onnxruntime's sync streams: pass stream=None")
    sources, destinations = list(src), list(dst)
    for item in sources + destinations:
        if not isinstance(item, OrtValue):
            raise OrtInvalidType(f"copy_tensors copies OrtValues, got {type(item).__name__}")
    copy_value_tensors(sources, destinations)
