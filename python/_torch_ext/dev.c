/* dev.c — the few device-runtime calls of cgtree._torch_ext, in one place.
 *
 * With CUDA: the device's stream-ordered memory pool (cudaMallocFromPoolAsync
 * and cudaFreeAsync on cudaDeviceGetDefaultMemPool, what PyTorch's
 * backend:cudaMallocAsync uses) for memory outside the tree's pool, and
 * events to order one stream after another. Without CUDA (a CPU build), and
 * for device -1 (which PyTorch never passes; test_torch_ext_sim.py does, to
 * drive the hot path on the simulator, whose device memory is host memory),
 * memory is malloc'd and there are no events.
 *
 * Other threads' captures. torch.cuda.graph captures in CUDA's global mode
 * unless told otherwise, and while a global capture is open on any thread,
 * CUDA refuses "potentially unsafe" calls from every other thread that is
 * itself in global mode (as every thread starts) and invalidates that
 * capture: synchronising or querying any stream or event, cudaMalloc and
 * cudaFree, cudaMallocFromPoolAsync and cudaFreeAsync even on an unrelated
 * stream, destroying a graph, trimming a pool or reading its figures
 * (bench/foreign_capture_probe.py tries each). A thread running compiled
 * models beside one that captures would break the capture at its next
 * cache miss, tree close, empty_cache() or memory_stats(). So the calls
 * cgtree makes for itself run with the calling thread in thread-local mode
 * (tx_dev_ignore_other_captures), which CUDA documents as ignoring other
 * threads' captures and which still forbids those calls inside a capture
 * of the thread's own (a thread in relaxed mode, looser still, stays so);
 * the probe finds every one of them then leaves the other capture whole.
 * The switch sits at the outermost call of ours (a compiled graph's call
 * covers its step's begin, its cache misses, a tree it closes). One call
 * stays forbidden in every mode while any stream of the device captures:
 * synchronising the whole device.
 * tx_dev_pool_trim does that only when its caller knows of no capture open
 * (tx_eager_trim says how it knows). What the program itself does on the
 * host meanwhile is its own: a host read (.item(), print) synchronises,
 * and breaks the capture under plain PyTorch as well.
 */
#include "ext.h"

#include <stdatomic.h>
#include <stdlib.h>

#ifdef CGT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static atomic_size_t events_live; /* the free path makes and destroys events without the GIL */

size_t tx_events_live(void) { return atomic_load_explicit(&events_live, memory_order_relaxed); }

void *tx_event_create(void) {
#ifdef CGT_HAVE_CUDA
  cudaEvent_t e = NULL;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  atomic_fetch_add_explicit(&events_live, 1, memory_order_relaxed);
  return e;
#else
  return NULL;
#endif
}

void tx_event_destroy(void *event) {
#ifdef CGT_HAVE_CUDA
  if (event) {
    cudaEventDestroy((cudaEvent_t)event);
    atomic_fetch_sub_explicit(&events_live, 1, memory_order_relaxed);
  }
#else
  (void)event;
#endif
}

void tx_event_record(void *event, void *stream) {
#ifdef CGT_HAVE_CUDA
  if (event)
    cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
#else
  (void)event;
  (void)stream;
#endif
}

void tx_event_wait(void *stream, void *event) {
#ifdef CGT_HAVE_CUDA
  if (event)
    cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
#else
  (void)stream;
  (void)event;
#endif
}

void tx_stream_wait(void *waiter, void *signaller, void *event) {
  tx_event_record(event, signaller);
  tx_event_wait(waiter, event);
}

int tx_dev_ignore_other_captures(void) {
#ifdef CGT_HAVE_CUDA
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  if (mode == cudaStreamCaptureModeRelaxed) { /* looser still (PyTorch's guard around some calls): never tighten it */
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess)
      (void)cudaGetLastError();
    return -1;
  }
  return (int)mode;
#else
  return -1;
#endif
}

void tx_dev_heed_other_captures(int saved) {
#ifdef CGT_HAVE_CUDA
  if (saved < 0)
    return;
  enum cudaStreamCaptureMode mode = (enum cudaStreamCaptureMode)saved;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess)
    (void)cudaGetLastError();
#else
  (void)saved;
#endif
}

