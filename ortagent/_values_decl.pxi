cimport cython
from cpython.object cimport PyObject
from libc.stdint cimport int64_t
from ortagent cimport _capi as ort



cdef class SpareOutputs


cdef class OrtValue:
    cdef object __weakref__
    # The one owner of `handle` (released in __dealloc__ / _release()).
    cdef ort.OrtValue* handle
    # What keeps the memory under `handle` valid when onnxruntime does not own it: the NumPy
    # array (or its contiguous copy) viewed, the DLPack import, the device allocator that made
    # it, or the owner of a feed whose memory this output shares; None when ORT owns it.
    cdef object memory_owner
    # The InferenceSession (or None) whose run produced this value: its allocators and arena
    # may hold the memory, so the session stays alive as long as the value.
    cdef object session
    # Tensor facts, read once by describe(): elem_type < 0 means "not read yet".
    cdef int elem_type
    cdef int ndim
    cdef int64_t* dims
    cdef int64_t dims_inline[MAX_INLINE_DIMS]
    cdef void* data
    cdef int memory_kind
    cdef int device_id
    cdef bint is_tensor_value
    cdef bint readonly
    # Views and DLPack capsules handed out over this value's memory. close() with exports
    # outstanding only marks the value closed; the handle goes when the last export does.
    cdef Py_ssize_t exports
    # Runs in flight that read or write this value (feeds, bound inputs and outputs, caller
    # buffers). close() during a run only marks the value closed; the run's end releases it.
    cdef Py_ssize_t in_use
    cdef bint close_requested
    # Where the handle goes when this object is deallocated, instead of ReleaseValue: a
    # preallocated run output returns to `spares` (slot `spare_slot`) for a later run of the
    # same output to write into. None for every other value.
    cdef SpareOutputs spares
    cdef Py_ssize_t spare_slot

    cdef int describe(self) except -1
    cdef int describe_as(self, int known_memory_kind) except -1
    cdef int _describe(self, int known_memory_kind) except -1
    cdef int _describe_sparse(self) noexcept
    cdef bint _reserve_dims(self, size_t count) noexcept
    cdef ort.OrtStatus* _type_and_shape(self, ort.ONNXTensorElementDataType* elem, size_t* count) noexcept
    cdef int require_handle(self) except -1
    cdef int _onnx_type(self) except -2
    cdef int begin_use(self) except -1
    cdef void end_use(self) noexcept
    cdef void _release_if_unused(self) noexcept
    cdef void _release(self) noexcept


# Output tensors of fixed type and shape, one per output slot of a session, that their last
# Python owner gave back (OrtValue.__dealloc__) for the next run of the same output to write
# into: the run skips making a tensor (CreateTensorAsOrtValue) and the caller's drop skips
# releasing one. Only __dealloc__ gives a handle back, never close(): a value nobody references
# any more has no view, export, run or aliasing output over its memory (each of those keeps
# the value alive), while a closed one may still be bound or aliased. The handles held here
# are not counted as live (like a session's caches); close() releases them and refuses more.
@cython.final
cdef class SpareOutputs:
    cdef ort.OrtValue** handles
    cdef Py_ssize_t n_slots
    cdef bint closed
    # The handle kept for `slot` (now the caller's), or NULL.
    cdef ort.OrtValue* take(self, Py_ssize_t slot) noexcept
    # Keep `handle` for `slot`; False (the caller releases it) when the slot is taken or closed.
    cdef bint give_back(self, Py_ssize_t slot, ort.OrtValue* handle) noexcept
    # Mark `value` (a preallocated output of `slot`) to come back here when deallocated.
    cdef void adopt(self, OrtValue value, Py_ssize_t slot) noexcept
    cdef void close(self) noexcept


# A new tensor of `dims` and `onnx_type` from `allocator`; `owner` (what keeps the allocator
# alive) becomes the value's memory owner.

# Take ownership of `handle` and wrap it; `memory_owner` and `session` (see OrtValue) are
# kept alive with it.

# A NumPy view (CPU) or copy (strings, device memory) of a value. `tracked` views keep the
# value through an export guard so that close() can tell when they are gone; untracked ones
# (for values never handed to the caller) pin the value until it is deallocated.

# An object that keeps `value`'s memory alive and counts as one export while it lives.

# A tensor over caller memory (`data` on `device`, never dereferenced); `owner` is kept alive.

# Copy tensors pairwise through OrtApi::CopyTensors (same shapes and types, any devices).

# The output values an IoBinding holds, as new OrtValues kept by `owner`, in binding order.

# Outputs sharing a feed's buffer keep that feed's memory owner alive (see _values.pxi); the
# owners come as a C array of borrowed references (NULL: nothing to keep), or as a list.


# `value` must be an OrtValue (OrtInvalidType naming `what` otherwise).
