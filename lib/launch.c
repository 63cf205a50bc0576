/* launch.c — the context a launch function runs in.
 *
 * A segment's launch function is called for warmup, for recording and for
 * eager runs, never for replay. While it runs it may ask for its inputs,
 * allocate pool memory, free temporaries and name its outputs. Everything it
 * allocates is remembered here so that, when it returns, we can tell outputs
 * (kept) from temporaries (freed) and, if it failed, give back everything it
 * took: a failed run leaves the pool as it found it.
 *
 * An output either lies inside an allocation of this launch, or inside an
 * input (an alias or a view). Which block holds it decides how long that
 * block lives: a block is freed when the last value in it dies.
 *
 * The context lives inside the tree and is reused; its arrays grow to the
 * widest segment seen, so a launch allocates no host memory once warm.
 */
#include <string.h>

#include "tree_internal.h"

static int launch_usable(cgt_launch *l) { return l && l->active; }

static int range_inside(const void *p, size_t n, const void *base, size_t base_bytes) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
  return a >= b && a - b <= base_bytes && n <= base_bytes - (a - b);
}

/* The live allocation of this launch that contains [p, p+n), or NULL. */
static launch_alloc *launch_alloc_containing(cgt_launch *l, const void *p, size_t n) {
  for (size_t i = 0; i < l->n_allocs; i++)
    if (!l->allocs[i].freed && range_inside(p, n, l->allocs[i].ptr, l->allocs[i].bytes))
      return &l->allocs[i];
  return NULL;
}

static int launch_input_containing(cgt_launch *l, const void *p, size_t n) {
  for (uint32_t i = 0; i < l->n_inputs; i++)
    if (range_inside(p, n, l->in_ptr[i], l->in_bytes[i]))
      return (int)i;
  return -1;
}

cgt_status launch__prepare(cgt_tree *t, const segment_rec *seg, uint64_t variant, pool *pl) {
  cgt_launch *l = &t->launch;
  uint32_t need = seg->n_inputs > seg->n_outputs ? seg->n_inputs : seg->n_outputs;
  if (need > l->io_cap) {
    /* All arrays share io_cap, so grow each to the same new size. */
    uint32_t cap = l->io_cap < 4 ? 4 : l->io_cap;
    while (cap < need)
      cap *= 2;
    void **in_ptr = tree__calloc(t, cap, sizeof *in_ptr);
    size_t *in_bytes = tree__calloc(t, cap, sizeof *in_bytes);
    void **in_block = tree__calloc(t, cap, sizeof *in_block);
    pool **in_pool = tree__calloc(t, cap, sizeof *in_pool);
    void **out_ptr = tree__calloc(t, cap, sizeof *out_ptr);
    size_t *out_bytes = tree__calloc(t, cap, sizeof *out_bytes);
    uint8_t *out_set = tree__calloc(t, cap, sizeof *out_set);
    void **out_block = tree__calloc(t, cap, sizeof *out_block);
    pool **out_pool = tree__calloc(t, cap, sizeof *out_pool);
    if (!in_ptr || !in_bytes || !in_block || !in_pool || !out_ptr || !out_bytes || !out_set || !out_block ||
        !out_pool) {
      free(in_ptr), free(in_bytes), free(in_block), free(in_pool), free(out_ptr);
      free(out_bytes), free(out_set), free(out_block), free(out_pool);
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for the launch context");
    }
    free(l->in_ptr), free(l->in_bytes), free(l->in_block), free(l->in_pool), free(l->out_ptr);
    free(l->out_bytes), free(l->out_set), free(l->out_block), free(l->out_pool);
    l->in_ptr = in_ptr, l->in_bytes = in_bytes, l->in_block = in_block, l->in_pool = in_pool;
    l->out_ptr = out_ptr, l->out_bytes = out_bytes, l->out_set = out_set;
    l->out_block = out_block, l->out_pool = out_pool;
    l->io_cap = cap;
  }
  l->tree = t;
  l->seg = seg;
  l->variant = variant;
  l->pool = pl;
  l->oom = 0;
  l->n_inputs = seg->n_inputs;
  l->n_outputs = seg->n_outputs;
  l->n_allocs = 0;
  memset(l->out_set, 0, l->n_outputs);
  return CGT_OK;
}

cgt_status launch__call(cgt_tree *t) {
  cgt_launch *l = &t->launch;
  l->active = 1;
  cgt_status st = l->seg->launch(l, l->seg->user);
  l->active = 0;
  if (st != CGT_OK) {
    if (l->oom) {
      char detail[TREE_ERROR_BYTES];
      memcpy(detail, t->error, sizeof detail); /* the failed cgt_launch_alloc's message */
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "segment '%s': out of pool memory (launch returned %s): %s",
                        l->seg->name, cgt_status_name(st), detail);
    }
    return tree__fail(t, CGT_ERR_SEGMENT_FAILED, "segment '%s': launch function returned %s", l->seg->name,
                      cgt_status_name(st));
  }
  for (uint32_t i = 0; i < l->n_outputs; i++)
    if (!l->out_set[i])
      return tree__fail(t, CGT_ERR_SEGMENT_FAILED, "segment '%s': output %u was not set", l->seg->name, i);
  return CGT_OK;
}

/* Resolves the block behind every output, then frees the temporaries. Fails
 * (changing nothing) if an output points into memory freed in the launch. */
