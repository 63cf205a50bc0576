/* eager.c — memory outside the tree's pool: the driver's stream-ordered
 * pools, behind a small front cache for same-stream reuse.
 *
 * Once cgtree.torch is installed, every CUDA allocation of the process comes
 * to alloc.c. Those inside a segment's warmup or recording go to the tree's
 * pool (exact frees: memory parity with eager). Everything else (parameters,
 * inputs, eager ops between graph breaks, other libraries' tensors) comes
 * here, and here we do not write an allocator: we use the one the CUDA
 * driver has, its per-device stream-ordered memory pool
 * (cudaMallocFromPoolAsync / cudaFreeAsync), which is what PyTorch's own
 * `backend:cudaMallocAsync` uses. It is per device and per stream by
 * construction: a block freed on a stream is reused in that stream's order,
 * and by another stream only once the driver knows the free has happened.
 *
 * The front cache. A driver call costs a few microseconds, and a program
 * that makes a handful of small allocations per call (an eager op between
 * graph breaks, Inductor's plain graphs) pays them at every call; PyTorch's
 * caching allocator serves a same-stream reuse with no CUDA call at all.
 * So a freed block first goes to a front cache, a free list per (device,
 * stream, size rounded up to 512 bytes), and the next allocation of that
 * key takes it back with no CUDA call. That is the one case that needs no
 * bookkeeping of events: the block's stream is the same, so its new work
 * is ordered after its old work, exactly as in PyTorch's caching
 * allocator. Everything else (another stream, another device, a block a
 * recorded stream still reads, a block over FRONT_MAX_BLOCK) goes to or
 * through the driver's pool as before: the pool still owns all the memory
 * and all the cross-stream semantics, and the front cache is not an
 * allocator, only a way of skipping the driver for one case. Every block
 * is allocated at its size class (the request rounded up to 512 bytes,
 * which is also what PyTorch counts as in use), so a cached block serves
 * any request of its class.
 *
 * Bounds of the front cache: per device at most front_limit bytes
 * (CGTREE_TORCH_FRONT_CACHE_BYTES, default 256 MiB; 0 turns it off), and
 * only blocks up to FRONT_MAX_BLOCK (16 MiB). A free that takes a device
 * over its bound gives the device's oldest freed blocks back to the driver
 * (cudaFreeAsync on their streams), oldest first, from a list of the
 * device's cached blocks in the order they were freed: O(1) a block.
 * Each key's list is served newest first (the block most likely still in
 * the L2 cache). A bin, the list of one key, stays when it empties (the
 * same key usually comes back at the next call); empty bins are swept when
 * their number has doubled since the last sweep, O(1) amortised.
 *
 * What the driver cannot know is that a stream other than the block's own
 * still reads it: that is what Tensor.record_stream(s) tells an allocator,
 * and what PyTorch's C++ tells it where it moves data across streams
 * (autograd's engine, for a gradient consumed on another stream than its
 * producer's). PyTorch's pluggable allocator hands recordStream on only
 * through a C++ hook, which cgtree.torch builds against PyTorch and sets at
 * install (record_stream_hook.cc); it calls cgt_torch_record_stream
 * (alloc.c), which tells us (tx_eager_record_stream). Where the hook could
 * not be built, cgtree.torch wraps Tensor.record_stream instead, and
 * PyTorch's own C++ calls are not seen (install warns). The free then
 * makes the block's stream wait for every recorded stream's work so far,
 * with an event on that stream's device, before cudaFreeAsync, exactly as
 * PyTorch's cudaMallocAsync backend does; such a block never enters the
 * front cache.
 *
 * Bounds of the pools. The pool keeps freed memory cached up to its
 * release threshold (CGTREE_TORCH_CACHE_BYTES, default 2 GiB a device, set
 * at first use) and gives the rest back at synchronisation points. When an
 * allocation fails we give the device's front-cached blocks back to the
 * pool, synchronise the device, trim the pool to nothing and try once more
 * (num_alloc_retries); if that fails too, the allocation fails (num_ooms)
 * and PyTorch raises its out-of-memory error, which the program can catch.
 * empty_cache (tx_eager_trim) drains the front cache the same way.
 *
 * Frees while a capture may be under way. A block PyTorch frees while a
 * cgt_run of ours is under way (a capture spans the launch function and the
 * moments after it returns, where dropping the graph's outputs frees
 * blocks; Python's garbage collector can free any tensor at any moment)
 * must not be given back then: cudaFreeAsync on the
 * legacy stream, where most eager tensors live, would make it depend on
 * the capturing stream and invalidate the capture. alloc.c passes such frees
 * with `later`. Entering the front cache makes no CUDA call at all (it
 * links the block into two lists under our lock), so a deferred free of a
 * block the front cache accepts goes straight there; its later reuse is an
 * allocation on the block's own stream, which is as safe during a capture
 * as any allocation there, and needs no driver call either. Only what must
 * reach the driver (a block the front cache refuses, and the oldest blocks
 * a deferred free pushes over the bound) waits on a list, and is given back
 * at the next eager allocation or free outside a cgt_run, or at the next
 * segment call.
 *
 * Captures that are not ours. Every allocation of the process comes here,
 * those of a CUDA graph other code captures (torch.cuda.graph,
 * torch.cuda.make_graphed_callables, a library's own graphs) included, and
 * PyTorch tells a pluggable allocator nothing of them. Such a graph keeps
 * writing the memory its capture used at every replay, temporaries it freed
 * during the capture included. Had the front cache served it a block, or
 * taken back one it freed, an eager tensor allocated later on that stream
 * would share the graph's memory, and the graph's next replay would
 * overwrite it. So we ask the stream (cudaStreamGetCaptureInfo; never the
 * legacy default stream, which cannot capture; a stream CUDA cannot tell
 * about counts as capturing, the safe side): inside a capture, an
 * allocation takes no front-cached block and comes from the driver, where
 * the capture makes it a node of the graph, as PyTorch's
 * backend:cudaMallocAsync does; such a block is marked with its capture
 * and never enters the front cache, and its free goes to the driver (a
 * free node of its own capture's graph while that is open, which no
 * stream's work depends on, so that a side stream that joined back stays
 * joined: dev.c, "Frees inside another's capture"; after it, outside any
 * graph). A give-back to the driver on a stream that captures a capture not
 * the block's own would join or break that capture, so it is put off to a
 * later flush. No retry after out of memory inside a capture: trimming
 * synchronises the device, which a capture forbids. Nor is the device
 * synchronised while a capture of ours may run or one not ours is known
 * open (a block allocated in it lives and its stream still captures):
 * CUDA forbids that on every thread and in every mode, and breaks the
 * capture; the trim then gives back only what is free already (dev.c,
 * "Other threads' captures"). Tests: test_torch_trust.py
 * (torch.cuda.graph, then eager tensors on its stream; fails with the old
 * behaviour), test_torch_ext_sim.py (the simulator's captures).
 *
 * Locking. PyTorch frees from any thread. alloc.c's figures and our blocks
 * share one lock (tx_alloc_mu), so a free and an allocation the front cache
 * serves take it once; the driver calls are made outside it.
 *
 * Figures, with PyTorch's meanings: allocated bytes count requests rounded
 * up to 512 bytes, as torch.cuda.memory_allocated does, and front-cached
 * blocks are not in use; reserved bytes are what the driver's pools hold,
 * front-cached blocks included (they are still the pool's). Every block we
 * hold from the driver, in use or front-cached, is in a hash (pointer ->
 * size, device, stream, recorded streams), which frees and record_stream
 * need anyway; a cached block keeps its record, so its reuse allocates no
 * record either.
 */
