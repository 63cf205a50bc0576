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
 * function calls the C allocator (alloc.c) and, when it refuses, throws,
 * with PyTorch's own wording ("CUDA out of memory. Tried to allocate ...").
 *
 * Which exception. PyTorch's own class is c10::OutOfMemoryError, which its
 * bindings raise as torch.OutOfMemoryError (a RuntimeError): what code that
 * recovers from out of memory catches. It lives in libc10, which this
 * module does not build against (it takes nothing from PyTorch but what
 * Python and DLPack hand it). cgtree's small C++ library built against the
 * running PyTorch (python/cgtree/torch/oom_error.cc, built by _cxx.py)
 * throws it, and install() hands this file that thrower
 * (cgt_torch_set_oom_thrower). Without it (the library could not be built)
 * the refusal throws std::runtime_error with the same text, which PyTorch
 * raises as RuntimeError. A compiled graph's call turns either into
 * torch.OutOfMemoryError itself (segment.c).
 *
 * A refusal for another cause (the driver's pool failing with a sticky
 * error after an illegal address, say) says "CUDA error: ..." with the
 * driver's error instead, as std::runtime_error: read as out of memory, it
 * would send such code retrying smaller in vain and hide the cause.
 *
 * The throw leaves nothing half done: alloc.c has returned, with its lock
 * released and its figures counting the refusal, before it.
 */
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <stdexcept>
#include <typeinfo>

#include "alloc_entry.h"

#define EXPORTED extern "C" __attribute__((visibility("default")))

typedef void (*oom_thrower)(const char *text);

static std::atomic<oom_thrower> thrower{nullptr};

EXPORTED void *cgt_torch_alloc_or_throw(ssize_t size, int device, void *stream);
EXPORTED void cgt_torch_set_oom_thrower(oom_thrower f);
EXPORTED int cgt_torch_alloc_exception(ssize_t size, int device, void *stream, char *type_name, size_t type_cap,
                                       char *what, size_t what_cap);

void *cgt_torch_alloc_or_throw(ssize_t size, int device, void *stream) {
  void *p = cgt_torch_alloc(size, device, stream);
  if (p == nullptr && size > 0) {
    char text[512];
    tx_alloc_refusal_text(text, sizeof text);
    oom_thrower f = thrower.load(std::memory_order_acquire);
    if (f && tx_alloc_refusal_is_oom())
      f(text); /* throws c10::OutOfMemoryError; were it to return, the next line throws */
    throw std::runtime_error(text);
  }
  return p;
}

/* The thrower of PyTorch's out-of-memory class (NULL: none, std::runtime_error). */
void cgt_torch_set_oom_thrower(oom_thrower f) { thrower.store(f, std::memory_order_release); }

static void copy_text(char *to, size_t cap, const char *from) {
  if (cap == 0)
    return;
  strncpy(to, from, cap - 1);
  to[cap - 1] = '\0';
}

/* For tests: cgt_torch_alloc_or_throw(size, device, stream) as PyTorch
 * calls it, with the exception caught. 1 when it threw: the exception's
 * type name (demangled: "c10::OutOfMemoryError") and its what() are
 * copied out (NUL-terminated, cut to the caps); 0 when it returned memory,
 * which is freed at once. */
int cgt_torch_alloc_exception(ssize_t size, int device, void *stream, char *type_name, size_t type_cap, char *what,
                              size_t what_cap) {
  try {
    void *p = cgt_torch_alloc_or_throw(size, device, stream);
    cgt_torch_free(p, size, device, stream);
    return 0;
  } catch (const std::exception &e) {
    int status = 0;
    char *demangled = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
    copy_text(type_name, type_cap, status == 0 && demangled ? demangled : typeid(e).name());
    free(demangled);
    copy_text(what, what_cap, e.what());
    return 1;
  } catch (...) {
    copy_text(type_name, type_cap, "(not a std::exception)");
    copy_text(what, what_cap, "");
    return 1;
  }
}
