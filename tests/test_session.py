"""InferenceSession, SessionOptions and RunOptions against onnxruntime's own Python module."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from ortagent_testkit import onnx_models as models
import ortagent
from conftest import reference_session
from gil_ticks import assert_releases_gil


def assert_same_outputs(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        assert a.shape == b.shape, (a.shape, b.shape)
        if a.dtype == object:
            assert a.tolist() == b.tolist()
        else:
            np.testing.assert_array_equal(a, b)


def test_add_matches_onnxruntime(ort_ref):
    model = models.add()
    rng = np.random.default_rng(0)
    feed = {"a": rng.standard_normal(16).astype(np.float32),
            "b": rng.standard_normal(16).astype(np.float32)}
    ours = ortagent.InferenceSession(model.SerializeToString()).run(None, feed)
    theirs = reference_session(ort_ref, model).run(None, feed)
    assert_same_outputs(ours, theirs)
    np.testing.assert_array_equal(ours[0], feed["a"] + feed["b"])


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_mlp_matches_onnxruntime(ort_ref, batch):
    model = models.mlp(sizes=(16, 64, 32, 8))
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    ours = ortagent.InferenceSession(model).run(["y"], {"x": x})
    theirs = reference_session(ort_ref, model).run(["y"], {"x": x})
    assert_same_outputs(ours, theirs)


def test_multi_input_output_and_output_selection(ort_ref):
    model = models.multi_io()
    rng = np.random.default_rng(1)
    feed = {"a": rng.standard_normal((3, 4)).astype(np.float32),
            "b": rng.standard_normal((3, 4)).astype(np.float32),
            "k": np.array([3], np.int32)}
    ours_session = ortagent.InferenceSession(model)
    ref = reference_session(ort_ref, model)
    assert_same_outputs(ours_session.run(None, feed), ref.run(None, feed))
    for names in (["shape"], ["prod", "scaled"], ["total", "total"]):
        assert_same_outputs(ours_session.run(names, feed), ref.run(names, feed))
    scaled, total, shape, prod = ours_session.run(None, feed)
    np.testing.assert_allclose(scaled, (feed["a"] + feed["b"]) * 3, rtol=1e-6)
    assert shape.tolist() == [3, 4]


@pytest.mark.parametrize("dtype_name", sorted(models.DTYPES))
def test_every_dtype_round_trips_like_onnxruntime(ort_ref, dtype_name):
    if dtype_name == "bfloat16":
        pytest.importorskip("ml_dtypes")
    model = models.identity(models.DTYPES[dtype_name], shape=["N", 3])
    x = models.random_array(dtype_name, (5, 3), np.random.default_rng(2))
    ours = ortagent.InferenceSession(model).run(None, {"x": x})
    if dtype_name == "bfloat16":
        theirs = [x]  # onnxruntime's Python module cannot take ml_dtypes arrays
    else:
        theirs = reference_session(ort_ref, model).run(None, {"x": x})
    assert_same_outputs(ours, theirs)
    if dtype_name != "string":
        assert ours[0].tobytes() == x.tobytes()


def test_symbolic_dimensions_metadata_and_values(ort_ref):
    model = models.symbolic_dims()
    ours = ortagent.InferenceSession(model)
    ref = reference_session(ort_ref, model)
    for mine, theirs in zip(ours.get_inputs() + ours.get_outputs(), ref.get_inputs() + ref.get_outputs()):
        assert (mine.name, mine.type, mine.shape) == (theirs.name, theirs.type, theirs.shape)
    assert ours.get_inputs()[0].shape == ["batch", "seq", 8]
    for shape in [(1, 1, 8), (2, 5, 8), (0, 3, 8)]:
        x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
        assert_same_outputs(ours.run(None, {"x": x}), ref.run(None, {"x": x}))


def test_string_tensors(ort_ref):
    model = models.strings()
    s = np.array(["Hello", "WORLD", "", "Déjà Vu", "日本"], dtype=object)
    feed = {"s": s, "lens": np.array([5], np.int64)}
    ours = ortagent.InferenceSession(model).run(None, feed)
    theirs = reference_session(ort_ref, model).run(None, feed)
    assert_same_outputs(ours, theirs)
    assert ours[1][:, 0].tolist() == s.tolist() + s[::-1].tolist()
    # numpy unicode arrays are accepted too
    ours_u = ortagent.InferenceSession(model).run(["same"], {"s": s.astype(str), "lens": feed["lens"]})
    assert ours_u[0].tolist() == s.tolist()


def test_outputs_are_views_of_ort_buffers():
    session = ortagent.InferenceSession(models.mlp())
    x = np.ones((4, 16), np.float32)
    (y,) = session.run(None, {"x": x})
    assert isinstance(y.base, ortagent.OrtValue)
    assert y.ctypes.data == y.base.data_ptr()
    assert y.flags.writeable and y.flags.c_contiguous
    (v,) = session.run_with_ort_values(None, {"x": x})
    assert v.shape() == [4, 8] and v.data_type() == "tensor(float)"
    np.testing.assert_array_equal(v.numpy(), y)


def test_non_contiguous_and_foreign_order_feeds(ort_ref):
    model = models.add(shape=[4, 4])
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    a = base[::2, ::2]                       # strided
    b = np.arange(16, dtype=">f4").reshape(4, 4)  # big-endian
    with pytest.raises(ortagent.OrtInvalidArgument):
        ortagent.InferenceSession(model).run(None, {"a": a, "b": b.astype(np.float64)})
    ours = ortagent.InferenceSession(model).run(None, {"a": a, "b": b})
    theirs = reference_session(ort_ref, model).run(None, {"a": np.ascontiguousarray(a),
                                                           "b": b.astype(np.float32)})
    assert_same_outputs(ours, theirs)


def test_ortvalue_feeds_and_numpy_scalars():
    session = ortagent.InferenceSession(models.identity(TensorProto.INT64, shape=[]))
    (y,) = session.run(None, {"x": np.int64(42)})
    assert y.shape == () and y == 42
    value = ortagent.OrtValue.ortvalue_from_numpy(np.array(7, np.int64))
    assert session.run(None, {"x": value})[0] == 7


def test_overridable_initializer_can_be_fed(ort_ref):
    model = models.overridable_initializer()
    x = np.array([1, 2, 3], np.float32)
    session = ortagent.InferenceSession(model)
    assert [a.name for a in session.get_overridable_initializers()] == ["scale"]
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x * 2)
    np.testing.assert_array_equal(session.run(None, {"x": x, "scale": np.array([5], np.float32)})[0], x * 5)
    ref = reference_session(ort_ref, model)
    assert_same_outputs(session.run(None, {"x": x, "scale": np.array([3], np.float32)}),
                        ref.run(None, {"x": x, "scale": np.array([3], np.float32)}))


def test_model_from_path_bytes_and_modelproto(tmp_path):
    model = models.add()
    path = tmp_path / "add.onnx"
    onnx.save(model, str(path))
    feed = {"a": np.ones(16, np.float32), "b": np.ones(16, np.float32)}
    for source in (str(path), path, model.SerializeToString(), model):
        np.testing.assert_array_equal(ortagent.InferenceSession(source).run(None, feed)[0], 2 * feed["a"])


def test_model_metadata(ort_ref):
    model = models.with_metadata()
    mine = ortagent.InferenceSession(model).get_modelmeta()
    theirs = reference_session(ort_ref, model).get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description", "graph_description",
                  "version", "custom_metadata_map"):
        assert getattr(mine, field) == getattr(theirs, field), field
    assert mine.custom_metadata_map == {"author": "tests", "purpose": "metadata"}


def test_providers_default_to_cpu():
    session = ortagent.InferenceSession(models.identity())
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.get_provider_options() == {"CPUExecutionProvider": {}}
    assert "CPUExecutionProvider" in ortagent.get_available_providers()


def test_session_options_are_applied_and_reported(tmp_path):
    so = ortagent.SessionOptions()
    assert so.graph_optimization_level == ortagent.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ortagent.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ortagent.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    so.enable_mem_pattern = False
    so.enable_cpu_mem_arena = False
    so.logid = "tests"
    optimized = tmp_path / "optimized.onnx"
    so.optimized_model_filepath = str(optimized)
    so.add_session_config_entry("session.use_env_allocators", "0")
    assert so.get_session_config_entry("session.use_env_allocators") == "0"
    with pytest.raises(ortagent.OrtNotFound):
        so.get_session_config_entry("no.such.key")
    session = ortagent.InferenceSession(models.mlp(), sess_options=so)
    assert session.get_session_options() is so
    assert optimized.exists() and onnx.load(str(optimized)).graph.node
    x = np.ones((2, 16), np.float32)
    assert session.run(None, {"x": x})[0].shape == (2, 8)
    # the same options object stays usable for another session
    ortagent.InferenceSession(models.identity(), sess_options=so)


def _flushes_subnormals_here() -> bool:
    """Whether this thread's floating-point unit turns subnormal operands or results into 0."""
    tiny = np.array([1e-39], np.float32)
    return bool((tiny * np.float32(1.0))[0] == 0.0)


