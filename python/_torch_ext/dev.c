/* dev.c — the few device-runtime calls of cgtree._torch_ext, in one place.
 *
 * With CUDA: cudaMalloc/cudaFree for memory outside the pool, and an event to
 * order a caller's stream after the tree's. Without CUDA (a CPU build), and
 * for device -1 (which PyTorch never passes; test_torch_ext_sim.py does, to
 * drive the hot path on the simulator, whose device memory is host memory),
 * memory is malloc'd and there are no events.
 */
#include "ext.h"

#include <stdlib.h>

#ifdef CGT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

void *tx_dev_malloc(size_t bytes, int device) {
  void *p = NULL;
#ifdef CGT_HAVE_CUDA
  if (device >= 0) {
    int cur = -1;
    cudaGetDevice(&cur);
    if (cur != device)
      cudaSetDevice(device);
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      p = NULL;
    }
    if (cur != device && cur >= 0)
      cudaSetDevice(cur);
    return p;
  }
#endif
  (void)device;
  p = malloc(bytes);
  return p;
}

void tx_dev_free(void *p, int device) {
#ifdef CGT_HAVE_CUDA
  if (device >= 0) {
    cudaFree(p);
    return;
  }
#endif
  (void)device;
  free(p);
}

void *tx_event_create(void) {
#ifdef CGT_HAVE_CUDA
  cudaEvent_t e = NULL;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return e;
#else
  return NULL;
#endif
}

void tx_stream_wait(void *waiter, void *signaller, void *event) {
#ifdef CGT_HAVE_CUDA
  if (!event)
    return;
  cudaEventRecord((cudaEvent_t)event, (cudaStream_t)signaller);
  cudaStreamWaitEvent((cudaStream_t)waiter, (cudaEvent_t)event, 0);
#else
  (void)waiter;
  (void)signaller;
  (void)event;
#endif
}
