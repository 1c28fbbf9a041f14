"""Model compilation: ModelCompiler over the OrtCompileApi table (onnxruntime >= 1.22).

Compiling runs a model through the execution providers of a SessionOptions and writes the
result, in which a provider that supports it has replaced the subgraphs it compiled by EPContext
nodes. Each compile call builds fresh OrtModelCompilationOptions from a copy of the session
options taken when the compiler was made, applies the compiler's settings, names the output (a
file, a buffer, or a write callback), runs OrtCompileApi::CompileModel without the GIL (taking it
back only for a write callback) and releases the options.
"""

import enum
import os

cimport cython
from libc.stdint cimport uint32_t

from ortagent cimport _capi as ort
from ortagent._runtime cimport (
    check, ensure_loaded, shared_runtime, live_handle_counts, count_add, HANDLE_COMPILE_OPTIONS,
)

from ortagent.errors import OrtFail, OrtInvalidArgument, OrtInvalidType, OrtNotImplemented



class OrtCompileApiFlags(enum.IntFlag):
    NONE = 0
    ERROR_IF_NO_NODES_COMPILED = 1
    ERROR_IF_OUTPUT_FILE_EXISTS = 2


def _path_argument(value, str what):
    if not isinstance(value, (str, os.PathLike)):
        raise OrtInvalidType(f"{what} must be a path, got {type(value).__name__}")
    path = os.fsencode(value)
    if b"\0" in path:
        raise OrtInvalidArgument(f"{what} must not contain NUL characters")
    return path


def _int_setting(value, str what, long low, long high):
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise OrtInvalidType(f"{what} must be an int, got {type(value).__name__}")
    number = value.__index__()
    if not low <= number <= high:
        raise OrtInvalidArgument(f"{what} must be in [{low}, {high}], got {number}")
    return number


@cython.final
cdef class _Writer:
    """What a write callback needs while CompileModel runs: the Python callable, and the first
    exception it raised (CompileModel then fails; the exception is raised after it returns)."""
    cdef object write
    cdef object error


cdef ort.OrtStatus* _write_chunk(void* state, const void* buffer, size_t size) noexcept with gil:
    cdef _Writer writer = <_Writer>state
    try:
        writer.write((<const char*>buffer)[:size])
        return NULL
    except BaseException as exc:
        if writer.error is None:
            writer.error = exc
        message = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace").replace(b"\0", b" ")
        return ort.CreateStatus(ort.ORT_FAIL, message)


