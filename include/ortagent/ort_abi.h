/*
 * ortagent/ort_abi.h -- ortagent's declaration of the part of the onnxruntime C ABI it uses.
 *
 * Written by the ortagent project from published facts about the ABI (function names, their
 * position in the OrtApi table, the API version that added them, parameter types and enum
 * values). No onnxruntime header is included or copied. tests/test_abi_header.py compiles
 * this file next to a genuine onnxruntime_c_api.h and checks every slot, signature and enum
 * value declared here.
 *
 * The OrtApi table is an append-only array of function pointers: API version N ships with
 * onnxruntime 1.N and a slot never moves. Each function is listed once below as
 *     X(slot, since, return type, name, (parameter types))
 * and expanded into `ortagent_slot_<name>`, `ortagent_since_<name>` and the function pointer
 * type `ortagent_fn_<name>`. Calls go through ortagent/ort_call.h.
 */
#ifndef ORTAGENT_ORT_ABI_H
#define ORTAGENT_ORT_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Oldest OrtApi version ortagent runs on (onnxruntime 1.20). Slots up to this version may be
 * called unconditionally; newer ones only after the runtime's version was checked. */
#define ORTAGENT_API_FLOOR 20
/* Newest OrtApi version any declared slot belongs to: the version ortagent asks for. */
#define ORTAGENT_API_NEWEST 24

/* ---- opaque handles ------------------------------------------------------------------- */
/* Same tags as the runtime's own, so that both declarations describe one type. */
typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtIoBinding OrtIoBinding;
typedef struct OrtSession OrtSession;
typedef struct OrtValue OrtValue;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtModelMetadata OrtModelMetadata;
typedef struct OrtCUDAProviderOptionsV2 OrtCUDAProviderOptionsV2;
typedef struct OrtSyncStream OrtSyncStream;
typedef struct OrtMapTypeInfo OrtMapTypeInfo;
typedef struct OrtSequenceTypeInfo OrtSequenceTypeInfo;
typedef struct OrtOptionalTypeInfo OrtOptionalTypeInfo;
typedef struct OrtThreadingOptions OrtThreadingOptions;
typedef struct OrtTensorRTProviderOptionsV2 OrtTensorRTProviderOptionsV2;
typedef struct OrtLoraAdapter OrtLoraAdapter;
typedef struct OrtArenaCfg OrtArenaCfg;
typedef struct OrtEpAssignedSubgraph OrtEpAssignedSubgraph;
typedef struct OrtEpAssignedNode OrtEpAssignedNode;
typedef struct OrtKeyValuePairs OrtKeyValuePairs;
typedef struct OrtHardwareDevice OrtHardwareDevice;
typedef struct OrtEpDevice OrtEpDevice;
typedef struct OrtModelCompilationOptions OrtModelCompilationOptions;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
/* OrtCustomOp is a struct of callbacks in the runtime; ortagent fills in its own
 * ortagent_custom_op_v16 (below) and passes it as a pointer to this tag. */
typedef struct OrtCustomOp OrtCustomOp;
/* The compile API's table of function pointers (ortagent indexes it, see ORTAGENT_COMPILE_FUNCTIONS). */
typedef struct OrtCompileApi OrtCompileApi;
/* OrtAllocator is a struct of callbacks in the runtime; ortagent only passes pointers to it. */
typedef struct OrtAllocator OrtAllocator;

/* ---- enums ------------------------------------------------------------------------------
 * Each enum is an X-list of (enumerator, value). Normally it expands into a typedef'd enum;
 * when ORTAGENT_ABI_CHECK_ENUMERATOR is defined (by the ABI test, after including the genuine
 * header) the typedefs are skipped and every value is checked against the genuine enumerator. */
#define ORTAGENT_ENUM_OrtErrorCode(E) \
    E(ORT_OK, 0) E(ORT_FAIL, 1) E(ORT_INVALID_ARGUMENT, 2) E(ORT_NO_SUCHFILE, 3) \
    E(ORT_NO_MODEL, 4) E(ORT_ENGINE_ERROR, 5) E(ORT_RUNTIME_EXCEPTION, 6) \
    E(ORT_INVALID_PROTOBUF, 7) E(ORT_MODEL_LOADED, 8) E(ORT_NOT_IMPLEMENTED, 9) \
    E(ORT_INVALID_GRAPH, 10) E(ORT_EP_FAIL, 11)

#define ORTAGENT_ENUM_OrtLoggingLevel(E) \
    E(ORT_LOGGING_LEVEL_VERBOSE, 0) E(ORT_LOGGING_LEVEL_INFO, 1) E(ORT_LOGGING_LEVEL_WARNING, 2) \
    E(ORT_LOGGING_LEVEL_ERROR, 3) E(ORT_LOGGING_LEVEL_FATAL, 4)

#define ORTAGENT_ENUM_ONNXTensorElementDataType(E) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, 0) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 1) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, 2) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, 3) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, 4) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, 5) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, 6) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 7) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING, 8) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, 9) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, 10) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, 11) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, 12) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, 13) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64, 14) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128, 15) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16, 16) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN, 17) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FNUZ, 18) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2, 19) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2FNUZ, 20) E(ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT4, 21) \
    E(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT4, 22)

#define ORTAGENT_ENUM_ONNXType(E) \
    E(ONNX_TYPE_UNKNOWN, 0) E(ONNX_TYPE_TENSOR, 1) E(ONNX_TYPE_SEQUENCE, 2) E(ONNX_TYPE_MAP, 3) \
    E(ONNX_TYPE_OPAQUE, 4) E(ONNX_TYPE_SPARSETENSOR, 5) E(ONNX_TYPE_OPTIONAL, 6)

#define ORTAGENT_ENUM_GraphOptimizationLevel(E) \
    E(ORT_DISABLE_ALL, 0) E(ORT_ENABLE_BASIC, 1) E(ORT_ENABLE_EXTENDED, 2) E(ORT_ENABLE_ALL, 99)

#define ORTAGENT_ENUM_ExecutionMode(E) E(ORT_SEQUENTIAL, 0) E(ORT_PARALLEL, 1)

#define ORTAGENT_ENUM_OrtAllocatorType(E) \
    E(OrtInvalidAllocator, -1) E(OrtDeviceAllocator, 0) E(OrtArenaAllocator, 1)

