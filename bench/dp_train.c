/* dp_train.c — a data-parallel training step on several GPUs, eagerly or
 * through one graph tree per GPU, with and without CPU noise.
 *
 * The claim under test: graphs take the CPU's launch work off the critical
 * path, so a rank whose launching thread gets descheduled falls behind less,
 * and the others wait less for it in the all-reduce. Every rank is a thread
 * (or, with --procs, a process) driving its own GPU and its own tree
 * (docs/multi-gpu.md), with its own NCCL communicator (ncclCommInitRank on
 * an id made by rank 0), and runs:
 *
 *   forward    L layers of gemm + relu on its own batch (cuBLAS), then the
 *              loss: the mean of the last activation, plus an injected
 *              infinity on chosen steps (rank 0 only: its loss overflows)
 *   backward   L pairs of gemms shaped like a backward pass, packing the
 *              loss and the weight gradients into one buffer
 *   allreduce  ncclAllReduce of that buffer, in place, on the launch
 *              stream (captured into the graph in tree mode), between two
 *              device timestamps
 *   host       reads the all-reduced loss (a copy and a stream sync): the
 *              mixed-precision branch
 *   update     W -= lr/ranks * grad       if the loss is finite, else
 *   backoff    loss_scale *= 0.5          (the skip-step branch)
 *
 * Every rank sees the same all-reduced loss, so all ranks take the same
 * branch and the tree has two paths. --debug compares cgt_tree_path_hash
 * across the ranks after every step and aborts on a mismatch (ranks that
 * disagree on the path would issue different collectives and hang).
 *
 * Measured per rank, over the steps after --warmup: the step time (host
 * CLOCK_MONOTONIC from cgt_step_begin to the end-of-step cgt_sync), the
 * all-reduce's device time (GPU global timer before and after it: the
 * transfer plus the wait for the slowest peer), and the wait itself (that
 * time minus the smallest of any rank in the same step, the best estimate
 * of the transfer alone). Across ranks: the spread of the step-end times
 * (max - min of the ranks' CLOCK_MONOTONIC at the end of each step; one
 * host, one clock). The CPU noise: --noise N busy threads, each spinning
 * --noise-duty of every --noise-period-us and sleeping the rest.
 *
 * Correctness before time: the weights must end bit-equal on every rank,
 * and every rank must have skipped exactly the injected steps; the weights'
 * checksum is printed so eager and tree runs can be compared (they must
 * match). Exit status 0 on success, 1 on a failed check, 2 on bad usage,
 * 3 when the run timed out (a hung collective), 77 with too few GPUs.
 *
 * Ranks share one MAP_SHARED mapping made before any thread or fork (the
 * results, a process-shared barrier, the NCCL id), so threads and
 * processes run the same code; with --procs this process forks the ranks
 * before it touches CUDA and only waits, runs the noise and reports.
 *
 *   dp_train --mode tree|eager [--procs] [--noise N] [--steps S] [--json FILE] [--debug]
 */
/* MAP_ANONYMOUS is not POSIX; the build defines _POSIX_C_SOURCE. */
#define _DEFAULT_SOURCE

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "cgtree.h"
#include "dp_kernels.h"
#include "kernels.h"

#define MAX_RANKS 8
#define GRAD_HEAD 64 /* floats before the gradients in the packed buffer: [0] is the loss */

/* ------------------------------------------------------------ the options */

typedef struct config {
  cgt_mode mode;
  int ranks;
  int steps, warmup;
  int layers, hidden; /* the batch is `hidden` rows, so every gemm is hidden^3 */
  int skip_every;     /* rank 0's loss overflows on every skip_every-th step; 0: never */
  int noise_threads;
  double noise_duty;
  int noise_period_us;
  int debug;
  int procs; /* ranks are processes (fork) instead of threads */
  int timeout_s;
  const char *json;
  const char *label;
} config;

static void usage(void) {
  fprintf(stderr,
          "usage: dp_train [--mode tree|eager] [--ranks R] [--steps S] [--warmup W] [--layers L] [--hidden H]\n"
          "                [--skip-every K] [--noise N] [--noise-duty D] [--noise-period-us P] [--debug] [--procs]\n"
          "                [--timeout S] [--json FILE] [--label TEXT]\n");
}

