/* fuzz_options.c — the differential fuzz (fuzz_engine.c) over the option
 * combinations fuzz.c leaves out, where a tree's bookkeeping has the most
 * ways to go wrong at once:
 *
 * - prelaunch functions (of segments reading a random state they write) set
 *   and cleared mid-run, under defer_launch;
 * - SEPARATE mode with defer_launch, as a fifth tree;
 * - STATIC buffers that move every step, alternate between two addresses or
 *   cycle through three, or are reloaded, under max_graphs and
 *   max_graph_bytes budgets and small rerecord limits;
 * - small prune_after_steps together with evictions;
 * - values of earlier steps and released values used again: every use must
 *   be CGT_ERR_STALE_VALUE, counted once, and change nothing else;
 * - cgt_flush, cgt_sync and unsynchronised copy-outs among held-back work;
 * - segments whose capture fails at some steps only;
 * - in one world of each test, fuzz.c's injected failures, which must
 *   change nothing.
 *
 * Every tree is checked after every operation, with cgt_tree_check and the
 * promises api.md makes about the stats: counters and peaks never fall,
 * stats.nodes is the node list's length, node ids are in order and never
 * reused (a run that failed for want of host memory once used one up),
 * fused_runs >= 2 * fused_launches. Runs on the simulator only (test_tree):
 * the random segments tell a capture from an eager run with a simulator
 * kernel.
 *
 * This file runs half as many steps as fuzz.c: 25,000 by default, half of
 * CGT_FUZZ_STEPS where that is set, each test a fixed share; fuzz.c's other
 * knobs (fuzz_engine.c) work here too.
 */
#include <string.h>

#include "fuzz_engine.h"
#include "fuzz_world.h"
#include "test_lists.h"
#include "test_util.h"
#include "tree_hooks.h"

/* share/100 of half the fuzz's steps: every operation here also walks every
 * tree's node list, so a step costs several of fuzz.c's. */
static uint64_t options_steps(uint32_t share) { return fz_share_of_steps(share) / 2; }

/* Runs cfg with everything this file adds checked: the fifth tree and the
 * stats promises after every operation. */
static void run_with_every_check(const fz_config *cfg, uint64_t first_seed, uint32_t n_seeds, uint32_t share) {
  fz_config all = *cfg;
  all.separate_defer = 1;
  all.stats_invariants = 1;
  fz_run_test(&all, first_seed, n_seeds, options_steps(share));
}

/* Runs each of n configs on n_seeds seeds, the i-th from first_seed + 100 i. */
static void run_each(const fz_config *cfgs, size_t n, uint64_t first_seed, uint32_t n_seeds, uint32_t share) {
  for (size_t i = 0; i < n; i++)
    run_with_every_check(&cfgs[i], first_seed + 100 * i, n_seeds, share);
}

/* Random segments whose prelaunch functions are set and cleared mid-run,
 * with deferred launch in TREE and SEPARATE mode, flushes, syncs and
 * unsynchronised copy-outs among held-back replays. */
static void test_random_programs_with_prelaunch_toggled_under_defer_launch_give_identical_outputs(void **state) {
  (void)state;
  static const fz_config cfgs[] = {
      {.test = "prelaunch+defer", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 64 << 10,
       .random_segments = 1, .toggle_percent = 3, .flush_percent = 10, .stale_percent = 5},
      {.test = "prelaunch+defer+w0", .warmup_runs = 0, .rerecord_limit = 2, .pool_chunk_bytes = 16 << 10,
       .random_segments = 1, .toggle_percent = 8, .flush_percent = 20, .stale_percent = 5, .flaky_percent = 20,
       .fault_percent = 2},
      {.test = "prelaunch+budget", .warmup_runs = 1, .rerecord_limit = 3, .pool_chunk_bytes = 16 << 10,
       .random_segments = 1, .toggle_percent = 5, .flush_percent = 10, .max_graphs = 3, .static_move_every = 5},
  };
  run_each(cfgs, sizeof cfgs / sizeof cfgs[0], 20000, 3, 1);
}

/* STATIC buffers that move every step, alternate between two buffers or
 * cycle through three, under recording budgets and small rerecord limits. */
