/* tree_internal.h — the structures behind cgt_tree, shared by the files of
 * the tree manager (tree.c, node.c, value.c, launch.c, inspect.c).
 *
 * Words, as in ARCHITECTURE.md: a *segment* is registered code; a *node* is
 * one recording site (a segment reached along one path); a *step* is one
 * pass from the roots; a *value* is a handle to an output; the *path* is the
 * chain of nodes this step has run so far (t->cur and its ancestors); the
 * *step values* are the values produced so far in this step, in order; a
 * value's *position* is its index among them.
 */
#ifndef CGT_TREE_INTERNAL_H
#define CGT_TREE_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <time.h>

#include "backend.h"
#include "cgt_assert.h"
#include "cgtree.h"
#include "fuse.h"
#include "grow.h"
#include "mem_ref.h"
#include "pool.h"

/* uthash hashes node keys with our word hash (keys are whole 64-bit words). */
uint32_t tree__key_hash(const void *key, size_t len);
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = tree__key_hash((keyptr), (keylen)))
/* Keys (node keys, warm counters) are a few whole, aligned words: comparing
 * them word by word inline costs less than memcmp's call through the PLT,
 * and a run compares one on every lookup (node.c: node_lookup). Nonzero if
 * they differ, as memcmp. */
static inline int tree__key_differs(const void *a, const void *b, size_t bytes) {
  const uint64_t *x = a, *y = b;
  for (size_t i = 0; i < bytes / sizeof *x; i++)
    if (x[i] != y[i])
      return 1;
  return 0;
}
#define HASH_KEYCMP(a, b, n) tree__key_differs((a), (b), (n))
/* uthash must never exit(): a failed insertion reports itself and leaves the
 * table as it was. Its allocations are the tree's own (counted in
 * host_allocs, and failed by the test hook). The macros name two locals,
 * hash_tree and hash_oomed, that only the functions that insert declare
 * (node.c: children_add, warm_add), so an insertion anywhere else does not
 * compile; lookups and deletions never allocate. */
void *tree__hash_malloc(struct cgt_tree *t, size_t bytes);
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) tree__hash_malloc(hash_tree, (sz))
#define uthash_free(ptr, sz) free(ptr)
#define uthash_nonfatal_oom(elt) (hash_oomed = 1)
#include <uthash.h>

#define TREE_ERROR_BYTES 512

#include "launch.h"
#include "node.h"
#include "value.h"
#include "evict.h"
#include "update.h"

typedef struct segment_rec {
  char *name;
  cgt_launch_fn launch;
  void *user;
  uint32_t n_inputs;
  uint32_t n_outputs;
  uint32_t flags; /* CGT_SEGMENT_NO_CAPTURE */
  cgt_prelaunch_fn prelaunch; /* NULL: none (cgt_segment_set_prelaunch) */
  void *prelaunch_user;
} segment_rec;

/* Eager runs of a (segment, variant) anywhere in the tree, for warmup. */
typedef struct warm_count {
  struct {
    uint64_t segment;
    uint64_t variant;
  } key;
  uint32_t runs;
  UT_hash_handle hh;
} warm_count;

/* A chunk of device memory some pool of the tree holds: [base, end). */
typedef struct chunk_range {
  uintptr_t base, end;
} chunk_range;

/* An argument of the run at hand, resolved to memory. `keyed`: its address
 * is part of the node key (a STATIC, or a VALUE whose address a recording
 * fixes); otherwise it is copied into a placeholder when recorded. */
typedef struct run_arg {
  mem_ref mem; /* block and pool: a VALUE's, else NULL */
  cgt_arg_kind kind;
  int keyed;
  uint32_t slot; /* the VALUE's slot, else VALUE_NONE */
} run_arg;

struct cgt_tree {
  cgt_options opt;
  int log_level;
  backend dev;
  char error[TREE_ERROR_BYTES];

