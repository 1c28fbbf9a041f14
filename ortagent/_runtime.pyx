# cython: language_level=3
"""The loaded onnxruntime: finding and dlopen-ing the library, API version negotiation, the one
process-wide OrtEnv, the status checker and the live-handle counters.

Nothing is loaded at import: the runtime is loaded by the first call that needs it, so that
``import ortagent`` works without onnxruntime installed and the error says what to install.
"""

import os
import signal
import threading

from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport uint32_t
from libc.string cimport strlen
from posix.dlfcn cimport dlopen, dlsym, dlerror, dlclose, RTLD_NOW, RTLD_LOCAL

from ortagent cimport _capi as ort
from ortagent import _library
from ortagent.errors import (OrtLoadError, error_class_for_code, status_text, OrtInvalidArgument, OrtInvalidType,
                             OrtFail)

cdef ort.ortagent_runtime _runtime
cdef Py_ssize_t _live_counts[<int>HANDLE_KIND_COUNT]
cdef void* _library_handle = NULL
_library_path = None
_load_lock = threading.Lock()

# This module's own pointer for ORTAGENT_CALL.
ort.ortagent_rt = &_runtime

_HANDLE_KIND_NAMES = (
    "session", "session_options", "run_options", "value", "memory_info", "io_binding",
    "allocator", "run_state", "dlpack_export", "sync_stream", "compile_options", "lora_adapter",
)

# Severity names onnxruntime uses for OrtLoggingLevel 0..4.
_SEVERITY_NAMES = ("verbose", "info", "warning", "error", "fatal")


cdef ort.ortagent_runtime* shared_runtime() noexcept nogil:
    return &_runtime


cdef Py_ssize_t* live_handle_counts() noexcept nogil:
    return _live_counts


cdef int raise_status(ort.OrtStatus* status, bint prefixed=True) except -1:
    cdef int code = <int>ort.GetErrorCode(status)
    cdef const char* text = ort.GetErrorMessage(status)
    message = text[:strlen(text)].decode("utf-8", "replace") if text != NULL else ""
    ort.ReleaseStatus(status)
    # onnxruntime's Python module raises a status as its text with the code in front; where it
    # calls C++ that throws instead (prefixed=False), the text is the exception's alone.
    raise error_class_for_code(code)(status_text(code, message) if prefixed else message, code)


def _parse_minor(version):
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    if int(parts[0]) != 1:
        return None
    return int(parts[1])


cdef int _open_library(str path, list failures) except -1:
    """dlopen `path` and negotiate the API; 1 on success, 0 (with a reason appended) otherwise."""
    global _library_handle, _library_path
    cdef bytes encoded = os.fsencode(path)       # file names need not be UTF-8
    # Messages show undecodable bytes as U+FFFD: a lone surrogate would make printing them fail.
    shown = encoded.decode("utf-8", "replace")
    if b"\0" in encoded:
        failures.append(f"{shown!r}: a path cannot contain NUL characters")
        return 0
    cdef void* handle = dlopen(encoded, RTLD_NOW | RTLD_LOCAL)
    cdef const char* err
    if handle == NULL:
        err = dlerror()
        reason = err.decode("utf-8", "replace") if err != NULL else "dlopen failed"
        if reason.startswith(shown + ": "):
            reason = reason[len(shown) + 2:]        # dlerror repeats the path
        failures.append(f"{shown}: {reason}")
        return 0
    cdef ort.ortagent_get_api_base_fn get_api_base = <ort.ortagent_get_api_base_fn>dlsym(
        handle, ort.ORTAGENT_GET_API_BASE_SYMBOL)
    if get_api_base == NULL:
        failures.append(f"{shown}: no symbol OrtGetApiBase (not an onnxruntime library)")
        dlclose(handle)     # nothing of it was used
        return 0
    cdef const ort.ortagent_api_base* base = get_api_base()
    cdef const char* version_text = base.get_version_string()
    version = version_text.decode("utf-8", "replace") if version_text != NULL else "?"
    minor = _parse_minor(version)
    if minor is None:
        failures.append(f"{shown}: unrecognised onnxruntime version string {version!r}")
        return 0
    if minor < ort.ORTAGENT_API_FLOOR:
        failures.append(
            f"{shown}: onnxruntime {version} is too old; ortagent needs onnxruntime >= "
            f"1.{ort.ORTAGENT_API_FLOOR} (OrtApi version {ort.ORTAGENT_API_FLOOR})")
        return 0
    cdef uint32_t wanted = <uint32_t>min(minor, ort.ORTAGENT_API_NEWEST)
    cdef const void* table = base.get_api(wanted)
    if table == NULL:
        failures.append(f"{shown}: onnxruntime {version} refused OrtApi version {wanted}")
        return 0
    _runtime.api = <const ort.ortagent_any_fn*>table
    _runtime.api_version = wanted
    _runtime.version_string = version_text
    _library_handle = handle
    _library_path = path
    return 1


