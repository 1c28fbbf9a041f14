/*
 * Compile-time check of include/ortagent/dlpack_abi.h against a genuine dlpack/dlpack.h.
 *
 * Built by tests/test_dlpack_header.py with  gcc -std=c11 -Wall -Werror  and
 *   -I <folder holding dlpack/dlpack.h>   -I <folder holding ortagent/dlpack_abi.h>
 *
 * Both declarations share this translation unit (ours are all ortagent-prefixed). Checked:
 * the version, every enumerator against its genuine namesake, the flag bits, and for each
 * struct its size and alignment and each field's offset and size, plus the field's type
 * where both sides use the same C type (the enum- and struct-typed fields differ by name
 * only: their size and offset are checked, and the nested structs are checked themselves).
 * At run time the program prints what it checked, for the test to compare:
 *   version <major>.<minor>
 *   device <suffix> <value>       type_code <suffix> <value>
 *   capsule <macro> <name>
 *   struct <ours> <size>
 */
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <dlpack/dlpack.h>

#include "ortagent/dlpack_abi.h"

_Static_assert(ORTAGENT_DLPACK_MAJOR_VERSION == DLPACK_MAJOR_VERSION,
               "ORTAGENT_DLPACK_MAJOR_VERSION differs from the genuine DLPACK_MAJOR_VERSION");
_Static_assert(ORTAGENT_DLPACK_MINOR_VERSION == DLPACK_MINOR_VERSION,
               "ORTAGENT_DLPACK_MINOR_VERSION differs from the genuine DLPACK_MINOR_VERSION");

/* ---- enumerators and flags ------------------------------------------------------------- */

