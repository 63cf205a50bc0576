/* module.c — cgtree._torch_ext: the module, the Tree object, steps, figures.
 *
 * One tree per CUDA device and thread serves every graph that thread runs on
 * that device, so a thread's recordings share one pool (python/cgtree/torch
 * keeps the trees). A tree lives while its thread does, and after it for as
 * long as an output of it lives: tensors handed out may die at any time,
 * and their deleters name the tree (tree_close.c frees it after both).
 *
 * Steps follow PyTorch's inference heuristic: Dynamo bumps
 * torch._dynamo.mutation_guard.GenerationTracker.generation each time a
 * torch.compile'd callable is entered, and the first graph run after it moved
 * begins a new cgtree step. In explicit mode (a tree's explicit_steps) that
 * counter is ignored. In both, torch.compiler.cudagraph_mark_step_begin()
 * (it moves MarkStepBox.mark_step_counter) and cgtree.torch.step_begin()
 * begin one. A step's end first has stale.c mark the outputs still alive.
 *
 * The Python objects the hot path calls (torch._C._from_dlpack, the raw
 * stream getter, the counters, the storage mark) are looked up once, by
 * cgtree.torch, and handed to init_hot_path(); this module never imports
 * torch itself, so the allocator can be loaded before torch touches CUDA.
 */
#include <limits.h>
#include <stdatomic.h>

#include "ext.h"
#include "alloc_entry.h"

#include "cgtree_sim.h"

#include <structmember.h>

tx_py TX;
PyObject *TxError, *TxStaleError;

PyObject *tx_status_error(TreeObject *T, cgt_status st, const char *what) {
  PyErr_Format(TxError, "cgtree.torch: %s: %s (%s)", what, cgt_status_name(st),
               T && T->tree ? cgt_tree_last_error(T->tree) : "");
  return NULL;
}

int tx_warn_pointer_disagreement(const char *way, void *fast, void *ptr) {
  if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                       "cgtree.torch: %s gave data pointer %p where data_ptr() gives %p; "
                       "tensor pointers are read through data_ptr() from now on",
                       way, fast, ptr) < 0)
    return -1;
  return 1;
}

int tx_cache_evict(size_t bytes) {
  static unsigned char *buf;
  static size_t have;
  if (bytes > have) {
    unsigned char *b = tx_realloc(buf, bytes);
    if (!b) {
      PyErr_NoMemory();
      return -1;
    }
    buf = b;
    have = bytes;
  }
  for (size_t i = 0; i < bytes; i += 64)
    buf[i]++;
  return 0;
}

int tx_check_probes(PyObject *probes, Py_ssize_t width, PyTypeObject *t0, PyTypeObject *t1, const char *usage) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(probes); i++) {
    PyObject *p = PyList_GET_ITEM(probes, i);
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != width) {
      PyErr_SetString(PyExc_TypeError, usage);
      return -1;
    }
    for (Py_ssize_t j = 1; j < width; j++) {
      if (!PyLong_Check(PyTuple_GET_ITEM(p, j))) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
      }
      (void)PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, j));
      if (PyErr_Occurred()) /* an address that does not fit a pointer */
        return -1;
    }
    PyTypeObject *tp = Py_TYPE(PyTuple_GET_ITEM(p, 0));
    if (t0 && tp != t0 && tp != t1) { /* the proof must be on the very types the reads will serve */
      PyErr_Format(PyExc_TypeError, "%s: each probe tensor is of one of the types", usage);
      return -1;
    }
  }
  return 0;
}

/* ------------------------------------------------------------ steps
 *
 * Steps in inference. A step begins at each new call of a compiled model
 * (Dynamo's GenerationTracker.generation moved since the tree's last call),
 * at torch.compiler.cudagraph_mark_step_begin() and at step_begin(): the
 * tree goes back to its root, and outputs of the ended step still alive are
 * marked stale (stale.c), since the new step may reuse their memory.
 *
 * Steps in training. A forward's saved activations are outputs too, and
 * its backward (which Dynamo does not enter: no new generation) reads them
 * later; several forwards may come before their backwards (gradient
 * accumulation, two towers, contrastive losses). So a new generation begins
 * a step only when no backward is pending, and what counts pending
 * backwards is the saved activations of this step still alive that their
 * backward has not read (T->saved_alive): autograd frees them when their
 * backward has run or when the graph dies unused, and their backward's
 * read ends the hold of those it keeps (retain_graph, a kept frame,
 * compute-sanitizer's host backtraces of Triton's launches: seg_holds.c,
 * end_holds_read_by_backward), as PyTorch's trees end a pending backward
 * at the backward. A count, not a flag: two forwards then two
 * backwards keep one step until both ran. A forward whose graph a program
 * keeps without ever running its backward would keep the step open for
 * good (so would activations something else keeps alive before their
 * backward ran), and the path would grow by a node per call: after
 * PENDING_GENERATIONS_MAX such calls the step begins anyway, with a warning
 * once, and those activations raise StaleTensorError if a backward comes.
 * The bound is high because a forward may be many compiled calls: an RNN
 * cell unrolled over a sequence, regionally compiled layers, and their
 * checkpointed recomputes inside the backward (at 64 such a forward's
 * backward raised: a helper's audit); PyTorch's trees have none.
 * An explicit mark (cudagraph_mark_step_begin(), step_begin()) always
 * begins a step, as in PyTorch's trees. A backward never begins a step but
 * at such a mark: with compiled autograd Dynamo does enter a frame for it
 * (a new generation), and it still belongs to its forwards' step, whose
 * activations it reads. A call whose argument is an output of the step
 * that requires grad holds the step too (tx_call_reads_grad_output): a
 * backward is to come through that output, though no forward of ours
 * saved anything for it (an inference graph's output that an
 * autograd.Function made its own: reentrant activation checkpointing runs
 * the checkpointed block under no_grad). Such an argument cannot be moved
 * into a new step as other arguments are (stale.c): set_ would cut it from
 * autograd's graph.
 *
 * The optimizer. A compiled optimizer.step() (or gradient clipping) is a
 * new compiled call after the backward, with no backward pending. Beginning
 * a step there would move every gradient out of the pool (see Gradients
 * below), a copy of them all at every step, and would make the step's
 * outputs stale while the program still reads them (the loss a compiled
 * model returned, logged after opt.step()). So after a backward, a new call
 * goes on in the step when it is the step's optimizer: it is no training
 * forward and updates an input in place (the parameters, the optimizer's
 * state), or it reads a live backward output of the step (a .grad). It
 * follows the backward in the path, as forward, backward and optimizer of
 * one training step should; the next training forward, or any other call,
 * begins the next step. Bounded: past the bound a call begins a step:
 * kept gradients move and stay right, but outputs of the step the program
 * still holds (the loss, the norms kept for a log) are marked stale. The
 * bound stops a step that would never end: compiled calls after the last
 * backward that write their inputs (a generation loop's cache after
 * training) would each be a new node of one step; for calls that only
 * write an input it is OPTIMIZER_CALLS_MAX (64), as before, and no
 * warning (at 1024 such a loop recorded a thousand graphs: a review). A
 * call that reads a gradient is bounded at GRADIENT_READS_MAX (1024), with
 * a warning once: a compiled function called once per parameter (Muon's
 * orthogonalisation, a per-parameter norm) makes as many calls as the
 * model has matrices, and at 64 a model of more lost its logged loss (a
 * helper's audit). The step that bound begins is a gradient readers' step.
 *
 * A gradient readers' step. With nothing of the step alive, a call that
 * reads a kept .grad begins a step (free: nothing lives to mark), and later
 * readers of a kept .grad go on in it as in a backward's
 * (T->grad_readers_step; seg_steps.c, belongs_to_training_step, which also
 * tells a repeated call, an analysis loop's, to begin one of its own).
 * Its outputs are an optimizer's: they hold no training forward
 * (tx_tree_note_inference_output).
 *
 * Gradients. A backward's outputs are handed out like any other, so
 * AccumulateGrad takes a gradient over as .grad where .grad was None, as
 * in eager and in PyTorch's trees: no copy, and no second set of
 * gradients. Such a .grad is pool memory of its step; one that outlives the
 * step (gradient accumulation, zero_grad(set_to_none=False), a zero_grad
 * after the next forward) is moved to memory of its own when the step ends
 * (stale.c), before anything could overwrite it, and from then on
 * AccumulateGrad adds into it in place. */
enum { PENDING_GENERATIONS_MAX = 1024 };

/* The step's optimizer calls held so in a row (module.c, "The optimizer"):
 * past them a step begins; with a warning once where the call reads a
 * gradient. */
enum { OPTIMIZER_CALLS_MAX = 64, GRADIENT_READS_MAX = 1024 };

_Thread_local int tx_hash_oomed;

/* Tests: the n-th host allocation of the extension from now fails (0:
 * none), as the host running out of memory there would: every malloc,
 * calloc and realloc of python/_torch_ext goes through these, uthash's
 * tables too, so a test can fail each in turn (the SQLite habit). Python's
 * own allocations and the C library's (cgt__fail_host_alloc_after) are
 * not counted here. */
static _Atomic long host_fail_in;

static int host_alloc_fails(void) {
  return atomic_load(&host_fail_in) > 0 && atomic_fetch_sub(&host_fail_in, 1) == 1;
}

void *tx_malloc(size_t bytes) { return host_alloc_fails() ? NULL : malloc(bytes); }

void *tx_calloc(size_t n, size_t size) { return host_alloc_fails() ? NULL : calloc(n, size); }

void *tx_realloc(void *p, size_t bytes) { return host_alloc_fails() ? NULL : realloc(p, bytes); }

/* _fail_host_alloc(n): the n-th host allocation from now fails; 0 turns it
 * off. Returns how many were still to go before it (0 once it failed one). */
static PyObject *m_fail_host_alloc(PyObject *self, PyObject *arg) {
  (void)self;
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  return PyLong_FromLong(atomic_exchange(&host_fail_in, n < 0 ? 0 : n));
}

