/* fuzz.c — differential fuzzing: random programs give bit-identical outputs
 * in TREE, SEPARATE and EAGER modes, and in TREE mode with deferred launch.
 *
 * A seed makes a *world*: a handful of segments of random kinds (affine,
 * add, view or sub-view of the input, a temporary freed early, clamp, two
 * outputs in one allocation or beside an alias of the input, sum, and a
 * careless one that syncs the stream, so its capture fails and its node runs
 * eagerly for good) and one to three *programs* over them. A program is a
 * block of operations: run a segment on live values, a STATIC buffer or a
 * DYNAMIC buffer; release a value; read a value back; branch on a value read
 * back into one of two or three arms; repeat a loop body as many times as a
 * value read back says, carrying one value from iteration to iteration; or
 * release a value or not, as a value read back says. Variants and the choice
 * between two inputs can come from values read back too. Host decisions mix
 * in the step's input pattern, salted per operation, so that each decision
 * varies on its own.
 *
 * The same segment reached under the same parent with other values live is
 * what makes the tree re-record, and with other inputs is what the rerecord
 * limit counts; twin arms (a copy of another arm with one more release, or
 * with another first input), the maybe-release and the input choice make
 * both happen often.
 *
 * Each step picks a program, fills the step's inputs (the DYNAMIC buffer's
 * address alternates between two caller buffers, the one not in use holds
 * junk, and its contents, like those of one STATIC buffer, change from step
 * to step so that branches vary) and runs the program in four trees at
 * once, one per mode (TREE+defer is TREE with defer_launch = 1, whose
 * replays are held back and fused), operation by operation. Every value read back, at
 * every decision and, at the end of the step, every value the step made and
 * did not release, named or not, must be the same bytes in all four trees;
 * cgt_tree_check must pass after every run in every tree. EAGER mode never
 * records, so it is the reference; SEPARATE records without sharing; TREE is
 * the product. After the last step the last 60 steps run three more times:
 * the third pass must only replay (the tree has settled).
 *
 * Values stay small: the constants are small integers or 0.5 and a clamp
 * segment pulls values back into [-8, 8], so branches keep taking every arm.
 * Exactness does not matter for the comparison (each mode runs the same
 * kernels on the same data in the same order) but keeps programs lively.
 *
 * Options vary by test and seed: warmup_runs 0 to 2, rerecord limits of 1
 * to 3, 4 KiB pool chunks with values up to 10 KiB (chunks grow during
 * warmup and recording; oversize requests get chunks of their own), default
 * options, long programs whose steps make over 64 values, and recording
 * budgets of one to four graphs with STATIC buffers that move (evictions
 * and updates in place all the time), and moving STATIC buffers without a
 * budget (updates in place of whole subtrees).
 *
 * CGT_FUZZ_BUDGET=n gives every test's trees a recording budget of n graphs
 * (max_graphs), so that the whole fuzz runs with eviction on.
 * CGT_FUZZ_STEPS overrides the total number of steps (default 24,000 on the
 * simulator, 2,000 on CUDA), spread over the tests by a fixed share.
 * CGT_FUZZ_SEED=<seed> runs only that seed, exactly as it runs among the
 * others (same options, same number of steps), and CGT_FUZZ_VERBOSE=1
 * prints every seed's statistics. A failure names the test, seed, step,
 * program and operation, so CGT_FUZZ_SEED (with the same CGT_FUZZ_STEPS, if
 * one was set) reproduces it alone. With CGT_MODE set the fuzz skips: every
 * tree would run in that one mode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cgtree_sim.h"
#include "test_lists.h"
#include "test_util.h"
#include "tree_hooks.h"

/* ------------------------------------------------------------------ PRNG */

/* splitmix64: tiny, deterministic on every platform. */
typedef struct fz_rng {
  uint64_t s;
} fz_rng;

