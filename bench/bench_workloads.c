/* bench_workloads.c — the shared workloads (tools/common/workloads.h) in
 * every way cgtree can run them, side by side, on one backend.
 *
 * Modes, for each case (chain S x L, branchy):
 *
 *   eager      CGT_MODE_EAGER: every segment launched kernel by kernel.
 *   separate   CGT_MODE_SEPARATE: one graph per node, each with its own pool.
 *   tree       CGT_MODE_TREE: the product.
 *   bare       the graphs the tree recorded, launched in the same order with
 *              plain graph launches (tree__launch_exec) and no runtime at all:
 *              the floor for those graphs. It does what the program itself
 *              would have to do: one async copy of the step input into the
 *              first segment's placeholder (which the tree frees after
 *              capture, so later segments reuse its memory and skipping the
 *              copy would feed garbage), and for branchy the host sync,
 *              read-back of the branch sum and choice of the branch's graphs.
 *   one_graph  chain only: the same S*L layers as one segment (the fused
 *              workload) recorded by a tree, i.e. a single graph replayed.
 *   tree_defer the tree with defer_launch = 1: replays are held back and a
 *              span of the path that recurs is launched as one fused graph
 *              (chain: all S segments; branchy: segments 2|3 and 4, since
 *              the host reads segment 1's sum back). Its host time per step
 *              includes the flush (cgt_flush at the end of the step), which
 *              is where the launch happens; and on fresh trees the flush
 *              that first fuses a span (instantiation + upload + launch) is
 *              timed against the flushes after it.
 *
 * Correctness comes first: every mode's output, on both step parities, is
 * compared with the eager run's before timing and again after it (bit for
 * bit; one_graph may differ within a tolerance if cuBLAS picked another
 * algorithm for the fused shape, and says so). A case with a mismatch
 * reports no times, and the program exits 1.
 *
 * Timing: a tree warms up (8 steps: warmup, recording, then at least 4
 * replays), then `reps` repetitions of `steps` steps are timed with the host
 * clock, the stream drained before and after each repetition (cgt_sync); the
 * median is reported in microseconds per step. Runtime overhead per segment
 * is (tree - bare) / segments per step.
 *
 * Recording latency: on fresh trees, a hook around every cgt_run of one step
 * (cgt_sync before and after, so the figure includes the first launch and
 * its GPU time) times the runs that record. Chain: the step that records all
 * S segments (median over segments). Branchy: step 3, where the second branch
 * is first recorded after a checkpoint restore (segment 3). The same hook
 * on a replaying step gives the synced replay time of the same run, and on
 * CUDA a bare capture of the same segment's kernels (stream capture,
 * instantiate, upload, launch, sync; bench_cuda.c) is the floor.
 *
 * Output: a markdown table on stdout, one JSON line per case to --json.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernels.h"
#include "tree_internal.h"
#include "workloads.h"

enum { M_EAGER, M_SEPARATE, M_TREE, M_BARE, M_ONE_GRAPH, M_DEFER, N_MODES };
static const char *const mode_names[N_MODES] = {"eager", "separate", "tree", "bare", "one_graph", "tree_defer"};

typedef struct options {
  cgt_backend backend;
  int quick;
  int reps, steps, warm, record_reps;
  int batch, hidden;
  uint64_t seed;
  const char *json;
  const char *cases;
} options;

typedef struct mode_result {
  int ran, ok;
  double us, us_min, us_max;
  double host_us; /* median host time of one step's calls, the stream idle at its start */
  size_t pool_peak, side_peak;
  uint64_t host_allocs;  /* during the timed repetitions */
  double input_copies;   /* per step, timed repetitions */
  uint64_t replays, eager_runs; /* during the timed repetitions */
  uint64_t fused_launches;       /* during the timed repetitions */
  char check[128];
} mode_result;

typedef struct case_result {
  wl_params p;
  char name[64];
  int segments_per_step;
  double kernels; /* per step (branchy: the mean of its two paths) */
  mode_result m[N_MODES];
  int ok;
  /* recording */
  int have_record, have_raw;
  double record_us, record_replay_us; /* chain: per segment; branchy: the new branch's segment 3 */
  double record_tail_us;              /* branchy: segment 4 recorded right after, no restore */
  uint64_t record_restores;           /* branchy: restores inside the timed recording run (per run) */
  int second_branch;                  /* branchy: the segment (2 or 3) recorded in step 3 */
  double raw_capture_us, raw_instantiate_us, raw_total_us;
  /* deferred launch: the flush that builds a span's fused executable, and
   * the flushes after it (host time of cgt_flush, median) */
  int have_fuse;
  double first_fused_us, fused_flush_us;
  double fused_launches_per_step; /* timed repetitions */
  /* host time per step, one-graph and tree_defer steps alternating (see
   * measure_paired_host); medians */
  int have_paired;
  double paired_one_host_us, paired_defer_host_us;
} case_result;

static int fail_msg(const char *what, cgt_status st, cgt_tree *t) {
  fprintf(stderr, "bench_workloads: %s: %s (%s)%s%s\n", what, cgt_status_name(st), wl_last_error(), t ? " tree: " : "",
          t ? cgt_tree_last_error(t) : "");
  return 0;
}

/* ------------------------------------------------------------ comparing */

/* Folds one comparison into m->check; keeps the worst verdict. */
static void compare(mode_result *m, const float *ref, const float *got, size_t n, int allow_tol) {
  if (!memcmp(ref, got, n * sizeof *ref)) {
    if (!m->check[0])
      snprintf(m->check, sizeof m->check, "bit-equal");
    return;
  }
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)ref[i] - (double)got[i];
    d = d < 0 ? -d : d;
    if (d != d)
      d = 1e300;
    double r = ref[i] < 0 ? -(double)ref[i] : (double)ref[i];
    if (d > max_abs)
      max_abs = d;
    if (r > max_ref)
      max_ref = r;
  }
  double tol = 1e-4 * (max_ref > 1.0 ? max_ref : 1.0);
  if (allow_tol && max_abs <= tol) {
    if (strncmp(m->check, "MISMATCH", 8))
      snprintf(m->check, sizeof m->check, "within tolerance (max abs diff %.2e, max |ref| %.2e)", max_abs, max_ref);
    return;
  }
  snprintf(m->check, sizeof m->check, "MISMATCH (max abs diff %.3e, max |ref| %.3e)", max_abs, max_ref);
  m->ok = 0;
}

/* --------------------------------------------------------------- timing */

static int step_sync(workload *w, int step) {
  cgt_status st = wl_step(w, step);
  if (st == CGT_OK)
    st = cgt_sync(wl_tree(w));
  return st == CGT_OK ? 1 : fail_msg("step", st, wl_tree(w));
}

