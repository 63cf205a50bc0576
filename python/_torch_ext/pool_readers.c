/* pool_readers.c — streams that read memory the trees will write again, so
 * that the trees' next launches wait for them.
 *
 * A compiled graph's output lies in its tree's pool, and the tree's next
 * launch writes that memory again: a replay writes its outputs where its
 * recording did, and a warmup or a recording takes blocks the tree has
 * given back. From the host nothing can read the old output afterwards:
 * the stale marks make every access raise (stale.c). But a read queued on
 * another stream before that launch (a copy to the host on a copy stream,
 * a side stream's kernel) is ordered with the caller's stream only, and the
 * launch's writes on the tree's stream may overtake it. Under plain
 * Inductor that memory would not be written before the output was freed,
 * and a free waits for every stream record_stream named (eager.c). So
 * record_stream(out, s) is the one way a program tells us of such a read,
 * and we honour it here: PyTorch's recordStream on memory that is not an
 * eager block of ours (an output, or a view of one, or memory cgtree does
 * not know) notes s with a new generation number; before its next launch,
 * a tree of s's device makes its stream wait for s's work so far (an
 * event): at each launch until the first launch of a later step, since
 * the program may queue more reads of a live output on s after a launch of
 * its own step, and only the next step reuses its memory. Each tree keeps
 * the generation it has waited up to for good (TreeObject.readers_seen,
 * moved at a step's first launch; a new tree starts at the current one:
 * no output of it existed before), so a launch with nothing new to wait
 * for costs one atomic read.
 *
 * The list holds each stream once, with its last note's generation; it
 * grows with the number of distinct streams a program names, not with the
 * number of calls. A stream's device is asked of CUDA at the first wait
 * for it (a simulator's tree, in the tests, asks nothing: its streams are
 * not CUDA's). A noted stream must live until the
 * next launch of the trees of its device, as PyTorch asks of a recorded
 * stream until the free. Out of host memory a note is refused (-1, nothing
 * changed), and PyTorch's recordStream raises.
 *
 * A noted stream that is capturing (a capture of the program's own, on a
 * copy stream) is not waited for then: an event recorded there would be a
 * node of that capture, and the tree's stream would join it. The tree
 * waits for it at a later launch, once the capture has ended (its
 * readers_seen stays below that note). A stream CUDA does not know any
 * more (destroyed) is not waited for.
 *
 * A caller that switches streams is such a reader too. The outputs of a
 * call made on stream s1 are the caller's on s1: the program may copy
 * them there (a copy to the host, queued behind the call) while the next
 * call comes from s2, and the tree waits for the stream of the call it
 * runs only. Under plain Inductor the outputs' blocks belong to s1 until
 * freed and are reused on s1 only. So at every call of a segment of the
 * tree, launched or run plainly (a plain call on s2 may read an output of
 * the step there), a caller that is not the last call's notes the last
 * one's stream on the tree (tx_pool_readers_caller), unless CUDA orders
 * it with the tree's stream by itself (the tree's own stream, or the
 * legacy default stream with a blocking tree). These notes are the
 * tree's own, not on the list above: only its outputs went to its
 * callers, and another thread's tree need not wait for them. Its
 * launches wait for each noted stream, and drop a note once they are of
 * a later step than the note's last call there. A program on one stream
 * notes nothing; one that alternates notes at each switch. The stream
 * must live until the tree's next launch, as a stream record_stream
 * names must live until the free.
 *
 * A tree of another thread that reads an output is such a reader too
 * (tx_pool_readers_other_tree). A thread hands y = enc(x) to another,
 * whose compiled dec(y) runs on its own tree: that tree copies y into its
 * placeholder (or its graph reads y) on its own stream, or, where dec runs
 * plainly, on its caller's stream, neither of which the owner's calls ever
 * came from. The owner's next step writes y's memory again on the owner's
 * stream, and before this nothing ordered that after the read: dec read
 * enc's next output, silently (a review). Under plain Inductor y's block
 * is not reused while y lives. So segment.c, at a call whose tensor
 * argument lies in an output of another tree's step, notes the stream that
 * reads it among the owner's callers' streams, with the owner's step: the
 * owner's launches wait for it until one of a later step, as for a stream
 * its own calls left. It is looked up only while several trees live, once
 * per tensor argument that is no output of the calling tree's step. The
 * owner's notes are touched under the GIL only, by whichever thread, as
 * the owner's own calls touch them (before their launch, under the GIL).
 * A stream wait covers the work queued so far only, and a call may let
 * the GIL go between its look-up of y and its read (a warmup, a recording
 * or a plain graph runs the graph's Python): the owner's step must not
 * end meanwhile. reads_in_flight.c sees to that (its essay): the look-up
 * begins a read in flight (tx_reads_begin, in tx_pool_readers_other_tree),
 * and the owner's step ends only once none is left.
 *
 * A noted stream that captures when a launch would wait for it is waited
 * for at a later launch: too late for that launch, which may overwrite
 * what the stream read before its capture began. torch.cuda.graph
 * synchronises the device before it captures, so only a capture begun
 * by hand on a stream still reading an output meets this.
 *
 * What is not seen: a read on another stream without record_stream, of an
 * output no call on that stream received. Under plain Inductor it is safe
 * while the output lives; under cgtree the next launch may overtake it.
 * docs/torch.md says so.
 */
