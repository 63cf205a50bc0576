/* long_run.c — a long-running program whose shapes and paths come and go,
 * run unbounded and under a recording budget (issue 23).
 *
 * A server sees batch sizes and sequence buckets come and go, and takes
 * rarely used branches now and then. This program cycles 64 input shapes
 * and 4 host paths for 10,000 steps: each step runs three segments, A
 * (x + wA, x a DYNAMIC input of the step's shape), then B0 or B1 (an
 * affine map) and C0 or C1 (+ wC), the path's two bits choosing, with the
 * shape as the variant, and reads the result back as a server would. The
 * traffic has locality, as real traffic does: a working set of 8 (shape,
 * path) pairs carries most steps, one pair of it is replaced every 150
 * steps (over the run all 64 shapes pass through it), and --rare percent
 * of the steps (default 2) take a random pair of all 256. Halfway through,
 * the weights wA and wC are reloaded to new addresses (same values), as a
 * server reloading a checkpoint: update in place keeps the tree's size.
 *
 * It runs twice with the same sequence: unbounded (max_graphs = 0), then
 * with --budget graphs (default 32). Every step's result must be the same
 * bytes in both runs (a checksum per step), else it fails. It prints, every
 * --sample steps, the runs' hit rate so far (replays / runs), recordings,
 * evictions, updates in place, graphs held and their bytes, the pool's
 * reserved and peak bytes, and the process's host memory (resident set and
 * heap in use); at the end steps per second (overall and after warm-up),
 * the memory's spread after warm-up ((max - min) / max: flat is within 1%),
 * and the budget run's time per step against the unbounded one's.
 *
 *   build/bench/long_run [--backend sim|cuda|auto] [--steps N] [--budget G] [--rare P]
 *                        [--sample N] [--warmup N] [--json FILE] [--quick]
 *
 * On the simulator a step is microseconds of CPU work, so recordings weigh
 * little; on a GPU a recording costs a capture and an instantiate (hundreds
 * of microseconds) against a few microseconds per replay, and the ratio of
 * step times is the figure that matters. --json appends one line per run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "bench_util.h"

enum { SHAPES = 64, PATHS = 4, SLOTS = 8, DRIFT = 150, MAX_FLOATS = 64 * SHAPES };

static const char *prog = "long_run";
static const kernels *kern;

static int check(cgt_status st, const char *what, cgt_tree *t) { return bench_check(prog, st, what, t); }

static size_t floats_of(int shape) { return (size_t)64 * (size_t)(1 + shape); }

/* ------------------------------------------------------------- segments */

typedef struct seg_user {
  float a, b; /* affine: out = a*x + b; unused by the adds */
  int add;    /* 1: out = in0 + in1 (a STATIC weight) */
} seg_user;

static cgt_status launch_seg(cgt_launch *l, void *user) {
  const seg_user *u = user;
  size_t n = cgt_launch_input_bytes(l, 0) / sizeof(float);
  void *out;
  cgt_status st = cgt_launch_alloc(l, n * sizeof(float), &out);
  if (st != CGT_OK)
    return st;
  void *s = cgt_launch_stream(l);
  st = u->add ? kern->add(s, cgt_launch_input(l, 0), cgt_launch_input(l, 1), out, n)
              : kern->affine(s, cgt_launch_input(l, 0), u->a, u->b, out, n);
  if (st != CGT_OK)
    return st;
  return cgt_launch_set_output(l, 0, out, n * sizeof(float));
}

/* --------------------------------------------------------------- memory */

/* The process's resident set and heap in use, in bytes (0 where unknown). */
static void host_memory(size_t *rss, size_t *heap) {
  *rss = *heap = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    unsigned long size, resident;
    if (fscanf(f, "%lu %lu", &size, &resident) == 2)
      *rss = (size_t)resident * 4096;
    fclose(f);
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  *heap = mi.uordblks + mi.hblkhd;
#endif
}

/* ------------------------------------------------------------ the traffic */

typedef struct traffic {
  uint64_t rng;
  int slot_shape[SLOTS], slot_path[SLOTS];
  int next;
  int rare_percent;
} traffic;

static uint32_t next_rand(traffic *tr) {
  tr->rng ^= tr->rng << 13;
  tr->rng ^= tr->rng >> 7;
  tr->rng ^= tr->rng << 17;
  return (uint32_t)(tr->rng >> 16);
}

static void traffic_init(traffic *tr, int rare_percent) {
  memset(tr, 0, sizeof *tr);
  tr->rng = 0x9e3779b97f4a7c15ull;
  tr->rare_percent = rare_percent;
  for (int i = 0; i < SLOTS; i++) {
    tr->slot_shape[i] = i;
    tr->slot_path[i] = i % PATHS;
  }
  tr->next = SLOTS;
}

