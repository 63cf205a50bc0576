/* eager.c — memory outside the tree's pool, on the driver's stream-ordered pools.
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
 * What the driver cannot know is that a stream other than the block's own
 * still reads it: that is what Tensor.record_stream(s) tells an allocator.
 * PyTorch's pluggable allocator has a record-stream hook, but its Python
 * wrapper does not expose it, so cgtree.torch wraps Tensor.record_stream
 * (the documented Python API) and tells us (tx_eager_record_stream). The
 * free then makes the block's stream wait for every recorded stream's work
 * so far, with an event, before cudaFreeAsync, exactly as PyTorch's
 * cudaMallocAsync backend does. Calls of recordStream from C++ (inside
 * PyTorch) do not pass through Python and are not seen; docs/torch.md
 * says so.
 *
 * Bounds. The pool keeps freed memory cached up to its release threshold
 * (CGTREE_TORCH_CACHE_BYTES, default 2 GiB a device, set at first use)
 * and gives the rest back at synchronisation points. When an allocation
 * fails we synchronise the device, trim the pool to nothing and try once
 * more (num_alloc_retries); if that fails too, the allocation fails
 * (num_ooms) and PyTorch raises its out-of-memory error, which the program
 * can catch.
 *
 * Frees while a capture may be under way. A block PyTorch frees while one
 * of our launch functions runs (Python's garbage collector can free any
 * tensor at any moment) must not be given back then: cudaFreeAsync on the
 * legacy stream, where most eager tensors live, would make it depend on
 * the capturing stream and invalidate the capture. alloc.c passes such frees
 * with `later`; they wait on a list, and are given back at the next eager
 * allocation or free outside a launch, or at the next segment call.
 *
 * Figures, with PyTorch's meanings: allocated bytes count requests rounded
 * up to 512 bytes, as torch.cuda.memory_allocated does; reserved bytes are
 * what the driver's pools hold. Every live block is in a hash (pointer ->
 * size, device, stream, recorded streams), which the frees and
 * record_stream need anyway.
 */
#include "ext.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

enum { MAX_EAGER_DEVICES = 64 };

typedef struct eager_block {
  void *ptr;
  size_t size;
  int device;
  void *stream;   /* the stream it was allocated on (its free's stream) */
  uint64_t serial; /* of its allocation, for tx_eager_held */
  void **used_on; /* streams record_stream named, or NULL */
  size_t n_used, cap_used;
  UT_hash_handle hh;
} eager_block;

static pthread_mutex_t eager_mu = PTHREAD_MUTEX_INITIALIZER;
static eager_block *blocks;
static tx_eager_figures fig;
static size_t in_use_by_device[MAX_EAGER_DEVICES + 1]; /* index 0: device -1 (host) */
static eager_block *pending; /* freed while a launch ran: given back at the next tx_eager_flush */
static atomic_int any_pending;
static uint64_t keep_bytes = 2ull << 30;
static uint64_t serial;

/* A request as PyTorch's allocator counts it in memory_allocated. */
static size_t counted_bytes(size_t n) { return (n + 511) / 512 * 512; }

static size_t *device_in_use(int device) {
  if (device < -1 || device >= MAX_EAGER_DEVICES)
    return &in_use_by_device[0];
  return &in_use_by_device[device + 1];
}

void tx_eager_set_cache_bytes(uint64_t bytes) { keep_bytes = bytes; }

void *tx_eager_alloc(size_t size, int device, void *stream, size_t *counted) {
  eager_block *b = malloc(sizeof *b);
  if (!b)
    return NULL;
  void *p = tx_dev_pool_alloc(size, device, stream, keep_bytes);
  int retried = 0;
  if (!p) {
    tx_dev_pool_trim(device);
    retried = 1;
    p = tx_dev_pool_alloc(size, device, stream, keep_bytes);
  }
  pthread_mutex_lock(&eager_mu);
  fig.num_alloc_retries += (uint64_t)retried;
  if (!p) {
    fig.num_ooms++;
    pthread_mutex_unlock(&eager_mu);
    free(b);
    return NULL;
  }
  memset(b, 0, sizeof *b);
  b->ptr = p;
  b->size = size;
  b->device = device;
  b->stream = stream;
  b->serial = ++serial;
  HASH_ADD_PTR(blocks, ptr, b);
  *counted = counted_bytes(size);
  fig.allocations++;
  *device_in_use(device) += counted_bytes(size);
  pthread_mutex_unlock(&eager_mu);
  return p;
}

