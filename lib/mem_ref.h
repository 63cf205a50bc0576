/* mem_ref.h — a piece of device memory and the pool block that holds it.
 *
 * The one description of memory that values, run arguments, launch inputs
 * and outputs, and recorded outputs share: [ptr, ptr + bytes) lies inside
 * the pool block `block` of `pool`, or outside every pool (both NULL: the
 * caller's memory). A block is freed when the last value in it dies, so
 * every value records its block.
 */
#ifndef CGT_MEM_REF_H
#define CGT_MEM_REF_H

#include <stddef.h>

#include "pool.h"

typedef struct mem_ref {
  void *ptr;
  size_t bytes;
  void *block; /* base of the pool block that holds [ptr, ptr + bytes); NULL outside any pool */
  pool *pool;  /* the pool of block, or NULL */
} mem_ref;

#endif /* CGT_MEM_REF_H */