static uint64_t fz_next(fz_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint32_t fz_below(fz_rng *r, uint32_t n) { return n ? (uint32_t)(fz_next(r) % n) : 0; }
static int fz_percent(fz_rng *r, uint32_t p) { return fz_below(r, 100) < p; }

/* A hash of a few words, for per-step decisions that must not depend on how
 * much of a generator stream was used before. */
static uint64_t fz_hash(uint64_t a, uint64_t b) {
  fz_rng r = {a * 0x2545f4914f6cdd1dull ^ b};
  fz_next(&r);
  return fz_next(&r);
}

/* -------------------------------------------------------------- segments */

enum {
  SK_AFFINE,  /* out = a*x + (b + variant) */
  SK_ADD,     /* out = x + y over the shorter input */
  SK_VIEW,    /* out = x[off..n): an alias (off 0) or a sub-view of the input */
  SK_TEMP,    /* out = (a*x) + (b + variant) through a temporary freed early */
  SK_CLAMP,   /* out = min(max(x, -8), 8), in place in one allocation */
  SK_SPLIT,   /* two outputs: relu(x) and an alias of x, plus a workspace left to the tree */
  SK_HALVES,  /* two outputs in one allocation: relu(x) and a*x + b */
  SK_SUM,     /* out[0] = sum(x): one float */
  SK_SYNC,    /* out = a*x + b, then a stream sync: capture fails, the node runs eagerly for good */
  SK_COUNT
};

static const char *const fz_kind_names[SK_COUNT] = {"affine", "add",    "view", "temp", "clamp",
                                                    "split",  "halves", "sum",  "sync"};

typedef struct fz_seg {
  int kind;
  float a, b;
  uint32_t off;       /* SK_VIEW: floats to skip */
  size_t extra_bytes; /* SK_TEMP: extra temporary bytes; SK_SPLIT: workspace bytes */
  uint32_t n_in, n_out;
  char name[32];
} fz_seg;

static size_t fz_in_floats(cgt_launch *l, uint32_t i) { return cgt_launch_input_bytes(l, i) / sizeof(float); }

/* Every launch function returns the first failure; the fuzz expects none. */
#define FZ_TRY(expr)                 \
  do {                               \
    cgt_status st_ = (expr);         \
    if (st_ != CGT_OK)               \
      return st_;                    \
  } while (0)

/* What a launch function of one tree gets: its segment, and that tree's
 * fault switch (see fz_run). */
typedef struct fz_seg_user {
  const fz_seg *s;
  int *fail_next_launch;
} fz_seg_user;

static cgt_status fz_launch(cgt_launch *l, void *user) {
  const fz_seg_user *u = user;
  const fz_seg *s = u->s;
  const kernels *k = test_kernels();
  if (*u->fail_next_launch) {
    /* An injected failure, after taking memory the tree must give back. */
    void *junk;
    *u->fail_next_launch = 0;
    (void)cgt_launch_alloc(l, 256, &junk);
    return CGT_ERR_SEGMENT_FAILED;
  }
  void *stream = cgt_launch_stream(l);
  float bias = s->b + (float)cgt_launch_variant(l);
  const float *x = cgt_launch_input(l, 0);
  size_t n = fz_in_floats(l, 0);
  if (!x || n == 0)
    return CGT_ERR_INVALID_ARGUMENT;
  void *p;
  switch (s->kind) {
  case SK_AFFINE:
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float), &p));
    FZ_TRY(k->affine(stream, x, s->a, bias, p, n));
    return cgt_launch_set_output(l, 0, p, n * sizeof(float));
  case SK_ADD: {
    size_t m = fz_in_floats(l, 1);
    if (m < n)
      n = m;
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float), &p));
    FZ_TRY(k->add(stream, x, cgt_launch_input(l, 1), p, n));
    return cgt_launch_set_output(l, 0, p, n * sizeof(float));
  }
  case SK_VIEW: {
    size_t off = s->off < n ? s->off : n - 1;
    return cgt_launch_set_output(l, 0, (void *)(x + off), (n - off) * sizeof(float));
  }
  case SK_TEMP: {
    void *tmp;
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float) + s->extra_bytes, &tmp));
    FZ_TRY(k->affine(stream, x, s->a, 0.0f, tmp, n));
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float), &p));
    FZ_TRY(k->affine(stream, tmp, 1.0f, bias, p, n));
    FZ_TRY(cgt_launch_free(l, tmp));
    return cgt_launch_set_output(l, 0, p, n * sizeof(float));
  }
  case SK_CLAMP:
    /* 8 - relu(16 - relu(x + 8)) = min(max(x, -8), 8) */
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float), &p));
    FZ_TRY(k->affine(stream, x, 1.0f, 8.0f, p, n));
    FZ_TRY(k->relu(stream, p, p, n));
    FZ_TRY(k->affine(stream, p, -1.0f, 16.0f, p, n));
    FZ_TRY(k->relu(stream, p, p, n));
    FZ_TRY(k->affine(stream, p, -1.0f, 8.0f, p, n));
    return cgt_launch_set_output(l, 0, p, n * sizeof(float));
  case SK_SPLIT: {
    void *ws;
    FZ_TRY(cgt_launch_alloc(l, s->extra_bytes, &ws)); /* never freed: the tree frees it on return */
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float), &p));
    FZ_TRY(k->relu(stream, x, p, n));
    FZ_TRY(cgt_launch_set_output(l, 0, p, n * sizeof(float)));
    return cgt_launch_set_output(l, 1, (void *)x, n * sizeof(float));
  }
  case SK_HALVES: {
    FZ_TRY(cgt_launch_alloc(l, 2 * n * sizeof(float), &p));
    float *f = p;
    FZ_TRY(k->relu(stream, x, f, n));
    FZ_TRY(k->affine(stream, x, s->a, bias, f + n, n));
    FZ_TRY(cgt_launch_set_output(l, 1, f + n, n * sizeof(float)));
    return cgt_launch_set_output(l, 0, f, n * sizeof(float));
  }
  case SK_SUM:
    FZ_TRY(cgt_launch_alloc(l, sizeof(float), &p));
    FZ_TRY(k->sum(stream, x, n, p));
    return cgt_launch_set_output(l, 0, p, sizeof(float));
  case SK_SYNC:
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float), &p));
    FZ_TRY(k->affine(stream, x, s->a, bias, p, n));
    (void)k->illegal_stream_sync(stream); /* a careless segment ignores the verdict */
    return cgt_launch_set_output(l, 0, p, n * sizeof(float));
  default:
    return CGT_ERR_INVALID_ARGUMENT;
  }
}

/* -------------------------------------------------------------- programs */

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

#define FZ_MAX_ENV 20
#define FZ_MAX_SEGS 10
#define FZ_MAX_PROGRAMS 3
#define FZ_MAX_DEPTH 3
#define FZ_MAX_MADE 2048 /* values a step may make that are checked at its end */

/* The names a program may use at a point, as the generator sees them.
 * Pinned names belong to an enclosing loop body's outer scope: the body may
 * read but not release them. */
typedef struct fz_env {
  int n;
  int name[FZ_MAX_ENV];
  uint8_t pinned[FZ_MAX_ENV];
} fz_env;

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

typedef struct fz_gen {
  fz_rng r;
  fz_world *w;
  fz_program *p;
} fz_gen;

