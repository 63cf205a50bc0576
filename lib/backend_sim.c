/* backend_sim.c — the simulator backend: a CUDA device that runs on the CPU.
 *
 * The tree is a state machine around three CUDA facts: work enqueued on a
 * stream runs in order, stream capture records that work into a graph instead
 * of running it, and a graph replays exactly what was recorded, with the
 * kernel arguments of capture time, however often it is launched. The
 * simulator keeps those three facts and drops everything else, so that every
 * tree, pool and invariant test runs on a machine without a GPU and a failure
 * means a bug in the tree rather than in a driver.
 *
 * Device memory is host memory from aligned_alloc, 256-byte aligned like
 * cudaMalloc. Every allocation is recorded in a small table so that a free of
 * a pointer the device never handed out is caught instead of corrupting the
 * heap, so that an optional device limit can refuse allocations the way a
 * full GPU does, and so that tests can ask how many bytes are still out.
 *
 * The device has one stream, an object that starts with a magic number:
 * cgt_sim_launch and its siblings receive the stream as a bare void pointer
 * from user launch functions, and the magic number lets them turn away
 * anything that is not a simulator stream with CGT_ERR_INVALID_ARGUMENT. Work
 * outside capture runs at once, because a CPU stream has nothing to overlap
 * with; a kernel is called with a copy of its argument bytes, as a CUDA kernel
 * receives its parameters by value.
 *
 * While the stream captures, a launch appends a node (the kernel and a copy of
 * its argument bytes) to the graph being recorded and a copy appends a node
 * holding its two addresses, so a replay copies whatever the source holds at
 * replay time, as a captured cudaMemcpyAsync does. The calls that CUDA forbids
 * during thread-local capture (stream synchronisation, cudaMalloc, cudaFree)
 * invalidate the capture here too: they fail with CGT_ERR_STATE, the partial
 * graph is dropped, every later launch into the capture fails, and ending it
 * reports CGT_ERR_CAPTURE_FAILED and leaves the stream usable. The pool's own
 * growth goes through mem_alloc, which works during capture because the CUDA
 * backend switches to relaxed capture mode around it.
 *
 * Instantiation copies the graph's nodes and argument bytes into an
 * executable, so the graph may be destroyed at once, and sizes a scratch
 * buffer for the largest argument block: a replay copies each node's bytes
 * into it before the call, so a kernel that writes to its arguments cannot
 * change the recording, and the replay allocates nothing, as the tree's hot
 * path promises. A graph launch while the stream captures is rejected with
 * CGT_ERR_STATE (CUDA would record a child-graph node; the tree never needs
 * one, and rejecting is the simpler honest answer).
 *
 * A fused executable (deferred launch) is the same thing built from several
 * graphs: their programs one after another, so one launch replays them in
 * order, with each part's copy ops repointable on their own, which is what
 * CUDA's graph of child-graph nodes gives.
 *
 * open() refuses a caller-supplied stream: the simulator always makes its own,
 * and sharing one stream between two backends would blur who frees it. Live
 * graphs and executables (fused ones too) sit on lists, so close() frees whatever the
 * caller left behind, as destroying a CUDA context frees its memory, and says
 * what it freed in b->error, where a test can see a leak. Nothing here is
 * global: everything hangs off the backend instance, and nothing is thread
 * safe; one thread drives one simulated device.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cgtree_sim.h"

#define SIM_ALIGN ((size_t)256)
/* Eager launches with at most this many argument bytes copy them onto the
 * stack, so the common small launch does not touch the heap. */
#define SIM_SMALL_ARGS 256

/* Magic numbers tell live objects from foreign pointers; each is cleared when
 * its object is freed, so a stale pointer is turned away while the memory
 * still holds it. */
#define SIM_STREAM_MAGIC UINT32_C(0x5354524d) /* "STRM" */
#define SIM_GRAPH_MAGIC UINT32_C(0x47525048)  /* "GRPH" */
#define SIM_EXEC_MAGIC UINT32_C(0x45584543)   /* "EXEC" */
#define SIM_FUSED_MAGIC UINT32_C(0x46555345)  /* "FUSE" */

typedef struct sim_device sim_device;

typedef enum sim_node_kind { SIM_NODE_KERNEL, SIM_NODE_COPY } sim_node_kind;

/* One recorded operation. A kernel node keeps its argument bytes in the
 * program's arg_bytes, by offset, so that the array can grow by realloc. */
typedef struct sim_node {
  sim_node_kind kind;
  cgt_sim_kernel kernel; /* SIM_NODE_KERNEL */
  size_t args_offset;    /* SIM_NODE_KERNEL */
  size_t args_bytes;     /* SIM_NODE_KERNEL */
  void *dst;             /* SIM_NODE_COPY */
  const void *src;       /* SIM_NODE_COPY */
  size_t copy_bytes;     /* SIM_NODE_COPY */
  int disabled;          /* SIM_NODE_COPY: turned off in an executable */
} sim_node;

/* The recorded work shared by graphs and executables. */
typedef struct sim_program {
  sim_node *nodes;
  size_t count, cap;
  unsigned char *arg_bytes;
  size_t arg_used, arg_cap;
  size_t max_args_bytes; /* largest argument block of one node: the scratch size */
} sim_program;

/* The head of every graph and executable: its magic, its device (an object
 * of one simulator is refused by another), and its place on the device's
 * list of live objects. */
typedef struct sim_object {
  uint32_t magic;
  sim_device *device;
  struct sim_object *prev, *next;
} sim_object;

typedef struct sim_graph {
  sim_object head;
  sim_program program;
} sim_graph;

typedef struct sim_exec {
  sim_object head;
  sim_program program;
  unsigned char *scratch; /* max_args_bytes bytes: each kernel's private copy of its arguments */
  int running;            /* a replay is in progress, so the executable may be neither relaunched nor freed */
  /* A fused executable (magic SIM_FUSED_MAGIC): its program is the parts'
   * programs one after another, part i at nodes [part_start[i],
   * part_start[i + 1]). */
  uint32_t n_parts;
  size_t *part_start;
} sim_exec;

