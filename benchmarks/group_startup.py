"""Group 5, start-up: ``import ortagent`` vs ``import onnxruntime`` in fresh interpreters.

Each sample is a new Python process (the same interpreter and environment as the driver) that
times the import statement itself with ``time.perf_counter`` and reports which heavy modules it
loaded; the contenders alternate, one process each per round (random order):

* ``import ortagent`` (lazy: no extension, no numpy, no library until first use);
* ``import ortagent`` + ``ortagent.get_version_string()`` (loads the runtime extension and
  dlopens libonnxruntime: the fair comparison with onnxruntime's import, which does both);
* ``import onnxruntime``;
* ``import numpy`` (for scale: onnxruntime's import includes it).
"""

from __future__ import annotations

import statistics
import time

from . import _common
from ._harness import FreshProcess, run_rounds
from ._report import Group, Row, Target

_TEMPLATE = """\
import sys, time
cpu = time.thread_time()
start = time.perf_counter()
{statement}
seconds = time.perf_counter() - start
cpu = time.thread_time() - cpu
import json
print(json.dumps({{"seconds": seconds, "cpu_seconds": cpu, "numpy": "numpy" in sys.modules,
                   "onnxruntime": "onnxruntime" in sys.modules,
                   "extensions": sorted(m for m in sys.modules if m.startswith("ortagent._"))}}))
"""

CONTENDERS = (
    ("ortagent", "import ortagent", "ortagent", "import ortagent"),
    ("ortagent-load", "import ortagent + load the library", "ortagent",
     "import ortagent; ortagent.get_version_string()"),
    ("onnxruntime", "import onnxruntime", "onnxruntime", "import onnxruntime"),
    ("numpy", "import numpy", "harness", "import numpy"),
)


def run(settings) -> Group:
    started = time.perf_counter()
    group = Group("startup", "5. start-up: imports in a fresh interpreter (ms)",
                  rounds=settings.rounds["startup"], clock=settings.clock)
    env = _common.child_env()
    contenders = [FreshProcess(key, label, side, _TEMPLATE.format(statement=statement), env=env,
                               cwd=str(settings.workdir))
                  for key, label, side, statement in CONTENDERS]
    samples = run_rounds([contenders], settings.rounds["startup"], 0.0, desc="5/5 start-up",
                         seed=settings.seed, clock=settings.clock)
    info = {c.key: c.info for c in contenders}
    for contender in contenders:
        peer = "onnxruntime" if contender.key in ("ortagent", "ortagent-load") else None
        group.rows.append(Row(contender.key, contender.label, contender.side,
                              samples[contender.key], ref=peer, unit="ms",
                              ref_name="import onnxruntime", other=samples.other[contender.key]))
    med = statistics.median(samples["ortagent"]) / 1e6
    q = statistics.quantiles(samples["ortagent"], n=4, method="inclusive") \
        if len(samples["ortagent"]) > 1 else samples["ortagent"] * 3
    group.targets.append(Target("import_ms", "import ortagent <= 60 ms", med, 60.0, "<=", "ms",
                                (q[0] / 1e6, q[2] / 1e6),
                                detail="import onnxruntime: "
                                       f"{statistics.median(samples['onnxruntime']) / 1e6:.1f} ms"))
    loaded = info["ortagent"]
    group.targets.append(Target("import_no_numpy", "numpy imported by `import ortagent` (must not be)",
                                1.0 if loaded.get("numpy") else 0.0, 0.0, "<=", "bool",
                                detail=f"numpy imported: {'yes' if loaded.get('numpy') else 'no'}; "
                                       f"onnxruntime imported: "
                                       f"{'yes' if loaded.get('onnxruntime') else 'no'}; "
                                       f"extension modules: {loaded.get('extensions') or 'none'}"))
    wall = statistics.median(samples.other["ortagent"] if samples.clock == "cpu"
                             else samples["ortagent"]) / 1e6
    group.notes.append("each sample is one new process; the time is the import statement only "
                       "(interpreter start-up excluded), measured inside the process; "
                       f"import ortagent by the wall clock: {wall:.1f} ms")
    group.seconds = time.perf_counter() - started
    return group
