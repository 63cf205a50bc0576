/* reuse.c — handing an output's tensor object back again, when nobody has it.
 *
 * Every replay hands out its outputs as tensors, and making one costs PyTorch
 * a TensorImpl, a StorageImpl, a DLPack context and a Python object: about
 * 0.5 us in a tight loop, but 2-5 us inside generation and 11 us with the
 * host's caches cold (bench/torch_segment_parts.py), because between two
 * decoder calls the host runs sampling, Dynamo's guards and the driver, and
 * the allocator's and PyTorch's code and data have left the caches. A
 * replayed node writes its outputs to the same addresses every time. So when
 * the tensor we made for that address at an earlier replay is one nobody
 * else can reach any more, handing the same object back is a new tensor in
 * every way a program can see, and costs a few loads.
 *
 * "Nobody can reach it" must be proven, not hoped:
 *   - the Python object has one reference, ours (this cache's), no weak
 *     references and no instance attributes;
 *   - its TensorImpl and StorageImpl carry the reference counts they had
 *     when we made them (one strong reference each: no view shares the
 *     storage, no C++ object holds the tensor), and
 *   - the TensorImpl's bytes (sizes, strides, offset, dtype, requires_grad
 *     and autograd state, names, dispatch keys, storage) and the Python
 *     object's (its hooks) are those of the moment we made it, and its data
 *     pointer reads as then.
 * Where a reference count lives is PyTorch's layout, which no API promises,
 * so setup_reuse() finds and proves it on probe tensors, as shim.c does for
 * the tensor's own address: the StorageImpl's address is the one word of a
 * TensorImpl that holds it in every probe, and its count (the low half of
 * the word after the vtable) must equal torch._C._storage_Use_Count in
 * every probe, views included; _install.py proves the TensorImpl's count
 * moves when a C++ reference is taken (a .grad) and that the snapshot sees
 * each in-place metadata change it tries. Any proof failing leaves reuse off,
 * and the hot path makes every tensor anew, as before.
 *
 * The cache holds our reference, so an output the program drops no longer
 * dies, and its deleter no longer hands the value back. tx_reuse_scan() does
 * instead: at every call of a segment and at a step's start it looks at the
 * kept tensors whose values live in this step, and gives back each value
 * whose tensor nobody holds (counts as at creation: no view keeps the
 * memory), exactly as the deleter would have. A kept object whose value was
 * given back is what the next replay of its node may take.
 *
 * Each tensor output of a (segment, variant) keeps up to TX_KEEP_WAYS
 * objects: one per address its nodes write it to (a segment under two
 * branches has two nodes), and more than one per address, because the usual
 * loop `y = f(x)` still holds the last y while f runs: that call makes a new
 * object, keeps it beside the held one, and the next call takes the one the
 * program has dropped meanwhile. A new object goes to an empty way, else to
 * the least recently used one; one found changed is dropped for good.
 */
#include "ext.h"

tx_reuse TXR;

static char *word_at(const void *base, Py_ssize_t off) {
  char *w;
  memcpy(&w, (const char *)base + off, sizeof w);
  return w;
}

static uint64_t u64_at(const void *base, Py_ssize_t off) {
  uint64_t w;
  memcpy(&w, (const char *)base + off, sizeof w);
  return w;
}

static Py_ssize_t obj_snap_bytes(PyObject *t) {
  Py_ssize_t n = Py_TYPE(t)->tp_basicsize - (Py_ssize_t)sizeof(PyObject);
  return n < 0 ? 0 : n > TX_OBJ_SNAP ? TX_OBJ_SNAP : n;
}

/* Weak references, or instance attributes: somebody may still see t. */
static int has_weakrefs_or_attrs(PyObject *t) {
  Py_ssize_t wo = Py_TYPE(t)->tp_weaklistoffset;
  if (wo && *(PyObject **)((char *)t + wo))
    return 1;
  if (!(Py_TYPE(t)->tp_flags & Py_TPFLAGS_MANAGED_DICT) && Py_TYPE(t)->tp_dictoffset == 0)
    return 0;
  PyObject *d = PyObject_GenericGetDict(t, NULL);
  if (!d) {
    PyErr_Clear();
    return 1;
  }
  int n = PyDict_GET_SIZE(d) != 0;
  Py_DECREF(d);
  return n;
}

