/* test_util.c — the shared fixture of the tree tests: trees on the backend
 * under test, device buffers through the kernel table, and a handful of
 * generic segments whose launch functions use only the public API.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "tree_hooks.h"

cgt_backend test_backend = CGT_BACKEND_SIM;

void test_check_status(cgt_tree *t, cgt_status expected, cgt_status got, const char *expr, const char *file, int line) {
  if (expected == got)
    return;
  fail_msg("%s:%d: %s returned %s, expected %s (last error: %s)", file, line, expr, cgt_status_name(got),
           cgt_status_name(expected), t ? cgt_tree_last_error(t) : "-");
}

static void quiet_log(void *user, int level, const char *msg) {
  (void)user;
  if (level <= (getenv("CGT_TEST_LOG") ? 3 : CGT_LOG_ERROR))
    fprintf(stderr, "cgtree error: %s\n", msg);
}

cgt_tree *test_tree_new(cgt_mode mode, const cgt_options *opts) {
  cgt_options o;
  if (opts)
    o = *opts;
  else
    cgt_options_init(&o);
  o.backend = test_backend;
  o.mode = mode;
  if (!o.log_fn)
    o.log_fn = quiet_log;
  cgt_tree *t = NULL;
  CHECK_OK(NULL, cgt_tree_create(&o, &t));
  assert_non_null(t);
  assert_int_equal(cgt_tree_backend(t), test_backend);
  return t;
}

/* "cgt_tree_destroy frees every graph, node, value and pool chunk": on the
 * simulator, every tree a test frees must have given back all it held
 * before its device closed (tree_hooks.h). */
void test_tree_free(cgt_tree *t) {
  CHECK_TREE(t);
  char left[256] = "";
  cgt__leftovers_to(t, left, sizeof left);
  cgt_tree_destroy(t);
  if (left[0])
    fail_msg("cgt_tree_destroy left it to the device's close to free: %s", left);
}

const kernels *test_kernels(void) {
  const kernels *k = kernels_for(test_backend);
  assert_non_null(k);
  return k;
}

float *test_dev_floats(const float *host, size_t n) {
  void *p = NULL;
  assert_int_equal(CGT_OK, test_kernels()->dev_alloc(n * sizeof(float), &p));
  if (host)
    test_dev_upload(p, host, n);
  return p;
}

void test_dev_free(void *p) { test_kernels()->dev_free(p); }

void test_dev_upload(float *dev, const float *host, size_t n) {
  assert_int_equal(CGT_OK, test_kernels()->upload(dev, host, n * sizeof(float)));
}

void test_read_value(cgt_tree *t, cgt_value v, float *host, size_t n) {
  CHECK_OK(t, cgt_value_copy_out(t, v, host, n * sizeof(float)));
  CHECK_OK(t, cgt_sync(t));
}

float test_read_first(cgt_tree *t, cgt_value v) {
  float x = 0;
  test_read_value(t, v, &x, 1);
  return x;
}

cgt_stats test_stats(cgt_tree *t) {
  cgt_stats s;
  CHECK_OK(t, cgt_tree_stats(t, &s));
  return s;
}

cgt_value test_run1(cgt_tree *t, cgt_segment s, uint64_t variant, cgt_arg a) {
  cgt_value out = {0};
  CHECK_OK(t, cgt_run(t, s, variant, &a, 1, &out, 1));
  CHECK_TREE(t);
  return out;
}

size_t test_node_count(cgt_tree *t) {
  size_t n = 0;
  CHECK_OK(t, cgt_tree_nodes(t, NULL, 0, &n));
  return n;
}

void test_dot_text(cgt_tree *t, char *buf, size_t cap) {
  FILE *f = tmpfile();
  assert_non_null(f);
  CHECK_OK(t, cgt_tree_write_dot(t, f));
  rewind(f);
  size_t used = fread(buf, 1, cap - 1, f);
  int more = fgetc(f) != EOF;
  fclose(f);
  buf[used] = '\0';
  if (more)
    fail_msg("the dot file is longer than %zu bytes", cap - 1);
}

/* ------------------------------------------------------------- segments */

