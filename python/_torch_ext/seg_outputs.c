/* seg_outputs.c — the tensors a call hands out, and the templates they are
 * made from.
 *
 * Outputs. Each output is a DLPack tensor whose deleter queues the value
 * for release, made a torch tensor by the exchange API (or, without it, as a
 * capsule torch.from_dlpack consumes), so the value's memory goes back
 * to the tree when the tensor's storage dies (the queue is drained, under
 * the GIL, at the next run or step), or at the end of the step, when
 * stale.c marks the storages still alive. Shapes, strides and dtypes are the
 * same for every run of a (segment, variant), so they are learnt once, from
 * the first run, and kept as a template. So are ties between outputs: where
 * the plain graph returns one tensor at two positions, or views of one
 * buffer, the template says so, and each run hands them out tied the same
 * way, sharing one storage and autograd's version counter (tied_output).
 *
 * An output that lies in the caller's memory (a view of an input) is made
 * as the plain graph makes it, a view of the caller's tensor; one tied to
 * an earlier result shares its storage (tied_output). A tensor handed out
 * goes back to the tree when its storage dies: its deleter queues the
 * record, drained under the GIL (tx_out_ref_queue_drain).
 */
#include "segment.h"

/* ------------------------------------------------ released outputs */

static pthread_mutex_t dead_mu = PTHREAD_MUTEX_INITIALIZER;
static tx_out_ref *dead_head;

/* Called by PyTorch when an output's storage dies, on any thread, with or
 * without the GIL: only queue it (once). */
static void out_queue(tx_out_ref *r) {
  pthread_mutex_lock(&dead_mu);
  if (!r->queued) {
    r->queued = 1;
    r->next_dead = dead_head;
    dead_head = r;
  }
  pthread_mutex_unlock(&dead_mu);
}

static void out_deleter(DLManagedTensor *m) {
  out_queue(m->manager_ctx);
}

static void out_deleter_versioned(DLManagedTensorVersioned *m) {
  out_queue(m->manager_ctx);
}

int tx_out_ref_dead(tx_out_ref *r) {
  pthread_mutex_lock(&dead_mu);
  int dead = r->queued;
  pthread_mutex_unlock(&dead_mu);
  return dead;
}

/* Frees r and what it holds of its own (the storage kept, the holds per
 * pair); its value and its tree's counts are the caller's. */
static void out_ref_free(tx_out_ref *r) {
  Py_XDECREF(r->keep);
  free(r->views_by);
  free(r);
}

/* Releases the values of the outputs that died, under the GIL. One of a
 * tree that is inside a cgt_run on its own thread (which may have let the
 * GIL go in its launch or prelaunch function) waits in the queue: the tree
 * refuses releases inside a launch, and its thread is using it. */
void tx_out_ref_queue_drain(void) {
  pthread_mutex_lock(&dead_mu);
  tx_out_ref *r = dead_head, *later = NULL;
  dead_head = NULL;
  pthread_mutex_unlock(&dead_mu);
  while (r) {
    tx_out_ref *next = r->next_dead;
    TreeObject *T = r->tree;
    if (!T) { /* detached when its tensor could not be made (make_output): nothing of a tree to undo */
      out_ref_free(r);
      r = next;
      continue;
    }
    if (T->in_run) {
      r->next_dead = later;
      later = r;
      r = next;
      continue;
    }
    if (r->in_registry)
      HASH_DEL(T->registry, r);
    if (r->step == T->step) { /* values of ended steps are stale already */
      (void)cgt_value_release(T->tree, r->value);
      T->alive_this_step -= (uint64_t)(r->counted && !r->caller_memory && !r->empty);
      T->saved_alive -= (uint64_t)(r->counted && r->saved);
      T->tied_saved_alive -= (uint64_t)(r->tied_saved != 0) + r->saved_views;
      T->forward_memory_watched -= (uint64_t)(r->watched_until == T->backward_calls + 1);
      T->inference_memory_watched -= (uint64_t)(r->inference_watch == T->inference_watches_ended + 1);
    }
    tx_stale_forget(T, r);
    T->out_refs--;
    out_ref_free(r);
    r = next;
  }
  if (later) { /* back in the queue, still marked queued: the next drain after that run takes them */
    pthread_mutex_lock(&dead_mu);
    tx_out_ref *last = later;
    while (last->next_dead)
      last = last->next_dead;
    last->next_dead = dead_head;
    dead_head = later;
    pthread_mutex_unlock(&dead_mu);
  }
}

static void capsule_destructor(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) { /* never consumed */
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter)
      m->deleter(m);
  }
}

/* 1 if [ptr, ptr + bytes) lies inside a STATIC argument of the run: caller
 * memory (the tree refuses STATIC memory that overlaps its pools). */
