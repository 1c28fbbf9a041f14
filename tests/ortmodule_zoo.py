"""Forward models in the form ORTModule's exporter hands them over, to turn into real training graphs.

Each :class:`ZooEntry` is a small forward ONNX model built with ``onnx.helper`` (IR version 8,
opset 17, com.microsoft 1 where needed -- what ``torch.onnx.export(opset_version=17,
training=TRAINING)`` writes) whose parameters are initializers. ``ortagent_testkit/reference_agent/client.py``'s
:func:`build_ortmodule_training_graph` runs onnxruntime-training 1.19.2's ORTModule graph builder
on it (parameters lifted to graph inputs after the user inputs, other initializers turned into
``Constant`` nodes, as ORTModule's export gives them) and returns the training graph, which
contains the training-only com.microsoft ops (ReluGrad, SoftmaxGrad_13, ConvGrad, ...) that
``ortagent.training_ops.lower_training_ops`` rewrites.

Models follow what torch's exporter writes at opset 17 in training mode: BatchNormalization with
``training_mode=1`` and three outputs (the running statistics are buffers: graph inputs without
a gradient), Dropout with constant ``ratio`` and ``training_mode`` inputs and a mask output,
``cross_entropy`` as SoftmaxCrossEntropyLoss with ``ignore_index=-100``, GELU in its erf form,
``gelu(approximate='tanh')`` in its tanh form, LayerNormalization as the opset-17 op,
``nn.Embedding`` as Gather. Some entries are written to draw specific gradient ops out of the
builder (GatherElementsGrad, SliceGrad, BroadcastGradientArgs, ...); ``tools/zoo_ops.py``
prints which ops each training graph really has.

Tolerance classes: ``exact-ish`` (rtol 1e-5, atol 1e-6), ``conv`` (rtol 1e-4, atol 1e-5: convolution
and pooling gradients run different kernels/algorithms), ``dropout`` (random masks: compare with
ratio 0, and check the mask statistically and the gradient against the run's own mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
OPSET = 17
MS_DOMAIN = "com.microsoft"

TOLERANCES = {
    "exact-ish": {"rtol": 1e-5, "atol": 1e-6},
    "conv": {"rtol": 1e-4, "atol": 1e-5},
    "dropout": {"rtol": 1e-5, "atol": 1e-6},
}

F = TensorProto.FLOAT
I64 = TensorProto.INT64


@dataclass
class ZooEntry:
    """A forward model and what it takes to build and drive its ORTModule training graph.

    ``make_feeds(rng)`` returns the *user* inputs (graph inputs of the forward model) by name;
    the parameters' and buffers' values are the forward model's initializers
    (:meth:`parameter_values`). ``dropout_ratio_input`` names the user input that carries the
    dropout ratio (a graph input here, where torch writes a constant, so that tests can feed 0).
    """

    name: str
    model: onnx.ModelProto
    trainable: list[str]
    input_names_require_grad: list[str]
    make_feeds: Callable[[np.random.Generator], dict]
    tolerance: str = "exact-ish"
    buffers: list[str] = field(default_factory=list)
    # training ops this entry is meant to draw out; an ATen op as "ATen(<operator>)"
    wanted_ops: list[str] = field(default_factory=list)
    dropout_ratio_input: str | None = None
    notes: str = ""
    # (feeds, output gradients or None) -> (module outputs, graph outputs or None), float64, for
    # entries whose graph the real 1.19.2 agent cannot run (``reference_broken`` says why)
    numpy_reference: Callable | None = None
    reference_broken: str | None = None
    # the entry (by function name) whose graph, built from plain ONNX ops, computes the same thing
    # with the same parameters and inputs: the real agent runs that one in place of this one
    reference_equivalent: str | None = None

    def parameter_values(self) -> dict:
        return {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer
                if t.name in set(self.trainable) | set(self.buffers)}

    def feeds_for(self, training_graph: onnx.ModelProto, rng: np.random.Generator, **overrides) -> dict:
        """Every graph input of ``training_graph`` by name: user inputs from ``make_feeds``
        (``overrides`` replace some), parameters and buffers from the initializers."""
        values = dict(self.parameter_values())
        values.update(self.make_feeds(rng))
        values.update(overrides)
        return {value.name: values[value.name] for value in training_graph.graph.input}

    def build_kwargs(self) -> dict:
        return {"trainable": self.trainable, "input_names_require_grad": self.input_names_require_grad,
                "buffers": self.buffers}

    @property
    def rtol(self) -> float:
        return TOLERANCES[self.tolerance]["rtol"]

    @property
    def atol(self) -> float:
        return TOLERANCES[self.tolerance]["atol"]


# --- building blocks ---------------------------------------------------------------------------------

class _Builder:
    """Collects nodes and initializers with a seeded RNG for the parameter values."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.trainable: list[str] = []
        self.buffers: list[str] = []
        self.ms = False
        self._count = 0

    def param(self, name, shape, scale=None, kind="normal", buffer=False):
        if kind == "ones":
            value = np.ones(shape, np.float32)
        elif kind == "zeros":
            value = np.zeros(shape, np.float32)
        elif kind == "uniform":
            value = self.rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:])) if len(shape) > 2 else 1
            scale = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
            value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        (self.buffers if buffer else self.trainable).append(name)
        return name

    def const(self, value, dtype=np.float32, name=None):
        self._count += 1
        name = name or f"const_{self._count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op, inputs, outputs=None, domain="", **attrs):
        self._count += 1
        if outputs is None:
            outputs = [f"{op.lower()}_{self._count}"]
        elif isinstance(outputs, str):
            outputs = [outputs]
        if domain == MS_DOMAIN:
            self.ms = True
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=f"{op}_{self._count}",
                                           domain=domain or None, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def model(self, inputs, outputs, check=True) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.inits)
        opsets = [helper.make_opsetid("", OPSET)]
        if self.ms:
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION,
                                  producer_name="ortagent-ortmodule-zoo")
        onnx.checker.check_model(model) if check else None
        return model


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _gelu_erf(b: _Builder, x):
    """torch.onnx's erf GELU: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    scaled = b.node("Div", [x, b.const(np.sqrt(2.0))])
    erf = b.node("Erf", [scaled])
    plus = b.node("Add", [erf, b.const(1.0)])
    times = b.node("Mul", [x, plus])
    return b.node("Mul", [times, b.const(0.5)])


def _gelu_tanh(b: _Builder, x):
    """torch.onnx's tanh GELU: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    cube = b.node("Pow", [x, b.const(3.0)])
    scaled_cube = b.node("Mul", [cube, b.const(0.044715)])
    inner = b.node("Add", [x, scaled_cube])
    inner = b.node("Mul", [inner, b.const(np.sqrt(2.0 / np.pi))])
    tanh = b.node("Tanh", [inner])
    plus = b.node("Add", [tanh, b.const(1.0)])
    half = b.node("Mul", [x, b.const(0.5)])
    return b.node("Mul", [half, plus])


