/* fuzz_engine.h — the differential fuzz's engine (fuzz_engine.c), shared by
 * fuzz.c and fuzz_options.c: a test describes the worlds it wants in an
 * fz_config and runs seeds of them with fz_run_test. Every field left 0 is
 * off (or the option's default). */
#ifndef CGT_FUZZ_ENGINE_H
#define CGT_FUZZ_ENGINE_H

#include <stddef.h>
#include <stdint.h>

/* How the fixed STATIC buffer moves, besides static_move_every's reloads. */
enum { FZ_MOVE_NONE, FZ_MOVE_EVERY_STEP, FZ_MOVE_DOUBLE, FZ_MOVE_RING3 };

typedef struct fz_config {
  const char *test; /* named in messages */
  uint32_t warmup_runs;
  uint32_t rerecord_limit;
  size_t pool_chunk_bytes;   /* 0: the default */
  int big_values;            /* values larger than a small chunk */
  uint32_t min_ops, max_ops; /* top-level operations of a program; 0: 6..20 */
  size_t pool_reserve_bytes;
  uint32_t check_every;        /* cgt_tree_check after every this many runs (0: every run) */
  uint32_t fault_percent;      /* runs that get an injected fault first */
  uint32_t no_capture_percent; /* segments registered with CGT_SEGMENT_NO_CAPTURE */
  size_t pool_limit_bytes;
  uint32_t prune_after_steps;
  int zero_options;    /* an all-zero cgt_options: zero means default */
  uint32_t max_graphs; /* a recording budget that evicts */
  size_t max_graph_bytes;
  uint32_t no_update_in_place;
  uint32_t static_move_every; /* the fixed STATIC buffer is reloaded at a new address every this many steps */
  int move_kind;              /* FZ_MOVE_*: how else it moves */
  /* What fuzz_options.c adds (fuzz_engine.c's essay). */
  int separate_defer;      /* a fifth tree: SEPARATE mode with defer_launch */
  int stats_invariants;    /* api.md's promises about the stats, checked after every operation */
  int random_segments;     /* segments reading a random state that prelaunch functions write */
  uint32_t toggle_percent; /* steps and operations after which a prelaunch function is set or cleared */
  uint32_t flaky_percent;  /* segments whose capture fails at every third step */
  uint32_t stale_percent;  /* operations after which a stale value is used */
  uint32_t flush_percent;  /* operations after which a cgt_flush, cgt_sync or unsynchronised copy-out comes */
} fz_config;

/* share/100 of the fuzz's steps: CGT_FUZZ_STEPS if set, else 50,000 on the
 * simulator and 2,000 on a GPU (where every read-back is a real
 * synchronisation). */
uint64_t fz_share_of_steps(uint32_t share);

/* Runs n_seeds worlds of cfg, from seed first_seed, steps steps in all;
 * skips the test under CGT_MODE. A difference or a broken promise fails the
 * test with a message that names the seed and step. */
void fz_run_test(const fz_config *cfg, uint64_t first_seed, uint32_t n_seeds, uint64_t steps);

#endif /* CGT_FUZZ_ENGINE_H */
