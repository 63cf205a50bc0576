/* bad_input.c — every public function refuses bad input with the right
 * status and changes nothing.
 *
 * "Changes nothing" is checked the same way everywhere: the tree's
 * statistics are snapshotted before the call and compared field by field
 * after it (host_allocs aside, and stale_uses aside where the call uses a
 * stale value, which it counts on purpose), the node list is compared node
 * by node, cgt_tree_check must pass, and the values that were live before
 * must still be live and hold the same bytes.
 *
 * Most tests run in a small world: a tree in each mode that has run three
 * steps of  v1 = affine(buf); r = affine(v1); v2 = add(v1, r); release r  so
 * that in TREE mode the current step replays recorded nodes, with two live
 * values, a released one and one from the previous step. Bad calls made
 * inside a launch function are checked against a twin tree whose segment
 * makes only the good calls: the two trees must end up alike.
 *
 * Runs that fail after they began (a launch function that returns an error,
 * sets too few outputs or frees its own output; a device out of memory at a
 * first warmup, at a recording, or when the pool needs a new chunk) are held
 * to the same rule: the node list, the pool and every counter end as they
 * were, and the same run succeeds once the cause is gone.
 *
 * Simulator-only parts (the device limit, the cgt_sim_* calls) skip on CUDA,
 * and the CUDA-only parts (a missing device ordinal, the device limit
 * refused on a CUDA tree) skip on the simulator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgtree_sim.h"
#include "test_lists.h"
#include "tree_hooks.h"

#define N 64 /* floats per value */

static const cgt_mode all_modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE, CGT_MODE_EAGER};
#define N_MODES (sizeof all_modes / sizeof all_modes[0])

static const char *mode_name(cgt_mode m) {
  return m == CGT_MODE_TREE ? "TREE" : m == CGT_MODE_SEPARATE ? "SEPARATE" : m == CGT_MODE_EAGER ? "EAGER" : "?";
}

static void silent_log(void *user, int level, const char *msg) {
  (void)user;
  (void)level;
  (void)msg;
}

static cgt_status launch_nothing(cgt_launch *l, void *user) {
  (void)l;
  (void)user;
  return CGT_OK;
}

/* ------------------------------------------------------------- snapshots */

#define MAX_NODES 64

typedef struct snapshot {
  cgt_stats s;
  size_t n_nodes;
  cgt_node_info nodes[MAX_NODES];
} snapshot;

static void take(cgt_tree *t, snapshot *out) {
  memset(out, 0, sizeof *out);
  CHECK_OK(t, cgt_tree_stats(t, &out->s));
  CHECK_OK(t, cgt_tree_nodes(t, out->nodes, MAX_NODES, &out->n_nodes));
  assert_true(out->n_nodes <= MAX_NODES);
}

/* Every stats field but host_allocs, the two peaks (and stale_uses if asked)
 * must match; a failure names every field that differs. Peaks are
 * high-water marks of device memory really used, and a launch function that
 * allocated before it failed did use that memory, so a peak may rise. */
