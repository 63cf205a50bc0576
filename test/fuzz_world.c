/* fuzz_world.c — the differential fuzz's worlds: random segments, and
 * random programs over them, made from a seed. fuzz_engine.c runs them.
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
 * between two inputs can come from values read back too. Every operation
 * gets a salt, so that the host decisions the runner mixes in vary on their
 * own.
 *
 * The same segment reached under the same parent with other values live is
 * what makes the tree re-record, and with other inputs is what the rerecord
 * limit counts; twin arms (a copy of another arm with one more release, or
 * with another first input), the maybe-release and the input choice make
 * both happen often.
 *
 * Values stay small: the constants are small integers or 0.5 and a clamp
 * segment pulls values back into [-8, 8], so branches keep taking every arm.
 * Exactness does not matter for the comparison (each mode runs the same
 * kernels on the same data in the same order) but keeps programs lively.
 *
 * fuzz_options.c asks for two more things, each drawing no random number
 * unless asked for, so that fuzz.c's seeds make the worlds they always made:
 * random segments, which add a random generator's state that their
 * prelaunch function writes before each graph launch (and their launch
 * function in an eager run), and flaky segments, whose capture fails at
 * every third step only.
 */
#include "fuzz_world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgtree_sim.h"
#include "test_util.h"

/* ------------------------------------------------------------------ PRNG */

/* splitmix64: tiny, deterministic on every platform. */
uint64_t fz_next(fz_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t fz_below(fz_rng *r, uint32_t n) { return n ? (uint32_t)(fz_next(r) % n) : 0; }
int fz_percent(fz_rng *r, uint32_t p) { return fz_below(r, 100) < p; }

uint64_t fz_hash(uint64_t a, uint64_t b) {
  fz_rng r = {a * 0x2545f4914f6cdd1dull ^ b};
  fz_next(&r);
  return fz_next(&r);
}

/* -------------------------------------------------------------- segments */

static const char *const fz_kind_names[SK_COUNT] = {"affine", "add",    "view", "temp", "clamp",
                                                    "split",  "halves", "sum",  "sync", "random"};

static void fz_probe_kernel(void *args) { **(int **)args = 1; }

/* 1 if the stream is capturing: on the simulator a launch runs at once unless
 * it is recorded (a recorded probe writes the flag again at every replay,
 * harmlessly: the flag outlives the tree). */
static int fz_capturing(void *stream, fz_random_state *r) {
  int *flag = &r->probe_ran;
  r->probe_ran = 0;
  (void)cgt_sim_launch(stream, fz_probe_kernel, &flag, sizeof flag);
  return !r->probe_ran;
}

static float fz_random_value(uint64_t ctr) { return (float)((int)(ctr % 17) - 8); }

static size_t fz_in_floats(cgt_launch *l, uint32_t i) { return cgt_launch_input_bytes(l, i) / sizeof(float); }

/* Every launch function returns the first failure; the fuzz expects none. */
#define FZ_TRY(expr)         \
  do {                       \
    cgt_status st_ = (expr); \
    if (st_ != CGT_OK)       \
      return st_;            \
  } while (0)

cgt_status fz_prelaunch(void *user, void *stream, uint64_t variant) {
  (void)variant;
  const fz_seg_user *u = user;
  u->random->prelaunch_calls++;
  cgt_status st = test_kernels()->fill(stream, u->random->state, fz_random_value(u->random->ctr), FZ_RANDOM_FLOATS);
  if (st == CGT_OK)
    u->random->ctr++;
  return st;
}

cgt_status fz_launch(cgt_launch *l, void *user) {
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
  if (s->flaky && *u->step % 3 == 0)
    (void)k->illegal_stream_sync(stream); /* a capture at such a step fails; the verdict is ignored */
  switch (s->kind) {
  case SK_RANDOM:
    if (n > FZ_RANDOM_FLOATS)
      n = FZ_RANDOM_FLOATS;
    /* The allocation first: an injected fault fails it (fz_run runs the
     * segment again), and a run that fails cannot take back a draw the
     * launch function already made (api.md, Conventions). */
    FZ_TRY(cgt_launch_alloc(l, n * sizeof(float), &p));
    if (u->random->active[u->index] && !fz_capturing(stream, u->random)) {
      FZ_TRY(k->fill(stream, u->random->state, fz_random_value(u->random->ctr), FZ_RANDOM_FLOATS));
      u->random->ctr++;
    }
    FZ_TRY(k->add(stream, x, u->random->state, p, n));
    return cgt_launch_set_output(l, 0, p, n * sizeof(float));
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

#define FZ_MAX_ENV 20
#define FZ_MAX_DEPTH 3

/* The names a program may use at a point, as the generator sees them.
 * Pinned names belong to an enclosing loop body's outer scope: the body may
 * read but not release them. */
typedef struct fz_env {
  int n;
  int name[FZ_MAX_ENV];
  uint8_t pinned[FZ_MAX_ENV];
} fz_env;

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

void fz_world_make(fz_world *w, uint64_t seed, const fz_config *cfg) {
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
     * careless sync segment is rarer. Random segments are drawn only where
     * asked for, and then the first segment is one. */
    uint32_t kinds = cfg->random_segments ? SK_COUNT : SK_RANDOM;
    uint32_t k = fz_below(&g.r, kinds + 2);
    s->kind = k >= kinds ? SK_CLAMP : (int)k;
    if (s->kind == SK_SYNC && fz_percent(&g.r, 50))
      s->kind = SK_AFFINE;
    if (cfg->random_segments && i == 0)
      s->kind = SK_RANDOM;
    s->flaky = cfg->flaky_percent && fz_percent(&g.r, cfg->flaky_percent);
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

void fz_world_free(fz_world *w) {
  for (uint32_t p = 0; p < w->n_programs; p++)
    block_free(&w->prog[p].main);
}
