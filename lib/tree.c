/* tree.c — the tree handle: creation, options, logging, segments, steps,
 * and the front door of every run.
 *
 * cgt_run() checks everything the caller handed it before anything moves:
 * the segment id, the argument and output counts, every argument (a stale
 * VALUE is CGT_ERR_STALE_VALUE, a NULL or overflowing range is
 * CGT_ERR_INVALID_ARGUMENT), and room for the outputs. Only then does
 * node.c choose between replay, record, warmup and an eager run. A call that
 * fails here changes nothing the caller can observe.
 *
 * Steps are cheap: cgt_step_begin() kills the step's values (their handles
 * go stale) and empties the pools, because the root's checkpoint is the
 * empty pool; the next run starts again from the roots.
 *
 * Devices: every call that does device work runs with the tree's device
 * current and gives the calling thread its own device back afterwards
 * (tree__device_enter/leave), so one thread may drive trees on several GPUs.
 * cgt_run leaves it to node__run, which enters the device only after
 * deciding, and not at all for a replay held back by defer_launch: such a
 * run calls no backend, and the bracket (a cudaGetDevice) would be a good
 * part of its cost.
 *
 * The path hash fingerprints the step so far: a running hash of (segment,
 * variant) over every successful cgt_run since the step began. Ranks of a
 * data-parallel job compare it to catch a divergence before a collective
 * hangs (docs/multi-gpu.md).
 *
 * Errors carry detail: every failing call writes a one-line message into
 * the tree (cgt_tree_last_error) and logs it at debug level. Nothing here is
 * global; everything hangs off the tree.
 *
 * Memory, host and device, fails softly. Every host allocation goes through
 * tree__malloc and its siblings (uthash's too), which count it and let a
 * test hook fail it; every pool of the tree takes device memory from one
 * chunk source here, which keeps pool_limit_bytes. Options left at zero mean
 * their defaults, except warmup_runs (0: record at once).
 */
#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "cgtree_sim.h"
#include "tree_hooks.h"
#include "tree_internal.h"

/* --------------------------------------------------- errors, logs, memory */

