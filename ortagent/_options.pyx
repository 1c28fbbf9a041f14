# cython: language_level=3
"""SessionOptions and RunOptions (onnxruntime's names and defaults), and the configuration of
execution providers on a session's options: how a session is set up, before it exists."""

import enum
import os

cimport cython
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport strlen, strcpy

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, ensure_loaded, shared_runtime, live_handle_counts, HANDLE_SESSION_OPTIONS, HANDLE_RUN_OPTIONS,
)
from ortagent._values cimport OrtValue
from ortagent._runtime import get_available_providers
from ortagent.errors import OrtInvalidArgument, OrtInvalidType, ObjectClosedError, ProviderError, OrtNotFound

ort.ortagent_rt = shared_runtime()
cdef Py_ssize_t* _live = live_handle_counts()


class GraphOptimizationLevel(enum.IntEnum):
    """Graph optimisation levels (values of onnxruntime's enum)."""
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


cdef bytes _encode(object text, str what):
    if isinstance(text, bytes):
        return text
    if not isinstance(text, str):
        raise OrtInvalidType(f"{what} must be a str, got {type(text).__name__}")
    if "\0" in text:
        raise OrtInvalidArgument(f"{what} must not contain NUL characters: {text!r}")
    return text.encode("utf-8")


cdef int _require_value(object value, str what) except -1:
    if not isinstance(value, OrtValue):
        raise OrtInvalidType(f"{what} must be an ortagent.OrtValue, got {type(value).__name__}")
    return 0


cdef str _take_string(char* text, ort.OrtAllocator* allocator):
    """Decode an ORT-allocated string and free it with `allocator`."""
    if text == NULL:
        return ""
    try:
        return text[:strlen(text)].decode("utf-8", "replace")
    finally:
        check(ort.AllocatorFree(allocator, text))


