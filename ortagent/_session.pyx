# cython: language_level=3
"""InferenceSession and IOBinding, with the names and behaviour of onnxruntime's Python classes
and the cost of calling the C API directly, and the run core they share with the agent engine.

Input and output names are encoded once when the session is created; a run builds its C arrays
on the stack (heap beyond 16 entries), creates tensors over the NumPy feeds, releases the GIL
around ``OrtApi::Run`` and returns NumPy views of the buffers ORT produced.
"""

import enum
import os

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_GetItem
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsSsize_t
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF, Py_XDECREF
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport strlen, strcpy

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, ensure_loaded, shared_runtime, live_handle_counts, interruptible_begin, interruptible_end,
    HANDLE_SESSION, HANDLE_SESSION_OPTIONS, HANDLE_RUN_OPTIONS, HANDLE_VALUE, HANDLE_IO_BINDING,
)
from ortagent._values cimport (
    OrtValue, OrtDevice, MEMORY_CPU, FeedView, wrap_value, tensor_for_feed, value_to_numpy,
    tensor_type_name, feed_view, release_feed_view, clear_feed_view, tensor_data,
    keep_aliased_feeds_alive, keep_aliased_feeds_alive_c, bound_output_values,
    new_output_array, new_array_from, has_builtin_numpy_type, element_size, MAX_INLINE_DIMS,
)
from ortagent._options cimport (
    SessionOptions, RunOptions, _encode, _require_value, _take_string, _configure_providers,
    _effective_cuda_options,
)
from ortagent._values import as_device, output_target
from ortagent._options import GraphOptimizationLevel, ExecutionMode, _normalise_providers, _settings_for, _CPU, _CUDA
import ortagent._options as _options_module

# the option classes, also under this module's name (where they lived before); the cimported
# names above are their C types, not module attributes
globals()["SessionOptions"] = _options_module.SessionOptions
globals()["RunOptions"] = _options_module.RunOptions
from ortagent._runtime import get_available_providers
from ortagent.errors import (
    OrtInvalidArgument, OrtInvalidType, ObjectClosedError, ProviderError, OrtNotFound,
)

ort.ortagent_rt = shared_runtime()
cdef Py_ssize_t* _live = live_handle_counts()

cdef enum:
    # Outputs larger than this are left to onnxruntime even when their shape is fixed. A new
    # NumPy array of a few MiB or more is a fresh mmap whose pages fault in on every run
    # (64 MiB: 10.4 ms a run against 4.7 ms with onnxruntime's arena reusing its memory);
    # below glibc's default mmap threshold (128 KiB) it comes from the heap, and small outputs
    # are where sparing onnxruntime's allocation matters.
    PREALLOCATE_MAX_BYTES = 65536
    # Fixed outputs up to this size go through the session's scratch tensor (FixedOutput.scratch)
    # and one memcpy into a new array: on Identity f32[1] that is ~1,200 instructions a run less
    # than a new tensor over each new array (CreateTensorWithDataAsOrtValue + ReleaseValue).
    COPY_OUT_MAX_BYTES = 1024
    # What run() did for each feed: borrowed the caller's OrtValue, created a tensor it must
    # release, or used the feed view cached for input (value - FEED_CACHED).
    FEED_BORROWED = -2
    FEED_CREATED = -1
    FEED_CACHED = 0


# ---- metadata ------------------------------------------------------------------------------------

