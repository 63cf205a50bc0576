/* fuzz.c — differential fuzzing: random programs give bit-identical outputs
 * in TREE, SEPARATE and EAGER modes, and in TREE mode with deferred launch.
 * The programs, the trees they run in and the comparison are
 * fuzz_engine.c's (its essay says how); this file picks the options.
 *
 * Options vary by test and seed: warmup_runs 0 to 2, rerecord limits of 1
 * to 3, 4 KiB pool chunks with values up to 10 KiB (chunks grow during
 * warmup and recording; oversize requests get chunks of their own), default
 * options, long programs whose steps make over 64 values, injected faults,
 * and recording budgets of one to four graphs with STATIC buffers that move
 * (evictions and updates in place all the time), and moving STATIC buffers
 * without a budget (updates in place of whole subtrees). test/fuzz_options.c
 * covers the option combinations left out here.
 *
 * The steps (50,000 on the simulator, 2,000 on CUDA; CGT_FUZZ_STEPS
 * overrides the total) are spread over the tests by a fixed share.
 * CGT_FUZZ_BUDGET, CGT_FUZZ_SEED and CGT_FUZZ_VERBOSE are fuzz_engine.c's.
 */
#include <stdio.h>

#include "fuzz_engine.h"
#include "test_lists.h"
#include "test_util.h"

/* Options mixed by seed: every warmup count, default limits, 64 KiB chunks. */
static void test_random_programs_give_identical_outputs_in_tree_separate_and_eager_modes(void **state) {
  (void)state;
  for (uint32_t warmup = 0; warmup < 3; warmup++) {
    fz_config cfg = {.test = "mixed", .warmup_runs = warmup, .rerecord_limit = 32, .pool_chunk_bytes = 64 << 10};
    char name[32];
    snprintf(name, sizeof name, "mixed/warmup%u", warmup);
    cfg.test = name;
    fz_run_test(&cfg, 1000 + 100 * warmup, 8, fz_share_of_steps(12));
  }
}

/* 4 KiB chunks and values of up to 10 KiB: chunks grow during warmup and
 * recording, and oversize requests get chunks of their own. */
static void test_random_programs_with_tiny_pool_chunks_give_identical_outputs(void **state) {
  (void)state;
  fz_config cfg = {
      .test = "tiny-chunks", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 4 << 10, .big_values = 1};
  fz_run_test(&cfg, 2000, 10, fz_share_of_steps(21));
}

/* Rerecord limits of 1 to 3: siblings past the limit run eagerly on the side
 * pool, and their outputs feed recorded children as DYNAMIC inputs. */
static void test_random_programs_at_low_rerecord_limits_give_identical_outputs(void **state) {
  (void)state;
  for (uint32_t limit = 1; limit <= 3; limit++) {
    char name[32];
    snprintf(name, sizeof name, "rerecord-limit%u", limit);
    fz_config cfg = {.test = name,
                     .warmup_runs = limit == 2 ? 0 : 1,
                     .rerecord_limit = limit,
                     .pool_chunk_bytes = limit == 3 ? 4 << 10 : 16 << 10,
                     .big_values = limit == 3};
    fz_run_test(&cfg, 3000 + 100 * limit, 4, fz_share_of_steps(6));
  }
}

/* The default options of cgt_options_init (2 MiB chunks, warmup 1). */
static void test_random_programs_with_default_options_give_identical_outputs(void **state) {
  (void)state;
  fz_config cfg = {.test = "defaults", .warmup_runs = 1, .rerecord_limit = 32};
  fz_run_test(&cfg, 4000, 4, fz_share_of_steps(5));
}

/* Programs of 30 to 60 top-level operations: steps make well over 64
 * values, so liveness masks span several words; a reserved first chunk. */
static void test_long_random_programs_give_identical_outputs(void **state) {
  (void)state;
  fz_config cfg = {.test = "long-programs",
                   .warmup_runs = 1,
                   .rerecord_limit = 32,
                   .pool_chunk_bytes = 16 << 10,
                   .min_ops = 30,
                   .max_ops = 60,
                   .pool_reserve_bytes = 256 << 10,
                   .check_every = 8};
  fz_run_test(&cfg, 5000, 4, fz_share_of_steps(5));
}

/* Programs of 300 to 420 top-level operations: 500 and more runs a step,
 * so liveness lists, block counts and lookups work on long paths. The tree
 * is checked every 64 runs and at every step's end. */
static void test_very_long_random_programs_give_identical_outputs(void **state) {
  (void)state;
  fz_config cfg = {.test = "very-long-programs",
                   .warmup_runs = 1,
                   .rerecord_limit = 32,
                   .pool_chunk_bytes = 64 << 10,
                   .min_ops = 300,
                   .max_ops = 420,
                   .check_every = 64};
  fz_run_test(&cfg, 6000, 4, fz_share_of_steps(1));
}

