# cython: language_level=3
"""What a session says about its model: NodeArg (name, type string, shape of an input or output)
and ModelMetadata, read through the C API's type-info and model-metadata calls."""

from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport strlen

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, shared_runtime
from ortagent._dtypes cimport tensor_type_name
from ortagent._options cimport _take_string

ort.ortagent_rt = shared_runtime()


class NodeArg:
    """Name, type string and shape of a model input or output. Dimensions are ints, the name of
    a symbolic dimension, or None when unknown."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, name, type, shape):
        self.name = name
        self.type = type
        self.shape = shape

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"

    def __eq__(self, other):
        return (isinstance(other, NodeArg) and self.name == other.name
                and self.type == other.type and self.shape == other.shape)

    __hash__ = None


class ModelMetadata:
    """Metadata stored in the model (onnxruntime.ModelMetadata's attributes)."""

    def __init__(self, producer_name, graph_name, domain, description, graph_description,
                 version, custom_metadata_map):
        self.producer_name = producer_name
        self.graph_name = graph_name
        self.domain = domain
        self.description = description
        self.graph_description = graph_description
        self.version = version
        self.custom_metadata_map = custom_metadata_map

    def __repr__(self):
        return (f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, "
                f"version={self.version})")


cdef object node_arg(str name, const ort.OrtTypeInfo* type_info, int* elem_out):
    cdef ort.ONNXType onnx_type = ort.ONNX_TYPE_UNKNOWN
    cdef const ort.OrtTensorTypeAndShapeInfo* tensor_info = NULL
    cdef ort.ONNXTensorElementDataType elem = ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
    cdef size_t count = 0, i
    cdef int64_t* dims = NULL
    cdef const char** symbolic = NULL
    check(ort.GetOnnxTypeFromTypeInfo(type_info, &onnx_type))
    elem_out[0] = -1
    if onnx_type != ort.ONNX_TYPE_TENSOR and onnx_type != ort.ONNX_TYPE_SPARSETENSOR:
        kind = {ort.ONNX_TYPE_SEQUENCE: "seq", ort.ONNX_TYPE_MAP: "map",
                ort.ONNX_TYPE_OPTIONAL: "optional", ort.ONNX_TYPE_OPAQUE: "opaque"}.get(onnx_type, "unknown")
        return NodeArg(name, kind, None)
    check(ort.CastTypeInfoToTensorInfo(type_info, &tensor_info))
    check(ort.GetTensorElementType(tensor_info, &elem))
    check(ort.GetDimensionsCount(tensor_info, &count))
    dims = <int64_t*>malloc((count + 1) * sizeof(int64_t))
    symbolic = <const char**>malloc((count + 1) * sizeof(char*))
    if dims == NULL or symbolic == NULL:
        free(dims)
        free(symbolic)
        raise MemoryError()
    try:
        check(ort.GetDimensions(tensor_info, dims, count))
        check(ort.GetSymbolicDimensions(tensor_info, symbolic, count))
        shape = []
        for i in range(count):
            if dims[i] >= 0:
                shape.append(dims[i])
            elif symbolic[i] != NULL and symbolic[i][0] != 0:
                shape.append(symbolic[i][:strlen(symbolic[i])].decode("utf-8"))
            else:
                shape.append(None)
    finally:
        free(dims)
        free(symbolic)
    elem_out[0] = <int>elem
    type_name = tensor_type_name(<int>elem)
    if onnx_type == ort.ONNX_TYPE_SPARSETENSOR:
        type_name = "sparse_" + type_name
    return NodeArg(name, type_name, shape)


cdef object read_model_metadata(ort.OrtSession* session):
    cdef ort.OrtModelMetadata* meta = NULL
    cdef ort.OrtAllocator* allocator = NULL
    cdef char* text = NULL
    cdef char** keys = NULL
    cdef int64_t n_keys = 0, i, version = 0
    check(ort.GetAllocatorWithDefaultOptions(&allocator))
    check(ort.SessionGetModelMetadata(session, &meta))
    try:
        check(ort.ModelMetadataGetProducerName(meta, allocator, &text))
        producer = _take_string(text, allocator)
        check(ort.ModelMetadataGetGraphName(meta, allocator, &text))
        graph = _take_string(text, allocator)
        check(ort.ModelMetadataGetDomain(meta, allocator, &text))
        domain = _take_string(text, allocator)
        check(ort.ModelMetadataGetDescription(meta, allocator, &text))
        description = _take_string(text, allocator)
        check(ort.ModelMetadataGetGraphDescription(meta, allocator, &text))
        graph_description = _take_string(text, allocator)
        check(ort.ModelMetadataGetVersion(meta, &version))
        check(ort.ModelMetadataGetCustomMetadataMapKeys(meta, allocator, &keys, &n_keys))
        custom = {}
        if keys != NULL:
            try:
                names = [keys[i][:strlen(keys[i])].decode("utf-8") for i in range(n_keys)]
            finally:
                for i in range(n_keys):
                    check(ort.AllocatorFree(allocator, keys[i]))
                check(ort.AllocatorFree(allocator, keys))
            for key in names:
                check(ort.ModelMetadataLookupCustomMetadataMap(meta, allocator, key.encode(), &text))
                custom[key] = _take_string(text, allocator)
    finally:
        ort.ReleaseModelMetadata(meta)
    return ModelMetadata(producer, graph, domain, description, graph_description, version, custom)
