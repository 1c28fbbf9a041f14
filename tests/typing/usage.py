"""Typical use of ortagent's public API, type-checked with `mypy --strict` by tests/test_typing.py
(not run: it only has to type-check)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import ortagent
from ortagent import (
    InferenceSession,
    IOBinding,
    OrtDevice,
    OrtValue,
    PartialGraphExecutionState,
    RunOptions,
    SessionOptions,
    TrainingAgent,
)


def infer(model: bytes, x: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    options = SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ortagent.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names: list[str] = [arg.name for arg in session.get_inputs()]
    run_options = RunOptions()
    run_options.logid = "typed"
    outputs = session.run(None, {names[0]: x}, run_options)
    values: list[OrtValue] = session.run_with_ort_values(None, {names[0]: x})
    shape: list[int] = values[0].shape()
    assert shape
    return outputs


def bind(session: InferenceSession, x: npt.NDArray[np.float32]) -> list[OrtValue]:
    binding: IOBinding = session.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cpu", 0)
    session.run_with_iobinding(binding)
    return binding.get_outputs()


def values_and_devices(a: npt.NDArray[np.float64]) -> tuple[int, int]:
    value = OrtValue.ortvalue_from_numpy(a)
    device: OrtDevice = value.device()
    assert device.name == "cpu"
    view: npt.NDArray[np.float64] = value.numpy()
    assert view.shape == a.shape
    again: OrtValue = ortagent.from_dlpack(a)
    return again.__dlpack_device__()


def train(model: bytes, feeds: list[OrtValue], gradient: OrtValue) -> list[OrtValue]:
    agent = TrainingAgent(model)
    state = PartialGraphExecutionState()
    outputs: list[OrtValue] = []
    agent.run_forward(feeds, outputs, state)
    gradients: list[OrtValue] = []
    agent.run_backward([gradient], gradients, state)
    binding = agent.io_binding()
    binding.bind_ortvalue_input("x", feeds[0])
    module_outputs, run_id = agent.run_forward(binding, None)
    agent.run_backward([gradient], run_id)
    agent.close()
    return gradients + module_outputs + binding.get_outputs()


def errors() -> str:
    try:
        ortagent.get_version_string()
    except ortagent.OrtLoadError as exc:
        return str(exc.code)
    except ortagent.OrtError as exc:
        return exc.message
    return ortagent.__version__


def devices_and_compiling(model: bytes) -> bytes:
    cpu = [d for d in ortagent.get_ep_devices() if d.device.type == ortagent.OrtHardwareDeviceType.CPU]
    names: list[str] = [d.ep_name for d in cpu]
    metadata: dict[str, str] = cpu[0].ep_metadata
    options = ortagent.SessionOptions()
    options.add_provider_for_devices(cpu, {})
    options.set_provider_selection_policy(ortagent.OrtExecutionProviderDevicePolicy.PREFER_CPU)
    has: bool = options.has_providers()
    session = ortagent.InferenceSession(model, options)
    inputs = session.get_input_epdevices()
    info = ortagent.OrtMemoryInfo.create_v2("Cpu", ortagent.OrtMemoryInfoDeviceType.CPU, 0, 0,
                                            ortagent.OrtDeviceMemoryType.DEFAULT, 0,
                                            ortagent.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
    vendor: int = info.device_vendor_id
    compiler = ortagent.ModelCompiler(options, model, flags=ortagent.OrtCompileApiFlags.NONE)
    chunks: list[bytes] = []
    compiler.compile_to_stream(chunks.append)
    return compiler.compile_to_bytes() + str((names, metadata, has, inputs, vendor)).encode()


def adapter(path: str, weights: npt.NDArray[np.float32]) -> dict[str, OrtValue]:
    writer = ortagent.AdapterFormat()
    writer.set_adapter_version(1)
    writer.set_model_version(2)
    writer.set_parameters({"w": OrtValue.ortvalue_from_numpy(weights)})
    writer.export_adapter(path)
    reader = ortagent.AdapterFormat.read_adapter(path)
    version: int = reader.get_format_version() + reader.get_adapter_version() + reader.get_model_version()
    assert version
    return reader.get_parameters()
