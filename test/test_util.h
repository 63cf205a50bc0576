/* test_util.h — what every tree test shares: the backend under test, a
 * fixture, status assertions, and segments built from the kernel table.
 *
 * Scenarios are written once and run on every backend that is present:
 * test_tree runs them on the simulator, test_cuda on a GPU. They reach the
 * device only through the public API and kernels.h.
 */
#ifndef CGT_TEST_UTIL_H
#define CGT_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cgtree.h"
#include "kernels.h"

/* Set by each binary's main before running its groups. */
extern cgt_backend test_backend;

/* Fails the test with both status names and the tree's last error. */
#define CHECK_STATUS(tree, expected, expr) test_check_status((tree), (expected), (expr), #expr, __FILE__, __LINE__)
#define CHECK_OK(tree, expr) CHECK_STATUS((tree), CGT_OK, (expr))
void test_check_status(cgt_tree *t, cgt_status expected, cgt_status got, const char *expr, const char *file, int line);

/* A tree on test_backend; opts may be NULL (defaults). Logs only errors. */
cgt_tree *test_tree_new(cgt_mode mode, const cgt_options *opts);
/* cgt_tree_check must pass; then destroy. */
void test_tree_free(cgt_tree *t);
#define CHECK_TREE(t) CHECK_OK((t), cgt_tree_check(t))

const kernels *test_kernels(void);

/* Caller-owned device memory holding n floats, filled from host. */
float *test_dev_floats(const float *host, size_t n);
void test_dev_free(void *p);
void test_dev_upload(float *dev, const float *host, size_t n);

/* Reads n floats of v back (copy_out + sync). */
void test_read_value(cgt_tree *t, cgt_value v, float *host, size_t n);
float test_read_first(cgt_tree *t, cgt_value v);

cgt_stats test_stats(cgt_tree *t);

/* One run of a segment with one input and one output: its output value.
 * Fails the test unless the run succeeds and cgt_tree_check passes. */
cgt_value test_run1(cgt_tree *t, cgt_segment s, uint64_t variant, cgt_arg a);
/* How many nodes the tree has (cgt_tree_nodes with cap 0). */
size_t test_node_count(cgt_tree *t);

/* The tree's dot file (cgt_tree_write_dot) as text in buf, NUL-terminated;
 * fails the test if it does not fit in cap - 1 bytes. */
void test_dot_text(cgt_tree *t, char *buf, size_t cap);

/* Generic segments, parameterised by their user data:
 *   affine:  1 input (n floats)   -> 1 output  out = a*x + b
 *   add2:    2 inputs             -> 1 output  out = x + y
 *   view:    1 input              -> 1 output  an alias of the input (no work)
 *   temp:    1 input              -> 1 output  out = a*x + b through a temporary
 *                                             of extra_bytes that is freed early */
typedef struct test_affine {
  float a, b;
  size_t n;            /* floats */
  size_t extra_bytes;  /* temp: bytes of the temporary */
  int illegal;         /* 1..4: call the kernel table's illegal_* op (1 stream sync, 2 malloc, 3 memcpy, 4 device sync) */
  int check_illegal;   /* return the illegal op's error, as careful code does, instead of ignoring it */
  int calls;           /* how often the launch function ran (warmup, record, eager) */
  const void *input;   /* affine: cgt_launch_input(l, 0) at its last call */
} test_affine;

cgt_segment test_register_affine(cgt_tree *t, const char *name, test_affine *u);
/* affine, registered with cgt_segment_desc.flags = flags */
cgt_segment test_register_affine_flags(cgt_tree *t, const char *name, test_affine *u, uint32_t flags);
cgt_segment test_register_add2(cgt_tree *t, const char *name, test_affine *u);
cgt_segment test_register_view(cgt_tree *t, const char *name, test_affine *u);
cgt_segment test_register_temp(cgt_tree *t, const char *name, test_affine *u);

/* Runs a group of tests held in an array whose length is only known at run
 * time (cmocka's macro needs a static array). */
int test_run_group(const char *name, const struct CMUnitTest *tests, size_t count);

#endif /* CGT_TEST_UTIL_H */
