/* evict.c — the recording budget: a long-running program's tree holds at
 * most max_graphs recorded graphs and max_graph_bytes in them.
 *
 * A server or a training job runs for days while its shapes and paths come
 * and go (batch sizes, sequence buckets, rarely taken branches). Without a
 * bound every path ever taken keeps its graphs, checkpoints and executables
 * for the tree's life. With one, every recording that succeeds ends here:
 * while the tree holds more than its budget, the RECORDED node with the
 * oldest use (node.last_use: the tree's use clock at its last replay or
 * recording) that is not on the current path and has no recording below
 * it that could go by itself (see mark_recorded_below) is evicted:
 * recordings go leaves first.
 *
 * Evicting node X drops its whole subtree, because everything below X was
 * recorded on top of X's recording: its descendants' checkpoints are deltas
 * of X's, their keys name X's output addresses, their liveness lists are
 * differences to X's. The descendants are removed (like pruned nodes: their
 * ids are gone, and they are made anew when reached); X itself goes back to
 * WARMUP, keeps its id and counters, and shows why in the node list
 * (cgt_node_info.evictions, evict_reason). Its (segment, variant) has
 * warmed up already, so the next run that reaches X records it at once.
 * Leaves first, because a descendant runs after X (later in X's step), so
 * the oldest recording is mostly an inner node: taking it with its subtree
 * dropped the newer recordings below it too. Two shapes of a training step
 * (a forward and its backward each, 4 graphs) under a budget of 3 evicted
 * a forward and its backward at every recording and never replayed (a
 * helper's hunt); leaves first, the other shape's backward goes and the
 * forwards replay. Where no recording off the path is such a leaf (each
 * holds one that must stay: of a key group, one that is not the last), the
 * oldest recording off the path goes, with its subtree, as before.
 *
 * What stays true across an eviction:
 *   - The current path is never evicted (X is not an ancestor of t->cur),
 *     so no live value's node goes: values are slot and generation, and
 *     their blocks are the path's. An eviction frees no pool block at all:
 *     it drops checkpoints (layout descriptions, reference-counted where
 *     deltas share them) and executables. The next warmup or recording
 *     restores the nearest checkpoint left on its path, which still holds
 *     exactly the live values' blocks (node.c: pool_sync), so memory of a
 *     live value is never handed out again.
 *   - The liveness invariant: the recordings left are X's ancestors' and
 *     other subtrees', whose liveness lists are differences to their own
 *     recorded ancestors, none of them evicted.
 *   - Deferred launch: recordings flush the held-back replays first, so
 *     nothing evicted is held; a fused span through an evicted node ends in
 *     X's subtree (spans are stretches of a path), so it goes with it.
 *   - Results: a re-recording captures the same launch function with the
 *     same addresses, as the API's contract for launch functions requires.
 *   - The key group: X is evicted only if it is the last of its key group
 *     (a WARMUP node must be, node.c), which re-records for other liveness
 *     patterns seldom are not; such a node waits until its later sibling
 *     goes, or stays over the budget with the path.
 *
 * When the current path alone holds more than the budget nothing more may
 * go: the budget is then exceeded by the path until the next recording off
 * it, which evicts again. The budget is checked at recordings only, so a
 * step of pure replays never pays for it.
 */
#include <string.h>

#include "tree_internal.h"

static const char *const reason_text[EVICT_REASON_COUNT] = {
#define EVICT__TEXT(name, text) text,
    EVICT_REASON_MAP(EVICT__TEXT)
#undef EVICT__TEXT
};

size_t evict__node_bytes(cgt_tree *t, const node *n) {
  const backend_ops *ops = t->dev.ops;
  size_t bytes = n->ckpt ? pool_checkpoint_host_bytes(n->ckpt) : 0;
  if (ops->graph_bytes && n->graph)
    bytes += ops->graph_bytes(&t->dev, n->graph);
  if (ops->graph_bytes && n->exec_graph)
    bytes += ops->graph_bytes(&t->dev, n->exec_graph);
  if (n->own_pool) {
    pool_stats s;
    pool_get_stats(n->own_pool, &s);
    bytes += s.reserved_bytes;
  }
  return bytes;
}

void evict__totals(const cgt_tree *t, uint64_t *graphs, size_t *bytes) {
  *graphs = 0;
  *bytes = 0;
  for (uint32_t i = 0; i < t->n_nodes; i++)
    if (t->nodes[i]->state == NODE_RECORDED) {
      (*graphs)++;
      *bytes += t->nodes[i]->graph_bytes;
    }
}

