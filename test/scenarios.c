/* scenarios.c — the tree's behaviour, scenario by scenario.
 *
 * Each test is a small program written against the public API and the
 * kernel table, so the same scenarios run on the simulator (test_tree) and
 * on a GPU (test_cuda). Every scenario checks outputs against values
 * computed on the host (small integers: float arithmetic is exact on every
 * device) and against an eager run, and checks the counters that prove the
 * tree did what the scenario is about (recordings, replays, restores).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_lists.h"

#define N 64

static void expect_floats(cgt_tree *t, cgt_value v, const float *expected, size_t n) {
  float got[N];
  assert_true(n <= N);
  test_read_value(t, v, got, n);
  for (size_t i = 0; i < n; i++)
    if (got[i] != expected[i])
      fail_msg("element %zu: got %g, expected %g", i, (double)got[i], (double)expected[i]);
}

static void affine_host(const float *x, float a, float b, float *out, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a * x[i] + b;
}

static int ranges_overlap(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

static cgt_node_info node_info(cgt_tree *t, uint32_t id) {
  cgt_node_info info[64];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 64, &n));
  assert_true(id >= 1 && id <= n && n <= 64);
  return info[id - 1];
}

/* ------------------------------------------------- 1 → (2 | 3) → 4, branchy */

typedef struct branchy {
  test_affine u1, u2, u3, u4;
  cgt_segment s1, s2, s3, s4;
  float *x; /* DYNAMIC step input, caller memory */
} branchy;

static void branchy_init(cgt_tree *t, branchy *b) {
  memset(b, 0, sizeof *b);
  b->u1 = (test_affine){.a = 2, .b = 1, .n = N};
  b->u2 = (test_affine){.a = 3, .b = 0, .n = N};
  b->u3 = (test_affine){.a = -1, .b = 5, .n = N};
  b->u4 = (test_affine){.a = 1, .b = 1, .n = N};
  b->s1 = test_register_affine(t, "one", &b->u1);
  b->s2 = test_register_affine(t, "two", &b->u2);
  b->s3 = test_register_affine(t, "three", &b->u3);
  b->s4 = test_register_affine(t, "four", &b->u4);
  b->x = test_dev_floats(NULL, N);
}

/* One step: x alternates in sign, so y[0] does and the host branch flips.
 * Checks y (still live) and w against the host; returns w's first element. */
static float branchy_step(cgt_tree *t, branchy *b, int step, cgt_value *y_out, cgt_value *w_out) {
  float x[N], y[N], z[N], w[N];
  float sign = step % 2 ? -1.0f : 1.0f;
  for (int i = 0; i < N; i++)
    x[i] = sign * (float)(1 + (i + step) % 4);
  CHECK_OK(t, cgt_sync(t));
  test_dev_upload(b->x, x, N);
  CHECK_OK(t, cgt_step_begin(t));
  cgt_value vy = test_run1(t, b->s1, 0, cgt_arg_dynamic(b->x, N * sizeof(float)));
  affine_host(x, 2, 1, y, N);
  int take_two = test_read_first(t, vy) > 0; /* host logic on device data */
  assert_int_equal(take_two, y[0] > 0);
  cgt_value vz = test_run1(t, take_two ? b->s2 : b->s3, 0, cgt_arg_value(vy));
  affine_host(y, take_two ? 3 : -1, take_two ? 0 : 5, z, N);
  cgt_value vw = test_run1(t, b->s4, 0, cgt_arg_value(vz));
  affine_host(z, 1, 1, w, N);
  expect_floats(t, vw, w, N);
  expect_floats(t, vy, y, N); /* node 1's output survived whatever ran after it */
  if (y_out)
    *y_out = vy;
  if (w_out)
    *w_out = vw;
  return w[0];
}

static void test_alternating_branches_record_five_nodes_then_only_replay(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  cgt_tree *e = test_tree_new(CGT_MODE_EAGER, NULL);
  branchy b, be;
  branchy_init(t, &b);
  branchy_init(e, &be);
  for (int step = 0; step < 4; step++) {
    float tw = branchy_step(t, &b, step, NULL, NULL);
    float ew = branchy_step(e, &be, step, NULL, NULL);
    assert_true(tw == ew);
  }
  cgt_stats s = test_stats(t);
  assert_int_equal(s.recordings, 5);
  assert_int_equal(test_node_count(t), 5);
  for (uint32_t id = 1; id <= 5; id++)
    assert_int_equal(node_info(t, id).state, CGT_NODE_RECORDED);
  /* The shape: 1 is the only root; 2 and 3 under 1; a 4 under each. */
  cgt_node_info n1 = node_info(t, 1);
  assert_int_equal(n1.parent, 0);
  assert_int_equal(n1.segment, b.s1);
  int fours = 0;
  for (uint32_t id = 2; id <= 5; id++) {
    cgt_node_info n = node_info(t, id);
    if (n.segment == b.s4) {
      cgt_node_info p = node_info(t, n.parent);
      assert_true(p.segment == b.s2 || p.segment == b.s3);
      assert_int_equal(n.depth, 2);
      fours++;
    } else {
      assert_int_equal(n.parent, 1);
    }
  }
  assert_int_equal(fours, 2);

  for (int step = 4; step < 12; step++) {
    uint64_t replays = test_stats(t).replays;
    branchy_step(t, &b, step, NULL, NULL);
    cgt_stats now = test_stats(t);
    assert_int_equal(now.recordings, 5);
    assert_int_equal(now.replays, replays + 3);
    assert_int_equal(now.warmups + now.eager_runs, s.warmups + s.eager_runs);
  }
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(b.x);
  test_dev_free(be.x);
  test_tree_free(t);
  test_tree_free(e);
}

static void test_second_branch_records_after_checkpoint_restore(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  branchy b;
  branchy_init(t, &b);
  branchy_step(t, &b, 0, NULL, NULL); /* warmup: 1, 2, 4 */
  branchy_step(t, &b, 1, NULL, NULL); /* records 1; warms 3, 4 */
  assert_int_equal(test_stats(t).checkpoint_restores, 0);
  cgt_value y, w;
  branchy_step(t, &b, 2, &y, &w); /* replays 1, restores its checkpoint, records 2 and 4 */
  assert_int_equal(test_stats(t).checkpoint_restores, 1);
  branchy_step(t, &b, 3, &y, &w); /* replays 1, restores, records 3 and 4 */
  assert_int_equal(test_stats(t).checkpoint_restores, 2);
  assert_int_equal(test_stats(t).recordings, 5);

  /* Node 1's output is live through the whole step: the blocks the second
   * branch recorded into never overlap it (branchy_step also re-read y). */
  void *yp, *wp;
  size_t yn, wn;
  CHECK_OK(t, cgt_value_ptr(t, y, &yp, &yn));
  CHECK_OK(t, cgt_value_ptr(t, w, &wp, &wn));
  assert_false(ranges_overlap(yp, yn, wp, wn));
  cgt_node_info n1 = node_info(t, 1);
  assert_true(n1.pool_bytes_live >= yn);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(b.x);
  test_tree_free(t);
}

/* -------------------------------------------------------------- memory */

#define CHAIN 6

static void chain_step(cgt_tree *t, cgt_segment *segs, const float *x, float *result) {
  CHECK_OK(t, cgt_step_begin(t));
  cgt_value v = test_run1(t, segs[0], 0, cgt_arg_static(x, N * sizeof(float)));
  for (int i = 1; i < CHAIN; i++) {
    cgt_value next = test_run1(t, segs[i], 0, cgt_arg_value(v));
    CHECK_OK(t, cgt_value_release(t, v)); /* dead as soon as its consumer ran */
    CHECK_TREE(t);
    v = next;
  }
  test_read_value(t, v, result, N);
}

