/* exchange.c — tensors in and out of the hot path through DLPack's C
 * exchange API, without a Python call.
 *
 * Every call of a segment asks for the caller's current stream and wraps
 * each output in a new tensor, and reads the data pointer of each tensor
 * input. Through PyTorch's Python API the stream costs a call of the raw
 * stream getter, an output a capsule and a call of torch._C._from_dlpack
 * (which renames the capsule and checks CUDA's lazy initialisation), and a
 * pointer a call of tensor.data_ptr().
 *
 * DLPack 1.2 added a C-level exchange protocol for exactly this: a framework
 * puts on its tensor type an attribute __dlpack_c_exchange_api__, a capsule
 * over a table of C functions (python/dlpack.h, DLPackExchangeAPI). PyTorch
 * has it from 2.11. Three of them serve the hot path:
 *   dltensor_from_py_object_no_sync   a tensor's DLTensor (so its data pointer,
 *                                     in about 0.1 us),
 *   current_work_stream               the current stream of a device,
 *   managed_tensor_to_py_object_no_sync
 *                                     a new tensor over a DLPack tensor of ours,
 *                                     with our deleter, as from_dlpack makes.
 *
 * Nothing here is trusted before it is proven on this process's PyTorch:
 *   - pointers: setup_exchange() reads probe tensors (views with offsets,
 *     Parameters) through the table and compares with their
 *     data_ptr(); and the first call of every segment reads each input both
 *     ways (tx_exchange_cross_check), turning the fast path off for good at
 *     the first difference, with a warning;
 *   - the stream: check_exchange_stream() compares with PyTorch's raw stream
 *     getter at the same moment, on the default stream and on the tree's,
 *     when the first tree of a device is made;
 *   - outputs: setup_exchange() makes one tensor over a buffer of its own,
 *     reads its data_ptr() back, drops it and sees the deleter called.
 * Each use that fails its proof stays on the Python path; so does a PyTorch
 * without the table, and an object whose type is not exactly one the setup
 * named (torch.Tensor, torch.nn.Parameter): a subclass may answer data_ptr()
 * differently.
 *
 * Tests: test_torch_ext_sim.py runs setup, proofs, refusals and the hot path
 * against a stand-in table (test_exchange_api below); test_torch_backend.py
 * checks on the GPU that PyTorch's table passes and agrees with data_ptr().
 */
#include "ext.h"

#include <stdlib.h>
#include <string.h>

tx_exchange TXE;

/* The table a consumer of DLPack 1.x may read: the header's own, or an
 * older one down its chain. */
static const DLPackExchangeAPI *table_for_v1(const DLPackExchangeAPI *api) {
  const DLPackExchangeAPIHeader *h = api ? &api->header : NULL;
  while (h && h->version.major > 1)
    h = h->prev_api;
  if (!h || h->version.major != 1 || h->version.minor < 2)
    return NULL;
  return (const DLPackExchangeAPI *)h;
}

/* Off: the Python API serves the stream, the outputs and the pointers. */
static void exchange_off(void) {
  Py_CLEAR(TXE.capsule);
  Py_XDECREF((PyObject *)TXE.types[0]);
  Py_XDECREF((PyObject *)TXE.types[1]);
  TXE.types[0] = TXE.types[1] = NULL;
  TXE.api = NULL;
  TXE.ptrs = TXE.stream = TXE.outputs = 0;
  TXE.disagreements = 0; /* counted per setup */
}

/* ---------------------------------------------------- output probe */

static int probe_deleted;
static void probe_deleter(DLManagedTensorVersioned *m) {
  (void)m;
  probe_deleted++;
}

/* 1 if the table makes a tensor over memory of ours that reads back at that
 * address, and calls our deleter when it dies. */
