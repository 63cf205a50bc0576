/* module.c — the module cgtree._cgtree: exception classes, simulator kernels
 * written in Python, and small functions.
 *
 * Exceptions: every cgt_status but CGT_OK has a class, all subclasses of
 * cgtree.Error. The class carries the status name (`status`), the instance
 * the message (`message`), and an error raised by a tree call puts the
 * tree's cgt_tree_last_error() into it. InvalidArgument is also a
 * ValueError, so code that catches ValueError for bad input keeps working.
 *
 * Simulator kernels in Python: cgtree.sim_launch(stream, fn, *args) hands
 * libcgtree a C kernel, sim_kernel_trampoline, whose argument bytes are a
 * pointer to the tuple (fn, args) and a serial number. The simulator copies
 * those bytes: it runs the kernel at once, or, while the stream captures,
 * keeps the copy in the graph and calls the trampoline at every replay. We
 * cannot ask libcgtree which of the two happened, so the trampoline writes
 * the serial it ran into `sim_ran_serial`: if that is not the serial we just
 * launched, the kernel went into a graph, and the tuple must live as long as
 * any graph may replay it — the tree whose launch function is running keeps
 * it in its `keep` list until the tree is destroyed. sim_launch is accepted
 * only inside a launch function of a simulator tree, on that launch's
 * stream: a stream is an address, and any other int would be dereferenced.
 * A kernel that raises during a replay cannot
 * return an error through the graph; the trampoline stores the exception
 * and the tree call that ran the replay raises it (see tree.c).
 */
#include "pycgt.h"

#include <string.h>

PyObject *pycgt_errors[CGT_STATUS_COUNT];
PyTree *pycgt_current_tree;

static uint64_t sim_serial;       /* the last serial handed out */
static uint64_t sim_ran_serial;   /* the serial of the kernel that ran last */
static PyObject *sim_error;       /* an exception a kernel raised and nobody has taken yet */

/* --------------------------------------------------------------- errors */

static const char *const error_class_names[CGT_STATUS_COUNT] = {
    "Error",          /* CGT_OK: the base class */
    "InvalidArgument", "OutOfMemory", "StaleValue", "CaptureFailed", "BackendError",
    "NoDevice",       "StateError",  "SegmentFailed",
};

PyObject *pycgt_raise(cgt_status s, const char *what, const char *detail) {
  PyObject *cls = (unsigned)s < CGT_STATUS_COUNT && s != CGT_OK ? pycgt_errors[s] : pycgt_errors[0];
  PyObject *msg = detail && *detail ? PyUnicode_FromFormat("%s: %s", what, detail)
                                    : PyUnicode_FromFormat("%s: %s", what, cgt_status_string(s));
  if (!msg)
    return NULL;
  PyObject *exc = PyObject_CallOneArg(cls, msg);
  if (exc) {
    if (PyObject_SetAttrString(exc, "message", msg) < 0) {
      Py_DECREF(exc);
      exc = NULL;
    }
  }
  Py_DECREF(msg);
  if (!exc)
    return NULL;
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

PyObject *pycgt_take_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value)
    PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
#endif
}

