"""Build the Cython extension modules of ortagent.

The extensions link no onnxruntime library: the runtime is dlopen-ed at first use (see
ortagent/_runtime.pyx) and every call goes through the OrtApi table declared in include/.
Set ORTAGENT_CFLAGS to add compiler flags (e.g. -fsanitize=address for `make asan`).

The modules are translated and compiled in parallel, as many at a time as this process may use
CPUs; ORTAGENT_BUILD_JOBS sets the number (1: one at a time), as does build_ext's -j/--parallel
for the C compilation.
"""

import glob
import multiprocessing
import os
import re
import shlex

import Cython
import numpy
from Cython.Build import cythonize
from Cython.Compiler import Options

# The oldest Cython that builds ortagent: 3.1 brought `cython.critical_section` (the per-object
# locks of the free-threaded build) and the `freethreading_compatible` directive; 3.0 rejects
# both. Keep in step with pyproject.toml's build requirement.
MIN_CYTHON = (3, 1)
_found = tuple(int(part) for part in re.findall(r"\d+", Cython.__version__)[:2])
if _found < MIN_CYTHON:
    raise SystemExit(f"ortagent needs Cython >= {'.'.join(map(str, MIN_CYTHON))} to build "
                     f"(cython.critical_section, the freethreading_compatible directive); "
                     f"found Cython {Cython.__version__}: pip install 'Cython>=3.1'")

# Cython warnings are errors: an unused, possibly uninitialised or unreachable name in a .pyx
# stops the build (see the warn.* directives below).
Options.warning_errors = True
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _build_jobs() -> int:
    """How many modules to translate and compile at a time: ORTAGENT_BUILD_JOBS, else the CPUs."""
    wanted = os.environ.get("ORTAGENT_BUILD_JOBS", "").strip()
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise SystemExit(f"ORTAGENT_BUILD_JOBS must be a positive integer, not {wanted!r}")
        return int(wanted)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


BUILD_JOBS = _build_jobs()


def _cythonize_processes() -> int:
    """Worker processes for cythonize (0: translate in this process).

    Options.warning_errors above is a global of this process: only a forked worker inherits it
    (a spawned or forkserver one would start with warnings as warnings), so the workers fork.
    """
    if BUILD_JOBS < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return 0
    multiprocessing.set_start_method("fork", force=True)
    return BUILD_JOBS


class ParallelBuildExt(build_ext):
    """build_ext compiling the extensions BUILD_JOBS at a time unless -j/--parallel says otherwise."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = BUILD_JOBS


MODULES = ["_runtime", "_core"]

# The C warnings that mean a declaration is wrong are errors: a `.pxd` signature that disagrees
# with the ABI header (include/ortagent/ort_abi.h) is an incompatible pointer type where the call
# goes through the header's typed slot; an int passed as a pointer, an undeclared function or a
# const dropped the same. (-Wno-unused-function: Cython emits helpers a module may not use.)
STRICT_C_WARNINGS = ["-Werror=incompatible-pointer-types", "-Werror=int-conversion",
                     "-Werror=implicit-function-declaration", "-Werror=discarded-qualifiers",
                     "-Werror=return-type"]
extra_compile_args = (["-O2", "-Wno-unused-function", *STRICT_C_WARNINGS]
                      + shlex.split(os.environ.get("ORTAGENT_CFLAGS", "")))
extra_link_args = shlex.split(os.environ.get("ORTAGENT_LDFLAGS", ""))

# Every module declares free-threading support (Cython's freethreading_compatible): on a
# free-threaded CPython (3.13t+) the GIL stays off when ortagent is imported. ortagent's shared
# per-object state (a session's run count and caches, a value's use counts, an agent run's
# phase, an IOBinding's bookkeeping) is changed inside critical sections, which compile to
# nothing on a GIL build, and the live-handle counters with atomic adds; see README,
# "Performance" (free-threaded CPython). ORTAGENT_FREETHREADING=0 builds modules that do not
# declare it: importing them turns the GIL back on (with a warning).
FREETHREADING = os.environ.get("ORTAGENT_FREETHREADING", "1") != "0"

extensions = [
    Extension(
        f"ortagent.{name}",
        [f"ortagent/{name}.pyx"],
        include_dirs=["include", numpy.get_include()],
        # the ABI declarations are compiled into every module: a change to them rebuilds all;
        # the core's concerns are .pxi files its .pyx and .pxd include
        depends=sorted(glob.glob("include/ortagent/*.h") + glob.glob("ortagent/*.pxi")),
        # CYTHON_CLINE_IN_TRACEBACK: Cython caches a traceback frame's code object by its .pyx
        # line alone, so two functions of _core's included files on the same line number would
        # share one (a traceback naming the wrong file and function); keyed by the C line they
        # cannot, and the frame shows that C line too. Only raising paths change.
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), ("CYTHON_CLINE_IN_TRACEBACK", "1")],
        extra_compile_args=extra_compile_args,
        extra_link_args=extra_link_args,
        libraries=["dl"],
    )
    for name in MODULES
]

setup(
    cmdclass={"build_ext": ParallelBuildExt},
    ext_modules=cythonize(
        extensions,
        nthreads=_cythonize_processes(),
        compiler_directives={
            "language_level": "3",
            "embedsignature": True,
            "autotestdict": False,
            "binding": False,
            # Bounds checks and negative indexing stay on (Cython's defaults) everywhere: the
            # hot paths index C arrays, which Cython never checks. Measured with callgrind,
            # instructions per call counted inside the call: run() on Identity 13,862 with the
            # checks on, 13,862 with them off globally; the agent's run of one half 31,366 on,
            # 31,369 off. Should a function ever show a difference, turn them off there alone
            # (@cython.boundscheck(False)).
            "cdivision": True,
            "warn.undeclared": False,
            "warn.unreachable": True,
            "warn.maybe_uninitialized": True,
            "warn.unused": True,
            "freethreading_compatible": FREETHREADING,
        },
        include_path=["."],
    ),
)
