/* shim.c — a tensor's data pointer in nanoseconds, through PyTorch's C shim.
 *
 * Every call of a segment reads the data pointer of each tensor input, and a
 * model passes all its weights as inputs: GPT-2's decoder graph takes 65.
 * Through PyTorch's Python API a pointer costs a call of tensor.data_ptr(),
 * 64-111 ns on the H100 hosts; through DLPack's exchange API (exchange.c),
 * which fills a whole DLTensor, 54-103 ns; through the shim below, 6-13 ns
 * (bench/torch_segment_parts.py, four runs). Inside PyTorch the answer is
 * two loads. This file reaches it without
 * linking libtorch and without a line of C++.
 *
 * PyTorch exports a C ABI for AOTInductor's compiled models, the "shim"
 * (torch/csrc/inductor/aoti_torch/c/shim.h), with C linkage and a promise of
 * stability: aoti_torch_get_data_ptr(AtenTensorHandle, void **) is
 * at::Tensor::data_ptr(). An AtenTensorHandle is the address of an
 * at::Tensor, and an at::Tensor is one word, the address of its TensorImpl.
 * A Python tensor object keeps its at::Tensor at a fixed offset after the
 * object header (the field THPVariable::cdata).
 *
 * That offset is the one thing here no API promises (it moved between
 * PyTorch versions: 24 in some, 16 in 2.11), so it is found and proven,
 * never assumed:
 *   1. the probes: tensors cgtree.torch makes at install (a plain one, views
 *      with storage offsets, Parameters), each with the TensorImpl address
 *      PyTorch itself reports (tensor._cdata) and its data_ptr();
 *   2. the offset is the one word of the object, within the size of its type,
 *      that holds the TensorImpl address in every probe; none or more than one
 *      and the fast path stays off;
 *   3. at that offset the shim must give every probe's data_ptr(); one
 *      disagreement and the fast path stays off.
 * After that, a read applies only to objects whose type is exactly one the
 * setup named (torch.Tensor, torch.nn.Parameter): a subclass may answer
 * data_ptr() differently, so it takes the Python path. And the first call of
 * every segment reads each input both ways (tx_shim_cross_check): a
 * difference turns the fast path off for the rest of the process.
 *
 * Tests: python/tests/test_torch_ext_sim.py proves the search and the
 * refusals with stand-in objects and a stand-in shim function (exported
 * below for that purpose only); test_torch_backend.py checks, on the GPU,
 * that the fast path is on with a real PyTorch and agrees with data_ptr().
 */
#include "ext.h"

#include <dlfcn.h>
#include <string.h>

tx_shim TXS;

/* Off: the Python API (or the exchange API) reads pointers, and reuse.c,
 * which reads through the shim, is off too. */
static void shim_off(void) {
  TXR.on = 0;
  Py_XDECREF((PyObject *)TXS.types[0]);
  Py_XDECREF((PyObject *)TXS.types[1]);
  memset(&TXS, 0, sizeof TXS - sizeof TXS.disagreements);
}

/* Returns the offset, or 0 with why filled. */
static Py_ssize_t find_offset(PyObject *probes, char *why, size_t cap) {
  Py_ssize_t n = PyList_GET_SIZE(probes), found = 0, hi = PY_SSIZE_T_MAX;
  if (n == 0) {
    snprintf(why, cap, "no probe tensors");
    return 0;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    Py_ssize_t size = Py_TYPE(PyTuple_GET_ITEM(PyList_GET_ITEM(probes, i), 0))->tp_basicsize;
    if (size < hi)
      hi = size;
  }
  for (Py_ssize_t off = (Py_ssize_t)sizeof(PyObject); off + (Py_ssize_t)sizeof(void *) <= hi;
       off += (Py_ssize_t)sizeof(void *)) {
    int all = 1;
    for (Py_ssize_t i = 0; i < n && all; i++) {
      PyObject *p = PyList_GET_ITEM(probes, i);
      void *impl = PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, 1)), *word;
      memcpy(&word, (char *)PyTuple_GET_ITEM(p, 0) + off, sizeof word);
      all = impl != NULL && word == impl;
    }
    if (all) {
      if (found) {
        snprintf(why, cap, "two words of a tensor object hold its TensorImpl (offsets %zd and %zd)", found, off);
        return 0;
      }
      found = off;
    }
  }
  if (!found)
    snprintf(why, cap, "no word of a tensor object holds its TensorImpl");
  return found;
}