static int inside_caller_memory(const seg_run *r, const void *ptr, size_t bytes) {
  for (uint32_t k = 0; k < r->s->n_targs; k++)
    if (r->args[k].kind == CGT_ARG_STATIC && tx_range_inside(ptr, bytes, r->args[k].ptr, r->args[k].bytes))
      return !tx_other_trees_output_at(r->tree, (void *)r->args[k].ptr, r->args[k].bytes);
  return 0;
}

/* The size of one element of the output m describes, in bytes (1 for a
 * type narrower than a byte). */
static int64_t out_item_bytes(const out_meta *m) { return m->dtype.bits / 8 ? m->dtype.bits / 8 : 1; }

/* 1 if the output m describes has no elements (a dimension of 0: an empty
 * KV cache, an empty aux output). */
static int out_is_empty(const out_meta *m) {
  for (int32_t d = 0; d < m->ndim; d++)
    if (m->dims[d] == 0)
      return 1;
  return 0;
}

/* The storage offset, in bytes, of the output m describes, at this call:
 * the template's, or for an output that aliases a tensor input, that
 * input's storage offset now plus where the output lies from its data.
 * -1 with an exception set. */
static int64_t output_offset_bytes(PyObject *const *args, const out_meta *m) {
  if (m->alias_arg < 0)
    return m->offset_bytes;
  PyObject *in = args[m->alias_arg];
  PyObject *so = PyObject_CallMethodNoArgs(in, TX.str_storage_offset);
  PyObject *es = so ? PyObject_CallMethodNoArgs(in, TX.str_element_size) : NULL;
  long long so_n = so ? PyLong_AsLongLong(so) : -1, es_n = es ? PyLong_AsLongLong(es) : -1;
  Py_XDECREF(so);
  Py_XDECREF(es);
  if (PyErr_Occurred())
    return -1;
  int64_t off = m->alias_rel + (int64_t)so_n * (int64_t)es_n;
  return off >= 0 && off % out_item_bytes(m) == 0 ? off : m->offset_bytes; /* a view as another dtype: the template's */
}

/* Is the output m describes, lying at *ptr, over the caller's memory?
 * Then it is no memory of the tree's: no step reuses it, and it must hold
 * the caller's storage, as a view holds its base's (make_output).
 *
 * A view of a STATIC input is: the graph read the caller's memory in
 * place. So is a view of a DYNAMIC input in an eager run of the tree (a
 * failed capture, a node past the rerecord limit), which reads the
 * caller's memory too. Elsewhere a DYNAMIC input is copied into a
 * placeholder, and the graph's view of it lies in that copy. Under plain
 * Inductor it is a view of the caller's tensor itself: a write to either
 * shows in the other, and it stays readable past the step. AOTAutograd
 * rebuilds most such outputs from the caller's tensor (as_strided on the
 * input), but not all: the view a custom autograd.Function returns of its
 * input, in a training graph, is handed to the user as the graph returned
 * it (AOTAutograd's custom_function_view), and over the placeholder it
 * read a copy, silently, that the next step overwrote. So such an output
 * is moved to the caller's memory at the same place (*ptr), exactly where
 * the plain graph's view would lie. Not a saved activation: the backward
 * reads the copy the forward read, which a write to the caller's tensor
 * between them cannot change. A VALUE input's view lies in the tree's
 * memory: not the caller's. An input that lies in another tree's output
 * (another thread's, handed over) is that tree's memory, which its next
 * step reuses: only a view of the caller's tensor, which shares the
 * output's storage and so the mark that tree puts on it, may lie over it.
 * Where the dtypes differ and no such view can be made, the call does not
 * get here: it runs as the plain graph (seg_plain.c,
 * seg_call_plain_over_other_trees_output), whose view shares the output's storage.
 * Made here, it lay in the placeholder copy for a DYNAMIC input (missing
 * the program's writes to it), and over the other tree's memory for a
 * STATIC one, marked only at this tree's next step: once the other tree's
 * step ended first, it read that tree's next outputs (a limit once). */
static int over_caller_memory(const seg_run *run, const out_meta *m, int saved, void **ptr) {
  if (m->alias_arg < 0)
    return 0;
  cgt_arg_kind kind = run->args[m->alias_k].kind;
  if (kind != CGT_ARG_STATIC && kind != CGT_ARG_DYNAMIC)
    return 0;
  char *caller = run->ptrs[m->alias_k];
  size_t span = run->spans[m->alias_k];
  if (!caller)
    return 0;
  /* Another tree's output: that tree's pool, which its next step reuses.
   * Over it only as a view of the caller's tensor (make_output), which
   * shares the output's storage, and so that tree's mark. */
  if (!m->alias_same_dtype && tx_other_trees_output_at(run->tree, caller, span))
    return 0;
  if (kind == CGT_ARG_STATIC)
    return 1;
  if (m->alias_rel < 0 || (uint64_t)m->alias_rel >= span)
    return 0;
  if ((char *)*ptr >= caller && (char *)*ptr < caller + span) /* an eager run read the caller's own memory */
    return 1;
  if (saved)
    return 0;
  *ptr = caller + m->alias_rel;
  return 1;
}

