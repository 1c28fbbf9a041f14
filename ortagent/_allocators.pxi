"""Allocators shared by sessions: OrtArenaCfg (an arena's settings) and the registration of an
allocator with the process's environment (onnxruntime's create_and_register_allocator and _v2).
A session uses the registered allocators when its options carry the config entry
``session.use_env_allocators = 1``."""

cimport cython
from libc.stdlib cimport malloc, free

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, ensure_loaded, shared_runtime, encode_text

from ortagent.errors import OrtFail, OrtInvalidArgument, OrtInvalidType, ProviderError


# OrtArenaCfg's settings, in onnxruntime's order of its four-argument constructor, then the rest
_KEYS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes", "max_dead_bytes_per_chunk",
         "initial_growth_chunk_size_bytes", "max_power_of_two_extend_bytes")


def _setting(name, value):
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise OrtInvalidType(f"OrtArenaCfg {name} must be an int, got {type(value).__name__}")
    value = value.__index__()
    if not -1 <= value < 1 << 63:
        raise OrtInvalidArgument(f"OrtArenaCfg {name} must be -1 (onnxruntime's default) or a size, got {value}")
    return value


@cython.final
cdef class OrtArenaCfg:
    """Arena settings: ``OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes,
    max_dead_bytes_per_chunk)`` or ``OrtArenaCfg({name: value})``; -1 leaves a setting to
    onnxruntime (max_mem: 0)."""
    cdef dict _values

    def __cinit__(self):
        self._values = {"max_mem": 0}
        for name in _KEYS[1:]:
            self._values[name] = -1

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], dict):
            for name, value in args[0].items():
                if name not in _KEYS:
                    # onnxruntime's words for the same mistake
                    raise OrtFail(f"Invalid OrtArenaCfg option: {name}")
                self._values[name] = _setting(name, value)
        elif len(args) == 4:
            for name, value in zip(_KEYS, args):
                self._values[name] = _setting(name, value)
        else:
            raise OrtInvalidType("OrtArenaCfg takes (max_mem, arena_extend_strategy, initial_chunk_size_bytes, "
                                 "max_dead_bytes_per_chunk) or one dict of settings")

    def __getattr__(self, name):
        if name in _KEYS:
            return self._values[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name not in _KEYS:
            raise AttributeError(f"OrtArenaCfg has no setting {name!r}")
        self._values[name] = _setting(name, value)

    def __repr__(self):
        return f"OrtArenaCfg({self._values})"

    cdef ort.OrtArenaCfg* create(self) except NULL:
        """A new C arena config (the caller releases it) with the settings not left at -1."""
        ensure_loaded()
        chosen = [(name.encode(), value) for name, value in self._values.items()
                  if value >= 0 and not (name == "max_mem" and value == 0)]
        cdef Py_ssize_t n = len(chosen), i
        cdef const char** keys = <const char**>malloc((n + 1) * sizeof(char*))
        cdef size_t* values = <size_t*>malloc((n + 1) * sizeof(size_t))
        cdef ort.OrtArenaCfg* cfg = NULL
        try:
            if keys == NULL or values == NULL:
                raise MemoryError()
            for i in range(n):
                keys[i] = <bytes>chosen[i][0]
                values[i] = <size_t>chosen[i][1]
            check(ort.CreateArenaCfgV2(keys, values, <size_t>n, &cfg))
        finally:
            free(keys)
            free(values)
        return cfg


cdef OrtMemoryInfo _memory_info(object mem_info):
    if not isinstance(mem_info, OrtMemoryInfo):
        raise OrtInvalidType(f"mem_info must be an ortagent.OrtMemoryInfo, got {type(mem_info).__name__}")
    (<OrtMemoryInfo>mem_info)._require()
    return mem_info


def create_and_register_allocator(mem_info, arena_cfg):
    """Create an allocator for `mem_info` (with arena settings `arena_cfg`, or None) and register
    it with the environment, for sessions whose options set ``session.use_env_allocators``."""
    cdef OrtMemoryInfo info = _memory_info(mem_info)
    cdef ort.OrtArenaCfg* cfg = NULL
    if arena_cfg is not None:
        if not isinstance(arena_cfg, OrtArenaCfg):
            raise OrtInvalidType(f"arena_cfg must be an ortagent.OrtArenaCfg or None, got {type(arena_cfg).__name__}")
        cfg = (<OrtArenaCfg>arena_cfg).create()
    try:
        check(ort.CreateAndRegisterAllocator(shared_runtime().env, info.handle, cfg))
    finally:
        if cfg != NULL:
            ort.ReleaseArenaCfg(cfg)


def create_and_register_allocator_v2(provider_type, mem_info, provider_options, arena_cfg):
    """As create_and_register_allocator, with the allocator made by the execution provider
    `provider_type` (its options in `provider_options`)."""
    cdef OrtMemoryInfo info = _memory_info(mem_info)
    if not isinstance(provider_options, dict):
        raise OrtInvalidType(f"provider_options must be a dict, got {type(provider_options).__name__}")
    encoded = [(encode_text(str(k), "provider option"), encode_text(str(v), "provider option value"))
               for k, v in provider_options.items()]
    provider = encode_text(provider_type, "provider_type")
    try:
        # onnxruntime's C call aborts the process when the provider's library cannot load
        require_provider_loads(provider_type)
    except ProviderError as exc:
        raise OrtFail(f"{provider_type} cannot create an allocator here: {exc}") from exc
    cdef Py_ssize_t n = len(encoded), i
    cdef const char** keys = <const char**>malloc((n + 1) * sizeof(char*))
    cdef const char** values = <const char**>malloc((n + 1) * sizeof(char*))
    cdef ort.OrtArenaCfg* cfg = NULL
    try:
        if keys == NULL or values == NULL:
            raise MemoryError()
        for i in range(n):
            keys[i] = <bytes>encoded[i][0]
            values[i] = <bytes>encoded[i][1]
        if arena_cfg is not None:
            if not isinstance(arena_cfg, OrtArenaCfg):
                raise OrtInvalidType(f"arena_cfg must be an ortagent.OrtArenaCfg or None, got "
                                     f"{type(arena_cfg).__name__}")
            cfg = (<OrtArenaCfg>arena_cfg).create()
        check(ort.CreateAndRegisterAllocatorV2(shared_runtime().env, provider, info.handle, cfg, keys,
                                               values, <size_t>n))
    finally:
        free(keys)
        free(values)
        if cfg != NULL:
            ort.ReleaseArenaCfg(cfg)
