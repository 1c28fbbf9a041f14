"""Group 1, call overhead: one inference on tiny models, C floor vs ortagent vs onnxruntime.

Models (``ortagent_testkit.bench_models``): Identity float32[1], Add float32[16], 10 inputs + 10 outputs,
MLP 3x256 batch 32. For each model, in every round and in a random order:

* the C floor (``ort_floor --serve``, one process per model kept alive and idle between
  bursts): ``Run`` with ORT-allocated outputs, ``Run`` into preallocated outputs,
  ``RunWithBinding`` (outputs bound to the CPU device);
* ortagent: ``run(None, numpy feeds)``, ``run_with_ort_values(names, OrtValue feeds)``,
  ``run_with_iobinding`` (inputs bound once, outputs bound to the CPU);
* onnxruntime's Python: the same three calls.

Two more blocks: a 64 MiB output (``models.large_output``: y = Expand(x[1])), C ``Run`` vs
ortagent's and onnxruntime's ``run``; and a serving loop on Identity f32[1]: each run gets a new
feed dict holding the next of 1,000 distinct NumPy arrays (made before timing), as a server
handing each request's array to ``run`` does, instead of the same dict and array every call.

The per-extra-input+output-pair figure of each contender is, per round,
(10-in/10-out time - Identity time) / 9.
"""

from __future__ import annotations

import operator
import statistics
import time

import numpy as np

from ortagent_testkit import bench_models as models

from . import _common
from ._harness import BurstServer, PyCalls, Served, run_rounds
from ._report import Group, Row

MODEL_ORDER = ("identity", "multi_io", "add", "mlp")
MODEL_TITLES = {"identity": "Identity f32[1]", "multi_io": "10 in/10 out", "add": "Add f32[16]",
                "mlp": "MLP 3x256 b32"}
EXTRA_PAIRS = 9


