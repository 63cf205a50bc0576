/* workloads.c — the chain and branchy programs of workloads.h.
 *
 * A workload is a handful of segments, each described by a seg_spec: which
 * weights it reads, how many layers it runs, and what it adds around them
 * (branchy's segment 1 also sums its first pre-activation; segments 3 and 4
 * end with an affine map, so that the two branches and the tail differ in
 * more than their weights). One function, seg_body, enqueues a segment's
 * kernels. The launch function calls it with pool memory (cgt_launch_alloc,
 * cgt_launch_free); wl_raw_enqueue calls it with a caller's scratch buffer,
 * so that a benchmark can capture exactly the same kernels without a tree.
 *
 * The argument arrays of every run are built once at creation, weights
 * included; a step only fills in the argument that changes (the step input
 * or the previous segment's value). That keeps the workload's own host cost
 * to a few stores per run, so what a benchmark sees between two cgt_runs is
 * the runtime's cost, not ours.
 *
 * Weights and inputs come from splitmix64 seeded per tensor, so a tensor
 * does not depend on how many others were drawn before it: the fused chain
 * and the chain of the same S, L and seed read identical weights.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workloads.h"

static _Thread_local char wl_error[256];

const char *wl_last_error(void) { return wl_error; }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static cgt_status wl_fail(cgt_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(wl_error, sizeof wl_error, fmt, ap);
  va_end(ap);
  return s;
}

/* ------------------------------------------------------------- the model */

enum { BRANCHY_SEGMENTS = 4 };

typedef struct seg_spec {
  workload *w;
  int index;        /* 0-based position among the workload's segments */
  cgt_segment id;   /* as registered */
  int first_weight; /* into w->weights */
  int n_layers;
  int sum_first; /* second output: sum of the first layer's pre-activation */
  int post;      /* end with out = post_a * out + post_b */
  float post_a, post_b;
  uint32_t n_args; /* 1 + n_layers: the input, then the weights (STATIC) */
  const void *input_seen; /* input 0 as the launch function last saw it */
  cgt_arg *args;   /* prebuilt; args[0] is set per step */
} seg_spec;

struct workload {
  cgt_tree *tree;
  const kernels *k;
  kern_ctx *ctx;
  wl_params p;
  size_t x_floats, x_bytes, w_bytes;
  int n_weights;
  float **weights;
  void *input[2];
  int n_specs;
  seg_spec *specs;
  cgt_value out;
  int have_out;
  float sum_host;
  void *sum_dev;
  int branch;
  wl_run_hook hook;
  void *hook_user;
};

void wl_params_default(wl_params *p, wl_kind kind) {
  if (!p)
    return;
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->segments = kind == WL_CHAIN ? 4 : BRANCHY_SEGMENTS;
  p->layers = 1;
  p->batch = 8;
  p->hidden = 256;
  p->fused = 0;
}

const char *wl_describe(const wl_params *p, char *buf, size_t n) {
  if (!buf || n == 0)
    return buf;
  if (!p) {
    snprintf(buf, n, "?");
    return buf;
  }
  int len;
  if (p->kind == WL_CHAIN)
    len = snprintf(buf, n, "chain S=%d L=%d%s", p->segments, p->layers, p->fused ? " fused" : "");
  else
    len = snprintf(buf, n, "branchy L=%d", p->layers);
  if (len >= 0 && (size_t)len < n && (p->batch != 8 || p->hidden != 256))
    snprintf(buf + len, n - (size_t)len, " B=%d H=%d", p->batch, p->hidden);
  return buf;
}

static cgt_status check_params(const wl_params *p) {
  if (p->kind != WL_CHAIN && p->kind != WL_BRANCHY)
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "unknown workload kind %d", (int)p->kind);
  if (p->layers < 1 || p->layers > 1024)
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "layers must be in 1..1024, not %d", p->layers);
  if (p->batch < 1 || p->batch > 65536 || p->hidden < 1 || p->hidden > 65536 ||
      (size_t)p->batch * (size_t)p->hidden > ((size_t)1 << 28) || (size_t)p->hidden * (size_t)p->hidden > ((size_t)1 << 28))
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "batch %d x hidden %d is out of range", p->batch, p->hidden);
  if (p->kind == WL_CHAIN) {
    if (p->segments < 1 || p->segments > 4096)
      return wl_fail(CGT_ERR_INVALID_ARGUMENT, "segments must be in 1..4096, not %d", p->segments);
    if ((long)p->segments * p->layers > 65536)
      return wl_fail(CGT_ERR_INVALID_ARGUMENT, "segments x layers must be at most 65536");
  } else if (p->fused) {
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "only a chain can be fused");
  }
  return CGT_OK;
}

