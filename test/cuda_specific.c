/* cuda_specific.c — scenarios that only a real GPU can check.
 *
 * The scenario suites run on the simulator and on CUDA alike; these are the
 * ones whose point is CUDA itself: cuBLAS reading a workspace out of the
 * pool while captured, a captured fork onto a second stream and the join
 * back, cudaMalloc of new pool chunks while a capture is open, the four
 * calls that invalidate a CUDA capture (and the promise that nothing sticky
 * is left behind), and a thousand steps of host-side branching.
 *
 * Each test builds its trees through the public API only, with the kernels
 * of tools/common, and checks results against an eager tree (CGT_MODE_EAGER)
 * running the same program, bit for bit, and where the arithmetic is exact,
 * against a host reference too. cgt_tree_check runs after every cgt_run.
 *
 * With warmup_runs = 1 (the default) a segment's first run is a warmup, its
 * second records and later ones replay; the step counts below are chosen so
 * that every test sees several replays.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "cgtree.h"
#include "cuda_specific.h"
#include "kernels.h"

/* ------------------------------------------------------------- helpers */

/* Fails the test with the status name and the tree's last error. */
#define CHECK_TREE(t, call)                                                                              \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      fail_msg("%s: %s (%s)", #call, cgt_status_name(s_), (t) != NULL ? cgt_tree_last_error(t) : "");    \
  } while (0)

#define CHECK_KERN(k, call)                                                                              \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      fail_msg("%s: %s (%s)", #call, cgt_status_name(s_), (k)->last_error());                            \
  } while (0)

/* Inside a launch function: hand any failure back to the tree. */
#define TRY(call)                                                                                        \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      return s_;                                                                                         \
  } while (0)

/* Inside a careless launch function: once its capture is broken, the
 * kernels after the illegal call fail with CGT_ERR_CAPTURE_FAILED. Like most
 * real code, the segment does not notice; the tree finds out when it ends
 * the capture, and runs the segment again eagerly. */
#define TRY_CARELESS(call)                                                                               \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK && s_ != CGT_ERR_CAPTURE_FAILED)                                                    \
      return s_;                                                                                         \
  } while (0)

static void assert_no_cuda_error(void) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail_msg("a CUDA error was left behind: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
}

/* What the launch functions of one tree need. */
typedef struct env {
  const kernels *k;
  kern_ctx *ctx;
  size_t n;       /* floats per vector */
  int careless;   /* which capture-illegal call, for the careless segments */
  float scratch;  /* host target of the careless synchronous copy */
} env;

typedef struct gpu_tree {
  cgt_tree *t;
  env e;
} gpu_tree;

static const kernels *cuda_kernels_or_skip(void) {
  const kernels *k = kernels_for(CGT_BACKEND_CUDA);
  if (k == NULL || !cgt_cuda_available())
    skip();
  return k;
}

static void open_tree(gpu_tree *g, cgt_mode mode, uint32_t warmup_runs, size_t pool_chunk_bytes, size_t n) {
  memset(g, 0, sizeof *g);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  o.mode = mode;
  o.warmup_runs = warmup_runs;
  if (pool_chunk_bytes != 0)
    o.pool_chunk_bytes = pool_chunk_bytes;
  CHECK_TREE(NULL, cgt_tree_create(&o, &g->t));
  assert_int_equal(cgt_tree_backend(g->t), CGT_BACKEND_CUDA);
  assert_non_null(cgt_tree_stream(g->t));
  g->e.k = kernels_for(CGT_BACKEND_CUDA);
  g->e.n = n;
  CHECK_KERN(g->e.k, g->e.k->ctx_create(cgt_tree_stream(g->t), &g->e.ctx));
}

static void close_tree(gpu_tree *g) {
  CHECK_TREE(g->t, cgt_sync(g->t));
  g->e.k->ctx_destroy(g->e.ctx);
  cgt_tree_destroy(g->t);
  g->t = NULL;
  assert_no_cuda_error();
}

static cgt_segment add_segment(gpu_tree *g, const char *name, cgt_launch_fn fn, uint32_t n_inputs,
                               uint32_t n_outputs) {
  cgt_segment_desc d = {name, fn, &g->e, n_inputs, n_outputs, 0};
  cgt_segment seg = 0;
  CHECK_TREE(g->t, cgt_segment_register(g->t, &d, &seg));
  return seg;
}

/* cgt_run, then the tree's own invariant check. */
static void run(gpu_tree *g, cgt_segment seg, const cgt_arg *args, uint32_t n_args, cgt_value *outs,
                uint32_t n_outs) {
  CHECK_TREE(g->t, cgt_run(g->t, seg, 0, args, n_args, outs, n_outs));
  CHECK_TREE(g->t, cgt_tree_check(g->t));
}

/* Copies a value to the host and waits for it. */
static void read_value(gpu_tree *g, cgt_value v, void *host, size_t bytes) {
  CHECK_TREE(g->t, cgt_value_copy_out(g->t, v, host, bytes));
  CHECK_TREE(g->t, cgt_sync(g->t));
}

static void *dev_alloc(const kernels *k, size_t bytes) {
  void *p = NULL;
  CHECK_KERN(k, k->dev_alloc(bytes, &p));
  return p;
}

static void *host_alloc(size_t bytes) {
  void *p = calloc(1, bytes);
  assert_non_null(p);
  return p;
}

/* The tree's nodes, in id order; *count gets their number. */
static cgt_node_info *nodes_of(gpu_tree *g, size_t *count) {
  size_t n = 0;
  CHECK_TREE(g->t, cgt_tree_nodes(g->t, NULL, 0, &n));
  cgt_node_info *info = host_alloc((n + 1) * sizeof *info);
  CHECK_TREE(g->t, cgt_tree_nodes(g->t, info, n, &n));
  *count = n;
  return info;
}

/* The most replays of any node of `seg` in state `state`, or -1 if none is. */
static long long best_node(gpu_tree *g, cgt_segment seg, cgt_node_state state, const char **reason) {
  size_t n = 0;
  cgt_node_info *info = nodes_of(g, &n);
  long long best = -1;
  for (size_t i = 0; i < n; i++)
    if (info[i].segment == seg && info[i].state == state && (long long)info[i].replays > best) {
      best = (long long)info[i].replays;
      if (reason != NULL)
        *reason = info[i].reason;
    }
  free(info);
  return best;
}

/* Runs every kernel once, eagerly, on the tree's stream: CUDA loads modules
 * lazily, and tests that record at once (warmup_runs = 0) should not make
 * the first load happen inside a capture by accident. */
static void warm_kernels(gpu_tree *g) {
  const kernels *k = g->e.k;
  void *s = cgt_tree_stream(g->t);
  float *a = dev_alloc(k, 1024 * sizeof(float));
  CHECK_KERN(k, k->fill(s, a, 1.0f, 1024));
  CHECK_KERN(k, k->affine(s, a, 1.0f, 0.0f, a, 1024));
  CHECK_KERN(k, k->add(s, a, a, a, 1024));
  CHECK_KERN(k, k->relu(s, a, a, 1024));
  CHECK_KERN(k, k->sum(s, a, 1024, a));
  CHECK_TREE(g->t, cgt_sync(g->t));
  k->dev_free(a);
}

