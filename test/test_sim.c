/* test_sim.c — the simulator backend behaves like CUDA where the tree can tell.
 *
 * These tests drive backend_sim_ops directly, without a tree: eager work runs
 * at once, capture records instead of running, replays use the argument
 * bytes of capture time, forbidden calls invalidate a capture and leave the
 * stream usable, the device limit refuses and recovers, and nothing leaks.
 * Every test runs on a fresh device whose teardown checks that all memory,
 * graphs and executables were given back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "cgtree_sim.h"

typedef struct fixture {
  backend b;
} fixture;

static int open_device(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (f == NULL) return -1;
  f->b.ops = &backend_sim_ops;
  if (f->b.ops->open(&f->b, 0, NULL) != CGT_OK) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

static int close_device_and_check_nothing_leaked(void **state) {
  fixture *f = *state;
  backend_sim_counters c;
  backend_sim_read_counters(&f->b, &c);
  assert_int_equal(backend_sim_outstanding_bytes(&f->b), 0);
  assert_int_equal(c.live_allocations, 0);
  assert_int_equal(c.live_graphs, 0);
  assert_int_equal(c.live_execs, 0);
  assert_int_equal(c.bad_frees, 0);
  f->b.ops->close(&f->b);
  assert_string_equal(f->b.error, "");
  assert_null(f->b.impl);
  assert_null(f->b.stream);
  free(f);
  return 0;
}

static backend *dev(void **state) {
  return &((fixture *)*state)->b;
}

static backend_sim_counters counters(backend *b) {
  backend_sim_counters c;
  backend_sim_read_counters(b, &c);
  return c;
}

/* ------------------------------------------------------------ kernels */

typedef struct add_args {
  int *target;
  int amount;
} add_args;

static void add_kernel(void *args) {
  add_args *a = args;
  *a->target += a->amount;
}

/* Adds, then overwrites its own arguments, as a careless kernel might. */
static void add_then_scribble_kernel(void *args) {
  add_args *a = args;
  *a->target += a->amount;
  a->amount = 1000000;
  a->target = NULL;
}

typedef struct log_args {
  int *log;
  int *count;
  int tag;
} log_args;

static void log_kernel(void *args) {
  log_args *a = args;
  a->log[(*a->count)++] = a->tag;
}

/* Wider than the simulator's on-stack copy, so the heap path runs too. */
typedef struct wide_args {
  long *sum;
  long values[200];
} wide_args;

static void sum_kernel(void *args) {
  wide_args *a = args;
  for (size_t i = 0; i < sizeof a->values / sizeof a->values[0]; i++) *a->sum += a->values[i];
}

static void *last_args_seen;
static int no_args_calls;

static void no_args_kernel(void *args) {
  last_args_seen = args;
  no_args_calls++;
}

/* Helpers that record a whole capture and hand back its graph. */
static void *capture_graph(backend *b, void (*enqueue)(void *stream, void *ctx), void *ctx) {
  void *graph = NULL;
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  enqueue(b->stream, ctx);
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_OK);
  assert_non_null(graph);
  return graph;
}

static void enqueue_add(void *stream, void *ctx) {
  add_args *a = ctx;
  assert_int_equal(cgt_sim_launch(stream, add_kernel, a, sizeof *a), CGT_OK);
}

/* ------------------------------------------------------------- eager */

static void test_eager_launch_runs_the_kernel_at_once(void **state) {
  backend *b = dev(state);
  int target = 1;
  add_args a = {&target, 41};
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(target, 42);
  assert_int_equal(counters(b).kernels_eager, 1);
  assert_int_equal(counters(b).kernels_recorded, 0);
}

