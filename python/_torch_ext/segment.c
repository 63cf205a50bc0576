/* segment.c — one graph Inductor compiled, run as a cgtree segment.
 *
 * This is the hot path of the backend, and it is all C: the tensors
 * AOTAutograd passes (as one boxed list, or positionally) become cgt_args,
 * cgt_run replays (or warms up, or records) the graph, and the outputs
 * become new tensors around the tree's values. With PyTorch 2.11 a replay
 * calls no Python function of ours: pointers, the stream and output tensors
 * come through DLPack's C exchange API (exchange.c), and it reads two class
 * attributes (Dynamo's call counter and the mark-step counter, for steps)
 * and one attribute per output (its storage's key, for stale.c). Without
 * the exchange API it calls data_ptr() per input, PyTorch's raw stream
 * getter, and torch._C._from_dlpack per output.
 *
 * Trees. Each thread runs on its own tree (cgtree.torch's tree getter, cached
 * per thread), as PyTorch keeps a tree per thread; a segment keeps what it
 * needs in each tree it ran in (seg_run: its registration, and everything a
 * call holds across a call into Python, where another thread may run the
 * same segment). Shapes and output templates are the segment's, shared.
 * When a tree is freed (its thread exited: tree_close.c) its runs go with it.
 *
 * Inputs. A tensor we handed out earlier in this step (found by object in the
 * tree's registry, at the same data pointer) is a VALUE; a view of one (a
 * pointer inside an output of this step) is that VALUE at an offset, which
 * keys the variant; one from an earlier step raises StaleTensorError (its
 * storage raises on access, stale.c, and the error becomes ours). Inputs the
 * compiler calls static and inputs the graph mutates are STATIC (their
 * address keys the node, the graph reads and writes them in place); every
 * other tensor is DYNAMIC (copied into a pool placeholder inside the graph).
 * An output of an eager run of the tree (a failed capture's, a node's past
 * the rerecord limit) lies in the tree's side pool, and cgt_run copies such
 * a VALUE into a placeholder too: a call whose graph writes into one runs
 * as the plain graph, so that the write lands in the output itself.
 * Ints and floats are hashed into the variant, the caller's key for
 * everything host-side that changes what the graph enqueues.
 *
 * A model passes every weight as a STATIC input: 60 and more per graph.
 * Their addresses key the node, so every pointer is read on every call,
 * through DLPack's exchange API (about 0.1 us; a segment's first call checks
 * it against data_ptr() on each of its inputs). Without it a pointer costs a
 * call of tensor.data_ptr(); then, in a graph with STATIC_CHECK_MIN STATIC
 * inputs or more, the pointers of the last call are kept, and one call of
 * PyTorch's own check (the C++ loop torch._C._tensors_data_ptrs_at_indices_equal,
 * which CUDAGraph Trees use for the same purpose) confirms all of them at
 * once; only if one moved are they read one by one again. DYNAMIC inputs are
 * read every call.
 *
 * Outputs. Each output is a DLPack tensor whose deleter queues the value
 * for release, made a torch tensor by the exchange API (or, without it, as a
 * capsule torch.from_dlpack consumes), so the value's memory goes back
 * to the tree when the tensor's storage dies (the queue is drained, under
 * the GIL, at the next run or step), or at the end of the step, when
 * stale.c marks the storages still alive. Shapes, strides and dtypes are the
 * same for every run of a (segment, variant), so they are learnt once, from
 * the first run, and kept as a template. So are ties between outputs: where
 * the plain graph returns one tensor at two positions, or views of one
 * buffer, the template says so, and each run hands them out tied the same
 * way, sharing one storage and autograd's version counter (tied_output).
 *
 * The launch function (called by cgtree for warmups and recordings, never
 * for replays) calls the Inductor-compiled graph on the tree's stream with
 * alloc.c routing every allocation into this launch, and tells cgtree where
 * the outputs are. The very first call of a segment is not run through
 * cgtree at all: it runs the compiled graph plainly, so Triton autotuning and
 * other lazy initialisation happen outside the pool, and it tells us how many
 * outputs the graph has, which cgt_segment_register needs.
 *
 * Random graphs. A segment made with `prelaunch` (the backend's graphs
 * that draw random numbers) has it called by the tree right before each
 * launch of its recordings (cgt_segment_set_prelaunch): it writes the CUDA
 * generator's seed and offset and advances it (python/cgtree/torch/_rng.py).
 * Here we only keep those writes in order: an event per device, recorded
 * after every run of a random segment, that each writer waits for, and a
 * lock that keeps each run's wait, writes, launch and record together
 * across threads (random_mu).
 *
 * Anything a graph does that a recording cannot carry (an output on the CPU,
 * an output in memory that is neither the pool nor an input, a capture that
 * fails: a host sync such as torch.cond's device predicate, a tensor
 * argument that is not on the tree's device when it runs) turns the
 * segment into a plain call of the compiled graph for good, with a warning:
 * it then runs at Inductor's speed. A segment may also be plain from the
 * start (`plain_reason`: the backend decided so at compile time). A plain
 * segment's calls still mark steps (call_bypassed): a step that begins or
 * goes on around them must not depend on whether a graph was recorded.
 *
 * cuBLAS's workspace. PyTorch gives cuBLAS a workspace per (handle, stream),
 * allocated through the current allocator at the first matmul on a stream
 * and kept until torch._C._cuda_clearCublasWorkspaces() drops them all (32
 * MiB on sm90, plus 1 MiB for cuBLASLt). One kept across a launch would be
 * pool memory the tree reuses while cuBLAS still writes to it. So, as
 * PyTorch's own CUDAGraph Trees do, every launch function drops the
 * workspaces before it runs the graph and again before it returns: the
 * workspace the graph's matmuls take is then an ordinary temporary of the
 * launch, freed inside it, and its pool memory is reused by later segments
 * exactly like any other temporary (stream order keeps that safe: a replay
 * uses it only while its own kernels run). The first plain call of a graph
 * drops them too, so its workspace on the caller's stream does not outlive
 * it. The result is one workspace's worth of memory, in the pool, where a
 * workspace kept per stream would cost 33 MiB for each stream.
 */
#include "ext.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


/* The kinds of a segment's arguments (python/cgtree/torch/_graphs.py names
 * them too). ARG_GENERATOR: a torch.Generator the graph draws from (the
 * graph-safe random state AOTAutograd passes for activation checkpointing);
 * a recording reads that generator's device-side seed and offset, so its
 * identity keys the variant. The backend keeps every such generator alive
 * (_rng.py, anchor_generators), so that no other object takes its address. */
enum { ARG_TENSOR = 0, ARG_TENSOR_STATIC = 1, ARG_INT = 2, ARG_FLOAT = 3, ARG_OTHER = 4, ARG_GENERATOR = 5 };

/* PyTorch's pointer check costs about a microsecond whatever it checks
 * (pybind11's argument handling), a data_ptr() call about 0.15 us: a graph
 * with fewer STATIC inputs than this reads them one by one every call. */
enum { STATIC_CHECK_MIN = 8 };

typedef struct out_meta {
  int32_t ndim;
  DLDataType dtype;
  int64_t *dims;  /* shape then strides */
  /* Its storage offset, in bytes, as the graph's run that made the
   * template returned it. The tensor made over a value starts its storage
   * that far before the value's pointer (DLPack's byte_offset), so its
   * storage_offset() is the plain graph's: AOTAutograd rebuilds an output
   * that aliases an input or another output from that base with
   * as_strided(size, stride, storage_offset()) where its view steps are
   * symbolic, and a 0 there gave x[0:] for x[start:], silently. */
  int64_t offset_bytes;
  /* An output that lies in a tensor input's memory (a view of it; in the
   * input's placeholder, for a DYNAMIC one) shares that input's storage in
   * the plain graph, so its storage offset is the input's, whatever it is
   * at the call, plus where it lies from the input's data: alias_arg is
   * that input's position among the call's arguments (-1: none), alias_rel
   * the bytes from its data to the output's. */
  int32_t alias_arg;
  int32_t alias_k; /* that input's position among the tensor inputs */
  int32_t alias_same_dtype; /* the output has that input's dtype: it can be made a view of it (as_strided) */
  int64_t alias_rel;
  /* An output the plain graph returned as an earlier result itself
   * (tie_same) or over that result's storage: tie_pos is that result's
   * position, tie_k its index among the tensor results (-1: no tie). See
   * tied_output. */
  int32_t tie_pos, tie_k, tie_same;
} out_meta;

typedef struct variant_tmpl {
  uint64_t variant;
  /* What the variant hashes, exactly (a call's key: see key_add), as the
   * call that made this template had it: a call whose key hashes to the
   * same variant but differs is not this template's (call_colliding). */
  uint64_t *key;
  uint32_t n_key;
  uint32_t n_res;
  int as_list;
  uint8_t *is_tensor;
  int has_ties; /* some output is tied to an earlier one (out_meta's tie_pos) */
  PyObject *consts; /* tuple of n_res; None where a tensor goes */
  out_meta *outs;
} variant_tmpl;

typedef struct SegmentObject SegmentObject;

/* A segment's state in one tree. Each thread runs on its own tree (as
 * PyTorch keeps a tree per thread), so each call works on the run of the
 * calling thread's tree, and everything a call keeps across a call into
 * Python (where another thread may run the same segment) lives here. */
typedef struct seg_run {
  SegmentObject *s;
  TreeObject *tree; /* a reference */
  cgt_segment seg;
  int registered;
  cgt_arg *args;
  void **ptrs;    /* each tensor input's data pointer */
  size_t *offs;   /* where a VALUE input starts inside its value (a view of an output), else 0 */
  cgt_value *outs;
  PyObject *const *cur;
  uint64_t cur_variant;
  int want_bypass;
  PyObject *exc_type, *exc_value, *exc_tb;
  uint64_t ns_made; /* this call's share of ns_make, so far */
  tx_out_ref *made; /* the record of the tensor make_output made last; NULL for a view of the caller's tensor */
  tx_out_ref **made_at; /* build_result's record of each tensor result, where its template has ties */
  uint32_t n_made_at;   /* made_at's length (the segment's n_outputs) */
  void *fill_stream; /* where this run's prelaunch writes the generator's state (NULL: the legacy stream) */
  PyObject **grad_seen; /* a weak reference to the object last seen at each of the segment's grad_pos */
  uint32_t n_grad_seen; /* its length (the segment's n_grad_pos), so that freeing a run needs no segment */
  int outs_side_pool; /* the run at hand was eager: its outputs lie in the tree's side pool */
  uint64_t *key;      /* the call at hand's variant key (key_add), 2 entries per argument at most */
  uint32_t n_key;
  size_t *spans;      /* each tensor input's byte span at the call at hand */
  /* A backward's: the records of this step's outputs its tensor inputs lie
   * in, as the call at hand read them; their holds end once every input
   * was read (end_holds_read_by_backward), so an input that fails (stale)
   * or turns the call plain (off the device) has ended none twice or early. */
  tx_out_ref **read;
  uint32_t n_read;
  void **seen;        /* each tensor input's data as the launch at hand sees it (a placeholder, or ptrs) */
  /* The STATIC inputs' data pointers of this tree's last call, where the
   * segment has static_idx: in C by position (static_ptr), and as
   * PyTorch's check wants them, a list of n_args ints (static_ptrs);
   * static_known once a call has read them all. A run's, not the
   * segment's: a call takes them as vouched for, then calls into Python
   * (span_py), where another thread's call of the segment, on other
   * weights, would have rewritten a shared copy. */
  void **static_ptr;
  PyObject *static_ptrs;
  int static_known;
  /* The arguments of this run's last call that read a kept .grad, and its
   * step: a call with the same ones in that step repeats it
   * (belongs_to_training_step, "A repeat"; read_memo.c). */
  tx_read_memo memo;
} seg_run;

struct SegmentObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  /* __dict__, with _boxed_call = True: AOTAutograd may pass the arguments as
   * one list (seg_vectorcall). An attribute of the instance, not of the
   * type, so that a wrapper made by functools.wraps (torch._dynamo.disable
   * wraps every compiled backward) copies it; else AOTAutograd warns at each
   * backward and passes the arguments one by one. */
  PyObject *dict;
  TreeObject *tree; /* the tree of the thread that made it: its device, and the simulator tests' only tree */
  seg_run **runs;   /* one per tree it ran in */
  size_t n_runs;
  PyObject *compiled, *launch_py, *alias_py, *describe_py, *span_py;
  /* Called with the variant right before each launch of one of the
   * segment's recordings (cgt_segment_set_prelaunch); NULL: none. The
   * backend's random graphs write the CUDA generator's seed and offset
   * there and advance it (docs/torch.md, "Random numbers"). */
  PyObject *prelaunch_py;
  /* A stream the launch function begins a capture of its own on while the
   * tree captures (a random graph's bracket, which writes the generator's
   * seed and offset there first): before each launch function it waits
   * for every launch of a random graph enqueued so far (random_done). */
  void *side_stream;
  PyObject *bypass_reason; /* str once the segment runs plainly for good, else NULL */
  char *name;
  uint32_t flags;
  uint32_t n_args, n_targs, n_outputs;
  uint8_t *arg_kind;
  size_t *arg_span;
  /* 1 at each input the graph writes into (Inductor's mutated_input_idxs),
   * else 0; NULL when it writes none. A forward that writes some (an
   * optimizer step) may go on in its backward's step
   * (belongs_to_training_step; module.c, "The optimizer"). A call where
   * such an input is an output of an eager run of the tree does not go
   * through cgt_run (call_plain_over_side_value). */
  uint8_t *arg_written;
  int warned_side_write; /* the first such call was reported */
  int warned_collision;  /* the first call whose variant key collided was reported (call_colliding) */
  uint64_t collisions;   /* such calls */
  /* The list of STATIC positions, as PyTorch's pointer check wants them
   * (NULL when there are fewer than STATIC_CHECK_MIN: then they are read
   * every call). The pointers of the last call are each run's (seg_run). */
  PyObject *static_idx;
  int dynamic_spans;
  int outputs_known; /* the first call told n_outputs (first_call); runs register with it */
  int rerun_first; /* the graph mutates no input: its first call may run again, in the pool (first_call) */
  /* Training. A forward's results from saved_from on are its saved
   * activations (counted while alive: module.c, "Steps in training"); its
   * inputs at grad_pos may get gradients (their leaves are noted for
   * stale.c). A backward runs on the tree of the thread that called
   * backward() (it runs on autograd's device thread); its outputs may
   * become .grad tensors. */
  uint32_t saved_from;
  int backward;
  /* What pairs a training forward with its backward (AOTAutograd's graph
   * id, plus two: see TIED_BY_UNKNOWN); 0: unknown (compiled autograd's
   * backward, a test's segment), which pairs with any. See end_holds_read_by_backward. */
  uint64_t pair;
  uint32_t *grad_pos, n_grad_pos;
  /* A training forward's results AOTAutograd hands the program as a new
   * tensor over the same memory (a view of an intermediate, made
   * torch.ops.aten._unsafe_view): bit i for result i (below 64). Their
   * hold on the step is watched through their memory, not the object
   * (module.c, tx_tree_note_forward_output). */
  uint64_t memory_watched;
  /* One per (variant) seen, each allocated on its own: a call holds its
   * template across calls into Python (build_result makes tensors), where
   * another thread may add one and grow this array. */
  variant_tmpl **tmpls;
  size_t n_tmpls;
  uint64_t calls, plain_calls;
  uint32_t eager_calls_mask; /* its last 32 calls the tree ran: a bit set for each run eagerly (EAGER_RUNS_PLAIN) */
  uint64_t out_of_memory; /* calls that raised because an allocation of theirs was refused */
  /* Replays, and what the benchmarks report of them where the tree was made
   * with time_launches (CGTREE_TORCH_TIME_LAUNCHES=1; otherwise the call
   * reads no clock and these stay 0): the whole call, and its parts:
   * arguments (data pointers, registry, variant), streams (the raw stream
   * getter and events), cgt_run (the graph launch included), and the output
   * tensors. */
  uint64_t replays, ns_in_call, ns_args, ns_streams, ns_in_run, ns_outputs;
  uint64_t ns_step;  /* of ns_args: the step's start and handing back dead outputs */
  uint64_t ns_launch; /* of ns_in_run: inside the graph launch call (trees made with time_launches) */
  uint64_t ns_make;  /* of ns_outputs: PyTorch making the tensors */
  uint64_t static_checks, static_hits; /* calls of PyTorch's pointer check, and those that found nothing moved */
};

/* A training forward saves activations for its backward (from result
 * saved_from on); an inference graph is no backward and saves nothing. */
static int training_forward(const SegmentObject *s) {
  return !s->backward && s->saved_from != UINT32_MAX;
}

static int inference_graph(const SegmentObject *s) {
  return !s->backward && s->saved_from == UINT32_MAX;
}

/* ------------------------------------------------ released outputs */

static pthread_mutex_t dead_mu = PTHREAD_MUTEX_INITIALIZER;
static tx_out_ref *dead_head;

/* Called by PyTorch when an output's storage dies, on any thread, with or
 * without the GIL: only queue it (once). */
static void out_queue(tx_out_ref *r) {
  pthread_mutex_lock(&dead_mu);
  if (!r->queued) {
    r->queued = 1;
    r->next_dead = dead_head;
    dead_head = r;
  }
  pthread_mutex_unlock(&dead_mu);
}

static void out_deleter(DLManagedTensor *m) {
  out_queue(m->manager_ctx);
}

static void out_deleter_versioned(DLManagedTensorVersioned *m) {
  out_queue(m->manager_ctx);
}

int tx_out_ref_dead(tx_out_ref *r) {
  pthread_mutex_lock(&dead_mu);
  int dead = r->queued;
  pthread_mutex_unlock(&dead_mu);
  return dead;
}

/* Frees r and what it holds of its own (the storage kept, the holds per
 * pair); its value and its tree's counts are the caller's. */
static void out_ref_free(tx_out_ref *r) {
  Py_XDECREF(r->keep);
  free(r->views_by);
  free(r);
}

/* Releases the values of the outputs that died, under the GIL. One of a
 * tree that is inside a cgt_run on its own thread (which may have let the
 * GIL go in its launch or prelaunch function) waits in the queue: the tree
 * refuses releases inside a launch, and its thread is using it. */