/* A small deterministic generator for weights and inputs. */
static float lcg_uniform(uint32_t *state, float scale) {
  *state = *state * 1664525u + 1013904223u;
  return ((float)(*state >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
}

/* ------------------------------------------- cuBLAS with a pool workspace */

enum { GEMM_M = 8, GEMM_K = 256, GEMM_N = 256 };
#define GEMM_WORKSPACE_BYTES ((size_t)4 << 20)

/* relu(relu(x @ w1) @ w2), both gemms on cuBLAS with a workspace that is a
 * temporary of this launch: pool memory, freed when the launch returns. */
static cgt_status seg_two_layers(cgt_launch *l, void *user) {
  env *e = user;
  void *s = cgt_launch_stream(l);
  const float *x = cgt_launch_input(l, 0), *w1 = cgt_launch_input(l, 1), *w2 = cgt_launch_input(l, 2);
  void *ws = NULL, *h = NULL, *out = NULL;
  size_t bytes = (size_t)GEMM_M * GEMM_N * sizeof(float);
  TRY(cgt_launch_alloc(l, GEMM_WORKSPACE_BYTES, &ws));
  TRY(cgt_launch_alloc(l, bytes, &h));
  TRY(e->k->gemm(e->ctx, s, x, w1, h, GEMM_M, GEMM_N, GEMM_K, ws, GEMM_WORKSPACE_BYTES));
  TRY(e->k->relu(s, h, h, (size_t)GEMM_M * GEMM_N));
  TRY(cgt_launch_alloc(l, bytes, &out));
  TRY(e->k->gemm(e->ctx, s, h, w2, out, GEMM_M, GEMM_N, GEMM_N, ws, GEMM_WORKSPACE_BYTES));
  TRY(e->k->relu(s, out, out, (size_t)GEMM_M * GEMM_N));
  return cgt_launch_set_output(l, 0, out, bytes);
}

static void host_linear_relu(const float *x, const float *w, float *out, int m, int n, int k) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double acc = 0.0;
      for (int q = 0; q < k; q++)
        acc += (double)x[i * k + q] * (double)w[q * n + j];
      out[i * n + j] = acc > 0.0 ? (float)acc : 0.0f;
    }
}

static void test_cublas_gemm_with_a_pool_workspace_replays_equal_to_eager(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  gpu_tree tree, eager;
  open_tree(&tree, CGT_MODE_TREE, 1, 0, 0);
  open_tree(&eager, CGT_MODE_EAGER, 1, 0, 0);
  cgt_segment seg_t = add_segment(&tree, "two_layers", seg_two_layers, 3, 1);
  cgt_segment seg_e = add_segment(&eager, "two_layers", seg_two_layers, 3, 1);

  size_t x_count = (size_t)GEMM_M * GEMM_K, w_count = (size_t)GEMM_K * GEMM_N, o_count = (size_t)GEMM_M * GEMM_N;
  float *hx = host_alloc(x_count * sizeof(float)), *hw1 = host_alloc(w_count * sizeof(float));
  float *hw2 = host_alloc(w_count * sizeof(float)), *hh = host_alloc(o_count * sizeof(float));
  float *ref = host_alloc(o_count * sizeof(float)), *got_t = host_alloc(o_count * sizeof(float));
  float *got_e = host_alloc(o_count * sizeof(float));
  uint32_t rng = 12345u;
  for (size_t i = 0; i < w_count; i++)
    hw1[i] = lcg_uniform(&rng, 0.0625f);
  for (size_t i = 0; i < w_count; i++)
    hw2[i] = lcg_uniform(&rng, 0.0625f);
  float *x = dev_alloc(k, x_count * sizeof(float));
  float *w1 = dev_alloc(k, w_count * sizeof(float)), *w2 = dev_alloc(k, w_count * sizeof(float));
  CHECK_KERN(k, k->upload(w1, hw1, w_count * sizeof(float)));
  CHECK_KERN(k, k->upload(w2, hw2, w_count * sizeof(float)));

  const int steps = 6; /* warmup, record, then four replays */
  for (int step = 0; step < steps; step++) {
    /* New input every step at the same address: the replays must read it. */
    for (size_t i = 0; i < x_count; i++)
      hx[i] = lcg_uniform(&rng, 1.0f);
    CHECK_KERN(k, k->upload(x, hx, x_count * sizeof(float)));
    host_linear_relu(hx, hw1, hh, GEMM_M, GEMM_N, GEMM_K);
    host_linear_relu(hh, hw2, ref, GEMM_M, GEMM_N, GEMM_N);

    cgt_arg args[3] = {cgt_arg_static(x, x_count * sizeof(float)), cgt_arg_static(w1, w_count * sizeof(float)),
                       cgt_arg_static(w2, w_count * sizeof(float))};
    cgt_value out_t, out_e;
    if (step > 0) {
      CHECK_TREE(tree.t, cgt_step_begin(tree.t));
      CHECK_TREE(eager.t, cgt_step_begin(eager.t));
    }
    run(&tree, seg_t, args, 3, &out_t, 1);
    run(&eager, seg_e, args, 3, &out_e, 1);
    read_value(&tree, out_t, got_t, o_count * sizeof(float));
    read_value(&eager, out_e, got_e, o_count * sizeof(float));
    if (memcmp(got_t, got_e, o_count * sizeof(float)) != 0)
      fail_msg("step %d: the tree's result differs from the eager run", step);
    for (size_t i = 0; i < o_count; i++)
      if (fabsf(got_t[i] - ref[i]) > 1e-3f + 1e-3f * fabsf(ref[i]))
        fail_msg("step %d: out[%zu] = %g, host reference %g (row-major gemm wrong?)", step, i, (double)got_t[i],
                 (double)ref[i]);
    CHECK_TREE(tree.t, cgt_value_release(tree.t, out_t));
    CHECK_TREE(eager.t, cgt_value_release(eager.t, out_e));
    assert_no_cuda_error();
  }

  long long replays = best_node(&tree, seg_t, CGT_NODE_RECORDED, NULL);
  if (replays < steps - 2)
    fail_msg("the gemm segment should be RECORDED with %d replays, best has %lld", steps - 2, replays);
  cgt_stats st;
  CHECK_TREE(tree.t, cgt_tree_stats(tree.t, &st));
  assert_int_equal(st.capture_failures, 0);

  k->dev_free(x);
  k->dev_free(w1);
  k->dev_free(w2);
  free(hx);
  free(hw1);
  free(hw2);
  free(hh);
  free(ref);
  free(got_t);
  free(got_e);
  close_tree(&tree);
  close_tree(&eager);
}

/* ---------------------------------------------------- fork onto a stream */

/* y = 2x on a second stream forked with an event and joined back, then
 * y += 1 on the segment's stream. */
static cgt_status seg_fork_join(cgt_launch *l, void *user) {
  env *e = user;
  const float *x = cgt_launch_input(l, 0);
  float *y = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&y));
  TRY(e->k->fork_join(e->ctx, cgt_launch_stream(l), x, y, e->n));
  return cgt_launch_set_output(l, 0, y, e->n * sizeof(float));
}

