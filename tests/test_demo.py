"""The demo (demo/train_digits.py, what ``make demo`` runs) learns: its training function on a
synthetic data set always (it needs neither scikit-learn nor matplotlib nor tqdm), and the
whole command on the digits when scikit-learn is installed."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

pytest.importorskip("onnx_ad", reason="build_training_graph needs onnx-ad")

DEMO_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo",
                         "train_digits.py")


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("train_digits", DEMO_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_forward_model_is_a_valid_onnx_model(demo):
    import onnx

    params = demo.init_parameters(64, 16, 10, np.random.default_rng(0))
    model = demo.build_forward_model(params)
    onnx.checker.check_model(model, full_check=True)
    assert [v.name for v in model.graph.output] == ["loss", "pred"]


def test_train_learns_a_synthetic_data_set(demo, no_leaks):
    features, labels = demo.synthetic_dataset(n_samples=1000, seed=1)
    train_x, train_y, held_out_x, held_out_y = demo.split_dataset(
        features, labels, 0.25, np.random.default_rng(1))
    steps = []
    result = demo.train(train_x, train_y, held_out_x, held_out_y, hidden=32, epochs=3,
                        batch_size=32, lr=0.05, seed=1, on_step=lambda step, loss: steps.append(loss))
    per_epoch = -(-len(train_y) // 32)
    assert result.steps == len(steps) == 3 * per_epoch
    assert result.step_losses == steps
    assert len(result.epoch_losses) == len(result.epoch_accuracies) == 3
    assert all(np.isfinite(result.step_losses))
    # chance is 10%; the blobs are separable
    assert result.accuracy >= 0.8, result.epoch_accuracies
    assert result.epoch_losses[-1] < 0.5 * result.epoch_losses[0]
    assert result.steps_per_second > 0
    assert result.providers == ["CPUExecutionProvider"]
    # the parameters were updated in place: they are the arrays the model started from
    assert set(result.params) == set(demo.PARAMETERS)
    assert all(value.dtype == np.float32 and value.flags.c_contiguous for value in result.params.values())


def test_parameters_and_gradients_cross_without_copies(demo):
    """What the demo's update relies on: a bound parameter array is the memory the agent reads,
    and the gradient arrays are views of the values the agent returns."""
    import ortagent
    from ortagent.training import build_training_graph

    rng = np.random.default_rng(2)
    params = demo.init_parameters(8, 4, 3, rng)
    graph = build_training_graph(demo.build_forward_model(params), list(demo.PARAMETERS))
    with ortagent.TrainingAgent(graph.SerializeToString()) as agent:
        binding = agent.io_binding()
        values = {}
        for name in demo.PARAMETERS:
            values[name] = ortagent.OrtValue.ortvalue_from_numpy(params[name])
            assert values[name].data_ptr() == params[name].ctypes.data
            binding.bind_ortvalue_input(name, values[name])
            binding.bind_output(f"{name}_grad", "cpu")
        binding.bind_cpu_input("x", rng.standard_normal((5, 8)).astype(np.float32))
        binding.bind_cpu_input("y", np.array([0, 1, 2, 1, 0], dtype=np.int64))
        one = ortagent.OrtValue.ortvalue_from_numpy(np.ones((), dtype=np.float32))

        def loss_and_gradients():
            (loss, pred), run_id = agent.run_forward(binding, None)
            assert pred.numpy().dtype == np.int64 and pred.shape() == [5]
            agent.run_backward([one], run_id)
            return float(loss.numpy()), binding.get_outputs()

        before, gradients = loss_and_gradients()
        for value in gradients:
            view = value.numpy()
            assert view.ctypes.data == value.data_ptr() and view.flags.writeable
        # a step in place on the NumPy arrays is seen by the next forward
        for name, value in zip(demo.PARAMETERS, gradients):
            params[name] -= 0.5 * value.numpy()
        after, _ = loss_and_gradients()
        assert after < before


def test_cuda_without_the_provider_is_a_clear_error(demo, monkeypatch):
    import ortagent

    monkeypatch.setattr(ortagent, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(SystemExit, match="no CUDAExecutionProvider"):
        demo.providers_for("cuda")
    assert demo.providers_for("cpu") == ["CPUExecutionProvider"]


def test_the_command_learns_the_digits(demo, tmp_path, capsys):
    pytest.importorskip("sklearn", reason="the digits data set comes with scikit-learn "
                        "(make demo installs it; make test does not)")
    out = tmp_path / "curve" / "loss.png"
    assert demo.main(["--epochs", "8", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    accuracy = float(printed.split("held-out accuracy ")[1].split("%")[0]) / 100
    assert accuracy >= 0.9, printed
    assert "steps/s" in printed
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no loss curve" in printed
    else:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"loss curve: {out}" in printed
