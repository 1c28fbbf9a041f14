"""The pooled CPU allocator: onnxruntime gets an OrtAllocator whose blocks, once freed, are
kept for the next tensor of the same size class instead of going back to malloc (see
include/ortagent/cpu_pool.h for the layout and the limits)."""

cimport cython
from libc.stdint cimport int64_t

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, ensure_loaded, shared_runtime

from ortagent.errors import OrtFail, OrtInvalidArgument



cdef extern from "ortagent/cpu_pool.h" nogil:
    ctypedef struct ortagent_cpu_pool:
        pass
    int ortagent_pool_init(ortagent_cpu_pool* pool, const ort.OrtMemoryInfo* info)
    void ortagent_pool_counts(ortagent_cpu_pool* pool, size_t* live, size_t* reused, size_t* fresh,
                              size_t* kept)


cdef ortagent_cpu_pool _pool
cdef bint _pool_ready = False
cdef object _pool_guard = object()          # first use: one thread at a time


cdef ort.OrtAllocator* pooled_cpu_allocator() except NULL:
    global _pool_ready
    cdef ort.OrtMemoryInfo* info = NULL
    cdef int error
    with cython.critical_section(_pool_guard):
        if not _pool_ready:
            ensure_loaded()
            # the pool's own description: CPU memory from a device allocator (onnxruntime's
            # name for any allocator that is not its arena)
            check(ort.CreateCpuMemoryInfo(ort.OrtDeviceAllocator, ort.OrtMemTypeDefault, &info))
            error = ortagent_pool_init(&_pool, info)
            if error != 0:
                ort.ReleaseMemoryInfo(info)
                raise OrtFail(f"could not set up the pooled CPU allocator's lock (error {error})")
            _pool_ready = True
    return <ort.OrtAllocator*>&_pool


def _pool_counts():
    """The pooled CPU allocator's counters (for tests): blocks live (handed out, not freed),
    allocations served from a free list, allocations that called malloc, free blocks kept."""
    cdef size_t live = 0, reused = 0, fresh = 0, kept = 0
    pooled_cpu_allocator()
    ortagent_pool_counts(&_pool, &live, &reused, &fresh, &kept)
    return {"live": live, "reused": reused, "fresh": fresh, "kept": kept}


def _pool_address():
    """The pool's address as an int (for tests: C code that inspects the pool, whose first
    member is the OrtAllocator handed to onnxruntime, is given it); sets the pool up first."""
    return <size_t>pooled_cpu_allocator()


def _pooled_tensor(Py_ssize_t nbytes):
    """A uint8 tensor of `nbytes` elements that onnxruntime makes on the pool (for tests: the
    path a preallocated output takes, at any size)."""
    cdef int64_t dims[1]
    cdef ort.OrtValue* handle = NULL
    if nbytes < 0:
        raise OrtInvalidArgument(f"nbytes must be >= 0, got {nbytes}")
    dims[0] = nbytes
    check(ort.CreateTensorAsOrtValue(pooled_cpu_allocator(), dims, 1, ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
                                     &handle))
    return wrap_value(handle, None, None)
