/* node.c — one run of a segment through the tree: lookup, then replay,
 * record, warmup or an eager run, and the pool bookkeeping each needs.
 *
 * A node is a segment reached along one path. Its key under its parent is
 * (segment, variant, the address and size of every VALUE and STATIC argument,
 * the size of every DYNAMIC argument), so one hash probe finds it. Nodes with
 * the same key are re-records for other liveness patterns and hang off the
 * first one in creation order.
 *
 * The state machine. node_decide makes the one decision of a run and
 * returns the action; node_run carries it out; node_set_state makes every
 * change of state and asserts that it is legal:
 *
 *                   RUN_RECORD, capture succeeds
 *   new ──> WARMUP ─────────────────────────────> RECORDED   (RUN_REPLAY; RUN_WARMUP
 *            │  │                                             in a step in warmup)
 *            │  │ RUN_RECORD, capture fails;
 *            │  │ RUN_EAGER, parent at rerecord_limit
 *            │  └──────────────────────────────> EAGER      (RUN_EAGER)
 *            │ RUN_OVERFLOW: new key past the limit,
 *            │ or segment declared uncapturable
 *            └─────────────────────────────────> OVERFLOW   (RUN_OVERFLOW for every
 *                                                            new key of its (segment,
 *                                                            variant) under its parent)
 *
 * A node leaves WARMUP once and the other three states are final: a
 * RECORDED node whose liveness no longer fits gets a re-recorded sibling
 * with the same key, and never turns EAGER. OVERFLOW reports itself as
 * EAGER (cgt_node_state has three states). The one way back is the
 * recording budget's (evict.c): an evicted RECORDED node returns to
 * WARMUP and records again when reached. A run whose STATIC arguments
 * moved may update a RECORDED sibling in place instead of recording a new
 * node (update.c): its new node takes the sibling's place.
 *
 *   REPLAY   a RECORDED node whose recorded liveness admits the values live
 *            now, and no warmup yet in this step: copy DYNAMIC arguments into
 *            the node's placeholders, launch the graph, hand out the values
 *            the recording fixed. With defer_launch the launch is held back
 *            (fuse.c) and every other action flushes it first. A segment
 *            with a prelaunch function (per-launch host state, such as a
 *            random generator's offset) has it called right before each
 *            launch of its graphs, the first one of a recording included,
 *            and its replays are never held back.
 *   RECORD   a new or WARMUP node whose (segment, variant) has warmed up:
 *            bring the pool to the parent's layout, capture the launch
 *            function, instantiate and upload, checkpoint the pool, launch.
 *   WARMUP   a new or WARMUP node whose (segment, variant) has not warmed up,
 *            or any WARMUP or RECORDED node once the step is in warmup: run
 *            the launch function eagerly with pool memory; the rest of the
 *            step is warmup too, because those allocations moved the pool
 *            away from every recorded layout. A RECORDED node stays RECORDED.
 *   EAGER    a node whose capture failed or whose parent has too many
 *            recordings of the segment: run eagerly on the side pool, which
 *            leaves the graph pool alone, so its children still record.
 *   OVERFLOW the same on the one OVERFLOW node of (parent, segment, variant).
 *   A node turns EAGER or OVERFLOW only as part of a run that succeeds (see
 *   run_eager_node).
 *
 * The pool is "synced" while its layout is exactly the blocks of the path's
 * live values; warmup and recording need that, replay breaks it (the graph
 * used memory behind the allocator's back). Before warmup or recording on an
 * unsynced pool we restore the checkpoint of the nearest recorded ancestor
 * and free every block whose values have all died since; by the liveness
 * invariant that is exactly the path's live values again.
 */
#include <string.h>

#include "tree_internal.h"

