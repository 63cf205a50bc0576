/* prelaunch.c — prelaunch functions (cgt_segment_set_prelaunch), scenario by
 * scenario, on every backend.
 *
 * The model is a random generator: a recording cannot carry a host value
 * that changes per launch, so its kernels read the generator's state from
 * device memory (here `state`, caller memory outside the pool), and a
 * prelaunch function writes that state on the tree's stream right before
 * each launch and advances the host's offset, as PyTorch's own graphs do
 * for its CUDA generator. The segment computes out = x + state. What the
 * contract promises, and each test checks after every run:
 *
 * - it is called before the first launch of a recording and before every
 *   replay, never for a warmup or an eager run, with the tree's stream and
 *   the run's variant, and what it enqueues runs before the graph (each
 *   launch sees the state written just for it: x + 0, x + 1, ...);
 * - a failure fails the run with CGT_ERR_SEGMENT_FAILED and changes
 *   nothing, at a recording and at a replay;
 * - inside it the tree refuses what it refuses inside a launch function;
 * - replays of such a segment are never held back by defer_launch;
 * - bad input changes nothing, and NULL removes the function.
 */
#include <stdio.h>
#include <string.h>

#include "test_lists.h"

#define N 32

typedef struct generator {
  float *state;   /* device: what the recorded kernels read */
  float offset;   /* host: what the next launch must see */
  int calls;      /* prelaunch calls */
  int fail_at;    /* the call (1-based) that returns an error; 0 = none */
  void *stream;   /* the stream of the last call */
  uint64_t variant;
  cgt_tree *tree; /* for the calls that must be refused */
  cgt_segment seg;
  cgt_status refused[8];
  int launches;   /* launch function calls */
} generator;

static cgt_status launch_draw(cgt_launch *l, void *user) {
  generator *g = user;
  g->launches++;
  void *out;
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), &out);
  if (st == CGT_OK)
    st = test_kernels()->add(cgt_launch_stream(l), cgt_launch_input(l, 0), g->state, out, N);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, N * sizeof(float)) : st;
}

static cgt_status prelaunch_draw(void *user, void *stream, uint64_t variant) {
  generator *g = user;
  g->calls++;
  g->stream = stream;
  g->variant = variant;
  if (g->calls == g->fail_at)
    return CGT_ERR_BACKEND;
  cgt_status st = test_kernels()->fill(stream, g->state, g->offset, N);
  if (st == CGT_OK)
    g->offset += 1;
  return st;
}

/* Tries what the tree must refuse inside a prelaunch function. */
static cgt_status prelaunch_reentrant(void *user, void *stream, uint64_t variant) {
  generator *g = user;
  cgt_value v = {0};
  cgt_arg a = cgt_arg_static(g->state, N * sizeof(float));
  cgt_segment_desc d = {"late", launch_draw, g, 1, 1, 0};
  cgt_segment s = 0;
  g->refused[0] = cgt_run(g->tree, g->seg, 0, &a, 1, &v, 1);
  g->refused[1] = cgt_step_begin(g->tree);
  g->refused[2] = cgt_sync(g->tree);
  g->refused[3] = cgt_flush(g->tree);
  g->refused[4] = cgt_segment_register(g->tree, &d, &s);
  g->refused[5] = cgt_segment_set_prelaunch(g->tree, g->seg, NULL, NULL);
  g->refused[6] = cgt_tree_set_reclaim(g->tree, NULL, NULL);
  return prelaunch_draw(user, stream, variant);
}

static cgt_tree *tree_with(uint32_t warmup_runs, uint32_t defer) {
  cgt_options o;
  cgt_options_init(&o);
  o.warmup_runs = warmup_runs;
  o.defer_launch = defer;
  return test_tree_new(CGT_MODE_TREE, &o);
}

static cgt_segment register_draw(cgt_tree *t, generator *g, cgt_prelaunch_fn fn) {
  cgt_segment_desc d = {"draw", launch_draw, g, 1, 1, 0};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  CHECK_OK(t, cgt_segment_set_prelaunch(t, s, fn, g));
  g->tree = t;
  g->seg = s;
  return s;
}

static void expect_x_plus(cgt_tree *t, cgt_value v, const float *hx, float k, int run) {
  float got[N];
  test_read_value(t, v, got, N);
  for (int i = 0; i < N; i++)
    if (got[i] != hx[i] + k)
      fail_msg("run %d, element %d: got %g, expected x + %g = %g", run, i, (double)got[i], (double)k,
               (double)(hx[i] + k));
}

/* A tree, the input x (DYNAMIC) and a generator whose segment `draw` has
 * prelaunch function fn. */
typedef struct fixture {
  cgt_tree *t;
  float hx[N];
  float *x;
  generator g;
  cgt_segment s;
  cgt_arg a;
} fixture;

