/* kernels.c — picks the kernel flavour that matches a tree's backend.
 *
 * Kept apart from both flavours so that a build without nvcc links without
 * the CUDA table and still answers "not built" for it.
 */
#include <stddef.h>

#include "kernels.h"

const kernels *kernels_for(cgt_backend backend) {
  switch (backend) {
  case CGT_BACKEND_SIM:
    return &kernels_sim;
  case CGT_BACKEND_CUDA:
#ifdef CGT_HAVE_CUDA
    return &kernels_cuda;
#else
    return NULL;
#endif
  case CGT_BACKEND_AUTO:
    break;
  }
  return NULL;
}
