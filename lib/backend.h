/* backend.h — the device interface the tree uses.
 *
 * The tree never calls CUDA directly: it goes through one of these tables.
 * backend_cuda.c implements it with the CUDA runtime (the product);
 * backend_sim.c implements it on the CPU so every tree, pool and invariant
 * test runs on machines without a GPU.
 *
 * Conventions: every operation returns cgt_status; on failure it writes a
 * one-line detail into b->error (which the tree copies into its last error)
 * and leaves no sticky state behind. Graphs and executable graphs are opaque
 * pointers owned by the backend until graph_destroy.
 */
#ifndef CGT_BACKEND_H
#define CGT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cgtree.h"

#define BACKEND_ERROR_BYTES 256

typedef struct backend backend;
typedef struct backend_ops backend_ops;

struct backend {
  const backend_ops *ops;
  void *stream; /* what cgt_launch_stream hands to launch functions */
  void *impl;   /* the implementation's own state */
  char error[BACKEND_ERROR_BYTES];
};

struct backend_ops {
  const char *name; /* "cuda", "sim" */
  cgt_backend kind;

  /* Opens device `device` and uses `stream` (NULL: create one). */
  cgt_status (*open)(backend *b, int device, void *stream);
  /* Waits for the stream, then frees everything open made. */
  void (*close)(backend *b);

  /* Device memory for pool chunks, 256-byte aligned. Must also work while the
   * stream is capturing (CUDA switches to relaxed capture mode around it).
   * CGT_ERR_OUT_OF_MEMORY when the device has no room. */
  cgt_status (*mem_alloc)(backend *b, size_t bytes, void **ptr);
  void (*mem_free)(backend *b, void *ptr);

  /* Stream capture of the backend's stream, thread-local mode. capture_end
   * returns CGT_ERR_CAPTURE_FAILED (graph NULL) if the capture was
   * invalidated; the stream is then out of capture and usable again. */
  cgt_status (*capture_begin)(backend *b);
  cgt_status (*capture_end)(backend *b, void **graph);
  /* Instantiates and uploads graph; the graph itself stays alive. */
  cgt_status (*instantiate)(backend *b, void *graph, void **exec);
  cgt_status (*launch)(backend *b, void *exec);
  /* Either pointer may be NULL. */
  void (*graph_destroy)(backend *b, void *graph, void *exec);

  /* Async copy on the stream between any two device or host addresses. */
  cgt_status (*copy)(backend *b, void *dst, const void *src, size_t bytes);
  cgt_status (*sync)(backend *b);

  /* Writes graph as Graphviz to path (optional: NULL if unsupported). */
  cgt_status (*graph_dot)(backend *b, void *graph, const char *path);
  /* In-graph input copies (optional: all three NULL if unsupported). A
   * copy() made while capturing becomes an operation of the graph (a node of
   * the device's graph, never one of our tree: we call it a *copy op*);
   * find_copy returns the first copy op of graph that writes dst (a handle
   * valid for every exec instantiated from graph while graph lives).
   * set_copy_src points that copy op of exec at another source of the same
   * size, without re-instantiating; it fails, changing nothing, where the
   * device cannot (another kind of memory). copy_enable turns the copy op off
   * or on in exec. */
  cgt_status (*graph_find_copy)(backend *b, void *graph, const void *dst, void **copy_op);
  cgt_status (*exec_set_copy_src)(backend *b, void *exec, void *copy_op, void *dst, const void *src, size_t bytes);
  cgt_status (*exec_copy_enable)(backend *b, void *exec, void *copy_op, int enabled);

  /* Fused executables, for deferred launch (optional: all five NULL, and
   * the tree then launches every replay at once). fuse builds ONE
   * executable that runs graphs parts[0..n) in order, each part after all of
   * the previous one's work, as a single launch; the parts stay the
   * caller's. fused_find_copy returns the handle, inside the fused
   * executable, of part `part`'s first copy op into dst (a copy() captured
   * into that part's graph); fused_set_copy_src repoints it at another
   * source of the same size, like exec_set_copy_src, and fails, changing
   * nothing, where the device cannot. */
  cgt_status (*fuse)(backend *b, void *const *parts, uint32_t n, void **fused);
  cgt_status (*fused_find_copy)(backend *b, void *fused, uint32_t part, const void *dst, void **copy_op);
  cgt_status (*fused_set_copy_src)(backend *b, void *fused, uint32_t part, void *copy_op, void *dst, const void *src,
                                   size_t bytes);
  cgt_status (*fused_launch)(backend *b, void *fused);
  void (*fused_destroy)(backend *b, void *fused);

