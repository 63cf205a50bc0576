/* test_multigpu.c — one tree per GPU, NCCL collectives inside segments.
 *
 * The data-parallel pattern on two GPUs, one thread per device: each rank
 * runs a forward segment (a cuBLAS gemm and a sum) on its own data, an
 * all-reduce segment (two ncclAllReduce calls on the launch stream, so they
 * are captured into the graph and replayed), then a host-side branch on the
 * all-reduced loss: finite, the update segment changes the weights; not
 * finite (rank 0's data carries an infinity on some steps, and the
 * all-reduce hands it to both ranks), the backoff segment halves the loss
 * scale instead. Both ranks take the skip branch on the same steps, so both
 * record it and replay it.
 *
 * Every rank runs the same program twice, in a TREE tree and an EAGER tree
 * (each with its own communicator), and checks, step by step: the tree's
 * results equal the eager ones bit for bit; the all-reduced gradient equals
 * the sum of both ranks' local gradients (computed on the host from what
 * the ranks read back: one fp32 addition, exact); both ranks took the same
 * branch and have the same cgt_tree_path_hash, which also equals the eager
 * tree's. At the end the weights agree across trees and ranks, and the
 * tree's all-reduce and backoff nodes were RECORDED and replayed.
 *
 * A second test drives a tree on device 0 from a thread whose current
 * device is 1, and checks that every call leaves the thread's device alone
 * while the launch functions run on device 0.
 *
 * Worker threads cannot use cmocka's assertions (they longjmp), and a rank
 * that stops while its peer waits in a collective would hang the peer. So a
 * rank that finds an error prints it and ends the process with exit status
 * 1; an alarm does the same if the ranks hang.
 *
 * Exits 77 (skipped) without CUDA, with fewer than two GPUs, or when the
 * build has no NCCL (then only the device test runs).
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime.h>
#ifdef CGT_HAVE_NCCL
#include <nccl.h>
#endif

#include "cgtree.h"
#include "kernels.h"

#define RANKS 2
#define M 32         /* gemm size: M x M */
#define STEPS 14
#define TIMEOUT_S 120

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_multigpu: the ranks did not finish in time (a collective hangs?)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

static int device_count(void) {
  int n = 0;
  if (!cgt_cuda_available() || cudaGetDeviceCount(&n) != cudaSuccess)
    return 0;
  return n;
}

static int current_device(void) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess)
    return -2;
  return d;
}

/* ------------------------------------------- a tree on a non-current device */

typedef struct device_probe {
  const kernels *k;
  float a, b;
  int seen_device; /* the current device inside the launch function */
  int calls;
} device_probe;

static cgt_status probe_affine(cgt_launch *l, void *user) {
  device_probe *p = user;
  p->seen_device = current_device();
  p->calls++;
  void *out = NULL;
  size_t n = cgt_launch_input_bytes(l, 0) / sizeof(float);
  cgt_status s = cgt_launch_alloc(l, n * sizeof(float), &out);
  if (s == CGT_OK)
    s = p->k->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), p->a, p->b, out, n);
  if (s == CGT_OK)
    s = cgt_launch_set_output(l, 0, out, n * sizeof(float));
  return s;
}

#define EXPECT_DEVICE(d)                                                                                 \
  do {                                                                                                   \
    int now_ = current_device();                                                                         \
    if (now_ != (d))                                                                                     \
      fail_msg("line %d: the current device is %d, expected %d", __LINE__, now_, (d));                   \
  } while (0)
#define CHECK_TREE_OK(t, call)                                                                           \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      fail_msg("%s: %s (%s)", #call, cgt_status_name(s_), (t) ? cgt_tree_last_error(t) : "");            \
  } while (0)

