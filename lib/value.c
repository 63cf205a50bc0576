/* value.c — value slots: generations, liveness, and the step's values.
 *
 * A value is what a segment output becomes: a handle the caller passes to
 * later runs, reads with cgt_value_ptr, copies out, and releases. A slot's
 * generation moves on whenever the value dies (release or step end), so an
 * old handle can never reach memory that has since been handed to someone
 * else: every use of a dead value is reported as CGT_ERR_STALE_VALUE and
 * counted.
 *
 * A handle is 64 bits:
 *
 *   bits 63..52  the tree's tag (1..4095): a handle given to another tree is
 *                CGT_ERR_INVALID_ARGUMENT and changes nothing there
 *   bits 51..20  the slot's generation (32 bits)
 *   bits 19..0   the slot's index + 1 (so at most 1,048,575 values are live
 *                at once, and 0 is never a handle)
 *
 * Tags come from a process-wide counter, so trees made one after another get
 * different tags until 4095 trees have been made; only a tree and one made
 * 4095 trees later share a tag (a handle passed between those two is then
 * caught only when its slot's generation differs). A slot whose generation
 * would wrap around is retired instead of reused, so a stale handle can never
 * become valid again: wraparound cannot happen, at the price of one slot per
 * 2^32 deaths of a slot.
 *
 * The values of one step also form the *step values* (t->step_values; not
 * the path of nodes): an array in creation order with one liveness bit
 * each; a value's *position* is its index there. A recorded node lists the positions whose
 * death it relies on (node.c), so a replay tests a few bits.
 *
 * Aliases and views share their input's pool block. The first value made in
 * a block counts the block's live values (refs); every later value in it
 * names that slot as its owner, so a release knows in O(1) whether it let go
 * of the block's last value. An owner that dies before its aliases keeps its
 * slot (not its handle, which is stale at once) until the count reaches 0.
 * A checkpoint restore lists the blocks live values hold, sorted, once.
 *
 * Slots are recycled through a free list and the arrays only ever grow, so
 * once a program has reached its widest step, making values allocates
 * nothing on the host.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tree_internal.h"

static uint32_t value_index(cgt_value v) { return value__slot_of(v); }
static uint32_t value_gen(cgt_value v) { return (uint32_t)(v.bits >> HANDLE_INDEX_BITS); }
static uint32_t value_tag(cgt_value v) { return (uint32_t)(v.bits >> (HANDLE_INDEX_BITS + HANDLE_GEN_BITS)); }

uint32_t value__new_tag(void) {
  static atomic_uint next_tag;
  return atomic_fetch_add(&next_tag, 1u) % ((1u << HANDLE_TAG_BITS) - 1u) + 1u;
}

/* ------------------------------------------------------- block references */

/* The slot that counts the live values of slot i's block (VALUE_NONE when
 * the value lies in no block). */
static value_slot *owner_of(cgt_tree *t, const value_slot *s) {
  return s->owner == VALUE_NONE ? NULL : &t->slots[s->owner];
}

/* Puts slot i on the free list once nothing needs it: it is dead and counts
 * no live values. A slot whose generation wrapped is retired instead. */
static void slot_maybe_free(cgt_tree *t, uint32_t i) {
  value_slot *s = &t->slots[i];
  if (s->live || s->refs || s->gen == 0)
    return;
  s->owner = VALUE_NONE;
  s->next_free = t->free_slot;
  t->free_slot = i;
  t->n_free_slots++;
}

/* ------------------------------------------------------------------ slots */

cgt_status value__resolve(cgt_tree *t, cgt_value v, value_slot **out) {
  /* The common case first, in one test: a live value of this tree. An
   * index field of 0 wraps around to an index past every slot. */
  uint32_t i = value_index(v);
  value_slot *s = i < t->n_slots ? &t->slots[i] : NULL;
  if (s && value_tag(v) == t->tag && s->live && s->gen == value_gen(v)) {
    *out = s;
    return CGT_OK;
  }
  /* Then what is wrong with it, in the order of the handle's fields. */
  if ((v.bits & HANDLE_MAX_SLOTS) == 0)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "value %#llx is not a value handle (0 is never a valid value)",
                      (unsigned long long)v.bits);
  if (value_tag(v) != t->tag)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT,
                      "value %#llx belongs to another tree (its tag is %u, this tree's is %u)",
                      (unsigned long long)v.bits, value_tag(v), t->tag);
  if (!s)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "value %#llx was never made by this tree",
                      (unsigned long long)v.bits);
  t->stats.stale_uses++;
  return tree__fail(t, CGT_ERR_STALE_VALUE, "value %#llx is stale: it was released or its step has ended",
                    (unsigned long long)v.bits);
}

/* Makes room for n more values, so that a run can hand out all its outputs
 * or fail before changing anything. */
