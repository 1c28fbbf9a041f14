"""Where memory lives: OrtDevice (cpu, cuda:N, cuda_pinned), the onnxruntime memory
descriptions behind it (owned here for the life of the process), and the reverse mapping from a
memory description to a MemoryKind.
"""

import enum

cimport cython
from libc.stdlib cimport malloc, free
from libc.string cimport strlen
from libc.stdint cimport int32_t, uint32_t

from operator import index as _index

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, ensure_loaded, shared_runtime, live_handle_counts, count_add, HANDLE_MEMORY_INFO,
)

from ortagent.errors import OrtInvalidArgument, OrtInvalidType, OrtNotImplemented


# ---- memory descriptions -----------------------------------------------------------------------

cdef ort.OrtMemoryInfo* _cpu_memory_info = NULL
cdef object _cpu_memory_info_guard = object()      # first creation: one thread at a time

cdef ort.OrtMemoryInfo* cpu_memory_info() except NULL:
    global _cpu_memory_info
    cdef ort.OrtMemoryInfo* info = _cpu_memory_info
    if info != NULL:
        return info
    ensure_loaded()
    with cython.critical_section(_cpu_memory_info_guard):
        if _cpu_memory_info == NULL:
            check(ort.CreateCpuMemoryInfo(ort.OrtArenaAllocator, ort.OrtMemTypeDefault, &info))
            _cpu_memory_info = info
    return _cpu_memory_info


# Device ids and types are C ints in onnxruntime's memory descriptions.
_INT_MAX = 2**31 - 1


def _int_argument(value, what):
    """`value` as a Python int (anything with __index__, not bool), else OrtInvalidType."""
    if isinstance(value, bool):
        raise OrtInvalidType(f"{what} must be an int, got bool")
    try:
        return _index(value)
    except TypeError:
        raise OrtInvalidType(f"{what} must be an int, got {type(value).__name__}") from None


def _device_id_argument(value):
    device_id = _int_argument(value, "device_id")
    if not 0 <= device_id <= _INT_MAX:
        raise OrtInvalidArgument(f"device_id must be in [0, {_INT_MAX}], got {device_id}")
    return device_id


_DEVICE_NAMES = {MEMORY_CPU: "cpu", MEMORY_CUDA: "cuda", MEMORY_CUDA_PINNED: "cuda_pinned"}
# onnxruntime's OrtDevice numbering (device type; memory type).
# onnxruntime's OrtDevice type numbers (GPU covers CUDA and WebGPU, NPU covers CANN)
_ORT_DEVICE_CPU, _ORT_DEVICE_GPU, _ORT_DEVICE_FPGA, _ORT_DEVICE_NPU, _ORT_DEVICE_DML = 0, 1, 2, 3, 4
_NVIDIA_VENDOR_ID = 0x10DE
_ORT_MEM_DEFAULT, _ORT_MEM_CUDA_PINNED, _ORT_MEM_HOST_ACCESSIBLE = 0, 1, 5
# Memory descriptions by (kind, index), owned here for the life of the process.
cdef dict _memory_infos = {}


cdef class _MemoryInfoHandle:
    cdef ort.OrtMemoryInfo* handle

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseMemoryInfo(self.handle)
            count_add(&_live[<int>HANDLE_MEMORY_INFO], -1)


