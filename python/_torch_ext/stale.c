/* stale.c — outputs whose memory the next step may reuse raise on access.
 *
 * An output tensor of a replay lives in the tree's pool, and its memory is
 * the step's: when the next step begins (the next call of the compiled
 * model, or cgtree.torch.step_begin()), the tree may hand that memory to
 * the new step's outputs. A program that kept `y1 = f(x1)` and reads it
 * after `y2 = f(x2)` would read y2's data. That must never pass silently.
 *
 * PyTorch offers the door its own CUDAGraph Trees use for this:
 * torch._C._set_storage_data_ptr_access_error_msg(storage, msg) marks a
 * StorageImpl so that every access of its data, through any tensor that
 * shares it, raises a RuntimeError with our message. Marking the storage,
 * not the tensor object, is what catches the cases a per-tensor mark
 * misses: views made later (`y[1:]`, `y.view(-1)`), outputs that are views
 * of an intermediate (AOTAutograd regenerates them from the base we return,
 * so they share its storage), outputs kept in lists and dicts.
 *
 * So each output we make is remembered with the key PyTorch's function
 * takes (`tensor.untyped_storage()._cdata`, an exported attribute; we never
 * read PyTorch's memory ourselves), on a list of the step's outputs. When
 * the storage dies first, its DLPack deleter has queued the output and the
 * drain takes it off the list (tx_stale_forget), so nothing is marked that
 * does not exist. When the step ends, every output still on the list is
 * marked, and the list is emptied. The cost is one attribute read per
 * output made and one call per output still alive at the step's end; an
 * output dropped before then costs nothing more. The `y = f(x)` loop pays
 * one mark per call for the y it is about to drop, and never raises: the
 * old y is never read. An output with no elements (an empty KV cache) is
 * never watched: its byte of pool holds nothing a later step could
 * overwrite, and marked, it raised where Inductor computes (seg_outputs.c,
 * make_output). An empty view of another output shares that output's
 * storage, and so its mark.
 *
 * The mark leaves the storage (and our DLPack context) alive until PyTorch
 * frees it; the value went stale with its step already, so the drain then
 * only frees the context. Passing a marked tensor to a compiled graph fails
 * where its pointer is read; tx_stale_translate turns that error into
 * StaleTensorError.
 *
 * Gradients are the one kind of output a program keeps across steps on
 * purpose. A backward's outputs are handed out like any other, and where a
 * parameter's .grad is None autograd's AccumulateGrad takes the output
 * over as .grad (its detached alias: the same storage), as eager does: no
 * copy, no second set of gradients, and the optimizer reads the pool. Most
 * loops drop .grad before the next forward (zero_grad() sets it to None),
 * and then nothing more happens. A .grad that lives on when its step ends
 * (gradient accumulation, zero_grad(set_to_none=False), a zero_grad after
 * the next forward) must not be marked, nor overwritten: it is moved. We
 * cannot find the tensors that share a storage, but we can find .grad
 * tensors: segment.c notes the leaves that require grad among the inputs of
 * training forwards (tx_grad_leaf_note), by weak reference, and at the
 * step's end each such leaf whose .grad shares the storage of a live
 * backward output gets `grad.set_(grad.clone())`: the same tensor object
 * (every reference the program holds to it follows), its data copied into
 * memory of its own, ordered before the tree's next work. Any other tensor
 * still on the old storage (a view of .grad the program kept) is then
 * marked like every other output, so it raises: never silently wrong;
 * where the call that ends the step reads such a view, .grad and the view
 * move together onto one copy (tx_stale_mark_step). Once
 * moved, .grad is ordinary memory and AccumulateGrad adds into it in place
 * from then on, so a program that keeps .grad pays one copy per parameter
 * once, where holding the outputs back made AccumulateGrad copy every
 * gradient at every step.
 *
 * The other output a program hands on across a step on purpose is an
 * argument of the very call that ends the step: `x = f(x)` (a recurrent
 * state, a denoising loop), or `b(a(x))` where nothing holds a's step open
 * (under no_grad, a frozen trunk). When that call begins its step, nothing
 * of the new step has run, so the output's memory still holds its data:
 * segment.c moves each such argument (tx_move_call_args) as .grad is
 * moved, the same tensor object set_ to a copy of what it reads, with its
 * layout and autograd version, before the marks. It is then ordinary
 * memory, read as a DYNAMIC input, and every other tensor on the old
 * storage is marked. Only the
 * call's first graph can: a later graph of the same call (after a graph
 * break) comes after the new step's work, and an output of the ended step
 * passed there still raises. An argument that requires grad is never
 * moved (set_ would cut it from autograd's graph): such an argument holds
 * the step instead (module.c, "Steps in training").
 */
