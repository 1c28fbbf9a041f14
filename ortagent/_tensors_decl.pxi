from libc.stdint cimport int64_t
from ortagent cimport _capi as ort

# A new ORT tensor over a NumPy array's memory (or over a contiguous copy, appended to `keep`).
# `expected_type` (ONNX element type, or -1) is checked first and reported with `name`.
# The caller owns the returned handle and must keep the array (and `keep`) alive while it lives.

# A reusable tensor over the memory of the NumPy array last fed to one input. A run that feeds
# an array with the same address, size, element type and shape reuses the tensor instead of
# creating one: the tensor is only a description of that memory, so it describes the new array
# exactly. `users` counts the runs using `value` (changed with the GIL held); `serial` changes
# whenever `value` is replaced or cleared (so a binding of an earlier `value` is seen stale even
# where a new handle lands at the old one's address).
cdef struct FeedView:
    ort.OrtValue* value
    unsigned long long serial
    void* data
    size_t nbytes
    int elem_type
    int ndim
    int64_t dims[MAX_INLINE_DIMS]
    Py_ssize_t users

# The tensor for `feed` (see tensor_for_feed). When `*from_cache` comes back true the tensor
# belongs to `cache` and the caller must call release_feed_view(cache) once done with it;
# otherwise the caller owns the returned handle.

# The data address of a tensor value (NULL for non-tensors, empty tensors, errors).

# UTF-8 bytes of a NumPy array's string items; `has_nul` NULL refuses NUL characters, otherwise
# it is set to whether any item holds one.
# A new ORT string tensor holding UTF-8 copies of a NumPy array's items (str, bytes or objects);
# NUL characters are kept (OrtApi::GetResizedStringTensorElementBuffer).
# Refill string tensor `handle` with UTF-8 copies of `arr`'s items (as many as it holds).

# A new C-contiguous NumPy array of ONNX element type `elem_type` (one NumPy has a builtin type
# for) and shape dims[:ndim], and in tensor_out a new tensor over its memory, for onnxruntime to
# write an output into; the caller releases the tensor, the array owns the memory.
# A new C-contiguous NumPy array like new_output_array's, holding a copy of `nbytes` at `data`.
# A new NumPy object array of `shape` holding the `count` strings of a string tensor.
