"""The one exception hierarchy of ortagent.

Every error ortagent raises is an :class:`OrtError`. Errors reported by onnxruntime keep the
runtime's error code in ``.code`` and map to a subclass per code; errors found by ortagent itself
(bad feeds, closed objects, misuse of a training run) use the subclass of the code onnxruntime
would have used for the same mistake. Each subclass also derives from the nearest builtin
exception, so ``except ValueError`` or ``except FileNotFoundError`` work as expected.

This module is pure Python and importable without onnxruntime.
"""

from __future__ import annotations

__all__ = [
    "OrtError",
    "OrtFail",
    "OrtInvalidArgument",
    "OrtInvalidType",
    "FeedConversionError",
    "OrtNoSuchFile",
    "OrtNoModel",
    "OrtEngineError",
    "OrtRuntimeException",
    "OrtInvalidProtobuf",
    "OrtModelLoaded",
    "OrtNotImplemented",
    "OrtInvalidGraph",
    "OrtEPFail",
    "OrtModelLoadCanceled",
    "OrtModelRequiresCompilation",
    "OrtNotFound",
    "OrtLoadError",
    "OrtVersionError",
    "ObjectClosedError",
    "ProviderError",
    "DLPackError",
    "TrainingGraphError",
    "UnsupportedTrainingOpError",
    "RunStateError",
    "UnknownRunError",
    "ProviderFallbackWarning",
    "error_class_for_code",
    "status_text",
]

# onnxruntime's OrtErrorCode values (OrtErrorCode enum of the C API).
ORT_OK = 0
ORT_FAIL = 1
ORT_INVALID_ARGUMENT = 2
ORT_NO_SUCHFILE = 3
ORT_NO_MODEL = 4
ORT_ENGINE_ERROR = 5
ORT_RUNTIME_EXCEPTION = 6
ORT_INVALID_PROTOBUF = 7
ORT_MODEL_LOADED = 8
ORT_NOT_IMPLEMENTED = 9
ORT_INVALID_GRAPH = 10
ORT_EP_FAIL = 11
ORT_MODEL_LOAD_CANCELED = 12
ORT_MODEL_REQUIRES_COMPILATION = 13
ORT_NOT_FOUND = 14

# How onnxruntime names its status codes in the text of its errors (see status_text).
_CODE_NAMES = ("SUCCESS", "FAIL", "INVALID_ARGUMENT", "NO_SUCHFILE", "NO_MODEL", "ENGINE_ERROR",
               "RUNTIME_EXCEPTION", "INVALID_PROTOBUF", "MODEL_LOADED", "NOT_IMPLEMENTED", "INVALID_GRAPH",
               "EP_FAIL", "MODEL_LOAD_CANCELED", "MODEL_REQUIRES_COMPILATION", "NOT_FOUND", "DEVICE_RESET")


def status_text(code: int, message: str) -> str:
    """The text onnxruntime gives an error that comes from one of its statuses:
    ``[ONNXRuntimeError] : <code> : <NAME> : <message>`` (``GENERAL ERROR`` for a code it has no
    name for). ortagent's errors raised from a status read the same."""
    name = _CODE_NAMES[code] if 0 <= code < len(_CODE_NAMES) else "GENERAL ERROR"
    return f"[ONNXRuntimeError] : {code} : {name} : {message}"


class OrtError(Exception):
    """Base of every ortagent exception.

    ``code`` is onnxruntime's error code (an int, see the ``ORT_*`` constants of this module)
    or ``None`` for errors that do not correspond to one (failing to load the runtime). An error
    raised from one of onnxruntime's statuses reads as onnxruntime's do,
    ``[ONNXRuntimeError] : <code> : <NAME> : <message>`` (see :func:`status_text`); errors that
    ortagent finds itself carry no such prefix, as those of onnxruntime's Python layer do not.
    """

    default_code: int | None = ORT_FAIL

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message)
        self.code = self.default_code if code is None else code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class OrtFail(OrtError, RuntimeError):
    default_code = ORT_FAIL


class OrtInvalidArgument(OrtError, ValueError):
    default_code = ORT_INVALID_ARGUMENT


class OrtInvalidType(OrtInvalidArgument, TypeError):
    """An argument of the wrong Python type (also a ``TypeError``)."""


class FeedConversionError(OrtInvalidArgument, RuntimeError):
    """A feed that cannot be converted to what the input takes, where onnxruntime's Python module
    raises a RuntimeError for the same feed (a dict fed for a map: an empty one, a key or value
    of a type it cannot read). Also a RuntimeError, so code written for onnxruntime catches it."""


class OrtNoSuchFile(OrtError, FileNotFoundError):
    default_code = ORT_NO_SUCHFILE

    def __init__(self, message: str = "", code: int | None = None) -> None:
        # FileNotFoundError's own __init__ would reinterpret a (code, message) pair; keep one arg.
        OrtError.__init__(self, message, code)


