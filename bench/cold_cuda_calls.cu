// cold_cuda_calls.cu — what a CUDA call costs the host when the caller's
// work between calls has evicted the CPU's caches, as a training step does.
//
//   nvcc -O2 -arch=sm_90 -o /tmp/ccc bench/cold_cuda_calls.cu && /tmp/ccc
//
// A DYNAMIC input reaches a replay one of two ways: the graph's own memcpy
// node repointed at the new source (cudaGraphExecMemcpyNodeSetParams1D, what
// lib/node.c does) or a cudaMemcpyAsync into the placeholder before the
// launch of a graph without the copy. Each way is timed on the host, call by
// call, with the GPU idle (a stream sync after each launch, not timed), for a
// 256 KiB copy (the MLP training bench's input batch) and 8 kernels:
//
//   cold 0   the calls back to back, as microbenchmarks run them;
//   cold 1   64 MiB of host memory touched before each pair of calls (not
//            timed), as a step's Python and autograd work between two
//            compiled calls does.
//
// Sources come from cudaMalloc or from the driver's default pool (as
// cgtree.torch's eager allocator serves PyTorch), kind Default (what the
// CUDA backend passes) or DeviceToDevice, with and without 2000 more pool
// allocations alive. One JSON line per case and way.
#include "cuda_check.h"

__global__ void tiny(float *c, int i, const float *in) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    c[i] += 1.0f + 0.0f * in[0];
}

enum { REPS = 300, KERNELS = 8, SOURCES = 8, FILLERS = 2000 };
static const size_t BYTES = 262144;
static char junk[64 << 20];

/* Evicts the caches the CUDA driver's host code and data sat in. */
static void touch_junk(void) {
  for (size_t q = 0; q < sizeof junk; q += 64)
    junk[q]++;
}

int main(void) {
  cudaStream_t s;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *counters;
  CK(cudaMalloc(&counters, 4096));
  cudaMemPool_t mp;
  CK(cudaDeviceGetDefaultMemPool(&mp, 0));
  char *filler[FILLERS];
  const int from_pool[] = {0, 1, 0, 1, 1, 0}, d2d[] = {0, 0, 0, 0, 1, 1};
  for (int ci = 0; ci < 6; ci++) {
    cudaMemcpyKind kind = d2d[ci] ? cudaMemcpyDeviceToDevice : cudaMemcpyDefault;
    if (ci == 2)
      for (int j = 0; j < FILLERS; j++)
        CK(cudaMallocFromPoolAsync((void **)&filler[j], 4096 * (1 + j % 7), mp, s));
    char sources[96];
    snprintf(sources, sizeof sources, "src from %s, kind %s%s", from_pool[ci] ? "pool" : "cudaMalloc",
             d2d[ci] ? "D2D" : "Default", ci >= 2 ? ", 2000 pool allocs live" : "");
    char *src[SOURCES], *dst;
    CK(cudaMalloc((void **)&dst, BYTES));
    for (int j = 0; j < SOURCES; j++) {
      if (from_pool[ci])
        CK(cudaMallocFromPoolAsync((void **)&src[j], BYTES, mp, s));
      else
        CK(cudaMalloc((void **)&src[j], BYTES));
      CK(cudaMemsetAsync(src[j], 0, BYTES, s));
    }
    for (int with_node = 0; with_node < 2; with_node++) {
      cudaGraph_t g;
      cudaGraphExec_t ex;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      if (with_node)
        CK(cudaMemcpyAsync(dst, src[0], BYTES, kind, s));
      for (int i = 0; i < KERNELS; i++)
        tiny<<<1, 32, 0, s>>>(counters, i, (float *)dst);
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ex, g, 0));
      CK(cudaGraphUpload(ex, s));
      cudaGraphNode_t copy_node = NULL;
      if (with_node) {
        CK(graph_memcpy_node(g, &copy_node));
        if (!copy_node) {
          fprintf(stderr, "%s: the graph has no memcpy node\n", sources);
          return 1;
        }
      }
      CK(cudaStreamSynchronize(s));
      for (int cold = 0; cold < 2; cold++) {
        double before = 0, launch = 0;
        for (int r = 0; r < REPS; r++) {
          if (cold)
            touch_junk();
          double t0 = now_us();
          if (with_node)
            CK(cudaGraphExecMemcpyNodeSetParams1D(ex, copy_node, dst, src[r % SOURCES], BYTES, kind));
          else
            CK(cudaMemcpyAsync(dst, src[r % SOURCES], BYTES, kind, s));
          double t1 = now_us();
          CK(cudaGraphLaunch(ex, s));
          double t2 = now_us();
          before += t1 - t0;
          launch += t2 - t1;
          CK(cudaStreamSynchronize(s));
        }
        printf("{\"sources\":\"%s\",\"cold\":%d,\"bytes\":%zu,\"way\":\"%s\",\"host_us_before\":%.3f,"
               "\"host_us_launch\":%.3f}\n",
               sources, cold, BYTES, with_node ? "repoint_node" : "memcpyAsync_before", before / REPS,
               launch / REPS);
        fflush(stdout);
      }
      CK(cudaGraphExecDestroy(ex));
      CK(cudaGraphDestroy(g));
    }
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("{\"case\":\"device_info\",\"name\":\"%s\"}\n", p.name);
  return 0;
}
