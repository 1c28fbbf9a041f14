"""SessionOptions and RunOptions (onnxruntime's names and defaults) and LoRA adapters: how a session
is set up and how a run is asked for (execution providers: _providers)."""

import enum
import os

cimport cython
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport strlen, strcpy

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, raise_status, ensure_loaded, shared_runtime, live_handle_counts, count_add, HANDLE_SESSION_OPTIONS,
    HANDLE_RUN_OPTIONS, HANDLE_LORA_ADAPTER, encode_text,
)
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from ortagent.errors import (
    OrtInvalidArgument, OrtInvalidType, OrtNotImplemented, OrtNotFound, OrtNoSuchFile, OrtFail,
)


cdef extern from "ortagent/cpu_kernels.h" nogil:
    const char* ORTAGENT_KERNELS_DOMAIN
    ort.OrtStatus* ortagent_add_cpu_kernels(ort.OrtSessionOptions* options)

CPU_TRAINING_KERNELS_DOMAIN = ORTAGENT_KERNELS_DOMAIN.decode()



class GraphOptimizationLevel(enum.IntEnum):
    """Graph optimisation levels (values of onnxruntime's enum)."""
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3           # onnxruntime >= 1.23 (older runtimes refuse it)
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


def _immutable_copy(buffer, index):
    try:
        return bytes(memoryview(buffer).cast("B"))
    except TypeError:
        raise OrtInvalidType(f"buffers[{index}] must be bytes-like, got {type(buffer).__name__}") from None


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
        self.apply_logid(encode_text(value, "logid"))
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
        count_add(&_live[<int>HANDLE_SESSION_OPTIONS], 1)
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
        self._use_per_session_threads = True
        self._use_deterministic_compute = False
        self._has_providers = False
        self._device_providers = []
        self._cpu_training_kernels = False

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseSessionOptions(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_SESSION_OPTIONS], -1)

    cdef SessionOptions copy(self):
        """New options with the same settings (the C options cloned, the mirrors copied)."""
        cdef SessionOptions other = SessionOptions.__new__(SessionOptions)
        ort.ReleaseSessionOptions(other.handle)
        other.handle = NULL
        count_add(&_live[<int>HANDLE_SESSION_OPTIONS], -1)
        check(ort.CloneSessionOptions(self.handle, &other.handle))
        count_add(&_live[<int>HANDLE_SESSION_OPTIONS], 1)
        other._log_severity_level = self._log_severity_level
        other._log_verbosity_level = self._log_verbosity_level
        other._logid = self._logid
        other._config_entries = dict(self._config_entries)
        other._initializers = list(self._initializers)
        other._dimension_overrides = dict(self._dimension_overrides)
        other._intra_op_num_threads = self._intra_op_num_threads
        other._inter_op_num_threads = self._inter_op_num_threads
        other._graph_optimization_level = self._graph_optimization_level
        other._execution_mode = self._execution_mode
        other._enable_mem_pattern = self._enable_mem_pattern
        other._enable_cpu_mem_arena = self._enable_cpu_mem_arena
        other._enable_profiling = self._enable_profiling
        other._profile_file_prefix = self._profile_file_prefix
        other._optimized_model_filepath = self._optimized_model_filepath
        other._use_per_session_threads = self._use_per_session_threads
        other._use_deterministic_compute = self._use_deterministic_compute
        other._has_providers = self._has_providers
        other._device_providers = list(self._device_providers)
        other._cpu_training_kernels = self._cpu_training_kernels    # (the clone keeps the domain)
        return other

    def __copy__(self):
        return self.copy()

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
            check(ort.EnableProfiling(self.handle, encode_text(self._profile_file_prefix, "profile_file_prefix")))
        else:
            check(ort.DisableProfiling(self.handle))
        self._enable_profiling = value

    @property
    def profile_file_prefix(self):
        return self._profile_file_prefix

    @profile_file_prefix.setter
    def profile_file_prefix(self, value):
        encode_text(value, "profile_file_prefix")
        self._profile_file_prefix = value
        if self._enable_profiling:
            check(ort.EnableProfiling(self.handle, encode_text(value, "profile_file_prefix")))

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
        check(ort.SetOptimizedModelFilePath(self.handle, encode_text(path, "optimized_model_filepath")))
        self._optimized_model_filepath = path

    def add_session_config_entry(self, config_key, config_value):
        """Set a session configuration entry (see onnxruntime_session_options_config_keys.h)."""
        check(ort.AddSessionConfigEntry(self.handle, encode_text(config_key, "config_key"),
                                        encode_text(config_value, "config_value")))
        self._config_entries[config_key] = config_value

    def get_session_config_entry(self, config_key):
        """The value of a configuration entry; OrtNotFound (a RuntimeError too, with onnxruntime's
        message) when it was never set."""
        key = encode_text(config_key, "config_key")
        cdef int present = 0
        cdef size_t size = 0
        check(ort.HasSessionConfigEntry(self.handle, key, &present))
        if not present:
            raise OrtNotFound(f"SessionOptions does not have configuration with key: {config_key}")
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
        require_ort_value(value, f"initializer {name!r}")
        cdef OrtValue v = value
        v.require_handle()
        if value.device_name() != "cpu":
            raise OrtInvalidArgument(f"initializer {name!r} must be a CPU value, got {value.device_name()}")
        check(ort.AddInitializer(self.handle, encode_text(name, "initializer name"), v.handle))
        self._initializers.append((name, value))

    @property
    def use_per_session_threads(self):
        """False: sessions run on the process's global thread pools (see
        set_global_thread_pool_sizes()) instead of their own."""
        return self._use_per_session_threads

    @use_per_session_threads.setter
    def use_per_session_threads(self, bint value):
        if value == self._use_per_session_threads:
            return
        if value:
            raise OrtInvalidArgument("use_per_session_threads cannot be turned back on: onnxruntime's C "
                                     "API can only disable per-session threads; create new SessionOptions")
        check(ort.DisablePerSessionThreads(self.handle))
        self._use_per_session_threads = False

    @property
    def use_deterministic_compute(self):
        """Deterministic kernels where a provider has a choice (OrtApi::SetDeterministicCompute)."""
        return self._use_deterministic_compute

    @use_deterministic_compute.setter
    def use_deterministic_compute(self, bint value):
        check(ort.SetDeterministicCompute(self.handle, value))
        self._use_deterministic_compute = value

    def add_external_initializers(self, names, ort_values):
        """Use these CPU OrtValues for the initializers the model stores in external files
        (OrtApi::AddExternalInitializers). The values are kept alive by these options."""
        names = list(names)
        values = list(ort_values)
        if len(names) != len(values):
            raise OrtInvalidArgument(f"{len(names)} names but {len(values)} values")
        for name, value in zip(names, values):
            require_ort_value(value, f"initializer {name!r}")
            (<OrtValue>value).require_handle()
            if value.device_name() != "cpu":
                raise OrtInvalidArgument(f"initializer {name!r} must be a CPU value, got {value.device_name()}")
        if not names:
            return
        encoded = [encode_text(name, "initializer name") for name in names]
        cdef Py_ssize_t n = len(names), i
        cdef const char** names_c = <const char**>malloc(n * sizeof(char*))
        cdef const ort.OrtValue** values_c = <const ort.OrtValue**>malloc(n * sizeof(ort.OrtValue*))
        try:
            if names_c == NULL or values_c == NULL:
                raise MemoryError()
            for i in range(n):
                names_c[i] = encoded[i]
                values_c[i] = (<OrtValue>values[i]).handle
            check(ort.AddExternalInitializers(self.handle, names_c, <const ort.OrtValue* const*>values_c,
                                              <size_t>n))
        finally:
            free(names_c)
            free(values_c)
        self._initializers.extend(zip(names, values))

    def add_external_initializers_from_files_in_memory(self, names, buffers, lengths):
        """Give the contents of the model's external data files from memory: `names` as the
        model's external data locations, `buffers` bytes-like objects, `lengths` their sizes.
        The buffers are kept alive by these options (onnxruntime reads them at session creation)."""
        names = list(names)
        # immutable copies: onnxruntime reads the buffers when a session is created, after a
        # caller's bytearray or array may have been changed or resized
        buffers = [b if type(b) is bytes else _immutable_copy(b, i) for i, b in enumerate(buffers)]
        lengths = list(lengths)
        if not len(names) == len(buffers) == len(lengths):
            raise OrtInvalidArgument(f"{len(names)} names, {len(buffers)} buffers and {len(lengths)} "
                                     "lengths: one of each per file")
        if not names:
            return
        encoded = [encode_text(os.fspath(name), "file name") for name in names]
        cdef Py_ssize_t n = len(names), i, got = 0
        cdef Py_buffer* views = <Py_buffer*>calloc(n, sizeof(Py_buffer))
        cdef const char** names_c = <const char**>malloc(n * sizeof(char*))
        cdef char** data_c = <char**>malloc(n * sizeof(char*))
        cdef size_t* sizes_c = <size_t*>malloc(n * sizeof(size_t))
        try:
            if views == NULL or names_c == NULL or data_c == NULL or sizes_c == NULL:
                raise MemoryError()
            for i in range(n):
                PyObject_GetBuffer(buffers[i], &views[i], PyBUF_SIMPLE)
                got += 1
                length = lengths[i]
                if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= views[i].len:
                    raise OrtInvalidArgument(f"lengths[{i}] must be an int in [0, {views[i].len}] (the size "
                                             f"of buffers[{i}]), got {length!r}")
                names_c[i] = encoded[i]
                data_c[i] = <char*>views[i].buf
                sizes_c[i] = <size_t>length
            check(ort.AddExternalInitializersFromFilesInMemory(self.handle, names_c, data_c, sizes_c,
                                                               <size_t>n))
        finally:
            if views != NULL:
                for i in range(got):
                    PyBuffer_Release(&views[i])
            free(views)
            free(names_c)
            free(data_c)
            free(sizes_c)
        self._initializers.extend(zip(names, buffers))

    def register_custom_ops_library(self, library_path):
        """Load a shared library of custom operators for sessions using these options
        (OrtApi::RegisterCustomOpsLibrary_V2: onnxruntime loads it and keeps it loaded)."""
        try:
            path = os.fsencode(library_path)
        except TypeError:
            raise OrtInvalidType(f"library_path must be a path, got {type(library_path).__name__}") from None
        if b"\0" in path:
            raise OrtInvalidArgument("library_path must not contain NUL characters")
        check(ort.RegisterCustomOpsLibrary_V2(self.handle, path))

    def add_cpu_training_kernels(self):
        """Let sessions using these options run ortagent's CPU training operators (domain
        ``ai.ortagent.cpu``: the gradients of LayerNorm, BatchNorm, GELU, Softmax, Relu,
        HardSwish and HardSigmoid, BatchNorm's training-mode forward and a softmax of scores
        masked with -inf; see README, "CPU training kernels"), which the training graphs of
        ``build_training_graph(..., cpu_kernels=True)`` use. Adding them twice does nothing."""
        if not self._cpu_training_kernels:
            check(ortagent_add_cpu_kernels(self.handle))
            self._cpu_training_kernels = True

    @property
    def has_cpu_training_kernels(self):
        """Whether add_cpu_training_kernels() was called on these options (or the ones copied)."""
        return self._cpu_training_kernels

    def add_provider_for_devices(self, ep_devices, provider_options):
        """Add the execution provider of `ep_devices` (OrtEpDevice objects of one provider, from
        get_ep_devices()) with `provider_options` ({str: str}); onnxruntime >= 1.22."""
        append_for_devices(self, ep_devices, provider_options)

    def set_provider_selection_policy(self, policy):
        """Let onnxruntime choose the execution providers by an OrtExecutionProviderDevicePolicy;
        onnxruntime >= 1.22."""
        set_selection_policy(self, policy)

    def has_providers(self):
        """Whether execution providers were chosen in these options (devices or a policy)."""
        return self._has_providers

    def add_free_dimension_override_by_name(self, dim_name, dim_value):
        """Fix the symbolic dimension `dim_name` to `dim_value` in sessions using these options."""
        dim_value = _dimension(dim_value, dim_name)
        if dim_value < 0:
            raise OrtInvalidArgument(f"dimension override for {dim_name!r} must be >= 0, got {dim_value}")
        check(ort.AddFreeDimensionOverrideByName(self.handle, encode_text(dim_name, "dim_name"), dim_value))
        self._dimension_overrides[dim_name] = dim_value

    def add_free_dimension_override_by_denotation(self, dim_denotation, dim_value):
        dim_value = _dimension(dim_value, dim_denotation)
        if dim_value < 0:
            raise OrtInvalidArgument(f"dimension override must be >= 0, got {dim_value}")
        check(ort.AddFreeDimensionOverride(self.handle, encode_text(dim_denotation, "dim_denotation"), dim_value))

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
        count_add(&_live[<int>HANDLE_RUN_OPTIONS], 1)
        self._terminate = False
        self._config_entries = {}
        self._adapters = []

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseRunOptions(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_RUN_OPTIONS], -1)

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
        check(ort.AddRunConfigEntry(self.handle, encode_text(config_key, "config_key"),
                                    encode_text(config_value, "config_value")))
        self._config_entries[config_key] = config_value

    def add_active_adapter(self, adapter):
        """Make a LoraAdapter active in the runs using these options (kept alive by them)."""
        if not isinstance(adapter, LoraAdapter):
            raise OrtInvalidType(f"adapter must be an ortagent.LoraAdapter, got {type(adapter).__name__}")
        cdef LoraAdapter lora = adapter
        if lora.handle == NULL:
            raise OrtInvalidArgument("this LoraAdapter holds no adapter yet: call Load() first")
        check(ort.RunOptionsAddActiveLoraAdapter(self.handle, lora.handle))
        lora.active = True
        self._adapters.append(adapter)

    def get_run_config_entry(self, config_key):
        try:
            return self._config_entries[config_key]
        except KeyError:
            raise OrtNotFound(f"no run config entry {config_key!r}") from None

    def __reduce__(self):
        raise OrtInvalidType("RunOptions cannot be pickled")


