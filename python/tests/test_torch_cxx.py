"""cgtree's C++ library built against the running PyTorch
(python/cgtree/torch/_cxx.py), on the CPU: how its build is decided and
reported, that its sources compile against this PyTorch's declarations,
and what its two pieces do without a GPU: the hook that hands PyTorch's
recordStream calls to cgtree's allocator (_record_stream.py; on a GPU in
test_torch_trust.py), and out of memory thrown as PyTorch's own class
(_oom_error.py; on a GPU in test_torch_oom.py)."""
import os
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

from cgtree.torch import _cxx, _oom_error, _record_stream  # noqa: E402


def test_the_hook_is_not_built_when_the_environment_says_0(monkeypatch):
    monkeypatch.setenv(_record_stream.ENV, "0")

    def build():
        raise AssertionError("built although the environment said 0")

    assert _record_stream.set_hook(build) == (False, "CGTREE_TORCH_RECORD_STREAM_HOOK=0")


def test_a_build_that_fails_is_reported_with_the_line_naming_its_error_and_not_raised(monkeypatch):
    monkeypatch.delenv(_record_stream.ENV, raising=False)

    def build():
        raise RuntimeError("Error building extension 'cgtree_torch_cxx': [1/2] c++ -c hook.cc\n"
                           "hook.cc:3: fatal error: crt/host_defines.h: No such file\n"
                           "ninja: build stopped: subcommand failed.")

    why = "building cgtree's C++ library failed: RuntimeError: hook.cc:3: fatal error: crt/host_defines.h: No such file"
    assert _record_stream.set_hook(build) == (False, why)
    assert _oom_error.set_thrower(build) == (False, why)
    assert _cxx.first_error("a\nno words of that kind\n") == "no words of that kind"


def test_the_library_is_built_once_and_a_failed_build_is_not_tried_again(monkeypatch):
    calls = []

    def build():
        calls.append(1)
        raise RuntimeError("no compiler")

    monkeypatch.setattr(_cxx, "build", build)
    monkeypatch.setattr(_cxx, "_built", {})
    for _ in range(3):
        with pytest.raises(RuntimeError, match="no compiler"):
            _cxx.library()
    assert len(calls) == 1
    monkeypatch.setattr(_cxx, "_built", {})
    monkeypatch.setattr(_cxx, "build", lambda: calls.append(2) or "/the/library.so")
    assert _cxx.library() == _cxx.library() == "/the/library.so" and calls == [1, 2]


def test_a_library_without_the_setter_is_reported_and_not_raised(monkeypatch):
    monkeypatch.delenv(_record_stream.ENV, raising=False)
    from cgtree import _torch_ext

    ok, why = _record_stream.set_hook(lambda: _torch_ext.__file__)  # a real library, not the hook's
    assert not ok and why.startswith("the library %s cannot set the hook" % _torch_ext.__file__), why
    assert "cgt_torch_set_record_stream_hook" in why
    ok, why = _oom_error.set_thrower(lambda: _torch_ext.__file__)
    assert not ok and why.startswith("the library %s has no thrower" % _torch_ext.__file__), why