static void test_a_tree_on_another_device_runs_there_and_leaves_the_callers_device_alone(void **state) {
  (void)state;
  enum { n = 256 };
  const kernels *k = kernels_for(CGT_BACKEND_CUDA);
  assert_non_null(k);
  /* Caller memory on device 0, made while device 0 is current. */
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  float host[n], got[n];
  for (int i = 0; i < n; i++)
    host[i] = (float)(i % 7) - 3.0f;
  void *x = NULL;
  assert_int_equal(k->dev_alloc(n * sizeof(float), &x), CGT_OK);
  assert_int_equal(k->upload(x, host, n * sizeof(float)), CGT_OK);

  assert_int_equal(cudaSetDevice(1), cudaSuccess);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  o.device = 0;
  cgt_tree *t = NULL;
  CHECK_TREE_OK(t, cgt_tree_create(&o, &t));
  EXPECT_DEVICE(1);
  device_probe p1 = {k, 2.0f, 1.0f, -1, 0}, p2 = {k, -1.0f, 4.0f, -1, 0};
  cgt_segment_desc d1 = {"first", probe_affine, &p1, 1, 1, 0}, d2 = {"second", probe_affine, &p2, 1, 1, 0};
  cgt_segment s1, s2;
  CHECK_TREE_OK(t, cgt_segment_register(t, &d1, &s1));
  CHECK_TREE_OK(t, cgt_segment_register(t, &d2, &s2));
  for (int step = 0; step < 5; step++) {
    CHECK_TREE_OK(t, cgt_step_begin(t));
    EXPECT_DEVICE(1);
    cgt_arg ax = cgt_arg_static(x, n * sizeof(float));
    cgt_value y, z;
    CHECK_TREE_OK(t, cgt_run(t, s1, 0, &ax, 1, &y, 1));
    EXPECT_DEVICE(1);
    cgt_arg ay = cgt_arg_value(y);
    CHECK_TREE_OK(t, cgt_run(t, s2, 0, &ay, 1, &z, 1));
    EXPECT_DEVICE(1);
    CHECK_TREE_OK(t, cgt_value_copy_out(t, z, got, sizeof got));
    EXPECT_DEVICE(1);
    CHECK_TREE_OK(t, cgt_sync(t));
    EXPECT_DEVICE(1);
    for (int i = 0; i < n; i++)
      if (got[i] != -(2.0f * host[i] + 1.0f) + 4.0f)
        fail_msg("step %d, element %d: got %g", step, i, (double)got[i]);
    CHECK_TREE_OK(t, cgt_tree_check(t));
  }
  /* Warmup and recording ran the launch functions, on device 0. */
  assert_int_equal(p1.seen_device, 0);
  assert_int_equal(p2.seen_device, 0);
  assert_int_equal(p1.calls, 2);
  cgt_stats st;
  CHECK_TREE_OK(t, cgt_tree_stats(t, &st));
  assert_true(st.replays >= 6);
  cgt_tree_destroy(t);
  EXPECT_DEVICE(1);

  /* A failing create leaves it alone too. */
  o.device = 4096;
  t = NULL;
  assert_int_equal(cgt_tree_create(&o, &t), CGT_ERR_NO_DEVICE);
  assert_null(t);
  EXPECT_DEVICE(1);
  assert_int_equal(cudaGetLastError(), cudaSuccess);

  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  k->dev_free(x);
}

#ifdef CGT_HAVE_NCCL
/* ------------------------------------------------- data parallel, 2 ranks */

/* A rank's failure ends the process: its peer may be waiting for it inside
 * a collective. */
static void rank_die(int rank, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: rank %d: ", file, line, rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  fflush(stdout);
  _exit(1);
}
#define RANK_FAIL(rank, ...) rank_die((rank), __FILE__, __LINE__, __VA_ARGS__)
#define RANK_CHECK(rank, cond)                                                                           \
  do {                                                                                                   \
    if (!(cond))                                                                                         \
      RANK_FAIL((rank), "check failed: %s", #cond);                                                      \
  } while (0)
#define RANK_OK(rank, tree, call)                                                                        \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      RANK_FAIL((rank), "%s: %s (%s)", #call, cgt_status_name(s_), (tree) ? cgt_tree_last_error(tree) : ""); \
  } while (0)
#define RANK_CUDA(rank, call)                                                                            \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess)                                                                               \
      RANK_FAIL((rank), "%s: %s", #call, cudaGetErrorString(e_));                                        \
  } while (0)


/* What the launch functions of one tree need. */
typedef struct rank_env {
  int rank;
  const kernels *k;
  kern_ctx *ctx;
  ncclComm_t comm;
  float lr;
} rank_env;

/* Inside a launch function: hand any failure back to the tree. */
#define TRY(call)                                                                                        \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      return s_;                                                                                         \
  } while (0)