@pytest.mark.skipif(__import__("platform").machine().lower() not in ("x86_64", "amd64", "i686", "i386"),
                    reason="onnxruntime's session.set_denormal_as_zero acts on x86 only")
def test_set_denormal_as_zero_applies_to_the_calling_thread_for_the_run():
    """onnxruntime's session.set_denormal_as_zero flushes subnormals on its pools' threads and
    on the thread that created the process's first session; with one intra-op thread a run
    computes on the thread that calls it, which kept its own setting. ortagent sets it there
    for each run of a session made with the entry (run, IoBinding, TrainingAgent) and puts
    back what the thread had: 1e-20 * 1e-20 is the subnormal 1e-40 through another session
    before and after, and 0 through this one."""
    from ortagent_testkit import training_graphs as tg

    def options(flush: bool):
        so = ortagent.SessionOptions()
        so.intra_op_num_threads = 1
        if flush:
            so.add_session_config_entry("session.set_denormal_as_zero", "1")
        return so

    case = tg.mul_add_case(np.float32)
    forward = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("Mul", ["x", "w"], ["y"])], "mul",
                               [tg.tensor("x", np.float32, [2, 3]), tg.tensor("w", np.float32, [3])],
                               [tg.tensor("y", np.float32, [2, 3])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    plain = ortagent.InferenceSession(forward, options(False))
    x = np.full((2, 3), 1e-20, np.float32)
    w = np.full(3, 1e-20, np.float32)
    (y,) = plain.run(None, {"x": x, "w": w})
    if _flushes_subnormals_here() or y[0, 0] == 0:
        pytest.skip("this thread flushes subnormals already (set before the test)")
    assert 0 < y[0, 0] < np.finfo(np.float32).tiny

    flushing = ortagent.InferenceSession(forward, options(True))
    assert np.array_equal(flushing.run(None, {"x": x, "w": w})[0], np.zeros_like(x))
    assert not _flushes_subnormals_here()
    binding = flushing.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_cpu_input("w", w)
    binding.bind_output("y")
    flushing.run_with_iobinding(binding)
    assert np.array_equal(binding.copy_outputs_to_cpu()[0], np.zeros_like(x))
    assert not _flushes_subnormals_here()

    agent = ortagent.TrainingAgent(case.model.SerializeToString(), session_options=options(True))
    state = ortagent.PartialGraphExecutionState()
    outputs: list = []
    agent.run_forward([x, w, np.zeros(3, np.float32)], outputs, state)      # x * w + 0
    assert np.array_equal(outputs[0].numpy(), np.zeros_like(x))
    gradients: list = []
    agent.run_backward([np.full((2, 3), 1e-20, np.float32)], gradients, state)
    x_grad, w_grad, bias_grad = (g.numpy() for g in gradients)
    assert np.array_equal(x_grad, np.zeros_like(x)) and np.array_equal(w_grad, np.zeros_like(w))
    assert np.array_equal(bias_grad, np.full(3, 2e-20, np.float32))      # normal numbers stay
    assert not _flushes_subnormals_here()
    agent.close()
    assert 0 < plain.run(None, {"x": x, "w": w})[0][0, 0] < np.finfo(np.float32).tiny


def test_free_dimension_override_fixes_symbolic_shape():
    so = ortagent.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 2)
    session = ortagent.InferenceSession(models.symbolic_dims(), sess_options=so)
    assert session.get_inputs()[0].shape == [2, "seq", 8]
    with pytest.raises(ortagent.OrtInvalidArgument):
        session.run(None, {"x": np.zeros((3, 1, 8), np.float32)})