/* Activation checkpointing (torch.utils.checkpoint) around a compiled
 * block keeps none of the block's saved activations: its backward
 * recomputes them. So nothing counted in saved_alive tells that the
 * block's backward is still to come, and the next compiled call (the block
 * after it) began a step, marked the block's output it was handed, and
 * raised StaleTensorError where Inductor computes (found on an H100).
 * What tells is the block's output itself: alive, requiring grad, made by
 * a training forward of this step since the last backward call. It is
 * watched through a weak reference to the very tensor handed out, not its
 * storage: `y = f(x).detach()` keeps the storage but drops the output and
 * its graph, and no backward can come. The program's own loop keeps the
 * last output bound past its backward (h = block(x) each iteration), so a
 * backward call ends the watch, as it counts down a plain forward's hold.
 * One kind of output is watched through its memory instead: a view of an
 * intermediate, which AOTAutograd hands the program as a new tensor over
 * our output (_unsafe_view), so that our object dies at once. The
 * forward's compile names them (segment.h, memory_watched), and the drain
 * counts them down as they die (T->forward_memory_watched). */
static void forward_outs_forget(TreeObject *T) {
  if (T->forward_outs && PyList_GET_SIZE(T->forward_outs))
    (void)PyList_SetSlice(T->forward_outs, 0, PyList_GET_SIZE(T->forward_outs), NULL); /* shrinks: cannot fail */
}

int tx_tree_note_forward_output(TreeObject *T, PyObject *out, int by_memory, tx_out_ref *made) {
  if (T->explicit_steps) /* steps begin only at marks: nothing would read the list, or empty it */
    return 0;
  if (by_memory) { /* through the tensor's record, never looked up by its address: a view has none */
    tx_out_ref *r = made;
    if (r && !r->caller_memory && !r->empty && r->step == T->step && r->watched_until != T->backward_calls + 1) {
      r->watched_until = T->backward_calls + 1;
      T->forward_memory_watched++;
    }
    return 0;
  }
  if (!T->forward_outs && !(T->forward_outs = PyList_New(0)))
    return -1;
  PyObject *ref = PyWeakref_NewRef(out, NULL);
  if (!ref)
    return -1;
  int rc = PyList_Append(T->forward_outs, ref);
  Py_DECREF(ref);
  return rc;
}

/* Inference outputs a training forward reads. A frozen teacher or encoder
 * run under no_grad, then a compiled model that trains:
 *
 *     with torch.no_grad():
 *         t = teacher(x)
 *     loss = distill(student(x), t)
 *
 * The student's call comes with no backward pending, so it began a step,
 * marked t, and the loss raised StaleTensorError where Inductor computes
 * (reduce-overhead begins a generation there as well). So an output of an
 * inference graph made in the step before its first backward, while it
 * lives, holds the step for a training forward's call, which is what reads
 * such an output in a training loop. Only for that call: an evaluation
 * loop under no_grad (every call an inference graph, each keeping the last
 * output bound) begins a step at each call as before. Only before the
 * first backward: what runs after it in the step is its optimizer, its
 * gradient clipping or norm, whose outputs a loop keeps for its log, and a
 * hold on them would join every training step to the next; nor in a
 * gradient readers' step, whose calls are those (held there, the next
 * iteration's forward joined it, and its readers reached the bound: a
 * review). Only once:
 * the training forward it held is in the step, and its saved activations
 * hold the step until its backward, so the watches end there. A loop that
 * calls a trainable head many times on one feature made under no_grad,
 * with no backward (Monte Carlo dropout's votes), begins a step at each
 * later call, as before; held at each, it reached the 64-call bound with
 * a warning and a recording per call (a helper's review). A backward call
 * ends the watches too, so the next iteration's teacher call begins a
 * step, and the old t is marked there. Watched through the memory (a
 * detached copy or a view of t holds too), as a training forward's remade
 * outputs are; bounded like every hold.
 *
 * Another call under no_grad between the teacher and the student (a
 * second teacher, the teacher on another crop) is not held: it begins a
 * step that marks t, and the loss raises. Holding such calls after a
 * training step, and in the tree's first step, was tried and taken back:
 * a call under no_grad cannot be told from an evaluation or inference
 * loop's, whose first calls then joined one step, each a node of its own
 * (recorded again, once per call, where one recording served), and a
 * fresh program's first iteration still raised for teachers of one
 * architecture (one graph). */
void tx_tree_note_inference_output(TreeObject *T, tx_out_ref *made) {
  tx_out_ref *r = made;
  if (T->explicit_steps || T->backward_this_step || T->grad_readers_step || !r || r->caller_memory || r->empty ||
      r->step != T->step || r->inference_watch == T->inference_watches_ended + 1)
    return;
  r->inference_watch = T->inference_watches_ended + 1;
  T->inference_memory_watched++;
}

/* Every watch of an inference output ends (the drain counts down only
 * those noted since: inference_watch). */
static void inference_watches_end(TreeObject *T) {
  T->inference_watches_ended++;
  T->inference_memory_watched = 0;
}

/* Every watch of a training forward's output, and of an inference output,
 * ends: at a backward call, and at a step's beginning (the drain counts
 * down only this step's outputs, and after a backward call none noted
 * before it: watched_until). */
static void forward_watches_end(TreeObject *T) {
  forward_outs_forget(T);
  T->forward_memory_watched = 0;
  inference_watches_end(T);
}

void tx_tree_backward_called(TreeObject *T) {
  T->backward_this_step = 1;
  T->backward_calls++;
  forward_watches_end(T);
}

/* 1 if an output noted by tx_tree_note_forward_output lives and requires
 * grad; 0 if none does; -1 with an exception set. */
static int forward_output_pending(TreeObject *T) {
  /* The size is read at each turn: reading requires_grad runs Python
   * (a TorchFunctionMode), which may call into the tree and empty the list. */
  for (Py_ssize_t i = 0; T->forward_outs && i < PyList_GET_SIZE(T->forward_outs); i++) {
    PyObject *t = NULL;
#if PY_VERSION_HEX >= 0x030D0000 /* PyWeakref_GetObject is deprecated from 3.13 */
    if (PyWeakref_GetRef(PyList_GET_ITEM(T->forward_outs, i), &t) < 0)
      return -1;
#else
    t = Py_XNewRef(PyWeakref_GetObject(PyList_GET_ITEM(T->forward_outs, i)));
    if (!t)
      return -1;
    if (t == Py_None)
      Py_CLEAR(t);
#endif
    if (!t) /* dead */
      continue;
    PyObject *rg = PyObject_GetAttr(t, TX.str_requires_grad);
    Py_DECREF(t);
    if (!rg)
      return -1;
    int yes = PyObject_IsTrue(rg);
    Py_DECREF(rg);
    if (yes)
      return yes; /* 1, or -1 */
  }
  forward_outs_forget(T); /* all dead or without grad: none will hold later either */
  return 0;
}

/* The step ends and the next begins: only from a call's sync (step_begin()
 * leaves a mark for it), so a call's arguments move first. -1 with an
 * exception set. */
static int tx_tree_step_begin(TreeObject *T) {
  if (tx_reads_wait_for_calls(T) < 0) /* other threads' calls that read this step's outputs (reads_in_flight.c) */
    return -1;
  tx_out_ref_queue_drain();
  if (tx_stale_mark_step(T) < 0)
    return -1;
  cgt_status st = cgt_step_begin(T->tree); /* from a compiled call, inside its switch of capture mode */
  if (st != CGT_OK) {
    tx_status_error(T, st, "cgt_step_begin");
    return -1;
  }
  T->step++;
  T->step_mark_pending = 0; /* step_begin()'s mark: this is its step */
  T->overwritable += T->alive_this_step;
  T->alive_this_step = 0;
  T->saved_alive = 0; /* their values went stale with the step */
  T->tied_saved_alive = 0;
  forward_watches_end(T);
  T->backward_this_step = 0;
  T->grad_readers_step = 0;
  T->generations_deferred = 0;
  T->optimizer_calls_held = 0;
  T->gradient_reads_held = 0;
  return 0;
}

/* A counter's value (a class attribute), or -1 with an exception set. */
static int read_counter(PyObject *cls, PyObject *name, long long *out) {
  PyObject *g = PyObject_GetAttr(cls, name);
  if (!g)
    return -1;
  *out = PyLong_AsLongLong(g);
  Py_DECREF(g);
  return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* -1, the counters as they were before this call saw them move: the
 * retried call decides again (a mark, in explicit mode, is not lost). */
static int unsee(TreeObject *T, long long gen_before, long long mark_before) {
  T->last_generation = gen_before;
  T->last_mark_step = mark_before;
  return -1;
}

/* tx_tree_step_begin, and if it fails, unsee. */
static int step_begin_or_unsee(TreeObject *T, long long gen_before, long long mark_before) {
  return tx_tree_step_begin(T) == 0 ? 0 : unsee(T, gen_before, mark_before);
}


/* A warning that a step begins by a bound of held calls (n of them); a
 * warning turned error must not break the call. Given, and the forced
 * step counted, once the step began: before it, a begin that a reader's
 * wait refused was counted and announced, and its retry, which began the
 * step, counted it again and said nothing (a review). */
static void warn_bound(const char *fmt, unsigned n) {
  if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, fmt, n) < 0)
    PyErr_Clear();
}