# --- entries ------------------------------------------------------------------------------------------

def linear() -> ZooEntry:
    """y = x @ w + b: a training graph with no training-only op (checks the harness)."""
    b = _Builder("linear", 1)
    h = b.node("MatMul", ["x", b.param("w", [8, 6])])
    b.node("Add", [h, b.param("b", [6], scale=0.1)], "y")
    model = b.model([_vi("x", F, ["batch", 8])], [_vi("y", F, ["batch", 6])])
    return ZooEntry("linear", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (4, 8))})


def mlp_relu() -> ZooEntry:
    b = _Builder("mlp_relu", 2)
    h = b.node("Gemm", ["x", b.param("fc1.weight", [12, 8]), b.param("fc1.bias", [12], scale=0.1)], transB=1)
    r = b.node("Relu", [h])
    h2 = b.node("MatMul", [r, b.param("fc2.weight", [12, 16])])
    h2 = b.node("Add", [h2, b.param("fc2.bias", [16], scale=0.1)])
    r2 = b.node("LeakyRelu", [h2], alpha=0.1)
    b.node("Gemm", [r2, b.param("fc3.weight", [4, 16]), b.param("fc3.bias", [4], scale=0.1)], "y", transB=1)
    model = b.model([_vi("x", F, ["batch", 8])], [_vi("y", F, ["batch", 4])])
    return ZooEntry("mlp_relu", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (4, 8))},
                    wanted_ops=["ReluGrad", "LeakyReluGrad"])


def cnn() -> ZooEntry:
    """Conv(pad 1) -> BatchNorm (training) -> Relu -> MaxPool -> Conv(stride 2) -> mean over H, W ->
    Flatten -> Gemm, as torch exports a small convnet at opset 17 in training mode. (ORTModule's own
    symbolics export 2-D max/avg pooling as ATen; ONNX MaxPool is what 1-D/3-D pooling gives.)"""
    b = _Builder("cnn", 3)
    c1 = b.node("Conv", ["x", b.param("conv1.weight", [4, 3, 3, 3]), b.param("conv1.bias", [4], scale=0.1)],
                kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    bn = b.node("BatchNormalization",
                [c1, b.param("bn1.weight", [4], kind="uniform"), b.param("bn1.bias", [4], scale=0.1),
                 b.param("bn1.running_mean", [4], kind="zeros", buffer=True),
                 b.param("bn1.running_var", [4], kind="ones", buffer=True)],
                ["bn1_out", "bn1_running_mean_out", "bn1_running_var_out"],
                epsilon=1e-5, momentum=0.9, training_mode=1)[0]
    r = b.node("Relu", [bn])
    p = b.node("MaxPool", [r], kernel_shape=[2, 2], strides=[2, 2])
    c2 = b.node("Conv", [p, b.param("conv2.weight", [6, 4, 3, 3]), b.param("conv2.bias", [6], scale=0.1)],
                kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    a = b.node("ReduceMean", [c2], axes=[2, 3], keepdims=1)              # x.mean((2, 3), keepdim=True)
    flat = b.node("Flatten", [a], axis=1)
    b.node("Gemm", [flat, b.param("fc.weight", [5, 6]), b.param("fc.bias", [5], scale=0.1)], "y", transB=1)
    model = b.model([_vi("x", F, ["batch", 3, 8, 8])], [_vi("y", F, ["batch", 5])])
    return ZooEntry("cnn", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (2, 3, 8, 8))},
                    tolerance="conv", buffers=b.buffers,
                    wanted_ops=["ConvGrad", "BatchNormInternal", "BatchNormalizationGrad", "MaxPoolGrad",
                                "ReluGrad"])