static void test_eager_launch_hands_the_kernel_a_copy_of_its_arguments(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 5};
  assert_int_equal(cgt_sim_launch(b->stream, add_then_scribble_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(target, 5);
  assert_ptr_equal(a.target, &target);
  assert_int_equal(a.amount, 5);
}

static void test_eager_launch_with_wide_arguments_runs_at_once(void **state) {
  backend *b = dev(state);
  long sum = 0;
  wide_args *a = calloc(1, sizeof *a);
  assert_non_null(a);
  a->sum = &sum;
  for (int i = 0; i < 200; i++) a->values[i] = i + 1;
  assert_int_equal(cgt_sim_launch(b->stream, sum_kernel, a, sizeof *a), CGT_OK);
  assert_int_equal(sum, 200 * 201 / 2);
  free(a);
}

static void test_launch_with_zero_arg_bytes_passes_null_args(void **state) {
  backend *b = dev(state);
  int ignored = 7;
  no_args_calls = 0;
  last_args_seen = &ignored;
  assert_int_equal(cgt_sim_launch(b->stream, no_args_kernel, &ignored, 0), CGT_OK);
  assert_int_equal(no_args_calls, 1);
  assert_null(last_args_seen);
  assert_int_equal(cgt_sim_launch(b->stream, no_args_kernel, NULL, 0), CGT_OK);
  assert_int_equal(no_args_calls, 2);
}

static void test_sync_outside_capture_succeeds(void **state) {
  backend *b = dev(state);
  assert_int_equal(cgt_sim_sync(b->stream), CGT_OK);
  assert_int_equal(b->ops->sync(b), CGT_OK);
}

/* ------------------------------------------------------ capture/replay */

static void test_capture_records_kernels_without_running_them(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 3};
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_true(backend_sim_capturing(b));
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(target, 0);
  void *graph = NULL;
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_OK);
  assert_false(backend_sim_capturing(b));
  assert_int_equal(target, 0);
  assert_int_equal(counters(b).kernels_recorded, 2);
  assert_int_equal(counters(b).kernels_eager, 0);

  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(target, 0);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(target, 6);
  b->ops->graph_destroy(b, graph, exec);
}

static void test_replay_uses_the_argument_bytes_of_capture_time(void **state) {
  backend *b = dev(state);
  int first = 0, second = 0;
  add_args a = {&first, 10};
  void *graph = capture_graph(b, enqueue_add, &a);
  /* The caller reuses its argument struct after the launch, as compiled
   * code does with its stack. */
  a.target = &second;
  a.amount = 99;
  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(first, 10);
  assert_int_equal(second, 0);
  b->ops->graph_destroy(b, graph, exec);
}

static void test_replaying_twice_runs_the_kernels_twice(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 4};
  void *graph = capture_graph(b, enqueue_add, &a);
  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(target, 8);
  assert_int_equal(counters(b).kernels_replayed, 2);
  assert_int_equal(counters(b).graph_launches, 2);
  b->ops->graph_destroy(b, graph, exec);
}

static void enqueue_three_logs(void *stream, void *ctx) {
  log_args *a = ctx;
  for (int tag = 1; tag <= 3; tag++) {
    a->tag = tag;
    assert_int_equal(cgt_sim_launch(stream, log_kernel, a, sizeof *a), CGT_OK);
  }
}

static void test_replay_runs_the_nodes_in_recording_order(void **state) {
  backend *b = dev(state);
  int log[8] = {0}, count = 0;
  log_args a = {log, &count, 0};
  void *graph = capture_graph(b, enqueue_three_logs, &a);
  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(count, 3);
  assert_int_equal(log[0], 1);
  assert_int_equal(log[1], 2);
  assert_int_equal(log[2], 3);
  b->ops->graph_destroy(b, graph, exec);
}

static void enqueue_scribbler(void *stream, void *ctx) {
  add_args *a = ctx;
  assert_int_equal(cgt_sim_launch(stream, add_then_scribble_kernel, a, sizeof *a), CGT_OK);
}

static void test_a_kernel_that_writes_its_arguments_does_not_change_the_recording(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 2};
  void *graph = capture_graph(b, enqueue_scribbler, &a);
  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  for (int i = 0; i < 3; i++) assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(target, 6);
  b->ops->graph_destroy(b, graph, exec);
}

static void enqueue_wide(void *stream, void *ctx) {
  wide_args *a = ctx;
  assert_int_equal(cgt_sim_launch(stream, sum_kernel, a, sizeof *a), CGT_OK);
}

static void test_replay_of_wide_arguments_uses_the_recorded_bytes(void **state) {
  backend *b = dev(state);
  long sum = 0;
  wide_args *a = calloc(1, sizeof *a);
  assert_non_null(a);
  a->sum = &sum;
  for (int i = 0; i < 200; i++) a->values[i] = 1;
  void *graph = capture_graph(b, enqueue_wide, a);
  memset(a->values, 0, sizeof a->values);
  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(sum, 400);
  b->ops->graph_destroy(b, graph, exec);
  free(a);
}

static void test_an_empty_capture_gives_a_graph_that_launches_and_does_nothing(void **state) {
  backend *b = dev(state);
  void *graph = NULL, *exec = NULL;
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_OK);
  assert_non_null(graph);
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(counters(b).kernels_replayed, 0);
  b->ops->graph_destroy(b, graph, exec);
}

static void test_the_executable_survives_destroying_its_graph(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 7};
  void *graph = capture_graph(b, enqueue_add, &a);
  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  b->ops->graph_destroy(b, graph, NULL);
  assert_int_equal(counters(b).live_graphs, 0);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(target, 7);
  b->ops->graph_destroy(b, NULL, exec);
}

