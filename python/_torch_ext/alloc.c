/* alloc.c — the CUDA allocator PyTorch uses once cgtree.torch is installed.
 *
 * cgtree's promise to a torch.compile'd program is memory parity with eager:
 * every byte a compiled segment allocates must come from the tree's one
 * checkpointed pool, and must be freed exactly when PyTorch frees it, so the
 * pool can hand the block to the next kernel as an eager program would. The
 * only door PyTorch offers to every allocation is a process-wide
 * CUDAPluggableAllocator, installed with change_current_allocator before CUDA
 * is first used; it calls the two functions exported at the bottom of this
 * file (their names are fixed in python/cgtree/torch/_install.py).
 *
 * Routing is by thread: while segment.c runs a launch function (warmup or
 * recording of a node), this thread's current launch is set, and every
 * allocation is cgt_launch_alloc on that launch. A free of such a block
 * inside the same launch is cgt_launch_free (a temporary, reused by later
 * kernels of the segment, exactly as eager); a free after the launch
 * returned is ignored, because the tree owns the block then (it is an output
 * value, or the tree freed it when the launch returned). Blocks are told
 * apart by a serial number per launch, kept in a small hash of pool pointers.
 *
 * Outside a launch (parameters, inputs, eager ops between graph breaks) we
 * hand out plain device memory. cudaFree synchronises the device, so freed
 * blocks are cached by (rounded size, stream) and reused on the same stream
 * only, which is safe without events because work on one stream is ordered.
 * Device -1 is host memory, for the simulator tests (PyTorch never asks it).
 * A failing cudaMalloc gives the cache back and tries once more. Size 0 is
 * NULL (torch.empty(0) asks thousands of times).
 *
 * PyTorch's own memory statistics raise under a swapped allocator, so this
 * file keeps its own: bytes in use, peak and reserved outside the pool.
 * "In use" counts what PyTorch asked for, rounded up to 512 bytes, which is
 * how PyTorch's caching allocator counts torch.cuda.memory_allocated (a
 * block's size is the request rounded to 512 bytes), so the figures compare
 * with torch.cuda.max_memory_allocated of a process without cgtree.
 * "Reserved" counts what cudaMalloc handed out (the cache's rounded sizes),
 * like torch.cuda.memory_reserved.
 *
 * The peak that compares with torch.cuda.max_memory_allocated is the
 * combined one: the most bytes in use at one moment, outside the pool and in
 * it together. Pool bytes in use are what the trees' allocators hold
 * (cgt_tree_stats' pool_allocated_bytes): segment.c reports that figure after
 * every cgt_run (tx_alloc_note_pool_in_use), and allocations inside a launch
 * add to it until then. The combined peak is checked at every allocation of
 * either kind, which is when it can grow.
 */
#include "ext.h"

#include <pthread.h>
#include <stdlib.h>


typedef struct pool_ptr {
  void *ptr;
  uint64_t serial;
  UT_hash_handle hh;
} pool_ptr;

typedef struct bucket_key {
  size_t bytes;
  void *stream;
} bucket_key;

typedef struct bucket {
  bucket_key key;
  void **ptrs;
  size_t n, cap;
  UT_hash_handle hh;
} bucket;

/* The cache key of host blocks (device -1): no real stream has this handle. */
#define HOST_STREAM ((void *)(intptr_t)-1)

static pthread_mutex_t alloc_mu = PTHREAD_MUTEX_INITIALIZER;
static pool_ptr *pool_ptrs;
static bucket *buckets;
static tx_alloc_figures fig;
static uint64_t next_serial = 1;

static _Thread_local cgt_launch *tls_launch;
static _Thread_local uint64_t tls_serial;

void tx_alloc_launch_enter(cgt_launch *l) {
  pthread_mutex_lock(&alloc_mu);
  tls_serial = next_serial++;
  pthread_mutex_unlock(&alloc_mu);
  tls_launch = l;
}

void tx_alloc_launch_leave(void) { tls_launch = NULL; }

/* Small blocks round to 512 bytes like PyTorch's; large ones to 128 KiB so
 * slightly different sizes still share a bucket. */
static size_t round_bytes(size_t n) {
  size_t q = n <= (1u << 20) ? 512 : (128u << 10);
  return (n + q - 1) / q * q;
}

/* A request as PyTorch's allocator counts it in memory_allocated. */
static size_t in_use_bytes(size_t n) { return (n + 511) / 512 * 512; }

