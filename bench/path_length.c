/* path_length.c — does the cost of one cgt_run depend on how many runs the
 * step has made before it?
 *
 * The program: every step is a chain of P runs of one segment. The first run
 * reads a STATIC caller buffer, every later run the VALUE the run before it
 * made, and each run makes one 256-byte value with one empty simulator
 * kernel, so the time measured is the runtime's own. Three ways to run it:
 *
 *   TREE, released  each value is released right after the run that reads
 *                   it (a compiler's program): the path holds P values, one
 *                   of them live, the rest dead graph-pool values
 *   TREE, live      no value is released until the step ends: P live values
 *   EAGER           CGT_MODE_EAGER, values released as in the first row:
 *                   every run calls the launch function and allocates
 *
 * For P = 4, 64, 512 and 4096 we time whole steps (cgt_step_begin and the
 * releases included) after the tree has recorded every node, and divide by
 * P; the median of `reps` repetitions of about `runs` runs each is the
 * figure. The last column is ns per run at P = 4096 over ns per run at
 * P = 4: 1.0 means the cost of a run does not depend on the program's
 * length. Targets (issue 9): within 1.3x in TREE mode, 1.5x in EAGER mode.
 *
 * Every timed TREE run must be a replay, and the tree must make no host
 * allocation while it replays; otherwise the program fails.
 *
 * A second table gives the host memory a TREE-mode tree holds once it has
 * recorded, per node: glibc's count of bytes in use (mallinfo2: uordblks +
 * hblkhd) after the recording step minus before cgt_tree_create, less the
 * pool's reserved bytes (the simulator's "device" memory is host memory),
 * over P. Node memory is linear when it does not grow with P (issue 9;
 * before delta checkpoints each node held a copy of the whole pool layout,
 * O(P) bytes). Other C libraries print "n/a".
 *
 *   build/bench/path_length [--backend sim] [--quick] [--reps N] [--runs N]
 *
 * --row R and --p P measure one row and one length only (for profiling);
 * the other cells print as 0.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
#include <malloc.h>
#define HAVE_HEAP_BYTES 1
static double heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return (double)m.uordblks + (double)m.hblkhd;
}
#else
#define HAVE_HEAP_BYTES 0
static double heap_bytes(void) { return 0; }
#endif

enum { VALUE_BYTES = BENCH_LINK_BYTES, N_LENGTHS = 4, N_ROWS = 3 };
static const uint32_t lengths[N_LENGTHS] = {4, 64, 512, 4096};

typedef struct row {
  const char *name;
  cgt_mode mode;
  int release; /* release each value after its last use */
} row;

static const row rows[N_ROWS] = {
    {"TREE, values released", CGT_MODE_TREE, 1},
    {"TREE, values kept live", CGT_MODE_TREE, 0},
    {"EAGER, values released", CGT_MODE_EAGER, 1},
};

static int check(cgt_status st, const char *what, cgt_tree *t) { return bench_check("path_length", st, what, t); }

typedef struct chain {
  cgt_tree *t;
  cgt_segment seg;
  const row *r;
  uint32_t p;
  void *input;
} chain;

static cgt_status one_step(chain *c) {
  cgt_tree *t = c->t;
  cgt_status st = cgt_step_begin(t);
  cgt_arg arg = cgt_arg_static(c->input, VALUE_BYTES);
  cgt_value prev = {0};
  for (uint32_t i = 0; i < c->p && st == CGT_OK; i++) {
    cgt_value out;
    st = cgt_run(t, c->seg, 0, &arg, 1, &out, 1);
    if (st == CGT_OK && c->r->release && prev.bits)
      st = cgt_value_release(t, prev);
    prev = out;
    arg = cgt_arg_value(out);
  }
  return st;
}

/* ns per run for one row and length; -1 on failure. *heap_per_node: host
 * heap bytes the recorded tree holds, per node. */
