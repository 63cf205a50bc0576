"""Output tensor objects handed back again (python/_torch_ext/reuse.c), on the simulator.

No torch: a ReuseTensor stands in for torch.Tensor. Its ctypes value word
plays the TensorImpl address a tensor object holds; that "TensorImpl" is a
ctypes buffer laid out as reuse.c reads PyTorch's (a reference count in the
word at offset 8, the StorageImpl's address at offset 16), and so is its
"StorageImpl" (a count at offset 8). The stand-in exchange table makes the
outputs, the stand-in shim reads their data pointers (the word at impl + 32),
and a test
plays what PyTorch would do to the counts: a view of the storage, a C++
reference to the tensor, a change of metadata.
"""
import ctypes
import gc
import weakref

import pytest

from test_torch_ext_sim import (X, DLManagedVersioned, FakeTensor, Generation, Graph, XTensor, call,
                                fake_from_dlpack, k_affine, probes, segment)

IMPL_BYTES = 256


class ReuseTensor(ctypes.c_void_p):
    """A served tensor type: no instance attributes beyond its slots."""
    __slots__ = ("ptr", "n", "nbytes", "managed", "impl", "storage")

    def data_ptr(self):
        return self.ptr

    def values(self):
        return list((ctypes.c_float * self.n).from_address(self.ptr))

    def __del__(self):
        if self.managed is not None:
            addr, deleter = self.managed
            self.managed = None
            deleter(addr)


def word(buf, off):
    return ctypes.c_uint64.from_address(ctypes.addressof(buf) + off)


def reuse_tensor(ptr, n, managed=None):
    t = ReuseTensor()
    t.impl = (ctypes.c_char * IMPL_BYTES)()
    t.storage = (ctypes.c_char * 64)()
    word(t.impl, 8).value = 1  # one strong reference each, as PyTorch makes them
    word(t.impl, 16).value = ctypes.addressof(t.storage)
    word(t.storage, 8).value = 1
    word(t.impl, 32).value = ptr  # where the stand-in shim reads the data pointer
    t.value = ctypes.addressof(t.impl)
    t.ptr, t.n, t.nbytes, t.managed = ptr, n, 4 * n, managed
    return t


def make_reuse_tensor(addr):
    m = DLManagedVersioned.from_address(addr)
    n = 1
    for d in range(m.dl.ndim):
        n *= m.dl.shape[d]
    return reuse_tensor(m.dl.data, n, managed=(addr, m.deleter))


def shim_probe(t):
    return (t, ctypes.addressof(t.impl), t.ptr)


def reuse_probe(t):
    return (t, ctypes.addressof(t.impl), ctypes.addressof(t.storage), word(t.storage, 8).value)


@pytest.fixture
def reuse():
    """Outputs through the stand-in table as ReuseTensors, the shim reading
    them, and reuse on: yields setup_reuse's answer and the probes."""
    _, good = probes()
    assert X.setup_exchange(X.test_exchange_api(make_reuse_tensor), (XTensor,), good)["outputs"]
    X.init_hot_path(fake_from_dlpack, lambda device: 0, Generation, ReuseTensor)
    keep = [reuse_tensor(FakeTensor(4).ptr, 4) for _ in range(3)]
    assert X.setup_shim(X.__file__, "cgt_torch_test_data_ptr_word", (ReuseTensor,), [shim_probe(t) for t in keep])[0]
    yield X.setup_reuse([reuse_probe(t) for t in keep], True), keep
    X.setup_reuse([], False)
    X.setup_shim(None, "", (), [])
    X.setup_exchange(None, (), [])
    X.init_hot_path(fake_from_dlpack, lambda device: 0, Generation, FakeTensor)


@pytest.fixture
def tree():
    t = X.Tree(0, backend="sim")
    yield t
    gc.collect()
    t.check()


def replayed(tree, reuse, name="r"):
    """A segment of out = 2x + 1 past its recording, and its input."""
    assert reuse[0][0], reuse[0]
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name=name)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):
        (y,) = call(seg, x)
    del y
    return seg, x


