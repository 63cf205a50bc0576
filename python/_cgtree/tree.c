/* tree.c — cgtree.Tree: a cgt_tree and the Python objects it calls.
 *
 * The tree owns its segments' launch functions and the Python simulator
 * kernels its graphs may replay (module.c explains `keep`). Every method
 * maps to one libcgtree call and raises the status class with the tree's
 * last error when that call fails; checks that only Python can make (the
 * type of an argument, a Value of another tree, a host array given to a CUDA
 * tree) are made before libcgtree is called, so a refused call changes
 * nothing.
 *
 * The replay path is Tree.run: it reads the segment id, the variant and the
 * argument objects (a Value is a handle, an Arg three fields), calls cgt_run
 * with cgt_arg and cgt_value arrays on the C stack, and builds the returned
 * tuple of Values. Those n_outputs + 1 objects are the only Python objects a
 * replayed run allocates (python/tests/test_overhead.py measures it).
 *
 * `busy` is set around every libcgtree call that may call back into Python
 * (a launch function, or a simulator kernel replayed by a graph): a method
 * of the same tree entered from there raises StateError, as libcgtree
 * itself refuses most calls inside a launch function.
 */
#include "pycgt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { STACK_ARGS = 16 };

int pycgt_tree_usable(PyTree *tree, const char *what) {
  if (!tree->t) {
    pycgt_raise(CGT_ERR_STATE, what, "the tree is closed");
    return 0;
  }
  if (tree->busy) {
    pycgt_raise(CGT_ERR_STATE, what,
                "not allowed inside a launch function or a simulator kernel of the same tree");
    return 0;
  }
  return 1;
}

static PyObject *raise_invalid(const char *what, const char *fmt, ...) {
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return pycgt_raise(CGT_ERR_INVALID_ARGUMENT, what, detail);
}

/* After a libcgtree call that may have replayed Python kernels: 0, or -1 with
 * SegmentFailed set (caused by the kernel's exception). */
static int check_kernel_error(PyTree *self, const char *what) {
  PyObject *e = pycgt_take_kernel_error();
  if (!e)
    return 0;
  char detail[256];
  snprintf(detail, sizeof detail, "a simulator kernel raised %.200s while it replayed", Py_TYPE(e)->tp_name);
  pycgt_raise(CGT_ERR_SEGMENT_FAILED, what, detail);
  PyObject *exc = pycgt_take_exception();
  if (exc) {
    PyException_SetCause(exc, Py_NewRef(e));
    PyException_SetContext(exc, Py_NewRef(e));
  }
  pycgt_set_exception(exc);
  Py_DECREF(e);
  (void)self;
  return -1;
}

/* --------------------------------------------------------- create / free */

static int parse_choice(const char *what, const char *s, const char *const *names, int n, int *out) {
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i])) {
      *out = i;
      return 0;
    }
  raise_invalid("Tree", "%s must be one of %s, %s%s%s, not '%s'", what, names[0], names[1], n > 2 ? ", " : "",
                n > 2 ? names[2] : "", s);
  return -1;
}

static int size_option(PyObject *o, const char *name, uint64_t max, uint64_t *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "Tree: %s must be an int", name);
    return -1;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_invalid("Tree", "%s must be a non-negative int that fits", name);
    return -1;
  }
  if (v > max) {
    raise_invalid("Tree", "%s is too large", name);
    return -1;
  }
  *out = v;
  return 0;
}

