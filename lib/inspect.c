/* inspect.c — what the tree shows of itself: statistics, node lists, a
 * Graphviz drawing, and the invariant checker.
 *
 * tree__check() walks every structure and checks what the rest of the code
 * relies on: the links between nodes and their parents' hash tables, the
 * keys, the node states, the value slots and the step values, every pool,
 * and — while the graph pool mirrors the live values — that the pool's allocated blocks
 * are exactly the blocks of the live values, none overlapping another. Tests
 * call it after every operation; debug builds call it at every state change.
 */
#include <errno.h>
#include <string.h>

#include "tree_internal.h"

/* A query's refusal. The queries take the tree as const: they change
 * nothing the tree shows. A refusal still leaves its detail where every
 * call's does (cgt_tree_last_error), so the error text is the one thing a
 * query may write; the tree itself was allocated writable. */
#define REFUSE(t, s, ...) tree__fail((cgt_tree *)(t), (s), __VA_ARGS__)

static void add_pool(const pool *p, size_t *reserved, size_t *allocated, size_t *peak, uint64_t *host_allocs) {
  if (!p)
    return;
  pool_stats s;
  pool_get_stats(p, &s);
  *reserved += s.reserved_bytes;
  *allocated += s.allocated_bytes;
  *peak += s.peak_bytes;
  *host_allocs += s.host_allocs;
}

cgt_status cgt_tree_stats(const cgt_tree *t, cgt_stats *out) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!out)
    return REFUSE(t, CGT_ERR_INVALID_ARGUMENT, "cgt_tree_stats: out is NULL");
  *out = t->stats;
  out->pool_reserved_bytes = out->pool_allocated_bytes = out->pool_peak_bytes = 0;
  size_t side_reserved = 0, side_allocated = 0;
  out->side_pool_peak_bytes = 0;
  if (t->opt.mode == CGT_MODE_SEPARATE) {
    /* Each node's private pool is its own memory: the baseline's cost. */
    for (uint32_t i = 0; i < t->n_nodes; i++)
      add_pool(t->nodes[i]->own_pool, &out->pool_reserved_bytes, &out->pool_allocated_bytes, &out->pool_peak_bytes,
               &out->host_allocs);
  }
  /* The graph pool is unused in SEPARATE mode, so adding it changes nothing
   * there but its (empty) host allocations. */
  add_pool(t->pool, &out->pool_reserved_bytes, &out->pool_allocated_bytes, &out->pool_peak_bytes, &out->host_allocs);
  add_pool(t->side_pool, &side_reserved, &side_allocated, &out->side_pool_peak_bytes, &out->host_allocs);
  out->pool_peak_bytes += t->retired_pool_peak_bytes; /* private pools destroyed so far */
  out->host_allocs += t->retired_host_allocs;
  evict__totals(t, &out->graphs, &out->graph_bytes);
  return CGT_OK;
}

static void node_info(const cgt_tree *t, const node *n, cgt_node_info *info) {
  memset(info, 0, sizeof *info);
  info->id = n->id;
  info->parent = n->parent ? n->parent->id : 0;
  info->depth = n->depth;
  info->segment = n->segment;
  info->variant = n->variant;
  info->state = node__public_state(n);
  info->replays = n->replays;
  info->eager_runs = n->eager_runs;
  info->pool_bytes_live = n->ckpt_bytes;
  info->reason = n->reason;
  info->segment_name = t->segments[n->segment - 1].name;
  info->fused_runs = n->fused_runs;
  info->evictions = n->evictions;
  info->evict_reason = n->evict_reason;
  info->updates = n->updates;
}

cgt_status cgt_tree_nodes(const cgt_tree *t, cgt_node_info *out, size_t cap, size_t *count) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!count || (cap && !out))
    return REFUSE(t, CGT_ERR_INVALID_ARGUMENT, "cgt_tree_nodes: %s",
                  !count ? "count is NULL" : "out is NULL with a cap above 0");
  for (size_t i = 0; i < cap && i < t->n_nodes; i++)
    node_info(t, t->nodes[i], &out[i]);
  *count = t->n_nodes;
  return CGT_OK;
}

static void dot_escaped(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fputc('\\', f);
    fputc(*s, f);
  }
}