int tx_tree_sync_step(TreeObject *T, int backward, int (*belongs)(void *call), void *call) {
  long long mark = 0, gen = T->last_generation;
  const long long gen_before = T->last_generation, mark_before = T->last_mark_step;
  if (TX.mark_step_cls && read_counter(TX.mark_step_cls, TX.str_mark_step, &mark) < 0)
    return -1;
  if (!T->explicit_steps && read_counter(TX.generation_cls, TX.str_generation, &gen) < 0)
    return -1;
  if (gen == T->last_generation && mark == T->last_mark_step && !T->step_mark_pending)
    return 0;
  int marked = mark != T->last_mark_step || T->step_mark_pending;
  T->last_generation = gen;
  T->last_mark_step = mark;
  /* A compiled call inside a backward, on a tree where only backwards ran
   * (checkpointing's recompute, the first call of a worker's backward where
   * every block is checkpointed and the loss is eager), is that backward's
   * first segment: deferred as a call inside a backward, it never began a
   * step there, and every call was a new node (a review). */
  if (!backward && !marked && !T->ran_other_than_backward && tx_in_a_backward())
    backward = 1;
  if (backward && !marked) {
    /* A backward belongs to its forwards' step, even where Dynamo entered
     * a frame for it. But a tree where only backwards ever ran (autograd's
     * thread's own, for a backward called from a thread that never called
     * a compiled model) has no forward in any step: its one step never
     * ended, and every backward was a new node of one path, run plainly
     * as a warm-up, never recorded or replayed (a helper's audit). There
     * a new generation begins a step once nothing of the step lives but
     * leaves' .grad (accumulation, zero_grad(set_to_none=False)), which
     * the step's end moves, found through the leaves every tree noted,
     * since this one ran no forward (stale.c, move_kept_grads). Kept until
     * then, a .grad held the step for good, and the path grew a node at
     * every backward. Any other gradient alive keeps the step: one that
     * autograd is passing to the next node of a backward under way (a
     * compiled call on another thread moves the generation meanwhile),
     * or one torch.autograd.grad returned and the program keeps; at most
     * PENDING_GENERATIONS_MAX new generations in a row, as any held step,
     * then a step begins, with a warning once, and such a gradient kept
     * raises StaleTensorError. */
    if (T->ran_other_than_backward)
      return 0;
    tx_out_ref_queue_drain();
    /* Saved activations of a recompute made here (checkpointing inside the
     * backward) hold the step under the same bound: kept alive past their
     * backward (a kept frame), they held it for good, a node per call and
     * no warning (a review). */
    int held = T->saved_alive || T->tied_saved_alive;
    int only_grads = held ? 0 : T->alive_this_step ? tx_step_outputs_all_leaf_grads(T) : 1;
    if (only_grads < 0)
      return unsee(T, gen_before, mark_before);
    if (!only_grads && T->generations_deferred < PENDING_GENERATIONS_MAX) {
      T->generations_deferred++;
      T->steps_deferred++;
      return 0;
    }
    if (step_begin_or_unsee(T, gen_before, mark_before) < 0)
      return -1;
    if (!only_grads && ++T->steps_forced == 1)
      warn_bound("cgtree.torch: %u backwards in a row on a thread that never called a compiled model began no "
                 "step because gradients they made that are no leaf's .grad are alive (kept from "
                 "torch.autograd.grad, say), or activations a recompute inside them saved. A step begins now, and "
                 "those tensors raise StaleTensorError from here on: clone the ones you keep.",
                 PENDING_GENERATIONS_MAX);
    return 0;
  }
  /* So does any compiled call autograd's engine makes inside a backward:
   * activation checkpointing's recompute of a compiled block, whose
   * gradient input (a later block's backward's output) lies in this step's
   * outputs. Begun there, a step marked it, and the block's backward
   * raised StaleTensorError where Inductor computes (a helper's audit).
   * Asked only where a step would begin: once a step. Bounded as any
   * step held open; past the bound the rules below hold (a hook that reads
   * a gradient of the step goes on as the step's gradient reader: forced
   * at the bound, a model of 1025 parameters with a compiled hook each
   * lost the last gradients: a review), and where they begin a step, it
   * begins with a warning, counted in steps_forced (it began with none,
   * counted nowhere: a review). */
  int in_backward_past_bound = 0;
  if (!marked && tx_in_a_backward()) {
    if (T->generations_deferred < PENDING_GENERATIONS_MAX) {
      T->generations_deferred++;
      T->steps_deferred++;
      return 0;
    }
    in_backward_past_bound = 1;
  }
  if (!marked && (T->saved_alive || T->forward_memory_watched || T->tied_saved_alive))
    tx_out_ref_queue_drain(); /* activations the backward just freed, outputs just dropped */
  int pending = T->saved_alive || T->forward_memory_watched || T->tied_saved_alive;
  if (!marked && !pending && (pending = forward_output_pending(T)) < 0)
    return unsee(T, gen_before, mark_before);
  if (!marked && !pending && (pending = tx_call_reads_grad_output(T)) < 0)
    return unsee(T, gen_before, mark_before);
  if (!marked && !pending && T->inference_memory_watched && tx_call_is_training_forward(T)) {
    tx_out_ref_queue_drain(); /* outputs just dropped (a no-op where the question above drained) */
    pending = T->inference_memory_watched != 0;
    T->steps_held_for_inference_outputs += (uint64_t)pending;
    inference_watches_end(T); /* once: the forward's own activations hold the step from here */
  }
  int optimizer = 0;
  if (!marked && !pending && (optimizer = belongs(call)) < 0)
    return unsee(T, gen_before, mark_before);
  const int first_reader = optimizer == TX_OPTIMIZER_READS_GRAD_FIRST;
  if (first_reader)
    optimizer = 0; /* it begins a step, in which later readers of a kept .grad go on */
  if (marked || (!pending && !optimizer)) {
    if (step_begin_or_unsee(T, gen_before, mark_before) < 0)
      return -1;
    T->grad_readers_step = first_reader;
    if (in_backward_past_bound && ++T->steps_forced == 1)
      warn_bound("cgtree.torch: %u compiled calls in a row inside backwards (activation checkpointing's "
                 "recomputes, gradient hooks) began no step. A step begins now, and gradients the backward still "
                 "passes on, or outputs of the step the program holds, raise StaleTensorError from here on. Mark "
                 "where your steps end with torch.compiler.cudagraph_mark_step_begin().",
                 PENDING_GENERATIONS_MAX);
    return 0;
  }
  int reads = optimizer == TX_OPTIMIZER_READS_GRAD;
  uint32_t *held = reads ? &T->gradient_reads_held : &T->optimizer_calls_held; /* a count per kind */
  /* A pending backward is bounded by the calls deferred in the step, the
   * optimizer's calls by their own count: a forward of many calls before
   * its backward (an RNN cell unrolled) must leave the optimizer its
   * bound (a review). */
  if (pending ? T->generations_deferred < PENDING_GENERATIONS_MAX
              : *held < (reads ? GRADIENT_READS_MAX : OPTIMIZER_CALLS_MAX)) {
    T->generations_deferred += (uint32_t)(pending != 0);
    *held += (uint32_t)!pending;
    T->steps_deferred += (uint64_t)!optimizer;
    T->steps_kept_after_backward += (uint64_t)(optimizer != 0);
    return 0; /* a backward is pending, or the call is the step's optimizer: the step goes on */
  }
  const unsigned n_held = *held; /* the step's begin sets it to 0 */
  if (step_begin_or_unsee(T, gen_before, mark_before) < 0)
    return -1;
  if (!pending) { /* only optimizer calls held the step: it ends, and kept gradients move */
    T->optimizer_steps_forced++;
    /* Readers of a .grad go on reading kept ones: the step begun is a
     * readers' step, which the next 1024 join (begun plain, each later
     * reader began a step and marked the last one's output: a review). */
    T->grad_readers_step = optimizer == TX_OPTIMIZER_READS_GRAD;
    if (optimizer == TX_OPTIMIZER_READS_GRAD && !T->warned_gradient_reads) {
      T->warned_gradient_reads = 1;
      warn_bound("cgtree.torch: %u calls of compiled models after a backward, each reading a gradient or updating "
                 "an input in place (taken for the step's optimizer), went on in one step (a backward's, or one a call "
                 "that read a kept .grad began). A step "
                 "begins now: gradients kept as .grad move out of the pool and stay right, but outputs of the "
                 "step the program still holds (a loss, norms kept for a log) raise StaleTensorError from here "
                 "on. Mark where your steps end with torch.compiler.cudagraph_mark_step_begin(), or clone what "
                 "you keep.",
                 n_held);
    }
    return 0;
  }
  if (++T->steps_forced == 1)
    warn_bound("cgtree.torch: %u calls of compiled models in a row began no step because backwards of earlier "
               "forwards are pending: their saved activations, or their outputs that require grad (of a view of "
               "an intermediate, its memory: a detached copy too; or an output passed to the calls; or an output "
               "of a graph run under no_grad, before a training forward), are alive, and their backward never "
               "ran, or something keeps them (a kept exception or frame; compute-sanitizer's host backtraces, "
               "which --show-backtrace device turns off). A step begins now, and a later backward of those "
               "forwards raises StaleTensorError. Run forwards whose backward you do not need under "
               "torch.no_grad(), or mark steps with torch.compiler.cudagraph_mark_step_begin().",
               PENDING_GENERATIONS_MAX);
  return 0;
}

void tx_tree_drain(TreeObject *T) {
  (void)T;
  tx_out_ref_queue_drain();
}

/* ------------------------------------------------------------ Tree */

/* Every initialised tree, so that a tree can tell another tree's outputs
 * from its caller's memory (tx_other_trees_output_at). Under the GIL. */
static TreeObject *live_trees;

static void live_list_add(TreeObject *T) {
  if (T->on_live_list)
    return;
  T->live_prev = NULL;
  T->live_next = live_trees;
  if (live_trees)
    live_trees->live_prev = T;
  live_trees = T;
  T->on_live_list = 1;
}

static void live_list_remove(TreeObject *T) {
  if (!T->on_live_list)
    return;
  if (T->live_prev)
    T->live_prev->live_next = T->live_next;
  else
    live_trees = T->live_next;
  if (T->live_next)
    T->live_next->live_prev = T->live_prev;
  T->on_live_list = 0;
}

