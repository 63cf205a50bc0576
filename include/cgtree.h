/* cgtree — a CUDA graph tree runtime with checkpointed memory pools.
 *
 * A compiler splits a program at graph breaks into segments and calls them
 * through cgt_run(). The first time a path through the segments is taken the
 * runtime records one CUDA graph per segment; later steps that take the same
 * path replay those graphs. All recordings share one device-memory pool that is
 * checkpointed after each recording, so the program needs no more memory than
 * it would eagerly.
 *
 * This is the one public header (plus cgtree_sim.h for the simulator
 * backend). It compiles as C11 and as C++. Every function returns cgt_status,
 * results travel through out-parameters, and a failing call changes nothing
 * the caller can observe unless its comment says otherwise; it leaves a
 * one-line explanation in cgt_tree_last_error(). A NULL tree is always
 * CGT_ERR_INVALID_ARGUMENT. Out of memory is CGT_ERR_OUT_OF_MEMORY and
 * recoverable; the library never exits.
 *
 * Threads: one thread per tree at a time (the runtime takes no locks).
 * Different trees share nothing, so trees on different devices in different
 * threads are independent. A launch function runs on the thread that called
 * cgt_run, before it returns. A thread using a tree on device N must have N
 * as its current CUDA device (cgt_tree_create makes it current on the
 * creating thread).
 *
 * The full reference is docs/api.md (installed under share/doc/cgtree); the
 * contract is API.md of the design documents, and this file marks what it
 * adds as "extension".
 */
#ifndef CGTREE_H
#define CGTREE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CGT_API marks every function the shared library exports. The library is
 * built with hidden visibility (-fvisibility=hidden), so only names declared
 * with CGT_API, all of them cgt_*, reach libcgtree.so's dynamic symbol table;
 * internal helpers (pool_*, node__*, ...) stay private and cannot clash with a
 * host program's own symbols. A program may define CGT_API itself before
 * including this header. */
#ifndef CGT_API
#if defined(__GNUC__) || defined(__clang__)
#define CGT_API __attribute__((visibility("default")))
#else
#define CGT_API
#endif
#endif

/* The version of this header. cgt_version() tells the version of the library
 * that is actually loaded; a program can compare the two at start-up. The
 * shared library's soname is libcgtree.so.0 for all of 0.x (docs/api.md,
 * "Versions and ABI"). */
#define CGT_VERSION_MAJOR 0
#define CGT_VERSION_MINOR 1
#define CGT_VERSION_PATCH 0
#define CGT_VERSION_STRING "0.1.0"

/* "0.1.0": the version of the loaded library, a static string. */
CGT_API const char *cgt_version(void);

/* ---------------------------------------------------------------- status */

/* One table generates the enum, cgt_status_name() and cgt_status_string(). */
#define CGT_STATUS_MAP(X)                                                                       \
  X(OK, "success")                                                                              \
  X(ERR_INVALID_ARGUMENT, "invalid argument: NULL, counts that do not match the segment, or bad ids") \
  X(ERR_OUT_OF_MEMORY, "host or device allocation failed; nothing changed")                     \
  X(ERR_STALE_VALUE, "the value was released, or overwritten by a later step")                  \
  X(ERR_CAPTURE_FAILED, "stream capture failed; the node runs eagerly")                         \
  X(ERR_BACKEND, "the device runtime failed; see cgt_tree_last_error()")                        \
  X(ERR_NO_DEVICE, "the CUDA backend was asked for, but no usable GPU or driver is present")    \
  X(ERR_STATE, "the call is not allowed now")                                                   \
  X(ERR_SEGMENT_FAILED, "the segment's launch function failed or did not set every output")

typedef enum cgt_status {
#define CGT__STATUS_ENUM(name, text) CGT_##name,
  CGT_STATUS_MAP(CGT__STATUS_ENUM)
#undef CGT__STATUS_ENUM
  CGT_STATUS_COUNT /* extension: number of status codes */
} cgt_status;

/* "CGT_ERR_STALE_VALUE"; "CGT_UNKNOWN_STATUS" if out of range. Both return
 * static strings, valid forever; any thread may call them. */
