/* test_env.c — the environment variables cgt_tree_create reads.
 *
 * CGT_LOG and CGT_MODE are read at create; a value that is not one of the
 * known words is ignored with a warning through the tree's log (so a typo in
 * a kill switch never goes unnoticed). With no log_fn the log is stderr,
 * filtered by CGT_LOG (default warn: info lines show only from info on).
 * Every CGT_MODE word overrides the options' mode. Linked against the
 * shared library.
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

/* stderr, sent to a temporary file between stderr_capture_begin and
 * stderr_capture_end, which puts it back and copies what was written into
 * out (cap bytes, NUL-terminated). */
typedef struct stderr_capture {
  FILE *f;
  int saved;
} stderr_capture;

static stderr_capture stderr_capture_begin(void) {
  stderr_capture c = {tmpfile(), -1};
  assert_non_null(c.f);
  fflush(stderr);
  c.saved = dup(2);
  assert_true(c.saved >= 0);
  assert_true(dup2(fileno(c.f), 2) >= 0);
  return c;
}

static void stderr_capture_end(stderr_capture c, char *out, size_t cap) {
  fflush(stderr);
  dup2(c.saved, 2);
  close(c.saved);
  rewind(c.f);
  size_t used = fread(out, 1, cap - 1, c.f);
  out[used] = '\0';
  fclose(c.f);
}

/* What cgt_tree_create writes to stderr with no log_fn, CGT_MODE=fast (a
 * warning) and CGT_LOG set to cgt_log (NULL: unset), into out. */
static void stderr_of_create(const char *cgt_log, char *out, size_t cap) {
  stderr_capture c = stderr_capture_begin();
  if (cgt_log)
    setenv("CGT_LOG", cgt_log, 1);
  setenv("CGT_MODE", "fast", 1);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  cgt_tree *t = NULL;
  cgt_status st = cgt_tree_create(&o, &t);
  stderr_capture_end(c, out, cap);
  unsetenv("CGT_LOG");
  unsetenv("CGT_MODE");
  assert_int_equal(st, CGT_OK);
  cgt_tree_destroy(t);
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

/* "CGT_MODE=tree|eager|separate (overrides o->mode)": each word, over an
 * option that says another mode, with no warning. Fails if a word were
 * ignored (the option's mode would stay). */
static void test_every_cgt_mode_word_overrides_the_options_mode(void **state) {
  (void)state;
  static const struct {
    const char *word;
    cgt_mode mode, option;
  } cases[] = {{"tree", CGT_MODE_TREE, CGT_MODE_EAGER},
               {"eager", CGT_MODE_EAGER, CGT_MODE_TREE},
               {"separate", CGT_MODE_SEPARATE, CGT_MODE_TREE}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    log_capture c = {0};
    cgt_options o;
    cgt_options_init(&o);
    o.backend = CGT_BACKEND_SIM;
    o.mode = cases[i].option;
    o.log_fn = capture;
    o.log_user = &c;
    setenv("CGT_MODE", cases[i].word, 1);
    cgt_tree *t = NULL;
    cgt_status st = cgt_tree_create(&o, &t);
    unsetenv("CGT_MODE");
    assert_int_equal(st, CGT_OK);
    assert_int_equal(cgt_tree_mode(t), cases[i].mode);
    assert_int_equal(c.warnings, 0);
    cgt_tree_destroy(t);
  }
}

/* A launch with no kernel: its output is a fresh allocation. */
static cgt_status launch_empty(cgt_launch *l, void *user) {
  (void)user;
  void *out;
  cgt_status st = cgt_launch_alloc(l, 256, &out);
  return st == CGT_OK ? cgt_launch_set_output(l, 0, out, 256) : st;
}

/* What a tree with no log_fn writes to stderr while it records a node
 * (an info line: "recorded node ..."), with CGT_LOG set to cgt_log (NULL:
 * unset), into out. */
static void stderr_of_a_recording(const char *cgt_log, char *out, size_t cap) {
  stderr_capture c = stderr_capture_begin();
  if (cgt_log)
    setenv("CGT_LOG", cgt_log, 1);
  cgt_options o;
  cgt_options_init(&o);
  o.backend = CGT_BACKEND_SIM;
  cgt_tree *t = NULL;
  cgt_status st = cgt_tree_create(&o, &t);
  unsetenv("CGT_LOG");
  cgt_segment s = 0;
  cgt_segment_desc d = {"quiet_or_not", launch_empty, NULL, 0, 1, 0};
  if (st == CGT_OK)
    st = cgt_segment_register(t, &d, &s);
  for (int step = 0; step < 3 && st == CGT_OK; step++) { /* warmup, recording, replay */
    cgt_value v;
    st = cgt_step_begin(t);
    if (st == CGT_OK)
      st = cgt_run(t, s, 0, NULL, 0, &v, 1);
  }
  cgt_stats stats = {0};
  if (st == CGT_OK)
    st = cgt_tree_stats(t, &stats);
  stderr_capture_end(c, out, cap);
  assert_int_equal(st, CGT_OK);
  assert_int_equal(stats.recordings, 1);
  cgt_tree_destroy(t);
}

/* "CGT_LOG=error|warn|info|debug (default warn)", with no log_fn: an info
 * line reaches stderr at info and debug, and not at the default or at
 * warn. Fails if the default were info or debug, or if info were ignored. */
static void test_without_a_log_function_info_lines_reach_stderr_only_from_cgt_log_info(void **state) {
  (void)state;
  char text[4096];
  static const struct {
    const char *level;
    int shown;
  } cases[] = {{NULL, 0}, {"warn", 0}, {"error", 0}, {"info", 1}, {"debug", 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    stderr_of_a_recording(cases[i].level, text, sizeof text);
    if ((strstr(text, "recorded node") != NULL) != cases[i].shown)
      fail_msg("CGT_LOG=%s: stderr was \"%s\"", cases[i].level ? cases[i].level : "(unset)", text);
  }
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
      cmocka_unit_test(test_every_cgt_mode_word_overrides_the_options_mode),
      cmocka_unit_test(test_without_a_log_function_info_lines_reach_stderr_only_from_cgt_log_info),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
