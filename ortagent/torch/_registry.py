"""torch.onnx's table of translations (torchlib's functions with ours over them), built once
per process, for :func:`ortagent.torch._export`.

torch.onnx assembles that table anew on every export, and most of the work is not the table:
every torchlib function (about 560) has its source parsed for its ONNX form and signature,
0.6-1.0 s per process, while a model dispatches a few dozen of them. The table built here
holds the same functions for the same operators in the same order, and works out a function's
signature when the exporter first asks for that operator's translations. Where torch.onnx's
internals are not those this was written against (another torch or onnxscript), the eager
table is built instead (:func:`translation_registry`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["exporter_core", "translation_registry", "eager_registry", "with_late_translations"]


@functools.cache
def exporter_core() -> Any:
    """torch.onnx's exporter module whose ``export`` takes a ``registry``, or None."""
    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError:
        return None
    wanted = {"registry", "opset_version", "optimize", "verbose", "report"}
    parameters = inspect.signature(_core.export).parameters
    if not wanted <= set(parameters) or not hasattr(_registration.ONNXRegistry, "from_torchlib"):
        return None
    return _core


@functools.lru_cache(maxsize=4)
def translation_registry(opset: int, table: Any) -> Any:
    """The translations for ``opset``, torchlib's with ours (``table()``) over them; signatures
    worked out on first use where the internals allow it. Read-only once built, but for the
    signatures it fills in (the exports that read it take turns: ``_module._EXPORT_LOCK``)."""
    from torch.onnx._internal.exporter import _constants

    opset = max(opset, _constants.TORCHLIB_OPSET)
    registry = _lazy_registry(opset)
    if registry is None:
        registry = eager_registry(opset)
    for aten_op, translation in table().items():
        registry.register_op(aten_op, translation, is_complex=False)
    return registry


def with_late_translations(registry: Any, late: Any) -> Any:
    """``registry`` with the translations ``late()`` holds now added where missing: operators
    that libraries register when imported, which a registry built before that lacks."""
    added = registry.__dict__.setdefault("_ortagent_late", set())
    for aten_op, translation in late().items():
        if aten_op not in added:
            registry.register_op(aten_op, translation, is_complex=False)
            added.add(aten_op)
    return registry


def eager_registry(opset: int) -> Any:
    """torch.onnx's own table for ``opset``, every signature worked out."""
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib(opset_version=opset)


def _lazy_registry(opset: int) -> Any:
    """The table of :func:`eager_registry` with torchlib's signatures left for first use, or
    None where torch.onnx or onnxscript lack what it reads."""
    try:
        from onnxscript.function_libs.torch_lib import ops as _ops  # noqa: F401 (fills the registry)
        from onnxscript.function_libs.torch_lib.registration import default_registry
        from torch.onnx._internal.exporter import _registration
        from torch.onnx._internal.exporter._torchlib import _torchlib_registry
    except ImportError:
        return None
    fields = set(getattr(_registration.OnnxDecompMeta, "__dataclass_fields__", ()))
    if not {"onnx_function", "fx_target", "signature", "is_custom", "is_complex", "skip_signature_inference"} <= fields \
            or not hasattr(_registration, "_get_overload") \
            or not all(hasattr(_registration.ONNXRegistry, name)
                       for name in ("_register", "_cleanup_registry_based_on_opset_version", "get_decomps")):
        return None
    registry = _lazy_class(_registration.ONNXRegistry)()
    registry._opset_version = opset
    if not isinstance(getattr(registry, "functions", None), dict):
        return None
    for meta in _torchlib_registry.get_torchlib_ops():          # (torch's own: signatures made at import)
        registry._register(meta.fx_target, meta)
    for qualified_name, overloaded in default_registry.items():
        if qualified_name.startswith("internal::"):
            continue
        target = _registration._get_overload(qualified_name)
        if target is None:
            continue
        for function, is_complex in [*((f, False) for f in overloaded.overloads),
                                     *((f, True) for f in overloaded.complex)]:
            meta = _registration.OnnxDecompMeta(onnx_function=function, fx_target=target, signature=None,
                                                is_custom=False, is_complex=is_complex,
                                                skip_signature_inference=True)
            registry.unsigned[id(meta)] = meta
            registry._register(target, meta)
    registry._cleanup_registry_based_on_opset_version()
    kept = {id(meta) for metas in registry.functions.values() for meta in metas}
    registry.unsigned = {key: meta for key, meta in registry.unsigned.items() if key in kept}
    return registry


@functools.cache
def _lazy_class(base: type) -> type:
    """A subclass of torch.onnx's registry (``base``) whose ``get_decomps`` works out the
    signatures of the translations it returns that were left unsigned (``unsigned``: id to
    entry, the entries kept alive so that no id is reused); an entry whose signature cannot be
    worked out is dropped, as torch.onnx drops it when it builds the table."""

    class LazySignatureRegistry(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.unsigned: dict[int, Any] = {}

        def get_decomps(self, target: Any) -> Any:
            metas = super().get_decomps(target)
            failed = {id(meta) for meta in metas if id(meta) in self.unsigned and not self._sign(meta)}
            if not failed:
                return metas
            for name, entries in list(self.functions.items()):
                kept = [entry for entry in entries if id(entry) not in failed]
                if kept:
                    self.functions[name] = kept
                else:
                    del self.functions[name]
            return [meta for meta in metas if id(meta) not in failed]

        def _sign(self, meta: Any) -> bool:
            """Work out ``meta``'s signature as torch.onnx does when it makes the entry;
            False where that fails."""
            self.unsigned.pop(id(meta), None)
            meta.skip_signature_inference = False
            try:
                meta.__post_init__()
            except Exception:
                return False
            return True

    return LazySignatureRegistry
