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
 * old y is never read.
 *
 * The mark leaves the storage (and our DLPack context) alive until PyTorch
 * frees it; the value went stale with its step already, so the drain then
 * only frees the context. Passing a marked tensor to a compiled graph fails
 * where its pointer is read; tx_stale_translate turns that error into
 * StaleTensorError.
 */
#include "ext.h"

#include <pthread.h>

/* The word the marks carry, by which tx_stale_translate knows them. */
static const char STALE_WORD[] = "cgtree.torch.StaleTensorError";

int tx_stale_watch(TreeObject *T, tx_out_ref *r, PyObject *t) {
  if (!TX.storage_mark)
    return 0; /* marking is off (the simulator's tests without a stand-in) */
  PyObject *sto = PyObject_CallMethodNoArgs(t, TX.str_untyped_storage);
  if (!sto)
    return -1;
  r->storage = PyObject_GetAttr(sto, TX.str_cdata);
  Py_DECREF(sto);
  if (!r->storage)
    return -1;
  r->step_prev = NULL;
  r->step_next = T->step_outputs;
  if (T->step_outputs)
    T->step_outputs->step_prev = r;
  T->step_outputs = r;
  r->on_step_list = 1;
  return 0;
}

void tx_stale_forget(TreeObject *T, tx_out_ref *r) {
  if (r->on_step_list) {
    if (r->step_prev)
      r->step_prev->step_next = r->step_next;
    else
      T->step_outputs = r->step_next;
    if (r->step_next)
      r->step_next->step_prev = r->step_prev;
    r->on_step_list = 0;
  }
  Py_CLEAR(r->storage);
}

int tx_stale_mark_step(TreeObject *T) {
  if (!T->step_outputs)
    return 0;
  char msg[512];
  snprintf(msg, sizeof msg,
           "%s: this tensor is an output of a graph compiled with backend='cgtree' in step %llu, and a later "
           "call of the compiled model (or cgtree.torch.step_begin()) has let cgtree reuse its memory, so its "
           "data is gone. To keep an output across calls, clone it (y.clone()) before the next call.",
           STALE_WORD, (unsigned long long)T->step);
  PyObject *text = PyUnicode_FromString(msg);
  if (!text)
    return -1;
  int rc = 0;
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  tx_out_ref *r = T->step_outputs;
  T->step_outputs = NULL;
  while (r) {
    tx_out_ref *next = r->step_next;
    r->on_step_list = 0;
    r->step_prev = r->step_next = NULL;
    /* Its deleter may have run on a thread without the GIL since the last
     * drain: then its storage is gone and must not be named. */
    if (!tx_out_ref_dead(r)) {
      PyObject *args[2] = {r->storage, text};
      PyObject *res = PyObject_Vectorcall(TX.storage_mark, args, 2, NULL);
      if (res) {
        T->marked_stale++;
        Py_DECREF(res);
      } else if (rc == 0) { /* the others are still marked; the first error is the one raised */
        PyErr_Fetch(&type, &value, &tb);
        rc = -1;
      } else {
        PyErr_Clear();
      }
    }
    r = next;
  }
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