static void expect_same_stats(const cgt_stats *before, const cgt_stats *after, int ignore_stale, const char *what) {
  char diff[1024] = "";
  size_t used = 0;
#define SAME_FIELD(f)                                                                                         \
  if (strcmp(#f, "host_allocs") && !strstr(#f, "peak_bytes") && (!ignore_stale || strcmp(#f, "stale_uses")) && \
      before->f != after->f &&                                                                                \
      used < sizeof diff)                                                                                     \
    used += (size_t)snprintf(diff + used, sizeof diff - used, " %s %llu -> %llu;", #f,                        \
                             (unsigned long long)before->f, (unsigned long long)after->f);
  CGT_STATS_FIELDS(SAME_FIELD, SAME_FIELD)
#undef SAME_FIELD
  if (diff[0])
    fail_msg("%s changed stats:%s", what, diff);
}

static void expect_unchanged(cgt_tree *t, const snapshot *before, int stale, const char *what) {
  snapshot now;
  take(t, &now);
  expect_same_stats(&before->s, &now.s, stale, what);
  if (stale && now.s.stale_uses != before->s.stale_uses + 1)
    fail_msg("%s: stale_uses went from %llu to %llu, expected one more", what,
             (unsigned long long)before->s.stale_uses, (unsigned long long)now.s.stale_uses);
  if (now.n_nodes != before->n_nodes)
    fail_msg("%s changed the node count from %zu to %zu", what, before->n_nodes, now.n_nodes);
  for (size_t i = 0; i < now.n_nodes; i++) {
    const cgt_node_info *a = &before->nodes[i], *b = &now.nodes[i];
    if (a->id != b->id || a->parent != b->parent || a->state != b->state || a->replays != b->replays ||
        a->eager_runs != b->eager_runs || a->pool_bytes_live != b->pool_bytes_live)
      fail_msg("%s changed node %u (state %s -> %s, replays %llu -> %llu, eager runs %llu -> %llu)", what, a->id,
               cgt_node_state_name(a->state), cgt_node_state_name(b->state), (unsigned long long)a->replays,
               (unsigned long long)b->replays, (unsigned long long)a->eager_runs,
               (unsigned long long)b->eager_runs);
  }
  CHECK_TREE(t);
}

/* Calls expr, which must return `expected` and change nothing. */
#define EXPECT_REFUSED(t, expected, expr)                                                                    \
  do {                                                                                                      \
    snapshot before_;                                                                                       \
    take((t), &before_);                                                                                    \
    CHECK_STATUS((t), (expected), (expr));                                                                  \
    assert_true(cgt_tree_last_error(t)[0] != '\0');                                                         \
    expect_unchanged((t), &before_, (expected) == CGT_ERR_STALE_VALUE, #expr);                              \
  } while (0)

/* ------------------------------------------------------------- the world */

typedef struct world {
  cgt_mode mode;
  cgt_tree *t;
  test_affine ua, ur, uadd;
  cgt_segment aff, aff_r, add;
  float *buf;         /* caller memory: the STATIC input */
  cgt_value v1, v2;   /* live in the current step */
  cgt_value released; /* released in the current step */
  cgt_value old;      /* from the previous step */
  float v1_host[N], v2_host[N];
} world;

static void world_step(world *w) {
  cgt_tree *t = w->t;
  cgt_arg a = cgt_arg_static(w->buf, N * sizeof(float));
  cgt_value r;
  CHECK_OK(t, cgt_run(t, w->aff, 0, &a, 1, &w->v1, 1));
  CHECK_TREE(t);
  a = cgt_arg_value(w->v1);
  CHECK_OK(t, cgt_run(t, w->aff_r, 0, &a, 1, &r, 1));
  CHECK_TREE(t);
  cgt_arg two[2] = {cgt_arg_value(w->v1), cgt_arg_value(r)};
  CHECK_OK(t, cgt_run(t, w->add, 0, two, 2, &w->v2, 1));
  CHECK_TREE(t);
  CHECK_OK(t, cgt_value_release(t, r));
  CHECK_TREE(t);
  w->released = r;
}

/* v1 = 2x + 1, r = 3 - v1, v2 = v1 + r = 3 */
static void world_expect_values(world *w) {
  float got[N];
  test_read_value(w->t, w->v1, got, N);
  assert_memory_equal(got, w->v1_host, sizeof got);
  test_read_value(w->t, w->v2, got, N);
  assert_memory_equal(got, w->v2_host, sizeof got);
}

static void world_open_with(world *w, cgt_mode mode, const cgt_options *o) {
  memset(w, 0, sizeof *w);
  w->mode = mode;
  w->t = test_tree_new(mode, o);
  w->ua = (test_affine){.a = 2, .b = 1, .n = N};
  w->ur = (test_affine){.a = -1, .b = 3, .n = N};
  w->uadd = (test_affine){.n = N};
  w->aff = test_register_affine(w->t, "v1", &w->ua);
  w->aff_r = test_register_affine(w->t, "r", &w->ur);
  w->add = test_register_add2(w->t, "v2", &w->uadd);
  float x[N];
  for (int i = 0; i < N; i++) {
    x[i] = (float)(i % 9) - 4;
    w->v1_host[i] = 2 * x[i] + 1;
    w->v2_host[i] = 3;
  }
  w->buf = test_dev_floats(x, N);
  for (int step = 0; step < 3; step++) {
    if (step) {
      w->old = w->v1;
      CHECK_OK(w->t, cgt_step_begin(w->t));
    }
    world_step(w);
  }
  world_expect_values(w);
  if (cgt_tree_mode(w->t) == CGT_MODE_TREE)
    assert_true(test_stats(w->t).replays >= 3);
}

static void world_open(world *w, cgt_mode mode) { world_open_with(w, mode, NULL); }

static void world_close(world *w) {
  world_expect_values(w);
  CHECK_OK(w->t, cgt_sync(w->t));
  test_tree_free(w->t);
  test_dev_free(w->buf);
}

/* In a world: the call is refused, nothing changes, v1 and v2 still hold
 * their data. */
#define WORLD_REFUSES(w, expected, expr)     \
  do {                                       \
    EXPECT_REFUSED((w)->t, (expected), (expr)); \
    world_expect_values(w);                  \
  } while (0)

/* --------------------------------------------------------------- status */

static void test_status_names_and_strings_cover_every_code_and_out_of_range(void **state) {
  (void)state;
  assert_string_equal(cgt_status_name(CGT_OK), "CGT_OK");
  assert_string_equal(cgt_status_name(CGT_ERR_INVALID_ARGUMENT), "CGT_ERR_INVALID_ARGUMENT");
  assert_string_equal(cgt_status_name(CGT_ERR_OUT_OF_MEMORY), "CGT_ERR_OUT_OF_MEMORY");
  assert_string_equal(cgt_status_name(CGT_ERR_STALE_VALUE), "CGT_ERR_STALE_VALUE");
  assert_string_equal(cgt_status_name(CGT_ERR_CAPTURE_FAILED), "CGT_ERR_CAPTURE_FAILED");
  assert_string_equal(cgt_status_name(CGT_ERR_BACKEND), "CGT_ERR_BACKEND");
  assert_string_equal(cgt_status_name(CGT_ERR_NO_DEVICE), "CGT_ERR_NO_DEVICE");
  assert_string_equal(cgt_status_name(CGT_ERR_STATE), "CGT_ERR_STATE");
  assert_string_equal(cgt_status_name(CGT_ERR_SEGMENT_FAILED), "CGT_ERR_SEGMENT_FAILED");
  for (int s = 0; s < CGT_STATUS_COUNT; s++) {
    const char *name = cgt_status_name((cgt_status)s), *text = cgt_status_string((cgt_status)s);
    assert_non_null(name);
    assert_non_null(text);
    assert_true(strncmp(name, "CGT_", 4) == 0);
    assert_string_not_equal(name, "CGT_UNKNOWN_STATUS");
    assert_true(strlen(text) > 0);
    assert_null(strchr(text, '\n')); /* "one-line human description" */
    for (int o = 0; o < s; o++) {
      assert_string_not_equal(name, cgt_status_name((cgt_status)o));
      assert_string_not_equal(text, cgt_status_string((cgt_status)o));
    }
  }
  const int out_of_range[] = {-1, CGT_STATUS_COUNT, CGT_STATUS_COUNT + 1, 1000, -2147483647 - 1};
  for (size_t i = 0; i < sizeof out_of_range / sizeof out_of_range[0]; i++) {
    cgt_status s = (cgt_status)out_of_range[i];
    assert_string_equal(cgt_status_name(s), "CGT_UNKNOWN_STATUS");
    assert_non_null(cgt_status_string(s));
    assert_true(strlen(cgt_status_string(s)) > 0);
  }
  assert_string_equal(cgt_node_state_name(CGT_NODE_WARMUP), "WARMUP");
  assert_string_equal(cgt_node_state_name(CGT_NODE_RECORDED), "RECORDED");
  assert_string_equal(cgt_node_state_name(CGT_NODE_EAGER), "EAGER");
  assert_string_equal(cgt_node_state_name((cgt_node_state)3), "UNKNOWN");
  assert_string_equal(cgt_node_state_name((cgt_node_state)-1), "UNKNOWN");
}

/* ----------------------------------------------------------------- tree */

static cgt_status create_with(cgt_options o, cgt_tree **out) {
  o.log_fn = silent_log;
  return cgt_tree_create(&o, out);
}

static void test_tree_create_refuses_null_out_bad_enums_and_impossible_sizes(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.backend = test_backend;
  assert_int_equal(cgt_tree_create(&o, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_tree_create(NULL, NULL), CGT_ERR_INVALID_ARGUMENT);

  cgt_tree *t = NULL;
  cgt_options bad = o;
  bad.backend = (cgt_backend)7;
  assert_int_equal(create_with(bad, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);
  bad.backend = (cgt_backend)-1;
  assert_int_equal(create_with(bad, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);
  bad = o;
  bad.mode = (cgt_mode)9;
  assert_int_equal(create_with(bad, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);
  bad.mode = (cgt_mode)-1;
  assert_int_equal(create_with(bad, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);

  /* Sizes that overflow when rounded to the pool's alignment. */
  bad = o;
  bad.pool_chunk_bytes = SIZE_MAX;
  assert_int_equal(create_with(bad, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);
  bad = o;
  bad.pool_reserve_bytes = SIZE_MAX;
  assert_int_equal(create_with(bad, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);

  /* The same options, repaired, make a tree. */
  assert_int_equal(create_with(o, &t), CGT_OK);
  assert_non_null(t);
  CHECK_TREE(t);
  cgt_tree_destroy(t);
}

static void test_tree_create_refuses_cuda_where_there_is_none(void **state) {
  (void)state;
  if (cgt_cuda_available())
    skip();
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  cgt_tree *t = NULL;
  assert_int_equal(create_with(o, &t), CGT_ERR_NO_DEVICE);
  assert_null(t);
  /* AUTO falls back to the simulator. */
  o.backend = CGT_BACKEND_AUTO;
  assert_int_equal(create_with(o, &t), CGT_OK);
  assert_int_equal(cgt_tree_backend(t), CGT_BACKEND_SIM);
  cgt_tree_destroy(t);
}

static void test_tree_create_refuses_a_bad_device_or_a_caller_stream_on_the_simulator(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  cgt_tree *t = NULL;
  char not_a_stream[64];
  o.stream = not_a_stream;
  assert_int_equal(create_with(o, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);
  o.stream = NULL;
  o.device = -1;
  assert_int_equal(create_with(o, &t), CGT_ERR_INVALID_ARGUMENT);
  assert_null(t);
}

static void test_tree_create_refuses_a_device_ordinal_the_machine_lacks(void **state) {
  (void)state;
  if (test_backend != CGT_BACKEND_CUDA)
    skip();
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_CUDA;
  o.device = 9999;
  cgt_tree *t = NULL;
  assert_int_not_equal(create_with(o, &t), CGT_OK);
  assert_null(t);
  o.device = -1;
  assert_int_not_equal(create_with(o, &t), CGT_OK);
  assert_null(t);
}

static void test_every_function_refuses_a_null_tree(void **state) {
  (void)state;
  cgt_options_init(NULL);
  cgt_tree_destroy(NULL);
  assert_int_equal(cgt_tree_backend(NULL), CGT_BACKEND_AUTO);
  (void)cgt_tree_mode(NULL);
  assert_null(cgt_tree_stream(NULL));
  assert_non_null(cgt_tree_last_error(NULL));
  assert_int_equal(cgt_sync(NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_step_begin(NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_tree_check(NULL), CGT_ERR_INVALID_ARGUMENT);

  test_affine u = {.a = 1, .n = N};
  cgt_segment_desc d = {"s", launch_nothing, &u, 1, 1, 0};
  cgt_segment id = 77;
  assert_int_equal(cgt_segment_register(NULL, &d, &id), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(id, 77);

  float x[N] = {0};
  cgt_arg a = cgt_arg_static(x, sizeof x);
  cgt_value out = {12345};
  assert_int_equal(cgt_run(NULL, 1, 0, &a, 1, &out, 1), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(out.bits, 12345);

  cgt_value v = {((uint64_t)1 << 32) | 1};
  void *p = x;
  size_t bytes = 5;
  assert_int_equal(cgt_value_ptr(NULL, v, &p, &bytes), CGT_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(p, x);
  assert_int_equal(bytes, 5);
  assert_int_equal(cgt_value_release(NULL, v), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_value_copy_out(NULL, v, x, sizeof(float)), CGT_ERR_INVALID_ARGUMENT);

  cgt_stats s;
  memset(&s, 0x5a, sizeof s);
  assert_int_equal(cgt_tree_stats(NULL, &s), CGT_ERR_INVALID_ARGUMENT);
  cgt_node_info info[2];
  size_t count = 99;
  assert_int_equal(cgt_tree_nodes(NULL, info, 2, &count), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(count, 99);
  assert_int_equal(cgt_tree_write_dot(NULL, stderr), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_set_device_limit(NULL, 0), CGT_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------- segments */

static void test_segment_register_refuses_null_descriptor_launch_out_and_huge_counts(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    cgt_tree *t = test_tree_new(all_modes[m], NULL);
    cgt_segment id = 77;
    cgt_segment_desc good = {"good", launch_nothing, NULL, 1, 1, 0};
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, NULL, &id));
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, &good, NULL));
    cgt_segment_desc bad = good;
    bad.launch = NULL;
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, &bad, &id));
    bad = good;
    bad.n_inputs = UINT32_MAX;
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, &bad, &id));
    bad = good;
    bad.n_outputs = UINT32_MAX;
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, &bad, &id));
    /* Unknown flag bits, alone or beside CGT_SEGMENT_NO_CAPTURE. */
    static const uint32_t unknown_flags[] = {2, 0x80000000u, CGT_SEGMENT_NO_CAPTURE | 4, UINT32_MAX};
    for (size_t f = 0; f < sizeof unknown_flags / sizeof unknown_flags[0]; f++) {
      bad = good;
      bad.flags = unknown_flags[f];
      EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_segment_register(t, &bad, &id));
      assert_non_null(strstr(cgt_tree_last_error(t), "flag"));
    }
    assert_int_equal(id, 77);
    /* Nothing was registered: segment 1 is unknown, and the next good
     * registration gets id 1. */
    float x[N] = {0};
    cgt_arg a = cgt_arg_static(x, sizeof x);
    cgt_value out;
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, 1, 0, &a, 1, &out, 1));
    CHECK_OK(t, cgt_segment_register(t, &good, &id));
    assert_int_equal(id, 1);
    test_tree_free(t);
  }
}

/* ----------------------------------------------------------------- runs */

static void test_run_refuses_unknown_segments_and_wrong_counts(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_tree *t = w.t;
    cgt_arg one = cgt_arg_value(w.v1);
    cgt_arg two[3] = {cgt_arg_value(w.v1), cgt_arg_value(w.v2), cgt_arg_value(w.v2)};
    cgt_value outs[2] = {{111}, {222}};
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, 0, 0, &one, 1, outs, 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.add + 1, 0, &one, 1, outs, 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, UINT32_MAX, 0, &one, 1, outs, 1));
    /* affine takes one argument and makes one output */
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, NULL, 0, outs, 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, two, 2, outs, 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, NULL, 1, outs, 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, &one, 1, NULL, 0));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, &one, 1, outs, 2));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, &one, 1, NULL, 1));
    /* add takes two */
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.add, 0, two, 1, outs, 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.add, 0, two, 3, outs, 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.add, 0, NULL, 2, outs, 1));
    assert_int_equal(outs[0].bits, 111);
    assert_int_equal(outs[1].bits, 222);
    world_close(&w);
  }
}

static void test_run_refuses_zero_foreign_released_and_previous_step_values(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_tree *t = w.t;
    cgt_value out = {111};
    cgt_value bad_values[] = {{0}, {(uint64_t)5 << 32}, {((uint64_t)1 << 32) | 1000000}};
    for (size_t i = 0; i < sizeof bad_values / sizeof bad_values[0]; i++) {
      cgt_arg a = cgt_arg_value(bad_values[i]);
      WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, &a, 1, &out, 1));
      cgt_arg second_bad[2] = {cgt_arg_value(w.v1), cgt_arg_value(bad_values[i])};
      WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.add, 0, second_bad, 2, &out, 1));
    }
    cgt_value stale[] = {w.released, w.old};
    for (size_t i = 0; i < 2; i++) {
      cgt_arg a = cgt_arg_value(stale[i]);
      WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_run(t, w.aff_r, 0, &a, 1, &out, 1));
      cgt_arg second_stale[2] = {cgt_arg_value(w.v2), cgt_arg_value(stale[i])};
      WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_run(t, w.add, 0, second_stale, 2, &out, 1));
    }
    assert_int_equal(out.bits, 111);
    world_close(&w);
  }
}