static size_t chain_peak(cgt_mode mode, float *result) {
  cgt_tree *t = test_tree_new(mode, NULL);
  test_affine u[CHAIN];
  cgt_segment segs[CHAIN];
  for (int i = 0; i < CHAIN; i++) {
    u[i] = (test_affine){.a = 1, .b = (float)i, .n = N, .extra_bytes = 1024 * (size_t)(i % 3)};
    char name[16];
    snprintf(name, sizeof name, "link%d", i);
    segs[i] = test_register_temp(t, name, &u[i]);
  }
  float host[N];
  for (int i = 0; i < N; i++)
    host[i] = (float)i;
  float *x = test_dev_floats(host, N);
  for (int step = 0; step < 5; step++)
    chain_step(t, segs, x, result);
  cgt_stats s = test_stats(t);
  if (mode == CGT_MODE_TREE) {
    assert_int_equal(s.recordings, CHAIN);
    assert_int_equal(s.replays, 3 * CHAIN);
  }
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
  return s.pool_peak_bytes;
}

static void test_tree_pool_peak_equals_eager_peak_when_values_die_early(void **state) {
  (void)state;
  float tree_out[N], eager_out[N], separate_out[N];
  size_t tree_peak = chain_peak(CGT_MODE_TREE, tree_out);
  size_t eager_peak = chain_peak(CGT_MODE_EAGER, eager_out);
  size_t separate_peak = chain_peak(CGT_MODE_SEPARATE, separate_out);
  assert_memory_equal(tree_out, eager_out, sizeof tree_out);
  assert_memory_equal(separate_out, eager_out, sizeof tree_out);
  assert_true(eager_peak > 0);
  assert_int_equal(tree_peak, eager_peak);
  assert_true(separate_peak > eager_peak);
}

/* ------------------------------------------------------------ liveness */

typedef struct live3 {
  test_affine ua, ub, uc;
  cgt_segment a, b, c;
  float *x;
  float hx[N];
} live3;

static void live3_init(cgt_tree *t, live3 *l) {
  memset(l, 0, sizeof *l);
  l->ua = (test_affine){.a = 2, .b = 0, .n = N};
  l->ub = (test_affine){.a = 1, .b = 3, .n = N};
  l->uc = (test_affine){.a = -1, .b = 0, .n = N};
  l->a = test_register_affine(t, "a", &l->ua);
  l->b = test_register_affine(t, "b", &l->ub);
  l->c = test_register_affine(t, "c", &l->uc);
  for (int i = 0; i < N; i++)
    l->hx[i] = (float)(i % 7);
  l->x = test_dev_floats(l->hx, N);
}

/* a = A(x); b = B(a); [release a]; c = C(b). Checks a (if kept) and c. */
static void live3_step(cgt_tree *t, live3 *l, int release_a) {
  float ha[N], hb[N], hc[N];
  affine_host(l->hx, 2, 0, ha, N);
  affine_host(ha, 1, 3, hb, N);
  affine_host(hb, -1, 0, hc, N);
  CHECK_OK(t, cgt_step_begin(t));
  cgt_value a = test_run1(t, l->a, 0, cgt_arg_static(l->x, N * sizeof(float)));
  cgt_value b = test_run1(t, l->b, 0, cgt_arg_value(a));
  if (release_a)
    CHECK_OK(t, cgt_value_release(t, a));
  cgt_value c = test_run1(t, l->c, 0, cgt_arg_value(b));
  expect_floats(t, c, hc, N);
  if (!release_a) {
    expect_floats(t, a, ha, N); /* C's memory never overlapped live a */
    void *ap, *cp;
    size_t an, cn;
    CHECK_OK(t, cgt_value_ptr(t, a, &ap, &an));
    CHECK_OK(t, cgt_value_ptr(t, c, &cp, &cn));
    assert_false(ranges_overlap(ap, an, cp, cn));
  }
}

static void test_node_recorded_while_a_value_was_dead_rerecords_when_it_is_live(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  live3 l;
  live3_init(t, &l);
  for (int i = 0; i < 3; i++)
    live3_step(t, &l, 1); /* C recorded with a dead: it may reuse a's block */
  assert_int_equal(test_stats(t).recordings, 3);
  assert_int_equal(test_stats(t).rerecords, 0);

  live3_step(t, &l, 0); /* a live now: C must not replay; a sibling records */
  cgt_stats s = test_stats(t);
  assert_int_equal(s.rerecords, 1);
  assert_int_equal(s.recordings, 4);
  assert_int_equal(test_node_count(t), 4);
  cgt_node_info c1 = node_info(t, 3), c2 = node_info(t, 4);
  assert_int_equal(c1.segment, l.c);
  assert_int_equal(c2.segment, l.c);
  assert_int_equal(c1.parent, c2.parent);

  uint64_t c1_replays = c1.replays;
  live3_step(t, &l, 0); /* the sibling replays */
  assert_int_equal(node_info(t, 4).replays, 1);
  live3_step(t, &l, 1); /* the first recording still serves the old pattern */
  assert_int_equal(node_info(t, 3).replays, c1_replays + 1);
  assert_int_equal(test_stats(t).recordings, 4);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(l.x);
  test_tree_free(t);
}

static void test_liveness_mismatch_past_rerecord_limit_runs_eagerly(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.rerecord_limit = 1;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  live3 l;
  live3_init(t, &l);
  for (int i = 0; i < 3; i++)
    live3_step(t, &l, 1);
  uint64_t eager_before = test_stats(t).eager_runs;
  for (int i = 0; i < 3; i++)
    live3_step(t, &l, 0); /* a's bytes are checked intact every time */
  cgt_stats s = test_stats(t);
  assert_int_equal(s.rerecords, 0);
  assert_int_equal(s.recordings, 3);
  assert_int_equal(s.eager_runs, eager_before + 3);
  cgt_node_info e = node_info(t, 4);
  assert_int_equal(e.state, CGT_NODE_EAGER);
  assert_non_null(e.reason);
  live3_step(t, &l, 1); /* the recorded pattern still replays */
  assert_int_equal(test_stats(t).recordings, 3);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(l.x);
  test_tree_free(t);
}