static PyObject *tree_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"backend",          "mode",           "device",           "stream",
                           "warmup_runs",      "rerecord_limit", "pool_chunk_bytes", "pool_reserve_bytes",
                           "pool_limit_bytes", "defer_launch",   "max_graphs",       "max_graph_bytes",
                           "update_in_place",  NULL};
  const char *backend = "auto", *mode = "tree";
  int device = 0, defer = 0, update_in_place = 1;
  PyObject *stream = Py_None, *warmup = NULL, *rerecord = NULL, *chunk = NULL, *reserve = NULL, *limit = NULL;
  PyObject *max_graphs = NULL, *max_graph_bytes = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$ssiOOOOOOpOOp:Tree", kwlist, &backend, &mode, &device, &stream,
                                   &warmup, &rerecord, &chunk, &reserve, &limit, &defer, &max_graphs,
                                   &max_graph_bytes, &update_in_place))
    return NULL;
  static const char *const backends[] = {"auto", "cuda", "sim"};
  static const char *const modes[] = {"tree", "eager", "separate"};
  int b, m;
  if (parse_choice("backend", backend, backends, 3, &b) < 0 || parse_choice("mode", mode, modes, 3, &m) < 0)
    return NULL;
  if (device < 0)
    return raise_invalid("Tree", "device must not be negative");
  cgt_options o;
  cgt_options_init(&o);
  o.backend = (cgt_backend)b;
  o.mode = (cgt_mode)m;
  o.device = device;
  o.defer_launch = (uint32_t)defer;
  uint64_t v;
  if (warmup) {
    if (size_option(warmup, "warmup_runs", UINT32_MAX, &v) < 0)
      return NULL;
    o.warmup_runs = (uint32_t)v;
  }
  if (rerecord) {
    if (size_option(rerecord, "rerecord_limit", UINT32_MAX, &v) < 0)
      return NULL;
    o.rerecord_limit = (uint32_t)v;
  }
  if (chunk) {
    if (size_option(chunk, "pool_chunk_bytes", SIZE_MAX, &v) < 0)
      return NULL;
    o.pool_chunk_bytes = (size_t)v;
  }
  if (reserve) {
    if (size_option(reserve, "pool_reserve_bytes", SIZE_MAX, &v) < 0)
      return NULL;
    o.pool_reserve_bytes = (size_t)v;
  }
  if (limit) {
    if (size_option(limit, "pool_limit_bytes", SIZE_MAX, &v) < 0)
      return NULL;
    o.pool_limit_bytes = (size_t)v;
  }
  /* The recording budget and update in place (issue 23); nonsense values
   * are the C library's to refuse, as InvalidArgument. */
  if (max_graphs) {
    if (size_option(max_graphs, "max_graphs", UINT32_MAX, &v) < 0)
      return NULL;
    o.max_graphs = (uint32_t)v;
  }
  if (max_graph_bytes) {
    if (size_option(max_graph_bytes, "max_graph_bytes", SIZE_MAX, &v) < 0)
      return NULL;
    o.max_graph_bytes = (size_t)v;
  }
  o.no_update_in_place = !update_in_place;
  if (stream != Py_None) {
    o.stream = PyLong_AsVoidPtr(stream);
    if (!o.stream && PyErr_Occurred())
      return NULL;
  }
  PyTree *self = (PyTree *)type->tp_alloc(type, 0);
  if (!self)
    return NULL;
  self->keep = PyList_New(0);
  if (!self->keep) {
    Py_DECREF(self);
    return NULL;
  }
  cgt_status st = cgt_tree_create(&o, &self->t);
  if (st != CGT_OK) {
    Py_DECREF(self);
    const char *why = st == CGT_ERR_NO_DEVICE ? "the CUDA backend was asked for, but no usable GPU or driver is present "
                                                "(or this cgtree was built without CUDA)"
                      : st == CGT_ERR_INVALID_ARGUMENT && o.stream && b == CGT_BACKEND_SIM
                          ? "the simulator makes its own stream: stream must be None"
                          : NULL;
    return pycgt_raise(st, "Tree", why);
  }
  self->backend = cgt_tree_backend(self->t);
  self->device = self->backend == CGT_BACKEND_CUDA ? device : 0;
  return (PyObject *)self;
}

static void free_segments(PyTree *self) {
  for (uint32_t i = 0; i < self->n_segs; i++) {
    Py_XDECREF(self->segs[i]->launch);
    Py_XDECREF(self->segs[i]->name);
    PyMem_Free(self->segs[i]);
  }
  PyMem_Free(self->segs);
  self->segs = NULL;
  self->n_segs = self->cap_segs = 0;
}

/* Destroys the C tree (which may replay held-back Python kernels), then
 * drops what its graphs needed. */
static void destroy_tree(PyTree *self) {
  if (!self->t)
    return;
  cgt_tree *t = self->t;
  self->busy = 1;
  cgt_tree_destroy(t);
  self->busy = 0;
  self->t = NULL;
  PyObject *e = pycgt_take_kernel_error();
  if (e) {
    pycgt_set_exception(e);
    PyErr_WriteUnraisable((PyObject *)self);
  }
}

