"""Random graphs, recorded: the CUDA generator's seed and offset per launch.

A graph that draws random numbers (dropout in training, ``torch.rand``,
``multinomial`` sampling, SDPA with dropout) cannot simply be recorded: the
recording would bake in the seed and offset of the run it captured, and
every replay would repeat the same numbers. PyTorch's own CUDA graphs solve
this with the generator's graph-safe mode (``Note [CUDA Graph-safe RNG
states]`` in CUDAGeneratorImpl.h): while a capture is under way, the
kernels read seed and offset through pointers to two device tensors the
generator owns, and the capture counts the offsets its kernels consume; at
each replay, ``torch.cuda.CUDAGraph.replay`` first writes the generator's
current seed and offset into those tensors and advances the offset by that
count, exactly as the plain graph would have advanced it. Only
``torch.cuda.CUDAGraph`` can switch the generator into that mode.

So a random graph's recording is bracketed by an empty
``torch.cuda.CUDAGraph``: the launch function, when it finds the tree's
stream capturing, begins that graph's capture on a side stream (which puts
the default generator in capture mode), runs the Inductor graph on the
tree's stream (captured by cgtree, reading seed and offset through the
generator's pointers), and ends the empty capture (which learns the
offsets the recording consumes). The tree calls the segment's prelaunch
function right before each launch of a recording, its very first one
included (cgt_segment_set_prelaunch); there the empty graph's ``replay()``
writes seed and offset on the tree's stream and advances the generator,
and the recording launches right after. Warmups and eager runs call the
Inductor graph plainly and draw from the generator as Inductor does. The
result is Inductor's sequence, number for number, for the same
``torch.manual_seed``.

The order of the writes. Every random graph of a device, on every tree,
reads the one state of the device's generator, and the writes before each
launch must not overtake a launch already enqueued that still has to read
it. segment.c records an event after each run of a random segment and
makes every writer wait for it: the stream of a prelaunch's writes, and
the side stream before a launch function (beginning the empty capture
writes the seed and a zero offset there, eagerly). The writes of the
first launch of a recording wait for the side stream in turn. A lock in
segment.c keeps each run's wait, writes, launch and event together: the
prelaunch below lets other threads run (``replay()`` releases the GIL),
and another thread's writes between this run's and its launch would make
both launches draw the same numbers. Where the
caller's stream is the legacy default stream and the tree's stream is
blocking (the default), CUDA orders the two both ways, and the writes go
on the caller's stream: switching streams costs more than they do.

What this needs from PyTorch, all public: ``torch.cuda.CUDAGraph`` (with
``keep_graph``, so that the empty graph is instantiated at its first
replay, outside any capture), ``capture_begin``/``capture_end``/``replay``,
and the pluggable allocator's ``beginAllocateToPool``, which is a no-op for
an allocator that does not set it (cgtree's does not). One empty graph per
device stays registered with the generator for the process's life, so that
the generator's two device tensors are allocated once, eagerly, and never
inside a launch, where every allocation goes to the pool.

Activation checkpointing. AOTAutograd recomputes a checkpointed region's
random operators in the backward from the state they drew from in the
forward. Its graph-safe form (``graphsafe_run_with_rng_state``, its
default for CUDA) gives each such operator a pair of generators of its
own, passed as arguments of the forward and the backward graphs, and
swaps the default generator's state for theirs around the operator.
Such generators are registered with the empty graph too (PyTorch's
``CUDAGraph.register_generator_state``, as CUDAGraph Trees do with them),
so that a capture counts their offsets and each replay writes and
advances them as it does the default generator. A generator registered
with its first graph gets its two device tensors then: ``anchor_generators``
does that once per generator, on the graph's plain calls (its first call
among them), outside any launch, with an empty graph kept for the
process's life; it also keeps the generator alive, since segment.c keys
variants by its address. A capture that meets a generator its graph's
first call did not see raises, and the graph runs plainly from then on.

Limits. The generator's capture mode is one flag per generator: random
graphs are recorded one at a time per process (a lock), and an eager
random op on another thread while a random graph is being recorded fails
as it would under ``torch.cuda.graph``. Graphs that save or restore the
generator's state on the host (activation checkpointing's
``run_with_rng_state``, where AOTAutograd does not take its graph-safe
form: random operators on the CPU, or on several GPUs) stay plain. A
PyTorch whose generator keys its capture state by capture id (its main
branch at the time of writing) refuses the offset counting of a capture it
did not begin; the recording then raises, and the graph runs as the plain
Inductor graph from then on, with a warning.
"""
import threading
import warnings

import torch

_anchors = {}  # device index -> (side stream, empty CUDAGraph kept registered with the default generator)
_anchors_lock = threading.Lock()
_capture_lock = threading.Lock()  # the generator's capture mode is one flag


_anchored = {}  # id(generator) -> (generator, an empty CUDAGraph registered with it), for the process's life


