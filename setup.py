"""Build the Cython extension modules of ortagent.

The extensions link no onnxruntime library: the runtime is dlopen-ed at first use (see
ortagent/_runtime.pyx) and every call goes through the OrtApi table declared in include/.
Set ORTAGENT_CFLAGS to add compiler flags (e.g. -fsanitize=address for `make asan`).
"""

import glob
import os
import shlex

import numpy
from Cython.Build import cythonize
from Cython.Compiler import Options

# Cython warnings are errors: an unused or uninitialised name in a .pyx stops the build.
Options.warning_errors = True
from setuptools import Extension, setup

MODULES = ["_runtime", "_values", "_session", "_device", "_dlpack", "_agent"]

extra_compile_args = ["-O2", "-Wno-unused-function"] + shlex.split(os.environ.get("ORTAGENT_CFLAGS", ""))
extra_link_args = shlex.split(os.environ.get("ORTAGENT_LDFLAGS", ""))

extensions = [
    Extension(
        f"ortagent.{name}",
        [f"ortagent/{name}.pyx"],
        include_dirs=["include", numpy.get_include()],
        # the ABI declarations are compiled into every module: a change to them rebuilds all
        depends=sorted(glob.glob("include/ortagent/*.h")),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=extra_compile_args,
        extra_link_args=extra_link_args,
        libraries=["dl"],
    )
    for name in MODULES
    if os.path.exists(f"ortagent/{name}.pyx")
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": "3",
            "embedsignature": True,
            "autotestdict": False,
            "binding": False,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "warn.undeclared": False,
            "warn.unreachable": True,
            "warn.maybe_uninitialized": False,
            "warn.unused": False,
        },
        include_path=["."],
    ),
)