void tx_out_ref_queue_drain(void) {
  pthread_mutex_lock(&dead_mu);
  tx_out_ref *r = dead_head, *later = NULL;
  dead_head = NULL;
  pthread_mutex_unlock(&dead_mu);
  while (r) {
    tx_out_ref *next = r->next_dead;
    TreeObject *T = r->tree;
    if (!T) { /* detached when its tensor could not be made (make_output): nothing of a tree to undo */
      out_ref_free(r);
      r = next;
      continue;
    }
    if (T->in_run) {
      r->next_dead = later;
      later = r;
      r = next;
      continue;
    }
    if (r->in_registry)
      HASH_DEL(T->registry, r);
    if (r->step == T->step) { /* values of ended steps are stale already */
      (void)cgt_value_release(T->tree, r->value);
      T->alive_this_step -= (uint64_t)(r->counted && !r->caller_memory && !r->empty);
      T->saved_alive -= (uint64_t)(r->counted && r->saved);
      T->tied_saved_alive -= (uint64_t)(r->tied_saved != 0) + r->saved_views;
      T->forward_memory_watched -= (uint64_t)(r->watched_until == T->backward_calls + 1);
      T->inference_memory_watched -= (uint64_t)(r->inference_watch == T->inference_watches_ended + 1);
    }
    tx_stale_forget(T, r);
    T->out_refs--;
    out_ref_free(r);
    r = next;
  }
  if (later) { /* back in the queue, still marked queued: the next drain after that run takes them */
    pthread_mutex_lock(&dead_mu);
    tx_out_ref *last = later;
    while (last->next_dead)
      last = last->next_dead;
    last->next_dead = dead_head;
    dead_head = later;
    pthread_mutex_unlock(&dead_mu);
  }
}

static void capsule_destructor(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) { /* never consumed */
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter)
      m->deleter(m);
  }
}

/* 1 if [ptr, ptr + bytes) lies inside a STATIC argument of the run: caller
 * memory (the tree refuses STATIC memory that overlaps its pools). */
static int inside_caller_memory(const seg_run *r, const void *ptr, size_t bytes) {
  for (uint32_t k = 0; k < r->s->n_targs; k++)
    if (r->args[k].kind == CGT_ARG_STATIC && tx_range_inside(ptr, bytes, r->args[k].ptr, r->args[k].bytes))
      return !tx_other_trees_output_at(r->tree, (void *)r->args[k].ptr, r->args[k].bytes);
  return 0;
}

/* The size of one element of the output m describes, in bytes (1 for a
 * type narrower than a byte). */
static int64_t out_item_bytes(const out_meta *m) { return m->dtype.bits / 8 ? m->dtype.bits / 8 : 1; }

/* 1 if the output m describes has no elements (a dimension of 0: an empty
 * KV cache, an empty aux output). */
static int out_is_empty(const out_meta *m) {
  for (int32_t d = 0; d < m->ndim; d++)
    if (m->dims[d] == 0)
      return 1;
  return 0;
}

/* The storage offset, in bytes, of the output m describes, at this call:
 * the template's, or for an output that aliases a tensor input, that
 * input's storage offset now plus where the output lies from its data.
 * -1 with an exception set. */
static int64_t output_offset_bytes(PyObject *const *args, const out_meta *m) {
  if (m->alias_arg < 0)
    return m->offset_bytes;
  PyObject *in = args[m->alias_arg];
  PyObject *so = PyObject_CallMethodNoArgs(in, TX.str_storage_offset);
  PyObject *es = so ? PyObject_CallMethodNoArgs(in, TX.str_element_size) : NULL;
  long long so_n = so ? PyLong_AsLongLong(so) : -1, es_n = es ? PyLong_AsLongLong(es) : -1;
  Py_XDECREF(so);
  Py_XDECREF(es);
  if (PyErr_Occurred())
    return -1;
  int64_t off = m->alias_rel + (int64_t)so_n * (int64_t)es_n;
  return off >= 0 && off % out_item_bytes(m) == 0 ? off : m->offset_bytes; /* a view as another dtype: the template's */
}

/* Is the output m describes, lying at *ptr, over the caller's memory?
 * Then it is no memory of the tree's: no step reuses it, and it must hold
 * the caller's storage, as a view holds its base's (make_output).
 *
 * A view of a STATIC input is: the graph read the caller's memory in
 * place. So is a view of a DYNAMIC input in an eager run of the tree (a
 * failed capture, a node past the rerecord limit), which reads the
 * caller's memory too. Elsewhere a DYNAMIC input is copied into a
 * placeholder, and the graph's view of it lies in that copy. Under plain
 * Inductor it is a view of the caller's tensor itself: a write to either
 * shows in the other, and it stays readable past the step. AOTAutograd
 * rebuilds most such outputs from the caller's tensor (as_strided on the
 * input), but not all: the view a custom autograd.Function returns of its
 * input, in a training graph, is handed to the user as the graph returned
 * it (AOTAutograd's custom_function_view), and over the placeholder it
 * read a copy, silently, that the next step overwrote. So such an output
 * is moved to the caller's memory at the same place (*ptr), exactly where
 * the plain graph's view would lie. Not a saved activation: the backward
 * reads the copy the forward read, which a write to the caller's tensor
 * between them cannot change. A VALUE input's view lies in the tree's
 * memory: not the caller's. An input that lies in another tree's output
 * (another thread's, handed over) is that tree's memory, which its next
 * step reuses: only a view of the caller's tensor, which shares the
 * output's storage and so the mark that tree puts on it, may lie over it.
 * Where the dtypes differ and no such view can be made, the output stays
 * this tree's: in the placeholder copy for a DYNAMIC input, marked at this
 * tree's next step; over the other tree's memory for a STATIC one, marked
 * then too (if the other tree's step ends first, it may read that tree's
 * next outputs until this tree's step ends: docs/torch.md says so). */
static int over_caller_memory(const seg_run *run, const out_meta *m, int saved, void **ptr) {
  if (m->alias_arg < 0)
    return 0;
  cgt_arg_kind kind = run->args[m->alias_k].kind;
  if (kind != CGT_ARG_STATIC && kind != CGT_ARG_DYNAMIC)
    return 0;
  char *caller = run->ptrs[m->alias_k];
  size_t span = run->spans[m->alias_k];
  if (!caller)
    return 0;
  /* Another tree's output: that tree's pool, which its next step reuses.
   * Over it only as a view of the caller's tensor (make_output), which
   * shares the output's storage, and so that tree's mark. */
  if (!m->alias_same_dtype && tx_other_trees_output_at(run->tree, caller, span))
    return 0;
  if (kind == CGT_ARG_STATIC)
    return 1;
  if (m->alias_rel < 0 || (uint64_t)m->alias_rel >= span)
    return 0;
  if ((char *)*ptr >= caller && (char *)*ptr < caller + span) /* an eager run read the caller's own memory */
    return 1;
  if (saved)
    return 0;
  *ptr = caller + m->alias_rel;
  return 1;
}

/* base.as_strided to m's shape and strides, at `offset` elements into
 * base's storage. A new reference, or NULL with an exception set. */
static PyObject *strided_view(PyObject *base, const out_meta *m, int64_t offset) {
  PyObject *size = PyTuple_New(m->ndim), *stride = PyTuple_New(m->ndim);
  for (int32_t d = 0; size && stride && d < m->ndim; d++) {
    PyTuple_SET_ITEM(size, d, PyLong_FromLongLong(m->dims[d]));
    PyTuple_SET_ITEM(stride, d, PyLong_FromLongLong(m->dims[m->ndim + d]));
  }
  PyObject *at = PyLong_FromLongLong(offset);
  PyObject *view = size && stride && at && !PyErr_Occurred()
                       ? PyObject_CallMethodObjArgs(base, TX.str_as_strided, size, stride, at, NULL)
                       : NULL;
  Py_XDECREF(size);
  Py_XDECREF(stride);
  Py_XDECREF(at);
  return view;
}

/* The output m describes as a view of the caller's tensor `in`
 * (in.as_strided to m's shape, strides and place): what the plain graph
 * returns (Inductor's reinterpret_tensor), sharing in's storage (its
 * lifetime, and the stale mark another tree may put on it) and version
 * counter (autograd's check of a saved tensor changed in place before its
 * backward). A new reference, or NULL with an exception set. */
static PyObject *caller_view(PyObject *in, const out_meta *m, PyObject *const *args) {
  int64_t offset_bytes = output_offset_bytes(args, m);
  if (offset_bytes < 0)
    return NULL;
  return strided_view(in, m, offset_bytes / out_item_bytes(m));
}

/* An output that is a view of a VALUE argument: an output of this step
 * passed in (two compiled blocks, the pieces around a graph break), which
 * the graph returns as it is, or a view of it; a training forward that
 * saves its input (a Linear) returns it among its saved results. Under
 * plain Inductor it is that input, or a view of it, sharing its version
 * counter, so a write in place to the input before the backward raises
 * autograd's error there. Made a DLPack tensor of its own, it had a
 * counter of its own: the backward read the written values without a
 * word (a helper's audit). So it is made as the plain graph makes it, a
 * view of the argument (as_strided over its storage, where the output
 * lies now), and its value goes back, the argument's holding the memory;
 * *ref is the argument's record, which holds the step for a saved one
 * until its backward reads it (saved_view_hold). NULL with
 * no exception set where it cannot be made so (another dtype, not where a
 * view would lie, or past the argument's storage: the caller makes a
 * tensor of its own, v untouched); NULL with an exception set on an error
 * (v released). */
static PyObject *value_input_view(seg_run *run, PyObject *const *args, cgt_value v, const out_meta *m,
                                  tx_out_ref **ref) {
  TreeObject *T = run->tree;
  *ref = NULL;
  if (m->alias_arg < 0 || !m->alias_same_dtype || run->args[m->alias_k].kind != CGT_ARG_VALUE ||
      !run->ptrs[m->alias_k] || m->alias_rel < 0)
    return NULL;
  void *ptr = NULL;
  size_t bytes = 0;
  if (cgt_value_ptr(T->tree, v, &ptr, &bytes) != CGT_OK)
    return NULL; /* make_output reports an error */
  tx_out_ref *in = tx_step_output_at(T, run->ptrs[m->alias_k], run->spans[m->alias_k]);
  if (!in)
    return NULL;
  /* The output lies where the view would, in the argument's memory; or,
   * for an argument in the side pool, in the placeholder the tree copied
   * it into (a graph that writes such an argument runs plainly, seg_call,
   * so the copy's bytes are the argument's: handed out over the copy, the
   * output missed the program's later writes to the argument: a review). */
  if ((char *)ptr != (char *)run->ptrs[m->alias_k] + m->alias_rel && !in->side_pool)
    return NULL;
  PyObject *view = caller_view(args[m->alias_arg], m, args);
  if (!view) {
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) { /* out of memory, ...: the call fails */
      (void)cgt_value_release(T->tree, v);
      return NULL;
    }
    PyErr_Clear(); /* past the argument's storage: a tensor of its own */
    return NULL;
  }
  (void)cgt_value_release(T->tree, v);
  *ref = in;
  return view;
}

/* A tensor over value v, laid out as m says. Steals v: on failure v is
 * released (through the queue). With ns_make (a timed call), PyTorch's
 * share of the work is added there.
 *
 * An output with no elements (an empty KV cache, an empty aux output)
 * still has a value, one byte of pool (set_outputs), but nothing reads
 * it: no later step's reuse of that byte can change what the tensor
 * holds. So it is watched like caller memory, that is not at all: never
 * on the step's list, never marked stale, counted in no step's live
 * outputs (alive_this_step) and holding none (saved_alive), and the
 * argument loop never refuses it as an output of an earlier step. Marked
 * like any output, it raised StaleTensorError where plain Inductor
 * computes: passed back to a compiled call (the cache handed to the next
 * decoding step), or read by an eager op that asks for its data pointer
 * (torch.cat([old_empty, x]), .sum()) (a reviewer's finding). Its byte
 * may lie inside another output by a later step; the argument loop takes
 * an empty argument for a view of that output only where it shares the
 * output's storage (step_output_holding). An empty view of a non-empty
 * output is no such output: it is tied to it (tied_output), over its
 * storage, and shares its mark. */
static PyObject *make_output(seg_run *run, PyObject *const *args, cgt_value v, const out_meta *m, int saved, int grad,
                             uint64_t *ns_make) {
  TreeObject *T = run->tree;
  void *ptr = NULL;
  size_t bytes = 0;
  run->made = NULL;
  cgt_status st = cgt_value_ptr(T->tree, v, &ptr, &bytes);
  if (st != CGT_OK) {
    tx_status_error(T, st, "cgtree output");
    (void)cgt_value_release(T->tree, v); /* stolen: released on failure too */
    return NULL;
  }
  int over_caller = over_caller_memory(run, m, saved, &ptr);
  if (over_caller && m->alias_same_dtype) { /* the plain graph's own answer: a view of the caller's tensor */
    uint64_t t0 = ns_make ? tx_now_ns() : 0;
    PyObject *view = caller_view(args[m->alias_arg], m, args);
    if (ns_make) /* PyTorch's share, as for a DLPack tensor below */
      *ns_make += tx_now_ns() - t0;
    (void)cgt_value_release(T->tree, v); /* the tree's record of it: nothing reads it */
    return view;
  }
  /* Over the caller's memory as another dtype, the output keeps the
   * caller's storage alive, as a view keeps its base's: dropped first, the
   * caller's tensor would free the memory the output reads. */
  PyObject *keep = over_caller ? PyObject_CallMethodNoArgs(args[m->alias_arg], TX.str_untyped_storage) : NULL;
  int64_t offset_bytes = over_caller && !keep ? -1 : output_offset_bytes(args, m);
  if (offset_bytes < 0) {
    Py_XDECREF(keep);
    (void)cgt_value_release(T->tree, v);
    return NULL;
  }
  int nd = m->ndim;
  tx_out_ref *r = tx_malloc(sizeof *r + 2 * (size_t)nd * sizeof(int64_t));
  if (!r) {
    Py_XDECREF(keep);
    (void)cgt_value_release(T->tree, v);
    return PyErr_NoMemory();
  }
  memset(r, 0, sizeof *r);
  r->keep = keep; /* from here on, released with r */
  if (nd)
    memcpy(r->dims, m->dims, 2 * (size_t)nd * sizeof(int64_t));
  r->tree = T;
  T->out_refs++; /* until the drain frees r: T stays open (tree_close.c) */
  r->value = v;
  r->step = T->step;
  r->ptr = ptr;
  r->bytes = bytes;
  r->caller_memory = over_caller || inside_caller_memory(run, ptr, bytes);
  r->empty = out_is_empty(m);
  r->side_pool = run->outs_side_pool;
  DLTensor *dl = TXE.outputs ? &r->mv.dl_tensor : &r->m.dl_tensor;
  dl->device.device_type = kDLCUDA;
  dl->device.device_id = T->device;
  dl->ndim = nd;
  dl->dtype = m->dtype;
  dl->shape = r->dims;
  dl->strides = r->dims + nd;
  dl->data = (char *)ptr - offset_bytes; /* the storage begins where the plain graph's did */
  dl->byte_offset = (uint64_t)offset_bytes;
  PyObject *t;
  if (TXE.outputs) { /* no Python call (exchange.c) */
    r->mv.version.major = 1;
    r->mv.manager_ctx = r;
    r->mv.deleter = out_deleter_versioned;
    uint64_t t0 = ns_make ? tx_now_ns() : 0;
    t = tx_exchange_make_tensor(&r->mv);
    if (ns_make)
      *ns_make += tx_now_ns() - t0;
    if (!t) {
      /* Whether PyTorch ran the deleter or not, the value goes back now,
       * once, and r leaves its tree: it was never registered or watched,
       * so no record of the tree names it, and the tree may close. r
       * itself is left to the deleter should it run (the drain then frees
       * it alone); if PyTorch dropped it without, its few bytes leak. */
      (void)cgt_value_release(T->tree, v);
      Py_CLEAR(r->keep); /* no tensor holds it: should the deleter never come, the caller's storage still goes */
      r->tree = NULL;
      T->out_refs--;
      return NULL;
    }
  } else {
    r->m.manager_ctx = r;
    r->m.deleter = out_deleter;
    PyObject *cap = PyCapsule_New(&r->m, "dltensor", capsule_destructor);
    if (!cap) {
      (void)cgt_value_release(T->tree, v);
      T->out_refs--;
      out_ref_free(r);
      return NULL;
    }
    uint64_t t0 = ns_make ? tx_now_ns() : 0;
    t = PyObject_Vectorcall(TX.from_dlpack, &cap, 1, NULL);
    if (ns_make)
      *ns_make += tx_now_ns() - t0;
    Py_DECREF(cap); /* unconsumed: the destructor queued r */
    if (!t)
      return NULL;
  }
  tx_out_ref *old = NULL;
  HASH_FIND_PTR(T->registry, &t, old);
  if (old) { /* an entry whose tensor object died while a view kept the storage */
    HASH_DEL(T->registry, old);
    old->in_registry = 0;
  }
  r->key = t;
  tx_hash_oomed = 0;
  HASH_ADD_PTR(T->registry, key, r);
  if (tx_hash_oomed) {
    Py_DECREF(t); /* its deleter gives the value back, through the queue */
    return PyErr_NoMemory();
  }
  r->in_registry = 1;
  T->outputs_made++;
  int in_tree_memory = !r->caller_memory && !r->empty; /* caller memory, or no element: no step overwrites it */
  T->alive_this_step += (uint64_t)in_tree_memory;
  r->counted = 1;
  r->saved = saved && in_tree_memory; /* no step reuses its memory, and no backward ends a hold of it */
  r->saved_by = r->saved ? run->s->pair : 0;
  r->grad = grad;
  T->saved_alive += (uint64_t)r->saved;
  if (in_tree_memory && tx_stale_watch(T, r, t) < 0) { /* an output we could not protect is not handed out */
    Py_DECREF(t);
    return NULL;
  }
  run->made = r; /* caller memory (a parameter a forward saves), or empty: no step reuses it, nothing to watch */
  return t;
}

/* Outputs tied to an earlier output. Inductor returns one buffer at two
 * positions where a training forward hands the program a tensor that it
 * also saves for the backward (a sigmoid's, a softmax's output), and views
 * of one buffer (reinterpret_tensor) where the graph returns several. All
 * of them share one version counter there, so a write in place to the
 * program's output (y.mul_(2), an inplace ReLU after it) raises autograd's
 * error at the backward that reads the saved one. Made each from a DLPack
 * tensor of its own, they had a counter each: the backward read the
 * written values without a word, and the gradients came out wrong (a
 * helper's audit, on an H100). So a tied output is handed out as the
 * plain graph hands it: the earlier tensor itself, or a view of it
 * (as_strided over its storage, where the value lies now), sharing its
 * storage (its lifetime and stale mark) and version counter; its own value
 * goes back, the earlier output's holding the memory. An output that the
 * program gets and that is also saved for the backward holds the step
 * through its record, as a saved activation of its own would (counted in
 * tied_saved_alive), until its own backward reads it (end_holds_read_by_backward), its
 * memory dies, or the step ends: the saved tensor autograd keeps is
 * another tensor over that storage, which no weak reference can follow,
 * and the program's own output may live on past the backward. A view that
 * lies below the earlier output's data is made a tensor of its own: the
 * earlier output's record covers only its own range, where lookups by
 * address (tx_step_output_at) find views passed on.
 *
 * Ties between outputs that lie in an input's memory are left to
 * make_output, which makes each a view of the caller's tensor where it can
 * (sharing the caller's counter). A view that cannot be made (another
 * dtype, or memory past the earlier tensor's storage) is a tensor of its
 * own as before, counted in outputs_tied_apart.
 *
 * An empty output has a byte of pool of its own (set_outputs), not the
 * place in the earlier output where the plain graph's view lay: its place
 * there is the template's (its storage offset from the earlier output's).
 * Placed by its own byte, an empty view of y lay anywhere in y's storage
 * or past it (as_strided checks no bounds for no element), where a lookup
 * by address took it for another output. A non-empty output tied to an
 * earlier empty one (y[:0] returned before y) is a tensor of its own: the
 * empty one's storage covers no memory, and nothing marks it
 * (make_output).
 *
 * The tied output, a new reference; NULL with no exception set where it
 * cannot be made (the caller makes it a tensor of its own, v untouched);
 * NULL with an exception set on an error (v released). */