/* Runs steps of both parities and compares (or, with ref_fill, records) the
 * outputs. */
static int check_outputs(workload *w, int *step, float *ref[2], int ref_fill, mode_result *m, int allow_tol,
                         float *scratch) {
  size_t n = wl_output_floats(w);
  for (int i = 0; i < 2; i++) {
    int s = (*step)++;
    if (!step_sync(w, s))
      return 0;
    float *dst = ref_fill ? ref[s & 1] : scratch;
    cgt_status st = wl_output(w, dst, n);
    if (st != CGT_OK)
      return fail_msg("wl_output", st, wl_tree(w));
    if (!ref_fill)
      compare(m, ref[s & 1], dst, n, allow_tol);
  }
  return 1;
}

/* One step; with flush, its held-back replays are launched before it ends
 * (tree_defer), so that host time includes them. */
static cgt_status timed_step(workload *w, int step, int flush) {
  cgt_status st = wl_step(w, step);
  if (st == CGT_OK && flush)
    st = cgt_flush(wl_tree(w));
  return st;
}

static int time_steps(workload *w, int *step, const options *o, mode_result *m, int flush) {
  cgt_tree *t = wl_tree(w);
  double *v = calloc((size_t)o->reps, sizeof *v);
  if (!v)
    return 0;
  cgt_stats s0, s1;
  cgt_tree_stats(t, &s0);
  for (int r = 0; r < o->reps; r++) {
    cgt_status st = cgt_sync(t);
    double t0 = bench_now_ns();
    for (int i = 0; i < o->steps && st == CGT_OK; i++)
      st = wl_step(w, (*step)++);
    if (st == CGT_OK)
      st = cgt_sync(t);
    v[r] = (bench_now_ns() - t0) / 1e3 / o->steps;
    if (st != CGT_OK) {
      free(v);
      return fail_msg("timed step", st, t);
    }
  }
  cgt_tree_stats(t, &s1);
  /* Host cost alone: the stream drained before each step, the step's calls
   * timed, the wait after them not. */
  double *h = calloc((size_t)o->steps, sizeof *h);
  if (!h) {
    free(v);
    return 0;
  }
  for (int i = 0; i < o->steps; i++) {
    cgt_status st = cgt_sync(t);
    double t0 = bench_now_ns();
    if (st == CGT_OK)
      st = timed_step(w, (*step)++, flush);
    h[i] = (bench_now_ns() - t0) / 1e3;
    if (st == CGT_OK)
      st = cgt_sync(t);
    if (st != CGT_OK) {
      free(v), free(h);
      return fail_msg("host-timed step", st, t);
    }
  }
  m->host_us = bench_median(h, (size_t)o->steps);
  free(h);
  m->host_allocs = s1.host_allocs - s0.host_allocs;
  m->input_copies = (double)(s1.input_copies - s0.input_copies) / ((double)o->reps * o->steps);
  m->replays = s1.replays - s0.replays;
  m->fused_launches = s1.fused_launches - s0.fused_launches;
  m->eager_runs = s1.eager_runs - s0.eager_runs;
  m->us = bench_median(v, (size_t)o->reps);
  m->us_min = v[0];
  m->us_max = v[o->reps - 1];
  free(v);
  return 1;
}

/* ----------------------------------------------------------------- bare */

/* The tree's graphs with no runtime: what a program would do if it kept the
 * executable graphs itself. Per step it launches the first graph and, for
 * branchy, waits for it, reads the branch sum back and picks the graph list
 * of that branch, then launches the rest. The first graph copies the step
 * input into its placeholder itself (an in-graph copy node); bare leaves that
 * node reading the address the tree last pointed it at, so it does not pay
 * for repointing it when the input moves: the tree does, and (tree - bare)
 * counts that as runtime cost. */
typedef struct bare_paths {
  void **execs[2]; /* chain: [0]; branchy: by branch, [0] for 2, [1] for 3 */
  size_t depth;
  void *placeholder;
  size_t input_bytes;
  const void *sum_dev;
  int branchy;
} bare_paths;

static cgt_status bare_step(cgt_tree *t, const kernels *k, const bare_paths *b, const void *input) {
  void *stream = cgt_tree_stream(t);
  (void)input;
  cgt_status st = tree__launch_exec(t, b->execs[0][0]);
  void **e = b->execs[0];
  if (st == CGT_OK && b->branchy) {
    /* The program's host-side if: wait for segment 1 and read its sum. */
    float sum = 0;
    st = k->copy(stream, &sum, b->sum_dev, sizeof sum); /* as cgt_value_copy_out does */
    if (st == CGT_OK)
      st = cgt_sync(t);
    e = b->execs[sum > 0.0f ? 0 : 1];
  }
  for (size_t i = 1; i < b->depth && st == CGT_OK; i++)
    st = tree__launch_exec(t, e[i]);
  return st;
}

/* After the tree mode's run of w: takes the graph list of each path (one
 * step of each parity), times them bare, and checks the output. */