#include "ext.h"

#include <stdatomic.h>
#include <stdlib.h>

typedef struct pool_reader {
  void *stream;
  int device; /* the stream's device: READER_DEVICE_UNASKED until a tree asks CUDA; -1 if CUDA could not tell */
  uint64_t generation; /* its last note */
} pool_reader;

enum { READER_DEVICE_UNASKED = -2 };

static pthread_mutex_t readers_mu = PTHREAD_MUTEX_INITIALIZER;
static pool_reader *readers; /* under readers_mu */
static size_t n_readers, cap_readers;
static _Atomic uint64_t last_generation; /* the last note's; 0 before the first */
static _Atomic uint64_t waits;           /* stream waits made for notes */
static _Atomic uint64_t put_off;         /* waits put off: the stream was capturing */

int tx_pool_readers_note(void *stream) {
  pthread_mutex_lock(&readers_mu);
  pool_reader *r = NULL;
  for (size_t i = 0; i < n_readers && !r; i++)
    if (readers[i].stream == stream)
      r = &readers[i];
  if (!r) {
    if (n_readers == cap_readers) {
      size_t cap = cap_readers ? 2 * cap_readers : 8;
      pool_reader *grown = tx_realloc(readers, cap * sizeof *grown);
      if (!grown) {
        pthread_mutex_unlock(&readers_mu);
        return -1;
      }
      readers = grown;
      cap_readers = cap;
    }
    r = &readers[n_readers++];
    r->stream = stream;
  }
  r->device = READER_DEVICE_UNASKED; /* asked at the next wait: a destroyed stream's handle may name another now */
  r->generation = atomic_fetch_add(&last_generation, 1) + 1;
  pthread_mutex_unlock(&readers_mu);
  return 1;
}

static void wait_for_callers_left(TreeObject *T, void *caller);

/* T's stream waits for the work so far of stream, a stream of device (-1
 * on the simulator, whose trees make no CUDA call and only count). 1
 * waited; 0 put off: stream captures, and an event recorded there would
 * join T's stream to that capture; -1 nothing to wait for: CUDA knows no
 * such stream (it was destroyed). */
static int wait_for_stream(TreeObject *T, void *stream, int device) {
  unsigned long long capture = tx_dev_capture_id(device, stream);
  if (capture == TX_CAPTURE_UNKNOWN)
    return -1;
  if (capture) {
    atomic_fetch_add(&put_off, 1);
    return 0;
  }
  if (!T->on_simulator)
    tx_dev_stream_after(T->stream, stream, device);
  atomic_fetch_add(&waits, 1);
  return 1;
}

uint64_t tx_pool_readers_generation(void) { return atomic_load(&last_generation); }

void tx_pool_readers_wait(TreeObject *T, void *caller) {
  if (T->n_caller_notes)
    wait_for_callers_left(T, caller);
  if (atomic_load(&last_generation) == T->readers_seen) {
    T->readers_step = T->step; /* this step's first launch is past: a note from now on is retired at the next */
    return;
  }
  pthread_mutex_lock(&readers_mu);
  uint64_t seen = atomic_load(&last_generation); /* lowered below for a note put off */
  for (size_t i = 0; i < n_readers; i++) {
    pool_reader *r = &readers[i];
    if (r->generation <= T->readers_seen)
      continue;
    if (r->stream == T->stream || r->stream == caller) /* ordered already: the tree's own, or waited for */
      continue;
    if (!T->on_simulator && r->device == READER_DEVICE_UNASKED) /* a simulator's stream is no stream of CUDA's */
      r->device = tx_dev_stream_device(r->stream);
    if (r->device >= 0 && r->device != T->device)
      continue;
    int device = T->on_simulator ? -1 : r->device >= 0 ? r->device : T->device;
    if (wait_for_stream(T, r->stream, device) == 0 && r->generation - 1 < seen)
      seen = r->generation - 1; /* put off: waited for at a later launch */
  }
  /* Waited for, the notes are retired only at a step's first launch: a
   * read queued on a noted stream after a launch of the output's own step
   * (which reuses none of its memory) must still be waited for where its
   * memory is reused, at the next step. Retired at any launch, the note
   * was spent by a launch of the same step, and the next step's replay
   * overwrote the output while a copy queued after it still read it (a
   * helper's audit). So a launch of the step after a note waits again,
   * and the step's end is the free PyTorch's record_stream speaks of. */
  if (T->readers_step != T->step) {
    T->readers_seen = seen;
    T->readers_step = T->step;
  }
  pthread_mutex_unlock(&readers_mu);
}