@cython.final
cdef class OrtDevice:
    """Where a tensor lives: ``cpu``, ``cuda:<id>`` or ``cuda_pinned`` (page-locked host memory).

    Accepted wherever a device is expected, as are the strings ``"cpu"``, ``"cuda"``,
    ``"cuda:1"``, ``"cuda_pinned"`` and objects shaped like onnxruntime's own ``OrtDevice``
    (``device_type()``, ``device_id()`` and optionally ``mem_type()``).
    Constructor arguments follow onnxruntime's: ``OrtDevice(device_type, memory_type, device_id)``
    with device type 0 = CPU, 1 = GPU and memory type 0 = default, 1 = CUDA pinned.
    """

    def __init__(self, device_type=0, memory_type=0, device_id=0):
        device_type = _int_argument(device_type, "device_type")
        memory_type = _int_argument(memory_type, "memory_type")
        device_id = _device_id_argument(device_id)
        if device_type == _ORT_DEVICE_CPU and memory_type == _ORT_MEM_DEFAULT:
            self.kind = MEMORY_CPU
        elif device_type == _ORT_DEVICE_GPU and memory_type == _ORT_MEM_DEFAULT:
            self.kind = MEMORY_CUDA
        elif memory_type in (_ORT_MEM_CUDA_PINNED, _ORT_MEM_HOST_ACCESSIBLE) and device_type in (
                _ORT_DEVICE_CPU, _ORT_DEVICE_GPU):
            self.kind = MEMORY_CUDA_PINNED
        else:
            raise OrtInvalidArgument(
                f"unsupported device (device_type={device_type}, memory_type={memory_type}); "
                "ortagent supports CPU (0, 0), CUDA (1, 0) and CUDA pinned memory (0 or 1, 1)")
        self.index = device_id

    # onnxruntime-compatible helpers
    @staticmethod
    def cpu():
        return _ORT_DEVICE_CPU

    @staticmethod
    def cuda():
        return _ORT_DEVICE_GPU

    @staticmethod
    def gpu():
        return _ORT_DEVICE_GPU

    @staticmethod
    def webgpu():
        return _ORT_DEVICE_GPU

    @staticmethod
    def fpga():
        return _ORT_DEVICE_FPGA

    @staticmethod
    def npu():
        return _ORT_DEVICE_NPU

    @staticmethod
    def cann():
        return _ORT_DEVICE_NPU

    @staticmethod
    def dml():
        return _ORT_DEVICE_DML

    @staticmethod
    def default_memory():
        return _ORT_MEM_DEFAULT

    @staticmethod
    def cuda_pinned_memory():
        return _ORT_MEM_CUDA_PINNED

    def device_type(self):
        return _ORT_DEVICE_GPU if self.kind == MEMORY_CUDA else _ORT_DEVICE_CPU

    def mem_type(self):
        return _ORT_MEM_CUDA_PINNED if self.kind == MEMORY_CUDA_PINNED else _ORT_MEM_DEFAULT

    def device_id(self):
        return self.index

    def device_mem_type(self):
        """onnxruntime's OrtDeviceMemoryType: 0 default, 5 host-accessible (CUDA pinned)."""
        return _ORT_MEM_HOST_ACCESSIBLE if self.kind == MEMORY_CUDA_PINNED else _ORT_MEM_DEFAULT

    def device_vendor_id(self):
        """PCI vendor id of the device: NVIDIA's for CUDA memory, 0 for the CPU."""
        return _NVIDIA_VENDOR_ID if self.kind != MEMORY_CPU else 0

    def vendor_id(self):
        """device_vendor_id() under the name of onnxruntime's C-level OrtDevice."""
        return self.device_vendor_id()

    @staticmethod
    def make(ort_device_name, device_id, vendor_id=-1):
        """onnxruntime's OrtDevice.make: 'cpu', or 'cuda' / 'gpu' (CUDA memory) with an id."""
        if not isinstance(ort_device_name, str):
            raise OrtInvalidType(f"ort_device_name must be a str, got {type(ort_device_name).__name__}")
        name = ort_device_name.lower()
        if name == "cpu":
            return OrtDevice(_ORT_DEVICE_CPU, _ORT_MEM_DEFAULT, device_id)
        if name in ("cuda", "gpu"):
            if vendor_id not in (-1, _NVIDIA_VENDOR_ID):
                raise OrtNotImplemented("ortagent's GPU devices are CUDA (NVIDIA) devices")
            return OrtDevice(_ORT_DEVICE_GPU, _ORT_MEM_DEFAULT, device_id)
        if name in ("npu", "dml", "cann", "webgpu"):
            raise OrtNotImplemented(f"ortagent places values on the CPU and CUDA devices only, not {name}")
        raise OrtInvalidArgument(f"Unsupported device type: {ort_device_name}")

    @property
    def name(self):
        """'cpu', 'cuda' or 'cuda_pinned'."""
        return _DEVICE_NAMES[self.kind]

    @staticmethod
    def parse(device, device_id=None):
        """An OrtDevice from a string ('cuda:1'), an OrtDevice or an onnxruntime OrtDevice."""
        return as_device(device, device_id)

    def __repr__(self):
        if self.kind == MEMORY_CUDA:
            return f"OrtDevice('cuda:{self.index}')"
        if self.kind == MEMORY_CUDA_PINNED:
            return f"OrtDevice('cuda_pinned:{self.index}')" if self.index else "OrtDevice('cuda_pinned')"
        return "OrtDevice('cpu')"

    def __eq__(self, other):
        if not isinstance(other, OrtDevice):
            return NotImplemented
        return self.kind == (<OrtDevice>other).kind and self.index == (<OrtDevice>other).index

    def __hash__(self):
        return hash((self.kind, self.index))

    def __reduce__(self):
        return (OrtDevice, (self.device_type(), self.mem_type(), self.index))

    cdef ort.OrtMemoryInfo* memory_info(self) except NULL:
        if self.kind == MEMORY_CPU:
            return cpu_memory_info()
        key = (self.kind, self.index)
        holder = _memory_infos.get(key)
        if holder is None:
            ensure_loaded()
            holder = _MemoryInfoHandle.__new__(_MemoryInfoHandle)
            if self.kind == MEMORY_CUDA:
                check(ort.CreateMemoryInfo(b"Cuda", ort.OrtDeviceAllocator, self.index,
                                           ort.OrtMemTypeDefault, &(<_MemoryInfoHandle>holder).handle))
            elif self.kind == MEMORY_CUDA_PINNED:
                check(ort.CreateMemoryInfo(b"CudaPinned", ort.OrtDeviceAllocator, self.index,
                                           ort.OrtMemTypeCPUOutput,
                                           &(<_MemoryInfoHandle>holder).handle))
            else:
                raise OrtNotImplemented(f"no memory description for {self!r}")
            count_add(&_live[<int>HANDLE_MEMORY_INFO], 1)
            _memory_infos[key] = holder
        return (<_MemoryInfoHandle>holder).handle


