# cython: language_level=3
from ortagent cimport _capi as ort

# Append the requested providers ([(name, options)], normalised) to `options`; returns
# [(name, options)] as registered. Providers that cannot be used are left out with a
# ProviderFallbackWarning, or raise ProviderError when `strict` (or inside strict_providers()).
cdef list _configure_providers(ort.OrtSessionOptions* options, list requested, bint strict=*)
# The CUDA provider's options as onnxruntime will use them (defaults filled in).
cdef dict effective_cuda_options(dict settings)
# ProviderError unless the provider can be created here (its library loads).
cdef int require_provider_loads(str name) except -1
# Options the session's providers take while it lives (OrtApi::SetEpDynamicOptions).
cdef int set_dynamic_options(ort.OrtSession* session, object options) except -1
# A new OrtSession for the model (a path or the serialized bytes) with the requested providers
# appended to a clone of `base`, retried once on onnxruntime's fallback providers when creating it
# fails (unless `strict` or not `fallback`); `registered` receives [(name, options)] and
# fell_back[0] whether the retry happened.
cdef ort.OrtSession* create_session(const ort.OrtSessionOptions* base, object model_path, object model_bytes,
                                    list requested, bint strict, bint fallback, list registered,
                                    bint* fell_back) except NULL
