/* seg_plain.c — calls that run as the plain compiled graph.
 *
 * Anything a graph does that a recording cannot carry (an output on the CPU,
 * an output in memory that is neither the pool nor an input, a capture that
 * fails: a host sync such as torch.cond's device predicate, a tensor
 * argument that is not on the tree's device when it runs) turns the
 * segment into a plain call of the compiled graph for good, with a warning:
 * it then runs at Inductor's speed. A segment may also be plain from the
 * start (`plain_reason`: the backend decided so at compile time). A plain
 * segment's calls still mark steps (seg_call_bypassed): a step that begins or
 * goes on around them must not depend on whether a graph was recorded.
 *
 * A plain call runs on the caller's stream: after the tree's work where
 * the tree ran first (a failed capture, a colliding key), and noting for
 * other threads' trees the outputs of theirs it reads (pool_readers.c).
 * A training forward that runs plainly holds the step for the saved
 * results that lie in outputs of the step (seg_plain_saved_hold_step), as
 * a recorded one holds its saved activations. A graph the tree ran
 * eagerly in half of its recent calls (EAGER_RUNS_PLAIN, segment.h) goes
 * plain too: its eager runs cost more than the plain graph.
 */
#include "segment.h"

/* The compiled graph, called plainly. A random graph's plain call draws
 * from the generator eagerly, which PyTorch refuses while another thread
 * records a random graph (the generator is in capture mode then): it
 * waits for random_mu, which every such recording holds. */
static PyObject *call_plain(SegmentObject *s, PyObject *const *args, size_t n) {
  s->plain_calls++;
  if (!s->prelaunch_py)
    return PyObject_Vectorcall(s->compiled, args, n, NULL);
  if (seg_random_lock() < 0)
    return NULL;
  PyObject *res = PyObject_Vectorcall(s->compiled, args, n, NULL);
  seg_random_unlock();
  return res;
}

/* A call of T from caller (the caller's stream) that runs as the plain
 * graph reads its tensor arguments on caller: each that lies in an output
 * of another tree's step (another thread's) has that tree's launches wait
 * for caller, until one of a later step, else its next step may overwrite
 * the output while the read is queued (pool_readers.c,
 * tx_pool_readers_other_tree). Looked up only while several trees live.
 * ptrs: the tensor arguments' pointers as seg_call's argument loop read
 * them (r->ptrs), or NULL where it did not read them all (a bypassed
 * call, one off the device) or may not have them any more (after cgt_run,
 * which runs Python): then they are read here, and one that cannot be
 * read is skipped (the plain call says what is wrong with it). 0; -1 out
 * of host memory, with an exception set. */
static int note_plain_reads_of_other_trees(const SegmentObject *s, TreeObject *T, void *caller,
                                           PyObject *const *args, void *const *ptrs) {
  if (!tx_live_trees_besides(T))
    return 0;
  for (uint32_t i = 0, k = 0; i < s->n_args; i++) {
    void *ptr;
    if (s->arg_kind[i] > ARG_TENSOR_STATIC)
      continue;
    if (ptrs) {
      ptr = ptrs[k++];
    } else if (seg_arg_data_ptr(s, args[i], &ptr) < 0) {
      PyErr_Clear();
      continue;
    }
    tx_out_ref *other = ptr ? tx_other_trees_step_output_at(T, ptr, 1) : NULL;
    if (other && other->tree && tx_pool_readers_other_tree(other->tree, caller) < 0)
      return -1;
  }
  return 0;
}

/* call_plain for a call of T from caller, whose reads of other trees'
 * outputs their trees wait for (note_plain_reads_of_other_trees, which
 * says what ptrs is). */
static PyObject *call_plain_from(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args,
                                 void *const *ptrs, size_t n) {
  if (note_plain_reads_of_other_trees(s, T, caller, args, ptrs) < 0)
    return NULL;
  return call_plain(s, args, n);
}


void seg_go_plain(SegmentObject *s, const char *why) {
  if (s->bypass_reason)
    return;
  s->bypass_reason = PyUnicode_FromString(why);
  PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "cgtree.torch: graph '%s' runs without CUDA graphs from now on: %s",
                   s->name, why);
  PyErr_Clear(); /* a warning turned error must not break the call */
}

