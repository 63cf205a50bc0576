/* cuda_check.h — what the standalone CUDA benchmark programs share (each
 * builds with one nvcc command, no library): a check that ends main() with
 * status 1 on a failed CUDA call, naming it, a monotonic clock in us, and
 * the memcpy node of a captured graph (a DYNAMIC input's copy).
 */
#ifndef CGT_BENCH_CUDA_CHECK_H
#define CGT_BENCH_CUDA_CHECK_H

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

static inline double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* *out: g's memcpy node (the last, where it has several), or NULL if it
 * has none. */
static inline cudaError_t graph_memcpy_node(cudaGraph_t g, cudaGraphNode_t *out) {
  size_t n = 0;
  *out = NULL;
  cudaError_t e = cudaGraphGetNodes(g, NULL, &n);
  cudaGraphNode_t *nodes = e == cudaSuccess ? (cudaGraphNode_t *)calloc(n ? n : 1, sizeof *nodes) : NULL;
  if (e == cudaSuccess && !nodes)
    e = cudaErrorMemoryAllocation;
  if (e == cudaSuccess)
    e = cudaGraphGetNodes(g, nodes, &n);
  for (size_t i = 0; e == cudaSuccess && i < n; i++) {
    cudaGraphNodeType ty;
    e = cudaGraphNodeGetType(nodes[i], &ty);
    if (e == cudaSuccess && ty == cudaGraphNodeTypeMemcpy)
      *out = nodes[i];
  }
  free(nodes);
  return e;
}

#endif
