"""Threads: 8 threads x 10,000 mixed calls on one shared session and one shared TrainingAgent
with runs in flight, each result bit-exact against the same call made on one thread beforehand;
no deadlock (the workers are joined with a timeout); no handle left.

Each worker draws its calls from its own random stream: ``run`` and ``run_with_ort_values`` on
the shared session, runs of an IOBinding of its own on that session, DLPack round trips of the
outputs, run-id forwards on the shared agent whose runs go into a pool shared by all threads,
backwards of runs taken from that pool (so runs are resumed by other threads than the one that
started them, in any order), releases of pooled runs, and state-API steps on a second shared
agent. Runs left in the pool at the end are released by closing the agent.
"""

from __future__ import annotations

import collections
import gc
import threading

import numpy as np
import pytest

from ortagent_testkit import onnx_models as models
import ortagent
from ortagent_testkit import training_graphs as tg
from ortagent import OrtValue
from reliability import KW1192_NAMES, changed, live, settled

THREADS = 8
CALLS = 10_000
JOIN_TIMEOUT = 600.0       # seconds for all the workers together; far above the expected time
INPUTS = 16                # distinct input sets, each with its single-threaded reference


def bits(array) -> bytes:
    return np.ascontiguousarray(array).tobytes()


class Shared:
    """The shared objects, the inputs and their single-threaded references."""

    def __init__(self):
        options = ortagent.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ortagent.InferenceSession(models.mlp(sizes=(8, 16, 4)), options)
        rng = np.random.default_rng(7)
        self.xs = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(INPUTS)]
        self.ys = [bits(self.session.run(None, {"x": x})[0]) for x in self.xs]
        case = tg.mul_add_case()
        model = case.model.SerializeToString()
        self.agent = ortagent.TrainingAgent(model, options)
        self.state_agent = ortagent.TrainingAgent(model, options, **KW1192_NAMES)
        self.feeds = [case.make_feeds(rng) for _ in range(INPUTS)]
        self.grads = [rng.standard_normal((2, 3)) for _ in range(INPUTS)]
        self.outs, self.grad_bits = [], []
        for feeds, grad in zip(self.feeds, self.grads):
            binding = self.bind(feeds)
            (out,), run_id = self.agent.run_forward(binding, None)
            self.outs.append(bits(out.numpy()))
            self.agent.run_backward([grad], run_id)
            self.grad_bits.append([bits(g.numpy()) for g in binding.get_outputs()])
        self.pool: collections.deque = collections.deque()      # (run id, binding, input index)
        self.lock = threading.Lock()
        self.failures: list[str] = []
        self.counts = collections.Counter()
        self.most_in_flight = 0

    def bind(self, feeds):
        binding = self.agent.io_binding()
        for name in ("x", "w", "bias"):
            binding.bind_cpu_input(name, feeds[name])
        return binding


