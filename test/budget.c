/* budget.c — the recording budget and update in place (issue 23), scenario
 * by scenario, on every backend.
 *
 * What the options promise: with max_graphs or max_graph_bytes a tree holds
 * no more recordings than its budget once a recording is done (the current
 * path excepted), by evicting the least recently replayed recording off the
 * path with its subtree; evictions are counted and the node list says why;
 * results stay those of an eager run, live values are never overwritten,
 * and fused spans through an evicted node go with it. Update in place: a
 * run whose STATIC arguments moved (reloaded parameters) updates the
 * sibling's executable instead of adding a node, falls back to a fresh
 * instantiate when the device refuses (another topology), and is not done
 * for buffers that alternate. Each test checks the tree after every run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_lists.h"
#include "tree_hooks.h"

#define N 64
#define QUIET 6 /* steps after a recording before weights move: more than UPDATE_QUIET_STEPS (4) */

/* out = x + w; with `extra`, relu(out) as a second kernel: another topology. */
typedef struct weighted {
  int extra;
  int calls;
} weighted;

static cgt_status launch_weighted(cgt_launch *l, void *user) {
  weighted *u = user;
  u->calls++;
  void *out;
  size_t n = cgt_launch_input_bytes(l, 0) / sizeof(float);
  cgt_status st = cgt_launch_alloc(l, n * sizeof(float), &out);
  if (st == CGT_OK)
    st = test_kernels()->add(cgt_launch_stream(l), cgt_launch_input(l, 0), cgt_launch_input(l, 1), out, n);
  if (st == CGT_OK && u->extra)
    st = test_kernels()->relu(cgt_launch_stream(l), out, out, n);
  if (st != CGT_OK)
    return st;
  return cgt_launch_set_output(l, 0, out, n * sizeof(float));
}

static cgt_segment register_weighted(cgt_tree *t, const char *name, weighted *u) {
  cgt_segment_desc d = {name, launch_weighted, u, 2, 1, 0};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  return s;
}

static cgt_value run_checked(cgt_tree *t, cgt_segment s, uint64_t variant, const cgt_arg *args, uint32_t n_args) {
  cgt_value out = {0};
  CHECK_OK(t, cgt_run(t, s, variant, args, n_args, &out, 1));
  CHECK_TREE(t);
  return out;
}

static void expect_floats(cgt_tree *t, cgt_value v, const float *expected, size_t n, const char *what, int step) {
  float got[N];
  test_read_value(t, v, got, n);
  for (size_t i = 0; i < n; i++)
    if (got[i] != expected[i])
      fail_msg("%s, step %d, element %zu: got %g, expected %g", what, step, i, (double)got[i], (double)expected[i]);
}

static void fill(float *h, float base, float step) {
  for (int i = 0; i < N; i++)
    h[i] = base + step * (float)i;
}

/* One step of a segment x + w (x: 0, 1, 2...; w: w_value everywhere, STATIC),
 * its result checked. */
static void step_with_weights(cgt_tree *t, cgt_segment s, float *x, float *w, float w_value, const char *what,
                              int step) {
  CHECK_OK(t, cgt_step_begin(t));
  cgt_arg a[2] = {cgt_arg_dynamic(x, N * sizeof(float)), cgt_arg_static(w, N * sizeof(float))};
  cgt_value v = run_checked(t, s, 0, a, 2);
  float expected[N];
  fill(expected, w_value, 1);
  expect_floats(t, v, expected, N, what, step);
}

/* A new device buffer of N floats, each `value`. */
static float *weights_buffer(float value) {
  float h[N];
  fill(h, value, 0);
  return test_dev_floats(h, N);
}

/* *w replaced by a new buffer at a new address holding value everywhere;
 * the old one freed after, so the address cannot come back. */
static void reload_buffer(float **w, float value) {
  float *fresh = weights_buffer(value);
  test_dev_free(*w);
  *w = fresh;
}

/* A segment x + w registered in t, x (0, 1, 2...) and two weight buffers,
 * w[b] holding first + b everywhere: double buffers, or two keys. */
typedef struct two_buffers {
  weighted u;
  cgt_segment s;
  float *x, *w[2];
} two_buffers;

static void two_buffers_open(cgt_tree *t, two_buffers *d, const char *name, float first) {
  memset(d, 0, sizeof *d);
  d->s = register_weighted(t, name, &d->u);
  float h[N];
  fill(h, 0, 1);
  d->x = test_dev_floats(h, N);
  for (int b = 0; b < 2; b++)
    d->w[b] = weights_buffer(first + (float)b);
}

/* New buffers at new addresses for both, holding first + b: a reload. */
static void two_buffers_reload(cgt_tree *t, two_buffers *d, float first) {
  CHECK_OK(t, cgt_sync(t));
  for (int b = 0; b < 2; b++)
    reload_buffer(&d->w[b], first + (float)b);
}

/* Frees the buffers, then the tree. */
static void two_buffers_close(cgt_tree *t, two_buffers *d) {
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(d->x);
  test_dev_free(d->w[0]);
  test_dev_free(d->w[1]);
  test_tree_free(t);
}

static cgt_tree *budget_tree(cgt_mode mode, uint32_t max_graphs, size_t max_bytes, uint32_t defer, uint32_t no_update) {
  cgt_options o;
  cgt_options_init(&o);
  o.max_graphs = max_graphs;
  o.max_graph_bytes = max_bytes;
  o.defer_launch = defer;
  o.no_update_in_place = no_update;
  return test_tree_new(mode, &o);
}

/* ------------------------------------------------------ update in place */

/* A chain of three segments, each with its own STATIC weights; x is DYNAMIC. */
typedef struct chain3 {
  weighted u[3];
  cgt_segment s[3];
  float *x;
  float *w[3];
  float host_w[3];
} chain3;

