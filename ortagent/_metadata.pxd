# cython: language_level=3
from ortagent cimport _capi as ort

# A NodeArg for one input or output; its ONNX element type goes to elem_out[0] (-1: not a tensor).
cdef object node_arg(str name, const ort.OrtTypeInfo* type_info, int* elem_out)
# The model's ModelMetadata.
cdef object read_model_metadata(ort.OrtSession* session)
# The execution providers' subgraphs and nodes (OrtEpAssignedSubgraph list; onnxruntime >= 1.24).
cdef list read_graph_assignment(ort.OrtSession* session)
# End the session's profiling: the profile file's name ('' when it was off).
cdef str end_profiling(ort.OrtSession* session)
# When the session's profiling started (ns since the epoch).
cdef object profiling_start_ns(ort.OrtSession* session)
