/* fuse.c — deferred launch: replays held back and launched several at a
 * time, as one graph launch of a fused executable (path fusion).
 *
 * Every graph launch costs the GPU a microsecond or two to start, whatever
 * the graph holds; a program of many short segments pays it once per
 * segment. With defer_launch, a replay does its bookkeeping at once (its
 * values exist when cgt_run returns) but its launch is appended to a queue.
 * Because anything that is not a replay flushes the queue first, the queue
 * is always a contiguous stretch of the current path: a *span*, from its
 * first node A down to its last node B, each node the parent of the next.
 * A span is therefore named by its two ends, and the fused executables are
 * cached on B, keyed by A.
 *
 * A flush looks the span up. The first time a span is seen it is launched
 * node by node, exactly as without deferral: a stretch that never comes
 * back is not worth an instantiation. Once it has been flushed
 * FUSE_RECURRENCE times it gets a fused executable (the backend builds one
 * executable that runs the nodes' graphs in order), and from then on it is
 * one launch. DYNAMIC arguments are copied into their placeholders by copy
 * nodes inside each recorded graph; the fused executable has its own copy
 * of each, repointed when the argument moved since that executable's last
 * launch, just as a node's own executable is.
 *
 * Fused executables cost device memory, so there is a cap (least recently
 * used first out), and spans seen once are remembered only up to a multiple
 * of it. A span that cannot be fused (a backend failure, a copy the device
 * cannot repoint) is marked and launched node by node from then on.
 *
 * Pool memory does not change: a fused executable runs the very graphs the
 * nodes recorded, at the same addresses, in the same order, and the number
 * of recordings does not change either. Nothing here allocates once the
 * spans of a program are known: the steady state is a lookup in B's short
 * list, the repointing of moved copies, and one launch.
 */
#include <stdlib.h>
#include <string.h>
#include <utlist.h>

#include "tree_internal.h"

typedef struct fuse_copy {
  void *handle;    /* the copy op inside the fused executable */
  const void *src; /* where it reads now; NULL: not known yet */
} fuse_copy;

struct fuse_span {
  node *first; /* A; the span ends at `last` (B), which holds it */
  node *last;
  uint32_t length;
  uint32_t flushes;  /* flushes of exactly this span */
  uint64_t launches; /* fused launches */
  void *fused;       /* the fused executable, once the span has recurred */
  int unfusable;     /* fusing failed once: node by node for good */
  uint32_t n_copies; /* the DYNAMIC copies of the span's nodes, in path order */
  fuse_copy *copies;
  fuse_span *next_on_node;        /* B's list */
  fuse_span *lru_prev, *lru_next; /* the LRU list (below) */
};

void fuse__init(cgt_tree *t) {
  fuse_state *q = &t->fuse;
  memset(q, 0, sizeof *q);
  const backend_ops *ops = t->dev.ops;
  q->enabled = t->opt.defer_launch && ops->fuse && ops->fused_find_copy && ops->fused_set_copy_src &&
               ops->fused_launch && ops->fused_destroy;
  q->exec_cap = FUSE_CACHE_DEFAULT;
  const char *e = getenv("CGT_FUSE_CACHE");
  if (e && *e) {
    char *end;
    unsigned long v = strtoul(e, &end, 10);
    if (*end || v == 0 || v > 1u << 20)
      tree__log(t, CGT_LOG_WARN, "CGT_FUSE_CACHE=%s is not a count from 1 to %u; using %u", e, 1u << 20,
                FUSE_CACHE_DEFAULT);
    else
      q->exec_cap = (uint32_t)v;
  }
}

int fuse__enabled(const cgt_tree *t) { return t->fuse.enabled; }

/* ------------------------------------------------------------ the cache */

/* The spans, most recently flushed first, are a doubly linked list of
 * utlist.h (uthash's list macros), whose head's lru_prev is its tail. */
static void lru_unlink(fuse_state *q, fuse_span *s) {
  DL_DELETE2(q->lru_first, s, lru_prev, lru_next);
  s->lru_prev = s->lru_next = NULL;
}

static void lru_push_front(fuse_state *q, fuse_span *s) { DL_PREPEND2(q->lru_first, s, lru_prev, lru_next); }

static fuse_span *lru_tail(const fuse_state *q) { return q->lru_first ? q->lru_first->lru_prev : NULL; }