static int outputs_work(const DLPackExchangeAPI *api, PyObject *data_ptr_name, char *why, size_t cap) {
  /* Static, not on the stack: PyTorch keeps a pointer to m until it calls
   * the deleter, which a misbehaving table might do later. */
  static float buffer[4];
  static int64_t shape[1] = {4}, strides[1] = {1};
  static DLManagedTensorVersioned m;
  memset(&m, 0, sizeof m);
  m.version.major = 1;
  m.deleter = probe_deleter;
  m.dl_tensor.data = buffer;
  m.dl_tensor.device.device_type = kDLCPU;
  m.dl_tensor.ndim = 1;
  m.dl_tensor.dtype.code = kDLFloat;
  m.dl_tensor.dtype.bits = 32;
  m.dl_tensor.dtype.lanes = 1;
  m.dl_tensor.shape = shape;
  m.dl_tensor.strides = strides;
  int before = probe_deleted;
  void *obj = NULL;
  if (!api->managed_tensor_to_py_object_no_sync || api->managed_tensor_to_py_object_no_sync(&m, &obj) != 0 || !obj) {
    PyErr_Clear();
    snprintf(why, cap, "the table made no tensor");
    return 0;
  }
  PyObject *p = PyObject_CallMethodNoArgs((PyObject *)obj, data_ptr_name);
  void *at = p ? PyLong_AsVoidPtr(p) : NULL;
  Py_XDECREF(p);
  PyErr_Clear();
  Py_DECREF((PyObject *)obj);
  if (at != (void *)buffer || probe_deleted != before + 1) {
    snprintf(why, cap, "a tensor the table made reads at %p, not %p, or its deleter ran %d times", at, (void *)buffer,
             probe_deleted - before);
    return 0;
  }
  return 1;
}

/* setup_exchange(capsule, types, probes): capsule is the tensor type's
 * __dlpack_c_exchange_api__ (None turns the exchange off), types the one or
 * two exact types it serves, probes a list of (tensor, data_ptr()). Returns
 * {"pointers": bool, "outputs": bool, "why": str}. Bad arguments raise and
 * change nothing. */
static PyObject *setup_exchange(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *cap, *types, *probes;
  if (!PyArg_ParseTuple(args, "OO!O!", &cap, &PyTuple_Type, &types, &PyList_Type, &probes))
    return NULL;
  if (cap == Py_None) {
    exchange_off();
    return Py_BuildValue("{s:O,s:O,s:s}", "pointers", Py_False, "outputs", Py_False, "why", "turned off");
  }
  Py_ssize_t nt = PyTuple_GET_SIZE(types);
  if (!PyCapsule_IsValid(cap, DLPACK_EXCHANGE_API_CAPSULE_NAME) || nt < 1 || nt > 2 ||
      !PyType_Check(PyTuple_GET_ITEM(types, 0)) || !PyType_Check(PyTuple_GET_ITEM(types, nt - 1))) {
    PyErr_SetString(PyExc_TypeError, "setup_exchange(capsule 'dlpack_exchange_api', (type[, type]), "
                                     "[(tensor, data_ptr), ...])");
    return NULL;
  }
  if (tx_check_probes(probes, 2, NULL, NULL, "setup_exchange: each probe is (tensor, data_ptr)") < 0)
    return NULL;
  const DLPackExchangeAPI *api = table_for_v1(PyCapsule_GetPointer(cap, DLPACK_EXCHANGE_API_CAPSULE_NAME));
  char why[512] = "";
  int ptrs = 0, outs = 0;
  if (!api) {
    snprintf(why, sizeof why, "the table is of no DLPack version 1.2 or later");
  } else if (!api->dltensor_from_py_object_no_sync) {
    snprintf(why, sizeof why, "the table cannot read a tensor");
  } else if (PyList_GET_SIZE(probes) == 0) {
    snprintf(why, sizeof why, "no probe tensors");
  } else {
    ptrs = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(probes) && ptrs; i++) {
      PyObject *p = PyList_GET_ITEM(probes, i);
      void *want = PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, 1)), *got = NULL; /* fits: tx_check_probes */
      if (!tx_exchange_read(api, PyTuple_GET_ITEM(p, 0), &got, NULL) || got != want) {
        snprintf(why, sizeof why, "probe %zd: the table says %p, data_ptr() says %p", i, got, want);
        ptrs = 0;
      }
    }
  }
  if (api)
    outs = outputs_work(api, TX.str_data_ptr, why + strlen(why), sizeof why - strlen(why));
  exchange_off();
  TXE.api = api;
  TXE.capsule = Py_NewRef(cap); /* the table lives as long as its capsule's owner; keep both */
  TXE.types[0] = (PyTypeObject *)Py_NewRef(PyTuple_GET_ITEM(types, 0));
  TXE.types[1] = (PyTypeObject *)Py_NewRef(PyTuple_GET_ITEM(types, nt - 1));
  TXE.ptrs = ptrs;
  TXE.outputs = outs;
  return Py_BuildValue("{s:O,s:O,s:s}", "pointers", ptrs ? Py_True : Py_False, "outputs", outs ? Py_True : Py_False,
                       "why", why);
}