class NodeArg:
    """Name, type string and shape of a model input or output. Dimensions are ints, the name of
    a symbolic dimension, or None when unknown."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, name, type, shape):
        self.name = name
        self.type = type
        self.shape = shape

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"

    def __eq__(self, other):
        return (isinstance(other, NodeArg) and self.name == other.name
                and self.type == other.type and self.shape == other.shape)

    __hash__ = None


class ModelMetadata:
    """Metadata stored in the model (onnxruntime.ModelMetadata's attributes)."""

    def __init__(self, producer_name, graph_name, domain, description, graph_description,
                 version, custom_metadata_map):
        self.producer_name = producer_name
        self.graph_name = graph_name
        self.domain = domain
        self.description = description
        self.graph_description = graph_description
        self.version = version
        self.custom_metadata_map = custom_metadata_map

    def __repr__(self):
        return (f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, "
                f"version={self.version})")


cdef object _node_arg(str name, const ort.OrtTypeInfo* type_info, int* elem_out):
    cdef ort.ONNXType onnx_type = ort.ONNX_TYPE_UNKNOWN
    cdef const ort.OrtTensorTypeAndShapeInfo* tensor_info = NULL
    cdef ort.ONNXTensorElementDataType elem = ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
    cdef size_t count = 0, i
    cdef int64_t* dims = NULL
    cdef const char** symbolic = NULL
    check(ort.GetOnnxTypeFromTypeInfo(type_info, &onnx_type))
    elem_out[0] = -1
    if onnx_type != ort.ONNX_TYPE_TENSOR and onnx_type != ort.ONNX_TYPE_SPARSETENSOR:
        kind = {ort.ONNX_TYPE_SEQUENCE: "seq", ort.ONNX_TYPE_MAP: "map",
                ort.ONNX_TYPE_OPTIONAL: "optional", ort.ONNX_TYPE_OPAQUE: "opaque"}.get(onnx_type, "unknown")
        return NodeArg(name, kind, None)
    check(ort.CastTypeInfoToTensorInfo(type_info, &tensor_info))
    check(ort.GetTensorElementType(tensor_info, &elem))
    check(ort.GetDimensionsCount(tensor_info, &count))
    dims = <int64_t*>malloc((count + 1) * sizeof(int64_t))
    symbolic = <const char**>malloc((count + 1) * sizeof(char*))
    if dims == NULL or symbolic == NULL:
        free(dims)
        free(symbolic)
        raise MemoryError()
    try:
        check(ort.GetDimensions(tensor_info, dims, count))
        check(ort.GetSymbolicDimensions(tensor_info, symbolic, count))
        shape = []
        for i in range(count):
            if dims[i] >= 0:
                shape.append(dims[i])
            elif symbolic[i] != NULL and symbolic[i][0] != 0:
                shape.append(symbolic[i][:strlen(symbolic[i])].decode("utf-8"))
            else:
                shape.append(None)
    finally:
        free(dims)
        free(symbolic)
    elem_out[0] = <int>elem
    type_name = tensor_type_name(<int>elem)
    if onnx_type == ort.ONNX_TYPE_SPARSETENSOR:
        type_name = "sparse_" + type_name
    return NodeArg(name, type_name, shape)



cdef inline bint _asked_twice(const Py_ssize_t* positions, Py_ssize_t n, Py_ssize_t i) noexcept:
    """Whether output position positions[i] stands anywhere else in positions[:n]."""
    cdef Py_ssize_t j
    for j in range(n):
        if j != i and positions[j] == positions[i]:
            return True
    return False


# ---- the run core (shared by InferenceSession, IOBinding and the agent engine) ----------------------

cdef int run_arrays_init(RunArrays* arrays, RunStack* stack, Py_ssize_t n_in, Py_ssize_t n_out) except -1:
    arrays.heap = NULL
    if n_in <= RUN_STACK_SLOTS and n_out <= RUN_STACK_SLOTS:
        arrays.in_names = stack.in_names
        arrays.in_values = stack.in_values
        arrays.in_created = stack.in_created
        arrays.in_refs = stack.in_refs
        arrays.in_data = stack.in_data
        arrays.in_holders = stack.in_holders
        arrays.out_names = stack.out_names
        arrays.out_values = stack.out_values
        arrays.out_positions = stack.out_positions
        arrays.out_arrays = stack.out_arrays
        return 0
    # every array holds pointer-sized items: carve them from one block
    cdef size_t n_i = <size_t>max(n_in, 1), n_o = <size_t>max(n_out, 1)
    cdef char** block = <char**>malloc((6 * n_i + 4 * n_o) * sizeof(void*))
    if block == NULL:
        raise MemoryError()
    arrays.heap = block
    arrays.in_names = <const char**>block
    arrays.in_values = <ort.OrtValue**>(block + n_i)
    arrays.in_created = <Py_ssize_t*>(block + 2 * n_i)
    arrays.in_refs = <PyObject**>(block + 3 * n_i)
    arrays.in_data = <void**>(block + 4 * n_i)
    arrays.in_holders = <PyObject**>(block + 5 * n_i)
    arrays.out_names = <const char**>(block + 6 * n_i)
    arrays.out_values = <ort.OrtValue**>(block + 6 * n_i + n_o)
    arrays.out_positions = <Py_ssize_t*>(block + 6 * n_i + 2 * n_o)
    arrays.out_arrays = <PyObject**>(block + 6 * n_i + 3 * n_o)
    return 0


cdef void run_arrays_release(RunArrays* arrays) noexcept:
    free(arrays.heap)
    arrays.heap = NULL


cdef ort.OrtStatus* run_nogil(ort.OrtSession* session, ort.OrtRunOptions* options, RunArrays* arrays,
                              Py_ssize_t n_in, Py_ssize_t n_out) noexcept:
    cdef ort.OrtStatus* status
    with nogil:
        status = ort.Run(session, options, arrays.in_names, <const ort.OrtValue* const*>arrays.in_values,
                         <size_t>n_in, arrays.out_names, <size_t>n_out, arrays.out_values)
    return status


cdef ort.OrtStatus* run_binding_nogil(ort.OrtSession* session, ort.OrtRunOptions* options,
                                      ort.OrtIoBinding* binding, bint synchronize) noexcept:
    cdef ort.OrtStatus* status
    with nogil:
        status = ort.RunWithBinding(session, options, binding)
        if status == NULL and synchronize:
            status = ort.SynchronizeBoundOutputs(binding)
    return status


cdef int end_run_call(ort.OrtRunOptions* used, bint registered, ort.OrtStatus* status) except -1:
    try:
        interruptible_end(used, registered)
    except BaseException:
        if status != NULL:
            ort.ReleaseStatus(status)
        raise
    return 0


cdef int check_run_status(ort.OrtStatus* status, InferenceSession session, object names,
                          object feeds) except -1:
    if status == NULL:
        return 0
    cdef OrtValue value
    try:
        check(status)
    except OrtInvalidArgument as exc:
        for name, feed in zip(names, feeds):
            position = session.input_index.get(name)
            if type(feed) is not OrtValue or position is None:
                continue
            value = feed
            value.describe()
            expected = session.input_elem_types[<Py_ssize_t>position]
            if expected >= 0 and value.is_tensor_value and value.elem_type != expected:
                raise OrtInvalidArgument(f"input {name!r} expects {tensor_type_name(expected)}, got an "
                                         f"OrtValue of {tensor_type_name(value.elem_type)}") from exc
        raise
    return 0


# ---- InferenceSession ----------------------------------------------------------------------------

cdef char* _copy_c_string(bytes text) except NULL:
    cdef char* copy = <char*>malloc(PyBytes_GET_SIZE(text) + 1)
    if copy == NULL:
        raise MemoryError()
    strcpy(copy, PyBytes_AS_STRING(text))
    return copy


@cython.final
cdef class InferenceSession:
    """A loaded model, run with NumPy arrays or OrtValues.

    ``InferenceSession(path_or_bytes, sess_options=None, providers=None, provider_options=None)``
    where `path_or_bytes` is a file path, the serialized model, or an ``onnx.ModelProto``, and
    `providers` lists provider names or ``(name, options)`` tuples in order of precedence
    (default: CPU only). The CPU provider is always available as the last resort.
    """

    def __cinit__(self):
        self.input_index = {}
        self.output_index = {}
        self._inputs_meta = []
        self._outputs_meta = []
        self._overridable_meta = []

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None):
        if self.handle != NULL:
            raise OrtInvalidArgument("InferenceSession is already initialised")
        ensure_loaded()
        if sess_options is None:
            sess_options = SessionOptions()
        elif not isinstance(sess_options, SessionOptions):
            raise OrtInvalidType(f"sess_options must be ortagent.SessionOptions, got "
                                 f"{type(sess_options).__name__}")
        (<SessionOptions>sess_options).require_handle()
        requested = _normalise_providers(providers, provider_options)
        model_bytes = None
        model_path = None
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            model_bytes = bytes(path_or_bytes)
        elif isinstance(path_or_bytes, (str, os.PathLike)):
            model_path = os.fsencode(path_or_bytes)
            if b"\0" in model_path:
                raise OrtInvalidArgument("model path must not contain NUL characters")
        elif hasattr(path_or_bytes, "SerializeToString"):
            model_bytes = path_or_bytes.SerializeToString()
        else:
            raise OrtInvalidType("path_or_bytes must be a path, bytes or an onnx.ModelProto, got "
                                 f"{type(path_or_bytes).__name__}")

        # Providers are appended to a clone, so the caller's options stay reusable.
        cdef ort.OrtSessionOptions* options = NULL
        check(ort.CloneSessionOptions((<SessionOptions>sess_options).handle, &options))
        cdef ort.OrtSession* session = NULL
        cdef const char* path_c
        cdef const char* data_c
        cdef size_t data_len
        cdef ort.OrtStatus* status
        try:
            cpu_settings = _settings_for(requested, _CPU)
            if cpu_settings.get("use_arena") in ("0", "False", "false"):
                check(ort.DisableCpuMemArena(options))
            registered = _configure_providers(options, requested)
            if model_path is not None:
                path_c = model_path
                with nogil:
                    status = ort.CreateSession(shared_runtime().env, path_c, options, &session)
            else:
                data_c = model_bytes
                data_len = <size_t>len(model_bytes)
                with nogil:
                    status = ort.CreateSessionFromArray(shared_runtime().env, data_c, data_len,
                                                        options, &session)
            check(status)
        finally:
            ort.ReleaseSessionOptions(options)
        self.handle = session
        _live[<int>HANDLE_SESSION] += 1
        self._sess_options = sess_options
        self._providers = [name for name, _ in registered]
        self.cpu_only = self._providers == [_CPU]
        self._provider_options = [settings for _, settings in registered]
        self._read_io_metadata()

    cdef int _read_io_metadata(self) except -1:
        """Encode names once and read types: inputs (then overridable initializers, which may
        also be fed by name) and outputs."""
        cdef size_t n_in = 0, n_out = 0, n_over = 0, i
        cdef ort.OrtAllocator* allocator = NULL
        cdef char* name_c = NULL
        cdef ort.OrtTypeInfo* type_info = NULL
        cdef int elem = -1
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        check(ort.SessionGetInputCount(self.handle, &n_in))
        check(ort.SessionGetOutputCount(self.handle, &n_out))
        check(ort.SessionGetOverridableInitializerCount(self.handle, &n_over))
        self.input_names_c = <char**>calloc(n_in + n_over + 1, sizeof(char*))
        self.output_names_c = <char**>calloc(n_out + 1, sizeof(char*))
        self.input_elem_types = <int*>calloc(n_in + n_over + 1, sizeof(int))
        self.feed_views = <FeedView*>calloc(n_in + n_over + 1, sizeof(FeedView))
        self.fixed_outputs = <FixedOutput*>calloc(n_out + 1, sizeof(FixedOutput))
        self.feed_keys = <PyObject**>calloc(n_in + n_over + 1, sizeof(PyObject*))
        self.feed_key_positions = <Py_ssize_t*>calloc(n_in + n_over + 1, sizeof(Py_ssize_t))
        if (self.input_names_c == NULL or self.output_names_c == NULL or self.input_elem_types == NULL
                or self.feed_views == NULL or self.feed_keys == NULL or self.feed_key_positions == NULL
                or self.fixed_outputs == NULL):
            raise MemoryError()
        for i in range(n_in + n_over):
            if i < n_in:
                check(ort.SessionGetInputName(self.handle, i, allocator, &name_c))
            else:
                check(ort.SessionGetOverridableInitializerName(self.handle, i - n_in, allocator, &name_c))
            name = _take_string(name_c, allocator)
            self.input_names_c[i] = _copy_c_string(name.encode("utf-8"))
            self.n_feedable = i + 1
            if i < n_in:
                check(ort.SessionGetInputTypeInfo(self.handle, i, &type_info))
            else:
                check(ort.SessionGetOverridableInitializerTypeInfo(self.handle, i - n_in, &type_info))
            try:
                arg = _node_arg(name, type_info, &elem)
            finally:
                ort.ReleaseTypeInfo(type_info)
            (self._inputs_meta if i < n_in else self._overridable_meta).append(arg)
            self.input_elem_types[i] = elem
            self.input_index[name] = i
        self.n_inputs = n_in
        for i in range(n_out):
            check(ort.SessionGetOutputName(self.handle, i, allocator, &name_c))
            name = _take_string(name_c, allocator)
            self.output_names_c[i] = _copy_c_string(name.encode("utf-8"))
            self.n_outputs = i + 1
            check(ort.SessionGetOutputTypeInfo(self.handle, i, &type_info))
            try:
                arg = _node_arg(name, type_info, &elem)
            finally:
                ort.ReleaseTypeInfo(type_info)
            self._outputs_meta.append(arg)
            self.output_index[name] = i
            self._plan_fixed_output(i, arg, elem)
        self.preallocate_outputs = True
        return 0

    cdef int _plan_fixed_output(self, Py_ssize_t position, object arg, int elem) except -1:
        """Mark the output at `position` fixed when the model gives it a plain tensor type with
        a builtin NumPy equivalent and a shape of known, non-zero dimensions, at most
        PREALLOCATE_MAX_BYTES in all. An output that is
        also a graph input is never fixed: onnxruntime hands such an output back as the feed
        itself, without writing into a buffer given for it."""
        cdef FixedOutput* fixed = &self.fixed_outputs[position]
        cdef Py_ssize_t d
        cdef int64_t nbytes = element_size(elem)
        fixed.elem_type = -1
        shape = arg.shape
        if (elem < 0 or not has_builtin_numpy_type(elem) or arg.type.startswith("sparse_")
                or shape is None or len(shape) > MAX_INLINE_DIMS or arg.name in self.input_index):
            return 0
        for d in range(len(shape)):
            if type(shape[d]) is not int or shape[d] <= 0 or shape[d] > PREALLOCATE_MAX_BYTES:
                return 0
            nbytes *= <int64_t>shape[d]
            if nbytes > PREALLOCATE_MAX_BYTES:
                return 0
            fixed.dims[d] = shape[d]
        fixed.ndim = <int>len(shape)
        fixed.nbytes = <size_t>nbytes
        fixed.elem_type = elem
        return 0

    def __dealloc__(self):
        self._release_handle()
        cdef Py_ssize_t i
        if self.input_names_c != NULL:
            for i in range(self.n_feedable):
                free(self.input_names_c[i])
            free(self.input_names_c)
            self.input_names_c = NULL
        if self.output_names_c != NULL:
            for i in range(self.n_outputs):
                free(self.output_names_c[i])
            free(self.output_names_c)
            self.output_names_c = NULL
        free(self.input_elem_types)
        self.input_elem_types = NULL
        if self.fixed_outputs != NULL:
            for i in range(self.n_outputs):
                if self.fixed_outputs[i].scratch != NULL:
                    ort.ReleaseValue(self.fixed_outputs[i].scratch)
        free(self.fixed_outputs)
        self.fixed_outputs = NULL
        if self.feed_views != NULL:
            for i in range(self.n_feedable):
                clear_feed_view(&self.feed_views[i])
            free(self.feed_views)
            self.feed_views = NULL
        if self.feed_keys != NULL:
            for i in range(self.n_feedable):
                Py_XDECREF(self.feed_keys[i])
            free(self.feed_keys)
            self.feed_keys = NULL
        free(self.feed_key_positions)
        self.feed_key_positions = NULL

    cdef void _release_handle(self) noexcept:
        if self.handle != NULL:
            ort.ReleaseSession(self.handle)
            self.handle = NULL
            _live[<int>HANDLE_SESSION] -= 1

    cdef int require_open(self) except -1:
        if self.handle == NULL or self.close_pending:
            raise ObjectClosedError("this InferenceSession has been closed")
        return 0

    cdef int begin_run(self) except -1:
        self.require_open()
        self.runs_in_flight += 1
        return 0

    cdef void end_run(self) noexcept:
        self.runs_in_flight -= 1
        if self.close_pending and self.runs_in_flight == 0:
            self._release_handle()

    def close(self):
        """Release the session. Runs in flight on other threads finish first; values already
        returned stay valid."""
        if self.runs_in_flight > 0:
            self.close_pending = True
        else:
            self._release_handle()
            self.close_pending = True

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # -- metadata --------------------------------------------------------------------------------

    def get_inputs(self):
        """Inputs as NodeArg(name, type, shape)."""
        return list(self._inputs_meta)

    def get_outputs(self):
        return list(self._outputs_meta)

    def get_overridable_initializers(self):
        return list(self._overridable_meta)

    def get_providers(self):
        """Execution providers registered for this session, in order of precedence."""
        return list(self._providers)

    def get_provider_options(self):
        """{provider: {option: value}}; for CUDA the full effective option set."""
        result = {}
        for name, settings in zip(self._providers, self._provider_options):
            result[name] = _effective_cuda_options(settings) if name == _CUDA else dict(settings)
        return result

    def get_session_options(self):
        return self._sess_options

    def get_modelmeta(self):
        self.require_open()
        cdef ort.OrtModelMetadata* meta = NULL
        cdef ort.OrtAllocator* allocator = NULL
        cdef char* text = NULL
        cdef char** keys = NULL
        cdef int64_t n_keys = 0, i, version = 0
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        check(ort.SessionGetModelMetadata(self.handle, &meta))
        try:
            check(ort.ModelMetadataGetProducerName(meta, allocator, &text))
            producer = _take_string(text, allocator)
            check(ort.ModelMetadataGetGraphName(meta, allocator, &text))
            graph = _take_string(text, allocator)
            check(ort.ModelMetadataGetDomain(meta, allocator, &text))
            domain = _take_string(text, allocator)
            check(ort.ModelMetadataGetDescription(meta, allocator, &text))
            description = _take_string(text, allocator)
            check(ort.ModelMetadataGetGraphDescription(meta, allocator, &text))
            graph_description = _take_string(text, allocator)
            check(ort.ModelMetadataGetVersion(meta, &version))
            check(ort.ModelMetadataGetCustomMetadataMapKeys(meta, allocator, &keys, &n_keys))
            custom = {}
            if keys != NULL:
                try:
                    names = [keys[i][:strlen(keys[i])].decode("utf-8") for i in range(n_keys)]
                finally:
                    for i in range(n_keys):
                        check(ort.AllocatorFree(allocator, keys[i]))
                    check(ort.AllocatorFree(allocator, keys))
                for key in names:
                    check(ort.ModelMetadataLookupCustomMetadataMap(meta, allocator, key.encode(), &text))
                    custom[key] = _take_string(text, allocator)
        finally:
            ort.ReleaseModelMetadata(meta)
        return ModelMetadata(producer, graph, domain, description, graph_description, version, custom)

    # -- running -----------------------------------------------------------------------------------

    cdef int output_positions(self, object output_names, const char** names_out,
                              Py_ssize_t* positions_out, Py_ssize_t capacity) except -1:
        cdef Py_ssize_t i = 0
        if output_names is None:
            for i in range(self.n_outputs):
                names_out[i] = self.output_names_c[i]
                positions_out[i] = i
            return <int>self.n_outputs
        for name in output_names:
            if i >= capacity:
                raise OrtInvalidArgument("too many output names")
            position = self.output_index.get(name)
            if position is None:
                raise OrtInvalidArgument(
                    f"unknown output name {name!r}; the model's outputs are {list(self.output_index)}")
            names_out[i] = self.output_names_c[<Py_ssize_t>position]
            positions_out[i] = <Py_ssize_t>position
            i += 1
        return <int>i

    cdef Py_ssize_t _preallocate_outputs(self, const Py_ssize_t* positions, Py_ssize_t n_out,
                                         bint distinct, ort.OrtValue** values,
                                         PyObject** arrays) except -1:
        """For each requested output whose type and shape the model fixes and a run confirmed,
        a new NumPy array (into `arrays`, a reference the caller owns) and a tensor over it
        (into `values`) for onnxruntime to write the output into; or, for a small output, the
        session's scratch tensor (into `values`, `arrays` left NULL: see _take_scratch_outputs).
        Names asked for twice get none. Returns how many outputs were preallocated."""
        cdef Py_ssize_t i, n = 0
        cdef FixedOutput* fixed
        cdef ort.OrtAllocator* allocator = NULL
        for i in range(n_out):
            fixed = &self.fixed_outputs[positions[i]]
            if fixed.elem_type < 0 or not fixed.confirmed:
                continue
            if not distinct and _asked_twice(positions, n_out, i):
                continue
            if fixed.nbytes <= COPY_OUT_MAX_BYTES and not fixed.scratch_busy:
                if fixed.scratch == NULL:
                    check(ort.GetAllocatorWithDefaultOptions(&allocator))
                    check(ort.CreateTensorAsOrtValue(allocator, fixed.dims, <size_t>fixed.ndim,
                                                     <ort.ONNXTensorElementDataType>fixed.elem_type,
                                                     &fixed.scratch))
                    check(ort.GetTensorMutableData(fixed.scratch, &fixed.scratch_data))
                fixed.scratch_busy = True
                values[i] = fixed.scratch
                n += 1
                continue
            array = new_output_array(fixed.elem_type, fixed.ndim, fixed.dims, &values[i])
            Py_INCREF(array)
            arrays[i] = <PyObject*>array
            n += 1
        return n

    cdef int _take_scratch_outputs(self, RunArrays* a, Py_ssize_t n_out, bint copy) except -1:
        """After a run: give back the scratch tensors the run used (their out_values entries go
        NULL) and, when `copy`, copy each into a new NumPy array (into out_arrays)."""
        cdef Py_ssize_t i
        cdef FixedOutput* fixed
        for i in range(n_out):
            if a.out_values[i] == NULL or a.out_arrays[i] != NULL:
                continue
            fixed = &self.fixed_outputs[a.out_positions[i]]
            if a.out_values[i] != fixed.scratch:
                continue
            a.out_values[i] = NULL
            fixed.scratch_busy = False
            if copy:
                array = new_array_from(fixed.elem_type, fixed.ndim, fixed.dims, fixed.scratch_data,
                                       fixed.nbytes)
                Py_INCREF(array)
                a.out_arrays[i] = <PyObject*>array
        return 0

    cdef int _confirm_fixed_output(self, FixedOutput* fixed, OrtValue value) except -1:
        """After a run where onnxruntime allocated a fixed output: preallocate it from now on
        if it came out with exactly the declared type and shape, never again if not."""
        cdef int d
        if value.elem_type != fixed.elem_type or value.ndim != fixed.ndim:
            fixed.elem_type = -1
            return 0
        for d in range(fixed.ndim):
            if value.dims[d] != fixed.dims[d]:
                fixed.elem_type = -1
                return 0
        fixed.confirmed = True
        return 0

    def run(self, output_names, input_feed, run_options=None):
        """Run the model. `input_feed` maps input names to NumPy arrays (or OrtValues); returns a
        list of NumPy arrays for `output_names` (None = all outputs, in model order), none of
        them a copy: small outputs of fixed type and shape are new arrays onnxruntime wrote
        into, the others views of onnxruntime's output buffers."""
        return self._run(output_names, input_feed, run_options, True)

    def run_with_ort_values(self, output_names, input_dict, run_options=None):
        """Like run(), returning OrtValues (outputs stay where onnxruntime produced them)."""
        return self._run(output_names, input_dict, run_options, False)

    cdef list _run(self, object output_names, object input_feed, object run_options, bint as_numpy):
        if not isinstance(input_feed, dict):
            raise OrtInvalidType(f"input_feed must be a dict of name -> array, got "
                                 f"{type(input_feed).__name__}")
        cdef ort.OrtRunOptions* run_options_c = NULL
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                raise OrtInvalidType(f"run_options must be ortagent.RunOptions, got "
                                     f"{type(run_options).__name__}")
            run_options_c = (<RunOptions>run_options).handle
        cdef Py_ssize_t n_in = len(input_feed)
        if output_names is not None and type(output_names) is not list and type(output_names) is not tuple:
            if isinstance(output_names, (str, bytes)):
                raise OrtInvalidType(f"output_names must be a list of names or None, not a string "
                                     f"({output_names!r})")
            try:
                output_names = list(output_names)
            except TypeError:
                raise OrtInvalidType(f"output_names must be a list of names or None, got "
                                     f"{type(output_names).__name__}") from None
        cdef Py_ssize_t n_out_capacity = self.n_outputs if output_names is None else len(output_names)
        cdef RunStack stack
        cdef RunArrays a
        cdef object item_object
        cdef Py_ssize_t kept
        cdef bint from_cache = False
        cdef bint registered = False
        cdef Py_ssize_t n_preallocated = 0
        cdef FixedOutput* fixed
        cdef Py_ssize_t i, n_ready = 0, n_out = 0, n_required = 0, n_held = 0, cursor = 0
        cdef ort.OrtStatus* status = NULL
        cdef PyObject* key = NULL
        cdef PyObject* item = NULL
        cdef PyObject* position
        cdef list keep = None
        cdef list results
        cdef OrtValue value

        self.begin_run()
        a.heap = NULL
        try:
            run_arrays_init(&a, &stack, n_in, n_out_capacity)
            # Every feed is held by a reference of ours while the GIL is released, so another
            # thread changing the caller's dict cannot free an array ORT is reading.
            while n_ready < n_in and PyDict_Next(input_feed, &cursor, &key, &item):
                # Callers usually pass the same key objects in the same order: compare the key
                # with the one seen at this place last time before looking the name up.
                if n_ready < self.n_feedable and self.feed_keys[n_ready] == key:
                    i = self.feed_key_positions[n_ready]
                else:
                    position = PyDict_GetItem(self.input_index, <object>key)
                    if position == NULL:
                        raise OrtInvalidArgument(
                            f"unknown input name {<object>key!r}; the model's inputs are {list(self.input_index)}")
                    i = PyLong_AsSsize_t(<object>position)
                    if n_ready < self.n_feedable:
                        Py_INCREF(<object>key)
                        Py_XDECREF(self.feed_keys[n_ready])
                        self.feed_keys[n_ready] = key
                        self.feed_key_positions[n_ready] = i
                if i < self.n_inputs:
                    n_required += 1
                a.in_names[n_ready] = self.input_names_c[i]
                Py_INCREF(<object>item)
                a.in_refs[n_held] = item
                n_held += 1
                if type(<object>item) is OrtValue:
                    (<OrtValue>item).begin_use()        # close() waits for this run
                    a.in_values[n_ready] = (<OrtValue>item).handle
                    a.in_created[n_ready] = FEED_BORROWED
                    a.in_holders[n_ready] = item
                else:
                    if keep is None:
                        keep = []
                    kept = len(keep)
                    a.in_values[n_ready] = feed_view(&self.feed_views[i], <object>item, <object>key,
                                                     self.input_elem_types[i], keep, &from_cache)
                    a.in_created[n_ready] = FEED_CACHED + i if from_cache else FEED_CREATED
                    # what owns the memory the tensor describes: the array, or its copy (kept
                    # alive by `keep` until this call returns)
                    a.in_holders[n_ready] = <PyObject*>keep[len(keep) - 1] if len(keep) > kept else item
                n_ready += 1
            if n_required < self.n_inputs:
                self._raise_missing_inputs(input_feed)
            n_out = self.output_positions(output_names, a.out_names, a.out_positions, n_out_capacity)
            for i in range(n_out):
                a.out_values[i] = NULL
                a.out_arrays[i] = NULL
            if as_numpy and self.cpu_only and self.preallocate_outputs:
                n_preallocated = self._preallocate_outputs(a.out_positions, n_out, output_names is None,
                                                           a.out_values, a.out_arrays)
            run_options_c = interruptible_begin(run_options_c, &registered)
            status = run_nogil(self.handle, run_options_c, &a, n_ready, n_out)
            if n_preallocated > 0:
                for i in range(n_out):
                    if a.out_arrays[i] != NULL:
                        ort.ReleaseValue(a.out_values[i])
                        a.out_values[i] = NULL
                self._take_scratch_outputs(&a, n_out, status == NULL)
                if status != NULL:
                    # Run again the plain way: if that works, the model's declared output types
                    # or shapes do not hold, and this session stops preallocating. (onnxruntime
                    # reports a refused preallocated output as an invalid argument, like a bad
                    # feed; a bad feed fails again, in validation, before any node runs.)
                    ort.ReleaseStatus(status)
                    for i in range(n_out):
                        Py_XDECREF(a.out_arrays[i])
                        a.out_arrays[i] = NULL
                    n_preallocated = 0
                    status = run_nogil(self.handle, run_options_c, &a, n_ready, n_out)
                    if status == NULL:
                        self.preallocate_outputs = False
            # Own every output before anything can raise, so none leaks.
            results = PyList_New(n_out)
            for i in range(n_out):
                item_object = wrap_value(a.out_values[i], None, self) if a.out_values[i] != NULL else None
                Py_INCREF(item_object)
                PyList_SET_ITEM(results, i, item_object)
                a.out_values[i] = NULL
            if status == NULL:
                if self.cpu_only:
                    for i in range(n_out):
                        if results[i] is not None:
                            value = results[i]
                            value.describe_as(MEMORY_CPU)
                            fixed = &self.fixed_outputs[a.out_positions[i]]
                            if fixed.elem_type >= 0 and not fixed.confirmed:
                                self._confirm_fixed_output(fixed, value)
                if n_preallocated < n_out:      # preallocated outputs never share a feed's memory
                    for i in range(n_ready):
                        a.in_data[i] = tensor_data(a.in_values[i])
                    keep_aliased_feeds_alive_c(results, a.in_data, a.in_holders, n_ready, self, None)
            end_run_call(run_options_c, registered, status)
            if status != NULL:
                check_run_status(status, self, list(input_feed), list(input_feed.values()))
            if as_numpy:
                for i in range(n_out):
                    if a.out_arrays[i] != NULL:
                        results[i] = <object>a.out_arrays[i]
                    else:
                        value = results[i]
                        results[i] = value_to_numpy(value, False)
            return results
        finally:
            if n_preallocated > 0:
                self._take_scratch_outputs(&a, n_out, False)     # after an error: give them back
            for i in range(n_ready):
                if a.in_created[i] == FEED_CREATED:
                    ort.ReleaseValue(a.in_values[i])
                elif a.in_created[i] >= FEED_CACHED:
                    release_feed_view(&self.feed_views[a.in_created[i] - FEED_CACHED])
                else:                                   # FEED_BORROWED: the caller's OrtValue
                    (<OrtValue>a.in_holders[i]).end_use()
            for i in range(n_held):
                Py_DECREF(<object>a.in_refs[i])
            for i in range(n_out):
                if a.out_arrays[i] != NULL:
                    if a.out_values[i] != NULL:
                        ort.ReleaseValue(a.out_values[i])
                    Py_DECREF(<object>a.out_arrays[i])
            run_arrays_release(&a)
            self.end_run()

    def io_binding(self, bint reuse_output_buffers=False):
        """A new IOBinding for this session (see IOBinding)."""
        return IOBinding(self, reuse_output_buffers)

    def run_with_iobinding(self, iobinding, run_options=None):
        """Run with the inputs and outputs bound in `iobinding` (GIL released)."""
        if not isinstance(iobinding, IOBinding):
            raise OrtInvalidType(f"iobinding must be an ortagent.IOBinding (session.io_binding()), got "
                                 f"{type(iobinding).__name__}")
        cdef IOBinding bound = iobinding
        if bound.session is not self:
            raise OrtInvalidArgument("this IOBinding belongs to another session")
        cdef ort.OrtRunOptions* run_options_c = NULL
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                raise OrtInvalidType(f"run_options must be ortagent.RunOptions, got "
                                     f"{type(run_options).__name__}")
            run_options_c = (<RunOptions>run_options).handle
        bound.require_open()
        if not bound.bound_outputs:
            raise OrtInvalidArgument("this IOBinding has no outputs bound: bind_output() or "
                                     "bind_ortvalue_output() first")
        if not bound.inputs_verified:
            unbound = [arg.name for arg in self._inputs_meta if arg.name not in bound.bound_inputs]
            if unbound:
                raise OrtInvalidArgument(f"required inputs {unbound} are not bound to this IOBinding")
            bound.inputs_verified = True
        cdef bint rebound = bound.rebind_device_outputs(False)
        cdef ort.OrtIoBinding* binding = bound.handle
        cdef ort.OrtStatus* status = NULL
        cdef bint registered = False
        self.begin_run()
        cdef tuple used
        try:
            used = bound.begin_run()            # close() of the binding or its values waits
        except BaseException:
            self.end_run()
            raise
        try:
            while True:
                run_options_c = interruptible_begin(run_options_c, &registered)
                status = run_binding_nogil(self.handle, run_options_c, binding, False)
                end_run_call(run_options_c, registered, status)
                if (status != NULL and not rebound and bound.has_device_outputs()
                        and ort.GetErrorCode(status) == ort.ORT_INVALID_ARGUMENT):
                    # An output kept from the last run may no longer fit (a data-dependent
                    # output shape): give the device outputs fresh buffers and run again.
                    ort.ReleaseStatus(status)
                    rebound = bound.rebind_device_outputs(True)
                    continue
                break
            check(status)
        finally:
            bound.end_run(used)
            self.end_run()
        bound.outputs_unsynchronized = _disables_sync(run_options)

    def _raise_missing_inputs(self, input_feed):
        missing = [arg.name for arg in self._inputs_meta if arg.name not in input_feed]
        raise OrtInvalidArgument(f"required inputs {missing} are missing from the input feed")

    def __reduce__(self):
        raise OrtInvalidType("InferenceSession cannot be pickled")


