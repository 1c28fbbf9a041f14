"""Property-based fuzzing: random sequences of valid and invalid calls on sessions, bindings,
values, DLPack handoffs and TrainingAgent runs, every result compared with onnxruntime's own
Python module or NumPy, and no ORT handle left behind after each sequence.

* :class:`BindingMachine` (a hypothesis ``RuleBasedStateMachine``) creates sessions over small
  models of random dtypes, values from NumPy arrays (contiguous or not, read-only, zero-size,
  0-d), runs them with NumPy feeds, OrtValue feeds and IOBindings (fresh or reused, device or
  preallocated outputs), exports and imports DLPack capsules (consumed by NumPy or ortagent, or
  dropped unconsumed), takes NumPy views, closes values, bindings and sessions in any order while
  other objects still use them, drives TrainingAgent runs in all three API forms (forward,
  backward, release, close -- in random orders, with runs in flight) and mixes in calls from the
  bad-input matrix, which must raise their typed errors without disturbing anything.
* :func:`test_mutated_training_graphs` builds TrainingAgents from randomly damaged training
  graphs: construction and a run either work or raise an ``OrtError``, never anything else.

Profiles (``HYPOTHESIS_PROFILE``): ``ortagent-ci`` (default: a short run in ``make test``) and
``ortagent-fuzz`` (``make fuzz``: examples are drawn in batches until ``FUZZ_SECONDS`` have
passed).
"""

from __future__ import annotations

import copy
import gc
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test
from onnx import AttributeProto, TensorProto, helper

from ortagent_testkit import onnx_models as models
import ortagent
from ortagent_testkit import training_graphs as tg
from ortagent import OrtValue
from reliability import F64, KW1192_NAMES, STATE7_NAMES, World, changed, live, settled

settings.register_profile("ortagent-ci", max_examples=60, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                          print_blob=True)
settings.register_profile("ortagent-fuzz", max_examples=200, stateful_step_count=60, deadline=None,
                          suppress_health_check=list(HealthCheck), print_blob=True, database=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ortagent-ci")
FUZZ_SECONDS = float(os.environ.get("FUZZ_SECONDS", "0"))
FUZZING = PROFILE == "ortagent-fuzz"

# ---- the models -----------------------------------------------------------------------------------

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "bool", "string"]
ADD_DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8"]
DLPACK_DTYPES = [d for d in DTYPES if d not in ("string", "bfloat16")]     # what NumPy exchanges


def _model(nodes, inputs, outputs) -> bytes:
    graph = helper.make_graph(nodes, "fuzz", inputs, outputs)
    return helper.make_model(graph, ir_version=models.IR_VERSION,
                             opset_imports=[helper.make_opsetid("", models.OPSET)]).SerializeToString()


def _any_shape(name, dtype):
    return helper.make_tensor_value_info(name, models.DTYPES[dtype], None)


MODELS = {}
for _dtype in DTYPES:
    MODELS[("identity", _dtype)] = _model([helper.make_node("Identity", ["x"], ["y"])],
                                          [_any_shape("x", _dtype)], [_any_shape("y", _dtype)])
for _dtype in ADD_DTYPES:
    MODELS[("add", _dtype)] = _model([helper.make_node("Add", ["x", "b"], ["y"])],
                                     [_any_shape("x", _dtype), _any_shape("b", _dtype)], [_any_shape("y", _dtype)])


def numpy_reference(kind, feeds):
    if kind == "identity":
        return feeds["x"]
    return (feeds["x"] + feeds["b"]).astype(feeds["x"].dtype)


_REFERENCE_SESSIONS: dict = {}


def ort_reference(ort_ref, key, feeds):
    """onnxruntime's own answer (None for bfloat16, which its Python module cannot take)."""
    if ort_ref is None or key[1] == "bfloat16":
        return None
    session = _REFERENCE_SESSIONS.get(key)
    if session is None:
        session = _REFERENCE_SESSIONS[key] = ort_ref.InferenceSession(MODELS[key], providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        assert got.tobytes() == want.tobytes()       # bit-exact, NaN payloads included


# ---- strategies -----------------------------------------------------------------------------------

shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)