cgt_status cgt_tree_write_dot(const cgt_tree *t, FILE *f) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!f)
    return REFUSE(t, CGT_ERR_INVALID_ARGUMENT, "cgt_tree_write_dot: f is NULL");
  errno = 0;
  fprintf(f, "digraph cgtree {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n");
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    const node *n = t->nodes[i];
    static const char *const style[] = {"style=dashed", "style=solid", "style=\"dashed,bold\", color=red"};
    fprintf(f, "  n%u [label=\"#%u ", n->id, n->id);
    dot_escaped(f, t->segments[n->segment - 1].name);
    fprintf(f, "\\nvariant %llu\\n%s\\nreplays %llu, eager %llu", (unsigned long long)n->variant,
            cgt_node_state_name(node__public_state(n)), (unsigned long long)n->replays,
            (unsigned long long)n->eager_runs);
    if (n->reason) {
      fprintf(f, "\\n");
      dot_escaped(f, n->reason);
    }
    if (n->fused_runs)
      fprintf(f, "\\nfused runs %llu", (unsigned long long)n->fused_runs);
    if (n->evictions || n->updates)
      fprintf(f, "\\nevicted %llu, updated in place %llu", (unsigned long long)n->evictions,
              (unsigned long long)n->updates);
    fprintf(f, "\", %s];\n", style[node__public_state(n)]);
    if (n->parent && n->parent->id)
      fprintf(f, "  n%u -> n%u;\n", n->parent->id, n->id);
  }
  /* Fused spans (defer_launch): a blue edge from a span's first node to its
   * last, which holds the fused executable. */
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    uint32_t first, length;
    uint64_t launches;
    for (uint32_t k = 0; fuse__span_at(t->nodes[i], k, &first, &length, &launches); k++)
      fprintf(
          f,
          "  n%u -> n%u [style=dashed, color=blue, constraint=false, label=\"fused span: %u nodes, %llu launches\"];\n",
          first, t->nodes[i]->id, length, (unsigned long long)launches);
  }
  fprintf(f, "}\n");
  /* Flushed, so that a write the device refuses (a full disk) is seen here,
   * not at the caller's fclose; f stays open. */
  if (fflush(f) == 0 && !ferror(f))
    return CGT_OK;
  return REFUSE(t, CGT_ERR_BACKEND, "cgt_tree_write_dot: writing to f failed (%s)",
                errno ? strerror(errno) : "the stream's error flag is set");
}

/* ---------------------------------------------------------------- checks */

#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond))                                        \
      return tree__fail(t, CGT_ERR_STATE, __VA_ARGS__); \
  } while (0)

/* The head of n's key group under its parent. */
static const node *first_of_group(const node *n) {
  const node *first;
  HASH_FIND(hh, n->parent->children, n->key, n->key_bytes, first);
  return first;
}

