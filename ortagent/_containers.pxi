"""ONNX types beyond tensors: how a model's inputs and outputs are described (sequences, maps,
optionals, sparse tensors), and sequence, map and optional values to and from Python.

A type is described once, when a session reads its inputs and outputs, as a small tuple (a
"type descriptor"), from which both onnxruntime's type string (``'seq(map(int64,tensor(float)))'``)
and the conversion of feeds follow:

    ("tensor", elem, shape)          ("sparse_tensor", elem, shape)
    ("seq", inner)                   ("map", key_elem, value_descriptor)
    ("optional", inner)              ("opaque",)  ("unknown",)

Python lists become sequences, dicts maps (keys and values converted to the declared element
types), and outputs come back as onnxruntime's Python API gives them: a sequence as a list, a
map as a dict of Python scalars, an optional without a value as None.
"""

from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport strlen

from ortagent cimport _capi as ort
from cpython.float cimport PyFloat_AsDouble
from cpython.long cimport PyLong_AsLongLong
from cpython.number cimport PyNumber_Check
from ortagent._element_types cimport (
    ortagent_element_info, ortagent_element_info_of, ORTAGENT_ELEM_STRING, ORTAGENT_ELEM_INT64, ORTAGENT_ELEM_FLOAT,
    ORTAGENT_ELEM_DOUBLE,
)
from ortagent._runtime cimport check, ensure_loaded, shared_runtime, live_handle_counts, count_add, HANDLE_VALUE

from ortagent.errors import OrtInvalidArgument, OrtInvalidType, OrtNotImplemented, FeedConversionError




# ---- type descriptors ----------------------------------------------------------------------------

cdef list _tensor_shape(const ort.OrtTensorTypeAndShapeInfo* info):
    """Dimensions as ints, symbolic names, or None when unknown."""
    cdef size_t count = 0, i
    check(ort.GetDimensionsCount(info, &count))
    cdef int64_t* dims = <int64_t*>malloc((count + 1) * sizeof(int64_t))
    cdef const char** symbolic = <const char**>malloc((count + 1) * sizeof(char*))
    if dims == NULL or symbolic == NULL:
        free(dims)
        free(symbolic)
        raise MemoryError()
    shape = []
    try:
        check(ort.GetDimensions(info, dims, count))
        check(ort.GetSymbolicDimensions(info, symbolic, count))
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
    return shape


cdef object _owned_type(ort.OrtTypeInfo* info):
    """The descriptor of a type info this function then releases."""
    try:
        return describe_type(info)
    finally:
        ort.ReleaseTypeInfo(info)


cdef object describe_type(const ort.OrtTypeInfo* info):
    cdef ort.ONNXType kind = ort.ONNX_TYPE_UNKNOWN
    cdef const ort.OrtTensorTypeAndShapeInfo* tensor = NULL
    cdef const ort.OrtSequenceTypeInfo* sequence = NULL
    cdef const ort.OrtMapTypeInfo* mapping = NULL
    cdef const ort.OrtOptionalTypeInfo* optional = NULL
    cdef ort.OrtTypeInfo* inner = NULL
    cdef ort.ONNXTensorElementDataType elem = ort.ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
    check(ort.GetOnnxTypeFromTypeInfo(info, &kind))
    if kind == ort.ONNX_TYPE_TENSOR or kind == ort.ONNX_TYPE_SPARSETENSOR:
        check(ort.CastTypeInfoToTensorInfo(info, &tensor))
        if tensor == NULL:
            return ("unknown",)
        check(ort.GetTensorElementType(tensor, &elem))
        return ("tensor" if kind == ort.ONNX_TYPE_TENSOR else "sparse_tensor", <int>elem,
                _tensor_shape(tensor))
    if kind == ort.ONNX_TYPE_SEQUENCE:
        check(ort.CastTypeInfoToSequenceTypeInfo(info, &sequence))
        if sequence == NULL:
            return ("unknown",)
        check(ort.GetSequenceElementType(sequence, &inner))
        return ("seq", _owned_type(inner))
    if kind == ort.ONNX_TYPE_MAP:
        check(ort.CastTypeInfoToMapTypeInfo(info, &mapping))
        if mapping == NULL:
            return ("unknown",)
        check(ort.GetMapKeyType(mapping, &elem))
        check(ort.GetMapValueType(mapping, &inner))
        return ("map", <int>elem, _owned_type(inner))
    if kind == ort.ONNX_TYPE_OPTIONAL:
        check(ort.CastTypeInfoToOptionalTypeInfo(info, &optional))
        if optional == NULL:
            return ("unknown",)
        check(ort.GetOptionalContainedTypeInfo(optional, &inner))
        return ("optional", _owned_type(inner))
    if kind == ort.ONNX_TYPE_OPAQUE:
        return ("opaque",)
    return ("unknown",)


