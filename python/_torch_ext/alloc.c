/* alloc.c — the CUDA allocator PyTorch uses once cgtree.torch is installed.
 *
 * cgtree's promise to a torch.compile'd program is memory parity with eager:
 * every byte a compiled segment allocates must come from the tree's one
 * checkpointed pool, and must be freed exactly when PyTorch frees it, so the
 * pool can hand the block to the next kernel as an eager program would. The
 * only door PyTorch offers to every allocation is a process-wide
 * CUDAPluggableAllocator, installed with change_current_allocator before CUDA
 * is first used; it calls cgt_torch_free, at the bottom of this file, and
 * oom.cc's cgt_torch_alloc_or_throw, which calls cgt_torch_alloc here and
 * turns its refusal into PyTorch's out-of-memory error (their names are
 * fixed in module.c's ALLOC_FN and FREE_FN).
 *
 * This file only routes. While seg_launch.c runs a launch function (warmup or
 * recording of a node), this thread's current launch is set, and every
 * allocation is cgt_launch_alloc on that launch. A free of such a block
 * inside the same launch is cgt_launch_free (a temporary, reused by later
 * kernels of the segment, exactly as eager); a free after the launch
 * returned is ignored, because the tree owns the block then (it is an output
 * value, or the tree freed it when the launch returned). Blocks are told
 * apart by a serial number per launch, kept in a small hash of pool pointers.
 * Everything else goes to eager.c, the CUDA driver's stream-ordered pools
 * behind a front cache. Both files keep their state under one lock,
 * tx_alloc_mu, so a free (pool pointer or eager block) takes it once, and
 * so does an allocation the front cache serves. Size 0 is NULL
 * (torch.empty(0) asks thousands of times).
 *
 * PyTorch's own memory statistics raise under a swapped allocator, so we
 * keep the figures that compare with them: bytes in use outside the pool
 * (counted as torch.cuda.memory_allocated counts), their peak, and the
 * combined peak, the most bytes in use at one moment outside the pool and
 * in it together (what compares with torch.cuda.max_memory_allocated of a
 * process without cgtree). Pool bytes in use are what the trees' allocators
 * hold (cgt_tree_stats' pool_allocated_bytes): segment.c reports that figure
 * after every cgt_run (tx_alloc_note_pool_in_use), and allocations inside a
 * launch add to it until then.
 *
 * Out of memory. The tree's pool and the driver's pool (eager.c) share the
 * device, but not their free memory: what eager code freed stays cached in
 * the front cache and the driver's pool, where PyTorch's single caching
 * allocator would have reused it for a compiled graph. So when the device
 * refuses the pool a chunk, the eager caches give their memory back and
 * the tree asks again (tx_alloc_reclaim, the tree's reclaim function;
 * pool_alloc_retries), the counterpart of eager.c's retry. A recording
 * cannot do that (its capture forbids synchronising), and makes the
 * warmup's allocations again, in memory the warmup already took. A refusal
 * is counted per thread (tx_alloc_refusals), so that segment.c can tell an
 * out-of-memory error from a graph's own error.
 */
#include "ext.h"

#include "alloc_entry.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct pool_ptr {
  void *ptr;
  uint64_t serial;
  UT_hash_handle hh;
} pool_ptr;

pthread_mutex_t tx_alloc_mu = PTHREAD_MUTEX_INITIALIZER; /* ext.h: eager.c's blocks share it */
static pool_ptr *pool_ptrs;
static tx_alloc_figures fig;
static uint64_t next_serial = 1;

static _Thread_local cgt_launch *tls_launch;
static _Thread_local uint64_t tls_serial;
/* This thread's refusals: how many so far, and the last one's request. */
static _Thread_local uint64_t tls_refusals;
static _Thread_local size_t tls_refused_bytes;
static _Thread_local int tls_refused_device, tls_refused_in_pool;
static _Thread_local int tls_refused_error; /* the driver's error (dev.c; 0 in a pool) */
/* Runs of cgt_run under way now, on every thread. While one is, a capture
 * may be open: from before its launch function is called until after it
 * returned (cgtree ends the capture then, and dropping the graph's outputs
 * frees blocks in between), so eager blocks are not given back to the
 * driver then (eager.c, "Frees while a capture"). Launches happen only
 * inside runs, so this one count covers them. */
static atomic_int runs_under_way;

void tx_alloc_run_enter(void) { atomic_fetch_add(&runs_under_way, 1); }

void tx_alloc_run_leave(void) { atomic_fetch_sub(&runs_under_way, 1); }

void tx_alloc_launch_enter(cgt_launch *l) {
  pthread_mutex_lock(&tx_alloc_mu);
  tls_serial = next_serial++;
  pthread_mutex_unlock(&tx_alloc_mu);
  tls_launch = l;
}

void tx_alloc_launch_leave(void) { tls_launch = NULL; }

void tx_alloc_flush_if_idle(void) {
  if (atomic_load(&runs_under_way) == 0)
    tx_eager_flush();
}

/* Called with tx_alloc_mu held, after anything that may raise the peak. */
static void combined_peak_check_locked(void) {
  size_t now = fig.eager_in_use + fig.pool_in_use;
  if (now > fig.combined_peak)
    fig.combined_peak = now;
}