/* Gives the span's fused executable back; the span stays remembered. */
static void span_drop_exec(cgt_tree *t, fuse_span *s) {
  if (!s->fused)
    return;
  t->dev.ops->fused_destroy(&t->dev, s->fused);
  s->fused = NULL;
  free(s->copies);
  s->copies = NULL;
  s->n_copies = 0;
  t->fuse.n_execs--;
}

static void span_free(cgt_tree *t, fuse_span *s) {
  span_drop_exec(t, s);
  lru_unlink(&t->fuse, s);
  fuse_span **p = &s->last->spans;
  while (*p && *p != s)
    p = &(*p)->next_on_node;
  if (*p)
    *p = s->next_on_node;
  t->fuse.n_spans--;
  free(s);
}

/* The span A..B (length n), found on B or made; NULL without host memory
 * (the span is then launched node by node). */
static fuse_span *span_get(cgt_tree *t, node *a, node *b, uint32_t n) {
  fuse_state *q = &t->fuse;
  for (fuse_span *s = b->spans; s; s = s->next_on_node)
    if (s->first == a) {
      lru_unlink(q, s);
      lru_push_front(q, s);
      return s;
    }
  fuse_span *s = tree__calloc(t, 1, sizeof *s);
  if (!s)
    return NULL;
  s->first = a;
  s->last = b;
  s->length = n;
  s->next_on_node = b->spans;
  b->spans = s;
  lru_push_front(q, s);
  q->n_spans++;
  /* Remembering spans is bounded too; the oldest goes first. */
  uint64_t span_cap = (uint64_t)q->exec_cap * FUSE_SPANS_PER_EXEC;
  while (q->n_spans > span_cap && lru_tail(q) != s)
    span_free(t, lru_tail(q));
  return s;
}

/* Keeps at most exec_cap fused executables, evicting the least recently
 * used ones other than keep. */
static void evict_execs(cgt_tree *t, const fuse_span *keep) {
  fuse_state *q = &t->fuse;
  for (fuse_span *s = lru_tail(q); s && q->n_execs > q->exec_cap; s = s == q->lru_first ? NULL : s->lru_prev)
    if (s != keep && s->fused) {
      tree__log(t, CGT_LOG_DEBUG, "fused span %u..%u evicted (cap %u)", s->first->id, s->last->id, q->exec_cap);
      span_drop_exec(t, s);
    }
}

/* Builds the fused executable of span s (held[0..n)). On failure the caller
 * launches it node by node; the span is marked unfusable unless only memory
 * ran out (then the next flush tries again). */
static void span_build(cgt_tree *t, fuse_span *s, node *const *held, uint32_t n) {
  const backend_ops *ops = t->dev.ops;
  fuse_state *q = &t->fuse;
  uint32_t n_copies = 0;
  const char *why = NULL;
  for (uint32_t i = 0; i < n && !why; i++) {
    if (!held[i]->graph)
      why = "a node has no graph";
    for (uint32_t j = 0; j < held[i]->n_placeholders && !why; j++)
      if (!held[i]->placeholders[j].copy_op)
        why = "a DYNAMIC argument is copied outside its graph";
    n_copies += held[i]->n_placeholders;
  }
  int retry = 0; /* only memory ran out: try again at the next flush */
  fuse_copy *copies = NULL;
  if (!why && (!tree__grow(t, (void **)&q->parts, &q->parts_cap, n, sizeof *q->parts) ||
               (n_copies && !(copies = tree__calloc(t, n_copies, sizeof *copies))))) {
    why = "no host memory";
    retry = 1;
  }
  void *fused = NULL;
  if (!why) {
    for (uint32_t i = 0; i < n; i++)
      q->parts[i] = held[i]->graph;
    cgt_status st = ops->fuse(&t->dev, q->parts, n, &fused);
    if (st != CGT_OK) {
      why = t->dev.error;
      retry = st == CGT_ERR_OUT_OF_MEMORY;
    }
  }
  for (uint32_t i = 0, k = 0; i < n && !why; i++)
    for (uint32_t j = 0; j < held[i]->n_placeholders && !why; j++, k++)
      if (ops->fused_find_copy(&t->dev, fused, i, held[i]->placeholders[j].ptr, &copies[k].handle) != CGT_OK)
        why = t->dev.error;
  if (why) {
    tree__log(t, CGT_LOG_INFO, "span of nodes %u..%u is launched node by node%s: %s", s->first->id, s->last->id,
              retry ? " this time" : "", why);
    if (fused)
      ops->fused_destroy(&t->dev, fused);
    free(copies);
    s->unfusable = !retry;
    return;
  }
  s->fused = fused;
  s->copies = copies;
  s->n_copies = n_copies;
  q->n_execs++;
  tree__log(t, CGT_LOG_INFO, "span of nodes %u..%u (%u nodes) fused into one launch", s->first->id, s->last->id, n);
  evict_execs(t, s);
}