static fz_op *block_add(fz_block *b) {
  if (b->n == b->cap) {
    b->cap = b->cap ? 2 * b->cap : 8;
    b->ops = realloc(b->ops, b->cap * sizeof *b->ops);
    assert_non_null(b->ops);
  }
  fz_op *op = &b->ops[b->n++];
  memset(op, 0, sizeof *op);
  op->out[0] = op->out[1] = op->name = op->result = op->body_out = op->carry = op->victim = op->pick = -1;
  return op;
}

static void block_free(fz_block *b) {
  for (size_t i = 0; i < b->n; i++) {
    fz_op *op = &b->ops[i];
    if (op->kind == OP_BRANCH) {
      for (uint32_t a = 0; a < op->n_arms; a++)
        block_free(&op->arms[a]);
      free(op->arms);
      free(op->arm_out);
    } else if (op->kind == OP_REPEAT) {
      block_free(op->body);
      free(op->body);
    }
  }
  free(b->ops);
  memset(b, 0, sizeof *b);
}

static void block_clone(fz_block *dst, const fz_block *src) {
  memset(dst, 0, sizeof *dst);
  for (size_t i = 0; i < src->n; i++) {
    fz_op *op = block_add(dst);
    *op = src->ops[i];
    if (op->kind == OP_BRANCH) {
      op->arms = calloc(op->n_arms, sizeof *op->arms);
      op->arm_out = malloc(op->n_arms * sizeof *op->arm_out);
      assert_non_null(op->arms);
      assert_non_null(op->arm_out);
      for (uint32_t a = 0; a < op->n_arms; a++) {
        block_clone(&op->arms[a], &src->ops[i].arms[a]);
        op->arm_out[a] = src->ops[i].arm_out[a];
      }
    } else if (op->kind == OP_REPEAT) {
      op->body = calloc(1, sizeof *op->body);
      assert_non_null(op->body);
      block_clone(op->body, src->ops[i].body);
    }
  }
}

/* 1 if the block mentions name anywhere. */
static int block_uses(const fz_block *b, int name) {
  for (size_t i = 0; i < b->n; i++) {
    const fz_op *op = &b->ops[i];
    if (op->name == name || op->carry == name || (op->kind == OP_MAYBE_RELEASE && op->victim == name))
      return 1;
    if (op->kind == OP_RUN) {
      for (int j = 0; j < 2; j++)
        if (op->in[j].kind == SRC_NAME && op->in[j].name == name)
          return 1;
      if (op->pick == name || (op->pick >= 0 && op->alt.kind == SRC_NAME && op->alt.name == name))
        return 1;
    }
    if (op->kind == OP_BRANCH)
      for (uint32_t a = 0; a < op->n_arms; a++)
        if (block_uses(&op->arms[a], name))
          return 1;
    if (op->kind == OP_REPEAT && block_uses(op->body, name))
      return 1;
  }
  return 0;
}

static int env_find(const fz_env *e, int name) {
  for (int i = 0; i < e->n; i++)
    if (e->name[i] == name)
      return i;
  return -1;
}

static void env_add(fz_env *e, int name) {
  if (e->n < FZ_MAX_ENV) {
    e->name[e->n] = name;
    e->pinned[e->n] = 0;
    e->n++;
  }
}

static void env_remove(fz_env *e, int name) {
  int i = env_find(e, name);
  if (i < 0)
    return;
  e->n--;
  e->name[i] = e->name[e->n];
  e->pinned[i] = e->pinned[e->n];
}

/* A random releasable name, or -1. */
static int env_pick_unpinned(fz_gen *g, const fz_env *e) {
  int idx[FZ_MAX_ENV], k = 0;
  for (int i = 0; i < e->n; i++)
    if (!e->pinned[i])
      idx[k++] = i;
  return k ? e->name[idx[fz_below(&g->r, (uint32_t)k)]] : -1;
}

static int env_pick(fz_gen *g, const fz_env *e) { return e->n ? e->name[fz_below(&g->r, (uint32_t)e->n)] : -1; }

static int new_name(fz_gen *g) { return g->p->n_names++; }

static fz_src gen_src(fz_gen *g, const fz_env *e, int force_name) {
  fz_src s = {SRC_NAME, -1, 0};
  uint32_t r = fz_below(&g->r, 100);
  if (e->n && (force_name >= 0 || r < 70)) {
    s.name = force_name >= 0 ? force_name : env_pick(g, e);
    return s;
  }
  uint32_t f = g->w->floats;
  s.floats = fz_percent(&g->r, 70) ? f : 1 + fz_below(&g->r, f);
  s.kind = r < 80 ? SRC_STATIC_FIXED : r < 88 ? SRC_STATIC_CHANGING : SRC_DYNAMIC;
  return s;
}

/* Appends a run; its outputs join the environment. Returns output 0's name. */
static int gen_run(fz_gen *g, fz_block *b, fz_env *e, int first_input) {
  fz_op *op = block_add(b);
  op->kind = OP_RUN;
  op->seg = fz_below(&g->r, g->w->n_segs);
  op->variant = fz_percent(&g->r, 75) ? 0 : 1 + fz_below(&g->r, 2);
  if (e->n && fz_percent(&g->r, 12))
    op->name = env_pick(g, e); /* the variant comes from this value, read back */
  const fz_seg *s = &g->w->segs[op->seg];
  for (uint32_t i = 0; i < s->n_in; i++)
    op->in[i] = gen_src(g, e, i == 0 ? first_input : -1);
  if (e->n && first_input < 0 && fz_percent(&g->r, 15)) {
    op->pick = env_pick(g, e);
    op->alt = gen_src(g, e, -1);
  }
  for (uint32_t o = 0; o < s->n_out; o++) {
    op->out[o] = new_name(g);
    if (e->n < FZ_MAX_ENV)
      env_add(e, op->out[o]);
  }
  return op->out[0];
}

