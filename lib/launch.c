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
    if (range_inside(p, n, l->in[i].ptr, l->in[i].bytes))
      return (int)i;
  return -1;
}

cgt_status launch__prepare(cgt_tree *t, const segment_rec *seg, uint64_t variant, pool *pl) {
  cgt_launch *l = &t->launch;
  if (!tree__grow(t, (void **)&l->in, &l->in_cap, seg->n_inputs, sizeof *l->in) ||
      !tree__grow(t, (void **)&l->out, &l->out_cap, seg->n_outputs, sizeof *l->out))
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory for the launch context");
  l->tree = t;
  l->seg = seg;
  l->variant = variant;
  l->pool = pl;
  l->oom = 0;
  l->n_inputs = seg->n_inputs;
  l->n_outputs = seg->n_outputs;
  l->n_allocs = 0;
  memset(l->out, 0, l->n_outputs * sizeof *l->out);
  return CGT_OK;
}

void launch__set_input(cgt_tree *t, uint32_t i, mem_ref in) {
  cgt_assert(i < t->launch.n_inputs);
  t->launch.in[i] = in;
}

const mem_ref *launch__output(const cgt_tree *t, uint32_t o) {
  cgt_assert(o < t->launch.n_outputs);
  return &t->launch.out[o].mem;
}

void launch__disown_allocations(cgt_tree *t) { t->launch.n_allocs = 0; }

void launch__destroy(cgt_tree *t) {
  cgt_launch *l = &t->launch;
  free(l->in), free(l->out), free(l->allocs);
  l->in = NULL, l->out = NULL, l->allocs = NULL;
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
    if (!l->out[i].set)
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
    mem_ref *out = &l->out[o].mem;
    launch_alloc *a = launch_alloc_containing(l, out->ptr, out->bytes);
    if (a) {
      a->kept = 1;
      out->block = a->ptr;
      out->pool = l->pool;
      continue;
    }
    int in = launch_input_containing(l, out->ptr, out->bytes);
    if (in < 0)
      return tree__fail(t, CGT_ERR_SEGMENT_FAILED, "segment '%s': output %u points into memory freed in the launch",
                        l->seg->name, o);
    out->block = l->in[in].block;
    out->pool = l->in[in].pool;
  }
  for (size_t i = 0; i < l->n_allocs; i++)
    if (!l->allocs[i].freed && !l->allocs[i].kept) {
      pool_free(l->pool, l->allocs[i].ptr);
      l->allocs[i].freed = 1;
    }
  return CGT_OK;
}

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

void *cgt_launch_input(cgt_launch *l, uint32_t i) { return launch_usable(l) && i < l->n_inputs ? l->in[i].ptr : NULL; }

size_t cgt_launch_input_bytes(cgt_launch *l, uint32_t i) {
  return launch_usable(l) && i < l->n_inputs ? l->in[i].bytes : 0;
}

uint64_t cgt_launch_variant(cgt_launch *l) { return launch_usable(l) ? l->variant : 0; }

cgt_status cgt_launch_alloc(cgt_launch *l, size_t bytes, void **ptr) {
  if (!l)
    return CGT_ERR_INVALID_ARGUMENT;
  if (!l->active)
    return tree__fail(l->tree, CGT_ERR_STATE, "cgt_launch_alloc: called outside a launch function");
  if (!ptr)
    return tree__fail(l->tree, CGT_ERR_INVALID_ARGUMENT, "cgt_launch_alloc: ptr is NULL");
  cgt_tree *t = l->tree;
  if (!tree__grow(t, (void **)&l->allocs, &l->allocs_cap, l->n_allocs + 1, sizeof *l->allocs)) {
    l->oom = 1; /* the run fails with CGT_ERR_OUT_OF_MEMORY, as for pool memory */
    return tree__fail(t, CGT_ERR_OUT_OF_MEMORY, "no host memory to track launch allocations");
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
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_launch_set_output: output %u needs a pointer and bytes > 0", i);
  if ((uintptr_t)ptr > UINTPTR_MAX - bytes)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT, "cgt_launch_set_output: output %u overflows the address space", i);
  if (!launch_alloc_containing(l, ptr, bytes) && launch_input_containing(l, ptr, bytes) < 0)
    return tree__fail(t, CGT_ERR_INVALID_ARGUMENT,
                      "cgt_launch_set_output: output %u (%p, %zu bytes) lies neither in an allocation of this launch "
                      "nor inside an input",
                      i, ptr, bytes);
  l->out[i].mem = (mem_ref){ptr, bytes, NULL, NULL};
  l->out[i].set = 1;
  return CGT_OK;
}
