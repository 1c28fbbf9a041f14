"""Build the sdist and the wheel, check what they contain, install the sdist into a fresh virtual
environment and use it (what `make dist-check` runs, in CI too).

Usage: python tools/check_dist.py [--keep]. The fresh environment gets only the build
requirements and onnx; the onnxruntime library of the calling environment is used through
ORTAGENT_ORT_LIBRARY, so nothing large is downloaded.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = """
import numpy as np, ortagent
from onnx import TensorProto, helper
graph = helper.make_graph([helper.make_node('Add', ['a', 'b'], ['c'])], 'g',
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in 'ab'],
    [helper.make_tensor_value_info('c', TensorProto.FLOAT, [3])])
model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid('', 17)])
out = ortagent.InferenceSession(model.SerializeToString()).run(None, {'a': np.ones(3, np.float32), 'b': np.ones(3, np.float32)})[0]
assert out.tolist() == [2, 2, 2], out
assert ortagent.__file__.startswith(__import__('sys').prefix), ortagent.__file__
relu_grad = helper.make_model(helper.make_graph(
    [helper.make_node('ReluGrad', ['dy', 'x'], ['dx'], domain='com.microsoft')], 'g',
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ('dy', 'x')],
    [helper.make_tensor_value_info('dx', TensorProto.FLOAT, [3])]), ir_version=10,
    opset_imports=[helper.make_opsetid('', 17), helper.make_opsetid('com.microsoft', 1)])
lowered = ortagent.lower_training_ops(relu_grad).SerializeToString()
dx = ortagent.InferenceSession(lowered).run(None, {'dy': np.ones(3, np.float32), 'x': np.array([-1, 0, 2], np.float32)})[0]
assert dx.tolist() == [0, 0, 1], dx
print('installed ortagent', ortagent.__version__, 'runs on onnxruntime', ortagent.get_version_string())
"""


def run(command, **kwargs):
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def main() -> int:
    keep = "--keep" in sys.argv
    work = tempfile.mkdtemp(prefix="ortagent-dist-")
    try:
        out = os.path.join(work, "dist")
        run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT])
        sdist = glob.glob(os.path.join(out, "ortagent-*.tar.gz"))[0]
        wheel = glob.glob(os.path.join(out, "ortagent-*.whl"))[0]
        with tarfile.open(sdist) as archive:
            names = archive.getnames()
        for required in ("include/ortagent/ort_abi.h", "include/ortagent/ort_call.h",
                         "include/ortagent/dlpack_abi.h", "ortagent/_core.pyx", "ortagent/_session.pxi", "ortagent/_capi.pxd",
                         "ortagent/_core.pyi", "ortagent/py.typed", "setup.py", "pyproject.toml"):
            if not any(name.endswith(required) for name in names):
                raise SystemExit(f"the sdist lacks {required}")
        with zipfile.ZipFile(wheel) as archive:
            wheel_names = archive.namelist()
        for required in ("ortagent/_core.pyi", "ortagent/py.typed", "ortagent/agent.py",
                         "ortagent/training_ops/__init__.py", "ortagent/training_ops/aten.py",
                         "ortagent/torch/__init__.py", "ortagent/torch/_module.py", "ortagent/_ad_rules.py", "ortagent/_graph_passes.py"):
            if required not in wheel_names:
                raise SystemExit(f"the wheel lacks {required}")
        if not any(name.startswith("ortagent/_core.") and name.endswith(".so") for name in wheel_names):
            raise SystemExit("the wheel lacks the compiled extension modules")
        # the support of tests and benchmarks (ortagent_testkit, benchmarks/) ships in neither; the
        # wheel holds the package alone (setuptools' sdist adds tests/test*.py by default, as ever)
        stray = [name for name in wheel_names if not name.startswith(("ortagent/", "ortagent-"))]
        stray += [name for name in names
                  if name.split("/", 2)[1:2] and name.split("/", 2)[1] in ("ortagent_testkit", "benchmarks")]
        if stray:
            raise SystemExit(f"the sdist or the wheel carries files outside the package: {stray[:10]}")
        print(f"sdist {os.path.basename(sdist)}: {len(names)} files; wheel {os.path.basename(wheel)}: "
              f"{len(wheel_names)} files")

        sys.path.insert(0, ROOT)
        from ortagent import _runtime

        library = _runtime.load()
        venv = os.path.join(work, "venv")
        run([sys.executable, "-m", "venv", venv])
        python = os.path.join(venv, "bin", "python")
        quiet = ["-q", "--disable-pip-version-check"]
        run([python, "-m", "pip", "install", *quiet, "setuptools>=77", "Cython>=3.1", "numpy>=2.0", "onnx"])
        run([python, "-m", "pip", "install", *quiet, "--no-build-isolation", sdist])
        env = dict(os.environ, ORTAGENT_ORT_LIBRARY=library)
        env.pop("PYTHONPATH", None)
        run([python, "-c", SMOKE], cwd=work, env=env)
        return 0
    finally:
        if keep:
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