typedef enum sim_capture {
  SIM_CAPTURE_NONE,
  SIM_CAPTURE_ACTIVE,     /* recording into graph */
  SIM_CAPTURE_INVALIDATED /* an illegal call broke the capture; only capture_end helps */
} sim_capture;

typedef struct sim_stream {
  uint32_t magic;
  sim_device *device;
  sim_capture capture;
  sim_graph *graph;                          /* the graph being recorded, while ACTIVE */
  char invalidated_by[BACKEND_ERROR_BYTES];  /* why the capture broke, for capture_end's message */
  char detail[BACKEND_ERROR_BYTES];          /* the last failure of a call on this stream */
} sim_stream;

typedef struct sim_allocation {
  void *ptr;
  size_t bytes; /* rounded up to SIM_ALIGN */
  int user;     /* from cgt_sim_malloc rather than mem_alloc */
} sim_allocation;

struct sim_device {
  sim_stream stream; /* b->stream points here */
  size_t limit;      /* SIZE_MAX: no limit */
  sim_allocation *allocations;
  size_t allocation_cap; /* live allocations are counters.live_allocations */
  sim_object *graphs;
  sim_object *execs;
  sim_object *fused;
  backend_sim_counters counters;
};

/* ------------------------------------------------------------- messages */

/* Lets GCC and Clang check every message's arguments against its format. */
#if defined(__GNUC__)
#define SIM_PRINTF(fmt_arg, first_arg) __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define SIM_PRINTF(fmt_arg, first_arg)
#endif

SIM_PRINTF(2, 0) static void write_message(char *buf, const char *fmt, va_list ap) {
  vsnprintf(buf, BACKEND_ERROR_BYTES, fmt, ap);
}

/* Records a failure of a backend operation in b->error and returns s. */
SIM_PRINTF(3, 4) static cgt_status backend_fail(backend *b, cgt_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  write_message(b->error, fmt, ap);
  va_end(ap);
  return s;
}

/* Records a failure of a call on the stream; the backend operations that
 * share the stream code copy it into b->error. */
SIM_PRINTF(3, 4) static cgt_status stream_fail(sim_stream *st, cgt_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  write_message(st->detail, fmt, ap);
  va_end(ap);
  return s;
}

/* --------------------------------------------------------------- lookup */

static sim_device *device_of(const backend *b) {
  if (b == NULL || b->ops != &backend_sim_ops) return NULL;
  return b->impl;
}

/* The stream behind a void pointer from a launch function, or NULL. Reading
 * the magic of an arbitrary pointer is the best a C API can do; a NULL or a
 * pointer to another object is caught. */
static sim_stream *stream_of(void *stream) {
  sim_stream *st = stream;
  if (st == NULL || st->magic != SIM_STREAM_MAGIC) return NULL;
  return st;
}

static sim_graph *graph_of(sim_device *dev, void *graph) {
  sim_graph *g = graph;
  if (g == NULL || g->head.magic != SIM_GRAPH_MAGIC || g->head.device != dev) return NULL;
  return g;
}

static sim_exec *exec_of(sim_device *dev, void *exec) {
  sim_exec *e = exec;
  if (e == NULL || e->head.magic != SIM_EXEC_MAGIC || e->head.device != dev) return NULL;
  return e;
}

/* ------------------------------------------------------- object lists */

static void list_push(sim_object **head, sim_object *o) {
  o->prev = NULL;
  o->next = *head;
  if (*head != NULL) (*head)->prev = o;
  *head = o;
}

static void list_remove(sim_object **head, sim_object *o) {
  if (o->prev != NULL)
    o->prev->next = o->next;
  else
    *head = o->next;
  if (o->next != NULL) o->next->prev = o->prev;
  o->prev = o->next = NULL;
}

/* ------------------------------------------------------------ programs */

/* Grows *buf to hold at least need elements of elem bytes, doubling so that
 * a long capture appends in amortised constant time. Returns 0 when the
 * host is out of memory, leaving *buf as it was. */
static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 1;
  size_t n = *cap ? *cap : 8;
  while (n < need) {
    if (n > SIZE_MAX / 2) return 0;
    n *= 2;
  }
  if (n > SIZE_MAX / elem) return 0;
  void *p = realloc(*buf, n * elem);
  if (p == NULL) return 0;
  *buf = p;
  *cap = n;
  return 1;
}

static int program_add_node(sim_program *p, const sim_node *n) {
  void *nodes = p->nodes;
  if (!grow(&nodes, &p->cap, p->count + 1, sizeof *p->nodes)) return 0;
  p->nodes = nodes;
  p->nodes[p->count++] = *n;
  return 1;
}

static int program_add_kernel(sim_program *p, cgt_sim_kernel k, const void *args, size_t bytes) {
  if (bytes > SIZE_MAX - p->arg_used) return 0;
  void *arg_bytes = p->arg_bytes;
  if (!grow(&arg_bytes, &p->arg_cap, p->arg_used + bytes, 1)) return 0;
  p->arg_bytes = arg_bytes;
  sim_node n = {0};
  n.kind = SIM_NODE_KERNEL;
  n.kernel = k;
  n.args_offset = p->arg_used;
  n.args_bytes = bytes;
  if (!program_add_node(p, &n)) return 0;
  /* The bytes are committed only once the node exists, so a failure leaves
   * the program as it was. */
  if (bytes > 0) memcpy(p->arg_bytes + p->arg_used, args, bytes);
  p->arg_used += bytes;
  if (bytes > p->max_args_bytes) p->max_args_bytes = bytes;
  return 1;
}