PyObject *tx_trees_grad_leaves(void) {
  PyObject *all = PyList_New(0);
  for (TreeObject *t = live_trees; all && t; t = t->live_next) {
    PyObject *w;
    Py_ssize_t pos = 0;
    while (t->grad_leaves && PyDict_Next(t->grad_leaves, &pos, NULL, &w))
      if (PyList_Append(all, w) < 0) {
        Py_CLEAR(all);
        break;
      }
  }
  return all;
}

int tx_trees_have_grad_leaves(void) {
  for (TreeObject *t = live_trees; t; t = t->live_next)
    if (t->grad_leaves && PyDict_GET_SIZE(t->grad_leaves))
      return 1;
  return 0;
}

int tx_other_trees_output_at(const TreeObject *T, void *ptr, size_t span) {
  return tx_other_trees_step_output_at(T, ptr, span) != NULL;
}

int tx_live_trees_besides(const TreeObject *T) { return live_trees && (live_trees != T || T->live_next); }

tx_out_ref *tx_other_trees_step_output_at(const TreeObject *T, void *ptr, size_t span) {
  for (TreeObject *t = live_trees; t; t = t->live_next) {
    /* A device's pointers are its own; an idle tree's index outlives its outputs (a review: a lookup each). */
    int other = t != T && t->device == T->device && t->step_outputs;
    tx_out_ref *o = other ? tx_step_output_at(t, ptr, span ? span : 1) : NULL;
    if (o)
      return o;
  }
  return NULL;
}

/* PyArg converters for Tree's counts: an int (or an object with
 * __index__, a numpy integer) that fits, else TypeError for another type
 * (a bool too: True is no count) and ValueError naming the range. The "I"
 * and "K" formats wrap what does not fit (a max_graphs of 2**32 + 1 was a
 * budget of one graph: a helper's hunt). */
static int count_arg(PyObject *o, unsigned long long max, unsigned long long *out) {
  if (PyBool_Check(o) || !PyIndex_Check(o)) {
    PyErr_Format(PyExc_TypeError, "Tree: a count must be an int, not %.100s", Py_TYPE(o)->tp_name);
    return 0;
  }
  PyObject *n = PyNumber_Index(o);
  if (!n)
    return 0;
  unsigned long long v = PyLong_AsUnsignedLongLong(n);
  int fits = !(v == (unsigned long long)-1 && PyErr_Occurred()) && v <= max;
  PyErr_Clear();
  if (fits) {
    *out = v;
  } else {
    PyObject *text = PyObject_Str(n);
    if (text)
      PyErr_Format(PyExc_ValueError, "Tree: a count must be from 0 to %llu, not %U", max, text);
    Py_XDECREF(text);
  }
  Py_DECREF(n);
  return fits;
}

static int u32_arg(PyObject *o, void *out) {
  unsigned long long v;
  if (!count_arg(o, UINT32_MAX, &v))
    return 0;
  *(unsigned int *)out = (unsigned int)v;
  return 1;
}

static int u64_arg(PyObject *o, void *out) {
  return count_arg(o, ULLONG_MAX, out);
}

static int tree_init(TreeObject *T, PyObject *a, PyObject *kw) {
  static char *kwlist[] = {"device", "warmup_runs", "rerecord_limit", "backend", "time_launches", "stream",
                           "max_graphs", "max_graph_bytes", "nonblocking", NULL};
  int device = 0, time_launches = 0, nonblocking = 0;
  unsigned int warmup = 1, rerecord = 0, max_graphs = 0;
  unsigned long long max_graph_bytes = 0;
  const char *backend = "cuda";
  PyObject *stream_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(a, kw, "i|O&O&spOO&O&p", kwlist, &device, u32_arg, &warmup, u32_arg, &rerecord,
                                   &backend, &time_launches, &stream_obj, u32_arg, &max_graphs, u64_arg,
                                   &max_graph_bytes, &nonblocking))
    return -1;
  if (nonblocking && stream_obj != Py_None) {
    PyErr_SetString(PyExc_ValueError, "Tree: stream and nonblocking=True: a stream handed in is the caller's");
    return -1;
  }
  void *given_stream = NULL;
  if (stream_obj != Py_None) {
    given_stream = PyLong_AsVoidPtr(stream_obj);
    if (PyErr_Occurred())
      return -1;
  }
  if (T->tree) {
    PyErr_SetString(PyExc_RuntimeError, "Tree is already initialised");
    return -1;
  }
  if (!TX.generation_cls) {
    PyErr_SetString(PyExc_RuntimeError, "cgtree._torch_ext.init_hot_path() was not called");
    return -1;
  }
  int sim = strcmp(backend, "sim") == 0;
  if (!sim && strcmp(backend, "cuda") != 0) {
    PyErr_Format(PyExc_ValueError, "backend must be 'cuda' or 'sim' (tests), not '%s'", backend);
    return -1;
  }
  cgt_options o;
  cgt_options_init(&o);
  o.backend = sim ? CGT_BACKEND_SIM : CGT_BACKEND_CUDA;
  o.device = device;
  o.warmup_runs = warmup;
  o.time_launches = (uint32_t)time_launches;
  void *made_stream = NULL; /* nonblocking on CUDA: a stream of its own, which the tree destroys at its close */
  if (nonblocking && !sim) {
    made_stream = tx_dev_stream_create(device);
    if (!made_stream) {
      PyErr_Format(TxError, "cgtree.torch: cudaStreamCreateWithFlags (device %d) failed", device);
      return -1;
    }
    given_stream = made_stream;
  }
  o.stream = given_stream; /* NULL: the tree makes its own blocking stream */
  o.max_graphs = max_graphs; /* the recording budget (0: none); cgt_tree_create refuses nonsense */
  o.max_graph_bytes = (size_t)max_graph_bytes;
  if (rerecord)
    o.rerecord_limit = rerecord;
  cgt_status st = cgt_tree_create(&o, &T->tree);
  if (st != CGT_OK) {
    PyErr_Format(st == CGT_ERR_INVALID_ARGUMENT ? PyExc_ValueError : TxError,
                 "cgtree.torch: cgt_tree_create (%s, device %d): %s", backend, device, cgt_status_name(st));
    T->tree = NULL;
    tx_dev_stream_destroy(made_stream, device);
    return -1;
  }
  T->device = device;
  T->stream = cgt_tree_stream(T->tree); /* from here on a made stream goes with the tree (tree_dealloc) */
  T->stream_made = made_stream ? TX_STREAM_MADE_HERE : given_stream ? TX_STREAM_HANDED_IN : TX_STREAM_MADE_BY_TREE;
  T->owner_thread = PyThread_get_thread_ident();
  T->readers_seen = tx_pool_readers_generation(); /* no output of it can have been read before */
  T->on_simulator = sim;
  T->timed = time_launches != 0;
  TX.any_timed |= T->timed;
  (void)cgt_tree_set_reclaim(T->tree, tx_alloc_reclaim, T); /* refused only inside a launch */
  T->device_obj = PyLong_FromLong(device);
  if (!T->device_obj)
    return -1;
  T->blocking = given_stream == NULL && !nonblocking; /* any other is ordered with events */
  if (!sim) {
    T->ev_in = tx_event_create_on(device, 0); /* the tree's device, whichever is current */
    T->ev_out = tx_event_create_on(device, 0);
    if (!T->ev_in || !T->ev_out) {
      PyErr_SetString(TxError, "cgtree.torch: cudaEventCreate failed");
      return -1;
    }
  }
  if (read_counter(TX.generation_cls, TX.str_generation, &T->last_generation) < 0)
    return -1;
  if (TX.mark_step_cls && read_counter(TX.mark_step_cls, TX.str_mark_step, &T->last_mark_step) < 0)
    return -1;
  live_list_add(T);
  return 0;
}

void tx_tree_destroy_c(TreeObject *T) {
  (void)cgt_sync(T->tree); /* its stream's work is over: its blocks may be retired */
  for (TreeObject *t = live_trees; t; t = t->live_next) /* its reads of their outputs are done too */
    if (t != T)
      tx_pool_readers_forget_stream(t, T->stream);
  if (T->stream_made != TX_STREAM_HANDED_IN) /* a stream destroyed below; one handed in stays its maker's */
    tx_eager_retire_stream(T->on_simulator ? -1 : T->device, T->stream);
  tx_alloc_note_pool_in_use(&T->pool_in_use_reported, 0);
  cgt_tree_destroy(T->tree); /* and the stream, if the C tree made it */
  T->tree = NULL;
  if (T->stream_made == TX_STREAM_MADE_HERE) /* made for explicit mode: ours to destroy, after the tree */
    tx_dev_stream_destroy(T->stream, T->device);
}

static void tree_dealloc(TreeObject *T) {
  live_list_remove(T);
  /* A closed tree's husk, a tree that failed to initialise, or a test's
   * tree that made no output get here: a segment's run holds the tree it
   * runs in, and an output's record keeps it open (T->out_refs). */
  if (T->tree && !T->registry && T->outputs_made == 0) {
    int capture_mode = tx_dev_ignore_other_captures(); /* as tree_close: another thread's capture stays whole */
    tx_tree_destroy_c(T);
    tx_dev_heed_other_captures(capture_mode);
  }
  tx_event_destroy(T->ev_in); /* NULL once closed */
  tx_event_destroy(T->ev_out);
  free(T->runs);
  tx_pool_readers_tree_free(T);
  tx_step_outputs_free(T);
  Py_XDECREF(T->device_obj);
  Py_XDECREF(T->grad_leaves);
  tx_kept_grads_free(T);
  Py_XDECREF(T->forward_outs);
  Py_TYPE(T)->tp_free((PyObject *)T);
}

static int tree_ready(TreeObject *T) {
  if (!T->tree) {
    if (T->closed)
      PyErr_SetString(TxError, "cgtree.torch: this tree was freed (its thread exited)");
    else
      PyErr_SetString(PyExc_RuntimeError, "Tree is not initialised");
    return 0;
  }
  return 1;
}

