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
    "OrtValue": "ortagent._core",
    "OrtDevice": "ortagent._core",
    "OrtMemoryInfo": "ortagent._core",
    "OrtAllocatorType": "ortagent._core",
    "OrtMemType": "ortagent._core",
    "OrtMemoryInfoDeviceType": "ortagent._core",
    "OrtDeviceMemoryType": "ortagent._core",
    "OrtArenaCfg": "ortagent._core",
    "create_and_register_allocator": "ortagent._core",
    "create_and_register_allocator_v2": "ortagent._core",
    "from_dlpack": "ortagent._core",
    "is_dlpack_uint8_tensor": "ortagent._core",
    "copy_tensors": "ortagent._core",
    "SparseTensor": "ortagent._core",
    "OrtSparseFormat": "ortagent._core",
    # sessions
    "SessionOptions": "ortagent._core",
    "RunOptions": "ortagent._core",
    "InferenceSession": "ortagent._core",
    "IOBinding": "ortagent._core",
    "NodeArg": "ortagent._core",
    "ModelMetadata": "ortagent._core",
    "OrtEpAssignedSubgraph": "ortagent._core",
    "OrtEpAssignedNode": "ortagent._core",
    "GraphOptimizationLevel": "ortagent._core",
    "ExecutionMode": "ortagent._core",
    "LoraAdapter": "ortagent._core",
    "AdapterFormat": "ortagent._adapter_format",
    "strict_providers": "ortagent._core",
    # execution-provider devices and model compilation
    "get_ep_devices": "ortagent._core",
    "register_execution_provider_library": "ortagent._core",
    "unregister_execution_provider_library": "ortagent._core",
    "OrtEpDevice": "ortagent._core",
    "OrtHardwareDevice": "ortagent._core",
    "OrtHardwareDeviceType": "ortagent._core",
    "OrtExecutionProviderDevicePolicy": "ortagent._core",
    "OrtDeviceVendorId": "ortagent._core",
    "OrtSyncStream": "ortagent._core",
    "ModelCompiler": "ortagent._core",
    "OrtCompileApiFlags": "ortagent._core",
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
    from ortagent._core import ExecutionMode as ExecutionMode
    from ortagent._core import GraphOptimizationLevel as GraphOptimizationLevel
    from ortagent._core import LoraAdapter as LoraAdapter
    from ortagent._adapter_format import AdapterFormat as AdapterFormat
    from ortagent._core import strict_providers as strict_providers
    from ortagent._core import get_ep_devices as get_ep_devices
    from ortagent._core import register_execution_provider_library as register_execution_provider_library
    from ortagent._core import unregister_execution_provider_library as unregister_execution_provider_library
    from ortagent._core import OrtEpDevice as OrtEpDevice
    from ortagent._core import OrtHardwareDevice as OrtHardwareDevice
    from ortagent._core import OrtHardwareDeviceType as OrtHardwareDeviceType
    from ortagent._core import OrtExecutionProviderDevicePolicy as OrtExecutionProviderDevicePolicy
    from ortagent._core import OrtDeviceVendorId as OrtDeviceVendorId
    from ortagent._core import OrtSyncStream as OrtSyncStream
    from ortagent._core import ModelCompiler as ModelCompiler
    from ortagent._core import OrtCompileApiFlags as OrtCompileApiFlags
    from ortagent._core import InferenceSession as InferenceSession
    from ortagent._core import IOBinding as IOBinding
    from ortagent._core import ModelMetadata as ModelMetadata
    from ortagent._core import NodeArg as NodeArg
    from ortagent._core import OrtEpAssignedNode as OrtEpAssignedNode
    from ortagent._core import OrtEpAssignedSubgraph as OrtEpAssignedSubgraph
    from ortagent._core import RunOptions as RunOptions
    from ortagent._core import SessionOptions as SessionOptions
    from ortagent._core import OrtArenaCfg as OrtArenaCfg
    from ortagent._core import create_and_register_allocator as create_and_register_allocator
    from ortagent._core import create_and_register_allocator_v2 as create_and_register_allocator_v2
    from ortagent._core import copy_tensors as copy_tensors
    from ortagent._core import OrtAllocatorType as OrtAllocatorType
    from ortagent._core import OrtDevice as OrtDevice
    from ortagent._core import OrtDeviceMemoryType as OrtDeviceMemoryType
    from ortagent._core import OrtMemoryInfo as OrtMemoryInfo
    from ortagent._core import OrtMemoryInfoDeviceType as OrtMemoryInfoDeviceType
    from ortagent._core import OrtMemType as OrtMemType
    from ortagent._core import OrtSparseFormat as OrtSparseFormat
    from ortagent._core import SparseTensor as SparseTensor
    from ortagent._core import OrtValue as OrtValue
    from ortagent._core import from_dlpack as from_dlpack
    from ortagent._core import is_dlpack_uint8_tensor as is_dlpack_uint8_tensor
    from ortagent.agent import PartialGraphExecutionState as PartialGraphExecutionState
    from ortagent.agent import TrainingAgent as TrainingAgent
    from ortagent.training_ops import lower_training_ops as lower_training_ops