_CPU_DEVICE = OrtDevice()


def as_device(device, device_id=None):
    """Normalise the many spellings of a device into an OrtDevice."""
    if ((device is None or (type(device) is str and device == "cpu"))
            and (device_id is None or (type(device_id) is int and device_id == 0))):
        return _CPU_DEVICE          # the common case, first
    if device_id is not None:
        device_id = _device_id_argument(device_id)
    if isinstance(device, OrtDevice):
        if device_id is not None and device_id != (<OrtDevice>device).index:
            raise OrtInvalidArgument(f"device {device!r} given with a different device_id {device_id}")
        return device
    if device is None:
        return _CPU_DEVICE
    if isinstance(device, str):
        text = device.strip().lower()
        index = 0
        if ":" in text:
            text, _, index_text = text.partition(":")
            if not (index_text.isascii() and index_text.isdigit()):
                raise OrtInvalidArgument(f"invalid device {device!r}: the index must be a number")
            index = _device_id_argument(int(index_text))
            if device_id is not None and device_id != index:
                raise OrtInvalidArgument(f"device {device!r} given with a different device_id {device_id}")
        elif device_id is not None:
            index = device_id
        if text == "cpu":
            return OrtDevice(_ORT_DEVICE_CPU, _ORT_MEM_DEFAULT, index) if index == 0 else _bad_cpu_index(device)
        if text in ("cuda", "gpu"):
            return OrtDevice(_ORT_DEVICE_GPU, _ORT_MEM_DEFAULT, index)
        if text in ("cuda_pinned", "cudapinned", "pinned"):
            return OrtDevice(_ORT_DEVICE_CPU, _ORT_MEM_CUDA_PINNED, index)
        raise OrtInvalidArgument(
            f"unknown device {device!r}; expected 'cpu', 'cuda', 'cuda:<id>' or 'cuda_pinned'")
    if hasattr(device, "device_type") and hasattr(device, "device_id"):
        # onnxruntime's OrtDevice (or a look-alike): methods device_type(), device_id(), mem_type()
        try:
            mem_type = device.mem_type() if hasattr(device, "mem_type") else _ORT_MEM_DEFAULT
            device_type, device_index = device.device_type(), device.device_id()
        except Exception as exc:
            raise OrtInvalidType(f"cannot interpret {device!r} as a device: its device_type(), "
                                 f"device_id() or mem_type() failed: {exc}") from exc
        for part, what in ((device_type, "device_type()"), (mem_type, "mem_type()"),
                           (device_index, "device_id()")):
            if isinstance(part, bool) or not hasattr(part, "__index__"):
                raise OrtInvalidType(f"cannot interpret {device!r} as a device: its {what} "
                                     f"returned {part!r}, not an int")
        device = OrtDevice(device_type, mem_type, device_index)
        if device_id is not None and device_id != (<OrtDevice>device).index:
            raise OrtInvalidArgument(f"device {device!r} given with a different device_id {device_id}")
        return device
    if hasattr(device, "type") and hasattr(device, "index"):
        # torch.device
        kind, index = device.type, device.index
        if not isinstance(kind, str):
            raise OrtInvalidType(f"cannot interpret {device!r} as a device")
        return as_device(kind if index is None else f"{kind}:{index}", device_id)
    raise OrtInvalidType(f"cannot interpret {device!r} as a device")


