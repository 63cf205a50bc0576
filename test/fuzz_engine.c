/* fuzz_engine.c — the differential fuzz's runner: it runs the worlds of
 * fuzz_world.c in several trees at once, one per mode, comparing every byte
 * with EAGER mode's. test/fuzz.c and test/fuzz_options.c are its tests: each
 * describes the worlds it wants in an fz_config (fuzz_engine.h) and hands it
 * to fz_run_test.
 *
 * Each step picks a program, fills the step's inputs (the DYNAMIC buffer's
 * address alternates between two caller buffers, the one not in use holds
 * junk, and its contents, like those of one STATIC buffer, change from step
 * to step so that branches vary) and runs the program in four trees at
 * once, one per mode (TREE+defer is TREE with defer_launch = 1, whose
 * replays are held back and fused), operation by operation; a config may
 * ask for a fifth, SEPARATE+defer. Host decisions mix in the step's input
 * pattern, salted per operation. Every value read back, at every decision
 * and, at the end of the step, every value the step made and did not
 * release, named or not, must be the same bytes in every tree;
 * cgt_tree_check must pass after every run in every tree. EAGER mode never
 * records, so it is the reference; SEPARATE records without sharing; TREE is
 * the product. After the last step the last 60 steps run three more times:
 * the third pass must only replay (the tree has settled). Injected faults
 * (a launch function that fails, no device memory, no host memory) must
 * leave a failed run without effect.
 *
 * What fuzz_options.c asks for on top, each off unless its config field is
 * set: random segments whose prelaunch functions are set and cleared
 * mid-run; STATIC buffers that move every step or cycle through two or three
 * addresses; values of earlier steps and released values used again, which
 * must be refused as stale and counted once; cgt_flush, cgt_sync and
 * unsynchronised copy-outs among held-back work; and the stats promises of
 * api.md, checked after every operation.
 *
 * CGT_FUZZ_BUDGET=n gives every test's trees a recording budget of n graphs
 * (max_graphs), so that the whole fuzz runs with eviction on.
 * CGT_FUZZ_STEPS overrides the total number of steps (fz_share_of_steps).
 * CGT_FUZZ_SEED=<seed> runs only that seed, exactly as it runs among the
 * others (same options, same number of steps), and CGT_FUZZ_VERBOSE=1
 * prints every seed's statistics. A failure names the test, seed, step,
 * program and operation, so CGT_FUZZ_SEED (with the same CGT_FUZZ_STEPS, if
 * one was set) reproduces it alone. With CGT_MODE set the fuzz skips: every
 * tree would run in that one mode.
 */
#include "fuzz_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cgtree_sim.h"
#include "fuzz_world.h"
#include "test_util.h"
#include "tree_hooks.h"

#define FZ_MAX_MADE 2048 /* values a step may make that are checked at its end */

/* The trees a seed runs in, one per mode: DEFER is TREE with defer_launch
 * = 1 (path fusion), SEPARATE_DEFER (only with cfg->separate_defer) is
 * SEPARATE with it. EAGER, which never records, is the reference. The
 * order is the order every operation visits the trees in. */
enum { FZ_TREE, FZ_SEPARATE, FZ_DEFER, FZ_EAGER, FZ_SEPARATE_DEFER, FZ_MODES };
static const cgt_mode fz_modes[FZ_MODES] = {CGT_MODE_TREE, CGT_MODE_SEPARATE, CGT_MODE_TREE, CGT_MODE_EAGER,
                                            CGT_MODE_SEPARATE};
static const char *const fz_mode_names[FZ_MODES] = {"TREE", "SEPARATE", "TREE+defer", "EAGER", "SEPARATE+defer"};
static int fz_defers(int m) { return m == FZ_DEFER || m == FZ_SEPARATE_DEFER; }

typedef struct fz_ctx {
  const fz_config *cfg;
  uint64_t seed;
  fz_world *w;
  int n_trees; /* FZ_MODES with cfg->separate_defer, else one fewer */
  cgt_tree *t[FZ_MODES];
  cgt_segment seg_id[FZ_MAX_SEGS];
  fz_seg_user user[FZ_MODES][FZ_MAX_SEGS];
  int fail_next_launch[FZ_MODES];
  uint64_t runs_done;                   /* for check_every */
  uint64_t faults_injected, faults_hit; /* faults set up; runs they made fail */
  cgt_value *map[FZ_MODES];             /* name -> value, per tree */
  int map_cap;
  float *stat_fixed, *stat_changing, *dyn[2]; /* caller device buffers */
  float *host_in;                             /* staging for uploads */
  float *host[FZ_MODES];                      /* read-back buffers */
  size_t host_floats;
  uint64_t step;
  uint32_t pattern; /* of the step's inputs */
  uint32_t prog;
  int dyn_cur;
  uint64_t ops_done; /* operations of this step, for messages */
  uint64_t reads;
  uint64_t step_values, max_step_values; /* values made in a step: the path's length */
  int started;                           /* a step has run: the next one begins with cgt_step_begin */
  /* Every value the step made, in order, per tree, and whether the program
   * released it. */
  cgt_value made[FZ_MODES][FZ_MAX_MADE];
  uint8_t made_released[FZ_MAX_MADE];
  size_t n_made;
  /* What fuzz_options.c asks for. */
  fz_random_state random[FZ_MODES];
  float *ring[3]; /* FZ_MOVE_DOUBLE / FZ_MOVE_RING3: the fixed STATIC buffer's addresses */
  uint32_t n_ring;
  cgt_value dead[FZ_MODES][16]; /* values of earlier steps, and values released: all stale */
  uint32_t n_dead, dead_next;
  cgt_stats prev[FZ_MODES];
  int have_prev[FZ_MODES];
  uint32_t max_id[FZ_MODES];
  float *pending[FZ_MODES]; /* a copy-out not yet synchronised */
  size_t pending_floats;
  uint64_t stale_tries, flushes, syncs, async_copies, toggles;
} fz_ctx;

#define FZ_FAIL(c, ...)                                                                                             \
  fail_msg("fuzz %s, seed %llu, step %llu, program %u, op %llu: %s", (c)->cfg->test, (unsigned long long)(c)->seed, \
           (unsigned long long)(c)->step, (c)->prog, (unsigned long long)(c)->ops_done, fz_msg(__VA_ARGS__))