static int tree_traverse(PyTree *self, visitproc visit, void *arg) {
  for (uint32_t i = 0; i < self->n_segs; i++)
    Py_VISIT(self->segs[i]->launch);
  Py_VISIT(self->pending);
  /* `keep` is not visited on purpose: its kernels may still be replayed (by
   * cgt_tree_destroy with defer_launch), so the collector must never clear
   * them. A cycle through a kept kernel leaks instead of crashing. */
  return 0;
}

static int tree_clear(PyTree *self) {
  for (uint32_t i = 0; i < self->n_segs; i++)
    Py_CLEAR(self->segs[i]->launch);
  Py_CLEAR(self->pending);
  return 0;
}

static void tree_dealloc(PyTree *self) {
  PyObject_GC_UnTrack(self);
  if (self->weakrefs)
    PyObject_ClearWeakRefs((PyObject *)self);
  destroy_tree(self);
  free_segments(self);
  Py_CLEAR(self->pending);
  Py_CLEAR(self->keep);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *tree_close(PyTree *self, PyObject *unused) {
  (void)unused;
  if (self->busy)
    return pycgt_raise(CGT_ERR_STATE, "Tree.close", "not allowed inside a launch function or kernel of the tree");
  destroy_tree(self);
  if (PyErr_Occurred())
    return NULL;
  Py_RETURN_NONE;
}

static PyObject *tree_enter(PyTree *self, PyObject *unused) {
  (void)unused;
  return Py_NewRef((PyObject *)self);
}

static PyObject *tree_exit(PyTree *self, PyObject *args) {
  (void)args;
  return tree_close(self, NULL);
}

/* ------------------------------------------------------------- segments */

static PyObject *tree_segment(PyTree *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"name", "launch", "n_inputs", "n_outputs", "flags", NULL};
  PyObject *name, *launch;
  unsigned int n_in, n_out, flags = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UOII|I:segment", kwlist, &name, &launch, &n_in, &n_out, &flags))
    return NULL;
  if (!pycgt_tree_usable(self, "Tree.segment"))
    return NULL;
  if (!PyCallable_Check(launch))
    return PyErr_Format(PyExc_TypeError, "segment: launch must be callable, not %.100s", Py_TYPE(launch)->tp_name);
  const char *cname = PyUnicode_AsUTF8(name);
  if (!cname)
    return NULL;
  if (self->n_segs == self->cap_segs) {
    uint32_t cap = self->cap_segs ? self->cap_segs * 2 : 8;
    py_segment **grown = PyMem_Realloc(self->segs, cap * sizeof *grown);
    if (!grown)
      return PyErr_NoMemory();
    self->segs = grown;
    self->cap_segs = cap;
  }
  py_segment *s = PyMem_Malloc(sizeof *s);
  if (!s)
    return PyErr_NoMemory();
  s->tree = self;
  s->launch = launch;
  s->name = name;
  s->n_inputs = n_in;
  s->n_outputs = n_out;
  s->flags = flags;
  cgt_segment_desc d = {cname, pycgt_launch_trampoline, s, n_in, n_out, flags};
  cgt_segment id;
  cgt_status st = cgt_segment_register(self->t, &d, &id);
  if (st != CGT_OK) {
    PyMem_Free(s);
    return pycgt_raise_tree(self, st, "Tree.segment", NULL);
  }
  if (id != self->n_segs + 1) { /* libcgtree numbers segments 1, 2, ... in registration order */
    PyMem_Free(s);
    return pycgt_raise(CGT_ERR_STATE, "Tree.segment", "segment ids out of step with libcgtree");
  }
  s->id = id;
  Py_INCREF(launch);
  Py_INCREF(name);
  self->segs[self->n_segs++] = s;
  return PyLong_FromUnsignedLong(id);
}

/* ------------------------------------------------------------------ runs */

/* Fills out[0..n) from the argument objects; -1 with an exception if one is
 * not a Value of this tree or an Arg that fits the tree's device. */
static int convert_args(PyTree *self, PyObject *const *items, Py_ssize_t n, cgt_arg *out) {
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *a = items[i];
    if (Py_IS_TYPE(a, &PyValue_Type)) {
      PyValue *v = (PyValue *)a;
      if (v->tree != self) {
        raise_invalid("Tree.run", "argument %zd is a value of another tree", i);
        return -1;
      }
      out[i] = cgt_arg_value(v->v);
    } else if (Py_IS_TYPE(a, &PyArgBuf_Type)) {
      PyArgBuf *b = (PyArgBuf *)a;
      const char *why = pycgt_arg_device_mismatch(b, self->backend, self->device);
      if (why) {
        raise_invalid("Tree.run", "argument %zd: %s", i, why);
        return -1;
      }
      out[i].kind = b->kind;
      out[i].value.bits = 0;
      out[i].ptr = (const void *)b->ptr;
      out[i].bytes = b->nbytes;
    } else {
      PyErr_Format(PyExc_TypeError,
                   "Tree.run: argument %zd is a %.100s; pass a cgtree.Value, cgtree.static(obj) or cgtree.dynamic(obj)",
                   i, Py_TYPE(a)->tp_name);
      return -1;
    }
  }
  return 0;
}

