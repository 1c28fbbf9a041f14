# cython: language_level=3
from ortagent cimport _capi as ort


cdef class _LogSettings:
    cdef int _log_severity_level
    cdef int _log_verbosity_level
    cdef str _logid
    cdef int apply_log_severity(self, int level) except -1
    cdef int apply_log_verbosity(self, int level) except -1
    cdef int apply_logid(self, bytes logid) except -1


cdef class SessionOptions(_LogSettings):
    cdef object __weakref__
    cdef ort.OrtSessionOptions* handle
    cdef dict _config_entries
    cdef list _initializers          # [(name, OrtValue)] kept alive for the sessions using them
    cdef dict _dimension_overrides
    cdef int _intra_op_num_threads
    cdef int _inter_op_num_threads
    cdef int _graph_optimization_level
    cdef int _execution_mode
    cdef bint _enable_mem_pattern
    cdef bint _enable_cpu_mem_arena
    cdef bint _enable_profiling
    cdef str _profile_file_prefix
    cdef str _optimized_model_filepath
    cdef int require_handle(self) except -1


cdef class RunOptions(_LogSettings):
    cdef object __weakref__
    cdef ort.OrtRunOptions* handle
    cdef bint _terminate
    cdef dict _config_entries


# UTF-8 bytes of a name or option text (no NUL); `what` names it in errors.
cdef bytes _encode(object text, str what)
# Decode an ORT-allocated string and free it with `allocator`.
cdef str _take_string(char* text, ort.OrtAllocator* allocator)
# `value` must be an OrtValue (OrtInvalidType naming `what` otherwise).
cdef int _require_value(object value, str what) except -1
# Append the requested providers ([(name, options)], normalised) to `options`; returns their names.
cdef list _configure_providers(ort.OrtSessionOptions* options, list requested)
# The CUDA provider's options as onnxruntime will use them (defaults filled in).
cdef dict _effective_cuda_options(dict settings)