static void test_releasing_a_value_outside_the_graph_pool_needs_no_rerecord(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  /* A's capture fails, so its output lives in the side pool, where no
   * recording can reuse its memory: whether it is live or not, C replays. */
  test_affine ua = {.a = 2, .b = 0, .n = N, .illegal = 1};
  test_affine ub = {.a = 1, .b = 3, .n = N}, uc = {.a = -1, .b = 0, .n = N};
  cgt_segment sa = test_register_affine(t, "a", &ua);
  cgt_segment sb = test_register_affine(t, "b", &ub);
  cgt_segment sc = test_register_affine(t, "c", &uc);
  float hx[N], ha[N], hb[N], hc[N];
  for (int i = 0; i < N; i++)
    hx[i] = (float)(i % 5);
  affine_host(hx, 2, 0, ha, N);
  affine_host(ha, 1, 3, hb, N);
  affine_host(hb, -1, 0, hc, N);
  float *x = test_dev_floats(hx, N);
  for (int step = 0; step < 8; step++) {
    int release_a = step < 4 || step % 2;
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value a = test_run1(t, sa, 0, cgt_arg_static(x, N * sizeof(float)));
    cgt_value b = test_run1(t, sb, 0, cgt_arg_value(a));
    if (release_a)
      CHECK_OK(t, cgt_value_release(t, a));
    cgt_value c = test_run1(t, sc, 0, cgt_arg_value(b));
    expect_floats(t, c, hc, N);
    if (!release_a)
      expect_floats(t, a, ha, N);
  }
  cgt_stats s = test_stats(t);
  assert_int_equal(s.capture_failures, 1);
  assert_int_equal(s.rerecords, 0);
  assert_int_equal(s.recordings, 2); /* b and c, once each */
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

/* ------------------------------------------------------------ staleness */

static void expect_stale_everywhere(cgt_tree *t, cgt_segment s, cgt_value v) {
  void *p;
  size_t n;
  float host[N];
  uint64_t stale = test_stats(t).stale_uses;
  CHECK_STATUS(t, CGT_ERR_STALE_VALUE, cgt_value_ptr(t, v, &p, &n));
  CHECK_STATUS(t, CGT_ERR_STALE_VALUE, cgt_value_copy_out(t, v, host, sizeof host));
  CHECK_STATUS(t, CGT_ERR_STALE_VALUE, cgt_value_release(t, v));
  cgt_arg a = cgt_arg_value(v);
  cgt_value out = {0};
  CHECK_STATUS(t, CGT_ERR_STALE_VALUE, cgt_run(t, s, 0, &a, 1, &out, 1));
  assert_int_equal(out.bits, 0);
  assert_int_equal(test_stats(t).stale_uses, stale + 4);
  CHECK_TREE(t);
}

static void test_released_and_previous_step_values_are_stale_everywhere(void **state) {
  (void)state;
  for (int mode = CGT_MODE_TREE; mode <= CGT_MODE_SEPARATE; mode++) {
    cgt_tree *t = test_tree_new((cgt_mode)mode, NULL);
    test_affine u = {.a = 1, .b = 1, .n = N};
    cgt_segment s = test_register_affine(t, "s", &u);
    float *x = test_dev_floats(NULL, N);
    for (int step = 0; step < 4; step++) { /* warmup, record, replay, replay */
      CHECK_OK(t, cgt_step_begin(t));
      cgt_value a = test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
      cgt_value b = test_run1(t, s, 0, cgt_arg_value(a));
      CHECK_OK(t, cgt_value_release(t, a));
      expect_stale_everywhere(t, s, a);
      CHECK_OK(t, cgt_step_begin(t));
      expect_stale_everywhere(t, s, b);
    }
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(x);
    test_tree_free(t);
  }
}

/* ------------------------------------------------- static and dynamic args */

static void test_static_address_change_records_a_new_node_and_the_old_one_still_replays(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u = {.a = 3, .b = -1, .n = N};
  cgt_segment s = test_register_affine(t, "weights", &u);
  float h1[N], h2[N], e1[N], e2[N];
  for (int i = 0; i < N; i++)
    h1[i] = (float)i, h2[i] = (float)(100 - i);
  affine_host(h1, 3, -1, e1, N);
  affine_host(h2, 3, -1, e2, N);
  float *x1 = test_dev_floats(h1, N), *x2 = test_dev_floats(h2, N);
  for (int step = 0; step < 3; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    expect_floats(t, test_run1(t, s, 0, cgt_arg_static(x1, N * sizeof(float))), e1, N);
  }
  assert_int_equal(test_node_count(t), 1);
  assert_int_equal(node_info(t, 1).replays, 1);
  CHECK_OK(t, cgt_step_begin(t));
  expect_floats(t, test_run1(t, s, 0, cgt_arg_static(x2, N * sizeof(float))), e2, N);
  assert_int_equal(test_node_count(t), 2);
  assert_int_equal(node_info(t, 2).state, CGT_NODE_RECORDED); /* warm already: records at once */
  for (int step = 0; step < 4; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    float *x = step % 2 ? x2 : x1;
    expect_floats(t, test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float))), step % 2 ? e2 : e1, N);
  }
  assert_int_equal(node_info(t, 1).replays, 3);
  assert_int_equal(node_info(t, 2).replays, 2);
  assert_int_equal(test_stats(t).recordings, 2);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x1);
  test_dev_free(x2);
  test_tree_free(t);
}

static void test_dynamic_arguments_at_changing_addresses_replay_one_node(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u = {.a = 2, .b = 1, .n = N};
  cgt_segment s = test_register_affine(t, "dyn", &u);
  float *bufs[3];
  for (int i = 0; i < 3; i++)
    bufs[i] = test_dev_floats(NULL, N);
  for (int step = 0; step < 9; step++) {
    float h[N], e[N];
    for (int i = 0; i < N; i++)
      h[i] = (float)(step * 10 + i % 5);
    affine_host(h, 2, 1, e, N);
    float *x = bufs[step % 3];
    CHECK_OK(t, cgt_sync(t));
    test_dev_upload(x, h, N);
    CHECK_OK(t, cgt_step_begin(t));
    expect_floats(t, test_run1(t, s, 0, cgt_arg_dynamic(x, N * sizeof(float))), e, N);
  }
  cgt_stats st = test_stats(t);
  assert_int_equal(test_node_count(t), 1);
  assert_int_equal(st.recordings, 1);
  assert_int_equal(st.replays, 7);
  /* One copy into the placeholder at warmup, recording and every replay:
   * warmup allocates exactly as recording does. */
  assert_int_equal(st.input_copies, 9);
  assert_int_equal(st.input_copy_bytes, 9 * N * sizeof(float));
  CHECK_OK(t, cgt_sync(t));
  for (int i = 0; i < 3; i++)
    test_dev_free(bufs[i]);
  test_tree_free(t);
}

static void test_static_argument_that_moves_every_step_stops_growing_the_tree(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.rerecord_limit = 3;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  test_affine u = {.a = 2, .b = 1, .n = N}, u2 = {.a = 1, .b = -1, .n = N};
  cgt_segment s = test_register_affine(t, "moving", &u);
  cgt_segment s2 = test_register_affine(t, "after", &u2);
  enum { BUFS = 40 };
  float *bufs[BUFS];
  float h[N], e[N], e2[N];
  for (int i = 0; i < N; i++)
    h[i] = (float)(i % 11);
  affine_host(h, 2, 1, e, N);
  affine_host(e, 1, -1, e2, N);
  for (int i = 0; i < BUFS; i++)
    bufs[i] = test_dev_floats(h, N);
  /* A compiler marked a buffer that moves every step as STATIC. */
  for (int step = 0; step < BUFS; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value v = test_run1(t, s, 0, cgt_arg_static(bufs[step], N * sizeof(float)));
    expect_floats(t, test_run1(t, s2, 0, cgt_arg_value(v)), e2, N);
    expect_floats(t, v, e, N);
  }
  cgt_stats st = test_stats(t);
  /* Step 0 warms both up; steps 1-3 record "moving" at 3 addresses (the
   * limit) and "after" under each; step 4 makes the overflow node and records
   * "after" under it; every later step runs there and replays "after". */
  assert_int_equal(st.recordings, 3 + 3 + 1);
  size_t nodes = test_node_count(t);
  assert_int_equal(nodes, 2 + 6 + 2);
  assert_int_equal(st.replays, BUFS - 5);
  int overflow_nodes = 0;
  for (uint32_t id = 1; id <= nodes; id++) {
    cgt_node_info n = node_info(t, id);
    if (n.segment == s && n.state == CGT_NODE_EAGER)
      overflow_nodes++;
  }
  assert_int_equal(overflow_nodes, 1);
  CHECK_OK(t, cgt_sync(t));
  for (int i = 0; i < BUFS; i++)
    test_dev_free(bufs[i]);
  test_tree_free(t);
}

/* ------------------------------------------------------------- variants */