class OrtNoModel(OrtError, ValueError):
    default_code = ORT_NO_MODEL


class OrtEngineError(OrtError, RuntimeError):
    default_code = ORT_ENGINE_ERROR


class OrtRuntimeException(OrtError, RuntimeError):
    default_code = ORT_RUNTIME_EXCEPTION


class OrtInvalidProtobuf(OrtError, ValueError):
    default_code = ORT_INVALID_PROTOBUF


class OrtModelLoaded(OrtError, RuntimeError):
    default_code = ORT_MODEL_LOADED


class OrtNotImplemented(OrtError, NotImplementedError):
    default_code = ORT_NOT_IMPLEMENTED


class OrtInvalidGraph(OrtError, ValueError):
    default_code = ORT_INVALID_GRAPH


class OrtEPFail(OrtError, RuntimeError):
    default_code = ORT_EP_FAIL


class OrtModelLoadCanceled(OrtError, RuntimeError):
    default_code = ORT_MODEL_LOAD_CANCELED


class OrtModelRequiresCompilation(OrtError, RuntimeError):
    default_code = ORT_MODEL_REQUIRES_COMPILATION


class OrtNotFound(OrtError, LookupError, RuntimeError):
    """Something looked up is not there (a config entry never set). Also a RuntimeError, which is
    what onnxruntime's Python API raises for the same lookups."""

    default_code = ORT_NOT_FOUND


class OrtLoadError(OrtError, ImportError):
    """The onnxruntime shared library could not be found, loaded or is too old."""

    default_code = None

    def __init__(self, message: str = "", code: int | None = None) -> None:
        OrtError.__init__(self, message, code)
        ImportError.__init__(self, message)


class OrtVersionError(OrtNotImplemented):
    """A feature needs a newer onnxruntime than the one loaded."""


class ObjectClosedError(OrtError, RuntimeError):
    """A method was called on an object after ``close()`` (or on a released handle)."""

    default_code = ORT_INVALID_ARGUMENT


class ProviderError(OrtInvalidArgument):
    """An execution provider is unknown, unavailable in this build, or its options are bad."""


class ProviderFallbackWarning(UserWarning):
    """A listed execution provider was left out of a session (not in this build, or it could not
    be created) and the session runs on the providers that remain, as onnxruntime does. Pass
    ``strict_providers=True`` to ``InferenceSession`` to get a :class:`ProviderError` instead."""


class DLPackError(OrtError, BufferError):
    """A DLPack exchange cannot be done as asked (device, copy, layout, dtype, consumed capsule)."""

    default_code = ORT_INVALID_ARGUMENT


class TrainingGraphError(OrtInvalidGraph):
    """A training graph is not usable by TrainingAgent (YieldOp missing, repeated or malformed)."""


class UnsupportedTrainingOpError(TrainingGraphError, NotImplementedError):
    """A training graph holds a training-only operator that ortagent cannot lower to operators
    stock onnxruntime runs (``PythonOp``, the LSTM/GRU training operators, an unknown one).
    ``node_name`` and ``op_type`` name the node; the message says what to do."""

    default_code = ORT_NOT_IMPLEMENTED

    def __init__(self, message: str = "", code: int | None = None, *, node_name: str = "",
                 op_type: str = "") -> None:
        super().__init__(message, code)
        self.node_name = node_name
        self.op_type = op_type


class RunStateError(OrtError, RuntimeError):
    """A training run is used out of order: backward before forward, twice, or after release."""

    default_code = ORT_INVALID_ARGUMENT


class UnknownRunError(RunStateError, LookupError):
    """A run id (or state) that this agent does not hold: unknown, finished or released."""


_BY_CODE: dict[int, type[OrtError]] = {
    ORT_FAIL: OrtFail,
    ORT_INVALID_ARGUMENT: OrtInvalidArgument,
    ORT_NO_SUCHFILE: OrtNoSuchFile,
    ORT_NO_MODEL: OrtNoModel,
    ORT_ENGINE_ERROR: OrtEngineError,
    ORT_RUNTIME_EXCEPTION: OrtRuntimeException,
    ORT_INVALID_PROTOBUF: OrtInvalidProtobuf,
    ORT_MODEL_LOADED: OrtModelLoaded,
    ORT_NOT_IMPLEMENTED: OrtNotImplemented,
    ORT_INVALID_GRAPH: OrtInvalidGraph,
    ORT_EP_FAIL: OrtEPFail,
    ORT_MODEL_LOAD_CANCELED: OrtModelLoadCanceled,
    ORT_MODEL_REQUIRES_COMPILATION: OrtModelRequiresCompilation,
    ORT_NOT_FOUND: OrtNotFound,
}


def error_class_for_code(code: int) -> type[OrtError]:
    """The exception class for an onnxruntime error code (``OrtError`` for unknown codes)."""
    return _BY_CODE.get(code, OrtError)
