# cython: language_level=3
from ortagent cimport _capi as ort

# Kinds of ORT handles whose live instances are counted (see live_handles()).
cpdef enum HandleKind:
    HANDLE_SESSION = 0
    HANDLE_SESSION_OPTIONS = 1
    HANDLE_RUN_OPTIONS = 2
    HANDLE_VALUE = 3
    HANDLE_MEMORY_INFO = 4
    HANDLE_IO_BINDING = 5
    HANDLE_ALLOCATOR = 6
    HANDLE_RUN_STATE = 7
    HANDLE_DLPACK_EXPORT = 8
    HANDLE_SYNC_STREAM = 9
    HANDLE_COMPILE_OPTIONS = 10
    HANDLE_LORA_ADAPTER = 11
    HANDLE_KIND_COUNT = 12

# The process-wide runtime description; its fields are filled once the runtime is loaded.
cdef ort.ortagent_runtime* shared_runtime() noexcept nogil
# Live-handle counters, indexed by HandleKind; change them with count_add only.
cdef Py_ssize_t* live_handle_counts() noexcept nogil

# `*counter += delta`: an atomic add on a free-threaded build (other threads change the same
# counter with no lock held), a plain one where the GIL serialises every change.
cdef extern from *:
    """
    #ifndef ORTAGENT_COUNT_ADD
    #ifdef Py_GIL_DISABLED
    #define ORTAGENT_COUNT_ADD(counter, delta) ((void)__atomic_fetch_add((counter), (delta), __ATOMIC_RELAXED))
    #else
    #define ORTAGENT_COUNT_ADD(counter, delta) ((void)(*(counter) += (delta)))
    #endif
    #endif
    """
    void count_add "ORTAGENT_COUNT_ADD"(Py_ssize_t* counter, Py_ssize_t delta) noexcept nogil

# Load the runtime (once); raises OrtLoadError. Needs the GIL.
cdef int ensure_loaded() except -1
# Turn a non-NULL status into the matching OrtError (releasing the status) and raise it; its
# text is onnxruntime's "[ONNXRuntimeError] : <code> : <NAME> : <message>", or the message alone
# when `prefixed` is false (where onnxruntime's module raises the text of a C++ exception).
cdef int raise_status(ort.OrtStatus* status, bint prefixed=*) except -1


# Ctrl-C while the main thread runs a model (see _runtime.pyx). interruptible_begin returns the
# RunOptions to run with (`given`, or a process-wide one when `given` is NULL) and says whether
# the run was registered; interruptible_end must follow, with the GIL, right after the run
# returns and before its status is checked: it raises KeyboardInterrupt when SIGINT stopped it.
cdef ort.OrtRunOptions* interruptible_begin(ort.OrtRunOptions* given, bint* registered) except? NULL
cdef int interruptible_end(ort.OrtRunOptions* used, bint registered) except -1


cdef inline int check(ort.OrtStatus* status) except -1 nogil:
    """Return 0 for success (NULL); otherwise take the GIL and raise the status as OrtError."""
    if status == NULL:
        return 0
    with gil:
        raise_status(status)
    return -1


# Text for the C API: a str (no NUL characters) as UTF-8 bytes, bytes as given; `what` names
# it in errors (OrtInvalidType, OrtInvalidArgument).
cdef bytes encode_text(object text, str what)
# Decode a string onnxruntime allocated with `allocator`, and free it ("" for NULL).
cdef str take_ort_string(char* text, ort.OrtAllocator* allocator)
