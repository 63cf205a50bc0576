/* update.c — update in place: reloaded parameters do not grow the tree.
 *
 * A node's key names the address of every STATIC argument, so a program
 * whose weights move (a reloaded checkpoint, a re-created optimizer) used
 * to record a new child for every node it runs afterwards, with a new
 * capture and a new instantiate each, while the old recordings stayed for
 * good. MXNet's CUDA graphs and llama.cpp update the instantiated graph
 * instead. Here: when a run arrives with a key that differs from a
 * RECORDED sibling's only in STATIC addresses (update__candidate), the run
 * is still captured (the launch function is the only one who knows where
 * the new addresses go), but instead of becoming a new node the capture
 * updates the sibling's executable (backend exec_update, cudaGraphExecUpdate
 * on CUDA), or replaces it by a fresh instantiate where the device refuses
 * (another topology), and the new node takes the sibling's place: its id,
 * its children, its counters. The tree keeps its size.
 *
 * Why that is safe, and when it is not. Everything below a node was
 * recorded on top of what the node's recording left: the pool layout after
 * it (its checkpoint, which the children's checkpoints are deltas of), the
 * addresses of its outputs (in the children's keys and graphs), and the
 * liveness it needed (the children's liveness lists are differences to
 * it). A STATIC argument is caller memory, outside every pool, so moving it
 * changes none of these as long as the launch function allocates as
 * before. We do not trust that: update__fits compares, after the capture,
 * the pool's layout with the sibling's checkpoint (pool_matches), every
 * output (address, size, block), every placeholder and the liveness list.
 * Only if all are equal are the children still right, and the update goes
 * ahead; otherwise the run records a new node exactly as before. One
 * difference is allowed: an output in caller memory (a view of the moved
 * STATIC argument) moves with it, because children take a value outside
 * the pools as DYNAMIC (copied into a placeholder, its address in no key);
 * the node's recorded outputs are moved too. The sibling must also:
 *   - be able to replay now (the liveness invariant), so the capture was
 *     made under the liveness it was recorded with;
 *   - be the last of its key group, so that taking it out never re-inserts
 *     into a hash table (which could fail: a commit must not);
 *   - not have been recorded or updated in the last UPDATE_QUIET_STEPS
 *     steps: a program that alternates between two weight buffers passed as
 *     STATIC would otherwise update on every step instead of replaying two
 *     recordings; reloads are rare, alternation is not;
 *   - have replayed since it was recorded or updated (node.unreplayed). A
 *     buffer written in place (STATIC) passed at a new address at every
 *     call (a fresh output buffer, kept) updated some quiet sibling at
 *     every call, for good: a capture per call, 1.86x to 2.44x of plain
 *     Inductor's time on an H200 (bench/torch_moving_static.py). Now each
 *     such call records a node of its own, so rerecord_limit bounds them,
 *     and past it the new keys run on the overflow node. A ring of a few
 *     buffers (an allocator's recycled blocks) settles into a node each,
 *     replaying, where a sibling was updated away before its address came
 *     back (a review); a reload updates each node once, which then
 *     replays, ready for the next reload.
 * CGT_MODE_TREE only: SEPARATE is the baseline that shares nothing.
 *
 * What the swap keeps: the sibling's checkpoint object (children's deltas
 * hold references to it; the new capture's layout is equal to it), its
 * outputs and liveness list (equal), its placeholders (equal addresses;
 * after an update their copy-op handles still name the copy ops of the
 * graph the executable was first instantiated from, which CUDA requires,
 * so that graph is kept as exec_graph while node.graph becomes the new
 * capture that fusion and dot files use). Fused spans through the sibling
 * were built from its old graph and are dropped.
 *
 * Failure: the capture, the comparison and the update or instantiate come
 * before anything changes; if the first launch fails, an update is undone
 * (the executable updated back to the old graph) and the run fails with
 * nothing changed. The swap itself cannot fail: the new node is already in
 * its parent's table (made before the capture, like any new node), the
 * sibling leaves its table by a deletion, and the new node takes over the
 * sibling's slot in the id-ordered node list and its id (the new node's id
 * was the newest, so it is simply given back).
 */
#include <string.h>

#include "tree_internal.h"

/* 1 if key k (of a node) equals the run's key in t->key_buf except in the
 * addresses of STATIC arguments, at least one of which differs. */