/* The argument sequence as an array (tuple or list; no copy). */
static int arg_items(PyObject *args_o, PyObject *const **items, Py_ssize_t *n) {
  if (!args_o) {
    *items = NULL;
    *n = 0;
  } else if (PyTuple_Check(args_o)) {
    *items = &PyTuple_GET_ITEM(args_o, 0);
    *n = PyTuple_GET_SIZE(args_o);
  } else if (PyList_Check(args_o)) {
    *items = (PyObject *const *)&PyList_GET_ITEM(args_o, 0);
    *n = PyList_GET_SIZE(args_o);
  } else {
    PyErr_Format(PyExc_TypeError, "Tree.run: args must be a tuple or a list, not %.100s", Py_TYPE(args_o)->tp_name);
    return -1;
  }
  return 0;
}

static py_segment *lookup_segment(PyTree *self, PyObject *seg_o, const char *what) {
  unsigned long seg = PyLong_AsUnsignedLong(seg_o);
  if (seg == (unsigned long)-1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
      return NULL;
    PyErr_Clear();
    raise_invalid(what, "unknown segment");
    return NULL;
  }
  if (seg == 0 || seg > self->n_segs) {
    raise_invalid(what, "unknown segment %lu (the tree has %u)", seg, self->n_segs);
    return NULL;
  }
  return self->segs[seg - 1];
}

static PyObject *tree_run(PyTree *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *seg_o = NULL, *args_o = NULL, *variant_o = NULL;
  if (nargs < 1 || nargs > 3)
    goto usage;
  seg_o = args[0];
  if (nargs > 1)
    args_o = args[1];
  if (nargs > 2)
    variant_o = args[2];
  if (kwnames) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
      PyObject *key = PyTuple_GET_ITEM(kwnames, k);
      if (PyUnicode_CompareWithASCIIString(key, "args") == 0 && !args_o)
        args_o = args[nargs + k];
      else if (PyUnicode_CompareWithASCIIString(key, "variant") == 0 && !variant_o)
        variant_o = args[nargs + k];
      else
        goto usage;
    }
  }
  if (!pycgt_tree_usable(self, "Tree.run"))
    return NULL;
  py_segment *s = lookup_segment(self, seg_o, "Tree.run");
  if (!s)
    return NULL;
  uint64_t variant = 0;
  if (variant_o) {
    variant = PyLong_AsUnsignedLongLong(variant_o);
    if (variant == (uint64_t)-1 && PyErr_Occurred())
      return NULL;
  }
  PyObject *const *items;
  Py_ssize_t n;
  if (arg_items(args_o, &items, &n) < 0)
    return NULL;
  if ((uint64_t)n != s->n_inputs)
    return raise_invalid("Tree.run", "segment '%s' takes %u arguments, got %zd", PyUnicode_AsUTF8(s->name), s->n_inputs, n);

  cgt_arg args_stack[STACK_ARGS];
  cgt_value outs_stack[STACK_ARGS];
  cgt_arg *cargs = n <= STACK_ARGS ? args_stack : PyMem_Malloc((size_t)n * sizeof *cargs);
  cgt_value *outs = s->n_outputs <= STACK_ARGS ? outs_stack : PyMem_Malloc(s->n_outputs * sizeof *outs);
  PyObject *result = NULL;
  if (!cargs || !outs) {
    PyErr_NoMemory();
    goto done;
  }
  if (convert_args(self, items, n, cargs) < 0)
    goto done;
  self->busy = 1;
  cgt_status st = cgt_run(self->t, s->id, variant, cargs, (uint32_t)n, outs, s->n_outputs);
  self->busy = 0;
  if (st != CGT_OK) {
    PyObject *cause = self->pending;
    self->pending = NULL;
    PyObject *kernel = pycgt_take_kernel_error();
    if (!cause)
      cause = kernel;
    else
      Py_XDECREF(kernel);
    pycgt_raise_tree(self, st, "Tree.run", cause);
    goto done;
  }
  Py_CLEAR(self->pending); /* libcgtree recovered (a capture failure re-run eagerly) */
  if (check_kernel_error(self, "Tree.run") < 0)
    goto release;
  result = PyTuple_New(s->n_outputs);
  if (!result)
    goto release;
  for (uint32_t i = 0; i < s->n_outputs; i++) {
    PyObject *v = pycgt_value_new(self, outs[i]);
    if (!v) {
      Py_CLEAR(result);
      goto release;
    }
    PyTuple_SET_ITEM(result, i, v);
  }
  goto done;
