"""Train a small classifier end to end with ortagent's TrainingAgent (what ``make demo`` runs).

The steps, each one a part of ortagent:

1. a forward model built in code with ``onnx``: an MLP (64 -> hidden -> 10, ReLU) whose module
   outputs are the mean softmax cross-entropy ``loss`` and the int64 ``pred`` (argmax of the
   logits, non-differentiable);
2. ``ortagent.training.build_training_graph`` turns it into an ORTModule-style training graph
   (parameters become graph inputs, a ``com.microsoft:YieldOp`` after the module outputs, the
   parameter gradients as graph outputs), differentiated with ``onnx-ad``;
3. ``ortagent.TrainingAgent`` runs that graph on stock onnxruntime: forward until the YieldOp,
   then backward from it with the gradient of the loss;
4. SGD with momentum, in NumPy, in place: the parameters are NumPy arrays that the agent reads
   without copies (``OrtValue.ortvalue_from_numpy``), the gradients are read without copies
   (``OrtValue.numpy()`` of the values the agent returns).

Run ``python demo/train_digits.py --help`` for the options. The digits data set (8x8 images, 10
classes) ships with scikit-learn; nothing is downloaded. :func:`train` itself needs neither
scikit-learn nor matplotlib nor tqdm: give it any features and labels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ortagent
from ortagent.training import build_training_graph

IR_VERSION = 10     # onnx >= 1.23 writes IR 14 by default, which onnxruntime 1.31 rejects
OPSET = 17
PARAMETERS = ("W1", "b1", "W2", "b2")


# -- the model ----------------------------------------------------------------------------------


def init_parameters(n_features: int, hidden: int, n_classes: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-initialised weights, zero biases; float32, C-contiguous (so the agent reads them in
    place)."""
    return {
        "W1": (rng.standard_normal((n_features, hidden)) * np.sqrt(2.0 / n_features)).astype(np.float32),
        "b1": np.zeros(hidden, dtype=np.float32),
        "W2": (rng.standard_normal((hidden, n_classes)) * np.sqrt(2.0 / hidden)).astype(np.float32),
        "b2": np.zeros(n_classes, dtype=np.float32),
    }


def build_forward_model(params: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The forward model: inputs ``x`` [N, F] float and ``y`` [N] int64 (class indices);
    outputs ``loss`` (scalar, mean softmax cross-entropy) and ``pred`` [N] int64.

    The parameters are initializers here, as an exporter would write them;
    ``build_training_graph`` turns those it trains into graph inputs. The loss is spelled with
    LogSoftmax and GatherElements rather than ``SoftmaxCrossEntropyLoss``: that operator is an
    ONNX function whose body onnx-ad cannot differentiate with a symbolic batch size.
    """
    n_features = params["W1"].shape[0]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h_lin"]),
        helper.make_node("Add", ["h_lin", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z_lin"]),
        helper.make_node("Add", ["z_lin", "b2"], ["logits"]),
        helper.make_node("LogSoftmax", ["logits"], ["log_probs"], axis=1),
        helper.make_node("Unsqueeze", ["y", "class_axis"], ["y_column"]),
        helper.make_node("GatherElements", ["log_probs", "y_column"], ["log_likelihood"], axis=1),
        helper.make_node("ReduceMean", ["log_likelihood"], ["mean_log_likelihood"], keepdims=0),
        helper.make_node("Neg", ["mean_log_likelihood"], ["loss"]),
        helper.make_node("ArgMax", ["logits"], ["pred"], axis=1, keepdims=0),
    ]
    initializers = [numpy_helper.from_array(value, name) for name, value in params.items()]
    initializers.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "class_axis"))
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_features]),
         helper.make_tensor_value_info("y", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("pred", TensorProto.INT64, ["batch"])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


# -- data ---------------------------------------------------------------------------------------


def split_dataset(features: np.ndarray, labels: np.ndarray, held_out_fraction: float,
                  rng: np.random.Generator):
    """A shuffled split into (train_x, train_y, held_out_x, held_out_y)."""
    order = rng.permutation(len(labels))
    n_held_out = int(round(len(labels) * held_out_fraction))
    held_out, train_part = order[:n_held_out], order[n_held_out:]
    return features[train_part], labels[train_part], features[held_out], labels[held_out]


def synthetic_dataset(n_samples: int = 1200, n_features: int = 64, n_classes: int = 10,
                      seed: int = 0, spread: float = 1.0):
    """Gaussian blobs around random class centres: separable, like digits in shape (used by
    the tests, which must not need scikit-learn)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_classes, n_features)) * 1.5
    labels = rng.integers(0, n_classes, n_samples).astype(np.int64)
    features = centres[labels] + spread * rng.standard_normal((n_samples, n_features))
    return features.astype(np.float32), labels


