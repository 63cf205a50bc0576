/* contract.c — promises of the API that no scenario of the other files
 * reaches, each checked where it is stated.
 *
 * An audit of API.md against the suites found these sentences untested:
 * the defaults of cgt_options_init and of a tree made with no options; the
 * node key's byte size of a DYNAMIC argument; rerecord_limit counted per
 * (parent, segment, variant), and its default of 32 when the field is 0;
 * cgt_tree_nodes with a cap below the node count; a segment's name copied
 * at registration; cgt_tree_last_error before any failure; the labels of
 * the dot file's boxes; the side pool's peak; caller memory that only partly overlaps the tree's pools, or lies
 * in a released value's memory; a launch's allocations that it neither
 * freed nor handed out, given back when it returns; and held-back replays
 * (defer_launch) enqueued before a run that runs eagerly. A second audit
 * added: a temporary freed inside a launch handed out again within it;
 * pool_bytes_live as the exact figure of the node's checkpoint; the byte
 * size of a STATIC argument and the address of a VALUE argument in the
 * node key (the random programs of fuzz.c caught those two, for some
 * seeds only); and a failed capture reported in the log. Each test states
 * the promise it checks in its name, and each can fail: the comment above
 * it says how the library would have to break for that.
 *
 * Like scenarios.c, it reaches the device only through the public API and
 * the kernel table, so test_tree runs it on the simulator and test_cuda on
 * a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_lists.h"

#define N 64 /* floats per value */

/* out = a*x + b + variant over every float of input 0, whatever its size:
 * the launch reads the byte size it was given. */
typedef struct sized {
  float a, b;
  int leak;  /* allocate a temporary of this many bytes and never free it */
  int calls;
} sized;

static cgt_status launch_sized(cgt_launch *l, void *user) {
  sized *u = user;
  u->calls++;
  size_t bytes = cgt_launch_input_bytes(l, 0);
  void *out, *tmp;
  cgt_status st = CGT_OK;
  if (u->leak)
    st = cgt_launch_alloc(l, (size_t)u->leak, &tmp);
  if (st == CGT_OK)
    st = cgt_launch_alloc(l, bytes, &out);
  if (st == CGT_OK)
    st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), u->a,
                                u->b + (float)cgt_launch_variant(l), out, bytes / sizeof(float));
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, bytes) : st;
}

static cgt_segment register_sized(cgt_tree *t, const char *name, sized *u, uint32_t flags) {
  cgt_segment_desc d = {name, launch_sized, u, 1, 1, flags};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  return s;
}

/* v must hold a*h[i] + b for its first n floats. */
static void expect_affine(cgt_tree *t, cgt_value v, const float *h, size_t n, float a, float b) {
  float got[2 * N];
  assert_true(n <= 2 * N);
  test_read_value(t, v, got, n);
  for (size_t i = 0; i < n; i++)
    if (got[i] != a * h[i] + b)
      fail_msg("element %zu: got %g, expected %g", i, (double)got[i], (double)(a * h[i] + b));
}

/* How many nodes of segment s are in state st. */
static int nodes_in_state(cgt_tree *t, cgt_segment s, cgt_node_state st) {
  enum { CAP = 128 };
  cgt_node_info info[CAP];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, CAP, &n));
  assert_true(n <= CAP);
  int count = 0;
  for (size_t i = 0; i < n; i++)
    count += info[i].segment == s && info[i].state == st;
  return count;
}

static void fill(float *h, size_t n, float base) {
  for (size_t i = 0; i < n; i++)
    h[i] = base + (float)(i % 7);
}

/* steps steps of s on the STATIC buffer x (N floats, h on the host), each
 * output checked to be a*h + b. */
static void steps_on(cgt_tree *t, cgt_segment s, float *x, const float *h, int steps, float a, float b) {
  for (int step = 0; step < steps; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    expect_affine(t, test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float))), h, N, a, b);
  }
}

/* --------------------------------------------------------------- options */

/* "cgt_options_init: defaults above": each default as API.md states it. */
static void test_options_init_sets_every_documented_default(void **state) {
  (void)state;
  cgt_options o;
  memset(&o, 0x5a, sizeof o);
  cgt_options_init(&o);
  assert_int_equal(o.backend, CGT_BACKEND_AUTO);
  assert_int_equal(o.mode, CGT_MODE_TREE);
  assert_int_equal(o.device, 0);
  assert_null(o.stream);
  assert_int_equal(o.warmup_runs, 1);
  assert_int_equal(o.rerecord_limit, 32);
  assert_int_equal(o.pool_chunk_bytes, (size_t)2 << 20);
  assert_int_equal(o.pool_reserve_bytes, 0);
  assert_int_equal(o.pool_limit_bytes, 0);
  assert_int_equal(o.defer_launch, 0);
  assert_null(o.log_fn);
  assert_null(o.log_user);
}

