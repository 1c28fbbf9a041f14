from typing import final
import enum
import os

from ortagent._memory import OrtMemoryInfo

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
    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086

def get_ep_devices() -> list[OrtEpDevice]: ...
def register_execution_provider_library(registration_name: str, library_path: str | os.PathLike[str]) -> None: ...
def unregister_execution_provider_library(registration_name: str) -> None: ...

@final
class OrtHardwareDevice:
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @property
    def type(self) -> OrtHardwareDeviceType: ...
    @property
    def vendor_id(self) -> int: ...
    @property
    def vendor(self) -> str: ...
    @property
    def device_id(self) -> int: ...
    @property
    def metadata(self) -> dict[str, str]: ...

@final
class OrtEpDevice:
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @property
    def ep_name(self) -> str: ...
    @property
    def ep_vendor(self) -> str: ...
    @property
    def ep_metadata(self) -> dict[str, str]: ...
    @property
    def ep_options(self) -> dict[str, str]: ...
    @property
    def device(self) -> OrtHardwareDevice: ...
    def memory_info(self, memory_type: int) -> OrtMemoryInfo | None: ...
    def create_sync_stream(self) -> OrtSyncStream: ...

@final
class OrtSyncStream:
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    def get_handle(self) -> int: ...

# (for SessionOptions) add_provider_for_devices and set_provider_selection_policy
from ortagent._options import SessionOptions

def append_for_devices(options: SessionOptions, ep_devices: object, provider_options: object) -> None: ...
def set_selection_policy(options: SessionOptions, policy: int) -> None: ...