static void test_run_refuses_null_empty_and_overflowing_caller_memory_and_unknown_kinds(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_tree *t = w.t;
    cgt_value out = {111};
    const void *top = (const void *)(UINTPTR_MAX - 8);
    for (int dynamic = 0; dynamic < 2; dynamic++) {
      cgt_arg (*make)(const void *, size_t) = dynamic ? cgt_arg_dynamic : cgt_arg_static;
      cgt_arg bad[] = {make(NULL, 16), make(w.buf, 0), make(top, 16), make(w.buf, SIZE_MAX)};
      for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, &bad[i], 1, &out, 1));
        cgt_arg second_bad[2] = {cgt_arg_value(w.v1), bad[i]};
        WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.add, 0, second_bad, 2, &out, 1));
      }
    }
    int kinds[] = {3, 7, -1, 1000};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
      cgt_arg a = cgt_arg_static(w.buf, N * sizeof(float));
      a.kind = (cgt_arg_kind)kinds[i];
      WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, &a, 1, &out, 1));
    }
    assert_int_equal(out.bits, 111);
    world_close(&w);
  }
}

/* Caller-owned means caller-owned: memory of the tree's own pools (here a
 * value's memory, from cgt_value_ptr, whole or in part, and in every mode's
 * pool) is refused as a STATIC or DYNAMIC argument, with a message that says
 * to pass the value instead. Memory right beside the pool's chunks is not. */
static void test_static_and_dynamic_arguments_inside_the_trees_own_pools_are_refused_in_every_mode(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_tree *t = w.t;
    cgt_value out = {111};
    void *p = NULL;
    size_t bytes = 0;
    CHECK_OK(t, cgt_value_ptr(t, w.v1, &p, &bytes));
    char *v1 = p;
    for (int dynamic = 0; dynamic < 2; dynamic++) {
      cgt_arg (*make)(const void *, size_t) = dynamic ? cgt_arg_dynamic : cgt_arg_static;
      cgt_arg bad[] = {make(v1, bytes), make(v1 + 4, 8), make(v1 + bytes - 4, 4)};
      for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.aff_r, 0, &bad[i], 1, &out, 1));
        assert_non_null(strstr(cgt_tree_last_error(t), "pass the value"));
        cgt_arg second_bad[2] = {cgt_arg_value(w.v2), bad[i]};
        WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, w.add, 0, second_bad, 2, &out, 1));
      }
    }
    assert_int_equal(out.bits, 111);
    /* The caller's own buffer still is fine, and so is the value itself. */
    cgt_arg good = cgt_arg_static(w.buf, N * sizeof(float));
    CHECK_OK(t, cgt_run(t, w.aff_r, 0, &good, 1, &out, 1));
    good = cgt_arg_value(w.v1);
    CHECK_OK(t, cgt_run(t, w.aff_r, 0, &good, 1, &out, 1));
    CHECK_TREE(t);
    world_close(&w);
  }
}

/* Values belong to their tree: two trees that ran the same program hold
 * handles that differ only in the tree's tag; each refuses the other's in
 * every call that takes a value, and neither changes. */
static void test_values_of_another_tree_are_refused_and_change_nothing_in_either_tree(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world a, b;
    world_open(&a, all_modes[m]);
    world_open(&b, all_modes[m]);
    const uint64_t tag_mask = ~(uint64_t)0 << 52;
    assert_int_equal(a.v1.bits & ~tag_mask, b.v1.bits & ~tag_mask);
    assert_true(a.v1.bits != b.v1.bits);
    cgt_value foreign[] = {b.v1, b.v2};
    for (size_t i = 0; i < 2; i++) {
      cgt_tree *t = a.t;
      void *p = NULL;
      size_t bytes = 0;
      float host[N];
      cgt_value out = {111};
      cgt_arg arg = cgt_arg_value(foreign[i]);
      WORLD_REFUSES(&a, CGT_ERR_INVALID_ARGUMENT, cgt_value_release(t, foreign[i]));
      assert_non_null(strstr(cgt_tree_last_error(t), "another tree"));
      WORLD_REFUSES(&a, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, a.aff_r, 0, &arg, 1, &out, 1));
      WORLD_REFUSES(&a, CGT_ERR_INVALID_ARGUMENT, cgt_value_ptr(t, foreign[i], &p, &bytes));
      WORLD_REFUSES(&a, CGT_ERR_INVALID_ARGUMENT, cgt_value_copy_out(t, foreign[i], host, sizeof host));
      assert_int_equal(out.bits, 111);
    }
    /* B's values are untouched and still B's. */
    world_expect_values(&b);
    CHECK_OK(b.t, cgt_value_release(b.t, b.v2));
    EXPECT_REFUSED(b.t, CGT_ERR_STALE_VALUE, cgt_value_release(b.t, b.v2));
    world_expect_values(&a);
    CHECK_OK(a.t, cgt_value_release(a.t, a.v2));
    b.v2 = b.v1;
    a.v2 = a.v1;
    memcpy(a.v2_host, a.v1_host, sizeof a.v2_host);
    memcpy(b.v2_host, b.v1_host, sizeof b.v2_host);
    world_close(&a);
    world_close(&b);
  }
}

/* --------------------------------------------------------------- values */

static void test_value_calls_refuse_zero_stale_and_bad_sizes(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_tree *t = w.t;
    float host[N + 1];
    for (int i = 0; i <= N; i++)
      host[i] = -7;
    void *p = host;
    size_t bytes = 5;
    cgt_value zero = {0}, foreign = {((uint64_t)1 << 32) | 1000000};

    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_ptr(t, zero, &p, &bytes));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_ptr(t, foreign, &p, &bytes));
    WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_value_ptr(t, w.released, &p, &bytes));
    WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_value_ptr(t, w.old, &p, &bytes));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_ptr(t, w.v1, NULL, NULL));
    assert_ptr_equal(p, host);
    assert_int_equal(bytes, 5);

    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_release(t, zero));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_release(t, foreign));
    WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_value_release(t, w.released));
    WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_value_release(t, w.old));

    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_copy_out(t, zero, host, sizeof(float)));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_copy_out(t, foreign, host, sizeof(float)));
    WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_value_copy_out(t, w.released, host, sizeof(float)));
    WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_value_copy_out(t, w.old, host, sizeof(float)));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_copy_out(t, w.v1, host, N * sizeof(float) + 1));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_copy_out(t, w.v1, host, SIZE_MAX));
    WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_value_copy_out(t, w.v1, NULL, sizeof(float)));
    CHECK_OK(t, cgt_sync(t));
    for (int i = 0; i <= N; i++)
      assert_true(host[i] == -7);
    /* Zero bytes is a copy of nothing, not an error. */
    CHECK_OK(t, cgt_value_copy_out(t, w.v1, host, 0));
    CHECK_OK(t, cgt_sync(t));
    assert_true(host[0] == -7);

    /* A value released twice is stale the second time. */
    cgt_value v;
    cgt_arg a = cgt_arg_value(w.v2);
    CHECK_OK(t, cgt_run(t, w.aff_r, 0, &a, 1, &v, 1));
    CHECK_OK(t, cgt_value_release(t, v));
    WORLD_REFUSES(&w, CGT_ERR_STALE_VALUE, cgt_value_release(t, v));
    world_close(&w);
  }
}

/* ------------------------------------------------- the launch context */

static void test_launch_calls_refuse_a_null_context(void **state) {
  (void)state;
  void *p = &p;
  assert_null(cgt_launch_stream(NULL));
  assert_null(cgt_launch_input(NULL, 0));
  assert_int_equal(cgt_launch_input_bytes(NULL, 0), 0);
  assert_int_equal(cgt_launch_variant(NULL), 0);
  assert_int_equal(cgt_launch_alloc(NULL, 16, &p), CGT_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(p, &p);
  assert_int_equal(cgt_launch_free(NULL, p), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_launch_set_output(NULL, 0, p, 4), CGT_ERR_INVALID_ARGUMENT);
}

/* A segment that computes out = 2x + 1 through a temporary and, when asked,
 * makes bad calls along the way, remembering every answer that is not the
 * expected one. It keeps its launch context for use after the launch. */
typedef struct careless {
  int bad;        /* make bad launch calls */
  int meddle;     /* call tree functions from inside the launch */
  cgt_tree *tree; /* for meddle */
  cgt_value live; /* for meddle: a live value it tries to release */
  cgt_segment self;
  int calls;
  int checks;
  int wrong;
  char first_wrong[256];
  cgt_launch *kept;
} careless;

static void careless_note(careless *u, int ok, const char *what, cgt_status got) {
  u->checks++;
  if (!ok && !u->wrong++)
    snprintf(u->first_wrong, sizeof u->first_wrong, "%s (got %s)", what, cgt_status_name(got));
}
#define IN_LAUNCH_EXPECT(u, expected, expr)              \
  do {                                                   \
    cgt_status s_ = (expr);                              \
    careless_note((u), s_ == (expected), #expr, s_);     \
  } while (0)
#define IN_LAUNCH_TRUE(u, cond) careless_note((u), (cond), #cond, CGT_OK)

/* A refused launch call: the status, and cgt_tree_last_error naming the
 * call (the text of expr up to its parenthesis). */
static int last_error_names(cgt_tree *t, const char *expr) {
  char call[64];
  snprintf(call, sizeof call, "%.*s", (int)strcspn(expr, "("), expr);
  return strstr(cgt_tree_last_error(t), call) != NULL;
}
#define IN_LAUNCH_REFUSED(u, expected, expr)                                          \
  do {                                                                                \
    cgt_status s_ = (expr);                                                           \
    careless_note((u), s_ == (expected) && last_error_names((u)->tree, #expr), #expr, s_); \
  } while (0)

static cgt_status launch_careless(cgt_launch *l, void *user) {
  careless *u = user;
  u->calls++;
  u->kept = l;
  const float *x = cgt_launch_input(l, 0);
  size_t in_bytes = cgt_launch_input_bytes(l, 0);
  int on_stack = 0;
  void *out, *tmp;
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), &out);
  if (st == CGT_OK)
    st = cgt_launch_alloc(l, 64, &tmp);
  if (st != CGT_OK)
    return st;
  if (u->bad) {
    void *q = &on_stack;
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_alloc(l, 16, NULL)); /* first: no earlier text */
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_alloc(l, 0, &q));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_alloc(l, SIZE_MAX, &q));
    IN_LAUNCH_TRUE(u, q == &on_stack);
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_free(l, NULL));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_free(l, &on_stack));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_free(l, (void *)x));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_free(l, (char *)out + 16));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 1, out, 4));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, UINT32_MAX, out, 4));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, NULL, 4));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, out, 0));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, &on_stack, sizeof on_stack));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, out, N * sizeof(float) + 1));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, (char *)out + 4, N * sizeof(float)));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, (char *)out + 4, SIZE_MAX));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, (char *)x + 4, in_bytes));
    IN_LAUNCH_REFUSED(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_set_output(l, 0, (void *)(UINTPTR_MAX - 3), 8));
    IN_LAUNCH_TRUE(u, cgt_launch_input(l, 1) == NULL);
    IN_LAUNCH_TRUE(u, cgt_launch_input(l, UINT32_MAX) == NULL);
    IN_LAUNCH_TRUE(u, cgt_launch_input_bytes(l, 1) == 0);
  }
  if (u->meddle) {
    cgt_tree *t = u->tree;
    float host[1];
    cgt_arg a = cgt_arg_value(u->live);
    cgt_value v = {111};
    cgt_segment_desc d = {"inner", launch_nothing, NULL, 0, 0, 0};
    cgt_segment id = 77;
    IN_LAUNCH_EXPECT(u, CGT_ERR_STATE, cgt_run(t, u->self, 0, &a, 1, &v, 1));
    IN_LAUNCH_EXPECT(u, CGT_ERR_STATE, cgt_step_begin(t));
    IN_LAUNCH_EXPECT(u, CGT_ERR_STATE, cgt_value_release(t, u->live));
    IN_LAUNCH_EXPECT(u, CGT_ERR_STATE, cgt_sync(t));
    IN_LAUNCH_EXPECT(u, CGT_ERR_STATE, cgt_segment_register(t, &d, &id));
    IN_LAUNCH_EXPECT(u, CGT_ERR_STATE, cgt_value_copy_out(t, u->live, host, sizeof host));
    IN_LAUNCH_EXPECT(u, CGT_ERR_STATE, cgt_tree_set_reclaim(t, NULL, NULL));
    IN_LAUNCH_TRUE(u, v.bits == 111 && id == 77);
  }
  st = test_kernels()->affine(cgt_launch_stream(l), x, 2.0f, 1.0f, out, N);
  if (st == CGT_OK)
    st = cgt_launch_free(l, tmp);
  if (st != CGT_OK)
    return st;
  if (u->bad)
    IN_LAUNCH_EXPECT(u, CGT_ERR_INVALID_ARGUMENT, cgt_launch_free(l, tmp));
  return cgt_launch_set_output(l, 0, out, N * sizeof(float));
}