static void chain3_open(cgt_tree *t, chain3 *c) {
  memset(c, 0, sizeof *c);
  float hx[N];
  fill(hx, -20, 1);
  c->x = test_dev_floats(hx, N);
  for (int i = 0; i < 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d", i);
    c->s[i] = register_weighted(t, name, &c->u[i]);
  }
}

/* New weights at new addresses, holding `scale` * (layer + 1); the old
 * buffers are freed, as a reload does. */
static void chain3_load(cgt_tree *t, chain3 *c, float scale) {
  if (t)
    CHECK_OK(t, cgt_sync(t));
  for (int i = 0; i < 3; i++) {
    c->host_w[i] = scale * (float)(i + 1);
    reload_buffer(&c->w[i], c->host_w[i]);
  }
}

static void chain3_close(cgt_tree *t, chain3 *c) {
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(c->x);
  for (int i = 0; i < 3; i++)
    test_dev_free(c->w[i]);
}

static void chain3_step(cgt_tree *t, chain3 *c, int step) {
  CHECK_OK(t, cgt_step_begin(t));
  cgt_arg a[2] = {cgt_arg_dynamic(c->x, N * sizeof(float)), cgt_arg_static(c->w[0], N * sizeof(float))};
  cgt_value v = run_checked(t, c->s[0], 0, a, 2);
  for (int i = 1; i < 3; i++) {
    cgt_arg b[2] = {cgt_arg_value(v), cgt_arg_static(c->w[i], N * sizeof(float))};
    v = run_checked(t, c->s[i], 0, b, 2);
  }
  float expected[N];
  fill(expected, -20 + c->host_w[0] + c->host_w[1] + c->host_w[2], 1);
  for (int i = 0; i < N; i++)
    if (c->u[2].extra && expected[i] < 0)
      expected[i] = 0;
  expect_floats(t, v, expected, N, "chain of three", step);
}

/* A tree (update in place on or off) whose chain has run QUIET steps on
 * its first weights: recorded, replayed, ready for a reload. *step is the
 * next step's number. */
static cgt_tree *chain3_settled(uint32_t no_update, chain3 *c, int *step) {
  cgt_tree *t = budget_tree(CGT_MODE_TREE, 0, 0, 0, no_update);
  chain3_open(t, c);
  chain3_load(NULL, c, 1);
  for (*step = 0; *step < QUIET; (*step)++)
    chain3_step(t, c, *step);
  return t;
}

static void test_reloaded_parameters_record_no_new_nodes(void **state) {
  (void)state;
  chain3 c;
  int step;
  cgt_tree *t = chain3_settled(0, &c, &step);
  size_t nodes = test_node_count(t);
  cgt_node_info before[3], after[3];
  size_t count;
  CHECK_OK(t, cgt_tree_nodes(t, before, 3, &count));
  cgt_stats s0 = test_stats(t);
  assert_int_equal(nodes, 3);

  chain3_load(t, &c, 10); /* new addresses, new values: the replays must read them */
  chain3_step(t, &c, step++);
  cgt_stats s1 = test_stats(t);
  assert_int_equal(test_node_count(t), nodes);
  assert_int_equal(s1.nodes, s0.nodes);
  assert_int_equal(s1.updates - s0.updates, 3);
  assert_int_equal(s1.update_fallbacks, 0);
  assert_int_equal(s1.recordings - s0.recordings, 3);
  CHECK_OK(t, cgt_tree_nodes(t, after, 3, &count));
  for (int i = 0; i < 3; i++) {
    assert_int_equal(after[i].id, before[i].id);
    assert_int_equal(after[i].parent, before[i].parent);
    assert_int_equal(after[i].state, CGT_NODE_RECORDED);
    assert_int_equal(after[i].updates, 1);
    assert_true(after[i].replays == before[i].replays);
  }
  /* Afterwards the updated recordings replay. */
  for (int k = 0; k < 3; k++)
    chain3_step(t, &c, step++);
  cgt_stats s2 = test_stats(t);
  assert_int_equal(s2.recordings, s1.recordings);
  assert_int_equal(s2.replays - s1.replays, 9);
  assert_int_equal(s2.nodes, s0.nodes);
  chain3_close(t, &c);
  test_tree_free(t);
}

static void test_update_refused_by_the_device_falls_back_to_a_fresh_instantiate(void **state) {
  (void)state;
  chain3 c;
  int step;
  cgt_tree *t = chain3_settled(0, &c, &step);
  cgt_stats s0 = test_stats(t);
  /* The last layer gains a kernel with the reload: another topology, which
   * the device refuses to update. Its inputs and outputs stay where they
   * were, so the node keeps its place with a fresh executable. */
  c.u[2].extra = 1;
  chain3_load(t, &c, -10);
  chain3_step(t, &c, step++);
  cgt_stats s1 = test_stats(t);
  assert_int_equal(s1.nodes, s0.nodes);
  assert_int_equal(s1.updates - s0.updates, 3);
  assert_int_equal(s1.update_fallbacks - s0.update_fallbacks, 1);
  for (int k = 0; k < 3; k++)
    chain3_step(t, &c, step++);
  assert_int_equal(test_stats(t).recordings, s1.recordings);
  chain3_close(t, &c);
  test_tree_free(t);
}

static void test_weights_that_alternate_between_two_buffers_get_a_node_each(void **state) {
  (void)state;
  cgt_tree *t = budget_tree(CGT_MODE_TREE, 0, 0, 0, 0);
  two_buffers d;
  two_buffers_open(t, &d, "double_buffered", 1);
  for (int step = 0; step < 4 * QUIET; step++)
    step_with_weights(t, d.s, d.x, d.w[step % 2], (float)(1 + step % 2), "double buffered", step);
  assert_int_equal(test_node_count(t), 2);
  assert_int_equal(test_stats(t).updates, 0);
  two_buffers_close(t, &d);
}

