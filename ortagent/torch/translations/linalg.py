"""Linear algebra torch.onnx cannot translate: the inverse family, linear solves, triangular
solves, Cholesky factorisation and its solves, and ``slogdet``.

Every inverse is onnxruntime's contrib operator ``com.microsoft:Inverse`` (batched, float and
double on the CPU provider), whose reverse rule lives in :mod:`ortagent._ad_rules`
(``grad_A = -Y^T g Y^T``); everything else is written as Inverse and MatMul, so the autodiff
composes their gradients:

* ``linalg_inv_ex`` (``linalg.inv``, ``inv_ex``, ``tensorinv``, ``matrix_power`` with a
  negative exponent): the inverse; ``info`` is 0 where the inverse is finite, else ``n`` (torch
  names the first zero pivot: only the zero/non-zero distinction is kept);
* ``_linalg_solve_ex`` (``linalg.solve``, ``solve_ex``, ``tensorsolve``): ``inverse(A) @ B``
  (``B @ inverse(A)`` with ``left=False``), a right-hand side that is a batch of vectors as torch
  tells them; the ``LU`` and ``pivots`` outputs, which only torch's own backward reads, are not
  a factorisation here (``A`` itself and the identity permutation);
* ``triangular_solve`` and ``linalg_solve_triangular``: the triangle torch reads (with a unit
  diagonal for ``unitriangular``) inverted, so the coefficient's gradient stays in that triangle
  as torch's does;
* ``cholesky_solve`` and ``cholesky_inverse``: ``inverse(L L^T)``. torch reads only the factor's
  triangle, but its backward multiplies by the whole factor as given; the translation does the
  same (the value is the triangle's product, the gradient the whole factor's);
* ``linalg_cholesky_ex``: the factorisation unrolled over a size known at export, column by
  column, on ``A`` whose gradient is symmetrised as torch's is (torch's backward returns the
  symmetric gradient); ``info`` is torch's: 0, or the order of the first leading minor that is
  not positive definite;
* ``_linalg_slogdet`` (``slogdet``, ``logdet``): sign and ``log|det|`` of ``Det``, whose reverse
  rule (:mod:`ortagent._ad_rules`) is the cofactor matrix;
* ``lu_unpack`` and ``linalg_lu_solve`` (``lu_solve`` too) of a factorisation given as input:
  the permutation built from LAPACK's pivots by their swaps in turn (unrolled over a static
  count), ``L`` and ``U`` each from its own triangle, the solve as ``inverse(P L U)``.

Refused, with the exporter's own message: SVD, eigendecompositions, QR, the LU factorisation
itself (pivoting), ``pinv`` (its result depends on a numerical rank no composition here can
tell), ``matrix_exp``, ``householder_product``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from onnxscript import opset18 as op

from ._common import INT32, INT64, constant, ints, rank, static_dims, stop_gradient

_MS_DOMAIN = "com.microsoft"
_effects_lock = threading.Lock()


_schema_registered = False


def _same_as_input(ctx: Any) -> None:
    """ONNX shape inference for Inverse: the result has its operand's type and shape."""
    operand = ctx.get_input_type(0)
    if operand is not None:
        ctx.set_output_type(0, operand)


def _contrib() -> Any:
    """onnxruntime's contrib opset, with the ONNX schema of its Inverse registered once so the
    exporter knows the operator's one output."""
    global _schema_registered
    import onnx
    import onnxscript
    from onnx.defs import OpSchema

    if not _schema_registered:
        try:
            onnx.defs.get_schema("Inverse", 1, _MS_DOMAIN)
        except Exception:
            schema = OpSchema(
                "Inverse", _MS_DOMAIN, 1,
                doc="The inverse of each square matrix of the last two axes (onnxruntime's contrib operator).",
                inputs=[OpSchema.FormalParameter("X", "T")],
                outputs=[OpSchema.FormalParameter("Y", "T")],
                type_constraints=[("T", ["tensor(float)", "tensor(double)", "tensor(float16)"],
                                   "floating-point tensors")])
            schema.set_type_and_shape_inference_function(_same_as_input)
            onnx.defs.register_schema(schema)
        _schema_registered = True
    return onnxscript.values.Opset(_MS_DOMAIN, 1)


def _transpose(x: Any, n: int | None = None) -> Any:
    """``x`` (of rank ``n``, its own when not given) with its last two axes swapped."""
    n = rank(x) if n is None else n
    return op.Transpose(x, perm=[*range(n - 2), n - 1, n - 2])


def inverse(a: Any) -> Any:
    """The batched inverse of ``a`` (``com.microsoft:Inverse``)."""
    y = _contrib().Inverse(a)
    # shape inference knows nothing of the contrib operator: a Reshape to a's own shape gives
    # the result a's rank and type, which the autodiff needs
    return op.Reshape(y, op.Shape(a))