/* Injected failures in 5% of the runs: launch functions that fail after
 * allocating, a device without memory, a host whose next allocations fail.
 * Every failed run must change nothing: run again, it must give the same
 * bytes as the trees it is compared with. Some seeds use small chunks so
 * that runs need new ones. */
static void test_random_programs_with_injected_failures_give_identical_outputs(void **state) {
  (void)state;
  for (uint32_t variant = 0; variant < 2; variant++) {
    char name[32];
    snprintf(name, sizeof name, "faults%u", variant);
    fz_config cfg = {.test = name,
                     .warmup_runs = variant,
                     .rerecord_limit = variant ? 2 : 32,
                     .pool_chunk_bytes = variant ? 4 << 10 : 64 << 10,
                     .big_values = (int)variant,
                     .fault_percent = 5};
    fz_run_test(&cfg, 7000 + 100 * variant, 5, fz_share_of_steps(4));
  }
}

/* The newer options: all-zero options (zero means default), segments
 * declared uncapturable, a pool limit no program reaches, and WARMUP nodes
 * pruned after 4 steps, so pruned nodes are made again. */
static void test_random_programs_with_newer_options_give_identical_outputs(void **state) {
  (void)state;
  fz_config zero = {.test = "zero-options", .zero_options = 1};
  fz_run_test(&zero, 8000, 4, fz_share_of_steps(2));
  fz_config flags = {.test = "no-capture+limit",
                     .warmup_runs = 1,
                     .rerecord_limit = 3,
                     .pool_chunk_bytes = 16 << 10,
                     .no_capture_percent = 25,
                     .pool_limit_bytes = (size_t)256 << 20};
  fz_run_test(&flags, 8100, 4, fz_share_of_steps(2));
  fz_config prune = {.test = "prune4",
                     .warmup_runs = 2,
                     .rerecord_limit = 32,
                     .pool_chunk_bytes = 16 << 10,
                     .prune_after_steps = 4,
                     .fault_percent = 2};
  fz_run_test(&prune, 8200, 4, fz_share_of_steps(2));
}

/* Recording budgets small enough to evict constantly (1, 2 and 4 graphs,
 * and the least byte budget), with the fixed STATIC buffer moving every 7
 * or 11 steps in some (update in place): TREE and TREE+defer evict and
 * re-record, SEPARATE gives its private pools back, and every byte must
 * still be EAGER's. Last, the buffer moving every 9 steps in an unbounded
 * tree, where updates in place carry whole subtrees. */
static void test_random_programs_under_tiny_recording_budgets_give_identical_outputs(void **state) {
  (void)state;
  static const fz_config cfgs[] = {
      {.test = "budget1", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 16 << 10, .max_graphs = 1},
      {.test = "budget2+moves", .warmup_runs = 0, .rerecord_limit = 3, .pool_chunk_bytes = 16 << 10, .max_graphs = 2,
       .static_move_every = 7},
      {.test = "budget4+faults", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 64 << 10, .max_graphs = 4,
       .fault_percent = 2, .static_move_every = 11},
      {.test = "budget-bytes", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 16 << 10,
       .max_graph_bytes = CGT_MIN_GRAPH_BYTES},
      {.test = "moves-unbounded", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 16 << 10,
       .static_move_every = 9, .check_every = 16}, /* updates in place of whole subtrees */
  };
  /* The unbounded one grows (SEPARATE records anew at every move, as do
   * children of nodes whose capture fails): a third of the steps. */
  for (uint32_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
    fz_run_test(&cfgs[i], 9000 + 100 * i, 3, fz_share_of_steps(cfgs[i].static_move_every == 9 ? 1 : 3));
}

#define FZ_TEST(f) cmocka_unit_test(f)
const struct CMUnitTest fuzz_tests[] = {
    FZ_TEST(test_random_programs_give_identical_outputs_in_tree_separate_and_eager_modes),
    FZ_TEST(test_random_programs_with_tiny_pool_chunks_give_identical_outputs),
    FZ_TEST(test_random_programs_at_low_rerecord_limits_give_identical_outputs),
    FZ_TEST(test_random_programs_with_default_options_give_identical_outputs),
    FZ_TEST(test_long_random_programs_give_identical_outputs),
    FZ_TEST(test_very_long_random_programs_give_identical_outputs),
    FZ_TEST(test_random_programs_with_injected_failures_give_identical_outputs),
    FZ_TEST(test_random_programs_with_newer_options_give_identical_outputs),
    FZ_TEST(test_random_programs_under_tiny_recording_budgets_give_identical_outputs),
};
const size_t fuzz_test_count = sizeof fuzz_tests / sizeof fuzz_tests[0];
