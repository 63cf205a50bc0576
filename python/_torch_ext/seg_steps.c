/* seg_steps.c — which step a call belongs to.
 *
 * Every call of a segment, recorded or plain, first brings its tree's step
 * up to the call (seg_run_in_step; module.c, "Steps"). In training the
 * tree asks this file about the call: whether it is the step's optimizer
 * (it writes an input in place, or reads a gradient: a backward output of
 * the step, or a kept .grad, belongs_to_training_step), whether it is a
 * training forward, and whether it reads an output of the step that
 * requires grad. A training forward's leaves are noted, so that their
 * .grad tensors are found when the step ends (seg_note_grad_leaves). When a
 * step begins at a call, the call's arguments that lie in outputs of the
 * ending step, and kept .grad tensors, move out of the pool first
 * (tx_move_call_args), all at once, so that tensors over one storage stay
 * views of one another.
 */
#include "segment.h"

/* A training forward's inputs that may get a gradient: the leaves among
 * them are where AccumulateGrad may put a backward's output, and stale.c
 * must find those .grad tensors when their step ends. Each position keeps
 * a weak reference to the object it saw last, so a call with the same
 * parameters as the last costs one comparison per position. */
int seg_note_grad_leaves(seg_run *r, PyObject *const *args) {
  SegmentObject *s = r->s;
  if (!r->grad_seen) {
    if (!(r->grad_seen = tx_calloc(s->n_grad_pos, sizeof *r->grad_seen))) {
      PyErr_NoMemory();
      return -1;
    }
    r->n_grad_seen = s->n_grad_pos;
  }
  for (uint32_t j = 0; j < s->n_grad_pos; j++) {
    PyObject *o = args[s->grad_pos[j]];
    PyObject *seen = r->grad_seen[j] ? tx_weakref_get(r->grad_seen[j]) : NULL;
    Py_XDECREF(seen); /* o lives (the caller holds it): equal addresses are the same object */
    if (seen == o)
      continue;
    Py_CLEAR(r->grad_seen[j]);
    PyObject *wr = PyWeakref_NewRef(o, NULL);
    if (!wr) { /* no weak references to it: no tensor */
      PyErr_Clear();
      continue;
    }
    if (tx_grad_leaf_note(r->tree, o, wr) < 0) { /* not seen: the next call notes it again */
      Py_DECREF(wr);
      return -1;
    }
    r->grad_seen[j] = wr;
  }
  return 0;
}

/* The run whose call at hand read a kept .grad: its memo is committed
 * when the call returns a result (seg_vectorcall; read_memo.c). */
_Thread_local seg_run *seg_memo_pending;

/* A call's arguments, for tx_tree_sync_step's question whether the call
 * reads gradients of the step. */
typedef struct call_args {
  SegmentObject *s;
  TreeObject *T;
  PyObject *const *args;
  size_t n;
  seg_run *r;
  int reads_kept_grad; /* args_read_kept_grad found one (and r->memo holds the call's candidate) */
} call_args;

/* 1 if a tensor argument of the call lies in a leaf's .grad of memory of
 * its own (a slice too), no output of the step: one that accumulation or
 * zero_grad(set_to_none=False) kept, which an earlier step's end moved out
 * of the pool and AccumulateGrad added into since. Only the step's live
 * outputs counted as gradients, so from a loop's second step a compiled
 * call that reads .grad and writes nothing (a norm for the log) began a
 * step, and the loss the loop logs raised StaleTensorError where Inductor
 * computes; a per-parameter update came under the bound of calls that
 * only write, 64, not 1024 (a helper's review). 0 if none; -1 with an
 * exception set. The arguments are the candidate of the run's memo
 * (read_memo.c). */
static int args_read_kept_grad(call_args *c) {
  void **ptrs = tx_malloc((c->n ? c->n : 1) * sizeof *ptrs);
  if (!ptrs) {
    PyErr_NoMemory();
    return -1;
  }
  size_t m = 0;
  tx_read_memo *memo = &c->r->memo;
  (void)tx_read_memo_begin(memo, (uint32_t)c->n); /* out of memory: no candidate, so no repeat */
  for (size_t i = 0; i < c->n; i++) {
    void *ptr;
    if (c->s->arg_kind[i] > ARG_TENSOR_STATIC) {
      tx_read_memo_arg(memo, (uint32_t)i, c->args[i], 0, 0);
      continue;
    }
    if (seg_arg_data_ptr(c->s, c->args[i], &ptr) < 0) {
      PyErr_Clear(); /* a stale output: the call reads it again, and raises */
      tx_read_memo_drop(memo);
      continue;
    }
    ptrs[m++] = ptr;
    tx_read_memo_arg(memo, (uint32_t)i, c->args[i], 1, (uintptr_t)ptr);
  }
  int rc = tx_kept_grad_among(c->T, ptrs, m);
  free(ptrs);
  c->reads_kept_grad = rc == 1;
  return rc;
}

