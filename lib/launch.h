/* launch.h — the context a launch function runs in (launch.c). */
#ifndef CGT_LAUNCH_H
#define CGT_LAUNCH_H

#include <stdint.h>

#include "cgtree.h"
#include "mem_ref.h"
#include "pool.h"

typedef struct segment_rec segment_rec;

/* One allocation made through cgt_launch_alloc. */
typedef struct launch_alloc {
  void *ptr;
  size_t bytes;
  uint8_t freed;
  uint8_t kept; /* holds an output */
} launch_alloc;

/* An output of the launch at hand: its memory as cgt_launch_set_output
 * named it; its block and pool once launch__finish found them. */
typedef struct launch_output {
  mem_ref mem;
  uint8_t set;
} launch_output;

/* The context of the launch function being called. Its arrays belong to the
 * tree and grow as needed, so calling a launch function allocates nothing
 * once they are large enough. */
struct cgt_launch {
  cgt_tree *tree;
  int active;
  const segment_rec *seg;
  uint64_t variant;
  pool *pool; /* where cgt_launch_alloc takes memory */
  int oom;    /* an allocation failed for lack of memory */
  uint32_t n_inputs;
  mem_ref *in; /* set by the caller through launch__set_input */
  uint32_t in_cap;
  uint32_t n_outputs;
  launch_output *out;
  uint32_t out_cap;
  launch_alloc *allocs;
  uint32_t n_allocs;
  uint32_t allocs_cap;
};

/* Readies the context for seg's launch function, allocating from pl; the
 * inputs are the caller's to set (launch__set_input) before launch__call. */
cgt_status launch__prepare(cgt_tree *t, const segment_rec *seg, uint64_t variant, pool *pl);
void launch__set_input(cgt_tree *t, uint32_t i, mem_ref in);
cgt_status launch__call(cgt_tree *t);
cgt_status launch__finish(cgt_tree *t);
/* Output o of the finished launch: its memory and (after launch__finish)
 * the block that holds it. */
const mem_ref *launch__output(const cgt_tree *t, uint32_t o);
/* Gives back every allocation the launch still holds (a failed run). */
void launch__rollback(cgt_tree *t);
/* The launch's allocations are no longer its own to roll back: they belong
 * to values now, or (before a new launch) to nobody the launch knows. */
void launch__disown_allocations(cgt_tree *t);
/* Frees the context's arrays (the tree is being destroyed). */
void launch__destroy(cgt_tree *t);

#endif /* CGT_LAUNCH_H */
