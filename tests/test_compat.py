"""ortagent as a drop-in for onnxruntime's Python API: the same calls made on onnxruntime's own
Python module and on ortagent, with results, exception types and (where users match on them)
messages compared. Models are built here with onnx.helper; nothing is hard-coded that onnxruntime
or NumPy does not compute in the same test.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import ortagent

CPU = "CPUExecutionProvider"


# ---- models ----------------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, initializers=(), opset=18, ml=False):
    opsets = [helper.make_opsetid("", opset)]
    if ml:
        opsets.append(helper.make_opsetid("ai.onnx.ml", 3))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, ir_version=9, opset_imports=opsets)


def _tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _typed(name, type_proto):
    return helper.make_value_info(name, type_proto)


def _tensor_type(elem, shape=None):
    return helper.make_tensor_type_proto(elem, shape)


def add_model():
    return _model([helper.make_node("Add", ["x", "y"], ["z"]), helper.make_node("Neg", ["x"], ["n"])],
                  [_tensor("x", T.FLOAT, [None]), _tensor("y", T.FLOAT, [None])],
                  [_tensor("z", T.FLOAT, [None]), _tensor("n", T.FLOAT, [None])])


def sequence_output_model():
    return _model([helper.make_node("SequenceConstruct", ["a", "b"], ["s"])],
                  [_tensor("a", T.FLOAT, [2]), _tensor("b", T.FLOAT, [3])],
                  [helper.make_tensor_sequence_value_info("s", T.FLOAT, None)])


def sequence_input_model(elem=T.FLOAT):
    return _model([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0),
                   helper.make_node("SequenceLength", ["s"], ["n"])],
                  [helper.make_tensor_sequence_value_info("s", elem, None)],
                  [_tensor("y", elem, None), _tensor("n", T.INT64, [])])


def zipmap_model(string_labels=False):
    attrs = {"classlabels_strings": ["a", "b"]} if string_labels else {"classlabels_int64s": [3, 7]}
    key = T.STRING if string_labels else T.INT64
    out = _typed("z", helper.make_sequence_type_proto(helper.make_map_type_proto(key, _tensor_type(T.FLOAT))))
    return _model([helper.make_node("ZipMap", ["x"], ["z"], domain="ai.onnx.ml", **attrs)],
                  [_tensor("x", T.FLOAT, [None, 2])], [out], ml=True)


def dict_vectorizer_model(key=T.INT64, value=T.FLOAT):
    vocabulary = {"int64_vocabulary": [1, 2, 5]} if key == T.INT64 else {"string_vocabulary": ["a", "b", "c"]}
    inp = _typed("m", helper.make_map_type_proto(key, _tensor_type(value)))
    return _model([helper.make_node("DictVectorizer", ["m"], ["y"], domain="ai.onnx.ml", **vocabulary)],
                  [inp], [_tensor("y", value, None)], ml=True)


def optional_input_model():
    inp = _typed("o", helper.make_optional_type_proto(_tensor_type(T.FLOAT, [2])))
    return _model([helper.make_node("OptionalHasElement", ["o"], ["h"])], [inp], [_tensor("h", T.BOOL, [])])


def optional_output_model(empty):
    out = _typed("o", helper.make_optional_type_proto(_tensor_type(T.FLOAT, [2])))
    node = (helper.make_node("Optional", [], ["o"], type=_tensor_type(T.FLOAT, [2])) if empty
            else helper.make_node("Optional", ["x"], ["o"]))
    return _model([node, helper.make_node("Identity", ["x"], ["y"])], [_tensor("x", T.FLOAT, [2])],
                  [out, _tensor("y", T.FLOAT, [2])])


def string_model():
    return _model([helper.make_node("Identity", ["x"], ["y"])], [_tensor("x", T.STRING, [None])],
                  [_tensor("y", T.STRING, [None])])


def lora_model():
    """y = x + w, where w is an input with a default (so a LoRA parameter can replace it)."""
    w = numpy_helper.from_array(np.full(3, 0.5, np.float32), "w")
    return _model([helper.make_node("Add", ["x", "w"], ["y"])],
                  [_tensor("x", T.FLOAT, [3]), _tensor("w", T.FLOAT, [3])], [_tensor("y", T.FLOAT, [3])],
                  initializers=[w])


def external_weights_model(directory, weights):
    """y = x * w with w stored in an external file 'weights.bin' next to the model."""
    w = numpy_helper.from_array(weights, "w")
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])], [_tensor("x", T.FLOAT, [weights.size])],
                   [_tensor("y", T.FLOAT, [weights.size])], initializers=[w])
    onnx.external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                                              location="weights.bin", size_threshold=0)
    path = os.path.join(directory, "model.onnx")
    onnx.save_model(model, path)
    return path


def _both(ort_ref, model, **kwargs):
    data = model.SerializeToString()
    return (ort_ref.InferenceSession(data, providers=[CPU], **kwargs),
            ortagent.InferenceSession(data, providers=[CPU], **kwargs))


def _same(ours, theirs):
    """Deep comparison of run() results: arrays (dtype and values), lists, dicts, None."""
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), f"expected an ndarray, got {type(ours).__name__}"
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (ours, theirs)
        for a, b in zip(ours, theirs):
            _same(a, b)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), (ours, theirs)
        for key in theirs:
            assert type(ours[key]) is type(theirs[key]), (key, ours[key], theirs[key])
            assert ours[key] == theirs[key]
    else:
        assert ours == theirs


def _raises_alike(their_call, our_call):
    """Both raise; ours is an OrtError of the builtin base of theirs. Returns both exceptions."""
    with pytest.raises(Exception) as theirs:
        their_call()
    with pytest.raises(ortagent.OrtError) as ours:
        our_call()
    bases = [b for b in type(theirs.value).__mro__ if b.__module__ == "builtins" and b is not object]
    assert isinstance(ours.value, bases[0]), (type(ours.value).__mro__, bases[0])
    return theirs.value, ours.value


# ---- providers ------------------------------------------------------------------------------------

def test_provider_lists_match(ort_ref):
    assert ortagent.get_available_providers() == ort_ref.get_available_providers()
    assert ortagent.get_device() == ort_ref.get_device()
    if ort_ref.get_device() != "GPU":
        # e.g. the cp313t environment, where only the CPU wheel exists: its Python module
        # compiles in a shorter list of names
        pytest.skip("get_all_providers() is the onnxruntime-gpu wheel's list; the reference "
                    f"onnxruntime here is a CPU build ({ort_ref.__version__})")
    assert ortagent.get_all_providers() == ort_ref.get_all_providers()


def _providers_after(module, model, providers):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = module.InferenceSession(model.SerializeToString(), providers=providers)
    return session, [str(w.message) for w in caught], [w.category for w in caught]


@pytest.mark.parametrize("providers", [
    ["CUDAExecutionProvider"],
    ["CUDAExecutionProvider", CPU],
    ["TensorrtExecutionProvider", "CUDAExecutionProvider", CPU],
    [("CUDAExecutionProvider", {"device_id": "0"}), CPU],
    ["XnnpackExecutionProvider"],
    ["NoSuchExecutionProvider", CPU],
    [CPU, CPU],
    [(CPU, {"bogus": "1"})],
], ids=lambda p: "+".join(x if isinstance(x, str) else x[0] for x in p))
def test_provider_fallback_matches_onnxruntime(ort_ref, providers):
    """A provider that cannot be used is left out, with a warning, and the session runs on the
    rest: the same providers and results as onnxruntime's session."""
    theirs, their_messages, _ = _providers_after(ort_ref, add_model(), providers)
    ours, our_messages, categories = _providers_after(ortagent, add_model(), providers)
    assert ours.get_providers() == theirs.get_providers()
    assert ours.get_provider_options() == theirs.get_provider_options()
    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.ones(3, np.float32)}
    _same(ours.run(None, feeds), theirs.run(None, feeds))
    assert all(issubclass(c, ortagent.ProviderFallbackWarning) and issubclass(c, UserWarning)
               for c in categories)
    names = [p if isinstance(p, str) else p[0] for p in providers]
    if len(set(names)) < len(names) or any(n not in ortagent.get_available_providers() for n in names):
        # onnxruntime's warnings for names it does not have and for duplicates, word for word
        for message in their_messages:
            assert message in our_messages
    dropped = set(names) - set(ours.get_providers())
    if dropped:
        assert our_messages, "a provider was left out without a warning"


@pytest.mark.parametrize("providers", [["NoSuchExecutionProvider"], ["XnnpackExecutionProvider"],
                                       [CPU, CPU], ["CUDAExecutionProvider"]])
def test_strict_providers_raise(providers):
    available = ortagent.get_available_providers()
    if providers == ["CUDAExecutionProvider"] and "CUDAExecutionProvider" in available:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if "CUDAExecutionProvider" in ortagent.InferenceSession(
                    add_model().SerializeToString(), providers=providers).get_providers():
                pytest.skip("the CUDA provider works here")
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # strict mode never warns: it raises
        with pytest.raises(ortagent.OrtInvalidArgument):
            with ortagent.strict_providers():
                ortagent.InferenceSession(add_model().SerializeToString(), providers=providers)
        with pytest.raises(ortagent.OrtInvalidArgument):
            ortagent.InferenceSession(add_model().SerializeToString(), providers=providers,
                                      strict_providers=True)


def test_strict_providers_scope_ends():
    with ortagent.strict_providers():
        pass
    with pytest.warns(ortagent.ProviderFallbackWarning):
        session = ortagent.InferenceSession(add_model().SerializeToString(),
                                            providers=["NoSuchExecutionProvider"])
    assert session.get_providers() == [CPU]


def test_set_providers_and_fallback_switches(ort_ref):
    theirs, ours = _both(ort_ref, add_model())
    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.ones(3, np.float32)}
    for session in (theirs, ours):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session.set_providers(["CUDAExecutionProvider", CPU])
        session.disable_fallback()
        session.enable_fallback()
    assert ours.get_providers() == theirs.get_providers()
    _same(ours.run(None, feeds), theirs.run(None, feeds))
    # onnxruntime reads a string as a list of one-letter provider names (RuntimeError: "Unknown
    # Provider Type: C"); ortagent says what is wrong
    with pytest.raises(ortagent.OrtInvalidType, match="not a string"):
        ours.set_providers("CPUExecutionProvider")
    assert ours.get_providers() == [CPU]



@pytest.mark.parametrize("providers", [["InvalidProvider"], ["InvalidProvider", CPU]])
def test_set_providers_unknown(ort_ref, providers):
    """set_providers does not fall back the way the constructor does: an unknown name warns and
    raises a RuntimeError with onnxruntime's text. onnxruntime's session is left without providers
    (get_providers() is None); ortagent's keeps its own and still runs."""
    theirs, ours = _both(ort_ref, add_model())
    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.ones(3, np.float32)}
    with pytest.warns(UserWarning) as their_warnings:
        their_error, our_error = _raises_alike(lambda: theirs.set_providers(providers),
                                               lambda: ours.set_providers(providers))
    assert str(our_error) == str(their_error) == "Unknown Provider Type: InvalidProvider"
    texts = [str(w.message) for w in their_warnings]
    assert len(texts) == 2 and texts[0] == texts[1]                     # theirs, then ours
    assert theirs.get_providers() is None
    assert ours.get_providers() == [CPU]
    np.testing.assert_array_equal(ours.run(None, feeds)[0], feeds["x"] + feeds["y"])
    with pytest.raises(ortagent.ProviderError), ortagent.strict_providers():
        ours.set_providers(providers)

# ---- NodeArg types --------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [sequence_output_model, sequence_input_model, zipmap_model,
                                  lambda: zipmap_model(True), dict_vectorizer_model,
                                  lambda: dict_vectorizer_model(T.STRING, T.DOUBLE), optional_input_model,
                                  lambda: optional_output_model(False), string_model, add_model])
