"""The differential sweep of ``ortagent.torch.ORTModule`` over torch's own test databases.

For every operator of torch's OpInfo database (``op_db``: those with autograd and float32 on the
CPU) and every layer of its module database (``module_db``), on their own sample inputs, the
sweep runs the sample eagerly and through :class:`~ortagent.torch.ORTModule` from the same
state and the same seed, and compares every output (integers and booleans exactly), every
input and parameter gradient and every buffer. A case ends as one of

* ``match``: everything agrees (float32 tolerance; where it does not, a float64 eager run
  decides: a difference no larger than float32's own rounding of the same computation is noise);
* ``refused``: the bridge raised :class:`~ortagent.errors.OrtNotImplemented` at the first call;
* ``differs``: the bridge ran and disagrees with eager -- the one outcome that must never happen;
* ``error``: the bridge raised something else (an untyped error is a defect too);
* ``skipped``: eager itself fails on the sample, or it has no float32 tensor to differentiate.

``python tests/torch_sweep.py`` runs the whole sweep and writes the table (``make
test-torch-ops``); ``tests/test_torch_sweep.py`` runs a fixed sample inside ``make test``.
Each case is one call, so ORTModule's default exports it at the sample's static shapes;
``--dynamic true`` sweeps the exports with symbolic dimensions a second shape would make.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

RTOL = 1e-4             # of the largest magnitude of each compared tensor
NOISE_FACTOR = 8.0      # the bridge may differ from float64 by this many times eager float32's own error
SEED = 1234
DYNAMIC: bool | None = None      # ORTModule's dynamic argument for every case


@dataclass
class Outcome:
    database: str       # "op_db" or "module_db"
    name: str           # the op (with its variant) or the module class
    sample: int
    status: str         # match / refused / differs / error / skipped
    detail: str = ""


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


@contextlib.contextmanager
def _quiet():
    import logging

    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(previous)


# -- comparing -------------------------------------------------------------------------------------

def _leaves(value: Any) -> list:
    from torch.utils import _pytree as pytree

    return pytree.tree_leaves(value)


def _tensor_leaves(value: Any) -> list:
    torch = _torch()
    return [leaf for leaf in _leaves(value) if isinstance(leaf, torch.Tensor)]


def _real_view(tensor: Any) -> Any:
    """A complex tensor as its real view (a trailing axis of real and imaginary parts; ``.double()``
    would drop the imaginary part), any other one as it is."""
    torch = _torch()
    if tensor.is_complex():
        return torch.view_as_real(tensor.detach().resolve_conj().resolve_neg())
    return tensor


def _error(actual: Any, expected: Any) -> tuple[float, float]:
    """(max abs difference, max magnitude of ``expected``), NaN and infinities compared by
    position, complex tensors through their real views; (inf, scale) when they disagree in
    shape, complexity or non-finite positions."""
    torch = _torch()
    if actual.is_complex() != expected.is_complex():
        return math.inf, 0.0
    a, e = _real_view(actual).detach().double(), _real_view(expected).detach().double()
    if a.shape != e.shape:
        return math.inf, 0.0
    if not a.numel():
        return 0.0, 0.0
    finite = torch.isfinite(e)
    if not torch.equal(finite, torch.isfinite(a)) or not torch.equal(a[~finite].nan_to_num(), e[~finite].nan_to_num()):
        return math.inf, 0.0
    if not finite.any():
        return 0.0, 0.0
    return float((a - e).abs()[finite].max()), float(e.abs()[finite].max())


def _compare_tensors(what: str, actual: list, expected: list, reference: list | None) -> str | None:
    """None when ``actual`` agrees with ``expected`` (or, failing that, with ``reference``, the
    float64 run, as closely as ``expected`` itself does); else a description."""
    torch = _torch()
    if len(actual) != len(expected):
        return f"{what}: {len(actual)} tensors, eager {len(expected)}"
    for index, (a, e) in enumerate(zip(actual, expected)):
        if a is None and e is None:
            continue
        if e is None:
            e = torch.zeros_like(a)         # eager's None gradient is a zero one
        if a is None:
            a = torch.zeros_like(e)
        if a.dtype != e.dtype and not (a.is_floating_point() and e.is_floating_point()) and \
                not (a.is_complex() and e.is_complex()):
            return f"{what} {index}: dtype {a.dtype}, eager {e.dtype}"
        if a.shape != e.shape:
            return f"{what} {index}: shape {list(a.shape)}, eager {list(e.shape)}"
        if not e.is_floating_point() and not e.is_complex():
            if not torch.equal(a, e.to(a.dtype)):
                return f"{what} {index}: values differ (exact comparison)"
            continue
        error, scale = _error(a, e)
        if error <= RTOL * max(scale, 1e-2):
            continue
        if reference is not None and reference[index] is not None and error != math.inf:
            r = reference[index]
            bridge_error, _ = _error(a, r)
            eager_error, r_scale = _error(e, r)
            if bridge_error <= NOISE_FACTOR * eager_error + 1e-6 * max(r_scale, 1.0):
                continue
            return (f"{what} {index}: max abs error {error:.3g} at scale {scale:.3g}; to float64 "
                    f"{bridge_error:.3g}, eager's own {eager_error:.3g}")
        return f"{what} {index}: max abs error {error:.3g} at scale {scale:.3g}"
    return None


def _loss_weights(outputs: list, seed: int) -> list:
    """Fixed random weights for a scalar loss over the floating-point outputs (a plain sum
    would hide gradients that only move values around); a complex output's weight is a real
    one on its real view, so that its real and imaginary parts both carry gradient."""
    torch = _torch()
    generator = torch.Generator().manual_seed(seed)
    weights = []
    for out in outputs:
        if out.is_floating_point() or out.is_complex():
            view = _real_view(out)
            weights.append(torch.randn(view.shape, generator=generator, dtype=torch.float64).to(view.dtype))
        else:
            weights.append(None)
    return weights


def _loss_term(out: Any, weight: Any) -> Any:
    torch = _torch()
    if out.is_complex():
        out = torch.view_as_real(out.resolve_conj())
    return (out * weight).sum()


def _backward(outputs: list, weights: list, leaves: list) -> list:
    torch = _torch()
    terms = [_loss_term(out, w) for out, w in zip(outputs, weights)
             if w is not None and out.requires_grad]
    if not terms:
        return [None] * len(leaves)
    wanted = [leaf for leaf in leaves if leaf.requires_grad]
    grads = iter(torch.autograd.grad(sum(terms), wanted, allow_unused=True))
    return [next(grads) if leaf.requires_grad else None for leaf in leaves]


# -- running one case ------------------------------------------------------------------------------

def _classify(run_bridge) -> tuple[str, str, Any]:
    from ortagent.errors import OrtError, OrtNotImplemented

    try:
        return "ran", "", run_bridge()
    except OrtNotImplemented as exc:
        return "refused", f"{type(exc).__name__}: {exc}"[:400], None
    except OrtError as exc:
        return "error", f"{type(exc).__name__}: {exc}"[:400], None
    except Exception as exc:        # an untyped error: a defect of the bridge
        return "error", f"untyped {type(exc).__name__}: {exc}"[:400] + "\n" + traceback.format_exc(limit=-3)[-600:], None


class _Call:
    """A call ``function(*args, **kwargs)`` whose tensors are the arguments of a module."""

    def __init__(self, function: Any, args: tuple, kwargs: dict) -> None:
        torch = _torch()
        from torch.utils import _pytree as pytree

        self.function = function
        leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.constants = [(i, leaf) for i, leaf in enumerate(leaves) if not isinstance(leaf, torch.Tensor)]
        self.tensors = [leaves[i] for i in self.positions]

    def __call__(self, *tensors: Any) -> Any:
        from torch.utils import _pytree as pytree

        leaves: list = [None] * self.spec.num_leaves
        for i, value in self.constants:
            leaves[i] = value
        for i, tensor in zip(self.positions, tensors):
            leaves[i] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.function(*args, **kwargs)


def _fresh(tensors: list, dtype: Any = None) -> list:
    out = []
    for t in tensors:
        copy_ = t.detach().clone()
        if dtype is not None and copy_.is_floating_point():
            copy_ = copy_.to(dtype)
        out.append(copy_.requires_grad_(t.requires_grad and copy_.is_floating_point()))
    return out


def run_op_sample(op: Any, sample: Any, index: int) -> Outcome:
    torch = _torch()
    from ortagent.torch import ORTModule

    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    call = _Call(op.op, (sample.input, *sample.args), dict(sample.kwargs))
    if not any(t.is_floating_point() and t.requires_grad for t in call.tensors):
        return Outcome("op_db", name, index, "skipped", "no float32 input requires grad")

    class Op(torch.nn.Module):
        def forward(self, *tensors):
            return call(*tensors)

    def eager(dtype=None):
        inputs = _fresh(call.tensors, dtype)
        torch.manual_seed(SEED)
        with _quiet():
            outputs = _tensor_leaves(call(*inputs))
        weights = _loss_weights(outputs, SEED)
        return [o.detach() for o in outputs], _backward(outputs, weights, inputs)

    try:
        expected_outputs, expected_grads = eager()
    except Exception as exc:
        return Outcome("op_db", name, index, "skipped", f"eager fails: {type(exc).__name__}: {exc}"[:200])

    def bridge():
        inputs = _fresh(call.tensors)
        module = ORTModule(Op(), dynamic=DYNAMIC)
        torch.manual_seed(SEED)
        with _quiet():
            outputs = _tensor_leaves(module(*inputs))
        weights = _loss_weights(outputs, SEED)
        return [o.detach() for o in outputs], _backward(outputs, weights, inputs)

    status, detail, result = _classify(bridge)
    if status != "ran":
        return Outcome("op_db", name, index, status, detail)
    outputs, grads = result
    reference_outputs = reference_grads = None
    problem = _compare_tensors("output", outputs, expected_outputs, None) or \
        _compare_tensors("gradient", grads, expected_grads, None)
    if problem:
        try:
            reference_outputs, reference_grads = eager(torch.float64)
        except Exception:
            pass
        problem = _compare_tensors("output", outputs, expected_outputs, reference_outputs) or \
            _compare_tensors("gradient", grads, expected_grads, reference_grads)
    return Outcome("op_db", name, index, "differs" if problem else "match", problem or "")


def run_module_sample(info: Any, sample: Any, index: int, training: bool) -> Outcome:
    torch = _torch()
    from ortagent.torch import ORTModule

    name = info.module_cls.__name__ + ("" if training else ".eval")
    args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
    forward_args, forward_kwargs = sample.forward_input.args, sample.forward_input.kwargs
    call_inputs = _Call(lambda *a, **k: (a, k), forward_args, dict(forward_kwargs))

    def build(dtype=None):
        torch.manual_seed(SEED)
        with _quiet():
            module = info.module_cls(*args, **kwargs)
        if dtype is not None:
            module = module.to(dtype)
        return module.train(training)

    def eager(module, dtype=None):
        inputs = _fresh(call_inputs.tensors, dtype)
        fa, fk = call_inputs(*inputs)
        torch.manual_seed(SEED)
        with _quiet():
            outputs = _tensor_leaves(module(*fa, **fk))
        weights = _loss_weights(outputs, SEED)
        params = [p for p in module.parameters()]
        grads = _backward(outputs, weights, inputs + params)
        return [o.detach() for o in outputs], grads, [b.detach().clone() for b in module.buffers()]

    # each side builds its own module from the same seed (Lazy* modules cannot be copied
    # before their first call)
    try:
        expected = eager(build())
    except Exception as exc:
        return Outcome("module_db", name, index, "skipped", f"eager fails: {type(exc).__name__}: {exc}"[:200])

    def bridge():
        inner = build()
        module = ORTModule(inner, dynamic=DYNAMIC)
        inputs = _fresh(call_inputs.tensors)
        fa, fk = call_inputs(*inputs)
        torch.manual_seed(SEED)
        with _quiet():
            outputs = _tensor_leaves(module(*fa, **fk))
        weights = _loss_weights(outputs, SEED)
        grads = _backward(outputs, weights, inputs + list(inner.parameters()))
        return [o.detach() for o in outputs], grads, [b.detach().clone() for b in inner.buffers()]

    status, detail, result = _classify(bridge)
    if status != "ran":
        return Outcome("module_db", name, index, status, detail)
    problem = None
    reference = None
    for attempt in range(2):
        problem = (_compare_tensors("output", result[0], expected[0], reference and reference[0])
                   or _compare_tensors("gradient", result[1], expected[1], reference and reference[1])
                   or _compare_tensors("buffer", result[2], expected[2], reference and reference[2]))
        if not problem or attempt:
            break
        try:
            reference = eager(build(torch.float64), torch.float64)
        except Exception:
            break
    return Outcome("module_db", name, index, "differs" if problem else "match", problem or "")


# -- the databases --------------------------------------------------------------------------------

def op_infos(names: Iterable[str] | None = None) -> list:
    torch = _torch()
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = set(names) if names is not None else None
    infos = []
    for op in op_db:
        full = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if chosen is not None and full not in chosen and op.name not in chosen:
            continue
        if op.supports_autograd and torch.float32 in op.supported_dtypes("cpu"):
            infos.append(op)
    return infos


def module_infos(names: Iterable[str] | None = None) -> list:
    from torch.testing._internal.common_modules import module_db

    chosen = set(names) if names is not None else None
    return [info for info in module_db if chosen is None or info.module_cls.__name__ in chosen]


def op_outcomes(ops: list, samples: int, verbose: bool = False) -> Iterator[Outcome]:
    torch = _torch()
    for position, op in enumerate(ops):
        if verbose:
            print(f"\n[{position}] {op.name} {op.variant_test_name}", end=" ", flush=True)
        try:
            with _quiet():
                generated = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:samples]
        except Exception as exc:
            yield Outcome("op_db", op.name, 0, "skipped", f"no samples: {type(exc).__name__}: {exc}"[:200])
            continue
        for index, sample in enumerate(generated):
            yield run_op_sample(op, sample, index)


def module_outcomes(infos: list, samples: int, training: bool = True) -> Iterator[Outcome]:
    torch = _torch()
    for info in infos:
        try:
            with _quiet():
                generated = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                                    training=training)[:samples]
        except Exception as exc:
            yield Outcome("module_db", info.module_cls.__name__, 0, "skipped",
                          f"no samples: {type(exc).__name__}: {exc}"[:200])
            continue
        for index, sample in enumerate(generated):
            yield run_module_sample(info, sample, index, training)


def summarize(outcomes: list[Outcome]) -> dict:
    """Per database: counts of cases by status, and of names by their worst status."""
    order = ["differs", "error", "refused", "match", "skipped"]
    table: dict = {}
    for database in sorted({o.database for o in outcomes}):
        cases = [o for o in outcomes if o.database == database]
        worst: dict[str, str] = {}
        for o in cases:
            previous = worst.get(o.name)
            if previous is None or order.index(o.status) < order.index(previous):
                worst[o.name] = o.status
        table[database] = {"cases": dict(collections.Counter(o.status for o in cases)),
                           "names": dict(collections.Counter(worst.values()))}
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="all", help="'all', 'none' or comma-separated op names")
    parser.add_argument("--modules", default="all", help="'all', 'none' or comma-separated module classes")
    parser.add_argument("--samples", type=int, default=3, help="samples per op or module (default 3)")
    parser.add_argument("--out", default=os.path.join("build", "torch_sweep"), help="folder for the results")
    parser.add_argument("--start", type=int, default=0, help="skip the first N ops of op_db (resuming)")
    parser.add_argument("--verbose", action="store_true", help="print each case's name before running it")
    parser.add_argument("--dynamic", choices=["default", "true", "false"], default="default",
                        help="ORTModule's dynamic argument (default: its default, None)")
    options = parser.parse_args(argv)
    global DYNAMIC
    DYNAMIC = {"default": None, "true": True, "false": False}[options.dynamic]
    outcomes: list[Outcome] = []
    started = time.time()
    os.makedirs(options.out, exist_ok=True)
    groups = []
    if options.ops != "none":
        ops = op_infos(None if options.ops == "all" else options.ops.split(","))[options.start:]
        groups.append(op_outcomes(ops, options.samples, options.verbose))
    if options.modules != "none":
        infos = module_infos(None if options.modules == "all" else options.modules.split(","))
        groups.append(module_outcomes(infos, options.samples, training=True))
    for group in groups:
        for outcome in group:
            outcomes.append(outcome)
            mark = {"match": ".", "refused": "r", "skipped": "s", "differs": "D", "error": "E"}[outcome.status]
            print(mark, end="", flush=True)
            if outcome.status in ("differs", "error"):
                print(f"\n{outcome.status.upper()} {outcome.database} {outcome.name}[{outcome.sample}]: "
                      f"{outcome.detail.splitlines()[0] if outcome.detail else ''}", flush=True)
    print()
    table = summarize(outcomes)
    with open(os.path.join(options.out, "outcomes.json"), "w") as handle:
        json.dump({"table": table, "outcomes": [asdict(o) for o in outcomes],
                   "seconds": round(time.time() - started)}, handle, indent=1)
    print(json.dumps(table, indent=1))
    bad = [o for o in outcomes if o.status in ("differs", "error")]
    print(f"{len(outcomes)} cases in {time.time() - started:.0f} s; {len(bad)} differ or fail")
    return 1 if any(o.status == "differs" for o in outcomes) else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