@st.composite
def arrays(draw, dtype, shape=None):
    shape = draw(shapes) if shape is None else shape
    seed = draw(st.integers(0, 2**32 - 1))
    array = np.asarray(models.random_array(dtype, shape, np.random.default_rng(seed)))
    if dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        array = np.asarray(array % 50, dtype=array.dtype)     # sums stay in range
    layout = draw(st.sampled_from(["contiguous", "strided", "fortran", "read-only"]))
    if layout == "strided" and array.ndim:
        big = np.repeat(array, 2, axis=-1)
        array = big[..., ::2]
        assert not array.flags.c_contiguous or array.size <= 1
    elif layout == "fortran" and array.ndim > 1:
        array = np.asfortranarray(array)
    elif layout == "read-only":
        array = array.copy()
        array.flags.writeable = False
    return array


# ---- the state machine ------------------------------------------------------------------------------

_WORLD: list = []


def shared_world() -> World:
    if not _WORLD:
        _WORLD.append(World())
    return _WORLD[0]


def bad_input_cases():
    import test_bad_input

    return [param.values[0] for param in test_bad_input.CASES if not param.marks]


def pick(data, pool):
    """An element of `pool`, drawn by index (hypothesis keeps every drawn object alive until the
    example ends, which would defeat the leak check)."""
    return pool[data.draw(st.integers(0, len(pool) - 1), label="index")]


class Tracked:
    """An object under test and what it must hold."""

    def __init__(self, obj, expected=None, **facts):
        self.obj = obj
        self.expected = expected
        self.closed = False
        self.__dict__.update(facts)


