/* node.h — the nodes of the tree and one run through them (node.c).
 *
 * Included by tree_internal.h after its uthash set-up (a node is in its
 * parent's hash table); node.c's essay draws the state machine.
 */
#ifndef CGT_NODE_H
#define CGT_NODE_H

#include <stdint.h>

#include "cgtree.h"
#include "fuse.h"
#include "mem_ref.h"
#include "pool.h"

typedef struct segment_rec segment_rec;

/* A node's state; node.c's essay draws the machine and node_set_state
 * enforces it. The first three are cgt_node_state's. An OVERFLOW node runs
 * eagerly like an EAGER one (and reports itself as EAGER), but it also
 * serves every new key of its (segment, variant) under its parent: new
 * keys once the parent holds rerecord_limit recordings, and every key of a
 * segment declared uncapturable. */
typedef enum node_state {
  NODE_WARMUP = CGT_NODE_WARMUP,
  NODE_RECORDED = CGT_NODE_RECORDED,
  NODE_EAGER = CGT_NODE_EAGER,
  NODE_OVERFLOW
} node_state;

/* A recorded node reads a DYNAMIC argument (or a VALUE outside the graph
 * pool) from a placeholder in the pool that is refilled before each replay. */
typedef struct node_placeholder {
  uint32_t arg;
  void *ptr;
  size_t bytes;
  /* Where the backend supports it, the copy is an operation of the graph itself (a copy op)
   * and replay only repoints it when the argument moved; NULL: copied by a
   * separate copy before each launch. */
  void *copy_op;
  const void *src;      /* the source copy_op reads now */
  const void *next_src; /* the source of the replay at hand (held back: until its flush) */
} node_placeholder;

typedef struct node node;
struct node {
  uint32_t id; /* 1-based; 0 is the virtual root above the roots */
  node *parent;
  uint32_t depth;
  cgt_segment segment;
  uint64_t variant;
  node_state state; /* changed by node_set_state only */
  uint64_t replays;
  uint64_t eager_runs; /* cgt_node_info.eager_runs: every run of the launch
                          function outside a capture on this node, warmups
                          included (cgt_stats counts those apart) */
  const char *reason;  /* why EAGER or OVERFLOW: the tree's text (tree__intern) */
  uint8_t pruned;      /* node__prune: on its way out */

  /* Key under the parent (node.c: key_build). Nodes that share a key are
   * re-records for other liveness patterns: the first one is in the hash,
   * the others hang off it through next_same_key, in creation order. */
  uint64_t *key; /* stored right behind the node */
  size_t key_bytes;
  UT_hash_handle hh;
  node *next_same_key;
  node *children;  /* uthash head */
  node *hot_child; /* the key-group head last looked up under this node, or NULL */
  void *next_exec; /* the executable last replayed right after this node: prefetched, never used */

  /* A recording. */
  void *graph;
  void *exec;
  pool *own_pool;        /* CGT_MODE_SEPARATE: the node's private pool */
  pool_checkpoint *ckpt; /* CGT_MODE_TREE: the layout right after recording */
  size_t ckpt_bytes;
  uint32_t values_before; /* step values before this node's outputs */
  /* The liveness a recording needs, stored as the difference to its nearest
   * RECORDED ancestor A: the path positions of graph-pool values that were
   * dead when this node was recorded and are not in A's set (A's own
   * positions, A's ancestor's, and so on). Replaying A this step already
   * proved A's positions dead, and dead values stay dead, so a replay checks
   * only these: none in the common case. Along a chain the lists are
   * disjoint, so their memory is linear in the path. */
  uint32_t n_dead;
  uint32_t *dead;
  uint64_t last_step; /* the step this node last ran in (pruning of WARMUP nodes) */
  /* The recording budget and update in place (evict.c, update.c). */
  uint64_t last_use;        /* the tree's use clock at this node's last replay or recording: LRU order */
  uint64_t recorded_step;   /* the step of its last recording or update */
  void *exec_graph;         /* after an update in place: the graph exec was first instantiated from, whose
                               copy-op handles the placeholders hold (graph is the newest capture); else NULL */
  size_t graph_bytes;       /* what its recording holds for the budget: checkpoint and executable estimate */
  uint64_t evictions;       /* cgt_node_info.evictions */
  const char *evict_reason; /* static: why it was last evicted */
  uint64_t updates;         /* cgt_node_info.updates */
  uint8_t unreplayed;       /* recorded or updated since its last replay: not updated in place (update.c);
                               evicted so, still a recording to rerecord_limit (node.c, count_recordings) */
  uint8_t marked;           /* evict.c and update.c: in the subtree being walked */
  uint8_t recorded_below;   /* evict.c, while it picks a victim: a recording that may go lies below */
  /* cgt_tree_path_hash after a run of this node: the parent's, with this
   * node's (segment, variant) mixed in. Every successful run moves the path
   * to its node, so the path hash is the current node's, computed once. */
  uint64_t path_hash;
  uint32_t n_placeholders;
  node_placeholder *placeholders;
  uint32_t n_outputs;
  mem_ref *outputs; /* where the recording put its outputs; the same at every replay */

