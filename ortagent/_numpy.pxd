# cython: language_level=3
"""The small part of NumPy's C API that ortagent uses (declared by hand so that nothing imports
NumPy at module import). NumPy binds its C API per extension module: each module that uses it
calls numpy_api() before its first use (after _dtypes.ensure_numpy has imported NumPy)."""

from cpython.object cimport PyObject, PyTypeObject


cdef extern from "numpy/arrayobject.h":
    ctypedef Py_ssize_t npy_intp

    ctypedef struct PyArray_Descr:
        PyTypeObject* typeobj
        char byteorder
        int type_num

    ctypedef struct PyArrayObject

    enum NPY_TYPES:
        NPY_BOOL
        NPY_BYTE
        NPY_UBYTE
        NPY_SHORT
        NPY_USHORT
        NPY_INT
        NPY_UINT
        NPY_LONG
        NPY_ULONG
        NPY_LONGLONG
        NPY_ULONGLONG
        NPY_FLOAT
        NPY_DOUBLE
        NPY_LONGDOUBLE
        NPY_CFLOAT
        NPY_CDOUBLE
        NPY_CLONGDOUBLE
        NPY_OBJECT
        NPY_STRING
        NPY_UNICODE
        NPY_VOID
        NPY_HALF
        NPY_USERDEF
        NPY_INT8
        NPY_UINT8
        NPY_INT16
        NPY_UINT16
        NPY_INT32
        NPY_UINT32
        NPY_INT64
        NPY_UINT64

    enum:
        NPY_ARRAY_C_CONTIGUOUS
        NPY_ARRAY_ALIGNED
        NPY_ARRAY_WRITEABLE
        NPY_ARRAY_CARRAY
        NPY_ARRAY_CARRAY_RO

    PyTypeObject PyArray_Type

    int _import_array() except -1
    void** PyArray_API              # this module's table; NULL until _import_array()
    bint PyArray_Check(object)
    int PyArray_TYPE(PyArrayObject*)
    PyArray_Descr* PyArray_DESCR(PyArrayObject*)
    int PyArray_NDIM(PyArrayObject*)
    npy_intp* PyArray_DIMS(PyArrayObject*)
    void* PyArray_DATA(PyArrayObject*)
    int PyArray_FLAGS(PyArrayObject*)
    npy_intp PyArray_NBYTES(PyArrayObject*)
    npy_intp PyArray_SIZE(PyArrayObject*)
    npy_intp PyArray_ITEMSIZE(PyArrayObject*)
    bint PyArray_ISNOTSWAPPED(PyArrayObject*)

    # Steals the reference to `descr`; a NULL result raises.
    object PyArray_NewFromDescr(PyTypeObject* subtype, PyArray_Descr* descr, int nd,
                                const npy_intp* dims, const npy_intp* strides, void* data,
                                int flags, PyObject* obj)
    # New reference.
    PyArray_Descr* PyArray_DescrFromType(int type_num) except NULL
    # Steals the reference to `base`.
    int PyArray_SetBaseObject(PyArrayObject* arr, PyObject* base) except -1


cdef inline int numpy_api() except -1:
    """Bind NumPy's C API in the calling extension module (idempotent)."""
    if PyArray_API == NULL:
        _import_array()
    return 0
