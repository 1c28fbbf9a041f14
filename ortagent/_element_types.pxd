# cython: language_level=3
# The one table of ONNX tensor element types (include/ortagent/element_types.h).
from libc.stdint cimport uint8_t


cdef extern from "ortagent/element_types.h" nogil:
    enum ortagent_element_type:
        ORTAGENT_ELEM_UNDEFINED
        ORTAGENT_ELEM_FLOAT
        ORTAGENT_ELEM_UINT8
        ORTAGENT_ELEM_INT8
        ORTAGENT_ELEM_UINT16
        ORTAGENT_ELEM_INT16
        ORTAGENT_ELEM_INT32
        ORTAGENT_ELEM_INT64
        ORTAGENT_ELEM_STRING
        ORTAGENT_ELEM_BOOL
        ORTAGENT_ELEM_FLOAT16
        ORTAGENT_ELEM_DOUBLE
        ORTAGENT_ELEM_UINT32
        ORTAGENT_ELEM_UINT64
        ORTAGENT_ELEM_COMPLEX64
        ORTAGENT_ELEM_COMPLEX128
        ORTAGENT_ELEM_BFLOAT16
        ORTAGENT_ELEM_FLOAT8E4M3FN
        ORTAGENT_ELEM_FLOAT8E4M3FNUZ
        ORTAGENT_ELEM_FLOAT8E5M2
        ORTAGENT_ELEM_FLOAT8E5M2FNUZ
        ORTAGENT_ELEM_UINT4
        ORTAGENT_ELEM_INT4
        ORTAGENT_ELEM_FLOAT4E2M1
        ORTAGENT_ELEM_COUNT

    ctypedef struct ortagent_element_info:
        const char* name
        const char* numpy_name
        int item_size
        uint8_t dl_code
        uint8_t dl_bits
        int from_ml_dtypes

    const ortagent_element_info* ortagent_element_info_of(int elem_type)
