/* value.c — value slots: generations, liveness, and the step's path.
 *
 * A value is what a segment output becomes: a handle the caller passes to
 * later runs, reads with cgt_value_ptr, copies out, and releases. Handles are
 * a slot index plus a generation packed into 64 bits. A slot's generation
 * moves on whenever the value dies (release or step end), so an old handle
 * can never reach memory that has since been handed to someone else: every
 * use of a dead value is reported as CGT_ERR_STALE_VALUE and counted.
 *
 * The values of one step also form the *path*: an array in creation order
 * with one liveness bit each. The replay check of the liveness invariant is
 * then a few word-wide ANDs against a node's recorded dead mask, and
 * restoring a checkpoint can find every block that must stay allocated.
 *
 * Slots are recycled through a free list and the arrays only ever grow, so
 * once a program has reached its widest step, making values allocates
 * nothing on the host.
 */
#include <string.h>

#include "tree_internal.h"

static uint32_t value_index(cgt_value v) { return (uint32_t)(v.bits & 0xffffffffu) - 1u; }
static uint32_t value_gen(cgt_value v) { return (uint32_t)(v.bits >> 32); }

cgt_status value__resolve(cgt_tree *t, cgt_value v, value_slot **out) {
  if (v.bits == 0 || (uint32_t)(v.bits & 0xffffffffu) == 0)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "value 0 is never a valid value");
  uint32_t i = value_index(v);
  if (i >= t->n_slots)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "value %#llx was never made by this tree",
                      (unsigned long long)v.bits);
  value_slot *s = &t->slots[i];
  if (!s->live || s->gen != value_gen(v)) {
    t->stats.stale_uses++;
    return tree__fail(t, CGT_ERR_STALE_VALUE, "value %#llx is stale: it was released or its step has ended",
                      (unsigned long long)v.bits);
  }
  *out = s;
  return CGT_OK;
}

/* Makes room for n more values, so that a run can hand out all its outputs
 * or fail before changing anything. */
cgt_status value__reserve(cgt_tree *t, uint32_t n) {
  uint32_t free_count = 0;
  for (uint32_t i = t->free_slot; i != VALUE_NONE && free_count < n; i = t->slots[i].next_free)
    free_count++;
  if (free_count < n) {
    uint32_t old = t->n_slots, cap = t->n_slots, need = t->n_slots + (n - free_count);
    if (!tree__grow(t, (void **)&t->slots, &cap, need, sizeof *t->slots))
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for value slots");
    /* Thread the new slots onto the free list; generations start at 1. */
    for (uint32_t i = cap; i-- > old;) {
      memset(&t->slots[i], 0, sizeof t->slots[i]);
      t->slots[i].gen = 1;
      t->slots[i].next_free = t->free_slot;
      t->free_slot = i;
    }
    t->n_slots = cap;
  }
  uint32_t need = t->path_len + n;
  if (need > t->path_cap) {
    uint32_t cap = t->path_cap, bits_cap = t->path_cap;
    if (!tree__grow(t, (void **)&t->path, &cap, need, sizeof *t->path))
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for the path");
    uint32_t words_old = (bits_cap + 63) / 64, words = (cap + 63) / 64;
    uint64_t *live = tree__calloc(t, words, sizeof *live);
    uint64_t *pooled = tree__calloc(t, words, sizeof *pooled);
    if (!live || !pooled) {
      free(live);
      free(pooled);
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for the path");
    }
    if (t->path_live) {
      memcpy(live, t->path_live, words_old * sizeof *live);
      memcpy(pooled, t->path_pooled, words_old * sizeof *pooled);
    }
    free(t->path_live);
    free(t->path_pooled);
    t->path_live = live;
    t->path_pooled = pooled;
    t->path_cap = cap;
  }
  return CGT_OK;
}

/* Hands out a value; value__reserve must have made room. */
cgt_value value__make(cgt_tree *t, void *ptr, size_t bytes, void *block, pool *pl) {
  uint32_t i = t->free_slot;
  value_slot *s = &t->slots[i];
  t->free_slot = s->next_free;
  s->next_free = VALUE_NONE;
  s->live = 1;
  s->ptr = ptr;
  s->bytes = bytes;
  s->block = block;
  s->pool = pl;
  s->path_pos = t->path_len;
  t->path[t->path_len] = i;
  uint64_t bit = (uint64_t)1 << (t->path_len % 64);
  t->path_live[t->path_len / 64] |= bit;
  if (value__in_graph_pool(t, s))
    t->path_pooled[t->path_len / 64] |= bit;
  else
    t->path_pooled[t->path_len / 64] &= ~bit;
  t->path_len++;
  cgt_value v = {((uint64_t)s->gen << 32) | (uint64_t)(i + 1)};
  return v;
}