static bucket *bucket_find(size_t bytes, void *stream, int create) {
  bucket_key k;
  memset(&k, 0, sizeof k);
  k.bytes = bytes;
  k.stream = stream;
  bucket *b = NULL;
  HASH_FIND(hh, buckets, &k, sizeof k, b);
  if (!b && create) {
    b = calloc(1, sizeof *b);
    if (!b)
      return NULL;
    b->key = k;
    HASH_ADD(hh, buckets, key, sizeof k, b);
  }
  return b;
}

static size_t release_cached_locked(void) {
  size_t given = 0;
  bucket *b, *tmp;
  HASH_ITER(hh, buckets, b, tmp) {
    for (size_t i = 0; i < b->n; i++) {
      tx_dev_free(b->ptrs[i], b->key.stream == HOST_STREAM ? -1 : 0);
      given += b->key.bytes;
    }
    b->n = 0;
  }
  fig.eager_reserved -= given;
  return given;
}

size_t tx_alloc_empty_cache(void) {
  pthread_mutex_lock(&alloc_mu);
  size_t n = release_cached_locked();
  pthread_mutex_unlock(&alloc_mu);
  return n;
}

/* Called with alloc_mu held, after anything that may raise the peak. */
static void combined_peak_check_locked(void) {
  size_t now = fig.eager_in_use + fig.pool_in_use;
  if (now > fig.combined_peak)
    fig.combined_peak = now;
}

/* Each device's tree reports its own figure; fig.pool_in_use becomes their
 * sum (what launches added since is in the new report). */
enum { MAX_DEVICES = 64 };
static size_t pool_in_use_by_device[MAX_DEVICES], pool_in_use_reported;

void tx_alloc_note_pool_in_use(int device, size_t bytes) {
  if (device < 0 || device >= MAX_DEVICES)
    device = 0; /* the simulator's tests: one tree */
  pthread_mutex_lock(&alloc_mu);
  pool_in_use_reported += bytes - pool_in_use_by_device[device]; /* modulo 2^n: exact */
  pool_in_use_by_device[device] = bytes;
  fig.pool_in_use = pool_in_use_reported;
  combined_peak_check_locked();
  pthread_mutex_unlock(&alloc_mu);
}

/* ------------------------------------------- who holds eager memory
 * A debugging aid, off unless track_eager(True) was called: every eager
 * block in use, with its size and the serial of its allocation, so that a
 * benchmark can list what was allocated since a moment and is still held
 * (tx_alloc_eager_held; bench/torch_eager_residue.py). */
typedef struct eager_rec {
  void *ptr;
  size_t size;
  uint64_t serial;
  UT_hash_handle hh;
} eager_rec;
static int track_eager;
static eager_rec *eager_recs;
static uint64_t eager_serial;

void tx_alloc_track_eager(int on) {
  pthread_mutex_lock(&alloc_mu);
  track_eager = on;
  if (!on) {
    eager_rec *r, *tmp;
    HASH_ITER(hh, eager_recs, r, tmp) {
      HASH_DEL(eager_recs, r);
      free(r);
    }
  }
  pthread_mutex_unlock(&alloc_mu);
}

uint64_t tx_alloc_eager_serial(void) {
  pthread_mutex_lock(&alloc_mu);
  uint64_t s = eager_serial;
  pthread_mutex_unlock(&alloc_mu);
  return s;
}

size_t tx_alloc_eager_held(uint64_t since, size_t *sizes, uint64_t *serials, void **ptrs, size_t cap) {
  size_t n = 0;
  pthread_mutex_lock(&alloc_mu);
  eager_rec *r, *tmp;
  HASH_ITER(hh, eager_recs, r, tmp) {
    if (r->serial < since)
      continue;
    if (n < cap) {
      sizes[n] = r->size;
      serials[n] = r->serial;
      ptrs[n] = r->ptr;
    }
    n++;
  }
  pthread_mutex_unlock(&alloc_mu);
  return n;
}

/* Called with alloc_mu held, at every eager allocation (add) and free. */
static void eager_track_locked(void *p, size_t size, int add) {
  eager_serial++;
  if (!track_eager)
    return;
  eager_rec *r = NULL;
  HASH_FIND_PTR(eager_recs, &p, r);
  if (r) {
    HASH_DEL(eager_recs, r);
    free(r);
  }
  if (!add)
    return;
  r = malloc(sizeof *r);
  if (!r)
    return; /* a debugging aid: it may miss a block, never fail the allocation */
  r->ptr = p;
  r->size = size;
  r->serial = eager_serial;
  HASH_ADD_PTR(eager_recs, ptr, r);
}