class BindingMachine(RuleBasedStateMachine):
    ort_ref = None

    def __init__(self):
        super().__init__()
        self.world = shared_world()
        self.sessions: list[Tracked] = []
        self.values: list[Tracked] = []
        self.views: list[Tracked] = []
        self.bindings: list[Tracked] = []
        self.capsules: list[Tracked] = []
        self.agents: dict[str, Tracked] = {}
        self.runs: list[Tracked] = []
        gc.collect()
        self.baseline = live()

    # -- sessions and runs -------------------------------------------------------------------------

    @rule(kind=st.sampled_from(["identity", "add"]), data=st.data())
    def new_session(self, kind, data):
        dtype = data.draw(st.sampled_from(DTYPES if kind == "identity" else ADD_DTYPES))
        options = ortagent.SessionOptions()
        options.intra_op_num_threads = 1
        session = ortagent.InferenceSession(MODELS[(kind, dtype)], options)
        self.sessions.append(Tracked(session, kind=kind, dtype=dtype))

    def _feeds(self, data, tracked, as_values):
        shape = data.draw(shapes, label="shape")
        feeds, given = {}, {}
        names = ["x"] if tracked.kind == "identity" else ["x", "b"]
        for name in names:
            array = data.draw(arrays(tracked.dtype, shape), label=name)
            feeds[name] = array
            given[name] = OrtValue.ortvalue_from_numpy(array) if as_values and data.draw(st.booleans()) else array
        return feeds, given

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), as_values=st.booleans(), keep_values=st.booleans())
    def run(self, data, as_values, keep_values):
        tracked = pick(data, self.sessions)
        feeds, given = self._feeds(data, tracked, as_values)
        if tracked.closed:
            with pytest.raises(ortagent.ObjectClosedError):
                tracked.obj.run(None, given)
            return
        want = numpy_reference(tracked.kind, feeds)
        if keep_values:
            (value,) = tracked.obj.run_with_ort_values(["y"], given)
            same(value.numpy(), want)
            self.values.append(Tracked(value, want.copy()))
        else:
            (got,) = tracked.obj.run(None, given)
            same(got, want)
            reference = ort_reference(self.ort_ref, (tracked.kind, tracked.dtype), feeds)
            if reference is not None:
                same(got, reference)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), reuse=st.booleans(), preallocate=st.booleans())
    def bind_and_run(self, data, reuse, preallocate):
        tracked = pick(data, self.sessions)
        if tracked.closed:
            with pytest.raises(ortagent.ObjectClosedError):
                tracked.obj.io_binding()
            return
        binding = tracked.obj.io_binding(reuse_output_buffers=reuse)
        entry = Tracked(binding, session=tracked, reuse=reuse, handed_out=[])
        self.bindings.append(entry)
        self._run_binding(data, entry, preallocate)

    def _run_binding(self, data, entry, preallocate):
        tracked, binding = entry.session, entry.obj
        feeds, given = self._feeds(data, tracked, as_values=True)
        for name, item in given.items():
            if isinstance(item, OrtValue):
                binding.bind_ortvalue_input(name, item)
            else:
                binding.bind_cpu_input(name, item)
        want = numpy_reference(tracked.kind, feeds)
        if preallocate and tracked.dtype != "string":
            target = np.zeros(want.shape, want.dtype)
            binding.bind_ortvalue_output("y", OrtValue.ortvalue_from_numpy(target))
        else:
            target = None
            binding.bind_output("y")
        if entry.reuse and entry.handed_out and entry.handed_out[-1][1].shape != want.shape:
            assume(False)    # reused buffers need the same shape each run (documented)
        tracked.obj.run_with_iobinding(binding)
        (value,) = binding.get_outputs()
        same(value.numpy(), want)
        if target is not None:
            same(target, want)
        if not entry.reuse:
            # earlier outputs of this binding are never overwritten by a later run
            for earlier, contents in entry.handed_out:
                same(earlier.numpy(), contents)
            entry.handed_out.append((value, want.copy()))

    @precondition(lambda self: any(not b.closed and not b.session.closed for b in self.bindings))
    @rule(data=st.data(), preallocate=st.booleans())
    def rerun_binding(self, data, preallocate):
        entry = pick(data, [b for b in self.bindings if not b.closed and not b.session.closed])
        self._run_binding(data, entry, preallocate)

    @precondition(lambda self: self.bindings)
    @rule(data=st.data())
    def close_binding(self, data):
        entry = pick(data, self.bindings)
        entry.obj.close()
        entry.closed = True
        with pytest.raises(ortagent.ObjectClosedError):
            entry.obj.get_outputs()
        for earlier, contents in entry.handed_out:    # values handed out outlive their binding
            same(earlier.numpy(), contents)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), forget=st.booleans())
    def close_session(self, data, forget):
        tracked = pick(data, self.sessions)
        tracked.obj.close()
        tracked.closed = True
        if forget:
            self.sessions.remove(tracked)

    # -- values, views, DLPack ---------------------------------------------------------------------

    @rule(dtype=st.sampled_from(DTYPES), data=st.data(), how=st.sampled_from(["numpy", "allocate", "dlpack"]))
    def new_value(self, dtype, data, how):
        array = data.draw(arrays(dtype))
        if how == "allocate":
            value = OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype if dtype != "string" else "tensor(string)")
            value.update_inplace(array)
        elif how == "dlpack" and dtype in DLPACK_DTYPES:
            if not array.flags.c_contiguous:
                with pytest.raises(ortagent.DLPackError):
                    ortagent.from_dlpack(array)
                return
            value = ortagent.from_dlpack(array)
            assert value.data_ptr() == array.ctypes.data or array.size == 0
        else:
            value = OrtValue.ortvalue_from_numpy(array)
        same(value.numpy(), array)
        self.values.append(Tracked(value, np.array(array, copy=True)))

    def _open_values(self, dtypes=None):
        return [v for v in self.values if not v.closed and (dtypes is None or str(v.expected.dtype) in dtypes)]

    @precondition(lambda self: self.values)
    @rule(data=st.data())
    def check_value(self, data):
        tracked = pick(data, self.values)
        if tracked.closed:
            with pytest.raises(ortagent.ObjectClosedError):
                tracked.obj.numpy()
            return
        assert tracked.obj.shape() == list(tracked.expected.shape)
        same(tracked.obj.numpy(), tracked.expected)

    @precondition(lambda self: self._open_values())
    @rule(data=st.data())
    def take_view(self, data):
        tracked = pick(data, self._open_values())
        view = tracked.obj.numpy()
        self.views.append(Tracked(view, tracked.expected))

    @precondition(lambda self: self.views)
    @rule(data=st.data(), drop=st.booleans())
    def check_view(self, data, drop):
        tracked = pick(data, self.views)
        same(tracked.obj, tracked.expected)           # views stay valid after close()
        if drop:
            self.views.remove(tracked)

    @precondition(lambda self: self._open_values())
    @rule(data=st.data())
    def close_value(self, data):
        tracked = pick(data, self._open_values())
        tracked.obj.close()
        tracked.closed = True

    @precondition(lambda self: self._open_values(DLPACK_DTYPES))
    @rule(data=st.data(), versioned=st.booleans(), copy=st.sampled_from([None, True]))
    def export_capsule(self, data, versioned, copy):
        tracked = pick(data, self._open_values(DLPACK_DTYPES))
        capsule = tracked.obj.__dlpack__(max_version=(1, 0) if versioned else None, copy=copy)
        self.capsules.append(Tracked(capsule, tracked.expected))

    @precondition(lambda self: self.capsules)
    @rule(data=st.data(), consumer=st.sampled_from(["numpy", "ortagent", "drop"]))
    def consume_capsule(self, data, consumer):
        tracked = pick(data, self.capsules)
        self.capsules.remove(tracked)
        if consumer == "drop":
            return                         # an unconsumed capsule releases its export when collected
        if consumer == "numpy":
            class Holder:
                def __dlpack__(self, **kwargs):
                    return tracked.obj

                def __dlpack_device__(self):
                    return (1, 0)
            result = np.from_dlpack(Holder())
        else:
            result = ortagent.from_dlpack(tracked.obj)
            self.values.append(Tracked(result, tracked.expected))
            result = result.numpy()
        same(result, tracked.expected)
        with pytest.raises(ortagent.DLPackError, match="already consumed"):
            ortagent.from_dlpack(tracked.obj)

    @precondition(lambda self: self._open_values())
    @rule(data=st.data(), as_values=st.booleans())
    def feed_value_back(self, data, as_values):
        """A value made by one session (or the caller) fed to another session."""
        tracked = pick(data, self._open_values())
        dtype = str(tracked.expected.dtype) if tracked.expected.dtype != object else "string"
        session = ortagent.InferenceSession(MODELS[("identity", dtype)])
        (out,) = session.run(None, {"x": tracked.obj if as_values else tracked.expected})
        same(out, tracked.expected)

    # -- TrainingAgent runs ------------------------------------------------------------------------

    def _agent(self, form):
        entry = self.agents.get(form)
        if entry is None or entry.closed:
            model = self.world.training_model
            agent = (ortagent.TrainingAgent(model, *STATE7_NAMES) if form == "state7" else
                     ortagent.TrainingAgent(model, **KW1192_NAMES) if form == "kw1192" else ortagent.TrainingAgent(model))
            entry = self.agents[form] = Tracked(agent)
        return entry

    @rule(form=st.sampled_from(["state7", "kw1192", "run_id"]), seed=st.integers(0, 2**32 - 1),
          as_values=st.booleans())
    def agent_forward(self, form, seed, as_values):
        entry = self._agent(form)
        case = self.world.case
        feeds = case.make_feeds(np.random.default_rng(seed))
        given = {n: OrtValue.ortvalue_from_numpy(a) if as_values else a for n, a in feeds.items()}
        if form == "run_id":
            binding = entry.obj.io_binding()
            for name in ("x", "w", "bias"):
                (binding.bind_ortvalue_input if as_values else binding.bind_cpu_input)(name, given[name])
            outputs, handle = entry.obj.run_forward(binding, None)
        else:
            binding, outputs, handle = None, [], ortagent.PartialGraphExecutionState()
            entry.obj.run_forward([given[n] for n in ("x", "w", "bias")], outputs, handle)
        np.testing.assert_allclose(outputs[0].numpy(), case.reference(feeds)[0], **F64)
        self.runs.append(Tracked(handle, None, agent=entry, form=form, feeds=feeds, binding=binding,
                                 outputs=outputs, state="waiting"))

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def agent_backward(self, data, seed):
        run = pick(data, self.runs)
        grad = np.random.default_rng(seed).standard_normal((2, 3))
        agent = run.agent.obj
        expected_error = (ortagent.ObjectClosedError if run.agent.closed else
                          None if run.state == "waiting" else
                          ortagent.UnknownRunError if run.form == "run_id" else ortagent.RunStateError)
        try:
            if run.form == "run_id":
                agent.run_backward([grad], run.obj)
                results = run.binding.get_outputs()
            else:
                results = []
                agent.run_backward([grad], results, run.obj)
        except ortagent.OrtError as exc:
            assert expected_error is not None and type(exc) is expected_error, repr(exc)
            return
        assert expected_error is None, f"expected {expected_error.__name__}"
        run.state = "finished"
        for got, want in zip(results, self.world.case.reference_gradients(run.feeds, [grad])):
            np.testing.assert_allclose(got.numpy(), want, **F64)
        np.testing.assert_allclose(run.outputs[0].numpy(), self.world.case.reference(run.feeds)[0], **F64)

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def agent_release(self, data):
        run = pick(data, self.runs)
        if run.form == "run_id":
            if run.state == "waiting" and not run.agent.closed:
                run.agent.obj.release_run(run.obj)
            else:
                with pytest.raises(ortagent.UnknownRunError):
                    run.agent.obj.release_run(run.obj)
        else:
            run.obj.release()
        run.state = "released"

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def agent_forget_run(self, data):
        """Drop a run (its state object or id) without resuming it."""
        self.runs.remove(pick(data, self.runs))

    @precondition(lambda self: self.agents)
    @rule(data=st.data())
    def agent_close(self, data):
        entry = pick(data, [self.agents[form] for form in sorted(self.agents)])
        entry.obj.close()
        entry.closed = True
        if entry is not None and entry.obj.runs_in_flight:
            raise AssertionError("close() left runs in flight")

    # -- bad input interleaved ----------------------------------------------------------------------

    @rule(data=st.data())
    def bad_call(self, data):
        case = BAD_CASES[data.draw(st.integers(0, len(BAD_CASES) - 1), label="bad input")]
        note(case.id)
        try:
            case.call(self.world)
        except Exception as exc:
            assert type(exc) is case.error, f"{case.id}: {exc!r}"
            assert case.fragment in str(exc)
        else:
            raise AssertionError(f"{case.id} raised nothing")

    # -- invariants and teardown ---------------------------------------------------------------------

    @invariant()
    def counters_never_negative(self):
        COUNTS["steps"] += 1
        assert all(count >= 0 for count in live().values()), live()

    def _release_everything(self):
        for run in self.runs:
            if run.form != "run_id":
                run.obj.release()
        for entry in self.agents.values():
            entry.obj.close()
            assert entry.obj.runs_in_flight == 0
        for entry in self.bindings:
            entry.obj.close()
        for entry in self.sessions:
            entry.obj.close()
        self.runs = self.bindings = self.sessions = self.values = self.views = self.capsules = []
        self.agents = {}

    def teardown(self):
        COUNTS["sequences"] += 1
        self._release_everything()       # (in a function of its own: no loop variable survives)
        leaked = changed(self.baseline, settled(self.baseline))
        assert not leaked, f"handles left after the sequence: {leaked}"