static void traffic_step(traffic *tr, long step, int *shape, int *path) {
  if (step > 0 && step % DRIFT == 0) { /* a pair leaves the working set, another comes */
    int k = tr->next % SLOTS;
    tr->slot_shape[k] = tr->next % SHAPES;
    tr->slot_path[k] = (tr->next * 3) % PATHS;
    tr->next++;
  }
  uint32_t r = next_rand(tr);
  if ((int)(r % 100) < tr->rare_percent) {
    *shape = (int)(next_rand(tr) % SHAPES);
    *path = (int)(next_rand(tr) % PATHS);
  } else {
    int k = (int)(next_rand(tr) % SLOTS);
    *shape = tr->slot_shape[k];
    *path = tr->slot_path[k];
  }
}

/* ---------------------------------------------------------------- one run */

typedef struct run_result {
  double seconds, seconds_after_warmup;
  cgt_stats s;
  size_t pool_min, pool_max, graph_bytes_min, graph_bytes_max, heap_min, heap_max, rss_min, rss_max;
} run_result;

typedef struct config {
  cgt_backend backend;
  long steps, sample, warmup;
  int rare;
} config;

static void spread_add(size_t v, size_t *lo, size_t *hi) {
  if (v < *lo)
    *lo = v;
  if (v > *hi)
    *hi = v;
}

static double spread(size_t lo, size_t hi) { return hi ? 100.0 * (double)(hi - lo) / (double)hi : 0.0; }

/* Runs the program on a tree with max_graphs = budget; checks[step] is the
 * step's checksum: written when `record_checks`, else compared. */