def worker(shared: Shared, seed: int) -> None:
    rng = np.random.default_rng(seed)
    binding = shared.session.io_binding()
    binding.bind_output("y")
    counts = collections.Counter()
    try:
        for _ in range(CALLS):
            i = int(rng.integers(INPUTS))
            kind = str(rng.choice(["run", "values", "binding", "dlpack", "forward", "backward", "release", "state"],
                                  p=[0.2, 0.1, 0.15, 0.1, 0.16, 0.13, 0.02, 0.14]))
            counts[kind] += 1
            if kind == "run":
                assert bits(shared.session.run(None, {"x": shared.xs[i]})[0]) == shared.ys[i]
            elif kind == "values":
                (y,) = shared.session.run_with_ort_values(None, {"x": OrtValue.ortvalue_from_numpy(shared.xs[i])})
                assert bits(y.numpy()) == shared.ys[i]
            elif kind == "binding":
                binding.bind_cpu_input("x", shared.xs[i])
                shared.session.run_with_iobinding(binding)
                assert bits(binding.get_outputs()[0].numpy()) == shared.ys[i]
            elif kind == "dlpack":
                (y,) = shared.session.run_with_ort_values(None, {"x": ortagent.from_dlpack(shared.xs[i])})
                assert bits(np.from_dlpack(y)) == shared.ys[i]
            elif kind == "forward":
                run_binding = shared.bind(shared.feeds[i])
                (out,), run_id = shared.agent.run_forward(run_binding, None)
                assert bits(out.numpy()) == shared.outs[i]
                shared.pool.append((run_id, run_binding, i))
                shared.most_in_flight = max(shared.most_in_flight, shared.agent.runs_in_flight)
            elif kind in ("backward", "release"):
                try:
                    run_id, run_binding, j = shared.pool.popleft()
                except IndexError:
                    continue
                if kind == "release":
                    shared.agent.release_run(run_id)
                    continue
                shared.agent.run_backward([shared.grads[j]], run_id)
                assert [bits(g.numpy()) for g in run_binding.get_outputs()] == shared.grad_bits[j]
            else:
                values = [OrtValue.ortvalue_from_numpy(shared.feeds[i][n]) for n in ("x", "w", "bias")]
                state = ortagent.PartialGraphExecutionState()
                outputs: list = []
                shared.state_agent.run_forward(values, outputs, state)
                results: list = []
                shared.state_agent.run_backward([shared.grads[i]], results, state)
                assert bits(outputs[0].numpy()) == shared.outs[i]
                assert [bits(g.numpy()) for g in results] == shared.grad_bits[i]
    except BaseException as exc:      # reported by the main thread
        with shared.lock:
            shared.failures.append(f"thread {seed}: {type(exc).__name__}: {exc}")
    finally:
        binding.close()
        with shared.lock:
            shared.counts.update(counts)