cdef str _element_name(int elem):
    cdef const ortagent_element_info* info = ortagent_element_info_of(elem)
    return info.name.decode() if info != NULL and info.name != NULL else f"undefined:{elem}"


def type_string(desc):
    """onnxruntime's NodeArg.type for a descriptor: 'tensor(float)', 'seq(tensor(int64))',
    'map(int64,tensor(float))', 'optional(seq(tensor(float)))', 'sparse_tensor(float)'."""
    kind = desc[0]
    if kind == "tensor":
        return tensor_type_name(desc[1])
    if kind == "sparse_tensor":
        return f"sparse_tensor({_element_name(desc[1])})"
    if kind == "seq":
        return f"seq({type_string(desc[1])})"
    if kind == "map":
        return f"map({_element_name(desc[1])},{type_string(desc[2])})"
    if kind == "optional":
        return f"optional({type_string(desc[1])})"
    return kind


def type_shape(desc):
    """onnxruntime's NodeArg.shape for a descriptor: a tensor's dimensions (an optional
    tensor's too), [] for the other kinds."""
    if desc[0] in ("tensor", "sparse_tensor"):
        return list(desc[2])
    if desc[0] == "optional":
        return type_shape(desc[1])
    return []


def describe_value_type(value):
    """The descriptor of an OrtValue's own type (shapes as the value has them)."""
    if not isinstance(value, OrtValue):
        raise OrtInvalidType(f"expected an ortagent.OrtValue, got {type(value).__name__}")
    cdef OrtValue v = value
    v.require_handle()
    cdef ort.OrtTypeInfo* info = NULL
    check(ort.GetTypeInfo(v.handle, &info))
    return _owned_type(info)


# ---- feeds: Python objects -> values --------------------------------------------------------------

cdef object _dtype_of(int elem):
    cdef const ortagent_element_info* info = ortagent_element_info_of(elem)
    np = numpy_module()
    if info == NULL or info.numpy_name == NULL or info.numpy_name[0] == 0 or info.from_ml_dtypes:
        raise OrtNotImplemented(f"{tensor_type_name(elem)} items cannot be built from Python objects")
    return np.dtype(info.numpy_name.decode())


