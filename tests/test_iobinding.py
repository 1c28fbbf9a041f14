"""IOBinding against onnxruntime's own IOBinding on the same models: binding kinds, dynamic
output shapes across runs, the output-overwrite trap, and bad input."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from ortagent_testkit import onnx_models as models
import ortagent
from conftest import reference_session


def pair(ort_ref, model):
    return ortagent.InferenceSession(model), reference_session(ort_ref, model)


def test_cpu_binding_matches_onnxruntime(ort_ref, no_leaks):
    ours, ref = pair(ort_ref, models.multi_io())
    rng = np.random.default_rng(0)
    feed = {"a": rng.standard_normal((2, 4)).astype(np.float32),
            "b": rng.standard_normal((2, 4)).astype(np.float32), "k": np.array([3], np.int32)}
    ob, rb = ours.io_binding(), ref.io_binding()
    for name, value in feed.items():
        ob.bind_cpu_input(name, value)
        rb.bind_cpu_input(name, value)
    for name in ("prod", "total", "shape"):
        ob.bind_output(name)
        rb.bind_output(name)
    ours.run_with_iobinding(ob)
    ref.run_with_iobinding(rb)
    mine = ob.copy_outputs_to_cpu()
    theirs = rb.copy_outputs_to_cpu()
    assert len(mine) == 3
    for a, b in zip(mine, theirs):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    views = ob.get_outputs_as_numpy()
    for a, b in zip(views, theirs):
        np.testing.assert_array_equal(a, b)
    del ob, views


def test_dynamic_output_shapes_across_runs(ort_ref):
    """onnxruntime's own binding needs its output re-bound whenever the shape changes (else the
    run fails); ortagent's binding handles it."""
    ours, ref = pair(ort_ref, models.mlp())
    ob, rb = ours.io_binding(), ref.io_binding()
    ob.bind_output("y")
    for step, batch in enumerate((1, 5, 5, 2, 7)):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        ob.bind_cpu_input("x", x)
        rb.bind_cpu_input("x", x)
        rb.bind_output("y")
        ours.run_with_iobinding(ob)
        ref.run_with_iobinding(rb)
        theirs = rb.get_outputs()[0].numpy()
        if step % 2:   # outputs are read only every other run
            (mine,) = ob.get_outputs()
            assert mine.shape() == [batch, 8]
            np.testing.assert_array_equal(mine.numpy(), theirs)
    with pytest.raises(RuntimeError, match="pre-allocated"):   # the reference without re-binding
        rb.bind_cpu_input("x", np.ones((3, 16), np.float32))
        ref.run_with_iobinding(rb)


def test_values_handed_out_are_never_overwritten(ort_ref):
    """onnxruntime's own IOBinding reuses the output buffer (its first value changes on the
    next run); ortagent's re-binds handed-out outputs so they keep their contents."""
    ours, ref = pair(ort_ref, models.mlp())
    ob, rb = ours.io_binding(), ref.io_binding()
    ob.bind_output("y")
    rb.bind_output("y")
    first_x = np.ones((3, 16), np.float32)
    ob.bind_cpu_input("x", first_x)
    rb.bind_cpu_input("x", first_x)
    ours.run_with_iobinding(ob)
    ref.run_with_iobinding(rb)
    (mine_first,) = ob.get_outputs()
    (theirs_first,) = rb.get_outputs()
    mine_copy = mine_first.numpy().copy()
    theirs_copy = theirs_first.numpy().copy()

    second_x = np.full((3, 16), -2.0, np.float32)
    ob.bind_cpu_input("x", second_x)
    rb.bind_cpu_input("x", second_x)
    ours.run_with_iobinding(ob)
    ref.run_with_iobinding(rb)
    # the trap, in onnxruntime's own binding: the first value now shows the second run
    assert not np.array_equal(theirs_first.numpy(), theirs_copy)
    # ortagent: unchanged
    np.testing.assert_array_equal(mine_first.numpy(), mine_copy)
    (mine_second,) = ob.get_outputs()
    assert mine_second.data_ptr() != mine_first.data_ptr()
    np.testing.assert_array_equal(mine_second.numpy(), rb.get_outputs()[0].numpy())