def load_digits_dataset():
    """scikit-learn's bundled digits: 1797 images of 8x8 pixels (0..16), scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("the digits data set comes with scikit-learn, which is not installed: "
                         "run `make demo` (it installs it) or `pip install scikit-learn`") from None
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


# -- training -----------------------------------------------------------------------------------


@dataclass
class TrainResult:
    step_losses: list[float] = field(default_factory=list)     # loss of every step
    epoch_losses: list[float] = field(default_factory=list)    # mean loss of each epoch
    epoch_accuracies: list[float] = field(default_factory=list)  # held-out accuracy after each epoch
    accuracy: float = float("nan")                             # final held-out accuracy
    steps: int = 0
    train_seconds: float = 0.0                                 # the steps only (no evaluation)
    setup_seconds: float = 0.0                                 # graph building + agent creation
    providers: list[str] = field(default_factory=list)
    graph_nodes: int = 0
    forward_nodes: int = 0
    backward_nodes: int = 0
    stash: int = 0
    params: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.train_seconds if self.train_seconds > 0 else float("nan")


def providers_for(device: str) -> list[str]:
    """onnxruntime providers for ``device`` ('cpu' or 'cuda'); a clear error when the CUDA
    provider is not in this onnxruntime build."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        available = ortagent.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise SystemExit("--device cuda: this onnxruntime build has no CUDAExecutionProvider "
                             f"(available: {', '.join(available)}); install onnxruntime-gpu, or "
                             "use --device cpu")
        return ["CUDAExecutionProvider"]
    raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'cuda'")


def _make_agent(training_graph: onnx.ModelProto, providers: Sequence[str], threads: int):
    options = ortagent.SessionOptions()
    # The model is tiny: more threads than cores, or than a batch of 32 rows can use, only
    # adds synchronisation. 0 lets onnxruntime choose.
    options.intra_op_num_threads = threads
    try:
        return ortagent.TrainingAgent(training_graph.SerializeToString(), options, list(providers))
    except ortagent.OrtError as exc:
        if "CUDAExecutionProvider" in providers:
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SystemExit(f"--device cuda: the CUDA execution provider could not be created "
                             f"({first_line}); are the CUDA 13 and cuDNN 9 libraries loadable? "
                             "Use --device cpu otherwise.") from exc
        raise


