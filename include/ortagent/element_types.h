/*
 * ortagent/element_types.h -- the one table of ONNX tensor element types.
 *
 * Every extension module reads element types from here: the ONNX number, the name inside
 * "tensor(<name>)", the NumPy dtype name (empty when NumPy has none; "object" for strings),
 * the item size in bytes (0: strings and sub-byte types, which have no fixed-size item), the
 * DLPack data type (code, bits; bits 0: no DLPack 1.0 equivalent) and whether the NumPy dtype
 * comes from the ml_dtypes package. The numbers are ONNX's TensorProto.DataType values, which
 * onnxruntime's ONNXTensorElementDataType repeats.
 *
 * T(SUFFIX, number, "onnx name", "numpy name", item size, DLPack code, DLPack bits, ml_dtypes)
 */
#ifndef ORTAGENT_ELEMENT_TYPES_H
#define ORTAGENT_ELEMENT_TYPES_H

#include "ortagent/dlpack_abi.h"

#define ORTAGENT_ELEMENT_TYPES(T)                                                              \
    T(FLOAT, 1, "float", "float32", 4, ORTAGENT_DL_FLOAT, 32, 0)                              \
    T(UINT8, 2, "uint8", "uint8", 1, ORTAGENT_DL_UINT, 8, 0)                                 \
    T(INT8, 3, "int8", "int8", 1, ORTAGENT_DL_INT, 8, 0)                                     \
    T(UINT16, 4, "uint16", "uint16", 2, ORTAGENT_DL_UINT, 16, 0)                             \
    T(INT16, 5, "int16", "int16", 2, ORTAGENT_DL_INT, 16, 0)                                 \
    T(INT32, 6, "int32", "int32", 4, ORTAGENT_DL_INT, 32, 0)                                 \
    T(INT64, 7, "int64", "int64", 8, ORTAGENT_DL_INT, 64, 0)                                 \
    T(STRING, 8, "string", "object", 0, 0, 0, 0)                                              \
    T(BOOL, 9, "bool", "bool", 1, ORTAGENT_DL_BOOL, 8, 0)                                    \
    T(FLOAT16, 10, "float16", "float16", 2, ORTAGENT_DL_FLOAT, 16, 0)                        \
    T(DOUBLE, 11, "double", "float64", 8, ORTAGENT_DL_FLOAT, 64, 0)                          \
    T(UINT32, 12, "uint32", "uint32", 4, ORTAGENT_DL_UINT, 32, 0)                            \
    T(UINT64, 13, "uint64", "uint64", 8, ORTAGENT_DL_UINT, 64, 0)                            \
    T(COMPLEX64, 14, "complex64", "complex64", 8, ORTAGENT_DL_COMPLEX, 64, 0)                \
    T(COMPLEX128, 15, "complex128", "complex128", 16, ORTAGENT_DL_COMPLEX, 128, 0)           \
    T(BFLOAT16, 16, "bfloat16", "bfloat16", 2, ORTAGENT_DL_BFLOAT, 16, 1)                    \
    T(FLOAT8E4M3FN, 17, "float8e4m3fn", "float8_e4m3fn", 1, 0, 0, 1)                         \
    T(FLOAT8E4M3FNUZ, 18, "float8e4m3fnuz", "float8_e4m3fnuz", 1, 0, 0, 1)                   \
    T(FLOAT8E5M2, 19, "float8e5m2", "float8_e5m2", 1, 0, 0, 1)                               \
    T(FLOAT8E5M2FNUZ, 20, "float8e5m2fnuz", "float8_e5m2fnuz", 1, 0, 0, 1)                   \
    T(UINT4, 21, "uint4", "", 0, 0, 0, 0)                                                     \
    T(INT4, 22, "int4", "", 0, 0, 0, 0)                                                       \
    T(FLOAT4E2M1, 23, "float4e2m1", "", 0, 0, 0, 0)

/* ORTAGENT_ELEM_FLOAT = 1, ... ORTAGENT_ELEM_FLOAT4E2M1 = 23; ORTAGENT_ELEM_COUNT = 24. */
#define ORTAGENT_ELEM_ENUMERATOR_(suffix, number, name, numpy, size, code, bits, ml) \
    ORTAGENT_ELEM_##suffix = number,
enum ortagent_element_type {
    ORTAGENT_ELEM_UNDEFINED = 0,
    ORTAGENT_ELEMENT_TYPES(ORTAGENT_ELEM_ENUMERATOR_)
    ORTAGENT_ELEM_COUNT
};
#undef ORTAGENT_ELEM_ENUMERATOR_

typedef struct ortagent_element_info {
    const char* name;        /* "float" in "tensor(float)"; NULL: not an element type */
    const char* numpy_name;  /* NumPy (or ml_dtypes) dtype name; "" when there is none */
    int item_size;           /* bytes per element; 0 for strings and sub-byte types */
    uint8_t dl_code;         /* DLPack type code */
    uint8_t dl_bits;         /* DLPack bits; 0: no DLPack equivalent */
    int from_ml_dtypes;      /* the NumPy dtype is ml_dtypes' */
} ortagent_element_info;

#define ORTAGENT_ELEM_ENTRY_(suffix, number, name, numpy, size, code, bits, ml) \
    [number] = {name, numpy, size, code, bits, ml},
/* Indexed by the ONNX number; entry 0 (undefined) has a NULL name. */
static const ortagent_element_info ortagent_element_infos[ORTAGENT_ELEM_COUNT] = {
    ORTAGENT_ELEMENT_TYPES(ORTAGENT_ELEM_ENTRY_)
};
#undef ORTAGENT_ELEM_ENTRY_

/* The entry for `elem_type`, or NULL when it is not an element type ortagent knows. */
static inline const ortagent_element_info* ortagent_element_info_of(int elem_type) {
    if (elem_type <= 0 || elem_type >= ORTAGENT_ELEM_COUNT) return 0;
    return &ortagent_element_infos[elem_type];
}

#endif