/* step_begin(): the step begins at this tree's next call, as at
 * PyTorch's mark (a counter the next call reads). Begun here, it marked
 * the outputs a program passes to that call, in explicit mode the thread's
 * x = f(x) loop, where the mark moves them (a helper's audit). Until that
 * call nothing of the tree runs, so every output still holds its data. */
static PyObject *tree_step_begin(TreeObject *T, PyObject *unused) {
  (void)unused;
  if (!tree_ready(T))
    return NULL;
  T->step_mark_pending = 1;
  Py_RETURN_NONE;
}

static PyObject *tree_sync(TreeObject *T, PyObject *unused) {
  (void)unused;
  if (!tree_ready(T))
    return NULL;
  int capture_mode = tx_dev_ignore_other_captures(); /* another thread's capture stays whole (dev.c) */
  cgt_status st = cgt_sync(T->tree);
  tx_dev_heed_other_captures(capture_mode);
  if (st != CGT_OK)
    return tx_status_error(T, st, "cgt_sync");
  Py_RETURN_NONE;
}

/* The counters of tree T as a dict (s: its C tree's, alive: its outputs the
 * program holds); T NULL: every counter 0, for a process with no tree yet. */
static PyObject *stats_dict(const TreeObject *T, const cgt_stats *s, uint64_t alive) {
  static const TreeObject none;
  if (!T)
    T = &none;
  PyObject *d = PyDict_New();
  if (!d)
    return NULL;
#define PUT(name, v)                                                                                              \
  do {                                                                                                            \
    PyObject *x = PyLong_FromUnsignedLongLong((unsigned long long)(v));                                          \
    if (!x || PyDict_SetItemString(d, name, x) < 0) {                                                             \
      Py_XDECREF(x);                                                                                              \
      Py_DECREF(d);                                                                                               \
      return NULL;                                                                                                \
    }                                                                                                             \
    Py_DECREF(x);                                                                                                 \
  } while (0);
#define U64(f) PUT(#f, s->f)
#define SIZE(f) PUT(#f, s->f)
  CGT_STATS_FIELDS(U64, SIZE)
#undef U64
#undef SIZE
  PUT("step", T->step)
  PUT("outputs_made", T->outputs_made)
  PUT("stale_refused", T->stale_refused)
  PUT("outputs_tied", T->outputs_tied)
  PUT("outputs_tied_apart", T->outputs_tied_apart)
  PUT("outputs_viewing_values", T->outputs_viewing_values)
  PUT("outputs_overwritable", T->overwritable)
  PUT("outputs_marked_stale", T->marked_stale)
  PUT("saved_activations_alive", T->saved_alive)
  PUT("saved_tied_to_outputs_alive", T->tied_saved_alive)
  PUT("forward_outputs_watched",
      (T->forward_outs ? (uint64_t)PyList_GET_SIZE(T->forward_outs) : 0) + T->forward_memory_watched)
  PUT("inference_outputs_watched", T->inference_memory_watched)
  PUT("steps_held_for_inference_outputs", T->steps_held_for_inference_outputs)
  PUT("steps_deferred", T->steps_deferred)
  PUT("steps_kept_after_backward", T->steps_kept_after_backward)
  PUT("steps_forced", T->steps_forced)
  PUT("optimizer_steps_forced", T->optimizer_steps_forced)
  PUT("gradients_moved", T->grads_moved)
  PUT("arguments_moved", T->args_moved)
  PUT("gradient_leaves", T->grad_leaves ? PyDict_GET_SIZE(T->grad_leaves) : 0)
  PUT("outputs_alive", alive)
#undef PUT
  return d;
}

static PyObject *tree_stats(TreeObject *T, PyObject *unused) {
  (void)unused;
  if (T->closed) { /* its counters at its close; what it held then is gone */
    cgt_stats s = T->last_stats;
    s.nodes = s.graphs = 0;
    s.pool_reserved_bytes = s.pool_allocated_bytes = s.graph_bytes = 0;
    return stats_dict(T, &s, 0);
  }
  if (!tree_ready(T))
    return NULL;
  tx_out_ref_queue_drain();
  cgt_stats s;
  cgt_status st = cgt_tree_stats(T->tree, &s);
  if (st != CGT_OK)
    return tx_status_error(T, st, "cgt_tree_stats");
  return stats_dict(T, &s, HASH_COUNT(T->registry)); /* outputs held by the program */
}

static PyObject *m_zero_stats(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  static const cgt_stats zero;
  return stats_dict(NULL, &zero, 0);
}

static PyObject *tree_nodes(TreeObject *T, PyObject *unused) {
  (void)unused;
  if (!tree_ready(T))
    return NULL;
  size_t count = 0;
  cgt_status st = cgt_tree_nodes(T->tree, NULL, 0, &count);
  if (st != CGT_OK)
    return tx_status_error(T, st, "cgt_tree_nodes");
  cgt_node_info *info = tx_calloc(count ? count : 1, sizeof *info);
  if (!info)
    return PyErr_NoMemory();
  st = cgt_tree_nodes(T->tree, info, count, &count);
  if (st != CGT_OK) {
    free(info);
    return tx_status_error(T, st, "cgt_tree_nodes");
  }
  PyObject *list = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; list && i < count; i++) {
    cgt_node_info *n = &info[i];
    PyObject *d = Py_BuildValue("{s:I,s:I,s:I,s:s,s:K,s:s,s:K,s:K,s:n,s:s}", "id", n->id, "parent", n->parent,
                                "depth", n->depth, "segment", n->segment_name ? n->segment_name : "",
                                "variant", (unsigned long long)n->variant, "state", cgt_node_state_name(n->state),
                                "replays", (unsigned long long)n->replays, "eager_runs",
                                (unsigned long long)n->eager_runs, "pool_bytes_live", (Py_ssize_t)n->pool_bytes_live,
                                "reason", n->reason ? n->reason : "");
    if (!d) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, d);
  }
  free(info);
  return list;
}

static PyObject *tree_dot(TreeObject *T, PyObject *path) {
  if (!tree_ready(T))
    return NULL;
  const char *p = PyUnicode_AsUTF8(path);
  if (!p)
    return NULL;
  FILE *f = fopen(p, "w");
  if (!f)
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, p);
  cgt_status st = cgt_tree_write_dot(T->tree, f);
  fclose(f);
  if (st != CGT_OK)
    return tx_status_error(T, st, "cgt_tree_write_dot");
  Py_RETURN_NONE;
}