static PyObject *tied_output(seg_run *run, cgt_value v, const out_meta *m, const out_meta *bm, PyObject *base) {
  TreeObject *T = run->tree;
  if (m->tie_same) {
    (void)cgt_value_release(T->tree, v);
    Py_INCREF(base);
    return base;
  }
  if (m->alias_arg >= 0 || bm->alias_arg >= 0 || m->dtype.code != bm->dtype.code || m->dtype.bits != bm->dtype.bits ||
      m->dtype.bits < 8)
    return NULL;
  int empty = out_is_empty(m);
  if (out_is_empty(bm) && !empty)
    return NULL;
  void *ptr = NULL;
  size_t bytes = 0;
  if (cgt_value_ptr(T->tree, v, &ptr, &bytes) != CGT_OK)
    return NULL; /* make_output reports it */
  void *base_ptr = NULL;
  PyObject *so =
      tx_data_ptr_slow(base, &base_ptr) == 0 ? PyObject_CallMethodNoArgs(base, TX.str_storage_offset) : NULL;
  long long base_off = so ? PyLong_AsLongLong(so) : -1;
  Py_XDECREF(so);
  if (PyErr_Occurred()) {
    (void)cgt_value_release(T->tree, v);
    return NULL;
  }
  int64_t item = out_item_bytes(m);
  int64_t diff = empty ? m->offset_bytes - bm->offset_bytes : (int64_t)((char *)ptr - (char *)base_ptr);
  if (diff < 0 || diff % item != 0 || base_off + diff / item < 0) /* below the earlier output: no lookup by
                                                                      * address (tx_step_output_at) would find it */
    return NULL;
  PyObject *view = strided_view(base, m, base_off + diff / item);
  if (!view) {
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) { /* out of memory, ...: the call fails */
      (void)cgt_value_release(T->tree, v);
      return NULL;
    }
    PyErr_Clear(); /* out of the earlier tensor's storage: a tensor of its own */
    return NULL;
  }
  (void)cgt_value_release(T->tree, v);
  return view;
}

/* ------------------------------------------------------- templates */

static variant_tmpl *tmpl_find(SegmentObject *s, uint64_t variant) {
  for (size_t i = 0; i < s->n_tmpls; i++)
    if (s->tmpls[i]->variant == variant)
      return s->tmpls[i];
  return NULL;
}

static void tmpl_clear(variant_tmpl *t) {
  if (t->outs)
    for (uint32_t i = 0; t->outs && i < t->n_res; i++) {
      free(t->outs[i].dims);
    }
  free(t->outs);
  free(t->is_tensor);
  free(t->key);
  Py_XDECREF(t->consts);
  memset(t, 0, sizeof *t);
}

/* 1 if result i of res (a tuple or list) has the dtype of tensor `in`;
 * 0 if not, or if either cannot say (no error is left set). */
static int same_dtype(PyObject *res, uint32_t i, PyObject *in) {
  PyObject *out = PySequence_GetItem(res, (Py_ssize_t)i);
  PyObject *a = out ? PyObject_GetAttr(out, TX.str_dtype) : NULL;
  PyObject *b = a ? PyObject_GetAttr(in, TX.str_dtype) : NULL;
  int same = a && b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
  Py_XDECREF(out);
  Py_XDECREF(a);
  Py_XDECREF(b);
  if (same < 0) {
    PyErr_Clear();
    return 0;
  }
  return same;
}

/* desc is what python/cgtree/torch/_graphs.py's describe() returns:
 * (as_list, metas, consts), metas[i] = None or (ptr, span, shape, strides,
 * code, bits, storage offset in bytes; the last may be left out: 0). seen:
 * each tensor input's data as the run that gave desc saw it (the caller's,
 * or a placeholder), r->spans[k] bytes long, to find outputs that alias one;
 * res and args, the run's results and arguments, say whether such an
 * output has its input's dtype. */
static int tmpl_add(SegmentObject *s, const seg_run *r, void *const *seen, uint64_t variant, PyObject *desc,
                    PyObject *res, PyObject *const *args, uint32_t *n_tensors) {
  PyObject *metas = PyTuple_GET_ITEM(desc, 1), *consts = PyTuple_GET_ITEM(desc, 2);
  uint32_t n_res = (uint32_t)PyTuple_GET_SIZE(metas);
  variant_tmpl t;
  memset(&t, 0, sizeof t);
  t.variant = variant;
  t.n_res = n_res;
  t.as_list = PyObject_IsTrue(PyTuple_GET_ITEM(desc, 0));
  t.is_tensor = tx_calloc(n_res ? n_res : 1, 1);
  t.outs = tx_calloc(n_res ? n_res : 1, sizeof *t.outs);
  t.key = tx_malloc((r->n_key + 1) * sizeof *t.key);
  if (t.key) {
    memcpy(t.key, r->key, r->n_key * sizeof *t.key);
    t.n_key = r->n_key;
  }
  if (!t.is_tensor || !t.outs || !t.key) {
    tmpl_clear(&t);
    PyErr_NoMemory();
    return -1;
  }
  Py_INCREF(consts);
  t.consts = consts;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n_res; i++) {
    PyObject *m = PyTuple_GET_ITEM(metas, i);
    if (m == Py_None)
      continue;
    PyObject *shape = PyTuple_GET_ITEM(m, 2), *strides = PyTuple_GET_ITEM(m, 3);
    out_meta *o = &t.outs[k];
    o->ndim = (int32_t)PyTuple_GET_SIZE(shape);
    o->dims = tx_calloc(2 * (size_t)o->ndim + 1, sizeof(int64_t));
    if (!o->dims) {
      tmpl_clear(&t);
      PyErr_NoMemory();
      return -1;
    }
    for (int32_t d = 0; d < o->ndim; d++) {
      o->dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
      o->dims[o->ndim + d] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, d));
    }
    o->dtype.code = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(m, 4));
    o->dtype.bits = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(m, 5));
    o->dtype.lanes = 1;
    o->offset_bytes = PyTuple_GET_SIZE(m) > 6 ? PyLong_AsLongLong(PyTuple_GET_ITEM(m, 6)) : 0;
    o->tie_pos = o->tie_k = -1;
    long tie = PyTuple_GET_SIZE(m) > 8 ? PyLong_AsLong(PyTuple_GET_ITEM(m, 7)) : -1;
    if (tie >= 0 && (uint32_t)tie < i && PyTuple_GET_ITEM(metas, tie) != Py_None) {
      o->tie_pos = (int32_t)tie;
      o->tie_k = 0;
      for (long p = 0; p < tie; p++)
        o->tie_k += PyTuple_GET_ITEM(metas, p) != Py_None;
      o->tie_same = PyObject_IsTrue(PyTuple_GET_ITEM(m, 8)) == 1;
      t.has_ties = 1;
    }
    o->alias_arg = -1;
    char *at = PyLong_AsVoidPtr(PyTuple_GET_ITEM(m, 0));
    for (uint32_t a = 0, j = 0; at && a < s->n_args && o->alias_arg < 0; a++) {
      if (s->arg_kind[a] > ARG_TENSOR_STATIC)
        continue;
      char *in = seen[j];
      if (in && r->spans[j] && at >= in && at < in + r->spans[j]) {
        o->alias_arg = (int32_t)a;
        o->alias_k = (int32_t)j;
        o->alias_rel = at - in;
        o->alias_same_dtype = same_dtype(res, i, args[a]);
      }
      j++;
    }
    t.is_tensor[i] = 1;
    k++;
  }
  if (PyErr_Occurred()) {
    tmpl_clear(&t);
    return -1;
  }
  variant_tmpl *kept = tx_malloc(sizeof *kept);
  variant_tmpl **grown = kept ? tx_realloc(s->tmpls, (s->n_tmpls + 1) * sizeof *grown) : NULL;
  if (!grown) {
    free(kept);
    tmpl_clear(&t);
    PyErr_NoMemory();
    return -1;
  }
  *kept = t;
  s->tmpls = grown;
  s->tmpls[s->n_tmpls++] = kept;
  *n_tensors = k;
  return 0;
}

/* -------------------------------------------------- launch function */

static void clear_exception(seg_run *r) {
  Py_CLEAR(r->exc_type);
  Py_CLEAR(r->exc_value);
  Py_CLEAR(r->exc_tb);
}

static void stash_exception(seg_run *r) {
  Py_XDECREF(r->exc_type);
  Py_XDECREF(r->exc_value);
  Py_XDECREF(r->exc_tb);
  PyErr_Fetch(&r->exc_type, &r->exc_value, &r->exc_tb);
}

static void go_plain(SegmentObject *s, const char *why);

/* describe() gave no tuple: a recording cannot carry the outputs. The
 * segment goes plain with the sentence it gave instead, or with `fallback`
 * where it gave none (NULL: the caller goes plain later, saying why). */
static void go_plain_described(SegmentObject *s, PyObject *desc, const char *fallback) {
  const char *why = PyUnicode_Check(desc) ? PyUnicode_AsUTF8(desc) : NULL;
  PyErr_Clear();
  if (why || fallback)
    go_plain(s, why ? why : fallback);
}

/* Where the graph reads tensor input k in launch l: the argument itself
 * (the caller's own memory, a value read in place, or NULL for an empty
 * tensor), or, for a DYNAMIC input or a VALUE outside the graph pool (an
 * eager run's output, in the side pool), which the tree copies whole into
 * a placeholder, the place the argument lies in that placeholder (taken at
 * the placeholder's start, a view at an offset read the value's first
 * bytes: a review). seg_launch passes the graph that; set_outputs notes it. */
static char *input_seen(const seg_run *r, cgt_launch *l, uint32_t k) {
  char *at = (char *)cgt_launch_input(l, k) + r->offs[k];
  return at == (char *)r->ptrs[k] || r->ptrs[k] == NULL ? r->ptrs[k] : at;
}

static cgt_status set_outputs(seg_run *r, cgt_launch *l, PyObject *res) {
  SegmentObject *s = r->s;
  for (uint32_t k = 0; k < s->n_targs; k++) /* where the graph saw each input: its placeholder, or itself */
    r->seen[k] = input_seen(r, l, k);
  PyObject *desc = PyObject_CallOneArg(s->describe_py, res);
  if (!desc) {
    stash_exception(r);
    return CGT_ERR_SEGMENT_FAILED;
  }
  if (!PyTuple_Check(desc)) { /* describe() found an output a recording cannot carry, and says which */
    go_plain_described(s, desc, NULL);
    Py_DECREF(desc);
    r->want_bypass = 1;
    return CGT_ERR_SEGMENT_FAILED;
  }
  PyObject *metas = PyTuple_GET_ITEM(desc, 1);
  variant_tmpl *t = tmpl_find(s, r->cur_variant);
  if (!t) {
    uint32_t n = 0;
    if (tmpl_add(s, r, r->seen, r->cur_variant, desc, res, r->cur, &n) < 0) {
      Py_DECREF(desc);
      stash_exception(r);
      return CGT_ERR_SEGMENT_FAILED;
    }
    if (n != s->n_outputs) {
      Py_DECREF(desc);
      r->want_bypass = 1;
      return CGT_ERR_SEGMENT_FAILED;
    }
  }
  cgt_status st = CGT_OK;
  uint32_t k = 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(metas) && st == CGT_OK; i++) {
    PyObject *m = PyTuple_GET_ITEM(metas, i);
    if (m == Py_None)
      continue;
    void *ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(m, 0));
    size_t span = PyLong_AsSize_t(PyTuple_GET_ITEM(m, 1));
    if (span == 0) /* an empty tensor still needs a value: one byte of pool */
      st = cgt_launch_alloc(l, 1, &ptr), span = 1;
    if (st == CGT_OK)
      st = cgt_launch_set_output(l, k, ptr, span);
    if (st != CGT_OK)
      r->want_bypass = 1; /* an output outside the pool and the inputs (e.g. a constant) */
    k++;
  }
  Py_DECREF(desc);
  return st;
}

/* Random graphs. All of them, on every tree of a device, read one state
 * of the device's generator, and each launch's prelaunch writes it first:
 * an event recorded after each run of a random segment lets the next
 * writer wait until every launch before it has read.
 *
 * That holds only if no other thread's write, launch or record comes
 * between a run's wait, write, launch and record, and the GIL does not see
 * to it: the prelaunch is Python, and CUDAGraph.replay, which writes the
 * state, releases the GIL. Without more, another thread could wait on the
 * event this run has not recorded yet, write the state while this run's
 * launch still has to read it, and both launches would draw the same
 * numbers (test_torch_random.py's two-thread test did, on an H200). So a
 * run of a random segment holds random_mu from before cgt_run (whose
 * prelaunch waits and writes, and whose launch reads) until its event is
 * recorded. One lock for the process: the runs it orders are host-side
 * enqueues of microseconds, and recordings of random graphs are one at a
 * time anyway (_rng.py). A thread waits for it with the GIL released, so
 * that the holder can take the GIL back after its prelaunch. */
enum { RANDOM_DEVICES = 64 };
static void *random_done[RANDOM_DEVICES];
static pthread_mutex_t random_mu = PTHREAD_MUTEX_INITIALIZER;

static void random_lock(void) {
  if (pthread_mutex_trylock(&random_mu) != 0) {
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&random_mu);
    Py_END_ALLOW_THREADS
  }
}

/* The event of T's device; NULL on the simulator (its trees have no CUDA
 * events, and their streams are not CUDA streams): nothing to order. */
static inline void *random_event(const TreeObject *T) { return T->ev_out ? random_done[T->device] : NULL; }

static int random_done_event(int device) {
  if (device < 0 || device >= RANDOM_DEVICES) {
    PyErr_Format(TxError, "cgtree.torch: device %d: random graphs are recorded on devices 0 to %d only", device,
                 RANDOM_DEVICES - 1);
    return 0;
  }
  if (!random_done[device]) {
    /* Recorded once, on its device, so that every wait has a record. */
    random_done[device] = tx_event_create_on(device, 1);
#ifdef CGT_HAVE_CUDA
    if (!random_done[device]) {
      PyErr_SetString(TxError, "cgtree.torch: could not create a CUDA event");
      return 0;
    }
#endif
  }
  return 1;
}

static cgt_status seg_launch(cgt_launch *l, void *user) {
  seg_run *r = user;
  SegmentObject *s = r->s;
  if (s->side_stream) /* a capture's bracket writes the generator's state there: after every launch that reads it */
    tx_event_wait(s->side_stream, random_event(r->tree));
  /* From here on a capture may be under way: every allocation goes to the
   * pool, and an eager block freed now (dropping cuBLAS's workspaces frees
   * the caller stream's, on the legacy stream) is set aside, not given back
   * with a call on its stream (alloc.c, eager.c). */
  tx_alloc_launch_enter(l);
  PyObject *inputs = PyTuple_New(s->n_args);
  if (!inputs) {
    tx_alloc_launch_leave();
    stash_exception(r);
    return CGT_ERR_OUT_OF_MEMORY;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < s->n_args; i++) {
    PyObject *o = r->cur[i], *item;
    if (s->arg_kind[i] <= ARG_TENSOR_STATIC) {
      char *at = input_seen(r, l, k);
      if (at == (char *)r->ptrs[k]) { /* the argument itself */
        Py_INCREF(o);
        item = o;
      } else { /* the placeholder: the graph reads the copy, through o's layout */
        PyObject *pp = PyLong_FromVoidPtr(at);
        item = pp ? PyObject_CallFunctionObjArgs(s->alias_py, o, pp, NULL) : NULL;
        Py_XDECREF(pp);
      }
      k++;
    } else {
      Py_INCREF(o);
      item = o;
    }
    if (!item) {
      tx_alloc_launch_leave();
      Py_DECREF(inputs);
      stash_exception(r);
      return CGT_ERR_SEGMENT_FAILED;
    }
    PyTuple_SET_ITEM(inputs, i, item);
  }
  if (tx_blas_clear() < 0) { /* no workspace from before may serve the launch */
    tx_alloc_launch_leave();
    Py_DECREF(inputs);
    stash_exception(r);
    return CGT_ERR_SEGMENT_FAILED;
  }
  PyObject *res = PyObject_CallOneArg(s->launch_py, inputs);
  cgt_status st;
  if (res) {
    st = set_outputs(r, l, res);
  } else {
    stash_exception(r);
    st = CGT_ERR_SEGMENT_FAILED;
  }
  /* The workspace the graph's matmuls took is a temporary of this launch. */
  if (tx_blas_clear() < 0) {
    stash_exception(r);
    st = CGT_ERR_SEGMENT_FAILED;
  }
  /* Dropping the graph's own output tensors frees pool blocks the tree now
   * owns: outside the launch, alloc.c ignores those frees. */
  tx_alloc_launch_leave();
  Py_XDECREF(res);
  Py_DECREF(inputs);
  return st;
}

/* --------------------------------------------------------- cuBLAS */

int tx_blas_clear(void) {
  if (!TX.blas_clear)
    return 0;
  PyObject *r = PyObject_CallNoArgs(TX.blas_clear);
  if (!r)
    return -1;
  Py_DECREF(r);
  return 0;
}

/* ------------------------------------------------- STATIC pointers */

/* 1 if every STATIC tensor input is where it was at the last call, by one
 * call of PyTorch's check for all of them; 0 if one moved, or if that
 * cannot be told cheaply (then they are read one by one). */