static void tree_emit(cgt_tree *t, int level, const char *msg) {
  if (level > t->log_level)
    return;
  if (t->opt.log_fn) {
    t->opt.log_fn(t->opt.log_user, level, msg);
    return;
  }
  static const char *const names[] = {"error", "warn", "info", "debug"};
  fprintf(stderr, "cgtree %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}

void tree__log(cgt_tree *t, int level, const char *fmt, ...) {
  if (level > t->log_level)
    return;
  char msg[TREE_ERROR_BYTES];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tree_emit(t, level, msg);
}

cgt_status tree__fail(cgt_tree *t, cgt_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->error, sizeof t->error, fmt, ap);
  va_end(ap);
  tree_emit(t, CGT_LOG_DEBUG, t->error);
  return s;
}

cgt_status tree__backend_fail(cgt_tree *t, cgt_status s, const char *what) {
  return tree__fail(t, s, "%s: %s", what, t->dev.error[0] ? t->dev.error : cgt_status_string(s));
}

/* Every host allocation of the tree goes through these (pools count their
 * own), so that host_allocs counts it and the test hook can fail it. */
static int host_alloc_fails(cgt_tree *t) {
  t->stats.host_allocs++;
  return pool_fail_hook_fires(&t->host_fail);
}

void *tree__malloc(cgt_tree *t, size_t bytes) { return host_alloc_fails(t) ? NULL : malloc(bytes); }

void *tree__calloc(cgt_tree *t, size_t n, size_t bytes) { return host_alloc_fails(t) ? NULL : calloc(n, bytes); }

void *tree__hash_malloc(cgt_tree *t, size_t bytes) { return tree__malloc(t, bytes); }

void cgt__fail_host_alloc_after(cgt_tree *t, long long n, int once) {
  if (!t)
    return;
  t->host_fail.after = n < 0 ? -1 : n;
  t->host_fail.once = once;
  t->host_fail.fired = 0;
}

long long cgt__host_alloc_failures(const cgt_tree *t) { return t ? t->host_fail.fired : 0; }

void cgt__leftovers_to(cgt_tree *t, char *out, size_t cap) {
  if (!t)
    return;
  t->leftovers_out = cap ? out : NULL;
  t->leftovers_cap = cap;
}

char *tree__strdup(cgt_tree *t, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = tree__malloc(t, n);
  if (d)
    memcpy(d, s, n);
  return d;
}

/* A text the tree keeps until it is destroyed. The texts are few (why a
 * node runs eagerly: a capture's failure, the rerecord limit), so a list
 * searched from the start serves; each text is kept once, so a program that
 * turns nodes EAGER and prunes them for days keeps no more than its texts. */
typedef struct interned_text {
  struct interned_text *next;
  char text[];
} interned_text;

const char *tree__intern(cgt_tree *t, const char *s) {
  for (interned_text *e = t->reasons; e; e = e->next)
    if (strcmp(e->text, s) == 0)
      return e->text;
  size_t n = strlen(s) + 1;
  interned_text *e = tree__malloc(t, sizeof *e + n);
  if (!e)
    return NULL;
  memcpy(e->text, s, n);
  e->next = t->reasons;
  t->reasons = e;
  return e->text;
}

static void *tree_realloc(void *owner, void *ptr, size_t bytes) {
  return host_alloc_fails(owner) ? NULL : realloc(ptr, bytes);
}

/* The tree's arrays (grow.h); capacities are 32-bit. */
int tree__grow_slow(cgt_tree *t, void **array, uint32_t *cap, uint32_t need, size_t elem_bytes) {
  size_t c = *cap;
  if (!cgt_grow(array, &c, need, UINT32_MAX, elem_bytes, 0, tree_realloc, t))
    return 0;
  *cap = (uint32_t)c;
  return 1;
}

int tree__grow_zeroed(cgt_tree *t, void **array, uint32_t *cap, uint32_t need, size_t elem_bytes) {
  size_t c = *cap;
  if (!cgt_grow(array, &c, need, UINT32_MAX, elem_bytes, 1, tree_realloc, t))
    return 0;
  *cap = (uint32_t)c;
  return 1;
}

/* ---------------------------------------------------------------- devices */

int tree__device_enter(cgt_tree *t) { return t->dev.ops->device_enter ? t->dev.ops->device_enter(&t->dev) : -1; }

void tree__device_leave(cgt_tree *t, int saved) {
  if (saved >= 0 && t->dev.ops->device_leave)
    t->dev.ops->device_leave(&t->dev, saved);
}

/* ------------------------------------------------------------------ pools */

/* Every pool of the tree (graph pool, side pool, the private pools of
 * SEPARATE mode) takes its chunks here, so this is the one place that keeps
 * pool_limit_bytes, and the tree knows all the device memory it holds
 * (t->chunks, sorted by address), so it can refuse caller arguments that
 * point into it. A chunk that would pass the limit is refused exactly as a
 * full device refuses it, and the pool then fails the allocation with
 * CGT_ERR_OUT_OF_MEMORY, changing nothing. The chunk table grows before the
 * device allocation, so a failure leaves both unchanged. A chunk the device
 * refuses is asked for once more if the caller's reclaim function (the one
 * place every pool's growth passes) says it gave memory back: another
 * allocator in the process may cache what the tree needs. */
static cgt_status pool_chunk_alloc(void *ctx, size_t bytes, void **ptr) {
  cgt_tree *t = ctx;
  size_t limit = t->opt.pool_limit_bytes;
  if (limit && (bytes > limit || t->pool_held_bytes > limit - bytes)) {
    snprintf(t->dev.error, sizeof t->dev.error,
             "pool_limit_bytes: a chunk of %zu bytes would take the tree's pools from %zu to more than %zu bytes",
             bytes, t->pool_held_bytes, limit);
    return CGT_ERR_OUT_OF_MEMORY;
  }
  if (!tree__grow(t, (void **)&t->chunks, &t->chunks_cap, t->n_chunks + 1, sizeof *t->chunks)) {
    snprintf(t->dev.error, sizeof t->dev.error, "no host memory for the table of pool chunks");
    return CGT_ERR_OUT_OF_MEMORY;
  }
  cgt_status st = t->dev.ops->mem_alloc(&t->dev, bytes, ptr);
  if (st == CGT_ERR_OUT_OF_MEMORY && t->reclaim && t->reclaim(t->reclaim_user, bytes))
    st = t->dev.ops->mem_alloc(&t->dev, bytes, ptr);
  if (st != CGT_OK)
    return st;
  t->pool_held_bytes += bytes;
  uintptr_t base = (uintptr_t)*ptr;
  uint32_t i = t->n_chunks;
  while (i > 0 && t->chunks[i - 1].base > base) {
    t->chunks[i] = t->chunks[i - 1];
    i--;
  }
  t->chunks[i].base = base;
  t->chunks[i].end = base + bytes;
  t->n_chunks++;
  return CGT_OK;
}

/* The first chunk whose end lies above p (chunks are disjoint, so their
 * ends are sorted too), or n_chunks. */
static uint32_t chunk_above(const cgt_tree *t, uintptr_t p) {
  uint32_t lo = 0, hi = t->n_chunks;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (t->chunks[mid].end <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void pool_chunk_free(void *ctx, void *ptr, size_t bytes) {
  cgt_tree *t = ctx;
  uint32_t i = chunk_above(t, (uintptr_t)ptr);
  if (!NEVER(i >= t->n_chunks || t->chunks[i].base != (uintptr_t)ptr)) {
    memmove(&t->chunks[i], &t->chunks[i + 1], (t->n_chunks - i - 1) * sizeof *t->chunks);
    t->n_chunks--;
  }
  t->dev.ops->mem_free(&t->dev, ptr);
  t->pool_held_bytes -= bytes;
}

/* 1 if [p, p + bytes) overlaps device memory of any pool of the tree (graph
 * pool, side pool, private pools, placeholders): O(log chunks), no
 * allocation, so it runs on every replay. */
int tree__overlaps_pools(const cgt_tree *t, const void *p, size_t bytes) {
  uint32_t i = chunk_above(t, (uintptr_t)p);
  return i < t->n_chunks && t->chunks[i].base < (uintptr_t)p + bytes;
}

cgt_status tree__pool_create(cgt_tree *t, pool **out) {
  pool_source src = {pool_chunk_alloc, pool_chunk_free, t};
  /* The pool's own record is a host allocation like any other (the pool
   * counts it in its host_allocs). */
  if (pool_fail_hook_fires(&t->host_fail))
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for a pool");
  cgt_status st = pool_create(&src, t->opt.pool_chunk_bytes, out);
  if (st != CGT_OK)
    return tree__fail(t, st, "creating a pool: %s", cgt_status_string(st));
  pool__share_fail_hook(*out, &t->host_fail);
  return CGT_OK;
}

/* ------------------------------------------------------- create / destroy */

void cgt_options_init(cgt_options *o) {
  if (!o)
    return;
  memset(o, 0, sizeof *o);
  o->backend = CGT_BACKEND_AUTO;
  o->mode = CGT_MODE_TREE;
  o->warmup_runs = 1;
  o->rerecord_limit = 32;
  o->pool_chunk_bytes = (size_t)2 << 20;
  o->prune_after_steps = 256;
}

int cgt_cuda_available(void) { return backend_cuda_available(); }

static int env_log_level(cgt_tree *t, int fallback) {
  const char *e = getenv("CGT_LOG");
  if (!e || !*e)
    return fallback;
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (!strcasecmp(e, names[i]))
      return i;
  t->log_level = fallback; /* so that the warning itself is filtered as usual */
  tree__log(t, CGT_LOG_WARN, "CGT_LOG=%s is not error, warn, info or debug; ignored", e);
  return fallback;
}

/* CGT_MODE overrides the options' mode: a kill switch for users. */
static cgt_mode env_mode(cgt_tree *t, cgt_mode fallback) {
  const char *e = getenv("CGT_MODE");
  if (!e || !*e)
    return fallback;
  if (!strcasecmp(e, "tree"))
    return CGT_MODE_TREE;
  if (!strcasecmp(e, "eager"))
    return CGT_MODE_EAGER;
  if (!strcasecmp(e, "separate"))
    return CGT_MODE_SEPARATE;
  tree__log(t, CGT_LOG_WARN, "CGT_MODE=%s is not tree, eager or separate; ignored", e);
  return fallback;
}

static const backend_ops *choose_backend(cgt_backend want) {
  if (want == CGT_BACKEND_AUTO)
    want = backend_cuda_available() ? CGT_BACKEND_CUDA : CGT_BACKEND_SIM;
  if (want == CGT_BACKEND_SIM)
    return &backend_sim_ops;
#ifdef CGT_HAVE_CUDA
  if (want == CGT_BACKEND_CUDA && backend_cuda_available())
    return &backend_cuda_ops;
#endif
  return NULL;
}

cgt_status cgt_tree_create(const cgt_options *o, cgt_tree **out) {
  if (!out)
    return CGT_ERR_INVALID_ARGUMENT;
  *out = NULL;
  cgt_options defaults;
  cgt_options_init(&defaults);
  if (!o)
    o = &defaults;
  if ((unsigned)o->backend > CGT_BACKEND_SIM || (unsigned)o->mode > CGT_MODE_SEPARATE)
    return CGT_ERR_INVALID_ARGUMENT;
  /* A budget that can hold no graph, or more graphs than ids could name, is
   * a mistake, not a wish. */
  if (o->max_graphs > CGT_MAX_GRAPHS_LIMIT || (o->max_graph_bytes && o->max_graph_bytes < CGT_MIN_GRAPH_BYTES) ||
      o->no_update_in_place > 1)
    return CGT_ERR_INVALID_ARGUMENT;

  cgt_tree *t = calloc(1, sizeof *t);
  if (!t)
    return CGT_ERR_OUT_OF_MEMORY;
  /* Zero means default (what `= {0}` or a foreign binding gives), except
   * warmup_runs, where 0 means "record at once". */
  t->opt = *o;
  if (t->opt.pool_chunk_bytes == 0)
    t->opt.pool_chunk_bytes = defaults.pool_chunk_bytes;
  if (t->opt.rerecord_limit == 0)
    t->opt.rerecord_limit = defaults.rerecord_limit;
  if (t->opt.prune_after_steps == 0)
    t->opt.prune_after_steps = defaults.prune_after_steps;
  t->host_fail.after = -1;
  t->next_id = 1;
  t->tag = value__new_tag();
  t->log_level = env_log_level(t, o->log_fn ? CGT_LOG_INFO : CGT_LOG_WARN);
  t->opt.mode = env_mode(t, o->mode);
  t->root.id = 0;
  t->root.path_hash = PATH_HASH_START;
  t->free_slot = VALUE_NONE;
  node__begin_step(t); /* the pools do not exist yet: nothing to clear */
  t->path_hash = PATH_HASH_START;
  const char *dot_dir = getenv("CGT_GRAPH_DOT_DIR");
  if (dot_dir && *dot_dir)
    t->graph_dot_dir = tree__strdup(t, dot_dir);

  const backend_ops *ops = choose_backend(o->backend);
  if (!ops) {
    tree__log(t, CGT_LOG_ERROR, "the CUDA backend was asked for, but no usable GPU or driver is present");
    free(t->graph_dot_dir);
    free(t);
    return CGT_ERR_NO_DEVICE;
  }
  t->dev.ops = ops;
  fuse__init(t);
  cgt_status st = ops->open(&t->dev, o->device, o->stream);
  if (st != CGT_OK) {
    tree__log(t, CGT_LOG_ERROR, "opening the %s backend: %s", ops->name, t->dev.error);
    free(t->graph_dot_dir);
    free(t);
    return st;
  }
  st = tree__pool_create(t, &t->pool);
  if (st == CGT_OK)
    st = tree__pool_create(t, &t->side_pool);
  if (st == CGT_OK && o->pool_reserve_bytes) {
    int saved = tree__device_enter(t);
    st = pool_reserve(t->pool, o->pool_reserve_bytes);
    tree__device_leave(t, saved);
  }
  if (st != CGT_OK) {
    tree__log(t, CGT_LOG_ERROR, "creating the pools: %s", cgt_status_string(st));
    cgt_tree_destroy(t);
    return st;
  }
  tree__log(t, CGT_LOG_INFO, "tree created: backend %s, mode %s", ops->name,
            t->opt.mode == CGT_MODE_TREE    ? "tree"
            : t->opt.mode == CGT_MODE_EAGER ? "eager"
                                            : "separate");
  *out = t;
  return CGT_OK;
}

void cgt_tree_destroy(cgt_tree *t) {
  if (!t)
    return;
  /* Graphs, chunks and the stream are freed on the tree's device. */
  int saved = t->dev.ops ? tree__device_enter(t) : -1;
  if (t->dev.ops) {
    (void)fuse__flush(t);
    t->dev.ops->sync(&t->dev);
    fuse__destroy(t);
  }
  /* The roots' hash table lives in the first root node: clear it first. */
  HASH_CLEAR(hh, t->root.children);
  for (uint32_t i = 0; i < t->n_nodes; i++)
    node__destroy(t, t->nodes[i]);
  warm_count *w, *tmp;
  HASH_ITER(hh, t->warm, w, tmp) {
    HASH_DEL(t->warm, w);
    free(w);
  }
  for (uint32_t i = 0; i < t->n_segments; i++)
    free(t->segments[i].name);
  pool_destroy(t->pool);
  pool_destroy(t->side_pool);
  if (t->dev.ops) {
    t->dev.ops->close(&t->dev);
    if (t->leftovers_out && t->dev.ops->kind == CGT_BACKEND_SIM) /* its close names what it had to free, else "" */
      snprintf(t->leftovers_out, t->leftovers_cap, "%s", t->dev.error);
    tree__device_leave(t, saved);
  }
  launch__destroy(t);
  free(t->segments);
  free(t->nodes);
  free(t->slots);
  free(t->step_values);
  free(t->values_live);
  free(t->values_pooled);
  free(t->live_blocks);
  free(t->dead_scratch);
  free(t->chunks);
  free(t->key_buf);
  free(t->args);
  free(t->graph_dot_dir);
  while (t->reasons) {
    interned_text *next = t->reasons->next;
    free(t->reasons);
    t->reasons = next;
  }
  free(t);
}

cgt_backend cgt_tree_backend(const cgt_tree *t) { return t ? t->dev.ops->kind : CGT_BACKEND_AUTO; }
cgt_mode cgt_tree_mode(const cgt_tree *t) { return t ? t->opt.mode : CGT_MODE_TREE; }
void *cgt_tree_stream(const cgt_tree *t) { return t ? t->dev.stream : NULL; }
const char *cgt_tree_last_error(const cgt_tree *t) { return t ? t->error : "no tree"; }

cgt_status cgt_sync(cgt_tree *t) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_sync: not allowed inside a launch function");
  int saved = tree__device_enter(t);
  cgt_status st = fuse__flush(t); /* a failing flush writes its own message */
  if (st == CGT_OK) {
    st = t->dev.ops->sync(&t->dev);
    if (st != CGT_OK)
      st = tree__backend_fail(t, st, "cgt_sync");
  }
  tree__device_leave(t, saved);
  return st;
}

/* In debug builds (buildtype=debug defines CGT_DEBUG_CHECKS) every state
 * change is followed by the full invariant walk, and a broken invariant
 * aborts on the spot. Other builds leave it to cgt_tree_check. */
static void tree_debug_check(cgt_tree *t) {
#ifdef CGT_DEBUG_CHECKS
  if (tree__check(t) != CGT_OK) {
    fprintf(stderr, "cgtree: invariant broken: %s\n", t->error);
    abort();
  }
#else
  (void)t;
#endif
}

/* --------------------------------------------------------------- segments */

cgt_status cgt_segment_register(cgt_tree *t, const cgt_segment_desc *d, cgt_segment *out) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!d || !out || !d->launch)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT,
                      "cgt_segment_register: descriptor, launch function and out are required");
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_segment_register: not allowed inside a launch function");
  if (d->n_inputs > (1u << 20) || d->n_outputs > (1u << 20))
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_segment_register: %u inputs and %u outputs is too many",
                      d->n_inputs, d->n_outputs);
  if (d->flags & ~CGT_SEGMENT_NO_CAPTURE)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_segment_register: unknown flag bits 0x%x",
                      (unsigned)(d->flags & ~CGT_SEGMENT_NO_CAPTURE));
  char *name = tree__strdup(t, d->name ? d->name : "segment");
  if (!name || !tree__grow(t, (void **)&t->segments, &t->segments_cap, t->n_segments + 1, sizeof *t->segments)) {
    free(name);
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "cgt_segment_register: no host memory");
  }
  segment_rec *s = &t->segments[t->n_segments++];
  s->name = name;
  s->launch = d->launch;
  s->user = d->user;
  s->n_inputs = d->n_inputs;
  s->n_outputs = d->n_outputs;
  s->flags = d->flags;
  s->prelaunch = NULL;
  s->prelaunch_user = NULL;
  *out = t->n_segments;
  return CGT_OK;
}

