"""OrtValue on the CPU: zero-copy NumPy in and out, every dtype, shape/type reporting."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

from ortagent_testkit import onnx_models as models
import ortagent
from ortagent import OrtValue

ELEMENT_TYPES = {
    "float32": (1, "tensor(float)"), "uint8": (2, "tensor(uint8)"), "int8": (3, "tensor(int8)"),
    "uint16": (4, "tensor(uint16)"), "int16": (5, "tensor(int16)"), "int32": (6, "tensor(int32)"),
    "int64": (7, "tensor(int64)"), "string": (8, "tensor(string)"), "bool": (9, "tensor(bool)"),
    "float16": (10, "tensor(float16)"), "float64": (11, "tensor(double)"),
    "uint32": (12, "tensor(uint32)"), "uint64": (13, "tensor(uint64)"),
    "bfloat16": (16, "tensor(bfloat16)"),
}


@pytest.mark.parametrize("dtype_name", sorted(ELEMENT_TYPES))
def test_from_numpy_reports_type_shape_and_shares_memory(dtype_name):
    if dtype_name == "bfloat16":
        pytest.importorskip("ml_dtypes")
    x = models.random_array(dtype_name, (2, 3), np.random.default_rng(0))
    value = OrtValue.ortvalue_from_numpy(x)
    number, type_string = ELEMENT_TYPES[dtype_name]
    assert value.element_type() == number
    assert value.data_type() == type_string
    assert value.shape() == [2, 3]
    assert value.is_tensor() and value.has_value()
    assert value.device_name() == "cpu"
    back = value.numpy()
    assert back.shape == x.shape and back.dtype == x.dtype
    if dtype_name == "string":
        assert back.tolist() == x.tolist()
        assert value.data_ptr() == 0
    else:
        assert value.data_ptr() == x.ctypes.data          # zero-copy in
        assert back.ctypes.data == x.ctypes.data          # zero-copy out
        assert back.tobytes() == x.tobytes()


def test_writes_are_visible_both_ways():
    x = np.zeros((3, 4), np.float32)
    value = OrtValue.ortvalue_from_numpy(x)
    view = value.numpy()
    view[1, 2] = 5
    assert x[1, 2] == 5
    x[0, 0] = -1
    assert value.numpy()[0, 0] == -1


def test_non_contiguous_input_is_copied_and_kept_alive():
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    sliced = base[:, ::2]
    value = OrtValue.ortvalue_from_numpy(sliced)
    assert value.data_ptr() != sliced.ctypes.data
    del base, sliced
    gc.collect()
    np.testing.assert_array_equal(value.numpy(), np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2])


def test_read_only_source_gives_read_only_view():
    x = np.arange(4, dtype=np.int32)
    x.setflags(write=False)
    view = OrtValue.ortvalue_from_numpy(x).numpy()
    assert not view.flags.writeable
    with pytest.raises(ortagent.OrtInvalidArgument):
        OrtValue.ortvalue_from_numpy(x).update_inplace(np.zeros(4, np.int32))


def test_value_keeps_source_array_alive():
    x = np.arange(1000, dtype=np.float32)
    refs = sys.getrefcount(x)
    value = OrtValue.ortvalue_from_numpy(x)
    assert sys.getrefcount(x) == refs + 1
    del value
    gc.collect()
    assert sys.getrefcount(x) == refs


@pytest.mark.parametrize("element_type", [np.float32, np.int64, "tensor(double)", 9, np.dtype("uint8")])
def test_from_shape_and_type(element_type):
    value = OrtValue.ortvalue_from_shape_and_type([2, 0, 3] if element_type == 9 else [4, 5], element_type)
    arr = value.numpy()
    assert list(arr.shape) == value.shape()
    if arr.size:
        arr[...] = 1
        assert (value.numpy() == 1).all()


def test_string_value_from_shape_is_empty_strings():
    value = OrtValue.ortvalue_from_shape_and_type([2], object)
    assert value.numpy().tolist() == ["", ""]


def test_update_inplace():
    x = np.zeros(5, np.float32)
    value = OrtValue.ortvalue_from_numpy(x)
    value.update_inplace(np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(x, np.arange(5))
    with pytest.raises(ortagent.OrtInvalidArgument):
        value.update_inplace(np.zeros(4, np.float32))
    with pytest.raises(ortagent.OrtInvalidArgument):
        value.update_inplace(np.zeros(5, np.float64))


def test_zero_size_and_scalar_values():
    empty = OrtValue.ortvalue_from_numpy(np.zeros((0, 3), np.float32))
    assert empty.shape() == [0, 3] and empty.numpy().shape == (0, 3)
    scalar = OrtValue.ortvalue_from_numpy(np.array(3.5, np.float64))
    assert scalar.shape() == [] and scalar.numpy()[()] == 3.5


def test_high_rank_values():
    x = np.arange(2 ** 10, dtype=np.int16).reshape((2,) * 10)
    value = OrtValue.ortvalue_from_numpy(x)
    assert value.shape() == [2] * 10
    np.testing.assert_array_equal(value.numpy(), x)
    session = ortagent.InferenceSession(models.identity(models.DTYPES["int16"], shape=[2] * 10))
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x)


def test_ortvalue_cannot_be_constructed_or_pickled():
    import pickle

    with pytest.raises(TypeError):
        OrtValue()
    with pytest.raises(TypeError):
        pickle.dumps(OrtValue.ortvalue_from_numpy(np.ones(1)))


def test_released_value_raises():
    value = OrtValue.ortvalue_from_numpy(np.ones(2))
    value.close()
    with pytest.raises(ortagent.ObjectClosedError):
        value.shape()
    with pytest.raises(ortagent.ObjectClosedError):
        value.numpy()
    session = ortagent.InferenceSession(models.identity(models.DTYPES["float64"], shape=[2]))
    with pytest.raises(ortagent.ObjectClosedError):
        session.run(None, {"x": value})


def test_close_with_views_outstanding_defers_release(no_leaks):
    value = OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32))
    view = value.numpy()
    value.close()
    with pytest.raises(ortagent.ObjectClosedError):
        value.shape()
    assert ortagent.live_handles()["value"] >= 1
    np.testing.assert_array_equal(view, np.arange(6))  # still valid memory
    del view
    gc.collect()


def test_run_output_view_outlives_closing_its_value(no_leaks):
    session = ortagent.InferenceSession(models.mlp())
    (y,) = session.run(None, {"x": np.ones((2, 16), np.float32)})
    expected = y.copy()
    y.base.close()
    del session
    gc.collect()
    np.testing.assert_array_equal(y, expected)
    del y