# Sizes of the global thread pools asked for before the environment existed (None: the
# environment is created without global thread pools; sessions use their own threads).
_global_pool_sizes = None


cdef int _create_env() except -1:
    cdef ort.OrtEnv* env = NULL
    cdef ort.OrtThreadingOptions* threading = NULL
    cdef ort.OrtStatus* status = NULL
    if _global_pool_sizes is None:
        check(ort.CreateEnv(ort.ORT_LOGGING_LEVEL_WARNING, b"ortagent", &env))
    else:
        check(ort.CreateThreadingOptions(&threading))
        try:
            status = ort.SetGlobalIntraOpNumThreads(threading, _global_pool_sizes[0])
            if status == NULL:
                status = ort.SetGlobalInterOpNumThreads(threading, _global_pool_sizes[1])
            if status == NULL:
                status = ort.CreateEnvWithGlobalThreadPools(ort.ORT_LOGGING_LEVEL_WARNING, b"ortagent",
                                                            threading, &env)
            check(status)
        finally:
            ort.ReleaseThreadingOptions(threading)
    _runtime.env = env
    return 0


cdef int ensure_loaded() except -1:
    if _runtime.env != NULL:
        return 0
    with _load_lock:
        if _runtime.env != NULL:
            return 0
        paths, explicit = _library.candidate_paths()
        failures = []
        for path in paths:
            if _open_library(path, failures):
                break
        else:
            tried = "\n  ".join(failures)
            if explicit:
                raise OrtLoadError(
                    f"cannot use the onnxruntime library named by {_library.ENV_VARIABLE}:\n  {tried}")
            raise OrtLoadError(
                "cannot find a usable onnxruntime library; tried:\n  " + tried + "\n"
                + _library.INSTALL_HINT)
        _create_env()
    return 0


# ---- Ctrl-C during a run --------------------------------------------------------------------
#
# Python runs its SIGINT handler only when the main thread is back in the interpreter, which a
# thread inside a long OrtApi::Run (GIL released) is not. So while the main thread runs a model,
# a C-level SIGINT handler of ortagent's sets the terminate flag of that run's RunOptions, then
# hands the signal on to Python's handler. onnxruntime stops at the next node boundary, and
# ortagent raises the KeyboardInterrupt that Python's handler recorded.

cdef extern from *:
    """
    #include <signal.h>
    #include <string.h>
    static struct sigaction ortagent_previous_sigint;
    /* The RunOptions of the main thread's run in flight, NULL between runs. */
    static OrtRunOptions* volatile ortagent_interruptible_run;
    static volatile sig_atomic_t ortagent_interrupted;

    static void ortagent_on_sigint(int signo, siginfo_t* info, void* context) {
        OrtRunOptions* options = ortagent_interruptible_run;
        if (options != NULL) {
            ortagent_interrupted = 1;
            (void)ORTAGENT_CALL(RunOptionsSetTerminate)(options);
        }
        if (ortagent_previous_sigint.sa_flags & SA_SIGINFO) {
            if (ortagent_previous_sigint.sa_sigaction != NULL)
                ortagent_previous_sigint.sa_sigaction(signo, info, context);
        } else if (ortagent_previous_sigint.sa_handler != SIG_IGN &&
                   ortagent_previous_sigint.sa_handler != SIG_DFL) {
            ortagent_previous_sigint.sa_handler(signo);
        }
    }

    static int ortagent_install_sigint_handler(void) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = ortagent_on_sigint;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        return sigaction(SIGINT, &action, &ortagent_previous_sigint);
    }
    """
    ort.OrtRunOptions* ortagent_interruptible_run
    int ortagent_interrupted
    int ortagent_install_sigint_handler() nogil