static int run_program(const config *c, uint32_t budget, double *checks, int record_checks, run_result *res) {
  cgt_options o;
  cgt_options_init(&o);
  o.backend = c->backend;
  o.max_graphs = budget;
  cgt_tree *t = NULL;
  if (!check(cgt_tree_create(&o, &t), "cgt_tree_create", NULL))
    return 0;
  static seg_user users[5] = {{0, 0, 1}, {2, 1, 0}, {-1, 3, 0}, {0, 0, 1}, {0, 0, 1}};
  static const char *const names[5] = {"A", "B0", "B1", "C0", "C1"};
  cgt_segment seg[5];
  for (int i = 0; i < 5; i++) {
    cgt_segment_desc d = {names[i], launch_seg, &users[i], users[i].add ? 2u : 1u, 1, 0};
    if (!check(cgt_segment_register(t, &d, &seg[i]), "cgt_segment_register", t))
      return 0;
  }
  float *host = malloc(MAX_FLOATS * sizeof *host);
  void *x = NULL, *w[2][2] = {{NULL, NULL}, {NULL, NULL}}; /* w[generation][A or C] */
  for (int i = 0; i < MAX_FLOATS; i++)
    host[i] = (float)(i % 13) * 0.25f - 1.0f;
  int ok = host && kern->dev_alloc(MAX_FLOATS * sizeof(float), &x) == CGT_OK &&
           kern->upload(x, host, MAX_FLOATS * sizeof(float)) == CGT_OK;
  for (int g = 0; g < 2 && ok; g++)
    for (int k = 0; k < 2 && ok; k++) {
      for (int i = 0; i < MAX_FLOATS; i++)
        host[i] = (float)((i * (k + 3)) % 7) * 0.5f - 1.5f;
      ok = kern->dev_alloc(MAX_FLOATS * sizeof(float), &w[g][k]) == CGT_OK &&
           kern->upload(w[g][k], host, MAX_FLOATS * sizeof(float)) == CGT_OK;
    }
  if (!ok) {
    fprintf(stderr, "%s: no memory for the inputs and weights\n", prog);
    return 0;
  }
  traffic tr;
  traffic_init(&tr, c->rare);
  memset(res, 0, sizeof *res);
  res->pool_min = res->graph_bytes_min = res->heap_min = res->rss_min = SIZE_MAX;
  printf("%-9s %7s %8s %10s %9s %7s %6s %10s %12s %12s %10s %10s\n", budget ? "budget" : "unbounded", "step",
         "hit %", "recordings", "evictions", "updates", "graphs", "graph KiB", "pool res KiB", "pool peak KiB",
         "rss KiB", "heap KiB");
  double t0 = bench_now_ns(), t_warm = t0;
  for (long step = 0; step < c->steps && ok; step++) {
    if (step == c->warmup)
      t_warm = bench_now_ns();
    int gen = step >= c->steps / 2; /* the weights reloaded halfway */
    int shape, path;
    traffic_step(&tr, step, &shape, &path);
    size_t n = floats_of(shape), bytes = n * sizeof(float);
    ok = check(cgt_step_begin(t), "cgt_step_begin", t);
    cgt_arg a[2] = {cgt_arg_dynamic(x, bytes), cgt_arg_static(w[gen][0], bytes)};
    cgt_value va, vb, vc;
    ok = ok && check(cgt_run(t, seg[0], (uint64_t)shape, a, 2, &va, 1), "run A", t);
    cgt_arg b = cgt_arg_value(va);
    ok = ok && check(cgt_run(t, seg[1 + (path & 1)], (uint64_t)shape, &b, 1, &vb, 1), "run B", t);
    ok = ok && check(cgt_value_release(t, va), "release", t);
    cgt_arg cc[2] = {cgt_arg_value(vb), cgt_arg_static(w[gen][1], bytes)};
    ok = ok && check(cgt_run(t, seg[3 + (path >> 1)], (uint64_t)shape, cc, 2, &vc, 1), "run C", t);
    ok = ok && check(cgt_value_release(t, vb), "release", t);
    ok = ok && check(cgt_value_copy_out(t, vc, host, bytes), "copy out", t) && check(cgt_sync(t), "sync", t);
    if (!ok)
      break;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
      sum += host[i] * (double)(1 + i % 5);
    if (record_checks) {
      checks[step] = sum;
    } else if (checks[step] != sum) {
      fprintf(stderr, "%s: step %ld (shape %d, path %d): the budget run's result differs from the unbounded run's\n",
              prog, step, shape, path);
      ok = 0;
      break;
    }
    if ((step + 1) % c->sample == 0 || step + 1 == c->steps) {
      cgt_stats s;
      cgt_tree_stats(t, &s);
      size_t rss, heap;
      host_memory(&rss, &heap);
      printf("%-9s %7ld %8.2f %10llu %9llu %7llu %6llu %10zu %12zu %12zu %10zu %10zu\n", "", step + 1,
             s.runs ? 100.0 * (double)s.replays / (double)s.runs : 0.0, (unsigned long long)s.recordings,
             (unsigned long long)s.evictions, (unsigned long long)s.updates, (unsigned long long)s.graphs,
             s.graph_bytes >> 10, s.pool_reserved_bytes >> 10, s.pool_peak_bytes >> 10, rss >> 10, heap >> 10);
      if (step >= c->warmup) {
        spread_add(s.pool_reserved_bytes, &res->pool_min, &res->pool_max);
        spread_add(s.graph_bytes, &res->graph_bytes_min, &res->graph_bytes_max);
        spread_add(heap, &res->heap_min, &res->heap_max);
        spread_add(rss, &res->rss_min, &res->rss_max);
      }
    }
  }
  double t1 = bench_now_ns();
  res->seconds = (t1 - t0) * 1e-9;
  res->seconds_after_warmup = (t1 - t_warm) * 1e-9;
  cgt_tree_stats(t, &res->s);
  if (ok && cgt_tree_check(t) != CGT_OK) {
    fprintf(stderr, "%s: cgt_tree_check: %s\n", prog, cgt_tree_last_error(t));
    ok = 0;
  }
  cgt_sync(t);
  kern->dev_free(x);
  for (int g = 0; g < 2; g++)
    for (int k = 0; k < 2; k++)
      kern->dev_free(w[g][k]);
  free(host);
  cgt_tree_destroy(t);
  return ok;
}

static void report(const config *c, uint32_t budget, const run_result *r, const char *device, FILE *json) {
  long after = c->steps - c->warmup;
  double sps = (double)c->steps / r->seconds, sps_after = after > 0 ? (double)after / r->seconds_after_warmup : 0;
  double hit = r->s.runs ? 100.0 * (double)r->s.replays / (double)r->s.runs : 0;
  printf("%s: %s: %ld steps, %.0f steps/s (%.0f after step %ld), hit rate %.2f%%, %llu recordings, %llu evictions, "
         "%llu updates in place, %llu nodes; after warm-up the spread (max-min)/max is %.2f%% of pool reserve, "
         "%.2f%% of graph bytes, %.2f%% of heap, %.2f%% of rss\n",
         prog, budget ? "budget" : "unbounded", c->steps, sps, sps_after, c->warmup, hit,
         (unsigned long long)r->s.recordings, (unsigned long long)r->s.evictions, (unsigned long long)r->s.updates,
         (unsigned long long)r->s.nodes, spread(r->pool_min, r->pool_max),
         spread(r->graph_bytes_min, r->graph_bytes_max), spread(r->heap_min, r->heap_max),
         spread(r->rss_min, r->rss_max));
  if (json) {
    char esc[256];
    fprintf(json,
            "{\"bench\": \"long_run\", \"device\": \"%s\", \"max_graphs\": %u, \"steps\": %ld, \"rare_percent\": %d, "
            "\"steps_per_s\": %.1f, \"steps_per_s_after_warmup\": %.1f, \"hit_rate\": %.4f, \"recordings\": %llu, "
            "\"evictions\": %llu, \"updates\": %llu, \"nodes\": %llu, \"graphs\": %llu, \"graph_bytes\": %zu, "
            "\"pool_reserved_bytes\": %zu, \"pool_peak_bytes\": %zu, \"pool_spread_pct\": %.3f, "
            "\"graph_bytes_spread_pct\": %.3f, \"heap_spread_pct\": %.3f, \"rss_spread_pct\": %.3f}\n",
            bench_json_escape(device, esc, sizeof esc), budget, c->steps, c->rare, sps, sps_after, hit / 100.0,
            (unsigned long long)r->s.recordings, (unsigned long long)r->s.evictions, (unsigned long long)r->s.updates,
            (unsigned long long)r->s.nodes, (unsigned long long)r->s.graphs, r->s.graph_bytes,
            r->s.pool_reserved_bytes, r->s.pool_peak_bytes, spread(r->pool_min, r->pool_max),
            spread(r->graph_bytes_min, r->graph_bytes_max), spread(r->heap_min, r->heap_max),
            spread(r->rss_min, r->rss_max));
  }
}