static void open_fixture(fixture *f, uint32_t warmup_runs, uint32_t defer, cgt_prelaunch_fn fn) {
  memset(f, 0, sizeof *f);
  f->t = tree_with(warmup_runs, defer);
  for (int i = 0; i < N; i++)
    f->hx[i] = (float)(i * 3 - 40);
  f->x = test_dev_floats(f->hx, N);
  float zeros[N] = {0};
  f->g.state = test_dev_floats(zeros, N);
  f->s = register_draw(f->t, &f->g, fn);
  f->a = cgt_arg_dynamic(f->x, sizeof f->hx);
}

static void close_fixture(fixture *f) {
  test_tree_free(f->t);
  test_dev_free(f->x);
  test_dev_free(f->g.state);
}

static void test_prelaunch_runs_before_every_launch_of_a_recording_and_never_for_warmups(void **unused) {
  (void)unused;
  fixture f;
  open_fixture(&f, 2, 0, prelaunch_draw);
  for (int run = 1; run <= 7; run++) {
    CHECK_OK(f.t, cgt_step_begin(f.t));
    cgt_value v = {0};
    CHECK_OK(f.t, cgt_run(f.t, f.s, 7, &f.a, 1, &v, 1));
    CHECK_TREE(f.t);
    cgt_stats st = test_stats(f.t);
    /* Runs 1 and 2 warm up (the graph reads a state nobody wrote yet: 0);
     * run 3 records and launches; runs 4.. replay. */
    int launched = run >= 3 ? run - 2 : 0;
    assert_int_equal(f.g.calls, launched);
    assert_int_equal(st.recordings, run >= 3);
    assert_int_equal(st.replays, run >= 4 ? run - 3 : 0);
    if (launched) {
      assert_ptr_equal(f.g.stream, cgt_tree_stream(f.t));
      assert_int_equal(f.g.variant, 7);
    }
    /* Each launch sees the state its own prelaunch call wrote. */
    expect_x_plus(f.t, v, f.hx, launched ? (float)(launched - 1) : 0.0f, run);
    CHECK_OK(f.t, cgt_value_release(f.t, v));
  }
  assert_int_equal(f.g.launches, 3); /* two warmups and one capture: replays never call it */
  close_fixture(&f);
}

static void test_a_failing_prelaunch_fails_the_run_and_changes_nothing(void **unused) {
  (void)unused;
  fixture f;
  open_fixture(&f, 1, 0, prelaunch_draw);
  cgt_tree *t = f.t;
  f.g.fail_at = 1;
  cgt_value v = {0};
  CHECK_OK(t, cgt_run(t, f.s, 0, &f.a, 1, &v, 1)); /* warmup */
  CHECK_OK(t, cgt_value_release(t, v));
  CHECK_OK(t, cgt_step_begin(t));
  cgt_stats before = test_stats(t);
  /* The recording's prelaunch fails: no recording, no graph, no value, the pool as before. */
  v.bits = 0;
  CHECK_STATUS(t, CGT_ERR_SEGMENT_FAILED, cgt_run(t, f.s, 0, &f.a, 1, &v, 1));
  assert_non_null(strstr(cgt_tree_last_error(t), "prelaunch"));
  CHECK_TREE(t);
  cgt_stats after = test_stats(t);
  assert_int_equal(after.recordings, before.recordings);
  assert_int_equal(after.graphs, before.graphs);
  assert_int_equal(after.pool_allocated_bytes, before.pool_allocated_bytes);
  assert_int_equal(after.runs, before.runs);
  assert_int_equal(v.bits, 0);
  assert_true(f.g.offset == 0.0f);
  /* The next run records, and its launch sees offset 0. */
  CHECK_OK(t, cgt_run(t, f.s, 0, &f.a, 1, &v, 1));
  CHECK_TREE(t);
  assert_int_equal(test_stats(t).recordings, 1);
  expect_x_plus(t, v, f.hx, 0, 2);
  CHECK_OK(t, cgt_value_release(t, v));
  /* A replay whose prelaunch fails: no replay, and the next one is right. */
  f.g.fail_at = f.g.calls + 1;
  CHECK_OK(t, cgt_step_begin(t));
  before = test_stats(t);
  v.bits = 0;
  CHECK_STATUS(t, CGT_ERR_SEGMENT_FAILED, cgt_run(t, f.s, 0, &f.a, 1, &v, 1));
  CHECK_TREE(t);
  after = test_stats(t);
  assert_int_equal(after.replays, before.replays);
  assert_int_equal(after.runs, before.runs);
  assert_int_equal(v.bits, 0);
  CHECK_OK(t, cgt_run(t, f.s, 0, &f.a, 1, &v, 1));
  CHECK_TREE(t);
  assert_int_equal(test_stats(t).replays, before.replays + 1);
  expect_x_plus(t, v, f.hx, 1, 4);
  CHECK_OK(t, cgt_value_release(t, v));
  close_fixture(&f);
}