cdef object tensor_array(object feed, int elem, object name):
    """A NumPy array for a tensor feed given as an array, a NumPy scalar or a (nested) list.
    Lists take the declared element type (as onnxruntime does); np.void items of a string
    tensor are taken as their raw bytes, all of them."""
    np = numpy_module()
    if isinstance(feed, (list, tuple)):
        dtype = object if elem == ORTAGENT_ELEM_STRING else _dtype_of(elem)
        try:
            return np.array(feed, dtype=dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise OrtInvalidArgument(f"input {name!r}: cannot make a {tensor_type_name(elem)} tensor "
                                     f"from the list given: {exc}") from None
    if isinstance(feed, np.ndarray) and feed.dtype.kind == "V" and elem == ORTAGENT_ELEM_STRING:
        strings = np.empty(feed.shape, dtype=object)
        flat = strings.reshape(-1)
        for i, item in enumerate(feed.reshape(-1)):
            flat[i] = item.tobytes()        # every byte, trailing NULs too, as onnxruntime's module
        return strings
    return feed


cdef bint is_plain_tensor_feed(object feed, object desc):
    """Whether the session's fast path (a NumPy array fed to a tensor input) takes `feed`."""
    if desc[0] != "tensor":
        return False
    np = numpy_module()
    if not isinstance(feed, np.ndarray):
        return isinstance(feed, np.generic)
    return feed.dtype.kind != "V"


cdef ort.OrtValue* value_for_feed(object feed, object desc, object name, list keep) except NULL:
    """A new value (the caller owns it) for `feed` given to an input described by `desc`.
    Arrays that the value views are appended to `keep`, which the caller keeps alive as long
    as the value."""
    ensure_loaded()
    kind = desc[0]
    if isinstance(feed, OrtValue):
        raise OrtInvalidType(f"input {name!r}: OrtValues are fed as they are, not converted")
    if kind == "tensor":
        array = tensor_array(feed, desc[1], name)
        keep.append(array)
        return tensor_for_feed(array, name, desc[1], keep)
    if kind == "seq":
        return _sequence_value(feed, desc[1], name, keep)
    if kind == "map":
        return _map_value(feed, desc[1], desc[2], name, keep)
    if kind == "optional":
        if feed is None:                # an input run() leaves out; here, an initializer's value
            raise OrtNotImplemented(
                f"{name!r} is {type_string(desc)}: an optional without an element cannot be made "
                "through onnxruntime's C API; feed a value")
        return value_for_feed(feed, desc[1], name, keep)
    raise OrtNotImplemented(f"input {name!r} is {type_string(desc)}, which ortagent cannot feed")


cdef ort.OrtValue* _sequence_value(object feed, object inner, object name, list keep) except NULL:
    if not isinstance(feed, (list, tuple)):
        raise OrtInvalidType(f"input {name!r} is seq({type_string(inner)}): give a list, got "
                             f"{type(feed).__name__}")
    cdef Py_ssize_t n = len(feed), i, made = 0
    if n == 0:
        if inner[0] != "tensor" and type_string(inner) not in _ZIPMAP_LABELS:
            raise OrtNotImplemented(f"input {name!r}: an empty sequence of {type_string(inner)} cannot be "
                                    "made (OrtApi::CreateValue needs at least one element)")
        return _made_by_a_model(("seq", inner))
    if inner[0] != "tensor" and inner[0] != "map":
        raise OrtNotImplemented(f"input {name!r}: sequences of {type_string(inner)} cannot be made "
                                "through onnxruntime's C API")
    cdef ort.OrtValue** items = <ort.OrtValue**>malloc(n * sizeof(ort.OrtValue*))
    cdef ort.OrtValue* result = NULL
    if items == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            items[i] = value_for_feed(feed[i], inner, f"{name}[{i}]", keep)
            made += 1
        check(ort.CreateValue(<const ort.OrtValue* const*>items, <size_t>n, ort.ONNX_TYPE_SEQUENCE,
                              &result))
    finally:
        for i in range(made):
            ort.ReleaseValue(items[i])
        free(items)
    return result


# Maps from dicts, by the rules of onnxruntime's Python module: the first key decides the map's
# key type (an int or any other number: int64; a str: string; anything else is refused), every
# key is then read as that type (int64 through __index__, within int64's range; string as str()
# of the key), every value as a C float (a float, or any number through __float__ / __index__).
# onnxruntime's module always makes map(int64|string, tensor(float)) and leaves it to the run to
# refuse a map of another type; ortagent does the same, except that a dict whose key type is the
# input's and whose value type is not float gets values of the input's type (onnxruntime's
# module cannot feed those maps at all). Refusals read as onnxruntime's (their quirks included:
# a value's error names the key's C type) and are FeedConversionErrors, a RuntimeError as there.

cdef object _map_key_kind(object key, object name):
    """"int64_t" or "string": the key type onnxruntime's module makes of a dict whose first key
    is `key`."""
    if isinstance(key, int) or PyNumber_Check(key):
        return "int64_t"
    if isinstance(key, str):
        return "string"
    raise FeedConversionError(f"Key type must be int or string (not {type(key)}) for input '{name}'.")


cdef object _map_float(object value, object ctype, object name):
    """`value` as onnxruntime's module reads a map value (a Python float, double precision)."""
    if not isinstance(value, float) and not PyNumber_Check(value):
        raise FeedConversionError(f"Unexpected value type  {type(value)}, it cannot be linked to C type "
                                  f"{ctype} for input '{name}'.")
    try:
        return PyFloat_AsDouble(value)
    except Exception as exc:
        # onnxruntime's module leaves this error pending and reports it as '<class ...>: text'
        raise FeedConversionError(f"{type(exc)}: {exc}") from exc


cdef object _map_key(object key, object ctype, object name):
    """A key of a dict fed for a map, read as `ctype` ("int64_t" or "string")."""
    if ctype == "int64_t":
        try:
            return PyLong_AsLongLong(key)
        except (TypeError, OverflowError):
            pass
    else:
        try:
            return str(key)
        except Exception:
            pass
    raise FeedConversionError(f"Unexpected key type  {type(key)}, it cannot be linked to C type {ctype} "
                              f"for input '{name}'.")


cdef ort.OrtValue* _map_value(object feed, int key_elem, object value_desc, object name,
                              list keep) except NULL:
    if not isinstance(feed, dict):
        raise OrtInvalidType(f"input {name!r} is map({_element_name(key_elem)},{type_string(value_desc)}): "
                             f"give a dict, got {type(feed).__name__}")
    if value_desc[0] != "tensor":
        raise OrtNotImplemented(f"input {name!r}: maps of {type_string(value_desc)} cannot be made "
                                "through onnxruntime's C API")
    if not feed:
        raise FeedConversionError("Size of dictionary is empty, unable to run the prediction.")
    np = numpy_module()
    ctype = _map_key_kind(next(iter(feed)), name)
    cdef int made_key = ORTAGENT_ELEM_STRING if ctype == "string" else ORTAGENT_ELEM_INT64
    cdef int made_value = ORTAGENT_ELEM_FLOAT
    if made_key == key_elem and value_desc[1] != ORTAGENT_ELEM_FLOAT:
        made_value = value_desc[1]          # a map onnxruntime's module cannot feed: the input's type
    values = None
    if made_value == ORTAGENT_ELEM_FLOAT or made_value == ORTAGENT_ELEM_DOUBLE:
        # onnxruntime's order: each key, then its value
        key_list = []
        value_list = []
        for key, value in feed.items():
            key_list.append(_map_key(key, ctype, name))
            value_list.append(_map_float(value, ctype, name))
        with np.errstate(over="ignore"):        # a C cast: a double too large for a float is inf
            values = np.array(value_list, dtype=np.float32 if made_value == ORTAGENT_ELEM_FLOAT else np.float64)
    else:
        key_list = [_map_key(key, ctype, name) for key in feed]
        values = tensor_array(list(feed.values()), made_value, name)
    if made_key == ORTAGENT_ELEM_STRING:
        keys = np.array(key_list, dtype=object).reshape(len(key_list))
    else:
        keys = np.array(key_list, dtype=np.int64)
    keep.append(keys)
    keep.append(values)
    cdef ort.OrtValue* parts[2]
    parts[0] = tensor_for_feed(keys, name, made_key, keep)
    parts[1] = NULL
    cdef ort.OrtValue* result = NULL
    try:
        parts[1] = tensor_for_feed(values, name, made_value, keep)
        check(ort.CreateValue(<const ort.OrtValue* const*>parts, 2, ort.ONNX_TYPE_MAP, &result))
    finally:
        ort.ReleaseValue(parts[0])
        if parts[1] != NULL:
            ort.ReleaseValue(parts[1])
    return result


# Values the C API cannot create (OrtApi::CreateValue needs at least one element): a one-node
# model makes each, once per type, on the CPU. (It could make optionals without an element too,
# but onnxruntime's Run crashes when one is fed to it: run() leaves such an input out instead.)
_MAKERS = {}
# Empty sequences of maps (onnxruntime registers these two only) come from ZipMap (ai.onnx.ml) over
# a [0, 1] tensor, with one class label of the map's key type.
_ZIPMAP_LABELS = {"map(int64,tensor(float))": {"classlabels_int64s": [0]},
                  "map(string,tensor(float))": {"classlabels_strings": ["0"]}}


cdef object _type_proto(object desc):
    from onnx import helper
    if desc[0] == "tensor":
        return helper.make_tensor_type_proto(desc[1], None)
    if desc[0] == "seq":
        return helper.make_sequence_type_proto(_type_proto(desc[1]))
    if desc[0] == "map":
        return helper.make_map_type_proto(desc[1], _type_proto(desc[2]))
    if desc[0] == "optional":
        return helper.make_optional_type_proto(_type_proto(desc[1]))
    raise OrtNotImplemented(f"values of type {type_string(desc)} cannot be made")


cdef ort.OrtValue* _made_by_a_model(object desc) except NULL:
    """A new value (the caller owns it): an empty sequence of the type `desc` (of tensors, or of
    the maps ZipMap makes)."""
    key = type_string(desc)
    session = _MAKERS.get(key)
    if session is None:
        from onnx import helper, TensorProto
        opsets = [helper.make_opsetid("", 18)]
        if desc[1][0] == "tensor":
            nodes = [helper.make_node("SequenceEmpty", [], ["v"], dtype=desc[1][1])]
        else:
            nodes = [helper.make_node("Constant", [], ["rows"], value=helper.make_tensor(
                         "rows", TensorProto.FLOAT, [0, 1], [])),
                     helper.make_node("ZipMap", ["rows"], ["v"], domain="ai.onnx.ml",
                                      **_ZIPMAP_LABELS[type_string(desc[1])])]
            opsets.append(helper.make_opsetid("ai.onnx.ml", 1))
        graph = helper.make_graph(nodes, "maker", [], [helper.make_value_info("v", _type_proto(desc))])
        model = helper.make_model(graph, ir_version=9, opset_imports=opsets)
        with strict_providers():
            session = InferenceSession(model.SerializeToString(), helper_options(),
                                       providers=["CPUExecutionProvider"])
        _MAKERS[key] = session
    (made,) = session.run_with_ort_values(None, {})
    cdef OrtValue value = made
    cdef ort.OrtValue* handle = value.handle
    value.handle = NULL              # handed over to the caller (the maker session stays cached)
    count_add(&_live[<int>HANDLE_VALUE], -1)
    return handle


# ---- outputs: values -> Python objects ------------------------------------------------------------

cdef object python_from_value(OrtValue value):
    """A value as onnxruntime's run() gives it: a tensor as a NumPy array, a sequence as a list,
    a map as a dict of Python scalars, an optional without an element as None."""
    value.require_handle()
    cdef int present = 1
    cdef ort.ONNXType kind = ort.ONNX_TYPE_UNKNOWN
    check(ort.HasValue(value.handle, &present))
    if not present:
        return None
    check(ort.GetValueType(value.handle, &kind))
    if kind == ort.ONNX_TYPE_TENSOR:
        return value_to_numpy(value, True)
    if kind == ort.ONNX_TYPE_SEQUENCE:
        return [python_from_value(item) for item in _parts(value)]
    if kind == ort.ONNX_TYPE_MAP:
        keys, values = _parts(value)
        return dict(zip(value_to_numpy(keys, True).tolist(), value_to_numpy(values, True).tolist()))
    if kind == ort.ONNX_TYPE_SPARSETENSOR:
        raise OrtNotImplemented("sparse tensor outputs cannot be read as NumPy arrays; use "
                                "run_with_ort_values()")
    raise OrtNotImplemented(f"outputs of ONNX type {<int>kind} cannot be converted to Python objects")


cdef list _parts(OrtValue value):
    """The elements of a sequence, or the keys and values tensors of a map, as new values."""
    cdef size_t count = 0, i
    cdef ort.OrtAllocator* allocator = NULL
    cdef ort.OrtValue* part = NULL
    check(ort.GetValueCount(value.handle, &count))
    check(ort.GetAllocatorWithDefaultOptions(&allocator))
    result = []
    for i in range(count):
        check(ort.GetValue(value.handle, <int>i, allocator, &part))
        result.append(wrap_value(part, None, value.session))
        part = NULL
    return result


def value_to_python(value):
    """Python-level entry to python_from_value (an ortagent.OrtValue of any ONNX type)."""
    if not isinstance(value, OrtValue):
        raise OrtInvalidType(f"expected an ortagent.OrtValue, got {type(value).__name__}")
    return python_from_value(value)


def value_from_python(obj, type_str):
    """An ortagent.OrtValue of ONNX type `type_str` (e.g. 'seq(tensor(float))') built from a
    Python object (a list for a sequence, a dict for a map)."""
    desc = parse_type_string(type_str)
    keep = []
    cdef ort.OrtValue* handle = value_for_feed(obj, desc, "value", keep)
    # sequences and maps own copies of their elements; a tensor views the array in `keep`
    return wrap_value(handle, keep if desc[0] in ("tensor", "optional") else None, None)


def parse_type_string(text):
    """The descriptor of an onnxruntime type string (the inverse of type_string, shapes
    unknown)."""
    if not isinstance(text, str):
        raise OrtInvalidType(f"a type string must be a str, got {type(text).__name__}")
    desc, rest = _parse(text.replace(" ", ""))
    if rest:
        raise OrtInvalidArgument(f"cannot parse ONNX type string {text!r}")
    return desc


cdef dict _ELEMENT_NUMBERS = {}


cdef int _element_number(str name, str text) except -1:
    cdef const ortagent_element_info* info
    if not _ELEMENT_NUMBERS:
        for number in range(1, 64):
            info = ortagent_element_info_of(number)
            if info != NULL and info.name != NULL:
                _ELEMENT_NUMBERS[info.name.decode()] = number
    if name not in _ELEMENT_NUMBERS:
        raise OrtInvalidArgument(f"unknown element type {name!r} in ONNX type string {text!r}")
    return _ELEMENT_NUMBERS[name]


cdef tuple _parse(str text):
    for prefix in ("tensor(", "sparse_tensor(", "seq(", "map(", "optional("):
        if text.startswith(prefix):
            break
    else:
        raise OrtInvalidArgument(f"cannot parse ONNX type string {text!r}")
    body = text[len(prefix):]
    if prefix in ("tensor(", "sparse_tensor("):
        end = body.find(")")
        if end < 0:
            raise OrtInvalidArgument(f"cannot parse ONNX type string {text!r}")
        return (prefix[:-1], _element_number(body[:end], text), None), body[end + 1:]
    if prefix == "map(":
        comma = body.find(",")
        if comma < 0:
            raise OrtInvalidArgument(f"cannot parse ONNX type string {text!r}")
        key = _element_number(body[:comma], text)
        inner, rest = _parse(body[comma + 1:])
        if not rest.startswith(")"):
            raise OrtInvalidArgument(f"cannot parse ONNX type string {text!r}")
        return ("map", key, inner), rest[1:]
    inner, rest = _parse(body)
    if not rest.startswith(")"):
        raise OrtInvalidArgument(f"cannot parse ONNX type string {text!r}")
    return (prefix[:-1], inner), rest[1:]


cdef int check_feedable(OrtValue value, object name) except -1:
    """An OrtValue given to onnxruntime's Run must hold something: its Run crashes on an optional
    without an element (one that a model output, say). run() leaves such an input out instead,
    which onnxruntime reads as no element; this check is for the other places."""
    cdef int present = 0
    value.require_handle()
    check(ort.HasValue(value.handle, &present))
    if not present:
        raise OrtNotImplemented(f"input {name!r}: an OrtValue without a value (an optional without an "
                                "element) cannot be given to onnxruntime's Run, which crashes on one; "
                                "for an input of an optional type, leave the input out instead")
    return 0