def test_add_initializer_replaces_weights():
    so = ortagent.SessionOptions()
    scale = ortagent.OrtValue.ortvalue_from_numpy(np.array([10.0], np.float32))
    so.add_initializer("scale", scale)
    del scale  # kept alive by the options
    session = ortagent.InferenceSession(models.overridable_initializer(), sess_options=so)
    np.testing.assert_array_equal(session.run(None, {"x": np.ones(3, np.float32)})[0], np.full(3, 10.0))


def test_run_options_tag_and_config():
    ro = ortagent.RunOptions()
    ro.logid = "run-1"
    ro.log_severity_level = 3
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    assert ro.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    assert ro.logid == "run-1" and not ro.terminate
    session = ortagent.InferenceSession(models.identity())
    assert session.run(None, {"x": np.ones(1, np.float32)}, ro)[0][0] == 1


def test_terminate_stops_a_running_call_and_session_recovers():
    session = ortagent.InferenceSession(models.slow_loop(iterations=3000))
    x = np.eye(256, dtype=np.float32)
    ro = ortagent.RunOptions()
    errors = []

    def run():
        try:
            session.run(None, {"x": x}, ro)
        except ortagent.OrtError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.2)
    ro.terminate = True
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ortagent.OrtError)
    assert "terminat" in str(errors[0]).lower()
    ro.terminate = False
    small = ortagent.InferenceSession(models.slow_loop(iterations=2))
    assert small.run(None, {"x": x}, ro)[0].shape == (256, 256)


