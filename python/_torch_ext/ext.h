/* ext.h — shared declarations of cgtree._torch_ext, the C half of the
 * torch.compile backend (python/cgtree/torch).
 *
 * One job per file:
 *   alloc.c    the process-wide CUDA allocator PyTorch calls for every byte:
 *              inside a cgtree launch function it hands out pool memory,
 *              outside it routes to eager.c.
 *   eager.c    memory outside the pool: the CUDA driver's stream-ordered
 *              pools behind a small front cache for same-stream reuse,
 *              record_stream, frees set aside during captures.
 *   segment.c  the hot path: one compiled graph as a cgtree segment; tensors in,
 *              cgt_run, tensors out (DLPack), all in C. What its calls need
 *              besides is in the seg_*.c files its header, segment.h, lists.
 *   stale.c    outputs kept past their step raise on any access.
 *   module.c   the module, the Tree object (one per device and thread), steps,
 *              stats and helpers.
 *   exchange.c data pointers, the current stream and output tensors through
 *              DLPack's C exchange API, each use proven first.
 *   dev.c      the few CUDA runtime calls (host memory without CUDA, for tests).
 */
#ifndef CGT_TORCH_EXT_H
#define CGT_TORCH_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "cgtree.h"
/* uthash must never exit(): an insertion that runs out of host memory sets
 * tx_hash_oomed (this thread's) and leaves the table as it was. Every
 * insertion clears it first and checks it after; lookups and deletions
 * never allocate. */
extern _Thread_local int tx_hash_oomed;
/* malloc, calloc and realloc, which a test can make fail (module.c,
 * _fail_host_alloc): every host allocation of the extension uses them. */
void *tx_malloc(size_t bytes);
void *tx_calloc(size_t n, size_t size);
void *tx_realloc(void *p, size_t bytes);
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) tx_malloc(sz)
#define uthash_free(ptr, sz) free(ptr)
#define uthash_nonfatal_oom(elt) (tx_hash_oomed = 1)
#include <uthash.h>

/* DLPack: the structs of python/dlpack.h, which the cgtree binding uses too
 * (output tensors are "dltensor" capsules over DLManagedTensor). */
#include "dlpack.h"

/* ------------------------------------------------------------ alloc.c */

/* While a launch function of ours runs on this thread, every allocation
 * PyTorch makes goes to the tree's pool through this launch. */
void tx_alloc_launch_enter(cgt_launch *l);
void tx_alloc_launch_leave(void);
/* Around each cgt_run: a capture may run from before its launch function
 * until after it, and eager blocks must not reach the driver meanwhile. */
void tx_alloc_run_enter(void);
void tx_alloc_run_leave(void);
/* Gives back eager blocks freed during runs, if no run is under way now
 * (segment.c calls it at every call, outside cgt_run). */
void tx_alloc_flush_if_idle(void);
/* The allocations this thread was refused so far (out of device or host
 * memory; alloc_entry.h's tx_alloc_refusal_text describes the last). */
uint64_t tx_alloc_refusals(void);
int tx_alloc_refusal_is_oom(void); /* this thread's last refusal was for want of memory (not another CUDA error) */
/* Every tree's reclaim function (cgt_tree_set_reclaim; user: its TreeObject):
 * the eager caches give their memory back to the device, unless a capture
 * may be open; nonzero if they did. */
int tx_alloc_reclaim(void *tree_object, size_t bytes);
/* record_stream(ptr, stream), from either door (the C++ hook's
 * cgt_torch_record_stream, or the Python wrapper's _ext.record_stream): 1
 * kept on an eager block (its free waits), 0 not an eager block, so noted
 * for the trees' next launches (pool_readers.c), -1 out of host memory
 * (nothing changed). */
int tx_alloc_record_stream(void *ptr, void *stream);
/* Records refused for want of host memory, and those whose stream the host
 * waited for before the call failed (alloc.c, record_refused). */
void tx_alloc_records_refused(uint64_t *refused, uint64_t *synced);

typedef struct tx_alloc_figures {
  size_t eager_in_use, eager_peak; /* outside the pool, counted as PyTorch counts memory_allocated */
  uint64_t pool_allocs, pool_frees_in_launch, pool_frees_ignored, pool_alloc_failures;
  uint64_t pool_alloc_retries; /* pool chunks asked for again after the eager caches gave their memory back */
  size_t pool_in_use;   /* the trees' pool bytes in use, as last reported (tx_alloc_note_pool_in_use) */
  size_t combined_peak; /* the most of eager_in_use + pool_in_use at one moment */
} tx_alloc_figures;
void tx_alloc_figures_get(tx_alloc_figures *out);
void tx_alloc_reset_peak(void);                /* eager_peak and combined_peak restart from now */
/* A tree's pool bytes in use now; *reported is what that tree reported last
 * (its own slot, so that trees of several threads on one device add up). */
void tx_alloc_note_pool_in_use(size_t *reported, size_t bytes);
/* No cgt_run is under way on any thread: no capture of ours is open. */
int tx_alloc_idle(void);
/* One lock for alloc.c's figures and eager.c's blocks, so that a free or
 * an allocation served without the driver takes it once. */
extern pthread_mutex_t tx_alloc_mu;
/* eager.c, with tx_alloc_mu held: bytes went into use outside the pool,
 * or came out of use. */
void tx_alloc_eager_took_locked(size_t bytes);
void tx_alloc_eager_returned_locked(size_t bytes);

/* ------------------------------------------------------------ eager.c */

typedef struct tx_eager_figures {
  uint64_t allocations, frees, num_alloc_retries, num_ooms, recorded_streams, deferred_frees;
  uint64_t driver_allocations, driver_frees; /* blocks taken from and given back to the driver's pools */
  uint64_t front_hits, front_returns; /* allocations the front cache served; its blocks given back (bound, drain) */
  uint64_t blocks_rehomed; /* live blocks whose stream was retired: freed on the legacy stream since */
  uint64_t capture_allocations; /* made inside a capture cgtree did not begin: never front-cached */
  uint64_t capture_free_nodes;  /* such blocks freed while their capture was open: a node of its graph */
  uint64_t frees_waiting_capture; /* gives back put off because their stream captured (not their capture) */
  uint64_t trims_without_sync; /* trims that did not synchronise the device: a capture was or might be open */
  uint64_t driver_alloc_errors; /* allocations the driver's pool refused for another cause than memory */
  size_t in_use;          /* of one device, counted as PyTorch counts memory_allocated */
  size_t live_blocks;     /* of every device */
  size_t front_bytes, front_blocks; /* of one device: freed blocks the front cache keeps (still the driver's) */
  size_t front_limit;     /* the front cache's bound per device (0: off) */
  size_t reserved, reserved_peak; /* what the device's stream-ordered pool holds (0 if unknown) */
} tx_eager_figures;
typedef struct eager_block tx_eager_block;
/* size bytes on device, usable on stream: from the front cache when a
 * block of the same device, stream and size class waits there, else from
 * the driver's pool. NULL when out of memory, after draining the device's
 * front cache, one trim and a retry. Takes tx_alloc_mu. */