BAD_CASES: list = []
COUNTS: dict[str, int] = {}


@pytest.fixture(scope="module")
def machine(ort_ref):
    BindingMachine.ort_ref = ort_ref
    if not BAD_CASES:
        BAD_CASES.extend(case for case in bad_input_cases() if case.area != "agents" or "graph" not in case.id)
    shared_world()
    return BindingMachine


def _batches():
    """One batch in CI; batches until FUZZ_SECONDS have passed when fuzzing."""
    deadline = time.monotonic() + FUZZ_SECONDS
    yield 0
    batch = 1
    while FUZZING and time.monotonic() < deadline:
        yield batch
        batch += 1


def test_state_machine(machine):
    COUNTS["sequences"] = COUNTS["steps"] = 0
    for batch in _batches():
        run_state_machine_as_test(machine, settings=settings.get_profile(PROFILE))
    print(f"fuzz: {COUNTS['sequences']} state-machine sequences, {COUNTS['steps']} steps")


# ---- damaged training graphs --------------------------------------------------------------------------

TRAINING_CASES = [tg.mul_add_case, tg.mlp_case, tg.multi_output_case, tg.constants_both_sides_case]
OPS = ["Identity", "Relu", "Add", "Mul", "MatMul", "Transpose", "ReduceSum", "Neg", "NoSuchOp"]


