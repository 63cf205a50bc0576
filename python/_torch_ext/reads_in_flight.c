/* reads_in_flight.c — another thread's call that reads an output of a
 * tree's step: the step does not end under it.
 *
 * Each thread runs on trees of its own. A thread may hand an output to
 * another: y = enc(x) on thread A, dec(y) on thread B, on B's tree. Under
 * plain Inductor y's block is not reused while y lives; under cgtree A's
 * next step marks y (stale.c) and its launches write y's memory again.
 * pool_readers.c orders those launches after B's read on the streams:
 * B's look-up of y among the outputs of A's step notes the stream that
 * reads it, and A's launches wait for that stream's work so far. But the
 * look-up comes before the read, and B's call may let the GIL go in
 * between: a warmup, a recording and a plain graph run the graph's Python,
 * a random graph's replay takes its lock. Had A's step ended there, its
 * replay was queued before B's read, which took A's next output (a
 * recording's or a replay's copy reads y by address), or raised on the
 * mark where Inductor computes (a plain graph reads the tensor): seen on
 * an H200 (test_torch_trust.py) and on the simulator.
 *
 * So the look-up begins a read in flight (tx_reads_begin), which lasts
 * until the call returns (tx_reads_call_ends, in seg_vectorcall, however
 * the call returns), and a step's end first waits until no call of
 * another thread reads an output of the step (tx_reads_wait_for_calls),
 * the GIL let go. The wait ends with a look made holding the GIL: a read
 * can begin while the waiting thread asks for the GIL back (the reader
 * holds it then), and the step's end must see that one too (a review).
 * stale.c waits once more right before it takes the step's outputs: the
 * moves it makes first (the call's arguments, kept .grad tensors) run
 * Python, where a read may begin (a review). From that last look to the
 * marks no Python runs, since PyTorch's mark is a C function (the
 * simulator's runs Python; see below).
 *
 * A reader may also read y's pointer and run Python before its look-up
 * (a dynamic graph's span function, a property a TorchFunctionMode
 * serves), and A's step may end in between. The look-up goes by address:
 * it finds nothing there, or A's next output where A's replay put it, and
 * the reader read A's next output, silently, with or without a note (a
 * review). So before its look-up each tensor argument asks whether a
 * step's end began since its pointer was read (tx_reads_crossed: two
 * counters, moved around each end's moves, which set_ outputs elsewhere
 * and free their old storages, and around its take and marks; an end
 * under way when the pointer was read counts). If one did, the look-up
 * settles (tx_reads_settle): it waits, the GIL let go, until the ends
 * under way are over (they wait for nothing), reads the pointer again,
 * which raises StaleTensorError if the argument was a marked output or
 * gives its new place if a move set_ it elsewhere, looks it up and notes
 * its read; and a step's end waits for settling look-ups before its take
 * (the second wait), so a look-up that crossed the moves is noted before
 * the outputs are taken (a third review: counted before the moves ran, a
 * look-up that began during them saw no end and read A's next output).
 * That second read of the pointer may run Python too, and an end may
 * begin during it (one that had passed its first wait before the look-up
 * settled: a settle waits only for ends under way), so it is checked as
 * the first is: an end begun since the settle's last look sends the
 * argument back to a fresh read (a fifth review: A moved y during it, the
 * old address was looked up and found empty, and B read A's next output).
 * A STATIC pointer that PyTorch's one check vouched for before the loop
 * (no exchange API) counts as read at that check (a fourth review: an
 * end during an earlier argument's Python went unseen).
 * A settling look-up inside this thread's own end (a call made from its
 * mover's Python) waits for no end: it raises CgtreeError where another
 * thread's end is under way (a sixth review: read as it was, y moved
 * during the read and was read unnoted), and a step's end there waits for
 * nothing: it raises if it would. The check costs an atomic read per
 * tensor argument, and one more while several trees live; a settling
 * look-up waits for every end under way, which a stream of back-to-back
 * ends of several threads could in theory draw out (a review).
 *
 * A step's end refused inside another call raises out of that call's
 * graph; where the outer graph was warming up or recording, segment.c
 * passes the error on rather than run that graph plainly for good, since
 * the refusal came of another thread's timing, not of the graph (a
 * review).
 *
 * Who waits for whom. Only a thread's outermost call waits: a call made
 * inside another's Python (a compiled call from a custom op, say) may run
 * while its thread holds random_mu or captures, and the call it would wait
 * for may wait for those (a review: a hang). There a step's end that
 * finds such a read in flight raises CgtreeError instead: it cannot wait,
 * and ending the step would hand the reader new data. The outermost call
 * waits in its step's end, before its own look-ups, so a thread that waits
 * has no read in flight itself, and a thread with reads in flight never
 * waits: no thread waits for one that waits. A waited-for call may still
 * block on something the waiting thread was to do (a custom op that waits
 * on a queue that A fills after its next step): that hangs, where before
 * the fix it read the wrong data. docs/torch.md states it, and the hang
 * is not silent: a wait past a bound (10 s, set_read_wait_warning,
 * CGTREE_TORCH_READ_WAIT_WARN_SECONDS) warns once per wait, naming the reading
 * thread, and waits on; a warning filter that makes it an error ends the
 * wait there with that error, the step not ended.
 *
 * Entries are compared, never read: a tree freed while a read of it was in
 * flight costs at most a wait for that call, should another tree take its
 * address. Out of host memory a read cannot begin: the call raises
 * MemoryError before it read anything. The list holds no memory while
 * empty, so that path is any read's first entry (a test fails it).
 */
