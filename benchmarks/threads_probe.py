"""A quick look at how ``run`` scales over 2 threads, with the machine's headroom measured in the
same breath: on a shared 2-core machine the threads group of bench.py moves with whatever else
runs, and this says for each run whether two CPUs were free.

    PYTHON_GIL=0 python -m benchmarks.threads_probe identity --calls 20000 --rounds 11

In each round, in this order: 1 and 2 threads hashing 256 KiB (GIL-free: the headroom), 1 and 2
threads hashing 2 KiB (the GIL released for ~1 µs a call: what handing it over costs), then
``run`` on 1 thread, on 2 threads with a session each and on 2 threads sharing one session,
each once with one feed dict both threads pass (arrays made by the main thread) and once with
arrays each thread makes itself. Every thread makes ``--calls`` calls after a barrier; the figure
is the wall time per call of all threads together, the median over rounds, and its speedup
over 1 thread. Run it on a free-threaded build with the GIL off; on a GIL build it shows what
the GIL leaves.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import threading
import time

from . import _common  # isort: skip  (first: it sets OPENBLAS_NUM_THREADS before NumPy loads)

from ortagent_testkit import bench_models as models


def burst(workers, calls: int) -> float:
    """Seconds per call of all `workers` together, started at once."""
    start = threading.Barrier(len(workers) + 1)

    def body(work):
        start.wait()
        work()

    threads = [threading.Thread(target=body, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return (time.perf_counter() - began) / (calls * len(workers))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(models.MODELS))
    parser.add_argument("--calls", type=int, default=20000, help="calls per thread and burst")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)

    import ortagent
    proto = models.MODELS[args.model]()
    data = proto.SerializeToString()
    feeds = models.feeds(proto)
    one, other = (ortagent.InferenceSession(data, _common.ortagent_options()) for _ in range(2))
    blob = bytes(range(256)) * 1024
    small = blob[:2048]         # the least hashlib releases the GIL for: ~1 µs, like a tiny Run
    hashes = max(1, args.calls // 100)

    def hashing():
        for _ in range(hashes):
            hashlib.sha256(blob)

    def hashing_small():
        sha256 = hashlib.sha256
        for _ in range(args.calls):
            sha256(small)

    def runs(session, own_arrays: bool):
        def work():
            feed = {k: v.copy() for k, v in feeds.items()} if own_arrays else shared
            run = session.run
            for _ in range(args.calls):
                run(None, feed)
        return work

    shared = dict(feeds)
    cases = {
        "1 thread": lambda: [runs(one, True)],
        "2 threads, a session each, one feed dict": lambda: [runs(one, False), runs(other, False)],
        "2 threads, a session each, own arrays": lambda: [runs(one, True), runs(other, True)],
        "2 threads, one session, one feed dict": lambda: [runs(one, False), runs(one, False)],
        "2 threads, one session, own arrays": lambda: [runs(one, True), runs(one, True)],
    }
    times = {name: [] for name in cases}
    headroom, handoff = [], []
    for _ in range(args.rounds):
        single = burst([hashing], hashes)
        headroom.append(single / burst([hashing, hashing], hashes))
        single = burst([hashing_small], args.calls)
        handoff.append(single / burst([hashing_small, hashing_small], args.calls))
        for name, make in cases.items():
            times[name].append(burst(make(), args.calls))
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(f"{args.model}: Python {sys.version.split()[0]}, GIL {'on' if gil else 'off'}; headroom "
          f"(2 threads hashing 256 KiB) {statistics.median(headroom):.2f}x; 2 threads hashing 2 KiB "
          f"(a call shaped like a tiny run) {statistics.median(handoff):.2f}x")
    base = statistics.median(times["1 thread"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:44s} {median * 1e6:9.3f} µs/call  {base / median:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