void pycgt_set_exception(PyObject *exc) {
  if (!exc)
    return;
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

PyObject *pycgt_raise_tree(PyTree *tree, cgt_status s, const char *what, PyObject *cause) {
  pycgt_raise(s, what, tree->t ? cgt_tree_last_error(tree->t) : NULL);
  if (cause) {
    PyObject *exc = pycgt_take_exception();
    if (exc) {
      PyException_SetCause(exc, Py_NewRef(cause)); /* steals; also sets __suppress_context__ */
      PyException_SetContext(exc, Py_NewRef(cause)); /* steals */
    }
    pycgt_set_exception(exc);
    Py_DECREF(cause);
  }
  return NULL;
}

static int make_errors(PyObject *m) {
  for (int s = 0; s < CGT_STATUS_COUNT; s++) {
    char qualified[64];
    snprintf(qualified, sizeof qualified, "cgtree.%s", error_class_names[s]);
    PyObject *dict = PyDict_New();
    if (!dict)
      return -1;
    PyObject *status = s == CGT_OK ? Py_NewRef(Py_None) : PyUnicode_FromString(cgt_status_name((cgt_status)s));
    int bad = !status || PyDict_SetItemString(dict, "status", status) < 0;
    Py_XDECREF(status);
    PyObject *doc = s == CGT_OK ? PyUnicode_FromString("A cgtree call failed: `status` names the cgt_status, "
                                                       "`message` says what and why (the tree's last error).")
                                : PyUnicode_FromString(cgt_status_string((cgt_status)s));
    bad = bad || !doc || PyDict_SetItemString(dict, "__doc__", doc) < 0;
    Py_XDECREF(doc);
    bad = bad || PyDict_SetItemString(dict, "message", Py_None) < 0;
    if (bad) {
      Py_DECREF(dict);
      return -1;
    }
    PyObject *bases;
    if (s == CGT_OK)
      bases = Py_NewRef(PyExc_Exception);
    else if (s == CGT_ERR_INVALID_ARGUMENT)
      bases = PyTuple_Pack(2, pycgt_errors[0], PyExc_ValueError);
    else
      bases = Py_NewRef(pycgt_errors[0]);
    if (!bases) {
      Py_DECREF(dict);
      return -1;
    }
    pycgt_errors[s] = PyErr_NewException(qualified, bases, dict);
    Py_DECREF(bases);
    Py_DECREF(dict);
    if (!pycgt_errors[s] || PyModule_AddObjectRef(m, error_class_names[s], pycgt_errors[s]) < 0)
      return -1;
  }
  return 0;
}

/* ---------------------------------------------------- simulator kernels */

typedef struct sim_kernel_args {
  PyObject *call; /* (fn, args): kept alive by the launch or by the tree's keep list */
  uint64_t serial;
} sim_kernel_args;

static void sim_kernel_trampoline(void *p) {
  sim_kernel_args *k = p;
  sim_ran_serial = k->serial;
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *r = PyObject_Call(PyTuple_GET_ITEM(k->call, 0), PyTuple_GET_ITEM(k->call, 1), NULL);
  if (r) {
    Py_DECREF(r);
  } else if (!sim_error) {
    sim_error = pycgt_take_exception();
  } else {
    PyErr_Clear(); /* the first error of a replay is the one reported */
  }
  PyGILState_Release(g);
}

PyObject *pycgt_take_kernel_error(void) {
  PyObject *e = sim_error;
  sim_error = NULL;
  return e;
}

static PyObject *sim_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs < 2)
    return PyErr_Format(PyExc_TypeError, "sim_launch(stream, fn, *args) takes at least 2 arguments, got %zd", nargs);
  void *stream = PyLong_AsVoidPtr(args[0]);
  if (!stream && PyErr_Occurred())
    return NULL;
  if (!PyCallable_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "sim_launch: fn must be callable, not %.100s", Py_TYPE(args[1])->tp_name);
  /* A stream is an address: libcgtree would read whatever an arbitrary int
   * points to. Only the stream of the launch running now is accepted. */
  PyTree *tree = pycgt_current_tree;
  if (!tree || !tree->t)
    return pycgt_raise(CGT_ERR_STATE, "sim_launch", "only inside a launch function, on its l.stream");
  if (tree->backend != CGT_BACKEND_SIM)
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "sim_launch",
                       "the tree runs on CUDA: launch real kernels on l.stream (Triton, CuPy, PyTorch)");
  if (stream != cgt_tree_stream(tree->t))
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "sim_launch", "stream is not the launch's l.stream");
  PyObject *fn_args = PyTuple_New(nargs - 2);
  if (!fn_args)
    return NULL;
  for (Py_ssize_t i = 2; i < nargs; i++)
    PyTuple_SET_ITEM(fn_args, i - 2, Py_NewRef(args[i]));
  sim_kernel_args k;
  k.call = PyTuple_Pack(2, args[1], fn_args);
  Py_DECREF(fn_args);
  if (!k.call)
    return NULL;
  k.serial = ++sim_serial;
  PyObject *earlier_error = pycgt_take_kernel_error();
  cgt_status st = cgt_sim_launch(stream, sim_kernel_trampoline, &k, sizeof k);
  if (st != CGT_OK) {
    Py_DECREF(k.call);
    Py_XDECREF(earlier_error);
    return pycgt_raise(st, "sim_launch", cgt_tree_last_error(tree->t));
  }
  PyObject *kernel_error = pycgt_take_kernel_error();
  sim_error = earlier_error;
  if (sim_ran_serial != k.serial) {
    /* Recorded into a graph: keep (fn, args) for every replay. */
    if (PyList_Append(tree->keep, k.call) < 0) {
      /* Without a keeper the graph would call freed memory: leak it instead. */
      PyErr_Clear();
      return Py_NewRef(Py_None);
    }
  }
  Py_DECREF(k.call);
  if (kernel_error) {
    /* The kernel ran now and raised: the launch function sees its exception. */
    pycgt_set_exception(kernel_error);
    return NULL;
  }
  Py_RETURN_NONE;
}