static int parse(int argc, char **argv, config *c) {
  *c = (config){CGT_MODE_TREE, 2, 2000, 50, 8, 512, 10, 0, 0.5, 1000, 0, 0, 240, NULL, ""};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define INT_OPT(name, field)                                                                             \
  if (!strcmp(a, name) && v) {                                                                           \
    c->field = atoi(v);                                                                                  \
    i++;                                                                                                 \
    continue;                                                                                            \
  }
    INT_OPT("--ranks", ranks)
    INT_OPT("--steps", steps)
    INT_OPT("--warmup", warmup)
    INT_OPT("--layers", layers)
    INT_OPT("--hidden", hidden)
    INT_OPT("--skip-every", skip_every)
    INT_OPT("--noise", noise_threads)
    INT_OPT("--noise-period-us", noise_period_us)
    INT_OPT("--timeout", timeout_s)
#undef INT_OPT
    if (!strcmp(a, "--mode") && v) {
      if (!strcmp(v, "tree"))
        c->mode = CGT_MODE_TREE;
      else if (!strcmp(v, "eager"))
        c->mode = CGT_MODE_EAGER;
      else
        return 0;
      i++;
    } else if (!strcmp(a, "--noise-duty") && v) {
      c->noise_duty = atof(v);
      i++;
    } else if (!strcmp(a, "--json") && v) {
      c->json = v;
      i++;
    } else if (!strcmp(a, "--label") && v) {
      c->label = v;
      i++;
    } else if (!strcmp(a, "--debug")) {
      c->debug = 1;
    } else if (!strcmp(a, "--procs")) {
      c->procs = 1;
    } else {
      return 0;
    }
  }
  return c->ranks >= 1 && c->ranks <= MAX_RANKS && c->steps >= 1 && c->warmup >= 0 && c->layers >= 1 &&
         c->hidden >= 16 && c->hidden % 16 == 0 && c->skip_every >= 0 && c->noise_threads >= 0 &&
         c->noise_duty >= 0 && c->noise_duty <= 1 && c->noise_period_us >= 10 && c->timeout_s >= 1;
}

/* -------------------------------------------------------------- failures */

/* A rank that fails cannot just return: its peers would wait for it in the
 * next all-reduce forever. So any failure ends the process. */
static void die(int rank, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "dp_train: rank %d: ", rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stdout);
  fflush(stderr);
  _exit(1);
}

#define CGT_TRY(rank, tree, call)                                                                        \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      die((rank), "%s: %s (%s)", #call, cgt_status_name(s_), (tree) ? cgt_tree_last_error(tree) : "");   \
  } while (0)
#define CUDA_TRY(rank, call)                                                                             \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess)                                                                               \
      die((rank), "%s: %s", #call, cudaGetErrorString(e_));                                              \
  } while (0)

