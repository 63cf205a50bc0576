/* test_tree.c — the tree scenarios, bad input and differential fuzzing, on
 * the simulator backend: every CPU-only machine runs these. */
#include "test_lists.h"

int main(void) {
  test_backend = CGT_BACKEND_SIM;
  int failed = 0;
  failed += test_run_group("tree scenarios (sim)", scenario_tests, scenario_test_count);
  failed += test_run_group("bad input (sim)", bad_input_tests, bad_input_test_count);
  failed += test_run_group("deferred launch (sim)", fusion_tests, fusion_test_count);
  failed += test_run_group("recording budget and update in place (sim)", budget_tests, budget_test_count);
  failed += test_run_group("prelaunch functions (sim)", prelaunch_tests, prelaunch_test_count);
  failed += test_run_group("contract promises (sim)", contract_tests, contract_test_count);
  failed += test_run_group("audit of api.md (sim)", audit_tests, audit_test_count);
  failed += test_run_group("differential fuzz (sim)", fuzz_tests, fuzz_test_count);
  failed +=
      test_run_group("differential fuzz of option combinations (sim)", fuzz_options_tests, fuzz_options_test_count);
  return failed ? 1 : 0;
}
