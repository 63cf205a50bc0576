"""docs/torch.md, audited sentence by sentence against the code: each
promise here had no test that checks it (a test named beside it checked
something else, or none was named). Runs without a GPU: the simulator's
stand-ins of test_torch_ext_sim.py (imported, not copied), and
cgtree.torch imported without installing its allocator."""
import os
import re
import subprocess
import sys
import warnings

import pytest

X = pytest.importorskip("cgtree._torch_ext")

import test_torch_ext_sim as S  # noqa: E402 - its stand-ins, init_hot_path included
from test_torch_ext_sim import (  # noqa: E402
    ARG_INT, FakeTensor, Graph, call, eager_alloc, eager_figures, eager_free, k_affine, marks, replaying, segment)

tree = S.tree  # the simulator file's fixture: a tree on the simulator, checked after the test

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "torch.md")
needs_doc = pytest.mark.skipif(not os.path.exists(DOC), reason="docs/ is not beside the tests (installed elsewhere)")
S1 = S.S1


def cgtree_torch():
    """cgtree.torch, never installing its allocator here (on a GPU machine it
    would take the hot path over from the simulator's stand-ins)."""
    pytest.importorskip("torch")
    before = os.environ.get("CGTREE_TORCH_NO_INSTALL")
    os.environ["CGTREE_TORCH_NO_INSTALL"] = "1"
    try:
        import cgtree.torch as ct
    finally:  # the tests after this file see the environment they had
        if before is None:
            del os.environ["CGTREE_TORCH_NO_INSTALL"]
        else:
            os.environ["CGTREE_TORCH_NO_INSTALL"] = before
    return ct


