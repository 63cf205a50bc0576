/* test_lists.h — the test lists each scenario file exports, so that one
 * binary per backend can run them all. */
#ifndef CGT_TEST_LISTS_H
#define CGT_TEST_LISTS_H

#include "test_util.h"

extern const struct CMUnitTest scenario_tests[];
extern const size_t scenario_test_count;
extern const struct CMUnitTest bad_input_tests[];
extern const size_t bad_input_test_count;
extern const struct CMUnitTest fuzz_tests[];
extern const size_t fuzz_test_count;
extern const struct CMUnitTest fusion_tests[];
extern const size_t fusion_test_count;
extern const struct CMUnitTest budget_tests[];
extern const size_t budget_test_count;
extern const struct CMUnitTest prelaunch_tests[];
extern const size_t prelaunch_test_count;
extern const struct CMUnitTest contract_tests[];
extern const size_t contract_test_count;
extern const struct CMUnitTest audit_tests[];
extern const size_t audit_test_count;
extern const struct CMUnitTest fuzz_options_tests[];
extern const size_t fuzz_options_test_count;
extern const struct CMUnitTest cuda_specific_tests[];
extern const size_t cuda_specific_test_count;

#endif /* CGT_TEST_LISTS_H */