def _empty_capture_begin(side, generators=()):
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(side):  # registering refuses a capturing current stream: the tree's may be one
        for gen in generators:
            g.register_generator_state(gen)
        g.capture_begin(capture_error_mode="relaxed")
    return g


def generators_of(inputs):
    return [x for x in inputs if isinstance(x, torch.Generator)]


def _anchored_already(gen):
    kept = _anchored.get(id(gen))
    return kept is not None and kept[0] is gen


def anchor_generators(inputs, device_index):
    """Registers each torch.Generator among inputs, once, with an empty graph
    kept for the process's life: its device-side seed and offset are
    allocated here, outside any launch (inside one, every allocation goes
    to the tree's pool, which reuses it), and the generator stays alive
    (segment.c keys variants by its address). Never call it inside a
    launch."""
    gens = [g for g in generators_of(inputs) if not _anchored_already(g)]
    if not gens:
        return
    with _anchors_lock, _real_tensors(), torch.cuda.device(device_index):
        for gen in gens:
            if not _anchored_already(gen):
                anchor = torch.cuda.CUDAGraph(keep_graph=True)
                anchor.register_generator_state(gen)
                _anchored[id(gen)] = (gen, anchor)


def anchoring(plain, device_index):
    """plain, anchoring the generators it is passed first (the Segment's
    plain calls: its first call, and every call once it runs plainly)."""
    def call(*inputs):
        anchor_generators(inputs, device_index)
        return plain(*inputs)

    return call


def _empty_capture_end(g, side):
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "The CUDA Graph is empty": it is meant to be
        g.capture_end()


def _real_tensors():
    """A context where tensor factories make real tensors even inside a
    compile (Dynamo and AOTAutograd trace under a fake tensor mode)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def side_stream(device_index):
    """The device's side stream for the empty captures. The first call (at
    compile time, outside any launch) also registers an empty graph with
    the default generator for good, so that the generator's device-side
    seed and offset exist before any recording needs them."""
    with _anchors_lock:
        if device_index not in _anchors:
            # Called from inside torch.compile, where a fake mode may be on:
            # the generator's tensors must be real.
            with _real_tensors(), torch.cuda.device(device_index):
                torch.cuda.synchronize()  # the anchor's capture writes the generator's tensors
                side = torch.cuda.Stream()
                anchor = _empty_capture_begin(side)
                _empty_capture_end(anchor, side)
                torch.cuda.synchronize()
            _anchors[device_index] = (side, anchor)
        return _anchors[device_index][0]


class RandomDraws:
    """One random graph's launch and prelaunch functions. ``brackets`` keeps,
    per variant, the empty graph of its latest recording: all recordings of
    a variant consume the same offsets (the same kernels)."""

    def __init__(self, device_index, tree_stream):
        self.side = side_stream(device_index)
        self.tree_stream = tree_stream  # () -> the calling thread's tree's torch stream
        self.brackets = {}
        self.recorded = threading.local()  # .bracket: the empty graph of this thread's capture just ended

    def run(self, plain, *inputs):
        """The graph's run inside its launch function (on the tree's
        stream): warmups and eager runs call it plainly; a capture is
        bracketed by an empty torch.cuda.CUDAGraph."""
        self.recorded.bracket = None
        if not torch.cuda.is_current_stream_capturing():
            return plain(*inputs)
        gens = generators_of(inputs)
        if not all(_anchored_already(g) for g in gens):
            raise RuntimeError("cgtree.torch: a random graph is passed a generator its first call did not see; "
                               "its device state cannot be allocated inside a recording")
        with _capture_lock:
            bracket = _empty_capture_begin(self.side, gens)
            try:
                out = plain(*inputs)
            finally:
                _empty_capture_end(bracket, self.side)
        self.recorded.bracket = bracket
        return out

    def prelaunch(self, variant, on_current=False):
        """Right before a launch of a recording: seed and offset written,
        the generator advanced by what the recording draws. on_current (from
        seg_launch.c): the caller's current stream is the legacy default
        stream and the tree's stream is blocking, so CUDA orders the two
        both ways and the writes go on the current stream, without the cost
        of switching streams (8 us; bench/rng_prelaunch_cost.py); else on
        the tree's. seg_launch.c has made that stream wait for every launch of
        a random graph enqueued so far, on any tree of the device."""
        bracket = getattr(self.recorded, "bracket", None)
        first = bracket is not None  # the first launch of the recording just made
        if first:
            self.recorded.bracket = None
            self.brackets[variant] = bracket
        else:
            bracket = self.brackets.get(variant)
            if bracket is None:
                raise RuntimeError("cgtree.torch: a random graph's recording of variant %d has no bracket" % variant)
        if on_current:
            if first:  # the capture's own writes, on the side stream, go first
                torch.cuda.current_stream().wait_stream(self.side)
            bracket.replay()
            return
        stream = self.tree_stream()
        if first:
            stream.wait_stream(self.side)
        with torch.cuda.stream(stream):
            bracket.replay()
