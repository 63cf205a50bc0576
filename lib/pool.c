/* pool.c — the checkpointable pool allocator.
 *
 * Every graph a tree records bakes the device addresses it touched into the
 * graph itself, so the memory behind those addresses must stay where it is for
 * as long as the graph can replay. We therefore take device memory from the
 * source in big allocations, called chunks, and never give a chunk back while
 * the pool lives. Each chunk is carved into blocks: a doubly linked list per
 * chunk, in address order, that tiles the chunk exactly. Allocation picks the
 * best fitting free block over all chunks and splits off the rest; freeing
 * merges a block with its free neighbours, so no two free blocks ever touch.
 * Only when no free block fits do we ask the source for a new chunk of at
 * least chunk_bytes; a request larger than that gets a chunk of its own.
 *
 * The free blocks live in an AVL tree keyed by (size, address). Best fit is
 * then the leftmost block whose size is large enough, found in O(log n). The
 * address in the key matters more than it looks: it makes the choice a
 * function of the layout alone, not of the order in which blocks were freed,
 * so the same layout and the same requests always produce the same addresses,
 * whether the layout was reached by allocating or rebuilt by a restore. That
 * determinism is what lets a recording made after a restore line up with the
 * warmup that preceded it. Allocated blocks live in
 * a uthash table keyed by their base address, which makes pool_free and
 * pool_block_bytes O(1); pool_find, which accepts interior pointers, binary
 * searches the chunk array (kept sorted by address) and walks one chunk.
 *
 * A checkpoint is a snapshot of the layout, not of the memory: for every
 * chunk, its blocks as (offset, size, allocated), in one host allocation.
 * Restoring rebuilds the layout from it, leaves chunks made since then wholly
 * free, and frees the blocks the caller no longer needs. A restore builds the
 * whole new layout (descriptors, lookup table, free tree) beside the old one
 * and swaps only once nothing can fail any more, so a host allocation failure
 * leaves the pool exactly as it was. Every other operation follows the same
 * rule: whatever can fail is done first, and the layout is touched last.
 *
 * A tree records one checkpoint per node, and along a path each one is the
 * layout of the one before plus a block or two; stored whole, a path of P
 * recordings with its values live would hold P checkpoints of up to P
 * blocks each. So a checkpoint can be a delta: for each chunk that changed,
 * one range of offsets and the blocks that now tile it, plus a counted
 * reference to the base it changes (a base lives while any delta on it
 * does, whatever order their holders free them in). To know what changed
 * without comparing against the base, the pool keeps a mark, the id of the
 * checkpoint it last took or restored, and per chunk a dirty range: the hull
 * of every extent an alloc or free has rewritten since. Each such extent
 * (the blocks split or merged, which cover the same bytes before and after)
 * ends on block boundaries that no later operation can move without
 * widening the hull, so the hull's ends are boundaries both in the mark's
 * layout and in the current one, and outside it nothing changed. A delta
 * needs its base to be the mark; on any other base it is quietly full. A
 * restore expands a delta first, applying the chain from its full root in
 * one temporary allocation (restores are rare; replays never restore), and
 * marks the pool with it, the dirty ranges covering the blocks it dropped.
 *
 * Block descriptors are recycled through a spare list instead of being handed
 * back to malloc, because allocation, free and restore all shuffle them and
 * the tree reports how many host allocations the pool made (host_allocs): in
 * a steady state the count stops growing.
 */
#include "pool.h"

#include "cgt_assert.h"
#include "grow.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* uthash allocates its buckets behind our back. We route those allocations
 * through pool_host_malloc so they are counted and can be made to fail in
 * tests, and we ask uthash to report failure instead of exiting. The macros
 * name two locals, pool_hash_owner and pool_hash_oomed, that exist only in
 * pool_hash_add, the one place that inserts; lookups and deletions never
 * allocate. */
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) pool_host_malloc(pool_hash_owner, (sz))
#define uthash_free(ptr, sz) free(ptr)
#define uthash_nonfatal_oom(elt) (pool_hash_oomed = 1)
#include <uthash.h>

/* ------------------------------------------------------------- asserts */

/* The tiers of cgt_assert.h; the expensive one runs pool_check after every
 * change of state, which makes every operation O(blocks). */
#define pool_assert_expensive(p) cgt_assert_expensive(pool_valid(p, __FILE__, __LINE__))

/* ----------------------------------------------------------- structures */

typedef struct pool_chunk pool_chunk;
typedef struct pool_block pool_block;

struct pool_block {
  char *base; /* the lookup key: it never changes while the block is in the table */
  size_t size;
  pool_chunk *chunk;
  pool_block *prev, *next;  /* neighbours in address order; next also links the spare list */
  pool_block *left, *right; /* children in the free tree, for free blocks only */
  int height;               /* AVL height in the free tree */
  int allocated;
  UT_hash_handle hh; /* membership of the lookup table, for allocated blocks only */
};

struct pool_chunk {
  char *base;
  size_t size;
  pool_block *first;  /* the layout: blocks in address order */
  pool_block *staged; /* the layout a restore is building; NULL outside pool_restore */
  /* The offsets whose layout may differ from the mark's (see pool.mark):
   * [dirty_lo, dirty_hi), empty when equal. */
  size_t dirty_lo, dirty_hi;
  size_t staged_lo, staged_hi; /* what a restore will make them */
};

struct pool {
  pool_source src;
  size_t chunk_bytes;
  pool_chunk **chunks; /* sorted by base address, so checkpoints list blocks in address order */
  size_t n_chunks, cap_chunks;
  pool_block *table;     /* uthash head: the allocated blocks by base */
  pool_block *free_root; /* AVL tree of the free blocks by (size, base) */
  pool_block *spares;    /* descriptors waiting for reuse */
  pool_stats stats;
  pool_fail_hook own_fail_hook; /* test hook: see pool__fail_host_alloc_after */
  pool_fail_hook *fail_hook;    /* &own_fail_hook, or a hook shared with a tree */
  uint64_t mark;                /* id of the checkpoint the dirty ranges are relative to; 0: none */
  uint64_t last_id;             /* ids of checkpoints taken from this pool: 1, 2, ... */
};

typedef struct pool_checkpoint_chunk {
  char *base;
  size_t size;
  size_t lo, hi; /* the offsets its entries tile: [0, size) unless in a delta */
  size_t first;  /* index of its first entry */
  size_t count;
} pool_checkpoint_chunk;

typedef struct pool_checkpoint_entry {
  size_t offset;
  size_t size;
  int allocated;
} pool_checkpoint_entry;

