"""The arguments and results of an :class:`~ortagent.torch.ORTModule` call as flat tensor lists.

torch's pytree does the flattening, so every container it knows keeps its type on the way out:
tuples, lists, dicts, ``OrderedDict``, namedtuples, ``torch.return_types`` structs and the
containers libraries register with it (transformers' ``ModelOutput`` subclasses and caches).
A non-tensor leaf is a constant of the call: it is part of the call's signature (inputs) or of
the exported graph's layout (outputs).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ortagent.errors import OrtNotImplemented

# non-tensor leaves that are plain values: they take part in a signature by equality
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                   torch.layout, torch.memory_format, enum.Enum, type(Ellipsis), slice)


@dataclass(frozen=True)
class Flat:
    """A flattened structure: its tensors in order, and what rebuilds it.

    ``spec`` is the pytree structure; ``constants`` holds every non-tensor leaf as
    ``(leaf position, value)``; ``tensor_positions`` the leaf position of each tensor."""

    tensors: tuple[torch.Tensor, ...]
    spec: pytree.TreeSpec
    constants: tuple[tuple[int, Any], ...]
    tensor_positions: tuple[int, ...]

    def rebuild(self, tensors: Any) -> Any:
        """The structure with ``tensors`` in the places of the flattened ones."""
        return rebuild(self.spec, self.constants, self.tensor_positions, tensors)


def flatten(value: Any, what: str) -> Flat:
    """Flatten ``value``; a leaf that is neither a tensor nor a plain constant is refused."""
    leaves, spec = pytree.tree_flatten(value)
    tensors: list[torch.Tensor] = []
    positions: list[int] = []
    constants: list[tuple[int, Any]] = []
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
            positions.append(position)
        elif isinstance(leaf, _CONSTANT_TYPES):
            constants.append((position, leaf))
        else:
            raise OrtNotImplemented(
                f"ORTModule: {what} holds a {type(leaf).__module__}.{type(leaf).__qualname__}, which is "
                "neither a tensor, a plain constant nor a container torch's pytree knows "
                "(register it with torch.utils._pytree.register_pytree_node)")
    return Flat(tuple(tensors), spec, tuple(constants), tuple(positions))


def rebuild(spec: pytree.TreeSpec, constants: tuple[tuple[int, Any], ...], tensor_positions: tuple[int, ...],
            tensors: Any) -> Any:
    leaves: list[Any] = [None] * spec.num_leaves
    for position, value in constants:
        leaves[position] = value
    for position, tensor in zip(tensor_positions, tensors):
        leaves[position] = tensor
    return pytree.tree_unflatten(leaves, spec)


def signature_of(flat: Flat) -> tuple:
    """What decides whether an exported graph can serve a call, shapes aside: the structure,
    the constants (with their types: ``1`` and ``True`` are equal, but not the same argument),
    and each tensor's rank, dtype and device."""
    return (flat.spec, tuple((position, type(value), value) for position, value in flat.constants),
            tuple((tensor.dim(), tensor.dtype, tensor.device) for tensor in flat.tensors))