release:
  /* The run happened but its outputs cannot be handed out: release them so
   * their memory is not held for the rest of the step. */
  for (uint32_t i = 0; i < s->n_outputs; i++)
    cgt_value_release(self->t, outs[i]);
done:
  if (cargs != args_stack)
    PyMem_Free(cargs);
  if (outs != outs_stack)
    PyMem_Free(outs);
  return result;
usage:
  PyErr_SetString(PyExc_TypeError, "run(segment, args=(), variant=0)");
  return NULL;
}

static PyObject *tree_step_begin(PyTree *self, PyObject *unused) {
  (void)unused;
  if (!pycgt_tree_usable(self, "Tree.step_begin"))
    return NULL;
  self->busy = 1;
  cgt_status st = cgt_step_begin(self->t);
  self->busy = 0;
  if (check_kernel_error(self, "Tree.step_begin") < 0)
    return NULL;
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.step_begin", NULL);
  Py_RETURN_NONE;
}

static PyObject *tree_flush(PyTree *self, PyObject *unused) {
  (void)unused;
  if (!pycgt_tree_usable(self, "Tree.flush"))
    return NULL;
  self->busy = 1;
  cgt_status st = cgt_flush(self->t);
  self->busy = 0;
  if (check_kernel_error(self, "Tree.flush") < 0)
    return NULL;
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.flush", NULL);
  Py_RETURN_NONE;
}

static PyObject *tree_sync(PyTree *self, PyObject *unused) {
  (void)unused;
  if (!pycgt_tree_usable(self, "Tree.sync"))
    return NULL;
  self->busy = 1;
  cgt_status st = cgt_sync(self->t);
  self->busy = 0;
  if (check_kernel_error(self, "Tree.sync") < 0)
    return NULL;
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.sync", NULL);
  Py_RETURN_NONE;
}

static PyObject *tree_release(PyTree *self, PyObject *v) {
  if (!pycgt_tree_usable(self, "Tree.release"))
    return NULL;
  if (!Py_IS_TYPE(v, &PyValue_Type))
    return PyErr_Format(PyExc_TypeError, "Tree.release: expected a cgtree.Value, got %.100s", Py_TYPE(v)->tp_name);
  if (((PyValue *)v)->tree != self)
    return raise_invalid("Tree.release", "the value belongs to another tree");
  cgt_status st = cgt_value_release(self->t, ((PyValue *)v)->v);
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.release", NULL);
  Py_RETURN_NONE;
}

/* -------------------------------------------------------- introspection */