static void gen_block(fz_gen *g, fz_block *b, fz_env *e, int depth, uint32_t len);

/* Makes arm a a twin of arm 0, if that works out: either arm 0 with one more
 * outer value released first (the same runs under the same parents with other
 * values live: a re-record), or arm 0 with its first run reading another
 * input (a sibling of the same segment and variant: the rerecord limit). */
static int gen_twin(fz_gen *g, fz_block *arms, int *arm_out, fz_env *after, const fz_env *e, uint32_t a) {
  if (fz_percent(&g->r, 60)) {
    int victim = env_pick_unpinned(g, e);
    if (victim < 0 || block_uses(&arms[0], victim))
      return 0;
    fz_op *rel = block_add(&arms[a]);
    rel->kind = OP_RELEASE;
    rel->name = victim;
    fz_block copy;
    block_clone(&copy, &arms[0]);
    for (size_t i = 0; i < copy.n; i++)
      *block_add(&arms[a]) = copy.ops[i];
    free(copy.ops);
    arm_out[a] = arm_out[0];
    after[a] = after[0];
    env_remove(&after[a], victim);
    return 1;
  }
  if (arms[0].n == 0 || arms[0].ops[0].kind != OP_RUN)
    return 0;
  block_clone(&arms[a], &arms[0]);
  arms[a].ops[0].in[0] = gen_src(g, e, -1);
  arm_out[a] = arm_out[0];
  after[a] = after[0];
  return 1;
}

static void gen_branch(fz_gen *g, fz_block *b, fz_env *e, int depth) {
  fz_op *op = block_add(b);
  size_t at = b->n - 1; /* b->ops moves as the arms grow other blocks only, but be safe */
  op->kind = OP_BRANCH;
  op->name = env_pick(g, e);
  op->n_arms = 2 + fz_below(&g->r, 2);
  op->host_mix = fz_percent(&g->r, 50);
  fz_block *arms = calloc(op->n_arms, sizeof *arms);
  int *arm_out = malloc(op->n_arms * sizeof *arm_out);
  fz_env *after = malloc(op->n_arms * sizeof *after);
  assert_non_null(arms);
  assert_non_null(arm_out);
  assert_non_null(after);
  uint32_t n_arms = op->n_arms;
  for (uint32_t a = 0; a < n_arms; a++) {
    after[a] = *e;
    if (a > 0 && fz_percent(&g->r, 70) && gen_twin(g, arms, arm_out, after, e, a))
      continue;
    gen_block(g, &arms[a], &after[a], depth + 1, 1 + fz_below(&g->r, 4));
    arm_out[a] = gen_run(g, &arms[a], &after[a], -1);
  }
  /* Arms taken first are recorded first; shuffle so that a twin with fewer
   * live values is often recorded before its original. */
  for (uint32_t a = n_arms - 1; a > 0; a--) {
    uint32_t j = fz_below(&g->r, a + 1);
    fz_block tb = arms[a];
    arms[a] = arms[j], arms[j] = tb;
    int to = arm_out[a];
    arm_out[a] = arm_out[j], arm_out[j] = to;
    fz_env te = after[a];
    after[a] = after[j], after[j] = te;
  }
  op = &b->ops[at];
  op->arms = arms;
  op->arm_out = arm_out;
  /* After the branch: the outer names every arm left live, and the result. */
  fz_env post = {0};
  for (int i = 0; i < e->n; i++) {
    int keep = 1;
    for (uint32_t a = 0; a < n_arms; a++)
      keep &= env_find(&after[a], e->name[i]) >= 0;
    if (keep) {
      post.name[post.n] = e->name[i];
      post.pinned[post.n] = e->pinned[i];
      post.n++;
    }
  }
  op->result = new_name(g);
  env_add(&post, op->result);
  *e = post;
  free(after);
}

static void gen_repeat(fz_gen *g, fz_block *b, fz_env *e, int depth) {
  int carry = env_pick_unpinned(g, e);
  if (carry < 0) {
    gen_run(g, b, e, -1);
    return;
  }
  fz_op *op = block_add(b);
  size_t at = b->n - 1;
  op->kind = OP_REPEAT;
  op->name = env_pick(g, e);
  op->carry = carry;
  op->release_old = fz_percent(&g->r, 60);
  fz_block *body = calloc(1, sizeof *body);
  assert_non_null(body);
  fz_env inner = *e;
  for (int i = 0; i < inner.n; i++)
    inner.pinned[i] = 1;
  gen_block(g, body, &inner, depth + 1, fz_below(&g->r, 3));
  int out = gen_run(g, body, &inner, carry);
  op = &b->ops[at];
  op->body = body;
  op->body_out = out;
}

static void gen_block(fz_gen *g, fz_block *b, fz_env *e, int depth, uint32_t len) {
  for (uint32_t i = 0; i < len; i++) {
    uint32_t r = fz_below(&g->r, 100);
    if (e->n && depth < FZ_MAX_DEPTH && r < 18)
      gen_branch(g, b, e, depth);
    else if (e->n && depth < FZ_MAX_DEPTH && r < 25)
      gen_repeat(g, b, e, depth);
    else if (r < 37 && env_pick_unpinned(g, e) >= 0) {
      fz_op *op = block_add(b);
      op->kind = OP_RELEASE;
      op->name = env_pick_unpinned(g, e);
      env_remove(e, op->name);
    } else if (r < 50 && e->n && env_pick_unpinned(g, e) >= 0) {
      fz_op *op = block_add(b);
      op->kind = OP_MAYBE_RELEASE;
      op->name = env_pick(g, e);
      op->victim = env_pick_unpinned(g, e);
      env_remove(e, op->victim);
    } else if (e->n && r < 54) {
      fz_op *op = block_add(b);
      op->kind = OP_READ;
      op->name = env_pick(g, e);
    } else {
      gen_run(g, b, e, -1);
    }
  }
}