@pytest.mark.parametrize("source", [os.path.basename(f) for f in _cxx.SOURCES])
def test_each_source_compiles_against_this_pytorchs_declarations(source):
    """record_stream_hook.cc calls CUDAPluggableAllocator's public C++
    methods, oom_error.cc throws c10::OutOfMemoryError; a PyTorch that
    renamed them or changed their signatures fails here, on any machine
    with the headers, not only at install on a GPU."""
    from torch.utils import cpp_extension

    cxx = shutil.which("c++") or shutil.which("g++")
    include = _cxx.cuda_include()
    if cxx is None or include is None:
        pytest.skip("needs a C++ compiler and the CUDA headers")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-I" + include]
    cmd += ["-I" + d for d in cpp_extension.include_paths()]
    cmd += [next(f for f in _cxx.SOURCES if f.endswith(source))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_hook_builds_loads_and_refuses_pytorchs_own_allocator(monkeypatch, tmp_path):
    """The whole way on a machine without a GPU: torch.utils.cpp_extension
    builds the library (into an empty extensions directory), ctypes finds
    its setter, and the setter changes nothing where PyTorch's allocator is
    not a pluggable one (cgtree's is not installed here)."""
    from torch.utils import cpp_extension

    if not (shutil.which("c++") and cpp_extension.is_ninja_available() and _cxx.cuda_include()):
        pytest.skip("needs a C++ compiler, ninja and the CUDA headers")
    if torch.cuda.is_available():
        pytest.skip("cgtree's allocator is installed where a GPU is: test_torch_trust.py tests the hook there")
    monkeypatch.delenv(_record_stream.ENV, raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_cxx, "_built", {})
    assert _record_stream.set_hook() == (False, "PyTorch's current CUDA allocator is not a pluggable one")
    assert _cxx.library().startswith(str(tmp_path))


def test_a_refusal_for_want_of_memory_throws_pytorchs_out_of_memory_class_and_any_other_a_runtime_error(
        monkeypatch, tmp_path):
    """The allocation function PyTorch calls (oom.cc), on the simulator's
    eager memory (device -1), its exception caught in C++ and named: with
    the library's thrower set, a refusal for want of memory throws
    c10::OutOfMemoryError, which PyTorch raises as torch.OutOfMemoryError;
    a refusal for another cause (an illegal address) stays
    std::runtime_error naming CUDA's error; without the thrower every
    refusal is std::runtime_error, with the same text."""
    from torch.utils import cpp_extension

    X = pytest.importorskip("cgtree._torch_ext")
    if not hasattr(X, "sim_fail_pool_allocs"):
        pytest.skip("needs the simulator's hooks")
    if not (shutil.which("c++") and cpp_extension.is_ninja_available() and _cxx.cuda_include()):
        pytest.skip("needs a C++ compiler, ninja and the CUDA headers")
    if torch.cuda.is_available():
        pytest.skip("a GPU's allocator: test_torch_oom.py tests the class there")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_cxx, "_built", {})
    huge, stream = 1 << 60, 0x5100
    try:
        assert _oom_error.set_thrower() == (True, _cxx.library())
        kind, text = _oom_error.alloc_exception(huge, -1, stream)
        assert kind == "c10::OutOfMemoryError", kind
        assert text.startswith("CUDA out of memory. Tried to allocate 1073741824.00 GiB on device -1"), text
        X.sim_fail_pool_allocs(700, 2)  # cudaErrorIllegalAddress, for the try and any retry
        try:
            kind, text = _oom_error.alloc_exception(3 * 4096 + 512, -1, stream)
        finally:
            X.sim_fail_pool_allocs(0, 0)
        assert kind == "std::runtime_error" and text.startswith("CUDA error: "), (kind, text)
        assert _oom_error.alloc_exception(4096, -1, stream) is None  # memory given (and freed): nothing thrown
    finally:
        _oom_error.clear_thrower()
    kind, text = _oom_error.alloc_exception(huge, -1, stream)
    assert kind == "std::runtime_error" and text.startswith("CUDA out of memory. Tried to allocate"), (kind, text)


def test_a_build_lock_left_behind_is_reported_after_a_bounded_wait_not_waited_on_for_good(monkeypatch, tmp_path):
    """cpp_extension.load waits without end while its lock file exists, and
    a process killed during the build leaves it behind: install would hang
    in every later process. The hook's build waits a bounded time, then
    reports the file."""
    import time

    monkeypatch.delenv(_record_stream.ENV, raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_cxx, "LOCK_WAIT_SECONDS", 0.3)
    monkeypatch.setattr(_cxx, "cuda_include", lambda: str(tmp_path))  # the lock is met before any header
    monkeypatch.setattr(_cxx, "_built", {})
    directory = _cxx.build_directory()
    assert directory.startswith(str(tmp_path))
    os.makedirs(directory)
    lock = os.path.join(directory, "lock")
    open(lock, "w").close()
    t0 = time.monotonic()
    ok, why = _record_stream.set_hook()
    assert not ok and lock in why and "stayed" in why, why
    assert time.monotonic() - t0 < 10
