/* seg_launch.c — the launch function cgtree calls to warm up or record a
 * segment, and what must happen around every launch.
 *
 * The launch function (called by cgtree for warmups and recordings, never
 * for replays) calls the Inductor-compiled graph on the tree's stream with
 * alloc.c routing every allocation into this launch, and tells cgtree where
 * the outputs are. The very first call of a segment is not run through
 * cgtree at all: it runs the compiled graph plainly, so Triton autotuning and
 * other lazy initialisation happen outside the pool, and it tells us how many
 * outputs the graph has, which cgt_segment_register needs.
 *
 * Random graphs. A segment made with `prelaunch` (the backend's graphs
 * that draw random numbers) has it called by the tree right before each
 * launch of its recordings (cgt_segment_set_prelaunch): it writes the CUDA
 * generator's seed and offset and advances it (python/cgtree/torch/_rng.py).
 * Here we only keep those writes in order: an event per device, recorded
 * after every run of a random segment, that each writer waits for, and a
 * lock that keeps each run's wait, writes, launch and record together
 * across threads (random_mu).
 *
 * cuBLAS's workspace. PyTorch gives cuBLAS a workspace per (handle, stream),
 * allocated through the current allocator at the first matmul on a stream
 * and kept until torch._C._cuda_clearCublasWorkspaces() drops them all (32
 * MiB on sm90, plus 1 MiB for cuBLASLt). One kept across a launch would be
 * pool memory the tree reuses while cuBLAS still writes to it. So, as
 * PyTorch's own CUDAGraph Trees do, every launch function drops the
 * workspaces before it runs the graph and again before it returns: the
 * workspace the graph's matmuls take is then an ordinary temporary of the
 * launch, freed inside it, and its pool memory is reused by later segments
 * exactly like any other temporary (stream order keeps that safe: a replay
 * uses it only while its own kernels run). The first plain call of a graph
 * drops them too, so its workspace on the caller's stream does not outlive
 * it. The result is one workspace's worth of memory, in the pool, where a
 * workspace kept per stream would cost 33 MiB for each stream.
 */
#include "segment.h"

/* -------------------------------------------------- launch function */

void seg_clear_exception(seg_run *r) {
  Py_CLEAR(r->exc_type);
  Py_CLEAR(r->exc_value);
  Py_CLEAR(r->exc_tb);
}

static void stash_exception(seg_run *r) {
  Py_XDECREF(r->exc_type);
  Py_XDECREF(r->exc_value);
  Py_XDECREF(r->exc_tb);
  PyErr_Fetch(&r->exc_type, &r->exc_value, &r->exc_tb);
}

/* describe() gave no tuple: a recording cannot carry the outputs. The
 * segment goes plain with the sentence it gave instead, or with `fallback`
 * where it gave none (NULL: the caller goes plain later, saying why). */
void seg_go_plain_described(SegmentObject *s, PyObject *desc, const char *fallback) {
  const char *why = PyUnicode_Check(desc) ? PyUnicode_AsUTF8(desc) : NULL;
  PyErr_Clear();
  if (why || fallback)
    seg_go_plain(s, why ? why : fallback);
}

/* Where the graph reads tensor input k in launch l: the argument itself
 * (the caller's own memory, a value read in place, or NULL for an empty
 * tensor), or, for a DYNAMIC input or a VALUE outside the graph pool (an
 * eager run's output, in the side pool), which the tree copies whole into
 * a placeholder, the place the argument lies in that placeholder (taken at
 * the placeholder's start, a view at an offset read the value's first
 * bytes: a review). seg_launch passes the graph that; set_outputs notes it. */
static char *input_seen(const seg_run *r, cgt_launch *l, uint32_t k) {
  char *at = (char *)cgt_launch_input(l, k) + r->offs[k];
  return at == (char *)r->ptrs[k] || r->ptrs[k] == NULL ? r->ptrs[k] : at;
}