static int static_ptrs_unchanged(seg_run *r, PyObject *const *args, size_t n) {
  SegmentObject *s = r->s;
  if (!TX.ptrs_equal || !s->static_idx || !r->static_known)
    return 0;
  s->static_checks++;
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (!list) {
    PyErr_Clear();
    return 0;
  }
  for (size_t i = 0; i < n; i++)
    PyList_SET_ITEM(list, (Py_ssize_t)i, Py_NewRef(args[i]));
  PyObject *call[3] = {list, r->static_ptrs, s->static_idx};
  PyObject *res = PyObject_Vectorcall(TX.ptrs_equal, call, 3, NULL);
  Py_DECREF(list);
  if (!res) {
    PyErr_Clear(); /* read them one by one: that path reports a real error */
    return 0;
  }
  int same = res == Py_True;
  Py_DECREF(res);
  s->static_hits += (uint64_t)same;
  return same;
}

/* Remembers STATIC input i's pointer; 0 if there was no memory to. */
static int static_ptr_note(seg_run *r, size_t i, void *ptr) {
  if (r->static_ptr[i] == ptr && r->static_known)
    return 1;
  PyObject *v = PyLong_FromVoidPtr(ptr);
  if (!v) {
    PyErr_Clear();
    return 0;
  }
  r->static_ptr[i] = ptr;
  PyList_SetItem(r->static_ptrs, (Py_ssize_t)i, v); /* steals v */
  return 1;
}

/* The run's STATIC pointer cache, where its segment checks them with
 * PyTorch's check: a list of n zeros, and their C copy. */
static int static_cache_make(seg_run *r, size_t n) {
  r->static_ptr = tx_calloc(n + 1, sizeof *r->static_ptr);
  r->static_ptrs = PyList_New((Py_ssize_t)n);
  if (!r->static_ptr || !r->static_ptrs) {
    PyErr_NoMemory();
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    PyObject *zero = PyLong_FromLong(0);
    if (!zero)
      return -1;
    PyList_SET_ITEM(r->static_ptrs, (Py_ssize_t)i, zero);
  }
  return 0;
}

/* ------------------------------------------------------------ calls */

int tx_data_ptr_slow(PyObject *o, void **out) {
  PyObject *p = TX.data_ptr ? PyObject_Vectorcall(TX.data_ptr, &o, 1, NULL)
                            : PyObject_VectorcallMethod(TX.str_data_ptr, &o, 1, NULL);
  if (!p)
    return -1;
  *out = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

int tx_caller_stream(TreeObject *T, void **out) {
  if (tx_exchange_stream(T->device, out))
    return 0;
  PyObject *rs = PyObject_Vectorcall(TX.raw_stream, &T->device_obj, 1, NULL);
  if (!rs)
    return -1;
  *out = PyLong_AsVoidPtr(rs);
  Py_DECREF(rs);
  return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* The compiled graph, called plainly. A random graph's plain call draws
 * from the generator eagerly, which PyTorch refuses while another thread
 * records a random graph (the generator is in capture mode then): it
 * waits for random_mu, which every such recording holds. */
static PyObject *call_plain(SegmentObject *s, PyObject *const *args, size_t n) {
  s->plain_calls++;
  if (!s->prelaunch_py)
    return PyObject_Vectorcall(s->compiled, args, n, NULL);
  random_lock();
  PyObject *res = PyObject_Vectorcall(s->compiled, args, n, NULL);
  pthread_mutex_unlock(&random_mu);
  return res;
}

static int arg_data_ptr(const SegmentObject *s, PyObject *o, void **ptr);

/* A call of T from caller (the caller's stream) that runs as the plain
 * graph reads its tensor arguments on caller: each that lies in an output
 * of another tree's step (another thread's) has that tree's launches wait
 * for caller, until one of a later step, else its next step may overwrite
 * the output while the read is queued (pool_readers.c,
 * tx_pool_readers_other_tree). Looked up only while several trees live.
 * ptrs: the tensor arguments' pointers as seg_call's argument loop read
 * them (r->ptrs), or NULL where it did not read them all (a bypassed
 * call, one off the device) or may not have them any more (after cgt_run,
 * which runs Python): then they are read here, and one that cannot be
 * read is skipped (the plain call says what is wrong with it). 0; -1 out
 * of host memory, with an exception set. */
static int note_plain_reads_of_other_trees(const SegmentObject *s, TreeObject *T, void *caller,
                                           PyObject *const *args, void *const *ptrs) {
  if (!tx_live_trees_besides(T))
    return 0;
  for (uint32_t i = 0, k = 0; i < s->n_args; i++) {
    void *ptr;
    if (s->arg_kind[i] > ARG_TENSOR_STATIC)
      continue;
    if (ptrs) {
      ptr = ptrs[k++];
    } else if (arg_data_ptr(s, args[i], &ptr) < 0) {
      PyErr_Clear();
      continue;
    }
    tx_out_ref *other = ptr ? tx_other_trees_step_output_at(T, ptr, 1) : NULL;
    if (other && other->tree && tx_pool_readers_other_tree(other->tree, caller) < 0)
      return -1;
  }
  return 0;
}

/* call_plain for a call of T from caller, whose reads of other trees'
 * outputs their trees wait for (note_plain_reads_of_other_trees, which
 * says what ptrs is). */
static PyObject *call_plain_from(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args,
                                 void *const *ptrs, size_t n) {
  if (note_plain_reads_of_other_trees(s, T, caller, args, ptrs) < 0)
    return NULL;
  return call_plain(s, args, n);
}

/* A graph whose node is past the rerecord limit runs eagerly through the
 * tree, its outputs in the side pool: a buffer it writes in place (STATIC)
 * passed at a new address at every call is a new key at every call. That
 * cost 1.89x the plain graph's time on an H200 (bench/torch_moving_static.py).
 * So once the tree ran a graph eagerly in this many of its last 32 calls
 * through the tree, it runs as the plain graph from then on, at Inductor's
 * speed. Half, not a run in a row: a graph called at two places of a step,
 * one of which replays, stayed eager at the other for good (a review). */
enum { EAGER_RUNS_PLAIN = 16 };

static void go_plain(SegmentObject *s, const char *why) {
  if (s->bypass_reason)
    return;
  s->bypass_reason = PyUnicode_FromString(why);
  PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "cgtree.torch: graph '%s' runs without CUDA graphs from now on: %s",
                   s->name, why);
  PyErr_Clear(); /* a warning turned error must not break the call */
}

/* The plain graph, on the caller's stream, after the tree's work. */
static PyObject *call_plain_after_tree(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n) {
  TreeObject *T = r->tree;
  void *caller;
  if (tx_caller_stream(T, &caller) < 0)
    return NULL;
  if (tx_caller_needs_events(T, caller))
    tx_stream_wait(caller, T->stream, T->ev_out);
  return call_plain_from(s, T, caller, args, r->ptrs, n);
}

/* A call whose key hashes to the variant of a template made by another
 * key (a 64-bit collision: not expected in the life of any program, but
 * a recording of other ints or offsets would give other numbers, silently).
 * It runs as the plain graph; the first such call says so. */
static PyObject *call_colliding(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n) {
  if (!s->warned_collision) {
    s->warned_collision = 1;
    if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                         "cgtree.torch: graph '%s': two sets of int, float or offset arguments gave the same "
                         "variant key; calls with the second run as the plain graph",
                         s->name) < 0)
      PyErr_Clear(); /* a warning turned error must not break the call */
  }
  s->collisions++;
  return call_plain_after_tree(s, r, args, n);
}

/* 1 if an output of template t is a view, as another dtype, of a tensor
 * argument in side_values (a bit per argument k < 63; bit 63 stands for
 * every k from 63 on). */
static int views_as_other_dtype(const variant_tmpl *t, uint64_t side_values) {
  if (!side_values)
    return 0;
  for (uint32_t i = 0, k = 0; i < t->n_res; i++) {
    if (!t->is_tensor[i])
      continue;
    const out_meta *m = &t->outs[k++];
    if (m->alias_arg >= 0 && !m->alias_same_dtype && side_values >> (m->alias_k < 63 ? m->alias_k : 63) & 1)
      return 1;
  }
  return 0;
}

static void plain_saved_hold_step(SegmentObject *s, TreeObject *T, PyObject *res);

/* A call of T, in its step, as the plain graph: a call of a segment plain
 * from before (call_bypassed), or the call at which it goes plain (go_plain:
 * its warm-up or recording raised, an argument is off the device). A
 * training forward's saved results hold the step until its backward (a
 * review: held nowhere at the call that went plain, a second forward of a
 * pair began a step and marked the first one's saved input, and its
 * backward raised StaleTensorError where Inductor computes). */
static PyObject *call_plain_in_step(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args,
                                    size_t n) {
  PyObject *res = call_plain_from(s, T, caller, args, NULL, n);
  plain_saved_hold_step(s, T, res);
  return res;
}

/* A call whose graph writes into an output of an eager run of the tree (a
 * failed capture's, or a node's past the rerecord limit), or returns a view
 * of one as another dtype. That output lies in the tree's side pool, and
 * cgt_run passes such a VALUE through a placeholder copy (docs/api.md,
 * cgt_run), so the graph would write the copy and the caller's tensor would
 * keep its old numbers; and a view of the copy as another dtype (the dtype
 * keeps value_input_view from making it a view of the caller's tensor)
 * would miss the program's later writes to that tensor, silently (a
 * review). This call runs as the plain graph instead, on the tensors
 * themselves, after the tree's work; the segment stays a segment, and the
 * first such call says so. A training forward's saved results hold the step
 * until its backward, as at any plain call (a review: a second forward
 * before the backwards began a step and marked the first one's input). */
static PyObject *call_plain_over_side_value(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n) {
  if (!s->warned_side_write) {
    s->warned_side_write = 1;
    PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                     "cgtree.torch: graph '%s' writes into an output of a run cgtree made eagerly (a graph whose "
                     "capture failed, or a node past the rerecord limit), or returns a view of one as another "
                     "dtype; such calls run as the plain graph, so that the write lands in that output and the "
                     "view is of it",
                     s->name);
    PyErr_Clear(); /* a warning turned error must not break the call */
  }
  PyObject *res = call_plain_after_tree(s, r, args, n);
  plain_saved_hold_step(s, r->tree, res);
  return res;
}

/* The first call's plain run is done, and what came after it failed (an
 * exception is set). A graph that may run again (rerun_first) raises it:
 * a retry computes the same. One that may not (it wrote an input, it is a
 * backward over donated buffers, it drew random numbers) must not be run
 * again by a caller that retries: its result stands, the failure becomes a
 * warning, and its next call tries again to take it in. */
static PyObject *ran_then_failed(SegmentObject *s, PyObject *res) {
  if (s->rerun_first) {
    Py_DECREF(res);
    return NULL;
  }
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                       "cgtree.torch: graph '%s' ran plainly at its first call, and then cgtree could not take "
                       "it in (%R); its result stands, and its next call tries again",
                       s->name, value ? value : Py_None) < 0)
    PyErr_Clear(); /* a warning turned error must not break the call */
  Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
  return res;
}

/* The first call: the compiled graph runs plainly (outside the pool), and
 * its outputs tell us what to register.
 *
 * Those outputs are plain device memory, and PyTorch may keep them: Dynamo
 * holds the frame locals of the code it compiles after a graph break, which
 * are what this call returns (bench/torch_eager_residue.py finds them there,
 * held for the life of the process). So a graph that mutates none of its
 * inputs (rerun_first; a pure function of them, since graphs that draw
 * random numbers are never segments) is run once more at once, through
 * cgt_run, and the plain outputs are dropped: the caller gets the pool's,
 * whose memory goes back to the tree at the end of the step whoever keeps
 * the tensors, as CUDAGraph Trees do with theirs. That run is the graph's
 * first warmup. A graph that mutates an input cannot run twice: it keeps its
 * plain outputs. */
static PyObject *first_call(SegmentObject *s, const seg_run *r, void *caller, PyObject *const *args, size_t n,
                            uint64_t variant) {
  PyObject *res = call_plain_from(s, r->tree, caller, args, r->ptrs, n);
  if (!res)
    return NULL;
  if (tx_blas_clear() < 0) /* the caller's stream keeps no workspace of ours */
    return ran_then_failed(s, res);
  PyObject *desc = PyObject_CallOneArg(s->describe_py, res);
  if (!desc)
    return ran_then_failed(s, res);
  if (!PyTuple_Check(desc)) { /* describe() says why a recording cannot carry these outputs */
    go_plain_described(s, desc, "an output is not a CUDA tensor on the graph's device");
    Py_DECREF(desc);
    return res;
  }
  uint32_t n_out = 0;
  if (tmpl_add(s, r, r->ptrs, variant, desc, res, args, &n_out) < 0) { /* it ran on the caller's tensors */
    Py_DECREF(desc);
    return ran_then_failed(s, res);
  }
  Py_DECREF(desc);
  s->n_outputs = n_out;
  s->outputs_known = 1;
  return res;
}

/* The tree's prelaunch function for a segment made with `prelaunch`: its
 * Python callable, with the variant and whether to write on the caller's
 * current stream (else the tree's), on the calling thread (cgt_run runs
 * with the GIL held). An exception fails the run, which then goes plain. */
static cgt_status seg_prelaunch(void *user, void *stream, uint64_t variant) {
  (void)stream; /* the callable knows its tree's stream */
  seg_run *r = user;
  tx_event_wait(r->fill_stream, random_event(r->tree));
  PyObject *args[2] = {PyLong_FromUnsignedLongLong(variant), r->fill_stream ? Py_False : Py_True};
  PyObject *res = args[0] ? PyObject_Vectorcall(r->s->prelaunch_py, args, 2, NULL) : NULL;
  Py_XDECREF(args[0]);
  if (!res) {
    stash_exception(r);
    return CGT_ERR_SEGMENT_FAILED;
  }
  Py_DECREF(res);
  return CGT_OK;
}

/* Registers the segment with the run's tree, once its outputs are known. */
static int run_register(seg_run *r) {
  SegmentObject *s = r->s;
  cgt_segment_desc d;
  memset(&d, 0, sizeof d);
  d.name = s->name;
  d.launch = seg_launch;
  d.user = r;
  d.n_inputs = s->n_targs;
  d.n_outputs = s->n_outputs;
  d.flags = s->flags;
  if (!r->outs) {
    r->outs = tx_calloc(s->n_outputs ? s->n_outputs : 1, sizeof *r->outs);
    if (!r->outs) {
      PyErr_NoMemory();
      return -1;
    }
  }
  cgt_status st = cgt_segment_register(r->tree->tree, &d, &r->seg);
  if (st == CGT_OK && s->prelaunch_py)
    st = cgt_segment_set_prelaunch(r->tree->tree, r->seg, seg_prelaunch, r);
  if (st != CGT_OK) {
    tx_status_error(r->tree, st, "cgt_segment_register");
    return -1;
  }
  r->registered = 1;
  Py_INCREF(s); /* the tree calls back into it for as long as it lives */
  return 0;
}

/* The tree of the calling thread for the segment's device: the tree the
 * segment was made with where no per-thread trees are kept (TX.tree_for
 * unset: the simulator tests), else cgtree.torch's tree of this thread,
 * cached per thread (a thread's trees live at least as long as it does). */
enum { TLS_DEVICES = 64 };
static _Thread_local TreeObject *tls_trees[TLS_DEVICES];
static _Thread_local uint64_t tls_epoch; /* TX.tree_epoch when tls_trees was filled */

/* What cgtree.torch's getter says is the calling thread's tree for s's
 * device (borrowed: cgtree.torch keeps a thread's trees while the thread
 * lives, and a tree is freed only after its thread exited). */
static TreeObject *tree_from_getter(SegmentObject *s) {
  PyObject *got = PyObject_CallOneArg(TX.tree_for, s->tree->device_obj);
  if (!got)
    return NULL;
  Py_DECREF(got);
  if (!PyObject_TypeCheck(got, &TreeType)) {
    PyErr_SetString(PyExc_TypeError, "cgtree.torch: the tree getter returned no Tree");
    return NULL;
  }
  return (TreeObject *)got;
}

static TreeObject *current_tree(SegmentObject *s) {
  int dev = s->tree->device;
  if (!TX.tree_for || dev < 0 || dev >= TLS_DEVICES)
    return s->tree;
  if (s->backward) /* autograd's device thread serves every thread's backward: ask each time */
    return tree_from_getter(s);
  if (tls_epoch != TX.tree_epoch) { /* another getter since, or a tree orphaned (tree_close.c): forget */
    memset(tls_trees, 0, sizeof tls_trees);
    tls_epoch = TX.tree_epoch;
  }
  if (!tls_trees[dev]) {
    TreeObject *T = tree_from_getter(s);
    /* Another thread's tree: autograd's device thread runs a forward
     * segment too (a checkpointed block's recompute, a compiled optimizer
     * in a gradient hook), on the tree of the thread that called
     * backward(), which the next backward's caller may not be. Asked each
     * time, as for a backward. */
    if (!T || T->owner_thread != PyThread_get_thread_ident())
      return T;
    tls_trees[dev] = T;
  }
  return tls_trees[dev];
}

/* Frees a run's own memory and references, but for its segment's
 * reference (which a registered run holds for the tree); reads nothing of
 * the segment, which may be gone. */
static void run_free(seg_run *r) {
  tx_read_memo_free(&r->memo);
  free(r->args), free(r->ptrs), free(r->offs), free(r->outs), free(r->key), free(r->spans), free(r->seen);
  free(r->read);
  for (uint32_t j = 0; r->grad_seen && j < r->n_grad_seen; j++)
    Py_XDECREF(r->grad_seen[j]);
  free(r->grad_seen);
  free(r->made_at);
  free(r->static_ptr);
  Py_XDECREF(r->static_ptrs);
  Py_XDECREF(r->exc_type), Py_XDECREF(r->exc_value), Py_XDECREF(r->exc_tb);
  Py_XDECREF(r->tree);
  free(r);
}

/* The segment's run in the calling thread's tree, made at its first use. */
static seg_run *run_for(SegmentObject *s) {
  TreeObject *T = current_tree(s);
  if (!T)
    return NULL;
  if (T->closed) { /* only a test's tree, passed by hand, can be both closed and current */
    PyErr_SetString(TxError, "cgtree.torch: this tree was freed (its thread exited)");
    return NULL;
  }
  for (size_t i = 0; i < s->n_runs; i++)
    if (s->runs[i]->tree == T)
      return s->runs[i];
  seg_run *r = tx_calloc(1, sizeof *r);
  seg_run **grown = r ? tx_realloc(s->runs, (s->n_runs + 1) * sizeof *grown) : NULL;
  if (grown)
    s->runs = grown; /* one slot more than used: harmless if r fails below */
  if (r) {
    r->args = tx_calloc(s->n_args + 1, sizeof *r->args);
    r->ptrs = tx_calloc(s->n_args + 1, sizeof *r->ptrs);
    r->offs = tx_calloc(s->n_args + 1, sizeof *r->offs);
    r->key = tx_calloc(2 * (size_t)s->n_args + 1, sizeof *r->key);
    r->spans = tx_calloc(s->n_args + 1, sizeof *r->spans);
    r->seen = tx_calloc(s->n_args + 1, sizeof *r->seen);
    r->read = tx_calloc(s->n_args + 1, sizeof *r->read);
  }
  int statics_ok = !r || !s->static_idx || static_cache_make(r, s->n_args) == 0;
  if (!r || !grown || !r->args || !r->ptrs || !r->offs || !r->key || !r->spans || !r->seen || !r->read ||
      !statics_ok || tx_tree_run_add(T, r) < 0) {
    if (r)
      run_free(r); /* nothing but its arrays yet: no tree, no reference */
    PyErr_NoMemory();
    return NULL;
  }
  r->s = s;
  r->tree = (TreeObject *)Py_NewRef((PyObject *)T);
  s->runs[s->n_runs++] = r;
  return r;
}