struct pool_checkpoint {
  const pool *owner;
  uint64_t id;           /* unique in its pool, larger than its base's */
  size_t refs;           /* the holder, and every delta based on it */
  pool_checkpoint *base; /* NULL in a full checkpoint */
  size_t depth;          /* deltas between it and its full root */
  size_t allocated_bytes;
  size_t n_chunks;
  size_t n_entries;
  pool_checkpoint_chunk *chunks; /* sorted by base, like the pool's */
  pool_checkpoint_entry *entries;
};

static int pool_check_impl(const pool *p, char *why, size_t why_bytes);

#if CGT_DEBUG >= 3
/* 1 if p is valid; else says why on stderr and returns 0. */
static int pool_valid(const pool *p, const char *file, int line) {
  char why[256];
  if (pool_check_impl(p, why, sizeof why)) return 1;
  fprintf(stderr, "cgtree: pool invalid: %s (%s:%d)\n", why, file, line);
  return 0;
}
#endif

/* ------------------------------------------------------ host allocation */

/* Every host allocation the pool makes goes through these two, so that
 * host_allocs counts them all (failed attempts included) and a test can make
 * the n-th one fail. */
static int pool_host_should_fail(pool *p) {
  p->stats.host_allocs++;
  return pool_fail_hook_fires(p->fail_hook);
}

static void *pool_host_malloc(pool *p, size_t bytes) {
  if (pool_host_should_fail(p)) return NULL;
  return malloc(bytes);
}

static void *pool_host_realloc(pool *p, void *ptr, size_t bytes) {
  if (pool_host_should_fail(p)) return NULL;
  return realloc(ptr, bytes);
}

static void *pool_grow_realloc(void *owner, void *ptr, size_t bytes) { return pool_host_realloc(owner, ptr, bytes); }

void pool__fail_host_alloc_after(pool *p, long long n) {
  if (!p) return;
  p->own_fail_hook.after = n < 0 ? -1 : n;
  p->own_fail_hook.once = 0;
  p->fail_hook = &p->own_fail_hook;
}

void pool__share_fail_hook(pool *p, pool_fail_hook *hook) {
  if (p && hook) p->fail_hook = hook;
}

/* ------------------------------------------------------------- helpers */

/* Rounds a request up to POOL_ALIGN. 0 and sizes that would wrap are refused. */
static int pool_round(size_t bytes, size_t *out) {
  if (bytes == 0 || bytes > SIZE_MAX - (POOL_ALIGN - 1)) return 0;
  *out = (bytes + POOL_ALIGN - 1) & ~(POOL_ALIGN - 1);
  return 1;
}

static int pool_ptr_less(const void *a, const void *b) {
  /* Relational operators on unrelated pointers are undefined in C; their
   * integer images are what we mean. */
  return (uintptr_t)a < (uintptr_t)b;
}

static pool_block *pool_block_take(pool *p) {
  pool_block *b = p->spares;
  if (b) {
    p->spares = b->next;
  } else {
    b = pool_host_malloc(p, sizeof *b);
    if (!b) return NULL;
  }
  memset(b, 0, sizeof *b);
  return b;
}

static void pool_block_give(pool *p, pool_block *b) {
  b->next = p->spares;
  p->spares = b;
}

/* Widens a dirty range [*lo, *hi) to cover `bytes` at offset `from`. */
static void pool_range_widen(size_t *lo, size_t *hi, size_t from, size_t bytes) {
  if (*lo == *hi) {
    *lo = from;
    *hi = from + bytes;
    return;
  }
  if (from < *lo) *lo = from;
  if (from + bytes > *hi) *hi = from + bytes;
}

/* Notes that the layout of ch between base and base + bytes changed. The
 * range must be the whole extent an operation rewrote (the blocks it split
 * or merged, before and after), so that both its ends are block boundaries
 * before the change and after it. */
static void pool_dirty(pool_chunk *ch, const char *base, size_t bytes) {
  pool_range_widen(&ch->dirty_lo, &ch->dirty_hi, (size_t)(base - ch->base), bytes);
}

/* -------------------------------------------------------- lookup table */

/* Inserts b into the table at *table. Returns 0, with the table unchanged,
 * when uthash could not allocate. The table is passed separately from the
 * pool because a restore fills a new table beside the live one. */
static int pool_hash_add(pool *p, pool_block **table, pool_block *b) {
  pool *pool_hash_owner = p;
  int pool_hash_oomed = 0;
  HASH_ADD_PTR(*table, base, b);
  return !pool_hash_oomed;
}

static pool_block *pool_hash_find(const pool *p, const void *ptr) {
  pool_block *b = NULL;
  HASH_FIND_PTR(p->table, &ptr, b);
  return b;
}

/* ------------------------------------------------------------ free tree */

static int pool_tree_cmp(const pool_block *a, const pool_block *b) {
  if (a->size != b->size) return a->size < b->size ? -1 : 1;
  if (a->base == b->base) return 0;
  return pool_ptr_less(a->base, b->base) ? -1 : 1;
}

static int pool_tree_height(const pool_block *n) { return n ? n->height : 0; }

static void pool_tree_update(pool_block *n) {
  int l = pool_tree_height(n->left), r = pool_tree_height(n->right);
  n->height = 1 + (l > r ? l : r);
}

static pool_block *pool_tree_rotate_right(pool_block *n) {
  pool_block *l = n->left;
  n->left = l->right;
  l->right = n;
  pool_tree_update(n);
  pool_tree_update(l);
  return l;
}

static pool_block *pool_tree_rotate_left(pool_block *n) {
  pool_block *r = n->right;
  n->right = r->left;
  r->left = n;
  pool_tree_update(n);
  pool_tree_update(r);
  return r;
}

static pool_block *pool_tree_balance(pool_block *n) {
  int bal;
  pool_tree_update(n);
  bal = pool_tree_height(n->left) - pool_tree_height(n->right);
  if (bal > 1) {
    if (pool_tree_height(n->left->left) < pool_tree_height(n->left->right)) n->left = pool_tree_rotate_left(n->left);
    return pool_tree_rotate_right(n);
  }
  if (bal < -1) {
    if (pool_tree_height(n->right->right) < pool_tree_height(n->right->left))
      n->right = pool_tree_rotate_right(n->right);
    return pool_tree_rotate_left(n);
  }
  return n;
}

static pool_block *pool_tree_insert(pool_block *n, pool_block *x) {
  if (!n) {
    x->left = x->right = NULL;
    x->height = 1;
    return x;
  }
  cgt_assert_internal(pool_tree_cmp(x, n) != 0);
  if (pool_tree_cmp(x, n) < 0)
    n->left = pool_tree_insert(n->left, x);
  else
    n->right = pool_tree_insert(n->right, x);
  return pool_tree_balance(n);
}