/* ------------------------------------------- the stream-ordered pools */

#ifdef CGT_HAVE_CUDA
enum { MAX_POOL_DEVICES = 64 };
static cudaMemPool_t pools[MAX_POOL_DEVICES];

/* The device's default pool, its release threshold set once: what the
 * pool keeps cached for reuse when the device synchronises. */
static cudaMemPool_t pool_of(int device, uint64_t keep_bytes, cudaError_t *error) {
  if (device < 0 || device >= MAX_POOL_DEVICES) {
    *error = cudaErrorInvalidDevice;
    return NULL;
  }
  if (!pools[device]) {
    cudaMemPool_t p = NULL;
    if ((*error = cudaDeviceGetDefaultMemPool(&p, device)) != cudaSuccess) {
      (void)cudaGetLastError();
      return NULL;
    }
    (void)cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep_bytes);
    pools[device] = p;
  }
  return pools[device];
}

/* Runs with `device` current; stream 0 is the legacy stream of the
 * current device, so the device must be right even for it. */
#define WITH_DEVICE(device, body)                                                                                 \
  do {                                                                                                            \
    int cur_ = -1;                                                                                                \
    cudaGetDevice(&cur_);                                                                                         \
    if (cur_ != (device))                                                                                         \
      cudaSetDevice(device);                                                                                      \
    body;                                                                                                         \
    if (cur_ != (device) && cur_ >= 0)                                                                            \
      cudaSetDevice(cur_);                                                                                        \
  } while (0)
#endif

/* Why this thread's last tx_dev_pool_alloc failed (a cudaError_t), 0 if it
 * did not: out of memory, or a cause that must not read as it
 * (tx_dev_error_is_memory). */
static _Thread_local int tls_pool_error;
#ifdef CGT_HAVE_CUDA
_Static_assert(cudaErrorMemoryAllocation == TX_ERR_OUT_OF_MEMORY, "ext.h's TX_ERR_OUT_OF_MEMORY is CUDA's own");
#endif
/* The simulator's next sim_pool_failures pool allocations fail with
 * sim_pool_error (a test's, on one thread). */
static int sim_pool_error, sim_pool_failures;

int tx_dev_pool_error(void) { return tls_pool_error; }

void tx_dev_sim_fail_pool_allocs(int error, int count) {
  sim_pool_error = error;
  sim_pool_failures = count;
}

/* CUDA's codes (driver_types.h; its ABI): an error names a cause that is
 * not memory if it is a capture error, one that loses the context (a
 * kernel's illegal address, assert or launch failure: every later call
 * fails with it), or a device, driver or stream that is not there. Any
 * other code reads as out of memory, as every refusal did before: a huge
 * request may come back with an odd code, and PyTorch calls that out of
 * memory too. */
#ifdef CGT_HAVE_CUDA
_Static_assert(cudaErrorIllegalAddress == 700 && cudaErrorLaunchFailure == 719 &&
                   cudaErrorInvalidResourceHandle == 400 && cudaErrorStreamCaptureUnsupported == 900 &&
                   cudaErrorStreamCaptureWrongThread == 908,
               "CUDA's error codes as tx_dev_error_is_memory reads them");
#endif
int tx_dev_error_is_memory(int error) {
  switch (error) {
  case 3:   /* cudaErrorInitializationError */
  case 4:   /* cudaErrorCudartUnloading */
  case 35:  /* cudaErrorInsufficientDriver */
  case 100: /* cudaErrorNoDevice */
  case 101: /* cudaErrorInvalidDevice */
  case 214: /* cudaErrorECCUncorrectable */
  case 400: /* cudaErrorInvalidResourceHandle: a stream destroyed under us */
  case 700: /* cudaErrorIllegalAddress, and below, the other errors that lose the context */
  case 702:
  case 709:
  case 710:
  case 714:
  case 715:
  case 716:
  case 717:
  case 718:
  case 719:
    return 0;
  default:
    return error < 900 || error > 908; /* cudaErrorStreamCaptureUnsupported ... cudaErrorStreamCaptureWrongThread */
  }
}

const char *tx_dev_error_text(int error) {
#ifdef CGT_HAVE_CUDA
  return cudaGetErrorString((cudaError_t)error);
#else
  (void)error;
  return "a CUDA error (this build has no CUDA to name it)";
#endif
}