/* Each tree reports its own figure; fig.pool_in_use is their sum (what
 * launches added since is in the next report). */
static size_t pool_in_use_reported;

void tx_alloc_note_pool_in_use(size_t *reported, size_t bytes) {
  pthread_mutex_lock(&tx_alloc_mu);
  pool_in_use_reported += bytes - *reported; /* modulo 2^n: exact */
  *reported = bytes;
  fig.pool_in_use = pool_in_use_reported;
  combined_peak_check_locked();
  pthread_mutex_unlock(&tx_alloc_mu);
}

int tx_alloc_idle(void) { return atomic_load(&runs_under_way) == 0; }

void tx_alloc_eager_took_locked(size_t bytes) {
  fig.eager_in_use += bytes;
  if (fig.eager_in_use > fig.eager_peak)
    fig.eager_peak = fig.eager_in_use;
  combined_peak_check_locked();
}

void tx_alloc_eager_returned_locked(size_t bytes) {
  fig.eager_in_use -= bytes < fig.eager_in_use ? bytes : fig.eager_in_use;
}

static void *eager_alloc(size_t size, int device, void *stream) {
  if (atomic_load(&runs_under_way) == 0)
    tx_eager_flush();
  return tx_eager_alloc(size, device, stream);
}

void tx_alloc_figures_get(tx_alloc_figures *out) {
  pthread_mutex_lock(&tx_alloc_mu);
  *out = fig;
  pthread_mutex_unlock(&tx_alloc_mu);
}

void tx_alloc_reset_peak(void) {
  pthread_mutex_lock(&tx_alloc_mu);
  fig.eager_peak = fig.eager_in_use;
  fig.combined_peak = fig.eager_in_use + fig.pool_in_use;
  pthread_mutex_unlock(&tx_alloc_mu);
}

/* CUDAPluggableAllocator loads cgt_torch_free and oom.cc's
 * cgt_torch_alloc_or_throw from this .so by name; tests call
 * cgt_torch_alloc (alloc_entry.h), which returns NULL where that one
 * throws. */

/* A refusal: counted, and described for oom.cc's exception. */
static void *refused(size_t size, int device, int in_pool) {
  tls_refusals++;
  tls_refused_bytes = size;
  tls_refused_device = device;
  tls_refused_in_pool = in_pool;
  tls_refused_error = in_pool ? 0 : tx_dev_pool_error();
  return NULL;
}

int tx_alloc_refusal_is_oom(void) { return tx_dev_error_is_memory(tls_refused_error); }

uint64_t tx_alloc_refusals(void) { return tls_refusals; }

void tx_alloc_refusal_text(char *buf, size_t cap) {
  int gib = tls_refused_bytes >= ((size_t)1 << 30);
  if (!tx_alloc_refusal_is_oom()) { /* not PyTorch's out-of-memory wording: retrying smaller would not help */
    snprintf(buf, cap,
             "CUDA error: %s (cgtree.torch: the CUDA driver's stream-ordered pool refused %.2f %s on device %d "
             "with error %d, which is not out of memory)",
             tx_dev_error_text(tls_refused_error),
             (double)tls_refused_bytes / (double)((size_t)1 << (gib ? 30 : 20)), gib ? "GiB" : "MiB",
             tls_refused_device, tls_refused_error);
    return;
  }
  snprintf(buf, cap,
           "CUDA out of memory. Tried to allocate %.2f %s on device %d (cgtree.torch: %s). Free tensors you no "
           "longer need, or call cgtree.torch.empty_cache().",
           (double)tls_refused_bytes / (double)((size_t)1 << (gib ? 30 : 20)), gib ? "GiB" : "MiB",
           tls_refused_device,
           tls_refused_in_pool ? "a compiled graph's memory pool could not grow"
                               : "the CUDA driver's stream-ordered pool refused it, after giving back what it "
                                 "kept cached");
}

/* The reclaim function of every tree (module.c sets it: cgt_tree_set_reclaim).
 * The tree calls it when the device refuses a chunk one of its pools needs:
 * memory eager code freed may still sit in the front cache (which the
 * driver sees in use) or in the driver's stream-ordered pool, where the
 * tree's pool cannot reach it, though PyTorch's one caching allocator would
 * reuse it. Both give it back to the device, and the tree asks once more;
 * only when no capture is open on any thread (no other run under way, and
 * the tree's stream not capturing: a warmup or a placeholder, not a
 * recording), since it synchronises the device. */
int tx_alloc_reclaim(void *tree_object, size_t bytes) {
  TreeObject *T = tree_object;
  (void)bytes;
  if (atomic_load(&runs_under_way) > 1 || (!T->on_simulator && tx_dev_capture_id(T->device, T->stream)))
    return 0;
  tx_eager_flush();                                /* blocks set aside during runs: no capture is open now */
  tx_eager_trim(T->on_simulator ? -1 : T->device, 1); /* the front cache, then the driver's pool */
  pthread_mutex_lock(&tx_alloc_mu);
  fig.pool_alloc_retries++;
  pthread_mutex_unlock(&tx_alloc_mu);
  return 1;
}