/* check_exchange_stream(device, getter): the table's current stream of
 * device is used from now on if it equals getter(device) (PyTorch's raw
 * stream getter), asked at the same moment; returns whether it did. */
static PyObject *check_exchange_stream(PyObject *m, PyObject *args) {
  (void)m;
  int device;
  PyObject *getter;
  if (!PyArg_ParseTuple(args, "iO", &device, &getter))
    return NULL;
  if (!PyCallable_Check(getter)) {
    PyErr_SetString(PyExc_TypeError, "check_exchange_stream(device: int, getter)");
    return NULL;
  }
  void *got = NULL;
  int rc = TXE.api && TXE.api->current_work_stream ? TXE.api->current_work_stream(kDLCUDA, device, &got) : -1;
  PyErr_Clear();
  PyObject *w = PyObject_CallFunction(getter, "i", device);
  if (!w)
    return NULL;
  void *want = PyLong_AsVoidPtr(w);
  Py_DECREF(w);
  if (PyErr_Occurred())
    return NULL;
  TXE.stream = rc == 0 && got == want;
  return PyBool_FromLong(TXE.stream);
}

int tx_exchange_stream(int device, void **out) {
  if (!TXE.stream)
    return 0;
  if (TXE.api->current_work_stream(kDLCUDA, device, out) == 0)
    return 1;
  PyErr_Clear();
  return 0;
}

int tx_exchange_cross_check(PyObject *o, void *ptr) {
  void *fast;
  /* An empty tensor has no data to point at; the hot path keys it apart. */
  if (!ptr || !tx_exchange_data_ptr(o, &fast, NULL) || fast == ptr)
    return 0;
  TXE.ptrs = 0;
  TXE.disagreements++;
  return tx_warn_pointer_disagreement("DLPack's exchange API", fast, ptr);
}

PyObject *tx_exchange_make_tensor(DLManagedTensorVersioned *m) {
  void *obj = NULL;
  if (TXE.api->managed_tensor_to_py_object_no_sync(m, &obj) != 0 || !obj) {
    if (!PyErr_Occurred())
      PyErr_SetString(TxError, "cgtree.torch: DLPack's exchange API made no output tensor");
    return NULL;
  }
  return (PyObject *)obj;
}

static PyObject *exchange_info(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  return Py_BuildValue("{s:O,s:O,s:O,s:K}", "pointers", TXE.ptrs ? Py_True : Py_False, "stream",
                       TXE.stream ? Py_True : Py_False, "outputs", TXE.outputs ? Py_True : Py_False, "disagreements",
                       (unsigned long long)TXE.disagreements);
}

/* --------------------------------------------------- a measurement */

/* time_tensor_making(ptr, shape, device, reps[, evict_bytes]): what making
 * one output tensor costs PyTorch, apart from the tree: reps float32 tensors
 * of that shape over caller memory at ptr, each made and dropped at once,
 * through the exchange API and through a capsule and
 * torch._C._from_dlpack; with evict_bytes, each from cold caches
 * (tx_cache_evict, not timed).
 * Returns {"exchange_ns": per tensor or None, "from_dlpack_ns": per tensor}
 * (bench/torch_segment_parts.py prints them). */
typedef struct timed_block {
  union {
    DLManagedTensor m;
    DLManagedTensorVersioned mv;
  };
  int64_t dims[16];
} timed_block;

static void timed_free(DLManagedTensor *m) {
  free(m->manager_ctx);
}
static void timed_free_versioned(DLManagedTensorVersioned *m) {
  free(m->manager_ctx);
}
static void timed_capsule_destructor(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) {
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    m->deleter(m);
  }
}