/* Inside a launch function: hand any failure back to the tree. */
#define TRY(call)                                                                                        \
  do {                                                                                                   \
    cgt_status s_ = (call);                                                                              \
    if (s_ != CGT_OK)                                                                                    \
      return s_;                                                                                         \
  } while (0)

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "dp_train: timed out (a collective hangs, or the run is too long)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(3);
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t fnv1a(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* --------------------------------------------------------------- a rank */

typedef struct shared shared;

typedef struct rank_state {
  const config *cfg;
  shared *sh;
  int rank;
  ncclComm_t comm;
  cgt_tree *t;
  cudaStream_t stream;
  const kernels *k;
  kern_ctx *ctx;
  cgt_segment forward, backward, allreduce, update, backoff;
  size_t act_floats;  /* one activation: hidden x hidden */
  size_t w_floats;    /* one layer's weights */
  size_t grad_floats; /* GRAD_HEAD + layers * w_floats */
  float *x, *w, *scale, *inject; /* caller memory */
  int *counter;
  uint64_t *stamps; /* device: [total steps][2] global-timer stamps */
  struct rank_result *res;
} rank_state;

/* What a rank leaves for main, in memory shared by the ranks whether they
 * are threads or processes (a MAP_SHARED mapping made before any fork,
 * so its pointers are valid everywhere). Arrays have one entry per step,
 * warmup included. */
typedef struct rank_result {
  double *t_begin, *t_end; /* host CLOCK_MONOTONIC, ns */
  int *skipped;
  uint64_t *hashes;
  double *allreduce_us; /* device time of the all-reduce */
  uint64_t weights_fnv; /* of the final weights' bytes */
  float scale;          /* the final loss scale */
  int weights_finite;
  int done;             /* the rank finished and filled everything */
  int nccl_version;
  char device[256];
  cgt_stats stats;
} rank_result;

struct shared {
  const config *cfg;
  pthread_barrier_t barrier; /* process-shared */
  ncclUniqueId nccl_id;      /* made by rank 0 */
  uint64_t step_hash[MAX_RANKS];
  rank_result res[MAX_RANKS];
};

static cgt_status seg_forward(cgt_launch *l, void *user) {
  rank_state *r = user;
  void *stream = cgt_launch_stream(l);
  int h = r->cfg->hidden, L = r->cfg->layers;
  const float *x = cgt_launch_input(l, 0), *w = cgt_launch_input(l, 1);
  float *acts, *loss;
  void *ws;
  size_t ws_bytes = (size_t)4 << 20;
  TRY(cgt_launch_alloc(l, (size_t)L * r->act_floats * sizeof(float), (void **)&acts));
  TRY(cgt_launch_alloc(l, sizeof(float), (void **)&loss));
  TRY(cgt_launch_alloc(l, ws_bytes, &ws));
  const float *in = x;
  for (int i = 0; i < L; i++) {
    float *out = acts + (size_t)i * r->act_floats;
    TRY(r->k->gemm(r->ctx, stream, in, w + (size_t)i * r->w_floats, out, h, h, h, ws, ws_bytes));
    TRY(r->k->relu(stream, out, out, r->act_floats));
    in = out;
  }
  TRY(cgt_launch_free(l, ws));
  TRY(r->k->sum(stream, in, r->act_floats, loss));
  TRY(dp_inject_loss(stream, loss, 1.0f / (float)r->act_floats, cgt_launch_input(l, 2), cgt_launch_input(l, 3)));
  TRY(cgt_launch_set_output(l, 0, acts, (size_t)L * r->act_floats * sizeof(float)));
  TRY(cgt_launch_set_output(l, 1, loss, sizeof(float)));
  return CGT_OK;
}

/* Shaped like a backward pass (same gemm count and sizes as a real one;
 * the batch is square, so an activation read as hidden x batch stands in
 * for its transpose). Output: [loss, pad..., dW_0, ..., dW_{L-1}]. */
static cgt_status seg_backward(cgt_launch *l, void *user) {
  rank_state *r = user;
  void *stream = cgt_launch_stream(l);
  int h = r->cfg->hidden, L = r->cfg->layers;
  const float *x = cgt_launch_input(l, 0), *w = cgt_launch_input(l, 1);
  const float *acts = cgt_launch_input(l, 2), *loss = cgt_launch_input(l, 3);
  float *grads, *g, *g2;
  void *ws;
  size_t ws_bytes = (size_t)4 << 20;
  TRY(cgt_launch_alloc(l, r->grad_floats * sizeof(float), (void **)&grads));
  TRY(cgt_launch_alloc(l, r->act_floats * sizeof(float), (void **)&g));
  TRY(cgt_launch_alloc(l, r->act_floats * sizeof(float), (void **)&g2));
  TRY(cgt_launch_alloc(l, ws_bytes, &ws));
  TRY(r->k->copy(stream, grads, loss, sizeof(float)));
  TRY(r->k->affine(stream, acts + (size_t)(L - 1) * r->act_floats, 1.0f / (float)r->act_floats, 0.0f, g,
                   r->act_floats));
  for (int i = L - 1; i >= 0; i--) {
    const float *a_in = i == 0 ? x : acts + (size_t)(i - 1) * r->act_floats;
    float *dw = grads + GRAD_HEAD + (size_t)i * r->w_floats;
    TRY(r->k->gemm(r->ctx, stream, a_in, g, dw, h, h, h, ws, ws_bytes));
    if (i > 0) {
      TRY(r->k->gemm(r->ctx, stream, g, w + (size_t)i * r->w_floats, g2, h, h, h, ws, ws_bytes));
      float *tmp = g;
      g = g2;
      g2 = tmp;
    }
  }
  TRY(cgt_launch_free(l, ws));
  TRY(cgt_launch_set_output(l, 0, grads, r->grad_floats * sizeof(float)));
  return CGT_OK;
}

/* The all-reduce, in place, between two device timestamps; the second one
 * moves the device step counter on. */
static cgt_status seg_allreduce(cgt_launch *l, void *user) {
  rank_state *r = user;
  void *stream = cgt_launch_stream(l);
  float *grads = cgt_launch_input(l, 0);
  TRY(dp_stamp(stream, r->stamps, r->counter, 0, 0));
  ncclResult_t nr = ncclAllReduce(grads, grads, r->grad_floats, ncclFloat, ncclSum, r->comm, (cudaStream_t)stream);
  if (nr != ncclSuccess) {
    fprintf(stderr, "dp_train: rank %d: ncclAllReduce: %s\n", r->rank, ncclGetErrorString(nr));
    return CGT_ERR_BACKEND;
  }
  TRY(dp_stamp(stream, r->stamps, r->counter, 1, 1));
  TRY(cgt_launch_set_output(l, 0, grads, r->grad_floats * sizeof(float)));
  return CGT_OK;
}

static cgt_status seg_update(cgt_launch *l, void *user) {
  rank_state *r = user;
  void *stream = cgt_launch_stream(l);
  float *w = cgt_launch_input(l, 0);
  const float *grads = (const float *)cgt_launch_input(l, 1) + GRAD_HEAD;
  size_t n = (size_t)r->cfg->layers * r->w_floats;
  float *step;
  TRY(cgt_launch_alloc(l, n * sizeof(float), (void **)&step));
  TRY(r->k->affine(stream, grads, -0.01f / (float)r->cfg->ranks, 0.0f, step, n));
  TRY(r->k->add(stream, w, step, w, n));
  return CGT_OK;
}

static cgt_status seg_backoff(cgt_launch *l, void *user) {
  rank_state *r = user;
  float *scale = cgt_launch_input(l, 0);
  return r->k->affine(cgt_launch_stream(l), scale, 0.5f, 0.0f, scale, 1);
}

/* Deterministic pseudo-random floats in [-amp, amp). */
static void fill_random(float *v, size_t n, uint64_t seed, float amp) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v[i] = amp * (2.0f * (float)(s >> 40) / (float)(1u << 24) - 1.0f);
  }
}