void *tx_dev_pool_alloc(size_t bytes, int device, void *stream, uint64_t keep_bytes) {
#ifdef CGT_HAVE_CUDA
  if (device >= 0) {
    cudaError_t e = cudaSuccess;
    cudaMemPool_t pool = pool_of(device, keep_bytes, &e);
    void *p = NULL;
    if (!pool) {
      tls_pool_error = (int)e;
      return NULL;
    }
    int mode = tx_dev_ignore_other_captures();
    WITH_DEVICE(device, e = cudaMallocFromPoolAsync(&p, bytes, pool, (cudaStream_t)stream));
    tx_dev_heed_other_captures(mode);
    tls_pool_error = (int)e;
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* out of memory is not sticky: clear it for PyTorch's own checks */
      return NULL;
    }
    return p;
  }
#endif
  (void)stream;
  (void)keep_bytes;
  (void)device;
  if (sim_pool_failures > 0) {
    sim_pool_failures--;
    tls_pool_error = sim_pool_error;
    return NULL;
  }
  void *p = malloc(bytes); /* the simulator's device memory: sim_fail_pool_allocs fails it */
  tls_pool_error = p ? 0 : TX_ERR_OUT_OF_MEMORY;
  return p;
}

void tx_dev_pool_free(void *p, int device, void *stream) {
#ifdef CGT_HAVE_CUDA
  if (device >= 0) {
    int mode = tx_dev_ignore_other_captures();
    WITH_DEVICE(device, (void)cudaFreeAsync(p, (cudaStream_t)stream));
    tx_dev_heed_other_captures(mode);
    return;
  }
#endif
  (void)device;
  (void)stream;
  free(p);
}

void tx_dev_pool_trim(int device, int may_sync) {
#ifdef CGT_HAVE_CUDA
  if (device >= 0 && device < MAX_POOL_DEVICES && pools[device]) {
    /* Frees enqueued on streams become free pool memory once the work
     * before them is done: wait for it, then give all of it back. Without
     * the wait, what is free already. */
    int mode = tx_dev_ignore_other_captures();
    WITH_DEVICE(device, {
      if (may_sync)
        (void)cudaDeviceSynchronize();
      (void)cudaMemPoolTrimTo(pools[device], 0);
    });
    (void)cudaGetLastError();
    tx_dev_heed_other_captures(mode);
  }
#else
  (void)device;
  (void)may_sync;
#endif
}

/* The simulator's captures (device -1): a few streams a test says capture. */
enum { SIM_CAPTURES = 8 };
static struct {
  void *stream;
  unsigned long long id;
} sim_captures[SIM_CAPTURES];

int tx_dev_sim_set_capture(void *stream, unsigned long long id) {
  for (int i = 0; i < SIM_CAPTURES; i++)
    if (sim_captures[i].stream == stream && sim_captures[i].id) {
      sim_captures[i].id = id; /* 0 ends it */
      return 1;
    }
  for (int i = 0; id && i < SIM_CAPTURES; i++)
    if (!sim_captures[i].id) {
      sim_captures[i].stream = stream;
      sim_captures[i].id = id;
      return 1;
    }
  return !id;
}

unsigned long long tx_dev_capture_id(int device, void *stream) {
  if (!stream)
    return 0; /* the legacy default stream never captures; asking it during another thread's capture could fail it */
  if (device < 0) {
    for (int i = 0; i < SIM_CAPTURES; i++)
      if (sim_captures[i].id && sim_captures[i].stream == stream)
        return sim_captures[i].id;
    return 0;
  }
#ifdef CGT_HAVE_CUDA
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo((cudaStream_t)stream, &status, &id, NULL, NULL, NULL, NULL) != cudaSuccess) {
    (void)cudaGetLastError();
    return TX_CAPTURE_UNKNOWN; /* cannot tell: callers take it for a capture, the safe side for each */
  }
  if (status == cudaStreamCaptureStatusNone)
    return 0;
  return id && id != TX_CAPTURE_UNKNOWN ? id : 1;
#else
  return 0;
#endif
}