void *tx_eager_alloc(size_t size, int device, void *stream);
/* With tx_alloc_mu held: p's bytes leave the bytes in use, and p goes to
 * the front cache when it can (no stream call), else it is to be given
 * back after its stream's and every recorded stream's work so far. Returns
 * the blocks to give back now, for tx_eager_give_back once the lock is
 * released (NULL if none, or if p is not ours). With `later` (a capture
 * may run) nothing is to be given back now: such blocks are set aside for
 * tx_eager_flush. */
tx_eager_block *tx_eager_free_locked(void *p, int later);
void tx_eager_give_back(tx_eager_block *list); /* without tx_alloc_mu: the CUDA calls of the frees */
void tx_eager_flush(void); /* gives back what tx_eager_free_locked set aside; never while a capture may run */
/* p is used on stream too (Tensor.record_stream): 1, 0 if p is not an
 * eager block of ours in use, -1 out of host memory. */
int tx_eager_record_stream(void *p, void *stream);
void tx_eager_figures_get(int device, tx_eager_figures *out);
/* Gives the device's front-cached blocks back, then gives every byte its
 * pool caches back to the device, after synchronising it if
 * none_of_ours_open (the caller knows no capture of ours may be open) and
 * no capture not ours is known open (eager.c). */
void tx_eager_trim(int device, int none_of_ours_open);
/* The stream is about to be destroyed, its work done: its front-cached
 * blocks go back to the driver now, and live blocks allocated on it (or
 * recorded on it) are freed on the legacy default stream from now on.
 * Only where no capture may run (tx_alloc_idle). */
void tx_eager_retire_stream(int device, void *stream);
void tx_eager_set_cache_bytes(uint64_t bytes); /* the pools' release threshold, for devices not used yet */
/* The front cache's bound per device (0 turns it off); blocks over it are
 * set aside, to be given back at the next tx_eager_flush. */
void tx_eager_set_front_bytes(size_t bytes);
/* A debugging aid: eager blocks in use allocated after serial `since`. */
uint64_t tx_eager_serial(void);
size_t tx_eager_held(uint64_t since, size_t *sizes, uint64_t *serials, void **ptrs, size_t cap);

/* What weak reference w refers to (a new reference), or NULL if it died;
 * never leaves an exception. */
static inline PyObject *tx_weakref_get(PyObject *w) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject *x = NULL;
  if (PyWeakref_GetRef(w, &x) < 0)
    PyErr_Clear();
  return x;
#else
  PyObject *x = PyWeakref_GetObject(w);
  if (!x) {
    PyErr_Clear();
    return NULL;
  }
  return x == Py_None ? NULL : Py_NewRef(x);
#endif
}

/* ------------------------------------------------------------- dev.c */

size_t tx_events_live(void);                 /* events made and not yet destroyed */
void *tx_event_create(void);                 /* NULL without CUDA; on the current device */
/* An event of device (which it must be recorded on: CUDA refuses a record
 * on another device's stream), first recorded on that device's legacy
 * stream if record_on_legacy; NULL without CUDA or if CUDA refuses. */
void *tx_event_create_on(int device, int record_on_legacy);
void tx_event_destroy(void *event);          /* no-op for NULL */
/* The device's stream-ordered pool: memory usable on `stream` in stream
 * order; NULL when out of memory (no error left behind). keep_bytes: what
 * the pool keeps cached when the device synchronises (set at first use). */
void *tx_dev_pool_alloc(size_t bytes, int device, void *stream, uint64_t keep_bytes);
void tx_dev_pool_free(void *p, int device, void *stream); /* ordered after the work on stream */
/* Frees p, memory the open capture `capture` allocated, as a node of that
 * capture's graph ordered after the work so far of stream and of each of
 * also[] that captures it too, and no stream's work: 1 done; 0 not (stream
 * does not capture `capture` now, CUDA refused, or device -1). */
int tx_dev_capture_free(void *p, int device, void *stream, void *const *also, size_t n_also,
                        unsigned long long capture);
/* Why this thread's last tx_dev_pool_alloc failed: a cudaError_t, 0 if it
 * did not (TX_ERR_OUT_OF_MEMORY: cudaErrorMemoryAllocation, the simulator's
 * malloc failing). tx_dev_error_is_memory: whether an error may be for want
 * of memory (0 for a capture error, one that lost the context, a device or
 * stream that is not there; 1 for any other code); tx_dev_error_text names
 * one. */
#define TX_ERR_OUT_OF_MEMORY 2
int tx_dev_pool_error(void);
int tx_dev_error_is_memory(int error);
const char *tx_dev_error_text(int error);
void tx_dev_sim_fail_pool_allocs(int error, int count); /* device -1's next `count` pool allocations fail so */
/* Give every cached byte back; may_sync: synchronise the device first, so
 * that frees still waiting on their streams' work count (only where no
 * capture may be open on any stream of the device: CUDA forbids it then). */
void tx_dev_pool_trim(int device, int may_sync);
/* Puts the calling thread in CUDA's thread-local capture mode, in which
 * other threads' captures do not forbid its calls (and its calls do not
 * break them), unless it is in relaxed mode, which is looser still and
 * stays; returns what tx_dev_heed_other_captures puts back (-1: nothing,
 * in relaxed mode, without CUDA or a driver). Around the CUDA calls cgtree
 * makes for itself: a compiled graph's call, a step begun from Python, a
 * tree's close or sync, the eager allocator's calls to the driver (dev.c's
 * essay). */
int tx_dev_ignore_other_captures(void);
void tx_dev_heed_other_captures(int saved);
/* The id of the capture open on stream (cudaStreamGetCaptureInfo), 0 if
 * none is, TX_CAPTURE_UNKNOWN if CUDA cannot tell (callers treat that as a
 * capture: no synchronising, no front-cached memory). The legacy stream
 * (NULL) never captures and is never asked: asking it while another thread
 * captures in global mode could break that capture. On the simulator
 * (device -1), what tx_dev_sim_set_capture last said for the stream. */
