/* grow.h — the library's one growable array.
 *
 * Arrays that only ever grow (the tree's nodes, segments, chunks, step
 * values, launch allocations; the pool's chunks) double from 8 elements up
 * to what is needed, through the owner's own realloc so that the test hook
 * that fails host allocations sees every growth. A growth that fails leaves
 * the array and its capacity as they were.
 */
#ifndef CGT_GROW_H
#define CGT_GROW_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The owner's realloc: NULL on failure, with ptr untouched. */
typedef void *(*grow_realloc_fn)(void *owner, void *ptr, size_t bytes);

/* Grows *array, of *cap elements of elem_bytes, to hold at least need, and
 * at most max_cap elements. With zero, the new elements are zeroed. Returns
 * 1, or 0 with *array and *cap unchanged. */
static inline int cgt_grow(void **array, size_t *cap, size_t need, size_t max_cap, size_t elem_bytes, int zero,
                           grow_realloc_fn realloc_fn, void *owner) {
  if (need <= *cap)
    return 1;
  size_t n = *cap ? *cap : 8;
  while (n < need) {
    if (n > SIZE_MAX / 2)
      return 0;
    n *= 2;
  }
  if (n > max_cap || n > SIZE_MAX / elem_bytes)
    return 0;
  void *p = realloc_fn(owner, *array, n * elem_bytes);
  if (!p)
    return 0;
  if (zero)
    memset((char *)p + *cap * elem_bytes, 0, (n - *cap) * elem_bytes);
  *array = p;
  *cap = n;
  return 1;
}

#endif /* CGT_GROW_H */