/* --------------------------------------------------- deterministic data */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* n floats uniform in [-scale, scale), from the stream of (seed, tensor). */
static void fill_uniform(float *dst, size_t n, uint64_t seed, uint64_t tensor, float scale) {
  uint64_t s = seed ^ (tensor + 1) * 0xd1b54a32d192ed03ull;
  (void)splitmix64(&s);
  for (size_t i = 0; i < n; i++) {
    double u = (double)(splitmix64(&s) >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
    dst[i] = (float)((2.0 * u - 1.0) * scale);
  }
}

/* Keeps the common library free of libm. */
static double sqrt_newton(double v) {
  double r = v > 1.0 ? v : 1.0;
  for (int i = 0; i < 64; i++)
    r = 0.5 * (r + v / r);
  return r;
}

enum { TENSOR_INPUT0 = 1u << 30, TENSOR_INPUT1 };

/* -------------------------------------------------------- segment bodies */

/* Where a segment's temporaries come from: the pool inside a launch, or a
 * caller's scratch buffer (bump allocation, nothing reused) outside. */
typedef struct mem {
  cgt_launch *l;
  char *base;
  size_t used, cap;
} mem;

static size_t round256(size_t n) { return (n + 255) / 256 * 256; }

static cgt_status mem_alloc(mem *m, size_t bytes, void **p) {
  if (m->l)
    return cgt_launch_alloc(m->l, bytes, p);
  size_t r = round256(bytes);
  if (m->cap - m->used < r)
    return wl_fail(CGT_ERR_OUT_OF_MEMORY, "scratch of %zu bytes is too small", m->cap);
  *p = m->base + m->used;
  m->used += r;
  return CGT_OK;
}

static cgt_status mem_free(mem *m, void *p) { return m->l ? cgt_launch_free(m->l, p) : CGT_OK; }

static const float *weight_of(const seg_spec *sp, cgt_launch *l, int j) {
  if (l)
    return cgt_launch_input(l, (uint32_t)j + 1);
  return sp->w->weights[sp->first_weight + j];
}

static cgt_status kern(const kernels *k, cgt_status s, const char *what) {
  if (s == CGT_OK)
    return CGT_OK;
  return wl_fail(s, "%s: %s", what, k->last_error());
}

/* Enqueues the segment: n_layers of relu(x @ W) with a workspace for the
 * gemms, each layer's input freed once the next is computed. */
static cgt_status seg_body(const seg_spec *sp, mem *m, kern_ctx *ctx, void *stream, const float *x, float **out,
                           float **sum) {
  const workload *w = sp->w;
  const kernels *k = w->k;
  const int b = w->p.batch, h = w->p.hidden;
  void *ws = NULL;
  cgt_status st = mem_alloc(m, WL_WORKSPACE_BYTES, &ws);
  if (st != CGT_OK)
    return st;
  const float *cur = x;
  float *own = NULL;
  for (int j = 0; j < sp->n_layers; j++) {
    float *o;
    if ((st = mem_alloc(m, w->x_bytes, (void **)&o)) != CGT_OK)
      return st;
    const float *wt = weight_of(sp, m->l, j);
    if ((st = kern(k, k->gemm(ctx, stream, cur, wt, o, b, h, h, ws, WL_WORKSPACE_BYTES), "gemm")) != CGT_OK)
      return st;
    if (j == 0 && sp->sum_first) {
      if ((st = mem_alloc(m, sizeof(float), (void **)sum)) != CGT_OK)
        return st;
      if ((st = kern(k, k->sum(stream, o, w->x_floats, *sum), "sum")) != CGT_OK)
        return st;
    }
    if ((st = kern(k, k->relu(stream, o, o, w->x_floats), "relu")) != CGT_OK)
      return st;
    if (own && (st = mem_free(m, own)) != CGT_OK)
      return st;
    own = o;
    cur = o;
  }
  if (sp->post && (st = kern(k, k->affine(stream, own, sp->post_a, sp->post_b, own, w->x_floats), "affine")) != CGT_OK)
    return st;
  if ((st = mem_free(m, ws)) != CGT_OK)
    return st;
  *out = own;
  return CGT_OK;
}

static cgt_status launch_segment(cgt_launch *l, void *user) {
  seg_spec *sp = user;
  const workload *w = sp->w;
  const float *x = cgt_launch_input(l, 0);
  sp->input_seen = x;
  if (!x || cgt_launch_input_bytes(l, 0) < w->x_bytes)
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "segment %d: input 0 is missing or too small", sp->index);
  mem m = {l, NULL, 0, 0};
  float *out = NULL, *sum = NULL;
  cgt_status st = seg_body(sp, &m, w->ctx, cgt_launch_stream(l), x, &out, &sum);
  if (st == CGT_OK)
    st = cgt_launch_set_output(l, 0, out, w->x_bytes);
  if (st == CGT_OK && sp->sum_first)
    st = cgt_launch_set_output(l, 1, sum, sizeof(float));
  return st;
}