def test_opt_in_reuse_of_output_buffers():
    session = ortagent.InferenceSession(models.mlp())
    binding = session.io_binding(reuse_output_buffers=True)
    binding.bind_output("y")
    binding.bind_cpu_input("x", np.ones((3, 16), np.float32))
    session.run_with_iobinding(binding)
    (first,) = binding.get_outputs()
    binding.bind_cpu_input("x", np.zeros((3, 16), np.float32))
    session.run_with_iobinding(binding)
    (second,) = binding.get_outputs()
    assert first.data_ptr() == second.data_ptr()
    np.testing.assert_array_equal(first.numpy(), second.numpy())


def test_preallocated_output_buffer_is_written_in_place(ort_ref):
    session = ortagent.InferenceSession(models.mlp())
    binding = session.io_binding()
    out = np.zeros((4, 8), np.float32)
    binding.bind_output("y", "cpu", 0, np.float32, [4, 8], out.ctypes.data)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    binding.bind_cpu_input("x", x)
    session.run_with_iobinding(binding)
    expected = reference_session(ort_ref, models.mlp()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(out, expected)
    (value,) = binding.get_outputs()
    assert value.data_ptr() == out.ctypes.data
    # an OrtValue output is written in place too
    target = ortagent.OrtValue.ortvalue_from_numpy(np.zeros((4, 8), np.float32))
    binding.bind_ortvalue_output("y", target)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(target.numpy(), expected)


def test_bind_input_from_raw_pointer_and_ortvalue():
    session = ortagent.InferenceSession(models.add())
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, np.float32)
    binding = session.io_binding()
    binding.bind_input("a", "cpu", 0, np.float32, [16], a.ctypes.data)
    binding.bind_ortvalue_input("b", ortagent.OrtValue.ortvalue_from_numpy(b))
    binding.bind_output("c")
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), a + 1)


def test_bound_inputs_are_kept_alive():
    session = ortagent.InferenceSession(models.add())
    binding = session.io_binding()
    binding.bind_cpu_input("a", np.full(16, 2, np.float32))
    binding.bind_cpu_input("b", np.full(16, 3, np.float32))
    gc.collect()
    binding.bind_output("c")
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), np.full(16, 5))


def test_clear_bindings_and_rebind():
    session = ortagent.InferenceSession(models.add())
    binding = session.io_binding()
    binding.bind_cpu_input("a", np.ones(16, np.float32))
    binding.bind_cpu_input("b", np.ones(16, np.float32))
    binding.bind_output("c")
    session.run_with_iobinding(binding)
    binding.clear_binding_outputs()
    assert binding.get_outputs() == []
    binding.clear_binding_inputs()
    binding.bind_output("c")
    with pytest.raises(ortagent.OrtError):
        session.run_with_iobinding(binding)     # inputs missing
    binding.bind_cpu_input("a", np.ones(16, np.float32))
    binding.bind_cpu_input("b", np.full(16, 4, np.float32))
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), np.full(16, 5))
    binding.synchronize_inputs()
    binding.synchronize_outputs()


def test_run_options_that_disable_device_sync_still_give_complete_outputs():
    session = ortagent.InferenceSession(models.mlp())
    binding = session.io_binding()
    binding.bind_cpu_input("x", np.ones((2, 16), np.float32))
    binding.bind_output("y")
    ro = ortagent.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    session.run_with_iobinding(binding, ro)
    expected = session.run(None, {"x": np.ones((2, 16), np.float32)})[0]
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), expected)