static cgt_status set_outputs(seg_run *r, cgt_launch *l, PyObject *res) {
  SegmentObject *s = r->s;
  for (uint32_t k = 0; k < s->n_targs; k++) /* where the graph saw each input: its placeholder, or itself */
    r->seen[k] = input_seen(r, l, k);
  PyObject *desc = PyObject_CallOneArg(s->describe_py, res);
  if (!desc) {
    stash_exception(r);
    return CGT_ERR_SEGMENT_FAILED;
  }
  if (!PyTuple_Check(desc)) { /* describe() found an output a recording cannot carry, and says which */
    seg_go_plain_described(s, desc, NULL);
    Py_DECREF(desc);
    r->want_bypass = 1;
    return CGT_ERR_SEGMENT_FAILED;
  }
  PyObject *metas = PyTuple_GET_ITEM(desc, 1);
  variant_tmpl *t = seg_tmpl_find(s, r->cur_variant);
  if (!t) {
    uint32_t n = 0;
    if (seg_tmpl_add(s, r, r->seen, r->cur_variant, desc, res, r->cur, &n) < 0) {
      Py_DECREF(desc);
      stash_exception(r);
      return CGT_ERR_SEGMENT_FAILED;
    }
    if (n != s->n_outputs) {
      Py_DECREF(desc);
      r->want_bypass = 1;
      return CGT_ERR_SEGMENT_FAILED;
    }
  }
  cgt_status st = CGT_OK;
  uint32_t k = 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(metas) && st == CGT_OK; i++) {
    PyObject *m = PyTuple_GET_ITEM(metas, i);
    if (m == Py_None)
      continue;
    void *ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(m, 0));
    size_t span = PyLong_AsSize_t(PyTuple_GET_ITEM(m, 1));
    if (span == 0) /* an empty tensor still needs a value: one byte of pool */
      st = cgt_launch_alloc(l, 1, &ptr), span = 1;
    if (st == CGT_OK)
      st = cgt_launch_set_output(l, k, ptr, span);
    if (st != CGT_OK)
      r->want_bypass = 1; /* an output outside the pool and the inputs (e.g. a constant) */
    k++;
  }
  Py_DECREF(desc);
  return st;
}

/* Random graphs. All of them, on every tree of a device, read one state
 * of the device's generator, and each launch's prelaunch writes it first:
 * an event recorded after each run of a random segment lets the next
 * writer wait until every launch before it has read.
 *
 * That holds only if no other thread's write, launch or record comes
 * between a run's wait, write, launch and record, and the GIL does not see
 * to it: the prelaunch is Python, and CUDAGraph.replay, which writes the
 * state, releases the GIL. Without more, another thread could wait on the
 * event this run has not recorded yet, write the state while this run's
 * launch still has to read it, and both launches would draw the same
 * numbers (test_torch_random.py's two-thread test did, on an H200). So a
 * run of a random segment holds random_mu from before cgt_run (whose
 * prelaunch waits and writes, and whose launch reads) until its event is
 * recorded. One lock for the process: the runs it orders are host-side
 * enqueues of microseconds, and recordings of random graphs are one at a
 * time anyway (_rng.py). A thread waits for it with the GIL released, so
 * that the holder can take the GIL back after its prelaunch. */
enum { RANDOM_DEVICES = 64 };
static void *random_done[RANDOM_DEVICES];
static pthread_mutex_t random_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether this thread holds random_mu: a random graph's run called inside
 * another's (a compiled call in the graph's own Python, as a custom op's)
 * would wait for its own thread for good, and every other thread's random
 * graph behind it (a helper's hunt). It raises instead. */
static _Thread_local int random_held_here;

int seg_random_lock(void) {
  if (random_held_here) {
    PyErr_SetString(TxError, "cgtree.torch: a graph that draws random numbers was called inside another's run "
                             "(a compiled call in a compiled graph's Python): cgtree cannot order their draws; "
                             "call it outside, or compile both into one graph");
    return -1;
  }
  if (pthread_mutex_trylock(&random_mu) != 0) {
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&random_mu);
    Py_END_ALLOW_THREADS
  }
  random_held_here = 1;
  return 0;
}

void seg_random_unlock(void) {
  random_held_here = 0;
  pthread_mutex_unlock(&random_mu);
}

/* The event of T's device; NULL on the simulator (its trees have no CUDA
 * events, and their streams are not CUDA streams): nothing to order. */
void *seg_random_event(const TreeObject *T) { return T->ev_out ? random_done[T->device] : NULL; }