/* forward: X (STATIC), W (STATIC) -> grad = X @ W, loss = sum(grad). */
static cgt_status seg_forward(cgt_launch *l, void *user) {
  rank_env *e = user;
  void *stream = cgt_launch_stream(l);
  void *grad, *loss, *ws;
  size_t ws_bytes = (size_t)4 << 20;
  TRY(cgt_launch_alloc(l, M * M * sizeof(float), &grad));
  TRY(cgt_launch_alloc(l, sizeof(float), &loss));
  TRY(cgt_launch_alloc(l, ws_bytes, &ws));
  TRY(e->k->gemm(e->ctx, stream, cgt_launch_input(l, 0), cgt_launch_input(l, 1), grad, M, M, M, ws, ws_bytes));
  TRY(cgt_launch_free(l, ws));
  TRY(e->k->sum(stream, grad, M * M, loss));
  TRY(cgt_launch_set_output(l, 0, grad, M * M * sizeof(float)));
  TRY(cgt_launch_set_output(l, 1, loss, sizeof(float)));
  return CGT_OK;
}

/* allreduce: grad, loss -> their sums over the ranks (NCCL on the launch
 * stream: captured into the graph when the tree records). */
static cgt_status seg_allreduce(cgt_launch *l, void *user) {
  rank_env *e = user;
  cudaStream_t stream = (cudaStream_t)cgt_launch_stream(l);
  void *grad, *loss;
  TRY(cgt_launch_alloc(l, M * M * sizeof(float), &grad));
  TRY(cgt_launch_alloc(l, sizeof(float), &loss));
  if (ncclAllReduce(cgt_launch_input(l, 0), grad, M * M, ncclFloat, ncclSum, e->comm, stream) != ncclSuccess ||
      ncclAllReduce(cgt_launch_input(l, 1), loss, 1, ncclFloat, ncclSum, e->comm, stream) != ncclSuccess)
    return CGT_ERR_BACKEND;
  TRY(cgt_launch_set_output(l, 0, grad, M * M * sizeof(float)));
  TRY(cgt_launch_set_output(l, 1, loss, sizeof(float)));
  return CGT_OK;
}

/* update: W (STATIC) -= lr * grad, in place; no outputs. */
static cgt_status seg_update(cgt_launch *l, void *user) {
  rank_env *e = user;
  void *stream = cgt_launch_stream(l);
  void *step;
  float *w = cgt_launch_input(l, 0);
  TRY(cgt_launch_alloc(l, M * M * sizeof(float), &step));
  TRY(e->k->affine(stream, cgt_launch_input(l, 1), -e->lr, 0.0f, step, M * M));
  TRY(e->k->add(stream, w, step, w, M * M));
  return CGT_OK;
}

/* backoff: scale (STATIC, one float) *= 0.5, in place; no outputs. */
static cgt_status seg_backoff(cgt_launch *l, void *user) {
  rank_env *e = user;
  float *scale = cgt_launch_input(l, 0);
  return e->k->affine(cgt_launch_stream(l), scale, 0.5f, 0.0f, scale, 1);
}

/* One rank's program on one tree. */
typedef struct rank_prog {
  cgt_tree *t;
  cudaStream_t stream;
  rank_env env;
  cgt_segment forward, allreduce, update, backoff;
  float *x, *w, *scale; /* caller memory on the rank's device */
} rank_prog;

/* What a rank saw in one step, for the comparisons. */
typedef struct step_view {
  float local[M * M];   /* this rank's gradient before the all-reduce */
  float reduced[M * M]; /* after */
  float loss;
  int finite;
  uint64_t hash;
} step_view;

typedef struct rank_job {
  int rank;
  ncclComm_t comm_tree, comm_eager;
  pthread_barrier_t *barrier;
  step_view (*views)[RANKS]; /* [step][rank], TREE mode */
  float final_w[M * M];
  float final_scale;
  int skips;
  uint64_t recorded_allreduce_replays, recorded_backoff_replays;
} rank_job;