/* 1 when the call belongs to the training step whose backward ran (module.c,
 * "The optimizer"): it is no training forward and updates an input in place
 * (an optimizer step), or one of its tensors lies in a live backward
 * output of the step (a .grad that AccumulateGrad took over, read by
 * gradient clipping or a norm) or is a kept .grad (args_read_kept_grad).
 * Asked only at a new compiled call with no backward pending; a loop whose
 * zero_grad() dropped the gradients pays one walk of the step's outputs,
 * and for a graph that neither trains nor writes, one read of each noted
 * leaf's .grad per backward (tx_kept_grad_among). TX_OPTIMIZER_READS_GRAD
 * where it reads a .grad, TX_OPTIMIZER_WRITES where it only writes an
 * input, 0 if neither. */
static int belongs_to_training_step(void *call) {
  call_args *c = call;
  if (!c->T->backward_this_step && !c->T->grad_readers_step)
    return 0;
  /* No backward, no training forward, and it writes an input in place. */
  int writes = c->s->arg_written && inference_graph(c->s);
  int alive = 0;
  for (tx_out_ref *o = c->T->step_outputs; o && !alive; o = o->step_next)
    alive = tx_out_ref_live_backward_output(o);
  for (size_t i = 0; alive && i < c->n; i++) {
    tx_out_ref *o;
    if (c->s->arg_kind[i] > ARG_TENSOR_STATIC)
      continue;
    if (seg_arg_step_output(c->s, c->T, c->args[i], &o) < 0) {
      PyErr_Clear(); /* a stale output: the call reads it again below, and raises */
      continue;
    }
    if (o && tx_out_ref_live_backward_output(o))
      return TX_OPTIMIZER_READS_GRAD;
  }
  /* A graph of neither kind after a backward: does it read a kept .grad?
   * It is held for the step only while an output of the step lives: with
   * none, beginning a step costs nothing, and an analysis loop that reads
   * .grad at every call held the step up to the bound, a recording per
   * call (a review). But such a call's own output then lives in the step
   * it began, and the next call that reads a kept .grad (the optimizer's
   * next parameter, where the forward ran plainly and the backward's
   * outputs went into kept .grad tensors) began another step and marked
   * it: StaleTensorError where Inductor computes (a helper's fault loop).
   * So that step is a gradient readers' step, which later readers join as
   * they join the backward's (grad_readers_step), whether or not an
   * output lives (an in-place update returns none: each began a step and
   * read every leaf's .grad again, a review).
   *
   * A repeat: in a gradient readers' step, a call of a segment with the
   * arguments of its last call in the step (the analysis loop's next
   * probe, `score = probe(w, w.grad)` kept bound) begins a readers' step
   * of its own, as it would with the last output dropped, and as
   * reduce-overhead begins a generation at every call; joined, it made a
   * node per call up to the bound (a review). A per-parameter update reads
   * another .grad at each call, a metric against several references takes
   * another tensor (a live one: read_memo.c), a norm before them is
   * another segment: they join. Only the same call again with the same
   * tensors, its output kept (a list of one norm of one .grad, made 600
   * times), raises StaleTensorError where Inductor computes. */
  if (inference_graph(c->s) && tx_trees_have_grad_leaves()) {
    tx_out_ref_queue_drain(); /* outputs just dropped */
    int reads = args_read_kept_grad(c);
    if (reads < 0)
      return -1;
    if (reads && c->T->grad_readers_step) {
      int repeat = tx_read_memo_repeats(&c->r->memo, c->T->step);
      return repeat ? TX_OPTIMIZER_READS_GRAD_FIRST : TX_OPTIMIZER_READS_GRAD;
    }
    if (reads)
      return c->T->alive_this_step ? TX_OPTIMIZER_READS_GRAD : TX_OPTIMIZER_READS_GRAD_FIRST;
  }
  return writes ? TX_OPTIMIZER_WRITES : 0;
}

/* 0 if o may move (it requires no grad: set_ would cut it from
 * autograd's graph, and module.c holds the step for such an argument
 * before it comes to this), 1 if it stays, -1 with an exception set. */
static int stays(PyObject *o) {
  PyObject *rg = PyObject_GetAttr(o, TX.str_requires_grad);
  int grad = rg ? PyObject_IsTrue(rg) : -1;
  Py_XDECREF(rg);
  return grad;
}