int tx_dev_pool_figures(int device, size_t *reserved, size_t *reserved_peak) {
#ifdef CGT_HAVE_CUDA
  if (device >= 0 && device < MAX_POOL_DEVICES && pools[device]) {
    uint64_t r = 0, rp = 0;
    int mode = tx_dev_ignore_other_captures(); /* asking a pool is one of the calls a capture forbids */
    int ok = cudaMemPoolGetAttribute(pools[device], cudaMemPoolAttrReservedMemCurrent, &r) == cudaSuccess &&
             cudaMemPoolGetAttribute(pools[device], cudaMemPoolAttrReservedMemHigh, &rp) == cudaSuccess;
    tx_dev_heed_other_captures(mode);
    if (!ok) {
      (void)cudaGetLastError();
      return 0;
    }
    *reserved = (size_t)r;
    *reserved_peak = (size_t)rp;
    return 1;
  }
#endif
  (void)device;
  (void)reserved;
  (void)reserved_peak;
  return 0;
}

void tx_dev_pool_reset_peaks(void) {
#ifdef CGT_HAVE_CUDA
  int mode = tx_dev_ignore_other_captures();
  for (int d = 0; d < MAX_POOL_DEVICES; d++) {
    uint64_t zero = 0; /* the only value CUDA takes: the mark restarts from the current reservation */
    if (pools[d] && cudaMemPoolSetAttribute(pools[d], cudaMemPoolAttrReservedMemHigh, &zero) != cudaSuccess)
      (void)cudaGetLastError();
  }
  tx_dev_heed_other_captures(mode);
#endif
}