#include "ext.h"

#include <stdatomic.h>
#include <stdlib.h>

enum { MAX_EAGER_DEVICES = 64, MIN_BINS_TO_SWEEP = 64 };
#define FRONT_MAX_BLOCK ((size_t)16 << 20)

typedef struct front_bin front_bin;

struct eager_block {
  void *ptr;
  size_t size;     /* the request it serves now */
  size_t bytes;    /* what it holds from the driver: its size class, the request rounded up to 512 */
  int device;
  void *stream;    /* the stream it was allocated on (its free's stream) */
  uint64_t serial; /* of its allocation, for tx_eager_held */
  unsigned long long capture; /* the capture (not ours) it was allocated in, or 0: never front-cached */
  pthread_t capturing_thread; /* with capture: the thread that allocated it, whose capture it is */
  void **used_on;  /* streams record_stream named, or NULL */
  size_t n_used, cap_used;
  front_bin *bin;  /* its bin while front-cached, else NULL (in use) */
  struct eager_block *bin_newer, *bin_older; /* in its bin, newest first */
  struct eager_block *dev_newer, *dev_older; /* in its device's front list, oldest first */
  struct eager_block *next_out;              /* on a list of blocks to give back */
  int waited_capture; /* its give-back was put off for a capture: counted once (frees_waiting_capture) */
  UT_hash_handle hh;
};
typedef struct eager_block eager_block;