def train(train_x: np.ndarray, train_y: np.ndarray, held_out_x: np.ndarray, held_out_y: np.ndarray,
          *, hidden: int = 64, epochs: int = 20, batch_size: int = 32, lr: float = 0.05,
          momentum: float = 0.9, seed: int = 0, providers: Sequence[str] = ("CPUExecutionProvider",),
          threads: int = 1, on_step: Optional[Callable[[int, float], None]] = None) -> TrainResult:
    """Train the MLP on (train_x, train_y) with the TrainingAgent; report the held-out accuracy
    after each epoch. ``on_step(step, loss)`` is called after every step (the CLI's progress
    bar). Features are float32 [N, F], labels int64 class indices in [0, classes)."""
    train_x = np.ascontiguousarray(train_x, dtype=np.float32)
    train_y = np.ascontiguousarray(train_y, dtype=np.int64)
    held_out_x = np.ascontiguousarray(held_out_x, dtype=np.float32)
    held_out_y = np.ascontiguousarray(held_out_y, dtype=np.int64)
    n_classes = int(max(train_y.max(), held_out_y.max())) + 1
    rng = np.random.default_rng(seed)
    result = TrainResult()

    started = time.perf_counter()
    params = init_parameters(train_x.shape[1], hidden, n_classes, rng)
    forward_model = build_forward_model(params)
    training_graph = build_training_graph(forward_model, list(PARAMETERS))
    agent = _make_agent(training_graph, providers, threads)
    result.setup_seconds = time.perf_counter() - started
    result.providers = agent.get_providers()
    result.graph_nodes = len(training_graph.graph.node)
    result.forward_nodes = len(agent.split.forward_model.graph.node)
    result.backward_nodes = len(agent.split.backward_model.graph.node)
    result.stash = len(agent.split.stash_names)

    # The run-id API, the generation ORTModule uses today: bind once, run many times. The
    # parameters are bound once as OrtValues over the NumPy arrays themselves (no copy), so the
    # in-place updates below are what the next forward reads. (The older state API does the same
    # with lists: agent.run_forward(feeds, outputs, PartialGraphExecutionState()) and
    # agent.run_backward([loss_grad], gradients, state) -- see ortagent/agent.py.)
    binding = agent.io_binding()
    for name in PARAMETERS:
        binding.bind_ortvalue_input(name, ortagent.OrtValue.ortvalue_from_numpy(params[name]))
        # Gradients land in memory onnxruntime allocates on the CPU for each backward (on CUDA
        # too: onnxruntime copies them back, so the update below stays in NumPy).
        binding.bind_output(f"{name}_grad", "cpu")
    # d loss / d loss: the gradient fed to the YieldOp's only gradient slot (pred has none).
    loss_grad = ortagent.OrtValue.ortvalue_from_numpy(np.ones((), dtype=np.float32))
    velocities = [np.zeros_like(params[name]) for name in PARAMETERS]
    weights = [params[name] for name in PARAMETERS]

    evaluation = agent.io_binding()        # a second binding over the same parameter arrays
    for name in PARAMETERS:
        evaluation.bind_ortvalue_input(name, ortagent.OrtValue.ortvalue_from_numpy(params[name]))
    evaluation.bind_cpu_input("x", held_out_x)
    evaluation.bind_cpu_input("y", held_out_y)

    def held_out_accuracy() -> float:
        (_, pred), run_id = agent.run_forward(evaluation, None)
        agent.release_run(run_id)          # forward only: drop the stash kept for a backward
        return float(np.mean(pred.numpy() == held_out_y))

    n = len(train_y)
    step = 0
    try:
        for _ in range(epochs):
            epoch_started = time.perf_counter()
            order = rng.permutation(n)
            xs, ys = train_x[order], train_y[order]     # contiguous: each batch is a view
            epoch_loss = 0.0
            for start in range(0, n, batch_size):
                binding.bind_cpu_input("x", xs[start:start + batch_size])   # no copy either
                binding.bind_cpu_input("y", ys[start:start + batch_size])
                (loss, _), run_id = agent.run_forward(binding, None)
                agent.run_backward([loss_grad], run_id)
                for weight, velocity, gradient in zip(weights, velocities, binding.get_outputs()):
                    grad = gradient.numpy()    # a view of onnxruntime's buffer, ours until the next step
                    grad *= lr
                    velocity *= momentum
                    velocity += grad
                    weight -= velocity         # in place: the bound OrtValue sees it
                value = float(loss.numpy())
                epoch_loss += value
                result.step_losses.append(value)
                step += 1
                if on_step is not None:
                    on_step(step, value)
            result.train_seconds += time.perf_counter() - epoch_started
            result.epoch_losses.append(epoch_loss / -(-n // batch_size))
            result.epoch_accuracies.append(held_out_accuracy())
    finally:
        agent.close()
    result.steps = step
    result.accuracy = result.epoch_accuracies[-1] if result.epoch_accuracies else float("nan")
    result.params = params
    return result


# -- the command line ---------------------------------------------------------------------------


def plot_losses(result: TrainResult, steps_per_epoch: int, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, loss_axis = plt.subplots(figsize=(8, 4.5), dpi=110)
    steps = np.arange(1, len(result.step_losses) + 1)
    loss_axis.plot(steps, result.step_losses, color="tab:blue", alpha=0.35, linewidth=0.8,
                   label="loss per step")
    epoch_ends = np.arange(1, len(result.epoch_losses) + 1) * steps_per_epoch
    loss_axis.plot(epoch_ends, result.epoch_losses, color="tab:blue", marker="o", markersize=3,
                   label="mean loss per epoch")
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("cross-entropy loss")
    loss_axis.set_yscale("log")
    accuracy_axis = loss_axis.twinx()
    accuracy_axis.plot(epoch_ends, np.asarray(result.epoch_accuracies) * 100, color="tab:orange",
                       marker="s", markersize=3, label="held-out accuracy")
    accuracy_axis.set_ylabel("held-out accuracy (%)")
    accuracy_axis.set_ylim(0, 100)
    lines = loss_axis.get_lines() + accuracy_axis.get_lines()
    loss_axis.legend(lines, [str(line.get_label()) for line in lines], loc="upper center",
                     bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    loss_axis.set_title(title)
    figure.tight_layout()
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="execution provider: CPUExecutionProvider or CUDAExecutionProvider")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="0 for plain SGD")
    parser.add_argument("--hidden", type=int, default=64, help="width of the hidden layer")
    parser.add_argument("--held-out", type=float, default=0.2, help="fraction of the data held out")
    parser.add_argument("--threads", type=int, default=1,
                        help="onnxruntime intra-op threads per session (0: onnxruntime's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="digits_loss.png", help="where the loss-curve PNG goes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.hidden < 1:
        parser.error("--epochs, --batch-size and --hidden must be positive")
    if not 0 < args.held_out < 1:
        parser.error("--held-out must be between 0 and 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    wall_started = time.perf_counter()
    providers = providers_for(args.device)
    features, labels = load_digits_dataset()
    train_x, train_y, held_out_x, held_out_y = split_dataset(
        features, labels, args.held_out, np.random.default_rng(args.seed))
    steps_per_epoch = -(-len(train_y) // args.batch_size)
    print(f"ortagent {ortagent.__version__} on onnxruntime {ortagent.get_version_string()}; "
          f"digits: {len(train_y)} training and {len(held_out_y)} held-out images of "
          f"{features.shape[1]} pixels, {int(labels.max()) + 1} classes")

    bar = None
    on_step = None
    if not args.no_progress:
        try:
            from tqdm import tqdm
        except ImportError:
            print("(tqdm is not installed: no progress bar)")
        else:
            bar = tqdm(total=args.epochs * steps_per_epoch, unit="step", desc="training",
                       dynamic_ncols=True)
            running: list[float] = []      # the loss, smoothed over the last ~20 steps

            def on_step(step: int, loss: float) -> None:
                running[:] = [loss if not running else 0.95 * running[0] + 0.05 * loss]
                bar.update(1)
                if step % 10 == 0 or step == bar.total:
                    bar.set_postfix(loss=f"{running[0]:.4f}", epoch=-(-step // steps_per_epoch),
                                    refresh=False)
    try:
        result = train(train_x, train_y, held_out_x, held_out_y, hidden=args.hidden,
                       epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                       momentum=args.momentum, seed=args.seed, providers=providers,
                       threads=args.threads, on_step=on_step)
    finally:
        if bar is not None:
            bar.close()

    print(f"training graph: {result.graph_nodes} nodes, split at the YieldOp into a forward of "
          f"{result.forward_nodes} and a backward of {result.backward_nodes} nodes, "
          f"{result.stash} stashed values; providers {result.providers}; "
          f"setup {result.setup_seconds:.2f} s")
    print(f"{result.steps} steps ({args.epochs} epochs of {steps_per_epoch}, batch {args.batch_size}) "
          f"in {result.train_seconds:.2f} s: {result.steps_per_second:.0f} steps/s")
    print(f"final loss {result.epoch_losses[-1]:.4f} (mean of the last epoch); "
          f"held-out accuracy {result.accuracy:.1%} ({round(result.accuracy * len(held_out_y))}"
          f"/{len(held_out_y)})")
    try:
        plot_losses(result, steps_per_epoch, args.out,
                    f"MLP on digits with ortagent's TrainingAgent ({args.device}): "
                    f"held-out accuracy {result.accuracy:.1%}")
    except ImportError:
        print("matplotlib is not installed: no loss curve (run `make demo`, or pip install matplotlib)")
    else:
        print(f"loss curve: {os.path.abspath(args.out)}")
    print(f"wall time {time.perf_counter() - wall_started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