static int program_add_copy(sim_program *p, void *dst, const void *src, size_t bytes) {
  sim_node n = {0};
  n.kind = SIM_NODE_COPY;
  n.dst = dst;
  n.src = src;
  n.copy_bytes = bytes;
  return program_add_node(p, &n);
}

static void program_free(sim_program *p) {
  free(p->nodes);
  free(p->arg_bytes);
  memset(p, 0, sizeof *p);
}

/* Copies src into dst with exactly the room it needs. */
static int program_clone(sim_program *dst, const sim_program *src) {
  memset(dst, 0, sizeof *dst);
  if (src->count > 0) {
    dst->nodes = malloc(src->count * sizeof *dst->nodes);
    if (dst->nodes == NULL) return 0;
    memcpy(dst->nodes, src->nodes, src->count * sizeof *dst->nodes);
  }
  if (src->arg_used > 0) {
    dst->arg_bytes = malloc(src->arg_used);
    if (dst->arg_bytes == NULL) {
      program_free(dst);
      return 0;
    }
    memcpy(dst->arg_bytes, src->arg_bytes, src->arg_used);
  }
  dst->count = dst->cap = src->count;
  dst->arg_used = dst->arg_cap = src->arg_used;
  dst->max_args_bytes = src->max_args_bytes;
  return 1;
}

/* ------------------------------------------------------------- graphs */

static sim_graph *graph_new(sim_device *dev) {
  sim_graph *g = calloc(1, sizeof *g);
  if (g == NULL) return NULL;
  g->head.magic = SIM_GRAPH_MAGIC;
  g->head.device = dev;
  return g;
}

/* Frees a graph that is on no list (the one being recorded, or one already
 * unlinked). */
static void graph_free(sim_graph *g) {
  g->head.magic = 0;
  program_free(&g->program);
  free(g);
}

static void exec_free(sim_exec *e) {
  e->head.magic = 0;
  program_free(&e->program);
  free(e->scratch);
  free(e->part_start);
  free(e);
}

/* ------------------------------------------------------ device memory */