void *tx_dev_stream_create(int device) {
#ifdef CGT_HAVE_CUDA
  cudaStream_t s = NULL;
  cudaError_t e = cudaSuccess;
  WITH_DEVICE(device, e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return s;
#else
  (void)device;
  return NULL;
#endif
}

void tx_dev_stream_destroy(void *stream, int device) {
#ifdef CGT_HAVE_CUDA
  if (stream) {
    int mode = tx_dev_ignore_other_captures(); /* another thread's capture stays whole */
    WITH_DEVICE(device, {
      (void)cudaStreamSynchronize((cudaStream_t)stream);
      (void)cudaStreamDestroy((cudaStream_t)stream);
    });
    (void)cudaGetLastError();
    tx_dev_heed_other_captures(mode);
  }
#else
  (void)stream;
  (void)device;
#endif
}

int tx_dev_sync_stream_reading(const void *ptr, void *stream) {
#ifdef CGT_HAVE_CUDA
  struct cudaPointerAttributes a;
  int done = 0;
  int mode = tx_dev_ignore_other_captures();
  if (cudaPointerGetAttributes(&a, ptr) == cudaSuccess && a.type == cudaMemoryTypeDevice && a.device >= 0 &&
      tx_dev_capture_id(a.device, stream) == 0)
    WITH_DEVICE(a.device, done = cudaStreamSynchronize((cudaStream_t)stream) == cudaSuccess);
  (void)cudaGetLastError();
  tx_dev_heed_other_captures(mode);
  return done;
#else
  (void)ptr;
  (void)stream;
  return 0;
#endif
}

int tx_dev_stream_device(void *stream) {
#if defined(CGT_HAVE_CUDA) && CUDART_VERSION >= 12080
  int device = -1;
  if (!stream) /* the legacy default stream: every device has one, and its handle does not say whose */
    return -1;
  int mode = tx_dev_ignore_other_captures();
  if (cudaStreamGetDevice((cudaStream_t)stream, &device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  tx_dev_heed_other_captures(mode);
  return device;
#else
  (void)stream;
  return -1;
#endif
}

void *tx_event_create_on(int device, int record_on_legacy) {
#ifdef CGT_HAVE_CUDA
  void *e = NULL;
  WITH_DEVICE(device, {
    e = tx_event_create();
    if (e && record_on_legacy)
      tx_event_record(e, NULL);
  });
  return e;
#else
  (void)device;
  (void)record_on_legacy;
  return NULL;
#endif
}

void tx_dev_stream_after(void *waiter, void *signaller, int device) {
#ifdef CGT_HAVE_CUDA
  if (device < 0 || waiter == signaller)
    return;
  int mode = tx_dev_ignore_other_captures();
  WITH_DEVICE(device, {
    void *e = tx_event_create();
    if (e) {
      tx_stream_wait(waiter, signaller, e);
      tx_event_destroy(e); /* released once the wait is done */
    } else {
      cudaStreamSynchronize((cudaStream_t)signaller); /* no event: the slow way, still ordered */
    }
  });
  tx_dev_heed_other_captures(mode);
#else
  (void)waiter;
  (void)signaller;
  (void)device;
#endif
}

/* ------------------------------------------- frees inside another's capture */

/* A block a capture not ours allocated (torch.cuda.graph's temporaries),
 * freed while that capture is open. cudaFreeAsync on the block's stream
 * would make the free that stream's next captured work, and a capture that
 * forked to a side stream, allocated there and joined back before Python
 * dropped the temporary would then end with that stream's work unjoined:
 * cudaStreamEndCapture fails, and torch.cuda.graph raises. (PyTorch's
 * caching allocator makes no CUDA call at such a free; its cudaMallocAsync
 * backend fails the same way.) So the free becomes a node of the capture's
 * graph (cudaGraphAddMemFreeNode on the graph cudaStreamGetCaptureInfo
 * names, which CUDA allows during a capture), depending on the current work
 * of the block's stream and of its recorded streams in that capture: after
 * every use the program declared, as a free on the stream after waiting
 * for them would be, but no stream's dependencies change, so nothing is
 * left to join. Nothing depends on the node: the graph reuses that memory
 * for no later allocation of its own, which costs the graph the block's
 * size at most. Only the capturing thread frees so (eager.c, give_back):
 * CUDA's graphs are not thread-safe, and that thread's capture adds nodes
 * to the same graph; another thread's free goes on the stream. */
#ifdef CGT_HAVE_CUDA
/* Appends stream's current capture dependencies to *deps (grown as needed):
 * 1 if stream captures `capture`, 0 if not, -1 out of host memory. */
static int capture_deps_add(void *stream, unsigned long long capture, cudaGraph_t *graph, cudaGraphNode_t **deps,
                            size_t *n, size_t *cap) {
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t g = NULL;
  const cudaGraphNode_t *d = NULL;
  size_t nd = 0;
  if (!stream || cudaStreamGetCaptureInfo((cudaStream_t)stream, &status, &id, &g, &d, NULL, &nd) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (status != cudaStreamCaptureStatusActive || id != capture)
    return 0;
  if (*n + nd > *cap) {
    size_t grown_cap = 2 * (*n + nd) + 4;
    cudaGraphNode_t *grown = tx_realloc(*deps, grown_cap * sizeof *grown);
    if (!grown)
      return -1;
    *deps = grown;
    *cap = grown_cap;
  }
  for (size_t i = 0; i < nd; i++) {
    int known = 0;
    for (size_t j = 0; j < *n && !known; j++)
      known = (*deps)[j] == d[i];
    if (!known)
      (*deps)[(*n)++] = d[i];
  }
  *graph = g;
  return 1;
}
#endif

int tx_dev_capture_free(void *p, int device, void *stream, void *const *also, size_t n_also,
                        unsigned long long capture) {
#ifdef CGT_HAVE_CUDA
  if (device < 0 || !capture)
    return 0;
  cudaGraph_t graph = NULL, other = NULL;
  cudaGraphNode_t *deps = NULL, node = NULL;
  size_t n = 0, cap = 0;
  int done = 0;
  int mode = tx_dev_ignore_other_captures();
  WITH_DEVICE(device, {
    if (capture_deps_add(stream, capture, &graph, &deps, &n, &cap) == 1) {
      int ok = 1;
      for (size_t i = 0; i < n_also && ok; i++) /* a recorded stream in the same capture: after its work too */
        ok = capture_deps_add(also[i], capture, &other, &deps, &n, &cap) >= 0;
      if (ok && cudaGraphAddMemFreeNode(&node, graph, deps, n, p) == cudaSuccess)
        done = 1;
      else
        (void)cudaGetLastError();
    }
  });
  tx_dev_heed_other_captures(mode);
  free(deps);
  return done;
#else
  (void)p;
  (void)device;
  (void)stream;
  (void)also;
  (void)n_also;
  (void)capture;
  return 0;
#endif
}
