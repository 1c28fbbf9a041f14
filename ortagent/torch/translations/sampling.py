"""``F.grid_sample`` on volumes (``aten.grid_sampler_3d``), which torch.onnx cannot translate,
in the bilinear (trilinear) and nearest modes with zeros or border padding.

Each output point's grid coordinates are unnormalized as torch does (``align_corners`` or not),
clamped to the volume for border padding; trilinear sampling reads the 8 surrounding voxels
with GatherElements over the flattened volume and weighs them by the distances, a voxel
outside the volume counting as 0 (zeros padding). The weights are linear in the coordinates,
so the autodiff's gradient is torch's for both the input (GatherElements' scatter-add) and the
grid (Floor has none, as torch's); a clamped coordinate gets no gradient, as torch's. Nearest
rounds half to even (ONNX's Round, torch's nearbyint) and gives the grid no gradient.
Reflection padding and bicubic mode are refused.

``F.interpolate(..., mode="bilinear", antialias=True, align_corners=True)``
(``aten._upsample_bilinear2d_aa``) is refused: torch.onnx writes ONNX's antialiased Resize with
the ``align_corners`` coordinates, whose windows are not torch's (torch centres them at
``scale * (i + 0.5)`` whatever ``align_corners``; the sweep found outputs 1.86 apart at a 0.8
scale), and ONNX's Resize cannot take torch's scale with another output size. Without
``align_corners`` torch.onnx's translation matches torch and is kept, unless a scale factor
is given that is not the ratio of the sizes (torch maps coordinates by the factor; refused).
"""

from __future__ import annotations

from typing import Any

from onnxscript import opset18 as op

from ortagent.errors import OrtNotImplemented

from ._common import INT64, constant, ints, rank, static_dims, stop_gradient

_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def grid_sampler_3d(x: Any, grid: Any, interpolation_mode: int, padding_mode: int, align_corners: bool) -> Any:
    mode, padding = _MODES.get(interpolation_mode), _PADDINGS.get(padding_mode)
    if mode not in ("bilinear", "nearest") or padding not in ("zeros", "border"):
        raise OrtNotImplemented(f"ortagent's grid_sample on volumes: mode {mode!r} with {padding!r} padding "
                                "(bilinear or nearest, zeros or border padding only)")
    if rank(x) != 5 or rank(grid) != 5:
        raise OrtNotImplemented("grid_sampler_3d needs a 5-d input and a 5-d grid")
    depth, height, width = static_dims(x, [2, 3, 4], "grid_sampler_3d")
    grid = op.CastLike(grid, x)
    flat_grid = op.Reshape(grid, ints([0, -1, 3]))                     # (N, P, 3): x, y, z
    coordinates = []
    for axis, size in ((0, width), (1, height), (2, depth)):
        g = op.Squeeze(op.Slice(flat_grid, ints([axis]), ints([axis + 1]), ints([2])), ints([2]))   # (N, P)
        if align_corners:
            c = op.Mul(op.Add(g, constant(g, 1.0)), constant(g, (size - 1) / 2.0))
        else:
            c = op.Div(op.Sub(op.Mul(op.Add(g, constant(g, 1.0)), constant(g, float(size))), constant(g, 1.0)),
                       constant(g, 2.0))
        if padding == "border":
            c = op.Clip(c, constant(g, 0.0), constant(g, float(size - 1)))
        coordinates.append((c, size))
    volume = op.Reshape(x, ints([0, 0, depth * height * width]), allowzero=0)   # (N, C, DHW; 0: copy)
    channels_shape = op.Shape(volume)

    def read(cells: list[Any]) -> tuple[Any, Any]:
        """(values (N, C, P) at integer cells (x, y, z), each (N, P) float, 0 outside; inside mask)."""
        inside = None
        index = None
        for cell, (_, size), stride in zip(cells, coordinates, (1, width, width * height)):
            ok = op.And(op.GreaterOrEqual(cell, constant(cell, 0.0)), op.LessOrEqual(cell, constant(cell, size - 1.0)))
            inside = ok if inside is None else op.And(inside, ok)
            term = op.Mul(op.Cast(cell, to=INT64), op.Constant(value_int=stride))
            index = term if index is None else op.Add(index, term)
        index = op.Where(inside, index, op.Constant(value_int=0))
        spread = op.Expand(op.Unsqueeze(index, ints([1])),
                           op.Concat(op.Slice(channels_shape, ints([0]), ints([2])),
                                     op.Slice(op.Shape(index), ints([1]), ints([2])), axis=0))
        values = op.GatherElements(volume, spread, axis=2)
        return values, op.Unsqueeze(op.CastLike(inside, x), ints([1]))

    if mode == "nearest":
        cells = [stop_gradient(op.Round(c)) for c, _ in coordinates]
        values, inside = read(cells)
        sampled = op.Mul(values, inside)
    else:
        lows = [stop_gradient(op.Floor(c)) for c, _ in coordinates]
        fractions = [op.Sub(c, low) for (c, _), low in zip(coordinates, lows)]
        sampled = None
        for corner in range(8):
            cells, weight = [], None
            for bit, (low, fraction) in enumerate(zip(lows, fractions)):
                if corner >> bit & 1:
                    cells.append(op.Add(low, constant(low, 1.0)))
                    w = fraction
                else:
                    cells.append(low)
                    w = op.Sub(constant(fraction, 1.0), fraction)
                weight = w if weight is None else op.Mul(weight, w)
            values, inside = read(cells)
            term = op.Mul(op.Mul(values, inside), op.Unsqueeze(weight, ints([1])))
            sampled = term if sampled is None else op.Add(sampled, term)
    out_shape = op.Concat(op.Slice(channels_shape, ints([0]), ints([2])),
                          op.Slice(op.Shape(grid), ints([1]), ints([4])), axis=0)
    return op.Reshape(sampled, out_shape)


def upsample_bilinear2d_aa(x: Any, output_size: Any, align_corners: bool, scales_h: Any = None,
                           scales_w: Any = None) -> Any:
    if align_corners:
        raise OrtNotImplemented("ORTModule: F.interpolate with antialias=True and align_corners=True "
                                "(aten._upsample_bilinear2d_aa) has no ONNX Resize with torch's windows")
    if scales_h is not None or scales_w is not None:
        # torch maps coordinates by 1 / scale where a scale is given, ONNX's Resize by the
        # ratio of the sizes: the same only where the two agree
        sizes = static_dims(x, [2, 3], "an antialiased interpolation with scale factors")
        for scale, size, out in zip((scales_h, scales_w), sizes, output_size):
            if scale is not None and (not isinstance(out, int) or abs(1.0 / scale - size / out) > 1e-12 * size):
                raise OrtNotImplemented(
                    f"ORTModule: F.interpolate with antialias=True and a scale factor ({scale}) other than "
                    f"output/input size ({out}/{size}): ONNX's Resize maps coordinates by the sizes, torch by "
                    "the factor (recompute_scale_factor=True gives the sizes' ratio)")
    from onnxscript.function_libs.torch_lib.ops.nn import aten__upsample_bilinear2d_aa

    return aten__upsample_bilinear2d_aa(x, output_size, align_corners, scales_h, scales_w)


def translations() -> dict:
    import torch

    aten = torch.ops.aten
    return {aten.grid_sampler_3d.default: grid_sampler_3d,
            aten._upsample_bilinear2d_aa.default: upsample_bilinear2d_aa}