/* Runs the careless segment on v2 for a few steps in a world and in a twin
 * world whose segment behaves; the two trees must end up alike. */
static void run_careless_against_a_clean_twin(cgt_mode mode, int bad, int meddle) {
  world w[2];
  careless u[2];
  memset(u, 0, sizeof u);
  for (int k = 0; k < 2; k++) {
    world_open(&w[k], mode);
    u[k].bad = k == 0 && bad;
    u[k].meddle = k == 0 && meddle;
    u[k].tree = w[k].t;
    cgt_segment_desc d = {"careless", launch_careless, &u[k], 1, 1, 0};
    CHECK_OK(w[k].t, cgt_segment_register(w[k].t, &d, &u[k].self));
  }
  for (int step = 0; step < 4; step++)
    for (int k = 0; k < 2; k++) {
      cgt_tree *t = w[k].t;
      if (step) {
        CHECK_OK(t, cgt_step_begin(t));
        world_step(&w[k]);
      }
      u[k].live = w[k].v1;
      cgt_arg a = cgt_arg_value(w[k].v2);
      cgt_value out;
      CHECK_OK(t, cgt_run(t, u[k].self, 0, &a, 1, &out, 1));
      CHECK_TREE(t);
      if (u[k].wrong)
        fail_msg("%s mode, step %d: %d of %d calls inside the launch answered wrong; first: %s", mode_name(mode),
                 step, u[k].wrong, u[k].checks, u[k].first_wrong);
      float got[N];
      test_read_value(t, out, got, N);
      for (int i = 0; i < N; i++)
        assert_true(got[i] == 7.0f); /* 2 * 3 + 1 */
      world_expect_values(&w[k]);
    }
  if (bad || meddle)
    assert_true(u[0].checks > 0);
  assert_int_equal(u[0].calls, u[1].calls);
  snapshot s[2];
  for (int k = 0; k < 2; k++)
    take(w[k].t, &s[k]);
  char what[96];
  snprintf(what, sizeof what, "bad calls inside a launch (%s mode)", mode_name(mode));
  expect_same_stats(&s[1].s, &s[0].s, 0, what);
  assert_int_equal(s[0].n_nodes, s[1].n_nodes);
  for (size_t i = 0; i < s[0].n_nodes; i++) {
    assert_int_equal(s[0].nodes[i].state, s[1].nodes[i].state);
    assert_int_equal(s[0].nodes[i].replays, s[1].nodes[i].replays);
  }
  for (int k = 0; k < 2; k++)
    world_close(&w[k]);
}

static void test_bad_launch_calls_inside_a_launch_are_refused_and_change_nothing(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++)
    run_careless_against_a_clean_twin(all_modes[m], 1, 0);
}

static void test_tree_calls_from_inside_a_launch_are_refused_and_change_nothing(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++)
    run_careless_against_a_clean_twin(all_modes[m], 0, 1);
}

static void test_launch_calls_outside_a_launch_are_refused(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_tree *t = w.t;
    careless u;
    memset(&u, 0, sizeof u);
    cgt_segment_desc d = {"keeper", launch_careless, &u, 1, 1, 0};
    CHECK_OK(t, cgt_segment_register(t, &d, &u.self));
    for (int step = 0; step < 3; step++) {
      if (step) {
        CHECK_OK(t, cgt_step_begin(t));
        world_step(&w);
      }
      cgt_arg a = cgt_arg_value(w.v2);
      cgt_value out;
      CHECK_OK(t, cgt_run(t, u.self, 0, &a, 1, &out, 1));
      /* After the launch (and, in TREE mode at step 2, after a replay that
       * never called it), its context answers nothing and refuses all. */
      cgt_launch *l = u.kept;
      assert_non_null(l);
      void *p = NULL;
      size_t bytes = 0;
      CHECK_OK(t, cgt_value_ptr(t, out, &p, &bytes));
      assert_null(cgt_launch_stream(l));
      assert_null(cgt_launch_input(l, 0));
      assert_int_equal(cgt_launch_input_bytes(l, 0), 0);
      assert_int_equal(cgt_launch_variant(l), 0);
      void *q = &q;
      EXPECT_REFUSED(t, CGT_ERR_STATE, cgt_launch_alloc(l, 16, &q));
      assert_ptr_equal(q, &q);
      EXPECT_REFUSED(t, CGT_ERR_STATE, cgt_launch_free(l, p));
      EXPECT_REFUSED(t, CGT_ERR_STATE, cgt_launch_set_output(l, 0, p, bytes));
      world_expect_values(&w);
      float got[N];
      test_read_value(t, out, got, N);
      assert_true(got[0] == 7.0f && got[N - 1] == 7.0f);
    }
    if (all_modes[m] == CGT_MODE_TREE)
      assert_int_equal(u.calls, 2); /* warmup, record, replay */
    world_close(&w);
  }
}

/* ------------------------------------------------- failing launch functions */

/* out = 2x + 1, like careless; call number fail_on returns `ret` (after
 * allocating), and it sets only `outputs_set` of its outputs. */
typedef struct failing {
  int calls;
  int fail_on;    /* 0: never */
  cgt_status ret; /* what a failing call returns */
  uint32_t outputs_set;
  int free_output;    /* set output 0, then free its memory */
  int illegal;        /* sync the stream while captured: the node turns EAGER */
  int check_illegal;  /* and return the sync's error, as careful code does */
} failing;

static cgt_status launch_failing(cgt_launch *l, void *user) {
  failing *u = user;
  u->calls++;
  void *out, *tmp;
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), &out);
  if (st == CGT_OK)
    st = cgt_launch_alloc(l, 1000, &tmp);
  if (st == CGT_OK)
    st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), 2.0f, 1.0f, out, N);
  if (st != CGT_OK)
    return st;
  if (u->illegal) {
    st = test_kernels()->illegal_stream_sync(cgt_launch_stream(l));
    if (st != CGT_OK && u->check_illegal)
      return st;
  }
  if (u->calls == u->fail_on)
    return u->ret;
  for (uint32_t i = 0; i < u->outputs_set; i++) {
    st = cgt_launch_set_output(l, i, out, N * sizeof(float));
    if (st != CGT_OK)
      return st;
  }
  if (u->free_output)
    return cgt_launch_free(l, out);
  return CGT_OK;
}

static cgt_segment register_failing(cgt_tree *t, failing *u, uint32_t n_out) {
  cgt_segment_desc d = {"failing", launch_failing, u, 1, n_out, 0};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  return s;
}

/* Runs seg on arg; it must fail with `expected` and change nothing, and the
 * outputs must be untouched. */
static void expect_run_fails(world *w, cgt_segment seg, cgt_arg arg, uint32_t n_out, cgt_status expected,
                             const char *what) {
  cgt_value outs[2] = {{111}, {222}};
  snapshot before;
  take(w->t, &before);
  cgt_status st = cgt_run(w->t, seg, 0, &arg, 1, outs, n_out);
  if (st != expected)
    fail_msg("%s (%s mode): cgt_run returned %s, expected %s (%s)", what, mode_name(w->mode), cgt_status_name(st),
             cgt_status_name(expected), cgt_tree_last_error(w->t));
  char full[160];
  snprintf(full, sizeof full, "%s (%s mode)", what, mode_name(w->mode));
  expect_unchanged(w->t, &before, 0, full);
  assert_int_equal(outs[0].bits, 111);
  assert_int_equal(outs[1].bits, 222);
  world_expect_values(w);
}

static void expect_run_gives_seven(world *w, cgt_segment seg, cgt_arg arg, uint32_t n_out) {
  cgt_value outs[2];
  CHECK_OK(w->t, cgt_run(w->t, seg, 0, &arg, 1, outs, n_out));
  CHECK_TREE(w->t);
  for (uint32_t o = 0; o < n_out; o++) {
    float got[N];
    test_read_value(w->t, outs[o], got, N);
    for (int i = 0; i < N; i++)
      assert_true(got[i] == 7.0f);
  }
}

static void test_failing_launch_of_a_new_node_fails_the_run_and_leaves_no_node(void **state) {
  (void)state;
  static const cgt_status rets[] = {CGT_ERR_BACKEND, CGT_ERR_INVALID_ARGUMENT, CGT_ERR_STATE};
  for (size_t m = 0; m < N_MODES; m++)
    for (int dynamic = 0; dynamic < 2; dynamic++) {
      world w;
      world_open(&w, all_modes[m]);
      failing u = {.fail_on = 1, .outputs_set = 1};
      cgt_segment s = register_failing(w.t, &u, 1);
      /* v2 holds 3s, and so does the DYNAMIC copy of its data. */
      float threes[N];
      for (int i = 0; i < N; i++)
        threes[i] = 3;
      float *dyn = test_dev_floats(threes, N);
      cgt_arg arg = dynamic ? cgt_arg_dynamic(dyn, N * sizeof(float)) : cgt_arg_value(w.v2);
      for (size_t r = 0; r < sizeof rets / sizeof rets[0]; r++) {
        u.ret = rets[r];
        u.calls = 0;
        expect_run_fails(&w, s, arg, 1, CGT_ERR_SEGMENT_FAILED,
                         dynamic ? "a failing first run on a DYNAMIC input" : "a failing first run");
      }
      u.fail_on = 0;
      expect_run_gives_seven(&w, s, arg, 1);
      CHECK_OK(w.t, cgt_sync(w.t));
      test_dev_free(dyn);
      world_close(&w);
    }
}

