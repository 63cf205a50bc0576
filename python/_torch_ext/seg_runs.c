/* seg_runs.c — a segment's state in each tree, and what keys a call.
 *
 * Trees. Each thread runs on its own tree (cgtree.torch's tree getter, cached
 * per thread), as PyTorch keeps a tree per thread; a segment keeps what it
 * needs in each tree it ran in (seg_run: its registration, and everything a
 * call holds across a call into Python, where another thread may run the
 * same segment). Shapes and output templates are the segment's, shared.
 * When a tree is freed (its thread exited: tree_close.c) its runs go with it.
 *
 * A model passes every weight as a STATIC input: 60 and more per graph.
 * Their addresses key the node, so every pointer is read on every call,
 * through DLPack's exchange API (about 0.1 us; a segment's first call checks
 * it against data_ptr() on each of its inputs). Without it a pointer costs a
 * call of tensor.data_ptr(); then, in a graph with STATIC_CHECK_MIN STATIC
 * inputs or more, the pointers of the last call are kept, and one call of
 * PyTorch's own check (the C++ loop torch._C._tensors_data_ptrs_at_indices_equal,
 * which CUDAGraph Trees use for the same purpose) confirms all of them at
 * once; only if one moved are they read one by one again. DYNAMIC inputs are
 * read every call.
 *
 * The variant of a call is a hash of its key (key_add, segment.h): the
 * ints and floats, where a VALUE input starts inside its value, the
 * generators. The key itself is kept in each template (seg_key_is), so a
 * collision is seen and never replays another key's recording.
 */
#include "segment.h"

/* ------------------------------------------------- STATIC pointers */

/* 1 if every STATIC tensor input is where it was at the last call, by one
 * call of PyTorch's check for all of them; 0 if one moved, or if that
 * cannot be told cheaply (then they are read one by one). */
int seg_static_ptrs_unchanged(seg_run *r, PyObject *const *args, size_t n) {
  SegmentObject *s = r->s;
  if (!TX.ptrs_equal || !s->static_idx || !r->static_known)
    return 0;
  s->static_checks++;
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (!list) {
    PyErr_Clear();
    return 0;
  }
  for (size_t i = 0; i < n; i++)
    PyList_SET_ITEM(list, (Py_ssize_t)i, Py_NewRef(args[i]));
  PyObject *call[3] = {list, r->static_ptrs, s->static_idx};
  PyObject *res = PyObject_Vectorcall(TX.ptrs_equal, call, 3, NULL);
  Py_DECREF(list);
  if (!res) {
    PyErr_Clear(); /* read them one by one: that path reports a real error */
    return 0;
  }
  int same = res == Py_True;
  Py_DECREF(res);
  s->static_hits += (uint64_t)same;
  return same;
}

/* Remembers STATIC input i's pointer; 0 if there was no memory to. */
int seg_static_ptr_note(seg_run *r, size_t i, void *ptr) {
  if (r->static_ptr[i] == ptr && r->static_known)
    return 1;
  PyObject *v = PyLong_FromVoidPtr(ptr);
  if (!v) {
    PyErr_Clear();
    return 0;
  }
  r->static_ptr[i] = ptr;
  PyList_SetItem(r->static_ptrs, (Py_ssize_t)i, v); /* steals v */
  return 1;
}

/* The run's STATIC pointer cache, where its segment checks them with
 * PyTorch's check: a list of n zeros, and their C copy. */
static int static_cache_make(seg_run *r, size_t n) {
  r->static_ptr = tx_calloc(n + 1, sizeof *r->static_ptr);
  r->static_ptrs = PyList_New((Py_ssize_t)n);
  if (!r->static_ptr || !r->static_ptrs) {
    PyErr_NoMemory();
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    PyObject *zero = PyLong_FromLong(0);
    if (!zero)
      return -1;
    PyList_SET_ITEM(r->static_ptrs, (Py_ssize_t)i, zero);
  }
  return 0;
}

/* ------------------------------------------------------------ calls */

