/* kernels_cuda.cu — the kernels of kernels.h on CUDA.
 *
 * The element-wise kernels are plain grid-stride loops: they are tiny on
 * purpose, so that the benchmarks measure launch and replay costs rather
 * than arithmetic. sum is one block with a fixed reduction tree, so its
 * result depends on n alone and not on scheduling: the tests compare
 * replays with eager runs bit for bit. gemm is cuBLAS in its default math
 * mode (no TF32), on a handle bound to the caller's stream.
 *
 * Everything is callable from C (extern "C" through kernels.h) and returns a
 * cgt_status. CUDA reports launch failures through its thread-wide last
 * error; every launch is followed by cudaGetLastError, which both checks and
 * clears it, so no failure of ours is left for the caller to trip over.
 *
 * The careless helpers are meant to be called inside segments to show what
 * breaks a capture; the caller-owned buffer helpers (dev_alloc, upload,
 * download) are meant for setup outside any segment.
 */
#include <stdio.h>

#include <new>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels.h"

struct kern_ctx {
  cublasHandle_t blas;
  cudaStream_t blas_stream; /* the stream the handle is bound to now */
  cudaStream_t side;        /* fork_join's second stream */
  cudaEvent_t fork, join;
};

static thread_local char cuda_error[256];

static const char *cuda_last_error(void) { return cuda_error; }

/* Capture errors are told apart: a careless segment's later kernels fail
 * with them, and the tree treats the run as a capture failure. */
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

static cgt_status cuda_fail(const char *what, cudaError_t e) {
  snprintf(cuda_error, sizeof cuda_error, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
  (void)cudaGetLastError();
  return status_of(e);
}

/* cuBLAS reports its own status; the CUDA error underneath, if any, says
 * whether a broken capture was the cause. */
static cgt_status blas_fail(const char *what, cublasStatus_t s) {
  cudaError_t e = cudaGetLastError();
  snprintf(cuda_error, sizeof cuda_error, "%s: %s: %s (CUDA: %s)", what, cublasGetStatusName(s),
           cublasGetStatusString(s), cudaGetErrorName(e));
  if (e != cudaSuccess && status_of(e) != CGT_ERR_BACKEND)
    return status_of(e);
  return s == CUBLAS_STATUS_ALLOC_FAILED ? CGT_ERR_OUT_OF_MEMORY : CGT_ERR_BACKEND;
}

static cgt_status check(const char *what, cudaError_t e) { return e == cudaSuccess ? CGT_OK : cuda_fail(what, e); }

/* A launch reports its configuration errors through the last error. */
static cgt_status check_launch(const char *what) { return check(what, cudaGetLastError()); }

static const unsigned threads_per_block = 256;

/* Enough blocks to cover n once, capped: the loops stride over the rest. */
static unsigned blocks_for(size_t n) {
  size_t blocks = (n + threads_per_block - 1) / threads_per_block;
  return (unsigned)(blocks < 4096 ? blocks : 4096);
}

/* ------------------------------------------------------------- context */

static void destroy_ctx_parts(kern_ctx *c) {
  if (c->blas != NULL)
    (void)cublasDestroy(c->blas);
  if (c->side != NULL) {
    (void)cudaStreamSynchronize(c->side);
    (void)cudaStreamDestroy(c->side);
  }
  if (c->fork != NULL)
    (void)cudaEventDestroy(c->fork);
  if (c->join != NULL)
    (void)cudaEventDestroy(c->join);
  (void)cudaGetLastError();
}

static cgt_status cuda_ctx_create(void *stream, kern_ctx **out) {
  if (out == NULL) {
    snprintf(cuda_error, sizeof cuda_error, "ctx_create: NULL out");
    return CGT_ERR_INVALID_ARGUMENT;
  }
  kern_ctx *c = new (std::nothrow) kern_ctx();
  if (c == NULL) {
    snprintf(cuda_error, sizeof cuda_error, "ctx_create: out of host memory");
    return CGT_ERR_OUT_OF_MEMORY;
  }
  cgt_status s = CGT_OK;
  cublasStatus_t bs = cublasCreate(&c->blas);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    c->blas = NULL;
    s = blas_fail("cublasCreate", bs);
  }
  c->blas_stream = (cudaStream_t)stream;
  if (s == CGT_OK && (bs = cublasSetStream(c->blas, c->blas_stream)) != CUBLAS_STATUS_SUCCESS)
    s = blas_fail("cublasSetStream", bs);
  /* Default math: fp32 stays fp32 (no TF32), as in the anchors. */
  if (s == CGT_OK && (bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS)
    s = blas_fail("cublasSetMathMode", bs);
  /* Non-blocking like the tree's stream, so that a capture on it never
   * forbids other code's use of the legacy stream. */
  if (s == CGT_OK)
    s = check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking));
  if (s == CGT_OK)
    s = check("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&c->fork, cudaEventDisableTiming));
  if (s == CGT_OK)
    s = check("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&c->join, cudaEventDisableTiming));
  if (s != CGT_OK) {
    destroy_ctx_parts(c);
    delete c;
    return s;
  }
  *out = c;
  return CGT_OK;
}

static void cuda_ctx_destroy(kern_ctx *c) {
  if (c == NULL)
    return;
  destroy_ctx_parts(c);
  delete c;
}

/* ------------------------------------------------------ caller buffers */

static cgt_status cuda_dev_alloc(size_t bytes, void **ptr) {
  if (ptr == NULL) {
    snprintf(cuda_error, sizeof cuda_error, "dev_alloc: NULL ptr");
    return CGT_ERR_INVALID_ARGUMENT;
  }
  void *p = NULL;
  cgt_status s = check("cudaMalloc", cudaMalloc(&p, bytes == 0 ? 256 : bytes));
  if (s == CGT_OK)
    *ptr = p;
  return s;
}

static void cuda_dev_free(void *ptr) {
  if (ptr != NULL && cudaFree(ptr) != cudaSuccess)
    (void)cudaGetLastError();
}

/* A synchronous copy from pageable memory may return before the DMA has
 * landed, and kernels on a non-blocking stream do not wait for it: the
 * device-wide sync makes "synchronous" mean what the caller expects. */
static cgt_status cuda_upload(void *dst_dev, const void *src_host, size_t bytes) {
  if (bytes == 0)
    return CGT_OK;
  cgt_status s = check("cudaMemcpy", cudaMemcpy(dst_dev, src_host, bytes, cudaMemcpyHostToDevice));
  if (s == CGT_OK)
    s = check("cudaDeviceSynchronize", cudaDeviceSynchronize());
  return s;
}

static cgt_status cuda_download(void *dst_host, const void *src_dev, size_t bytes) {
  if (bytes == 0)
    return CGT_OK;
  return check("cudaMemcpy", cudaMemcpy(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost));
}

/* ------------------------------------------------------------- kernels */

static __global__ void fill_kernel(float *dst, float value, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x)
    dst[i] = value;
}