/* "cgt_tree_create: o may be NULL: defaults". AUTO picks CUDA where a usable
 * GPU is, else the simulator; the first run of a segment warms up
 * (warmup_runs 1), the second records. Fails if NULL options were refused
 * or meant anything but the defaults. */
static void test_a_tree_made_with_no_options_has_the_defaults(void **state) {
  (void)state;
  if (test_backend != (cgt_cuda_available() ? CGT_BACKEND_CUDA : CGT_BACKEND_SIM))
    skip(); /* AUTO would choose another backend than the one under test */
  cgt_tree *t = NULL;
  CHECK_OK(NULL, cgt_tree_create(NULL, &t));
  assert_non_null(t);
  assert_int_equal(cgt_tree_backend(t), test_backend);
  assert_non_null(cgt_tree_stream(t));
  sized u = {.a = 2, .b = 1};
  cgt_segment s = register_sized(t, "defaults", &u, 0);
  float h[N];
  fill(h, N, 1);
  float *x = test_dev_floats(h, N);
  steps_on(t, s, x, h, 3, 2, 1);
  cgt_stats st = test_stats(t);
  assert_int_equal(st.warmups, 1);
  assert_int_equal(st.recordings, 1);
  assert_int_equal(st.replays, 1);
  assert_int_equal(st.pool_reserved_bytes % ((size_t)2 << 20), 0); /* 2 MiB chunks */
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "cgt_tree_last_error: detail of the last failure, "" if none". */
static void test_last_error_is_empty_until_something_fails(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  assert_string_equal(cgt_tree_last_error(t), "");
  sized u = {.a = 1};
  cgt_segment s = register_sized(t, "ok", &u, 0);
  float *x = test_dev_floats(NULL, N);
  (void)test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
  assert_string_equal(cgt_tree_last_error(t), "");
  CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, s + 1, 0, NULL, 0, NULL, 0));
  assert_true(cgt_tree_last_error(t)[0] != '\0');
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* ------------------------------------------------------------ node keys */

/* Eight steps of one segment on x (2N floats of device memory) passed as
 * kind (STATIC or DYNAMIC) with N floats in even steps and 2N in odd ones,
 * new contents each step; each output checked to be 3x - 1 over its size. */
static void alternate_sizes(cgt_tree *t, float *x, cgt_arg_kind kind) {
  sized u = {.a = 3, .b = -1}; /* the tree calls back only inside this function's runs */
  cgt_segment s = register_sized(t, "sized", &u, 0);
  float h[2 * N];
  for (int step = 0; step < 8; step++) {
    size_t n = step % 2 ? 2 * N : N;
    fill(h, 2 * N, (float)step);
    CHECK_OK(t, cgt_sync(t));
    test_dev_upload(x, h, 2 * N); /* a STATIC buffer's contents may change between steps too */
    CHECK_OK(t, cgt_step_begin(t));
    cgt_arg a = kind == CGT_ARG_STATIC ? cgt_arg_static(x, n * sizeof(float)) : cgt_arg_dynamic(x, n * sizeof(float));
    expect_affine(t, test_run1(t, s, 0, a), h, n, 3, -1);
  }
}

/* "A node's key under its parent is (..., the byte size of every DYNAMIC
 * argument)": the same site with a DYNAMIC argument of 64 and of 128 floats
 * makes two nodes, each replayed with its own size, at one address. Fails
 * if the size were left out of the key (one node; the replay of the
 * 128-float run would run the 64-float graph and leave half unwritten). */