static timed_block *timed_make(void *ptr, PyObject *shape, int device, int versioned) {
  Py_ssize_t nd = PyTuple_GET_SIZE(shape);
  timed_block *b = tx_calloc(1, sizeof *b);
  if (!b)
    return NULL;
  int64_t stride = 1;
  for (Py_ssize_t d = nd - 1; d >= 0; d--) {
    b->dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    b->dims[nd + d] = stride;
    stride *= b->dims[d];
  }
  DLTensor *dl = versioned ? &b->mv.dl_tensor : &b->m.dl_tensor;
  dl->data = ptr;
  dl->device.device_type = kDLCUDA;
  dl->device.device_id = device;
  dl->ndim = (int32_t)nd;
  dl->dtype.code = kDLFloat;
  dl->dtype.bits = 32;
  dl->dtype.lanes = 1;
  dl->shape = b->dims;
  dl->strides = b->dims + nd;
  if (versioned) {
    b->mv.version.major = 1;
    b->mv.manager_ctx = b;
    b->mv.deleter = timed_free_versioned;
  } else {
    b->m.manager_ctx = b;
    b->m.deleter = timed_free;
  }
  return b;
}

/* One tensor over ptr, made through the exchange API or through a capsule
 * and torch._C._from_dlpack; NULL with an exception set. */
static PyObject *timed_tensor(void *ptr, PyObject *shape, int device, int exchange) {
  timed_block *b = timed_make(ptr, shape, device, exchange);
  if (!b)
    return PyErr_NoMemory();
  if (exchange)
    return tx_exchange_make_tensor(&b->mv);
  PyObject *cap = PyCapsule_New(&b->m, "dltensor", timed_capsule_destructor);
  if (!cap) {
    free(b);
    return NULL;
  }
  PyObject *t = PyObject_Vectorcall(TX.from_dlpack, &cap, 1, NULL);
  Py_DECREF(cap);
  return t;
}

/* ns per tensor made and dropped that way, each from evicted caches if
 * evict; -1 with an exception set. */
static double time_one_way(void *ptr, PyObject *shape, int device, int exchange, int reps, size_t evict) {
  uint64_t spent = 0;
  for (int i = 0; i < reps; i++) {
    if (evict && tx_cache_evict(evict) < 0)
      return -1;
    uint64_t t0 = tx_now_ns();
    PyObject *t = timed_tensor(ptr, shape, device, exchange);
    if (!t)
      return -1;
    Py_DECREF(t);
    spent += tx_now_ns() - t0;
  }
  return (double)spent / reps;
}

static PyObject *time_tensor_making(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *pp, *shape;
  int device, reps;
  Py_ssize_t evict = 0;
  if (!PyArg_ParseTuple(args, "OO!ii|n", &pp, &PyTuple_Type, &shape, &device, &reps, &evict))
    return NULL;
  void *ptr = PyLong_AsVoidPtr(pp);
  if (PyErr_Occurred())
    return NULL;
  if (PyTuple_GET_SIZE(shape) > 8 || reps < 1 || evict < 0 || !TX.from_dlpack) {
    PyErr_SetString(PyExc_ValueError,
                    "time_tensor_making: at most 8 dimensions, reps >= 1, evict_bytes >= 0, after init_hot_path");
    return NULL;
  }
  double ex = TXE.outputs ? time_one_way(ptr, shape, device, 1, reps, (size_t)evict) : 0;
  if (ex < 0)
    return NULL;
  double dl = time_one_way(ptr, shape, device, 0, reps, (size_t)evict);
  if (dl < 0)
    return NULL;
  PyObject *ex_obj = TXE.outputs ? PyFloat_FromDouble(ex) : Py_NewRef(Py_None);
  return ex_obj ? Py_BuildValue("{s:N,s:d}", "exchange_ns", ex_obj, "from_dlpack_ns", dl) : NULL;
}

/* ---------------------------------------------- a stand-in for tests */

/* test_torch_ext_sim.py has no PyTorch. Its stand-in table reads the data
 * pointer from a fake tensor's `ptr` attribute (as base + byte offset where
 * the object has a `split` attribute), makes output tensors by
 * calling the test's make(address of the DLManagedTensorVersioned), and says
 * the current stream of device d is d * 4096. */
