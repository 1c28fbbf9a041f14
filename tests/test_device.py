"""Device descriptions and device-resident values. The metadata tests run everywhere (no
device memory is touched); the `cuda` ones need a CUDA execution provider and skip with the
reason otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from ortagent_testkit import onnx_models as models
import ortagent
from ortagent import OrtDevice, OrtValue


@pytest.mark.parametrize("spelling, expected", [
    ("cpu", "OrtDevice('cpu')"), ("CPU", "OrtDevice('cpu')"), ("cuda", "OrtDevice('cuda:0')"),
    ("cuda:3", "OrtDevice('cuda:3')"), ("gpu:1", "OrtDevice('cuda:1')"),
    ("cuda_pinned", "OrtDevice('cuda_pinned')"),
])
def test_device_spellings(spelling, expected):
    assert repr(OrtDevice.parse(spelling)) == expected


def test_device_from_onnxruntime_style_constructor_and_objects():
    cuda1 = OrtDevice(OrtDevice.cuda(), OrtDevice.default_memory(), 1)
    assert (cuda1.device_type(), cuda1.mem_type(), cuda1.device_id()) == (1, 0, 1)
    assert OrtDevice.parse(cuda1) is cuda1
    pinned = OrtDevice(OrtDevice.cpu(), OrtDevice.cuda_pinned_memory(), 0)
    assert pinned.name == "cuda_pinned"

    class LooksLikeOnnxruntimeDevice:
        def device_type(self):
            return 1

        def device_id(self):
            return 2

    assert OrtDevice.parse(LooksLikeOnnxruntimeDevice()) == OrtDevice.parse("cuda:2")


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cpu:1", 3.5, None.__class__])
def test_bad_device_spellings(bad):
    with pytest.raises(ortagent.OrtError):
        OrtDevice.parse(bad)


def test_bad_device_numbers():
    with pytest.raises(ortagent.OrtInvalidArgument):
        OrtDevice(7, 0, 0)
    with pytest.raises(ortagent.OrtInvalidArgument):
        OrtDevice(1, 0, -1)


def test_value_over_cuda_memory_reports_its_device_without_touching_it():
    value = OrtValue._from_pointer(0xDEAD0000, [2, 3], np.float32, "cuda", 1)
    assert value.device_name() == "cuda"
    assert value.device() == OrtDevice.parse("cuda:1")
    assert value.data_ptr() == 0xDEAD0000
    assert value.shape() == [2, 3] and value.data_type() == "tensor(float)"
    pinned = OrtValue._from_pointer(0xBEEF0000, [4], "tensor(float16)", "cuda_pinned")
    assert pinned.device_name() == "cuda_pinned"


@pytest.mark.cuda
def test_cuda_values_round_trip_through_device_memory():
    for dtype in (np.float32, np.float16, np.int64, np.bool_, np.uint8):
        x = models.random_array(np.dtype(dtype).name, (3, 5), np.random.default_rng(0))
        value = OrtValue.ortvalue_from_numpy(x, "cuda", 0)
        assert value.device_name() == "cuda" and value.shape() == [3, 5]
        np.testing.assert_array_equal(value.numpy(), x)
        empty = OrtValue.ortvalue_from_shape_and_type([2, 2], dtype, "cuda", 0)
        empty.update_inplace(x[:2, :2].copy())
        np.testing.assert_array_equal(empty.numpy(), x[:2, :2])


@pytest.mark.cuda
def test_pinned_values_are_host_views():
    value = OrtValue.ortvalue_from_shape_and_type([8], np.float32, "cuda_pinned", 0)
    view = value.numpy()
    view[:] = 3
    assert value.numpy().ctypes.data == value.data_ptr()
    np.testing.assert_array_equal(value.numpy(), np.full(8, 3, np.float32))


@pytest.mark.cuda
def test_run_on_cuda_provider_matches_cpu(ort_ref):
    model = models.mlp()
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    cuda = ortagent.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert cuda.get_providers()[0] == "CUDAExecutionProvider"
    assert cuda.get_provider_options()["CUDAExecutionProvider"]["device_id"] == "0"
    expected = ortagent.InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(cuda.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_iobinding_with_device_outputs_and_inputs():
    model = models.mlp()
    session = ortagent.InferenceSession(model, providers=["CUDAExecutionProvider"])
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    expected = ortagent.InferenceSession(model).run(None, {"x": x})[0]
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", OrtValue.ortvalue_from_numpy(x, "cuda", 0))
    binding.bind_output("y", "cuda", 0)
    session.run_with_iobinding(binding)
    (first,) = binding.get_outputs()
    assert first.device_name() == "cuda"
    np.testing.assert_allclose(first.numpy(), expected, rtol=1e-5, atol=1e-5)
    binding.bind_ortvalue_input("x", OrtValue.ortvalue_from_numpy(-x, "cuda", 0))
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(first.numpy(), expected, rtol=1e-5, atol=1e-5)   # not overwritten
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0],
                               ortagent.InferenceSession(model).run(None, {"x": -x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_unsynchronized_runs_still_hand_out_complete_outputs():
    model = models.mlp(sizes=(16, 256, 256, 8))
    session = ortagent.InferenceSession(model, providers=["CUDAExecutionProvider"])
    ro = ortagent.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    x = np.random.default_rng(4).standard_normal((64, 16)).astype(np.float32)
    expected = ortagent.InferenceSession(model).run(None, {"x": x})[0]
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cuda", 0)
    for _ in range(5):
        session.run_with_iobinding(binding, ro)
        np.testing.assert_allclose(binding.get_outputs()[0].numpy(), expected, rtol=1e-4, atol=1e-4)