def attention() -> ZooEntry:
    """nn.Embedding (Gather of a weight by int64 ids) + positional embedding + LayerNorm +
    single-head self-attention (Softmax) + GELU feed-forward + output projection."""
    vocab, seq, dim = 16, 5, 8
    b = _Builder("attention", 4)
    emb = b.node("Gather", [b.param("embed.weight", [vocab, dim], scale=1.0), "ids"], axis=0)
    pos = b.node("Add", [emb, b.param("pos.weight", [seq, dim], scale=0.1)])
    # ORTModule's own symbolic for layer_norm: all three outputs, and (from torch's g.op keyword
    # spelling) the stray attributes operator="layer_norm", overload_name="vec".
    ln = b.node("LayerNormalization", [pos, b.param("ln.weight", [dim], kind="uniform"),
                                       b.param("ln.bias", [dim], scale=0.1)], ["ln_out", "ln_mean", "ln_inv_std"],
                axis=-1, epsilon=1e-5, operator="layer_norm", overload_name="vec")[0]
    q = b.node("MatMul", [ln, b.param("q.weight", [dim, dim])])
    k = b.node("MatMul", [ln, b.param("k.weight", [dim, dim])])
    v = b.node("MatMul", [ln, b.param("v.weight", [dim, dim])])
    kt = b.node("Transpose", [k], perm=[0, 2, 1])
    scores = b.node("MatMul", [q, kt])
    scores = b.node("Div", [scores, b.const(np.sqrt(dim))])
    probs = b.node("Softmax", [scores], axis=-1)
    ctx = b.node("MatMul", [probs, v])
    res = b.node("Add", [ctx, pos])
    ff = b.node("MatMul", [res, b.param("ff.weight", [dim, 16])])
    ff = b.node("Add", [ff, b.param("ff.bias", [16], scale=0.1)])
    ff = _gelu_erf(b, ff)
    b.node("MatMul", [ff, b.param("out.weight", [16, 4])], "y")
    model = b.model([_vi("ids", I64, ["batch", seq])], [_vi("y", F, ["batch", seq, 4])])
    return ZooEntry("attention", model, b.trainable, [],
                    lambda rng: {"ids": rng.integers(0, vocab, (3, seq)).astype(np.int64)},
                    wanted_ops=["GatherGrad", "LayerNormalizationGrad", "SoftmaxGrad_13", "GeluGrad"],
                    notes="Add(bias) + erf GELU becomes Gelu + GeluGrad on CPU, not BiasGelu / BiasGeluGrad_dX")


def gelu_mlp() -> ZooEntry:
    """GELU three ways: erf form without a bias (-> Gelu), tanh form (-> FastGelu) and
    com.microsoft Gelu written directly, plus QuickGelu's x * sigmoid(1.702 x)."""
    b = _Builder("gelu_mlp", 5)
    h = b.node("MatMul", ["x", b.param("fc1.weight", [8, 16])])
    g = _gelu_erf(b, h)
    h2 = b.node("MatMul", [g, b.param("fc2.weight", [16, 16])])
    h2 = b.node("Add", [h2, b.param("fc2.bias", [16], scale=0.1)])
    g2 = _gelu_tanh(b, h2)
    h3 = b.node("MatMul", [g2, b.param("fc3.weight", [16, 16])])
    g3 = b.node("Gelu", [h3], domain=MS_DOMAIN)
    h4 = b.node("MatMul", [g3, b.param("fc4.weight", [16, 12])])
    s = b.node("Sigmoid", [b.node("Mul", [h4, b.const(1.702)])])
    q = b.node("Mul", [h4, s])
    b.node("MatMul", [q, b.param("fc5.weight", [12, 4])], "y")
    model = b.model([_vi("x", F, ["batch", 8])], [_vi("y", F, ["batch", 4])])
    return ZooEntry("gelu_mlp", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (4, 8))},
                    wanted_ops=["GeluGrad", "FastGeluGrad", "QuickGeluGrad"],
                    notes="the biased tanh GELU becomes FastGelu(x, bias) + FastGeluGrad, not BiasFastGeluGrad_dX")


def tanh_sigmoid_mlp() -> ZooEntry:
    b = _Builder("tanh_sigmoid_mlp", 6)
    h = b.node("Gemm", ["x", b.param("fc1.weight", [16, 8]), b.param("fc1.bias", [16], scale=0.1)], transB=1)
    t = b.node("Tanh", [h])
    h2 = b.node("Gemm", [t, b.param("fc2.weight", [16, 16]), b.param("fc2.bias", [16], scale=0.1)], transB=1)
    s = b.node("Sigmoid", [h2])
    b.node("Gemm", [s, b.param("fc3.weight", [3, 16]), b.param("fc3.bias", [3], scale=0.1)], "y", transB=1)
    model = b.model([_vi("x", F, ["batch", 8])], [_vi("y", F, ["batch", 3])])
    return ZooEntry("tanh_sigmoid_mlp", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (4, 8))},
                    wanted_ops=["TanhGrad", "SigmoidGrad"])


def dropout() -> ZooEntry:
    """h = x @ w; (y, mask) = Dropout(h, ratio, training_mode=True); out = y @ w2. The mask is a
    second (non-differentiable, bool) module output so that a test can check the gradients
    against the run's own mask; the ratio is a user input (torch writes a constant) so that a
    test can feed 0 for an exact comparison."""
    b = _Builder("dropout", 7)
    h = b.node("MatMul", ["x", b.param("fc1.weight", [16, 32])])
    b.node("Dropout", [h, "ratio", b.const(True, np.bool_, "training_mode")], ["dropped", "mask"])
    b.node("MatMul", ["dropped", b.param("fc2.weight", [32, 8])], "y")
    model = b.model([_vi("x", F, ["batch", 16]), _vi("ratio", F, [])],
                    [_vi("y", F, ["batch", 8]), _vi("mask", TensorProto.BOOL, ["batch", 32])])
    return ZooEntry("dropout", model, b.trainable, ["x"],
                    lambda rng: {"x": _normal(rng, (8, 16)), "ratio": np.array(0.5, np.float32)},
                    tolerance="dropout", dropout_ratio_input="ratio", wanted_ops=["DropoutGrad"])