def test_node_arg_types_match(ort_ref, make):
    theirs, ours = _both(ort_ref, make())
    for mine, reference in ((ours.get_inputs(), theirs.get_inputs()), (ours.get_outputs(), theirs.get_outputs())):
        assert [(a.name, a.type, a.shape) for a in mine] == [(a.name, a.type, a.shape) for a in reference]


# ---- run() arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("output_names", [None, [], ["n"], ["z", "n"]])
def test_output_names(ort_ref, output_names):
    theirs, ours = _both(ort_ref, add_model())
    feeds = {"x": np.arange(4, dtype=np.float32), "y": np.full(4, 2, np.float32)}
    _same(ours.run(output_names, feeds), theirs.run(output_names, feeds))


def test_missing_inputs_message(ort_ref):
    theirs, ours = _both(ort_ref, add_model())
    for feeds in ({"x": np.ones(2, np.float32)}, {}):
        their_error, our_error = _raises_alike(lambda: theirs.run(None, feeds), lambda: ours.run(None, feeds))
        assert str(our_error) == str(their_error)


@pytest.mark.parametrize("x", [[1.0, 2.0, 3.0], [1, 2, 3], (4.0, 5.0, 6.0)])
def test_list_feeds_take_the_input_type(ort_ref, x):
    theirs, ours = _both(ort_ref, add_model())
    y = np.full(3, 0.5, np.float32)
    if isinstance(x, tuple):            # onnxruntime takes lists only; ortagent tuples too
        _same(ours.run(None, {"x": x, "y": y}), theirs.run(None, {"x": list(x), "y": y}))
    else:
        _same(ours.run(None, {"x": x, "y": y}), theirs.run(None, {"x": x, "y": y}))


@pytest.mark.parametrize("feed", [
    ["ab", "c"],
    np.array(["ab", "cde"]),
    np.array(["ab", "c"], dtype=object),
    np.array([b"ab", b"cd"]).astype(np.void),
])
def test_string_feeds(ort_ref, feed):
    theirs, ours = _both(ort_ref, string_model())
    _same(ours.run(None, {"x": feed}), theirs.run(None, {"x": feed}))


def test_bytes_array_feed():
    """onnxruntime 1.31 runs NUL-less 'S' items together ('ab', 'c' comes back as 'abc', 'c');
    ortagent gives each item, as NumPy holds it."""
    session = ortagent.InferenceSession(string_model().SerializeToString())
    feed = np.array([b"ab", b"c"])
    result = session.run(None, {"x": feed})[0]
    assert result.tolist() == [item.decode() for item in feed.tolist()]


# ---- sequences, maps, optionals -------------------------------------------------------------------

def test_sequence_output(ort_ref):
    theirs, ours = _both(ort_ref, sequence_output_model())
    feeds = {"a": np.arange(2, dtype=np.float32), "b": np.arange(3, dtype=np.float32) * 2}
    _same(ours.run(None, feeds), theirs.run(None, feeds))


@pytest.mark.parametrize("items", [
    [np.ones(2, np.float32), np.arange(3, dtype=np.float32)],
    [np.zeros((0,), np.float32), np.ones(1, np.float32)],
])
def test_sequence_input(ort_ref, items):
    theirs, ours = _both(ort_ref, sequence_input_model())
    _same(ours.run(None, {"s": items}), theirs.run(None, {"s": items}))


def test_sequence_input_of_the_wrong_type(ort_ref):
    theirs, ours = _both(ort_ref, sequence_input_model())
    with pytest.raises(RuntimeError):
        theirs.run(None, {"s": [np.ones(2, np.int64)]})
    with pytest.raises(ortagent.OrtInvalidArgument, match="tensor\\(float\\)"):
        ours.run(None, {"s": [np.ones(2, np.int64)]})
    with pytest.raises(ortagent.OrtInvalidType, match="give a list"):
        ours.run(None, {"s": np.ones(2, np.float32)})


@pytest.mark.parametrize("string_labels", [False, True])
def test_sequence_of_maps_output(ort_ref, string_labels):
    theirs, ours = _both(ort_ref, zipmap_model(string_labels))
    feeds = {"x": np.array([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]], np.float32)}
    _same(ours.run(None, feeds), theirs.run(None, feeds))


def test_map_input(ort_ref):
    theirs, ours = _both(ort_ref, dict_vectorizer_model())
    for feed in ({1: 2.0, 5: 3.5}, {2: -1.0}):
        _same(ours.run(None, {"m": feed}), theirs.run(None, {"m": feed}))


def test_string_keyed_map_input(ort_ref):
    theirs, ours = _both(ort_ref, dict_vectorizer_model(T.STRING, T.FLOAT))
    feed = {"a": 1.5, "c": 4.0}
    _same(ours.run(None, {"m": feed}), theirs.run(None, {"m": feed}))


def test_map_input_with_wrong_keys(ort_ref):
    theirs, ours = _both(ort_ref, dict_vectorizer_model())
    _raises_alike(lambda: theirs.run(None, {"m": {"a": 1.0}}), lambda: ours.run(None, {"m": {"a": 1.0}}))


@pytest.mark.parametrize("feed", [np.ones(2, np.float32), [1.0, 2.0]])
def test_optional_input_with_a_value(ort_ref, feed):
    theirs, ours = _both(ort_ref, optional_input_model())
    _same(ours.run(None, {"o": feed}), theirs.run(None, {"o": feed}))


@pytest.mark.parametrize("empty", [False, True])
def test_optional_output(ort_ref, empty):
    theirs, ours = _both(ort_ref, optional_output_model(empty))
    feeds = {"x": np.arange(2, dtype=np.float32)}
    _same(ours.run(None, feeds), theirs.run(None, feeds))


def test_container_values_round_trip():
    """ortagent's own conversions: Python object -> OrtValue of an ONNX type -> Python object."""
    from ortagent import _core

    cases = [("seq(tensor(int64))", [np.arange(3), np.arange(2)]),
             ("map(int64,tensor(float))", {1: 0.5, 9: 2.0}),
             ("map(string,tensor(double))", {"k": 1.25}),
             ("seq(map(string,tensor(float)))", [{"a": 1.0}, {"b": 2.0, "c": 3.0}])]
    for type_string, obj in cases:
        value = _core.value_from_python(obj, type_string)
        assert _core.type_string(_core.describe_value_type(value)) == type_string
        back = _core.value_to_python(value)
        if isinstance(obj, list) and isinstance(obj[0], np.ndarray):
            assert [a.tolist() for a in back] == [a.tolist() for a in obj]
        else:
            assert back == obj
        value.close()


# ---- session and runtime API ----------------------------------------------------------------------

def test_session_config_entry_unknown_key(ort_ref):
    theirs, ours = ort_ref.SessionOptions(), ortagent.SessionOptions()
    their_error, our_error = _raises_alike(lambda: theirs.get_session_config_entry("no.such.key"),
                                           lambda: ours.get_session_config_entry("no.such.key"))
    assert str(our_error) == str(their_error)
    for options in (theirs, ours):
        options.add_session_config_entry("session.use_env_allocators", "1")
    assert ours.get_session_config_entry("session.use_env_allocators") == \
        theirs.get_session_config_entry("session.use_env_allocators")


def test_use_per_session_threads_default(ort_ref):
    assert ortagent.SessionOptions().use_per_session_threads == ort_ref.SessionOptions().use_per_session_threads


def test_telemetry_switches(ort_ref):
    for module in (ort_ref, ortagent):
        assert module.enable_telemetry_events() is None
        assert module.disable_telemetry_events() is None


