"""Execution-provider devices: the plugin-EP device API of the C API (OrtApi 1.22 and 1.23).

The environment owns every OrtEpDevice and OrtHardwareDevice: GetEpDevices lists the devices of
the execution providers built in and of the provider libraries registered with
register_execution_provider_library. The Python objects here borrow those pointers, one object
per device (as onnxruntime's module gives the same object for the same device). Unregistering a
library frees its devices: every later use of such an object raises instead of reading freed
memory. Sessions choose devices through SessionOptions.add_provider_for_devices (or a selection
policy); both are forwarded here from _options.
"""

import enum
import os

cimport cython
from libc.stdint cimport uintptr_t
from libc.stdlib cimport malloc, free

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, ensure_loaded, shared_runtime, live_handle_counts, count_add, HANDLE_SYNC_STREAM, encode_text,
)

from ortagent.errors import OrtFail, OrtInvalidArgument, OrtInvalidType, OrtVersionError



class OrtHardwareDeviceType(enum.IntEnum):
    CPU = 0
    GPU = 1
    NPU = 2


class OrtExecutionProviderDevicePolicy(enum.IntEnum):
    DEFAULT = 0
    PREFER_CPU = 1
    PREFER_NPU = 2
    PREFER_GPU = 3
    MAX_PERFORMANCE = 4
    MAX_EFFICIENCY = 5
    MIN_OVERALL_POWER = 6


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids of the device makers onnxruntime names."""
    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


cdef dict _pairs(const ort.OrtKeyValuePairs* pairs):
    """A dict of the runtime's key/value pairs (empty for NULL)."""
    cdef const char* const* keys = NULL
    cdef const char* const* values = NULL
    cdef size_t count = 0, i
    if pairs == NULL:
        return {}
    ort.GetKeyValuePairs(pairs, &keys, &values, &count)
    result = {}
    for i in range(count):
        result[_text(keys[i])] = _text(values[i])
    return result


cdef int _require_version(bint present, str name, int since) except -1:
    """OrtVersionError naming the version when the runtime lacks a plain-value slot."""
    if not present:
        rt = shared_runtime()
        raise OrtVersionError(f"OrtApi::{name} needs onnxruntime >= 1.{since} (OrtApi version {since}); "
                              f"the loaded runtime is {_text(rt.version_string)} (OrtApi version "
                              f"{rt.api_version})")
    return 0


# ---- the environment's devices ------------------------------------------------------------------

# Python object of each device, by its address; emptied for the devices a library took away.
cdef dict _objects = {}


cdef list _device_pointers():
    """Addresses of the environment's devices now (OrtApi::GetEpDevices)."""
    cdef const ort.OrtEpDevice* const* devices = NULL
    cdef size_t count = 0, i
    ensure_loaded()
    check(ort.GetEpDevices(shared_runtime().env, &devices, &count))
    result = []
    for i in range(count):
        result.append(<uintptr_t>devices[i])
    return result


cdef OrtEpDevice _device_object(const ort.OrtEpDevice* device):
    key = <uintptr_t>device
    cdef OrtEpDevice found = _objects.get(key)
    if found is None:
        found = OrtEpDevice.__new__(OrtEpDevice)
        found.handle = device
        _objects[key] = found
    return found


cdef int _forget_gone_devices() except -1:
    """Detach the objects of devices the environment no longer lists."""
    present = set(_device_pointers())
    for key in [k for k in _objects if k not in present]:
        (<OrtEpDevice>_objects.pop(key)).handle = NULL
    return 0


def get_ep_devices():
    """The execution-provider devices of the environment (OrtApi::GetEpDevices, onnxruntime
    >= 1.22), as OrtEpDevice objects."""
    cdef uintptr_t key
    result = []
    for address in _device_pointers():
        key = address
        result.append(_device_object(<const ort.OrtEpDevice*>key))
    return result


def register_execution_provider_library(registration_name, library_path):
    """Load an execution-provider library and add its devices to the environment under
    `registration_name` (OrtApi::RegisterExecutionProviderLibrary)."""
    name = encode_text(registration_name, "registration_name")
    if not isinstance(library_path, (str, os.PathLike)):
        raise OrtInvalidType(f"library_path must be a path, got {type(library_path).__name__}")
    path = os.fsencode(library_path)
    if b"\0" in path:
        raise OrtInvalidArgument("library_path must not contain NUL characters")
    ensure_loaded()
    check(ort.RegisterExecutionProviderLibrary(shared_runtime().env, name, path))


def unregister_execution_provider_library(registration_name):
    """Unload the library registered as `registration_name`; its devices are gone (sessions
    using them must be released first, as onnxruntime requires)."""
    name = encode_text(registration_name, "registration_name")
    ensure_loaded()
    try:
        check(ort.UnregisterExecutionProviderLibrary(shared_runtime().env, name))
    finally:
        _forget_gone_devices()


# ---- devices --------------------------------------------------------------------------------------