/* base.as_strided to m's shape and strides, at `offset` elements into
 * base's storage. A new reference, or NULL with an exception set. */
static PyObject *strided_view(PyObject *base, const out_meta *m, int64_t offset) {
  PyObject *size = PyTuple_New(m->ndim), *stride = PyTuple_New(m->ndim);
  for (int32_t d = 0; size && stride && d < m->ndim; d++) {
    PyTuple_SET_ITEM(size, d, PyLong_FromLongLong(m->dims[d]));
    PyTuple_SET_ITEM(stride, d, PyLong_FromLongLong(m->dims[m->ndim + d]));
  }
  PyObject *at = PyLong_FromLongLong(offset);
  PyObject *view = size && stride && at && !PyErr_Occurred()
                       ? PyObject_CallMethodObjArgs(base, TX.str_as_strided, size, stride, at, NULL)
                       : NULL;
  Py_XDECREF(size);
  Py_XDECREF(stride);
  Py_XDECREF(at);
  return view;
}

/* The output m describes as a view of the caller's tensor `in`
 * (in.as_strided to m's shape, strides and place): what the plain graph
 * returns (Inductor's reinterpret_tensor), sharing in's storage (its
 * lifetime, and the stale mark another tree may put on it) and version
 * counter (autograd's check of a saved tensor changed in place before its
 * backward). A new reference, or NULL with an exception set. */
static PyObject *caller_view(PyObject *in, const out_meta *m, PyObject *const *args) {
  int64_t offset_bytes = output_offset_bytes(args, m);
  if (offset_bytes < 0)
    return NULL;
  return strided_view(in, m, offset_bytes / out_item_bytes(m));
}

/* An output that is a view of a VALUE argument: an output of this step
 * passed in (two compiled blocks, the pieces around a graph break), which
 * the graph returns as it is, or a view of it; a training forward that
 * saves its input (a Linear) returns it among its saved results. Under
 * plain Inductor it is that input, or a view of it, sharing its version
 * counter, so a write in place to the input before the backward raises
 * autograd's error there. Made a DLPack tensor of its own, it had a
 * counter of its own: the backward read the written values without a
 * word (a helper's audit). So it is made as the plain graph makes it, a
 * view of the argument (as_strided over its storage, where the output
 * lies now), and its value goes back, the argument's holding the memory;
 * *ref is the argument's record, which holds the step for a saved one
 * until its backward reads it (seg_saved_view_hold). NULL with
 * no exception set where it cannot be made so (another dtype, not where a
 * view would lie, or past the argument's storage: the caller makes a
 * tensor of its own, v untouched); NULL with an exception set on an error
 * (v released). */
static PyObject *value_input_view(seg_run *run, PyObject *const *args, cgt_value v, const out_meta *m,
                                  tx_out_ref **ref) {
  TreeObject *T = run->tree;
  *ref = NULL;
  if (m->alias_arg < 0 || !m->alias_same_dtype || run->args[m->alias_k].kind != CGT_ARG_VALUE ||
      !run->ptrs[m->alias_k] || m->alias_rel < 0)
    return NULL;
  void *ptr = NULL;
  size_t bytes = 0;
  if (cgt_value_ptr(T->tree, v, &ptr, &bytes) != CGT_OK)
    return NULL; /* make_output reports an error */
  tx_out_ref *in = tx_step_output_at(T, run->ptrs[m->alias_k], run->spans[m->alias_k]);
  if (!in)
    return NULL;
  /* The output lies where the view would, in the argument's memory; or,
   * for an argument in the side pool, in the placeholder the tree copied
   * it into (a graph that writes such an argument runs plainly, seg_call,
   * so the copy's bytes are the argument's: handed out over the copy, the
   * output missed the program's later writes to the argument: a review). */
  if ((char *)ptr != (char *)run->ptrs[m->alias_k] + m->alias_rel && !in->side_pool)
    return NULL;
  PyObject *view = caller_view(args[m->alias_arg], m, args);
  if (!view) {
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) { /* out of memory, ...: the call fails */
      (void)cgt_value_release(T->tree, v);
      return NULL;
    }
    PyErr_Clear(); /* past the argument's storage: a tensor of its own */
    return NULL;
  }
  (void)cgt_value_release(T->tree, v);
  *ref = in;
  return view;
}

