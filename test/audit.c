/* audit.c — an audit of docs/api.md against the library, promise by
 * promise: tests for sentences the other files leave unchecked, and tests
 * of the places where the code did something else than the page said (each
 * failed when the audit was written; the code or the page has changed
 * since, and the comment says which).
 *
 * Each test names its promise; the comment above it quotes the sentence and
 * says how the library would have to break (or how it breaks now) for the
 * test to fail. Like contract.c it reaches the device only through the
 * public API and the kernel table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_lists.h"
#include "tree_hooks.h"

#define N 64

static cgt_value run_ok(cgt_tree *t, cgt_segment s, const cgt_arg *a, uint32_t n_args) {
  cgt_value out = {0};
  CHECK_OK(t, cgt_run(t, s, 0, a, n_args, &out, 1));
  CHECK_TREE(t);
  return out;
}

static void fill(float *h, float base, float step) {
  for (int i = 0; i < N; i++)
    h[i] = base + step * (float)i;
}

static void expect_floats(cgt_tree *t, cgt_value v, const float *expected, const char *what) {
  float got[N];
  test_read_value(t, v, got, N);
  for (int i = 0; i < N; i++)
    if (got[i] != expected[i])
      fail_msg("%s, element %d: got %g, expected %g", what, i, (double)got[i], (double)expected[i]);
}

/* Every counter of cgt_stats but host_allocs and the two peaks (the peak is
 * documented to include failed runs' allocations), and stale_uses when the
 * call is documented to count a stale use. */
static void expect_same_counters(const cgt_stats *before, const cgt_stats *after, int ignore_stale, const char *what) {
#define AUDIT_SAME(f)                                                                                         \
  if (strcmp(#f, "host_allocs") && !strstr(#f, "peak_bytes") && (!ignore_stale || strcmp(#f, "stale_uses")) && \
      before->f != after->f)                                                                                  \
    fail_msg("%s: stats.%s moved from %llu to %llu", what, #f, (unsigned long long)before->f,                 \
             (unsigned long long)after->f);
  CGT_STATS_FIELDS(AUDIT_SAME, AUDIT_SAME)
#undef AUDIT_SAME
}

/* expect_same_counters, but for the held-back replays a run launches before
 * its own work, which count as launched whether the run then succeeds or
 * not ("A failing call changes nothing", its exceptions): those must have
 * launched, as one fused launch of `runs` replays. */
static void expect_same_counters_but_held_launches(const cgt_stats *before, const cgt_stats *after, uint64_t runs,
                                                   const char *what) {
  if (after->fused_launches != before->fused_launches + 1 || after->fused_runs != before->fused_runs + runs)
    fail_msg("%s: the held-back replays were not launched as one fused launch of %llu (fused_launches %llu -> %llu,"
             " fused_runs %llu -> %llu)", what, (unsigned long long)runs, (unsigned long long)before->fused_launches,
             (unsigned long long)after->fused_launches, (unsigned long long)before->fused_runs,
             (unsigned long long)after->fused_runs);
  cgt_stats b = *before;
  b.fused_launches = after->fused_launches;
  b.fused_runs = after->fused_runs;
  expect_same_counters(&b, after, 0, what);
}

/* ------------------------------------------ deferred work and failing calls */

/* Two affine segments in a chain, the first reading a DYNAMIC input. */
typedef struct chain2 {
  test_affine u[2];
  cgt_segment s[2];
  float *x;
  cgt_value v[2];
} chain2;

static cgt_tree *defer_tree(void) {
  cgt_options o;
  cgt_options_init(&o);
  o.defer_launch = 1;
  return test_tree_new(CGT_MODE_TREE, &o);
}

static void chain2_open(cgt_tree *t, chain2 *c) {
  memset(c, 0, sizeof *c);
  c->u[0] = (test_affine){.a = 2, .b = 1, .n = N};
  c->u[1] = (test_affine){.a = -1, .b = 3, .n = N};
  c->s[0] = test_register_affine(t, "first", &c->u[0]);
  c->s[1] = test_register_affine(t, "second", &c->u[1]);
  float h[N];
  fill(h, 0, 1);
  c->x = test_dev_floats(h, N);
}

/* One step of the chain; with deferral its replays stay held back. */
static void chain2_step(cgt_tree *t, chain2 *c) {
  CHECK_OK(t, cgt_step_begin(t));
  cgt_arg a = cgt_arg_dynamic(c->x, N * sizeof(float));
  c->v[0] = run_ok(t, c->s[0], &a, 1);
  cgt_arg b = cgt_arg_value(c->v[0]);
  c->v[1] = run_ok(t, c->s[1], &b, 1);
}

/* A tree whose chain is fused: steps 0 and 1 warm up and record, step 2 is
 * the span's first flush, from step 3 on a flush is one fused launch; the
 * last step's replays are held back when it returns. */
static cgt_tree *fused_chain(chain2 *c) {
  cgt_tree *t = defer_tree();
  chain2_open(t, c);
  for (int step = 0; step < 5; step++)
    chain2_step(t, c);
  assert_true(test_stats(t).fused_launches >= 1);
  return t;
}

static void chain2_close(cgt_tree *t, chain2 *c) {
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(c->x);
  test_tree_free(t);
}

/* "A handle given to another tree is CGT_ERR_INVALID_ARGUMENT in every call
 * that takes a value, and changes nothing there" and "A failing call
 * changes nothing the caller can observe: ... counters unchanged". With
 * defer_launch, cgt_value_copy_out and cgt_value_ptr flushed the held-back
 * replays before they looked at the handle, so a refused call launched the
 * fused span and moved stats.fused_launches and stats.fused_runs (the
 * audit; value.c now checks the handle first). The cgt_flush at the end shows
 * that the work was still held back before the refused calls: it is the one
 * that must launch it. */
static void test_a_value_call_refusing_a_foreign_value_moves_no_counter_while_replays_are_held_back(void **state) {
  (void)state;
  chain2 c;
  cgt_tree *t = fused_chain(&c);
  cgt_tree *other = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine ou = {.a = 1, .b = 0, .n = N};
  cgt_segment os = test_register_affine(other, "other", &ou);
  cgt_arg oa = cgt_arg_static(c.x, N * sizeof(float));
  cgt_value foreign = run_ok(other, os, &oa, 1);

  cgt_stats before = test_stats(t);
  float host[N];
  void *p = NULL;
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_value_copy_out(t, foreign, host, sizeof host));
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_value_ptr(t, foreign, &p, NULL));
  cgt_stats after = test_stats(t);
  expect_same_counters(&before, &after, 0, "cgt_value_copy_out and cgt_value_ptr refusing a value of another tree");
  CHECK_OK(t, cgt_flush(t));
  assert_int_equal(test_stats(t).fused_launches, before.fused_launches + 1);

  CHECK_OK(other, cgt_sync(other));
  test_tree_free(other);
  chain2_close(t, &c);
}

static cgt_status launch_failing(cgt_launch *l, void *user) {
  (void)l;
  (*(int *)user)++;
  return CGT_ERR_BACKEND;
}

/* "On any failure nothing changed: no values were made, no node was created
 * or changed state, no counter moved (except stale_uses)." A run that fails
 * (its launch function returns an error) after replays were held back:
 * node_run launches the held-back work first (the run's own work comes
 * after it on the stream), which counts as launched, as documented (the
 * exceptions of "A failing call changes nothing"); nothing else moves. */