int tx_tree_run_add(TreeObject *T, seg_run *r) {
  if (T->n_runs == T->cap_runs) {
    size_t cap = T->cap_runs ? 2 * T->cap_runs : 8;
    seg_run **grown = tx_realloc(T->runs, cap * sizeof *grown);
    if (!grown) {
      PyErr_NoMemory();
      return -1;
    }
    T->runs = grown;
    T->cap_runs = cap;
  }
  T->runs[T->n_runs++] = r;
  return 0;
}

/* r leaves T's list (r is freed without T closing: a segment that dies). */
static void tree_run_forget(TreeObject *T, seg_run *r) {
  for (size_t i = 0; i < T->n_runs; i++)
    if (T->runs[i] == r) {
      T->runs[i] = T->runs[--T->n_runs];
      return;
    }
}

/* T closes (tree_close.c): its C tree, which calls back into these runs,
 * is about to go. First, running no Python: each run leaves its segment
 * (so no segment, should it die, frees it), and T's list; the runs come
 * back to the caller. */
struct seg_run **tx_tree_runs_detach(TreeObject *T, size_t *n) {
  seg_run **runs = T->runs;
  *n = T->n_runs;
  T->runs = NULL;
  T->n_runs = T->cap_runs = 0;
  for (size_t i = 0; i < *n; i++) {
    SegmentObject *s = runs[i]->s;
    for (size_t j = 0; j < s->n_runs; j++)
      if (s->runs[j] == runs[i]) {
        s->runs[j] = s->runs[--s->n_runs];
        break;
      }
  }
  return runs;
}

/* Then, the C tree gone, each run is freed, and a registered run gives
 * back the reference the tree held to its segment (which kept the segment
 * alive until here). Python may run. */
void tx_tree_runs_free(struct seg_run **runs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    seg_run *r = runs[i];
    SegmentObject *s = r->registered ? r->s : NULL;
    run_free(r);
    Py_XDECREF(s);
  }
  free(runs);
}

/* The variant: a hash of the call's key, everything host-side that changes
 * what the graph enqueues (its ints and floats, where a VALUE input starts
 * inside its value, the generators it is passed). Each entry goes through
 * splitmix64's finaliser, and so does the running hash, so that any change
 * of any entry changes every bit with even odds (a sum-and-shift mix, as
 * before, made (0, 62) and (1, 1) the same variant). The key itself is kept
 * too, in each template, so that a collision, however unlikely, is seen
 * (call_colliding) and never replays another key's recording. */
static inline uint64_t fmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t variant_mask = ~0ull; /* tests: fewer bits, so that keys collide (_set_variant_mask) */

static inline void key_add(seg_run *r, uint64_t *variant, uint64_t x) {
  r->key[r->n_key++] = x;
  *variant = fmix64(*variant ^ fmix64(x + 0x9e3779b97f4a7c15ull));
}

static int key_is(const variant_tmpl *t, const seg_run *r) {
  return t->n_key == r->n_key && memcmp(t->key, r->key, r->n_key * sizeof *r->key) == 0;
}

PyObject *tx_set_variant_mask(PyObject *self, PyObject *arg) {
  (void)self;
  unsigned long long m = PyLong_AsUnsignedLongLong(arg);
  if (m == (unsigned long long)-1 && PyErr_Occurred())
    return NULL;
  variant_mask = m;
  Py_RETURN_NONE;
}

/* The live output of T's step that tensor argument o, span bytes at ptr,
 * lies in: NULL if none, or with an exception set. An empty argument (span
 * 0) lies in one only where it shares that output's storage (an empty view
 * of it): an empty output of an earlier step is never marked (make_output),
 * and the byte of pool it was given may lie inside an output of this step
 * by now. Taken for that output, it was passed as its value at an offset
 * (a variant, and a recording, of its own) and, read by a backward, ended
 * that output's holds of the step. */
static tx_out_ref *step_output_holding(TreeObject *T, PyObject *o, void *ptr, size_t span) {
  tx_out_ref *ref = tx_step_output_at(T, ptr, span);
  if (!ref || span)
    return ref;
  int same = tx_stale_same_storage(ref, o);
  return same == 1 ? ref : NULL;
}

/* *ptr: tensor argument o of s's data, read as the argument loop reads it:
 * through the exchange API once the segment's first call cross-checked it,
 * else through data_ptr(). 0; -1 with an exception set where it cannot be
 * read (an output of an earlier step, marked: the caller decides whether
 * that raises now or where the graph reads it). */
static int arg_data_ptr(const SegmentObject *s, PyObject *o, void **ptr) {
  return !(s->outputs_known && tx_exchange_data_ptr(o, ptr, NULL)) && tx_data_ptr_slow(o, ptr) < 0 ? -1 : 0;
}

/* *out: the live output of T's step that tensor argument o of s lies in,
 * or NULL. 0; -1 as arg_data_ptr. */
static int arg_step_output(const SegmentObject *s, TreeObject *T, PyObject *o, tx_out_ref **out) {
  void *ptr;
  *out = NULL;
  if (arg_data_ptr(s, o, &ptr) < 0)
    return -1;
  *out = ptr ? tx_step_output_at(T, ptr, 1) : NULL;
  return 0;
}

/* The entry of ref->views_by for forwards of `pair`, or NULL (none yet,
 * or pair 0: unknown). */
static tx_view_pair *view_pair(const tx_out_ref *ref, uint64_t pair) {
  for (uint32_t k = 0; pair && k < ref->n_view_pairs; k++)
    if (ref->views_by[k].pair == pair)
      return &ref->views_by[k];
  return NULL;
}

/* A backward reads ref's memory. Where a saved result tied to an output
 * lies: if it is that forward's backward (or either one's pair is
 * unknown), the hold that saved result kept (tied_saved_hold) ends. Another
 * graph's backward that reads the same memory (a head that saved the
 * output as its input) leaves it (a helper's review). Where a saved
 * activation of this backward's own forward lies (the pair says; another
 * record over the same memory, a probe head's saved input over the
 * output's, is another forward's: a review), its hold of the step ends,
 * alive or not: autograd keeps it past the backward only for a second
 * backward through a retained graph (retain_graph=True) or where something
 * else holds it (a kept frame, compute-sanitizer's host backtraces). Held
 * until it died, a loop that retains its graph and keeps `loss` bound into
 * the next iteration never began a step: every call a new node, then at
 * the bound of held calls a forced step made the loop's compiled loss or
 * logged loss raise (a helper's audit). A second backward after a
 * compiled call that began a step raises StaleTensorError instead, as
 * PyTorch's trees end a pending backward at the backward. Holding such an
 * activation against every call but its forward's next was tried and
 * taken back: a loop whose first compiled call is another model, a
 * teacher under no_grad, or an evaluation loop after training then held
 * every call until the bound, and identical heads share a forward's id (a
 * review).
 *
 * A backward of known pair ends one hold per read. Two calls of one
 * compiled cell share its pair, and in a chain (h1 = cell(h0); h2 =
 * cell(h1)) h1's record holds for both: the first call's saved result
 * tied to it, the second's saved view of it. Whichever backward read h1
 * first ended both, so the middle call of three lost its holds to its
 * neighbours' backwards, a compiled call between began a step, and its
 * own backward raised StaleTensorError where Inductor computes (a
 * review). Each backward reads each saved result once, so the counts
 * balance. A backward of unknown pair (compiled autograd's) still ends
 * every hold it can: never too late. 1 if a hold ended, else 0. */
static int end_holds_read_by_backward(const SegmentObject *s, TreeObject *T, tx_out_ref *ref) {
  int ended = 0;
  if (!s->backward || ref->step != T->step) /* a hold of an earlier step ended with it */
    return 0;
  if (ref->saved && ref->counted && (!s->pair || !ref->saved_by || s->pair == ref->saved_by)) {
    ref->saved = 0;
    T->saved_alive--;
    if (s->pair)
      return 1; /* one read, one hold (the essay's last paragraph) */
    ended = 1;
  }
  uint64_t by = ref->tied_saved;
  if (by && (by == TIED_BY_UNKNOWN || !s->pair || s->pair == by)) {
    ref->tied_saved = 0;
    T->tied_saved_alive--;
    if (s->pair)
      return 1;
    ended = 1;
  }
  if (!ref->saved_views)
    return ended;
  /* Its own forward's hold first, else one of unknown pair; a backward of
   * unknown pair ends any, unknown ones first. */
  tx_view_pair *e = view_pair(ref, s->pair); /* NULL for an unknown pair */
  if (e && !e->n)
    e = NULL;
  if (!e && ref->views_unknown) {
    ref->views_unknown--;
  } else {
    for (uint32_t k = 0; !e && !s->pair && k < ref->n_view_pairs; k++) /* one there is: tx_step_holds_check */
      if (ref->views_by[k].n)
        e = &ref->views_by[k];
    if (!e)
      return ended;
    e->n--;
  }
  ref->saved_views--;
  T->tied_saved_alive--;
  return 1;
}

/* A training forward saved a view of ref, its VALUE argument
 * (value_input_view), or, run as the plain graph, a result over ref's
 * memory (plain_saved_hold_step): ref's memory holds the step until that
 * forward's backward (its pair) reads it, once for each such forward, or
 * until it dies or the step ends. Once ended by any backward that read the
 * memory, a head's hold of the trunk's output ended at the trunk's own backward
 * (its tied saved result over the same memory) where that ran first (a
 * loss of the trunk's alone, its graph retained), and a compiled call
 * before the head's backward began a step (a helper's review). Where
 * forwards of different pairs saved views of one output, each pair's holds
 * are counted apart (views_by, an entry per pair; views_unknown for those
 * of unknown pair): a single pair for all of them let the trunk's backward
 * end the second head's hold once two heads had saved it, and four entries
 * merged into anyone's past four let it end a fifth head's (two helpers'
 * reviews). The
 * saved tensor autograd keeps is no object of ours to watch: AOTAutograd
 * saves a view detached, a new tensor over the memory (its Note
 * [Detaching saved tensors in AOTAutograd]; a weak reference to the view
 * died at once: a helper's review). A count, not a flag: two forwards
 * that save one output (a head called twice, two heads), then a compiled
 * call between their backwards, keep the step for the second (a flag
 * ended at the first backward: a helper's review). */
static void saved_view_hold(const SegmentObject *s, TreeObject *T, tx_out_ref *ref) {
  if (!ref || ref->caller_memory || ref->empty || ref->step != T->step || T->explicit_steps)
    return;
  tx_view_pair *e = view_pair(ref, s->pair);
  if (!e && s->pair) { /* a pair's first view of this output: an entry of its own */
    tx_view_pair *grown = tx_realloc(ref->views_by, (ref->n_view_pairs + 1) * sizeof *grown);
    if (grown) { /* else (out of memory) counted as of unknown pair: any backward ends it, never too late */
      ref->views_by = grown;
      e = &grown[ref->n_view_pairs++];
      e->pair = s->pair;
      e->n = 0;
    }
  }
  if (e)
    e->n++;
  else
    ref->views_unknown++;
  ref->saved_views++;
  T->tied_saved_alive++;
}

/* A backward that runs on T read ref, an output of T's step or of another
 * tree's: the holds it kept end (end_holds_read_by_backward, in the tree
 * whose output it is). A backward runs on the tree of the thread that
 * called it, so a worker thread's loss.backward() of the main thread's
 * forward ran on another tree than the forward's, and the forward's tree
 * never heard of it: its watch of the forward's output never ended (a
 * loop that keeps `out` bound held one step until the bound of 1024
 * calls, every call a new node), and a compiled optimizer step on the
 * main thread began a step, so the loss it logs raised StaleTensorError
 * where Inductor computes (a helper's review). That tree now hears of the
 * backward as if it had run there. */
static void backward_read(const SegmentObject *s, TreeObject *T, tx_out_ref *ref) {
  TreeObject *owner = ref->tree;
  if (!owner || owner == T) {
    (void)end_holds_read_by_backward(s, T, ref);
    return;
  }
  /* Only a read that ends a hold of the owner's step for a backward (a
   * saved activation, a saved result tied to or viewing its output, of
   * this backward's pair): another thread that trains on this tree's
   * output (a teacher's `t`, read by its own head's backward) ended every
   * watch of this step, and its next compiled call began a step that
   * marked `t` (a review); a backward of another pair ends none of the
   * owner's holds, so it ends none of its watches either. */
  if (end_holds_read_by_backward(s, owner, ref))
    tx_tree_backward_called(owner);
}

/* backward_read for each tensor argument of a backward that runs as the
 * plain graph (no argument loop of seg_call's reads them). 0; -1 with an
 * exception set. */
static int end_holds_of_args_read(const SegmentObject *s, TreeObject *T, PyObject *const *args) {
  int others = tx_live_trees_besides(T);
  for (uint32_t i = 0; i < s->n_args && (others || T->tied_saved_alive || T->saved_alive); i++) {
    void *ptr;
    if (s->arg_kind[i] > ARG_TENSOR_STATIC)
      continue;
    if (arg_data_ptr(s, args[i], &ptr) < 0)
      return -1;
    tx_out_ref *ref = ptr ? tx_step_output_at(T, ptr, 1) : NULL;
    if (!ref && ptr && others)
      ref = tx_other_trees_step_output_at(T, ptr, 1);
    if (ref)
      backward_read(s, T, ref);
  }
  return 0;
}

/* A training forward's saved result tied to an output the program gets,
 * whose record is ref (NULL for a view of the caller's tensor, which no
 * step reuses): the output's memory holds the step, as a saved activation
 * of its own would, until the forward's own backward reads it
 * (end_holds_read_by_backward), the memory dies (the drain), or the step ends. Counted
 * per record, not ended by just any backward call: two forwards, then a
 * compiled call between their backwards, keep the second's (a helper's
 * review). */
static void tied_saved_hold(const SegmentObject *s, TreeObject *T, tx_out_ref *ref) {
  /* An empty record is on no step list, so no backward read could end its hold (a review: a saved empty
   * output held every later step). */
  if (!ref || ref->caller_memory || ref->empty || ref->tied_saved || ref->step != T->step || T->explicit_steps)
    return;
  ref->tied_saved = s->pair ? s->pair : TIED_BY_UNKNOWN;
  T->tied_saved_alive++;
}

static PyObject *build_result(seg_run *r, PyObject *const *args, variant_tmpl *t) {
  SegmentObject *s = r->s;
  PyObject *out = t->as_list ? PyList_New(t->n_res) : PyTuple_New(t->n_res);
  uint32_t k = 0;
  /* Whether AccumulateGrad may take the outputs over as .grad (stale.c
   * moves those a step's end finds kept): a backward's, and an inference
   * graph's called inside a backward, a compiled gradient hook's
   * (`p.register_hook(lambda g: clip(g))`), whose result autograd hands on
   * as the gradient. A hook's output kept by accumulation was marked, not
   * moved, and the next accumulation raised StaleTensorError where
   * Inductor computes (a helper's review). Such an output counts as the
   * step's gradient only where it is a leaf's .grad (belongs_to_training_
   * step asks the leaves): a recompute's compiled helper (a mask) whose
   * result the next forward reads was taken for a gradient, and that
   * forward went on in the backward's step, a node per call (a review).
   * Asked only where a tree noted a leaf, where .grad can be. -1: not
   * asked yet. */
  int grad = s->backward ? GRAD_BACKWARD : -1;
  if (!out)
    goto fail;
  if (t->has_ties && !r->made_at) { /* once per run: the records of a call's results, for its ties */
    if (!(r->made_at = tx_calloc(s->n_outputs ? s->n_outputs : 1, sizeof *r->made_at))) {
      PyErr_NoMemory();
      goto fail;
    }
    r->n_made_at = s->n_outputs;
  }
  for (uint32_t i = 0; i < t->n_res; i++) {
    PyObject *item;
    if (t->is_tensor[i]) {
      const out_meta *m = &t->outs[k];
      item = NULL;
      r->made = NULL;
      if (m->tie_pos >= 0) {
        PyObject *base = t->as_list ? PyList_GET_ITEM(out, m->tie_pos) : PyTuple_GET_ITEM(out, m->tie_pos);
        uint64_t t0 = r->tree->timed ? tx_now_ns() : 0;
        item = tied_output(r, r->outs[k], m, &t->outs[m->tie_k], base);
        if (r->tree->timed)
          r->ns_made += tx_now_ns() - t0;
        if (!item && PyErr_Occurred()) {
          k++; /* released */
          goto fail;
        }
        tx_out_ref *base_made = (uint32_t)m->tie_k < r->n_made_at ? r->made_at[m->tie_k] : NULL;
        if (item && i >= s->saved_from && (uint32_t)m->tie_pos < s->saved_from && !s->backward)
          tied_saved_hold(s, r->tree, base_made);
        r->tree->outputs_tied += item != NULL;
        r->tree->outputs_tied_apart += item == NULL;
        if (item) /* the record a memory watch below follows: the earlier output's, whose storage it shares */
          r->made = base_made;
      }
      if (!item && m->alias_arg >= 0) {
        tx_out_ref *in = NULL;
        item = value_input_view(r, args, r->outs[k], m, &in);
        if (!item && PyErr_Occurred()) {
          k++; /* released */
          goto fail;
        }
        if (item && i >= s->saved_from && training_forward(s))
          saved_view_hold(s, r->tree, in);
        r->tree->outputs_viewing_values += item != NULL;
        if (item) /* the record a memory watch below follows: the argument's, whose storage it shares */
          r->made = in;
      }
      if (!item && grad < 0) /* asked once per call, and only of a graph that is no backward's */
        grad = inference_graph(s) && tx_trees_have_grad_leaves() && tx_in_a_backward() ? GRAD_IN_BACKWARD : 0;
      if (!item)
        item = make_output(r, args, r->outs[k], m, i >= s->saved_from, grad, r->tree->timed ? &r->ns_made : NULL);
      if (k < r->n_made_at)
        r->made_at[k] = item ? r->made : NULL; /* made by this call: never looked up by an address */
      k++;
      if (!item)
        goto fail;
      /* a training forward's output, for the program: it may hold the step (module.c) */
      if (i < s->saved_from && training_forward(s) &&
          tx_tree_note_forward_output(r->tree, item, i < 64 && (s->memory_watched >> i & 1), r->made) < 0) {
        Py_DECREF(item);
        goto fail;
      }
      if (inference_graph(s)) /* module.c, "Inference outputs a training forward reads" */
        tx_tree_note_inference_output(r->tree, r->made);
    } else {
      item = PyTuple_GET_ITEM(t->consts, i);
      Py_INCREF(item);
    }
    if (t->as_list)
      PyList_SET_ITEM(out, i, item);
    else
      PyTuple_SET_ITEM(out, i, item);
  }
  return out;
fail:
  for (; k < s->n_outputs; k++) /* values no tensor took */
    (void)cgt_value_release(r->tree->tree, r->outs[k]);
  Py_XDECREF(out);
  return NULL;
}

