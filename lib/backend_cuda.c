/* backend_cuda.c — the device interface on the CUDA runtime.
 *
 * This is the backend the product runs on. The tree drives it through the
 * small table in backend.h: it asks for pool chunks, brackets each recording
 * with a stream capture, instantiates and uploads the captured graph, and
 * later replays it with one cudaGraphLaunch. The file is plain C11 against
 * the CUDA runtime API; no kernel lives here, so the library builds with gcc
 * alone and only tests, benchmarks and the demo need nvcc.
 *
 * Three things make this more than a list of wrappers.
 *
 * Errors. Every CUDA failure becomes a cgt_status plus one line in b->error
 * naming the call and the CUDA error. CUDA also remembers the failure as the
 * thread's "last error"; a later cudaGetLastError in the user's own code
 * would then report our failure as theirs. So every failure path clears it.
 * Errors that corrupt the context (an illegal address in a kernel) stay
 * sticky whatever we do; those are the user's and are reported as
 * CGT_ERR_BACKEND.
 *
 * Capture failure. A segment that synchronizes, calls cudaMalloc or a
 * synchronous cudaMemcpy while it is being captured invalidates the capture.
 * cudaStreamEndCapture then fails and may hand back a partial graph. We
 * destroy that graph, clear the error, and make sure the stream really left
 * capture mode, so the tree can run the segment eagerly on the same stream
 * right away and record other segments later.
 *
 * Allocation during capture. The pool may need a new chunk while a segment is
 * being recorded. A plain cudaMalloc in thread-local capture mode is refused
 * and invalidates the capture, so chunk allocation switches the thread to
 * relaxed capture mode around the call. The memory is not part of the graph:
 * the pool owns it for the tree's life and the graph only bakes in addresses.
 *
 * Devices. A process may hold one tree per GPU, driven from one thread per
 * device or all from one thread. The current device is per-thread state
 * that belongs to the caller, so open() puts it back after it made the
 * stream, and device_enter/device_leave let the tree run every later call on
 * its own device and then restore the caller's (docs/multi-gpu.md).
 */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include <cuda_runtime.h>

/* NVTX v3 is header-only. Its loader casts dlsym's result to a function
 * pointer, which ISO C forbids and -Wpedantic reports; the cast is fine on
 * every platform CUDA supports, so the warning is silenced for the header
 * alone. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#endif
#include <nvtx3/nvToolsExt.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include "backend.h"

/* What open made, so that close undoes exactly that. */
typedef struct cuda_state {
  int device;
  cudaStream_t stream;
  int owns_stream;
  int fused_repoint; /* how copies inside fused executables are repointed: a FUSED_REPOINT_* */
} cuda_state;

/* Repointing a copy node that sits inside a child graph of a fused
 * executable. DIRECT hands the embedded graph's node to
 * cudaGraphExecMemcpyNodeSetParams1D; CHILD sets the node in the embedded
 * graph and updates the whole child-graph node with
 * cudaGraphExecChildGraphNodeSetParams, which the documentation allows
 * (same topology: it is the very graph the node holds). UNKNOWN tries
 * DIRECT once and keeps whichever works. CGT_FUSED_REPOINT=direct|child
 * forces one, for the benchmark that compares them. */
enum { FUSED_REPOINT_UNKNOWN, FUSED_REPOINT_DIRECT, FUSED_REPOINT_CHILD };

static cuda_state *state_of(backend *b) { return (cuda_state *)b->impl; }

/* The status a CUDA error maps to. Capture errors are told apart because the
 * tree recovers from them (the node runs eagerly), not from the others. */
static cgt_status status_of(cudaError_t e) {
  switch (e) {
  case cudaSuccess:
    return CGT_OK;
  case cudaErrorMemoryAllocation:
    return CGT_ERR_OUT_OF_MEMORY;
  case cudaErrorStreamCaptureUnsupported:
  case cudaErrorStreamCaptureInvalidated:
  case cudaErrorStreamCaptureMerge:
  case cudaErrorStreamCaptureUnmatched:
  case cudaErrorStreamCaptureUnjoined:
  case cudaErrorStreamCaptureIsolation:
  case cudaErrorStreamCaptureImplicit:
  case cudaErrorCapturedEvent:
  case cudaErrorStreamCaptureWrongThread:
    return CGT_ERR_CAPTURE_FAILED;
  default:
    return CGT_ERR_BACKEND;
  }
}