# ---- LoRA adapters --------------------------------------------------------------------------------

@cython.final
cdef class LoraAdapter:
    """LoRA parameters in onnxruntime's adapter format, activated per run with
    ``RunOptions.add_active_adapter``: ``adapter = LoraAdapter(); adapter.Load(path)``."""

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseLoraAdapter(self.handle)
            self.handle = NULL
            count_add(&_live[<int>HANDLE_LORA_ADAPTER], -1)

    def Load(self, path_or_bytes):
        """Read an adapter from a file (or from the file's bytes), replacing any held before.
        Refused once the adapter is active in a RunOptions: onnxruntime's run options refer to
        the adapter they were given, which must stay as it is."""
        if self.active:
            raise OrtInvalidArgument("this LoraAdapter is active in a RunOptions, which refers to the "
                                     "adapter it holds: load the new one into a new LoraAdapter")
        ensure_loaded()
        cdef ort.OrtLoraAdapter* handle = NULL
        cdef ort.OrtStatus* status = NULL
        cdef const char* path_c
        cdef const unsigned char[::1] data
        if isinstance(path_or_bytes, (str, os.PathLike)):
            path = os.fsencode(path_or_bytes)
            if b"\0" in path:
                raise OrtInvalidArgument("adapter path must not contain NUL characters")
            if not os.path.exists(path):
                raise OrtNoSuchFile(f"no LoRA adapter file {os.fsdecode(path)!r}")
            path_c = path
            status = ort.CreateLoraAdapter(path_c, NULL, &handle)
        elif isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            data = memoryview(path_or_bytes).cast("B")
            if data.shape[0] == 0:
                raise OrtInvalidArgument("the adapter bytes are empty")
            status = ort.CreateLoraAdapterFromArray(&data[0], <size_t>data.shape[0], NULL, &handle)
        else:
            raise OrtInvalidType(f"path_or_bytes must be a path or bytes, got {type(path_or_bytes).__name__}")
        if status != NULL:
            # onnxruntime's module loads adapters in C++ that throws: its errors carry the
            # exception's text alone, without the "[ONNXRuntimeError] : ..." of a status
            raise_status(status, False)
        if self.handle != NULL:
            ort.ReleaseLoraAdapter(self.handle)
            count_add(&_live[<int>HANDLE_LORA_ADAPTER], -1)
        self.handle = handle
        count_add(&_live[<int>HANDLE_LORA_ADAPTER], 1)

    def __reduce__(self):
        raise OrtInvalidType("LoraAdapter cannot be pickled")



