/*
 * pat_cuda_shim.h — the CUDA driver API as client/ reaches it: dlopen("libcuda.so.1") once per
 * process, with the few types, constants and entry points libpat (pat_gpu.c) and patload
 * (patload/patload_compute.c) use declared here, so neither needs the CUDA toolkit to build and
 * both load on machines without a driver; only GPU work needs one.
 *
 * Internal to client/ (names pat__cu*, hidden in libpat.so like everything not PAT_API). Values
 * are those of the CUDA 12/13 driver ABI (cuda.h); the versioned symbol names (_v2) are the ones
 * cuda.h maps the plain names to, since dlsym sees the exported names, not the macros.
 */
#ifndef PAT_CUDA_SHIM_H
#define PAT_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_* */
    int id;
} CUmemLocation;
typedef struct {
    CUmemLocation location;
    int flags; /* CU_MEM_ACCESS_FLAGS_* */
} CUmemAccessDesc;
typedef struct {
    char bytes[16];
} CUuuid;

#define CU_STREAM_NON_BLOCKING                            0x1
#define CU_STREAM_WAIT_VALUE_GEQ                          0x0
#define CU_STREAM_WRITE_VALUE_DEFAULT                     0x0
#define CU_STREAM_CAPTURE_STATUS_NONE                     0
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR          0x1
#define CU_MEM_LOCATION_TYPE_DEVICE                       0x1
#define CU_MEM_LOCATION_TYPE_HOST_NUMA                    0x3
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE                0x3
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL               9
#define CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS 122

/* The driver entry points client/ uses: struct field, exported symbol, parameters. */
#define PAT__CU_FUNCS(X)                                                                           \
    X(init, "cuInit", (unsigned))                                                                  \
    X(dev_count, "cuDeviceGetCount", (int *))                                                      \
    X(dev_get, "cuDeviceGet", (CUdevice *, int))                                                   \
    X(dev_name, "cuDeviceGetName", (char *, int, CUdevice))                                        \
    X(dev_uuid, "cuDeviceGetUuid_v2", (CUuuid *, CUdevice))                                        \
    X(dev_attr, "cuDeviceGetAttribute", (int *, int, CUdevice))                                    \
    X(ptr_attr, "cuPointerGetAttribute", (void *, int, CUdeviceptr))                               \
    X(ctx_retain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))                             \
    X(ctx_release, "cuDevicePrimaryCtxRelease_v2", (CUdevice))                                     \
    X(ctx_push, "cuCtxPushCurrent_v2", (CUcontext))                                                \
    X(ctx_pop, "cuCtxPopCurrent_v2", (CUcontext *))                                                \
    X(mem_alloc, "cuMemAlloc_v2", (CUdeviceptr *, size_t))                                         \
    X(mem_free, "cuMemFree_v2", (CUdeviceptr))                                                     \
    X(htod, "cuMemcpyHtoD_v2", (CUdeviceptr, const void *, size_t))                                \
    X(mem_import, "cuMemImportFromShareableHandle", (CUmemGenericAllocationHandle *, void *, int)) \
    X(va_reserve, "cuMemAddressReserve",                                                           \
      (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                            \
    X(va_free, "cuMemAddressFree", (CUdeviceptr, size_t))                                          \
    X(mem_map, "cuMemMap",                                                                         \
      (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))             \
    X(mem_unmap, "cuMemUnmap", (CUdeviceptr, size_t))                                              \
    X(mem_access, "cuMemSetAccess", (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))        \
    X(mem_release, "cuMemRelease", (CUmemGenericAllocationHandle))                                 \
    X(stream_create, "cuStreamCreate", (CUstream *, unsigned))                                     \
    X(stream_destroy, "cuStreamDestroy_v2", (CUstream))                                            \
    X(stream_sync, "cuStreamSynchronize", (CUstream))                                              \
    X(ctx_sync, "cuCtxSynchronize", (void))                                                        \
    X(is_capturing, "cuStreamIsCapturing", (CUstream, int *))                                      \
    X(write64, "cuStreamWriteValue64_v2", (CUstream, CUdeviceptr, uint64_t, unsigned))             \
    X(wait64, "cuStreamWaitValue64_v2", (CUstream, CUdeviceptr, uint64_t, unsigned))               \
    X(err_string, "cuGetErrorString", (CUresult, const char **))

typedef struct pat__cu_api {
#define PAT__CU_FIELD(field, sym, params) CUresult(*field) params;
    PAT__CU_FUNCS(PAT__CU_FIELD)
#undef PAT__CU_FIELD
} pat__cu_api_t;

/* Loads the driver and calls cuInit(0), once per process (thread-safe; the library stays loaded
 * until exit). Returns the entry points, or NULL when there is none to be had; then, if why is
 * not NULL, *why says why (a static string) and *ret_err is -ENOSYS (no driver, or one lacking an
 * entry point: too old) or -ENODEV (cuInit failed: no usable GPU). Any thread. */
const pat__cu_api_t *pat__cu_load(int *ret_err, const char **why);

/* The driver's name for r, or "unknown CUDA error" (no driver). Any thread. */
const char *pat__cu_strerror(CUresult r);

#endif