static void test_random_programs_with_moving_static_buffers_under_budgets_give_identical_outputs(void **state) {
  (void)state;
  static const fz_config cfgs[] = {
      {.test = "every-step+limit1", .warmup_runs = 1, .rerecord_limit = 1, .pool_chunk_bytes = 16 << 10,
       .move_kind = FZ_MOVE_EVERY_STEP, .max_graphs = 2, .stale_percent = 3, .fault_percent = 2},
      {.test = "double+limit2", .warmup_runs = 1, .rerecord_limit = 2, .pool_chunk_bytes = 16 << 10,
       .move_kind = FZ_MOVE_DOUBLE, .max_graphs = 128, .flush_percent = 10},
      {.test = "ring3+limit3", .warmup_runs = 0, .rerecord_limit = 3, .pool_chunk_bytes = 16 << 10,
       .move_kind = FZ_MOVE_RING3, .max_graph_bytes = 64 * CGT_MIN_GRAPH_BYTES, .flush_percent = 10},
      {.test = "every-step+bytes", .warmup_runs = 1, .rerecord_limit = 2, .pool_chunk_bytes = 16 << 10,
       .move_kind = FZ_MOVE_EVERY_STEP, .max_graph_bytes = CGT_MIN_GRAPH_BYTES, .random_segments = 1,
       .toggle_percent = 2},
      {.test = "reload+limit1+noupdate", .warmup_runs = 1, .rerecord_limit = 1, .pool_chunk_bytes = 16 << 10,
       .static_move_every = 3, .max_graphs = 2, .no_update_in_place = 1},
  };
  run_each(cfgs, sizeof cfgs / sizeof cfgs[0], 21000, 3, 3);
  /* Unbounded, the trees grow at every new address (SEPARATE records anew):
   * fewer steps. */
  static const fz_config ring = {.test = "ring3+unbounded", .warmup_runs = 1, .rerecord_limit = 32,
                                 .pool_chunk_bytes = 16 << 10, .move_kind = FZ_MOVE_RING3, .flush_percent = 5};
  run_with_every_check(&ring, 21900, 3, 1);
}

/* WARMUP nodes pruned after 1 to 3 steps while a budget evicts, with
 * captures failing at some steps. */
static void test_random_programs_pruned_every_few_steps_under_eviction_give_identical_outputs(void **state) {
  (void)state;
  static const fz_config cfgs[] = {
      {.test = "prune1+budget1", .warmup_runs = 2, .rerecord_limit = 2, .pool_chunk_bytes = 16 << 10,
       .prune_after_steps = 1, .max_graphs = 1, .flaky_percent = 20, .stale_percent = 5, .fault_percent = 2},
      {.test = "prune2+budget2+moves", .warmup_runs = 1, .rerecord_limit = 3, .pool_chunk_bytes = 16 << 10,
       .prune_after_steps = 2, .max_graphs = 2, .static_move_every = 4, .flush_percent = 10},
      {.test = "prune3+bytes+random", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 16 << 10,
       .prune_after_steps = 3, .max_graph_bytes = 2 * CGT_MIN_GRAPH_BYTES, .random_segments = 1,
       .toggle_percent = 4, .flaky_percent = 15, .flush_percent = 10},
  };
  run_each(cfgs, sizeof cfgs / sizeof cfgs[0], 22000, 3, 3);
  static const fz_config ring = {.test = "prune2+ring", .warmup_runs = 2, .rerecord_limit = 2,
                                 .pool_chunk_bytes = 16 << 10, .prune_after_steps = 2, .move_kind = FZ_MOVE_RING3,
                                 .stale_percent = 5};
  run_with_every_check(&ring, 22300, 3, 2);
}

/* Values of earlier steps and released values used in every call that takes
 * a value, among held-back replays, captures that fail at some steps and
 * injected failures. */
static void test_random_programs_using_stale_values_are_refused_and_counted_give_identical_outputs(void **state) {
  (void)state;
  static const fz_config cfgs[] = {
      {.test = "stale", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 64 << 10, .stale_percent = 25,
       .flush_percent = 15, .flaky_percent = 20},
      {.test = "stale+faults", .warmup_runs = 1, .rerecord_limit = 2, .pool_chunk_bytes = 4 << 10, .big_values = 1,
       .stale_percent = 20, .fault_percent = 3, .max_graphs = 3},
  };
  run_each(cfgs, sizeof cfgs / sizeof cfgs[0], 23000, 3, 3);
}


