/* read_memo.c — what a segment's last call in a tree read, so that the
 * same call made again in the same step is told a repeat.
 *
 * After a backward whose step holds nothing alive (the loss dropped, or a
 * forward that ran as the plain graph), a compiled call that reads a kept
 * .grad begins a gradient readers' step, and later readers of a kept .grad
 * join it (module.c, "A gradient readers' step"): a per-parameter
 * optimizer's first output then stays readable through its second call.
 * But an analysis loop, `score = probe(w, w.grad)` a hundred times with
 * the last score bound, joined it too: a new node per call, run as a
 * warm-up, never replayed, up to the bound of 1024 held calls, and a
 * warning that blamed a backward (a review). PyTorch's trees begin a
 * generation at every such call; cgtree begins a readers' step of its own
 * where a call repeats the last call of its segment in the step: the same
 * arguments, which seg_steps.c's belongs_to_training_step asks of this file.
 *
 * "The same" must never take two calls for one: a repeat begins a step,
 * which marks the earlier call's output, and a program that kept it (a
 * metric against several references, each result kept) would raise
 * StaleTensorError where Inductor computes. So a tensor argument is the
 * same only as the same live object at the same address: a reference
 * made per call (ref.to("cuda")) dies and the next one often lies where
 * it lay, even at the same object address, and a hash of addresses took
 * them for one (a review); so the memo keeps a weak reference to each
 * tensor, dead with it, and its count of writes in place (Tensor._version):
 * a buffer refilled for each call (buf.copy_(ref)) is the same object at
 * the same address, but not the same argument. A compiled call that
 * writes an input in place (an optimizer's update between two probes of
 * w, or the update called twice) ends every repeat too. PyTorch counts
 * such a write in the input's _version (AOTAutograd bumps it after the
 * graph ran: measured on torch 2.11, on the CPU), but a tensor without a
 * version counter (an inference tensor) tells nothing, nor do the
 * simulator's fakes; so this file counts those calls as well, in every
 * tree of the process (a worker thread's update writes the w this thread
 * reads), and a call that writes is stamped before its own write is
 * counted (a review, on the simulator). Writes that bump no _version
 * and run no compiled call (through .data, DLPack, a kernel of another
 * library, a collective) stay unseen: the later call is taken for a
 * repeat, and the earlier call's output, if kept, raises StaleTensorError
 * (loud, as docs/torch.md says).
 *
 * A bool is the same only as an equal bool, an int only as an equal int,
 * a float only as the same bits, and None as None: Python's hashes made
 * -1 and -2 one value (a review). Any other argument makes the call no
 * repeat, nor one a later call repeats.
 *
 * The memo is the last call's that ran: a call builds a candidate while
 * its step is settled (tx_read_memo_begin, tx_read_memo_arg), stamps it
 * with the step it runs in, and commits it only once the call returned a
 * result (seg_vectorcall); a call that failed after its step was settled
 * (out of host memory, then retried) left a memo that took the retry for
 * a repeat, which began a step and marked the first norm (a review).
 *
 * Out of host memory the memo is simply not kept: the call is then no
 * repeat, which joins it to the step (the rule before this file).
 */
#include "ext.h"

#include <stdatomic.h>
#include <string.h>

/* Calls of segments that write an input in place, in every tree. */
static _Atomic uint64_t input_writes;

void tx_read_memo_note_input_write(void) { atomic_fetch_add_explicit(&input_writes, 1, memory_order_relaxed); }

/* An argument's entry: what kind, its value, and for a tensor a weak
 * reference and its count of writes in place. */
enum { MEMO_TENSOR = 1, MEMO_BOOL, MEMO_INT, MEMO_FLOAT, MEMO_NONE };
struct tx_read_cell {
  uint64_t kind, value, version;
  PyObject *ref;
};

static void refs_clear(tx_read_cell *c, uint32_t n) {
  for (uint32_t i = 0; c && i < n; i++)
    Py_CLEAR(c[i].ref);
}

/* The candidate's cells: after the memo's. */
static tx_read_cell *cand(tx_read_memo *m) { return m->cells + m->n; }