#define ORTAGENT_ENUM_OrtMemType(E) \
    E(OrtMemTypeCPUInput, -2) E(OrtMemTypeCPUOutput, -1) E(OrtMemTypeCPU, -1) E(OrtMemTypeDefault, 0)

#define ORTAGENT_ENUM_OrtMemoryInfoDeviceType(E) \
    E(OrtMemoryInfoDeviceType_CPU, 0) E(OrtMemoryInfoDeviceType_GPU, 1) E(OrtMemoryInfoDeviceType_FPGA, 2)

#define ORTAGENT_ENUM_OrtSparseFormat(E) \
    E(ORT_SPARSE_UNDEFINED, 0) E(ORT_SPARSE_COO, 1) E(ORT_SPARSE_CSRC, 2) E(ORT_SPARSE_BLOCK_SPARSE, 4)

#define ORTAGENT_ENUM_OrtSparseIndicesFormat(E) \
    E(ORT_SPARSE_COO_INDICES, 0) E(ORT_SPARSE_CSR_INNER_INDICES, 1) E(ORT_SPARSE_CSR_OUTER_INDICES, 2) \
    E(ORT_SPARSE_BLOCK_SPARSE_INDICES, 3)

#define ORTAGENT_ENUM_OrtCustomOpInputOutputCharacteristic(E) \
    E(INPUT_OUTPUT_REQUIRED, 0) E(INPUT_OUTPUT_OPTIONAL, 1) E(INPUT_OUTPUT_VARIADIC, 2)

#define ORTAGENT_ENUMS(LIST) \
    LIST(OrtErrorCode) LIST(OrtLoggingLevel) LIST(ONNXTensorElementDataType) LIST(ONNXType) \
    LIST(GraphOptimizationLevel) LIST(ExecutionMode) LIST(OrtAllocatorType) LIST(OrtMemType) \
    LIST(OrtMemoryInfoDeviceType) LIST(OrtSparseFormat) LIST(OrtSparseIndicesFormat) \
    LIST(OrtCustomOpInputOutputCharacteristic)

/* Enums newer than the floor, grouped by the API version that added them: ORTAGENT_ENUMS_<N>
 * lists the enums of onnxruntime 1.N. A genuine header older than 1.N lacks them, so the ABI
 * test declares ours in their place and checks their values only against newer headers. */
#define ORTAGENT_ENUM_OrtHardwareDeviceType(E) \
    E(OrtHardwareDeviceType_CPU, 0) E(OrtHardwareDeviceType_GPU, 1) E(OrtHardwareDeviceType_NPU, 2)

#define ORTAGENT_ENUM_OrtExecutionProviderDevicePolicy(E) \
    E(OrtExecutionProviderDevicePolicy_DEFAULT, 0) E(OrtExecutionProviderDevicePolicy_PREFER_CPU, 1) \
    E(OrtExecutionProviderDevicePolicy_PREFER_NPU, 2) E(OrtExecutionProviderDevicePolicy_PREFER_GPU, 3) \
    E(OrtExecutionProviderDevicePolicy_MAX_PERFORMANCE, 4) \
    E(OrtExecutionProviderDevicePolicy_MAX_EFFICIENCY, 5) \
    E(OrtExecutionProviderDevicePolicy_MIN_OVERALL_POWER, 6)

#define ORTAGENT_ENUM_OrtDeviceMemoryType(E) \
    E(OrtDeviceMemoryType_DEFAULT, 0) E(OrtDeviceMemoryType_HOST_ACCESSIBLE, 5)

#define ORTAGENT_ENUMS_22(LIST) LIST(OrtHardwareDeviceType) LIST(OrtExecutionProviderDevicePolicy)
#define ORTAGENT_ENUMS_23(LIST) LIST(OrtDeviceMemoryType)
/* Every newer enum with its version: LIST(type, since). */
#define ORTAGENT_NEWER_ENUMS(LIST) \
    LIST(OrtHardwareDeviceType, 22) LIST(OrtExecutionProviderDevicePolicy, 22) \
    LIST(OrtDeviceMemoryType, 23)

#define ORTAGENT_ENUMERATOR_(name, value) name = value,
#define ORTAGENT_DECLARE_ENUM_(type) typedef enum type { ORTAGENT_ENUM_##type(ORTAGENT_ENUMERATOR_) } type;
#ifndef ORTAGENT_ABI_CHECK_ENUMERATOR
ORTAGENT_ENUMS(ORTAGENT_DECLARE_ENUM_)
ORTAGENT_ENUMS_22(ORTAGENT_DECLARE_ENUM_)
ORTAGENT_ENUMS_23(ORTAGENT_DECLARE_ENUM_)
#else
/* The genuine header names this enum by its tag alone; give it the typedef name used below. */
typedef enum OrtSparseIndicesFormat OrtSparseIndicesFormat;
/* Enums the genuine header is too old to have (ORT_API_VERSION is the genuine header's). */
#if ORT_API_VERSION < 22
ORTAGENT_ENUMS_22(ORTAGENT_DECLARE_ENUM_)
#endif
#if ORT_API_VERSION < 23
ORTAGENT_ENUMS_23(ORTAGENT_DECLARE_ENUM_)
#endif
#endif
#undef ORTAGENT_DECLARE_ENUM_
#undef ORTAGENT_ENUMERATOR_

/* Callbacks the runtime calls. */
/* OrtWriteBufferFunc: write `size` bytes of the output model; return NULL or an OrtStatus. */
typedef OrtStatus* (*ortagent_write_buffer_fn)(void* state, const void* buffer, size_t size);

/* The members of OrtAllocator that every version has, in order: what ortagent fills in to give
 * onnxruntime an allocator of its own (cpu_pool.h). `version` is set to 1, so onnxruntime reads
 * none of the members later versions append (Reserve, GetStats, AllocOnStream, ...): each is
 * read only when `version` is at least the version that added it. */
typedef struct ortagent_allocator_v1 {
    uint32_t version;
    void* (*Alloc)(struct ortagent_allocator_v1* self, size_t size);
    void (*Free)(struct ortagent_allocator_v1* self, void* p);
    const OrtMemoryInfo* (*Info)(const struct ortagent_allocator_v1* self);
} ortagent_allocator_v1;