/* Records the failure of `call` in b->error and clears CUDA's last error so
 * that it does not surface later in someone else's check. */
static cgt_status fail(backend *b, const char *call, cudaError_t e) {
  snprintf(b->error, sizeof b->error, "%s: %s: %s", call, cudaGetErrorName(e), cudaGetErrorString(e));
  (void)cudaGetLastError();
  return status_of(e);
}

/* 1 if `device`'s primary context exists, or if we cannot tell. Since CUDA
 * 12, cudaSetDevice creates the context, and a thread that never used CUDA
 * reports device 0 without having a context there: "restoring" device 0
 * would put a context (hundreds of MiB) on GPU 0 in every rank's process.
 * The driver's answer comes through the runtime, so the library does not
 * link libcuda. */
static int device_has_context(int device) {
#if CUDART_VERSION >= 12050
  typedef int (*get_state_fn)(int dev, unsigned int *flags, int *active);
  void *sym = NULL;
  get_state_fn get_state;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &sym, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      sym == NULL || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  memcpy(&get_state, &sym, sizeof get_state); /* ISO C has no cast from void * to a function pointer */
  unsigned int flags = 0;
  int active = 1;
  if (get_state(device, &flags, &active) != 0)
    return 1;
  return active != 0;
#else
  (void)device;
  return 1;
#endif
}

/* Makes `device` current again if it is a device (-1: leave it) whose
 * context exists; otherwise the thread stays where it is. A failure cannot
 * be acted upon by our caller and is cleared. */
static void restore_device(int device) {
  int now = -1;
  if (device < 0)
    return;
  if (cudaGetDevice(&now) == cudaSuccess && now == device)
    return;
  if (device_has_context(device))
    (void)cudaSetDevice(device);
  (void)cudaGetLastError();
}

static cgt_status cuda_open(backend *b, int device, void *stream) {
  cuda_state *st = calloc(1, sizeof *st);
  if (st == NULL) {
    snprintf(b->error, sizeof b->error, "cuda backend: out of host memory");
    return CGT_ERR_OUT_OF_MEMORY;
  }
  /* The caller's current device, put back before we return. Without a
   * driver cudaGetDevice fails; cudaSetDevice then reports why. */
  int prev_device = -1;
  if (cudaGetDevice(&prev_device) != cudaSuccess) {
    prev_device = -1;
    (void)cudaGetLastError();
  }
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    free(st);
    restore_device(prev_device);
    cgt_status s = fail(b, "cudaSetDevice", e);
    /* A missing driver or device is reported the way the API promises. */
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary ||
        e == cudaErrorInvalidDevice)
      return CGT_ERR_NO_DEVICE;
    return s;
  }
  st->device = device;
  if (stream != NULL) {
    st->stream = (cudaStream_t)stream;
  } else {
    /* A blocking stream, on purpose. A segment that calls a synchronous
     * cudaMemcpy (legacy default stream) while a non-blocking stream is
     * captured is not refused by CUDA: the copy runs once, at recording, and
     * is missing from every replay, which is silent corruption. With a
     * blocking stream the legacy stream's implicit synchronization with the
     * capturing stream invalidates the capture, and the node turns EAGER.
     * Programs whose other threads use the legacy stream while we capture
     * can hand in their own cudaStreamNonBlocking stream (options.stream). */
    e = cudaStreamCreateWithFlags(&st->stream, cudaStreamDefault);
    if (e != cudaSuccess) {
      free(st);
      cgt_status s = fail(b, "cudaStreamCreateWithFlags", e);
      restore_device(prev_device);
      return s;
    }
    st->owns_stream = 1;
  }
  const char *repoint = getenv("CGT_FUSED_REPOINT");
  st->fused_repoint = repoint && !strcmp(repoint, "direct")  ? FUSED_REPOINT_DIRECT
                      : repoint && !strcmp(repoint, "child") ? FUSED_REPOINT_CHILD
                                                             : FUSED_REPOINT_UNKNOWN;
  b->impl = st;
  b->stream = (void *)st->stream;
  restore_device(prev_device);
  return CGT_OK;
}