static void test_a_dynamic_arguments_byte_size_is_part_of_the_node_key(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  float *x = test_dev_floats(NULL, 2 * N);
  alternate_sizes(t, x, CGT_ARG_DYNAMIC);
  cgt_stats st = test_stats(t);
  assert_int_equal(test_node_count(t), 2);
  assert_int_equal(st.recordings, 2);
  /* warmup_runs counts runs of (segment, variant): the second size records
   * at its first visit, after the first size's warmup. */
  assert_int_equal(st.warmups, 1);
  assert_int_equal(st.replays, 8 - 1 - 2);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* One step per address: s at a STATIC address, each step a new one. */
static void run_at_addresses(cgt_tree *t, cgt_segment s, uint64_t variant, float **bufs, int n_bufs, const float *h) {
  for (int i = 0; i < n_bufs; i++) {
    CHECK_OK(t, cgt_step_begin(t));
    expect_affine(t, test_run1(t, s, variant, cgt_arg_static(bufs[i], N * sizeof(float))), h, N, 2, 1 + (float)variant);
  }
}

/* "rerecord_limit: max recorded children per (parent, segment, variant)":
 * with a limit of 1, variant 3 and variant 7 each get one recording and one
 * eager node at their second address. Fails if the limit were counted per
 * (parent, segment): variant 7 would find it spent and record nothing. */
static void test_rerecord_limit_counts_each_variant_apart(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.rerecord_limit = 1;
  o.warmup_runs = 0;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  sized u = {.a = 2, .b = 1};
  cgt_segment s = register_sized(t, "variants", &u, 0);
  float h[N];
  fill(h, N, 0);
  float *bufs[2] = {test_dev_floats(h, N), test_dev_floats(h, N)};
  run_at_addresses(t, s, 3, bufs, 2, h);
  run_at_addresses(t, s, 7, bufs, 2, h);
  cgt_stats st = test_stats(t);
  assert_int_equal(st.recordings, 2);
  assert_int_equal(nodes_in_state(t, s, CGT_NODE_RECORDED), 2);
  assert_int_equal(nodes_in_state(t, s, CGT_NODE_EAGER), 2);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(bufs[0]);
  test_dev_free(bufs[1]);
}

/* "rerecord_limit = 0 means its default" (32): a zeroed cgt_options records
 * 32 STATIC addresses at one site, and the 33rd and 34th run on one eager
 * node. Fails if 0 meant another limit (the zero-options scenario records
 * only three addresses, which any limit of 3 or more would pass). Update in
 * place is turned off (its one non-zero field): it would instead move the
 * addresses into recordings the site already has, and never reach the
 * limit. */
static void test_a_zero_rerecord_limit_allows_exactly_32_recordings_at_a_site(void **state) {
  (void)state;
  cgt_options o;
  memset(&o, 0, sizeof o);
  o.no_update_in_place = 1;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  sized u = {.a = 2, .b = 1};
  cgt_segment s = register_sized(t, "thirty-two", &u, 0);
  enum { BUFS = 34 };
  float h[N];
  fill(h, N, 2);
  float *bufs[BUFS];
  for (int i = 0; i < BUFS; i++)
    bufs[i] = test_dev_floats(h, N);
  run_at_addresses(t, s, 0, bufs, BUFS, h);
  cgt_stats st = test_stats(t);
  assert_int_equal(st.recordings, 32);
  assert_int_equal(nodes_in_state(t, s, CGT_NODE_RECORDED), 32);
  assert_int_equal(nodes_in_state(t, s, CGT_NODE_EAGER), 1);
  assert_int_equal(test_node_count(t), 33);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  for (int i = 0; i < BUFS; i++)
    test_dev_free(bufs[i]);
}

/* -------------------------------------------------------------- inspection */

/* "cgt_tree_nodes writes at most cap entries ordered by id and sets *count
 * to the total": five nodes, cap 2; the third slot stays as it was. */
static void test_tree_nodes_writes_at_most_cap_entries_and_counts_them_all(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  sized u[5];
  cgt_segment s[5];
  float *x = test_dev_floats(NULL, N);
  for (int i = 0; i < 5; i++) {
    char name[8];
    snprintf(name, sizeof name, "n%d", i);
    u[i] = (sized){.a = 1, .b = (float)i};
    s[i] = register_sized(t, name, &u[i], 0);
  }
  cgt_value v = test_run1(t, s[0], 0, cgt_arg_static(x, N * sizeof(float)));
  for (int i = 1; i < 5; i++)
    v = test_run1(t, s[i], 0, cgt_arg_value(v));
  cgt_node_info out[3], sentinel;
  memset(out, 0xab, sizeof out);
  memset(&sentinel, 0xab, sizeof sentinel);
  size_t count = 0;
  CHECK_OK(t, cgt_tree_nodes(t, out, 2, &count));
  assert_int_equal(count, 5);
  assert_int_equal(out[0].id, 1);
  assert_int_equal(out[1].id, 2);
  assert_int_equal(out[1].parent, 1);
  assert_memory_equal(&out[2], &sentinel, sizeof sentinel);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "name — copied; shown in logs, dot files and node info": the caller's
 * buffer is overwritten after registration, and the node info and the dot
 * file still show the name it held. */
static void test_a_segment_name_is_copied_at_registration(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  char name[16] = "alpha-seg";
  sized u = {.a = 1};
  cgt_segment s = register_sized(t, name, &u, 0);
  memset(name, 'X', sizeof name - 1);
  float *x = test_dev_floats(NULL, N);
  (void)test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
  cgt_node_info info;
  size_t count = 0;
  CHECK_OK(t, cgt_tree_nodes(t, &info, 1, &count));
  assert_int_equal(count, 1);
  assert_string_equal(info.segment_name, "alpha-seg");
  char dot[4096];
  test_dot_text(t, dot, sizeof dot);
  assert_non_null(strstr(dot, "alpha-seg"));
  assert_null(strstr(dot, "XXXX"));
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "cgt_tree_write_dot: Graphviz: one box per node with segment, state,
 * replays": each node's box names its segment, its state and its replay
 * count as cgt_tree_nodes reports them, for a recorded node that replayed
 * and an uncapturable one. Fails if a label showed another node's figures
 * or stale ones. */
static void test_write_dot_labels_each_node_with_its_segment_state_and_replays(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  sized ur = {.a = 2}, ue = {.a = 3};
  cgt_segment sr = register_sized(t, "graphed", &ur, 0);
  cgt_segment se = register_sized(t, "plain", &ue, CGT_SEGMENT_NO_CAPTURE);
  float *x = test_dev_floats(NULL, N);
  for (int step = 0; step < 5; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value v = test_run1(t, sr, 0, cgt_arg_static(x, N * sizeof(float)));
    (void)test_run1(t, se, 0, cgt_arg_value(v));
  }
  char dot[8192];
  test_dot_text(t, dot, sizeof dot);
  cgt_node_info info[4];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 4, &n));
  assert_int_equal(n, 2);
  assert_int_equal(info[0].state, CGT_NODE_RECORDED);
  assert_int_equal(info[0].replays, 3);
  assert_int_equal(info[1].state, CGT_NODE_EAGER);
  for (size_t i = 0; i < n; i++) {
    char label[256];
    snprintf(label, sizeof label, "[label=\"#%u %s\\nvariant %llu\\n%s\\nreplays %llu, eager %llu", info[i].id,
             info[i].segment_name, (unsigned long long)info[i].variant, cgt_node_state_name(info[i].state),
             (unsigned long long)info[i].replays, (unsigned long long)info[i].eager_runs);
    if (!strstr(dot, label))
      fail_msg("no box labelled %s in:\n%s", label, dot);
  }
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "side_pool_peak_bytes — memory of eager nodes, outside the graph pool":
 * 0 in a tree whose nodes all record, and at least an eager node's output
 * once one ran. Fails if eager nodes allocated in the graph pool, or the
 * figure were not kept. */
static void test_side_pool_peak_counts_eager_nodes_memory_only(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  sized rec = {.a = 2}, eager = {.a = 3};
  cgt_segment sr = register_sized(t, "recorded", &rec, 0);
  cgt_segment se = register_sized(t, "eager", &eager, CGT_SEGMENT_NO_CAPTURE);
  float h[N];
  fill(h, N, 1);
  float *x = test_dev_floats(h, N);
  steps_on(t, sr, x, h, 3, 2, 0);
  assert_int_equal(test_stats(t).side_pool_peak_bytes, 0);
  size_t graph_peak = test_stats(t).pool_peak_bytes;
  for (int step = 0; step < 3; step++) {
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value v = test_run1(t, sr, 0, cgt_arg_static(x, N * sizeof(float)));
    cgt_value w = test_run1(t, se, 0, cgt_arg_value(v));
    float y[N];
    for (int i = 0; i < N; i++)
      y[i] = 2 * h[i];
    expect_affine(t, w, y, N, 3, 0);
  }
  cgt_stats st = test_stats(t);
  assert_true(st.side_pool_peak_bytes >= N * sizeof(float));
  assert_int_equal(st.pool_peak_bytes, graph_peak); /* the eager output stayed out of the graph pool */
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* ---------------------------------------------------------- caller memory */

/* "a STATIC or DYNAMIC argument that overlaps memory of the tree's pools is
 * refused with CGT_ERR_INVALID_ARGUMENT, in every mode": a range that begins
 * before a value and runs into it, and the memory of a released value
 * (still the pool's). Each refusal changes no counter. Fails if only ranges
 * wholly inside a live value were checked. */
static void test_caller_memory_that_only_partly_overlaps_the_pool_or_lies_in_a_released_value_is_refused(void **state) {
  (void)state;
  const cgt_mode modes[] = {CGT_MODE_TREE, CGT_MODE_SEPARATE, CGT_MODE_EAGER};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    cgt_tree *t = test_tree_new(modes[m], NULL);
    sized u = {.a = 1};
    cgt_segment s = register_sized(t, "pool", &u, 0);
    float *x = test_dev_floats(NULL, N);
    cgt_value keep = test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float)));
    cgt_value gone = test_run1(t, s, 0, cgt_arg_value(keep));
    void *kp = NULL, *gp = NULL;
    size_t kb = 0, gb = 0;
    CHECK_OK(t, cgt_value_ptr(t, keep, &kp, &kb));
    CHECK_OK(t, cgt_value_ptr(t, gone, &gp, &gb));
    CHECK_OK(t, cgt_value_release(t, gone));
    const cgt_arg bad[] = {
        cgt_arg_static((char *)kp - 16, 32),  cgt_arg_dynamic((char *)kp - 16, 32),
        cgt_arg_static(gp, gb),               cgt_arg_dynamic(gp, gb),
        cgt_arg_static((char *)kp + kb - 8, 64),
    };
    cgt_stats before = test_stats(t);
    size_t nodes = test_node_count(t);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      cgt_value out = {0};
      CHECK_STATUS(t, CGT_ERR_INVALID_ARGUMENT, cgt_run(t, s, 0, &bad[i], 1, &out, 1));
      assert_int_equal(out.bits, 0);
    }
    cgt_stats after = test_stats(t);
    assert_int_equal(after.runs, before.runs);
    assert_int_equal(after.pool_allocated_bytes, before.pool_allocated_bytes);
    assert_int_equal(test_node_count(t), nodes);
    CHECK_TREE(t);
    CHECK_OK(t, cgt_sync(t));
    test_tree_free(t);
    test_dev_free(x);
  }
}

