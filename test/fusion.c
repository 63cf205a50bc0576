/* fusion.c — deferred launch (defer_launch = 1, path fusion), scenario by
 * scenario, on every backend.
 *
 * What API.md promises: replays may be held back and launched later,
 * several recorded nodes in one graph launch; every call that lets the host
 * see device memory, and every run that is not a replay, launches what was
 * held back first; results are bit for bit those of immediate launch, with
 * the same recordings and the same pool memory. What the design adds: a
 * span is fused once it has recurred (its second flush), the fused
 * executables are capped and the least recently used goes first, and the
 * node list and dot output show the fused spans.
 *
 * The proof that something was held back is stats.fused_launches: it moves
 * only when a fused span is launched, which happens at a flush, so a
 * counter that stands still after the runs and moves after a call shows
 * that the call flushed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_lists.h"

#define N 64
#define CHAIN 4

static cgt_value run1(cgt_tree *t, cgt_segment s, cgt_arg a) {
  cgt_value out = {0};
  CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &out, 1));
  CHECK_TREE(t);
  return out;
}

static void expect_floats(cgt_tree *t, cgt_value v, const float *expected, size_t n) {
  float got[N];
  test_read_value(t, v, got, n);
  for (size_t i = 0; i < n; i++)
    if (got[i] != expected[i])
      fail_msg("element %zu: got %g, expected %g", i, (double)got[i], (double)expected[i]);
}

static cgt_tree *defer_tree(cgt_mode mode, uint32_t defer) {
  cgt_options o;
  cgt_options_init(&o);
  o.defer_launch = defer;
  return test_tree_new(mode, &o);
}

/* ------------------------------------ a chain of four, DYNAMIC step input */

typedef struct chain {
  test_affine u[CHAIN];
  cgt_segment s[CHAIN];
  float *x[2]; /* the step input, at an address that alternates */
  cgt_value v[CHAIN];
} chain;

static void chain_init(cgt_tree *t, chain *c) {
  memset(c, 0, sizeof *c);
  static const float a[CHAIN] = {2, -1, 3, 1}, b[CHAIN] = {1, 4, 0, -2};
  for (int i = 0; i < CHAIN; i++) {
    char name[16];
    snprintf(name, sizeof name, "chain%d", i + 1);
    c->u[i] = (test_affine){.a = a[i], .b = b[i], .n = N};
    c->s[i] = test_register_affine(t, name, &c->u[i]);
  }
  c->x[0] = test_dev_floats(NULL, N);
  c->x[1] = test_dev_floats(NULL, N);
}

static void chain_free(chain *c) {
  test_dev_free(c->x[0]);
  test_dev_free(c->x[1]);
}

/* Step `step` up to its last run: nothing is read back, so with deferral
 * every replay of it is still held back. expect receives the host's result. */
static void chain_runs(cgt_tree *t, chain *c, int step, float *expect) {
  float x[N];
  for (int i = 0; i < N; i++)
    x[i] = (float)((i + step) % 7) - 3.0f;
  CHECK_OK(t, cgt_step_begin(t));
  float *buf = c->x[step & 1];
  test_dev_upload(buf, x, N); /* nothing is held back: cgt_step_begin flushed */
  c->v[0] = run1(t, c->s[0], cgt_arg_dynamic(buf, N * sizeof(float)));
  for (int i = 1; i < CHAIN; i++)
    c->v[i] = run1(t, c->s[i], cgt_arg_value(c->v[i - 1]));
  for (int i = 0; i < N; i++) {
    float y = x[i];
    for (int k = 0; k < CHAIN; k++)
      y = c->u[k].a * y + c->u[k].b;
    expect[i] = y;
  }
}

static void chain_step(cgt_tree *t, chain *c, int step) {
  float expect[N];
  chain_runs(t, c, step, expect);
  expect_floats(t, c->v[CHAIN - 1], expect, N);
}

