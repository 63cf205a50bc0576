/* segment.h — what the files of a segment share: its object, its state in
 * each tree, its output templates, and each file's functions.
 *
 * segment.c     the call: arguments in, cgt_run, result out; the type.
 * seg_outputs.c output tensors over the tree's values, released outputs,
 *               and the templates that describe a variant's results.
 * seg_launch.c  the launch function cgtree calls to warm up or record, the
 *               random graphs' order, cuBLAS's workspaces, prelaunch.
 * seg_runs.c    a segment's state per tree (seg_run), the tree of the
 *               calling thread, STATIC pointers kept, the variant's key.
 * seg_holds.c   arguments that lie in outputs of the step, and the holds
 *               a backward's reads end.
 * seg_steps.c   which step a call belongs to: gradient leaves, the
 *               optimizer's calls, arguments moved out of the pool.
 * seg_plain.c   calls that run as the plain compiled graph.
 */
#ifndef CGT_TORCH_SEGMENT_H
#define CGT_TORCH_SEGMENT_H

#include "ext.h"

#include <pthread.h>
#include <stdint.h>


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
   * same variant but differs is not this template's (seg_call_colliding). */
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
  tx_out_ref **made_at; /* seg_build_result's record of each tensor result, where its template has ties */
  uint32_t n_made_at;   /* made_at's length (the segment's n_outputs) */
  void *fill_stream; /* where this run's prelaunch writes the generator's state (NULL: the legacy stream) */
  PyObject **grad_seen; /* a weak reference to the object last seen at each of the segment's grad_pos */
  uint32_t n_grad_seen; /* its length (the segment's n_grad_pos), so that freeing a run needs no segment */
  int outs_side_pool; /* the run at hand was eager: its outputs lie in the tree's side pool */
  uint32_t eager_calls_mask; /* its last 32 calls through this tree: a bit set for each eager run (EAGER_RUNS_PLAIN) */
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
   * through cgt_run (seg_call_plain_over_side_value). */
  uint8_t *arg_written;
  int warned_side_write; /* the first such call was reported */
  int warned_other_view; /* the first call viewing another tree's output as another dtype was reported */
  int warned_collision;  /* the first call whose variant key collided was reported (seg_call_colliding) */
  uint64_t collisions;   /* such calls */
  /* The list of STATIC positions, as PyTorch's pointer check wants them
   * (NULL when there are fewer than STATIC_CHECK_MIN: then they are read
   * every call). The pointers of the last call are each run's (seg_run). */
  PyObject *static_idx;
  int dynamic_spans;
  int outputs_known; /* the first call told n_outputs (seg_first_call); runs register with it */
  int rerun_first; /* the graph mutates no input: its first call may run again, in the pool (seg_first_call) */
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
   * template across calls into Python (seg_build_result makes tensors), where
   * another thread may add one and grow this array. */
  variant_tmpl **tmpls;
  size_t n_tmpls;
  /* The same templates by variant, an open-addressing table (linear
   * probing; tmpl_slots a power of two, at most half full, 0: none yet):
   * a call finds its template in a probe or two however many shapes the
   * segment has seen. A scan of tmpls cost a replay 10x at 20,000 shapes
   * (a helper's hunt). Variants are splitmix64-finalised hashes, so their
   * low bits index it. Templates are never removed, so a probe sequence
   * holds them in the order they were added, as the scan found them. */
  variant_tmpl **tmpl_index;
  size_t tmpl_slots;
  uint64_t calls, plain_calls;
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
static inline int training_forward(const SegmentObject *s) {
  return !s->backward && s->saved_from != UINT32_MAX;
}

static inline int inference_graph(const SegmentObject *s) {
  return !s->backward && s->saved_from == UINT32_MAX;
}

/* A graph whose node is past the rerecord limit runs eagerly through the
 * tree, its outputs in the side pool: a buffer it writes in place (STATIC)
 * passed at a new address at every call is a new key at every call. That
 * cost 1.89x the plain graph's time on an H200 (bench/torch_moving_static.py).
 * So once a tree ran a graph eagerly in this many of its last 32 calls
 * through that tree, it runs as the plain graph from then on, at Inductor's
 * speed, on every tree. Half, not a run in a row: a graph called at two
 * places of a step, one of which replays, stayed eager at the other for
 * good (a review). Counted per tree (seg_run), not over the segment's calls
 * on every tree: another thread's replays of the graph kept the share of
 * one tree's eager runs under half, and that tree ran it eagerly for good
 * (a helper's hunt). */
enum { EAGER_RUNS_PLAIN = 16 };

