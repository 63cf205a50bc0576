/* fuse.h — deferred launch (path fusion): the queue of held-back replays and
 * the cache of fused executables (fuse.c). */
#ifndef CGT_FUSE_H
#define CGT_FUSE_H

#include <stdint.h>

#include "cgtree.h"

/* A span that recurs this often (flushes of exactly the same stretch of the
 * path) gets a fused executable; before that it is launched node by node. */
#define FUSE_RECURRENCE 2
/* Fused executables cached per tree, by default; CGT_FUSE_CACHE=n at tree
 * creation sets another cap (at least 1). The least recently used one is
 * evicted first. */
#define FUSE_CACHE_DEFAULT 64
/* Spans remembered (with or without an executable) per cached executable:
 * spans seen once are remembered so that their recurrence can be counted. */
#define FUSE_SPANS_PER_EXEC 4

typedef struct node node;
typedef struct fuse_span fuse_span;

typedef struct fuse_state {
  int enabled; /* defer_launch is set and the backend can fuse */
  /* The held-back replays: always a contiguous stretch of the current path,
   * held[0] (the span's first node, A) down to held[n_held - 1] (its last,
   * B), each the parent of the next. */
  node **held;
  uint32_t n_held;
  uint32_t held_cap;
  /* Every remembered span, most recently flushed first (fuse.c). */
  fuse_span *lru_first;
  uint32_t n_spans;
  uint32_t n_execs;  /* spans holding a fused executable */
  uint32_t exec_cap; /* the LRU cap on fused executables */
  void **parts;      /* scratch: the graphs of a span being fused */
  uint32_t parts_cap;
} fuse_state;

/* Once the backend is chosen: whether replays may be held back, and the
 * cap from the environment; holds nothing yet. */
void fuse__init(cgt_tree *t);
/* 1 if replays may be held back: defer_launch is set and the backend can
 * fuse. */
int fuse__enabled(const cgt_tree *t);
/* Holds back the replay of n, whose DYNAMIC sources are already in its
 * placeholders' next_src. n is a child of the last held node, or the
 * first. On failure (no host memory) nothing is held and the caller
 * launches n at once. */
cgt_status fuse__hold(cgt_tree *t, node *n);
/* Enqueues every held-back replay, in path order: one fused launch where
 * the span has recurred, else node by node. The queue is empty afterwards
 * whatever happens; CGT_ERR_BACKEND if a launch failed. */
cgt_status fuse__flush(cgt_tree *t);
/* Frees the spans cached on n (n is being destroyed). */
void fuse__forget_node(cgt_tree *t, node *n);
/* Frees the spans cached on n whose first node lies at most `depth` deep:
 * those that pass through n's ancestor at that depth (update.c). */
void fuse__forget_spans_from(cgt_tree *t, node *n, uint32_t depth);
/* Frees everything; the queue must be empty (flushed). */
void fuse__destroy(cgt_tree *t);
/* Invariants for tree__check: the queue is a chain ending at the path's
 * last node, the LRU list and the counts agree. */
cgt_status fuse__check(cgt_tree *t);
/* For the node list and the dot output: the spans cached on n that hold a
 * fused executable, one by one (i from 0; returns 0 past the last). */
int fuse__span_at(const node *n, uint32_t i, uint32_t *first_id, uint32_t *length, uint64_t *launches);

#endif /* CGT_FUSE_H */