def _classifier(b: _Builder, classes: int):
    h = b.node("Gemm", ["x", b.param("fc1.weight", [16, 8]), b.param("fc1.bias", [16], scale=0.1)], transB=1)
    r = b.node("Relu", [h])
    return b.node("Gemm", [r, b.param("fc2.weight", [classes, 16]), b.param("fc2.bias", [classes], scale=0.1)],
                  transB=1)


def _labels_feeds(classes: int, batch: int = 6):
    def make(rng):
        labels = rng.integers(0, classes, (batch,)).astype(np.int64)
        labels[1] = -100                        # one ignored sample (ignore_index)
        return {"x": _normal(rng, (batch, 8)), "labels": labels}
    return make


def softmax_cross_entropy() -> ZooEntry:
    """F.cross_entropy as ORTModule exports it (its own symbolic, _custom_op_symbolic_registry):
    com.microsoft SoftmaxCrossEntropyLossInternal(logits, target, weight="", ignore_index) with
    outputs (loss, log_prob), reduction mean, output_type float."""
    classes = 6
    b = _Builder("softmax_cross_entropy", 8)
    logits = _classifier(b, classes)
    b.node("SoftmaxCrossEntropyLossInternal", [logits, "labels", "", b.const(-100, np.int64)], ["loss", "log_prob"],
           domain=MS_DOMAIN, reduction="mean", output_type=TensorProto.FLOAT)
    model = b.model([_vi("x", F, ["batch", 8]), _vi("labels", I64, ["batch"])], [_vi("loss", F, [])])
    return ZooEntry("softmax_cross_entropy", model, b.trainable, ["x"], _labels_feeds(classes),
                    wanted_ops=["SoftmaxCrossEntropyLossInternal", "SoftmaxCrossEntropyLossInternalGrad"])


def softmax_cross_entropy_onnx() -> ZooEntry:
    """The standard ONNX SoftmaxCrossEntropyLoss (what torch's own symbolic writes, with the
    log_prob output the gradient builder needs), sum reduction, per-class weights."""
    classes = 5
    b = _Builder("softmax_cross_entropy_onnx", 16)
    logits = _classifier(b, classes)
    b.node("SoftmaxCrossEntropyLoss", [logits, "labels", b.const(np.linspace(0.5, 1.5, classes), name="class_weight")],
           ["loss", "log_prob"], reduction="sum", ignore_index=-100)
    model = b.model([_vi("x", F, ["batch", 8]), _vi("labels", I64, ["batch"])], [_vi("loss", F, [])])
    return ZooEntry("softmax_cross_entropy_onnx", model, b.trainable, ["x"], _labels_feeds(classes),
                    wanted_ops=["SoftmaxCrossEntropyLossGrad"])


def nll_loss() -> ZooEntry:
    """F.nll_loss(F.log_softmax(x)) as ORTModule exports it: LogSoftmax, then com.microsoft
    NegativeLogLikelihoodLossInternal(log_prob, target, weight, ignore_index), mean reduction, with
    per-class weights. The builder fuses the pair into SoftmaxCrossEntropyLossInternal. 1.19.2 has
    no gradient for NegativeLogLikelihoodLossInternal on its own (nll_loss(log(softmax(x))) fails to
    build), and when the LogSoftmax output is also a module output the fusion deletes that output
    and the build fails ("Graph output (log_prob) does not exist in the graph")."""
    classes = 5
    b = _Builder("nll_loss", 9)
    logits = _classifier(b, classes)
    logp = b.node("LogSoftmax", [logits], axis=1)
    b.node("NegativeLogLikelihoodLossInternal",
           [logp, "labels", b.const(np.linspace(0.5, 1.5, classes), name="class_weight"), b.const(-100, np.int64)],
           "loss", domain=MS_DOMAIN, reduction="mean")
    model = b.model([_vi("x", F, ["batch", 8]), _vi("labels", I64, ["batch"])], [_vi("loss", F, [])])
    return ZooEntry("nll_loss", model, b.trainable, ["x"], _labels_feeds(classes),
                    wanted_ops=["SoftmaxCrossEntropyLossInternal", "SoftmaxCrossEntropyLossInternalGrad"])


def embedding_aten() -> ZooEntry:
    """nn.Embedding as ORTModule exports it (its own symbolic): org.pytorch.aten ATen
    operator="embedding" (weight, indices, padding_idx, scale_grad_by_freq, sparse). Its
    gradient is ATen embedding_backward; both need torch's ATen executor to run."""
    vocab, dim = 12, 6
    b = _Builder("embedding_aten", 17)
    emb = b.node("ATen", [b.param("embed.weight", [vocab, dim], scale=1.0), "ids", b.const(-1, np.int64),
                          b.const(False, np.bool_), b.const(False, np.bool_)],
                 domain="org.pytorch.aten", operator="embedding")
    b.node("MatMul", [emb, b.param("fc.weight", [dim, 3])], "y")
    model = b.model([_vi("ids", I64, ["batch", 4])], [_vi("y", F, ["batch", 4, 3])], check=False)
    model.opset_import.append(helper.make_opsetid("org.pytorch.aten", 1))
    weight = numpy_helper.to_array(b.inits[0]).astype(np.float64)
    fc = numpy_helper.to_array(b.inits[-1]).astype(np.float64)

    def reference(feeds, grads):
        ids = feeds["ids"]
        emb = weight[ids]
        if grads is None:
            return [emb @ fc], None
        (dy,) = grads
        d_emb = dy.astype(np.float64) @ fc.T
        d_weight = np.zeros_like(weight)
        np.add.at(d_weight, ids.reshape(-1), d_emb.reshape(-1, dim))
        d_fc = np.einsum("bsi,bsj->ij", emb, dy.astype(np.float64))
        return [emb @ fc], [d_weight, d_fc]

    return ZooEntry("embedding_aten", model, b.trainable, [],
                    lambda rng: {"ids": rng.integers(0, vocab, (2, 4)).astype(np.int64)},
                    wanted_ops=["ATen"], numpy_reference=reference,
                    reference_broken="ATen ops need torch's ATen executor (onnxruntime-training without torch: "
                                     "'ATenOperatorExecutor is not initialized')")


