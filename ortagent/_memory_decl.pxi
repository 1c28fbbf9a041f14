from ortagent cimport _capi as ort

# Where a tensor's bytes live, as far as ortagent needs to know.
cpdef enum MemoryKind:
    MEMORY_CPU = 0          # host memory owned by the CPU allocator (or the caller)
    MEMORY_CUDA = 1         # CUDA device memory
    MEMORY_CUDA_PINNED = 2  # page-locked host memory (host-accessible, kDLCUDAHost)
    MEMORY_OTHER = 3        # any other device ortagent does not interpret


cdef class OrtDevice:
    cdef readonly int kind          # MemoryKind
    cdef readonly int index         # device id
    cdef ort.OrtMemoryInfo* memory_info(self) except NULL


# The process-wide CPU memory description (created on first use).

# Where memory described by `info` lives (MemoryKind); its device id goes to device_id[0].


cdef class OrtMemoryInfo:
    cdef ort.OrtMemoryInfo* handle
    cdef int _require(self) except -1

# A new OrtMemoryInfo describing the same memory as `info` (borrowed).
# The memory a session's inputs (or outputs) are expected in, as new OrtMemoryInfo objects.