/* A training forward's inputs that may get a gradient: the leaves among
 * them are where AccumulateGrad may put a backward's output, and stale.c
 * must find those .grad tensors when their step ends. Each position keeps
 * a weak reference to the object it saw last, so a call with the same
 * parameters as the last costs one comparison per position. */
static int note_grad_leaves(seg_run *r, PyObject *const *args) {
  SegmentObject *s = r->s;
  if (!r->grad_seen) {
    if (!(r->grad_seen = tx_calloc(s->n_grad_pos, sizeof *r->grad_seen))) {
      PyErr_NoMemory();
      return -1;
    }
    r->n_grad_seen = s->n_grad_pos;
  }
  for (uint32_t j = 0; j < s->n_grad_pos; j++) {
    PyObject *o = args[s->grad_pos[j]];
    PyObject *seen = r->grad_seen[j] ? tx_weakref_get(r->grad_seen[j]) : NULL;
    Py_XDECREF(seen); /* o lives (the caller holds it): equal addresses are the same object */
    if (seen == o)
      continue;
    Py_CLEAR(r->grad_seen[j]);
    PyObject *wr = PyWeakref_NewRef(o, NULL);
    if (!wr) { /* no weak references to it: no tensor */
      PyErr_Clear();
      continue;
    }
    if (tx_grad_leaf_note(r->tree, o, wr) < 0) { /* not seen: the next call notes it again */
      Py_DECREF(wr);
      return -1;
    }
    r->grad_seen[j] = wr;
  }
  return 0;
}

/* The run whose call at hand read a kept .grad: its memo is committed
 * when the call returns a result (seg_vectorcall; read_memo.c). */
static _Thread_local seg_run *tls_memo_pending;

/* A call's arguments, for tx_tree_sync_step's question whether the call
 * reads gradients of the step. */
typedef struct call_args {
  SegmentObject *s;
  TreeObject *T;
  PyObject *const *args;
  size_t n;
  seg_run *r;
  int reads_kept_grad; /* args_read_kept_grad found one (and r->memo holds the call's candidate) */
} call_args;

/* 1 if a tensor argument of the call lies in a leaf's .grad of memory of
 * its own (a slice too), no output of the step: one that accumulation or
 * zero_grad(set_to_none=False) kept, which an earlier step's end moved out
 * of the pool and AccumulateGrad added into since. Only the step's live
 * outputs counted as gradients, so from a loop's second step a compiled
 * call that reads .grad and writes nothing (a norm for the log) began a
 * step, and the loss the loop logs raised StaleTensorError where Inductor
 * computes; a per-parameter update came under the bound of calls that
 * only write, 64, not 1024 (a helper's review). 0 if none; -1 with an
 * exception set. The arguments are the candidate of the run's memo
 * (read_memo.c). */
static int args_read_kept_grad(call_args *c) {
  void **ptrs = tx_malloc((c->n ? c->n : 1) * sizeof *ptrs);
  if (!ptrs) {
    PyErr_NoMemory();
    return -1;
  }
  size_t m = 0;
  tx_read_memo *memo = &c->r->memo;
  (void)tx_read_memo_begin(memo, (uint32_t)c->n); /* out of memory: no candidate, so no repeat */
  for (size_t i = 0; i < c->n; i++) {
    void *ptr;
    if (c->s->arg_kind[i] > ARG_TENSOR_STATIC) {
      tx_read_memo_arg(memo, (uint32_t)i, c->args[i], 0, 0);
      continue;
    }
    if (arg_data_ptr(c->s, c->args[i], &ptr) < 0) {
      PyErr_Clear(); /* a stale output: the call reads it again, and raises */
      tx_read_memo_drop(memo);
      continue;
    }
    ptrs[m++] = ptr;
    tx_read_memo_arg(memo, (uint32_t)i, c->args[i], 1, (uintptr_t)ptr);
  }
  int rc = tx_kept_grad_among(c->T, ptrs, m);
  free(ptrs);
  c->reads_kept_grad = rc == 1;
  return rc;
}

/* 1 when the call belongs to the training step whose backward ran (module.c,
 * "The optimizer"): it is no training forward and updates an input in place
 * (an optimizer step), or one of its tensors lies in a live backward
 * output of the step (a .grad that AccumulateGrad took over, read by
 * gradient clipping or a norm) or is a kept .grad (args_read_kept_grad).
 * Asked only at a new compiled call with no backward pending; a loop whose
 * zero_grad() dropped the gradients pays one walk of the step's outputs,
 * and for a graph that neither trains nor writes, one read of each noted
 * leaf's .grad per backward (tx_kept_grad_among). TX_OPTIMIZER_READS_GRAD
 * where it reads a .grad, TX_OPTIMIZER_WRITES where it only writes an
 * input, 0 if neither. */
static int belongs_to_training_step(void *call) {
  call_args *c = call;
  if (!c->T->backward_this_step && !c->T->grad_readers_step)
    return 0;
  /* No backward, no training forward, and it writes an input in place. */
  int writes = c->s->arg_written && inference_graph(c->s);
  int alive = 0;
  for (tx_out_ref *o = c->T->step_outputs; o && !alive; o = o->step_next)
    alive = tx_out_ref_live_backward_output(o);
  for (size_t i = 0; alive && i < c->n; i++) {
    tx_out_ref *o;
    if (c->s->arg_kind[i] > ARG_TENSOR_STATIC)
      continue;
    if (arg_step_output(c->s, c->T, c->args[i], &o) < 0) {
      PyErr_Clear(); /* a stale output: the call reads it again below, and raises */
      continue;
    }
    if (o && tx_out_ref_live_backward_output(o))
      return TX_OPTIMIZER_READS_GRAD;
  }
  /* A graph of neither kind after a backward: does it read a kept .grad?
   * It is held for the step only while an output of the step lives: with
   * none, beginning a step costs nothing, and an analysis loop that reads
   * .grad at every call held the step up to the bound, a recording per
   * call (a review). But such a call's own output then lives in the step
   * it began, and the next call that reads a kept .grad (the optimizer's
   * next parameter, where the forward ran plainly and the backward's
   * outputs went into kept .grad tensors) began another step and marked
   * it: StaleTensorError where Inductor computes (a helper's fault loop).
   * So that step is a gradient readers' step, which later readers join as
   * they join the backward's (grad_readers_step), whether or not an
   * output lives (an in-place update returns none: each began a step and
   * read every leaf's .grad again, a review).
   *
   * A repeat: in a gradient readers' step, a call of a segment with the
   * arguments of its last call in the step (the analysis loop's next
   * probe, `score = probe(w, w.grad)` kept bound) begins a readers' step
   * of its own, as it would with the last output dropped, and as
   * reduce-overhead begins a generation at every call; joined, it made a
   * node per call up to the bound (a review). A per-parameter update reads
   * another .grad at each call, a metric against several references takes
   * another tensor (a live one: read_memo.c), a norm before them is
   * another segment: they join. Only the same call again with the same
   * tensors, its output kept (a list of one norm of one .grad, made 600
   * times), raises StaleTensorError where Inductor computes. */
  if (inference_graph(c->s) && tx_trees_have_grad_leaves()) {
    tx_out_ref_queue_drain(); /* outputs just dropped */
    int reads = args_read_kept_grad(c);
    if (reads < 0)
      return -1;
    if (reads && c->T->grad_readers_step) {
      int repeat = tx_read_memo_repeats(&c->r->memo, c->T->step);
      return repeat ? TX_OPTIMIZER_READS_GRAD_FIRST : TX_OPTIMIZER_READS_GRAD;
    }
    if (reads)
      return c->T->alive_this_step ? TX_OPTIMIZER_READS_GRAD : TX_OPTIMIZER_READS_GRAD_FIRST;
  }
  return writes ? TX_OPTIMIZER_WRITES : 0;
}

/* 0 if o may move (it requires no grad: set_ would cut it from
 * autograd's graph, and module.c holds the step for such an argument
 * before it comes to this), 1 if it stays, -1 with an exception set. */
static int stays(PyObject *o) {
  PyObject *rg = PyObject_GetAttr(o, TX.str_requires_grad);
  int grad = rg ? PyObject_IsTrue(rg) : -1;
  Py_XDECREF(rg);
  return grad;
}

/* The tensors in `todo`, kept .grad tensors (its first n_grads) and
 * arguments lying in live outputs of the ending step, move to memory of
 * their own through TX.output_mover
 * (_backend.move_out_of_pool), all in one call: arguments over one storage
 * (an output and a view of it, passed together) move onto one new storage,
 * so they stay views of one another, as in eager; moved one by one they
 * became two copies, and a write through one was lost to the other (two
 * helpers' audits). Each is set_ to the copy, its layout and autograd
 * version kept, and the tree's stream waits for the copies at once, so
 * that no later error leaves them unordered. The mover answers a list of
 * booleans: False where one stays (then it is marked with the step, and
 * the argument loop raises StaleTensorError as for any output of an
 * earlier step): where PyTorch refuses its set_ (a plain RuntimeError).
 * Returns how many moved, or -1 with an exception set (out of memory, a
 * CUDA error, anything else). */
static int move_args(TreeObject *T, PyObject *todo, Py_ssize_t n_grads) {
  PyObject *res = PyObject_CallOneArg(TX.output_mover, todo);
  if (!res) {
    /* It may have moved some storages before it failed (out of memory
     * for the next copy): the tree's stream waits for those copies too
     * (the error raised stays the one raised; a helper's review). A plain
     * RuntimeError is PyTorch refusing; its subclasses (out of memory, a
     * CUDA error) and anything else reach the caller. */
    (void)tx_tree_waits_for_caller(T);
    if (PyErr_Occurred() != PyExc_RuntimeError)
      return -1;
    PyErr_Clear();
    return 0;
  }
  int moved = 0, rc = 0;
  PyObject *seq = PySequence_Fast(res, "cgtree.torch: the output mover must answer a list of booleans");
  if (!seq || PySequence_Fast_GET_SIZE(seq) != PyList_GET_SIZE(todo)) {
    if (seq)
      PyErr_SetString(PyExc_TypeError, "cgtree.torch: the output mover must answer a boolean per tensor");
    rc = -1;
  }
  uint64_t grads_moved = 0;
  for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
    int m = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, i));
    if (m < 0)
      rc = -1;
    moved += m == 1;
    grads_moved += (uint64_t)(m == 1 && i < n_grads);
  }
  Py_XDECREF(seq);
  Py_DECREF(res);
  tx_kept_grads_moved(T, grads_moved);
  T->args_moved += (uint64_t)moved - grads_moved;
  if (moved && tx_tree_waits_for_caller(T) < 0) /* also after an error: what moved is ordered */
    rc = -1;
  return rc < 0 ? -1 : moved;
}

/* Argument i of c, if it is a DYNAMIC tensor lying in a live output of
 * the step (a STATIC input is keyed by its address and written in place,
 * where a copy would take the write); else NULL. */
static PyObject *arg_in_step_output(call_args *c, size_t i) {
  tx_out_ref *ref;
  if (c->s->arg_kind[i] != ARG_TENSOR)
    return NULL;
  if (arg_step_output(c->s, c->T, c->args[i], &ref) < 0) {
    PyErr_Clear(); /* an output of an earlier step, marked: the argument loop raises */
    return NULL;
  }
  return ref ? c->args[i] : NULL;
}

int tx_call_reads_grad_output(TreeObject *T) {
  call_args *c = T->syncing_call;
  if (!c || !T->step_outputs)
    return 0;
  tx_out_ref_queue_drain(); /* outputs just dropped leave the list: no argument is read for them */
  for (size_t i = 0; T->step_outputs && i < c->n; i++) {
    PyObject *o = arg_in_step_output(c, i);
    PyObject *rg = o ? PyObject_GetAttr(o, TX.str_requires_grad) : NULL;
    if (o && !rg)
      return -1;
    int yes = rg ? PyObject_IsTrue(rg) : 0;
    Py_XDECREF(rg);
    if (yes)
      return yes; /* 1, or -1 */
  }
  return 0;
}

int tx_call_is_training_forward(const TreeObject *T) {
  const call_args *c = T->syncing_call;
  return c && training_forward(c->s);
}

int tx_move_call_args(TreeObject *T, PyObject *grads) {
  call_args *c = T->syncing_call;
  if (!c || !TX.output_mover)
    return 0; /* no call syncing, or no mover: every output of the step is marked */
  Py_ssize_t n_grads = grads ? PyList_GET_SIZE(grads) : 0;
  PyObject *todo = grads ? Py_NewRef(grads) : NULL;
  for (size_t i = 0; i < c->n; i++) {
    PyObject *o = arg_in_step_output(c, i);
    int keep = o ? stays(o) : 1;
    for (Py_ssize_t j = 0; keep == 0 && j < n_grads; j++)
      keep = PyList_GET_ITEM(grads, j) == o; /* the .grad itself: on the list already */
    if (keep == 1)
      continue;
    if (keep < 0 || (!todo && !(todo = PyList_New(0))) || PyList_Append(todo, o) < 0) {
      Py_XDECREF(todo);
      return -1;
    }
  }
  int moved = todo && PyList_GET_SIZE(todo) ? move_args(T, todo, n_grads) : 0;
  Py_XDECREF(todo);
  return moved;
}

static PyObject *seg_call(SegmentObject *s, PyObject *const *args, size_t n, PyObject *kwnames, uint64_t t0);

/* The segment's run in the calling thread's tree, that tree's step brought
 * up to this call (module.c, "Steps"), and *caller, the caller's stream:
 * every call of a segment, recorded or plain, marks steps here, and notes
 * a stream the tree's calls left (pool_readers.c). NULL with an exception
 * set. */
static seg_run *run_in_step(SegmentObject *s, PyObject *const *args, size_t n, void **caller) {
  seg_run *r = run_for(s);
  if (!r)
    return NULL;
  call_args this_call = {s, r->tree, args, n, r, 0};
  void *outer = r->tree->syncing_call; /* set where an outer call's sync ran Python that made this call */
  r->tree->syncing_call = &this_call;  /* a step that begins here moves this call's arguments first */
  int rc = tx_tree_sync_step(r->tree, s->backward, belongs_to_training_step, &this_call);
  r->tree->syncing_call = outer;
  if (rc < 0 || !this_call.reads_kept_grad) {
    tx_read_memo_drop(&r->memo);
    if (rc < 0)
      return NULL;
  } else { /* a reader of a kept .grad: its memo, once the call returned (seg_vectorcall) */
    tx_read_memo_stamp(&r->memo, r->tree->step);
    tls_memo_pending = r;
  }
  if (s->arg_written)
    tx_read_memo_note_input_write(); /* after its stamp: the same call again reads what this one wrote */
  if (s->backward)
    tx_tree_backward_called(r->tree);
  else if (!r->tree->ran_other_than_backward && !tx_in_a_backward())
    r->tree->ran_other_than_backward = 1; /* a recompute inside a backward leaves a tree of backwards one */
  if (tx_caller_stream(r->tree, caller) < 0 || tx_pool_readers_caller(r->tree, *caller) < 0)
    return NULL;
  return r;
}

/* A training forward that ran as the plain graph saves its results from
 * saved_from on for its backward. One that lies in an output of this step
 * of the tree (the plain forward saved its input, which a compiled graph of
 * the step made: a frozen backbone's output before a head that runs
 * plainly) must hold the step until that backward ran, as a saved
 * activation of ours does. Else a second forward before the backwards (a
 * contrastive pair) began a step, marked that output, and the first
 * backward raised StaleTensorError where Inductor computes (a helper's
 * audit). Each such result holds as a recorded forward's saved view does
 * (saved_view_hold): on the output's record, for the forward's pair, until
 * that forward's backward reads the memory, or the memory dies. Not until
 * the memory dies alone: the output is the backbone's, which a loop keeps
 * bound (h = backbone(x)) past the backward, and a hold on it kept every
 * later step from beginning (a second review). Not until any backward
 * call, as one count of the tree's once did: another head's backward, run
 * first with a compiled call after it (per-loss backwards), ended this
 * head's hold, and its backward raised (a review). */
static void plain_saved_hold_step(SegmentObject *s, TreeObject *T, PyObject *res) {
  if (!res || !training_forward(s) || !(PyTuple_Check(res) || PyList_Check(res)))
    return;
  Py_ssize_t n = PySequence_Size(res);
  for (Py_ssize_t i = (Py_ssize_t)s->saved_from; i < n; i++) {
    PyObject *o = PySequence_GetItem(res, i);
    void *ptr = NULL;
    if (o && PyObject_TypeCheck(o, (PyTypeObject *)TX.tensor_type) && tx_data_ptr_slow(o, &ptr) == 0 && ptr)
      saved_view_hold(s, T, tx_step_output_at(T, ptr, 1));
    Py_XDECREF(o);
    PyErr_Clear(); /* a tensor that cannot say where it lies is not ours to hold */
  }
}

/* A call of a segment that runs as the plain graph from now on. cgtree runs
 * nothing for it, but the call still marks where the program's steps go
 * (module.c, "Steps in training", "The optimizer"): a plain forward begins
 * its step where a recorded one would, and a plain backward tells the
 * compiled optimizer step after it that it goes on in the backward's step.
 * Without that, a loop whose forward and backward went plain (their first
 * calls showed what a recording cannot carry) and whose optimizer step is a
 * segment would see a backward in every step and no forward: each optimizer
 * call would go on in one endless step, a new node each, never replayed. */
static PyObject *call_bypassed(SegmentObject *s, PyObject *const *args, size_t n, PyObject *kwnames) {
  seg_run *r = NULL;
  void *caller;
  if (!kwnames && n == s->n_args && !(r = run_in_step(s, args, n, &caller))) /* else call_plain says what is wrong */
    return NULL;
  /* A training forward that runs plainly still has a recorded backward,
   * whose outputs AccumulateGrad takes over as .grad: its leaves are noted
   * as a recorded forward's are, so that such a .grad kept past its step
   * (accumulation) is moved, not marked stale (a helper's audit: the next
   * accumulation raised StaleTensorError where Inductor computes). */
  if (r && s->n_grad_pos && note_grad_leaves(r, args) < 0)
    return NULL;
  if (r && s->backward && (r->tree->tied_saved_alive || r->tree->saved_alive || tx_live_trees_besides(r->tree)) &&
      end_holds_of_args_read(s, r->tree, args) < 0)
    return NULL;
  return r ? call_plain_in_step(s, r->tree, caller, args, n) : call_plain(s, args, n);
}