def average_pool() -> ZooEntry:
    """y = AveragePool(x * scale) (kernel 2, stride 2; what avg_pool1d/3d or another exporter
    writes -- ORTModule's own symbolic makes 2-D average pooling an ATen op). The 1.19.2 CPU
    AveragePoolGrad kernel returns a tensor with a 0-sized batch dimension (x_grad of shape
    (0, C, H, W)); a ConvGrad fed by it dies of SIGFPE. So the reference here is NumPy."""
    b = _Builder("average_pool", 18)
    h = b.node("Mul", ["x", b.param("scale", [1, 3, 1, 1], kind="uniform")])
    b.node("AveragePool", [h], "y", kernel_shape=[2, 2], strides=[2, 2])
    model = b.model([_vi("x", F, ["batch", 3, 8, 8])], [_vi("y", F, ["batch", 3, 4, 4])])
    scale = numpy_helper.to_array(b.inits[0]).astype(np.float64)

    def reference(feeds, grads):
        x = feeds["x"].astype(np.float64)
        h = x * scale
        n, c, hh, ww = h.shape
        y = h.reshape(n, c, hh // 2, 2, ww // 2, 2).mean(axis=(3, 5))
        if grads is None:
            return [y], None
        (dy,) = grads
        dh = np.repeat(np.repeat(dy.astype(np.float64), 2, axis=2), 2, axis=3) / 4.0
        return [y], [dh * scale, (dh * x).sum(axis=(0, 2, 3), keepdims=True)]

    return ZooEntry("average_pool", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (2, 3, 8, 8))},
                    tolerance="conv", wanted_ops=["AveragePoolGrad"], numpy_reference=reference,
                    reference_broken="1.19.2's CPU AveragePoolGrad returns a (0, C, H, W) gradient")


ATEN_DOMAIN = "org.pytorch.aten"


def _aten(b: _Builder, operator: str, inputs, outputs=None):
    """An org.pytorch.aten ATen node as ORTModule's symbolics write it: non-tensor arguments are
    Constant-node inputs (int -> int64 scalar, int[] -> 1-D int64, bool -> bool scalar, None -> '')."""
    args = []
    for value in inputs:
        if isinstance(value, str):
            args.append(value)
        elif value is None:
            args.append("")
        elif isinstance(value, bool):
            args.append(b.const(value, np.bool_))
        elif isinstance(value, int):
            args.append(b.const(value, np.int64))
        else:
            args.append(b.const(list(value), np.int64))
    return b.node("ATen", args, outputs, domain=ATEN_DOMAIN, operator=operator)