/* The tensors in `todo`, kept .grad tensors (its first n_grads) and
 * arguments lying in live outputs of the ending step, move to memory of
 * their own through TX.output_mover
 * (_backend.move_out_of_pool), all in one call: arguments over one storage
 * (an output and a view of it, passed together) move onto one new storage,
 * so they stay views of one another, as in eager; moved one by one they
 * became two copies, and a write through one was lost to the other (two
 * helpers' audits). Each is set_ to the copy, its layout and autograd
 * version kept, and the tree's stream waits for the copies at once, so
 * that no later error leaves them unordered. The mover answers a list of
 * booleans: False where one stays (then it is marked with the step, and
 * the argument loop raises StaleTensorError as for any output of an
 * earlier step): where PyTorch refuses its set_ (a plain RuntimeError).
 * Returns how many moved, or -1 with an exception set (out of memory, a
 * CUDA error, anything else). */
static int move_args(TreeObject *T, PyObject *todo, Py_ssize_t n_grads) {
  PyObject *res = PyObject_CallOneArg(TX.output_mover, todo);
  if (!res) {
    /* It may have moved some storages before it failed (out of memory
     * for the next copy): the tree's stream waits for those copies too
     * (the error raised stays the one raised; a helper's review). A plain
     * RuntimeError is PyTorch refusing; its subclasses (out of memory, a
     * CUDA error) and anything else reach the caller. */
    (void)tx_tree_waits_for_caller(T);
    if (PyErr_Occurred() != PyExc_RuntimeError)
      return -1;
    PyErr_Clear();
    return 0;
  }
  int moved = 0, rc = 0;
  PyObject *seq = PySequence_Fast(res, "cgtree.torch: the output mover must answer a list of booleans");
  if (!seq || PySequence_Fast_GET_SIZE(seq) != PyList_GET_SIZE(todo)) {
    if (seq)
      PyErr_SetString(PyExc_TypeError, "cgtree.torch: the output mover must answer a boolean per tensor");
    rc = -1;
  }
  uint64_t grads_moved = 0;
  for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
    int m = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, i));
    if (m < 0)
      rc = -1;
    moved += m == 1;
    grads_moved += (uint64_t)(m == 1 && i < n_grads);
  }
  Py_XDECREF(seq);
  Py_DECREF(res);
  tx_kept_grads_moved(T, grads_moved);
  T->args_moved += (uint64_t)moved - grads_moved;
  if (moved && tx_tree_waits_for_caller(T) < 0) /* also after an error: what moved is ordered */
    rc = -1;
  return rc < 0 ? -1 : moved;
}

/* Argument i of c, if it is a DYNAMIC tensor lying in a live output of
 * the step (a STATIC input is keyed by its address and written in place,
 * where a copy would take the write); else NULL. */
static PyObject *arg_in_step_output(call_args *c, size_t i) {
  tx_out_ref *ref;
  if (c->s->arg_kind[i] != ARG_TENSOR)
    return NULL;
  if (seg_arg_step_output(c->s, c->T, c->args[i], &ref) < 0) {
    PyErr_Clear(); /* an output of an earlier step, marked: the argument loop raises */
    return NULL;
  }
  return ref ? c->args[i] : NULL;
}

int tx_call_reads_grad_output(TreeObject *T) {
  call_args *c = T->syncing_call;
  if (!c || !T->step_outputs)
    return 0;
  tx_out_ref_queue_drain(); /* outputs just dropped leave the list: no argument is read for them */
  for (size_t i = 0; T->step_outputs && i < c->n; i++) {
    PyObject *o = arg_in_step_output(c, i);
    PyObject *rg = o ? PyObject_GetAttr(o, TX.str_requires_grad) : NULL;
    if (o && !rg)
      return -1;
    int yes = rg ? PyObject_IsTrue(rg) : 0;
    Py_XDECREF(rg);
    if (yes)
      return yes; /* 1, or -1 */
  }
  return 0;
}

int tx_call_is_training_forward(const TreeObject *T) {
  const call_args *c = T->syncing_call;
  return c && training_forward(c->s);
}

int tx_move_call_args(TreeObject *T, PyObject *grads) {
  call_args *c = T->syncing_call;
  if (!c || !TX.output_mover)
    return 0; /* no call syncing, or no mover: every output of the step is marked */
  Py_ssize_t n_grads = grads ? PyList_GET_SIZE(grads) : 0;
  PyObject *todo = grads ? Py_NewRef(grads) : NULL;
  for (size_t i = 0; i < c->n; i++) {
    PyObject *o = arg_in_step_output(c, i);
    int keep = o ? stays(o) : 1;
    for (Py_ssize_t j = 0; keep == 0 && j < n_grads; j++)
      keep = PyList_GET_ITEM(grads, j) == o; /* the .grad itself: on the list already */
    if (keep == 1)
      continue;
    if (keep < 0 || (!todo && !(todo = PyList_New(0))) || PyList_Append(todo, o) < 0) {
      Py_XDECREF(todo);
      return -1;
    }
  }
  int moved = todo && PyList_GET_SIZE(todo) ? move_args(T, todo, n_grads) : 0;
  Py_XDECREF(todo);
  return moved;
}