cdef unsigned long _main_thread = threading.main_thread().ident
cdef int _sigint_state = 0          # 0: not tried, 1: installed, -1: left alone
cdef ort.OrtRunOptions* _main_run_options = NULL


cdef int _install_sigint() except -1:
    """Chain ortagent's handler in front of Python's, once, when Python handles SIGINT."""
    global _sigint_state
    _sigint_state = -1
    if not callable(signal.getsignal(signal.SIGINT)):
        return 0        # SIGINT ignored or left to the OS: not ours to change
    if ortagent_install_sigint_handler() == 0:
        _sigint_state = 1
    return 0


cdef ort.OrtRunOptions* interruptible_begin(ort.OrtRunOptions* given, bint* registered) except? NULL:
    global _main_run_options, ortagent_interrupted, ortagent_interruptible_run
    registered[0] = False
    if PyThread_get_thread_ident() != _main_thread:
        return given
    if _sigint_state == 0:
        _install_sigint()
    if _sigint_state != 1:
        return given
    if given == NULL:
        if _main_run_options == NULL:
            check(ort.CreateRunOptions(&_main_run_options))
        given = _main_run_options
    ortagent_interrupted = 0
    ortagent_interruptible_run = given
    registered[0] = True
    return given


cdef int interruptible_end(ort.OrtRunOptions* used, bint registered) except -1:
    global ortagent_interrupted, ortagent_interruptible_run
    if not registered:
        return 0
    ortagent_interruptible_run = NULL
    if ortagent_interrupted:
        ortagent_interrupted = 0
        check(ort.RunOptionsUnsetTerminate(used))
        PyErr_CheckSignals()        # raises the KeyboardInterrupt Python's handler recorded
    return 0


# ---- public functions ----------------------------------------------------------------------

def load():
    """Load the onnxruntime library now (normally done by the first call that needs it)."""
    ensure_loaded()
    return _library_path


def library_path():
    """Path of the loaded onnxruntime library, or None when not loaded yet."""
    return _library_path


def api_version():
    """The OrtApi version in use (min of the runtime's and the newest ortagent declares)."""
    ensure_loaded()
    return _runtime.api_version


def get_version_string():
    """The loaded onnxruntime's version, e.g. '1.31.1'."""
    ensure_loaded()
    return _runtime.version_string.decode()


def get_build_info():
    """The loaded onnxruntime's build description string."""
    ensure_loaded()
    cdef const char* info = ort.GetBuildInfoString()
    return info.decode("utf-8", "replace") if info != NULL else ""


def get_available_providers():
    """Execution providers compiled into the loaded onnxruntime, in its order of precedence."""
    ensure_loaded()
    cdef char** names = NULL
    cdef int count = 0
    check(ort.GetAvailableProviders(&names, &count))
    try:
        return [names[i].decode() for i in range(count)]
    finally:
        check(ort.ReleaseAvailableProviders(names, count))


def set_default_logger_severity(severity):
    """Set the log severity of the process-wide environment: 0 verbose ... 4 fatal."""
    if isinstance(severity, bool) or not isinstance(severity, int):
        raise OrtInvalidType(f"log severity must be an int 0..4 ({', '.join(_SEVERITY_NAMES)}), "
                             f"got {type(severity).__name__}")
    if not 0 <= severity <= 4:
        raise OrtInvalidArgument(
            f"log severity must be 0..4 ({', '.join(_SEVERITY_NAMES)}), got {severity}")
    ensure_loaded()
    check(ort.UpdateEnvWithCustomLogLevel(_runtime.env, <ort.OrtLoggingLevel>severity))
    global _default_severity
    _default_severity = severity


_default_severity = 2


def get_default_logger_severity():
    return _default_severity


