/* bench_cuda.c — the device calls the benchmarks make outside the library:
 * the GPU's name and versions, and a bare capture of a workload segment
 * (cudaStreamBeginCapture .. cudaGraphInstantiate around the same kernels a
 * segment's launch function enqueues), the floor a tree's recording is
 * compared with.
 */
#include <cuda_runtime.h>

#include "bench_util.h"

void bench_device_name(cgt_backend backend, char *buf, size_t n) {
  if (backend != CGT_BACKEND_CUDA) {
    snprintf(buf, n, "CPU simulator");
    return;
  }
  int dev = 0, drv = 0, rt = 0;
  struct cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(buf, n, "CUDA device (unknown)");
    return;
  }
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  snprintf(buf, n, "%s (driver %d, runtime %d)", prop.name, drv, rt);
}

static double us_since(double t0) { return (bench_now_ns() - t0) / 1e3; }

int bench_raw_record(workload *w, int segment_index, int reps, double *capture_us, double *instantiate_us,
                     double *total_us) {
  if (cgt_tree_backend(wl_tree(w)) != CGT_BACKEND_CUDA || reps < 1)
    return 0;
  const kernels *k = wl_kernels(w);
  cudaStream_t s = NULL;
  kern_ctx *ctx = NULL;
  void *scratch = NULL;
  size_t scratch_bytes = wl_raw_scratch_bytes(w, segment_index);
  double *cap = calloc((size_t)reps, sizeof *cap), *ins = calloc((size_t)reps, sizeof *ins),
         *tot = calloc((size_t)reps, sizeof *tot);
  int rc = -1;
  if (!cap || !ins || !tot)
    goto done;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
    goto done;
  if (k->ctx_create(s, &ctx) != CGT_OK || k->dev_alloc(scratch_bytes, &scratch) != CGT_OK)
    goto done;
  /* One eager run: module loads and cuBLAS's lazy setup happen outside the
   * timed captures, as the tree's warmup run does for its recordings. */
  if (wl_raw_enqueue(w, segment_index, s, ctx, wl_input(w, 0), scratch, scratch_bytes) != CGT_OK ||
      cudaStreamSynchronize(s) != cudaSuccess)
    goto done;
  for (int r = 0; r < reps; r++) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int ok = 0;
    double t0 = bench_now_ns();
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
      cgt_status st = wl_raw_enqueue(w, segment_index, s, ctx, wl_input(w, 0), scratch, scratch_bytes);
      cudaError_t e = cudaStreamEndCapture(s, &g);
      cap[r] = us_since(t0);
      double t1 = bench_now_ns();
      if (st == CGT_OK && e == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
          cudaGraphUpload(ge, s) == cudaSuccess) {
        ins[r] = us_since(t1);
        ok = cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
        tot[r] = us_since(t0);
      }
    }
    if (ge)
      (void)cudaGraphExecDestroy(ge);
    if (g)
      (void)cudaGraphDestroy(g);
    if (!ok)
      goto done;
  }
  *capture_us = bench_median(cap, (size_t)reps);
  *instantiate_us = bench_median(ins, (size_t)reps);
  *total_us = bench_median(tot, (size_t)reps);
  rc = 1;
done:
  if (rc < 0)
    fprintf(stderr, "bench_raw_record: failed (CUDA: %s; workload: %s)\n", cudaGetErrorString(cudaGetLastError()),
            wl_last_error());
  if (s)
    (void)cudaStreamSynchronize(s);
  k->dev_free(scratch);
  k->ctx_destroy(ctx);
  if (s)
    (void)cudaStreamDestroy(s);
  free(cap), free(ins), free(tot);
  return rc;
}
