/* branches.c — a program with a graph break: 1 -> (2 | 3) -> 4.
 *
 * Segment 1 computes a = x + 1. The host then reads a[0] back (a graph break:
 * a data-dependent `if` that no graph can contain) and runs either segment 2
 * (b = a * 2) or segment 3 (b = a - 10); segment 4 computes y = b + 100.
 * The tree gets two paths, 1 -> 2 -> 4 and 1 -> 3 -> 4, and each is recorded
 * once and then replayed; the second path is recorded after restoring the
 * pool to segment 1's checkpoint, so both paths share one pool.
 *
 * The program checks every result against the same arithmetic on the host,
 * prints each step, then the tree. `meson test --suite examples` compares
 * the output with branches.expected.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cgtree.h>
#include <cgtree_sim.h>

#define N 8

#define CHECK(call)                                                                           \
  do {                                                                                        \
    cgt_status st_ = (call);                                                                  \
    if (st_ != CGT_OK) {                                                                      \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, cgt_status_name(st_), cgt_tree_last_error(tree)); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

/* One simulated kernel for all four segments: out[i] = in[i] * mul + add. */
typedef struct affine_args {
  const float *in;
  float *out;
  float mul, add;
} affine_args;

static void affine_kernel(void *p) {
  const affine_args *k = p;
  for (int i = 0; i < N; i++)
    k->out[i] = k->in[i] * k->mul + k->add;
}

typedef struct affine {
  float mul, add;
} affine;

/* Every segment: one input, one new output of N floats. */
static cgt_status affine_launch(cgt_launch *l, void *user) {
  const affine *f = user;
  affine_args k = {cgt_launch_input(l, 0), NULL, f->mul, f->add};
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), (void **)&k.out);
  if (st == CGT_OK)
    st = cgt_sim_launch(cgt_launch_stream(l), affine_kernel, &k, sizeof k);
  if (st == CGT_OK)
    st = cgt_launch_set_output(l, 0, k.out, N * sizeof(float));
  return st;
}

static const char *how(const cgt_stats *a, const cgt_stats *b) {
  static char buf[64];
  snprintf(buf, sizeof buf, "%llu warmed up, %llu recorded, %llu replayed",
           (unsigned long long)(b->warmups - a->warmups), (unsigned long long)(b->recordings - a->recordings),
           (unsigned long long)(b->replays - a->replays));
  return buf;
}

int main(void) {
  static affine fn[5] = {{0, 0}, {1, 1}, {2, 0}, {1, -10}, {1, 100}};
  cgt_tree *tree = NULL;
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  cgt_status st0 = cgt_tree_create(&o, &tree);
  if (st0 != CGT_OK) {
    fprintf(stderr, "cgt_tree_create: %s\n", cgt_status_name(st0));
    return 1;
  }
  cgt_segment seg[5];
  static const char *const names[5] = {"", "seg1", "seg2", "seg3", "seg4"};
  for (int i = 1; i <= 4; i++) {
    cgt_segment_desc d = {.name = names[i], .launch = affine_launch, .user = &fn[i], .n_inputs = 1, .n_outputs = 1};
    CHECK(cgt_segment_register(tree, &d, &seg[i]));
  }

  /* The input's first element decides the branch: x[0] + 1 > 5 takes 2. */
  static const float first[] = {1, 9, 2, 8, 3, 7};
  float x[N];
  for (int step = 0; step < 6; step++) {
    for (int i = 0; i < N; i++)
      x[i] = first[step] + (float)i;
    cgt_stats before, after;
    CHECK(cgt_tree_stats(tree, &before));
    CHECK(cgt_step_begin(tree));

    cgt_arg in = cgt_arg_static(x, sizeof x);
    cgt_value a, b, y;
    CHECK(cgt_run(tree, seg[1], 0, &in, 1, &a, 1));

    /* The graph break: read a[0] on the host and branch on it. */
    float a0;
    CHECK(cgt_value_copy_out(tree, a, &a0, sizeof a0));
    CHECK(cgt_sync(tree));
    int take2 = a0 > 5.0f;
    cgt_arg arg_a = cgt_arg_value(a);
    CHECK(cgt_run(tree, take2 ? seg[2] : seg[3], 0, &arg_a, 1, &b, 1));
    CHECK(cgt_value_release(tree, a)); /* dead: seg4 may reuse its memory */

    cgt_arg arg_b = cgt_arg_value(b);
    CHECK(cgt_run(tree, seg[4], 0, &arg_b, 1, &y, 1));
    CHECK(cgt_value_release(tree, b));

    float out[N];
    CHECK(cgt_value_copy_out(tree, y, out, sizeof out));
    CHECK(cgt_sync(tree));
    for (int i = 0; i < N; i++) {
      float av = x[i] + 1;
      float want = (take2 ? av * 2 : av - 10) + 100;
      if (out[i] != want) {
        printf("step %d: y[%d] = %g, expected %g\n", step + 1, i, out[i], want);
        return 1;
      }
    }
    CHECK(cgt_tree_stats(tree, &after));
    printf("step %d: x[0] = %g, a[0] = %g -> path 1-%d-4, y[0] = %g (%s)\n", step + 1, x[0], a0, take2 ? 2 : 3,
           out[0], how(&before, &after));
  }

  cgt_stats s;
  CHECK(cgt_tree_stats(tree, &s));
  printf("checkpoint restores: %llu\n", (unsigned long long)s.checkpoint_restores);
  size_t count = 0;
  CHECK(cgt_tree_nodes(tree, NULL, 0, &count));
  cgt_node_info info[16];
  if (count > 16) {
    printf("%zu nodes, expected at most 16\n", count);
    return 1;
  }
  CHECK(cgt_tree_nodes(tree, info, count, &count));
  for (size_t i = 0; i < count; i++)
    printf("%*snode %u %s [%s] replays=%llu\n", (int)(2 * info[i].depth), "", info[i].id, info[i].segment_name,
           cgt_node_state_name(info[i].state), (unsigned long long)info[i].replays);
  CHECK(cgt_tree_check(tree));
  cgt_tree_destroy(tree);
  return 0;
}