static cgt_status check_nodes(cgt_tree *t) {
  CHECK(t->root.id == 0 && !t->root.parent, "the virtual root has an id or a parent");
  CHECK(t->root.path_hash == PATH_HASH_START, "the virtual root's path hash is not the one of an empty step");
  CHECK(t->opt.mode == CGT_MODE_EAGER || t->path_hash == t->cur->path_hash,
        "the path hash is not the one of the path's last node");
  CHECK(t->n_nodes == t->stats.nodes, "%u nodes but stats.nodes = %llu", t->n_nodes,
        (unsigned long long)t->stats.nodes);
  uint32_t reachable = 0;
  for (uint32_t i = 0; i <= t->n_nodes; i++) {
    const node *p = i ? t->nodes[i - 1] : &t->root;
    CHECK(!i || p->parent == &t->root || (p->parent->id && p->parent->id < p->id), "node %u's parent does not exist",
          p->id);
    for (const node *first = p->children; first; first = (const node *)first->hh.next)
      for (const node *c = first; c; c = c->next_same_key) {
        reachable++;
        CHECK(c->parent == p, "node %u hangs under %u but names %u as parent", c->id, p->id,
              c->parent ? c->parent->id : 0);
        CHECK(c->key_bytes == first->key_bytes && !memcmp(c->key, first->key, c->key_bytes),
              "node %u shares a key group with %u but not its key", c->id, first->id);
      }
  }
  CHECK(reachable == t->n_nodes, "%u nodes reachable from the root, %u exist", reachable, t->n_nodes);
  char why[160];
  CHECK(evict__check(t, why, sizeof why), "%s", why);
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    const node *n = t->nodes[i];
    CHECK(n->id >= 1 && n->id < t->next_id && (i == 0 || t->nodes[i - 1]->id < n->id),
          "node at index %u has id %u: ids must rise and stay below %u", i, n->id, t->next_id);
    CHECK(!n->pruned, "node %u is marked for pruning outside a prune", n->id);
    CHECK(n->state != NODE_WARMUP || !n->next_same_key, "WARMUP node %u is not the last of its key group", n->id);
    CHECK(t->opt.mode != CGT_MODE_TREE || n->parent == &t->root || n->parent->state != NODE_WARMUP ||
              n->state != NODE_RECORDED,
          "RECORDED node %u hangs below WARMUP node %u", n->id, n->parent->id);
    CHECK(n->last_step <= t->step, "node %u ran in step %llu, a step not begun yet", n->id,
          (unsigned long long)n->last_step);
    for (uint32_t d = 0; d < n->n_dead; d++)
      CHECK(n->dead[d] < n->values_before && (d == 0 || n->dead[d - 1] < n->dead[d]),
            "node %u's liveness list is out of order or past its step values", n->id);
    CHECK(n->parent == &t->root || (n->parent && n->parent->id < n->id), "node %u is older than its parent", n->id);
    CHECK(n->depth == (n->parent == &t->root ? 0 : n->parent->depth + 1), "node %u has depth %u", n->id, n->depth);
    CHECK(n->path_hash == tree__path_hash_next(n->parent->path_hash, n->segment, n->variant),
          "node %u's path hash is not its parent's with its segment and variant", n->id);
    CHECK(n->segment >= 1 && n->segment <= t->n_segments, "node %u has unknown segment %u", n->id, n->segment);
    const segment_rec *s = &t->segments[n->segment - 1];
    CHECK(n->key_bytes == (2 + 3 * (size_t)s->n_inputs) * 8 &&
              n->key[0] == ((uint64_t)n->segment | (uint64_t)s->n_inputs << 32) && n->key[1] == n->variant,
          "node %u's key does not match its segment and variant", n->id);
    CHECK(!(s->flags & CGT_SEGMENT_NO_CAPTURE) ||
              (n->state == NODE_OVERFLOW && n->reason && !strcmp(n->reason, "declared uncapturable")),
          "node %u of a segment declared uncapturable is not OVERFLOW for that reason", n->id);
    CHECK(n->state != NODE_OVERFLOW || (!n->next_same_key && n == first_of_group(n)),
          "OVERFLOW node %u is not alone in its key group", n->id);
    switch (n->state) {
    case NODE_WARMUP:
      CHECK(!n->exec && !n->graph && !n->ckpt, "WARMUP node %u holds a recording", n->id);
      break;
    case NODE_RECORDED:
      CHECK(n->exec && n->graph, "RECORDED node %u has no graph", n->id);
      CHECK(t->opt.mode != CGT_MODE_TREE || n->ckpt, "RECORDED node %u has no checkpoint", n->id);
      CHECK(n->n_outputs == s->n_outputs, "RECORDED node %u has %u outputs, its segment %u", n->id, n->n_outputs,
            s->n_outputs);
      break;
    case NODE_EAGER:
    case NODE_OVERFLOW:
      CHECK(!n->exec && !n->graph && n->reason, "EAGER or OVERFLOW node %u has a graph or no reason", n->id);
      break;
    default:
      CHECK(0, "node %u has state %d", n->id, (int)n->state);
    }
  }
  return CGT_OK;
}

static int path_bit(const cgt_tree *t, uint32_t p) { return (int)(t->values_live[p / 64] >> (p % 64) & 1); }

typedef struct block_owner {
  const void *block;
  uint32_t owner;
} block_owner;

static int compare_block_owner(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const block_owner *)a)->block, y = (uintptr_t)((const block_owner *)b)->block;
  return (x > y) - (x < y);
}

