"""The CUDA backend from Python: Triton, CuPy and PyTorch kernels launched on l.stream,
recorded into graphs and replayed. Skipped without a GPU (and per library when it is
missing); the GPU machine has torch, triton and cupy."""
import numpy as np
import pytest

import cgtree

pytestmark = pytest.mark.skipif(not cgtree.cuda_available(), reason="no usable CUDA GPU")

N = 4096
STEPS = 6


class Raw:
    """Device memory (ptr, n float32s) as __cuda_array_interface__ for torch.as_tensor / cupy.asarray."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 2,
                                         "strides": None}


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@pytest.fixture
def gpu_tree(torch):
    t = cgtree.Tree(backend="cuda")
    yield t
    t.sync()
    t.check()
    t.close()


def as_torch(torch, ptr, n):
    return torch.as_tensor(Raw(ptr, n), device="cuda")


def check_steps(torch, t, seg, calls):
    """Runs STEPS steps with new input contents each step; checks out == 2 * x + 1 every step."""
    x = torch.empty(N, device="cuda", dtype=torch.float32)
    xs = cgtree.static(x)
    for step in range(STEPS):
        t.step_begin()
        x.copy_(torch.arange(N, device="cuda", dtype=torch.float32) * (step + 1))
        torch.cuda.synchronize()
        (y,) = t.run(seg, (xs,))
        got = torch.from_dlpack(y.view("float32", (N,))).clone()
        torch.cuda.synchronize()
        assert torch.equal(got, 2 * x + 1), f"step {step}"
    s = t.stats()
    assert s["replays"] == STEPS - 2 and s["recordings"] == 1
    assert calls["n"] == 2  # warmup and recording only
    assert t.nodes()[0]["state"] == "RECORDED"


def test_a_triton_kernel_on_the_launch_stream_is_recorded_and_replayed(torch, gpu_tree):
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def affine(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * 2.0 + 1.0, mask=m)

    calls = {"n": 0}

    def launch(l):
        calls["n"] += 1
        src, nbytes = l.input(0)
        out = l.alloc(nbytes)
        with torch.cuda.stream(torch.cuda.ExternalStream(l.stream)):
            affine[(triton.cdiv(N, 1024),)](as_torch(torch, src, N), as_torch(torch, out, N), N, BLOCK=1024)
        l.set_output(0, out, nbytes)

    # Compile outside any capture first (Triton's JIT allocates and synchronizes).
    scratch = torch.zeros(N, device="cuda")
    affine[(triton.cdiv(N, 1024),)](scratch, scratch, N, BLOCK=1024)
    torch.cuda.synchronize()
    check_steps(torch, gpu_tree, gpu_tree.segment("triton_affine", launch, 1, 1), calls)


def test_a_cupy_raw_kernel_on_the_launch_stream_is_recorded_and_replayed(torch, gpu_tree):
    cupy = pytest.importorskip("cupy")
    kernel = cupy.RawKernel(r'''
    extern "C" __global__ void affine(const float *x, float *y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = x[i] * 2.0f + 1.0f;
    }''', "affine")
    kernel.compile()
    calls = {"n": 0}

    def launch(l):
        calls["n"] += 1
        src, nbytes = l.input(0)
        out = l.alloc(nbytes)
        with cupy.cuda.ExternalStream(l.stream):
            kernel(((N + 255) // 256,), (256,), (np.uint64(src), np.uint64(out), np.int32(N)))
        l.set_output(0, out, nbytes)

    check_steps(torch, gpu_tree, gpu_tree.segment("cupy_affine", launch, 1, 1), calls)


def test_pytorch_ops_on_the_launch_stream_are_recorded_and_replayed(torch, gpu_tree):
    calls = {"n": 0}

    def launch(l):
        calls["n"] += 1
        src, nbytes = l.input(0)
        out = l.alloc(nbytes)
        tmp = l.alloc(nbytes)
        with torch.cuda.stream(torch.cuda.ExternalStream(l.stream)):
            x, y, t = as_torch(torch, src, N), as_torch(torch, out, N), as_torch(torch, tmp, N)
            torch.mul(x, 2.0, out=t)
            torch.add(t, 1.0, out=y)
        l.free(tmp)
        l.set_output(0, out, nbytes)

    check_steps(torch, gpu_tree, gpu_tree.segment("torch_affine", launch, 1, 1), calls)


def test_values_export_to_torch_and_cupy_without_a_copy(torch, gpu_tree):
    def launch(l):
        out = l.alloc(N * 4)
        with torch.cuda.stream(torch.cuda.ExternalStream(l.stream)):
            as_torch(torch, out, N).fill_(3.0)
        l.set_output(0, out, N * 4)

    seg = gpu_tree.segment("fill", launch, 0, 1)
    (y,) = gpu_tree.run(seg, ())
    raw = torch.from_dlpack(y)
    assert raw.dtype == torch.uint8 and raw.numel() == N * 4 and raw.data_ptr() == y.ptr
    typed = torch.from_dlpack(y.view(torch.float32, (N,)))
    assert typed.data_ptr() == y.ptr and float(typed.sum()) == 3.0 * N
    assert y.__dlpack_device__() == (2, gpu_tree.device)
    cai = y.__cuda_array_interface__
    assert cai["data"][0] == y.ptr and cai["shape"] == (N * 4,) and cai["stream"] == gpu_tree.stream
    cupy = pytest.importorskip("cupy")
    assert cupy.asarray(y.view("float32", (N,))).sum().item() == 3.0 * N


def test_a_cuda_tree_refuses_host_memory_and_takes_torch_tensors(torch, gpu_tree):
    def launch(l):
        src, nbytes = l.input(0)
        l.set_output(0, src, nbytes)

    seg = gpu_tree.segment("alias", launch, 1, 1)
    with pytest.raises(cgtree.InvalidArgument, match="host memory given to a CUDA tree"):
        gpu_tree.run(seg, (cgtree.static(np.ones(4, np.float32)),))
    x = torch.ones(16, device="cuda")
    arg = cgtree.static(x)
    assert arg.ptr == x.data_ptr() and arg.nbytes == 64 and arg.device == ("cuda", x.device.index or 0)
    with pytest.raises(cgtree.InvalidArgument, match="contiguous"):
        cgtree.static(torch.ones(8, 8, device="cuda")[:, ::2])
    (y,) = gpu_tree.run(seg, (arg,))
    assert y.ptr == x.data_ptr()
    with pytest.raises(cgtree.StateError):
        cgtree.sim_launch(gpu_tree.stream, print)  # only inside a launch function, and never on CUDA