/* Ends a capture that is still open on the stream, dropping what it caught,
 * and leaves no error behind. Used when a capture broke and when the backend
 * closes mid-capture.
 *
 * Nothing of a broken capture may reach the next cudaGetLastError of a
 * segment, in this tree or in another one on this thread: the illegal call's
 * error, the errors of the launches made into the invalidated capture and
 * cudaStreamEndCapture's own are all recorded as the thread's last error.
 * Capture errors are not sticky (they do not corrupt the context), so one
 * cudaGetLastError clears them; a query of the stream first makes it give up
 * anything it still holds for us (a healthy stream answers cudaSuccess or
 * cudaErrorNotReady, and the cudaGetLastError after it clears either way).
 * The loop is bounded because a truly sticky error (a kernel that faulted)
 * cannot be cleared at all; that one is the program's, and every later call
 * reports it. */
static void end_stray_capture(cudaStream_t stream) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g != NULL)
      (void)cudaGraphDestroy(g);
  }
  (void)cudaGetLastError();
  (void)cudaStreamQuery(stream);
  for (int i = 0; i < 4 && cudaGetLastError() != cudaSuccess; i++)
    ;
}

static int cuda_device_enter(backend *b);

static void cuda_close(backend *b) {
  cuda_state *st = state_of(b);
  if (st == NULL)
    return;
  int prev_device = cuda_device_enter(b);
  end_stray_capture(st->stream);
  /* Errors here cannot be acted upon (the tree is going away); they are
   * recorded and cleared so they do not leak into the caller's next check. */
  cudaError_t e = cudaStreamSynchronize(st->stream);
  if (e != cudaSuccess)
    (void)fail(b, "cudaStreamSynchronize", e);
  if (st->owns_stream) {
    e = cudaStreamDestroy(st->stream);
    if (e != cudaSuccess)
      (void)fail(b, "cudaStreamDestroy", e);
  }
  free(st);
  b->impl = NULL;
  b->stream = NULL;
  restore_device(prev_device);
}

/* Runs cudaMalloc or cudaFree on the backend's device in relaxed capture
 * mode. The mode switch is a thread-local flag, cheap enough to do always;
 * doing it always also covers a capture this thread has open on another
 * stream, which would forbid the call just the same. The caller's current
 * device is put back, since pool growth must not change it. */
static cgt_status with_relaxed_capture(backend *b, size_t bytes, void **ptr, void *to_free) {
  cuda_state *st = state_of(b);
  int prev_device = -1;
  cudaError_t e = cudaGetDevice(&prev_device);
  if (e != cudaSuccess)
    return fail(b, "cudaGetDevice", e);
  if (prev_device != st->device) {
    e = cudaSetDevice(st->device);
    if (e != cudaSuccess)
      return fail(b, "cudaSetDevice", e);
  }
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  e = cudaThreadExchangeStreamCaptureMode(&mode);
  cgt_status s = CGT_OK;
  if (e != cudaSuccess) {
    s = fail(b, "cudaThreadExchangeStreamCaptureMode", e);
  } else {
    if (ptr != NULL) {
      void *p = NULL;
      e = cudaMalloc(&p, bytes);
      if (e == cudaSuccess)
        *ptr = p;
      else
        s = fail(b, "cudaMalloc", e);
    } else {
      e = cudaFree(to_free);
      if (e != cudaSuccess)
        s = fail(b, "cudaFree", e);
    }
    /* Restore the caller's mode (it was swapped into `mode`). */
    e = cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess && s == CGT_OK) {
      if (ptr != NULL) {
        (void)cudaFree(*ptr);
        *ptr = NULL;
      }
      s = fail(b, "cudaThreadExchangeStreamCaptureMode", e);
    }
  }
  if (prev_device != st->device) {
    e = cudaSetDevice(prev_device);
    if (e != cudaSuccess && s == CGT_OK) {
      if (ptr != NULL) {
        (void)cudaFree(*ptr);
        *ptr = NULL;
      }
      s = fail(b, "cudaSetDevice", e);
    }
  }
  return s;
}

static cgt_status cuda_mem_alloc(backend *b, size_t bytes, void **ptr) {
  if (ptr == NULL || bytes == 0) {
    snprintf(b->error, sizeof b->error, "cuda mem_alloc: %s", ptr == NULL ? "NULL ptr" : "zero bytes");
    return CGT_ERR_INVALID_ARGUMENT;
  }
  /* cudaMalloc aligns to at least 256 bytes, which is what pool chunks need. */
  return with_relaxed_capture(b, bytes, ptr, NULL);
}

