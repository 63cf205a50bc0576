/* cuda_info.c — cuda_info from the CUDA runtime (built only with CUDA).
 *
 * Every question is asked so that a machine without a GPU or driver gets an
 * answer, not a crash: the runtime reports cudaErrorNoDevice,
 * cudaErrorInsufficientDriver or cudaErrorStubLibrary, and those become the
 * error line. Each error is cleared after it is noted, so that the library,
 * which asks the same runtime later, does not inherit it.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_info.h"

static void note(cuda_info *out, const char *what, cudaError_t e) {
  if (!out->error[0])
    snprintf(out->error, sizeof out->error, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  (void)cudaGetLastError();
}

void cuda_info_query(cuda_info *out) {
  memset(out, 0, sizeof *out);
  out->built = 1;
  cudaError_t e = cudaRuntimeGetVersion(&out->runtime_version);
  if (e != cudaSuccess) {
    out->runtime_version = 0;
    note(out, "cudaRuntimeGetVersion", e);
  }
  e = cudaDriverGetVersion(&out->driver_version);
  if (e != cudaSuccess) {
    out->driver_version = 0;
    note(out, "cudaDriverGetVersion", e);
  }
  /* No driver at all: the runtime then reports cudaErrorInsufficientDriver
   * ("driver version is insufficient"), which reads like "upgrade your
   * driver". Say what is true instead: there is no driver, so no GPU. */
  if (out->driver_version == 0 && !out->error[0])
    snprintf(out->error, sizeof out->error,
             "no NVIDIA driver is installed (libcuda.so.1 not found), so no GPU can be used");
  int count = 0;
  e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    note(out, "cudaGetDeviceCount", e);
    return;
  }
  out->n_gpus = count;
  if (count == 0 && !out->error[0])
    snprintf(out->error, sizeof out->error, "the CUDA runtime sees no GPU");
  for (int i = 0; i < count && i < CUDA_INFO_MAX_GPUS; i++) {
    cuda_gpu *g = &out->gpus[i];
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, i);
    if (e != cudaSuccess) {
      snprintf(g->name, sizeof g->name, "(unknown: %s)", cudaGetErrorName(e));
      (void)cudaGetLastError();
      continue;
    }
    snprintf(g->name, sizeof g->name, "%s", p.name);
    g->cc_major = p.major;
    g->cc_minor = p.minor;
    g->memory_bytes = p.totalGlobalMem;
  }
}