cdef object _dimension(object value, object name):
    """A dimension override as an int (anything with __index__ but bool), in int64 range."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise OrtInvalidType(f"dimension override for {name!r} must be an int, got {type(value).__name__}")
    value = value.__index__()
    if value >= 1 << 63:
        raise OrtInvalidArgument(f"dimension override for {name!r} is too large: {value}")
    return value


cdef int _check_int_range(object value, str what, long low, long high) except -1:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OrtInvalidType(f"{what} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise OrtInvalidArgument(f"{what} must be in [{low}, {high}], got {value}")
    return 0



# ---- SessionOptions ----------------------------------------------------------------------------

cdef class _LogSettings:
    """The logging settings SessionOptions and RunOptions share (onnxruntime's names and
    defaults); each applies them to its handle with its own C calls (apply_log_*)."""

    def __cinit__(self):
        self._log_severity_level = 2
        self._log_verbosity_level = 0
        self._logid = ""

    cdef int apply_log_severity(self, int level) except -1:
        raise NotImplementedError

    cdef int apply_log_verbosity(self, int level) except -1:
        raise NotImplementedError

    cdef int apply_logid(self, bytes logid) except -1:
        raise NotImplementedError

    @property
    def log_severity_level(self):
        """0 verbose, 1 info, 2 warning, 3 error, 4 fatal."""
        return self._log_severity_level

    @log_severity_level.setter
    def log_severity_level(self, value):
        _check_int_range(value, "log_severity_level", 0, 4)
        self.apply_log_severity(value)
        self._log_severity_level = value

    @property
    def log_verbosity_level(self):
        return self._log_verbosity_level

    @log_verbosity_level.setter
    def log_verbosity_level(self, value):
        _check_int_range(value, "log_verbosity_level", 0, 1 << 30)
        self.apply_log_verbosity(value)
        self._log_verbosity_level = value

    @property
    def logid(self):
        """The log id (RunOptions: the run tag)."""
        return self._logid

    @logid.setter
    def logid(self, value):
        self.apply_logid(_encode(value, "logid"))
        self._logid = value


@cython.final
cdef class SessionOptions(_LogSettings):
    """Options for creating sessions (onnxruntime.SessionOptions' names and defaults).

    ORT keeps no readable copy of most options, so this object mirrors what was set. A session
    copies the options at creation: changing them later affects only sessions created later.
    """

    def __cinit__(self):
        ensure_loaded()
        check(ort.CreateSessionOptions(&self.handle))
        _live[<int>HANDLE_SESSION_OPTIONS] += 1
        self._config_entries = {}
        self._initializers = []
        self._dimension_overrides = {}
        self._intra_op_num_threads = 0
        self._inter_op_num_threads = 0
        self._graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self._execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self._enable_mem_pattern = True
        self._enable_cpu_mem_arena = True
        self._enable_profiling = False
        self._profile_file_prefix = "onnxruntime_profile_"
        self._optimized_model_filepath = ""

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseSessionOptions(self.handle)
            self.handle = NULL
            _live[<int>HANDLE_SESSION_OPTIONS] -= 1

    cdef int require_handle(self) except -1:
        if self.handle == NULL:
            raise ObjectClosedError("these SessionOptions have been released")
        return 0

    @property
    def intra_op_num_threads(self):
        """Threads for parallelism inside an operator; 0 = onnxruntime's default."""
        return self._intra_op_num_threads

    @intra_op_num_threads.setter
    def intra_op_num_threads(self, value):
        _check_int_range(value, "intra_op_num_threads", 0, 1 << 16)
        check(ort.SetIntraOpNumThreads(self.handle, value))
        self._intra_op_num_threads = value

    @property
    def inter_op_num_threads(self):
        """Threads for running operators in parallel (ORT_PARALLEL); 0 = default."""
        return self._inter_op_num_threads

    @inter_op_num_threads.setter
    def inter_op_num_threads(self, value):
        _check_int_range(value, "inter_op_num_threads", 0, 1 << 16)
        check(ort.SetInterOpNumThreads(self.handle, value))
        self._inter_op_num_threads = value

    @property
    def graph_optimization_level(self):
        return GraphOptimizationLevel(self._graph_optimization_level)

    @graph_optimization_level.setter
    def graph_optimization_level(self, value):
        try:
            level = GraphOptimizationLevel(value)
        except ValueError as exc:
            raise OrtInvalidArgument(
                f"graph_optimization_level must be one of {[int(v) for v in GraphOptimizationLevel]}, "
                f"got {value!r}") from exc
        check(ort.SetSessionGraphOptimizationLevel(self.handle, <ort.GraphOptimizationLevel><int>level))
        self._graph_optimization_level = level

    @property
    def execution_mode(self):
        return ExecutionMode(self._execution_mode)

    @execution_mode.setter
    def execution_mode(self, value):
        try:
            mode = ExecutionMode(value)
        except ValueError as exc:
            raise OrtInvalidArgument(f"execution_mode must be ORT_SEQUENTIAL (0) or ORT_PARALLEL (1), "
                                     f"got {value!r}") from exc
        check(ort.SetSessionExecutionMode(self.handle, <ort.ExecutionMode><int>mode))
        self._execution_mode = mode

    cdef int apply_log_severity(self, int level) except -1:
        check(ort.SetSessionLogSeverityLevel(self.handle, level))
        return 0

    cdef int apply_log_verbosity(self, int level) except -1:
        check(ort.SetSessionLogVerbosityLevel(self.handle, level))
        return 0

    cdef int apply_logid(self, bytes logid) except -1:
        check(ort.SetSessionLogId(self.handle, logid))
        return 0

    @property
    def enable_mem_pattern(self):
        return self._enable_mem_pattern

    @enable_mem_pattern.setter
    def enable_mem_pattern(self, bint value):
        check(ort.EnableMemPattern(self.handle) if value else ort.DisableMemPattern(self.handle))
        self._enable_mem_pattern = value

    @property
    def enable_cpu_mem_arena(self):
        return self._enable_cpu_mem_arena

    @enable_cpu_mem_arena.setter
    def enable_cpu_mem_arena(self, bint value):
        check(ort.EnableCpuMemArena(self.handle) if value else ort.DisableCpuMemArena(self.handle))
        self._enable_cpu_mem_arena = value

    @property
    def enable_profiling(self):
        return self._enable_profiling

    @enable_profiling.setter
    def enable_profiling(self, bint value):
        if value:
            check(ort.EnableProfiling(self.handle, _encode(self._profile_file_prefix, "profile_file_prefix")))
        else:
            check(ort.DisableProfiling(self.handle))
        self._enable_profiling = value

    @property
    def profile_file_prefix(self):
        return self._profile_file_prefix

    @profile_file_prefix.setter
    def profile_file_prefix(self, value):
        _encode(value, "profile_file_prefix")
        self._profile_file_prefix = value
        if self._enable_profiling:
            check(ort.EnableProfiling(self.handle, _encode(value, "profile_file_prefix")))

    @property
    def optimized_model_filepath(self):
        """Where to save the optimised model when the session is created ('' = don't)."""
        return self._optimized_model_filepath

    @optimized_model_filepath.setter
    def optimized_model_filepath(self, value):
        try:
            path = os.fspath(value)
        except TypeError:
            raise OrtInvalidType(f"optimized_model_filepath must be a path (str or os.PathLike), got "
                                 f"{type(value).__name__}") from None
        check(ort.SetOptimizedModelFilePath(self.handle, _encode(path, "optimized_model_filepath")))
        self._optimized_model_filepath = path

    def add_session_config_entry(self, config_key, config_value):
        """Set a session configuration entry (see onnxruntime_session_options_config_keys.h)."""
        check(ort.AddSessionConfigEntry(self.handle, _encode(config_key, "config_key"),
                                        _encode(config_value, "config_value")))
        self._config_entries[config_key] = config_value

    def get_session_config_entry(self, config_key):
        """The value of a configuration entry; OrtNotFound when it was never set."""
        key = _encode(config_key, "config_key")
        cdef int present = 0
        cdef size_t size = 0
        check(ort.HasSessionConfigEntry(self.handle, key, &present))
        if not present:
            raise OrtNotFound(f"no session config entry {config_key!r}")
        check(ort.GetSessionConfigEntry(self.handle, key, NULL, &size))
        cdef char* buffer = <char*>malloc(size + 1)
        if buffer == NULL:
            raise MemoryError()
        try:
            check(ort.GetSessionConfigEntry(self.handle, key, buffer, &size))
            return buffer[:strlen(buffer)].decode("utf-8")
        finally:
            free(buffer)

    def add_initializer(self, name, value):
        """Use `value` (a CPU OrtValue) for the initializer `name` of sessions created with these
        options. The value is kept alive by these options."""
        _require_value(value, f"initializer {name!r}")
        cdef OrtValue v = value
        v.require_handle()
        if value.device_name() != "cpu":
            raise OrtInvalidArgument(f"initializer {name!r} must be a CPU value, got {value.device_name()}")
        check(ort.AddInitializer(self.handle, _encode(name, "initializer name"), v.handle))
        self._initializers.append((name, value))

    def add_free_dimension_override_by_name(self, dim_name, dim_value):
        """Fix the symbolic dimension `dim_name` to `dim_value` in sessions using these options."""
        dim_value = _dimension(dim_value, dim_name)
        if dim_value < 0:
            raise OrtInvalidArgument(f"dimension override for {dim_name!r} must be >= 0, got {dim_value}")
        check(ort.AddFreeDimensionOverrideByName(self.handle, _encode(dim_name, "dim_name"), dim_value))
        self._dimension_overrides[dim_name] = dim_value

    def add_free_dimension_override_by_denotation(self, dim_denotation, dim_value):
        dim_value = _dimension(dim_value, dim_denotation)
        if dim_value < 0:
            raise OrtInvalidArgument(f"dimension override must be >= 0, got {dim_value}")
        check(ort.AddFreeDimensionOverride(self.handle, _encode(dim_denotation, "dim_denotation"), dim_value))

    def __repr__(self):
        return (f"SessionOptions(intra_op_num_threads={self._intra_op_num_threads}, "
                f"inter_op_num_threads={self._inter_op_num_threads}, "
                f"graph_optimization_level={self.graph_optimization_level.name}, "
                f"execution_mode={self.execution_mode.name})")

    def __reduce__(self):
        raise OrtInvalidType("SessionOptions cannot be pickled")


# ---- RunOptions ----------------------------------------------------------------------------------

@cython.final
cdef class RunOptions(_LogSettings):
    """Per-run options. ``terminate = True`` (from any thread) stops the runs using this object
    with an error as soon as onnxruntime checks the flag; set it back to False to reuse it."""

    def __cinit__(self):
        ensure_loaded()
        check(ort.CreateRunOptions(&self.handle))
        _live[<int>HANDLE_RUN_OPTIONS] += 1
        self._terminate = False
        self._config_entries = {}

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseRunOptions(self.handle)
            self.handle = NULL
            _live[<int>HANDLE_RUN_OPTIONS] -= 1

    cdef int apply_log_severity(self, int level) except -1:
        check(ort.RunOptionsSetRunLogSeverityLevel(self.handle, level))
        return 0

    cdef int apply_log_verbosity(self, int level) except -1:
        check(ort.RunOptionsSetRunLogVerbosityLevel(self.handle, level))
        return 0

    cdef int apply_logid(self, bytes logid) except -1:
        """The run tag."""
        check(ort.RunOptionsSetRunTag(self.handle, logid))
        return 0

    @property
    def terminate(self):
        return self._terminate

    @terminate.setter
    def terminate(self, bint value):
        cdef ort.OrtRunOptions* handle = self.handle
        with nogil:
            if value:
                check(ort.RunOptionsSetTerminate(handle))
            else:
                check(ort.RunOptionsUnsetTerminate(handle))
        self._terminate = value

    def add_run_config_entry(self, config_key, config_value):
        """Set a run configuration entry (see onnxruntime_run_options_config_keys.h)."""
        check(ort.AddRunConfigEntry(self.handle, _encode(config_key, "config_key"),
                                    _encode(config_value, "config_value")))
        self._config_entries[config_key] = config_value

    def get_run_config_entry(self, config_key):
        try:
            return self._config_entries[config_key]
        except KeyError:
            raise OrtNotFound(f"no run config entry {config_key!r}") from None

    def __reduce__(self):
        raise OrtInvalidType("RunOptions cannot be pickled")


# ---- providers -----------------------------------------------------------------------------------

_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"
# Providers appended through OrtApi::SessionOptionsAppendExecutionProvider, by their short names.
_GENERIC_PROVIDER_NAMES = {
    "DnnlExecutionProvider": "DNNL",
    "OpenVINOExecutionProvider": "OpenVINO",
    "QNNExecutionProvider": "QNN",
    "SNPEExecutionProvider": "SNPE",
    "XnnpackExecutionProvider": "XNNPACK",
    "AzureExecutionProvider": "AZURE",
    "WebGpuExecutionProvider": "WebGPU",
    "VitisAIExecutionProvider": "VitisAI",
    "CoreMLExecutionProvider": "CoreML",
    "JsExecutionProvider": "JS",
    "NvTensorRTRTXExecutionProvider": "NvTensorRtRtx",
}


def _settings_for(list requested, str name):
    """The options of the first provider called `name` in `requested` ([(name, options)]), or {}."""
    for provider, settings in requested:
        if provider == name:
            return settings
    return {}


def _normalise_providers(providers, provider_options):
    """[(name, {str: str})] from onnxruntime's accepted spellings."""
    if providers is None:
        if provider_options:
            raise OrtInvalidArgument("provider_options given without providers")
        return [(_CPU, {})]
    if isinstance(providers, (str, bytes)):
        raise OrtInvalidType("providers must be a list of names or (name, options) tuples, not a string")
    try:
        providers = list(providers)
        if provider_options is not None:
            provider_options = list(provider_options)
    except TypeError:
        raise OrtInvalidType(f"providers and provider_options must be lists, got "
                             f"{type(providers).__name__} and {type(provider_options).__name__}") from None
    if provider_options is not None:
        if len(provider_options) != len(providers):
            raise OrtInvalidArgument(f"{len(providers)} providers but {len(provider_options)} "
                                     "provider_options entries")
        if any([not isinstance(p, str) for p in providers]):
            raise OrtInvalidArgument("when provider_options is given, providers must be names only")
    result = []
    for i, entry in enumerate(providers):
        if isinstance(entry, str):
            name, options = entry, (provider_options[i] if provider_options is not None else {})
        elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str):
            name, options = entry
        else:
            raise OrtInvalidType(f"providers[{i}] must be a name or a (name, options dict) tuple, "
                                 f"got {entry!r}")
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise OrtInvalidType(f"options of {name} must be a dict, got {type(options).__name__}")
        if any([n == name for n, _ in result]):
            raise OrtInvalidArgument(f"provider {name} is listed twice")
        result.append((name, {str(k): _option_text(v) for k, v in options.items()}))
    return result


