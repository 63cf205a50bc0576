/* launch.c — calling a Python launch function, and cgtree.Launch.
 *
 * libcgtree calls a segment's launch function for warmup, for recording and
 * for eager runs, never for a replay. The trampoline wraps the cgt_launch
 * context in a fresh cgtree.Launch, calls the Python function with it, and
 * turns the context off when the function returns: a Launch kept past its
 * call answers every method with StateError instead of reaching into a
 * context that belongs to another run.
 *
 * A Python exception inside the launch function cannot travel through C.
 * The trampoline stores it on the tree (`pending`) and returns
 * CGT_ERR_SEGMENT_FAILED; Tree.run then raises SegmentFailed with the stored
 * exception as its __cause__, traceback included. If libcgtree recovers on
 * its own (a capture failure whose eager rerun succeeds), run succeeds and
 * the stored exception is dropped.
 */
#include "pycgt.h"

static void store_pending(PyTree *tree) { Py_XSETREF(tree->pending, pycgt_take_exception()); }

cgt_status pycgt_launch_trampoline(cgt_launch *l, void *user) {
  py_segment *s = user;
  PyTree *tree = s->tree;
  if (!s->launch) { /* cleared by the garbage collector: the tree is being torn down */
    PyErr_SetString(PyExc_RuntimeError, "the segment's launch function was cleared");
    store_pending(tree);
    return CGT_ERR_SEGMENT_FAILED;
  }
  PyLaunch *pl = PyObject_New(PyLaunch, &PyLaunch_Type);
  if (!pl) {
    store_pending(tree);
    return CGT_ERR_SEGMENT_FAILED;
  }
  pl->l = l;
  pl->tree = (PyTree *)Py_NewRef((PyObject *)tree);
  PyTree *outer = pycgt_current_tree;
  pycgt_current_tree = tree;
  PyObject *r = PyObject_CallOneArg(s->launch, (PyObject *)pl);
  pycgt_current_tree = outer;
  pl->l = NULL;
  Py_DECREF(pl);
  if (!r) {
    store_pending(tree);
    return CGT_ERR_SEGMENT_FAILED;
  }
  Py_DECREF(r);
  return CGT_OK;
}

/* ------------------------------------------------------ cgtree.Launch */

static cgt_launch *usable(PyLaunch *self) {
  if (!self->l)
    pycgt_raise(CGT_ERR_STATE, "cgtree.Launch", "used after its launch function returned");
  return self->l;
}

static int parse_u32(PyObject *o, uint32_t *out, const char *what) {
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred())
    return -1;
  if (v > UINT32_MAX) {
    PyErr_Format(PyExc_OverflowError, "%s is too large", what);
    return -1;
  }
  *out = (uint32_t)v;
  return 0;
}

static PyObject *launch_stream(PyLaunch *self, void *closure) {
  (void)closure;
  cgt_launch *l = usable(self);
  return l ? PyLong_FromVoidPtr(cgt_launch_stream(l)) : NULL;
}

static PyObject *launch_variant(PyLaunch *self, void *closure) {
  (void)closure;
  cgt_launch *l = usable(self);
  return l ? PyLong_FromUnsignedLongLong(cgt_launch_variant(l)) : NULL;
}

static PyObject *launch_tree(PyLaunch *self, void *closure) {
  (void)closure;
  return Py_NewRef((PyObject *)self->tree);
}

static PyObject *launch_input(PyLaunch *self, PyObject *arg) {
  cgt_launch *l = usable(self);
  uint32_t i;
  if (!l || parse_u32(arg, &i, "input index") < 0)
    return NULL;
  void *p = cgt_launch_input(l, i);
  if (!p)
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "Launch.input",
                       "index out of range (the segment has fewer inputs)");
  return Py_BuildValue("(Nn)", PyLong_FromVoidPtr(p), (Py_ssize_t)cgt_launch_input_bytes(l, i));
}

static PyObject *launch_alloc(PyLaunch *self, PyObject *arg) {
  cgt_launch *l = usable(self);
  if (!l)
    return NULL;
  Py_ssize_t n = PyLong_AsSsize_t(arg);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  if (n < 0)
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "Launch.alloc", "nbytes must not be negative");
  void *p = NULL;
  cgt_status st = cgt_launch_alloc(l, (size_t)n, &p);
  if (st != CGT_OK)
    return pycgt_raise_tree(self->tree, st, "Launch.alloc", NULL);
  return PyLong_FromVoidPtr(p);
}

static PyObject *launch_free(PyLaunch *self, PyObject *arg) {
  cgt_launch *l = usable(self);
  if (!l)
    return NULL;
  void *p = PyLong_AsVoidPtr(arg);
  if (!p && PyErr_Occurred())
    return NULL;
  cgt_status st = cgt_launch_free(l, p);
  if (st != CGT_OK)
    return pycgt_raise_tree(self->tree, st, "Launch.free", NULL);
  Py_RETURN_NONE;
}

static PyObject *launch_set_output(PyLaunch *self, PyObject *const *args, Py_ssize_t nargs) {
  cgt_launch *l = usable(self);
  if (!l)
    return NULL;
  if (nargs != 3)
    return PyErr_Format(PyExc_TypeError, "set_output(i, ptr, nbytes) takes 3 arguments, got %zd", nargs);
  uint32_t i;
  if (parse_u32(args[0], &i, "output index") < 0)
    return NULL;
  void *p = PyLong_AsVoidPtr(args[1]);
  if (!p && PyErr_Occurred())
    return NULL;
  Py_ssize_t n = PyLong_AsSsize_t(args[2]);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  if (n < 0)
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "Launch.set_output", "nbytes must not be negative");
  cgt_status st = cgt_launch_set_output(l, i, p, (size_t)n);
  if (st != CGT_OK)
    return pycgt_raise_tree(self->tree, st, "Launch.set_output", NULL);
  Py_RETURN_NONE;
}

static void launch_dealloc(PyLaunch *self) {
  Py_XDECREF(self->tree);
  PyObject_Free(self);
}

static PyMethodDef launch_methods[] = {
    {"input", (PyCFunction)launch_input, METH_O, "input(i) -> (ptr, nbytes): where to read input i."},
    {"alloc", (PyCFunction)launch_alloc, METH_O,
     "alloc(nbytes) -> ptr: pool memory, 256-byte aligned. Allocations neither freed nor (inside) an output are "
     "freed when the launch returns."},
    {"free", (PyCFunction)launch_free, METH_O, "free(ptr): a temporary of this launch, no longer needed by later work."},
    {"set_output", (PyCFunction)(void (*)(void))launch_set_output, METH_FASTCALL,
     "set_output(i, ptr, nbytes): output i is memory allocated in this launch or lies inside an input."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef launch_getset[] = {
    {"stream", (getter)launch_stream, NULL, "The stream to enqueue on (cudaStream_t, or the simulator's), as an int.",
     NULL},
    {"variant", (getter)launch_variant, NULL, "The variant the segment runs with.", NULL},
    {"tree", (getter)launch_tree, NULL, "The tree running this launch.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyLaunch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cgtree.Launch",
    .tp_basicsize = sizeof(PyLaunch),
    .tp_dealloc = (destructor)launch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The context a launch function receives: valid only while that function runs.",
    .tp_methods = launch_methods,
    .tp_getset = launch_getset,
};