/* KernelContext_ParallelFor's work item: fn(user data, index) for each index below the total. */
typedef void (*ortagent_parallel_fn)(void* data, size_t index);

/* The members of OrtCustomOp up to KernelComputeV2, in order: what ortagent fills in for each
 * operator of its CPU kernels (cpu_kernels.h). `version` is set to 16, the version that added
 * CreateKernelV2 and KernelComputeV2: onnxruntime reads a member that a later version appended
 * (InferOutputShapeFn, GetStartVersion, GetMayInplace, ...) only when `version` is at least
 * that version, and refuses a `version` newer than its own. */
typedef struct ortagent_custom_op_v16 ortagent_custom_op_v16;
struct ortagent_custom_op_v16 {
    uint32_t version;
    void* (*CreateKernel)(const ortagent_custom_op_v16* op, const void* api, const OrtKernelInfo* info);
    const char* (*GetName)(const ortagent_custom_op_v16* op);
    const char* (*GetExecutionProviderType)(const ortagent_custom_op_v16* op);
    ONNXTensorElementDataType (*GetInputType)(const ortagent_custom_op_v16* op, size_t index);
    size_t (*GetInputTypeCount)(const ortagent_custom_op_v16* op);
    ONNXTensorElementDataType (*GetOutputType)(const ortagent_custom_op_v16* op, size_t index);
    size_t (*GetOutputTypeCount)(const ortagent_custom_op_v16* op);
    void (*KernelCompute)(void* kernel, OrtKernelContext* context);
    void (*KernelDestroy)(void* kernel);
    OrtCustomOpInputOutputCharacteristic (*GetInputCharacteristic)(const ortagent_custom_op_v16* op, size_t index);
    OrtCustomOpInputOutputCharacteristic (*GetOutputCharacteristic)(const ortagent_custom_op_v16* op, size_t index);
    OrtMemType (*GetInputMemoryType)(const ortagent_custom_op_v16* op, size_t index);
    int (*GetVariadicInputMinArity)(const ortagent_custom_op_v16* op);
    int (*GetVariadicInputHomogeneity)(const ortagent_custom_op_v16* op);
    int (*GetVariadicOutputMinArity)(const ortagent_custom_op_v16* op);
    int (*GetVariadicOutputHomogeneity)(const ortagent_custom_op_v16* op);
    OrtStatus* (*CreateKernelV2)(const ortagent_custom_op_v16* op, const void* api, const OrtKernelInfo* info,
                                 void** kernel);
    OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);
};

/* ---- entry points ----------------------------------------------------------------------- */
/* The one exported symbol: OrtGetApiBase() returns a pointer to this pair of functions. */
typedef struct ortagent_api_base {
    const void* (*get_api)(uint32_t api_version);  /* NULL when the runtime is older */
    const char* (*get_version_string)(void);       /* "1.N.P" */
} ortagent_api_base;
typedef const ortagent_api_base* (*ortagent_get_api_base_fn)(void);
#define ORTAGENT_GET_API_BASE_SYMBOL "OrtGetApiBase"

/* ---- OrtApi slots ------------------------------------------------------------------------
 * Functions with since <= ORTAGENT_API_FLOOR. X(slot, since, return type, name, (parameters)) */