/* 1 if o, a tensor argument, lies on `device`, read through PyTorch's
 * is_cuda and get_device(); 0 if not; -1 with an exception set. */
static int on_device_slow(PyObject *o, int device) {
  PyObject *c = PyObject_GetAttr(o, TX.str_is_cuda);
  if (!c)
    return -1;
  int cuda = PyObject_IsTrue(c);
  Py_DECREF(c);
  if (cuda <= 0)
    return cuda;
  PyObject *d = PyObject_CallMethodNoArgs(o, TX.str_get_device);
  if (!d)
    return -1;
  long index = PyLong_AsLong(d);
  Py_DECREF(d);
  if (index == -1 && PyErr_Occurred())
    return -1;
  return index == device;
}

/* Argument i's pointer could not be read: a stale output's storage
 * raises on any access, and that error becomes StaleTensorError naming
 * the graph and the argument (counted as refused). NULL. */
static PyObject *arg_unreadable(SegmentObject *s, TreeObject *T, size_t i) {
  tx_stale_translate(s->name, i);
  T->stale_refused += (uint64_t)PyErr_ExceptionMatches(TxStaleError);
  return NULL;
}

/* Argument i of the call is not a CUDA tensor of the tree's device, though
 * the compile saw one there: the graph runs plainly from now on. A compile
 * sees PyTorch's fake tensors, and a fake kernel may put an output on
 * another device than the real one does: memory-efficient attention returns
 * its random seed and offset as CPU tensors outside a capture, where its
 * fake kernel says they lie on the GPU, and a backward receives them (the
 * backend copies them onto the GPU, _graphs.onto_device, but not where the
 * forward itself runs plainly). Their host addresses must never be taken
 * for device memory. */
static PyObject *call_off_device(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args, size_t n,
                                 size_t i) {
  /* As call_bypassed's. */
  if (s->backward && (T->tied_saved_alive || T->saved_alive || tx_live_trees_besides(T)) &&
      end_holds_of_args_read(s, T, args) < 0)
    return NULL;
  char why[300];
  snprintf(why, sizeof why,
           "argument %zu is not a CUDA tensor of device %d when it runs, though the compile saw one there (as "
           "memory-efficient attention's random seed and offset: CPU tensors outside a capture)",
           i, T->device);
  go_plain(s, why);
  return call_plain_in_step(s, T, caller, args, n);
}

/* The call raised, and an allocation of this thread was refused during it:
 * the error becomes torch.OutOfMemoryError (TX.oom_error) with the same
 * text, the original as its cause, unless it already is one. Whether it
 * came from a warmup, a recording or a plain call, the graph stays what
 * it was, and a later call runs it as before: out of memory is the
 * device's state, not the graph's. */
static void out_of_memory_error(SegmentObject *s) {
  if (!tx_alloc_refusal_is_oom()) /* another CUDA error: it stays a RuntimeError naming it */
    return;
  s->out_of_memory++;
  if (!TX.oom_error || !PyErr_Occurred() || PyErr_ExceptionMatches(TX.oom_error))
    return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb)
    (void)PyException_SetTraceback(value, tb);
  PyObject *text = value ? PyObject_Str(value) : NULL;
  PyObject *oom = text ? PyObject_CallOneArg(TX.oom_error, text) : NULL;
  Py_XDECREF(text);
  if (!oom) { /* keep the original */
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return;
  }
  PyException_SetCause(oom, Py_NewRef(value));
  PyException_SetContext(oom, value); /* steals value */
  Py_XDECREF(type);
  Py_XDECREF(tb);
  PyErr_SetObject((PyObject *)Py_TYPE(oom), oom);
  Py_DECREF(oom);
}

/* AOTAutograd calls a compiled graph that says `_boxed_call` with one list
 * of its arguments (no argument of a graph is ever a list); anything else
 * positionally. */
static PyObject *seg_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  SegmentObject *s = (SegmentObject *)self;
  size_t n = PyVectorcall_NARGS(nargsf);
  uint64_t t0 = TX.any_timed ? tx_now_ns() : 0; /* no clock read in a process that times nothing */
  uint64_t refusals = tx_alloc_refusals();
  int capture_mode = tx_dev_ignore_other_captures(); /* another thread's capture stays whole (dev.c) */
  size_t reads = tx_reads_call_begins(); /* reads of other trees' outputs this call begins (reads_in_flight.c) */
  seg_run *memo_outer = tls_memo_pending; /* a call the Python of an outer call made */
  tls_memo_pending = NULL;
  PyObject *res;
  if (n == 1 && !kwnames && PyList_CheckExact(args[0])) {
    PyObject *list = Py_NewRef(args[0]); /* nobody changes it while we run: the caller waits for us */
    res = seg_call(s, PySequence_Fast_ITEMS(list), (size_t)PyList_GET_SIZE(list), NULL, t0);
    Py_DECREF(list);
  } else {
    res = seg_call(s, args, n, kwnames, t0);
  }
  tx_reads_call_ends(reads); /* queued by now, or never to be: their owners' steps may end */
  if (tls_memo_pending) { /* the call read a kept .grad: it is its segment's last call that ran, or it failed */
    if (res)
      tx_read_memo_commit(&tls_memo_pending->memo);
    else
      tx_read_memo_drop(&tls_memo_pending->memo);
  }
  tls_memo_pending = memo_outer;
  tx_dev_heed_other_captures(capture_mode);
  if (!res && tx_alloc_refusals() != refusals)
    out_of_memory_error(s);
  return res;
}

/* The clock, where a call is timed; 0 otherwise. */
static inline uint64_t clock_if(int on) { return on ? tx_now_ns() : 0; }

static PyObject *seg_call(SegmentObject *s, PyObject *const *args, size_t n, PyObject *kwnames, uint64_t t0) {
  s->calls++;
  tx_trees_close_if_any(); /* trees of exited threads that nothing names any more (tree_close.c) */
  if (s->bypass_reason)
    return call_bypassed(s, args, n, kwnames);
  if (kwnames || n != s->n_args) {
    PyErr_Format(PyExc_TypeError, "cgtree.torch: graph '%s' takes %u positional arguments, got %zd%s", s->name,
                 s->n_args, n, kwnames ? " and keywords" : "");
    return NULL;
  }
  void *caller; /* the caller's stream: tx_caller_needs_events says when it needs events */
  seg_run *r = run_in_step(s, args, n, &caller);
  if (!r)
    return NULL;
  TreeObject *T = r->tree;
  int timed = T->timed && t0; /* the parts of a call are timed in a tree made with time_launches only */
  tx_out_ref_queue_drain();
  tx_alloc_flush_if_idle(); /* eager blocks freed during the last launch (alloc.c) */
  uint64_t t_step = clock_if(timed);

  uint64_t variant = 0;
  r->n_key = 0;
  uint32_t k = 0;
  /* With the exchange API every pointer is read, cheaply; without it, one
   * check of PyTorch's may vouch for the STATIC ones (static_ptrs_unchanged). */
  int fast = TXE.ptrs;
  uint64_t statics_seen = tx_reads_ends_seen(); /* before PyTorch's check vouches for the STATIC pointers */
  int statics_same = !fast && static_ptrs_unchanged(r, args, n), statics_noted = 1;
  int writes_side_value = 0;
  uint64_t side_values = 0; /* the tensor arguments k < 63 that are side-pool VALUEs; bit 63: one at 63 or past */
  r->n_read = 0;
  for (size_t i = 0; i < n; i++) {
    PyObject *o = args[i];
    uint8_t kind = s->arg_kind[i];
    if (kind <= ARG_TENSOR_STATIC) {
      uint64_t ends_seen;
    read_arg:
      /* Before the pointer: another tree's step may end before the look-up.
       * A STATIC pointer the check vouched for was read at the check. */
      ends_seen = kind == ARG_TENSOR_STATIC && statics_same ? statics_seen : tx_reads_ends_seen();
      void *ptr;
      DLDevice dev = {kDLCUDA, T->device}; /* a STATIC pointer PyTorch vouched unchanged keeps its device */
      if (kind == ARG_TENSOR_STATIC && statics_same) {
        ptr = r->static_ptr[i];
      } else if (!(fast && s->outputs_known && tx_exchange_data_ptr(o, &ptr, &dev))) {
        if (tx_data_ptr_slow(o, &ptr) < 0)
          return arg_unreadable(s, T, i);
        int on = on_device_slow(o, T->device);
        if (on < 0)
          return NULL;
        if (!on)
          dev.device_type = kDLCPU; /* anywhere but the tree's device */
        /* A segment's first call reads each input both ways: the exchange
         * API is trusted only where it agreed with data_ptr() (exchange.c). */
        if (fast && !s->outputs_known && tx_exchange_cross_check(o, ptr) < 0)
          return NULL;
        if (kind == ARG_TENSOR_STATIC && s->static_idx && !fast)
          statics_noted &= static_ptr_note(r, i, ptr);
      }
      if (dev.device_type != kDLCUDA || dev.device_id != T->device)
        return call_off_device(s, T, caller, args, n, i);
      size_t span = s->arg_span[i];
      if (s->dynamic_spans) {
        PyObject *sp = PyObject_CallOneArg(s->span_py, o);
        if (!sp)
          return NULL;
        span = PyLong_AsSize_t(sp);
        Py_DECREF(sp);
      }
      r->ptrs[k] = ptr;
      r->spans[k] = span;
      tx_out_ref *ref = NULL;
      if (Py_TYPE(o) == (PyTypeObject *)TX.tensor_type) /* outputs are plain tensors; a Parameter never is one */
        HASH_FIND_PTR(T->registry, &o, ref);
      /* An output that is a view of caller memory (a parameter a forward
       * saved for its backward) is passed as that memory, by its kind, as
       * the parameter itself would be: as a VALUE outside the graph pool it
       * would be copied into a placeholder, and a graph that writes it (an
       * optimizer step) would write the copy. tx_step_output_at never finds
       * one: they are not on the step's list. */
      if (ref && ref->caller_memory)
        ref = NULL;
      /* An empty output holds no data a step could overwrite (make_output):
       * from any step, it is passed on as the empty tensor it is. */
      if (ref && ref->empty)
        ref = NULL;
      if (ref && ref->ptr == ptr && ref->step != T->step) {
        /* The entry outlives its tensor object while a view keeps the
         * storage, and CPython gives a new object that address: a view of
         * this step's output at the same pool address (pool addresses
         * repeat each step) was taken for the dead, stale one, and the
         * call raised StaleTensorError where Inductor computes (a helper's
         * review). Its storage tells them apart. */
        int same = tx_stale_same_storage(ref, o);
        if (same < 0)
          return NULL;
        if (!same) { /* that object died: its entry goes */
          HASH_DEL(T->registry, ref);
          ref->in_registry = 0;
          ref = NULL;
        }
      }
      if (ref && ref->ptr == ptr) {
        if (ref->step != T->step) {
          T->stale_refused++;
          PyErr_Format(TxStaleError,
                       "cgtree.torch: argument %zu of graph '%s' is an output of an earlier step (step %llu, now "
                       "%llu); its memory belongs to the current step's outputs. Clone outputs you keep across "
                       "calls of the compiled model (or call cgtree.torch.step_begin() only where a step really ends).",
                       i, s->name, (unsigned long long)ref->step, (unsigned long long)T->step);
          return NULL;
        }
        r->args[k] = cgt_arg_value(ref->value);
        r->offs[k] = 0;
        if (s->backward)
          r->read[r->n_read++] = ref;
      } else if (ptr && (ref = step_output_holding(T, o, ptr, span)) != NULL) {
        /* A view of this step's output (v = y[1:]), or another tensor
         * object over one (a backward's saved activation, unpacked by
         * autograd): the value it lies in, and its offset in the variant,
         * since a recording reads there. */
        r->args[k] = cgt_arg_value(ref->value);
        r->offs[k] = (size_t)((char *)ptr - (char *)ref->ptr);
        if (s->backward)
          r->read[r->n_read++] = ref;
        if (r->offs[k]) /* at offset 0 it reads what the value itself would */
          key_add(r, &variant, ((uint64_t)k << 40) ^ (uint64_t)r->offs[k] ^ 0x5eedull);
      } else if (span == 0 && PyErr_Occurred()) { /* step_output_holding could not read the storage */
        return NULL;
      } else if (ptr == NULL || span == 0) {
        /* An empty tensor has nothing to read; cgtree needs memory, so it is
         * keyed on a byte of ours and the launch passes the tensor itself. */
        r->ptrs[k] = NULL;
        r->offs[k] = 0;
        r->args[k] = cgt_arg_static(r->ptrs, 1);
      } else {
        r->offs[k] = 0;
        r->args[k] = kind == ARG_TENSOR_STATIC ? cgt_arg_static(ptr, span) : cgt_arg_dynamic(ptr, span);
        /* An output of another tree's step (another thread's): this
         * tree's stream reads it (cgt_run's copy, or the recording), so
         * that tree's launches wait for this one's (pool_readers.c); a call
         * that runs plainly instead notes its caller's stream too
         * (call_plain_from). */
        int several = tx_live_trees_besides(T), settling = several && tx_reads_crossed(ends_seen);
        if (settling) {
          /* Another tree's step's end began since the pointer was read
           * (Python ran in between: a span function, a property): the
           * argument may have been one of its outputs, moved or marked
           * since, and the look-up by address would find the next step's
           * output there, or nothing. Once the ends under way are over,
           * read it again (reads_in_flight.c); ends wait for this look-up. */
          uint64_t begun;
          if (tx_reads_settle(&begun) < 0)
            return NULL;
          void *again;
          if (arg_data_ptr(s, o, &again) < 0) {
            tx_reads_settled();
            return arg_unreadable(s, T, i);
          }
          /* Moved, or an end began while the pointer was read again (that
           * read may run Python too): looked at afresh. */
          if (again != ptr || tx_reads_begun_since(begun)) {
            tx_reads_settled();
            statics_noted = statics_same = 0; /* the vouched pointers are no more */
            goto read_arg;
          }
        }
        tx_out_ref *other = several ? tx_other_trees_step_output_at(T, ptr, span) : NULL;
        int noted = other && other->tree ? tx_pool_readers_other_tree(other->tree, T->stream) : 0;
        if (settling)
          tx_reads_settled();
        if (noted < 0)
          return NULL;
        if (other && s->backward) /* another thread's forward's: its tree hears of this backward too */
          r->read[r->n_read++] = other;
      }
      if (r->args[k].kind == CGT_ARG_VALUE && ref->side_pool) {
        side_values |= 1ull << (k < 63 ? k : 63);
        writes_side_value |= s->arg_written && s->arg_written[i];
      }
      k++;
    } else if (kind == ARG_INT) {
      long long x = PyLong_AsLongLong(o);
      if (x == -1 && PyErr_Occurred())
        return NULL;
      key_add(r, &variant, (uint64_t)x);
    } else if (kind == ARG_FLOAT) {
      double x = PyFloat_AsDouble(o);
      if (x == -1.0 && PyErr_Occurred())
        return NULL;
      uint64_t bits;
      memcpy(&bits, &x, sizeof bits);
      key_add(r, &variant, bits);
    } else if (kind == ARG_GENERATOR) {
      key_add(r, &variant, (uint64_t)(uintptr_t)o ^ 0x67656eull);
    }
  }
  /* Every input read: the backward runs, and its reads end their holds
   * (ended as each was read, an input off the device after them, whose
   * plain call ends every input's holds, ended them twice: a review). */
  for (uint32_t j = 0; j < r->n_read; j++)
    backward_read(s, T, r->read[j]);
  if (!statics_same && s->static_idx)
    r->static_known = statics_noted && !fast; /* every STATIC pointer was read, and noted, just now */
  variant &= variant_mask;
  variant_tmpl *known = s->outputs_known ? tmpl_find(s, variant) : NULL;
  if (known && !key_is(known, r))
    return call_colliding(s, r, args, n);
  if (s->n_grad_pos && note_grad_leaves(r, args) < 0)
    return NULL;
  if (s->outputs_known && (writes_side_value || (known && views_as_other_dtype(known, side_values))))
    return call_plain_over_side_value(s, r, args, n);
  uint64_t t_args = clock_if(timed);
  if (!s->outputs_known) { /* runs on the caller's stream: wait for the tree's outputs */
    if (tx_caller_needs_events(T, caller))
      tx_stream_wait(caller, T->stream, T->ev_out);
    PyObject *plain = first_call(s, r, caller, args, n, variant);
    if (!plain)
      return NULL;
    int keeps_plain = !s->outputs_known || s->bypass_reason;
    if (!keeps_plain && run_register(r) < 0)
      return ran_then_failed(s, plain); /* registered at a later call (below) */
    if (keeps_plain || !s->rerun_first) { /* the caller gets the plain outputs */
      plain_saved_hold_step(s, T, plain);
      return plain;
    }
    Py_DECREF(plain); /* its outputs die now: the run below makes them again, in the pool */
    tx_out_ref_queue_drain();
  } else if (!r->registered && run_register(r) < 0) { /* a tree of another thread ran it first */
    return NULL;
  }
  if (tx_caller_needs_events(T, caller))
    tx_stream_wait(T->stream, caller, T->ev_in);
  tx_pool_readers_wait(T, caller); /* streams record_stream named for outputs, callers' left (pool_readers.c) */

  r->cur = args;
  r->cur_variant = variant;
  r->want_bypass = 0;
  clear_exception(r); /* a capture that failed and then ran eagerly may have left one */
  uint64_t t1 = clock_if(timed);
  if (s->prelaunch_py) {
    if (T->ev_out && !random_done_event(T->device))
      return NULL;
    /* The generator's writes go on the caller's stream where CUDA orders it
     * with the tree's both ways (the legacy default stream and a blocking
     * tree), else on the tree's stream (_rng.py, RandomDraws.prelaunch). */
    r->fill_stream = caller == NULL && T->blocking ? NULL : T->stream;
  }
  uint64_t refusals = tx_alloc_refusals(), step_refusals = tx_reads_refusals();
  if (s->prelaunch_py)
    random_lock();
  tx_alloc_run_enter(); /* a capture may run until cgt_run returns: eager frees wait (alloc.c) */
  T->in_run++;
  cgt_status st = cgt_run(T->tree, r->seg, variant, r->args, s->n_targs, r->outs, s->n_outputs);
  T->in_run--;
  tx_alloc_run_leave();
  if (s->prelaunch_py) { /* every read of the generator's state enqueued so far comes before this */
    tx_event_record(random_event(T), T->stream);
    pthread_mutex_unlock(&random_mu);
  }
  uint64_t t2 = clock_if(timed);
  r->cur = NULL;
  cgt_stats after;
  cgt_tree_stats(T->tree, &after);
  tx_alloc_note_pool_in_use(&T->pool_in_use_reported, after.pool_allocated_bytes);
  int replayed = after.replays > T->replays_seen; /* only segment.c runs this tree */
  T->replays_seen = after.replays;
  uint64_t launch_ns = after.launch_host_ns - T->launch_ns_seen;
  T->launch_ns_seen = after.launch_host_ns;
  int capture_failed = after.capture_failures > T->capture_failures_seen;
  T->capture_failures_seen = after.capture_failures;
  r->outs_side_pool = after.eager_runs > T->eager_runs_seen; /* a failed capture's run counts here too */
  T->eager_runs_seen = after.eager_runs;
  if (after.evictions && !T->warned_evicting) { /* the budget began to evict: say which graph grew past it, once */
    T->warned_evicting = 1;
    PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                     "cgtree.torch: the recording budget is evicting graphs (at graph '%s', which has %zu shapes "
                     "or variants so far); recordings of evicted paths are made again when reached",
                     s->name, s->n_tmpls);
    PyErr_Clear(); /* a warning turned error must not break the call */
  }
  if (st != CGT_OK) {
    if (r->exc_type && (tx_alloc_refusals() != refusals || tx_reads_refusals() != step_refusals)) {
      /* Out of memory while cgtree warmed the graph up or recorded it (the
       * pool could not grow, even after the driver's pools gave their cache
       * back: alloc.c), or a compiled call inside the graph's Python could
       * not end its step while another thread read its outputs
       * (reads_in_flight.c): no fault of the graph. The run changed
       * nothing; the error reaches the caller as it would from the plain
       * graph, and the graph stays a segment. It is not run plainly
       * instead: a warmup's kernels ran up to the refusal, and a graph
       * that writes its inputs must not run twice. */
      PyErr_Restore(r->exc_type, r->exc_value, r->exc_tb);
      r->exc_type = r->exc_value = r->exc_tb = NULL;
      return NULL;
    }
    if (st == CGT_ERR_OUT_OF_MEMORY && !r->exc_type) { /* the tree's own pool allocations, outside a launch */
      PyErr_Format(TX.oom_error ? TX.oom_error : PyExc_MemoryError,
                   "CUDA out of memory in cgtree.torch's pool, running graph '%s': %s", s->name,
                   cgt_tree_last_error(T->tree));
      s->out_of_memory++;
      return NULL;
    }
    if (r->exc_type) {
      /* The graph raised while cgtree warmed it up or recorded it, and no
       * allocation was refused. Whatever the cause (a call PyTorch refuses
       * under capture, or the graph's own error), the graph runs plainly
       * from now on; a genuine error then reaches the caller from the plain
       * call. */
      PyObject *text = r->exc_value ? PyObject_Repr(r->exc_value) : NULL;
      const char *t = text ? PyUnicode_AsUTF8(text) : NULL;
      PyErr_Clear();
      char why[600];
      snprintf(why, sizeof why, "it raised while cgtree ran it (%s): %s", cgt_status_name(st), t ? t : "?");
      Py_XDECREF(text);
      clear_exception(r);
      go_plain(s, why);
      return call_plain_in_step(s, T, caller, args, n);
    }
    if (r->want_bypass || st == CGT_ERR_SEGMENT_FAILED) {
      char why[512];
      snprintf(why, sizeof why, "%s (%s)", cgt_status_name(st), cgt_tree_last_error(T->tree));
      go_plain(s, why);
      return call_plain_in_step(s, T, caller, args, n);
    }
    if (st == CGT_ERR_STALE_VALUE) {
      T->stale_refused++;
      PyErr_Format(TxStaleError, "cgtree.torch: graph '%s': %s", s->name, cgt_tree_last_error(T->tree));
      return NULL;
    }
    return tx_status_error(T, st, "cgt_run");
  }
  clear_exception(r);
  if (capture_failed) {
    /* The graph cannot be captured (a host sync such as torch.cond's device
     * predicate, a call CUDA refuses under capture): cgtree ran it eagerly
     * this once, correctly. From now on it runs as the plain Inductor graph,
     * at Inductor's speed, rather than as an eager node of the tree. */
    char why[512];
    snprintf(why, sizeof why, "its capture failed (%s)", cgt_tree_last_error(T->tree));
    go_plain(s, why);
  } else {
    s->eager_calls_mask = s->eager_calls_mask << 1 | (uint32_t)(r->outs_side_pool != 0);
    if (r->outs_side_pool && __builtin_popcount(s->eager_calls_mask) == EAGER_RUNS_PLAIN) {
      char why[256];
      snprintf(why, sizeof why, "the tree ran it eagerly in %u of its last 32 calls (its node is past the rerecord "
               "limit: a buffer it writes in place, or another static input, comes at a new address at each call)",
               (unsigned)EAGER_RUNS_PLAIN);
      go_plain(s, why);
    }
  }
  if (tx_caller_needs_events(T, caller))
    tx_stream_wait(caller, T->stream, T->ev_out);
  variant_tmpl *t = tmpl_find(s, variant);
  if (!t) {
    for (uint32_t j = 0; j < s->n_outputs; j++)
      (void)cgt_value_release(T->tree, r->outs[j]);
    PyErr_Format(TxError, "cgtree.torch: graph '%s' has no output template for variant %llu", s->name,
                 (unsigned long long)variant);
    return NULL;
  }
  uint64_t t3 = clock_if(timed);
  r->ns_made = 0;
  PyObject *result = build_result(r, args, t);
  s->replays += (uint64_t)replayed;
  if (replayed && timed) {
    uint64_t t4 = tx_now_ns();
    s->ns_args += t_args - t0;
    s->ns_step += t_step - t0;
    s->ns_launch += launch_ns;
    s->ns_make += r->ns_made;
    s->ns_streams += (t1 - t_args) + (t3 - t2);
    s->ns_in_run += t2 - t1;
    s->ns_outputs += t4 - t3;
    s->ns_in_call += t4 - t0;
  }
  return result;
}

