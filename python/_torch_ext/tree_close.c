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
 *      backward(), which is alive while it waits for it.
 *   2. No output of the tree lives. An output tensor's deleter names its tree
 *      (its tx_out_ref), and so may a backward of the thread's forwards (its
 *      saved activations are outputs), so the tree stays while any record of
 *      an output is unfreed (T->out_refs, counted down by the drain of dead
 *      outputs, segment.c).
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
 * Closing a tree synchronises its stream, drops
 * every segment's run in it (each run leaves its segment, and a registered
 * segment loses the reference the tree held on it), retires its stream in
 * eager.c (blocks allocated on it outside the pool are freed on the legacy
 * stream from then on), keeps its counters, and destroys the C tree: its
 * graphs, its pools' memory, its stream. What is left is a husk of a few
 * hundred bytes that reports the counters at its close; cgtree.torch drops
 * it from its list of trees, folding its counters into the process's
 * totals.
 *
 * Tests: test_torch_ext_sim.py ("exited thread") on the simulator,
 * test_torch_threads.py (the dict orphans its trees at the thread's exit)
 * and test_torch_backend.py on the GPU.
 */
#include "ext.h"

size_t tx_trees_orphaned;
static TreeObject **orphans; /* references */
static size_t cap_orphans;
static uint64_t closed_count;
static int closing; /* a close under way: dropping a segment may run Python, which may call a segment */

uint64_t tx_trees_closed(void) { return closed_count; }

static void tree_close(TreeObject *T) {
  (void)cgt_sync(T->tree); /* its stream's work is over: its blocks may be retired */
  tx_tree_runs_drop(T);
  tx_eager_retire_stream(T->on_simulator ? -1 : T->device, T->stream);
  (void)cgt_tree_stats(T->tree, &T->last_stats);
  tx_alloc_note_pool_in_use(&T->pool_in_use_reported, 0);
  cgt_tree_destroy(T->tree);
  T->tree = NULL;
  tx_event_destroy(T->ev_in);
  tx_event_destroy(T->ev_out);
  T->ev_in = T->ev_out = NULL;
  tx_step_outputs_free(T);
  Py_CLEAR(T->grad_leaves);
  T->closed = 1;
  closed_count++;
}

void tx_trees_close_pending(void) {
  if (closing || !tx_alloc_idle())
    return;
  closing = 1;
  tx_out_ref_queue_drain(); /* outputs that died since the last drain */
  for (size_t i = 0; i < tx_trees_orphaned;) {
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
    TreeObject **grown = realloc(orphans, cap * sizeof *grown);
    if (!grown) {
      PyErr_NoMemory();
      return -1;
    }
    orphans = grown;
    cap_orphans = cap;
  }
  T->orphaned = 1;
  orphans[tx_trees_orphaned++] = (TreeObject *)Py_NewRef((PyObject *)T);
  return 0; /* freed later, from a call of ours: not from a thread's exit or a finaliser */
}