static cgt_status device_alloc(sim_device *dev, size_t bytes, int user, void **ptr, char *msg) {
  if (bytes == 0) {
    snprintf(msg, BACKEND_ERROR_BYTES, "sim: cannot allocate 0 bytes of device memory");
    return CGT_ERR_INVALID_ARGUMENT;
  }
  if (bytes > SIZE_MAX - (SIM_ALIGN - 1)) {
    snprintf(msg, BACKEND_ERROR_BYTES, "sim: out of device memory: %zu bytes cannot be allocated", bytes);
    return CGT_ERR_OUT_OF_MEMORY;
  }
  size_t rounded = (bytes + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
  backend_sim_counters *c = &dev->counters;
  /* Written so that it cannot overflow, and so that a limit lowered below
   * what is already out refuses every allocation until enough is freed. */
  if (c->device_bytes > dev->limit || rounded > dev->limit - c->device_bytes) {
    snprintf(msg, BACKEND_ERROR_BYTES,
             "sim: out of device memory: %zu bytes requested, %zu of the %zu-byte device limit in use", bytes,
             c->device_bytes, dev->limit);
    return CGT_ERR_OUT_OF_MEMORY;
  }
  void *table = dev->allocations;
  if (!grow(&table, &dev->allocation_cap, c->live_allocations + 1, sizeof *dev->allocations)) {
    snprintf(msg, BACKEND_ERROR_BYTES, "sim: out of host memory for the allocation table");
    return CGT_ERR_OUT_OF_MEMORY;
  }
  dev->allocations = table;
  void *p = aligned_alloc(SIM_ALIGN, rounded);
  if (p == NULL) {
    snprintf(msg, BACKEND_ERROR_BYTES, "sim: out of device memory: the host refused %zu bytes", rounded);
    return CGT_ERR_OUT_OF_MEMORY;
  }
  sim_allocation *a = &dev->allocations[c->live_allocations++];
  a->ptr = p;
  a->bytes = rounded;
  a->user = user;
  c->device_bytes += rounded;
  if (user) c->user_bytes += rounded;
  if (c->device_bytes > c->device_peak_bytes) c->device_peak_bytes = c->device_bytes;
  c->device_allocs++;
  *ptr = p;
  return CGT_OK;
}

/* The slot of ptr in the allocation table, or SIZE_MAX. The scan runs from
 * the newest allocation, which is the one most often freed first; the table
 * holds pool chunks and a test's own allocations, so it stays short. */
static size_t device_find(const sim_device *dev, const void *ptr) {
  for (size_t i = dev->counters.live_allocations; i > 0; i--)
    if (dev->allocations[i - 1].ptr == ptr) return i - 1;
  return SIZE_MAX;
}

static void device_release(sim_device *dev, size_t slot) {
  backend_sim_counters *c = &dev->counters;
  sim_allocation a = dev->allocations[slot];
  free(a.ptr);
  c->device_bytes -= a.bytes;
  if (a.user) c->user_bytes -= a.bytes;
  c->device_frees++;
  dev->allocations[slot] = dev->allocations[--c->live_allocations];
}

/* -------------------------------------------------------- stream work */

/* Breaks the capture in progress the way CUDA does when a forbidden call is
 * made during it: the partial graph is dropped at once and the reason kept
 * for capture_end. Only the first reason is kept, as CUDA reports the first
 * error. */
static void stream_invalidate(sim_stream *st, const char *reason) {
  if (st->capture != SIM_CAPTURE_ACTIVE) return;
  st->capture = SIM_CAPTURE_INVALIDATED;
  snprintf(st->invalidated_by, sizeof st->invalidated_by, "%s", reason);
  graph_free(st->graph);
  st->graph = NULL;
  st->device->counters.captures_invalidated++;
}

/* The answer to any stream work while the capture is invalidated, like
 * cudaErrorStreamCaptureInvalidated. */
static cgt_status stream_invalidated(sim_stream *st, const char *what) {
  return stream_fail(st, CGT_ERR_STATE, "sim: %s into an invalidated capture (%s); end the capture first", what,
                     st->invalidated_by);
}

static cgt_status stream_launch(sim_stream *st, cgt_sim_kernel k, const void *args, size_t bytes) {
  if (k == NULL) return stream_fail(st, CGT_ERR_INVALID_ARGUMENT, "sim: cgt_sim_launch with a NULL kernel");
  if (args == NULL && bytes > 0)
    return stream_fail(st, CGT_ERR_INVALID_ARGUMENT, "sim: cgt_sim_launch with NULL args but %zu arg bytes", bytes);
  backend_sim_counters *c = &st->device->counters;
  switch (st->capture) {
  case SIM_CAPTURE_INVALIDATED:
    return stream_invalidated(st, "kernel launch");
  case SIM_CAPTURE_ACTIVE:
    if (!program_add_kernel(&st->graph->program, k, args, bytes)) {
      /* A graph missing a kernel would replay wrong work; the capture is
       * lost rather than kept incomplete. */
      stream_invalidate(st, "the host ran out of memory while recording a kernel");
      return stream_fail(st, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory while recording a kernel");
    }
    c->kernels_recorded++;
    return CGT_OK;
  case SIM_CAPTURE_NONE:
    break;
  }
  /* The kernel gets its own copy, as a CUDA kernel gets its parameters by
   * value: writing to it must not reach the caller's struct. */
  union {
    max_align_t align;
    unsigned char bytes[SIM_SMALL_ARGS];
  } small;
  void *copy = NULL;
  if (bytes > 0) {
    copy = bytes <= sizeof small.bytes ? small.bytes : malloc(bytes);
    if (copy == NULL)
      return stream_fail(st, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory for %zu kernel arg bytes", bytes);
    memcpy(copy, args, bytes);
  }
  c->kernels_eager++;
  k(copy);
  if (copy != NULL && copy != (void *)small.bytes) free(copy);
  return CGT_OK;
}

static cgt_status stream_copy(sim_stream *st, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return CGT_OK; /* like a zero-byte cudaMemcpyAsync: nothing to do or record */
  if (dst == NULL || src == NULL)
    return stream_fail(st, CGT_ERR_INVALID_ARGUMENT, "sim: copy of %zu bytes with a NULL %s", bytes,
                       dst == NULL ? "destination" : "source");
  backend_sim_counters *c = &st->device->counters;
  switch (st->capture) {
  case SIM_CAPTURE_INVALIDATED:
    return stream_invalidated(st, "copy");
  case SIM_CAPTURE_ACTIVE:
    if (!program_add_copy(&st->graph->program, dst, src, bytes)) {
      stream_invalidate(st, "the host ran out of memory while recording a copy");
      return stream_fail(st, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory while recording a copy");
    }
    c->copies_recorded++;
    return CGT_OK;
  case SIM_CAPTURE_NONE:
    break;
  }
  /* memmove, because CUDA leaves overlapping copies undefined and the
   * simulator has no reason to make them fail in a different way. */
  memmove(dst, src, bytes);
  c->copies_eager++;
  return CGT_OK;
}

static cgt_status stream_sync(sim_stream *st) {
  switch (st->capture) {
  case SIM_CAPTURE_NONE:
    return CGT_OK; /* all work already ran */
  case SIM_CAPTURE_ACTIVE:
    stream_invalidate(st, "the stream was synchronised during capture");
    return stream_fail(st, CGT_ERR_STATE, "sim: stream synchronised during capture; the capture is invalidated");
  case SIM_CAPTURE_INVALIDATED:
    return stream_invalidated(st, "synchronisation");
  }
  return CGT_ERR_STATE;
}

/* The calls CUDA forbids while the capturing thread is in thread-local
 * mode (cudaMalloc, cudaFree): they fail and invalidate the capture. */
static cgt_status stream_forbidden_in_capture(sim_stream *st, const char *what) {
  if (st->capture == SIM_CAPTURE_ACTIVE) {
    char reason[BACKEND_ERROR_BYTES];
    snprintf(reason, sizeof reason, "%s was called during capture", what);
    stream_invalidate(st, reason);
    return stream_fail(st, CGT_ERR_STATE, "sim: %s during capture; the capture is invalidated", what);
  }
  return stream_invalidated(st, what);
}

/* Runs an executable's nodes in order. Each kernel gets the recorded bytes
 * in the executable's scratch buffer, so the recording itself stays intact
 * and the replay allocates nothing. */
static void exec_run(sim_device *dev, sim_exec *e) {
  backend_sim_counters *c = &dev->counters;
  const sim_program *p = &e->program;
  e->running = 1;
  for (size_t i = 0; i < p->count; i++) {
    const sim_node *n = &p->nodes[i];
    if (n->kind == SIM_NODE_KERNEL) {
      void *args = NULL;
      if (n->args_bytes > 0) {
        memcpy(e->scratch, p->arg_bytes + n->args_offset, n->args_bytes);
        args = e->scratch;
      }
      c->kernels_replayed++;
      n->kernel(args);
    } else if (!n->disabled) {
      memmove(n->dst, n->src, n->copy_bytes);
      c->copies_replayed++;
    }
  }
  e->running = 0;
}

/* In-graph copies: a node handle is its index + 1, the same in a graph and
 * in every executable cloned from it. */
static cgt_status sim_graph_find_copy(backend *b, void *graph, const void *dst, void **node) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_graph *g = graph_of(dev, graph);
  if (g == NULL || node == NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: find_copy needs a graph of this device");
  for (size_t i = 0; i < g->program.count; i++)
    if (g->program.nodes[i].kind == SIM_NODE_COPY && g->program.nodes[i].dst == dst) {
      *node = (void *)(uintptr_t)(i + 1);
      return CGT_OK;
    }
  return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: the graph has no copy into %p", (void *)(uintptr_t)dst);
}

static sim_node *exec_copy_node(backend *b, void *exec, void *node) {
  sim_device *dev = device_of(b);
  sim_exec *e = dev ? exec_of(dev, exec) : NULL;
  size_t i = (size_t)(uintptr_t)node;
  if (e == NULL || i == 0 || i > e->program.count || e->program.nodes[i - 1].kind != SIM_NODE_COPY) {
    backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: not a copy node of an executable of this device");
    return NULL;
  }
  return &e->program.nodes[i - 1];
}

static cgt_status sim_exec_set_copy_src(backend *b, void *exec, void *node, void *dst, const void *src, size_t bytes) {
  sim_node *n = exec_copy_node(b, exec, node);
  if (n == NULL) return CGT_ERR_INVALID_ARGUMENT;
  if (n->dst != dst || n->copy_bytes != bytes || src == NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: set_copy_src may change the source only");
  n->src = src;
  return CGT_OK;
}

static cgt_status sim_exec_copy_enable(backend *b, void *exec, void *node, int enabled) {
  sim_node *n = exec_copy_node(b, exec, node);
  if (n == NULL) return CGT_ERR_INVALID_ARGUMENT;
  n->disabled = !enabled;
  return CGT_OK;
}

/* ------------------------------------------------- fused executables */

/* A fused executable is the concatenation of its parts' recorded work, so
 * one launch replays them in order; each part keeps its copy ops, which
 * are repointed one by one. */
static sim_exec *fused_of(sim_device *dev, void *fused) {
  sim_exec *e = fused;
  if (e == NULL || e->head.magic != SIM_FUSED_MAGIC || e->head.device != dev) return NULL;
  return e;
}

/* Appends src's nodes and argument bytes to dst. */
static int program_append(sim_program *dst, const sim_program *src) {
  size_t base = dst->arg_used;
  if (src->arg_used > 0) {
    void *arg_bytes = dst->arg_bytes;
    if (src->arg_used > SIZE_MAX - base || !grow(&arg_bytes, &dst->arg_cap, base + src->arg_used, 1)) return 0;
    dst->arg_bytes = arg_bytes;
  }
  void *nodes = dst->nodes;
  if (!grow(&nodes, &dst->cap, dst->count + src->count, sizeof *dst->nodes)) return 0;
  dst->nodes = nodes;
  for (size_t i = 0; i < src->count; i++) {
    sim_node n = src->nodes[i];
    if (n.kind == SIM_NODE_KERNEL) n.args_offset += base;
    dst->nodes[dst->count++] = n;
  }
  if (src->arg_used > 0) memcpy(dst->arg_bytes + base, src->arg_bytes, src->arg_used);
  dst->arg_used += src->arg_used;
  if (src->max_args_bytes > dst->max_args_bytes) dst->max_args_bytes = src->max_args_bytes;
  return 1;
}

static cgt_status sim_fuse(backend *b, void *const *parts, uint32_t n, void **fused) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  if (fused == NULL || parts == NULL || n == 0)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: fuse needs parts and a result pointer");
  *fused = NULL;
  for (uint32_t i = 0; i < n; i++)
    if (graph_of(dev, parts[i]) == NULL)
      return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: fuse: part %u is not a graph of this device", i);
  sim_exec *e = calloc(1, sizeof *e);
  size_t *starts = calloc((size_t)n + 1, sizeof *starts);
  int ok = e != NULL && starts != NULL;
  for (uint32_t i = 0; ok && i < n; i++) {
    starts[i] = e->program.count;
    ok = program_append(&e->program, &graph_of(dev, parts[i])->program);
  }
  if (ok) {
    starts[n] = e->program.count;
    if (e->program.max_args_bytes > 0) ok = (e->scratch = malloc(e->program.max_args_bytes)) != NULL;
  }
  if (!ok) {
    if (e != NULL) program_free(&e->program);
    if (e != NULL) free(e->scratch);
    free(e);
    free(starts);
    return backend_fail(b, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory fusing %u graphs", n);
  }
  e->n_parts = n;
  e->part_start = starts;
  e->head.magic = SIM_FUSED_MAGIC;
  e->head.device = dev;
  list_push(&dev->fused, &e->head);
  dev->counters.live_fused++;
  dev->counters.fusions++;
  *fused = e;
  return CGT_OK;
}

/* A copy op of a fused executable: its index + 1, like in an executable. */
static cgt_status sim_fused_find_copy(backend *b, void *fused, uint32_t part, const void *dst, void **node) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_exec *e = fused_of(dev, fused);
  if (e == NULL || part >= e->n_parts || node == NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: fused_find_copy needs a fused executable and a part of it");
  for (size_t i = e->part_start[part]; i < e->part_start[part + 1]; i++)
    if (e->program.nodes[i].kind == SIM_NODE_COPY && e->program.nodes[i].dst == dst) {
      *node = (void *)(uintptr_t)(i + 1);
      return CGT_OK;
    }
  return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: part %u has no copy into %p", part, (void *)(uintptr_t)dst);
}

static cgt_status sim_fused_set_copy_src(backend *b, void *fused, uint32_t part, void *node, void *dst,
                                         const void *src, size_t bytes) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_exec *e = fused_of(dev, fused);
  size_t i = (size_t)(uintptr_t)node;
  if (e == NULL || part >= e->n_parts || i <= e->part_start[part] || i > e->part_start[part + 1] ||
      e->program.nodes[i - 1].kind != SIM_NODE_COPY)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: not a copy node of part %u of a fused executable", part);
  sim_node *n = &e->program.nodes[i - 1];
  if (n->dst != dst || n->copy_bytes != bytes || src == NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: set_copy_src may change the source only");
  n->src = src;
  return CGT_OK;
}

static cgt_status sim_fused_launch(backend *b, void *fused) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_exec *e = fused_of(dev, fused);
  if (e == NULL) return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: launch of something not a fused executable");
  if (dev->stream.capture != SIM_CAPTURE_NONE)
    return backend_fail(b, CGT_ERR_STATE, "sim: graph launch while the stream is capturing is not supported");
  if (e->running) return backend_fail(b, CGT_ERR_STATE, "sim: fused launch from inside its own replay");
  dev->counters.graph_launches++;
  dev->counters.fused_launches++;
  exec_run(dev, e);
  return CGT_OK;
}

static void sim_fused_destroy(backend *b, void *fused) {
  sim_device *dev = device_of(b);
  if (dev == NULL || fused == NULL) return;
  sim_exec *e = fused_of(dev, fused);
  if (e == NULL || e->running) {
    dev->counters.bad_frees++;
    snprintf(b->error, sizeof b->error, "sim: fused_destroy of %s",
             e == NULL ? "something not a fused executable of this device" : "a fused executable during its replay");
    return;
  }
  list_remove(&dev->fused, &e->head);
  dev->counters.live_fused--;
  exec_free(e);
}

/* ---------------------------------------------------- backend table */

static cgt_status sim_open(backend *b, int device, void *stream) {
  if (b == NULL) return CGT_ERR_INVALID_ARGUMENT;
  b->error[0] = '\0';
  b->impl = NULL;
  b->stream = NULL;
  if (device < 0) return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: device %d does not exist", device);
  if (stream != NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT,
                        "sim: the simulator creates its own stream; pass a NULL stream on the simulator backend");
  sim_device *dev = calloc(1, sizeof *dev);
  if (dev == NULL) return backend_fail(b, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory opening the device");
  dev->stream.magic = SIM_STREAM_MAGIC;
  dev->stream.device = dev;
  dev->stream.capture = SIM_CAPTURE_NONE;
  dev->limit = SIZE_MAX;
  b->impl = dev;
  b->stream = &dev->stream;
  return CGT_OK;
}

/* Frees the device and all it still holds. The stream has no queued work to
 * wait for. Whatever the caller left behind is freed, as a CUDA context's
 * memory is on teardown, and named in b->error so a test can call it a leak;
 * a clean close leaves b->error empty. */
static void sim_close(backend *b) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return;
  backend_sim_counters *c = &dev->counters;
  size_t allocations = c->live_allocations, bytes = c->device_bytes;
  size_t graphs = c->live_graphs, execs = c->live_execs + c->live_fused;
  int capturing = dev->stream.capture != SIM_CAPTURE_NONE;

  if (dev->stream.graph != NULL) graph_free(dev->stream.graph);
  while (dev->graphs != NULL) {
    sim_object *o = dev->graphs;
    list_remove(&dev->graphs, o);
    graph_free((sim_graph *)o);
  }
  while (dev->execs != NULL) {
    sim_object *o = dev->execs;
    list_remove(&dev->execs, o);
    exec_free((sim_exec *)o);
  }
  while (dev->fused != NULL) {
    sim_object *o = dev->fused;
    list_remove(&dev->fused, o);
    exec_free((sim_exec *)o);
  }
  while (c->live_allocations > 0) device_release(dev, c->live_allocations - 1);
  free(dev->allocations);

  b->error[0] = '\0';
  if (allocations > 0 || graphs > 0 || execs > 0 || capturing)
    snprintf(b->error, sizeof b->error,
             "sim: close freed what was left: %zu allocations (%zu bytes), %zu graphs, %zu execs%s", allocations,
             bytes, graphs, execs, capturing ? ", and a capture that was never ended" : "");
  dev->stream.magic = 0;
  free(dev);
  b->impl = NULL;
  b->stream = NULL;
}

static cgt_status sim_mem_alloc(backend *b, size_t bytes, void **ptr) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  if (ptr == NULL) return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: mem_alloc with a NULL result pointer");
  /* Allowed during capture: this is the relaxed-mode escape the pool grows
   * through. */
  return device_alloc(dev, bytes, 0, ptr, b->error);
}

static void sim_mem_free(backend *b, void *ptr) {
  sim_device *dev = device_of(b);
  if (dev == NULL || ptr == NULL) return;
  size_t slot = device_find(dev, ptr);
  if (slot == SIZE_MAX) {
    /* Freeing it would corrupt the host heap; counting it lets a test fail
     * instead. */
    dev->counters.bad_frees++;
    snprintf(b->error, sizeof b->error, "sim: mem_free of a pointer the device did not allocate");
    return;
  }
  device_release(dev, slot);
}

static cgt_status sim_capture_begin(backend *b) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_stream *st = &dev->stream;
  if (st->capture != SIM_CAPTURE_NONE)
    return backend_fail(b, CGT_ERR_STATE, "sim: capture_begin while the stream is already capturing");
  sim_graph *g = graph_new(dev);
  if (g == NULL) return backend_fail(b, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory beginning a capture");
  st->graph = g;
  st->capture = SIM_CAPTURE_ACTIVE;
  st->invalidated_by[0] = '\0';
  dev->counters.captures_begun++;
  return CGT_OK;
}

static cgt_status sim_capture_end(backend *b, void **graph) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  if (graph == NULL) return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: capture_end with a NULL graph pointer");
  *graph = NULL;
  sim_stream *st = &dev->stream;
  switch (st->capture) {
  case SIM_CAPTURE_NONE:
    return backend_fail(b, CGT_ERR_STATE, "sim: capture_end while the stream is not capturing");
  case SIM_CAPTURE_INVALIDATED:
    st->capture = SIM_CAPTURE_NONE;
    return backend_fail(b, CGT_ERR_CAPTURE_FAILED, "sim: capture invalidated: %s", st->invalidated_by);
  case SIM_CAPTURE_ACTIVE:
    break;
  }
  sim_graph *g = st->graph;
  st->graph = NULL;
  st->capture = SIM_CAPTURE_NONE;
  list_push(&dev->graphs, &g->head);
  dev->counters.live_graphs++;
  dev->counters.captures_ended++;
  *graph = g;
  return CGT_OK;
}

static cgt_status sim_instantiate(backend *b, void *graph, void **exec) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  if (exec == NULL) return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: instantiate with a NULL exec pointer");
  *exec = NULL;
  sim_graph *g = graph_of(dev, graph);
  if (g == NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: instantiate of something not a graph of this device");
  sim_exec *e = calloc(1, sizeof *e);
  if (e == NULL || !program_clone(&e->program, &g->program)) {
    free(e);
    return backend_fail(b, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory instantiating a graph");
  }
  if (e->program.max_args_bytes > 0) {
    e->scratch = malloc(e->program.max_args_bytes);
    if (e->scratch == NULL) {
      program_free(&e->program);
      free(e);
      return backend_fail(b, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory instantiating a graph");
    }
  }
  e->head.magic = SIM_EXEC_MAGIC;
  e->head.device = dev;
  list_push(&dev->execs, &e->head);
  dev->counters.live_execs++;
  dev->counters.instantiations++;
  *exec = e;
  return CGT_OK;
}

/* Update in place, as cudaGraphExecUpdate: allowed when the graph has the
 * executable's topology (the same operations in the same order, each kernel
 * the same function with as many argument bytes, each copy as long), so
 * only arguments and addresses move; refused otherwise, the executable
 * unchanged. */
static int program_same_topology(const sim_program *a, const sim_program *b) {
  if (a->count != b->count) return 0;
  for (size_t i = 0; i < a->count; i++) {
    const sim_node *x = &a->nodes[i], *y = &b->nodes[i];
    if (x->kind != y->kind) return 0;
    if (x->kind == SIM_NODE_KERNEL && (x->kernel != y->kernel || x->args_bytes != y->args_bytes)) return 0;
    if (x->kind == SIM_NODE_COPY && x->copy_bytes != y->copy_bytes) return 0;
  }
  return 1;
}

static cgt_status sim_exec_update(backend *b, void *exec, void *graph) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_exec *e = exec_of(dev, exec);
  sim_graph *g = graph_of(dev, graph);
  if (e == NULL || g == NULL || e->running)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: exec_update needs an idle executable and a graph of this device");
  if (!program_same_topology(&e->program, &g->program)) {
    dev->counters.updates_refused++;
    return backend_fail(b, CGT_ERR_STATE, "sim: update refused: the graph's topology differs (%zu operations, the executable has %zu)",
                        g->program.count, e->program.count);
  }
  sim_program p;
  if (!program_clone(&p, &g->program))
    return backend_fail(b, CGT_ERR_OUT_OF_MEMORY, "sim: out of host memory updating an executable");
  program_free(&e->program);
  e->program = p;
  dev->counters.updates++;
  return CGT_OK;
}

/* What an executable of graph holds on the host: its operations and their
 * argument bytes. */
static size_t sim_graph_bytes(backend *b, void *graph) {
  sim_device *dev = device_of(b);
  sim_graph *g = dev ? graph_of(dev, graph) : NULL;
  if (g == NULL) return 0;
  return sizeof(sim_exec) + g->program.count * sizeof(sim_node) + g->program.arg_used + g->program.max_args_bytes;
}

static cgt_status sim_launch(backend *b, void *exec) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_exec *e = exec_of(dev, exec);
  if (e == NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: launch of something not an executable of this device");
  if (dev->stream.capture != SIM_CAPTURE_NONE)
    return backend_fail(b, CGT_ERR_STATE, "sim: graph launch while the stream is capturing is not supported");
  if (e->running)
    return backend_fail(b, CGT_ERR_STATE, "sim: graph launch from inside a replay of the same executable");
  dev->counters.graph_launches++;
  exec_run(dev, e);
  return CGT_OK;
}

static void sim_graph_destroy(backend *b, void *graph, void *exec) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return;
  if (graph != NULL) {
    sim_graph *g = graph_of(dev, graph);
    if (g == NULL) {
      dev->counters.bad_frees++;
      snprintf(b->error, sizeof b->error, "sim: graph_destroy of something not a graph of this device");
    } else {
      list_remove(&dev->graphs, &g->head);
      dev->counters.live_graphs--;
      graph_free(g);
    }
  }
  if (exec != NULL) {
    sim_exec *e = exec_of(dev, exec);
    if (e == NULL || e->running) {
      /* A running executable stays alive (close frees it) rather than be
       * freed under the replay loop. */
      dev->counters.bad_frees++;
      snprintf(b->error, sizeof b->error, "sim: graph_destroy of %s",
               e == NULL ? "something not an executable of this device" : "an executable during its own replay");
    } else {
      list_remove(&dev->execs, &e->head);
      dev->counters.live_execs--;
      exec_free(e);
    }
  }
}

static cgt_status sim_copy(backend *b, void *dst, const void *src, size_t bytes) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  cgt_status s = stream_copy(&dev->stream, dst, src, bytes);
  if (s != CGT_OK) memcpy(b->error, dev->stream.detail, sizeof b->error);
  return s;
}

static cgt_status sim_sync(backend *b) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  cgt_status s = stream_sync(&dev->stream);
  if (s != CGT_OK) memcpy(b->error, dev->stream.detail, sizeof b->error);
  return s;
}