/* ------------------------------------------------------------- launches */

/* "Allocations ... neither freed nor (inside) an output are freed when the
 * launch returns": a launch that leaks a 1000-byte temporary leaves the
 * graph pool holding what a twin that leaks nothing holds, in EAGER mode
 * and at a TREE warmup and recording; and on a TREE node declared
 * uncapturable, whose runs use the side pool, that pool's peak stays where
 * the first runs put it over 30 more. Fails if a launch's leak stayed
 * allocated (the figures would grow by 1000 bytes a run). */
static void test_a_launchs_unfreed_temporaries_are_given_back_when_it_returns(void **state) {
  (void)state;
  const struct {
    cgt_mode mode;
    uint32_t flags;
  } cases[] = {{CGT_MODE_EAGER, 0}, {CGT_MODE_TREE, 0}, {CGT_MODE_TREE, CGT_SEGMENT_NO_CAPTURE}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t allocated[2];
    for (int leak = 0; leak < 2; leak++) {
      cgt_tree *t = test_tree_new(cases[c].mode, NULL);
      sized u = {.a = 2, .b = 1, .leak = leak ? 1000 : 0};
      cgt_segment s = register_sized(t, "leaky", &u, cases[c].flags);
      float h[N];
      fill(h, N, 3);
      float *x = test_dev_floats(h, N);
      cgt_stats after3 = {0};
      for (int step = 0; step < 33; step++) {
        CHECK_OK(t, cgt_step_begin(t));
        expect_affine(t, test_run1(t, s, 0, cgt_arg_static(x, N * sizeof(float))), h, N, 2, 1);
        CHECK_OK(t, cgt_sync(t));
        if (step == 2)
          after3 = test_stats(t);
      }
      cgt_stats after33 = test_stats(t);
      if (after33.pool_allocated_bytes != after3.pool_allocated_bytes ||
          after33.side_pool_peak_bytes != after3.side_pool_peak_bytes)
        fail_msg("case %zu, leak %d: graph pool %zu then %zu bytes, side pool peak %zu then %zu", c, leak,
                 after3.pool_allocated_bytes, after33.pool_allocated_bytes, after3.side_pool_peak_bytes,
                 after33.side_pool_peak_bytes);
      allocated[leak] = after33.pool_allocated_bytes;
      assert_int_equal(u.calls, cases[c].mode == CGT_MODE_TREE && !cases[c].flags ? 2 : 33);
      test_tree_free(t);
      test_dev_free(x);
    }
    if (allocated[1] != allocated[0])
      fail_msg("case %zu: %zu bytes allocated with a leaking launch, %zu without", c, allocated[1], allocated[0]);
  }
}

