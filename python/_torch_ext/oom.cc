/* oom.cc — the allocation function PyTorch calls, in C++ for one reason:
 * out of memory must raise.
 *
 * PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator)
 * wraps the function it loads in a DataPtr and hands it out without
 * looking: a NULL from it becomes a tensor of the requested size at
 * address 0, and the first kernel that writes it ends the process's CUDA
 * context with an illegal address. PyTorch's own allocators report out of
 * memory by throwing a C++ exception from the allocation, which unwinds to
 * the Python binding of the operation and becomes a Python exception there;
 * every caller of an allocator in PyTorch is written for that. So this
 * function calls the C allocator (alloc.c) and, when it refuses, throws
 * std::runtime_error with PyTorch's own wording ("CUDA out of memory. Tried
 * to allocate ..."). PyTorch turns any std::exception into RuntimeError with
 * that text, which is what code that recovers from out of memory looks for
 * (the text, or RuntimeError; torch.OutOfMemoryError is a RuntimeError).
 * A refusal for another cause (the driver's pool failing with a sticky
 * error after an illegal address, say) says "CUDA error: ..." with the
 * driver's error instead: read as out of memory, it would send such code
 * retrying smaller in vain and hide the cause.
 * A compiled graph's call turns it into torch.OutOfMemoryError itself
 * (segment.c); an eager operation raises the RuntimeError. PyTorch's own
 * exception class is C++ inside libc10, which this module does not build
 * against: it takes nothing from PyTorch but what Python and DLPack hand it.
 *
 * The throw leaves nothing half done: alloc.c has returned, with its lock
 * released and its figures counting the refusal, before it.
 */
#include <stdexcept>

#include "alloc_entry.h"

extern "C" __attribute__((visibility("default"))) void *cgt_torch_alloc_or_throw(ssize_t size, int device,
                                                                                 void *stream);

void *cgt_torch_alloc_or_throw(ssize_t size, int device, void *stream) {
  void *p = cgt_torch_alloc(size, device, stream);
  if (p == nullptr && size > 0) {
    char text[512];
    tx_alloc_refusal_text(text, sizeof text);
    throw std::runtime_error(text);
  }
  return p;
}