cgt_status value__reserve(cgt_tree *t, uint32_t n) {
  uint32_t free_count = t->n_free_slots;
  if (free_count < n) {
    uint32_t old = t->n_slots, cap = t->n_slots, need = t->n_slots + (n - free_count);
    if (need > HANDLE_MAX_SLOTS)
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "at most %u values can be live at once", HANDLE_MAX_SLOTS);
    if (!tree__grow(t, (void **)&t->slots, &cap, need, sizeof *t->slots))
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for value slots");
    if (cap > HANDLE_MAX_SLOTS)
      cap = HANDLE_MAX_SLOTS;
    /* Thread the new slots onto the free list; generations start at 1. */
    for (uint32_t i = cap; i-- > old;) {
      memset(&t->slots[i], 0, sizeof t->slots[i]);
      t->slots[i].gen = 1;
      t->slots[i].owner = VALUE_NONE;
      t->slots[i].next_free = t->free_slot;
      t->free_slot = i;
      t->n_free_slots++;
    }
    t->n_slots = cap;
  }
  uint32_t need = t->n_step_values + n;
  if (need > t->step_values_cap) {
    uint32_t cap = t->step_values_cap;
    if (!tree__grow(t, (void **)&t->step_values, &cap, need, sizeof *t->step_values))
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for the step's values");
    uint32_t words = (cap + 63) / 64, live_words = t->values_words, pooled_words = t->values_words;
    if (!tree__grow_zeroed(t, (void **)&t->values_live, &live_words, words, sizeof *t->values_live) ||
        !tree__grow_zeroed(t, (void **)&t->values_pooled, &pooled_words, words, sizeof *t->values_pooled))
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for the step's values");
    t->values_words = live_words < pooled_words ? live_words : pooled_words;
    t->step_values_cap = cap;
  }
  return CGT_OK;
}

/* Memory whose address is fixed by a recording and part of a node key: a
 * value made there keeps this answer for life (slot.in_graph_pool), since
 * neither its pool nor the tree's pools change while it lives. */
int value__mem_in_graph_pool(const cgt_tree *t, const mem_ref *mem) {
  if (!mem->pool)
    return 0;
  if (t->opt.mode == CGT_MODE_SEPARATE)
    return mem->pool != t->side_pool;
  return mem->pool == t->pool;
}

/* Hands out a value; value__reserve must have made room. `shares` is a live
 * value known to lie in the same block (an input the output aliases, or an
 * earlier output of the same run in the same allocation), or VALUE_NONE for
 * a block no live value holds: the new value then counts the block's
 * values itself. */
cgt_value value__make(cgt_tree *t, mem_ref mem, uint32_t shares) {
  uint32_t i = t->free_slot;
  value_slot *s = &t->slots[i];
  t->free_slot = s->next_free;
  t->n_free_slots--;
  s->next_free = VALUE_NONE;
  s->live = 1;
  s->in_graph_pool = (uint8_t)value__mem_in_graph_pool(t, &mem);
  s->mem = mem;
  void *block = mem.block;
  s->value_pos = t->n_step_values;
  t->n_live++;
  if (!block)
    s->owner = VALUE_NONE;
  else if (shares != VALUE_NONE && !NEVER(t->slots[shares].mem.block != block))
    s->owner = t->slots[shares].owner;
  else
    s->owner = i;
  if (s->owner != VALUE_NONE)
    t->slots[s->owner].refs++;
  t->step_values[t->n_step_values] = i;
  uint64_t bit = (uint64_t)1 << (t->n_step_values % 64);
  t->values_live[t->n_step_values / 64] |= bit;
  if (s->in_graph_pool)
    t->values_pooled[t->n_step_values / 64] |= bit;
  else
    t->values_pooled[t->n_step_values / 64] &= ~bit;
  t->n_step_values++;
  cgt_value v = {(uint64_t)t->tag << (HANDLE_INDEX_BITS + HANDLE_GEN_BITS) | (uint64_t)s->gen << HANDLE_INDEX_BITS |
                 (uint64_t)(i + 1)};
  return v;
}

/* Kills slot i and drops its block reference; returns the owner slot if that
 * was the block's last live value (the caller may free the block), else
 * NULL. The owner slot goes back to the free list only now, so a value that
 * dies before its aliases keeps counting them. */
static value_slot *value_kill(cgt_tree *t, uint32_t i) {
  value_slot *s = &t->slots[i];
  t->values_live[s->value_pos / 64] &= ~((uint64_t)1 << (s->value_pos % 64));
  s->live = 0;
  t->n_live--;
  s->gen++; /* 0 after a wrap: retired, never handed out again */
  value_slot *o = owner_of(t, s);
  uint32_t owner = s->owner;
  int last = o && --o->refs == 0;
  slot_maybe_free(t, i);
  if (owner != VALUE_NONE && owner != i)
    slot_maybe_free(t, owner);
  return last ? o : NULL;
}

/* Ends the step for every value: all become stale. The caller resets the
 * pools, so no block is freed here one by one. */