/* "Held-back work is enqueued ... no later than the next ... cgt_run that
 * ... runs eagerly": replays of A and B are held back, then an uncapturable
 * C reads B's output eagerly. C must see B's result: fails if the eager run
 * went ahead of the held-back launch (on the simulator a held-back replay
 * has not run at all, so C would read the recording's stale data). */
static void test_deferred_replays_are_enqueued_before_a_run_that_runs_eagerly(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.defer_launch = 1;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  sized ua = {.a = 2, .b = 1}, ub = {.a = 3, .b = 0}, uc = {.a = 1, .b = 5};
  cgt_segment sa = register_sized(t, "a", &ua, 0);
  cgt_segment sb = register_sized(t, "b", &ub, 0);
  cgt_segment sc = register_sized(t, "c", &uc, CGT_SEGMENT_NO_CAPTURE);
  float *x = test_dev_floats(NULL, N);
  for (int step = 0; step < 12; step++) {
    float h[N], y[N];
    fill(h, N, (float)(step * 3));
    for (int i = 0; i < N; i++)
      y[i] = 3 * (2 * h[i] + 1);
    CHECK_OK(t, cgt_sync(t));
    test_dev_upload(x, h, N);
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value va = test_run1(t, sa, 0, cgt_arg_dynamic(x, N * sizeof(float)));
    cgt_value vb = test_run1(t, sb, 0, cgt_arg_value(va));
    cgt_value vc = test_run1(t, sc, 0, cgt_arg_value(vb));
    expect_affine(t, vc, y, N, 1, 5);
  }
  cgt_stats st = test_stats(t);
  assert_true(st.replays >= 2 * 10);
  assert_int_equal(nodes_in_state(t, sc, CGT_NODE_EAGER), 1);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "cgt_launch_free: gives back a temporary that later work of the launch
 * no longer needs (the memory may be handed out again within the launch)":
 * a launch that takes a 1 MiB temporary, frees it, and takes another,
 * peaks at one of them in EAGER mode, at a TREE warmup and at a recording.
 * Fails if a freed temporary were held until the launch returned (the
 * peak would be both, 2 MiB). */
typedef struct cycles {
  int calls;
} cycles;

static cgt_status launch_cycles(cgt_launch *l, void *user) {
  ((cycles *)user)->calls++;
  enum { MIB = 1 << 20 };
  for (int i = 0; i < 2; i++) {
    void *tmp;
    cgt_status st = cgt_launch_alloc(l, MIB, &tmp);
    if (st != CGT_OK)
      return st;
    st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), 1, 0, tmp, N);
    if (st == CGT_OK)
      st = cgt_launch_free(l, tmp);
    if (st != CGT_OK)
      return st;
  }
  void *out;
  cgt_status st = cgt_launch_alloc(l, N * sizeof(float), &out);
  if (st == CGT_OK)
    st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), 2, 1, out, N);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, N * sizeof(float)) : st;
}

