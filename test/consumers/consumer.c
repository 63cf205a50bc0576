/* consumer.c — a program that uses an installed (or subproject) cgtree.
 *
 * test/consumers.sh builds it three ways — through pkg-config, as a Meson
 * subproject with a fallback, and through CMake's find_package — and runs it.
 * It uses only the public headers and the shared library: one segment
 * (y = x + 1 over 16 floats) for three steps on the simulator, checked on the
 * host, so it fails if the library misbehaves, not only if it fails to link.
 * It prints one line; consumers.sh compares it.
 */
#include <stdio.h>
#include <string.h>

#include <cgtree.h>
#include <cgtree_sim.h>

#define N 16

typedef struct inc_args {
  const float *x;
  float *y;
} inc_args;

static void inc_kernel(void *p) {
  const inc_args *k = p;
  for (int i = 0; i < N; i++)
    k->y[i] = k->x[i] + 1.0f;
}

static cgt_status inc_launch(cgt_launch *l, void *user) {
  (void)user;
  inc_args k = {cgt_launch_input(l, 0), NULL};
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), (void **)&k.y);
  if (st == CGT_OK)
    st = cgt_sim_launch(cgt_launch_stream(l), inc_kernel, &k, sizeof k);
  if (st == CGT_OK)
    st = cgt_launch_set_output(l, 0, k.y, N * sizeof(float));
  return st;
}

static int fail(const char *what, cgt_status st) {
  printf("consumer: %s failed: %s\n", what, cgt_status_name(st));
  return 1;
}

int main(void) {
  if (strcmp(cgt_version(), CGT_VERSION_STRING) != 0) {
    printf("consumer: header %s but library %s\n", CGT_VERSION_STRING, cgt_version());
    return 1;
  }
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  cgt_tree *t;
  cgt_status st = cgt_tree_create(&o, &t);
  if (st != CGT_OK)
    return fail("cgt_tree_create", st);
  cgt_segment_desc d = {.name = "inc", .launch = inc_launch, .n_inputs = 1, .n_outputs = 1};
  cgt_segment seg;
  if ((st = cgt_segment_register(t, &d, &seg)) != CGT_OK)
    return fail("cgt_segment_register", st);
  float x[N], y[N];
  for (int step = 0; step < 3; step++) {
    for (int i = 0; i < N; i++)
      x[i] = (float)(step * 100 + i);
    cgt_arg a = cgt_arg_static(x, sizeof x);
    cgt_value v;
    if ((st = cgt_step_begin(t)) != CGT_OK || (st = cgt_run(t, seg, 0, &a, 1, &v, 1)) != CGT_OK ||
        (st = cgt_value_copy_out(t, v, y, sizeof y)) != CGT_OK || (st = cgt_sync(t)) != CGT_OK)
      return fail("a step", st);
    for (int i = 0; i < N; i++)
      if (y[i] != x[i] + 1.0f) {
        printf("consumer: step %d: y[%d] = %g, expected %g\n", step, i, y[i], x[i] + 1.0f);
        return 1;
      }
  }
  cgt_stats s;
  if ((st = cgt_tree_stats(t, &s)) != CGT_OK)
    return fail("cgt_tree_stats", st);
  printf("consumer: cgtree %s, %llu runs, %llu replays, ok\n", cgt_version(), (unsigned long long)s.runs,
         (unsigned long long)s.replays);
  cgt_tree_destroy(t);
  return 0;
}