def test_gil_is_released_during_run():
    session = ortagent.InferenceSession(models.slow_loop(iterations=400))
    x = np.eye(256, dtype=np.float32)
    # With the GIL held for the whole run the counter could advance only at the switch interval
    # boundaries around the call; released, it spins freely for the whole run.
    assert_releases_gil(lambda: session.run(None, {"x": x}), "run")


def test_concurrent_runs_on_one_session_are_correct():
    session = ortagent.InferenceSession(models.mlp(sizes=(16, 64, 8)))
    reference = {}
    inputs = {i: np.random.default_rng(i).standard_normal((3, 16)).astype(np.float32) for i in range(8)}
    for i, x in inputs.items():
        reference[i] = session.run(None, {"x": x})[0].copy()
    failures = []

    def worker(i):
        for _ in range(200):
            (y,) = session.run(None, {"x": inputs[i]})
            if not np.array_equal(y, reference[i]):
                failures.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_close_and_context_manager():
    with ortagent.InferenceSession(models.identity()) as session:
        (value,) = session.run_with_ort_values(None, {"x": np.ones(1, np.float32)})
    with pytest.raises(ortagent.ObjectClosedError):
        session.run(None, {"x": np.ones(1, np.float32)})
    with pytest.raises(ortagent.ObjectClosedError):
        session.get_modelmeta()
    assert value.numpy()[0] == 1  # values outlive the session
    session.close()  # idempotent


