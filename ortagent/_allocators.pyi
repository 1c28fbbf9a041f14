from typing import Any, final

from ortagent._memory import OrtMemoryInfo

@final
class OrtArenaCfg:
    max_mem: int
    arena_extend_strategy: int
    initial_chunk_size_bytes: int
    max_dead_bytes_per_chunk: int
    initial_growth_chunk_size_bytes: int
    max_power_of_two_extend_bytes: int
    def __init__(self, *args: Any) -> None: ...

def create_and_register_allocator(mem_info: OrtMemoryInfo, arena_cfg: OrtArenaCfg | None) -> None: ...
def create_and_register_allocator_v2(provider_type: str, mem_info: OrtMemoryInfo,
                                     provider_options: dict[str, Any], arena_cfg: OrtArenaCfg | None) -> None: ...
