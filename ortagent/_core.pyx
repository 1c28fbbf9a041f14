"""The core of ortagent: values, options, sessions and the training agent, one extension.

Each concern keeps a file of its own, included here bottom to top (the order of the README's
architecture section): a file uses what an earlier one defines when the module loads, and any
function of the extension at call time. One extension instead of one per concern means the
concerns call each other as static C functions -- no cross-module C interface, no import on
first use to reach a layer above. The onnxruntime handle table and the error mapping stay in
the _runtime extension, whose _runtime.pxd is the one C interface between extensions.
"""

from ortagent cimport _capi as ort
from ortagent._runtime cimport shared_runtime, live_handle_counts

ort.ortagent_rt = shared_runtime()
# per-kind counts of live onnxruntime handles (live_handles()), shared with _runtime
cdef Py_ssize_t* _live = live_handle_counts()

# values: element types, memory, tensors, OrtValue and the kinds of values built on it
include "_dtypes.pxi"
include "_memory.pxi"
include "_tensors.pxi"
include "_values.pxi"
include "_containers.pxi"
include "_sparse.pxi"
# options: session and run options, execution providers, allocators, metadata, EP devices
include "_options.pxi"
include "_providers.pxi"
include "_allocators.pxi"
include "_cpu_pool.pxi"
include "_metadata.pxi"
include "_epdevices.pxi"
include "_compile.pxi"
# sessions: the one run core, InferenceSession, IOBinding, device values, DLPack
include "_run_core.pxi"
include "_session.pxi"
include "_iobinding.pxi"
include "_device.pxi"
include "_dlpack.pxi"
# agent: one half's run and the engine's run state machine
include "_agent_run.pxi"
include "_agent.pxi"