static const char *fz_msg(const char *fmt, ...) {
  static char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

static void fz_check_status(fz_ctx *c, int m, cgt_status st, const char *what) {
  if (st != CGT_OK)
    FZ_FAIL(c, "%s in %s mode returned %s (last error: %s)", what, fz_mode_names[m], cgt_status_name(st),
            cgt_tree_last_error(c->t[m]));
}

/* What api.md promises of the counters, checked after every operation:
 * counters and peaks never fall (pool_peak_bytes and host_allocs "never
 * fall"), the peak is at least what is allocated now, stats.nodes is the
 * node list's count, ids are in order and never reused, every node that
 * exists or existed is counted (nodes + nodes_pruned + nodes_evicted >= the
 * largest id), fused_runs >= 2 * fused_launches, graphs equals the RECORDED
 * nodes in TREE mode, and EAGER mode has no nodes. */
static void fz_invariants(fz_ctx *c, int m) {
  cgt_tree *t = c->t[m];
  cgt_status st = cgt_tree_check(t);
  if (st != CGT_OK)
    FZ_FAIL(c, "cgt_tree_check in %s mode: %s", fz_mode_names[m], cgt_tree_last_error(t));
  cgt_stats s;
  fz_check_status(c, m, cgt_tree_stats(t, &s), "cgt_tree_stats");
  if (c->have_prev[m]) {
    const cgt_stats *p = &c->prev[m];
#define FZ_MONO(f)                                                                                         \
  if (strcmp(#f, "nodes") && strcmp(#f, "pool_reserved_bytes") && strcmp(#f, "pool_allocated_bytes") &&    \
      strcmp(#f, "graphs") && strcmp(#f, "graph_bytes") && s.f < p->f)                                     \
    FZ_FAIL(c, "%s mode: stats.%s fell from %llu to %llu", fz_mode_names[m], #f, (unsigned long long)p->f, \
            (unsigned long long)s.f);
    CGT_STATS_FIELDS(FZ_MONO, FZ_MONO)
#undef FZ_MONO
  }
  c->prev[m] = s;
  c->have_prev[m] = 1;
  if (s.pool_peak_bytes < s.pool_allocated_bytes)
    FZ_FAIL(c, "%s mode: pool_peak_bytes %zu < pool_allocated_bytes %zu", fz_mode_names[m], s.pool_peak_bytes,
            s.pool_allocated_bytes);
  if (s.fused_runs < 2 * s.fused_launches)
    FZ_FAIL(c, "%s mode: fused_runs %llu < 2 * fused_launches %llu", fz_mode_names[m], (unsigned long long)s.fused_runs,
            (unsigned long long)s.fused_launches);
  size_t n = 0;
  fz_check_status(c, m, cgt_tree_nodes(t, NULL, 0, &n), "cgt_tree_nodes");
  if (n != s.nodes)
    FZ_FAIL(c, "%s mode: cgt_tree_nodes counts %zu nodes, stats.nodes %llu", fz_mode_names[m], n,
            (unsigned long long)s.nodes);
  if (m == FZ_EAGER && (n || s.recordings || s.replays || s.graphs))
    FZ_FAIL(c, "EAGER mode has %zu nodes, %llu recordings", n, (unsigned long long)s.recordings);
  cgt_node_info *info = calloc(n + 1, sizeof *info);
  assert_non_null(info);
  size_t n2 = 0;
  fz_check_status(c, m, cgt_tree_nodes(t, info, n, &n2), "cgt_tree_nodes");
  assert_int_equal(n2, n);
  uint32_t last = 0, max_seen = c->max_id[m];
  uint64_t recorded = 0;
  for (size_t i = 0; i < n; i++) {
    if (info[i].id <= last)
      FZ_FAIL(c, "%s mode: node ids out of order (%u after %u)", fz_mode_names[m], info[i].id, last);
    last = info[i].id;
    if (info[i].id > max_seen)
      max_seen = info[i].id;
    recorded += info[i].state == CGT_NODE_RECORDED;
    if (info[i].parent) {
      size_t lo = 0, hi = n; /* the list is ordered by id */
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (info[mid].id < info[i].parent)
          lo = mid + 1;
        else
          hi = mid;
      }
      int found = lo < n && info[lo].id == info[i].parent;
      if (!found)
        FZ_FAIL(c, "%s mode: node %u names parent %u, which is not in the list", fz_mode_names[m], info[i].id,
                info[i].parent);
    }
  }
  c->max_id[m] = max_seen;
  if ((uint64_t)max_seen > s.nodes + s.nodes_pruned + s.nodes_evicted)
    FZ_FAIL(c, "%s mode: node id %u exists or existed, but nodes %llu + pruned %llu + evicted %llu is less",
            fz_mode_names[m], max_seen, (unsigned long long)s.nodes, (unsigned long long)s.nodes_pruned,
            (unsigned long long)s.nodes_evicted);
  if (fz_modes[m] == CGT_MODE_TREE && recorded != s.graphs)
    FZ_FAIL(c, "%s mode: %llu RECORDED nodes but stats.graphs %llu", fz_mode_names[m], (unsigned long long)recorded,
            (unsigned long long)s.graphs);
  free(info);
}

static void fz_invariants_all(fz_ctx *c) {
  for (int m = 0; m < c->n_trees; m++)
    fz_invariants(c, m);
}

static void fz_add_dead(fz_ctx *c, const cgt_value *v) {
  for (int m = 0; m < c->n_trees; m++)
    c->dead[m][c->dead_next] = v[m];
  c->dead_next = (c->dead_next + 1) % 16;
  if (c->n_dead < 16)
    c->n_dead++;
}

/* A stale value used in every call that takes one: each use must be
 * CGT_ERR_STALE_VALUE, counted once in stale_uses, write no output and no
 * byte of the destination, and move no other counter (host_allocs, and the
 * launches of held-back replays, excepted). */
static void fz_try_stale(fz_ctx *c, uint32_t which, uint32_t how) {
  if (!c->n_dead)
    return;
  uint32_t k = which % c->n_dead;
  for (int m = 0; m < c->n_trees; m++) {
    cgt_tree *t = c->t[m];
    cgt_value v = c->dead[m][k];
    cgt_stats before, after;
    fz_check_status(c, m, cgt_tree_stats(t, &before), "cgt_tree_stats");
    cgt_status st;
    const char *what;
    float sentinel[4] = {-7, -7, -7, -7}, got[4] = {-7, -7, -7, -7};
    switch (how % 4) {
    case 0: {
      /* a run of the first one-input segment, if any */
      uint32_t seg = UINT32_MAX;
      for (uint32_t i = 0; i < c->w->n_segs && seg == UINT32_MAX; i++)
        if (c->w->segs[i].n_in == 1)
          seg = i;
      if (seg == UINT32_MAX)
        return;
      cgt_arg a = cgt_arg_value(v);
      cgt_value outs[2] = {{0}, {0}};
      st = cgt_run(t, c->seg_id[seg], 0, &a, 1, outs, c->w->segs[seg].n_out);
      what = "cgt_run";
      if (outs[0].bits || outs[1].bits)
        FZ_FAIL(c, "%s mode: cgt_run of a stale value wrote an output", fz_mode_names[m]);
      break;
    }
    case 1:
      st = cgt_value_copy_out(t, v, got, sizeof(float));
      what = "cgt_value_copy_out";
      fz_check_status(c, m, cgt_sync(t), "cgt_sync");
      if (memcmp(got, sentinel, sizeof got))
        FZ_FAIL(c, "%s mode: cgt_value_copy_out of a stale value wrote the destination (%g)", fz_mode_names[m],
                (double)got[0]);
      break;
    case 2: {
      void *ptr = (void *)sentinel;
      size_t bytes = 12345;
      st = cgt_value_ptr(t, v, &ptr, &bytes);
      what = "cgt_value_ptr";
      break;
    }
    default:
      st = cgt_value_release(t, v);
      what = "cgt_value_release";
    }
    if (st != CGT_ERR_STALE_VALUE)
      FZ_FAIL(c, "%s of a stale value in %s mode returned %s, not CGT_ERR_STALE_VALUE", what, fz_mode_names[m],
              cgt_status_name(st));
    fz_check_status(c, m, cgt_tree_stats(t, &after), "cgt_tree_stats");
    if (after.stale_uses != before.stale_uses + 1)
      FZ_FAIL(c, "%s of a stale value in %s mode: stale_uses went from %llu to %llu", what, fz_mode_names[m],
              (unsigned long long)before.stale_uses, (unsigned long long)after.stale_uses);
#define FZ_SAME(f)                                                                                            \
  if (strcmp(#f, "host_allocs") && strcmp(#f, "stale_uses") && strcmp(#f, "fused_launches") &&                \
      strcmp(#f, "fused_runs") && strcmp(#f, "launch_host_ns") && before.f != after.f)                        \
    FZ_FAIL(c, "%s of a stale value in %s mode moved stats.%s from %llu to %llu", what, fz_mode_names[m], #f, \
            (unsigned long long)before.f, (unsigned long long)after.f);
    CGT_STATS_FIELDS(FZ_SAME, FZ_SAME)
#undef FZ_SAME
  }
  c->stale_tries++;
}

/* Reads v[m] back from every tree m; all must agree on size and bytes.
 * Returns the reference (EAGER) copy's first float. */
static float fz_read_values(fz_ctx *c, const cgt_value *v, const char *why, const char *which, long id) {
  size_t bytes[FZ_MODES] = {0};
  for (int m = 0; m < c->n_trees; m++)
    fz_check_status(c, m, cgt_value_ptr(c->t[m], v[m], NULL, &bytes[m]), "cgt_value_ptr");
  for (int m = 0; m < c->n_trees; m++)
    if (bytes[m] != bytes[FZ_EAGER])
      FZ_FAIL(c, "%s of %s %ld: %s has %zu bytes, EAGER %zu", why, which, id, fz_mode_names[m], bytes[m],
              bytes[FZ_EAGER]);
  size_t n = bytes[FZ_EAGER] / sizeof(float);
  assert_true(n >= 1 && n <= c->host_floats);
  for (int m = 0; m < c->n_trees; m++) {
    memset(c->host[m], 0xa5, n * sizeof(float));
    fz_check_status(c, m, cgt_value_copy_out(c->t[m], v[m], c->host[m], n * sizeof(float)), "cgt_value_copy_out");
    fz_check_status(c, m, cgt_sync(c->t[m]), "cgt_sync");
  }
  for (int m = 0; m < c->n_trees; m++) {
    if (m == FZ_EAGER || !memcmp(c->host[m], c->host[FZ_EAGER], n * sizeof(float)))
      continue;
    size_t i = 0;
    while (!memcmp(&c->host[m][i], &c->host[FZ_EAGER][i], sizeof(float)))
      i++;
    FZ_FAIL(c, "%s of %s %ld (%zu floats): %s has %a at [%zu], EAGER %a", why, which, id, n, fz_mode_names[m],
            (double)c->host[m][i], i, (double)c->host[FZ_EAGER][i]);
  }
  c->reads++;
  return c->host[FZ_EAGER][0];
}

static float fz_read(fz_ctx *c, int name, const char *why) {
  cgt_value v[FZ_MODES];
  for (int m = 0; m < c->n_trees; m++)
    v[m] = c->map[m][name];
  return fz_read_values(c, v, why, "name", name);
}

/* At the end of a step every value the step made and did not release is
 * read back, named or not: a replay that overwrote a live value the
 * program no longer mentions is caught too. */
static void fz_read_all_live(fz_ctx *c) {
  for (size_t i = 0; i < c->n_made; i++) {
    if (c->made_released[i])
      continue;
    cgt_value v[FZ_MODES];
    for (int m = 0; m < c->n_trees; m++)
      v[m] = c->made[m][i];
    (void)fz_read_values(c, v, "end of step", "value", (long)i);
  }
}

static uint32_t fz_choose(float x, uint32_t n) {
  if (!(x > -1e6f && x < 1e6f))
    return 0;
  long v = (long)x; /* floor, without libm */
  if ((float)v > x)
    v--;
  return (uint32_t)(((v % (long)n) + (long)n) % (long)n);
}

/* The host's part of a decision: a function of the step's pattern and the op. */
static uint32_t fz_host(const fz_ctx *c, const fz_op *op) { return (uint32_t)(fz_hash(c->pattern, op->salt) >> 40); }

static cgt_arg fz_arg(fz_ctx *c, int m, const fz_src *s) {
  switch (s->kind) {
  case SRC_NAME:
    return cgt_arg_value(c->map[m][s->name]);
  case SRC_STATIC_FIXED:
    return cgt_arg_static(c->stat_fixed, s->floats * sizeof(float));
  case SRC_STATIC_CHANGING:
    return cgt_arg_static(c->stat_changing, s->floats * sizeof(float));
  default:
    return cgt_arg_dynamic(c->dyn[c->dyn_cur], s->floats * sizeof(float));
  }
}

static void fz_release(fz_ctx *c, int name) {
  for (size_t i = 0; i < c->n_made; i++)
    if (c->made[0][i].bits == c->map[0][name].bits)
      c->made_released[i] = 1;
  cgt_value v[FZ_MODES];
  for (int m = 0; m < c->n_trees; m++) {
    v[m] = c->map[m][name];
    fz_check_status(c, m, cgt_value_release(c->t[m], c->map[m][name]), "cgt_value_release");
    c->map[m][name].bits = 0;
  }
  fz_add_dead(c, v);
}

enum { FAULT_NONE, FAULT_LAUNCH, FAULT_DEVICE_MEMORY, FAULT_HOST_MEMORY, FAULT_KINDS };

/* One cgt_run in tree m, perhaps with an injected fault first: the launch
 * function fails (after allocating), the device has no memory left (a
 * simulator limit of 0), or the host allocation after the next few fails.
 * A fault may not bite (a replay calls no launch function and allocates
 * nothing); when it does, the run must fail with the fault's status and no
 * outputs, change nothing, and succeed when run again without the fault:
 * since the comparison with the other trees goes on afterwards, anything a
 * failed run left behind shows up as a difference. */
static cgt_status fz_run(fz_ctx *c, int m, cgt_segment seg, uint64_t variant, const cgt_arg *args, uint32_t n_in,
                         cgt_value *outs, uint32_t n_out) {
  cgt_tree *t = c->t[m];
  int fault = FAULT_NONE;
  if (c->cfg->fault_percent) {
    uint64_t h = fz_hash(c->seed * 31 + (uint64_t)m, c->step * 1000003u + c->ops_done);
    if (h % 100 < c->cfg->fault_percent)
      fault = 1 + (int)(h >> 20) % (FAULT_KINDS - 1);
    if (fault == FAULT_DEVICE_MEMORY && test_backend != CGT_BACKEND_SIM)
      fault = FAULT_LAUNCH;
    if (fault == FAULT_LAUNCH)
      c->fail_next_launch[m] = 1;
    else if (fault == FAULT_DEVICE_MEMORY)
      CHECK_OK(t, cgt_sim_set_device_limit(t, 0));
    else if (fault == FAULT_HOST_MEMORY)
      cgt__fail_host_alloc_after(t, (long long)(h >> 40) % 4, 1);
    c->faults_injected += fault != FAULT_NONE;
  }
  cgt_status st = cgt_run(t, seg, variant, args, n_in, outs, n_out);
  c->fail_next_launch[m] = 0;
  if (fault == FAULT_DEVICE_MEMORY)
    CHECK_OK(t, cgt_sim_set_device_limit(t, SIZE_MAX));
  if (fault == FAULT_HOST_MEMORY)
    cgt__fail_host_alloc_after(t, -1, 0);
  if (st == CGT_OK || fault == FAULT_NONE)
    return st;
  cgt_status expected = fault == FAULT_LAUNCH ? CGT_ERR_SEGMENT_FAILED : CGT_ERR_OUT_OF_MEMORY;
  if (st != expected)
    FZ_FAIL(c, "an injected %s fault made cgt_run fail with %s, not %s (last error: %s)",
            fault == FAULT_LAUNCH          ? "launch"
            : fault == FAULT_DEVICE_MEMORY ? "device memory"
                                           : "host memory",
            cgt_status_name(st), cgt_status_name(expected), cgt_tree_last_error(t));
  for (uint32_t o = 0; o < n_out; o++)
    if (outs[o].bits)
      FZ_FAIL(c, "a failed cgt_run in %s mode wrote output %u", fz_mode_names[m], o);
  st = cgt_tree_check(t);
  if (st != CGT_OK)
    FZ_FAIL(c, "cgt_tree_check after a failed run in %s mode: %s", fz_mode_names[m], cgt_tree_last_error(t));
  c->faults_hit++;
  return cgt_run(t, seg, variant, args, n_in, outs, n_out);
}

static void fz_exec(fz_ctx *c, const fz_block *b);

/* Sets or clears generator segment i's prelaunch function in every tree.
 * Setting comes after a cgt_flush: a replay held back while the segment had
 * none gets the new one at its launch (audit.c), which an eager program
 * would not have called. */
static void fz_toggle(fz_ctx *c, uint32_t i) {
  for (int m = 0; m < c->n_trees; m++) {
    fz_random_state *g = &c->random[m];
    if (g->active[i]) {
      fz_check_status(c, m, cgt_segment_set_prelaunch(c->t[m], c->seg_id[i], NULL, NULL), "clearing a prelaunch");
      g->active[i] = 0;
    } else {
      fz_check_status(c, m, cgt_flush(c->t[m]), "cgt_flush");
      fz_check_status(c, m, cgt_segment_set_prelaunch(c->t[m], c->seg_id[i], fz_prelaunch, &c->user[m][i]),
                      "setting a prelaunch");
      g->active[i] = 1;
    }
  }
  c->toggles++;
}

/* After every operation: perhaps a cgt_flush, a cgt_sync or a copy-out left
 * unsynchronised while later runs are held back; perhaps a stale value tried;
 * perhaps a random segment's prelaunch set or cleared; then the invariants.
 * With none of these asked for, nothing. */
static void fz_after_op(fz_ctx *c) {
  uint64_t h = fz_hash(c->seed * 0x9e37u + c->step, c->ops_done * 7919u + 17);
  const fz_config *cfg = c->cfg;
  if (h % 100 < cfg->flush_percent) {
    uint32_t what = (uint32_t)(h >> 8) % 3;
    if (what == 0) {
      for (int m = 0; m < c->n_trees; m++)
        fz_check_status(c, m, cgt_flush(c->t[m]), "cgt_flush");
      c->flushes++;
    } else if (what == 1) {
      for (int m = 0; m < c->n_trees; m++)
        fz_check_status(c, m, cgt_sync(c->t[m]), "cgt_sync");
      c->syncs++;
    } else if (c->n_made) {
      /* the newest live value made, copied out now and compared at the step's end */
      size_t i = c->n_made;
      while (i > 0 && c->made_released[i - 1])
        i--;
      if (i > 0 && !c->pending_floats) {
        size_t bytes = 0;
        fz_check_status(c, FZ_EAGER, cgt_value_ptr(c->t[FZ_EAGER], c->made[FZ_EAGER][i - 1], NULL, &bytes),
                        "cgt_value_ptr");
        c->pending_floats = bytes / sizeof(float);
        for (int m = 0; m < c->n_trees; m++)
          fz_check_status(c, m, cgt_value_copy_out(c->t[m], c->made[m][i - 1], c->pending[m], bytes),
                          "cgt_value_copy_out (not synchronised)");
        c->async_copies++;
      }
    }
  }
  if ((h >> 16) % 100 < cfg->stale_percent)
    fz_try_stale(c, (uint32_t)(h >> 24), (uint32_t)(h >> 40));
  if (cfg->random_segments && (h >> 48) % 100 < cfg->toggle_percent) {
    uint32_t i = (uint32_t)(h >> 56) % c->w->n_segs;
    if (c->w->segs[i].kind == SK_RANDOM)
      fz_toggle(c, i);
  }
  if (cfg->stats_invariants)
    fz_invariants_all(c);
}

static void fz_exec_op(fz_ctx *c, const fz_op *op) {
  c->ops_done++;
  switch (op->kind) {
  case OP_RUN: {
    const fz_seg *s = &c->w->segs[op->seg];
    uint64_t variant = op->variant;
    if (op->name >= 0)
      variant = fz_choose(fz_read(c, op->name, "variant read"), 3);
    int use_alt = op->pick >= 0 && (fz_choose(fz_read(c, op->pick, "input pick read"), 2) + fz_host(c, op)) % 2;
    for (int m = 0; m < c->n_trees; m++) {
      cgt_arg args[2];
      cgt_value outs[2] = {{0}, {0}};
      for (uint32_t i = 0; i < s->n_in; i++)
        args[i] = fz_arg(c, m, i == 0 && use_alt ? &op->alt : &op->in[i]);
      cgt_status st = fz_run(c, m, c->seg_id[op->seg], variant, args, s->n_in, outs, s->n_out);
      if (st != CGT_OK)
        FZ_FAIL(c, "cgt_run of %s (variant %llu) in %s mode returned %s (last error: %s)", s->name,
                (unsigned long long)variant, fz_mode_names[m], cgt_status_name(st), cgt_tree_last_error(c->t[m]));
      if (c->cfg->check_every > 1 && (c->runs_done + 1) % c->cfg->check_every)
        st = CGT_OK;
      else
        st = cgt_tree_check(c->t[m]);
      if (st != CGT_OK)
        FZ_FAIL(c, "cgt_tree_check after %s in %s mode: %s", s->name, fz_mode_names[m], cgt_tree_last_error(c->t[m]));
      for (uint32_t o = 0; o < s->n_out; o++) {
        if (op->out[o] >= 0)
          c->map[m][op->out[o]] = outs[o];
        if (c->n_made + o < FZ_MAX_MADE)
          c->made[m][c->n_made + o] = outs[o];
      }
    }
    for (uint32_t o = 0; o < s->n_out && c->n_made < FZ_MAX_MADE; o++)
      c->made_released[c->n_made++] = 0;
    c->step_values += s->n_out;
    c->runs_done++;
    break;
  }
  case OP_RELEASE:
    fz_release(c, op->name);
    break;
  case OP_READ:
    (void)fz_read(c, op->name, "read");
    break;
  case OP_MAYBE_RELEASE:
    if ((fz_choose(fz_read(c, op->name, "release read"), 2) + fz_host(c, op)) % 2)
      fz_release(c, op->victim);
    break;
  case OP_BRANCH: {
    uint32_t arm = fz_choose(fz_read(c, op->name, "branch read"), op->n_arms);
    if (op->host_mix)
      arm = (arm + fz_host(c, op)) % op->n_arms;
    fz_exec(c, &op->arms[arm]);
    for (int m = 0; m < c->n_trees; m++)
      c->map[m][op->result] = c->map[m][op->arm_out[arm]];
    break;
  }
  case OP_REPEAT: {
    uint32_t times = fz_choose(fz_read(c, op->name, "loop count read"), 4);
    for (uint32_t i = 0; i < times; i++) {
      fz_exec(c, op->body);
      if (op->release_old)
        fz_release(c, op->carry);
      for (int m = 0; m < c->n_trees; m++)
        c->map[m][op->carry] = c->map[m][op->body_out];
    }
    break;
  }
  default:
    fail_msg("unknown op %d", op->kind);
  }
  fz_after_op(c);
}

static void fz_exec(fz_ctx *c, const fz_block *b) {
  for (size_t i = 0; i < b->n; i++)
    fz_exec_op(c, &b->ops[i]);
}

/* The step's inputs. Contents cycle through a few patterns so that paths
 * repeat (and replay); the DYNAMIC buffer not in use this step holds junk,
 * so that reading it instead of the current one cannot go unnoticed. */
static void fz_fill_inputs(fz_ctx *c) {
  uint32_t f = c->w->floats;
  if (c->cfg->move_kind == FZ_MOVE_EVERY_STEP && c->step) {
    for (uint32_t i = 0; i < f; i++)
      c->host_in[i] = (float)((int)(i % 7) - 3);
    float *moved = test_dev_floats(c->host_in, f);
    test_dev_free(c->stat_fixed);
    c->stat_fixed = moved;
  } else if (c->n_ring) {
    c->stat_fixed = c->ring[c->step % c->n_ring];
  }
  if (c->cfg->static_move_every && c->step && c->step % c->cfg->static_move_every == 0) {
    /* A reload: the same contents at a new address (the last step synced
     * every tree, so nothing reads the old buffer any more). */
    for (uint32_t i = 0; i < f; i++)
      c->host_in[i] = (float)((int)(i % 7) - 3);
    float *moved = test_dev_floats(c->host_in, f);
    test_dev_free(c->stat_fixed);
    c->stat_fixed = moved;
  }
  uint64_t h = fz_hash(c->seed, c->step);
  /* New patterns join over time, so new paths keep appearing between long
   * stretches of replays. */
  uint64_t n_patterns = 2 + c->step / 25;
  if (n_patterns > c->w->n_patterns)
    n_patterns = c->w->n_patterns;
  uint32_t pattern = (uint32_t)(h % n_patterns);
  c->pattern = pattern;
  c->dyn_cur = (int)(h >> 32 & 1);
  for (uint32_t i = 0; i < f; i++)
    c->host_in[i] = (float)((int)((pattern * 5 + i * 3) % 9) - 4);
  test_dev_upload(c->dyn[c->dyn_cur], c->host_in, f);
  for (uint32_t i = 0; i < f; i++)
    c->host_in[i] = 1000.0f + (float)(c->step % 1000);
  test_dev_upload(c->dyn[!c->dyn_cur], c->host_in, f);
  for (uint32_t i = 0; i < f; i++)
    c->host_in[i] = (float)((int)((pattern * 7 + i) % 5) - 2);
  test_dev_upload(c->stat_changing, c->host_in, f);
}

/* Seed totals, summed over a test's seeds. */
typedef struct fz_totals {
  uint64_t steps, runs, reads;
  uint64_t eager_nodes; /* TREE mode */
  uint64_t warm_nodes;  /* TREE mode: nodes never recorded */
  uint64_t max_step_values;
  uint64_t same_tree_seeds; /* seeds whose TREE and TREE+defer trees were compared */
  uint64_t faults_injected, faults_hit;
  uint64_t stale_tries, flushes, toggles, prelaunch_calls;
  cgt_stats s[FZ_MODES];
} fz_totals;

static void fz_add_stats(cgt_stats *a, const cgt_stats *b) {
#define FZ_ADD(f) a->f += b->f;
  CGT_STATS_FIELDS(FZ_ADD, FZ_ADD)
#undef FZ_ADD
}

/* One step of the program the step's number picks, in every tree. */
static void fz_step(fz_ctx *c, uint64_t step) {
  c->step = step;
  if (c->started)
    for (int m = 0; m < c->n_trees; m++) {
      fz_check_status(c, m, cgt_step_begin(c->t[m]), "cgt_step_begin");
      fz_check_status(c, m, cgt_tree_check(c->t[m]), "cgt_tree_check after cgt_step_begin");
    }
  c->started = 1;
  if (c->cfg->random_segments && c->cfg->toggle_percent)
    for (uint32_t i = 0; i < c->w->n_segs; i++)
      if (c->w->segs[i].kind == SK_RANDOM &&
          fz_hash(c->seed ^ 0x70676c, c->step * 13 + i) % 100 < c->cfg->toggle_percent)
        fz_toggle(c, i);
  fz_fill_inputs(c);
  c->prog = (uint32_t)(fz_hash(c->seed ^ 0x5bd1e995u, step) % c->w->n_programs);
  c->ops_done = 0;
  c->step_values = 0;
  c->n_made = 0;
  for (int m = 0; m < c->n_trees; m++)
    memset(c->map[m], 0, ((size_t)c->map_cap + 1) * sizeof *c->map[m]);
  const fz_program *p = &c->w->prog[c->prog];
  fz_exec(c, &p->main);
  fz_read_all_live(c);
  if (c->pending_floats) {
    for (int m = 0; m < c->n_trees; m++)
      fz_check_status(c, m, cgt_sync(c->t[m]), "cgt_sync");
    for (int m = 0; m < c->n_trees; m++)
      if (m != FZ_EAGER && memcmp(c->pending[m], c->pending[FZ_EAGER], c->pending_floats * sizeof(float)))
        FZ_FAIL(c, "a copy-out left unsynchronised while later work was held back: %s differs from EAGER",
                fz_mode_names[m]);
    c->pending_floats = 0;
  }
  /* Values of this step left live: stale from the next step on. */
  for (size_t i = 0, kept = 0; c->cfg->stale_percent && i < c->n_made && kept < 3; i++)
    if (!c->made_released[i] && (fz_hash(c->seed, c->step * 31 + i) & 3) == 0) {
      cgt_value v[FZ_MODES];
      for (int m = 0; m < c->n_trees; m++)
        v[m] = c->made[m][i];
      fz_add_dead(c, v);
      kept++;
    }
  if (c->step_values > c->max_step_values)
    c->max_step_values = c->step_values;
  /* The caller buffers are rewritten next step: nothing may still read them. */
  for (int m = 0; m < c->n_trees; m++)
    fz_check_status(c, m, cgt_sync(c->t[m]), "cgt_sync");
}

static void fz_run_seed(const fz_config *cfg, uint64_t seed, uint64_t steps, fz_totals *tot) {
  fz_world w;
  fz_world_make(&w, seed, cfg);
  fz_ctx c;
  memset(&c, 0, sizeof c);
  c.cfg = cfg;
  c.seed = seed;
  c.w = &w;
  c.n_trees = cfg->separate_defer ? FZ_MODES : FZ_MODES - 1;

  cgt_options o;
  cgt_options_init(&o);
  o.warmup_runs = cfg->warmup_runs;
  o.rerecord_limit = cfg->rerecord_limit;
  if (cfg->pool_chunk_bytes)
    o.pool_chunk_bytes = cfg->pool_chunk_bytes;
  o.pool_reserve_bytes = cfg->pool_reserve_bytes;
  o.pool_limit_bytes = cfg->pool_limit_bytes;
  o.prune_after_steps = cfg->prune_after_steps;
  o.max_graphs = cfg->max_graphs;
  o.max_graph_bytes = cfg->max_graph_bytes;
  o.no_update_in_place = cfg->no_update_in_place;
  if (cfg->zero_options)
    memset(&o, 0, sizeof o); /* test_tree_new sets backend, mode and the log */
  fz_rng flags_rng = {seed ^ 0x6e6f6361ull};
  uint32_t flags[FZ_MAX_SEGS];
  for (uint32_t i = 0; i < w.n_segs; i++)
    flags[i] = fz_percent(&flags_rng, cfg->no_capture_percent) ? CGT_SEGMENT_NO_CAPTURE : 0;
  for (int m = 0; m < c.n_trees; m++) {
    o.defer_launch = fz_defers(m);
    c.t[m] = test_tree_new(fz_modes[m], &o);
    assert_int_equal(cgt_tree_mode(c.t[m]), fz_modes[m]);
    for (uint32_t i = 0; i < w.n_segs; i++) {
      c.user[m][i] = (fz_seg_user){&w.segs[i], &c.fail_next_launch[m], &c.random[m], i, &c.step};
      cgt_segment_desc d = {w.segs[i].name, fz_launch, &c.user[m][i], w.segs[i].n_in, w.segs[i].n_out, flags[i]};
      cgt_segment id = 0;
      CHECK_OK(c.t[m], cgt_segment_register(c.t[m], &d, &id));
      if (m == 0)
        c.seg_id[i] = id;
      assert_int_equal(id, c.seg_id[i]);
      if (w.segs[i].kind == SK_RANDOM) {
        c.random[m].active[i] = 1;
        CHECK_OK(c.t[m], cgt_segment_set_prelaunch(c.t[m], id, fz_prelaunch, &c.user[m][i]));
      }
    }
    if (cfg->random_segments) {
      float zeros[FZ_RANDOM_FLOATS] = {0};
      c.random[m].state = test_dev_floats(zeros, FZ_RANDOM_FLOATS);
    }
    if (cfg->flush_percent) {
      c.pending[m] = malloc(w.floats * sizeof(float));
      assert_non_null(c.pending[m]);
    }
  }
  for (uint32_t p = 0; p < w.n_programs; p++)
    if (w.prog[p].n_names > c.map_cap)
      c.map_cap = w.prog[p].n_names;
  for (int m = 0; m < c.n_trees; m++) {
    c.map[m] = calloc((size_t)c.map_cap + 1, sizeof *c.map[m]);
    assert_non_null(c.map[m]);
  }
  /* Values never outgrow the buffers: views shrink, sums make one float,
   * halves are two outputs of the input's size. */
  c.host_floats = w.floats;
  for (int m = 0; m < c.n_trees; m++) {
    c.host[m] = malloc(c.host_floats * sizeof(float));
    assert_non_null(c.host[m]);
  }
  c.host_in = malloc(w.floats * sizeof(float));
  assert_non_null(c.host_in);
  for (uint32_t i = 0; i < w.floats; i++)
    c.host_in[i] = (float)((int)(i % 7) - 3);
  c.stat_fixed = test_dev_floats(c.host_in, w.floats);
  if (cfg->move_kind == FZ_MOVE_DOUBLE || cfg->move_kind == FZ_MOVE_RING3) {
    c.n_ring = cfg->move_kind == FZ_MOVE_DOUBLE ? 2 : 3;
    c.ring[0] = c.stat_fixed;
    for (uint32_t i = 1; i < c.n_ring; i++)
      c.ring[i] = test_dev_floats(c.host_in, w.floats);
  }
  c.stat_changing = test_dev_floats(c.host_in, w.floats);
  c.dyn[0] = test_dev_floats(c.host_in, w.floats);
  c.dyn[1] = test_dev_floats(c.host_in, w.floats);

  for (uint64_t step = 0; step < steps; step++)
    fz_step(&c, step);

  /* Settling: the last steps again, three times over. The same inputs take
   * the same paths, so by the third pass every path has been seen often
   * enough to be recorded (or eager for good): the pass must only replay. */
  uint64_t window = steps < 60 ? steps : 60;
  cgt_stats before[FZ_MODES], after[FZ_MODES];
  /* A budget that evicts, or buffers that move in the replayed steps, keep
   * recording by design: they settle in memory, not in recordings. */
  /* Random segments make values that depend on how often they ran, so the
   * same step does not take the same path twice: no settling either. */
  int settles =
      !cfg->max_graphs && !cfg->max_graph_bytes && !cfg->static_move_every && !cfg->move_kind && !cfg->random_segments;
  for (int pass = 0; pass < 3 && steps >= 20 && settles; pass++) {
    for (int m = 0; m < c.n_trees; m++)
      CHECK_OK(c.t[m], cgt_tree_stats(c.t[m], &before[m]));
    for (uint64_t step = steps - window; step < steps; step++)
      fz_step(&c, step);
    if (pass < 2)
      continue;
    for (int m = 0; m < c.n_trees; m++) {
      if (m == FZ_EAGER)
        continue;
      CHECK_OK(c.t[m], cgt_tree_stats(c.t[m], &after[m]));
      if (after[m].recordings != before[m].recordings || after[m].warmups != before[m].warmups ||
          after[m].nodes + after[m].nodes_pruned != before[m].nodes + before[m].nodes_pruned)
        fail_msg(
            "fuzz %s, seed %llu: %s mode has not settled: a third pass over steps %llu..%llu made %llu "
            "recordings, %llu warmups and %llu nodes",
            cfg->test, (unsigned long long)seed, fz_mode_names[m], (unsigned long long)(steps - window),
            (unsigned long long)(steps - 1), (unsigned long long)(after[m].recordings - before[m].recordings),
            (unsigned long long)(after[m].warmups - before[m].warmups),
            (unsigned long long)(after[m].nodes + after[m].nodes_pruned - before[m].nodes - before[m].nodes_pruned));
    }
  }

  cgt_stats s[FZ_MODES];
  for (int m = 0; m < c.n_trees; m++) {
    CHECK_OK(c.t[m], cgt_tree_stats(c.t[m], &s[m]));
    fz_add_stats(&tot->s[m], &s[m]);
  }
  size_t n_nodes = 0;
  CHECK_OK(c.t[FZ_TREE], cgt_tree_nodes(c.t[FZ_TREE], NULL, 0, &n_nodes));
  assert_int_equal(n_nodes, s[FZ_TREE].nodes);
  cgt_node_info *info = calloc(n_nodes + 1, sizeof *info);
  assert_non_null(info);
  CHECK_OK(c.t[FZ_TREE], cgt_tree_nodes(c.t[FZ_TREE], info, n_nodes, &n_nodes));
  uint64_t eager_nodes = 0, warm_nodes = 0;
  for (size_t i = 0; i < n_nodes; i++) {
    eager_nodes += info[i].state == CGT_NODE_EAGER;
    warm_nodes += info[i].state == CGT_NODE_WARMUP;
  }
  tot->warm_nodes += warm_nodes;
  free(info);
  tot->eager_nodes += eager_nodes;
  if (c.max_step_values > tot->max_step_values)
    tot->max_step_values = c.max_step_values;
  tot->steps += steps;
  tot->runs += s[FZ_EAGER].runs;
  tot->reads += c.reads;
  tot->faults_injected += c.faults_injected;
  tot->faults_hit += c.faults_hit;
  /* Every mode ran every run, and EAGER mode never records. */
  assert_int_equal(s[FZ_TREE].runs, s[FZ_EAGER].runs);
  assert_int_equal(s[FZ_SEPARATE].runs, s[FZ_EAGER].runs);
  assert_int_equal(s[FZ_EAGER].recordings, 0);
  assert_int_equal(s[FZ_EAGER].replays, 0);
  assert_int_equal(s[FZ_EAGER].nodes, 0);
  /* Deferred launch changes when graphs are launched, nothing else: the
   * same tree, the same recordings, the same pool memory. That holds for the
   * same device addresses; when a pool spans several chunks, best fit
   * depends on their address order, which here is the host heap's (the
   * trees share it, and fused executables are host memory on the
   * simulator), so the comparison is made where each pool is one chunk. */
  size_t chunk = o.pool_chunk_bytes;
  if (s[FZ_TREE].pool_reserved_bytes <= chunk && s[FZ_DEFER].pool_reserved_bytes <= chunk) {
    assert_int_equal(s[FZ_DEFER].recordings, s[FZ_TREE].recordings);
    assert_int_equal(s[FZ_DEFER].replays, s[FZ_TREE].replays);
    assert_int_equal(s[FZ_DEFER].nodes, s[FZ_TREE].nodes);
    assert_int_equal(s[FZ_DEFER].pool_peak_bytes, s[FZ_TREE].pool_peak_bytes);
    assert_int_equal(s[FZ_DEFER].pool_reserved_bytes, s[FZ_TREE].pool_reserved_bytes);
    tot->same_tree_seeds++;
  }
  assert_int_equal(s[FZ_TREE].fused_launches, 0);
  assert_true(s[FZ_DEFER].fused_runs >= 2 * s[FZ_DEFER].fused_launches);
  if (getenv("CGT_FUZZ_VERBOSE"))
    for (int m = 0; m < c.n_trees; m++)
      print_message("fuzz %s seed %llu %s: %llu runs, %llu replays, %llu recordings, %llu re-records, %llu warmups, "
                    "%llu eager runs, %llu restores, %llu nodes (%llu EAGER in TREE mode), pool peak %zu\n",
                    cfg->test, (unsigned long long)seed, fz_mode_names[m], (unsigned long long)s[m].runs,
                    (unsigned long long)s[m].replays, (unsigned long long)s[m].recordings,
                    (unsigned long long)s[m].rerecords, (unsigned long long)s[m].warmups,
                    (unsigned long long)s[m].eager_runs, (unsigned long long)s[m].checkpoint_restores,
                    (unsigned long long)s[m].nodes, (unsigned long long)eager_nodes, s[m].pool_peak_bytes);

  for (int m = 0; m < c.n_trees; m++) {
    test_tree_free(c.t[m]);
    free(c.map[m]);
    free(c.host[m]);
  }
  if (c.n_ring)
    for (uint32_t i = 0; i < c.n_ring; i++)
      test_dev_free(c.ring[i]);
  else
    test_dev_free(c.stat_fixed);
  for (int m = 0; m < c.n_trees; m++) {
    if (c.random[m].state)
      test_dev_free(c.random[m].state);
    free(c.pending[m]);
    tot->prelaunch_calls += c.random[m].prelaunch_calls;
  }
  tot->stale_tries += c.stale_tries;
  tot->flushes += c.flushes + c.syncs + c.async_copies;
  tot->toggles += c.toggles;
  test_dev_free(c.stat_changing);
  test_dev_free(c.dyn[0]);
  test_dev_free(c.dyn[1]);
  free(c.host_in);
  fz_world_free(&w);
}

uint64_t fz_share_of_steps(uint32_t share) {
  const char *e = getenv("CGT_FUZZ_STEPS");
  uint64_t total = test_backend == CGT_BACKEND_CUDA ? 2000 : 50000;
  if (e && *e)
    total = strtoull(e, NULL, 10);
  return total * share / 100;
}

void fz_run_test(const fz_config *cfg, uint64_t first_seed, uint32_t n_seeds, uint64_t steps) {
  /* CGT_MODE would put every tree in one mode: nothing to compare. */
  const char *forced = getenv("CGT_MODE");
  if (forced && *forced)
    skip();
  /* Random segments tell an eager run from a capture with a simulator kernel. */
  if (cfg->random_segments && test_backend != CGT_BACKEND_SIM)
    skip();
  /* CGT_FUZZ_BUDGET=n puts every test's trees under a recording budget of n
   * graphs (test/soak.sh evict): evictions everywhere, same bytes. */
  fz_config budgeted = *cfg;
  int must_evict = cfg->max_graphs != 0; /* a budget of the test's own, not the soak's */
  const char *budget = getenv("CGT_FUZZ_BUDGET");
  int soak_budget = 0;
  if (budget && *budget && !cfg->max_graphs && !cfg->max_graph_bytes) {
    budgeted.max_graphs = (uint32_t)strtoul(budget, NULL, 10);
    soak_budget = budgeted.max_graphs != 0;
    cfg = &budgeted;
  }
  const char *one = getenv("CGT_FUZZ_SEED");
  fz_totals tot;
  memset(&tot, 0, sizeof tot);
  uint64_t per_seed = steps / n_seeds ? steps / n_seeds : 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint32_t i = 0; i < n_seeds; i++)
    if (!one || !*one || strtoull(one, NULL, 10) == first_seed + i)
      fz_run_seed(cfg, first_seed + i, per_seed, &tot);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  print_message(
      "fuzz %s: %.1f s, %llu steps (up to %llu values each), %llu runs per mode, %llu read-backs; TREE %llu "
      "replays, %llu recordings, %llu re-records, %llu restores, %llu nodes (%llu EAGER, %llu WARMUP, %llu "
      "pruned); %llu faults injected, %llu made a run fail; TREE+defer %llu fused launches of %llu runs, the same "
      "tree in %llu seeds\n",
      cfg->test, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
      (unsigned long long)tot.steps, (unsigned long long)tot.max_step_values, (unsigned long long)tot.runs,
      (unsigned long long)tot.reads, (unsigned long long)tot.s[FZ_TREE].replays,
      (unsigned long long)tot.s[FZ_TREE].recordings, (unsigned long long)tot.s[FZ_TREE].rerecords,
      (unsigned long long)tot.s[FZ_TREE].checkpoint_restores, (unsigned long long)tot.s[FZ_TREE].nodes,
      (unsigned long long)tot.eager_nodes, (unsigned long long)tot.warm_nodes,
      (unsigned long long)tot.s[FZ_TREE].nodes_pruned, (unsigned long long)tot.faults_injected,
      (unsigned long long)tot.faults_hit, (unsigned long long)tot.s[FZ_DEFER].fused_launches,
      (unsigned long long)tot.s[FZ_DEFER].fused_runs, (unsigned long long)tot.same_tree_seeds);
  if (cfg->max_graphs || cfg->max_graph_bytes || cfg->static_move_every)
    print_message("fuzz %s: TREE %llu evictions (%llu descendants removed), %llu updates in place (%llu instantiated "
                  "afresh); TREE+defer %llu evictions; SEPARATE %llu evictions\n",
                  cfg->test, (unsigned long long)tot.s[FZ_TREE].evictions,
                  (unsigned long long)tot.s[FZ_TREE].nodes_evicted, (unsigned long long)tot.s[FZ_TREE].updates,
                  (unsigned long long)tot.s[FZ_TREE].update_fallbacks, (unsigned long long)tot.s[FZ_DEFER].evictions,
                  (unsigned long long)tot.s[FZ_SEPARATE].evictions);
  if (cfg->separate_defer || cfg->stale_percent || cfg->flush_percent || cfg->random_segments)
    print_message("fuzz %s: %llu stale uses tried, %llu flushes/syncs/unsynchronised copies, %llu prelaunch toggles, "
                  "%llu prelaunch calls; SEPARATE+defer %llu fused launches\n",
                  cfg->test, (unsigned long long)tot.stale_tries, (unsigned long long)tot.flushes,
                  (unsigned long long)tot.toggles, (unsigned long long)tot.prelaunch_calls,
                  (unsigned long long)tot.s[FZ_SEPARATE_DEFER].fused_launches);
  if (cfg->fault_percent && tot.steps >= 50)
    assert_true(tot.faults_hit > 0);
  if (cfg->min_ops >= 300 && tot.steps >= 10)
    assert_true(tot.max_step_values >= 500);
  /* The fuzz must not pass by never recording. */
  if (tot.steps >= 50) {
    assert_true(tot.s[FZ_TREE].recordings > 0);
    assert_true(tot.s[FZ_TREE].replays > 0);
    assert_true(tot.s[FZ_SEPARATE].recordings > 0);
    assert_true(tot.s[FZ_SEPARATE].replays > 0);
    if (!soak_budget) /* the soak's budget of a few graphs can leave a config no chain of replays to fuse */
      assert_true(tot.s[FZ_DEFER].fused_launches > 0);
    if (must_evict)
      assert_true(tot.s[FZ_TREE].evictions > 0 && tot.s[FZ_DEFER].evictions > 0);
    /* Nor by never doing what its config asks for. */
    if (cfg->separate_defer && !soak_budget)
      assert_true(tot.s[FZ_SEPARATE_DEFER].fused_launches > 0);
    if (cfg->stale_percent)
      assert_true(tot.stale_tries > 0);
    if (cfg->flush_percent)
      assert_true(tot.flushes > 0);
    if (cfg->random_segments)
      assert_true(tot.prelaunch_calls > 0);
    if (cfg->toggle_percent)
      assert_true(tot.toggles > 0);
  }
}