static pool_block *pool_tree_remove_min(pool_block *n, pool_block **min) {
  if (!n->left) {
    *min = n;
    return n->right;
  }
  n->left = pool_tree_remove_min(n->left, min);
  return pool_tree_balance(n);
}

/* x must be in the tree: its key is unique because addresses are. */
static pool_block *pool_tree_remove(pool_block *n, pool_block *x) {
  int c;
  cgt_assert(n != NULL);
  c = pool_tree_cmp(x, n);
  if (c < 0) {
    n->left = pool_tree_remove(n->left, x);
  } else if (c > 0) {
    n->right = pool_tree_remove(n->right, x);
  } else {
    pool_block *l = n->left, *r = n->right, *m = NULL;
    if (!r) return l;
    r = pool_tree_remove_min(r, &m);
    m->left = l;
    m->right = r;
    n = m;
  }
  return pool_tree_balance(n);
}

/* The smallest free block of at least size bytes, the lowest address among
 * equals. */
static pool_block *pool_tree_best_fit(pool_block *n, size_t size) {
  pool_block *best = NULL;
  while (n) {
    if (n->size >= size) {
      best = n;
      n = n->left;
    } else {
      n = n->right;
    }
  }
  return best;
}

/* --------------------------------------------------------------- chunks */

/* Index of the first chunk whose base is above ptr. */
static size_t pool_chunk_upper(const pool *p, const void *ptr) {
  size_t lo = 0, hi = p->n_chunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (pool_ptr_less(ptr, p->chunks[mid]->base))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

static const pool_chunk *pool_chunk_containing(const pool *p, const void *ptr) {
  size_t i = pool_chunk_upper(p, ptr);
  const pool_chunk *c;
  if (i == 0) return NULL;
  c = p->chunks[i - 1];
  if ((uintptr_t)ptr - (uintptr_t)c->base >= c->size) return NULL;
  return c;
}

/* Takes a chunk from the source and makes its one free block, without
 * linking either into the pool, so the caller can still back out with
 * pool_chunk_discard. The source is asked first: if it has no room, the
 * pool has made no host allocation at all. */
static cgt_status pool_chunk_create(pool *p, size_t size, pool_chunk **out) {
  void *mem = NULL;
  pool_chunk *c;
  pool_block *b;
  cgt_status st = p->src.alloc(p->src.ctx, size, &mem);
  if (st != CGT_OK) return st;
  if (NEVER(mem == NULL)) return CGT_ERR_BACKEND;
  if (NEVER((uintptr_t)mem % POOL_ALIGN != 0)) {
    p->src.free(p->src.ctx, mem, size);
    return CGT_ERR_BACKEND;
  }
  /* A larger array is invisible to the caller, so it stays even if a later
   * step fails. */
  if (!cgt_grow((void **)&p->chunks, &p->cap_chunks, p->n_chunks + 1, SIZE_MAX, sizeof *p->chunks, 0,
                pool_grow_realloc, p))
    goto oom;
  c = pool_host_malloc(p, sizeof *c);
  if (!c) goto oom;
  b = pool_block_take(p);
  if (!b) {
    free(c);
    goto oom;
  }
  c->base = mem;
  c->size = size;
  c->first = b;
  c->staged = NULL;
  c->dirty_lo = 0; /* new since any checkpoint: all of it differs */
  c->dirty_hi = size;
  c->staged_lo = c->staged_hi = 0;
  b->base = mem;
  b->size = size;
  b->chunk = c;
  *out = c;
  return CGT_OK;
oom:
  p->src.free(p->src.ctx, mem, size);
  return CGT_ERR_OUT_OF_MEMORY;
}

static void pool_chunk_discard(pool *p, pool_chunk *c) {
  pool_block_give(p, c->first);
  p->src.free(p->src.ctx, c->base, c->size);
  free(c);
}

/* Links a chunk made by pool_chunk_create into the sorted array. Cannot fail:
 * pool_chunk_create made room. The chunk's free block is left out of the free
 * tree for the caller to place. */
static void pool_chunk_link(pool *p, pool_chunk *c) {
  size_t i = pool_chunk_upper(p, c->base);
  cgt_assert(p->n_chunks < p->cap_chunks);
  memmove(&p->chunks[i + 1], &p->chunks[i], (p->n_chunks - i) * sizeof *p->chunks);
  p->chunks[i] = c;
  p->n_chunks++;
  p->stats.chunks = p->n_chunks;
  p->stats.reserved_bytes += c->size;
  p->stats.blocks++;
}

/* ------------------------------------------------------------ lifecycle */

cgt_status pool_create(const pool_source *src, size_t chunk_bytes, pool **out) {
  pool *p;
  size_t rounded;
  if (!out) return CGT_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!src || !src->alloc || !src->free || !pool_round(chunk_bytes, &rounded)) return CGT_ERR_INVALID_ARGUMENT;
  p = calloc(1, sizeof *p);
  if (!p) return CGT_ERR_OUT_OF_MEMORY;
  p->src = *src;
  p->chunk_bytes = rounded;
  p->own_fail_hook.after = -1;
  p->fail_hook = &p->own_fail_hook;
  p->stats.host_allocs = 1; /* the pool itself */
  *out = p;
  pool_assert_expensive(p);
  return CGT_OK;
}

void pool_destroy(pool *p) {
  size_t i;
  if (!p) return;
  /* The table head is a block, so the table goes before the blocks do. */
  HASH_CLEAR(hh, p->table);
  for (i = 0; i < p->n_chunks; i++) {
    pool_chunk *c = p->chunks[i];
    pool_block *b = c->first;
    while (b) {
      pool_block *next = b->next;
      free(b);
      b = next;
    }
    p->src.free(p->src.ctx, c->base, c->size);
    free(c);
  }
  while (p->spares) {
    pool_block *next = p->spares->next;
    free(p->spares);
    p->spares = next;
  }
  free(p->chunks);
  free(p);
}

/* ----------------------------------------------------- alloc and free */

cgt_status pool_reserve(pool *p, size_t bytes) {
  size_t need;
  pool_chunk *c = NULL;
  cgt_status st;
  if (!p) return CGT_ERR_INVALID_ARGUMENT;
  if (bytes == 0) return CGT_OK;
  if (!pool_round(bytes, &need)) return CGT_ERR_INVALID_ARGUMENT;
  if (pool_tree_best_fit(p->free_root, need)) return CGT_OK;
  st = pool_chunk_create(p, need > p->chunk_bytes ? need : p->chunk_bytes, &c);
  if (st != CGT_OK) return st;
  pool_chunk_link(p, c);
  p->free_root = pool_tree_insert(p->free_root, c->first);
  pool_assert_expensive(p);
  return CGT_OK;
}