#include "ext.h"

#include <pthread.h>

/* The word the marks carry, by which tx_stale_translate knows them. */
static const char STALE_WORD[] = "cgtree.torch.StaleTensorError";

/* t's storage's key, as TX.storage_mark takes it (a new reference), or
 * NULL with an exception set. */
static PyObject *storage_key(PyObject *t) {
  PyObject *sto = PyObject_CallMethodNoArgs(t, TX.str_untyped_storage);
  if (!sto)
    return NULL;
  PyObject *key = PyObject_GetAttr(sto, TX.str_cdata);
  Py_DECREF(sto);
  return key;
}

int tx_stale_same_storage(const tx_out_ref *r, PyObject *t) {
  if (!r->storage)
    return 1; /* unwatched (marking off): nothing tells them apart */
  PyObject *key = storage_key(t);
  int same = key ? PyObject_RichCompareBool(key, r->storage, Py_EQ) : -1;
  Py_XDECREF(key);
  return same;
}

int tx_stale_watch(TreeObject *T, tx_out_ref *r, PyObject *t) {
  if (!TX.storage_mark)
    return 0; /* marking is off (the simulator's tests without a stand-in) */
  r->storage = storage_key(t);
  if (!r->storage)
    return -1;
  if (tx_step_outputs_link(T, r) < 0) {
    Py_CLEAR(r->storage);
    return -1;
  }
  return 0;
}

void tx_stale_forget(TreeObject *T, tx_out_ref *r) {
  tx_step_outputs_unlink(T, r);
  Py_CLEAR(r->storage);
}

/* Moves on when a tree notes a new leaf or a .grad moves: every tree's
 * cache of where .grad lie (T->kept_grads) is then read again. Under the
 * GIL. */
static uint64_t kept_grads_generation = 1;

/* Reads o.requires_grad and o.is_leaf into *requires and *leaf: 0, or -1
 * with MemoryError set. Anything autograd does not see as a tensor is
 * neither (its error cleared). */
static int grad_flags(PyObject *o, int *requires, int *leaf) {
  PyObject *names[2] = {TX.str_requires_grad, TX.str_is_leaf};
  int *flags[2] = {requires, leaf};
  *requires = *leaf = 0;
  for (int i = 0; i < 2; i++) {
    PyObject *v = PyObject_GetAttr(o, names[i]);
    int yes = v ? PyObject_IsTrue(v) : 0;
    Py_XDECREF(v);
    if (yes < 0 || PyErr_Occurred()) {
      if (PyErr_ExceptionMatches(PyExc_MemoryError))
        return -1;
      PyErr_Clear();
      *requires = *leaf = 0;
      return 0;
    }
    *flags[i] = yes;
    if (!yes)
      return 0; /* no grad: is_leaf does not matter */
  }
  return 0;
}

/* Remembers leaf o (requires grad) by wr on T's dict. */
static int note_leaf(TreeObject *T, PyObject *o, PyObject *wr) {
  if (!T->grad_leaves && !(T->grad_leaves = PyDict_New()))
    return -1;
  PyObject *key = PyLong_FromVoidPtr(o);
  Py_ssize_t had = PyDict_GET_SIZE(T->grad_leaves);
  int rc = key ? PyDict_SetItem(T->grad_leaves, key, wr) : -1;
  Py_XDECREF(key);
  if (rc < 0)
    return -1;
  kept_grads_generation += (uint64_t)(PyDict_GET_SIZE(T->grad_leaves) != had); /* a leaf no cache has read */
  if (PyDict_GET_SIZE(T->grad_leaves) <= 2 * T->grad_leaves_pruned + 64)
    return 0;
  /* Leaves die (a model deleted, a batch that required grad): drop the
   * dead ones once the dict has doubled since the last time. */
  PyObject *k, *w;
  Py_ssize_t pos = 0;
  PyObject *dead = PyList_New(0);
  if (!dead)
    return -1;
  while (PyDict_Next(T->grad_leaves, &pos, &k, &w)) {
    PyObject *leaf = tx_weakref_get(w);
    Py_XDECREF(leaf);
    if (!leaf && PyList_Append(dead, k) < 0) {
      Py_DECREF(dead);
      return -1;
    }
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dead); i++)
    (void)PyDict_DelItem(T->grad_leaves, PyList_GET_ITEM(dead, i));
  Py_DECREF(dead);
  T->grad_leaves_pruned = PyDict_GET_SIZE(T->grad_leaves);
  return 0;
}