#define ORTAGENT_ORT_FLOOR_FUNCTIONS(X) \
    X(  0,  1, OrtStatus*, CreateStatus, (OrtErrorCode, const char*)) \
    X(  1,  1, OrtErrorCode, GetErrorCode, (const OrtStatus*)) \
    X(  2,  1, const char*, GetErrorMessage, (const OrtStatus*)) \
    X(  3,  1, OrtStatus*, CreateEnv, (OrtLoggingLevel, const char*, OrtEnv**)) \
    X(  5,  1, OrtStatus*, EnableTelemetryEvents, (const OrtEnv*)) \
    X(  6,  1, OrtStatus*, DisableTelemetryEvents, (const OrtEnv*)) \
    X(  7,  1, OrtStatus*, CreateSession, (const OrtEnv*, const char*, const OrtSessionOptions*, OrtSession**)) \
    X(  8,  1, OrtStatus*, CreateSessionFromArray, (const OrtEnv*, const void*, size_t, const OrtSessionOptions*, OrtSession**)) \
    X(  9,  1, OrtStatus*, Run, (OrtSession*, const OrtRunOptions*, const char* const*, const OrtValue* const*, size_t, const char* const*, size_t, OrtValue**)) \
    X( 10,  1, OrtStatus*, CreateSessionOptions, (OrtSessionOptions**)) \
    X( 11,  1, OrtStatus*, SetOptimizedModelFilePath, (OrtSessionOptions*, const char*)) \
    X( 12,  1, OrtStatus*, CloneSessionOptions, (const OrtSessionOptions*, OrtSessionOptions**)) \
    X( 13,  1, OrtStatus*, SetSessionExecutionMode, (OrtSessionOptions*, ExecutionMode)) \
    X( 14,  1, OrtStatus*, EnableProfiling, (OrtSessionOptions*, const char*)) \
    X( 15,  1, OrtStatus*, DisableProfiling, (OrtSessionOptions*)) \
    X( 16,  1, OrtStatus*, EnableMemPattern, (OrtSessionOptions*)) \
    X( 17,  1, OrtStatus*, DisableMemPattern, (OrtSessionOptions*)) \
    X( 18,  1, OrtStatus*, EnableCpuMemArena, (OrtSessionOptions*)) \
    X( 19,  1, OrtStatus*, DisableCpuMemArena, (OrtSessionOptions*)) \
    X( 20,  1, OrtStatus*, SetSessionLogId, (OrtSessionOptions*, const char*)) \
    X( 21,  1, OrtStatus*, SetSessionLogVerbosityLevel, (OrtSessionOptions*, int)) \
    X( 22,  1, OrtStatus*, SetSessionLogSeverityLevel, (OrtSessionOptions*, int)) \
    X( 23,  1, OrtStatus*, SetSessionGraphOptimizationLevel, (OrtSessionOptions*, GraphOptimizationLevel)) \
    X( 24,  1, OrtStatus*, SetIntraOpNumThreads, (OrtSessionOptions*, int)) \
    X( 25,  1, OrtStatus*, SetInterOpNumThreads, (OrtSessionOptions*, int)) \
    X( 26,  1, OrtStatus*, CreateCustomOpDomain, (const char*, OrtCustomOpDomain**)) \
    X( 27,  1, OrtStatus*, CustomOpDomain_Add, (OrtCustomOpDomain*, const OrtCustomOp*)) \
    X( 28,  1, OrtStatus*, AddCustomOpDomain, (OrtSessionOptions*, OrtCustomOpDomain*)) \
    X( 30,  1, OrtStatus*, SessionGetInputCount, (const OrtSession*, size_t*)) \
    X( 31,  1, OrtStatus*, SessionGetOutputCount, (const OrtSession*, size_t*)) \
    X( 32,  1, OrtStatus*, SessionGetOverridableInitializerCount, (const OrtSession*, size_t*)) \
    X( 33,  1, OrtStatus*, SessionGetInputTypeInfo, (const OrtSession*, size_t, OrtTypeInfo**)) \
    X( 34,  1, OrtStatus*, SessionGetOutputTypeInfo, (const OrtSession*, size_t, OrtTypeInfo**)) \
    X( 35,  1, OrtStatus*, SessionGetOverridableInitializerTypeInfo, (const OrtSession*, size_t, OrtTypeInfo**)) \
    X( 36,  1, OrtStatus*, SessionGetInputName, (const OrtSession*, size_t, OrtAllocator*, char**)) \
    X( 37,  1, OrtStatus*, SessionGetOutputName, (const OrtSession*, size_t, OrtAllocator*, char**)) \
    X( 38,  1, OrtStatus*, SessionGetOverridableInitializerName, (const OrtSession*, size_t, OrtAllocator*, char**)) \
    X( 39,  1, OrtStatus*, CreateRunOptions, (OrtRunOptions**)) \
    X( 40,  1, OrtStatus*, RunOptionsSetRunLogVerbosityLevel, (OrtRunOptions*, int)) \
    X( 41,  1, OrtStatus*, RunOptionsSetRunLogSeverityLevel, (OrtRunOptions*, int)) \
    X( 42,  1, OrtStatus*, RunOptionsSetRunTag, (OrtRunOptions*, const char*)) \
    X( 43,  1, OrtStatus*, RunOptionsGetRunLogVerbosityLevel, (const OrtRunOptions*, int*)) \
    X( 44,  1, OrtStatus*, RunOptionsGetRunLogSeverityLevel, (const OrtRunOptions*, int*)) \
    X( 45,  1, OrtStatus*, RunOptionsGetRunTag, (const OrtRunOptions*, const char**)) \
    X( 46,  1, OrtStatus*, RunOptionsSetTerminate, (OrtRunOptions*)) \
    X( 47,  1, OrtStatus*, RunOptionsUnsetTerminate, (OrtRunOptions*)) \
    X( 48,  1, OrtStatus*, CreateTensorAsOrtValue, (OrtAllocator*, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)) \
    X( 49,  1, OrtStatus*, CreateTensorWithDataAsOrtValue, (const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)) \
    X( 50,  1, OrtStatus*, IsTensor, (const OrtValue*, int*)) \
    X( 51,  1, OrtStatus*, GetTensorMutableData, (OrtValue*, void**)) \
    X( 52,  1, OrtStatus*, FillStringTensor, (OrtValue*, const char* const*, size_t)) \
    X( 53,  1, OrtStatus*, GetStringTensorDataLength, (const OrtValue*, size_t*)) \
    X( 54,  1, OrtStatus*, GetStringTensorContent, (const OrtValue*, void*, size_t, size_t*, size_t)) \
    X( 55,  1, OrtStatus*, CastTypeInfoToTensorInfo, (const OrtTypeInfo*, const OrtTensorTypeAndShapeInfo**)) \
    X( 56,  1, OrtStatus*, GetOnnxTypeFromTypeInfo, (const OrtTypeInfo*, ONNXType*)) \
    X( 60,  1, OrtStatus*, GetTensorElementType, (const OrtTensorTypeAndShapeInfo*, ONNXTensorElementDataType*)) \
    X( 61,  1, OrtStatus*, GetDimensionsCount, (const OrtTensorTypeAndShapeInfo*, size_t*)) \
    X( 62,  1, OrtStatus*, GetDimensions, (const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)) \
    X( 63,  1, OrtStatus*, GetSymbolicDimensions, (const OrtTensorTypeAndShapeInfo*, const char**, size_t)) \
    X( 64,  1, OrtStatus*, GetTensorShapeElementCount, (const OrtTensorTypeAndShapeInfo*, size_t*)) \
    X( 65,  1, OrtStatus*, GetTensorTypeAndShape, (const OrtValue*, OrtTensorTypeAndShapeInfo**)) \
    X( 66,  1, OrtStatus*, GetTypeInfo, (const OrtValue*, OrtTypeInfo**)) \
    X( 67,  1, OrtStatus*, GetValueType, (const OrtValue*, ONNXType*)) \
    X( 68,  1, OrtStatus*, CreateMemoryInfo, (const char*, OrtAllocatorType, int, OrtMemType, OrtMemoryInfo**)) \
    X( 69,  1, OrtStatus*, CreateCpuMemoryInfo, (OrtAllocatorType, OrtMemType, OrtMemoryInfo**)) \
    X( 70,  1, OrtStatus*, CompareMemoryInfo, (const OrtMemoryInfo*, const OrtMemoryInfo*, int*)) \
    X( 71,  1, OrtStatus*, MemoryInfoGetName, (const OrtMemoryInfo*, const char**)) \
    X( 72,  1, OrtStatus*, MemoryInfoGetId, (const OrtMemoryInfo*, int*)) \
    X( 73,  1, OrtStatus*, MemoryInfoGetMemType, (const OrtMemoryInfo*, OrtMemType*)) \
    X( 74,  1, OrtStatus*, MemoryInfoGetType, (const OrtMemoryInfo*, OrtAllocatorType*)) \
    X( 75,  1, OrtStatus*, AllocatorAlloc, (OrtAllocator*, size_t, void**)) \
    X( 76,  1, OrtStatus*, AllocatorFree, (OrtAllocator*, void*)) \
    X( 77,  1, OrtStatus*, AllocatorGetInfo, (const OrtAllocator*, const OrtMemoryInfo**)) \
    X( 78,  1, OrtStatus*, GetAllocatorWithDefaultOptions, (OrtAllocator**)) \
    X( 79,  1, OrtStatus*, AddFreeDimensionOverride, (OrtSessionOptions*, const char*, int64_t)) \
    X( 80,  1, OrtStatus*, GetValue, (const OrtValue*, int, OrtAllocator*, OrtValue**)) \
    X( 81,  1, OrtStatus*, GetValueCount, (const OrtValue*, size_t*)) \
    X( 82,  1, OrtStatus*, CreateValue, (const OrtValue* const*, size_t, ONNXType, OrtValue**)) \
    X( 85,  1, OrtStatus*, KernelInfoGetAttribute_float, (const OrtKernelInfo*, const char*, float*)) \
    X( 86,  1, OrtStatus*, KernelInfoGetAttribute_int64, (const OrtKernelInfo*, const char*, int64_t*)) \
    X( 88,  1, OrtStatus*, KernelContext_GetInputCount, (const OrtKernelContext*, size_t*)) \
    X( 89,  1, OrtStatus*, KernelContext_GetOutputCount, (const OrtKernelContext*, size_t*)) \
    X( 90,  1, OrtStatus*, KernelContext_GetInput, (const OrtKernelContext*, size_t, const OrtValue**)) \
    X( 91,  1, OrtStatus*, KernelContext_GetOutput, (OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)) \
    X( 92,  1, void, ReleaseEnv, (OrtEnv*)) \
    X( 93,  1, void, ReleaseStatus, (OrtStatus*)) \
    X( 94,  1, void, ReleaseMemoryInfo, (OrtMemoryInfo*)) \
    X( 95,  1, void, ReleaseSession, (OrtSession*)) \
    X( 96,  1, void, ReleaseValue, (OrtValue*)) \
    X( 97,  1, void, ReleaseRunOptions, (OrtRunOptions*)) \
    X( 98,  1, void, ReleaseTypeInfo, (OrtTypeInfo*)) \
    X( 99,  1, void, ReleaseTensorTypeAndShapeInfo, (OrtTensorTypeAndShapeInfo*)) \
    X(100,  1, void, ReleaseSessionOptions, (OrtSessionOptions*)) \
    X(101,  1, void, ReleaseCustomOpDomain, (OrtCustomOpDomain*)) \
    X(103,  2, OrtStatus*, CastTypeInfoToMapTypeInfo, (const OrtTypeInfo*, const OrtMapTypeInfo**)) \
    X(104,  2, OrtStatus*, CastTypeInfoToSequenceTypeInfo, (const OrtTypeInfo*, const OrtSequenceTypeInfo**)) \
    X(105,  2, OrtStatus*, GetMapKeyType, (const OrtMapTypeInfo*, ONNXTensorElementDataType*)) \
    X(106,  2, OrtStatus*, GetMapValueType, (const OrtMapTypeInfo*, OrtTypeInfo**)) \
    X(107,  2, OrtStatus*, GetSequenceElementType, (const OrtSequenceTypeInfo*, OrtTypeInfo**)) \
    X(110,  2, OrtStatus*, SessionEndProfiling, (OrtSession*, OrtAllocator*, char**)) \
    X(111,  2, OrtStatus*, SessionGetModelMetadata, (const OrtSession*, OrtModelMetadata**)) \
    X(112,  2, OrtStatus*, ModelMetadataGetProducerName, (const OrtModelMetadata*, OrtAllocator*, char**)) \
    X(113,  2, OrtStatus*, ModelMetadataGetGraphName, (const OrtModelMetadata*, OrtAllocator*, char**)) \
    X(114,  2, OrtStatus*, ModelMetadataGetDomain, (const OrtModelMetadata*, OrtAllocator*, char**)) \
    X(115,  2, OrtStatus*, ModelMetadataGetDescription, (const OrtModelMetadata*, OrtAllocator*, char**)) \
    X(116,  2, OrtStatus*, ModelMetadataLookupCustomMetadataMap, (const OrtModelMetadata*, OrtAllocator*, const char*, char**)) \
    X(117,  2, OrtStatus*, ModelMetadataGetVersion, (const OrtModelMetadata*, int64_t*)) \
    X(118,  2, void, ReleaseModelMetadata, (OrtModelMetadata*)) \
    X(119,  3, OrtStatus*, CreateEnvWithGlobalThreadPools, (OrtLoggingLevel, const char*, const OrtThreadingOptions*, OrtEnv**)) \
    X(120,  3, OrtStatus*, DisablePerSessionThreads, (OrtSessionOptions*)) \
    X(121,  3, OrtStatus*, CreateThreadingOptions, (OrtThreadingOptions**)) \
    X(122,  3, void, ReleaseThreadingOptions, (OrtThreadingOptions*)) \
    X(123,  3, OrtStatus*, ModelMetadataGetCustomMetadataMapKeys, (const OrtModelMetadata*, OrtAllocator*, char***, int64_t*)) \
    X(124,  3, OrtStatus*, AddFreeDimensionOverrideByName, (OrtSessionOptions*, const char*, int64_t)) \
    X(125,  4, OrtStatus*, GetAvailableProviders, (char***, int*)) \
    X(126,  4, OrtStatus*, ReleaseAvailableProviders, (char**, int)) \
    X(127,  5, OrtStatus*, GetStringTensorElementLength, (const OrtValue*, size_t, size_t*)) \
    X(128,  5, OrtStatus*, GetStringTensorElement, (const OrtValue*, size_t, size_t, void*)) \
    X(129,  5, OrtStatus*, FillStringTensorElement, (OrtValue*, const char*, size_t)) \
    X(130,  5, OrtStatus*, AddSessionConfigEntry, (OrtSessionOptions*, const char*, const char*)) \
    X(131,  5, OrtStatus*, CreateAllocator, (const OrtSession*, const OrtMemoryInfo*, OrtAllocator**)) \
    X(132,  5, void, ReleaseAllocator, (OrtAllocator*)) \
    X(133,  5, OrtStatus*, RunWithBinding, (OrtSession*, const OrtRunOptions*, const OrtIoBinding*)) \
    X(134,  5, OrtStatus*, CreateIoBinding, (OrtSession*, OrtIoBinding**)) \
    X(135,  5, void, ReleaseIoBinding, (OrtIoBinding*)) \
    X(136,  5, OrtStatus*, BindInput, (OrtIoBinding*, const char*, const OrtValue*)) \
    X(137,  5, OrtStatus*, BindOutput, (OrtIoBinding*, const char*, const OrtValue*)) \
    X(138,  5, OrtStatus*, BindOutputToDevice, (OrtIoBinding*, const char*, const OrtMemoryInfo*)) \
    X(139,  5, OrtStatus*, GetBoundOutputNames, (const OrtIoBinding*, OrtAllocator*, char**, size_t**, size_t*)) \
    X(140,  5, OrtStatus*, GetBoundOutputValues, (const OrtIoBinding*, OrtAllocator*, OrtValue***, size_t*)) \
    X(141,  5, void, ClearBoundInputs, (OrtIoBinding*)) \
    X(142,  5, void, ClearBoundOutputs, (OrtIoBinding*)) \
    X(144,  5, OrtStatus*, CreateAndRegisterAllocator, (OrtEnv*, const OrtMemoryInfo*, const OrtArenaCfg*)) \
    X(146,  5, OrtStatus*, SessionGetProfilingStartTimeNs, (const OrtSession*, uint64_t*)) \
    X(147,  5, OrtStatus*, SetGlobalIntraOpNumThreads, (OrtThreadingOptions*, int)) \
    X(148,  5, OrtStatus*, SetGlobalInterOpNumThreads, (OrtThreadingOptions*, int)) \
    X(150,  6, OrtStatus*, AddInitializer, (OrtSessionOptions*, const char*, const OrtValue*)) \
    X(157,  6, void, ReleaseArenaCfg, (OrtArenaCfg*)) \
    X(158,  7, OrtStatus*, ModelMetadataGetGraphDescription, (const OrtModelMetadata*, OrtAllocator*, char**)) \
    X(164,  8, OrtStatus*, CreateArenaCfgV2, (const char* const*, const size_t*, size_t, OrtArenaCfg**)) \
    X(165,  8, OrtStatus*, AddRunConfigEntry, (OrtRunOptions*, const char*, const char*)) \
    X(170,  9, OrtStatus*, SessionOptionsAppendExecutionProvider_TensorRT_V2, (OrtSessionOptions*, const OrtTensorRTProviderOptionsV2*)) \
    X(171,  9, OrtStatus*, CreateTensorRTProviderOptions, (OrtTensorRTProviderOptionsV2**)) \
    X(172,  9, OrtStatus*, UpdateTensorRTProviderOptions, (OrtTensorRTProviderOptionsV2*, const char* const*, const char* const*, size_t)) \
    X(174,  9, void, ReleaseTensorRTProviderOptions, (OrtTensorRTProviderOptionsV2*)) \
    X(179,  9, OrtStatus*, CreateSparseTensorAsOrtValue, (OrtAllocator*, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)) \
    X(180,  9, OrtStatus*, FillSparseTensorCoo, (OrtValue*, const OrtMemoryInfo*, const int64_t*, size_t, const void*, const int64_t*, size_t)) \
    X(181,  9, OrtStatus*, FillSparseTensorCsr, (OrtValue*, const OrtMemoryInfo*, const int64_t*, size_t, const void*, const int64_t*, size_t, const int64_t*, size_t)) \
    X(183,  9, OrtStatus*, CreateSparseTensorWithValuesAsOrtValue, (const OrtMemoryInfo*, void*, const int64_t*, size_t, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)) \
    X(184,  9, OrtStatus*, UseCooIndices, (OrtValue*, int64_t*, size_t)) \
    X(185,  9, OrtStatus*, UseCsrIndices, (OrtValue*, int64_t*, size_t, int64_t*, size_t)) \
    X(187,  9, OrtStatus*, GetSparseTensorFormat, (const OrtValue*, OrtSparseFormat*)) \
    X(188,  9, OrtStatus*, GetSparseTensorValuesTypeAndShape, (const OrtValue*, OrtTensorTypeAndShapeInfo**)) \
    X(189,  9, OrtStatus*, GetSparseTensorValues, (const OrtValue*, const void**)) \
    X(190,  9, OrtStatus*, GetSparseTensorIndicesTypeShape, (const OrtValue*, OrtSparseIndicesFormat, OrtTensorTypeAndShapeInfo**)) \
    X(191,  9, OrtStatus*, GetSparseTensorIndices, (const OrtValue*, OrtSparseIndicesFormat, size_t*, const void**)) \
    X(192, 10, OrtStatus*, HasValue, (const OrtValue*, int*)) \
    X(194, 10, OrtStatus*, GetTensorMemoryInfo, (const OrtValue*, const OrtMemoryInfo**)) \
    X(202, 10, OrtStatus*, SynchronizeBoundInputs, (OrtIoBinding*)) \
    X(203, 10, OrtStatus*, SynchronizeBoundOutputs, (OrtIoBinding*)) \
    X(204, 11, OrtStatus*, SessionOptionsAppendExecutionProvider_CUDA_V2, (OrtSessionOptions*, const OrtCUDAProviderOptionsV2*)) \
    X(205, 11, OrtStatus*, CreateCUDAProviderOptions, (OrtCUDAProviderOptionsV2**)) \
    X(206, 11, OrtStatus*, UpdateCUDAProviderOptions, (OrtCUDAProviderOptionsV2*, const char* const*, const char* const*, size_t)) \
    X(207, 11, OrtStatus*, GetCUDAProviderOptionsAsString, (const OrtCUDAProviderOptionsV2*, OrtAllocator*, char**)) \
    X(208, 11, void, ReleaseCUDAProviderOptions, (OrtCUDAProviderOptionsV2*)) \
    X(210, 12, OrtStatus*, AddExternalInitializers, (OrtSessionOptions*, const char* const*, const OrtValue* const*, size_t)) \
    X(216, 12, OrtStatus*, SessionOptionsAppendExecutionProvider, (OrtSessionOptions*, const char*, const char* const*, const char* const*, size_t)) \
    X(225, 14, void, MemoryInfoGetDeviceType, (const OrtMemoryInfo*, OrtMemoryInfoDeviceType*)) \
    X(226, 14, OrtStatus*, UpdateEnvWithCustomLogLevel, (OrtEnv*, OrtLoggingLevel)) \
    X(228, 14, OrtStatus*, RegisterCustomOpsLibrary_V2, (OrtSessionOptions*, const char*)) \
    X(237, 14, OrtStatus*, HasSessionConfigEntry, (const OrtSessionOptions*, const char*, int*)) \
    X(238, 14, OrtStatus*, GetSessionConfigEntry, (const OrtSessionOptions*, const char*, char*, size_t*)) \
    X(250, 15, OrtStatus*, CastTypeInfoToOptionalTypeInfo, (const OrtTypeInfo*, const OrtOptionalTypeInfo**)) \
    X(251, 15, OrtStatus*, GetOptionalContainedTypeInfo, (const OrtOptionalTypeInfo*, OrtTypeInfo**)) \
    X(252, 15, OrtStatus*, GetResizedStringTensorElementBuffer, (OrtValue*, size_t, size_t, char**)) \
    X(254, 15, const char*, GetBuildInfoString, (void)) \
    X(259, 16, OrtStatus*, CreateAndRegisterAllocatorV2, (OrtEnv*, const char*, const OrtMemoryInfo*, const OrtArenaCfg*, const char* const*, const char* const*, size_t)) \
    X(273, 17, OrtStatus*, SetDeterministicCompute, (OrtSessionOptions*, bool)) \
    X(274, 17, OrtStatus*, KernelContext_ParallelFor, (const OrtKernelContext*, ortagent_parallel_fn, size_t, size_t, void*)) \
    X(279, 18, OrtStatus*, AddExternalInitializersFromFilesInMemory, (OrtSessionOptions*, const char* const*, char* const*, const size_t*, size_t)) \
    X(280, 20, OrtStatus*, CreateLoraAdapter, (const char*, OrtAllocator*, OrtLoraAdapter**)) \
    X(281, 20, OrtStatus*, CreateLoraAdapterFromArray, (const void*, size_t, OrtAllocator*, OrtLoraAdapter**)) \
    X(282, 20, void, ReleaseLoraAdapter, (OrtLoraAdapter*)) \
    X(283, 20, OrtStatus*, RunOptionsAddActiveLoraAdapter, (OrtRunOptions*, const OrtLoraAdapter*)) \
    X(284, 20, OrtStatus*, SetEpDynamicOptions, (OrtSession*, const char* const*, const char* const*, size_t))