def test_global_thread_pools_in_a_fresh_process(ort_ref, tmp_path):
    """Sessions on global thread pools compute what onnxruntime's do; a session whose options ask
    for threads of its own (the default) is refused as onnxruntime refuses it (a RuntimeError,
    onnxruntime's words, before the model is read, no handle left behind), while ortagent's own
    helper sessions still run; asking for pools once ortagent's environment exists is a
    RuntimeError."""
    model = tmp_path / "add.onnx"
    onnx.save_model(add_model(), str(model))
    script = textwrap.dedent(f"""
        import gc, numpy as np, onnxruntime, ortagent
        feeds = {{"x": np.arange(5, dtype=np.float32), "y": np.ones(5, np.float32)}}
        results, refusals = [], []
        for module in (onnxruntime, ortagent):
            module.set_global_thread_pool_sizes(2, 1)
            options = module.SessionOptions()
            options.use_per_session_threads = False
            session = module.InferenceSession({str(model)!r}, options, providers=["CPUExecutionProvider"])
            results.append(session.run(None, feeds))
            for per_session, mode in ((None, None), (True, module.ExecutionMode.ORT_PARALLEL)):
                options = None
                if per_session is not None:
                    options = module.SessionOptions()
                    options.execution_mode = mode
                    options.use_per_session_threads = per_session
                for path in ({str(model)!r}, "no/such/model.onnx"):
                    try:
                        module.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                    except RuntimeError as exc:
                        refusals.append((module.__name__, str(exc).strip().rsplit("> ", 1)[-1]))
                    else:
                        raise AssertionError(f"{{module.__name__}} ran a session with threads of its own")
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)
        words = "use_per_session_threads must be false when using a global thread pool"
        assert len(refusals) == 8 and all(text == words for _, text in refusals), refusals
        assert [name for name, _ in refusals] == ["onnxruntime"] * 4 + ["ortagent"] * 4, refusals
        gc.collect()
        assert ortagent.live_handles()["session"] == 1, ortagent.live_handles()
        # helper sessions of ortagent's own (an empty sequence is made by a one-node model)
        import onnx
        from onnx import helper, TensorProto
        seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
        length = helper.make_model(helper.make_graph(
            [helper.make_node("SequenceLength", ["s"], ["n"])], "g", [seq],
            [helper.make_tensor_value_info("n", TensorProto.INT64, [])]),
            ir_version=9, opset_imports=[helper.make_opsetid("", 18)])
        options = ortagent.SessionOptions()
        options.use_per_session_threads = False
        assert ortagent.InferenceSession(length, options).run(None, {{"s": []}})[0] == 0
        ortagent.set_global_thread_pool_sizes(2, 1)     # the same sizes again: nothing to do
        try:
            ortagent.set_global_thread_pool_sizes(3, 1)
        except RuntimeError as exc:
            assert "environment exists already" in str(exc), exc
        else:
            raise AssertionError("no error for pools asked after the environment was made")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_external_initializers(ort_ref, tmp_path):
    weights = np.arange(1, 5, dtype=np.float32)
    path = external_weights_model(str(tmp_path), weights)
    moved = str(tmp_path / "elsewhere.onnx")
    os.rename(path, moved)              # away from weights.bin: the weights must come from memory
    x = np.full(4, 3.0, np.float32)
    results = []
    for module in (ort_ref, ortagent):
        options = module.SessionOptions()
        options.add_external_initializers(["w"], [module.OrtValue.ortvalue_from_numpy(weights)])
        results.append(module.InferenceSession(moved, options, providers=[CPU]).run(None, {"x": x}))
    _same(results[1], results[0])
    np.testing.assert_array_equal(results[1][0], x * weights)


def test_external_initializer_files_in_memory(ort_ref, tmp_path):
    weights = np.linspace(-1, 1, 6, dtype=np.float32)
    path = external_weights_model(str(tmp_path), weights)
    with open(tmp_path / "weights.bin", "rb") as handle:
        contents = handle.read()
    os.remove(tmp_path / "weights.bin")
    x = np.arange(6, dtype=np.float32)
    results = []
    for module, buffer in ((ort_ref, contents), (ortagent, bytearray(contents))):
        options = module.SessionOptions()
        options.add_external_initializers_from_files_in_memory(["weights.bin"], [buffer], [len(contents)])
        results.append(module.InferenceSession(path, options, providers=[CPU]).run(None, {"x": x}))
    _same(results[1], results[0])
    np.testing.assert_allclose(results[1][0], x * weights)
    with pytest.raises(ortagent.OrtInvalidArgument, match="lengths"):
        ortagent.SessionOptions().add_external_initializers_from_files_in_memory(["w"], [b"ab"], [3])
    # the contents given are used, even if the caller's buffer changes before the session is made
    mutable = bytearray(contents)
    options = ortagent.SessionOptions()
    options.add_external_initializers_from_files_in_memory(["weights.bin"], [mutable], [len(mutable)])
    mutable[:] = bytes(len(mutable))
    _same(ortagent.InferenceSession(path, options).run(None, {"x": x}), results[0])
    with pytest.raises(ortagent.OrtInvalidType, match="bytes-like"):
        ortagent.SessionOptions().add_external_initializers_from_files_in_memory(["w"], ["text"], [4])


def test_lora_adapter(ort_ref, tmp_path):
    adapter_path = str(tmp_path / "adapter.onnx_adapter")
    params = np.array([10.0, 20.0, 30.0], np.float32)
    writer = ort_ref.AdapterFormat()
    writer.set_adapter_version(1)
    writer.set_model_version(1)
    writer.set_parameters({"w": ort_ref.OrtValue.ortvalue_from_numpy(params)})
    writer.export_adapter(adapter_path)
    x = np.arange(3, dtype=np.float32)
    results = []
    for module in (ort_ref, ortagent):
        session = module.InferenceSession(lora_model().SerializeToString(), providers=[CPU])
        adapter = module.LoraAdapter()
        adapter.Load(adapter_path)
        run_options = module.RunOptions()
        run_options.add_active_adapter(adapter)
        results.append((session.run(None, {"x": x}), session.run(None, {"x": x}, run_options)))
    (their_plain, their_lora), (our_plain, our_lora) = results
    _same(our_plain, their_plain)
    _same(our_lora, their_lora)
    np.testing.assert_array_equal(our_lora[0], x + params)
    # the run options refer to the adapter they were given: it cannot be replaced under them
    with pytest.raises(ortagent.OrtInvalidArgument, match="active in a RunOptions"):
        adapter.Load(adapter_path)
    _same(session.run(None, {"x": x}, run_options), our_lora)
    with open(adapter_path, "rb") as handle:
        from_bytes = ortagent.LoraAdapter()
        from_bytes.Load(handle.read())
    with pytest.raises(ortagent.OrtNoSuchFile):
        ortagent.LoraAdapter().Load(str(tmp_path / "missing.onnx_adapter"))
    with pytest.raises(ortagent.OrtInvalidArgument, match="Load"):
        ortagent.RunOptions().add_active_adapter(ortagent.LoraAdapter())
    # adapter handles are counted like the others, and released with their last user
    held = ortagent.live_handles()["lora_adapter"]
    assert held >= 2
    del adapter, from_bytes, run_options, session
    gc.collect()
    assert ortagent.live_handles()["lora_adapter"] == held - 2


def test_graph_optimization_levels(ort_ref):
    assert {m.name: int(m) for m in ortagent.GraphOptimizationLevel} == \
        {name: int(getattr(ort_ref.GraphOptimizationLevel, name)) for name in
         ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT", "ORT_ENABLE_ALL")}
    theirs, ours = ort_ref.SessionOptions(), ortagent.SessionOptions()
    theirs.graph_optimization_level = ort_ref.GraphOptimizationLevel.ORT_ENABLE_LAYOUT
    ours.graph_optimization_level = ortagent.GraphOptimizationLevel.ORT_ENABLE_LAYOUT
    assert int(ours.graph_optimization_level) == int(theirs.graph_optimization_level)


def test_custom_ops_library_missing(ort_ref, tmp_path):
    missing = str(tmp_path / "libnothing.so")
    _raises_alike(lambda: ort_ref.SessionOptions().register_custom_ops_library(missing),
                  lambda: ortagent.SessionOptions().register_custom_ops_library(missing))


# ---- sparse tensors -------------------------------------------------------------------------------

def sparse_matmul_model():
    return helper.make_model(
        helper.make_graph([helper.make_node("SparseToDenseMatMul", ["A", "B"], ["Y"], domain="com.microsoft")], "g",
                          [helper.make_sparse_tensor_value_info("A", T.FLOAT, [3, 4]), _tensor("B", T.FLOAT, [4, 2])],
                          [_tensor("Y", T.FLOAT, [3, 2])]),
        ir_version=9, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _sparse_pair(module, kind):
    device = module.OrtDevice.make("cpu", 0) if module is not ortagent else None
    if kind == "coo":
        values = np.array([1.5, -2.0, 3.0], np.float32)
        return module.SparseTensor.sparse_coo_from_numpy([3, 4], values, np.array([[0, 1], [2, 0], [2, 3]], np.int64),
                                                         device)
    values = np.array([4.0, 5.0, 6.0], np.float32)
    return module.SparseTensor.sparse_csr_from_numpy([2, 3], values, np.array([0, 2, 1], np.int64),
                                                     np.array([0, 2, 3], np.int64), device)


@pytest.mark.parametrize("kind", ["coo", "csr"])
def test_sparse_tensor_matches(ort_ref, kind):
    theirs, ours = _sparse_pair(ort_ref, kind), _sparse_pair(ortagent, kind)
    assert int(ours.format()) == int(theirs.format())
    assert ours.dense_shape() == list(theirs.dense_shape())
    assert ours.data_type() == theirs.data_type()
    assert ours.device_name() == theirs.device_name()
    _same(ours.values(), np.asarray(theirs.values()))
    # read-only views of the tensor's memory in both, alive after the tensor is gone
    if kind == "coo":
        views = [ours.values(), ours.as_coo_view().indices()]
    else:
        views = [ours.values(), ours.as_csrc_view().inner(), ours.as_csrc_view().outer()]
    assert [v.flags.writeable for v in views] == [False] * len(views) == [theirs.values().flags.writeable] * len(views)
    expected = [v.copy() for v in views]
    del ours
    gc.collect()
    for view, copy in zip(views, expected):
        np.testing.assert_array_equal(view, copy)
    ours = _sparse_pair(ortagent, kind)
    if kind == "coo":
        _same(ours.as_coo_view().indices(), np.asarray(theirs.as_coo_view().indices()))
        their_error, our_error = _raises_alike(theirs.as_csrc_view, ours.as_csrc_view)
    else:
        _same(ours.as_csrc_view().inner(), np.asarray(theirs.as_csrc_view().inner()))
        _same(ours.as_csrc_view().outer(), np.asarray(theirs.as_csrc_view().outer()))
        their_error, our_error = _raises_alike(theirs.as_coo_view, ours.as_coo_view)
    assert str(our_error) in str(their_error)


def test_sparse_input_to_a_session(ort_ref):
    b = np.arange(8, dtype=np.float32).reshape(4, 2)
    theirs, ours = _both(ort_ref, sparse_matmul_model())
    assert [(a.name, a.type, a.shape) for a in ours.get_inputs()] == \
        [(a.name, a.type, a.shape) for a in theirs.get_inputs()]
    their_value = ort_ref.OrtValue.ort_value_from_sparse_tensor(_sparse_pair(ort_ref, "coo"))
    our_value = ortagent.OrtValue.ort_value_from_sparse_tensor(_sparse_pair(ortagent, "coo"))
    assert our_value.is_sparse_tensor() and their_value.is_sparse_tensor()
    assert not our_value.is_tensor()
    expected = theirs.run_with_ort_values(["Y"], {"A": their_value, "B": ort_ref.OrtValue.ortvalue_from_numpy(b)})
    _same(ours.run(["Y"], {"A": our_value, "B": b})[0], expected[0].numpy())
    _same(our_value.as_sparse_tensor().values(), np.asarray(their_value.as_sparse_tensor().values()))




def test_sparse_views_first_thing_in_a_process():
    """Values read before anything else in the process made ortagent load NumPy's type table
    (as onnxruntime's upstream sparse tests do) have the tensor's dtype."""
    script = textwrap.dedent("""
        import numpy as np, ortagent
        st = ortagent.SparseTensor.sparse_coo_from_numpy([4], np.array([1.5, 2.5], np.float32),
                                                         np.array([0, 3], np.int64))
        values = st.values()
        assert values.dtype == np.float32 and values.tolist() == [1.5, 2.5], (values.dtype, values)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]

@pytest.mark.parametrize("kind", ["coo", "csr"])
def test_sparse_strings(ort_ref, kind):
    """String values (onnxruntime takes str arrays; ortagent bytes and str objects too) are copied
    in, read back as str, and go through a session whose sparse input is its output."""
    def pair(module, values):
        device = module.OrtDevice.make("cpu", 0) if module is not ortagent else None
        if kind == "coo":
            return module.SparseTensor.sparse_coo_from_numpy([2, 3], values, np.array([1, 4], np.int64), device)
        return module.SparseTensor.sparse_csr_from_numpy([2, 3], values, np.array([1, 2], np.int64),
                                                         np.array([0, 1, 2], np.int64), device)
    words = np.array(["é", "longer than any short-string buffer"])
    theirs = pair(ort_ref, words)
    for values in (words, words.astype(object), np.array([w.encode() for w in words], object)):
        ours = pair(ortagent, values)
        assert ours.data_type() == theirs.data_type() == "sparse_tensor(string)"
        assert int(ours.format()) == int(theirs.format())
        _same(ours.values(), np.asarray(theirs.values()))
        del values                                       # copies: the arrays may go
        _same(ours.values(), np.asarray(theirs.values()))
    kind_proto = helper.make_sparse_tensor_type_proto(T.STRING, [2, 3])
    their_session, our_session = _both(ort_ref, _model([], [_typed("s", kind_proto)], [_typed("s", kind_proto)]))
    (their_out,) = their_session.run_with_ort_values(None, {"s": ort_ref.OrtValue.ort_value_from_sparse_tensor(theirs)})
    (our_out,) = our_session.run_with_ort_values(None, {"s": ortagent.OrtValue.ort_value_from_sparse_tensor(ours)})
    assert our_out.data_type() == their_out.data_type()
    _same(our_out.as_sparse_tensor().values(), np.asarray(their_out.as_sparse_tensor().values()))

# ---- values, devices, memory infos ------------------------------------------------------------------

def test_ortvalue_with_onnx_type(ort_ref):
    bits = np.array([0x3F80, 0x4000, 0xC040], np.uint16)      # bfloat16 1, 2, -3
    theirs = ort_ref.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, T.BFLOAT16)
    ours = ortagent.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, T.BFLOAT16)
    assert ours.data_type() == theirs.data_type()
    assert ours.element_type() == theirs.element_type()
    assert ours.shape() == theirs.shape()
    assert ours.tensor_size_in_bytes() == theirs.tensor_size_in_bytes()
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=T.FLOAT)], [_tensor("x", T.BFLOAT16, [3])],
                   [_tensor("y", T.FLOAT, [3])])
    their_session, our_session = _both(ort_ref, model)
    _same(our_session.run(None, {"x": ours}), their_session.run(None, {"x": theirs}))
    their_error, our_error = _raises_alike(
        lambda: ort_ref.OrtValue.ortvalue_from_numpy_with_onnx_type(bits.astype(np.uint32), T.BFLOAT16),
        lambda: ortagent.OrtValue.ortvalue_from_numpy_with_onnx_type(bits.astype(np.uint32), T.BFLOAT16))
    assert str(our_error) in str(their_error)


def test_tensor_size_in_bytes(ort_ref):
    for array in (np.ones((2, 3), np.float32), np.arange(5, dtype=np.int64), np.zeros((0, 4), np.float16)):
        assert ortagent.OrtValue.ortvalue_from_numpy(array).tensor_size_in_bytes() == \
            ort_ref.OrtValue.ortvalue_from_numpy(array).tensor_size_in_bytes()


def test_sequence_value_kinds(ort_ref):
    theirs, ours = _both(ort_ref, sequence_output_model())
    feeds = {"a": np.ones(2, np.float32), "b": np.zeros(3, np.float32)}
    (value,) = ours.run_with_ort_values(None, feeds)
    assert value.is_tensor_sequence() and not value.is_tensor() and not value.is_sparse_tensor()
    assert value.data_type() == theirs.get_outputs()[0].type
    assert not ortagent.OrtValue.ortvalue_from_numpy(np.ones(2)).is_tensor_sequence()


