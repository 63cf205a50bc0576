/* test_env.c — the environment variables cgt_tree_create reads.
 *
 * CGT_LOG and CGT_MODE are read at create; a value that is not one of the
 * known words is ignored with a warning through the tree's log (so a typo in
 * a kill switch never goes unnoticed). With no log_fn the log is stderr,
 * filtered by CGT_LOG (default warn). Linked against the shared library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* What cgt_tree_create writes to stderr with no log_fn, CGT_MODE=fast (a
 * warning) and CGT_LOG set to cgt_log (NULL: unset), into out. */
static void stderr_of_create(const char *cgt_log, char *out, size_t cap) {
  FILE *f = tmpfile();
  assert_non_null(f);
  fflush(stderr);
  int saved = dup(2);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(f), 2) >= 0);
  if (cgt_log)
    setenv("CGT_LOG", cgt_log, 1);
  setenv("CGT_MODE", "fast", 1);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  cgt_tree *t = NULL;
  cgt_status st = cgt_tree_create(&o, &t);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  unsetenv("CGT_LOG");
  unsetenv("CGT_MODE");
  assert_int_equal(st, CGT_OK);
  cgt_tree_destroy(t);
  rewind(f);
  size_t used = fread(out, 1, cap - 1, f);
  out[used] = '\0';
  fclose(f);
}

/* "log_fn NULL: stderr, filtered by CGT_LOG" (default warn): the warning
 * reaches stderr at the default level and at warn, and not at error. */
static void test_without_a_log_function_warnings_go_to_stderr_filtered_by_cgt_log(void **state) {
  (void)state;
  char text[1024];
  stderr_of_create(NULL, text, sizeof text);
  assert_non_null(strstr(text, "CGT_MODE=fast"));
  stderr_of_create("warn", text, sizeof text);
  assert_non_null(strstr(text, "CGT_MODE=fast"));
  stderr_of_create("error", text, sizeof text);
  assert_string_equal(text, "");
}

int main(void) {
  unsetenv("CGT_LOG");
  unsetenv("CGT_MODE");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unknown_cgt_log_value_is_ignored_with_a_warning),
      cmocka_unit_test(test_known_cgt_log_values_give_no_warning),
      cmocka_unit_test(test_unknown_cgt_log_value_keeps_the_default_level),
      cmocka_unit_test(test_unknown_cgt_mode_value_is_ignored_with_a_warning),
      cmocka_unit_test(test_without_a_log_function_warnings_go_to_stderr_filtered_by_cgt_log),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
