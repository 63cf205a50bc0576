/* minimal.c — the smallest complete cgtree program.
 *
 * One segment, y = 2 * x + 1 over four floats, run for three steps on the
 * CPU simulator. Step 1 warms the segment up (runs it eagerly, in the pool),
 * step 2 records it as a graph, step 3 replays the graph. The program checks
 * every result and prints what happened; `meson test --suite examples`
 * compares its output with minimal.expected (and, under CGT_MODE=eager,
 * where every step runs eagerly, with minimal-eager.expected).
 *
 * Build by hand against an installed cgtree:
 *   cc minimal.c $(pkg-config --cflags --libs cgtree) -o minimal
 */
#include <stdio.h>
#include <stdlib.h>

#include <cgtree.h>
#include <cgtree_sim.h>

#define N 4

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cgt_status st_ = (call);                                                           \
    if (st_ != CGT_OK) {                                                               \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, cgt_status_name(st_), err_of(tree)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

static const char *err_of(const cgt_tree *t) { return t ? cgt_tree_last_error(t) : ""; }

/* A simulated kernel gets a copy of this struct at launch time and the same
 * copy on every replay, so it holds everything by value. */
typedef struct affine_args {
  const float *x;
  float *y;
  float a, b;
} affine_args;

static void affine_kernel(void *p) {
  const affine_args *k = p;
  for (int i = 0; i < N; i++)
    k->y[i] = k->a * k->x[i] + k->b;
}

/* The segment: enqueue the same work with the same allocations every time.
 * It is called for warmup and recording, never for replay. */
static cgt_status affine_launch(cgt_launch *l, void *user) {
  (void)user;
  affine_args k = {cgt_launch_input(l, 0), NULL, 2.0f, 1.0f};
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), (void **)&k.y);
  if (st != CGT_OK)
    return st;
  st = cgt_sim_launch(cgt_launch_stream(l), affine_kernel, &k, sizeof k);
  if (st != CGT_OK)
    return st;
  return cgt_launch_set_output(l, 0, k.y, N * sizeof(float));
}

int main(void) {
  cgt_tree *tree = NULL;
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  CHECK(cgt_tree_create(&o, &tree));

  cgt_segment_desc d = {.name = "affine", .launch = affine_launch, .n_inputs = 1, .n_outputs = 1};
  cgt_segment seg;
  CHECK(cgt_segment_register(tree, &d, &seg));

  /* Caller-owned input at a stable address: a STATIC argument. On the
   * simulator device memory is host memory. */
  float x[N];
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < N; i++)
      x[i] = (float)(step * 10 + i);
    cgt_stats before, after;
    CHECK(cgt_tree_stats(tree, &before));

    CHECK(cgt_step_begin(tree));
    cgt_arg in = cgt_arg_static(x, sizeof x);
    cgt_value y;
    CHECK(cgt_run(tree, seg, 0, &in, 1, &y, 1));
    float out[N];
    CHECK(cgt_value_copy_out(tree, y, out, sizeof out));
    CHECK(cgt_sync(tree)); /* the copy is asynchronous */
    CHECK(cgt_value_release(tree, y));

    CHECK(cgt_tree_stats(tree, &after));
    const char *how = after.replays > before.replays       ? "replayed"
                      : after.recordings > before.recordings ? "recorded"
                      : after.warmups > before.warmups       ? "warmed up"
                                                             : "ran eagerly";
    printf("step %d (%s): y =", step, how);
    for (int i = 0; i < N; i++) {
      printf(" %g", out[i]);
      if (out[i] != 2.0f * x[i] + 1.0f) {
        printf("\nwrong result at %d: expected %g\n", i, 2.0f * x[i] + 1.0f);
        return 1;
      }
    }
    printf("\n");
  }

  cgt_stats s;
  CHECK(cgt_tree_stats(tree, &s));
  printf("totals: %llu runs, %llu warmups, %llu recordings, %llu replays, %llu nodes\n",
         (unsigned long long)s.runs, (unsigned long long)s.warmups, (unsigned long long)s.recordings,
         (unsigned long long)s.replays, (unsigned long long)s.nodes);
  cgt_tree_destroy(tree);
  return 0;
}
