/* dlpack.h — the DLPack structs cgtree's Python extension exports and reads.
 *
 * DLPack is a stable C ABI for handing a tensor from one framework to another
 * without a copy (https://dmlc.github.io/dlpack/). We write the structs out
 * here instead of vendoring the project's header: only these few are needed,
 * their layout is frozen by the ABI (version 0.8, the "unversioned" capsule
 * every consumer reads), and the extension then depends on nothing but
 * Python and cgtree.h. Both the unversioned (0.8) and the versioned (1.0)
 * managed tensors are here.
 *
 * The capsule protocol: a producer returns a PyCapsule named "dltensor" that
 * points to a DLManagedTensor. A consumer that takes ownership renames the
 * capsule "used_dltensor" and calls `deleter` when it is done; a capsule that
 * dies unconsumed calls `deleter` from its own destructor.
 */
#ifndef CGTREE_PY_DLPACK_H
#define CGTREE_PY_DLPACK_H

#include <stdint.h>

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
} DLDeviceType;

typedef struct {
  int32_t device_type; /* a DLDeviceType */
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
} DLDataTypeCode;

typedef struct {
  uint8_t code; /* a DLDataTypeCode */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* NULL: compact row-major */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* DLPack 1.0 adds a versioned tensor with flags (read-only, copied); a
 * consumer that passes max_version >= (1, 0) to __dlpack__ accepts it. numpy
 * makes arrays of unversioned tensors read-only, of versioned ones writable
 * unless the flag says otherwise. */
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* DLPack 1.3's C exchange API: a framework sets on its tensor type an
 * attribute __dlpack_c_exchange_api__, a PyCapsule named
 * "dlpack_exchange_api" over a table of C functions that live as long as the
 * process. It lets a consumer read a tensor, make one and ask for the current
 * stream without a Python call (PyTorch has it from 2.11). Each function
 * returns 0 on success, or -1 with a Python exception set. Only the table's
 * layout is used here; the header's version says which layout it is. */
#define DLPACK_EXCHANGE_API_CAPSULE_NAME "dlpack_exchange_api"

typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  struct DLPackExchangeAPIHeader *prev_api; /* an older table, or NULL */
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  /* A new tensor of the framework's own (not used here). */
  int (*managed_tensor_allocator)(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                                  void (*set_error)(void *error_ctx, const char *kind, const char *message));
  /* An owning DLPack view of a Python tensor. */
  int (*managed_tensor_from_py_object_no_sync)(void *py_object, DLManagedTensorVersioned **out);
  /* A Python tensor over a DLPack tensor; takes ownership of it. */
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned *tensor, void **out_py_object);
  /* Fills *out for a Python tensor, valid until control returns to Python;
   * may be NULL. */
  int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
  /* The framework's current stream of a device. */
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_current_stream);
} DLPackExchangeAPI;

#define DLPACK_CAPSULE_NAME "dltensor"
#define DLPACK_USED_CAPSULE_NAME "used_dltensor"
#define DLPACK_VERSIONED_CAPSULE_NAME "dltensor_versioned"
#define DLPACK_USED_VERSIONED_CAPSULE_NAME "used_dltensor_versioned"

#endif /* CGTREE_PY_DLPACK_H */