static cgt_status launch_variant_bias(cgt_launch *l, void *user) {
  test_affine *u = user;
  void *out;
  cgt_status st = cgt_launch_alloc(l, u->n * sizeof(float), &out);
  if (st == CGT_OK)
    st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), 1.0f, (float)cgt_launch_variant(l), out,
                                u->n);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, u->n * sizeof(float)) : st;
}

static void test_variants_make_distinct_nodes(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u = {.n = N};
  cgt_segment_desc d = {"bias", launch_variant_bias, &u, 1, 1, 0};
  cgt_segment s;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  float h[N];
  for (int i = 0; i < N; i++)
    h[i] = (float)i;
  float *x = test_dev_floats(h, N);
  for (int step = 0; step < 8; step++) {
    uint64_t variant = (uint64_t)(step % 2 ? 7 : 3);
    float e[N];
    affine_host(h, 1, (float)variant, e, N);
    CHECK_OK(t, cgt_step_begin(t));
    expect_floats(t, test_run1(t, s, variant, cgt_arg_static(x, N * sizeof(float))), e, N);
  }
  assert_int_equal(test_node_count(t), 2);
  cgt_node_info a = node_info(t, 1), b = node_info(t, 2);
  assert_true(a.variant != b.variant);
  assert_int_equal(a.state, CGT_NODE_RECORDED);
  assert_int_equal(b.state, CGT_NODE_RECORDED);
  assert_int_equal(a.replays + b.replays, 4);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

/* ------------------------------------------------------ capture failure */

/* check: the careless segment returns the illegal call's error, as careful
 * code does; the capture failure is recovered all the same. */
static void capture_failure_scenario(int illegal, int check) {
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine bad = {.a = 2, .b = 0, .n = N, .illegal = illegal, .check_illegal = check};
  test_affine good = {.a = 1, .b = 4, .n = N};
  cgt_segment sb = test_register_affine(t, "careless", &bad);
  cgt_segment sg = test_register_affine(t, "after", &good);
  float h[N], e1[N], e2[N];
  for (int i = 0; i < N; i++)
    h[i] = (float)(i % 9);
  affine_host(h, 2, 0, e1, N);
  affine_host(e1, 1, 4, e2, N);
  float *x = test_dev_floats(h, N);
  for (int step = 0; step < 5; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value v1 = test_run1(t, sb, 0, cgt_arg_static(x, N * sizeof(float)));
    cgt_value v2 = test_run1(t, sg, 0, cgt_arg_value(v1));
    expect_floats(t, v1, e1, N);
    expect_floats(t, v2, e2, N);
  }
  cgt_stats s = test_stats(t);
  assert_int_equal(s.capture_failures, 1);
  cgt_node_info n1 = node_info(t, 1);
  assert_int_equal(n1.state, CGT_NODE_EAGER);
  assert_non_null(n1.reason);
  assert_non_null(strstr(n1.reason, "capture"));
  /* The child recorded under the EAGER node. Its warmup sibling from the
   * first step stays behind, unused: the EAGER node's output moved to the
   * side pool, so it is now a DYNAMIC argument with another key. */
  int recorded_children = 0;
  for (uint32_t id = 2; id <= test_node_count(t); id++) {
    cgt_node_info n = node_info(t, id);
    assert_int_equal(n.parent, 1);
    if (n.state == CGT_NODE_RECORDED) {
      assert_int_equal(n.segment, sg);
      assert_int_equal(n.replays, 3);
      recorded_children++;
    }
  }
  assert_int_equal(recorded_children, 1);
  assert_int_equal(n1.eager_runs, 5); /* warmup, the failed recording's eager run, then eager for good */
  /* Called for warmup, for the capture, then eagerly in each of 4 steps. */
  assert_int_equal(bad.calls, 6);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

static void test_segment_that_syncs_while_captured_becomes_eager_and_children_record(void **state) {
  (void)state;
  capture_failure_scenario(1, 0);
}
static void test_segment_that_mallocs_while_captured_becomes_eager_and_children_record(void **state) {
  (void)state;
  capture_failure_scenario(2, 0);
}
static void test_segment_that_copies_synchronously_while_captured_becomes_eager(void **state) {
  (void)state;
  capture_failure_scenario(3, 0);
}
static void test_segment_that_syncs_the_device_while_captured_becomes_eager(void **state) {
  (void)state;
  capture_failure_scenario(4, 0);
}

static void test_segment_that_returns_the_error_of_its_illegal_call_becomes_eager_and_children_record(void **state) {
  (void)state;
  for (int illegal = 1; illegal <= 4; illegal++)
    capture_failure_scenario(illegal, 1);
}

/* After a capture failure, nothing is left behind for the next tree on the
 * same device: a healthy segment there warms up, records and replays. */
static void test_fresh_tree_after_a_failed_capture_records_and_replays(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine bad = {.a = 2, .b = 0, .n = N, .illegal = 1, .check_illegal = 1};
  cgt_segment sb = test_register_affine(t, "careful", &bad);
  float h[N], e[N];
  for (int i = 0; i < N; i++)
    h[i] = (float)(i % 5);
  affine_host(h, 2, 0, e, N);
  float *x = test_dev_floats(h, N);
  for (int step = 0; step < 2; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    expect_floats(t, test_run1(t, sb, 0, cgt_arg_static(x, N * sizeof(float))), e, N);
  }
  assert_int_equal(test_stats(t).capture_failures, 1);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);

  cgt_tree *fresh = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine good = {.a = 1, .b = 3, .n = N};
  cgt_segment sg = test_register_affine(fresh, "healthy", &good);
  affine_host(h, 1, 3, e, N);
  for (int step = 0; step < 4; step++) {
    CHECK_OK(fresh, cgt_step_begin(fresh));
    expect_floats(fresh, test_run1(fresh, sg, 0, cgt_arg_static(x, N * sizeof(float))), e, N);
  }
  cgt_stats s = test_stats(fresh);
  assert_int_equal(s.capture_failures, 0);
  assert_int_equal(s.recordings, 1);
  assert_int_equal(s.replays, 2);
  assert_int_equal(node_info(fresh, 1).state, CGT_NODE_RECORDED);
  CHECK_OK(fresh, cgt_sync(fresh));
  test_dev_free(x);
  test_tree_free(fresh);
}

/* ------------------------------------------------ declared uncapturable */

static void test_segment_declared_uncapturable_runs_eagerly_from_its_first_run(void **state) {
  (void)state;
  const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE};
  for (int m = 0; m < 2; m++)
    for (int illegal = 0; illegal <= 1; illegal++) {
      cgt_tree *t = test_tree_new(modes[m], NULL);
      /* With illegal = 1 it even synchronizes: never captured, it may. */
      test_affine un = {.a = 2, .b = 1, .n = N, .illegal = illegal, .check_illegal = 1};
      test_affine after = {.a = 1, .b = -1, .n = N};
      cgt_segment su = test_register_affine_flags(t, "uncapturable", &un, CGT_SEGMENT_NO_CAPTURE);
      cgt_segment sa = test_register_affine(t, "after", &after);
      float h[N], e1[N], e2[N];
      for (int i = 0; i < N; i++)
        h[i] = (float)(i % 7);
      affine_host(h, 2, 1, e1, N);
      affine_host(e1, 1, -1, e2, N);
      /* Two buffers, alternating as a moving STATIC argument would: the
       * segment still has one node under its parent. */
      float *x[2] = {test_dev_floats(h, N), test_dev_floats(h, N)};
      const int steps = 6;
      for (int step = 0; step < steps; step++) {
        CHECK_OK(t, cgt_step_begin(t));
        cgt_value v1 = test_run1(t, su, 0, cgt_arg_static(x[step % 2], N * sizeof(float)));
        cgt_value v2 = test_run1(t, sa, 0, cgt_arg_value(v1));
        expect_floats(t, v1, e1, N);
        expect_floats(t, v2, e2, N);
      }
      /* No capture attempt: one call per run, no recording, no failure. */
      assert_int_equal(un.calls, steps);
      cgt_stats s = test_stats(t);
      assert_int_equal(s.capture_failures, 0);
      assert_int_equal(s.recordings, 1); /* "after" only */
      cgt_node_info n1 = node_info(t, 1);
      assert_int_equal(n1.segment, su);
      assert_int_equal(n1.state, CGT_NODE_EAGER);
      assert_non_null(n1.reason);
      assert_string_equal(n1.reason, "declared uncapturable");
      assert_int_equal(n1.eager_runs, steps);
      size_t uncapturable_nodes = 0;
      for (uint32_t id = 1; id <= test_node_count(t); id++)
        uncapturable_nodes += node_info(t, id).segment == su;
      assert_int_equal(uncapturable_nodes, 1);
      CHECK_OK(t, cgt_sync(t));
      test_dev_free(x[0]);
      test_dev_free(x[1]);
      test_tree_free(t);
    }
}

