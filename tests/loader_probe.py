"""Run ortagent entry points as the first call of fresh processes, with ORTAGENT_ORT_LIBRARY
pointing at whatever a scenario says, and report what happened as JSON.

Usage: ``python loader_probe.py SCENARIOS_JSON`` where the JSON is a list of
``{"id": ..., "library": path or null, "entry": name}``. ortagent, numpy and onnx are imported
once; each scenario then runs in a child forked before the runtime is loaded, so every scenario
meets an unloaded ortagent. A child reports the exception its entry point raised (class and
message), the live-handle counters after it, and then -- with ORTAGENT_ORT_LIBRARY removed, so
the installed wheel is found -- whether a session still loads and computes 1 + 1. A child that
dies (a signal) is reported with its status. Prints one JSON object: id -> report.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np
from onnx import TensorProto, helper

# the repository root: ortagent_testkit (and an in-place build of ortagent) live there
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ortagent  # noqa: E402  (after the path)
from ortagent_testkit import training_graphs as tg  # noqa: E402


def _add_model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])], "add",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


ADD = _add_model()
TRAINING = tg.mul_add_case().model.SerializeToString()
ONE = np.ones(1, np.float32)

ENTRIES = {
    "get_version_string": lambda: ortagent.get_version_string(),
    "api_version": lambda: ortagent.api_version(),
    "get_available_providers": lambda: ortagent.get_available_providers(),
    "set_default_logger_severity": lambda: ortagent.set_default_logger_severity(2),
    "SessionOptions": lambda: ortagent.SessionOptions(),
    "RunOptions": lambda: ortagent.RunOptions(),
    "InferenceSession": lambda: ortagent.InferenceSession(ADD).run(None, {"a": ONE, "b": ONE})[0].tolist(),
    "ortvalue_from_numpy": lambda: ortagent.OrtValue.ortvalue_from_numpy(np.arange(3.0)).numpy().tolist(),
    "ortvalue_from_numpy_strings": lambda: ortagent.OrtValue.ortvalue_from_numpy(
        np.array(["a", "bc"])).numpy().tolist(),
    "ortvalue_from_shape_and_type": lambda: ortagent.OrtValue.ortvalue_from_shape_and_type([2], np.int64).shape(),
    "ortvalue_from_shape_and_type_strings": lambda: ortagent.OrtValue.ortvalue_from_shape_and_type(
        [2], "tensor(string)").numpy().tolist(),
    "from_dlpack": lambda: ortagent.from_dlpack(np.arange(4, dtype=np.int32)).shape(),
    "OrtDevice_cuda_memory": lambda: ortagent.OrtValue._from_pointer(
        0x1000, [1], np.float32, "cuda", 0).device_name(),
    "TrainingAgent": lambda: ortagent.TrainingAgent(TRAINING).get_providers(),
}


def _child(scenario: dict) -> dict:
    report: dict = {"error": None, "message": None, "result": None}
    if scenario.get("library") is not None:
        os.environ["ORTAGENT_ORT_LIBRARY"] = scenario["library"]
    else:
        os.environ.pop("ORTAGENT_ORT_LIBRARY", None)
    try:
        report["result"] = ENTRIES[scenario["entry"]]()
    except Exception as exc:
        report["error"] = type(exc).__name__
        report["message"] = str(exc)
        report["is_ort_error"] = isinstance(exc, ortagent.OrtError)
    report["live_after_error"] = ortagent.live_handles()
    # The same process, given a usable runtime, still works.
    os.environ.pop("ORTAGENT_ORT_LIBRARY", None)
    try:
        session = ortagent.InferenceSession(ADD)
        report["healthy"] = session.run(None, {"a": ONE, "b": ONE})[0].tolist() == [2.0]
    except Exception:
        report["healthy"] = False
        report["health_error"] = traceback.format_exc()
    return report


def main() -> None:
    scenarios = json.loads(sys.argv[1])
    reports = {}
    for scenario in scenarios:
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                payload = json.dumps(_child(scenario), default=repr).encode()
            except BaseException:
                payload = json.dumps({"crashed_in_python": traceback.format_exc()}).encode()
            with os.fdopen(write_end, "wb") as sink:
                sink.write(payload)
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as source:
            payload = source.read()
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) or not payload:
            reports[scenario["id"]] = {"died": f"status {status} (signal {os.WTERMSIG(status) if os.WIFSIGNALED(status) else None})"}
        else:
            reports[scenario["id"]] = json.loads(payload)
    print(json.dumps(reports))


if __name__ == "__main__":
    main()