@cython.final
cdef class OrtHardwareDevice:
    """A device of the machine (CPU, GPU, NPU) as onnxruntime describes it. Owned by the
    environment; reached through ``OrtEpDevice.device``."""
    cdef OrtEpDevice owner
    cdef const ort.OrtHardwareDevice* handle

    def __init__(self):
        raise OrtInvalidType("OrtHardwareDevice objects come from OrtEpDevice.device")

    cdef const ort.OrtHardwareDevice* _get(self) except NULL:
        self.owner._get()
        return self.handle

    @property
    def type(self):
        return OrtHardwareDeviceType(<int>ort.HardwareDevice_Type(self._get()))

    @property
    def vendor_id(self):
        return <long>ort.HardwareDevice_VendorId(self._get())

    @property
    def vendor(self):
        return _text(ort.HardwareDevice_Vendor(self._get()))

    @property
    def device_id(self):
        return <long>ort.HardwareDevice_DeviceId(self._get())

    @property
    def metadata(self):
        return _pairs(ort.HardwareDevice_Metadata(self._get()))

    def __repr__(self):
        if self.owner.handle == NULL:
            return "<OrtHardwareDevice (gone)>"
        return f"<OrtHardwareDevice {self.type.name} vendor={self.vendor!r} device_id={self.device_id}>"

    def __reduce__(self):
        raise OrtInvalidType("OrtHardwareDevice cannot be pickled")


@cython.final
cdef class OrtEpDevice:
    """An execution provider paired with a device it can run on (from get_ep_devices()).
    Owned by the environment; one object per device."""

    def __init__(self):
        raise OrtInvalidType("OrtEpDevice objects come from ortagent.get_ep_devices()")

    cdef const ort.OrtEpDevice* _get(self) except NULL:
        # (a device exists only where GetEpDevices ran; checked anyway before any 1.22 accessor)
        _require_version(ort.HAS_GetEpDevices, "GetEpDevices", 22)
        if self.handle == NULL:
            raise OrtInvalidArgument("this OrtEpDevice is gone: the execution provider library that "
                                     "provided it was unregistered")
        return self.handle

    @property
    def ep_name(self):
        return _text(ort.EpDevice_EpName(self._get()))

    @property
    def ep_vendor(self):
        return _text(ort.EpDevice_EpVendor(self._get()))

    @property
    def ep_metadata(self):
        return _pairs(ort.EpDevice_EpMetadata(self._get()))

    @property
    def ep_options(self):
        return _pairs(ort.EpDevice_EpOptions(self._get()))

    @property
    def device(self):
        cdef OrtHardwareDevice hardware = OrtHardwareDevice.__new__(OrtHardwareDevice)
        hardware.handle = ort.EpDevice_Device(self._get())
        hardware.owner = self
        return hardware

    def memory_info(self, memory_type):
        """The memory this device's provider uses of `memory_type` (an OrtDeviceMemoryType), or
        None when it has none of that type (OrtApi::EpDevice_MemoryInfo, onnxruntime >= 1.23)."""
        cdef const ort.OrtEpDevice* device = self._get()
        kind = _memory_type(memory_type)
        _require_version(ort.HAS_EpDevice_MemoryInfo, "EpDevice_MemoryInfo", 23)
        cdef const ort.OrtMemoryInfo* info = ort.EpDevice_MemoryInfo(device, <ort.OrtDeviceMemoryType><int>kind)
        return memory_info_copy(info) if info != NULL else None

    def create_sync_stream(self):
        """A new OrtSyncStream of this device (OrtApi::CreateSyncStreamForEpDevice, onnxruntime
        >= 1.23). As in onnxruntime, only devices whose default memory is not the CPU's have one."""
        cdef const ort.OrtEpDevice* device = self._get()
        _require_version(ort.HAS_EpDevice_MemoryInfo, "EpDevice_MemoryInfo", 23)
        cdef const ort.OrtMemoryInfo* info = ort.EpDevice_MemoryInfo(device, ort.OrtDeviceMemoryType_DEFAULT)
        cdef ort.OrtMemoryInfoDeviceType kind = ort.OrtMemoryInfoDeviceType_CPU
        if info != NULL:
            ort.MemoryInfoGetDeviceType(info, &kind)
        if info == NULL or kind == ort.OrtMemoryInfoDeviceType_CPU:
            # onnxruntime's words for the same refusal
            raise OrtFail("ep_device does not use DEFAULT memory of a non-CPU device.")
        cdef OrtSyncStream stream = OrtSyncStream.__new__(OrtSyncStream)
        check(ort.CreateSyncStreamForEpDevice(device, NULL, &stream.handle))
        count_add(&_live[<int>HANDLE_SYNC_STREAM], 1)
        stream.device = self
        return stream

    def __repr__(self):
        if self.handle == NULL:
            return "<OrtEpDevice (gone)>"
        return f"<OrtEpDevice {self.ep_name} on {self.device.type.name}>"

    def __reduce__(self):
        raise OrtInvalidType("OrtEpDevice cannot be pickled")