def _option_text(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


@cython.final
cdef class _OptionArrays:
    """Provider options as the C API takes them: parallel arrays of UTF-8 keys and values (one
    allocation), over bytes objects kept referenced while the arrays live."""
    cdef list encoded
    cdef const char** keys
    cdef const char** values
    cdef Py_ssize_t count

    def __dealloc__(self):
        free(self.keys)                 # the values array is the second half of the same block


cdef _OptionArrays _option_arrays(dict settings):
    cdef _OptionArrays arrays = _OptionArrays.__new__(_OptionArrays)
    cdef Py_ssize_t n = len(settings), i = 0
    cdef bytes key, value
    arrays.encoded = []
    arrays.keys = <const char**>malloc(2 * (n + 1) * sizeof(char*))
    if arrays.keys == NULL:
        raise MemoryError()
    arrays.values = arrays.keys + n + 1
    for name, text in settings.items():
        key = _encode(name, "provider option")
        value = _encode(text, "provider option value")
        arrays.encoded.append(key)
        arrays.encoded.append(value)
        arrays.keys[i] = key
        arrays.values[i] = value
        i += 1
    arrays.count = i
    return arrays


cdef ort.OrtCUDAProviderOptionsV2* _cuda_options(dict settings) except NULL:
    """New CUDA provider options with `settings` applied (the caller releases them)."""
    cdef ort.OrtCUDAProviderOptionsV2* cuda = NULL
    cdef _OptionArrays arrays = _option_arrays(settings)
    check(ort.CreateCUDAProviderOptions(&cuda))
    try:
        if arrays.count:
            check(ort.UpdateCUDAProviderOptions(cuda, arrays.keys, arrays.values, <size_t>arrays.count))
    except BaseException:
        ort.ReleaseCUDAProviderOptions(cuda)
        raise
    return cuda


cdef int _append_cuda(ort.OrtSessionOptions* options, dict settings) except -1:
    cdef ort.OrtCUDAProviderOptionsV2* cuda = _cuda_options(settings)
    try:
        check(ort.SessionOptionsAppendExecutionProvider_CUDA_V2(options, cuda))
    finally:
        ort.ReleaseCUDAProviderOptions(cuda)
    return 0


cdef dict _effective_cuda_options(dict settings):
    """The full option set the CUDA provider runs with, as onnxruntime reports it."""
    cdef ort.OrtAllocator* allocator = NULL
    cdef char* text = NULL
    cdef ort.OrtCUDAProviderOptionsV2* cuda = _cuda_options(settings)
    try:
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        check(ort.GetCUDAProviderOptionsAsString(cuda, allocator, &text))
        joined = _take_string(text, allocator)
    finally:
        ort.ReleaseCUDAProviderOptions(cuda)
    result = {}
    for item in joined.split(";"):
        if "=" in item:
            key, _, value = item.partition("=")
            result[key] = value
    return result


cdef int _append_generic(ort.OrtSessionOptions* options, str name, dict settings) except -1:
    cdef _OptionArrays arrays = _option_arrays(settings)
    check(ort.SessionOptionsAppendExecutionProvider(
        options, _encode(_GENERIC_PROVIDER_NAMES[name], "provider"), arrays.keys, arrays.values,
        <size_t>arrays.count))
    return 0


cdef list _configure_providers(ort.OrtSessionOptions* options, list requested):
    """Append the requested providers to `options`; returns [(name, options)] as registered."""
    available = get_available_providers()
    registered = []
    for name, settings in requested:
        if name not in available:
            known = name == _CPU or name == _CUDA or name in _GENERIC_PROVIDER_NAMES
            raise ProviderError(
                f"{'execution provider ' + name + ' is not available in this onnxruntime build' if known else 'unknown execution provider ' + repr(name)}"
                f" (available: {', '.join(available)})")
        if name == _CPU:
            unknown = set(settings) - {"use_arena"}
            if unknown:
                raise ProviderError(f"unknown CPUExecutionProvider options {sorted(unknown)}; "
                                    "ortagent accepts 'use_arena'")
            continue
        try:
            if name == _CUDA:
                _append_cuda(options, settings)
            elif name in _GENERIC_PROVIDER_NAMES:
                _append_generic(options, name, settings)
            else:
                raise ProviderError(f"ortagent cannot configure execution provider {name} "
                                    f"(supported: {_CPU}, {_CUDA}, {', '.join(_GENERIC_PROVIDER_NAMES)})")
        except ProviderError:
            raise
        except Exception as exc:
            raise ProviderError(f"cannot use execution provider {name}: {exc}") from exc
        registered.append((name, settings))
    cpu_settings = _settings_for(requested, _CPU)
    registered.append((_CPU, cpu_settings))
    return registered