static void test_no_update_in_place_records_a_new_node_for_moved_weights(void **state) {
  (void)state;
  chain3 c;
  int step;
  cgt_tree *t = chain3_settled(1, &c, &step);
  chain3_load(t, &c, 3);
  chain3_step(t, &c, step++);
  assert_int_equal(test_node_count(t), 6);
  assert_int_equal(test_stats(t).updates, 0);
  chain3_close(t, &c);
  test_tree_free(t);
}

/* A tree with update in place on and a rerecord limit of `limit`. */
static cgt_tree *limited_tree(uint32_t limit) {
  cgt_options o;
  cgt_options_init(&o);
  o.rerecord_limit = limit;
  return test_tree_new(CGT_MODE_TREE, &o);
}

/* Runs `steps` steps of a segment x + w whose STATIC w is a new buffer at
 * every step (kept, so no address comes back), checking every result; the
 * tree's stats at the middle step and at the end. Frees what it made. */
static void run_a_new_buffer_each_step(cgt_tree *t, int steps, cgt_stats *middle, cgt_stats *end) {
  enum { MAX_STEPS = 64 };
  assert_true(steps <= MAX_STEPS);
  weighted u = {0};
  cgt_segment s = register_weighted(t, "new_buffer_each_step", &u);
  float hx[N];
  fill(hx, 0, 1);
  float *x = test_dev_floats(hx, N), *w[MAX_STEPS];
  for (int step = 0; step < steps; step++) {
    w[step] = weights_buffer((float)step);
    step_with_weights(t, s, x, w[step], (float)step, "a new buffer each step", step);
    if (step == steps / 2)
      *middle = test_stats(t);
  }
  *end = test_stats(t);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  for (int step = 0; step < steps; step++)
    test_dev_free(w[step]);
}

/* A buffer written in place is STATIC, and a program may pass a new one at
 * every step (a fresh output buffer per call, kept): every step is a new
 * key. Its capture updated a quiet sibling in place at every step, for
 * good (1.86x to 2.44x the plain call's time on an H200:
 * bench/torch_moving_static.py). A sibling that never replayed since its
 * recording is not updated, so each step records a node of its own, up to
 * the rerecord limit; past it the new keys run on the overflow node, with
 * no capture. */
static void test_weights_at_a_new_address_every_step_record_up_to_the_rerecord_limit_then_run_eagerly(void **state) {
  (void)state;
  enum { LIMIT = 8, STEPS = 40 };
  cgt_tree *t = limited_tree(LIMIT);
  cgt_stats middle, end;
  run_a_new_buffer_each_step(t, STEPS, &middle, &end);
  assert_int_equal(end.updates, 0);                   /* no node replayed: none is updated */
  assert_int_equal(end.recordings, LIMIT);            /* captures are bounded */
  assert_int_equal(end.recordings, middle.recordings); /* the second half captured nothing */
  assert_int_equal(end.eager_runs - middle.eager_runs, STEPS - 1 - STEPS / 2);
  assert_true(test_node_count(t) <= LIMIT + 2);
  test_tree_free(t);
}

/* The same under a recording budget below the limit: each new recording
 * never replays, so it is the least recently used one and is evicted at
 * the next recording, back to WARMUP. Not counted, the parent never reached
 * the limit, and every step was a capture (a review). A node evicted before
 * it ever replayed counts until it is pruned. */
static void test_weights_at_a_new_address_every_step_under_a_graph_budget_stop_being_captured(void **state) {
  (void)state;
  enum { LIMIT = 8, STEPS = 60 };
  cgt_options o;
  cgt_options_init(&o);
  o.rerecord_limit = LIMIT;
  o.max_graphs = 3;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  cgt_stats middle, end;
  run_a_new_buffer_each_step(t, STEPS, &middle, &end);
  assert_true(end.evictions > 0);
  assert_int_equal(end.recordings, LIMIT);
  assert_int_equal(end.recordings, middle.recordings);
  test_tree_free(t);
}

/* A buffer that cycles through P addresses (an allocator's recycled blocks,
 * a ring of buffers): with P above UPDATE_QUIET_STEPS each node was updated
 * away before its address came back, a capture at most steps, for good (a
 * review: 140 captures in 200 steps for a ring of 8). Now each address gets
 * a node, and the ring replays. */
static void test_a_buffer_cycling_through_a_few_addresses_settles_into_replays(void **state) {
  (void)state;
  enum { STEPS = 120, MAX_PERIOD = 12 };
  for (int period = 2; period <= MAX_PERIOD; period++) {
    cgt_tree *t = limited_tree(32);
    weighted u = {0};
    cgt_segment s = register_weighted(t, "ring", &u);
    float hx[N];
    fill(hx, 0, 1);
    float *x = test_dev_floats(hx, N), *w[MAX_PERIOD];
    for (int b = 0; b < period; b++)
      w[b] = weights_buffer((float)b);
    cgt_stats half = {0};
    for (int step = 0; step < STEPS; step++) {
      int b = step % period;
      if (step == STEPS / 2)
        half = test_stats(t);
      step_with_weights(t, s, x, w[b], (float)b, "a ring of buffers", step);
    }
    cgt_stats end = test_stats(t);
    if (end.recordings != half.recordings || end.replays - half.replays != STEPS - STEPS / 2)
      fail_msg("a ring of %d buffers: the second half made %llu recordings and %llu replays in %d steps", period,
               (unsigned long long)(end.recordings - half.recordings),
               (unsigned long long)(end.replays - half.replays), STEPS - STEPS / 2);
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(x);
    for (int b = 0; b < period; b++)
      test_dev_free(w[b]);
    test_tree_free(t);
  }
}

/* Weights that alternate between two buffers get a node each; then both
 * are reloaded: each node is updated once, and nothing runs eagerly (a
 * review: with the limit counting updates, the first update filled a limit
 * of 3 and the second buffer went to the overflow node, for good). */