/* A tensor over value v, laid out as m says. Steals v: on failure v is
 * released (through the queue). With ns_make (a timed call), PyTorch's
 * share of the work is added there.
 *
 * An output with no elements (an empty KV cache, an empty aux output)
 * still has a value, one byte of pool (set_outputs), but nothing reads
 * it: no later step's reuse of that byte can change what the tensor
 * holds. So it is watched like caller memory, that is not at all: never
 * on the step's list, never marked stale, counted in no step's live
 * outputs (alive_this_step) and holding none (saved_alive), and the
 * argument loop never refuses it as an output of an earlier step. Marked
 * like any output, it raised StaleTensorError where plain Inductor
 * computes: passed back to a compiled call (the cache handed to the next
 * decoding step), or read by an eager op that asks for its data pointer
 * (torch.cat([old_empty, x]), .sum()) (a reviewer's finding). Its byte
 * may lie inside another output by a later step; the argument loop takes
 * an empty argument for a view of that output only where it shares the
 * output's storage (seg_step_output_holding). An empty view of a non-empty
 * output is no such output: it is tied to it (tied_output), over its
 * storage, and shares its mark. */
static PyObject *make_output(seg_run *run, PyObject *const *args, cgt_value v, const out_meta *m, int saved, int grad,
                             uint64_t *ns_make) {
  TreeObject *T = run->tree;
  void *ptr = NULL;
  size_t bytes = 0;
  run->made = NULL;
  cgt_status st = cgt_value_ptr(T->tree, v, &ptr, &bytes);
  if (st != CGT_OK) {
    tx_status_error(T, st, "cgtree output");
    (void)cgt_value_release(T->tree, v); /* stolen: released on failure too */
    return NULL;
  }
  int over_caller = over_caller_memory(run, m, saved, &ptr);
  if (over_caller && m->alias_same_dtype) { /* the plain graph's own answer: a view of the caller's tensor */
    uint64_t t0 = ns_make ? tx_now_ns() : 0;
    PyObject *view = caller_view(args[m->alias_arg], m, args);
    if (ns_make) /* PyTorch's share, as for a DLPack tensor below */
      *ns_make += tx_now_ns() - t0;
    (void)cgt_value_release(T->tree, v); /* the tree's record of it: nothing reads it */
    return view;
  }
  /* Over the caller's memory as another dtype, the output keeps the
   * caller's storage alive, as a view keeps its base's: dropped first, the
   * caller's tensor would free the memory the output reads. */
  PyObject *keep = over_caller ? PyObject_CallMethodNoArgs(args[m->alias_arg], TX.str_untyped_storage) : NULL;
  int64_t offset_bytes = over_caller && !keep ? -1 : output_offset_bytes(args, m);
  if (offset_bytes < 0) {
    Py_XDECREF(keep);
    (void)cgt_value_release(T->tree, v);
    return NULL;
  }
  int nd = m->ndim;
  tx_out_ref *r = tx_malloc(sizeof *r + 2 * (size_t)nd * sizeof(int64_t));
  if (!r) {
    Py_XDECREF(keep);
    (void)cgt_value_release(T->tree, v);
    return PyErr_NoMemory();
  }
  memset(r, 0, sizeof *r);
  r->keep = keep; /* from here on, released with r */
  if (nd)
    memcpy(r->dims, m->dims, 2 * (size_t)nd * sizeof(int64_t));
  r->tree = T;
  T->out_refs++; /* until the drain frees r: T stays open (tree_close.c) */
  r->value = v;
  r->step = T->step;
  r->ptr = ptr;
  r->bytes = bytes;
  r->caller_memory = over_caller || inside_caller_memory(run, ptr, bytes);
  r->empty = out_is_empty(m);
  r->side_pool = run->outs_side_pool;
  DLTensor *dl = TXE.outputs ? &r->mv.dl_tensor : &r->m.dl_tensor;
  dl->device.device_type = kDLCUDA;
  dl->device.device_id = T->device;
  dl->ndim = nd;
  dl->dtype = m->dtype;
  dl->shape = r->dims;
  dl->strides = r->dims + nd;
  dl->data = (char *)ptr - offset_bytes; /* the storage begins where the plain graph's did */
  dl->byte_offset = (uint64_t)offset_bytes;
  PyObject *t;
  if (TXE.outputs) { /* no Python call (exchange.c) */
    r->mv.version.major = 1;
    r->mv.manager_ctx = r;
    r->mv.deleter = out_deleter_versioned;
    uint64_t t0 = ns_make ? tx_now_ns() : 0;
    t = tx_exchange_make_tensor(&r->mv);
    if (ns_make)
      *ns_make += tx_now_ns() - t0;
    if (!t) {
      /* Whether PyTorch ran the deleter or not, the value goes back now,
       * once, and r leaves its tree: it was never registered or watched,
       * so no record of the tree names it, and the tree may close. r
       * itself is left to the deleter should it run (the drain then frees
       * it alone); if PyTorch dropped it without, its few bytes leak. */
      (void)cgt_value_release(T->tree, v);
      Py_CLEAR(r->keep); /* no tensor holds it: should the deleter never come, the caller's storage still goes */
      r->tree = NULL;
      T->out_refs--;
      return NULL;
    }
  } else {
    r->m.manager_ctx = r;
    r->m.deleter = out_deleter;
    PyObject *cap = PyCapsule_New(&r->m, "dltensor", capsule_destructor);
    if (!cap) {
      (void)cgt_value_release(T->tree, v);
      T->out_refs--;
      out_ref_free(r);
      return NULL;
    }
    uint64_t t0 = ns_make ? tx_now_ns() : 0;
    t = PyObject_Vectorcall(TX.from_dlpack, &cap, 1, NULL);
    if (ns_make)
      *ns_make += tx_now_ns() - t0;
    Py_DECREF(cap); /* unconsumed: the destructor queued r */
    if (!t)
      return NULL;
  }
  tx_out_ref *old = NULL;
  HASH_FIND_PTR(T->registry, &t, old);
  if (old) { /* an entry whose tensor object died while a view kept the storage */
    HASH_DEL(T->registry, old);
    old->in_registry = 0;
  }
  r->key = t;
  tx_hash_oomed = 0;
  HASH_ADD_PTR(T->registry, key, r);
  if (tx_hash_oomed) {
    Py_DECREF(t); /* its deleter gives the value back, through the queue */
    return PyErr_NoMemory();
  }
  r->in_registry = 1;
  T->outputs_made++;
  int in_tree_memory = !r->caller_memory && !r->empty; /* caller memory, or no element: no step overwrites it */
  T->alive_this_step += (uint64_t)in_tree_memory;
  r->counted = 1;
  r->saved = saved && in_tree_memory; /* no step reuses its memory, and no backward ends a hold of it */
  r->saved_by = r->saved ? run->s->pair : 0;
  r->grad = grad;
  T->saved_alive += (uint64_t)r->saved;
  if (in_tree_memory && tx_stale_watch(T, r, t) < 0) { /* an output we could not protect is not handed out */
    Py_DECREF(t);
    return NULL;
  }
  run->made = r; /* caller memory (a parameter a forward saves), or empty: no step reuses it, nothing to watch */
  return t;
}