static PyObject *tree_check(TreeObject *T, PyObject *unused) {
  (void)unused;
  if (!tree_ready(T))
    return NULL;
  cgt_status st = cgt_tree_check(T->tree);
  if (st != CGT_OK)
    return tx_status_error(T, st, "cgt_tree_check");
  if (tx_step_outputs_check(T) < 0) {
    PyErr_SetString(TxError, "cgtree.torch: the step's outputs and their index by address disagree");
    return NULL;
  }
  if (tx_step_holds_check(T) < 0) {
    PyErr_Format(TxError,
                 "cgtree.torch: the holds of the step's outputs disagree with the tree's counts "
                 "(saved_activations_alive %llu, saved_tied_to_outputs_alive %llu)",
                 (unsigned long long)T->saved_alive, (unsigned long long)T->tied_saved_alive);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *tree_get_stream(TreeObject *T, void *c) {
  (void)c;
  return PyLong_FromVoidPtr(T->stream);
}
static PyObject *tree_get_step(TreeObject *T, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(T->step);
}

static PyObject *tree_get_explicit(TreeObject *T, void *c) {
  (void)c;
  return PyBool_FromLong(T->explicit_steps);
}

static int tree_set_explicit(TreeObject *T, PyObject *v, void *c) {
  (void)c;
  int on = v ? PyObject_IsTrue(v) : -1;
  if (on < 0) {
    if (!v)
      PyErr_SetString(PyExc_TypeError, "explicit_steps cannot be deleted");
    return -1;
  }
  T->explicit_steps = on;
  return 0;
}

static PyObject *tree_orphan(TreeObject *T, PyObject *unused) {
  (void)unused;
  if (!T->tree && !T->closed) {
    PyErr_SetString(PyExc_RuntimeError, "Tree is not initialised");
    return NULL;
  }
  if (tx_tree_orphan(T) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* Tests: the simulator's device holds at most `limit` bytes (SIZE_MAX: no limit). */
static PyObject *tree_sim_set_device_limit(TreeObject *T, PyObject *arg) {
  if (!tree_ready(T))
    return NULL;
  size_t limit = PyLong_AsSize_t(arg);
  if (limit == (size_t)-1 && PyErr_Occurred())
    return NULL;
  cgt_status st = cgt_sim_set_device_limit(T->tree, limit);
  if (st != CGT_OK)
    return tx_status_error(T, st, "cgt_sim_set_device_limit");
  Py_RETURN_NONE;
}

static PyMethodDef tree_methods[] = {
    {"step_begin", (PyCFunction)tree_step_begin, METH_NOARGS, "Begin a step at the next call: outputs still alive become stale there (those it takes move)."},
    {"sync", (PyCFunction)tree_sync, METH_NOARGS, "Wait for the tree's stream."},
    {"stats", (PyCFunction)tree_stats, METH_NOARGS, "cgt_tree_stats as a dict, plus the backend's counters."},
    {"nodes", (PyCFunction)tree_nodes, METH_NOARGS, "cgt_tree_nodes as a list of dicts."},
    {"write_dot", (PyCFunction)tree_dot, METH_O, "Write the tree as Graphviz to a path."},
    {"check", (PyCFunction)tree_check, METH_NOARGS,
     "cgt_tree_check, the step's outputs against their index, and their holds against the tree's counts: raise if an invariant is broken."},
    {"orphan", (PyCFunction)tree_orphan, METH_NOARGS,
     "Its thread exited: free the tree (graphs, pools, stream) once no output of it lives and no capture is "
     "open (tree_close.c). No call may come to it afterwards."},
    {"sim_set_device_limit", (PyCFunction)tree_sim_set_device_limit, METH_O,
     "tests: the simulator's device holds at most this many bytes (2**64 - 1: no limit); a CUDA tree refuses"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tree_getset[] = {
    {"stream", (getter)tree_get_stream, NULL, "the tree's cudaStream_t as an int", NULL},
    {"step", (getter)tree_get_step, NULL, "steps begun so far", NULL},
    {"explicit_steps", (getter)tree_get_explicit, (setter)tree_set_explicit,
     "False: a step begins at every call of a compiled model (Dynamo's counter moved); True: only at step_begin() "
     "and torch.compiler.cudagraph_mark_step_begin()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* Plain fields, read only but owner_thread. */
static PyMemberDef tree_members[] = {
    {"device", T_INT, offsetof(TreeObject, device), READONLY, "CUDA device ordinal"},
    {"closed", T_BOOL, offsetof(TreeObject, closed), READONLY,
     "True once the tree was freed (orphan()); stats() then gives its counters at that moment"},
    {"orphaned", T_BOOL, offsetof(TreeObject, orphaned), READONLY, "True once orphan() was called"},
    {"owner_thread", T_ULONG, offsetof(TreeObject, owner_thread), 0,
     "the thread whose tree it is (threading.get_ident(); the making thread by default): only that thread "
     "caches it as its tree"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject TreeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cgtree._torch_ext.Tree",
    .tp_basicsize = sizeof(TreeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The cgtree tree of one CUDA device, shared by every compiled graph on it.",
    .tp_init = (initproc)tree_init,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)tree_dealloc,
    .tp_methods = tree_methods,
    .tp_getset = tree_getset,
    .tp_members = tree_members,
};

/* ------------------------------------------------------- functions */

static PyObject *m_init_hot_path(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *from_dlpack, *raw_stream, *gen_cls, *tensor_type, *data_ptr = Py_None, *blas_clear = Py_None,
           *ptrs_equal = Py_None, *storage_mark = Py_None, *mark_step_cls = Py_None, *oom_error = Py_None;
  if (!PyArg_ParseTuple(args, "OOOO|OOOOOO", &from_dlpack, &raw_stream, &gen_cls, &tensor_type, &data_ptr,
                        &blas_clear, &ptrs_equal, &storage_mark, &mark_step_cls, &oom_error))
    return NULL;
  if (oom_error != Py_None && !(PyType_Check(oom_error) && PyType_IsSubtype((PyTypeObject *)oom_error,
                                                                            (PyTypeObject *)PyExc_Exception))) {
    PyErr_SetString(PyExc_TypeError, "init_hot_path: oom_error must be an exception class (torch.OutOfMemoryError)");
    return NULL;
  }
  Py_CLEAR(TX.oom_error);
  if (oom_error != Py_None)
    TX.oom_error = Py_NewRef(oom_error);
  Py_CLEAR(TX.mark_step_cls);
  if (mark_step_cls != Py_None)
    TX.mark_step_cls = Py_NewRef(mark_step_cls);
  Py_CLEAR(TX.storage_mark);
  if (storage_mark != Py_None)
    TX.storage_mark = Py_NewRef(storage_mark);
  Py_CLEAR(TX.data_ptr);
  Py_CLEAR(TX.blas_clear);
  Py_CLEAR(TX.ptrs_equal);
  if (ptrs_equal != Py_None)
    TX.ptrs_equal = Py_NewRef(ptrs_equal);
  if (data_ptr != Py_None)
    TX.data_ptr = Py_NewRef(data_ptr);
  if (blas_clear != Py_None)
    TX.blas_clear = Py_NewRef(blas_clear);
  Py_XSETREF(TX.from_dlpack, Py_NewRef(from_dlpack));
  Py_XSETREF(TX.raw_stream, Py_NewRef(raw_stream));
  Py_XSETREF(TX.generation_cls, Py_NewRef(gen_cls));
  Py_XSETREF(TX.tensor_type, Py_NewRef(tensor_type));
  Py_RETURN_NONE;
}

/* *slot = fn, a callable, or NULL for None: 0; -1 with TypeError naming
 * `usage` for anything else (nothing changed). */
static int set_callable_or_none(PyObject **slot, PyObject *fn, const char *usage) {
  if (fn != Py_None && !PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
  }
  Py_CLEAR(*slot);
  if (fn != Py_None)
    *slot = Py_NewRef(fn);
  return 0;
}

static PyObject *m_set_output_mover(PyObject *m, PyObject *fn) {
  (void)m;
  if (set_callable_or_none(&TX.output_mover, fn,
                           "set_output_mover(fn): fn(list of tensors) -> list of bools (each moved out of the pool), or None") < 0)
    return NULL;
  Py_RETURN_NONE;
}

static PyObject *m_set_grad_node_kind(PyObject *m, PyObject *fn) {
  (void)m;
  if (set_callable_or_none(&TX.grad_node_kind, fn,
                           "set_grad_node_kind(fn): fn(autograd node type) -> 0 (stop), 1 (AccumulateGrad) or 2 "
                           "(passes its gradient on), or None") < 0)
    return NULL;
  Py_CLEAR(TX.grad_node_kinds); /* the old function's answers */
  Py_RETURN_NONE;
}

static PyObject *m_set_graph_task_id(PyObject *m, PyObject *fn) {
  (void)m;
  if (set_callable_or_none(&TX.graph_task_id, fn,
                           "set_graph_task_id(fn): fn() -> int (-1 outside a backward), or None") < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* 1 while autograd's engine runs a backward on this thread (a compiled
 * call from inside it: activation checkpointing's recompute, a gradient
 * hook); 0 if not, or if nothing can tell (no error is left set). */
int tx_in_a_backward(void) {
  if (!TX.graph_task_id)
    return 0;
  PyObject *id = PyObject_CallNoArgs(TX.graph_task_id);
  long long task = id ? PyLong_AsLongLong(id) : -1;
  Py_XDECREF(id);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  return task != -1;
}

static PyObject *m_set_tree_getter(PyObject *m, PyObject *fn) {
  (void)m;
  if (set_callable_or_none(&TX.tree_for, fn, "set_tree_getter(fn): fn(device) -> Tree, or None") < 0)
    return NULL;
  TX.tree_epoch++;
  Py_RETURN_NONE;
}

/* One more reference to o, which nothing here releases: for a holder that
 * releases a reference it was never given (_install.py, _stash_in_tls). */
static PyObject *m_give_reference(PyObject *m, PyObject *o) {
  (void)m;
  Py_INCREF(o);
  Py_RETURN_NONE;
}

/* One figure of alloc_figures: its key and its value. */
typedef struct figure {
  const char *key;
  unsigned long long value;
} figure;

static PyObject *m_alloc_figures(PyObject *m, PyObject *args) {
  (void)m;
  int device = 0;
  if (!PyArg_ParseTuple(args, "|i", &device))
    return NULL;
  tx_alloc_figures f;
  tx_alloc_figures_get(&f);
  tx_eager_figures e;
  tx_eager_figures_get(device, &e);
  uint64_t reader_streams, reader_waits, reader_waits_put_off, reader_waits_for_calls, reads_rechecked;
  tx_pool_readers_figures(&reader_streams, &reader_waits, &reader_waits_put_off);
  tx_reads_figures(&reader_waits_for_calls, &reads_rechecked);
  uint64_t records_refused, records_refused_synced;
  tx_alloc_records_refused(&records_refused, &records_refused_synced);
  const figure figures[] = {
      {"pool_in_use", f.pool_in_use},
      {"combined_peak", f.combined_peak},
      {"eager_in_use", f.eager_in_use},
      {"eager_peak", f.eager_peak},
      {"pool_allocs", f.pool_allocs},
      {"pool_frees_in_launch", f.pool_frees_in_launch},
      {"pool_frees_ignored", f.pool_frees_ignored},
      {"pool_alloc_failures", f.pool_alloc_failures},
      {"pool_alloc_retries", f.pool_alloc_retries},
      {"device_in_use", e.in_use},
      {"device_reserved", e.reserved},
      {"device_reserved_peak", e.reserved_peak},
      {"eager_allocations", e.allocations},
      {"eager_frees", e.frees},
      {"eager_live_blocks", e.live_blocks},
      {"driver_allocations", e.driver_allocations},
      {"driver_frees", e.driver_frees},
      {"front_cache_hits", e.front_hits},
      {"front_cache_returns", e.front_returns},
      {"front_cache_bytes", e.front_bytes},
      {"front_cache_blocks", e.front_blocks},
      {"front_cache_limit", e.front_limit},
      {"num_alloc_retries", e.num_alloc_retries},
      {"num_ooms", e.num_ooms},
      {"recorded_streams", e.recorded_streams},
      {"records_refused", records_refused},
      {"records_refused_synced", records_refused_synced},
      {"pool_reader_streams", reader_streams},
      {"pool_reader_waits", reader_waits},
      {"pool_reader_waits_put_off", reader_waits_put_off},
      {"pool_reader_waits_for_calls", reader_waits_for_calls},
      {"pool_reader_reads_rechecked", reads_rechecked},
      {"deferred_frees", e.deferred_frees},
      {"blocks_rehomed", e.blocks_rehomed},
      {"capture_allocations", e.capture_allocations},
      {"capture_free_nodes", e.capture_free_nodes},
      {"frees_waiting_capture", e.frees_waiting_capture},
      {"trims_without_sync", e.trims_without_sync},
      {"driver_alloc_errors", e.driver_alloc_errors},
      {"events_live", tx_events_live()},
      {"trees_freed", tx_trees_closed()},
  };
  PyObject *out = PyDict_New();
  for (size_t i = 0; out && i < sizeof figures / sizeof figures[0]; i++) {
    PyObject *v = PyLong_FromUnsignedLongLong(figures[i].value);
    if (!v || PyDict_SetItemString(out, figures[i].key, v) < 0)
      Py_CLEAR(out);
    Py_XDECREF(v);
  }
  return out;
}

static PyObject *m_reset_peak(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  tx_alloc_reset_peak();
  tx_dev_pool_reset_peaks();
  Py_RETURN_NONE;
}

/* The simulator's captures: sim_capture(stream, id) says that stream
 * captures capture `id` (0: no longer) for device -1. */
static PyObject *m_sim_capture(PyObject *m, PyObject *args) {
  (void)m;
  unsigned long long stream = 0, id = 0;
  if (!PyArg_ParseTuple(args, "KK", &stream, &id))
    return NULL;
  if (!stream) {
    PyErr_SetString(PyExc_ValueError, "sim_capture: the legacy stream (0) never captures");
    return NULL;
  }
  if (!tx_dev_sim_set_capture((void *)(uintptr_t)stream, id)) {
    PyErr_SetString(PyExc_RuntimeError, "sim_capture: too many simulated captures at once");
    return NULL;
  }
  Py_RETURN_NONE;
}

/* sim_fail_pool_allocs(error, count): device -1's next `count` allocations
 * from the driver's pool fail with CUDA error `error` (a test's). */
static PyObject *m_sim_fail_pool_allocs(PyObject *m, PyObject *args) {
  (void)m;
  int error = 0, count = 0;
  if (!PyArg_ParseTuple(args, "ii", &error, &count))
    return NULL;
  tx_dev_sim_fail_pool_allocs(error, count);
  Py_RETURN_NONE;
}

/* What this thread's last refused allocation raises (oom.cc's text). */
static PyObject *m_refusal_text(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  char text[512];
  tx_alloc_refusal_text(text, sizeof text);
  return PyUnicode_FromString(text);
}

static PyObject *m_capture_id(PyObject *m, PyObject *args) {
  (void)m;
  int device = 0;
  unsigned long long stream = 0;
  if (!PyArg_ParseTuple(args, "iK", &device, &stream))
    return NULL;
  return PyLong_FromUnsignedLongLong(tx_dev_capture_id(device, (void *)(uintptr_t)stream));
}

static PyObject *m_eager_serial(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  return PyLong_FromUnsignedLongLong(tx_eager_serial());
}

static PyObject *m_eager_held(PyObject *m, PyObject *arg) {
  (void)m;
  unsigned long long since = PyLong_AsUnsignedLongLong(arg);
  if (since == (unsigned long long)-1 && PyErr_Occurred())
    return NULL;
  size_t n = tx_eager_held(since, NULL, NULL, NULL, 0);
  size_t *sizes = tx_malloc((n + 1) * sizeof *sizes);
  uint64_t *serials = tx_malloc((n + 1) * sizeof *serials);
  void **ptrs = tx_malloc((n + 1) * sizeof *ptrs);
  if (!sizes || !serials || !ptrs) {
    free(sizes), free(serials), free(ptrs);
    return PyErr_NoMemory();
  }
  n = tx_eager_held(since, sizes, serials, ptrs, n);
  PyObject *out = PyList_New(0);
  for (size_t i = 0; out && i < n; i++) {
    PyObject *t = Py_BuildValue("(nKN)", (Py_ssize_t)sizes[i], (unsigned long long)serials[i],
                                PyLong_FromVoidPtr(ptrs[i]));
    if (!t || PyList_Append(out, t) < 0)
      Py_CLEAR(out);
    Py_XDECREF(t);
  }
  free(sizes), free(serials), free(ptrs);
  return out;
}

static PyObject *m_empty_cache(PyObject *m, PyObject *args) {
  (void)m;
  int device = 0;
  if (!PyArg_ParseTuple(args, "i", &device))
    return NULL;
  tx_trees_close_pending(); /* trees of exited threads that nothing names any more */
  tx_eager_trim(device, tx_alloc_idle());
  Py_RETURN_NONE;
}

static PyObject *m_record_stream(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *ptr_obj, *stream_obj;
  if (!PyArg_ParseTuple(args, "OO", &ptr_obj, &stream_obj))
    return NULL;
  void *ptr = PyLong_AsVoidPtr(ptr_obj), *stream = PyLong_AsVoidPtr(stream_obj);
  if (PyErr_Occurred())
    return NULL;
  int rc = tx_alloc_record_stream(ptr, stream);
  if (rc < 0)
    return PyErr_NoMemory();
  return PyBool_FromLong(rc);
}

static PyObject *m_set_cache_bytes(PyObject *m, PyObject *arg) {
  (void)m;
  unsigned long long n = PyLong_AsUnsignedLongLong(arg);
  if (n == (unsigned long long)-1 && PyErr_Occurred())
    return NULL;
  tx_eager_set_cache_bytes(n);
  Py_RETURN_NONE;
}

static PyObject *m_set_front_cache_bytes(PyObject *m, PyObject *arg) {
  (void)m;
  size_t n = PyLong_AsSize_t(arg);
  if (n == (size_t)-1 && PyErr_Occurred())
    return NULL;
  tx_eager_set_front_bytes(n);
  Py_RETURN_NONE;
}

/* set_read_wait_warning(seconds): when a step's end that waits for
 * another thread's call warns (reads_in_flight.c); 0: never. The bound
 * before, in seconds. */
static PyObject *m_set_read_wait_warning(PyObject *m, PyObject *arg) {
  (void)m;
  double seconds = PyFloat_AsDouble(arg);
  if (seconds == -1.0 && PyErr_Occurred())
    return NULL;
  if (!(seconds >= 0.0 && seconds <= 1e9)) /* NaN too */
    return PyErr_Format(PyExc_ValueError, "set_read_wait_warning: seconds must be >= 0 and at most 1e9, not %R",
                        arg);
  uint64_t ms = (uint64_t)(seconds * 1000.0 + 0.5);
  if (seconds > 0.0 && ms == 0)
    ms = 1; /* a bound below a millisecond is not "never" */
  return PyFloat_FromDouble((double)tx_reads_set_warn_after_ms(ms) / 1000.0);
}

static void noop_deleter(DLManagedTensor *m) { free(m); }

static void alias_capsule_destructor(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) {
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m)
      m->deleter(m);
  }
}

/* alias_capsule(ptr, shape, strides, code, bits, device, offset_bytes=0): a
 * DLPack capsule over memory the caller owns (a pool placeholder during a
 * launch); the tensor torch makes from it frees nothing. Its data begins at
 * ptr, its storage offset_bytes before (the caller's tensor's storage
 * offset, so that the graph sees the layout the plain call would). */
static PyObject *m_alias_capsule(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *pp, *shape, *strides;
  int code, bits, device;
  long long offset_bytes = 0;
  if (!PyArg_ParseTuple(args, "OO!O!iii|L", &pp, &PyTuple_Type, &shape, &PyTuple_Type, &strides, &code, &bits,
                        &device, &offset_bytes))
    return NULL;
  if (offset_bytes < 0) {
    PyErr_SetString(PyExc_ValueError, "offset_bytes is a storage offset in bytes: 0 or more");
    return NULL;
  }
  Py_ssize_t nd = PyTuple_GET_SIZE(shape);
  if (PyTuple_GET_SIZE(strides) != nd) {
    PyErr_SetString(PyExc_ValueError, "shape and strides differ in length");
    return NULL;
  }
  void *ptr = PyLong_AsVoidPtr(pp);
  if (PyErr_Occurred())
    return NULL;
  DLManagedTensor *mt = tx_malloc(sizeof *mt + 2 * (size_t)nd * sizeof(int64_t));
  if (!mt)
    return PyErr_NoMemory();
  int64_t *dims = (int64_t *)(mt + 1);
  for (Py_ssize_t i = 0; i < nd; i++) {
    dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    dims[nd + i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
  }
  if (PyErr_Occurred()) {
    free(mt);
    return NULL;
  }
  memset(&mt->dl_tensor, 0, sizeof mt->dl_tensor);
  mt->dl_tensor.data = (char *)ptr - offset_bytes;
  mt->dl_tensor.byte_offset = (uint64_t)offset_bytes;
  mt->dl_tensor.device.device_type = kDLCUDA;
  mt->dl_tensor.device.device_id = device;
  mt->dl_tensor.ndim = (int32_t)nd;
  mt->dl_tensor.dtype.code = (uint8_t)code;
  mt->dl_tensor.dtype.bits = (uint8_t)bits;
  mt->dl_tensor.dtype.lanes = 1;
  mt->dl_tensor.shape = dims;
  mt->dl_tensor.strides = dims + nd;
  mt->manager_ctx = NULL;
  mt->deleter = noop_deleter;
  PyObject *cap = PyCapsule_New(mt, "dltensor", alias_capsule_destructor);
  if (!cap)
    free(mt);
  return cap;
}

/* ------------------------------------------- simulator (tests only) */

/* Work a test's fake compiled graph enqueues on a simulator stream: a Python
 * callable and its arguments, kept alive for as long as the module lives,
 * because a recorded graph replays them. */
static PyObject *sim_calls;

static void sim_kernel(void *args) {
  PyObject *call;
  memcpy(&call, args, sizeof call);
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *r = PyObject_Call(PyTuple_GET_ITEM(call, 0), PyTuple_GET_ITEM(call, 1), NULL);
  if (!r)
    PyErr_WriteUnraisable(call);
  Py_XDECREF(r);
  PyGILState_Release(g);
}

static PyObject *m_sim_sync(PyObject *m, PyObject *stream) {
  (void)m;
  void *p = PyLong_AsVoidPtr(stream);
  if (PyErr_Occurred())
    return NULL;
  (void)cgt_sim_sync(p); /* refused under capture, which it invalidates: what the test wants to see */
  Py_RETURN_NONE;
}

static PyObject *m_sim_launch(PyObject *m, PyObject *args) {
  (void)m;
  if (PyTuple_GET_SIZE(args) < 2) {
    PyErr_SetString(PyExc_TypeError, "sim_launch(stream, fn, *args)");
    return NULL;
  }
  void *stream = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, 0));
  if (PyErr_Occurred())
    return NULL;
  PyObject *rest = PyTuple_GetSlice(args, 2, PyTuple_GET_SIZE(args));
  PyObject *call = rest ? PyTuple_Pack(2, PyTuple_GET_ITEM(args, 1), rest) : NULL;
  Py_XDECREF(rest);
  if (!call)
    return NULL;
  if (!sim_calls && !(sim_calls = PyList_New(0))) {
    Py_DECREF(call);
    return NULL;
  }
  if (PyList_Append(sim_calls, call) < 0) {
    Py_DECREF(call);
    return NULL;
  }
  Py_DECREF(call); /* the list keeps it */
  cgt_status st = cgt_sim_launch(stream, sim_kernel, &call, sizeof call);
  if (PyErr_Occurred())
    return NULL;
  if (st != CGT_OK) {
    PyErr_Format(TxError, "cgt_sim_launch: %s", cgt_status_name(st));
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"sim_launch", m_sim_launch, METH_VARARGS, "tests: enqueue fn(*args) on a simulator stream"},
    {"zero_stats", m_zero_stats, METH_NOARGS, "the keys of Tree.stats(), every counter 0 (no tree yet)"},
    {"_set_variant_mask", tx_set_variant_mask, METH_O,
     "tests: a call's variant is ANDed with this mask (2**64 - 1: all bits), so that different keys collide"},
    {"_fail_host_alloc", m_fail_host_alloc, METH_O,
     "tests: the n-th host allocation of the extension from now fails, as out of host memory (0: none); "
     "returns how many were still to go"},
    {"sim_sync", m_sim_sync, METH_O, "tests: synchronise a simulator stream (as .item() does: invalidates a capture)"},
    {"init_hot_path", m_init_hot_path, METH_VARARGS,
     "init_hot_path(torch._C._from_dlpack, torch._C._cuda_getCurrentRawStream, GenerationTracker, torch.Tensor"
     "[, torch.Tensor.data_ptr, torch._C._cuda_clearCublasWorkspaces, torch._C._tensors_data_ptrs_at_indices_equal, "
     "torch._C._set_storage_data_ptr_access_error_msg, torch._inductor.cudagraph_trees.MarkStepBox, "
     "torch.OutOfMemoryError])"},
    {"alloc_figures", m_alloc_figures, METH_VARARGS,
     "alloc_figures([device]): the allocator's own memory figures (device_* and the eager counters: that device)"},
    {"give_reference", m_give_reference, METH_O,
     "give_reference(o): one more reference to o, for a holder that releases one it was never given"},
    {"set_graph_task_id", m_set_graph_task_id, METH_O,
     "set_graph_task_id(fn): fn() is autograd's current graph task id (torch._C._current_graph_task_id), -1 "
     "outside a backward: a compiled call inside a backward never begins a step. None: not asked"},
    {"set_grad_node_kind", m_set_grad_node_kind, METH_O,
     "set_grad_node_kind(fn): fn(type) classifies autograd's node types for the walk from an input that requires "
     "grad and is no leaf to the parameters behind it: 1 for AccumulateGrad, 2 for a node that hands its gradient "
     "on as it is or as a view, 0 for any other; asked once per type. None: no walk"},
    {"set_output_mover", m_set_output_mover, METH_O,
     "set_output_mover(fn): fn(tensors) moves the arguments of the call that ends their step out of the pool "
     "(cgtree.torch._backend.move_out_of_pool), those over one storage onto one; a list of booleans, True "
     "where it did. None: nothing is moved, such arguments raise"},
    {"set_tree_getter", m_set_tree_getter, METH_O,
     "set_tree_getter(fn): segments run on fn(device), the calling thread's tree (cached per thread); None: on "
     "the tree each segment was made with"},
    {"eager_serial", m_eager_serial, METH_NOARGS, "the serial of the last eager allocation (for eager_held)"},
    {"capture_id", m_capture_id, METH_VARARGS,
     "capture_id(device, stream): what the eager allocator learns of a stream: the id of the capture open on it, "
     "0 if none is (the legacy stream, 0, is never asked), 2**64-1 if CUDA cannot tell"},
    {"sim_fail_pool_allocs", m_sim_fail_pool_allocs, METH_VARARGS,
     "sim_fail_pool_allocs(error, count): the simulator's next count driver-pool allocations fail with that CUDA "
     "error (tests)"},
    {"refusal_text", m_refusal_text, METH_NOARGS, "what this thread's last refused allocation raises"},
    {"sim_capture", m_sim_capture, METH_VARARGS,
     "sim_capture(stream, id): on the simulator (device -1), stream captures capture id (0: no longer)"},
    {"eager_held", m_eager_held, METH_O,
     "eager_held(since): [(bytes, serial, address)] of the eager blocks allocated after serial `since` and "
     "still in use (a debugging aid)"},
    {"reset_peak", m_reset_peak, METH_NOARGS, "eager_peak := eager_in_use; combined_peak := eager_in_use + pool_in_use; the driver pools' "
     "reserved high-water marks := what they hold"},
    {"empty_cache", m_empty_cache, METH_VARARGS,
     "empty_cache(device): free the trees of exited threads that nothing names any more, give the device's "
     "front-cached blocks to its stream-ordered pool, synchronise the device and give the pool's cached memory "
     "back"},
    {"record_stream", m_record_stream, METH_VARARGS,
     "record_stream(ptr, stream): the eager block at ptr is used on stream too; its free waits for that stream. "
     "True if ptr is an eager block of ours; other memory (a compiled graph's output): the trees' next launches "
     "wait for stream"},
    {"set_cache_bytes", m_set_cache_bytes, METH_O,
     "set_cache_bytes(n): what each device's stream-ordered pool keeps cached (for devices not used yet)"},
    {"set_read_wait_warning", m_set_read_wait_warning, METH_O,
     "when a step's end that waits for another thread's call that reads its output warns, in seconds (0: never); "
     "the bound before"},
    {"set_front_cache_bytes", m_set_front_cache_bytes, METH_O,
     "set_front_cache_bytes(n): the front cache's bound per device (0: off); blocks over it go back to the pool"},
    {"alias_capsule", m_alias_capsule, METH_VARARGS, "a DLPack capsule over caller-owned CUDA memory"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "cgtree._torch_ext",
    "The C half of cgtree's torch.compile backend: the allocator PyTorch calls, and the hot path of every segment.",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__torch_ext(void) {
  if (PyType_Ready(&TreeType) < 0 || PyType_Ready(&SegmentType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&moduledef);
  if (!m)
    return NULL;
  TX.str_data_ptr = PyUnicode_InternFromString("data_ptr");
  TX.str_generation = PyUnicode_InternFromString("generation");
  TX.str_untyped_storage = PyUnicode_InternFromString("untyped_storage");
  TX.str_cdata = PyUnicode_InternFromString("_cdata");
  TX.str_mark_step = PyUnicode_InternFromString("mark_step_counter");
  TX.str_grad = PyUnicode_InternFromString("grad");
  TX.str_is_leaf = PyUnicode_InternFromString("is_leaf");
  TX.str_requires_grad = PyUnicode_InternFromString("requires_grad");
  TX.str_clone = PyUnicode_InternFromString("clone");
  TX.str_set = PyUnicode_InternFromString("set_");
  TX.str_nbytes = PyUnicode_InternFromString("nbytes");
  TX.str_grad_fn = PyUnicode_InternFromString("grad_fn");
  TX.str_next_functions = PyUnicode_InternFromString("next_functions");
  TX.str_variable = PyUnicode_InternFromString("variable");
  TX.str_is_cuda = PyUnicode_InternFromString("is_cuda");
  TX.str_get_device = PyUnicode_InternFromString("get_device");
  TX.str_storage_offset = PyUnicode_InternFromString("storage_offset");
  TX.str_element_size = PyUnicode_InternFromString("element_size");
  TX.str_dtype = PyUnicode_InternFromString("dtype");
  TX.str_as_strided = PyUnicode_InternFromString("as_strided");
  TX.str_version = PyUnicode_InternFromString("_version");
  TxError = PyErr_NewExceptionWithDoc("cgtree._torch_ext.CgtreeError",
                                      "cgtree's torch.compile backend could not do what was asked.", PyExc_RuntimeError,
                                      NULL);
  TxStaleError = PyErr_NewExceptionWithDoc(
      "cgtree._torch_ext.StaleTensorError",
      "An output of an earlier step was passed to a compiled graph: its memory may hold newer outputs.", TxError,
      NULL);
  if (!TX.str_data_ptr || !TX.str_generation || !TX.str_untyped_storage || !TX.str_cdata || !TX.str_mark_step ||
      !TX.str_grad || !TX.str_is_leaf || !TX.str_requires_grad || !TX.str_clone || !TX.str_set || !TX.str_nbytes ||
      !TX.str_grad_fn || !TX.str_next_functions || !TX.str_variable || !TX.str_is_cuda ||
      !TX.str_get_device || !TX.str_storage_offset || !TX.str_element_size || !TX.str_dtype ||
      !TX.str_as_strided || !TX.str_version || !TxError || !TxStaleError ||
      PyModule_AddObjectRef(m, "CgtreeError", TxError) < 0 ||
      PyModule_AddObjectRef(m, "StaleTensorError", TxStaleError) < 0 ||
      PyModule_AddObjectRef(m, "Tree", (PyObject *)&TreeType) < 0 ||
      PyModule_AddObjectRef(m, "Segment", (PyObject *)&SegmentType) < 0 ||
      PyModule_AddStringConstant(m, "ALLOC_FN", "cgt_torch_alloc_or_throw") < 0 ||
      PyModule_AddStringConstant(m, "FREE_FN", "cgt_torch_free") < 0 ||
      PyModule_AddIntConstant(m, "MAX_GRAPHS_LIMIT", CGT_MAX_GRAPHS_LIMIT) < 0 ||
      PyModule_AddIntConstant(m, "MIN_GRAPH_BYTES", (long)CGT_MIN_GRAPH_BYTES) < 0 ||
      PyModule_AddFunctions(m, tx_exchange_methods) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