/* The variant: a hash of the call's key, everything host-side that changes
 * what the graph enqueues (its ints and floats, where a VALUE input starts
 * inside its value, the generators it is passed). Each entry goes through
 * splitmix64's finaliser, and so does the running hash, so that any change
 * of any entry changes every bit with even odds (a sum-and-shift mix, as
 * before, made (0, 62) and (1, 1) the same variant). The key itself is kept
 * too, in each template, so that a collision, however unlikely, is seen
 * (seg_call_colliding) and never replays another key's recording. */
static inline uint64_t fmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline void key_add(seg_run *r, uint64_t *variant, uint64_t x) {
  r->key[r->n_key++] = x;
  *variant = fmix64(*variant ^ fmix64(x + 0x9e3779b97f4a7c15ull));
}

/* ----------------------------------------------- seg_outputs.c */

variant_tmpl *seg_tmpl_find(SegmentObject *s, uint64_t variant);
void seg_tmpl_clear(variant_tmpl *t);
int seg_tmpl_add(SegmentObject *s, const seg_run *r, void *const *seen, uint64_t variant, PyObject *desc,
                 PyObject *res, PyObject *const *args, uint32_t *n_tensors);
PyObject *seg_build_result(seg_run *r, PyObject *const *args, variant_tmpl *t);

/* ------------------------------------------------ seg_launch.c */

void seg_clear_exception(seg_run *r);
void seg_go_plain_described(SegmentObject *s, PyObject *desc, const char *fallback);
int seg_random_lock(void); /* -1, CgtreeError set: this thread holds it already */
int seg_random_done_event(int device);
cgt_status seg_launch(cgt_launch *l, void *user);
cgt_status seg_prelaunch(void *user, void *stream, uint64_t variant);
void seg_random_unlock(void);
void *seg_random_event(const TreeObject *T);

/* -------------------------------------------------- seg_runs.c */

int seg_static_ptrs_unchanged(seg_run *r, PyObject *const *args, size_t n);
int seg_static_ptr_note(seg_run *r, size_t i, void *ptr);
int seg_run_register(seg_run *r);
void seg_run_free(seg_run *r);
seg_run *seg_run_for(SegmentObject *s);
void seg_tree_run_forget(TreeObject *T, seg_run *r);
extern uint64_t seg_variant_mask;
int seg_key_is(const variant_tmpl *t, const seg_run *r);

/* ------------------------------------------------- seg_holds.c */

tx_out_ref *seg_step_output_holding(TreeObject *T, PyObject *o, void *ptr, size_t span);
int seg_arg_data_ptr(const SegmentObject *s, PyObject *o, void **ptr);
int seg_arg_step_output(const SegmentObject *s, TreeObject *T, PyObject *o, tx_out_ref **out);
void seg_saved_view_hold(const SegmentObject *s, TreeObject *T, tx_out_ref *ref);
void seg_backward_read(const SegmentObject *s, TreeObject *T, tx_out_ref *ref);
int seg_end_holds_of_args_read(const SegmentObject *s, TreeObject *T, PyObject *const *args);
void seg_tied_saved_hold(const SegmentObject *s, TreeObject *T, tx_out_ref *ref);

/* ------------------------------------------------- seg_steps.c */

int seg_note_grad_leaves(seg_run *r, PyObject *const *args);
extern _Thread_local seg_run *seg_memo_pending;
seg_run *seg_run_in_step(SegmentObject *s, PyObject *const *args, size_t n, void **caller);
void seg_plain_saved_hold_step(SegmentObject *s, TreeObject *T, PyObject *res);

/* ------------------------------------------------- seg_plain.c */

void seg_go_plain(SegmentObject *s, const char *why);
PyObject *seg_call_colliding(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n);
int seg_views_as_other_dtype(const variant_tmpl *t, uint64_t values);
int seg_may_view_as_other_dtype(const SegmentObject *s, const variant_tmpl *known, uint64_t values);
void seg_warn_view_of_other_tree(SegmentObject *s);
PyObject *seg_call_plain_in_step(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args,
                                 size_t n);
PyObject *seg_call_plain_over_side_value(SegmentObject *s, const seg_run *r, PyObject *const *args, size_t n);
PyObject *seg_call_plain_over_other_trees_output(SegmentObject *s, const seg_run *r, PyObject *const *args,
                                                 size_t n);
PyObject *seg_ran_then_failed(SegmentObject *s, PyObject *res);
PyObject *seg_first_call(SegmentObject *s, const seg_run *r, void *caller, PyObject *const *args, size_t n,
                         uint64_t variant);
PyObject *seg_call_bypassed(SegmentObject *s, PyObject *const *args, size_t n, PyObject *kwnames);
int seg_on_device_slow(PyObject *o, int device);
PyObject *seg_arg_unreadable(SegmentObject *s, TreeObject *T, size_t i);
PyObject *seg_call_off_device(SegmentObject *s, TreeObject *T, void *caller, PyObject *const *args, size_t n,
                              size_t i);

#endif