@pytest.mark.parametrize("name", ["cpu", "cuda", "gpu"])
def test_ort_device_make(ort_ref, name):
    if name == "gpu" and ort_ref.get_device() != "GPU":
        pytest.skip("'gpu' is NVIDIA's vendor id in the onnxruntime-gpu wheel, which ortagent follows; "
                    f"the reference onnxruntime here is a CPU build ({ort_ref.__version__}) and says 0")
    theirs, ours = ort_ref.OrtDevice.make(name, 0), ortagent.OrtDevice.make(name, 0)
    assert (ours.device_type(), ours.device_id(), ours.device_mem_type(), ours.device_vendor_id()) == \
        (theirs.device_type(), theirs.device_id(), theirs.device_mem_type(), theirs.device_vendor_id())



def test_ort_device_type_numbers(ort_ref):
    """The device-type and memory-type numbers onnxruntime's C-level OrtDevice hands out."""
    C = ort_ref.capi._pybind_state.OrtDevice
    for name in ("cpu", "cuda", "gpu", "webgpu", "fpga", "npu", "cann", "dml", "default_memory"):
        assert getattr(ortagent.OrtDevice, name)() == getattr(C, name)(), name
    theirs, ours = C(C.cpu(), C.default_memory(), 0), ortagent.OrtDevice(0, 0, 0)
    assert ours.vendor_id() == theirs.vendor_id()


def test_ortvalue_array_protocol(ort_ref):
    """numpy.asarray / numpy.array of an OrtValue: the tensor (a view unless a copy or another
    dtype is asked for), in both modules."""
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    theirs = ort_ref.OrtValue.ortvalue_from_numpy(data)
    ours = ortagent.OrtValue.ortvalue_from_numpy(data)
    for convert in (np.asarray, lambda v: np.asarray(v, dtype=np.float64), lambda v: np.array(v, copy=True),
                    lambda v: np.array(v, dtype=np.int32)):
        _same(convert(ours), convert(theirs))
    assert np.shares_memory(np.asarray(ours), data) == np.shares_memory(np.asarray(theirs), data) == True  # noqa: E712
    assert not np.shares_memory(np.array(ours, copy=True), data)


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.float32])
def test_dlpack_bool_tensors(ort_ref, dtype):
    """onnxruntime's from_dlpack(capsule, is_bool_tensor) and is_dlpack_uint8_tensor: booleans
    that travelled as uint8 come back as tensor(bool) over the same memory; the flag leaves other
    types alone. (DLPack's own bool type: onnxruntime refuses it, ortagent reads it.)"""
    C = ort_ref.capi._pybind_state
    if not hasattr(C, "is_dlpack_uint8_tensor"):
        pytest.skip("the reference onnxruntime is built without DLPack (its CPU wheel for cp313t)")
    data = (np.arange(4) % 2).astype(dtype)
    assert ortagent.is_dlpack_uint8_tensor(data.__dlpack__()) == C.is_dlpack_uint8_tensor(data.__dlpack__())
    for is_bool in (False, True):
        ours = ortagent.OrtValue.from_dlpack(data.__dlpack__(), is_bool)
        if dtype is np.bool_:
            with pytest.raises(RuntimeError, match="Unsupported code 6"):
                C.OrtValue.from_dlpack(data.__dlpack__(), is_bool)
            assert ours.data_type() == "tensor(bool)" and ours.numpy().tolist() == data.tolist()
            continue
        theirs = C.OrtValue.from_dlpack(data.__dlpack__(), is_bool)
        assert ours.data_type() == theirs.data_type()
        _same(ours.numpy(), theirs.numpy())
        assert ours.data_ptr() == theirs.data_ptr() == data.ctypes.data

def test_ort_device_make_unknown(ort_ref):
    their_error, our_error = _raises_alike(lambda: ort_ref.OrtDevice.make("foo", 0),
                                           lambda: ortagent.OrtDevice.make("foo", 0))
    assert str(our_error) == str(their_error)


def test_memory_enums(ort_ref):
    for name in ("OrtAllocatorType", "OrtMemType", "OrtMemoryInfoDeviceType", "OrtDeviceMemoryType"):
        theirs = getattr(ort_ref, name)
        ours = getattr(ortagent, name)
        their_members = {k: int(v) for k, v in theirs.__members__.items()}
        assert {k: int(v) for k, v in ours.__members__.items()} == their_members, name


@pytest.mark.parametrize("args", [("Cpu", 1, 0, 0), ("Cpu", 0, 0, -1), ("Cuda", 0, 1, 0), ("CudaPinned", 0, 0, -1)])
def test_memory_info(ort_ref, args):
    name, alloc, device, mem = args
    theirs = ort_ref.OrtMemoryInfo(name, ort_ref.OrtAllocatorType(alloc), device, ort_ref.OrtMemType(mem))
    ours = ortagent.OrtMemoryInfo(name, ortagent.OrtAllocatorType(alloc), device, ortagent.OrtMemType(mem))
    assert ours.name == theirs.name and ours.device_id == theirs.device_id
    assert int(ours.mem_type) == int(theirs.mem_type)
    assert int(ours.allocator_type) == int(theirs.allocator_type)
    assert int(ours.device_mem_type) == int(theirs.device_mem_type)
    assert ours.device_vendor_id == theirs.device_vendor_id
    assert ours == ortagent.OrtMemoryInfo(name, alloc, device, mem)


def test_session_memory_infos(ort_ref):
    theirs, ours = _both(ort_ref, add_model())
    for mine, reference in ((ours.get_input_memory_infos(), theirs.get_input_memory_infos()),
                            (ours.get_output_memory_infos(), theirs.get_output_memory_infos())):
        assert [(m.name, m.device_id, int(m.mem_type), int(m.allocator_type)) for m in mine] == \
            [(m.name, m.device_id, int(m.mem_type), int(m.allocator_type)) for m in reference]


# ---- profiling and asynchronous runs ----------------------------------------------------------------

def test_profiling(ort_ref, tmp_path):
    files = []
    for module in (ort_ref, ortagent):
        options = module.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / module.__name__)
        session = module.InferenceSession(add_model().SerializeToString(), options, providers=[CPU])
        assert session.get_profiling_start_time_ns() > 0
        session.run(None, {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})
        files.append(session.end_profiling())
    for path in files:
        assert os.path.exists(path)
        import json
        with open(path) as handle:
            events = json.load(handle)
        assert any(event.get("name") == "model_run" for event in events)
    plain = ortagent.InferenceSession(add_model().SerializeToString())
    assert plain.end_profiling() == ort_ref.InferenceSession(add_model().SerializeToString(),
                                                              providers=[CPU]).end_profiling()


def test_run_async(ort_ref):
    import threading

    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.ones(3, np.float32)}
    results = {}
    for module in (ort_ref, ortagent):
        done = threading.Event()
        session = module.InferenceSession(add_model().SerializeToString(), providers=[CPU])

        def callback(outputs, data, error, done=done, name=module.__name__):
            results[name] = (outputs, data, error)
            done.set()

        session.run_async(["z"], feeds, callback, "token")
        assert done.wait(60)
    (their_outputs, their_data, their_error), (our_outputs, our_data, our_error) = results.values()
    assert our_error == their_error == "" and our_data == their_data == "token"
    _same([np.asarray(a) for a in our_outputs], [np.asarray(a) for a in their_outputs])
    failed = threading.Event()
    seen = []
    ortagent.InferenceSession(add_model().SerializeToString()).run_async(
        None, {"x": feeds["x"]}, lambda o, d, e: (seen.append((o, d, e)), failed.set()), 7)
    assert failed.wait(60)
    assert seen[0][0] is None and seen[0][1] == 7 and "Required inputs" in seen[0][2]


# ---- arenas and shared allocators -------------------------------------------------------------------

_ARENA_NAMES = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes", "max_dead_bytes_per_chunk",
                "initial_growth_chunk_size_bytes", "max_power_of_two_extend_bytes")


@pytest.mark.parametrize("args", [({},), (0, -1, -1, -1), ({"max_mem": 1 << 20, "arena_extend_strategy": 1},),
                                  (1 << 22, 0, 1 << 16, 1 << 10)])
def test_arena_cfg(ort_ref, args):
    theirs, ours = ort_ref.OrtArenaCfg(*args), ortagent.OrtArenaCfg(*args)
    assert [getattr(ours, n) for n in _ARENA_NAMES] == [getattr(theirs, n) for n in _ARENA_NAMES]
    theirs.max_mem = ours.max_mem = 4096
    assert ours.max_mem == theirs.max_mem


def test_arena_cfg_unknown_setting(ort_ref):
    their_error, our_error = _raises_alike(lambda: ort_ref.OrtArenaCfg({"bogus": 1}),
                                           lambda: ortagent.OrtArenaCfg({"bogus": 1}))
    assert str(our_error) in str(their_error)