/* The nodes that pass a gradient on, which a walk from one input visits at
 * most; the AccumulateGrad nodes they lead to are not counted. */
enum { LEAF_WALK_NODES = 64 };

/* What TX.grad_node_kind says of node's type, asked once per type (the
 * answers are kept in TX.grad_node_kinds): a GRAD_NODE_* in *kind; 0, or
 * -1 with MemoryError set. A function that fails or answers anything else
 * stops the walk there. */
static int grad_node_kind(PyObject *node, int *kind) {
  *kind = GRAD_NODE_STOP;
  if (node == Py_None || !TX.grad_node_kind)
    return 0;
  if (!TX.grad_node_kinds && !(TX.grad_node_kinds = PyDict_New()))
    return -1;
  PyObject *type = (PyObject *)Py_TYPE(node);
  PyObject *known = PyDict_GetItemWithError(TX.grad_node_kinds, type); /* borrowed */
  if (!known) {
    if (PyErr_Occurred())
      return -1;
    /* Held across the call: a function that calls set_grad_node_kind drops TX's (a review). */
    PyObject *kinds = Py_NewRef(TX.grad_node_kinds), *fn = Py_NewRef(TX.grad_node_kind);
    PyObject *answer = PyObject_CallOneArg(fn, type);
    Py_DECREF(fn);
    long k = answer && PyLong_Check(answer) ? PyLong_AsLong(answer) : GRAD_NODE_STOP;
    Py_XDECREF(answer);
    if (PyErr_Occurred()) {
      if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
        Py_DECREF(kinds);
        return -1;
      }
      PyErr_Clear();
      k = GRAD_NODE_STOP;
    }
    if (k != GRAD_NODE_ACCUMULATE && k != GRAD_NODE_PASSES_ON)
      k = GRAD_NODE_STOP;
    PyObject *v = PyLong_FromLong(k);
    int rc = v ? PyDict_SetItem(kinds, type, v) : -1;
    Py_XDECREF(v);
    Py_DECREF(kinds);
    if (rc < 0)
      return -1;
    *kind = (int)k;
    return 0;
  }
  *kind = (int)PyLong_AsLong(known);
  return 0;
}

/* AccumulateGrad node's variable, noted on T if it is a leaf that
 * requires grad: 0, or -1 with MemoryError set. */
static int note_accumulated(TreeObject *T, PyObject *node) {
  PyObject *var = PyObject_GetAttr(node, TX.str_variable);
  if (!var) {
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
      return -1;
    PyErr_Clear(); /* not autograd's AccumulateGrad after all: nothing to note */
    return 0;
  }
  int requires, leaf, rc = grad_flags(var, &requires, &leaf);
  if (rc == 0 && requires && leaf) {
    PyObject *wr = PyWeakref_NewRef(var, NULL);
    if (wr)
      rc = note_leaf(T, var, wr);
    else if (PyErr_ExceptionMatches(PyExc_MemoryError))
      rc = -1;
    else
      PyErr_Clear(); /* no weak references to it: no tensor */
    Py_XDECREF(wr);
  }
  Py_DECREF(var);
  return rc;
}