def _contenders(name: str, settings, program, library, servers: list):
    import onnxruntime
    import ortagent

    proto = models.MODELS[name]()
    path = settings.workdir / f"{name}.onnx"
    path.write_bytes(proto.SerializeToString())
    model_bytes = path.read_bytes()
    feeds = models.feeds(proto)
    outputs = [o.name for o in proto.graph.output]
    t = MODEL_TITLES[name]

    server = BurstServer([str(program), str(path), "--serve", "--lib", str(library),
                          "--threads", str(_common.INTRA_OP_THREADS),
                          "--inter-threads", str(_common.INTER_OP_THREADS), "--opt-level", "all"],
                         what=f"ort_floor {name}")
    servers.append(server)
    rows = []                                   # (contender, ref key, peer key)
    c_run, c_binding = f"{name}/c-run", f"{name}/c-binding"
    rows.append((Served(c_run, f"{t}: C Run", "C", server, "run"), None, None))
    rows.append((Served(f"{name}/c-run-read", f"{t}: C Run + read outputs' type/shape/data", "C",
                        server, "run-read"), c_run, None))
    rows.append((Served(f"{name}/c-run-prealloc", f"{t}: C Run, preallocated outputs", "C",
                        server, "run-prealloc"), c_run, None))
    rows.append((Served(c_binding, f"{t}: C RunWithBinding", "C", server, "binding"), c_run, None))

    oa = ortagent.InferenceSession(model_bytes, _common.ortagent_options())
    oa_values = {k: ortagent.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    oa_binding = oa.io_binding()
    for k, v in oa_values.items():
        oa_binding.bind_ortvalue_input(k, v)
    for o in outputs:
        oa_binding.bind_output(o, "cpu")
    oa.run_with_iobinding(oa_binding)
    # the same binding without ortagent's fresh output buffers before each run (the C floor's
    # RunWithBinding keeps the buffers ORT allocated in the first run)
    oa_reuse = oa.io_binding(reuse_output_buffers=True)
    for k, v in oa_values.items():
        oa_reuse.bind_ortvalue_input(k, v)
    for o in outputs:
        oa_reuse.bind_output(o, "cpu")
    oa.run_with_iobinding(oa_reuse)

    ort = _common.onnxruntime_session(model_bytes)
    ort_values = {k: onnxruntime.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    ort_binding = ort.io_binding()
    for k, v in feeds.items():
        ort_binding.bind_cpu_input(k, v)
    for o in outputs:
        ort_binding.bind_output(o, "cpu")
    ort.run_with_iobinding(ort_binding)

    # the same results from every Python contender
    expect = oa.run(None, feeds)
    for got in (ort.run(None, feeds), [v.numpy() for v in oa.run_with_ort_values(outputs, oa_values)],
                [v.numpy() for v in ort.run_with_ort_values(outputs, ort_values)]):
        for a, b in zip(expect, got):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    oa_feeds, ort_feeds = dict(feeds), dict(feeds)
    for side, tag, sess, values, binding, feed in (
            ("ortagent", "oa", oa, oa_values, oa_binding, oa_feeds),
            ("onnxruntime", "ort", ort, ort_values, ort_binding, ort_feeds)):
        other = "ort" if tag == "oa" else None
        rows.append((PyCalls(f"{name}/{tag}-run", f"{t}: {side} run", side, sess.run, None, feed),
                     c_run, other and f"{name}/{other}-run"))
        rows.append((PyCalls(f"{name}/{tag}-ortvalues", f"{t}: {side} run_with_ort_values", side,
                             sess.run_with_ort_values, outputs, values),
                     c_run, other and f"{name}/{other}-ortvalues"))
        rows.append((PyCalls(f"{name}/{tag}-iobinding", f"{t}: {side} run_with_iobinding", side,
                             sess.run_with_iobinding, binding),
                     c_binding, other and f"{name}/{other}-iobinding"))
        if tag == "oa":
            rows.append((PyCalls(f"{name}/oa-iobinding-reuse",
                                 f"{t}: ortagent run_with_iobinding, reuse_output_buffers=True",
                                 side, sess.run_with_iobinding, oa_reuse),
                         c_binding, f"{name}/ort-iobinding"))
    if name == "identity":
        # what the Python timing loop itself costs per call (a builtin taking two arguments)
        rows.append((PyCalls("harness/loop", "harness: Python loop + builtin call", "harness",
                             operator.is_, None, feeds), None, None))
    return rows


SERVING_ARRAYS = 1000


def _extra_contenders(settings, program, library, servers: list):
    """The 64 MiB output block and the serving-loop block (see the module docstring)."""
    import itertools

    import ortagent

    large = []
    proto = models.large_output()
    path = settings.workdir / "large_output.onnx"
    path.write_bytes(proto.SerializeToString())
    feeds = {"x": np.ones(1, np.float32)}
    t = "64 MiB output"
    server = BurstServer([str(program), str(path), "--serve", "--lib", str(library),
                          "--threads", str(_common.INTRA_OP_THREADS),
                          "--inter-threads", str(_common.INTER_OP_THREADS), "--opt-level", "all"],
                         what="ort_floor large_output")
    servers.append(server)
    large.append((Served("large/c-run", f"{t}: C Run", "C", server, "run"), None, None))
    oa = ortagent.InferenceSession(path.read_bytes(), _common.ortagent_options())
    ort = _common.onnxruntime_session(path.read_bytes())
    expect, got = oa.run(None, feeds)[0], ort.run(None, feeds)[0]
    assert expect.shape == got.shape == (16 << 20,) and expect[-1] == got[-1] == 1.0
    large.append((PyCalls("large/oa-run", f"{t}: ortagent run", "ortagent", oa.run, None, dict(feeds)),
                  "large/c-run", "large/ort-run"))
    large.append((PyCalls("large/ort-run", f"{t}: onnxruntime run", "onnxruntime", ort.run, None,
                          dict(feeds)), "large/c-run", None))

    serving = []
    model_bytes = models.identity().SerializeToString()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(1).astype(np.float32) for _ in range(SERVING_ARRAYS)]
    t = f"serving loop, Identity f32[1], a new feed dict and one of {SERVING_ARRAYS:,} arrays each run"
    for side, tag, sess in (("ortagent", "oa", ortagent.InferenceSession(model_bytes, _common.ortagent_options())),
                            ("onnxruntime", "ort", _common.onnxruntime_session(model_bytes))):
        np.testing.assert_array_equal(sess.run(None, {"x": arrays[7]})[0], arrays[7])

        def serve(run=sess.run, following=itertools.cycle(arrays).__next__):
            return run(None, {"x": following()})
        serving.append((PyCalls(f"serving/{tag}-run", f"{t}: {side} run", side, serve),
                        "identity/c-run", "serving/ort-run" if tag == "oa" else None))
    return [large, serving]


def run(settings) -> Group:
    started = time.perf_counter()
    group = Group("calls", "1. call overhead (µs per call)", rounds=settings.rounds["calls"],
                  burst_s=settings.burst_s, clock=settings.clock)
    floor = _common.c_floor()
    library = floor.default_library()
    if library is None:
        group.skipped = "no onnxruntime library found for the C floor"
        return group
    program = floor.build()
    servers: list[BurstServer] = []
    try:
        plan = {name: _contenders(name, settings, program, library, servers) for name in MODEL_ORDER}
        plan["large"], plan["serving"] = _extra_contenders(settings, program, library, servers)
        blocks = [[c for c, _, _ in plan[name]] for name in plan]
        samples = run_rounds(blocks, settings.rounds["calls"], settings.burst_s,
                             desc="1/5 call overhead", seed=settings.seed, clock=settings.clock)
    finally:
        for server in servers:
            server.close()
    for name in plan:
        for contender, ref, peer in plan[name]:
            group.rows.append(Row(contender.key, contender.label, contender.side,
                                  samples[contender.key], ref=ref, peer=peer,
                                  peer_name="onnxruntime", other=samples.other[contender.key]))
    # per extra input+output pair, from the 10-in/10-out and Identity rounds (paired)
    for suffix, label, side, ref, peer in (
            ("c-run", "C Run", "C", None, None),
            ("c-binding", "C RunWithBinding", "C", None, None),
            ("oa-run", "ortagent run", "ortagent", "pair/c-run", "pair/ort-run"),
            ("oa-iobinding", "ortagent run_with_iobinding", "ortagent", "pair/c-binding",
             "pair/ort-iobinding"),
            ("oa-iobinding-reuse", "ortagent run_with_iobinding, reuse_output_buffers=True",
             "ortagent", "pair/c-binding", "pair/ort-iobinding"),
            ("ort-run", "onnxruntime run", "onnxruntime", "pair/c-run", None),
            ("ort-iobinding", "onnxruntime run_with_iobinding", "onnxruntime", "pair/c-binding",
             None)):
        per_pair = {}
        for clock, data in (("chosen", samples), ("other", samples.other)):
            many, one = data[f"multi_io/{suffix}"], data[f"identity/{suffix}"]
            per_pair[clock] = [(m - o) / EXTRA_PAIRS for m, o in zip(many, one)]
        group.rows.append(Row(f"pair/{suffix}", f"per extra in+out pair: {label}", side,
                              per_pair["chosen"], ref=ref, peer=peer, peer_name="onnxruntime",
                              other=per_pair["other"]))

    g = group
    med = statistics.median
    ort_note = (f"onnxruntime's own run: {med(g.ratio('identity/ort-run', 'identity/c-run')):.2f}x; "
                f"ortagent run vs C Run + reading the outputs' type/shape/data (what returning "
                f"them needs): {med(g.ratio('identity/oa-run', 'identity/c-run-read')):.2f}x")
    g.ratio_target("run_vs_c_run", "ortagent run <= 1.3x C Run (Identity)", "identity/oa-run",
                   "identity/c-run", 1.3, detail=ort_note)
    g.ratio_target("iobinding_vs_c_binding",
                   "ortagent run_with_iobinding <= 1.15x C RunWithBinding (Identity)",
                   "identity/oa-iobinding", "identity/c-binding", 1.15,
                   detail="onnxruntime's own: "
                          f"{med(g.ratio('identity/ort-iobinding', 'identity/c-binding')):.2f}x; "
                          "ortagent with reuse_output_buffers=True: "
                          f"{med(g.ratio('identity/oa-iobinding-reuse', 'identity/c-binding')):.2f}x")
    g.ratio_target("per_pair_vs_c", "ortagent run per extra input+output pair <= 1.5x C Run's",
                   "pair/oa-run", "pair/c-run", 1.5,
                   detail=f"per pair: ortagent {med(g.samples('pair/oa-run')) / 1e3:.3f} µs, "
                          f"C {med(g.samples('pair/c-run')) / 1e3:.3f} µs, onnxruntime "
                          f"{med(g.samples('pair/ort-run')) / 1e3:.3f} µs")
    group.notes.append("same session options everywhere: 1 intra-op and 1 inter-op thread, "
                       "sequential execution, ORT_ENABLE_ALL; ortagent and onnxruntime run() "
                       "take NumPy feeds and return NumPy arrays; the C floor reuses its input "
                       "values (created once)")
    group.seconds = time.perf_counter() - started
    return group
