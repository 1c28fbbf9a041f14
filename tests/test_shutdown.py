"""Interpreter exit with everything still alive: sessions, options, values, NumPy views, bindings
with handed-out outputs, pending TrainingAgent runs (both APIs), unconsumed DLPack capsules
(legacy and versioned), NumPy arrays and OrtValues built from each other's capsules -- held in
module globals, in reference cycles, or only by objects being finalized. The process must print
nothing and exit 0 (ortagent's DLPack deleters return at once once the interpreter is
finalizing; every ORT handle is released by its one owner, in any order).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO_ROOT

SETUP = """
import gc, sys, threading
import numpy as np, ortagent
from ortagent_testkit import onnx_models as models, training_graphs as tg
from ortagent import OrtValue

def everything():
    objects = {{}}
    options = ortagent.SessionOptions(); options.intra_op_num_threads = 1
    run_options = ortagent.RunOptions(); run_options.logid = "exit"
    session = ortagent.InferenceSession(models.mlp(), options)
    outputs = session.run_with_ort_values(None, {{"x": np.ones((2, 16), np.float32)}}, run_options)
    binding = session.io_binding()
    binding.bind_cpu_input("x", np.ones((3, 16), np.float32))
    binding.bind_output("y")
    session.run_with_iobinding(binding)
    handed_out = binding.get_outputs()
    strings = OrtValue.ortvalue_from_numpy(np.array(["a", "bc"], dtype=object))
    value = OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32))
    closed_with_view = OrtValue.ortvalue_from_numpy(np.arange(4.0))
    view = closed_with_view.numpy(); closed_with_view.close()
    capsules = [value.__dlpack__(), value.__dlpack__(max_version=(1, 0)),
                value.__dlpack__(copy=True)]
    numpy_over_ort = np.from_dlpack(value)
    ort_over_numpy = ortagent.from_dlpack(np.arange(5, dtype=np.int64))
    case = tg.mul_add_case()
    model = case.model.SerializeToString()
    feeds = case.make_feeds(np.random.default_rng(0))
    run_id_agent = ortagent.TrainingAgent(model)
    agent_binding = run_id_agent.io_binding()
    for name in ("x", "w", "bias"):
        agent_binding.bind_cpu_input(name, feeds[name])
    pending = [run_id_agent.run_forward(agent_binding, None) for _ in range(3)]
    state_agent = ortagent.TrainingAgent(model, fw_feed_names=["x", "w", "bias"], fw_outputs_device_info=["cpu"],
                                         bw_fetches_names=["x_grad"], bw_outputs_device_info=["cpu"])
    states = []
    for _ in range(3):
        state = ortagent.PartialGraphExecutionState()
        state_agent.run_forward([OrtValue.ortvalue_from_numpy(feeds[n]) for n in ("x", "w", "bias")], [], state)
        states.append(state)
    closed_session = ortagent.InferenceSession(models.add(shape=(3,)))
    kept = closed_session.run_with_ort_values(None, {{"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}})
    closed_session.close()
    objects.update(locals())
    return objects
"""

SCENARIOS = {
    # everything in module globals
    "globals": "globals().update(everything())",
    # everything in reference cycles only the collector (or finalization) can free
    "cycles": """
objects = everything()
loop = [objects]; loop.append(loop); objects["loop"] = loop
class Holder:
    pass
holder = Holder(); holder.me = holder; holder.objects = objects
del objects, loop, holder
""",
    # every capsule left unconsumed, and values exported several times over
    "capsules": """
values = [OrtValue.ortvalue_from_numpy(np.arange(n, dtype=np.float64)) for n in range(1, 50)]
capsules = [v.__dlpack__(max_version=(1, 0) if i % 2 else None) for i, v in enumerate(values)]
arrays = [np.from_dlpack(v) for v in values]
for v in values:
    v.close()
""",
    # sys.exit from the middle of work, with a non-daemon thread that finished its runs
    "sys_exit": """
objects = everything()
def work():
    for _ in range(100):
        objects["session"].run(None, {"x": np.ones((2, 16), np.float32)})
thread = threading.Thread(target=work); thread.start(); thread.join()
sys.exit(0)
""",
    # a daemon thread holding objects but idle, and the GC disabled
    "daemon_idle_no_gc": """
gc.disable()
objects = everything()
ready = threading.Event()
def idle():
    keep = objects
    ready.set()
    threading.Event().wait()
threading.Thread(target=idle, daemon=True).start()
ready.wait()
""",
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_exit_with_live_objects_is_quiet(tmp_path, scenario):
    script = tmp_path / f"exit_{scenario}.py"
    script.write_text(SETUP.format() + textwrap.dedent(SCENARIOS[scenario]) + "\nprint('done')\n")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, PYTHONWARNINGS="error", PYTHONDEVMODE="1")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    expected_stdout = "" if scenario == "sys_exit" else "done\n"
    assert (result.returncode, result.stdout, result.stderr) == (0, expected_stdout, "")


@pytest.mark.torch
def test_exit_with_torch_tensors_over_ortagent_memory_is_quiet(tmp_path):
    script = tmp_path / "exit_torch.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, torch, ortagent
        from ortagent import OrtValue
        values = [OrtValue.ortvalue_from_numpy(np.arange(8, dtype=np.float32) + i) for i in range(10)]
        tensors = [torch.from_dlpack(v) for v in values]
        back = [ortagent.from_dlpack(torch.arange(4) + i) for i in range(10)]
        for v in values:
            v.close()
        print("done")
    """))
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")
