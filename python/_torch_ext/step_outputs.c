/* step_outputs.c — a tree's step outputs whose storage may live, found by
 * address.
 *
 * segment.c hands out every output of a step as a tensor over a value of
 * the pool, and keeps those whose storage may still live on the tree's
 * step list: stale.c marks them when the step ends, and moves a .grad that
 * took one over. (An output over caller memory, a parameter a forward
 * saves, is never on it: no step reuses that memory.) Each tensor argument
 * of a call must also be looked up here by address: a tensor that lies in
 * a live output of this step (a saved activation unpacked by autograd, a
 * view y[1:], a .grad read by the optimizer) is passed to cgt_run as that
 * value, never as caller memory.
 *
 * A walk of the list per argument costs arguments x outputs, and a
 * training step has many of both: a compiled AdamW step of a model with
 * P parameters reads 4P tensors while the step's P gradients (and the
 * loss, and whatever else lives) are on the list. So the list is indexed
 * by page: a hash from each PAGE_BYTES-aligned page of device addresses to
 * the outputs that overlap it. A lookup hashes the page of its pointer and
 * checks the few outputs there (a page holds at most PAGE_BYTES of them,
 * more only where a dead output's memory was taken by a live one); a
 * parameter, which no output overlaps, costs one hash probe. An output
 * spanning n pages is in n buckets.
 *
 * Buckets are kept when they empty (the same pages come back at the next
 * step: pool addresses repeat), so a step costs no allocation once warm;
 * empty buckets are swept when their number has doubled since the last
 * sweep, so a pool that moves through address space leaves no garbage.
 * Out of host memory an output cannot be indexed: linking it fails with
 * MemoryError and nothing changes. The list itself is utlist.h's (uthash's
 * list macros): doubly linked, its head's step_prev the tail. */
#include <utlist.h>

#include "ext.h"

enum { PAGE_SHIFT = 20 }; /* 1 MiB pages */

struct tx_page_bucket {
  uintptr_t page;
  tx_out_ref **refs;
  uint32_t n, cap;
  UT_hash_handle hh;
};

static uintptr_t first_page(const tx_out_ref *r) { return (uintptr_t)r->ptr >> PAGE_SHIFT; }

static uintptr_t last_page(const tx_out_ref *r) {
  return ((uintptr_t)r->ptr + (r->bytes ? r->bytes - 1 : 0)) >> PAGE_SHIFT;
}

/* Removes r from the buckets of pages [from, to]. */
static void unindex(TreeObject *T, const tx_out_ref *r, uintptr_t from, uintptr_t to) {
  for (uintptr_t p = from; p <= to; p++) {
    tx_page_bucket *b;
    HASH_FIND(hh, T->step_pages, &p, sizeof p, b);
    for (uint32_t i = 0; b && i < b->n; i++)
      if (b->refs[i] == r) {
        b->refs[i] = b->refs[--b->n];
        break;
      }
  }
}

/* Drops the empty buckets once their number has doubled since the last sweep. */
static void sweep_if_grown(TreeObject *T) {
  if (HASH_COUNT(T->step_pages) < 2 * T->step_pages_swept + 64)
    return;
  tx_page_bucket *b, *tmp;
  HASH_ITER(hh, T->step_pages, b, tmp) {
    if (b->n == 0) {
      HASH_DEL(T->step_pages, b);
      free(b->refs);
      free(b);
    }
  }
  T->step_pages_swept = HASH_COUNT(T->step_pages);
}

/* The bucket of page p, made if there is none; NULL out of host memory. */
static tx_page_bucket *bucket_get(TreeObject *T, uintptr_t p) {
  tx_page_bucket *b;
  HASH_FIND(hh, T->step_pages, &p, sizeof p, b);
  if (b)
    return b;
  if (!(b = tx_calloc(1, sizeof *b)))
    return NULL;
  b->page = p;
  tx_hash_oomed = 0;
  HASH_ADD(hh, T->step_pages, page, sizeof b->page, b);
  if (tx_hash_oomed) {
    free(b);
    return NULL;
  }
  return b;
}

/* Puts r on the list and in its pages' buckets, making buckets and room
 * where there are none. */
