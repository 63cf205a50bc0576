/* pool.h — the checkpointable pool allocator.
 *
 * Device memory comes from a pool_source in big allocations called chunks;
 * a chunk is carved into blocks (256-byte aligned, best fit, split on
 * allocation, merged with free neighbours on free). A checkpoint snapshots the
 * block layout without copying device memory; a restore rebuilds the layout
 * from a checkpoint. Chunks are never given back while the pool lives: their
 * addresses are burned into recorded graphs.
 */
#ifndef CGT_POOL_H
#define CGT_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "cgtree.h"

#define POOL_ALIGN ((size_t)256)

typedef struct pool pool;
typedef struct pool_checkpoint pool_checkpoint;

/* Where chunks come from. alloc returns CGT_ERR_OUT_OF_MEMORY when there is
 * no room; the pool turns that into CGT_ERR_OUT_OF_MEMORY with itself
 * unchanged. */
typedef struct pool_source {
  cgt_status (*alloc)(void *ctx, size_t bytes, void **ptr);
  void (*free)(void *ctx, void *ptr, size_t bytes); /* bytes: what alloc was asked for */
  void *ctx;
} pool_source;

typedef struct pool_stats {
  size_t reserved_bytes;  /* sum of chunk sizes */
  size_t allocated_bytes; /* sum of allocated block sizes (rounded to POOL_ALIGN) */
  size_t peak_bytes;      /* highest allocated_bytes seen */
  size_t chunks;
  size_t blocks;        /* allocated and free blocks */
  uint64_t host_allocs; /* host allocations the pool made for itself */
} pool_stats;

/* chunk_bytes: the least size of a chunk (rounded up to POOL_ALIGN; 0 is
 * invalid). The source is copied. */
cgt_status pool_create(const pool_source *src, size_t chunk_bytes, pool **out);
/* Gives every chunk back to the source. NULL is a no-op. */
void pool_destroy(pool *p);

/* Grows the pool so that `bytes` more could be allocated without a new
 * chunk (one chunk of at least that size). */
cgt_status pool_reserve(pool *p, size_t bytes);

/* A block of at least `bytes` (0 and sizes that overflow when rounded are
 * CGT_ERR_INVALID_ARGUMENT). Requests above chunk_bytes get a chunk of their
 * own. New chunks come from the source only when no free block fits. */
cgt_status pool_alloc(pool *p, size_t bytes, void **ptr);
/* ptr must be the base of an allocated block (CGT_ERR_INVALID_ARGUMENT). */
cgt_status pool_free(pool *p, void *ptr);

/* The allocated block containing ptr (any address inside it): 1 and its base
 * and size, or 0 if ptr is in no allocated block of this pool. */
int pool_find(const pool *p, const void *ptr, void **base, size_t *bytes);
/* Size of the allocated block based exactly at ptr, or 0. O(1). */
size_t pool_block_bytes(const pool *p, const void *ptr);

void pool_get_stats(const pool *p, pool_stats *out);
void pool_reset_peak(pool *p); /* peak := allocated */

/* Snapshot of the layout: for every chunk, its ordered blocks (offset, size,
 * allocated). No device memory is copied. */
cgt_status pool_checkpoint_take(pool *p, pool_checkpoint **out);
/* The same snapshot, stored as the difference from base (a checkpoint of p,
 * or NULL): only the block runs that changed since base, with a reference
 * that keeps base alive. That needs p to have base's layout plus the allocs
 * and frees made since: base must be the checkpoint p last took or restored
 * (no pool_clear since); otherwise the checkpoint is full, which is always
 * correct. A base of another pool is CGT_ERR_INVALID_ARGUMENT. */
cgt_status pool_checkpoint_take_delta(pool *p, pool_checkpoint *base, pool_checkpoint **out);
/* Drops the holder's reference; memory goes once no delta is based on c
 * either. Any order of frees is fine. NULL is a no-op. */
void pool_checkpoint_free(pool_checkpoint *c);
size_t pool_checkpoint_allocated_bytes(const pool_checkpoint *c);
/* Host bytes c holds itself (not counting its base): the memory cost of c. */
size_t pool_checkpoint_host_bytes(const pool_checkpoint *c);
/* Calls fn for the base and size of every allocated block of c, in address
 * order. A delta is expanded first in a temporary host allocation; if that
 * fails, fn is not called. */
void pool_checkpoint_foreach_allocated(const pool_checkpoint *c, void (*fn)(void *user, void *base, size_t bytes),
                                       void *user);
/* Checks a checkpoint and its chain of bases: ownership, ids, depths and
 * references along the chain, every run of entries tiling its range, and
 * the expanded layout tiling every chunk with the recorded allocated bytes.
 * 1 if all hold, else 0 with a description in why. */
int pool_checkpoint_check(const pool_checkpoint *c, char *why, size_t why_bytes);

/* Rebuilds the layout of c; chunks made after c are wholly free. Then frees
 * every block of c for which keep(user, base) returns 0 (keep NULL: keep all).
 * CGT_ERR_OUT_OF_MEMORY (host) leaves the pool unchanged. c must come from p.
 * A delta is expanded first: O(its chain's entries). */
/* (Implementation note: keep is called once per allocated block of c, in
 * address order, before the pool changes, and also when the restore then
 * fails; it must not call into p. A c not taken from p is
 * CGT_ERR_INVALID_ARGUMENT.) */
cgt_status pool_restore(pool *p, const pool_checkpoint *c, int (*keep)(void *user, void *base), void *user);
/* 1 if the current layout is exactly c's (chunks made after c wholly free).
 * 0 also when expanding a delta c found no host memory. */
int pool_matches(const pool *p, const pool_checkpoint *c);

/* Frees every block (the layout of an empty pool; chunks stay). */
void pool_clear(pool *p);

/* Walks every chunk and checks every invariant: blocks tile each chunk
 * exactly, no two adjacent free blocks, offsets aligned, the lookup table
 * holds exactly the allocated blocks, totals match. Returns 1 if all hold;
 * otherwise 0 with a description in why (if why is not NULL). */
int pool_check(const pool *p, char *why, size_t why_bytes);

/* Host allocation failure injection, for tests. `after` more allocations
 * succeed, the next one fails; then, if `once`, the hook turns itself off
 * (after = -1), else every later one fails too. after < 0: off. */
typedef struct pool_fail_hook {
  long long after;
  int once;
  long long fired; /* failures injected so far */
} pool_fail_hook;

/* 1 if the allocation about to be made must fail; counts it down. */
static inline int pool_fail_hook_fires(pool_fail_hook *h) {
  if (h->after < 0)
    return 0;
  if (h->after > 0) {
    h->after--;
    return 0;
  }
  if (h->once)
    h->after = -1;
  h->fired++;
  return 1;
}

/* Test hook: the next n host allocations of p succeed and every later one
 * fails, until called again; n < 0 turns failures off. The state is p's own
 * (this also undoes pool__share_fail_hook). Every call of malloc or realloc
 * the pool makes counts, including the allocations uthash makes for the
 * lookup table. */
void pool__fail_host_alloc_after(pool *p, long long n);
/* Makes p's host allocations answer to `hook` (owned by the caller, who
 * outlives p) instead of p's own: a tree shares one hook among itself and
 * all its pools, so that a test can fail the n-th allocation of a run
 * wherever it happens. */
void pool__share_fail_hook(pool *p, pool_fail_hook *hook);

#endif /* CGT_POOL_H */