static PyObject *tree_stats(PyTree *self, PyObject *unused) {
  (void)unused;
  if (!self->t)
    return pycgt_raise(CGT_ERR_STATE, "Tree.stats", "the tree is closed");
  cgt_stats s;
  cgt_status st = cgt_tree_stats(self->t, &s);
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.stats", NULL);
  PyObject *d = PyDict_New();
  if (!d)
    return NULL;
  PyObject *x;
#define PUT_U64(f)                                                                                                     \
  x = PyLong_FromUnsignedLongLong(s.f);                                                                                \
  if (!x || PyDict_SetItemString(d, #f, x) < 0)                                                                        \
    goto fail;                                                                                                         \
  Py_DECREF(x);
#define PUT_SIZE(f)                                                                                                    \
  x = PyLong_FromSize_t(s.f);                                                                                          \
  if (!x || PyDict_SetItemString(d, #f, x) < 0)                                                                        \
    goto fail;                                                                                                         \
  Py_DECREF(x);
  CGT_STATS_FIELDS(PUT_U64, PUT_SIZE)
#undef PUT_U64
#undef PUT_SIZE
  return d;
fail:
  Py_XDECREF(x);
  Py_DECREF(d);
  return NULL;
}

static PyObject *node_dict(const cgt_node_info *n) {
  return Py_BuildValue("{s:I,s:I,s:I,s:I,s:s,s:K,s:s,s:K,s:K,s:n,s:z,s:K,s:z,s:K}", "id", n->id, "parent", n->parent,
                       "depth", n->depth, "segment", n->segment, "segment_name",
                       n->segment_name ? n->segment_name : "", "variant", (unsigned long long)n->variant, "state",
                       cgt_node_state_name(n->state), "replays", (unsigned long long)n->replays, "eager_runs",
                       (unsigned long long)n->eager_runs, "pool_bytes_live", (Py_ssize_t)n->pool_bytes_live, "reason",
                       n->reason, "evictions", (unsigned long long)n->evictions, "evict_reason", n->evict_reason,
                       "updates", (unsigned long long)n->updates);
}

static PyObject *tree_nodes(PyTree *self, PyObject *unused) {
  (void)unused;
  if (!self->t)
    return pycgt_raise(CGT_ERR_STATE, "Tree.nodes", "the tree is closed");
  size_t count = 0;
  cgt_status st = cgt_tree_nodes(self->t, NULL, 0, &count);
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.nodes", NULL);
  cgt_node_info *info = count ? PyMem_Malloc(count * sizeof *info) : NULL;
  if (count && !info)
    return PyErr_NoMemory();
  st = cgt_tree_nodes(self->t, info, count, &count);
  if (st != CGT_OK) {
    PyMem_Free(info);
    return pycgt_raise_tree(self, st, "Tree.nodes", NULL);
  }
  PyObject *list = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; list && i < count; i++) {
    PyObject *d = node_dict(&info[i]);
    if (!d) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, d);
  }
  PyMem_Free(info);
  return list;
}

static PyObject *tree_dot(PyTree *self, PyObject *unused) {
  (void)unused;
  if (!self->t)
    return pycgt_raise(CGT_ERR_STATE, "Tree.dot", "the tree is closed");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f)
    return PyErr_NoMemory();
  cgt_status st = cgt_tree_write_dot(self->t, f);
  fclose(f);
  if (st != CGT_OK) {
    free(buf);
    return pycgt_raise_tree(self, st, "Tree.dot", NULL);
  }
  PyObject *s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "replace");
  free(buf);
  return s;
}

static PyObject *tree_check(PyTree *self, PyObject *unused) {
  (void)unused;
  if (!self->t)
    return pycgt_raise(CGT_ERR_STATE, "Tree.check", "the tree is closed");
  cgt_status st = cgt_tree_check(self->t);
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.check", NULL);
  Py_RETURN_NONE;
}

static PyObject *tree_sim_set_device_limit(PyTree *self, PyObject *arg) {
  if (!pycgt_tree_usable(self, "Tree.sim_set_device_limit"))
    return NULL;
  size_t limit = SIZE_MAX;
  if (arg != Py_None) {
    limit = PyLong_AsSize_t(arg);
    if (limit == (size_t)-1 && PyErr_Occurred())
      return NULL;
  }
  cgt_status st = cgt_sim_set_device_limit(self->t, limit);
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree.sim_set_device_limit", NULL);
  Py_RETURN_NONE;
}

/* _c_run_steps(seg, args, steps, runs_per_step, variant=0, chain=-1, first=0)
 * -> nanoseconds. The C twin of a Python loop, for bench/python_overhead.py:
 * `steps` times, cgt_step_begin and then `runs_per_step` cgt_run calls of
 * seg with args converted once. With chain >= 0, each step first runs
 * segment `first` (no arguments) and argument `chain` of every run is output
 * 0 of the run before it. Outputs are not released (they die with the step),
 * as in the Python loop it is compared with. Only the steps are timed: the
 * stream is drained between steps, outside the timed part, so that on CUDA
 * the launch queue never fills (the Python twin does the same). */
