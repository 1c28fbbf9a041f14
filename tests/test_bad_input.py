"""The bad-input matrix: every public entry point, fed what it must refuse.

Each case names one mistake (the pytest id says which) and states the precise ortagent
exception class it must raise and a fragment of the message that names the offending input.
After the error the process must be healthy: the next valid calls of every kind (sessions,
options, values, bindings, DLPack, the three agent forms) give NumPy's results, and the
live-handle counters are back where they were before the case (``no_leaks`` per case). Cases
that would need a fresh process -- the loader's -- run in forked children (``loader_probe.py``):
each child meets an unloaded ortagent, fails to load what the case points it at, reports the
error, and then loads the real runtime and computes with it.

Groups: loader, options (SessionOptions, RunOptions, logger), sessions (models, feeds, outputs,
providers), values (OrtValue, OrtDevice), IOBinding, DLPack (export arguments, producers,
hand-made capsules), TrainingAgent graphs and constructors, the state API, the run-id API.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from onnx import TensorProto, helper

from ortagent_testkit import onnx_models as models
import ortagent
import runtimes
from ortagent_testkit import training_graphs as tg
from conftest import REPO_ROOT, TESTS_DIR
from ortagent import (
    DLPackError, ObjectClosedError, OrtFail, OrtInvalidArgument, OrtInvalidGraph, OrtInvalidProtobuf,
    OrtInvalidType, OrtLoadError, OrtNoSuchFile, OrtNotFound, OrtNotImplemented, OrtRuntimeException,
    OrtValue, PartialGraphExecutionState, ProviderError, RunStateError, TrainingGraphError,
    UnknownRunError,
)
from reliability import (
    KDL_BFLOAT, KDL_BOOL, KDL_CPU, KDL_FLOAT, KDL_INT, KDL_OPAQUE, KDL_OPENCL, KDL_ROCM, KDL_VULKAN,
    UNDER_ASAN, Producer, World, capsule_name, changed, foreign_capsule, live, settled,
)


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[World], object]
    error: type
    fragment: str
    area: str


CASES: list = []


def case(area, id, error, fragment, call, xfail=None):
    entry = Case(id, call, error, fragment, area)
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    CASES.append(pytest.param(entry, id=f"{area}-{id}", marks=marks))


def setter(make, name, value):
    def call(w):
        setattr(make(), name, value)
    return call


# ---- options ------------------------------------------------------------------------------------

SO, RO = ortagent.SessionOptions, ortagent.RunOptions
for name, value, error, fragment in [
    ("intra_op_num_threads", -1, OrtInvalidArgument, "intra_op_num_threads must be in"),
    ("intra_op_num_threads", "4", OrtInvalidType, "intra_op_num_threads must be an int, got str"),
    ("intra_op_num_threads", 1.5, OrtInvalidType, "intra_op_num_threads must be an int, got float"),
    ("intra_op_num_threads", True, OrtInvalidType, "intra_op_num_threads must be an int, got bool"),
    ("inter_op_num_threads", 2**40, OrtInvalidArgument, "inter_op_num_threads must be in"),
    ("graph_optimization_level", 5, OrtInvalidArgument, "graph_optimization_level must be one of"),
    ("graph_optimization_level", "all", OrtInvalidArgument, "'all'"),
    ("execution_mode", 2, OrtInvalidArgument, "execution_mode must be ORT_SEQUENTIAL"),
    ("log_severity_level", 5, OrtInvalidArgument, "log_severity_level must be in [0, 4], got 5"),
    ("log_verbosity_level", -1, OrtInvalidArgument, "log_verbosity_level"),
    ("logid", 7, OrtInvalidType, "logid must be a str"),
    ("logid", "a\0b", OrtInvalidArgument, "logid must not contain NUL"),
    ("profile_file_prefix", 3, OrtInvalidType, "profile_file_prefix must be a str"),
    ("optimized_model_filepath", 3, OrtInvalidType, "optimized_model_filepath must be a path"),
    ("optimized_model_filepath", None, OrtInvalidType, "optimized_model_filepath must be a path"),
]:
    case("options", f"session-{name}={value!r}", error, fragment, setter(SO, name, value))

case("options", "session-config-key-int", OrtInvalidType, "config_key must be a str",
     lambda w: SO().add_session_config_entry(1, "x"))
case("options", "session-config-value-none", OrtInvalidType, "config_value must be a str",
     lambda w: SO().add_session_config_entry("session.x", None))
case("options", "session-config-missing", OrtNotFound, "SessionOptions does not have configuration with key: session.nope",
     lambda w: SO().get_session_config_entry("session.nope"))
case("options", "session-initializer-ndarray", OrtInvalidType, "initializer 'scale' must be an ortagent.OrtValue",
     lambda w: SO().add_initializer("scale", np.ones(1, np.float32)))
case("options", "external-initializers-count", OrtInvalidArgument, "2 names but 1 values",
     lambda w: SO().add_external_initializers(["a", "b"], [OrtValue.ortvalue_from_numpy(np.ones(1, np.float32))]))
case("options", "external-initializers-ndarray", OrtInvalidType, "initializer 'a' must be an ortagent.OrtValue",
     lambda w: SO().add_external_initializers(["a"], [np.ones(1, np.float32)]))
case("options", "external-files-length", OrtInvalidArgument, "lengths[0] must be an int in [0, 2]",
     lambda w: SO().add_external_initializers_from_files_in_memory(["w.bin"], [b"ab"], [-1]))
case("options", "per-session-threads-back-on", OrtInvalidArgument, "cannot be turned back on",
     lambda w: _per_session_threads_back_on())
case("options", "custom-ops-library-int", OrtInvalidType, "library_path must be a path",
     lambda w: SO().register_custom_ops_library(5))
case("options", "lora-load-int", OrtInvalidType, "path_or_bytes must be a path or bytes",
     lambda w: ortagent.LoraAdapter().Load(5))
case("options", "lora-load-garbage", ortagent.OrtFail, "adapter",
     lambda w: ortagent.LoraAdapter().Load(b"not an adapter"))
case("options", "lora-not-loaded", OrtInvalidArgument, "call Load() first",
     lambda w: ortagent.RunOptions().add_active_adapter(ortagent.LoraAdapter()))
case("options", "arena-cfg-unknown", ortagent.OrtFail, "Invalid OrtArenaCfg option: bogus",
     lambda w: ortagent.OrtArenaCfg({"bogus": 1}))
case("options", "arena-cfg-negative", OrtInvalidArgument, "max_mem must be -1",
     lambda w: ortagent.OrtArenaCfg(-5, 0, 0, 0))
case("options", "memory-info-alloc-type", OrtInvalidArgument, "bad memory info",
     lambda w: ortagent.OrtMemoryInfo("Cpu", 7, 0, 0))
case("options", "memory-info-name-int", OrtInvalidType, "name must be a str",
     lambda w: ortagent.OrtMemoryInfo(3, 0, 0, 0))
case("options", "device-make-unknown", OrtInvalidArgument, "Unsupported device type: tpu",
     lambda w: ortagent.OrtDevice.make("tpu", 0))
case("options", "sparse-coo-indices-float", OrtInvalidArgument, "coo_indices must be int64",
     lambda w: ortagent.SparseTensor.sparse_coo_from_numpy([2], np.ones(1, np.float32), np.zeros(1, np.float32)))
case("options", "sparse-coo-out-of-bounds", OrtInvalidArgument, "COO linear index out of bounds",
     lambda w: ortagent.SparseTensor.sparse_coo_from_numpy([2], np.ones(1, np.float32), np.array([5], np.int64)))
case("options", "sparse-objects-not-strings", OrtInvalidType, "string tensors hold str or bytes, got int",
     lambda w: ortagent.SparseTensor.sparse_coo_from_numpy([2], np.array(["a", 1], object), np.array([0, 1], np.int64)))
def _adapter_file(content):
    import tempfile
    handle, path = tempfile.mkstemp(suffix=".onnx_adapter")
    os.write(handle, content)
    os.close(handle)
    return path


def _read_adapter(content):
    path = _adapter_file(content)
    try:
        return ortagent.AdapterFormat.read_adapter(path)
    finally:
        os.remove(path)


def _export_adapter(parameters):
    writer = ortagent.AdapterFormat()
    writer.set_parameters(parameters)
    path = _adapter_file(b"")
    try:
        writer.export_adapter(path)
    finally:
        os.remove(path)


case("options", "adapter-junk-file", OrtFail, "does not appear to be a valid lora parameter format",
     lambda w: _read_adapter(b"x" * 64))
case("options", "adapter-truncated-file", OrtFail, "fails lora adapter format verification",
     lambda w: _read_adapter(b"\x14\0\0\0TORT" + b"\0" * 8))
case("options", "adapter-missing-file", OrtNoSuchFile, "no LoRA adapter file",
     lambda w: ortagent.AdapterFormat.read_adapter("no/such/adapter.onnx_adapter"))
case("options", "adapter-path-int", OrtInvalidType, "file_path must be a path, got int",
     lambda w: ortagent.AdapterFormat.read_adapter(3))
case("options", "adapter-parameter-array", OrtInvalidType, "must be an ortagent.OrtValue, got ndarray",
     lambda w: ortagent.AdapterFormat().set_parameters({"w": F3}))
case("options", "adapter-parameter-strings", OrtFail, "element type STRING, which is not supported",
     lambda w: _export_adapter({"s": OrtValue.ortvalue_from_numpy(np.array(["a"], dtype=object))}))
case("options", "adapter-parameter-nameless", OrtInvalidArgument, "needs a name",
     lambda w: _export_adapter({"": OrtValue.ortvalue_from_numpy(F3)}))
case("options", "adapter-version-too-large", OrtInvalidType, "adapter_version must fit a 32-bit int",
     lambda w: ortagent.AdapterFormat().set_adapter_version(2**31))

case("options", "sparse-string-with-nul", OrtInvalidArgument, "contains a NUL character",
     lambda w: ortagent.SparseTensor.sparse_csr_from_numpy([1, 2], np.array(["a\0b"]), np.array([0], np.int64),
                                                           np.array([0, 1], np.int64)))
case("options", "sparse-strings-out-of-bounds", OrtInvalidArgument, "out of bounds",
     lambda w: ortagent.SparseTensor.sparse_coo_from_numpy([2], np.array(["a"]), np.array([5], np.int64)))
case("options", "sparse-datetimes", ortagent.OrtNotImplemented, "numeric NumPy types only",
     lambda w: ortagent.SparseTensor.sparse_coo_from_numpy([2], np.zeros(1, "datetime64[s]"), np.array([0], np.int64)))
case("options", "global-pools-after-first-use", ortagent.OrtFail, "environment exists already",
     lambda w: ortagent.set_global_thread_pool_sizes(3, 3))
case("options", "global-pools-str", OrtInvalidType, "intra_op_num_threads must be an int",
     lambda w: ortagent.set_global_thread_pool_sizes("2"))


def _per_session_threads_back_on():
    options = SO()
    options.use_per_session_threads = False
    options.use_per_session_threads = True


def _closed_value(array=None):
    value = OrtValue.ortvalue_from_numpy(np.ones(3, np.float32) if array is None else array)
    value.close()
    return value


case("options", "session-initializer-closed-value", ObjectClosedError, "OrtValue has been released",
     lambda w: SO().add_initializer("scale", _closed_value()))
case("options", "session-dimension-override-negative", OrtInvalidArgument, "'N' must be >= 0",
     lambda w: SO().add_free_dimension_override_by_name("N", -1))
case("options", "session-dimension-override-str", OrtInvalidType, "dimension override for 'N' must be an int",
     lambda w: SO().add_free_dimension_override_by_name("N", "8"))
case("options", "session-dimension-denotation-int-name", OrtInvalidType, "dim_denotation must be a str",
     lambda w: SO().add_free_dimension_override_by_denotation(5, 1))
case("options", "session-pickle", OrtInvalidType, "SessionOptions cannot be pickled", lambda w: pickle.dumps(SO()))
case("options", "run-log_severity_level=9", OrtInvalidArgument, "log_severity_level must be in [0, 4], got 9",
     setter(RO, "log_severity_level", 9))
case("options", "run-log_verbosity_level=str", OrtInvalidType, "log_verbosity_level must be an int",
     setter(RO, "log_verbosity_level", "1"))
case("options", "run-logid=None", OrtInvalidType, "logid must be a str, got NoneType", setter(RO, "logid", None))
case("options", "run-config-key-none", OrtInvalidType, "config_key must be a str",
     lambda w: RO().add_run_config_entry(None, "1"))
case("options", "run-config-missing", OrtNotFound, "no run config entry 'nope'", lambda w: RO().get_run_config_entry("nope"))
case("options", "run-pickle", OrtInvalidType, "RunOptions cannot be pickled", lambda w: pickle.dumps(RO()))
case("options", "logger-severity-7", OrtInvalidArgument, "log severity must be 0..4",
     lambda w: ortagent.set_default_logger_severity(7))
case("options", "logger-severity-str", OrtInvalidType, "log severity must be an int",
     lambda w: ortagent.set_default_logger_severity("error"))

# ---- execution-provider devices, selection policies, model compilation -----------------------------

def _cpu_device():
    return next(d for d in ortagent.get_ep_devices() if d.ep_name == "CPUExecutionProvider")


def _identity_bytes():
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


case("options", "ep-devices-none", OrtInvalidType, "ep_devices must be a list of OrtEpDevice, got NoneType",
     lambda w: SO().add_provider_for_devices(None, {}))
case("options", "ep-devices-str", OrtInvalidType, "ep_devices must be a list of OrtEpDevice, got str",
     lambda w: SO().add_provider_for_devices("CPUExecutionProvider", {}))
case("options", "ep-devices-int-item", OrtInvalidType, "ep_devices[1] must be an OrtEpDevice, got int",
     lambda w: SO().add_provider_for_devices([_cpu_device(), 1], {}))
case("options", "ep-devices-empty", OrtInvalidArgument, "Must provide one or more OrtEpDevice instances",
     lambda w: SO().add_provider_for_devices([], {}))
case("options", "ep-devices-options-list", OrtInvalidType, "provider_options must be a dict",
     lambda w: SO().add_provider_for_devices([_cpu_device()], [("a", "1")]))
case("options", "ep-devices-option-int", OrtInvalidType, "provider_options must map str to str",
     lambda w: SO().add_provider_for_devices([_cpu_device()], {"a": 1}))
case("options", "ep-devices-option-nul", OrtInvalidArgument, "must not contain NUL",
     lambda w: SO().add_provider_for_devices([_cpu_device()], {"a": "x\0y"}))
case("options", "ep-device-constructed", OrtInvalidType, "OrtEpDevice objects come from ortagent.get_ep_devices()",
     lambda w: ortagent.OrtEpDevice())
case("options", "hardware-device-constructed", OrtInvalidType, "OrtHardwareDevice objects come from",
     lambda w: ortagent.OrtHardwareDevice())
case("options", "ep-device-memory-type-7", OrtInvalidArgument, "memory type must be an OrtDeviceMemoryType (0 or 5), got 7",
     lambda w: _cpu_device().memory_info(7))
case("options", "ep-device-memory-type-str", OrtInvalidType, "memory type must be an OrtDeviceMemoryType, got str",
     lambda w: _cpu_device().memory_info("DEFAULT"))
case("options", "ep-device-cpu-sync-stream", ortagent.OrtFail, "ep_device does not use DEFAULT memory of a non-CPU device.",
     lambda w: _cpu_device().create_sync_stream())
case("options", "ep-device-pickled", OrtInvalidType, "OrtEpDevice cannot be pickled",
     lambda w: pickle.dumps(_cpu_device()))
case("options", "ep-library-missing-file", ortagent.OrtFail, "no_such_ep.so",
     lambda w: ortagent.register_execution_provider_library("no_such_ep", "/nonexistent/no_such_ep.so"))
case("options", "ep-library-path-int", OrtInvalidType, "library_path must be a path, got int",
     lambda w: ortagent.register_execution_provider_library("x", 5))
case("options", "ep-library-name-int", OrtInvalidType, "registration_name must be a str",
     lambda w: ortagent.register_execution_provider_library(5, "/x.so"))
case("options", "ep-library-not-registered", ortagent.OrtFail, "Execution provider library: never_registered was not registered",
     lambda w: ortagent.unregister_execution_provider_library("never_registered"))
for policy, error, fragment in [(7, OrtInvalidArgument, "policy must be an OrtExecutionProviderDevicePolicy (0 to 6), got 7"),
                                (-1, OrtInvalidArgument, "got -1"),
                                ("PREFER_CPU", OrtInvalidType, "policy must be an OrtExecutionProviderDevicePolicy, got str"),
                                (None, OrtInvalidType, "got NoneType"), (True, OrtInvalidType, "got bool")]:
    case("options", f"selection-policy={policy!r}", error, fragment,
         lambda w, policy=policy: SO().set_provider_selection_policy(policy))
for label, args, error, fragment in [
        ("name-int", (3, 0, 0, 0, 0, 0, 0), OrtInvalidType, "name must be a str"),
        ("device-type-9", ("x", 9, 0, 0, 0, 0, 0), OrtInvalidArgument, "device_type must be an OrtMemoryInfoDeviceType"),
        ("vendor-negative", ("x", 0, -1, 0, 0, 0, 0), OrtInvalidArgument, "vendor_id must be in"),
        ("device-id-huge", ("x", 0, 0, 1 << 40, 0, 0, 0), OrtInvalidArgument, "device_id must be a 32-bit int"),
        ("mem-type-1", ("x", 0, 0, 0, 1, 0, 0), OrtInvalidArgument, "device_mem_type must be an OrtDeviceMemoryType"),
        ("alignment-negative", ("x", 0, 0, 0, 0, -1, 0), OrtInvalidArgument, "alignment must be a size"),
        ("allocator-5", ("x", 0, 0, 0, 0, 0, 5), OrtInvalidArgument, "allocator_type must be an OrtAllocatorType"),
        ("alignment-float", ("x", 0, 0, 0, 0, 1.5, 0), OrtInvalidType, "alignment must be an int, got float")]:
    case("options", f"memory-info-v2-{label}", error, fragment,
         lambda w, args=args: ortagent.OrtMemoryInfo.create_v2(*args))
case("session", "compiler-options-none", OrtInvalidType, "sess_options must be ortagent.SessionOptions, got NoneType",
     lambda w: ortagent.ModelCompiler(None, _identity_bytes()))
case("session", "compiler-input-int", OrtInvalidType, "Unable to load from type '<class 'int'>'",
     lambda w: ortagent.ModelCompiler(SO(), 3))
case("session", "compiler-input-empty", OrtInvalidArgument, "Input model bytes array is empty",
     lambda w: ortagent.ModelCompiler(SO(), b""))
case("session", "compiler-flags-8", OrtInvalidArgument, "flags must be in [0, 3], got 8",
     lambda w: ortagent.ModelCompiler(SO(), _identity_bytes(), flags=8))
case("session", "compiler-level-5", OrtInvalidArgument, "graph_optimization_level must be a GraphOptimizationLevel",
     lambda w: ortagent.ModelCompiler(SO(), _identity_bytes(), graph_optimization_level=5))
case("session", "compiler-threshold-str", OrtInvalidType, "external_initializers_size_threshold must be an int",
     lambda w: ortagent.ModelCompiler(SO(), _identity_bytes(), external_initializers_size_threshold="1"))
case("session", "compiler-initializer-callback", OrtNotImplemented, "get_initializer_location_func is not supported",
     lambda w: ortagent.ModelCompiler(SO(), _identity_bytes(), get_initializer_location_func=print))
case("session", "compiler-garbage-model", OrtInvalidProtobuf, "protobuf parsing failed",
     lambda w: ortagent.ModelCompiler(SO(), b"not a model").compile_to_bytes())
case("session", "compiler-output-int", OrtInvalidType, "output_model_path must be a path, got int",
     lambda w: ortagent.ModelCompiler(SO(), _identity_bytes()).compile_to_file(3))
case("session", "compiler-stream-not-callable", OrtInvalidType, "write_function must be callable",
     lambda w: ortagent.ModelCompiler(SO(), _identity_bytes()).compile_to_stream(3))
case("session", "compiler-stream-raises", ortagent.OrtFail, "ValueError: refused",
     lambda w: ortagent.ModelCompiler(SO(), _identity_bytes()).compile_to_stream(_refuse))


def _refuse(_):
    raise ValueError("refused")


# ---- sessions: models ---------------------------------------------------------------------------


def _model(mutate):
    model = models.add(shape=(3,))
    mutate(model)
    return model


def _set(obj, **fields):
    for key, value in fields.items():
        setattr(obj, key, value)


def _graph_model(nodes, inputs, outputs):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), ir_version=10,
                             opset_imports=[helper.make_opsetid("", 17)])


Session = ortagent.InferenceSession
case("session", "model-empty-bytes", OrtInvalidArgument, "No graph was found in the protobuf", lambda w: Session(b""))
case("session", "model-garbage-bytes", OrtInvalidProtobuf, "protobuf parsing failed", lambda w: Session(b"\x08garbage\xff"))
case("session", "model-missing-file", OrtNoSuchFile, "/nonexistent/model.onnx", lambda w: Session("/nonexistent/model.onnx"))
case("session", "model-directory", OrtInvalidArgument, "is a directory", lambda w: Session(TESTS_DIR))
case("session", "model-path-with-nul", OrtInvalidArgument, "NUL", lambda w: Session("model\0.onnx"))
case("session", "model-int", OrtInvalidType, "path_or_bytes must be a path, bytes or an onnx.ModelProto, got int",
     lambda w: Session(42))
case("session", "model-none", OrtInvalidType, "got NoneType", lambda w: Session(None))
# An IR version no onnxruntime release supports (14 was refused by 1.31 and is read by 1.32):
# the refusal does not depend on which runtime the tests load.
case("session", "model-ir-version-unsupported", OrtFail, "Unsupported model IR version: 99",
     lambda w: Session(_model(lambda m: _set(m, ir_version=99))))
case("session", "model-opset-99", OrtFail, "Opset 99", lambda w: Session(_model(lambda m: _set(m.opset_import[0], version=99))))
case("session", "model-unknown-op", OrtInvalidGraph, "No Op registered for NoSuchOp", lambda w: Session(_graph_model(
    [helper.make_node("NoSuchOp", ["x"], ["y"])], [models.vinfo("x", 1, [1])], [models.vinfo("y", 1, [1])])))
case("session", "model-type-mismatch", OrtFail, "Optype (Add) bound to different types", lambda w: Session(_graph_model(
    [helper.make_node("Add", ["x", "k"], ["y"])], [models.vinfo("x", 1, [1]), models.vinfo("k", 7, [1])],
    [models.vinfo("y", 1, [1])])))
case("session", "model-undefined-value", OrtInvalidArgument, "Node input 'q' is not a graph input", lambda w: Session(
    _graph_model([helper.make_node("Relu", ["q"], ["y"])], [models.vinfo("x", 1, [1])], [models.vinfo("y", 1, [1])])))
case("session", "model-training-graph", OrtFail, "YieldOp", lambda w: Session(w.training_model))
case("session", "sess_options-str", OrtInvalidType, "sess_options must be ortagent.SessionOptions, got str",
     lambda w: Session(models.add(), "fast"))
case("session", "providers-string", OrtInvalidType, "providers must be a list", lambda w: Session(
    models.add(), providers="CPUExecutionProvider"))
case("session", "providers-int", OrtInvalidType, "providers and provider_options must be lists",
     lambda w: Session(models.add(), providers=5))
def _strictly(make, *args, **kwargs):
    """Providers that cannot be used are errors only in strict mode (the default falls back)."""
    with ortagent.strict_providers():
        return make(*args, **kwargs)


case("session", "providers-unknown", ProviderError, "'NoSuchExecutionProvider'",
     lambda w: _strictly(Session, models.add(), providers=["NoSuchExecutionProvider"]))
case("session", "providers-not-in-this-build", ProviderError, "XnnpackExecutionProvider",
     lambda w: _strictly(Session, models.add(), providers=["XnnpackExecutionProvider"]))
case("session", "providers-cpu-unknown-option", ProviderError, "['bogus']",
     lambda w: _strictly(Session, models.add(), providers=[("CPUExecutionProvider", {"bogus": 1})]))
case("session", "providers-options-not-dict", OrtInvalidType, "options of CPUExecutionProvider must be a dict",
     lambda w: Session(models.add(), providers=[("CPUExecutionProvider", "fast")]))
case("session", "providers-entry-int", OrtInvalidType, "providers[0] must be a name",
     lambda w: Session(models.add(), providers=[42]))
case("session", "providers-listed-twice", OrtInvalidArgument, "CPUExecutionProvider is listed twice",
     lambda w: _strictly(Session, models.add(), providers=["CPUExecutionProvider"] * 2))
case("session", "provider_options-count", OrtInvalidArgument, "1 providers but 2 provider_options",
     lambda w: Session(models.add(), providers=["CPUExecutionProvider"], provider_options=[{}, {}]))
case("session", "provider_options-without-providers", OrtInvalidArgument, "provider_options given without providers",
     lambda w: Session(models.add(), provider_options=[{}]))

# ---- sessions: runs -----------------------------------------------------------------------------

F3 = np.ones(3, np.float32)


def run_add(feed, output_names=None, run_options=None):
    def call(w):
        w.add.run(output_names, feed() if callable(feed) else feed, run_options)
    return call


def _terminated():
    options = RO()
    options.terminate = True
    return options


case("session", "run-feed-list", OrtInvalidType, "input_feed must be a dict", run_add([F3, F3]))
case("session", "run-unknown-input", OrtInvalidArgument, "unknown input name 'zz'", run_add({"a": F3, "b": F3, "zz": F3}))
case("session", "run-input-name-int", OrtInvalidArgument, "unknown input name 5", run_add({"a": F3, 5: F3}))
case("session", "run-missing-input", OrtInvalidArgument, "Required inputs (['b']) are missing from input feed (['a'])", run_add({"a": F3}))
case("session", "run-wrong-dtype", OrtInvalidArgument, "input 'b' expects tensor(float), got a NumPy array of float64",
     run_add({"a": F3, "b": np.ones(3)}))
case("session", "run-wrong-extent", OrtInvalidArgument, "invalid dimensions for input: b", run_add({"a": F3, "b": np.ones(4, np.float32)}))
case("session", "run-wrong-rank", OrtInvalidArgument, "Invalid rank for input: b", run_add({"a": F3, "b": np.ones((3, 1), np.float32)}))
case("session", "run-feed-ragged-list", OrtInvalidArgument, "input 'b': cannot make a tensor(float) tensor from the list",
     run_add({"a": F3, "b": [[1.0], [2.0, 3.0]]}))
case("session", "run-feed-dict", OrtInvalidType, "input 'b' must be a numpy.ndarray or an OrtValue, got dict",
     run_add({"a": F3, "b": {1: 2.0}}))
case("session", "run-feed-none", OrtInvalidType, "input 'b' must be a numpy.ndarray or an OrtValue, got NoneType",
     run_add({"a": F3, "b": None}))
case("session", "run-feed-datetime", OrtInvalidArgument, "input 'b': NumPy dtype datetime64[s] has no ONNX",
     run_add({"a": F3, "b": np.zeros(3, "datetime64[s]")}))
case("session", "run-feed-strings-for-floats", OrtInvalidArgument, "input 'b' expects tensor(float)",
     run_add({"a": F3, "b": np.array(["1", "2", "3"], dtype=object)}))
case("session", "run-ortvalue-wrong-dtype", OrtInvalidArgument, "input 'b' expects tensor(float), got an OrtValue of tensor(double)",
     run_add(lambda: {"a": F3, "b": OrtValue.ortvalue_from_numpy(np.ones(3))}))
case("session", "run-ortvalue-wrong-extent", OrtInvalidArgument, "invalid dimensions for input: b",
     run_add(lambda: {"a": F3, "b": OrtValue.ortvalue_from_numpy(np.ones(4, np.float32))}))
case("session", "run-ortvalue-closed", ObjectClosedError, "OrtValue has been released",
     run_add(lambda: {"a": F3, "b": _closed_value()}))
case("session", "run-unknown-output", OrtInvalidArgument, "unknown output name 'zz'", run_add({"a": F3, "b": F3}, ["zz"]))
case("session", "run-output-names-int", OrtInvalidType, "output_names must be a list of names or None, got int",
     run_add({"a": F3, "b": F3}, 5))
case("session", "run-output-names-string", OrtInvalidType, "not a string ('cc')", run_add({"a": F3, "b": F3}, "cc"))
case("session", "run-output-name-none", OrtInvalidArgument, "unknown output name None", run_add({"a": F3, "b": F3}, [None]))
case("session", "run-run_options-str", OrtInvalidType, "run_options must be ortagent.RunOptions, got str",
     run_add({"a": F3, "b": F3}, None, "fast"))
case("session", "run-terminate-already-set", OrtFail, "terminate flag", lambda w: w.add.run(None, {"a": F3, "b": F3}, _terminated()))
case("session", "run-strings-of-ints", OrtInvalidType, "string tensors hold str or bytes, got int", lambda w: w.strings.run(
    None, {"s": np.array([1, 2], dtype=object), "lens": np.array([2], np.int64)}))


def _dict_vectorizer():
    from onnx import helper as h
    node = h.make_node("DictVectorizer", ["m"], ["y"], domain="ai.onnx.ml", int64_vocabulary=[1, 2])
    graph = h.make_graph([node], "dv", [h.make_value_info("m", h.make_map_type_proto(
        TensorProto.INT64, h.make_tensor_type_proto(TensorProto.FLOAT, None)))],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return Session(h.make_model(graph, ir_version=9, opset_imports=[h.make_opsetid("", 18),
                                                                     h.make_opsetid("ai.onnx.ml", 3)]))


for map_id, feed, fragment in [
        ("empty", {}, "Size of dictionary is empty"),
        ("str-after-int-key", {1: 1.0, "a": 2.0}, "Unexpected key type  <class 'str'>"),
        ("float-key", {1.5: 1.0}, "Unexpected key type  <class 'float'>"),
        ("key-beyond-int64", {2**63: 1.0}, "Unexpected key type  <class 'int'>"),
        ("bytes-key", {b"k": 1.0}, "Key type must be int or string (not <class 'bytes'>)"),
        ("str-value", {1: "x"}, "Unexpected value type  <class 'str'>"),
        ("complex-value", {1: 1 + 2j}, "<class 'TypeError'>: must be real number, not complex")]:
    case("session", f"run-map-{map_id}", ortagent.FeedConversionError, fragment,
         lambda w, feed=feed: _dict_vectorizer().run(None, {"m": feed}))
case("session", "run-map-of-string-keys-for-int64-keys", OrtInvalidArgument,
     "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Unexpected input data type",
     lambda w: _dict_vectorizer().run(None, {"m": {"a": 1.0}}))
case("session", "run-overridable-initializer-wrong-dtype", OrtInvalidArgument, "input 'scale' expects tensor(float)",
     lambda w: w.overridable.run(None, {"x": F3, "scale": np.ones(1)}))

case("session", "run-none-for-a-tensor", OrtInvalidType, "input 'a' must be a numpy.ndarray or an OrtValue, got NoneType",
     run_add({"a": None, "b": F3}))



def _closed_session():
    session = Session(models.add(shape=(3,)))
    session.close()
    return session


case("session", "closed-run", ObjectClosedError, "InferenceSession has been closed",
     lambda w: _closed_session().run(None, {"a": F3, "b": F3}))
case("session", "closed-io_binding", ObjectClosedError, "InferenceSession has been closed", lambda w: _closed_session().io_binding())
case("session", "closed-get_modelmeta", ObjectClosedError, "InferenceSession has been closed",
     lambda w: _closed_session().get_modelmeta())
case("session", "init-twice", OrtInvalidArgument, "already initialised", lambda w: w.add.__init__(models.add()))
case("session", "pickle", OrtInvalidType, "InferenceSession cannot be pickled", lambda w: pickle.dumps(w.add))

# ---- values ---------------------------------------------------------------------------------------

from_numpy = OrtValue.ortvalue_from_numpy
from_shape = OrtValue.ortvalue_from_shape_and_type
case("values", "constructor", OrtInvalidType, "use OrtValue.ortvalue_from_numpy()", lambda w: OrtValue())
case("values", "from_numpy-list", OrtInvalidType, "must be a numpy.ndarray or an OrtValue, got list", lambda w: from_numpy([1, 2]))
case("values", "from_numpy-none", OrtInvalidType, "got NoneType", lambda w: from_numpy(None))
case("values", "from_numpy-datetime", OrtInvalidArgument, "datetime64[s] has no ONNX tensor equivalent",
     lambda w: from_numpy(np.zeros(2, "datetime64[s]")))
case("values", "from_numpy-structured", OrtInvalidArgument, "('f0', '<i4')", lambda w: from_numpy(np.zeros(2, "i4,f4")))
case("values", "from_numpy-longdouble", OrtInvalidArgument, "float128 has no ONNX tensor equivalent",
     lambda w: from_numpy(np.zeros(2, np.longdouble)))
case("values", "from_numpy-objects-not-strings", OrtInvalidType, "string tensors hold str or bytes, got int",
     lambda w: from_numpy(np.array(["a", 1], dtype=object)))
case("values", "from_numpy-unencodable-string", OrtInvalidArgument, "cannot be encoded as UTF-8",
     lambda w: from_numpy(np.array(["\ud800"], dtype=object)))
case("values", "from_numpy-unknown-device", OrtInvalidArgument, "unknown device 'tpu'", lambda w: from_numpy(F3, "tpu"))
case("values", "from_numpy-cpu-device-1", OrtInvalidArgument, "the CPU has only device id 0", lambda w: from_numpy(F3, "cpu", 1))
case("values", "from_numpy-device-index-not-a-number", OrtInvalidArgument, "invalid device 'cuda:x'",
     lambda w: from_numpy(F3, "cuda:x"))
case("values", "from_numpy-device-index-superscript", OrtInvalidArgument, "invalid device 'cuda:²'",
     lambda w: from_numpy(F3, "cuda:²"))
case("values", "from_numpy-device-float", OrtInvalidType, "cannot interpret 3.5 as a device", lambda w: from_numpy(F3, 3.5))
case("values", "from_numpy-device_id-str", OrtInvalidType, "device_id must be an int, got str", lambda w: from_numpy(F3, "cpu", "0"))
case("values", "from_numpy-device_id-negative", OrtInvalidArgument, "device_id must be in [0, 2147483647], got -1",
     lambda w: from_numpy(F3, "cuda", -1))
case("values", "from_numpy-device_id-huge", OrtInvalidArgument, "got 1099511627776", lambda w: from_numpy(F3, "cuda", 2**40))
case("values", "shape-negative", OrtInvalidArgument, "shape [2, -1] has a negative dimension", lambda w: from_shape([2, -1], np.float32))
case("values", "shape-int", OrtInvalidType, "shape must be a sequence of ints, got 5", lambda w: from_shape(5, np.float32))
case("values", "shape-string", OrtInvalidType, "shape must be a sequence of ints, got '23'", lambda w: from_shape("23", np.float32))
case("values", "shape-items-str", OrtInvalidType, "shape must be a sequence of ints, got ['a']", lambda w: from_shape(["a"], np.float32))
case("values", "shape-items-float", OrtInvalidType, "got [1.5]", lambda w: from_shape([1.5], np.float32))
case("values", "shape-too-many-elements", OrtInvalidArgument, "shape [1099511627776, 1099511627776] is too large",
     lambda w: from_shape([2**40, 2**40], np.float32))
case("values", "shape-extent-beyond-int64", OrtInvalidArgument, "is too large", lambda w: from_shape([2**70], np.uint8))
case("values", "shape-too-many-bytes", OrtInvalidArgument, "is too large", lambda w: from_shape([2**61], np.float64))
if not UNDER_ASAN:      # (AddressSanitizer's operator new aborts instead of throwing bad_alloc)
    case("values", "shape-unallocatable", OrtRuntimeException,
         "cannot allocate a tensor(float) tensor of shape [1125899906842624]", lambda w: from_shape([2**50], np.float32))
case("values", "element_type-unknown-number", OrtInvalidArgument, "unknown ONNX element type 99", lambda w: from_shape([2], 99))
case("values", "element_type-zero", OrtInvalidArgument, "unknown ONNX element type 0", lambda w: from_shape([2], 0))
case("values", "element_type-bad-tensor-name", OrtInvalidArgument, "unknown tensor type 'tensor(foo)'",
     lambda w: from_shape([2], "tensor(foo)"))
case("values", "element_type-bad-dtype-name", OrtInvalidType, "got 'nope'", lambda w: from_shape([2], "nope"))
case("values", "element_type-datetime", OrtInvalidArgument, "datetime64 has no ONNX tensor equivalent",
     lambda w: from_shape([2], np.datetime64))
case("values", "element_type-bool-object", OrtInvalidType, "got True", lambda w: from_shape([2], True))
case("values", "element_type-none", OrtInvalidType, "element_type is required", lambda w: from_shape([2], None))
case("values", "numpy-of-uint4", OrtNotImplemented, "tensor(uint4) has no NumPy equivalent", lambda w: from_shape([2], 21).numpy())


def _update(value_maker, new):
    def call(w):
        value_maker().update_inplace(new)
    return call


def _readonly_value():
    array = np.ones(3, np.float32)
    array.flags.writeable = False
    return from_numpy(array)


case("values", "update-shape", OrtInvalidArgument, "shape (4,) does not match the value's shape (3,)",
     _update(lambda: from_numpy(np.ones(3, np.float32)), np.ones(4, np.float32)))
case("values", "update-dtype", OrtInvalidArgument, "dtype float64 does not match the value's tensor(float)",
     _update(lambda: from_numpy(np.ones(3, np.float32)), np.ones(3)))
case("values", "update-read-only", OrtInvalidArgument, "read-only", _update(_readonly_value, np.zeros(3, np.float32)))
case("values", "update-strings-with-floats", OrtInvalidArgument, "dtype float64 does not match the value's tensor(string)",
     _update(lambda: from_numpy(np.array(["a", "b"], dtype=object)), np.ones(2)))
for method, args in [("numpy", ()), ("shape", ()), ("data_ptr", ()), ("update_inplace", (np.ones(3, np.float32),)),
                     ("__dlpack__", ()), ("__dlpack_device__", ())]:
    case("values", f"closed-{method}", ObjectClosedError, "OrtValue has been released",
         lambda w, method=method, args=args: getattr(_closed_value(), method)(*args))
case("values", "pickle", OrtInvalidType, "pickle value.numpy() instead", lambda w: pickle.dumps(from_numpy(F3)))


class _LookAlike:
    def __init__(self, device_type, device_id=0, fail=False):
        self._type, self._id, self._fail = device_type, device_id, fail

    def device_type(self):
        if self._fail:
            raise RuntimeError("device query failed")
        return self._type

    def device_id(self):
        return self._id


Device = ortagent.OrtDevice
case("values", "device-unsupported-type", OrtInvalidArgument, "unsupported device (device_type=5, memory_type=0)",
     lambda w: Device(5, 0, 0))
case("values", "device-str-arguments", OrtInvalidType, "device_type must be an int, got str", lambda w: Device("cpu"))
case("values", "device-negative-id", OrtInvalidArgument, "device_id must be in", lambda w: Device(1, 0, -1))
case("values", "device-conflicting-ids", OrtInvalidArgument, "device 'cuda:0' given with a different device_id 1",
     lambda w: Device.parse("cuda:0", 1))
case("values", "device-object", OrtInvalidType, "as a device", lambda w: Device.parse(object()))
case("values", "device-look-alike-non-int", OrtInvalidType, "its device_type() returned 'gpu', not an int",
     lambda w: Device.parse(_LookAlike("gpu")))
case("values", "device-look-alike-raises", OrtInvalidType, "device query failed", lambda w: Device.parse(_LookAlike(0, fail=True)))

# ---- IOBinding ------------------------------------------------------------------------------------

BUFFER = np.zeros(64, np.float32)        # memory that bind_input/bind_output cases point at


def bind(action):
    def call(w):
        binding = w.add.io_binding()
        try:
            action(binding)
        finally:
            binding.close()
    return call


def run_bound(prepare, run_options=None):
    def call(w):
        binding = w.add.io_binding()
        try:
            prepare(binding)
            w.add.run_with_iobinding(binding, run_options)
        finally:
            binding.close()
    return call


def _inputs(b):
    b.bind_cpu_input("a", F3)
    b.bind_cpu_input("b", F3)


case("iobinding", "bind-unknown-input", OrtInvalidArgument, "unknown input name 'zz'", bind(lambda b: b.bind_cpu_input("zz", F3)))
case("iobinding", "bind-wrong-dtype", OrtInvalidArgument, "input 'a' expects tensor(float), got a value of tensor(double)",
     bind(lambda b: b.bind_cpu_input("a", np.ones(3))))
case("iobinding", "bind-python-list", OrtInvalidType, "got list", bind(lambda b: b.bind_cpu_input("a", [1.0, 2.0, 3.0])))
case("iobinding", "bind-ortvalue-ndarray", OrtInvalidType, "input 'a' must be an ortagent.OrtValue, got ndarray",
     bind(lambda b: b.bind_ortvalue_input("a", F3)))
case("iobinding", "bind-ortvalue-none", OrtInvalidType, "input 'a' must be an ortagent.OrtValue, got NoneType",
     bind(lambda b: b.bind_ortvalue_input("a", None)))
case("iobinding", "bind-ortvalue-closed", ObjectClosedError, "OrtValue has been released",
     bind(lambda b: b.bind_ortvalue_input("a", _closed_value())))
case("iobinding", "bind_input-null-pointer", OrtInvalidArgument, "input 'a': buffer_ptr must not be 0",
     bind(lambda b: b.bind_input("a", "cpu", 0, np.float32, [3], 0)))
case("iobinding", "bind_input-negative-pointer", OrtInvalidArgument, "buffer_ptr must be an address",
     bind(lambda b: b.bind_input("a", "cpu", 0, np.float32, [3], -8)))
case("iobinding", "bind_input-pointer-str", OrtInvalidType, "buffer_ptr must be an int, got str",
     bind(lambda b: b.bind_input("a", "cpu", 0, np.float32, [3], "0x10")))
case("iobinding", "bind_input-device_id-str", OrtInvalidType, "device_id must be an int, got str",
     bind(lambda b: b.bind_input("a", "cpu", "0", np.float32, [3], BUFFER.ctypes.data)))
case("iobinding", "bind_input-unknown-device", OrtInvalidArgument, "unknown device 'tpu'",
     bind(lambda b: b.bind_input("a", "tpu", 0, np.float32, [3], BUFFER.ctypes.data)))
case("iobinding", "bind_input-bad-element-type", OrtInvalidType, "got 'nope'",
     bind(lambda b: b.bind_input("a", "cpu", 0, "nope", [3], BUFFER.ctypes.data)))
case("iobinding", "bind_input-other-element-type", OrtInvalidArgument, "input 'a' expects tensor(float), got a value of tensor(int32)",
     bind(lambda b: b.bind_input("a", "cpu", 0, np.int32, [3], BUFFER.ctypes.data)))
case("iobinding", "bind_input-strings-over-memory", OrtInvalidArgument, "cannot view memory as tensor(string)",
     bind(lambda b: b.bind_input("a", "cpu", 0, "tensor(string)", [3], BUFFER.ctypes.data)))
case("iobinding", "bind_output-unknown", OrtInvalidArgument, "unknown output name 'zz'", bind(lambda b: b.bind_output("zz")))
case("iobinding", "bind_output-unknown-device", OrtInvalidArgument, "unknown device 'tpu'", bind(lambda b: b.bind_output("c", "tpu")))
case("iobinding", "bind_output-type-without-pointer", OrtInvalidArgument, "output 'c': element_type and shape need a buffer_ptr",
     bind(lambda b: b.bind_output("c", element_type=np.float32)))
case("iobinding", "bind_output-pointer-without-shape", OrtInvalidArgument, "output 'c': a buffer_ptr needs element_type and shape",
     bind(lambda b: b.bind_output("c", buffer_ptr=BUFFER.ctypes.data)))
case("iobinding", "bind_output-null-pointer", OrtInvalidArgument, "output 'c': buffer_ptr must not be 0",
     bind(lambda b: b.bind_output("c", element_type=np.float32, shape=[3], buffer_ptr=0)))
case("iobinding", "bind_output-pointer-str", OrtInvalidType, "buffer_ptr must be an int, got str",
     bind(lambda b: b.bind_output("c", element_type=np.float32, shape=[3], buffer_ptr="x")))
case("iobinding", "bind_output-device_id-str", OrtInvalidType, "device_id must be an int, got str",
     bind(lambda b: b.bind_output("c", "cpu", "0")))
case("iobinding", "bind_output-buffer-of-other-type", OrtInvalidArgument, "output 'c' is tensor(float), got a value of tensor(int32)",
     bind(lambda b: b.bind_output("c", "cpu", 0, np.int32, [3], BUFFER.ctypes.data)))
case("iobinding", "bind_ortvalue_output-read-only", OrtInvalidArgument, "output 'c': the value views read-only memory",
     bind(lambda b: b.bind_ortvalue_output("c", _readonly_value())))
case("iobinding", "bind_ortvalue_output-ndarray", OrtInvalidType, "output 'c' must be an ortagent.OrtValue",
     bind(lambda b: b.bind_ortvalue_output("c", F3)))
case("iobinding", "bind_ortvalue_output-other-type", OrtInvalidArgument, "output 'c' is tensor(float), got a value of tensor(double)",
     bind(lambda b: b.bind_ortvalue_output("c", from_numpy(np.ones(3)))))
case("iobinding", "run-input-not-bound", OrtInvalidArgument, "required inputs ['b'] are not bound",
     run_bound(lambda b: (b.bind_cpu_input("a", F3), b.bind_output("c"))))
case("iobinding", "run-no-output-bound", OrtInvalidArgument, "no outputs bound", run_bound(_inputs))
case("iobinding", "run-preallocated-output-wrong-extent", OrtInvalidArgument, "invalid dimensions for output: c",
     run_bound(lambda b: (_inputs(b), b.bind_ortvalue_output("c", from_numpy(np.ones(4, np.float32))))))
case("iobinding", "run-run_options-str", OrtInvalidType, "run_options must be ortagent.RunOptions",
     run_bound(lambda b: (_inputs(b), b.bind_output("c")), "fast"))
case("iobinding", "run-binding-of-another-session", OrtInvalidArgument, "belongs to another session",
     lambda w: w.add.run_with_iobinding(w.overridable.io_binding()))
case("iobinding", "run-not-a-binding", OrtInvalidType, "iobinding must be an ortagent.IOBinding", lambda w: w.add.run_with_iobinding(None))


def _closed_binding(w):
    binding = w.add.io_binding()
    binding.close()
    return binding


case("iobinding", "closed-run", ObjectClosedError, "IOBinding has been closed", lambda w: w.add.run_with_iobinding(_closed_binding(w)))
case("iobinding", "closed-bind", ObjectClosedError, "IOBinding has been closed", lambda w: _closed_binding(w).bind_cpu_input("a", F3))
case("iobinding", "closed-get_outputs", ObjectClosedError, "IOBinding has been closed", lambda w: _closed_binding(w).get_outputs())
case("iobinding", "session-closed", ObjectClosedError, "InferenceSession has been closed",
     lambda w: _binding_of_closed_session().bind_cpu_input("a", F3))


def _binding_of_closed_session():
    session = Session(models.add(shape=(3,)))
    binding = session.io_binding()
    session.close()
    return binding


case("iobinding", "constructor-none", OrtInvalidType, "IOBinding needs an ortagent.InferenceSession, got NoneType",
     lambda w: ortagent.IOBinding(None))
case("iobinding", "pickle", OrtInvalidType, "IOBinding cannot be pickled", bind(lambda b: pickle.dumps(b)))

# ---- DLPack: export -------------------------------------------------------------------------------


def export(value_maker, **kwargs):
    def call(w):
        value_maker().__dlpack__(**kwargs)
    return call


def f23():
    return from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))


for kwargs, fragment in [
    (dict(stream=5), "stream must be None (or -1) for a CPU tensor, got 5"),
    (dict(stream="s"), "stream must be None or an int, got str"),
    (dict(stream=True), "stream must be None or an int, got bool"),
    (dict(max_version="1.0"), "max_version must be a (major, minor) tuple, got '1.0'"),
    (dict(max_version=(1,)), "got (1,)"),
    (dict(max_version=("a", 0)), "got ('a', 0)"),
    (dict(dl_device=(2, 0)), "cannot export a kDLCPU:0 tensor to kDLCUDA:0"),
    (dict(dl_device=(1, 1)), "to kDLCPU:1"),
    (dict(dl_device="cpu"), "dl_device must be a (device type, device id) tuple, got 'cpu'"),
    (dict(dl_device=(1.0, 0)), "got (1.0, 0)"),
    (dict(copy="yes"), "copy must be True, False or None, got 'yes'"),
    (dict(copy=1), "got 1"),
]:
    case("dlpack", f"export-{'-'.join(f'{k}={v!r}' for k, v in kwargs.items())}", DLPackError, fragment, export(f23, **kwargs))
case("dlpack", "is-uint8-not-a-capsule", OrtInvalidType, "expected a DLPack capsule, got str",
     lambda w: ortagent.is_dlpack_uint8_tensor("dltensor"))


def _consumed_capsule():
    capsule = np.ones(2, np.uint8).__dlpack__()
    ortagent.OrtValue.from_dlpack(capsule)
    return capsule


case("dlpack", "is-uint8-consumed-capsule", DLPackError, "not an unconsumed DLPack capsule",
     lambda w: ortagent.is_dlpack_uint8_tensor(_consumed_capsule()))
case("dlpack", "export-read-only-legacy-without-copy", DLPackError, "read-only memory", export(_readonly_value, copy=False))
case("dlpack", "export-strings", DLPackError, "tensor(string) has no DLPack data type",
     export(lambda: from_numpy(np.array(["a"], dtype=object))))
case("dlpack", "export-float8", DLPackError, "tensor(float8e4m3fn) has no DLPack data type", export(lambda: from_shape([2], 17)))
case("dlpack", "export-int4", DLPackError, "tensor(int4) has no DLPack data type", export(lambda: from_shape([2], 22)))

# ---- DLPack: import from producers ------------------------------------------------------------------


def _consumed(versioned):
    capsule = f23().__dlpack__(max_version=(1, 0) if versioned else None)
    ortagent.from_dlpack(capsule)
    return capsule


class _Raises:
    def __init__(self, exc):
        self.exc = exc

    def __dlpack__(self, **kwargs):
        raise self.exc


class _Returns:
    def __init__(self, result, device=None):
        self.result, self.device = result, device

    def __dlpack__(self, **kwargs):
        return self.result

    def __dlpack_device__(self):
        if isinstance(self.device, Exception):
            raise self.device
        return self.device


BASE = np.arange(24, dtype=np.float32).reshape(4, 6)
case("dlpack", "import-consumed-legacy-capsule", DLPackError, "already consumed (its name is 'used_dltensor')",
     lambda w: ortagent.from_dlpack(_consumed(False)))
case("dlpack", "import-consumed-versioned-capsule", DLPackError, "'used_dltensor_versioned'",
     lambda w: ortagent.from_dlpack(_consumed(True)))
case("dlpack", "import-not-a-producer", OrtInvalidType, "list does not support DLPack", lambda w: ortagent.from_dlpack([1, 2]))
case("dlpack", "import-capsule-with-stream", DLPackError, "stream cannot be applied to a DLPack capsule",
     lambda w: ortagent.from_dlpack(f23().__dlpack__(), stream=1))
case("dlpack", "import-transposed", DLPackError, "shape [6, 4] has strides [1, 6]", lambda w: ortagent.from_dlpack(BASE.T))
case("dlpack", "import-sliced", DLPackError, "shape [4, 3] has strides [6, 2]", lambda w: ortagent.from_dlpack(BASE[:, ::2]))
case("dlpack", "import-reversed", DLPackError, "has strides [-6, 1]", lambda w: ortagent.from_dlpack(BASE[::-1]))
case("dlpack", "import-numpy-refuses-datetime", DLPackError, "ndarray.__dlpack__ failed",
     lambda w: ortagent.from_dlpack(np.zeros(3, "datetime64[s]")))
case("dlpack", "import-complex", DLPackError, "kDLComplex with 64 bits", lambda w: ortagent.from_dlpack(np.zeros(2, np.complex64)))
case("dlpack", "import-producer-raises-KeyError", DLPackError, "_Raises.__dlpack__ failed: KeyError",
     lambda w: ortagent.from_dlpack(_Raises(KeyError("k"))))
case("dlpack", "import-producer-raises-OverflowError", DLPackError, "OverflowError",
     lambda w: ortagent.from_dlpack(_Raises(OverflowError("big"))))
case("dlpack", "import-producer-returns-int", DLPackError, "__dlpack__ returned a int, not a DLPack capsule",
     lambda w: ortagent.from_dlpack(_Returns(42)))
case("dlpack", "import-foreign-capsule", DLPackError, "its name is 'not_dlpack'", lambda w: ortagent.from_dlpack(foreign_capsule()))
case("dlpack", "import-device-one-tuple", DLPackError, "__dlpack_device__() must return a (device type, device id) pair of ints, got (1,)",
     lambda w: ortagent.from_dlpack(_Returns(None, (1,)), stream=1))
case("dlpack", "import-device-empty-tuple", DLPackError, "got ()", lambda w: ortagent.from_dlpack(_Returns(None, ()), stream=1))
case("dlpack", "import-device-string", DLPackError, "got 'cpu'", lambda w: ortagent.from_dlpack(_Returns(None, "cpu"), stream=1))
case("dlpack", "import-device-out-of-range", DLPackError, "out-of-range device",
     lambda w: ortagent.from_dlpack(_Returns(None, (2**40, 0)), stream=1))
case("dlpack", "import-device-unsupported", DLPackError, "kDLOpenCL:0 is not supported",
     lambda w: ortagent.from_dlpack(_Returns(None, (KDL_OPENCL, 0)), stream=1))
case("dlpack", "import-device-raises", DLPackError, "__dlpack_device__ failed: ValueError",
     lambda w: ortagent.from_dlpack(_Returns(None, ValueError("no device")), stream=1))

# ---- DLPack: hand-made capsules the importer must refuse, leaving them to their producer ----------


def refused(**spec):
    def call(w):
        args = dict(data=BUFFER.ctypes.data, shape=[4, 4])
        args.update(spec)
        producer = Producer(**args)
        capsule = producer.capsule()
        name = capsule_name(capsule)
        try:
            ortagent.from_dlpack(capsule)
        finally:
            kept = capsule_name(capsule) == name
            del capsule
            if not kept or producer.deleted != 1:
                raise AssertionError(f"a refused capsule must stay with its producer (renamed: {not kept}, "
                                     f"deleter calls: {producer.deleted})")
    return call


for id, spec, fragment in [
    ("four-lanes", dict(dtype=(KDL_FLOAT, 32, 4)), "kDLFloat with 32 bits and 4 lanes is not supported"),
    ("float-8-bits", dict(dtype=(KDL_FLOAT, 8, 1)), "kDLFloat with 8 bits"),
    ("bool-1-bit", dict(dtype=(KDL_BOOL, 1, 1)), "kDLBool with 1 bits"),
    ("bfloat-32-bits", dict(dtype=(KDL_BFLOAT, 32, 1)), "kDLBfloat with 32 bits"),
    ("int4", dict(dtype=(KDL_INT, 4, 1)), "kDLInt with 4 bits"),
    ("opaque-handle", dict(dtype=(KDL_OPAQUE, 64, 1)), "kDLOpaqueHandle"),
    ("dtype-code-99", dict(dtype=(99, 8, 1)), "code 99 with 8 bits"),
    ("rocm-device", dict(device=(KDL_ROCM, 0)), "kDLROCM:0 is not supported"),
    ("vulkan-device", dict(device=(KDL_VULKAN, 1)), "kDLVulkan:1"),
    ("negative-device-id", dict(device=(KDL_CPU, -1)), "invalid DLPack device id -1"),
    ("negative-extent", dict(shape=[4, -4]), "negative extent: shape [4, -4]"),
    ("null-shape", dict(null_shape=True), "malformed DLPack tensor (ndim 2, shape NULL)"),
    ("negative-ndim", dict(ndim=-1), "malformed DLPack tensor (ndim -1"),
    ("misaligned-data", dict(data=BUFFER.ctypes.data + 2), "is not aligned to its 4-byte elements"),
    ("misaligned-byte-offset", dict(byte_offset=1), "is not aligned"),
    ("null-data", dict(data=0), "shape [4, 4] has a NULL data pointer"),
    ("too-large", dict(shape=[2**62, 2**62]), "too large to address"),
    ("column-major", dict(strides=[1, 4]), "has strides [1, 4]"),
    ("future-major-version", dict(version=(2, 0)), "DLPack 2.0 tensors are not supported"),
    ("legacy-null-data", dict(data=0, versioned=False), "NULL data pointer"),
]:
    case("dlpack", f"capsule-{id}", DLPackError, fragment, refused(**spec))

# ---- TrainingAgent: graphs and constructors --------------------------------------------------------

Agent = ortagent.TrainingAgent


def _training_graph(mutate) -> bytes:
    model = tg.mul_add_case().model
    mutate(model)
    return model.SerializeToString()


def _yield(model):
    return next(node for node in model.graph.node if node.op_type == "YieldOp")


def _attribute(model, name, values):
    node = _yield(model)
    for attribute in list(node.attribute):
        if attribute.name == name:
            node.attribute.remove(attribute)
    if values is not None:
        node.attribute.append(helper.make_attribute(name, values))


GRAPHS = [
    ("no-yield", lambda m: _set(_yield(m), op_type="Identity", domain=""), "has no com.microsoft:YieldOp"),
    ("yield-in-default-domain", lambda m: _set(_yield(m), domain=""), "must be in domain 'com.microsoft'"),
    ("two-yields", lambda m: m.graph.node.append(tg.yield_node(["xw"], ["xw_grad"], [0], name="second")), "2 YieldOp nodes"),
    ("full_shape_outputs-missing", lambda m: _attribute(m, "full_shape_outputs", None), "lacks the required attribute 'full_shape_outputs'"),
    ("full_shape_outputs-out-of-range", lambda m: _attribute(m, "full_shape_outputs", [9]), "'full_shape_outputs' has index 9, out of range"),
    ("full_shape_outputs-floats", lambda m: _attribute(m, "full_shape_outputs", [0.5]), "must be a list of ints, it is of type FLOATS"),
    ("non_differentiable-negative", lambda m: _attribute(m, "non_differentiable_outputs", [-1]), "has the negative index -1"),
    ("gradient-count", lambda m: _yield(m).output.append("extra_grad"), "needs 1 output(s) (gradients), but it has 2"),
    ("cycle", lambda m: m.graph.node[0].input.__setitem__(0, "out"), "has a cycle"),
    ("forward-reads-a-gradient", lambda m: m.graph.node[1].input.__setitem__(1, "out_grad"), "depends on the YieldOp output 'out_grad'"),
    ("undefined-graph-output", lambda m: m.graph.output.append(tg.tensor("ghost", np.float64, [1])), "graph output 'ghost' cannot be computed"),
    ("undefined-module-output", lambda m: _yield(m).input.__setitem__(0, "nothing"), "module output 'nothing' (a YieldOp input) cannot be computed"),
    ("duplicate-graph-input", lambda m: m.graph.input.append(copy.deepcopy(m.graph.input[0])), "graph input 'x' is listed more than once"),
    ("value-produced-twice", lambda m: m.graph.node.append(helper.make_node("Identity", ["x"], ["xw"])), "value 'xw' is produced twice"),
    ("no-graph-outputs", lambda m: m.graph.ClearField("output"), "the training graph has no outputs"),
]
for id, mutate, fragment in GRAPHS:
    case("agents", f"graph-{id}", TrainingGraphError, fragment, lambda w, mutate=mutate: Agent(_training_graph(mutate)))
case("agents", "graph-unknown-op-in-backward", OrtInvalidGraph, "No Op registered for NoSuchOp",
     lambda w: Agent(_training_graph(lambda m: _set(m.graph.node[-1], op_type="NoSuchOp"))))
case("agents", "graph-garbage-bytes", OrtInvalidProtobuf, "not a serialized ONNX model", lambda w: Agent(b"\x08garbage\xff"))
case("agents", "graph-missing-file", OrtNoSuchFile, "no ONNX model file at '/nonexistent/training.onnx'",
     lambda w: Agent("/nonexistent/training.onnx"))
case("agents", "graph-int", OrtInvalidType, "got int", lambda w: Agent(42))
case("agents", "constructor-unknown-keyword", OrtInvalidType, "unexpected arguments ['bogus']", lambda w: Agent(w.training_model, bogus=1))
case("agents", "constructor-too-many-positional", OrtInvalidType, "positional arguments",
     lambda w: Agent(w.training_model, *([None] * 12)))
case("agents", "constructor-unknown-provider", ProviderError, "'NoSuchExecutionProvider'",
     lambda w: Agent(w.training_model, providers=["NoSuchExecutionProvider"]))
case("agents", "constructor-session_options-str", OrtInvalidType, "sess_options must be ortagent.SessionOptions",
     lambda w: Agent(w.training_model, session_options="fast"))


def kw1192(**changes):
    def call(w):
        names = {**dict(fw_feed_names=["x", "w", "bias"], fw_outputs_device_info=["cpu"],
                        bw_fetches_names=["x_grad", "w_grad", "bias_grad"], bw_outputs_device_info=["cpu"] * 3),
                 **changes}
        Agent(w.training_model, **names)
    return call


def state7(position, value):
    def call(w):
        names = [["x", "w", "bias"], ["out"], ["cpu"], ["out_grad"], ["x_grad", "w_grad", "bias_grad"], ["cpu"] * 3]
        names[position] = value
        Agent(w.training_model, *names)
    return call


case("agents", "kw1192-fw_feed_names-unknown", OrtInvalidArgument, "fw_feed_names: 'zz' is not a graph input",
     kw1192(fw_feed_names=["x", "w", "zz"]))
case("agents", "kw1192-fw_feed_names-string", OrtInvalidType, "fw_feed_names must be a list of names, got str", kw1192(fw_feed_names="x"))
case("agents", "kw1192-fw_feed_names-int-item", OrtInvalidType, "fw_feed_names must hold str names, got 3",
     kw1192(fw_feed_names=["x", "w", 3]))
case("agents", "kw1192-fw_feed_names-twice", OrtInvalidArgument, "fw_feed_names lists a name twice",
     kw1192(fw_feed_names=["x", "x", "w", "bias"]))
case("agents", "kw1192-fw_feed_names-missing", OrtInvalidArgument, "lacks graph inputs the graph reads: ['bias']",
     kw1192(fw_feed_names=["x", "w"]))
case("agents", "kw1192-fw_outputs_device_info-short", OrtInvalidArgument, "fw_outputs_device_info has 0 entries for 1 fetches",
     kw1192(fw_outputs_device_info=[]))
case("agents", "kw1192-fw_outputs_device_info-unknown", OrtInvalidArgument, "unknown device 'tpu'",
     kw1192(fw_outputs_device_info=["tpu"]))
case("agents", "kw1192-fw_outputs_device_info-cuda-on-cpu", OrtInvalidArgument, "needs the CUDAExecutionProvider",
     kw1192(fw_outputs_device_info=["cuda"]))
case("agents", "kw1192-bw_fetches_names-unknown", OrtInvalidArgument, "bw_fetches_names: 'zz' is not a graph output",
     kw1192(bw_fetches_names=["zz"], bw_outputs_device_info=["cpu"]))
case("agents", "kw1192-bw_outputs_device_info-short", OrtInvalidArgument, "bw_outputs_device_info has 1 entries for 3 fetches",
     kw1192(bw_outputs_device_info=["cpu"]))
case("agents", "kw1192-bw_outputs_device_info-object", OrtInvalidType, "as a device",
     kw1192(bw_outputs_device_info=["cpu", "cpu", object()]))
case("agents", "state7-fw_fetches_names-unknown", OrtInvalidArgument, "fw_fetches_names: 'zz' is not a module output", state7(1, ["zz"]))
case("agents", "state7-bw_feed_names-unknown", OrtInvalidArgument, "bw_feed_names: 'zz' is not a YieldOp output", state7(3, ["zz"]))
case("agents", "state7-bw_feed_names-incomplete", OrtInvalidArgument, "bw_feed_names must list every YieldOp output once",
     state7(3, []))

# ---- training graphs built from forward models (ortagent.training) --------------------------------

from ortagent.training import build_training_graph  # noqa: E402

MLP = models.mlp()
for id, kwargs, error, fragment in [
    ("trainable-unknown", dict(trainable=["zz"]), OrtInvalidArgument, "trainable 'zz' is neither an initializer"),
    ("trainable-string", dict(trainable="w0"), OrtInvalidType, "trainable must be a list of names, got str"),
    ("trainable-none", dict(trainable=None), OrtInvalidType, "trainable must be a list of names, got NoneType"),
    ("trainable-int-item", dict(trainable=["w0", 3]), OrtInvalidType, "trainable must hold str names, got 3"),
    ("trainable-twice", dict(trainable=["w0", "w0"]), OrtInvalidArgument, "trainable lists 'w0' more than once"),
    ("nothing-to-differentiate", dict(trainable=[]), OrtInvalidArgument, "nothing to differentiate"),
    ("input_gradients-unknown", dict(trainable=["w0"], input_gradients=["zz"]), OrtInvalidArgument,
     "input_gradients names 'zz', which is not a user input"),
    ("input_gradients-string", dict(trainable=["w0"], input_gradients="x"), OrtInvalidType,
     "input_gradients must be a list of names, got str"),
    ("user_inputs-string", dict(trainable=["w0"], user_inputs="x"), OrtInvalidType, "user_inputs must be a list of names"),
    ("user_inputs-unknown", dict(trainable=["w0"], user_inputs=["zz"]), OrtInvalidArgument, "missing: ['x']"),
    ("non_differentiable_outputs-out-of-range", dict(trainable=["w0"], non_differentiable_outputs=[5]), OrtInvalidArgument,
     "non_differentiable_outputs index 5 is out of range"),
    ("non_differentiable_outputs-str-item", dict(trainable=["w0"], non_differentiable_outputs=["0"]), OrtInvalidType,
     "non_differentiable_outputs must hold int indices, got '0'"),
    ("full_shape_outputs-string", dict(trainable=["w0"], full_shape_outputs="0"), OrtInvalidType,
     "full_shape_outputs must be a list of output indices, got str"),
    ("full_shape_outputs-negative", dict(trainable=["w0"], full_shape_outputs=[-1]), OrtInvalidArgument,
     "full_shape_outputs index -1 is out of range"),
    ("ir_version-str", dict(trainable=["w0"], ir_version="10"), OrtInvalidType, "ir_version must be an int, got str"),
    ("ir_version-negative", dict(trainable=["w0"], ir_version=-1), OrtInvalidArgument, "ir_version must be 3 or newer"),
]:
    case("agents", f"build_training_graph-{id}", error, fragment, lambda w, kwargs=kwargs: build_training_graph(MLP, **kwargs))
case("agents", "build_training_graph-string-input-gradient", OrtInvalidArgument, "user input 's' has element type STRING",
     lambda w: build_training_graph(models.strings(), [], input_gradients=["s"]))
case("agents", "build_training_graph-garbage-bytes", OrtInvalidProtobuf, "not a serialized ONNX model",
     lambda w: build_training_graph(b"\x08garbage\xff", ["w0"]))
case("agents", "build_training_graph-already-a-training-graph", OrtInvalidArgument, "already contains a YieldOp",
     lambda w: build_training_graph(w.training_model, ["w"]))

# ---- TrainingAgent: the state API -----------------------------------------------------------------


def _values(w, feeds=None):
    feeds = feeds or w.training_feeds()
    return [from_numpy(feeds[n]) for n in ("x", "w", "bias")]


def forward(agent_name, feeds=None, fetches=None, state=None):
    def call(w):
        agent = getattr(w, agent_name)
        agent.run_forward(feeds(w) if callable(feeds) else _values(w), [] if fetches is None else fetches,
                          PartialGraphExecutionState() if state is None else state)
    return call


def resumed_after(agent_name, action):
    """Forward a run, let `action(agent, state)` fail, then resume the same state with valid
    gradients: the failure must leave the run resumable, with the right gradients."""
    def call(w):
        agent = getattr(w, agent_name)
        feeds = w.training_feeds()
        state = PartialGraphExecutionState()
        agent.run_forward(_values(w, feeds), [], state)
        try:
            action(agent, state)
        finally:
            grad = np.full((2, 3), 0.5)
            results: list = []
            try:
                agent.run_backward([from_numpy(grad)], results, state)
            except ortagent.OrtError as exc:
                raise AssertionError(f"the run is not resumable after the error: {exc!r}") from None
            for got, want in zip(results, w.case.reference_gradients(feeds, [grad])):
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    return call


def _backward(grads, fetches=None):
    def action(agent, state):
        agent.run_backward(grads() if callable(grads) else grads, [] if fetches is None else fetches, state)
    return action


def _finished_state(w, agent_name, release=False):
    agent = getattr(w, agent_name)
    state = PartialGraphExecutionState()
    agent.run_forward(_values(w), [], state)
    if release:
        state.release()
    else:
        agent.run_backward([np.ones((2, 3))], [], state)
    return state


G = np.ones((2, 3))
for form in ("agent_state7", "agent_kw1192"):
    tag = form.removeprefix("agent_")
    case("agents", f"{tag}-forward-state-none", OrtInvalidType, "needs an ortagent.PartialGraphExecutionState, got NoneType",
         lambda w, form=form: getattr(w, form).run_forward(_values(w), [], None))
    case("agents", f"{tag}-forward-fetches-tuple", OrtInvalidType, "fetches must be a list (filled in place), got tuple",
         forward(form, fetches=()))
    case("agents", f"{tag}-forward-feeds-dict", OrtInvalidType, "feeds must be a list of OrtValues", forward(form, feeds=lambda w: {"x": 1}))
    case("agents", f"{tag}-forward-feeds-count", OrtInvalidArgument, "expected 3 feeds (fw_feed_names), got 2",
         forward(form, feeds=lambda w: _values(w)[:2]))
    case("agents", f"{tag}-forward-ndarray-wrong-dtype", OrtInvalidArgument, "input 'x' expects tensor(double), got a NumPy array of float32",
         forward(form, feeds=lambda w: [np.ones((2, 3), np.float32)] + _values(w)[1:]))
    case("agents", f"{tag}-forward-ortvalue-wrong-dtype", OrtInvalidArgument,
         "input 'x' expects tensor(double), got an OrtValue of tensor(float)",
         forward(form, feeds=lambda w: [from_numpy(np.ones((2, 3), np.float32))] + _values(w)[1:]))
    case("agents", f"{tag}-forward-wrong-extent", OrtInvalidArgument, "invalid dimensions for input: x",
         forward(form, feeds=lambda w: [from_numpy(np.ones((3, 3)))] + _values(w)[1:]))
    case("agents", f"{tag}-forward-feed-none", OrtInvalidType, "input 'x' must be a numpy.ndarray or an OrtValue, got NoneType",
         forward(form, feeds=lambda w: [None] + _values(w)[1:]))
    case("agents", f"{tag}-forward-feed-closed", ObjectClosedError, "OrtValue has been released",
         forward(form, feeds=lambda w: [_closed_value(np.ones((2, 3)))] + _values(w)[1:]))
    case("agents", f"{tag}-backward-before-forward", RunStateError, "run_forward must come first",
         lambda w, form=form: getattr(w, form).run_backward([G], [], PartialGraphExecutionState()))
    case("agents", f"{tag}-forward-state-reused", RunStateError, "create a new one for each run",
         lambda w, form=form: getattr(w, form).run_forward(_values(w), [], _finished_state(w, form)))
    case("agents", f"{tag}-backward-twice", RunStateError, "this run is finished",
         lambda w, form=form: getattr(w, form).run_backward([G], [], _finished_state(w, form)))
    case("agents", f"{tag}-backward-released", RunStateError, "this run is finished",
         lambda w, form=form: getattr(w, form).run_backward([G], [], _finished_state(w, form, release=True)))
    case("agents", f"{tag}-backward-gradient-count", OrtInvalidArgument, "expected 1 gradients (one per YieldOp output: ['out_grad']), got 2",
         resumed_after(form, _backward([G, G])))
    case("agents", f"{tag}-backward-gradient-dtype", OrtInvalidArgument, "gradient 0 (for output 'out') must be tensor(double), got tensor(float)",
         resumed_after(form, _backward([G.astype(np.float32)])))
    case("agents", f"{tag}-backward-gradient-shape", OrtInvalidArgument, "must have the output's full shape [2, 3], got [3, 2]",
         resumed_after(form, _backward([np.ones((3, 2))])))
    case("agents", f"{tag}-backward-scalar-for-full-shape", OrtInvalidArgument, "full shape [2, 3], got []",
         resumed_after(form, _backward([np.ones(())])))
    case("agents", f"{tag}-backward-gradient-str", OrtInvalidType, "gradient 0 (for output 'out') must be an OrtValue or a numpy.ndarray, got str",
         resumed_after(form, _backward(["g"])))
    case("agents", f"{tag}-backward-gradients-dict", OrtInvalidType, "the gradients must be a list", resumed_after(form, _backward({"out_grad": G})))
    case("agents", f"{tag}-backward-fetches-tuple", OrtInvalidType, "fetches must be a list", resumed_after(form, _backward([G], ())))
case("agents", "state-of-another-agent", RunStateError, "belongs to another TrainingAgent",
     resumed_after("agent_kw1192", lambda agent, state: _other_agent_backward(state)))


def _other_agent_backward(state):
    other = Agent(tg.mul_add_case().model.SerializeToString(), **dict(
        fw_feed_names=["x", "w", "bias"], fw_outputs_device_info=["cpu"],
        bw_fetches_names=["x_grad", "w_grad", "bias_grad"], bw_outputs_device_info=["cpu"] * 3))
    other.run_backward([G], [], state)


case("agents", "state-pickle", OrtInvalidType, "PartialGraphExecutionState cannot be pickled",
     lambda w: pickle.dumps(PartialGraphExecutionState()))
case("agents", "agent-pickle", OrtInvalidType, "TrainingAgent cannot be pickled", lambda w: pickle.dumps(w.agent_kw1192))


def _closed_agent(w, *args, **kwargs):
    agent = Agent(w.training_model, *args, **kwargs)
    agent.close()
    return agent


case("agents", "closed-forward", ObjectClosedError, "TrainingAgent has been closed",
     lambda w: _closed_agent(w, **dict(fw_feed_names=["x", "w", "bias"], fw_outputs_device_info=["cpu"],
                                       bw_fetches_names=["x_grad"], bw_outputs_device_info=["cpu"]))
     .run_forward(_values(w), [], PartialGraphExecutionState()))

# ---- TrainingAgent: the run-id API ------------------------------------------------------------------


def rid_bind(action):
    def call(w):
        action(w.agent_run_id.io_binding())
    return call


def _bound(w, feeds=None, agent=None):
    agent = agent or w.agent_run_id
    feeds = feeds or w.training_feeds()
    binding = agent.io_binding()
    for name in ("x", "w", "bias"):
        binding.bind_cpu_input(name, feeds[name])
    return binding


def pending(action):
    """Forward a run-id run, let `action(agent, run_id, binding)` fail, then resume the run with
    valid gradients: it must still be waiting, and give the right gradients."""
    def call(w):
        agent = w.agent_run_id
        feeds = w.training_feeds()
        binding = _bound(w, feeds)
        _, run_id = agent.run_forward(binding, None)
        try:
            action(agent, run_id, binding)
        finally:
            binding.clear_binding_outputs()
            grad = np.full((2, 3), 0.25)
            try:
                agent.run_backward([grad], run_id)
            except ortagent.OrtError as exc:
                raise AssertionError(f"the run is not resumable after the error: {exc!r}") from None
            for got, want in zip(binding.get_outputs(), w.case.reference_gradients(feeds, [grad])):
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    return call


def _finished_run(w, release=False):
    binding = _bound(w)
    _, run_id = w.agent_run_id.run_forward(binding, None)
    if release:
        w.agent_run_id.release_run(run_id)
    else:
        w.agent_run_id.run_backward([G], run_id)
    return run_id


case("agents", "run_id-bind-unknown-input", OrtInvalidArgument, "unknown input name 'zz'",
     rid_bind(lambda b: b.bind_cpu_input("zz", G)))
case("agents", "run_id-bind-wrong-dtype", OrtInvalidArgument, "input 'x'", rid_bind(lambda b: b.bind_cpu_input("x", G.astype(np.float32))))
case("agents", "run_id-bind-ortvalue-ndarray", OrtInvalidType, "input 'x' must be an OrtValue, got ndarray",
     rid_bind(lambda b: b.bind_ortvalue_input("x", G)))
case("agents", "run_id-bind_input-null-pointer", OrtInvalidArgument, "input 'x': buffer_ptr must not be 0",
     rid_bind(lambda b: b.bind_input("x", "cpu", 0, np.float64, [2, 3], 0)))
case("agents", "run_id-bind_input-device_id-str", OrtInvalidType, "device_id must be an int, got str",
     rid_bind(lambda b: b.bind_input("x", "cpu", "0", np.float64, [2, 3], BUFFER.ctypes.data)))
case("agents", "run_id-bind_input-pointer-str", OrtInvalidType, "buffer_ptr must be an int, got str",
     rid_bind(lambda b: b.bind_input("x", "cpu", 0, np.float64, [2, 3], "0x10")))
case("agents", "run_id-bind_output-unknown", OrtInvalidArgument, "unknown output name 'zz'", rid_bind(lambda b: b.bind_output("zz")))
case("agents", "run_id-bind_output-cuda-on-cpu", OrtInvalidArgument, "output 'x_grad': OrtDevice('cuda:0') needs the CUDAExecutionProvider",
     rid_bind(lambda b: b.bind_output("x_grad", "cuda")))
case("agents", "run_id-bind_output-unknown-device", OrtInvalidArgument, "unknown device 'tpu'",
     rid_bind(lambda b: b.bind_output("x_grad", "tpu")))
case("agents", "run_id-bind_output-null-pointer", OrtInvalidArgument, "output 'x_grad': buffer_ptr must not be 0",
     rid_bind(lambda b: b.bind_output("x_grad", element_type=np.float64, shape=[2, 3], buffer_ptr=0)))
case("agents", "run_id-bind_output-pointer-str", OrtInvalidType, "buffer_ptr must be an int, got str",
     rid_bind(lambda b: b.bind_output("x_grad", element_type=np.float64, shape=[2, 3], buffer_ptr="x")))
case("agents", "run_id-bind_ortvalue_output-other-type", OrtInvalidArgument,
     "output 'x_grad' is tensor(double), got a value of tensor(float)",
     rid_bind(lambda b: b.bind_ortvalue_output("x_grad", from_numpy(np.ones((2, 3), np.float32)))))
case("agents", "run_id-bind_output-buffer-of-other-type", OrtInvalidArgument,
     "output 'x_grad' is tensor(double), got a value of tensor(int32)",
     rid_bind(lambda b: b.bind_output("x_grad", "cpu", 0, np.int32, [2, 3], BUFFER.ctypes.data)))
case("agents", "run_id-bind_ortvalue_output-ndarray", OrtInvalidType, "output 'x_grad' must be an OrtValue, got ndarray",
     rid_bind(lambda b: b.bind_ortvalue_output("x_grad", G)))
case("agents", "run_id-forward-inputs-not-bound", OrtInvalidArgument, "inputs ['x', 'w', 'bias'] of the training graph are not bound",
     lambda w: w.agent_run_id.run_forward(w.agent_run_id.io_binding(), None))
case("agents", "run_id-forward-run_options-str", OrtInvalidType, "run_options must be ortagent.RunOptions, got str",
     lambda w: w.agent_run_id.run_forward(_bound(w), "fast"))
case("agents", "run_id-forward-with-state", OrtInvalidType, "run_forward(iobinding, run_options) takes no state",
     lambda w: w.agent_run_id.run_forward(_bound(w), None, PartialGraphExecutionState()))
case("agents", "run_id-forward-binding-of-another-agent", OrtInvalidArgument, "this binding belongs to another TrainingAgent",
     lambda w: w.agent_run_id.run_forward(_bound(w, agent=w.agent_kw1192), None))
case("agents", "run_id-forward-session-binding", OrtInvalidType, "use agent.io_binding() for the bindings of a TrainingAgent",
     lambda w: w.agent_run_id.run_forward(w.add.io_binding(), None))
case("agents", "run_id-backward-unknown-id", UnknownRunError, "no run with id 987654 is waiting",
     lambda w: w.agent_run_id.run_backward([G], 987654))
case("agents", "run_id-backward-id-none", UnknownRunError, "no run with id None", lambda w: w.agent_run_id.run_backward([G], None))
case("agents", "run_id-backward-id-str", UnknownRunError, "no run with id 'run-1'", lambda w: w.agent_run_id.run_backward([G], "run-1"))
case("agents", "run_id-backward-twice", UnknownRunError, "already resumed, or released",
     lambda w: w.agent_run_id.run_backward([G], _finished_run(w)))
case("agents", "run_id-backward-released", UnknownRunError, "already resumed, or released",
     lambda w: w.agent_run_id.run_backward([G], _finished_run(w, release=True)))
case("agents", "run_id-release-twice", UnknownRunError, "is waiting for its backward",
     lambda w: w.agent_run_id.release_run(_finished_run(w, release=True)))
case("agents", "run_id-backward-gradient-count", OrtInvalidArgument, "expected 1 gradients",
     pending(lambda agent, run_id, b: agent.run_backward([G, G], run_id)))
case("agents", "run_id-backward-gradient-dtype", OrtInvalidArgument, "must be tensor(double), got tensor(float)",
     pending(lambda agent, run_id, b: agent.run_backward([G.astype(np.float32)], run_id)))
case("agents", "run_id-backward-gradient-none", OrtInvalidType, "gradient 0 (for output 'out')",
     pending(lambda agent, run_id, b: agent.run_backward([None], run_id)))
case("agents", "run_id-backward-preallocated-wrong-extent", OrtInvalidArgument, "invalid dimensions for output: x_grad",
     pending(lambda agent, run_id, b: (b.bind_ortvalue_output("x_grad", from_numpy(np.ones((3, 3)))),
                                       agent.run_backward([G], run_id))))
case("agents", "run_id-closed-forward", ObjectClosedError, "TrainingAgent has been closed",
     lambda w: _closed_agent(w).run_forward(_bound(w), None))
case("agents", "run_id-closed-io_binding", ObjectClosedError, "TrainingAgent has been closed", lambda w: _closed_agent(w).io_binding())


def _closed_with_pending_run(w):
    agent = Agent(w.training_model)
    _, run_id = agent.run_forward(_bound(w, agent=agent), None)
    agent.close()
    return agent, run_id


case("agents", "run_id-closed-backward-of-pending-run", ObjectClosedError, "TrainingAgent has been closed",
     lambda w: (lambda agent, run_id: agent.run_backward([G], run_id))(*_closed_with_pending_run(w)))

# ---- the matrix ---------------------------------------------------------------------------------------

HEALTH = {"options": ("options", "session"), "session": ("session",), "values": ("values", "session"),
          "iobinding": ("iobinding", "session"), "dlpack": ("dlpack", "values"), "agents": ("agents",)}


@pytest.fixture(scope="module")
def world():
    world = World()
    gc.collect()
    world.baseline = live()
    return world


def test_the_matrix_is_large_and_its_ids_distinct():
    ids = [param.id for param in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 100, len(ids)


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case: Case, world: World):
    before = settled(world.baseline)
    raised, message = None, None
    try:
        case.call(world)
    except Exception as exc:
        raised, message = type(exc), str(exc)
    assert raised is case.error, f"expected {case.error.__name__}, got {raised and raised.__name__}: {message}"
    assert case.fragment in message, f"{case.fragment!r} not in {message!r}"
    assert not changed(before, settled(before)), f"live handles changed by the error: {changed(before, live())}"
    world.check_healthy(HEALTH[case.area])
    assert not changed(before, settled(before)), f"live handles changed: {changed(before, live())}"


# ---- the loader: fresh processes ---------------------------------------------------------------------

ENTRY_POINTS = ("get_version_string", "api_version", "get_available_providers", "set_default_logger_severity",
                "SessionOptions", "RunOptions", "InferenceSession", "ortvalue_from_numpy",
                "ortvalue_from_numpy_strings", "ortvalue_from_shape_and_type",
                "ortvalue_from_shape_and_type_strings", "from_dlpack", "OrtDevice_cuda_memory", "TrainingAgent")

FAKE_LIBRARY = r"""
#include <stddef.h>
#include <stdint.h>
typedef struct { const void* (*get_api)(uint32_t); const char* (*get_version_string)(void); } base_t;
static const void* get_api(uint32_t version) { (void)version; return NULL; }
static const char* version_string(void) { return FAKE_VERSION; }
static const base_t base = { get_api, version_string };
const base_t* OrtGetApiBase(void) { return &base; }
"""


def _fake_runtime(directory, version: str | None) -> str:
    source = directory / "fake_ort.c"
    source.write_text(FAKE_LIBRARY)
    target = directory / f"libfake_ort_{'null' if version is None else version.replace('.', '_')}.so"
    define = "NULL" if version is None else json.dumps(version)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-DFAKE_VERSION={define}", "-o", str(target), str(source)],
                   check=True, capture_output=True, timeout=120)
    return str(target)


def _loader_scenarios(tmp_dir):
    """id -> (ORTAGENT_ORT_LIBRARY, entry point, expected message fragment or None for success)."""
    import ctypes.util

    not_elf = tmp_dir / "not_a_library.so"
    not_elf.write_text("this is not an ELF file\n")
    scenarios = {}
    for entry in ENTRY_POINTS:
        scenarios[f"first-call-{entry}"] = (None, entry, None)
        scenarios[f"missing-library-{entry}"] = ("/nonexistent/libonnxruntime.so.1.31.1", entry,
                                                 "/nonexistent/libonnxruntime.so.1.31.1: cannot open shared object file")
    scenarios["directory"] = (str(tmp_dir), "get_version_string", "cannot read file data")
    scenarios["not-elf"] = (str(not_elf), "InferenceSession", "not_a_library.so")
    scenarios["not-onnxruntime"] = (ctypes.util.find_library("m") or "libm.so.6", "SessionOptions",
                                    "no symbol OrtGetApiBase (not an onnxruntime library)")
    scenarios["undecodable-path"] = (os.fsdecode(b"/nonexistent/\xff\xfe.so"), "get_version_string",
                                     "/nonexistent/\ufffd\ufffd.so")
    try:
        for version, fragment in [("banana", "unrecognised onnxruntime version string 'banana'"),
                                  ("2.0.0", "unrecognised onnxruntime version string '2.0.0'"),
                                  (None, "unrecognised onnxruntime version string '?'"),
                                  ("1.5.0", "onnxruntime 1.5.0 is too old; ortagent needs onnxruntime >= 1.20"),
                                  ("1.99.0", "onnxruntime 1.99.0 refused OrtApi version")]:
            scenarios[f"fake-runtime-{version}"] = (_fake_runtime(tmp_dir, version), "InferenceSession", fragment)
    except (OSError, subprocess.SubprocessError) as exc:
        scenarios["fake-runtime-unavailable"] = (None, None, f"gcc failed: {exc}")
    old = runtimes.runtime_library("1.19.2")
    if old is not None:
        scenarios["runtime-1.19.2"] = (old, "TrainingAgent", "onnxruntime 1.19.2 is too old; ortagent needs onnxruntime >= 1.20")
    return scenarios


@pytest.fixture(scope="module")
def loader_reports(tmp_path_factory):
    tmp_dir = tmp_path_factory.mktemp("loader")
    scenarios = _loader_scenarios(tmp_dir)
    runnable = [{"id": key, "library": library, "entry": entry}
                for key, (library, entry, _) in scenarios.items() if entry is not None]
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("ORTAGENT_ORT_LIBRARY", None)
    result = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "loader_probe.py"), json.dumps(runnable)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return scenarios, json.loads(result.stdout.strip().splitlines()[-1])


LOADER_IDS = ([f"first-call-{e}" for e in ENTRY_POINTS] + [f"missing-library-{e}" for e in ENTRY_POINTS]
              + ["directory", "not-elf", "not-onnxruntime", "undecodable-path", "fake-runtime-banana",
                 "fake-runtime-2.0.0", "fake-runtime-None", "fake-runtime-1.5.0", "fake-runtime-1.99.0", "runtime-1.19.2"])


@pytest.mark.parametrize("scenario", LOADER_IDS)
def test_loader(scenario, loader_reports):
    scenarios, reports = loader_reports
    if scenario.startswith("fake-runtime") and "fake-runtime-unavailable" in scenarios:
        pytest.skip(f"cannot build a fake runtime here: {scenarios['fake-runtime-unavailable'][2]}")
    if scenario == "runtime-1.19.2" and scenario not in scenarios:
        pytest.skip(f"onnxruntime 1.19.2's library cannot be fetched here: {runtimes.last_failure.get('1.19.2')}")
    library, entry, fragment = scenarios[scenario]
    report = reports[scenario]
    assert "died" not in report and "crashed_in_python" not in report, report
    if fragment is None:
        assert report["error"] is None, f"{entry} as a first call failed: {report['error']}: {report['message']}"
    else:
        assert report["error"] == "OrtLoadError" and report["is_ort_error"], report
        assert "ORTAGENT_ORT_LIBRARY" in report["message"] and fragment in report["message"], report["message"]
        assert not any(report["live_after_error"].values()), report["live_after_error"]
    assert report["healthy"], report.get("health_error")
