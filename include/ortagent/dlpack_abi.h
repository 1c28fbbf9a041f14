/*
 * ortagent/dlpack_abi.h -- ortagent's declaration of the DLPack 1.0 ABI.
 *
 * Written by the ortagent project from the DLPack specification's facts (struct layouts,
 * enumerator values, flag bits, the Python capsule protocol's names). No DLPack header is
 * included or copied. Every name carries an ortagent prefix, so this file can share a
 * translation unit with a genuine dlpack/dlpack.h: tests/test_dlpack_header.py does exactly
 * that and checks sizes, field offsets and types, enumerator and flag values.
 *
 * Enumerations are X-lists of (ortagent suffix, DLPack's own name, value); DLPack's name is
 * only used by the test, which compares each value with the genuine enumerator.
 */
#ifndef ORTAGENT_DLPACK_ABI_H
#define ORTAGENT_DLPACK_ABI_H

#include <stdint.h>

/* The DLPack version these declarations follow (DLManagedTensorVersioned.version). */
#define ORTAGENT_DLPACK_MAJOR_VERSION 1
#define ORTAGENT_DLPACK_MINOR_VERSION 0

/* ---- device types: E(suffix, DLPack name, value) ---------------------------------------- */
#define ORTAGENT_DL_DEVICE_TYPES(E)                                                            \
    E(CPU, kDLCPU, 1)                   /* system memory */                                    \
    E(CUDA, kDLCUDA, 2)                 /* CUDA device memory */                               \
    E(CUDA_HOST, kDLCUDAHost, 3)        /* pinned host memory (cudaMallocHost) */              \
    E(OPENCL, kDLOpenCL, 4)                                                                    \
    E(VULKAN, kDLVulkan, 7)                                                                    \
    E(METAL, kDLMetal, 8)                                                                      \
    E(VPI, kDLVPI, 9)                                                                          \
    E(ROCM, kDLROCM, 10)                                                                       \
    E(ROCM_HOST, kDLROCMHost, 11)                                                              \
    E(EXT_DEV, kDLExtDev, 12)                                                                  \
    E(CUDA_MANAGED, kDLCUDAManaged, 13) /* CUDA unified memory (cudaMallocManaged) */          \
    E(ONEAPI, kDLOneAPI, 14)                                                                   \
    E(WEBGPU, kDLWebGPU, 15)                                                                   \
    E(HEXAGON, kDLHexagon, 16)                                                                 \
    E(MAIA, kDLMAIA, 17)

/* ---- data type codes: E(suffix, DLPack name, value) ------------------------------------- */
#define ORTAGENT_DL_TYPE_CODES(E)                                                              \
    E(INT, kDLInt, 0)                                                                          \
    E(UINT, kDLUInt, 1)                                                                        \
    E(FLOAT, kDLFloat, 2)                                                                      \
    E(OPAQUE_HANDLE, kDLOpaqueHandle, 3)                                                       \
    E(BFLOAT, kDLBfloat, 4)                                                                    \
    E(COMPLEX, kDLComplex, 5)           /* bits counts both parts: complex64 has bits 64 */    \
    E(BOOL, kDLBool, 6)                 /* 8 bits per element */

#define ORTAGENT_DL_ENUMERATOR_(suffix, dlpack_name, value) ORTAGENT_DL_##suffix = value,
typedef enum ortagent_dl_device_type {
    ORTAGENT_DL_DEVICE_TYPES(ORTAGENT_DL_ENUMERATOR_)
} ortagent_dl_device_type;
typedef enum ortagent_dl_type_code {
    ORTAGENT_DL_TYPE_CODES(ORTAGENT_DL_ENUMERATOR_)
} ortagent_dl_type_code;
#undef ORTAGENT_DL_ENUMERATOR_

/* ---- flag bits of ortagent_dl_managed_tensor_versioned.flags ---------------------------- */
#define ORTAGENT_DLPACK_FLAG_READ_ONLY ((uint64_t)1 << 0)  /* the consumer must not write */
#define ORTAGENT_DLPACK_FLAG_IS_COPIED ((uint64_t)1 << 1)  /* the producer made a copy */

/* ---- names of the PyCapsules of the Python __dlpack__ protocol -------------------------- */
#define ORTAGENT_DLPACK_CAPSULE "dltensor"                          /* DLManagedTensor */
#define ORTAGENT_DLPACK_USED_CAPSULE "used_dltensor"                /* ... once consumed */
#define ORTAGENT_DLPACK_VERSIONED_CAPSULE "dltensor_versioned"      /* ...Versioned */
#define ORTAGENT_DLPACK_USED_VERSIONED_CAPSULE "used_dltensor_versioned"

/* ---- structs ------------------------------------------------------------------------------ */
typedef struct ortagent_dl_device {
    ortagent_dl_device_type device_type;
    int32_t device_id;          /* ordinal of the device (0 for the CPU) */
} ortagent_dl_device;

typedef struct ortagent_dl_data_type {
    uint8_t code;               /* an ortagent_dl_type_code */
    uint8_t bits;               /* bits per lane: 8, 16, 32, 64 (bool: 8) */
    uint16_t lanes;             /* 1 for scalars */
} ortagent_dl_data_type;

typedef struct ortagent_dl_tensor {
    void* data;                 /* the buffer (device pointer for device memory) */
    ortagent_dl_device device;
    int32_t ndim;
    ortagent_dl_data_type dtype;
    int64_t* shape;             /* ndim extents */
    int64_t* strides;           /* ndim strides in elements, or NULL for C-contiguous */
    uint64_t byte_offset;       /* from data to the first element */
} ortagent_dl_tensor;

/* The legacy (unversioned) managed tensor: the "dltensor" capsule. */
typedef struct ortagent_dl_managed_tensor {
    ortagent_dl_tensor dl_tensor;
    void* manager_ctx;          /* the producer's owner of the buffer */
    void (*deleter)(struct ortagent_dl_managed_tensor* self);   /* may be NULL */
} ortagent_dl_managed_tensor;

typedef struct ortagent_dl_pack_version {
    uint32_t major;
    uint32_t minor;
} ortagent_dl_pack_version;

/* The versioned managed tensor (DLPack >= 1.0): the "dltensor_versioned" capsule. */
typedef struct ortagent_dl_managed_tensor_versioned {
    ortagent_dl_pack_version version;   /* the producer's DLPack version */
    void* manager_ctx;
    void (*deleter)(struct ortagent_dl_managed_tensor_versioned* self);   /* may be NULL */
    uint64_t flags;             /* ORTAGENT_DLPACK_FLAG_* */
    ortagent_dl_tensor dl_tensor;
} ortagent_dl_managed_tensor_versioned;

#endif /* ORTAGENT_DLPACK_ABI_H */
