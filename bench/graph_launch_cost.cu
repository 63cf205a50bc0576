// graph_launch_cost.cu — what one cudaGraphLaunch costs the host, by graph size.
//
//   nvcc -O2 -arch=sm_90 -rdc=true bench/graph_launch_cost.cu -lcudadevrt -o /tmp/glc && /tmp/glc
//
// A replayed segment's time in cgt_run is almost all the graph launch (the
// tree's own bookkeeping is 0.05-0.3 us, bench/replay_overhead). This measures
// that launch alone, for straight-line graphs of K tiny kernels, with no
// runtime around it, so bench/torch_segment_parts.py's cgt_run figure can be
// split into "the launch of the kernels" and "ours":
//
//   kernels     K kernels in a chain (what a captured single-stream segment is);
//   copy        an 8-byte device-to-device copy node first (a DYNAMIC input's
//               placeholder copy), then the K kernels;
//   repoint     as copy, and the copy's source changed before every launch
//               (cudaGraphExecMemcpyNodeSetParams1D; the repoint is timed too);
//   device      the K-kernel graph instantiated for device launch and started
//               by a one-kernel host graph whose kernel launches it
//               (cudaStreamGraphFireAndForget): the host submits one node.
//
// Each launch is timed alone, with the GPU idle (a stream sync after each,
// not timed): the host's cost, not the GPU's. Results are checked: every
// kernel adds 1 to its own counter, so after R launches each counter is R.
// One JSON line per case.
#include <stdlib.h>

#include "cuda_check.h"

__global__ void tiny(float *counters, int i, const float *in) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    counters[i] += 1.0f + 0.0f * in[0];
}

__global__ void launcher(cudaGraphExec_t g) {
  cudaGraphLaunch(g, cudaStreamGraphFireAndForget);
}

enum { REPS = 2000, MAXK = 128 };

static int build(cudaStream_t s, int k, int with_copy, float *counters, float *src, float *dst, cudaGraph_t *g) {
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  if (with_copy)
    CK(cudaMemcpyAsync(dst, src, 8, cudaMemcpyDeviceToDevice, s));
  for (int i = 0; i < k; i++)
    tiny<<<1, 32, 0, s>>>(counters, i, dst);
  CK(cudaStreamEndCapture(s, g));
  return 0;
}

static int check(float *counters, int k, int want, const char *what) {
  float h[MAXK];
  CK(cudaMemcpy(h, counters, sizeof(float) * k, cudaMemcpyDeviceToHost));
  for (int i = 0; i < k; i++)
    if (h[i] != (float)want) {
      fprintf(stderr, "%s: counter %d is %g, want %d\n", what, i, h[i], want);
      return 1;
    }
  return 0;
}

int main(void) {
  cudaStream_t s;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *counters, *src, *dst;
  CK(cudaMalloc(&counters, sizeof(float) * MAXK));
  CK(cudaMalloc(&src, 64));
  CK(cudaMalloc(&dst, 64));
  CK(cudaMemset(src, 0, 64));
  const int ks[] = {1, 16, 64, 128};
  const char *cases[] = {"kernels", "copy", "repoint", "device"};
  for (int ki = 0; ki < 4; ki++) {
    int k = ks[ki];
    for (int c = 0; c < 4; c++) {
      CK(cudaMemset(counters, 0, sizeof(float) * MAXK));
      cudaGraph_t g;
      if (build(s, k, c == 1 || c == 2, counters, src, dst, &g))
        return 1;
      cudaGraphExec_t ex, outer_ex = NULL;
      cudaGraph_t outer = NULL;
      cudaGraphNode_t copy_node = NULL;
      if (c == 3) {
        CK(cudaGraphInstantiate(&ex, g, cudaGraphInstantiateFlagDeviceLaunch));
        CK(cudaGraphUpload(ex, s));
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        launcher<<<1, 1, 0, s>>>(ex);
        CK(cudaStreamEndCapture(s, &outer));
        CK(cudaGraphInstantiate(&outer_ex, outer, 0));
        CK(cudaGraphUpload(outer_ex, s));
      } else {
        CK(cudaGraphInstantiate(&ex, g, 0));
        CK(cudaGraphUpload(ex, s));
        if (c == 2) /* the copy node: the graph's one memcpy node */
          CK(graph_memcpy_node(g, &copy_node));
      }
      CK(cudaStreamSynchronize(s));
      double spent = 0, spent_repoint = 0;
      for (int r = 0; r < REPS; r++) {
        double t0 = now_us();
        if (c == 2)
          CK(cudaGraphExecMemcpyNodeSetParams1D(ex, copy_node, dst, (r & 1) ? src + 8 : src, 8,
                                                cudaMemcpyDeviceToDevice));
        double t1 = now_us();
        CK(cudaGraphLaunch(c == 3 ? outer_ex : ex, s));
        double t2 = now_us();
        spent_repoint += t1 - t0;
        spent += t2 - t1;
        CK(cudaStreamSynchronize(s));
      }
      // back to back, no sync between: the host's rate with the GPU busy
      double t0 = now_us();
      for (int r = 0; r < REPS; r++)
        CK(cudaGraphLaunch(c == 3 ? outer_ex : ex, s));
      double t_pipe = now_us() - t0;
      CK(cudaStreamSynchronize(s));
      if (check(counters, k, 2 * REPS, cases[c]))
        return 1;
      printf("{\"case\":\"%s\",\"kernels\":%d,\"host_us_per_launch\":%.3f,\"host_us_per_repoint\":%.3f,"
             "\"back_to_back_us_per_launch\":%.3f}\n",
             cases[c], k, spent / REPS, c == 2 ? spent_repoint / REPS : 0.0, t_pipe / REPS);
      fflush(stdout);
      if (outer_ex)
        CK(cudaGraphExecDestroy(outer_ex));
      if (outer)
        CK(cudaGraphDestroy(outer));
      CK(cudaGraphExecDestroy(ex));
      CK(cudaGraphDestroy(g));
    }
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  int drv = 0, rt = 0;
  CK(cudaDriverGetVersion(&drv));
  CK(cudaRuntimeGetVersion(&rt));
  printf("{\"case\":\"device_info\",\"name\":\"%s\",\"driver\":%d,\"runtime\":%d}\n", p.name, drv, rt);
  return 0;
}
