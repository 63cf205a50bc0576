/* cuda_check.h — what the standalone CUDA benchmark programs share (each
 * builds with one nvcc command, no library): a check that ends main() with
 * status 1 on a failed CUDA call, naming it, and a monotonic clock in us.
 */
#ifndef CGT_BENCH_CUDA_CHECK_H
#define CGT_BENCH_CUDA_CHECK_H

#include <cuda_runtime.h>

#include <stdio.h>
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

#endif