/* What a front-cached block is kept under; hashed as bytes, so no padding. */
typedef struct front_key {
  void *stream;
  size_t bytes;
  int64_t device;
} front_key;

struct front_bin {
  front_key key;
  eager_block *newest;
  UT_hash_handle hh;
};

/* A device's front-cached blocks in the order they were freed: the oldest
 * go back to the driver first. */
typedef struct front_device {
  eager_block *oldest, *newest;
  size_t bytes, blocks;
} front_device;

static eager_block *blocks; /* every block held from the driver, in use or front-cached */
static tx_eager_figures fig;
static size_t in_use_by_device[MAX_EAGER_DEVICES + 1]; /* index 0: device -1 (host) */
static front_device front_by_device[MAX_EAGER_DEVICES + 1];
static front_bin *bins;
static size_t n_bins, n_bins_after_sweep, front_blocks_all;
static size_t front_limit = (size_t)256 << 20;
static eager_block *pending; /* to be given back at the next tx_eager_flush */
static atomic_int any_pending;
static uint64_t keep_bytes = 2ull << 30;
static uint64_t serial;

/* Puts a list of blocks (linked by next_out) on `pending`, to be given back
 * at the next tx_eager_flush; returns how many. With tx_alloc_mu held. */
static size_t defer_locked(eager_block *list) {
  size_t n = 0;
  while (list) {
    eager_block *next = list->next_out;
    list->next_out = pending;
    pending = list;
    list = next;
    n++;
  }
  if (n)
    atomic_store(&any_pending, 1);
  return n;
}

/* A request as PyTorch's allocator counts it in memory_allocated: also the
 * size class a block is allocated and front-cached at. */
static size_t counted_bytes(size_t n) { return (n + 511) / 512 * 512; }

static size_t device_slot(int device) {
  if (device < -1 || device >= MAX_EAGER_DEVICES)
    return 0;
  return (size_t)(device + 1);
}

void tx_eager_set_cache_bytes(uint64_t bytes) { keep_bytes = bytes; }

/* ------------------------------------------------------ the front cache */

static front_key key_of(int device, void *stream, size_t bytes) {
  front_key k;
  memset(&k, 0, sizeof k);
  k.stream = stream;
  k.bytes = bytes;
  k.device = device;
  return k;
}

static front_bin *bin_find_locked(front_key key) {
  front_bin *bin = NULL;
  HASH_FIND(hh, bins, &key, sizeof key, bin);
  return bin;
}

/* Empty bins go when their number has doubled since the last sweep. */
static void bins_sweep_if_grown_locked(void) {
  if (n_bins < MIN_BINS_TO_SWEEP || n_bins < 2 * n_bins_after_sweep)
    return;
  front_bin *bin, *tmp;
  HASH_ITER(hh, bins, bin, tmp) {
    if (!bin->newest) {
      HASH_DEL(bins, bin);
      free(bin);
      n_bins--;
    }
  }
  n_bins_after_sweep = n_bins;
}

/* The bin of key, made if there is none; NULL out of host memory. */
static front_bin *bin_get_locked(front_key key) {
  front_bin *bin = bin_find_locked(key);
  if (bin)
    return bin;
  bins_sweep_if_grown_locked();
  bin = tx_calloc(1, sizeof *bin);
  if (!bin)
    return NULL;
  bin->key = key;
  tx_hash_oomed = 0;
  HASH_ADD(hh, bins, key, sizeof key, bin);
  if (tx_hash_oomed) {
    free(bin);
    return NULL;
  }
  n_bins++;
  return bin;
}