/* docs/api.md, cgt_launch_input: a DYNAMIC argument is a placeholder in the
 * pool in warmups and recordings, and the caller's own memory in an eager
 * run (CGT_MODE_EAGER, a node that runs eagerly). So is a VALUE of the side
 * pool, which counts as DYNAMIC. */
static void test_a_dynamic_argument_is_a_placeholder_in_warmups_and_recordings_and_itself_in_eager_runs(void **state) {
  (void)state;
  float h[N], e[N];
  for (int i = 0; i < N; i++)
    h[i] = (float)i;
  affine_host(h, 2, 1, e, N);
  float *x = test_dev_floats(h, N);
  const cgt_arg dyn = cgt_arg_dynamic(x, N * sizeof(float));
  for (int m = 0; m < 2; m++) {
    cgt_tree *t = test_tree_new(m ? CGT_MODE_EAGER : CGT_MODE_TREE, NULL);
    test_affine u = {.a = 2, .b = 1, .n = N}, eager = {.a = 1, .b = 0, .n = N};
    cgt_segment s = test_register_affine(t, "dyn", &u);
    cgt_segment se = test_register_affine_flags(t, "eager", &eager, CGT_SEGMENT_NO_CAPTURE);
    for (int step = 0; step < 2; step++) { /* a warmup, then a recording (tree mode) */
      CHECK_OK(t, cgt_step_begin(t));
      expect_floats(t, test_run1(t, s, 0, dyn), e, N);
      if (m)
        assert_ptr_equal(u.input, x);
      else
        assert_ptr_not_equal(u.input, x);
      cgt_value v = test_run1(t, se, 0, dyn); /* an eager node (tree mode) or an eager run */
      assert_ptr_equal(eager.input, x);
      expect_floats(t, v, h, N);
      /* v lies in the side pool in tree mode: passed on, it counts as DYNAMIC */
      cgt_value w = test_run1(t, s, 1, cgt_arg_value(v));
      expect_floats(t, w, e, N);
      void *vp = NULL;
      size_t vb = 0;
      CHECK_OK(t, cgt_value_ptr(t, v, &vp, &vb));
      if (m)
        assert_ptr_equal(u.input, vp);
      else
        assert_ptr_not_equal(u.input, vp);
    }
    assert_int_equal(test_stats(t).recordings, m ? 0 : 2);
    CHECK_OK(t, cgt_sync(t));
    test_tree_free(t);
  }
  test_dev_free(x);
}

/* ---------------------------------------------------- zero means default */

static void zero_options_program(cgt_tree *t, float *x[3]) {
  test_affine u = {.a = 2, .b = 1, .n = N};
  cgt_segment s = test_register_affine(t, "aff", &u);
  float h[N], e[N];
  for (int i = 0; i < N; i++)
    h[i] = (float)(i % 3);
  affine_host(h, 2, 1, e, N);
  /* Three STATIC addresses under one parent: three recordings. */
  for (int step = 0; step < 6; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    expect_floats(t, test_run1(t, s, 0, cgt_arg_static(x[step % 3], N * sizeof(float))), e, N);
  }
}

static void count_warnings(void *user, int level, const char *msg) {
  (void)msg;
  if (level <= CGT_LOG_WARN)
    (*(int *)user)++;
}

static void test_all_zero_options_behave_like_the_defaults_except_warmup(void **state) {
  (void)state;
  float h[N];
  for (int i = 0; i < N; i++)
    h[i] = (float)(i % 3);
  float *x[3] = {test_dev_floats(h, N), test_dev_floats(h, N), test_dev_floats(h, N)};
  int warnings[2] = {0, 0};
  cgt_tree *trees[2];
  for (int k = 0; k < 2; k++) {
    cgt_options o;
    if (k == 0) {
      memset(&o, 0, sizeof o); /* what `= {0}` or a foreign binding gives */
    } else {
      cgt_options_init(&o);
      o.warmup_runs = 0;
    }
    o.log_fn = count_warnings;
    o.log_user = &warnings[k];
    trees[k] = test_tree_new(CGT_MODE_TREE, &o);
    zero_options_program(trees[k], x);
  }
  cgt_stats zero = test_stats(trees[0]), dflt = test_stats(trees[1]);
  /* rerecord_limit 0 means 32, not "record nothing". */
  assert_int_equal(zero.recordings, 3);
  assert_int_equal(zero.replays, 3);
  assert_int_equal(zero.eager_runs, 0);
  /* pool_chunk_bytes 0 means 2 MiB. */
  assert_int_equal(zero.pool_reserved_bytes, (size_t)2 << 20);
#define SAME(f) assert_int_equal(zero.f, dflt.f);
  CGT_STATS_FIELDS(SAME, SAME)
#undef SAME
  assert_int_equal(test_node_count(trees[0]), test_node_count(trees[1]));
  for (uint32_t id = 1; id <= test_node_count(trees[0]); id++) {
    assert_int_equal(node_info(trees[0], id).state, CGT_NODE_RECORDED);
    assert_int_equal(node_info(trees[1], id).state, CGT_NODE_RECORDED);
  }
  assert_int_equal(warnings[0], 0);
  assert_int_equal(warnings[1], 0);
  for (int k = 0; k < 2; k++) {
    CHECK_OK(trees[k], cgt_sync(trees[k]));
    test_tree_free(trees[k]);
  }
  for (int i = 0; i < 3; i++)
    test_dev_free(x[i]);
}

/* -------------------------------------------------------------- aliases */

static void test_outputs_that_alias_inputs_replay_with_the_right_data(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine uv = {.n = N}, ua = {.a = 2, .b = 0, .n = N};
  cgt_segment view = test_register_view(t, "view", &uv);
  cgt_segment dbl = test_register_affine(t, "double", &ua);
  float *d = test_dev_floats(NULL, N);
  float h[N], e[N];
  for (int step = 0; step < 6; step++) {
    for (int i = 0; i < N; i++)
      h[i] = (float)(step + i);
    affine_host(h, 2, 0, e, N);
    CHECK_OK(t, cgt_sync(t));
    test_dev_upload(d, h, N);
    CHECK_OK(t, cgt_step_begin(t));
    /* A view of a DYNAMIC input is a view of its placeholder once recorded. */
    cgt_value v = test_run1(t, view, 0, cgt_arg_dynamic(d, N * sizeof(float)));
    cgt_value w = test_run1(t, dbl, 0, cgt_arg_value(v));
    cgt_value w2 = test_run1(t, view, 0, cgt_arg_value(w)); /* a view of a pool value */
    CHECK_OK(t, cgt_value_release(t, w));
    expect_floats(t, v, h, N);
    expect_floats(t, w2, e, N);
  }
  assert_int_equal(test_stats(t).recordings, 3);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(d);
  test_tree_free(t);
}