/* ------------------------------------------------------- the type */

/* Reads positions, a tuple of tensor argument positions or None, into a new
 * array (*out NULL and *n 0 for None or an empty tuple). */
static int read_positions(const SegmentObject *s, PyObject *positions, const char *what, uint32_t **out, uint32_t *n) {
  *out = NULL;
  *n = 0;
  if (positions == Py_None || PyTuple_GET_SIZE(positions) == 0)
    return 0;
  Py_ssize_t count = PyTuple_GET_SIZE(positions);
  uint32_t *pos = tx_malloc((size_t)count * sizeof *pos);
  if (!pos) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t j = 0; j < count; j++) {
    long i = PyLong_AsLong(PyTuple_GET_ITEM(positions, j));
    if (i == -1 && PyErr_Occurred()) {
      free(pos);
      return -1;
    }
    if (i < 0 || (unsigned long)i >= s->n_args || s->arg_kind[i] > ARG_TENSOR_STATIC) {
      PyErr_Format(PyExc_ValueError, "%s: %ld is not the position of a tensor argument", what, i);
      free(pos);
      return -1;
    }
    pos[j] = (uint32_t)i;
  }
  *out = pos;
  *n = (uint32_t)count;
  return 0;
}

/* *mask, bit i for each result position i in `positions` (a tuple, or
 * None for none): each below saved_from and below 64. 0; -1 with an
 * exception set (nothing changed). */
static int read_result_mask(PyObject *positions, uint32_t saved_from, uint64_t *mask) {
  const char *usage = "memory_watched_outputs: a tuple of result positions below saved_from and below 64, or None";
  uint64_t m = 0;
  if (positions != Py_None && !PyTuple_Check(positions)) {
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
  }
  for (Py_ssize_t j = 0; positions != Py_None && j < PyTuple_GET_SIZE(positions); j++) {
    long i = PyLong_AsLong(PyTuple_GET_ITEM(positions, j));
    if (i == -1 && PyErr_Occurred())
      return -1;
    if (i < 0 || i >= 64 || (unsigned long)i >= saved_from) {
      PyErr_SetString(PyExc_ValueError, usage);
      return -1;
    }
    m |= 1ull << i;
  }
  *mask = m;
  return 0;
}

static int seg_init(SegmentObject *s, PyObject *a, PyObject *kw) {
  static char *kwlist[] = {"tree", "name", "compiled", "launch", "alias", "describe", "span",
                           "kinds", "spans", "flags", "dynamic_spans", "rerun_first", "saved_from", "backward",
                           "prelaunch", "side_stream", "grad_inputs", "written_inputs", "plain_reason",
                           "memory_watched_outputs", "pair", NULL};
  PyObject *tree, *compiled, *launch, *alias, *describe, *span, *spans, *prelaunch = Py_None, *grad_inputs = Py_None;
  PyObject *written_inputs = Py_None, *plain_reason = Py_None, *memory_watched = Py_None;
  const char *name;
  Py_buffer kinds;
  unsigned int flags = 0;
  int dyn = 0, rerun = 0, backward = 0;
  unsigned int saved_from = UINT32_MAX;
  unsigned long long side_stream = 0, pair = 0;
  if (!s->dict && !(s->dict = PyDict_New()))
    return -1;
  if (PyDict_SetItemString(s->dict, "_boxed_call", Py_True) < 0)
    return -1;
  if (!PyArg_ParseTupleAndKeywords(a, kw, "O!sOOOOOy*O!|IppIpOKOOOOK", kwlist, &TreeType, &tree, &name,
                                   &compiled, &launch, &alias, &describe, &span, &kinds, &PyTuple_Type, &spans,
                                   &flags, &dyn, &rerun, &saved_from, &backward, &prelaunch, &side_stream,
                                   &grad_inputs, &written_inputs, &plain_reason, &memory_watched, &pair))
    return -1;
  if (plain_reason != Py_None && !PyUnicode_Check(plain_reason)) {
    PyBuffer_Release(&kinds);
    PyErr_SetString(PyExc_TypeError, "plain_reason is a str (why the graph runs plainly from the start) or None");
    return -1;
  }
  if (prelaunch != Py_None && !PyCallable_Check(prelaunch)) {
    PyBuffer_Release(&kinds);
    PyErr_SetString(PyExc_TypeError, "prelaunch is a callable or None");
    return -1;
  }
  if ((grad_inputs != Py_None && !PyTuple_Check(grad_inputs)) ||
      (written_inputs != Py_None && !PyTuple_Check(written_inputs))) {
    PyBuffer_Release(&kinds);
    PyErr_SetString(PyExc_TypeError, "grad_inputs and written_inputs are tuples of argument positions or None");
    return -1;
  }
  if (PyTuple_GET_SIZE(spans) != kinds.len) {
    PyBuffer_Release(&kinds);
    PyErr_SetString(PyExc_ValueError, "kinds and spans differ in length");
    return -1;
  }
  s->n_args = (uint32_t)kinds.len;
  s->arg_kind = tx_malloc(kinds.len + 1);
  s->arg_span = tx_calloc(kinds.len + 1, sizeof *s->arg_span);
  s->name = strdup(name);
  if (!s->arg_kind || !s->arg_span || !s->name) {
    PyBuffer_Release(&kinds);
    PyErr_NoMemory();
    return -1;
  }
  memcpy(s->arg_kind, kinds.buf, kinds.len);
  PyBuffer_Release(&kinds);
  for (uint32_t i = 0; i < s->n_args; i++)
    if (s->arg_kind[i] > ARG_GENERATOR) {
      PyErr_Format(PyExc_ValueError, "kinds: %u at position %u is no argument kind (0 to %d)",
                   (unsigned)s->arg_kind[i], i, ARG_GENERATOR);
      return -1;
    }
  for (uint32_t i = 0; i < s->n_args; i++) {
    s->arg_span[i] = PyLong_AsSize_t(PyTuple_GET_ITEM(spans, i));
    if (s->arg_kind[i] <= ARG_TENSOR_STATIC)
      s->n_targs++;
  }
  if (PyErr_Occurred())
    return -1;
  if (read_positions(s, grad_inputs, "grad_inputs", &s->grad_pos, &s->n_grad_pos) < 0)
    return -1;
  uint32_t *written = NULL, n_written = 0;
  if (read_positions(s, written_inputs, "written_inputs", &written, &n_written) < 0)
    return -1;
  if (n_written && !(s->arg_written = tx_calloc(s->n_args, 1))) {
    free(written);
    PyErr_NoMemory();
    return -1;
  }
  for (uint32_t j = 0; j < n_written; j++)
    s->arg_written[written[j]] = 1;
  free(written);
  PyObject *idx = PyList_New(0);
  if (!idx)
    return -1;
  for (uint32_t i = 0; i < s->n_args; i++) {
    if (s->arg_kind[i] == ARG_TENSOR_STATIC) {
      PyObject *v = PyLong_FromUnsignedLong(i);
      if (!v || PyList_Append(idx, v) < 0) {
        Py_XDECREF(v);
        Py_DECREF(idx);
        return -1;
      }
      Py_DECREF(v);
    }
  }
  if (PyList_GET_SIZE(idx) >= STATIC_CHECK_MIN)
    s->static_idx = idx;
  else
    Py_DECREF(idx);
  s->flags = flags;
  s->dynamic_spans = dyn;
  s->rerun_first = rerun;
  s->saved_from = saved_from;
  s->pair = pair;
  s->backward = backward;
  if (read_result_mask(memory_watched, saved_from, &s->memory_watched) < 0)
    return -1;
  s->side_stream = (void *)(uintptr_t)side_stream;
  Py_INCREF(tree);
  s->tree = (TreeObject *)tree;
#define KEEP(field, obj) (Py_INCREF(obj), s->field = (obj))
  KEEP(compiled, compiled);
  KEEP(launch_py, launch);
  KEEP(alias_py, alias);
  KEEP(describe_py, describe);
  KEEP(span_py, span);
  if (prelaunch != Py_None)
    KEEP(prelaunch_py, prelaunch);
  if (plain_reason != Py_None) /* plain from the start: its calls still mark steps (call_bypassed) */
    KEEP(bypass_reason, plain_reason);
#undef KEEP
  s->vectorcall = seg_vectorcall;
  return 0;
}

static void seg_dealloc(SegmentObject *s) {
  /* A registered segment is never freed: the tree holds a reference,
   * because cgtree has no unregister and may call its launch function. */
  for (size_t i = 0; i < s->n_tmpls; i++) {
    tmpl_clear(s->tmpls[i]);
    free(s->tmpls[i]);
  }
  free(s->tmpls);
  free(s->arg_kind);
  free(s->arg_span);
  free(s->grad_pos);
  free(s->arg_written);
  Py_XDECREF(s->static_idx);
  for (size_t i = 0; i < s->n_runs; i++) { /* only runs never registered: a registered one holds s */
    seg_run *r = s->runs[i];
    tree_run_forget(r->tree, r);
    run_free(r);
  }
  free(s->runs);
  free(s->name);
  Py_XDECREF(s->tree);
  Py_XDECREF(s->compiled);
  Py_XDECREF(s->launch_py);
  Py_XDECREF(s->alias_py);
  Py_XDECREF(s->describe_py);
  Py_XDECREF(s->span_py);
  Py_XDECREF(s->prelaunch_py);
  Py_XDECREF(s->bypass_reason);
  Py_XDECREF(s->dict);
  Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *seg_get_info(SegmentObject *s, void *closure) {
  (void)closure;
  int registered = 0;
  for (size_t i = 0; i < s->n_runs; i++)
    registered += s->runs[i]->registered;
  return Py_BuildValue("{s:s,s:I,s:O,s:i,s:K,s:K,s:K,s:I,s:I,s:O,s:K}", "name", s->name, "segment",
                       s->n_runs ? (unsigned)s->runs[0]->seg : 0u, "registered", registered ? Py_True : Py_False,
                       "trees", registered, "calls", (unsigned long long)s->calls,
                       "plain_calls", (unsigned long long)s->plain_calls, "out_of_memory",
                       (unsigned long long)s->out_of_memory, "inputs", s->n_targs, "outputs", s->n_outputs,
                       "plain_reason", s->bypass_reason ? s->bypass_reason : Py_None, "collisions",
                       (unsigned long long)s->collisions);
}

static PyObject *seg_timers(SegmentObject *s, PyObject *unused) {
  (void)unused;
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "static_checks",
                       (unsigned long long)s->static_checks,
                       "static_hits", (unsigned long long)s->static_hits, "replays", (unsigned long long)s->replays,
                       "ns_in_call",
                       (unsigned long long)s->ns_in_call, "ns_args", (unsigned long long)s->ns_args, "ns_streams",
                       (unsigned long long)s->ns_streams, "ns_in_run", (unsigned long long)s->ns_in_run,
                       "ns_outputs", (unsigned long long)s->ns_outputs, "ns_step", (unsigned long long)s->ns_step,
                       "ns_make", (unsigned long long)s->ns_make, "ns_launch", (unsigned long long)s->ns_launch);
}

static PyObject *seg_reset_timers(SegmentObject *s, PyObject *unused) {
  (void)unused;
  s->replays = s->ns_in_call = s->ns_args = s->ns_streams = s->ns_in_run = s->ns_outputs = 0;
  s->ns_step = s->ns_make = s->ns_launch = 0;
  Py_RETURN_NONE;
}

static PyMethodDef seg_methods[] = {
    {"timers", (PyCFunction)seg_timers, METH_NOARGS,
     "replayed calls; with a tree made with time_launches, ns spent in their whole call (C hot path) and in its "
     "parts: arguments (of them: the step's start), streams, cgt_run (of it: the graph launch call), output tensors "
     "(of them: PyTorch making them); 0 otherwise"},
    {"reset_timers", (PyCFunction)seg_reset_timers, METH_NOARGS, "zero the timers"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef seg_getset[] = {
    {"info", (getter)seg_get_info, NULL, "name, segment id, calls, plain calls and why", NULL},
    {"__dict__", PyObject_GenericGetDict, NULL, "holds _boxed_call (True: AOTAutograd may pass the arguments as one list)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *seg_tp_call(PyObject *self, PyObject *args, PyObject *kw) {
  return PyVectorcall_Call(self, args, kw);
}

PyTypeObject SegmentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cgtree._torch_ext.Segment",
    .tp_basicsize = sizeof(SegmentObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(SegmentObject, vectorcall),
    .tp_call = seg_tp_call,
    .tp_doc = "One Dynamo graph as a cgtree segment; call it like the compiled graph.",
    .tp_init = (initproc)seg_init,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)seg_dealloc,
    .tp_getset = seg_getset,
    .tp_dictoffset = offsetof(SegmentObject, dict),
    .tp_methods = seg_methods,
};
