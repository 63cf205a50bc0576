/* alloc_entry.h — the allocator's entry points, shared by alloc.c (C) and
 * oom.cc (C++), the one file PyTorch calls (see oom.cc for why it is C++).
 */
#ifndef CGT_TORCH_ALLOC_ENTRY_H
#define CGT_TORCH_ALLOC_ENTRY_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* size bytes on device for stream: pool memory inside a launch of ours,
 * else eager memory (eager.c). NULL when refused, out of device or host
 * memory: then tx_alloc_refusal_text describes the refusal. Size 0 (or
 * less) is NULL too, and no refusal. */
__attribute__((visibility("default"))) void *cgt_torch_alloc(ssize_t size, int device, void *stream);
__attribute__((visibility("default"))) void cgt_torch_free(void *ptr, ssize_t size, int device, void *stream);
/* PyTorch's recordStream(ptr, stream), through the C++ hook
 * (python/cgtree/torch/record_stream_hook.cc): stream uses the block at ptr
 * too, so its free waits for that stream's work. 1 when noted or not needed
 * (a block's own stream, a pointer not at the start of an eager block of
 * ours), -1 out of host memory (nothing changed). */
__attribute__((visibility("default"))) int cgt_torch_record_stream(void *ptr, void *stream);
/* The message of this thread's last refusal, in PyTorch's words ("CUDA out
 * of memory. Tried to allocate ...") when it was for want of memory, else
 * "CUDA error: ..." naming the driver's error, into buf (cap bytes,
 * NUL-terminated). */
void tx_alloc_refusal_text(char *buf, size_t cap);
/* 1 when this thread's last refusal was for want of memory (PyTorch's
 * out-of-memory error), 0 when for another cause. */
int tx_alloc_refusal_is_oom(void);

#ifdef __cplusplus
}
#endif

#endif