void *cgt_torch_alloc(ssize_t size, int device, void *stream) {
  if (size <= 0)
    return NULL;
  cgt_launch *l = tls_launch;
  if (!l) {
    void *p = eager_alloc((size_t)size, device, stream);
    return p ? p : refused((size_t)size, device, 0);
  }
  void *p = NULL;
  pool_ptr *e = tx_malloc(sizeof *e);
  if (!e || cgt_launch_alloc(l, (size_t)size, &p) != CGT_OK) {
    free(e);
    pthread_mutex_lock(&tx_alloc_mu);
    fig.pool_alloc_failures++;
    pthread_mutex_unlock(&tx_alloc_mu);
    return refused((size_t)size, device, 1);
  }
  pthread_mutex_lock(&tx_alloc_mu);
  pool_ptr *old = NULL;
  HASH_FIND_PTR(pool_ptrs, &p, old);
  if (old) { /* a block of an earlier launch, reused: its old tensor is gone or never freed */
    HASH_DEL(pool_ptrs, old);
    free(old);
  }
  e->ptr = p;
  e->serial = tls_serial;
  tx_hash_oomed = 0;
  HASH_ADD_PTR(pool_ptrs, ptr, e);
  if (tx_hash_oomed) { /* out of host memory: the block goes back, and the allocation is refused */
    fig.pool_alloc_failures++;
    pthread_mutex_unlock(&tx_alloc_mu);
    (void)cgt_launch_free(l, p);
    free(e);
    return refused((size_t)size, device, 1);
  }
  fig.pool_allocs++;
  fig.pool_in_use += (size_t)size; /* until segment.c reports the pool's own figure */
  combined_peak_check_locked();
  pthread_mutex_unlock(&tx_alloc_mu);
  return p;
}

void cgt_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  if (!ptr)
    return;
  int capture_may_run = atomic_load(&runs_under_way) > 0;
  if (!capture_may_run)
    tx_eager_flush();
  pthread_mutex_lock(&tx_alloc_mu);
  pool_ptr *e = NULL;
  HASH_FIND_PTR(pool_ptrs, &ptr, e);
  if (e) {
    int same_launch = tls_launch && e->serial == tls_serial;
    HASH_DEL(pool_ptrs, e);
    free(e);
    if (same_launch) {
      fig.pool_frees_in_launch++;
      fig.pool_in_use -= (size_t)size < fig.pool_in_use ? (size_t)size : fig.pool_in_use;
    } else {
      fig.pool_frees_ignored++;
    }
    pthread_mutex_unlock(&tx_alloc_mu);
    if (same_launch)
      (void)cgt_launch_free(tls_launch, ptr);
    return;
  }
  /* Not the pool's: an eager block, whose device and stream eager.c knows. */
  tx_eager_block *now = tx_eager_free_locked(ptr, capture_may_run);
  pthread_mutex_unlock(&tx_alloc_mu);
  tx_eager_give_back(now);
  (void)device;
  (void)stream;
}

/* PyTorch's C++ recordStream reaches us here, through the hook
 * record_stream_hook.cc sets on the pluggable allocator (autograd's
 * gradients consumed on another stream than their producer's, and
 * Tensor.record_stream itself). eager.c keeps the stream on an eager
 * block, and the block's free waits for it; for other memory (a compiled
 * graph's output) the trees' next launches wait for it (pool_readers.c). */
static _Atomic uint64_t records_refused, records_refused_synced;

/* Out of host memory a record cannot be kept: its note (eager.c's list of
 * the block's streams, pool_readers.c's of reading streams) could not
 * grow, and the call fails. Nothing kept the memory from reuse then: the
 * tensor dies as the error unwinds, an eager block went to the front cache
 * and served its stream's next allocation, a compiled output's memory was
 * overwritten by the next replay, while the named stream still read it (a
 * helper's fault loops). So before it fails, the host waits for that
 * stream's work so far, which holds the read a program queues before its
 * record_stream (the usual order); work it queues there after the failed
 * call is its own to order. Where the memory is no CUDA memory (the
 * simulator) or the stream captures, nothing can wait: counted apart. */
static int record_refused(void *ptr, void *stream) {
  atomic_fetch_add(&records_refused, 1);
  atomic_fetch_add(&records_refused_synced, (uint64_t)tx_dev_sync_stream_reading(ptr, stream));
  return -1;
}

void tx_alloc_records_refused(uint64_t *refused, uint64_t *synced) {
  *refused = atomic_load(&records_refused);
  *synced = atomic_load(&records_refused_synced);
}

int tx_alloc_record_stream(void *ptr, void *stream) {
  int rc = tx_eager_record_stream(ptr, stream);
  if (rc < 0 || (rc == 0 && tx_pool_readers_note(stream) < 0)) /* rc 0: not an eager block: a graph's output, maybe */
    return record_refused(ptr, stream);
  return rc;
}

int cgt_torch_record_stream(void *ptr, void *stream) { return tx_alloc_record_stream(ptr, stream) < 0 ? -1 : 1; }
