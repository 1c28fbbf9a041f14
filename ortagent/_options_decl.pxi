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
    cdef bint _use_per_session_threads
    cdef bint _use_deterministic_compute
    cdef bint _has_providers         # devices or a selection policy were given (see _epdevices)
    cdef list _device_providers      # names of the providers added for devices, in order
    cdef bint _cpu_training_kernels  # ortagent's CPU gradient kernels were added (cpu_kernels.h)
    cdef SessionOptions copy(self)


cdef class RunOptions(_LogSettings):
    cdef object __weakref__
    cdef ort.OrtRunOptions* handle
    cdef bint _terminate
    cdef dict _config_entries
    cdef list _adapters              # LoraAdapters made active (kept alive while these options are)


cdef class LoraAdapter:
    cdef ort.OrtLoraAdapter* handle
    cdef bint active                 # added to a RunOptions, which refers to `handle`