def _batch_shape(a: Any) -> Any:
    return op.Shape(a, end=-2)


def _finite_info(a: Any, y: Any) -> Any:
    """0 per matrix whose inverse ``y`` is finite, else the matrix's order (int32)."""
    (n,) = static_dims(a, [rank(a) - 1], "linalg.inv_ex")
    if n == 0:              # an empty matrix is invertible
        return op.Cast(op.ConstantOfShape(_batch_shape(a)), to=INT64)
    bad = op.Cast(op.Or(op.IsInf(y), op.IsNaN(y)), to=INT64)
    # (kept dims, then the batch shape: onnxruntime's reduction of an empty tensor keeps its shape)
    bad = op.Reshape(op.ReduceMax(bad, ints([-2, -1]), keepdims=1), _batch_shape(a))
    return op.Mul(bad, op.Constant(value_int=n))


def linalg_inv_ex(a: Any, check_errors: bool = False) -> tuple[Any, Any]:
    y = inverse(a)
    return y, op.Cast(_finite_info(a, y), to=INT32)


def _vector_rhs(a: Any, b: Any) -> bool:
    """torch's rule: ``b`` is a (batch of) vector(s) when it is 1-D, or when it has one axis fewer
    than ``a`` and its shape is ``a``'s without the last axis."""
    rb, ra = rank(b), rank(a)
    if rb == 1:
        return True
    if rb != ra - 1:
        return False
    sa, sb = list(a.shape), list(b.shape)
    if all(isinstance(s, int) for s in sa + sb):
        return sb == sa[:-1]
    from ortagent.errors import OrtNotImplemented

    raise OrtNotImplemented("ortagent's translation of linalg.solve needs static shapes to tell a batch of "
                            "vectors from a matrix right-hand side")


def _solve(a_inverse: Any, b: Any, left: bool, vector: bool) -> Any:
    if vector:
        b = op.Unsqueeze(b, ints([-1 if left else -2]))
    x = op.MatMul(a_inverse, b) if left else op.MatMul(b, a_inverse)
    if vector:
        x = op.Squeeze(x, ints([-1 if left else -2]))
    return x


def _linalg_solve_ex(a: Any, b: Any, left: bool = True, check_errors: bool = False) -> tuple[Any, Any, Any, Any]:
    vector = _vector_rhs(a, b)
    y = inverse(a)
    x = _solve(y, b, left, vector)
    (n,) = static_dims(a, [rank(a) - 1], "linalg.solve")
    pivots = op.Expand(_array(np.arange(1, n + 1, dtype=np.int64)), op.Shape(a, end=-1))
    return x, op.Identity(a), op.Cast(pivots, to=INT32), op.Cast(_finite_info(a, y), to=INT32)


def _array(values: Any) -> Any:
    """A constant tensor of a NumPy array (also an empty one, whose element type a list of
    values would not tell)."""
    from onnx import numpy_helper

    return op.Constant(value=numpy_helper.from_array(np.asarray(values)))


def _triangle_mask(a: Any, upper: bool, strict: bool) -> Any:
    """A boolean (n, n) mask of the triangle torch reads (the diagonal left out when ``strict``)."""
    n, m = static_dims(a, [rank(a) - 2, rank(a) - 1], "a triangular solve")
    rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
    if upper:
        return _array(rows < cols if strict else rows <= cols)
    return _array(rows > cols if strict else rows >= cols)


def _triangle(a: Any, upper: bool, unitriangular: bool) -> Any:
    """The triangle of ``a`` torch reads (unit diagonal for ``unitriangular``), zeros elsewhere;
    the gradient reaches that triangle only."""
    zero = constant(a, 0.0)
    kept = op.Where(_triangle_mask(a, upper, unitriangular), a, zero)
    if unitriangular:
        n = static_dims(a, [rank(a) - 1], "a triangular solve")[0]
        eye = op.EyeLike(op.ConstantOfShape(ints([n, n])))
        kept = op.Add(kept, op.CastLike(eye, a))
    return kept


def linalg_solve_triangular(a: Any, b: Any, upper: bool, left: bool = True,
                            unitriangular: bool = False) -> Any:
    y = inverse(_triangle(a, upper, unitriangular))
    return op.MatMul(y, b) if left else op.MatMul(b, y)