/* Outputs tied to an earlier output. Inductor returns one buffer at two
 * positions where a training forward hands the program a tensor that it
 * also saves for the backward (a sigmoid's, a softmax's output), and views
 * of one buffer (reinterpret_tensor) where the graph returns several. All
 * of them share one version counter there, so a write in place to the
 * program's output (y.mul_(2), an inplace ReLU after it) raises autograd's
 * error at the backward that reads the saved one. Made each from a DLPack
 * tensor of its own, they had a counter each: the backward read the
 * written values without a word, and the gradients came out wrong (a
 * helper's audit, on an H100). So a tied output is handed out as the
 * plain graph hands it: the earlier tensor itself, or a view of it
 * (as_strided over its storage, where the value lies now), sharing its
 * storage (its lifetime and stale mark) and version counter; its own value
 * goes back, the earlier output's holding the memory. An output that the
 * program gets and that is also saved for the backward holds the step
 * through its record, as a saved activation of its own would (counted in
 * tied_saved_alive), until its own backward reads it (end_holds_read_by_backward), its
 * memory dies, or the step ends: the saved tensor autograd keeps is
 * another tensor over that storage, which no weak reference can follow,
 * and the program's own output may live on past the backward. A view that
 * lies below the earlier output's data is made a tensor of its own: the
 * earlier output's record covers only its own range, where lookups by
 * address (tx_step_output_at) find views passed on.
 *
 * Ties between outputs that lie in an input's memory are left to
 * make_output, which makes each a view of the caller's tensor where it can
 * (sharing the caller's counter). A view that cannot be made (another
 * dtype, or memory past the earlier tensor's storage) is a tensor of its
 * own as before, counted in outputs_tied_apart.
 *
 * An empty output has a byte of pool of its own (set_outputs), not the
 * place in the earlier output where the plain graph's view lay: its place
 * there is the template's (its storage offset from the earlier output's).
 * Placed by its own byte, an empty view of y lay anywhere in y's storage
 * or past it (as_strided checks no bounds for no element), where a lookup
 * by address took it for another output. A non-empty output tied to an
 * earlier empty one (y[:0] returned before y) is a tensor of its own: the
 * empty one's storage covers no memory, and nothing marks it
 * (make_output).
 *
 * The tied output, a new reference; NULL with no exception set where it
 * cannot be made (the caller makes it a tensor of its own, v untouched);
 * NULL with an exception set on an error (v released). */