cgt_status pool_alloc(pool *p, size_t bytes, void **ptr) {
  size_t need;
  pool_block *f, *a;
  pool_chunk *grown = NULL;
  if (!p || !ptr || !pool_round(bytes, &need)) return CGT_ERR_INVALID_ARGUMENT;

  f = pool_tree_best_fit(p->free_root, need);
  if (!f) {
    cgt_status st = pool_chunk_create(p, need > p->chunk_bytes ? need : p->chunk_bytes, &grown);
    if (st != CGT_OK) return st;
    f = grown->first;
  }
  /* The allocated block takes the front of f. When f is larger it keeps its
   * descriptor as the free remainder and a new descriptor covers the front;
   * either way the allocated block's base is f's base now, so it can enter
   * the table before anything else moves. */
  a = f;
  if (f->size > need) {
    a = pool_block_take(p);
    if (!a) goto oom;
    a->base = f->base;
    a->size = need;
    a->chunk = f->chunk;
  }
  if (!pool_hash_add(p, &p->table, a)) {
    if (a != f) pool_block_give(p, a);
    goto oom;
  }

  /* Nothing can fail from here on. */
  pool_dirty(f->chunk, f->base, f->size);
  if (grown)
    pool_chunk_link(p, grown);
  else
    p->free_root = pool_tree_remove(p->free_root, f);
  if (a != f) {
    a->prev = f->prev;
    a->next = f;
    if (f->prev)
      f->prev->next = a;
    else
      f->chunk->first = a;
    f->prev = a;
    f->base += need;
    f->size -= need;
    p->free_root = pool_tree_insert(p->free_root, f);
    p->stats.blocks++;
  }
  a->allocated = 1;
  p->stats.allocated_bytes += need;
  if (p->stats.allocated_bytes > p->stats.peak_bytes) p->stats.peak_bytes = p->stats.allocated_bytes;
  *ptr = a->base;
  pool_assert_expensive(p);
  return CGT_OK;

oom:
  if (grown) pool_chunk_discard(p, grown);
  return CGT_ERR_OUT_OF_MEMORY;
}

/* Takes b out of its chunk's list. b always has a predecessor here, because
 * a merge folds a block into the one before it. */
static void pool_block_unlink(pool_block *b) {
  cgt_assert_internal(b->prev != NULL);
  b->prev->next = b->next;
  if (b->next) b->next->prev = b->prev;
}

cgt_status pool_free(pool *p, void *ptr) {
  pool_block *b, *l, *r;
  if (!p || !ptr) return CGT_ERR_INVALID_ARGUMENT;
  b = pool_hash_find(p, ptr);
  if (!b) return CGT_ERR_INVALID_ARGUMENT;
  cgt_assert_internal(b->allocated);

  HASH_DEL(p->table, b);
  b->allocated = 0;
  p->stats.allocated_bytes -= b->size;
  l = b->prev;
  r = b->next;
  if (r && !r->allocated) {
    p->free_root = pool_tree_remove(p->free_root, r);
    b->size += r->size;
    pool_block_unlink(r);
    pool_block_give(p, r);
    p->stats.blocks--;
  }
  if (l && !l->allocated) {
    /* The left neighbour survives: its base is the merged block's base. */
    p->free_root = pool_tree_remove(p->free_root, l);
    l->size += b->size;
    pool_block_unlink(b);
    pool_block_give(p, b);
    p->stats.blocks--;
    b = l;
  }
  pool_dirty(b->chunk, b->base, b->size); /* the merged block covers all that changed */
  p->free_root = pool_tree_insert(p->free_root, b);
  pool_assert_expensive(p);
  return CGT_OK;
}

/* ---------------------------------------------------------------- query */

int pool_find(const pool *p, const void *ptr, void **base, size_t *bytes) {
  const pool_chunk *c;
  const pool_block *b;
  if (!p || !ptr) return 0;
  c = pool_chunk_containing(p, ptr);
  if (!c) return 0;
  for (b = c->first; b; b = b->next) {
    if ((uintptr_t)ptr - (uintptr_t)b->base < b->size) {
      if (!b->allocated) return 0;
      if (base) *base = b->base;
      if (bytes) *bytes = b->size;
      return 1;
    }
  }
  return 0;
}

size_t pool_block_bytes(const pool *p, const void *ptr) {
  const pool_block *b;
  if (!p || !ptr) return 0;
  b = pool_hash_find(p, ptr);
  return b ? b->size : 0;
}

void pool_get_stats(const pool *p, pool_stats *out) {
  if (!out) return;
  if (!p) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = p->stats;
}

void pool_reset_peak(pool *p) {
  if (p) p->stats.peak_bytes = p->stats.allocated_bytes;
}

/* ---------------------------------------------------------- checkpoints */

/* The block of ch that starts at `offset`; it must exist. */
static const pool_block *pool_block_at(const pool_chunk *ch, size_t offset) {
  const pool_block *b = ch->first;
  while (b && (size_t)(b->base - ch->base) < offset) b = b->next;
  cgt_assert(b && (size_t)(b->base - ch->base) == offset);
  return b;
}

/* Blocks of ch in [lo, hi); both are block boundaries. */
static size_t pool_blocks_between(const pool_chunk *ch, size_t lo, size_t hi) {
  const pool_block *b;
  size_t n = 0;
  for (b = pool_block_at(ch, lo); b && (size_t)(b->base - ch->base) < hi; b = b->next) n++;
  return n;
}

static size_t pool_checkpoint_bytes(size_t n_chunks, size_t n_entries) {
  return sizeof(pool_checkpoint) + n_chunks * sizeof(pool_checkpoint_chunk) +
         n_entries * sizeof(pool_checkpoint_entry);
}

/* Takes a checkpoint of p: a delta on base when base is not NULL (the caller
 * made sure p->mark is base's id), else a full one. Either way p is marked
 * with it afterwards, its dirty ranges empty. */