CGT_API const char *cgt_status_name(cgt_status s);
CGT_API const char *cgt_status_string(cgt_status s); /* one-line human description */

/* ------------------------------------------------------------------ tree */

/* Opaque. Made by cgt_tree_create, freed by cgt_tree_destroy; one thread
 * at a time. */
typedef struct cgt_tree cgt_tree;

typedef enum cgt_backend { CGT_BACKEND_AUTO = 0, CGT_BACKEND_CUDA, CGT_BACKEND_SIM } cgt_backend;

typedef enum cgt_mode {
  CGT_MODE_TREE = 0, /* graph trees with one shared, checkpointed pool (the product) */
  CGT_MODE_EAGER,    /* never capture: every run is eager (baseline, and a kill switch) */
  CGT_MODE_SEPARATE  /* one graph per node, each with its own private pool, no sharing (baseline) */
} cgt_mode;

/* Zero means default: an all-zeros cgt_options behaves like one from
 * cgt_options_init, except warmup_runs (0 = record at once). In particular
 * rerecord_limit = 0 and pool_chunk_bytes = 0 mean their defaults; to turn
 * recording off, use CGT_MODE_EAGER. Adding a field here is an ABI break. */
typedef struct cgt_options {
  cgt_backend backend;       /* AUTO: CUDA when a usable GPU is present, else SIM */
  cgt_mode mode;
  int device;                /* CUDA device ordinal */
  void *stream;              /* cudaStream_t to run on (stays the caller's); NULL: the tree creates its own
                                (blocking) stream. Must be NULL on the simulator */
  uint32_t warmup_runs;      /* eager runs of a (segment, variant) before it may be recorded; default 1; 0 = record at once */
  uint32_t rerecord_limit;   /* max recorded children per (parent, segment, variant); past it the run is eager; default 32 */
  size_t pool_chunk_bytes;   /* granularity of pool growth; default 2 MiB */
  size_t pool_reserve_bytes; /* reserve this much at create; default 0 */
  void (*log_fn)(void *user, int level, const char *msg); /* NULL: stderr, filtered by CGT_LOG */
  void *log_user;
  /* Added 2026-11-22. */
  size_t pool_limit_bytes; /* cap on the device memory the tree holds in its pools (graph pool, side pool,
                              SEPARATE pools, placeholders); 0 = no cap. An allocation that would pass it
                              fails like a device out-of-memory: CGT_ERR_OUT_OF_MEMORY, nothing changed. */
  uint32_t defer_launch;   /* 0 (default): cgt_run enqueues its work before it returns. 1: replays may be
                              held back and launched later, several recorded nodes in ONE graph launch
                              (path fusion); see cgt_flush. */
  uint32_t prune_after_steps; /* extension: a WARMUP node that no step has reached for this many steps is
                                 removed, with its subtree (in TREE mode only WARMUP and EAGER nodes), so
                                 warmups under layouts that never recur do not pile up; 0 = default 256 */
  uint32_t time_launches;     /* extension: 1 = time each replay's graph launch call on the host (two clock
                                 reads per launch) into cgt_stats.launch_host_ns, so a caller can tell the
                                 launch of the kernels from the rest of its time; 0 (default) = don't */
  /* Extension (issue 23): a recording budget for long-running programs. When a recording leaves the
   * tree holding more than max_graphs recorded graphs, or more than max_graph_bytes in their executables
   * and checkpoints, the least recently replayed RECORDED node that is not on the current path, is
   * the last of its key group and has no such recording below it (leaves first) is evicted with its
   * subtree: its graph and checkpoint are dropped, the node goes back to WARMUP (it records again
   * when reached) and its descendants are removed. 0 = no cap (the default). */
  uint32_t max_graphs;     /* at most 1 << 24; more is CGT_ERR_INVALID_ARGUMENT */
  size_t max_graph_bytes;  /* 0, or at least CGT_MIN_GRAPH_BYTES; less is CGT_ERR_INVALID_ARGUMENT */
  /* Extension (issue 23): 0 (default) = when a run would record a new node only because STATIC
   * arguments moved (a reloaded checkpoint), the sibling recorded for the old addresses is captured
   * again and its executable updated in place (cudaGraphExecUpdate, or a fresh instantiate when the
   * device refuses), so the tree does not grow. 1 = record a new node, as before. Other values are
   * CGT_ERR_INVALID_ARGUMENT. */
  uint32_t no_update_in_place;
} cgt_options;

