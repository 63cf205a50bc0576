/* arg.c — cgtree.static(obj) and cgtree.dynamic(obj): caller memory as a run argument.
 *
 * A run argument is a Value, or caller-owned memory wrapped once by static()
 * or dynamic() into a cgtree.Arg. The wrapping does the slow part — asking
 * the object where its bytes are — so that Tree.run only reads three fields.
 * We accept, in this order:
 *
 *   (ptr, nbytes)                 a raw device address (no device check)
 *   __dlpack__ / __dlpack_device__ a CUDA tensor (torch, cupy, jax, ...): consumed
 *                                 with stream=1 (the legacy default stream), which
 *                                 orders the producer's work before the tree's
 *                                 stream (a blocking stream) reads it
 *   __cuda_array_interface__      numba, older cupy
 *   the buffer protocol           numpy arrays, bytearray, memoryview (host memory:
 *                                 the simulator's device memory)
 *   __dlpack__ on the CPU         torch CPU tensors and other DLPack producers
 *
 * The memory must be contiguous: one byte range. A strided view is refused
 * with InvalidArgument (pass a contiguous copy), never silently copied.
 * The Arg keeps what it came from alive (the object, the buffer view or
 * the consumed DLPack tensor); its device is checked against the tree's at
 * every run (a host array given to a CUDA tree is InvalidArgument).
 */
#include "pycgt.h"

#include <string.h>

static void arg_dealloc(PyArgBuf *self) {
  if (self->has_view)
    PyBuffer_Release(&self->view);
  if (self->managed && self->managed->deleter)
    self->managed->deleter(self->managed);
  Py_XDECREF(self->obj);
  PyObject_Free(self);
}

static PyObject *bad(const char *fmt, const char *detail) {
  PyErr_Format(pycgt_errors[CGT_ERR_INVALID_ARGUMENT], fmt, detail);
  return NULL;
}

/* Bytes of a dense tensor with these shape/strides (in elements), or -1 if it
 * is not one contiguous range (any dimension order is accepted). */
static int64_t dense_bytes(int ndim, const int64_t *shape, const int64_t *strides, int64_t item) {
  int64_t elems = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return -1;
    if (shape[i] && elems > INT64_MAX / shape[i])
      return -1;
    elems *= shape[i];
  }
  if (elems == 0)
    return 0;
  if (!strides)
    return elems * item;
  /* Dense iff, taking dimensions of size > 1 by increasing stride, each stride
   * is the product of the sizes before it. */
  int used[64] = {0};
  if (ndim > 64)
    return -1;
  int64_t expect = 1;
  for (int k = 0; k < ndim; k++) {
    int best = -1;
    for (int i = 0; i < ndim; i++)
      if (!used[i] && shape[i] > 1 && (best < 0 || strides[i] < strides[best]))
        best = i;
    if (best < 0)
      break;
    used[best] = 1;
    if (strides[best] != expect)
      return -1;
    expect *= shape[best];
  }
  return elems * item;
}

static PyArgBuf *arg_alloc(cgt_arg_kind kind, PyObject *obj) {
  PyArgBuf *a = PyObject_New(PyArgBuf, &PyArgBuf_Type);
  if (!a)
    return NULL;
  a->kind = kind;
  a->ptr = 0;
  a->nbytes = 0;
  a->dev_type = 0;
  a->dev_id = 0;
  a->obj = Py_NewRef(obj);
  a->has_view = 0;
  a->managed = NULL;
  memset(&a->view, 0, sizeof a->view);
  return a;
}

static int from_pair(PyArgBuf *a, PyObject *obj) {
  if (PyTuple_GET_SIZE(obj) != 2) {
    bad("%s: a (ptr, nbytes) pair has two items", "static/dynamic");
    return -1;
  }
  void *p = PyLong_AsVoidPtr(PyTuple_GET_ITEM(obj, 0));
  if (!p && PyErr_Occurred())
    return -1;
  Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 1));
  if (n == -1 && PyErr_Occurred())
    return -1;
  if (n < 0) {
    bad("%s: nbytes must not be negative", "static/dynamic");
    return -1;
  }
  a->ptr = (uintptr_t)p;
  a->nbytes = (size_t)n;
  return 0;
}