static void test_double_buffered_weights_reloaded_update_both_nodes(void **state) {
  (void)state;
  cgt_tree *t = limited_tree(3);
  two_buffers d;
  two_buffers_open(t, &d, "double_buffered_reload", 1);
  int step = 0;
  cgt_stats s0 = {0};
  for (int round = 0; round < 2; round++) {
    if (round == 1) { /* the reload: both buffers at new addresses, new values */
      two_buffers_reload(t, &d, 11);
      s0 = test_stats(t);
    }
    for (int k = 0; k < 4 * QUIET; k++, step++)
      step_with_weights(t, d.s, d.x, d.w[step % 2], (float)(10 * round + 1 + step % 2), "double buffered, reloaded",
                        step);
  }
  cgt_stats s1 = test_stats(t);
  assert_int_equal(s1.updates - s0.updates, 2); /* each buffer's node updated once */
  assert_int_equal(s1.eager_runs, s0.eager_runs);
  assert_int_equal(test_node_count(t), 2);
  two_buffers_close(t, &d);
}

/* A node the budget evicted before it replayed counts toward the limit; if
 * its key comes back, its recording replaces that count, so it records
 * again within the limit (a review: counted twice, it turned EAGER for
 * good, with two keys under a limit of 2). */
static void test_a_node_evicted_before_it_replayed_records_again_within_the_limit(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.rerecord_limit = 2;
  o.max_graphs = 1;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  two_buffers d;
  two_buffers_open(t, &d, "evicted_back", 1);
  int step = 0;
  step_with_weights(t, d.s, d.x, d.w[0], 1, "w0", step++); /* warm-up */
  step_with_weights(t, d.s, d.x, d.w[0], 1, "w0", step++); /* recorded */
  for (int k = 0; k < 10; k++) /* recorded, evicting w0's node before it replayed; then replays */
    step_with_weights(t, d.s, d.x, d.w[1], 2, "w1", step++);
  cgt_stats a = test_stats(t);
  assert_true(a.evictions > 0);
  for (int k = 0; k < 20; k++)
    step_with_weights(t, d.s, d.x, d.w[0], 1, "w0 again", step++);
  cgt_stats b = test_stats(t);
  assert_int_equal(b.eager_runs, a.eager_runs);
  assert_int_equal(b.recordings - a.recordings, 1);
  assert_int_equal(b.replays - a.replays, 19);
  two_buffers_close(t, &d);
}

/* Weights reloaded more times than the rerecord limit, with replays
 * between reloads: each reload updates every node once, and its replays
 * make the node updatable again, so every reload is an update in place,
 * the tree keeps its size and nothing runs eagerly. */
static void test_weights_reloaded_more_often_than_the_rerecord_limit_update_in_place_at_every_reload(void **state) {
  (void)state;
  enum { LIMIT = 4, RELOADS = 12 };
  chain3 c;
  cgt_tree *t = limited_tree(LIMIT);
  chain3_open(t, &c);
  chain3_load(NULL, &c, 1);
  int step = 0;
  for (; step < QUIET; step++)
    chain3_step(t, &c, step);
  cgt_stats s0 = test_stats(t);
  for (int r = 0; r < RELOADS; r++) {
    chain3_load(t, &c, (float)(r + 2));
    for (int k = 0; k < QUIET; k++, step++)
      chain3_step(t, &c, step);
  }
  cgt_stats s1 = test_stats(t);
  assert_int_equal(s1.updates - s0.updates, 3 * RELOADS);
  assert_int_equal(s1.recordings - s0.recordings, 3 * RELOADS);
  assert_int_equal(s1.eager_runs, s0.eager_runs);
  assert_int_equal(test_node_count(t), 3);
  chain3_close(t, &c);
  test_tree_free(t);
}

/* A segment whose output is a view of its STATIC input, and a child that
 * reads it: the view moves with the weights, the child takes it as DYNAMIC
 * (it is caller memory), so the node is updated and the child replays. */
static void test_a_view_of_moved_weights_moves_with_them_and_the_node_is_updated(void **state) {
  (void)state;
  cgt_tree *t = budget_tree(CGT_MODE_TREE, 0, 0, 0, 0);
  test_affine uv = {.n = N}, ua = {.a = 2, .b = 1, .n = N};
  cgt_segment sv = test_register_view(t, "view", &uv), sa = test_register_affine(t, "affine", &ua);
  float hw[N];
  float *w = NULL;
  for (int step = 0; step < 2 * QUIET; step++) {
    if (step == 0 || step == QUIET) {
      fill(hw, (float)step, 0.5f);
      CHECK_OK(t, cgt_sync(t));
      float *fresh = test_dev_floats(hw, N);
      test_dev_free(w);
      w = fresh;
    }
    CHECK_OK(t, cgt_step_begin(t));
    cgt_arg a = cgt_arg_static(w, N * sizeof(float));
    cgt_value v = run_checked(t, sv, 0, &a, 1);
    void *ptr = NULL;
    CHECK_OK(t, cgt_value_ptr(t, v, &ptr, NULL));
    assert_ptr_equal(ptr, w); /* the view names the weights where they are now */
    cgt_arg b = cgt_arg_value(v);
    cgt_value y = run_checked(t, sa, 0, &b, 1);
    float want[N];
    for (int i = 0; i < N; i++)
      want[i] = 2 * hw[i] + 1;
    expect_floats(t, y, want, N, "affine of a view", step);
  }
  cgt_stats s = test_stats(t);
  assert_int_equal(s.nodes, 2);
  assert_int_equal(s.updates, 1);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(w);
  test_tree_free(t);
}

/* Every host allocation of the updating run failing in turn: the run fails
 * with CGT_ERR_OUT_OF_MEMORY and changes nothing; then it succeeds. */
