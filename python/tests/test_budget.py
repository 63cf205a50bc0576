"""The recording budget and update in place from Python, on the simulator (issue 23)."""
import numpy as np
import pytest

import cgtree
from conftest import add_segment, scale_segment


def test_a_tree_with_max_graphs_evicts_the_least_recently_used_and_says_why():
    t = cgtree.Tree(backend="sim", max_graphs=2)
    seg = scale_segment(t, 3.0)
    for step in range(24):
        t.step_begin()
        n = 8 * (1 + step % 4)  # four shapes, four nodes, room for two graphs
        a = np.arange(n, dtype=np.float32)
        (y,) = t.run(seg, (cgtree.dynamic(a),), variant=n)
        np.testing.assert_array_equal(y.view(np.float32), 3 * a)
        t.check()
        assert t.stats()["graphs"] <= 2
    s = t.stats()
    assert s["evictions"] > 0 and s["recordings"] > 4
    evicted = [n for n in t.nodes() if n["evictions"]]
    assert evicted and all("max_graphs" in n["evict_reason"] for n in evicted)
    assert all(n["evict_reason"] is None for n in t.nodes() if not n["evictions"])
    t.close()


def test_reloaded_weights_update_the_recording_in_place_without_new_nodes(tree):
    add = add_segment(tree)
    x = np.arange(16, dtype=np.float32)
    w = np.ones(16, np.float32)
    for step in range(8):
        if step == 6:
            w = np.full(16, 5.0, np.float32)  # a reload: new values at a new address
        tree.step_begin()
        (y,) = tree.run(add, (cgtree.dynamic(x), cgtree.static(w)))
        np.testing.assert_array_equal(y.view(np.float32), x + w)
    s = tree.stats()
    assert s["nodes"] == 1 and s["updates"] == 1 and s["update_fallbacks"] == 0
    assert tree.nodes()[0]["updates"] == 1


def test_update_in_place_can_be_turned_off():
    t = cgtree.Tree(backend="sim", update_in_place=False)
    add = add_segment(t)
    x = np.arange(16, dtype=np.float32)
    for step in range(8):
        if step in (0, 6):  # a new weight at steps 0 and 6, the same array between
            w = np.full(16, 1.0 if step < 6 else 2.0, np.float32)
        t.step_begin()
        (y,) = t.run(add, (cgtree.dynamic(x), cgtree.static(w)))
        np.testing.assert_array_equal(y.view(np.float32), x + w)
    assert t.stats()["nodes"] == 2 and t.stats()["updates"] == 0
    t.close()


@pytest.mark.parametrize("kwargs", [{"max_graph_bytes": 10}, {"max_graphs": (1 << 24) + 1}, {"max_graphs": -1}])
def test_nonsense_budgets_are_refused(kwargs):
    with pytest.raises(cgtree.InvalidArgument):
        cgtree.Tree(backend="sim", **kwargs)
