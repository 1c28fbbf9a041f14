"""Op-level tests of ortagent.training_ops.lower_training_ops: one single-node model per training op
of onnxruntime-training's ORTModule graphs, lowered to standard ONNX and run on stock onnxruntime,
against an independent float64 NumPy reference written from the ops' documented semantics.

Where onnxruntime-training-cpu 1.19.2 has a CPU kernel for the op, the same (unlowered) model also
runs in that environment (one subprocess for the whole module, see ``kernel_outputs``), and the
real kernel is checked against the same reference -- which validates the references -- and
against the lowered model. Those checks skip when there is no 1.19.2 environment
(``.venv-refagent`` or ``$ORTAGENT_REF_AGENT_PYTHON``).

Tolerances: "exact" (np.array_equal) for data movement, (rtol, atol) otherwise; see ``Case``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortagent_testkit.reference_agent.client import reference_python

MS = "com.microsoft"
ATEN = "org.pytorch.aten"
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
F32, F64 = np.float32, np.float64
EXACT = "exact"
RED = (1e-5, 1e-6)  # float32 reductions and transcendental functions
CONV = (1e-4, 1e-5)


# --------------------------------------------------------------------------------------------
# Model building
# --------------------------------------------------------------------------------------------

def _elem(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def grad_node(op, inputs, outputs, domain=MS, name=None, **attrs):
    """A gradient node as ORT's gradient builder emits it: with ``__backwardpass=1``."""
    return helper.make_node(op, inputs, outputs, name=name or f"{op}_node", domain=domain,
                            __backwardpass=1, **attrs)


def fwd_node(op, inputs, outputs, domain=MS, name=None, **attrs):
    return helper.make_node(op, inputs, outputs, name=name or f"{op}_node", domain=domain, **attrs)


@dataclass
class Case:
    """One model with its feeds and the float64 (or exact) reference of its graph outputs.

    ``outputs`` maps graph output name -> (dtype, static shape or None); ``expected`` maps the
    same names to reference arrays. ``tol`` is EXACT or (rtol, atol). ``kernel``: whether
    onnxruntime-training 1.19.2's CPU build has a kernel for the op (differential check).
    """

    id: str
    nodes: list
    feeds: dict
    outputs: dict
    expected: dict
    tol: object = RED
    kernel: bool = True
    kernel_tol: object = None
    initializers: dict = field(default_factory=dict)
    extra_opsets: list = field(default_factory=list)
    symbolic_inputs: tuple = ()         # inputs declared with their rank only

    def model(self) -> onnx.ModelProto:
        inputs = [helper.make_tensor_value_info(
            n, _elem(a.dtype), [f"{n}_d{i}" for i in range(a.ndim)] if n in self.symbolic_inputs else list(a.shape))
            for n, a in self.feeds.items()]
        outputs = [helper.make_tensor_value_info(n, _elem(dt), shape) for n, (dt, shape) in self.outputs.items()]
        inits = [onnx.numpy_helper.from_array(np.asarray(a), n) for n, a in self.initializers.items()]
        graph = helper.make_graph(self.nodes, self.id.replace("/", "_"), inputs, outputs, initializer=inits)
        return helper.make_model(graph, opset_imports=OPSETS + self.extra_opsets, ir_version=8)


CASES: list[Case] = []


def case(id, nodes, feeds, expected, *, outputs=None, dtypes=None, shapes=None, **kw):
    """Register a case. Output dtypes default to the expected arrays' dtypes (override with
    ``dtypes``); output shapes default to unknown (``shapes`` gives static ones)."""
    dtypes = dtypes or {}
    shapes = shapes or {}
    # Output shapes are symbolic (rank only) unless given: the lowerings must not rely on static shapes.
    outputs = outputs or {n: (dtypes.get(n, np.asarray(e).dtype),
                              shapes.get(n, [f"{n}_d{i}" for i in range(np.ndim(e))]))
                          for n, e in expected.items()}
    CASES.append(Case(id, nodes if isinstance(nodes, list) else [nodes], feeds, outputs,
                      {n: np.asarray(e) for n, e in expected.items()}, **kw))


def rng(seed):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------------------------
# Elementwise activation gradients
# --------------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_grad_ref(x):
    x = x.astype(F64)
    return 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def fast_gelu_grad_ref(x):
    x = x.astype(F64)
    a, g = math.sqrt(2 / math.pi), 0.044715
    t = np.tanh(a * (x + g * x ** 3))
    return 0.5 * (1 + t + (1 - t * t) * (a * x + 3 * g * a * x ** 3))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _activation_cases():
    for dt in (F32, F64):
        r = rng(1)
        dy = r.standard_normal((3, 4, 5)).astype(dt)
        x = r.standard_normal((3, 4, 5)).astype(dt)
        x[0, 0, :3] = [0.0, -0.0, 1e-30]
        x[1, 1, 1] = np.nan
        d64 = dy.astype(F64)
        tag = np.dtype(dt).name
        # ReluGrad: X > 0 ? dY : 0 (strict; NaN -> 0). CPU kernel: float only.
        case(f"ReluGrad/{tag}", grad_node("ReluGrad", ["dY", "X"], ["dX"]), {"dY": dy, "X": x},
             {"dX": np.where(x > 0, dy, dt(0))}, tol=EXACT, kernel=dt is F32)
        xf = np.nan_to_num(x)
        ins = {"dY": dy, "X": xf}
        case(f"GeluGrad/{tag}", grad_node("GeluGrad", ["dY", "X"], ["dX"]), ins,
             {"dX": (d64 * gelu_grad_ref(xf)).astype(dt)}, kernel=dt is F32)
        case(f"FastGeluGrad/{tag}", grad_node("FastGeluGrad", ["dY", "X"], ["dX"]), ins,
             {"dX": (d64 * fast_gelu_grad_ref(xf)).astype(dt)}, kernel=dt is F32)
        b = r.standard_normal(5).astype(dt)
        case(f"BiasGeluGrad_dX/{tag}", grad_node("BiasGeluGrad_dX", ["dY", "X", "B"], ["dX"]), {**ins, "B": b},
             {"dX": (d64 * gelu_grad_ref(xf.astype(F64) + b)).astype(dt)}, kernel=dt is F32)
        case(f"BiasFastGeluGrad_dX/{tag}", grad_node("BiasFastGeluGrad_dX", ["dY", "X", "B"], ["dX"]),
             {**ins, "B": b}, {"dX": (d64 * fast_gelu_grad_ref(xf.astype(F64) + b)).astype(dt)}, kernel=dt is F32)
        y_tanh = np.tanh(xf).astype(dt)
        case(f"TanhGrad/{tag}", grad_node("TanhGrad", ["dY", "Y"], ["dX"]), {"dY": dy, "Y": y_tanh},
             {"dX": (d64 * (1 - y_tanh.astype(F64) ** 2)).astype(dt)}, kernel=dt is F32)
        y_sig = sigmoid(xf.astype(F64)).astype(dt)
        case(f"SigmoidGrad/{tag}", grad_node("SigmoidGrad", ["dY", "Y"], ["dX"]), {"dY": dy, "Y": y_sig},
             {"dX": (d64 * y_sig * (1 - y_sig.astype(F64))).astype(dt)}, kernel=dt is F32)
        for alpha in (None, -0.5):
            a = 1.702 if alpha is None else alpha
            attrs = {} if alpha is None else {"alpha": alpha}
            s = sigmoid(np.float64(np.float32(a)) * xf.astype(F64))
            case(f"QuickGeluGrad/{tag}/alpha={alpha}", grad_node("QuickGeluGrad", ["dY", "X"], ["dX"], **attrs), ins,
                 {"dX": (d64 * s * (1 + np.float64(np.float32(a)) * xf * (1 - s))).astype(dt)}, kernel=dt is F32)
            # LeakyReluGrad's second input is the forward output Y; alpha default 0.01.
            la = 0.01 if alpha is None else 0.2
            lattrs = {} if alpha is None else {"alpha": la}
            case(f"LeakyReluGrad/{tag}/alpha={alpha}", grad_node("LeakyReluGrad", ["dY", "Y"], ["dX"], **lattrs),
                 {"dY": dy, "Y": x}, {"dX": np.where(x > 0, dy, dy * dt(np.float32(la)))},
                 tol=EXACT, kernel=dt is F32)


_activation_cases()


# --------------------------------------------------------------------------------------------
# Softmax / LogSoftmax gradients
# --------------------------------------------------------------------------------------------

def _axes_from(axis, rank, coerce_2d):
    a = axis % rank
    return tuple(range(a, rank)) if coerce_2d else (a,)


def _softmax(x, axes):
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def _softmax_cases():
    r = rng(2)
    x = r.standard_normal((2, 3, 4, 5))
    dy = r.standard_normal((2, 3, 4, 5))
    specs = [("SoftmaxGrad_13", True, None, False), ("SoftmaxGrad_13", True, 1, False),
             ("SoftmaxGrad_13", True, -2, False), ("SoftmaxGrad", True, None, True),
             ("SoftmaxGrad", True, 2, True), ("SoftmaxGrad", True, -1, True),
             ("LogSoftmaxGrad_13", False, None, False), ("LogSoftmaxGrad_13", False, 0, False),
             ("LogSoftmaxGrad_13", False, -3, False), ("LogSoftmaxGrad", False, None, True),
             ("LogSoftmaxGrad", False, -2, True)]
    for op, soft, axis, coerce in specs:
        default = 1 if coerce else -1
        axes = _axes_from(default if axis is None else axis, 4, coerce)
        attrs = {} if axis is None else {"axis": axis}
        for dt in (F32, F64):
            p = _softmax(x, axes)
            d = dy.astype(dt).astype(F64)
            if soft:
                y = p.astype(dt).astype(F64)
                ref = y * (d - (d * y).sum(axis=axes, keepdims=True))
            else:
                y = np.log(p).astype(dt).astype(F64)
                ref = d - np.exp(y) * d.sum(axis=axes, keepdims=True)
            case(f"{op}/axis={axis}/{np.dtype(dt).name}", grad_node(op, ["dY", "Y"], ["dX"], **attrs),
                 {"dY": dy.astype(dt), "Y": y.astype(dt)}, {"dX": ref.astype(dt)}, kernel=dt is F32)