#define CHECK_ENUMERATOR(suffix, dlpack_name, value)                                          \
    _Static_assert((long long)ORTAGENT_DL_##suffix == (long long)(dlpack_name),               \
                   "value of ORTAGENT_DL_" #suffix " differs from the genuine " #dlpack_name);
ORTAGENT_DL_DEVICE_TYPES(CHECK_ENUMERATOR)
ORTAGENT_DL_TYPE_CODES(CHECK_ENUMERATOR)
_Static_assert(sizeof(ortagent_dl_device_type) == sizeof(DLDeviceType),
               "size of ortagent_dl_device_type differs from DLDeviceType");
_Static_assert(sizeof(ortagent_dl_type_code) == sizeof(DLDataTypeCode),
               "size of ortagent_dl_type_code differs from DLDataTypeCode");
_Static_assert(((ortagent_dl_device_type)-1 < 0) == ((DLDeviceType)-1 < 0),
               "signedness of ortagent_dl_device_type differs from DLDeviceType");

_Static_assert(ORTAGENT_DLPACK_FLAG_READ_ONLY == DLPACK_FLAG_BITMASK_READ_ONLY,
               "ORTAGENT_DLPACK_FLAG_READ_ONLY differs from DLPACK_FLAG_BITMASK_READ_ONLY");
_Static_assert(ORTAGENT_DLPACK_FLAG_IS_COPIED == DLPACK_FLAG_BITMASK_IS_COPIED,
               "ORTAGENT_DLPACK_FLAG_IS_COPIED differs from DLPACK_FLAG_BITMASK_IS_COPIED");
_Static_assert(_Generic(ORTAGENT_DLPACK_FLAG_READ_ONLY, uint64_t: 1, default: 0),
               "ORTAGENT_DLPACK_FLAG_READ_ONLY is not a uint64_t (the type of .flags)");

/* ---- structs --------------------------------------------------------------------------- */

#define FIELD(ours, genuine, ours_field, genuine_field)                                       \
    _Static_assert(offsetof(ours, ours_field) == offsetof(genuine, genuine_field),            \
                   "offset of " #ours "." #ours_field " differs from " #genuine               \
                   "." #genuine_field);                                                       \
    _Static_assert(sizeof(((ours*)0)->ours_field) == sizeof(((genuine*)0)->genuine_field),   \
                   "size of " #ours "." #ours_field " differs from " #genuine                 \
                   "." #genuine_field);
#define SAME_TYPE_FIELD(ours, genuine, field)                                                 \
    FIELD(ours, genuine, field, field)                                                        \
    _Static_assert(_Generic(((genuine*)0)->field, __typeof__(((ours*)0)->field): 1,           \
                            default: 0),                                                      \
                   "type of " #ours "." #field " differs from " #genuine "." #field);
#define STRUCT(ours, genuine)                                                                 \
    _Static_assert(sizeof(ours) == sizeof(genuine),                                           \
                   "size of " #ours " differs from " #genuine);                               \
    _Static_assert(alignof(ours) == alignof(genuine),                                         \
                   "alignment of " #ours " differs from " #genuine);

STRUCT(ortagent_dl_pack_version, DLPackVersion)
SAME_TYPE_FIELD(ortagent_dl_pack_version, DLPackVersion, major)
SAME_TYPE_FIELD(ortagent_dl_pack_version, DLPackVersion, minor)

STRUCT(ortagent_dl_device, DLDevice)
FIELD(ortagent_dl_device, DLDevice, device_type, device_type)
SAME_TYPE_FIELD(ortagent_dl_device, DLDevice, device_id)

STRUCT(ortagent_dl_data_type, DLDataType)
SAME_TYPE_FIELD(ortagent_dl_data_type, DLDataType, code)
SAME_TYPE_FIELD(ortagent_dl_data_type, DLDataType, bits)
SAME_TYPE_FIELD(ortagent_dl_data_type, DLDataType, lanes)

STRUCT(ortagent_dl_tensor, DLTensor)
SAME_TYPE_FIELD(ortagent_dl_tensor, DLTensor, data)
FIELD(ortagent_dl_tensor, DLTensor, device, device)
SAME_TYPE_FIELD(ortagent_dl_tensor, DLTensor, ndim)
FIELD(ortagent_dl_tensor, DLTensor, dtype, dtype)
SAME_TYPE_FIELD(ortagent_dl_tensor, DLTensor, shape)
SAME_TYPE_FIELD(ortagent_dl_tensor, DLTensor, strides)
SAME_TYPE_FIELD(ortagent_dl_tensor, DLTensor, byte_offset)

STRUCT(ortagent_dl_managed_tensor, DLManagedTensor)
FIELD(ortagent_dl_managed_tensor, DLManagedTensor, dl_tensor, dl_tensor)
SAME_TYPE_FIELD(ortagent_dl_managed_tensor, DLManagedTensor, manager_ctx)
FIELD(ortagent_dl_managed_tensor, DLManagedTensor, deleter, deleter)

/* DLPack 1.0 declares the versioned struct by tag only. */
typedef struct DLManagedTensorVersioned genuine_versioned;
STRUCT(ortagent_dl_managed_tensor_versioned, genuine_versioned)
FIELD(ortagent_dl_managed_tensor_versioned, genuine_versioned, version, version)
SAME_TYPE_FIELD(ortagent_dl_managed_tensor_versioned, genuine_versioned, manager_ctx)
FIELD(ortagent_dl_managed_tensor_versioned, genuine_versioned, deleter, deleter)
SAME_TYPE_FIELD(ortagent_dl_managed_tensor_versioned, genuine_versioned, flags)
FIELD(ortagent_dl_managed_tensor_versioned, genuine_versioned, dl_tensor, dl_tensor)

/* The deleters take a pointer to their own struct and return nothing. */
_Static_assert(_Generic(((DLManagedTensor*)0)->deleter, void (*)(DLManagedTensor*): 1,
                        default: 0),
               "the genuine DLManagedTensor.deleter is not void (*)(DLManagedTensor*)");
_Static_assert(_Generic(((ortagent_dl_managed_tensor*)0)->deleter,
                        void (*)(ortagent_dl_managed_tensor*): 1, default: 0),
               "ortagent_dl_managed_tensor.deleter is not void (*)(ortagent_dl_managed_tensor*)");
_Static_assert(_Generic(((genuine_versioned*)0)->deleter, void (*)(genuine_versioned*): 1,
                        default: 0),
               "the genuine DLManagedTensorVersioned.deleter has another shape");
_Static_assert(_Generic(((ortagent_dl_managed_tensor_versioned*)0)->deleter,
                        void (*)(ortagent_dl_managed_tensor_versioned*): 1, default: 0),
               "ortagent_dl_managed_tensor_versioned.deleter has another shape");

/* ---- report ---------------------------------------------------------------------------- */

#define PRINT_DEVICE(suffix, dlpack_name, value)                                              \
    printf("device %s %lld\n", #suffix, (long long)ORTAGENT_DL_##suffix);
#define PRINT_CODE(suffix, dlpack_name, value)                                                \
    printf("type_code %s %lld\n", #suffix, (long long)ORTAGENT_DL_##suffix);
#define PRINT_STRUCT(t) printf("struct %s %zu\n", #t, sizeof(t));

int main(void) {
    printf("version %d.%d\n", ORTAGENT_DLPACK_MAJOR_VERSION, ORTAGENT_DLPACK_MINOR_VERSION);
    ORTAGENT_DL_DEVICE_TYPES(PRINT_DEVICE)
    ORTAGENT_DL_TYPE_CODES(PRINT_CODE)
    printf("flag READ_ONLY %llu\n", (unsigned long long)ORTAGENT_DLPACK_FLAG_READ_ONLY);
    printf("flag IS_COPIED %llu\n", (unsigned long long)ORTAGENT_DLPACK_FLAG_IS_COPIED);
    printf("capsule CAPSULE %s\n", ORTAGENT_DLPACK_CAPSULE);
    printf("capsule USED_CAPSULE %s\n", ORTAGENT_DLPACK_USED_CAPSULE);
    printf("capsule VERSIONED_CAPSULE %s\n", ORTAGENT_DLPACK_VERSIONED_CAPSULE);
    printf("capsule USED_VERSIONED_CAPSULE %s\n", ORTAGENT_DLPACK_USED_VERSIONED_CAPSULE);
    PRINT_STRUCT(ortagent_dl_pack_version)
    PRINT_STRUCT(ortagent_dl_device)
    PRINT_STRUCT(ortagent_dl_data_type)
    PRINT_STRUCT(ortagent_dl_tensor)
    PRINT_STRUCT(ortagent_dl_managed_tensor)
    PRINT_STRUCT(ortagent_dl_managed_tensor_versioned)
    return 0;
}