#define TX_CAPTURE_UNKNOWN (~0ULL)
unsigned long long tx_dev_capture_id(int device, void *stream);
int tx_dev_sim_set_capture(void *stream, unsigned long long id); /* id 0 ends it; 0 if the table is full */
int tx_dev_pool_figures(int device, size_t *reserved, size_t *reserved_peak); /* 0 if unknown */
void tx_dev_pool_reset_peaks(void); /* each pool's reserved high-water mark restarts from what it holds now */
void tx_dev_stream_after(void *waiter, void *signaller, int device); /* waiter waits for signaller's work so far */
void *tx_dev_stream_create(int device); /* a non-blocking stream of device, NULL if CUDA refuses (or none) */
void tx_dev_stream_destroy(void *stream, int device); /* its work done first; NULL: no-op */
int tx_dev_stream_device(void *stream); /* the stream's device; -1 if unknown, and for NULL (whose legacy stream?) */
/* Waits on the host for stream's work so far, where ptr is CUDA device
 * memory and stream is not capturing: 1 if it waited, else 0 (the
 * simulator's memory, a capture, an error). */
int tx_dev_sync_stream_reading(const void *ptr, void *stream);
void tx_stream_wait(void *waiter, void *signaller, void *event); /* waiter waits for signaller's work so far */
void tx_event_record(void *event, void *stream); /* no-op for a NULL event */
void tx_event_wait(void *stream, void *event);   /* stream waits for the event's last record; no-op for NULL */

/* --------------------------------------------------------- module.c */

/* Whose a tree's stream is. The C tree's own (blocking) or one module.c
 * made (non-blocking, for explicit mode: not one of PyTorch's pool of 32
 * per device, which other threads' streams share) is retired in eager.c
 * and destroyed at the tree's close; one handed in stays its maker's. */
enum tx_stream_made { TX_STREAM_MADE_BY_TREE, TX_STREAM_MADE_HERE, TX_STREAM_HANDED_IN };

/* One tree per CUDA device, shared by every compiled graph on it. */
typedef struct tx_out_ref tx_out_ref;
typedef struct tx_page_bucket tx_page_bucket;
struct seg_run;
typedef struct TreeObject {
  PyObject_HEAD
  cgt_tree *tree;
  int device;
  int on_simulator;      /* a test's tree: its eager memory is device -1's (host memory) */
  void *stream;          /* the tree's stream */
  int blocking;          /* it is a blocking stream: the legacy default stream orders with it by itself */
  int stream_made;       /* whose stream it is: enum tx_stream_made */
  PyObject *device_obj;  /* device as a Python int, for the raw stream getter */
  void *ev_in, *ev_out;  /* cudaEvent_t, for callers on a stream other than the legacy default */
  uint64_t step;         /* our count of cgt_step_begin calls */
  long long last_generation, last_mark_step;
  int explicit_steps;    /* steps begin only at step_begin() and cudagraph_mark_step_begin() */
  /* The thread whose tree it is (PyThread_get_thread_ident; the making
   * thread unless cgtree.torch says otherwise): only that thread keeps it
   * in its per-thread cache of trees (seg_runs.c, current_tree). */
  unsigned long owner_thread;
  /* A cgt_run of segment.c on this tree is under way (on its thread, which
   * may have let the GIL go inside it): other threads leave the C tree
   * alone meanwhile (tx_out_ref_queue_drain defers its releases). */
  int in_run;
  tx_out_ref *registry;  /* output tensors handed out and still alive, keyed by the tensor object */
  uint64_t outputs_made, stale_refused;
  /* Outputs the plain graph returned tied to an earlier one (the same
   * object, or over its storage), handed out tied (seg_outputs.c, tied_output),
   * and those that could not be, made tensors of their own. */
  uint64_t outputs_tied, outputs_tied_apart;
  uint64_t outputs_viewing_values; /* outputs made views of a VALUE argument (seg_outputs.c, value_input_view) */
  uint64_t replays_seen; /* the tree's replay count after the last cgt_run of segment.c (its timers) */
  uint64_t capture_failures_seen; /* and its capture failures (a failure turns the segment plain) */
  uint64_t eager_runs_seen; /* and its eager runs (their outputs lie in the side pool) */
  int warned_evicting;   /* the budget's first eviction was reported */
  uint64_t readers_seen; /* pool_readers.c's generation this tree's stream has waited up to, for good */
  uint64_t readers_step; /* the step whose first launch moved readers_seen last (pool_readers.c) */
  /* Callers' streams (pool_readers.c, tx_pool_readers_caller): the last
   * call's, and those the calls left since, which launches wait for. */
  void *last_caller;
  uint64_t last_caller_step; /* the step of that call */
  int called;                /* a call was made: last_caller says whose */
  struct tx_caller_note *caller_notes;
  size_t n_caller_notes, cap_caller_notes;
  uint64_t launch_ns_seen; /* and its launch_host_ns (with time_launches) */
  int timed;             /* made with time_launches: its segment calls time their parts (segment.c) */
  uint64_t alive_this_step;    /* outputs of the current step whose tensors live */
  uint64_t overwritable;       /* summed at each step begin: outputs alive whose memory the new step may reuse */
  uint64_t marked_stale;       /* storages of such outputs made to raise on any access (stale.c) */
  tx_out_ref *step_outputs;    /* this step's outputs whose storage may live: marked when the step ends */
  tx_page_bucket *step_pages;  /* and their index by address (step_outputs.c) */
  size_t step_pages_swept;     /* its number of buckets at the last sweep of empty ones */
  /* Training (module.c, "Steps in training"): saved activations of this
   * step's forwards whose tensors live, i.e. backwards still pending. */
  uint64_t saved_alive;
  uint64_t tied_saved_alive; /* holds of this step's outputs for saved results tied to them or viewing them
                              * (tx_out_ref.tied_saved, .saved_views; a plain forward's saved results among
                              * the views: seg_steps.c, seg_plain_saved_hold_step) */
  /* Weak references to the outputs training forwards of this step handed
   * the program since the last backward call (module.c,
   * tx_tree_note_forward_output): one alive that requires grad is a
   * backward still to come, though no saved activation lives (activation
   * checkpointing keeps none). NULL until the first. */
  PyObject *forward_outs;
  /* Such outputs watched through their memory instead (a new tensor over
   * it is what the program holds: segment.h, memory_watched): those of
   * them alive, counted down by the drain (tx_out_ref.watched_until). */
  uint64_t forward_memory_watched;
  /* Outputs of inference graphs (no backward, no saved activation: a
   * frozen teacher or encoder under no_grad) made in this step before its
   * first backward, watched through their memory the same way: one alive
   * holds the step for a training forward's call, which may be what reads
   * it next (module.c, "Inference outputs a training forward reads"). */
  uint64_t inference_memory_watched;
  uint64_t inference_watches_ended; /* how often all of them ended: which watches an end ended (tx_out_ref) */
  uint64_t steps_held_for_inference_outputs; /* training forwards' calls that began no step for one */
  uint64_t backward_calls; /* backward segment calls so far: which watches a backward call ended */
  uint32_t generations_deferred; /* compiled calls since the step began that began none (backwards pending) */
  uint32_t optimizer_calls_held; /* those of them held as the step's optimizer, writing an input (module.c) */
  uint32_t gradient_reads_held;  /* and those held as the step's optimizer reading a gradient */
  uint64_t steps_deferred;       /* all such calls */
  uint64_t steps_kept_after_backward; /* calls that began no step as the step's optimizer (module.c) */
  int backward_this_step;        /* a backward segment ran in this step */
  int grad_readers_step;         /* this step began at a call that read a kept .grad (TX_OPTIMIZER_READS_GRAD_FIRST) */
  int step_mark_pending;         /* step_begin() was called: the next call begins a step (module.c) */
  int ran_other_than_backward;   /* a segment that is no backward ran on this tree (module.c) */
  uint64_t steps_forced;         /* steps begun with backwards pending (PENDING_GENERATIONS_MAX) */
  uint64_t optimizer_steps_forced; /* steps begun past the bound of calls held as the optimizer (module.c) */
  int warned_gradient_reads;       /* the warning of that bound, for calls that read a gradient, was given */
  /* Gradients (stale.c): the leaves that require grad among the inputs of
   * training forwards, where AccumulateGrad may put a backward's output,
   * as a dict id(leaf) -> weak reference; its size at the last pruning of
   * dead ones; .grad tensors moved out of the pool at a step's end. */
  PyObject *grad_leaves;
  Py_ssize_t grad_leaves_pruned;
  uint64_t grads_moved;
  /* Where the .grad of every live tree's leaves lie, sorted by where they
   * begin (malloc'd), read at a call after a backward (tx_kept_grad_among)
   * and kept for the calls after it until the step, the backwards called
   * or the leaves and moves of all trees (tx_kept_grads_generation) move
   * on. */
  struct tx_kept_grad *kept_grads;
  size_t n_kept_grads;
  uint64_t kept_grads_step, kept_grads_backwards; /* when read (backwards: backward_calls + 1; 0: never) */
  uint64_t kept_grads_generation;
  /* The segment call whose step is being brought up to date (seg_steps.c,
   * seg_run_in_step), or NULL: a step that begins there first moves that
   * call's arguments that lie in outputs of the ending step
   * (tx_move_call_args), and how many it moved so far. */
  void *syncing_call;
  uint64_t args_moved;
  /* Lifetime (tree_close.c). */
  char orphaned;           /* its thread exited: no call will come but a backward of outputs still alive */
  char closed;             /* its C tree and pools are gone; a husk that reports last_stats (both: T_BOOL members) */
  uint64_t out_refs;       /* output records (tx_out_ref) not yet freed: tensors that may name the tree */
  struct seg_run **runs;   /* the segments' runs in this tree (seg_runs.c), dropped at its close */
  size_t n_runs, cap_runs;
  size_t pool_in_use_reported; /* what it last told alloc.c (tx_alloc_note_pool_in_use) */
  struct TreeObject *live_prev, *live_next; /* on module.c's list of initialised trees (under the GIL) */
  int on_live_list;
  cgt_stats last_stats;    /* its C tree's counters at its close */
} TreeObject;