static void test_a_run_that_fails_moves_no_counter_but_launches_the_replays_held_back_before_it(void **state) {
  (void)state;
  chain2 c;
  cgt_tree *t = fused_chain(&c);
  int calls = 0;
  cgt_segment_desc d = {"fails", launch_failing, &calls, 1, 1, 0};
  cgt_segment bad = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &bad));

  cgt_stats before = test_stats(t);
  size_t nodes = test_node_count(t);
  cgt_arg a = cgt_arg_value(c.v[1]);
  cgt_value out = {0};
  CHECK_STATUS(t, CGT_ERR_SEGMENT_FAILED, cgt_run(t, bad, 0, &a, 1, &out, 1));
  assert_int_equal(calls, 1);
  CHECK_TREE(t);
  cgt_stats after = test_stats(t);
  assert_int_equal(test_node_count(t), nodes);
  expect_same_counters_but_held_launches(&before, &after, 2, "a run whose launch function failed");
  chain2_close(t, &c);
}

/* "On any failure nothing changed: ... no counter moved (except
 * stale_uses, host_allocs, ...)". A run refused for a NULL STATIC pointer,
 * the first run of a segment with more arguments than any before: cgt_run
 * grows its argument and key arrays before it looks at the arguments
 * (tree.c), which host_allocs counts, as documented; every other counter
 * stays. */
static void test_a_run_refused_at_its_first_use_of_more_arguments_moves_no_counter_but_host_allocs(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u = {.a = 1, .b = 0, .n = N};
  cgt_segment s = test_register_add2(t, "add2", &u);
  float *x = test_dev_floats(NULL, N);
  cgt_stats before = test_stats(t);
  cgt_arg a[2] = {cgt_arg_static(x, N * sizeof(float)), cgt_arg_static(NULL, N * sizeof(float))};
  cgt_value out = {0};
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, s, 0, a, 2, &out, 1));
  cgt_stats after = test_stats(t);
  expect_same_counters(&before, &after, 0, "a refused run"); /* host_allocs may move: documented */
  test_dev_free(x);
  test_tree_free(t);
}

/* ----------------------------------------------------- update in place */

/* out = x + w: input 0 DYNAMIC, input 1 STATIC weights. */
static cgt_status launch_plus_weights(cgt_launch *l, void *user) {
  (*(int *)user)++;
  void *out;
  size_t n = cgt_launch_input_bytes(l, 0) / sizeof(float);
  cgt_status st = cgt_launch_alloc(l, n * sizeof(float), &out);
  if (st == CGT_OK)
    st = test_kernels()->add(cgt_launch_stream(l), cgt_launch_input(l, 0), cgt_launch_input(l, 1), out, n);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, n * sizeof(float)) : st;
}

typedef struct weights_fixture {
  int calls;
  cgt_segment s;
  float *x;
} weights_fixture;

static cgt_tree *weights_tree(weights_fixture *f) {
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  memset(f, 0, sizeof *f);
  cgt_segment_desc d = {"plus_weights", launch_plus_weights, &f->calls, 2, 1, 0};
  CHECK_OK(t, cgt_segment_register(t, &d, &f->s));
  float h[N];
  fill(h, 0, 1);
  f->x = test_dev_floats(h, N);
  return t;
}

static float *weights_buffer(float value) {
  float h[N];
  fill(h, value, 0);
  return test_dev_floats(h, N);
}

/* One step x + w, checked against x[i] = i and w holding w_value. */
static void weights_step(cgt_tree *t, weights_fixture *f, float *w, float w_value, const char *what) {
  CHECK_OK(t, cgt_step_begin(t));
  cgt_arg a[2] = {cgt_arg_dynamic(f->x, N * sizeof(float)), cgt_arg_static(w, N * sizeof(float))};
  cgt_value v = run_ok(t, f->s, a, 2);
  float expected[N];
  fill(expected, w_value, 1);
  expect_floats(t, v, expected, what);
}

/* "A sibling recorded or updated in the last 4 steps is not updated", at
 * its edge. The node records at step r and replays after it; weights that
 * move at step r + 3 (the recording is one of the last 4 steps: r, r + 1,
 * r + 2, r + 3) get a new node of their own, not an update; in a second
 * tree weights that move at step r + 4 (the last 4 steps are r + 1 ..
 * r + 4) update the node in place. Fails if the window is 3 steps or 5
 * (UPDATE_QUIET_STEPS), which no other test notices: they move weights
 * 1 step or 6 steps after a recording. */
static void test_a_sibling_recorded_in_the_last_4_steps_is_not_updated_in_place(void **state) {
  (void)state;
  for (int wait = 3; wait <= 4; wait++) {
    weights_fixture f;
    cgt_tree *t = weights_tree(&f);
    float *w1 = weights_buffer(1), *w2 = weights_buffer(2);
    weights_step(t, &f, w1, 1, "warmup");    /* step r - 1 */
    weights_step(t, &f, w1, 1, "recording"); /* step r */
    assert_int_equal(test_stats(t).recordings, 1);
    for (int k = 1; k < wait; k++)
      weights_step(t, &f, w1, 1, "replay"); /* steps r + 1 .. r + wait - 1 */
    assert_int_equal(test_stats(t).replays, (uint64_t)(wait - 1));
    weights_step(t, &f, w2, 2, "moved weights"); /* step r + wait */
    cgt_stats s = test_stats(t);
    if (wait < 4) {
      if (s.updates != 0 || test_node_count(t) != 2)
        fail_msg("weights moved %d steps after the recording: %llu updates, %zu nodes (expected 0 and 2)", wait,
                 (unsigned long long)s.updates, test_node_count(t));
    } else {
      if (s.updates != 1 || test_node_count(t) != 1)
        fail_msg("weights moved %d steps after the recording: %llu updates, %zu nodes (expected 1 and 1)", wait,
                 (unsigned long long)s.updates, test_node_count(t));
    }
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(w1);
    test_dev_free(w2);
    test_dev_free(f.x);
    test_tree_free(t);
  }
}

static int prelaunch_fail_next;
static int prelaunch_calls;
static cgt_status prelaunch_maybe_failing(void *user, void *stream, uint64_t variant) {
  (void)user, (void)stream, (void)variant;
  prelaunch_calls++;
  if (prelaunch_fail_next) {
    prelaunch_fail_next = 0;
    return CGT_ERR_BACKEND;
  }
  return CGT_OK;
}

/* "Failures: a run that updates in place fails like any other, changing
 * nothing; if its first launch fails, the executable is updated back
 * first." The prelaunch function fails the first launch of an update (the
 * capture for the moved weights fitted, the executable was updated): the
 * run fails with CGT_ERR_SEGMENT_FAILED, no counter moves, and the node
 * still replays with the old weights, reading the old buffer (which now
 * holds other numbers than the new one). Fails if update__exec_undo is not
 * called: the executable then reads the new buffer. */
static void test_an_update_whose_first_launch_fails_updates_the_executable_back(void **state) {
  (void)state;
  weights_fixture f;
  cgt_tree *t = weights_tree(&f);
  CHECK_OK(t, cgt_segment_set_prelaunch(t, f.s, prelaunch_maybe_failing, NULL));
  prelaunch_fail_next = 0;
  float *w1 = weights_buffer(1), *w2 = weights_buffer(5);
  for (int step = 0; step < 7; step++)
    weights_step(t, &f, w1, 1, "first weights");
  cgt_stats before = test_stats(t);
  assert_int_equal(before.recordings, 1);

  CHECK_OK(t, cgt_step_begin(t));
  int calls = f.calls;
  prelaunch_fail_next = 1;
  cgt_arg a[2] = {cgt_arg_dynamic(f.x, N * sizeof(float)), cgt_arg_static(w2, N * sizeof(float))};
  cgt_value out = {0};
  CHECK_STATUS(t, CGT_ERR_SEGMENT_FAILED, cgt_run(t, f.s, 0, a, 2, &out, 1));
  assert_int_equal(f.calls, calls + 1); /* it was captured: the failure came at the launch */
  assert_int_equal(prelaunch_fail_next, 0);
  CHECK_TREE(t);
  cgt_stats after = test_stats(t);
  expect_same_counters(&before, &after, 0, "an update whose first launch failed");
  assert_int_equal(test_node_count(t), 1);

  /* The old weights replay and read the old buffer. */
  for (int step = 0; step < 2; step++)
    weights_step(t, &f, w1, 1, "first weights after the failed update");
  assert_int_equal(test_stats(t).replays, before.replays + 2);
  assert_int_equal(test_stats(t).recordings, before.recordings);
  /* And the update, tried again, goes through. */
  weights_step(t, &f, w2, 5, "moved weights");
  assert_int_equal(test_stats(t).updates, 1);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(w1);
  test_dev_free(w2);
  test_dev_free(f.x);
  test_tree_free(t);
}


