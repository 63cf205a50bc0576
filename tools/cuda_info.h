/* cuda_info.h — what `cgtree info` and the demo's header say about the GPU.
 *
 * The library hides the device behind its backend table and says only
 * whether a usable GPU is there (cgt_cuda_available). The tool wants more to
 * print: the GPU's name, compute capability and memory, and the driver and
 * runtime versions. It asks the CUDA runtime directly, in cuda_info.c, which
 * is compiled only when the build has CUDA; cuda_info_none.c answers
 * otherwise.
 */
#ifndef CGT_TOOLS_CUDA_INFO_H
#define CGT_TOOLS_CUDA_INFO_H

#include <stddef.h>

enum { CUDA_INFO_MAX_GPUS = 16 };

typedef struct cuda_gpu {
  char name[256];
  int cc_major, cc_minor; /* compute capability */
  size_t memory_bytes;    /* total global memory */
} cuda_gpu;

typedef struct cuda_info {
  int built;           /* 1 if this cgtree was built with the CUDA runtime */
  int driver_version;  /* cudaDriverGetVersion: 13000 is CUDA 13.0; 0 if no driver */
  int runtime_version; /* cudaRuntimeGetVersion; 0 if unknown */
  int n_gpus;          /* GPUs the runtime sees (at most CUDA_INFO_MAX_GPUS described) */
  cuda_gpu gpus[CUDA_INFO_MAX_GPUS];
  char error[256];     /* why there is no usable GPU, "" if there is one */
} cuda_info;

/* Fills *out. Never fails: what could not be learnt is 0 and error says why. */
void cuda_info_query(cuda_info *out);

#endif /* CGT_TOOLS_CUDA_INFO_H */