# ---- IOBinding -----------------------------------------------------------------------------------

_SYNC_DISABLED_KEY = "disable_synchronize_execution_providers"


cdef bint _disables_sync(object run_options):
    return (run_options is not None
            and (<RunOptions>run_options)._config_entries.get(_SYNC_DISABLED_KEY) == "1")


@cython.final
cdef class _BoundOutput:
    """One output binding: to a device (ORT allocates; `device` set) or to a given value
    (the caller's buffer; `value` set)."""


@cython.final
@cython.no_gc_clear          # __dealloc__ releases the binding before its session goes
cdef class IOBinding:
    """Inputs and outputs bound to a session once and reused across runs
    (onnxruntime.IOBinding's names and behaviour).

    Safe by default: onnxruntime keeps the buffer it allocated for an output bound to a device
    and, in the next run, overwrites it (same shape) or fails (another shape). ortagent re-binds
    such outputs before every run, so values returned by :meth:`get_outputs` are never changed
    by a later run and output shapes may vary from run to run. Pass
    ``reuse_output_buffers=True`` to ``session.io_binding()`` for onnxruntime's behaviour: the
    same buffers are written run after run (values handed out change with each run, and the
    output shapes must stay the same).
    """

    def __cinit__(self):
        self.bound_inputs = {}
        self.bound_outputs = []
        self.bound_values = ()

    def __init__(self, session, bint reuse_output_buffers=False):
        if not isinstance(session, InferenceSession):
            raise OrtInvalidType(f"IOBinding needs an ortagent.InferenceSession, got {type(session).__name__}")
        (<InferenceSession>session).require_open()
        check(ort.CreateIoBinding((<InferenceSession>session).handle, &self.handle))
        _live[<int>HANDLE_IO_BINDING] += 1
        self.session = session
        self.reuse_output_buffers = reuse_output_buffers

    def __dealloc__(self):
        if self.handle != NULL:
            ort.ReleaseIoBinding(self.handle)
            self.handle = NULL
            _live[<int>HANDLE_IO_BINDING] -= 1

    cdef int require_open(self) except -1:
        if self.handle == NULL or self.close_pending:
            raise ObjectClosedError("this IOBinding has been closed")
        self.session.require_open()
        return 0

    cdef int _bindings_changed(self) except -1:
        """Rebuild the tuple of values bound now (what a run marks in use)."""
        values = list(self.bound_inputs.values())
        for item in self.bound_outputs:
            if (<_BoundOutput>item).value is not None:
                values.append((<_BoundOutput>item).value)
        self.bound_values = tuple(values)
        return 0

    cdef tuple begin_run(self):
        """A run starts: the binding and every value bound to it stay alive until end_run
        (close() of either waits); a value closed since it was bound is an ObjectClosedError.
        Returns the values marked (a binding changed by another thread meanwhile does not
        change what this run releases)."""
        cdef tuple used = self.bound_values
        cdef Py_ssize_t i, n = len(used)
        for i in range(n):
            try:
                (<OrtValue>used[i]).begin_use()
            except BaseException:
                while i > 0:
                    i -= 1
                    (<OrtValue>used[i]).end_use()
                raise
        self.runs_in_flight += 1
        return used

    cdef void end_run(self, tuple used) noexcept:
        for item in used:
            (<OrtValue>item).end_use()
        self.runs_in_flight -= 1
        if self.close_pending and self.runs_in_flight == 0:
            self._release()

    cdef void _release(self) noexcept:
        if self.handle != NULL:
            ort.ReleaseIoBinding(self.handle)
            self.handle = NULL
            _live[<int>HANDLE_IO_BINDING] -= 1
        self.bound_inputs = {}
        self.bound_outputs = []
        self.bound_values = ()

    def close(self):
        """Release the binding and the values it keeps alive. A run using the binding on
        another thread finishes first."""
        self.close_pending = True
        if self.runs_in_flight == 0:
            self._release()

    cdef bytes _input_name(self, object name):
        if name not in self.session.input_index:
            raise OrtInvalidArgument(
                f"unknown input name {name!r}; the model's inputs are {list(self.session.input_index)}")
        return _encode(name, "input name")

    cdef bytes _output_name(self, object name):
        if name not in self.session.output_index:
            raise OrtInvalidArgument(
                f"unknown output name {name!r}; the model's outputs are {list(self.session.output_index)}")
        return _encode(name, "output name")

    # -- inputs ------------------------------------------------------------------------------------

    def bind_ortvalue_input(self, name, value):
        """Bind an OrtValue as input `name` (kept alive by this binding)."""
        self.require_open()
        _require_value(value, f"input {name!r}")
        cdef OrtValue v = value
        v.require_handle()
        encoded = self._input_name(name)
        expected = self.session.input_elem_types[<Py_ssize_t>self.session.input_index[name]]
        v.describe()
        if expected >= 0 and v.elem_type != expected:
            raise OrtInvalidArgument(f"input {name!r} expects {tensor_type_name(expected)}, got a value of "
                                     f"{tensor_type_name(v.elem_type)}")
        check(ort.BindInput(self.handle, encoded, v.handle))
        self.bound_inputs[name] = value
        self._bindings_changed()
        self.inputs_verified = False
        self.outputs_stale = True

    def bind_cpu_input(self, name, arr_on_cpu):
        """Bind a NumPy array as input `name` without copying it (a contiguous copy when needed)."""
        self.require_open()
        self.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(arr_on_cpu))

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        """Bind memory at `buffer_ptr` on a device (e.g. a torch or cupy tensor's data pointer) as
        input `name`. The caller keeps the memory alive while the binding uses it."""
        self.require_open()
        if buffer_ptr == 0:
            raise OrtInvalidArgument(f"input {name!r}: buffer_ptr must not be 0")
        value = OrtValue._from_pointer(buffer_ptr, shape, element_type, device_type, device_id)
        self.bind_ortvalue_input(name, value)

    def clear_binding_inputs(self):
        self.require_open()
        ort.ClearBoundInputs(self.handle)
        self.bound_inputs = {}
        self._bindings_changed()
        self.inputs_verified = False
        self.outputs_stale = True

    # -- outputs -----------------------------------------------------------------------------------

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None):
        """Bind output `name` to a device (onnxruntime allocates it there) or, with
        `element_type`, `shape` and `buffer_ptr`, to caller memory that each run writes into."""
        self.require_open()
        encoded = self._output_name(name)
        cdef _BoundOutput bound = _BoundOutput.__new__(_BoundOutput)
        bound.name = encoded
        target = output_target(name, device_type, device_id, element_type, shape, buffer_ptr)
        if isinstance(target, OrtDevice):
            check(ort.BindOutputToDevice(self.handle, encoded, (<OrtDevice>target).memory_info()))
            bound.device = target
        else:
            value = target
            self._check_output_type(name, value)
            check(ort.BindOutput(self.handle, encoded, (<OrtValue>value).handle))
            bound.value = value
        self._remember_output(bound)

    def bind_ortvalue_output(self, name, value):
        """Bind an OrtValue as output `name`: each run writes into its buffer."""
        self.require_open()
        _require_value(value, f"output {name!r}")
        cdef OrtValue v = value
        v.require_handle()
        encoded = self._output_name(name)
        if v.readonly:
            raise OrtInvalidArgument(f"output {name!r}: the value views read-only memory")
        self._check_output_type(name, v)
        check(ort.BindOutput(self.handle, encoded, v.handle))
        cdef _BoundOutput bound = _BoundOutput.__new__(_BoundOutput)
        bound.name = encoded
        bound.value = value
        self._remember_output(bound)

    cdef int _check_output_type(self, object name, OrtValue value) except -1:
        """A caller's buffer must have the output's element type (onnxruntime's own error does not
        name the output)."""
        declared = self.session._outputs_meta[<Py_ssize_t>self.session.output_index[name]].type
        value.describe()
        given = tensor_type_name(value.elem_type)
        if declared.startswith("tensor(") and given != declared:
            raise OrtInvalidArgument(f"output {name!r} is {declared}, got a value of {given}")
        return 0

    cdef _remember_output(self, _BoundOutput bound):
        for i, existing in enumerate(self.bound_outputs):
            if (<_BoundOutput>existing).name == bound.name:
                self.bound_outputs[i] = bound
                self._bindings_changed()
                return
        self.bound_outputs.append(bound)
        self._bindings_changed()

    def clear_binding_outputs(self):
        self.require_open()
        ort.ClearBoundOutputs(self.handle)
        self.bound_outputs = []
        self._bindings_changed()

    cdef bint has_device_outputs(self):
        for item in self.bound_outputs:
            if (<_BoundOutput>item).device is not None:
                return True
        return False

    cdef bint rebind_device_outputs(self, bint always) except -1:
        """Before a run: give the outputs bound to a device fresh buffers when values were
        handed out since the last run (so a run never changes them: the IoBinding overwrite trap)
        or inputs were bound again (their shapes may differ); `always` forces it. Returns whether
        it re-bound."""
        cdef _BoundOutput bound
        if self.reuse_output_buffers or not (always or self.outputs_stale):
            return False
        for item in self.bound_outputs:
            bound = <_BoundOutput>item
            if bound.device is not None:
                check(ort.BindOutputToDevice(self.handle, bound.name,
                                             (<OrtDevice>bound.device).memory_info()))
        self.outputs_stale = False
        return True

    # -- results -----------------------------------------------------------------------------------

    cdef list output_values(self):
        """The bound outputs as new OrtValue objects (sharing the buffers), in binding order."""
        self.require_open()
        if self.outputs_unsynchronized:
            self.synchronize_outputs()
        self.outputs_stale = True      # handed out: the next run must not write into them
        result = bound_output_values(self.handle, self.session)
        # An output may be a bound input itself (or an alias of one): keep that input's memory.
        # An output written into a caller's buffer (bind_ortvalue_output, bind_output with a
        # buffer_ptr) keeps that buffer's owner: binding the output again, or closing the
        # binding, must not free memory a value handed out still reads.
        inputs = list(self.bound_inputs.values())
        for bound in self.bound_outputs:
            if (<_BoundOutput>bound).value is not None:
                inputs.append((<_BoundOutput>bound).value)
        cdef Py_ssize_t n_inputs = len(inputs), j
        cdef void** input_data = <void**>malloc((n_inputs + 1) * sizeof(void*))
        if input_data == NULL:
            raise MemoryError()
        try:
            for j in range(n_inputs):
                input_data[j] = tensor_data((<OrtValue>inputs[j]).handle)
            keep_aliased_feeds_alive(result, input_data, n_inputs, inputs, self.session, None)
        finally:
            free(input_data)
        return result

    def get_outputs(self):
        """The outputs of the last run as OrtValues, in binding order."""
        return self.output_values()

    def get_outputs_as_numpy(self):
        """The outputs as NumPy arrays: views of CPU outputs, copies of device outputs."""
        return [value_to_numpy(<OrtValue>value, True) for value in self.output_values()]

    def copy_outputs_to_cpu(self):
        """The outputs copied into new NumPy arrays (never views)."""
        result = []
        for value in self.output_values():
            array = value_to_numpy(<OrtValue>value, True)
            result.append(array.copy() if array.base is not None else array)
        return result

    def synchronize_inputs(self):
        """Wait until inputs copied to devices are in place."""
        self.require_open()
        cdef ort.OrtIoBinding* handle = self.handle
        with nogil:
            check(ort.SynchronizeBoundInputs(handle))

    def synchronize_outputs(self):
        """Wait until the devices have finished writing the outputs."""
        self.require_open()
        cdef ort.OrtIoBinding* handle = self.handle
        with nogil:
            check(ort.SynchronizeBoundOutputs(handle))
        self.outputs_unsynchronized = False

    def __reduce__(self):
        raise OrtInvalidType("IOBinding cannot be pickled")
