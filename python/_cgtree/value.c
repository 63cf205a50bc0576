/* value.c — cgtree.Value: a segment output, and its zero-copy exports.
 *
 * A Value is the cgt_value handle plus the tree it belongs to (a strong
 * reference: the tree, and so the pool memory, outlives every Value and every
 * export of one). Its life is the C value's life: live from the run that made
 * it until Value.release() / Tree.release(v) or the next step_begin; after
 * that every use raises StaleValue. Dropping the Python object does not
 * release the value (as in C, values die with their step unless released).
 *
 * Exports. __dlpack__ hands out the value's bytes as a 1-D uint8 tensor
 * (shape [nbytes]), as a DLPack 1.0 versioned, writable tensor to consumers
 * that ask for max_version >= (1, 0) and as the unversioned one otherwise; _dlpack(code, bits, shape) hands out the same memory
 * with a dtype and a shape, which cgtree.Value.view builds on. The exported
 * DLManagedTensor holds a reference to the Value, so the memory stays
 * allocated while a consumer holds it — but the export is only *valid*
 * while the value is live: once it is released or its step ends, later
 * runs may write over that memory, and the consumer reads whatever they
 * wrote. cgtree cannot revoke an export; the Value itself says StaleValue.
 *
 * Streams (CUDA): the consumer passes its stream to __dlpack__; we make that
 * stream wait for the tree's stream with an event, as the DLPack protocol
 * asks of a producer (None means the legacy default stream; -1 asks for no
 * synchronization). __cuda_array_interface__ instead names the tree's stream
 * in its "stream" entry and leaves the wait to the consumer.
 */
#include "pycgt.h"

#include <string.h>

#ifdef CGT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

PyObject *pycgt_value_new(PyTree *tree, cgt_value v) {
  PyValue *self = PyObject_New(PyValue, &PyValue_Type);
  if (!self)
    return NULL;
  self->tree = (PyTree *)Py_NewRef((PyObject *)tree);
  self->v = v;
  return (PyObject *)self;
}

static void value_dealloc(PyValue *self) {
  Py_DECREF(self->tree);
  PyObject_Free(self);
}

/* The value's memory, or -1 with StaleValue (or StateError for a closed tree) set. */
static int value_memory(PyValue *self, void **ptr, size_t *bytes, const char *what) {
  if (!self->tree->t) {
    pycgt_raise(CGT_ERR_STATE, what, "the value's tree is closed");
    return -1;
  }
  cgt_status st = cgt_value_ptr(self->tree->t, self->v, ptr, bytes);
  if (st != CGT_OK) {
    pycgt_raise_tree(self->tree, st, what, NULL);
    return -1;
  }
  return 0;
}

static PyObject *value_ptr(PyValue *self, void *closure) {
  (void)closure;
  void *p;
  size_t n;
  if (value_memory(self, &p, &n, "Value.ptr") < 0)
    return NULL;
  return PyLong_FromVoidPtr(p);
}

static PyObject *value_nbytes(PyValue *self, void *closure) {
  (void)closure;
  void *p;
  size_t n;
  if (value_memory(self, &p, &n, "Value.nbytes") < 0)
    return NULL;
  return PyLong_FromSize_t(n);
}

static PyObject *value_live(PyValue *self, void *closure) {
  (void)closure;
  void *p;
  size_t n;
  return PyBool_FromLong(self->tree->t && cgt_value_ptr(self->tree->t, self->v, &p, &n) == CGT_OK);
}

static PyObject *value_tree(PyValue *self, void *closure) {
  (void)closure;
  return Py_NewRef((PyObject *)self->tree);
}

static PyObject *value_handle(PyValue *self, void *closure) {
  (void)closure;
  return PyLong_FromUnsignedLongLong(self->v.bits);
}

static PyObject *value_release(PyValue *self, PyObject *unused) {
  (void)unused;
  if (!pycgt_tree_usable(self->tree, "Value.release"))
    return NULL;
  cgt_status st = cgt_value_release(self->tree->t, self->v);
  if (st != CGT_OK)
    return pycgt_raise_tree(self->tree, st, "Value.release", NULL);
  Py_RETURN_NONE;
}

/* ----------------------------------------------------------- DLPack */