/* A stream a call of the tree came from and then left, with the step of
 * its last call there: the tree's launches wait for it until one of a
 * later step. */
struct tx_caller_note {
  void *stream;
  uint64_t step;
};

/* T's note of stream, made if it has none (the step is the caller's to
 * set); NULL out of host memory, with MemoryError set and nothing changed. */
static struct tx_caller_note *caller_note_of(TreeObject *T, void *stream) {
  for (size_t i = 0; i < T->n_caller_notes; i++)
    if (T->caller_notes[i].stream == stream)
      return &T->caller_notes[i];
  if (T->n_caller_notes == T->cap_caller_notes) {
    size_t cap = T->cap_caller_notes ? 2 * T->cap_caller_notes : 4;
    struct tx_caller_note *grown = tx_realloc(T->caller_notes, cap * sizeof *grown);
    if (!grown) {
      PyErr_NoMemory();
      return NULL;
    }
    T->caller_notes = grown;
    T->cap_caller_notes = cap;
  }
  struct tx_caller_note *note = &T->caller_notes[T->n_caller_notes++];
  note->stream = stream;
  note->step = 0;
  return note;
}

int tx_pool_readers_caller(TreeObject *T, void *caller) {
  if (T->called && caller != T->last_caller && tx_caller_needs_events(T, T->last_caller)) {
    struct tx_caller_note *note = caller_note_of(T, T->last_caller);
    if (!note)
      return -1; /* nothing changed: the next call notes it again */
    if (note->step < T->last_caller_step)
      note->step = T->last_caller_step;
  }
  T->last_caller = caller;
  T->last_caller_step = T->step;
  T->called = 1;
  return 0;
}

int tx_pool_readers_other_tree(TreeObject *owner, void *reader) {
  if (tx_reads_begin(owner) < 0) /* even on a stream CUDA orders with the owner's: the read may not be queued yet */
    return -1;
  if (!tx_caller_needs_events(owner, reader)) /* the owner's own stream, or one CUDA orders with it */
    return 0;
  struct tx_caller_note *note = caller_note_of(owner, reader);
  if (!note)
    return -1; /* the read stays in flight until the call returns, as any other: harmless */
  note->step = owner->step; /* the step of the output read: the owner's current one */
  return 0;
}

/* The callers' streams T's calls left: T's stream waits for each (but the
 * caller's own, waited for already), and a note whose step is over goes,
 * since no output of its step can be read from now on. One on a stream
 * that captures stays, to be waited for at a later launch. */
static void wait_for_callers_left(TreeObject *T, void *caller) {
  size_t kept = 0;
  for (size_t i = 0; i < T->n_caller_notes; i++) {
    struct tx_caller_note note = T->caller_notes[i];
    /* The caller's own is ordered already (the ev_in wait); one put off stays. */
    int waited = note.stream == caller || wait_for_stream(T, note.stream, T->on_simulator ? -1 : T->device) != 0;
    if (!(waited && note.step < T->step))
      T->caller_notes[kept++] = note;
  }
  T->n_caller_notes = kept;
}

void tx_pool_readers_forget_stream(TreeObject *T, void *stream) {
  size_t kept = 0;
  for (size_t i = 0; i < T->n_caller_notes; i++)
    if (T->caller_notes[i].stream != stream)
      T->caller_notes[kept++] = T->caller_notes[i];
  T->n_caller_notes = kept;
}

void tx_pool_readers_tree_free(TreeObject *T) {
  free(T->caller_notes);
  T->caller_notes = NULL;
  T->n_caller_notes = T->cap_caller_notes = 0;
}

void tx_pool_readers_figures(uint64_t *streams, uint64_t *waits_made, uint64_t *waits_put_off) {
  pthread_mutex_lock(&readers_mu);
  *streams = n_readers;
  pthread_mutex_unlock(&readers_mu);
  *waits_made = atomic_load(&waits);
  *waits_put_off = atomic_load(&put_off);
}