static cgt_status check_values(cgt_tree *t) {
  uint32_t live = 0, free_count = 0;
  for (uint32_t p = 0; p < t->n_step_values; p++) {
    if (!path_bit(t, p))
      continue;
    CHECK(t->step_values[p] < t->n_slots, "position %u names slot %u of %u", p, t->step_values[p], t->n_slots);
    const value_slot *s = &t->slots[t->step_values[p]];
    CHECK(s->live && s->value_pos == p, "position %u is live but its slot is not (or points elsewhere)", p);
    CHECK(s->in_graph_pool == value__mem_in_graph_pool(t, &s->mem),
          "the value at position %u says it is%s in the graph pool, but it is%s", p, s->in_graph_pool ? "" : " not",
          s->in_graph_pool ? " not" : "");
    live++;
  }
  for (uint32_t i = t->free_slot; i != VALUE_NONE; i = t->slots[i].next_free) {
    CHECK(i < t->n_slots && !t->slots[i].live, "free list holds slot %u, which is live or out of range", i);
    CHECK(++free_count <= t->n_slots, "the free list of value slots loops");
  }
  CHECK(free_count == t->n_free_slots, "the free list holds %u slots, the tree counts %u", free_count,
        t->n_free_slots);
  uint32_t live_slots = 0, retired = 0, held = 0;
  for (uint32_t i = 0; i < t->n_slots; i++) {
    const value_slot *s = &t->slots[i];
    live_slots += s->live;
    retired += !s->live && s->gen == 0;
    held += !s->live && s->gen != 0 && s->refs > 0;
  }
  CHECK(live_slots == live && live == t->n_live, "%u live slots, %u live positions, n_live %u", live_slots, live,
        t->n_live);
  CHECK(live + free_count + retired + held == t->n_slots, "%u live + %u free + %u retired + %u held slots != %u", live,
        free_count, retired, held, t->n_slots);
  /* Block counts: every live value in a block names an owner in the same
   * block, the owner counts exactly those values, and one block has one
   * owner. */
  uint32_t *count = calloc(t->n_slots ? t->n_slots : 1, sizeof *count);
  block_owner *pairs = calloc(t->n_step_values ? t->n_step_values : 1, sizeof *pairs);
  uint32_t n_pairs = 0;
  cgt_status st = count && pairs ? CGT_OK : tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory to check the tree");
  for (uint32_t p = 0; p < t->n_step_values && st == CGT_OK; p++) {
    const value_slot *s = &t->slots[t->step_values[p]];
    if (!path_bit(t, p))
      continue;
    if (!s->mem.block) {
      if (s->owner != VALUE_NONE)
        st = tree__fail(t, CGT_ERR_STATE, "live value at position %u lies in no block but has an owner", p);
      continue;
    }
    if (s->owner >= t->n_slots || t->slots[s->owner].mem.block != s->mem.block ||
        t->slots[s->owner].mem.pool != s->mem.pool)
      st = tree__fail(t, CGT_ERR_STATE, "live value at position %u names an owner outside its block", p);
    else
      count[s->owner]++;
    pairs[n_pairs++] = (block_owner){s->mem.block, s->owner};
  }
  for (uint32_t i = 0; i < t->n_slots && st == CGT_OK; i++)
    if (count[i] != t->slots[i].refs)
      st = tree__fail(t, CGT_ERR_STATE, "slot %u counts %u live values in its block, %u name it", i, t->slots[i].refs,
                      count[i]);
  if (st == CGT_OK)
    qsort(pairs, n_pairs, sizeof *pairs, compare_block_owner);
  for (uint32_t i = 1; i < n_pairs && st == CGT_OK; i++)
    if (pairs[i].block == pairs[i - 1].block && pairs[i].owner != pairs[i - 1].owner)
      st = tree__fail(t, CGT_ERR_STATE, "block %p has two owners, slots %u and %u", pairs[i].block, pairs[i - 1].owner,
                      pairs[i].owner);
  free(count);
  free(pairs);
  return st;
}