/* A non-leaf input o that requires grad: the leaves an eager op before the
 * compiled function passes its gradient on to. `p.view(-1)`, `p.t()`,
 * `p + c`, a fused weight `torch.cat([p1, p2])` made eagerly reach the
 * compiled function as new tensors, and p's gradient is the backward's
 * output or a view of it, which AccumulateGrad takes over as p.grad: p is
 * a leaf this tree must look after, though it is no argument. Only the
 * leaves among the arguments were noted, so such a .grad kept past its
 * step was marked, not moved, and the next accumulation raised where
 * Inductor computes (a limit the docs stated, found again by a review).
 *
 * The walk follows o.grad_fn.next_functions, the autograd graph's public
 * attributes, through nodes that hand their gradient on as it is or as a
 * view (ViewBackward0, TBackward0, CatBackward0, AddBackward0, ...: the
 * torch door's grad_node_kind says which, by type, once per type) to
 * AccumulateGrad nodes, whose `.variable` is the leaf. It stops at any
 * other node: a matmul's or a norm's backward makes new memory, so the
 * leaves behind it never hold the pool, and an activation an eager layer
 * made costs one attribute read and one dict lookup per call; AOTAutograd's
 * CompiledFunctionBackward (every activation a graph break hands on has
 * one) is a Python autograd Function, whose own call noted its leaves.
 * At most LEAF_WALK_NODES such nodes: a parameter further away stays
 * unnoted, and its kept .grad is marked, loud, as before. The leaves one
 * node leads to are not counted (a review: a cat of 16 parameters lost
 * the 16th). */
static int note_leaves_behind(TreeObject *T, PyObject *o) {
  PyObject *todo[LEAF_WALK_NODES];
  int n = 0, visited = 0, kind, failed = 0;
  PyObject *fn = PyObject_GetAttr(o, TX.str_grad_fn);
  if (!fn) {
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
      return -1;
    PyErr_Clear(); /* no autograd graph to follow */
    return 0;
  }
  if (grad_node_kind(fn, &kind) < 0)
    failed = 1;
  else if (kind == GRAD_NODE_PASSES_ON)
    todo[n++] = Py_NewRef(fn);
  Py_DECREF(fn);
  while (n && !failed) {
    PyObject *node = todo[--n];
    visited++;
    PyObject *next = PyObject_GetAttr(node, TX.str_next_functions);
    if (!next) {
      failed = PyErr_ExceptionMatches(PyExc_MemoryError);
      if (!failed)
        PyErr_Clear(); /* no edges to follow */
    }
    Py_ssize_t k = next && PyTuple_Check(next) ? PyTuple_GET_SIZE(next) : 0;
    for (Py_ssize_t i = 0; i < k && !failed; i++) {
      PyObject *edge = PyTuple_GET_ITEM(next, i); /* (node, input_nr) */
      PyObject *to = PyTuple_Check(edge) && PyTuple_GET_SIZE(edge) > 0 ? PyTuple_GET_ITEM(edge, 0) : Py_None;
      if (grad_node_kind(to, &kind) < 0)
        failed = 1;
      else if (kind == GRAD_NODE_ACCUMULATE)
        failed = note_accumulated(T, to) < 0;
      else if (kind == GRAD_NODE_PASSES_ON && visited + n < LEAF_WALK_NODES)
        todo[n++] = Py_NewRef(to);
    }
    Py_XDECREF(next);
    Py_DECREF(node);
  }
  while (n)
    Py_DECREF(todo[--n]);
  return failed ? -1 : 0;
}

int tx_grad_leaf_note(TreeObject *T, PyObject *o, PyObject *wr) {
  int requires, leaf;
  if (grad_flags(o, &requires, &leaf) < 0)
    return -1; /* out of memory: raised, and the leaf asked about again at the next call */
  if (!requires)
    return 0;
  return leaf ? note_leaf(T, o, wr) : note_leaves_behind(T, o);
}

/* Whether leaf.grad shares a storage in `kept` (keys of storages): 1 and
 * *grad, *key (new references) if it does; 0 if not (none, or another
 * storage); -1 with an exception set. */
static int grad_in(PyObject *leaf, PyObject *kept, PyObject **grad, PyObject **key) {
  PyObject *g = PyObject_GetAttr(leaf, TX.str_grad);
  if (!g)
    return -1;
  PyObject *k = g != Py_None ? storage_key(g) : NULL;
  int in = g == Py_None ? 0 : k ? PyDict_Contains(kept, k) : -1;
  if (in == 1) {
    *grad = g;
    *key = k;
    return 1;
  }
  Py_DECREF(g);
  Py_XDECREF(k);
  return in;
}