/* A chain of boxes in stream order, which is all the dependency structure a
 * stream capture has. */
static cgt_status sim_graph_dot(backend *b, void *graph, const char *path) {
  sim_device *dev = device_of(b);
  if (dev == NULL) return CGT_ERR_STATE;
  sim_graph *g = graph_of(dev, graph);
  if (g == NULL || path == NULL)
    return backend_fail(b, CGT_ERR_INVALID_ARGUMENT, "sim: graph_dot needs a graph of this device and a path");
  FILE *f = fopen(path, "w");
  if (f == NULL) return backend_fail(b, CGT_ERR_BACKEND, "sim: cannot open %s for writing", path);
  const sim_program *p = &g->program;
  int ok = fprintf(f, "digraph sim_graph {\n  node [shape=box];\n") >= 0;
  for (size_t i = 0; ok && i < p->count; i++) {
    const sim_node *n = &p->nodes[i];
    if (n->kind == SIM_NODE_KERNEL)
      ok = fprintf(f, "  n%zu [label=\"kernel #%zu, %zu arg bytes\"];\n", i, i, n->args_bytes) >= 0;
    else
      ok = fprintf(f, "  n%zu [label=\"memcpy %zu bytes\"];\n", i, n->copy_bytes) >= 0;
    if (ok && i > 0) ok = fprintf(f, "  n%zu -> n%zu;\n", i - 1, i) >= 0;
  }
  if (ok) ok = fprintf(f, "}\n") >= 0;
  if (fclose(f) != 0) ok = 0;
  if (!ok) return backend_fail(b, CGT_ERR_BACKEND, "sim: writing %s failed", path);
  return CGT_OK;
}

