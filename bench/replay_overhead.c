/* replay_overhead.c — what one replayed cgt_run costs the host, beyond the
 * device's own graph launch.
 *
 * The program: every step runs a producer segment (no inputs, two outputs),
 * then K = 100 runs of one measured segment with four arguments,
 *
 *   config "2V+2S":     VALUE, VALUE, STATIC, STATIC   (no input copy)
 *   config "2V+1S+1D":  VALUE, VALUE, STATIC, DYNAMIC  (one placeholder copy)
 *
 * where the two VALUEs are the outputs of the two previous runs, and each
 * value is released right after its last use, as a compiler's program does.
 * The measured segment enqueues one kernel: an empty simulator kernel, or on
 * CUDA a one-element fill (the smallest kernel the shared table has). After
 * the tree has recorded every node, each run is a replay: one hash probe, a
 * liveness check, the placeholder copy (2V+1S+1D only), one graph launch.
 *
 * We time steps (K+1 replays each, cgt_step_begin and the releases
 * included) and divide by the runs; the median of `reps` repetitions of
 * about `runs` runs each is the figure. Then the bare device cost of the same
 * work, with no runtime around it: launching one recorded node's executable
 * graph directly (tree__launch_exec, the backend's launch and nothing else),
 * for 2V+1S+1D preceded by the backend's async copy of the argument's bytes.
 * The runtime's own cost per run is the difference. On CUDA the figures are host time
 * (the loop is timed without waiting for the GPU; the stream is drained
 * between steps, outside the timed part, so the launch queue never fills).
 *
 * The tree must make no host allocation while it replays: the delta of
 * cgt_stats.host_allocs over the timed phase is printed and must be 0, and
 * every timed run must have been a replay; otherwise the program fails.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cgtree_sim.h"
#include "kernels.h"
#include "tree_internal.h"

enum { RUNS_PER_STEP = 100, VALUE_BYTES = 256 };

typedef struct bench_ctx {
  const kernels *k;
  cgt_backend backend;
} bench_ctx;

static void empty_kernel(void *args) { (void)args; }

/* The one kernel of the measured segment. */
static cgt_status one_kernel(const bench_ctx *c, void *stream, float *out) {
  if (c->backend == CGT_BACKEND_SIM)
    return cgt_sim_launch(stream, empty_kernel, NULL, 0);
  return c->k->fill(stream, out, 1.0f, 1);
}

static cgt_status producer_launch(cgt_launch *l, void *user) {
  const bench_ctx *c = user;
  void *a, *b;
  cgt_status st = cgt_launch_alloc(l, VALUE_BYTES, &a);
  if (st == CGT_OK)
    st = cgt_launch_alloc(l, VALUE_BYTES, &b);
  if (st == CGT_OK)
    st = c->k->fill(cgt_launch_stream(l), a, 0.0f, VALUE_BYTES / sizeof(float));
  if (st == CGT_OK)
    st = c->k->fill(cgt_launch_stream(l), b, 0.0f, VALUE_BYTES / sizeof(float));
  if (st == CGT_OK)
    st = cgt_launch_set_output(l, 0, a, VALUE_BYTES);
  if (st == CGT_OK)
    st = cgt_launch_set_output(l, 1, b, VALUE_BYTES);
  return st;
}

static cgt_status measured_launch(cgt_launch *l, void *user) {
  const bench_ctx *c = user;
  void *out;
  cgt_status st = cgt_launch_alloc(l, VALUE_BYTES, &out);
  if (st == CGT_OK)
    st = one_kernel(c, cgt_launch_stream(l), out);
  if (st == CGT_OK)
    st = cgt_launch_set_output(l, 0, out, VALUE_BYTES);
  return st;
}

typedef struct config {
  const char *name;
  const char *what;
  int dynamic; /* the 4th argument is DYNAMIC (else STATIC) */
} config;

static const config configs[] = {
    {"2V+1S+1D", "2 VALUE + 1 STATIC + 1 DYNAMIC", 1},
    {"2V+2S", "2 VALUE + 2 STATIC", 0},
};

typedef struct result {
  double replay_ns, bare_launch_ns, bare_copy_launch_ns, overhead_ns;
  uint64_t host_allocs_delta, timed_runs, timed_replays;
} result;