  /* Update in place (optional: NULL, and the tree then instantiates afresh).
   * exec_update makes exec run graph's work, as if instantiated from it,
   * where the device allows it (the same topology, only parameters moved);
   * otherwise it refuses with CGT_ERR_STATE (the reason in b->error) and
   * exec is unchanged, no sticky error left. Copy-op handles keep naming the
   * copy ops of the graph exec was first instantiated from, so that graph
   * must outlive exec. */
  cgt_status (*exec_update)(backend *b, void *exec, void *graph);
  /* An estimate of the memory an executable of graph holds, for the
   * recording budget (optional: NULL counts nothing). */
  size_t (*graph_bytes)(backend *b, void *graph);

  /* Profiler ranges around warmup, record and replay (optional: NULL). */
  void (*range_push)(backend *b, const char *name);
  void (*range_pop)(backend *b);

  /* The device a tree's calls run on (optional: NULL where there is only
   * one, as in the simulator). device_enter makes the backend's device the
   * calling thread's current one and returns what has to be put back
   * afterwards: the previous device, or -1 when nothing changed.
   * device_leave(b, saved) puts it back (a no-op for -1). It touches nothing
   * open() made, so it may follow close(). See docs/multi-gpu.md. */
  int (*device_enter)(backend *b);
  void (*device_leave)(backend *b, int saved);
};

/* The CPU simulator (backend_sim.c). Where CUDA leaves a choice it takes the
 * simpler one: open() refuses a non-NULL stream, a graph launch while the
 * stream captures is CGT_ERR_STATE (no child-graph nodes), sync during capture
 * invalidates the capture as cudaStreamSynchronize does, and close() frees
 * whatever the caller left and names it in b->error. */
extern const backend_ops backend_sim_ops;

#ifdef CGT_HAVE_CUDA
extern const backend_ops backend_cuda_ops;
#endif

/* 1 when a usable CUDA device and driver are present (always 0 without
 * CUDA support compiled in). */
int backend_cuda_available(void);

/* Simulator-only knob behind cgt_sim_set_device_limit. */
void backend_sim_set_limit(backend *b, size_t limit_bytes);

/* Simulator-only: what one simulator backend has done so far, for tests and
 * for invariant checks (device_bytes - user_bytes equals the pool's reserved
 * bytes when the pool is the only caller of mem_alloc). Byte counts are
 * rounded up to 256, as the simulator allocates them. */
typedef struct backend_sim_counters {
  uint64_t kernels_eager;        /* kernels run at once, outside capture */
  uint64_t kernels_recorded;     /* kernels recorded into a capture */
  uint64_t kernels_replayed;     /* kernels run by graph launches */
  uint64_t copies_eager;         /* copies (copy op or cgt_sim_memcpy_async) done at once */
  uint64_t copies_recorded;
  uint64_t copies_replayed;
  uint64_t captures_begun;
  uint64_t captures_ended;       /* captures that produced a graph */
  uint64_t captures_invalidated; /* captures broken by an illegal call */
  uint64_t instantiations;
  uint64_t fusions;              /* fused executables built (fuse) */
  uint64_t updates;              /* exec_update calls that updated an executable */
  uint64_t updates_refused;      /* exec_update calls refused (another topology) */
  uint64_t fused_launches;       /* launches of fused executables (also counted in graph_launches) */
  uint64_t graph_launches;
  uint64_t device_allocs;        /* successful mem_alloc and cgt_sim_malloc calls */
  uint64_t device_frees;
  uint64_t bad_frees;            /* frees of pointers, graphs or execs this backend does not own */
  uint64_t ranges_pushed;
  uint64_t ranges_popped;
  size_t device_bytes;           /* outstanding device memory, all callers */
  size_t device_peak_bytes;
  size_t user_bytes;             /* the part of device_bytes from cgt_sim_malloc */
  size_t live_allocations;
  size_t live_graphs;            /* graphs from capture_end not yet destroyed */
  size_t live_execs;             /* executables from instantiate not yet destroyed */
  size_t live_fused;             /* fused executables from fuse not yet destroyed */
} backend_sim_counters;

/* Copies the counters of simulator backend b into *out (all zero when b is
 * not an open simulator backend). */
void backend_sim_read_counters(const backend *b, backend_sim_counters *out);
/* Outstanding simulated device memory of b in bytes (0 if b is not an open
 * simulator backend): a test that freed everything expects 0. */
size_t backend_sim_outstanding_bytes(const backend *b);
/* 1 while b's stream is capturing, invalidated captures included. */
int backend_sim_capturing(const backend *b);

#endif /* CGT_BACKEND_H */