static void test_segment_that_forks_and_joins_a_second_stream_records_and_replays(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = (size_t)1 << 16;
  gpu_tree tree, eager;
  open_tree(&tree, CGT_MODE_TREE, 1, 0, n);
  open_tree(&eager, CGT_MODE_EAGER, 1, 0, n);
  cgt_segment seg_t = add_segment(&tree, "fork_join", seg_fork_join, 1, 1);
  cgt_segment seg_e = add_segment(&eager, "fork_join", seg_fork_join, 1, 1);
  float *hx = host_alloc(n * sizeof(float)), *got_t = host_alloc(n * sizeof(float));
  float *got_e = host_alloc(n * sizeof(float));
  float *x = dev_alloc(k, n * sizeof(float));

  const int steps = 5;
  for (int step = 0; step < steps; step++) {
    for (size_t i = 0; i < n; i++)
      hx[i] = (float)((int)(i % 97) - 48 + step);
    CHECK_KERN(k, k->upload(x, hx, n * sizeof(float)));
    if (step > 0) {
      CHECK_TREE(tree.t, cgt_step_begin(tree.t));
      CHECK_TREE(eager.t, cgt_step_begin(eager.t));
    }
    cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
    cgt_value y_t, y_e;
    run(&tree, seg_t, &arg, 1, &y_t, 1);
    run(&eager, seg_e, &arg, 1, &y_e, 1);
    read_value(&tree, y_t, got_t, n * sizeof(float));
    read_value(&eager, y_e, got_e, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (got_t[i] != 2.0f * hx[i] + 1.0f || got_e[i] != got_t[i])
        fail_msg("step %d: y[%zu] = %g (eager %g), want %g", step, i, (double)got_t[i], (double)got_e[i],
                 (double)(2.0f * hx[i] + 1.0f));
    assert_no_cuda_error();
  }
  long long replays = best_node(&tree, seg_t, CGT_NODE_RECORDED, NULL);
  if (replays < steps - 2)
    fail_msg("the fork/join segment should be RECORDED with %d replays, best has %lld", steps - 2, replays);

  k->dev_free(x);
  free(hx);
  free(got_t);
  free(got_e);
  close_tree(&tree);
  close_tree(&eager);
}

/* ----------------------------------------------- pool growth in capture */

enum { GROW_BUFFERS = 24 };
#define GROW_BUFFER_BYTES ((size_t)1 << 20)
#define GROW_CHUNK_BYTES ((size_t)64 << 10)

/* Holds GROW_BUFFERS MiB of temporaries at once, far more than a chunk, so
 * that recording it must add chunks while the capture is open. */
static cgt_status seg_grow(cgt_launch *l, void *user) {
  env *e = user;
  void *s = cgt_launch_stream(l);
  const float *x = cgt_launch_input(l, 0);
  float *acc = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&acc));
  TRY(e->k->affine(s, x, 1.0f, 0.0f, acc, e->n));
  for (int i = 0; i < GROW_BUFFERS; i++) {
    float *buf = NULL;
    TRY(cgt_launch_alloc(l, GROW_BUFFER_BYTES, (void **)&buf));
    TRY(e->k->fill(s, buf, (float)(i + 1), GROW_BUFFER_BYTES / sizeof(float)));
    TRY(e->k->add(s, acc, buf, acc, e->n));
  }
  return cgt_launch_set_output(l, 0, acc, e->n * sizeof(float));
}

static void test_pool_grows_while_a_capture_is_open_and_the_recording_replays(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 4096;
  gpu_tree tree;
  /* warmup_runs = 0: the very first run records, into an empty pool. */
  open_tree(&tree, CGT_MODE_TREE, 0, GROW_CHUNK_BYTES, n);
  warm_kernels(&tree);
  cgt_segment seg = add_segment(&tree, "grow", seg_grow, 1, 1);
  float *hx = host_alloc(n * sizeof(float)), *got = host_alloc(n * sizeof(float));
  float *x = dev_alloc(k, n * sizeof(float));
  const float added = (float)(GROW_BUFFERS * (GROW_BUFFERS + 1) / 2);

  const int steps = 4;
  for (int step = 0; step < steps; step++) {
    for (size_t i = 0; i < n; i++)
      hx[i] = (float)((int)(i % 13) * (step + 1));
    CHECK_KERN(k, k->upload(x, hx, n * sizeof(float)));
    if (step > 0)
      CHECK_TREE(tree.t, cgt_step_begin(tree.t));
    cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
    cgt_value out;
    run(&tree, seg, &arg, 1, &out, 1);
    read_value(&tree, out, got, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (got[i] != hx[i] + added)
        fail_msg("step %d: out[%zu] = %g, want %g", step, i, (double)got[i], (double)(hx[i] + added));
    assert_no_cuda_error();
  }

  const char *reason = NULL;
  if (best_node(&tree, seg, CGT_NODE_EAGER, &reason) >= 0)
    fail_msg("growing the pool broke the capture: %s", reason != NULL ? reason : "(no reason)");
  long long replays = best_node(&tree, seg, CGT_NODE_RECORDED, NULL);
  if (replays < steps - 1)
    fail_msg("the growing segment should be RECORDED with %d replays, best has %lld", steps - 1, replays);
  cgt_stats st;
  CHECK_TREE(tree.t, cgt_tree_stats(tree.t, &st));
  assert_int_equal(st.capture_failures, 0);
  if (st.pool_reserved_bytes < GROW_BUFFERS * GROW_BUFFER_BYTES)
    fail_msg("pool reserved %zu bytes, the segment holds %zu at once", st.pool_reserved_bytes,
             GROW_BUFFERS * GROW_BUFFER_BYTES);

  k->dev_free(x);
  free(hx);
  free(got);
  close_tree(&tree);
}

/* -------------------------------------------------- careless segments */

enum careless_call { CARELESS_STREAM_SYNC, CARELESS_MALLOC, CARELESS_MEMCPY, CARELESS_DEVICE_SYNC };

/* y = relu(2x + 1), with a capture-illegal call in the middle. */
static cgt_status seg_careless(cgt_launch *l, void *user) {
  env *e = user;
  void *s = cgt_launch_stream(l);
  const float *x = cgt_launch_input(l, 0);
  float *y = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&y));
  TRY(e->k->affine(s, x, 2.0f, 1.0f, y, e->n));
  /* The careless part: the verdict is ignored, as careless code does. */
  switch ((enum careless_call)e->careless) {
  case CARELESS_STREAM_SYNC:
    (void)e->k->illegal_stream_sync(s);
    break;
  case CARELESS_MALLOC:
    (void)e->k->illegal_malloc(s);
    break;
  case CARELESS_MEMCPY:
    /* Reads one float of the caller's input back to the host, like
     * `.item()`; the input is caller memory, written before the step. */
    (void)e->k->illegal_memcpy(s, &e->scratch, x, sizeof(float));
    break;
  case CARELESS_DEVICE_SYNC:
    (void)e->k->illegal_device_sync(s);
    break;
  }
  TRY_CARELESS(e->k->relu(s, y, y, e->n));
  return cgt_launch_set_output(l, 0, y, e->n * sizeof(float));
}