static void chain_mode_fuses_after_the_second_flush(cgt_mode mode) {
  cgt_tree *d = defer_tree(mode, 1), *r = defer_tree(mode, 0);
  chain cd, cr;
  chain_init(d, &cd);
  chain_init(r, &cr);
  for (int step = 0; step < 8; step++) {
    float expect[N];
    chain_runs(d, &cd, step, expect);
    chain_step(r, &cr, step);
    cgt_stats before = test_stats(d);
    expect_floats(d, cd.v[CHAIN - 1], expect, N);
    for (int i = 0; i < CHAIN - 1; i++) { /* every value of the path, not just the last */
      float got[N], want[N];
      test_read_value(d, cd.v[i], got, N);
      test_read_value(r, cr.v[i], want, N);
      assert_memory_equal(got, want, sizeof got);
    }
    cgt_stats after = test_stats(d);
    /* Step 0 warms up, step 1 records (nothing is held back), step 2 is the
     * span's first flush (node by node), from step 3 on it is one launch. */
    uint64_t fused = step >= 3 ? (uint64_t)step - 2 : 0;
    assert_int_equal(after.fused_launches, fused);
    assert_int_equal(after.fused_runs, CHAIN * fused);
    assert_int_equal(after.fused_launches - before.fused_launches, step >= 3);
    assert_int_equal(before.fused_launches, step >= 3 ? fused - 1 : 0);
  }
  cgt_stats sd = test_stats(d), sr = test_stats(r);
  assert_int_equal(sd.recordings, sr.recordings);
  assert_int_equal(sd.replays, sr.replays);
  assert_int_equal(sd.nodes, sr.nodes);
  assert_int_equal(sd.input_copies, sr.input_copies);
  assert_int_equal(sd.pool_peak_bytes, sr.pool_peak_bytes);
  assert_int_equal(sd.pool_reserved_bytes, sr.pool_reserved_bytes);
  assert_int_equal(sr.fused_launches, 0);
  assert_int_equal(sr.fused_runs, 0);
  cgt_node_info info[CHAIN];
  size_t n = 0;
  CHECK_OK(d, cgt_tree_nodes(d, info, CHAIN, &n));
  assert_int_equal(n, CHAIN);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(info[i].fused_runs, 5);
    assert_int_equal(info[i].replays, 6);
  }
  chain_free(&cd);
  chain_free(&cr);
  test_tree_free(d);
  test_tree_free(r);
}

/* options.time_launches: replays' graph launch calls, plain and fused, are
 * timed into stats.launch_host_ns; warmups and recordings are not, and a
 * tree that did not ask counts nothing. */
static void test_time_launches_counts_the_host_time_of_replay_launches_only(void **state) {
  (void)state;
  cgt_tree *trees[3];
  chain c[3];
  for (int k = 0; k < 3; k++) {
    cgt_options o;
    cgt_options_init(&o);
    o.defer_launch = k == 1;  /* plain, fused, plain and untimed */
    o.time_launches = k != 2;
    trees[k] = test_tree_new(CGT_MODE_TREE, &o);
    chain_init(trees[k], &c[k]);
  }
  for (int step = 0; step < 6; step++)
    for (int k = 0; k < 3; k++) {
      chain_step(trees[k], &c[k], step);
      cgt_stats s = test_stats(trees[k]);
      if (k == 2 || step < 2) /* untimed, or only warmups and recordings so far */
        assert_int_equal(s.launch_host_ns, 0);
      else
        assert_true(s.launch_host_ns > 0);
      if (k == 1 && step >= 3)
        assert_true(s.fused_launches > 0);
    }
  for (int k = 0; k < 3; k++) {
    chain_free(&c[k]);
    cgt_tree_destroy(trees[k]);
  }
}

static void test_a_recurring_span_is_fused_into_one_launch_from_its_second_flush(void **state) {
  (void)state;
  chain_mode_fuses_after_the_second_flush(CGT_MODE_TREE);
}

static void test_separate_mode_fuses_recurring_spans_too(void **state) {
  (void)state;
  chain_mode_fuses_after_the_second_flush(CGT_MODE_SEPARATE);
}

/* ------------------------------------------------------- flush points */

enum flush_kind { BY_FLUSH, BY_SYNC, BY_COPY_OUT, BY_VALUE_PTR, BY_STEP_BEGIN, BY_WARMUP_RUN, BY_RECORD_RUN };
static const char *const flush_names[] = {"cgt_flush",     "cgt_sync",       "cgt_value_copy_out", "cgt_value_ptr",
                                          "cgt_step_begin", "a warmup run", "a recording run"};