static int link_ref(TreeObject *T, tx_out_ref *r) {
  uintptr_t from = first_page(r), to = last_page(r);
  for (uintptr_t p = from; p <= to; p++) {
    tx_page_bucket *b = bucket_get(T, p);
    if (b && b->n == b->cap) {
      uint32_t cap = b->cap ? 2 * b->cap : 4;
      tx_out_ref **grown = tx_realloc(b->refs, cap * sizeof *grown);
      if (grown) {
        b->refs = grown;
        b->cap = cap;
      }
    }
    if (!b || b->n == b->cap) {
      if (p > from)
        unindex(T, r, from, p - 1);
      PyErr_NoMemory();
      return -1;
    }
    b->refs[b->n++] = r;
  }
  DL_PREPEND2(T->step_outputs, r, step_prev, step_next);
  r->on_step_list = 1;
  return 0;
}

int tx_step_outputs_link(TreeObject *T, tx_out_ref *r) {
  sweep_if_grown(T);
  return link_ref(T, r);
}

int tx_step_outputs_put_back(TreeObject *T, tx_out_ref *r) {
  return link_ref(T, r); /* no sweep: the buckets r was in, and their room, are still there */
}

void tx_step_outputs_unlink(TreeObject *T, tx_out_ref *r) {
  if (!r->on_step_list)
    return;
  unindex(T, r, first_page(r), last_page(r));
  DL_DELETE2(T->step_outputs, r, step_prev, step_next);
  r->step_prev = r->step_next = NULL;
  r->on_step_list = 0;
}

tx_out_ref *tx_step_outputs_take(TreeObject *T) {
  tx_out_ref *head = T->step_outputs;
  T->step_outputs = NULL;
  for (tx_out_ref *r = head; r; r = r->step_next)
    r->on_step_list = 0; /* still chained through step_next, for the caller's walk */
  tx_page_bucket *b, *tmp;
  HASH_ITER(hh, T->step_pages, b, tmp) {
    b->n = 0;
  }
  return head;
}

tx_out_ref *tx_step_output_at(TreeObject *T, void *ptr, size_t span) {
  uintptr_t p = (uintptr_t)ptr >> PAGE_SHIFT;
  tx_page_bucket *b;
  HASH_FIND(hh, T->step_pages, &p, sizeof p, b);
  for (uint32_t i = 0; b && i < b->n; i++) {
    tx_out_ref *o = b->refs[i];
    if (tx_range_inside(ptr, span, o->ptr, o->bytes))
      return o;
  }
  return NULL;
}

void tx_step_outputs_free(TreeObject *T) {
  tx_page_bucket *b, *tmp;
  HASH_ITER(hh, T->step_pages, b, tmp) {
    HASH_DEL(T->step_pages, b);
    free(b->refs);
    free(b);
  }
  T->step_pages_swept = 0;
}

int tx_step_outputs_check(TreeObject *T) {
  size_t linked = 0;
  for (tx_out_ref *r = T->step_outputs; r; r = r->step_next) {
    if (!r->on_step_list || (r->step_next ? r->step_next->step_prev != r : T->step_outputs->step_prev != r))
      return -1;
    for (uintptr_t p = first_page(r); p <= last_page(r); p++) {
      tx_page_bucket *b;
      HASH_FIND(hh, T->step_pages, &p, sizeof p, b);
      int found = 0;
      for (uint32_t i = 0; b && i < b->n && !found; i++)
        found = b->refs[i] == r;
      if (!found)
        return -1;
    }
    linked += (size_t)(last_page(r) - first_page(r) + 1);
  }
  size_t indexed = 0;
  tx_page_bucket *b, *tmp;
  HASH_ITER(hh, T->step_pages, b, tmp) {
    indexed += b->n;
  }
  return indexed == linked ? 0 : -1;
}

int tx_step_holds_check(const TreeObject *T) {
  uint64_t saved = 0, tied = 0;
  if (!TX.storage_mark) /* the step's outputs are listed only where they are marked (tx_stale_watch) */
    return 0;
  /* Caller memory is never listed: a hold it kept shows as a count of the
   * tree's that no listed record makes up. */
  for (const tx_out_ref *r = T->step_outputs; r; r = r->step_next) {
    uint64_t by_pair = r->views_unknown;
    for (uint32_t k = 0; k < r->n_view_pairs; k++) {
      if (!r->views_by[k].pair)
        return -1; /* pair 0 is counted in views_unknown */
      for (uint32_t m = 0; m < k; m++)
        if (r->views_by[m].pair == r->views_by[k].pair)
          return -1; /* one entry per pair */
      by_pair += r->views_by[k].n;
    }
    if (by_pair != r->saved_views)
      return -1;
    if (r->step != T->step)
      continue;
    saved += (uint64_t)(r->counted && r->saved);
    tied += (uint64_t)(r->tied_saved != 0) + r->saved_views;
  }
  return saved == T->saved_alive && tied == T->tied_saved_alive ? 0 : -1;
}