/* leaf.grad, if it shares a storage in `kept`, moves to memory of its own:
 * 1 if it moved, 0 if not, -1 with an exception set. Where `batch` is a
 * list, it is appended there instead (0), to move with the call's
 * arguments (tx_move_call_args). */
static int move_grad(PyObject *leaf, PyObject *kept, PyObject *batch) {
  PyObject *g, *key;
  int moved = grad_in(leaf, kept, &g, &key);
  if (moved == 1 && batch) {
    int listed = 0; /* a leaf several trees noted comes once for each: the .grad goes on the list once */
    for (Py_ssize_t i = 0; !listed && i < PyList_GET_SIZE(batch); i++)
      listed = PyList_GET_ITEM(batch, i) == g;
    moved = !listed && PyList_Append(batch, g) < 0 ? -1 : 0;
    Py_DECREF(g);
    Py_DECREF(key);
  } else if (moved == 1) {
    PyObject *copy = PyObject_CallMethodNoArgs(g, TX.str_clone);
    PyObject *res = copy ? PyObject_CallMethodOneArg(g, TX.str_set, copy) : NULL;
    Py_XDECREF(copy);
    Py_XDECREF(res);
    if (!res)
      moved = -1;
    Py_DECREF(g);
    Py_DECREF(key);
  }
  return moved;
}

/* Moves every .grad that shares the storage of a live backward output of
 * the ending step (see the top of this file), and orders the tree's stream
 * after the copies; or, where `batch` is a list, appends them there, to
 * move with the call's arguments. -1 with an exception set. */
static int move_kept_grads(TreeObject *T, PyObject *batch) {
  PyObject *kept = NULL;
  for (tx_out_ref *r = T->step_outputs; r; r = r->step_next) {
    if (!tx_out_ref_live_grad(r))
      continue;
    if (!kept && !(kept = PyDict_New()))
      return -1;
    if (PyDict_SetItem(kept, r->storage, Py_True) < 0) {
      Py_DECREF(kept);
      return -1;
    }
  }
  if (!kept)
    return 0; /* the usual loop: zero_grad() dropped every .grad already */
  /* Every tree's leaves, not this one's alone: a backward runs on the tree
   * of the thread that called it, and its forwards may have run on
   * another's (a worker thread that also called a compiled loss called
   * backward on the main thread's forward: its tree noted no leaf, and
   * the main tree's parameters' .grad, kept by accumulation, was marked,
   * not moved, so the next accumulation raised StaleTensorError where
   * Inductor computes: a helper's review). A snapshot: moving runs
   * PyTorch's code. */
  PyObject *leaves = tx_trees_grad_leaves();
  int rc = leaves ? 0 : -1;
  uint64_t moved = 0;
  for (Py_ssize_t i = 0; leaves && i < PyList_GET_SIZE(leaves) && rc == 0; i++) {
    PyObject *leaf = tx_weakref_get(PyList_GET_ITEM(leaves, i));
    if (!leaf)
      continue;
    int m = move_grad(leaf, kept, batch);
    Py_DECREF(leaf);
    if (m < 0)
      rc = -1;
    moved += (uint64_t)(m == 1);
  }
  Py_XDECREF(leaves);
  Py_DECREF(kept);
  tx_kept_grads_moved(T, moved);
  if (moved && tx_tree_waits_for_caller(T) < 0) /* also after an error: what moved is ordered */
    rc = -1;
  return rc;
}

void tx_kept_grads_moved(TreeObject *T, uint64_t n) {
  T->grads_moved += n;
  kept_grads_generation += (uint64_t)(n != 0);
}

void tx_kept_grads_free(TreeObject *T) {
  for (size_t i = 0; i < T->n_kept_grads; i++)
    Py_DECREF(T->kept_grads[i].leaf);
  free(T->kept_grads);
  T->kept_grads = NULL;
  T->n_kept_grads = 0;
  T->kept_grads_backwards = 0; /* read again at the next question */
}