static int run_bare(workload *w, int *step, const options *o, float *ref[2], mode_result *m, float *scratch) {
  cgt_tree *t = wl_tree(w);
  const kernels *k = wl_kernels(w);
  size_t cap = (size_t)wl_segments_per_step(w);
  bare_paths b;
  memset(&b, 0, sizeof b);
  b.branchy = wl_get_params(w)->kind == WL_BRANCHY;
  b.depth = cap;
  b.input_bytes = wl_output_floats(w) * sizeof(float);
  int ok = 0;
  double *v = calloc((size_t)o->reps, sizeof *v);
  b.execs[0] = calloc(cap, sizeof(void *));
  b.execs[1] = calloc(cap, sizeof(void *));
  if (!v || !b.execs[0] || !b.execs[1])
    goto done;
  for (int i = 0; i < 2; i++) {
    int s = (*step)++;
    if (!step_sync(w, s))
      goto done;
    int which = b.branchy && wl_branch_taken(w) == 3;
    size_t d = tree__path_execs(t, b.execs[which], cap);
    for (size_t j = 0; j < d && j < cap; j++)
      if (!b.execs[which][j])
        d = 0;
    if (d != cap) {
      fprintf(stderr, "bench_workloads: bare: the path of step %d is not fully recorded (%zu of %zu)\n", s, d, cap);
      goto done;
    }
  }
  if (!b.branchy)
    memcpy(b.execs[1], b.execs[0], cap * sizeof(void *));
  if (b.branchy && (!b.execs[0][0] || !b.execs[1][0] || b.execs[0][0] != b.execs[1][0])) {
    fprintf(stderr, "bench_workloads: bare: the steps did not take both branches from one recorded root\n");
    goto done;
  }
  b.placeholder = (void *)(uintptr_t)wl_segment_input_seen(w, 0);
  b.sum_dev = wl_branch_sum_device(w);
  if (!b.placeholder || b.placeholder == wl_input(w, 0) || b.placeholder == wl_input(w, 1)) {
    fprintf(stderr, "bench_workloads: bare: segment 1 did not read its input from a placeholder\n");
    goto done;
  }
  int last = (*step - 1) & 1; /* the parity of the tree's last step: its output value is still live */
  int iters = o->steps + (o->steps & 1); /* even, so the bare steps end on `last` */
  for (int r = 0; r < o->reps; r++) {
    cgt_status st = cgt_sync(t);
    double t0 = bench_now_ns();
    for (int i = 0; i < iters && st == CGT_OK; i++)
      st = bare_step(t, k, &b, wl_input(w, last + 1 + i));
    if (st == CGT_OK)
      st = cgt_sync(t);
    v[r] = (bench_now_ns() - t0) / 1e3 / iters;
    if (st != CGT_OK) {
      fail_msg("bare step", st, t);
      goto done;
    }
  }
  m->us = bench_median(v, (size_t)o->reps);
  m->us_min = v[0];
  m->us_max = v[o->reps - 1];
  free(v);
  v = calloc((size_t)iters, sizeof *v);
  if (!v)
    goto done;
  for (int i = 0; i < iters; i++) {
    cgt_status st = cgt_sync(t);
    double t0 = bench_now_ns();
    if (st == CGT_OK)
      st = bare_step(t, k, &b, wl_input(w, last + 1 + i));
    v[i] = (bench_now_ns() - t0) / 1e3;
    if (st == CGT_OK)
      st = cgt_sync(t);
    if (st != CGT_OK) {
      fail_msg("host-timed bare step", st, t);
      goto done;
    }
  }
  m->host_us = bench_median(v, (size_t)iters);
  /* The last bare step ran the graphs of the tree's last path, on the input
   * the tree last gave them, whose output is the live value wl_output reads. */
  cgt_status st = wl_output(w, scratch, wl_output_floats(w));
  if (st != CGT_OK) {
    fail_msg("wl_output after bare", st, t);
    goto done;
  }
  compare(m, ref[last], scratch, wl_output_floats(w), 0);
  ok = 1;
done:
  free(v);
  free(b.execs[0]);
  free(b.execs[1]);
  return ok;
}

/* ------------------------------------------------------------ one mode */

static int open_tree(const options *o, cgt_mode mode, int defer, const wl_params *p, cgt_tree **t, workload **w) {
  cgt_options co;
  cgt_options_init(&co);
  co.backend = o->backend;
  co.mode = mode;
  co.defer_launch = (uint32_t)defer;
  *t = NULL;
  *w = NULL;
  cgt_status st = cgt_tree_create(&co, t);
  if (st != CGT_OK)
    return fail_msg("cgt_tree_create", st, NULL);
  if (cgt_tree_mode(*t) != mode) {
    fprintf(stderr, "bench_workloads: CGT_MODE in the environment overrides the mode; unset it\n");
    cgt_tree_destroy(*t);
    *t = NULL;
    return 0;
  }
  st = wl_create(*t, p, o->seed, w);
  if (st != CGT_OK) {
    fail_msg("wl_create", st, *t);
    cgt_tree_destroy(*t);
    *t = NULL;
    return 0;
  }
  return 1;
}

static void close_tree(cgt_tree *t, workload *w) {
  wl_destroy(w);
  cgt_tree_destroy(t);
}

static int run_mode(const options *o, case_result *c, int mi, float *ref[2], float *scratch) {
  mode_result *m = &c->m[mi];
  mode_result *bare = &c->m[M_BARE];
  m->ok = 1;
  cgt_mode mode = mi == M_EAGER ? CGT_MODE_EAGER : mi == M_SEPARATE ? CGT_MODE_SEPARATE : CGT_MODE_TREE;
  wl_params p = c->p;
  p.fused = mi == M_ONE_GRAPH;
  cgt_tree *t;
  workload *w;
  if (!open_tree(o, mode, mi == M_DEFER, &p, &t, &w))
    return 0;
  int ok = 0, step = 0;
  int allow_tol = mi == M_ONE_GRAPH;
  for (int i = 0; i < o->warm; i++)
    if (!step_sync(w, step++))
      goto done;
  if (mi == M_EAGER && !check_outputs(w, &step, ref, 1, m, 0, scratch))
    goto done;
  if (!check_outputs(w, &step, ref, 0, m, allow_tol, scratch) || !time_steps(w, &step, o, m, mi == M_DEFER) ||
      !check_outputs(w, &step, ref, 0, m, allow_tol, scratch))
    goto done;
  if (mi == M_EAGER && m->ok)
    snprintf(m->check, sizeof m->check, "reference (repeats bit for bit)");
  cgt_stats s;
  cgt_tree_stats(t, &s);
  m->pool_peak = s.pool_peak_bytes;
  m->side_peak = s.side_pool_peak_bytes;
  m->ran = 1;
  if (mi == M_TREE) {
    bare->ok = 1;
    if (!run_bare(w, &step, o, ref, bare, scratch))
      goto done;
    bare->pool_peak = m->pool_peak;
    bare->side_peak = m->side_peak;
    bare->ran = 1;
  }
  ok = 1;
done:
  close_tree(t, w);
  return ok;
}

/* ----------------------------------------------------------- recording */

typedef struct run_timer {
  cgt_tree *t;
  int n;
  double t0;
  cgt_stats s0;
  double *us;
  uint64_t *recordings, *restores, *replays;
} run_timer;

static void time_run(void *user, int run_index, int segment_index, int after) {
  (void)segment_index;
  run_timer *h = user;
  if (run_index < 0 || run_index >= h->n)
    return;
  (void)cgt_sync(h->t);
  if (!after) {
    cgt_tree_stats(h->t, &h->s0);
    h->t0 = bench_now_ns();
    return;
  }
  h->us[run_index] = (bench_now_ns() - h->t0) / 1e3;
  cgt_stats s1;
  cgt_tree_stats(h->t, &s1);
  h->recordings[run_index] = s1.recordings - h->s0.recordings;
  h->restores[run_index] = s1.checkpoint_restores - h->s0.checkpoint_restores;
  h->replays[run_index] = s1.replays - h->s0.replays;
}

/* One hooked step; 0 if it failed. */
static int hooked_step(workload *w, run_timer *h, int step) {
  wl_set_run_hook(w, time_run, h);
  int ok = step_sync(w, step);
  wl_set_run_hook(w, NULL, NULL);
  return ok;
}