/* Gives b's memory back to its device's pool, ordered after its stream's
 * and its recorded streams' work. */
static void give_back(eager_block *b) {
  for (size_t i = 0; i < b->n_used; i++) /* recorded streams: the free waits for their work so far */
    tx_dev_stream_after(b->stream, b->used_on[i], b->device);
  tx_dev_pool_free(b->ptr, b->device, b->stream);
  free(b->used_on);
  free(b);
}

size_t tx_eager_free(void *p, int later) {
  pthread_mutex_lock(&eager_mu);
  eager_block *b = NULL;
  HASH_FIND_PTR(blocks, &p, b);
  if (!b) {
    pthread_mutex_unlock(&eager_mu);
    return 0;
  }
  size_t counted = counted_bytes(b->size);
  HASH_DEL(blocks, b);
  fig.frees++;
  *device_in_use(b->device) -= counted;
  if (later) { /* a capture may be under way: no stream call now (see tx_eager_flush) */
    b->hh.next = pending;
    pending = b;
    atomic_store(&any_pending, 1);
    fig.deferred_frees++;
    b = NULL;
  }
  pthread_mutex_unlock(&eager_mu);
  if (b)
    give_back(b);
  return counted;
}

void tx_eager_flush(void) {
  if (!atomic_load(&any_pending))
    return; /* the common case, without the lock */
  pthread_mutex_lock(&eager_mu);
  atomic_store(&any_pending, 0);
  eager_block *b = pending;
  pending = NULL;
  pthread_mutex_unlock(&eager_mu);
  while (b) {
    eager_block *next = b->hh.next;
    give_back(b);
    b = next;
  }
}

int tx_eager_record_stream(void *p, void *stream) {
  pthread_mutex_lock(&eager_mu);
  eager_block *b = NULL;
  HASH_FIND_PTR(blocks, &p, b);
  int rc = 0;
  if (b && stream != b->stream) {
    size_t i = 0;
    while (i < b->n_used && b->used_on[i] != stream)
      i++;
    if (i == b->n_used) {
      if (b->n_used == b->cap_used) {
        size_t cap = b->cap_used ? 2 * b->cap_used : 2;
        void **grown = realloc(b->used_on, cap * sizeof *grown);
        if (!grown) {
          pthread_mutex_unlock(&eager_mu);
          return -1;
        }
        b->used_on = grown;
        b->cap_used = cap;
      }
      b->used_on[b->n_used++] = stream;
      fig.recorded_streams++;
    }
    rc = 1;
  } else if (b) {
    rc = 1; /* its own stream: stream order covers it */
  }
  pthread_mutex_unlock(&eager_mu);
  return rc;
}

uint64_t tx_eager_serial(void) {
  pthread_mutex_lock(&eager_mu);
  uint64_t s = serial;
  pthread_mutex_unlock(&eager_mu);
  return s;
}

size_t tx_eager_held(uint64_t since, size_t *sizes, uint64_t *serials, void **ptrs, size_t cap) {
  size_t n = 0;
  pthread_mutex_lock(&eager_mu);
  for (eager_block *b = blocks; b; b = b->hh.next) {
    if (b->serial <= since)
      continue;
    if (n < cap) {
      sizes[n] = b->size;
      serials[n] = b->serial;
      ptrs[n] = b->ptr;
    }
    n++;
  }
  pthread_mutex_unlock(&eager_mu);
  return n;
}

void tx_eager_figures_get(int device, tx_eager_figures *out) {
  pthread_mutex_lock(&eager_mu);
  *out = fig;
  out->in_use = *device_in_use(device);
  out->live_blocks = HASH_COUNT(blocks);
  pthread_mutex_unlock(&eager_mu);
  out->reserved = out->reserved_peak = 0;
  (void)tx_dev_pool_figures(device, &out->reserved, &out->reserved_peak);
}

void tx_eager_trim(int device) { tx_dev_pool_trim(device); }
