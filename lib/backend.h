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
  /* Profiler ranges around warmup, record and replay (optional: NULL). */
  void (*range_push)(backend *b, const char *name);
  void (*range_pop)(backend *b);
};

extern const backend_ops backend_sim_ops;

#ifdef CGT_HAVE_CUDA
extern const backend_ops backend_cuda_ops;
#endif

/* 1 when a usable CUDA device and driver are present (always 0 without
 * CUDA support compiled in). */
int backend_cuda_available(void);

/* Simulator-only knob behind cgt_sim_set_device_limit. */
void backend_sim_set_limit(backend *b, size_t limit_bytes);

#endif /* CGT_BACKEND_H */