/* Ranges mark nothing on a CPU, but counting them lets tests check that the
 * tree pushes and pops in pairs. */
static void sim_range_push(backend *b, const char *name) {
  (void)name;
  sim_device *dev = device_of(b);
  if (dev != NULL) dev->counters.ranges_pushed++;
}

static void sim_range_pop(backend *b) {
  sim_device *dev = device_of(b);
  if (dev != NULL) dev->counters.ranges_popped++;
}

const backend_ops backend_sim_ops = {
    .name = "sim",
    .kind = CGT_BACKEND_SIM,
    .open = sim_open,
    .close = sim_close,
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .capture_begin = sim_capture_begin,
    .capture_end = sim_capture_end,
    .instantiate = sim_instantiate,
    .launch = sim_launch,
    .graph_destroy = sim_graph_destroy,
    .copy = sim_copy,
    .sync = sim_sync,
    .graph_dot = sim_graph_dot,
    .graph_find_copy = sim_graph_find_copy,
    .exec_set_copy_src = sim_exec_set_copy_src,
    .exec_copy_enable = sim_exec_copy_enable,
    .fuse = sim_fuse,
    .fused_find_copy = sim_fused_find_copy,
    .fused_set_copy_src = sim_fused_set_copy_src,
    .fused_launch = sim_fused_launch,
    .fused_destroy = sim_fused_destroy,
    .exec_update = sim_exec_update,
    .graph_bytes = sim_graph_bytes,
    .range_push = sim_range_push,
    .range_pop = sim_range_pop,
};