static cgt_status pool_checkpoint_make(pool *p, pool_checkpoint *base, pool_checkpoint **out) {
  pool_checkpoint *c;
  size_t i, n_chunks = 0, n_entries = 0, e = 0, k = 0, head;
  for (i = 0; i < p->n_chunks; i++) {
    const pool_chunk *ch = p->chunks[i];
    if (!base) {
      n_chunks++;
    } else if (ch->dirty_lo != ch->dirty_hi) {
      n_chunks++;
      n_entries += pool_blocks_between(ch, ch->dirty_lo, ch->dirty_hi);
    }
  }
  if (!base) n_entries = p->stats.blocks;
  /* One allocation holds the header, the chunk table and the entries. Every
   * part has the alignment of size_t, and the sizes are multiples of it. */
  head = pool_checkpoint_bytes(n_chunks, 0);
  if (n_entries > (SIZE_MAX - head) / sizeof(pool_checkpoint_entry)) return CGT_ERR_OUT_OF_MEMORY;
  c = pool_host_malloc(p, pool_checkpoint_bytes(n_chunks, n_entries));
  if (!c) return CGT_ERR_OUT_OF_MEMORY;
  c->owner = p;
  c->id = ++p->last_id;
  c->refs = 1;
  c->base = base;
  c->depth = base ? base->depth + 1 : 0;
  c->allocated_bytes = p->stats.allocated_bytes;
  c->n_chunks = n_chunks;
  c->n_entries = n_entries;
  c->chunks = (pool_checkpoint_chunk *)(void *)(c + 1);
  c->entries = (pool_checkpoint_entry *)(void *)((char *)c + head);
  for (i = 0; i < p->n_chunks; i++) {
    pool_chunk *ch = p->chunks[i];
    pool_checkpoint_chunk *cc;
    const pool_block *b;
    size_t lo = base ? ch->dirty_lo : 0, hi = base ? ch->dirty_hi : ch->size;
    ch->dirty_lo = ch->dirty_hi = 0;
    if (lo == hi) continue;
    cc = &c->chunks[k++];
    cc->base = ch->base;
    cc->size = ch->size;
    cc->lo = lo;
    cc->hi = hi;
    cc->first = e;
    for (b = pool_block_at(ch, lo); b && (size_t)(b->base - ch->base) < hi; b = b->next) {
      cgt_assert(e < c->n_entries);
      c->entries[e].offset = (size_t)(b->base - ch->base);
      c->entries[e].size = b->size;
      c->entries[e].allocated = b->allocated;
      e++;
    }
    cc->count = e - cc->first;
  }
  cgt_assert(k == c->n_chunks && e == c->n_entries);
  if (base) base->refs++;
  p->mark = c->id;
  *out = c;
  return CGT_OK;
}

cgt_status pool_checkpoint_take(pool *p, pool_checkpoint **out) { return pool_checkpoint_take_delta(p, NULL, out); }

cgt_status pool_checkpoint_take_delta(pool *p, pool_checkpoint *base, pool_checkpoint **out) {
  if (!out) return CGT_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!p || (base && base->owner != p)) return CGT_ERR_INVALID_ARGUMENT;
  /* The dirty ranges say what changed since the mark, so only a delta on
   * the mark can be taken; on any other base the checkpoint is full. */
  if (base && base->id != p->mark) base = NULL;
  return pool_checkpoint_make(p, base, out);
}

void pool_checkpoint_free(pool_checkpoint *c) {
  /* A loop, not recursion: chains can be long. */
  while (c && --c->refs == 0) {
    pool_checkpoint *base = c->base;
    free(c);
    c = base;
  }
}

size_t pool_checkpoint_allocated_bytes(const pool_checkpoint *c) { return c ? c->allocated_bytes : 0; }

size_t pool_checkpoint_host_bytes(const pool_checkpoint *c) {
  return c ? pool_checkpoint_bytes(c->n_chunks, c->n_entries) : 0;
}