typedef struct setup {
  cgt_tree *t;
  bench_ctx c;
  cgt_segment producer, measured;
  void *w_buf, *w2_buf, *x_buf, *copy_dst;
  const config *cfg;
} setup;

static int check(cgt_status st, const char *what, cgt_tree *t) {
  if (st == CGT_OK)
    return 1;
  fprintf(stderr, "replay_overhead: %s: %s%s%s\n", what, cgt_status_name(st), t ? ": " : "",
          t ? cgt_tree_last_error(t) : "");
  return 0;
}

/* One step: the producer, then RUNS_PER_STEP measured runs. */
static cgt_status one_step(setup *s) {
  cgt_tree *t = s->t;
  cgt_status st = cgt_step_begin(t);
  cgt_value v[2];
  if (st == CGT_OK)
    st = cgt_run(t, s->producer, 0, NULL, 0, v, 2);
  cgt_value older = v[0], newer = v[1];
  cgt_arg args[4];
  args[2] = cgt_arg_static(s->w_buf, VALUE_BYTES);
  args[3] = s->cfg->dynamic ? cgt_arg_dynamic(s->x_buf, VALUE_BYTES) : cgt_arg_static(s->w2_buf, VALUE_BYTES);
  for (int i = 0; i < RUNS_PER_STEP && st == CGT_OK; i++) {
    args[0] = cgt_arg_value(newer);
    args[1] = cgt_arg_value(older);
    cgt_value o;
    st = cgt_run(t, s->measured, 0, args, 4, &o, 1);
    if (st == CGT_OK)
      st = cgt_value_release(t, older);
    older = newer;
    newer = o;
  }
  return st;
}

static int setup_open(setup *s, cgt_backend backend, const config *cfg) {
  memset(s, 0, sizeof *s);
  s->cfg = cfg;
  s->c.backend = backend;
  s->c.k = kernels_for(backend);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = backend;
  o.mode = CGT_MODE_TREE;
  if (!s->c.k || !check(cgt_tree_create(&o, &s->t), "cgt_tree_create", NULL))
    return 0;
  const kernels *k = s->c.k;
  cgt_segment_desc p = {"producer", producer_launch, &s->c, 0, 2, 0};
  cgt_segment_desc m = {"measured", measured_launch, &s->c, 4, 1, 0};
  if (!check(cgt_segment_register(s->t, &p, &s->producer), "register", s->t) ||
      !check(cgt_segment_register(s->t, &m, &s->measured), "register", s->t))
    return 0;
  float host[VALUE_BYTES / sizeof(float)];
  for (size_t i = 0; i < VALUE_BYTES / sizeof(float); i++)
    host[i] = (float)i;
  void **bufs[] = {&s->w_buf, &s->w2_buf, &s->x_buf, &s->copy_dst};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!check(k->dev_alloc(VALUE_BYTES, bufs[i]), "dev_alloc", NULL) ||
        !check(k->upload(*bufs[i], host, VALUE_BYTES), "upload", NULL))
      return 0;
  return 1;
}

static void setup_close(setup *s) {
  if (s->t)
    (void)cgt_sync(s->t);
  if (s->c.k) {
    s->c.k->dev_free(s->w_buf);
    s->c.k->dev_free(s->w2_buf);
    s->c.k->dev_free(s->x_buf);
    s->c.k->dev_free(s->copy_dst);
  }
  cgt_tree_destroy(s->t);
}

