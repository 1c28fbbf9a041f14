"""What a session says about its model: NodeArg (name, type string, shape of an input or output)
and ModelMetadata, read through the C API's type-info and model-metadata calls."""

from libc.stdint cimport int64_t, uint64_t
from libc.string cimport strlen

from ortagent cimport _capi as ort
from ortagent._runtime cimport check, shared_runtime, take_ort_string



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
    """The NodeArg of a type info, with onnxruntime's type strings for every kind
    ('seq(map(int64,tensor(float)))', 'optional(tensor(float))', 'sparse_tensor(float)');
    elem_out[0] is the element type of a dense tensor, -1 for any other kind."""
    desc = describe_type(type_info)
    elem_out[0] = desc[1] if desc[0] == "tensor" else -1
    return NodeArg(name, type_string(desc), type_shape(desc))


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
        producer = take_ort_string(text, allocator)
        check(ort.ModelMetadataGetGraphName(meta, allocator, &text))
        graph = take_ort_string(text, allocator)
        check(ort.ModelMetadataGetDomain(meta, allocator, &text))
        domain = take_ort_string(text, allocator)
        check(ort.ModelMetadataGetDescription(meta, allocator, &text))
        description = take_ort_string(text, allocator)
        check(ort.ModelMetadataGetGraphDescription(meta, allocator, &text))
        graph_description = take_ort_string(text, allocator)
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
                custom[key] = take_ort_string(text, allocator)
    finally:
        ort.ReleaseModelMetadata(meta)
    return ModelMetadata(producer, graph, domain, description, graph_description, version, custom)


# ---- which execution provider runs which nodes (onnxruntime >= 1.24) ---------------------------------

class OrtEpAssignedNode:
    """A node as assigned to an execution provider: ``name``, ``domain``, ``op_type``."""

    __slots__ = ("name", "domain", "op_type")

    def __init__(self, name, domain, op_type):
        self.name = name
        self.domain = domain
        self.op_type = op_type

    def __repr__(self):
        return f"OrtEpAssignedNode(name={self.name!r}, domain={self.domain!r}, op_type={self.op_type!r})"


class OrtEpAssignedSubgraph:
    """Nodes an execution provider runs together: ``ep_name`` and ``get_nodes()``."""

    __slots__ = ("ep_name", "_nodes")

    def __init__(self, ep_name, nodes):
        self.ep_name = ep_name
        self._nodes = list(nodes)

    def get_nodes(self):
        return list(self._nodes)

    def __repr__(self):
        return f"OrtEpAssignedSubgraph(ep_name={self.ep_name!r}, nodes={self._nodes!r})"


cdef str _text(const char* value):
    return value[:strlen(value)].decode("utf-8", "replace") if value != NULL else ""


cdef list read_graph_assignment(ort.OrtSession* session):
    """The subgraphs and nodes each execution provider was given (the session's options must set
    'session.record_ep_graph_assignment_info' to '1')."""
    cdef const ort.OrtEpAssignedSubgraph* const* subgraphs = NULL
    cdef const ort.OrtEpAssignedNode* const* nodes = NULL
    cdef size_t n_subgraphs = 0, n_nodes = 0, i, j
    cdef const char* ep_name = NULL
    cdef const char* name = NULL
    cdef const char* domain = NULL
    cdef const char* op_type = NULL
    check(ort.Session_GetEpGraphAssignmentInfo(session, &subgraphs, &n_subgraphs))
    result = []
    for i in range(n_subgraphs):
        check(ort.EpAssignedSubgraph_GetEpName(subgraphs[i], &ep_name))
        check(ort.EpAssignedSubgraph_GetNodes(subgraphs[i], &nodes, &n_nodes))
        members = []
        for j in range(n_nodes):
            check(ort.EpAssignedNode_GetName(nodes[j], &name))
            check(ort.EpAssignedNode_GetDomain(nodes[j], &domain))
            check(ort.EpAssignedNode_GetOperatorType(nodes[j], &op_type))
            members.append(OrtEpAssignedNode(_text(name), _text(domain), _text(op_type)))
        result.append(OrtEpAssignedSubgraph(_text(ep_name), members))
    return result


# ---- profiling ---------------------------------------------------------------------------------------

cdef str end_profiling(ort.OrtSession* session):
    """End the session's profiling: the profile file's name ('' when profiling was off)."""
    cdef ort.OrtAllocator* allocator = NULL
    cdef char* name = NULL
    check(ort.GetAllocatorWithDefaultOptions(&allocator))
    check(ort.SessionEndProfiling(session, allocator, &name))
    return take_ort_string(name, allocator)


cdef object profiling_start_ns(ort.OrtSession* session):
    cdef uint64_t start = 0
    check(ort.SessionGetProfilingStartTimeNs(session, &start))
    return start