/* The least nonzero max_graph_bytes (extension): one small graph and its checkpoint. */
#define CGT_MIN_GRAPH_BYTES ((size_t)4096)
/* The largest max_graphs (extension). */
#define CGT_MAX_GRAPHS_LIMIT (1u << 24)

/* Log levels handed to log_fn (extension: the numbers behind CGT_LOG). */
enum { CGT_LOG_ERROR = 0, CGT_LOG_WARN = 1, CGT_LOG_INFO = 2, CGT_LOG_DEBUG = 3 };

CGT_API void cgt_options_init(cgt_options *o); /* writes the defaults above; NULL is a no-op */

/* Creates a tree; *out is the caller's until cgt_tree_destroy (NULL on
 * failure). o may be NULL (defaults). CGT_LOG and CGT_MODE are read here;
 * unknown values are ignored with a warning. CGT_ERR_NO_DEVICE when CUDA is
 * asked for and absent; CGT_ERR_INVALID_ARGUMENT for NULL out, an unknown
 * backend or mode, or a stream on the simulator. */
CGT_API cgt_status cgt_tree_create(const cgt_options *o, cgt_tree **out);
/* Waits for the tree's stream, then frees every graph, node, value, segment
 * and pool chunk, and the stream if the tree made it. NULL is a no-op. Every
 * value, value pointer and string of the tree dies with it. Never call it
 * inside a launch function. */
CGT_API void cgt_tree_destroy(cgt_tree *t);
CGT_API cgt_backend cgt_tree_backend(const cgt_tree *t);  /* the backend actually chosen */
CGT_API cgt_mode cgt_tree_mode(const cgt_tree *t);        /* extension: the mode in force (after CGT_MODE) */
/* The stream all segments run on. Owned by the tree if it made it (valid
 * until cgt_tree_destroy; do not destroy it). */
CGT_API void *cgt_tree_stream(const cgt_tree *t);
/* Detail of the last failing call on t, "" if none. Owned by the tree and
 * overwritten by the next failure: copy it to keep it. */
CGT_API const char *cgt_tree_last_error(const cgt_tree *t);
/* Waits for all work of the tree's stream (held-back work is enqueued
 * first). CGT_ERR_BACKEND when the device reports an error, CGT_ERR_STATE
 * inside a launch function. */
CGT_API cgt_status cgt_sync(cgt_tree *t);
CGT_API int cgt_cuda_available(void);                     /* 1 if a usable CUDA device and driver are present */

/* -------------------------------------------------------------- segments */

typedef uint32_t cgt_segment;
typedef struct cgt_launch cgt_launch; /* context handed to a launch function */
typedef cgt_status (*cgt_launch_fn)(cgt_launch *l, void *user);

typedef struct cgt_segment_desc {
  const char *name; /* copied; shown in logs, dot files and node info */
  cgt_launch_fn launch;
  void *user;       /* handed to launch; stays the caller's and must outlive the segment's runs */
  uint32_t n_inputs;
  uint32_t n_outputs;
  uint32_t flags; /* added 2026-11-22: 0, or CGT_SEGMENT_NO_CAPTURE */
} cgt_segment_desc;

/* Never capture this segment: its nodes are EAGER from their first run, with
 * reason "declared uncapturable" (MXNet's per-operator compatibility flag). */
#define CGT_SEGMENT_NO_CAPTURE 1u

/* Segment ids are small integers starting at 1, in registration order,
 * valid for the tree's life. CGT_ERR_INVALID_ARGUMENT for a NULL d, launch or
 * out, or more than 2^20 inputs or outputs; CGT_ERR_STATE inside a launch
 * function. */
CGT_API cgt_status cgt_segment_register(cgt_tree *t, const cgt_segment_desc *d, cgt_segment *out);