static int from_dlpack(PyArgBuf *a, PyObject *obj, int cuda) {
  PyObject *capsule;
  if (cuda) {
    PyObject *kw = Py_BuildValue("{s:i}", "stream", 1);
    if (!kw)
      return -1;
    PyObject *fn = PyObject_GetAttrString(obj, "__dlpack__");
    if (!fn) {
      Py_DECREF(kw);
      return -1;
    }
    PyObject *empty = PyTuple_New(0);
    capsule = empty ? PyObject_Call(fn, empty, kw) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(fn);
    Py_DECREF(kw);
  } else {
    capsule = PyObject_CallMethod(obj, "__dlpack__", NULL);
  }
  if (!capsule)
    return -1;
  DLManagedTensor *m = PyCapsule_IsValid(capsule, DLPACK_CAPSULE_NAME)
                           ? PyCapsule_GetPointer(capsule, DLPACK_CAPSULE_NAME)
                           : NULL;
  if (!m) {
    Py_DECREF(capsule);
    PyErr_Clear();
    bad("%s: __dlpack__ did not return an unconsumed \"dltensor\" capsule", "static/dynamic");
    return -1;
  }
  /* Consume it: from now on the tensor is ours to delete. */
  if (PyCapsule_SetName(capsule, DLPACK_USED_CAPSULE_NAME) < 0) {
    Py_DECREF(capsule);
    return -1;
  }
  Py_DECREF(capsule);
  a->managed = m;
  const DLTensor *t = &m->dl_tensor;
  int64_t item = ((int64_t)t->dtype.bits * t->dtype.lanes + 7) / 8;
  int64_t n = dense_bytes(t->ndim, t->shape, t->strides, item);
  if (n < 0) {
    bad("%s: the tensor is not contiguous (pass a contiguous copy)", "static/dynamic");
    return -1;
  }
  a->ptr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  a->nbytes = (size_t)n;
  a->dev_type = t->device.device_type;
  a->dev_id = t->device.device_id;
  return 0;
}

static int from_cai(PyArgBuf *a, PyObject *cai) {
  if (!PyDict_Check(cai)) {
    bad("%s: __cuda_array_interface__ is not a dict", "static/dynamic");
    return -1;
  }
  PyObject *mask = PyDict_GetItemString(cai, "mask");
  if (mask && mask != Py_None) {
    bad("%s: masked __cuda_array_interface__ arrays are not supported", "static/dynamic");
    return -1;
  }
  PyObject *shape = PyDict_GetItemString(cai, "shape"), *typestr = PyDict_GetItemString(cai, "typestr");
  PyObject *data = PyDict_GetItemString(cai, "data"), *strides = PyDict_GetItemString(cai, "strides");
  if (!shape || !typestr || !data || !PyTuple_Check(shape) || !PyUnicode_Check(typestr) || !PyTuple_Check(data) ||
      PyTuple_GET_SIZE(data) < 1) {
    bad("%s: __cuda_array_interface__ lacks shape, typestr or data", "static/dynamic");
    return -1;
  }
  const char *ts = PyUnicode_AsUTF8(typestr);
  if (!ts)
    return -1;
  long item = strlen(ts) >= 3 ? strtol(ts + 2, NULL, 10) : 0;
  Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
  if (item <= 0 || ndim > 64) {
    bad("%s: unsupported __cuda_array_interface__ typestr or rank", "static/dynamic");
    return -1;
  }
  int64_t sh[64], st[64];
  int has_strides = strides && strides != Py_None;
  if (has_strides && (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != ndim)) {
    bad("%s: __cuda_array_interface__ strides do not match its shape", "static/dynamic");
    return -1;
  }
  for (Py_ssize_t i = 0; i < ndim; i++) {
    sh[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (has_strides) {
      long long bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
      if (bytes % item) {
        bad("%s: __cuda_array_interface__ strides are not whole elements", "static/dynamic");
        return -1;
      }
      st[i] = bytes / item;
    }
    if (PyErr_Occurred())
      return -1;
  }
  int64_t n = dense_bytes((int)ndim, sh, has_strides ? st : NULL, item);
  if (n < 0) {
    bad("%s: the array is not contiguous (pass a contiguous copy)", "static/dynamic");
    return -1;
  }
  void *p = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
  if (!p && PyErr_Occurred())
    return -1;
  a->ptr = (uintptr_t)p;
  a->nbytes = (size_t)n;
  a->dev_type = kDLCUDA;
  a->dev_id = -1; /* the interface does not say; checked by the driver at use */
  return 0;
}

static int from_buffer(PyArgBuf *a, PyObject *obj) {
  if (PyObject_GetBuffer(obj, &a->view, PyBUF_ANY_CONTIGUOUS) < 0) {
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_ValueError))
      return -1;
    PyErr_Clear();
    bad("%s: the buffer is not contiguous (pass a contiguous copy)", "static/dynamic");
    return -1;
  }
  a->has_view = 1;
  a->ptr = (uintptr_t)a->view.buf;
  a->nbytes = (size_t)a->view.len;
  a->dev_type = kDLCPU;
  return 0;
}

/* (device_type, device_id) from __dlpack_device__, or type 0 if obj has none. */
static int dlpack_device(PyObject *obj, int *type, int *id) {
  *type = 0;
  *id = 0;
  PyObject *d = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
  if (!d) {
    PyErr_Clear();
    return 0;
  }
  int ok = PyArg_ParseTuple(d, "ii", type, id);
  Py_DECREF(d);
  if (!ok) {
    PyErr_Clear();
    *type = 0;
  }
  return 0;
}

