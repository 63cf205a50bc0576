/* value.h — value handles and their slots (value.c). */
#ifndef CGT_VALUE_H
#define CGT_VALUE_H

#include <stdint.h>

#include "cgtree.h"
#include "mem_ref.h"
#include "pool.h"

/* A value slot. A slot is live from the run that made it until it is
 * released or the step ends; then its generation moves on and old handles go
 * stale. The handle layout is in value.c. */
typedef struct value_slot {
  uint32_t gen;
  uint32_t value_pos; /* index in t->step_values while live */
  uint32_t next_free;
  uint8_t live;
  uint8_t in_graph_pool; /* mem lies in the graph pool: its address is part of node keys (value__make) */
  mem_ref mem;           /* the value's memory and the block that holds it */
  uint32_t owner; /* the slot counting block's live values (maybe this one); VALUE_NONE without a block */
  uint32_t refs;  /* as an owner: live values in its block; the slot is not reused before this is 0 */
} value_slot;

#define VALUE_NONE UINT32_MAX

/* The handle's fields (value.c's essay draws the layout). */
#define HANDLE_INDEX_BITS 20
#define HANDLE_GEN_BITS 32
#define HANDLE_TAG_BITS 12
#define HANDLE_MAX_SLOTS ((1u << HANDLE_INDEX_BITS) - 1u)

/* The slot a handle names, whether or not it is live (value__resolve
 * checks): inline, because a run asks for every VALUE argument and output. */
static inline uint32_t value__slot_of(cgt_value v) { return (uint32_t)(v.bits & HANDLE_MAX_SLOTS) - 1u; }

cgt_status value__resolve(cgt_tree *t, cgt_value v, value_slot **out);
cgt_status value__reserve(cgt_tree *t, uint32_t n);
cgt_value value__make(cgt_tree *t, mem_ref mem, uint32_t shares);
cgt_status value__collect_live_blocks(cgt_tree *t, const pool *pl);
int value__keep_live_block(void *user, void *base);
void value__end_step(cgt_tree *t);
int value__mem_in_graph_pool(const cgt_tree *t, const mem_ref *mem);
uint32_t value__new_tag(void);

#endif /* CGT_VALUE_H */