int tx_read_memo_begin(tx_read_memo *m, uint32_t n) {
  m->cand_ok = 0;
  if (!m->cells) {
    m->cells = tx_calloc(2 * (size_t)(n ? n : 1), sizeof *m->cells);
    if (!m->cells)
      return -1;
    m->n = n;
  }
  if (m->n != n)
    return -1;
  refs_clear(cand(m), m->n);
  m->cand_ok = 1;
  return 0;
}

/* A tensor's count of writes in place; 0 where it has none to tell. */
static uint64_t version_of(PyObject *t) {
  PyObject *v = PyObject_GetAttr(t, TX.str_version);
  unsigned long long x = v ? PyLong_AsUnsignedLongLong(v) : 0;
  Py_XDECREF(v);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    x = 0;
  }
  return (uint64_t)x;
}

void tx_read_memo_arg(tx_read_memo *m, uint32_t i, PyObject *arg, int tensor, uintptr_t ptr) {
  if (!m->cand_ok || i >= m->n)
    return;
  tx_read_cell *c = cand(m) + i;
  c->version = 0;
  if (tensor) {
    PyObject *ref = PyWeakref_NewRef(arg, NULL);
    if (!ref) {
      PyErr_Clear(); /* no weak reference to it: this call is no repeat, nor one a later call repeats */
      m->cand_ok = 0;
      return;
    }
    c->ref = ref;
    c->kind = MEMO_TENSOR, c->value = (uint64_t)ptr, c->version = version_of(arg);
  } else if (arg == Py_None) {
    c->kind = MEMO_NONE, c->value = 0;
  } else if (PyBool_Check(arg)) {
    c->kind = MEMO_BOOL, c->value = arg == Py_True;
  } else if (PyLong_Check(arg)) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      m->cand_ok = 0;
      return;
    }
    c->kind = MEMO_INT, c->value = (uint64_t)x;
  } else if (PyFloat_Check(arg)) {
    double d = PyFloat_AS_DOUBLE(arg);
    c->kind = MEMO_FLOAT;
    memcpy(&c->value, &d, sizeof d);
  } else {
    m->cand_ok = 0;
  }
}

void tx_read_memo_stamp(tx_read_memo *m, uint64_t step) {
  m->cand_step = step;
  m->cand_writes = atomic_load_explicit(&input_writes, memory_order_relaxed);
}

/* 1 if the weak references name one live object. */
static int same_live_object(PyObject *a, PyObject *b) {
  if (!a || !b)
    return 0;
  PyObject *x = tx_weakref_get(a), *y = tx_weakref_get(b);
  int same = x && x == y;
  Py_XDECREF(x);
  Py_XDECREF(y);
  return same;
}

int tx_read_memo_repeats(tx_read_memo *m, uint64_t step) {
  uint64_t writes = atomic_load_explicit(&input_writes, memory_order_relaxed);
  if (!m->ok || !m->cand_ok || m->step != step || m->writes != writes)
    return 0;
  const tx_read_cell *now = cand(m);
  for (uint32_t i = 0; i < m->n; i++) {
    const tx_read_cell *was = &m->cells[i];
    if (was->kind != now[i].kind || was->value != now[i].value || was->version != now[i].version)
      return 0;
    if (now[i].kind == MEMO_TENSOR && !same_live_object(was->ref, now[i].ref))
      return 0;
  }
  return 1;
}

void tx_read_memo_commit(tx_read_memo *m) {
  if (!m->cand_ok)
    return;
  refs_clear(m->cells, m->n);
  memcpy(m->cells, cand(m), (size_t)m->n * sizeof *m->cells); /* the references move */
  memset(cand(m), 0, (size_t)m->n * sizeof *m->cells);
  m->step = m->cand_step;
  m->writes = m->cand_writes;
  m->ok = 1;
  m->cand_ok = 0;
}

void tx_read_memo_drop(tx_read_memo *m) {
  m->cand_ok = 0;
  refs_clear(m->cells ? cand(m) : NULL, m->n);
}

void tx_read_memo_free(tx_read_memo *m) {
  refs_clear(m->cells, 2 * m->n);
  free(m->cells);
  memset(m, 0, sizeof *m);
}