/* Functions newer than ORTAGENT_API_FLOOR. All return OrtStatus*, and their parameters are
 * named so that ort_call.h can define a stand-in that reports the missing version. */
#define ORTAGENT_ORT_NEWER_FUNCTIONS(X) \
    X(301, 22, OrtStatus*, RegisterExecutionProviderLibrary, (OrtEnv* env, const char* name, \
                                                              const char* path)) \
    X(302, 22, OrtStatus*, UnregisterExecutionProviderLibrary, (OrtEnv* env, const char* name)) \
    X(303, 22, OrtStatus*, GetEpDevices, (const OrtEnv* env, const OrtEpDevice* const** devices, \
                                          size_t* count)) \
    X(304, 22, OrtStatus*, SessionOptionsAppendExecutionProvider_V2, \
      (OrtSessionOptions* options, OrtEnv* env, const OrtEpDevice* const* devices, size_t count, \
       const char* const* keys, const char* const* values, size_t option_count)) \
    X(305, 22, OrtStatus*, SessionOptionsSetEpSelectionPolicy, \
      (OrtSessionOptions* options, OrtExecutionProviderDevicePolicy policy)) \
    X(318, 23, OrtStatus*, GetTensorSizeInBytes, (const OrtValue* value, size_t* size)) \
    X(320, 23, OrtStatus*, CreateMemoryInfo_V2, \
      (const char* name, OrtMemoryInfoDeviceType device_type, uint32_t vendor_id, int32_t device_id, \
       OrtDeviceMemoryType mem_type, size_t alignment, OrtAllocatorType allocator_type, \
       OrtMemoryInfo** out)) \
    X(380, 23, OrtStatus*, SessionGetMemoryInfoForInputs, (const OrtSession* session, \
                                                           const OrtMemoryInfo** infos, \
                                                           size_t count)) \
    X(381, 23, OrtStatus*, SessionGetMemoryInfoForOutputs, (const OrtSession* session, \
                                                            const OrtMemoryInfo** infos, \
                                                            size_t count)) \
    X(382, 23, OrtStatus*, SessionGetEpDeviceForInputs, (const OrtSession* session, \
                                                         const OrtEpDevice** devices, size_t count)) \
    X(383, 23, OrtStatus*, CreateSyncStreamForEpDevice, (const OrtEpDevice* ep_device, \
                                                         const OrtKeyValuePairs* options, \
                                                         OrtSyncStream** stream)) \
    X(386, 23, OrtStatus*, CopyTensors, (const OrtEnv* env, const OrtValue* const* sources, \
                                         OrtValue* const* destinations, OrtSyncStream* stream, \
                                         size_t count)) \
    X(407, 24, OrtStatus*, Session_GetEpGraphAssignmentInfo, \
      (const OrtSession* session, const OrtEpAssignedSubgraph* const** subgraphs, size_t* count)) \
    X(408, 24, OrtStatus*, EpAssignedSubgraph_GetEpName, (const OrtEpAssignedSubgraph* subgraph, \
                                                          const char** name)) \
    X(409, 24, OrtStatus*, EpAssignedSubgraph_GetNodes, \
      (const OrtEpAssignedSubgraph* subgraph, const OrtEpAssignedNode* const** nodes, size_t* count)) \
    X(410, 24, OrtStatus*, EpAssignedNode_GetName, (const OrtEpAssignedNode* node, const char** name)) \
    X(411, 24, OrtStatus*, EpAssignedNode_GetDomain, (const OrtEpAssignedNode* node, const char** domain)) \
    X(412, 24, OrtStatus*, EpAssignedNode_GetOperatorType, (const OrtEpAssignedNode* node, \
                                                            const char** op_type)) \
    X(414, 24, OrtStatus*, GetTensorElementTypeAndShapeDataReference, \
      (const OrtValue* value, ONNXTensorElementDataType* elem_type, const int64_t** shape_data, \
       size_t* shape_data_count))

