"""Execution providers on a session's options: onnxruntime's spellings of the provider list, the
C API calls that append each provider, and onnxruntime's fallback when one cannot be used
(a ProviderFallbackWarning, and the session goes on without it) or strict mode (ProviderError)."""

import contextlib
import contextvars
import warnings

cimport cython
from libc.stdlib cimport malloc, free

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, shared_runtime, encode_text, take_ort_string
from ortagent._runtime import get_available_providers, ALL_PROVIDERS
from ortagent.errors import (
    OrtError, OrtInvalidArgument, OrtInvalidType, ProviderError, ProviderFallbackWarning,
)



# ---- providers -----------------------------------------------------------------------------------

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
_TENSORRT = "TensorrtExecutionProvider"
# Providers appended through OrtApi::SessionOptionsAppendExecutionProvider, by their short names.
_GENERIC_PROVIDER_NAMES = {
    "DnnlExecutionProvider": "DNNL",
    "OpenVINOExecutionProvider": "OpenVINO",
    "QNNExecutionProvider": "QNN",
    "SNPEExecutionProvider": "SNPE",
    "XnnpackExecutionProvider": "XNNPACK",
    "AzureExecutionProvider": "AZURE",
    "WebGpuExecutionProvider": "WebGPU",
    "VitisAIExecutionProvider": "VitisAI",
    "CoreMLExecutionProvider": "CoreML",
    "JsExecutionProvider": "JS",
    "NvTensorRTRTXExecutionProvider": "NvTensorRtRtx",
}


# Whether sessions created in this context raise ProviderError for a provider they cannot use
# (see strict_providers()).
strict_scope = contextvars.ContextVar("ortagent_strict_providers", default=False)


@contextlib.contextmanager
def strict_providers(bint enabled=True):
    """Within this block (this thread or task), a session that cannot use a listed execution
    provider raises ProviderError instead of warning and going on without it::

        with ortagent.strict_providers():
            session = ortagent.InferenceSession(model, providers=["CUDAExecutionProvider"])

    (The same as ``InferenceSession(..., strict_providers=True)`` for every session created
    inside.) ortagent's own CUDA helpers and TrainingAgent always create their sessions so."""
    token = strict_scope.set(enabled)
    try:
        yield
    finally:
        strict_scope.reset(token)


def _settings_for(list requested, str name):
    """The options of the first provider called `name` in `requested` ([(name, options)]), or {}."""
    for provider, settings in requested:
        if provider == name:
            return settings
    return {}


def normalise_providers(providers, provider_options, bint strict=False):
    """[(name, {str: str})] from onnxruntime's accepted spellings. A provider listed twice is an
    error when `strict` (or inside strict_providers()), else (as onnxruntime does) its later
    entries are dropped with a warning."""
    strict = strict or strict_scope.get()
    if providers is None:
        if provider_options:
            raise OrtInvalidArgument("provider_options given without providers")
        return [(CPU_PROVIDER, {})]
    if isinstance(providers, (str, bytes)):
        raise OrtInvalidType("providers must be a list of names or (name, options) tuples, not a string")
    try:
        providers = list(providers)
        if provider_options is not None:
            provider_options = list(provider_options)
    except TypeError:
        raise OrtInvalidType(f"providers and provider_options must be lists, got "
                             f"{type(providers).__name__} and {type(provider_options).__name__}") from None
    if provider_options is not None:
        if len(provider_options) != len(providers):
            raise OrtInvalidArgument(f"{len(providers)} providers but {len(provider_options)} "
                                     "provider_options entries")
        if any([not isinstance(p, str) for p in providers]):
            raise OrtInvalidArgument("when provider_options is given, providers must be names only")
    result = []
    for i, entry in enumerate(providers):
        if isinstance(entry, str):
            name, options = entry, (provider_options[i] if provider_options is not None else {})
        elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str):
            name, options = entry
        else:
            raise OrtInvalidType(f"providers[{i}] must be a name or a (name, options dict) tuple, "
                                 f"got {entry!r}")
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise OrtInvalidType(f"options of {name} must be a dict, got {type(options).__name__}")
        if any([n == name for n, _ in result]):
            if strict:
                raise OrtInvalidArgument(f"provider {name} is listed twice")
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", ProviderFallbackWarning)
            continue
        result.append((name, {str(k): _option_text(v) for k, v in options.items()}))
    return result