/* ------------------------------------------------------ pool_readers.c */

/* record_stream(t, stream) where t's memory is not an eager block of ours
 * (a compiled graph's output): the next launch of each tree of stream's
 * device waits for stream's work so far. 1 noted, -1 out of host memory
 * (nothing changed). */
int tx_pool_readers_note(void *stream);
uint64_t tx_pool_readers_generation(void); /* a new tree's readers_seen */
/* Before a launch on T's stream, after it waited for caller (the caller's
 * stream): T's stream waits for every stream noted since its last wait. */
void tx_pool_readers_wait(TreeObject *T, void *caller);
/* At each call of a segment of T from caller (the caller's stream): the
 * stream of T's last call, if another that CUDA does not order with T's
 * stream by itself, is noted for T's launches to wait for (outputs handed
 * there may still be read there). 0, or -1 out of host memory with an
 * exception set (nothing changed). */
int tx_pool_readers_caller(TreeObject *T, void *caller);
/* A call on another tree reads an output of owner's step on `reader`
 * (that tree's stream, or the caller's where the call runs plainly): the
 * owner's launches wait for reader until one of a later step. Under the
 * GIL. 0, or -1 out of host memory with an exception set (nothing
 * changed). */
int tx_pool_readers_other_tree(TreeObject *owner, void *reader);
void tx_pool_readers_tree_free(TreeObject *T); /* T's notes of callers' streams */
/* Drops T's notes of `stream`: a closing tree's own stream, which another
 * tree noted where the closing tree read its outputs (its work is over by
 * then, and the handle is about to be destroyed: a review). */
void tx_pool_readers_forget_stream(TreeObject *T, void *stream);
void tx_pool_readers_figures(uint64_t *streams, uint64_t *waits_made, uint64_t *waits_put_off);

/* ---------------------------------------------------- reads_in_flight.c */

/* Each compiled call, in seg_vectorcall: begins (the mark to end with) and
 * ends, however it returns; the reads it began end with it. */
size_t tx_reads_call_begins(void);
void tx_reads_call_ends(size_t mark);
/* A call reads an output of owner's step (tx_pool_readers_other_tree):
 * in flight until the call returns. 0; -1 out of host memory (MemoryError). */
int tx_reads_begin(TreeObject *owner);
/* At T's step's end, before anything of it: waits, the GIL let go, for
 * each call of another thread that reads an output of T's step, until
 * none is left, the last look made holding the GIL. In a call made inside
 * another's Python it waits for nothing: if such a read is in flight, it
 * raises CgtreeError. 0; -1 with an exception set. */
int tx_reads_wait_for_calls(TreeObject *T);
/* A step's end that waited this long for another thread's call warns (a
 * RuntimeWarning naming the thread; an error where the program's filter
 * makes it one), once per wait; 0: never. The bound before. */
uint64_t tx_reads_set_warn_after_ms(uint64_t ms);
/* Around a step's end's moves, and around its take of its outputs and
 * their marks (stale.c): a look-up that crossed either sees it. */
