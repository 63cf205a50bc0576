/* workloads.h — the programs that the demo, the benchmarks and the tests run
 * through a tree, defined once.
 *
 * Both are stacks of relu(x @ W) layers with x of B x H and W of H x H, fp32
 * (cuBLAS in default math, no TF32), cut into segments the way a compiler
 * cuts a model at graph breaks:
 *
 *   chain    S segments of L layers each; segment 0 reads the step input, a
 *            DYNAMIC argument (two caller buffers alternate, so its address
 *            changes every step), segment i > 0 reads segment i-1's output
 *            as a VALUE. With `fused` the same S*L layers are one segment:
 *            one graph, no breaks, the floor a tree is measured against.
 *   branchy  1 -> (2 | 3) -> 4. Segment 1 also outputs the sum of its first
 *            layer's pre-activation; the host reads it back every step
 *            (copy out + sync) and runs 2 if it is positive, else 3. The two
 *            input buffers are +x and -x, so the sum flips sign and the path
 *            alternates every step.
 *
 * Weights are STATIC arguments in caller memory, drawn by a seeded
 * generator (uniform in +-sqrt(6/H), which keeps relu stacks at unit scale),
 * so equal seeds give equal weights, and the fused chain the same weights as
 * the chain it fuses. Every value is released right after its last use,
 * except the step's final output, which stays live for wl_output until the
 * next step begins. Every launch function takes a 4 MiB cuBLAS workspace
 * from the pool with cgt_launch_alloc and frees it before returning.
 *
 * A step's output depends only on the parity of the step number. A workload
 * uses its tree's stream; destroy the workload before the tree.
 */
#ifndef CGT_WORKLOADS_H
#define CGT_WORKLOADS_H

#include <stddef.h>
#include <stdint.h>

#include "cgtree.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum wl_kind { WL_CHAIN, WL_BRANCHY } wl_kind;

typedef struct wl_params {
  wl_kind kind;
  int segments; /* chain: S (branchy: ignored, always 4 segments, 3 a step) */
  int layers;   /* layers of relu(x @ W) per segment */
  int batch;    /* B, rows of x; default 8 */
  int hidden;   /* H; default 256 */
  int fused;    /* chain only: one segment holding all S*L layers, no graph breaks (the one-graph floor) */
} wl_params;

/* chain: S=4 L=1 B=8 H=256; branchy: L=1 B=8 H=256. */
void wl_params_default(wl_params *p, wl_kind kind);

typedef struct workload workload;

/* Registers the workload's segments on t, allocates its weights and the two
 * step inputs (kernels_for(cgt_tree_backend(t)) dev_alloc, caller memory
 * outside the pool) and a kernel context on the tree's stream.
 * CGT_ERR_INVALID_ARGUMENT for parameters out of range, CGT_ERR_NO_DEVICE when
 * the kernel flavour of t's backend was not built. */
cgt_status wl_create(cgt_tree *t, const wl_params *p, uint64_t seed, workload **out);

/* One step: cgt_step_begin, then the step's runs. Branchy reads a device
 * reduction back (cgt_value_copy_out + cgt_sync) and branches on the host.
 * Only the step's parity matters (which input buffer it reads). */
cgt_status wl_step(workload *w, int step);

/* Copies the last step's final output to host memory (copy out + sync);
 * n_floats may not exceed wl_output_floats. CGT_ERR_STATE before any step. */
cgt_status wl_output(workload *w, float *host, size_t n_floats);
size_t wl_output_floats(const workload *w);

/* Runs per step: chain S (1 fused), branchy 3. */
int wl_segments_per_step(const workload *w);

/* "chain S=16 L=1", "chain S=16 L=1 fused", "branchy L=1"; B and H are added
 * when they are not the defaults. Returns buf. */
const char *wl_describe(const wl_params *p, char *buf, size_t n);

/* NULL is a no-op. Waits for the tree's stream, then frees the weights,
 * inputs and kernel context. The segments stay registered on the tree. */
void wl_destroy(workload *w);

/* ------------------------------------------------ for benchmarks (extension) */

/* Detail of this thread's last workload failure, "" if none. */
const char *wl_last_error(void);

/* The parameters, the kernel table, the segment count (chain S, fused 1,
 * branchy 4) and the tree. */
const wl_params *wl_get_params(const workload *w);
const kernels *wl_kernels(const workload *w);
int wl_segment_count(const workload *w);
cgt_tree *wl_tree(const workload *w);

/* The caller buffer the step input of a step of this parity lives in. */
const void *wl_input(const workload *w, int parity);

/* Where segment `segment_index`'s launch function last read its input 0
 * (cgt_launch_input), NULL if it never ran. For the first segment of a
 * recorded tree that is the pool placeholder the tree copies each step's
 * DYNAMIC input into before replaying the graph: a benchmark that launches
 * the tree's graphs by hand must fill it the same way, since the tree frees
 * the placeholder after capture and later segments of the step reuse its
 * memory. */
const void *wl_segment_input_seen(const workload *w, int segment_index);

/* Branchy: after a step, the host's copy of the branch sum, its device
 * address (fixed once segment 1 is recorded) and the branch taken (2 or 3);
 * 0 and NULL for chains or before a step. */
float wl_branch_sum(const workload *w);
const void *wl_branch_sum_device(const workload *w);
int wl_branch_taken(const workload *w);

/* Called right before (after = 0) and right after (after = 1) every cgt_run
 * of wl_step, with the run's position in the step and the segment's index
 * (0-based, as for wl_raw_enqueue); for benchmarks that time single runs.
 * NULL removes the hook. */
typedef void (*wl_run_hook)(void *user, int run_index, int segment_index, int after);
void wl_set_run_hook(workload *w, wl_run_hook hook, void *user);

/* The kernels of segment `segment_index` outside any tree, exactly as its
 * launch function enqueues them, on `stream` with `ctx`, reading `input`
 * (B x H floats) and taking every temporary from `scratch` (at least
 * wl_raw_scratch_bytes; never reused within the call). For baselines that
 * capture the same work with the device's own calls. */
size_t wl_raw_scratch_bytes(const workload *w, int segment_index);
cgt_status wl_raw_enqueue(workload *w, int segment_index, void *stream, kern_ctx *ctx, const void *input,
                          void *scratch, size_t scratch_bytes);

/* The cuBLAS workspace every segment takes from the pool. */
#define WL_WORKSPACE_BYTES ((size_t)4 << 20)

#ifdef __cplusplus
}
#endif

#endif /* CGT_WORKLOADS_H */