def live_handles():
    """Counts of live ORT handles owned by ortagent objects, by kind (for leak checks)."""
    return {name: _live_counts[i] for i, name in enumerate(_HANDLE_KIND_NAMES)}


# ---- onnxruntime's module-level functions ----------------------------------------------------

# Every provider name onnxruntime's Python API knows (onnxruntime.get_all_providers(), 1.31), in
# its order. The C API has no such list: it reports only the providers built into the runtime.
ALL_PROVIDERS = (
    "NvTensorRTRTXExecutionProvider", "TensorrtExecutionProvider", "CUDAExecutionProvider",
    "MIGraphXExecutionProvider", "OpenVINOExecutionProvider", "DnnlExecutionProvider",
    "VitisAIExecutionProvider", "QNNExecutionProvider", "NnapiExecutionProvider",
    "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
    "ACLExecutionProvider", "DmlExecutionProvider", "RknpuExecutionProvider",
    "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider",
    "CANNExecutionProvider", "AzureExecutionProvider", "CPUExecutionProvider",
)
_GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "MIGraphXExecutionProvider",
                  "DmlExecutionProvider", "NvTensorRTRTXExecutionProvider")


def get_all_providers():
    """Every execution provider name onnxruntime knows, in its default order of precedence
    (whether or not the loaded build has it: see get_available_providers())."""
    return list(ALL_PROVIDERS)


def get_device():
    """'GPU' when the loaded onnxruntime build has a GPU execution provider, else 'CPU' (what
    the build supports, not whether a GPU is present)."""
    available = get_available_providers()
    return "GPU" if any([name in available for name in _GPU_PROVIDERS]) else "CPU"


def _thread_count(value, what):
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise OrtInvalidType(f"{what} must be an int, got {type(value).__name__}")
    value = value.__index__()
    if not 0 <= value <= 1 << 16:
        raise OrtInvalidArgument(f"{what} must be in [0, 65536], got {value}")
    return value


def set_global_thread_pool_sizes(intra_op_num_threads=0, inter_op_num_threads=0):
    """Give the process-wide environment global thread pools of these sizes (0: onnxruntime's
    default); sessions whose options set ``use_per_session_threads = False`` share them.

    onnxruntime's C API sets thread pools only when the environment is created, which ortagent
    does on the first call that needs onnxruntime (a session, options, a value): call this first.
    """
    global _global_pool_sizes
    intra = _thread_count(intra_op_num_threads, "intra_op_num_threads")
    inter = _thread_count(inter_op_num_threads, "inter_op_num_threads")
    with _load_lock:
        if _runtime.env != NULL:
            if _global_pool_sizes == (intra, inter):
                return
            raise OrtFail("set_global_thread_pool_sizes() must come before ortagent's first use of "
                          "onnxruntime: the environment exists already, and onnxruntime's C API "
                          "sets global thread pools only when it creates one")
        _global_pool_sizes = (intra, inter)


def global_thread_pool_sizes():
    """(intra, inter) given to set_global_thread_pool_sizes(), or None."""
    return _global_pool_sizes


def enable_telemetry_events():
    """Let onnxruntime send its telemetry events (where the build has a telemetry provider)."""
    ensure_loaded()
    check(ort.EnableTelemetryEvents(_runtime.env))


def disable_telemetry_events():
    """Stop onnxruntime's telemetry events."""
    ensure_loaded()
    check(ort.DisableTelemetryEvents(_runtime.env))


# ---- text to and from the C API ----------------------------------------------------------------------

cdef bytes encode_text(object text, str what):
    if isinstance(text, bytes):
        return text
    if not isinstance(text, str):
        raise OrtInvalidType(f"{what} must be a str, got {type(text).__name__}")
    if "\0" in text:
        raise OrtInvalidArgument(f"{what} must not contain NUL characters: {text!r}")
    return text.encode("utf-8")


cdef str take_ort_string(char* text, ort.OrtAllocator* allocator):
    if text == NULL:
        return ""
    try:
        return text[:strlen(text)].decode("utf-8", "replace")
    finally:
        check(ort.AllocatorFree(allocator, text))
