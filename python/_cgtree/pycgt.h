/* pycgt.h — what the files of the extension module cgtree._cgtree share.
 *
 * The extension is written against the public headers only (cgtree.h and
 * cgtree_sim.h): it is a client of libcgtree like any C program. Its files:
 *
 *   module.c   the module, its exception classes, cgtree.sim_launch
 *   tree.c     cgtree.Tree: options, segments, run, steps, introspection
 *   launch.c   the launch trampoline and the cgtree.Launch handed to a launch function
 *   value.c    cgtree.Value and its DLPack / __cuda_array_interface__ exports
 *   arg.c      cgtree.static() / cgtree.dynamic(): caller memory from DLPack,
 *              __cuda_array_interface__, the buffer protocol or (ptr, nbytes)
 *
 * Threading: the extension never releases the GIL around a libcgtree call.
 * Launch functions and simulator kernels are Python code, so cgt_run needs
 * the GIL anyway, and on the replay path taking and dropping it would cost
 * more than the replay itself. A tree belongs to one thread (as in C); the
 * tree's `busy` flag turns a second entry (from another thread while a launch
 * function runs, or from a kernel during a replay) into cgtree.StateError.
 */
#ifndef CGTREE_PYCGT_H
#define CGTREE_PYCGT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cgtree.h"
#include "cgtree_sim.h"
#include "dlpack.h"

/* One registered segment: the launch function and the tree it belongs to.
 * Allocated one by one so that the `user` pointer handed to libcgtree stays
 * put when the table grows. */
typedef struct py_segment {
  struct PyTree *tree; /* borrowed: the tree owns its segments */
  PyObject *launch;    /* the Python launch function */
  PyObject *name;      /* str */
  cgt_segment id;
  uint32_t n_inputs, n_outputs, flags;
} py_segment;

typedef struct PyTree {
  PyObject_HEAD
  cgt_tree *t;          /* NULL once closed */
  cgt_backend backend;  /* the backend actually chosen */
  int device;           /* CUDA ordinal (0 on the simulator) */
  int busy;             /* inside a libcgtree call that may run Python code */
  py_segment **segs;    /* segs[id - 1] */
  uint32_t n_segs, cap_segs;
  PyObject *keep;       /* list of (fn, args) simulator kernels recorded into graphs */
  PyObject *pending;    /* exception a launch function raised during the current call, or NULL */
  PyObject *weakrefs;
} PyTree;

typedef struct PyValue {
  PyObject_HEAD
  PyTree *tree; /* strong: the tree outlives its values */
  cgt_value v;
} PyValue;

/* cgtree.static(obj) / cgtree.dynamic(obj): caller memory and what keeps it alive. */
typedef struct PyArgBuf {
  PyObject_HEAD
  cgt_arg_kind kind;   /* CGT_ARG_STATIC or CGT_ARG_DYNAMIC */
  uintptr_t ptr;
  size_t nbytes;
  int32_t dev_type;    /* a DLDeviceType, or 0 for a raw (ptr, nbytes) pair of unknown device */
  int32_t dev_id;
  PyObject *obj;       /* what the memory came from */
  Py_buffer view;      /* held while has_view */
  int has_view;
  DLManagedTensor *managed; /* a consumed DLPack tensor, deleted with this object */
} PyArgBuf;

typedef struct PyLaunch {
  PyObject_HEAD
  cgt_launch *l; /* NULL once the launch function returned */
  PyTree *tree;  /* strong */
} PyLaunch;

extern PyTypeObject PyTree_Type;
extern PyTypeObject PyValue_Type;
extern PyTypeObject PyArgBuf_Type;
extern PyTypeObject PyLaunch_Type;

/* module.c: the exception classes, indexed by cgt_status (entry 0 is the base cgtree.Error). */
extern PyObject *pycgt_errors[CGT_STATUS_COUNT];
/* Raises the class of status s with message "what: detail" (detail may be NULL). Returns NULL. */
PyObject *pycgt_raise(cgt_status s, const char *what, const char *detail);
/* Raises the class of s with the tree's last error; chains `cause` (stolen, may be NULL). */
PyObject *pycgt_raise_tree(PyTree *tree, cgt_status s, const char *what, PyObject *cause);

/* module.c: the exception being raised, taken out of the error indicator
 * (normalized, with its traceback attached), or NULL if none; and the way
 * back in. PyErr_Fetch is deprecated from 3.12 on; these pick the API. */
PyObject *pycgt_take_exception(void);
void pycgt_set_exception(PyObject *exc); /* steals exc */

/* module.c: simulator kernels written in Python. pycgt_current_tree is the
 * tree whose launch function runs now (kernels recorded by it are kept
 * alive by that tree); pycgt_kernel_error takes the exception a Python kernel
 * raised where nobody could see it (during a replay), or NULL. */
extern PyTree *pycgt_current_tree;
PyObject *pycgt_take_kernel_error(void);

/* launch.c */
cgt_status pycgt_launch_trampoline(cgt_launch *l, void *user);

/* value.c */
PyObject *pycgt_value_new(PyTree *tree, cgt_value v);

/* arg.c: NULL if argument a may be used by a tree on this backend and device, else why not. */
const char *pycgt_arg_device_mismatch(const PyArgBuf *a, cgt_backend backend, int device);
PyObject *pycgt_make_static(PyObject *self, PyObject *obj);
PyObject *pycgt_make_dynamic(PyObject *self, PyObject *obj);

/* value.c: Value.view's implementation, handed over by cgtree/_view.py. */
PyObject *pycgt_set_view_impl(PyObject *self, PyObject *fn);

/* tree.c: 0 with StateError set unless the tree is open and not busy. */
int pycgt_tree_usable(PyTree *tree, const char *what);

#endif /* CGTREE_PYCGT_H */