/* ------------------------------------------------------------- eviction */

static cgt_tree *budget_tree(uint32_t max_graphs) {
  cgt_options o;
  cgt_options_init(&o);
  o.max_graphs = max_graphs;
  return test_tree_new(CGT_MODE_TREE, &o);
}

static const cgt_node_info *node_with_id(const cgt_node_info *info, size_t n, uint32_t id) {
  for (size_t i = 0; i < n; i++)
    if (info[i].id == id)
      return &info[i];
  return NULL;
}

/* The budget section, sentence by sentence, with exact numbers: "each time
 * the RECORDED node with the oldest replay or recording that is not on the
 * current path, has no RECORDED node below it, and is the last of its key
 * group goes, with its subtree"; "the node goes back to WARMUP, keeps its
 * id and counters, and records again at the next run that reaches it (its
 * segment has warmed up already, so no warmup run is needed)"; "ids are
 * never reused"; "stats.evictions counts the recordings dropped ...,
 * stats.nodes_evicted the descendants removed, stats.graphs and
 * stats.graph_bytes what is held now"; the evict_reason text. With
 * max_graphs = 2: a path a1 -> a2 records and replays, then a root b
 * records, a third graph: a1 is the oldest, but a2 below it is a
 * recording, so a2 goes, the oldest leaf (before, a1 went and took a2
 * with it: two newer recordings for one old one). The other tests check
 * evictions > 0 only; this one fails if an inner recording goes where a
 * leaf may, if the newest recording goes instead of the oldest leaf, if
 * the evicted node loses its replays or its id, or if it warms up again. */
static void test_a_budget_of_two_graphs_evicts_the_oldest_leaf_recording_and_counts_exactly(void **state) {
  (void)state;
  cgt_tree *t = budget_tree(2);
  test_affine ua1 = {.a = 2, .b = 1, .n = N}, ua2 = {.a = 3, .b = 0, .n = N}, ub = {.a = -1, .b = 0, .n = N};
  cgt_segment a1 = test_register_affine(t, "a1", &ua1), a2 = test_register_affine(t, "a2", &ua2),
              b = test_register_affine(t, "b", &ub);
  float h[N];
  fill(h, 0, 1);
  float *x = test_dev_floats(h, N);
  cgt_arg ax = cgt_arg_static(x, N * sizeof(float));
  for (int step = 0; step < 3; step++) { /* warmup, record, replay */
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value v = run_ok(t, a1, &ax, 1);
    cgt_arg av = cgt_arg_value(v);
    (void)run_ok(t, a2, &av, 1);
  }
  cgt_stats s0 = test_stats(t);
  assert_int_equal(s0.recordings, 2);
  assert_int_equal(s0.replays, 2);
  assert_int_equal(s0.graphs, 2);
  for (int step = 0; step < 2; step++) { /* b: warmup, then its recording is the third graph */
    CHECK_OK(t, cgt_step_begin(t));
    (void)run_ok(t, b, &ax, 1);
  }
  cgt_stats s1 = test_stats(t);
  assert_int_equal(s1.recordings, 3);
  if (s1.evictions != 1 || s1.nodes_evicted != 0 || s1.graphs != 2 || s1.nodes != 3)
    fail_msg("after the third recording: evictions %llu (expected 1: a2's, the oldest leaf), nodes_evicted %llu "
             "(expected 0), graphs %llu (expected 2), nodes %llu (expected 3)",
             (unsigned long long)s1.evictions, (unsigned long long)s1.nodes_evicted, (unsigned long long)s1.graphs,
             (unsigned long long)s1.nodes);
  cgt_node_info info[8];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 8, &n));
  assert_int_equal(n, 3);
  const cgt_node_info *na1 = node_with_id(info, n, 1), *na2 = node_with_id(info, n, 2), *nb = node_with_id(info, n, 3);
  assert_non_null(na1);
  assert_non_null(na2);
  assert_non_null(nb);
  assert_int_equal(na1->state, CGT_NODE_RECORDED);
  assert_int_equal(na1->evictions, 0);
  assert_int_equal(na2->segment, a2);
  assert_int_equal(na2->parent, 1);
  assert_int_equal(na2->state, CGT_NODE_WARMUP);
  assert_int_equal(na2->replays, 1); /* counters kept */
  assert_int_equal(na2->evictions, 1);
  assert_non_null(na2->evict_reason);
  assert_string_equal(na2->evict_reason,
                      "recording budget: more than max_graphs recorded graphs; least recently replayed");
  assert_int_equal(nb->state, CGT_NODE_RECORDED);
  assert_int_equal(nb->evictions, 0);
  assert_null(nb->evict_reason);

  /* Path a again: a1 replays, a2 records at once (no warmup) under its old
   * id, and its recording evicts b, the one recording off the path. */
  int a1_calls = ua1.calls, a2_calls = ua2.calls;
  CHECK_OK(t, cgt_step_begin(t));
  cgt_value v = run_ok(t, a1, &ax, 1);
  cgt_arg av = cgt_arg_value(v);
  cgt_value w = run_ok(t, a2, &av, 1);
  float got[N];
  test_read_value(t, w, got, N);
  for (int i = 0; i < N; i++)
    assert_true(got[i] == 3 * (2 * h[i] + 1));
  cgt_stats s2 = test_stats(t);
  assert_int_equal(ua1.calls, a1_calls);     /* a replay */
  assert_int_equal(ua2.calls, a2_calls + 1); /* one capture, no warmup */
  assert_int_equal(s2.warmups, s1.warmups);
  assert_int_equal(s2.recordings, s1.recordings + 1);
  assert_int_equal(s2.evictions, s1.evictions + 1);
  assert_int_equal(s2.nodes_evicted, s1.nodes_evicted);
  assert_int_equal(s2.graphs, 2);
  CHECK_OK(t, cgt_tree_nodes(t, info, 8, &n));
  assert_int_equal(n, 3);
  assert_int_equal(node_with_id(info, n, 1)->state, CGT_NODE_RECORDED);
  assert_int_equal(node_with_id(info, n, 2)->state, CGT_NODE_RECORDED);
  assert_int_equal(node_with_id(info, n, 2)->evictions, 1);
  assert_int_equal(node_with_id(info, n, 3)->state, CGT_NODE_WARMUP);
  assert_int_equal(node_with_id(info, n, 3)->evictions, 1);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

/* ------------------------------------------------------------ pool figures */

/* "pool_allocated_bytes is what the allocator holds now: ... (0 after
 * cgt_step_begin). ... In CGT_MODE_SEPARATE ... a private pool is emptied
 * when its node runs next, not at cgt_step_begin". In TREE and EAGER mode
 * the figure reads 0 right after cgt_step_begin; in SEPARATE mode it reads
 * what the node's last run left, and the node's next run empties its pool
 * first, so the figure never grows from step to step. */