static __global__ void affine_kernel(const float *x, float a, float b, float *out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x)
    out[i] = a * x[i] + b;
}

static __global__ void add_kernel(const float *x, const float *y, float *out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x)
    out[i] = x[i] + y[i];
}

static __global__ void relu_kernel(const float *x, float *out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x)
    out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* One block of SUM_THREADS threads: thread t adds elements t, t+256, ... in
 * order, then a fixed binary tree adds the partial sums. */
#define SUM_THREADS 256
static __global__ void sum_kernel(const float *x, size_t n, float *out) {
  __shared__ float partial[SUM_THREADS];
  float acc = 0.0f;
  for (size_t i = threadIdx.x; i < n; i += SUM_THREADS)
    acc += x[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = SUM_THREADS / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    out[0] = partial[0];
}

static cgt_status cuda_fill(void *stream, float *dst, float value, size_t n) {
  if (n == 0)
    return CGT_OK;
  fill_kernel<<<blocks_for(n), threads_per_block, 0, (cudaStream_t)stream>>>(dst, value, n);
  return check_launch("fill_kernel");
}

static cgt_status cuda_affine(void *stream, const float *x, float a, float b, float *out, size_t n) {
  if (n == 0)
    return CGT_OK;
  affine_kernel<<<blocks_for(n), threads_per_block, 0, (cudaStream_t)stream>>>(x, a, b, out, n);
  return check_launch("affine_kernel");
}

static cgt_status cuda_add(void *stream, const float *x, const float *y, float *out, size_t n) {
  if (n == 0)
    return CGT_OK;
  add_kernel<<<blocks_for(n), threads_per_block, 0, (cudaStream_t)stream>>>(x, y, out, n);
  return check_launch("add_kernel");
}

static cgt_status cuda_relu(void *stream, const float *x, float *out, size_t n) {
  if (n == 0)
    return CGT_OK;
  relu_kernel<<<blocks_for(n), threads_per_block, 0, (cudaStream_t)stream>>>(x, out, n);
  return check_launch("relu_kernel");
}

static cgt_status cuda_sum(void *stream, const float *x, size_t n, float *out) {
  sum_kernel<<<1, SUM_THREADS, 0, (cudaStream_t)stream>>>(x, n, out);
  return check_launch("sum_kernel");
}

static cgt_status cuda_copy(void *stream, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return CGT_OK;
  return check("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
}

/* Row-major out = x @ w is column-major out^T = w^T x^T: in cuBLAS's terms,
 * an (n x k) times (k x m) product with no transposes, leading dimensions
 * n, k and n. */
static cgt_status cuda_gemm(kern_ctx *c, void *stream, const float *x, const float *w, float *out, int m, int n, int k,
                            void *workspace, size_t workspace_bytes) {
  if (c == NULL || m < 0 || n < 0 || k < 0) {
    snprintf(cuda_error, sizeof cuda_error, "gemm: %s", c == NULL ? "NULL context" : "negative size");
    return CGT_ERR_INVALID_ARGUMENT;
  }
  if (m == 0 || n == 0)
    return CGT_OK;
  cublasStatus_t bs;
  if (c->blas_stream != (cudaStream_t)stream) {
    if ((bs = cublasSetStream(c->blas, (cudaStream_t)stream)) != CUBLAS_STATUS_SUCCESS)
      return blas_fail("cublasSetStream", bs);
    c->blas_stream = (cudaStream_t)stream;
  }
  /* Set on every call: the previous call's workspace may have been a
   * temporary that the pool has since handed to someone else. A NULL
   * workspace means none, which also keeps cuBLAS off its default pool. */
  if ((bs = cublasSetWorkspace(c->blas, workspace, workspace != NULL ? workspace_bytes : 0)) != CUBLAS_STATUS_SUCCESS)
    return blas_fail("cublasSetWorkspace", bs);
  const float alpha = 1.0f, beta = 0.0f;
  bs = cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, w, n, x, k > 0 ? k : 1, &beta, out, n);
  if (bs != CUBLAS_STATUS_SUCCESS)
    return blas_fail("cublasSgemm", bs);
  return check_launch("cublasSgemm");
}

/* -------------------------------------------------- careless segments */

static cgt_status cuda_illegal_stream_sync(void *stream) {
  return check("cudaStreamSynchronize", cudaStreamSynchronize((cudaStream_t)stream));
}

static cgt_status cuda_illegal_malloc(void *stream) {
  (void)stream;
  void *p = NULL;
  cgt_status s = check("cudaMalloc", cudaMalloc(&p, 256));
  if (s != CGT_OK)
    return s;
  return check("cudaFree", cudaFree(p));
}

static cgt_status cuda_illegal_memcpy(void *stream, void *dst, const void *src, size_t bytes) {
  (void)stream;
  return check("cudaMemcpy", cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

static cgt_status cuda_illegal_device_sync(void *stream) {
  (void)stream;
  return check("cudaDeviceSynchronize", cudaDeviceSynchronize());
}

/* ------------------------------------------------------------ fork/join */

static cgt_status cuda_fork_join(kern_ctx *c, void *stream, const float *x, float *y, size_t n) {
  if (c == NULL) {
    snprintf(cuda_error, sizeof cuda_error, "fork_join: NULL context");
    return CGT_ERR_INVALID_ARGUMENT;
  }
  cudaStream_t s = (cudaStream_t)stream;
  cgt_status st = check("cudaEventRecord(fork)", cudaEventRecord(c->fork, s));
  if (st == CGT_OK)
    st = check("cudaStreamWaitEvent(side)", cudaStreamWaitEvent(c->side, c->fork, 0));
  if (st != CGT_OK)
    return st;
  if (n != 0) {
    affine_kernel<<<blocks_for(n), threads_per_block, 0, c->side>>>(x, 2.0f, 0.0f, y, n);
    st = check_launch("affine_kernel(side)");
  }
  /* Join even after a failed launch: a capture that forked must be joined
   * back, or ending it fails for a second, less telling reason. */
  cgt_status j = check("cudaEventRecord(join)", cudaEventRecord(c->join, c->side));
  if (j == CGT_OK)
    j = check("cudaStreamWaitEvent(main)", cudaStreamWaitEvent(s, c->join, 0));
  if (st != CGT_OK)
    return st;
  if (j != CGT_OK)
    return j;
  return cuda_affine(stream, y, 1.0f, 1.0f, y, n);
}

extern "C" const kernels kernels_cuda = {
    "cuda",
    cuda_ctx_create,
    cuda_ctx_destroy,
    cuda_dev_alloc,
    cuda_dev_free,
    cuda_upload,
    cuda_download,
    cuda_fill,
    cuda_affine,
    cuda_add,
    cuda_relu,
    cuda_sum,
    cuda_copy,
    cuda_gemm,
    cuda_illegal_stream_sync,
    cuda_illegal_malloc,
    cuda_illegal_memcpy,
    cuda_illegal_device_sync,
    cuda_fork_join,
    cuda_last_error,
};