#include "ext.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct read_in_flight {
  const TreeObject *owner;
  const void *thread;   /* the reading thread's this_thread_reads */
  unsigned long ident; /* the reading thread's, as threading.get_ident() gives it (a long wait's warning names it) */
} read_in_flight;

static pthread_mutex_t flights_mu = PTHREAD_MUTEX_INITIALIZER; /* never held while the GIL is asked for */
static pthread_cond_t flights_ended = PTHREAD_COND_INITIALIZER;
static read_in_flight *flights; /* under flights_mu, in the order they began */
static size_t n_flights, cap_flights;
static _Atomic size_t flights_any;             /* n_flights, read without the lock */
static _Thread_local size_t this_thread_reads; /* this thread's entries among flights */
static _Thread_local unsigned this_thread_calls; /* compiled calls under way on this thread, nested ones too */
static _Thread_local uint64_t this_thread_refusals; /* steps' ends refused inside another call */
static _Thread_local unsigned this_thread_ending;   /* this thread's ends under way (between begin and end) */

static _Atomic uint64_t ends_begun, ends_done; /* steps' ends (moves, or take and marks) begun, and over */
static size_t lookups_settling; /* look-ups an end crossed, until they looked up again (under flights_mu) */
static _Atomic size_t settling_any;   /* lookups_settling, read without the lock */
static _Atomic uint64_t step_waits;            /* steps' ends that waited for a reader's call */
static _Atomic uint64_t rechecks;              /* look-ups a step's end crossed */
static _Atomic uint64_t warn_after_ms = 10000; /* a step's end that waited this long for a reader warns; 0: never */

size_t tx_reads_call_begins(void) {
  this_thread_calls++;
  return this_thread_reads;
}

void tx_reads_call_ends(size_t mark) {
  this_thread_calls--;
  if (this_thread_reads == mark)
    return;
  pthread_mutex_lock(&flights_mu);
  /* The newest of this thread's are the ending call's: an outer call's
   * began before them. */
  for (size_t i = n_flights; i-- > 0 && this_thread_reads > mark;)
    if (flights[i].thread == &this_thread_reads) {
      memmove(&flights[i], &flights[i + 1], (n_flights - i - 1) * sizeof *flights);
      n_flights--;
      this_thread_reads--;
    }
  if (!n_flights) { /* empty, it holds no memory: each read's first entry makes it, out of memory too */
    free(flights);
    flights = NULL;
    cap_flights = 0;
  }
  atomic_store(&flights_any, n_flights);
  pthread_cond_broadcast(&flights_ended);
  pthread_mutex_unlock(&flights_mu);
}