/* Blocks the front cache keeps: no recorded streams (another stream may
 * still read it), not too big, and the cache is on. */
static int front_accepts(const eager_block *b) {
  return b->n_used == 0 && !b->capture && b->bytes <= FRONT_MAX_BLOCK && b->bytes <= front_limit;
}

/* Links b, just freed, as the newest of its bin and of its device; 0 out
 * of host memory (b is then not cached). */
static int front_link_locked(eager_block *b) {
  front_bin *bin = bin_get_locked(key_of(b->device, b->stream, b->bytes));
  if (!bin)
    return 0;
  b->bin = bin;
  b->bin_older = bin->newest;
  b->bin_newer = NULL;
  if (bin->newest)
    bin->newest->bin_newer = b;
  bin->newest = b;
  front_device *fd = &front_by_device[device_slot(b->device)];
  b->dev_older = fd->newest;
  b->dev_newer = NULL;
  if (fd->newest)
    fd->newest->dev_newer = b;
  else
    fd->oldest = b;
  fd->newest = b;
  fd->bytes += b->bytes;
  fd->blocks++;
  front_blocks_all++;
  return 1;
}

/* Takes b out of its bin and its device's list: it is in use again, or
 * goes back to the driver. */
static void front_unlink_locked(eager_block *b) {
  front_bin *bin = b->bin;
  if (b->bin_newer)
    b->bin_newer->bin_older = b->bin_older;
  else
    bin->newest = b->bin_older;
  if (b->bin_older)
    b->bin_older->bin_newer = b->bin_newer;
  front_device *fd = &front_by_device[device_slot(b->device)];
  if (b->dev_newer)
    b->dev_newer->dev_older = b->dev_older;
  else
    fd->newest = b->dev_older;
  if (b->dev_older)
    b->dev_older->dev_newer = b->dev_newer;
  else
    fd->oldest = b->dev_newer;
  fd->bytes -= b->bytes;
  fd->blocks--;
  front_blocks_all--;
  b->bin = NULL;
}

/* The newest cached block of (device, stream, size class), taken out of
 * the cache; NULL if there is none. */
static eager_block *front_take_locked(int device, void *stream, size_t bytes) {
  if (!front_blocks_all)
    return NULL;
  front_bin *bin = bin_find_locked(key_of(device, stream, bytes));
  eager_block *b = bin ? bin->newest : NULL;
  if (b)
    front_unlink_locked(b);
  return b;
}

/* Moves the oldest cached blocks of a device slot onto *out, out of the
 * cache and the hash, until the slot holds at most `limit` bytes. */
static void front_trim_locked(size_t slot, size_t limit, eager_block **out) {
  front_device *fd = &front_by_device[slot];
  while (fd->bytes > limit) {
    eager_block *b = fd->oldest;
    front_unlink_locked(b);
    HASH_DEL(blocks, b);
    b->next_out = *out;
    *out = b;
    fig.front_returns++;
  }
}

/* Every front-cached block of a device, out of the cache: to give back. */
static eager_block *front_drain(int device) {
  eager_block *out = NULL;
  pthread_mutex_lock(&tx_alloc_mu);
  front_trim_locked(device_slot(device), 0, &out);
  pthread_mutex_unlock(&tx_alloc_mu);
  return out;
}

void tx_eager_set_front_bytes(size_t bytes) {
  eager_block *out = NULL;
  pthread_mutex_lock(&tx_alloc_mu);
  front_limit = bytes;
  for (size_t slot = 0; slot <= MAX_EAGER_DEVICES; slot++)
    front_trim_locked(slot, front_limit, &out);
  defer_locked(out); /* a capture may run on another thread: no stream call now */
  pthread_mutex_unlock(&tx_alloc_mu);
}

/* -------------------------------------------------- allocation and free */

/* b serves a request of size bytes from now on. */
static void *mark_in_use_locked(eager_block *b, size_t size) {
  b->size = size;
  b->serial = ++serial;
  fig.allocations++;
  in_use_by_device[device_slot(b->device)] += b->bytes;
  tx_alloc_eager_took_locked(b->bytes);
  return b->ptr;
}