void tx_reads_outputs_change_begin(void);
void tx_reads_outputs_change_end(void);
/* Read before an argument's pointer; before its look-up, crossed says if
 * a step's end began since (the argument may have been moved or marked).
 * Then settle (it waits for the ends under way, the GIL let go, and gives
 * the ends begun by then), read the pointer again, and where an end began
 * since (tx_reads_begun_since) read it afresh; else look it up and note
 * the read, then settled: steps' ends wait for a settling look-up before
 * their take. */
uint64_t tx_reads_ends_seen(void);
int tx_reads_crossed(uint64_t seen);
int tx_reads_settle(uint64_t *begun); /* 0; -1 (CgtreeError) inside this thread's end while another's runs */
int tx_reads_begun_since(uint64_t begun);
void tx_reads_settled(void);
/* Steps' ends this thread refused inside another call, so far: a graph
 * that raised while one was refused in it is not sent plain for it. */
uint64_t tx_reads_refusals(void);
void tx_reads_figures(uint64_t *step_waits, uint64_t *rechecks);

extern PyTypeObject TreeType;
extern PyObject *TxError;      /* cgtree.torch.CgtreeError */
extern PyObject *TxStaleError; /* cgtree.torch.StaleTensorError (subclass) */

/* Cached Python objects of the hot path (set at module init / install). */
typedef struct tx_py {
  PyObject *from_dlpack;     /* torch._C._from_dlpack */
  PyObject *raw_stream;      /* torch._C._cuda_getCurrentRawStream */
  PyObject *generation_cls;  /* torch._dynamo.mutation_guard.GenerationTracker */
  PyObject *tensor_type;     /* torch.Tensor */
  PyObject *data_ptr;        /* torch.Tensor.data_ptr, called unbound: no method lookup per input */
  PyObject *blas_clear;      /* torch._C._cuda_clearCublasWorkspaces, or NULL (see seg_launch.c) */
  PyObject *ptrs_equal;      /* torch._C._tensors_data_ptrs_at_indices_equal, or NULL (see seg_runs.c) */
  PyObject *storage_mark;    /* torch._C._set_storage_data_ptr_access_error_msg, or NULL (stale.c) */
  PyObject *tree_for;        /* cgtree.torch's tree of the calling thread for a device, or NULL: one tree */
  uint64_t tree_epoch;       /* moves at each set_tree_getter: per-thread caches of trees are dropped */
  int any_timed;             /* a tree was made with time_launches: a segment call reads the clock at its start */
  PyObject *mark_step_cls;   /* torch._inductor.cudagraph_trees.MarkStepBox, or NULL */
  PyObject *oom_error;       /* torch.OutOfMemoryError, or NULL: what a compiled graph's refused allocation raises */
  PyObject *graph_task_id;   /* torch._C._current_graph_task_id, or NULL: -1 unless autograd runs a backward here */
  PyObject *output_mover;    /* cgtree.torch._backend.move_out_of_pool, or NULL: no argument is moved (stale.c) */
  PyObject *grad_node_kind;  /* cgtree.torch._grad_nodes.grad_node_kind, or NULL: no walk behind inputs (stale.c) */
  PyObject *grad_node_kinds; /* its answers: dict type -> GRAD_NODE_*, or NULL */
  PyObject *str_data_ptr, *str_generation, *str_untyped_storage, *str_cdata, *str_mark_step;
  PyObject *str_grad, *str_is_leaf, *str_requires_grad, *str_clone, *str_set, *str_nbytes; /* gradients (stale.c) */
  PyObject *str_grad_fn, *str_next_functions, *str_variable; /* autograd's graph behind an input (stale.c) */
  PyObject *str_is_cuda, *str_get_device; /* an input's device, where the exchange API does not give it */
  PyObject *str_storage_offset, *str_element_size; /* an input's layout, for outputs that alias it (seg_outputs.c) */
  PyObject *str_dtype, *str_as_strided; /* an output made a view of the caller's tensor (seg_outputs.c) */
  PyObject *str_version; /* a tensor's count of writes in place (read_memo.c) */
} tx_py;
extern tx_py TX;

/* A training forward of T's step handed the program `out`: until a
 * backward call (tx_tree_backward_called) or the step's end, its living on
 * with requires_grad holds the step; by_memory: its memory's living on
 * (AOTAutograd hands the program a new tensor over it), told by `made`,
 * out's record (NULL: a view of the caller's tensor, never stale: nothing
 * to hold). 0; -1 with an exception set. */
int tx_tree_note_forward_output(TreeObject *T, PyObject *out, int by_memory, tx_out_ref *made);
/* An inference graph of T's step made `made` (NULL: a view of the
 * caller's tensor, nothing to hold): until a backward call or the step's
 * end, its memory's living on holds the step for a training forward's
 * call (T->inference_memory_watched). */
void tx_tree_note_inference_output(TreeObject *T, tx_out_ref *made);

/* A backward segment ran in T's step: the forwards' outputs noted so far
 * hold it no longer. */
void tx_tree_backward_called(TreeObject *T);
/* 1 while autograd's engine runs a backward on this thread; 0 if not, or if
 * nothing can tell (module.c). */
int tx_in_a_backward(void);

/* Begins a step when Dynamo entered a new compiled call since the last one
 * (GenerationTracker.generation moved), the call is no backward, no
 * backward is pending and the call is not the step's optimizer
 * (belongs(call): 1, 0, or -1 with an exception set; asked only then), or
 * when torch.compiler.cudagraph_mark_step_begin() was called; -1 with an
 * exception set. */
int tx_tree_sync_step(TreeObject *T, int backward, int (*belongs)(void *call), void *call);
/* What belongs(call) answers of a call after a backward with none pending
 * (module.c, "The optimizer"): 0, the call begins a step. The last: it
 * reads a kept .grad with nothing of the step alive, so it begins a step
 * (that costs nothing), and later calls that read a kept .grad go on in
 * that step as in the backward's (grad_readers_step); and where in such a
 * step the call repeats its segment's last call of the step (the same
 * arguments), it begins a readers' step of its own. */
enum { TX_OPTIMIZER_WRITES = 1, TX_OPTIMIZER_READS_GRAD = 2, TX_OPTIMIZER_READS_GRAD_FIRST = 3 };
/* The current stream of the tree's device, where the caller enqueues
 * (seg_runs.c); -1 with an exception set. */
int tx_caller_stream(TreeObject *T, void **out);
/* Work on `caller` needs events to be ordered with T's stream: the legacy
 * default stream (NULL) is ordered with a blocking tree stream by CUDA
 * itself, and the tree's stream with itself. */