cgt_status launch__finish(cgt_tree *t) {
  cgt_launch *l = &t->launch;
  for (size_t i = 0; i < l->n_allocs; i++)
    l->allocs[i].kept = 0;
  for (uint32_t o = 0; o < l->n_outputs; o++) {
    launch_alloc *a = launch_alloc_containing(l, l->out_ptr[o], l->out_bytes[o]);
    if (a) {
      a->kept = 1;
      l->out_block[o] = a->ptr;
      l->out_pool[o] = l->pool;
      continue;
    }
    int in = launch_input_containing(l, l->out_ptr[o], l->out_bytes[o]);
    if (in < 0)
      return tree__fail(t, CGT_ERR_SEGMENT_FAILED, "segment '%s': output %u points into memory freed in the launch",
                        l->seg->name, o);
    l->out_block[o] = l->in_block[in];
    l->out_pool[o] = l->in_pool[in];
  }
  for (size_t i = 0; i < l->n_allocs; i++)
    if (!l->allocs[i].freed && !l->allocs[i].kept) {
      pool_free(l->pool, l->allocs[i].ptr);
      l->allocs[i].freed = 1;
    }
  return CGT_OK;
}

/* Gives back every allocation the launch still holds (a failed run). */
void launch__rollback(cgt_tree *t) {
  cgt_launch *l = &t->launch;
  for (size_t i = 0; i < l->n_allocs; i++)
    if (!l->allocs[i].freed) {
      pool_free(l->pool, l->allocs[i].ptr);
      l->allocs[i].freed = 1;
    }
  l->n_allocs = 0;
}

/* ------------------------------------------------------- the public calls */

void *cgt_launch_stream(cgt_launch *l) { return launch_usable(l) ? l->tree->dev.stream : NULL; }

void *cgt_launch_input(cgt_launch *l, uint32_t i) {
  return launch_usable(l) && i < l->n_inputs ? l->in_ptr[i] : NULL;
}

size_t cgt_launch_input_bytes(cgt_launch *l, uint32_t i) {
  return launch_usable(l) && i < l->n_inputs ? l->in_bytes[i] : 0;
}

uint64_t cgt_launch_variant(cgt_launch *l) { return launch_usable(l) ? l->variant : 0; }

cgt_status cgt_launch_alloc(cgt_launch *l, size_t bytes, void **ptr) {
  if (!l || !ptr)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!l->active)
    return tree__fail(l->tree, CGT_ERR_STATE, "cgt_launch_alloc: called outside a launch function");
  cgt_tree *t = l->tree;
  if (l->n_allocs == l->allocs_cap) {
    size_t cap = l->allocs_cap ? l->allocs_cap * 2 : 16;
    launch_alloc *a = tree__malloc(t, cap * sizeof *a);
    if (!a)
      return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory to track launch allocations");
    if (l->allocs)
      memcpy(a, l->allocs, l->n_allocs * sizeof *a);
    free(l->allocs);
    l->allocs = a;
    l->allocs_cap = cap;
  }
  void *p;
  t->dev.error[0] = '\0'; /* a refused chunk leaves its reason here */
  cgt_status st = pool_alloc(l->pool, bytes, &p);
  if (st != CGT_OK) {
    if (st == CGT_ERR_OUT_OF_MEMORY)
      l->oom = 1;
    return tree__fail(t, st, "cgt_launch_alloc: %zu bytes for segment '%s': %s", bytes, l->seg->name,
                      t->dev.error[0] ? t->dev.error : cgt_status_string(st));
  }
  launch_alloc *a = &l->allocs[l->n_allocs++];
  a->ptr = p;
  a->bytes = bytes;
  a->freed = 0;
  a->kept = 0;
  *ptr = p;
  return CGT_OK;
}

cgt_status cgt_launch_free(cgt_launch *l, void *ptr) {
  if (!l)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!l->active)
    return tree__fail(l->tree, CGT_ERR_STATE, "cgt_launch_free: called outside a launch function");
  for (size_t i = 0; i < l->n_allocs; i++) {
    launch_alloc *a = &l->allocs[i];
    if (a->ptr == ptr && !a->freed) {
      pool_free(l->pool, ptr);
      a->freed = 1;
      return CGT_OK;
    }
  }
  return tree__fail(l->tree, CGT_ERR_INVALID_ARGUMENT,
                    "cgt_launch_free: %p is not an allocation of this launch that is still held", ptr);
}

cgt_status cgt_launch_set_output(cgt_launch *l, uint32_t i, void *ptr, size_t bytes) {
  if (!l)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!l->active)
    return tree__fail(l->tree, CGT_ERR_STATE, "cgt_launch_set_output: called outside a launch function");
  cgt_tree *t = l->tree;
  if (i >= l->n_outputs)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_launch_set_output: segment '%s' has %u outputs, not %u",
                      l->seg->name, l->n_outputs, i + 1);
  if (!ptr || bytes == 0)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_launch_set_output: output %u needs a pointer and bytes > 0",
                      i);
  if ((uintptr_t)ptr > UINTPTR_MAX - bytes)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_launch_set_output: output %u overflows the address space", i);
  if (!launch_alloc_containing(l, ptr, bytes) && launch_input_containing(l, ptr, bytes) < 0)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT,
                      "cgt_launch_set_output: output %u (%p, %zu bytes) lies neither in an allocation of this launch "
                      "nor inside an input",
                      i, ptr, bytes);
  l->out_ptr[i] = ptr;
  l->out_bytes[i] = bytes;
  l->out_set[i] = 1;
  return CGT_OK;
}