# ---- options stored in the model ------------------------------------------------------------------

# The settings onnxruntime reads from a model's "ort_config" metadata ({"session_options": {...}});
# it ignores (and logs) any other key.
_MODEL_CONFIG_KEYS = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode",
                      "graph_optimization_level", "enable_profiling")


def options_from_model(SessionOptions sess_options, model_path, model_bytes):
    """A copy of `sess_options` with the session options stored in the model's "ort_config"
    metadata applied (what onnxruntime does for read_config_from_model /
    ORT_LOAD_CONFIG_FROM_MODEL=1 in its Python module; the C API has no such call), or
    `sess_options` itself when the model stores none."""
    import json
    import onnx
    try:
        if model_bytes is not None:
            model = onnx.load_model_from_string(model_bytes)
        else:
            model = onnx.load(os.fsdecode(model_path), load_external_data=False)
    except Exception as exc:
        raise OrtInvalidArgument(f"cannot read the model's metadata for its session options: {exc}") from exc
    text = None
    for prop in model.metadata_props:
        if prop.key == "ort_config":
            text = prop.value
    if text is None:
        return sess_options
    try:
        config = json.loads(text).get("session_options", {})
    except (ValueError, AttributeError) as exc:
        raise OrtInvalidArgument(f"the model's ort_config metadata is not a JSON object: {exc}") from exc
    options = sess_options.copy()
    for key, value in config.items():
        if key not in _MODEL_CONFIG_KEYS:
            continue
        if key == "enable_profiling":
            options.enable_profiling = bool(int(value))
        elif key == "execution_mode":
            options.execution_mode = ExecutionMode(int(value))
        else:
            setattr(options, key, int(value))
    return options