static int injected(const config *c, int step) { return c->skip_every > 0 && step % c->skip_every == c->skip_every - 1; }

static void rank_setup(rank_state *r) {
  const config *c = r->cfg;
  int rank = r->rank, total = c->warmup + c->steps;
  int ndev = 0;
  if (!cgt_cuda_available() || cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < c->ranks) {
    fprintf(stderr, "dp_train: rank %d: %d rank(s) need as many GPUs; %d usable\n", rank, c->ranks, ndev);
    fflush(stderr);
    _exit(77); /* the same answer on every rank, before any of them waits for another */
  }
  CUDA_TRY(rank, cudaSetDevice(rank));
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  o.mode = c->mode;
  o.device = rank;
  /* Our own stream, not synchronizing with the legacy stream: nothing
   * another thread (NCCL's included) puts there can break a capture. */
  CUDA_TRY(rank, cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
  o.stream = r->stream;
  CGT_TRY(rank, NULL, cgt_tree_create(&o, &r->t));
  r->k = kernels_for(CGT_BACKEND_CUDA);
  if (!r->k)
    die(rank, "no CUDA kernels were built");
  CGT_TRY(rank, NULL, r->k->ctx_create(cgt_tree_stream(r->t), &r->ctx));
  r->act_floats = (size_t)c->hidden * (size_t)c->hidden;
  r->w_floats = r->act_floats;
  r->grad_floats = GRAD_HEAD + (size_t)c->layers * r->w_floats;
  cgt_segment_desc d[5] = {{"forward", seg_forward, r, 4, 2, 0},
                           {"backward", seg_backward, r, 4, 1, 0},
                           {"allreduce", seg_allreduce, r, 1, 1, 0},
                           {"update", seg_update, r, 2, 0, 0},
                           {"backoff", seg_backoff, r, 1, 0, 0}};
  cgt_segment *ids[5] = {&r->forward, &r->backward, &r->allreduce, &r->update, &r->backoff};
  for (int i = 0; i < 5; i++)
    CGT_TRY(rank, r->t, cgt_segment_register(r->t, &d[i], ids[i]));

  size_t wn = (size_t)c->layers * r->w_floats;
  float *host = malloc((wn > r->act_floats ? wn : r->act_floats) * sizeof(float));
  float *inj = calloc((size_t)total, sizeof(float));
  if (!host || !inj)
    die(rank, "out of host memory");
  CGT_TRY(rank, NULL, r->k->dev_alloc(r->act_floats * sizeof(float), (void **)&r->x));
  CGT_TRY(rank, NULL, r->k->dev_alloc(wn * sizeof(float), (void **)&r->w));
  CGT_TRY(rank, NULL, r->k->dev_alloc(sizeof(float), (void **)&r->scale));
  CGT_TRY(rank, NULL, r->k->dev_alloc((size_t)total * sizeof(float), (void **)&r->inject));
  CGT_TRY(rank, NULL, r->k->dev_alloc(sizeof(int), (void **)&r->counter));
  CGT_TRY(rank, NULL, r->k->dev_alloc((size_t)total * 2 * sizeof(uint64_t), (void **)&r->stamps));
  /* Every rank starts from the same weights and sees its own batch. */
  fill_random(host, wn, 1, sqrtf(3.0f / (float)c->hidden));
  CGT_TRY(rank, NULL, r->k->upload(r->w, host, wn * sizeof(float)));
  fill_random(host, r->act_floats, 100 + (uint64_t)rank, 1.0f);
  CGT_TRY(rank, NULL, r->k->upload(r->x, host, r->act_floats * sizeof(float)));
  for (int s = 0; s < total; s++)
    inj[s] = rank == 0 && injected(c, s) ? INFINITY : 0.0f;
  CGT_TRY(rank, NULL, r->k->upload(r->inject, inj, (size_t)total * sizeof(float)));
  float scale = 65536.0f;
  int zero = 0;
  CGT_TRY(rank, NULL, r->k->upload(r->scale, &scale, sizeof scale));
  CGT_TRY(rank, NULL, r->k->upload(r->counter, &zero, sizeof zero));
  free(host);
  free(inj);
  /* One communicator per rank: rank 0 makes the id, every rank joins. */
  if (rank == 0) {
    ncclResult_t nr = ncclGetUniqueId(&r->sh->nccl_id);
    if (nr != ncclSuccess)
      die(rank, "ncclGetUniqueId: %s", ncclGetErrorString(nr));
  }
  pthread_barrier_wait(&r->sh->barrier);
  ncclResult_t nr = ncclCommInitRank(&r->comm, c->ranks, r->sh->nccl_id, rank);
  if (nr != ncclSuccess)
    die(rank, "ncclCommInitRank: %s", ncclGetErrorString(nr));
}

/* Reads the results back into r->res, then frees everything the rank made. */
static void rank_finish(rank_state *r) {
  const config *c = r->cfg;
  int rank = r->rank, total = c->warmup + c->steps;
  rank_result *res = r->res;
  size_t wn = (size_t)c->layers * r->w_floats;
  float *w = malloc(wn * sizeof(float));
  uint64_t *stamps = malloc((size_t)total * 2 * sizeof(uint64_t));
  if (!w || !stamps)
    die(rank, "out of host memory");
  CGT_TRY(rank, r->t, cgt_sync(r->t));
  CGT_TRY(rank, NULL, r->k->download(w, r->w, wn * sizeof(float)));
  CGT_TRY(rank, NULL, r->k->download(&res->scale, r->scale, sizeof(float)));
  CGT_TRY(rank, NULL, r->k->download(stamps, r->stamps, (size_t)total * 2 * sizeof(uint64_t)));
  res->weights_fnv = fnv1a(w, wn * sizeof(float));
  res->weights_finite = 1;
  for (size_t i = 0; i < wn; i++)
    res->weights_finite &= isfinite(w[i]) != 0;
  for (int s = 0; s < total; s++)
    res->allreduce_us[s] = (double)(stamps[2 * s + 1] - stamps[2 * s]) / 1e3;
  CGT_TRY(rank, r->t, cgt_tree_stats(r->t, &res->stats));
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, rank) == cudaSuccess)
    snprintf(res->device, sizeof res->device, "%s", prop.name);
  (void)ncclGetVersion(&res->nccl_version);
  free(w);
  free(stamps);
  r->k->ctx_destroy(r->ctx);
  cgt_tree_destroy(r->t);
  CUDA_TRY(rank, cudaStreamDestroy(r->stream));
  r->k->dev_free(r->x), r->k->dev_free(r->w), r->k->dev_free(r->scale);
  r->k->dev_free(r->inject), r->k->dev_free(r->counter), r->k->dev_free(r->stamps);
  (void)ncclCommDestroy(r->comm);
  res->done = 1;
}