/* z = 3y: a well-behaved segment after the careless one. */
static cgt_status seg_after(cgt_launch *l, void *user) {
  env *e = user;
  const float *y = cgt_launch_input(l, 0);
  float *z = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&z));
  TRY(e->k->affine(cgt_launch_stream(l), y, 3.0f, 0.0f, z, e->n));
  return cgt_launch_set_output(l, 0, z, e->n * sizeof(float));
}

static const char *careless_name(enum careless_call c) {
  switch (c) {
  case CARELESS_STREAM_SYNC:
    return "cudaStreamSynchronize";
  case CARELESS_MALLOC:
    return "cudaMalloc";
  case CARELESS_MEMCPY:
    return "synchronous cudaMemcpy";
  case CARELESS_DEVICE_SYNC:
    return "cudaDeviceSynchronize";
  }
  return "?";
}

static void check_careless(enum careless_call which) {
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 8192;
  gpu_tree tree, eager;
  open_tree(&tree, CGT_MODE_TREE, 1, 0, n);
  open_tree(&eager, CGT_MODE_EAGER, 1, 0, n);
  tree.e.careless = eager.e.careless = (int)which;
  cgt_segment careless_t = add_segment(&tree, "careless", seg_careless, 1, 1);
  cgt_segment after_t = add_segment(&tree, "after", seg_after, 1, 1);
  cgt_segment careless_e = add_segment(&eager, "careless", seg_careless, 1, 1);
  cgt_segment after_e = add_segment(&eager, "after", seg_after, 1, 1);
  float *hx = host_alloc(n * sizeof(float)), *got_t = host_alloc(n * sizeof(float));
  float *got_e = host_alloc(n * sizeof(float));
  float *x = dev_alloc(k, n * sizeof(float));

  /* 1: warmup; 2: the capture fails, the node turns EAGER and runs eagerly,
   * "after" records; 3-6: "after" replays behind the eager node. */
  const int steps = 6;
  for (int step = 0; step < steps; step++) {
    for (size_t i = 0; i < n; i++)
      hx[i] = (float)((int)(i % 7) - 3 + step);
    CHECK_KERN(k, k->upload(x, hx, n * sizeof(float)));
    if (step > 0) {
      CHECK_TREE(tree.t, cgt_step_begin(tree.t));
      CHECK_TREE(eager.t, cgt_step_begin(eager.t));
    }
    tree.e.scratch = eager.e.scratch = -1000.0f;
    cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
    cgt_value y_t, z_t, y_e, z_e;
    run(&tree, careless_t, &arg, 1, &y_t, 1);
    cgt_arg from_y = cgt_arg_value(y_t);
    run(&tree, after_t, &from_y, 1, &z_t, 1);
    run(&eager, careless_e, &arg, 1, &y_e, 1);
    from_y = cgt_arg_value(y_e);
    run(&eager, after_e, &from_y, 1, &z_e, 1);
    read_value(&tree, z_t, got_t, n * sizeof(float));
    read_value(&eager, z_e, got_e, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
      float y = 2.0f * hx[i] + 1.0f;
      float want = 3.0f * (y > 0.0f ? y : 0.0f);
      if (got_t[i] != want || got_e[i] != want)
        fail_msg("%s, step %d: z[%zu] = %g (eager %g), want %g", careless_name(which), step, i, (double)got_t[i],
                 (double)got_e[i], (double)want);
    }
    /* The segment ran eagerly in every step (warmup, failed capture, EAGER),
     * so its own copy to the host happened every time. */
    if (which == CARELESS_MEMCPY && tree.e.scratch != hx[0])
      fail_msg("step %d: the careless copy read %g, want %g: did the capture swallow it?", step,
               (double)tree.e.scratch, (double)hx[0]);
    CHECK_TREE(tree.t, cgt_sync(tree.t));
    assert_no_cuda_error();
  }

  const char *reason = NULL;
  if (best_node(&tree, careless_t, CGT_NODE_EAGER, &reason) < 0)
    fail_msg("a segment calling %s should have turned EAGER; it did not", careless_name(which));
  if (reason == NULL || reason[0] == '\0')
    fail_msg("the EAGER node of a segment calling %s has no reason", careless_name(which));
  print_message("%s: node EAGER because: %s\n", careless_name(which), reason);
  print_message("%s: cgt_tree_last_error: \"%s\"\n", careless_name(which), cgt_tree_last_error(tree.t));
  long long replays = best_node(&tree, after_t, CGT_NODE_RECORDED, NULL);
  if (replays < 1)
    fail_msg("after a failed capture (%s), the next segment should record and replay; best replays %lld",
             careless_name(which), replays);
  cgt_stats st;
  CHECK_TREE(tree.t, cgt_tree_stats(tree.t, &st));
  assert_int_equal(st.capture_failures, 1);
  assert_no_cuda_error();

  k->dev_free(x);
  free(hx);
  free(got_t);
  free(got_e);
  close_tree(&tree);
  close_tree(&eager);
}

static void test_stream_sync_in_a_segment_makes_its_node_eager_and_leaves_no_error(void **state) {
  (void)state;
  check_careless(CARELESS_STREAM_SYNC);
}

static void test_malloc_in_a_segment_makes_its_node_eager_and_leaves_no_error(void **state) {
  (void)state;
  check_careless(CARELESS_MALLOC);
}

static void test_synchronous_memcpy_in_a_segment_makes_its_node_eager_and_leaves_no_error(void **state) {
  (void)state;
  check_careless(CARELESS_MEMCPY);
}

static void test_device_sync_in_a_segment_makes_its_node_eager_and_leaves_no_error(void **state) {
  (void)state;
  check_careless(CARELESS_DEVICE_SYNC);
}

/* ------------------------------------- careful segments (issue 9, item 1) */

/* y = relu(2x + 1), with the error check careful C code makes around a sync:
 * `if ((st = cudaStreamSynchronize(s)) != cudaSuccess) return error;`. Under
 * capture the sync is illegal and the segment returns an error; the tree
 * must see the invalidated capture, run it eagerly (where the sync is legal)
 * and hand back the right outputs. The error it does not clear is the
 * tree's to clear. */
static cgt_status seg_checks_its_sync(cgt_launch *l, void *user) {
  env *e = user;
  cudaStream_t s = (cudaStream_t)cgt_launch_stream(l);
  const float *x = cgt_launch_input(l, 0);
  float *y = NULL;
  cudaError_t st;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&y));
  TRY(e->k->affine(s, x, 2.0f, 1.0f, y, e->n));
  if ((st = cudaStreamSynchronize(s)) != cudaSuccess)
    return CGT_ERR_BACKEND;
  TRY(e->k->relu(s, y, y, e->n));
  return cgt_launch_set_output(l, 0, y, e->n * sizeof(float));
}

/* z = 3y, after checking that no CUDA error is pending, as careful code
 * does before its first launch; a stale error counts in e->scratch. */
static cgt_status seg_checks_last_error(cgt_launch *l, void *user) {
  env *e = user;
  cudaError_t pending = cudaGetLastError();
  if (pending != cudaSuccess) {
    e->scratch += 1.0f;
    return CGT_ERR_BACKEND;
  }
  const float *y = cgt_launch_input(l, 0);
  float *z = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&z));
  TRY(e->k->affine(cgt_launch_stream(l), y, 3.0f, 0.0f, z, e->n));
  return cgt_launch_set_output(l, 0, z, e->n * sizeof(float));
}