static void test_one_graph_instantiates_into_independent_executables(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 1};
  void *graph = capture_graph(b, enqueue_add, &a);
  void *e1 = NULL, *e2 = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &e1), CGT_OK);
  assert_int_equal(b->ops->instantiate(b, graph, &e2), CGT_OK);
  assert_ptr_not_equal(e1, e2);
  b->ops->graph_destroy(b, NULL, e1);
  assert_int_equal(b->ops->launch(b, e2), CGT_OK);
  assert_int_equal(target, 1);
  b->ops->graph_destroy(b, graph, e2);
}

typedef struct relaunch_args {
  backend *b;
  void **exec;
  cgt_status *result;
} relaunch_args;

static void relaunch_kernel(void *args) {
  relaunch_args *a = args;
  *a->result = a->b->ops->launch(a->b, *a->exec);
}

static void enqueue_relaunch(void *stream, void *ctx) {
  relaunch_args *a = ctx;
  assert_int_equal(cgt_sim_launch(stream, relaunch_kernel, a, sizeof *a), CGT_OK);
}

static void test_an_executable_launched_from_inside_its_own_replay_is_rejected(void **state) {
  backend *b = dev(state);
  void *exec = NULL;
  cgt_status result = CGT_OK;
  relaunch_args a = {b, &exec, &result};
  void *graph = capture_graph(b, enqueue_relaunch, &a);
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(result, CGT_ERR_STATE);
  assert_int_equal(counters(b).graph_launches, 1);
  /* The refusal left nothing behind: the executable launches again. */
  result = CGT_OK;
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(result, CGT_ERR_STATE);
  b->ops->graph_destroy(b, graph, exec);
}

static void test_capture_begin_while_capturing_is_a_state_error(void **state) {
  backend *b = dev(state);
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(b->ops->capture_begin(b), CGT_ERR_STATE);
  assert_true(strlen(b->error) > 0);
  void *graph = NULL;
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_OK);
  b->ops->graph_destroy(b, graph, NULL);
}

static void test_capture_end_without_a_capture_is_a_state_error(void **state) {
  backend *b = dev(state);
  void *graph = (void *)&graph;
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_ERR_STATE);
  assert_null(graph);
  assert_int_equal(b->ops->capture_end(b, NULL), CGT_ERR_INVALID_ARGUMENT);
}

static void test_a_graph_launch_during_capture_is_rejected_and_leaves_the_capture_intact(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 1};
  void *graph = capture_graph(b, enqueue_add, &a);
  void *exec = NULL, *second = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_ERR_STATE);
  assert_int_equal(target, 0);
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(b->ops->capture_end(b, &second), CGT_OK);
  assert_int_equal(counters(b).captures_invalidated, 0);
  b->ops->graph_destroy(b, second, NULL);
  b->ops->graph_destroy(b, graph, exec);
}

/* -------------------------------------------------------- invalidation */

/* After a failed capture the stream must be as good as new: eager work runs
 * and a new capture records and replays. */
static void check_stream_works_normally(backend *b) {
  assert_false(backend_sim_capturing(b));
  int target = 0;
  add_args a = {&target, 1};
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(target, 1);
  assert_int_equal(cgt_sim_sync(b->stream), CGT_OK);
  void *graph = capture_graph(b, enqueue_add, &a);
  void *exec = NULL;
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(target, 2);
  b->ops->graph_destroy(b, graph, exec);
}

static void end_invalidated_capture(backend *b) {
  void *graph = (void *)&graph;
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_ERR_CAPTURE_FAILED);
  assert_null(graph);
  assert_true(strlen(b->error) > 0);
  assert_int_equal(counters(b).captures_invalidated, 1);
  assert_int_equal(counters(b).live_graphs, 0);
}

static void test_sync_during_capture_invalidates_the_capture(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 1};
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(cgt_sim_sync(b->stream), CGT_ERR_STATE);
  assert_true(backend_sim_capturing(b));
  end_invalidated_capture(b);
  assert_non_null(strstr(b->error, "synchronised"));
  assert_int_equal(target, 0);
  check_stream_works_normally(b);
}

static void test_backend_sync_during_capture_invalidates_the_capture(void **state) {
  backend *b = dev(state);
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(b->ops->sync(b), CGT_ERR_STATE);
  assert_true(strlen(b->error) > 0);
  end_invalidated_capture(b);
  check_stream_works_normally(b);
}