def effective_options(SessionOptions sess_options, dict kwargs, model_path, model_bytes):
    """The options a session is created with, from onnxruntime's extra constructor arguments:
    the model's stored options applied when read_config_from_model=1 (or the environment's
    ORT_LOAD_CONFIG_FROM_MODEL=1); arguments ortagent cannot honour are errors."""
    for name, value in kwargs.items():
        if name == "disabled_optimizers":
            if value:
                raise OrtNotImplemented("disabled_optimizers cannot be set through onnxruntime's C API")
        elif name != "read_config_from_model":
            raise OrtInvalidType(f"InferenceSession() got an unexpected keyword argument {name!r}")
    read_config = kwargs.get("read_config_from_model")
    if read_config is None:
        read_config = os.environ.get("ORT_LOAD_CONFIG_FROM_MODEL") == "1"
    if read_config and int(read_config) == 1:
        return options_from_model(sess_options, model_path, model_bytes)
    return sess_options


def per_session_threads_refused(SessionOptions options):
    """onnxruntime's rule for sessions of a process with global thread pools: options that ask
    for threads of the session's own (use_per_session_threads, True by default) are refused
    with a RuntimeError (onnxruntime's Python module checks this before creating the session;
    its C API would let such a session run on threads of its own)."""
    from ortagent._runtime import global_thread_pool_sizes
    if options._use_per_session_threads and global_thread_pool_sizes() is not None:
        raise OrtFail("use_per_session_threads must be false when using a global thread pool")


def helper_options():
    """Options for the small sessions ortagent makes for itself (empty sequences, CUDA copies):
    onnxruntime's defaults, on the process's global thread pools when it has them."""
    from ortagent._runtime import global_thread_pool_sizes
    options = SessionOptions()
    if global_thread_pool_sizes() is not None:
        options.use_per_session_threads = False
    return options