static int differs_in_static_only(const uint64_t *k, const uint64_t *run, uint32_t n_args) {
  if (k[0] != run[0] || k[1] != run[1])
    return 0;
  int moved = 0;
  for (uint32_t i = 0; i < n_args; i++) {
    const uint64_t *a = &k[2 + 3 * (size_t)i], *b = &run[2 + 3 * (size_t)i];
    if (a[0] != b[0] || a[2] != b[2])
      return 0;
    if (a[1] != b[1]) {
      if (a[0] != KEY_STATIC)
        return 0;
      moved = 1;
    }
  }
  return moved;
}

node *update__candidate(const cgt_tree *t, uint32_t n_args) {
  if (t->opt.mode != CGT_MODE_TREE || t->opt.no_update_in_place)
    return NULL;
  size_t key_bytes = (2 + 3 * (size_t)n_args) * sizeof(uint64_t);
  for (node *first = t->cur->children; first; first = (node *)first->hh.next) {
    if (first->key_bytes != key_bytes || !differs_in_static_only(first->key, t->key_buf, n_args))
      continue;
    node *last = first;
    while (last->next_same_key)
      last = last->next_same_key;
    if (last->state == NODE_RECORDED && !last->unreplayed && last->recorded_step + UPDATE_QUIET_STEPS <= t->step &&
        node__liveness_ok(t, last))
      return last;
  }
  return NULL;
}

/* 1 if a recorded output and the capture's agree for everything below the
 * node: outputs in a pool must not move (children's keys and graphs name
 * them); an output in caller memory (a view of a STATIC argument) may move
 * with its argument, since children take such a value as DYNAMIC (copied
 * into a placeholder, its address in no key). */
static int output_fits(const mem_ref *recorded, const mem_ref *now) {
  if (recorded->bytes != now->bytes || recorded->pool != now->pool || recorded->block != now->block)
    return 0;
  return recorded->pool == NULL || recorded->ptr == now->ptr;
}

int update__fits(cgt_tree *t, const node *from, const run_prep *r) {
  const char *why = NULL;
  if (from->n_outputs != t->launch.n_outputs)
    why = "another number of outputs";
  for (uint32_t o = 0; !why && o < from->n_outputs; o++)
    if (!output_fits(&from->outputs[o], launch__output(t, o)))
      why = "an output in the pool moved, or changed size";
  if (!why && from->n_placeholders != r->n_ph)
    why = "another number of placeholders";
  for (uint32_t i = 0; !why && i < r->n_ph; i++)
    if (from->placeholders[i].arg != r->ph[i].arg || from->placeholders[i].ptr != r->ph[i].ptr ||
        from->placeholders[i].bytes != r->ph[i].bytes)
      why = "a placeholder moved";
  if (!why && (from->n_dead != r->n_dead || (r->n_dead && memcmp(from->dead, r->dead, r->n_dead * sizeof *r->dead))))
    why = "another liveness";
  if (!why && (!from->ckpt || !pool_matches(r->pl, from->ckpt)))
    why = "the pool layout after it differs from the checkpoint";
  if (why)
    tree__log(t, CGT_LOG_INFO, "node %u is not updated in place (%s): a new node is recorded", from->id, why);
  return why == NULL;
}

/* 1 if from's executable can take an update: the backend has the op and
 * every placeholder of it is still copied inside the graph (a copy op
 * turned off stays off in an update, and the new capture has it on). */
static int updatable(const cgt_tree *t, const node *from, const run_prep *r) {
  if (!t->dev.ops->exec_update)
    return 0;
  for (uint32_t i = 0; i < from->n_placeholders; i++)
    if (!from->placeholders[i].copy_op || !r->ph[i].copy_op)
      return 0;
  return 1;
}

cgt_status update__exec(cgt_tree *t, node *from, run_prep *r, int *updated) {
  const backend_ops *ops = t->dev.ops;
  *updated = 0;
  if (updatable(t, from, r)) {
    if (ops->exec_update(&t->dev, from->exec, r->graph) == CGT_OK) {
      *updated = 1;
      return CGT_OK;
    }
    tree__log(t, CGT_LOG_INFO, "node %u: the device refused the update (%s); instantiating afresh", from->id,
              t->dev.error);
  }
  cgt_status st = ops->instantiate(&t->dev, r->graph, &r->exec);
  if (st != CGT_OK)
    return tree__backend_fail(t, st, "instantiate after a refused update");
  return CGT_OK;
}

