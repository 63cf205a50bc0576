/* dp_kernels.h — the two small kernels of the data-parallel benchmark
 * (dp_train.c) that the shared kernel table does not have. Both read a
 * step counter that lives on the device, so a replayed graph sees the step
 * it runs in without any host argument changing.
 */
#ifndef CGT_DP_KERNELS_H
#define CGT_DP_KERNELS_H

#include <stdint.h>

#include "cgtree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* loss[0] = loss[0] * scale + inject[*counter]: inject holds 0 on ordinary
 * steps and an infinity on the steps whose loss overflows. */
cgt_status dp_inject_loss(void *stream, float *loss, float scale, const float *inject, const int *counter);

/* stamps[2 * *counter + slot] = the GPU's global timer (ns); then, if
 * advance, ++*counter. One thread: the stamp is taken when the stream
 * reaches it, i.e. after everything enqueued before it has finished. */
cgt_status dp_stamp(void *stream, uint64_t *stamps, int *counter, int slot, int advance);

/* Detail of this thread's last failure, "" if none. */
const char *dp_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CGT_DP_KERNELS_H */