static PyObject *tree_c_run_steps(PyTree *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"seg", "args", "steps", "runs_per_step", "variant", "chain", "first", NULL};
  PyObject *seg_o, *args_o;
  Py_ssize_t steps, per_step, chain = -1;
  unsigned long long variant = 0;
  unsigned int first = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOnn|KnI:_c_run_steps", kwlist, &seg_o, &args_o, &steps,
                                   &per_step, &variant, &chain, &first))
    return NULL;
  if (!pycgt_tree_usable(self, "Tree._c_run_steps"))
    return NULL;
  py_segment *s = lookup_segment(self, seg_o, "Tree._c_run_steps");
  if (!s)
    return NULL;
  cgt_segment seg = s->id;
  PyObject *const *items;
  Py_ssize_t n;
  if (arg_items(args_o, &items, &n) < 0)
    return NULL;
  if ((uint64_t)n != s->n_inputs || n > STACK_ARGS || s->n_outputs > STACK_ARGS || s->n_outputs == 0 ||
      chain >= n || (chain >= 0 && (first == 0 || first > self->n_segs)))
    return raise_invalid("Tree._c_run_steps", "arguments do not fit the segment");
  cgt_arg cargs[STACK_ARGS];
  cgt_value outs[STACK_ARGS];
  if (convert_args(self, items, n, cargs) < 0)
    return NULL;
  struct timespec t0, t1;
  long long ns = 0;
  cgt_status st = CGT_OK;
  self->busy = 1;
  for (Py_ssize_t step = 0; step < steps && st == CGT_OK; step++) {
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = cgt_step_begin(self->t);
    if (st == CGT_OK && chain >= 0) {
      cgt_value v[STACK_ARGS];
      st = cgt_run(self->t, first, 0, NULL, 0, v, self->segs[first - 1]->n_outputs);
      cargs[chain] = cgt_arg_value(v[0]);
    }
    for (Py_ssize_t r = 0; r < per_step && st == CGT_OK; r++) {
      st = cgt_run(self->t, seg, variant, cargs, (uint32_t)n, outs, s->n_outputs);
      if (chain >= 0)
        cargs[chain] = cgt_arg_value(outs[0]);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ns += (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    if (st == CGT_OK)
      st = cgt_sync(self->t);
  }
  self->busy = 0;
  Py_CLEAR(self->pending);
  if (check_kernel_error(self, "Tree._c_run_steps") < 0)
    return NULL;
  if (st != CGT_OK)
    return pycgt_raise_tree(self, st, "Tree._c_run_steps", NULL);
  return PyLong_FromLongLong(ns);
}

/* ----------------------------------------------------------- attributes */

static PyObject *tree_backend(PyTree *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(self->backend == CGT_BACKEND_CUDA ? "cuda" : "sim");
}

static PyObject *tree_mode(PyTree *self, void *closure) {
  (void)closure;
  if (!self->t)
    return pycgt_raise(CGT_ERR_STATE, "Tree.mode", "the tree is closed");
  static const char *const names[] = {"tree", "eager", "separate"};
  cgt_mode m = cgt_tree_mode(self->t);
  return PyUnicode_FromString((unsigned)m < 3 ? names[m] : "unknown");
}

static PyObject *tree_stream(PyTree *self, void *closure) {
  (void)closure;
  if (!self->t)
    return pycgt_raise(CGT_ERR_STATE, "Tree.stream", "the tree is closed");
  return PyLong_FromVoidPtr(cgt_tree_stream(self->t));
}

static PyObject *tree_last_error(PyTree *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(self->t ? cgt_tree_last_error(self->t) : "");
}

static PyObject *tree_device(PyTree *self, void *closure) {
  (void)closure;
  return PyLong_FromLong(self->device);
}

static PyObject *tree_closed(PyTree *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->t == NULL);
}

static PyObject *tree_segments(PyTree *self, void *closure) {
  (void)closure;
  PyObject *list = PyList_New(self->n_segs);
  for (uint32_t i = 0; list && i < self->n_segs; i++) {
    py_segment *s = self->segs[i];
    PyObject *d = Py_BuildValue("{s:I,s:O,s:I,s:I,s:I}", "id", i + 1, "name", s->name, "n_inputs", s->n_inputs,
                                "n_outputs", s->n_outputs, "flags", s->flags);
    if (!d) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, i, d);
  }
  return list;
}

static PyObject *tree_repr(PyTree *self) {
  if (!self->t)
    return PyUnicode_FromString("<cgtree.Tree (closed)>");
  static const char *const names[] = {"tree", "eager", "separate"};
  cgt_mode m = cgt_tree_mode(self->t);
  return PyUnicode_FromFormat("<cgtree.Tree backend=%s mode=%s segments=%u>",
                              self->backend == CGT_BACKEND_CUDA ? "cuda" : "sim", (unsigned)m < 3 ? names[m] : "?",
                              self->n_segs);
}