def test_shared_allocator_in_a_fresh_process(tmp_path):
    """A session on an allocator registered with the environment computes what onnxruntime's
    does the same way."""
    model = tmp_path / "add.onnx"
    onnx.save_model(add_model(), str(model))
    script = textwrap.dedent(f"""
        import numpy as np, onnxruntime, ortagent
        feeds = {{"x": np.arange(5, dtype=np.float32), "y": np.ones(5, np.float32)}}
        results = []
        for module in (onnxruntime, ortagent):
            info = module.OrtMemoryInfo("Cpu", module.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                        module.OrtMemType.DEFAULT)
            module.create_and_register_allocator(info, module.OrtArenaCfg({{"max_mem": 1 << 24}}))
            options = module.SessionOptions()
            options.add_session_config_entry("session.use_env_allocators", "1")
            session = module.InferenceSession({str(model)!r}, options, providers=["CPUExecutionProvider"])
            results.append(session.run(None, feeds))
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_register_allocator_v2_bad_provider():
    info = ortagent.OrtMemoryInfo("Cpu", ortagent.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ortagent.OrtMemType.DEFAULT)
    with pytest.raises(ortagent.OrtError):
        ortagent.create_and_register_allocator_v2("NoSuchExecutionProvider", info, {}, None)
    with pytest.raises(ortagent.OrtInvalidType):
        ortagent.create_and_register_allocator("Cpu", None)



@pytest.mark.parametrize("provider", ["CUDAExecutionProvider", "TensorrtExecutionProvider"])
def test_register_allocator_v2_provider_that_cannot_load(provider):
    """A provider the build lists but whose library cannot load here: onnxruntime's C call
    aborts the process (its Python module raises a RuntimeError); ortagent raises OrtFail, a
    RuntimeError, and the process lives on. Run in a fresh process, as an abort would kill pytest."""
    from conftest import cuda_unavailable_reason
    if provider not in ortagent.get_available_providers():
        pytest.skip(f"{provider} is not in this onnxruntime build")
    if provider == "CUDAExecutionProvider" and cuda_unavailable_reason() is None:
        pytest.skip("the CUDA provider loads here: its allocator is registered (tests/test_device.py)")
    script = textwrap.dedent(f"""
        import ortagent
        info = ortagent.OrtMemoryInfo("Cuda", ortagent.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                      ortagent.OrtMemType.DEFAULT)
        try:
            ortagent.create_and_register_allocator_v2({provider!r}, info, {{}}, ortagent.OrtArenaCfg(0, -1, -1, -1))
        except ortagent.OrtFail as exc:
            assert isinstance(exc, RuntimeError) and "cannot create an allocator" in str(exc), exc
            print("refused")
        else:
            print("registered")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    if done.stdout.strip() == "registered":
        pytest.skip(f"{provider} loads here")
    assert done.stdout.strip() == "refused"


def test_run_returns_outputs_independent_of_the_feeds(ort_ref):
    """A graph input that is also a graph output (and an Identity of it): run() returns arrays of
    their own in both modules, so a caller reusing its feed buffer changes no earlier result."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["z"]), helper.make_node("Neg", ["x"], ["n"])], "g",
                              [_tensor("x", T.FLOAT, [2, 2])],
                              [_tensor("n", T.FLOAT, [2, 2]), _tensor("x", T.FLOAT, [2, 2]), _tensor("z", T.FLOAT, [2, 2])])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 18)])
    options = {}
    for module in (ort_ref, ortagent):
        options[module] = module.SessionOptions()
        options[module].graph_optimization_level = module.GraphOptimizationLevel.ORT_DISABLE_ALL
    theirs = ort_ref.InferenceSession(model.SerializeToString(), options[ort_ref], providers=[CPU])
    ours = ortagent.InferenceSession(model.SerializeToString(), options[ortagent], providers=[CPU])
    kept = {ort_ref: [], ortagent: []}
    buffer = np.zeros((2, 2), np.float32)
    for step in range(4):
        for session, module in ((theirs, ort_ref), (ours, ortagent)):
            buffer[...] = step
            outputs = session.run(None, {"x": buffer})
            assert [np.shares_memory(out, buffer) for out in outputs] == [False] * 3, module.__name__
            kept[module].append(outputs)
    buffer[...] = 99.0
    for step in range(4):
        _same(kept[ortagent][step], kept[ort_ref][step])
        np.testing.assert_array_equal(kept[ortagent][step][1], np.full((2, 2), step, np.float32))

def sequence_length_model(elem=T.FLOAT):
    return _model([helper.make_node("SequenceLength", ["s"], ["n"])],
                  [helper.make_tensor_sequence_value_info("s", elem, None)], [_tensor("n", T.INT64, [])])


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64])
def test_empty_sequence_input(ort_ref, elem):
    theirs, ours = _both(ort_ref, sequence_length_model(elem))
    _same(ours.run(None, {"s": []}), theirs.run(None, {"s": []}))
    _same(ours.run(None, {"s": []}), ours.run(None, {"s": []}))          # the maker is reused


@pytest.mark.parametrize("key", [T.INT64, T.STRING])
def test_sequence_of_maps_input(ort_ref, key):
    """A graph input of seq(map(...)) handed straight to its output: ortagent feeds lists of dicts,
    empty ones too (made by ZipMap); onnxruntime's module refuses to feed any sequence of maps."""
    kind = helper.make_sequence_type_proto(helper.make_map_type_proto(key, _tensor_type(T.FLOAT)))
    model = _model([], [_typed("s", kind)], [_typed("s", kind)])
    theirs, ours = _both(ort_ref, model)
    assert ours.get_inputs()[0].type == theirs.get_inputs()[0].type
    maps = [{1: 2.0, 3: 4.5}, {5: -1.0}] if key == T.INT64 else [{"a": 2.0}, {"b": -1.0, "c": 0.5}]
    assert ours.run(None, {"s": maps}) == [maps]
    for _ in range(2):                                   # the second time, the maker is reused
        (result,) = ours.run(None, {"s": []})
        assert result == []
    (value,) = ours.run_with_ort_values(None, {"s": []})
    assert value.data_type() == theirs.get_inputs()[0].type
    with pytest.raises(RuntimeError, match="tensor type 0 is not supported"):
        theirs.run(None, {"s": maps})


def test_optional_input_without_a_value(ort_ref):
    """None for an input of an optional type means "no element", as does leaving it out, in both
    modules; an OrtValue without a value (an optional a model output) means the same to run().
    (ortagent leaves the input out of Run: onnxruntime's C Run crashes on the empty value itself.)"""
    theirs, ours = _both(ort_ref, optional_input_model())
    for feeds in ({"o": None}, {}, {"o": np.ones(2, np.float32)}):
        _same(ours.run(None, feeds), theirs.run(None, feeds))
        _same(ours.run([], feeds), theirs.run([], feeds))
    assert ours.run(None, {"o": None})[0].tolist() is False
    (empty, _) = ortagent.InferenceSession(optional_output_model(True).SerializeToString()).run_with_ort_values(
        None, {"x": np.ones(2, np.float32)})
    assert not empty.has_value()
    assert ours.run(None, {"o": empty})[0].tolist() is False
    assert ours.run_with_ort_values(None, {"o": empty})[0].numpy().tolist() is False
    # an IoBinding cannot leave a bound input out: it refuses the empty value, and an unbound
    # optional input means no element there too
    binding = ours.io_binding()
    with pytest.raises(ortagent.OrtNotImplemented, match="without a value"):
        binding.bind_ortvalue_input("o", empty)
    binding.bind_output("h")
    ours.run_with_iobinding(binding)
    their_binding = theirs.io_binding()
    their_binding.bind_output("h")
    theirs.run_with_iobinding(their_binding)
    _same(binding.copy_outputs_to_cpu(), their_binding.copy_outputs_to_cpu())


def test_optional_input_next_to_a_required_one(ort_ref):
    """Only inputs of an optional type may be left out: onnxruntime's error names the others."""
    opt = _typed("o", helper.make_optional_type_proto(_tensor_type(T.FLOAT, [2])))
    model = _model([helper.make_node("OptionalHasElement", ["o"], ["h"]), helper.make_node("Identity", ["x"], ["y"])],
                   [_tensor("x", T.FLOAT, [2]), opt], [_tensor("h", T.BOOL, []), _tensor("y", T.FLOAT, [2])])
    theirs, ours = _both(ort_ref, model)
    x = np.arange(2, dtype=np.float32)
    for feeds in ({"x": x}, {"x": x, "o": None}, {"x": x, "o": x + 1}):
        _same(ours.run(None, feeds), theirs.run(None, feeds))
    for feeds in ({"o": None}, {"o": x}, {}):
        with pytest.raises(Exception) as their_error:
            theirs.run(None, feeds)
        with pytest.raises(ortagent.OrtInvalidArgument) as our_error:
            ours.run(None, feeds)
        assert str(our_error.value) == str(their_error.value)
        assert isinstance(our_error.value, type(their_error.value).__mro__[-2])


def test_provider_graph_assignment(ort_ref):
    model = _model([helper.make_node("Add", ["x", "y"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["z"], name="relu"),
                    helper.make_node("Neg", ["x"], ["n"], name="neg")],
                   [_tensor("x", T.FLOAT, [None]), _tensor("y", T.FLOAT, [None])],
                   [_tensor("z", T.FLOAT, [None]), _tensor("n", T.FLOAT, [None])])
    found = []
    for module in (ort_ref, ortagent):
        options = module.SessionOptions()
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        session = module.InferenceSession(model.SerializeToString(), options, providers=[CPU])
        found.append(sorted((g.ep_name, n.name, n.domain, n.op_type)
                            for g in session.get_provider_graph_assignment_info() for n in g.get_nodes()))
    assert found[1] == found[0] and found[0]
    their_session, our_session = _both(ort_ref, model)
    their_error, our_error = _raises_alike(their_session.get_provider_graph_assignment_info,
                                           our_session.get_provider_graph_assignment_info)
    assert "session.record_ep_graph_assignment_info" in str(our_error)


def _model_with_ort_config(config):
    model = add_model()
    entry = model.metadata_props.add()
    entry.key = "ort_config"
    import json
    entry.value = json.dumps({"session_options": config})
    return model


_CONFIG_ATTRIBUTES = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "graph_optimization_level",
                      "enable_profiling")


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_session_options_from_the_model(ort_ref, how, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)                # profiling writes its file here
    model = _model_with_ort_config({"intra_op_num_threads": 2, "inter_op_num_threads": 5, "execution_mode": 1,
                                    "graph_optimization_level": 1, "enable_profiling": 1})
    # onnxruntime 1.31 honours the environment variable (its keyword had no effect when tried);
    # ortagent honours both
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    feeds = {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)}
    given = {module: module.SessionOptions() for module in (ort_ref, ortagent)}
    theirs = ort_ref.InferenceSession(model.SerializeToString(), given[ort_ref], providers=[CPU])
    if how == "keyword":
        monkeypatch.delenv("ORT_LOAD_CONFIG_FROM_MODEL")
        ours = ortagent.InferenceSession(model.SerializeToString(), given[ortagent], read_config_from_model=1)
    else:
        ours = ortagent.InferenceSession(model.SerializeToString(), given[ortagent])
    for name in _CONFIG_ATTRIBUTES:
        assert int(getattr(ours.get_session_options(), name)) == int(getattr(theirs.get_session_options(), name)), name
    assert ours.get_session_options().intra_op_num_threads == 2
    assert given[ortagent].intra_op_num_threads == 0          # the caller's options are not changed
    _same(ours.run(None, feeds), theirs.run(None, feeds))
    ours.end_profiling()
    theirs.end_profiling()


def test_ep_dynamic_options(ort_ref):
    theirs, ours = _both(ort_ref, add_model())
    options = {"ep.dynamic.workload_type": "Efficient"}
    try:
        theirs.set_ep_dynamic_options(options)
    except Exception as exc:                    # the CPU provider may refuse: then both refuse
        with pytest.raises(ortagent.OrtError) as ours_error:
            ours.set_ep_dynamic_options(options)
        bases = [b for b in type(exc).__mro__ if b.__module__ == "builtins" and b is not object]
        assert isinstance(ours_error.value, bases[0])
    else:
        assert ours.set_ep_dynamic_options(options) is None
    with pytest.raises(ortagent.OrtInvalidType):
        ours.set_ep_dynamic_options([("a", "b")])


def test_container_runs_release_what_they_make(ort_ref):
    """Sequence, map and list feeds and outputs leave no ORT handle behind (after a warm-up run
    that creates the cached SequenceEmpty maker)."""
    import gc

    cases = [(sequence_input_model(), {"s": [np.ones(2, np.float32), np.zeros(1, np.float32)]}),
             (sequence_length_model(), {"s": []}),
             (dict_vectorizer_model(), {"m": {1: 2.0, 5: 3.5}}),
             (zipmap_model(True), {"x": np.ones((2, 2), np.float32)}),
             (add_model(), {"x": [1.0, 2.0], "y": (3.0, 4.0)}),
             (optional_output_model(True), {"x": np.ones(2, np.float32)})]
    sessions = [(ortagent.InferenceSession(m.SerializeToString()), feeds) for m, feeds in cases]
    for session, feeds in sessions:
        session.run(None, feeds)
    gc.collect()
    before = ortagent.live_handles()
    for _ in range(3):
        for session, feeds in sessions:
            session.run(None, feeds)
            session.run_with_ort_values(None, feeds)
        with pytest.raises(ortagent.OrtInvalidArgument):
            sessions[0][0].run(None, {"s": [np.ones(2, np.int64)]})
    gc.collect()
    assert ortagent.live_handles() == before


def test_copy_tensors(ort_ref):
    """onnxruntime's CopyTensors has no CPU-to-CPU data transfer: both modules refuse alike (the
    device directions need a GPU and run in tests/test_device.py's CUDA tests)."""
    def pair(module):
        return ([module.OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32))],
                [module.OrtValue.ortvalue_from_numpy(np.zeros(6, np.float32))])
    their_error, our_error = _raises_alike(lambda: ort_ref.copy_tensors(*pair(ort_ref)),
                                           lambda: ortagent.copy_tensors(*pair(ortagent)))
    assert str(our_error) == str(their_error)
    with pytest.raises(ortagent.OrtInvalidArgument, match="shape"):
        ortagent.copy_tensors([ortagent.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))],
                              [ortagent.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))])
    with pytest.raises(ortagent.OrtNotImplemented, match="stream"):
        ortagent.copy_tensors(*pair(ortagent), stream=object())


def test_deterministic_compute(ort_ref):
    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.ones(3, np.float32)}
    results = []
    for module in (ort_ref, ortagent):
        options = module.SessionOptions()
        assert options.use_deterministic_compute is False
        options.use_deterministic_compute = True
        assert options.use_deterministic_compute is True
        results.append(module.InferenceSession(add_model().SerializeToString(), options,
                                               providers=[CPU]).run(None, feeds))
    _same(results[1], results[0])