size_t wl_raw_scratch_bytes(const workload *w, int segment_index) {
  if (!w || segment_index < 0 || segment_index >= w->n_specs)
    return 0;
  const seg_spec *sp = &w->specs[segment_index];
  return WL_WORKSPACE_BYTES + (size_t)sp->n_layers * round256(w->x_bytes) + (sp->sum_first ? 256 : 0);
}

cgt_status wl_raw_enqueue(workload *w, int segment_index, void *stream, kern_ctx *ctx, const void *input,
                          void *scratch, size_t scratch_bytes) {
  if (!w || segment_index < 0 || segment_index >= w->n_specs || !input || !scratch)
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "wl_raw_enqueue: bad arguments");
  mem m = {NULL, scratch, 0, scratch_bytes};
  float *out = NULL, *sum = NULL;
  return seg_body(&w->specs[segment_index], &m, ctx, stream, input, &out, &sum);
}

/* ------------------------------------------------------ create / destroy */

static cgt_status make_specs(workload *w) {
  const wl_params *p = &w->p;
  if (p->kind == WL_CHAIN) {
    w->n_specs = p->fused ? 1 : p->segments;
    w->n_weights = p->segments * p->layers;
  } else {
    w->n_specs = BRANCHY_SEGMENTS;
    w->n_weights = BRANCHY_SEGMENTS * p->layers;
  }
  w->specs = calloc((size_t)w->n_specs, sizeof *w->specs);
  if (!w->specs)
    return wl_fail(CGT_ERR_OUT_OF_MEMORY, "no host memory for %d segments", w->n_specs);
  for (int i = 0; i < w->n_specs; i++) {
    seg_spec *sp = &w->specs[i];
    sp->w = w;
    sp->index = i;
    sp->n_layers = p->kind == WL_CHAIN && p->fused ? p->segments * p->layers : p->layers;
    sp->first_weight = i * p->layers;
    if (p->kind == WL_BRANCHY) {
      sp->sum_first = i == 0;
      if (i == 2)
        sp->post = 1, sp->post_a = -0.5f, sp->post_b = 1.0f;
      if (i == 3)
        sp->post = 1, sp->post_a = 2.0f, sp->post_b = 1.0f;
    }
    sp->n_args = 1 + (uint32_t)sp->n_layers;
    sp->args = calloc(sp->n_args, sizeof *sp->args);
    if (!sp->args)
      return wl_fail(CGT_ERR_OUT_OF_MEMORY, "no host memory for arguments");
  }
  return CGT_OK;
}

static cgt_status make_buffers(workload *w, uint64_t seed) {
  const kernels *k = w->k;
  const wl_params *p = &w->p;
  w->weights = calloc((size_t)w->n_weights, sizeof *w->weights);
  size_t host_floats = w->x_floats > (size_t)p->hidden * (size_t)p->hidden ? w->x_floats : (size_t)p->hidden * (size_t)p->hidden;
  float *host = malloc(host_floats * sizeof *host);
  cgt_status st = CGT_OK;
  if (!w->weights || !host)
    st = wl_fail(CGT_ERR_OUT_OF_MEMORY, "no host memory for %d weights", w->n_weights);
  /* He-uniform: E[relu(x @ W)^2] = E[x^2] when Var(W) = 2/H. */
  float scale = (float)sqrt_newton(6.0 / (double)p->hidden);
  uint64_t salt = p->kind == WL_CHAIN ? 0 : 0x5eed0000ull;
  for (int i = 0; i < w->n_weights && st == CGT_OK; i++) {
    fill_uniform(host, (size_t)p->hidden * (size_t)p->hidden, seed ^ salt, (uint64_t)i, scale);
    st = kern(k, k->dev_alloc(w->w_bytes, (void **)&w->weights[i]), "dev_alloc");
    if (st == CGT_OK)
      st = kern(k, k->upload(w->weights[i], host, w->w_bytes), "upload");
  }
  for (int parity = 0; parity < 2 && st == CGT_OK; parity++) {
    if (p->kind == WL_BRANCHY && parity == 1) {
      for (size_t i = 0; i < w->x_floats; i++) /* host still holds input 0 */
        host[i] = -host[i];
    } else {
      fill_uniform(host, w->x_floats, seed ^ salt, parity ? TENSOR_INPUT1 : TENSOR_INPUT0, 1.0f);
    }
    st = kern(k, k->dev_alloc(w->x_bytes, &w->input[parity]), "dev_alloc");
    if (st == CGT_OK)
      st = kern(k, k->upload(w->input[parity], host, w->x_bytes), "upload");
  }
  free(host);
  return st;
}