static int measure(cgt_backend backend, const config *cfg, int reps, long runs, result *r) {
  setup s;
  int ok = 0;
  double *v = calloc((size_t)reps, sizeof *v);
  if (!v || !setup_open(&s, backend, cfg))
    goto done;
  cgt_tree *t = s.t;
  /* Step 0 warms every node up, step 1 records them, the rest replay. */
  for (int i = 0; i < 4; i++)
    if (!check(one_step(&s), "warm-up step", t) || !check(cgt_sync(t), "cgt_sync", t))
      goto done;
  long steps = runs / (RUNS_PER_STEP + 1);
  if (steps < 1)
    steps = 1;
  cgt_stats before, after;
  cgt_tree_stats(t, &before);
  for (int rep = 0; rep < reps; rep++) {
    double ns = 0;
    for (long i = 0; i < steps; i++) {
      double t0 = bench_now_ns();
      cgt_status st = one_step(&s);
      ns += bench_now_ns() - t0;
      if (!check(st, "timed step", t) || !check(cgt_sync(t), "cgt_sync", t))
        goto done;
    }
    v[rep] = ns / (double)(steps * (RUNS_PER_STEP + 1));
  }
  cgt_tree_stats(t, &after);
  r->replay_ns = bench_median(v, (size_t)reps);
  r->host_allocs_delta = after.host_allocs - before.host_allocs;
  r->timed_runs = after.runs - before.runs;
  r->timed_replays = after.replays - before.replays;

  /* The bare device work: one measured node's graph, and the copy. */
  void *execs[RUNS_PER_STEP + 1];
  size_t depth = tree__path_execs(t, execs, RUNS_PER_STEP + 1);
  if (depth != RUNS_PER_STEP + 1 || !execs[1]) {
    fprintf(stderr, "replay_overhead: the path has %zu nodes, or the measured node is not recorded\n", depth);
    goto done;
  }
  for (int rep = 0; rep < reps; rep++) {
    double ns = 0;
    for (long i = 0; i < steps; i++) {
      double t0 = bench_now_ns();
      cgt_status st = CGT_OK;
      for (int j = 0; j < RUNS_PER_STEP + 1 && st == CGT_OK; j++)
        st = tree__launch_exec(t, execs[1]);
      ns += bench_now_ns() - t0;
      if (!check(st, "tree__launch_exec", t) || !check(cgt_sync(t), "cgt_sync", t))
        goto done;
    }
    v[rep] = ns / (double)(steps * (RUNS_PER_STEP + 1));
  }
  r->bare_launch_ns = bench_median(v, (size_t)reps);
  if (cfg->dynamic) {
    void *stream = cgt_tree_stream(t);
    for (int rep = 0; rep < reps; rep++) {
      double ns = 0;
      for (long i = 0; i < steps; i++) {
        double t0 = bench_now_ns();
        cgt_status st = CGT_OK;
        for (int j = 0; j < RUNS_PER_STEP + 1 && st == CGT_OK; j++) {
          st = s.c.k->copy(stream, s.copy_dst, s.x_buf, VALUE_BYTES);
          if (st == CGT_OK)
            st = tree__launch_exec(t, execs[1]);
        }
        ns += bench_now_ns() - t0;
        if (!check(st, "copy", t) || !check(cgt_sync(t), "cgt_sync", t))
          goto done;
      }
      v[rep] = ns / (double)(steps * (RUNS_PER_STEP + 1));
    }
    r->bare_copy_launch_ns = bench_median(v, (size_t)reps);
  }
  r->overhead_ns = r->replay_ns - (cfg->dynamic ? r->bare_copy_launch_ns : r->bare_launch_ns);
  ok = 1;
done:
  if (v)
    setup_close(&s);
  free(v);
  return ok;
}

static void usage(FILE *f) {
  fprintf(f, "usage: replay_overhead [--backend sim|cuda|all] [--reps N] [--runs N] [--quick] [--json FILE]\n"
             "  --backend  which backends to measure (default: all that are usable here)\n"
             "  --reps     repetitions; the median is reported (default 7)\n"
             "  --runs     replayed runs per repetition (default 200000)\n"
             "  --quick    --reps 3 --runs 20000\n"
             "  --json     also append the JSON lines to FILE\n");
}