static void test_inside_a_prelaunch_the_tree_refuses_what_it_refuses_inside_a_launch(void **unused) {
  (void)unused;
  fixture f;
  open_fixture(&f, 0, 0, prelaunch_reentrant);
  for (int i = 0; i < 8; i++)
    f.g.refused[i] = CGT_OK;
  cgt_value v = {0};
  CHECK_OK(f.t, cgt_run(f.t, f.s, 0, &f.a, 1, &v, 1)); /* records at once: the prelaunch runs */
  CHECK_TREE(f.t);
  assert_int_equal(f.g.calls, 1);
  for (int i = 0; i < 7; i++)
    if (f.g.refused[i] != CGT_ERR_STATE)
      fail_msg("call %d inside the prelaunch function returned %s, not CGT_ERR_STATE", i,
               cgt_status_name(f.g.refused[i]));
  expect_x_plus(f.t, v, f.hx, 0, 1);
  CHECK_OK(f.t, cgt_value_release(f.t, v));
  close_fixture(&f);
}

static void test_replays_of_a_segment_with_a_prelaunch_are_never_held_back(void **unused) {
  (void)unused;
  fixture f;
  open_fixture(&f, 0, 1, prelaunch_draw);
  cgt_tree *t = f.t;
  float zeros[N] = {0};
  generator plain = {.state = test_dev_floats(zeros, N)};
  cgt_segment_desc d = {"plain", launch_draw, &plain, 1, 1, 0};
  cgt_segment p = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &p));
  for (int run = 1; run <= 5; run++) {
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value vp = {0}, vd = {0};
    CHECK_OK(t, cgt_run(t, p, 0, &f.a, 1, &vp, 1));
    int calls_before = f.g.calls;
    CHECK_OK(t, cgt_run(t, f.s, 0, &f.a, 1, &vd, 1));
    CHECK_TREE(t);
    assert_int_equal(f.g.calls, calls_before + 1);
    /* The draw replayed now, not later: a plain replay held before it went first, unfused. */
    assert_int_equal(test_stats(t).fused_launches, 0);
    expect_x_plus(t, vd, f.hx, (float)(run - 1), run);
    expect_x_plus(t, vp, f.hx, 0, run);
    CHECK_OK(t, cgt_value_release(t, vd));
    CHECK_OK(t, cgt_value_release(t, vp));
  }
  assert_int_equal(test_stats(t).replays, 8);
  close_fixture(&f);
  test_dev_free(plain.state);
}

static void test_bad_prelaunch_registrations_change_nothing_and_null_removes_it(void **unused) {
  (void)unused;
  fixture f;
  open_fixture(&f, 0, 0, prelaunch_draw);
  cgt_tree *t = f.t;
  assert_int_equal(CGT_ERR_INVALID_ARGUMENT, cgt_segment_set_prelaunch(NULL, f.s, prelaunch_draw, &f.g));
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_set_prelaunch(t, 0, NULL, NULL));
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_set_prelaunch(t, f.s + 1, NULL, NULL));
  cgt_value v = {0};
  CHECK_OK(t, cgt_run(t, f.s, 0, &f.a, 1, &v, 1)); /* the refusals left the function in place */
  assert_int_equal(f.g.calls, 1);
  expect_x_plus(t, v, f.hx, 0, 1);
  CHECK_OK(t, cgt_value_release(t, v));
  CHECK_OK(t, cgt_segment_set_prelaunch(t, f.s, NULL, &f.g));
  CHECK_OK(t, cgt_step_begin(t));
  CHECK_OK(t, cgt_run(t, f.s, 0, &f.a, 1, &v, 1)); /* a replay, without the function */
  assert_int_equal(test_stats(t).replays, 1);
  assert_int_equal(f.g.calls, 1);
  expect_x_plus(t, v, f.hx, 0, 2); /* the state the last call wrote */
  CHECK_OK(t, cgt_value_release(t, v));
  CHECK_TREE(t);
  close_fixture(&f);
}

const struct CMUnitTest prelaunch_tests[] = {
    cmocka_unit_test(test_prelaunch_runs_before_every_launch_of_a_recording_and_never_for_warmups),
    cmocka_unit_test(test_a_failing_prelaunch_fails_the_run_and_changes_nothing),
    cmocka_unit_test(test_inside_a_prelaunch_the_tree_refuses_what_it_refuses_inside_a_launch),
    cmocka_unit_test(test_replays_of_a_segment_with_a_prelaunch_are_never_held_back),
    cmocka_unit_test(test_bad_prelaunch_registrations_change_nothing_and_null_removes_it),
};
const size_t prelaunch_test_count = sizeof prelaunch_tests / sizeof prelaunch_tests[0];
