/* tree_close.c — freeing the trees of threads that exited.
 *
 * Each thread runs on trees of its own (module.c), with a pool each. A
 * program that runs compiled models on threads that come and go (a server
 * that starts a thread per request, or a worker pool that retires idle
 * threads: anyio's, under FastAPI, after ten idle seconds) would grow a tree
 * and a pool per thread, for as long as the process lives, if trees lived
 * that long. PyTorch's CUDAGraph Trees free a thread's tree manager with the
 * thread. So do we, once it is safe:
 *
 *   1. The thread exited. cgtree.torch keeps a thread's trees in a dict that
 *      only the thread's threading.local and PyTorch's thread-local stash
 *      hold; when both let go, at the thread's exit, the dict orphans each
 *      tree (tx_tree_orphan). No call comes to an orphan again: the tree
 *      getter hands out the calling thread's trees, and autograd's device
 *      thread runs a backward on the trees of the thread that called
 *      backward(), which is alive while it waits for it. A thread's cache
 *      of trees (segment.c) may hold another thread's (a forward run under
 *      a backward's copied stash), so orphaning one moves the getter's
 *      epoch: every thread asks the getter again before its next call.
 *   2. No output of the tree lives. An output tensor's deleter names its tree
 *      (its tx_out_ref), and so may a backward of the thread's forwards (its
 *      saved activations are outputs), so the tree stays while any record of
 *      an output is unfreed (T->out_refs, counted down by the drain of dead
 *      outputs, segment.c). An output whose tensor DLPack's exchange API
 *      failed to make gives its value back at once and leaves its tree:
 *      PyTorch may or may not have run its deleter, so its record lives
 *      on, detached, and the drain frees it alone should the deleter come.
 *      (Without the exchange API, a capsule torch.from_dlpack consumed
 *      and then failed on keeps its record, and so its tree, for good.)
 *   3. No capture is open: freeing graphs, pools and the stream while some
 *      thread's stream captures would invalidate that capture (CUDA refuses
 *      such calls during a global-mode capture). Every capture of ours
 *      happens inside a cgt_run, under the GIL, counted by alloc.c
 *      (tx_alloc_idle): with the GIL held and that count at 0, none is open,
 *      and none can open until we return.
 *
 * An orphan waits on a list (holding a reference) until 2 and 3 hold; the
 * list is looked at at every segment call and by cgtree.torch.empty_cache(),
 * never where the orphaning happens: that is a thread's exit or a
 * finaliser, at any moment of any thread, where freeing device memory could
 * meet a capture that is not ours (torch.cuda.graph in another thread).
 * Closing a tree takes every segment's run in it
 * out of its segment, running no Python; synchronises its stream; retires
 * that stream in eager.c if the tree made it, blocking or, in explicit
 * mode, non-blocking (blocks allocated on it outside the pool are freed on
 * the legacy stream from then on; a stream handed in stays its maker's);
 * keeps its counters; and destroys the C tree (its graphs, its pools'
 * memory) and the stream. Only
 * then are the runs freed, each registered segment losing the reference
 * the tree held on it; that may run Python (a segment dies, and with it
 * what it held), where another thread may take the GIL, so the next orphan
 * is freed only after asking again whether a run is under way. What is
 * left is a husk of a few hundred bytes that reports the counters at its
 * close; cgtree.torch drops it from its list of trees, folding its
 * counters into the process's totals. The synchronisation and the frees
 * happen under the GIL, in the call that found the orphan, once per
 * exited thread.
 *
 * Tests: test_torch_ext_sim.py (an exited thread's tree, an orphan while a
 * run is under way, runs whose segments hold each other, a thread that
 * cached another's tree, the stream retired and the pool's bytes in use)
 * on the simulator, test_torch_threads.py (the dict orphans its trees at
 * the thread's exit), test_torch_trust.py (a thread per request) on the
 * GPU.
 */
#include "ext.h"

size_t tx_trees_orphaned;
static TreeObject **orphans; /* references */
static size_t cap_orphans;
static uint64_t closed_count;
static int closing; /* a close under way: dropping a segment may run Python, which may call a segment */

uint64_t tx_trees_closed(void) { return closed_count; }

static void tree_close(TreeObject *T) {
  int capture_mode = tx_dev_ignore_other_captures(); /* another thread's capture stays whole (dev.c) */
  size_t n_runs = 0;
  struct seg_run **runs = tx_tree_runs_detach(T, &n_runs); /* no Python runs until the C tree is gone */
  (void)cgt_sync(T->tree); /* its counters are final */
  (void)cgt_tree_stats(T->tree, &T->last_stats);
  tx_tree_destroy_c(T); /* retires its stream in eager.c too */
  tx_event_destroy(T->ev_in);
  tx_event_destroy(T->ev_out);
  T->ev_in = T->ev_out = NULL;
  tx_step_outputs_free(T);
  PyObject *leaves = T->grad_leaves;
  T->grad_leaves = NULL;
  T->closed = 1;
  closed_count++;
  tx_dev_heed_other_captures(capture_mode);
  tx_tree_runs_free(runs, n_runs); /* Python may run from here on */
  Py_XDECREF(leaves);
}

void tx_trees_close_pending(void) {
  if (closing)
    return;
  closing = 1;
  tx_out_ref_queue_drain(); /* outputs that died since the last drain */
  /* Asked again before each tree: freeing one runs Python, where another
   * thread may take the GIL and begin a run. */
  for (size_t i = 0; i < tx_trees_orphaned && tx_alloc_idle();) {
    TreeObject *T = orphans[i];
    if (T->out_refs) {
      i++;
      continue;
    }
    orphans[i] = orphans[--tx_trees_orphaned];
    tree_close(T);
    Py_DECREF(T);
  }
  closing = 0;
}

int tx_tree_orphan(TreeObject *T) {
  if (T->orphaned || T->closed || !T->tree)
    return 0;
  if (tx_trees_orphaned == cap_orphans) {
    size_t cap = cap_orphans ? 2 * cap_orphans : 8;
    TreeObject **grown = tx_realloc(orphans, cap * sizeof *grown);
    if (!grown) {
      PyErr_NoMemory();
      return -1;
    }
    orphans = grown;
    cap_orphans = cap;
  }
  T->orphaned = 1;
  orphans[tx_trees_orphaned++] = (TreeObject *)Py_NewRef((PyObject *)T);
  TX.tree_epoch++; /* every thread asks the getter again: no cached pointer to T outlives this */
  return 0; /* freed later, from a call of ours: not from a thread's exit or a finaliser */
}