static void test_every_host_visible_call_and_every_other_run_flushes_first(void **state) {
  (void)state;
  cgt_tree *t = defer_tree(CGT_MODE_TREE, 1);
  chain c;
  chain_init(t, &c);
  test_affine tail_u = {.a = 1, .b = 1, .n = N};
  cgt_segment tail = test_register_affine(t, "tail", &tail_u);
  int step = 0;
  for (; step < 4; step++)
    chain_step(t, &c, step);
  for (int k = BY_FLUSH; k <= BY_RECORD_RUN; k++, step++) {
    float expect[N];
    chain_runs(t, &c, step, expect);
    uint64_t held = test_stats(t).fused_launches;
    /* Releasing a value lets the host see nothing: it flushes nothing. */
    CHECK_OK(t, cgt_value_release(t, c.v[0]));
    assert_int_equal(test_stats(t).fused_launches, held);
    float got[N];
    void *ptr = NULL;
    size_t bytes = 0;
    switch (k) {
    case BY_FLUSH:
      CHECK_OK(t, cgt_flush(t));
      break;
    case BY_SYNC:
      CHECK_OK(t, cgt_sync(t));
      break;
    case BY_COPY_OUT:
      CHECK_OK(t, cgt_value_copy_out(t, c.v[CHAIN - 1], got, sizeof got));
      break;
    case BY_VALUE_PTR:
      CHECK_OK(t, cgt_value_ptr(t, c.v[CHAIN - 1], &ptr, &bytes));
      assert_int_equal(bytes, sizeof got);
      break;
    case BY_STEP_BEGIN:
      CHECK_OK(t, cgt_step_begin(t));
      break;
    case BY_WARMUP_RUN:
    case BY_RECORD_RUN: /* the tail's first run warms up, its second records */
      (void)run1(t, tail, cgt_arg_value(c.v[CHAIN - 1]));
      break;
    }
    if (test_stats(t).fused_launches != held + 1)
      fail_msg("%s did not launch the held-back span", flush_names[k]);
    if (k == BY_VALUE_PTR && test_backend == CGT_BACKEND_SIM) /* simulated device memory is host memory */
      assert_memory_equal(ptr, expect, sizeof expect);
    if (k != BY_STEP_BEGIN)
      expect_floats(t, c.v[CHAIN - 1], expect, N);
  }
  cgt_stats s = test_stats(t);
  assert_int_equal(s.warmups, CHAIN + 1);
  assert_int_equal(s.recordings, CHAIN + 1);
  CHECK_OK(t, cgt_flush(t)); /* nothing held: fine */
  chain_free(&c);
  test_tree_free(t);
}

/* A launch function may not flush: its own run is not a replay, so nothing
 * is held back while it runs, and flushing there would be a launch inside a
 * capture. */
static cgt_status flush_inside_launch = CGT_OK;

static cgt_status launch_that_flushes(cgt_launch *l, void *user) {
  flush_inside_launch = cgt_flush(user);
  void *out;
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), &out);
  if (st == CGT_OK)
    st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), 1.0f, 0.0f, out, N);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, N * sizeof(float)) : st;
}