static float relu_affine(float x) {
  float y = 2.0f * x + 1.0f;
  return y > 0.0f ? y : 0.0f;
}

static void test_segment_that_returns_its_stream_sync_error_records_as_eager_with_correct_outputs(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 4096;
  gpu_tree tree;
  open_tree(&tree, CGT_MODE_TREE, 1, 0, n);
  cgt_segment careful = add_segment(&tree, "careful", seg_checks_its_sync, 1, 1);
  cgt_segment after = add_segment(&tree, "checks_last_error", seg_checks_last_error, 1, 1);
  float *hx = host_alloc(n * sizeof(float)), *got = host_alloc(n * sizeof(float));
  float *x = dev_alloc(k, n * sizeof(float));
  tree.e.scratch = 0.0f;
  /* 1: warmup; 2: the capture fails, "careful" runs eagerly and turns
   * EAGER, "checks_last_error" records right after it; 3-5: replays. */
  const int steps = 5;
  for (int step = 0; step < steps; step++) {
    for (size_t i = 0; i < n; i++)
      hx[i] = (float)((int)(i % 11) - 5 + step);
    CHECK_KERN(k, k->upload(x, hx, n * sizeof(float)));
    if (step > 0)
      CHECK_TREE(tree.t, cgt_step_begin(tree.t));
    cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
    cgt_value y, z;
    run(&tree, careful, &arg, 1, &y, 1);
    assert_no_cuda_error();
    cgt_arg from_y = cgt_arg_value(y);
    run(&tree, after, &from_y, 1, &z, 1);
    read_value(&tree, y, got, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (got[i] != relu_affine(hx[i]))
        fail_msg("step %d: y[%zu] = %g, want %g", step, i, (double)got[i], (double)relu_affine(hx[i]));
    read_value(&tree, z, got, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (got[i] != 3.0f * relu_affine(hx[i]))
        fail_msg("step %d: z[%zu] = %g, want %g", step, i, (double)got[i], (double)(3.0f * relu_affine(hx[i])));
    assert_no_cuda_error();
  }
  if (tree.e.scratch != 0.0f)
    fail_msg("a segment after the failed capture found a CUDA error pending %g times", (double)tree.e.scratch);
  const char *reason = NULL;
  if (best_node(&tree, careful, CGT_NODE_EAGER, &reason) < 0)
    fail_msg("the segment whose sync failed under capture should be EAGER");
  assert_non_null(reason);
  assert_non_null(strstr(reason, "capture"));
  if (best_node(&tree, after, CGT_NODE_RECORDED, NULL) < steps - 2)
    fail_msg("the segment after the EAGER one should record and replay %d times", steps - 2);
  cgt_stats st;
  CHECK_TREE(tree.t, cgt_tree_stats(tree.t, &st));
  assert_int_equal(st.capture_failures, 1);
  k->dev_free(x);
  free(hx);
  free(got);
  close_tree(&tree);
}

/* z = 3x, checking cudaGetLastError first, in a tree made after another
 * tree's capture failed (and while that tree still lives). */
static void test_fresh_tree_after_a_failed_capture_checks_cuda_get_last_error_and_still_records(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 2048;
  float *hx = host_alloc(n * sizeof(float)), *got = host_alloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    hx[i] = (float)((int)(i % 9) - 4);
  float *x = dev_alloc(k, n * sizeof(float));
  CHECK_KERN(k, k->upload(x, hx, n * sizeof(float)));
  for (int keep_old = 0; keep_old < 2; keep_old++) {
    gpu_tree old;
    open_tree(&old, CGT_MODE_TREE, 1, 0, n);
    cgt_segment careful = add_segment(&old, "careful", seg_checks_its_sync, 1, 1);
    cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
    cgt_value y;
    for (int step = 0; step < 2; step++) { /* warmup, then the failed capture */
      if (step > 0)
        CHECK_TREE(old.t, cgt_step_begin(old.t));
      run(&old, careful, &arg, 1, &y, 1);
    }
    cgt_stats st;
    CHECK_TREE(old.t, cgt_tree_stats(old.t, &st));
    assert_int_equal(st.capture_failures, 1);
    if (!keep_old)
      close_tree(&old);

    gpu_tree fresh;
    open_tree(&fresh, CGT_MODE_TREE, 1, 0, n);
    fresh.e.scratch = 0.0f;
    cgt_segment healthy = add_segment(&fresh, "healthy", seg_checks_last_error, 1, 1);
    for (int step = 0; step < 4; step++) { /* warmup, record, two replays */
      if (step > 0)
        CHECK_TREE(fresh.t, cgt_step_begin(fresh.t));
      cgt_value z;
      run(&fresh, healthy, &arg, 1, &z, 1);
      read_value(&fresh, z, got, n * sizeof(float));
      for (size_t i = 0; i < n; i++)
        if (got[i] != 3.0f * hx[i])
          fail_msg("step %d: z[%zu] = %g, want %g", step, i, (double)got[i], (double)(3.0f * hx[i]));
    }
    assert_true(fresh.e.scratch == 0.0f);
    CHECK_TREE(fresh.t, cgt_tree_stats(fresh.t, &st));
    assert_int_equal(st.capture_failures, 0);
    assert_int_equal(st.recordings, 1);
    assert_int_equal(st.replays, 2);
    close_tree(&fresh);
    if (keep_old)
      close_tree(&old);
  }
  k->dev_free(x);
  free(hx);
  free(got);
}

/* A tree handed the legacy default stream cannot capture at all (CUDA
 * refuses to begin a capture on cudaStreamLegacy): every node falls back to
 * eager runs, cgt_run still succeeds with the right outputs, and no CUDA
 * error is left behind. */
static void test_tree_on_the_legacy_stream_runs_every_segment_eagerly_with_correct_outputs(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 1024;
  gpu_tree g;
  memset(&g, 0, sizeof g);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  o.stream = (void *)cudaStreamLegacy;
  CHECK_TREE(NULL, cgt_tree_create(&o, &g.t));
  g.e.k = k;
  g.e.n = n;
  CHECK_KERN(k, k->ctx_create(cgt_tree_stream(g.t), &g.e.ctx));
  cgt_segment seg = add_segment(&g, "checks_last_error", seg_checks_last_error, 1, 1);
  float *hx = host_alloc(n * sizeof(float)), *got = host_alloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    hx[i] = (float)(i % 6);
  float *x = dev_alloc(k, n * sizeof(float));
  CHECK_KERN(k, k->upload(x, hx, n * sizeof(float)));
  g.e.scratch = 0.0f;
  for (int step = 0; step < 4; step++) {
    if (step > 0)
      CHECK_TREE(g.t, cgt_step_begin(g.t));
    cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
    cgt_value z;
    run(&g, seg, &arg, 1, &z, 1);
    read_value(&g, z, got, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (got[i] != 3.0f * hx[i])
        fail_msg("step %d: z[%zu] = %g, want %g", step, i, (double)got[i], (double)(3.0f * hx[i]));
    assert_no_cuda_error();
  }
  assert_true(g.e.scratch == 0.0f);
  const char *reason = NULL;
  if (best_node(&g, seg, CGT_NODE_EAGER, &reason) < 0)
    fail_msg("a segment on the legacy stream should run EAGER");
  assert_non_null(reason);
  print_message("legacy stream: node EAGER because: %s\n", reason);
  cgt_stats st;
  CHECK_TREE(g.t, cgt_tree_stats(g.t, &st));
  assert_int_equal(st.capture_failures, 1);
  assert_int_equal(st.recordings, 0);
  k->dev_free(x);
  free(hx);
  free(got);
  close_tree(&g);
}

/* ------------------------------------ pool_limit_bytes (issue 9, item 8) */

/* out = 2x + 1 through a temporary of e->careless bytes (the field is
 * reused as a size here). */
static cgt_status seg_workspace(cgt_launch *l, void *user) {
  env *e = user;
  void *s = cgt_launch_stream(l);
  void *ws = NULL;
  float *out = NULL;
  TRY(cgt_launch_alloc(l, (size_t)e->careless, &ws));
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&out));
  TRY(e->k->affine(s, cgt_launch_input(l, 0), 2.0f, 1.0f, out, e->n));
  TRY(cgt_launch_free(l, ws));
  return cgt_launch_set_output(l, 0, out, e->n * sizeof(float));
}

/* Every stats field but host_allocs and the peaks must match. */
static void expect_same_stats(gpu_tree *g, const cgt_stats *before, const char *what) {
  cgt_stats now;
  CHECK_TREE(g->t, cgt_tree_stats(g->t, &now));
#define SAME_FIELD(f)                                                                                          \
  if (strcmp(#f, "host_allocs") && !strstr(#f, "peak_bytes") && before->f != now.f)                            \
    fail_msg("%s changed stats: %s %llu -> %llu", what, #f, (unsigned long long)before->f, (unsigned long long)now.f);
  CGT_STATS_FIELDS(SAME_FIELD, SAME_FIELD)
#undef SAME_FIELD
}

static void test_pool_limit_bytes_makes_device_oom_a_tested_path_on_cuda(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 1024, chunk = (size_t)1 << 20, limit = (size_t)4 << 20;
  const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE, CGT_MODE_EAGER};
  float *hx = host_alloc(n * sizeof(float)), *got = host_alloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    hx[i] = (float)(i % 5);
  float *x = dev_alloc(k, n * sizeof(float));
  CHECK_KERN(k, k->upload(x, hx, n * sizeof(float)));
  for (int m = 0; m < 3; m++) {
    gpu_tree g;
    memset(&g, 0, sizeof g);
    cgt_options o;
    cgt_options_init(&o);
    o.backend = CGT_BACKEND_CUDA;
    o.mode = modes[m];
    o.pool_chunk_bytes = chunk;
    o.pool_limit_bytes = limit;
    CHECK_TREE(NULL, cgt_tree_create(&o, &g.t));
    g.e.k = k;
    g.e.n = n;
    CHECK_KERN(k, k->ctx_create(cgt_tree_stream(g.t), &g.e.ctx));
    cgt_segment seg = add_segment(&g, "workspace", seg_workspace, 1, 1);
    cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
    for (int step = 0; step < 4; step++) {
      if (step > 0)
        CHECK_TREE(g.t, cgt_step_begin(g.t));
      /* A workspace above the cap: refused like a full device, nothing
       * changed, no CUDA error left behind. */
      g.e.careless = (int)(8u << 20);
      cgt_stats before;
      CHECK_TREE(g.t, cgt_tree_stats(g.t, &before));
      cgt_value out = {111};
      cgt_status st = cgt_run(g.t, seg, 1, &arg, 1, &out, 1);
      if (st != CGT_ERR_OUT_OF_MEMORY)
        fail_msg("mode %d step %d: a run past pool_limit_bytes returned %s (%s)", (int)modes[m], step,
                 cgt_status_name(st), cgt_tree_last_error(g.t));
      assert_int_equal(out.bits, 111);
      assert_non_null(strstr(cgt_tree_last_error(g.t), "pool_limit_bytes"));
      expect_same_stats(&g, &before, "a run past pool_limit_bytes");
      CHECK_TREE(g.t, cgt_tree_check(g.t));
      assert_no_cuda_error();
      /* One within it: warmup, record, replays. */
      g.e.careless = (int)(1u << 20);
      run(&g, seg, &arg, 1, &out, 1);
      read_value(&g, out, got, n * sizeof(float));
      for (size_t i = 0; i < n; i++)
        if (got[i] != 2.0f * hx[i] + 1.0f)
          fail_msg("mode %d step %d: out[%zu] = %g, want %g", (int)modes[m], step, i, (double)got[i],
                   (double)(2.0f * hx[i] + 1.0f));
      assert_no_cuda_error();
    }
    cgt_stats st;
    CHECK_TREE(g.t, cgt_tree_stats(g.t, &st));
    if (st.pool_reserved_bytes + st.side_pool_peak_bytes > limit)
      fail_msg("mode %d: the pools reserve %zu bytes, above the %zu-byte cap", (int)modes[m], st.pool_reserved_bytes,
               limit);
    if (modes[m] == CGT_MODE_TREE && st.replays < 2)
      fail_msg("the run within the cap should replay, replays = %llu", (unsigned long long)st.replays);
    close_tree(&g);
  }
  k->dev_free(x);
  free(hx);
  free(got);
}

/* ------------------------------------------------ a thousand branches */

/* head: y = -x, s = sum(y). then: z = y/2 + 1/4. else: z = y/2 - 1/4.
 * tail: w = 2z, copied back into x. So x' = -x + 1/2 or -x - 1/2, which
 * flips the sign of every element each step: the branch alternates, and
 * every number stays a small multiple of 1/2, exact in float. */
static cgt_status seg_head(cgt_launch *l, void *user) {
  env *e = user;
  void *s = cgt_launch_stream(l);
  const float *x = cgt_launch_input(l, 0);
  float *y = NULL, *sum = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&y));
  TRY(cgt_launch_alloc(l, sizeof(float), (void **)&sum));
  TRY(e->k->affine(s, x, -1.0f, 0.0f, y, e->n));
  TRY(e->k->sum(s, y, e->n, sum));
  TRY(cgt_launch_set_output(l, 0, y, e->n * sizeof(float)));
  return cgt_launch_set_output(l, 1, sum, sizeof(float));
}

static cgt_status seg_half(cgt_launch *l, env *e, float b) {
  const float *y = cgt_launch_input(l, 0);
  float *z = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&z));
  TRY(e->k->affine(cgt_launch_stream(l), y, 0.5f, b, z, e->n));
  return cgt_launch_set_output(l, 0, z, e->n * sizeof(float));
}