/* setup_shim(lib_path, symbol, types, probes): probes is a list of
 * (tensor, TensorImpl address, data_ptr()). Returns (True, offset) once the
 * fast path is on, or (False, why) and leaves it off. lib_path None turns it
 * off; bad arguments raise and change nothing. */
static PyObject *setup_shim(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *lib, *types, *probes;
  const char *symbol;
  if (!PyArg_ParseTuple(args, "OsO!O!", &lib, &symbol, &PyTuple_Type, &types, &PyList_Type, &probes))
    return NULL;
  if (lib == Py_None) {
    shim_off();
    return Py_BuildValue("(Os)", Py_False, "turned off");
  }
  Py_ssize_t nt = PyTuple_GET_SIZE(types);
  if (!PyUnicode_Check(lib) || nt < 1 || nt > 2 || !PyType_Check(PyTuple_GET_ITEM(types, 0)) ||
      !PyType_Check(PyTuple_GET_ITEM(types, nt - 1))) {
    PyErr_SetString(PyExc_TypeError, "setup_shim(lib_path: str, symbol: str, (type[, type]), probes)");
    return NULL;
  }
  PyTypeObject *t0 = (PyTypeObject *)PyTuple_GET_ITEM(types, 0), *t1 = (PyTypeObject *)PyTuple_GET_ITEM(types, nt - 1);
  if (tx_check_probes(probes, 3, t0, t1, "setup_shim: each probe is (tensor, impl address, data pointer)") < 0)
    return NULL;
  /* The arguments are sound: from here the outcome is on or off. */
  shim_off();
  char why[512] = "";
  tx_shim_data_ptr_fn fn = NULL;
  /* Only the copy PyTorch has loaded: never map a second libtorch. One more
   * reference to it, kept for the life of the process. */
  void *h = dlopen(PyUnicode_AsUTF8(lib), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  void *sym = h ? dlsym(h, symbol) : NULL;
  memcpy(&fn, &sym, sizeof fn); /* POSIX: dlsym's object pointer is the function's address */
  if (!h)
    snprintf(why, sizeof why, "%s is not loaded in this process (%s)", PyUnicode_AsUTF8(lib), dlerror());
  else if (!fn)
    snprintf(why, sizeof why, "%s has no %s", PyUnicode_AsUTF8(lib), symbol);
  Py_ssize_t off = fn ? find_offset(probes, why, sizeof why) : 0;
  if (off && (off + (Py_ssize_t)sizeof(void *) > t0->tp_basicsize ||
              off + (Py_ssize_t)sizeof(void *) > t1->tp_basicsize)) {
    snprintf(why, sizeof why, "offset %zd lies outside an object of a served type", off);
    off = 0;
  }
  for (Py_ssize_t i = 0; off && i < PyList_GET_SIZE(probes); i++) {
    PyObject *p = PyList_GET_ITEM(probes, i);
    void *want = PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, 2)), *got = NULL;
    int32_t rc = fn((char *)PyTuple_GET_ITEM(p, 0) + off, &got);
    if (rc != 0 || got != want) {
      snprintf(why, sizeof why, "probe %zd: the shim says %p (error %d), data_ptr() says %p", i, got, (int)rc, want);
      off = 0;
    }
  }
  if (!off)
    return Py_BuildValue("(Os)", Py_False, why);
  TXS.get = fn;
  TXS.types[0] = (PyTypeObject *)Py_NewRef((PyObject *)t0);
  TXS.types[1] = (PyTypeObject *)Py_NewRef((PyObject *)t1);
  TXS.offset = off;
  return Py_BuildValue("(On)", Py_True, off);
}

int tx_shim_cross_check(PyObject *o, void *ptr) {
  void *fast;
  /* An empty tensor has no data to point at; the hot path keys it apart. */
  if (!ptr || !tx_shim_data_ptr(o, &fast) || fast == ptr)
    return 0;
  TXS.offset = 0;
  TXS.disagreements++;
  return tx_warn_pointer_disagreement("PyTorch's C shim", fast, ptr);
}