static void test_cgt_flush_refuses_a_null_tree_and_a_launch_function(void **state) {
  (void)state;
  assert_int_equal(cgt_flush(NULL), CGT_ERR_INVALID_ARGUMENT);
  cgt_tree *t = defer_tree(CGT_MODE_TREE, 1);
  cgt_segment_desc d = {"flusher", launch_that_flushes, t, 1, 1, 0};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  float *x = test_dev_floats(NULL, N);
  for (int step = 0; step < 3; step++) {
    flush_inside_launch = CGT_OK;
    CHECK_OK(t, cgt_step_begin(t));
    (void)run1(t, s, cgt_arg_static(x, N * sizeof(float)));
    /* Steps 0 and 1 call the launch function (warmup, recording). */
    assert_int_equal(flush_inside_launch, step < 2 ? CGT_ERR_STATE : CGT_OK);
  }
  CHECK_OK(t, cgt_flush(t));
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

/* --------------------------------------------------- STATIC buffers */

typedef struct static_pair {
  test_affine u1, u2;
  cgt_segment s1, s2;
  float *w; /* STATIC: caller memory at a fixed address */
  cgt_value v2;
} static_pair;

static void static_pair_init(cgt_tree *t, static_pair *p) {
  memset(p, 0, sizeof *p);
  p->u1 = (test_affine){.a = 2, .b = 0, .n = N};
  p->u2 = (test_affine){.a = 1, .b = 3, .n = N};
  p->s1 = test_register_affine(t, "reads-static", &p->u1);
  p->s2 = test_register_affine(t, "after", &p->u2);
  p->w = test_dev_floats(NULL, N);
}

static void fill(float *h, float base) {
  for (int i = 0; i < N; i++)
    h[i] = base + (float)(i % 5);
}

/* Runs both segments; the caller reads (or not). */
static void static_pair_runs(cgt_tree *t, static_pair *p) {
  CHECK_OK(t, cgt_step_begin(t));
  cgt_value v1 = run1(t, p->s1, cgt_arg_static(p->w, N * sizeof(float)));
  p->v2 = run1(t, p->s2, cgt_arg_value(v1));
}

static void static_pair_expect(const float *w, float *out) {
  for (int i = 0; i < N; i++)
    out[i] = 2.0f * w[i] + 3.0f;
}

static void warm_static_pair(cgt_tree *t, static_pair *p) {
  float w[N], expect[N];
  for (int step = 0; step < 4; step++) {
    fill(w, (float)step);
    CHECK_OK(t, cgt_sync(t));
    test_dev_upload(p->w, w, N);
    static_pair_runs(t, p);
    static_pair_expect(w, expect);
    expect_floats(t, p->v2, expect, N);
  }
  assert_int_equal(test_stats(t).fused_launches, 1);
}

/* API.md: held-back work is enqueued no later than cgt_flush; after it, the
 * buffer is the caller's again, and a write ordered after the flush does
 * not reach the flushed replays. */
static void test_a_static_buffer_written_after_cgt_flush_does_not_change_the_flushed_replays(void **state) {
  (void)state;
  cgt_tree *t = defer_tree(CGT_MODE_TREE, 1);
  static_pair p;
  static_pair_init(t, &p);
  warm_static_pair(t, &p);
  float a[N], b[N], expect[N];
  fill(a, 10.0f);
  fill(b, -20.0f);
  CHECK_OK(t, cgt_sync(t));
  test_dev_upload(p.w, a, N);
  static_pair_runs(t, &p);
  CHECK_OK(t, cgt_flush(t));
  assert_int_equal(test_stats(t).fused_launches, 2);
  test_dev_upload(p.w, b, N); /* the host writes the STATIC buffer after the flush */
  static_pair_expect(a, expect);
  expect_floats(t, p.v2, expect, N);
  test_dev_free(p.w);
  test_tree_free(t);
}

/* The other side of the same rule, on the simulator, where the order is
 * exact: before the flush the replays have not run, so a write the caller
 * must not make (API.md: "until then the caller must not ... write ...
 * STATIC arguments") is what they read. This is why the rule exists. */
static void test_a_static_buffer_written_before_the_flush_is_what_held_back_replays_read(void **state) {
  (void)state;
  if (test_backend != CGT_BACKEND_SIM)
    skip(); /* on a GPU the outcome of the forbidden write is a race */
  cgt_tree *t = defer_tree(CGT_MODE_TREE, 1);
  static_pair p;
  static_pair_init(t, &p);
  warm_static_pair(t, &p);
  float a[N], b[N], expect[N];
  fill(a, 10.0f);
  fill(b, -20.0f);
  CHECK_OK(t, cgt_sync(t));
  test_dev_upload(p.w, a, N);
  static_pair_runs(t, &p);
  test_dev_upload(p.w, b, N); /* forbidden: the runs are held back */
  static_pair_expect(b, expect);
  expect_floats(t, p.v2, expect, N);
  test_dev_free(p.w);
  test_tree_free(t);
}

/* -------------------------------------------------------- the cache */

/* Two spans from one root: 1 -> (2 | 3) -> 4, the branch chosen by the
 * host without reading the device, so each whole path is one span. */
typedef struct two_paths {
  test_affine u1, u2, u3, u4;
  cgt_segment s1, s2, s3, s4;
  float *x;
} two_paths;

static void two_paths_init(cgt_tree *t, two_paths *p) {
  memset(p, 0, sizeof *p);
  p->u1 = (test_affine){.a = 2, .b = 1, .n = N};
  p->u2 = (test_affine){.a = 3, .b = 0, .n = N};
  p->u3 = (test_affine){.a = -1, .b = 5, .n = N};
  p->u4 = (test_affine){.a = 1, .b = 1, .n = N};
  p->s1 = test_register_affine(t, "one", &p->u1);
  p->s2 = test_register_affine(t, "two", &p->u2);
  p->s3 = test_register_affine(t, "three", &p->u3);
  p->s4 = test_register_affine(t, "four", &p->u4);
  float x[N];
  for (int i = 0; i < N; i++)
    x[i] = (float)(i % 9) - 4.0f;
  p->x = test_dev_floats(x, N);
}

static void two_paths_step(cgt_tree *t, two_paths *p, int which) {
  CHECK_OK(t, cgt_step_begin(t));
  cgt_value v = run1(t, p->s1, cgt_arg_static(p->x, N * sizeof(float)));
  v = run1(t, which ? p->s3 : p->s2, cgt_arg_value(v));
  v = run1(t, p->s4, cgt_arg_value(v));
  float x[N], expect[N];
  for (int i = 0; i < N; i++) {
    x[i] = (float)(i % 9) - 4.0f;
    float y = 2 * x[i] + 1;
    y = which ? -y + 5 : 3 * y;
    expect[i] = y + 1;
  }
  expect_floats(t, v, expect, N);
}

static int count_fused_spans_in_dot(cgt_tree *t) {
  char buf[1 << 14];
  test_dot_text(t, buf, sizeof buf);
  int n = 0;
  for (const char *s = buf; (s = strstr(s, "fused span")); s++)
    n++;
  return n;
}

static void test_fused_executables_over_the_cap_evict_the_least_recently_used(void **state) {
  (void)state;
  setenv("CGT_FUSE_CACHE", "1", 1);
  cgt_tree *capped = defer_tree(CGT_MODE_TREE, 1);
  unsetenv("CGT_FUSE_CACHE");
  cgt_tree *roomy = defer_tree(CGT_MODE_TREE, 1);
  two_paths pc, pr;
  two_paths_init(capped, &pc);
  two_paths_init(roomy, &pr);
  for (int step = 0; step < 12; step++) {
    two_paths_step(capped, &pc, step & 1);
    two_paths_step(roomy, &pr, step & 1);
  }
  /* Steps 0-3 warm up and record both paths; each path's first replay
   * (steps 4, 5) goes node by node; from step 6 on every step is fused, the
   * capped tree rebuilding the span that the other path just evicted. */
  assert_int_equal(test_stats(roomy).fused_launches, 6);
  assert_int_equal(test_stats(capped).fused_launches, 6);
  assert_int_equal(count_fused_spans_in_dot(roomy), 2);
  assert_int_equal(count_fused_spans_in_dot(capped), 1);
  assert_int_equal(test_stats(capped).recordings, test_stats(roomy).recordings);
  test_dev_free(pc.x);
  test_dev_free(pr.x);
  test_tree_free(capped);
  test_tree_free(roomy);
}

/* A span flushed once is launched node by node (step 2 holds the whole
 * path back, and no later step does), and so is every single held-back
 * replay (later steps read each value as soon as it is made). */
static void test_a_span_seen_once_and_single_replays_launch_node_by_node(void **state) {
  (void)state;
  cgt_tree *t = defer_tree(CGT_MODE_TREE, 1);
  chain c;
  chain_init(t, &c);
  for (int step = 0; step < 3; step++)
    chain_step(t, &c, step);
  for (int step = 3; step < 7; step++) {
    float x[N], expect[N];
    for (int i = 0; i < N; i++)
      expect[i] = x[i] = (float)((i + step) % 7) - 3.0f;
    CHECK_OK(t, cgt_step_begin(t));
    test_dev_upload(c.x[step & 1], x, N);
    cgt_arg a = cgt_arg_dynamic(c.x[step & 1], N * sizeof(float));
    for (int k = 0; k < CHAIN; k++) {
      c.v[k] = run1(t, c.s[k], a);
      for (int i = 0; i < N; i++)
        expect[i] = c.u[k].a * expect[i] + c.u[k].b;
      expect_floats(t, c.v[k], expect, N);
      a = cgt_arg_value(c.v[k]);
    }
  }
  cgt_stats s = test_stats(t);
  assert_int_equal(s.replays, 5 * CHAIN);
  assert_int_equal(s.fused_launches, 0);
  assert_int_equal(count_fused_spans_in_dot(t), 0);
  chain_free(&c);
  test_tree_free(t);
}

/* A segment that works in place on its STATIC input and hands it out as
 * its output: its effect outlives the tree. */
static cgt_status launch_in_place(cgt_launch *l, void *user) {
  (void)user;
  float *x = cgt_launch_input(l, 0);
  cgt_status st = test_kernels()->affine(cgt_launch_stream(l), x, 2.0f, 1.0f, x, N);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, x, N * sizeof(float)) : st;
}