  /* Deferred launch (fuse.c). */
  uint64_t fused_runs; /* replays of this node launched inside fused launches */
  fuse_span *spans;    /* the spans that end at this node, each keyed by its first node */
};

/* The three words of each argument in a node key: its kind, its address
 * (0 for DYNAMIC) and its size. */
enum { KEY_STATIC = 1, KEY_VALUE = 2, KEY_DYNAMIC = 3 };

/* What a warmup or a recording holds while it is being made (its pool,
 * placeholders; for a recording also its outputs, liveness list, graph and
 * checkpoint); undone as one piece (node.c: prep_undo). */
typedef struct run_prep {
  pool *pl;
  node_placeholder *ph;
  uint32_t n_ph; /* placeholders allocated so far */
  mem_ref *outs;
  uint32_t n_dead;
  uint32_t *dead; /* see node.dead */
  void *graph;
  void *exec;
  pool_checkpoint *ckpt;
  int copies_in_graph; /* DYNAMIC copies are captured into the graph */
} run_prep;

cgt_status node__run(cgt_tree *t, cgt_segment id, const segment_rec *seg, uint64_t variant, cgt_value *outputs);
/* The liveness invariant: n may replay with the values live now. */
int node__liveness_ok(const cgt_tree *t, const node *n);
/* Evicts n's recording (evict.c decides which): its graph, executable,
 * checkpoint and private pool are given back, its fused spans dropped, and
 * n goes back to WARMUP for `reason` (a static string). Its children must
 * be gone already. Cannot fail. */
void node__drop_recording(cgt_tree *t, node *n, const char *reason);
/* Takes n out of its parent's key group. n must be the last of its group
 * or have no key group sharers behind it in the hash (node.c explains). */
void node__unlink(node *n);
/* Destroys every node marked `pruned`, whose tops the caller has unlinked,
 * keeping the others in id order; counts them in *removed. */
void node__remove_pruned(cgt_tree *t, uint64_t *removed);
void node__destroy(cgt_tree *t, node *n);
/* Enqueues n's own executable, its DYNAMIC copies reading next_src. */
cgt_status node__launch(cgt_tree *t, node *n);
void node__prune(cgt_tree *t);
/* Who owns the block layout of one of the tree's pools now, the one answer
 * to "may this block be freed, and must it be allocated": */
typedef enum layout_owner {
  LAYOUT_VALUES,     /* the live values: the pool holds exactly their blocks, and
                        the last value of a block frees it (side pool, CGT_MODE_EAGER's
                        pool, the graph pool while synced) */
  LAYOUT_CHECKPOINT, /* the checkpoints: a replay used the graph pool behind the
                        allocator's back; the next warmup or recording restores a
                        checkpoint, which frees the dead values' blocks */
  LAYOUT_NODE        /* the node of a private pool (CGT_MODE_SEPARATE): its blocks stay
                        until the node's next run clears the pool */
} layout_owner;
/* node__layout_owner(t, pl) gives it; it is inline in tree_internal.h,
 * which knows the tree, because every cgt_value_release asks. */
/* Starts the path at the root again (a new step, or a new tree): every value
 * is dead, so the graph pool and the side pool are emptied and synced. The
 * pool-sync fields of the tree (pool_synced, step_in_warmup, sync_undo*)
 * and t->cur are node.c's to write. */
void node__begin_step(cgt_tree *t);
/* The state cgt_tree_nodes reports: OVERFLOW reads as EAGER. */
cgt_node_state node__public_state(const node *n);

#endif /* CGT_NODE_H */
