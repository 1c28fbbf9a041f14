"""Ownership: every ORT handle has one owner, children keep parents alive, counters return to
their baseline, cycles are collected and the interpreter exits quietly with objects alive."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import onnx_models as models
import ortagent
from conftest import REPO_ROOT


def test_view_outlives_value_and_session(no_leaks):
    session = ortagent.InferenceSession(models.mlp())
    (value,) = session.run_with_ort_values(None, {"x": np.ones((3, 16), np.float32)})
    view = value.numpy()
    expected = view.copy()
    session_ref = weakref.ref(session)
    del value, session
    gc.collect()
    assert session_ref() is not None          # kept by the value behind the view
    np.testing.assert_array_equal(view, expected)
    del view
    gc.collect()
    assert session_ref() is None


def test_value_outlives_closed_session(no_leaks):
    session = ortagent.InferenceSession(models.mlp())
    (value,) = session.run_with_ort_values(None, {"x": np.ones((2, 16), np.float32)})
    expected = value.numpy().copy()
    session.close()
    del session
    gc.collect()
    np.testing.assert_array_equal(value.numpy(), expected)


def test_many_runs_return_to_baseline(no_leaks):
    session = ortagent.InferenceSession(models.multi_io())
    feed = {"a": np.ones((2, 4), np.float32), "b": np.ones((2, 4), np.float32), "k": np.array([2], np.int32)}
    for _ in range(2000):
        session.run(None, feed)
        session.run_with_ort_values(["total"], feed)
    for bad in ({"a": feed["a"]}, {"a": feed["a"], "b": feed["b"], "k": np.ones(1)}, {"zz": 1}):
        with pytest.raises(ortagent.OrtError):
            session.run(None, bad)
    del session


def test_reference_cycles_are_collected(no_leaks):
    class Holder:
        pass

    for _ in range(20):
        holder = Holder()
        holder.session = ortagent.InferenceSession(models.identity())
        holder.options = ortagent.SessionOptions()
        holder.run_options = ortagent.RunOptions()
        holder.values = holder.session.run_with_ort_values(None, {"x": np.ones(1, np.float32)})
        holder.view = holder.values[0].numpy()
        holder.self = holder
        del holder
    gc.collect()


def test_options_and_run_options_are_counted(no_leaks):
    before = ortagent.live_handles()
    so = ortagent.SessionOptions()
    ro = ortagent.RunOptions()
    now = ortagent.live_handles()
    assert now["session_options"] == before["session_options"] + 1
    assert now["run_options"] == before["run_options"] + 1
    del so, ro


def test_interpreter_exit_with_live_objects_is_quiet(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, ortagent, sys
        sys.path.insert(0, sys.argv[1])
        import onnx_models as models
        session = ortagent.InferenceSession(models.mlp())
        options = ortagent.SessionOptions()
        run_options = ortagent.RunOptions()
        values = session.run_with_ort_values(None, {"x": np.ones((2, 16), np.float32)})
        views = [v.numpy() for v in values]
        own = ortagent.OrtValue.ortvalue_from_numpy(np.arange(10))
        cycle = [session, own]
        cycle.append(cycle)
        print("done")
    """)
    path = tmp_path / "exit_alive.py"
    path.write_text(script)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, str(path), os.path.join(REPO_ROOT, "tests")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert result.stderr == ""