static void test_work_enqueued_into_an_invalidated_capture_fails_and_records_nothing(void **state) {
  backend *b = dev(state);
  int target = 0, src = 5, dst = 0;
  add_args a = {&target, 1};
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(cgt_sim_sync(b->stream), CGT_ERR_STATE);
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_ERR_STATE);
  assert_int_equal(cgt_sim_memcpy_async(b->stream, &dst, &src, sizeof src), CGT_ERR_STATE);
  assert_int_equal(b->ops->copy(b, &dst, &src, sizeof src), CGT_ERR_STATE);
  assert_int_equal(cgt_sim_sync(b->stream), CGT_ERR_STATE);
  assert_int_equal(b->ops->capture_begin(b), CGT_ERR_STATE);
  assert_int_equal(target, 0);
  assert_int_equal(dst, 0);
  assert_int_equal(counters(b).kernels_recorded, 0);
  assert_int_equal(counters(b).copies_recorded, 0);
  end_invalidated_capture(b);
  check_stream_works_normally(b);
}

static void test_malloc_during_capture_invalidates_the_capture(void **state) {
  backend *b = dev(state);
  void *p = (void *)&p;
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(cgt_sim_malloc(b->stream, 1024, &p), CGT_ERR_STATE);
  assert_ptr_equal(p, (void *)&p);
  assert_int_equal(backend_sim_outstanding_bytes(b), 0);
  end_invalidated_capture(b);
  assert_non_null(strstr(b->error, "cgt_sim_malloc"));
  check_stream_works_normally(b);
}

static void test_sim_free_during_capture_invalidates_the_capture_and_frees_nothing(void **state) {
  backend *b = dev(state);
  void *p = NULL;
  assert_int_equal(cgt_sim_malloc(b->stream, 1024, &p), CGT_OK);
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(cgt_sim_free(b->stream, p), CGT_ERR_STATE);
  assert_int_equal(backend_sim_outstanding_bytes(b), 1024);
  end_invalidated_capture(b);
  assert_int_equal(cgt_sim_free(b->stream, p), CGT_OK);
  check_stream_works_normally(b);
}

static void test_mem_alloc_works_during_capture_and_keeps_it_valid(void **state) {
  backend *b = dev(state);
  void *chunk = NULL;
  int target = 0;
  add_args a = {&target, 1};
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, &a, sizeof a), CGT_OK);
  assert_int_equal(b->ops->mem_alloc(b, 4096, &chunk), CGT_OK);
  assert_non_null(chunk);
  void *graph = NULL;
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_OK);
  assert_int_equal(counters(b).captures_invalidated, 0);
  b->ops->graph_destroy(b, graph, NULL);
  b->ops->mem_free(b, chunk);
}

/* -------------------------------------------------------------- copies */

static void test_eager_copies_happen_at_once(void **state) {
  backend *b = dev(state);
  char src[16] = "simulated", dst[16] = {0}, dst2[16] = {0};
  assert_int_equal(cgt_sim_memcpy_async(b->stream, dst, src, sizeof src), CGT_OK);
  assert_string_equal(dst, "simulated");
  assert_int_equal(b->ops->copy(b, dst2, src, sizeof src), CGT_OK);
  assert_string_equal(dst2, "simulated");
  assert_int_equal(counters(b).copies_eager, 2);
}

static void test_captured_copies_run_at_replay_and_read_the_source_of_replay_time(void **state) {
  backend *b = dev(state);
  int src = 1, mid = 0, dst = 0;
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(cgt_sim_memcpy_async(b->stream, &mid, &src, sizeof src), CGT_OK);
  assert_int_equal(b->ops->copy(b, &dst, &mid, sizeof mid), CGT_OK);
  void *graph = NULL, *exec = NULL;
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_OK);
  assert_int_equal(mid, 0);
  assert_int_equal(dst, 0);
  assert_int_equal(counters(b).copies_recorded, 2);
  assert_int_equal(b->ops->instantiate(b, graph, &exec), CGT_OK);
  src = 42;
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(mid, 42);
  assert_int_equal(dst, 42);
  src = 43;
  assert_int_equal(b->ops->launch(b, exec), CGT_OK);
  assert_int_equal(dst, 43);
  assert_int_equal(counters(b).copies_replayed, 4);
  b->ops->graph_destroy(b, graph, exec);
}

