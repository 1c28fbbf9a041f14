# cython: language_level=3
from ortagent cimport _capi as ort

# The process's pooled CPU allocator (include/ortagent/cpu_pool.h), created on first use; it
# lives as long as the process. For tensors made and freed at the same sizes over and over
# (a training step's preallocated outputs).
cdef ort.OrtAllocator* pooled_cpu_allocator() except NULL
