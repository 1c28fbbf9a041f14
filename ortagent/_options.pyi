from typing import final
import enum
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ortagent._values import OrtValue
from ortagent._epdevices import OrtEpDevice

class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99

class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1

@final
class SessionOptions:
    intra_op_num_threads: int
    inter_op_num_threads: int
    graph_optimization_level: GraphOptimizationLevel
    execution_mode: ExecutionMode
    log_severity_level: int
    log_verbosity_level: int
    logid: str
    enable_mem_pattern: bool
    enable_cpu_mem_arena: bool
    enable_profiling: bool
    profile_file_prefix: str
    optimized_model_filepath: str
    use_per_session_threads: bool
    use_deterministic_compute: bool
    def __init__(self) -> None: ...
    def register_custom_ops_library(self, library_path: str | os.PathLike[str]) -> None: ...
    def add_external_initializers(self, names: Sequence[str], ort_values: Sequence[OrtValue]) -> None: ...
    def add_external_initializers_from_files_in_memory(
        self, names: Sequence[str], buffers: Sequence[Any], lengths: Sequence[int]) -> None: ...
    def add_session_config_entry(self, config_key: str, config_value: str) -> None: ...
    def get_session_config_entry(self, config_key: str) -> str: ...
    def add_initializer(self, name: str, value: OrtValue) -> None: ...
    def add_provider_for_devices(self, ep_devices: Sequence[OrtEpDevice], provider_options: dict[str, str]) -> None: ...
    def set_provider_selection_policy(self, policy: int) -> None: ...
    def has_providers(self) -> bool: ...
    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None: ...
    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None: ...

@final
class RunOptions:
    log_severity_level: int
    log_verbosity_level: int
    logid: str
    terminate: bool
    def __init__(self) -> None: ...
    def add_run_config_entry(self, config_key: str, config_value: str) -> None: ...
    def add_active_adapter(self, adapter: LoraAdapter) -> None: ...
    def get_run_config_entry(self, config_key: str) -> str: ...

@final
class LoraAdapter:
    def __init__(self) -> None: ...
    def Load(self, path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview) -> None: ...


def options_from_model(sess_options: SessionOptions, model_path: bytes | None, model_bytes: bytes | None) -> SessionOptions: ...
def effective_options(sess_options: SessionOptions, kwargs: dict[str, Any], model_path: bytes | None,
                      model_bytes: bytes | None) -> SessionOptions: ...