static void test_an_update_with_each_host_allocation_failing_changes_nothing(void **state) {
  (void)state;
  chain3 c;
  int step;
  cgt_tree *t = chain3_settled(0, &c, &step);
  chain3_load(t, &c, 2);
  CHECK_OK(t, cgt_step_begin(t));
  cgt_arg a[2] = {cgt_arg_dynamic(c.x, N * sizeof(float)), cgt_arg_static(c.w[0], N * sizeof(float))};
  long long k = 0;
  for (;; k++) {
    cgt_stats before = test_stats(t);
    cgt_value out = {111};
    cgt__fail_host_alloc_after(t, k, 1);
    cgt_status st = cgt_run(t, c.s[0], 0, a, 2, &out, 1);
    int fired = cgt__host_alloc_failures(t) > 0;
    cgt__fail_host_alloc_after(t, -1, 0);
    CHECK_TREE(t);
    if (!fired) {
      CHECK_OK(t, st);
      break;
    }
    CHECK_STATUS(t, CGT_ERR_OUT_OF_MEMORY, st);
    assert_int_equal(out.bits, 111);
    cgt_stats after = test_stats(t);
    assert_int_equal(after.nodes, before.nodes);
    assert_int_equal(after.updates, before.updates);
    assert_int_equal(after.recordings, before.recordings);
    assert_true(k < 10000);
  }
  assert_true(k > 0);
  assert_int_equal(test_stats(t).updates, 1);
  assert_int_equal(test_node_count(t), 3);
  chain3_close(t, &c);
  test_tree_free(t);
}

/* y = relu(x @ W), x DYNAMIC (GEMM_B x GEMM_H), W STATIC (GEMM_H x GEMM_H):
 * cuBLAS on CUDA (a library's kernels, workspace from the pool), a plain
 * loop on the simulator. */
enum { GEMM_B = 8, GEMM_H = 64 };
#define GEMM_WORKSPACE ((size_t)1 << 20)

static cgt_status launch_gemm(cgt_launch *l, void *user) {
  kern_ctx *ctx = user;
  const kernels *k = test_kernels();
  void *ws, *y;
  cgt_status st = cgt_launch_alloc(l, GEMM_WORKSPACE, &ws);
  if (st == CGT_OK)
    st = cgt_launch_alloc(l, GEMM_B * GEMM_H * sizeof(float), &y);
  if (st == CGT_OK)
    st = k->gemm(ctx, cgt_launch_stream(l), cgt_launch_input(l, 0), cgt_launch_input(l, 1), y, GEMM_B, GEMM_H, GEMM_H,
                 ws, GEMM_WORKSPACE);
  if (st == CGT_OK)
    st = k->relu(cgt_launch_stream(l), y, y, GEMM_B * GEMM_H);
  if (st == CGT_OK)
    st = cgt_launch_free(l, ws);
  if (st != CGT_OK)
    return st;
  return cgt_launch_set_output(l, 0, y, GEMM_B * GEMM_H * sizeof(float));
}

static void test_reloaded_gemm_weights_update_in_place_and_match_eager(void **state) {
  (void)state;
  cgt_tree *t[2] = {budget_tree(CGT_MODE_TREE, 0, 0, 0, 0), test_tree_new(CGT_MODE_EAGER, NULL)};
  kern_ctx *ctx[2];
  cgt_segment s[2];
  for (int m = 0; m < 2; m++) {
    CHECK_OK(t[m], test_kernels()->ctx_create(cgt_tree_stream(t[m]), &ctx[m]));
    cgt_segment_desc d = {"gemm_relu", launch_gemm, ctx[m], 2, 1, 0};
    CHECK_OK(t[m], cgt_segment_register(t[m], &d, &s[m]));
  }
  float hx[GEMM_B * GEMM_H], hw[GEMM_H * GEMM_H];
  for (int i = 0; i < GEMM_B * GEMM_H; i++)
    hx[i] = (float)(i % 9) * 0.25f - 1.0f;
  float *x = test_dev_floats(hx, GEMM_B * GEMM_H), *w = NULL;
  size_t nodes = 0;
  for (int step = 0; step < 2 * QUIET; step++) {
    if (step == 0 || step == QUIET) { /* the first load, then a reload to a new address with new values */
      for (int i = 0; i < GEMM_H * GEMM_H; i++)
        hw[i] = (float)((i * (step + 3)) % 7) * 0.0625f - 0.1875f;
      float *fresh = test_dev_floats(hw, GEMM_H * GEMM_H);
      for (int m = 0; m < 2; m++)
        CHECK_OK(t[m], cgt_sync(t[m]));
      test_dev_free(w);
      w = fresh;
      if (step == QUIET)
        nodes = test_node_count(t[0]);
    }
    float got[2][GEMM_B * GEMM_H];
    for (int m = 0; m < 2; m++) {
      CHECK_OK(t[m], cgt_step_begin(t[m]));
      cgt_arg a[2] = {cgt_arg_dynamic(x, sizeof hx), cgt_arg_static(w, sizeof hw)};
      test_read_value(t[m], run_checked(t[m], s[m], 0, a, 2), got[m], GEMM_B * GEMM_H);
    }
    if (memcmp(got[0], got[1], sizeof got[0]))
      fail_msg("step %d: the tree's gemm differs from the eager one", step);
  }
  assert_int_equal(test_node_count(t[0]), nodes);
  assert_int_equal(test_stats(t[0]).updates, 1);
  for (int m = 0; m < 2; m++) {
    CHECK_OK(t[m], cgt_sync(t[m]));
    test_kernels()->ctx_destroy(ctx[m]);
  }
  test_dev_free(x);
  test_dev_free(w);
  test_tree_free(t[0]);
  test_tree_free(t[1]);
}

/* ----------------------------------------------------------- the budget */

/* out = a*x + b on as many floats as the variant says; two host paths. */
typedef struct shaped {
  test_affine u[3];
  cgt_segment s[3];
  float *x;
} shaped;

static void shaped_open(cgt_tree *t, shaped *p) {
  memset(p, 0, sizeof *p);
  static const float a[3] = {2, -1, 3}, b[3] = {1, 5, -2};
  for (int i = 0; i < 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "shaped%d", i);
    p->u[i] = (test_affine){.a = a[i], .b = b[i], .n = N};
    p->s[i] = test_register_affine(t, name, &p->u[i]);
  }
  float hx[N];
  fill(hx, -3, 0.5f);
  p->x = test_dev_floats(hx, N);
}