static PyObject *tied_output(seg_run *run, cgt_value v, const out_meta *m, const out_meta *bm, PyObject *base) {
  TreeObject *T = run->tree;
  if (m->tie_same) {
    (void)cgt_value_release(T->tree, v);
    Py_INCREF(base);
    return base;
  }
  if (m->alias_arg >= 0 || bm->alias_arg >= 0 || m->dtype.code != bm->dtype.code || m->dtype.bits != bm->dtype.bits ||
      m->dtype.bits < 8)
    return NULL;
  int empty = out_is_empty(m);
  if (out_is_empty(bm) && !empty)
    return NULL;
  void *ptr = NULL;
  size_t bytes = 0;
  if (cgt_value_ptr(T->tree, v, &ptr, &bytes) != CGT_OK)
    return NULL; /* make_output reports it */
  void *base_ptr = NULL;
  PyObject *so =
      tx_data_ptr_slow(base, &base_ptr) == 0 ? PyObject_CallMethodNoArgs(base, TX.str_storage_offset) : NULL;
  long long base_off = so ? PyLong_AsLongLong(so) : -1;
  Py_XDECREF(so);
  if (PyErr_Occurred()) {
    (void)cgt_value_release(T->tree, v);
    return NULL;
  }
  int64_t item = out_item_bytes(m);
  int64_t diff = empty ? m->offset_bytes - bm->offset_bytes : (int64_t)((char *)ptr - (char *)base_ptr);
  if (diff < 0 || diff % item != 0 || base_off + diff / item < 0) /* below the earlier output: no lookup by
                                                                      * address (tx_step_output_at) would find it */
    return NULL;
  PyObject *view = strided_view(base, m, base_off + diff / item);
  if (!view) {
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) { /* out of memory, ...: the call fails */
      (void)cgt_value_release(T->tree, v);
      return NULL;
    }
    PyErr_Clear(); /* out of the earlier tensor's storage: a tensor of its own */
    return NULL;
  }
  (void)cgt_value_release(T->tree, v);
  return view;
}

/* ------------------------------------------------------- templates */

variant_tmpl *seg_tmpl_find(SegmentObject *s, uint64_t variant) {
  size_t mask = s->tmpl_slots - 1;
  for (size_t i = s->tmpl_slots ? (size_t)variant & mask : 0; s->tmpl_slots && s->tmpl_index[i]; i = (i + 1) & mask)
    if (s->tmpl_index[i]->variant == variant)
      return s->tmpl_index[i];
  return NULL;
}

static void tmpl_index_put(variant_tmpl **slots, size_t n_slots, variant_tmpl *t) {
  size_t i = (size_t)t->variant & (n_slots - 1);
  while (slots[i])
    i = (i + 1) & (n_slots - 1);
  slots[i] = t;
}

/* Room in s's template list and index for one more; -1 (MemoryError set,
 * nothing changed) if the host has none. */
static int tmpl_room_for_one_more(SegmentObject *s) {
  variant_tmpl **grown = tx_realloc(s->tmpls, (s->n_tmpls + 1) * sizeof *grown);
  if (!grown) {
    PyErr_NoMemory();
    return -1;
  }
  s->tmpls = grown; /* a list one longer than its count: harmless */
  if (2 * (s->n_tmpls + 1) <= s->tmpl_slots)
    return 0;
  size_t n_slots = s->tmpl_slots ? 2 * s->tmpl_slots : 16;
  variant_tmpl **slots = tx_calloc(n_slots, sizeof *slots);
  if (!slots) {
    PyErr_NoMemory();
    return -1;
  }
  for (size_t i = 0; i < s->n_tmpls; i++) /* in the order added: each probe sequence keeps it */
    tmpl_index_put(slots, n_slots, s->tmpls[i]);
  free(s->tmpl_index);
  s->tmpl_index = slots;
  s->tmpl_slots = n_slots;
  return 0;
}

void seg_tmpl_clear(variant_tmpl *t) {
  if (t->outs)
    for (uint32_t i = 0; t->outs && i < t->n_res; i++) {
      free(t->outs[i].dims);
    }
  free(t->outs);
  free(t->is_tensor);
  free(t->key);
  Py_XDECREF(t->consts);
  memset(t, 0, sizeof *t);
}

/* 1 if result i of res (a tuple or list) has the dtype of tensor `in`;
 * 0 if not, or if either cannot say (no error is left set). */
static int same_dtype(PyObject *res, uint32_t i, PyObject *in) {
  PyObject *out = PySequence_GetItem(res, (Py_ssize_t)i);
  PyObject *a = out ? PyObject_GetAttr(out, TX.str_dtype) : NULL;
  PyObject *b = a ? PyObject_GetAttr(in, TX.str_dtype) : NULL;
  int same = a && b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
  Py_XDECREF(out);
  Py_XDECREF(a);
  Py_XDECREF(b);
  if (same < 0) {
    PyErr_Clear();
    return 0;
  }
  return same;
}

