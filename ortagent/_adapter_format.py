"""onnxruntime's LoRA adapter files, written and read in Python: ``AdapterFormat``.

onnxruntime writes and reads these files in the C++ of its Python module; its C API only loads
one into an ``OrtLoraAdapter`` (``ortagent.LoraAdapter``), which hands nothing back. So ortagent
builds and parses the file itself with the ``flatbuffers`` package, after the schema onnxruntime
publishes (onnxruntime/lora/adapter_format/adapter_schema.fbs). The accessors below are written
from these facts of that schema:

* file identifier ``TORT``; root table ``Adapter`` with fields, in slot order,
  ``format_version: int``, ``adapter_version: int``, ``model_version: int``,
  ``parameters: [Parameter]``;
* table ``Parameter``: ``name: string``, ``dims: [int64]``, ``data_type: int32`` (the ONNX
  element type numbers, 1 = float ... 20 = float8e5m2fnuz), ``raw_data: [uint8]`` (the tensor's
  bytes, little-endian, the vector aligned to 8 bytes);
* format version 1 is the one onnxruntime writes and reads.

A file read back is checked by the loaded onnxruntime first (it loads the bytes as a
``LoraAdapter``, which verifies the flatbuffer and the version), so an adapter that onnxruntime
refuses is refused here with onnxruntime's own words, and a malformed file is never parsed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ortagent.errors import OrtFail, OrtInvalidArgument, OrtInvalidType, OrtNoSuchFile

if TYPE_CHECKING:  # pragma: no cover
    from ortagent._core import OrtValue

_FILE_IDENTIFIER = b"TORT"
_FORMAT_VERSION = 1
# Adapter fields (slot numbers)
_ADAPTER_FORMAT_VERSION, _ADAPTER_ADAPTER_VERSION, _ADAPTER_MODEL_VERSION, _ADAPTER_PARAMETERS = range(4)
# Parameter fields
_PARAM_NAME, _PARAM_DIMS, _PARAM_DATA_TYPE, _PARAM_RAW_DATA = range(4)
_ELEMENT_TYPES = range(1, 21)           # the element types the schema's enum names
_STRING = 8
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
# bytes per element of each element type the schema names (complex ones included)
_ITEM_SIZES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16,
               16: 2, 17: 1, 18: 1, 19: 1, 20: 1}


def _flatbuffers() -> Any:
    try:
        import flatbuffers
    except ImportError:     # pragma: no cover - a dependency of ortagent (and of onnxruntime's wheels)
        raise OrtFail("AdapterFormat needs the flatbuffers package (pip install flatbuffers)") from None
    return flatbuffers


def _int32(value: Any, what: str) -> int:
    if not hasattr(type(value), "__index__"):
        raise OrtInvalidType(f"{what} must be an int, got {type(value).__name__}")
    number = value.__index__()
    if not _INT32_MIN <= number <= _INT32_MAX:
        raise OrtInvalidType(f"{what} must fit a 32-bit int, got {number}")
    return number


def _path(file_path: Any, what: str) -> str | bytes:
    if not isinstance(file_path, (str, bytes, os.PathLike)):
        raise OrtInvalidType(f"{what} must be a path, got {type(file_path).__name__}")
    path = os.fspath(file_path)
    if (b"\0" if isinstance(path, bytes) else "\0") in path:
        raise OrtInvalidArgument(f"{what} must not contain NUL characters")
    return path


# ---- writing ----------------------------------------------------------------------------------------

def _tensor_parts(name: Any, value: Any) -> tuple[str, int, list[int], bytes]:
    """(name, element type, dims, raw bytes) of one parameter, refused with the reason when it
    cannot be stored in an adapter file."""
    from ortagent import _core

    text = str(name)            # onnxruntime's module takes str() of each key too
    if not text:
        raise OrtInvalidArgument("an adapter parameter needs a name: onnxruntime refuses to load a "
                                 "parameter without one")
    if not isinstance(value, _core.OrtValue):
        raise OrtInvalidType(f"adapter parameter {text!r} must be an ortagent.OrtValue, got "
                             f"{type(value).__name__}")
    if not value.is_tensor():
        raise OrtInvalidArgument(f"adapter parameter {text!r} must be a tensor, got {value.data_type()}")
    elem = value.element_type()
    if elem == _STRING:         # onnxruntime's writer refuses these with these words
        raise OrtFail(f"Lora adapter parameter '{text}' has element type STRING, which is not supported by "
                      "the adapter format.")
    if elem not in _ELEMENT_TYPES:
        raise OrtFail(f"Lora adapter parameter '{text}' is a {value.data_type()}: the adapter format's "
                      "element types are those numbered 1 to 20")
    array = value.numpy()       # a view of CPU memory, a copy of device memory
    return text, elem, [int(d) for d in value.shape()], array.tobytes()


def _build(parameters: list[tuple[str, int, list[int], bytes]], adapter_version: int,
           model_version: int) -> bytes:
    """The bytes of an adapter file holding `parameters`."""
    import numpy as np

    flatbuffers = _flatbuffers()
    builder = flatbuffers.Builder(1024 + sum(len(raw) + 64 for _, _, _, raw in parameters))
    tables = []
    for name, elem, dims, raw in parameters:
        name_at = builder.CreateString(name)
        dims_at = builder.CreateNumpyVector(np.asarray(dims, dtype="<i8").reshape(-1))
        # The tensor's bytes start 8-aligned (counted from the end of the buffer, whose size
        # Finish rounds to the largest alignment used): onnxruntime makes tensors over them.
        builder.Prep(8, len(raw))
        raw_at = builder.CreateByteVector(raw)
        builder.StartObject(4)
        builder.PrependUOffsetTRelativeSlot(_PARAM_NAME, name_at, 0)
        builder.PrependUOffsetTRelativeSlot(_PARAM_DIMS, dims_at, 0)
        builder.PrependInt32Slot(_PARAM_DATA_TYPE, elem, 0)
        builder.PrependUOffsetTRelativeSlot(_PARAM_RAW_DATA, raw_at, 0)
        tables.append(builder.EndObject())
    builder.StartVector(4, len(tables), 4)
    for table in reversed(tables):
        builder.PrependUOffsetTRelative(table)
    vector_at = builder.EndVector()
    builder.StartObject(4)
    builder.PrependInt32Slot(_ADAPTER_FORMAT_VERSION, _FORMAT_VERSION, 0)
    builder.PrependInt32Slot(_ADAPTER_ADAPTER_VERSION, adapter_version, 0)
    builder.PrependInt32Slot(_ADAPTER_MODEL_VERSION, model_version, 0)
    builder.PrependUOffsetTRelativeSlot(_ADAPTER_PARAMETERS, vector_at, 0)
    builder.Finish(builder.EndObject(), file_identifier=_FILE_IDENTIFIER)
    return bytes(builder.Output())


# ---- reading ----------------------------------------------------------------------------------------

class _Table:
    """One table of a flatbuffer: its fields by slot number (absent fields read as defaults)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def _at(self, slot: int) -> int:
        # a table's vtable lists, after its own size and the table's, one 2-byte offset a slot
        return int(self.table.Offset(4 + 2 * slot))

    def int32(self, slot: int) -> int:
        from flatbuffers import number_types

        at = self._at(slot)
        return int(self.table.Get(number_types.Int32Flags, self.table.Pos + at)) if at else 0

    def string(self, slot: int) -> str | None:
        at = self._at(slot)
        return self.table.String(self.table.Pos + at).decode("utf-8") if at else None

    def vector(self, slot: int) -> tuple[int, int]:
        """(position of the first element, element count) of a vector field; (0, 0) if absent."""
        at = self._at(slot)
        if not at:
            return 0, 0
        return int(self.table.Vector(at)), int(self.table.VectorLen(at))

    def tables(self, slot: int) -> list[_Table]:
        from flatbuffers.table import Table

        start, count = self.vector(slot)
        return [_Table(Table(self.table.Bytes, self.table.Indirect(start + 4 * i))) for i in range(count)]