/* Extension: a function cgtree calls on the host right before each launch
 * of one of the segment's recorded graphs (the first launch of a recording,
 * an update in place, every replay), and never for warmups or eager runs
 * (the launch function runs then). It gets the tree's stream and the run's
 * variant; work it enqueues on that stream runs before the graph. It is for
 * per-launch host state a recording reads from device memory, such as a
 * random generator's seed and offset, which must be written (and the
 * generator advanced) once per launch. A status other than CGT_OK fails the
 * run with CGT_ERR_SEGMENT_FAILED, and the run changes nothing. Replays of
 * such a segment are never held back (defer_launch): each launches at once,
 * right after its prelaunch function. Inside it the rules of a launch
 * function hold: cgt_run, cgt_step_begin, cgt_sync, cgt_flush,
 * cgt_value_release, cgt_value_copy_out and cgt_segment_register return
 * CGT_ERR_STATE. fn NULL removes it. CGT_ERR_INVALID_ARGUMENT for an unknown
 * segment; CGT_ERR_STATE inside a launch or prelaunch function. */
typedef cgt_status (*cgt_prelaunch_fn)(void *user, void *stream, uint64_t variant);
CGT_API cgt_status cgt_segment_set_prelaunch(cgt_tree *t, cgt_segment s, cgt_prelaunch_fn fn, void *user);

/* Extension: a function the tree calls when the device refuses a chunk one
 * of its pools needs (not when pool_limit_bytes does), before the
 * allocation fails. It may give device memory held elsewhere in the process
 * back to the device (another allocator's cache) and return nonzero: the
 * chunk is then asked for once more; 0 says nothing was given back. It gets
 * the chunk's size. It runs on the thread whose call needed the chunk,
 * possibly inside a launch function or while the tree's stream captures a
 * recording: it must not synchronise a capturing stream or the device then,
 * and must not call the tree. fn NULL removes it. CGT_ERR_INVALID_ARGUMENT
 * for a NULL tree; CGT_ERR_STATE inside a launch or prelaunch function. */
typedef int (*cgt_reclaim_fn)(void *user, size_t bytes);
CGT_API cgt_status cgt_tree_set_reclaim(cgt_tree *t, cgt_reclaim_fn fn, void *user);

/* A launch function must enqueue the same work, with the same allocations in
 * the same order, every time it is called with the same input addresses and
 * variant: it is called for warmup and for recording, never for replay. It
 * must not sync the stream or device, cudaMalloc/cudaFree, or use the legacy
 * stream (capture fails and the node runs eagerly for good), and must set
 * every output (else the run fails with CGT_ERR_SEGMENT_FAILED). A status
 * other than CGT_OK fails the run, which then changes nothing.
 *
 * These calls are valid inside it and only inside it (CGT_ERR_STATE, NULL or
 * 0 elsewhere); the context dies when the launch function returns. Inside it
 * the read-only queries (cgt_tree_backend/mode/stream/last_error/stats/nodes)
 * are fine too; cgt_run, cgt_step_begin, cgt_sync, cgt_flush,
 * cgt_value_release, cgt_value_copy_out and cgt_segment_register return
 * CGT_ERR_STATE; never call cgt_tree_destroy from it. */
CGT_API void *cgt_launch_stream(cgt_launch *l);            /* cudaStream_t (or sim stream) */
/* Device pointer to read input i from; NULL if i is out of range. For a
 * DYNAMIC argument it is a placeholder in the pool, not the caller's
 * pointer. Stable for the node, so kernels may use it on every replay. */
CGT_API void *cgt_launch_input(cgt_launch *l, uint32_t i);
CGT_API size_t cgt_launch_input_bytes(cgt_launch *l, uint32_t i); /* 0 if i is out of range */
CGT_API uint64_t cgt_launch_variant(cgt_launch *l);
/* Pool memory, 256-byte aligned. It lives until the launch returns unless an
 * output lies in it (then as long as a value in it lives): workspaces need
 * no free. Return CGT_ERR_OUT_OF_MEMORY from the launch if it fails. */
CGT_API cgt_status cgt_launch_alloc(cgt_launch *l, size_t bytes, void **ptr);
/* A temporary of this launch, no longer needed by later work; anything else
 * is CGT_ERR_INVALID_ARGUMENT. */