static void prog_open(rank_prog *p, int rank, cgt_mode mode, ncclComm_t comm) {
  memset(p, 0, sizeof *p);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  o.mode = mode;
  o.device = rank;
  /* A stream of our own that does not synchronize with the legacy stream,
   * so nothing another thread (NCCL's own included) puts there can break a
   * capture. */
  RANK_CUDA(rank, cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
  o.stream = p->stream;
  RANK_OK(rank, NULL, cgt_tree_create(&o, &p->t));
  p->env.rank = rank;
  p->env.k = kernels_for(CGT_BACKEND_CUDA);
  p->env.comm = comm;
  p->env.lr = 0.125f;
  RANK_OK(rank, NULL, p->env.k->ctx_create(cgt_tree_stream(p->t), &p->env.ctx));
  cgt_segment_desc fd = {"forward", seg_forward, &p->env, 2, 2, 0};
  cgt_segment_desc ad = {"allreduce", seg_allreduce, &p->env, 2, 2, 0};
  cgt_segment_desc ud = {"update", seg_update, &p->env, 2, 0, 0};
  cgt_segment_desc bd = {"backoff", seg_backoff, &p->env, 1, 0, 0};
  RANK_OK(rank, p->t, cgt_segment_register(p->t, &fd, &p->forward));
  RANK_OK(rank, p->t, cgt_segment_register(p->t, &ad, &p->allreduce));
  RANK_OK(rank, p->t, cgt_segment_register(p->t, &ud, &p->update));
  RANK_OK(rank, p->t, cgt_segment_register(p->t, &bd, &p->backoff));
  const kernels *k = p->env.k;
  RANK_OK(rank, NULL, k->dev_alloc(M * M * sizeof(float), (void **)&p->x));
  RANK_OK(rank, NULL, k->dev_alloc(M * M * sizeof(float), (void **)&p->w));
  RANK_OK(rank, NULL, k->dev_alloc(sizeof(float), (void **)&p->scale));
  /* The same weights on every rank, as data parallelism starts. */
  float w[M * M], one = 1024.0f;
  for (int i = 0; i < M * M; i++)
    w[i] = (float)((i * 7) % 11 - 5) / 16.0f;
  RANK_OK(rank, NULL, k->upload(p->w, w, sizeof w));
  RANK_OK(rank, NULL, k->upload(p->scale, &one, sizeof one));
}

static void prog_close(rank_prog *p) {
  RANK_OK(p->env.rank, p->t, cgt_sync(p->t));
  p->env.k->ctx_destroy(p->env.ctx);
  p->env.k->dev_free(p->x);
  p->env.k->dev_free(p->w);
  p->env.k->dev_free(p->scale);
  cgt_tree_destroy(p->t);
  RANK_CUDA(p->env.rank, cudaStreamDestroy(p->stream));
}

/* Steps whose data on rank 0 carries an infinity: every third. */
static int poisoned(int step) { return step % 3 == 2; }

/* One step of one rank on one tree; fills *v. */
static void prog_step(rank_prog *p, int step, step_view *v) {
  int rank = p->env.rank;
  cgt_tree *t = p->t;
  float x[M * M];
  for (int i = 0; i < M * M; i++)
    x[i] = (float)((i + 3 * step + 5 * rank) % 9 - 4) / 8.0f;
  if (rank == 0 && poisoned(step))
    x[5] = INFINITY;
  RANK_OK(rank, t, cgt_sync(t)); /* the last step's work reads x */
  RANK_OK(rank, NULL, p->env.k->upload(p->x, x, sizeof x));

  RANK_OK(rank, t, cgt_step_begin(t));
  cgt_arg fa[2] = {cgt_arg_static(p->x, sizeof x), cgt_arg_static(p->w, M * M * sizeof(float))};
  cgt_value f[2], r[2];
  RANK_OK(rank, t, cgt_run(t, p->forward, 0, fa, 2, f, 2));
  cgt_arg ra[2] = {cgt_arg_value(f[0]), cgt_arg_value(f[1])};
  RANK_OK(rank, t, cgt_run(t, p->allreduce, 0, ra, 2, r, 2));
  RANK_OK(rank, t, cgt_value_copy_out(t, f[0], v->local, sizeof v->local));
  RANK_OK(rank, t, cgt_value_copy_out(t, r[0], v->reduced, sizeof v->reduced));
  RANK_OK(rank, t, cgt_value_copy_out(t, r[1], &v->loss, sizeof v->loss));
  RANK_OK(rank, t, cgt_sync(t));
  /* The host-side branch: skip the update when the loss overflowed. */
  v->finite = isfinite(v->loss);
  if (v->finite) {
    cgt_arg ua[2] = {cgt_arg_static(p->w, M * M * sizeof(float)), cgt_arg_value(r[0])};
    RANK_OK(rank, t, cgt_run(t, p->update, 0, ua, 2, NULL, 0));
  } else {
    cgt_arg ba = cgt_arg_static(p->scale, sizeof(float));
    RANK_OK(rank, t, cgt_run(t, p->backoff, 0, &ba, 1, NULL, 0));
  }
  RANK_OK(rank, t, cgt_tree_path_hash(t, &v->hash));
  RANK_OK(rank, t, cgt_sync(t));
  RANK_OK(rank, t, cgt_tree_check(t));
}

static int same_floats(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static void *rank_main(void *arg) {
  rank_job *j = arg;
  int rank = j->rank;
  RANK_CUDA(rank, cudaSetDevice(rank));
  rank_prog tree, eager;
  prog_open(&tree, rank, CGT_MODE_TREE, j->comm_tree);
  prog_open(&eager, rank, CGT_MODE_EAGER, j->comm_eager);
  static step_view ev[RANKS]; /* one per rank: the eager tree's view */
  for (int step = 0; step < STEPS; step++) {
    step_view *tv = &j->views[step][rank];
    prog_step(&tree, step, tv);
    prog_step(&eager, step, &ev[rank]);
    RANK_CHECK(rank, tv->finite == ev[rank].finite);
    /* Bit for bit where the numbers are numbers (a NaN's bits are not the
     * point of the skip branch; its effect on the loss scale is, below). */
    if (tv->finite) {
      if (!same_floats(tv->local, ev[rank].local, M * M) || !same_floats(tv->reduced, ev[rank].reduced, M * M))
        RANK_FAIL(rank, "step %d: the tree's gradients differ from eager", step);
      RANK_CHECK(rank, memcmp(&tv->loss, &ev[rank].loss, sizeof tv->loss) == 0);
    }
    RANK_CHECK(rank, tv->hash == ev[rank].hash);
    RANK_CHECK(rank, tv->finite == !poisoned(step));
    j->skips += !tv->finite;
    /* Both ranks' views of this step are complete after the barrier. */
    pthread_barrier_wait(j->barrier);
    const step_view *peer = &j->views[step][1 - rank];
    RANK_CHECK(rank, tv->hash == peer->hash);
    RANK_CHECK(rank, tv->finite == peer->finite);
    if (tv->finite) {
      RANK_CHECK(rank, same_floats(tv->reduced, peer->reduced, M * M));
      for (int i = 0; i < M * M; i++) {
        float sum = j->views[step][0].local[i] + j->views[step][1].local[i];
        if (memcmp(&sum, &tv->reduced[i], sizeof sum) != 0)
          RANK_FAIL(rank, "step %d, element %d: all-reduced %g, local sum %g", step, i, (double)tv->reduced[i],
                    (double)sum);
      }
    }
    pthread_barrier_wait(j->barrier); /* the peer is done reading our view */
  }
  /* The weights: the same in both trees, and (after the barrier) on both ranks. */
  float we[M * M], se = 0;
  RANK_OK(rank, NULL, tree.env.k->download(j->final_w, tree.w, sizeof j->final_w));
  RANK_OK(rank, NULL, eager.env.k->download(we, eager.w, sizeof we));
  RANK_OK(rank, NULL, tree.env.k->download(&j->final_scale, tree.scale, sizeof(float)));
  RANK_OK(rank, NULL, eager.env.k->download(&se, eager.scale, sizeof(float)));
  RANK_CHECK(rank, same_floats(j->final_w, we, M * M));
  RANK_CHECK(rank, j->final_scale == se);
  /* The all-reduce and the skip branch were recorded and replayed. */
  cgt_node_info info[32];
  size_t n = 0;
  RANK_OK(rank, tree.t, cgt_tree_nodes(tree.t, info, 32, &n));
  for (size_t i = 0; i < n && i < 32; i++) {
    if (info[i].state != CGT_NODE_RECORDED)
      RANK_FAIL(rank, "node %u (%s) is %s (%s)", info[i].id, info[i].segment_name, cgt_node_state_name(info[i].state),
                info[i].reason ? info[i].reason : "");
    if (info[i].segment == tree.allreduce)
      j->recorded_allreduce_replays += info[i].replays;
    if (info[i].segment == tree.backoff)
      j->recorded_backoff_replays += info[i].replays;
  }
  prog_close(&tree);
  prog_close(&eager);
  return NULL;
}

static void test_allreduce_segments_replay_like_eager_on_two_gpus_including_the_skip_branch(void **state) {
  (void)state;
  int devs[RANKS] = {0, 1};
  ncclComm_t comm_tree[RANKS], comm_eager[RANKS];
  assert_int_equal(ncclCommInitAll(comm_tree, RANKS, devs), ncclSuccess);
  assert_int_equal(ncclCommInitAll(comm_eager, RANKS, devs), ncclSuccess);
  static step_view views[STEPS][RANKS];
  static rank_job jobs[RANKS];
  pthread_barrier_t barrier;
  assert_int_equal(pthread_barrier_init(&barrier, NULL, RANKS), 0);
  pthread_t th[RANKS];
  for (int r = 0; r < RANKS; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].rank = r;
    jobs[r].comm_tree = comm_tree[r];
    jobs[r].comm_eager = comm_eager[r];
    jobs[r].barrier = &barrier;
    jobs[r].views = views;
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
  }
  for (int r = 0; r < RANKS; r++)
    assert_int_equal(pthread_join(th[r], NULL), 0);
  pthread_barrier_destroy(&barrier);
  for (int r = 0; r < RANKS; r++) {
    ncclCommDestroy(comm_tree[r]);
    ncclCommDestroy(comm_eager[r]);
  }
  int expected_skips = 0;
  for (int s = 0; s < STEPS; s++)
    expected_skips += poisoned(s);
  float scale = 1024.0f;
  for (int i = 0; i < expected_skips; i++)
    scale *= 0.5f;
  for (int r = 0; r < RANKS; r++) {
    assert_int_equal(jobs[r].skips, expected_skips);
    assert_true(jobs[r].final_scale == scale);
    /* warmup, record, then replays: STEPS - 2 for the all-reduce, and the
     * skip branch (expected_skips visits) replayed expected_skips - 2 times. */
    assert_int_equal(jobs[r].recorded_allreduce_replays, STEPS - 2);
    assert_int_equal(jobs[r].recorded_backoff_replays, expected_skips - 2);
  }
  assert_true(same_floats(jobs[0].final_w, jobs[1].final_w, M * M));
  /* The updates did something. */
  float w0[M * M];
  for (int i = 0; i < M * M; i++)
    w0[i] = (float)((i * 7) % 11 - 5) / 16.0f;
  assert_false(same_floats(jobs[0].final_w, w0, M * M));
  /* The two branches hashed differently. */
  assert_true(views[2][0].hash != views[0][0].hash);
  assert_true(views[5][0].hash == views[2][0].hash);
  assert_true(views[3][0].hash == views[0][0].hash);
}
#endif /* CGT_HAVE_NCCL */

int main(void) {
  int n = device_count();
  if (n < 2) {
    printf("%d usable CUDA device(s): the multi-GPU suite needs 2 and is skipped\n", n);
    return 77;
  }
  signal(SIGALRM, on_alarm);
  alarm(TIMEOUT_S);
  const struct CMUnitTest devices[] = {
      cmocka_unit_test(test_a_tree_on_another_device_runs_there_and_leaves_the_callers_device_alone),
  };
  int failed = cmocka_run_group_tests_name("devices", devices, NULL, NULL);
#ifdef CGT_HAVE_NCCL
  const struct CMUnitTest nccl[] = {
      cmocka_unit_test(test_allreduce_segments_replay_like_eager_on_two_gpus_including_the_skip_branch),
  };
  failed += cmocka_run_group_tests_name("nccl", nccl, NULL, NULL);
  return failed ? 1 : 0;
#else
  printf("built without NCCL: the all-reduce tests are skipped\n");
  return failed ? 1 : 77;
#endif
}