/* One export: both managed-tensor flavours share it (only one is handed out). */
typedef struct value_export {
  DLManagedTensor managed;
  DLManagedTensorVersioned versioned;
  PyObject *owner; /* the Value */
  int64_t shape[]; /* ndim entries */
} value_export;

static void export_free(value_export *e) {
  /* A consumer may call the deleter from any thread. */
  PyGILState_STATE g = PyGILState_Ensure();
  Py_DECREF(e->owner);
  PyGILState_Release(g);
  PyMem_RawFree(e);
}

static void export_deleter(DLManagedTensor *m) { export_free(m->manager_ctx); }
static void export_deleter_versioned(DLManagedTensorVersioned *m) { export_free(m->manager_ctx); }

static void capsule_destructor(PyObject *capsule) {
  /* Only a capsule nobody consumed still owns its tensor. */
  if (PyCapsule_IsValid(capsule, DLPACK_CAPSULE_NAME)) {
    DLManagedTensor *m = PyCapsule_GetPointer(capsule, DLPACK_CAPSULE_NAME);
    if (m && m->deleter)
      m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, DLPACK_VERSIONED_CAPSULE_NAME)) {
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, DLPACK_VERSIONED_CAPSULE_NAME);
    if (m && m->deleter)
      m->deleter(m);
  }
}

/* 1 if the consumer's max_version (None or (major, minor)) accepts DLPack 1.x. */
static int wants_versioned(PyObject *max_version) {
  if (!max_version || max_version == Py_None || !PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1)
    return 0;
  long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
  if (major == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  return major >= 1;
}

/* Makes `stream` (a consumer's CUDA stream handle) wait for the tree's work. */
static int wait_for_tree(PyValue *self, PyObject *stream) {
#ifdef CGT_HAVE_CUDA
  if (self->tree->backend != CGT_BACKEND_CUDA)
    return 0;
  intptr_t s = 1; /* None: the legacy default stream */
  if (stream != Py_None) {
    s = (intptr_t)PyLong_AsSsize_t(stream);
    if (s == -1 && PyErr_Occurred())
      return -1;
    if (s == -1)
      return 0; /* the consumer asks for no synchronization */
  }
  cudaStream_t consumer = (cudaStream_t)s;
  cudaStream_t producer = (cudaStream_t)cgt_tree_stream(self->tree->t);
  if (consumer == producer)
    return 0;
  cudaEvent_t ev;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err == cudaSuccess) {
    err = cudaEventRecord(ev, producer);
    if (err == cudaSuccess)
      err = cudaStreamWaitEvent(consumer, ev, 0);
    cudaEventDestroy(ev);
  }
  if (err != cudaSuccess) {
    pycgt_raise(CGT_ERR_BACKEND, "Value.__dlpack__", cudaGetErrorString(err));
    return -1;
  }
#else
  (void)self;
  (void)stream;
#endif
  return 0;
}

static DLDevice value_device(PyValue *self) {
  DLDevice d;
  d.device_type = self->tree->backend == CGT_BACKEND_CUDA ? kDLCUDA : kDLCPU;
  d.device_id = self->tree->backend == CGT_BACKEND_CUDA ? self->tree->device : 0;
  return d;
}

