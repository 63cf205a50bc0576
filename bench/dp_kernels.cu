/* dp_kernels.cu — the loss injector and the device timestamps of the
 * data-parallel benchmark (dp_kernels.h). Launch failures are reported as
 * a cgt_status with a one-line detail, and cleared.
 */
#include <stdio.h>

#include <cuda_runtime.h>

#include "dp_kernels.h"

static thread_local char dp_error[256];

static cgt_status dp_check(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    return CGT_OK;
  snprintf(dp_error, sizeof dp_error, "%s: %s", what, cudaGetErrorString(e));
  if (e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureUnsupported)
    return CGT_ERR_CAPTURE_FAILED;
  return CGT_ERR_BACKEND;
}

static __global__ void inject_loss_kernel(float *loss, float scale, const float *inject, const int *counter) {
  loss[0] = loss[0] * scale + inject[*counter];
}

static __global__ void stamp_kernel(unsigned long long *stamps, int *counter, int slot, int advance) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  int c = *counter;
  stamps[2 * c + slot] = t;
  if (advance)
    *counter = c + 1;
}

extern "C" cgt_status dp_inject_loss(void *stream, float *loss, float scale, const float *inject,
                                     const int *counter) {
  inject_loss_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(loss, scale, inject, counter);
  return dp_check("inject_loss_kernel");
}

extern "C" cgt_status dp_stamp(void *stream, uint64_t *stamps, int *counter, int slot, int advance) {
  stamp_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((unsigned long long *)stamps, counter, slot, advance);
  return dp_check("stamp_kernel");
}

extern "C" const char *dp_last_error(void) { return dp_error; }
