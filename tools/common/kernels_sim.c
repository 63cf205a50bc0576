/* kernels_sim.c — the kernels of kernels.h on the simulator backend.
 *
 * A simulated kernel is a C function plus a small struct of arguments.
 * cgt_sim_launch() runs it at once, or, while the stream is capturing,
 * records it with a copy of the struct and runs that copy on every replay.
 * So every argument travels by value inside the struct: the pointers and
 * sizes the kernel will use, never a pointer to the caller's stack.
 *
 * Simulated device memory is host memory, which lets the caller-owned
 * buffer helpers be aligned_alloc and memcpy. The arithmetic is written in
 * the plainest order (sequential sums, a naive triple loop for gemm) so that
 * a run is bit-reproducible; it is not meant to match the CUDA flavour bit
 * for bit, only itself.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgtree_sim.h"
#include "kernels.h"

static _Thread_local char sim_error[256];

static cgt_status sim_fail(cgt_status s, const char *what) {
  snprintf(sim_error, sizeof sim_error, "%s: %s", what, cgt_status_name(s));
  return s;
}

static const char *sim_last_error(void) { return sim_error; }

static cgt_status launch(void *stream, cgt_sim_kernel k, const void *args, size_t bytes, const char *what) {
  cgt_status s = cgt_sim_launch(stream, k, args, bytes);
  return s == CGT_OK ? CGT_OK : sim_fail(s, what);
}

/* ------------------------------------------------------------- context */

/* The simulator needs no per-stream state; every context is this marker, so
 * that callers can still treat NULL as "no context". */
static char sim_ctx_marker;

static cgt_status sim_ctx_create(void *stream, kern_ctx **out) {
  (void)stream;
  if (out == NULL)
    return sim_fail(CGT_ERR_INVALID_ARGUMENT, "ctx_create");
  *out = (kern_ctx *)(void *)&sim_ctx_marker;
  return CGT_OK;
}

static void sim_ctx_destroy(kern_ctx *c) { (void)c; }

/* ------------------------------------------------------ caller buffers */

static cgt_status sim_dev_alloc(size_t bytes, void **ptr) {
  if (ptr == NULL)
    return sim_fail(CGT_ERR_INVALID_ARGUMENT, "dev_alloc");
  /* aligned_alloc wants a multiple of the alignment; 0 bytes still gets a
   * distinct block so the caller can free it like any other. */
  size_t rounded = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
  if (rounded < bytes)
    return sim_fail(CGT_ERR_OUT_OF_MEMORY, "dev_alloc");
  void *p = aligned_alloc(256, rounded);
  if (p == NULL)
    return sim_fail(CGT_ERR_OUT_OF_MEMORY, "dev_alloc");
  *ptr = p;
  return CGT_OK;
}

static void sim_dev_free(void *ptr) { free(ptr); }

static cgt_status sim_upload(void *dst_dev, const void *src_host, size_t bytes) {
  if (bytes != 0)
    memcpy(dst_dev, src_host, bytes);
  return CGT_OK;
}

static cgt_status sim_download(void *dst_host, const void *src_dev, size_t bytes) {
  if (bytes != 0)
    memcpy(dst_host, src_dev, bytes);
  return CGT_OK;
}

/* ------------------------------------------------------------- kernels */

typedef struct fill_args {
  float *dst;
  float value;
  size_t n;
} fill_args;

static void fill_kernel(void *p) {
  const fill_args *a = p;
  for (size_t i = 0; i < a->n; i++)
    a->dst[i] = a->value;
}

static cgt_status sim_fill(void *stream, float *dst, float value, size_t n) {
  if (n == 0)
    return CGT_OK;
  fill_args a = {dst, value, n};
  return launch(stream, fill_kernel, &a, sizeof a, "fill");
}

typedef struct affine_args {
  const float *x;
  float a, b;
  float *out;
  size_t n;
} affine_args;

static void affine_kernel(void *p) {
  const affine_args *a = p;
  for (size_t i = 0; i < a->n; i++)
    a->out[i] = a->a * a->x[i] + a->b;
}

static cgt_status sim_affine(void *stream, const float *x, float a, float b, float *out, size_t n) {
  if (n == 0)
    return CGT_OK;
  affine_args args = {x, a, b, out, n};
  return launch(stream, affine_kernel, &args, sizeof args, "affine");
}

typedef struct add_args {
  const float *x, *y;
  float *out;
  size_t n;
} add_args;

static void add_kernel(void *p) {
  const add_args *a = p;
  for (size_t i = 0; i < a->n; i++)
    a->out[i] = a->x[i] + a->y[i];
}

static cgt_status sim_add(void *stream, const float *x, const float *y, float *out, size_t n) {
  if (n == 0)
    return CGT_OK;
  add_args a = {x, y, out, n};
  return launch(stream, add_kernel, &a, sizeof a, "add");
}