def _memory_type(value):
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise OrtInvalidType(f"memory type must be an OrtDeviceMemoryType, got {type(value).__name__}")
    kind = value.__index__()
    if kind not in (0, 5):
        raise OrtInvalidArgument(f"memory type must be an OrtDeviceMemoryType (0 or 5), got {kind}")
    return kind


@cython.final
cdef class OrtSyncStream:
    """A stream of an execution-provider device (from OrtEpDevice.create_sync_stream())."""
    cdef ort.OrtSyncStream* handle
    cdef OrtEpDevice device

    def __init__(self):
        raise OrtInvalidType("OrtSyncStream objects come from OrtEpDevice.create_sync_stream()")

    def __dealloc__(self):
        if self.handle != NULL:
            if ort.HAS_ReleaseSyncStream:
                ort.ReleaseSyncStream(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_SYNC_STREAM], -1)

    def get_handle(self):
        """The native stream (e.g. a cudaStream_t) as an int."""
        if self.handle == NULL:
            raise OrtInvalidArgument("this OrtSyncStream was not created by create_sync_stream()")
        self.device._get()
        _require_version(ort.HAS_SyncStream_GetHandle, "SyncStream_GetHandle", 23)
        return <uintptr_t>ort.SyncStream_GetHandle(self.handle)


# ---- sessions -------------------------------------------------------------------------------------

def append_for_devices(SessionOptions options, ep_devices, provider_options):
    """SessionOptions.add_provider_for_devices: the provider of `ep_devices` (all one
    provider's) with `provider_options` (OrtApi::SessionOptionsAppendExecutionProvider_V2)."""
    if isinstance(ep_devices, (str, bytes)) or not hasattr(ep_devices, "__iter__"):
        raise OrtInvalidType(f"ep_devices must be a list of OrtEpDevice, got {type(ep_devices).__name__}")
    devices = list(ep_devices)
    for position, device in enumerate(devices):
        if not isinstance(device, OrtEpDevice):
            raise OrtInvalidType(f"ep_devices[{position}] must be an OrtEpDevice, got {type(device).__name__}")
        (<OrtEpDevice>device)._get()
    if not isinstance(provider_options, dict):
        raise OrtInvalidType(f"provider_options must be a dict of str, got {type(provider_options).__name__}")
    for key, value in provider_options.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise OrtInvalidType(f"provider_options must map str to str, got {key!r}: {value!r}")
    encoded = [(encode_text(k, "provider option"), encode_text(v, "provider option value"))
               for k, v in provider_options.items()]
    cdef Py_ssize_t n = len(devices), m = len(encoded), i
    cdef const ort.OrtEpDevice** chosen = <const ort.OrtEpDevice**>malloc((n + 1) * sizeof(void*))
    cdef const char** keys = <const char**>malloc(2 * (m + 1) * sizeof(char*))
    try:
        if chosen == NULL or keys == NULL:
            raise MemoryError()
        for i in range(n):
            chosen[i] = (<OrtEpDevice>devices[i]).handle
        for i in range(m):
            keys[i] = <bytes>encoded[i][0]
            keys[m + 1 + i] = <bytes>encoded[i][1]
        check(ort.SessionOptionsAppendExecutionProvider_V2(options.handle, shared_runtime().env, chosen,
                                                           <size_t>n, keys, keys + m + 1, <size_t>m))
    finally:
        free(chosen)
        free(keys)
    options._has_providers = True
    for device in devices:
        name = device.ep_name
        if name not in options._device_providers:
            options._device_providers.append(name)


def set_selection_policy(SessionOptions options, policy):
    """SessionOptions.set_provider_selection_policy (OrtApi::SessionOptionsSetEpSelectionPolicy)."""
    if isinstance(policy, bool) or not hasattr(type(policy), "__index__"):
        raise OrtInvalidType(f"policy must be an OrtExecutionProviderDevicePolicy, got {type(policy).__name__}")
    value = policy.__index__()
    if value not in tuple(OrtExecutionProviderDevicePolicy):
        raise OrtInvalidArgument(f"policy must be an OrtExecutionProviderDevicePolicy (0 to 6), got {value}")
    ensure_loaded()
    check(ort.SessionOptionsSetEpSelectionPolicy(options.handle, <ort.OrtExecutionProviderDevicePolicy><int>value))
    options._has_providers = True


cdef list session_input_devices(const ort.OrtSession* session, size_t count):
    """The device each of a session's `count` inputs is expected on (OrtApi::
    SessionGetEpDeviceForInputs, onnxruntime >= 1.23): OrtEpDevice objects, None where none."""
    cdef const ort.OrtEpDevice** devices = <const ort.OrtEpDevice**>malloc((count + 1) * sizeof(void*))
    cdef size_t i
    if devices == NULL:
        raise MemoryError()
    try:
        check(ort.SessionGetEpDeviceForInputs(session, devices, count))
        result = []
        for i in range(count):
            result.append(_device_object(devices[i]) if devices[i] != NULL else None)
        return result
    finally:
        free(devices)