static void test_copies_with_null_addresses_are_rejected_and_empty_copies_do_nothing(void **state) {
  backend *b = dev(state);
  int x = 0;
  assert_int_equal(cgt_sim_memcpy_async(b->stream, NULL, &x, sizeof x), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(b->ops->copy(b, &x, NULL, sizeof x), CGT_ERR_INVALID_ARGUMENT);
  assert_true(strlen(b->error) > 0);
  assert_int_equal(cgt_sim_memcpy_async(b->stream, NULL, NULL, 0), CGT_OK);
  assert_int_equal(counters(b).copies_eager, 0);
}

/* ------------------------------------------------------ device memory */

static void test_device_memory_is_256_byte_aligned(void **state) {
  backend *b = dev(state);
  void *p[5] = {0};
  size_t sizes[5] = {1, 255, 256, 257, 3000};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(b->ops->mem_alloc(b, sizes[i], &p[i]), CGT_OK);
    assert_int_equal((uintptr_t)p[i] % 256, 0);
    memset(p[i], 0xab, sizes[i]);
  }
  /* Rounded up to 256 each: 256 + 256 + 256 + 512 + 3072. */
  assert_int_equal(backend_sim_outstanding_bytes(b), 4352);
  for (int i = 0; i < 5; i++) b->ops->mem_free(b, p[i]);
}

static void test_the_device_limit_refuses_allocations_and_recovers_after_a_free(void **state) {
  backend *b = dev(state);
  backend_sim_set_limit(b, 8192);
  void *a = NULL, *c = NULL, *d = (void *)&d;
  assert_int_equal(b->ops->mem_alloc(b, 4096, &a), CGT_OK);
  assert_int_equal(b->ops->mem_alloc(b, 4096, &c), CGT_OK);
  b->error[0] = '\0';
  assert_int_equal(b->ops->mem_alloc(b, 1, &d), CGT_ERR_OUT_OF_MEMORY);
  assert_ptr_equal(d, (void *)&d);
  assert_non_null(strstr(b->error, "out of device memory"));
  assert_int_equal(backend_sim_outstanding_bytes(b), 8192);
  b->ops->mem_free(b, a);
  assert_int_equal(b->ops->mem_alloc(b, 4096, &d), CGT_OK);
  b->ops->mem_free(b, c);
  b->ops->mem_free(b, d);
  backend_sim_set_limit(b, SIZE_MAX);
}

static void test_the_device_limit_counts_sim_malloc_and_pool_chunks_together(void **state) {
  backend *b = dev(state);
  backend_sim_set_limit(b, 8192);
  void *chunk = NULL, *user = NULL;
  assert_int_equal(b->ops->mem_alloc(b, 6144, &chunk), CGT_OK);
  assert_int_equal(cgt_sim_malloc(b->stream, 4096, &user), CGT_ERR_OUT_OF_MEMORY);
  assert_int_equal(cgt_sim_malloc(b->stream, 2048, &user), CGT_OK);
  assert_int_equal(counters(b).user_bytes, 2048);
  assert_int_equal(counters(b).device_bytes, 8192);
  assert_int_equal(b->ops->mem_alloc(b, 256, &chunk), CGT_ERR_OUT_OF_MEMORY);
  assert_int_equal(cgt_sim_free(b->stream, user), CGT_OK);
  assert_int_equal(counters(b).user_bytes, 0);
  b->ops->mem_free(b, chunk);
}

static void test_a_limit_below_what_is_in_use_refuses_until_enough_is_freed(void **state) {
  backend *b = dev(state);
  void *a = NULL, *c = NULL;
  assert_int_equal(b->ops->mem_alloc(b, 8192, &a), CGT_OK);
  backend_sim_set_limit(b, 4096);
  assert_int_equal(b->ops->mem_alloc(b, 256, &c), CGT_ERR_OUT_OF_MEMORY);
  b->ops->mem_free(b, a);
  assert_int_equal(b->ops->mem_alloc(b, 4096, &c), CGT_OK);
  b->ops->mem_free(b, c);
}

static void test_huge_and_empty_allocations_are_refused(void **state) {
  backend *b = dev(state);
  void *p = NULL;
  assert_int_equal(b->ops->mem_alloc(b, SIZE_MAX, &p), CGT_ERR_OUT_OF_MEMORY);
  assert_int_equal(b->ops->mem_alloc(b, SIZE_MAX - 100, &p), CGT_ERR_OUT_OF_MEMORY);
  assert_int_equal(b->ops->mem_alloc(b, 0, &p), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_malloc(b->stream, 0, &p), CGT_ERR_INVALID_ARGUMENT);
  assert_null(p);
  assert_int_equal(backend_sim_outstanding_bytes(b), 0);
}