static void test_a_temporary_freed_inside_a_launch_is_handed_out_again_within_it(void **state) {
  (void)state;
  const cgt_mode modes[] = {CGT_MODE_EAGER, CGT_MODE_TREE};
  for (size_t m = 0; m < 2; m++) {
    cgt_tree *t = test_tree_new(modes[m], NULL);
    cycles u = {0};
    cgt_segment_desc d = {"cycles", launch_cycles, &u, 1, 1, 0};
    cgt_segment s = 0;
    CHECK_OK(t, cgt_segment_register(t, &d, &s));
    float h[N];
    fill(h, N, 1);
    float *x = test_dev_floats(h, N);
    steps_on(t, s, x, h, 3, 2, 1); /* TREE: warmup, recording, replay */
    assert_int_equal(u.calls, modes[m] == CGT_MODE_TREE ? 2 : 3);
    cgt_stats st = test_stats(t);
    if (st.pool_peak_bytes < ((size_t)1 << 20) || st.pool_peak_bytes >= ((size_t)2 << 20))
      fail_msg("mode %zu: pool peak %zu bytes, one 1 MiB temporary at a time would be 1 MiB and a bit", m,
               st.pool_peak_bytes);
    CHECK_OK(t, cgt_sync(t));
    test_tree_free(t);
    test_dev_free(x);
  }
}

