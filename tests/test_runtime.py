"""Loading the runtime: lookup order, version floor and negotiation, refusal of newer slots,
clear errors when nothing usable is installed, and a cheap `import ortagent`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import ortagent
import runtimes
from conftest import REPO_ROOT, api_newest


def run_python(code: str, env_updates: dict | None = None, remove=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for key in remove:
        env.pop(key, None)
    env.update(env_updates or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)


def test_import_is_cheap_and_imports_neither_numpy_nor_onnxruntime():
    result = run_python("""
        import sys, ortagent
        print(sorted(m for m in ('numpy', 'onnxruntime', 'onnx', 'ortagent._runtime') if m in sys.modules))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_runtime_found_from_the_installed_wheel_without_importing_it():
    result = run_python("""
        import sys, ortagent
        print(ortagent.library_path() is None)
        print(ortagent.get_version_string())
        print(ortagent.library_path())
        print('onnxruntime' in sys.modules)
    """, remove=("ORTAGENT_ORT_LIBRARY",))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "True"
    assert "onnxruntime" in lines[2] and "capi" in lines[2] and "libonnxruntime.so" in lines[2]
    assert lines[3] == "False"


def test_version_build_info_providers_and_api_version():
    version = ortagent.get_version_string()
    major, minor = (int(part) for part in version.split(".")[:2])
    assert major == 1 and minor >= 20
    assert ortagent.api_version() == min(minor, api_newest())
    assert "CPUExecutionProvider" in ortagent.get_available_providers()
    assert ortagent.get_build_info()


def test_explicit_library_that_does_not_exist_is_a_clear_error():
    result = run_python("""
        import ortagent
        try:
            ortagent.get_version_string()
        except ortagent.OrtLoadError as exc:
            print(type(exc).__mro__[1].__name__, isinstance(exc, ImportError), exc.code)
            print(exc)
    """, {"ORTAGENT_ORT_LIBRARY": "/nonexistent/libonnxruntime.so.1.99.0"})
    assert result.returncode == 0, result.stderr
    assert "OrtError True None" in result.stdout
    assert "ORTAGENT_ORT_LIBRARY" in result.stdout and "/nonexistent/libonnxruntime.so.1.99.0" in result.stdout


def test_library_that_is_not_onnxruntime_is_rejected():
    import ctypes.util

    libm = ctypes.util.find_library("m") or "libm.so.6"
    result = run_python("""
        import ortagent
        try:
            ortagent.InferenceSession(b'')
        except ortagent.OrtLoadError as exc:
            print(exc)
    """, {"ORTAGENT_ORT_LIBRARY": libm})
    assert "no symbol OrtGetApiBase" in result.stdout, result.stdout + result.stderr


def test_no_onnxruntime_installed_says_what_to_install():
    # Hide the wheel from the import system; the system soname is not installed here either.
    result = run_python("""
        import sys
        sys.modules['onnxruntime'] = None
        import ortagent
        try:
            ortagent.SessionOptions()
        except ortagent.OrtLoadError as exc:
            print('ERROR', exc)
        else:
            print('LOADED', ortagent.library_path())
    """, remove=("ORTAGENT_ORT_LIBRARY",))
    assert result.returncode == 0, result.stderr
    if result.stdout.startswith("LOADED"):
        pytest.skip(f"this machine has a system onnxruntime ({result.stdout.split()[1]})")
    assert "libonnxruntime.so.1" in result.stdout
    assert "pip install ortagent[cpu]" in result.stdout and "ortagent[gpu]" in result.stdout


def _library_or_skip(version):
    path = runtimes.runtime_library(version)
    if path is None:
        pytest.skip(f"onnxruntime {version}'s library cannot be fetched here: "
                    f"{runtimes.last_failure.get(version)}")
    return path


def test_runtime_older_than_the_floor_is_refused():
    path = _library_or_skip("1.19.2")
    result = run_python("""
        import ortagent
        try:
            ortagent.get_version_string()
        except ortagent.OrtLoadError as exc:
            print(exc)
    """, {"ORTAGENT_ORT_LIBRARY": path})
    assert "onnxruntime 1.19.2" in result.stdout and "too old" in result.stdout
    assert ">= 1.20" in result.stdout, result.stdout + result.stderr