static cgt_status do_illegal(cgt_launch *l, const test_affine *u, float *scratch) {
  const kernels *k = test_kernels();
  void *s = cgt_launch_stream(l);
  switch (u->illegal) {
  case 1:
    return k->illegal_stream_sync(s);
  case 2:
    return k->illegal_malloc(s);
  case 3:
    return k->illegal_memcpy(s, scratch, scratch, sizeof(float));
  case 4:
    return k->illegal_device_sync(s);
  default:
    return CGT_OK;
  }
}

static cgt_status launch_affine(cgt_launch *l, void *user) {
  test_affine *u = user;
  u->calls++;
  u->input = cgt_launch_input(l, 0);
  void *out;
  cgt_status st = cgt_launch_alloc(l, u->n * sizeof(float), &out);
  if (st != CGT_OK)
    return st;
  st = test_kernels()->affine(cgt_launch_stream(l), cgt_launch_input(l, 0), u->a, u->b, out, u->n);
  if (st != CGT_OK)
    return st;
  st = do_illegal(l, u, out);
  if (st != CGT_OK && u->check_illegal)
    return st;
  return cgt_launch_set_output(l, 0, out, u->n * sizeof(float));
}

static cgt_status launch_add2(cgt_launch *l, void *user) {
  test_affine *u = user;
  u->calls++;
  void *out;
  cgt_status st = cgt_launch_alloc(l, u->n * sizeof(float), &out);
  if (st != CGT_OK)
    return st;
  st = test_kernels()->add(cgt_launch_stream(l), cgt_launch_input(l, 0), cgt_launch_input(l, 1), out, u->n);
  if (st != CGT_OK)
    return st;
  return cgt_launch_set_output(l, 0, out, u->n * sizeof(float));
}

static cgt_status launch_view(cgt_launch *l, void *user) {
  test_affine *u = user;
  u->calls++;
  return cgt_launch_set_output(l, 0, cgt_launch_input(l, 0), cgt_launch_input_bytes(l, 0));
}

static cgt_status launch_temp(cgt_launch *l, void *user) {
  test_affine *u = user;
  u->calls++;
  void *tmp, *out;
  cgt_status st = cgt_launch_alloc(l, u->n * sizeof(float) + u->extra_bytes, &tmp);
  if (st != CGT_OK)
    return st;
  const kernels *k = test_kernels();
  void *s = cgt_launch_stream(l);
  st = k->affine(s, cgt_launch_input(l, 0), u->a, 0.0f, tmp, u->n);
  if (st == CGT_OK)
    st = cgt_launch_alloc(l, u->n * sizeof(float), &out);
  if (st == CGT_OK)
    st = k->affine(s, tmp, 1.0f, u->b, out, u->n);
  if (st == CGT_OK)
    st = cgt_launch_free(l, tmp);
  if (st != CGT_OK)
    return st;
  return cgt_launch_set_output(l, 0, out, u->n * sizeof(float));
}

static cgt_segment reg_flags(cgt_tree *t, const char *name, cgt_launch_fn fn, void *user, uint32_t n_in,
                             uint32_t flags) {
  cgt_segment_desc d = {name, fn, user, n_in, 1, flags};
  cgt_segment s = 0;
  CHECK_OK(t, cgt_segment_register(t, &d, &s));
  assert_true(s != 0);
  return s;
}

static cgt_segment reg(cgt_tree *t, const char *name, cgt_launch_fn fn, void *user, uint32_t n_in) {
  return reg_flags(t, name, fn, user, n_in, 0);
}

cgt_segment test_register_affine_flags(cgt_tree *t, const char *name, test_affine *u, uint32_t flags) {
  return reg_flags(t, name, launch_affine, u, 1, flags);
}
cgt_segment test_register_affine(cgt_tree *t, const char *name, test_affine *u) {
  return reg(t, name, launch_affine, u, 1);
}
cgt_segment test_register_add2(cgt_tree *t, const char *name, test_affine *u) {
  return reg(t, name, launch_add2, u, 2);
}
cgt_segment test_register_view(cgt_tree *t, const char *name, test_affine *u) {
  return reg(t, name, launch_view, u, 1);
}
cgt_segment test_register_temp(cgt_tree *t, const char *name, test_affine *u) {
  return reg(t, name, launch_temp, u, 1);
}

int test_run_group(const char *name, const struct CMUnitTest *tests, size_t count) {
  return _cmocka_run_group_tests(name, tests, count, NULL, NULL);
}
