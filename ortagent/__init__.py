"""ortagent: a low-overhead binding of the onnxruntime C API, and a TrainingAgent that runs
ORTModule training graphs on stock onnxruntime.

``import ortagent`` is cheap: it imports neither numpy nor onnxruntime nor the extension modules.
Each public name is imported from its module on first use, and the onnxruntime library itself
is loaded by the first call that needs it (see ``ortagent._library`` for where it is looked up).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ortagent.errors import *  # noqa: F401,F403  (pure Python, cheap)
from ortagent.errors import __all__ as _error_names

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    # runtime
    "get_version_string": "ortagent._runtime",
    "get_build_info": "ortagent._runtime",
    "get_available_providers": "ortagent._runtime",
    "set_default_logger_severity": "ortagent._runtime",
    "get_default_logger_severity": "ortagent._runtime",
    "live_handles": "ortagent._runtime",
    "library_path": "ortagent._runtime",
    "api_version": "ortagent._runtime",
    "get_all_providers": "ortagent._runtime",
    "get_device": "ortagent._runtime",
    "set_global_thread_pool_sizes": "ortagent._runtime",
    "enable_telemetry_events": "ortagent._runtime",
    "disable_telemetry_events": "ortagent._runtime",
    # values
    "OrtValue": "ortagent._values",
    "OrtDevice": "ortagent._memory",
    "OrtMemoryInfo": "ortagent._memory",
    "OrtAllocatorType": "ortagent._memory",
    "OrtMemType": "ortagent._memory",
    "OrtMemoryInfoDeviceType": "ortagent._memory",
    "OrtDeviceMemoryType": "ortagent._memory",
    "OrtArenaCfg": "ortagent._allocators",
    "create_and_register_allocator": "ortagent._allocators",
    "create_and_register_allocator_v2": "ortagent._allocators",
    "from_dlpack": "ortagent._dlpack",
    "is_dlpack_uint8_tensor": "ortagent._dlpack",
    "copy_tensors": "ortagent._device",
    "SparseTensor": "ortagent._sparse",
    "OrtSparseFormat": "ortagent._sparse",
    # sessions
    "SessionOptions": "ortagent._options",
    "RunOptions": "ortagent._options",
    "InferenceSession": "ortagent._session",
    "IOBinding": "ortagent._iobinding",
    "NodeArg": "ortagent._metadata",
    "ModelMetadata": "ortagent._metadata",
    "OrtEpAssignedSubgraph": "ortagent._metadata",
    "OrtEpAssignedNode": "ortagent._metadata",
    "GraphOptimizationLevel": "ortagent._options",
    "ExecutionMode": "ortagent._options",
    "LoraAdapter": "ortagent._options",
    "AdapterFormat": "ortagent._adapter_format",
    "strict_providers": "ortagent._providers",
    # execution-provider devices and model compilation
    "get_ep_devices": "ortagent._epdevices",
    "register_execution_provider_library": "ortagent._epdevices",
    "unregister_execution_provider_library": "ortagent._epdevices",
    "OrtEpDevice": "ortagent._epdevices",
    "OrtHardwareDevice": "ortagent._epdevices",
    "OrtHardwareDeviceType": "ortagent._epdevices",
    "OrtExecutionProviderDevicePolicy": "ortagent._epdevices",
    "OrtDeviceVendorId": "ortagent._epdevices",
    "OrtSyncStream": "ortagent._epdevices",
    "ModelCompiler": "ortagent._compile",
    "OrtCompileApiFlags": "ortagent._compile",
    # training
    "TrainingAgent": "ortagent.agent",
    "PartialGraphExecutionState": "ortagent.agent",
    "lower_training_ops": "ortagent.training_ops",
}

__all__ = sorted([*_LAZY, *_error_names, "__version__"])


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ortagent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from ortagent._runtime import api_version as api_version
    from ortagent._runtime import disable_telemetry_events as disable_telemetry_events
    from ortagent._runtime import enable_telemetry_events as enable_telemetry_events
    from ortagent._runtime import get_all_providers as get_all_providers
    from ortagent._runtime import get_device as get_device
    from ortagent._runtime import set_global_thread_pool_sizes as set_global_thread_pool_sizes
    from ortagent._runtime import get_available_providers as get_available_providers
    from ortagent._runtime import get_build_info as get_build_info
    from ortagent._runtime import get_default_logger_severity as get_default_logger_severity
    from ortagent._runtime import get_version_string as get_version_string
    from ortagent._runtime import library_path as library_path
    from ortagent._runtime import live_handles as live_handles
    from ortagent._runtime import set_default_logger_severity as set_default_logger_severity
    from ortagent._options import ExecutionMode as ExecutionMode
    from ortagent._options import GraphOptimizationLevel as GraphOptimizationLevel
    from ortagent._options import LoraAdapter as LoraAdapter
    from ortagent._adapter_format import AdapterFormat as AdapterFormat
    from ortagent._providers import strict_providers as strict_providers
    from ortagent._epdevices import get_ep_devices as get_ep_devices
    from ortagent._epdevices import register_execution_provider_library as register_execution_provider_library
    from ortagent._epdevices import unregister_execution_provider_library as unregister_execution_provider_library
    from ortagent._epdevices import OrtEpDevice as OrtEpDevice
    from ortagent._epdevices import OrtHardwareDevice as OrtHardwareDevice
    from ortagent._epdevices import OrtHardwareDeviceType as OrtHardwareDeviceType
    from ortagent._epdevices import OrtExecutionProviderDevicePolicy as OrtExecutionProviderDevicePolicy
    from ortagent._epdevices import OrtDeviceVendorId as OrtDeviceVendorId
    from ortagent._epdevices import OrtSyncStream as OrtSyncStream
    from ortagent._compile import ModelCompiler as ModelCompiler
    from ortagent._compile import OrtCompileApiFlags as OrtCompileApiFlags
    from ortagent._session import InferenceSession as InferenceSession
    from ortagent._iobinding import IOBinding as IOBinding
    from ortagent._metadata import ModelMetadata as ModelMetadata
    from ortagent._metadata import NodeArg as NodeArg
    from ortagent._metadata import OrtEpAssignedNode as OrtEpAssignedNode
    from ortagent._metadata import OrtEpAssignedSubgraph as OrtEpAssignedSubgraph
    from ortagent._options import RunOptions as RunOptions
    from ortagent._options import SessionOptions as SessionOptions
    from ortagent._allocators import OrtArenaCfg as OrtArenaCfg
    from ortagent._allocators import create_and_register_allocator as create_and_register_allocator
    from ortagent._allocators import create_and_register_allocator_v2 as create_and_register_allocator_v2
    from ortagent._device import copy_tensors as copy_tensors
    from ortagent._memory import OrtAllocatorType as OrtAllocatorType
    from ortagent._memory import OrtDevice as OrtDevice
    from ortagent._memory import OrtDeviceMemoryType as OrtDeviceMemoryType
    from ortagent._memory import OrtMemoryInfo as OrtMemoryInfo
    from ortagent._memory import OrtMemoryInfoDeviceType as OrtMemoryInfoDeviceType
    from ortagent._memory import OrtMemType as OrtMemType
    from ortagent._sparse import OrtSparseFormat as OrtSparseFormat
    from ortagent._sparse import SparseTensor as SparseTensor
    from ortagent._values import OrtValue as OrtValue
    from ortagent._values import from_dlpack as from_dlpack
    from ortagent._dlpack import is_dlpack_uint8_tensor as is_dlpack_uint8_tensor
    from ortagent.agent import PartialGraphExecutionState as PartialGraphExecutionState
    from ortagent.agent import TrainingAgent as TrainingAgent
    from ortagent.training_ops import lower_training_ops as lower_training_ops