void update__exec_undo(cgt_tree *t, node *from) {
  if (t->dev.ops->exec_update(&t->dev, from->exec, from->graph) != CGT_OK)
    tree__log(t, CGT_LOG_WARN, "node %u: could not update its executable back after a failed launch: %s", from->id,
              t->dev.error);
}

/* Drops every fused span through `from`: they end in its subtree and start
 * at it or above, and were built from its old graph. */
static void forget_spans_through(cgt_tree *t, node *from) {
  from->marked = 1;
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    node *n = t->nodes[i];
    if (n != from)
      n->marked = n->parent != &t->root && n->parent->marked;
    if (n->marked)
      fuse__forget_spans_from(t, n, from->depth);
  }
  for (uint32_t i = 0; i < t->n_nodes; i++)
    t->nodes[i]->marked = 0;
}

/* n's recording: from's executable updated, or r's fresh one. */
static void take_recording(cgt_tree *t, node *from, node *n, run_prep *r, int updated) {
  const backend_ops *ops = t->dev.ops;
  if (updated) {
    n->exec = from->exec;
    n->exec_graph = from->exec_graph ? from->exec_graph : from->graph;
    if (from->exec_graph)
      ops->graph_destroy(&t->dev, from->graph, NULL); /* an earlier update's capture */
    n->placeholders = from->placeholders;
    for (uint32_t i = 0; i < r->n_ph; i++)
      n->placeholders[i].src = n->placeholders[i].next_src = r->ph[i].src;
    free(r->ph);
  } else {
    ops->graph_destroy(&t->dev, from->graph, from->exec);
    if (from->exec_graph)
      ops->graph_destroy(&t->dev, from->exec_graph, NULL);
    n->exec = r->exec;
    n->placeholders = r->ph;
    free(from->placeholders);
  }
  n->graph = r->graph;
  n->n_placeholders = r->n_ph;
  from->graph = from->exec = from->exec_graph = NULL;
  from->placeholders = NULL;
  r->graph = r->exec = NULL;
  r->ph = NULL;
  free(r->outs);
  free(r->dead);
  r->outs = NULL;
  r->dead = NULL;
}

void update__adopt(cgt_tree *t, node *from, node *n, run_prep *r, int updated) {
  cgt_assert(t->nodes[t->n_nodes - 1] == n && n->parent == from->parent && !n->children);
  forget_spans_through(t, from);
  take_recording(t, from, n, r, updated);

  /* What from's recording left, equal to what this capture left. */
  n->ckpt = from->ckpt;
  n->ckpt_bytes = from->ckpt_bytes;
  n->values_before = from->values_before;
  n->n_dead = from->n_dead;
  n->dead = from->dead;
  n->n_outputs = from->n_outputs;
  n->outputs = from->outputs;
  for (uint32_t o = 0; o < n->n_outputs; o++)
    n->outputs[o] = *launch__output(t, o); /* views of moved caller memory move with it */
  from->ckpt = NULL;
  from->dead = NULL;
  from->outputs = NULL;

  /* The children and counters. */
  n->children = from->children;
  from->children = NULL;
  for (node *first = n->children; first; first = (node *)first->hh.next)
    for (node *c = first; c; c = c->next_same_key)
      c->parent = n;
  n->hot_child = from->hot_child;
  n->replays = from->replays;
  n->eager_runs += from->eager_runs;
  n->fused_runs = from->fused_runs;
  n->evictions = from->evictions;
  n->evict_reason = from->evict_reason;
  n->updates = from->updates + 1;

  /* The identity: from's id and slot; n's id was the newest and goes back. */
  uint32_t lo = 0, hi = t->n_nodes - 1;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (t->nodes[mid]->id < from->id)
      lo = mid + 1;
    else
      hi = mid;
  }
  cgt_assert(t->nodes[lo] == from);
  t->nodes[lo] = n;
  t->n_nodes--;
  t->next_id--;
  t->stats.nodes--;
  n->id = from->id;
  node__unlink(from);
  node__destroy(t, from);
  t->stats.updates++;
  if (!updated)
    t->stats.update_fallbacks++;
}
