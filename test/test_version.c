/* test_version.c — the version a program sees, through the shared library.
 *
 * This suite links libcgtree.so (not the static library the other suites use)
 * so it runs against exactly what an installed program loads. It checks that
 * cgt_version() at run time, the CGT_VERSION_* macros of the header and the
 * project version in meson.build (passed as CGT_MESON_VERSION) all agree.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cgtree.h"

static void test_runtime_version_matches_the_header_it_was_built_with(void **state) {
  (void)state;
  assert_non_null(cgt_version());
  assert_string_equal(cgt_version(), CGT_VERSION_STRING);
}

static void test_version_macros_spell_the_version_string(void **state) {
  (void)state;
  char buf[64];
  snprintf(buf, sizeof buf, "%d.%d.%d", CGT_VERSION_MAJOR, CGT_VERSION_MINOR, CGT_VERSION_PATCH);
  assert_string_equal(buf, CGT_VERSION_STRING);
}

static void test_header_version_matches_the_meson_project_version(void **state) {
  (void)state;
  assert_string_equal(CGT_VERSION_STRING, CGT_MESON_VERSION);
}

static void test_runtime_version_is_one_static_string(void **state) {
  (void)state;
  assert_ptr_equal(cgt_version(), cgt_version());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runtime_version_matches_the_header_it_was_built_with),
      cmocka_unit_test(test_version_macros_spell_the_version_string),
      cmocka_unit_test(test_header_version_matches_the_meson_project_version),
      cmocka_unit_test(test_runtime_version_is_one_static_string),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