static int measure_record(const options *o, case_result *c) {
  int n = c->p.kind == WL_CHAIN ? c->p.segments : 3;
  int reps = o->record_reps;
  run_timer h;
  memset(&h, 0, sizeof h);
  h.n = n;
  h.us = calloc((size_t)n, sizeof *h.us);
  h.recordings = calloc((size_t)n, sizeof *h.recordings);
  h.restores = calloc((size_t)n, sizeof *h.restores);
  h.replays = calloc((size_t)n, sizeof *h.replays);
  double *rec = calloc((size_t)reps * (size_t)n, sizeof *rec), *rep = calloc((size_t)reps * (size_t)n, sizeof *rep);
  double *tail = calloc((size_t)reps, sizeof *tail);
  int ok = 0, n_rec = 0, n_rep = 0;
  uint64_t restores = 0;
  cgt_tree *t = NULL;
  workload *w = NULL;
  if (!h.us || !h.recordings || !h.restores || !h.replays || !rec || !rep || !tail)
    goto done;
  for (int r = 0; r < reps; r++) {
    if (!open_tree(o, CGT_MODE_TREE, 0, &c->p, &t, &w))
      goto done;
    h.t = t;
    if (c->p.kind == WL_CHAIN) {
      /* Step 0 warms up; step 1 records every segment, one after another. */
      if (!step_sync(w, 0) || !hooked_step(w, &h, 1))
        goto done;
      for (int i = 0; i < n; i++)
        if (h.recordings[i] == 1)
          rec[n_rec++] = h.us[i];
      for (int s = 2; s < 4; s++)
        if (!step_sync(w, s))
          goto done;
      if (!hooked_step(w, &h, 4))
        goto done;
      for (int i = 0; i < n; i++)
        if (h.replays[i] == 1)
          rep[n_rep++] = h.us[i];
    } else {
      /* Steps 0-2 warm up both branches and record the path of even
       * steps; step 3 records the other branch (its middle segment, then
       * segment 4 under it), restoring segment 1's checkpoint first. */
      int first_branch = 0;
      for (int s = 0; s < 3; s++) {
        if (!step_sync(w, s))
          goto done;
        first_branch = wl_branch_taken(w);
      }
      if (!hooked_step(w, &h, 3))
        goto done;
      if (wl_branch_taken(w) == first_branch || h.recordings[1] != 1 || h.recordings[2] != 1) {
        fprintf(stderr,
                "bench_workloads: step 3 did not record the second branch (branches %d then %d, recordings %" PRIu64
                ", %" PRIu64 ")\n",
                first_branch, wl_branch_taken(w), h.recordings[1], h.recordings[2]);
        goto done;
      }
      c->second_branch = wl_branch_taken(w);
      rec[n_rec++] = h.us[1];
      tail[r] = h.us[2];
      restores += h.restores[1];
      if (!step_sync(w, 4) || !hooked_step(w, &h, 5))
        goto done;
      if (h.replays[1] == 1)
        rep[n_rep++] = h.us[1];
    }
    if (r == reps - 1) {
      int seg = c->p.kind == WL_CHAIN ? 0 : c->second_branch - 1;
      int got = bench_raw_record(w, seg, o->record_reps < 3 ? 3 : o->record_reps, &c->raw_capture_us,
                                 &c->raw_instantiate_us, &c->raw_total_us);
      if (got < 0)
        goto done;
      c->have_raw = got == 1;
    }
    close_tree(t, w);
    t = NULL;
    w = NULL;
  }
  c->record_us = bench_median(rec, (size_t)n_rec);
  c->record_replay_us = bench_median(rep, (size_t)n_rep);
  c->record_tail_us = c->p.kind == WL_BRANCHY ? bench_median(tail, (size_t)reps) : 0;
  c->record_restores = n_rec ? (restores + (uint64_t)n_rec / 2) / (uint64_t)n_rec : 0;
  c->have_record = n_rec > 0;
  ok = 1;
done:
  if (t)
    close_tree(t, w);
  free(h.us), free(h.recordings), free(h.restores), free(h.replays);
  free(rec), free(rep), free(tail);
  return ok;
}

/* --------------------------------------------------------- fusion cost */

/* On fresh tree_defer trees: each step's runs, then a timed cgt_flush. The
 * first flush that makes a fused launch builds the span's executable
 * (instantiation and upload included); the fused flushes after it only
 * repoint the step input's copy and launch. Host time, medians. */
static int measure_first_fused(const options *o, case_result *c) {
  int reps = o->record_reps < 1 ? 1 : o->record_reps, later_n = 10, n_first = 0, n_later = 0;
  double *first = calloc((size_t)reps, sizeof *first), *later = calloc((size_t)reps * later_n, sizeof *later);
  int ok = 0;
  if (!first || !later)
    goto done;
  for (int r = 0; r < reps; r++) {
    cgt_tree *t;
    workload *w;
    if (!open_tree(o, CGT_MODE_TREE, 1, &c->p, &t, &w))
      goto done;
    int seen_first = 0, taken = 0;
    for (int step = 0; step < 40 && taken < later_n; step++) {
      cgt_stats s0, s1;
      cgt_status st = cgt_sync(t);
      if (st == CGT_OK)
        st = wl_step(w, step);
      cgt_tree_stats(t, &s0);
      double t0 = bench_now_ns();
      if (st == CGT_OK)
        st = cgt_flush(t);
      double us = (bench_now_ns() - t0) / 1e3;
      if (st == CGT_OK)
        st = cgt_sync(t);
      if (st != CGT_OK) {
        fail_msg("fused step", st, t);
        close_tree(t, w);
        goto done;
      }
      cgt_tree_stats(t, &s1);
      if (s1.fused_launches == s0.fused_launches)
        continue;
      if (!seen_first) {
        first[n_first++] = us;
        seen_first = 1;
      } else {
        later[n_later++] = us;
        taken++;
      }
    }
    close_tree(t, w);
  }
  c->have_fuse = n_first > 0 && n_later > 0;
  if (c->have_fuse) {
    c->first_fused_us = bench_median(first, (size_t)n_first);
    c->fused_flush_us = bench_median(later, (size_t)n_later);
  }
  ok = 1;
done:
  free(first);
  free(later);
  return ok;
}

/* Host time of one-graph and tree_defer steps taken alternately, on one
 * tree of each, medians. The host columns of the mode table time each mode
 * in its own stretch of the run, and on a shared machine the CPU's clock and
 * its other tenants drift between stretches by more than the difference
 * measured here (three runs of one machine gave 0.026 to 1.8 µs per segment
 * for it). Alternating step by step puts both under the same conditions, so
 * their difference per segment is the deferred tree's own host cost over
 * one graph launch (issue 13's host target). Chains only (branchy has no
 * one-graph form). */