CGT_API cgt_status cgt_launch_free(cgt_launch *l, void *ptr);
/* Output i is [ptr, ptr + bytes): memory allocated in this launch or inside
 * an input (an alias or a view). CGT_ERR_INVALID_ARGUMENT otherwise, or for
 * i out of range, NULL, 0 bytes or an overflowing range. */
CGT_API cgt_status cgt_launch_set_output(cgt_launch *l, uint32_t i, void *ptr, size_t bytes);

/* ------------------------------------------------------------------ runs */

/* A plain 64-bit handle (slot and generation): copy it freely, it needs no
 * freeing. It belongs to the tree that made it; another tree refuses it
 * (CGT_ERR_INVALID_ARGUMENT). */
typedef struct cgt_value {
  uint64_t bits;
} cgt_value; /* 0 is never a valid value */

/* Caller-owned means caller-owned: a STATIC or DYNAMIC argument that overlaps
 * memory of the tree's pools is refused with CGT_ERR_INVALID_ARGUMENT, in
 * every mode (pass the value instead). */
typedef enum cgt_arg_kind {
  CGT_ARG_VALUE,  /* a value from an earlier run of this step */
  CGT_ARG_STATIC, /* caller-owned device memory at a stable address: its address is part of the node key */
  CGT_ARG_DYNAMIC /* caller-owned device memory whose address may change: copied into a pool placeholder before replay */
} cgt_arg_kind;

typedef struct cgt_arg {
  cgt_arg_kind kind;
  cgt_value value; /* CGT_ARG_VALUE */
  const void *ptr; /* CGT_ARG_STATIC / CGT_ARG_DYNAMIC */
  size_t bytes;    /* CGT_ARG_STATIC / CGT_ARG_DYNAMIC */
} cgt_arg;

static inline cgt_arg cgt_arg_value(cgt_value v) {
  cgt_arg a;
  a.kind = CGT_ARG_VALUE;
  a.value = v;
  a.ptr = NULL;
  a.bytes = 0;
  return a;
}
static inline cgt_arg cgt_arg_static(const void *ptr, size_t bytes) {
  cgt_arg a;
  a.kind = CGT_ARG_STATIC;
  a.value.bits = 0;
  a.ptr = ptr;
  a.bytes = bytes;
  return a;
}
static inline cgt_arg cgt_arg_dynamic(const void *ptr, size_t bytes) {
  cgt_arg a;
  a.kind = CGT_ARG_DYNAMIC;
  a.value.bits = 0;
  a.ptr = ptr;
  a.bytes = bytes;
  return a;
}

/* Ends the current step: every value still live becomes stale (its memory
 * will be reused), and the path restarts at the roots. The first cgt_run
 * after create needs none. CGT_ERR_STATE inside a launch function. */
CGT_API cgt_status cgt_step_begin(cgt_tree *t);

/* Extension: a fingerprint of the current step's path so far, a running
 * hash of (segment id, variant) over every successful cgt_run since the step
 * began (cgt_step_begin or cgt_tree_create), the same in every mode. Two
 * trees whose programs registered their segments in the same order and took
 * the same path have equal hashes: data-parallel ranks compare it to catch a
 * divergence before a collective inside a segment hangs. */
CGT_API cgt_status cgt_tree_path_hash(const cgt_tree *t, uint64_t *out);

/* Enqueues every held-back replay (defer_launch = 1) on the tree's stream
 * now, in program order. With defer_launch = 0 nothing is ever held back
 * and it returns CGT_OK at once. CGT_ERR_STATE inside a launch function.
 * Held-back work is also enqueued, at the latest, by cgt_sync,
 * cgt_value_copy_out, cgt_value_ptr, cgt_step_begin, cgt_tree_destroy and any
 * cgt_run that warms up, records or runs eagerly; until then the caller must
 * not touch memory that held-back work reads or writes (STATIC and DYNAMIC
 * arguments included). Results are bit-for-bit those of defer_launch = 0.
 * Extension: if a held-back launch fails, this call (or whichever call
 * flushed) returns CGT_ERR_BACKEND and the rest of the held-back work is
 * dropped, never launched twice. */
CGT_API cgt_status cgt_flush(cgt_tree *t);