  segment_rec *segments; /* index = id - 1 */
  uint32_t n_segments;
  uint32_t segments_cap;
  warm_count *warm;

  node root;    /* virtual: its children are the roots */
  node **nodes; /* the nodes that exist, in id order (pruned ids leave no hole) */
  uint32_t n_nodes;
  uint32_t nodes_cap;
  uint32_t next_id;         /* the id the next node gets; ids are never reused */
  uint64_t step;            /* steps begun so far (cgt_step_begin) */
  uint64_t next_prune_step; /* the step at which WARMUP nodes are next looked at */
  uint32_t tag;             /* this tree's tag in value handles (value.c) */

  /* Every chunk of device memory the tree's pools hold, sorted by address:
   * STATIC and DYNAMIC arguments must not overlap them. */
  chunk_range *chunks;
  uint32_t n_chunks;
  uint32_t chunks_cap;

  pool *pool;      /* the graph pool (TREE), or the eager allocator (EAGER) */
  pool *side_pool; /* outputs of EAGER nodes */
  /* Node.c's, written there only (others ask node__layout_owner). */
  /* The pool's layout is exactly the blocks of the live step values, so
   * warmup and recording may allocate from it as it stands. Replay clears
   * it (the graph used memory the allocator did not see move). */
  int pool_synced;
  int step_in_warmup;         /* a warmup ran in this step: the rest of it warms up */
  pool_checkpoint *sync_undo; /* the layout the current run's pool_sync replaced */
  pool *sync_undo_pool;
  int sync_undo_restored; /* that sync counted a checkpoint restore */

  node *cur; /* the path's last node; &root at the start of a step */
  value_slot *slots;
  uint32_t n_slots;
  uint32_t free_slot;      /* head of the free list, VALUE_NONE if empty */
  uint32_t n_free_slots;   /* slots on the free list: value__reserve's room, without a walk */
  uint32_t *step_values;   /* slot indexes of this step's values, in order (not the
                            path of nodes, which is t->cur and its ancestors) */
  uint64_t *values_live;   /* bit i: path[i] is live */
  uint64_t *values_pooled; /* bit i: path[i] lives in the graph pool, so a
                            recording made after it died may reuse its memory */
  uint32_t n_step_values;
  uint32_t values_words; /* words of values_live and of values_pooled */
  uint32_t step_values_cap;
  uint32_t n_live;    /* live values */
  void **live_blocks; /* restore: the graph-pool blocks live values hold, sorted */
  uint32_t n_live_blocks, live_blocks_cap, live_blocks_next;
  uint64_t *dead_scratch; /* recording: the dead set of the nearest recorded ancestor */
  uint32_t dead_scratch_words;

  uint64_t *key_buf; /* scratch for the key of the run at hand */
  uint32_t key_cap;  /* in words */
  run_arg *args;     /* scratch: the arguments of the run at hand, resolved */
  uint32_t n_run_args;
  uint32_t args_cap;

  cgt_launch launch;
  fuse_state fuse; /* held-back replays and fused executables (defer_launch) */
  cgt_stats stats;
  char *graph_dot_dir; /* CGT_GRAPH_DOT_DIR: write every recorded graph there */
  /* Every EAGER reason the tree has given a node, each text once (tree__intern): a node record's reason
   * stays valid until cgt_tree_destroy, also after its node was pruned or evicted. */
  struct interned_text *reasons;
  /* What the private pools (CGT_MODE_SEPARATE) destroyed so far had counted: their peaks and host
   * allocations stay in cgt_tree_stats' sums, which must never fall (node.c, retire_own_pool). */
  size_t retired_pool_peak_bytes;
  uint64_t retired_host_allocs;