static void *eager_alloc(size_t size, int device, void *stream) {
  size_t bytes = round_bytes(size);
  if (device < 0)
    stream = HOST_STREAM;
  void *p = NULL;
  pthread_mutex_lock(&alloc_mu);
  bucket *b = bucket_find(bytes, stream, 0);
  if (b && b->n > 0) {
    p = b->ptrs[--b->n];
    fig.eager_cache_hits++;
  }
  pthread_mutex_unlock(&alloc_mu);
  if (!p) {
    p = tx_dev_malloc(bytes, device);
    if (!p) {
      pthread_mutex_lock(&alloc_mu);
      release_cached_locked();
      pthread_mutex_unlock(&alloc_mu);
      p = tx_dev_malloc(bytes, device);
    }
    if (!p)
      return NULL;
    pthread_mutex_lock(&alloc_mu);
    fig.eager_cuda_mallocs++;
    fig.eager_reserved += bytes;
    pthread_mutex_unlock(&alloc_mu);
  }
  pthread_mutex_lock(&alloc_mu);
  fig.eager_in_use += in_use_bytes(size);
  if (fig.eager_in_use > fig.eager_peak)
    fig.eager_peak = fig.eager_in_use;
  combined_peak_check_locked();
  eager_track_locked(p, size, 1);
  pthread_mutex_unlock(&alloc_mu);
  return p;
}

static void eager_free(void *p, size_t size, int device, void *stream) {
  size_t bytes = round_bytes(size);
  if (device < 0)
    stream = HOST_STREAM;
  pthread_mutex_lock(&alloc_mu);
  fig.eager_in_use -= in_use_bytes(size);
  eager_track_locked(p, size, 0);
  bucket *b = bucket_find(bytes, stream, 1);
  if (b && b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 8;
    void **np = realloc(b->ptrs, cap * sizeof *np);
    if (np) {
      b->ptrs = np;
      b->cap = cap;
    }
  }
  if (b && b->n < b->cap) {
    b->ptrs[b->n++] = p;
    p = NULL;
  }
  if (p)
    fig.eager_reserved -= bytes;
  pthread_mutex_unlock(&alloc_mu);
  if (p) /* no host memory to remember it: give it back to the driver */
    tx_dev_free(p, device);
}

void tx_alloc_figures_get(tx_alloc_figures *out) {
  pthread_mutex_lock(&alloc_mu);
  *out = fig;
  pthread_mutex_unlock(&alloc_mu);
}

void tx_alloc_reset_peak(void) {
  pthread_mutex_lock(&alloc_mu);
  fig.eager_peak = fig.eager_in_use;
  fig.combined_peak = fig.eager_in_use + fig.pool_in_use;
  pthread_mutex_unlock(&alloc_mu);
}

/* The two functions CUDAPluggableAllocator loads from this .so by name. */
__attribute__((visibility("default"))) void *cgt_torch_alloc(ssize_t size, int device, void *stream);
__attribute__((visibility("default"))) void cgt_torch_free(void *ptr, ssize_t size, int device, void *stream);

void *cgt_torch_alloc(ssize_t size, int device, void *stream) {
  if (size <= 0)
    return NULL;
  cgt_launch *l = tls_launch;
  if (!l)
    return eager_alloc((size_t)size, device, stream);
  void *p = NULL;
  pool_ptr *e = malloc(sizeof *e);
  if (!e || cgt_launch_alloc(l, (size_t)size, &p) != CGT_OK) {
    free(e);
    pthread_mutex_lock(&alloc_mu);
    fig.pool_alloc_failures++;
    pthread_mutex_unlock(&alloc_mu);
    return NULL; /* PyTorch raises its out-of-memory error */
  }
  pthread_mutex_lock(&alloc_mu);
  pool_ptr *old = NULL;
  HASH_FIND_PTR(pool_ptrs, &p, old);
  if (old) { /* a block of an earlier launch, reused: its old tensor is gone or never freed */
    HASH_DEL(pool_ptrs, old);
    free(old);
  }
  e->ptr = p;
  e->serial = tls_serial;
  HASH_ADD_PTR(pool_ptrs, ptr, e);
  fig.pool_allocs++;
  fig.pool_in_use += (size_t)size; /* until segment.c reports the pool's own figure */
  combined_peak_check_locked();
  pthread_mutex_unlock(&alloc_mu);
  return p;
}

void cgt_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  if (!ptr)
    return;
  pthread_mutex_lock(&alloc_mu);
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
    pthread_mutex_unlock(&alloc_mu);
    if (same_launch)
      (void)cgt_launch_free(tls_launch, ptr);
    return;
  }
  pthread_mutex_unlock(&alloc_mu);
  eager_free(ptr, size > 0 ? (size_t)size : 1, device, stream);
}