static void cuda_mem_free(backend *b, void *ptr) {
  if (ptr != NULL)
    (void)with_relaxed_capture(b, 0, NULL, ptr);
}

static cgt_status cuda_capture_begin(backend *b) {
  /* Thread-local mode: other threads' unsafe calls (their own cudaMalloc)
   * must not break our capture, but this thread's must, so that a careless
   * segment is caught and run eagerly instead of recorded wrongly. */
  cudaError_t e = cudaStreamBeginCapture(state_of(b)->stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    (void)fail(b, "cudaStreamBeginCapture", e);
    /* Whatever the cause, the tree's remedy is the same: run eagerly. */
    return CGT_ERR_CAPTURE_FAILED;
  }
  return CGT_OK;
}

static cgt_status cuda_capture_end(backend *b, void **graph) {
  cuda_state *st = state_of(b);
  cudaGraph_t g = NULL;
  /* The call that broke a capture returned its error to the segment; if the
   * segment did not clear it, it names the cause better than EndCapture. */
  cudaError_t cause = cudaGetLastError();
  cudaError_t e = cudaStreamEndCapture(st->stream, &g);
  if (e == cudaSuccess && g != NULL) {
    *graph = (void *)g;
    return CGT_OK;
  }
  *graph = NULL;
  /* The capture was invalidated (the segment synchronized, allocated, or
   * copied synchronously) or failed to end. A partial graph may have come
   * back; it is useless. */
  if (g != NULL)
    (void)cudaGraphDestroy(g);
  /* Every path below ends in end_stray_capture, which leaves the thread
   * without a CUDA error: the tree runs the segment eagerly next, and its
   * own error checks must see a clean slate. */
  if (e != cudaSuccess && cause != cudaSuccess && cause != e)
    snprintf(b->error, sizeof b->error, "%s (%s) during capture; cudaStreamEndCapture: %s", cudaGetErrorName(cause),
             cudaGetErrorString(cause), cudaGetErrorName(e));
  else if (e != cudaSuccess)
    (void)fail(b, "cudaStreamEndCapture", e);
  else
    snprintf(b->error, sizeof b->error, "cudaStreamEndCapture: returned no graph");
  end_stray_capture(st->stream);
  return CGT_ERR_CAPTURE_FAILED;
}

static cgt_status cuda_instantiate(backend *b, void *graph, void **exec) {
  cudaGraphExec_t ex = NULL;
  cudaError_t e = cudaGraphInstantiate(&ex, (cudaGraph_t)graph, 0);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphInstantiate", e);
  /* Upload now so the first replay does not pay for it. */
  e = cudaGraphUpload(ex, state_of(b)->stream);
  if (e != cudaSuccess) {
    cgt_status s = fail(b, "cudaGraphUpload", e);
    (void)cudaGraphExecDestroy(ex);
    (void)cudaGetLastError();
    return s;
  }
  *exec = (void *)ex;
  return CGT_OK;
}

/* Update in place: cudaGraphExecUpdate (the CUDA 12+ signature, with
 * cudaGraphExecUpdateResultInfo) takes the new graph's parameters when its
 * topology is the executable's. A refusal leaves the executable as it was;
 * its error is cleared so that it does not surface in someone else's check.
 * The executable is uploaded again, as instantiate does, so that the first
 * replay after an update does not pay for it either. */
static cgt_status cuda_exec_update(backend *b, void *exec, void *graph) {
  cudaGraphExecUpdateResultInfo info;
  memset(&info, 0, sizeof info);
  cudaError_t e = cudaGraphExecUpdate((cudaGraphExec_t)exec, (cudaGraph_t)graph, &info);
  if (e != cudaSuccess) {
    snprintf(b->error, sizeof b->error, "cudaGraphExecUpdate: %s (update result %d)", cudaGetErrorName(e),
             (int)info.result);
    (void)cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? CGT_ERR_OUT_OF_MEMORY : CGT_ERR_STATE;
  }
  e = cudaGraphUpload((cudaGraphExec_t)exec, state_of(b)->stream);
  if (e != cudaSuccess)
    (void)fail(b, "cudaGraphUpload (after an update)", e); /* the first launch uploads instead */
  return CGT_OK;
}