static void test_outstanding_bytes_return_to_zero_after_everything_is_freed(void **state) {
  backend *b = dev(state);
  void *p[10] = {0};
  for (int i = 0; i < 10; i++) {
    if (i % 2)
      assert_int_equal(b->ops->mem_alloc(b, 256 * (size_t)(i + 1), &p[i]), CGT_OK);
    else
      assert_int_equal(cgt_sim_malloc(b->stream, 256 * (size_t)(i + 1), &p[i]), CGT_OK);
  }
  assert_int_equal(backend_sim_outstanding_bytes(b), 256 * 55);
  assert_int_equal(counters(b).live_allocations, 10);
  /* Freed in an order unlike the allocation order, to move table slots. */
  for (int i = 0; i < 10; i += 3) b->ops->mem_free(b, p[i]);
  for (int i = 1; i < 10; i += 3) b->ops->mem_free(b, p[i]);
  for (int i = 2; i < 10; i += 3) b->ops->mem_free(b, p[i]);
  assert_int_equal(backend_sim_outstanding_bytes(b), 0);
  assert_int_equal(counters(b).device_peak_bytes, 256 * 55);
  assert_int_equal(counters(b).device_allocs, 10);
  assert_int_equal(counters(b).device_frees, 10);
}

static void test_sim_free_rejects_pointers_sim_malloc_did_not_return(void **state) {
  backend *b = dev(state);
  int local = 0;
  void *chunk = NULL;
  assert_int_equal(b->ops->mem_alloc(b, 256, &chunk), CGT_OK);
  assert_int_equal(cgt_sim_free(b->stream, &local), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_free(b->stream, chunk), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_free(b->stream, NULL), CGT_OK);
  assert_int_equal(backend_sim_outstanding_bytes(b), 256);
  b->ops->mem_free(b, chunk);
}

/* Runs on its own devices: the fixture's teardown insists on no bad frees. */
static void test_mem_free_of_a_foreign_pointer_is_counted_and_ignored(void **state) {
  (void)state;
  backend b = {0}, other = {0};
  b.ops = other.ops = &backend_sim_ops;
  assert_int_equal(b.ops->open(&b, 0, NULL), CGT_OK);
  assert_int_equal(other.ops->open(&other, 0, NULL), CGT_OK);
  int local = 0;
  b.ops->mem_free(&b, &local);
  b.ops->mem_free(&b, NULL);
  assert_int_equal(counters(&b).bad_frees, 1);
  assert_true(strlen(b.error) > 0);
  void *p = NULL;
  assert_int_equal(other.ops->mem_alloc(&other, 256, &p), CGT_OK);
  b.ops->mem_free(&b, p); /* freed through the wrong device */
  assert_int_equal(counters(&b).bad_frees, 2);
  assert_int_equal(backend_sim_outstanding_bytes(&other), 256);
  other.ops->mem_free(&other, p);
  assert_int_equal(backend_sim_outstanding_bytes(&other), 0);
  b.ops->graph_destroy(&b, &local, &local);
  assert_int_equal(counters(&b).bad_frees, 4);
  other.ops->close(&other);
  assert_string_equal(other.error, "");
  b.ops->close(&b);
  assert_string_equal(b.error, "");
}

/* --------------------------------------------------------- bad inputs */

static void test_pointers_that_are_not_simulator_streams_are_rejected(void **state) {
  (void)state;
  int target = 0;
  add_args a = {&target, 1};
  uint32_t not_a_stream[16] = {0};
  void *p = NULL;
  void *streams[2] = {NULL, not_a_stream};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(cgt_sim_launch(streams[i], add_kernel, &a, sizeof a), CGT_ERR_INVALID_ARGUMENT);
    assert_int_equal(cgt_sim_sync(streams[i]), CGT_ERR_INVALID_ARGUMENT);
    assert_int_equal(cgt_sim_memcpy_async(streams[i], &target, &target, sizeof target), CGT_ERR_INVALID_ARGUMENT);
    assert_int_equal(cgt_sim_malloc(streams[i], 256, &p), CGT_ERR_INVALID_ARGUMENT);
    assert_int_equal(cgt_sim_free(streams[i], &target), CGT_ERR_INVALID_ARGUMENT);
  }
  assert_int_equal(target, 0);
  assert_null(p);
}