int main(int argc, char **argv) {
  config c = {CGT_BACKEND_AUTO, 10000, 500, 2000, 2};
  uint32_t budget = 32;
  const char *json_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
      const char *b = argv[++i];
      c.backend = !strcmp(b, "sim") ? CGT_BACKEND_SIM : !strcmp(b, "cuda") ? CGT_BACKEND_CUDA : CGT_BACKEND_AUTO;
    } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      c.steps = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--budget") && i + 1 < argc) {
      budget = (uint32_t)atol(argv[++i]);
    } else if (!strcmp(argv[i], "--rare") && i + 1 < argc) {
      c.rare = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--sample") && i + 1 < argc) {
      c.sample = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
      c.warmup = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!strcmp(argv[i], "--quick")) {
      c.steps = 2000;
      c.sample = 250;
      c.warmup = 500;
    } else {
      fprintf(stderr,
              "usage: long_run [--backend sim|cuda|auto] [--steps N] [--budget G] [--rare P] [--sample N] "
              "[--warmup N] [--json FILE] [--quick]\n");
      return 2;
    }
  }
  if (c.steps < 1 || c.sample < 1 || c.warmup < 0 || c.warmup >= c.steps || budget < 1 || c.rare < 0 || c.rare > 100) {
    fprintf(stderr, "%s: steps and sample must be positive, warmup below steps, budget at least 1, rare 0..100\n", prog);
    return 2;
  }
  if (c.backend == CGT_BACKEND_AUTO)
    c.backend = cgt_cuda_available() ? CGT_BACKEND_CUDA : CGT_BACKEND_SIM;
  kern = kernels_for(c.backend);
  if (!kern) {
    fprintf(stderr, "%s: no kernels for that backend in this build\n", prog);
    return 2;
  }
  char device[256];
  bench_device_name(c.backend, device, sizeof device);
  printf("%s: %s; %ld steps of 64 shapes x 4 paths, %d%% rare, working set of %d pairs drifting every %d steps; "
         "weights reloaded at step %ld\n",
         prog, device, c.steps, c.rare, SLOTS, DRIFT, c.steps / 2);
  double *checks = calloc((size_t)c.steps, sizeof *checks);
  FILE *json = json_path ? fopen(json_path, "a") : NULL;
  if (!checks || (json_path && !json)) {
    fprintf(stderr, "%s: no memory, or cannot open %s\n", prog, json_path ? json_path : "-");
    return 1;
  }
  run_result unbounded, bounded;
  int ok = run_program(&c, 0, checks, 1, &unbounded);
  if (ok)
    report(&c, 0, &unbounded, device, json);
  ok = ok && run_program(&c, budget, checks, 0, &bounded);
  if (ok) {
    report(&c, budget, &bounded, device, json);
    double ratio = bounded.seconds_after_warmup / unbounded.seconds_after_warmup;
    printf("%s: with max_graphs = %u a step takes %.3fx the unbounded tree's time after warm-up (target: at most "
           "1.3x); the budget run's graph bytes spread %.2f%% and pool reserve spread %.2f%% after warm-up "
           "(target: within 1%%)\n",
           prog, budget, ratio, spread(bounded.graph_bytes_min, bounded.graph_bytes_max),
           spread(bounded.pool_min, bounded.pool_max));
    printf("%s: every step's result was the same in both runs\n", prog);
  }
  if (json)
    fclose(json);
  free(checks);
  return ok ? 0 : 1;
}