/* Index of the first of n entries (sorted by offset) at or above offset. */
static size_t pool_entries_lower(const pool_checkpoint_entry *en, size_t n, size_t offset) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (en[mid].offset < offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Index of the chunk at base among n sorted ones, or where it would go. */
static size_t pool_checkpoint_chunk_lower(const pool_checkpoint_chunk *cc, size_t n, const char *base) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (pool_ptr_less(cc[mid].base, base))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The full checkpoint that c stands for, in one host allocation the caller
 * frees with free(): the root's layout with every delta of the chain applied
 * in order, each replacing the entries of its ranges. p, if not NULL, is
 * charged for the allocation (and may fail it); NULL when out of memory.
 * Every chunk gets room for all the entries the chain ever gives it, so the
 * splices never move another chunk's entries. */
static pool_checkpoint *pool_checkpoint_flatten(pool *p, const pool_checkpoint *c) {
  const pool_checkpoint *l, **chain;
  pool_checkpoint *f;
  size_t n_links = c->depth + 1, cap_chunks = 0, cap_entries = 0, m = 0, i, j, k, e, bytes;
  for (l = c; l; l = l->base) {
    cap_chunks += l->n_chunks;
    cap_entries += l->n_entries;
  }
  bytes = pool_checkpoint_bytes(cap_chunks, cap_entries) + n_links * sizeof *chain;
  f = p ? pool_host_malloc(p, bytes) : malloc(bytes);
  if (!f) return NULL;
  f->chunks = (pool_checkpoint_chunk *)(void *)(f + 1);
  f->entries = (pool_checkpoint_entry *)(void *)(f->chunks + cap_chunks);
  chain = (const pool_checkpoint **)(void *)(f->entries + cap_entries);
  i = n_links;
  for (l = c; l; l = l->base) chain[--i] = l;

  /* The chunks of every link, each counting its room in `count` for now. */
  for (i = 0; i < n_links; i++) {
    for (k = 0; k < chain[i]->n_chunks; k++) {
      const pool_checkpoint_chunk *r = &chain[i]->chunks[k];
      j = pool_checkpoint_chunk_lower(f->chunks, m, r->base);
      if (j == m || f->chunks[j].base != r->base) {
        memmove(&f->chunks[j + 1], &f->chunks[j], (m - j) * sizeof *f->chunks);
        f->chunks[j] = (pool_checkpoint_chunk){r->base, r->size, 0, r->size, 0, 0};
        m++;
      }
      f->chunks[j].count += r->count;
    }
  }
  for (j = 0, e = 0; j < m; j++) {
    f->chunks[j].first = e;
    e += f->chunks[j].count;
    f->chunks[j].count = 0;
  }

  /* Apply the links from the root on. */
  for (i = 0; i < n_links; i++) {
    for (k = 0; k < chain[i]->n_chunks; k++) {
      const pool_checkpoint_chunk *r = &chain[i]->chunks[k];
      pool_checkpoint_chunk *fc = &f->chunks[pool_checkpoint_chunk_lower(f->chunks, m, r->base)];
      pool_checkpoint_entry *en = f->entries + fc->first;
      size_t a = pool_entries_lower(en, fc->count, r->lo), b = pool_entries_lower(en, fc->count, r->hi);
      memmove(en + a + r->count, en + b, (fc->count - b) * sizeof *en);
      memcpy(en + a, chain[i]->entries + r->first, r->count * sizeof *en);
      fc->count = fc->count - (b - a) + r->count;
    }
  }
  f->owner = c->owner;
  f->id = c->id;
  f->refs = 1;
  f->base = NULL;
  f->depth = 0;
  f->allocated_bytes = c->allocated_bytes;
  f->n_chunks = m;
  f->n_entries = cap_entries;
  return f;
}

void pool_checkpoint_foreach_allocated(const pool_checkpoint *c, void (*fn)(void *user, void *base, size_t bytes),
                                       void *user) {
  size_t i, k;
  pool_checkpoint *flat = NULL;
  if (!c || !fn) return;
  if (c->base) {
    flat = pool_checkpoint_flatten(NULL, c);
    if (!flat) return;
    c = flat;
  }
  for (i = 0; i < c->n_chunks; i++) {
    const pool_checkpoint_chunk *cc = &c->chunks[i];
    for (k = cc->first; k < cc->first + cc->count; k++) {
      const pool_checkpoint_entry *en = &c->entries[k];
      if (en->allocated) fn(user, cc->base + en->offset, en->size);
    }
  }
  free(flat);
}

/* 1 if c was taken from p: every chunk of c is still one of p's, at the same
 * base and size. Both arrays are sorted, so one merge walk answers it. */
static int pool_checkpoint_fits(const pool *p, const pool_checkpoint *c) {
  size_t i = 0, j;
  if (c->owner != p) return 0;
  for (j = 0; j < c->n_chunks; j++) {
    while (i < p->n_chunks && p->chunks[i]->base != c->chunks[j].base) i++;
    if (i == p->n_chunks || p->chunks[i]->size != c->chunks[j].size) return 0;
    i++;
  }
  return 1;
}

/* Gives back every descriptor a failed restore staged. */
static void pool_restore_unstage(pool *p) {
  size_t i;
  for (i = 0; i < p->n_chunks; i++) {
    pool_block *b = p->chunks[i]->staged;
    while (b) {
      pool_block *next = b->next;
      pool_block_give(p, b);
      b = next;
    }
    p->chunks[i]->staged = NULL;
  }
}

/* Widens [*lo, *hi) to the ends of the blocks of the list at first (in a
 * chunk based at base) that hold its ends. */
static void pool_range_snap(const pool_block *first, const char *base, size_t *lo, size_t *hi) {
  const pool_block *b;
  size_t new_lo = *lo, new_hi = *hi;
  if (*lo == *hi) return;
  for (b = first; b; b = b->next) {
    size_t off = (size_t)(b->base - base), end = off + b->size;
    if (off <= *lo && *lo < end) new_lo = off;
    if (off < *hi && *hi <= end) new_hi = end;
  }
  *lo = new_lo;
  *hi = new_hi;
}

/* pool_restore for a full checkpoint. */
static cgt_status pool_restore_full(pool *p, const pool_checkpoint *c, int (*keep)(void *user, void *base),
                                    void *user) {
  pool_block *table = NULL, *root = NULL, *b;
  size_t allocated = 0, blocks = 0, i, j = 0, k;
  if (!pool_checkpoint_fits(p, c)) return CGT_ERR_INVALID_ARGUMENT;

  /* Stage the new layout on chunk->staged, with its own table and free tree,
   * out of fresh descriptors. The live layout is not touched until the swap. */
  for (i = 0; i < p->n_chunks; i++) {
    pool_chunk *ch = p->chunks[i];
    pool_block *last = NULL;
    cgt_assert_internal(ch->staged == NULL);
    ch->staged_lo = ch->staged_hi = 0;
    if (j < c->n_chunks && c->chunks[j].base == ch->base) {
      const pool_checkpoint_chunk *cc = &c->chunks[j++];
      for (k = cc->first; k < cc->first + cc->count; k++) {
        const pool_checkpoint_entry *en = &c->entries[k];
        int alloc = en->allocated && (!keep || keep(user, ch->base + en->offset));
        if (en->allocated && !alloc) pool_range_widen(&ch->staged_lo, &ch->staged_hi, en->offset, en->size);
        if (!alloc && last && !last->allocated) {
          /* A dropped block next to a free one: they merge, as pool_free would. */
          last->size += en->size;
          continue;
        }
        b = pool_block_take(p);
        if (!b) goto oom;
        b->base = ch->base + en->offset;
        b->size = en->size;
        b->chunk = ch;
        b->allocated = alloc;
        b->prev = last;
        if (last)
          last->next = b;
        else
          ch->staged = b;
        last = b;
        blocks++;
        if (alloc) {
          if (!pool_hash_add(p, &table, b)) goto oom;
          allocated += b->size;
        }
      }
      /* What differs from c: the free blocks the dropped ones became. */
      pool_range_snap(ch->staged, ch->base, &ch->staged_lo, &ch->staged_hi);
    } else {
      /* Made after the checkpoint: wholly free, and wholly new to c. */
      b = pool_block_take(p);
      if (!b) goto oom;
      b->base = ch->base;
      b->size = ch->size;
      b->chunk = ch;
      ch->staged = b;
      ch->staged_hi = ch->size;
      blocks++;
    }
    /* Sizes are final only once the chunk is done, so the free tree is
     * filled afterwards. */
    for (b = ch->staged; b; b = b->next)
      if (!b->allocated) root = pool_tree_insert(root, b);
  }

  /* The swap: nothing below can fail. */
  for (i = 0; i < p->n_chunks; i++) {
    pool_chunk *ch = p->chunks[i];
    b = ch->first;
    while (b) {
      pool_block *next = b->next;
      pool_block_give(p, b);
      b = next;
    }
    ch->first = ch->staged;
    ch->staged = NULL;
    ch->dirty_lo = ch->staged_lo;
    ch->dirty_hi = ch->staged_hi;
  }
  HASH_CLEAR(hh, p->table);
  p->table = table;
  p->free_root = root;
  p->stats.allocated_bytes = allocated;
  p->stats.blocks = blocks;
  if (allocated > p->stats.peak_bytes) p->stats.peak_bytes = allocated;
  p->mark = c->id;
  pool_assert_expensive(p);
  return CGT_OK;

oom:
  HASH_CLEAR(hh, table);
  pool_restore_unstage(p);
  pool_assert_expensive(p);
  return CGT_ERR_OUT_OF_MEMORY;
}

cgt_status pool_restore(pool *p, const pool_checkpoint *c, int (*keep)(void *user, void *base), void *user) {
  pool_checkpoint *flat = NULL;
  cgt_status st;
  if (!p || !c || c->owner != p) return CGT_ERR_INVALID_ARGUMENT;
  if (c->base) {
    flat = pool_checkpoint_flatten(p, c);
    if (!flat) return CGT_ERR_OUT_OF_MEMORY;
  }
  st = pool_restore_full(p, flat ? flat : c, keep, user);
  free(flat);
  return st;
}

/* pool_matches for a full checkpoint. */
static int pool_matches_full(const pool *p, const pool_checkpoint *c) {
  size_t i, j = 0, k;
  if (!pool_checkpoint_fits(p, c)) return 0;
  for (i = 0; i < p->n_chunks; i++) {
    const pool_chunk *ch = p->chunks[i];
    const pool_block *b = ch->first;
    if (j < c->n_chunks && c->chunks[j].base == ch->base) {
      const pool_checkpoint_chunk *cc = &c->chunks[j++];
      for (k = cc->first; k < cc->first + cc->count; k++, b = b->next) {
        const pool_checkpoint_entry *en = &c->entries[k];
        if (!b || b->base != ch->base + en->offset || b->size != en->size || b->allocated != en->allocated)
          return 0;
      }
      if (b) return 0;
    } else if (b->allocated || b->next) {
      return 0;
    }
  }
  return 1;
}

int pool_matches(const pool *p, const pool_checkpoint *c) {
  pool_checkpoint *flat;
  int match;
  if (!p || !c || c->owner != p) return 0;
  if (!c->base) return pool_matches_full(p, c);
  flat = pool_checkpoint_flatten(NULL, c);
  match = flat && pool_matches_full(p, flat);
  free(flat);
  return match;
}

void pool_clear(pool *p) {
  size_t i;
  if (!p) return;
  HASH_CLEAR(hh, p->table);
  p->free_root = NULL;
  for (i = 0; i < p->n_chunks; i++) {
    pool_chunk *ch = p->chunks[i];
    pool_block *first = ch->first, *b = first->next;
    while (b) {
      pool_block *next = b->next;
      pool_block_give(p, b);
      b = next;
    }
    first->next = NULL;
    first->size = ch->size;
    first->allocated = 0;
    ch->dirty_lo = 0;
    ch->dirty_hi = ch->size;
    p->free_root = pool_tree_insert(p->free_root, first);
  }
  p->stats.allocated_bytes = 0;
  p->stats.blocks = p->n_chunks;
  p->mark = 0; /* no checkpoint has this layout */
  pool_assert_expensive(p);
}

/* ----------------------------------------------------------- invariants */

static int pool_fail(char *why, size_t why_bytes, const char *fmt, ...) {
  if (why && why_bytes) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_bytes, fmt, ap);
    va_end(ap);
  }
  return 0;
}

