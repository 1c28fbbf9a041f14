"""The Cython view of include/ortagent/dlpack_abi.h (ortagent's own DLPack 1.0 declarations)."""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "ortagent/dlpack_abi.h" nogil:
    enum: ORTAGENT_DLPACK_MAJOR_VERSION
    enum: ORTAGENT_DLPACK_MINOR_VERSION

    ctypedef enum ortagent_dl_device_type:
        ORTAGENT_DL_CPU
        ORTAGENT_DL_CUDA
        ORTAGENT_DL_CUDA_HOST
        ORTAGENT_DL_OPENCL
        ORTAGENT_DL_VULKAN
        ORTAGENT_DL_METAL
        ORTAGENT_DL_VPI
        ORTAGENT_DL_ROCM
        ORTAGENT_DL_ROCM_HOST
        ORTAGENT_DL_EXT_DEV
        ORTAGENT_DL_CUDA_MANAGED
        ORTAGENT_DL_ONEAPI
        ORTAGENT_DL_WEBGPU
        ORTAGENT_DL_HEXAGON
        ORTAGENT_DL_MAIA

    ctypedef enum ortagent_dl_type_code:
        ORTAGENT_DL_INT
        ORTAGENT_DL_UINT
        ORTAGENT_DL_FLOAT
        ORTAGENT_DL_OPAQUE_HANDLE
        ORTAGENT_DL_BFLOAT
        ORTAGENT_DL_COMPLEX
        ORTAGENT_DL_BOOL

    uint64_t ORTAGENT_DLPACK_FLAG_READ_ONLY
    uint64_t ORTAGENT_DLPACK_FLAG_IS_COPIED

    const char* ORTAGENT_DLPACK_CAPSULE
    const char* ORTAGENT_DLPACK_USED_CAPSULE
    const char* ORTAGENT_DLPACK_VERSIONED_CAPSULE
    const char* ORTAGENT_DLPACK_USED_VERSIONED_CAPSULE

    ctypedef struct ortagent_dl_device:
        ortagent_dl_device_type device_type
        int32_t device_id

    ctypedef struct ortagent_dl_data_type:
        uint8_t code
        uint8_t bits
        uint16_t lanes

    ctypedef struct ortagent_dl_tensor:
        void* data
        ortagent_dl_device device
        int32_t ndim
        ortagent_dl_data_type dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

    ctypedef struct ortagent_dl_managed_tensor:
        ortagent_dl_tensor dl_tensor
        void* manager_ctx
        void (*deleter)(ortagent_dl_managed_tensor*) noexcept

    ctypedef struct ortagent_dl_pack_version:
        uint32_t major
        uint32_t minor

    ctypedef struct ortagent_dl_managed_tensor_versioned:
        ortagent_dl_pack_version version
        void* manager_ctx
        void (*deleter)(ortagent_dl_managed_tensor_versioned*) noexcept
        uint64_t flags
        ortagent_dl_tensor dl_tensor