def test_setup_finds_the_storage_word_and_refuses_what_it_cannot_prove(reuse):
    (on, offset, why), keep = reuse
    assert on and offset == 16 and why == "", reuse
    assert X.reuse_info() == {"on": True, "storage_at": 16}
    probes4 = [reuse_probe(t) for t in keep]
    refusals = {
        "reference count": [probes4[0], probes4[1][:3] + (2,)] + probes4[2:],  # PyTorch counts 2, the word says 1
        "no word": [(p[0], p[1], p[2] + 8, p[3]) for p in probes4],  # names another StorageImpl
        "no probes": [],
    }
    for why, bad in refusals.items():
        on, offset, said = X.setup_reuse(bad, True)
        assert not on and offset == 0 and why in said, said
        assert not X.reuse_info()["on"]
    twice = reuse_tensor(FakeTensor(4).ptr, 4)
    word(twice.impl, 24).value = ctypes.addressof(twice.storage)  # a second word holds it
    on, _, said = X.setup_reuse([reuse_probe(twice)], True)
    assert not on and "two words" in said
    with pytest.raises(TypeError):
        X.setup_reuse([(keep[0], 1, 2)], True)  # three items, not four
    assert not X.reuse_info()["on"]  # refused, and nothing changed
    assert X.setup_reuse(probes4, False)[:2] == (False, 16)  # proven, and turned off on request
    X.setup_shim(None, "", (), [])
    assert X.setup_reuse(probes4, True) == (False, 0, "the shim is off")


def test_an_output_nobody_holds_is_handed_back_again_and_computes_as_a_new_one(tree, reuse):
    seg, x = replayed(tree, reuse)
    (y,) = call(seg, x)
    first = id(y)
    before = tree.stats()["outputs_reused"]
    for i in range(5):
        del y
        x.fill([1 + i, 2, 3, 4])
        (y,) = call(seg, x)
        assert id(y) == first and type(y) is ReuseTensor
        assert y.values() == [3 + 2 * i, 5, 7, 9]
    s = tree.stats()
    assert s["outputs_reused"] == before + 5 and s["outputs_alive"] == 1
    del y
    assert tree.stats()["outputs_alive"] == 0


def test_the_loop_y_equals_f_of_x_takes_back_the_object_it_dropped_a_call_ago(tree, reuse):
    """`y = f(x)` holds the last y while f runs: that call makes a new
    object, and the next takes back the one dropped meanwhile."""
    seg, x = replayed(tree, reuse)
    before = tree.stats()
    ids = set()
    for i in range(8):
        x.fill([1 + i, 2, 3, 4])
        y = call(seg, x)[0]
        ids.add(id(y))
        assert y.values() == [3 + 2 * i, 5, 7, 9]
    after = tree.stats()
    assert after["outputs_reused"] - before["outputs_reused"] >= 6
    assert len(ids) <= 3


def test_an_output_still_held_is_not_handed_back_and_stays_stale(tree, reuse):
    seg, x = replayed(tree, reuse)
    (y1,) = call(seg, x)
    (y2,) = call(seg, x)  # y1 is held: a new object, and y1 belongs to an earlier step
    assert y2 is not y1
    with pytest.raises(X.StaleTensorError):
        call(seg, y1)
    assert y2.values() == [3, 5, 7, 9]


@pytest.mark.parametrize("hold", ["view of the storage", "C++ reference", "weak reference", "attribute"])
def test_an_output_something_else_may_reach_is_not_handed_back(tree, reuse, hold):
    seg, x = replayed(tree, reuse)
    (y,) = call(seg, x)
    first, keep = id(y), []
    if hold == "view of the storage":
        word(y.storage, 8).value = 2
    elif hold == "C++ reference":
        word(y.impl, 8).value = 2
    elif hold == "weak reference":
        keep.append(weakref.ref(y))
    keep.append(y)
    del y
    (y2,) = call(seg, x)
    assert id(y2) != first and y2.values() == [3, 5, 7, 9]
    assert tree.stats()["outputs_not_reused"] >= 1


def test_an_output_whose_metadata_changed_is_not_handed_back(tree, reuse):
    seg, x = replayed(tree, reuse)
    for _ in range(6):  # more than the objects kept per output: every kept one is changed
        (y,) = call(seg, x)
        ctypes.memset(ctypes.addressof(y.impl) + 120, 7, 1)  # say, a size changed in place (unsqueeze_)
        del y
    before = tree.stats()
    (y2,) = call(seg, x)
    after = tree.stats()
    assert after["outputs_reused"] == before["outputs_reused"]
    assert after["outputs_made"] == before["outputs_made"] + 1
    assert after["outputs_not_reused"] == before["outputs_not_reused"] + 1
    assert y2.values() == [3, 5, 7, 9] and ctypes.c_char.from_address(y2.value + 120).value != b"\x07"