/* Runs segment seg with args, by replay, recording, warmup or eagerly.
 * Returns once the work is enqueued; outputs receive n_outputs new values,
 * live until released or the step ends. The node key is (seg, variant, the
 * address and size of every VALUE and STATIC argument, the size of every
 * DYNAMIC one). Statuses: CGT_ERR_INVALID_ARGUMENT (unknown segment, counts
 * that do not match it, bad or pool-overlapping caller memory, a value of
 * another tree), CGT_ERR_STALE_VALUE, CGT_ERR_SEGMENT_FAILED, CGT_ERR_STATE
 * inside a launch function, CGT_ERR_OUT_OF_MEMORY, CGT_ERR_BACKEND; on any of
 * them nothing changed.
 *
 * A capture failure is not an error here: when the backend reports the
 * capture invalidated, the node turns EAGER whatever the launch function
 * returned, runs eagerly once more, and cgt_run returns what that run
 * returns (any sticky device error the capture left is cleared). If the eager
 * run fails too, the run fails and changes nothing. */
CGT_API cgt_status cgt_run(cgt_tree *t, cgt_segment seg, uint64_t variant, const cgt_arg *args, uint32_t n_args,
                   cgt_value *outputs, uint32_t n_outputs);

/* ---------------------------------------------------------------- values */

/* A value is live from the cgt_run that made it until it is released or the
 * step ends. Every use of a value that is not live is CGT_ERR_STALE_VALUE
 * (counted in stats.stale_uses), never served from overwritten memory. */

/* The device address and size of a live value; either out-parameter may be
 * NULL, not both. The memory is the tree's: use it on the tree's stream or
 * after cgt_sync, only while the value is live, and never free it. */
CGT_API cgt_status cgt_value_ptr(cgt_tree *t, cgt_value v, void **ptr, size_t *bytes);
/* The caller will not use v again: its memory may be reused by later runs.
 * Release values where an eager program would free them. CGT_ERR_STATE
 * inside a launch function. */
CGT_API cgt_status cgt_value_release(cgt_tree *t, cgt_value v);
/* Async copy of the first `bytes` bytes of v to caller memory (device or host)
 * on the tree stream (cgt_sync before reading it on the host); bytes may not
 * exceed the value's size. CGT_ERR_STATE inside a launch function. */
CGT_API cgt_status cgt_value_copy_out(cgt_tree *t, cgt_value v, void *dst, size_t bytes);

/* --------------------------------------------------------- introspection */

typedef enum cgt_node_state {
  CGT_NODE_WARMUP,   /* seen, not yet recorded: runs eagerly in the pool */
  CGT_NODE_RECORDED, /* has a graph: replays */
  CGT_NODE_EAGER     /* capture failed or limits hit: runs eagerly outside the pool, for good */
} cgt_node_state;

CGT_API const char *cgt_node_state_name(cgt_node_state s); /* extension: "WARMUP", "RECORDED", "EAGER" */

typedef struct cgt_node_info {
  uint32_t id;     /* 1-based, in creation order; stable for the tree's life */
  uint32_t parent; /* 0 for a root */
  uint32_t depth;  /* 0 for a root */
  cgt_segment segment;
  uint64_t variant;
  cgt_node_state state;
  uint64_t replays;
  uint64_t eager_runs;    /* calls of its launch function outside a capture: its warmups and its
                             eager runs together (cgt_stats counts them apart, as warmups and
                             eager_runs) */
  size_t pool_bytes_live; /* pool bytes allocated at this node's checkpoint */
  const char *reason;     /* why the node is EAGER, else NULL; owned by the tree */
  const char *segment_name; /* extension: the segment's registered name; owned by the tree */
  uint64_t fused_runs;      /* extension: replays of this node launched inside fused launches (defer_launch) */
  uint64_t evictions;       /* extension: times the recording budget evicted this node's recording */
  const char *evict_reason; /* extension: why it was last evicted (a static string), NULL if never */
  uint64_t updates;         /* extension: times its executable was updated in place for moved STATIC arguments */
} cgt_node_info;