/* Functions newer than ORTAGENT_API_FLOOR that return a plain value (not an OrtStatus*). They
 * cannot report a missing version themselves: ort_call.h's stand-in returns a zero value (NULL,
 * 0), and callers check ORTAGENT_HAS(name) first to raise the error naming the version. */
#define ORTAGENT_ORT_NEWER_VALUE_FUNCTIONS(X) \
    X(294, 22, const OrtCompileApi*, GetCompileApi, (void)) \
    X(307, 22, OrtHardwareDeviceType, HardwareDevice_Type, (const OrtHardwareDevice* device)) \
    X(308, 22, uint32_t, HardwareDevice_VendorId, (const OrtHardwareDevice* device)) \
    X(309, 22, const char*, HardwareDevice_Vendor, (const OrtHardwareDevice* device)) \
    X(310, 22, uint32_t, HardwareDevice_DeviceId, (const OrtHardwareDevice* device)) \
    X(311, 22, const OrtKeyValuePairs*, HardwareDevice_Metadata, (const OrtHardwareDevice* device)) \
    X(312, 22, const char*, EpDevice_EpName, (const OrtEpDevice* ep_device)) \
    X(313, 22, const char*, EpDevice_EpVendor, (const OrtEpDevice* ep_device)) \
    X(314, 22, const OrtKeyValuePairs*, EpDevice_EpMetadata, (const OrtEpDevice* ep_device)) \
    X(315, 22, const OrtKeyValuePairs*, EpDevice_EpOptions, (const OrtEpDevice* ep_device)) \
    X(316, 22, const OrtHardwareDevice*, EpDevice_Device, (const OrtEpDevice* ep_device)) \
    X(321, 23, OrtDeviceMemoryType, MemoryInfoGetDeviceMemType, (const OrtMemoryInfo* info)) \
    X(322, 23, uint32_t, MemoryInfoGetVendorId, (const OrtMemoryInfo* info)) \
    X(374, 23, const OrtMemoryInfo*, EpDevice_MemoryInfo, (const OrtEpDevice* ep_device, \
                                                           OrtDeviceMemoryType memory_type)) \
    X(384, 23, void*, SyncStream_GetHandle, (OrtSyncStream* stream))