/* A new block from the driver's pool; on failure the device's front
 * cache goes back to the pool, the pool is trimmed, and it is tried once
 * more (not inside a capture: capture is the one open on stream, or 0). */
static void *alloc_from_driver(size_t size, int device, void *stream, unsigned long long capture) {
  eager_block *b = tx_calloc(1, sizeof *b);
  if (!b)
    return NULL;
  size_t bytes = counted_bytes(size);
  void *p = tx_dev_pool_alloc(bytes, device, stream, keep_bytes);
  int retried = 0;
  if (!p && !capture && tx_dev_error_is_memory(tx_dev_pool_error())) { /* another cause: trimming won't help */
    tx_eager_trim(device, tx_alloc_idle());
    retried = 1;
    p = tx_dev_pool_alloc(bytes, device, stream, keep_bytes);
  }
  pthread_mutex_lock(&tx_alloc_mu);
  fig.num_alloc_retries += (uint64_t)retried;
  if (!p) {
    int memory = tx_dev_error_is_memory(tx_dev_pool_error());
    fig.num_ooms += (uint64_t)memory;
    fig.driver_alloc_errors += (uint64_t)!memory;
    pthread_mutex_unlock(&tx_alloc_mu);
    free(b);
    return NULL;
  }
  b->ptr = p;
  b->bytes = bytes;
  b->device = device;
  b->stream = stream;
  b->capture = capture;
  if (capture)
    b->capturing_thread = pthread_self();
  fig.capture_allocations += (uint64_t)(capture != 0);
  tx_hash_oomed = 0;
  HASH_ADD_PTR(blocks, ptr, b);
  if (tx_hash_oomed) { /* out of host memory: the block goes back, PyTorch raises its out-of-memory error */
    fig.num_ooms++;
    pthread_mutex_unlock(&tx_alloc_mu);
    tx_dev_pool_free(p, device, stream);
    free(b);
    return NULL;
  }
  fig.driver_allocations++;
  mark_in_use_locked(b, size);
  pthread_mutex_unlock(&tx_alloc_mu);
  return p;
}

void *tx_eager_alloc(size_t size, int device, void *stream) {
  if (size > SIZE_MAX - 511)
    return NULL;
  unsigned long long capture = tx_dev_capture_id(device, stream);
  if (capture) /* a capture that is not ours: the graph's memory comes from the driver, never the front cache */
    return alloc_from_driver(size, device, stream, capture);
  pthread_mutex_lock(&tx_alloc_mu);
  eager_block *b = front_take_locked(device, stream, counted_bytes(size));
  if (b) {
    fig.front_hits++;
    void *p = mark_in_use_locked(b, size);
    pthread_mutex_unlock(&tx_alloc_mu);
    return p;
  }
  pthread_mutex_unlock(&tx_alloc_mu);
  return alloc_from_driver(size, device, stream, 0);
}

/* Gives b's memory back to its device's pool, ordered after its stream's
 * and its recorded streams' work: 1 if as a node of the open capture that
 * allocated it (dev.c, "Frees inside another's capture"; on the capturing
 * thread only), 0 on its stream. A recorded stream of another device
 * (record_stream takes any) gets its event on its own device, where CUDA
 * records it; a legacy default stream (NULL, every device's) and a
 * simulator's block (device -1: its streams are not CUDA's) are taken as
 * the block's device's. */
static int give_back(eager_block *b) {
  /* As a node only on the thread whose capture it is: CUDA's graphs are not
   * thread-safe, and that thread's capture adds nodes to the same graph. */
  int as_node = b->capture && pthread_equal(b->capturing_thread, pthread_self()) &&
                tx_dev_capture_free(b->ptr, b->device, b->stream, b->used_on, b->n_used, b->capture);
  if (!as_node) {
    for (size_t i = 0; i < b->n_used; i++) { /* recorded streams: the free waits for their work so far */
      int device = b->device >= 0 ? tx_dev_stream_device(b->used_on[i]) : -1;
      tx_dev_stream_after(b->stream, b->used_on[i], device >= 0 ? device : b->device);
    }
    tx_dev_pool_free(b->ptr, b->device, b->stream);
  }
  free(b->used_on);
  free(b);
  return as_node;
}