def triangular_solve(b: Any, a: Any, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> tuple[Any, Any]:
    t = _triangle(a, upper, unitriangular)
    if transpose:
        t = _transpose(t, rank(a))
    return op.MatMul(inverse(t), b), op.Identity(a)


def _gram(factor: Any, upper: bool) -> Any:
    """``L L^T`` (``U^T U`` when ``upper``) as torch's Cholesky solves use it: the value from the
    factor's triangle only (torch reads no other entry), the gradient that of the whole
    factor's product (torch's backward multiplies by the factor as given), the two equal for a
    triangular factor."""
    r = rank(factor)

    def product(f: Any) -> Any:
        return op.MatMul(_transpose(f, r), f) if upper else op.MatMul(f, _transpose(f, r))

    triangle = op.Where(_triangle_mask(factor, upper, False), factor, constant(factor, 0.0))
    whole = product(factor)
    return op.Add(stop_gradient(product(triangle)), op.Sub(whole, stop_gradient(whole)))


def _empty(factor: Any) -> bool:
    return static_dims(factor, [rank(factor) - 1], "a Cholesky solve")[0] == 0


def cholesky_solve(b: Any, factor: Any, upper: bool = False) -> Any:
    if _empty(factor):          # (onnxruntime's shape inference refuses the empty products)
        return op.Identity(b)
    return op.MatMul(inverse(_gram(factor, upper)), b)


def cholesky_inverse(factor: Any, upper: bool = False) -> Any:
    if _empty(factor):
        return op.Identity(factor)
    return inverse(_gram(factor, upper))


def _column(x: Any, j: int) -> Any:
    """Column ``j`` of a batch of matrices: (..., n)."""
    return op.Squeeze(op.Slice(x, ints([j]), ints([j + 1]), ints([-1])), ints([-1]))


def linalg_cholesky_ex(a: Any, upper: bool = False, check_errors: bool = False) -> tuple[Any, Any]:
    r = rank(a)
    (n,) = static_dims(a, [r - 1], "linalg.cholesky")
    if upper:
        a = _transpose(a)           # torch reads the upper triangle; L of its transpose is U^T
    # the value is a's; the gradient is symmetrised: an off-diagonal entry read from the lower
    # triangle passes half its gradient to its mirror, as torch's symmetric gradient has it
    mirror = op.Sub(_transpose(a, r), a)
    half = constant(a, 0.5)
    a = op.Add(a, op.Mul(half, op.Sub(mirror, stop_gradient(mirror))))
    zero = constant(a, 0.0)
    columns = []        # each (..., n): column j of L, zero above the diagonal
    failed = []         # each (...): whether the j-th pivot is not positive
    rows = _array(np.arange(n, dtype=np.int64))
    for j in range(n):
        c = _column(a, j)
        if columns:
            done = op.Concat(*[op.Unsqueeze(col, ints([-1])) for col in columns], axis=-1)    # (..., n, j)
            row_j = op.Slice(done, ints([j]), ints([j + 1]), ints([-2]))                      # (..., 1, j)
            c = op.Sub(c, op.ReduceSum(op.Mul(done, row_j), ints([-1]), keepdims=0))
        pivot = op.Squeeze(op.Slice(c, ints([j]), ints([j + 1]), ints([-1])), ints([-1]))  # (...)
        failed.append(op.Not(op.Greater(pivot, zero)))
        root = op.Sqrt(pivot)
        below = op.Div(c, op.Unsqueeze(root, ints([-1])))
        on_or_below = op.GreaterOrEqual(rows, op.Constant(value_int=j))
        columns.append(op.Where(on_or_below, below, zero))
    lower = op.Concat(*[op.Unsqueeze(col, ints([-1])) for col in columns], axis=-1)
    info = op.Cast(op.ConstantOfShape(_batch_shape(a)), to=INT64)
    for j in reversed(range(n)):        # the first failing pivot wins
        info = op.Where(failed[j], op.Constant(value_int=j + 1), info)
    info = op.Cast(info, to=INT32)
    return (_transpose(lower, r) if upper else lower), info


def _linalg_slogdet(a: Any) -> tuple[Any, Any, Any, Any]:
    (n,) = static_dims(a, [rank(a) - 1], "linalg.slogdet")
    det = op.Det(a)
    sign = op.Sign(stop_gradient(det))
    logabs = op.Log(op.Abs(det))
    pivots = op.Expand(_array(np.arange(1, n + 1, dtype=np.int64)), op.Shape(a, end=-1))
    return sign, logabs, op.Identity(a), op.Cast(pivots, to=INT32)


def translations() -> dict:
    import torch

    _contrib()          # (the schema, also for graphs loaded from the cache without an export)

    aten = torch.ops.aten
    return {
        aten.linalg_inv_ex.default: linalg_inv_ex,
        aten._linalg_solve_ex.default: _linalg_solve_ex,
        aten.linalg_solve_triangular.default: linalg_solve_triangular,
        aten.triangular_solve.default: triangular_solve,
        aten.cholesky_solve.default: cholesky_solve,
        aten.cholesky_inverse.default: cholesky_inverse,
        aten.linalg_cholesky_ex.default: linalg_cholesky_ex,
        aten._linalg_slogdet.default: _linalg_slogdet,
        aten.lu_unpack.default: lu_unpack,
        aten.linalg_lu_solve.default: linalg_lu_solve,
    }


@contextlib.contextmanager
def without_error_checks() -> Iterator[None]:
    """torch.export without ``aten._linalg_check_errors``'s effect token. torch marks the check
    (linalg.inv, solve, cholesky raising on a singular or indefinite matrix) as an ordered side
    effect, which the ONNX exporter cannot translate; without the mark the check, which has no
    output, leaves the exported graph. The exported graph then does not raise: a singular
    matrix gives inf or NaN, and the ``_ex`` variants' ``info`` says so."""
    try:
        from torch._library.simple_registry import singleton

        holder = singleton.find("aten::_linalg_check_errors").effect
    except (ImportError, AttributeError):       # a torch without effect registrations
        yield
        return
    with _effects_lock:
        previous = holder.effect
        holder.register(None)
        try:
            yield
        finally:
            holder.register(previous)


def _permutation(pivots: Any, m: int, like: Any) -> Any:
    """The (..., m, m) permutation matrix ``P`` of LAPACK's ``pivots`` (1-based, row ``i`` swapped
    with row ``pivots[i]`` in turn), for which torch has ``A = P L U``."""
    k = static_dims(pivots, [rank(pivots) - 1], "an LU permutation")[0]
    pivots = op.Sub(op.Cast(pivots, to=INT64), op.Constant(value_int=1))
    order = op.Expand(_array(np.arange(m, dtype=np.int64)), op.Concat(op.Shape(pivots, end=-1), ints([m]), axis=0))
    positions = _array(np.arange(m, dtype=np.int64))
    for i in range(k):
        j = op.Slice(pivots, ints([i]), ints([i + 1]), ints([-1]))                 # (..., 1)
        at_i = op.Slice(order, ints([i]), ints([i + 1]), ints([-1]))
        at_j = op.GatherElements(order, j, axis=-1)
        is_i = op.Equal(positions, op.Constant(value_int=i))
        is_j = op.Equal(positions, j)
        order = op.Where(is_i, at_j, op.Where(is_j, at_i, order))
    # row r of L U is row order[r] of A: P[order[r], r] = 1
    chosen = op.Equal(op.Reshape(positions, ints([m, 1])), op.Unsqueeze(order, ints([-2])))
    return op.CastLike(chosen, like)


def _unpacked(lu: Any) -> tuple[Any, Any, int, int, int]:
    """(L, U, m, n, k) of a packed LU factorisation (..., m, n): L (..., m, k) unit lower, U
    (..., k, n) upper, each reading its own triangle only."""
    r = rank(lu)
    m, n = static_dims(lu, [r - 2, r - 1], "an LU factorisation")
    k = min(m, n)
    rows, cols = np.arange(m)[:, None], np.arange(n)[None, :]
    zero = constant(lu, 0.0)
    lower = op.Add(op.Where(_array(rows > cols), lu, zero), op.CastLike(_array((rows == cols).astype(np.float32)), lu))
    upper = op.Where(_array(rows <= cols), lu, zero)
    lower = op.Slice(lower, ints([0]), ints([k]), ints([-1]))
    upper = op.Slice(upper, ints([0]), ints([k]), ints([-2]))
    return lower, upper, m, n, k


def lu_unpack(lu: Any, pivots: Any, unpack_data: bool = True, unpack_pivots: bool = True) -> tuple[Any, Any, Any]:
    if not (unpack_data and unpack_pivots):
        from ortagent.errors import OrtNotImplemented

        raise OrtNotImplemented("ortagent's translation of lu_unpack unpacks both the data and the pivots only")
    lower, upper, m, _, _ = _unpacked(lu)
    return _permutation(pivots, m, lu), lower, upper


def linalg_lu_solve(lu: Any, pivots: Any, b: Any, left: bool = True, adjoint: bool = False) -> Any:
    r = rank(lu)
    lower, upper, m, n, _ = _unpacked(lu)
    if m != n:
        from ortagent.errors import OrtNotImplemented

        raise OrtNotImplemented("linalg.lu_solve needs a square factorisation")
    a = op.MatMul(_permutation(pivots, m, lu), op.MatMul(lower, upper))
    if adjoint:
        a = _transpose(a, r)
    y = inverse(a)
    return op.MatMul(y, b) if left else op.MatMul(b, y)