# ---- execution-provider devices (OrtApi 1.22+) --------------------------------------------------------

def _device_record(device):
    hardware = device.device
    return (device.ep_name, device.ep_vendor, device.ep_metadata, device.ep_options,
            int(hardware.type), hardware.type.name, hardware.vendor_id, hardware.vendor,
            hardware.device_id, hardware.metadata)


def test_ep_devices_match(ort_ref):
    theirs, ours = ort_ref.get_ep_devices(), ortagent.get_ep_devices()
    assert [_device_record(d) for d in ours] == [_device_record(d) for d in theirs]
    assert all(isinstance(d, ortagent.OrtEpDevice) and isinstance(d.device, ortagent.OrtHardwareDevice)
               for d in ours)
    assert all(type(v) is str for d in ours for v in [*d.ep_metadata.values(), *d.device.metadata.values()])
    # one object per device, as onnxruntime's module gives
    assert [a is b for a, b in zip(ours, ortagent.get_ep_devices())] == \
        [a is b for a, b in zip(theirs, ort_ref.get_ep_devices())]


def test_ep_device_enums(ort_ref):
    for name in ("OrtHardwareDeviceType", "OrtExecutionProviderDevicePolicy", "OrtDeviceVendorId",
                 "OrtCompileApiFlags"):
        theirs, ours = getattr(ort_ref, name), getattr(ortagent, name)
        assert {k: int(v) for k, v in ours.__members__.items()} == \
            {k: int(v) for k, v in theirs.__members__.items()}, name


@pytest.mark.parametrize("memory_type", ["DEFAULT", "HOST_ACCESSIBLE"])
def test_ep_device_memory_info(ort_ref, memory_type):
    for theirs, ours in zip(ort_ref.get_ep_devices(), ortagent.get_ep_devices()):
        their_info = theirs.memory_info(getattr(ort_ref.OrtDeviceMemoryType, memory_type))
        our_info = ours.memory_info(getattr(ortagent.OrtDeviceMemoryType, memory_type))
        if their_info is None:
            assert our_info is None
        else:
            assert (our_info.name, our_info.device_id, int(our_info.device_mem_type)) == \
                (their_info.name, their_info.device_id, int(their_info.device_mem_type))


def test_cpu_ep_device_has_no_sync_stream(ort_ref):
    """The CPU device uses CPU memory: onnxruntime's module refuses it a stream, with these words."""
    theirs = next(d for d in ort_ref.get_ep_devices() if d.ep_name == CPU)
    ours = next(d for d in ortagent.get_ep_devices() if d.ep_name == CPU)
    their_error, our_error = _raises_alike(theirs.create_sync_stream, ours.create_sync_stream)
    assert isinstance(our_error, (ortagent.OrtFail, RuntimeError))
    assert str(our_error) == str(their_error)
    assert ortagent.live_handles()["sync_stream"] == 0


def _run_both(theirs, ours):
    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.full(3, 2.0, np.float32)}
    _same(ours.run(None, feeds), theirs.run(None, feeds))


def test_session_for_devices(ort_ref):
    data = add_model().SerializeToString()
    sessions = []
    for module in (ort_ref, ortagent):
        options = module.SessionOptions()
        assert options.has_providers() is False
        options.add_provider_for_devices([d for d in module.get_ep_devices() if d.ep_name == CPU], {})
        assert options.has_providers() is True
        sessions.append(module.InferenceSession(data, options))
    theirs, ours = sessions
    assert ours.get_providers() == theirs.get_providers()
    _run_both(theirs, ours)
    assert [_device_record(d) for d in ours.get_input_epdevices()] == \
        [_device_record(d) for d in theirs.get_input_epdevices()]


@pytest.mark.parametrize("policy", ["DEFAULT", "PREFER_CPU", "PREFER_GPU", "PREFER_NPU", "MAX_PERFORMANCE",
                                    "MAX_EFFICIENCY", "MIN_OVERALL_POWER"])
def test_session_with_selection_policy(ort_ref, policy):
    data = add_model().SerializeToString()
    sessions = []
    for module in (ort_ref, ortagent):
        options = module.SessionOptions()
        options.set_provider_selection_policy(getattr(module.OrtExecutionProviderDevicePolicy, policy))
        assert options.has_providers() is True
        sessions.append(module.InferenceSession(data, options))
    theirs, ours = sessions
    assert ours.get_providers() == theirs.get_providers()
    _run_both(theirs, ours)


def test_input_epdevices_of_a_plain_session(ort_ref):
    theirs, ours = _both(ort_ref, add_model())
    assert [d and _device_record(d) for d in ours.get_input_epdevices()] == \
        [d and _device_record(d) for d in theirs.get_input_epdevices()]


def test_provider_options_for_devices_refused_alike(ort_ref):
    """No devices: onnxruntime's C API refuses, with the same words through both modules."""
    their_error, our_error = _raises_alike(lambda: ort_ref.SessionOptions().add_provider_for_devices([], {}),
                                           lambda: ortagent.SessionOptions().add_provider_for_devices([], {}))
    assert str(our_error) in str(their_error)
    assert isinstance(our_error, ortagent.OrtInvalidArgument)


def test_provider_library_errors_alike(ort_ref, tmp_path):
    missing = str(tmp_path / "no_such_ep.so")
    their_error, our_error = _raises_alike(
        lambda: ort_ref.register_execution_provider_library("no_such_ep", missing),
        lambda: ortagent.register_execution_provider_library("no_such_ep", missing))
    assert isinstance(our_error, ortagent.OrtFail) and str(our_error) in str(their_error)
    their_error, our_error = _raises_alike(
        lambda: ort_ref.unregister_execution_provider_library("never_registered"),
        lambda: ortagent.unregister_execution_provider_library("never_registered"))
    assert isinstance(our_error, ortagent.OrtFail) and str(our_error) in str(their_error)
    # the environment's devices are untouched
    assert [_device_record(d) for d in ortagent.get_ep_devices()] == \
        [_device_record(d) for d in ort_ref.get_ep_devices()]


@pytest.mark.parametrize("args", [
    ("Cpu", "CPU", 0, 0, "DEFAULT", 0, "ORT_DEVICE_ALLOCATOR"),
    ("Foo", "GPU", 0x10DE, 1, "HOST_ACCESSIBLE", 64, "ORT_ARENA_ALLOCATOR"),
    ("Npu", "NPU", 7, 2, "DEFAULT", 0, "ORT_DEVICE_ALLOCATOR"),
    ("", "FPGA", 0, -1, "DEFAULT", 0, "INVALID"),
])
def test_memory_info_create_v2(ort_ref, args):
    name, device_type, vendor, device, memory, alignment, allocator = args
    infos = []
    for module in (ort_ref, ortagent):
        infos.append(module.OrtMemoryInfo.create_v2(
            name, getattr(module.OrtMemoryInfoDeviceType, device_type), vendor, device,
            getattr(module.OrtDeviceMemoryType, memory), alignment, getattr(module.OrtAllocatorType, allocator)))
    theirs, ours = infos
    assert isinstance(ours, ortagent.OrtMemoryInfo)
    assert (ours.name, ours.device_id, int(ours.mem_type), int(ours.allocator_type), int(ours.device_mem_type),
            ours.device_vendor_id) == \
        (theirs.name, theirs.device_id, int(theirs.mem_type), int(theirs.allocator_type),
         int(theirs.device_mem_type), theirs.device_vendor_id)


# ---- model compilation (OrtCompileApi) -----------------------------------------------------------------

def _compiled_outputs(module, model_bytes):
    session = module.InferenceSession(model_bytes, providers=[CPU])
    feeds = {"x": np.arange(3, dtype=np.float32), "y": np.full(3, 2.0, np.float32)}
    return session.run(None, feeds)


@pytest.mark.parametrize("output", ["file", "bytes", "stream"])
@pytest.mark.parametrize("source", ["path", "bytes"])
def test_model_compiler_matches(ort_ref, tmp_path, output, source):
    """Compiling for the CPU provider gives a model that loads and computes what onnxruntime's
    compiled model computes (the same bytes, as both call the same runtime)."""
    path = tmp_path / "model.onnx"
    onnx.save(add_model(), str(path))
    results = []
    for module in (ort_ref, ortagent):
        source_arg = str(path) if source == "path" else path.read_bytes()
        compiler = module.ModelCompiler(module.SessionOptions(), source_arg)
        if output == "file":
            target = tmp_path / f"{module.__name__}_out.onnx"
            assert compiler.compile_to_file(str(target)) is None
            compiled = target.read_bytes()
        elif output == "bytes":
            compiled = compiler.compile_to_bytes()
        else:
            pieces = []
            assert compiler.compile_to_stream(pieces.append) is None
            compiled = b"".join(pieces)
        assert isinstance(compiled, bytes) and compiled
        results.append(compiled)
    theirs, ours = results
    assert ours == theirs
    _same(_compiled_outputs(ortagent, ours), _compiled_outputs(ort_ref, theirs))
    assert ortagent.live_handles()["compile_options"] == 0


def test_model_compiler_with_devices_and_settings(ort_ref, tmp_path):
    data = add_model().SerializeToString()
    results = []
    for module in (ort_ref, ortagent):
        options = module.SessionOptions()
        options.add_provider_for_devices([d for d in module.get_ep_devices() if d.ep_name == CPU], {})
        compiler = module.ModelCompiler(options, data, embed_compiled_data_into_model=True,
                                        graph_optimization_level=module.GraphOptimizationLevel.ORT_ENABLE_ALL)
        results.append(compiler.compile_to_bytes())
    assert results[1] == results[0]


@pytest.mark.parametrize("case", ["no-nodes-compiled", "output-exists", "missing-input", "not-a-model",
                                  "bytes-without-output"])
def test_model_compiler_errors_alike(ort_ref, tmp_path, case):
    path = tmp_path / "model.onnx"
    onnx.save(add_model(), str(path))
    existing = tmp_path / "exists.onnx"
    existing.write_bytes(b"x")

    def call(module):
        options = module.SessionOptions()
        flags = module.OrtCompileApiFlags
        if case == "no-nodes-compiled":
            return module.ModelCompiler(options, str(path), flags=flags.ERROR_IF_NO_NODES_COMPILED).compile_to_bytes()
        if case == "output-exists":
            return module.ModelCompiler(options, str(path), flags=flags.ERROR_IF_OUTPUT_FILE_EXISTS
                                        ).compile_to_file(str(existing))
        if case == "missing-input":
            return module.ModelCompiler(options, str(tmp_path / "nope.onnx")).compile_to_bytes()
        if case == "not-a-model":
            return module.ModelCompiler(options, b"not a model").compile_to_bytes()
        return module.ModelCompiler(options, path.read_bytes()).compile_to_file(str(tmp_path / "dir" / "x.onnx"))

    their_error, our_error = _raises_alike(lambda: call(ort_ref), lambda: call(ortagent))
    assert str(our_error) in str(their_error)
    expected = {"no-nodes-compiled": ortagent.OrtFail, "output-exists": ortagent.OrtFail,
                "missing-input": ortagent.OrtInvalidArgument, "not-a-model": ortagent.OrtInvalidProtobuf,
                "bytes-without-output": ortagent.OrtInvalidArgument}[case]
    assert isinstance(our_error, expected)
    assert ortagent.live_handles()["compile_options"] == 0


@pytest.mark.parametrize("source, message", [(b"", "Input model bytes array is empty"),
                                             ("", "Input model path is empty")])
def test_model_compiler_empty_input_alike(ort_ref, source, message):
    their_error, our_error = _raises_alike(lambda: ort_ref.ModelCompiler(ort_ref.SessionOptions(), source),
                                           lambda: ortagent.ModelCompiler(ortagent.SessionOptions(), source))
    assert str(our_error) == str(their_error) == message
    assert isinstance(our_error, ValueError) and isinstance(their_error, ValueError)