static int measure_paired_host(const options *o, case_result *c) {
  wl_params one = c->p, fused = c->p;
  one.fused = 1;
  cgt_tree *ta = NULL, *tb = NULL;
  workload *wa = NULL, *wb = NULL;
  int n = o->steps * o->reps, ok = 0, sa = 0, sb = 0;
  double *ha = calloc((size_t)n, sizeof *ha), *hb = calloc((size_t)n, sizeof *hb);
  if (!ha || !hb || !open_tree(o, CGT_MODE_TREE, 0, &one, &ta, &wa) || !open_tree(o, CGT_MODE_TREE, 1, &fused, &tb, &wb))
    goto done;
  for (int i = 0; i < o->warm + 8; i++) /* recordings, then the span's first flushes */
    if (!step_sync(wa, sa++) || timed_step(wb, sb++, 1) != CGT_OK || cgt_sync(tb) != CGT_OK)
      goto done;
  for (int i = 0; i < n; i++) {
    cgt_status st = cgt_sync(ta);
    double t0 = bench_now_ns();
    if (st == CGT_OK)
      st = timed_step(wa, sa++, 0);
    ha[i] = (bench_now_ns() - t0) / 1e3;
    if (st == CGT_OK)
      st = cgt_sync(ta);
    if (st == CGT_OK)
      st = cgt_sync(tb);
    t0 = bench_now_ns();
    if (st == CGT_OK)
      st = timed_step(wb, sb++, 1);
    hb[i] = (bench_now_ns() - t0) / 1e3;
    if (st == CGT_OK)
      st = cgt_sync(tb);
    if (st != CGT_OK) {
      fail_msg("paired host step", st, NULL);
      goto done;
    }
  }
  c->paired_one_host_us = bench_median(ha, (size_t)n);
  c->paired_defer_host_us = bench_median(hb, (size_t)n);
  c->have_paired = 1;
  ok = 1;
done:
  if (tb)
    close_tree(tb, wb);
  if (ta)
    close_tree(ta, wa);
  free(ha), free(hb);
  return ok;
}

/* ---------------------------------------------------------------- cases */

static int run_case(const options *o, case_result *c) {
  size_t n = (size_t)c->p.batch * (size_t)c->p.hidden;
  float *ref[2] = {calloc(n, sizeof(float)), calloc(n, sizeof(float))};
  float *scratch = calloc(n, sizeof(float));
  int ok = ref[0] && ref[1] && scratch;
  c->ok = 1;
  for (int mi = 0; mi < N_MODES && ok; mi++) {
    if (mi == M_BARE)
      continue; /* runs inside the tree mode */
    if (mi == M_ONE_GRAPH && c->p.kind != WL_CHAIN)
      continue;
    fprintf(stderr, "  %s: %s ...\n", c->name, mode_names[mi]);
    ok = run_mode(o, c, mi, ref, scratch);
  }
  for (int mi = 0; mi < N_MODES; mi++)
    if (c->m[mi].ran && !c->m[mi].ok)
      c->ok = 0;
  if (ok && c->ok && o->record_reps > 0) {
    fprintf(stderr, "  %s: recording latency ...\n", c->name);
    ok = measure_record(o, c);
  }
  if (ok && c->ok) {
    fprintf(stderr, "  %s: first fused launch ...\n", c->name);
    ok = measure_first_fused(o, c);
  }
  if (ok && c->ok && c->m[M_DEFER].ran && c->m[M_ONE_GRAPH].ran) {
    fprintf(stderr, "  %s: host time, one-graph and tree_defer alternating ...\n", c->name);
    ok = measure_paired_host(o, c);
  }
  if (c->m[M_DEFER].ran)
    c->fused_launches_per_step = (double)c->m[M_DEFER].fused_launches / ((double)o->reps * o->steps);
  free(ref[0]), free(ref[1]), free(scratch);
  if (!ok)
    c->ok = 0;
  return ok;
}

/* "1x1,4x4,branchy,branchy:4" */
static int parse_cases(const options *o, case_result **out, int *count) {
  char *list = strdup(o->cases), *save = NULL;
  int cap = 16, n = 0;
  case_result *cs = calloc((size_t)cap, sizeof *cs);
  if (!list || !cs)
    return 0;
  for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == cap) {
      case_result *g = realloc(cs, (size_t)cap * 2 * sizeof *cs);
      if (!g)
        return 0;
      memset(g + cap, 0, (size_t)cap * sizeof *g);
      cs = g;
      cap *= 2;
    }
    case_result *c = &cs[n];
    int s = 0, l = 0;
    if (!strncmp(tok, "branchy", 7)) {
      wl_params_default(&c->p, WL_BRANCHY);
      if (tok[7] == ':' && sscanf(tok + 8, "%d", &l) == 1)
        c->p.layers = l;
      else if (tok[7]) {
        fprintf(stderr, "bench_workloads: bad case '%s'\n", tok);
        return 0;
      }
    } else if (sscanf(!strncmp(tok, "chain:", 6) ? tok + 6 : tok, "%dx%d", &s, &l) == 2 && s > 0 && l > 0) {
      wl_params_default(&c->p, WL_CHAIN);
      c->p.segments = s;
      c->p.layers = l;
    } else {
      fprintf(stderr, "bench_workloads: bad case '%s' (want SxL, branchy or branchy:L)\n", tok);
      return 0;
    }
    c->p.batch = o->batch;
    c->p.hidden = o->hidden;
    wl_describe(&c->p, c->name, sizeof c->name);
    int L = c->p.layers;
    c->segments_per_step = c->p.kind == WL_CHAIN ? c->p.segments : 3;
    c->kernels = c->p.kind == WL_CHAIN ? 2.0 * c->p.segments * L : (6.0 * L + 2 + 6.0 * L + 3) / 2;
    n++;
  }
  free(list);
  *out = cs;
  *count = n;
  return n > 0;
}

/* --------------------------------------------------------------- output */

static void fmt_us(char *buf, size_t n, const mode_result *m) {
  if (m->ran)
    snprintf(buf, n, m->us < 10 ? "%.2f" : "%.1f", m->us);
  else
    snprintf(buf, n, "-");
}

static void fmt_mib(char *buf, size_t n, const mode_result *m) {
  if (m->ran)
    snprintf(buf, n, "%.2f", (double)(m->pool_peak + m->side_peak) / (1 << 20));
  else
    snprintf(buf, n, "-");
}