static void test_failing_launch_while_recording_fails_the_run_and_keeps_the_node_warming_up(void **state) {
  (void)state;
  const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE};
  for (size_t m = 0; m < 2; m++)
    for (int dynamic = 0; dynamic < 2; dynamic++) {
      world w;
      world_open(&w, modes[m]);
      failing u = {.fail_on = 2, .ret = CGT_ERR_BACKEND, .outputs_set = 1};
      cgt_segment s = register_failing(w.t, &u, 1);
      float threes[N];
      for (int i = 0; i < N; i++)
        threes[i] = 3;
      float *dyn = test_dev_floats(threes, N);
      /* Step A: warmup. */
      cgt_arg arg = dynamic ? cgt_arg_dynamic(dyn, N * sizeof(float)) : cgt_arg_value(w.v2);
      expect_run_gives_seven(&w, s, arg, 1);
      /* Step B: the recording's launch fails. */
      CHECK_OK(w.t, cgt_step_begin(w.t));
      world_step(&w);
      arg = dynamic ? cgt_arg_dynamic(dyn, N * sizeof(float)) : cgt_arg_value(w.v2);
      uint64_t recordings = test_stats(w.t).recordings;
      expect_run_fails(&w, s, arg, 1, CGT_ERR_SEGMENT_FAILED,
                       dynamic ? "a failing recording on a DYNAMIC input" : "a failing recording");
      assert_int_equal(u.calls, 2);
      /* The same run now records. */
      expect_run_gives_seven(&w, s, arg, 1);
      assert_int_equal(test_stats(w.t).recordings, recordings + 1);
      CHECK_OK(w.t, cgt_sync(w.t));
      test_dev_free(dyn);
      world_close(&w);
    }
}

static void test_failing_launch_of_an_eager_node_fails_the_run_and_changes_nothing(void **state) {
  (void)state;
  world w;
  world_open(&w, CGT_MODE_TREE);
  failing u = {.outputs_set = 1, .illegal = 1, .ret = CGT_ERR_BACKEND};
  cgt_segment s = register_failing(w.t, &u, 1);
  expect_run_gives_seven(&w, s, cgt_arg_value(w.v2), 1); /* warmup */
  CHECK_OK(w.t, cgt_step_begin(w.t));
  world_step(&w);
  expect_run_gives_seven(&w, s, cgt_arg_value(w.v2), 1); /* capture fails: EAGER, and run eagerly */
  assert_int_equal(test_stats(w.t).capture_failures, 1);
  CHECK_OK(w.t, cgt_step_begin(w.t));
  world_step(&w);
  u.fail_on = u.calls + 1;
  expect_run_fails(&w, s, cgt_arg_value(w.v2), 1, CGT_ERR_SEGMENT_FAILED, "a failing eager node");
  expect_run_gives_seven(&w, s, cgt_arg_value(w.v2), 1);
  world_close(&w);
}

static void test_launch_that_leaves_an_output_unset_or_freed_fails_the_run(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    failing none = {.outputs_set = 0}, half = {.outputs_set = 1}, freed = {.outputs_set = 1, .free_output = 1};
    cgt_segment s_none = register_failing(w.t, &none, 1);
    cgt_segment s_half = register_failing(w.t, &half, 2);
    cgt_segment s_freed = register_failing(w.t, &freed, 1);
    for (int step = 0; step < 3; step++) {
      if (step) {
        CHECK_OK(w.t, cgt_step_begin(w.t));
        world_step(&w);
      }
      expect_run_fails(&w, s_none, cgt_arg_value(w.v2), 1, CGT_ERR_SEGMENT_FAILED, "a launch that sets no output");
      expect_run_fails(&w, s_half, cgt_arg_value(w.v2), 2, CGT_ERR_SEGMENT_FAILED,
                       "a launch that sets one of two outputs");
      expect_run_fails(&w, s_freed, cgt_arg_value(w.v2), 1, CGT_ERR_SEGMENT_FAILED,
                       "a launch that frees its output");
    }
    world_close(&w);
  }
}

/* ---------------------------------------------------------- introspection */

static void test_inspection_calls_refuse_null_results(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_tree *t = w.t;
    cgt_node_info info[2];
    size_t count = 99;
    /* Each refusal leaves its detail in cgt_tree_last_error and changes nothing. */
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_tree_stats(t, NULL));
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_tree_nodes(t, info, 2, NULL));
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_tree_nodes(t, NULL, 0, NULL));
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_tree_nodes(t, NULL, 2, &count));
    assert_int_equal(count, 99);
    EXPECT_REFUSED(t, CGT_ERR_INVALID_ARGUMENT, cgt_tree_write_dot(t, NULL));
    assert_non_null(strstr(cgt_tree_last_error(t), "cgt_tree_write_dot"));
    /* A FILE that refuses the write: CGT_ERR_BACKEND, and the cause. */
    FILE *ro = fopen("/dev/null", "r");
    assert_non_null(ro);
    EXPECT_REFUSED(t, CGT_ERR_BACKEND, cgt_tree_write_dot(t, ro));
    assert_non_null(strstr(cgt_tree_last_error(t), "writing to f failed"));
    fclose(ro);
    /* cap = 0 with out = NULL asks for the count. */
    CHECK_OK(t, cgt_tree_nodes(t, NULL, 0, &count));
    assert_int_equal(count, test_stats(t).nodes);
    world_close(&w);
  }
}


/* --------------------------------------- capture failure, then failure */

/* A capture that the launch function's own sync breaks falls back to an
 * eager run; when that fails too, the run fails and the node stays as it was
 * (WARMUP, no capture failure counted), and the next attempt recovers. */
static void test_capture_failure_whose_eager_run_fails_changes_nothing(void **state) {
  (void)state;
  const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE};
  for (size_t m = 0; m < 2; m++)
    for (int check = 0; check < 2; check++) {
      world w;
      world_open(&w, modes[m]);
      failing u = {.outputs_set = 1, .illegal = 1, .check_illegal = check, .ret = CGT_ERR_BACKEND};
      cgt_segment s = register_failing(w.t, &u, 1);
      expect_run_gives_seven(&w, s, cgt_arg_value(w.v2), 1); /* call 1: warmup */
      CHECK_OK(w.t, cgt_step_begin(w.t));
      world_step(&w);
      u.fail_on = 3; /* call 2: the capture breaks; call 3: the eager run fails */
      expect_run_fails(&w, s, cgt_arg_value(w.v2), 1, CGT_ERR_SEGMENT_FAILED, "an eager run after a failed capture");
      assert_int_equal(u.calls, 3);
      assert_non_null(strstr(cgt_tree_last_error(w.t), "capture"));
      /* Call 4 breaks the capture again, call 5 runs eagerly and succeeds. */
      expect_run_gives_seven(&w, s, cgt_arg_value(w.v2), 1);
      assert_int_equal(u.calls, 5);
      cgt_stats st = test_stats(w.t);
      assert_int_equal(st.capture_failures, 1);
      size_t count = 0;
      cgt_node_info info[MAX_NODES];
      CHECK_OK(w.t, cgt_tree_nodes(w.t, info, MAX_NODES, &count));
      assert_int_equal(info[count - 1].segment, s);
      assert_int_equal(info[count - 1].state, CGT_NODE_EAGER);
      assert_int_equal(info[count - 1].eager_runs, 2);
      world_close(&w);
    }
}

/* The same, with the eager run out of memory: the side pool needs a chunk
 * that pool_limit_bytes refuses. Runs on every backend. */
static void test_capture_failure_whose_eager_run_runs_out_of_memory_changes_nothing(void **state) {
  (void)state;
  const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE};
  for (size_t m = 0; m < 2; m++) {
    cgt_options o;
    cgt_options_init(&o);
    o.pool_chunk_bytes = 4096;
    /* TREE: the graph pool's one chunk. SEPARATE: the private pools of the
     * world's three nodes and of the failing one. */
    o.pool_limit_bytes = modes[m] == CGT_MODE_SEPARATE ? 4 * 4096 : 4096;
    world w;
    world_open_with(&w, modes[m], &o);
    failing u = {.outputs_set = 1, .illegal = 1, .check_illegal = 1, .ret = CGT_ERR_BACKEND};
    cgt_segment s = register_failing(w.t, &u, 1);
    expect_run_gives_seven(&w, s, cgt_arg_value(w.v2), 1); /* warmup */
    for (int attempt = 0; attempt < 2; attempt++) {
      CHECK_OK(w.t, cgt_step_begin(w.t));
      world_step(&w);
      expect_run_fails(&w, s, cgt_arg_value(w.v2), 1, CGT_ERR_OUT_OF_MEMORY,
                       "an eager run after a failed capture, past pool_limit_bytes");
      assert_non_null(strstr(cgt_tree_last_error(w.t), "pool_limit_bytes"));
      assert_int_equal(test_stats(w.t).capture_failures, 0);
    }
    world_close(&w);
  }
}

/* A WARMUP node that may not record because a sibling reached
 * rerecord_limit turns EAGER only if its eager run succeeds. */
static void test_rerecord_limit_turns_a_node_eager_only_when_its_eager_run_succeeds(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.warmup_runs = 2;
  o.rerecord_limit = 1;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  failing u = {.outputs_set = 1, .ret = CGT_ERR_BACKEND};
  cgt_segment s = register_failing(t, &u, 1);
  float threes[N];
  for (int i = 0; i < N; i++)
    threes[i] = 3;
  float *x[2] = {test_dev_floats(threes, N), test_dev_floats(threes, N)};
  /* x[0]: node 1 warms up, then records; x[1]: node 2 warms up in between. */
  const int which[] = {0, 1, 0};
  for (int step = 0; step < 3; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    cgt_arg a = cgt_arg_static(x[which[step]], N * sizeof(float));
    cgt_value out;
    CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &out, 1));
  }
  assert_int_equal(test_stats(t).recordings, 1);
  CHECK_OK(t, cgt_step_begin(t));
  cgt_arg a = cgt_arg_static(x[1], N * sizeof(float));
  cgt_value out = {111};
  u.fail_on = u.calls + 1;
  snapshot before;
  take(t, &before);
  CHECK_STATUS(t, CGT_ERR_SEGMENT_FAILED, cgt_run(t, s, 0, &a, 1, &out, 1));
  expect_unchanged(t, &before, 0, "a failing eager run at the rerecord limit");
  assert_int_equal(out.bits, 111);
  cgt_node_info info[2];
  size_t count = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 2, &count));
  assert_int_equal(count, 2);
  assert_int_equal(info[1].state, CGT_NODE_WARMUP);
  assert_null(info[1].reason);
  CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &out, 1));
  CHECK_TREE(t);
  assert_true(test_read_first(t, out) == 7.0f);
  CHECK_OK(t, cgt_tree_nodes(t, info, 2, &count));
  assert_int_equal(info[1].state, CGT_NODE_EAGER);
  assert_non_null(strstr(info[1].reason, "rerecord limit"));
  CHECK_OK(t, cgt_sync(t));
  test_dev_free(x[0]);
  test_dev_free(x[1]);
  test_tree_free(t);
}