static inline int tx_caller_needs_events(const TreeObject *T, void *caller) {
  return (caller || !T->blocking) && caller != T->stream;
}
void tx_tree_drain(TreeObject *T);
/* Synchronises T's stream and retires it in eager.c (unless handed in),
 * then destroys T's C tree (its graphs, pools and, if it made it, its
 * stream) and the stream module.c made for it, if any; T->tree becomes
 * NULL. Frees device memory: the caller ignores other threads' captures
 * around it (tx_dev_ignore_other_captures). */
void tx_tree_destroy_c(TreeObject *T);

/* ------------------------------------------------------- tree_close.c */

/* The thread of T exited (cgtree.torch's per-thread dict of trees died):
 * T is freed once no output of it lives, at a moment no capture is open.
 * Holds a reference to T until then; -1 with an exception set. */
int tx_tree_orphan(TreeObject *T);
/* Frees the orphaned trees that no output names any more, if no cgt_run is
 * under way. Cheap when there are none: segment.c calls it at every call. */
void tx_trees_close_pending(void);
extern size_t tx_trees_orphaned; /* orphaned, not yet closed */
static inline void tx_trees_close_if_any(void) {
  if (tx_trees_orphaned)
    tx_trees_close_pending();
}
uint64_t tx_trees_closed(void); /* trees freed so far */
PyObject *tx_status_error(TreeObject *T, cgt_status st, const char *what);
int tx_blas_clear(void); /* drop cuBLAS's workspaces (seg_launch.c); -1 with an exception set */