/* Where leaf.grad lies, [*begin, *end): 1; 0 if it has none, or one that
 * cannot be read (marked: no gradient of the step's); -1 with an
 * exception set. The end is where its nbytes end: a slice of .grad (a fused
 * QKV gradient split eagerly) lies in it too. */
static int grad_range(PyObject *leaf, uintptr_t *begin, uintptr_t *end) {
  PyObject *g = PyObject_GetAttr(leaf, TX.str_grad);
  if (!g)
    return -1;
  void *ptr = NULL;
  PyObject *nb = NULL;
  if (g != Py_None && !tx_exchange_data_ptr(g, &ptr, NULL) && tx_data_ptr_slow(g, &ptr) < 0)
    ptr = NULL;
  if (ptr && !(nb = PyObject_GetAttr(g, TX.str_nbytes)))
    ptr = NULL;
  Py_ssize_t nbytes = nb ? PyLong_AsSsize_t(nb) : 0;
  Py_XDECREF(nb);
  Py_DECREF(g);
  if (PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
      return -1;
    PyErr_Clear(); /* a .grad that cannot be read (marked): no gradient of the step's */
    return 0;
  }
  if (!ptr || nbytes <= 0)
    return 0;
  *begin = (uintptr_t)ptr;
  *end = (uintptr_t)ptr + (uintptr_t)nbytes;
  return 1;
}

static int kept_grad_order(const void *a, const void *b) {
  uintptr_t x = ((const tx_kept_grad *)a)->begin, y = ((const tx_kept_grad *)b)->begin;
  return (x > y) - (x < y);
}

/* T->kept_grads brought up to the step, the backwards called and the
 * leaves and moves of all trees: read once per backward, not at every
 * call that asks. A per-parameter update after the backward asks at each
 * of its N calls, and a read of N leaves' .grad each time cost N squared
 * per step (a review). Every live tree's leaves, not T's alone: a worker
 * thread whose compiled loss takes no parameter noted none, and its
 * compiled optimizer on the .grad the main thread's leaves keep began a
 * step (a review). `again`: read though nothing moved on (a hit that its
 * leaf did not confirm). 0; -1 with an exception set. */
static int kept_grads_read(TreeObject *T, int again) {
  if (!again && T->kept_grads_step == T->step && T->kept_grads_backwards == T->backward_calls + 1 &&
      T->kept_grads_generation == kept_grads_generation)
    return 0;
  PyObject *leaves = tx_trees_grad_leaves(); /* a snapshot: reading .grad may run Python */
  if (!leaves)
    return -1;
  Py_ssize_t n_leaves = PyList_GET_SIZE(leaves);
  tx_kept_grad *at = tx_malloc((size_t)(n_leaves ? n_leaves : 1) * sizeof *at);
  size_t m = 0;
  int rc = at ? 0 : -1;
  if (!at)
    PyErr_NoMemory();
  for (Py_ssize_t i = 0; rc == 0 && i < n_leaves; i++) {
    PyObject *wr = PyList_GET_ITEM(leaves, i);
    PyObject *leaf = tx_weakref_get(wr);
    if (!leaf)
      continue;
    int has = grad_range(leaf, &at[m].begin, &at[m].end);
    Py_DECREF(leaf);
    if (has < 0)
      rc = -1;
    else if (has)
      at[m++].leaf = Py_NewRef(wr);
  }
  Py_DECREF(leaves);
  if (rc < 0) {
    while (m)
      Py_DECREF(at[--m].leaf);
    free(at);
    return -1;
  }
  qsort(at, m, sizeof *at, kept_grad_order);
  for (size_t i = 0; i < m; i++)
    at[i].reach = i && at[i - 1].reach > at[i].end ? at[i - 1].reach : at[i].end;
  tx_kept_grads_free(T);
  T->kept_grads = at;
  T->n_kept_grads = m;
  T->kept_grads_step = T->step;
  T->kept_grads_backwards = T->backward_calls + 1;
  T->kept_grads_generation = kept_grads_generation;
  return 0;
}

/* The cached .grad whose range holds ptr (the last to begin at or below
 * it that does), or NULL. Ranges may nest: past the end of the last one
 * to begin below ptr (a slice that another leaf has as its .grad), an
 * earlier, larger one may still hold it, and taking the slice's for the
 * answer missed a read of the larger .grad's tail (a review); the reach
 * says when no earlier one can. */
