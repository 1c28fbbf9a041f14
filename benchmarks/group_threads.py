"""Group 4, threads: throughput of 1 vs 2 Python threads calling ``run``, ortagent vs
onnxruntime's Python.

Models: Identity f32[1] and Add f32[16] (tiny: the call overhead dominates) and the MLP 3x256
batch 32 (the kernels dominate). For each model and library, in every round (random order):

* 1 thread calling ``session.run(None, feeds)``;
* 2 threads, each with its own session;
* 2 threads sharing one session.

On a free-threaded CPython with the GIL off (3.13t+; ortagent's modules declare free-threading
support by default) two more contenders run 4 threads, with a session each and sharing one; the
targets are then those of the free-threaded build (2 threads >= 1.8x one thread's throughput;
on a GIL build >= 1.5x).

Sessions have 1 intra-op thread, so two Python threads can at best use two cores; what stops
them is the GIL held outside ORT's ``Run``. A burst starts the threads, releases them together
and takes the wall time from the first start to the last end; the figure is that time per call
of all threads together, and the ratio is the throughput relative to 1 thread (same round).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import sysconfig
import time

from ortagent_testkit import bench_models as models

from . import _common
from ._harness import Threaded, run_rounds
from ._report import Group, Row

MODELS = (("identity", "Identity f32[1]"), ("add", "Add f32[16]"), ("mlp", "MLP 3x256 b32"))
# On a free-threaded CPython (3.13t+) with the GIL off, also 4 threads with a session each.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED")) and not getattr(
    sys, "_is_gil_enabled", lambda: True)()


def run(settings) -> Group:
    import ortagent

    waited = time.perf_counter()
    busy = _common.wait_quiet(settings.wait_quiet_s) if settings.wait_quiet_s > 0 else None
    waited = time.perf_counter() - waited
    started = time.perf_counter()
    group = Group("threads", "4. threads: 1 vs 2 Python threads (µs per call, all threads)",
                  rounds=settings.rounds["threads"], burst_s=settings.burst_s, clock="wall")
    blocks, plan = [], []
    for name, title in MODELS:
        proto = models.MODELS[name]()
        data = proto.SerializeToString()
        feeds = models.feeds(proto)
        block = []
        for side, tag, make in (
                ("ortagent", "oa", lambda: ortagent.InferenceSession(data, _common.ortagent_options())),
                ("onnxruntime", "ort", lambda: _common.onnxruntime_session(data))):
            one, other = make(), make()
            single = f"{name}/{tag}-1"
            cases = [
                (single, "1 thread", [(one.run, (None, dict(feeds)))]),
                (f"{name}/{tag}-2-separate", "2 threads, a session each",
                 [(one.run, (None, dict(feeds))), (other.run, (None, dict(feeds)))]),
                (f"{name}/{tag}-2-shared", "2 threads, one shared session",
                 [(one.run, (None, dict(feeds))), (one.run, (None, dict(feeds)))])]
            if FREE_THREADED:
                sessions = [one, other, make(), make()]
                cases.append((f"{name}/{tag}-4-separate", "4 threads, a session each",
                              [(sess.run, (None, dict(feeds))) for sess in sessions]))
                cases.append((f"{name}/{tag}-4-shared", "4 threads, one shared session",
                              [(one.run, (None, dict(feeds))) for _ in range(4)]))
            for key, label, calls in cases:
                contender = Threaded(key, f"{title}: {side}, {label}", side, calls)
                block.append(contender)
                other_tag = "ort" if tag == "oa" else None
                plan.append((contender, None if key == single else single,
                             other_tag and key.replace(f"/{tag}-", f"/{other_tag}-")))
        blocks.append(block)
    # what the machine offers two threads right now: hashing 256 KiB releases the GIL, so two
    # threads of it reach 2x only when two CPUs are free for this process. Hashing 2 KiB (the
    # least hashlib releases the GIL for) is a call shaped like a tiny run: ~1 µs with the GIL
    # released between two short stretches holding it, so two threads of it show what handing
    # the GIL over costs the interpreter itself, whoever the extension.
    block = []
    for size, tag in ((256 * 1024, "cpu"), (2048, "gil")):
        data = bytes(range(256)) * (size // 256)
        for n in (1, 2):
            key = f"{tag}/{n}"
            label = f"harness: {n} thread{'s' if n > 1 else ''} hashing {size // 1024} KiB (GIL released)"
            contender = Threaded(key, label, "harness", [(hashlib.sha256, (data,))] * n)
            block.append(contender)
            plan.append((contender, None if n == 1 else f"{tag}/1", None))
    blocks.append(block)
    samples = run_rounds(blocks, settings.rounds["threads"], settings.burst_s, desc="4/5 threads",
                         seed=settings.seed)
    for contender, ref, peer in plan:
        group.rows.append(Row(contender.key, contender.label, contender.side, samples[contender.key],
                              ref=ref, peer=peer, speedup=True, ref_name="1 thread",
                              peer_name="onnxruntime"))
    headroom = statistics.median(group.ratio("cpu/2", "cpu/1", speedup=True))
    handoff = statistics.median(group.ratio("gil/2", "gil/1", speedup=True))
    if FREE_THREADED:
        group.notes.append("free-threaded CPython with the GIL off "
                           f"({sys.version.split()[0]}): 4-thread rows added")
    for name, title in MODELS if FREE_THREADED else MODELS[:2]:
        for layout in (("separate", "shared") if FREE_THREADED else ("separate",)):
            ort_speedup = statistics.median(
                group.ratio(f"{name}/ort-2-{layout}", f"{name}/ort-1", speedup=True))
            described = "a session each" if layout == "separate" else "one shared session"
            group.ratio_target(f"threads_{name}" + ("_ft" if FREE_THREADED else "")
                               + ("_shared" if layout == "shared" else ""),
                               f"2 threads, {described}, {title}"
                               + (" (GIL off): throughput >= 1.8x one thread's" if FREE_THREADED
                                  else ": throughput >= 1.5x one thread's"),
                               f"{name}/oa-2-{layout}", f"{name}/oa-1", 1.8 if FREE_THREADED else 1.5,
                               op=">=", speedup=True,
                               detail=f"onnxruntime's: {ort_speedup:.2f}x; the machine's headroom "
                                      f"(2 threads hashing 256 KiB): {headroom:.2f}x; 2 threads "
                                      f"hashing 2 KiB (a call shaped like a tiny run): {handoff:.2f}x")
    if busy is not None:
        group.notes.append(f"other processes kept {busy:.2f} CPUs busy when the group started "
                           f"(after waiting {waited:.0f} s for a quiet machine)")
    usable = len(os.sched_getaffinity(0))
    group.notes.append(f"{usable} CPUs usable by this process; throughput needs the wall clock, "
                       "so other work on the machine shows here directly; vs onnxruntime = time "
                       "per call relative to onnxruntime's same configuration (lower is better)")
    group.seconds = time.perf_counter() - started
    return group