def test_model_compiler_stream_error_alike(ort_ref):
    data = add_model().SerializeToString()

    def failing(_):
        raise OSError("disk full")

    their_error, our_error = _raises_alike(
        lambda: ort_ref.ModelCompiler(ort_ref.SessionOptions(), data).compile_to_stream(failing),
        lambda: ortagent.ModelCompiler(ortagent.SessionOptions(), data).compile_to_stream(failing))
    assert "OSError: disk full" in str(their_error) and "OSError: disk full" in str(our_error)
    assert isinstance(our_error, ortagent.OrtFail) and isinstance(our_error.__cause__, OSError)


# ---- LoRA adapter files: AdapterFormat -------------------------------------------------------------

def adapter_model():
    """Outputs computed from four initializers a LoRA adapter may replace (they are also inputs):
    y = x * a + b (float32), n = c + 1 (int64), h = Cast(d) (float16 -> float32)."""
    inits = [numpy_helper.from_array(np.ones((2, 3), np.float32), "a"),
             numpy_helper.from_array(np.zeros(3, np.float32), "b"),
             numpy_helper.from_array(np.zeros(4, np.int64), "c"),
             numpy_helper.from_array(np.zeros((2, 2), np.float16), "d")]
    one = numpy_helper.from_array(np.ones(1, np.int64), "one")
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"]), helper.make_node("Add", ["xa", "b"], ["y"]),
             helper.make_node("Add", ["c", "one"], ["n"]), helper.make_node("Cast", ["d"], ["h"], to=T.FLOAT)]
    inputs = [_tensor("x", T.FLOAT, [2, 3]), _tensor("a", T.FLOAT, [2, 3]), _tensor("b", T.FLOAT, [3]),
              _tensor("c", T.INT64, [4]), _tensor("d", T.FLOAT16, [2, 2])]
    return _model(nodes, inputs, [_tensor("y", T.FLOAT, [2, 3]), _tensor("n", T.INT64, [4]),
                                  _tensor("h", T.FLOAT, [2, 2])], initializers=[*inits, one])


def adapter_parameters():
    rng = np.random.default_rng(25)
    return {"a": rng.standard_normal((2, 3)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32),
            "c": rng.integers(-50, 50, size=4).astype(np.int64),
            "d": rng.standard_normal((2, 2)).astype(np.float16)}


def _write_adapter(module, path, params, adapter_version=3, model_version=-7):
    writer = module.AdapterFormat()
    writer.set_adapter_version(adapter_version)
    writer.set_model_version(model_version)
    writer.set_parameters({name: module.OrtValue.ortvalue_from_numpy(array) for name, array in params.items()})
    writer.export_adapter(str(path))


def _runs_with_adapter(module, path):
    """The adapter model's outputs without and with the adapter file at `path`, in `module`."""
    session = module.InferenceSession(adapter_model().SerializeToString(), providers=[CPU])
    adapter = module.LoraAdapter()
    adapter.Load(str(path))
    run_options = module.RunOptions()
    run_options.add_active_adapter(adapter)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    return session.run(None, {"x": x}), session.run(None, {"x": x}, run_options)


def _expected_outputs(params):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    return [x * params["a"] + params["b"], params["c"] + 1, params["d"].astype(np.float32)]


def _check_read(reader, params, adapter_version=3, model_version=-7):
    assert reader.get_format_version() == 1
    assert reader.get_adapter_version() == adapter_version and reader.get_model_version() == model_version
    read = reader.get_parameters()
    assert sorted(read) == sorted(params)
    for name, array in params.items():
        value = read[name]
        assert value.is_tensor() and value.shape() == list(array.shape)
        _same(value.numpy(), array)


@pytest.mark.parametrize("writer_name", ["ortagent", "onnxruntime"])
def test_adapter_files_cross_both_ways(ort_ref, tmp_path, writer_name, no_leaks):
    """An adapter written by either module is read back by both AdapterFormat.read_adapter, and
    both modules' LoraAdapter run a model with it to the same outputs (the adapter's tensors in
    place of the model's initializers)."""
    writer = ortagent if writer_name == "ortagent" else ort_ref
    params = adapter_parameters()
    path = tmp_path / "written.onnx_adapter"
    _write_adapter(writer, path, params)
    for module in (ort_ref, ortagent):
        _check_read(module.AdapterFormat.read_adapter(str(path)), params)
    (their_plain, their_lora), (our_plain, our_lora) = (_runs_with_adapter(m, path) for m in (ort_ref, ortagent))
    _same(our_plain, their_plain)
    _same(our_lora, their_lora)
    for ours, expected in zip(our_lora, _expected_outputs(params)):
        np.testing.assert_allclose(ours, expected, rtol=1e-6)
    gc.collect()


def test_adapter_file_layout(ort_ref, tmp_path):
    """ortagent's file starts each parameter's bytes 8-aligned (onnxruntime makes its tensors over
    the file's bytes), carries the identifier onnxruntime checks, and reads like onnxruntime's own
    for every element type onnxruntime loads."""
    import ml_dtypes

    params = {"f64": np.arange(3, dtype=np.float64) + 0.25, "u8": np.arange(5, dtype=np.uint8),
              "i8": -np.arange(3, dtype=np.int8), "u16": np.arange(7, dtype=np.uint16),
              "i16": np.arange(2, dtype=np.int16), "i32": np.arange(3, dtype=np.int32) * 1000,
              "u32": np.arange(9, dtype=np.uint32), "u64": np.arange(2, dtype=np.uint64) + 2**40,
              "bf16": np.arange(3).astype(ml_dtypes.bfloat16), "f8": np.arange(3).astype(ml_dtypes.float8_e4m3fn),
              "empty": np.zeros((0, 3), np.float32)}
    paths = {name: tmp_path / f"{name}.onnx_adapter" for name in ("ortagent", "onnxruntime")}
    _write_adapter(ortagent, paths["ortagent"], params, 11, 12)
    theirs = ort_ref.AdapterFormat()
    theirs.set_adapter_version(11)
    theirs.set_model_version(12)
    theirs.set_parameters({name: ort_ref.OrtValue.ortvalue_from_numpy_with_onnx_type(
        array.view(f"u{array.itemsize}") if array.dtype.kind == "V" or array.dtype.name in ("bfloat16", "float8_e4m3fn")
        else array, ortagent.OrtValue.ortvalue_from_numpy(array).element_type()) for name, array in params.items()})
    theirs.export_adapter(str(paths["onnxruntime"]))
    data = paths["ortagent"].read_bytes()
    assert data[4:8] == b"TORT"
    for name, array in params.items():
        if array.nbytes >= 8:
            assert data.find(array.tobytes()) % 8 == 0, name
    for path in paths.values():
        for module in (ort_ref, ortagent):
            reader = module.AdapterFormat.read_adapter(str(path))
            assert (reader.get_adapter_version(), reader.get_model_version()) == (11, 12)
            read = reader.get_parameters()
            assert sorted(read) == sorted(params)
            for name, array in params.items():
                assert read[name].element_type() == ortagent.OrtValue.ortvalue_from_numpy(array).element_type()
                assert read[name].shape() == list(array.shape)
                if module is ortagent:
                    _same(read[name].numpy(), array)
    # ortagent's read values view the file's bytes: read-only
    value = ortagent.AdapterFormat.read_adapter(str(paths["ortagent"])).get_parameters()["f64"]
    with pytest.raises(ortagent.OrtInvalidArgument, match="read-only"):
        value.update_inplace(np.zeros(3))


def test_adapter_format_defaults_and_versions(ort_ref, tmp_path):
    theirs, ours = ort_ref.AdapterFormat(), ortagent.AdapterFormat()
    for getter in ("get_format_version", "get_adapter_version", "get_model_version"):
        assert getattr(ours, getter)() == getattr(theirs, getter)()
    assert ours.get_parameters() == theirs.get_parameters() == {}
    for version in (True, np.int64(4), -(2**31), 2**31 - 1):
        theirs.set_adapter_version(version)
        ours.set_adapter_version(version)
        assert ours.get_adapter_version() == theirs.get_adapter_version()
    for bad in ("1", 1.5, 2**31, None):
        _raises_alike(lambda: theirs.set_model_version(bad), lambda: ours.set_model_version(bad))
    # a writer with nothing set makes a file both read as empty
    path = tmp_path / "empty.onnx_adapter"
    ortagent.AdapterFormat().export_adapter(path)        # a path object too (onnxruntime takes str only)
    for module in (ort_ref, ortagent):
        reader = module.AdapterFormat.read_adapter(str(path))
        assert (reader.get_format_version(), reader.get_adapter_version(), reader.get_model_version(),
                reader.get_parameters()) == (1, 0, 0, {})


@pytest.mark.parametrize("content", ["junk", "empty", "truncated", "bool-parameter"])
def test_adapter_read_refusals_alike(ort_ref, tmp_path, content, no_leaks):
    """Files onnxruntime refuses are refused with its words (its loader checks them for both)."""
    path = tmp_path / "bad.onnx_adapter"
    if content in ("truncated", "bool-parameter"):
        params = adapter_parameters() if content == "truncated" else {"flags": np.ones(3, np.bool_)}
        _write_adapter(ortagent, path, params)
        if content == "truncated":
            path.write_bytes(path.read_bytes()[:150])
    else:
        path.write_bytes(b"x" * 100 if content == "junk" else b"")
    their_error, our_error = _raises_alike(lambda: ort_ref.AdapterFormat.read_adapter(str(path)),
                                           lambda: ortagent.AdapterFormat.read_adapter(str(path)))
    assert isinstance(their_error, RuntimeError) and isinstance(our_error, ortagent.OrtFail)
    assert str(our_error) == str(their_error)
    with pytest.raises(ortagent.OrtFail) as loaded:
        ortagent.LoraAdapter().Load(str(path))
    assert str(loaded.value) == str(their_error)
    gc.collect()


def test_adapter_writer_refusals(ort_ref, tmp_path):
    """What an adapter file cannot hold is refused when it is given or written (onnxruntime's
    writer lets a nameless parameter through, which its loader then refuses)."""
    writer = ortagent.AdapterFormat()
    path = str(tmp_path / "out.onnx_adapter")
    with pytest.raises(ortagent.OrtInvalidType, match="must be an ortagent.OrtValue, got ndarray"):
        writer.set_parameters({"w": np.ones(2)})            # onnxruntime: AttributeError
    with pytest.raises(ortagent.OrtInvalidType, match="dict of names to OrtValues"):
        writer.set_parameters([("w", ortagent.OrtValue.ortvalue_from_numpy(np.ones(2)))])
    writer.set_parameters({"": ortagent.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))})
    with pytest.raises(ortagent.OrtInvalidArgument, match="needs a name"):
        writer.export_adapter(path)
    # string tensors: refused by both writers, with the same words
    (strings,) = ort_ref.InferenceSession(nul_constant_model().SerializeToString(),
                                          providers=[CPU]).run_with_ort_values(None, {})
    their_writer = ort_ref.AdapterFormat()
    their_writer.set_parameters({"s": strings})
    writer.set_parameters({"s": ortagent.OrtValue.ortvalue_from_numpy(np.array(["a", "b"], dtype=object))})
    their_error, our_error = _raises_alike(lambda: their_writer.export_adapter(path),
                                           lambda: writer.export_adapter(path))
    assert isinstance(our_error, ortagent.OrtFail) and str(their_error).rstrip().endswith(str(our_error))
    writer.set_parameters({7: ortagent.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))})
    writer.export_adapter(path)                              # str() of the key, as onnxruntime
    assert list(ort_ref.AdapterFormat.read_adapter(path).get_parameters()) == ["7"]
    their_error, our_error = _raises_alike(
        lambda: ort_ref.AdapterFormat().export_adapter(str(tmp_path / "no" / "dir")),
        lambda: ortagent.AdapterFormat().export_adapter(str(tmp_path / "no" / "dir")))
    assert "Failed to open file:" in str(their_error) and "Failed to open file:" in str(our_error)
    with pytest.raises(ortagent.OrtNoSuchFile):
        ortagent.AdapterFormat.read_adapter(str(tmp_path / "missing.onnx_adapter"))