/* desc is what python/cgtree/torch/_graphs.py's describe() returns:
 * (as_list, metas, consts), metas[i] = None or (ptr, span, shape, strides,
 * code, bits, storage offset in bytes; the last may be left out: 0). seen:
 * each tensor input's data as the run that gave desc saw it (the caller's,
 * or a placeholder), r->spans[k] bytes long, to find outputs that alias one;
 * res and args, the run's results and arguments, say whether such an
 * output has its input's dtype. */
int seg_tmpl_add(SegmentObject *s, const seg_run *r, void *const *seen, uint64_t variant, PyObject *desc,
                 PyObject *res, PyObject *const *args, uint32_t *n_tensors) {
  PyObject *metas = PyTuple_GET_ITEM(desc, 1), *consts = PyTuple_GET_ITEM(desc, 2);
  uint32_t n_res = (uint32_t)PyTuple_GET_SIZE(metas);
  variant_tmpl t;
  memset(&t, 0, sizeof t);
  t.variant = variant;
  t.n_res = n_res;
  t.as_list = PyObject_IsTrue(PyTuple_GET_ITEM(desc, 0));
  t.is_tensor = tx_calloc(n_res ? n_res : 1, 1);
  t.outs = tx_calloc(n_res ? n_res : 1, sizeof *t.outs);
  t.key = tx_malloc((r->n_key + 1) * sizeof *t.key);
  if (t.key) {
    memcpy(t.key, r->key, r->n_key * sizeof *t.key);
    t.n_key = r->n_key;
  }
  if (!t.is_tensor || !t.outs || !t.key) {
    seg_tmpl_clear(&t);
    PyErr_NoMemory();
    return -1;
  }
  Py_INCREF(consts);
  t.consts = consts;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n_res; i++) {
    PyObject *m = PyTuple_GET_ITEM(metas, i);
    if (m == Py_None)
      continue;
    PyObject *shape = PyTuple_GET_ITEM(m, 2), *strides = PyTuple_GET_ITEM(m, 3);
    out_meta *o = &t.outs[k];
    o->ndim = (int32_t)PyTuple_GET_SIZE(shape);
    o->dims = tx_calloc(2 * (size_t)o->ndim + 1, sizeof(int64_t));
    if (!o->dims) {
      seg_tmpl_clear(&t);
      PyErr_NoMemory();
      return -1;
    }
    for (int32_t d = 0; d < o->ndim; d++) {
      o->dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
      o->dims[o->ndim + d] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, d));
    }
    o->dtype.code = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(m, 4));
    o->dtype.bits = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(m, 5));
    o->dtype.lanes = 1;
    o->offset_bytes = PyTuple_GET_SIZE(m) > 6 ? PyLong_AsLongLong(PyTuple_GET_ITEM(m, 6)) : 0;
    o->tie_pos = o->tie_k = -1;
    long tie = PyTuple_GET_SIZE(m) > 8 ? PyLong_AsLong(PyTuple_GET_ITEM(m, 7)) : -1;
    if (tie >= 0 && (uint32_t)tie < i && PyTuple_GET_ITEM(metas, tie) != Py_None) {
      o->tie_pos = (int32_t)tie;
      o->tie_k = 0;
      for (long p = 0; p < tie; p++)
        o->tie_k += PyTuple_GET_ITEM(metas, p) != Py_None;
      o->tie_same = PyObject_IsTrue(PyTuple_GET_ITEM(m, 8)) == 1;
      t.has_ties = 1;
    }
    o->alias_arg = -1;
    char *at = PyLong_AsVoidPtr(PyTuple_GET_ITEM(m, 0));
    for (uint32_t a = 0, j = 0; at && a < s->n_args && o->alias_arg < 0; a++) {
      if (s->arg_kind[a] > ARG_TENSOR_STATIC)
        continue;
      char *in = seen[j];
      if (in && r->spans[j] && at >= in && at < in + r->spans[j]) {
        o->alias_arg = (int32_t)a;
        o->alias_k = (int32_t)j;
        o->alias_rel = at - in;
        o->alias_same_dtype = same_dtype(res, i, args[a]);
      }
      j++;
    }
    t.is_tensor[i] = 1;
    k++;
  }
  if (PyErr_Occurred()) {
    seg_tmpl_clear(&t);
    return -1;
  }
  variant_tmpl *kept = tx_malloc(sizeof *kept);
  if (!kept || tmpl_room_for_one_more(s) < 0) {
    free(kept);
    seg_tmpl_clear(&t);
    if (!PyErr_Occurred())
      PyErr_NoMemory();
    return -1;
  }
  *kept = t;
  s->tmpls[s->n_tmpls++] = kept;
  tmpl_index_put(s->tmpl_index, s->tmpl_slots, kept);
  *n_tensors = k;
  return 0;
}