/* A fast mix of whole words: keys are arrays of uint64_t. */
uint32_t tree__key_hash(const void *key, size_t len) {
  const uint64_t *w = key;
  uint64_t h = 0x243f6a8885a308d3ull ^ len;
  for (size_t i = 0; i < len / 8; i++) {
    h ^= w[i];
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  h *= 0xbf58476d1ce4e5b9ull;
  return (uint32_t)(h ^ (h >> 32));
}

/* A key: two words for (segment, argument count) and variant, then three
 * for each argument. */
static size_t key_size(uint32_t n_args) { return (2 + 3 * (size_t)n_args) * sizeof(uint64_t); }

/* The three key words of one argument of the run at hand. */
static inline void key_arg_words(const run_arg *a, uint64_t w[3]) {
  w[0] = !a->keyed ? KEY_DYNAMIC : a->kind == CGT_ARG_STATIC ? KEY_STATIC : KEY_VALUE;
  w[1] = a->keyed ? (uint64_t)(uintptr_t)a->mem.ptr : 0;
  w[2] = a->mem.bytes;
}

/* Writes the key of the run at hand (t->args) into k, key_size(n_args) bytes. */
static void key_build(const cgt_tree *t, cgt_segment id, uint64_t variant, uint32_t n_args, uint64_t *k) {
  k[0] = (uint64_t)id | (uint64_t)n_args << 32;
  k[1] = variant;
  for (uint32_t i = 0; i < n_args; i++)
    key_arg_words(&t->args[i], &k[2 + 3 * (size_t)i]);
}

/* 1 if n's key is the key of the run at hand: key_build's words, compared
 * as they are made rather than written out first. */
static int key_matches(const cgt_tree *t, const node *n, cgt_segment id, uint64_t variant, uint32_t n_args) {
  const uint64_t *k = n->key;
  if (n->key_bytes != key_size(n_args) || k[0] != ((uint64_t)id | (uint64_t)n_args << 32) || k[1] != variant)
    return 0;
  for (uint32_t i = 0; i < n_args; i++) {
    uint64_t w[3];
    key_arg_words(&t->args[i], w);
    const uint64_t *kw = &k[2 + 3 * (size_t)i];
    if ((w[0] ^ kw[0]) | (w[1] ^ kw[1]) | (w[2] ^ kw[2]))
      return 0;
  }
  return 1;
}

/* ------------------------------------------------------------- warm counts */

static warm_count *warm_find(const cgt_tree *t, cgt_segment id, uint64_t variant) {
  warm_count probe, *w;
  memset(&probe.key, 0, sizeof probe.key);
  probe.key.segment = id;
  probe.key.variant = variant;
  HASH_FIND(hh, t->warm, &probe.key, sizeof probe.key, w);
  return w;
}

/* 1 if w went into the table; 0, with the table unchanged, when uthash had
 * no host memory. */
static int warm_add(cgt_tree *t, warm_count *w) {
  cgt_tree *hash_tree = t;
  int hash_oomed = 0;
  HASH_ADD(hh, t->warm, key, sizeof w->key, w);
  return !hash_oomed;
}

/* Finds or makes the counter first, so that a run never fails after its
 * launch function has done its work. A counter left behind by a run that
 * failed later reads 0, as no counter does. */
static warm_count *warm_get(cgt_tree *t, cgt_segment id, uint64_t variant) {
  warm_count *w = warm_find(t, id, variant);
  if (w)
    return w;
  w = tree__calloc(t, 1, sizeof *w);
  if (!w)
    return NULL;
  w->key.segment = id;
  w->key.variant = variant;
  if (!warm_add(t, w)) {
    free(w);
    return NULL;
  }
  return w;
}

/* ------------------------------------------------------------------- nodes */

/* The liveness invariant: every graph-pool value that was dead when n was
 * recorded is dead now. Its nearest recorded ancestor ran this step (by
 * replay, after this same check, or by recording) and dead values stay
 * dead, so only the positions n adds to the ancestor's need a look. */
int node__liveness_ok(const cgt_tree *t, const node *n) {
  if (t->opt.mode != CGT_MODE_TREE)
    return 1;
  if (NEVER(n->values_before != t->n_step_values))
    return 0;
  for (uint32_t i = 0; i < n->n_dead; i++)
    if (t->values_live[n->dead[i] / 64] >> (n->dead[i] % 64) & 1)
      return 0;
  return 1;
}

/* Destroys n's private pool (CGT_MODE_SEPARATE), keeping what it counted:
 * pool_peak_bytes is a high-water mark and host_allocs counts the
 * allocations made so far, so neither may fall when a recording is evicted
 * or a node pruned (a review: the peak fell from 512 to 256). */
static void retire_own_pool(cgt_tree *t, node *n) {
  if (!n->own_pool)
    return;
  pool_stats s;
  pool_get_stats(n->own_pool, &s);
  t->retired_pool_peak_bytes += s.peak_bytes;
  t->retired_host_allocs += s.host_allocs;
  pool_destroy(n->own_pool);
  n->own_pool = NULL;
}

void node__destroy(cgt_tree *t, node *n) {
  fuse__forget_node(t, n);
  if (n->graph || n->exec)
    t->dev.ops->graph_destroy(&t->dev, n->graph, n->exec);
  if (n->exec_graph)
    t->dev.ops->graph_destroy(&t->dev, n->exec_graph, NULL);
  if (n->ckpt)
    pool_checkpoint_free(n->ckpt);
  retire_own_pool(t, n);
  HASH_CLEAR(hh, n->children);
  free(n->dead);
  free(n->placeholders);
  free(n->outputs);
  free(n);
}

/* Puts n into its parent's table of children; 0, with the table unchanged,
 * when uthash had no host memory. */
static int children_add(cgt_tree *t, node *parent, node *n) {
  cgt_tree *hash_tree = t;
  int hash_oomed = 0;
  HASH_ADD_KEYPTR(hh, parent->children, n->key, n->key_bytes, n);
  return !hash_oomed;
}

/* Makes a child of t->cur under the key of the run at hand; `first` is the
 * head of its key group (NULL for a new key). */
static node *node_create(cgt_tree *t, node *first, cgt_segment id, uint64_t variant, uint32_t n_args) {
  size_t key_bytes = key_size(n_args);
  if (t->next_id == UINT32_MAX)
    return NULL;
  if (!tree__grow(t, (void **)&t->nodes, &t->nodes_cap, t->n_nodes + 1, sizeof *t->nodes))
    return NULL;
  /* The key lives right behind the node: a lookup that finds the node
   * finds its key in the next cache lines. */
  node *n = tree__calloc(t, 1, sizeof *n + key_bytes);
  if (!n)
    return NULL;
  n->key = (uint64_t *)(n + 1);
  key_build(t, id, variant, n_args, n->key);
  n->key_bytes = key_bytes;
  n->id = t->next_id++;
  n->last_step = t->step;
  n->parent = t->cur;
  n->depth = t->cur == &t->root ? 0 : t->cur->depth + 1;
  n->path_hash = tree__path_hash_next(t->cur->path_hash, id, variant);
  n->segment = id;
  n->variant = variant;
  n->state = NODE_WARMUP; /* the initial state; every later change is node_set_state's */
  if (first) {
    node *last = first;
    while (last->next_same_key)
      last = last->next_same_key;
    last->next_same_key = n;
  } else if (!children_add(t, t->cur, n)) {
    free(n);
    t->next_id--; /* the node never existed: its id is the next node's (a fuzz found the gap) */
    return NULL;
  }
  t->nodes[t->n_nodes++] = n;
  t->stats.nodes++;
  return n;
}

/* Takes n out of its parent's key group. A WARMUP node is always the last
 * of its group (a group grows only when it has no WARMUP node, and a node
 * never goes back to WARMUP), so this never re-inserts into a hash table and
 * cannot fail. */
void node__unlink(node *n) {
  node *first;
  HASH_FIND(hh, n->parent->children, n->key, n->key_bytes, first);
  if (first == n) {
    HASH_DELETE(hh, n->parent->children, n);
    if (n->parent->hot_child == n)
      n->parent->hot_child = NULL;
    return;
  }
  for (node *c = first; c; c = c->next_same_key)
    if (c->next_same_key == n) {
      c->next_same_key = n->next_same_key;
      return;
    }
}

/* Undoes node_create for a node whose first run failed: no half-made nodes.
 * The newest node is the last of its key group, so node_unlink applies. */
static void node_unlink_newest(cgt_tree *t, node *n) {
  node__unlink(n);
  t->n_nodes--;
  t->next_id--; /* the node never existed for the caller: its id is free again */
  t->stats.nodes--;
  node__destroy(t, n);
}

/* Recordings a parent already has of (segment, variant), for rerecord_limit:
 * the limit bounds graphs, so WARMUP nodes (no graph) do not count, except
 * a node the recording budget evicted before it replayed since it was last
 * recorded or updated (evict.c): under a tight budget a buffer written in
 * place (STATIC) at a new address at every step makes a recording that
 * never replays, the least recently used, evicted at the next recording;
 * while evicted nodes did not count, the parent never reached the limit,
 * and every step was a capture, for good (a review). Such a node counts
 * until pruning removes it (prune_after_steps), so the limit bounds
 * captures per that many steps.
 * except: a node left out (the one about to record), or NULL. */
static uint32_t count_recordings(const node *parent, cgt_segment id, uint64_t variant, const node *except) {
  uint32_t count = 0;
  for (const node *first = parent->children; first; first = (const node *)first->hh.next)
    for (const node *c = first; c; c = c->next_same_key)
      if (c != except && c->segment == id && c->variant == variant &&
          (c->state == NODE_RECORDED || (c->state == NODE_WARMUP && c->unreplayed)))
        count++;
  return count;
}

/* The state machine's only legal moves: a node is made WARMUP
 * (node_create), and leaves WARMUP for RECORDED, EAGER or OVERFLOW; EAGER
 * and OVERFLOW are final. A RECORDED node whose liveness no longer fits gets
 * a sibling; it never turns EAGER. The recording budget may send a RECORDED
 * node back to WARMUP (evict.c), from where it records again. */
static inline int transition_legal(node_state from, node_state to) {
  return (from == NODE_WARMUP && to != NODE_WARMUP) || (from == NODE_RECORDED && to == NODE_WARMUP);
}

/* Every change of a node's state goes through here. reason: why the node
 * runs eagerly from now on (EAGER and OVERFLOW; the tree's text, which
 * outlives the node: a record's reason is valid until cgt_tree_destroy),
 * NULL for RECORDED and WARMUP. Cannot fail: the reason was interned before
 * the run that commits the change. */
static void node_set_state(cgt_tree *t, node *n, node_state to, const char *reason) {
  cgt_assert(transition_legal(n->state, to));
  cgt_assert((to == NODE_RECORDED || to == NODE_WARMUP) == (reason == NULL));
  n->state = to;
  if (to == NODE_RECORDED || to == NODE_WARMUP)
    return;
  cgt_assert(!n->graph && !n->exec); /* a WARMUP node holds no run_prep */
  n->reason = reason;
  tree__log(t, CGT_LOG_WARN, "node %u (segment '%s') runs eagerly from now on%s: %s", n->id,
            t->segments[n->segment - 1].name, to == NODE_OVERFLOW ? " for every new key" : "", reason);
}

cgt_node_state node__public_state(const node *n) {
  return n->state == NODE_OVERFLOW ? CGT_NODE_EAGER : (cgt_node_state)n->state;
}

/* ---------------------------------------------------------------- the pool */

void node__begin_step(cgt_tree *t) {
  /* The root's checkpoint is the empty pool, and every value is dead. A
   * private pool (SEPARATE) is emptied when its node next runs. */
  if (t->side_pool)
    pool_clear(t->side_pool);
  if (t->pool && t->opt.mode != CGT_MODE_SEPARATE)
    pool_clear(t->pool);
  t->pool_synced = 1;
  t->step_in_warmup = 0;
  t->cur = &t->root;
}

/* Brings the graph pool to the layout of the path's live values. The layout
 * it replaces is kept until the run is over (pool_sync_end), so that a run
 * that fails afterwards can put the pool back: a failing cgt_run changes
 * nothing the caller can observe, restore counts included. */
static cgt_status pool_sync(cgt_tree *t) {
  if (t->opt.mode != CGT_MODE_TREE || t->pool_synced)
    return CGT_OK;
  node *a = t->cur;
  while (a != &t->root && !a->ckpt)
    a = a->parent;
  pool_checkpoint *undo;
  cgt_status st = pool_checkpoint_take(t->pool, &undo);
  if (st != CGT_OK)
    return tree__fail(t, st, "no host memory to checkpoint the pool before a restore");
  if (a == &t->root) {
    pool_clear(t->pool);
  } else {
    st = value__collect_live_blocks(t, t->pool);
    if (st == CGT_OK)
      st = pool_restore(t->pool, a->ckpt, value__keep_live_block, t);
    if (st != CGT_OK) {
      pool_checkpoint_free(undo);
      return tree__fail(t, st, "restoring the checkpoint of node %u: %s", a->id, cgt_status_string(st));
    }
    t->stats.checkpoint_restores++;
    tree__log(t, CGT_LOG_DEBUG, "pool restored to the checkpoint of node %u", a->id);
  }
  t->sync_undo = undo;
  t->sync_undo_pool = t->pool;
  t->sync_undo_restored = a != &t->root;
  t->pool_synced = 1;
  return CGT_OK;
}

/* Ends the run that may have synced the pool: keeps the new layout if the
 * run succeeded, else puts back the one pool_sync replaced. */
static void pool_sync_end(cgt_tree *t, cgt_status run_status) {
  if (!t->sync_undo)
    return;
  if (run_status != CGT_OK && pool_restore(t->sync_undo_pool, t->sync_undo, NULL, NULL) == CGT_OK &&
      t->sync_undo_pool == t->pool) {
    t->pool_synced = 0;
    t->stats.checkpoint_restores -= t->sync_undo_restored;
  }
  pool_checkpoint_free(t->sync_undo);
  t->sync_undo = NULL;
}

/* The pool a node's warmup and recording allocate from. */
static cgt_status node_pool(cgt_tree *t, node *n, pool **out) {
  if (t->opt.mode != CGT_MODE_SEPARATE) {
    cgt_status st = pool_sync(t);
    *out = t->pool;
    return st;
  }
  if (!n->own_pool) {
    cgt_status st = tree__pool_create(t, &n->own_pool);
    if (st != CGT_OK)
      return st;
  }
  /* The node runs at most once a step and its values die with the step, so
   * whatever its private pool holds is dead now. The old layout is kept for
   * pool_sync_end, as in TREE mode. */
  pool_checkpoint *undo;
  cgt_status st = pool_checkpoint_take(n->own_pool, &undo);
  if (st != CGT_OK)
    return tree__fail(t, st, "no host memory to checkpoint a private pool");
  pool_clear(n->own_pool);
  t->sync_undo = undo;
  t->sync_undo_pool = n->own_pool;
  t->sync_undo_restored = 0;
  *out = n->own_pool;
  return CGT_OK;
}

/* ---------------------------------------------------------------- the runs */

static void set_inputs_direct(cgt_tree *t) {
  for (uint32_t i = 0; i < t->n_run_args; i++)
    launch__set_input(t, i, t->args[i].mem);
}

/* A live value in `block` that this run knows of: an earlier output of the
 * run (two outputs in one allocation or one input), or a VALUE argument the
 * output aliases. No other live value can hold the block: a run allocates
 * only memory no live value holds, and a recording replays only while the
 * values it overlapped are dead. VALUE_NONE if the block is new. */
static uint32_t block_sharer(const cgt_tree *t, const void *block, const cgt_value *made, uint32_t n_made) {
  if (!block)
    return VALUE_NONE;
  for (uint32_t o = 0; o < n_made; o++)
    if (t->slots[value__slot_of(made[o])].mem.block == block)
      return value__slot_of(made[o]);
  for (uint32_t i = 0; i < t->n_run_args; i++)
    if (t->args[i].slot != VALUE_NONE && t->args[i].mem.block == block)
      return t->args[i].slot;
  return VALUE_NONE;
}

static void hand_out_launch_outputs(cgt_tree *t, const segment_rec *seg, cgt_value *outputs) {
  for (uint32_t o = 0; o < seg->n_outputs; o++) {
    const mem_ref *out = launch__output(t, o);
    outputs[o] = value__make(t, *out, block_sharer(t, out->block, outputs, o));
  }
  launch__disown_allocations(t); /* they belong to values now */
}

/* Calls the prepared launch function eagerly inside a profiler range named
 * after the segment, and sorts its allocations into outputs and freed
 * temporaries. */
static cgt_status call_eagerly(cgt_tree *t, const segment_rec *seg) {
  if (t->dev.ops->range_push)
    t->dev.ops->range_push(&t->dev, seg->name);
  cgt_status st = launch__call(t);
  if (st == CGT_OK)
    st = launch__finish(t);
  if (t->dev.ops->range_pop)
    t->dev.ops->range_pop(&t->dev);
  return st;
}

/* Runs the launch function eagerly, outside the graph pool: EAGER nodes on
 * the side pool, CGT_MODE_EAGER on the main pool. n is NULL in EAGER mode,
 * which keeps no nodes. */
static cgt_status run_eagerly(cgt_tree *t, node *n, cgt_segment id, const segment_rec *seg, uint64_t variant, pool *pl,
                              cgt_value *outputs) {
  warm_count *w = warm_get(t, id, variant);
  if (!w)
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for warmup counters");
  cgt_status st = launch__prepare(t, seg, variant, pl);
  if (st != CGT_OK)
    return st;
  set_inputs_direct(t);
  st = call_eagerly(t, seg);
  if (st != CGT_OK) {
    launch__rollback(t);
    return st;
  }
  hand_out_launch_outputs(t, seg, outputs);
  w->runs++;
  t->stats.eager_runs++;
  if (n) {
    n->eager_runs++;
    n->last_step = t->step;
    t->cur = n;
  }
  return CGT_OK;
}

/* Runs node n eagerly on the side pool. With `why` (not NULL) the run also
 * moves the WARMUP node n to state `to` (EAGER or OVERFLOW) for that reason,
 * but only if it succeeds: the transition is part of the run's commit, so a
 * failing run leaves the node as it was. */
static cgt_status run_eager_node(cgt_tree *t, node *n, const segment_rec *seg, const char *why, node_state to,
                                 cgt_value *outputs) {
  const char *reason = NULL;
  if (why && !(reason = tree__intern(t, why)))
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory to turn node %u eager", n->id);
  cgt_status st = run_eagerly(t, n, n->segment, seg, n->variant, t->side_pool, outputs);
  if (st != CGT_OK)
    return st; /* the interned reason stays the tree's, for the next try */
  if (reason)
    node_set_state(t, n, to, reason);
  return CGT_OK;
}

/* Calls seg's prelaunch function, if it has one, right before a launch of
 * one of its recorded graphs. Meanwhile the tree refuses what it refuses
 * inside a launch function. A failure is the run's: the caller undoes. */
static cgt_status prelaunch(cgt_tree *t, const segment_rec *seg, uint64_t variant) {
  if (!seg->prelaunch)
    return CGT_OK;
  t->launch.active = 1;
  cgt_status st = seg->prelaunch(seg->prelaunch_user, t->dev.stream, variant);
  t->launch.active = 0;
  if (st != CGT_OK)
    return tree__fail(t, CGT_ERR_SEGMENT_FAILED, "segment '%s': prelaunch function returned %s", seg->name,
                      cgt_status_name(st));
  return CGT_OK;
}

/* Enqueues n's own executable. DYNAMIC arguments reach their placeholders
 * through the copy ops of the graph, repointed when the source moved, or
 * by a copy before the launch where the device cannot repoint them. */
cgt_status node__launch(cgt_tree *t, node *n) {
  const backend_ops *ops = t->dev.ops;
  if (ops->range_push)
    ops->range_push(&t->dev, t->segments[n->segment - 1].name);
  cgt_status st = CGT_OK;
  for (uint32_t i = 0; i < n->n_placeholders && st == CGT_OK; i++) {
    node_placeholder *ph = &n->placeholders[i];
    const void *src = ph->next_src;
    if (ph->copy_op && src != ph->src) {
      if (ops->exec_set_copy_src(&t->dev, n->exec, ph->copy_op, ph->ptr, src, ph->bytes) == CGT_OK) {
        ph->src = src;
      } else if (ops->exec_copy_enable(&t->dev, n->exec, ph->copy_op, 0) == CGT_OK) {
        /* The device cannot repoint this copy (another kind of memory):
         * turn the copy op off and copy before each launch from now on. */
        tree__log(t, CGT_LOG_INFO, "node %u: input %u is copied outside the graph from now on: %s", n->id, ph->arg,
                  t->dev.error);
        ph->copy_op = NULL;
      } else {
        st = CGT_ERR_BACKEND;
        break;
      }
    }
    if (!ph->copy_op)
      st = ops->copy(&t->dev, ph->ptr, src, ph->bytes);
  }
  if (st == CGT_OK && (st = prelaunch(t, &t->segments[n->segment - 1], n->variant)) != CGT_OK) {
    if (ops->range_pop)
      ops->range_pop(&t->dev);
    return st; /* the prelaunch function's failure, not the backend's */
  }
  if (st == CGT_OK) {
    uint64_t t0 = t->opt.time_launches ? tree__now_ns() : 0;
    st = ops->launch(&t->dev, n->exec);
    if (t->opt.time_launches)
      t->stats.launch_host_ns += tree__now_ns() - t0;
  }
  if (ops->range_pop)
    ops->range_pop(&t->dev);
  return st == CGT_OK ? CGT_OK : tree__backend_fail(t, st, "replay");
}

/* The bookkeeping of a replay of n, launched or held back: the values its
 * recording fixed, handed out at once, and n as the path's last node. */
static void replay_commit(cgt_tree *t, node *n, cgt_value *outputs) {
  for (uint32_t o = 0; o < n->n_outputs; o++) {
    const mem_ref *out = &n->outputs[o];
    outputs[o] = value__make(t, *out, block_sharer(t, out->block, outputs, o));
  }
  for (uint32_t i = 0; i < n->n_placeholders; i++) {
    t->stats.input_copies++;
    t->stats.input_copy_bytes += n->placeholders[i].bytes;
  }
  n->replays++;
  n->unreplayed = 0;
  n->last_step = t->step;
  n->last_use = ++t->use_clock;
  n->parent->next_exec = n->exec;
  t->stats.replays++;
  if (t->opt.mode == CGT_MODE_TREE)
    t->pool_synced = 0;
  t->cur = n;
}

/* Points n's placeholders at the DYNAMIC arguments of the run at hand. */
static void replay_sources(cgt_tree *t, node *n) {
  for (uint32_t i = 0; i < n->n_placeholders; i++)
    n->placeholders[i].next_src = t->args[n->placeholders[i].arg].mem.ptr;
}

/* A replay held back (defer_launch) until the next flush: 1 if n was held
 * and the replay is done, 0 if it must launch now (deferral is off, or no
 * host memory to hold it). It touches no backend, so it runs without the
 * tree's device (see node__run). */
static int replay_held(cgt_tree *t, node *n, cgt_value *outputs) {
  if (!fuse__enabled(t) || t->segments[n->segment - 1].prelaunch)
    return 0;
  replay_sources(t, n);
  if (fuse__hold(t, n) != CGT_OK)
    return 0;
  replay_commit(t, n, outputs);
  return 1;
}

/* A replay launched now, after what was held back. */
static cgt_status replay(cgt_tree *t, node *n, cgt_value *outputs) {
  replay_sources(t, n);
  cgt_status st = fuse__flush(t); /* what was held back goes first */
  if (st == CGT_OK)
    st = node__launch(t, n);
  if (st != CGT_OK)
    return st;
  replay_commit(t, n, outputs);
  return CGT_OK;
}


/* Gives back everything a failed recording took: the pool ends as it was
 * before the recording began. */
static void prep_undo(cgt_tree *t, run_prep *r) {
  if (r->graph || r->exec)
    t->dev.ops->graph_destroy(&t->dev, r->graph, r->exec);
  if (r->ckpt)
    pool_checkpoint_free(r->ckpt);
  launch__rollback(t);
  for (uint32_t i = 0; i < r->n_ph; i++)
    if (pool_block_bytes(r->pl, r->ph[i].ptr))
      pool_free(r->pl, r->ph[i].ptr);
  free(r->ph), free(r->outs), free(r->dead);
}

/* Allocates the placeholders of DYNAMIC arguments and copies the caller's
 * data in; the graph reads them there, and each replay refills them first. */
static cgt_status prep_placeholders(cgt_tree *t, run_prep *r, const segment_rec *seg) {
  for (uint32_t i = 0; i < seg->n_inputs; i++) {
    const mem_ref *arg = &t->args[i].mem;
    if (t->args[i].keyed)
      continue;
    void *p;
    t->dev.error[0] = '\0'; /* a refused chunk leaves its reason here */
    cgt_status st = pool_alloc(r->pl, arg->bytes, &p);
    if (st != CGT_OK)
      return tree__fail(t, st, "placeholder of %zu bytes for input %u: %s", arg->bytes, i,
                        t->dev.error[0] ? t->dev.error : cgt_status_string(st));
    r->ph[r->n_ph++] = (node_placeholder){i, p, arg->bytes, NULL, arg->ptr, arg->ptr};
    st = r->copies_in_graph ? CGT_OK : t->dev.ops->copy(&t->dev, p, arg->ptr, arg->bytes);
    if (st != CGT_OK)
      return tree__backend_fail(t, st, "copy into a placeholder");
    launch__set_input(t, i, (mem_ref){p, arg->bytes, p, r->pl});
  }
  return CGT_OK;
}

/* 1 if the backend can capture DYNAMIC copies into a graph and repoint them. */
static int copies_in_graph(const cgt_tree *t) {
  const backend_ops *ops = t->dev.ops;
  return ops->graph_find_copy && ops->exec_set_copy_src && ops->exec_copy_enable;
}

/* The nearest RECORDED proper ancestor of n, or the virtual root. */
static const node *recorded_ancestor(const cgt_tree *t, const node *n) {
  const node *a = n->parent;
  while (a != &t->root && a->state != NODE_RECORDED)
    a = a->parent;
  return a;
}

/* The positions a recording of n must see dead whenever it replays, beyond
 * those of its nearest recorded ancestor: graph-pool values dead now (the
 * recording may reuse their memory) that the ancestors' lists do not name.
 * Values elsewhere (eager nodes' side pool, views of caller memory) may be
 * live or dead when it replays. */
static cgt_status prep_dead_list(cgt_tree *t, const node *n, run_prep *r) {
  uint32_t words = (t->n_step_values + 63) / 64;
  if (t->opt.mode != CGT_MODE_TREE || words == 0)
    return CGT_OK;
  if (words > t->dead_scratch_words) {
    uint64_t *scratch = tree__calloc(t, words, sizeof *scratch);
    if (!scratch)
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for a liveness list");
    free(t->dead_scratch);
    t->dead_scratch = scratch;
    t->dead_scratch_words = words;
  }
  uint64_t *known = t->dead_scratch;
  memset(known, 0, words * sizeof *known);
  for (const node *a = recorded_ancestor(t, n); a != &t->root; a = recorded_ancestor(t, a))
    for (uint32_t i = 0; i < a->n_dead; i++)
      known[a->dead[i] / 64] |= (uint64_t)1 << (a->dead[i] % 64);
  uint32_t count = 0;
  for (uint32_t w = 0; w < words; w++) {
    known[w] = ~t->values_live[w] & t->values_pooled[w] & ~known[w]; /* now: the new positions */
    if (w == words - 1 && t->n_step_values % 64)
      known[w] &= ((uint64_t)1 << (t->n_step_values % 64)) - 1;
    count += (uint32_t)__builtin_popcountll(known[w]);
  }
  if (!count)
    return CGT_OK;
  r->dead = tree__malloc(t, count * sizeof *r->dead);
  if (!r->dead)
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for a liveness list");
  for (uint32_t w = 0; w < words; w++)
    for (uint64_t bits = known[w]; bits; bits &= bits - 1)
      r->dead[r->n_dead++] = w * 64 + (uint32_t)__builtin_ctzll(bits);
  return CGT_OK;
}

/* Takes the host memory a recording keeps (placeholders; with keep, the
 * output list and liveness list too), prepares the launch context, and makes
 * the placeholders. On failure everything is given back. */
static cgt_status prep_prepare(cgt_tree *t, run_prep *r, const node *n, const segment_rec *seg, int keep) {
  launch__disown_allocations(t); /* nothing of an earlier launch may be rolled back */
  uint32_t n_dyn = 0;
  uint32_t n_outs = keep ? seg->n_outputs : 0;
  for (uint32_t i = 0; i < seg->n_inputs; i++)
    n_dyn += !t->args[i].keyed;
  r->ph = n_dyn ? tree__calloc(t, n_dyn, sizeof *r->ph) : NULL;
  r->outs = n_outs ? tree__calloc(t, n_outs, sizeof *r->outs) : NULL;
  cgt_status st = CGT_OK;
  if ((n_dyn && !r->ph) || (n_outs && !r->outs))
    st = tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory to run segment '%s'", seg->name);
  if (st == CGT_OK && keep)
    st = prep_dead_list(t, n, r);
  if (st != CGT_OK) {
    prep_undo(t, r);
    return st;
  }
  st = launch__prepare(t, seg, n->variant, r->pl);
  if (st == CGT_OK) {
    set_inputs_direct(t);
    r->copies_in_graph = keep && copies_in_graph(t);
    st = prep_placeholders(t, r, seg);
  }
  if (st != CGT_OK)
    prep_undo(t, r);
  return st;
}

/* The opening of warmup and recording: the node's pool brought to the path's
 * layout, its warmup counter, and prep_prepare. */
static cgt_status prep_begin(cgt_tree *t, node *n, const segment_rec *seg, int keep, run_prep *r, warm_count **w) {
  memset(r, 0, sizeof *r);
  cgt_status st = node_pool(t, n, &r->pl);
  if (st != CGT_OK)
    return st;
  *w = warm_get(t, n->segment, n->variant);
  if (!*w)
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for warmup counters");
  return prep_prepare(t, r, n, seg, keep);
}

/* A run that used placeholders succeeded: count its copies. */
static void prep_count_copies(cgt_tree *t, const run_prep *r) {
  for (uint32_t i = 0; i < r->n_ph; i++) {
    t->stats.input_copies++;
    t->stats.input_copy_bytes += r->ph[i].bytes;
  }
}

/* Placeholders that no output aliases are free again once captured. */
static void prep_release_placeholders(cgt_tree *t, run_prep *r) {
  for (uint32_t i = 0; i < r->n_ph; i++) {
    int held = 0;
    for (uint32_t o = 0; o < t->launch.n_outputs; o++)
      held |= launch__output(t, o)->block == r->ph[i].ptr;
    if (!held)
      pool_free(r->pl, r->ph[i].ptr);
  }
}

/* Warmup runs the launch function eagerly with pool memory, allocating
 * exactly as a recording would (placeholders first), so the addresses it
 * hands out, and with them the keys of the nodes below, are the ones a
 * recording from the same layout will produce. */
static cgt_status run_warmup(cgt_tree *t, node *n, const segment_rec *seg, cgt_value *outputs) {
  run_prep r;
  warm_count *w;
  cgt_status st = prep_begin(t, n, seg, 0, &r, &w);
  if (st != CGT_OK)
    return st;
  st = call_eagerly(t, seg);
  if (st != CGT_OK) {
    prep_undo(t, &r);
    return st;
  }
  prep_release_placeholders(t, &r);
  prep_count_copies(t, &r);
  free(r.ph);
  hand_out_launch_outputs(t, seg, outputs);
  w->runs++;
  n->eager_runs++;
  n->last_step = t->step;
  t->stats.warmups++;
  if (t->opt.mode == CGT_MODE_TREE)
    t->step_in_warmup = 1;
  t->cur = n;
  return CGT_OK;
}

/* The capture of n failed (why says how): run n eagerly once more, and if
 * that succeeds, n is EAGER for good and the failure is counted. If the
 * eager run fails too, the run fails and nothing changes. */
static cgt_status fall_back_eagerly(cgt_tree *t, node *n, const segment_rec *seg, const char *why, cgt_value *outputs) {
  tree__log(t, CGT_LOG_DEBUG, "node %u (segment '%s'): %s; running it eagerly", n->id, seg->name, why);
  cgt_status st = run_eager_node(t, n, seg, why, NODE_EAGER, outputs);
  if (st != CGT_OK) {
    char eager_error[TREE_ERROR_BYTES];
    memcpy(eager_error, t->error, sizeof eager_error);
    return tree__fail(t, st, "node %u (segment '%s'): %s; the eager run after it failed too: %s", n->id, seg->name, why,
                      eager_error);
  }
  t->stats.capture_failures++;
  tree__fail(t, CGT_ERR_CAPTURE_FAILED, "node %u (segment '%s'): %s", n->id, seg->name, why);
  return CGT_OK;
}

/* Captures the launch function into a graph. On success the node is
 * RECORDED, checkpointed and launched once. A capture failure runs the node
 * eagerly and, if that succeeds, turns it EAGER; every other failure, and an
 * eager run that fails too, changes nothing. */
static cgt_status record_update(cgt_tree *t, node *n, node *from, const segment_rec *seg, run_prep *r, warm_count *w,
                                cgt_value *outputs);

/* The bookkeeping every recording that succeeded shares, a fresh one or an
 * update in place: the warm count, the clocks, the path, the budget. */
static void record_commit(cgt_tree *t, node *n, const segment_rec *seg, warm_count *w, cgt_value *outputs) {
  n->last_step = t->step;
  n->last_use = ++t->use_clock;
  n->recorded_step = t->step;
  n->unreplayed = 1; /* until it replays: no update in place from it (update.c) */
  n->graph_bytes = evict__node_bytes(t, n);
  w->runs++;
  t->stats.recordings++;
  hand_out_launch_outputs(t, seg, outputs);
  t->cur = n;
  evict__enforce(t);
}

static cgt_status record(cgt_tree *t, node *n, const segment_rec *seg, int is_rerecord, node *update_from,
                         cgt_value *outputs) {
  const backend_ops *ops = t->dev.ops;
  run_prep r;
  warm_count *w;
  cgt_status st = prep_begin(t, n, seg, 1, &r, &w);
  if (st != CGT_OK)
    return st;

  /* Capture. A capture the backend invalidated (a sync, a malloc, a legacy
   * stream call) makes the node EAGER whatever the launch function returned:
   * careful code returns the error of the illegal call it made. A launch
   * function that fails while its capture holds is the caller's error. */
  if (ops->range_push)
    ops->range_push(&t->dev, seg->name);
  st = ops->capture_begin(&t->dev);
  if (st != CGT_OK) {
    if (ops->range_pop)
      ops->range_pop(&t->dev);
    prep_undo(t, &r);
    if (st != CGT_ERR_CAPTURE_FAILED)
      return tree__backend_fail(t, st, "capture_begin");
    /* The device would not capture this stream at all: the remedy is the
     * same as for a capture that broke. */
    char why[BACKEND_ERROR_BYTES + 32];
    snprintf(why, sizeof why, "capture could not begin: %s", t->dev.error);
    return fall_back_eagerly(t, n, seg, why, outputs);
  }
  /* DYNAMIC arguments are copied into their placeholders inside the graph
   * when the backend can repoint such copies later. */
  cgt_status call_st = CGT_OK;
  for (uint32_t i = 0; i < r.n_ph && call_st == CGT_OK && r.copies_in_graph; i++)
    call_st = ops->copy(&t->dev, r.ph[i].ptr, r.ph[i].src, r.ph[i].bytes);
  if (call_st != CGT_OK)
    call_st = tree__backend_fail(t, call_st, "copy into a placeholder");
  else
    call_st = launch__call(t);
  cgt_status cap_st = ops->capture_end(&t->dev, &r.graph);
  for (uint32_t i = 0; i < r.n_ph && cap_st == CGT_OK && r.copies_in_graph; i++)
    if (ops->graph_find_copy(&t->dev, r.graph, r.ph[i].ptr, &r.ph[i].copy_op) != CGT_OK)
      cap_st = CGT_ERR_CAPTURE_FAILED; /* the reason is in t->dev.error */
  if (ops->range_pop)
    ops->range_pop(&t->dev);
  char why[BACKEND_ERROR_BYTES + 32] = "";
  if (cap_st != CGT_OK)
    snprintf(why, sizeof why, "capture failed: %s", t->dev.error);
  if (call_st != CGT_OK && cap_st == CGT_OK) {
    prep_undo(t, &r);
    return call_st;
  }
  if (cap_st == CGT_OK) {
    st = launch__finish(t);
    if (st != CGT_OK) {
      prep_undo(t, &r);
      return st;
    }
    prep_release_placeholders(t, &r);
    if (update_from && update__fits(t, update_from, &r))
      return record_update(t, n, update_from, seg, &r, w, outputs);
    st = ops->instantiate(&t->dev, r.graph, &r.exec);
    if (st == CGT_ERR_OUT_OF_MEMORY) {
      prep_undo(t, &r);
      return tree__backend_fail(t, st, "instantiate");
    }
    if (st != CGT_OK) {
      snprintf(why, sizeof why, "instantiate failed: %s", t->dev.error);
      cap_st = CGT_ERR_CAPTURE_FAILED;
    }
  }
  if (cap_st != CGT_OK) {
    prep_undo(t, &r);
    return fall_back_eagerly(t, n, seg, why, outputs);
  }

  if (t->opt.mode == CGT_MODE_TREE) {
    /* Stored as the difference from the nearest recorded ancestor's, which
     * is the layout the pool was synced to: linear memory along a path. */
    node *a = n->parent;
    while (a != &t->root && !a->ckpt)
      a = a->parent;
    st = pool_checkpoint_take_delta(r.pl, a->ckpt, &r.ckpt);
    if (st != CGT_OK) {
      prep_undo(t, &r);
      return tree__fail(t, st, "checkpoint after recording node %u", n->id);
    }
  }
  st = prelaunch(t, seg, n->variant);
  if (st != CGT_OK) {
    prep_undo(t, &r);
    return st;
  }
  st = ops->launch(&t->dev, r.exec);
  if (st != CGT_OK) {
    prep_undo(t, &r);
    return tree__backend_fail(t, st, "first launch of a recording");
  }

  /* The recording is good: keep what replay needs. */
  for (uint32_t o = 0; o < seg->n_outputs; o++)
    r.outs[o] = *launch__output(t, o);
  n->graph = r.graph;
  n->exec = r.exec;
  n->ckpt = r.ckpt;
  n->ckpt_bytes = r.ckpt ? pool_checkpoint_allocated_bytes(r.ckpt) : 0;
  n->values_before = t->n_step_values;
  n->n_dead = r.n_dead;
  n->dead = r.dead;
  n->n_placeholders = r.n_ph;
  n->placeholders = r.ph;
  n->n_outputs = seg->n_outputs;
  n->outputs = r.outs;
  node_set_state(t, n, NODE_RECORDED, NULL);
  prep_count_copies(t, &r);
  if (is_rerecord)
    t->stats.rerecords++;
  record_commit(t, n, seg, w, outputs);
  tree__log(t, CGT_LOG_INFO, "recorded node %u (segment '%s', depth %u)%s", n->id, seg->name, n->depth,
            is_rerecord ? " as a re-record" : "");
  if (t->graph_dot_dir && ops->graph_dot) {
    char path[1024];
    snprintf(path, sizeof path, "%s/node%u_%s.dot", t->graph_dot_dir, n->id, seg->name);
    if (ops->graph_dot(&t->dev, n->graph, path) != CGT_OK)
      tree__log(t, CGT_LOG_WARN, "could not write %s: %s", path, t->dev.error);
  }
  return CGT_OK;
}

/* The capture of n (a new node: STATIC arguments moved) left the pool
 * exactly as the recording of its sibling `from` did (update__fits): update
 * from's executable with the new graph, or instantiate afresh where the
 * device refuses, launch it, and let n take from's place (update.c). A
 * failure before the launch succeeded changes nothing (an update already
 * made is undone); afterwards nothing can fail. */
static cgt_status record_update(cgt_tree *t, node *n, node *from, const segment_rec *seg, run_prep *r, warm_count *w,
                                cgt_value *outputs) {
  int updated = 0;
  cgt_status st = update__exec(t, from, r, &updated);
  if (st != CGT_OK) {
    prep_undo(t, r);
    return st;
  }
  void *exec = updated ? from->exec : r->exec;
  st = prelaunch(t, seg, n->variant);
  if (st == CGT_OK && (st = t->dev.ops->launch(&t->dev, exec)) != CGT_OK)
    st = tree__backend_fail(t, st, "first launch of an updated recording");
  if (st != CGT_OK) {
    if (updated)
      update__exec_undo(t, from);
    prep_undo(t, r);
    return st;
  }
  prep_count_copies(t, r);
  update__adopt(t, from, n, r, updated);
  node_set_state(t, n, NODE_RECORDED, NULL);
  record_commit(t, n, seg, w, outputs);
  tree__log(t, CGT_LOG_INFO, "node %u (segment '%s') updated in place for moved STATIC arguments%s", n->id,
            seg->name, updated ? "" : " (the device refused the update: instantiated afresh)");
  return CGT_OK;
}

/* ------------------------------------------------------------ the decision */

/* The overflow node of (segment, variant) under parent, or NULL. */
static node *find_overflow(const node *parent, cgt_segment id, uint64_t variant) {
  for (node *first = parent->children; first; first = (node *)first->hh.next)
    for (node *c = first; c; c = c->next_same_key)
      if (c->state == NODE_OVERFLOW && c->segment == id && c->variant == variant)
        return c;
  return NULL;
}

#define WHY_BYTES 192

/* What one run does: the state machine's one decision (node_decide), which
 * node_run then carries out. */
typedef enum run_action {
  RUN_REPLAY,  /* launch the recording of a RECORDED node whose liveness admits the values live now */
  RUN_WARMUP,  /* run the launch function eagerly in the graph pool (a WARMUP node, or a RECORDED
                  one in a step already in warmup, which stays RECORDED); the step is in warmup after it */
  RUN_RECORD,  /* capture a WARMUP node: -> RECORDED, or -> EAGER if the capture fails */
  RUN_EAGER,   /* run eagerly on the side pool: an EAGER or OVERFLOW node of this key, or, with a
                  reason, a WARMUP node that may not record (-> EAGER) */
  RUN_OVERFLOW /* a key its parent may not record: run on the OVERFLOW node of (segment, variant),
                  or, with a reason, make it (WARMUP -> OVERFLOW) */
} run_action;

typedef struct run_decision {
  run_action action;
  node *target;        /* the node that runs; NULL: a new node, made by node_run under t->cur */
  int rerecord;        /* RUN_RECORD: every recording of this key had the wrong liveness */
  node *update_from;   /* RUN_RECORD of a new key: the sibling whose STATIC arguments moved (update.c), or NULL */
  char why[WHY_BYTES]; /* the reason the node leaves WARMUP for EAGER or OVERFLOW; "" if it does not */
} run_decision;

/* 1, with the reason in why, if parent already holds rerecord_limit
 * recordings of (segment, variant), so a node of it may not record. Checked
 * when the recording would happen: a sibling may have recorded since a
 * WARMUP node was made. self: the WARMUP node that would record, or NULL
 * for a new one; an evicted one is counted already, and its recording
 * replaces that count (a review: counted twice, it turned EAGER). */
static int over_rerecord_limit(const cgt_tree *t, const node *parent, cgt_segment id, uint64_t variant,
                               const node *self, char why[WHY_BYTES]) {
  uint32_t recordings = count_recordings(parent, id, variant, self);
  if (recordings < t->opt.rerecord_limit)
    return 0;
  snprintf(why, WHY_BYTES, "rerecord limit: the parent already has %u recordings of this segment and variant",
           recordings);
  return 1;
}

static run_action decided(run_decision *d, run_action action, node *n) {
  d->action = action;
  d->target = n;
  return action;
}

/* The decision for a run of (id, variant) under t->cur, whose key group
 * (the children of t->cur with this run's key, see node_lookup) starts at
 * `first` (NULL: a key not seen here). Changes nothing; node_run carries it
 * out. In order:
 *
 *   REPLAY   a RECORDED node of the group whose liveness admits the values
 *            live now, unless the step is in warmup;
 *   WARMUP   in a step in warmup, the group's WARMUP or RECORDED node;
 *   WARMUP, EAGER (turning), RECORD
 *            the group's WARMUP node: WARMUP while its (segment, variant) has
 *            run fewer than warmup_runs times; EAGER if the parent is at
 *            rerecord_limit; else RECORD;
 *   EAGER    the group's EAGER or OVERFLOW node;
 *   OVERFLOW a new key of a segment declared uncapturable, or past the limit,
 *            where the parent has an OVERFLOW node of (segment, variant);
 *   and for a new node (every recording of the key had the wrong liveness,
 *   or a new key): OVERFLOW (made) for a segment declared uncapturable;
 *   past the limit, OVERFLOW (made) for a new key and EAGER (turning) for
 *   a re-record; else WARMUP or RECORD as for a WARMUP node. */
static run_action node_decide(const cgt_tree *t, node *first, cgt_segment id, const segment_rec *seg, uint64_t variant,
                              run_decision *d) {
  d->rerecord = 0;
  d->update_from = NULL;
  d->why[0] = '\0';
  int in_warmup = t->step_in_warmup;
  if (first && !in_warmup)
    for (node *c = first; c; c = c->next_same_key)
      if (c->state == NODE_RECORDED && node__liveness_ok(t, c))
        return decided(d, RUN_REPLAY, c);

  if (first) {
    node *warm = NULL, *recorded = NULL, *eager = NULL;
    for (node *c = first; c; c = c->next_same_key) {
      if (c->state == NODE_WARMUP && !warm)
        warm = c;
      else if (c->state == NODE_RECORDED && !recorded)
        recorded = c;
      else if ((c->state == NODE_EAGER || c->state == NODE_OVERFLOW) && !eager)
        eager = c;
    }
    if (in_warmup && (warm || recorded))
      return decided(d, RUN_WARMUP, warm ? warm : recorded);
    if (warm) {
      const warm_count *w = warm_find(t, id, variant);
      if ((w ? w->runs : 0) < t->opt.warmup_runs)
        return decided(d, RUN_WARMUP, warm);
      if (over_rerecord_limit(t, t->cur, id, variant, warm, d->why))
        return decided(d, RUN_EAGER, warm);
      return decided(d, RUN_RECORD, warm);
    }
    if (eager)
      return decided(d, RUN_EAGER, eager);
    d->rerecord = 1; /* every recording of this key has the wrong liveness */
  }

  /* A new key past the limit (a buffer passed as STATIC that moves every
   * step, say) runs on the one overflow node of its (segment, variant), so
   * the tree stops growing. A segment declared uncapturable has nothing but
   * such nodes: one per (parent, segment, variant), whatever its inputs. */
  int no_capture = (seg->flags & CGT_SEGMENT_NO_CAPTURE) != 0;
  node *overflow = first ? NULL : find_overflow(t->cur, id, variant);
  if (overflow && (no_capture || count_recordings(t->cur, id, variant, NULL) >= t->opt.rerecord_limit))
    return decided(d, RUN_OVERFLOW, overflow);

  /* A new node. */
  if (no_capture) {
    snprintf(d->why, WHY_BYTES, "declared uncapturable");
    return decided(d, RUN_OVERFLOW, NULL);
  }
  /* Past the limit nothing is captured, updates in place included: a buffer
   * at a new address at every call would otherwise take over, one update
   * after another, the recordings that replay (a fixed buffer's beside it),
   * and leave them nothing but the overflow node (tried after an audit, and
   * taken back: docs/api.md names the limit). */
  if (over_rerecord_limit(t, t->cur, id, variant, NULL, d->why))
    return decided(d, first ? RUN_EAGER : RUN_OVERFLOW, NULL);
  const warm_count *w = warm_find(t, id, variant);
  if (in_warmup || (w ? w->runs : 0) < t->opt.warmup_runs)
    return decided(d, RUN_WARMUP, NULL);
  if (!first)
    d->update_from = update__candidate(t, seg->n_inputs);
  return decided(d, RUN_RECORD, NULL);
}

/* ------------------------------------------------------------------ a run */

/* The head of the key group of this run under t->cur, or NULL. Programs
 * mostly take the same child as last time: try it first, against the run's
 * arguments, before building the key for the hash table, whose lookup
 * costs several dependent cache misses once the tree is larger than the
 * caches. */
static node *node_lookup(cgt_tree *t, cgt_segment id, const segment_rec *seg, uint64_t variant) {
  node *first = t->cur->hot_child;
  if (first && key_matches(t, first, id, variant, seg->n_inputs))
    return first;
  key_build(t, id, variant, seg->n_inputs, t->key_buf);
  HASH_FIND(hh, t->cur->children, t->key_buf, key_size(seg->n_inputs), first);
  t->cur->hot_child = first;
  return first;
}

static cgt_status node_run(cgt_tree *t, const run_decision *d, node *first, cgt_segment id, const segment_rec *seg,
                           uint64_t variant, cgt_value *outputs, node **created);

/* One run: the decision, then what it says, with the tree's device current
 * for everything that may reach the backend. A replay held back touches no
 * backend, so it alone runs without entering the device: on CUDA that
 * saves a cudaGetDevice per run, a good part of a held-back replay's cost.
 * CGT_MODE_EAGER keeps no tree and decides nothing. */
cgt_status node__run(cgt_tree *t, cgt_segment id, const segment_rec *seg, uint64_t variant, cgt_value *outputs) {
  int eager_mode = t->opt.mode == CGT_MODE_EAGER;
  run_decision d;
  node *first = NULL;
  cgt_status st = CGT_OK;
  int done = 0;
  if (!eager_mode) {
    first = node_lookup(t, id, seg, variant);
    done = node_decide(t, first, id, seg, variant, &d) == RUN_REPLAY && replay_held(t, d.target, outputs);
  }
  if (!done) {
    int saved = tree__device_enter(t);
    node *created = NULL;
    st = eager_mode ? run_eagerly(t, NULL, id, seg, variant, t->pool, outputs)
                    : node_run(t, &d, first, id, seg, variant, outputs, &created);
    pool_sync_end(t, st);
    if (st != CGT_OK && created)
      node_unlink_newest(t, created); /* no half-made nodes; after pool_sync_end, which may use its pool */
    tree__device_leave(t, saved);
  }
  /* Ask for the likely next node and its key now, while the caller works. */
  node *cur = t->cur;
  const node *next = cur->hot_child;
  if (next) {
    __builtin_prefetch(next);
    __builtin_prefetch(next + 1); /* its key, without waiting for the node to arrive */
  }
  if (cur->next_exec)
    __builtin_prefetch(cur->next_exec); /* a hint only: it may be stale, and prefetching cannot fault */
  return st;
}

/* Carries out node_decide's decision d for a run whose key group starts at
 * `first`. */
static cgt_status node_run(cgt_tree *t, const run_decision *d, node *first, cgt_segment id, const segment_rec *seg,
                           uint64_t variant, cgt_value *outputs, node **created) {
  run_action action = d->action;
  if (action == RUN_REPLAY)
    return replay(t, d->target, outputs);
  /* Anything but a replay launches what was held back first. */
  cgt_status st = fuse__flush(t);
  if (st != CGT_OK)
    return st;

  node *n = d->target;
  if (!n) {
    n = node_create(t, first, id, variant, seg->n_inputs);
    if (!n)
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for a new node");
    *created = n;
  }
  const char *why = d->why[0] ? d->why : NULL;
  switch (action) {
  case RUN_WARMUP:
    return run_warmup(t, n, seg, outputs);
  case RUN_RECORD:
    return record(t, n, seg, d->rerecord, d->update_from, outputs);
  case RUN_EAGER:
    return run_eager_node(t, n, seg, why, NODE_EAGER, outputs);
  case RUN_OVERFLOW:
    st = run_eager_node(t, n, seg, why, NODE_OVERFLOW, outputs);
    if (st == CGT_OK && *created && !(seg->flags & CGT_SEGMENT_NO_CAPTURE))
      tree__log(t, CGT_LOG_WARN,
                "segment '%s' (variant %llu) arrived with argument addresses not seen before after its parent node "
                "reached rerecord_limit (%u recordings): this and later new keys run eagerly on node %u. If a "
                "STATIC argument moves every step, pass it as DYNAMIC",
                seg->name, (unsigned long long)variant, t->opt.rerecord_limit, n->id);
    return st;
  case RUN_REPLAY:
    break;
  }
  cgt_assert(0); /* node_decide's replay returned above */
  return tree__fail(t, CGT_ERR_STATE, "node %u: node_decide chose action %d here", n->id, (int)action);
}

/* ---------------------------------------------------------------- pruning */

/* Removes every WARMUP node that no step has reached for prune_after_steps
 * steps, with its subtree. Such a node warmed up under a pool layout that
 * has not come back (or under a node that has since turned EAGER, whose
 * outputs moved out of the graph pool), so its key is unlikely to match
 * again; if it does, the node is simply made anew. In TREE mode there are
 * only WARMUP and EAGER nodes below a WARMUP node (its step was in warmup
 * from it on), so no recording is lost; in SEPARATE mode the subtree may
 * hold recordings, but none of them has run for as long either. Called at cgt_step_begin; it looks every
 * prune_after_steps / 2 steps, so a forgotten node lives at most 1.5 times
 * the limit, and the walk is linear in the nodes. The ids of the nodes that
 * stay do not change. */
void node__prune(cgt_tree *t) {
  if (t->step < t->next_prune_step)
    return;
  uint64_t limit = t->opt.prune_after_steps;
  t->next_prune_step = t->step + (limit / 2 ? limit / 2 : 1);
  if (t->step < limit)
    return;
  /* Parents come before children in id order, so one pass marks whole
   * subtrees: a node goes if it is a forgotten WARMUP node or its parent
   * goes; only the top of a subtree is unlinked from its parent. */
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    node *n = t->nodes[i];
    int parent_goes = n->parent != &t->root && n->parent->pruned;
    n->pruned = parent_goes || (n->state == NODE_WARMUP && t->step - n->last_step >= limit);
    if (n->pruned && !parent_goes)
      node__unlink(n);
  }
  node__remove_pruned(t, &t->stats.nodes_pruned);
}