/* The fuzz's own model of a random segment (fuzz_world.c's SK_RANDOM) under
 * an injected host-memory failure, as fz_run (fuzz_engine.c) injects one: a
 * run that fails is run again, and the engine expects every tree's
 * generator to have advanced once, like EAGER mode's, which got no fault
 * (seed 20101 of prelaunch+defer+w0 at CGT_FUZZ_STEPS=1000000 hit this at
 * step 662 in SEPARATE mode). A run the launch function took part in cannot
 * take back what it did (api.md, Conventions), so the launch function must
 * make its allocation, which may fail, before it advances the generator.
 * Here every host allocation of the first run is failed in turn, in each
 * mode: after the failure (if any) and the run again, the generator has
 * advanced once and the output is x + the first draw. */
static void test_fuzz_random_segment_failed_for_host_memory_and_run_again_draws_once(void **state) {
  (void)state;
  if (test_backend != CGT_BACKEND_SIM)
    skip();
  static const cgt_mode modes[] = {CGT_MODE_EAGER, CGT_MODE_TREE, CGT_MODE_SEPARATE};
  fz_seg seg = {.kind = SK_RANDOM, .n_in = 1, .n_out = 1, .name = "random"};
  static float zeros[FZ_RANDOM_FLOATS];
  const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t step = 1; /* not flaky anyway */
  int fail_next_launch = 0;
  for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
    long long fired = 1;
    for (long long k = 0; fired; k++) {
      fz_random_state r;
      memset(&r, 0, sizeof r);
      r.state = test_dev_floats(zeros, FZ_RANDOM_FLOATS);
      r.active[0] = 1;
      fz_seg_user u = {&seg, &fail_next_launch, &r, 0, &step};
      cgt_options o;
      cgt_options_init(&o);
      o.warmup_runs = 0;
      cgt_tree *t = test_tree_new(modes[mi], &o);
      cgt_segment_desc d = {seg.name, fz_launch, &u, 1, 1, 0};
      cgt_segment id = 0;
      CHECK_OK(t, cgt_segment_register(t, &d, &id));
      CHECK_OK(t, cgt_segment_set_prelaunch(t, id, fz_prelaunch, &u));
      float *dx = test_dev_floats(x, 8);
      cgt_arg a = cgt_arg_static(dx, sizeof x);
      cgt_value v = {0};
      cgt__fail_host_alloc_after(t, k, 1);
      cgt_status st = cgt_run(t, id, 0, &a, 1, &v, 1);
      fired = cgt__host_alloc_failures(t);
      cgt__fail_host_alloc_after(t, -1, 0);
      if (st != CGT_OK) {
        CHECK_STATUS(t, CGT_ERR_OUT_OF_MEMORY, st);
        CHECK_OK(t, cgt_run(t, id, 0, &a, 1, &v, 1));
      }
      float got = test_read_first(t, v);
      if (r.ctr != 1 || got != x[0] - 8.0f)
        fail_msg("%s mode, host allocation %lld failed (run %s): the generator advanced %llu times, output %g, "
                 "not once and %g",
                 mi == 0 ? "EAGER" : mi == 1 ? "TREE" : "SEPARATE", k, cgt_status_name(st),
                 (unsigned long long)r.ctr, (double)got, (double)(x[0] - 8.0f));
      test_tree_free(t);
      test_dev_free(dx);
      test_dev_free(r.state);
    }
  }
}

const struct CMUnitTest fuzz_options_tests[] = {
    cmocka_unit_test(test_fuzz_random_segment_failed_for_host_memory_and_run_again_draws_once),
    cmocka_unit_test(test_random_programs_with_prelaunch_toggled_under_defer_launch_give_identical_outputs),
    cmocka_unit_test(test_random_programs_with_moving_static_buffers_under_budgets_give_identical_outputs),
    cmocka_unit_test(test_random_programs_pruned_every_few_steps_under_eviction_give_identical_outputs),
    cmocka_unit_test(test_random_programs_using_stale_values_are_refused_and_counted_give_identical_outputs),
};
const size_t fuzz_options_test_count = sizeof fuzz_options_tests / sizeof fuzz_options_tests[0];
