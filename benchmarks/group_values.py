"""Group 2, values: NumPy and DLPack in and out of OrtValue, 4 B and 64 MiB, ortagent vs
onnxruntime's Python.

All contenders of both sizes run in every round (random order):

* ``OrtValue.ortvalue_from_numpy(array)``;
* ``value.numpy()``;
* DLPack export: ``numpy.from_dlpack(value)`` (``__dlpack_device__`` + ``__dlpack__`` + NumPy's
  import of the capsule). onnxruntime's public ``OrtValue`` wrapper has no ``__dlpack__``: its
  pybind object (``value._ortvalue``) has, and that is what is timed;
* DLPack import: ``ortagent.from_dlpack(array)`` vs ``onnxruntime.OrtValue.from_dlpack(array)``.

Whether each call copies is checked by comparing data pointers, and shows in the timings: a copy
of 64 MiB costs milliseconds, a view costs the same at 4 B and at 64 MiB.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ._harness import PyCalls, run_rounds
from ._report import Group, Row, Target

SIZES = (("4 B", 1), ("64 MiB", 16 * 1024 * 1024))          # float32 elements
O1_LIMIT = 1.5      # "O(1)": the 64 MiB call within 1.5x of the 4 B call (same round)


def _pointer(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def run(settings) -> Group:
    import onnxruntime

    import ortagent

    started = time.perf_counter()
    group = Group("values", "2. values: NumPy and DLPack (µs per call)",
                  rounds=settings.rounds["values"], burst_s=settings.burst_s,
                  clock=settings.clock)
    OA, ORT = ortagent.OrtValue, onnxruntime.OrtValue
    plan = []                                  # (contender, ref, peer)
    shares: dict[str, bool] = {}
    keep = []
    for size, count in SIZES:
        array = np.arange(count, dtype=np.float32)      # pages touched
        keep.append(array)
        oa_value, ort_value = OA.ortvalue_from_numpy(array), ORT.ortvalue_from_numpy(array)
        ops = {
            "from-numpy": ("ortvalue_from_numpy", (OA.ortvalue_from_numpy, array),
                           (ORT.ortvalue_from_numpy, array)),
            "numpy": ("numpy()", (oa_value.numpy,), (ort_value.numpy,)),
            "dlpack-export": ("DLPack export (numpy.from_dlpack(value))",
                              (np.from_dlpack, oa_value), (np.from_dlpack, ort_value._ortvalue)),
            "dlpack-import": ("DLPack import (from_dlpack(array))",
                              (ortagent.from_dlpack, array), (ORT.from_dlpack, array)),
        }
        # zero-copy or not, by data pointers
        shares[f"{size}/oa-from-numpy"] = OA.ortvalue_from_numpy(array).data_ptr() == _pointer(array)
        shares[f"{size}/ort-from-numpy"] = ORT.ortvalue_from_numpy(array).data_ptr() == _pointer(array)
        shares[f"{size}/oa-numpy"] = _pointer(oa_value.numpy()) == oa_value.data_ptr()
        shares[f"{size}/ort-numpy"] = _pointer(ort_value.numpy()) == ort_value.data_ptr()
        shares[f"{size}/oa-dlpack-export"] = _pointer(np.from_dlpack(oa_value)) == oa_value.data_ptr()
        shares[f"{size}/ort-dlpack-export"] = (_pointer(np.from_dlpack(ort_value._ortvalue))
                                               == ort_value.data_ptr())
        shares[f"{size}/oa-dlpack-import"] = ortagent.from_dlpack(array).data_ptr() == _pointer(array)
        shares[f"{size}/ort-dlpack-import"] = ORT.from_dlpack(array).data_ptr() == _pointer(array)
        for op, (title, oa_call, ort_call) in ops.items():
            ref_oa = None if size == SIZES[0][0] else f"{SIZES[0][0]}/oa-{op}"
            ref_ort = None if size == SIZES[0][0] else f"{SIZES[0][0]}/ort-{op}"
            plan.append((PyCalls(f"{size}/oa-{op}", f"{size}: ortagent {title}", "ortagent",
                                 *oa_call), ref_oa, f"{size}/ort-{op}"))
            plan.append((PyCalls(f"{size}/ort-{op}", f"{size}: onnxruntime {title}", "onnxruntime",
                                 *ort_call), ref_ort, None))
    samples = run_rounds([[c for c, _, _ in plan]], settings.rounds["values"], settings.burst_s,
                         desc="2/5 values", seed=settings.seed, clock=settings.clock)
    for contender, ref, peer in plan:
        copied = "" if shares[contender.key] else " [copies]"
        group.rows.append(Row(contender.key, contender.label + copied, contender.side,
                              samples[contender.key], ref=ref, peer=peer,
                              ref_name="same call at 4 B", peer_name="onnxruntime",
                              other=samples.other[contender.key]))

    small, large = SIZES[0][0], SIZES[1][0]
    values = [max(a, b) / 1e3 for a, b in zip(samples[f"{small}/oa-from-numpy"],
                                             samples[f"{large}/oa-from-numpy"])]
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    group.targets.append(Target(
        "from_numpy_us", "ortagent ortvalue_from_numpy <= 0.5 µs (worse of 4 B and 64 MiB)",
        statistics.median(values), 0.5, "<=", "us", (q[0], q[2]),
        detail="onnxruntime's: "
               f"{statistics.median(samples[f'{small}/ort-from-numpy']) / 1e3:.3f} µs"))
    for op, title in (("numpy", "numpy()"), ("dlpack-export", "DLPack export"),
                      ("dlpack-import", "DLPack import")):
        copies = [k for k in (f"{small}/oa-{op}", f"{large}/oa-{op}") if not shares[k]]
        group.ratio_target(f"{op}_o1", f"ortagent {title} O(1): 64 MiB <= {O1_LIMIT}x the 4 B time",
                           f"{large}/oa-{op}", f"{small}/oa-{op}", O1_LIMIT,
                           detail=("zero-copy (same data pointer)" if not copies
                                   else f"copies: {copies}"))
    for side in ("ort",):
        copying = [k.split("/", 1)[1][len(side) + 1:] for k, v in shares.items()
                   if k.startswith(f"{large}/{side}-") and not v]
        group.notes.append(
            "onnxruntime " + (f"copies in: {', '.join(copying)}" if copying else
                              "copies in none of these calls on the CPU (data pointers equal)")
            + "; ortagent " + ("copies in none" if all(shares[k] for k in shares if "/oa-" in k)
                               else "copies in: " + ", ".join(k for k in shares
                                                              if "/oa-" in k and not shares[k])))
    group.seconds = time.perf_counter() - started
    return group