/* Functions newer than ORTAGENT_API_FLOOR that return nothing: their stand-in does nothing
 * (callers check ORTAGENT_HAS(name) first, and set out-parameters before the call). */
#define ORTAGENT_ORT_NEWER_VOID_FUNCTIONS(X) \
    X(298, 22, void, GetKeyValuePairs, (const OrtKeyValuePairs* kvps, const char* const** keys, \
                                        const char* const** values, size_t* count)) \
    X(385, 23, void, ReleaseSyncStream, (OrtSyncStream* stream))

/* ---- OrtCompileApi slots -----------------------------------------------------------------
 * A second table of function pointers, returned by OrtApi::GetCompileApi (1.22); it grows
 * append-only with the runtime's versions as OrtApi does. Same X form; slots index that table.
 * Calls go through ORTAGENT_COMPILE_CALL (ort_call.h), which checks each slot's version. */
#define ORTAGENT_COMPILE_FUNCTIONS(X) \
    X( 1, 22, OrtStatus*, CreateModelCompilationOptionsFromSessionOptions, \
      (const OrtEnv* env, const OrtSessionOptions* session_options, OrtModelCompilationOptions** out)) \
    X( 2, 22, OrtStatus*, ModelCompilationOptions_SetInputModelPath, \
      (OrtModelCompilationOptions* options, const char* path)) \
    X( 3, 22, OrtStatus*, ModelCompilationOptions_SetInputModelFromBuffer, \
      (OrtModelCompilationOptions* options, const void* data, size_t size)) \
    X( 4, 22, OrtStatus*, ModelCompilationOptions_SetOutputModelPath, \
      (OrtModelCompilationOptions* options, const char* path)) \
    X( 5, 22, OrtStatus*, ModelCompilationOptions_SetOutputModelExternalInitializersFile, \
      (OrtModelCompilationOptions* options, const char* path, size_t size_threshold)) \
    X( 6, 22, OrtStatus*, ModelCompilationOptions_SetOutputModelBuffer, \
      (OrtModelCompilationOptions* options, OrtAllocator* allocator, void** buffer, size_t* size)) \
    X( 7, 22, OrtStatus*, ModelCompilationOptions_SetEpContextEmbedMode, \
      (OrtModelCompilationOptions* options, bool embed)) \
    X( 8, 22, OrtStatus*, CompileModel, (const OrtEnv* env, const OrtModelCompilationOptions* options)) \
    X( 9, 23, OrtStatus*, ModelCompilationOptions_SetFlags, \
      (OrtModelCompilationOptions* options, uint32_t flags)) \
    X(11, 23, OrtStatus*, ModelCompilationOptions_SetGraphOptimizationLevel, \
      (OrtModelCompilationOptions* options, GraphOptimizationLevel level)) \
    X(12, 23, OrtStatus*, ModelCompilationOptions_SetOutputModelWriteFunc, \
      (OrtModelCompilationOptions* options, ortagent_write_buffer_fn write, void* state))

