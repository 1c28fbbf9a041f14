from contextlib import AbstractContextManager

ALL_PROVIDERS: tuple[str, ...]

def strict_providers(enabled: bool = True) -> AbstractContextManager[None]: ...