int main(int argc, char **argv) {
  const char *which = "all", *json_path = NULL;
  int reps = 7;
  long runs = 200000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc)
      which = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
      runs = atol(argv[++i]);
    else if (!strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else if (!strcmp(argv[i], "--quick"))
      reps = 3, runs = 20000;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (reps < 1 || runs < 1 || (strcmp(which, "all") && strcmp(which, "sim") && strcmp(which, "cuda"))) {
    usage(stderr);
    return 2;
  }
  cgt_backend backends[2];
  int n_backends = 0;
  if (!strcmp(which, "all") || !strcmp(which, "sim"))
    backends[n_backends++] = CGT_BACKEND_SIM;
  if (!strcmp(which, "all") || !strcmp(which, "cuda")) {
    if (kernels_for(CGT_BACKEND_CUDA) && cgt_cuda_available())
      backends[n_backends++] = CGT_BACKEND_CUDA;
    else if (!strcmp(which, "cuda")) {
      fprintf(stderr, "replay_overhead: CUDA is %s\n", kernels_for(CGT_BACKEND_CUDA) ? "not usable here" : "not built");
      return 77;
    } else {
      printf("(CUDA: %s; measuring the simulator only)\n", kernels_for(CGT_BACKEND_CUDA) ? "no usable GPU" : "not built");
    }
  }
  FILE *json = NULL;
  if (json_path && !(json = fopen(json_path, "a"))) {
    perror(json_path);
    return 1;
  }
  char cpu[256], cpu_esc[512];
  bench_cpu_name(cpu, sizeof cpu);
  bench_json_escape(cpu, cpu_esc, sizeof cpu_esc);
  printf("replay_overhead: host ns per replayed cgt_run of a 4-argument segment with one kernel\n");
  printf("CPU: %s; median of %d repetitions of ~%ld runs (%d measured runs + 1 producer run per step)\n\n", cpu, reps,
         runs, RUNS_PER_STEP);
  printf("| backend | arguments | ns per replayed run | bare graph launch ns | bare copy + launch ns | runtime overhead ns | "
         "host allocs while replaying |\n");
  printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  int failed = 0;
  char lines[4][2048];
  int n_lines = 0;
  for (int b = 0; b < n_backends; b++) {
    char dev[256], dev_esc[512];
    bench_device_name(backends[b], dev, sizeof dev);
    bench_json_escape(dev, dev_esc, sizeof dev_esc);
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
      const config *cfg = &configs[c];
      result r;
      memset(&r, 0, sizeof r);
      const char *bname = backends[b] == CGT_BACKEND_SIM ? "sim" : "cuda";
      if (!measure(backends[b], cfg, reps, runs, &r)) {
        printf("| %s | %s | failed | | | | |\n", bname, cfg->what);
        failed = 1;
        continue;
      }
      int replays_only = r.timed_replays == r.timed_runs;
      char copy[32] = "-";
      if (cfg->dynamic)
        snprintf(copy, sizeof copy, "%.1f", r.bare_copy_launch_ns);
      printf("| %s | %s | %.1f | %.1f | %s | %.1f | %" PRIu64 "%s |\n", bname, cfg->what, r.replay_ns, r.bare_launch_ns,
             copy, r.overhead_ns, r.host_allocs_delta, replays_only ? "" : " (not all runs replayed!)");
      if (r.host_allocs_delta != 0 || !replays_only)
        failed = 1;
      snprintf(lines[n_lines++], sizeof lines[0],
               "{\"bench\":\"replay_overhead\",\"backend\":\"%s\",\"device\":\"%s\",\"cpu\":\"%s\",\"config\":\"%s\","
               "\"args\":\"%s\",\"reps\":%d,\"runs_per_rep\":%ld,\"replay_ns\":%.1f,\"bare_launch_ns\":%.1f,"
               "\"bare_copy_launch_ns\":%.1f,\"overhead_ns\":%.1f,\"host_allocs_delta\":%" PRIu64 ",\"timed_runs\":%" PRIu64
               ",\"timed_replays\":%" PRIu64 "}",
               bname, dev_esc, cpu_esc, cfg->name, cfg->what, reps, runs, r.replay_ns, r.bare_launch_ns,
               r.bare_copy_launch_ns, r.overhead_ns, r.host_allocs_delta, r.timed_runs, r.timed_replays);
    }
  }
  printf("\nruntime overhead = ns per replayed run - the bare device work of the same run: the graph launch, preceded by\n"
         "the async copy of the DYNAMIC argument where there is one (the copy a replay must make). Per run includes its\n"
         "share of cgt_step_begin and the value releases. Target on the simulator: < 300 ns.\n\n");
  for (int i = 0; i < n_lines; i++) {
    printf("%s\n", lines[i]);
    if (json)
      fprintf(json, "%s\n", lines[i]);
  }
  if (json)
    fclose(json);
  if (failed)
    fprintf(stderr, "replay_overhead: FAILED (a measurement failed, the tree allocated while replaying, or a timed "
                    "run did not replay)\n");
  return failed ? 1 : 0;
}
