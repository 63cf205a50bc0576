"""Segments recorded and replayed from Python on the simulator."""
import gc

import numpy as np
import pytest

import cgtree
from conftest import Counter, add_segment, f32, scale_segment


def test_a_segment_warms_up_records_then_replays_reading_inputs_at_replay_time(tree):
    calls = Counter()
    seg = scale_segment(tree, 3.0, counter=calls)
    a = np.zeros(64, np.float32)
    x = cgtree.static(a)
    for step in range(6):
        tree.step_begin()
        a[:] = step
        (y,) = tree.run(seg, (x,))
        np.testing.assert_array_equal(y.view(np.float32), np.full(64, 3.0 * step, np.float32))
        tree.check()
    s = tree.stats()
    assert (s["warmups"], s["recordings"], s["replays"]) == (1, 1, 4)
    assert calls.calls == 2  # warmup and recording; never for a replay
    assert tree.nodes()[0]["state"] == "RECORDED"


def test_values_flow_from_one_segment_into_the_next(tree):
    scale = scale_segment(tree, 2.0)
    add = add_segment(tree)
    a = np.arange(16, dtype=np.float32)
    x = cgtree.static(a)
    for step in range(4):
        tree.step_begin()
        a[:] = np.arange(16) + step
        (y,) = tree.run(scale, (x,))
        (z,) = tree.run(add, (y, x))
        y.release()
        np.testing.assert_array_equal(z.view("float32"), 3 * a)
    assert tree.stats()["replays"] == 4
    assert [n["segment_name"] for n in tree.nodes()] == ["scale", "add"]


def test_a_dynamic_argument_at_a_new_address_every_step_replays_with_a_copy(tree):
    seg = scale_segment(tree, 2.0)
    for step in range(5):
        tree.step_begin()
        a = np.full(32, step, np.float32)  # a fresh array each step
        (y,) = tree.run(seg, (cgtree.dynamic(a),))
        np.testing.assert_array_equal(y.view(np.float32), 2 * a)
    s = tree.stats()
    assert s["replays"] == 3 and s["nodes"] == 1 and s["input_copies"] >= 3


def test_a_pointer_pair_is_caller_memory_like_an_array(tree):
    seg = scale_segment(tree, 4.0)
    a = np.ones(8, np.float32)
    (y,) = tree.run(seg, (cgtree.static((a.ctypes.data, a.nbytes)),))
    np.testing.assert_array_equal(y.view(np.float32), 4 * a)


def test_variants_are_different_nodes(tree):
    seg = scale_segment(tree)
    x = cgtree.static(np.ones(8, np.float32))
    for _ in range(3):
        tree.step_begin()
        tree.run(seg, (x,), variant=1)
        tree.step_begin()
        tree.run(seg, [x], 2)
    variants = sorted(n["variant"] for n in tree.nodes())
    assert variants == [1, 2]


def test_python_kernels_stay_alive_for_every_replay_after_their_launch_function_dropped_them(tree):
    def launch(l):
        src, nbytes = l.input(0)
        out = l.alloc(nbytes)
        n = nbytes // 4

        def kernel(payload):  # a closure and an object only the graph references
            f32(out, n)[:] = f32(src, n) + payload[0]

        cgtree.sim_launch(l.stream, kernel, [7.0])
        l.set_output(0, out, nbytes)

    seg = tree.segment("closure", launch, 1, 1)
    a = np.zeros(16, np.float32)
    x = cgtree.static(a)
    for step in range(2):
        tree.step_begin()
        tree.run(seg, (x,))
    gc.collect()
    for step in range(3):
        tree.step_begin()
        a[:] = step
        (y,) = tree.run(seg, (x,))
        np.testing.assert_array_equal(y.view(np.float32), a + 7)
    assert tree.stats()["replays"] == 3


@pytest.mark.parametrize("mode", ["tree", "eager", "separate"])
def test_every_mode_computes_the_same_outputs(mode):
    t = cgtree.Tree(backend="sim", mode=mode)
    assert t.mode == mode
    scale = scale_segment(t, 2.0)
    add = add_segment(t)
    a = np.arange(8, dtype=np.float32)
    x = cgtree.static(a)
    for step in range(4):
        t.step_begin()
        a[:] = step
        (y,) = t.run(scale, (x,))
        (z,) = t.run(add, (y, y))
        np.testing.assert_array_equal(z.view(np.float32), 4 * a)
    s = t.stats()
    assert (s["replays"] > 0) == (mode != "eager")
    t.check()


def test_segment_flags_reach_the_registration(tree):
    seg = tree.segment("host_side", lambda l: None, 1, 1, flags=cgtree.SEGMENT_NO_CAPTURE)
    assert tree.segments[seg - 1]["flags"] == cgtree.SEGMENT_NO_CAPTURE == 1


def test_options_reach_the_tree():
    t = cgtree.Tree(backend="sim", warmup_runs=0, rerecord_limit=4, pool_chunk_bytes=1 << 16,
                    pool_limit_bytes=1 << 20, defer_launch=True)
    seg = scale_segment(t)
    x = cgtree.static(np.ones(4, np.float32))
    t.run(seg, (x,))
    assert t.stats()["recordings"] == 1  # warmup_runs=0 records at once
    t.step_begin()
    (y,) = t.run(seg, (x,))
    t.flush()
    t.sync()
    np.testing.assert_array_equal(y.view(np.float32), 2 * np.ones(4))
    assert t.stats()["pool_reserved_bytes"] == 1 << 16
    assert t.backend == "sim" and isinstance(t.stream, int) and t.stream != 0
    assert "segments=1" in repr(t)


def test_auto_backend_is_the_simulator_without_a_gpu():
    t = cgtree.Tree()
    assert t.backend == ("cuda" if cgtree.cuda_available() else "sim")


def test_stats_nodes_and_dot_describe_the_tree(tree):
    seg = scale_segment(tree, name="my_scale")
    x = cgtree.static(np.ones(4, np.float32))
    for _ in range(3):
        tree.step_begin()
        tree.run(seg, (x,))
    s = tree.stats()
    assert s["runs"] == 3 and s["nodes"] == 1 and s["host_allocs"] >= 0
    (n,) = tree.nodes()
    assert n["id"] == 1 and n["parent"] == 0 and n["depth"] == 0 and n["segment"] == seg
    assert n["replays"] == 1 and n["reason"] is None
    dot = tree.dot()
    assert dot.startswith("digraph") and "my_scale" in dot
    assert tree.segments == [{"id": seg, "name": "my_scale", "n_inputs": 1, "n_outputs": 1, "flags": 0}]


def test_a_closed_tree_refuses_every_call_and_its_values_are_stale_to_it():
    t = cgtree.Tree(backend="sim")
    seg = scale_segment(t)
    (y,) = t.run(seg, (cgtree.static(np.ones(4, np.float32)),))
    with t:
        pass  # __exit__ closes
    assert t.closed
    with pytest.raises(cgtree.StateError):
        t.run(seg, ())
    with pytest.raises(cgtree.StateError):
        y.ptr
    t.close()  # twice is fine


def test_the_demo_runs_and_checks_every_step_on_the_simulator(capsys):
    from cgtree.demo import demo

    assert demo("sim", 12) == 0
    out = capsys.readouterr().out
    assert "all equal" in out and "#1 scale [RECORDED]" in out