/* Nobody but this cache holds e's tensor or shares its memory. */
static int idle(const tx_kept *e) {
  if (Py_REFCNT(e->t) != 1)
    return 0;
  char *impl = word_at(e->t, e->at); /* an object keeps its TensorImpl for life: compared, then read */
  if (impl != e->impl_addr || u64_at(impl, 8) != u64_at(e->impl_snap, 0))
    return 0;
  char *sto = word_at(impl, e->storage_at);
  return sto == e->storage_addr && u64_at(sto, 8) == e->storage_word;
}

/* As we made it: no metadata changed. Only asked of an unheld object. */
static int unchanged(const tx_kept *e) {
  if (memcmp(e->impl_addr + 8, e->impl_snap, TX_IMPL_SNAP) != 0)
    return 0;
  Py_ssize_t n = obj_snap_bytes(e->t);
  if (memcmp((char *)e->t + sizeof(PyObject), e->obj_snap, (size_t)n) != 0)
    return 0;
  void *p = NULL;
  return tx_shim_data_ptr(e->t, &p) && p == e->shim_ptr;
}

static void live_remove(TreeObject *T, tx_kept *e) {
  if (!e->live)
    return;
  e->live = 0;
  for (size_t i = 0; i < T->n_live_kept; i++)
    if (T->live_kept[i] == e) {
      T->live_kept[i] = T->live_kept[--T->n_live_kept];
      return;
    }
}

static void live_add(TreeObject *T, tx_kept *e) {
  if (e->live)
    return;
  if (T->n_live_kept == T->cap_live_kept) {
    size_t cap = T->cap_live_kept ? 2 * T->cap_live_kept : 16;
    tx_kept **grown = realloc(T->live_kept, cap * sizeof *grown);
    if (!grown)
      return; /* not scanned: the value then lives to the step's end, as if the tensor did */
    T->live_kept = grown;
    T->cap_live_kept = cap;
  }
  T->live_kept[T->n_live_kept++] = e;
  e->live = 1;
}

/* Lets go of e's object: if nobody else holds it, it dies now, and its
 * deleter queues its DLPack context as for any output. */
static void drop(TreeObject *T, tx_kept *e) {
  live_remove(T, e);
  PyObject *t = e->t;
  if (e->r)
    e->r->kept_by = NULL;
  e->t = NULL;
  e->r = NULL;
  e->ptr = NULL;
  Py_XDECREF(t);
}

PyObject *tx_reuse_take(TreeObject *T, tx_kept *ways, void *ptr, cgt_value v) {
  int seen = 0;
  for (int i = 0; i < TX_KEEP_WAYS; i++) {
    tx_kept *e = &ways[i];
    if (!e->t || !e->r || e->ptr != ptr)
      continue;
    seen = 1;
    tx_out_ref *r = e->r;
    /* Held (the program may still drop it: `y = f(x)` holds the last y
     * during the call), or its value is this step's: perhaps later. */
    if ((r->step == T->step && !r->released) || r->queued || !tx_reuse_unheld(e))
      continue;
    if (!unchanged(e)) { /* never again */
      drop(T, e);
      continue;
    }
    r->value = v;
    r->step = T->step;
    r->released = 0;
    r->counted = 1;
    e->stamp = ++T->kept_clock;
    T->alive_this_step++;
    T->outputs_reused++;
    live_add(T, e);
    return Py_NewRef(e->t);
  }
  T->outputs_not_reused += (uint64_t)seen;
  return NULL;
}

/* A new object for ptr goes to an empty way, else to the least recently
 * used one: an object the program holds during a call (the last `y` of
 * `y = f(x)`) stays kept beside it, to be taken once dropped. */
