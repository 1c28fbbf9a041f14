from contextlib import AbstractContextManager

ALL_PROVIDERS: tuple[str, ...]

def strict_providers(enabled: bool = True) -> AbstractContextManager[None]: ...

# (for ortagent's other modules) provider names, the strict_providers() scope, provider lists
# normalised to [(name, {option: value})], the warning for an unavailable provider
import contextvars

CPU_PROVIDER: str
CUDA_PROVIDER: str
strict_scope: contextvars.ContextVar[bool]

def normalise_providers(providers: object, provider_options: object, strict: bool = False) -> list[tuple[str, dict[str, str]]]: ...
def warn_unavailable(name: str, available: list[str]) -> None: ...