static void rank_step(shared *sh, rank_state *r, int step) {
  const config *c = r->cfg;
  int rank = r->rank;
  cgt_tree *t = r->t;
  size_t wn = (size_t)c->layers * r->w_floats;
  rank_result *res = r->res;
  res->t_begin[step] = now_ns();
  CGT_TRY(rank, t, cgt_step_begin(t));
  cgt_arg fa[4] = {cgt_arg_static(r->x, r->act_floats * sizeof(float)), cgt_arg_static(r->w, wn * sizeof(float)),
                   cgt_arg_static(r->inject, (size_t)(c->warmup + c->steps) * sizeof(float)),
                   cgt_arg_static(r->counter, sizeof(int))};
  cgt_value f[2], grads;
  CGT_TRY(rank, t, cgt_run(t, r->forward, 0, fa, 4, f, 2));
  cgt_arg ba[4] = {fa[0], fa[1], cgt_arg_value(f[0]), cgt_arg_value(f[1])};
  CGT_TRY(rank, t, cgt_run(t, r->backward, 0, ba, 4, &grads, 1));
  CGT_TRY(rank, t, cgt_value_release(t, f[0]));
  CGT_TRY(rank, t, cgt_value_release(t, f[1]));
  cgt_arg aa = cgt_arg_value(grads);
  CGT_TRY(rank, t, cgt_run(t, r->allreduce, 0, &aa, 1, &grads, 1));
  /* The host-side branch on the all-reduced loss. */
  float loss = 0;
  CGT_TRY(rank, t, cgt_value_copy_out(t, grads, &loss, sizeof loss));
  CGT_TRY(rank, t, cgt_sync(t));
  res->skipped[step] = !isfinite(loss);
  if (!res->skipped[step]) {
    cgt_arg ua[2] = {fa[1], cgt_arg_value(grads)};
    CGT_TRY(rank, t, cgt_run(t, r->update, 0, ua, 2, NULL, 0));
  } else {
    cgt_arg sa = cgt_arg_static(r->scale, sizeof(float));
    CGT_TRY(rank, t, cgt_run(t, r->backoff, 0, &sa, 1, NULL, 0));
  }
  CGT_TRY(rank, t, cgt_sync(t));
  res->t_end[step] = now_ns();
  CGT_TRY(rank, t, cgt_tree_path_hash(t, &res->hashes[step]));
  if (c->debug) {
    /* Ranks that disagree here would issue different collectives next. */
    sh->step_hash[rank] = res->hashes[step];
    pthread_barrier_wait(&sh->barrier);
    for (int o = 0; o < c->ranks; o++)
      if (sh->step_hash[o] != res->hashes[step])
        die(rank, "step %d: path hash %016llx, rank %d has %016llx: the ranks took different paths", step,
            (unsigned long long)res->hashes[step], o, (unsigned long long)sh->step_hash[o]);
    pthread_barrier_wait(&sh->barrier);
  }
}