cgt_status cgt_segment_set_prelaunch(cgt_tree *t, cgt_segment seg, cgt_prelaunch_fn fn, void *user) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_segment_set_prelaunch: not allowed inside a launch function");
  if (seg == 0 || seg > t->n_segments)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_segment_set_prelaunch: unknown segment %u", seg);
  segment_rec *s = &t->segments[seg - 1];
  s->prelaunch = fn;
  s->prelaunch_user = fn ? user : NULL;
  return CGT_OK;
}

cgt_status cgt_tree_set_reclaim(cgt_tree *t, cgt_reclaim_fn fn, void *user) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_tree_set_reclaim: not allowed inside a launch function");
  t->reclaim = fn;
  t->reclaim_user = fn ? user : NULL;
  return CGT_OK;
}

/* ------------------------------------------------------------------- runs */

cgt_status cgt_step_begin(cgt_tree *t) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_step_begin: not allowed inside a launch function");
  cgt_status st = fuse__flush(t);
  if (st != CGT_OK)
    return st;
  value__end_step(t);
  node__begin_step(t);
  t->step++;
  node__prune(t);
  t->path_hash = PATH_HASH_START;
  tree_debug_check(t);
  return CGT_OK;
}

cgt_status cgt_tree_path_hash(const cgt_tree *t, uint64_t *out) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!out)
    return tree__fail((cgt_tree *)(uintptr_t)t, CGT_ERR_INVALID_ARGUMENT, "cgt_tree_path_hash: out is NULL");
  *out = t->path_hash;
  return CGT_OK;
}