/* ------------------------------------------------- simulator-only knobs */

void backend_sim_set_limit(backend *b, size_t limit_bytes) {
  sim_device *dev = device_of(b);
  if (dev != NULL) dev->limit = limit_bytes;
}

void backend_sim_read_counters(const backend *b, backend_sim_counters *out) {
  if (out == NULL) return;
  const sim_device *dev = device_of(b);
  if (dev == NULL)
    memset(out, 0, sizeof *out);
  else
    *out = dev->counters;
}

size_t backend_sim_outstanding_bytes(const backend *b) {
  const sim_device *dev = device_of(b);
  return dev == NULL ? 0 : dev->counters.device_bytes;
}

int backend_sim_capturing(const backend *b) {
  const sim_device *dev = device_of(b);
  return dev != NULL && dev->stream.capture != SIM_CAPTURE_NONE;
}

/* ------------------------------------------------------ cgtree_sim.h */

cgt_status cgt_sim_launch(void *stream, cgt_sim_kernel k, const void *args, size_t args_bytes) {
  sim_stream *st = stream_of(stream);
  if (st == NULL) return CGT_ERR_INVALID_ARGUMENT;
  return stream_launch(st, k, args, args_bytes);
}

cgt_status cgt_sim_sync(void *stream) {
  sim_stream *st = stream_of(stream);
  if (st == NULL) return CGT_ERR_INVALID_ARGUMENT;
  return stream_sync(st);
}