/* One step: shape (1..8) * 8 floats, through segment 0 and then 1 or 2.
 * The affine segments use u->n floats, so the shape is set per run. */
static void shaped_step(cgt_tree *t, shaped *p, int shape, int path, float *result) {
  CHECK_OK(t, cgt_step_begin(t));
  size_t n = (size_t)shape * 8;
  for (int i = 0; i < 3; i++)
    p->u[i].n = n;
  cgt_arg a = cgt_arg_dynamic(p->x, n * sizeof(float));
  cgt_value v = run_checked(t, p->s[0], (uint64_t)shape, &a, 1);
  cgt_arg b = cgt_arg_value(v);
  cgt_value w = run_checked(t, p->s[1 + path], (uint64_t)shape, &b, 1);
  test_read_value(t, w, result, n);
}

static void budget_program(cgt_mode mode, uint32_t max_graphs, size_t max_bytes, cgt_stats *final) {
  cgt_tree *t = budget_tree(mode, max_graphs, max_bytes, 0, 0);
  cgt_tree *ref = test_tree_new(CGT_MODE_EAGER, NULL);
  shaped p, q;
  shaped_open(t, &p);
  shaped_open(ref, &q);
  for (int step = 0; step < 96; step++) {
    int shape = 1 + (step * 5) % 8, path = (step / 3) % 2;
    float got[N], want[N];
    shaped_step(t, &p, shape, path, got);
    shaped_step(ref, &q, shape, path, want);
    if (memcmp(got, want, (size_t)shape * 8 * sizeof(float)))
      fail_msg("%s mode, budget %u graphs / %zu bytes: step %d differs from eager", mode == CGT_MODE_TREE ? "tree" : "separate",
               max_graphs, max_bytes, step);
    cgt_stats s = test_stats(t);
    if (max_graphs)
      assert_true(s.graphs <= max_graphs); /* the path (2 nodes) fits, so the budget holds */
  }
  *final = test_stats(t);
  size_t count = test_node_count(t);
  cgt_node_info *info = calloc(count, sizeof *info);
  assert_non_null(info);
  CHECK_OK(t, cgt_tree_nodes(t, info, count, &count));
  uint64_t evicted_listed = 0;
  for (size_t i = 0; i < count; i++)
    if (info[i].evictions) {
      assert_non_null(info[i].evict_reason);
      assert_non_null(strstr(info[i].evict_reason, max_graphs ? "max_graphs" : "max_graph_bytes"));
      evicted_listed++;
    } else {
      assert_null(info[i].evict_reason);
    }
  if (final->evictions)
    assert_true(evicted_listed > 0);
  free(info);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(p.x);
  test_dev_free(q.x);
  test_tree_free(t);
  test_tree_free(ref);
}

static void test_a_budget_of_graphs_bounds_the_tree_and_results_stay_those_of_eager(void **state) {
  (void)state;
  static const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE};
  for (int m = 0; m < 2; m++) {
    cgt_stats unbounded, bounded;
    budget_program(modes[m], 0, 0, &unbounded);
    budget_program(modes[m], 3, 0, &bounded);
    assert_int_equal(unbounded.evictions, 0);
    assert_true(unbounded.graphs > 3);
    assert_true(bounded.evictions > 0);
    assert_true(bounded.graphs <= 3);
    assert_true(bounded.recordings > unbounded.recordings); /* evicted paths recorded again */
  }
}

static void test_a_byte_budget_evicts_to_stay_under_its_bytes(void **state) {
  (void)state;
  cgt_stats unbounded, bounded;
  budget_program(CGT_MODE_TREE, 0, 0, &unbounded);
  /* Room for about a third of what the unbounded tree keeps. */
  size_t cap = unbounded.graph_bytes / 3;
  if (cap < CGT_MIN_GRAPH_BYTES)
    cap = CGT_MIN_GRAPH_BYTES;
  budget_program(CGT_MODE_TREE, 0, cap, &bounded);
  assert_true(unbounded.graph_bytes > cap); /* 24 recordings hold more than 3 times the least budget */
  assert_true(bounded.evictions > 0);
  assert_true(bounded.graph_bytes <= cap);
}

/* A(x) -> a, B(a) -> b, then C(b) or D(b), with a released or kept live
 * while C or D runs: C recorded with a dead may not replay with a live, and
 * no re-recording after an eviction may hand out a's memory while a lives. */