/* Checks the subtree at n: order, AVL balance and heights, and that it holds
 * free blocks only. Returns its height, or -1 after writing why. */
static int pool_check_tree(const pool_block *n, const pool_block *lo, const pool_block *hi, size_t *count,
                           char *why, size_t why_bytes) {
  int l, r;
  if (!n) return 0;
  if (n->allocated) {
    pool_fail(why, why_bytes, "free tree holds allocated block %p", (void *)n->base);
    return -1;
  }
  if ((lo && pool_tree_cmp(lo, n) >= 0) || (hi && pool_tree_cmp(n, hi) >= 0)) {
    pool_fail(why, why_bytes, "free tree out of order at block %p", (void *)n->base);
    return -1;
  }
  (*count)++;
  l = pool_check_tree(n->left, lo, n, count, why, why_bytes);
  if (l < 0) return -1;
  r = pool_check_tree(n->right, n, hi, count, why, why_bytes);
  if (r < 0) return -1;
  if (n->height != 1 + (l > r ? l : r) || l - r > 1 || r - l > 1) {
    pool_fail(why, why_bytes, "free tree unbalanced or stale height at block %p", (void *)n->base);
    return -1;
  }
  return n->height;
}

static int pool_check_impl(const pool *p, char *why, size_t why_bytes) {
  size_t i, reserved = 0, allocated = 0, blocks = 0, n_alloc = 0, n_free = 0, n_tree = 0;
  if (why && why_bytes) why[0] = '\0';
  if (!p) return pool_fail(why, why_bytes, "pool is NULL");
  if (p->chunk_bytes == 0 || p->chunk_bytes % POOL_ALIGN) return pool_fail(why, why_bytes, "bad chunk_bytes");
  if (p->n_chunks > p->cap_chunks) return pool_fail(why, why_bytes, "more chunks than capacity");
  for (i = 0; i < p->n_chunks; i++) {
    const pool_chunk *ch = p->chunks[i];
    const pool_block *b, *prev = NULL;
    char *end;
    int dirty_ends;
    if (!ch) return pool_fail(why, why_bytes, "chunk %zu is NULL", i);
    if ((uintptr_t)ch->base % POOL_ALIGN || ch->size == 0 || ch->size % POOL_ALIGN)
      return pool_fail(why, why_bytes, "chunk %zu (%p) misaligned or empty", i, (void *)ch->base);
    if (i > 0 && !pool_ptr_less(p->chunks[i - 1]->base, ch->base))
      return pool_fail(why, why_bytes, "chunks %zu and %zu out of address order", i - 1, i);
    if (i > 0 && (uintptr_t)p->chunks[i - 1]->base + p->chunks[i - 1]->size > (uintptr_t)ch->base)
      return pool_fail(why, why_bytes, "chunks %zu and %zu overlap", i - 1, i);
    if (ch->staged) return pool_fail(why, why_bytes, "chunk %zu has a staged layout outside a restore", i);
    if (!ch->first) return pool_fail(why, why_bytes, "chunk %zu has no blocks", i);
    if (ch->dirty_lo > ch->dirty_hi || ch->dirty_hi > ch->size || ch->dirty_lo % POOL_ALIGN || ch->dirty_hi % POOL_ALIGN)
      return pool_fail(why, why_bytes, "chunk %zu has a bad dirty range", i);
    reserved += ch->size;
    end = ch->base;
    dirty_ends = ch->dirty_lo == ch->dirty_hi ? 2 : 0;
    for (b = ch->first; b; prev = b, b = b->next) {
      /* A delta replaces whole blocks: the dirty range ends on boundaries. */
      if (ch->dirty_lo != ch->dirty_hi) {
        dirty_ends += (size_t)(b->base - ch->base) == ch->dirty_lo;
        dirty_ends += (size_t)(b->base - ch->base) + b->size == ch->dirty_hi;
      }
      if (b->chunk != ch) return pool_fail(why, why_bytes, "block %p names the wrong chunk", (void *)b->base);
      if (b->prev != prev) return pool_fail(why, why_bytes, "block %p has a bad prev link", (void *)b->base);
      if (b->base != end)
        return pool_fail(why, why_bytes, "chunk %zu not tiled: block at %p, expected %p", i, (void *)b->base,
                         (void *)end);
      if (b->size == 0 || b->size % POOL_ALIGN)
        return pool_fail(why, why_bytes, "block %p has bad size %zu", (void *)b->base, b->size);
      if (b->size > ch->size - (size_t)(b->base - ch->base))
        return pool_fail(why, why_bytes, "block %p runs past its chunk", (void *)b->base);
      end = b->base + b->size;
      blocks++;
      if (b->allocated) {
        n_alloc++;
        allocated += b->size;
        if (pool_hash_find(p, b->base) != b)
          return pool_fail(why, why_bytes, "allocated block %p is not in the table", (void *)b->base);
      } else {
        n_free++;
        if (prev && !prev->allocated)
          return pool_fail(why, why_bytes, "adjacent free blocks %p and %p", (void *)prev->base, (void *)b->base);
      }
    }
    if (end != ch->base + ch->size) return pool_fail(why, why_bytes, "chunk %zu not tiled to its end", i);
    if (dirty_ends != 2) return pool_fail(why, why_bytes, "chunk %zu: dirty range not on block boundaries", i);
  }
  if (HASH_COUNT(p->table) != n_alloc)
    return pool_fail(why, why_bytes, "table holds %u blocks, layout has %zu allocated", HASH_COUNT(p->table),
                     n_alloc);
  if (pool_check_tree(p->free_root, NULL, NULL, &n_tree, why, why_bytes) < 0) return 0;
  if (n_tree != n_free)
    return pool_fail(why, why_bytes, "free tree holds %zu blocks, layout has %zu free", n_tree, n_free);
  if (p->stats.reserved_bytes != reserved)
    return pool_fail(why, why_bytes, "reserved_bytes %zu, chunks sum to %zu", p->stats.reserved_bytes, reserved);
  if (p->stats.allocated_bytes != allocated)
    return pool_fail(why, why_bytes, "allocated_bytes %zu, blocks sum to %zu", p->stats.allocated_bytes, allocated);
  if (p->stats.peak_bytes < allocated)
    return pool_fail(why, why_bytes, "peak_bytes %zu below allocated %zu", p->stats.peak_bytes, allocated);
  if (p->stats.chunks != p->n_chunks)
    return pool_fail(why, why_bytes, "stats.chunks %zu, pool has %zu", p->stats.chunks, p->n_chunks);
  if (p->stats.blocks != blocks)
    return pool_fail(why, why_bytes, "stats.blocks %zu, layout has %zu", p->stats.blocks, blocks);
  return 1;
}