/* Points the fused executable's copies at the sources of this flush.
 * CGT_ERR_BACKEND if the device cannot (the span is then given up). */
static cgt_status span_repoint(cgt_tree *t, fuse_span *s, node *const *held, uint32_t n) {
  const backend_ops *ops = t->dev.ops;
  for (uint32_t i = 0, k = 0; i < n; i++)
    for (uint32_t j = 0; j < held[i]->n_placeholders; j++, k++) {
      const node_placeholder *ph = &held[i]->placeholders[j];
      fuse_copy *c = &s->copies[k];
      if (c->src == ph->next_src)
        continue;
      if (ops->fused_set_copy_src(&t->dev, s->fused, i, c->handle, ph->ptr, ph->next_src, ph->bytes) != CGT_OK)
        return CGT_ERR_BACKEND;
      c->src = ph->next_src;
    }
  return CGT_OK;
}

/* ------------------------------------------------------------ the queue */

cgt_status fuse__hold(cgt_tree *t, node *n) {
  fuse_state *q = &t->fuse;
  if (NEVER(q->n_held && n->parent != q->held[q->n_held - 1]))
    return tree__fail(t, CGT_ERR_STATE, "held-back replays are not a stretch of the path");
  if (!tree__grow(t, (void **)&q->held, &q->held_cap, q->n_held + 1, sizeof *q->held))
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory to hold a replay back");
  q->held[q->n_held++] = n;
  return CGT_OK;
}

static cgt_status launch_one_by_one(cgt_tree *t, node *const *held, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    cgt_status st = node__launch(t, held[i]);
    if (st != CGT_OK)
      return st;
  }
  return CGT_OK;
}

static cgt_status flush_held(cgt_tree *t, node *const *held, uint32_t n);

/* Public calls that flush (cgt_flush, cgt_sync, cgt_value_ptr, ...) may come
 * while another device is current: the launches go to the tree's device. */
cgt_status fuse__flush(cgt_tree *t) {
  fuse_state *q = &t->fuse;
  uint32_t n = q->n_held;
  if (n == 0)
    return CGT_OK;
  int saved = tree__device_enter(t);
  cgt_status st = flush_held(t, q->held, n);
  tree__device_leave(t, saved);
  return st;
}

/* 1 if a held node's segment has a prelaunch function: one set after its
 * replay was held back (replays of such a segment are not held back, but
 * cgt_segment_set_prelaunch may come between). A fused launch calls none, so
 * such work goes node by node, each launch after its prelaunch. */
static int any_prelaunch(const cgt_tree *t, node *const *held, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (t->segments[held[i]->segment - 1].prelaunch)
      return 1;
  return 0;
}

static cgt_status flush_held(cgt_tree *t, node *const *held, uint32_t n) {
  fuse_state *q = &t->fuse;
  q->n_held = 0; /* empty whatever happens: work is never launched twice */
  if (n == 1)
    return node__launch(t, held[0]);
  if (any_prelaunch(t, held, n))
    return launch_one_by_one(t, held, n);
  fuse_span *s = span_get(t, held[0], held[n - 1], n);
  if (!s)
    return launch_one_by_one(t, held, n);
  s->flushes++;
  if (!s->fused && !s->unfusable && s->flushes >= FUSE_RECURRENCE)
    span_build(t, s, held, n);
  if (!s->fused)
    return launch_one_by_one(t, held, n);
  if (span_repoint(t, s, held, n) != CGT_OK) {
    tree__log(t, CGT_LOG_INFO, "span of nodes %u..%u is launched node by node from now on: %s", s->first->id,
              s->last->id, t->dev.error);
    span_drop_exec(t, s);
    s->unfusable = 1;
    return launch_one_by_one(t, held, n);
  }
  const backend_ops *ops = t->dev.ops;
  if (ops->range_push)
    ops->range_push(&t->dev, "cgtree fused span");
  uint64_t t0 = t->opt.time_launches ? tree__now_ns() : 0;
  cgt_status st = ops->fused_launch(&t->dev, s->fused);
  if (t->opt.time_launches)
    t->stats.launch_host_ns += tree__now_ns() - t0;
  if (ops->range_pop)
    ops->range_pop(&t->dev);
  if (st != CGT_OK)
    return tree__backend_fail(t, st, "fused launch");
  s->launches++;
  t->stats.fused_launches++;
  t->stats.fused_runs += n;
  for (uint32_t i = 0; i < n; i++)
    held[i]->fused_runs++;
  return CGT_OK;
}

