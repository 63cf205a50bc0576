// dynamic_args.cu — what it costs to feed a graph a DYNAMIC argument whose
// address moves every step, in every way the tree could do it, unfused and
// inside a fused executable (deferred launch). Raw CUDA runtime calls, no
// cgtree: the figures are the floor of each way.
//
// A part is "y = 2 * in + 1" over n floats. The step input alternates between
// two caller buffers, so every step needs the new address.
//
//   single graph (copy node + kernel reading the placeholder):
//     bare        launch only; the copy keeps reading the old address (the floor)
//     repoint     cudaGraphExecMemcpyNodeSetParams1D + launch (what the tree does)
//     copy        a graph without the copy node; cudaMemcpyAsync into the
//                 placeholder + launch (the tree's fallback)
//     patch       a graph whose kernel reads the input directly;
//                 cudaGraphExecKernelNodeSetParams + launch (../shared/anchors/beyond.cu)
//   fused (S parts as child-graph nodes in a chain, part 0 as above):
//     bare        one launch
//     direct      cudaGraphExecMemcpyNodeSetParams1D on the copy node of the
//                 embedded child graph + launch
//     child       cudaGraphMemcpyNodeSetParams1D on that node +
//                 cudaGraphExecChildGraphNodeSetParams + launch
//     patch       cudaGraphExecKernelNodeSetParams on the embedded kernel node + launch
//     copy        cudaMemcpyAsync + launch (legal here only because no part
//                 before part 0 could overwrite the placeholder)
//
// Each way is checked (the output after the last step must be 2 * last input
// + 1) before its time is printed; a way the driver refuses prints "refused".
// Host µs per step (the calls alone) and wall µs per step (synced at the end),
// medians of 5 repetitions of 2000 steps. One JSON line per way to stdout
// after the table.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void affine(const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "dynamic_args: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

enum { N = 2048, STEPS = 2000, REPS = 5, S = 16 };

struct setup {
  cudaStream_t s;
  float *src[2], *ph, *out[S];
};

// Captures a part: optional copy src -> ph, then affine(in, out).
static int capture_part(setup &u, bool copy, const float *in, float *out, cudaGraph_t *g) {
  CK(cudaStreamBeginCapture(u.s, cudaStreamCaptureModeThreadLocal));
  if (copy) CK(cudaMemcpyAsync(u.ph, u.src[0], N * sizeof(float), cudaMemcpyDefault, u.s));
  affine<<<(N + 255) / 256, 256, 0, u.s>>>(in, out, N);
  CK(cudaStreamEndCapture(u.s, g));
  return 0;
}

static cudaGraphNode_t find_node(cudaGraph_t g, cudaGraphNodeType want) {
  size_t n = 0;
  cudaGraphGetNodes(g, nullptr, &n);
  std::vector<cudaGraphNode_t> v(n);
  cudaGraphGetNodes(g, v.data(), &n);
  for (auto x : v) {
    cudaGraphNodeType t;
    cudaGraphNodeGetType(x, &t);
    if (t == want) return x;
  }
  return nullptr;
}

struct result {
  const char *group, *way;
  bool refused;
  double host_us, wall_us;
  char why[160];
};

// Times `step(i)` (which enqueues one step) and checks out0 against the last input.
template <class F> static result time_way(setup &u, const char *group, const char *way, F step, const float *check_out) {
  result r{group, way, false, 0, 0, ""};
  std::vector<double> host(REPS), wall(REPS);
  for (int i = 0; i < 50; i++)
    if (!step(i)) { r.refused = true; break; }
  if (!r.refused) cudaStreamSynchronize(u.s);
  for (int rep = 0; rep < REPS && !r.refused; rep++) {
    double t0 = now_us();
    for (int i = 0; i < STEPS; i++)
      if (!step(i)) { r.refused = true; break; }
    double t1 = now_us();
    cudaStreamSynchronize(u.s);
    double t2 = now_us();
    host[rep] = (t1 - t0) / STEPS;
    wall[rep] = (t2 - t0) / STEPS;
  }
  if (r.refused) {
    snprintf(r.why, sizeof r.why, "%s", cudaGetErrorString(cudaGetLastError()));
    cudaStreamSynchronize(u.s);
    return r;
  }
  std::sort(host.begin(), host.end());
  std::sort(wall.begin(), wall.end());
  r.host_us = host[REPS / 2];
  r.wall_us = wall[REPS / 2];
  // The last step used src[(STEPS - 1) & 1]; both inputs are known.
  if (check_out) {
    std::vector<float> in(N), out(N);
    cudaMemcpy(in.data(), u.src[(STEPS - 1) & 1], N * sizeof(float), cudaMemcpyDefault);
    cudaMemcpy(out.data(), check_out, N * sizeof(float), cudaMemcpyDefault);
    for (int i = 0; i < N; i++)
      if (out[i] != 2.0f * in[i] + 1.0f) {
        r.refused = true;
        snprintf(r.why, sizeof r.why, "WRONG OUTPUT at %d: %g, expected %g", i, out[i], 2.0f * in[i] + 1.0f);
        break;
      }
  }
  return r;
}

