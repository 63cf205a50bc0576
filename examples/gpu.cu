/* gpu.cu: one segment with a real CUDA kernel. Step 1 warms it up, step 2 records it as a CUDA graph,
 * step 3 replays it. Exits 77 (skipped) without a GPU. Build: nvcc gpu.cu $(pkg-config --cflags --libs cgtree-static) */
#include <cgtree.h>
#include <stdio.h>
#include <stdlib.h>
#define N 1024
#define OK(call) do { cgt_status s_ = (call); if (s_ != CGT_OK) { printf("%s: %s\n", #call, cgt_status_name(s_)); exit(1); } } while (0)

__global__ void affine(const float *x, float *y) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < N) y[i] = 2 * x[i] + 1; }

/* A segment enqueues its kernels on the launch's stream, into memory from the tree's pool. */
static cgt_status launch(cgt_launch *l, void *) {
  float *y;
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), (void **)&y);
  if (st != CGT_OK) return st;
  affine<<<N / 256, 256, 0, (cudaStream_t)cgt_launch_stream(l)>>>((const float *)cgt_launch_input(l, 0), y);
  return cgt_launch_set_output(l, 0, y, N * sizeof(float));
}

int main(void) {
  if (!cgt_cuda_available()) { puts("gpu: no usable GPU, skipped"); return 77; }
  cgt_options o; cgt_options_init(&o); o.backend = CGT_BACKEND_CUDA;
  cgt_tree *t; OK(cgt_tree_create(&o, &t));
  cgt_segment_desc d = {}; d.name = "affine"; d.launch = launch; d.n_inputs = 1; d.n_outputs = 1;
  cgt_segment seg; OK(cgt_segment_register(t, &d, &seg));
  float host[N], out[N], *x; for (int i = 0; i < N; i++) host[i] = (float)i;
  cudaMalloc(&x, sizeof host); cudaMemcpy(x, host, sizeof host, cudaMemcpyHostToDevice);
  for (int step = 1; step <= 3; step++) {
    OK(cgt_step_begin(t));                               /* a new pass through the program */
    cgt_arg in = cgt_arg_static(x, sizeof host); cgt_value y;
    OK(cgt_run(t, seg, 0, &in, 1, &y, 1));               /* warm up, record, then replay */
    OK(cgt_value_copy_out(t, y, out, sizeof out)); OK(cgt_sync(t));
    OK(cgt_value_release(t, y));                         /* y is dead: its memory may be reused */
    for (int i = 0; i < N; i++) if (out[i] != 2 * host[i] + 1) { printf("step %d: wrong y[%d]\n", step, i); return 1; }
  }
  cgt_stats s; OK(cgt_tree_stats(t, &s));
  printf("gpu: 3 steps, %llu warmup, %llu recording, %llu replay, every output right\n",
         (unsigned long long)s.warmups, (unsigned long long)s.recordings, (unsigned long long)s.replays);
  cgt_tree_destroy(t); cudaFree(x); return 0;
}