static cgt_status register_segments(workload *w) {
  for (int i = 0; i < w->n_specs; i++) {
    seg_spec *sp = &w->specs[i];
    char name[64];
    if (w->p.kind == WL_BRANCHY)
      snprintf(name, sizeof name, "branchy.%d", i + 1);
    else if (w->p.fused)
      snprintf(name, sizeof name, "chain.fused");
    else
      snprintf(name, sizeof name, "chain.%d", i);
    cgt_segment_desc d = {name, launch_segment, sp, sp->n_args, sp->sum_first ? 2u : 1u, 0};
    cgt_status st = cgt_segment_register(w->tree, &d, &sp->id);
    if (st != CGT_OK)
      return wl_fail(st, "registering %s: %s", name, cgt_tree_last_error(w->tree));
    for (int j = 0; j < sp->n_layers; j++)
      sp->args[1 + j] = cgt_arg_static(w->weights[sp->first_weight + j], w->w_bytes);
  }
  return CGT_OK;
}

cgt_status wl_create(cgt_tree *t, const wl_params *p, uint64_t seed, workload **out) {
  if (!t || !p || !out)
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "wl_create: tree, params and out are required");
  *out = NULL;
  cgt_status st = check_params(p);
  if (st != CGT_OK)
    return st;
  const kernels *k = kernels_for(cgt_tree_backend(t));
  if (!k)
    return wl_fail(CGT_ERR_NO_DEVICE, "the kernels for the tree's backend were not built");
  workload *w = calloc(1, sizeof *w);
  if (!w)
    return wl_fail(CGT_ERR_OUT_OF_MEMORY, "no host memory for a workload");
  w->tree = t;
  w->k = k;
  w->p = *p;
  if (p->kind == WL_BRANCHY)
    w->p.segments = BRANCHY_SEGMENTS, w->p.fused = 0;
  w->x_floats = (size_t)p->batch * (size_t)p->hidden;
  w->x_bytes = w->x_floats * sizeof(float);
  w->w_bytes = (size_t)p->hidden * (size_t)p->hidden * sizeof(float);
  st = make_specs(w);
  if (st == CGT_OK)
    st = make_buffers(w, seed);
  if (st == CGT_OK)
    st = kern(k, k->ctx_create(cgt_tree_stream(t), &w->ctx), "ctx_create");
  if (st == CGT_OK)
    st = register_segments(w);
  if (st != CGT_OK) {
    wl_destroy(w);
    return st;
  }
  *out = w;
  return CGT_OK;
}

void wl_destroy(workload *w) {
  if (!w)
    return;
  if (w->tree)
    (void)cgt_sync(w->tree);
  if (w->ctx)
    w->k->ctx_destroy(w->ctx);
  for (int i = 0; w->weights && i < w->n_weights; i++)
    w->k->dev_free(w->weights[i]);
  w->k->dev_free(w->input[0]);
  w->k->dev_free(w->input[1]);
  for (int i = 0; w->specs && i < w->n_specs; i++)
    free(w->specs[i].args);
  free(w->specs);
  free(w->weights);
  free(w);
}

/* ------------------------------------------------------------------ steps */

static cgt_status run(workload *w, int pos, seg_spec *sp, cgt_value *outs, uint32_t n_outs) {
  if (w->hook)
    w->hook(w->hook_user, pos, sp->index, 0);
  cgt_status st = cgt_run(w->tree, sp->id, 0, sp->args, sp->n_args, outs, n_outs);
  if (w->hook)
    w->hook(w->hook_user, pos, sp->index, 1);
  if (st != CGT_OK)
    return wl_fail(st, "cgt_run of segment %d: %s", sp->index, cgt_tree_last_error(w->tree));
  return CGT_OK;
}

static cgt_status release(workload *w, cgt_value v) {
  cgt_status st = cgt_value_release(w->tree, v);
  return st == CGT_OK ? st : wl_fail(st, "cgt_value_release: %s", cgt_tree_last_error(w->tree));
}