static cgt_status check_pools(cgt_tree *t) {
  char why[256];
  CHECK(pool_check(t->pool, why, sizeof why), "graph pool: %s", why);
  CHECK(pool_check(t->side_pool, why, sizeof why), "side pool: %s", why);
  for (uint32_t i = 0; i < t->n_nodes; i++)
    if (t->nodes[i]->own_pool)
      CHECK(pool_check(t->nodes[i]->own_pool, why, sizeof why), "private pool of node %u: %s", i + 1, why);

  /* Every chunk the tree holds is in one of its pools, and together they
   * keep pool_limit_bytes. */
  size_t held = 0, unused = 0;
  uint64_t host_allocs = 0;
  add_pool(t->pool, &held, &unused, &unused, &host_allocs);
  add_pool(t->side_pool, &held, &unused, &unused, &host_allocs);
  for (uint32_t i = 0; i < t->n_nodes; i++)
    add_pool(t->nodes[i]->own_pool, &held, &unused, &unused, &host_allocs);
  CHECK(held == t->pool_held_bytes, "the pools hold %zu bytes of chunks, the tree counts %zu", held,
        t->pool_held_bytes);
  CHECK(!t->opt.pool_limit_bytes || held <= t->opt.pool_limit_bytes,
        "the pools hold %zu bytes, above pool_limit_bytes %zu", held, t->opt.pool_limit_bytes);

  /* Every chunk is in the tree's table of chunks, which arguments are
   * checked against. */
  size_t table_bytes = 0;
  for (uint32_t i = 0; i < t->n_chunks; i++) {
    CHECK(t->chunks[i].base < t->chunks[i].end && (i == 0 || t->chunks[i - 1].end <= t->chunks[i].base),
          "the table of pool chunks is out of order at %u", i);
    table_bytes += t->chunks[i].end - t->chunks[i].base;
  }
  CHECK(table_bytes == held, "the table of pool chunks covers %zu bytes, the pools hold %zu", table_bytes, held);

  /* Live values: inside their blocks, each block counted once. */
  size_t distinct_graph_bytes = 0;
  uint8_t *seen_owner = calloc(t->n_slots ? t->n_slots : 1, 1);
  CHECK(seen_owner, "no host memory to check the pools");
  for (uint32_t p = 0; p < t->n_step_values; p++) {
    if (!path_bit(t, p))
      continue;
    const mem_ref *a = &t->slots[t->step_values[p]].mem;
    uint32_t owner = t->slots[t->step_values[p]].owner;
    if (!a->block)
      continue;
    size_t bytes = pool_block_bytes(a->pool, a->block);
    /* Only the graph pool lets go of the live values: replay leaves its layout. */
    int owned_now = node__layout_owner(t, a->pool) != LAYOUT_CHECKPOINT;
    if (owned_now && (bytes == 0 || (uintptr_t)a->ptr < (uintptr_t)a->block ||
                      (uintptr_t)a->ptr - (uintptr_t)a->block + a->bytes > bytes)) {
      free(seen_owner);
      return tree__fail(t, CGT_ERR_STATE, "live value at position %u is not inside its allocated block %p", p,
                        a->block);
    }
    /* check_values proved the owners right; count each block once, at the
     * first live value that names its owner. */
    int first_of_block = !seen_owner[owner];
    seen_owner[owner] = 1;
    if (first_of_block && a->pool == t->pool && owned_now)
      distinct_graph_bytes += bytes;
  }
  free(seen_owner);
  if (t->opt.mode == CGT_MODE_TREE && node__layout_owner(t, t->pool) == LAYOUT_VALUES) {
    pool_stats ps;
    pool_get_stats(t->pool, &ps);
    CHECK(ps.allocated_bytes == distinct_graph_bytes,
          "the graph pool mirrors the live values, but holds %zu bytes while the live values hold %zu",
          ps.allocated_bytes, distinct_graph_bytes);
  }
  return CGT_OK;
}

cgt_status tree__check(cgt_tree *t) {
  CHECK(!t->launch.active, "a launch is active");
  cgt_status st = check_nodes(t);
  if (st == CGT_OK)
    st = check_values(t);
  if (st == CGT_OK)
    st = check_pools(t);
  if (st == CGT_OK)
    st = fuse__check(t);
  return st;
}

cgt_status cgt_tree_check(cgt_tree *t) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  return tree__check(t);
}

/* ------------------------------------------------------- for benchmarks */

size_t tree__path_execs(const cgt_tree *t, void **execs, size_t cap) {
  size_t depth = 0;
  for (const node *n = t->cur; n && n != &t->root; n = n->parent)
    depth++;
  size_t i = depth;
  for (const node *n = t->cur; n && n != &t->root; n = n->parent) {
    i--;
    if (i < cap)
      execs[i] = n->state == NODE_RECORDED ? n->exec : NULL;
  }
  return depth;
}

cgt_status tree__launch_exec(cgt_tree *t, void *exec) { return t->dev.ops->launch(&t->dev, exec); }
