/* seg_holds.c — arguments that lie in outputs of the step, and the holds
 * on the step that a backward's reads end.
 *
 * A call's tensor argument may lie in an output of this step (a VALUE:
 * seg_step_output_holding finds which). Training keeps a step from
 * beginning while a backward is still to read what the step made: a
 * forward's saved activations, and saved results that are views of or
 * tied to an output of the step (seg_saved_view_hold, seg_tied_saved_hold),
 * counted per forward pair (AOTAutograd's graph id), so that the backward
 * of one head does not end another head's hold. A backward that reads
 * such memory ends the holds of its own pair, once per input, and only
 * once it has read every input (end_holds_read_by_backward); where the
 * output is another thread's, that tree hears of it (seg_backward_read).
 * module.c ("Steps in training") says when these holds keep a step open.
 */
#include "segment.h"

/* The live output of T's step that tensor argument o, span bytes at ptr,
 * lies in: NULL if none, or with an exception set. An empty argument (span
 * 0) lies in one only where it shares that output's storage (an empty view
 * of it): an empty output of an earlier step is never marked (make_output),
 * and the byte of pool it was given may lie inside an output of this step
 * by now. Taken for that output, it was passed as its value at an offset
 * (a variant, and a recording, of its own) and, read by a backward, ended
 * that output's holds of the step. */
tx_out_ref *seg_step_output_holding(TreeObject *T, PyObject *o, void *ptr, size_t span) {
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
int seg_arg_data_ptr(const SegmentObject *s, PyObject *o, void **ptr) {
  return !(s->outputs_known && tx_exchange_data_ptr(o, ptr, NULL)) && tx_data_ptr_slow(o, ptr) < 0 ? -1 : 0;
}

/* *out: the live output of T's step that tensor argument o of s lies in,
 * or NULL. 0; -1 as seg_arg_data_ptr. */
int seg_arg_step_output(const SegmentObject *s, TreeObject *T, PyObject *o, tx_out_ref **out) {
  void *ptr;
  *out = NULL;
  if (seg_arg_data_ptr(s, o, &ptr) < 0)
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
 * unknown), the hold that saved result kept (seg_tied_saved_hold) ends. Another
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
 * memory (seg_plain_saved_hold_step): ref's memory holds the step until that
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
void seg_saved_view_hold(const SegmentObject *s, TreeObject *T, tx_out_ref *ref) {
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
void seg_backward_read(const SegmentObject *s, TreeObject *T, tx_out_ref *ref) {
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

/* seg_backward_read for each tensor argument of a backward that runs as the
 * plain graph (no argument loop of seg_call's reads them). 0; -1 with an
 * exception set. */
int seg_end_holds_of_args_read(const SegmentObject *s, TreeObject *T, PyObject *const *args) {
  int others = tx_live_trees_besides(T);
  for (uint32_t i = 0; i < s->n_args && (others || T->tied_saved_alive || T->saved_alive); i++) {
    void *ptr;
    if (s->arg_kind[i] > ARG_TENSOR_STATIC)
      continue;
    if (seg_arg_data_ptr(s, args[i], &ptr) < 0)
      return -1;
    tx_out_ref *ref = ptr ? tx_step_output_at(T, ptr, 1) : NULL;
    if (!ref && ptr && others)
      ref = tx_other_trees_step_output_at(T, ptr, 1);
    if (ref)
      seg_backward_read(s, T, ref);
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
void seg_tied_saved_hold(const SegmentObject *s, TreeObject *T, tx_out_ref *ref) {
  /* An empty record is on no step list, so no backward read could end its hold (a review: a saved empty
   * output held every later step). */
  if (!ref || ref->caller_memory || ref->empty || ref->tied_saved || ref->step != T->step || T->explicit_steps)
    return;
  ref->tied_saved = s->pair ? s->pair : TIED_BY_UNKNOWN;
  T->tied_saved_alive++;
}