def _pool_cnn_model(name: str, aten: bool) -> tuple[onnx.ModelProto, _Builder]:
    """The pooling CNN of :func:`pool_cnn_aten` with ATen pooling (``aten``) or the same pooling
    in plain ONNX ops; the same seed, so the same parameter names and values."""
    b = _Builder(name, 19)
    c1 = b.node("Conv", ["x", b.param("conv1.weight", [4, 3, 3, 3]), b.param("conv1.bias", [4], scale=0.1)],
                kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    r = b.node("Relu", [c1])                                                # [N, 4, 16, 24]
    if aten:
        # F.max_pool2d(r, 2): stride defaults to the kernel; padding 0, dilation 1, ceil_mode False
        m1 = _aten(b, "max_pool2d_with_indices", [r, [2, 2], [2, 2], [0, 0], [1, 1], False],
                   ["maxpool1_out", "maxpool1_indices"])[0]
        m2 = _aten(b, "max_pool2d_with_indices", [r, [3, 3], [2, 2], [1, 1], [1, 1], False],
                   ["maxpool2_out", "maxpool2_indices"])[0]
    else:
        m1 = b.node("MaxPool", [r], kernel_shape=[2, 2], strides=[2, 2])
        m2 = b.node("MaxPool", [r], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    m = b.node("Add", [m1, m2])                                             # [N, 4, 8, 12]
    if aten:
        # avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        a1 = _aten(b, "avg_pool2d", [m, [3, 3], [1, 1], [1, 1], False, True, None])
        a2 = _aten(b, "avg_pool2d", [m, [3, 3], [2, 2], [1, 1], False, False, None])
        g1 = _aten(b, "_adaptive_avg_pool2d", [a1, [1, 1]])
        g2 = _aten(b, "_adaptive_avg_pool2d", [a2, [2, 3]])
    else:
        a1 = b.node("AveragePool", [m], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1)
        a2 = b.node("AveragePool", [m], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)
        g1 = b.node("GlobalAveragePool", [a1])
        # adaptive [2, 3] of a [4, 6] plane: equal bins, so AveragePool with kernel = stride = (2, 2)
        g2 = b.node("AveragePool", [a2], kernel_shape=[2, 2], strides=[2, 2])
    flat = b.node("Concat", [b.node("Flatten", [g1], axis=1), b.node("Flatten", [g2], axis=1)], axis=1)  # [N, 4 + 24]
    b.node("Gemm", [flat, b.param("fc.weight", [5, 28]), b.param("fc.bias", [5], scale=0.1)], "y", transB=1)
    # the ONNX form has a static batch: 1.19.2's CPU AveragePoolGrad sizes its output from the
    # output's inferred shape, and with a symbolic batch returns a (0, C, H, W) gradient
    batch = "batch" if aten else 2
    model = b.model([_vi("x", F, [batch, 3, 16, 24])], [_vi("y", F, [batch, 5])], check=not aten)
    if aten:
        model.opset_import.append(helper.make_opsetid(ATEN_DOMAIN, 1))
    return model, b


def _pool_cnn_feeds(rng):
    return {"x": _normal(rng, (2, 3, 16, 24))}


def pool_cnn_aten() -> ZooEntry:
    """Conv -> Relu -> ATen max_pool2d_with_indices (kernel 2 stride 2; kernel 3 stride 2 padding
    1), summed -> ATen avg_pool2d (kernel 3 stride 1 padding 1 count_include_pad; kernel 3 stride 2
    padding 1 without the pads in the count) -> ATen _adaptive_avg_pool2d ([1, 1]; [2, 3]) ->
    Flatten -> Concat -> Gemm: 2-D pooling as ORTModule's own symbolics export it. The builder
    turns the pools into their ATen *_backward gradients. The real agent cannot run ATen; it runs
    :func:`pool_cnn_onnx` (the same pooling in ONNX ops, same parameters) instead."""
    model, b = _pool_cnn_model("pool_cnn_aten", aten=True)
    return ZooEntry("pool_cnn_aten", model, b.trainable, ["x"], _pool_cnn_feeds, tolerance="conv",
                    wanted_ops=["ATen(max_pool2d_with_indices_backward)", "ATen(avg_pool2d_backward)",
                                "ATen(_adaptive_avg_pool2d_backward)", "ConvGrad", "ReluGrad"],
                    reference_equivalent="pool_cnn_onnx",
                    reference_broken="ATen ops need torch's ATen executor (onnxruntime-training without torch: "
                                     "'ATenOperatorExecutor is not initialized')")


def pool_cnn_onnx() -> ZooEntry:
    """:func:`pool_cnn_aten` with MaxPool, AveragePool and GlobalAveragePool in place of the ATen pools."""
    model, b = _pool_cnn_model("pool_cnn_onnx", aten=False)
    return ZooEntry("pool_cnn_onnx", model, b.trainable, ["x"], _pool_cnn_feeds, tolerance="conv",
                    wanted_ops=["MaxPoolGrad", "AveragePoolGrad", "ConvGrad", "ReluGrad"],
                    notes="static batch: with a symbolic one, 1.19.2's AveragePoolGrad returns a (0, C, H, W) "
                          "gradient")


def _adaptive_bins(size: int, bins: int) -> np.ndarray:
    """[bins, size] float64: row i averages torch's adaptive bin i, [floor(i*size/bins), ceil((i+1)*size/bins))."""
    matrix = np.zeros((bins, size))
    for i in range(bins):
        start, stop = (i * size) // bins, -((-(i + 1) * size) // bins)
        matrix[i, start:stop] = 1.0 / (stop - start)
    return matrix


def adaptive_pool_aten() -> ZooEntry:
    """h = x * scale, y = ATen _adaptive_avg_pool2d(h, [2, 3]) and z = ATen _adaptive_avg_pool2d(h,
    [3, 9]) of a 5 x 7 plane: overlapping bins of unequal width (and more bins than columns), which
    no ONNX pool computes, so the reference is NumPy (the real agent cannot run ATen)."""
    b = _Builder("adaptive_pool_aten", 20)
    h = b.node("Mul", ["x", b.param("scale", [1, 3, 1, 1], kind="uniform")])
    _aten(b, "_adaptive_avg_pool2d", [h, [2, 3]], "y")
    _aten(b, "_adaptive_avg_pool2d", [h, [3, 9]], "z")
    model = b.model([_vi("x", F, ["batch", 3, 5, 7])],
                    [_vi("y", F, ["batch", 3, 2, 3]), _vi("z", F, ["batch", 3, 3, 9])], check=False)
    model.opset_import.append(helper.make_opsetid(ATEN_DOMAIN, 1))
    scale = numpy_helper.to_array(b.inits[0]).astype(np.float64)
    sizes = [(2, 3), (3, 9)]

    def reference(feeds, grads):
        x = feeds["x"].astype(np.float64)
        h = x * scale
        mats = [(_adaptive_bins(5, oh), _adaptive_bins(7, ow)) for oh, ow in sizes]
        outputs = [np.einsum("ih,nchw,jw->ncij", rows, h, cols) for rows, cols in mats]
        if grads is None:
            return outputs, None
        dh = sum(np.einsum("ih,ncij,jw->nchw", rows, g.astype(np.float64), cols)
                 for (rows, cols), g in zip(mats, grads))
        return outputs, [dh * scale, (dh * x).sum(axis=(0, 2, 3), keepdims=True)]

    return ZooEntry("adaptive_pool_aten", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (2, 3, 5, 7))},
                    tolerance="conv", wanted_ops=["ATen(_adaptive_avg_pool2d_backward)"], numpy_reference=reference,
                    reference_broken="ATen ops need torch's ATen executor (onnxruntime-training without torch: "
                                     "'ATenOperatorExecutor is not initialized')")