int tx_reads_begin(TreeObject *owner) {
  pthread_mutex_lock(&flights_mu);
  if (n_flights == cap_flights) {
    size_t cap = cap_flights ? 2 * cap_flights : 8;
    read_in_flight *grown = tx_realloc(flights, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&flights_mu);
      PyErr_NoMemory();
      return -1;
    }
    flights = grown;
    cap_flights = cap;
  }
  flights[n_flights++] = (read_in_flight){owner, &this_thread_reads, PyThread_get_thread_ident()};
  atomic_store(&flights_any, n_flights);
  this_thread_reads++;
  pthread_mutex_unlock(&flights_mu);
  return 0;
}

/* The first thread besides this one whose call reads an output of T, 0
 * if none (thread idents are never 0). Under flights_mu. */
static unsigned long reader_of(const TreeObject *T) {
  for (size_t i = 0; i < n_flights; i++)
    if (flights[i].owner == T && flights[i].thread != &this_thread_reads)
      return flights[i].ident;
  return 0;
}

static int read_by_another_thread(const TreeObject *T) { return reader_of(T) != 0; }

/* 1 if T's step's end must wait: a read of T's by another thread, or a
 * look-up an end crossed (it may be of T's, and will be noted soon). Under
 * flights_mu. */
static int must_wait(const TreeObject *T) { return lookups_settling || read_by_another_thread(T); }

/* A step's end has waited long for thread `reader`'s call: say so, since
 * that call may wait for this thread in turn (a hang). 0; -1 where the
 * program's warning filter made the warning an error. */
static int warn_long_wait(uint64_t ms, unsigned long reader) {
  char msg[640];
  snprintf(msg, sizeof msg,
           "cgtree.torch: this thread's step has waited %g s to end, for a compiled call of thread %lu "
           "(threading.get_ident()) that reads an output of the step: the next step's replay would overwrite what "
           "that call reads, so the step ends once it returned. If that call waits for something this thread is "
           "to do after this point, the program hangs here: clone the output before handing it to the other "
           "thread. (CGTREE_TORCH_READ_WAIT_WARN_SECONDS sets when this warning comes; 0: never.)",
           (double)ms / 1000.0, reader);
  return PyErr_WarnEx(PyExc_RuntimeWarning, msg, 1);
}

/* `ms` from now on flights_mu's condition's clock (CLOCK_REALTIME). */
static struct timespec deadline_after(uint64_t ms) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += (time_t)(ms / 1000);
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

int tx_reads_wait_for_calls(TreeObject *T) {
  int counted = 0, warned = 0;
  uint64_t warn_ms = atomic_load(&warn_after_ms);
  struct timespec deadline = {0};
  for (;;) { /* until a look made holding the GIL finds nothing: a read may begin while the GIL is asked back */
    if (!atomic_load(&flights_any) && !atomic_load(&settling_any))
      return 0;
    pthread_mutex_lock(&flights_mu);
    int reads = read_by_another_thread(T), settling = lookups_settling != 0;
    pthread_mutex_unlock(&flights_mu);
    if (!reads && !settling)
      return 0;
    /* A settling look-up waits only for ends under way, which wait for
     * nothing: waiting for it is safe in any call, but for one made inside
     * this thread's own end (a mover's Python), which it would wait for.
     * Waiting for a read is safe in a thread's outermost call only. */
    if ((reads && this_thread_calls > 1) || this_thread_ending) {
      this_thread_refusals++;
      PyErr_Format(TxError,
                   "cgtree.torch: a step of this thread's tree would end inside another compiled call (a "
                   "compiled call made from a graph's Python), while another thread's call still reads an output "
                   "of the step. It cannot wait there, and ending the step would let the next one overwrite what "
                   "that thread reads. End the step before (cgtree.torch.step_begin() outside the compiled "
                   "code), or clone the output before handing it to the other thread.");
      return -1;
    }
    if (!counted++) {
      atomic_fetch_add(&step_waits, 1);
      if (warn_ms)
        deadline = deadline_after(warn_ms);
    }
    unsigned long late_reader = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&flights_mu);
    while (reads ? must_wait(T) : lookups_settling != 0) {
      if (warned || !warn_ms) {
        pthread_cond_wait(&flights_ended, &flights_mu);
      } else if (pthread_cond_timedwait(&flights_ended, &flights_mu, &deadline) == ETIMEDOUT) {
        if ((late_reader = reader_of(T)) != 0) {
          warned = 1; /* once per wait: an end waits twice at most (before its moves, and after) */
          break;
        }
        /* A settling look-up alone (it waits for ends under way, which
         * end): the bound starts again, for a reader that may come (a
         * review: it was spent here, and a later reader's hang was silent). */
        deadline = deadline_after(warn_ms);
      }
    }
    pthread_mutex_unlock(&flights_mu); /* before the GIL is asked for: a reader ends its read holding it */
    Py_END_ALLOW_THREADS
    if (late_reader && warn_long_wait(warn_ms, late_reader) < 0) {
      this_thread_refusals++; /* the step did not end, for another thread's timing: no fault of the graph's */
      return -1;
    }
  }
}