/* The plain graph, on the caller's stream, after the tree's work. */
static PyObject *call_plain_after_tree(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n) {
  TreeObject *T = r->tree;
  void *caller;
  if (tx_caller_stream(T, &caller) < 0)
    return NULL;
  if (tx_caller_needs_events(T, caller))
    tx_stream_wait(caller, T->stream, T->ev_out);
  return call_plain_from(s, T, caller, args, r->ptrs, n);
}

/* A call whose key hashes to the variant of a template made by another
 * key (a 64-bit collision: not expected in the life of any program, but
 * a recording of other ints or offsets would give other numbers, silently).
 * It runs as the plain graph; the first such call says so. */
PyObject *seg_call_colliding(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n) {
  if (!s->warned_collision) {
    s->warned_collision = 1;
    if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                         "cgtree.torch: graph '%s': two sets of int, float or offset arguments gave the same "
                         "variant key; calls with the second run as the plain graph",
                         s->name) < 0)
      PyErr_Clear(); /* a warning turned error must not break the call */
  }
  s->collisions++;
  return call_plain_after_tree(s, r, args, n);
}

/* 1 if an output of template t is a view, as another dtype, of a tensor
 * argument in values (a bit per argument k < 63; bit 63 stands for every
 * k from 63 on): side-pool VALUEs, or outputs of another tree's step. */
int seg_views_as_other_dtype(const variant_tmpl *t, uint64_t values) {
  if (!values)
    return 0;
  for (uint32_t i = 0, k = 0; i < t->n_res; i++) {
    if (!t->is_tensor[i])
      continue;
    const out_meta *m = &t->outs[k++];
    if (m->alias_arg >= 0 && !m->alias_same_dtype && values >> (m->alias_k < 63 ? m->alias_k : 63) & 1)
      return 1;
  }
  return 0;
}

/* seg_views_as_other_dtype for a call of variant known, or, where the call
 * is its variant's first (known NULL: no template says yet what it
 * returns), for any variant's template: which output views which argument
 * is the graph's own, not its shapes'. 0 before the first call's template.
 * A scan of the templates, only for a call that reads another tree's
 * output. */
int seg_may_view_as_other_dtype(const SegmentObject *s, const variant_tmpl *known, uint64_t values) {
  if (known)
    return seg_views_as_other_dtype(known, values);
  for (size_t i = 0; i < s->n_tmpls; i++)
    if (seg_views_as_other_dtype(s->tmpls[i], values))
      return 1;
  return 0;
}

/* The first call of s that runs as the plain graph because it returns a
 * view, as another dtype, of another tree's output says so. */
void seg_warn_view_of_other_tree(SegmentObject *s) {
  if (s->warned_other_view)
    return;
  s->warned_other_view = 1;
  PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                   "cgtree.torch: graph '%s' returns a view, as another dtype, of an output of another thread's "
                   "compiled call; such calls run as the plain graph, so that the view shares that output's "
                   "storage (its writes, and its staleness)",
                   s->name);
  PyErr_Clear(); /* a warning turned error must not break the call */
}

/* A call of T, in its step, as the plain graph: a call of a segment plain
 * from before (seg_call_bypassed), or the call at which it goes plain (seg_go_plain:
 * its warm-up or recording raised, an argument is off the device). A
 * training forward's saved results hold the step until its backward (a
 * review: held nowhere at the call that went plain, a second forward of a
 * pair began a step and marked the first one's saved input, and its
 * backward raised StaleTensorError where Inductor computes). */
PyObject *seg_call_plain_in_step(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args,
                                 size_t n) {
  PyObject *res = call_plain_from(s, T, caller, args, NULL, n);
  seg_plain_saved_hold_step(s, T, res);
  return res;
}

/* The plain graph after the tree's work, in the call's step: a training
 * forward's saved results hold the step until its backward, as at any
 * plain call (a review: a second forward before the backwards began a
 * step and marked the first one's input). */
static PyObject *call_plain_after_tree_in_step(SegmentObject *s, const seg_run *r, PyObject *const *args,
                                               size_t n) {
  PyObject *res = call_plain_after_tree(s, r, args, n);
  seg_plain_saved_hold_step(s, r->tree, res);
  return res;
}