/* API.md: held-back work is enqueued no later than cgt_tree_destroy. */
static void test_cgt_tree_destroy_launches_held_back_replays(void **state) {
  (void)state;
  cgt_tree *t = defer_tree(CGT_MODE_TREE, 1);
  cgt_segment_desc d = {"in-place", launch_in_place, NULL, 1, 1, 0};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  float x[N], expect[N], got[N];
  for (int i = 0; i < N; i++)
    expect[i] = x[i] = (float)(i % 3);
  float *buf = test_dev_floats(x, N);
  for (int step = 0; step < 4; step++) { /* warmup, recording, two replays: x = 2x + 1 each time */
    CHECK_OK(t, cgt_step_begin(t));
    (void)run1(t, s, cgt_arg_static(buf, N * sizeof(float)));
    for (int i = 0; i < N; i++)
      expect[i] = 2.0f * expect[i] + 1.0f;
  }
  assert_int_equal(test_stats(t).replays, 2);
  test_tree_free(t); /* the last replay is still held back here */
  assert_int_equal(CGT_OK, test_kernels()->download(got, buf, sizeof got));
  assert_memory_equal(got, expect, sizeof got);
  test_dev_free(buf);
}

/* The steady state of deferred launch allocates nothing on the host: the
 * queue and the span cache have grown to the program's size. */