def shape_arithmetic() -> ZooEntry:
    """Shape -> Gather -> Concat -> Reshape on an activation (view(b, -1, 2, 4)-style), a Slice of an
    activation that needs a gradient, Concat of activations, Split, Transpose."""
    b = _Builder("shape_arithmetic", 10)
    h = b.node("MatMul", ["x", b.param("fc1.weight", [8, 8])])            # [B, S, 8]
    shape = b.node("Shape", [h])
    batch = b.node("Gather", [shape, b.const(0, np.int64)], axis=0)
    seq = b.node("Gather", [shape, b.const(1, np.int64)], axis=0)
    new_shape = b.node("Concat", [b.node("Unsqueeze", [batch, b.const([0], np.int64)]),
                                  b.node("Unsqueeze", [seq, b.const([0], np.int64)]),
                                  b.const([2, 4], np.int64)], axis=0)
    heads = b.node("Reshape", [h, new_shape])                              # [B, S, 2, 4]
    heads = b.node("Transpose", [heads], perm=[0, 2, 1, 3])               # [B, 2, S, 4]
    sliced = b.node("Slice", [heads, b.const([1], np.int64), b.const([3], np.int64), b.const([3], np.int64)])
    first, second = b.node("Split", [h, b.const([3, 5], np.int64)], ["split_a", "split_b"], axis=2)
    mixed = b.node("Concat", [b.node("Relu", [second]), b.node("Mul", [first, first])], axis=2)  # [B, S, 8]
    b.node("MatMul", [mixed, b.param("fc2.weight", [8, 3])], "y")
    flat_shape = b.node("Concat", [b.node("Unsqueeze", [batch, b.const([0], np.int64)]), b.const([-1], np.int64)],
                        axis=0)
    b.node("Reshape", [sliced, flat_shape], "z")
    model = b.model([_vi("x", F, ["batch", "seq", 8])], [_vi("y", F, ["batch", "seq", 3]), _vi("z", F, ["batch", None])])
    return ZooEntry("shape_arithmetic", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (2, 4, 8))},
                    wanted_ops=["SliceGrad", "ConcatTraining", "SplitTraining", "ReluGrad"])


def argmax_output() -> ZooEntry:
    """A classifier that also returns ArgMax of its logits: an int64, non-differentiable output."""
    b = _Builder("argmax_output", 11)
    h = b.node("Gemm", ["x", b.param("fc1.weight", [12, 8]), b.param("fc1.bias", [12], scale=0.1)], transB=1)
    r = b.node("Relu", [h])
    b.node("Gemm", [r, b.param("fc2.weight", [5, 12]), b.param("fc2.bias", [5], scale=0.1)], "logits", transB=1)
    b.node("ArgMax", ["logits"], "prediction", axis=1, keepdims=0)
    model = b.model([_vi("x", F, ["batch", 8])], [_vi("logits", F, ["batch", 5]), _vi("prediction", I64, ["batch"])])
    return ZooEntry("argmax_output", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (4, 8))},
                    wanted_ops=["ReluGrad"])


def gather_variants() -> ZooEntry:
    """GatherElements and GatherND of activations by int64 index inputs."""
    b = _Builder("gather_variants", 12)
    h = b.node("MatMul", ["x", b.param("fc1.weight", [8, 10])])            # [B, 10]
    ge = b.node("GatherElements", [h, "elem_idx"], axis=1)                 # [B, 4]
    h3 = b.node("Reshape", [h, b.const([0, 5, 2], np.int64)])              # [B, 5, 2]
    gnd = b.node("GatherND", [h3, "nd_idx"], batch_dims=1)                 # [B, 3, 2]
    gnd = b.node("Flatten", [gnd], axis=1)                                 # [B, 6]
    cat = b.node("Concat", [ge, gnd], axis=1)                              # [B, 10]
    b.node("MatMul", [cat, b.param("fc2.weight", [10, 3])], "y")
    model = b.model([_vi("x", F, ["batch", 8]), _vi("elem_idx", I64, ["batch", 4]), _vi("nd_idx", I64, ["batch", 3, 1])],
                    [_vi("y", F, ["batch", 3])])
    return ZooEntry("gather_variants", model, b.trainable, ["x"],
                    lambda rng: {"x": _normal(rng, (4, 8)), "elem_idx": rng.integers(0, 10, (4, 4)).astype(np.int64),
                                 "nd_idx": rng.integers(0, 5, (4, 3, 1)).astype(np.int64)},
                    wanted_ops=["GatherElementsGrad", "GatherNDGrad"])


def div_both() -> ZooEntry:
    """a / b where both operands need gradients, and a broadcasting Add of two activations."""
    b = _Builder("div_both", 13)
    a = b.node("MatMul", ["x", b.param("fc1.weight", [8, 6])])
    d = b.node("MatMul", ["x", b.param("fc2.weight", [8, 6])])
    d = b.node("Add", [b.node("Sigmoid", [d]), b.const(0.5)])
    q = b.node("Div", [a, d])
    rowscale = b.node("ReduceMean", [b.node("MatMul", ["x", b.param("fc3.weight", [8, 1])])], axes=[1], keepdims=1)
    b.node("Add", [q, rowscale], "y")                                      # [B, 6] + [B, 1]
    model = b.model([_vi("x", F, ["batch", 8])], [_vi("y", F, ["batch", 6])])
    return ZooEntry("div_both", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (4, 8))},
                    wanted_ops=["DivGrad", "SigmoidGrad"])


def rms_norm() -> ZooEntry:
    """T5/LLaMA RMSNorm as torch exports it (Pow, ReduceMean, Add, Sqrt, Div, Mul), which ORT fuses
    into SimplifiedLayerNormalization, and log_softmax over the result."""
    b = _Builder("rms_norm", 14)
    h = b.node("MatMul", ["x", b.param("fc1.weight", [8, 16])])
    sq = b.node("Pow", [h, b.const(2.0)])
    mean = b.node("ReduceMean", [sq], axes=[-1], keepdims=1)
    root = b.node("Sqrt", [b.node("Add", [mean, b.const(1e-6)])])
    normed = b.node("Mul", [b.param("norm.weight", [16], kind="uniform"), b.node("Div", [h, root])])
    logits = b.node("MatMul", [normed, b.param("fc2.weight", [16, 6])])
    b.node("LogSoftmax", [logits], "y", axis=-1)
    model = b.model([_vi("x", F, ["batch", "seq", 8])], [_vi("y", F, ["batch", "seq", 6])])
    return ZooEntry("rms_norm", model, b.trainable, ["x"], lambda rng: {"x": _normal(rng, (2, 3, 8))},
                    wanted_ops=["SimplifiedLayerNormalizationGrad", "LogSoftmaxGrad_13"])