def _fallback_providers(list requested):
    """What onnxruntime retries with when creating a session with `requested` fails: CUDA then CPU
    when TensorRT was listed with CUDA (TensorRT's own fallback), else CPU alone."""
    names = [name for name, _ in requested]
    if _TENSORRT in names and CUDA_PROVIDER in names:
        return [(CUDA_PROVIDER, _settings_for(requested, CUDA_PROVIDER)), (CPU_PROVIDER, _settings_for(requested, CPU_PROVIDER))]
    return [(CPU_PROVIDER, _settings_for(requested, CPU_PROVIDER))]


def _option_text(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


@cython.final
cdef class _OptionArrays:
    """Provider options as the C API takes them: parallel arrays of UTF-8 keys and values (one
    allocation), over bytes objects kept referenced while the arrays live."""
    cdef list encoded
    cdef const char** keys
    cdef const char** values
    cdef Py_ssize_t count

    def __dealloc__(self):
        free(self.keys)                 # the values array is the second half of the same block


cdef _OptionArrays _option_arrays(dict settings):
    cdef _OptionArrays arrays = _OptionArrays.__new__(_OptionArrays)
    cdef Py_ssize_t n = len(settings), i = 0
    cdef bytes key, value
    arrays.encoded = []
    arrays.keys = <const char**>malloc(2 * (n + 1) * sizeof(char*))
    if arrays.keys == NULL:
        raise MemoryError()
    arrays.values = arrays.keys + n + 1
    for name, text in settings.items():
        key = encode_text(name, "provider option")
        value = encode_text(text, "provider option value")
        arrays.encoded.append(key)
        arrays.encoded.append(value)
        arrays.keys[i] = key
        arrays.values[i] = value
        i += 1
    arrays.count = i
    return arrays


cdef ort.OrtCUDAProviderOptionsV2* _cuda_options(dict settings) except NULL:
    """New CUDA provider options with `settings` applied (the caller releases them)."""
    cdef ort.OrtCUDAProviderOptionsV2* cuda = NULL
    cdef _OptionArrays arrays = _option_arrays(settings)
    check(ort.CreateCUDAProviderOptions(&cuda))
    try:
        if arrays.count:
            check(ort.UpdateCUDAProviderOptions(cuda, arrays.keys, arrays.values, <size_t>arrays.count))
    except BaseException:
        ort.ReleaseCUDAProviderOptions(cuda)
        raise
    return cuda


cdef int _append_cuda(ort.OrtSessionOptions* options, dict settings) except -1:
    cdef ort.OrtCUDAProviderOptionsV2* cuda = _cuda_options(settings)
    try:
        check(ort.SessionOptionsAppendExecutionProvider_CUDA_V2(options, cuda))
    finally:
        ort.ReleaseCUDAProviderOptions(cuda)
    return 0


cdef dict effective_cuda_options(dict settings):
    """The full option set the CUDA provider runs with, as onnxruntime reports it."""
    cdef ort.OrtAllocator* allocator = NULL
    cdef char* text = NULL
    cdef ort.OrtCUDAProviderOptionsV2* cuda = _cuda_options(settings)
    try:
        check(ort.GetAllocatorWithDefaultOptions(&allocator))
        check(ort.GetCUDAProviderOptionsAsString(cuda, allocator, &text))
        joined = take_ort_string(text, allocator)
    finally:
        ort.ReleaseCUDAProviderOptions(cuda)
    result = {}
    for item in joined.split(";"):
        if "=" in item:
            key, _, value = item.partition("=")
            result[key] = value
    return result


cdef int _append_generic(ort.OrtSessionOptions* options, str name, dict settings) except -1:
    cdef _OptionArrays arrays = _option_arrays(settings)
    check(ort.SessionOptionsAppendExecutionProvider(
        options, encode_text(_GENERIC_PROVIDER_NAMES[name], "provider"), arrays.keys, arrays.values,
        <size_t>arrays.count))
    return 0


cdef int _append_tensorrt(ort.OrtSessionOptions* options, dict settings) except -1:
    cdef ort.OrtTensorRTProviderOptionsV2* trt = NULL
    cdef _OptionArrays arrays = _option_arrays(settings)
    check(ort.CreateTensorRTProviderOptions(&trt))
    try:
        if arrays.count:
            check(ort.UpdateTensorRTProviderOptions(trt, arrays.keys, arrays.values, <size_t>arrays.count))
        check(ort.SessionOptionsAppendExecutionProvider_TensorRT_V2(options, trt))
    finally:
        ort.ReleaseTensorRTProviderOptions(trt)
    return 0


cdef int _left_out(str name, str reason, bint strict) except -1:
    """A requested provider cannot be used: a ProviderError when `strict`, else a warning (the
    session goes on with the providers that remain, as onnxruntime's does)."""
    if strict:
        raise ProviderError(reason)
    # (no stacklevel: Cython frames are invisible, so the caller's line is reported)
    warnings.warn(f"{reason.rstrip()}; the session continues without {name}", ProviderFallbackWarning)
    return 0


def warn_unavailable(str name, list available):
    """onnxruntime's warning for a provider that this build does not offer (its own words, which
    users' warning filters match)."""
    warnings.warn(f"Specified provider '{name}' is not in available provider names."
                  f"Available providers: '{', '.join(available)}'", ProviderFallbackWarning)


cdef list _configure_providers(ort.OrtSessionOptions* options, list requested, bint strict=False):
    """Append the requested providers to `options`; returns [(name, options)] as registered.

    A provider that is not in this build, that ortagent cannot configure, or that onnxruntime
    cannot create here (its libraries are missing, its options are refused) is left out with a
    ProviderFallbackWarning, or raises ProviderError when `strict` (or inside strict_providers()).
    The CPU provider always comes last."""
    strict = strict or strict_scope.get()
    available = get_available_providers()
    registered = []
    for name, settings in requested:
        if name not in available:
            if strict:
                known = name in ALL_PROVIDERS
                raise ProviderError(
                    (f"execution provider {name} is not available in this onnxruntime build" if known
                     else f"unknown execution provider {name!r}") + f" (available: {', '.join(available)})")
            warn_unavailable(name, available)
            continue
        if name == CPU_PROVIDER:
            unknown = set(settings) - {"use_arena"}
            if unknown and strict:
                raise ProviderError(f"unknown CPUExecutionProvider options {sorted(unknown)}; "
                                    "ortagent accepts 'use_arena'")
            continue
        if name != CUDA_PROVIDER and name != _TENSORRT and name not in _GENERIC_PROVIDER_NAMES:
            _left_out(name, f"ortagent cannot configure execution provider {name} (supported: {CPU_PROVIDER}, "
                            f"{CUDA_PROVIDER}, {_TENSORRT}, {', '.join(_GENERIC_PROVIDER_NAMES)})", strict)
            continue
        try:
            if name == CUDA_PROVIDER:
                _append_cuda(options, settings)
            elif name == _TENSORRT:
                _append_tensorrt(options, settings)
            else:
                _append_generic(options, name, settings)
        except Exception as exc:
            if strict:
                raise ProviderError(f"cannot use execution provider {name}: {exc}") from exc
            _left_out(name, f"Failed to create {name}: {exc}", False)
            continue
        registered.append((name, settings))
    # onnxruntime reports no options for its CPU provider (use_arena is applied to the session
    # options before this): the same here
    registered.append((CPU_PROVIDER, {}))
    return registered


cdef int require_provider_loads(str name) except -1:
    """Raise ProviderError unless the provider `name` can be created here: appended to scratch
    session options, which loads its library. Some C API calls (CreateAndRegisterAllocatorV2)
    abort the process instead of failing when a listed provider's library cannot load."""
    if name == CPU_PROVIDER:
        return 0
    cdef ort.OrtSessionOptions* scratch = NULL
    check(ort.CreateSessionOptions(&scratch))
    try:
        _configure_providers(scratch, [(name, {})], True)
    finally:
        ort.ReleaseSessionOptions(scratch)
    return 0


cdef int set_dynamic_options(ort.OrtSession* session, object options) except -1:
    """OrtApi::SetEpDynamicOptions: options the session's execution providers take while the
    session lives (e.g. 'ep.dynamic.workload_type')."""
    if not isinstance(options, dict):
        raise OrtInvalidType(f"options must be a dict, got {type(options).__name__}")
    if not options:
        raise OrtInvalidArgument("no options given")
    cdef _OptionArrays arrays = _option_arrays({str(k): _option_text(v) for k, v in options.items()})
    check(ort.SetEpDynamicOptions(session, arrays.keys, arrays.values, <size_t>arrays.count))
    return 0


cdef ort.OrtSession* _create(const ort.OrtSessionOptions* base, object model_path, object model_bytes,
                             list requested, bint strict, list registered) except NULL:
    """A new OrtSession for the model with `requested` providers appended to a clone of `base`
    (the caller's options stay reusable); `registered` receives [(name, options)]."""
    cdef ort.OrtSessionOptions* options = NULL
    cdef ort.OrtSession* session = NULL
    cdef const char* path_c
    cdef const char* data_c
    cdef size_t data_len
    cdef ort.OrtStatus* status
    check(ort.CloneSessionOptions(base, &options))
    try:
        if _settings_for(requested, CPU_PROVIDER).get("use_arena") in ("0", "False", "false"):
            check(ort.DisableCpuMemArena(options))
        chosen = _configure_providers(options, requested, strict)
        if model_path is not None:
            path_c = model_path
            with nogil:
                status = ort.CreateSession(shared_runtime().env, path_c, options, &session)
        else:
            data_c = model_bytes
            data_len = <size_t>len(model_bytes)
            with nogil:
                status = ort.CreateSessionFromArray(shared_runtime().env, data_c, data_len, options, &session)
        check(status)
    finally:
        ort.ReleaseSessionOptions(options)
    registered[:] = chosen
    return session


cdef ort.OrtSession* create_session(const ort.OrtSessionOptions* base, object model_path, object model_bytes,
                                    list requested, bint strict, bint fallback, list registered,
                                    bint* fell_back) except NULL:
    """A new OrtSession (see _create). When creating it fails with providers other than the
    CPU's, and neither `strict` nor fallback is off, it is created again on onnxruntime's
    fallback providers, with onnxruntime's "EP Error" text as a warning; fell_back[0] says so."""
    fell_back[0] = False
    strict = strict or strict_scope.get()            # inside strict_providers(): no fallback either
    try:
        return _create(base, model_path, model_bytes, requested, strict, registered)
    except OrtError as exc:
        attempted = [name for name, _ in requested]
        if strict or not fallback or attempted == [CPU_PROVIDER]:
            raise
        retry = _fallback_providers(requested)
        warnings.warn(f"EP Error {exc} when using {attempted}\nFalling back to "
                      f"{[name for name, _ in retry]} and retrying.", ProviderFallbackWarning)
        fell_back[0] = True
        return _create(base, model_path, model_bytes, retry, False, registered)