void tx_reuse_keep(TreeObject *T, tx_kept *ways, PyObject *t, tx_out_ref *r, void *ptr) {
  void *shim_ptr = NULL;
  if (!tx_shim_data_ptr(t, &shim_ptr))
    return;
  tx_kept *e = NULL;
  for (int i = 0; i < TX_KEEP_WAYS && !e; i++)
    if (!ways[i].t)
      e = &ways[i];
  if (!e) {
    e = &ways[0];
    for (int i = 1; i < TX_KEEP_WAYS; i++)
      if (ways[i].stamp < e->stamp)
        e = &ways[i];
  }
  if (e->t)
    drop(T, e);
  char *impl = word_at(t, TXS.offset);
  e->at = TXS.offset; /* both kept: the scan must work after the shim or reuse is turned off */
  e->storage_at = TXR.storage_at;
  e->impl_addr = impl;
  memcpy(e->impl_snap, impl + 8, TX_IMPL_SNAP);
  e->storage_addr = word_at(impl, TXR.storage_at);
  e->storage_word = u64_at(e->storage_addr, 8);
  memcpy(e->obj_snap, (char *)t + sizeof(PyObject), (size_t)obj_snap_bytes(t));
  e->shim_ptr = shim_ptr;
  e->ptr = ptr;
  e->r = r;
  r->kept_by = e;
  e->t = Py_NewRef(t);
  e->stamp = ++T->kept_clock;
  live_add(T, e);
}

int tx_reuse_unheld(const tx_kept *e) {
  return e->t && idle(e) && !has_weakrefs_or_attrs(e->t);
}

void tx_reuse_scan(TreeObject *T) {
  for (size_t i = T->n_live_kept; i-- > 0;) {
    tx_kept *e = T->live_kept[i];
    tx_out_ref *r = e->r;
    if (!e->t || !r || r->step != T->step || r->released) {
      live_remove(T, e);
      continue;
    }
    if (!tx_reuse_unheld(e))
      continue;
    (void)cgt_value_release(T->tree, r->value);
    r->released = 1;
    T->alive_this_step -= (uint64_t)r->counted;
    r->counted = 0;
    T->outputs_released_kept++;
    live_remove(T, e);
  }
}

void tx_reuse_step_begins(TreeObject *T) {
  while (T->n_live_kept)
    live_remove(T, T->live_kept[T->n_live_kept - 1]);
}

void tx_reuse_orphan(TreeObject *T, tx_kept *e) {
  e->r = NULL; /* being freed: drop() must not touch it */
  drop(T, e);
}

void tx_reuse_clear(TreeObject *T, tx_kept *ways) {
  for (int i = 0; i < TX_KEEP_WAYS; i++)
    if (ways[i].t)
      drop(T, &ways[i]);
}

/* setup_reuse(probes, on): probes is a list of (tensor, TensorImpl address,
 * StorageImpl address, torch._C._storage_Use_Count of it), taken with
 * nothing changing in between. Finds the word of a TensorImpl (within its
 * first TX_IMPL_SNAP + 8 bytes) that holds the StorageImpl's address in
 * every probe, and checks that the StorageImpl's count, the low half of its
 * word at offset 8, is the use count in every probe. Returns (on, offset,
 * why); needs the shim on (shim.c). _install.setup_reuse proves the rest
 * first (the TensorImpl's count, the snapshot's reach) and passes on=False
 * where that failed. */