static const tx_kept_grad *kept_grad_at(const TreeObject *T, uintptr_t ptr) {
  size_t lo = 0, hi = T->n_kept_grads; /* the first to begin above ptr is in [lo, hi] */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (T->kept_grads[mid].begin <= ptr)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t i = lo; i-- > 0 && ptr < T->kept_grads[i].reach;)
    if (ptr < T->kept_grads[i].end)
      return &T->kept_grads[i];
  return NULL;
}

/* 1 if ptr still lies in the .grad of e's leaf, 0 if not (that .grad was
 * dropped, or replaced, and other memory, an evaluation batch, lies there
 * now), -1 with an exception set. */
static int kept_grad_confirmed(const tx_kept_grad *e, uintptr_t ptr) {
  PyObject *leaf = tx_weakref_get(e->leaf);
  if (!leaf)
    return 0;
  uintptr_t begin, end;
  int has = grad_range(leaf, &begin, &end);
  Py_DECREF(leaf);
  return has <= 0 ? has : begin <= ptr && ptr < end;
}

int tx_kept_grad_among(TreeObject *T, void *const *ptrs, size_t n) {
  if (!n || !tx_trees_have_grad_leaves())
    return 0;
  /* A hit is confirmed by its leaf: the cache is kept across the calls of
   * a backward's step, and a .grad that zero_grad(set_to_none=True) freed
   * since left its address to other memory. A tensor there (an evaluation
   * batch) was taken for a gradient read and held the step, a recording
   * per call, up to the bound (a review). An unconfirmed hit reads the
   * cache again, once. */
  for (int again = 0; again < 2; again++) {
    if (kept_grads_read(T, again) < 0)
      return -1;
    int unconfirmed = 0;
    for (size_t i = 0; i < n; i++) {
      const tx_kept_grad *e = ptrs[i] ? kept_grad_at(T, (uintptr_t)ptrs[i]) : NULL;
      int yes = e ? kept_grad_confirmed(e, (uintptr_t)ptrs[i]) : 0;
      if (yes)
        return yes; /* 1, or -1 */
      unconfirmed |= e != NULL;
    }
    if (!unconfirmed)
      return 0;
  }
  return 0;
}

int tx_step_outputs_all_leaf_grads(TreeObject *T) {
  PyObject *kept = PyDict_New();
  if (!kept)
    return -1;
  int rc = 1;
  for (tx_out_ref *r = T->step_outputs; r && rc == 1; r = r->step_next) {
    if (tx_out_ref_dead(r))
      continue;
    if (!r->grad || !r->storage) /* not a gradient, or none that could move */
      rc = 0;
    else if (PyDict_SetItem(kept, r->storage, Py_True) < 0)
      rc = -1;
  }
  PyObject *leaves = rc == 1 && PyDict_GET_SIZE(kept) ? tx_trees_grad_leaves() : NULL;
  if (rc == 1 && PyDict_GET_SIZE(kept) && !leaves)
    rc = -1;
  for (Py_ssize_t i = 0; leaves && i < PyList_GET_SIZE(leaves) && rc == 1 && PyDict_GET_SIZE(kept); i++) {
    PyObject *leaf = tx_weakref_get(PyList_GET_ITEM(leaves, i));
    if (!leaf)
      continue; /* it died: no .grad of its */
    PyObject *g, *key;
    int in = grad_in(leaf, kept, &g, &key);
    Py_DECREF(leaf);
    if (in == 1) { /* a kept gradient that is this leaf's .grad: the step's end would move it */
      if (PyDict_DelItem(kept, key) < 0)
        in = -1;
      Py_DECREF(g);
      Py_DECREF(key);
    }
    if (in < 0)
      rc = -1;
  }
  if (rc == 1)
    rc = PyDict_GET_SIZE(kept) == 0;
  Py_XDECREF(leaves);
  Py_DECREF(kept);
  return rc;
}