static void json_case(FILE *f, const options *o, const case_result *c, const char *dev) {
  const mode_result *m = c->m;
  fprintf(f, "{\"bench\":\"workloads\",\"backend\":\"%s\",\"device\":\"%s\",\"case\":\"%s\",\"name\":\"%s\"",
          o->backend == CGT_BACKEND_CUDA ? "cuda" : "sim", dev, c->p.kind == WL_CHAIN ? "chain" : "branchy", c->name);
  fprintf(f, ",\"S\":%d,\"L\":%d,\"B\":%d,\"H\":%d,\"segments_per_step\":%d,\"kernels_per_step\":%.1f",
          c->p.kind == WL_CHAIN ? c->p.segments : 3, c->p.layers, c->p.batch, c->p.hidden, c->segments_per_step,
          c->kernels);
  fprintf(f, ",\"reps\":%d,\"steps_per_rep\":%d,\"ok\":%s", o->reps, o->steps, c->ok ? "true" : "false");
  for (int i = 0; i < N_MODES; i++) {
    char esc[256];
    if (!m[i].ran) {
      fprintf(f, ",\"%s_us\":null", mode_names[i]);
      continue;
    }
    if (c->ok)
      fprintf(f, ",\"%s_us\":%.3f,\"%s_us_min\":%.3f,\"%s_us_max\":%.3f,\"%s_host_us\":%.3f", mode_names[i], m[i].us,
              mode_names[i], m[i].us_min, mode_names[i], m[i].us_max, mode_names[i], m[i].host_us);
    else
      fprintf(f, ",\"%s_us\":null", mode_names[i]);
    fprintf(f, ",\"%s_check\":\"%s\"", mode_names[i], bench_json_escape(m[i].check, esc, sizeof esc));
    if (i != M_BARE)
      fprintf(f,
              ",\"%s_pool_peak_bytes\":%zu,\"%s_side_pool_peak_bytes\":%zu,\"%s_host_allocs_timed\":%" PRIu64
              ",\"%s_input_copies_per_step\":%.2f,\"%s_eager_runs_timed\":%" PRIu64,
              mode_names[i], m[i].pool_peak, mode_names[i], m[i].side_peak, mode_names[i], m[i].host_allocs,
              mode_names[i], m[i].input_copies, mode_names[i], m[i].eager_runs);
  }
  if (c->ok && m[M_TREE].ran && m[M_BARE].ran)
    fprintf(f, ",\"overhead_per_segment_us\":%.3f,\"host_overhead_per_segment_us\":%.3f",
            (m[M_TREE].us - m[M_BARE].us) / c->segments_per_step,
            (m[M_TREE].host_us - m[M_BARE].host_us) / c->segments_per_step);
  if (c->ok && m[M_TREE].ran && m[M_ONE_GRAPH].ran)
    fprintf(f, ",\"tree_minus_one_graph_per_segment_us\":%.3f,\"tree_over_one_graph\":%.3f",
            (m[M_TREE].us - m[M_ONE_GRAPH].us) / c->segments_per_step, m[M_TREE].us / m[M_ONE_GRAPH].us);
  if (c->ok && m[M_TREE].ran && m[M_EAGER].ran)
    fprintf(f, ",\"tree_over_eager\":%.3f", m[M_TREE].us / m[M_EAGER].us);
  if (c->ok && m[M_DEFER].ran && m[M_ONE_GRAPH].ran)
    fprintf(f, ",\"tree_defer_over_one_graph\":%.3f,\"tree_defer_host_minus_one_graph_per_segment_us\":%.3f",
            m[M_DEFER].us / m[M_ONE_GRAPH].us, (m[M_DEFER].host_us - m[M_ONE_GRAPH].host_us) / c->segments_per_step);
  if (c->ok && m[M_DEFER].ran && m[M_BARE].ran)
    fprintf(f, ",\"tree_defer_over_bare\":%.3f", m[M_DEFER].us / m[M_BARE].us);
  if (c->ok && m[M_DEFER].ran)
    fprintf(f, ",\"tree_defer_fused_launches_per_step\":%.3f", c->fused_launches_per_step);
  if (c->have_fuse)
    fprintf(f, ",\"first_fused_flush_us\":%.1f,\"fused_flush_us\":%.2f", c->first_fused_us, c->fused_flush_us);
  if (c->have_paired)
    fprintf(f,
            ",\"paired_host_one_graph_us\":%.2f,\"paired_host_tree_defer_us\":%.2f,"
            "\"paired_host_defer_minus_one_graph_per_segment_us\":%.3f",
            c->paired_one_host_us, c->paired_defer_host_us,
            (c->paired_defer_host_us - c->paired_one_host_us) / c->segments_per_step);
  fprintf(f, ",\"bare_does_input_copy\":false");
  if (c->have_record) {
    fprintf(f, ",\"record_us\":%.1f,\"record_replay_synced_us\":%.1f,\"record_what\":\"%s\"", c->record_us,
            c->record_replay_us,
            c->p.kind == WL_CHAIN ? "median per segment of the recording step (sync before and after each run)"
                                  : "middle segment of the second branch, recorded after a checkpoint restore");
    if (c->p.kind == WL_BRANCHY)
      fprintf(f, ",\"record_segment\":%d,\"record_tail_us\":%.1f,\"record_restores\":%" PRIu64, c->second_branch,
              c->record_tail_us, c->record_restores);
  }
  if (c->have_raw)
    fprintf(f, ",\"raw_capture_us\":%.1f,\"raw_instantiate_us\":%.1f,\"raw_record_us\":%.1f", c->raw_capture_us,
            c->raw_instantiate_us, c->raw_total_us);
  else
    fprintf(f, ",\"raw_record_us\":null");
  fprintf(f, "}\n");
}