/* "pool_bytes_live: pool bytes allocated at this node's checkpoint": with
 * no warmup, A records into the empty pool and B records after it while
 * A's output lives; each node reports the pool's allocated bytes read right
 * after its recording (A's output; A's and B's). Fails for any other
 * figure (an earlier test only asked for at least the output's size). */
static void test_pool_bytes_live_is_the_pool_allocated_at_the_nodes_checkpoint(void **state) {
  (void)state;
  cgt_options o;
  cgt_options_init(&o);
  o.warmup_runs = 0;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  sized ua = {.a = 2, .b = 1}, ub = {.a = 3, .b = 0};
  cgt_segment sa = register_sized(t, "a", &ua, 0);
  cgt_segment sb = register_sized(t, "b", &ub, 0);
  float h[N];
  fill(h, N, 2);
  float *x = test_dev_floats(h, N);
  CHECK_OK(t, cgt_step_begin(t));
  cgt_value va = test_run1(t, sa, 0, cgt_arg_static(x, N * sizeof(float)));
  size_t after_a = test_stats(t).pool_allocated_bytes;
  cgt_value vb = test_run1(t, sb, 0, cgt_arg_value(va));
  size_t after_b = test_stats(t).pool_allocated_bytes;
  assert_int_equal(test_stats(t).recordings, 2);
  expect_affine(t, va, h, N, 2, 1);
  assert_true(after_a >= N * sizeof(float) && after_b >= after_a + N * sizeof(float));
  cgt_node_info info[4];
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, info, 4, &n));
  assert_int_equal(n, 2);
  for (size_t i = 0; i < n; i++) {
    size_t want = info[i].segment == sa ? after_a : after_b;
    if (info[i].pool_bytes_live != want)
      fail_msg("node %u (%s): pool_bytes_live %zu, the pool held %zu after its recording", info[i].id,
               info[i].segment_name, info[i].pool_bytes_live, want);
  }
  (void)vb;
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "A node's key under its parent is (..., the address and byte size of
 * every STATIC argument)": the same STATIC buffer passed as 64 and as 128
 * floats in alternate steps makes two nodes, each replayed with its own
 * size. Fails if the size were left out of the key (the 128-float replay
 * would run the 64-float graph and leave half unwritten). */
