/* record_stream_hook.cc — PyTorch's recordStream calls, handed to cgtree's
 * allocator.
 *
 * An allocator must know when a stream other than a block's own reads the
 * block: freed, the block is reused in its own stream's order, and a read
 * still queued on the other stream would see the new owner's data. PyTorch
 * tells its allocator through recordStream(ptr, stream). Tensor.record_stream
 * calls it, and so does PyTorch's C++ where it moves data across streams
 * behind the user's back: autograd's engine, for a gradient produced on one
 * stream and consumed on another (a forward that ran part of its work under
 * torch.cuda.stream(side)). CUDAPluggableAllocator, the allocator cgtree is
 * loaded as, drops the call unless a C++ hook is set with
 * set_record_stream_fn, a public method of that class
 * (torch/csrc/cuda/CUDAPluggableAllocator.h) that its Python wrapper does not
 * expose.
 *
 * So this file is built against PyTorch's headers and libraries, by
 * torch.utils.cpp_extension (PyTorch's own tool for it: the right include
 * paths, C++ ABI and libraries for the PyTorch that runs), when cgtree.torch
 * installs its allocator (_record_stream.py). It is a plain shared library:
 * one function, which takes the allocator PyTorch now uses, checks that it
 * is a pluggable one, and sets the hook to call cgt_torch_record_stream in
 * cgtree's own extension (python/_torch_ext/alloc.c), whose address the
 * caller passes in. Nothing of PyTorch's objects is read but through their
 * declared methods.
 *
 * Out of host memory the record cannot be kept; the hook then throws
 * std::bad_alloc, which PyTorch turns into an error of the operation that
 * asked (a backward, a record_stream), rather than let the free come early.
 */
#include <new>

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

typedef int (*record_fn)(void *ptr, void *stream);

/* Sets the current allocator's record-stream hook to call record. 1 done;
 * 0 if record is NULL or PyTorch's current CUDA allocator is not a pluggable
 * one (cgtree's allocator is not installed): nothing changed. */
extern "C" __attribute__((visibility("default"))) int cgt_torch_set_record_stream_hook(record_fn record) {
  auto current = std::dynamic_pointer_cast<pluggable::CUDAPluggableAllocator>(pluggable::getCurrentAllocator());
  if (!current || !record)
    return 0;
  current->set_record_stream_fn([record](void *ptr, cudaStream_t stream) {
    if (record(ptr, static_cast<void *>(stream)) < 0)
      throw std::bad_alloc();
  });
  return 1;
}