/* ----------------------------------------------- host out of memory */

/* Runs seg on arg with the host allocation number k of the run failing, for
 * k = 0, 1, ... until the run needs fewer than k + 1. once = 1: only that
 * allocation fails; the run must fail with CGT_ERR_OUT_OF_MEMORY and change
 * nothing. once = 0: every later allocation fails too (the run's clean-up
 * included); the run must fail with CGT_ERR_OUT_OF_MEMORY and leave the tree
 * sound. Returns the output of the run that succeeded; *allocs gets the
 * number of host allocations it made. */
static cgt_value run_with_each_host_alloc_failing(world *w, cgt_segment seg, cgt_arg arg, int once, const char *what,
                                                  long long *allocs) {
  for (long long k = 0;; k++) {
    cgt_value out = {111};
    snapshot before;
    take(w->t, &before);
    cgt__fail_host_alloc_after(w->t, k, once);
    cgt_status st = cgt_run(w->t, seg, 0, &arg, 1, &out, 1);
    int fired = cgt__host_alloc_failures(w->t) > 0;
    cgt__fail_host_alloc_after(w->t, -1, 0);
    if (!fired) {
      CHECK_OK(w->t, st);
      CHECK_TREE(w->t);
      *allocs = k;
      return out;
    }
    if (st != CGT_ERR_OUT_OF_MEMORY)
      fail_msg("%s (%s mode): with host allocation %lld failing, cgt_run returned %s (%s)", what, mode_name(w->mode),
               k, cgt_status_name(st), cgt_tree_last_error(w->t));
    assert_int_equal(out.bits, 111);
    if (once) {
      char full[160];
      snprintf(full, sizeof full, "%s (%s mode) with host allocation %lld failing", what, mode_name(w->mode), k);
      expect_unchanged(w->t, &before, 0, full);
    } else {
      CHECK_TREE(w->t);
    }
    world_expect_values(w);
    assert_true(k < 100000);
  }
}

static void expect_seven(world *w, cgt_value v) {
  float got[N];
  test_read_value(w->t, v, got, N);
  for (int i = 0; i < N; i++)
    assert_true(got[i] == 7.0f);
}

static void host_oom_program(cgt_mode mode, int once) {
  world w;
  world_open(&w, mode);
  failing fresh = {.outputs_set = 1}, careful = {.outputs_set = 1, .illegal = 1, .check_illegal = 1};
  cgt_segment s_fresh = register_failing(w.t, &fresh, 1);
  cgt_segment s_careful = register_failing(w.t, &careful, 1);
  float threes[N];
  for (int i = 0; i < N; i++)
    threes[i] = 3;
  float *dyn = test_dev_floats(threes, N);
  cgt_arg dyn_arg = cgt_arg_dynamic(dyn, N * sizeof(float));
  long long allocs = 0, first_allocs = 0;
  /* Step 3: first runs (warmup, new nodes, counters, tables); step 4:
   * recordings, and a capture failure with its eager run; step 5: replays
   * and an eager node; step 6: a new step's worth of everything again. */
  for (int step = 0; step < 4; step++) {
    if (step) {
      CHECK_OK(w.t, cgt_step_begin(w.t));
      world_step(&w);
    }
    expect_seven(&w, run_with_each_host_alloc_failing(&w, s_fresh, cgt_arg_value(w.v2), once, "fresh", &allocs));
    if (step == 0)
      first_allocs = allocs;
    if (step >= 2 && mode == CGT_MODE_TREE)
      assert_int_equal(allocs, 0); /* a replay allocates nothing */
    expect_seven(&w, run_with_each_host_alloc_failing(&w, s_careful, dyn_arg, once, "careful", &allocs));
  }
  assert_true(first_allocs > 0);
  if (mode != CGT_MODE_EAGER) {
    assert_int_equal(test_stats(w.t).capture_failures, 1);
    assert_true(test_stats(w.t).recordings >= 1);
  }
  CHECK_OK(w.t, cgt_sync(w.t));
  test_dev_free(dyn);
  world_close(&w);
}

static void test_every_host_allocation_of_a_run_failing_in_turn_changes_nothing(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++)
    host_oom_program(all_modes[m], 1);
}

static void test_host_running_dry_in_the_middle_of_a_run_leaves_a_sound_tree(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++)
    host_oom_program(all_modes[m], 0);
}

static void test_segment_register_with_each_host_allocation_failing_changes_nothing(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    world w;
    world_open(&w, all_modes[m]);
    cgt_segment_desc d = {"late", launch_nothing, NULL, 0, 0, 0};
    cgt_segment id = 0;
    long long k = 0;
    for (;; k++) {
      cgt__fail_host_alloc_after(w.t, k, 1);
      snapshot before;
      take(w.t, &before);
      cgt_status st = cgt_segment_register(w.t, &d, &id);
      int fired = cgt__host_alloc_failures(w.t) > 0;
      cgt__fail_host_alloc_after(w.t, -1, 0);
      if (!fired) {
        CHECK_OK(w.t, st);
        break;
      }
      CHECK_STATUS(w.t, CGT_ERR_OUT_OF_MEMORY, st);
      expect_unchanged(w.t, &before, 0, "cgt_segment_register with a host allocation failing");
    }
    assert_true(k > 0);
    assert_int_equal(id, 4); /* the world has three: no failed attempt took an id */
    world_close(&w);
  }
}

/* ------------------------------------------------- pool_limit_bytes */

/* One value of BIG_FLOATS fills one chunk of CHUNK_BYTES (defined below). */
static cgt_tree *limited_tree(cgt_mode mode, size_t chunk_bytes, size_t limit) {
  cgt_options o;
  cgt_options_init(&o);
  o.pool_chunk_bytes = chunk_bytes;
  o.pool_limit_bytes = limit;
  return test_tree_new(mode, &o);
}

/* ------------------------------------------------------- out of memory */

static void skip_unless_simulator(void) {
  if (test_backend != CGT_BACKEND_SIM)
    skip();
}

static void test_out_of_device_memory_at_the_first_warmup_changes_nothing(void **state) {
  (void)state;
  skip_unless_simulator();
  for (size_t m = 0; m < N_MODES; m++) {
    cgt_tree *t = test_tree_new(all_modes[m], NULL);
    test_affine u = {.a = 2, .b = 1, .n = N};
    cgt_segment s = test_register_affine(t, "aff", &u);
    float x[N];
    for (int i = 0; i < N; i++)
      x[i] = (float)i;
    float *buf = test_dev_floats(x, N);
    cgt_arg a = cgt_arg_static(buf, sizeof x);
    cgt_value out = {111};
    CHECK_OK(t, cgt_sim_set_device_limit(t, 0));
    EXPECT_REFUSED(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s, 0, &a, 1, &out, 1));
    assert_int_equal(out.bits, 111);
    assert_int_equal(test_stats(t).pool_reserved_bytes, 0);
    CHECK_OK(t, cgt_sim_set_device_limit(t, SIZE_MAX));
    CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &out, 1));
    CHECK_TREE(t);
    assert_true(test_read_first(t, out) == 1.0f);
    test_dev_free(buf);
    test_tree_free(t);
  }
}

/* A reclaim function's record: its calls, the bytes of the last, and what
 * it does (give the simulator's memory back, or nothing). */
typedef struct reclaimer {
  cgt_tree *tree;
  int calls, gives_back;
  size_t bytes;
} reclaimer;

static int reclaim_by_lifting_the_limit(void *user, size_t bytes) {
  reclaimer *r = user;
  r->calls++;
  r->bytes = bytes;
  if (!r->gives_back)
    return 0;
  /* As another allocator giving its cache back would: the device has room again. */
  return cgt_sim_set_device_limit(r->tree, SIZE_MAX) == CGT_OK;
}

/* A tree with a reclaimer, and aff(buf) ready to run on it. */
typedef struct reclaim_case {
  cgt_tree *t;
  reclaimer r;
  test_affine u;
  cgt_segment s;
  float *buf;
  cgt_arg a;
} reclaim_case;

static void reclaim_case_open(reclaim_case *c, cgt_mode mode, const cgt_options *o, int gives_back) {
  c->t = test_tree_new(mode, o);
  c->r = (reclaimer){.tree = c->t, .gives_back = gives_back};
  CHECK_OK(c->t, cgt_tree_set_reclaim(c->t, reclaim_by_lifting_the_limit, &c->r));
  c->u = (test_affine){.a = 2, .b = 1, .n = N};
  c->s = test_register_affine(c->t, "aff", &c->u);
  float x[N] = {0};
  c->buf = test_dev_floats(x, N);
  c->a = cgt_arg_static(c->buf, sizeof x);
}

static void reclaim_case_close(reclaim_case *c) {
  test_dev_free(c->buf);
  test_tree_free(c->t);
}

static void test_a_chunk_the_device_refuses_is_asked_for_again_after_the_reclaim_function_gave_memory_back(
    void **state) {
  (void)state;
  skip_unless_simulator();
  for (size_t m = 0; m < N_MODES; m++) {
    reclaim_case c;
    reclaim_case_open(&c, all_modes[m], NULL, 1);
    cgt_value out;
    CHECK_OK(c.t, cgt_sim_set_device_limit(c.t, 0));
    CHECK_OK(c.t, cgt_run(c.t, c.s, 0, &c.a, 1, &out, 1));
    assert_int_equal(c.r.calls, 1);
    assert_true(c.r.bytes > 0 && test_stats(c.t).pool_reserved_bytes >= c.r.bytes);
    CHECK_TREE(c.t);
    assert_true(test_read_first(c.t, out) == 1.0f);
    reclaim_case_close(&c);
  }
}

