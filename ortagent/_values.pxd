# cython: language_level=3
from cpython.object cimport PyObject
from libc.stdint cimport int64_t
from ortagent cimport _capi as ort

# Where a tensor's bytes live, as far as ortagent needs to know.
cpdef enum MemoryKind:
    MEMORY_CPU = 0          # host memory owned by the CPU allocator (or the caller)
    MEMORY_CUDA = 1         # CUDA device memory
    MEMORY_CUDA_PINNED = 2  # page-locked host memory (host-accessible, kDLCUDAHost)
    MEMORY_OTHER = 3        # any other device ortagent does not interpret

cdef enum:
    MAX_INLINE_DIMS = 8


cdef class OrtDevice:
    cdef readonly int kind          # MemoryKind
    cdef readonly int index         # device id
    cdef ort.OrtMemoryInfo* memory_info(self) except NULL


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

    cdef int describe(self) except -1
    cdef int describe_as(self, int known_memory_kind) except -1
    cdef bint _reserve_dims(self, size_t count) noexcept
    cdef ort.OrtStatus* _type_and_shape(self, ort.ONNXTensorElementDataType* elem, size_t* count) noexcept
    cdef int require_handle(self) except -1
    cdef int begin_use(self) except -1
    cdef void end_use(self) noexcept
    cdef void _release_if_unused(self) noexcept
    cdef void _release(self) noexcept


# A new tensor of `dims` and `onnx_type` from `allocator`; `owner` (what keeps the allocator
# alive) becomes the value's memory owner.
cdef OrtValue allocate_with(ort.OrtAllocator* allocator, list dims, int onnx_type, object owner)

# Take ownership of `handle` and wrap it; `memory_owner` and `session` (see OrtValue) are
# kept alive with it.
cdef OrtValue wrap_value(ort.OrtValue* handle, object memory_owner, object session)

# A new ORT tensor over a NumPy array's memory (or over a contiguous copy, appended to `keep`).
# `expected_type` (ONNX element type, or -1) is checked first and reported with `name`.
# The caller owns the returned handle and must keep the array (and `keep`) alive while it lives.
cdef ort.OrtValue* tensor_for_feed(object feed, object name, int expected_type, list keep) except NULL

# A reusable tensor over the memory of the NumPy array last fed to one input. A run that feeds
# an array with the same address, size, element type and shape reuses the tensor instead of
# creating one: the tensor is only a description of that memory, so it describes the new array
# exactly. `users` counts the runs using `value` (changed with the GIL held).
cdef struct FeedView:
    ort.OrtValue* value
    void* data
    size_t nbytes
    int elem_type
    int ndim
    int64_t dims[MAX_INLINE_DIMS]
    Py_ssize_t users

# The tensor for `feed` (see tensor_for_feed). When `*from_cache` comes back true the tensor
# belongs to `cache` and the caller must call release_feed_view(cache) once done with it;
# otherwise the caller owns the returned handle.
cdef ort.OrtValue* feed_view(FeedView* cache, object feed, object name, int expected_type,
                             list keep, bint* from_cache) except NULL
cdef void release_feed_view(FeedView* cache) noexcept

# The output values an IoBinding holds, as new OrtValues kept by `owner`, in binding order.
cdef list bound_output_values(ort.OrtIoBinding* binding, object owner)

# The data address of a tensor value (NULL for non-tensors, empty tensors, errors).
cdef void* tensor_data(ort.OrtValue* handle) noexcept
# Outputs sharing a feed's buffer keep that feed's memory owner alive (see _values.pyx); the
# owners come as a C array of borrowed references (NULL: nothing to keep), or as a list.
cdef int keep_aliased_feeds_alive_c(list outputs, void** feed_data, PyObject** holders,
                                    Py_ssize_t n_feeds, object session, object skip) except -1
cdef int keep_aliased_feeds_alive(list outputs, void** feed_data, Py_ssize_t n_feeds, object holders,
                                  object session, object skip) except -1
cdef void clear_feed_view(FeedView* cache) noexcept

# A NumPy view (CPU) or copy (strings, device memory) of a value. `tracked` views keep the
# value through an export guard so that close() can tell when they are gone; untracked ones
# (for values never handed to the caller) pin the value until it is deallocated.
cdef object value_to_numpy(OrtValue value, bint tracked)

# An object that keeps `value`'s memory alive and counts as one export while it lives.
cdef object export_guard(OrtValue value)

# A tensor over caller memory (`data` on `device`, never dereferenced); `owner` is kept alive.
cdef OrtValue value_over_memory(void* data, object dims, int elem_type, OrtDevice device,
                                object owner, bint readonly)

# A new C-contiguous NumPy array of ONNX element type `elem_type` (one NumPy has a builtin type
# for) and shape dims[:ndim], and in tensor_out a new tensor over its memory, for onnxruntime to
# write an output into; the caller releases the tensor, the array owns the memory.
cdef object new_output_array(int elem_type, int ndim, const int64_t* dims,
                             ort.OrtValue** tensor_out)
# A new C-contiguous NumPy array like new_output_array's, holding a copy of `nbytes` at `data`.
cdef object new_array_from(int elem_type, int ndim, const int64_t* dims, const void* data, size_t nbytes)
# Whether NumPy has a builtin type for ONNX element type `elem_type` (new_output_array's types).
cdef bint has_builtin_numpy_type(int elem_type) noexcept
# Bytes per element of ONNX element type `elem_type` (0 for strings and unknown types).
cdef int element_size(int elem_type) noexcept

# The process-wide CPU memory description (created on first use).
cdef ort.OrtMemoryInfo* cpu_memory_info() except NULL

# Where memory described by `info` lives (MemoryKind); its device id goes to device_id[0].
cdef int memory_kind_of(const ort.OrtMemoryInfo* info, int* device_id) except -1

# 'tensor(float)' style name of an ONNX element type.
cdef str tensor_type_name(int elem_type)

cdef int ensure_numpy() except -1

# Copy tensors pairwise through OrtApi::CopyTensors (same shapes and types, any devices).
cdef int copy_tensors(list sources, list destinations) except -1