/* No API tells an executable's size: count its nodes, at an estimated
 * kibibyte of driver and device state each. */
static size_t cuda_graph_bytes(backend *b, void *graph) {
  size_t n = 0;
  cudaError_t e = cudaGraphGetNodes((cudaGraph_t)graph, NULL, &n);
  if (e != cudaSuccess) {
    (void)fail(b, "cudaGraphGetNodes", e);
    return 0;
  }
  return (n + 1) * 1024;
}

static cgt_status cuda_launch(backend *b, void *exec) {
  cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, state_of(b)->stream);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphLaunch", e);
  return CGT_OK;
}

static void cuda_graph_destroy(backend *b, void *graph, void *exec) {
  cudaError_t e;
  if (exec != NULL && (e = cudaGraphExecDestroy((cudaGraphExec_t)exec)) != cudaSuccess)
    (void)fail(b, "cudaGraphExecDestroy", e);
  if (graph != NULL && (e = cudaGraphDestroy((cudaGraph_t)graph)) != cudaSuccess)
    (void)fail(b, "cudaGraphDestroy", e);
}

static cgt_status cuda_copy(backend *b, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return CGT_OK;
  /* cudaMemcpyDefault: unified addressing tells host from device, so one
   * call serves placeholders (device to device) and copy-out to the host. */
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, state_of(b)->stream);
  if (e != cudaSuccess)
    return fail(b, "cudaMemcpyAsync", e);
  return CGT_OK;
}

static cgt_status cuda_sync(backend *b) {
  cudaError_t e = cudaStreamSynchronize(state_of(b)->stream);
  if (e != cudaSuccess)
    return fail(b, "cudaStreamSynchronize", e);
  return CGT_OK;
}

static cgt_status cuda_graph_dot(backend *b, void *graph, const char *path) {
  cudaError_t e = cudaGraphDebugDotPrint((cudaGraph_t)graph, path, cudaGraphDebugDotFlagsVerbose);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphDebugDotPrint", e);
  return CGT_OK;
}

/* In-graph input copies. The tree captures each DYNAMIC argument's copy
 * into its placeholder as a memcpy node; a replay with the argument at a new
 * address points that node at the new source with
 * cudaGraphExecMemcpyNodeSetParams1D (about a microsecond of host time, the
 * anchors' beyond.cu measured the kernel-node equivalent) instead of a
 * separate cudaMemcpyAsync before the launch (several microseconds); a replay
 * at the same address costs nothing extra at all. */
static cgt_status cuda_graph_find_copy(backend *b, void *graph, const void *dst, void **node) {
  size_t n = 0;
  cudaError_t e = cudaGraphGetNodes((cudaGraph_t)graph, NULL, &n);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphGetNodes", e);
  cudaGraphNode_t *nodes = calloc(n ? n : 1, sizeof *nodes);
  if (nodes == NULL) {
    snprintf(b->error, sizeof b->error, "cuda backend: out of host memory");
    return CGT_ERR_OUT_OF_MEMORY;
  }
  e = cudaGraphGetNodes((cudaGraph_t)graph, nodes, &n);
  cgt_status found = CGT_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; e == cudaSuccess && i < n && found != CGT_OK; i++) {
    enum cudaGraphNodeType type;
    struct cudaMemcpy3DParms p;
    if (cudaGraphNodeGetType(nodes[i], &type) != cudaSuccess || type != cudaGraphNodeTypeMemcpy)
      continue;
    memset(&p, 0, sizeof p);
    if (cudaGraphMemcpyNodeGetParams(nodes[i], &p) == cudaSuccess && p.dstPtr.ptr == dst) {
      *node = (void *)nodes[i];
      found = CGT_OK;
    }
  }
  free(nodes);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphGetNodes", e);
  if (found != CGT_OK)
    snprintf(b->error, sizeof b->error, "the graph has no memcpy node into %p", (void *)(uintptr_t)dst);
  (void)cudaGetLastError();
  return found;
}

static cgt_status cuda_exec_set_copy_src(backend *b, void *exec, void *node, void *dst, const void *src,
                                         size_t bytes) {
  cudaError_t e = cudaGraphExecMemcpyNodeSetParams1D((cudaGraphExec_t)exec, (cudaGraphNode_t)node, dst, src, bytes,
                                                     cudaMemcpyDefault);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphExecMemcpyNodeSetParams1D", e);
  return CGT_OK;
}