static void test_pool_allocated_bytes_reads_0_after_step_begin_and_separate_pools_empty_at_their_next_run(
    void **state) {
  (void)state;
  static const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_EAGER};
  static const char *const names[] = {"TREE", "EAGER"};
  for (int m = 0; m < 2; m++) {
    cgt_tree *t = test_tree_new(modes[m], NULL);
    test_affine u = {.a = 2, .b = 1, .n = N};
    cgt_segment s = test_register_affine(t, "a", &u);
    float *x = test_dev_floats(NULL, N);
    cgt_arg ax = cgt_arg_static(x, N * sizeof(float));
    for (int step = 0; step < 3; step++) {
      CHECK_OK(t, cgt_step_begin(t));
      assert_true(test_stats(t).pool_reserved_bytes == 0 || step > 0);
      if (test_stats(t).pool_allocated_bytes != 0)
        fail_msg("%s mode, step %d: pool_allocated_bytes is %zu right after cgt_step_begin", names[m], step,
                 test_stats(t).pool_allocated_bytes);
      (void)run_ok(t, s, &ax, 1);
    }
    CHECK_OK(t, cgt_step_begin(t));
    if (test_stats(t).pool_allocated_bytes != 0)
      fail_msg("%s mode: pool_allocated_bytes is %zu right after cgt_step_begin", names[m],
               test_stats(t).pool_allocated_bytes);
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(x);
    test_tree_free(t);
  }
  cgt_tree *t = test_tree_new(CGT_MODE_SEPARATE, NULL);
  test_affine u = {.a = 2, .b = 1, .n = N};
  cgt_segment s = test_register_affine(t, "a", &u);
  float *x = test_dev_floats(NULL, N);
  cgt_arg ax = cgt_arg_static(x, N * sizeof(float));
  size_t after_run[6];
  for (int step = 0; step < 6; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    size_t left = test_stats(t).pool_allocated_bytes;
    if (step > 0 && left != after_run[step - 1])
      fail_msg("SEPARATE mode, step %d: %zu bytes after cgt_step_begin, the last run left %zu", step, left,
               after_run[step - 1]);
    (void)run_ok(t, s, &ax, 1);
    after_run[step] = test_stats(t).pool_allocated_bytes;
    assert_true(after_run[step] > 0);
    if (step > 0 && after_run[step] != after_run[step - 1])
      fail_msg("SEPARATE mode, step %d: the node's run left %zu bytes, the run before %zu: its pool was not emptied",
               step, after_run[step], after_run[step - 1]);
  }
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}


/* --------------------------------------------------------- last error */

/* "cgt_tree_last_error(t): the message of the last failing call on t, ""
 * if none; a run that succeeded by running its node eagerly because the
 * capture failed leaves that capture's failure here too (the node's reason
 * keeps it)", and "Capture failures are not errors here": the run returns
 * CGT_OK, and the message names the capture's failure (the torch door
 * reads it there to say why a graph runs plainly). Before the audit the
 * docs promised "" here. */
static void test_a_capture_failure_that_recovers_returns_ok_and_leaves_its_message_as_last_error(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u = {.a = 2, .b = 1, .n = N, .illegal = 1};
  cgt_segment s = test_register_affine(t, "syncs", &u);
  float *x = test_dev_floats(NULL, N);
  for (int step = 0; step < 3; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    (void)test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
  }
  assert_int_equal(test_stats(t).capture_failures, 1); /* the capture failed, and the run succeeded */
  if (!strstr(cgt_tree_last_error(t), "capture failed"))
    fail_msg("after a capture that failed and a run that recovered, cgt_tree_last_error reads \"%s\"",
             cgt_tree_last_error(t));
  cgt_node_info info[1];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 1, &n));
  assert_int_equal(info[0].state, CGT_NODE_EAGER);
  assert_non_null(info[0].reason);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}

/* ------------------------------------------------------- string lifetimes */

/* "The strings in a record (reason, segment_name) are owned by the tree and
 * valid until cgt_tree_destroy." An EAGER node (a segment declared
 * uncapturable) below a WARMUP node is removed with it by pruning
 * (prune_after_steps). node__destroy freed its reason, so the reason of a
 * record read earlier dangled before cgt_tree_destroy (the audit; a
 * heap-use-after-free under AddressSanitizer). Reasons are now the tree's
 * texts, kept once each until cgt_tree_destroy (tree__intern). Without
 * AddressSanitizer the test allocates blocks of the reason's size and fills
 * them, which on glibc would hand a freed block back and overwrite it. */
static void test_a_nodes_reason_string_stays_valid_until_tree_destroy_even_after_the_node_is_pruned(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.prune_after_steps = 2;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  test_affine up = {.a = 1, .b = 1, .n = N}, uc = {.a = 2, .b = 0, .n = N}, uq = {.a = 1, .b = 0, .n = N};
  cgt_segment p = test_register_affine(t, "parent", &up);
  cgt_segment c = test_register_affine_flags(t, "child", &uc, CGT_SEGMENT_NO_CAPTURE);
  cgt_segment q = test_register_affine(t, "elsewhere", &uq);
  float *x = test_dev_floats(NULL, N);
  cgt_arg ax = cgt_arg_static(x, N * sizeof(float));
  /* Step 0: parent warms up (WARMUP), child below it is EAGER for good. */
  cgt_value v = run_ok(t, p, &ax, 1);
  cgt_arg av = cgt_arg_value(v);
  (void)run_ok(t, c, &av, 1);
  cgt_node_info info[8];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 8, &n));
  assert_int_equal(n, 2);
  assert_int_equal(info[0].state, CGT_NODE_WARMUP);
  assert_int_equal(info[1].state, CGT_NODE_EAGER);
  const char *reason = info[1].reason;
  assert_non_null(reason);
  assert_string_equal(reason, "declared uncapturable");
  /* Steps elsewhere until the parent is pruned with its child. */
  for (int step = 0; step < 8 && test_stats(t).nodes_pruned == 0; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    (void)run_ok(t, q, &ax, 1);
  }
  assert_true(test_stats(t).nodes_pruned >= 2);
  char *fill_blocks[64];
  for (int i = 0; i < 64; i++) {
    fill_blocks[i] = malloc(sizeof "declared uncapturable");
    assert_non_null(fill_blocks[i]);
    memset(fill_blocks[i], 'X', sizeof "declared uncapturable");
  }
  int same = strncmp(reason, "declared uncapturable", sizeof "declared uncapturable") == 0;
  for (int i = 0; i < 64; i++)
    free(fill_blocks[i]);
  if (!same)
    fail_msg("the reason string of a node record read before the node was pruned no longer reads "
             "\"declared uncapturable\" before cgt_tree_destroy");
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}


/* The prelaunch section: "A status other than CGT_OK fails the run with
 * CGT_ERR_SEGMENT_FAILED, and the run changes nothing, whether it was
 * recording or replaying." A path first -> second -> third, where third has
 * a prelaunch function: with defer_launch the replays of first and second
 * are held back and fused (third's replays are never held back). When
 * third's prelaunch function fails at a replay, the run has already
 * launched the held-back span, which counts as launched, as documented
 * ("A failing call changes nothing", its exceptions); nothing else moves. */