@st.composite
def damaged_graphs(draw):
    case = draw(st.sampled_from(TRAINING_CASES))()
    model = copy.deepcopy(case.model)
    graph = model.graph
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["drop_node", "rewire", "op_type", "yield_attr", "elem_type",
                                     "drop_output", "drop_input", "swap_nodes", "rename_output"]))
        nodes = list(graph.node)
        if what == "drop_node" and nodes:
            graph.node.remove(nodes[draw(st.integers(0, len(nodes) - 1))])
        elif what == "rewire" and nodes:
            node = nodes[draw(st.integers(0, len(nodes) - 1))]
            names = [v.name for v in graph.input] + [o for n in nodes for o in n.output] + ["ghost"]
            if node.input:
                node.input[draw(st.integers(0, len(node.input) - 1))] = draw(st.sampled_from(names))
        elif what == "op_type" and nodes:
            node = nodes[draw(st.integers(0, len(nodes) - 1))]
            if node.op_type != "YieldOp" or draw(st.booleans()):
                node.op_type = draw(st.sampled_from(OPS))
        elif what == "yield_attr":
            node = next((n for n in nodes if n.op_type == "YieldOp"), None)
            if node is not None:
                del node.attribute[:]
                for name in draw(st.sets(st.sampled_from(["full_shape_outputs", "non_differentiable_outputs"]))):
                    node.attribute.append(helper.make_attribute(name, draw(st.lists(st.integers(-2, 4), max_size=3)),
                                                                attr_type=AttributeProto.INTS))
        elif what == "elem_type" and graph.input:
            value = graph.input[draw(st.integers(0, len(graph.input) - 1))]
            value.type.tensor_type.elem_type = draw(st.sampled_from([TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL]))
        elif what == "drop_output" and graph.output:
            graph.output.remove(graph.output[draw(st.integers(0, len(graph.output) - 1))])
        elif what == "drop_input" and graph.input:
            graph.input.remove(graph.input[draw(st.integers(0, len(graph.input) - 1))])
        elif what == "swap_nodes" and len(nodes) > 1:
            i, j = draw(st.integers(0, len(nodes) - 1)), draw(st.integers(0, len(nodes) - 1))
            a, b = copy.deepcopy(nodes[i]), copy.deepcopy(nodes[j])
            graph.node[i].CopyFrom(b)
            graph.node[j].CopyFrom(a)
        elif what == "rename_output" and nodes:
            node = nodes[draw(st.integers(0, len(nodes) - 1))]
            if node.output:
                node.output[0] = draw(st.sampled_from(["renamed", node.output[0] + "_2"]
                                                      + [v.name for v in graph.input[:1]]))
    return case, model