static PyObject *make_arg(PyObject *obj, cgt_arg_kind kind) {
  if (Py_IS_TYPE(obj, &PyValue_Type))
    return bad("%s: a cgtree.Value is passed as it is, not wrapped", kind == CGT_ARG_STATIC ? "static" : "dynamic");
  if (Py_IS_TYPE(obj, &PyArgBuf_Type))
    return bad("%s: the object is already a cgtree.Arg", kind == CGT_ARG_STATIC ? "static" : "dynamic");
  PyArgBuf *a = arg_alloc(kind, obj);
  if (!a)
    return NULL;
  int rc;
  int type = 0, id = 0;
  if (PyTuple_Check(obj)) {
    rc = from_pair(a, obj);
  } else if (PyObject_HasAttrString(obj, "__dlpack__") && (dlpack_device(obj, &type, &id), type == kDLCUDA ||
                                                            type == kDLCUDAManaged)) {
    rc = from_dlpack(a, obj, 1);
  } else if (PyObject_HasAttrString(obj, "__cuda_array_interface__")) {
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    rc = cai ? from_cai(a, cai) : -1;
    Py_XDECREF(cai);
  } else if (PyObject_CheckBuffer(obj)) {
    rc = from_buffer(a, obj);
  } else if (PyObject_HasAttrString(obj, "__dlpack__")) {
    rc = from_dlpack(a, obj, 0);
  } else {
    PyErr_Format(PyExc_TypeError,
                 "%s: a %.100s is not memory: pass an object that speaks DLPack or __cuda_array_interface__, a "
                 "buffer (numpy array), or a (ptr, nbytes) pair",
                 kind == CGT_ARG_STATIC ? "static" : "dynamic", Py_TYPE(obj)->tp_name);
    rc = -1;
  }
  if (rc < 0) {
    Py_DECREF(a);
    return NULL;
  }
  return (PyObject *)a;
}

PyObject *pycgt_make_static(PyObject *self, PyObject *obj) {
  (void)self;
  return make_arg(obj, CGT_ARG_STATIC);
}

PyObject *pycgt_make_dynamic(PyObject *self, PyObject *obj) {
  (void)self;
  return make_arg(obj, CGT_ARG_DYNAMIC);
}

static const char *device_name(int32_t type) {
  switch (type) {
  case 0:
    return "unknown";
  case kDLCPU:
    return "cpu";
  case kDLCUDA:
    return "cuda";
  case kDLCUDAHost:
    return "cuda_host";
  case kDLCUDAManaged:
    return "cuda_managed";
  case kDLROCM:
    return "rocm";
  default:
    return "other";
  }
}

static PyObject *arg_kind(PyArgBuf *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(self->kind == CGT_ARG_STATIC ? "static" : "dynamic");
}

static PyObject *arg_ptr(PyArgBuf *self, void *closure) {
  (void)closure;
  return PyLong_FromVoidPtr((void *)self->ptr);
}

static PyObject *arg_nbytes(PyArgBuf *self, void *closure) {
  (void)closure;
  return PyLong_FromSize_t(self->nbytes);
}

static PyObject *arg_device(PyArgBuf *self, void *closure) {
  (void)closure;
  return Py_BuildValue("(si)", device_name(self->dev_type), self->dev_id);
}

static PyObject *arg_obj(PyArgBuf *self, void *closure) {
  (void)closure;
  return Py_NewRef(self->obj);
}

static PyObject *arg_repr(PyArgBuf *self) {
  return PyUnicode_FromFormat("<cgtree.%s %p, %zu bytes on %s>", self->kind == CGT_ARG_STATIC ? "static" : "dynamic",
                              (void *)self->ptr, self->nbytes, device_name(self->dev_type));
}

static PyGetSetDef arg_getset[] = {
    {"kind", (getter)arg_kind, NULL, "'static' or 'dynamic'.", NULL},
    {"ptr", (getter)arg_ptr, NULL, "The address of the memory.", NULL},
    {"nbytes", (getter)arg_nbytes, NULL, "Its size in bytes.", NULL},
    {"device", (getter)arg_device, NULL, "(device name, ordinal) as far as the object told.", NULL},
    {"obj", (getter)arg_obj, NULL, "The object the memory came from.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyArgBuf_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cgtree.Arg",
    .tp_basicsize = sizeof(PyArgBuf),
    .tp_dealloc = (destructor)arg_dealloc,
    .tp_repr = (reprfunc)arg_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Caller memory for Tree.run, made by cgtree.static(obj) or cgtree.dynamic(obj).",
    .tp_getset = arg_getset,
};

/* Used by tree.c: the device check of one argument against the tree. NULL
 * if it fits, else a message. */
const char *pycgt_arg_device_mismatch(const PyArgBuf *a, cgt_backend backend, int device) {
  if (a->dev_type == 0)
    return NULL;
  if (backend == CGT_BACKEND_SIM)
    return a->dev_type == kDLCPU || a->dev_type == kDLCUDAHost ? NULL : "device memory given to a simulator tree";
  if (a->dev_type != kDLCUDA && a->dev_type != kDLCUDAManaged)
    return "host memory given to a CUDA tree";
  if (a->dev_id >= 0 && a->dev_id != device)
    return "memory of another GPU than the tree's";
  return NULL;
}