static void test_a_replay_whose_prelaunch_fails_moves_no_counter_but_launches_the_replays_held_back_before_it(
    void **state) {
  (void)state;
  cgt_tree *t = defer_tree();
  chain2 c;
  chain2_open(t, &c);
  test_affine u3 = {.a = 1, .b = -1, .n = N};
  cgt_segment third = test_register_affine(t, "third", &u3);
  CHECK_OK(t, cgt_segment_set_prelaunch(t, third, prelaunch_maybe_failing, NULL));
  prelaunch_fail_next = 0;
  for (int step = 0; step < 5; step++) {
    chain2_step(t, &c);
    cgt_arg a = cgt_arg_value(c.v[1]);
    (void)run_ok(t, third, &a, 1);
  }
  cgt_stats s = test_stats(t);
  assert_true(s.fused_launches >= 1);
  chain2_step(t, &c); /* first and second held back */
  cgt_stats before = test_stats(t);
  prelaunch_fail_next = 1;
  cgt_arg a = cgt_arg_value(c.v[1]);
  cgt_value out = {0};
  CHECK_STATUS(t, CGT_ERR_SEGMENT_FAILED, cgt_run(t, third, 0, &a, 1, &out, 1));
  assert_int_equal(prelaunch_fail_next, 0);
  CHECK_TREE(t);
  cgt_stats after = test_stats(t);
  expect_same_counters_but_held_launches(&before, &after, 2, "a replay whose prelaunch function failed");
  chain2_close(t, &c);
}


/* The budget section: "The bytes of a recording are its checkpoint's host
 * bytes plus the backend's estimate of its executable ...; a recording
 * updated in place also keeps the graph its executable was made from, and
 * counts it too (about twice the bytes): stats.graph_bytes is what the cap
 * compares." The first update adds that graph's bytes; later updates keep
 * the same first graph, so the bytes grow no further. */
static void test_a_recording_updated_in_place_counts_the_graph_it_keeps_once(void **state) {
  (void)state;
  weights_fixture f;
  cgt_tree *t = weights_tree(&f);
  float *w1 = weights_buffer(1), *w2 = weights_buffer(2), *w3 = weights_buffer(3);
  for (int step = 0; step < 7; step++)
    weights_step(t, &f, w1, 1, "first weights");
  cgt_stats s0 = test_stats(t);
  assert_int_equal(s0.graphs, 1);
  assert_true(s0.graph_bytes > 0);
  for (int step = 0; step < 7; step++)
    weights_step(t, &f, w2, 2, "second weights");
  cgt_stats s1 = test_stats(t);
  assert_int_equal(s1.updates, 1);
  assert_int_equal(s1.update_fallbacks, 0);
  assert_int_equal(s1.graphs, 1);
  for (int step = 0; step < 7; step++)
    weights_step(t, &f, w3, 3, "third weights");
  cgt_stats s2 = test_stats(t);
  assert_int_equal(s2.updates, 2);
  if (s1.graph_bytes <= s0.graph_bytes || s1.graph_bytes > 2 * s0.graph_bytes || s2.graph_bytes != s1.graph_bytes)
    fail_msg("graph_bytes of one recording of one kernel: %zu, after one update in place %zu, after two %zu",
             s0.graph_bytes, s1.graph_bytes, s2.graph_bytes);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(w1);
  test_dev_free(w2);
  test_dev_free(w3);
  test_dev_free(f.x);
  test_tree_free(t);
}


/* ------------------------------------------------------ foreign values */

/* "A handle given to another tree is CGT_ERR_INVALID_ARGUMENT in every call
 * that takes a value ... The tag has 12 bits: trees made 4095 apart share a
 * tag, so a handle of one of them may pass for a handle of the other."
 * Every one of the 4094 trees made after a tree refuses its handle; the
 * 4095th has its tag (the documented limit: value.c, value__new_tag). */
static void test_a_value_of_another_tree_is_refused_by_the_4094_trees_made_after_its_own(void **state) {
  (void)state;
  cgt_tree *a = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine ua = {.a = 1, .b = 0, .n = N};
  cgt_segment sa = test_register_affine(a, "a", &ua);
  float h[N];
  fill(h, 7, 0);
  float *x = test_dev_floats(h, N);
  cgt_value va = test_run1(a, sa, 0, cgt_arg_static(x, N * sizeof(float)));
  uint64_t tag_a = va.bits >> 52;
  cgt_tree *b = NULL;
  test_affine ub = {.a = 0, .b = 1, .n = N};
  cgt_value vb = {0};
  int made = 0;
  for (int i = 0; i < 8192 && !b; i++) {
    cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
    made++;
    cgt_segment sb = test_register_affine(t, "b", &ub);
    vb = test_run1(t, sb, 0, cgt_arg_static(x, N * sizeof(float)));
    if (vb.bits >> 52 == tag_a) {
      b = t;
      break;
    }
    float got[N];
    cgt_status st = cgt_value_copy_out(t, va, got, sizeof got);
    if (st != CGT_ERR_INVALID_ARGUMENT)
      fail_msg("the %d-th tree made after a value's own took its handle %#llx: %s", made,
               (unsigned long long)va.bits, cgt_status_name(st));
    CHECK_OK(t, cgt_sync(t));
    test_tree_free(t);
  }
  assert_non_null(b); /* a tree with a's tag was made: the tags wrapped */
  assert_int_equal(made, 4095);
  CHECK_OK(b, cgt_sync(b));
  test_tree_free(b);
  CHECK_OK(a, cgt_sync(a));
  test_tree_free(a);
  test_dev_free(x);
}


/* "The tree calls it on the host right before each launch of one of the
 * segment's recorded graphs (the first launch of a recording, of an update
 * in place, and every replay)" and "Replays of such a segment are never
 * held back by defer_launch". A prelaunch function set on a segment whose
 * replay is held back at that moment: the replay is launched afterwards
 * (here by cgt_flush), so the function must run right before it.
 * A fused launch calls no prelaunch function, so the graph was launched
 * without it, while the same held replay launched node by node got the
 * call (the audit); fuse.c now launches held work node by node where a
 * segment of it has a prelaunch function. */
static void test_a_prelaunch_set_while_a_replay_is_held_back_runs_before_that_replays_launch(void **state) {
  (void)state;
  chain2 c;
  cgt_tree *t = fused_chain(&c); /* the last step's replays are held back */
  prelaunch_fail_next = 0;
  prelaunch_calls = 0;
  CHECK_OK(t, cgt_segment_set_prelaunch(t, c.s[1], prelaunch_maybe_failing, NULL));
  cgt_stats before = test_stats(t);
  CHECK_OK(t, cgt_flush(t));
  cgt_stats after = test_stats(t);
  assert_true(after.fused_launches == before.fused_launches + 1 || prelaunch_calls == 1);
  if (prelaunch_calls != 1)
    fail_msg("the held-back replay of a segment given a prelaunch function was launched (%s) with %d prelaunch calls",
             after.fused_launches > before.fused_launches ? "fused" : "node by node", prelaunch_calls);
  chain2_close(t, &c);
}


/* ------------------------------------------------------ names and errors */

/* Segments: "`name` is copied (`NULL` becomes `"segment"`)"; Small
 * queries: cgt_tree_last_error is "`"no tree"` for `NULL`". The NULL-tree
 * test of bad_input.c only checks that the string is not NULL, and no test
 * registers a segment without a name. Fails if the default name or the
 * NULL tree's text changes. */
static void test_a_segment_without_a_name_is_named_segment_and_a_null_trees_error_reads_no_tree(void **state) {
  (void)state;
  assert_string_equal(cgt_tree_last_error(NULL), "no tree");
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u = {.a = 1, .b = 0, .n = N};
  cgt_segment s = test_register_affine(t, NULL, &u);
  float *x = test_dev_floats(NULL, N);
  (void)test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
  cgt_node_info info[2];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 2, &n));
  assert_int_equal(n, 1);
  assert_non_null(info[0].segment_name);
  assert_string_equal(info[0].segment_name, "segment");
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}


/* Introspection: "cgt_tree_write_dot(t, f) ... a write f refuses (a stream
 * not open for writing, a full disk): CGT_ERR_BACKEND, with the cause in
 * cgt_tree_last_error". A full disk, as Linux's /dev/full gives it: every
 * write fails with ENOSPC. cgt_tree_write_dot looked only at ferror(f) and
 * never flushed, so a small tree's text sat in stdio's buffer, ferror was
 * clear and it returned CGT_OK; the failure showed only at the caller's
 * fclose (the audit; it now flushes). */