static cgt_status seg_then(cgt_launch *l, void *user) { return seg_half(l, user, 0.25f); }
static cgt_status seg_else(cgt_launch *l, void *user) { return seg_half(l, user, -0.25f); }

static cgt_status seg_tail(cgt_launch *l, void *user) {
  env *e = user;
  const float *z = cgt_launch_input(l, 0);
  float *w = NULL;
  TRY(cgt_launch_alloc(l, e->n * sizeof(float), (void **)&w));
  TRY(e->k->affine(cgt_launch_stream(l), z, 2.0f, 0.0f, w, e->n));
  return cgt_launch_set_output(l, 0, w, e->n * sizeof(float));
}

typedef struct branchy {
  gpu_tree g;
  cgt_segment head, then_seg, else_seg, tail;
  float *x; /* caller-owned state, a STATIC input rewritten every step */
} branchy;

static void branchy_open(branchy *b, cgt_mode mode, size_t n, const float *x0) {
  open_tree(&b->g, mode, 1, 0, n);
  b->head = add_segment(&b->g, "head", seg_head, 1, 2);
  b->then_seg = add_segment(&b->g, "then", seg_then, 1, 1);
  b->else_seg = add_segment(&b->g, "else", seg_else, 1, 1);
  b->tail = add_segment(&b->g, "tail", seg_tail, 1, 1);
  b->x = dev_alloc(b->g.e.k, n * sizeof(float));
  CHECK_KERN(b->g.e.k, b->g.e.k->upload(b->x, x0, n * sizeof(float)));
}