static void test_fused_steps_make_no_host_allocations(void **state) {
  (void)state;
  cgt_tree *t = defer_tree(CGT_MODE_TREE, 1);
  chain c;
  chain_init(t, &c);
  for (int step = 0; step < 4; step++)
    chain_step(t, &c, step);
  uint64_t allocs = test_stats(t).host_allocs, fused = test_stats(t).fused_launches;
  for (int step = 4; step < 10; step++)
    chain_step(t, &c, step);
  assert_int_equal(test_stats(t).host_allocs, allocs);
  assert_int_equal(test_stats(t).fused_launches, fused + 6);
  chain_free(&c);
  test_tree_free(t);
}

const struct CMUnitTest fusion_tests[] = {
    cmocka_unit_test(test_cgt_tree_destroy_launches_held_back_replays),
    cmocka_unit_test(test_fused_steps_make_no_host_allocations),
    cmocka_unit_test(test_a_recurring_span_is_fused_into_one_launch_from_its_second_flush),
    cmocka_unit_test(test_time_launches_counts_the_host_time_of_replay_launches_only),
    cmocka_unit_test(test_separate_mode_fuses_recurring_spans_too),
    cmocka_unit_test(test_every_host_visible_call_and_every_other_run_flushes_first),
    cmocka_unit_test(test_cgt_flush_refuses_a_null_tree_and_a_launch_function),
    cmocka_unit_test(test_a_static_buffer_written_after_cgt_flush_does_not_change_the_flushed_replays),
    cmocka_unit_test(test_a_static_buffer_written_before_the_flush_is_what_held_back_replays_read),
    cmocka_unit_test(test_fused_executables_over_the_cap_evict_the_least_recently_used),
    cmocka_unit_test(test_a_span_seen_once_and_single_replays_launch_node_by_node),
};
const size_t fusion_test_count = sizeof fusion_tests / sizeof fusion_tests[0];