/* ---------------------------------------------------------- functions */

static PyObject *cuda_available(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return PyBool_FromLong(cgt_cuda_available());
}

static PyObject *host_memory(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2)
    return PyErr_Format(PyExc_TypeError, "host_memory(ptr, nbytes) takes 2 arguments, got %zd", nargs);
  void *p = PyLong_AsVoidPtr(args[0]);
  if (!p && PyErr_Occurred())
    return NULL;
  Py_ssize_t n = PyLong_AsSsize_t(args[1]);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  if (!p || n < 0)
    return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, "host_memory", "needs a non-NULL pointer and nbytes >= 0");
  return PyMemoryView_FromMemory(p, n, PyBUF_WRITE);
}

static PyObject *status_name(PyObject *self, PyObject *arg) {
  (void)self;
  long s = PyLong_AsLong(arg);
  if (s == -1 && PyErr_Occurred())
    return NULL;
  return PyUnicode_FromString(cgt_status_name((cgt_status)s));
}


/* Whether this build has the CUDA backend at all: `cgtree info` tells "built
 * without CUDA" from "built with CUDA, but no GPU usable here". */
#ifdef CGT_HAVE_CUDA
#define CUDA_BUILT 1
#else
#define CUDA_BUILT 0
#endif

static PyMethodDef module_methods[] = {
    {"sim_launch", (PyCFunction)(void (*)(void))sim_launch, METH_FASTCALL,
     "sim_launch(stream, fn, *args)\n--\n\nEnqueue fn(*args) as a simulator kernel on stream (a launch's l.stream). "
     "While the stream records a graph, the call is recorded and runs again at every replay, with the same fn and "
     "args objects; cgtree keeps them alive as long as the tree lives."},
    {"static", pycgt_make_static, METH_O,
     "static(obj)\n--\n\nCaller memory at a stable address (weights, caches): its address is part of the node key. "
     "obj speaks DLPack or __cuda_array_interface__, supports the buffer protocol (numpy, on the simulator), or is "
     "a (ptr, nbytes) pair. It must be contiguous."},
    {"dynamic", pycgt_make_dynamic, METH_O,
     "dynamic(obj)\n--\n\nCaller memory whose address may change every step: copied into a pool placeholder before "
     "a replay. obj as for static()."},
    {"host_memory", (PyCFunction)(void (*)(void))host_memory, METH_FASTCALL,
     "host_memory(ptr, nbytes) -> a writable memoryview of host memory (simulator device memory), for simulator "
     "kernels. Nothing checks the range: it must be memory the kernel may touch."},
    {"_set_view_impl", pycgt_set_view_impl, METH_O, "Used by the cgtree package at import."},
    {"cuda_available", cuda_available, METH_NOARGS, "True if a usable CUDA device and driver are present."},
    {"status_name", status_name, METH_O, "status_name(code) -> the cgt_status name, e.g. 'CGT_ERR_STALE_VALUE'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "cgtree._cgtree", "The C extension behind the cgtree package (see cgtree's docstring).",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

static int add_type(PyObject *m, PyTypeObject *type, const char *name) {
  if (PyType_Ready(type) < 0)
    return -1;
  return PyModule_AddObjectRef(m, name, (PyObject *)type);
}

PyMODINIT_FUNC PyInit__cgtree(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m)
    return NULL;
  if (make_errors(m) < 0 || add_type(m, &PyTree_Type, "Tree") < 0 ||
      add_type(m, &PyValue_Type, "Value") < 0 || add_type(m, &PyArgBuf_Type, "Arg") < 0 ||
      add_type(m, &PyLaunch_Type, "Launch") < 0 ||
      PyModule_AddStringConstant(m, "__version__", CGT_VERSION_STRING) < 0 ||
      PyModule_AddIntConstant(m, "SEGMENT_NO_CAPTURE", CGT_SEGMENT_NO_CAPTURE) < 0 ||
      PyModule_AddIntConstant(m, "STATUS_COUNT", CGT_STATUS_COUNT) < 0 ||
      PyModule_AddIntConstant(m, "CUDA_BUILT", CUDA_BUILT) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
