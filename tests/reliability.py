"""Shared pieces of the reliability tests (bad input, fuzzing, leaks, threads, shutdown).

* :class:`World`: long-lived objects the checks run against (sessions on small models, a
  TrainingAgent in each API form) and :meth:`World.check_healthy`, a set of valid calls whose
  results are compared with NumPy -- what "the process is still healthy" means here;
* :func:`live` / :func:`settled`: the live-handle counters, with a garbage collection only when
  they differ from what is expected (a full collection per check would dominate the run time);
* :class:`Producer`: a DLPack producer written with ctypes that can describe any tensor --
  devices, dtypes, strides, versions and pointers no real library would hand out -- and counts
  the calls of its deleter; :func:`rss_bytes`: resident memory from /proc/self/statm.
"""

from __future__ import annotations

import ctypes
import gc
import os

import numpy as np

from ortagent_testkit import onnx_models as models
import ortagent
from ortagent_testkit import training_graphs as tg

# AddressSanitizer in this process (make asan preloads it): its allocator aborts on allocations
# it cannot serve instead of failing them, so checks that ask for petabytes skip under it.
UNDER_ASAN = hasattr(ctypes.CDLL(None), "__asan_init")

# ---- live handles -----------------------------------------------------------------------------


def live() -> dict[str, int]:
    return ortagent.live_handles()


def settled(expected: dict[str, int]) -> dict[str, int]:
    """The counters, after a garbage collection if they differ from `expected` (objects in
    reference cycles are freed only by the collector)."""
    now = live()
    if now != expected:
        gc.collect()
        now = live()
    return now


def changed(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {kind: after[kind] - before[kind] for kind in before if after[kind] != before[kind]}


def rss_bytes() -> int:
    """Resident set size of this process (second field of /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---- the objects checks run against ----------------------------------------------------------

STATE7_NAMES = (["x", "w", "bias"], ["out"], ["cpu"], ["out_grad"], ["x_grad", "w_grad", "bias_grad"],
                ["cpu"] * 3)
KW1192_NAMES = dict(fw_feed_names=["x", "w", "bias"], fw_outputs_device_info=["cpu"],
                    bw_fetches_names=["x_grad", "w_grad", "bias_grad"], bw_outputs_device_info=["cpu"] * 3)
F64 = dict(rtol=1e-12, atol=1e-12)


class World:
    """Sessions and agents shared by many checks. ``add``: c = a + b over float32[3];
    ``strings``: string Identity/Concat; ``overridable``: y = x * scale (scale overridable);
    ``agent_state7``, ``agent_kw1192``, ``agent_run_id``: the mul_add training graph
    (out = x * w + bias, float64) in the three constructor forms."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(1234)
        self.add = ortagent.InferenceSession(models.add(shape=(3,)))
        self.strings = ortagent.InferenceSession(models.strings())
        self.overridable = ortagent.InferenceSession(models.overridable_initializer())
        self.case = tg.mul_add_case()
        self.training_model = self.case.model.SerializeToString()
        self.agent_state7 = ortagent.TrainingAgent(self.training_model, *STATE7_NAMES)
        self.agent_kw1192 = ortagent.TrainingAgent(self.training_model, **KW1192_NAMES)
        self.agent_run_id = ortagent.TrainingAgent(self.training_model)
        # Process-wide memory descriptions that some checks create on first use: made now, so
        # that they are part of every baseline (ortagent keeps one per device for good).
        for device, index in (("cuda", 0), ("cuda", 1), ("cuda_pinned", 0)):
            ortagent.OrtValue._from_pointer(0x1000, [1], np.float32, device, index).device_name()
        self.check_healthy()

    # -- valid calls -----------------------------------------------------------------------------

    def floats(self, shape=(3,), dtype=np.float32) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(dtype)

    def training_feeds(self) -> dict[str, np.ndarray]:
        return self.case.make_feeds(self.rng)

    def check_session(self) -> None:
        a, b = self.floats(), self.floats()
        (c,) = self.add.run(None, {"a": a, "b": b})
        np.testing.assert_array_equal(c, a + b)
        (c_value,) = self.add.run_with_ort_values(["c"], {"a": ortagent.OrtValue.ortvalue_from_numpy(a), "b": b})
        np.testing.assert_array_equal(c_value.numpy(), a + b)
        words = np.array(["x", "yz"], dtype=object)
        same, _ = self.strings.run(None, {"s": words, "lens": np.array([2], np.int64)})
        assert same.tolist() == ["x", "yz"]

    def check_options(self) -> None:
        options = ortagent.SessionOptions()
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.use_env_allocators", "0")
        run_options = ortagent.RunOptions()
        run_options.logid = "healthy"
        session = ortagent.InferenceSession(models.add(shape=(3,)), options)
        a = self.floats()
        np.testing.assert_array_equal(session.run(None, {"a": a, "b": a}, run_options)[0], a + a)

    def check_values(self) -> None:
        for dtype in (np.float32, np.int64, np.bool_, np.float16):
            array = self.rng.integers(0, 2, size=(2, 3)).astype(dtype)
            value = ortagent.OrtValue.ortvalue_from_numpy(array)
            assert value.data_ptr() == array.ctypes.data
            np.testing.assert_array_equal(value.numpy(), array)
        fresh = ortagent.OrtValue.ortvalue_from_shape_and_type([2, 2], np.float64)
        fresh.update_inplace(np.eye(2))
        np.testing.assert_array_equal(fresh.numpy(), np.eye(2))
        text = ortagent.OrtValue.ortvalue_from_numpy(np.array(["a", "b"], dtype=object))
        assert text.numpy().tolist() == ["a", "b"]

    def check_iobinding(self) -> None:
        binding = self.add.io_binding()
        a, b = self.floats(), self.floats()
        binding.bind_cpu_input("a", a)
        binding.bind_ortvalue_input("b", ortagent.OrtValue.ortvalue_from_numpy(b))
        binding.bind_output("c")
        self.add.run_with_iobinding(binding)
        np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], a + b)
        binding.close()

    def check_dlpack(self) -> None:
        array = self.floats((2, 3))
        value = ortagent.from_dlpack(array)
        assert value.data_ptr() == array.ctypes.data
        back = np.from_dlpack(value)
        np.testing.assert_array_equal(back, array)
        assert back.ctypes.data == array.ctypes.data

    def check_agents(self) -> None:
        feeds = self.training_feeds()
        grad = self.rng.standard_normal((2, 3))
        want_out = self.case.reference(feeds)[0]
        want = self.case.reference_gradients(feeds, [grad])
        values = [ortagent.OrtValue.ortvalue_from_numpy(feeds[n]) for n in ("x", "w", "bias")]
        for agent in (self.agent_state7, self.agent_kw1192):
            state = ortagent.PartialGraphExecutionState()
            outputs: list = []
            agent.run_forward(values, outputs, state)
            np.testing.assert_allclose(outputs[0].numpy(), want_out, **F64)
            gradients: list = []
            agent.run_backward([ortagent.OrtValue.ortvalue_from_numpy(grad)], gradients, state)
            for got, expected in zip(gradients, want):
                np.testing.assert_allclose(got.numpy(), expected, **F64)
        agent = self.agent_run_id
        binding = agent.io_binding()
        for name in ("x", "w", "bias"):
            binding.bind_cpu_input(name, feeds[name])
        (out,), run_id = agent.run_forward(binding, None)
        np.testing.assert_allclose(out.numpy(), want_out, **F64)
        agent.run_backward([grad], run_id)
        for got, expected in zip(binding.get_outputs(), want):
            np.testing.assert_allclose(got.numpy(), expected, **F64)
        assert agent.runs_in_flight == 0

    def check_healthy(self, areas=("session", "options", "values", "iobinding", "dlpack", "agents")) -> None:
        for area in areas:
            getattr(self, f"check_{area}")()


