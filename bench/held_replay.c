/* held_replay.c — the host cost of one cgt_run + cgt_value_release on the
 * replay path, on the simulator, with and without deferred launch.
 *
 * Issue 13's last target is host time: a fused step may cost one graph
 * launch plus 0.1 µs per segment. Apart from the one launch, what a fused
 * step costs is S runs that are held back and S releases, so this program
 * times exactly those: a chain of S runs of one segment (the first reads a
 * DYNAMIC buffer that alternates between two addresses, each later one the
 * VALUE before it, which is released right after), steps of it replayed
 * back to back, and the clock read around the runs only (cgt_step_begin,
 * which launches what was held back, is outside). With defer_launch = 0 the
 * same runs launch their graphs one by one, on the simulator's stream.
 *
 * The simulator's launches cost CPU time of their own, and a held-back run
 * makes no backend call at all, so the defer column is the runtime's own
 * bookkeeping; the CUDA backend adds nothing to it (a held-back run does
 * not even ask which device is current). On a GPU machine's host the same
 * work takes longer or shorter with the CPU: compare figures of one machine.
 *
 *   build/bench/held_replay [--s S] [--steps N] [--reps R]
 *
 * Prints ns per run + release, the minimum and the median of R repetitions,
 * for defer_launch 0 and 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

enum { VALUE_BYTES = BENCH_LINK_BYTES };

static int check(cgt_status st, const char *what, cgt_tree *t) { return bench_check("held_replay", st, what, t); }

/* One step's runs and releases; *ns gets the time they took. */
static int one_step(cgt_tree *t, cgt_segment seg, int s_len, const void *input, double *ns) {
  if (!check(cgt_step_begin(t), "cgt_step_begin", t))
    return 0;
  double t0 = bench_now_ns();
  cgt_arg arg = cgt_arg_dynamic(input, VALUE_BYTES);
  cgt_value prev = {0};
  for (int i = 0; i < s_len; i++) {
    cgt_value out;
    if (!check(cgt_run(t, seg, 0, &arg, 1, &out, 1), "cgt_run", t))
      return 0;
    if (i > 0 && !check(cgt_value_release(t, prev), "cgt_value_release", t))
      return 0;
    prev = out;
    arg = cgt_arg_value(out);
  }
  *ns = bench_now_ns() - t0;
  return 1;
}

/* ns per run + release for one deferral setting: min and median of reps. */
static int measure(int defer, int s_len, long steps, int reps, double *min_ns, double *median_ns) {
  static char inputs[2][VALUE_BYTES]; /* the simulator's device memory is host memory */
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  o.defer_launch = defer;
  cgt_tree *t = NULL;
  double *v = calloc((size_t)reps, sizeof *v);
  int ok = v && check(cgt_tree_create(&o, &t), "cgt_tree_create", NULL);
  cgt_segment seg = 0;
  cgt_segment_desc d = {"link", bench_link_launch, NULL, 1, 1, 0};
  ok = ok && check(cgt_segment_register(t, &d, &seg), "cgt_segment_register", t);
  double ns = 0;
  for (long i = 0; ok && i < 8; i++) /* warmup, recording, the span's first flushes */
    ok = one_step(t, seg, s_len, inputs[i & 1], &ns);
  cgt_stats before, after;
  if (ok)
    cgt_tree_stats(t, &before);
  for (int r = 0; ok && r < reps; r++) {
    double sum = 0;
    for (long i = 0; ok && i < steps; i++) {
      ok = one_step(t, seg, s_len, inputs[i & 1], &ns);
      sum += ns;
    }
    v[r] = sum / ((double)steps * s_len);
  }
  if (ok) {
    cgt_tree_stats(t, &after);
    uint64_t timed = (uint64_t)reps * (uint64_t)steps * (uint64_t)s_len;
    if (after.replays - before.replays != timed) {
      fprintf(stderr, "held_replay: %llu of %llu timed runs were replays\n",
              (unsigned long long)(after.replays - before.replays), (unsigned long long)timed);
      ok = 0;
    }
    if (defer && after.fused_launches == before.fused_launches) {
      fprintf(stderr, "held_replay: defer_launch = 1 but no fused launch happened\n");
      ok = 0;
    }
  }
  if (ok) {
    *median_ns = bench_median(v, (size_t)reps); /* sorts v */
    *min_ns = v[0];
  }
  cgt_tree_destroy(t);
  free(v);
  return ok;
}

int main(int argc, char **argv) {
  int s_len = 16, reps = 7;
  long steps = 20000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--s") && i + 1 < argc)
      s_len = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atol(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: held_replay [--s S] [--steps N] [--reps R]\n");
      return 2;
    }
  }
  if (s_len < 2 || steps < 1 || reps < 1)
    return 2;
  char cpu[256];
  bench_cpu_name(cpu, sizeof cpu);
  printf("held_replay: simulator, chain S=%d, %ld steps x %d repetitions, %s\n", s_len, steps, reps, cpu);
  printf("| defer_launch | ns per run + release, min | median |\n| ---: | ---: | ---: |\n");
  for (int defer = 0; defer <= 1; defer++) {
    double lo, mid;
    if (!measure(defer, s_len, steps, reps, &lo, &mid))
      return 1;
    printf("| %d | %.1f | %.1f |\n", defer, lo, mid);
  }
  return 0;
}