@cython.final
cdef class ModelCompiler:
    """Compile a model for the execution providers of `sess_options`:
    ``ModelCompiler(sess_options, input_model_path_or_bytes, embed_compiled_data_into_model=False,
    external_initializers_file_path=None, external_initializers_size_threshold=1024,
    flags=OrtCompileApiFlags.NONE, graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL,
    get_initializer_location_func=None)``, then compile_to_file / compile_to_bytes /
    compile_to_stream. onnxruntime >= 1.22 (flags, optimisation levels and streams: >= 1.23)."""
    cdef SessionOptions _options
    cdef bytes _input_path
    cdef bytes _input_bytes
    cdef bint _embed
    cdef bytes _external_path
    cdef size_t _external_threshold
    cdef uint32_t _flags
    cdef int _level

    def __init__(self, sess_options, input_model_path_or_bytes, embed_compiled_data_into_model=False,
                 external_initializers_file_path=None, external_initializers_size_threshold=1024,
                 flags=OrtCompileApiFlags.NONE, graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL,
                 get_initializer_location_func=None):
        if not isinstance(sess_options, SessionOptions):
            raise OrtInvalidType(f"sess_options must be ortagent.SessionOptions, got {type(sess_options).__name__}")
        if isinstance(input_model_path_or_bytes, (str, os.PathLike)):
            if not os.fspath(input_model_path_or_bytes):
                raise OrtInvalidArgument("Input model path is empty")
            self._input_path = _path_argument(input_model_path_or_bytes, "input model path")
        elif isinstance(input_model_path_or_bytes, (bytes, bytearray, memoryview)):
            self._input_bytes = bytes(input_model_path_or_bytes)
            if not self._input_bytes:
                raise OrtInvalidArgument("Input model bytes array is empty")
        elif hasattr(input_model_path_or_bytes, "SerializeToString"):
            self._input_bytes = input_model_path_or_bytes.SerializeToString()
        else:
            raise OrtInvalidType(f"Unable to load from type '{type(input_model_path_or_bytes)}'")
        if external_initializers_file_path:
            self._external_path = _path_argument(external_initializers_file_path,
                                                 "external_initializers_file_path")
        self._external_threshold = <size_t>_int_setting(external_initializers_size_threshold,
                                                        "external_initializers_size_threshold", 0, 1 << 62)
        self._flags = <uint32_t>_int_setting(flags, "flags", 0, int(OrtCompileApiFlags(3)))
        try:
            self._level = int(GraphOptimizationLevel(_int_setting(graph_optimization_level,
                                                                  "graph_optimization_level", 0, 99)))
        except ValueError:
            raise OrtInvalidArgument(f"graph_optimization_level must be a GraphOptimizationLevel, got "
                                     f"{graph_optimization_level!r}") from None
        if get_initializer_location_func is not None:
            raise OrtNotImplemented("get_initializer_location_func is not supported by ortagent (it needs "
                                    "onnxruntime's OrtExternalInitializerInfo callbacks)")
        self._embed = bool(embed_compiled_data_into_model)
        self._options = (<SessionOptions>sess_options).copy()

    cdef ort.OrtModelCompilationOptions* _create(self) except NULL:
        """New compile options with this compiler's settings (the caller releases them)."""
        cdef ort.OrtModelCompilationOptions* options = NULL
        ensure_loaded()
        check(ort.CreateModelCompilationOptionsFromSessionOptions(shared_runtime().env, self._options.handle,
                                                                  &options))
        count_add(&_live[<int>HANDLE_COMPILE_OPTIONS], 1)
        try:
            if self._input_path is not None:
                check(ort.ModelCompilationOptions_SetInputModelPath(options, self._input_path))
            else:
                check(ort.ModelCompilationOptions_SetInputModelFromBuffer(
                    options, <const char*>self._input_bytes, <size_t>len(self._input_bytes)))
            check(ort.ModelCompilationOptions_SetEpContextEmbedMode(options, self._embed))
            if self._external_path is not None:
                check(ort.ModelCompilationOptions_SetOutputModelExternalInitializersFile(
                    options, self._external_path, self._external_threshold))
            # flags and levels came in 1.23: on 1.22 only their defaults work
            if self._flags != 0 or shared_runtime().api_version >= ort.ortagent_since_ModelCompilationOptions_SetFlags:
                check(ort.ModelCompilationOptions_SetFlags(options, self._flags))
                check(ort.ModelCompilationOptions_SetGraphOptimizationLevel(
                    options, <ort.GraphOptimizationLevel>self._level))
        except BaseException:
            _release(options)
            raise
        return options

    cdef int _compile(self, ort.OrtModelCompilationOptions* options) except -1:
        cdef ort.OrtStatus* status
        try:
            with nogil:
                status = ort.CompileModel(shared_runtime().env, options)
            check(status)
        finally:
            _release(options)
        return 0

    def compile_to_file(self, output_model_path=None):
        """Compile into a file (by default, onnxruntime's name next to the input model:
        'model.onnx' gives 'model_ctx.onnx')."""
        path = None if output_model_path is None else _path_argument(output_model_path,
                                                                     "output_model_path")
        cdef ort.OrtModelCompilationOptions* options = self._create()
        try:
            if path is not None:
                check(ort.ModelCompilationOptions_SetOutputModelPath(options, path))
        except BaseException:
            _release(options)
            raise
        self._compile(options)

    def compile_to_bytes(self):
        """Compile into memory: the serialized compiled model."""
        cdef ort.OrtAllocator* allocator = NULL
        cdef void* buffer = NULL
        cdef size_t size = 0
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        cdef ort.OrtModelCompilationOptions* options = self._create()
        try:
            check(ort.ModelCompilationOptions_SetOutputModelBuffer(options, allocator, &buffer, &size))
        except BaseException:
            _release(options)
            raise
        try:
            self._compile(options)
            return (<const char*>buffer)[:size] if buffer != NULL else b""
        finally:
            if buffer != NULL:
                ort.AllocatorFree(allocator, buffer)

    def compile_to_stream(self, write_function):
        """Compile and hand the serialized model to `write_function(bytes)`, in one or more
        pieces (onnxruntime >= 1.23). An exception it raises stops compiling: OrtFail naming it."""
        if not callable(write_function):
            raise OrtInvalidType(f"write_function must be callable, got {type(write_function).__name__}")
        cdef _Writer writer = _Writer()
        writer.write = write_function
        cdef ort.OrtModelCompilationOptions* options = self._create()
        try:
            check(ort.ModelCompilationOptions_SetOutputModelWriteFunc(options, _write_chunk, <void*>writer))
        except BaseException:
            _release(options)
            raise
        try:
            self._compile(options)
        except OrtFail as exc:
            if writer.error is not None:
                raise exc from writer.error
            raise

    def __reduce__(self):
        raise OrtInvalidType("ModelCompiler cannot be pickled")


cdef void _release(ort.OrtModelCompilationOptions* options) noexcept:
    ort.ReleaseModelCompilationOptions(options)
    count_add(&_live[<int>HANDLE_COMPILE_OPTIONS], -1)