def _bad_cpu_index(device):
    raise OrtInvalidArgument(f"invalid device {device!r}: the CPU has only device id 0")



cdef int memory_kind_of(const ort.OrtMemoryInfo* info, int* device_id) except -1:
    cdef const char* name = NULL
    cdef int mem_id = 0
    cdef ort.OrtMemType mem_type = ort.OrtMemTypeDefault
    check(ort.MemoryInfoGetName(info, &name))
    check(ort.MemoryInfoGetId(info, &mem_id))
    check(ort.MemoryInfoGetMemType(info, &mem_type))
    device_id[0] = mem_id
    text = name[:strlen(name)] if name != NULL else b""
    # Classify by name first: pinned memory reports a GPU device type in recent releases.
    if text == b"Cpu":
        return MEMORY_CPU
    if text == b"CudaPinned":
        return MEMORY_CUDA_PINNED
    if text == b"Cuda":
        return MEMORY_CUDA
    if mem_type == ort.OrtMemTypeCPUInput or mem_type == ort.OrtMemTypeCPUOutput:
        return MEMORY_CPU
    return MEMORY_OTHER



# ---- OrtMemoryInfo and its enums (onnxruntime's Python names and values) ---------------------------

class OrtAllocatorType(enum.IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(enum.IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class OrtMemoryInfoDeviceType(enum.IntEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


class OrtDeviceMemoryType(enum.IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


@cython.final
cdef class OrtMemoryInfo:
    """A memory description: ``OrtMemoryInfo(name, allocator_type, device_id, mem_type)`` with
    onnxruntime's names ('Cpu', 'Cuda', 'CudaPinned', ...) and enums."""

    def __init__(self, name, alloc_type, device_id, mem_type):
        if not isinstance(name, str) or "\0" in name:
            raise OrtInvalidType(f"name must be a str without NUL characters, got {name!r}")
        alloc = _int_argument(alloc_type, "alloc_type")
        memory = _int_argument(mem_type, "mem_type")
        device = _int_argument(device_id, "device_id")
        if alloc not in (-1, 0, 1) or memory not in (-2, -1, 0) or not 0 <= device < 1 << 31:
            raise OrtInvalidArgument(f"bad memory info ({alloc_type!r}, {device_id!r}, {mem_type!r})")
        ensure_loaded()
        if self.handle != NULL:
            ort.ReleaseMemoryInfo(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_MEMORY_INFO], -1)
        check(ort.CreateMemoryInfo(name.encode(), <ort.OrtAllocatorType><int>alloc, <int>device,
                                   <ort.OrtMemType><int>memory, &self.handle))
        count_add(&_live[<int>HANDLE_MEMORY_INFO], 1)

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseMemoryInfo(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_MEMORY_INFO], -1)

    cdef int _require(self) except -1:
        if self.handle == NULL:
            raise OrtInvalidArgument("this OrtMemoryInfo was not initialised")
        return 0

    @property
    def name(self):
        self._require()
        cdef const char* text = NULL
        check(ort.MemoryInfoGetName(self.handle, &text))
        return text.decode() if text != NULL else ""

    @property
    def device_id(self):
        self._require()
        cdef int value = 0
        check(ort.MemoryInfoGetId(self.handle, &value))
        return value

    @property
    def mem_type(self):
        self._require()
        cdef ort.OrtMemType value = ort.OrtMemTypeDefault
        check(ort.MemoryInfoGetMemType(self.handle, &value))
        return OrtMemType(<int>value)

    @property
    def allocator_type(self):
        self._require()
        cdef ort.OrtAllocatorType value = ort.OrtInvalidAllocator
        check(ort.MemoryInfoGetType(self.handle, &value))
        return OrtAllocatorType(<int>value)

    @property
    def device_type(self):
        self._require()
        cdef ort.OrtMemoryInfoDeviceType value = ort.OrtMemoryInfoDeviceType_CPU
        ort.MemoryInfoGetDeviceType(self.handle, &value)
        return OrtMemoryInfoDeviceType(<int>value)

    @property
    def device_mem_type(self):
        """DEFAULT or HOST_ACCESSIBLE (OrtApi::MemoryInfoGetDeviceMemType on onnxruntime >=
        1.23; before, read from the name: '...Pinned' is host accessible)."""
        self._require()
        if ort.HAS_MemoryInfoGetDeviceMemType:
            return OrtDeviceMemoryType(<int>ort.MemoryInfoGetDeviceMemType(self.handle))
        return (OrtDeviceMemoryType.HOST_ACCESSIBLE if "Pinned" in self.name
                else OrtDeviceMemoryType.DEFAULT)

    @property
    def device_vendor_id(self):
        """The device's PCI vendor id (OrtApi::MemoryInfoGetVendorId on onnxruntime >= 1.23;
        before, from the name: NVIDIA's for 'Cuda...', 0 otherwise)."""
        self._require()
        if ort.HAS_MemoryInfoGetVendorId:
            return <long>ort.MemoryInfoGetVendorId(self.handle)
        return _NVIDIA_VENDOR_ID if self.name.startswith("Cuda") else 0

    @staticmethod
    def create_v2(name, device_type, vendor_id, device_id, device_mem_type, alignment,
                  allocator_type):
        """A memory description from its device (OrtApi::CreateMemoryInfo_V2, onnxruntime >=
        1.23): ``create_v2(name, OrtMemoryInfoDeviceType, vendor_id, device_id,
        OrtDeviceMemoryType, alignment, OrtAllocatorType)``."""
        if not isinstance(name, str) or "\0" in name:
            raise OrtInvalidType(f"name must be a str without NUL characters, got {name!r}")
        kind = _int_argument(device_type, "device_type")
        vendor = _int_argument(vendor_id, "vendor_id")
        device = _int_argument(device_id, "device_id")
        memory = _int_argument(device_mem_type, "device_mem_type")
        align = _int_argument(alignment, "alignment")
        alloc = _int_argument(allocator_type, "allocator_type")
        if kind not in (0, 1, 2, 3):
            raise OrtInvalidArgument(f"device_type must be an OrtMemoryInfoDeviceType, got {device_type!r}")
        if memory not in (0, 5):
            raise OrtInvalidArgument(f"device_mem_type must be an OrtDeviceMemoryType, got {device_mem_type!r}")
        if alloc not in (-1, 0, 1):
            raise OrtInvalidArgument(f"allocator_type must be an OrtAllocatorType, got {allocator_type!r}")
        if not 0 <= vendor < 1 << 32:
            raise OrtInvalidArgument(f"vendor_id must be in [0, {(1 << 32) - 1}], got {vendor}")
        if not -(1 << 31) <= device < 1 << 31:
            raise OrtInvalidArgument(f"device_id must be a 32-bit int, got {device}")
        if not 0 <= align < 1 << 63:
            raise OrtInvalidArgument(f"alignment must be a size, got {align}")
        ensure_loaded()
        cdef OrtMemoryInfo info = OrtMemoryInfo.__new__(OrtMemoryInfo)
        check(ort.CreateMemoryInfo_V2(name.encode(), <ort.OrtMemoryInfoDeviceType><int>kind, <uint32_t>vendor,
                                      <int32_t>device, <ort.OrtDeviceMemoryType><int>memory, <size_t>align,
                                      <ort.OrtAllocatorType><int>alloc, &info.handle))
        count_add(&_live[<int>HANDLE_MEMORY_INFO], 1)
        return info

    def __eq__(self, other):
        if not isinstance(other, OrtMemoryInfo):
            return NotImplemented
        cdef int result = 0
        self._require()
        (<OrtMemoryInfo>other)._require()
        check(ort.CompareMemoryInfo(self.handle, (<OrtMemoryInfo>other).handle, &result))
        return result == 0

    __hash__ = None

    def __repr__(self):
        return (f"OrtMemoryInfo(name={self.name!r}, allocator_type={self.allocator_type.name}, "
                f"device_id={self.device_id}, mem_type={self.mem_type.name})")

    def __reduce__(self):
        raise OrtInvalidType("OrtMemoryInfo cannot be pickled")


cdef OrtMemoryInfo memory_info_copy(const ort.OrtMemoryInfo* info):
    """A new OrtMemoryInfo describing the same memory as `info` (which stays its owner's)."""
    cdef const char* name = NULL
    cdef int device_id = 0
    cdef ort.OrtMemType mem_type = ort.OrtMemTypeDefault
    cdef ort.OrtAllocatorType alloc = ort.OrtInvalidAllocator
    check(ort.MemoryInfoGetName(info, &name))
    check(ort.MemoryInfoGetId(info, &device_id))
    check(ort.MemoryInfoGetMemType(info, &mem_type))
    check(ort.MemoryInfoGetType(info, &alloc))
    return OrtMemoryInfo(name.decode() if name != NULL else "", <int>alloc, device_id, <int>mem_type)


cdef list session_memory_infos(ort.OrtSession* session, size_t count, bint inputs):
    """The memory each of a session's `count` inputs (or outputs) is expected in, as new
    OrtMemoryInfo objects (OrtApi::SessionGetMemoryInfoForInputs/Outputs, onnxruntime >= 1.23)."""
    cdef const ort.OrtMemoryInfo** infos = <const ort.OrtMemoryInfo**>malloc((count + 1) * sizeof(void*))
    if infos == NULL:
        raise MemoryError()
    try:
        if inputs:
            check(ort.SessionGetMemoryInfoForInputs(session, infos, count))
        else:
            check(ort.SessionGetMemoryInfoForOutputs(session, infos, count))
        return [memory_info_copy(infos[i]) if infos[i] != NULL else None for i in range(count)]
    finally:
        free(infos)