static void test_write_dot_to_a_full_disk_is_a_backend_error(void **state) {
  (void)state;
  FILE *f = fopen("/dev/full", "w");
  if (!f)
    skip();
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  test_affine u = {.a = 1, .b = 0, .n = N};
  cgt_segment s = test_register_affine(t, "a", &u);
  float *x = test_dev_floats(NULL, N);
  (void)test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
  cgt_status st = cgt_tree_write_dot(t, f);
  int close_failed = fclose(f) != 0;
  if (st != CGT_ERR_BACKEND)
    fail_msg("cgt_tree_write_dot to a full disk returned %s (the caller's fclose %s)", cgt_status_name(st),
             close_failed ? "then failed" : "succeeded");
  assert_non_null(strstr(cgt_tree_last_error(t), "cgt_tree_write_dot"));
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}


/* -------------------------------------------------- the fused-span cache */

/* Environment: "CGT_FUSE_CACHE=n | cap on cached fused executables per tree
 * with defer_launch (default 64; least recently used goes first)". The
 * fusion tests set the variable to 1; none checks the default. 70 distinct
 * spans (a root segment at 70 variants, each followed by a second segment)
 * each recur until fused; the dot file draws one blue edge per fused
 * executable held, and exactly 64 remain. Fails if the default changes
 * (FUSE_CACHE_DEFAULT 8 or 128, say). */
static void test_without_cgt_fuse_cache_a_tree_keeps_64_fused_executables(void **state) {
  (void)state;
  unsetenv("CGT_FUSE_CACHE");
  enum { SPANS = 70 };
  cgt_tree *t = defer_tree();
  test_affine ua = {.a = 2, .b = 1, .n = N}, ub = {.a = 1, .b = -1, .n = N};
  cgt_segment a = test_register_affine(t, "a", &ua), b = test_register_affine(t, "b", &ub);
  float *x = test_dev_floats(NULL, N);
  for (uint64_t v = 0; v < SPANS; v++) {
    for (int k = 0; k < 4; k++) { /* warmup, record, first flush, second flush (fused) */
      CHECK_OK(t, cgt_step_begin(t));
      cgt_value va = test_run1(t, a, v, cgt_arg_static(x, N * sizeof(float)));
      (void)test_run1(t, b, 0, cgt_arg_value(va));
    }
    CHECK_OK(t, cgt_flush(t));
  }
  assert_int_equal(test_stats(t).fused_launches, SPANS);
  size_t cap = (size_t)1 << 20;
  char *dot = malloc(cap);
  assert_non_null(dot);
  test_dot_text(t, dot, cap);
  int fused = 0;
  for (const char *p = dot; (p = strstr(p, "fused span:")) != NULL; p++)
    fused++;
  free(dot);
  if (fused != 64)
    fail_msg("%d fused spans recurred; the tree holds %d fused executables, expected the default cap of 64", SPANS,
             fused);
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x);
  test_tree_free(t);
}


/* Update in place at a site that has reached rerecord_limit. The budget
 * section: "when a run's key differs from a RECORDED sibling's only in
 * STATIC addresses, the run is captured again, and if the capture leaves
 * ... exactly as the sibling's recording did, the sibling's executable is
 * updated ... the run's node takes the sibling's place ... the tree does
 * not grow", and "weights reloaded now and then update each node once,
 * which then replays, ready for the next reload". An update adds no
 * recorded child, so rerecord_limit ("recorded children per (parent,
 * segment, variant)") is not passed by it. With rerecord_limit = 2 and a
 * site that holds two recordings (double-buffered weights, both replayed
 * and quiet), a reload of one buffer is a new key past the limit, and it
 * ran eagerly on the overflow node (the audit), where under a limit of 3
 * it updated. Looking for an update first was tried and taken back: a
 * buffer at a new address at every call then took over the recording of
 * a fixed buffer beside it, which lost its replays for good. docs/api.md
 * now says so: "Past the limit nothing is captured, updates included".
 * Under a limit of 3 the reload updates; under 2 it runs eagerly, right. */
static void test_reloaded_weights_update_in_place_below_rerecord_limit_and_run_eagerly_at_it(void **state) {
  (void)state;
  for (uint32_t limit = 3; limit >= 2; limit--) {
    weights_fixture f;
    cgt_options o;
    cgt_options_init(&o);
    o.rerecord_limit = limit;
    cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
    memset(&f, 0, sizeof f);
    cgt_segment_desc d = {"plus_weights", launch_plus_weights, &f.calls, 2, 1, 0};
    CHECK_OK(t, cgt_segment_register(t, &d, &f.s));
    float h[N];
    fill(h, 0, 1);
    f.x = test_dev_floats(h, N);
    float *w[2] = {weights_buffer(1), weights_buffer(2)};
    for (int step = 0; step < 16; step++) /* a node per buffer, both replayed, and quiet */
      weights_step(t, &f, w[step % 2], (float)(1 + step % 2), "double buffered");
    cgt_stats s0 = test_stats(t);
    assert_int_equal(s0.recordings, 2);
    assert_int_equal(test_node_count(t), 2);
    CHECK_OK(t, cgt_sync(t));
    float *old = w[0];
    w[0] = weights_buffer(5); /* reload buffer 0 */
    test_dev_free(old);
    for (int step = 0; step < 4; step++)
      weights_step(t, &f, w[0], 5, "reloaded buffer");
    cgt_stats s1 = test_stats(t);
    if (limit == 2 && s1.updates == 0 && s1.eager_runs - s0.eager_runs == 4 && s1.recordings == s0.recordings)
      ; /* the documented limit: past it nothing is captured */
    else if (limit == 2 || s1.updates != 1 || test_node_count(t) != 2 || s1.replays - s0.replays != 3)
      fail_msg("rerecord_limit %u, a site with 2 recordings, one buffer reloaded: %llu updates (expected 1), %zu nodes "
               "(expected 2), %llu eager runs and %llu replays in the 4 steps after",
               limit, (unsigned long long)s1.updates, test_node_count(t),
               (unsigned long long)(s1.eager_runs - s0.eager_runs), (unsigned long long)(s1.replays - s0.replays));
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(w[0]);
    test_dev_free(w[1]);
    test_dev_free(f.x);
    test_tree_free(t);
  }
}


/* Options, rerecord_limit: "A recording the budget evicted before it
 * replayed (since it was last recorded or updated) still counts, until it
 * is pruned". With rerecord_limit = 1, max_graphs = 1 and
 * prune_after_steps = 4: S records for w1 and is evicted, unreplayed, by
 * another root's recording; S at a new address w2 then runs on the
 * overflow node (the evicted recording counts); once the evicted node is
 * pruned it counts no more, and S at a third address w3 records. The
 * budget tests check that such a node counts; none checks that pruning
 * ends it. Fails if pruning spares evicted nodes (node__prune). */
