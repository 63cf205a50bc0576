/* test_env.c — the environment variables cgt_tree_create reads.
 *
 * CGT_LOG and CGT_MODE are read at create; a value that is not one of the
 * known words is ignored with a warning through the tree's log (so a typo in
 * a kill switch never goes unnoticed). Linked against the shared library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cgtree.h"

typedef struct log_capture {
  int warnings;
  char last[512];
} log_capture;

static void capture(void *user, int level, const char *msg) {
  log_capture *c = user;
  if (level == CGT_LOG_WARN) {
    c->warnings++;
    snprintf(c->last, sizeof c->last, "%s", msg);
  }
}

static cgt_tree *create_with(const char *var, const char *value, log_capture *c) {
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  o.log_fn = capture;
  o.log_user = c;
  setenv(var, value, 1);
  cgt_tree *t = NULL;
  cgt_status st = cgt_tree_create(&o, &t);
  unsetenv(var);
  assert_int_equal(st, CGT_OK);
  return t;
}

static void test_unknown_cgt_log_value_is_ignored_with_a_warning(void **state) {
  (void)state;
  log_capture c = {0};
  cgt_tree *t = create_with("CGT_LOG", "verbose", &c);
  assert_int_equal(c.warnings, 1);
  assert_non_null(strstr(c.last, "CGT_LOG=verbose"));
  cgt_tree_destroy(t);
}

static void test_known_cgt_log_values_give_no_warning(void **state) {
  (void)state;
  static const char *const ok[] = {"error", "WARN", "info", "debug"};
  for (int i = 0; i < 4; i++) {
    log_capture c = {0};
    cgt_tree *t = create_with("CGT_LOG", ok[i], &c);
    assert_int_equal(c.warnings, 0);
    cgt_tree_destroy(t);
  }
}

static void test_unknown_cgt_log_value_keeps_the_default_level(void **state) {
  (void)state;
  /* With a log_fn the default level is info: an unknown CGT_LOG must not
   * lower it to error (that would hide the warning itself). */
  log_capture c = {0};
  cgt_tree *t = create_with("CGT_LOG", "loud", &c);
  assert_int_equal(c.warnings, 1);
  cgt_tree_destroy(t);
}

static void test_unknown_cgt_mode_value_is_ignored_with_a_warning(void **state) {
  (void)state;
  log_capture c = {0};
  cgt_tree *t = create_with("CGT_MODE", "fast", &c);
  assert_int_equal(c.warnings, 1);
  assert_non_null(strstr(c.last, "CGT_MODE=fast"));
  assert_int_equal(cgt_tree_mode(t), CGT_MODE_TREE);
  cgt_tree_destroy(t);
}

int main(void) {
  unsetenv("CGT_LOG");
  unsetenv("CGT_MODE");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unknown_cgt_log_value_is_ignored_with_a_warning),
      cmocka_unit_test(test_known_cgt_log_values_give_no_warning),
      cmocka_unit_test(test_unknown_cgt_log_value_keeps_the_default_level),
      cmocka_unit_test(test_unknown_cgt_mode_value_is_ignored_with_a_warning),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