PyObject *seg_build_result(seg_run *r, PyObject *const *args, variant_tmpl *t) {
  SegmentObject *s = r->s;
  PyObject *out = t->as_list ? PyList_New(t->n_res) : PyTuple_New(t->n_res);
  uint32_t k = 0;
  /* Whether AccumulateGrad may take the outputs over as .grad (stale.c
   * moves those a step's end finds kept): a backward's, and an inference
   * graph's called inside a backward, a compiled gradient hook's
   * (`p.register_hook(lambda g: clip(g))`), whose result autograd hands on
   * as the gradient. A hook's output kept by accumulation was marked, not
   * moved, and the next accumulation raised StaleTensorError where
   * Inductor computes (a helper's review). Such an output counts as the
   * step's gradient only where it is a leaf's .grad (belongs_to_training_
   * step asks the leaves): a recompute's compiled helper (a mask) whose
   * result the next forward reads was taken for a gradient, and that
   * forward went on in the backward's step, a node per call (a review).
   * Asked only where a tree noted a leaf, where .grad can be. -1: not
   * asked yet. */
  int grad = s->backward ? GRAD_BACKWARD : -1;
  if (!out)
    goto fail;
  if (t->has_ties && !r->made_at) { /* once per run: the records of a call's results, for its ties */
    if (!(r->made_at = tx_calloc(s->n_outputs ? s->n_outputs : 1, sizeof *r->made_at))) {
      PyErr_NoMemory();
      goto fail;
    }
    r->n_made_at = s->n_outputs;
  }
  for (uint32_t i = 0; i < t->n_res; i++) {
    PyObject *item;
    if (t->is_tensor[i]) {
      const out_meta *m = &t->outs[k];
      item = NULL;
      r->made = NULL;
      if (m->tie_pos >= 0) {
        PyObject *base = t->as_list ? PyList_GET_ITEM(out, m->tie_pos) : PyTuple_GET_ITEM(out, m->tie_pos);
        uint64_t t0 = r->tree->timed ? tx_now_ns() : 0;
        item = tied_output(r, r->outs[k], m, &t->outs[m->tie_k], base);
        if (r->tree->timed)
          r->ns_made += tx_now_ns() - t0;
        if (!item && PyErr_Occurred()) {
          k++; /* released */
          goto fail;
        }
        tx_out_ref *base_made = (uint32_t)m->tie_k < r->n_made_at ? r->made_at[m->tie_k] : NULL;
        if (item && i >= s->saved_from && (uint32_t)m->tie_pos < s->saved_from && !s->backward)
          seg_tied_saved_hold(s, r->tree, base_made);
        r->tree->outputs_tied += item != NULL;
        r->tree->outputs_tied_apart += item == NULL;
        if (item) /* the record a memory watch below follows: the earlier output's, whose storage it shares */
          r->made = base_made;
      }
      if (!item && m->alias_arg >= 0) {
        tx_out_ref *in = NULL;
        item = value_input_view(r, args, r->outs[k], m, &in);
        if (!item && PyErr_Occurred()) {
          k++; /* released */
          goto fail;
        }
        if (item && i >= s->saved_from && training_forward(s))
          seg_saved_view_hold(s, r->tree, in);
        r->tree->outputs_viewing_values += item != NULL;
        if (item) /* the record a memory watch below follows: the argument's, whose storage it shares */
          r->made = in;
      }
      if (!item && grad < 0) /* asked once per call, and only of a graph that is no backward's */
        grad = inference_graph(s) && tx_trees_have_grad_leaves() && tx_in_a_backward() ? GRAD_IN_BACKWARD : 0;
      if (!item)
        item = make_output(r, args, r->outs[k], m, i >= s->saved_from, grad, r->tree->timed ? &r->ns_made : NULL);
      if (k < r->n_made_at)
        r->made_at[k] = item ? r->made : NULL; /* made by this call: never looked up by an address */
      k++;
      if (!item)
        goto fail;
      /* a training forward's output, for the program: it may hold the step (module.c) */
      if (i < s->saved_from && training_forward(s) &&
          tx_tree_note_forward_output(r->tree, item, i < 64 && (s->memory_watched >> i & 1), r->made) < 0) {
        Py_DECREF(item);
        goto fail;
      }
      if (inference_graph(s)) /* module.c, "Inference outputs a training forward reads" */
        tx_tree_note_inference_output(r->tree, r->made);
    } else {
      item = PyTuple_GET_ITEM(t->consts, i);
      Py_INCREF(item);
    }
    if (t->as_list)
      PyList_SET_ITEM(out, i, item);
    else
      PyTuple_SET_ITEM(out, i, item);
  }
  return out;
fail:
  for (; k < s->n_outputs; k++) /* values no tensor took */
    (void)cgt_value_release(r->tree->tree, r->outs[k]);
  Py_XDECREF(out);
  return NULL;
}