/* --------------------------------------------------------------- options */

static void test_warmup_runs_zero_records_at_the_first_visit(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.warmup_runs = 0;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  test_affine u = {.a = 1, .b = 2, .n = N};
  cgt_segment s = test_register_affine(t, "s", &u);
  float *x = test_dev_floats(NULL, N);
  CHECK_OK(t, cgt_step_begin(t));
  test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
  assert_int_equal(test_stats(t).recordings, 1);
  assert_int_equal(test_stats(t).warmups, 0);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

static void test_cgt_mode_environment_variable_overrides_the_mode(void **state) {
  (void)state;
  setenv("CGT_MODE", "eager", 1);
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  unsetenv("CGT_MODE");
  assert_int_equal(cgt_tree_mode(t), CGT_MODE_EAGER);
  test_affine u = {.a = 1, .b = 2, .n = N};
  cgt_segment s = test_register_affine(t, "s", &u);
  float *x = test_dev_floats(NULL, N);
  for (int i = 0; i < 3; i++) {
    CHECK_OK(t, cgt_step_begin(t));
    test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
  }
  assert_int_equal(test_stats(t).recordings, 0);
  assert_int_equal(test_stats(t).eager_runs, 3);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

static void test_replay_steps_make_no_host_allocations(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  branchy b;
  branchy_init(t, &b);
  for (int step = 0; step < 6; step++)
    branchy_step(t, &b, step, NULL, NULL);
  uint64_t allocs = test_stats(t).host_allocs;
  for (int step = 6; step < 40; step++)
    branchy_step(t, &b, step, NULL, NULL);
  assert_int_equal(test_stats(t).host_allocs, allocs);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(b.x);
  test_tree_free(t);
}

static void test_write_dot_draws_every_node_and_edge(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  branchy b;
  branchy_init(t, &b);
  for (int step = 0; step < 4; step++)
    branchy_step(t, &b, step, NULL, NULL);
  FILE *f = tmpfile();
  assert_non_null(f);
  CHECK_OK(t, cgt_tree_write_dot(t, f));
  rewind(f);
  char line[512];
  int boxes = 0, edges = 0;
  while (fgets(line, sizeof line, f)) {
    boxes += strstr(line, "[label=") != NULL;
    edges += strstr(line, "->") != NULL;
  }
  fclose(f);
  assert_int_equal(boxes, 5);
  assert_int_equal(edges, 4);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(b.x);
  test_tree_free(t);
}

static void test_graph_dot_dir_receives_every_recorded_graph(void **state) {
  (void)state;
  char dir[] = "/tmp/cgt_dotXXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("CGT_GRAPH_DOT_DIR", dir, 1);
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  unsetenv("CGT_GRAPH_DOT_DIR");
  branchy b;
  branchy_init(t, &b);
  for (int step = 0; step < 4; step++)
    branchy_step(t, &b, step, NULL, NULL);
  const char *names[] = {"node1_one.dot", "node2_two.dot", "node3_four.dot", "node4_three.dot", "node5_four.dot"};
  for (size_t i = 0; i < 5; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    FILE *f = fopen(path, "r");
    if (!f)
      fail_msg("no %s", path);
    char head[64] = "";
    assert_non_null(fgets(head, sizeof head, f));
    assert_non_null(strstr(head, "digraph"));
    fclose(f);
    remove(path);
  }
  rmdir(dir);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(b.x);
  test_tree_free(t);
}

static void test_modes_give_identical_branchy_outputs(void **state) {
  (void)state;
  cgt_tree *trees[3];
  branchy b[3];
  for (int m = 0; m < 3; m++) {
    trees[m] = test_tree_new((cgt_mode)m, NULL);
    branchy_init(trees[m], &b[m]);
  }
  for (int step = 0; step < 10; step++) {
    float w[3];
    for (int m = 0; m < 3; m++)
      w[m] = branchy_step(trees[m], &b[m], step, NULL, NULL);
    assert_true(w[0] == w[1] && w[1] == w[2]);
  }
  cgt_stats separate = test_stats(trees[CGT_MODE_SEPARATE]), tree = test_stats(trees[CGT_MODE_TREE]);
  assert_true(separate.pool_reserved_bytes > tree.pool_reserved_bytes);
  for (int m = 0; m < 3; m++) {
    CHECK_OK(trees[m], cgt_sync(trees[m]));
    test_dev_free(b[m].x);
    test_tree_free(trees[m]);
  }
}

/* --------------------------------------------------- issue 9: robustness */

static const cgt_mode every_mode[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE, CGT_MODE_EAGER};

/* The corruption the pool-argument rule prevents: a view of a value, passed
 * on as a VALUE, keeps the value's block after the value is released, so a
 * later run's output never lands on it. The same memory passed as STATIC is
 * refused (here: an EAGER node's output, in the side pool), in every mode. */
static void test_a_view_of_a_released_value_keeps_its_memory_and_pool_memory_as_static_is_refused(void **state) {
  (void)state;
  for (int m = 0; m < 3; m++) {
    cgt_tree *t = test_tree_new(every_mode[m], NULL);
    test_affine ua = {.a = 2, .b = 1, .n = N}, uv = {.n = N}, ub = {.a = 1, .b = 100, .n = N},
                ue = {.a = 1, .b = 0, .n = N, .illegal = 1};
    cgt_segment sa = test_register_affine(t, "a", &ua), sv = test_register_view(t, "view", &uv);
    cgt_segment sb = test_register_affine(t, "b", &ub), se = test_register_affine(t, "syncs", &ue);
    float x[N], expect_view[N], expect_b[N];
    for (int i = 0; i < N; i++)
      x[i] = (float)(i % 5);
    float *buf = test_dev_floats(x, N);
    affine_host(x, 2, 1, expect_view, N);
    affine_host(x, 1, 100, expect_b, N);
    for (int step = 0; step < 5; step++) {
      if (step)
        CHECK_OK(t, cgt_step_begin(t));
      cgt_value v = test_run1(t, sa, 0, cgt_arg_static(buf, sizeof x));
      cgt_value view = test_run1(t, sv, 0, cgt_arg_value(v));
      CHECK_OK(t, cgt_value_release(t, v));
      CHECK_TREE(t);
      cgt_value b = test_run1(t, sb, 0, cgt_arg_static(buf, sizeof x));
      void *pv, *pb;
      size_t nv, nb;
      CHECK_OK(t, cgt_value_ptr(t, view, &pv, &nv));
      CHECK_OK(t, cgt_value_ptr(t, b, &pb, &nb));
      assert_false(ranges_overlap(pv, nv, pb, nb));
      expect_floats(t, view, expect_view, N);
      expect_floats(t, b, expect_b, N);
      /* An EAGER node's output lives in the side pool: still the tree's. */
      cgt_value e = test_run1(t, se, 0, cgt_arg_static(buf, sizeof x));
      void *pe;
      CHECK_OK(t, cgt_value_ptr(t, e, &pe, NULL));
      cgt_arg as_static = cgt_arg_static(pe, sizeof x), as_dynamic = cgt_arg_dynamic(pv, sizeof(float));
      cgt_value out = {7};
      uint64_t runs = test_stats(t).runs;
      CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, sb, 0, &as_static, 1, &out, 1));
      CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, sb, 0, &as_dynamic, 1, &out, 1));
      assert_int_equal(out.bits, 7);
      assert_int_equal(test_stats(t).runs, runs);
      CHECK_TREE(t);
    }
    if (every_mode[m] == CGT_MODE_TREE)
      assert_true(test_stats(t).replays > 0);
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(buf);
    test_tree_free(t);
  }
}

