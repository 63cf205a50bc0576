/* test_cuda.c — every tree scenario again, on a real GPU, plus what only
 * CUDA has (cuBLAS, forked streams, the capture-illegal runtime calls).
 * Exits 77 (skipped) where no usable GPU and driver are present. */
#include <stdio.h>

#include "test_lists.h"

int main(void) {
  if (!cgt_cuda_available()) {
    printf("no usable CUDA device or driver: the CUDA suite is skipped\n");
    return 77;
  }
  test_backend = CGT_BACKEND_CUDA;
  int failed = 0;
  failed += test_run_group("tree scenarios (cuda)", scenario_tests, scenario_test_count);
  failed += test_run_group("bad input (cuda)", bad_input_tests, bad_input_test_count);
  failed += test_run_group("deferred launch (cuda)", fusion_tests, fusion_test_count);
  failed += test_run_group("recording budget and update in place (cuda)", budget_tests, budget_test_count);
  failed += test_run_group("prelaunch functions (cuda)", prelaunch_tests, prelaunch_test_count);
  failed += test_run_group("contract promises (cuda)", contract_tests, contract_test_count);
  failed += test_run_group("audit of api.md (cuda)", audit_tests, audit_test_count);
  failed += test_run_group("differential fuzz (cuda)", fuzz_tests, fuzz_test_count);
  failed += test_run_group("cuda only", cuda_specific_tests, cuda_specific_test_count);
  return failed ? 1 : 0;
}