int tx_data_ptr_slow(PyObject *o, void **out) {
  PyObject *p = TX.data_ptr ? PyObject_Vectorcall(TX.data_ptr, &o, 1, NULL)
                            : PyObject_VectorcallMethod(TX.str_data_ptr, &o, 1, NULL);
  if (!p)
    return -1;
  *out = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

int tx_caller_stream(TreeObject *T, void **out) {
  if (tx_exchange_stream(T->device, out))
    return 0;
  PyObject *rs = PyObject_Vectorcall(TX.raw_stream, &T->device_obj, 1, NULL);
  if (!rs)
    return -1;
  *out = PyLong_AsVoidPtr(rs);
  Py_DECREF(rs);
  return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* Registers the segment with the run's tree, once its outputs are known. */
int seg_run_register(seg_run *r) {
  SegmentObject *s = r->s;
  cgt_segment_desc d;
  memset(&d, 0, sizeof d);
  d.name = s->name;
  d.launch = seg_launch;
  d.user = r;
  d.n_inputs = s->n_targs;
  d.n_outputs = s->n_outputs;
  d.flags = s->flags;
  if (!r->outs) {
    r->outs = tx_calloc(s->n_outputs ? s->n_outputs : 1, sizeof *r->outs);
    if (!r->outs) {
      PyErr_NoMemory();
      return -1;
    }
  }
  cgt_status st = cgt_segment_register(r->tree->tree, &d, &r->seg);
  if (st == CGT_OK && s->prelaunch_py)
    st = cgt_segment_set_prelaunch(r->tree->tree, r->seg, seg_prelaunch, r);
  if (st != CGT_OK) {
    tx_status_error(r->tree, st, "cgt_segment_register");
    return -1;
  }
  r->registered = 1;
  Py_INCREF(s); /* the tree calls back into it for as long as it lives */
  return 0;
}

/* The tree of the calling thread for the segment's device: the tree the
 * segment was made with where no per-thread trees are kept (TX.tree_for
 * unset: the simulator tests), else cgtree.torch's tree of this thread,
 * cached per thread (a thread's trees live at least as long as it does). */
enum { TLS_DEVICES = 64 };
static _Thread_local TreeObject *tls_trees[TLS_DEVICES];
static _Thread_local uint64_t tls_epoch; /* TX.tree_epoch when tls_trees was filled */

/* What cgtree.torch's getter says is the calling thread's tree for s's
 * device (borrowed: cgtree.torch keeps a thread's trees while the thread
 * lives, and a tree is freed only after its thread exited). */
static TreeObject *tree_from_getter(SegmentObject *s) {
  PyObject *got = PyObject_CallOneArg(TX.tree_for, s->tree->device_obj);
  if (!got)
    return NULL;
  Py_DECREF(got);
  if (!PyObject_TypeCheck(got, &TreeType)) {
    PyErr_SetString(PyExc_TypeError, "cgtree.torch: the tree getter returned no Tree");
    return NULL;
  }
  return (TreeObject *)got;
}

static TreeObject *current_tree(SegmentObject *s) {
  int dev = s->tree->device;
  if (!TX.tree_for || dev < 0 || dev >= TLS_DEVICES)
    return s->tree;
  if (s->backward) /* autograd's device thread serves every thread's backward: ask each time */
    return tree_from_getter(s);
  if (tls_epoch != TX.tree_epoch) { /* another getter since, or a tree orphaned (tree_close.c): forget */
    memset(tls_trees, 0, sizeof tls_trees);
    tls_epoch = TX.tree_epoch;
  }
  if (!tls_trees[dev]) {
    TreeObject *T = tree_from_getter(s);
    /* Another thread's tree: autograd's device thread runs a forward
     * segment too (a checkpointed block's recompute, a compiled optimizer
     * in a gradient hook), on the tree of the thread that called
     * backward(), which the next backward's caller may not be. Asked each
     * time, as for a backward. */
    if (!T || T->owner_thread != PyThread_get_thread_ident())
      return T;
    tls_trees[dev] = T;
  }
  return tls_trees[dev];
}

/* Frees a run's own memory and references, but for its segment's
 * reference (which a registered run holds for the tree); reads nothing of
 * the segment, which may be gone. */
void seg_run_free(seg_run *r) {
  tx_read_memo_free(&r->memo);
  free(r->args), free(r->ptrs), free(r->offs), free(r->outs), free(r->key), free(r->spans), free(r->seen);
  free(r->read);
  for (uint32_t j = 0; r->grad_seen && j < r->n_grad_seen; j++)
    Py_XDECREF(r->grad_seen[j]);
  free(r->grad_seen);
  free(r->made_at);
  free(r->static_ptr);
  Py_XDECREF(r->static_ptrs);
  Py_XDECREF(r->exc_type), Py_XDECREF(r->exc_value), Py_XDECREF(r->exc_tb);
  Py_XDECREF(r->tree);
  free(r);
}

/* The segment's run in the calling thread's tree, made at its first use. */
seg_run *seg_run_for(SegmentObject *s) {
  TreeObject *T = current_tree(s);
  if (!T)
    return NULL;
  if (T->closed) { /* only a test's tree, passed by hand, can be both closed and current */
    PyErr_SetString(TxError, "cgtree.torch: this tree was freed (its thread exited)");
    return NULL;
  }
  for (size_t i = 0; i < s->n_runs; i++)
    if (s->runs[i]->tree == T)
      return s->runs[i];
  seg_run *r = tx_calloc(1, sizeof *r);
  seg_run **grown = r ? tx_realloc(s->runs, (s->n_runs + 1) * sizeof *grown) : NULL;
  if (grown)
    s->runs = grown; /* one slot more than used: harmless if r fails below */
  if (r) {
    r->args = tx_calloc(s->n_args + 1, sizeof *r->args);
    r->ptrs = tx_calloc(s->n_args + 1, sizeof *r->ptrs);
    r->offs = tx_calloc(s->n_args + 1, sizeof *r->offs);
    r->key = tx_calloc(2 * (size_t)s->n_args + 1, sizeof *r->key);
    r->spans = tx_calloc(s->n_args + 1, sizeof *r->spans);
    r->seen = tx_calloc(s->n_args + 1, sizeof *r->seen);
    r->read = tx_calloc(s->n_args + 1, sizeof *r->read);
  }
  int statics_ok = !r || !s->static_idx || static_cache_make(r, s->n_args) == 0;
  if (!r || !grown || !r->args || !r->ptrs || !r->offs || !r->key || !r->spans || !r->seen || !r->read ||
      !statics_ok || tx_tree_run_add(T, r) < 0) {
    if (r)
      seg_run_free(r); /* nothing but its arrays yet: no tree, no reference */
    PyErr_NoMemory();
    return NULL;
  }
  r->s = s;
  r->tree = (TreeObject *)Py_NewRef((PyObject *)T);
  s->runs[s->n_runs++] = r;
  return r;
}

int tx_tree_run_add(TreeObject *T, seg_run *r) {
  if (T->n_runs == T->cap_runs) {
    size_t cap = T->cap_runs ? 2 * T->cap_runs : 8;
    seg_run **grown = tx_realloc(T->runs, cap * sizeof *grown);
    if (!grown) {
      PyErr_NoMemory();
      return -1;
    }
    T->runs = grown;
    T->cap_runs = cap;
  }
  T->runs[T->n_runs++] = r;
  return 0;
}

/* r leaves T's list (r is freed without T closing: a segment that dies). */
void seg_tree_run_forget(TreeObject *T, seg_run *r) {
  for (size_t i = 0; i < T->n_runs; i++)
    if (T->runs[i] == r) {
      T->runs[i] = T->runs[--T->n_runs];
      return;
    }
}

/* T closes (tree_close.c): its C tree, which calls back into these runs,
 * is about to go. First, running no Python: each run leaves its segment
 * (so no segment, should it die, frees it), and T's list; the runs come
 * back to the caller. */
struct seg_run **tx_tree_runs_detach(TreeObject *T, size_t *n) {
  seg_run **runs = T->runs;
  *n = T->n_runs;
  T->runs = NULL;
  T->n_runs = T->cap_runs = 0;
  for (size_t i = 0; i < *n; i++) {
    SegmentObject *s = runs[i]->s;
    for (size_t j = 0; j < s->n_runs; j++)
      if (s->runs[j] == runs[i]) {
        s->runs[j] = s->runs[--s->n_runs];
        break;
      }
  }
  return runs;
}

/* Then, the C tree gone, each run is freed, and a registered run gives
 * back the reference the tree held to its segment (which kept the segment
 * alive until here). Python may run. */
void tx_tree_runs_free(struct seg_run **runs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    seg_run *r = runs[i];
    SegmentObject *s = r->registered ? r->s : NULL;
    seg_run_free(r);
    Py_XDECREF(s);
  }
  free(runs);
}


uint64_t seg_variant_mask = ~0ull; /* tests: fewer bits, so that keys collide (_set_variant_mask) */


int seg_key_is(const variant_tmpl *t, const seg_run *r) {
  return t->n_key == r->n_key && memcmp(t->key, r->key, r->n_key * sizeof *r->key) == 0;
}

PyObject *tx_set_variant_mask(PyObject *self, PyObject *arg) {
  (void)self;
  unsigned long long m = PyLong_AsUnsignedLongLong(arg);
  if (m == (unsigned long long)-1 && PyErr_Occurred())
    return NULL;
  seg_variant_mask = m;
  Py_RETURN_NONE;
}
