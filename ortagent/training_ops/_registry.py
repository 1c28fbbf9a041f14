"""Which operators are training-only, and the table of their lowerings (filled by the op modules)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from onnx import AttributeProto, NodeProto

if TYPE_CHECKING:
    from ._emitter import Emitter  # noqa: F401  (named in Lowering)

MS_DOMAIN = "com.microsoft"
ATEN_DOMAINS = ("org.pytorch.aten", MS_DOMAIN)
MIN_OPSET = 16

Lowering = Callable[["Emitter", NodeProto], None]
# (domain, op_type) -> lowering; '' and 'ai.onnx' are one domain
LOWERINGS: dict[tuple[str, str], Lowering] = {}
# ATen operator name -> lowering (the node's `operator` attribute)
ATEN_LOWERINGS: dict[str, Lowering] = {}

# Training-only operators that are never lowered, and what to do instead.
REFUSED = {
    "PythonOp": "a custom torch.autograd.Function runs Python inside the graph; export the module "
                "without it (inline the function's forward) or use ortagent.torch",
    "PythonOpGrad": "the backward of a custom torch.autograd.Function runs Python inside the graph; "
                    "export the module without it",
    "LSTMTraining": "an LSTM's training form has no ONNX equivalent; unroll the recurrence at export",
    "LSTMGrad": "an LSTM's gradient has no ONNX equivalent; unroll the recurrence at export",
    "GRUTraining": "a GRU's training form has no ONNX equivalent; unroll the recurrence at export",
    "GRUGrad": "a GRU's gradient has no ONNX equivalent; unroll the recurrence at export",
    "ConvTransposeGrad": "not lowered yet; use a Conv-based upsampling or open an issue",
    "ResizeGrad": "the adjoint of Resize is not lowered; export the upsampling as ConvTranspose",
    "InPlaceAccumulator": "gradient accumulation buffers are the caller's job with TrainingAgent",
    "InPlaceAccumulatorV2": "gradient accumulation buffers are the caller's job with TrainingAgent",
    "SoftmaxDropoutGrad": "not lowered yet (BiasSoftmaxDropout fusion); build the graph without "
                          "the CUDA fusions",
    "BiasSoftmaxDropout": "not lowered yet (a CUDA fusion); build the graph without the CUDA fusions",
    "TritonOp": "Triton kernels exist only in the training build",
    "FakeQuant": "quantization-aware training ops are not lowered",
    "FakeQuantGrad": "quantization-aware training ops are not lowered",
}
# com.microsoft operators that stock onnxruntime registers and that training graphs use as they are.
_STOCK_CONTRIB_HINTS = ("Fused", "Gelu", "SkipLayerNormalization", "Attention")


def lowers(*op_types: str, domain: str = MS_DOMAIN) -> Callable[[Lowering], Lowering]:
    def register(function: Lowering) -> Lowering:
        for op_type in op_types:
            LOWERINGS[(domain, op_type)] = function
        return function
    return register


def lowers_aten(*operators: str) -> Callable[[Lowering], Lowering]:
    def register(function: Lowering) -> Lowering:
        for name in operators:
            ATEN_LOWERINGS[name] = function
        return function
    return register


def domain_of(node: NodeProto) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def is_aten(node: NodeProto) -> bool:
    return node.op_type == "ATen" and node.domain in ATEN_DOMAINS


def is_training_only(node: NodeProto) -> bool:
    """Whether stock onnxruntime lacks `node`'s operator (as far as this module can tell)."""
    domain = domain_of(node)
    if (domain, node.op_type) in LOWERINGS or is_aten(node) or node.op_type in REFUSED:
        return domain in ("", MS_DOMAIN) or is_aten(node)
    if domain == MS_DOMAIN:
        if any(hint in node.op_type for hint in _STOCK_CONTRIB_HINTS):
            return False
        return node.op_type.endswith(("Grad", "Training", "Internal", "Internal2"))
    return False


def training_attribute(attribute: AttributeProto) -> bool:
    return attribute.name.startswith("__")
