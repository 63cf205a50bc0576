/* cgtree_sim.h — the simulator backend's kernel-launch API.
 *
 * The simulator is a real backend that runs on the CPU: device memory is host
 * memory, a stream executes work at once, capture records work into a graph,
 * and a graph replays the recorded work with the recorded arguments. Launch
 * functions written for a tree on the simulator enqueue "kernels" with
 * cgt_sim_launch() on the stream that cgt_launch_stream() hands them.
 *
 * The simulator always creates its own stream: a tree on the simulator needs
 * cgt_options.stream == NULL (anything else is CGT_ERR_INVALID_ARGUMENT).
 */
#ifndef CGTREE_SIM_H
#define CGTREE_SIM_H

#include "cgtree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A simulated kernel: args points to a copy of the launch-time bytes. */
typedef void (*cgt_sim_kernel)(void *args);

/* Runs k(args) now, or, while the stream is capturing, records k with a copy
 * of args_bytes bytes of args for every replay. args_bytes may be 0 (args is
 * then passed as NULL). CGT_ERR_INVALID_ARGUMENT for a stream that is not a
 * simulator stream or a NULL kernel. */
CGT_API cgt_status cgt_sim_launch(void *stream, cgt_sim_kernel k, const void *args, size_t args_bytes);

/* Like cudaStreamSynchronize: illegal while capturing, and invalidates the
 * capture exactly as CUDA does (CGT_ERR_STATE; ending the capture then fails). */
CGT_API cgt_status cgt_sim_sync(void *stream);

/* Extension: like cudaMemcpyAsync on the stream; recorded while capturing.
 * A recorded copy keeps the two addresses, so each replay copies what src
 * holds at replay time, as a captured cudaMemcpyAsync does. */
CGT_API cgt_status cgt_sim_memcpy_async(void *stream, void *dst, const void *src, size_t bytes);

/* Extension: like cudaMalloc: illegal while the stream's thread is capturing
 * (invalidates the capture, as CUDA does); outside capture it allocates
 * simulated device memory the caller frees with cgt_sim_free(). */
CGT_API cgt_status cgt_sim_malloc(void *stream, size_t bytes, void **ptr);
/* Like cudaFree, it invalidates a capture in progress (CGT_ERR_STATE, nothing
 * freed). It frees only what cgt_sim_malloc returned (else
 * CGT_ERR_INVALID_ARGUMENT), so user code cannot free the pool's memory. NULL
 * is a no-op. */
CGT_API cgt_status cgt_sim_free(void *stream, void *ptr);

/* Extension, for tests of out-of-memory recovery: the simulated device of tree
 * t refuses allocations that would take its total above limit_bytes (counting
 * pool chunks and cgt_sim_malloc). SIZE_MAX removes the limit.
 * CGT_ERR_INVALID_ARGUMENT if t does not run on the simulator. */
CGT_API cgt_status cgt_sim_set_device_limit(cgt_tree *t, size_t limit_bytes);

#ifdef __cplusplus
}
#endif

#endif /* CGTREE_SIM_H */