int main() {
  setup u;
  CK(cudaStreamCreateWithFlags(&u.s, cudaStreamNonBlocking));
  for (auto &p : u.src) CK(cudaMalloc(&p, N * sizeof(float)));
  CK(cudaMalloc(&u.ph, N * sizeof(float)));
  for (auto &p : u.out) CK(cudaMalloc(&p, N * sizeof(float)));
  std::vector<float> h(N);
  for (int b = 0; b < 2; b++) {
    for (int i = 0; i < N; i++) h[i] = (float)((i * (b + 3)) % 11) - 5.0f;
    CK(cudaMemcpy(u.src[b], h.data(), N * sizeof(float), cudaMemcpyDefault));
  }
  std::vector<result> rs;
  cudaMemcpy3DParms unused;
  (void)unused;

  // ------------------------------------------------------------ single graph
  cudaGraph_t g_copy, g_plain, g_direct;
  cudaGraphExec_t e_copy, e_plain, e_direct;
  if (capture_part(u, true, u.ph, u.out[0], &g_copy) || capture_part(u, false, u.ph, u.out[0], &g_plain) ||
      capture_part(u, false, u.src[0], u.out[0], &g_direct))
    return 1;
  CK(cudaGraphInstantiate(&e_copy, g_copy, 0));
  CK(cudaGraphInstantiate(&e_plain, g_plain, 0));
  CK(cudaGraphInstantiate(&e_direct, g_direct, 0));
  cudaGraphNode_t copy_node = find_node(g_copy, cudaGraphNodeTypeMemcpy);
  cudaGraphNode_t kernel_node = find_node(g_direct, cudaGraphNodeTypeKernel);
  cudaKernelNodeParams kp;
  CK(cudaGraphKernelNodeGetParams(kernel_node, &kp));
  const float *kx = u.src[0];
  float *ky = u.out[0];
  int kn = N;
  void *kargs[3] = {&kx, &ky, &kn};
  cudaKernelNodeParams np = kp;
  np.kernelParams = kargs;
  np.extra = nullptr;

  rs.push_back(time_way(u, "single", "bare", [&](int) { return cudaGraphLaunch(e_copy, u.s) == cudaSuccess; }, nullptr));
  rs.push_back(time_way(u, "single", "repoint", [&](int i) {
    return cudaGraphExecMemcpyNodeSetParams1D(e_copy, copy_node, u.ph, u.src[i & 1], N * sizeof(float),
                                              cudaMemcpyDefault) == cudaSuccess &&
           cudaGraphLaunch(e_copy, u.s) == cudaSuccess;
  }, u.out[0]));
  rs.push_back(time_way(u, "single", "copy", [&](int i) {
    return cudaMemcpyAsync(u.ph, u.src[i & 1], N * sizeof(float), cudaMemcpyDefault, u.s) == cudaSuccess &&
           cudaGraphLaunch(e_plain, u.s) == cudaSuccess;
  }, u.out[0]));
  rs.push_back(time_way(u, "single", "patch", [&](int i) {
    kx = u.src[i & 1];
    return cudaGraphExecKernelNodeSetParams(e_direct, kernel_node, &np) == cudaSuccess &&
           cudaGraphLaunch(e_direct, u.s) == cudaSuccess;
  }, u.out[0]));

  // ------------------------------------------------------------------ fused
  // Part 0 in three flavours (copy node, plain, direct read), parts 1..S-1
  // chained on the previous output.
  auto build_fused = [&](cudaGraph_t part0, cudaGraphExec_t *exec, cudaGraphNode_t *child0) -> int {
    cudaGraph_t f;
    CK(cudaGraphCreate(&f, 0));
    cudaGraphNode_t prev = nullptr;
    for (int p = 0; p < S; p++) {
      cudaGraph_t part = part0;
      if (p > 0 && capture_part(u, false, u.out[p - 1], u.out[p], &part)) return 1;
      cudaGraphNode_t node;
      CK(cudaGraphAddChildGraphNode(&node, f, prev ? &prev : nullptr, prev ? 1 : 0, part));
      if (p == 0) *child0 = node;
      if (p > 0) cudaGraphDestroy(part);
      prev = node;
    }
    CK(cudaGraphInstantiate(exec, f, 0));
    CK(cudaGraphUpload(*exec, u.s));
    return 0;
  };
  cudaGraphExec_t f_copy, f_plain, f_direct;
  cudaGraphNode_t c_copy, c_plain, c_direct;
  if (build_fused(g_copy, &f_copy, &c_copy) || build_fused(g_plain, &f_plain, &c_plain) ||
      build_fused(g_direct, &f_direct, &c_direct))
    return 1;
  cudaGraph_t emb_copy, emb_direct;
  CK(cudaGraphChildGraphNodeGetGraph(c_copy, &emb_copy));
  CK(cudaGraphChildGraphNodeGetGraph(c_direct, &emb_direct));
  cudaGraphNode_t emb_copy_node = find_node(emb_copy, cudaGraphNodeTypeMemcpy);
  cudaGraphNode_t emb_kernel_node = find_node(emb_direct, cudaGraphNodeTypeKernel);

  rs.push_back(time_way(u, "fused", "bare", [&](int) { return cudaGraphLaunch(f_copy, u.s) == cudaSuccess; }, nullptr));
  rs.push_back(time_way(u, "fused", "direct", [&](int i) {
    return cudaGraphExecMemcpyNodeSetParams1D(f_copy, emb_copy_node, u.ph, u.src[i & 1], N * sizeof(float),
                                              cudaMemcpyDefault) == cudaSuccess &&
           cudaGraphLaunch(f_copy, u.s) == cudaSuccess;
  }, u.out[0]));
  rs.push_back(time_way(u, "fused", "child", [&](int i) {
    return cudaGraphMemcpyNodeSetParams1D(emb_copy_node, u.ph, u.src[i & 1], N * sizeof(float), cudaMemcpyDefault) ==
               cudaSuccess &&
           cudaGraphExecChildGraphNodeSetParams(f_copy, c_copy, emb_copy) == cudaSuccess &&
           cudaGraphLaunch(f_copy, u.s) == cudaSuccess;
  }, u.out[0]));
  rs.push_back(time_way(u, "fused", "patch", [&](int i) {
    kx = u.src[i & 1];
    return cudaGraphExecKernelNodeSetParams(f_direct, emb_kernel_node, &np) == cudaSuccess &&
           cudaGraphLaunch(f_direct, u.s) == cudaSuccess;
  }, u.out[0]));
  rs.push_back(time_way(u, "fused", "copy", [&](int i) {
    return cudaMemcpyAsync(u.ph, u.src[i & 1], N * sizeof(float), cudaMemcpyDefault, u.s) == cudaSuccess &&
           cudaGraphLaunch(f_plain, u.s) == cudaSuccess;
  }, u.out[0]));
  (void)cudaGetLastError();

  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("\n## dynamic_args: %s, %d floats per input, fused = %d parts\n\n", prop.name, N, S);
  printf("Host µs per step (the calls) and wall µs per step (2000 steps synced at the end), median of %d.\n\n", REPS);
  printf("| graph | way | host µs/step | wall µs/step | host over bare |\n| --- | --- | ---: | ---: | ---: |\n");
  for (auto &r : rs) {
    double bare = 0;
    for (auto &b : rs)
      if (!strcmp(b.group, r.group) && !strcmp(b.way, "bare")) bare = b.host_us;
    if (r.refused)
      printf("| %s | %s | refused: %s | | |\n", r.group, r.way, r.why);
    else
      printf("| %s | %s | %.2f | %.2f | %+.2f |\n", r.group, r.way, r.host_us, r.wall_us, r.host_us - bare);
  }
  printf("\n");
  for (auto &r : rs)
    printf("{\"bench\":\"dynamic_args\",\"device\":\"%s\",\"graph\":\"%s\",\"way\":\"%s\",\"refused\":%s,"
           "\"host_us\":%.3f,\"wall_us\":%.3f,\"parts\":%d,\"floats\":%d}\n",
           prop.name, r.group, r.way, r.refused ? "true" : "false", r.host_us, r.wall_us, r.group[0] == 'f' ? S : 1, N);
  return 0;
}
