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
 * This file is the call itself (seg_vectorcall, seg_call: the argument
 * loop, the step, cgt_run, the result) and the Python type. What a call
 * needs besides is in the files segment.h lists: the output tensors and
 * their templates (seg_outputs.c), the launch function cgtree calls to warm
 * up or record (seg_launch.c), a segment's state in each tree and the
 * variant's key (seg_runs.c), the holds that arguments and backwards put
 * on the step (seg_holds.c), which step a call belongs to in training
 * (seg_steps.c), and the calls that run as the plain graph (seg_plain.c).
 */
#include "segment.h"

#include <stdlib.h>
#include <string.h>

static PyObject *seg_call(SegmentObject *s, PyObject *const *args, size_t n, PyObject *kwnames, uint64_t t0);

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
  seg_run *memo_outer = seg_memo_pending; /* a call the Python of an outer call made */
  seg_memo_pending = NULL;
  PyObject *res;
  if (n == 1 && !kwnames && PyList_CheckExact(args[0])) {
    PyObject *list = Py_NewRef(args[0]); /* nobody changes it while we run: the caller waits for us */
    res = seg_call(s, PySequence_Fast_ITEMS(list), (size_t)PyList_GET_SIZE(list), NULL, t0);
    Py_DECREF(list);
  } else {
    res = seg_call(s, args, n, kwnames, t0);
  }
  tx_reads_call_ends(reads); /* queued by now, or never to be: their owners' steps may end */
  if (seg_memo_pending) { /* the call read a kept .grad: it is its segment's last call that ran, or it failed */
    if (res)
      tx_read_memo_commit(&seg_memo_pending->memo);
    else
      tx_read_memo_drop(&seg_memo_pending->memo);
  }
  seg_memo_pending = memo_outer;
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
    return seg_call_bypassed(s, args, n, kwnames);
  if (kwnames || n != s->n_args) {
    PyErr_Format(PyExc_TypeError, "cgtree.torch: graph '%s' takes %u positional arguments, got %zd%s", s->name,
                 s->n_args, n, kwnames ? " and keywords" : "");
    return NULL;
  }
  void *caller; /* the caller's stream: tx_caller_needs_events says when it needs events */
  seg_run *r = seg_run_in_step(s, args, n, &caller);
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
   * check of PyTorch's may vouch for the STATIC ones (seg_static_ptrs_unchanged). */
  int fast = TXE.ptrs;
  uint64_t statics_seen = tx_reads_ends_seen(); /* before PyTorch's check vouches for the STATIC pointers */
  int statics_same = !fast && seg_static_ptrs_unchanged(r, args, n), statics_noted = 1;
  int writes_side_value = 0;
  uint64_t side_values = 0; /* the tensor arguments k < 63 that are side-pool VALUEs; bit 63: one at 63 or past */
  uint64_t other_values = 0; /* the same, for outputs of another tree's step (another thread's) */
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
          return seg_arg_unreadable(s, T, i);
        int on = seg_on_device_slow(o, T->device);
        if (on < 0)
          return NULL;
        if (!on)
          dev.device_type = kDLCPU; /* anywhere but the tree's device */
        /* A segment's first call reads each input both ways: the exchange
         * API is trusted only where it agreed with data_ptr() (exchange.c). */
        if (fast && !s->outputs_known && tx_exchange_cross_check(o, ptr) < 0)
          return NULL;
        if (kind == ARG_TENSOR_STATIC && s->static_idx && !fast)
          statics_noted &= seg_static_ptr_note(r, i, ptr);
      }
      if (dev.device_type != kDLCUDA || dev.device_id != T->device)
        return seg_call_off_device(s, T, caller, args, n, i);
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
      } else if (ptr && (ref = seg_step_output_holding(T, o, ptr, span)) != NULL) {
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
      } else if (span == 0 && PyErr_Occurred()) { /* seg_step_output_holding could not read the storage */
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
          if (seg_arg_data_ptr(s, o, &again) < 0) {
            tx_reads_settled();
            return seg_arg_unreadable(s, T, i);
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
        if (other)
          other_values |= 1ull << (k < 63 ? k : 63);
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
    seg_backward_read(s, T, r->read[j]);
  if (!statics_same && s->static_idx)
    r->static_known = statics_noted && !fast; /* every STATIC pointer was read, and noted, just now */
  variant &= seg_variant_mask;
  variant_tmpl *known = s->outputs_known ? seg_tmpl_find(s, variant) : NULL;
  if (known && !seg_key_is(known, r))
    return seg_call_colliding(s, r, args, n);
  if (s->outputs_known && (writes_side_value || (known && seg_views_as_other_dtype(known, side_values))))
    return seg_call_plain_over_side_value(s, r, args, n);
  if (other_values && seg_may_view_as_other_dtype(s, known, other_values))
    return seg_call_plain_over_other_trees_output(s, r, args, n);
  uint64_t t_args = clock_if(timed);
  if (!s->outputs_known) { /* runs on the caller's stream: wait for the tree's outputs */
    if (tx_caller_needs_events(T, caller))
      tx_stream_wait(caller, T->stream, T->ev_out);
    PyObject *plain = seg_first_call(s, r, caller, args, n, variant);
    if (!plain)
      return NULL;
    int keeps_plain = !s->outputs_known || s->bypass_reason;
    /* The template this call just made may say it returns a view, as
     * another dtype, of another tree's output: its plain outputs stand, as
     * at a later call of it (seg_call_plain_over_other_trees_output), not the
     * tree's rerun (a helper's review: rerun, a STATIC argument's view read
     * the other tree's next outputs). */
    if (!keeps_plain && other_values && seg_may_view_as_other_dtype(s, seg_tmpl_find(s, variant), other_values)) {
      seg_warn_view_of_other_tree(s);
      keeps_plain = 1;
    }
    if (!keeps_plain && seg_run_register(r) < 0)
      return seg_ran_then_failed(s, plain); /* registered at a later call (below) */
    if (keeps_plain || !s->rerun_first) { /* the caller gets the plain outputs */
      seg_plain_saved_hold_step(s, T, plain);
      return plain;
    }
    Py_DECREF(plain); /* its outputs die now: the run below makes them again, in the pool */
    tx_out_ref_queue_drain();
  } else if (!r->registered && seg_run_register(r) < 0) { /* a tree of another thread ran it first */
    return NULL;
  }
  if (tx_caller_needs_events(T, caller))
    tx_stream_wait(T->stream, caller, T->ev_in);
  tx_pool_readers_wait(T, caller); /* streams record_stream named for outputs, callers' left (pool_readers.c) */

  r->cur = args;
  r->cur_variant = variant;
  r->want_bypass = 0;
  seg_clear_exception(r); /* a capture that failed and then ran eagerly may have left one */
  uint64_t t1 = clock_if(timed);
  if (s->prelaunch_py) {
    if (T->ev_out && !seg_random_done_event(T->device))
      return NULL;
    /* The generator's writes go on the caller's stream where CUDA orders it
     * with the tree's both ways (the legacy default stream and a blocking
     * tree), else on the tree's stream (_rng.py, RandomDraws.prelaunch). */
    r->fill_stream = caller == NULL && T->blocking ? NULL : T->stream;
  }
  uint64_t refusals = tx_alloc_refusals(), step_refusals = tx_reads_refusals();
  if (s->prelaunch_py && seg_random_lock() < 0)
    return NULL;
  tx_alloc_run_enter(); /* a capture may run until cgt_run returns: eager frees wait (alloc.c) */
  T->in_run++;
  cgt_status st = cgt_run(T->tree, r->seg, variant, r->args, s->n_targs, r->outs, s->n_outputs);
  T->in_run--;
  tx_alloc_run_leave();
  if (s->prelaunch_py) { /* every read of the generator's state enqueued so far comes before this */
    tx_event_record(seg_random_event(T), T->stream);
    seg_random_unlock();
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
      seg_clear_exception(r);
      seg_go_plain(s, why);
      return seg_call_plain_in_step(s, T, caller, args, n);
    }
    if (r->want_bypass || st == CGT_ERR_SEGMENT_FAILED) {
      char why[512];
      snprintf(why, sizeof why, "%s (%s)", cgt_status_name(st), cgt_tree_last_error(T->tree));
      seg_go_plain(s, why);
      return seg_call_plain_in_step(s, T, caller, args, n);
    }
    if (st == CGT_ERR_STALE_VALUE) {
      T->stale_refused++;
      PyErr_Format(TxStaleError, "cgtree.torch: graph '%s': %s", s->name, cgt_tree_last_error(T->tree));
      return NULL;
    }
    return tx_status_error(T, st, "cgt_run");
  }
  seg_clear_exception(r);
  if (capture_failed) {
    /* The graph cannot be captured (a host sync such as torch.cond's device
     * predicate, a call CUDA refuses under capture): cgtree ran it eagerly
     * this once, correctly. From now on it runs as the plain Inductor graph,
     * at Inductor's speed, rather than as an eager node of the tree. */
    char why[512];
    snprintf(why, sizeof why, "its capture failed (%s)", cgt_tree_last_error(T->tree));
    seg_go_plain(s, why);
  } else {
    r->eager_calls_mask = r->eager_calls_mask << 1 | (uint32_t)(r->outs_side_pool != 0);
    if (r->outs_side_pool && __builtin_popcount(r->eager_calls_mask) == EAGER_RUNS_PLAIN) {
      char why[256];
      snprintf(why, sizeof why, "the tree ran it eagerly in %u of its last 32 calls (its node is past the rerecord "
               "limit: a buffer it writes in place, or another static input, comes at a new address at each call)",
               (unsigned)EAGER_RUNS_PLAIN);
      seg_go_plain(s, why);
    }
  }
  if (tx_caller_needs_events(T, caller))
    tx_stream_wait(caller, T->stream, T->ev_out);
  variant_tmpl *t = seg_tmpl_find(s, variant);
  if (!t) {
    for (uint32_t j = 0; j < s->n_outputs; j++)
      (void)cgt_value_release(T->tree, r->outs[j]);
    PyErr_Format(TxError, "cgtree.torch: graph '%s' has no output template for variant %llu", s->name,
                 (unsigned long long)variant);
    return NULL;
  }
  uint64_t t3 = clock_if(timed);
  r->ns_made = 0;
  PyObject *result = seg_build_result(r, args, t);
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
  if (plain_reason != Py_None) /* plain from the start: its calls still mark steps (seg_call_bypassed) */
    KEEP(bypass_reason, plain_reason);
#undef KEEP
  s->vectorcall = seg_vectorcall;
  return 0;
}

static void seg_dealloc(SegmentObject *s) {
  /* A registered segment is never freed: the tree holds a reference,
   * because cgtree has no unregister and may call its launch function. */
  for (size_t i = 0; i < s->n_tmpls; i++) {
    seg_tmpl_clear(s->tmpls[i]);
    free(s->tmpls[i]);
  }
  free(s->tmpls);
  free(s->tmpl_index);
  free(s->arg_kind);
  free(s->arg_span);
  free(s->grad_pos);
  free(s->arg_written);
  Py_XDECREF(s->static_idx);
  for (size_t i = 0; i < s->n_runs; i++) { /* only runs never registered: a registered one holds s */
    seg_run *r = s->runs[i];
    seg_tree_run_forget(r->tree, r);
    seg_run_free(r);
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