@pytest.mark.parametrize("action, message", [
    (lambda b: b.bind_cpu_input("nope", np.ones(16, np.float32)), "unknown input name 'nope'"),
    (lambda b: b.bind_output("nope"), "unknown output name 'nope'"),
    (lambda b: b.bind_output("c", "tpu"), "unknown device 'tpu'"),
    (lambda b: b.bind_output("c", "cuda:x"), "index must be a number"),
    (lambda b: b.bind_cpu_input("a", np.ones(16, np.float64)), "expects tensor(float)"),
    (lambda b: b.bind_cpu_input("a", [1.0] * 16), "must be a numpy.ndarray"),
    (lambda b: b.bind_output("c", "cpu", 0, np.float32, [16]), "need a buffer_ptr"),
    (lambda b: b.bind_output("c", "cpu", 0, np.float32, None, 1234), "needs element_type and shape"),
    (lambda b: b.bind_input("a", "cpu", 0, np.float32, [16], 0), "buffer_ptr must not be 0"),
])
def test_bad_bindings_raise_typed_errors(action, message):
    binding = ortagent.InferenceSession(models.add()).io_binding()
    with pytest.raises(ortagent.OrtError, match=message.replace("(", r"\(").replace(")", r"\)")):
        action(binding)


def test_mismatched_preallocated_output_shape_names_the_output():
    session = ortagent.InferenceSession(models.mlp())
    binding = session.io_binding()
    out = np.zeros((5, 8), np.float32)
    binding.bind_output("y", "cpu", 0, np.float32, [5, 8], out.ctypes.data)
    binding.bind_cpu_input("x", np.ones((4, 16), np.float32))
    with pytest.raises(ortagent.OrtInvalidArgument, match="'y'"):
        session.run_with_iobinding(binding)
    binding.bind_output("y")        # re-bound to the device: works again
    session.run_with_iobinding(binding)
    assert binding.get_outputs()[0].shape() == [4, 8]


def test_binding_of_another_session_and_closed_objects():
    first = ortagent.InferenceSession(models.add())
    second = ortagent.InferenceSession(models.add())
    binding = first.io_binding()
    with pytest.raises(ortagent.OrtInvalidArgument):
        second.run_with_iobinding(binding)
    binding.close()
    with pytest.raises(ortagent.ObjectClosedError):
        binding.bind_output("c")
    other = second.io_binding()
    second.close()
    with pytest.raises(ortagent.ObjectClosedError):
        other.bind_output("c")


def test_data_dependent_output_shape_without_rebinding(ort_ref):
    """NonZero's output shape depends on the input's values: with the input bound once (its
    array changed in place) and outputs never read in between, onnxruntime's own binding fails
    on the kept buffer; ortagent's gives the output a fresh buffer and runs again."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["idx"])], "nonzero",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, None])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    ours, ref = pair(ort_ref, model)
    x = np.array([1, 0, 2, 0, 0, 3], np.float32)
    ob, rb = ours.io_binding(), ref.io_binding()
    ob.bind_cpu_input("x", x)
    rb.bind_cpu_input("x", x)
    ob.bind_output("idx")
    rb.bind_output("idx")
    ours.run_with_iobinding(ob)
    ref.run_with_iobinding(rb)
    x[:] = [1, 1, 1, 1, 0, 0]                 # same buffer, now 4 non-zeros instead of 3
    with pytest.raises(RuntimeError):
        ref.run_with_iobinding(rb)
    ours.run_with_iobinding(ob)
    np.testing.assert_array_equal(ob.get_outputs()[0].numpy(), [[0, 1, 2, 3]])


def test_outputs_not_handed_out_keep_their_buffer_between_runs():
    session = ortagent.InferenceSession(models.mlp())
    binding = session.io_binding()
    binding.bind_cpu_input("x", np.ones((3, 16), np.float32))
    binding.bind_output("y")
    session.run_with_iobinding(binding)
    first = binding.get_outputs()[0]
    first_ptr = first.data_ptr()
    session.run_with_iobinding(binding)          # handed out: a fresh buffer
    second_ptr = binding.get_outputs()[0].data_ptr()
    assert second_ptr != first_ptr
    session.run_with_iobinding(binding)          # handed out again: fresh again
    session.run_with_iobinding(binding)          # not handed out since: the same buffer is reused
    third = binding.get_outputs()[0]
    np.testing.assert_array_equal(third.numpy(), first.numpy())
