"""Whether a call releases the GIL, seen from another Python thread.

A counter thread spins ``ticks += 1`` while the call runs in this thread. With the GIL held for
the whole call the counter could advance only at the switch-interval boundaries around it (a
handful of ticks); released, it spins freely for the whole call (millions on any machine).
Used by test_session.py, test_agent.py and test_agent_cuda.py.
"""

from __future__ import annotations

import threading
import time

MIN_ELAPSED_S = 0.05      # a call shorter than this cannot tell
MIN_TICKS = 10_000        # far above what switch-interval boundaries allow, far below a free spin


def ticks_while(call) -> tuple[int, float]:
    """Run `call()` here while another thread counts; (the ticks it counted, seconds the call took)."""
    ticks = 0
    running, done = threading.Event(), threading.Event()

    def count():
        nonlocal ticks
        running.set()
        while not done.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    running.wait()
    start = time.perf_counter()
    try:
        call()
    finally:
        elapsed = time.perf_counter() - start
        seen = ticks
        done.set()
        counter.join()
    return seen, elapsed


def assert_releases_gil(call, what: str) -> None:
    """Run `call()` and require that it ran long enough to tell and that the counter thread
    advanced freely meanwhile; `what` names the call in the messages ("run", "forward", ...)."""
    ticks, elapsed = ticks_while(call)
    assert elapsed > MIN_ELAPSED_S, f"the {what} ran too fast ({elapsed:.3f}s) to tell"
    assert ticks > MIN_TICKS, f"the other thread advanced only {ticks} times during a {elapsed:.2f}s {what}"
