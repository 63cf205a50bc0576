/* capture_query_cost.c — what asking a stream "are you capturing?" costs.
 *
 *   nvcc -O2 -o /tmp/cqc bench/capture_query_cost.c -lcuda && /tmp/cqc
 *
 * cgtree.torch's eager allocator asks it at every allocation on a stream
 * other than the legacy default stream (python/_torch_ext/eager.c,
 * "Captures that are not ours"). This times, on a non-blocking stream that
 * does not capture, the median over 7 loops of 200,000 calls of each way
 * to ask: the runtime's cudaStreamIsCapturing and cudaStreamGetCaptureInfo,
 * and the driver's cuStreamIsCapturing and cuStreamGetCaptureInfo; then the
 * same four while another stream of the process captures (relaxed mode, so
 * that the loop itself cannot break that capture). One line per way, in
 * nanoseconds per call. Last, what the two cudaThreadExchangeStreamCaptureMode
 * calls cost that cgtree.torch makes around each compiled graph's call.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { CALLS = 200000, LOOPS = 7 };

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Each returns 0 if the stream does not capture, 1 if it does, 2 if the call failed. */
static int rt_is_capturing(cudaStream_t s) {
  enum cudaStreamCaptureStatus st;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess)
    return (void)cudaGetLastError(), 2;
  return st != cudaStreamCaptureStatusNone;
}

static int rt_capture_info(cudaStream_t s) {
  enum cudaStreamCaptureStatus st;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL) != cudaSuccess)
    return (void)cudaGetLastError(), 2;
  return st != cudaStreamCaptureStatusNone;
}

static int drv_is_capturing(cudaStream_t s) {
  CUstreamCaptureStatus st;
  if (cuStreamIsCapturing((CUstream)s, &st) != CUDA_SUCCESS)
    return 2;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static int drv_capture_info(cudaStream_t s) {
  CUstreamCaptureStatus st;
  cuuint64_t id = 0;
  if (cuStreamGetCaptureInfo((CUstream)s, &st, &id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS)
    return 2;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Not a question: the pair of calls around every compiled graph's call
 * that puts the thread in thread-local capture mode and back
 * (python/_torch_ext/dev.c, "Other threads' captures"); 0, or 2 if either failed. */
static int mode_exchange_pair(cudaStream_t s) {
  (void)s;
  enum cudaStreamCaptureMode m = cudaStreamCaptureModeThreadLocal;
  if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess)
    return (void)cudaGetLastError(), 2;
  if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess)
    return (void)cudaGetLastError(), 2;
  return 0;
}

static double ns_per_call(int (*ask)(cudaStream_t), cudaStream_t s) {
  double per[LOOPS];
  long said[3] = {0, 0, 0};
  for (int l = 0; l < LOOPS; l++) {
    double t0 = now_ns();
    for (int i = 0; i < CALLS; i++)
      said[ask(s)]++;
    per[l] = (now_ns() - t0) / CALLS;
  }
  if (said[1] || said[2])
    fprintf(stderr, "capture_query_cost: %ld calls said the stream captures, %ld failed\n", said[1], said[2]);
  qsort(per, LOOPS, sizeof per[0], by_value);
  return per[LOOPS / 2];
}

int main(void) {
  cudaStream_t asked, other;
  if (cudaStreamCreateWithFlags(&asked, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "capture_query_cost: no CUDA device\n");
    return 77;
  }
  struct {
    const char *name;
    int (*ask)(cudaStream_t);
  } ways[] = {{"cudaStreamIsCapturing", rt_is_capturing},
              {"cudaStreamGetCaptureInfo", rt_capture_info},
              {"cuStreamIsCapturing", drv_is_capturing},
              {"cuStreamGetCaptureInfo", drv_capture_info},
              {"cudaThreadExchangeStreamCaptureMode, to thread-local and back (two calls)", mode_exchange_pair}};
  int n = sizeof ways / sizeof ways[0];
  char name[256];
  struct cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  snprintf(name, sizeof name, "%s", p.name);
  for (int capturing = 0; capturing < 2; capturing++) {
    if (capturing && cudaStreamBeginCapture(other, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
      fprintf(stderr, "capture_query_cost: cannot begin a capture\n");
      return 1;
    }
    for (int w = 0; w < n; w++)
      printf("{\"device\": \"%s\", \"call\": \"%s\", \"another_stream_captures\": %s, \"ns_per_call\": %.1f}\n", name,
             ways[w].name, capturing ? "true" : "false", ns_per_call(ways[w].ask, asked));
  }
  cudaGraph_t g;
  if (cudaStreamEndCapture(other, &g) == cudaSuccess)
    cudaGraphDestroy(g);
  return 0;
}