/* Would giving b back now join or break a capture that is not b's own? Its
 * stream's, or a recorded stream's: give_back records an event on each
 * recorded stream and makes b's stream wait for it, and an event recorded
 * inside another capture would pull b's stream, and its free, into that
 * capture (which then refuses a free of memory it never allocated). */
static int capture_in_the_way(const eager_block *b) {
  unsigned long long open = tx_dev_capture_id(b->device, b->stream);
  if (open && open != b->capture)
    return 1;
  for (size_t i = 0; i < b->n_used; i++) {
    unsigned long long u = tx_dev_capture_id(b->device, b->used_on[i]);
    if (u && u != b->capture)
      return 1;
  }
  return 0;
}

void tx_eager_give_back(tx_eager_block *list) {
  if (!list)
    return;
  size_t n = 0, newly_waiting = 0, as_nodes = 0;
  eager_block *wait = NULL;
  for (eager_block *b = list, *next; b; b = next) {
    next = b->next_out;
    if (capture_in_the_way(b)) { /* it waits for that capture's end */
      newly_waiting += (size_t)!b->waited_capture;
      b->waited_capture = 1;
      b->next_out = wait;
      wait = b;
      continue;
    }
    as_nodes += (size_t)give_back(b);
    n++;
  }
  pthread_mutex_lock(&tx_alloc_mu);
  fig.driver_frees += n;
  fig.capture_free_nodes += as_nodes;
  fig.frees_waiting_capture += newly_waiting; /* a block put off again at a later flush counts once */
  defer_locked(wait);
  pthread_mutex_unlock(&tx_alloc_mu);
}

tx_eager_block *tx_eager_free_locked(void *p, int later) {
  eager_block *b = NULL;
  HASH_FIND_PTR(blocks, &p, b);
  if (!b || b->bin)
    return NULL; /* not ours, or front-cached already */
  fig.frees++;
  in_use_by_device[device_slot(b->device)] -= b->bytes;
  tx_alloc_eager_returned_locked(b->bytes);
  eager_block *out = NULL;
  if (front_accepts(b) && front_link_locked(b)) {
    front_trim_locked(device_slot(b->device), front_limit, &out); /* never b: it is the newest, within the bound */
  } else {
    HASH_DEL(blocks, b);
    b->next_out = NULL;
    out = b;
  }
  if (!later || !out)
    return out;
  fig.deferred_frees += defer_locked(out); /* a capture may be under way: no stream call now (see tx_eager_flush) */
  return NULL;
}

void tx_eager_flush(void) {
  if (!atomic_load(&any_pending))
    return; /* the common case, without the lock */
  pthread_mutex_lock(&tx_alloc_mu);
  atomic_store(&any_pending, 0);
  eager_block *b = pending;
  pending = NULL;
  pthread_mutex_unlock(&tx_alloc_mu);
  tx_eager_give_back(b);
}

/* ------------------------------------------------ record_stream, figures */

/* Adds stream to b's recorded streams, once; 0 out of host memory. */
static int used_on_add_locked(eager_block *b, void *stream) {
  for (size_t i = 0; i < b->n_used; i++)
    if (b->used_on[i] == stream)
      return 1;
  if (b->n_used == b->cap_used) {
    size_t cap = b->cap_used ? 2 * b->cap_used : 2;
    void **grown = tx_realloc(b->used_on, cap * sizeof *grown);
    if (!grown)
      return 0;
    b->used_on = grown;
    b->cap_used = cap;
  }
  b->used_on[b->n_used++] = stream;
  fig.recorded_streams++;
  return 1;
}

int tx_eager_record_stream(void *p, void *stream) {
  pthread_mutex_lock(&tx_alloc_mu);
  eager_block *b = NULL;
  HASH_FIND_PTR(blocks, &p, b);
  int rc = 0;
  if (b && !b->bin) /* its own stream needs nothing: stream order covers it */
    rc = stream == b->stream || used_on_add_locked(b, stream) ? 1 : -1;
  pthread_mutex_unlock(&tx_alloc_mu);
  return rc;
}

uint64_t tx_eager_serial(void) {
  pthread_mutex_lock(&tx_alloc_mu);
  uint64_t s = serial;
  pthread_mutex_unlock(&tx_alloc_mu);
  return s;
}