typedef struct relu_args {
  const float *x;
  float *out;
  size_t n;
} relu_args;

static void relu_kernel(void *p) {
  const relu_args *a = p;
  for (size_t i = 0; i < a->n; i++)
    a->out[i] = a->x[i] > 0.0f ? a->x[i] : 0.0f;
}

static cgt_status sim_relu(void *stream, const float *x, float *out, size_t n) {
  if (n == 0)
    return CGT_OK;
  relu_args a = {x, out, n};
  return launch(stream, relu_kernel, &a, sizeof a, "relu");
}

typedef struct sum_args {
  const float *x;
  size_t n;
  float *out;
} sum_args;

static void sum_kernel(void *p) {
  const sum_args *a = p;
  float acc = 0.0f;
  for (size_t i = 0; i < a->n; i++)
    acc += a->x[i];
  a->out[0] = acc;
}

static cgt_status sim_sum(void *stream, const float *x, size_t n, float *out) {
  sum_args a = {x, n, out};
  return launch(stream, sum_kernel, &a, sizeof a, "sum");
}

static cgt_status sim_copy(void *stream, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return CGT_OK;
  cgt_status s = cgt_sim_memcpy_async(stream, dst, src, bytes);
  return s == CGT_OK ? CGT_OK : sim_fail(s, "copy");
}

typedef struct gemm_args {
  const float *x, *w;
  float *out;
  int m, n, k;
} gemm_args;

static void gemm_kernel(void *p) {
  const gemm_args *a = p;
  for (int i = 0; i < a->m; i++)
    for (int j = 0; j < a->n; j++) {
      float acc = 0.0f;
      for (int q = 0; q < a->k; q++)
        acc += a->x[(size_t)i * (size_t)a->k + (size_t)q] * a->w[(size_t)q * (size_t)a->n + (size_t)j];
      a->out[(size_t)i * (size_t)a->n + (size_t)j] = acc;
    }
}

static cgt_status sim_gemm(kern_ctx *c, void *stream, const float *x, const float *w, float *out, int m, int n, int k,
                           void *workspace, size_t workspace_bytes) {
  (void)c;
  (void)workspace;
  (void)workspace_bytes;
  if (m < 0 || n < 0 || k < 0)
    return sim_fail(CGT_ERR_INVALID_ARGUMENT, "gemm");
  if (m == 0 || n == 0)
    return CGT_OK;
  gemm_args a = {x, w, out, m, n, k};
  return launch(stream, gemm_kernel, &a, sizeof a, "gemm");
}

/* -------------------------------------------------- careless segments */

static cgt_status sim_illegal_stream_sync(void *stream) {
  cgt_status s = cgt_sim_sync(stream);
  return s == CGT_OK ? CGT_OK : sim_fail(s, "illegal_stream_sync: cgt_sim_sync");
}

static cgt_status sim_illegal_malloc(void *stream) {
  void *p = NULL;
  cgt_status s = cgt_sim_malloc(stream, 256, &p);
  if (s != CGT_OK)
    return sim_fail(s, "illegal_malloc: cgt_sim_malloc");
  s = cgt_sim_free(stream, p);
  return s == CGT_OK ? CGT_OK : sim_fail(s, "illegal_malloc: cgt_sim_free");
}

/* A synchronous cudaMemcpy waits for the device first; the simulator's
 * equivalent of that wait is cgt_sim_sync, which is what breaks capture. */
static cgt_status sim_illegal_memcpy(void *stream, void *dst, const void *src, size_t bytes) {
  cgt_status s = cgt_sim_sync(stream);
  if (s != CGT_OK)
    return sim_fail(s, "illegal_memcpy: cgt_sim_sync");
  if (bytes != 0)
    memcpy(dst, src, bytes);
  return CGT_OK;
}

static cgt_status sim_illegal_device_sync(void *stream) {
  cgt_status s = cgt_sim_sync(stream);
  return s == CGT_OK ? CGT_OK : sim_fail(s, "illegal_device_sync: cgt_sim_sync");
}

const kernels kernels_sim = {
    .name = "sim",
    .ctx_create = sim_ctx_create,
    .ctx_destroy = sim_ctx_destroy,
    .dev_alloc = sim_dev_alloc,
    .dev_free = sim_dev_free,
    .upload = sim_upload,
    .download = sim_download,
    .fill = sim_fill,
    .affine = sim_affine,
    .add = sim_add,
    .relu = sim_relu,
    .sum = sim_sum,
    .copy = sim_copy,
    .gemm = sim_gemm,
    .illegal_stream_sync = sim_illegal_stream_sync,
    .illegal_malloc = sim_illegal_malloc,
    .illegal_memcpy = sim_illegal_memcpy,
    .illegal_device_sync = sim_illegal_device_sync,
    .fork_join = NULL,
    .last_error = sim_last_error,
};