static int over_budget(const cgt_tree *t, evict_reason *why) {
  uint64_t graphs;
  size_t bytes;
  evict__totals(t, &graphs, &bytes);
  if (t->opt.max_graphs && graphs > t->opt.max_graphs) {
    *why = EVICT_GRAPHS;
    return 1;
  }
  if (t->opt.max_graph_bytes && bytes > t->opt.max_graph_bytes) {
    *why = EVICT_BYTES;
    return 1;
  }
  return 0;
}

/* Marks (or unmarks) the current path, root first excluded. */
static void mark_path(cgt_tree *t, uint8_t on) {
  for (node *a = t->cur; a != &t->root; a = a->parent)
    a->marked = on;
}

/* Sets recorded_below on every node with a recording in its subtree that
 * may go by itself (RECORDED, the last of its key group). A recording that
 * may not (a later member of its group runs eagerly for good, or waits in
 * WARMUP to be pruned) marks nothing: else it and its ancestors could never
 * go while any leaf elsewhere could, and old unused recordings held the
 * budget while the ones in use evicted one another and never replayed (a
 * helper's review); such a subtree goes whole when it is the oldest, as
 * before. Children come after their parents in t->nodes (ids in order), so
 * one backward pass carries each mark up. */
static void mark_recorded_below(cgt_tree *t) {
  for (uint32_t i = 0; i < t->n_nodes; i++)
    t->nodes[i]->recorded_below = 0;
  for (uint32_t i = t->n_nodes; i-- > 0;) {
    node *n = t->nodes[i];
    int may_go = n->state == NODE_RECORDED && !n->next_same_key;
    if ((may_go || n->recorded_below) && n->parent != &t->root)
      n->parent->recorded_below = 1;
  }
}

/* The least recently used recording that may go, a leaf of the recordings
 * where one may (see the top of the file), or NULL. */
static node *victim(cgt_tree *t) {
  node *leaf = NULL, *any = NULL;
  mark_path(t, 1);
  mark_recorded_below(t);
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    node *n = t->nodes[i];
    if (n->state != NODE_RECORDED || n->marked || n->next_same_key)
      continue;
    if (!any || n->last_use < any->last_use)
      any = n;
    if (!n->recorded_below && (!leaf || n->last_use < leaf->last_use))
      leaf = n;
  }
  mark_path(t, 0);
  return leaf ? leaf : any;
}

/* Removes x's descendants and drops x's recording. */
static void evict_subtree(cgt_tree *t, node *x, evict_reason why) {
  uint64_t recorded = 1;
  /* Parents come before children in id order: one pass marks the subtree. */
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    node *n = t->nodes[i];
    n->pruned = n->parent == x || n->parent->pruned;
    recorded += n->pruned && n->state == NODE_RECORDED;
  }
  HASH_CLEAR(hh, x->children); /* the whole table goes: no child is unlinked one by one */
  x->hot_child = NULL;
  node__remove_pruned(t, &t->stats.nodes_evicted);
  node__drop_recording(t, x, reason_text[why]);
  t->stats.evictions += recorded;
}

void evict__enforce(cgt_tree *t) {
  if (!t->opt.max_graphs && !t->opt.max_graph_bytes)
    return;
  cgt_assert(t->fuse.n_held == 0);
  evict_reason why;
  while (over_budget(t, &why)) {
    node *x = victim(t);
    if (!x) {
      tree__log(t, CGT_LOG_DEBUG, "recording budget exceeded by the current path alone: nothing to evict");
      return;
    }
    evict_subtree(t, x, why);
  }
}

int evict__check(const cgt_tree *t, char *why, size_t why_bytes) {
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    const node *n = t->nodes[i];
    int known = 0;
    for (int r = 0; r < EVICT_REASON_COUNT; r++)
      known |= n->evict_reason == reason_text[r];
    if ((n->evictions != 0) != (n->evict_reason != NULL) || (n->evict_reason && !known)) {
      snprintf(why, why_bytes, "node %u was evicted %llu times but its reason is %s", n->id,
               (unsigned long long)n->evictions, n->evict_reason ? "not one of the table's" : "missing");
      return 0;
    }
    if (n->state != NODE_RECORDED && (n->graph_bytes || n->exec_graph)) {
      snprintf(why, why_bytes, "node %u holds budget bytes or a first graph without a recording", n->id);
      return 0;
    }
  }
  return 1;
}