static void print_tables(const options *o, case_result *cs, int n, const char *dev) {
  printf("\n## bench_workloads: %s, %s\n\n", o->backend == CGT_BACKEND_CUDA ? "cuda" : "sim", dev);
  printf("µs per step, median of %d repetitions of %d steps (after %d warm-up steps); B=%d H=%d fp32.\n\n", o->reps,
         o->steps, o->warm, o->batch, o->hidden);
  printf("| case | kernels | eager | separate | tree | bare | one-graph | overhead/seg (tree-bare)/S | "
         "tree/one-graph | tree/eager | outputs |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  for (int i = 0; i < n; i++) {
    case_result *c = &cs[i];
    mode_result *m = c->m;
    if (!c->ok) {
      printf("| %s | %.0f | FAILED | | | | | | | | ", c->name, c->kernels);
      for (int k = 0; k < N_MODES; k++)
        if (m[k].ran && !m[k].ok)
          printf("%s: %s; ", mode_names[k], m[k].check);
      printf("|\n");
      continue;
    }
    char e[32], s[32], t[32], b[32], g[32], ov[32] = "-", r1[32] = "-", r2[32] = "-";
    fmt_us(e, sizeof e, &m[M_EAGER]);
    fmt_us(s, sizeof s, &m[M_SEPARATE]);
    fmt_us(t, sizeof t, &m[M_TREE]);
    fmt_us(b, sizeof b, &m[M_BARE]);
    fmt_us(g, sizeof g, &m[M_ONE_GRAPH]);
    if (m[M_TREE].ran && m[M_BARE].ran)
      snprintf(ov, sizeof ov, "%.2f", (m[M_TREE].us - m[M_BARE].us) / c->segments_per_step);
    if (m[M_ONE_GRAPH].ran)
      snprintf(r1, sizeof r1, "%.2f", m[M_TREE].us / m[M_ONE_GRAPH].us);
    snprintf(r2, sizeof r2, "%.2f", m[M_TREE].us / m[M_EAGER].us);
    const char *verdict = "all bit-equal";
    if (m[M_ONE_GRAPH].ran && strcmp(m[M_ONE_GRAPH].check, "bit-equal"))
      verdict = "bit-equal; one-graph within tolerance";
    printf("| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c->name, c->kernels, e, s, t, b, g, ov, r1,
           r2, verdict);
  }
  printf("\nbare = the tree's own graphs launched with plain graph launches and no runtime. The first graph\n"
         "copies the step input into its placeholder itself (an in-graph copy node); bare leaves that copy reading\n"
         "the address the tree last gave it, while the tree repoints it whenever the input moves (every step\n"
         "here). For branchy, bare also does the host sync, read-back of the branch sum and choice of that\n"
         "branch's graphs. Runtime overhead per segment = (tree - bare) / segments per step.\n");

  printf("\nHost time of one step's calls (µs, median over %d steps, the stream drained before each step and the\n"
         "wait after it not counted): what the CPU spends per step, whether or not the GPU hides it.\n\n",
         o->steps);
  printf("| case | eager | separate | tree | bare | one-graph | host overhead/seg (tree-bare)/S |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < n; i++) {
    case_result *c = &cs[i];
    if (!c->ok)
      continue;
    mode_result *m = c->m;
    char col[N_MODES][32], ov[32] = "-";
    for (int k = 0; k < N_MODES; k++)
      if (m[k].ran)
        snprintf(col[k], sizeof col[k], m[k].host_us < 10 ? "%.2f" : "%.1f", m[k].host_us);
      else
        snprintf(col[k], sizeof col[k], "-");
    if (m[M_TREE].ran && m[M_BARE].ran)
      snprintf(ov, sizeof ov, "%.2f", (m[M_TREE].host_us - m[M_BARE].host_us) / c->segments_per_step);
    printf("| %s | %s | %s | %s | %s | %s | %s |\n", c->name, col[M_EAGER], col[M_SEPARATE], col[M_TREE], col[M_BARE],
           col[M_ONE_GRAPH], ov);
  }

  printf("\nPool peak (MiB, graph pool + side pool; workspace 4 MiB per segment run, freed at its end):\n\n");
  printf("| case | eager | separate | tree | one-graph | tree/eager | separate/eager |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < n; i++) {
    case_result *c = &cs[i];
    mode_result *m = c->m;
    char e[32], s[32], t[32], g[32], r1[32] = "-", r2[32] = "-";
    fmt_mib(e, sizeof e, &m[M_EAGER]);
    fmt_mib(s, sizeof s, &m[M_SEPARATE]);
    fmt_mib(t, sizeof t, &m[M_TREE]);
    fmt_mib(g, sizeof g, &m[M_ONE_GRAPH]);
    double eb = (double)(m[M_EAGER].pool_peak + m[M_EAGER].side_peak);
    if (m[M_EAGER].ran && eb > 0) {
      snprintf(r1, sizeof r1, "%.2f", (double)(m[M_TREE].pool_peak + m[M_TREE].side_peak) / eb);
      snprintf(r2, sizeof r2, "%.2f", (double)(m[M_SEPARATE].pool_peak + m[M_SEPARATE].side_peak) / eb);
    }
    printf("| %s | %s | %s | %s | %s | %s | %s |\n", c->name, e, s, t, g, r1, r2);
  }

  printf("\nDeferred launch (tree_defer: defer_launch = 1, recurring spans launched as one fused graph). Times as\n"
         "above (µs per step); host = host time of one step's calls including its cgt_flush; first fused flush =\n"
         "host time of the cgt_flush that builds a span's fused executable (instantiate + upload + launch), fused\n"
         "flush = the same call afterwards (repoint the step input's copy + one launch), medians on fresh trees.\n\n");
  printf("| case | tree | tree_defer | one-graph | bare | tree_defer/one-graph | tree/one-graph | tree_defer/bare | "
         "fused launches/step | host tree_defer | host one-graph | host (defer-one)/S | first fused flush | "
         "fused flush |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < n; i++) {
    case_result *c = &cs[i];
    mode_result *m = c->m;
    if (!c->ok || !m[M_DEFER].ran)
      continue;
    char t[32], d[32], g[32], b[32], r1[32] = "-", r2[32] = "-", r3[32] = "-", hg[32] = "-", hov[32] = "-",
                                     ff[32] = "-", fl[32] = "-";
    fmt_us(t, sizeof t, &m[M_TREE]);
    fmt_us(d, sizeof d, &m[M_DEFER]);
    fmt_us(g, sizeof g, &m[M_ONE_GRAPH]);
    fmt_us(b, sizeof b, &m[M_BARE]);
    if (m[M_ONE_GRAPH].ran) {
      snprintf(r1, sizeof r1, "%.3f", m[M_DEFER].us / m[M_ONE_GRAPH].us);
      snprintf(r2, sizeof r2, "%.3f", m[M_TREE].us / m[M_ONE_GRAPH].us);
      snprintf(hg, sizeof hg, "%.2f", m[M_ONE_GRAPH].host_us);
      snprintf(hov, sizeof hov, "%.3f", (m[M_DEFER].host_us - m[M_ONE_GRAPH].host_us) / c->segments_per_step);
    }
    if (m[M_BARE].ran)
      snprintf(r3, sizeof r3, "%.3f", m[M_DEFER].us / m[M_BARE].us);
    if (c->have_fuse) {
      snprintf(ff, sizeof ff, "%.1f", c->first_fused_us);
      snprintf(fl, sizeof fl, "%.2f", c->fused_flush_us);
    }
    printf("| %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %s | %s |\n", c->name, t, d, g, b, r1,
           r2, r3, c->fused_launches_per_step, m[M_DEFER].host_us, hg, hov, ff, fl);
  }

  printf("\nHost time per step with one-graph and tree_defer steps alternating (each step's calls, the flush\n"
         "included, the stream drained before and the wait after not counted; medians of %d steps each): the\n"
         "issue 13 host target compares these, as both meet the same clock and load.\n\n",
         o->steps * o->reps);
  printf("| case | host one-graph | host tree_defer | (defer-one)/S |\n| --- | ---: | ---: | ---: |\n");
  for (int i = 0; i < n; i++) {
    case_result *c = &cs[i];
    if (c->have_paired)
      printf("| %s | %.2f | %.2f | %.3f |\n", c->name, c->paired_one_host_us, c->paired_defer_host_us,
             (c->paired_defer_host_us - c->paired_one_host_us) / c->segments_per_step);
  }

  printf("\nRecording latency (µs; cgt_sync before and after the run, so each figure includes the first launch):\n\n");
  printf("| case | what | record | synced replay of the same run | bare capture+instantiate+launch (raw) | "
         "record/raw |\n");
  printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < n; i++) {
    case_result *c = &cs[i];
    if (!c->have_record)
      continue;
    char raw[64] = "n/a (sim)", ratio[32] = "-";
    if (c->have_raw) {
      snprintf(raw, sizeof raw, "%.1f (capture %.1f, instantiate %.1f)", c->raw_total_us, c->raw_capture_us,
               c->raw_instantiate_us);
      snprintf(ratio, sizeof ratio, "%.2f", c->record_us / c->raw_total_us);
    }
    char what[96];
    if (c->p.kind == WL_CHAIN)
      snprintf(what, sizeof what, "per segment, median of the recording step");
    else
      snprintf(what, sizeof what, "new branch: segment %d after a restore (restores: %" PRIu64 "); then segment 4: %.1f",
               c->second_branch, c->record_restores, c->record_tail_us);
    printf("| %s | %s | %.1f | %.1f | %s | %s |\n", c->name, what, c->record_us, c->record_replay_us, raw, ratio);
  }
  printf("\n");
}