static PyObject *setup_reuse(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *probes;
  int on;
  if (!PyArg_ParseTuple(args, "O!p", &PyList_Type, &probes, &on))
    return NULL;
  if (tx_check_probes(probes, 4, TXS.offset ? TXS.types[0] : NULL, TXS.types[1],
                      "setup_reuse: each probe is (tensor, impl address, storage impl address, storage use count)") <
      0)
    return NULL;
  TXR.on = 0;
  TXR.storage_at = 0;
  Py_ssize_t n = PyList_GET_SIZE(probes), found = 0;
  const char *why = NULL;
  if (!TXS.offset)
    why = "the shim is off";
  else if (!n)
    why = "no probes";
  for (Py_ssize_t off = 16; !why && off + (Py_ssize_t)sizeof(void *) <= TX_IMPL_SNAP + 8;
       off += (Py_ssize_t)sizeof(void *)) {
    int all = 1;
    for (Py_ssize_t i = 0; i < n && all; i++) {
      PyObject *p = PyList_GET_ITEM(probes, i);
      char *impl = PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, 1));
      /* the probe's tensor object must hold that TensorImpl */
      all = impl && word_at(PyTuple_GET_ITEM(p, 0), TXS.offset) == impl &&
            word_at(impl, off) == PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, 2));
    }
    if (all && found) {
      why = "two words of a TensorImpl hold its StorageImpl";
      found = 0;
    } else if (all) {
      found = off;
    }
  }
  if (!why && !found)
    why = "no word of a TensorImpl holds its StorageImpl";
  for (Py_ssize_t i = 0; !why && i < n; i++) {
    PyObject *p = PyList_GET_ITEM(probes, i);
    char *sto = PyLong_AsVoidPtr(PyTuple_GET_ITEM(p, 2));
    long long want = PyLong_AsLongLong(PyTuple_GET_ITEM(p, 3));
    if ((long long)(uint32_t)u64_at(sto, 8) != want)
      why = "a StorageImpl's reference count is not where it was looked for";
  }
  if (PyErr_Occurred())
    return NULL;
  if (why)
    return Py_BuildValue("(Ons)", Py_False, (Py_ssize_t)0, why);
  TXR.storage_at = found;
  TXR.on = on;
  return Py_BuildValue("(Ons)", on ? Py_True : Py_False, found, on ? "" : "turned off");
}

/* reuse_words(tensor) -> (TensorImpl's refcount word, StorageImpl's refcount
 * word, snapshot bytes): what the checks above compare, for
 * _install.setup_reuse's proofs. Needs the shim and setup_reuse's offset. */
static PyObject *reuse_words(PyObject *m, PyObject *t) {
  (void)m;
  void *p;
  if (!TXS.offset || !TXR.storage_at || !tx_shim_data_ptr(t, &p)) {
    PyErr_SetString(PyExc_ValueError, "reuse_words: a served tensor, after setup_shim and setup_reuse");
    return NULL;
  }
  char *impl = word_at(t, TXS.offset);
  char *sto = word_at(impl, TXR.storage_at);
  unsigned char snap[TX_IMPL_SNAP + TX_OBJ_SNAP];
  memcpy(snap, impl + 8, TX_IMPL_SNAP);
  Py_ssize_t n = obj_snap_bytes(t);
  memcpy(snap + TX_IMPL_SNAP, (char *)t + sizeof(PyObject), (size_t)n);
  return Py_BuildValue("(KKy#)", (unsigned long long)u64_at(impl, 8), (unsigned long long)(sto ? u64_at(sto, 8) : 0),
                       (const char *)snap, (Py_ssize_t)TX_IMPL_SNAP + n);
}

static PyObject *reuse_info(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  return Py_BuildValue("{s:O,s:n}", "on", TXR.on ? Py_True : Py_False, "storage_at", TXR.storage_at);
}

PyMethodDef tx_reuse_methods[] = {
    {"setup_reuse", setup_reuse, METH_VARARGS,
     "setup_reuse([(tensor, impl address, storage impl address, storage use count), ...], on) -> (on, offset, why): "
     "hand an output's tensor object back again when nobody holds it (python/_torch_ext/reuse.c)"},
    {"reuse_words", reuse_words, METH_O,
     "reuse_words(tensor) -> (impl refcount word, storage refcount word, snapshot): for setup_reuse's proofs"},
    {"reuse_info", reuse_info, METH_NOARGS, "whether outputs may be handed back again, and the proven offset"},
    {NULL, NULL, 0, NULL},
};
