/* bench_cuda_none.c — bench_util.h's device extras in a build without CUDA:
 * the simulator has no public capture calls, so there is no bare recording
 * to compare with. */
#include "bench_util.h"

void bench_device_name(cgt_backend backend, char *buf, size_t n) {
  (void)backend;
  snprintf(buf, n, "CPU simulator");
}

int bench_raw_record(workload *w, int segment_index, int reps, double *capture_us, double *instantiate_us,
                     double *total_us) {
  (void)w, (void)segment_index, (void)reps, (void)capture_us, (void)instantiate_us, (void)total_us;
  return 0;
}