# ---- dicts fed for maps: onnxruntime's conversion rules -------------------------------------------

class _OnlyIndex:
    def __index__(self):
        return 2


class _OnlyInt:
    def __int__(self):
        return 1


class _BadFloat:
    def __float__(self):
        return "x"


MAP_FEEDS = [
    {1: 25.0, 2: 5.13}, {True: 1.0, 2: 2.0}, {np.int32(1): 1.0}, {np.int64(5): np.float32(2.5)}, {_OnlyIndex(): 1.0},
    {-1: 1.0}, {-(2**63): 1.0}, {2**63 - 1: 2.0}, {1: True}, {1: np.float16(1.5)}, {1: np.array(2.0)}, {1: 1e40},
    {1: 2**70}, {1: _OnlyIndex()}, {2: np.bool_(True)}, {5: np.int8(3)},
    {"a": 1.5, "c": 4.0}, {np.str_("a"): 1.0}, {"a": 1.0, 1: 2.0}, {"a": 1.0, 2.5: 2.0}, {"b": 1.0, True: 2.0},
    {"a": 1.0, b"b": 2.0},
    # refused: by the conversion (the same words), or by the run (a map of another type than the input's)
    {}, {1: 25.0, "a": 5.6}, {1.5: 1.0}, {np.float64(1.0): 1.0}, {np.uint64(2**63): 1.0}, {2**63: 1.0},
    {-(2**63) - 1: 1.0}, {np.bool_(True): 1.0}, {1: 1.0, _OnlyInt(): 2.0}, {b"a": 1.0}, {None: 1.0},
    {1: "x"}, {1: None}, {1: [1.0]}, {"a": b"x"}, {"a": "x"}, {1: 1 + 2j}, {1: 2.0, 2: 1 + 2j}, {1: 10**400},
    {1: np.array([1.0, 2.0])}, {1: _OnlyInt()}, {1: _BadFloat()},
]


@pytest.mark.parametrize("key", [T.INT64, T.STRING])
@pytest.mark.parametrize("feed", MAP_FEEDS, ids=[repr(f)[:40] for f in MAP_FEEDS])
def test_map_feeds_convert_as_onnxruntime(ort_ref, key, feed):
    """onnxruntime's module makes map(int64|string, tensor(float)) of a dict by its first key and
    converts each key and value by fixed rules; ortagent does the same: the same results, and the
    same refusals with the same words (a RuntimeError where onnxruntime raises one)."""
    theirs, ours = _both(ort_ref, dict_vectorizer_model(key, T.FLOAT))
    try:
        expected = theirs.run(None, {"m": feed})
    except Exception as their_error:
        with pytest.raises(ortagent.OrtError) as caught:
            ours.run(None, {"m": feed})
        assert str(caught.value) == str(their_error)
        if isinstance(their_error, RuntimeError):
            assert isinstance(caught.value, (ortagent.FeedConversionError, RuntimeError))
        return
    _same(ours.run(None, {"m": feed}), expected)


def test_map_feeds_of_types_onnxruntime_cannot_feed():
    """onnxruntime's module makes only float-valued maps, so it refuses every dict for a map of
    doubles or of int64 values; ortagent converts the values to the input's type when the keys
    are of the input's key type (and otherwise refuses the map as onnxruntime does, in the run)."""
    for key, value, feed, wrong, expected in [
            (T.INT64, T.DOUBLE, {1: 0.1, 5: np.float64(1e300)}, {"a": 1.0}, [0.1, 0.0, 1e300]),
            (T.STRING, T.INT64, {"b": 7, "a": np.int8(-3)}, {1: 1.0}, [-3, 7, 0])]:
        session = ortagent.InferenceSession(dict_vectorizer_model(key, value).SerializeToString())
        (result,) = session.run(None, {"m": feed})
        assert result.ravel().tolist() == expected
        with pytest.raises(ortagent.OrtInvalidArgument, match="Unexpected input data type"):
            session.run(None, {"m": wrong})


def test_map_refusals_are_runtime_errors(no_leaks):
    session = ortagent.InferenceSession(dict_vectorizer_model().SerializeToString())
    for feed, words in [({}, "Size of dictionary is empty"), ({1: 1.0, "a": 2.0}, "Unexpected key type  <class 'str'>"),
                        ({1: "x"}, "Unexpected value type  <class 'str'>"), ({b"k": 1.0}, "Key type must be int")]:
        with pytest.raises(ortagent.FeedConversionError, match=words) as caught:
            session.run(None, {"m": feed})
        assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ValueError)
    with pytest.raises(ortagent.FeedConversionError, match="must be real number, not complex") as caught:
        session.run(None, {"m": {1: 1 + 2j}})
    assert isinstance(caught.value.__cause__, TypeError)
    del session
    gc.collect()


# ---- strings holding NUL characters --------------------------------------------------------------

def nul_encoder_model():
    """A OneHotEncoder whose categories hold NUL characters (like the ML.NET encoder of
    onnxruntime's upstream test_run_model_mlnet): x (string [1, 3]) -> y (float [1, 3, 4])."""
    cats = [b"B\0B\0", b"x", b"C\0C\0", b"A\0A"]
    node = helper.make_node("OneHotEncoder", ["x"], ["y"], domain="ai.onnx.ml", cats_strings=cats, zeros=1)
    return _model([node], [_tensor("x", T.STRING, [1, 3])], [_tensor("y", T.FLOAT, [1, 3, 4])], ml=True)


def nul_constant_model():
    """Outputs a string constant whose items hold NULs (leading, inner, trailing, only NULs)."""
    tensor = onnx.TensorProto(name="k", data_type=T.STRING, dims=[5])
    tensor.string_data.extend([b"\0", b"\0\0", b"a\0", b"\0a", "p\0q\u00e9\0".encode()])
    return _model([helper.make_node("Constant", [], ["y"], value=tensor)], [], [_tensor("y", T.STRING, [5])])


@pytest.mark.parametrize("feed, matched", [
    # the upstream test's two feeds: np.void items keep every byte, so the 5-byte ones match nothing
    (np.array([b"A\0A\0", b"B\0B\0", b"C\0C\0"], np.void).reshape(1, 3), 2),
    (np.array([b"A\0A\0\0", b"B\0B\0\0", b"C\0C\0\0"], np.void).reshape(1, 3), 0),
    (np.array([["B\0B\0", "C\0C\0", "A\0A"]], dtype=object), 3),
    ([["A\0A", "x", "B\0B"]], 2),
])
def test_strings_with_nul_characters_feed_as_onnxruntime(ort_ref, feed, matched, no_leaks):
    theirs, ours = _both(ort_ref, nul_encoder_model())
    expected = theirs.run(None, {"x": feed})
    _same(ours.run(None, {"x": feed}), expected)
    assert expected[0].sum() == matched     # the categories matched item for item, NULs included
    del theirs, ours
    gc.collect()


@pytest.mark.parametrize("feed", [
    np.array(["a\0b", "\0", "", "c\0\0d", "\u00e9\0"], dtype=object),
    ["a\0b", "\0", "", "c\0\0d", "\u00e9\0"],
    np.array([b"a\0b", b"c\0d", b"e\0f"]).astype(np.void),
])
def test_strings_with_nul_characters_round_trip(ort_ref, feed):
    """Through an Identity and out again, item for item, as onnxruntime's module gives them."""
    theirs, ours = _both(ort_ref, string_model())
    _same(ours.run(None, {"x": feed}), theirs.run(None, {"x": feed}))
    _same(ours.run_with_ort_values(None, {"x": feed})[0].numpy(), theirs.run(None, {"x": feed})[0])


def test_strings_with_nul_characters_in_numpy_string_arrays(ort_ref):
    """'U' and 'S' arrays: ortagent feeds each item as NumPy holds it, NULs included; onnxruntime's
    module stops each at its first NUL (and runs NUL-less 'S' items into the next)."""
    session = ortagent.InferenceSession(string_model().SerializeToString())
    for feed in (np.array(["a\0b", "c"]), np.array([b"a\0b", b"c"])):
        (result,) = session.run(None, {"x": feed})
        expected = [item.decode() if isinstance(item, bytes) else item for item in feed.tolist()]
        assert result.tolist() == expected == ["a\0b", "c"]


def test_strings_with_nul_characters_read_from_onnxruntime(ort_ref):
    """Strings onnxruntime makes itself (a constant) come back whole, with their lengths."""
    theirs, ours = _both(ort_ref, nul_constant_model())
    _same(ours.run(None, {}), theirs.run(None, {}))
    assert ours.run(None, {})[0].tolist() == ["\0", "\0\0", "a\0", "\0a", "p\0q\u00e9\0"]


def test_ortvalue_strings_with_nul_characters(no_leaks):
    items = np.array(["x\0y", "\0", "plain"], dtype=object)
    value = ortagent.OrtValue.ortvalue_from_numpy(items)
    _same(value.numpy(), items)
    value.update_inplace(np.array(["1\0", "", "\0\0\0"], dtype=object))
    assert value.numpy().tolist() == ["1\0", "", "\0\0\0"]
    value.update_inplace(np.array(["no", "nuls", "now"], dtype=object))      # the one-call path again
    assert value.numpy().tolist() == ["no", "nuls", "now"]
    # sparse string tensors are filled through C strings: a NUL there is still refused
    with pytest.raises(ortagent.OrtInvalidArgument, match="contains a NUL character"):
        ortagent.SparseTensor.sparse_coo_from_numpy([3], np.array(["a\0b"], dtype=object), np.array([1], np.int64))
    del value
    gc.collect()


# ---- the text of errors that come from onnxruntime's statuses -------------------------------------

def _no_kernel_model():
    """A graph onnxruntime's CPU provider has no kernel for (an operator of a made-up domain)."""
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="example.nowhere")
    model = _model([node], [_tensor("x", T.FLOAT, [1])], [_tensor("y", T.FLOAT, [1])])
    model.opset_import.append(helper.make_opsetid("example.nowhere", 1))
    return model


@pytest.mark.parametrize("case", ["not-a-model", "no-such-file", "invalid-graph", "no-kernel", "wrong-map-type"])
def test_status_errors_read_as_onnxruntime(ort_ref, tmp_path, case):
    """An error raised from an onnxruntime status reads '[ONNXRuntimeError] : <code> : <NAME> :
    <message>', as onnxruntime's module writes it; the exception stays ortagent's typed one, its
    code the one in the text."""
    def call(module):
        if case == "not-a-model":
            return module.InferenceSession(b"garbage", providers=[CPU])
        if case == "no-such-file":
            return module.InferenceSession(str(tmp_path / "missing.onnx"), providers=[CPU])
        if case == "invalid-graph":
            return module.InferenceSession(dict_vectorizer_model(T.INT64, T.INT64).SerializeToString(),
                                           providers=[CPU])
        if case == "no-kernel":
            return module.InferenceSession(_no_kernel_model().SerializeToString(), providers=[CPU])
        session = module.InferenceSession(dict_vectorizer_model().SerializeToString(), providers=[CPU])
        return session.run(None, {"m": {"a": 1.0}})

    their_error, our_error = _raises_alike(lambda: call(ort_ref), lambda: call(ortagent))
    assert str(our_error) == str(their_error)
    assert str(our_error).startswith(f"[ONNXRuntimeError] : {our_error.code} : ")
    assert type(our_error).__name__ == "Ort" + type(their_error).__name__      # OrtInvalidGraph ~ InvalidGraph


def test_status_text_names_the_codes():
    from ortagent.errors import status_text

    assert status_text(2, "bad") == "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad"
    assert status_text(14, "gone") == "[ONNXRuntimeError] : 14 : NOT_FOUND : gone"
    assert status_text(99, "?") == "[ONNXRuntimeError] : 99 : GENERAL ERROR : ?"
