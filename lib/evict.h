/* evict.h — the recording budget (evict.c): max_graphs and max_graph_bytes
 * bound the recorded graphs a tree holds; past them, the least recently
 * replayed recording off the current path goes, with its subtree. */
#ifndef CGT_EVICT_H
#define CGT_EVICT_H

#include <stddef.h>
#include <stdint.h>

typedef struct cgt_tree cgt_tree;
typedef struct node node;

/* Why a recording was evicted: one table for the reasons the node list
 * shows (cgt_node_info.evict_reason, static strings). */
#define EVICT_REASON_MAP(X)                                                                         \
  X(GRAPHS, "recording budget: more than max_graphs recorded graphs; least recently replayed")     \
  X(BYTES, "recording budget: more than max_graph_bytes in graphs and checkpoints; least recently replayed")

typedef enum evict_reason {
#define EVICT__ENUM(name, text) EVICT_##name,
  EVICT_REASON_MAP(EVICT__ENUM)
#undef EVICT__ENUM
  EVICT_REASON_COUNT
} evict_reason;

/* What n's recording holds against max_graph_bytes: its checkpoint's host
 * bytes, the backend's estimate of its executables, and its private pool
 * (CGT_MODE_SEPARATE). */
size_t evict__node_bytes(cgt_tree *t, const node *n);
/* After a recording: evicts least recently used recordings off the current
 * path until the tree is within its budget, or nothing more may go. Nothing
 * may be held back (deferred launch flushes before recording). Cannot fail. */
void evict__enforce(cgt_tree *t);
/* The recorded graphs the tree holds now and their bytes. */
void evict__totals(const cgt_tree *t, uint64_t *graphs, size_t *bytes);
/* Checks for tree__check: eviction reasons and budget bytes agree with the
 * nodes' states. 1 if they hold, else 0 with why. */
int evict__check(const cgt_tree *t, char *why, size_t why_bytes);

#endif /* CGT_EVICT_H */