int pool_check(const pool *p, char *why, size_t why_bytes) { return pool_check_impl(p, why, why_bytes); }

/* Checks that entries [first, first + count) of c tile [lo, hi) with no two
 * free ones touching; adds their allocated bytes to *allocated. */
static int pool_check_run(const pool_checkpoint *c, const pool_checkpoint_chunk *cc, size_t *allocated, char *why,
                          size_t why_bytes) {
  size_t k, end = cc->lo;
  if (cc->first > c->n_entries || cc->count > c->n_entries - cc->first)
    return pool_fail(why, why_bytes, "checkpoint %llu: chunk %p entries out of bounds", (unsigned long long)c->id,
                     (void *)cc->base);
  for (k = cc->first; k < cc->first + cc->count; k++) {
    const pool_checkpoint_entry *en = &c->entries[k];
    if (en->offset != end || en->size == 0 || en->size % POOL_ALIGN || en->size > cc->hi - end)
      return pool_fail(why, why_bytes, "checkpoint %llu: chunk %p not tiled at offset %zu",
                       (unsigned long long)c->id, (void *)cc->base, end);
    if (k > cc->first && !en->allocated && !c->entries[k - 1].allocated)
      return pool_fail(why, why_bytes, "checkpoint %llu: adjacent free entries at offset %zu",
                       (unsigned long long)c->id, en->offset);
    if (en->allocated) *allocated += en->size;
    end += en->size;
  }
  if (end != cc->hi)
    return pool_fail(why, why_bytes, "checkpoint %llu: chunk %p tiled to %zu, not %zu", (unsigned long long)c->id,
                     (void *)cc->base, end, cc->hi);
  return 1;
}

int pool_checkpoint_check(const pool_checkpoint *c, char *why, size_t why_bytes) {
  const pool_checkpoint *l;
  pool_checkpoint *flat;
  size_t j, allocated = 0;
  int ok = 1;
  if (why && why_bytes) why[0] = '\0';
  if (!c) return pool_fail(why, why_bytes, "checkpoint is NULL");
  for (l = c; l; l = l->base) {
    if (l->owner != c->owner) return pool_fail(why, why_bytes, "chain mixes pools");
    if (l->refs == 0) return pool_fail(why, why_bytes, "checkpoint %llu has no reference", (unsigned long long)l->id);
    if (l->base ? (l->depth != l->base->depth + 1 || l->id <= l->base->id) : l->depth != 0)
      return pool_fail(why, why_bytes, "checkpoint %llu: bad depth or id against its base", (unsigned long long)l->id);
    for (j = 0; j < l->n_chunks; j++) {
      const pool_checkpoint_chunk *cc = &l->chunks[j];
      size_t ignored = 0;
      if (j > 0 && !pool_ptr_less(l->chunks[j - 1].base, cc->base))
        return pool_fail(why, why_bytes, "checkpoint %llu: chunks out of order", (unsigned long long)l->id);
      if (cc->size == 0 || cc->size % POOL_ALIGN || cc->lo % POOL_ALIGN || cc->hi % POOL_ALIGN || cc->lo >= cc->hi ||
          cc->hi > cc->size || (!l->base && (cc->lo != 0 || cc->hi != cc->size)))
        return pool_fail(why, why_bytes, "checkpoint %llu: chunk %p has a bad range", (unsigned long long)l->id,
                         (void *)cc->base);
      if (!pool_check_run(l, cc, &ignored, why, why_bytes)) return 0;
    }
  }
  /* The layout the chain stands for. */
  flat = pool_checkpoint_flatten(NULL, c);
  if (!flat) return pool_fail(why, why_bytes, "no host memory to expand checkpoint %llu", (unsigned long long)c->id);
  for (j = 0; ok && j < flat->n_chunks; j++) ok = pool_check_run(flat, &flat->chunks[j], &allocated, why, why_bytes);
  if (ok && allocated != c->allocated_bytes)
    ok = pool_fail(why, why_bytes, "checkpoint %llu: allocated_bytes %zu, blocks sum to %zu",
                   (unsigned long long)c->id, c->allocated_bytes, allocated);
  free(flat);
  return ok;
}