/* One step: 1 -> (2 | 3) -> 4, the branch taken on the host from the sum.
 * Returns the sum; *took_then says which branch ran. */
static float branchy_step(branchy *b, int step, int *took_then) {
  gpu_tree *g = &b->g;
  size_t bytes = g->e.n * sizeof(float);
  if (step > 0)
    CHECK_TREE(g->t, cgt_step_begin(g->t));
  cgt_arg arg = cgt_arg_static(b->x, bytes);
  cgt_value head_out[2], z, w;
  run(g, b->head, &arg, 1, head_out, 2);
  float sum = 0.0f;
  read_value(g, head_out[1], &sum, sizeof sum);
  CHECK_TREE(g->t, cgt_value_release(g->t, head_out[1]));
  *took_then = sum > 0.0f;
  arg = cgt_arg_value(head_out[0]);
  run(g, *took_then ? b->then_seg : b->else_seg, &arg, 1, &z, 1);
  CHECK_TREE(g->t, cgt_value_release(g->t, head_out[0]));
  arg = cgt_arg_value(z);
  run(g, b->tail, &arg, 1, &w, 1);
  CHECK_TREE(g->t, cgt_value_release(g->t, z));
  /* Device to device, on the tree's stream, before the next head reads x. */
  CHECK_TREE(g->t, cgt_value_copy_out(g->t, w, b->x, bytes));
  CHECK_TREE(g->t, cgt_value_release(g->t, w));
  return sum;
}

static void branchy_close(branchy *b) {
  b->g.e.k->dev_free(b->x);
  close_tree(&b->g);
}

static void test_thousand_steps_alternating_two_branches_equal_eager(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 1024;
  const int steps = 1000;
  float *x0 = host_alloc(n * sizeof(float)), *ref = host_alloc(n * sizeof(float));
  float *got_t = host_alloc(n * sizeof(float)), *got_e = host_alloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x0[i] = ref[i] = 1.0f + 0.5f * (float)(i % 16);
  branchy tree, eager;
  branchy_open(&tree, CGT_MODE_TREE, n, x0);
  branchy_open(&eager, CGT_MODE_EAGER, n, x0);

  int thens = 0;
  for (int step = 0; step < steps; step++) {
    int then_t = 0, then_e = 0;
    float sum_t = branchy_step(&tree, step, &then_t);
    float sum_e = branchy_step(&eager, step, &then_e);
    /* Host reference: y = -x, then x' = y + 1/2 or y - 1/2. */
    float sum_ref = 0.0f;
    for (size_t i = 0; i < n; i++)
      sum_ref += -ref[i];
    int then_ref = sum_ref > 0.0f;
    for (size_t i = 0; i < n; i++)
      ref[i] = -ref[i] + (then_ref ? 0.5f : -0.5f);
    if (sum_t != sum_e || then_t != then_e || then_t != then_ref || sum_t != sum_ref)
      fail_msg("step %d: sum %g (eager %g, host %g), branch %s (eager %s, host %s)", step, (double)sum_t,
               (double)sum_e, (double)sum_ref, then_t ? "then" : "else", then_e ? "then" : "else",
               then_ref ? "then" : "else");
    if (then_t == (step % 2 == 0))
      fail_msg("step %d: the branches should alternate, starting with else", step);
    thens += then_t;
  }
  CHECK_TREE(tree.g.t, cgt_sync(tree.g.t));
  CHECK_TREE(eager.g.t, cgt_sync(eager.g.t));
  CHECK_KERN(k, k->download(got_t, tree.x, n * sizeof(float)));
  CHECK_KERN(k, k->download(got_e, eager.x, n * sizeof(float)));
  if (memcmp(got_t, got_e, n * sizeof(float)) != 0 || memcmp(got_t, ref, n * sizeof(float)) != 0)
    fail_msg("after %d steps the tree's state differs from the eager run or the host reference", steps);
  assert_int_equal(thens, steps / 2);

  /* Five nodes (1, 2 and 3 under 1, a 4 under each), all replaying. */
  size_t count = 0;
  cgt_node_info *info = nodes_of(&tree.g, &count);
  uint64_t replays = 0;
  for (size_t i = 0; i < count; i++) {
    if (info[i].state != CGT_NODE_RECORDED)
      fail_msg("node %u (%s) is %s, not RECORDED: %s", info[i].id,
               info[i].segment_name != NULL ? info[i].segment_name : "?", cgt_node_state_name(info[i].state),
               info[i].reason != NULL ? info[i].reason : "");
    replays += info[i].replays;
  }
  free(info);
  if (count < 5)
    fail_msg("expected at least 5 nodes, found %zu", count);
  /* Every step but the first few replays all three of its segments. */
  if (replays < (uint64_t)(3 * steps - 30))
    fail_msg("only %llu replays in %d steps of 3 segments", (unsigned long long)replays, steps);
  cgt_stats st;
  CHECK_TREE(tree.g.t, cgt_tree_stats(tree.g.t, &st));
  assert_int_equal(st.capture_failures, 0);
  CHECK_TREE(eager.g.t, cgt_tree_stats(eager.g.t, &st));
  assert_int_equal(st.replays, 0);

  free(x0);
  free(ref);
  free(got_t);
  free(got_e);
  branchy_close(&tree);
  branchy_close(&eager);
}

/* ------------------------------------------ cgt_run does not wait */

/* API.md: "cgt_run returns only after the work is enqueued; it does not
 * wait for it." A segment whose work starts with a host function that
 * blocks the stream until the test opens a gate shows it: after cgt_run
 * returns, in a warmup, a recording and replays alike, the gate is still
 * shut, the host function has not passed it and the tree's stream is not
 * done. A cgt_run that waited for its work would wait for the gate: the
 * host function gives up after GATE_SECONDS, so such a run returns late
 * with the gate passed, and the test fails instead of hanging. */
enum { GATE_SECONDS = 10 };

typedef struct gate {
  atomic_int open;
  atomic_int passed;    /* host functions that got through */
  atomic_int timed_out; /* host functions that gave up waiting */
} gate;