static cgt_status step_chain(workload *w, const void *x) {
  cgt_value prev = {0};
  cgt_status st = CGT_OK;
  for (int i = 0; i < w->n_specs && st == CGT_OK; i++) {
    seg_spec *sp = &w->specs[i];
    sp->args[0] = i == 0 ? cgt_arg_dynamic(x, w->x_bytes) : cgt_arg_value(prev);
    cgt_value o;
    st = run(w, i, sp, &o, 1);
    if (st == CGT_OK && i > 0)
      st = release(w, prev);
    prev = o;
  }
  if (st == CGT_OK) {
    w->out = prev;
    w->have_out = 1;
  }
  return st;
}

static cgt_status step_branchy(workload *w, const void *x) {
  seg_spec *s = w->specs;
  cgt_value ys[2], z, out;
  s[0].args[0] = cgt_arg_dynamic(x, w->x_bytes);
  cgt_status st = run(w, 0, &s[0], ys, 2);
  if (st != CGT_OK)
    return st;
  size_t bytes;
  if ((st = cgt_value_ptr(w->tree, ys[1], &w->sum_dev, &bytes)) != CGT_OK ||
      (st = cgt_value_copy_out(w->tree, ys[1], &w->sum_host, sizeof w->sum_host)) != CGT_OK ||
      (st = cgt_sync(w->tree)) != CGT_OK)
    return wl_fail(st, "reading the branch sum back: %s", cgt_tree_last_error(w->tree));
  if ((st = release(w, ys[1])) != CGT_OK)
    return st;
  /* The host-side if of the program: a graph break a tree cannot see past. */
  w->branch = w->sum_host > 0.0f ? 2 : 3;
  seg_spec *mid = &s[w->branch - 1];
  mid->args[0] = cgt_arg_value(ys[0]);
  if ((st = run(w, 1, mid, &z, 1)) != CGT_OK || (st = release(w, ys[0])) != CGT_OK)
    return st;
  s[3].args[0] = cgt_arg_value(z);
  if ((st = run(w, 2, &s[3], &out, 1)) != CGT_OK || (st = release(w, z)) != CGT_OK)
    return st;
  w->out = out;
  w->have_out = 1;
  return CGT_OK;
}

cgt_status wl_step(workload *w, int step) {
  if (!w)
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "wl_step: NULL workload");
  w->have_out = 0;
  cgt_status st = cgt_step_begin(w->tree);
  if (st != CGT_OK)
    return wl_fail(st, "cgt_step_begin: %s", cgt_tree_last_error(w->tree));
  const void *x = w->input[(unsigned)step & 1u];
  return w->p.kind == WL_CHAIN ? step_chain(w, x) : step_branchy(w, x);
}

cgt_status wl_output(workload *w, float *host, size_t n_floats) {
  if (!w || (!host && n_floats))
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "wl_output: bad arguments");
  if (!w->have_out)
    return wl_fail(CGT_ERR_STATE, "wl_output: no completed step");
  if (n_floats > w->x_floats)
    return wl_fail(CGT_ERR_INVALID_ARGUMENT, "wl_output: %zu floats asked, the output has %zu", n_floats, w->x_floats);
  if (n_floats == 0)
    return CGT_OK;
  cgt_status st = cgt_value_copy_out(w->tree, w->out, host, n_floats * sizeof *host);
  if (st == CGT_OK)
    st = cgt_sync(w->tree);
  return st == CGT_OK ? st : wl_fail(st, "wl_output: %s", cgt_tree_last_error(w->tree));
}

size_t wl_output_floats(const workload *w) { return w ? w->x_floats : 0; }

int wl_segments_per_step(const workload *w) {
  if (!w)
    return 0;
  return w->p.kind == WL_CHAIN ? w->n_specs : 3;
}

/* ----------------------------------------------------------- inspection */

const wl_params *wl_get_params(const workload *w) { return w ? &w->p : NULL; }
const kernels *wl_kernels(const workload *w) { return w ? w->k : NULL; }
int wl_segment_count(const workload *w) { return w ? w->n_specs : 0; }
cgt_tree *wl_tree(const workload *w) { return w ? w->tree : NULL; }
const void *wl_input(const workload *w, int parity) { return w ? w->input[(unsigned)parity & 1u] : NULL; }

const void *wl_segment_input_seen(const workload *w, int segment_index) {
  if (!w || segment_index < 0 || segment_index >= w->n_specs)
    return NULL;
  return w->specs[segment_index].input_seen;
}
float wl_branch_sum(const workload *w) { return w ? w->sum_host : 0.0f; }
const void *wl_branch_sum_device(const workload *w) { return w ? w->sum_dev : NULL; }
int wl_branch_taken(const workload *w) { return w ? w->branch : 0; }

void wl_set_run_hook(workload *w, wl_run_hook hook, void *user) {
  if (!w)
    return;
  w->hook = hook;
  w->hook_user = user;
}
