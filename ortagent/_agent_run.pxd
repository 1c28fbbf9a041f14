# cython: language_level=3
from ortagent cimport _capi as ort
from ortagent._values cimport OrtValue, SpareOutputs
from ortagent._session cimport InferenceSession
from ortagent._run_core cimport RunArrays

# Whether the run preallocated every output at `positions`.
cdef bint _all_preallocated(RunArrays* a, list positions) noexcept
# OrtApi::Run with arrays the caller filled (the state API's hot path); outputs as OrtValues.
# `owned`: the run holds its half's preallocation (the agent's _Preallocation claim), so it
# may read and change the session's FixedOutput states and *preallocate. Preallocated outputs
# come from `spares` (by session output slot) when one was given back, else from `allocator`,
# and go back to `spares` when their last owner drops them.
cdef list _run_hot(InferenceSession session, RunArrays* a, Py_ssize_t n_in, Py_ssize_t n_out,
                   const Py_ssize_t* slots, const bint* twice, bint* preallocate,
                   ort.OrtAllocator* allocator, SpareOutputs spares, bint owned)
# A value's shape as a tuple (read on the CPU or from the device description).
cdef tuple _shape_of(OrtValue value, bint on_cpu)
# Whether a gradient has the element type and shape its module output needs.
cdef bint _gradient_fits(OrtValue gradient, int elem_type, bint full_shape, tuple shape) except -1
cdef bint _broadcasts_to(object shape, object target)
# One half on the CPU: OrtApi::Run with the feeds and the named outputs (some preallocated).
cdef list _run(InferenceSession session, char** input_names, list feeds, int* input_types,
               char** output_names, Py_ssize_t n_out, object preallocated, object run_options)
# One half through an OrtIoBinding: outputs to devices or caller buffers (`targets`).
cdef list _run_bound(InferenceSession session, char** input_names, list feeds, int* input_types,
                     char** output_names, list targets, object run_options)