void node__remove_pruned(cgt_tree *t, uint64_t *removed) {
  uint32_t kept = 0;
  for (uint32_t i = 0; i < t->n_nodes; i++) {
    node *n = t->nodes[i];
    if (!n->pruned) {
      t->nodes[kept++] = n;
      continue;
    }
    node__destroy(t, n); /* a parent before its children: each clears only its own table */
    t->stats.nodes--;
    (*removed)++;
  }
  t->n_nodes = kept;
}

/* ---------------------------------------------------------------- eviction */

void node__drop_recording(cgt_tree *t, node *n, const char *reason) {
  cgt_assert(n->state == NODE_RECORDED && !n->children);
  fuse__forget_node(t, n); /* its spans end here; those through it ended below, with the subtree */
  t->dev.ops->graph_destroy(&t->dev, n->graph, n->exec);
  if (n->exec_graph)
    t->dev.ops->graph_destroy(&t->dev, n->exec_graph, NULL);
  pool_checkpoint_free(n->ckpt);
  retire_own_pool(t, n);
  free(n->dead);
  free(n->placeholders);
  free(n->outputs);
  n->graph = n->exec = n->exec_graph = NULL;
  n->ckpt = NULL;
  n->own_pool = NULL;
  n->dead = NULL;
  n->placeholders = NULL;
  n->outputs = NULL;
  n->n_dead = n->n_placeholders = n->n_outputs = 0;
  n->ckpt_bytes = n->graph_bytes = 0;
  n->hot_child = NULL;
  n->next_exec = NULL;
  n->evictions++;
  n->evict_reason = reason;
  node_set_state(t, n, NODE_WARMUP, NULL);
  tree__log(t, CGT_LOG_INFO, "node %u (segment '%s') evicted: %s", n->id, t->segments[n->segment - 1].name, reason);
}
