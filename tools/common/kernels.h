/* kernels.h — the kernels that tests, benchmarks and the demo put in segments.
 *
 * A segment's launch function enqueues work on the stream cgt_launch_stream()
 * hands it. To write each scenario once and run it on every backend, the
 * work comes from a table of kernels with two flavours: "sim" enqueues
 * cgt_sim_launch() closures on a simulator stream, "cuda" launches real
 * kernels and cuBLAS on a cudaStream_t. Pick the table with
 * kernels_for(cgt_tree_backend(tree)).
 *
 * Every element-wise kernel works on n floats; n may be 0 (nothing is
 * enqueued, except that sum writes 0). Kernels are only enqueued: the result
 * is there once the stream has reached them (cgt_sync). Enqueued work is
 * captured when the stream is capturing, like any CUDA launch.
 *
 * Failures return a cgt_status (CGT_ERR_CAPTURE_FAILED when the device said
 * the stream's capture is broken, CGT_ERR_OUT_OF_MEMORY, else
 * CGT_ERR_BACKEND) and leave a one-line detail for last_error(). No CUDA
 * error is left behind for the caller's next cudaGetLastError().
 */
#ifndef CGT_KERNELS_H
#define CGT_KERNELS_H

#include <stddef.h>

#include "cgtree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-stream kernel context. CUDA: a cuBLAS handle bound to the stream in
 * CUBLAS_DEFAULT_MATH (no TF32), plus a side stream and two events for
 * fork_join. Sim: nothing. Create it outside any capture (cuBLAS allocates). */
typedef struct kern_ctx kern_ctx;

typedef struct kernels {
  const char *name; /* "sim" or "cuda" */

  cgt_status (*ctx_create)(void *stream, kern_ctx **out);
  void (*ctx_destroy)(kern_ctx *c); /* NULL is a no-op; waits for the ctx's work */

  /* Caller-owned device buffers (weights, inputs, results), outside any pool.
   * dev_alloc is 256-byte aligned. upload and download are synchronous with
   * the host but do not wait for other streams: cgt_sync the tree first when
   * its work writes or reads the buffer. Never call these inside a segment. */
  cgt_status (*dev_alloc)(size_t bytes, void **ptr);
  void (*dev_free)(void *ptr); /* NULL is a no-op */
  cgt_status (*upload)(void *dst_dev, const void *src_host, size_t bytes);
  cgt_status (*download)(void *dst_host, const void *src_dev, size_t bytes);

  /* Element-wise kernels on `stream`. out may equal an input (in place). */
  cgt_status (*fill)(void *stream, float *dst, float value, size_t n);
  cgt_status (*affine)(void *stream, const float *x, float a, float b, float *out, size_t n); /* out = a*x + b */
  cgt_status (*add)(void *stream, const float *x, const float *y, float *out, size_t n);     /* out = x + y */
  cgt_status (*relu)(void *stream, const float *x, float *out, size_t n);                    /* out = max(x, 0) */
  /* out[0] = the sum of x[0..n) in an order fixed by n alone, so equal inputs
   * give bit-equal sums on every run of a flavour. */
  cgt_status (*sum)(void *stream, const float *x, size_t n, float *out);
  /* Async copy of bytes between device buffers. */
  cgt_status (*copy)(void *stream, void *dst, const void *src, size_t bytes);
  /* out[m x n] = x[m x k] @ w[k x n], all row-major fp32. CUDA: cublasSgemm on
   * c's handle with `workspace` (256-byte aligned caller memory, e.g. from
   * cgt_launch_alloc) set by cublasSetWorkspace for this call; NULL means no
   * workspace at all, never the handle's default pool. Sim: a naive loop. */
  cgt_status (*gemm)(kern_ctx *c, void *stream, const float *x, const float *w, float *out, int m, int n, int k,
                     void *workspace, size_t workspace_bytes);

  /* What a careless segment does. Each is legal outside capture and illegal
   * inside it, where it breaks the capture the way the device does:
   *   stream_sync  CUDA cudaStreamSynchronize       sim cgt_sim_sync
   *   malloc       CUDA cudaMalloc + cudaFree        sim cgt_sim_malloc + cgt_sim_free
   *   memcpy       CUDA synchronous cudaMemcpy       sim cgt_sim_sync, then memcpy
   *   device_sync  CUDA cudaDeviceSynchronize        sim cgt_sim_sync
   * They return the device's verdict (CGT_ERR_CAPTURE_FAILED or CGT_ERR_STATE
   * during capture); a careless segment ignores it. memcpy copies nothing
   * when it fails. */
  cgt_status (*illegal_stream_sync)(void *stream);
  cgt_status (*illegal_malloc)(void *stream);
  cgt_status (*illegal_memcpy)(void *stream, void *dst, const void *src, size_t bytes);
  cgt_status (*illegal_device_sync)(void *stream);

  /* CUDA only (NULL on sim): y = 2*x on c's side stream, forked from `stream`
   * with an event and joined back with another, then y += 1 on `stream`.
   * Captured, it gives a graph with two branches. */
  cgt_status (*fork_join)(kern_ctx *c, void *stream, const float *x, float *y, size_t n);

  /* Detail of this thread's last failure in this flavour, "" if none. */
  const char *(*last_error)(void);
} kernels;

/* The table for a backend, or NULL if that flavour was not built (CUDA
 * without nvcc) or backend is CGT_BACKEND_AUTO (pass cgt_tree_backend()). */
const kernels *kernels_for(cgt_backend backend);

/* The tables themselves (kernels_cuda exists only when built with CUDA). */
extern const kernels kernels_sim;
#ifdef CGT_HAVE_CUDA
extern const kernels kernels_cuda;
#endif

#ifdef __cplusplus
}
#endif

#endif /* CGT_KERNELS_H */