static cgt_status cuda_exec_copy_enable(backend *b, void *exec, void *node, int enabled) {
  cudaError_t e = cudaGraphNodeSetEnabled((cudaGraphExec_t)exec, (cudaGraphNode_t)node, enabled ? 1u : 0u);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphNodeSetEnabled", e);
  return CGT_OK;
}

/* Fused executables: a graph whose nodes are child-graph nodes, one per
 * part, each depending on the one before, instantiated and uploaded like a
 * recording. cudaGraphAddChildGraphNode clones the part, so the fused
 * executable does not depend on the part's graph living on; the clone is
 * where its copy nodes are found and, on the CHILD path, repointed. */
typedef struct cuda_fused {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  uint32_t n;
  cudaGraphNode_t *parts; /* the child-graph node of each part */
  cudaGraph_t *embedded;  /* the graph each of them holds (owned by the node) */
} cuda_fused;

static void fused_free(backend *b, cuda_fused *f) {
  cudaError_t e;
  if (f->exec != NULL && (e = cudaGraphExecDestroy(f->exec)) != cudaSuccess)
    (void)fail(b, "cudaGraphExecDestroy", e);
  if (f->graph != NULL && (e = cudaGraphDestroy(f->graph)) != cudaSuccess)
    (void)fail(b, "cudaGraphDestroy", e);
  free(f->parts);
  free(f->embedded);
  free(f);
}

static cgt_status cuda_fuse(backend *b, void *const *parts, uint32_t n, void **fused) {
  if (fused == NULL || parts == NULL || n == 0) {
    snprintf(b->error, sizeof b->error, "cuda fuse: needs parts and a result pointer");
    return CGT_ERR_INVALID_ARGUMENT;
  }
  *fused = NULL;
  cuda_fused *f = calloc(1, sizeof *f);
  if (f != NULL) {
    f->parts = calloc(n, sizeof *f->parts);
    f->embedded = calloc(n, sizeof *f->embedded);
  }
  if (f == NULL || f->parts == NULL || f->embedded == NULL) {
    if (f != NULL)
      fused_free(b, f);
    snprintf(b->error, sizeof b->error, "cuda backend: out of host memory");
    return CGT_ERR_OUT_OF_MEMORY;
  }
  f->n = n;
  cgt_status s = CGT_OK;
  cudaError_t e = cudaGraphCreate(&f->graph, 0);
  if (e != cudaSuccess)
    s = fail(b, "cudaGraphCreate", e);
  for (uint32_t i = 0; i < n && s == CGT_OK; i++) {
    e = cudaGraphAddChildGraphNode(&f->parts[i], f->graph, i ? &f->parts[i - 1] : NULL, i ? 1 : 0,
                                   (cudaGraph_t)parts[i]);
    if (e == cudaSuccess)
      e = cudaGraphChildGraphNodeGetGraph(f->parts[i], &f->embedded[i]);
    if (e != cudaSuccess)
      s = fail(b, "cudaGraphAddChildGraphNode", e);
  }
  if (s == CGT_OK && (e = cudaGraphInstantiate(&f->exec, f->graph, 0)) != cudaSuccess)
    s = fail(b, "cudaGraphInstantiate (fused)", e);
  if (s == CGT_OK && (e = cudaGraphUpload(f->exec, state_of(b)->stream)) != cudaSuccess)
    s = fail(b, "cudaGraphUpload (fused)", e);
  if (s != CGT_OK) {
    char why[BACKEND_ERROR_BYTES];
    memcpy(why, b->error, sizeof why);
    fused_free(b, f);
    memcpy(b->error, why, sizeof why);
    (void)cudaGetLastError();
    return s;
  }
  *fused = f;
  return CGT_OK;
}

static cgt_status cuda_fused_find_copy(backend *b, void *fused, uint32_t part, const void *dst, void **node) {
  cuda_fused *f = fused;
  if (f == NULL || part >= f->n) {
    snprintf(b->error, sizeof b->error, "cuda fused_find_copy: no part %u", part);
    return CGT_ERR_INVALID_ARGUMENT;
  }
  return cuda_graph_find_copy(b, (void *)f->embedded[part], dst, node);
}