static int range_overflows(const void *p, size_t bytes) { return (uintptr_t)p > UINTPTR_MAX - bytes; }

/* Resolves args into t->args; changes nothing but the stale counter. */
static cgt_status resolve_args(cgt_tree *t, const cgt_arg *args, uint32_t n_args) {
  for (uint32_t i = 0; i < n_args; i++) {
    const cgt_arg *a = &args[i];
    run_arg *r = &t->args[i];
    r->kind = a->kind;
    switch (a->kind) {
    case CGT_ARG_VALUE: {
      value_slot *s;
      cgt_status st = value__resolve(t, a->value, &s);
      if (st != CGT_OK) {
        char why[TREE_ERROR_BYTES];
        memcpy(why, t->error, sizeof why);
        return tree__fail(t, st, "cgt_run argument %u: %s", i, why);
      }
      r->mem = s->mem;
      r->keyed = s->in_graph_pool;
      r->slot = value__slot_of(a->value);
      break;
    }
    case CGT_ARG_STATIC:
    case CGT_ARG_DYNAMIC:
      if (!a->ptr || a->bytes == 0 || range_overflows(a->ptr, a->bytes))
        return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "argument %u: %s memory needs a pointer and 0 < bytes that fit",
                          i, a->kind == CGT_ARG_STATIC ? "STATIC" : "DYNAMIC");
      if (tree__overlaps_pools(t, a->ptr, a->bytes))
        return tree__fail(t, CGT_ERR_INVALID_ARGUMENT,
                          "argument %u: %s memory %p (%zu bytes) lies in the tree's own pool memory (a value's "
                          "memory, say); only caller-owned memory may be passed so: pass the value itself "
                          "(cgt_arg_value) instead",
                          i, a->kind == CGT_ARG_STATIC ? "STATIC" : "DYNAMIC", a->ptr, a->bytes);
      r->mem.ptr = (void *)(uintptr_t)a->ptr;
      r->mem.bytes = a->bytes;
      r->slot = VALUE_NONE;
      r->mem.block = NULL;
      r->mem.pool = NULL;
      r->keyed = a->kind == CGT_ARG_STATIC;
      break;
    default:
      return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "argument %u: unknown kind %d", i, (int)a->kind);
    }
  }
  return CGT_OK;
}