cgt_status cgt_sim_memcpy_async(void *stream, void *dst, const void *src, size_t bytes) {
  sim_stream *st = stream_of(stream);
  if (st == NULL) return CGT_ERR_INVALID_ARGUMENT;
  return stream_copy(st, dst, src, bytes);
}

cgt_status cgt_sim_malloc(void *stream, size_t bytes, void **ptr) {
  sim_stream *st = stream_of(stream);
  if (st == NULL) return CGT_ERR_INVALID_ARGUMENT;
  if (ptr == NULL) return stream_fail(st, CGT_ERR_INVALID_ARGUMENT, "sim: cgt_sim_malloc with a NULL result pointer");
  if (st->capture != SIM_CAPTURE_NONE) return stream_forbidden_in_capture(st, "cgt_sim_malloc");
  return device_alloc(st->device, bytes, 1, ptr, st->detail);
}

/* Only memory from cgt_sim_malloc may be freed here: the pool's chunks are
 * burned into recorded graphs, and a launch function that freed one would
 * break every replay. */
cgt_status cgt_sim_free(void *stream, void *ptr) {
  sim_stream *st = stream_of(stream);
  if (st == NULL) return CGT_ERR_INVALID_ARGUMENT;
  if (ptr == NULL) return CGT_OK; /* like cudaFree(NULL) */
  if (st->capture != SIM_CAPTURE_NONE) return stream_forbidden_in_capture(st, "cgt_sim_free");
  size_t slot = device_find(st->device, ptr);
  if (slot == SIZE_MAX || !st->device->allocations[slot].user)
    return stream_fail(st, CGT_ERR_INVALID_ARGUMENT, "sim: cgt_sim_free of a pointer cgt_sim_malloc did not return");
  device_release(st->device, slot);
  return CGT_OK;
}