static void test_eviction_keeps_the_liveness_invariant(void **state) {
  (void)state;
  cgt_tree *t = budget_tree(CGT_MODE_TREE, 3, 0, 0, 0);
  test_affine ua = {.a = 2, .b = 1, .n = N}, ub = {.a = 1, .b = 3, .n = N}, uc = {.a = -1, .b = 0, .n = N},
              ud = {.a = 4, .b = -1, .n = N};
  cgt_segment sa = test_register_affine(t, "A", &ua), sb = test_register_affine(t, "B", &ub),
              sc = test_register_affine(t, "C", &uc), sd = test_register_affine(t, "D", &ud);
  float hx[N];
  fill(hx, 1, 1);
  float *x = test_dev_floats(hx, N);
  for (int step = 0; step < 60; step++) {
    int kind = (step * 7) % 4; /* C or D, a released or kept */
    int keep = kind & 1, use_d = kind >> 1;
    CHECK_OK(t, cgt_step_begin(t));
    cgt_arg ax = cgt_arg_dynamic(x, N * sizeof(float));
    cgt_value a = run_checked(t, sa, 0, &ax, 1);
    cgt_arg aa = cgt_arg_value(a);
    cgt_value b = run_checked(t, sb, 0, &aa, 1);
    if (!keep)
      CHECK_OK(t, cgt_value_release(t, a));
    cgt_arg ab = cgt_arg_value(b);
    cgt_value c = run_checked(t, use_d ? sd : sc, 0, &ab, 1);
    float want_a[N], want_c[N];
    for (int i = 0; i < N; i++) {
      want_a[i] = 2 * hx[i] + 1;
      float bv = want_a[i] + 3;
      want_c[i] = use_d ? 4 * bv - 1 : -bv;
    }
    expect_floats(t, c, want_c, N, "last segment", step);
    if (keep)
      expect_floats(t, a, want_a, N, "the value kept live", step);
    else
      CHECK_STATUS(t, CGT_ERR_STALE_VALUE, cgt_value_copy_out(t, a, want_a, sizeof(float)));
  }
  cgt_stats s = test_stats(t);
  assert_true(s.evictions > 0);
  assert_true(s.graphs <= 3);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

/* A -> B -> C replayed until fused into one launch, then A -> D, whose
 * recording evicts C (the oldest recording off the path with none below
 * it: B, older, has C): the span A..C, which ends at C, goes with it, and
 * the tree stays sound; back on A -> B -> C, C records again and evicts D,
 * and the chain fuses again. */
static void test_eviction_drops_a_fused_span_ending_at_the_evicted_node(void **state) {
  (void)state;
  cgt_tree *t = budget_tree(CGT_MODE_TREE, 3, 0, 1, 0);
  test_affine u[4] = {{.a = 2, .b = 1, .n = N}, {.a = -1, .b = 2, .n = N}, {.a = 3, .b = 0, .n = N},
                      {.a = 1, .b = -4, .n = N}};
  cgt_segment s[4];
  for (int i = 0; i < 4; i++) {
    char name[32];
    snprintf(name, sizeof name, "%c", 'A' + i);
    s[i] = test_register_affine(t, name, &u[i]);
  }
  float hx[N];
  fill(hx, -2, 0.25f);
  float *x = test_dev_floats(hx, N);
  uint64_t fused_before_eviction = 0;
  for (int step = 0; step < 20; step++) {
    int use_d = step == 8 || step == 9; /* 8 warms D up, 9 records it */
    CHECK_OK(t, cgt_step_begin(t));
    cgt_arg ax = cgt_arg_dynamic(x, N * sizeof(float));
    cgt_value v = run_checked(t, s[0], 0, &ax, 1);
    float want[N];
    for (int i = 0; i < N; i++)
      want[i] = 2 * hx[i] + 1;
    int chain[2] = {use_d ? 3 : 1, use_d ? -1 : 2};
    for (int k = 0; k < 2 && chain[k] >= 0; k++) {
      cgt_arg av = cgt_arg_value(v);
      v = run_checked(t, s[chain[k]], 0, &av, 1);
      for (int i = 0; i < N; i++)
        want[i] = u[chain[k]].a * want[i] + u[chain[k]].b;
    }
    expect_floats(t, v, want, N, "deferred chain", step);
    if (step == 7)
      fused_before_eviction = test_stats(t).fused_launches;
    if (step == 9) {
      /* A and B recorded, C back in WARMUP with its reason, and D. */
      cgt_node_info info[5];
      size_t count;
      CHECK_OK(t, cgt_tree_nodes(t, info, 5, &count));
      assert_int_equal(count, 4);
      assert_int_equal(info[1].segment, s[1]);
      assert_int_equal(info[1].state, CGT_NODE_RECORDED);
      assert_int_equal(info[2].segment, s[2]);
      assert_int_equal(info[2].state, CGT_NODE_WARMUP);
      assert_int_equal(info[2].evictions, 1);
      assert_non_null(strstr(info[2].evict_reason, "max_graphs"));
    }
  }
  cgt_stats st = test_stats(t);
  assert_true(fused_before_eviction > 0);
  assert_true(st.evictions >= 2);
  assert_int_equal(st.nodes_evicted, 0); /* leaves went: no descendant was removed */
  assert_true(st.fused_launches > fused_before_eviction); /* fused again after re-recording */
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

/* A stale subtree A -> B -> C1 whose key group under B holds a later
 * sibling C2 that is not RECORDED (C recorded with a dead, then run with a
 * live: C2; under rerecord_limit 1 it turns EAGER at once, with the default
 * it is a WARMUP node once the budget has evicted it) is never used again;
 * then the program alternates two one-segment steps E and F. Budget 4: the
 * stale subtree's 3 recordings and E and F do not fit, E and F alone do.
 * The rule before leaves first evicted A, the oldest, with its subtree, and
 * E and F replay from then on. The first leaves-first rule counted C1 (not
 * the last of its group, so it may not go by itself) as a recording below A
 * and B, so they were never leaves, and while E or F was a leaf off the
 * path it went instead: E evicted F, F evicted E, no step replayed, and the
 * stale recordings kept 3 of the 4 graphs (for good with an EAGER C2, which
 * prune_after_steps never removes; for 1.5 x prune_after_steps with a
 * WARMUP one; a helper's review). C1 now marks nothing (evict.c,
 * mark_recorded_below): A is a leaf, the oldest, and goes with its subtree. */
static void stale_key_group_then_two_alternating_steps(uint32_t rerecord_limit) {
  cgt_options o;
  cgt_options_init(&o);
  o.max_graphs = 4;
  o.rerecord_limit = rerecord_limit;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  test_affine u[5] = {{.a = 2, .b = 1, .n = N}, {.a = 1, .b = 3, .n = N}, {.a = -1, .b = 0, .n = N},
                      {.a = 4, .b = -1, .n = N}, {.a = 3, .b = 2, .n = N}};
  cgt_segment s[5];
  for (int i = 0; i < 5; i++) {
    char name[8];
    snprintf(name, sizeof name, "%c", "ABCEF"[i]);
    s[i] = test_register_affine(t, name, &u[i]);
  }
  float hx[N];
  fill(hx, 1, 1);
  float *x = test_dev_floats(hx, N);
  /* Phase 1: A, B, C with a released (C1 records), then with a kept (C2). */
  for (int step = 0; step < 8; step++) {
    int keep = step >= 4;
    CHECK_OK(t, cgt_step_begin(t));
    cgt_arg ax = cgt_arg_dynamic(x, N * sizeof(float));
    cgt_value a = run_checked(t, s[0], 0, &ax, 1);
    cgt_arg aa = cgt_arg_value(a);
    cgt_value b = run_checked(t, s[1], 0, &aa, 1);
    if (!keep)
      CHECK_OK(t, cgt_value_release(t, a));
    cgt_arg ab = cgt_arg_value(b);
    cgt_value c = run_checked(t, s[2], 0, &ab, 1);
    float want[N];
    for (int i = 0; i < N; i++)
      want[i] = -(2 * hx[i] + 1 + 3);
    expect_floats(t, c, want, N, "stale chain", step);
  }
  /* Phase 2: E and F alternate, 40 steps, far fewer than prune_after_steps. */
  uint64_t replays_before = test_stats(t).replays;
  for (int step = 0; step < 40; step++) {
    int f = step & 1;
    CHECK_OK(t, cgt_step_begin(t));
    cgt_arg ax = cgt_arg_dynamic(x, N * sizeof(float));
    cgt_value v = run_checked(t, s[3 + f], 0, &ax, 1);
    float want[N];
    for (int i = 0; i < N; i++)
      want[i] = u[3 + f].a * hx[i] + u[3 + f].b;
    expect_floats(t, v, want, N, "alternating step", step);
  }
  cgt_stats st = test_stats(t);
  assert_true(st.graphs <= 4);
  /* E and F fit the budget together: after their first recordings (and an
   * eviction to make room) every step should replay. */
  if (st.replays - replays_before < 30)
    fail_msg("phase 2: %llu replays in 40 steps (expected at least 30), %llu graphs, %llu evictions",
             (unsigned long long)(st.replays - replays_before), (unsigned long long)st.graphs,
             (unsigned long long)st.evictions);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

static void test_a_stale_subtree_pinned_by_an_eager_key_group_member_does_not_starve_the_budget(void **state) {
  (void)state;
  stale_key_group_then_two_alternating_steps(1);
}

static void test_a_stale_subtree_pinned_by_a_warmup_key_group_member_does_not_starve_the_budget(void **state) {
  (void)state;
  stale_key_group_then_two_alternating_steps(0);
}

static void test_nonsense_budgets_are_refused_and_make_no_tree(void **state) {
  (void)state;
  cgt_options o;
  cgt_options bad[3];
  for (int i = 0; i < 3; i++) {
    cgt_options_init(&bad[i]);
    bad[i].backend = test_backend;
  }
  bad[0].max_graphs = CGT_MAX_GRAPHS_LIMIT + 1;
  bad[1].max_graph_bytes = CGT_MIN_GRAPH_BYTES - 1;
  bad[2].no_update_in_place = 2;
  for (int i = 0; i < 3; i++) {
    cgt_tree *t = (cgt_tree *)&o; /* not NULL: create must set it */
    CHECK_STATUS(NULL, CGT_ERR_INVALID_ARGUMENT, cgt_tree_create(&bad[i], &t));
    assert_null(t);
  }
  /* The edges are fine, and zero means no budget. */
  cgt_options_init(&o);
  o.backend = test_backend;
  o.max_graphs = CGT_MAX_GRAPHS_LIMIT;
  o.max_graph_bytes = CGT_MIN_GRAPH_BYTES;
  o.no_update_in_place = 1;
  cgt_tree *t = NULL;
  CHECK_OK(NULL, cgt_tree_create(&o, &t));
  cgt_tree_destroy(t);
}

const struct CMUnitTest budget_tests[] = {
    cmocka_unit_test(test_reloaded_parameters_record_no_new_nodes),
    cmocka_unit_test(test_update_refused_by_the_device_falls_back_to_a_fresh_instantiate),
    cmocka_unit_test(test_weights_that_alternate_between_two_buffers_get_a_node_each),
    cmocka_unit_test(test_no_update_in_place_records_a_new_node_for_moved_weights),
    cmocka_unit_test(test_weights_at_a_new_address_every_step_record_up_to_the_rerecord_limit_then_run_eagerly),
    cmocka_unit_test(test_weights_at_a_new_address_every_step_under_a_graph_budget_stop_being_captured),
    cmocka_unit_test(test_a_buffer_cycling_through_a_few_addresses_settles_into_replays),
    cmocka_unit_test(test_double_buffered_weights_reloaded_update_both_nodes),
    cmocka_unit_test(test_a_node_evicted_before_it_replayed_records_again_within_the_limit),
    cmocka_unit_test(test_weights_reloaded_more_often_than_the_rerecord_limit_update_in_place_at_every_reload),
    cmocka_unit_test(test_an_update_with_each_host_allocation_failing_changes_nothing),
    cmocka_unit_test(test_reloaded_gemm_weights_update_in_place_and_match_eager),
    cmocka_unit_test(test_a_view_of_moved_weights_moves_with_them_and_the_node_is_updated),
    cmocka_unit_test(test_a_budget_of_graphs_bounds_the_tree_and_results_stay_those_of_eager),
    cmocka_unit_test(test_a_byte_budget_evicts_to_stay_under_its_bytes),
    cmocka_unit_test(test_eviction_keeps_the_liveness_invariant),
    cmocka_unit_test(test_eviction_drops_a_fused_span_ending_at_the_evicted_node),
    cmocka_unit_test(test_nonsense_budgets_are_refused_and_make_no_tree),
    cmocka_unit_test(test_a_stale_subtree_pinned_by_an_eager_key_group_member_does_not_starve_the_budget),
    cmocka_unit_test(test_a_stale_subtree_pinned_by_a_warmup_key_group_member_does_not_starve_the_budget),
};
const size_t budget_test_count = sizeof budget_tests / sizeof budget_tests[0];