/* A capsule with the value's memory as a compact tensor of `dtype` and `shape`. */
static PyObject *export_capsule(PyValue *self, DLDataType dtype, const int64_t *shape, int ndim, PyObject *stream,
                                int versioned) {
  void *p;
  size_t n;
  if (value_memory(self, &p, &n, "Value.__dlpack__") < 0)
    return NULL;
  uint64_t elems = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "Value.view", "negative dimension");
    if (shape[i] && elems > UINT64_MAX / (uint64_t)shape[i])
      return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "Value.view", "shape overflows");
    elems *= (uint64_t)shape[i];
  }
  uint64_t item = ((uint64_t)dtype.bits * dtype.lanes + 7) / 8;
  if (item == 0 || (elems && item > UINT64_MAX / elems) || elems * item > n) {
    PyErr_Format(pycgt_errors[CGT_ERR_INVALID_ARGUMENT],
                 "Value.view: %llu elements of %llu bytes do not fit in the value's %zu bytes",
                 (unsigned long long)elems, (unsigned long long)item, n);
    return NULL;
  }
  if (wait_for_tree(self, stream) < 0)
    return NULL;
  value_export *e = PyMem_RawMalloc(sizeof *e + (size_t)(ndim ? ndim : 1) * sizeof(int64_t));
  if (!e)
    return PyErr_NoMemory();
  memset(e, 0, sizeof *e);
  for (int i = 0; i < ndim; i++)
    e->shape[i] = shape[i];
  e->owner = Py_NewRef((PyObject *)self);
  DLTensor t;
  t.data = p;
  t.device = value_device(self);
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = e->shape;
  t.strides = NULL;
  t.byte_offset = 0;
  PyObject *capsule;
  if (versioned) {
    e->versioned.version.major = 1;
    e->versioned.version.minor = 0;
    e->versioned.manager_ctx = e;
    e->versioned.deleter = export_deleter_versioned;
    e->versioned.flags = 0; /* writable, not a copy */
    e->versioned.dl_tensor = t;
    capsule = PyCapsule_New(&e->versioned, DLPACK_VERSIONED_CAPSULE_NAME, capsule_destructor);
  } else {
    e->managed.dl_tensor = t;
    e->managed.manager_ctx = e;
    e->managed.deleter = export_deleter;
    capsule = PyCapsule_New(&e->managed, DLPACK_CAPSULE_NAME, capsule_destructor);
  }
  if (!capsule)
    export_free(e);
  return capsule;
}

static int check_export_options(PyValue *self, PyObject *dl_device, PyObject *copy) {
  if (copy && copy == Py_True) {
    PyErr_SetString(PyExc_BufferError, "cgtree values are exported without a copy (copy=True is not supported)");
    return -1;
  }
  if (dl_device && dl_device != Py_None) {
    DLDevice d = value_device(self);
    int type, id;
    if (!PyArg_ParseTuple(dl_device, "ii;dl_device must be a (device_type, device_id) pair", &type, &id))
      return -1;
    if (type != d.device_type || id != d.device_id) {
      PyErr_Format(PyExc_BufferError, "the value lives on device (%d, %d), not (%d, %d); copying is not supported",
                   d.device_type, d.device_id, type, id);
      return -1;
    }
  }
  return 0;
}

static PyObject *value_dlpack(PyValue *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream, &max_version, &dl_device,
                                   &copy))
    return NULL;
  if (check_export_options(self, dl_device, copy) < 0)
    return NULL;
  void *p;
  size_t n;
  if (value_memory(self, &p, &n, "Value.__dlpack__") < 0)
    return NULL;
  DLDataType u8 = {kDLUInt, 8, 1};
  int64_t shape[1] = {(int64_t)n};
  return export_capsule(self, u8, shape, 1, stream, wants_versioned(max_version));
}

/* _dlpack(code, bits, shape, stream=None, max_version=None): the memory typed and shaped (for Value.view). */
static PyObject *value_dlpack_typed(PyValue *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"code", "bits", "shape", "stream", "max_version", NULL};
  int code, bits;
  PyObject *shape_obj, *stream = Py_None, *max_version = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiO|OO:_dlpack", kwlist, &code, &bits, &shape_obj, &stream,
                                   &max_version))
    return NULL;
  if (code < 0 || code > 255 || bits <= 0 || bits > 255)
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "Value.view", "bad dtype");
  PyObject *seq = PySequence_Fast(shape_obj, "shape must be a sequence of ints");
  if (!seq)
    return NULL;
  Py_ssize_t ndim = PySequence_Fast_GET_SIZE(seq);
  if (ndim > 32) {
    Py_DECREF(seq);
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "Value.view", "more than 32 dimensions");
  }
  int64_t shape[32];
  for (Py_ssize_t i = 0; i < ndim; i++) {
    long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (d == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return NULL;
    }
    shape[i] = d;
  }
  Py_DECREF(seq);
  DLDataType dt = {(uint8_t)code, (uint8_t)bits, 1};
  return export_capsule(self, dt, shape, (int)ndim, stream, wants_versioned(max_version));
}

static PyObject *value_dlpack_device(PyValue *self, PyObject *unused) {
  (void)unused;
  DLDevice d = value_device(self);
  return Py_BuildValue("(ii)", d.device_type, d.device_id);
}