static void test_a_static_arguments_byte_size_is_part_of_the_node_key(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  float *x = test_dev_floats(NULL, 2 * N);
  alternate_sizes(t, x, CGT_ARG_STATIC);
  assert_int_equal(test_node_count(t), 2);
  assert_int_equal(test_stats(t).recordings, 2);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "... the address of every VALUE argument": C takes A's output in even
 * steps and B's in odd ones, both alive at their own addresses, after the
 * same parent. That makes two nodes for C, each reading its own input.
 * Fails if the address were left out of the key (one node, whose replay
 * would read the value it was recorded with). */
static void test_a_value_arguments_address_is_part_of_the_node_key(void **state) {
  (void)state;
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, NULL);
  sized ua = {.a = 2, .b = 1}, ub = {.a = 3, .b = 0}, uc = {.a = 1, .b = 5};
  cgt_segment sa = register_sized(t, "a", &ua, 0);
  cgt_segment sb = register_sized(t, "b", &ub, 0);
  cgt_segment sc = register_sized(t, "c", &uc, 0);
  float *x = test_dev_floats(NULL, N);
  for (int step = 0; step < 10; step++) {
    float h[N], y[N];
    fill(h, N, (float)step);
    int takes_b = step % 2;
    for (int i = 0; i < N; i++)
      y[i] = takes_b ? 3 * h[i] : 2 * h[i] + 1;
    CHECK_OK(t, cgt_sync(t));
    test_dev_upload(x, h, N);
    CHECK_OK(t, cgt_step_begin(t));
    cgt_value va = test_run1(t, sa, 0, cgt_arg_static(x, N * sizeof(float)));
    cgt_value vb = test_run1(t, sb, 0, cgt_arg_static(x, N * sizeof(float)));
    expect_affine(t, test_run1(t, sc, 0, cgt_arg_value(takes_b ? vb : va)), y, N, 1, 5);
  }
  assert_int_equal(nodes_in_state(t, sc, CGT_NODE_RECORDED), 2);
  assert_true(test_stats(t).replays >= 3 * 6);
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

/* "CGT_ERR_CAPTURE_FAILED: reported in node info/logs": a segment whose
 * launch synchronises its stream (which no capture allows) runs eagerly,
 * and the tree's log gets exactly one warning that names it, however often
 * it runs after. Fails if the failure were only counted. */
typedef struct warnings_seen {
  int count;
  char last[512];
} warnings_seen;

static void note_warning(void *user, int level, const char *msg) {
  warnings_seen *w = user;
  if (level == CGT_LOG_WARN) {
    w->count++;
    snprintf(w->last, sizeof w->last, "%s", msg);
  }
}

static void test_a_failed_capture_is_reported_once_in_the_log_naming_its_segment(void **state) {
  (void)state;
  warnings_seen w = {0};
  cgt_options o;
  cgt_options_init(&o);
  o.log_fn = note_warning;
  o.log_user = &w;
  /* The suites run with CGT_LOG=error (quiet), which would filter the
   * warning out: this tree is made at the level a log_fn gets by default. */
  const char *env = getenv("CGT_LOG");
  char saved[32] = "";
  if (env)
    snprintf(saved, sizeof saved, "%s", env);
  unsetenv("CGT_LOG");
  cgt_tree *t = test_tree_new(CGT_MODE_TREE, &o);
  if (env)
    setenv("CGT_LOG", saved, 1);
  test_affine u = {.a = 2, .b = 0, .n = N, .illegal = 1};
  cgt_segment s = test_register_affine(t, "syncs_its_stream", &u);
  float h[N];
  fill(h, N, 1);
  float *x = test_dev_floats(h, N);
  steps_on(t, s, x, h, 6, 2, 0);
  assert_int_equal(test_stats(t).capture_failures, 1);
  assert_int_equal(nodes_in_state(t, s, CGT_NODE_EAGER), 1);
  assert_int_equal(w.count, 1);
  assert_non_null(strstr(w.last, "syncs_its_stream"));
  CHECK_OK(t, cgt_sync(t));
  test_tree_free(t);
  test_dev_free(x);
}

const struct CMUnitTest contract_tests[] = {
    cmocka_unit_test(test_options_init_sets_every_documented_default),
    cmocka_unit_test(test_a_tree_made_with_no_options_has_the_defaults),
    cmocka_unit_test(test_last_error_is_empty_until_something_fails),
    cmocka_unit_test(test_a_dynamic_arguments_byte_size_is_part_of_the_node_key),
    cmocka_unit_test(test_rerecord_limit_counts_each_variant_apart),
    cmocka_unit_test(test_a_zero_rerecord_limit_allows_exactly_32_recordings_at_a_site),
    cmocka_unit_test(test_tree_nodes_writes_at_most_cap_entries_and_counts_them_all),
    cmocka_unit_test(test_a_segment_name_is_copied_at_registration),
    cmocka_unit_test(test_write_dot_labels_each_node_with_its_segment_state_and_replays),
    cmocka_unit_test(test_side_pool_peak_counts_eager_nodes_memory_only),
    cmocka_unit_test(test_caller_memory_that_only_partly_overlaps_the_pool_or_lies_in_a_released_value_is_refused),
    cmocka_unit_test(test_a_launchs_unfreed_temporaries_are_given_back_when_it_returns),
    cmocka_unit_test(test_deferred_replays_are_enqueued_before_a_run_that_runs_eagerly),
    cmocka_unit_test(test_a_temporary_freed_inside_a_launch_is_handed_out_again_within_it),
    cmocka_unit_test(test_pool_bytes_live_is_the_pool_allocated_at_the_nodes_checkpoint),
    cmocka_unit_test(test_a_static_arguments_byte_size_is_part_of_the_node_key),
    cmocka_unit_test(test_a_value_arguments_address_is_part_of_the_node_key),
    cmocka_unit_test(test_a_failed_capture_is_reported_once_in_the_log_naming_its_segment),
};
const size_t contract_test_count = sizeof contract_tests / sizeof contract_tests[0];