/* The stats fields as one list, for printers (extension). */
#define CGT_STATS_FIELDS(U64, SIZE)                                                              \
  U64(runs) U64(replays) U64(recordings) U64(warmups) U64(eager_runs) U64(checkpoint_restores)  \
  U64(rerecords) U64(capture_failures) U64(stale_uses) U64(nodes) U64(input_copies)             \
  U64(input_copy_bytes) SIZE(pool_reserved_bytes) SIZE(pool_allocated_bytes) SIZE(pool_peak_bytes) \
  SIZE(side_pool_peak_bytes) U64(host_allocs) U64(fused_launches) U64(fused_runs) U64(nodes_pruned)      \
  U64(launch_host_ns) U64(evictions) U64(nodes_evicted) U64(updates) U64(update_fallbacks) U64(graphs)  \
  SIZE(graph_bytes)

/* Pool figures: pool_allocated_bytes is what the allocator holds now. Replays
 * use the memory their recording reserved without telling the allocator, so
 * in a step of pure replays it reads what the last warmup, recording or
 * restore left (0 after cgt_step_begin). pool_peak_bytes is the high-water
 * mark of allocated bytes, failed runs' allocations included. In
 * CGT_MODE_SEPARATE they are summed over the nodes' private pools. */
typedef struct cgt_stats {
  /* Every cgt_run that succeeds counts in exactly one of replays, recordings, warmups or
   * eager_runs (runs of EAGER nodes and of CGT_MODE_EAGER, not warmups;
   * a capture failure's eager run counts here too). */
  uint64_t runs, replays, recordings, warmups, eager_runs;
  uint64_t checkpoint_restores, rerecords, capture_failures, stale_uses;
  uint64_t nodes, input_copies, input_copy_bytes;
  size_t pool_reserved_bytes, pool_allocated_bytes, pool_peak_bytes;
  size_t side_pool_peak_bytes; /* memory of eager nodes, outside the graph pool */
  uint64_t host_allocs;        /* extension: host allocations the tree made so far (0 on the replay path) */
  uint64_t fused_launches;     /* graph launches that replayed more than one node (defer_launch) */
  uint64_t fused_runs;         /* runs replayed inside those launches */
  uint64_t nodes_pruned;       /* extension: nodes removed by prune_after_steps (nodes counts those that exist) */
  uint64_t launch_host_ns;     /* extension: with options.time_launches, host nanoseconds spent inside the
                                  backend's graph launch calls of replays (plain and fused); else 0 */
  /* Extension (issue 23): the recording budget and update in place. */
  uint64_t evictions;        /* recordings the budget dropped: each evicted node's, and its RECORDED descendants' */
  uint64_t nodes_evicted;    /* descendants removed with them (nodes counts those that exist) */
  uint64_t updates;          /* recordings that updated a sibling's executable in place (also in recordings) */
  uint64_t update_fallbacks; /* of those, the device refused the update and a fresh instantiate replaced it */
  uint64_t graphs;           /* recorded graphs held now */
  size_t graph_bytes;        /* bytes they hold now: checkpoints' host bytes plus the backend's estimate of each
                                executable (what max_graph_bytes caps) */
} cgt_stats;

CGT_API cgt_status cgt_tree_stats(const cgt_tree *t, cgt_stats *out);
/* Writes at most cap entries ordered by id and sets *count to the total
 * number of nodes (cap = 0 asks for the count; out may then be NULL). The
 * entries' strings are the tree's, valid until cgt_tree_destroy.
 * Pruned nodes (prune_after_steps) no longer exist: the list skips their
 * ids, *count does not include them, and the ids of the nodes that remain
 * never change. Ids are never reused. */
CGT_API cgt_status cgt_tree_nodes(const cgt_tree *t, cgt_node_info *out, size_t cap, size_t *count);
/* Graphviz: one box per node with segment, state, replays. Does not close f. */
CGT_API cgt_status cgt_tree_write_dot(const cgt_tree *t, FILE *f);

/* Extension: asserts every structural invariant of the tree (links, keys,
 * value slots, pool agreement). Returns CGT_OK or CGT_ERR_STATE with the
 * broken invariant in cgt_tree_last_error(). Tests call it after each run. */
CGT_API cgt_status cgt_tree_check(cgt_tree *t);

#ifdef __cplusplus
}
#endif

#endif /* CGTREE_H */