/* Gives every op its own salt, so that host decisions of different ops are
 * independent functions of the step's pattern. */
static void block_salt(fz_block *b, fz_rng *r) {
  for (size_t i = 0; i < b->n; i++) {
    fz_op *op = &b->ops[i];
    op->salt = (uint32_t)fz_next(r);
    if (op->kind == OP_BRANCH)
      for (uint32_t a = 0; a < op->n_arms; a++)
        block_salt(&op->arms[a], r);
    if (op->kind == OP_REPEAT)
      block_salt(op->body, r);
  }
}

/* The kinds of worlds the tests ask for. */
typedef struct fz_config {
  const char *test;
  uint32_t warmup_runs;
  uint32_t rerecord_limit;
  size_t pool_chunk_bytes;
  int big_values;           /* values larger than a small chunk */
  uint32_t min_ops, max_ops; /* top-level operations of a program; 0: 6..20 */
  size_t pool_reserve_bytes;
  uint32_t check_every;      /* cgt_tree_check after every this many runs (0: every run) */
  uint32_t fault_percent;    /* runs that get an injected fault first (fz_run) */
  uint32_t no_capture_percent; /* segments registered with CGT_SEGMENT_NO_CAPTURE */
  size_t pool_limit_bytes;   /* options.pool_limit_bytes */
  uint32_t prune_after_steps; /* options.prune_after_steps (0: default) */
  int zero_options;          /* an all-zero cgt_options: zero means default */
  uint32_t max_graphs;       /* options.max_graphs: a recording budget that evicts */
  size_t max_graph_bytes;    /* options.max_graph_bytes */
  uint32_t static_move_every; /* the fixed STATIC buffer moves to a new address every this many steps (a
                                 reload: update in place), 0: never */
} fz_config;

static void world_make(fz_world *w, uint64_t seed, const fz_config *cfg) {
  memset(w, 0, sizeof *w);
  fz_gen g = {{seed}, w, NULL};
  static const uint32_t small[] = {1, 2, 3, 8, 17, 64, 100, 250};
  static const uint32_t big[] = {700, 1100, 1500, 2400};
  w->floats = cfg->big_values ? big[fz_below(&g.r, 4)] : small[fz_below(&g.r, 8)];
  w->n_patterns = 2 + fz_below(&g.r, 15);
  w->n_segs = 3 + fz_below(&g.r, FZ_MAX_SEGS - 2);
  static const float as[] = {-1.0f, 1.0f, 2.0f, 0.5f};
  for (uint32_t i = 0; i < w->n_segs; i++) {
    fz_seg *s = &w->segs[i];
    /* Clamps, twice as likely as the other kinds, keep values bounded; the
     * careless sync segment is rarer. */
    uint32_t k = fz_below(&g.r, SK_COUNT + 2);
    s->kind = k >= SK_COUNT ? SK_CLAMP : (int)k;
    if (s->kind == SK_SYNC && fz_percent(&g.r, 50))
      s->kind = SK_AFFINE;
    s->a = as[fz_below(&g.r, 4)];
    s->b = (float)((int)fz_below(&g.r, 7) - 3);
    s->off = fz_percent(&g.r, 50) ? 0 : 1 + fz_below(&g.r, 5);
    s->extra_bytes = 4 + fz_below(&g.r, cfg->big_values ? 9000 : 1200);
    s->n_in = s->kind == SK_ADD ? 2 : 1;
    s->n_out = s->kind == SK_SPLIT || s->kind == SK_HALVES ? 2 : 1;
    snprintf(s->name, sizeof s->name, "%s%u", fz_kind_names[s->kind], i + 1);
  }
  w->n_programs = 1 + fz_below(&g.r, FZ_MAX_PROGRAMS);
  for (uint32_t p = 0; p < w->n_programs; p++) {
    g.p = &w->prog[p];
    fz_env e = {0};
    uint32_t lo = cfg->min_ops ? cfg->min_ops : 6, hi = cfg->max_ops ? cfg->max_ops : 20;
    gen_block(&g, &g.p->main, &e, 0, lo + fz_below(&g.r, hi - lo + 1));
    if (e.n == 0)
      gen_run(&g, &g.p->main, &e, -1);
    block_salt(&g.p->main, &g.r);
  }
}

static void world_free(fz_world *w) {
  for (uint32_t p = 0; p < w->n_programs; p++)
    block_free(&w->prog[p].main);
}

/* ------------------------------------------------------------ the runner */

/* DEFER is TREE with defer_launch = 1 (path fusion). EAGER comes last: the
 * modes before it record. */
enum { FZ_TREE, FZ_SEPARATE, FZ_DEFER, FZ_EAGER, FZ_MODES };
static const cgt_mode fz_modes[FZ_MODES] = {CGT_MODE_TREE, CGT_MODE_SEPARATE, CGT_MODE_TREE, CGT_MODE_EAGER};
static const char *const fz_mode_names[FZ_MODES] = {"TREE", "SEPARATE", "TREE+defer", "EAGER"};

