/* cuda_specific.h — scenarios that only mean something on a real GPU.
 *
 * cuBLAS with a workspace from the pool, a segment that forks onto a second
 * stream, pool growth while a capture is open, the calls that break a CUDA
 * capture, and a long run of host-side branches. They use only the public
 * API (cgtree.h) and the kernels of tools/common/kernels.h, on trees with
 * backend = CGT_BACKEND_CUDA, and compare every result with an eager tree
 * (CGT_MODE_EAGER) or a host reference.
 *
 * A suite's main() can run them with cuda_specific_run(), or put the table
 * into its own group. Each test skips itself when no usable GPU is present.
 */
#ifndef CGT_TEST_CUDA_SPECIFIC_H
#define CGT_TEST_CUDA_SPECIFIC_H

/* cmocka.h needs these first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

extern const struct CMUnitTest cuda_specific_tests[];
extern const size_t cuda_specific_test_count;

/* Runs the table as the cmocka group "cuda_specific". Returns cmocka's
 * result (the number of failed tests), or 77 (the skip code Meson knows)
 * when the CUDA kernels were not built or no usable GPU is present. */
int cuda_specific_run(void);

#endif /* CGT_TEST_CUDA_SPECIFIC_H */