/* -------------------------------------------------------------- teardown */

void fuse__forget_node(cgt_tree *t, node *n) {
  while (n->spans)
    span_free(t, n->spans);
}

void fuse__forget_spans_from(cgt_tree *t, node *n, uint32_t depth) {
  fuse_span *s = n->spans;
  while (s) {
    fuse_span *next = s->next_on_node;
    if (s->first->depth <= depth)
      span_free(t, s);
    s = next;
  }
}

void fuse__destroy(cgt_tree *t) {
  fuse_state *q = &t->fuse;
  while (q->lru_first)
    span_free(t, q->lru_first);
  free(q->held);
  free(q->parts);
  q->held = NULL;
  q->parts = NULL;
  q->n_held = q->held_cap = q->parts_cap = 0;
}

/* ------------------------------------------------------------ inspection */

#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond))                                        \
      return tree__fail(t, CGT_ERR_STATE, __VA_ARGS__); \
  } while (0)

cgt_status fuse__check(cgt_tree *t) {
  const fuse_state *q = &t->fuse;
  CHECK(q->n_held == 0 || fuse__enabled(t), "replays are held back though deferred launch is off");
  CHECK(q->n_held == 0 || q->held[q->n_held - 1] == t->cur, "the last held-back replay is not the path's last node");
  for (uint32_t i = 0; i < q->n_held; i++) {
    CHECK(q->held[i]->state == NODE_RECORDED, "held-back node %u is not RECORDED", q->held[i]->id);
    CHECK(i == 0 || q->held[i]->parent == q->held[i - 1], "held-back node %u is not the child of node %u",
          q->held[i]->id, q->held[i - 1]->id);
  }
  uint32_t spans = 0, execs = 0;
  for (const fuse_span *s = q->lru_first; s; s = s->lru_next) {
    spans++;
    execs += s->fused != NULL;
    CHECK(s->lru_next ? s->lru_next->lru_prev == s : s == lru_tail(q),
          "the LRU list of fused spans is broken at span %u..%u", s->first->id, s->last->id);
    CHECK(!s->fused || !s->unfusable, "span %u..%u is both fused and unfusable", s->first->id, s->last->id);
    uint32_t length = 1;
    const node *a = s->last;
    while (a && a != s->first && a->parent) {
      a = a->parent;
      length++;
    }
    CHECK(a == s->first && length == s->length, "span %u..%u is not a stretch of %u nodes", s->first->id, s->last->id,
          s->length);
    const fuse_span *o = s->last->spans;
    while (o && o != s)
      o = o->next_on_node;
    CHECK(o == s, "span %u..%u is not listed on its last node", s->first->id, s->last->id);
  }
  CHECK(spans == q->n_spans && execs == q->n_execs, "%u spans with %u fused executables, counted %u and %u", spans,
        execs, q->n_spans, q->n_execs);
  CHECK(execs <= q->exec_cap, "%u fused executables over the cap of %u", execs, q->exec_cap);
  return CGT_OK;
}

int fuse__span_at(const node *n, uint32_t i, uint32_t *first_id, uint32_t *length, uint64_t *launches) {
  for (const fuse_span *s = n->spans; s; s = s->next_on_node) {
    if (!s->fused)
      continue;
    if (i-- == 0) {
      *first_id = s->first->id;
      *length = s->length;
      *launches = s->launches;
      return 1;
    }
  }
  return 0;
}