def _drive(agent, case):
    """One run of whatever the agent accepts: feeds from the case, gradients of ones."""
    rng = np.random.default_rng(0)
    feeds = case.make_feeds(rng)
    binding = agent.io_binding()
    for name in agent.split.graph_input_names:
        if name in feeds:
            binding.bind_cpu_input(name, feeds[name])
    outputs, run_id = agent.run_forward(binding, None)
    grads = [np.ones(o.shape(), dtype=o.numpy().dtype) for o, diff in zip(outputs, case.differentiable) if diff]
    agent.run_backward(grads, run_id)
    return binding.get_outputs()


@settings(settings.get_profile(PROFILE), max_examples=settings.get_profile(PROFILE).max_examples)
@given(damaged=damaged_graphs())
def _one_damaged_graph(damaged):
    COUNTS["graphs"] += 1
    case, model = damaged
    before = live()
    try:
        agent = ortagent.TrainingAgent(model.SerializeToString())
    except ortagent.OrtError as exc:
        note(f"refused at construction: {type(exc).__name__}: {exc}")
    else:
        try:
            _drive(agent, case)
        except ortagent.OrtError as exc:
            note(f"refused at run time: {type(exc).__name__}: {exc}")
        agent.close()
        del agent
    assert not changed(before, settled(before))


def test_mutated_training_graphs(ort_ref):
    quiet = ortagent.get_default_logger_severity()
    ortagent.set_default_logger_severity(4)          # onnxruntime logs the failures it reports
    COUNTS["graphs"] = 0
    try:
        for _ in _batches():
            _one_damaged_graph()
    finally:
        ortagent.set_default_logger_severity(quiet)
    print(f"fuzz: {COUNTS['graphs']} damaged training graphs")


# ---- what the fuzzing found, pinned down ---------------------------------------------------------------


@pytest.mark.parametrize("then", ["rebind", "bind_to_device", "close"])
def test_output_in_a_callers_buffer_outlives_its_binding(then, no_leaks):
    """get_outputs() of an output bound to a caller's buffer read freed memory once the output
    was bound again or the binding closed (the buffer's only owner was the bound value)."""
    session = ortagent.InferenceSession(models.add(shape=(3,)))
    binding = session.io_binding()
    binding.bind_cpu_input("a", np.full(3, 1.5, np.float32))
    binding.bind_cpu_input("b", np.full(3, 2.0, np.float32))
    binding.bind_ortvalue_output("c", OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32)))
    session.run_with_iobinding(binding)
    (value,) = binding.get_outputs()
    if then == "rebind":
        binding.bind_ortvalue_output("c", OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32)))
    elif then == "bind_to_device":
        binding.bind_output("c")
    else:
        binding.close()
    scribble = [np.full(3, 9.0, np.float32) for _ in range(64)]      # reuse freed memory
    gc.collect()
    assert value.numpy().tolist() == [3.5, 3.5, 3.5]
    del scribble