static void test_an_evicted_unreplayed_recording_stops_counting_toward_rerecord_limit_once_pruned(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.rerecord_limit = 1;
  o.max_graphs = 1;
  o.prune_after_steps = 4;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  weights_fixture f;
  memset(&f, 0, sizeof f);
  cgt_segment_desc d = {"plus_weights", launch_plus_weights, &f.calls, 2, 1, 0};
  CHECK_OK(t, cgt_segment_register(t, &d, &f.s));
  float h[N];
  fill(h, 0, 1);
  f.x = test_dev_floats(h, N);
  test_affine uq = {.a = 1, .b = 0, .n = N};
  cgt_segment q = test_register_affine(t, "q", &uq);
  float *w1 = weights_buffer(1), *w2 = weights_buffer(2), *w3 = weights_buffer(3);
  cgt_arg aq = cgt_arg_static(f.x, N * sizeof(float));

  weights_step(t, &f, w1, 1, "w1 warmup");
  weights_step(t, &f, w1, 1, "w1 recording");
  for (int k = 0; k < 2; k++) { /* q warms up, then records: S's recording is evicted */
    CHECK_OK(t, cgt_step_begin(t));
    (void)run_ok(t, q, &aq, 1);
  }
  cgt_stats s0 = test_stats(t);
  assert_int_equal(s0.recordings, 2);
  assert_int_equal(s0.evictions, 1);
  weights_step(t, &f, w2, 2, "w2 past the limit");
  cgt_stats s1 = test_stats(t);
  assert_int_equal(s1.recordings, s0.recordings); /* the evicted recording counts: overflow */
  assert_int_equal(s1.eager_runs, s0.eager_runs + 1);
  for (int k = 0; k < 12; k++) {
    CHECK_OK(t, cgt_step_begin(t));
    (void)run_ok(t, q, &aq, 1);
  }
  cgt_stats s2 = test_stats(t);
  assert_true(s2.nodes_pruned >= 1);
  weights_step(t, &f, w3, 3, "w3 after the evicted node was pruned");
  cgt_stats s3 = test_stats(t);
  if (s3.recordings != s2.recordings + 1)
    fail_msg("after the evicted, unreplayed recording was pruned (%llu nodes pruned), a new key made %llu recordings "
             "and %llu eager runs (expected 1 recording)",
             (unsigned long long)s2.nodes_pruned, (unsigned long long)(s3.recordings - s2.recordings),
             (unsigned long long)(s3.eager_runs - s2.eager_runs));
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(w1);
  test_dev_free(w2);
  test_dev_free(w3);
  test_dev_free(f.x);
  test_tree_free(t);
}


/* `variant` kernels out = 2 * out + 1 in a row, on a copy of input 0: a
 * recording whose size grows with its variant. */
static cgt_status launch_repeat(cgt_launch *l, void *user) {
  (void)user;
  size_t n = cgt_launch_input_bytes(l, 0) / sizeof(float);
  void *out;
  cgt_status st = cgt_launch_alloc(l, n * sizeof(float), &out);
  if (st == CGT_OK)
    st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), 1, 0, out, n);
  for (uint64_t k = 0; k < cgt_launch_variant(l) && st == CGT_OK; k++)
    st = test_kernels()->affine(cgt_launch_stream(l), out, 2, 1, out, n);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, n * sizeof(float)) : st;
}

/* Records `repeat` at the root with variants 1, 2 and `big`, two steps each
 * (warmup, recording); *bytes receives stats.graph_bytes after each. */
static void record_three(cgt_tree *t, uint64_t big, float *x, size_t bytes[3], uint64_t evictions[3]) {
  cgt_segment_desc d = {"repeat", launch_repeat, NULL, 1, 1, 0};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  const uint64_t variants[3] = {1, 2, big};
  for (int i = 0; i < 3; i++) {
    for (int k = 0; k < 2; k++) {
      CHECK_OK(t, cgt_step_begin(t));
      (void)test_run1(t, s, variants[i], cgt_arg_static(x, N * sizeof(float)));
    }
    bytes[i] = test_stats(t).graph_bytes;
    evictions[i] = test_stats(t).evictions;
  }
}

/* The budget: "A recording that leaves the tree holding ... more than
 * max_graph_bytes in them, evicts until the tree is back within the
 * budget: each time the RECORDED node with the oldest replay or recording
 * ... goes". Three root recordings a < b < c in bytes, under a cap that
 * holds a + b and c alone but not b + c: c's recording must evict a, then
 * b. Sizes are measured first in a tree without a budget (the simulator's
 * are exact). The byte-budget test never needs two evictions at one
 * recording; this one fails if a recording evicts only once (evict.c,
 * evict__enforce: `if` for `while`). */
static void test_a_recording_evicts_until_the_tree_is_back_within_its_byte_budget(void **state) {
  (void)state;
  float *x = test_dev_floats(NULL, N);
  size_t probe[3];
  uint64_t ev[3];
  uint64_t big = 4;
  for (;; big *= 2) { /* c must weigh at least CGT_MIN_GRAPH_BYTES, so that the cap is allowed */
    cgt_tree *p = test_tree_new(CGT_MODE_TREE, NULL);
    record_three(p, big, x, probe, ev);
    CHECK_OK(p, cgt_sync(p));
    test_tree_free(p);
    if (probe[2] - probe[1] >= CGT_MIN_GRAPH_BYTES || big > 4096)
      break;
  }
  size_t a = probe[0], b = probe[1] - probe[0], c = probe[2] - probe[1];
  assert_true(a < b && b < c && c >= CGT_MIN_GRAPH_BYTES);
  cgt_options o;
  cgt_options_init(&o);
  o.max_graph_bytes = b + c - 1; /* holds a + b, and c, but not b + c */
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  size_t bytes[3];
  record_three(t, big, x, bytes, ev);
  assert_int_equal(ev[1], 0);
  assert_int_equal(bytes[1], a + b);
  cgt_stats s = test_stats(t);
  if (s.evictions != 2 || s.graphs != 1 || s.graph_bytes != c)
    fail_msg("recordings of %zu, %zu and %zu bytes under a cap of %zu: after the third, %llu evictions (expected 2), "
             "%llu graphs holding %zu bytes (expected 1 holding %zu)",
             a, b, c, o.max_graph_bytes, (unsigned long long)s.evictions, (unsigned long long)s.graphs,
             s.graph_bytes, c);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}


/* Introspection: "`pool_peak_bytes` is the high-water mark, failed runs'
 * allocations included. In `CGT_MODE_SEPARATE` the pool figures are summed
 * over the nodes' private pools." A high-water mark never goes down. In
 * SEPARATE mode with max_graphs = 1, a second root's recording evicts the
 * first, whose private pool is destroyed (node__drop_recording), and its
 * peak left the sum: stats.pool_peak_bytes fell. (TREE mode is run too,
 * as the control: its single pool's peak stays.) The same for host_allocs,
 * "host allocations the tree made so far" (the audit). A destroyed private
 * pool's peak and host allocations now stay in the sums (retire_own_pool). */
static void test_pool_peak_bytes_and_host_allocs_never_decrease_when_a_recording_is_evicted(void **state) {
  (void)state;
  static const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE};
  for (int m = 0; m < 2; m++) {
    cgt_options o;
    cgt_options_init(&o);
    o.max_graphs = 1;
    cgt_tree *t = test_tree_new(modes[m], &o);
    test_affine ua = {.a = 2, .b = 1, .n = N}, ub = {.a = 3, .b = 0, .n = N};
    cgt_segment a = test_register_affine(t, "a", &ua), b = test_register_affine(t, "b", &ub);
    float *x = test_dev_floats(NULL, N);
    size_t peak = 0;
    uint64_t allocs = 0;
    const cgt_segment order[2] = {a, b};
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < 2; k++) {
        CHECK_OK(t, cgt_step_begin(t));
        (void)test_run1(t, order[i], 0, cgt_arg_static(x, N * sizeof(float)));
        cgt_stats s = test_stats(t);
        if (s.pool_peak_bytes < peak)
          fail_msg("%s mode: pool_peak_bytes fell from %zu to %zu (evictions %llu)",
                   modes[m] == CGT_MODE_TREE ? "TREE" : "SEPARATE", peak, s.pool_peak_bytes,
                   (unsigned long long)s.evictions);
        if (s.host_allocs < allocs)
          fail_msg("%s mode: host_allocs fell from %llu to %llu (evictions %llu)",
                   modes[m] == CGT_MODE_TREE ? "TREE" : "SEPARATE", (unsigned long long)allocs,
                   (unsigned long long)s.host_allocs, (unsigned long long)s.evictions);
        peak = s.pool_peak_bytes;
        allocs = s.host_allocs;
      }
    assert_int_equal(test_stats(t).evictions, 1);
    CHECK_OK(t, cgt_sync(t));
    test_dev_free(x);
    test_tree_free(t);
  }
}