static void test_a_reclaim_function_that_gives_nothing_back_leaves_out_of_memory_and_nothing_changed(void **state) {
  (void)state;
  skip_unless_simulator();
  reclaim_case c;
  reclaim_case_open(&c, CGT_MODE_TREE, NULL, 0);
  cgt_value out = {111};
  CHECK_OK(c.t, cgt_sim_set_device_limit(c.t, 0));
  EXPECT_REFUSED(c.t, CGT_ERR_OUT_OF_MEMORY, cgt_run(c.t, c.s, 0, &c.a, 1, &out, 1));
  assert_int_equal(c.r.calls, 1);
  assert_int_equal(out.bits, 111);
  assert_int_equal(test_stats(c.t).pool_reserved_bytes, 0);
  /* Removed, it is called no more. */
  CHECK_OK(c.t, cgt_tree_set_reclaim(c.t, NULL, &c.r));
  EXPECT_REFUSED(c.t, CGT_ERR_OUT_OF_MEMORY, cgt_run(c.t, c.s, 0, &c.a, 1, &out, 1));
  assert_int_equal(c.r.calls, 1);
  assert_int_equal(cgt_tree_set_reclaim(NULL, reclaim_by_lifting_the_limit, &c.r), CGT_ERR_INVALID_ARGUMENT);
  CHECK_OK(c.t, cgt_sim_set_device_limit(c.t, SIZE_MAX));
  CHECK_OK(c.t, cgt_run(c.t, c.s, 0, &c.a, 1, &out, 1));
  CHECK_TREE(c.t);
  reclaim_case_close(&c);
}

static void test_pool_limit_bytes_refuses_a_chunk_without_calling_the_reclaim_function(void **state) {
  (void)state;
  skip_unless_simulator();
  cgt_options o;
  cgt_options_init(&o);
  o.pool_limit_bytes = 1; /* less than any chunk */
  reclaim_case c;
  reclaim_case_open(&c, CGT_MODE_TREE, &o, 1);
  cgt_value out;
  EXPECT_REFUSED(c.t, CGT_ERR_OUT_OF_MEMORY, cgt_run(c.t, c.s, 0, &c.a, 1, &out, 1));
  assert_int_equal(c.r.calls, 0);
  reclaim_case_close(&c);
}

/* One value fills one chunk: a second value needs a second chunk. */
#define BIG_FLOATS 256
#define CHUNK_BYTES (BIG_FLOATS * sizeof(float))

static void test_out_of_device_memory_while_recording_changes_nothing(void **state) {
  (void)state;
  skip_unless_simulator();
  cgt_options o;
  cgt_options_init(&o);
  o.pool_chunk_bytes = CHUNK_BYTES;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  test_affine u = {.a = 2, .b = 1, .n = BIG_FLOATS};
  cgt_segment s = test_register_affine(t, "aff", &u);
  float *buf = test_dev_floats(NULL, BIG_FLOATS);
  float x[BIG_FLOATS] = {0};
  test_dev_upload(buf, x, BIG_FLOATS);
  cgt_arg a = cgt_arg_static(buf, sizeof x);
  cgt_value v, w;
  /* Steps 0 and 1: v = aff(buf) warms up, then records; aff is warm. */
  for (int step = 0; step < 2; step++) {
    if (step)
      CHECK_OK(t, cgt_step_begin(t));
    CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
  }
  assert_int_equal(test_stats(t).recordings, 1);
  /* Step 2: v replays, and w = aff(v) would record at once (aff is warm),
   * but it needs a second chunk. */
  CHECK_OK(t, cgt_step_begin(t));
  CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
  assert_int_equal(test_stats(t).replays, 1);
  CHECK_OK(t, cgt_sim_set_device_limit(t, test_stats(t).pool_reserved_bytes));
  cgt_arg av = cgt_arg_value(v);
  EXPECT_REFUSED(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s, 0, &av, 1, &w, 1));
  assert_true(test_read_first(t, v) == 1.0f);
  CHECK_OK(t, cgt_sim_set_device_limit(t, SIZE_MAX));
  CHECK_OK(t, cgt_run(t, s, 0, &av, 1, &w, 1));
  CHECK_TREE(t);
  assert_int_equal(test_stats(t).recordings, 2);
  assert_true(test_read_first(t, w) == 3.0f);
  test_dev_free(buf);
  test_tree_free(t);
}

static void test_out_of_device_memory_for_a_new_chunk_changes_nothing(void **state) {
  (void)state;
  skip_unless_simulator();
  for (size_t m = 0; m < N_MODES; m++) {
    cgt_options o;
    cgt_options_init(&o);
    o.pool_chunk_bytes = CHUNK_BYTES;
    cgt_tree *t = test_tree_new(all_modes[m], &o);
    test_affine u = {.a = 2, .b = 1, .n = BIG_FLOATS}, cold = {.a = 1, .b = 1, .n = BIG_FLOATS};
    cgt_segment s = test_register_affine(t, "aff", &u);
    cgt_segment s_cold = test_register_affine(t, "cold", &cold);
    float x[BIG_FLOATS] = {0};
    float *buf = test_dev_floats(x, BIG_FLOATS);
    cgt_arg a = cgt_arg_static(buf, sizeof x);
    cgt_value v, w;
    for (int step = 0; step < 3; step++) {
      if (step)
        CHECK_OK(t, cgt_step_begin(t));
      CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
    }
    /* v is live and fills the pool's only chunk; a segment never run
     * before warms up on a new chunk, which the device refuses. */
    CHECK_OK(t, cgt_sim_set_device_limit(t, test_stats(t).pool_reserved_bytes));
    cgt_arg av = cgt_arg_value(v);
    char what[64];
    snprintf(what, sizeof what, "a run that needs a new chunk (%s mode)", mode_name(all_modes[m]));
    snapshot before;
    take(t, &before);
    CHECK_STATUS(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s_cold, 0, &av, 1, &w, 1));
    expect_unchanged(t, &before, 0, what);
    assert_true(test_read_first(t, v) == 1.0f);
    CHECK_OK(t, cgt_sim_set_device_limit(t, SIZE_MAX));
    CHECK_OK(t, cgt_run(t, s_cold, 0, &av, 1, &w, 1));
    CHECK_TREE(t);
    assert_true(test_read_first(t, w) == 2.0f);
    test_dev_free(buf);
    test_tree_free(t);
  }
}


/* The pool_limit_bytes versions of the three tests above: a cap the tree
 * keeps itself, so they run on every backend. */

static void test_pool_limit_refuses_the_first_warmup_and_changes_nothing(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    cgt_tree *t = limited_tree(all_modes[m], CHUNK_BYTES, CHUNK_BYTES);
    test_affine big = {.a = 2, .b = 1, .n = 2 * BIG_FLOATS}, small = {.a = 2, .b = 1, .n = N};
    cgt_segment s_big = test_register_affine(t, "big", &big);
    cgt_segment s_small = test_register_affine(t, "small", &small);
    float x[2 * BIG_FLOATS];
    for (int i = 0; i < 2 * BIG_FLOATS; i++)
      x[i] = (float)(i % 4);
    float *buf = test_dev_floats(x, 2 * BIG_FLOATS);
    cgt_arg a = cgt_arg_static(buf, sizeof x);
    cgt_value out = {111};
    for (int attempt = 0; attempt < 2; attempt++) {
      EXPECT_REFUSED(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s_big, 0, &a, 1, &out, 1));
      assert_int_equal(out.bits, 111);
      assert_non_null(strstr(cgt_tree_last_error(t), "pool_limit_bytes"));
      assert_int_equal(test_stats(t).pool_reserved_bytes, 0);
      assert_int_equal(test_stats(t).nodes, 0);
    }
    /* What fits under the cap still runs, step after step. */
    a.bytes = N * sizeof(float);
    for (int step = 0; step < 3; step++) {
      CHECK_OK(t, cgt_step_begin(t));
      CHECK_OK(t, cgt_run(t, s_small, 0, &a, 1, &out, 1));
      CHECK_TREE(t);
      assert_true(test_read_first(t, out) == 1.0f);
    }
    assert_true(test_stats(t).pool_reserved_bytes <= CHUNK_BYTES);
    test_dev_free(buf);
    test_tree_free(t);
  }
}

static void test_pool_limit_refuses_a_recording_that_needs_a_new_chunk_and_changes_nothing(void **state) {
  (void)state;
  cgt_tree *t = limited_tree(CGT_MODE_TREE, CHUNK_BYTES, CHUNK_BYTES);
  test_affine u = {.a = 2, .b = 1, .n = BIG_FLOATS};
  cgt_segment s = test_register_affine(t, "aff", &u);
  float x[BIG_FLOATS] = {0};
  float *buf = test_dev_floats(x, BIG_FLOATS);
  cgt_arg a = cgt_arg_static(buf, sizeof x);
  cgt_value v, w = {111};
  for (int step = 0; step < 2; step++) { /* warmup, record */
    if (step)
      CHECK_OK(t, cgt_step_begin(t));
    CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
  }
  assert_int_equal(test_stats(t).recordings, 1);
  /* Step 2: v replays and fills the one chunk the cap allows; a second run
   * of aff would record at once and needs a second chunk. */
  CHECK_OK(t, cgt_step_begin(t));
  CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
  assert_int_equal(test_stats(t).replays, 1);
  EXPECT_REFUSED(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s, 0, &a, 1, &w, 1));
  assert_int_equal(w.bits, 111);
  assert_true(test_read_first(t, v) == 1.0f);
  /* Once v is released its memory is free again: the same run records. */
  CHECK_OK(t, cgt_value_release(t, v));
  CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &w, 1));
  CHECK_TREE(t);
  assert_int_equal(test_stats(t).recordings, 2);
  assert_int_equal(test_stats(t).pool_reserved_bytes, CHUNK_BYTES);
  assert_true(test_read_first(t, w) == 1.0f);
  test_dev_free(buf);
  test_tree_free(t);
}