_softmax_cases()


# --------------------------------------------------------------------------------------------
# LayerNorm family
# --------------------------------------------------------------------------------------------

def _ln_ref(dy, xhat, scale, inv, red_axes, row_axes):
    """LayerNormalizationGrad given x_hat = (X - mean) * inv_std."""
    g = dy * scale
    b = g * inv
    c = b * xhat
    dx = b - b.mean(axis=red_axes, keepdims=True) - xhat * c.mean(axis=red_axes, keepdims=True)
    return dx, (dy * xhat).sum(axis=row_axes), dy.sum(axis=row_axes)


def _layernorm_cases():
    r = rng(3)
    for axis, dt in ((-1, F32), (1, F32), (-2, F64)):
        x = r.standard_normal((2, 3, 4)).astype(dt)
        dy = r.standard_normal((2, 3, 4)).astype(dt)
        a = axis % 3
        red, rows = tuple(range(a, 3)), tuple(range(a))
        scale = r.standard_normal(x.shape[a:]).astype(dt)
        bias = r.standard_normal(x.shape[a:]).astype(dt)
        x64 = x.astype(F64)
        mean = x64.mean(axis=red, keepdims=True)
        inv = 1 / np.sqrt(x64.var(axis=red, keepdims=True) + 1e-5)
        mean_t, inv_t = mean.astype(dt), inv.astype(dt)
        xhat = (x64 - mean_t) * inv_t
        dx, ds, db = _ln_ref(dy.astype(F64), xhat, scale.astype(F64), inv_t.astype(F64), red, rows)
        tag = f"axis={axis}/{np.dtype(dt).name}"
        feeds = {"dY": dy, "X": x, "scale": scale, "mean": mean_t, "inv_std": inv_t}
        lnattrs = {"axis": axis, "epsilon": 1e-5, "stash_type": 1}
        ln = lambda outs: grad_node("LayerNormalizationGrad", list(feeds), outs, **lnattrs)  # noqa: E731
        # 1.19.2's double LayerNorm-grad kernels fail on double mean/inv_std ("Tensor type mismatch").
        kern = dt is F32
        case(f"LayerNormalizationGrad/{tag}", ln(["dX", "dscale", "dbias"]), feeds,
             {"dX": dx.astype(dt), "dscale": ds.astype(dt), "dbias": db.astype(dt)}, kernel=kern)
        # scale/bias gradients computed by the node but unused by the graph (the usual frozen-LN case).
        case(f"LayerNormalizationGrad/{tag}/only_dX", ln(["dX", "unused_ds", "unused_db"]), feeds,
             {"dX": dx.astype(dt)}, kernel=kern)
        # SimplifiedLayerNormalizationGrad (RMSNorm): inv_std_var = 1/sqrt(mean(x^2)+eps)
        inv_rms = (1 / np.sqrt((x64 ** 2).mean(axis=red, keepdims=True) + 1e-6)).astype(dt)
        xh = x64 * inv_rms
        b = dy.astype(F64) * scale * inv_rms
        sdx = b - xh * (b * xh).mean(axis=red, keepdims=True)
        sfeeds = {"dY": dy, "X": x, "scale": scale, "inv_std": inv_rms}
        case(f"SimplifiedLayerNormalizationGrad/{tag}",
             grad_node("SimplifiedLayerNormalizationGrad", list(sfeeds), ["dX", "dscale"], axis=axis), sfeeds,
             {"dX": sdx.astype(dt), "dscale": (dy * xh).sum(axis=rows).astype(dt)}, kernel=kern)
        # InvertibleLayerNormalizationGrad: (Y_grad, Y, scale, bias, inv_std_var); x_hat = (Y - bias) / scale.
        y = (xhat * scale + bias).astype(dt)
        xh_inv = (y.astype(F64) - bias) / scale
        idx, ids, idb = _ln_ref(dy.astype(F64), xh_inv, scale.astype(F64), inv_t.astype(F64), red, rows)
        ifeeds = {"dY": dy, "Y": y, "scale": scale, "bias": bias, "inv_std": inv_t}
        case(f"InvertibleLayerNormalizationGrad/{tag}",
             grad_node("InvertibleLayerNormalizationGrad", list(ifeeds), ["dX", "dscale", "dbias"], axis=axis),
             ifeeds, {"dX": idx.astype(dt), "dscale": ids.astype(dt), "dbias": idb.astype(dt)}, tol=(1e-4, 1e-5),
             kernel=kern)


_layernorm_cases()


# --------------------------------------------------------------------------------------------
# Gather family, Slice
# --------------------------------------------------------------------------------------------

def gather_grad_ref(shape, idx, dy, axis):
    out = np.zeros(shape, F64)
    axis %= len(shape)
    idx = np.where(idx < 0, idx + shape[axis], idx)
    moved = np.moveaxis(out, axis, 0)
    dy64 = dy.astype(F64)
    # dy shape: shape[:axis] + idx.shape + shape[axis+1:]
    q = idx.ndim
    dyc = np.moveaxis(dy64.reshape(shape[:axis] + (idx.size,) + tuple(shape[axis + 1:])), axis, 0)
    np.add.at(moved, idx.reshape(-1), dyc)
    assert dy.shape == tuple(shape[:axis]) + idx.shape + tuple(shape[axis + 1:]) and q >= 0
    return out