uint64_t tx_reads_set_warn_after_ms(uint64_t ms) { return atomic_exchange(&warn_after_ms, ms); }

void tx_reads_outputs_change_begin(void) {
  this_thread_ending++;
  atomic_fetch_add(&ends_begun, 1);
}

void tx_reads_outputs_change_end(void) {
  atomic_fetch_add(&ends_done, 1);
  this_thread_ending--;
}

uint64_t tx_reads_refusals(void) { return this_thread_refusals; }

/* The ends done so far: one under way then (begun past done) counts as
 * crossing, since its take may come before the look-up (a review). */
uint64_t tx_reads_ends_seen(void) { return atomic_load(&ends_done); }

int tx_reads_crossed(uint64_t seen) { return atomic_load(&ends_begun) != seen; }

/* Steps' ends under way on other threads than this one (begun, not over,
 * less this thread's own). done is read first: begun, read after, is never
 * below it. */
static uint64_t others_ending(void) {
  uint64_t done = atomic_load(&ends_done);
  return atomic_load(&ends_begun) - done - this_thread_ending;
}

int tx_reads_settle(uint64_t *begun) {
  /* Inside this thread's own end (a call made from Python its moves
   * ran), waiting is out: that end is over only after this call returns,
   * and another thread's end under way may run such a call too, waiting
   * for this one. Read as it is, the pointer may be one another thread's
   * end is moving (a sixth review: y moved during the read, its old
   * address was looked up, found empty and read unnoted), so such a
   * look-up raises, as a step's end there does (tx_reads_wait_for_calls).
   * The GIL is held from this look to the snapshot below: no end begins
   * in between. */
  if (this_thread_ending && others_ending()) {
    this_thread_refusals++;
    PyErr_Format(TxError,
                 "cgtree.torch: a compiled call made inside this thread's step end (from Python its moves ran) "
                 "reads an output of another thread's step while that thread's step is ending; it cannot wait "
                 "there, and reading on could take the next step's data. Make the call outside the step's end, or "
                 "clone the output before handing it to this thread.");
    return -1;
  }
  pthread_mutex_lock(&flights_mu);
  lookups_settling++;
  atomic_store(&settling_any, lookups_settling);
  pthread_mutex_unlock(&flights_mu);
  atomic_fetch_add(&rechecks, 1);
  /* Other threads' ends under way (their moves run Python; the
   * simulator's marks too) are over before the pointer is read again. They
   * wait for nothing. (Inside this thread's own end there are none: it
   * would have raised above, and none began since, the GIL held.) */
  while (others_ending()) {
    Py_BEGIN_ALLOW_THREADS
    sched_yield();
    Py_END_ALLOW_THREADS
  }
  /* Read holding the GIL, which an end takes to begin: the ends begun
   * before the pointer is read again. An end that had passed its first
   * wait but not yet begun its moves (a drain's finaliser ran Python in
   * between) was not under way here, and may begin while that read runs
   * Python (a fifth review): the caller compares. */
  *begun = atomic_load(&ends_begun);
  return 0;
}

int tx_reads_begun_since(uint64_t begun) { return atomic_load(&ends_begun) != begun; }

void tx_reads_settled(void) {
  pthread_mutex_lock(&flights_mu);
  lookups_settling--;
  atomic_store(&settling_any, lookups_settling);
  pthread_cond_broadcast(&flights_ended);
  pthread_mutex_unlock(&flights_mu);
}

void tx_reads_figures(uint64_t *waits, uint64_t *rechecked) {
  *waits = atomic_load(&step_waits);
  *rechecked = atomic_load(&rechecks);
}