/* A call whose graph writes into an output of an eager run of the tree (a
 * failed capture's, or a node's past the rerecord limit), or returns a view
 * of one as another dtype. That output lies in the tree's side pool, and
 * cgt_run passes such a VALUE through a placeholder copy (docs/api.md,
 * cgt_run), so the graph would write the copy and the caller's tensor would
 * keep its old numbers; and a view of the copy as another dtype (the dtype
 * keeps value_input_view from making it a view of the caller's tensor)
 * would miss the program's later writes to that tensor, silently (a
 * review). This call runs as the plain graph instead, on the tensors
 * themselves, after the tree's work; the segment stays a segment, and the
 * first such call says so. */
PyObject *seg_call_plain_over_side_value(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n) {
  if (!s->warned_side_write) {
    s->warned_side_write = 1;
    PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                     "cgtree.torch: graph '%s' writes into an output of a run cgtree made eagerly (a graph whose "
                     "capture failed, or a node past the rerecord limit), or returns a view of one as another "
                     "dtype; such calls run as the plain graph, so that the write lands in that output and the "
                     "view is of it",
                     s->name);
    PyErr_Clear(); /* a warning turned error must not break the call */
  }
  return call_plain_after_tree_in_step(s, r, args, n);
}

/* A call that returns a view, as another dtype, of an output of another
 * tree's step (another thread's), which as_strided cannot make of that
 * tensor. Made by this tree, over the other tree's memory (a STATIC
 * argument) it was never marked by that tree's step end, and read its next
 * outputs, silently; over this tree's copy (a DYNAMIC one) it missed the
 * program's writes to the argument. The plain graph's view shares the
 * argument's storage, and so its writes and that tree's mark; the first
 * such call says so. */
PyObject *seg_call_plain_over_other_trees_output(SegmentObject *s, const seg_run *r, PyObject *const *args,
                                                 size_t n) {
  seg_warn_view_of_other_tree(s);
  return call_plain_after_tree_in_step(s, r, args, n);
}

/* The first call's plain run is done, and what came after it failed (an
 * exception is set). A graph that may run again (rerun_first) raises it:
 * a retry computes the same. One that may not (it wrote an input, it is a
 * backward over donated buffers, it drew random numbers) must not be run
 * again by a caller that retries: its result stands, the failure becomes a
 * warning, and its next call tries again to take it in. */
PyObject *seg_ran_then_failed(SegmentObject *s, PyObject *res) {
  if (s->rerun_first) {
    Py_DECREF(res);
    return NULL;
  }
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                       "cgtree.torch: graph '%s' ran plainly at its first call, and then cgtree could not take "
                       "it in (%R); its result stands, and its next call tries again",
                       s->name, value ? value : Py_None) < 0)
    PyErr_Clear(); /* a warning turned error must not break the call */
  Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
  return res;
}

/* The first call: the compiled graph runs plainly (outside the pool), and
 * its outputs tell us what to register.
 *
 * Those outputs are plain device memory, and PyTorch may keep them: Dynamo
 * holds the frame locals of the code it compiles after a graph break, which
 * are what this call returns (bench/torch_eager_residue.py finds them there,
 * held for the life of the process). So a graph that mutates none of its
 * inputs (rerun_first; a pure function of them, since graphs that draw
 * random numbers are never segments) is run once more at once, through
 * cgt_run, and the plain outputs are dropped: the caller gets the pool's,
 * whose memory goes back to the tree at the end of the step whoever keeps
 * the tensors, as CUDAGraph Trees do with theirs. That run is the graph's
 * first warmup. A graph that mutates an input cannot run twice: it keeps its
 * plain outputs. */
PyObject *seg_first_call(SegmentObject *s, const seg_run *r, void *caller, PyObject *const *args, size_t n,
                         uint64_t variant) {
  PyObject *res = call_plain_from(s, r->tree, caller, args, r->ptrs, n);
  if (!res)
    return NULL;
  if (tx_blas_clear() < 0) /* the caller's stream keeps no workspace of ours */
    return seg_ran_then_failed(s, res);
  PyObject *desc = PyObject_CallOneArg(s->describe_py, res);
  if (!desc)
    return seg_ran_then_failed(s, res);
  if (!PyTuple_Check(desc)) { /* describe() says why a recording cannot carry these outputs */
    seg_go_plain_described(s, desc, "an output is not a CUDA tensor on the graph's device");
    Py_DECREF(desc);
    return res;
  }
  uint32_t n_out = 0;
  if (seg_tmpl_add(s, r, r->ptrs, variant, desc, res, args, &n_out) < 0) { /* it ran on the caller's tensors */
    Py_DECREF(desc);
    return seg_ran_then_failed(s, res);
  }
  Py_DECREF(desc);
  s->n_outputs = n_out;
  s->outputs_known = 1;
  return res;
}


