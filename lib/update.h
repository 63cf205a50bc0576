/* update.h — update in place (update.c): a run that would record a new node
 * only because STATIC arguments moved updates its sibling's executable
 * instead, so reloaded parameters do not grow the tree. */
#ifndef CGT_UPDATE_H
#define CGT_UPDATE_H

#include <stdint.h>

#include "cgtree.h"

typedef struct cgt_tree cgt_tree;
typedef struct node node;
typedef struct run_prep run_prep;

/* A recording whose last capture or update is younger than this many steps
 * is not updated: its old addresses may still be in use (double-buffered
 * weights passed as STATIC), so a new node is recorded for the new ones. */
#define UPDATE_QUIET_STEPS 4

/* For a new key under t->cur (its key in t->key_buf, n_args arguments): the
 * RECORDED child of t->cur whose key differs from it only in STATIC
 * addresses and which may replay now, or NULL. Changes nothing. */
node *update__candidate(const cgt_tree *t, uint32_t n_args);
/* 1 if the capture just finished (r, the launch's outputs, the pool) left
 * everything a replay of `from` depends on exactly as from's recording did:
 * the pool layout, the outputs, the placeholders and the liveness list. */
int update__fits(cgt_tree *t, const node *from, const run_prep *r);
/* Brings r->graph's work into an executable: from's own, updated in place
 * (*updated = 1), or, where the device refuses, a new one in r->exec. On
 * failure nothing changed. */
cgt_status update__exec(cgt_tree *t, node *from, run_prep *r, int *updated);
/* Puts from's executable back to from's own graph after an update whose
 * launch failed. */
void update__exec_undo(cgt_tree *t, node *from);
/* n (the new node of this run) takes over from's place in the tree: its id,
 * children, counters, checkpoint and outputs, with the recording of r; from
 * is removed. Cannot fail. */
void update__adopt(cgt_tree *t, node *from, node *n, run_prep *r, int updated);

#endif /* CGT_UPDATE_H */