  /* Device memory of every pool of the tree (graph pool, side pool, private
   * pools; placeholders live in them), as chunks taken from the backend and
   * not yet given back. pool_limit_bytes caps it. */
  size_t pool_held_bytes;
  cgt_reclaim_fn reclaim; /* NULL: none (cgt_tree_set_reclaim) */
  void *reclaim_user;
  /* Test hook shared by the tree and all its pools (tree_hooks.h). */
  pool_fail_hook host_fail;
  char *leftovers_out; /* test hook (cgt__leftovers_to): where destroy writes what the simulator freed */
  size_t leftovers_cap;
  uint64_t path_hash; /* cgt_tree_path_hash: (segment, variant) of this step's runs */
  uint64_t use_clock; /* ticks at every replay and recording: the budget's LRU order (node.last_use) */
};

/* The path hash of a step with no run yet. */
#define PATH_HASH_START 0x6367747265657061ull

/* splitmix64's finalizer: every input bit moves about half the output bits. */
static inline uint64_t tree__path_hash_mix(uint64_t h, uint64_t word) {
  h ^= word + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

/* The path hash h after one more run of (segment, variant). */
static inline uint64_t tree__path_hash_next(uint64_t h, cgt_segment seg, uint64_t variant) {
  return tree__path_hash_mix(tree__path_hash_mix(h, seg), variant);
}

/* tree.c */
cgt_status tree__fail(cgt_tree *t, cgt_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void tree__log(cgt_tree *t, int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void *tree__malloc(cgt_tree *t, size_t bytes);
void *tree__calloc(cgt_tree *t, size_t n, size_t bytes);
/* Growable arrays (grow.h): 1, or 0 with the array unchanged; _zeroed
 * zeroes the new elements. tree__grow is inline because cgt_run calls it
 * for its scratch arrays on every run, where the capacity is nearly always
 * enough already: that case costs a compare, not a call. */
int tree__grow_slow(cgt_tree *t, void **array, uint32_t *cap, uint32_t need, size_t elem_bytes);
static inline int tree__grow(cgt_tree *t, void **array, uint32_t *cap, uint32_t need, size_t elem_bytes) {
  return need <= *cap || tree__grow_slow(t, array, cap, need, elem_bytes);
}
int tree__grow_zeroed(cgt_tree *t, void **array, uint32_t *cap, uint32_t need, size_t elem_bytes);
char *tree__strdup(cgt_tree *t, const char *s);
/* The tree's one copy of text s, kept until cgt_tree_destroy; NULL when there is no host memory. */
const char *tree__intern(cgt_tree *t, const char *s);
cgt_status tree__backend_fail(cgt_tree *t, cgt_status s, const char *what);
/* CLOCK_MONOTONIC in nanoseconds: options.time_launches's clock. */
static inline uint64_t tree__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
cgt_status tree__pool_create(cgt_tree *t, pool **out);
int tree__overlaps_pools(const cgt_tree *t, const void *p, size_t bytes);
/* Makes the tree's device current; returns what tree__device_leave puts
 * back. Every public call that does device work is bracketed by the pair. */
int tree__device_enter(cgt_tree *t);
void tree__device_leave(cgt_tree *t, int saved);

/* node.h's layout_owner of pool pl now. The fields it reads (pool_synced)
 * are node.c's to write. */
static inline layout_owner node__layout_owner(const cgt_tree *t, const pool *pl) {
  if (pl == t->side_pool || t->opt.mode == CGT_MODE_EAGER)
    return LAYOUT_VALUES;
  if (pl == t->pool && t->opt.mode == CGT_MODE_TREE)
    return t->pool_synced ? LAYOUT_VALUES : LAYOUT_CHECKPOINT;
  return LAYOUT_NODE;
}

/* inspect.c */
cgt_status tree__check(cgt_tree *t);
/* For benchmarks that launch the tree's own graphs with no runtime around
 * them: the executable graphs along the current path, root first (NULL for
 * nodes that are not RECORDED). Returns the path's length; writes at most cap. */
size_t tree__path_execs(const cgt_tree *t, void **execs, size_t cap);
cgt_status tree__launch_exec(cgt_tree *t, void *exec);

#endif /* CGT_TREE_INTERNAL_H */
