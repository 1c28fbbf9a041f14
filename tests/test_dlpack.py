"""DLPack in and out of OrtValue: NumPy and torch round trips, zero-copy proofs, capsule
flavours and flags, copy/dl_device/stream rules, ownership and leaks, CUDA metadata (read on
the CPU, never dereferenced) and real CUDA exchanges (marker `cuda`)."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from ortagent_testkit import onnx_models as models
import ortagent
from conftest import REPO_ROOT
from ortagent import DLPackError, OrtValue

# ---- DLPack 1.0 layout, as ctypes structures (facts from the DLPack specification) ----------

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM, KDL_VULKAN = 1, 2, 3, 10, 7
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_COMPLEX, KDL_BOOL = 0, 1, 2, 4, 5, 6
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)      # called without the GIL by ctypes
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# Capsule names live as long as this module (PyCapsule keeps the pointer, not a copy).
LEGACY, VERSIONED = b"dltensor", b"dltensor_versioned"
USED_LEGACY, USED_VERSIONED = b"used_dltensor", b"used_dltensor_versioned"

_api = ctypes.pythonapi
capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", _api))
capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", _api))
capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", _api))
# Over raw pointers: usable inside a capsule destructor (no reference counting).
raw_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
raw_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))


def capsule_name(capsule) -> bytes:
    return capsule_get_name(capsule)


def capsule_facts(capsule):
    """What an unconsumed capsule describes, copied out while the capsule is alive."""
    name = capsule_name(capsule)
    pointer = capsule_get_pointer(capsule, name)
    managed = (DLManagedTensorVersioned if name == VERSIONED else DLManagedTensor).from_address(pointer)
    tensor = managed.dl_tensor
    facts = dict(data=tensor.data or 0, device=(tensor.device.device_type, tensor.device.device_id),
                 ndim=tensor.ndim, dtype=(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes),
                 shape=[tensor.shape[i] for i in range(tensor.ndim)],
                 strides=[tensor.strides[i] for i in range(tensor.ndim)] if tensor.strides else None,
                 byte_offset=tensor.byte_offset)
    if name == VERSIONED:
        facts.update(flags=managed.flags, version=(managed.version.major, managed.version.minor))
    return facts


class HandMadeTensor:
    """A DLPack producer written with ctypes: any pointer, device, dtype, strides or version.

    `deleted` counts deleter calls; an unconsumed capsule's destructor calls the deleter, as a
    real producer's does. Keep the object alive while the capsule or its consumer may call back.
    """

    def __init__(self, data, shape, dtype=(KDL_FLOAT, 32, 1), device=(KDL_CPU, 0), strides=None,
                 versioned=True, flags=0, version=(1, 0), byte_offset=0):
        self.deleted = 0
        self.versioned = versioned
        ndim = len(shape)
        self.shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
        self.strides = (ctypes.c_int64 * max(ndim, 1))(*strides) if strides is not None else None
        self.managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
        tensor = self.managed.dl_tensor
        tensor.data = data
        tensor.device = DLDevice(*device)
        tensor.ndim = ndim
        tensor.dtype = DLDataType(*dtype)
        tensor.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        tensor.strides = (ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
                          if self.strides is not None else None)
        tensor.byte_offset = byte_offset
        self._deleter = DELETER(self._on_delete)
        self.managed.deleter = ctypes.cast(self._deleter, ctypes.c_void_p).value
        if versioned:
            self.managed.version = DLPackVersion(*version)
            self.managed.flags = flags
        self._destructor = CAPSULE_DESTRUCTOR(self._on_capsule_destroyed)
        self.address = ctypes.addressof(self.managed)

    def _on_delete(self, pointer):
        assert pointer == self.address
        self.deleted += 1

    def _on_capsule_destroyed(self, capsule_pointer):
        name = VERSIONED if self.versioned else LEGACY
        if raw_capsule_is_valid(capsule_pointer, name):
            pointer = raw_capsule_get_pointer(capsule_pointer, name)
            DELETER(self.managed.deleter)(pointer)

    def capsule(self):
        return capsule_new(self.address, VERSIONED if self.versioned else LEGACY,
                           ctypes.cast(self._destructor, ctypes.c_void_p).value)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.stream_seen = stream
        return self.capsule()

    def __dlpack_device__(self):
        tensor = self.managed.dl_tensor
        return (tensor.device.device_type, tensor.device.device_id)


@pytest.fixture
def device_memory_infos():
    """Create the process-wide memory descriptions of the fake devices used below first, so
    that no_leaks (requested after this fixture) does not count them: ortagent keeps one per
    device for the life of the process."""
    for device, index in (("cuda", 0), ("cuda", 1), ("cuda_pinned", 0)):
        OrtValue._from_pointer(0xdead0000, [1], np.float32, device, index).device_name()


def live(kind):
    return ortagent.live_handles()[kind]


# ---- dtypes -----------------------------------------------------------------------------------

# numpy dtype name -> (ONNX type string, DLPack (code, bits))
DTYPES = {
    "bool": ("tensor(bool)", (KDL_BOOL, 8)),
    "int8": ("tensor(int8)", (KDL_INT, 8)),
    "int16": ("tensor(int16)", (KDL_INT, 16)),
    "int32": ("tensor(int32)", (KDL_INT, 32)),
    "int64": ("tensor(int64)", (KDL_INT, 64)),
    "uint8": ("tensor(uint8)", (KDL_UINT, 8)),
    "uint16": ("tensor(uint16)", (KDL_UINT, 16)),
    "uint32": ("tensor(uint32)", (KDL_UINT, 32)),
    "uint64": ("tensor(uint64)", (KDL_UINT, 64)),
    "float16": ("tensor(float16)", (KDL_FLOAT, 16)),
    "float32": ("tensor(float)", (KDL_FLOAT, 32)),
    "float64": ("tensor(double)", (KDL_FLOAT, 64)),
    "bfloat16": ("tensor(bfloat16)", (KDL_BFLOAT, 16)),
}
NUMPY_DLPACK_DTYPES = sorted(set(DTYPES) - {"bfloat16"})   # NumPy has no DLPack bfloat16


def sample(dtype_name, shape=(2, 3)):
    if dtype_name == "bfloat16":
        pytest.importorskip("ml_dtypes")
    return models.random_array(dtype_name, shape, np.random.default_rng(7))


# ---- export: OrtValue -> numpy.from_dlpack -----------------------------------------------------

@pytest.mark.parametrize("dtype_name", NUMPY_DLPACK_DTYPES)
def test_numpy_views_an_ortvalue_without_copy(dtype_name, no_leaks):
    x = sample(dtype_name)
    value = OrtValue.ortvalue_from_numpy(x)
    assert value.__dlpack_device__() == (KDL_CPU, 0)
    y = np.from_dlpack(value)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.ctypes.data == x.ctypes.data == value.data_ptr()
    assert y.tobytes() == x.tobytes()
    assert y.flags.writeable


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_capsule_describes_every_dtype(dtype_name, no_leaks):
    x = sample(dtype_name, (4, 5))
    value = OrtValue.ortvalue_from_numpy(x)
    code, bits = DTYPES[dtype_name][1]
    assert capsule_facts(value.__dlpack__(max_version=(1, 0))) == dict(
        data=x.ctypes.data, device=(KDL_CPU, 0), ndim=2, dtype=(code, bits, 1), shape=[4, 5],
        strides=[5, 1], byte_offset=0, flags=0, version=(1, 0))


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_import_every_dtype_zero_copy(dtype_name, no_leaks):
    x = sample(dtype_name)
    if dtype_name == "bfloat16":
        # NumPy cannot export ml_dtypes arrays through DLPack: use a capsule from an OrtValue.
        source = OrtValue.ortvalue_from_numpy(x)
        value = ortagent.from_dlpack(source.__dlpack__(max_version=(1, 0)))
    else:
        value = ortagent.from_dlpack(x)
    assert value.data_type() == DTYPES[dtype_name][0]
    assert value.shape() == [2, 3]
    assert value.data_ptr() == x.ctypes.data
    back = value.numpy()
    assert back.dtype == x.dtype and back.tobytes() == x.tobytes()


def test_round_trip_both_ways_shares_memory_and_writes(no_leaks):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    value = ortagent.from_dlpack(x)
    y = np.from_dlpack(value)
    assert x.ctypes.data == value.data_ptr() == y.ctypes.data
    y[1, 2] = -7
    assert x[1, 2] == -7 and value.numpy()[1, 2] == -7
    x[0, 0] = 42
    assert y[0, 0] == 42
    value.numpy()[2, 3] = 9
    assert x[2, 3] == 9 and y[2, 3] == 9


def test_value_keeps_producer_alive(no_leaks):
    x = np.arange(5, dtype=np.int64)
    address = x.ctypes.data
    value = ortagent.from_dlpack(x)
    del x
    gc.collect()
    assert value.data_ptr() == address
    assert value.numpy().tolist() == [0, 1, 2, 3, 4]


def test_alternate_entry_points(no_leaks):
    x = np.ones(3, np.float32)
    for make in (ortagent.from_dlpack, OrtValue.from_dlpack):
        assert make(x).data_ptr() == x.ctypes.data


def test_ortvalue_to_ortvalue(no_leaks):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    first = OrtValue.ortvalue_from_numpy(x)
    second = ortagent.from_dlpack(first)
    assert second.data_ptr() == first.data_ptr() == x.ctypes.data
    assert second.shape() == [2, 3]
    del first
    gc.collect()
    assert second.numpy().tolist() == x.tolist()


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 5), (1, 0, 1)])
def test_zero_size_tensors(shape, no_leaks):
    x = np.zeros(shape, np.float32)
    value = ortagent.from_dlpack(x)
    assert value.shape() == list(shape)
    assert np.from_dlpack(value).shape == shape
    allocated = OrtValue.ortvalue_from_shape_and_type(list(shape), np.float32)
    # onnxruntime allocates nothing for an empty tensor: the capsule carries a NULL pointer,
    # which NumPy and ortagent both accept.
    facts = capsule_facts(allocated.__dlpack__(max_version=(1, 0)))
    assert facts["shape"] == list(shape) and facts["data"] == 0
    assert np.from_dlpack(allocated).shape == shape
    assert ortagent.from_dlpack(allocated).shape() == list(shape)


def test_scalars(no_leaks):
    x = np.array(3.5, np.float64)
    value = ortagent.from_dlpack(x)
    assert value.shape() == [] and value.data_ptr() == x.ctypes.data
    y = np.from_dlpack(value)
    assert y.shape == () and y.ctypes.data == x.ctypes.data and float(y) == 3.5
    assert capsule_facts(value.__dlpack__())["ndim"] == 0


def test_size_one_dimensions_have_free_strides(no_leaks):
    x = np.arange(4, dtype=np.float32)
    holder = HandMadeTensor(x.ctypes.data, [1, 4, 1], strides=[1000, 1, -3])
    value = ortagent.from_dlpack(holder.capsule())
    assert value.shape() == [1, 4, 1] and value.data_ptr() == x.ctypes.data
    empty = HandMadeTensor(x.ctypes.data, [2, 0, 3], strides=[7, 11, 13])
    assert ortagent.from_dlpack(empty.capsule()).shape() == [2, 0, 3]


def test_byte_offset_is_applied(no_leaks):
    x = np.arange(8, dtype=np.int32)
    holder = HandMadeTensor(x.ctypes.data, [4], dtype=(KDL_INT, 32, 1), byte_offset=16)
    value = ortagent.from_dlpack(holder.capsule())
    assert value.data_ptr() == x.ctypes.data + 16
    assert value.numpy().tolist() == [4, 5, 6, 7]


# ---- capsule flavours, flags, copies ---------------------------------------------------------

def test_legacy_and_versioned_capsules(no_leaks):
    value = OrtValue.ortvalue_from_numpy(np.ones((2, 2), np.float32))
    assert capsule_name(value.__dlpack__()) == LEGACY
    assert capsule_name(value.__dlpack__(max_version=None)) == LEGACY
    assert capsule_name(value.__dlpack__(max_version=(0, 8))) == LEGACY
    assert capsule_name(value.__dlpack__(max_version=(1, 0))) == VERSIONED
    assert capsule_name(value.__dlpack__(max_version=(1, 3))) == VERSIONED
    assert capsule_name(value.__dlpack__(max_version=(2, 0))) == VERSIONED
    facts = capsule_facts(value.__dlpack__())
    assert facts["data"] == value.data_ptr() and facts["strides"] == [2, 1]
    for bad in ("1.0", (1.0, 0), (1,), 1):
        with pytest.raises(DLPackError, match="max_version"):
            value.__dlpack__(max_version=bad)
    assert capsule_name(value.__dlpack__(max_version=[np.int64(1), 0])) == VERSIONED


def test_both_capsule_flavours_import(no_leaks):
    x = np.arange(6, dtype=np.int16)
    value = OrtValue.ortvalue_from_numpy(x)
    for capsule in (value.__dlpack__(), value.__dlpack__(max_version=(1, 0))):
        imported = ortagent.from_dlpack(capsule)
        assert imported.data_ptr() == x.ctypes.data
        assert capsule_name(capsule) in (USED_LEGACY, USED_VERSIONED)


def test_read_only_memory(no_leaks):
    x = np.arange(6, dtype=np.float32)
    x.flags.writeable = False
    value = OrtValue.ortvalue_from_numpy(x)
    assert capsule_facts(value.__dlpack__(max_version=(1, 0)))["flags"] == FLAG_READ_ONLY
    y = np.from_dlpack(value)
    assert not y.flags.writeable and y.ctypes.data == x.ctypes.data
    # A legacy capsule cannot say "read-only": a copy by default, an error when copies are banned.
    capsule = value.__dlpack__()
    assert capsule_facts(capsule)["data"] != x.ctypes.data
    assert ortagent.from_dlpack(capsule).numpy().tolist() == x.tolist()
    with pytest.raises(DLPackError, match="read-only"):
        value.__dlpack__(copy=False)
    # Importing read-only memory gives a read-only value.
    imported = ortagent.from_dlpack(x)
    assert imported.data_ptr() == x.ctypes.data
    assert not imported.numpy().flags.writeable
    assert capsule_facts(imported.__dlpack__(max_version=(1, 0)))["flags"] == FLAG_READ_ONLY


def test_writable_memory_is_writable_through_versioned_capsules(no_leaks):
    value = OrtValue.ortvalue_from_numpy(np.zeros(3, np.int32))
    assert capsule_facts(value.__dlpack__(max_version=(1, 0)))["flags"] == 0
    y = np.from_dlpack(value)
    assert y.flags.writeable
    y[0] = 5
    assert value.numpy()[0] == 5


def test_copy_true_gives_a_separate_buffer(no_leaks):
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    value = OrtValue.ortvalue_from_numpy(x)
    capsule = value.__dlpack__(max_version=(1, 0), copy=True)
    facts = capsule_facts(capsule)
    assert facts["flags"] == FLAG_IS_COPIED
    assert facts["data"] != x.ctypes.data
    copied = ortagent.from_dlpack(capsule)
    assert copied.numpy().tolist() == x.tolist()
    copied.numpy()[0, 0] = 100
    assert x[0, 0] == 0
    y = np.from_dlpack(value, copy=True)
    assert y.ctypes.data != x.ctypes.data and y.tolist() == x.tolist()
    legacy = value.__dlpack__(copy=True)
    assert capsule_facts(legacy)["data"] != x.ctypes.data
    # Empty and 0-d copies.
    assert np.from_dlpack(OrtValue.ortvalue_from_numpy(np.zeros((0, 4))), copy=True).shape == (0, 4)
    assert float(np.from_dlpack(OrtValue.ortvalue_from_numpy(np.array(2.0)), copy=True)) == 2.0


def test_copy_false_and_dl_device_on_the_cpu(no_leaks):
    x = np.ones(4, np.float32)
    value = OrtValue.ortvalue_from_numpy(x)
    assert np.from_dlpack(value, copy=False).ctypes.data == x.ctypes.data
    assert np.from_dlpack(value, device="cpu").ctypes.data == x.ctypes.data
    assert capsule_facts(value.__dlpack__(dl_device=(KDL_CPU, 0), copy=False))["data"] == x.ctypes.data
    with pytest.raises(DLPackError, match="kDLCUDA"):
        value.__dlpack__(dl_device=(KDL_CUDA, 0))
    with pytest.raises(DLPackError):
        value.__dlpack__(dl_device=(KDL_CUDA, 0), copy=True)
    with pytest.raises(BufferError):      # DLPackError is a BufferError, as the standard asks
        value.__dlpack__(dl_device=(KDL_CPU, 1))
    for bad in ("cpu", (1.0, 0), (1, 0, 0)):
        with pytest.raises(DLPackError, match="dl_device"):
            value.__dlpack__(dl_device=bad)
    import enum

    class Device(enum.IntEnum):
        CPU = 1

    assert capsule_facts(value.__dlpack__(dl_device=(Device.CPU, 0)))["data"] == x.ctypes.data
    with pytest.raises(DLPackError, match="copy"):
        value.__dlpack__(copy="yes")


def test_stream_rules_on_the_cpu(no_leaks):
    value = OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))
    value.__dlpack__(stream=None)
    value.__dlpack__(stream=-1)
    for stream in (0, 1, 2, 12345, "s", 1.0):
        with pytest.raises(DLPackError, match="stream"):
            value.__dlpack__(stream=stream)


def test_strings_and_closed_values_are_refused(no_leaks):
    strings = OrtValue.ortvalue_from_numpy(np.array(["a", "bc"], dtype=object))
    with pytest.raises(DLPackError, match="string"):
        strings.__dlpack__()
    with pytest.raises(DLPackError, match="string"):
        np.from_dlpack(strings)
    value = OrtValue.ortvalue_from_numpy(np.ones(2))
    value.close()
    with pytest.raises(ortagent.ObjectClosedError):
        value.__dlpack__()
    with pytest.raises(ortagent.ObjectClosedError):
        value.__dlpack_device__()


# ---- import errors ------------------------------------------------------------------------------

def test_consumed_capsule_is_refused(no_leaks):
    value = OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))
    for capsule in (value.__dlpack__(), value.__dlpack__(max_version=(1, 0))):
        ortagent.from_dlpack(capsule)
        with pytest.raises(DLPackError, match="already consumed"):
            ortagent.from_dlpack(capsule)


def test_non_dlpack_inputs_are_refused(no_leaks):
    with pytest.raises(ortagent.OrtInvalidType, match="__dlpack__"):
        ortagent.from_dlpack([1, 2, 3])
    other = capsule_new(ctypes.addressof(ctypes.c_int(1)), b"something_else", None)
    with pytest.raises(DLPackError, match="something_else"):
        ortagent.from_dlpack(other)
    value = OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))
    with pytest.raises(DLPackError, match="stream"):
        ortagent.from_dlpack(value.__dlpack__(), stream=1)

    class NotACapsule:
        def __dlpack__(self, **kwargs):
            return 42

    with pytest.raises(DLPackError, match="not a DLPack capsule"):
        ortagent.from_dlpack(NotACapsule())


@pytest.mark.parametrize("make", [
    lambda base: base[:, ::2],
    lambda base: base.T,
    lambda base: base[::-1],
], ids=["sliced", "transposed", "reversed"])
def test_non_contiguous_producers_are_refused(make, no_leaks):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    with pytest.raises(DLPackError, match="strides"):
        ortagent.from_dlpack(make(base))


def test_refused_capsules_stay_with_their_producer(no_leaks):
    data = np.zeros(16, np.float32)
    cases = [
        dict(dtype=(KDL_FLOAT, 32, 4)),            # 4 lanes
        dict(dtype=(KDL_FLOAT, 8, 1)),             # float with 8 bits
        dict(dtype=(KDL_BOOL, 1, 1)),              # bool must have 8 bits
        dict(dtype=(10, 8, 1)),                    # a DLPack 1.1 float8 code
        dict(dtype=(KDL_INT, 4, 1)),               # int4
        dict(device=(KDL_ROCM, 0)),
        dict(device=(KDL_VULKAN, 0)),
        dict(strides=[1, 4]),                      # column-major
        dict(version=(2, 0)),                      # a future major version
        dict(data=data.ctypes.data + 2),           # misaligned float32 elements
    ]
    for case in cases:
        args = dict(data=data.ctypes.data, shape=[4, 4])
        args.update(case)
        producer = HandMadeTensor(**args)
        capsule = producer.capsule()
        with pytest.raises(DLPackError):
            ortagent.from_dlpack(capsule)
        assert capsule_name(capsule) == VERSIONED, case     # not taken over
        assert producer.deleted == 0
        del capsule
        gc.collect()
        assert producer.deleted == 1, case                  # its own destructor cleaned up


def test_error_messages_name_the_problem(no_leaks):
    data = np.zeros(8, np.float32)
    cases = [(dict(shape=[2], dtype=(KDL_FLOAT, 32, 2)), r"kDLFloat with 32 bits and 2 lanes"),
             (dict(shape=[2], device=(KDL_ROCM, 1)), r"kDLROCM:1"),
             (dict(shape=[2, 2], strides=[1, 2]), r"strides \[1, 2\]")]
    for args, message in cases:
        producer = HandMadeTensor(data.ctypes.data, **args)
        capsule = producer.capsule()      # kept: its ctypes destructor must not run mid-raise
        with pytest.raises(DLPackError, match=message):
            ortagent.from_dlpack(capsule)
        del capsule
        assert producer.deleted == 1


def test_complex_tensors(no_leaks):
    x = np.arange(4).astype(np.complex64)
    try:
        value = ortagent.from_dlpack(x)
    except DLPackError as exc:
        # onnxruntime's C API cannot create complex tensors (1.31): refused cleanly.
        assert "complex" in str(exc).lower() or "type 14" in str(exc)
    else:
        assert value.data_ptr() == x.ctypes.data
        assert np.from_dlpack(value).tolist() == x.tolist()


def test_legacy_producers_without_max_version(no_leaks):
    x = np.arange(3, dtype=np.int64)

    class OldProducer:
        calls = []

        def __dlpack__(self, stream=None):
            self.calls.append(stream)
            return x.__dlpack__()

    producer = OldProducer()
    value = ortagent.from_dlpack(producer)
    assert value.data_ptr() == x.ctypes.data and producer.calls == [None]


def test_producer_errors_become_dlpack_errors(no_leaks):
    class Broken:
        def __dlpack__(self, **kwargs):
            raise BufferError("nope")

    with pytest.raises(DLPackError, match="nope"):
        ortagent.from_dlpack(Broken())


def test_stream_passed_to_producers(device_memory_infos, no_leaks):
    data = np.zeros(4, np.float32)
    cpu = HandMadeTensor(data.ctypes.data, [4])
    ortagent.from_dlpack(cpu, stream=7)
    assert cpu.stream_seen is None                    # host producers must get None
    cuda = HandMadeTensor(0xdead0000, [4], device=(KDL_CUDA, 0))
    value = ortagent.from_dlpack(cuda, stream=7)
    assert cuda.stream_seen == 7
    del value
    gc.collect()
    assert cuda.deleted == 1
    rocm = HandMadeTensor(0xdead0000, [4], device=(KDL_ROCM, 0))
    with pytest.raises(DLPackError, match="kDLROCM"):
        ortagent.from_dlpack(rocm, stream=7)
    assert not hasattr(rocm, "stream_seen")           # refused before asking for a capsule


# ---- ownership, leaks, threads, interpreter exit -------------------------------------------------

def test_unconsumed_capsules_are_collected_without_leaks(no_leaks):
    value = OrtValue.ortvalue_from_numpy(np.ones(1000, np.float32))
    before = live("dlpack_export")
    capsules = [value.__dlpack__(), value.__dlpack__(max_version=(1, 0)),
                value.__dlpack__(copy=True), value.__dlpack__(max_version=(1, 0), copy=True)]
    assert live("dlpack_export") == before + 4
    del capsules
    assert live("dlpack_export") == before


def test_close_waits_for_exports(no_leaks):
    x = np.arange(4, dtype=np.float32)
    value = OrtValue.ortvalue_from_numpy(x)
    values_before = live("value")
    y = np.from_dlpack(value)
    capsule = value.__dlpack__(max_version=(1, 0))
    value.close()
    with pytest.raises(ortagent.ObjectClosedError):
        value.__dlpack__()
    assert live("value") == values_before         # the handle stays while exports live
    del y
    gc.collect()
    assert live("value") == values_before
    del capsule
    assert live("value") == values_before - 1      # the last export released it


def test_imported_value_calls_the_deleter_once(no_leaks):
    x = np.arange(4, dtype=np.float32)
    producer = HandMadeTensor(x.ctypes.data, [4])
    value = ortagent.from_dlpack(producer.capsule())
    view = value.numpy()
    exported = np.from_dlpack(value)
    del value
    gc.collect()
    assert producer.deleted == 0                   # views keep the import alive
    del view
    gc.collect()
    assert producer.deleted == 0
    del exported
    gc.collect()
    assert producer.deleted == 1
    legacy = HandMadeTensor(x.ctypes.data, [2, 2], versioned=False)
    value = ortagent.from_dlpack(legacy.capsule())
    value.close()
    del value
    gc.collect()
    assert legacy.deleted == 1


def _consume_by_hand(capsule):
    """Do what a C consumer does: take the pointer, rename the capsule. Returns the struct."""
    name = capsule_name(capsule)
    pointer = capsule_get_pointer(capsule, name)
    assert capsule_set_name(capsule, USED_VERSIONED if name == VERSIONED else USED_LEGACY) == 0
    cls = DLManagedTensorVersioned if name == VERSIONED else DLManagedTensor
    return pointer, cls.from_address(pointer)


@pytest.mark.parametrize("versioned", [False, True])
def test_deleter_from_another_python_thread(versioned, no_leaks):
    value = OrtValue.ortvalue_from_numpy(np.ones(8, np.float32))
    values_before = live("value")
    exports_before = live("dlpack_export")
    capsule = value.__dlpack__(max_version=(1, 0) if versioned else None)
    pointer, managed = _consume_by_hand(capsule)
    del capsule                                   # consumed: its destructor leaves it alone
    assert live("dlpack_export") == exports_before + 1
    value.close()
    deleter = DELETER(managed.deleter)            # ctypes calls it with the GIL released
    thread = threading.Thread(target=deleter, args=(pointer,))
    thread.start()
    thread.join()
    assert live("dlpack_export") == exports_before
    assert live("value") == values_before - 1


def test_deleter_from_a_thread_python_never_saw(no_leaks):
    libc = ctypes.CDLL(None)
    value = OrtValue.ortvalue_from_numpy(np.ones(8, np.float32))
    exports_before = live("dlpack_export")
    pointer, managed = _consume_by_hand(value.__dlpack__(max_version=(1, 0)))
    # pthread_create runs the deleter (void f(void*)) as the thread's start routine; ctypes
    # releases the GIL around pthread_join, so the deleter has to take it by itself.
    thread_id = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(thread_id), None, ctypes.c_void_p(managed.deleter),
                               ctypes.c_void_p(pointer)) == 0
    assert libc.pthread_join(thread_id, None) == 0
    assert live("dlpack_export") == exports_before


def test_interpreter_exit_with_live_exports(tmp_path):
    script = textwrap.dedent("""
        import threading
        import numpy as np, ortagent
        from ortagent import OrtValue
        value = OrtValue.ortvalue_from_numpy(np.arange(10.0))
        unconsumed = [value.__dlpack__(), value.__dlpack__(max_version=(1, 0)),
                      value.__dlpack__(copy=True)]
        view = np.from_dlpack(value)
        imported = ortagent.from_dlpack(np.ones(3))
        other = OrtValue.ortvalue_from_numpy(np.arange(4))
        cycle = [other.__dlpack__(max_version=(1, 0)), other]
        cycle.append(cycle)
        value.close()
        # a thread that drops its capsule while the interpreter shuts down
        def late():
            capsule = other.__dlpack__()
            threading.Event().wait(0.2)
            del capsule
        threading.Thread(target=late, daemon=True).start()
        print("done")
    """)
    path = tmp_path / "exit_with_exports.py"
    path.write_text(script)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert result.stderr == ""


# ---- CUDA metadata on the CPU (pointers are never dereferenced) ---------------------------------

def test_cuda_value_metadata_exports(device_memory_infos, no_leaks):
    value = OrtValue._from_pointer(0xdead0000, [2, 3], np.float32, "cuda", 1)
    assert value.__dlpack_device__() == (KDL_CUDA, 1)
    expected = dict(data=0xdead0000, device=(KDL_CUDA, 1), ndim=2, dtype=(KDL_FLOAT, 32, 1),
                    shape=[2, 3], strides=[3, 1], byte_offset=0)
    assert capsule_facts(value.__dlpack__()) == expected
    assert capsule_facts(value.__dlpack__(max_version=(1, 0))) == dict(expected, flags=0,
                                                                        version=(1, 0))
    pinned = OrtValue._from_pointer(0xbeef0000, [4], np.int64, "cuda_pinned", 0)
    assert pinned.__dlpack_device__() == (KDL_CUDA_HOST, 0)
    facts = capsule_facts(pinned.__dlpack__(max_version=(1, 0)))
    assert facts["device"] == (KDL_CUDA_HOST, 0) and facts["data"] == 0xbeef0000
    assert facts["dtype"] == (KDL_INT, 64, 1)
    # Pinned memory is host memory: asking for kDLCPU describes the same bytes.
    facts = capsule_facts(pinned.__dlpack__(max_version=(1, 0), dl_device=(KDL_CPU, 0), copy=False))
    assert facts["device"] == (KDL_CPU, 0) and facts["data"] == 0xbeef0000


def test_cuda_value_stream_and_device_rules(device_memory_infos, no_leaks):
    value = OrtValue._from_pointer(0xdead0000, [2, 3], np.float32, "cuda", 1)
    for stream in (None, -1, 1, 2, 0x7f0000001000):
        assert capsule_facts(value.__dlpack__(stream=stream, max_version=(1, 0)))["data"] == 0xdead0000
    for stream in (0, -2, "1", True):
        with pytest.raises(DLPackError, match="stream"):
            value.__dlpack__(stream=stream)
    assert capsule_facts(value.__dlpack__(dl_device=(KDL_CUDA, 1)))["data"] == 0xdead0000
    with pytest.raises(DLPackError, match="kDLCUDA:0"):
        value.__dlpack__(dl_device=(KDL_CUDA, 0))
    with pytest.raises(DLPackError, match="copy=False"):
        value.__dlpack__(dl_device=(KDL_CPU, 0), copy=False)


@pytest.mark.parametrize("versioned", [False, True])
def test_cuda_capsule_import(versioned, device_memory_infos, no_leaks):
    producer = HandMadeTensor(0xdead0000, [2, 3], device=(KDL_CUDA, 0), versioned=versioned)
    capsule = producer.capsule()
    value = ortagent.from_dlpack(capsule)
    assert capsule_name(capsule) == (USED_VERSIONED if versioned else USED_LEGACY)
    del capsule
    assert value.device_name() == "cuda"
    assert value.data_ptr() == 0xdead0000
    assert value.shape() == [2, 3] and value.data_type() == "tensor(float)"
    assert value.__dlpack_device__() == (KDL_CUDA, 0)
    # Re-exported: the same device pointer.
    assert capsule_facts(value.__dlpack__(max_version=(1, 0)))["data"] == 0xdead0000
    gc.collect()
    assert producer.deleted == 0
    del value
    gc.collect()
    assert producer.deleted == 1


def test_cuda_host_capsule_import(device_memory_infos, no_leaks):
    producer = HandMadeTensor(0xbeef0000, [8], dtype=(KDL_UINT, 8, 1), device=(KDL_CUDA_HOST, 0))
    value = ortagent.from_dlpack(producer.capsule())
    assert value.device_name() == "cuda_pinned"
    assert value.data_ptr() == 0xbeef0000
    assert value.__dlpack_device__() == (KDL_CUDA_HOST, 0)
    del value
    gc.collect()
    assert producer.deleted == 1


# ---- torch ---------------------------------------------------------------------------------------

try:
    import ml_dtypes  # noqa: F401
    HAVE_ML_DTYPES = True
except ImportError:
    HAVE_ML_DTYPES = False

TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                "float16", "bfloat16", "float32", "float64"]


def torch_sample(torch, name, shape=(3, 4)):
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"this torch has no {name}")
    generator = torch.Generator().manual_seed(3)
    if name == "bool":
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(0, 100, shape, generator=generator).to(dtype)


@pytest.mark.torch
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_round_trip(name, no_leaks):
    import torch

    t = torch_sample(torch, name)
    value = ortagent.from_dlpack(t)
    assert value.data_ptr() == t.data_ptr()
    assert value.shape() == [3, 4]
    back = torch.from_dlpack(value)
    assert back.dtype == t.dtype and back.data_ptr() == t.data_ptr()
    assert torch.equal(back, t)
    # writes are visible on every side
    one = torch.ones((), dtype=t.dtype)
    back[1, 2] = one
    assert t[1, 2] == one
    t[0, 0] = one
    assert back[0, 0] == one
    if name != "bfloat16" or HAVE_ML_DTYPES:
        assert value.numpy()[0, 0] == value.numpy().dtype.type(1)


@pytest.mark.torch
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_views_an_ortvalue(name, no_leaks):
    import torch

    if name == "bfloat16":
        pytest.importorskip("ml_dtypes")
    if name in ("uint16", "uint32", "uint64") and getattr(torch, name, None) is None:
        pytest.skip(f"this torch has no {name}")
    x = sample(name, (2, 5))
    value = OrtValue.ortvalue_from_numpy(x)
    t = torch.from_dlpack(value)
    assert t.data_ptr() == x.ctypes.data and list(t.shape) == [2, 5]
    assert t.dtype == getattr(torch, name)
    assert t.contiguous().view(torch.uint8).numpy().tobytes() == x.tobytes()
    del value
    gc.collect()
    assert t.view(torch.uint8).numpy().tobytes() == x.tobytes()   # the tensor keeps it alive


@pytest.mark.torch
def test_torch_layouts_and_errors(no_leaks):
    import torch

    base = torch.arange(12.0).reshape(3, 4)
    with pytest.raises(DLPackError, match="strides"):
        ortagent.from_dlpack(base.t())
    with pytest.raises(DLPackError, match="gradient"):
        ortagent.from_dlpack(torch.ones(3, requires_grad=True))
    scalar = torch.tensor(5, dtype=torch.int64)
    assert ortagent.from_dlpack(scalar).shape() == []
    empty = torch.zeros((0, 3))
    assert ortagent.from_dlpack(empty).shape() == [0, 3]
    assert torch.from_dlpack(OrtValue.ortvalue_from_shape_and_type([0, 3], np.float32)).shape == (0, 3)
    expanded = torch.ones(1, 4).expand(3, 4)             # stride 0: not contiguous
    with pytest.raises(DLPackError, match="strides"):
        ortagent.from_dlpack(expanded)


@pytest.mark.torch
def test_torch_tensor_outlives_everything(no_leaks):
    import torch

    x = np.arange(6, dtype=np.float32)
    value = OrtValue.ortvalue_from_numpy(x)
    t = torch.from_dlpack(value)
    value.close()
    del value, x
    gc.collect()
    assert t.tolist() == [0, 1, 2, 3, 4, 5]
    exports = live("dlpack_export")
    del t
    gc.collect()
    assert live("dlpack_export") == exports - 1


# ---- real CUDA ---------------------------------------------------------------------------------

def _torch_cuda():
    torch = pytest.importorskip("torch", reason="the CUDA DLPack tests use torch's CUDA tensors")
    if not torch.cuda.is_available():
        pytest.skip("torch cannot use CUDA here")
    return torch


@pytest.mark.cuda
def test_cuda_torch_through_a_session_and_back(no_leaks):
    torch = _torch_cuda()
    shape = (16,)
    a = torch.randn(shape, device="cuda")
    b = torch.randn(shape, device="cuda")
    torch.cuda.current_stream().synchronize()      # ORT computes on its own stream
    session = ortagent.InferenceSession(models.add(shape).SerializeToString(),
                                        providers=["CUDAExecutionProvider"])
    va, vb = ortagent.from_dlpack(a), ortagent.from_dlpack(b)
    assert va.device_name() == "cuda" and va.data_ptr() == a.data_ptr()
    assert va.__dlpack_device__() == (KDL_CUDA, a.device.index or 0)
    (out,) = session.run_with_ort_values(["c"], {"a": va, "b": vb})
    assert out.device_name() == "cuda"
    result = torch.from_dlpack(out)
    assert result.device.type == "cuda" and result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(result, a + b)
    identity = ortagent.InferenceSession(models.identity(shape=shape).SerializeToString(),
                                         providers=["CUDAExecutionProvider"])
    (same,) = identity.run_with_ort_values(["y"], {"x": va})
    torch.testing.assert_close(torch.from_dlpack(same), a)


@pytest.mark.cuda
def test_cuda_torch_zero_copy_both_ways(no_leaks):
    torch = _torch_cuda()
    t = torch.arange(8, dtype=torch.float32, device="cuda")
    value = ortagent.from_dlpack(t)
    back = torch.from_dlpack(value)
    assert back.data_ptr() == t.data_ptr() == value.data_ptr()
    back[3] = -1
    torch.cuda.synchronize()
    assert t[3].item() == -1
    capsule = value.__dlpack__(max_version=(1, 0), stream=torch.cuda.current_stream().cuda_stream)
    assert capsule_facts(capsule)["device"] == (KDL_CUDA, t.device.index or 0)
    host = np.from_dlpack(value, device="cpu")
    assert host.tolist() == t.cpu().tolist()


@pytest.mark.cuda
def test_cuda_cupy_round_trip(no_leaks):
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    x = cupy.arange(10, dtype=cupy.float32)
    cupy.cuda.get_current_stream().synchronize()
    value = ortagent.from_dlpack(x)
    assert value.device_name() == "cuda" and value.data_ptr() == x.data.ptr
    y = cupy.from_dlpack(value)
    assert y.data.ptr == x.data.ptr
    assert cupy.asnumpy(y).tolist() == list(range(10))