static void value_kill(cgt_tree *t, uint32_t i) {
  value_slot *s = &t->slots[i];
  t->path_live[s->path_pos / 64] &= ~((uint64_t)1 << (s->path_pos % 64));
  s->live = 0;
  s->gen++;
  s->next_free = t->free_slot;
  t->free_slot = i;
}

/* 1 if another live value of the path (not slot `except`) sits in block. */
int value__block_in_use(const cgt_tree *t, const pool *pl, const void *block, uint32_t except) {
  for (uint32_t p = 0; p < t->path_len; p++) {
    if (!(t->path_live[p / 64] >> (p % 64) & 1))
      continue;
    const value_slot *s = &t->slots[t->path[p]];
    if (t->path[p] != except && s->block == block && s->pool == pl)
      return 1;
  }
  return 0;
}

/* Values whose address is fixed by a recording and part of a node key. */
int value__in_graph_pool(const cgt_tree *t, const value_slot *s) {
  if (!s->pool)
    return 0;
  if (t->opt.mode == CGT_MODE_SEPARATE)
    return s->pool != t->side_pool;
  return s->pool == t->pool;
}

/* Ends the step for every value: all become stale. The caller resets the
 * pools, so no block is freed here one by one. */
void value__end_step(cgt_tree *t) {
  for (uint32_t p = 0; p < t->path_len; p++)
    if (t->path_live[p / 64] >> (p % 64) & 1)
      value_kill(t, t->path[p]);
  t->path_len = 0;
}

cgt_status cgt_value_ptr(cgt_tree *t, cgt_value v, void **ptr, size_t *bytes) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!ptr && !bytes)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_value_ptr: ptr and bytes are both NULL");
  value_slot *s;
  cgt_status st = value__resolve(t, v, &s);
  if (st != CGT_OK)
    return st;
  if (ptr)
    *ptr = s->ptr;
  if (bytes)
    *bytes = s->bytes;
  return CGT_OK;
}

cgt_status cgt_value_release(cgt_tree *t, cgt_value v) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_value_release: not allowed inside a launch function");
  value_slot *s;
  cgt_status st = value__resolve(t, v, &s);
  if (st != CGT_OK)
    return st;
  uint32_t i = value_index(v);
  /* Free the block when this was its last value and the pool's layout is
   * ours to change: always for the eager allocators, and for the graph pool
   * only while it mirrors the path (otherwise a later restore frees it). */
  int owns_layout = s->pool == t->side_pool || t->opt.mode == CGT_MODE_EAGER ||
                    (s->pool == t->pool && t->opt.mode == CGT_MODE_TREE && t->pool_synced);
  if (s->block && owns_layout && !value__block_in_use(t, s->pool, s->block, i)) {
    cgt_status fs = pool_free(s->pool, s->block);
    if (NEVER(fs != CGT_OK))
      return tree__fail(t, CGT_ERR_STATE, "cgt_value_release: block %p of the value is not allocated", s->block);
  }
  value_kill(t, i);
  return CGT_OK;
}

cgt_status cgt_value_copy_out(cgt_tree *t, cgt_value v, void *dst, size_t bytes) {
  if (!t)
    return CGT_ERR_INVALID_ARGUMENT;
  if (t->launch.active)
    return tree__fail(t, CGT_ERR_STATE, "cgt_value_copy_out: not allowed inside a launch function");
  value_slot *s;
  cgt_status st = value__resolve(t, v, &s);
  if (st != CGT_OK)
    return st;
  if (!dst)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_value_copy_out: dst is NULL");
  if (bytes > s->bytes)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_value_copy_out: %zu bytes asked, the value has %zu", bytes,
                      s->bytes);
  if (bytes == 0)
    return CGT_OK;
  int saved = tree__device_enter(t);
  st = t->dev.ops->copy(&t->dev, dst, s->ptr, bytes);
  tree__device_leave(t, saved);
  if (st != CGT_OK)
    return tree__backend_fail(t, st, "cgt_value_copy_out");
  return CGT_OK;
}