static void *rank_main(void *arg) {
  rank_state *r = arg;
  shared *sh = r->sh;
  rank_setup(r);
  pthread_barrier_wait(&sh->barrier);
  int total = r->cfg->warmup + r->cfg->steps;
  for (int s = 0; s < total; s++) {
    if (s == r->cfg->warmup)
      pthread_barrier_wait(&sh->barrier); /* the measured steps start together */
    rank_step(sh, r, s);
  }
  rank_finish(r);
  return NULL;
}

/* ------------------------------------------------------------- the noise */

typedef struct noise {
  pthread_t *threads;
  int n;
  _Atomic int stop;
  long busy_ns, idle_ns;
} noise;

static void *noise_main(void *arg) {
  noise *z = arg;
  volatile uint64_t sink = 0;
  while (!z->stop) {
    double t0 = now_ns();
    while (now_ns() - t0 < (double)z->busy_ns)
      sink = sink * 6364136223846793005ull + 1;
    if (z->idle_ns > 0) {
      struct timespec ts = {z->idle_ns / 1000000000L, z->idle_ns % 1000000000L};
      nanosleep(&ts, NULL);
    }
  }
  return NULL;
}

static int noise_start(noise *z, const config *c) {
  memset(z, 0, sizeof *z);
  if (c->noise_threads == 0)
    return 1;
  z->threads = calloc((size_t)c->noise_threads, sizeof *z->threads);
  if (!z->threads)
    return 0;
  z->busy_ns = (long)(c->noise_duty * c->noise_period_us * 1000.0);
  z->idle_ns = (long)c->noise_period_us * 1000L - z->busy_ns;
  for (; z->n < c->noise_threads; z->n++)
    if (pthread_create(&z->threads[z->n], NULL, noise_main, z) != 0)
      return 0;
  return 1;
}

static void noise_stop(noise *z) {
  z->stop = 1;
  for (int i = 0; i < z->n; i++)
    pthread_join(z->threads[i], NULL);
  free(z->threads);
}

/* ------------------------------------------------------------ statistics */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of n values (sorts them). */
static double pct(double *v, int n, double q) {
  if (n == 0)
    return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)ceil(q * n) - 1;
  return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static double mean(const double *v, int n) {
  double s = 0;
  for (int i = 0; i < n; i++)
    s += v[i];
  return n ? s / n : 0;
}

/* ------------------------------------------------------- shared memory */

/* One MAP_SHARED mapping for everything the ranks and main share, made
 * before any thread or fork: the same addresses in every process. */
static shared *shared_map(const config *c, size_t *bytes_out) {
  size_t total = (size_t)(c->warmup + c->steps);
  size_t head = (sizeof(shared) + 63) / 64 * 64;
  size_t per_rank = total * (3 * sizeof(double) + sizeof(uint64_t) + sizeof(int));
  size_t bytes = head + (size_t)c->ranks * (per_rank + 64);
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return NULL;
  shared *sh = m; /* zero-filled */
  char *p = (char *)m + head;
  for (int r = 0; r < c->ranks; r++) {
    rank_result *res = &sh->res[r];
    res->t_begin = (double *)(void *)p, p += total * sizeof(double);
    res->t_end = (double *)(void *)p, p += total * sizeof(double);
    res->allreduce_us = (double *)(void *)p, p += total * sizeof(double);
    res->hashes = (uint64_t *)(void *)p, p += total * sizeof(uint64_t);
    res->skipped = (int *)(void *)p, p += total * sizeof(int);
    p += 64 - (uintptr_t)p % 64;
  }
  pthread_barrierattr_t attr;
  if (pthread_barrierattr_init(&attr) != 0 || pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) != 0 ||
      pthread_barrier_init(&sh->barrier, &attr, (unsigned)c->ranks) != 0) {
    munmap(m, bytes);
    return NULL;
  }
  pthread_barrierattr_destroy(&attr);
  sh->cfg = c;
  *bytes_out = bytes;
  return sh;
}

/* Ranks as processes: fork them all before this process touches CUDA, wait
 * for them, and kill the rest as soon as one fails (they would wait for it
 * in the next collective). Returns 0, 77 when every rank skipped, or 1. */
static int run_processes(shared *sh, const config *c) {
  pid_t pids[MAX_RANKS];
  int n = 0, result = 0, skipped = 0;
  fflush(stdout);
  fflush(stderr);
  for (; n < c->ranks; n++) {
    pids[n] = fork();
    if (pids[n] < 0) {
      fprintf(stderr, "dp_train: fork failed\n");
      result = 1;
      break;
    }
    if (pids[n] == 0) {
      alarm((unsigned)c->timeout_s);
      rank_state r;
      memset(&r, 0, sizeof r);
      r.cfg = c;
      r.sh = sh;
      r.rank = n;
      r.res = &sh->res[n];
      rank_main(&r);
      fflush(stdout);
      _exit(0);
    }
  }
  noise z;
  if (!noise_start(&z, c)) {
    fprintf(stderr, "dp_train: could not start %d noise threads\n", c->noise_threads);
    result = 1;
  }
  for (int left = n; left > 0; left--) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0)
      break;
    for (int i = 0; i < n; i++)
      if (pids[i] == pid)
        pids[i] = 0;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (code == 77) {
      skipped++;
    } else if (code != 0 && result == 0) {
      fprintf(stderr, "dp_train: a rank process ended with status %d; stopping the others\n", code);
      result = 1;
    }
    if (result != 0)
      for (int i = 0; i < n; i++)
        if (pids[i] > 0)
          kill(pids[i], SIGKILL);
  }
  noise_stop(&z);
  if (result == 0 && skipped > 0)
    return 77;
  return result;
}