/* ----------------------------------------------------------------- main */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_workloads [--backend sim|cuda] [--quick] [--cases LIST] [--json FILE]\n"
          "                       [--reps N] [--steps N] [--record-reps N] [--batch B] [--hidden H] [--seed N]\n"
          "  --backend      default: cuda when usable, else sim\n"
          "  --quick        few repetitions (smoke test)\n"
          "  --cases        comma-separated: SxL (chain), branchy, branchy:L\n"
          "                 default 1x1,4x1,16x1,64x1,1x4,4x4,16x4,64x4,branchy\n"
          "  --json         append one JSON line per case to FILE\n"
          "  --reps         timed repetitions per mode (default 7; quick 3, sim quick 2)\n"
          "  --steps        steps per repetition (default 300; quick 30, sim quick 4)\n"
          "  --record-reps  fresh trees for the recording latency (default 5; quick 2; 0 skips it)\n");
}

int main(int argc, char **argv) {
  options o;
  memset(&o, 0, sizeof o);
  o.backend = CGT_BACKEND_AUTO;
  o.reps = o.steps = o.record_reps = -1;
  o.warm = 8;
  o.batch = 8;
  o.hidden = 256;
  o.seed = 20261122;
  o.cases = "1x1,4x1,16x1,64x1,1x4,4x4,16x4,64x4,branchy";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--quick")) {
      o.quick = 1;
      continue;
    }
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!v) {
      usage(stderr);
      return 2;
    }
    i++;
    if (!strcmp(a, "--backend")) {
      if (!strcmp(v, "sim"))
        o.backend = CGT_BACKEND_SIM;
      else if (!strcmp(v, "cuda"))
        o.backend = CGT_BACKEND_CUDA;
      else if (strcmp(v, "auto")) {
        usage(stderr);
        return 2;
      }
    } else if (!strcmp(a, "--cases"))
      o.cases = v;
    else if (!strcmp(a, "--json"))
      o.json = v;
    else if (!strcmp(a, "--reps"))
      o.reps = atoi(v);
    else if (!strcmp(a, "--steps"))
      o.steps = atoi(v);
    else if (!strcmp(a, "--record-reps"))
      o.record_reps = atoi(v);
    else if (!strcmp(a, "--batch"))
      o.batch = atoi(v);
    else if (!strcmp(a, "--hidden"))
      o.hidden = atoi(v);
    else if (!strcmp(a, "--seed"))
      o.seed = strtoull(v, NULL, 10);
    else {
      usage(stderr);
      return 2;
    }
  }
  if (o.backend == CGT_BACKEND_AUTO)
    o.backend = kernels_for(CGT_BACKEND_CUDA) && cgt_cuda_available() ? CGT_BACKEND_CUDA : CGT_BACKEND_SIM;
  if (o.backend == CGT_BACKEND_CUDA && !(kernels_for(CGT_BACKEND_CUDA) && cgt_cuda_available())) {
    fprintf(stderr, "bench_workloads: CUDA is %s\n", kernels_for(CGT_BACKEND_CUDA) ? "not usable here" : "not built");
    return 77;
  }
  int sim = o.backend == CGT_BACKEND_SIM;
  if (o.reps < 0)
    o.reps = o.quick ? (sim ? 2 : 3) : 7;
  if (o.steps < 0)
    o.steps = o.quick ? (sim ? 4 : 30) : 300;
  if (o.record_reps < 0)
    o.record_reps = o.quick ? (sim ? 1 : 2) : 5;
  if (o.reps < 1 || o.steps < 1 || o.batch < 1 || o.hidden < 1) {
    usage(stderr);
    return 2;
  }
  case_result *cs = NULL;
  int n = 0;
  if (!parse_cases(&o, &cs, &n)) {
    usage(stderr);
    return 2;
  }
  char dev[256], dev_esc[512];
  bench_device_name(o.backend, dev, sizeof dev);
  bench_json_escape(dev, dev_esc, sizeof dev_esc);
  FILE *json = NULL;
  if (o.json && !(json = fopen(o.json, "a"))) {
    perror(o.json);
    return 1;
  }
  fprintf(stderr, "bench_workloads: %s (%s), %d cases\n", sim ? "sim" : "cuda", dev, n);
  int failed = 0;
  for (int i = 0; i < n; i++) {
    double t0 = bench_now_ns();
    if (!run_case(&o, &cs[i]) || !cs[i].ok)
      failed = 1;
    fprintf(stderr, "  %s: %s in %.1f s\n", cs[i].name, cs[i].ok ? "done" : "FAILED", (bench_now_ns() - t0) / 1e9);
    if (json) {
      json_case(json, &o, &cs[i], dev_esc);
      fflush(json);
    }
  }
  print_tables(&o, cs, n, dev);
  for (int i = 0; i < n; i++)
    json_case(stdout, &o, &cs[i], dev_esc);
  if (json)
    fclose(json);
  free(cs);
  if (failed)
    fprintf(stderr, "bench_workloads: FAILED: see the table (a mode's output differed, or a run failed)\n");
  return failed ? 1 : 0;
}