static void CUDART_CB gate_wait(void *user) { /* on CUDA's callback thread: no CUDA calls here */
  gate *g = user;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!atomic_load(&g->open)) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > GATE_SECONDS) {
      atomic_fetch_add(&g->timed_out, 1);
      break;
    }
  }
  atomic_fetch_add(&g->passed, 1);
}

typedef struct gated_env {
  env e;
  gate *g;
} gated_env;

/* y = 2x + 1, after the gate. */
static cgt_status seg_gated_affine(cgt_launch *l, void *user) {
  gated_env *ge = user;
  cudaStream_t s = (cudaStream_t)cgt_launch_stream(l);
  float *y = NULL;
  TRY(cgt_launch_alloc(l, ge->e.n * sizeof(float), (void **)&y));
  if (cudaLaunchHostFunc(s, gate_wait, ge->g) != cudaSuccess)
    return CGT_ERR_BACKEND;
  TRY(ge->e.k->affine(s, cgt_launch_input(l, 0), 2.0f, 1.0f, y, ge->e.n));
  return cgt_launch_set_output(l, 0, y, ge->e.n * sizeof(float));
}

static void test_cgt_run_returns_before_its_work_runs_in_warmup_recording_and_replay(void **state) {
  (void)state;
  const kernels *k = cuda_kernels_or_skip();
  const size_t n = 4096;
  gpu_tree tree;
  open_tree(&tree, CGT_MODE_TREE, 1, 0, n);
  warm_kernels(&tree);
  gate g;
  atomic_init(&g.open, 1);
  atomic_init(&g.passed, 0);
  atomic_init(&g.timed_out, 0);
  gated_env ge = {tree.e, &g};
  cgt_segment_desc d = {"gated", seg_gated_affine, &ge, 1, 1, 0};
  cgt_segment seg = 0;
  CHECK_TREE(tree.t, cgt_segment_register(tree.t, &d, &seg));
  float *hx = host_alloc(n * sizeof(float)), *got = host_alloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    hx[i] = (float)i - 100.0f;
  float *x = dev_alloc(k, n * sizeof(float));
  assert_int_equal(cudaMemcpy(x, hx, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = (cudaStream_t)cgt_tree_stream(tree.t);
  cgt_arg arg = cgt_arg_static(x, n * sizeof(float));
  const char *what[] = {"warmup", "recording", "replay", "replay"};
  for (int step = 0; step < 4; step++) {
    CHECK_TREE(tree.t, cgt_step_begin(tree.t));
    atomic_store(&g.open, 0);
    cgt_value y = {0};
    CHECK_TREE(tree.t, cgt_run(tree.t, seg, 0, &arg, 1, &y, 1));
    int passed = atomic_load(&g.passed);
    cudaError_t q = cudaStreamQuery(s);
    atomic_store(&g.open, 1);
    if (passed != step || atomic_load(&g.timed_out) != 0)
      fail_msg("step %d (%s): cgt_run returned after its work had run (host functions passed: %d, gave up: %d)",
               step, what[step], passed, atomic_load(&g.timed_out));
    if (q != cudaErrorNotReady)
      fail_msg("step %d (%s): the tree's stream was %s right after cgt_run, want cudaErrorNotReady", step,
               what[step], cudaGetErrorName(q));
    CHECK_TREE(tree.t, cgt_tree_check(tree.t));
    read_value(&tree, y, got, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      if (got[i] != 2.0f * hx[i] + 1.0f)
        fail_msg("step %d (%s): y[%zu] = %g, want %g", step, what[step], i, (double)got[i],
                 (double)(2.0f * hx[i] + 1.0f));
    CHECK_TREE(tree.t, cgt_value_release(tree.t, y));
  }
  assert_int_equal(atomic_load(&g.passed), 4);
  assert_true(best_node(&tree, seg, CGT_NODE_RECORDED, NULL) >= 2); /* steps 3 and 4 replayed the recording */
  k->dev_free(x);
  free(hx);
  free(got);
  close_tree(&tree);
}

/* ------------------------------------------------------------- devices */

/* One GPU is enough to see that creating, using and destroying a tree, and
 * a create that fails for a missing device, leave the caller's current
 * device as they found it (test_multigpu checks it across two GPUs). */
static void test_tree_calls_and_a_failed_create_leave_the_current_device_alone(void **state) {
  (void)state;
  cuda_kernels_or_skip();
  int before = -1, now = -1;
  assert_int_equal(cudaGetDevice(&before), cudaSuccess);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  o.device = 4096;
  cgt_tree *t = NULL;
  assert_int_equal(cgt_tree_create(&o, &t), CGT_ERR_NO_DEVICE);
  assert_null(t);
  assert_int_equal(cudaGetDevice(&now), cudaSuccess);
  assert_int_equal(now, before);
  assert_no_cuda_error();
  gpu_tree g;
  open_tree(&g, CGT_MODE_TREE, 1, 0, 64);
  assert_int_equal(cudaGetDevice(&now), cudaSuccess);
  assert_int_equal(now, before);
  close_tree(&g);
  assert_int_equal(cudaGetDevice(&now), cudaSuccess);
  assert_int_equal(now, before);
}

/* ------------------------------------------------------------- the table */

const struct CMUnitTest cuda_specific_tests[] = {
    cmocka_unit_test(test_cublas_gemm_with_a_pool_workspace_replays_equal_to_eager),
    cmocka_unit_test(test_segment_that_forks_and_joins_a_second_stream_records_and_replays),
    cmocka_unit_test(test_pool_grows_while_a_capture_is_open_and_the_recording_replays),
    cmocka_unit_test(test_stream_sync_in_a_segment_makes_its_node_eager_and_leaves_no_error),
    cmocka_unit_test(test_malloc_in_a_segment_makes_its_node_eager_and_leaves_no_error),
    cmocka_unit_test(test_synchronous_memcpy_in_a_segment_makes_its_node_eager_and_leaves_no_error),
    cmocka_unit_test(test_device_sync_in_a_segment_makes_its_node_eager_and_leaves_no_error),
    cmocka_unit_test(test_segment_that_returns_its_stream_sync_error_records_as_eager_with_correct_outputs),
    cmocka_unit_test(test_fresh_tree_after_a_failed_capture_checks_cuda_get_last_error_and_still_records),
    cmocka_unit_test(test_pool_limit_bytes_makes_device_oom_a_tested_path_on_cuda),
    cmocka_unit_test(test_tree_on_the_legacy_stream_runs_every_segment_eagerly_with_correct_outputs),
    cmocka_unit_test(test_thousand_steps_alternating_two_branches_equal_eager),
    cmocka_unit_test(test_tree_calls_and_a_failed_create_leave_the_current_device_alone),
    cmocka_unit_test(test_cgt_run_returns_before_its_work_runs_in_warmup_recording_and_replay),
};

const size_t cuda_specific_test_count = sizeof cuda_specific_tests / sizeof cuda_specific_tests[0];

int cuda_specific_run(void) {
  if (kernels_for(CGT_BACKEND_CUDA) == NULL || !cgt_cuda_available()) {
    printf("cuda_specific: no CUDA kernels built or no usable GPU: skipped\n");
    return 77;
  }
  return _cmocka_run_group_tests("cuda_specific", cuda_specific_tests, cuda_specific_test_count, NULL, NULL);
}