cgt_status cgt_run(cgt_tree *t, cgt_segment seg, uint64_t variant, const cgt_arg *args, uint32_t n_args,
                   cgt_value *outputs, uint32_t n_outputs) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_run: not allowed inside a launch function");
  if (seg == 0 || seg > t->n_segments)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_run: unknown segment %u", seg);
  const segment_rec *s = &t->segments[seg - 1];
  if (n_args != s->n_inputs || (n_args && !args))
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_run: segment '%s' takes %u arguments, got %u%s", s->name,
                      s->n_inputs, n_args, n_args && !args ? " and NULL" : "");
  if (n_outputs != s->n_outputs || (n_outputs && !outputs))
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_run: segment '%s' makes %u outputs, room for %u%s", s->name,
                      s->n_outputs, n_outputs, n_outputs && !outputs ? " at NULL" : "");
  uint32_t key_words = 2 + 3 * n_args;
  if (!tree__grow(t, (void **)&t->args, &t->args_cap, n_args ? n_args : 1, sizeof *t->args) ||
      !tree__grow(t, (void **)&t->key_buf, &t->key_cap, key_words, sizeof *t->key_buf))
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "cgt_run: no host memory for %u arguments", n_args);
  t->n_run_args = n_args;
  cgt_status st = resolve_args(t, args, n_args);
  if (st == CGT_OK)
    st = value__reserve(t, n_outputs);
  if (st == CGT_OK)
    st = node__run(t, seg, s, variant, outputs); /* it enters the device itself, when it needs it */
  if (st == CGT_OK) {
    t->stats.runs++;
    /* A node's path hash was computed when it was made, so a run through
     * the tree (TREE, SEPARATE) only reads it; CGT_MODE_EAGER has no nodes
     * and mixes the run in. */
    t->path_hash = t->opt.mode == CGT_MODE_EAGER ? tree__path_hash_next(t->path_hash, seg, variant) : t->cur->path_hash;
  }
  tree_debug_check(t);
  return st;
}

/* ------------------------------------------------------------- simulator */

cgt_status cgt_sim_set_device_limit(cgt_tree *t, size_t limit_bytes) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->dev.ops != &backend_sim_ops)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_sim_set_device_limit: the tree does not run on the simulator");
  backend_sim_set_limit(&t->dev, limit_bytes);
  return CGT_OK;
}

/* -------------------------------------------------------------- flushing */

cgt_status cgt_flush(cgt_tree *t) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_flush: not allowed inside a launch function");
  cgt_status st = fuse__flush(t); /* nothing is ever held back while defer_launch is 0 */
  tree_debug_check(t);
  return st;
}