size_t tx_eager_held(uint64_t since, size_t *sizes, uint64_t *serials, void **ptrs, size_t cap) {
  size_t n = 0;
  pthread_mutex_lock(&tx_alloc_mu);
  for (eager_block *b = blocks; b; b = b->hh.next) {
    if (b->bin || b->serial <= since)
      continue;
    if (n < cap) {
      sizes[n] = b->size;
      serials[n] = b->serial;
      ptrs[n] = b->ptr;
    }
    n++;
  }
  pthread_mutex_unlock(&tx_alloc_mu);
  return n;
}

void tx_eager_figures_get(int device, tx_eager_figures *out) {
  pthread_mutex_lock(&tx_alloc_mu);
  *out = fig;
  out->in_use = in_use_by_device[device_slot(device)];
  out->live_blocks = HASH_COUNT(blocks) - front_blocks_all;
  out->front_bytes = front_by_device[device_slot(device)].bytes;
  out->front_blocks = front_by_device[device_slot(device)].blocks;
  out->front_limit = front_limit;
  pthread_mutex_unlock(&tx_alloc_mu);
  out->reserved = out->reserved_peak = 0;
  (void)tx_dev_pool_figures(device, &out->reserved, &out->reserved_peak);
}

/* b's recorded uses of stream go (its work is over). */
static void forget_stream_locked(eager_block *b, void *stream) {
  for (size_t i = 0; i < b->n_used;)
    if (b->used_on[i] == stream)
      b->used_on[i] = b->used_on[--b->n_used];
    else
      i++;
}

/* Blocks of a stream about to go (a freed tree's, tree_close.c). Its work
 * is done (the tree synchronised it), so the front-cached blocks of it go
 * back to the driver on it while it still exists, and a live block of it
 * (a tensor allocated on it outside any launch and still held) has its
 * free ordered on the legacy default stream instead: whatever reads it
 * from now on runs on some other stream, as for any block whose stream's
 * work is over. A recorded use of the stream is dropped the same way. */
void tx_eager_retire_stream(int device, void *stream) {
  eager_block *out = NULL;
  size_t rehomed = 0;
  pthread_mutex_lock(&tx_alloc_mu);
  eager_block *b, *tmp;
  HASH_ITER(hh, blocks, b, tmp) {
    if (b->device != device)
      continue;
    forget_stream_locked(b, stream);
    if (b->stream != stream)
      continue;
    if (b->bin) {
      front_unlink_locked(b);
      HASH_DEL(blocks, b);
      b->next_out = out;
      out = b;
      fig.front_returns++;
    } else {
      b->stream = NULL;
      rehomed++;
    }
  }
  for (b = pending; b; b = b->next_out) { /* set aside during a run, given back at the next flush */
    if (b->device != device)
      continue;
    forget_stream_locked(b, stream);
    if (b->stream == stream)
      b->stream = NULL;
  }
  fig.blocks_rehomed += rehomed;
  pthread_mutex_unlock(&tx_alloc_mu);
  tx_eager_give_back(out);
}

/* Is a capture that is not ours known to be open on device? Known: a
 * block allocated inside it lives, and its stream still captures with its
 * id (or CUDA cannot tell). A capture that allocated nothing here, or
 * whose every block it freed, is not known. With tx_alloc_mu held. */
static int foreign_capture_open_locked(int device) {
  eager_block *b, *tmp;
  HASH_ITER(hh, blocks, b, tmp) {
    if (!b->capture || b->device != device)
      continue;
    unsigned long long id = tx_dev_capture_id(device, b->stream);
    if (id && (id == b->capture || id == TX_CAPTURE_UNKNOWN))
      return 1;
  }
  return 0;
}

void tx_eager_trim(int device, int none_of_ours_open) {
  tx_eager_give_back(front_drain(device));
  pthread_mutex_lock(&tx_alloc_mu);
  int may_sync = none_of_ours_open && !foreign_capture_open_locked(device);
  fig.trims_without_sync += (uint64_t)!may_sync;
  pthread_mutex_unlock(&tx_alloc_mu);
  tx_dev_pool_trim(device, may_sync);
}