/* Segments: "`CGT_ERR_INVALID_ARGUMENT`: ... more than 2^20 inputs or
 * outputs". The bad-input test refuses UINT32_MAX only; the edge: 2^20
 * inputs or outputs register, 2^20 + 1 are refused and change nothing (no
 * id is used up: the next segment gets the next id). Fails if the bound
 * moves either way (1u << 20 in cgt_segment_register, or >= for >). */
static void test_a_segment_of_exactly_2_to_the_20_inputs_or_outputs_registers_and_one_more_is_refused(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  int calls = 0;
  const uint32_t edge = (uint32_t)1 << 20;
  cgt_segment_desc d = {"wide", launch_failing, &calls, edge, 1, 0};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  assert_int_equal(s, 1);
  d.n_inputs = 1;
  d.n_outputs = edge;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  assert_int_equal(s, 2);
  cgt_segment untouched = 77;
  d.n_inputs = edge + 1;
  d.n_outputs = 1;
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, &d, &untouched));
  d.n_inputs = 1;
  d.n_outputs = edge + 1;
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, &d, &untouched));
  assert_int_equal(untouched, 77);
  d.n_outputs = 1;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  assert_int_equal(s, 3);
  test_tree_free(t);
}

/* Found by helper-90's fuzz of option combinations (stale values and
 * injected host-memory faults, seed 23100, TREE+defer): "On any failure
 * nothing changed: ... no node was created" and "Node ids are 1-based, in
 * creation order ... ids are never reused"; node.c gives a failed first
 * run's id back (node_unlink_newest: "the node never existed for the
 * caller: its id is free again"). But when node_create's insertion into the
 * parent's table of children runs out of host memory, the node is freed
 * after t->next_id++ and its id is lost: the next node skips it, so the list
 * has a gap no pruning or eviction explains (nodes + nodes_pruned +
 * nodes_evicted < the largest id), and two trees fed the same program give
 * their nodes different ids. Each host allocation of a new root is failed
 * in turn; after each failure the same run, repeated, must make node 1. */
static void test_a_run_whose_new_node_runs_out_of_host_memory_does_not_use_up_a_node_id(void **state) {
  (void)state;
  if (test_backend != CGT_BACKEND_SIM)
    skip();
  enum { NF = 64 };
  float h[NF];
  for (int i = 0; i < NF; i++)
    h[i] = (float)i;
  float *x = test_dev_floats(h, NF);
  int failures_seen = 0;
  for (long long k = 0; k < 64; k++) {
    cgt_options o;
    cgt_options_init(&o);
    o.warmup_runs = 1;
    cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
    test_affine u = {.a = 2, .b = 1, .n = NF};
    cgt_segment s = test_register_affine(t, "a", &u);
    cgt_arg a = cgt_arg_static(x, sizeof h);
    cgt_value v = {0};
    cgt__fail_host_alloc_after(t, k, 1);
    cgt_status st = cgt_run(t, s, 0, &a, 1, &v, 1);
    cgt__fail_host_alloc_after(t, -1, 0);
    CHECK_TREE(t);
    if (st == CGT_OK) {
      test_tree_free(t);
      break; /* k allocations were enough: every earlier one has been failed */
    }
    if (st != CGT_ERR_OUT_OF_MEMORY && st != CGT_ERR_SEGMENT_FAILED) /* the launch function's own allocation */
      fail_msg("host allocation %lld failed: cgt_run returned %s", k + 1, cgt_status_name(st));
    failures_seen++;
    CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
    CHECK_TREE(t);
    cgt_node_info info[2];
    size_t n = 0;
    CHECK_OK(t, cgt_tree_nodes(t, info, 2, &n));
    assert_int_equal(n, 1);
    cgt_stats st2 = test_stats(t);
    if (info[0].id != 1)
      fail_msg("host allocation %lld of the run failed (%s); run again, its node has id %u, not 1 (nodes %llu, "
               "pruned %llu, evicted %llu: id %u was used up by the failed run)",
               k + 1, cgt_tree_last_error(t), info[0].id, (unsigned long long)st2.nodes,
               (unsigned long long)st2.nodes_pruned, (unsigned long long)st2.nodes_evicted, info[0].id - 1);
    CHECK_OK(t, cgt_sync(t));
    test_tree_free(t);
  }
  assert_true(failures_seen > 0);
  test_dev_free(x);
}


const struct CMUnitTest audit_tests[] = {
    cmocka_unit_test(test_a_value_call_refusing_a_foreign_value_moves_no_counter_while_replays_are_held_back),
    cmocka_unit_test(test_a_run_that_fails_moves_no_counter_but_launches_the_replays_held_back_before_it),
    cmocka_unit_test(test_a_replay_whose_prelaunch_fails_moves_no_counter_but_launches_the_replays_held_back_before_it),
    cmocka_unit_test(test_a_prelaunch_set_while_a_replay_is_held_back_runs_before_that_replays_launch),
    cmocka_unit_test(test_a_run_refused_at_its_first_use_of_more_arguments_moves_no_counter_but_host_allocs),
    cmocka_unit_test(test_a_value_of_another_tree_is_refused_by_the_4094_trees_made_after_its_own),
    cmocka_unit_test(test_a_sibling_recorded_in_the_last_4_steps_is_not_updated_in_place),
    cmocka_unit_test(test_an_update_whose_first_launch_fails_updates_the_executable_back),
    cmocka_unit_test(test_a_recording_updated_in_place_counts_the_graph_it_keeps_once),
    cmocka_unit_test(test_a_segment_of_exactly_2_to_the_20_inputs_or_outputs_registers_and_one_more_is_refused),
    cmocka_unit_test(test_a_segment_without_a_name_is_named_segment_and_a_null_trees_error_reads_no_tree),
    cmocka_unit_test(test_write_dot_to_a_full_disk_is_a_backend_error),
    cmocka_unit_test(test_without_cgt_fuse_cache_a_tree_keeps_64_fused_executables),
    cmocka_unit_test(test_reloaded_weights_update_in_place_below_rerecord_limit_and_run_eagerly_at_it),
    cmocka_unit_test(test_an_evicted_unreplayed_recording_stops_counting_toward_rerecord_limit_once_pruned),
    cmocka_unit_test(test_a_recording_evicts_until_the_tree_is_back_within_its_byte_budget),
    cmocka_unit_test(test_a_budget_of_two_graphs_evicts_the_oldest_leaf_recording_and_counts_exactly),
    cmocka_unit_test(test_pool_allocated_bytes_reads_0_after_step_begin_and_separate_pools_empty_at_their_next_run),
    cmocka_unit_test(test_pool_peak_bytes_and_host_allocs_never_decrease_when_a_recording_is_evicted),
    cmocka_unit_test(test_a_capture_failure_that_recovers_returns_ok_and_leaves_its_message_as_last_error),
    cmocka_unit_test(test_a_nodes_reason_string_stays_valid_until_tree_destroy_even_after_the_node_is_pruned),
    cmocka_unit_test(test_a_run_whose_new_node_runs_out_of_host_memory_does_not_use_up_a_node_id),
};
const size_t audit_test_count = sizeof audit_tests / sizeof audit_tests[0];
