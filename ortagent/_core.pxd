# The declarations of the _core extension: its extension types, structs and enums, one file per
# concern, in the order of _core.pyx's includes. Module-level functions are declared by their
# definitions in the .pxi files alone, so that no helper of the core becomes a C interface that
# another extension could import (the only C interface between extensions is _runtime.pxd).
include "_dtypes_decl.pxi"
include "_memory_decl.pxi"
include "_tensors_decl.pxi"
include "_values_decl.pxi"
include "_options_decl.pxi"
include "_epdevices_decl.pxi"
include "_run_core_decl.pxi"
include "_session_decl.pxi"
include "_iobinding_decl.pxi"
include "_dlpack_decl.pxi"
include "_agent_decl.pxi"