/* A call of a segment that runs as the plain graph from now on. cgtree runs
 * nothing for it, but the call still marks where the program's steps go
 * (module.c, "Steps in training", "The optimizer"): a plain forward begins
 * its step where a recorded one would, and a plain backward tells the
 * compiled optimizer step after it that it goes on in the backward's step.
 * Without that, a loop whose forward and backward went plain (their first
 * calls showed what a recording cannot carry) and whose optimizer step is a
 * segment would see a backward in every step and no forward: each optimizer
 * call would go on in one endless step, a new node each, never replayed. */
PyObject *seg_call_bypassed(SegmentObject *s, PyObject *const *args, size_t n, PyObject *kwnames) {
  seg_run *r = NULL;
  void *caller;
  /* Keywords or another count of arguments: no step is marked, and call_plain says what is wrong. */
  if (!kwnames && n == s->n_args && !(r = seg_run_in_step(s, args, n, &caller)))
    return NULL;
  if (r && s->backward && (r->tree->tied_saved_alive || r->tree->saved_alive || tx_live_trees_besides(r->tree)) &&
      seg_end_holds_of_args_read(s, r->tree, args) < 0)
    return NULL;
  return r ? seg_call_plain_in_step(s, r->tree, caller, args, n) : call_plain(s, args, n);
}

/* 1 if o, a tensor argument, lies on `device`, read through PyTorch's
 * is_cuda and get_device(); 0 if not; -1 with an exception set. */
int seg_on_device_slow(PyObject *o, int device) {
  PyObject *c = PyObject_GetAttr(o, TX.str_is_cuda);
  if (!c)
    return -1;
  int cuda = PyObject_IsTrue(c);
  Py_DECREF(c);
  if (cuda <= 0)
    return cuda;
  PyObject *d = PyObject_CallMethodNoArgs(o, TX.str_get_device);
  if (!d)
    return -1;
  long index = PyLong_AsLong(d);
  Py_DECREF(d);
  if (index == -1 && PyErr_Occurred())
    return -1;
  return index == device;
}

/* Argument i's pointer could not be read: a stale output's storage
 * raises on any access, and that error becomes StaleTensorError naming
 * the graph and the argument (counted as refused). NULL. */
PyObject *seg_arg_unreadable(SegmentObject *s, TreeObject *T, size_t i) {
  tx_stale_translate(s->name, i);
  T->stale_refused += (uint64_t)PyErr_ExceptionMatches(TxStaleError);
  return NULL;
}

/* Argument i of the call is not a CUDA tensor of the tree's device, though
 * the compile saw one there: the graph runs plainly from now on. A compile
 * sees PyTorch's fake tensors, and a fake kernel may put an output on
 * another device than the real one does: memory-efficient attention returns
 * its random seed and offset as CPU tensors outside a capture, where its
 * fake kernel says they lie on the GPU, and a backward receives them (the
 * backend copies them onto the GPU, _graphs.onto_device, but not where the
 * forward itself runs plainly). Their host addresses must never be taken
 * for device memory. */
PyObject *seg_call_off_device(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args, size_t n,
                              size_t i) {
  /* As seg_call_bypassed's. */
  if (s->backward && (T->tied_saved_alive || T->saved_alive || tx_live_trees_besides(T)) &&
      seg_end_holds_of_args_read(s, T, args) < 0)
    return NULL;
  char why[300];
  snprintf(why, sizeof why,
           "argument %zu is not a CUDA tensor of device %d when it runs, though the compile saw one there (as "
           "memory-efficient attention's random seed and offset: CPU tensors outside a capture)",
           i, T->device);
  seg_go_plain(s, why);
  return seg_call_plain_in_step(s, T, caller, args, n);
}