static PyObject *shim_info(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  return Py_BuildValue("{s:n,s:K}", "offset", TXS.offset, "disagreements", (unsigned long long)TXS.disagreements);
}

/* time_pointer_reads(tensors, reps[, evict_bytes]): ns per data pointer
 * read, each way that is on: {"shim_ns", "exchange_ns", "data_ptr_ns"}
 * (None where off; bench/torch_segment_parts.py prints them). With
 * evict_bytes, the host's caches are evicted (tx_cache_evict, not timed)
 * before each pass over the tensors: what a read costs when, as in the hot
 * path, nothing since the last call has touched the tensor. */
static PyObject *time_pointer_reads(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *list;
  int reps;
  Py_ssize_t evict = 0;
  if (!PyArg_ParseTuple(args, "O!i|n", &PyList_Type, &list, &reps, &evict))
    return NULL;
  Py_ssize_t n = PyList_GET_SIZE(list);
  if (n < 1 || reps < 1 || evict < 0) {
    PyErr_SetString(PyExc_ValueError, "time_pointer_reads: one tensor or more, reps >= 1, evict_bytes >= 0");
    return NULL;
  }
  double ns[3] = {-1, -1, -1};
  uintptr_t sink = 0;
  for (int way = 0; way < 3; way++) {
    uint64_t spent = 0;
    for (int r = 0; r < reps; r++) {
      if (evict && tx_cache_evict((size_t)evict) < 0)
        return NULL;
      uint64_t t0 = tx_now_ns();
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        void *p = NULL;
        if (way == 0 && !tx_shim_data_ptr(o, &p))
          goto next;
        if (way == 1 && !tx_exchange_data_ptr(o, &p))
          goto next;
        if (way == 2 && tx_data_ptr_slow(o, &p) < 0)
          return NULL;
        sink += (uintptr_t)p;
      }
      spent += tx_now_ns() - t0;
    }
    ns[way] = (double)spent / ((double)reps * (double)n);
  next:;
  }
  (void)sink;
#define NS(x) ((x) < 0 ? Py_NewRef(Py_None) : PyFloat_FromDouble(x))
  return Py_BuildValue("{s:N,s:N,s:N}", "shim_ns", NS(ns[0]), "exchange_ns", NS(ns[1]), "data_ptr_ns", NS(ns[2]));
#undef NS
}

PyMethodDef tx_shim_methods[] = {
    {"setup_shim", setup_shim, METH_VARARGS,
     "setup_shim(lib_path, symbol, types, probes) -> (on, offset or why): read data pointers through PyTorch's C "
     "shim (python/_torch_ext/shim.c); lib_path None turns it off"},
    {"time_pointer_reads", time_pointer_reads, METH_VARARGS,
     "time_pointer_reads(tensors, reps[, evict_bytes]) -> {shim_ns, exchange_ns, data_ptr_ns}: ns per data pointer "
     "read, each way that is on; with evict_bytes, from cold caches"},
    {"shim_info", shim_info, METH_NOARGS, "the proven offset (0: off), and how often a cross-check disagreed"},
    {NULL, NULL, 0, NULL},
};

/* test_torch_ext_sim.py has no PyTorch: its probes are ctypes.c_void_p
 * objects, whose value word stands in for the TensorImpl address, and this
 * stands in for the shim: the "data pointer" of such an object is its value
 * plus 16. */
CGT_TORCH_TEST_API int32_t cgt_torch_test_data_ptr(void *handle, void **out) {
  void *impl;
  memcpy(&impl, handle, sizeof impl);
  if (!impl)
    return 1;
  *out = (char *)impl + 16;
  return 0;
}

/* test_torch_ext_reuse_sim.py's stand-in: its fake TensorImpl keeps the data
 * pointer in the word at offset 32 (reuse.c reads the words before it). */
CGT_TORCH_TEST_API int32_t cgt_torch_test_data_ptr_word(void *handle, void **out) {
  char *impl;
  memcpy(&impl, handle, sizeof impl);
  if (!impl)
    return 1;
  memcpy(out, impl + 32, sizeof *out);
  return 0;
}