/* The liveness check looks only at what a node adds to its nearest recorded
 * ancestor's list, however long the path: a value released before node X's
 * recording, 300 runs back, and live when X's parent replays in a later
 * step, still makes X re-record instead of replaying over it. */
static void test_a_value_dead_at_recording_far_back_in_a_long_path_forces_a_rerecord_when_live(void **state) {
  (void)state;
  enum { LONG_CHAIN = 300 };
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u0 = {.a = 1, .b = 1, .n = N}, uc = {.a = 1, .b = 0, .n = N}, ux = {.a = -1, .b = 0, .n = N};
  cgt_segment s0 = test_register_affine(t, "first", &u0), sc = test_register_affine(t, "link", &uc);
  cgt_segment sx = test_register_affine(t, "x", &ux);
  float x[N], expect_first[N], expect_x[N];
  for (int i = 0; i < N; i++)
    x[i] = (float)i;
  float *buf = test_dev_floats(x, N);
  affine_host(x, 1, 1, expect_first, N);
  affine_host(expect_first, -1, 0, expect_x, N);
  /* Steps 0-2 release `first` early (X records with it dead), steps 3-5
   * keep it live to the end, then both again. */
  for (int step = 0; step < 9; step++) {
    if (step)
      CHECK_OK(t, cgt_step_begin(t));
    int keep = step >= 3 && step < 6;
    cgt_value first = test_run1(t, s0, 0, cgt_arg_static(buf, sizeof x));
    cgt_value prev = test_run1(t, sc, 0, cgt_arg_value(first));
    for (int i = 1; i < LONG_CHAIN; i++) {
      cgt_arg a = cgt_arg_value(prev);
      cgt_value next = {0};
      CHECK_OK(t, cgt_run(t, sc, 0, &a, 1, &next, 1));
      CHECK_OK(t, cgt_value_release(t, prev));
      prev = next;
      if (i == 10 && !keep)
        CHECK_OK(t, cgt_value_release(t, first));
    }
    cgt_value xv = test_run1(t, sx, 0, cgt_arg_value(prev));
    expect_floats(t, xv, expect_x, N);
    if (keep)
      expect_floats(t, first, expect_first, N);
  }
  cgt_stats s = test_stats(t);
  assert_true(s.rerecords >= 1);
  assert_true(s.replays > 5 * (LONG_CHAIN + 1));
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(buf);
  test_tree_free(t);
}

/* Node info by id, or NULL if no such node exists (any number of nodes). */
static int find_node(cgt_tree *t, uint32_t id, cgt_node_info *out) {
  size_t n = test_node_count(t);
  cgt_node_info *all = calloc(n + 1, sizeof *all);
  assert_non_null(all);
  CHECK_OK(t, cgt_tree_nodes(t, all, n, &n));
  int found = 0;
  for (size_t i = 0; i < n; i++) {
    if (i)
      assert_true(all[i].id > all[i - 1].id);
    if (all[i].id == id) {
      *out = all[i];
      found = 1;
    }
  }
  free(all);
  return found;
}

/* Warmups under a layout that never recurs (here a variant that is new
 * every step, so its run warms up and the rest of the step with it) leave
 * WARMUP nodes nobody visits again; past prune_after_steps they go, and the
 * tree's size stays bounded however long the program runs. The recorded
 * node every step starts with keeps its id and its counters. */
static void test_warmup_nodes_of_layouts_that_never_recur_are_pruned_and_the_rest_keep_their_ids(void **state) {
  (void)state;
  enum { PRUNE = 8, STEPS = 400 };
  for (int m = 0; m < 2; m++) {
    cgt_options o;
    cgt_options_init(&o);
    o.prune_after_steps = PRUNE;
    cgt_tree *t = test_tree_new(every_mode[m], &o);
    test_affine ur = {.a = 1, .b = 1, .n = N}, un = {.a = 2, .b = 0, .n = N}, uc = {.a = 1, .b = 2, .n = N};
    cgt_segment sr = test_register_affine(t, "root", &ur), sn = test_register_affine(t, "new_variant", &un);
    cgt_segment sc = test_register_affine(t, "after", &uc);
    float x[N];
    for (int i = 0; i < N; i++)
      x[i] = 1;
    float *buf = test_dev_floats(x, N);
    size_t most = 0;
    for (int step = 0; step < STEPS; step++) {
      if (step)
        CHECK_OK(t, cgt_step_begin(t));
      CHECK_TREE(t);
      cgt_value r = test_run1(t, sr, 0, cgt_arg_static(buf, sizeof x));
      cgt_value v = test_run1(t, sn, (uint64_t)step, cgt_arg_value(r));
      cgt_value c = test_run1(t, sc, 0, cgt_arg_value(v));
      assert_true(test_read_first(t, c) == 6.0f); /* (1 + 1) * 2 + 2; the variant only keys the node */
      size_t n = test_node_count(t);
      if (n > most)
        most = n;
    }
    cgt_stats s = test_stats(t);
    /* Two nodes a step are made; at most 1.5 * PRUNE steps' worth stay. */
    assert_true(s.nodes_pruned > 2 * (STEPS - 2 * PRUNE));
    assert_true(most <= 1 + 2 * (PRUNE + PRUNE / 2 + 1));
    assert_int_equal(test_node_count(t), s.nodes);
    cgt_node_info root;
    assert_true(find_node(t, 1, &root));
    assert_int_equal(root.segment, sr);
    assert_true(root.state == CGT_NODE_RECORDED);
    assert_true(root.replays >= STEPS - 2);
    cgt_node_info gone;
    assert_false(find_node(t, 2, &gone)); /* the first step's warmup */
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(buf);
    test_tree_free(t);
  }
}

/* A node that turns EAGER moves its outputs out of the graph pool, so the
 * WARMUP children it had under its warmup layout never match again: they
 * are pruned, the children made under the EAGER node stay. */
static void test_a_warmup_child_orphaned_by_its_parent_turning_eager_is_pruned(void **state) {
  (void)state;
  enum { PRUNE = 6 };
  cgt_options o;
  cgt_options_init(&o);
  o.prune_after_steps = PRUNE;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  test_affine ue = {.a = 1, .b = 1, .n = N, .illegal = 1}, uc = {.a = 3, .b = 0, .n = N};
  cgt_segment se = test_register_affine(t, "syncs", &ue), sc = test_register_affine(t, "child", &uc);
  float x[N];
  for (int i = 0; i < N; i++)
    x[i] = 2;
  float *buf = test_dev_floats(x, N);
  uint32_t orphan = 0;
  for (int step = 0; step < 4 * PRUNE; step++) {
    if (step)
      CHECK_OK(t, cgt_step_begin(t));
    cgt_value e = test_run1(t, se, 0, cgt_arg_static(buf, sizeof x));
    cgt_value c = test_run1(t, sc, 0, cgt_arg_value(e));
    assert_true(test_read_first(t, c) == 9.0f);
    if (step == 0) {
      orphan = node_info(t, 2).id;
      assert_true(node_info(t, 2).state == CGT_NODE_WARMUP);
    }
  }
  cgt_node_info info;
  assert_true(find_node(t, 1, &info));
  assert_true(info.state == CGT_NODE_EAGER);
  assert_false(find_node(t, orphan, &info));
  assert_true(test_stats(t).nodes_pruned == 1);
  assert_int_equal(test_node_count(t), 2);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(buf);
  test_tree_free(t);
}