static void test_null_kernels_and_null_arguments_are_rejected(void **state) {
  backend *b = dev(state);
  int target = 0;
  add_args a = {&target, 1};
  assert_int_equal(cgt_sim_launch(b->stream, NULL, &a, sizeof a), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_launch(b->stream, add_kernel, NULL, sizeof a), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(cgt_sim_malloc(b->stream, 256, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(b->ops->mem_alloc(b, 256, NULL), CGT_ERR_INVALID_ARGUMENT);
  /* Rejected during capture too, without recording or invalidating. */
  assert_int_equal(b->ops->capture_begin(b), CGT_OK);
  assert_int_equal(cgt_sim_launch(b->stream, NULL, &a, sizeof a), CGT_ERR_INVALID_ARGUMENT);
  void *graph = NULL;
  assert_int_equal(b->ops->capture_end(b, &graph), CGT_OK);
  assert_int_equal(counters(b).kernels_recorded, 0);
  b->ops->graph_destroy(b, graph, NULL);
  assert_int_equal(target, 0);
}

static void test_open_rejects_a_caller_stream_and_a_negative_device(void **state) {
  (void)state;
  backend b = {0};
  b.ops = &backend_sim_ops;
  int not_a_stream = 0;
  assert_int_equal(b.ops->open(&b, 0, &not_a_stream), CGT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(b.error, "stream"));
  assert_null(b.impl);
  assert_null(b.stream);
  assert_int_equal(b.ops->open(&b, -1, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_null(b.impl);
  b.ops->close(&b); /* closing a device that never opened does nothing */
}

static void test_graphs_and_executables_of_another_device_are_rejected(void **state) {
  backend *b = dev(state);
  backend other = {0};
  other.ops = &backend_sim_ops;
  assert_int_equal(other.ops->open(&other, 0, NULL), CGT_OK);
  int target = 0;
  add_args a = {&target, 1};
  void *graph = capture_graph(&other, enqueue_add, &a);
  void *exec = NULL, *mine = NULL;
  assert_int_equal(other.ops->instantiate(&other, graph, &exec), CGT_OK);
  assert_int_equal(b->ops->instantiate(b, graph, &mine), CGT_ERR_INVALID_ARGUMENT);
  assert_null(mine);
  assert_int_equal(b->ops->launch(b, exec), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(b->ops->launch(b, graph), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(b->ops->launch(b, NULL), CGT_ERR_INVALID_ARGUMENT);
  assert_int_equal(target, 0);
  assert_int_equal(other.ops->launch(&other, exec), CGT_OK);
  assert_int_equal(target, 1);
  other.ops->graph_destroy(&other, graph, exec);
  other.ops->close(&other);
  assert_string_equal(other.error, "");
}

/* ------------------------------------------------------ dot and close */

static void enqueue_kernel_and_copy(void *stream, void *ctx) {
  add_args *a = ctx;
  assert_int_equal(cgt_sim_launch(stream, add_kernel, a, sizeof *a), CGT_OK);
  assert_int_equal(cgt_sim_memcpy_async(stream, a->target, a->target, 64), CGT_OK);
}

static void test_graph_dot_writes_one_box_per_node(void **state) {
  backend *b = dev(state);
  int target[16] = {0};
  add_args a = {target, 1};
  void *graph = capture_graph(b, enqueue_kernel_and_copy, &a);
  char path[] = "/tmp/test_sim_dot_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(b->ops->graph_dot(b, graph, path), CGT_OK);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char text[1024] = {0};
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  unlink(path);
  assert_true(n > 0);
  assert_non_null(strstr(text, "digraph"));
  assert_non_null(strstr(text, "kernel #0, 16 arg bytes"));
  assert_non_null(strstr(text, "memcpy 64 bytes"));
  assert_non_null(strstr(text, "n0 -> n1"));
  assert_int_equal(b->ops->graph_dot(b, graph, "/nonexistent-dir/x.dot"), CGT_ERR_BACKEND);
  assert_int_equal(b->ops->graph_dot(b, NULL, path), CGT_ERR_INVALID_ARGUMENT);
  b->ops->graph_destroy(b, graph, NULL);
}

static void test_ranges_are_counted_in_pairs(void **state) {
  backend *b = dev(state);
  b->ops->range_push(b, "record");
  b->ops->range_push(b, "replay");
  b->ops->range_pop(b);
  b->ops->range_pop(b);
  assert_int_equal(counters(b).ranges_pushed, 2);
  assert_int_equal(counters(b).ranges_popped, 2);
}

static void test_close_frees_and_names_what_the_caller_left_behind(void **state) {
  (void)state;
  backend b = {0};
  b.ops = &backend_sim_ops;
  assert_int_equal(b.ops->open(&b, 0, NULL), CGT_OK);
  int target = 0;
  add_args a = {&target, 1};
  void *chunk = NULL, *user = NULL, *exec = NULL;
  assert_int_equal(b.ops->mem_alloc(&b, 1024, &chunk), CGT_OK);
  assert_int_equal(cgt_sim_malloc(b.stream, 512, &user), CGT_OK);
  void *graph = capture_graph(&b, enqueue_add, &a);
  assert_int_equal(b.ops->instantiate(&b, graph, &exec), CGT_OK);
  assert_int_equal(b.ops->capture_begin(&b), CGT_OK);
  assert_int_equal(cgt_sim_launch(b.stream, add_kernel, &a, sizeof a), CGT_OK);
  b.ops->close(&b);
  assert_non_null(strstr(b.error, "2 allocations (1536 bytes), 1 graphs, 1 execs"));
  assert_non_null(strstr(b.error, "never ended"));
  assert_null(b.impl);
  assert_null(b.stream);
  assert_int_equal(backend_sim_outstanding_bytes(&b), 0);
}

static void test_counters_of_something_not_a_simulator_read_as_zero(void **state) {
  (void)state;
  backend b = {0};
  backend_sim_counters c;
  memset(&c, 0xff, sizeof c);
  backend_sim_read_counters(&b, &c);
  assert_int_equal(c.kernels_eager, 0);
  assert_int_equal(c.device_bytes, 0);
  assert_int_equal(backend_sim_outstanding_bytes(NULL), 0);
  assert_false(backend_sim_capturing(&b));
  backend_sim_set_limit(&b, 0); /* does nothing, and does not crash */
}

#define T(name) cmocka_unit_test_setup_teardown(name, open_device, close_device_and_check_nothing_leaked)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_eager_launch_runs_the_kernel_at_once),
      T(test_eager_launch_hands_the_kernel_a_copy_of_its_arguments),
      T(test_eager_launch_with_wide_arguments_runs_at_once),
      T(test_launch_with_zero_arg_bytes_passes_null_args),
      T(test_sync_outside_capture_succeeds),
      T(test_capture_records_kernels_without_running_them),
      T(test_replay_uses_the_argument_bytes_of_capture_time),
      T(test_replaying_twice_runs_the_kernels_twice),
      T(test_replay_runs_the_nodes_in_recording_order),
      T(test_a_kernel_that_writes_its_arguments_does_not_change_the_recording),
      T(test_replay_of_wide_arguments_uses_the_recorded_bytes),
      T(test_an_empty_capture_gives_a_graph_that_launches_and_does_nothing),
      T(test_the_executable_survives_destroying_its_graph),
      T(test_one_graph_instantiates_into_independent_executables),
      T(test_an_executable_launched_from_inside_its_own_replay_is_rejected),
      T(test_capture_begin_while_capturing_is_a_state_error),
      T(test_capture_end_without_a_capture_is_a_state_error),
      T(test_a_graph_launch_during_capture_is_rejected_and_leaves_the_capture_intact),
      T(test_sync_during_capture_invalidates_the_capture),
      T(test_backend_sync_during_capture_invalidates_the_capture),
      T(test_work_enqueued_into_an_invalidated_capture_fails_and_records_nothing),
      T(test_malloc_during_capture_invalidates_the_capture),
      T(test_sim_free_during_capture_invalidates_the_capture_and_frees_nothing),
      T(test_mem_alloc_works_during_capture_and_keeps_it_valid),
      T(test_eager_copies_happen_at_once),
      T(test_captured_copies_run_at_replay_and_read_the_source_of_replay_time),
      T(test_copies_with_null_addresses_are_rejected_and_empty_copies_do_nothing),
      T(test_device_memory_is_256_byte_aligned),
      T(test_the_device_limit_refuses_allocations_and_recovers_after_a_free),
      T(test_the_device_limit_counts_sim_malloc_and_pool_chunks_together),
      T(test_a_limit_below_what_is_in_use_refuses_until_enough_is_freed),
      T(test_huge_and_empty_allocations_are_refused),
      T(test_outstanding_bytes_return_to_zero_after_everything_is_freed),
      T(test_sim_free_rejects_pointers_sim_malloc_did_not_return),
      T(test_pointers_that_are_not_simulator_streams_are_rejected),
      T(test_null_kernels_and_null_arguments_are_rejected),
      T(test_graphs_and_executables_of_another_device_are_rejected),
      T(test_graph_dot_writes_one_box_per_node),
      T(test_ranges_are_counted_in_pairs),
      cmocka_unit_test(test_open_rejects_a_caller_stream_and_a_negative_device),
      cmocka_unit_test(test_mem_free_of_a_foreign_pointer_is_counted_and_ignored),
      cmocka_unit_test(test_close_frees_and_names_what_the_caller_left_behind),
      cmocka_unit_test(test_counters_of_something_not_a_simulator_read_as_zero),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