static PyObject *stand_in_make;

static int stand_in_read(void *py_object, DLTensor *out) {
  PyObject *p = PyObject_GetAttrString((PyObject *)py_object, "ptr");
  if (!p)
    return -1;
  out->data = PyLong_AsVoidPtr(p);
  out->byte_offset = 0;
  Py_DECREF(p);
  if (PyErr_Occurred())
    return -1;
  /* Its device: `dl_device` (type, id) where the object has one, else CUDA 0. */
  out->device.device_type = kDLCUDA;
  out->device.device_id = 0;
  PyObject *d = PyObject_GetAttrString((PyObject *)py_object, "dl_device");
  if (!d) {
    PyErr_Clear();
  } else {
    int type = 0, id = 0;
    int ok = PyArg_ParseTuple(d, "ii", &type, &id);
    Py_DECREF(d);
    if (!ok)
      return -1;
    out->device.device_type = (DLDeviceType)type;
    out->device.device_id = id;
  }
  /* An object with `split` set is described as PyTorch may describe a view:
   * a base address and a byte offset from it. */
  if (PyObject_HasAttrString((PyObject *)py_object, "split")) {
    out->data = (char *)out->data - 64;
    out->byte_offset = 64;
  }
  return 0;
}

static int stand_in_to_py(DLManagedTensorVersioned *m, void **out) {
  PyObject *r = stand_in_make ? PyObject_CallFunction(stand_in_make, "N", PyLong_FromVoidPtr(m)) : NULL;
  if (!r)
    return -1;
  *out = r;
  return 0;
}

static int stand_in_stream(int32_t type, int32_t device, void **out) {
  (void)type;
  *out = (void *)(uintptr_t)((uintptr_t)device * 4096u);
  return 0;
}

static DLPackExchangeAPI stand_in = {
    .header = {.version = {1, 3}, .prev_api = NULL},
    .managed_tensor_to_py_object_no_sync = stand_in_to_py,
    .dltensor_from_py_object_no_sync = stand_in_read,
    .current_work_stream = stand_in_stream,
};
static DLPackExchangeAPI stand_in_v2 = {.header = {.version = {2, 0}, .prev_api = &stand_in.header}};
static DLPackExchangeAPI stand_in_old = {.header = {.version = {1, 1}, .prev_api = NULL}};

/* test_exchange_api(make, which): a capsule over the stand-in table; which
 * "v1" (1.3), "v2" (a 2.0 table chained to it) or "old" (1.1, refused). */
static PyObject *test_exchange_api(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *make;
  const char *which = "v1";
  if (!PyArg_ParseTuple(args, "O|s", &make, &which))
    return NULL;
  Py_XSETREF(stand_in_make, Py_NewRef(make));
  DLPackExchangeAPI *t = strcmp(which, "v2") == 0 ? &stand_in_v2 : strcmp(which, "old") == 0 ? &stand_in_old : &stand_in;
  return PyCapsule_New(t, DLPACK_EXCHANGE_API_CAPSULE_NAME, NULL);
}

PyMethodDef tx_exchange_methods[] = {
    {"setup_exchange", setup_exchange, METH_VARARGS,
     "setup_exchange(capsule, types, [(tensor, data_ptr), ...]) -> {pointers, outputs, why}: use DLPack's C "
     "exchange API where it proves right (python/_torch_ext/exchange.c); capsule None turns it off"},
    {"check_exchange_stream", check_exchange_stream, METH_VARARGS,
     "check_exchange_stream(device, getter) -> bool: read the current stream through the exchange API from now on "
     "if it agrees with getter(device) now"},
    {"exchange_info", exchange_info, METH_NOARGS, "which uses of the exchange API are on, and how often one disagreed"},
    {"time_tensor_making", time_tensor_making, METH_VARARGS,
     "time_tensor_making(ptr, shape, device, reps[, evict_bytes]) -> {exchange_ns, from_dlpack_ns}: what making one "
     "tensor over caller memory costs PyTorch, each way; with evict_bytes, from cold caches"},
    {"test_exchange_api", test_exchange_api, METH_VARARGS, "tests: a capsule over a stand-in exchange table"},
    {NULL, NULL, 0, NULL},
};