def test_reused_and_changing_feed_buffers_give_fresh_results():
    """run() reuses the tensor it made for the array fed last to an input when the next feed has
    the same address, size, type and shape; every other case gets a new tensor."""
    session = ortagent.InferenceSession(models.identity(TensorProto.FLOAT, shape=["N"]))
    buffer = np.arange(8, dtype=np.float32)
    for step in range(3):
        buffer[:] = step                           # same memory, new contents
        np.testing.assert_array_equal(session.run(None, {"x": buffer})[0], np.full(8, step))
    np.testing.assert_array_equal(session.run(None, {"x": buffer[:3]})[0], np.full(3, 2))  # same address, shorter
    other = np.arange(8, dtype=np.float32) * 10
    for x in (buffer, other, buffer, other):      # alternating arrays
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], x)
    with pytest.raises(ortagent.OrtInvalidArgument):   # same memory seen as another dtype
        session.run(None, {"x": buffer.view(np.int32)})
    for _ in range(50):                            # arrays freed and reallocated, maybe at one address
        fresh = np.random.default_rng(_).standard_normal(8).astype(np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": fresh})[0], fresh)
        del fresh


def test_feed_keys_in_changing_order_and_equal_but_distinct_strings():
    session = ortagent.InferenceSession(models.add(shape=[2]))
    a, b = np.array([1, 2], np.float32), np.array([10, 20], np.float32)
    for feed in ({"a": a, "b": b}, {"b": b, "a": a}, {"".join(["a"]): a, "".join(["b"]): b}):
        np.testing.assert_array_equal(session.run(None, feed)[0], [11, 22])
    with pytest.raises(ortagent.OrtInvalidArgument, match="unknown input name 'c'"):
        session.run(None, {"a": a, "c": b})


@pytest.mark.parametrize("api", ["run", "iobinding"])
def test_ctrl_c_during_a_long_run_raises_keyboard_interrupt_promptly(tmp_path, api):
    """SIGINT while the main thread is inside a run that would take many minutes: the run stops
    at the next node boundary and KeyboardInterrupt surfaces; the session stays usable. (Without
    ortagent's handler Python would only see the signal after the run, and the subprocess would
    hit its timeout.)"""
    import subprocess
    import sys
    import textwrap

    from conftest import REPO_ROOT

    script = tmp_path / "interrupt.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, threading
        # as in an interactive interpreter (a CI job may start Python with SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import numpy as np, ortagent
        from ortagent_testkit import onnx_models as models
        session = ortagent.InferenceSession(models.slow_loop(iterations=1_000_000))
        x = np.eye(256, dtype=np.float32)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            if {api!r} == "run":
                session.run(None, {{"x": x}})
            else:
                binding = session.io_binding()
                binding.bind_cpu_input("x", x)
                binding.bind_output("y")
                session.run_with_iobinding(binding)
            print("completed")
        except KeyboardInterrupt:
            print("interrupted")
        quick = ortagent.InferenceSession(models.slow_loop(iterations=2))
        print(quick.run(None, {{"x": x}})[0].shape)
    """))
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "(256,", "256)"]


# ---- outputs of fixed type and shape: written straight into new NumPy arrays ------------------
# Once a run has produced an output with exactly the type and shape the model declares, run()
# gives onnxruntime a new NumPy array to write it into. These tests run each model several
# times, so that both the first (onnxruntime-allocated) and the later (preallocated) runs are
# compared with onnxruntime's own results.

def _runs_match(ort_ref, model, feeds_list, names=None, **session_kwargs):
    ours = ortagent.InferenceSession(model.SerializeToString(), **session_kwargs)
    ref = reference_session(ort_ref, model)
    results = []
    for feeds in feeds_list:
        got = ours.run(names, feeds)
        assert_same_outputs(got, ref.run(names, feeds))
        results.append(got)
    return ours, results


def test_fixed_outputs_are_new_writable_arrays_on_every_run(ort_ref):
    model = models.multi_io()
    rng = np.random.default_rng(3)
    feeds_list = [{"a": rng.standard_normal((3, 4)).astype(np.float32),
                   "b": rng.standard_normal((3, 4)).astype(np.float32),
                   "k": np.array([i], np.int32)} for i in range(4)]
    _, results = _runs_match(ort_ref, model, feeds_list)
    # earlier results are not overwritten by later runs
    for got, feeds in zip(results, feeds_list):     # scaled, total, shape, prod
        np.testing.assert_array_equal(got[3], feeds["a"] * feeds["b"])
        np.testing.assert_array_equal(got[2], [3, 4])
        assert got[1].shape == ()
        np.testing.assert_allclose(got[1], (feeds["a"] + feeds["b"]).sum(), rtol=1e-5)
    last = results[-1]
    for array in last:
        assert array.flags.writeable and array.flags.c_contiguous
    # the first run confirmed the fixed outputs (total [], shape [2]); later runs wrote them
    # into arrays that own their memory, while the B x 4 outputs stay views of ORT's buffers
    assert all(a.base is not None for a in results[0])
    assert [a.base is None for a in last] == [False, True, True, False]
    assert last[1].flags.owndata and last[2].flags.owndata
    assert all(a is not b for a, b in zip(results[-1], results[-2]))
    addresses = {a.__array_interface__["data"][0] for got in results[-2:] for a in got if a.size}
    assert len(addresses) == sum(1 for got in results[-2:] for a in got if a.size)


def test_fixed_outputs_every_dtype(ort_ref):
    for name, elem in models.DTYPES.items():
        if name in ("string", "bfloat16"):
            continue
        model = models.identity(elem, shape=(2, 3))
        rng = np.random.default_rng(len(name))
        feeds_list = [{"x": models.random_array(name, (2, 3), rng)} for _ in range(3)]
        _runs_match(ort_ref, model, feeds_list)


def test_output_that_is_also_an_input_is_still_returned(ort_ref):
    """onnxruntime returns such an output as the feed itself and ignores a buffer given for
    it: ortagent never preallocates it."""
    model = models.make_model([helper_node("Neg", ["x"], ["y"])],
                              [models.vinfo("x", TensorProto.FLOAT, [3])],
                              [models.vinfo("x", TensorProto.FLOAT, [3]),
                               models.vinfo("y", TensorProto.FLOAT, [3])])
    feeds_list = [{"x": np.arange(3, dtype=np.float32) + i} for i in range(4)]
    _runs_match(ort_ref, model, feeds_list)


def test_outputs_from_initializers_and_constants(ort_ref):
    from onnx import numpy_helper

    c = numpy_helper.from_array(np.array([7, 8, 9], np.float32), "c")
    model = models.make_model(
        [helper_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([1, 2], np.int64))),
         helper_node("Identity", ["x"], ["y"])],
        [models.vinfo("x", TensorProto.FLOAT, [3])],
        [models.vinfo("c", TensorProto.FLOAT, [3]), models.vinfo("k", TensorProto.INT64, [2]),
         models.vinfo("y", TensorProto.FLOAT, [3])], initializers=[c])
    _runs_match(ort_ref, model, [{"x": np.full(3, i, np.float32)} for i in range(4)])


def test_output_asked_for_twice(ort_ref):
    model = models.add(shape=(4,))
    feeds_list = [{"a": np.full(4, i, np.float32), "b": np.ones(4, np.float32)} for i in range(4)]
    _, results = _runs_match(ort_ref, model, feeds_list, names=["c", "c"])
    np.testing.assert_array_equal(results[-1][0], np.full(4, 4, np.float32))


def _reshape_model(declared):
    from onnx import numpy_helper

    return models.make_model([helper_node("Reshape", ["x", "shape"], ["y"])],
                             [models.vinfo("x", TensorProto.FLOAT, ["n"]),
                              models.vinfo("shape", TensorProto.INT64, [None])],
                             [models.vinfo("y", TensorProto.FLOAT, declared)])


def test_output_whose_declared_shape_is_wrong(ort_ref):
    """The model declares y as [3]; it comes out [2]: every run returns what onnxruntime
    produces, and nothing is preallocated."""
    model = _reshape_model([3])
    so = ortagent.SessionOptions()
    so.log_severity_level = 4
    feeds = {"x": np.arange(2, dtype=np.float32), "shape": np.array([2], np.int64)}
    _, results = _runs_match(ort_ref, model, [feeds] * 4, sess_options=so)
    assert all(got[0].base is not None for got in results)      # never preallocated


def test_output_that_stops_matching_its_declared_shape(ort_ref):
    """y is declared [2, 3] and comes out that way, until a run reshapes it to [3, 2]: that
    run (preallocated, refused by onnxruntime) is run again without a preallocated output and
    returns onnxruntime's result, and so do the runs after it."""
    model = _reshape_model([2, 3])
    so = ortagent.SessionOptions()
    so.log_severity_level = 4
    x = np.arange(6, dtype=np.float32)
    feeds_list = ([{"x": x, "shape": np.array([2, 3], np.int64)}] * 3
                  + [{"x": x, "shape": np.array([3, 2], np.int64)}]
                  + [{"x": x, "shape": np.array([2, 3], np.int64)}] * 2)
    _, results = _runs_match(ort_ref, model, feeds_list, sess_options=so)
    preallocated = [got[0].base is None for got in results]
    assert preallocated == [False, True, True, False, False, False]


def test_bad_feed_with_fixed_outputs_raises_the_plain_error():
    session = ortagent.InferenceSession(models.add(shape=(4,)))
    good = {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    session.run(None, good)
    session.run(None, good)
    with pytest.raises(ortagent.OrtInvalidArgument, match="dimension|shape|Got invalid"):
        session.run(None, {"a": np.ones(5, np.float32), "b": np.ones(5, np.float32)})
    np.testing.assert_array_equal(session.run(None, good)[0], np.full(4, 2, np.float32))


def helper_node(*args, **kwargs):
    from onnx import helper

    return helper.make_node(*args, **kwargs)


def test_large_fixed_outputs_are_left_to_onnxruntime(ort_ref):
    """Up to 64 KiB an output of fixed shape is preallocated; a larger one would be a fresh
    mmap whose pages fault in on every run, so onnxruntime's arena keeps it."""
    for n, expect_preallocated in ((16384, True), (16385, False)):
        model = models.identity(TensorProto.FLOAT, shape=(n,))
        feeds_list = [{"x": np.full(n, i, np.float32)} for i in range(3)]
        _, results = _runs_match(ort_ref, model, feeds_list)
        assert (results[-1][0].base is None) == expect_preallocated, n


# ---- run() through the session's own IoBinding ----------------------------------------------
# A run whose feeds are the arrays fed last (the same memory, so the session's tensors over
# them are reused) and whose outputs all fit the session's scratch tensors goes through
# RunWithBinding on a binding the session keeps; anything else runs the plain way.

def _two_output_model():
    return models.make_model([helper_node("Add", ["a", "b"], ["s"]), helper_node("Mul", ["a", "b"], ["p"])],
                             [models.vinfo("a", TensorProto.FLOAT, [4]), models.vinfo("b", TensorProto.FLOAT, [4])],
                             [models.vinfo("s", TensorProto.FLOAT, [4]), models.vinfo("p", TensorProto.FLOAT, [4])])


def test_run_binding_follows_arrays_written_in_place_and_rebinds_on_change(ort_ref):
    model = _two_output_model()
    session = ortagent.InferenceSession(model)
    ref = reference_session(ort_ref, model)
    a, b = np.zeros(4, np.float32), np.arange(4, dtype=np.float32)
    results = []
    for step in range(6):
        a[:] = step                                 # the same memory, new contents
        got = session.run(None, {"a": a, "b": b})
        assert_same_outputs(got, ref.run(None, {"a": a, "b": b}))
        results.append(got)
    # run 1 confirms the outputs' shapes, run 2 binds, runs 2-6 go through the binding
    assert session._run_binding_stats() == (1, 5, False, True)
    for step, got in enumerate(results):            # each result its own array, unchanged since
        np.testing.assert_array_equal(got[0], np.full(4, step) + np.arange(4))
    # another array for b: bound afresh; b's old array again: once more
    other = np.full(4, 10, np.float32)
    for x in (other, other, b, b):
        assert_same_outputs(session.run(None, {"a": a, "b": x}), ref.run(None, {"a": a, "b": x}))
    assert session._run_binding_stats()[:2] == (3, 9)
    # an OrtValue feed, a subset of the outputs, the outputs in another order: the plain way or a
    # new binding, the same results
    value = ortagent.OrtValue.ortvalue_from_numpy(a)
    for names in (None, ["p"], ["p", "s"], ["s", "p"]):
        for feeds in ({"a": value, "b": b}, {"a": a, "b": b}, {"b": b, "a": a}):
            ref_feeds = {k: a if v is value else v for k, v in feeds.items()}
            assert_same_outputs(session.run(names, feeds), ref.run(names, ref_feeds))
    # a bad feed fails as it does without a binding, and the binding recovers
    with pytest.raises(ortagent.OrtInvalidArgument):
        session.run(None, {"a": np.ones(5, np.float32), "b": b})
    assert_same_outputs(session.run(None, {"a": a, "b": b}), ref.run(None, {"a": a, "b": b}))
    session.close()
    assert not session._run_binding_stats()[3]


def test_run_binding_stops_when_callers_change_outputs_every_call(ort_ref):
    model = _two_output_model()
    session = ortagent.InferenceSession(model)
    ref = reference_session(ort_ref, model)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 3, np.float32)
    for i in range(40):
        names = ["s"] if i % 2 else ["p"]
        assert_same_outputs(session.run(names, {"a": a, "b": b}), ref.run(names, {"a": a, "b": b}))
    binds, bound_runs, refused, held = session._run_binding_stats()
    assert refused and binds == 4 and not held, (binds, bound_runs)


def test_run_binding_with_optional_inputs_initializers_and_set_providers(ort_ref):
    model = models.overridable_initializer()
    session = ortagent.InferenceSession(model)
    ref = reference_session(ort_ref, model)
    x, scale = np.array([1, 2, 3], np.float32), np.array([5], np.float32)
    for feeds in [{"x": x}] * 3 + [{"x": x, "scale": scale}] * 3 + [{"x": x}] * 3:
        assert_same_outputs(session.run(None, feeds), ref.run(None, feeds))
    binds, bound_runs, _, held = session._run_binding_stats()
    assert held and (binds, bound_runs) == (3, 8), (binds, bound_runs)  # x; x + scale; x again
    session.set_providers(["CPUExecutionProvider"])      # a new session: its binding goes with it
    assert not session._run_binding_stats()[3]
    for _ in range(3):
        assert_same_outputs(session.run(None, {"x": x}), ref.run(None, {"x": x}))
    assert session._run_binding_stats()[3]


def test_a_run_on_another_thread_gets_its_own_lane_of_caches(ort_ref):
    """While one thread's long run holds a session's caches, another thread's runs get a second
    lane of them (feed tensors, scratch outputs, binding) instead of the uncached path."""
    chain = [helper_node("MatMul", [f"m{k}", "x"], [f"m{k + 1}"]) for k in range(4)]  # m1..m4
    model = models.make_model([helper_node("Identity", ["x"], ["m0"]), *chain,
                               helper_node("ReduceSum", ["m4"], ["total"], keepdims=0)],
                              [models.vinfo("x", TensorProto.FLOAT, ["n", "n"])],
                              [models.vinfo("total", TensorProto.FLOAT, [])])
    options = ortagent.SessionOptions()
    options.intra_op_num_threads = 1                     # four 1000 x 1000 MatMuls: ~0.2 s or more
    session = ortagent.InferenceSession(model, options)
    ref = reference_session(ort_ref, model)
    big = np.random.default_rng(0).standard_normal((1000, 1000)).astype(np.float32) / 30
    small = np.arange(4, dtype=np.float32).reshape(2, 2)
    for _ in range(2):
        session.run(None, {"x": small})                  # lane 1 confirms the output, binds
    long_result = []
    thread = threading.Thread(target=lambda: long_result.append(session.run(None, {"x": big})))
    thread.start()
    time.sleep(0.05)
    quick = [session.run(None, {"x": small}) for _ in range(5)]
    overlapped = thread.is_alive()
    thread.join()
    for got in quick:
        assert_same_outputs(got, ref.run(None, {"x": small}))
    np.testing.assert_allclose(long_result[0][0], ref.run(None, {"x": big})[0], rtol=1e-3, atol=1e-2)
    if overlapped:                                       # the quick runs ran during the long one
        assert session._run_lanes() == 2
        assert session._run_binding_stats()[3] == 2      # each lane has its binding
    assert session._run_lanes() <= 2
