/* backend_none.c — what the library says about CUDA when built without it.
 *
 * Built only when Meson found no CUDA toolkit (or -Dcuda=disabled). The tree
 * asks backend_cuda_available() before it picks a backend; here the answer
 * is always no, so CGT_BACKEND_AUTO falls back to the simulator and
 * CGT_BACKEND_CUDA fails with CGT_ERR_NO_DEVICE. backend_cuda_ops does not
 * exist in such a build (backend.h declares it only under CGT_HAVE_CUDA).
 */
#include "backend.h"

int backend_cuda_available(void) { return 0; }