class Direct:
    """out = x * a + b in one kernel, no temporary: its output takes the
    first free block of the pool."""

    def __init__(self, tree, a, b):
        self.tree, self.a, self.b = tree, a, b

    def __call__(self, x):
        out = FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, x.ptr, x.n, self.a, self.b)
        return (out,)


@pytest.mark.parametrize("view", [False, True])
def test_a_dropped_output_gives_its_memory_back_within_the_step(tree, reuse, view):
    """Two segments in one step: the first's output, dropped, frees its
    memory before the second records, as a dying tensor would, and the
    second's output takes it; one whose storage a view still reads keeps it
    to the step's end."""
    assert reuse[0][0]
    seg_a = segment(tree, Direct(tree, 2.0, 1.0), spans=(16,), name="a")
    seg_b = segment(tree, Direct(tree, 3.0, 0.0), spans=(16,), name="b")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for i in range(5):
        Generation.generation += 1  # one step: seg_a, then seg_b
        (y,) = seg_a(x)
        if i == 0:  # a segment's first call runs the graph plainly: no tree, no reuse
            del y
            continue
        y_ptr, storage = y.ptr, y.storage
        if view:
            word(storage, 8).value = 2
        alive = tree.stats()["outputs_alive"]
        del y  # (no stats() here: it too would give the value back)
        (z,) = seg_b(x)
        assert z.values() == [3, 6, 9, 12]
        assert tree.stats()["outputs_alive"] == alive - (not view) + isinstance(z, ReuseTensor)
        if i >= 3:  # recorded and replayed: z where y was, unless a view keeps y's memory
            assert (z.ptr == y_ptr) != view, (i, z.ptr, y_ptr)
        del z
        word(storage, 8).value = 1


def test_a_kept_object_whose_storage_died_under_it_is_let_go(tree, reuse):
    """`y.set_(other)` or `y.data = other` on an output frees our storage
    while the object lives: its DLPack context is freed, and the object must
    not be kept (nor handed back) any more."""
    seg, x = replayed(tree, reuse)
    (y,) = call(seg, x)
    gone = weakref.ref(y)
    addr, deleter = y.managed
    y.managed = None
    deleter(addr)  # the storage dies, the object stays
    word(y.impl, 16).value = ctypes.addressof(y.storage) + 8  # it now points at another storage
    del y
    made = tree.stats()["outputs_made"]  # stats() drains the queue: the context goes, and the object with it
    gc.collect()
    assert gone() is None
    (y2,) = call(seg, x)
    assert y2.values() == [3, 5, 7, 9]
    assert tree.stats()["outputs_made"] + tree.stats()["outputs_reused"] >= made + 1


@pytest.mark.parametrize("off", ["shim", "reuse"])
def test_a_dropped_output_still_gives_its_memory_back_after_the_shim_is_turned_off(tree, reuse, off):
    """The shim may go off mid-step (a cross-check disagreed), or reuse (its
    setup run again and failing): outputs kept until then still give their
    values back once dropped."""
    seg_a = segment(tree, Direct(tree, 2.0, 1.0), spans=(16,), name="a")
    seg_b = segment(tree, Direct(tree, 3.0, 0.0), spans=(16,), name="b")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(4):  # warm up, record, replay both in every step
        Generation.generation += 1
        (y,) = seg_a(x)
        del y
        (z,) = seg_b(x)
        del z
    Generation.generation += 1
    (y,) = seg_a(x)
    y_ptr = y.ptr
    if off == "shim":
        X.setup_shim(None, "", (), [])  # off from here, reuse with it
    else:
        assert not X.setup_reuse([], True)[0] and X.reuse_info() == {"on": False, "storage_at": 0}
    del y
    (z,) = seg_b(x)
    assert z.values() == [3, 6, 9, 12]
    assert z.ptr == y_ptr  # y's memory was free again when seg_b ran