/* The compile table's functions that return nothing (stand-in: does nothing). */
#define ORTAGENT_COMPILE_VOID_FUNCTIONS(X) \
    X( 0, 22, void, ReleaseModelCompilationOptions, (OrtModelCompilationOptions* options))

#define ORTAGENT_DECLARE_SLOT_(slot, since, ret, name, params) \
    enum { ortagent_slot_##name = slot, ortagent_since_##name = since }; \
    typedef ret (*ortagent_fn_##name) params;
ORTAGENT_ORT_FLOOR_FUNCTIONS(ORTAGENT_DECLARE_SLOT_)
ORTAGENT_ORT_NEWER_FUNCTIONS(ORTAGENT_DECLARE_SLOT_)
ORTAGENT_ORT_NEWER_VALUE_FUNCTIONS(ORTAGENT_DECLARE_SLOT_)
ORTAGENT_ORT_NEWER_VOID_FUNCTIONS(ORTAGENT_DECLARE_SLOT_)
ORTAGENT_COMPILE_FUNCTIONS(ORTAGENT_DECLARE_SLOT_)
ORTAGENT_COMPILE_VOID_FUNCTIONS(ORTAGENT_DECLARE_SLOT_)
#undef ORTAGENT_DECLARE_SLOT_

#endif /* ORTAGENT_ORT_ABI_H */