static PyMethodDef tree_methods[] = {
    {"segment", (PyCFunction)(void (*)(void))tree_segment, METH_VARARGS | METH_KEYWORDS,
     "segment(name, launch, n_inputs, n_outputs, flags=0) -> segment id.\n\nlaunch(l) is called with a "
     "cgtree.Launch for warmup, recording and eager runs, never for a replay; it must enqueue the same work with the "
     "same allocations every time it sees the same input addresses and variant."},
    {"run", (PyCFunction)(void (*)(void))tree_run, METH_FASTCALL | METH_KEYWORDS,
     "run(segment, args=(), variant=0) -> tuple of Values.\n\nargs: cgtree.Value (an output of this step), "
     "cgtree.static(obj) or cgtree.dynamic(obj). Replays, records, warms up or runs eagerly."},
    {"step_begin", (PyCFunction)tree_step_begin, METH_NOARGS,
     "step_begin(): end the step; every value still live becomes stale and the path restarts at the roots."},
    {"release", (PyCFunction)tree_release, METH_O, "release(value): as value.release()."},
    {"flush", (PyCFunction)tree_flush, METH_NOARGS, "flush(): enqueue every held-back replay (defer_launch)."},
    {"sync", (PyCFunction)tree_sync, METH_NOARGS, "sync(): wait for all work of the tree's stream."},
    {"stats", (PyCFunction)tree_stats, METH_NOARGS, "stats() -> dict of the cgt_stats counters."},
    {"nodes", (PyCFunction)tree_nodes, METH_NOARGS, "nodes() -> list of dicts, one per node, ordered by id."},
    {"dot", (PyCFunction)tree_dot, METH_NOARGS, "dot() -> the tree as Graphviz text."},
    {"check", (PyCFunction)tree_check, METH_NOARGS, "check(): assert every structural invariant (StateError if broken)."},
    {"sim_set_device_limit", (PyCFunction)tree_sim_set_device_limit, METH_O,
     "sim_set_device_limit(nbytes or None): the simulated device refuses allocations past nbytes (tests)."},
    {"close", (PyCFunction)tree_close, METH_NOARGS,
     "close(): destroy the C tree now; the tree and its values raise StateError afterwards."},
    {"__enter__", (PyCFunction)tree_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)tree_exit, METH_VARARGS, NULL},
    {"_c_run_steps", (PyCFunction)(void (*)(void))tree_c_run_steps, METH_VARARGS | METH_KEYWORDS,
     "_c_run_steps(seg, args, steps, runs_per_step, variant=0, chain=-1, first=0) -> ns: the same loop in C "
     "(bench/python_overhead.py)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tree_getset[] = {
    {"backend", (getter)tree_backend, NULL, "'cuda' or 'sim': the backend actually chosen.", NULL},
    {"mode", (getter)tree_mode, NULL, "'tree', 'eager' or 'separate': the mode in force (after CGT_MODE).", NULL},
    {"stream", (getter)tree_stream, NULL, "The stream all segments run on, as an int handle.", NULL},
    {"device", (getter)tree_device, NULL, "The CUDA device ordinal (0 on the simulator).", NULL},
    {"last_error", (getter)tree_last_error, NULL, "Detail of the last failure, '' if none.", NULL},
    {"closed", (getter)tree_closed, NULL, "True after close().", NULL},
    {"segments", (getter)tree_segments, NULL, "The registered segments, as dicts.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PyTree_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cgtree.Tree",
    .tp_basicsize = sizeof(PyTree),
    .tp_dealloc = (destructor)tree_dealloc,
    .tp_repr = (reprfunc)tree_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Tree(backend='auto', mode='tree', device=0, stream=None, warmup_runs=1, rerecord_limit=32, "
              "pool_chunk_bytes=0, pool_reserve_bytes=0, pool_limit_bytes=0, defer_launch=False, max_graphs=0, "
              "max_graph_bytes=0, update_in_place=True)\n\n"
              "A graph tree: segments, runs, steps and one checkpointed memory pool (see cgtree.h).",
    .tp_traverse = (traverseproc)tree_traverse,
    .tp_clear = (inquiry)tree_clear,
    .tp_methods = tree_methods,
    .tp_getset = tree_getset,
    .tp_weaklistoffset = offsetof(PyTree, weakrefs),
    .tp_new = tree_new,
};