def _root(data: bytes) -> _Table:
    _flatbuffers()
    from flatbuffers import encode, number_types
    from flatbuffers.table import Table

    # the buffer starts with the offset of its root table
    return _Table(Table(data, encode.Get(number_types.UOffsetTFlags.packer_type, data, 0)))


def _parameter(data: bytes, table: _Table) -> tuple[str, OrtValue]:
    """(name, read-only OrtValue over `data`) of one Parameter table."""
    import numpy as np

    from ortagent import _core

    name = table.string(_PARAM_NAME) or ""
    elem = table.int32(_PARAM_DATA_TYPE)
    dims_at, rank = table.vector(_PARAM_DIMS)
    dims = [int(d) for d in np.frombuffer(data, dtype="<i8", count=rank, offset=dims_at)] if rank else []
    raw_at, size = table.vector(_PARAM_RAW_DATA)
    item = _ITEM_SIZES.get(elem)
    count = 1
    for d in dims:
        count *= d
    if item is None or any(d < 0 for d in dims) or count * item != size:
        # onnxruntime checks these too (1.31); older runtimes let them through
        raise OrtInvalidArgument(f"adapter parameter {name!r}: element type {elem} and shape {dims} do "
                                 f"not match its {size} bytes of data")
    # The tensor views the file's bytes (no copy), read-only: the bytes object is immutable.
    # (Words of the element's size carry the bytes; the element type is given separately.)
    word = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}.get(
        item, np.dtype((np.void, item)))
    words = np.frombuffer(data, dtype=word, count=count, offset=raw_at).reshape(dims)
    return name, _core.OrtValue.ortvalue_from_numpy_with_onnx_type(words, elem)