int seg_random_done_event(int device) {
  if (device < 0 || device >= RANDOM_DEVICES) {
    PyErr_Format(TxError, "cgtree.torch: device %d: random graphs are recorded on devices 0 to %d only", device,
                 RANDOM_DEVICES - 1);
    return 0;
  }
  if (!random_done[device]) {
    /* Recorded once, on its device, so that every wait has a record. */
    random_done[device] = tx_event_create_on(device, 1);
#ifdef CGT_HAVE_CUDA
    if (!random_done[device]) {
      PyErr_SetString(TxError, "cgtree.torch: could not create a CUDA event");
      return 0;
    }
#endif
  }
  return 1;
}

cgt_status seg_launch(cgt_launch *l, void *user) {
  seg_run *r = user;
  SegmentObject *s = r->s;
  if (s->side_stream) /* a capture's bracket writes the generator's state there: after every launch that reads it */
    tx_event_wait(s->side_stream, seg_random_event(r->tree));
  /* From here on a capture may be under way: every allocation goes to the
   * pool, and an eager block freed now (dropping cuBLAS's workspaces frees
   * the caller stream's, on the legacy stream) is set aside, not given back
   * with a call on its stream (alloc.c, eager.c). */
  tx_alloc_launch_enter(l);
  PyObject *inputs = PyTuple_New(s->n_args);
  if (!inputs) {
    tx_alloc_launch_leave();
    stash_exception(r);
    return CGT_ERR_OUT_OF_MEMORY;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < s->n_args; i++) {
    PyObject *o = r->cur[i], *item;
    if (s->arg_kind[i] <= ARG_TENSOR_STATIC) {
      char *at = input_seen(r, l, k);
      if (at == (char *)r->ptrs[k]) { /* the argument itself */
        Py_INCREF(o);
        item = o;
      } else { /* the placeholder: the graph reads the copy, through o's layout */
        PyObject *pp = PyLong_FromVoidPtr(at);
        item = pp ? PyObject_CallFunctionObjArgs(s->alias_py, o, pp, NULL) : NULL;
        Py_XDECREF(pp);
      }
      k++;
    } else {
      Py_INCREF(o);
      item = o;
    }
    if (!item) {
      tx_alloc_launch_leave();
      Py_DECREF(inputs);
      stash_exception(r);
      return CGT_ERR_SEGMENT_FAILED;
    }
    PyTuple_SET_ITEM(inputs, i, item);
  }
  if (tx_blas_clear() < 0) { /* no workspace from before may serve the launch */
    tx_alloc_launch_leave();
    Py_DECREF(inputs);
    stash_exception(r);
    return CGT_ERR_SEGMENT_FAILED;
  }
  PyObject *res = PyObject_CallOneArg(s->launch_py, inputs);
  cgt_status st;
  if (res) {
    st = set_outputs(r, l, res);
  } else {
    stash_exception(r);
    st = CGT_ERR_SEGMENT_FAILED;
  }
  /* The workspace the graph's matmuls took is a temporary of this launch. */
  if (tx_blas_clear() < 0) {
    stash_exception(r);
    st = CGT_ERR_SEGMENT_FAILED;
  }
  /* Dropping the graph's own output tensors frees pool blocks the tree now
   * owns: outside the launch, alloc.c ignores those frees. */
  tx_alloc_launch_leave();
  Py_XDECREF(res);
  Py_DECREF(inputs);
  return st;
}

/* --------------------------------------------------------- cuBLAS */

int tx_blas_clear(void) {
  if (!TX.blas_clear)
    return 0;
  PyObject *r = PyObject_CallNoArgs(TX.blas_clear);
  if (!r)
    return -1;
  Py_DECREF(r);
  return 0;
}


/* The tree's prelaunch function for a segment made with `prelaunch`: its
 * Python callable, with the variant and whether to write on the caller's
 * current stream (else the tree's), on the calling thread (cgt_run runs
 * with the GIL held). An exception fails the run, which then goes plain. */
cgt_status seg_prelaunch(void *user, void *stream, uint64_t variant) {
  (void)stream; /* the callable knows its tree's stream */
  seg_run *r = user;
  tx_event_wait(r->fill_stream, seg_random_event(r->tree));
  PyObject *args[2] = {PyLong_FromUnsignedLongLong(variant), r->fill_stream ? Py_False : Py_True};
  PyObject *res = args[0] ? PyObject_Vectorcall(r->s->prelaunch_py, args, 2, NULL) : NULL;
  Py_XDECREF(args[0]);
  if (!res) {
    stash_exception(r);
    return CGT_ERR_SEGMENT_FAILED;
  }
  Py_DECREF(res);
  return CGT_OK;
}
