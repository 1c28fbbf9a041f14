"""include/ortagent/element_types.h, the one table of element types every extension module
reads, against ONNX's own TensorProto numbering, NumPy's (and ml_dtypes') item sizes and the
DLPack data types ortagent's DLPack export produces."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

import ortagent

# onnxruntime itself has no complex tensors ("tensor type 14 is not supported")
NOT_IN_ONNXRUNTIME = {TensorProto.COMPLEX64, TensorProto.COMPLEX128}
ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "include" / "ortagent" / "element_types.h"
_ROW = re.compile(r'T\((\w+), (\d+), "(\w*)", "(\w*)", (\d+), (\w+), (\d+), ([01])\)')


def table():
    rows = _ROW.findall(HEADER.read_text())
    return [(suffix, int(number), name, numpy_name, int(size), code, int(bits), ml == "1")
            for suffix, number, name, numpy_name, size, code, bits, ml in rows]


def test_every_onnx_element_type_up_to_the_newest_is_in_the_table():
    rows = table()
    numbers = [row[1] for row in rows]
    assert numbers == list(range(1, len(rows) + 1))          # dense, in order
    for suffix, number, name, *_ in rows:
        # ONNX's own name for the number, lower case, is the name in 'tensor(<name>)'
        assert TensorProto.DataType.Name(number) == suffix, (suffix, number)
        assert name == suffix.lower()


@pytest.mark.parametrize("row", table(), ids=lambda row: row[0])
def test_numpy_name_and_item_size(row):
    suffix, number, name, numpy_name, size, _, _, from_ml_dtypes = row
    if not numpy_name:
        assert size == 0                                       # sub-byte types
        return
    if from_ml_dtypes:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = np.dtype(getattr(ml_dtypes, numpy_name))
    else:
        dtype = np.dtype(numpy_name)
    assert size == (0 if dtype.kind == "O" else dtype.itemsize)
    if dtype.kind != "O" and number not in NOT_IN_ONNXRUNTIME:
        value = ortagent.OrtValue.ortvalue_from_shape_and_type([2], number)
        assert value.data_type() == f"tensor({name})"
        assert value.numpy().dtype == dtype


@pytest.mark.parametrize("row", [r for r in table() if r[6]], ids=lambda row: row[0])
def test_dlpack_data_type(row):
    suffix, number, _, numpy_name, size, code, bits, from_ml_dtypes = row
    assert bits == 8 * size
    if number in NOT_IN_ONNXRUNTIME:
        return
    value = ortagent.OrtValue.ortvalue_from_shape_and_type([3], number)
    exported = ortagent.from_dlpack(value)                     # the type survives a round trip
    assert exported.element_type() == number