def _read(file_path: Any) -> tuple[int, int, int, dict[str, OrtValue]]:
    """(format version, adapter version, model version, parameters) of an adapter file."""
    from ortagent._core import LoraAdapter

    path = _path(file_path, "file_path")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise OrtNoSuchFile(f"no LoRA adapter file {os.fsdecode(path)!r}") from None
    except OSError as exc:
        raise OrtFail(f"cannot read the LoRA adapter file {os.fsdecode(path)!r}: {exc.strerror}") from exc
    # onnxruntime verifies the flatbuffer, its identifier and format version, and the parameters
    # (its own errors, as its Python module raises them); only then is the file parsed here.
    # (An empty file goes as one NUL byte: onnxruntime's words for it, not the C API's refusal
    # of an empty buffer.)
    LoraAdapter().Load(data if data else b"\0")
    root = _root(data)
    parameters = dict(_parameter(data, table) for table in root.tables(_ADAPTER_PARAMETERS))
    return (root.int32(_ADAPTER_FORMAT_VERSION), root.int32(_ADAPTER_ADAPTER_VERSION),
            root.int32(_ADAPTER_MODEL_VERSION), parameters)


# ---- the public class -------------------------------------------------------------------------------

class AdapterFormat:
    """A LoRA adapter file's contents: versions and named parameters (tensors as OrtValues),
    written with ``export_adapter`` and read with ``AdapterFormat.read_adapter``, in onnxruntime's
    adapter format (what ``LoraAdapter.Load`` and onnxruntime's own ``LoraAdapter`` load)."""

    def __init__(self) -> None:
        self._format_version = _FORMAT_VERSION
        self._adapter_version = 0
        self._model_version = 0
        self._parameters: dict[str, OrtValue] = {}

    @staticmethod
    def read_adapter(file_path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> AdapterFormat:
        """The adapter stored at `file_path`. Its parameters are read-only OrtValues over the
        file's bytes, held in memory (no copy per parameter)."""
        adapter = AdapterFormat()
        (adapter._format_version, adapter._adapter_version, adapter._model_version,
         adapter._parameters) = _read(file_path)
        return adapter

    def export_adapter(self, file_path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> None:
        """Write the versions and parameters to `file_path` in onnxruntime's adapter format."""
        path = _path(file_path, "file_path")
        data = _build([_tensor_parts(name, value) for name, value in self._parameters.items()],
                      self._adapter_version, self._model_version)
        try:
            with open(path, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            # onnxruntime's words for the same failure, with the system's reason
            raise OrtFail(f"Failed to open file:\"{os.fsdecode(path)}\" for writing. ({exc.strerror})") from exc

    def get_format_version(self) -> int:
        """The version of the file format (1; what a file read back says)."""
        return self._format_version

    def set_adapter_version(self, adapter_version: int) -> None:
        self._adapter_version = _int32(adapter_version, "adapter_version")

    def get_adapter_version(self) -> int:
        return self._adapter_version

    def set_model_version(self, model_version: int) -> None:
        self._model_version = _int32(model_version, "model_version")

    def get_model_version(self) -> int:
        return self._model_version

    def set_parameters(self, params: Mapping[str, OrtValue]) -> None:
        """The parameters to export: names (str() of each key) to ortagent.OrtValue tensors."""
        from ortagent import _core

        if not isinstance(params, Mapping):
            raise OrtInvalidType(f"params must be a dict of names to OrtValues, got {type(params).__name__}")
        for name, value in params.items():
            if not isinstance(value, _core.OrtValue):
                raise OrtInvalidType(f"adapter parameter {str(name)!r} must be an ortagent.OrtValue, got "
                                     f"{type(value).__name__}")
        self._parameters = dict(params)

    def get_parameters(self) -> dict[str, OrtValue]:
        """Names to OrtValues: those given to set_parameters, or those read from the file."""
        return dict(self._parameters)

    def __repr__(self) -> str:
        return (f"<AdapterFormat format {self._format_version}, adapter {self._adapter_version}, "
                f"model {self._model_version}, {len(self._parameters)} parameters>")