static double measure(const row *r, uint32_t p, int reps, long runs, uint64_t *allocs_delta, double *heap_per_node) {
  chain c = {NULL, 0, r, p, NULL};
  double result = -1, *v = calloc((size_t)reps, sizeof *v);
  static char input[VALUE_BYTES]; /* the simulator's device memory is host memory */
  c.input = input;
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  o.mode = r->mode;
  double heap0 = heap_bytes();
  if (!v || !check(cgt_tree_create(&o, &c.t), "cgt_tree_create", NULL))
    goto done;
  cgt_segment_desc d = {"link", bench_link_launch, NULL, 1, 1, 0};
  if (!check(cgt_segment_register(c.t, &d, &c.seg), "register", c.t))
    goto done;
  /* Step 0 warms up, step 1 records, the rest replay. */
  for (int i = 0; i < 3; i++)
    if (!check(one_step(&c), "warm-up step", c.t))
      goto done;
  cgt_stats recorded;
  cgt_tree_stats(c.t, &recorded);
  *heap_per_node = (heap_bytes() - heap0 - (double)recorded.pool_reserved_bytes) / p;
  long steps = runs / p;
  if (steps < 2)
    steps = 2;
  cgt_stats before, after;
  cgt_tree_stats(c.t, &before);
  for (int rep = 0; rep < reps; rep++) {
    double t0 = bench_now_ns();
    for (long i = 0; i < steps; i++)
      if (!check(one_step(&c), "step", c.t))
        goto done;
    v[rep] = (bench_now_ns() - t0) / ((double)steps * p);
  }
  cgt_tree_stats(c.t, &after);
  *allocs_delta = after.host_allocs - before.host_allocs;
  uint64_t timed = (uint64_t)reps * (uint64_t)steps * p;
  if (r->mode == CGT_MODE_TREE && (after.replays - before.replays != timed || *allocs_delta)) {
    fprintf(stderr, "path_length: %s, P = %u: %" PRIu64 " of %" PRIu64 " timed runs replayed, %" PRIu64
                    " host allocations while replaying\n",
            r->name, p, after.replays - before.replays, timed, *allocs_delta);
    goto done;
  }
  result = bench_median(v, (size_t)reps);
done:
  cgt_tree_destroy(c.t);
  free(v);
  return result;
}

int main(int argc, char **argv) {
  int reps = 5, only_row = -1;
  long runs = 400000;
  long only_p = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      reps = 3;
      runs = 40000;
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--row") && i + 1 < argc) {
      only_row = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--p") && i + 1 < argc) {
      only_p = atol(argv[++i]);
    } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
      if (strcmp(argv[++i], "sim")) {
        fprintf(stderr, "path_length: only the simulator backend is measured here (--backend sim)\n");
        return 2;
      }
    } else {
      fprintf(stderr, "usage: path_length [--backend sim] [--quick] [--reps N] [--runs N] [--row 0-2] [--p P]\n");
      return 2;
    }
  }
  if (reps < 1 || runs < 1)
    return 2;
  char cpu[256];
  bench_cpu_name(cpu, sizeof cpu);
  printf("path_length: ns per cgt_run in a step of P chained runs (one empty kernel each), simulator\n");
  printf("CPU: %s; median of %d repetitions of ~%ld runs\n\n", cpu, reps, runs);
  printf("| mode | P = 4 | P = 64 | P = 512 | P = 4096 | P=4096 / P=4 | target |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  int failed = 0;
  double heap[N_ROWS][N_LENGTHS] = {{0}};
  for (int r = 0; r < N_ROWS; r++) {
    double ns[N_LENGTHS];
    if (only_row >= 0 && r != only_row)
      continue;
    printf("| %s |", rows[r].name);
    for (int l = 0; l < N_LENGTHS; l++) {
      uint64_t allocs = 0;
      ns[l] = only_p && only_p != lengths[l] ? 0 : measure(&rows[r], lengths[l], reps, runs, &allocs, &heap[r][l]);
      failed |= ns[l] < 0;
      printf(" %.1f |", ns[l]);
      fflush(stdout);
    }
    printf(" %.2fx | %.1fx |\n", ns[N_LENGTHS - 1] / ns[0], rows[r].mode == CGT_MODE_EAGER ? 1.5 : 1.3);
  }
  printf("\nPer run includes its share of cgt_step_begin and the releases. Every timed TREE run was a replay, with\n"
         "no host allocation.\n");
  printf("\nHost memory held by the recorded tree, bytes per node (glibc mallinfo2, pool chunks excluded)\n\n");
  printf("| mode | P = 4 | P = 64 | P = 512 | P = 4096 |\n");
  printf("| --- | ---: | ---: | ---: | ---: |\n");
  for (int r = 0; r < N_ROWS; r++) {
    if ((only_row >= 0 && r != only_row) || rows[r].mode != CGT_MODE_TREE)
      continue;
    printf("| %s |", rows[r].name);
    for (int l = 0; l < N_LENGTHS; l++)
      if (HAVE_HEAP_BYTES)
        printf(" %.0f |", heap[r][l]);
      else
        printf(" n/a |");
    printf("\n");
  }
  return failed ? 1 : 0;
}