def broadcast_dynamic() -> ZooEntry:
    """Binary ops between activations whose broadcast is unknown at build time (``u`` has no
    shape, not even a rank): the gradient builder then emits BroadcastGradientArgs +
    ReduceSumTraining (with symbolic dims only, symbolic shape inference's auto-merge decides the
    broadcast and plain ReduceSum comes out)."""
    b = _Builder("broadcast_dynamic", 15)
    a = b.node("MatMul", ["x", b.param("fc1.weight", [8, 8])])            # [n, m, 8]
    c = b.node("Mul", ["u", b.param("gate", [8], kind="uniform")])        # [p, q, 8]
    s = b.node("Add", [a, c])
    p = b.node("Mul", [s, "u"])
    m = b.node("Sub", [p, b.node("Tanh", [a])])
    b.node("ReduceSum", [m, b.const([1], np.int64)], "y", keepdims=0)
    model = b.model([_vi("x", F, ["n", "m", 8]), _vi("u", F, None)], [_vi("y", F, None)], check=False)
    return ZooEntry("broadcast_dynamic", model, b.trainable, ["x", "u"],
                    lambda rng: {"x": _normal(rng, (3, 4, 8)), "u": _normal(rng, (1, 4, 8))},
                    wanted_ops=["BroadcastGradientArgs"],
                    notes="ReduceSum opset 13+ takes axes as an input, so no ReduceSumTraining; a graph "
                          "input without a rank makes ORTModule's symbolic shape inference fail (the "
                          "script goes on without it)")


ENTRIES: list[Callable[[], ZooEntry]] = [
    linear, mlp_relu, cnn, attention, gelu_mlp, tanh_sigmoid_mlp, dropout, softmax_cross_entropy,
    softmax_cross_entropy_onnx, nll_loss, embedding_aten, average_pool, pool_cnn_aten, pool_cnn_onnx,
    adaptive_pool_aten,
    shape_arithmetic, argmax_output, gather_variants, div_both, rms_norm, broadcast_dynamic,
]


def zoo() -> list[ZooEntry]:
    return [make() for make in ENTRIES]


def entry(name: str) -> ZooEntry:
    for make in ENTRIES:
        if make.__name__ == name:
            return make()
    raise KeyError(name)


# --- helpers for tools and tests ----------------------------------------------------------------------

def yield_node(graph: onnx.ModelProto):
    return next(node for node in graph.graph.node if node.op_type == "YieldOp")


def differentiable_output_indices(graph: onnx.ModelProto) -> list[int]:
    """Positions of the YieldOp inputs (module outputs) that get a gradient, in YieldOp output order."""
    node = yield_node(graph)
    skipped: set[int] = set()
    for attribute in node.attribute:
        if attribute.name == "non_differentiable_outputs":
            skipped = set(attribute.ints)
    return [i for i in range(len(node.input)) if i not in skipped]


def output_gradients(graph: onnx.ModelProto, forward_outputs, rng: np.random.Generator) -> list[np.ndarray]:
    """One random gradient per YieldOp output, shaped and typed like its module output."""
    grads = []
    for index in differentiable_output_indices(graph):
        output = np.asarray(forward_outputs[index])
        grads.append(rng.standard_normal(output.shape).astype(output.dtype))
    return grads


def present_ops(graph: onnx.ModelProto) -> set[str]:
    """The op types of ``graph``'s nodes, ATen nodes also as ``ATen(<operator>)`` (how
    ``wanted_ops`` names them)."""
    names = set()
    for node in graph.graph.node:
        names.add(node.op_type)
        if node.op_type == "ATen":
            names.add("ATen(" + next((a.s.decode() for a in node.attribute if a.name == "operator"), "?") + ")")
    return names


def op_types(graph: onnx.ModelProto) -> list[str]:
    """Sorted ``domain:op`` of every node (``ai.onnx`` for the default domain); ATen nodes carry
    their ``operator`` attribute: ``org.pytorch.aten:ATen(embedding)``."""
    names = set()
    for node in graph.graph.node:
        name = f"{node.domain or 'ai.onnx'}:{node.op_type}"
        if node.op_type == "ATen":
            operator = next((a.s.decode() for a in node.attribute if a.name == "operator"), "?")
            name += f"({operator})"
        names.add(name)
    return sorted(names)


def stock_schemas() -> set[tuple[str, str]] | None:
    """``(domain, op)`` of every operator schema the installed (stock) onnxruntime knows, or None
    when onnxruntime cannot be imported."""
    try:
        from onnxruntime.capi import _pybind_state as C
    except ImportError:
        return None
    return {(schema.domain or "ai.onnx", schema.name) for schema in C.get_all_operator_schema()}


def training_only_ops(graph: onnx.ModelProto, schemas: set[tuple[str, str]] | None = None) -> list[str]:
    """The ops of ``graph`` stock onnxruntime has no schema for (YieldOp aside: the split takes
    it out); without ``schemas``, every non-ONNX-domain op but YieldOp."""
    result = set()
    for name in op_types(graph):
        domain, op = name.split(":", 1)
        op = op.split("(")[0]
        if op == "YieldOp":
            continue
        if schemas is None:
            if domain != "ai.onnx":
                result.add(name)
        elif (domain, op) not in schemas:
            result.add(name)
    return sorted(result)
