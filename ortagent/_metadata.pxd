# cython: language_level=3
from ortagent cimport _capi as ort

# A NodeArg for one input or output; its ONNX element type goes to elem_out[0] (-1: not a tensor).
cdef object node_arg(str name, const ort.OrtTypeInfo* type_info, int* elem_out)
# The model's ModelMetadata.
cdef object read_model_metadata(ort.OrtSession* session)