typedef struct fz_ctx {
  const fz_config *cfg;
  uint64_t seed;
  fz_world *w;
  cgt_tree *t[FZ_MODES];
  cgt_segment seg_id[FZ_MAX_SEGS];
  fz_seg_user user[FZ_MODES][FZ_MAX_SEGS];
  int fail_next_launch[FZ_MODES];
  uint64_t runs_done;                  /* for check_every */
  uint64_t faults_injected, faults_hit; /* faults set up; runs they made fail */
  cgt_value *map[FZ_MODES]; /* name -> value, per tree */
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
} fz_ctx;

#define FZ_FAIL(c, ...)                                                                                       \
  fail_msg("fuzz %s, seed %llu, step %llu, program %u, op %llu: %s", (c)->cfg->test,                         \
           (unsigned long long)(c)->seed, (unsigned long long)(c)->step, (c)->prog,                          \
           (unsigned long long)(c)->ops_done, fz_msg(__VA_ARGS__))

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

/* Reads v[m] back from every tree m; all must agree on size and bytes.
 * Returns the reference (EAGER) copy's first float. */
static float fz_read_values(fz_ctx *c, const cgt_value *v, const char *why, const char *which, long id) {
  size_t bytes[FZ_MODES];
  for (int m = 0; m < FZ_MODES; m++)
    fz_check_status(c, m, cgt_value_ptr(c->t[m], v[m], NULL, &bytes[m]), "cgt_value_ptr");
  for (int m = 0; m < FZ_MODES; m++)
    if (bytes[m] != bytes[FZ_EAGER])
      FZ_FAIL(c, "%s of %s %ld: %s has %zu bytes, EAGER %zu", why, which, id, fz_mode_names[m], bytes[m],
              bytes[FZ_EAGER]);
  size_t n = bytes[FZ_EAGER] / sizeof(float);
  assert_true(n >= 1 && n <= c->host_floats);
  for (int m = 0; m < FZ_MODES; m++) {
    memset(c->host[m], 0xa5, n * sizeof(float));
    fz_check_status(c, m, cgt_value_copy_out(c->t[m], v[m], c->host[m], n * sizeof(float)), "cgt_value_copy_out");
    fz_check_status(c, m, cgt_sync(c->t[m]), "cgt_sync");
  }
  for (int m = 0; m < FZ_MODES; m++) {
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
  for (int m = 0; m < FZ_MODES; m++)
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
    for (int m = 0; m < FZ_MODES; m++)
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
  for (int m = 0; m < FZ_MODES; m++) {
    fz_check_status(c, m, cgt_value_release(c->t[m], c->map[m][name]), "cgt_value_release");
    c->map[m][name].bits = 0;
  }
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
            fault == FAULT_LAUNCH ? "launch" : fault == FAULT_DEVICE_MEMORY ? "device memory" : "host memory",
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

static void fz_exec_op(fz_ctx *c, const fz_op *op) {
  c->ops_done++;
  switch (op->kind) {
  case OP_RUN: {
    const fz_seg *s = &c->w->segs[op->seg];
    uint64_t variant = op->variant;
    if (op->name >= 0)
      variant = fz_choose(fz_read(c, op->name, "variant read"), 3);
    int use_alt = op->pick >= 0 && (fz_choose(fz_read(c, op->pick, "input pick read"), 2) + fz_host(c, op)) % 2;
    for (int m = 0; m < FZ_MODES; m++) {
      cgt_arg args[2];
      cgt_value outs[2] = {{0}, {0}};
      for (uint32_t i = 0; i < s->n_in; i++)
        args[i] = fz_arg(c, m, i == 0 && use_alt ? &op->alt : &op->in[i]);
      cgt_status st = fz_run(c, m, c->seg_id[op->seg], variant, args, s->n_in, outs, s->n_out);
      if (st != CGT_OK)
        FZ_FAIL(c, "cgt_run of %s (variant %llu) in %s mode returned %s (last error: %s)", s->name,
                (unsigned long long)variant, fz_mode_names[m], cgt_status_name(st),
                cgt_tree_last_error(c->t[m]));
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
    for (int m = 0; m < FZ_MODES; m++)
      c->map[m][op->result] = c->map[m][op->arm_out[arm]];
    break;
  }
  case OP_REPEAT: {
    uint32_t times = fz_choose(fz_read(c, op->name, "loop count read"), 4);
    for (uint32_t i = 0; i < times; i++) {
      fz_exec(c, op->body);
      if (op->release_old)
        fz_release(c, op->carry);
      for (int m = 0; m < FZ_MODES; m++)
        c->map[m][op->carry] = c->map[m][op->body_out];
    }
    break;
  }
  default:
    fail_msg("unknown op %d", op->kind);
  }
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
  cgt_stats s[FZ_MODES];
} fz_totals;

static void fz_add_stats(cgt_stats *a, const cgt_stats *b) {
#define FZ_ADD(f) a->f += b->f;
  CGT_STATS_FIELDS(FZ_ADD, FZ_ADD)
#undef FZ_ADD
}

/* One step of the program the step's number picks, in all four trees. */
static void fz_step(fz_ctx *c, uint64_t step) {
  c->step = step;
  if (c->started)
    for (int m = 0; m < FZ_MODES; m++) {
      fz_check_status(c, m, cgt_step_begin(c->t[m]), "cgt_step_begin");
      fz_check_status(c, m, cgt_tree_check(c->t[m]), "cgt_tree_check after cgt_step_begin");
    }
  c->started = 1;
  fz_fill_inputs(c);
  c->prog = (uint32_t)(fz_hash(c->seed ^ 0x5bd1e995u, step) % c->w->n_programs);
  c->ops_done = 0;
  c->step_values = 0;
  c->n_made = 0;
  for (int m = 0; m < FZ_MODES; m++)
    memset(c->map[m], 0, ((size_t)c->map_cap + 1) * sizeof *c->map[m]);
  const fz_program *p = &c->w->prog[c->prog];
  fz_exec(c, &p->main);
  fz_read_all_live(c);
  if (c->step_values > c->max_step_values)
    c->max_step_values = c->step_values;
  /* The caller buffers are rewritten next step: nothing may still read them. */
  for (int m = 0; m < FZ_MODES; m++)
    fz_check_status(c, m, cgt_sync(c->t[m]), "cgt_sync");
}

static void fz_run_seed(const fz_config *cfg, uint64_t seed, uint64_t steps, fz_totals *tot) {
  fz_world w;
  world_make(&w, seed, cfg);
  fz_ctx c;
  memset(&c, 0, sizeof c);
  c.cfg = cfg;
  c.seed = seed;
  c.w = &w;

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
  if (cfg->zero_options)
    memset(&o, 0, sizeof o); /* test_tree_new sets backend, mode and the log */
  fz_rng flags_rng = {seed ^ 0x6e6f6361ull};
  uint32_t flags[FZ_MAX_SEGS];
  for (uint32_t i = 0; i < w.n_segs; i++)
    flags[i] = fz_percent(&flags_rng, cfg->no_capture_percent) ? CGT_SEGMENT_NO_CAPTURE : 0;
  for (int m = 0; m < FZ_MODES; m++) {
    o.defer_launch = m == FZ_DEFER;
    c.t[m] = test_tree_new(fz_modes[m], &o);
    assert_int_equal(cgt_tree_mode(c.t[m]), fz_modes[m]);
    for (uint32_t i = 0; i < w.n_segs; i++) {
      c.user[m][i] = (fz_seg_user){&w.segs[i], &c.fail_next_launch[m]};
      cgt_segment_desc d = {w.segs[i].name, fz_launch, &c.user[m][i], w.segs[i].n_in, w.segs[i].n_out, flags[i]};
      cgt_segment id = 0;
      CHECK_OK(c.t[m], cgt_segment_register(c.t[m], &d, &id));
      if (m == 0)
        c.seg_id[i] = id;
      assert_int_equal(id, c.seg_id[i]);
    }
  }
  for (uint32_t p = 0; p < w.n_programs; p++)
    if (w.prog[p].n_names > c.map_cap)
      c.map_cap = w.prog[p].n_names;
  for (int m = 0; m < FZ_MODES; m++) {
    c.map[m] = calloc((size_t)c.map_cap + 1, sizeof *c.map[m]);
    assert_non_null(c.map[m]);
  }
  /* Values never outgrow the buffers: views shrink, sums make one float,
   * halves are two outputs of the input's size. */
  c.host_floats = w.floats;
  for (int m = 0; m < FZ_MODES; m++) {
    c.host[m] = malloc(c.host_floats * sizeof(float));
    assert_non_null(c.host[m]);
  }
  c.host_in = malloc(w.floats * sizeof(float));
  assert_non_null(c.host_in);
  for (uint32_t i = 0; i < w.floats; i++)
    c.host_in[i] = (float)((int)(i % 7) - 3);
  c.stat_fixed = test_dev_floats(c.host_in, w.floats);
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
  int settles = !cfg->max_graphs && !cfg->max_graph_bytes && !cfg->static_move_every;
  for (int pass = 0; pass < 3 && steps >= 20 && settles; pass++) {
    for (int m = 0; m < FZ_MODES; m++)
      CHECK_OK(c.t[m], cgt_tree_stats(c.t[m], &before[m]));
    for (uint64_t step = steps - window; step < steps; step++)
      fz_step(&c, step);
    if (pass < 2)
      continue;
    for (int m = 0; m < FZ_EAGER; m++) {
      CHECK_OK(c.t[m], cgt_tree_stats(c.t[m], &after[m]));
      if (after[m].recordings != before[m].recordings || after[m].warmups != before[m].warmups ||
          after[m].nodes + after[m].nodes_pruned != before[m].nodes + before[m].nodes_pruned)
        fail_msg("fuzz %s, seed %llu: %s mode has not settled: a third pass over steps %llu..%llu made %llu "
                 "recordings, %llu warmups and %llu nodes",
                 cfg->test, (unsigned long long)seed, fz_mode_names[m], (unsigned long long)(steps - window),
                 (unsigned long long)(steps - 1), (unsigned long long)(after[m].recordings - before[m].recordings),
                 (unsigned long long)(after[m].warmups - before[m].warmups),
                 (unsigned long long)(after[m].nodes + after[m].nodes_pruned - before[m].nodes -
                                      before[m].nodes_pruned));
    }
  }

  cgt_stats s[FZ_MODES];
  for (int m = 0; m < FZ_MODES; m++) {
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
    for (int m = 0; m < FZ_MODES; m++)
      print_message("fuzz %s seed %llu %s: %llu runs, %llu replays, %llu recordings, %llu re-records, %llu warmups, "
                    "%llu eager runs, %llu restores, %llu nodes (%llu EAGER in TREE mode), pool peak %zu\n",
                    cfg->test, (unsigned long long)seed, fz_mode_names[m], (unsigned long long)s[m].runs,
                    (unsigned long long)s[m].replays, (unsigned long long)s[m].recordings,
                    (unsigned long long)s[m].rerecords, (unsigned long long)s[m].warmups,
                    (unsigned long long)s[m].eager_runs, (unsigned long long)s[m].checkpoint_restores,
                    (unsigned long long)s[m].nodes, (unsigned long long)eager_nodes, s[m].pool_peak_bytes);

  for (int m = 0; m < FZ_MODES; m++) {
    test_tree_free(c.t[m]);
    free(c.map[m]);
    free(c.host[m]);
  }
  test_dev_free(c.stat_fixed);
  test_dev_free(c.stat_changing);
  test_dev_free(c.dyn[0]);
  test_dev_free(c.dyn[1]);
  free(c.host_in);
  world_free(&w);
}

/* The total step budget: CGT_FUZZ_STEPS, else 50,000 on the simulator and
 * 2,000 on a GPU (where every read-back is a real synchronisation). */
static uint64_t fz_total_steps(void) {
  const char *e = getenv("CGT_FUZZ_STEPS");
  if (e && *e)
    return strtoull(e, NULL, 10);
  return test_backend == CGT_BACKEND_CUDA ? 2000 : 50000;
}

/* Runs n_seeds seeds from first_seed with share/100 of the total budget. */
static void fz_run_test(const fz_config *cfg, uint64_t first_seed, uint32_t n_seeds, uint32_t share) {
  /* CGT_MODE would put all four trees in one mode: nothing to compare. */
  const char *forced = getenv("CGT_MODE");
  if (forced && *forced)
    skip();
  /* CGT_FUZZ_BUDGET=n puts every test's trees under a recording budget of n
   * graphs (test/soak.sh evict): evictions everywhere, same bytes. */
  fz_config budgeted = *cfg;
  int must_evict = cfg->max_graphs != 0; /* a budget of the test's own, not the soak's */
  const char *budget = getenv("CGT_FUZZ_BUDGET");
  if (budget && *budget && !cfg->max_graphs && !cfg->max_graph_bytes) {
    budgeted.max_graphs = (uint32_t)strtoul(budget, NULL, 10);
    cfg = &budgeted;
  }
  uint64_t steps = fz_total_steps() * share / 100;
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
  print_message("fuzz %s: %.1f s, %llu steps (up to %llu values each), %llu runs per mode, %llu read-backs; TREE %llu "
                "replays, %llu recordings, %llu re-records, %llu restores, %llu nodes (%llu EAGER, %llu WARMUP, %llu "
                "pruned); %llu faults injected, %llu made a run fail; TREE+defer %llu fused launches of %llu runs, the same "
                "tree in %llu seeds\n",
                cfg->test, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
                (unsigned long long)tot.steps, (unsigned long long)tot.max_step_values,
                (unsigned long long)tot.runs,
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
    assert_true(tot.s[FZ_DEFER].fused_launches > 0);
    if (must_evict)
      assert_true(tot.s[FZ_TREE].evictions > 0 && tot.s[FZ_DEFER].evictions > 0);
  }
}

/* ------------------------------------------------------------------ tests */

/* Options mixed by seed: every warmup count, default limits, 64 KiB chunks. */
static void test_random_programs_give_identical_outputs_in_tree_separate_and_eager_modes(void **state) {
  (void)state;
  for (uint32_t warmup = 0; warmup < 3; warmup++) {
    fz_config cfg = {.test = "mixed", .warmup_runs = warmup, .rerecord_limit = 32, .pool_chunk_bytes = 64 << 10};
    char name[32];
    snprintf(name, sizeof name, "mixed/warmup%u", warmup);
    cfg.test = name;
    fz_run_test(&cfg, 1000 + 100 * warmup, 8, 12);
  }
}

/* 4 KiB chunks and values of up to 10 KiB: chunks grow during warmup and
 * recording, and oversize requests get chunks of their own. */
static void test_random_programs_with_tiny_pool_chunks_give_identical_outputs(void **state) {
  (void)state;
  fz_config cfg = {.test = "tiny-chunks", .warmup_runs = 1, .rerecord_limit = 32, .pool_chunk_bytes = 4 << 10, .big_values = 1};
  fz_run_test(&cfg, 2000, 10, 21);
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
    fz_run_test(&cfg, 3000 + 100 * limit, 4, 6);
  }
}

/* The default options of cgt_options_init (2 MiB chunks, warmup 1). */
static void test_random_programs_with_default_options_give_identical_outputs(void **state) {
  (void)state;
  fz_config cfg = {.test = "defaults", .warmup_runs = 1, .rerecord_limit = 32};
  fz_run_test(&cfg, 4000, 4, 5);
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
  fz_run_test(&cfg, 5000, 4, 5);
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
  fz_run_test(&cfg, 6000, 4, 1);
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
    fz_run_test(&cfg, 7000 + 100 * variant, 5, 4);
  }
}

/* The newer options: all-zero options (zero means default), segments
 * declared uncapturable, a pool limit no program reaches, and WARMUP nodes
 * pruned after 4 steps, so pruned nodes are made again. */
static void test_random_programs_with_newer_options_give_identical_outputs(void **state) {
  (void)state;
  fz_config zero = {.test = "zero-options", .zero_options = 1};
  fz_run_test(&zero, 8000, 4, 2);
  fz_config flags = {.test = "no-capture+limit",
                     .warmup_runs = 1,
                     .rerecord_limit = 3,
                     .pool_chunk_bytes = 16 << 10,
                     .no_capture_percent = 25,
                     .pool_limit_bytes = (size_t)256 << 20};
  fz_run_test(&flags, 8100, 4, 2);
  fz_config prune = {.test = "prune4",
                     .warmup_runs = 2,
                     .rerecord_limit = 32,
                     .pool_chunk_bytes = 16 << 10,
                     .prune_after_steps = 4,
                     .fault_percent = 2};
  fz_run_test(&prune, 8200, 4, 2);
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
    fz_run_test(&cfgs[i], 9000 + 100 * i, 3, cfgs[i].static_move_every == 9 ? 1 : 3);
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
