"""The C++ hook that hands PyTorch's recordStream calls to cgtree's
allocator (python/cgtree/torch/_record_stream.py), on the CPU: how its
build is decided and reported, and that its source compiles against this
PyTorch's declarations. What it does on a GPU is in test_torch_trust.py."""
import os
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

from cgtree.torch import _record_stream  # noqa: E402


def test_the_hook_is_not_built_when_the_environment_says_0(monkeypatch):
    monkeypatch.setenv(_record_stream.ENV, "0")

    def build():
        raise AssertionError("built although the environment said 0")

    assert _record_stream.set_hook(build) == (False, "CGTREE_TORCH_RECORD_STREAM_HOOK=0")


def test_a_build_that_fails_is_reported_with_the_line_naming_its_error_and_not_raised(monkeypatch):
    monkeypatch.delenv(_record_stream.ENV, raising=False)

    def build():
        raise RuntimeError("Error building extension 'cgtree_record_stream_hook': [1/2] c++ -c hook.cc\n"
                           "hook.cc:3: fatal error: crt/host_defines.h: No such file\n"
                           "ninja: build stopped: subcommand failed.")

    assert _record_stream.set_hook(build) == (
        False, "building the hook failed: RuntimeError: hook.cc:3: fatal error: crt/host_defines.h: No such file")
    assert _record_stream.first_error("a\nno words of that kind\n") == "no words of that kind"


def test_a_library_without_the_setter_is_reported_and_not_raised(monkeypatch):
    monkeypatch.delenv(_record_stream.ENV, raising=False)
    from cgtree import _torch_ext

    ok, why = _record_stream.set_hook(lambda: _torch_ext.__file__)  # a real library, not the hook's
    assert not ok and why.startswith("building the hook failed: AttributeError") and "set_record_stream_hook" in why


def test_the_hooks_source_compiles_against_this_pytorchs_declarations():
    """record_stream_hook.cc calls CUDAPluggableAllocator's public C++
    methods; a PyTorch that renamed them or changed their signatures fails
    here, on any machine with the headers, not only at install on a GPU."""
    from torch.utils import cpp_extension

    cxx = shutil.which("c++") or shutil.which("g++")
    include = _record_stream.cuda_include()
    if cxx is None or include is None:
        pytest.skip("needs a C++ compiler and the CUDA headers")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-I" + include]
    cmd += ["-I" + d for d in cpp_extension.include_paths()] + [_record_stream.SOURCE]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_hook_builds_loads_and_refuses_pytorchs_own_allocator(monkeypatch, tmp_path):
    """The whole way on a machine without a GPU: torch.utils.cpp_extension
    builds the library (into an empty extensions directory), ctypes finds
    its setter, and the setter changes nothing where PyTorch's allocator is
    not a pluggable one (cgtree's is not installed here)."""
    from torch.utils import cpp_extension

    if not (shutil.which("c++") and cpp_extension.is_ninja_available() and _record_stream.cuda_include()):
        pytest.skip("needs a C++ compiler, ninja and the CUDA headers")
    if torch.cuda.is_available():
        pytest.skip("cgtree's allocator is installed where a GPU is: test_torch_trust.py tests the hook there")
    monkeypatch.delenv(_record_stream.ENV, raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert _record_stream.set_hook() == (False, "PyTorch's current CUDA allocator is not a pluggable one")


def test_a_build_lock_left_behind_is_reported_after_a_bounded_wait_not_waited_on_for_good(monkeypatch, tmp_path):
    """cpp_extension.load waits without end while its lock file exists, and
    a process killed during the build leaves it behind: install would hang
    in every later process. The hook's build waits a bounded time, then
    reports the file."""
    import time

    monkeypatch.delenv(_record_stream.ENV, raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_record_stream, "LOCK_WAIT_SECONDS", 0.3)
    monkeypatch.setattr(_record_stream, "cuda_include", lambda: str(tmp_path))  # the lock is met before any header
    directory = _record_stream.build_directory()
    assert directory.startswith(str(tmp_path))
    os.makedirs(directory)
    lock = os.path.join(directory, "lock")
    open(lock, "w").close()
    t0 = time.monotonic()
    ok, why = _record_stream.set_hook()
    assert not ok and lock in why and "stayed" in why, why
    assert time.monotonic() - t0 < 10