/* The segment's run in the calling thread's tree, that tree's step brought
 * up to this call (module.c, "Steps"), and *caller, the caller's stream:
 * every call of a segment, recorded or plain, marks steps here, and notes
 * a stream the tree's calls left (pool_readers.c). NULL with an exception
 * set. */
seg_run *seg_run_in_step(SegmentObject *s, PyObject *const *args, size_t n, void **caller) {
  seg_run *r = seg_run_for(s);
  if (!r)
    return NULL;
  /* A training forward's leaves are noted before a step may end here: a
   * parameter new since the last call (weights reloaded as new parameters,
   * load_state_dict(sd, assign=True)) may have taken over, as .grad, a
   * gradient of the ending step that the program accumulates into (new.grad
   * = old.grad), and the step's end moves only the .grad of noted leaves.
   * Noted after the step began, the new parameter's was marked, and the
   * next accumulation raised StaleTensorError where eager computes (a
   * helper's hunt). Noted at every call, recorded or plain: a training
   * forward that runs plainly still has a recorded backward, whose outputs
   * AccumulateGrad takes over as .grad, moved, not marked, when their step
   * ends (a helper's audit: noted for recorded forwards only, the next
   * accumulation raised StaleTensorError where Inductor computes). */
  if (s->n_grad_pos && seg_note_grad_leaves(r, args) < 0)
    return NULL;
  call_args this_call = {s, r->tree, args, n, r, 0};
  void *outer = r->tree->syncing_call; /* set where an outer call's sync ran Python that made this call */
  r->tree->syncing_call = &this_call;  /* a step that begins here moves this call's arguments first */
  int rc = tx_tree_sync_step(r->tree, s->backward, belongs_to_training_step, &this_call);
  r->tree->syncing_call = outer;
  if (rc < 0 || !this_call.reads_kept_grad) {
    tx_read_memo_drop(&r->memo);
    if (rc < 0)
      return NULL;
  } else { /* a reader of a kept .grad: its memo, once the call returned (seg_vectorcall) */
    tx_read_memo_stamp(&r->memo, r->tree->step);
    seg_memo_pending = r;
  }
  if (s->arg_written)
    tx_read_memo_note_input_write(); /* after its stamp: the same call again reads what this one wrote */
  if (s->backward)
    tx_tree_backward_called(r->tree);
  else if (!r->tree->ran_other_than_backward && !tx_in_a_backward())
    r->tree->ran_other_than_backward = 1; /* a recompute inside a backward leaves a tree of backwards one */
  if (tx_caller_stream(r->tree, caller) < 0 || tx_pool_readers_caller(r->tree, *caller) < 0)
    return NULL;
  return r;
}

/* A training forward that ran as the plain graph saves its results from
 * saved_from on for its backward. One that lies in an output of this step
 * of the tree (the plain forward saved its input, which a compiled graph of
 * the step made: a frozen backbone's output before a head that runs
 * plainly) must hold the step until that backward ran, as a saved
 * activation of ours does. Else a second forward before the backwards (a
 * contrastive pair) began a step, marked that output, and the first
 * backward raised StaleTensorError where Inductor computes (a helper's
 * audit). Each such result holds as a recorded forward's saved view does
 * (seg_saved_view_hold): on the output's record, for the forward's pair, until
 * that forward's backward reads the memory, or the memory dies. Not until
 * the memory dies alone: the output is the backbone's, which a loop keeps
 * bound (h = backbone(x)) past the backward, and a hold on it kept every
 * later step from beginning (a second review). Not until any backward
 * call, as one count of the tree's once did: another head's backward, run
 * first with a compiled call after it (per-loss backwards), ended this
 * head's hold, and its backward raised (a review). */
void seg_plain_saved_hold_step(SegmentObject *s, TreeObject *T, PyObject *res) {
  if (!res || !training_forward(s) || !(PyTuple_Check(res) || PyList_Check(res)))
    return;
  Py_ssize_t n = PySequence_Size(res);
  for (Py_ssize_t i = (Py_ssize_t)s->saved_from; i < n; i++) {
    PyObject *o = PySequence_GetItem(res, i);
    void *ptr = NULL;
    if (o && PyObject_TypeCheck(o, (PyTypeObject *)TX.tensor_type) && tx_data_ptr_slow(o, &ptr) == 0 && ptr)
      seg_saved_view_hold(s, T, tx_step_output_at(T, ptr, 1));
    Py_XDECREF(o);
    PyErr_Clear(); /* a tensor that cannot say where it lies is not ours to hold */
  }
}