/* ------------------------------------------------------------ path hash */

static uint64_t path_hash(cgt_tree *t) {
  uint64_t h = 0;
  CHECK_OK(t, cgt_tree_path_hash(t, &h));
  return h;
}

/* What data-parallel ranks rely on: trees that took the same path agree,
 * whatever their mode, and the two branches of branchy disagree. */
static void test_path_hash_is_equal_on_equal_paths_in_every_mode_and_differs_across_branches(void **state) {
  (void)state;
  cgt_tree *trees[3];
  branchy b[3];
  for (int m = 0; m < 3; m++) {
    trees[m] = test_tree_new((cgt_mode)m, NULL);
    branchy_init(trees[m], &b[m]);
  }
  uint64_t empty = path_hash(trees[0]);
  for (int m = 1; m < 3; m++)
    assert_true(path_hash(trees[m]) == empty);
  uint64_t branch_hash[2] = {0, 0};
  for (int step = 0; step < 6; step++) {
    uint64_t h[3];
    for (int m = 0; m < 3; m++) {
      branchy_step(trees[m], &b[m], step, NULL, NULL);
      h[m] = path_hash(trees[m]);
    }
    assert_true(h[0] == h[1] && h[1] == h[2]);
    assert_true(h[0] != empty);
    /* Warmup, recording and replay of one path hash alike. */
    if (branch_hash[step % 2] == 0)
      branch_hash[step % 2] = h[0];
    assert_true(branch_hash[step % 2] == h[0]);
  }
  assert_true(branch_hash[0] != branch_hash[1]);
  for (int m = 0; m < 3; m++) {
    CHECK_OK(trees[m], cgt_step_begin(trees[m]));
    assert_true(path_hash(trees[m]) == empty);
    CHECK_OK(trees[m], cgt_sync(trees[m]));
    test_dev_free(b[m].x);
    test_tree_free(trees[m]);
  }
}

static void test_path_hash_follows_every_successful_run_of_the_step_and_nothing_else(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine ua = {.a = 2, .b = 1, .n = N}, ub = {.a = 3, .b = 0, .n = N};
  cgt_segment sa = test_register_affine(t, "a", &ua);
  cgt_segment sb = test_register_affine(t, "b", &ub);
  float *x = test_dev_floats(NULL, N);
  cgt_arg ax = cgt_arg_static(x, N * sizeof(float));

  uint64_t empty = path_hash(t);
  test_run1(t, sa, 0, ax);
  uint64_t a = path_hash(t);
  test_run1(t, sb, 0, ax);
  uint64_t ab = path_hash(t);
  assert_true(a != empty && ab != a && ab != empty);

  CHECK_OK(t, cgt_step_begin(t));
  assert_true(path_hash(t) == empty);
  test_run1(t, sb, 0, ax);
  uint64_t b = path_hash(t);
  test_run1(t, sa, 0, ax);
  assert_true(b != a);               /* which segment */
  assert_true(path_hash(t) != ab);   /* the order of the runs */

  CHECK_OK(t, cgt_step_begin(t));
  test_run1(t, sa, 7, ax);
  assert_true(path_hash(t) != a);    /* the variant */

  /* A run that fails changes nothing, the hash included. */
  CHECK_OK(t, cgt_step_begin(t));
  test_run1(t, sa, 0, ax);
  cgt_value out = {0};
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, sb, 0, NULL, 0, &out, 1));
  assert_true(path_hash(t) == a);
  test_run1(t, sb, 0, ax);
  assert_true(path_hash(t) == ab);   /* recorded now, warmed up then: the same path, the same hash */

  uint64_t h = 42;
  assert_int_equal(cgt_tree_path_hash(NULL, &h), CGT_ERR_INVALID_ARGUMENT);
  assert_true(h == 42);
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_tree_path_hash(t, NULL));
  assert_non_null(strstr(cgt_tree_last_error(t), "cgt_tree_path_hash"));
  assert_true(path_hash(t) == ab);

  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

const struct CMUnitTest scenario_tests[] = {
    cmocka_unit_test(test_alternating_branches_record_five_nodes_then_only_replay),
    cmocka_unit_test(test_second_branch_records_after_checkpoint_restore),
    cmocka_unit_test(test_tree_pool_peak_equals_eager_peak_when_values_die_early),
    cmocka_unit_test(test_node_recorded_while_a_value_was_dead_rerecords_when_it_is_live),
    cmocka_unit_test(test_liveness_mismatch_past_rerecord_limit_runs_eagerly),
    cmocka_unit_test(test_releasing_a_value_outside_the_graph_pool_needs_no_rerecord),
    cmocka_unit_test(test_released_and_previous_step_values_are_stale_everywhere),
    cmocka_unit_test(test_static_address_change_records_a_new_node_and_the_old_one_still_replays),
    cmocka_unit_test(test_dynamic_arguments_at_changing_addresses_replay_one_node),
    cmocka_unit_test(test_static_argument_that_moves_every_step_stops_growing_the_tree),
    cmocka_unit_test(test_variants_make_distinct_nodes),
    cmocka_unit_test(test_segment_that_syncs_while_captured_becomes_eager_and_children_record),
    cmocka_unit_test(test_segment_that_mallocs_while_captured_becomes_eager_and_children_record),
    cmocka_unit_test(test_segment_that_copies_synchronously_while_captured_becomes_eager),
    cmocka_unit_test(test_segment_that_syncs_the_device_while_captured_becomes_eager),
    cmocka_unit_test(test_segment_that_returns_the_error_of_its_illegal_call_becomes_eager_and_children_record),
    cmocka_unit_test(test_fresh_tree_after_a_failed_capture_records_and_replays),
    cmocka_unit_test(test_segment_declared_uncapturable_runs_eagerly_from_its_first_run),
    cmocka_unit_test(test_a_dynamic_argument_is_a_placeholder_in_warmups_and_recordings_and_itself_in_eager_runs),
    cmocka_unit_test(test_all_zero_options_behave_like_the_defaults_except_warmup),
    cmocka_unit_test(test_outputs_that_alias_inputs_replay_with_the_right_data),
    cmocka_unit_test(test_warmup_runs_zero_records_at_the_first_visit),
    cmocka_unit_test(test_cgt_mode_environment_variable_overrides_the_mode),
    cmocka_unit_test(test_replay_steps_make_no_host_allocations),
    cmocka_unit_test(test_write_dot_draws_every_node_and_edge),
    cmocka_unit_test(test_graph_dot_dir_receives_every_recorded_graph),
    cmocka_unit_test(test_modes_give_identical_branchy_outputs),
    cmocka_unit_test(test_a_view_of_a_released_value_keeps_its_memory_and_pool_memory_as_static_is_refused),
    cmocka_unit_test(test_a_value_dead_at_recording_far_back_in_a_long_path_forces_a_rerecord_when_live),
    cmocka_unit_test(test_warmup_nodes_of_layouts_that_never_recur_are_pruned_and_the_rest_keep_their_ids),
    cmocka_unit_test(test_a_warmup_child_orphaned_by_its_parent_turning_eager_is_pruned),
    cmocka_unit_test(test_path_hash_is_equal_on_equal_paths_in_every_mode_and_differs_across_branches),
    cmocka_unit_test(test_path_hash_follows_every_successful_run_of_the_step_and_nothing_else),
};
const size_t scenario_test_count = sizeof scenario_tests / sizeof scenario_tests[0];
