from typing import final
import enum
import os
from collections.abc import Callable
from typing import Any

from ortagent._options import GraphOptimizationLevel, SessionOptions

class OrtCompileApiFlags(enum.IntFlag):
    NONE = 0
    ERROR_IF_NO_NODES_COMPILED = 1
    ERROR_IF_OUTPUT_FILE_EXISTS = 2

@final
class ModelCompiler:
    def __init__(self, sess_options: SessionOptions, input_model_path_or_bytes: str | os.PathLike[str] | bytes | Any,
                 embed_compiled_data_into_model: bool = False,
                 external_initializers_file_path: str | os.PathLike[str] | None = None,
                 external_initializers_size_threshold: int = 1024, flags: int = ...,
                 graph_optimization_level: int = ...,
                 get_initializer_location_func: None = None) -> None: ...
    def compile_to_file(self, output_model_path: str | os.PathLike[str] | None = None) -> None: ...
    def compile_to_bytes(self) -> bytes: ...
    def compile_to_stream(self, write_function: Callable[[bytes], object]) -> None: ...