def test_eight_threads_share_a_session_and_an_agent_with_runs_in_flight(record_property):
    gc.collect()
    handles = live()
    shared = Shared()
    threads = [threading.Thread(target=worker, args=(shared, seed), daemon=True, name=f"worker-{seed}")
               for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    deadline = threading.Event()
    for thread in threads:
        thread.join(timeout=JOIN_TIMEOUT)
        if thread.is_alive():
            deadline.set()
            break
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {JOIN_TIMEOUT} s (deadlock?): {stuck}"
    assert not shared.failures, shared.failures[:5]
    total = sum(shared.counts.values())
    assert total == THREADS * CALLS
    in_flight = len(shared.pool)
    record_property("calls", dict(shared.counts))
    record_property("runs_in_flight_at_end", in_flight)
    record_property("most_runs_in_flight", shared.most_in_flight)
    print(f"\n{THREADS} threads x {CALLS} calls: {dict(shared.counts)}; up to {shared.most_in_flight} runs "
          f"in flight, {in_flight} at the end")
    assert shared.agent.runs_in_flight == in_flight
    shared.agent.close()          # releases the runs nobody resumed
    assert shared.agent.runs_in_flight == 0
    shared.pool.clear()
    del shared
    assert not changed(handles, settled(handles)), changed(handles, live())


def test_one_run_resumed_by_many_threads_at_once_runs_once():
    """Eight threads race to resume the same run id: exactly one backward runs, the others get
    UnknownRunError, and the gradients are those of one backward."""
    case = tg.mul_add_case()
    agent = ortagent.TrainingAgent(case.model.SerializeToString())
    feeds = case.make_feeds(np.random.default_rng(3))
    grad = np.ones((2, 3))
    want = case.reference_gradients(feeds, [grad])
    for _ in range(50):
        binding = agent.io_binding()
        for name in ("x", "w", "bias"):
            binding.bind_cpu_input(name, feeds[name])
        _, run_id = agent.run_forward(binding, None)
        start = threading.Barrier(THREADS)
        outcomes: list = []

        def resume():
            start.wait()
            try:
                agent.run_backward([grad], run_id)
                outcomes.append("ran")
            except ortagent.UnknownRunError:
                outcomes.append("refused")
            except BaseException as exc:
                outcomes.append(repr(exc))

        threads = [threading.Thread(target=resume, daemon=True) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a resume never returned"
        assert sorted(outcomes) == ["ran"] + ["refused"] * (THREADS - 1), outcomes
        for got, expected in zip(binding.get_outputs(), want):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    agent.close()


@pytest.mark.parametrize("closer", ["session", "agent"])
def test_close_while_other_threads_run(closer):
    """close() from one thread while others run: the runs in flight finish or fail with a typed
    error, later calls raise ObjectClosedError, nothing crashes or hangs."""
    session = ortagent.InferenceSession(models.mlp(sizes=(8, 64, 4)))
    case = tg.mul_add_case()
    agent = ortagent.TrainingAgent(case.model.SerializeToString())
    feeds = case.make_feeds(np.random.default_rng(0))
    x = np.ones((4, 8), np.float32)
    errors: list = []
    started = threading.Barrier(5)

    def hammer():
        started.wait()
        for _ in range(2_000):
            try:
                if closer == "session":
                    session.run(None, {"x": x})
                else:
                    binding = agent.io_binding()
                    for name in ("x", "w", "bias"):
                        binding.bind_cpu_input(name, feeds[name])
                    _, run_id = agent.run_forward(binding, None)
                    agent.run_backward([np.ones((2, 3))], run_id)
            except ortagent.ObjectClosedError:
                return
            except ortagent.UnknownRunError:
                return                # the run was released by close() between the two calls
            except BaseException as exc:
                errors.append(repr(exc))
                return

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    (session if closer == "session" else agent).close()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    with pytest.raises(ortagent.ObjectClosedError):
        if closer == "session":
            session.run(None, {"x": x})
        else:
            agent.io_binding()


# -- objects shared by threads running at once ---------------------------------------------------
#
# The tests below start their threads together (a barrier) and keep them calling the same
# session, value or agent, so that on a free-threaded build with the GIL off the calls overlap
# in onnxruntime's Run and in ortagent's bookkeeping around it; each result is checked against
# NumPy. On a GIL build they check the same results with the threads taking turns.

PARALLEL = 4
ROUNDS = 1_500


def _run_together(target, count=PARALLEL):
    """Run target(index) on `count` threads started at once; re-raise the first failure."""
    start = threading.Barrier(count)
    failures: list = []

    def body(index):
        start.wait()
        try:
            target(index)
        except BaseException as exc:        # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread never finished (deadlock?)"
    if failures:
        raise failures[0]


def _mlp_reference(model, x):
    """The MLP of onnx_models.mlp computed with NumPy from the model's initializers."""
    from onnx import numpy_helper
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = x.astype(np.float64)
    layers = len([n for n in weights if n.startswith("w")])
    for i in range(layers):
        h = h @ weights[f"w{i}"].astype(np.float64) + weights[f"b{i}"]
        if i < layers - 1:
            h = np.maximum(h, 0)
    return h


@pytest.mark.parametrize("model_name", ["identity", "add", "mlp"])
def test_threads_run_one_session_at_once(model_name):
    """PARALLEL threads run one session at once, each with arrays of its own and with one array
    they all feed (the session's feed cache and scratch outputs are then contended), through
    run() and run_with_ort_values(); every output is NumPy's."""
    gc.collect()
    handles = live()
    if model_name == "identity":
        model = models.identity(shape=(4,))
        names = ["x"]
        reference = lambda feeds: feeds["x"]                      # noqa: E731
        shapes = {"x": (4,)}
    elif model_name == "add":
        model = models.add(shape=(1,))
        names = ["a", "b"]
        reference = lambda feeds: feeds["a"] + feeds["b"]         # noqa: E731
        shapes = {"a": (1,), "b": (1,)}
    else:
        model = models.mlp(sizes=(8, 16, 4))
        names = ["x"]
        reference = lambda feeds: _mlp_reference(model, feeds["x"])   # noqa: E731
        shapes = {"x": (3, 8)}
    options = ortagent.SessionOptions()
    options.intra_op_num_threads = 1
    session = ortagent.InferenceSession(model.SerializeToString(), options)
    common = {n: np.full(shapes[n], 0.5, np.float32) for n in names}

    def work(index):
        rng = np.random.default_rng(index)
        own = [{n: rng.standard_normal(shapes[n]).astype(np.float32) for n in names} for _ in range(4)]
        for step in range(ROUNDS):
            feeds = common if step % 3 == 0 else own[step % 4]
            if step % 5 == 4:
                (y,) = session.run_with_ort_values(
                    None, {n: OrtValue.ortvalue_from_numpy(a) for n, a in feeds.items()})
                got = y.numpy()
            else:
                (got,) = session.run(None, feeds)
            np.testing.assert_allclose(got, reference(feeds), rtol=1e-5, atol=1e-6)

    _run_together(work)
    del session, options
    assert not changed(handles, settled(handles)), changed(handles, live())


def test_threads_share_one_ortvalue():
    """One OrtValue fed by PARALLEL threads at once (its use count changes from all of them),
    viewed with numpy() and exported by DLPack meanwhile; then closed while runs still use it:
    those finish with the right result, later uses raise ObjectClosedError, and the value's
    handle goes once the last use and view are gone."""
    gc.collect()
    handles = live()
    options = ortagent.SessionOptions()
    options.intra_op_num_threads = 1
    session = ortagent.InferenceSession(models.add(shape=(64,)).SerializeToString(), options)
    base = np.arange(64, dtype=np.float32)
    shared = OrtValue.ortvalue_from_numpy(base)

    def work(index):
        b = np.full(64, index, np.float32)
        for step in range(ROUNDS):
            if step % 4 == 3:
                np.testing.assert_array_equal(shared.numpy(), base)
                np.testing.assert_array_equal(np.from_dlpack(shared), base)
            else:
                (c,) = session.run(None, {"a": shared, "b": b})
                np.testing.assert_array_equal(c, base + index)

    _run_together(work)

    closed_at = threading.Event()
    outcomes: list = []

    def race(index):
        b = np.full(64, index, np.float32)
        for step in range(ROUNDS):
            if index == 0 and step == ROUNDS // 4:
                shared.close()
                closed_at.set()
            try:
                (c,) = session.run(None, {"a": shared, "b": b})
            except ortagent.ObjectClosedError:
                assert closed_at.is_set()
                outcomes.append("closed")
                return
            np.testing.assert_array_equal(c, base + index)
        outcomes.append("finished")

    _run_together(race)
    assert outcomes.count("closed") >= 1, outcomes
    with pytest.raises(ortagent.ObjectClosedError):
        session.run(None, {"a": shared, "b": base})
    del session, shared, options
    assert not changed(handles, settled(handles)), changed(handles, live())


def test_threads_step_one_agent_at_once():
    """PARALLEL threads step one TrainingAgent at once through the state API's hot path (OrtValue
    feeds, a state each) and through the run-id API; outputs and gradients are NumPy's."""
    gc.collect()
    handles = live()
    case = tg.mul_add_case()
    model = case.model.SerializeToString()
    options = ortagent.SessionOptions()
    options.intra_op_num_threads = 1
    state_agent = ortagent.TrainingAgent(model, options, **KW1192_NAMES)
    id_agent = ortagent.TrainingAgent(model, options)

    def work(index):
        rng = np.random.default_rng(100 + index)
        for step in range(ROUNDS // 3):
            feeds = case.make_feeds(rng)
            grad = rng.standard_normal((2, 3))
            (want_out,) = case.reference(feeds)
            want_grads = case.reference_gradients(feeds, [grad])
            if step % 2 == 0:
                values = [OrtValue.ortvalue_from_numpy(feeds[n]) for n in ("x", "w", "bias")]
                state = ortagent.PartialGraphExecutionState()
                outputs: list = []
                state_agent.run_forward(values, outputs, state)
                grads: list = []
                state_agent.run_backward([OrtValue.ortvalue_from_numpy(grad)], grads, state)
                got_out, got_grads = outputs[0].numpy(), [g.numpy() for g in grads]
            else:
                binding = id_agent.io_binding()
                for name in ("x", "w", "bias"):
                    binding.bind_cpu_input(name, feeds[name])
                (out,), run_id = id_agent.run_forward(binding, None)
                got_out = out.numpy()
                id_agent.run_backward([grad], run_id)
                got_grads = [g.numpy() for g in binding.get_outputs()]
            np.testing.assert_allclose(got_out, want_out, rtol=1e-12)
            for got, want in zip(got_grads, want_grads):
                np.testing.assert_allclose(got, want, rtol=1e-12)

    _run_together(work)
    assert id_agent.runs_in_flight == 0
    state_agent.close()
    id_agent.close()
    del state_agent, id_agent, options
    assert not changed(handles, settled(handles)), changed(handles, live())