static cgt_status cuda_fused_set_copy_src(backend *b, void *fused, uint32_t part, void *node, void *dst,
                                          const void *src, size_t bytes) {
  cuda_state *st = state_of(b);
  cuda_fused *f = fused;
  cudaError_t e = cudaSuccess;
  if (st->fused_repoint != FUSED_REPOINT_CHILD) {
    e = cudaGraphExecMemcpyNodeSetParams1D(f->exec, (cudaGraphNode_t)node, dst, src, bytes, cudaMemcpyDefault);
    if (e == cudaSuccess) {
      st->fused_repoint = FUSED_REPOINT_DIRECT;
      return CGT_OK;
    }
    if (st->fused_repoint == FUSED_REPOINT_DIRECT)
      return fail(b, "cudaGraphExecMemcpyNodeSetParams1D (fused)", e);
    (void)cudaGetLastError();
    st->fused_repoint = FUSED_REPOINT_CHILD;
  }
  e = cudaGraphMemcpyNodeSetParams1D((cudaGraphNode_t)node, dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphMemcpyNodeSetParams1D (fused part)", e);
  e = cudaGraphExecChildGraphNodeSetParams(f->exec, f->parts[part], f->embedded[part]);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphExecChildGraphNodeSetParams", e);
  return CGT_OK;
}

static cgt_status cuda_fused_launch(backend *b, void *fused) {
  cudaError_t e = cudaGraphLaunch(((cuda_fused *)fused)->exec, state_of(b)->stream);
  if (e != cudaSuccess)
    return fail(b, "cudaGraphLaunch (fused)", e);
  return CGT_OK;
}

static void cuda_fused_destroy(backend *b, void *fused) {
  if (fused != NULL)
    fused_free(b, fused);
}

/* NVTX ranges cost nothing measurable when no profiler is attached (the
 * first call finds no injection library and later calls are no-ops). */
static void cuda_range_push(backend *b, const char *name) {
  (void)b;
  nvtxRangePushA(name != NULL ? name : "cgtree");
}

static void cuda_range_pop(backend *b) {
  (void)b;
  nvtxRangePop();
}

/* One cudaGetDevice (a thread-local read) when the tree's device is current
 * already, which is the common case: one thread per device. */
static int cuda_device_enter(backend *b) {
  cuda_state *st = state_of(b);
  int prev_device = -1;
  if (st == NULL)
    return -1;
  if (cudaGetDevice(&prev_device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  if (prev_device == st->device)
    return -1;
  if (cudaSetDevice(st->device) != cudaSuccess) {
    /* The work that follows fails on the wrong device and says so. */
    (void)cudaGetLastError();
    return -1;
  }
  return prev_device;
}

static void cuda_device_leave(backend *b, int saved) {
  (void)b;
  restore_device(saved);
}

const backend_ops backend_cuda_ops = {
    .name = "cuda",
    .kind = CGT_BACKEND_CUDA,
    .open = cuda_open,
    .close = cuda_close,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .instantiate = cuda_instantiate,
    .launch = cuda_launch,
    .graph_destroy = cuda_graph_destroy,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .graph_dot = cuda_graph_dot,
    .graph_find_copy = cuda_graph_find_copy,
    .exec_set_copy_src = cuda_exec_set_copy_src,
    .exec_copy_enable = cuda_exec_copy_enable,
    .fuse = cuda_fuse,
    .fused_find_copy = cuda_fused_find_copy,
    .fused_set_copy_src = cuda_fused_set_copy_src,
    .fused_launch = cuda_fused_launch,
    .fused_destroy = cuda_fused_destroy,
    .exec_update = cuda_exec_update,
    .graph_bytes = cuda_graph_bytes,
    .range_push = cuda_range_push,
    .range_pop = cuda_range_pop,
    .device_enter = cuda_device_enter,
    .device_leave = cuda_device_leave,
};

int backend_cuda_available(void) {
  /* Without a driver the runtime returns cudaErrorInsufficientDriver and
   * leaves the count unwritten; with only the stub libcuda it returns
   * cudaErrorStubLibrary; without a GPU, cudaErrorNoDevice. All mean "no". */
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  int driver = 0;
  e = cudaDriverGetVersion(&driver);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count > 0 && driver > 0;
}