static int run_threads(shared *sh, const config *c) {
  static rank_state ranks[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  noise z;
  if (!noise_start(&z, c)) {
    fprintf(stderr, "dp_train: could not start %d noise threads\n", c->noise_threads);
    return 1;
  }
  for (int r = 0; r < c->ranks; r++) {
    ranks[r].cfg = c;
    ranks[r].sh = sh;
    ranks[r].rank = r;
    ranks[r].res = &sh->res[r];
    if (pthread_create(&th[r], NULL, rank_main, &ranks[r]) != 0) {
      fprintf(stderr, "dp_train: pthread_create failed\n");
      _exit(1); /* the ranks already started would wait for this one */
    }
  }
  for (int r = 0; r < c->ranks; r++)
    pthread_join(th[r], NULL);
  noise_stop(&z);
  return 0;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
  config cfg;
  if (!parse(argc, argv, &cfg)) {
    usage();
    return 2;
  }
  /* Processes must not touch CUDA before they fork: each rank checks the
   * device count itself (rank_setup). */
  if (!cfg.procs) {
    int ndev = 0;
    if (!cgt_cuda_available() || cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < cfg.ranks) {
      fprintf(stderr, "dp_train: %d rank(s) need as many GPUs; %d usable\n", cfg.ranks, ndev);
      return 77;
    }
  }
  signal(SIGALRM, on_alarm);
  alarm((unsigned)cfg.timeout_s + 5);
  int total = cfg.warmup + cfg.steps;
  size_t map_bytes = 0;
  shared *sh = shared_map(&cfg, &map_bytes);
  if (!sh) {
    fprintf(stderr, "dp_train: no shared memory\n");
    return 1;
  }
  double wall0 = now_ns();
  int rc = cfg.procs ? run_processes(sh, &cfg) : run_threads(sh, &cfg);
  double wall_s = (now_ns() - wall0) / 1e9;
  if (rc != 0)
    return rc;

  /* Correctness: every rank done, the same skips and path hashes on every
   * rank, the same final weights everywhere. */
  int failed = 0, expected_skips = 0, R = cfg.ranks, n = cfg.steps;
  for (int s = 0; s < total; s++)
    expected_skips += injected(&cfg, s);
  for (int r = 0; r < R; r++) {
    rank_result *res = &sh->res[r];
    if (!res->done) {
      fprintf(stderr, "dp_train: rank %d did not finish\n", r);
      return 1;
    }
    for (int s = 0; s < total; s++)
      if (res->skipped[s] != injected(&cfg, s) || res->hashes[s] != sh->res[0].hashes[s]) {
        fprintf(stderr, "dp_train: rank %d, step %d: skipped %d (injected %d), path hash %s rank 0's\n", r, s,
                res->skipped[s], injected(&cfg, s), res->hashes[s] == sh->res[0].hashes[s] ? "equals" : "differs from");
        failed = 1;
        break;
      }
    if (!res->weights_finite) {
      fprintf(stderr, "dp_train: rank %d: some final weights are not finite\n", r);
      failed = 1;
    }
    if (res->weights_fnv != sh->res[0].weights_fnv || res->scale != sh->res[0].scale) {
      fprintf(stderr, "dp_train: rank %d's weights or loss scale differ from rank 0's\n", r);
      failed = 1;
    }
  }

  /* Timing, over the measured steps. */
  double *v = malloc((size_t)n * sizeof(double)), *spread = malloc((size_t)n * sizeof(double));
  if (!v || !spread) {
    fprintf(stderr, "dp_train: out of host memory\n");
    return 1;
  }
  for (int s = 0; s < n; s++) {
    double lo = 1e300, hi = -1e300;
    for (int r = 0; r < R; r++) {
      double e = sh->res[r].t_end[cfg.warmup + s];
      lo = e < lo ? e : lo;
      hi = e > hi ? e : hi;
    }
    spread[s] = (hi - lo) / 1e3;
  }
  double spread_mean = mean(spread, n);
  double spread_p50 = pct(spread, n, 0.5), spread_p99 = pct(spread, n, 0.99), spread_max = spread[n - 1];

  const char *mode = cfg.mode == CGT_MODE_TREE ? "tree" : "eager";
  const rank_result *r0 = &sh->res[0];
  printf("dp_train %s: mode %s, %d ranks as %s (%s, NCCL %d), %d layers of %dx%d, %d steps after %d warmup, "
         "%d skipped, noise %d threads at %.0f%% of %d us; %.1f s\n",
         cfg.label, mode, R, cfg.procs ? "processes" : "threads", r0->device, r0->nccl_version, cfg.layers, cfg.hidden,
         cfg.hidden, n, cfg.warmup, expected_skips, cfg.noise_threads, cfg.noise_duty * 100, cfg.noise_period_us,
         wall_s);
  printf("  rank  step_p50_us  step_p99_us  step_mean_us  ar_p50_us  ar_p99_us  wait_p50_us  wait_p99_us  wait_mean_us\n");
  FILE *js = cfg.json ? fopen(cfg.json, "a") : NULL;
  if (cfg.json && !js)
    fprintf(stderr, "dp_train: cannot open %s for appending\n", cfg.json);
  if (js)
    fprintf(js,
            "{\"bench\": \"dp_train\", \"label\": \"%s\", \"mode\": \"%s\", \"ranks\": %d, \"rank_kind\": \"%s\", "
            "\"device\": \"%s\", \"nccl\": %d, \"layers\": %d, \"hidden\": %d, \"steps\": %d, \"warmup\": %d, "
            "\"skipped\": %d, \"noise_threads\": %d, \"noise_duty\": %.2f, \"noise_period_us\": %d, \"wall_s\": %.2f, "
            "\"weights_fnv1a\": \"%016llx\", \"ok\": %s, \"spread_mean_us\": %.2f, \"spread_p50_us\": %.2f, "
            "\"spread_p99_us\": %.2f, \"spread_max_us\": %.2f, \"per_rank\": [",
            cfg.label, mode, R, cfg.procs ? "processes" : "threads", r0->device, r0->nccl_version, cfg.layers,
            cfg.hidden, n, cfg.warmup, expected_skips, cfg.noise_threads, cfg.noise_duty, cfg.noise_period_us, wall_s,
            (unsigned long long)r0->weights_fnv, failed ? "false" : "true", spread_mean, spread_p50, spread_p99,
            spread_max);
  for (int r = 0; r < R; r++) {
    const rank_result *res = &sh->res[r];
    for (int s = 0; s < n; s++)
      v[s] = (res->t_end[cfg.warmup + s] - res->t_begin[cfg.warmup + s]) / 1e3;
    double step_mean = mean(v, n), step_p50 = pct(v, n, 0.5), step_p99 = pct(v, n, 0.99);
    for (int s = 0; s < n; s++)
      v[s] = res->allreduce_us[cfg.warmup + s];
    double ar_p50 = pct(v, n, 0.5), ar_p99 = pct(v, n, 0.99);
    /* The wait: this rank's all-reduce time minus the shortest of any rank
     * in the same step. */
    for (int s = 0; s < n; s++) {
      double lo = 1e300;
      for (int o = 0; o < R; o++)
        lo = sh->res[o].allreduce_us[cfg.warmup + s] < lo ? sh->res[o].allreduce_us[cfg.warmup + s] : lo;
      v[s] = res->allreduce_us[cfg.warmup + s] - lo;
    }
    double wait_mean = mean(v, n), wait_p50 = pct(v, n, 0.5), wait_p99 = pct(v, n, 0.99);
    printf("  %4d  %11.1f  %11.1f  %12.1f  %9.1f  %9.1f  %11.1f  %11.1f  %12.1f\n", r, step_p50, step_p99, step_mean,
           ar_p50, ar_p99, wait_p50, wait_p99, wait_mean);
    if (js)
      fprintf(js,
              "%s{\"rank\": %d, \"step_p50_us\": %.2f, \"step_p99_us\": %.2f, \"step_mean_us\": %.2f, "
              "\"allreduce_p50_us\": %.2f, \"allreduce_p99_us\": %.2f, \"wait_p50_us\": %.2f, \"wait_p99_us\": %.2f, "
              "\"wait_mean_us\": %.2f}",
              r ? ", " : "", r, step_p50, step_p99, step_mean, ar_p50, ar_p99, wait_p50, wait_p99, wait_mean);
  }
  printf("  step-end spread across ranks: mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us\n", spread_mean,
         spread_p50, spread_p99, spread_max);
  printf("  rank 0 tree: %llu nodes, %llu recordings, %llu replays, %llu eager runs\n",
         (unsigned long long)r0->stats.nodes, (unsigned long long)r0->stats.recordings,
         (unsigned long long)r0->stats.replays, (unsigned long long)r0->stats.eager_runs);
  printf("  weights fnv1a %016llx, equal on all ranks: %s; loss scale %g\n", (unsigned long long)r0->weights_fnv,
         failed ? "NO" : "yes", (double)r0->scale);
  if (js) {
    fprintf(js, "]}\n");
    fclose(js);
  }
  free(v);
  free(spread);
  pthread_barrier_destroy(&sh->barrier);
  munmap(sh, map_bytes);
  return failed;
}