static PyObject *value_cai(PyValue *self, void *closure) {
  (void)closure;
  if (self->tree->backend != CGT_BACKEND_CUDA) {
    PyErr_SetString(PyExc_AttributeError,
                    "__cuda_array_interface__: the value lives on the simulator (use __dlpack__ or view())");
    return NULL;
  }
  void *p;
  size_t n;
  if (value_memory(self, &p, &n, "Value.__cuda_array_interface__") < 0)
    return NULL;
  return Py_BuildValue("{s:(n),s:s,s:(Ni),s:O,s:i,s:N}", "shape", (Py_ssize_t)n, "typestr", "|u1", "data",
                       PyLong_FromVoidPtr(p), 0, "strides", Py_None, "version", 3, "stream",
                       PyLong_FromVoidPtr(cgt_tree_stream(self->tree->t)));
}

/* Value.view(dtype, shape) is written in Python (cgtree/_view.py, which
 * knows dtypes and numpy); the package hands it to us at import. */
static PyObject *view_impl;

PyObject *pycgt_set_view_impl(PyObject *self, PyObject *fn) {
  (void)self;
  Py_XSETREF(view_impl, Py_NewRef(fn));
  Py_RETURN_NONE;
}

static PyObject *value_view(PyValue *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  if (!view_impl)
    return pycgt_raise(CGT_ERR_STATE, "Value.view", "import the cgtree package, not cgtree._cgtree alone");
  /* view_impl(self, *args, **kwargs) */
  PyObject *small[8];
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs + nkw + 1 > 8)
    return PyErr_Format(PyExc_TypeError, "view() takes at most 2 arguments");
  small[0] = (PyObject *)self;
  for (Py_ssize_t i = 0; i < nargs + nkw; i++)
    small[i + 1] = args[i];
  return PyObject_Vectorcall(view_impl, small, (size_t)(nargs + 1), kwnames);
}

static PyObject *value_repr(PyValue *self) {
  void *p;
  size_t n;
  if (self->tree->t && cgt_value_ptr(self->tree->t, self->v, &p, &n) == CGT_OK)
    return PyUnicode_FromFormat("<cgtree.Value %p, %zu bytes>", p, n);
  return PyUnicode_FromFormat("<cgtree.Value (stale)>");
}

static PyMethodDef value_methods[] = {
    {"release", (PyCFunction)value_release, METH_NOARGS,
     "release(): the caller will not use this value again; its memory may be reused by later runs."},
    {"__dlpack__", (PyCFunction)(void (*)(void))value_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None): the value as a 1-D uint8 DLPack "
     "tensor, without a copy. Valid while the value is live."},
    {"view", (PyCFunction)(void (*)(void))value_view, METH_FASTCALL | METH_KEYWORDS,
     "view(dtype, shape=None): the value's memory with a dtype and shape, without a copy. On the simulator a numpy "
     "array; on CUDA a cgtree.ValueView that speaks DLPack and __cuda_array_interface__ (torch.from_dlpack, "
     "cupy.asarray). Valid while the value is live."},
    {"__dlpack_device__", (PyCFunction)value_dlpack_device, METH_NOARGS, "(device_type, device_id) of DLPack."},
    {"_dlpack", (PyCFunction)(void (*)(void))value_dlpack_typed, METH_VARARGS | METH_KEYWORDS,
     "_dlpack(code, bits, shape, stream=None): a DLPack capsule of the value's memory with a dtype and shape."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef value_getset[] = {
    {"ptr", (getter)value_ptr, NULL, "Device address of the value (StaleValue once it is not live).", NULL},
    {"nbytes", (getter)value_nbytes, NULL, "Size in bytes.", NULL},
    {"live", (getter)value_live, NULL, "True until the value is released or its step ends.", NULL},
    {"tree", (getter)value_tree, NULL, "The tree the value belongs to.", NULL},
    {"handle", (getter)value_handle, NULL, "The cgt_value bits (for debugging).", NULL},
    {"__cuda_array_interface__", (getter)value_cai, NULL,
     "On CUDA: version 3 of the interface, a 1-D uint8 array, with the tree's stream.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyValue_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cgtree.Value",
    .tp_basicsize = sizeof(PyValue),
    .tp_dealloc = (destructor)value_dealloc,
    .tp_repr = (reprfunc)value_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A segment output living in the tree's pool: live until released or until the step ends.",
    .tp_methods = value_methods,
    .tp_getset = value_getset,
};