def test_floor_runtime_works_and_newer_slots_are_refused_with_the_version_needed():
    path = _library_or_skip("1.20.1")
    result = run_python("""
        import json, numpy as np, ortagent
        from onnx import TensorProto, helper
        graph = helper.make_graph([helper.make_node('Add', ['a', 'b'], ['c'])], 'g',
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in 'ab'],
            [helper.make_tensor_value_info('c', TensorProto.FLOAT, [2])])
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid('', 17)])
        session = ortagent.InferenceSession(model.SerializeToString())
        runs = [session.run(None, {'a': np.full(2, i, np.float32), 'b': np.ones(2, np.float32)})[0]
                for i in range(3)]
        out = runs[1]
        # shapes read the pre-1.24 way (an OrtTensorTypeAndShapeInfo), ranks 0 to 10
        graph = helper.make_graph(
            [helper.make_node('Identity', ['x'], ['y']), helper.make_node('Identity', ['s'], ['t'])],
            'h', [helper.make_tensor_value_info('x', TensorProto.INT16, [2] * 10),
                  helper.make_tensor_value_info('s', TensorProto.DOUBLE, [])],
            [helper.make_tensor_value_info('y', TensorProto.INT16, [2] * 10),
             helper.make_tensor_value_info('t', TensorProto.DOUBLE, [])])
        high = ortagent.InferenceSession(helper.make_model(
            graph, ir_version=10, opset_imports=[helper.make_opsetid('', 17)]).SerializeToString())
        x = np.arange(1024, dtype=np.int16).reshape((2,) * 10)
        shapes = [[list(o.shape) for o in high.run(None, {'x': x, 's': np.array(2.5)})] for _ in range(3)]
        y, t = high.run(None, {'x': x, 's': np.array(2.5)})
        src = ortagent.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))
        dst = ortagent.OrtValue.ortvalue_from_shape_and_type([2], np.float32)
        try:
            ortagent.copy_tensors([src], [dst])
            refusal = None
        except ortagent.OrtNotImplemented as exc:
            refusal = str(exc)
        print(json.dumps({'version': ortagent.get_version_string(), 'api': ortagent.api_version(),
                          'out': out.tolist(), 'refusal': refusal,
                          'preallocated': [r.base is None for r in runs],
                          'runs': [r.tolist() for r in runs], 'shapes': shapes,
                          'high_equal': bool((y == x).all()), 't': float(t)}))
    """, {"ORTAGENT_ORT_LIBRARY": path})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["version"] == "1.20.1" and report["api"] == 20
    assert report["out"] == [2.0, 2.0]
    assert report["runs"] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert report["preallocated"] == [False, True, True]
    assert report["shapes"] == [[[2] * 10, []]] * 3
    assert report["high_equal"] and report["t"] == 2.5
    assert report["refusal"] is not None
    assert "CopyTensors" in report["refusal"] and ">= 1.23" in report["refusal"]
    assert "1.20.1" in report["refusal"]


def test_log_severity_is_validated_and_settable():
    with pytest.raises(ortagent.OrtInvalidArgument):
        ortagent.set_default_logger_severity(7)
    previous = ortagent.get_default_logger_severity()
    ortagent.set_default_logger_severity(3)
    try:
        assert ortagent.get_default_logger_severity() == 3
    finally:
        ortagent.set_default_logger_severity(previous)


def test_error_hierarchy_maps_codes_to_builtin_bases():
    from ortagent import errors

    assert issubclass(errors.OrtInvalidArgument, ValueError)
    assert issubclass(errors.OrtNoSuchFile, FileNotFoundError)
    assert issubclass(errors.OrtNotImplemented, NotImplementedError)
    assert issubclass(errors.OrtFail, RuntimeError)
    assert issubclass(errors.OrtInvalidType, TypeError)
    assert issubclass(errors.DLPackError, BufferError)
    for code in range(1, 15):
        cls = errors.error_class_for_code(code)
        assert cls(f"m{code}").code == code
    exc = errors.OrtNoSuchFile("missing.onnx")
    assert str(exc) == "missing.onnx" and exc.code == errors.ORT_NO_SUCHFILE


def test_device_and_compile_api_refused_on_the_floor_runtime():
    """On onnxruntime 1.20 the device API (1.22), the compile table (1.22) and the 1.23 calls
    raise OrtNotImplemented naming the version they need; nothing calls past the old table."""
    path = _library_or_skip("1.20.1")
    result = run_python("""
        import json, ortagent
        from onnx import TensorProto, helper
        graph = helper.make_graph([helper.make_node('Identity', ['x'], ['y'])], 'g',
            [helper.make_tensor_value_info('x', TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info('y', TensorProto.FLOAT, [2])])
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid('', 17)])
        session = ortagent.InferenceSession(model.SerializeToString())
        calls = {
            'get_ep_devices': ortagent.get_ep_devices,
            'policy': lambda: ortagent.SessionOptions().set_provider_selection_policy(1),
            'register': lambda: ortagent.register_execution_provider_library('x', '/x.so'),
            'compile': lambda: ortagent.ModelCompiler(ortagent.SessionOptions(),
                                                      model.SerializeToString()).compile_to_bytes(),
            'create_v2': lambda: ortagent.OrtMemoryInfo.create_v2('Cpu', 0, 0, 0, 0, 0, 0),
            'input_epdevices': session.get_input_epdevices,
        }
        report = {}
        for name, call in calls.items():
            try:
                call()
                report[name] = None
            except ortagent.OrtNotImplemented as exc:
                report[name] = str(exc)
        info = ortagent.OrtMemoryInfo('CudaPinned', 0, 0, -1)
        report['fallback'] = [int(info.device_mem_type), info.device_vendor_id]
        report['live'] = ortagent.live_handles()['compile_options']
        print(json.dumps(report))
    """, {"ORTAGENT_ORT_LIBRARY": path})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for name, slot, version in [("get_ep_devices", "OrtApi::GetEpDevices", "1.22"),
                                ("policy", "OrtApi::SessionOptionsSetEpSelectionPolicy", "1.22"),
                                ("register", "OrtApi::RegisterExecutionProviderLibrary", "1.22"),
                                ("compile", "OrtCompileApi::CreateModelCompilationOptionsFromSessionOptions",
                                 "1.22"),
                                ("create_v2", "OrtApi::CreateMemoryInfo_V2", "1.23"),
                                ("input_epdevices", "OrtApi::SessionGetEpDeviceForInputs", "1.23")]:
        assert report[name] is not None, name
        assert slot in report[name] and f">= {version}" in report[name] and "1.20.1" in report[name], report[name]
    # the 1.23 getters are not called: the values come from the name, as before
    assert report["fallback"] == [5, 0x10DE]
    assert report["live"] == 0