static void test_pool_limit_refuses_a_new_chunk_and_changes_nothing(void **state) {
  (void)state;
  for (size_t m = 0; m < N_MODES; m++) {
    cgt_tree *t = limited_tree(all_modes[m], CHUNK_BYTES, CHUNK_BYTES);
    test_affine u = {.a = 2, .b = 1, .n = BIG_FLOATS}, cold = {.a = 1, .b = 1, .n = BIG_FLOATS};
    cgt_segment s = test_register_affine(t, "aff", &u);
    cgt_segment s_cold = test_register_affine(t, "cold", &cold);
    float x[BIG_FLOATS] = {0};
    float *buf = test_dev_floats(x, BIG_FLOATS);
    cgt_arg a = cgt_arg_static(buf, sizeof x);
    cgt_value v, w = {111};
    for (int step = 0; step < 3; step++) {
      if (step)
        CHECK_OK(t, cgt_step_begin(t));
      CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
    }
    /* v is live and fills the only chunk the cap allows; a segment never run
     * before needs a new chunk (in SEPARATE mode, a private pool). */
    char what[64];
    snprintf(what, sizeof what, "a run past pool_limit_bytes (%s mode)", mode_name(all_modes[m]));
    snapshot before;
    take(t, &before);
    CHECK_STATUS(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s_cold, 0, &a, 1, &w, 1));
    expect_unchanged(t, &before, 0, what);
    assert_int_equal(w.bits, 111);
    assert_true(test_read_first(t, v) == 1.0f);
    if (all_modes[m] != CGT_MODE_SEPARATE) {
      /* Released, v's memory serves the cold segment. */
      CHECK_OK(t, cgt_value_release(t, v));
      CHECK_OK(t, cgt_run(t, s_cold, 0, &a, 1, &w, 1));
      CHECK_TREE(t);
      assert_true(test_read_first(t, w) == 1.0f);
    } else {
      /* The private pool of v's node is all the cap allows: v still replays. */
      CHECK_OK(t, cgt_step_begin(t));
      CHECK_OK(t, cgt_run(t, s, 0, &a, 1, &v, 1));
      assert_true(test_read_first(t, v) == 1.0f);
    }
    test_dev_free(buf);
    test_tree_free(t);
  }
}

/* The cap covers every pool of the tree together: the graph pool, the side
 * pool of eager nodes, and the placeholders of DYNAMIC arguments. */
static void test_pool_limit_covers_the_graph_pool_the_side_pool_and_placeholders(void **state) {
  (void)state;
  cgt_tree *t = limited_tree(CGT_MODE_TREE, CHUNK_BYTES, 2 * CHUNK_BYTES);
  test_affine ua = {.a = 2, .b = 1, .n = BIG_FLOATS}, ue1 = {.a = 3, .b = 0, .n = BIG_FLOATS};
  test_affine ue2 = {.a = 4, .b = 0, .n = BIG_FLOATS}, ud = {.a = 5, .b = 0, .n = BIG_FLOATS};
  cgt_segment s_a = test_register_affine(t, "graph", &ua);
  cgt_segment s_e1 = test_register_affine_flags(t, "eager1", &ue1, CGT_SEGMENT_NO_CAPTURE);
  cgt_segment s_e2 = test_register_affine_flags(t, "eager2", &ue2, CGT_SEGMENT_NO_CAPTURE);
  cgt_segment s_d = test_register_affine(t, "dynamic", &ud);
  float x[BIG_FLOATS];
  for (int i = 0; i < BIG_FLOATS; i++)
    x[i] = 1;
  float *buf = test_dev_floats(x, BIG_FLOATS);
  cgt_arg a = cgt_arg_static(buf, sizeof x), d = cgt_arg_dynamic(buf, sizeof x);
  cgt_value v, e1, e2 = {111}, dv = {222};
  CHECK_OK(t, cgt_run(t, s_a, 0, &a, 1, &v, 1));   /* graph pool: chunk 1 */
  CHECK_OK(t, cgt_run(t, s_e1, 0, &a, 1, &e1, 1)); /* side pool: chunk 2 */
  assert_true(test_read_first(t, v) == 3.0f && test_read_first(t, e1) == 3.0f);
  /* A placeholder and an output in the graph pool need a third chunk. */
  EXPECT_REFUSED(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s_d, 0, &d, 1, &dv, 1));
  /* So does a second eager output in the side pool. */
  EXPECT_REFUSED(t, CGT_ERR_OUT_OF_MEMORY, cgt_run(t, s_e2, 0, &a, 1, &e2, 1));
  assert_int_equal(e2.bits, 111);
  assert_int_equal(dv.bits, 222);
  /* Memory given back within a pool serves that pool again. */
  CHECK_OK(t, cgt_value_release(t, e1));
  CHECK_OK(t, cgt_run(t, s_e2, 0, &a, 1, &e2, 1));
  assert_true(test_read_first(t, e2) == 4.0f);
  CHECK_TREE(t);
  assert_true(test_stats(t).pool_reserved_bytes <= CHUNK_BYTES);
  test_dev_free(buf);
  test_tree_free(t);
}

static void test_tree_create_refuses_a_reserve_above_pool_limit_bytes(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.backend = test_backend;
  o.log_fn = silent_log;
  o.pool_reserve_bytes = (size_t)4 << 20;
  o.pool_limit_bytes = (size_t)1 << 20;
  cgt_tree *t = (cgt_tree *)&o;
  assert_int_equal(cgt_tree_create(&o, &t), CGT_ERR_OUT_OF_MEMORY);
  assert_null(t);
  o.pool_limit_bytes = (size_t)4 << 20;
  CHECK_OK(NULL, cgt_tree_create(&o, &t));
  assert_int_equal(test_stats(t).pool_reserved_bytes, (size_t)4 << 20);
  test_tree_free(t);
}

static void test_device_limit_is_refused_on_a_cuda_tree(void **state) {
  (void)state;
  if (test_backend != CGT_BACKEND_CUDA)
    skip();
  world w;
  world_open(&w, CGT_MODE_TREE);
  WORLD_REFUSES(&w, CGT_ERR_INVALID_ARGUMENT, cgt_sim_set_device_limit(w.t, 0));
  world_close(&w);
}

/* ------------------------------------------------------------ simulator */

static void sim_nop(void *args) { (void)args; }

static void test_simulator_calls_refuse_bad_streams_kernels_and_pointers(void **state) {
  (void)state;
  skip_unless_simulator();
  world w;
  world_open(&w, CGT_MODE_TREE);
  cgt_tree *t = w.t;
  void *stream = cgt_tree_stream(t);
  _Alignas(64) unsigned char not_a_stream[512];
  memset(not_a_stream, 0, sizeof not_a_stream);
  int arg = 5;
  float host[4] = {0};
  void *p = &p;

  assert_int_equal(cgt_sim_launch(NULL, sim_nop, &arg, sizeof arg), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_launch(not_a_stream, sim_nop, &arg, sizeof arg), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_launch(stream, NULL, &arg, sizeof arg), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_launch(stream, sim_nop, NULL, sizeof arg), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_sync(NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_sync(not_a_stream), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_memcpy_async(NULL, host, host + 1, 4), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_memcpy_async(not_a_stream, host, host + 1, 4), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_memcpy_async(stream, NULL, host, 4), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_memcpy_async(stream, host, NULL, 4), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_malloc(NULL, 16, &p), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_malloc(not_a_stream, 16, &p), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_malloc(stream, 16, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_malloc(stream, 0, &p), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_malloc(stream, SIZE_MAX, &p), CGT_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(p, &p);
  assert_int_equal(cgt_sim_free(NULL, host), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_free(not_a_stream, host), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_free(stream, host), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_free(stream, NULL), CGT_OK);
  /* The pool's memory is not the caller's to free. */
  void *v1_ptr = NULL;
  CHECK_OK(t, cgt_value_ptr(t, w.v1, &v1_ptr, NULL));
  snapshot before;
  take(t, &before);
  assert_int_equal(cgt_sim_free(stream, v1_ptr), CGT_ERR_INVALID_ARGUMENT);
  expect_unchanged(t, &before, 0, "cgt_sim_free of pool memory");
  world_expect_values(&w);
  world_close(&w);
}

#define T(f) cmocka_unit_test(f)
const struct CMUnitTest bad_input_tests[] = {
    T(test_status_names_and_strings_cover_every_code_and_out_of_range),
    T(test_tree_create_refuses_null_out_bad_enums_and_impossible_sizes),
    T(test_tree_create_refuses_cuda_where_there_is_none),
    T(test_tree_create_refuses_a_bad_device_or_a_caller_stream_on_the_simulator),
    T(test_tree_create_refuses_a_device_ordinal_the_machine_lacks),
    T(test_every_function_refuses_a_null_tree),
    T(test_segment_register_refuses_null_descriptor_launch_out_and_huge_counts),
    T(test_run_refuses_unknown_segments_and_wrong_counts),
    T(test_run_refuses_zero_foreign_released_and_previous_step_values),
    T(test_run_refuses_null_empty_and_overflowing_caller_memory_and_unknown_kinds),
    T(test_value_calls_refuse_zero_stale_and_bad_sizes),
    T(test_static_and_dynamic_arguments_inside_the_trees_own_pools_are_refused_in_every_mode),
    T(test_values_of_another_tree_are_refused_and_change_nothing_in_either_tree),
    T(test_launch_calls_refuse_a_null_context),
    T(test_bad_launch_calls_inside_a_launch_are_refused_and_change_nothing),
    T(test_tree_calls_from_inside_a_launch_are_refused_and_change_nothing),
    T(test_launch_calls_outside_a_launch_are_refused),
    T(test_failing_launch_of_a_new_node_fails_the_run_and_leaves_no_node),
    T(test_failing_launch_while_recording_fails_the_run_and_keeps_the_node_warming_up),
    T(test_failing_launch_of_an_eager_node_fails_the_run_and_changes_nothing),
    T(test_launch_that_leaves_an_output_unset_or_freed_fails_the_run),
    T(test_inspection_calls_refuse_null_results),
    T(test_out_of_device_memory_at_the_first_warmup_changes_nothing),
    T(test_a_chunk_the_device_refuses_is_asked_for_again_after_the_reclaim_function_gave_memory_back),
    T(test_a_reclaim_function_that_gives_nothing_back_leaves_out_of_memory_and_nothing_changed),
    T(test_pool_limit_bytes_refuses_a_chunk_without_calling_the_reclaim_function),
    T(test_out_of_device_memory_while_recording_changes_nothing),
    T(test_out_of_device_memory_for_a_new_chunk_changes_nothing),
    T(test_pool_limit_refuses_the_first_warmup_and_changes_nothing),
    T(test_pool_limit_refuses_a_recording_that_needs_a_new_chunk_and_changes_nothing),
    T(test_pool_limit_refuses_a_new_chunk_and_changes_nothing),
    T(test_pool_limit_covers_the_graph_pool_the_side_pool_and_placeholders),
    T(test_tree_create_refuses_a_reserve_above_pool_limit_bytes),
    T(test_capture_failure_whose_eager_run_fails_changes_nothing),
    T(test_capture_failure_whose_eager_run_runs_out_of_memory_changes_nothing),
    T(test_rerecord_limit_turns_a_node_eager_only_when_its_eager_run_succeeds),
    T(test_every_host_allocation_of_a_run_failing_in_turn_changes_nothing),
    T(test_host_running_dry_in_the_middle_of_a_run_leaves_a_sound_tree),
    T(test_segment_register_with_each_host_allocation_failing_changes_nothing),
    T(test_device_limit_is_refused_on_a_cuda_tree),
    T(test_simulator_calls_refuse_bad_streams_kernels_and_pointers),
};
const size_t bad_input_test_count = sizeof bad_input_tests / sizeof bad_input_tests[0];
