/* cuda_info_none.c — cuda_info for a build without CUDA: nothing to ask,
 * and the answer says that CUDA was not built rather than that no GPU was
 * found, because on this build the two cannot be told apart. */
#include <string.h>

#include "cuda_info.h"

void cuda_info_query(cuda_info *out) {
  memset(out, 0, sizeof *out);
  strcpy(out->error, "this cgtree was built without CUDA");
}