int tx_tree_waits_for_caller(TreeObject *T) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  void *caller;
  int rc = tx_caller_stream(T, &caller);
  if (rc == 0 && tx_caller_needs_events(T, caller))
    tx_stream_wait(T->stream, caller, T->ev_in);
  if (type) { /* the error raised before stays the one raised */
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
  }
  return rc;
}

int tx_stale_mark_step(TreeObject *T) {
  if (!T->step_outputs)
    return 0;
  /* The kept .grad tensors and the call's arguments move in one go where
   * they can (a mover, a call), so that those over one storage land on one
   * copy: a view of .grad passed to the call moved onto a copy apart from
   * .grad's, and a write in place to .grad (zero_(), the next accumulation)
   * was lost to it, silently (a helper's review). */
  PyObject *batch = T->syncing_call && TX.output_mover ? PyList_New(0) : NULL;
  if (T->syncing_call && TX.output_mover && !batch)
    return -1;
  /* The moves set_ outputs elsewhere and let their old storages die: a
   * look-up of another thread that crosses them reads its pointer again
   * once they are over (reads_in_flight.c; two reviews). An end of their
   * own, bracketed apart from the take and marks: the second wait below
   * waits for such look-ups, which wait for this bracket only. */
  tx_reads_outputs_change_begin();
  int moved = move_kept_grads(T, batch) < 0 || tx_move_call_args(T, batch) < 0 ? -1 : 0;
  tx_reads_outputs_change_end();
  Py_XDECREF(batch);
  if (moved < 0)
    return -1;
  char msg[512];
  snprintf(msg, sizeof msg,
           "%s: this tensor is an output of a graph compiled with backend='cgtree' in step %llu, and a later "
           "call of the compiled model (or cgtree.torch.step_begin()) has let cgtree reuse its memory, so its "
           "data is gone. To keep an output across calls, clone it (y.clone()) before the next call.",
           STALE_WORD, (unsigned long long)T->step);
  PyObject *text = PyUnicode_FromString(msg);
  if (!text)
    return -1;
  /* Again: the moves ran Python, where another thread's call may have
   * begun reading an output, or crossed them and now reads its pointer
   * again (reads_in_flight.c). From this look on to the last mark no
   * Python runs (PyTorch's mark is C). */
  if (tx_reads_wait_for_calls(T) < 0) {
    Py_DECREF(text);
    return -1;
  }
  int rc = 0;
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  /* a look-up under way that misses an output taken here reads its pointer again */
  tx_reads_outputs_change_begin();
  tx_out_ref *r = tx_step_outputs_take(T);
  while (r) {
    tx_out_ref *next = r->step_next;
    r->step_prev = r->step_next = NULL;
    /* Its deleter may have run on a thread without the GIL since the last
     * drain: then its storage is gone and must not be named. */
    if (!tx_out_ref_dead(r)) {
      PyObject *args[2] = {r->storage, text};
      PyObject *res = PyObject_Vectorcall(TX.storage_mark, args, 2, NULL);
      if (res) {
        T->marked_stale++;
        Py_DECREF(res);
      } else {
        /* It stays on the step list, to be marked when the step does end:
         * its memory must not be reused while it lives unmarked. Its pages'
         * buckets and their room are kept (step_outputs.c), so linking it
         * again allocates nothing. The others are still marked; the first
         * error is the one raised. */
        if (rc == 0)
          PyErr_Fetch(&type, &value, &tb);
        else
          PyErr_Clear();
        rc = -1;
        (void)tx_step_outputs_put_back(T, r); /* it allocates nothing: it cannot fail */
      }
    }
    r = next;
  }
  tx_reads_outputs_change_end();
  Py_DECREF(text);
  if (rc < 0)
    PyErr_Restore(type, value, tb);
  return rc;
}

void tx_stale_translate(const char *name, size_t i) {
  if (!PyErr_ExceptionMatches(PyExc_RuntimeError))
    return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *text = value ? PyObject_Str(value) : NULL;
  const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
  if (s && strstr(s, STALE_WORD)) {
    PyErr_Format(TxStaleError, "cgtree.torch: argument %zu of graph '%s' is an output of an earlier step. %s", i,
                 name, s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  } else {
    PyErr_Clear(); /* PyObject_Str's own failure, if any */
    PyErr_Restore(type, value, tb);
  }
  Py_XDECREF(text);
}