def _gather_cases():
    r = rng(4)
    specs = [  # (tag, data shape, indices, axis, exact)
        ("axis0_unique", (5, 3), np.array([4, 0, 2], np.int64), 0, True),
        ("rank0_index", (4, 3, 2), np.array(2, np.int64), 1, True),
        ("rank0_negative", (4, 3), np.array(-1, np.int64), 0, True),
        ("axis1_2d_indices", (2, 5, 3), np.array([[0, 4], [3, 1]], np.int64), 1, True),
        ("axis-1_negative", (2, 3, 6), np.array([-1, 0, -6, 2], np.int64), -1, True),
        ("int32_indices", (6, 2), np.array([5, 1, 3], np.int32), 0, True),
        ("duplicates", (4, 3), np.array([[1, 1], [3, 1], [-3, 0]], np.int64), 0, False),
        ("duplicates_axis1", (2, 3, 4), np.array([2, 2, -1, 0, 2], np.int64), 1, False),
    ]
    for tag, shape, idx, axis, exact in specs:
        a = axis % len(shape)
        for dt in (F32, F64):
            dy_shape = shape[:a] + idx.shape + shape[a + 1:]
            dy = r.integers(-8, 8, dy_shape).astype(dt) if exact else r.standard_normal(dy_shape).astype(dt)
            feeds = {"shape": np.array(shape, np.int64), "indices": idx, "dY": dy}
            case(f"GatherGrad/{tag}/{np.dtype(dt).name}", grad_node("GatherGrad", list(feeds), ["dX"], axis=axis),
                 feeds, {"dX": gather_grad_ref(shape, idx, dy, axis).astype(dt)}, tol=EXACT if exact else RED)

    # GatherElementsGrad: inputs (dY, shape, indices) -- note the order.
    for tag, shape, ishape, axis, dup in (("axis1", (3, 4), (3, 2), 1, False), ("axis-1", (2, 3, 5), (2, 3, 4), -1, True),
                                          ("axis0", (4, 3), (6, 3), 0, True)):
        a = axis % len(shape)
        if dup:
            idx = r.integers(-shape[a], shape[a], ishape).astype(np.int64)
        else:
            idx = np.stack([r.permutation(shape[a])[:ishape[a]] for _ in range(int(np.prod(ishape)) // ishape[a])])
            idx = np.moveaxis(idx.reshape(ishape[:a] + ishape[a + 1:] + (ishape[a],)), -1, a).astype(np.int64)
        dy = (r.standard_normal(ishape) if dup else r.integers(-9, 9, ishape)).astype(F32)
        ref = np.zeros(shape)
        norm = np.where(idx < 0, idx + shape[a], idx)
        full = list(np.indices(ishape))
        full[a] = norm
        np.add.at(ref, tuple(full), dy.astype(F64))
        feeds = {"dY": dy, "shape": np.array(shape, np.int64), "indices": idx}
        case(f"GatherElementsGrad/{tag}", grad_node("GatherElementsGrad", list(feeds), ["dX"], axis=axis), feeds,
             {"dX": ref.astype(F32)}, tol=RED if dup else EXACT)

    # GatherNDGrad: (shape, indices int64, update); batch_dims 0 and 1.
    shape = (3, 4, 5)
    idx = np.array([[0, 1], [2, 3], [0, 1], [1, 0]], np.int64)  # duplicate row (0,1)
    upd = r.standard_normal((4, 5)).astype(F32)
    ref = np.zeros(shape)
    for k in range(4):
        ref[tuple(idx[k])] += upd[k]
    feeds = {"shape": np.array(shape, np.int64), "indices": idx, "update": upd}
    case("GatherNDGrad/batch_dims=0", grad_node("GatherNDGrad", list(feeds), ["dX"]), feeds, {"dX": ref.astype(F32)})
    idx1 = np.array([[[1], [3]], [[0], [0]], [[2], [1]]], np.int64)  # [3, 2, 1], batch over dim 0
    upd1 = r.standard_normal((3, 2, 5)).astype(F32)
    ref1 = np.zeros(shape)
    for b in range(3):
        for k in range(2):
            ref1[b, idx1[b, k, 0]] += upd1[b, k]
    feeds1 = {"shape": np.array(shape, np.int64), "indices": idx1, "update": upd1}
    case("GatherNDGrad/batch_dims=1", grad_node("GatherNDGrad", list(feeds1), ["dX"], batch_dims=1), feeds1,
         {"dX": ref1.astype(F32)})


_gather_cases()

I64_MAX = np.iinfo(np.int64).max


def _slice_cases():
    r = rng(5)
    specs = [  # tag, shape, starts, ends, axes, steps, dtype
        ("basic", (4, 6), [1, 2], [3, 5], [0, 1], None, F32),
        ("neg_steps", (5, 7), [-1, 5], [0, -I64_MAX], [0, 1], [-2, -1], F32),
        ("clamped_ends", (3, 4, 5), [1], [I64_MAX], [-1], [2], F32),
        ("no_axes_no_steps", (4, 5), [1, 0], [-1, 3], None, None, F64),
        ("negative_axes_int32", (2, 3, 8), [7, 0], [1, 2], [-1, 0], [-3, 1], F32),
        ("int64_data", (4, 6), [0], [6], [1], [4], np.int64),
    ]
    for tag, shape, starts, ends, axes, steps, dt in specs:
        it = np.int32 if "int32" in tag else np.int64
        x = np.zeros(shape)
        sl = [slice(None)] * len(shape)
        ax = axes if axes is not None else list(range(len(starts)))
        st = steps if steps is not None else [1] * len(starts)
        for s, e, a, k in zip(starts, ends, ax, st):
            dim = shape[a]
            s = s + dim if s < 0 else s
            e = e + dim if (e < 0 and e > -I64_MAX) else e
            if k > 0:
                s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            else:
                s, e = min(max(s, 0), dim - 1), (None if e <= -1 else min(e, dim - 1))
            sl[a] = slice(s, e, k)
        dy_shape = x[tuple(sl)].shape
        dy = (r.integers(1, 100, dy_shape)).astype(dt)
        ref = np.zeros(shape, dt)
        ref[tuple(sl)] = dy
        feeds = {"dY": dy, "shape": np.array(shape, np.int64), "starts": np.array(starts, it),
                 "ends": np.array(ends, it) if it is np.int64 else np.array(ends, it)}
        names = ["dY", "shape", "starts", "ends"]
        if axes is not None:
            feeds["axes"] = np.array(axes, it)
            names.append("axes")
        elif steps is not None:
            names.append("")
        if steps is not None:
            feeds["steps"] = np.array(steps, it)
            names.append("steps")
        # 1.19.2's CPU SliceGrad: float/double data only, and negative steps fail ("narrowing_error").
        kern = dt is not np.int64 and not any(k < 0 for k in st)
        case(f"SliceGrad/{tag}", grad_node("SliceGrad", names, ["dX"]), feeds, {"dX": ref}, tol=EXACT, kernel=kern)
    # axes omitted ('') but steps given
    dy = r.integers(1, 9, (2, 2)).astype(F32)
    ref = np.zeros((4, 5), F32)
    ref[3:0:-2, 0:4:2] = dy
    feeds = {"dY": dy, "shape": np.array([4, 5], np.int64), "starts": np.array([3, 0], np.int64),
             "ends": np.array([0, 4], np.int64), "steps": np.array([-2, 2], np.int64)}
    case("SliceGrad/empty_axes_input", grad_node("SliceGrad", ["dY", "shape", "starts", "ends", "", "steps"], ["dX"]),
         feeds, {"dX": ref}, tol=EXACT, kernel=False)
    feeds = dict(feeds, steps=np.array([2, 2], np.int64), starts=np.array([1, 0], np.int64))
    ref = np.zeros((4, 5), F32)
    ref[1:0:2, 0:4:2] = 0
    ref[1:4:2, 0:4:2] = dy
    feeds["ends"] = np.array([4, 4], np.int64)
    case("SliceGrad/empty_axes_input_pos_steps",
         grad_node("SliceGrad", ["dY", "shape", "starts", "ends", "", "steps"], ["dX"]), feeds, {"dX": ref}, tol=EXACT)


_slice_cases()


# --------------------------------------------------------------------------------------------
# Concat / Split, Dropout, Scale & co
# --------------------------------------------------------------------------------------------

def _concat_split_cases():
    r = rng(6)
    a, b, c = (r.standard_normal(s).astype(F32) for s in ((2, 3, 4), (2, 1, 4), (2, 5, 4)))
    for axis in (1, -2):
        node = fwd_node("ConcatTraining", ["a", "b", "c"], ["y", "lengths"], axis=axis)
        case(f"ConcatTraining/axis={axis}", node, {"a": a, "b": b, "c": c},
             {"y": np.concatenate([a, b, c], axis=axis), "lengths": np.array([3, 1, 5], np.int64)}, tol=EXACT)
    # shape-computing form seen in ORTModule graphs: int64 [1] pieces, axis 0, lengths unconsumed
    p = {f"p{i}": np.array([v], np.int64) for i, v in enumerate((2, -1, 64))}
    case("ConcatTraining/shape_pieces", fwd_node("ConcatTraining", list(p), ["y", "lengths_unused"], axis=0), p,
         {"y": np.array([2, -1, 64], np.int64)}, tol=EXACT)
    case("ConcatTraining/single_output", fwd_node("ConcatTraining", ["a", "c"], ["y"], axis=-2), {"a": a, "c": c},
         {"y": np.concatenate([a, c], axis=1)}, tol=EXACT)

    x = r.standard_normal((2, 9, 4)).astype(F32)
    for axis, split, n in ((1, [3, 1, 5], 3), (-2, [9], 1), (-1, [1, 3], 2)):
        outs = [f"o{i}" for i in range(n)]
        parts = np.split(x, np.cumsum(split)[:-1], axis=axis)
        case(f"SplitTraining/axis={axis}/split={split}", grad_node("SplitTraining", ["x", "split"], outs, axis=axis),
             {"x": x, "split": np.array(split, np.int64)}, dict(zip(outs, parts)), tol=EXACT)
    # empty split tensor: equal parts
    case("SplitTraining/empty_split", grad_node("SplitTraining", ["x", "split"], ["o0", "o1", "o2"], axis=1),
         {"x": x, "split": np.zeros(0, np.int64)}, dict(zip(["o0", "o1", "o2"], np.split(x, 3, axis=1))), tol=EXACT)


_concat_split_cases()


def _dropout_cases():
    r = rng(7)
    dy = r.standard_normal((4, 5, 6)).astype(F32)
    mask = r.random((4, 5, 6)) >= 0.3
    tm = np.array(True)

    def ref(d, m, ratio, dt):
        if ratio == 0:
            return d.copy()
        scale = np.float32(1) - np.float32(ratio)  # the kernel computes 1 - ratio in float
        return np.where(m, d / dt(scale), dt(0)).astype(dt)

    ratio = np.array(0.3, F32)
    case("DropoutGrad/ratio_and_training_mode", grad_node("DropoutGrad", ["dy", "mask", "ratio", "tm"], ["dx"]),
         {"dy": dy, "mask": mask, "ratio": ratio, "tm": tm}, {"dx": ref(dy, mask, 0.3, F32)}, tol=EXACT)
    case("DropoutGrad/no_ratio", grad_node("DropoutGrad", ["dy", "mask"], ["dx"]), {"dy": dy, "mask": mask},
         {"dx": ref(dy, mask, 0.5, F32)}, tol=EXACT)
    case("DropoutGrad/empty_ratio_input", grad_node("DropoutGrad", ["dy", "mask", "", "tm"], ["dx"]),
         {"dy": dy, "mask": mask, "tm": tm}, {"dx": ref(dy, mask, 0.5, F32)}, tol=EXACT)
    case("DropoutGrad/ratio0_ignores_mask", grad_node("DropoutGrad", ["dy", "mask", "ratio", "tm"], ["dx"]),
         {"dy": dy, "mask": mask, "ratio": np.array(0.0, F32), "tm": tm}, {"dx": dy}, tol=EXACT)
    case("DropoutGrad/f64_ratio_f64", grad_node("DropoutGrad", ["dy", "mask", "ratio", "tm"], ["dx"]),
         {"dy": dy.astype(F64), "mask": mask, "ratio": np.array(0.3, F64), "tm": tm},
         {"dx": np.where(mask, dy.astype(F64) / 0.7, 0.0)}, tol=(1e-6, 1e-12))
    case("DropoutGrad/f32_ratio_f16", grad_node("DropoutGrad", ["dy", "mask", "ratio", "tm"], ["dx"]),
         {"dy": dy, "mask": mask, "ratio": np.array(0.25, np.float16), "tm": tm}, {"dx": ref(dy, mask, 0.25, F32)},
         tol=EXACT)
    # training_mode=false: the forward Dropout is then the identity, so the gradient is dy. The
    # 1.19.2 CPU kernel (and the schema's function body) ignore training_mode and still apply
    # mask/(1-ratio) -- a gradient of a forward that did not happen. ORTModule always feeds true;
    # ortagent's lowering deliberately gives the identity's gradient (no kernel check here).
    case("DropoutGrad/training_mode_false", grad_node("DropoutGrad", ["dy", "mask", "ratio", "tm"], ["dx"]),
         {"dy": dy, "mask": mask, "ratio": ratio, "tm": np.array(False)}, {"dx": dy}, tol=EXACT, kernel=False)

    # BitmaskDropoutGrad: element i is kept iff bit (i % 32) of mask[i // 32] is set (LSB first).
    n = 70
    dyb = r.standard_normal((7, 10)).astype(F32)
    keep = r.random(n) >= 0.25
    words = np.zeros((n + 31) // 32, np.uint32)
    for i in np.flatnonzero(keep):
        words[i // 32] |= np.uint32(1) << np.uint32(i % 32)
    words[-1] |= np.uint32(0xFFFFFFFF) << np.uint32(n % 32)  # garbage in the padding bits
    keep2 = keep.reshape(7, 10)
    case("BitmaskDropoutGrad/ratio", grad_node("BitmaskDropoutGrad", ["dy", "mask", "ratio", "tm"], ["dx"]),
         {"dy": dyb, "mask": words, "ratio": np.array(0.25, F32), "tm": tm}, {"dx": ref(dyb, keep2, 0.25, F32)},
         tol=EXACT, kernel=False)
    case("BitmaskDropoutGrad/no_ratio", grad_node("BitmaskDropoutGrad", ["dy", "mask"], ["dx"]),
         {"dy": dyb, "mask": words}, {"dx": ref(dyb, keep2, 0.5, F32)}, tol=EXACT, kernel=False)


_dropout_cases()


def _scale_cases():
    r = rng(8)
    x = r.standard_normal((3, 7)).astype(F32)
    for sd in (0, 1):
        for sname, sval in (("f32", np.array(3.0, F32)), ("i64", np.array(3, np.int64)), ("f64", np.array(7.0, F64)),
                            ("i32", np.array(6, np.int32))):
            for dt in (F32, F64):
                s32 = np.float32(sval)
                # The kernel converts the scale to float, and multiplies by the float reciprocal when scaling down.
                factor = (np.float32(1) / s32) if sd else s32
                case(f"Scale/scale_down={sd}/{sname}/{np.dtype(dt).name}",
                     grad_node("Scale", ["x", "s"], ["y"], scale_down=sd), {"x": x.astype(dt), "s": sval},
                     {"y": x.astype(dt) * dt(factor)}, tol=EXACT)
    a, b, c = (r.standard_normal((2, 5)).astype(F32) for _ in range(3))
    case("ScaledSum/two", grad_node("ScaledSum", ["a", "b"], ["y"], scale_0=0.5, scale_1=-2.0), {"a": a, "b": b},
         {"y": (0.5 * a.astype(F64) - 2.0 * b).astype(F32)}, kernel=False)
    case("ScaledSum/three", grad_node("ScaledSum", ["a", "b", "c"], ["y"], scale_0=0.25, scale_1=3.0, scale_2=-1.5),
         {"a": a, "b": b, "c": c}, {"y": (0.25 * a.astype(F64) + 3.0 * b - 1.5 * c).astype(F32)}, kernel=False)
    case("BatchScale/two", grad_node("BatchScale", ["a"], ["y0", "y1"], scale_0=0.5, scale_1=-3.0), {"a": a},
         {"y0": a * F32(0.5), "y1": a * F32(-3.0)}, tol=EXACT, kernel=False)
    case("BatchScale/three", grad_node("BatchScale", ["a"], ["y0", "y1", "y2"], scale_0=2.0, scale_1=0.1, scale_2=7.0),
         {"a": a}, {"y0": a * F32(2.0), "y1": a * F32(0.1), "y2": a * F32(7.0)}, tol=EXACT, kernel=False)

    xi = r.integers(-50, 50, (2, 3, 4)).astype(F32)
    for tag, axes, kd, noop in (("axis1", [1], 1, 0), ("neg_axes_nokeep", [-1, 0], 0, 0), ("empty_all", [], 1, 0),
                                ("empty_noop", [], 0, 1), ("empty_all_nokeep", [], 0, 0)):
        if axes:
            ref = xi.sum(axis=tuple(axes), keepdims=bool(kd))
        elif noop:
            ref = xi
        else:
            ref = xi.sum(axis=None, keepdims=bool(kd))
        case(f"ReduceSumTraining/{tag}", grad_node("ReduceSumTraining", ["x", "axes"], ["y"], keepdims=kd,
                                                   noop_with_empty_axes=noop),
             {"x": xi, "axes": np.array(axes, np.int64)}, {"y": ref}, tol=EXACT)
    xf = r.standard_normal((3, 4))
    case("ReduceSumTraining/f64", grad_node("ReduceSumTraining", ["x", "axes"], ["y"]),
         {"x": xf, "axes": np.array([0], np.int64)}, {"y": xf.sum(axis=0, keepdims=True)}, tol=RED)


_scale_cases()


def broadcast_gradient_args_ref(a, b):
    """Axes (in the broadcast shape's frame, last to first) over which a and b were broadcast."""
    n = max(len(a), len(b))
    pa, pb = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    a_axes, b_axes = [], []
    for k in reversed(range(n)):
        if k < n - len(a):
            a_axes.append(k)
        elif k < n - len(b):
            b_axes.append(k)
        elif pa[k] != pb[k]:
            (a_axes if pa[k] == 1 else b_axes).append(k)
    return np.array(a_axes, np.int64), np.array(b_axes, np.int64)


def _broadcast_cases():
    r = rng(9)
    for a, b in (((2, 3, 4), (3, 1)), ((1, 4), (3, 1)), ((5,), (2, 3, 5)), ((2, 1, 4), (2, 1, 4)), ((1,), (1, 1, 1)),
                 ((3, 4), ())):
        ea, eb = broadcast_gradient_args_ref(a, b)
        case(f"BroadcastGradientArgs/{a}_{b}", grad_node("BroadcastGradientArgs", ["a", "b"], ["a_axes", "b_axes"]),
             {"a": np.array(a, np.int64), "b": np.array(b, np.int64)}, {"a_axes": ea, "b_axes": eb}, tol=EXACT)
    # DivGrad with broadcasting; outputs optional
    A = r.standard_normal((2, 3, 4)).astype(F32)
    B = (r.random((3, 1)) + 0.5).astype(F32)
    dY = r.standard_normal((2, 3, 4)).astype(F32)
    d64, A64, B64 = dY.astype(F64), A.astype(F64), B.astype(F64)
    dA = d64 / B64
    dB = (-d64 * A64 / B64 ** 2).sum(axis=(0, 2)).reshape(3, 1)
    feeds = {"dY": dY, "A": A, "B": B}
    case("DivGrad/both", grad_node("DivGrad", ["dY", "A", "B"], ["dA", "dB"]), feeds, {"dA": dA.astype(F32),
                                                                                     "dB": dB.astype(F32)})
    case("DivGrad/only_dB", grad_node("DivGrad", ["dY", "A", "B"], ["", "dB"]), feeds, {"dB": dB.astype(F32)})
    # dividend broadcast, f64, only dA requested
    A2, B2 = A.astype(F64)[:1, :, :1], (B64 + 1.0) * np.ones((2, 3, 4))
    case("DivGrad/only_dA_f64", grad_node("DivGrad", ["dY", "A", "B"], ["dA"]), {"dY": d64, "A": A2, "B": B2},
         {"dA": (d64 / B2).sum(axis=(0, 2), keepdims=True)})


_broadcast_cases()


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------

def _log_softmax_axis1(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def nll_ref(logp, labels, weight, ignore, reduction):
    """ONNX NegativeLogLikelihoodLoss with ignore_index (float64)."""
    lab = labels.astype(np.int64)
    ign = (lab == ignore) if ignore is not None else np.zeros(lab.shape, bool)
    safe = np.where(ign, 0, lab)
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = weight[safe] if weight is not None else np.ones(lab.shape)
    w = np.where(ign, 0.0, w)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


def sce_grad_ref(dy, logp, labels, weight, ignore, reduction):
    lab = labels.astype(np.int64)
    ign = (lab == ignore) if ignore is not None else np.zeros(lab.shape, bool)
    safe = np.where(ign, 0, lab)
    w = weight[safe] if weight is not None else np.ones(lab.shape)
    w = np.where(ign, 0.0, w)
    if reduction == "mean":
        dloss = w * dy / w.sum()
    else:
        dloss = w * np.broadcast_to(dy, lab.shape)
    onehot = np.zeros_like(logp)
    np.put_along_axis(onehot, safe[:, None], 1.0, axis=1)
    return dloss[:, None] * (np.exp(logp) - onehot)


def _loss_cases():
    r = rng(10)
    for shape_tag, sshape, lshape in (("2d", (6, 5), (6,)), ("4d", (2, 5, 3, 2), (2, 3, 2))):
        scores = r.standard_normal(sshape).astype(F32)
        labels = r.integers(0, 5, lshape).astype(np.int64)
        labels.reshape(-1)[1] = -100
        weight = (r.random(5) + 0.5).astype(F32)
        logp = _log_softmax_axis1(scores.astype(F64))
        for reduction in ("mean", "sum", "none"):
            for use_w, use_ign in ((False, True), (True, True), (True, False)):
                if not use_ign:
                    lab = np.where(labels < 0, 2, labels)
                else:
                    lab = labels
                w64 = weight.astype(F64) if use_w else None
                ign = -100 if use_ign else None
                ins = ["scores", "labels", "weight" if use_w else "", "ignore_index" if use_ign else ""]
                while ins and ins[-1] == "":
                    ins.pop()
                feeds = {"scores": scores, "labels": lab}
                if use_w:
                    feeds["weight"] = weight
                if use_ign:
                    feeds["ignore_index"] = np.array(-100, np.int64)
                tag = f"{shape_tag}/{reduction}/w={int(use_w)}/ign={int(use_ign)}"
                loss = nll_ref(logp, lab, w64, ign, reduction)
                case(f"SoftmaxCrossEntropyLossInternal/{tag}",
                     fwd_node("SoftmaxCrossEntropyLossInternal", ins, ["loss", "log_prob"], reduction=reduction),
                     feeds, {"loss": loss.astype(F32), "log_prob": logp.astype(F32)})
                for op in ("NegativeLogLikelihoodLossInternal", "NegativeLogLikelihoodLossInternal2"):
                    nfeeds = dict(feeds)
                    nfeeds["scores"] = logp.astype(F32)
                    # 1.19.2 cannot run NegativeLogLikelihoodLossInternal (v1) in an opset-17 model: its
                    # function body is written for opset 12 (Unsqueeze with an axes attribute).
                    case(f"{op}/{tag}", fwd_node(op, ins, ["loss"], reduction=reduction), nfeeds,
                         {"loss": nll_ref(logp.astype(F32).astype(F64), lab, w64, ign, reduction).astype(F32)},
                         kernel=op.endswith("2"))
                dy = np.array(1.7, F32) if reduction != "none" else r.standard_normal(lshape).astype(F32)
                gins = ["dY", "log_prob", "labels", "weight" if use_w else "", "ignore_index" if use_ign else ""]
                while gins[-1] == "":
                    gins.pop()
                gfeeds = {"dY": dy, "log_prob": logp.astype(F32), "labels": lab}
                gfeeds.update({k: v for k, v in feeds.items() if k in ("weight", "ignore_index")})
                lp = logp.astype(F32).astype(F64)
                gref = sce_grad_ref(dy.astype(F64), lp, lab, w64, ign, reduction)
                case(f"SoftmaxCrossEntropyLossInternalGrad/{tag}",
                     grad_node("SoftmaxCrossEntropyLossInternalGrad", gins, ["d_logits"], reduction=reduction),
                     gfeeds, {"d_logits": gref.astype(F32)})
        # bias input (index 5) with weight omitted (''), ignore_index given; and output_type
        bias = r.standard_normal(sshape).astype(F32)
        gfeeds = {"dY": np.array(0.5, F32), "log_prob": logp.astype(F32), "labels": labels,
                  "ignore_index": np.array(-100, np.int64), "bias": bias}
        gref = sce_grad_ref(0.5, logp.astype(F32).astype(F64), labels, None, -100, "mean") + bias
        case(f"SoftmaxCrossEntropyLossInternalGrad/{shape_tag}/bias",
             grad_node("SoftmaxCrossEntropyLossInternalGrad", ["dY", "log_prob", "labels", "", "ignore_index", "bias"],
                       ["d_logits"], reduction="mean", output_type=TensorProto.FLOAT), gfeeds,
             {"d_logits": gref.astype(F32)})
        # output_type wider than the input: float16 scores, float32 loss and log_prob
        s16 = scores.astype(np.float16)
        lp16 = _log_softmax_axis1(s16.astype(F64))
        case(f"SoftmaxCrossEntropyLossInternal/{shape_tag}/f16_output_type_f32",
             fwd_node("SoftmaxCrossEntropyLossInternal", ["scores", "labels", "", "ignore_index"],
                      ["loss", "log_prob"], output_type=TensorProto.FLOAT),
             {"scores": s16, "labels": labels, "ignore_index": np.array(-100, np.int64)},
             {"loss": nll_ref(lp16, labels, None, -100, "mean").astype(F32), "log_prob": lp16.astype(F32)},
             kernel=False)


_loss_cases()


# --------------------------------------------------------------------------------------------
# BatchNorm
# --------------------------------------------------------------------------------------------

def _batchnorm_cases():
    r = rng(11)
    for tag, shape, momentum in (("4d_default_momentum", (2, 3, 4, 5), None), ("3d_momentum0.7", (4, 3, 6), 0.7)):
        x = r.standard_normal(shape).astype(F32) * 2 + 1
        c = shape[1]
        scale, b = r.standard_normal(c).astype(F32), r.standard_normal(c).astype(F32)
        rm, rv = r.standard_normal(c).astype(F32), (r.random(c) + 0.5).astype(F32)
        eps = 1e-3
        axes = (0,) + tuple(range(2, len(shape)))
        bshape = (1, c) + (1,) * (len(shape) - 2)
        x64 = x.astype(F64)
        mu = x64.mean(axis=axes)
        var = x64.var(axis=axes)  # biased (population) variance, as the CPU kernel
        inv = 1 / np.sqrt(var + eps)
        mom = 0.9 if momentum is None else momentum
        y = (x64 - mu.reshape(bshape)) * inv.reshape(bshape) * scale.reshape(bshape) + b.reshape(bshape)
        attrs = {"epsilon": eps}
        if momentum is not None:
            attrs["momentum"] = momentum
        feeds = {"X": x, "scale": scale, "B": b, "mean": rm, "var": rv}
        case(f"BatchNormInternal/{tag}",
             fwd_node("BatchNormInternal", list(feeds), ["Y", "running_mean", "running_var", "saved_mean",
                                                         "saved_inv_std"], **attrs), feeds,
             {"Y": y.astype(F32), "running_mean": (mom * rm + (1 - mom) * mu).astype(F32),
              "running_var": (mom * rv + (1 - mom) * var).astype(F32), "saved_mean": mu.astype(F32),
              "saved_inv_std": inv.astype(F32)})
        # BatchNormalizationGrad: input 4 is saved_inv_std (NOT the variance)
        dy = r.standard_normal(shape).astype(F32)
        m = x.size // c
        mu_t, inv_t = mu.astype(F32).astype(F64), inv.astype(F32).astype(F64)
        xh = (x64 - mu_t.reshape(bshape)) * inv_t.reshape(bshape)
        d64 = dy.astype(F64)
        db = d64.sum(axis=axes)
        ds = (d64 * xh).sum(axis=axes)
        dx = (scale.astype(F64) * inv_t).reshape(bshape) / m * (m * d64 - db.reshape(bshape) - xh * ds.reshape(bshape))
        gfeeds = {"dY": dy, "X": x, "scale": scale, "saved_mean": mu_t.astype(F32), "saved_inv_std": inv_t.astype(F32)}
        case(f"BatchNormalizationGrad/{tag}",
             grad_node("BatchNormalizationGrad", list(gfeeds), ["dX", "dscale", "dbias"], epsilon=eps), gfeeds,
             {"dX": dx.astype(F32), "dscale": ds.astype(F32), "dbias": db.astype(F32)}, tol=(1e-4, 1e-5))


_batchnorm_cases()


# --------------------------------------------------------------------------------------------
# Conv and pooling gradients
# --------------------------------------------------------------------------------------------

def conv_grad_ref(dy, x, w, strides, pads, dilations, group):
    """dX, dW, dB of ONNX Conv (N-D, groups) by explicit correlation over kernel positions (float64)."""
    nd = x.ndim - 2
    x64, w64, dy64 = x.astype(F64), w.astype(F64), dy.astype(F64)
    pb, pe = pads[:nd], pads[nd:]
    xp = np.pad(x64, [(0, 0), (0, 0)] + list(zip(pb, pe)))
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w64)
    out = dy.shape[2:]
    cg, mg = x.shape[1] // group, w.shape[0] // group
    for k in np.ndindex(*w.shape[2:]):
        sl = tuple(slice(k[i] * dilations[i], k[i] * dilations[i] + (out[i] - 1) * strides[i] + 1, strides[i])
                   for i in range(nd))
        for g in range(group):
            xs = xp[(slice(None), slice(g * cg, (g + 1) * cg)) + sl]
            dys = dy64[:, g * mg:(g + 1) * mg]
            n = dys.shape[0]
            dys2, xs2 = dys.reshape(n, mg, -1), xs.reshape(n, cg, -1)
            dw[(slice(g * mg, (g + 1) * mg), slice(None)) + k] += np.einsum("nmp,ncp->mc", dys2, xs2)
            wk = w64[(slice(g * mg, (g + 1) * mg), slice(None)) + k]
            dxp[(slice(None), slice(g * cg, (g + 1) * cg)) + sl] += np.einsum("nmp,mc->ncp", dys2, wk).reshape(xs.shape)
    crop = tuple(slice(pb[i], pb[i] + x.shape[2 + i]) for i in range(nd))
    return dxp[(slice(None), slice(None)) + crop], dw, dy64.sum(axis=(0,) + tuple(range(2, dy.ndim)))


def _conv_cases():
    r = rng(12)
    specs = [  # tag, x shape, w shape, strides, pads, dilations, group
        ("2d_basic", (2, 3, 6, 5), (4, 3, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),
        ("2d_stride_pad_dilation_group", (2, 4, 9, 8), (6, 2, 3, 2), [2, 3], [1, 0, 2, 1], [2, 1], 2),
        ("2d_depthwise_stride2", (1, 3, 7, 7), (3, 1, 3, 3), [2, 2], [0, 0, 0, 0], [1, 1], 3),
        ("1d_stride_dilation", (2, 3, 11), (5, 3, 3), [2], [2, 1], [2], 1),
        ("3d_stride_pad_dilation", (2, 3, 5, 6, 4), (4, 3, 2, 3, 2), [1, 2, 1], [1, 0, 1, 0, 1, 1], [1, 1, 2], 1),
        ("2d_depthwise_multiplier", (2, 4, 7, 6), (8, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 4),
        ("2d_pointwise_stride2", (3, 5, 6, 6), (7, 5, 1, 1), [2, 2], [0, 0, 0, 0], [1, 1], 1),
        ("2d_batch1_dilation_uneven", (1, 2, 8, 9), (3, 2, 3, 3), [2, 2], [2, 1, 2, 0], [2, 2], 1),
        ("2d_groups3_stride2", (2, 6, 7, 7), (9, 2, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 3),
        # stride 1 everywhere: dX is one ConvTranspose with the forward's (here uneven) pads
        ("2d_stride1_uneven_pads_dilation", (2, 3, 7, 6), (4, 3, 3, 2), [1, 1], [2, 0, 1, 1], [2, 1], 1),
        ("1d_stride1_depthwise_pad_end", (2, 4, 9), (4, 1, 5), [1], [0, 3], [1], 4),
        # 1x1 kernels at stride 1 without pads: the windows are the input itself (no Conv)
        ("2d_pointwise", (2, 5, 6, 4), (7, 5, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1),
        ("2d_pointwise_groups", (2, 6, 5, 5), (4, 3, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 2),
        ("1d_pointwise_dilated", (3, 4, 7), (6, 4, 1), [1], [0, 0], [3], 1),
    ]
    for tag, xs, ws, strides, pads, dil, group in specs:
        x = r.standard_normal(xs).astype(F32)
        w = r.standard_normal(ws).astype(F32)
        nd = len(xs) - 2
        out = [(xs[2 + i] + pads[i] + pads[nd + i] - dil[i] * (ws[2 + i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
        dy = r.standard_normal((xs[0], ws[0], *out)).astype(F32)
        dx, dw, db = conv_grad_ref(dy, x, w, strides, pads, dil, group)
        attrs = dict(kernel_shape=list(ws[2:]), strides=strides, pads=pads, dilations=dil, group=group)
        feeds = {"dY": dy, "X": x, "W": w}
        case(f"ConvGrad/{tag}", grad_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], **attrs), feeds,
             {"dX": dx.astype(F32), "dW": dw.astype(F32), "dB": db.astype(F32)}, tol=CONV)
        if tag == "2d_stride_pad_dilation_group":
            case(f"ConvGrad/{tag}/no_dX", grad_node("ConvGrad", ["dY", "X", "W"], ["", "dW", "dB"], **attrs), feeds,
                 {"dW": dw.astype(F32), "dB": db.astype(F32)}, tol=CONV)
            case(f"ConvGrad/{tag}/only_dX", grad_node("ConvGrad", ["dY", "X", "W"], ["dX"], **attrs), feeds,
                 {"dX": dx.astype(F32)}, tol=CONV)
            case(f"ConvGrad/{tag}/dX_dW", grad_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", ""], **attrs), feeds,
                 {"dX": dx.astype(F32), "dW": dw.astype(F32)}, tol=CONV)
        if tag in ("2d_basic", "2d_stride_pad_dilation_group", "2d_depthwise_stride2", "3d_stride_pad_dilation",
                   "2d_stride1_uneven_pads_dilation", "2d_pointwise", "2d_pointwise_groups"):
            # no static shape anywhere (the weight gradient by correlation), and only the
            # weight's (ORTModule's graphs: the window product with batch and positions known
            # at run time only)
            for suffix, symbolic in (("symbolic", ("dY", "X", "W")), ("symbolic_activations", ("dY", "X"))):
                case(f"ConvGrad/{tag}/{suffix}", grad_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], **attrs),
                     feeds, {"dX": dx.astype(F32), "dW": dw.astype(F32), "dB": db.astype(F32)}, tol=CONV,
                     symbolic_inputs=symbolic, kernel=False)


_conv_cases()


def pool_windows(in_size, k, s, pb, out):
    """[(start, end)] of each output position's window in input coordinates (unclipped)."""
    return [(o * s - pb, o * s - pb + k) for o in range(out)]


def maxpool_ref(x, k, s, p, plane_indices):
    """MaxPool 2-D forward with argmax indices (first max), per-plane (ATen) or global (ONNX) flat."""
    n, c, h, w = x.shape
    oh = (h + 2 * p[0] - k[0]) // s[0] + 1
    ow = (w + 2 * p[1] - k[1]) // s[1] + 1
    y = np.zeros((n, c, oh, ow), x.dtype)
    idx = np.zeros((n, c, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = max(i * s[0] - p[0], 0), max(j * s[1] - p[1], 0)
            h1, w1 = min(i * s[0] - p[0] + k[0], h), min(j * s[1] - p[1] + k[1], w)
            win = x[:, :, h0:h1, w0:w1].reshape(n, c, -1)
            a = win.argmax(axis=2)
            y[:, :, i, j] = win.max(axis=2)
            hh, ww = h0 + a // (w1 - w0), w0 + a % (w1 - w0)
            idx[:, :, i, j] = hh * w + ww
    if not plane_indices:
        idx += (np.arange(n * c).reshape(n, c, 1, 1) * h * w)
    return y, idx


def avgpool_grad_ref(dy, in_shape, k, s, pb, count_include_pad, pad_end=None, torch_style=False):
    """Adjoint of 1-D/2-D average pooling. ORT's AveragePoolGrad divides by prod(k) (count_include_pad)
    or by the clipped window size; torch's avg_pool2d divides by the window clipped to the padded
    input (count_include_pad) or to the input."""
    nd = len(k)
    dx = np.zeros(in_shape, F64)
    outs = dy.shape[2:]
    for o in np.ndindex(*outs):
        lo = [o[i] * s[i] - pb[i] for i in range(nd)]
        hi = [lo[i] + k[i] for i in range(nd)]
        clo = [max(v, 0) for v in lo]
        chi = [min(hi[i], in_shape[2 + i]) for i in range(nd)]
        if count_include_pad:
            if torch_style:
                div = np.prod([min(hi[i], in_shape[2 + i] + pad_end[i]) - lo[i] for i in range(nd)])
            else:
                div = np.prod(k)
        else:
            div = np.prod([chi[i] - clo[i] for i in range(nd)])
        sl = (slice(None), slice(None)) + tuple(slice(clo[i], chi[i]) for i in range(nd))
        dx[sl] += dy[(slice(None), slice(None)) + o].astype(F64)[(...,) + (None,) * nd] / div
    return dx


def _pool_cases():
    r = rng(13)
    # MaxPoolGrad (ai.onnx v9): indices are ONNX MaxPool's global flat indices; dX shape from value_info.
    x = r.standard_normal((2, 3, 4, 6)).astype(F32)
    for tag, k, s, exact in (("nonoverlapping", (2, 2), (2, 2), True), ("overlapping", (3, 3), (1, 1), False)):
        _, idx = maxpool_ref(x, k, s, (0, 0), plane_indices=False)
        dy = (r.integers(-9, 9, idx.shape) if exact else r.standard_normal(idx.shape)).astype(F32)
        ref = np.zeros(x.size)
        np.add.at(ref, idx.reshape(-1), dy.reshape(-1).astype(F64))
        case(f"MaxPoolGrad/{tag}", grad_node("MaxPoolGrad", ["dY", "indices"], ["dX"], domain="",
                                             kernel_shape=list(k), strides=list(s)),
             {"dY": dy, "indices": idx}, {"dX": ref.reshape(x.shape).astype(F32)}, shapes={"dX": list(x.shape)},
             tol=EXACT if exact else RED)
    # AveragePoolGrad (ai.onnx v9); count_include_pad default 0.
    for tag, ishape, k, s, pads, cip in (("2d_pad_cip0", (2, 3, 5, 6), [3, 3], [2, 2], [1, 1, 1, 1], 0),
                                         ("2d_pad_cip1", (2, 3, 5, 6), [3, 3], [2, 2], [1, 1, 1, 1], 1),
                                         ("2d_default_cip", (1, 2, 6, 4), [2, 2], [2, 1], [0, 0, 0, 0], None),
                                         ("1d_pad_cip0", (2, 2, 7), [3], [2], [1, 1], 0)):
        nd = len(k)
        outs = [(ishape[2 + i] + pads[i] + pads[nd + i] - k[i]) // s[i] + 1 for i in range(nd)]
        dy = r.standard_normal(ishape[:2] + tuple(outs)).astype(F32)
        ref = avgpool_grad_ref(dy, ishape, k, s, pads[:nd], bool(cip))
        attrs = dict(kernel_shape=k, strides=s, pads=pads)
        if cip is not None:
            attrs["count_include_pad"] = cip
        case(f"AveragePoolGrad/{tag}", grad_node("AveragePoolGrad", ["dY"], ["dX"], domain="", **attrs), {"dY": dy},
             {"dX": ref.astype(F32)}, shapes={"dX": list(ishape)})


_pool_cases()


# --------------------------------------------------------------------------------------------
# org.pytorch.aten:ATen as ORTModule exports it (non-tensor arguments are constant inputs)
# --------------------------------------------------------------------------------------------

def aten_node(operator, inputs, outputs, backward=False, name=None):
    make = grad_node if backward else fwd_node
    return make("ATen", inputs, outputs, domain=ATEN, name=name or f"ATen_{operator}", operator=operator)


ATEN_OPSET = [helper.make_opsetid(ATEN, 1)]


def _constants(style, values):
    """Non-tensor ATen arguments as initializers or as Constant nodes (both occur in exported graphs)."""
    if style == "initializer":
        return [], dict(values)
    nodes = [helper.make_node("Constant", [], [n], value=onnx.numpy_helper.from_array(np.asarray(v), n))
             for n, v in values.items()]
    return nodes, {}


def _aten_cases():
    r = rng(14)
    weight = r.standard_normal((10, 4)).astype(F32)
    indices = np.array([[1, 3, 3], [9, 0, 3]], np.int64)
    for style in ("initializer", "constant_node"):
        cn, inits = _constants(style, {"padding_idx": np.array(-1, np.int64), "sgbf": np.array(False),
                                       "sparse": np.array(False)})
        case(f"ATen/embedding/{style}",
             cn + [aten_node("embedding", ["weight", "indices", "padding_idx", "sgbf", "sparse"], ["y"])],
             {"weight": weight, "indices": indices}, {"y": weight[indices]}, tol=EXACT, kernel=False,
             initializers=inits, extra_opsets=ATEN_OPSET)
    grad = r.integers(-9, 9, (2, 3, 4)).astype(F32)
    for padding_idx, sgbf in ((-1, False), (3, False), (-1, True), (0, True)):
        expected = np.zeros((10, 4))
        flat = indices.reshape(-1)
        counts = np.bincount(flat, minlength=10)
        for k, i in enumerate(flat):
            if i == padding_idx:
                continue
            expected[i] += grad.reshape(-1, 4)[k] / (counts[i] if sgbf else 1)
        for style in ("initializer", "constant_node"):
            cn, inits = _constants(style, {"padding_idx": np.array(padding_idx, np.int64), "sgbf": np.array(sgbf),
                                           "sparse": np.array(False), "zero": np.array(0, np.int64)})
            nodes = cn + [helper.make_node("Shape", ["weight"], ["weight_shape"], name="Shape_w"),
                          helper.make_node("Gather", ["weight_shape", "zero"], ["num_weights"], axis=0, name="G_w"),
                          aten_node("embedding_backward", ["grad", "indices", "num_weights", "padding_idx", "sgbf",
                                                           "sparse"], ["dweight"], backward=True)]
            case(f"ATen/embedding_backward/pad={padding_idx}/sgbf={int(sgbf)}/{style}", nodes,
                 {"grad": grad, "indices": indices, "weight": weight}, {"dweight": expected.astype(F32)},
                 tol=EXACT if not sgbf else RED, kernel=False, initializers=inits, extra_opsets=ATEN_OPSET)

    x = r.standard_normal((2, 3, 6, 7)).astype(F32)
    for tag, k, s, p in (("k2s2", [2, 2], [2, 2], [0, 0]), ("k3s2p1", [3, 3], [2, 2], [1, 1])):
        y, idx = maxpool_ref(x, k, s, p, plane_indices=True)
        consts = {"k": np.array(k, np.int64), "s": np.array(s, np.int64), "p": np.array(p, np.int64),
                  "d": np.array([1, 1], np.int64), "ceil": np.array(False)}
        cn, inits = _constants("initializer", consts)
        case(f"ATen/max_pool2d_with_indices/{tag}",
             aten_node("max_pool2d_with_indices", ["x", "k", "s", "p", "d", "ceil"], ["y", "indices"]),
             {"x": x}, {"y": y, "indices": idx}, tol=EXACT, kernel=False, initializers=inits, extra_opsets=ATEN_OPSET)
        gy = (r.integers(-9, 9, y.shape) if tag == "k2s2" else r.standard_normal(y.shape)).astype(F32)
        dx = np.zeros((6, 6 * 7))
        for plane in range(6):
            np.add.at(dx[plane], idx.reshape(6, -1)[plane], gy.reshape(6, -1)[plane].astype(F64))
        case(f"ATen/max_pool2d_with_indices_backward/{tag}",
             aten_node("max_pool2d_with_indices_backward", ["gy", "x", "k", "s", "p", "d", "ceil", "indices"], ["dx"],
                       backward=True),
             {"gy": gy, "x": x, "indices": idx}, {"dx": dx.reshape(x.shape).astype(F32)},
             tol=EXACT if tag == "k2s2" else RED, kernel=False, initializers=inits, extra_opsets=ATEN_OPSET)

    for tag, k, s, p, cip in (("k2s2", [2, 2], [2, 2], [0, 0], True), ("k3s2p1_cip", [3, 3], [2, 2], [1, 1], True),
                              ("k3s2p1_nocip", [3, 3], [2, 2], [1, 1], False)):
        consts = {"k": np.array(k, np.int64), "s": np.array(s, np.int64), "p": np.array(p, np.int64),
                  "ceil": np.array(False), "cip": np.array(cip)}
        cn, inits = _constants("initializer", consts)
        oh = (6 + 2 * p[0] - k[0]) // s[0] + 1
        ow = (7 + 2 * p[1] - k[1]) // s[1] + 1
        # forward by the adjoint identity: y = A x, with A from the backward reference applied to unit vectors
        y = np.zeros((2, 3, oh, ow))
        for i in range(oh):
            for j in range(ow):
                unit = np.zeros((1, 1, oh, ow))
                unit[0, 0, i, j] = 1
                a = avgpool_grad_ref(unit, (1, 1, 6, 7), k, s, p, cip, pad_end=p, torch_style=True)[0, 0]
                y[:, :, i, j] = (x.astype(F64) * a).sum(axis=(2, 3))
        case(f"ATen/avg_pool2d/{tag}",
             aten_node("avg_pool2d", ["x", "k", "s", "p", "ceil", "cip", ""], ["y"]), {"x": x}, {"y": y.astype(F32)},
             kernel=False, initializers=inits, extra_opsets=ATEN_OPSET)
        gy = r.standard_normal((2, 3, oh, ow)).astype(F32)
        dx = avgpool_grad_ref(gy, x.shape, k, s, p, cip, pad_end=p, torch_style=True)
        case(f"ATen/avg_pool2d_backward/{tag}",
             aten_node("avg_pool2d_backward", ["gy", "x", "k", "s", "p", "ceil", "cip", ""], ["dx"], backward=True),
             {"gy": gy, "x": x}, {"dx": dx.astype(F32)}, kernel=False, initializers=inits, extra_opsets=ATEN_OPSET)

    for out_size in ([3, 2], [1, 1], [2, 7]):
        oh, ow = out_size
        hb = [(i * 6 // oh, -(-(i + 1) * 6 // oh)) for i in range(oh)]
        wb = [(j * 7 // ow, -(-(j + 1) * 7 // ow)) for j in range(ow)]
        y = np.zeros((2, 3, oh, ow))
        gy = r.standard_normal((2, 3, oh, ow)).astype(F32)
        dx = np.zeros(x.shape)
        for i, (h0, h1) in enumerate(hb):
            for j, (w0, w1) in enumerate(wb):
                y[:, :, i, j] = x[:, :, h0:h1, w0:w1].astype(F64).mean(axis=(2, 3))
                dx[:, :, h0:h1, w0:w1] += gy[:, :, i:i + 1, j:j + 1].astype(F64) / ((h1 - h0) * (w1 - w0))
        inits = {"out_size": np.array(out_size, np.int64)}
        case(f"ATen/_adaptive_avg_pool2d/{oh}x{ow}", aten_node("_adaptive_avg_pool2d", ["x", "out_size"], ["y"]),
             {"x": x}, {"y": y.astype(F32)}, kernel=False, initializers=inits, extra_opsets=ATEN_OPSET)
        case(f"ATen/_adaptive_avg_pool2d_backward/{oh}x{ow}",
             aten_node("_adaptive_avg_pool2d_backward", ["gy", "x"], ["dx"], backward=True),
             {"gy": gy, "x": x}, {"dx": dx.astype(F32)}, kernel=False, extra_opsets=ATEN_OPSET)


_aten_cases()

CASE_IDS = [c.id for c in CASES]
assert len(set(CASE_IDS)) == len(CASE_IDS), "duplicate case ids"
BY_ID = {c.id: c for c in CASES}


# --------------------------------------------------------------------------------------------
# Running and comparing
# --------------------------------------------------------------------------------------------

def _output_dtype(model, name):
    for o in model.graph.output:
        if o.name == name:
            return helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type)
    raise KeyError(name)


def assert_matches(c: Case, results: dict, tol, what: str):
    model = c.model()
    for name, expected in c.expected.items():
        actual = np.asarray(results[name])
        want_dtype = _output_dtype(model, name)
        assert actual.dtype == want_dtype, f"{c.id} {what}: output {name!r} has dtype {actual.dtype}, not {want_dtype}"
        assert actual.shape == expected.shape, (
            f"{c.id} {what}: output {name!r} has shape {actual.shape}, expected {expected.shape}")
        if tol == EXACT:
            ok = np.array_equal(actual, expected.astype(want_dtype), equal_nan=actual.dtype.kind == "f")
            assert ok, f"{c.id} {what}: output {name!r} differs (exact):\n{actual}\nvs\n{expected}"
        else:
            rtol, atol = tol
            np.testing.assert_allclose(actual.astype(F64), expected.astype(F64), rtol=rtol, atol=atol,
                                       err_msg=f"{c.id} {what}: output {name!r}")


def run_stock(model: onnx.ModelProto, feeds: dict, names) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(list(names), feeds)))


@pytest.fixture(scope="module")
def lower():
    from ortagent.training_ops import lower_training_ops

    return lower_training_ops


_KERNEL_SCRIPT = r"""
import json, os, sys, traceback
import numpy as np, onnx, onnxruntime as ort
root = sys.argv[1]
status = {}
for name in sorted(os.listdir(root)):
    if not name.endswith(".onnx"):
        continue
    stem = name[:-5]
    try:
        feeds = dict(np.load(os.path.join(root, stem + ".in.npz")))
        model = onnx.load(os.path.join(root, name))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        out = sess.run(names, feeds)
        np.savez(os.path.join(root, stem + ".out.npz"), **dict(zip(names, out)))
        status[stem] = "ok"
    except Exception as e:
        status[stem] = "error: " + str(e).strip().splitlines()[0][:500]
json.dump(status, open(os.path.join(root, "status.json"), "w"))
"""


@pytest.fixture(scope="module")
def kernel_outputs():
    """Every case with a 1.19.2 CPU kernel, run unlowered by onnxruntime-training 1.19.2 in one
    subprocess: {case id: ("ok", outputs) or ("error", message)}."""
    python = reference_python()
    if python is None:
        pytest.skip("no onnxruntime-training 1.19.2 environment: set ORTAGENT_REF_AGENT_PYTHON or create "
                    ".venv-refagent (make refagent)")
    with tempfile.TemporaryDirectory(prefix="ortagent-training-ops-") as root:
        stems = {}
        for i, c in enumerate(CASES):
            if not c.kernel:
                continue
            stem = f"case{i:04d}"
            stems[stem] = c.id
            onnx.save(c.model(), os.path.join(root, stem + ".onnx"))
            np.savez(os.path.join(root, stem + ".in.npz"), **c.feeds)
        script = os.path.join(root, "run_kernels.py")
        with open(script, "w") as f:
            f.write(_KERNEL_SCRIPT)
        proc = subprocess.run([python, script, root], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            pytest.fail(f"the onnxruntime-training 1.19.2 subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(os.path.join(root, "status.json")) as f:
            status = json.load(f)
        results = {}
        for stem, cid in stems.items():
            st = status.get(stem, "error: not run")
            if st == "ok":
                with np.load(os.path.join(root, stem + ".out.npz")) as z:
                    results[cid] = ("ok", {k: z[k] for k in z.files})
            else:
                results[cid] = ("error", st)
        return results


KERNEL_CASES = [c.id for c in CASES if c.kernel]


@pytest.mark.parametrize("case_id", KERNEL_CASES)
def test_reference_matches_training_kernel(case_id, kernel_outputs):
    """The NumPy reference against onnxruntime-training 1.19.2's real CPU kernel (validates the reference)."""
    c = BY_ID[case_id]
    state, payload = kernel_outputs[case_id]
    assert state == "ok", f"{case_id}: the 1.19.2 kernel failed: {payload}"
    assert_matches(c, payload, c.kernel_tol or c.tol, "1.19.2 kernel vs reference")


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_lowered_matches_reference(case_id, lower):
    c = BY_ID[case_id]
    model = c.model()
    before = model.SerializeToString()
    lowered = lower(model)
    assert model.SerializeToString() == before, "lower_training_ops modified its input model"
    assert [o.name for o in lowered.graph.output] == [o.name for o in model.graph.output]
    results = run_stock(lowered, c.feeds, list(c.expected))
    assert_matches(c, results, c.tol, "lowered vs reference")


@pytest.mark.parametrize("case_id", KERNEL_CASES)
def test_lowered_matches_training_kernel(case_id, lower, kernel_outputs):
    c = BY_ID[case_id]
    state, payload = kernel_outputs[case_id]
    if state != "ok":
        pytest.skip(f"the 1.19.2 kernel failed: {payload}")
    results = run_stock(lower(c.model()), c.feeds, list(c.expected))
    assert_matches(c, results, c.kernel_tol or c.tol, "lowered vs 1.19.2 kernel")
    # also directly: lowered against the kernel's own numbers
    reference = Case(c.id, [], {}, c.outputs, {k: np.asarray(payload[k]) for k in c.expected})
    assert_matches(reference, results, c.kernel_tol or c.tol, "lowered vs 1.19.2 kernel output")


_TRAINING_DOMAINS = {MS, ATEN}
_STANDARD_ONLY = {"", "ai.onnx"}


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_lowered_model_is_clean(case_id, lower):
    """No training op and no __backwardpass attribute survives; the model passes the ONNX checker
    (full_check where every node is a standard ONNX op)."""
    lowered = lower(BY_ID[case_id].model())
    nodes = list(lowered.graph.node)
    for f in lowered.functions:
        nodes.extend(f.node)
    for node in nodes:
        for attr in node.attribute:
            assert attr.name != "__backwardpass", f"{node.op_type} {node.name!r} keeps __backwardpass"
        assert node.domain != ATEN, f"ATen node {node.name!r} left in the lowered model"
        if node.domain in (MS,):
            assert node.op_type not in TRAINING_ONLY_OPS, f"training op {node.op_type} left in the lowered model"
    domains = {n.domain for n in nodes}
    onnx.checker.check_model(lowered, full_check=domains <= _STANDARD_ONLY)


TRAINING_ONLY_OPS = {c.nodes[-1].op_type for c in CASES} - {"Shape", "Gather", "Constant"}


def _unsupported_models():
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    specs = []
    specs.append(("PythonOp", helper.make_node(
        "PythonOp", ["x"], ["ctx", "y"], domain=MS, name="my_python_op", input_convention="d",
        input_tensor_types=[f], input_tensor_ranks=[2], output_tensor_types=[f], output_tensor_ranks=[2],
        training_mode=1), [vi("x", f, [2, 3])], [vi("y", f, None)]))
    node = helper.make_node("PythonOpGrad", ["ctx", "dy"], ["dx"], domain=MS, name="my_python_op_grad",
                            output_convention="d", input_tensor_types=[f], input_tensor_ranks=[2],
                            output_tensor_types=[f], output_tensor_ranks=[2], output_tensor_requires_grads=[1],
                            __backwardpass=1)
    node.attribute.append(helper.make_attribute("name", "MyFunction"))
    specs.append(("PythonOpGrad", node, [vi("ctx", TensorProto.INT64, []), vi("dy", f, [2, 3])], [vi("dx", f, None)]))
    specs.append(("LSTMTraining", helper.make_node("LSTMTraining", ["X", "W", "R"], ["HAll", "HFinal", "CFinal", "CAll",
                                                                                      "iofc"],
                                                   domain=MS, name="my_lstm", hidden_size=2),
                  [vi("X", f, [3, 1, 2]), vi("W", f, [1, 8, 2]), vi("R", f, [1, 8, 2])], [vi("HAll", f, None)]))
    specs.append(("LSTMGrad", helper.make_node("LSTMGrad", ["X", "W", "R"], ["dX"], domain=MS, name="my_lstm_grad",
                                               hidden_size=2, __backwardpass=1),
                  [vi("X", f, [3, 1, 2]), vi("W", f, [1, 8, 2]), vi("R", f, [1, 8, 2])], [vi("dX", f, None)]))
    specs.append(("GRUTraining", helper.make_node("GRUTraining", ["X", "W", "R"], ["HAll", "HFinal", "ZRH"], domain=MS,
                                                  name="my_gru", hidden_size=2),
                  [vi("X", f, [3, 1, 2]), vi("W", f, [1, 6, 2]), vi("R", f, [1, 6, 2])], [vi("HAll", f, None)]))
    specs.append(("FooGrad", helper.make_node("FooGrad", ["dy", "x"], ["dx"], domain=MS, name="my_foo_grad",
                                              __backwardpass=1),
                  [vi("dy", f, [2]), vi("x", f, [2])], [vi("dx", f, None)]))
    specs.append(("ATen", helper.make_node("ATen", ["x"], ["y"], domain=ATEN, name="my_aten_unknown",
                                           operator="some_unknown_aten_op"),
                  [vi("x", f, [2])], [vi("y", f, None)]))
    out = []
    for op, node, ins, outs in specs:
        g = helper.make_graph([node], "g", ins, outs)
        out.append((op, node.name, helper.make_model(g, opset_imports=OPSETS + ATEN_OPSET, ir_version=8)))
    return out


@pytest.mark.parametrize("op,node_name,model", _unsupported_models(), ids=lambda v: v if isinstance(v, str) else "")
def test_unsupported_op_raises(op, node_name, model, lower):
    from ortagent.errors import TrainingGraphError, UnsupportedTrainingOpError

    assert issubclass(UnsupportedTrainingOpError, TrainingGraphError)
    with pytest.raises(UnsupportedTrainingOpError) as info:
        lower(model)
    message = str(info.value)
    assert node_name in message and op in message, message


def test_model_without_training_ops_is_unchanged(lower):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=OPSETS, ir_version=8)
    lowered = lower(model)
    assert [n.op_type for n in lowered.graph.node] == ["Relu"]
    feeds = {"x": np.array([-1.0, 2.0], F32)}
    assert np.array_equal(run_stock(lowered, feeds, ["y"])["y"], np.array([0.0, 2.0], F32))


@pytest.mark.parametrize("group,w_shape,product", [(1, (4, 3, 3, 3), "Gemm"), (2, (6, 3, 3, 3), "MatMul")])
def test_conv_weight_gradient_is_written_in_weight_order(lower, group, w_shape, product):
    """With the weight's shape static, ConvGrad's dW comes out of one matrix product already in
    W's [Cout, Cin/group, k...] order: only a Reshape (a view) follows the product, no
    Transpose or Slice of the gradient (the correlation form transposes and cuts it)."""
    node = grad_node("ConvGrad", ["dY", "X", "W"], ["", "dW", ""], kernel_shape=[3, 3], strides=[1, 1],
                     pads=[1, 1, 1, 1], dilations=[1, 1], group=group)
    x_shape, dy_shape = ("N", 3 * group, "H", "W"), ("N", w_shape[0], "H", "W")
    graph = helper.make_graph([node], "conv_grad", [
        helper.make_tensor_value_info("dY", TensorProto.FLOAT, list(dy_shape)),
        helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape)),
        helper.make_tensor_value_info("W", TensorProto.FLOAT, list(w_shape))],
        [helper.make_tensor_value_info("dW", TensorProto.FLOAT, list(w_shape))])
    lowered = lower(helper.make_model(graph, opset_imports=OPSETS, ir_version=8))
    producers = {out: n for n in lowered.graph.node for out in n.output}
    last = producers["dW"]
    assert last.op_type == "Reshape"
    assert producers[last.input[0]].op_type == product
    assert onnx.numpy_helper.to_array(next(
        n for n in lowered.graph.node if last.input[1] in n.output).attribute[0].t).tolist() == list(w_shape)
    r = rng(5)
    x = r.standard_normal((2, 3 * group, 5, 6)).astype(F32)
    w = r.standard_normal(w_shape).astype(F32)
    dy = r.standard_normal((2, w_shape[0], 5, 6)).astype(F32)
    _, dw, _ = conv_grad_ref(dy, x, w, [1, 1], [1, 1, 1, 1], [1, 1], group)
    got = run_stock(lowered, {"dY": dy, "X": x, "W": w}, ["dW"])["dW"]
    np.testing.assert_allclose(got, dw, rtol=1e-4, atol=1e-5)
