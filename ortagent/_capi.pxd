# cython: language_level=3
"""The only Cython view of the onnxruntime C ABI: include/ortagent/ort_abi.h and ort_call.h.

Every function is called through its OrtApi slot (see ort_call.h): ``ort.Run(...)`` compiles to
``ORTAGENT_CALL(Run)(...)``. Functions newer than ORTAGENT_API_FLOOR are declared with
ORTAGENT_CALL_NEWER, which substitutes a stand-in returning an ORT_NOT_IMPLEMENTED status that
names the onnxruntime version needed when the loaded runtime is older.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t


cdef extern from "ortagent/ort_abi.h" nogil:
    enum: ORTAGENT_API_FLOOR
    enum: ORTAGENT_API_NEWEST

    ctypedef struct OrtStatus
    ctypedef struct OrtEnv
    ctypedef struct OrtMemoryInfo
    ctypedef struct OrtIoBinding
    ctypedef struct OrtSession
    ctypedef struct OrtValue
    ctypedef struct OrtRunOptions
    ctypedef struct OrtTypeInfo
    ctypedef struct OrtTensorTypeAndShapeInfo
    ctypedef struct OrtSessionOptions
    ctypedef struct OrtModelMetadata
    ctypedef struct OrtCUDAProviderOptionsV2
    ctypedef struct OrtSyncStream
    ctypedef struct OrtAllocator
    ctypedef struct OrtMapTypeInfo
    ctypedef struct OrtSequenceTypeInfo
    ctypedef struct OrtOptionalTypeInfo
    ctypedef struct OrtThreadingOptions
    ctypedef struct OrtTensorRTProviderOptionsV2
    ctypedef struct OrtLoraAdapter
    ctypedef struct OrtArenaCfg
    ctypedef struct OrtEpAssignedSubgraph
    ctypedef struct OrtEpAssignedNode
    ctypedef struct OrtKeyValuePairs
    ctypedef struct OrtHardwareDevice
    ctypedef struct OrtEpDevice
    ctypedef struct OrtModelCompilationOptions
    ctypedef struct OrtCompileApi
    ctypedef struct OrtKernelInfo
    ctypedef struct OrtKernelContext
    ctypedef struct OrtCustomOpDomain
    ctypedef struct OrtCustomOp
    # C's bool (stdbool.h, included by ort_abi.h)
    ctypedef bint bool

    ctypedef enum OrtErrorCode:
        ORT_OK
        ORT_FAIL
        ORT_INVALID_ARGUMENT
        ORT_NO_SUCHFILE
        ORT_NO_MODEL
        ORT_ENGINE_ERROR
        ORT_RUNTIME_EXCEPTION
        ORT_INVALID_PROTOBUF
        ORT_MODEL_LOADED
        ORT_NOT_IMPLEMENTED
        ORT_INVALID_GRAPH
        ORT_EP_FAIL

    ctypedef enum OrtLoggingLevel:
        ORT_LOGGING_LEVEL_VERBOSE
        ORT_LOGGING_LEVEL_INFO
        ORT_LOGGING_LEVEL_WARNING
        ORT_LOGGING_LEVEL_ERROR
        ORT_LOGGING_LEVEL_FATAL

    ctypedef enum ONNXTensorElementDataType:
        ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
        ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8
        ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8
        ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16
        ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16
        ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
        ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
        ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING
        ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL
        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
        ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE
        ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32
        ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64
        ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64
        ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128
        ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16

    ctypedef enum ONNXType:
        ONNX_TYPE_UNKNOWN
        ONNX_TYPE_TENSOR
        ONNX_TYPE_SEQUENCE
        ONNX_TYPE_MAP
        ONNX_TYPE_OPAQUE
        ONNX_TYPE_SPARSETENSOR
        ONNX_TYPE_OPTIONAL

    ctypedef enum GraphOptimizationLevel:
        ORT_DISABLE_ALL
        ORT_ENABLE_BASIC
        ORT_ENABLE_EXTENDED
        ORT_ENABLE_ALL

    ctypedef enum ExecutionMode:
        ORT_SEQUENTIAL
        ORT_PARALLEL

    ctypedef enum OrtAllocatorType:
        OrtInvalidAllocator
        OrtDeviceAllocator
        OrtArenaAllocator

    ctypedef enum OrtMemType:
        OrtMemTypeCPUInput
        OrtMemTypeCPUOutput
        OrtMemTypeCPU
        OrtMemTypeDefault

    ctypedef enum OrtMemoryInfoDeviceType:
        OrtMemoryInfoDeviceType_CPU
        OrtMemoryInfoDeviceType_GPU
        OrtMemoryInfoDeviceType_FPGA

    ctypedef enum OrtSparseFormat:
        ORT_SPARSE_UNDEFINED
        ORT_SPARSE_COO
        ORT_SPARSE_CSRC
        ORT_SPARSE_BLOCK_SPARSE

    ctypedef enum OrtSparseIndicesFormat:
        ORT_SPARSE_COO_INDICES
        ORT_SPARSE_CSR_INNER_INDICES
        ORT_SPARSE_CSR_OUTER_INDICES
        ORT_SPARSE_BLOCK_SPARSE_INDICES

    ctypedef enum OrtHardwareDeviceType:
        OrtHardwareDeviceType_CPU
        OrtHardwareDeviceType_GPU
        OrtHardwareDeviceType_NPU

    ctypedef enum OrtExecutionProviderDevicePolicy:
        OrtExecutionProviderDevicePolicy_DEFAULT
        OrtExecutionProviderDevicePolicy_MIN_OVERALL_POWER

    ctypedef enum OrtDeviceMemoryType:
        OrtDeviceMemoryType_DEFAULT
        OrtDeviceMemoryType_HOST_ACCESSIBLE

    ctypedef enum OrtCustomOpInputOutputCharacteristic:
        INPUT_OUTPUT_REQUIRED
        INPUT_OUTPUT_OPTIONAL
        INPUT_OUTPUT_VARIADIC

    ctypedef OrtStatus* (*ortagent_write_buffer_fn)(void*, const void*, size_t) noexcept
    ctypedef void (*ortagent_parallel_fn)(void*, size_t) noexcept

    ctypedef struct ortagent_api_base:
        const void* (*get_api)(uint32_t)
        const char* (*get_version_string)()
    ctypedef const ortagent_api_base* (*ortagent_get_api_base_fn)()
    const char* ORTAGENT_GET_API_BASE_SYMBOL


cdef extern from "ortagent/ort_call.h" nogil:
    ctypedef void (*ortagent_any_fn)()

    ctypedef struct ortagent_runtime:
        const ortagent_any_fn* api
        uint32_t api_version
        const char* version_string
        OrtEnv* env

    # This module's pointer to the process-wide runtime description (owned by _runtime).
    ortagent_runtime* ortagent_rt

    enum: ortagent_since_CopyTensors
    enum: ortagent_since_ModelCompilationOptions_SetFlags
    # Whether the loaded runtime has a slot (ORTAGENT_HAS): a newer slot returning a plain
    # value, or nothing, is called only after its check says yes.
    bint HAS_GetEpDevices "ORTAGENT_HAS(GetEpDevices)"
    bint HAS_EpDevice_MemoryInfo "ORTAGENT_HAS(EpDevice_MemoryInfo)"
    bint HAS_MemoryInfoGetDeviceMemType "ORTAGENT_HAS(MemoryInfoGetDeviceMemType)"
    bint HAS_MemoryInfoGetVendorId "ORTAGENT_HAS(MemoryInfoGetVendorId)"
    bint HAS_SyncStream_GetHandle "ORTAGENT_HAS(SyncStream_GetHandle)"
    bint HAS_ReleaseSyncStream "ORTAGENT_HAS(ReleaseSyncStream)"
    enum: ortagent_since_GetTensorElementTypeAndShapeDataReference

    # ---- slots up to ORTAGENT_API_FLOOR ----
    OrtStatus* CreateStatus "ORTAGENT_CALL(CreateStatus)"(OrtErrorCode, const char*)
    OrtErrorCode GetErrorCode "ORTAGENT_CALL(GetErrorCode)"(const OrtStatus*)
    const char* GetErrorMessage "ORTAGENT_CALL(GetErrorMessage)"(const OrtStatus*)
    OrtStatus* CreateEnv "ORTAGENT_CALL(CreateEnv)"(OrtLoggingLevel, const char*, OrtEnv**)
    OrtStatus* EnableTelemetryEvents "ORTAGENT_CALL(EnableTelemetryEvents)"(const OrtEnv*)
    OrtStatus* DisableTelemetryEvents "ORTAGENT_CALL(DisableTelemetryEvents)"(const OrtEnv*)
    OrtStatus* CreateSession "ORTAGENT_CALL(CreateSession)"(const OrtEnv*, const char*, const OrtSessionOptions*, OrtSession**)
    OrtStatus* CreateSessionFromArray "ORTAGENT_CALL(CreateSessionFromArray)"(const OrtEnv*, const void*, size_t, const OrtSessionOptions*, OrtSession**)
    OrtStatus* Run "ORTAGENT_CALL(Run)"(OrtSession*, const OrtRunOptions*, const char* const*, const OrtValue* const*, size_t, const char* const*, size_t, OrtValue**)
    OrtStatus* CreateSessionOptions "ORTAGENT_CALL(CreateSessionOptions)"(OrtSessionOptions**)
    OrtStatus* SetOptimizedModelFilePath "ORTAGENT_CALL(SetOptimizedModelFilePath)"(OrtSessionOptions*, const char*)
    OrtStatus* CloneSessionOptions "ORTAGENT_CALL(CloneSessionOptions)"(const OrtSessionOptions*, OrtSessionOptions**)
    OrtStatus* SetSessionExecutionMode "ORTAGENT_CALL(SetSessionExecutionMode)"(OrtSessionOptions*, ExecutionMode)
    OrtStatus* EnableProfiling "ORTAGENT_CALL(EnableProfiling)"(OrtSessionOptions*, const char*)
    OrtStatus* DisableProfiling "ORTAGENT_CALL(DisableProfiling)"(OrtSessionOptions*)
    OrtStatus* EnableMemPattern "ORTAGENT_CALL(EnableMemPattern)"(OrtSessionOptions*)
    OrtStatus* DisableMemPattern "ORTAGENT_CALL(DisableMemPattern)"(OrtSessionOptions*)
    OrtStatus* EnableCpuMemArena "ORTAGENT_CALL(EnableCpuMemArena)"(OrtSessionOptions*)
    OrtStatus* DisableCpuMemArena "ORTAGENT_CALL(DisableCpuMemArena)"(OrtSessionOptions*)
    OrtStatus* SetSessionLogId "ORTAGENT_CALL(SetSessionLogId)"(OrtSessionOptions*, const char*)
    OrtStatus* SetSessionLogVerbosityLevel "ORTAGENT_CALL(SetSessionLogVerbosityLevel)"(OrtSessionOptions*, int)
    OrtStatus* SetSessionLogSeverityLevel "ORTAGENT_CALL(SetSessionLogSeverityLevel)"(OrtSessionOptions*, int)
    OrtStatus* SetSessionGraphOptimizationLevel "ORTAGENT_CALL(SetSessionGraphOptimizationLevel)"(OrtSessionOptions*, GraphOptimizationLevel)
    OrtStatus* SetIntraOpNumThreads "ORTAGENT_CALL(SetIntraOpNumThreads)"(OrtSessionOptions*, int)
    OrtStatus* SetInterOpNumThreads "ORTAGENT_CALL(SetInterOpNumThreads)"(OrtSessionOptions*, int)
    OrtStatus* CreateCustomOpDomain "ORTAGENT_CALL(CreateCustomOpDomain)"(const char*, OrtCustomOpDomain**)
    OrtStatus* CustomOpDomain_Add "ORTAGENT_CALL(CustomOpDomain_Add)"(OrtCustomOpDomain*, const OrtCustomOp*)
    OrtStatus* AddCustomOpDomain "ORTAGENT_CALL(AddCustomOpDomain)"(OrtSessionOptions*, OrtCustomOpDomain*)
    OrtStatus* KernelInfoGetAttribute_float "ORTAGENT_CALL(KernelInfoGetAttribute_float)"(const OrtKernelInfo*, const char*, float*)
    OrtStatus* KernelInfoGetAttribute_int64 "ORTAGENT_CALL(KernelInfoGetAttribute_int64)"(const OrtKernelInfo*, const char*, int64_t*)
    OrtStatus* KernelContext_GetInputCount "ORTAGENT_CALL(KernelContext_GetInputCount)"(const OrtKernelContext*, size_t*)
    OrtStatus* KernelContext_GetOutputCount "ORTAGENT_CALL(KernelContext_GetOutputCount)"(const OrtKernelContext*, size_t*)
    OrtStatus* KernelContext_GetInput "ORTAGENT_CALL(KernelContext_GetInput)"(const OrtKernelContext*, size_t, const OrtValue**)
    OrtStatus* KernelContext_GetOutput "ORTAGENT_CALL(KernelContext_GetOutput)"(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)
    void ReleaseCustomOpDomain "ORTAGENT_CALL(ReleaseCustomOpDomain)"(OrtCustomOpDomain*)
    OrtStatus* KernelContext_ParallelFor "ORTAGENT_CALL(KernelContext_ParallelFor)"(const OrtKernelContext*, ortagent_parallel_fn, size_t, size_t, void*)
    OrtStatus* SessionGetInputCount "ORTAGENT_CALL(SessionGetInputCount)"(const OrtSession*, size_t*)
    OrtStatus* SessionGetOutputCount "ORTAGENT_CALL(SessionGetOutputCount)"(const OrtSession*, size_t*)
    OrtStatus* SessionGetOverridableInitializerCount "ORTAGENT_CALL(SessionGetOverridableInitializerCount)"(const OrtSession*, size_t*)
    OrtStatus* SessionGetInputTypeInfo "ORTAGENT_CALL(SessionGetInputTypeInfo)"(const OrtSession*, size_t, OrtTypeInfo**)
    OrtStatus* SessionGetOutputTypeInfo "ORTAGENT_CALL(SessionGetOutputTypeInfo)"(const OrtSession*, size_t, OrtTypeInfo**)
    OrtStatus* SessionGetOverridableInitializerTypeInfo "ORTAGENT_CALL(SessionGetOverridableInitializerTypeInfo)"(const OrtSession*, size_t, OrtTypeInfo**)
    OrtStatus* SessionGetInputName "ORTAGENT_CALL(SessionGetInputName)"(const OrtSession*, size_t, OrtAllocator*, char**)
    OrtStatus* SessionGetOutputName "ORTAGENT_CALL(SessionGetOutputName)"(const OrtSession*, size_t, OrtAllocator*, char**)
    OrtStatus* SessionGetOverridableInitializerName "ORTAGENT_CALL(SessionGetOverridableInitializerName)"(const OrtSession*, size_t, OrtAllocator*, char**)
    OrtStatus* CreateRunOptions "ORTAGENT_CALL(CreateRunOptions)"(OrtRunOptions**)
    OrtStatus* RunOptionsSetRunLogVerbosityLevel "ORTAGENT_CALL(RunOptionsSetRunLogVerbosityLevel)"(OrtRunOptions*, int)
    OrtStatus* RunOptionsSetRunLogSeverityLevel "ORTAGENT_CALL(RunOptionsSetRunLogSeverityLevel)"(OrtRunOptions*, int)
    OrtStatus* RunOptionsSetRunTag "ORTAGENT_CALL(RunOptionsSetRunTag)"(OrtRunOptions*, const char*)
    OrtStatus* RunOptionsGetRunLogVerbosityLevel "ORTAGENT_CALL(RunOptionsGetRunLogVerbosityLevel)"(const OrtRunOptions*, int*)
    OrtStatus* RunOptionsGetRunLogSeverityLevel "ORTAGENT_CALL(RunOptionsGetRunLogSeverityLevel)"(const OrtRunOptions*, int*)
    OrtStatus* RunOptionsGetRunTag "ORTAGENT_CALL(RunOptionsGetRunTag)"(const OrtRunOptions*, const char**)
    OrtStatus* RunOptionsSetTerminate "ORTAGENT_CALL(RunOptionsSetTerminate)"(OrtRunOptions*)
    OrtStatus* RunOptionsUnsetTerminate "ORTAGENT_CALL(RunOptionsUnsetTerminate)"(OrtRunOptions*)
    OrtStatus* CreateTensorAsOrtValue "ORTAGENT_CALL(CreateTensorAsOrtValue)"(OrtAllocator*, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)
    OrtStatus* CreateTensorWithDataAsOrtValue "ORTAGENT_CALL(CreateTensorWithDataAsOrtValue)"(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)
    OrtStatus* IsTensor "ORTAGENT_CALL(IsTensor)"(const OrtValue*, int*)
    OrtStatus* GetTensorMutableData "ORTAGENT_CALL(GetTensorMutableData)"(OrtValue*, void**)
    OrtStatus* FillStringTensor "ORTAGENT_CALL(FillStringTensor)"(OrtValue*, const char* const*, size_t)
    OrtStatus* GetStringTensorDataLength "ORTAGENT_CALL(GetStringTensorDataLength)"(const OrtValue*, size_t*)
    OrtStatus* GetStringTensorContent "ORTAGENT_CALL(GetStringTensorContent)"(const OrtValue*, void*, size_t, size_t*, size_t)
    OrtStatus* CastTypeInfoToTensorInfo "ORTAGENT_CALL(CastTypeInfoToTensorInfo)"(const OrtTypeInfo*, const OrtTensorTypeAndShapeInfo**)
    OrtStatus* GetOnnxTypeFromTypeInfo "ORTAGENT_CALL(GetOnnxTypeFromTypeInfo)"(const OrtTypeInfo*, ONNXType*)
    OrtStatus* GetTensorElementType "ORTAGENT_CALL(GetTensorElementType)"(const OrtTensorTypeAndShapeInfo*, ONNXTensorElementDataType*)
    OrtStatus* GetDimensionsCount "ORTAGENT_CALL(GetDimensionsCount)"(const OrtTensorTypeAndShapeInfo*, size_t*)
    OrtStatus* GetDimensions "ORTAGENT_CALL(GetDimensions)"(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)
    OrtStatus* GetSymbolicDimensions "ORTAGENT_CALL(GetSymbolicDimensions)"(const OrtTensorTypeAndShapeInfo*, const char**, size_t)
    OrtStatus* GetTensorShapeElementCount "ORTAGENT_CALL(GetTensorShapeElementCount)"(const OrtTensorTypeAndShapeInfo*, size_t*)
    OrtStatus* GetTensorTypeAndShape "ORTAGENT_CALL(GetTensorTypeAndShape)"(const OrtValue*, OrtTensorTypeAndShapeInfo**)
    OrtStatus* GetTypeInfo "ORTAGENT_CALL(GetTypeInfo)"(const OrtValue*, OrtTypeInfo**)
    OrtStatus* GetValueType "ORTAGENT_CALL(GetValueType)"(const OrtValue*, ONNXType*)
    OrtStatus* CreateMemoryInfo "ORTAGENT_CALL(CreateMemoryInfo)"(const char*, OrtAllocatorType, int, OrtMemType, OrtMemoryInfo**)
    OrtStatus* CreateCpuMemoryInfo "ORTAGENT_CALL(CreateCpuMemoryInfo)"(OrtAllocatorType, OrtMemType, OrtMemoryInfo**)
    OrtStatus* CompareMemoryInfo "ORTAGENT_CALL(CompareMemoryInfo)"(const OrtMemoryInfo*, const OrtMemoryInfo*, int*)
    OrtStatus* MemoryInfoGetName "ORTAGENT_CALL(MemoryInfoGetName)"(const OrtMemoryInfo*, const char**)
    OrtStatus* MemoryInfoGetId "ORTAGENT_CALL(MemoryInfoGetId)"(const OrtMemoryInfo*, int*)
    OrtStatus* MemoryInfoGetMemType "ORTAGENT_CALL(MemoryInfoGetMemType)"(const OrtMemoryInfo*, OrtMemType*)
    OrtStatus* MemoryInfoGetType "ORTAGENT_CALL(MemoryInfoGetType)"(const OrtMemoryInfo*, OrtAllocatorType*)
    OrtStatus* AllocatorAlloc "ORTAGENT_CALL(AllocatorAlloc)"(OrtAllocator*, size_t, void**)
    OrtStatus* AllocatorFree "ORTAGENT_CALL(AllocatorFree)"(OrtAllocator*, void*)
    OrtStatus* AllocatorGetInfo "ORTAGENT_CALL(AllocatorGetInfo)"(const OrtAllocator*, const OrtMemoryInfo**)
    OrtStatus* GetAllocatorWithDefaultOptions "ORTAGENT_CALL(GetAllocatorWithDefaultOptions)"(OrtAllocator**)
    OrtStatus* AddFreeDimensionOverride "ORTAGENT_CALL(AddFreeDimensionOverride)"(OrtSessionOptions*, const char*, int64_t)
    OrtStatus* GetValue "ORTAGENT_CALL(GetValue)"(const OrtValue*, int, OrtAllocator*, OrtValue**)
    OrtStatus* GetValueCount "ORTAGENT_CALL(GetValueCount)"(const OrtValue*, size_t*)
    OrtStatus* CreateValue "ORTAGENT_CALL(CreateValue)"(const OrtValue* const*, size_t, ONNXType, OrtValue**)
    void ReleaseEnv "ORTAGENT_CALL(ReleaseEnv)"(OrtEnv*)
    void ReleaseStatus "ORTAGENT_CALL(ReleaseStatus)"(OrtStatus*)
    void ReleaseMemoryInfo "ORTAGENT_CALL(ReleaseMemoryInfo)"(OrtMemoryInfo*)
    void ReleaseSession "ORTAGENT_CALL(ReleaseSession)"(OrtSession*)
    void ReleaseValue "ORTAGENT_CALL(ReleaseValue)"(OrtValue*)
    void ReleaseRunOptions "ORTAGENT_CALL(ReleaseRunOptions)"(OrtRunOptions*)
    void ReleaseTypeInfo "ORTAGENT_CALL(ReleaseTypeInfo)"(OrtTypeInfo*)
    void ReleaseTensorTypeAndShapeInfo "ORTAGENT_CALL(ReleaseTensorTypeAndShapeInfo)"(OrtTensorTypeAndShapeInfo*)
    void ReleaseSessionOptions "ORTAGENT_CALL(ReleaseSessionOptions)"(OrtSessionOptions*)
    OrtStatus* CastTypeInfoToMapTypeInfo "ORTAGENT_CALL(CastTypeInfoToMapTypeInfo)"(const OrtTypeInfo*, const OrtMapTypeInfo**)
    OrtStatus* CastTypeInfoToSequenceTypeInfo "ORTAGENT_CALL(CastTypeInfoToSequenceTypeInfo)"(const OrtTypeInfo*, const OrtSequenceTypeInfo**)
    OrtStatus* GetMapKeyType "ORTAGENT_CALL(GetMapKeyType)"(const OrtMapTypeInfo*, ONNXTensorElementDataType*)
    OrtStatus* GetMapValueType "ORTAGENT_CALL(GetMapValueType)"(const OrtMapTypeInfo*, OrtTypeInfo**)
    OrtStatus* GetSequenceElementType "ORTAGENT_CALL(GetSequenceElementType)"(const OrtSequenceTypeInfo*, OrtTypeInfo**)
    OrtStatus* SessionEndProfiling "ORTAGENT_CALL(SessionEndProfiling)"(OrtSession*, OrtAllocator*, char**)
    OrtStatus* SessionGetModelMetadata "ORTAGENT_CALL(SessionGetModelMetadata)"(const OrtSession*, OrtModelMetadata**)
    OrtStatus* ModelMetadataGetProducerName "ORTAGENT_CALL(ModelMetadataGetProducerName)"(const OrtModelMetadata*, OrtAllocator*, char**)
    OrtStatus* ModelMetadataGetGraphName "ORTAGENT_CALL(ModelMetadataGetGraphName)"(const OrtModelMetadata*, OrtAllocator*, char**)
    OrtStatus* ModelMetadataGetDomain "ORTAGENT_CALL(ModelMetadataGetDomain)"(const OrtModelMetadata*, OrtAllocator*, char**)
    OrtStatus* ModelMetadataGetDescription "ORTAGENT_CALL(ModelMetadataGetDescription)"(const OrtModelMetadata*, OrtAllocator*, char**)
    OrtStatus* ModelMetadataLookupCustomMetadataMap "ORTAGENT_CALL(ModelMetadataLookupCustomMetadataMap)"(const OrtModelMetadata*, OrtAllocator*, const char*, char**)
    OrtStatus* ModelMetadataGetVersion "ORTAGENT_CALL(ModelMetadataGetVersion)"(const OrtModelMetadata*, int64_t*)
    void ReleaseModelMetadata "ORTAGENT_CALL(ReleaseModelMetadata)"(OrtModelMetadata*)
    OrtStatus* CreateEnvWithGlobalThreadPools "ORTAGENT_CALL(CreateEnvWithGlobalThreadPools)"(OrtLoggingLevel, const char*, const OrtThreadingOptions*, OrtEnv**)
    OrtStatus* DisablePerSessionThreads "ORTAGENT_CALL(DisablePerSessionThreads)"(OrtSessionOptions*)
    OrtStatus* CreateThreadingOptions "ORTAGENT_CALL(CreateThreadingOptions)"(OrtThreadingOptions**)
    void ReleaseThreadingOptions "ORTAGENT_CALL(ReleaseThreadingOptions)"(OrtThreadingOptions*)
    OrtStatus* ModelMetadataGetCustomMetadataMapKeys "ORTAGENT_CALL(ModelMetadataGetCustomMetadataMapKeys)"(const OrtModelMetadata*, OrtAllocator*, char***, int64_t*)
    OrtStatus* AddFreeDimensionOverrideByName "ORTAGENT_CALL(AddFreeDimensionOverrideByName)"(OrtSessionOptions*, const char*, int64_t)
    OrtStatus* GetAvailableProviders "ORTAGENT_CALL(GetAvailableProviders)"(char***, int*)
    OrtStatus* ReleaseAvailableProviders "ORTAGENT_CALL(ReleaseAvailableProviders)"(char**, int)
    OrtStatus* GetStringTensorElementLength "ORTAGENT_CALL(GetStringTensorElementLength)"(const OrtValue*, size_t, size_t*)
    OrtStatus* GetStringTensorElement "ORTAGENT_CALL(GetStringTensorElement)"(const OrtValue*, size_t, size_t, void*)
    OrtStatus* FillStringTensorElement "ORTAGENT_CALL(FillStringTensorElement)"(OrtValue*, const char*, size_t)
    OrtStatus* AddSessionConfigEntry "ORTAGENT_CALL(AddSessionConfigEntry)"(OrtSessionOptions*, const char*, const char*)
    OrtStatus* CreateAllocator "ORTAGENT_CALL(CreateAllocator)"(const OrtSession*, const OrtMemoryInfo*, OrtAllocator**)
    void ReleaseAllocator "ORTAGENT_CALL(ReleaseAllocator)"(OrtAllocator*)
    OrtStatus* RunWithBinding "ORTAGENT_CALL(RunWithBinding)"(OrtSession*, const OrtRunOptions*, const OrtIoBinding*)
    OrtStatus* CreateIoBinding "ORTAGENT_CALL(CreateIoBinding)"(OrtSession*, OrtIoBinding**)
    void ReleaseIoBinding "ORTAGENT_CALL(ReleaseIoBinding)"(OrtIoBinding*)
    OrtStatus* BindInput "ORTAGENT_CALL(BindInput)"(OrtIoBinding*, const char*, const OrtValue*)
    OrtStatus* BindOutput "ORTAGENT_CALL(BindOutput)"(OrtIoBinding*, const char*, const OrtValue*)
    OrtStatus* BindOutputToDevice "ORTAGENT_CALL(BindOutputToDevice)"(OrtIoBinding*, const char*, const OrtMemoryInfo*)
    OrtStatus* GetBoundOutputNames "ORTAGENT_CALL(GetBoundOutputNames)"(const OrtIoBinding*, OrtAllocator*, char**, size_t**, size_t*)
    OrtStatus* GetBoundOutputValues "ORTAGENT_CALL(GetBoundOutputValues)"(const OrtIoBinding*, OrtAllocator*, OrtValue***, size_t*)
    void ClearBoundInputs "ORTAGENT_CALL(ClearBoundInputs)"(OrtIoBinding*)
    void ClearBoundOutputs "ORTAGENT_CALL(ClearBoundOutputs)"(OrtIoBinding*)
    OrtStatus* SessionGetProfilingStartTimeNs "ORTAGENT_CALL(SessionGetProfilingStartTimeNs)"(const OrtSession*, uint64_t*)
    OrtStatus* SetGlobalIntraOpNumThreads "ORTAGENT_CALL(SetGlobalIntraOpNumThreads)"(OrtThreadingOptions*, int)
    OrtStatus* SetGlobalInterOpNumThreads "ORTAGENT_CALL(SetGlobalInterOpNumThreads)"(OrtThreadingOptions*, int)
    OrtStatus* CreateAndRegisterAllocator "ORTAGENT_CALL(CreateAndRegisterAllocator)"(OrtEnv*, const OrtMemoryInfo*, const OrtArenaCfg*)
    OrtStatus* AddInitializer "ORTAGENT_CALL(AddInitializer)"(OrtSessionOptions*, const char*, const OrtValue*)
    void ReleaseArenaCfg "ORTAGENT_CALL(ReleaseArenaCfg)"(OrtArenaCfg*)
    OrtStatus* ModelMetadataGetGraphDescription "ORTAGENT_CALL(ModelMetadataGetGraphDescription)"(const OrtModelMetadata*, OrtAllocator*, char**)
    OrtStatus* CreateArenaCfgV2 "ORTAGENT_CALL(CreateArenaCfgV2)"(const char* const*, const size_t*, size_t, OrtArenaCfg**)
    OrtStatus* AddRunConfigEntry "ORTAGENT_CALL(AddRunConfigEntry)"(OrtRunOptions*, const char*, const char*)
    OrtStatus* SessionOptionsAppendExecutionProvider_TensorRT_V2 "ORTAGENT_CALL(SessionOptionsAppendExecutionProvider_TensorRT_V2)"(OrtSessionOptions*, const OrtTensorRTProviderOptionsV2*)
    OrtStatus* CreateTensorRTProviderOptions "ORTAGENT_CALL(CreateTensorRTProviderOptions)"(OrtTensorRTProviderOptionsV2**)
    OrtStatus* UpdateTensorRTProviderOptions "ORTAGENT_CALL(UpdateTensorRTProviderOptions)"(OrtTensorRTProviderOptionsV2*, const char* const*, const char* const*, size_t)
    void ReleaseTensorRTProviderOptions "ORTAGENT_CALL(ReleaseTensorRTProviderOptions)"(OrtTensorRTProviderOptionsV2*)
    OrtStatus* CreateSparseTensorAsOrtValue "ORTAGENT_CALL(CreateSparseTensorAsOrtValue)"(OrtAllocator*, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)
    OrtStatus* FillSparseTensorCoo "ORTAGENT_CALL(FillSparseTensorCoo)"(OrtValue*, const OrtMemoryInfo*, const int64_t*, size_t, const void*, const int64_t*, size_t)
    OrtStatus* FillSparseTensorCsr "ORTAGENT_CALL(FillSparseTensorCsr)"(OrtValue*, const OrtMemoryInfo*, const int64_t*, size_t, const void*, const int64_t*, size_t, const int64_t*, size_t)
    OrtStatus* CreateSparseTensorWithValuesAsOrtValue "ORTAGENT_CALL(CreateSparseTensorWithValuesAsOrtValue)"(const OrtMemoryInfo*, void*, const int64_t*, size_t, const int64_t*, size_t, ONNXTensorElementDataType, OrtValue**)
    OrtStatus* UseCooIndices "ORTAGENT_CALL(UseCooIndices)"(OrtValue*, int64_t*, size_t)
    OrtStatus* UseCsrIndices "ORTAGENT_CALL(UseCsrIndices)"(OrtValue*, int64_t*, size_t, int64_t*, size_t)
    OrtStatus* GetSparseTensorFormat "ORTAGENT_CALL(GetSparseTensorFormat)"(const OrtValue*, OrtSparseFormat*)
    OrtStatus* GetSparseTensorValuesTypeAndShape "ORTAGENT_CALL(GetSparseTensorValuesTypeAndShape)"(const OrtValue*, OrtTensorTypeAndShapeInfo**)
    OrtStatus* GetSparseTensorValues "ORTAGENT_CALL(GetSparseTensorValues)"(const OrtValue*, const void**)
    OrtStatus* GetSparseTensorIndicesTypeShape "ORTAGENT_CALL(GetSparseTensorIndicesTypeShape)"(const OrtValue*, OrtSparseIndicesFormat, OrtTensorTypeAndShapeInfo**)
    OrtStatus* GetSparseTensorIndices "ORTAGENT_CALL(GetSparseTensorIndices)"(const OrtValue*, OrtSparseIndicesFormat, size_t*, const void**)
    OrtStatus* HasValue "ORTAGENT_CALL(HasValue)"(const OrtValue*, int*)
    OrtStatus* GetTensorMemoryInfo "ORTAGENT_CALL(GetTensorMemoryInfo)"(const OrtValue*, const OrtMemoryInfo**)
    OrtStatus* SynchronizeBoundInputs "ORTAGENT_CALL(SynchronizeBoundInputs)"(OrtIoBinding*)
    OrtStatus* SynchronizeBoundOutputs "ORTAGENT_CALL(SynchronizeBoundOutputs)"(OrtIoBinding*)
    OrtStatus* SessionOptionsAppendExecutionProvider_CUDA_V2 "ORTAGENT_CALL(SessionOptionsAppendExecutionProvider_CUDA_V2)"(OrtSessionOptions*, const OrtCUDAProviderOptionsV2*)
    OrtStatus* CreateCUDAProviderOptions "ORTAGENT_CALL(CreateCUDAProviderOptions)"(OrtCUDAProviderOptionsV2**)
    OrtStatus* UpdateCUDAProviderOptions "ORTAGENT_CALL(UpdateCUDAProviderOptions)"(OrtCUDAProviderOptionsV2*, const char* const*, const char* const*, size_t)
    OrtStatus* GetCUDAProviderOptionsAsString "ORTAGENT_CALL(GetCUDAProviderOptionsAsString)"(const OrtCUDAProviderOptionsV2*, OrtAllocator*, char**)
    void ReleaseCUDAProviderOptions "ORTAGENT_CALL(ReleaseCUDAProviderOptions)"(OrtCUDAProviderOptionsV2*)
    OrtStatus* AddExternalInitializers "ORTAGENT_CALL(AddExternalInitializers)"(OrtSessionOptions*, const char* const*, const OrtValue* const*, size_t)
    OrtStatus* SessionOptionsAppendExecutionProvider "ORTAGENT_CALL(SessionOptionsAppendExecutionProvider)"(OrtSessionOptions*, const char*, const char* const*, const char* const*, size_t)
    void MemoryInfoGetDeviceType "ORTAGENT_CALL(MemoryInfoGetDeviceType)"(const OrtMemoryInfo*, OrtMemoryInfoDeviceType*)
    OrtStatus* UpdateEnvWithCustomLogLevel "ORTAGENT_CALL(UpdateEnvWithCustomLogLevel)"(OrtEnv*, OrtLoggingLevel)
    OrtStatus* RegisterCustomOpsLibrary_V2 "ORTAGENT_CALL(RegisterCustomOpsLibrary_V2)"(OrtSessionOptions*, const char*)
    OrtStatus* HasSessionConfigEntry "ORTAGENT_CALL(HasSessionConfigEntry)"(const OrtSessionOptions*, const char*, int*)
    OrtStatus* GetSessionConfigEntry "ORTAGENT_CALL(GetSessionConfigEntry)"(const OrtSessionOptions*, const char*, char*, size_t*)
    OrtStatus* CastTypeInfoToOptionalTypeInfo "ORTAGENT_CALL(CastTypeInfoToOptionalTypeInfo)"(const OrtTypeInfo*, const OrtOptionalTypeInfo**)
    OrtStatus* GetOptionalContainedTypeInfo "ORTAGENT_CALL(GetOptionalContainedTypeInfo)"(const OrtOptionalTypeInfo*, OrtTypeInfo**)
    OrtStatus* GetResizedStringTensorElementBuffer "ORTAGENT_CALL(GetResizedStringTensorElementBuffer)"(OrtValue*, size_t, size_t, char**)
    OrtStatus* CreateAndRegisterAllocatorV2 "ORTAGENT_CALL(CreateAndRegisterAllocatorV2)"(OrtEnv*, const char*, const OrtMemoryInfo*, const OrtArenaCfg*, const char* const*, const char* const*, size_t)
    OrtStatus* SetDeterministicCompute "ORTAGENT_CALL(SetDeterministicCompute)"(OrtSessionOptions*, bool)
    OrtStatus* AddExternalInitializersFromFilesInMemory "ORTAGENT_CALL(AddExternalInitializersFromFilesInMemory)"(OrtSessionOptions*, const char* const*, char* const*, const size_t*, size_t)
    const char* GetBuildInfoString "ORTAGENT_CALL(GetBuildInfoString)"()
    OrtStatus* CreateLoraAdapter "ORTAGENT_CALL(CreateLoraAdapter)"(const char*, OrtAllocator*, OrtLoraAdapter**)
    OrtStatus* CreateLoraAdapterFromArray "ORTAGENT_CALL(CreateLoraAdapterFromArray)"(const void*, size_t, OrtAllocator*, OrtLoraAdapter**)
    void ReleaseLoraAdapter "ORTAGENT_CALL(ReleaseLoraAdapter)"(OrtLoraAdapter*)
    OrtStatus* RunOptionsAddActiveLoraAdapter "ORTAGENT_CALL(RunOptionsAddActiveLoraAdapter)"(OrtRunOptions*, const OrtLoraAdapter*)
    OrtStatus* SetEpDynamicOptions "ORTAGENT_CALL(SetEpDynamicOptions)"(OrtSession*, const char* const*, const char* const*, size_t)

    # ---- slots newer than ORTAGENT_API_FLOOR ----
    OrtStatus* RegisterExecutionProviderLibrary "ORTAGENT_CALL_NEWER(RegisterExecutionProviderLibrary)"(OrtEnv*, const char*, const char*)
    OrtStatus* UnregisterExecutionProviderLibrary "ORTAGENT_CALL_NEWER(UnregisterExecutionProviderLibrary)"(OrtEnv*, const char*)
    OrtStatus* GetEpDevices "ORTAGENT_CALL_NEWER(GetEpDevices)"(const OrtEnv*, const OrtEpDevice* const**, size_t*)
    OrtStatus* SessionOptionsAppendExecutionProvider_V2 "ORTAGENT_CALL_NEWER(SessionOptionsAppendExecutionProvider_V2)"(OrtSessionOptions*, OrtEnv*, const OrtEpDevice* const*, size_t, const char* const*, const char* const*, size_t)
    OrtStatus* SessionOptionsSetEpSelectionPolicy "ORTAGENT_CALL_NEWER(SessionOptionsSetEpSelectionPolicy)"(OrtSessionOptions*, OrtExecutionProviderDevicePolicy)
    OrtStatus* GetTensorSizeInBytes "ORTAGENT_CALL_NEWER(GetTensorSizeInBytes)"(const OrtValue*, size_t*)
    OrtStatus* CreateMemoryInfo_V2 "ORTAGENT_CALL_NEWER(CreateMemoryInfo_V2)"(const char*, OrtMemoryInfoDeviceType, uint32_t, int32_t, OrtDeviceMemoryType, size_t, OrtAllocatorType, OrtMemoryInfo**)
    OrtStatus* SessionGetMemoryInfoForInputs "ORTAGENT_CALL_NEWER(SessionGetMemoryInfoForInputs)"(const OrtSession*, const OrtMemoryInfo**, size_t)
    OrtStatus* SessionGetMemoryInfoForOutputs "ORTAGENT_CALL_NEWER(SessionGetMemoryInfoForOutputs)"(const OrtSession*, const OrtMemoryInfo**, size_t)
    OrtStatus* SessionGetEpDeviceForInputs "ORTAGENT_CALL_NEWER(SessionGetEpDeviceForInputs)"(const OrtSession*, const OrtEpDevice**, size_t)
    OrtStatus* CreateSyncStreamForEpDevice "ORTAGENT_CALL_NEWER(CreateSyncStreamForEpDevice)"(const OrtEpDevice*, const OrtKeyValuePairs*, OrtSyncStream**)
    OrtStatus* CopyTensors "ORTAGENT_CALL_NEWER(CopyTensors)"(const OrtEnv*, const OrtValue* const*, OrtValue* const*, OrtSyncStream*, size_t)
    OrtStatus* Session_GetEpGraphAssignmentInfo "ORTAGENT_CALL_NEWER(Session_GetEpGraphAssignmentInfo)"(const OrtSession*, const OrtEpAssignedSubgraph* const**, size_t*)
    OrtStatus* EpAssignedSubgraph_GetEpName "ORTAGENT_CALL_NEWER(EpAssignedSubgraph_GetEpName)"(const OrtEpAssignedSubgraph*, const char**)
    OrtStatus* EpAssignedSubgraph_GetNodes "ORTAGENT_CALL_NEWER(EpAssignedSubgraph_GetNodes)"(const OrtEpAssignedSubgraph*, const OrtEpAssignedNode* const**, size_t*)
    OrtStatus* EpAssignedNode_GetName "ORTAGENT_CALL_NEWER(EpAssignedNode_GetName)"(const OrtEpAssignedNode*, const char**)
    OrtStatus* EpAssignedNode_GetDomain "ORTAGENT_CALL_NEWER(EpAssignedNode_GetDomain)"(const OrtEpAssignedNode*, const char**)
    OrtStatus* EpAssignedNode_GetOperatorType "ORTAGENT_CALL_NEWER(EpAssignedNode_GetOperatorType)"(const OrtEpAssignedNode*, const char**)
    OrtStatus* GetTensorElementTypeAndShapeDataReference "ORTAGENT_CALL_NEWER(GetTensorElementTypeAndShapeDataReference)"(const OrtValue*, ONNXTensorElementDataType*, const int64_t**, size_t*)

    # ---- newer slots returning a plain value or nothing (check ORTAGENT_HAS first) ----
    const OrtCompileApi* GetCompileApi "ORTAGENT_CALL_NEWER(GetCompileApi)"()
    OrtHardwareDeviceType HardwareDevice_Type "ORTAGENT_CALL_NEWER(HardwareDevice_Type)"(const OrtHardwareDevice*)
    uint32_t HardwareDevice_VendorId "ORTAGENT_CALL_NEWER(HardwareDevice_VendorId)"(const OrtHardwareDevice*)
    const char* HardwareDevice_Vendor "ORTAGENT_CALL_NEWER(HardwareDevice_Vendor)"(const OrtHardwareDevice*)
    uint32_t HardwareDevice_DeviceId "ORTAGENT_CALL_NEWER(HardwareDevice_DeviceId)"(const OrtHardwareDevice*)
    const OrtKeyValuePairs* HardwareDevice_Metadata "ORTAGENT_CALL_NEWER(HardwareDevice_Metadata)"(const OrtHardwareDevice*)
    const char* EpDevice_EpName "ORTAGENT_CALL_NEWER(EpDevice_EpName)"(const OrtEpDevice*)
    const char* EpDevice_EpVendor "ORTAGENT_CALL_NEWER(EpDevice_EpVendor)"(const OrtEpDevice*)
    const OrtKeyValuePairs* EpDevice_EpMetadata "ORTAGENT_CALL_NEWER(EpDevice_EpMetadata)"(const OrtEpDevice*)
    const OrtKeyValuePairs* EpDevice_EpOptions "ORTAGENT_CALL_NEWER(EpDevice_EpOptions)"(const OrtEpDevice*)
    const OrtHardwareDevice* EpDevice_Device "ORTAGENT_CALL_NEWER(EpDevice_Device)"(const OrtEpDevice*)
    OrtDeviceMemoryType MemoryInfoGetDeviceMemType "ORTAGENT_CALL_NEWER(MemoryInfoGetDeviceMemType)"(const OrtMemoryInfo*)
    uint32_t MemoryInfoGetVendorId "ORTAGENT_CALL_NEWER(MemoryInfoGetVendorId)"(const OrtMemoryInfo*)
    const OrtMemoryInfo* EpDevice_MemoryInfo "ORTAGENT_CALL_NEWER(EpDevice_MemoryInfo)"(const OrtEpDevice*, OrtDeviceMemoryType)
    void* SyncStream_GetHandle "ORTAGENT_CALL_NEWER(SyncStream_GetHandle)"(OrtSyncStream*)
    void GetKeyValuePairs "ORTAGENT_CALL_NEWER(GetKeyValuePairs)"(const OrtKeyValuePairs*, const char* const**, const char* const**, size_t*)
    void ReleaseSyncStream "ORTAGENT_CALL_NEWER(ReleaseSyncStream)"(OrtSyncStream*)

    # ---- the OrtCompileApi table (each slot version-checked by ORTAGENT_COMPILE_CALL) ----
    void ReleaseModelCompilationOptions "ORTAGENT_COMPILE_CALL(ReleaseModelCompilationOptions)"(OrtModelCompilationOptions*)
    OrtStatus* CreateModelCompilationOptionsFromSessionOptions "ORTAGENT_COMPILE_CALL(CreateModelCompilationOptionsFromSessionOptions)"(const OrtEnv*, const OrtSessionOptions*, OrtModelCompilationOptions**)
    OrtStatus* ModelCompilationOptions_SetInputModelPath "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetInputModelPath)"(OrtModelCompilationOptions*, const char*)
    OrtStatus* ModelCompilationOptions_SetInputModelFromBuffer "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetInputModelFromBuffer)"(OrtModelCompilationOptions*, const void*, size_t)
    OrtStatus* ModelCompilationOptions_SetOutputModelPath "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetOutputModelPath)"(OrtModelCompilationOptions*, const char*)
    OrtStatus* ModelCompilationOptions_SetOutputModelExternalInitializersFile "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetOutputModelExternalInitializersFile)"(OrtModelCompilationOptions*, const char*, size_t)
    OrtStatus* ModelCompilationOptions_SetOutputModelBuffer "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetOutputModelBuffer)"(OrtModelCompilationOptions*, OrtAllocator*, void**, size_t*)
    OrtStatus* ModelCompilationOptions_SetEpContextEmbedMode "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetEpContextEmbedMode)"(OrtModelCompilationOptions*, bool)
    OrtStatus* CompileModel "ORTAGENT_COMPILE_CALL(CompileModel)"(const OrtEnv*, const OrtModelCompilationOptions*)
    OrtStatus* ModelCompilationOptions_SetFlags "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetFlags)"(OrtModelCompilationOptions*, uint32_t)
    OrtStatus* ModelCompilationOptions_SetGraphOptimizationLevel "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetGraphOptimizationLevel)"(OrtModelCompilationOptions*, GraphOptimizationLevel)
    OrtStatus* ModelCompilationOptions_SetOutputModelWriteFunc "ORTAGENT_COMPILE_CALL(ModelCompilationOptions_SetOutputModelWriteFunc)"(OrtModelCompilationOptions*, ortagent_write_buffer_fn, void*)