static inline uint64_t tx_now_ns(void) { /* the hot path's timers and the benchmarks' */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Benchmarks only: evicts the host's caches by writing `bytes` of memory
 * (kept for the process), so a timed loop can start cold as the hot path
 * does. 0 on success, -1 with MemoryError. */
int tx_cache_evict(size_t bytes);

/* The fast way to read a tensor's data pointer (exchange.c) shares
 * these. */
/* o's data pointer through tensor.data_ptr(), the Python API (seg_runs.c);
 * -1 with an exception set. */
int tx_data_ptr_slow(PyObject *o, void **out);
/* A fast way's pointer for o disagreed with data_ptr()'s: warns that `way`
 * is off from now on; -1 if the warning became an exception, else 1. */
int tx_warn_pointer_disagreement(const char *way, void *fast, void *ptr);
/* Probes for a fast way's proof: a list of tuples of `width` items, the
 * object then addresses that fit a pointer, the object of type t0 or t1
 * where t0 is not NULL. 0, or -1 with TypeError or OverflowError set. */
int tx_check_probes(PyObject *probes, Py_ssize_t width, PyTypeObject *t0, PyTypeObject *t1, const char *usage);

/* -------------------------------------------------------- exchange.c */

/* DLPack's C exchange API (python/dlpack.h), where it proved right. */
typedef struct tx_exchange {
  const DLPackExchangeAPI *api; /* the table, or NULL */
  PyObject *capsule;            /* its capsule, kept */
  PyTypeObject *types[2];       /* the exact types it serves (torch.Tensor, torch.nn.Parameter) */
  int ptrs, stream, outputs;    /* which uses passed their proofs */
  uint64_t disagreements;       /* cross-checks since the last setup that found a pointer wrong (pointers are then off) */
} tx_exchange;
extern tx_exchange TXE;
extern PyMethodDef tx_exchange_methods[];

/* 1 and *out: o's data pointer, read through api (and *dev its device,
 * where dev is not NULL); 0 if the table refused. */
static inline int tx_exchange_read(const DLPackExchangeAPI *api, PyObject *o, void **out, DLDevice *dev) {
  DLTensor dl;
  memset(&dl, 0, sizeof dl);
  if (api->dltensor_from_py_object_no_sync(o, &dl) != 0) {
    PyErr_Clear();
    return 0;
  }
  *out = (char *)dl.data + dl.byte_offset;
  if (dev)
    *dev = dl.device;
  return 1;
}
/* 1 and *out: o's data pointer, read through the table (and *dev as
 * tx_exchange_read gives it); 0: read it through data_ptr() (off, or o is
 * not of a type it serves, or the table refused). */
static inline int tx_exchange_data_ptr(PyObject *o, void **out, DLDevice *dev) {
  PyTypeObject *tp = Py_TYPE(o);
  if (!TXE.ptrs || (tp != TXE.types[0] && tp != TXE.types[1]))
    return 0;
  return tx_exchange_read(TXE.api, o, out, dev);
}
/* 1 and *out: the current stream of a CUDA device, through the table. */
int tx_exchange_stream(int device, void **out);
/* Compares the table's pointer for o with ptr, read through data_ptr(): a
 * difference turns the table's pointers off (1, with a warning; -1 if the
 * warning became an exception); 0 if they agree or the table does not
 * serve o. */
int tx_exchange_cross_check(PyObject *o, void *ptr);
/* A new tensor over m, which it takes (TXE.outputs must be on); NULL with
 * an exception set, and then m's deleter may or may not have run. */
PyObject *tx_exchange_make_tensor(DLManagedTensorVersioned *m);

/* ------------------------------------------------------- read_memo.c */
/* What a segment's last call in a tree read (its arguments), committed
 * once that call returned; and the candidate of the call at hand. */
typedef struct tx_read_cell tx_read_cell;
typedef struct tx_read_memo {
  uint32_t n;          /* arguments */
  int ok, cand_ok;     /* a memo, and a candidate, are kept */
  uint64_t step, cand_step; /* the steps they ran in */
  uint64_t writes, cand_writes; /* the calls that wrote an input in place before them, process-wide */
  tx_read_cell *cells; /* one per argument: the memo's n, then the candidate's */
} tx_read_memo;
/* A new candidate of n arguments: 0, or -1 out of host memory (none is
 * kept; no exception). */
int tx_read_memo_begin(tx_read_memo *m, uint32_t n);
/* Argument i of the candidate: a tensor whose data lie at ptr, or a bool,
 * an int, a float or None; any other value, or a failure, leaves no
 * candidate. */
void tx_read_memo_arg(tx_read_memo *m, uint32_t i, PyObject *arg, int tensor, uintptr_t ptr);
/* The step the candidate's call runs in, and the count of calls that
 * wrote an input in place so far (in every tree; its own not yet). */
void tx_read_memo_stamp(tx_read_memo *m, uint64_t step);
/* A call of a segment that writes an input in place: no repeat across it. */
void tx_read_memo_note_input_write(void);
/* 1 if the candidate repeats the memo in `step`, with no compiled call
 * that writes an input in place since, in any tree: the same live tensors
 * at the same addresses, written in place no more since, equal bools and
 * ints, floats of the same bits, None. */
int tx_read_memo_repeats(tx_read_memo *m, uint64_t step);
/* The candidate becomes the memo (its call returned a result), or goes. */
void tx_read_memo_commit(tx_read_memo *m);
void tx_read_memo_drop(tx_read_memo *m);
void tx_read_memo_free(tx_read_memo *m);

/* ---------------------------------- segment.c and the seg_*.c files */

enum { TIED_BY_UNKNOWN = 1 }; /* tx_out_ref.tied_saved where the forward's pair is unknown (pairs start at 2) */
/* Holds of one output kept by saved views of forwards of one pair (tx_out_ref.views_by). */
typedef struct tx_view_pair {
  uint64_t pair; /* the saving forwards' pair (SegmentObject.pair, never 0) */
  uint32_t n;    /* how many of the output's saved_views are theirs: only their backward ends those holds */
} tx_view_pair;

/* An output tensor handed out: the DLPack block torch owns, the value it
 * releases when the tensor dies, and its registry entry. */
struct tx_out_ref {
  union { /* the DLPack block torch owns: legacy through from_dlpack, versioned through the exchange API */
    DLManagedTensor m;
    DLManagedTensorVersioned mv;
  };
  int queued;        /* its deleter ran (under the queue's lock) */
  int counted;       /* counted in the tree's alive_this_step (a tensor was made) */
  int saved;         /* a saved activation (counted in the tree's saved_alive while its step lasts) that its
                      * backward has not read */
  uint64_t saved_by; /* a saved activation's forward: its pair with its backward (SegmentObject.pair; 0 unknown) */
  uint32_t saved_views; /* training forwards' saved results that are views of this output as their VALUE
                          * argument, whose backwards have not read it (seg_outputs.c, value_input_view), counted
                          * in the tree's tied_saved_alive */
  tx_view_pair *views_by; /* saved_views by the savers' pair, one entry per pair seen (malloc'd; freed with the
                           * record); NULL until a view is saved */
  uint32_t n_view_pairs;  /* entries in views_by */
  uint32_t views_unknown; /* of saved_views, those of an unknown pair (or with no room for their pair's entry):
                           * any backward that reads the memory ends one */
  uint64_t tied_saved; /* a training forward saved a result tied to this output (seg_outputs.c, tied_output): its
                         * pair (or TIED_BY_UNKNOWN; 0: none), counted in the tree's tied_saved_alive until its
                         * backward reads it, it dies, or its step ends */
  uint64_t watched_until; /* a training forward's output watched through its memory: the tree's backward_calls + 1
                           * when noted, so counted in forward_memory_watched until the next backward call; 0: not */
  uint64_t inference_watch; /* an inference graph's output watched through its memory: the tree's
                             * inference_watches_ended + 1 when noted, so counted in inference_memory_watched
                             * until the watches end; 0: not */
  int grad;          /* AccumulateGrad may have made it a .grad (stale.c): GRAD_BACKWARD, GRAD_IN_BACKWARD, or 0 */
  int caller_memory; /* it lies inside a STATIC argument of its run (a forward's saved parameter): not the
                      * tree's memory, so never on the step's list, never stale, and passed on as caller memory */
  int empty;         /* it has no elements: the byte of pool its value holds is read by nothing, so, as caller
                      * memory, it is never on the step's list, never stale, counted in no step's live outputs,
                      * and passed on as an empty tensor (seg_outputs.c, make_output) */
  PyObject *keep;    /* for an output over an input's caller memory (a STATIC input's view, or one moved there:
                      * seg_outputs.c, over_caller_memory): that input's storage, kept alive as a view's base would be;
                      * released by the drain */
  int side_pool;     /* made by an eager run of the tree (a failed capture, a node past the rerecord limit): it
                      * lies in the tree's side pool, which cgt_run copies into a placeholder when passed on */
  TreeObject *tree;  /* borrowed: counted in tree->out_refs, which keeps a tree from closing until it is freed;
                      * NULL once detached (its tensor could not be made: make_output) */
  cgt_value value;
  uint64_t step;
  void *ptr;
  size_t bytes;      /* the value's */
  PyObject *key;     /* the tensor object, never dereferenced: registry key only */
  int in_registry;
  PyObject *storage; /* its storage's key for TX.storage_mark (an int), or NULL */
  tx_out_ref *step_prev, *step_next; /* on the tree's step_outputs list while linked (utlist.h) */
  int on_step_list;
  tx_out_ref *next_dead;
  UT_hash_handle hh;
  int64_t dims[];    /* shape then strides */
};
void tx_out_ref_queue_drain(void);
int tx_out_ref_dead(tx_out_ref *r); /* its deleter ran (its storage is gone) */
/* T's segment runs: r joins T's list (-1 with MemoryError set). At T's
 * close every run leaves its segment and T's list, running no Python
 * (detach), and once T's C tree is gone they are freed (free; Python may
 * run then). */
int tx_tree_run_add(TreeObject *T, struct seg_run *r);
struct seg_run **tx_tree_runs_detach(TreeObject *T, size_t *n);
void tx_tree_runs_free(struct seg_run **runs, size_t n);
/* tx_out_ref.grad: a backward's output, a gradient of the step; or an
 * inference graph's made inside a backward (a gradient hook's result, or
 * a recompute's helper's, no gradient), which AccumulateGrad may take
 * over as .grad all the same. */
enum { GRAD_BACKWARD = 1, GRAD_IN_BACKWARD = 2 };
/* r may be a .grad and its storage lives: a step's end moves it if so. */
static inline int tx_out_ref_live_grad(tx_out_ref *r) { return r->grad && !tx_out_ref_dead(r); }
/* r is a backward's output whose storage lives: a gradient of the step. */
static inline int tx_out_ref_live_backward_output(tx_out_ref *r) {
  return r->grad == GRAD_BACKWARD && !tx_out_ref_dead(r);
}
extern PyTypeObject SegmentType;
/* tests: _torch_ext._set_variant_mask(m): variants are ANDed with m (all
 * bits by default), so that different keys collide (seg_runs.c). */
PyObject *tx_set_variant_mask(PyObject *self, PyObject *arg);

/* 1 if [p, p + n) lies inside [base, base + base_bytes) (no overflow). */
static inline int tx_range_inside(const void *p, size_t n, const void *base, size_t base_bytes) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
  return a >= b && a - b <= base_bytes && n <= base_bytes - (a - b);
}

/* ------------------------------------------------------------ step_outputs.c */

/* The tree's step list, indexed by address: r (its ptr and bytes set) joins
 * it, or -1 with MemoryError set and nothing changed. */