def fresh_python(code, **env):
    """code's stdout in a fresh interpreter of this one, with env set (and
    cgtree.torch never installing), on this process's import path. Skips
    the test where torch is not installed (cgtree.torch needs it)."""
    pytest.importorskip("torch")
    e = dict(os.environ, CGTREE_TORCH_NO_INSTALL="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for k in ("CGTREE_TORCH_FRONT_CACHE_BYTES", "CGTREE_TORCH_CACHE_BYTES", "CGTREE_TORCH_MAX_GRAPHS"):
        e.pop(k, None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    return r


# ---- counters: every key the docs tell a reader to look at is reported ----

# Keys the prose names without the stats()["..."] form ("`stats()` counts
# `evictions`, `graphs` and `updates`", "`trees` counts the trees alive and
# `trees_freed` those freed", "`outputs_tied` counts the others", ...).
STATS_KEYS_IN_PROSE = ("evictions", "graphs", "updates", "trees", "trees_freed", "outputs_tied", "outputs_tied_apart",
                       "gradients_moved", "gradient_leaves", "outputs_overwritable", "inference_outputs_watched",
                       "forward_outputs_watched", "graphs_plain", "arguments_moved", "steps_kept_after_backward",
                       "optimizer_steps_forced", "steps_forced", "steps_held_for_inference_outputs",
                       "saved_tied_to_outputs_alive", "outputs_viewing_values", "record_stream_hook",
                       "torch_out_of_memory_error")


@needs_doc
def test_every_key_of_stats_and_memory_stats_the_docs_name_is_a_key_they_report():
    """A reader told to read stats()["x"] or memory_stats()["x"] must find
    it: a key renamed in the code and not in the docs fails here (a
    KeyError in the reader's program otherwise)."""
    ct = cgtree_torch()
    doc = open(DOC).read()
    stats, mem = ct.stats(), ct.memory_stats(0)
    named_stats = set(re.findall(r'(?<!memory_)stats\(\)\["([a-z_.]+)"\]', doc)) | set(STATS_KEYS_IN_PROSE)
    named_mem = set(re.findall(r'memory_stats\(\)\["([a-z_.]+)"\]', doc))
    start = doc.index("`cgtree.torch.memory_stats(device=None)`:")
    listed = re.findall(r"`([a-z_][a-z0-9_.]*)`", doc[start:doc.index("`reset_peak()`", start)])
    # what the list names that is no key: PyTorch's functions it compares with, the method
    # record_stream, and "read `reserved_bytes`" (the reserved_bytes.all.* keys)
    listed = [k for k in listed if not k.startswith("torch.") and k not in ("record_stream", "reserved_bytes")]
    assert len(listed) >= 30, listed  # the parse found the list
    named_mem |= set(listed) | {"reserved_bytes.all.current", "reserved_bytes.all.peak",
                                "allocated_bytes.all.current", "allocated_bytes.all.peak"}
    assert sorted(named_stats - set(stats)) == []
    assert sorted(named_mem - set(mem)) == []
    for k in named_stats:
        assert isinstance(stats[k], int), k
    for k in named_mem:
        assert isinstance(mem[k], int), k


def test_peak_bytes_is_allocated_bytes_peak_and_the_bound_is_the_sum_of_the_two_peaks():
    """docs/torch.md and memory_stats' docstring: peak_bytes (=
    allocated_bytes.all.peak), peak_bytes_bound = eager_peak + pool_peak,
    and allocated_bytes.all.current counts outside the pool and in it."""
    ct = cgtree_torch()
    p = eager_alloc(1000, S1)
    try:
        m = ct.memory_stats(0)
        assert m["peak_bytes"] == m["allocated_bytes.all.peak"]
        assert m["peak_bytes_bound"] == m["eager_peak"] + m["pool_peak"]
        assert m["allocated_bytes.all.current"] == m["eager_in_use"] + m["pool_in_use"]
    finally:
        eager_free(p, 1000, S1)


# ---- stale outputs: the error's class and message ----

def test_the_mark_on_a_stale_output_begins_with_the_error_class_and_says_to_clone(tree):
    """"raises a RuntimeError whose message begins with
    cgtree.torch.StaleTensorError and says how to keep an output (clone
    it)": begins, not merely contains (a program may match on the start)."""
    seg, x = replaying(tree)
    (y1,) = call(seg, x)
    n = len(marks)
    (y2,) = call(seg, x)
    assert len(marks) == n + 1
    msg = marks[-1][1]
    assert msg.startswith("cgtree.torch.StaleTensorError"), msg
    assert "clone" in msg
    with pytest.raises(RuntimeError) as e:
        y1.values()
    assert str(e.value).startswith("cgtree.torch.StaleTensorError")
    del y2


def test_a_stale_output_passed_to_a_compiled_call_raises_cgtree_torchs_own_class_a_runtime_error(tree):
    """"an output of a step before the one the call ends ... passed to a
    compiled call: cgtree.torch.StaleTensorError (a RuntimeError)": the
    class the segment raises is the one cgtree.torch exports (a program's
    `except cgtree.torch.StaleTensorError` catches it), a CgtreeError and a
    RuntimeError."""
    ct = cgtree_torch()
    assert ct.StaleTensorError is X.StaleTensorError and ct.CgtreeError is X.CgtreeError
    assert issubclass(ct.StaleTensorError, ct.CgtreeError) and issubclass(ct.StaleTensorError, RuntimeError)
    seg, x = replaying(tree)
    (y1,) = call(seg, x)
    keep = y1.view()
    (y2,) = call(seg, x)
    (y3,) = call(seg, x)  # y1's step is the one before the step this call ends
    with pytest.raises(ct.StaleTensorError):
        call(seg, keep)
    del y2, y3


# ---- the front cache: the key is the size rounded up to 512 bytes ----

def test_an_allocation_of_another_size_in_the_freed_blocks_512_byte_class_takes_it_back():
    """"a free list per (device, stream, size rounded up to 512 bytes), and
    the next allocation with the same key takes it back with no CUDA call":
    600 and 1000 bytes are one class (1024), and the block the 600-byte
    request got holds 1000 bytes (it was allocated at its class); 1025 is
    the next class."""
    X.empty_cache(-1)
    p = eager_alloc(600, S1)
    eager_free(p, 600, S1)
    f0 = eager_figures()
    q = eager_alloc(1000, S1)
    f1 = eager_figures()
    assert q == p
    assert f1["front_cache_hits"] - f0["front_cache_hits"] == 1
    assert f1["driver_allocations"] == f0["driver_allocations"]
    S.ctypes.memset(q, 0x5A, 1000)  # the whole request is the block's (the sanitizers would see an overrun)
    eager_free(q, 1000, S1)
    f2 = eager_figures()
    r = eager_alloc(1025, S1)  # 1536: another class, from the driver
    f3 = eager_figures()
    assert r != p and f3["driver_allocations"] - f2["driver_allocations"] == 1
    eager_free(r, 1025, S1)
    X.empty_cache(-1)


def test_the_front_cache_bound_is_256_mib_a_device_by_default():
    """"at most CGTREE_TORCH_FRONT_CACHE_BYTES per device (default 256
    MiB)", in a process where the variable is unset, before and after
    cgtree.torch's reading of the environment."""
    r = fresh_python("import cgtree._torch_ext as X, cgtree.torch._install as I\n"
                     "a = X.alloc_figures(-1)['front_cache_limit']\n"
                     "I.apply_env_bytes()\n"
                     "print(a, X.alloc_figures(-1)['front_cache_limit'])")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(256 << 20)] * 2


# ---- the recording budget ----

def test_cgtree_torch_max_graphs_from_the_environment_is_the_budget_of_the_trees_made_later():
    """"cgtree.torch.set_budget(max_graphs=..., max_graph_bytes=...) (or
    CGTREE_TORCH_MAX_GRAPHS)": the variable is the max_graphs the trees are
    made with (the keywords _install passes to the tree), as set_budget's
    is; set_budget refuses what is no count."""
    code = ("import cgtree.torch as ct, cgtree.torch._install as I\n"
            "print(I._budget['max_graphs'], I._budget['max_graph_bytes'])\n"
            "ct.set_budget(max_graphs=7)\n"
            "print(I._budget['max_graphs'])\n"
            "for bad in (-1, 1.5, 'x'):\n"
            "    try:\n"
            "        ct.set_budget(max_graphs=bad)\n"
            "    except ValueError:\n"
            "        print('refused')\n")
    r = fresh_python(code, CGTREE_TORCH_MAX_GRAPHS="5")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["5", "0", "7", "refused", "refused", "refused"]
    r = fresh_python(code)
    assert r.stdout.split()[:2] == ["0", "0"]


def test_the_first_eviction_warns_once_naming_the_graph_and_how_many_shapes_or_variants_it_has():
    """"The first eviction warns once, naming the graph and how many shapes
    or variants it has" (the test named beside it checks that a warning
    comes, not once, not what it names)."""
    t = X.Tree(0, backend="sim", max_graphs=2)
    g = Graph(t, 1.0, 0.0)

    def scaled(x, k):
        (y,) = g(x)
        X.sim_launch(t.stream, k_affine, y.ptr, y.ptr, y.n, float(k), 0.0)
        return (y,)

    seg = segment(t, scaled, kinds=(S.ARG_TENSOR, ARG_INT), spans=(16, 0), name="grows_past_budget")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(40):
            k = 1 + i % 5
            (y,) = call(seg, x, k)
            assert y.values() == [k * v for v in [1, 2, 3, 4]]
    evicting = [str(w.message) for w in seen if "budget is evicting" in str(w.message)]
    assert t.stats()["evictions"] > 1
    assert len(evicting) == 1, evicting
    m = re.search(r"graph '([^']*)', which has (\d+) shapes or variants", evicting[0])
    assert m and m.group(1) == "grows_past_budget", evicting[0]
    assert 3 <= int(m.group(2)) <= 5
    t.check()


# ---- the backend's name ----

def test_import_cgtree_torch_registers_the_backend_name_cgtree_from_a_source_tree():
    """"backend="cgtree" is registered through the torch_dynamo_backends
    entry point of the installed package, and by import cgtree.torch
    itself when the package runs from a source tree; backend=
    cgtree.torch.backend works too": either way, after the import Dynamo
    looks the name up to cgtree.torch.backend (a package that is installed
    names it through its entry point, which Dynamo loads, and the import
    must not register it a second time: Dynamo refuses a name twice)."""
    pytest.importorskip("torch")
    r = fresh_python("import cgtree.torch as ct, torch._dynamo as D\n"
                     "print(D.lookup_backend('cgtree') is ct.backend, 'cgtree' in D.list_backends(exclude_tags=()))\n"
                     "import importlib; importlib.reload(ct)\n"  # a second import's registration is no error
                     "print(D.lookup_backend('cgtree') is ct.backend)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "True"]


def test_a_number_variable_that_holds_no_number_is_refused_at_import_naming_it():
    """docs/api.md, Environment: "A cgtree.torch variable that takes a
    number and holds something else (a word, a negative number) raises
    cgtree.torch.CgtreeError naming the variable where it is read:
    CGTREE_TORCH_MAX_GRAPHS at import". A bare int() let "lots" fail the
    import with int()'s own ValueError, and "-3" reach every tree as the C
    library's CGT_ERR_INVALID_ARGUMENT at the first compiled call; an empty
    value is unset (no budget)."""
    for bad in ("lots", "-3", "1.5", str((1 << 24) + 1)):
        r = fresh_python("import cgtree.torch\n", CGTREE_TORCH_MAX_GRAPHS=bad)
        assert r.returncode != 0, (bad, r.stdout)
        last = r.stderr.strip().splitlines()[-1]
        assert "CgtreeError" in last and "CGTREE_TORCH_MAX_GRAPHS" in last and repr(bad) in last, (bad, last)
    for good, budget in (("", 0), ("7", 7), (str(1 << 24), 1 << 24)):
        r = fresh_python("import cgtree.torch as ct\nprint(ct._install._budget['max_graphs'])\n",
                         CGTREE_TORCH_MAX_GRAPHS=good)
        assert r.returncode == 0 and r.stdout.split() == [str(budget)], (good, r.stdout, r.stderr[-300:])