void value__end_step(cgt_tree *t) {
  for (uint32_t p = 0; p < t->n_step_values; p++)
    if (t->values_live[p / 64] >> (p % 64) & 1)
      (void)value_kill(t, t->step_values[p]);
  t->n_step_values = 0;
}

static int compare_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return (x > y) - (x < y);
}

/* Sorts the distinct blocks of pl that live step values hold into
 * t->live_blocks, for a restore to keep (value__keep_live_block). */
cgt_status value__collect_live_blocks(cgt_tree *t, const pool *pl) {
  if (!tree__grow(t, (void **)&t->live_blocks, &t->live_blocks_cap, t->n_live ? t->n_live : 1, sizeof *t->live_blocks))
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory to list the live blocks");
  uint32_t n = 0;
  for (uint32_t p = 0; p < t->n_step_values; p++) {
    const value_slot *s = &t->slots[t->step_values[p]];
    if ((t->values_live[p / 64] >> (p % 64) & 1) && s->mem.block && s->mem.pool == pl)
      t->live_blocks[n++] = s->mem.block;
  }
  qsort(t->live_blocks, n, sizeof *t->live_blocks, compare_ptr);
  uint32_t d = 0;
  for (uint32_t i = 0; i < n; i++)
    if (!d || t->live_blocks[d - 1] != t->live_blocks[i])
      t->live_blocks[d++] = t->live_blocks[i];
  t->n_live_blocks = d;
  t->live_blocks_next = 0;
  return CGT_OK;
}

/* pool_restore's keep callback: calls come in address order, so one cursor
 * walks the sorted list. */
int value__keep_live_block(void *user, void *base) {
  cgt_tree *t = user;
  while (t->live_blocks_next < t->n_live_blocks && (uintptr_t)t->live_blocks[t->live_blocks_next] < (uintptr_t)base)
    t->live_blocks_next++;
  return t->live_blocks_next < t->n_live_blocks && t->live_blocks[t->live_blocks_next] == base;
}

cgt_status cgt_value_ptr(cgt_tree *t, cgt_value v, void **ptr, size_t *bytes) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!ptr && !bytes)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_value_ptr: ptr and bytes are both NULL");
  value_slot *s;
  /* A handle refused changes nothing: looked at before held-back work is
   * launched (the flush moves fused_launches). The flush kills and moves no
   * value, so s stays the value's slot. */
  cgt_status st = value__resolve(t, v, &s);
  if (st == CGT_OK)
    st = fuse__flush(t); /* the caller may touch the memory next */
  if (st != CGT_OK)
    return st;
  if (ptr)
    *ptr = s->mem.ptr;
  if (bytes)
    *bytes = s->mem.bytes;
  return CGT_OK;
}

cgt_status cgt_value_release(cgt_tree *t, cgt_value v) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_value_release: not allowed inside a launch function");
  value_slot *s = NULL;
  cgt_status st = value__resolve(t, v, &s);
  if (st != CGT_OK)
    return st;
  /* Free the block when this was its last value and the pool's layout is
   * the live values' to change (node__layout_owner says whose it is). */
  const value_slot *o = owner_of(t, s);
  int frees_block = o && o->refs == 1 && node__layout_owner(t, s->mem.pool) == LAYOUT_VALUES;
  if (frees_block && NEVER(!pool_block_bytes(s->mem.pool, s->mem.block)))
    return tree__fail(t, CGT_ERR_STATE, "cgt_value_release: block %p of the value is not allocated", s->mem.block);
  void *block = s->mem.block;
  pool *pl = s->mem.pool;
  (void)value_kill(t, value_index(v)); /* the block's last value exactly when o->refs was 1 */
  if (frees_block)
    pool_free(pl, block);
  return CGT_OK;
}

cgt_status cgt_value_copy_out(cgt_tree *t, cgt_value v, void *dst, size_t bytes) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_value_copy_out: not allowed inside a launch function");
  value_slot *s;
  /* Bad input changes nothing: checked before held-back work is launched
   * (the flush moves fused_launches). */
  cgt_status st = value__resolve(t, v, &s);
  if (st != CGT_OK)
    return st;
  if (!dst)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_value_copy_out: dst is NULL");
  if (bytes > s->mem.bytes)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_value_copy_out: %zu bytes asked, the value has %zu", bytes,
                      s->mem.bytes);
  if (bytes == 0)
    return CGT_OK;
  st = fuse__flush(t); /* the copy must read what held-back work writes; it leaves s as it was */
  if (st != CGT_OK)
    return st;
  int saved = tree__device_enter(t);
  st = t->dev.ops->copy(&t->dev, dst, s->mem.ptr, bytes);
  tree__device_leave(t, saved);
  if (st != CGT_OK)
    return tree__backend_fail(t, st, "cgt_value_copy_out");
  return CGT_OK;
}
