/* oom_error.cc — out of memory, thrown as PyTorch's own exception class.
 *
 * cgtree's allocation function (python/_torch_ext/oom.cc) must throw when
 * it refuses: PyTorch's pluggable allocator would otherwise hand out a
 * tensor at address 0. Code that recovers from out of memory (a batch size
 * search, a serving engine's admission) catches torch.OutOfMemoryError,
 * which PyTorch's Python bindings raise for the C++ class
 * c10::OutOfMemoryError and only for it; any other exception becomes a
 * plain RuntimeError. That class is declared in PyTorch's headers
 * (c10/util/Exception.h) and lives in libc10, so this one function is built
 * against the PyTorch that runs (with record_stream_hook.cc, by
 * python/cgtree/torch/_cxx.py), and install() hands its address to oom.cc,
 * which calls it for refusals for want of memory. TORCH_CHECK_WITH is
 * PyTorch's documented way to throw one of its error classes; its message
 * is the text alone (PyTorch adds the C++ backtrace only under
 * TORCH_SHOW_CPP_STACKTRACES=1).
 */
#include <c10/util/Exception.h>

/* Throws c10::OutOfMemoryError(text); never returns. */
extern "C" __attribute__((visibility("default"))) void cgt_torch_throw_out_of_memory(const char *text) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, text);
}