int tx_step_outputs_link(TreeObject *T, tx_out_ref *r);
void tx_step_outputs_unlink(TreeObject *T, tx_out_ref *r); /* a no-op if r is not on it */
/* r, taken off with the list since (tx_step_outputs_take), goes back on
 * it; allocates nothing, since the buckets it was in are kept. */
int tx_step_outputs_put_back(TreeObject *T, tx_out_ref *r);
/* Empties the list and its index; returns the old list, still chained by
 * step_next, each marked off it (the caller unchains them). */
tx_out_ref *tx_step_outputs_take(TreeObject *T);
/* The output on the list whose memory holds [ptr, ptr + span), or NULL. */
tx_out_ref *tx_step_output_at(TreeObject *T, void *ptr, size_t span);
/* 1 if [ptr, ptr + span) lies in an output of the current step of a tree
 * other than T (another thread's): its pool's memory, not T's caller's.
 * Under the GIL. */
int tx_other_trees_output_at(const TreeObject *T, void *ptr, size_t span);
/* 1 if a live tree other than T exists. */
int tx_live_trees_besides(const TreeObject *T);
/* That output's record, among the trees of T's device (a device's
 * pointers are its own), or NULL. */
tx_out_ref *tx_other_trees_step_output_at(const TreeObject *T, void *ptr, size_t span);
/* The weak references to the leaves every live tree noted (stale.c,
 * tx_grad_leaf_note), in a new list; NULL with MemoryError set. */
PyObject *tx_trees_grad_leaves(void);
/* 1 if a live tree noted a leaf (tx_grad_leaf_note), else 0. */
int tx_trees_have_grad_leaves(void);
void tx_step_outputs_free(TreeObject *T);  /* the index's memory (the list is the caller's) */
int tx_step_outputs_check(TreeObject *T);  /* 0, or -1 if the list and the index disagree */
/* 0, or -1 if the holds the step's outputs keep (saved, tied_saved,
 * saved_views and its count per pair) disagree with the tree's counts of
 * them (saved_alive, tied_saved_alive). */
int tx_step_holds_check(const TreeObject *T);

/* The step T->syncing_call brings up ends (stale.c calls it before it
 * marks the ending step's outputs): each DYNAMIC tensor argument of that
 * call that lies in a live output of the ending step moves to memory of its
 * own (TX.output_mover), its data copied on the caller's stream, which the
 * tree's stream waits for; so do the kept .grad tensors in `grads` (a list,
 * or NULL), in the same mover call, so that tensors over one storage land
 * on one copy. The count moved, or -1 with an exception set (out of
 * memory); what moved before the error stays moved and ordered. */
int tx_move_call_args(TreeObject *T, PyObject *grads);
/* 1 if a DYNAMIC tensor argument of T->syncing_call lies in a live output
 * of T's step and requires grad (module.c: it holds the step); 0 if none,
 * or no call is syncing; -1 with an exception set. */
int tx_call_reads_grad_output(TreeObject *T);
/* 1 if T->syncing_call is a call of a training forward (it saves
 * activations for a backward); 0 if not, or no call is syncing. */
int tx_call_is_training_forward(const TreeObject *T);


/* ------------------------------------------------------------ stale.c */

/* A leaf's .grad where T last read it: [begin, end), and the leaf (a weak
 * reference), which a hit asks again; reach: the highest end among it and
 * those that begin below it (ranges may nest: one leaf's .grad a slice of
 * another's, as a flat gradient buffer's views are). */
typedef struct tx_kept_grad {
  uintptr_t begin, end, reach;
  PyObject *leaf;
} tx_kept_grad;
/* 1 if one of ptrs[0..n) lies in the .grad of a leaf that a live tree
 * noted (memory of its own: moved out of the pool at an earlier step's
 * end, or one the program made, that AccumulateGrad adds into), 0 if none,
 * -1 with an exception set. One read of .grad per leaf per backward, and
 * one per hit. */
int tx_kept_grad_among(TreeObject *T, void *const *ptrs, size_t n);
/* T's cache of where those .grad lie, emptied (a tree's end). */
void tx_kept_grads_free(TreeObject *T);
/* n .grad tensors moved out of T's pool: counted, and every tree's cache
 * of where .grad lie is read again at its next question. */
void tx_kept_grads_moved(TreeObject *T, uint64_t n);
/* 1 if tensor t lies on the storage r watches (or r watches none, and
 * nothing can tell), 0 if on another, -1 with an exception set. */
int tx_stale_same_storage(const tx_out_ref *r, PyObject *t);

/* Remembers r's storage (t's) so it can be marked when the step ends; -1
 * with an exception set if the storage cannot be named. */
int tx_stale_watch(TreeObject *T, tx_out_ref *r, PyObject *t);
/* r's storage died: it needs no mark. Called under the GIL by the drain. */
void tx_stale_forget(TreeObject *T, tx_out_ref *r);
/* The step ends: a .grad that took over an output of it, and an argument
 * of the call that ends it lying in an output of it, is moved to memory of
 * its own; then every output whose storage still lives is made
 * to raise on any access of its data, through any view. -1 with an
 * exception set: then the step goes on, and every output that could not
 * be marked stays on the step list (those marked raise already). */
int tx_stale_mark_step(TreeObject *T);
/* 1 if every output of T's step whose storage lives is a leaf's .grad
 * (of the leaves every live tree noted), which its step's end would move;
 * 0 if not; -1 with an exception set. */
int tx_step_outputs_all_leaf_grads(TreeObject *T);
/* o, an input at a position of a training forward that may get a gradient,
 * is remembered if it is a leaf that requires grad (wr: a weak reference to
 * it); if it requires grad but is no leaf, the leaves eager ops before the
 * call pass its gradient on to are (`p.view(-1)`, `p.t()`: stale.c,
 * note_leaves_behind). -1 with an exception set (out of host memory). */
int tx_grad_leaf_note(TreeObject *T, PyObject *o, PyObject *wr);
/* What set_grad_node_kind's function says of an autograd node's type:
 * the walk behind an input notes AccumulateGrad's variable, goes on
 * through a node that hands its incoming gradient on to its inputs as it
 * is or as a view, and stops anywhere else. */
enum { GRAD_NODE_STOP = 0, GRAD_NODE_ACCUMULATE = 1, GRAD_NODE_PASSES_ON = 2 };
/* Copies just made on the caller's stream read memory the tree's next
 * work may overwrite: the tree's stream waits for the caller's. An
 * exception already set stays the one set; -1 if the caller's stream could
 * not be read (then with an exception set). */
int tx_tree_waits_for_caller(TreeObject *T);
/* An exception from reading a tensor's data was our mark's: make it a
 * StaleTensorError (argument i of graph `name`). */
void tx_stale_translate(const char *name, size_t i);

#endif
