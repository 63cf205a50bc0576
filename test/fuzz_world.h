/* fuzz_world.h — the differential fuzz's worlds (fuzz_world.c): random
 * segments and the random programs over them that fuzz_engine.c runs. */
#ifndef CGT_FUZZ_WORLD_H
#define CGT_FUZZ_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "cgtree.h"
#include "fuzz_engine.h"

/* splitmix64: tiny, deterministic on every platform. */
typedef struct fz_rng {
  uint64_t s;
} fz_rng;

uint64_t fz_next(fz_rng *r);
uint32_t fz_below(fz_rng *r, uint32_t n); /* 0..n-1 (0 for n = 0) */
int fz_percent(fz_rng *r, uint32_t p);    /* 1 with probability p/100 */
/* A hash of two words, for per-step decisions that must not depend on how
 * much of a generator stream was used before. */
uint64_t fz_hash(uint64_t a, uint64_t b);

/* The kinds of segments. */
enum {
  SK_AFFINE, /* out = a*x + (b + variant) */
  SK_ADD,    /* out = x + y over the shorter input */
  SK_VIEW,   /* out = x[off..n): an alias (off 0) or a sub-view of the input */
  SK_TEMP,   /* out = (a*x) + (b + variant) through a temporary freed early */
  SK_CLAMP,  /* out = min(max(x, -8), 8), in place in one allocation */
  SK_SPLIT,  /* two outputs: relu(x) and an alias of x, plus a workspace left to the tree */
  SK_HALVES, /* two outputs in one allocation: relu(x) and a*x + b */
  SK_SUM,    /* out[0] = sum(x): one float */
  SK_SYNC,   /* out = a*x + b, then a stream sync: capture fails, the node runs eagerly for good */
  SK_RANDOM, /* out = x + state: a random generator's state, written by the prelaunch function before a
                graph launch and by the launch function itself in an eager run (fuzz_options.c only) */
  SK_COUNT
};

typedef struct fz_seg {
  int kind;
  float a, b;
  uint32_t off;       /* SK_VIEW: floats to skip */
  size_t extra_bytes; /* SK_TEMP: extra temporary bytes; SK_SPLIT: workspace bytes */
  uint32_t n_in, n_out;
  int flaky; /* syncs the stream (illegally while capturing) at every third step */
  char name[32];
} fz_seg;

/* One random generator per tree: what SK_RANDOM segments read. The
 * prelaunch function (while set) writes state = f(ctr) and advances ctr
 * before each launch of a recording; an eager run (not capturing, prelaunch
 * set) does the same inside the launch function. Every run of such a segment
 * thus advances ctr once, in every mode. */
typedef struct fz_random_state {
  float *state; /* device, FZ_RANDOM_FLOATS floats */
  uint64_t ctr;
  int active[16]; /* per segment index: its prelaunch function is set */
  uint64_t prelaunch_calls;
  int probe_ran; /* set by a probe kernel that ran at once: the stream was not capturing */
} fz_random_state;
#define FZ_RANDOM_FLOATS 2400

/* What a launch function of one tree gets: its segment, that tree's fault
 * switch (see fuzz_engine.c's fz_run) and random generator, and the step being run. */
typedef struct fz_seg_user {
  const fz_seg *s;
  int *fail_next_launch;
  fz_random_state *random;
  uint32_t index; /* the segment's, in its world */
  const uint64_t *step;
} fz_seg_user;

/* A segment's launch function, and the prelaunch function of SK_RANDOM
 * segments; user is the tree's fz_seg_user for the segment. */
cgt_status fz_launch(cgt_launch *l, void *user);
cgt_status fz_prelaunch(void *user, void *stream, uint64_t variant);

/* Programs: blocks of operations on named values. */
enum { OP_RUN, OP_RELEASE, OP_READ, OP_BRANCH, OP_REPEAT, OP_MAYBE_RELEASE };
enum { SRC_NAME, SRC_STATIC_FIXED, SRC_STATIC_CHANGING, SRC_DYNAMIC };

typedef struct fz_src {
  int kind;
  int name;        /* SRC_NAME */
  uint32_t floats; /* the buffers */
} fz_src;

typedef struct fz_block fz_block;
typedef struct fz_op {
  int kind;
  uint32_t salt; /* mixes the step's pattern into this op's host decisions */
  /* OP_RUN */
  uint32_t seg;
  uint64_t variant;
  fz_src in[2];
  int out[2]; /* names the outputs get; -1: kept live but unnamed */
  /* With pick >= 0, input 0 is in[0] or alt, as the value pick read back
   * and the step's pattern say: siblings of one segment and variant under
   * one parent, which the rerecord limit counts. */
  int pick;
  fz_src alt;
  /* OP_RELEASE, OP_READ; the value read by OP_BRANCH, OP_REPEAT and
   * OP_MAYBE_RELEASE; for OP_RUN, the value whose read-back picks the variant */
  int name;
  /* OP_MAYBE_RELEASE: released or left live (unused) as the value read back
   * and the step's pattern say; the runs after it are the same either way */
  int victim;
  /* OP_BRANCH: arm i ends with a run whose output 0 is arm_out[i]; after the
   * branch, `result` names it. */
  uint32_t n_arms;
  fz_block *arms;
  int *arm_out;
  int result;
  int host_mix; /* the arm also depends on the step's input pattern (host state) */
  /* OP_REPEAT: the body runs 0..3 times; at the end of each iteration the
   * body's last output becomes `carry` (the old one released if asked). */
  fz_block *body;
  int body_out;
  int carry;
  int release_old;
} fz_op;

struct fz_block {
  fz_op *ops;
  size_t n, cap;
};

#define FZ_MAX_SEGS 10
#define FZ_MAX_PROGRAMS 3

typedef struct fz_program {
  fz_block main;
  int n_names;
} fz_program;

typedef struct fz_world {
  uint32_t n_segs;
  fz_seg segs[FZ_MAX_SEGS];
  uint32_t n_programs;
  fz_program prog[FZ_MAX_PROGRAMS];
  uint32_t floats;     /* size of the caller buffers */
  uint32_t n_patterns; /* how many different input patterns steps cycle through */
} fz_world;

/* Makes the world of seed for cfg (the same seed and config, the same
 * world), and frees one. */
void fz_world_make(fz_world *w, uint64_t seed, const fz_config *cfg);
void fz_world_free(fz_world *w);

#endif /* CGT_FUZZ_WORLD_H */