# ---- a DLPack producer that can describe anything -------------------------------------------

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_OPENCL, KDL_VULKAN, KDL_ROCM = 1, 2, 3, 4, 7, 10
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_OPAQUE, KDL_BFLOAT, KDL_COMPLEX, KDL_BOOL = 0, 1, 2, 3, 4, 5, 6


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_NAMES = {True: b"dltensor_versioned", False: b"dltensor"}


def foreign_capsule(name: bytes = b"not_dlpack"):
    """A PyCapsule that is not DLPack's (it points at a static int)."""
    return _new_capsule(ctypes.addressof(_STATIC_INT), name, None)


_STATIC_INT = ctypes.c_int(7)


class Producer:
    """Describes `data` (an address) as a DLPack tensor exactly as told. ``deleted`` counts the
    deleter calls: one when a consumer releases the tensor, or when an unconsumed capsule is
    collected (its destructor calls the deleter, as real producers' capsules do). Keep the
    producer alive while a capsule or a consumer may still call back."""

    def __init__(self, data: int, shape, dtype=(KDL_FLOAT, 32, 1), device=(KDL_CPU, 0), strides=None,
                 versioned=True, flags=0, version=(1, 0), byte_offset=0, ndim=None, null_shape=False):
        self.deleted = 0
        self.versioned = versioned
        count = max(len(shape), 1)
        self._shape = (ctypes.c_int64 * count)(*shape)
        self._strides = (ctypes.c_int64 * count)(*strides) if strides is not None else None
        self._managed = _ManagedVersioned() if versioned else _Managed()
        tensor = self._managed.dl_tensor
        tensor.data = data
        tensor.device = _Device(*device)
        tensor.ndim = len(shape) if ndim is None else ndim
        tensor.dtype = _DataType(*dtype)
        tensor.shape = None if null_shape else ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        tensor.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if strides is not None else None
        tensor.byte_offset = byte_offset
        if versioned:
            self._managed.version = _Version(*version)
            self._managed.flags = flags
        self._deleter = _DELETER(self._on_delete)
        self._managed.deleter = ctypes.cast(self._deleter, ctypes.c_void_p).value
        self._destructor = _DESTRUCTOR(self._on_capsule_freed)
        self.address = ctypes.addressof(self._managed)

    def _on_delete(self, pointer):
        if pointer == self.address:
            self.deleted += 1

    def _on_capsule_freed(self, capsule):
        name = _NAMES[self.versioned]
        if _capsule_is_valid(capsule, name):          # not consumed: the tensor is still ours
            _DELETER(self._managed.deleter)(_capsule_pointer(capsule, name))

    def capsule(self):
        return _new_capsule(self.address, _NAMES[self.versioned],
                            ctypes.cast(self._destructor, ctypes.c_void_p).value)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.capsule()

    def __dlpack_device__(self):
        device = self._managed.dl_tensor.device
        return (device.device_type, device.device_id)
