/*
 * pat_gpu.c — the CUDA half of a GPU session in libpat: import the daemon's staging range (CUDA
 * IPC) and signal slice (host memory mapped into the device), and enqueue the per-layer hand-off
 * as stream memory operations on the caller's stream (ipc_shm.h, "GPU sessions").
 *
 * The driver API is reached through dlopen("libcuda.so.1") with the few types and constants it
 * needs declared here (values from the CUDA 12/13 driver ABI), so libpat builds without the CUDA
 * toolkit and loads on machines without a driver; only a GPU session needs one. Every call runs
 * in the primary context of the daemon's GPU (pushed and popped around it), the context PyTorch
 * and the runtime API use, so streams the frontend passes in are valid here.
 */
#include "pat_gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct {
    char reserved[64];
} CUipcMemHandle;
typedef struct {
    char bytes[16];
} CUuuid;

#define CU_STREAM_WAIT_VALUE_GEQ                          0x0
#define CU_STREAM_WRITE_VALUE_DEFAULT                     0x0
#define CU_MEMHOSTREGISTER_PORTABLE                       0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP                      0x02
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS                0x1
#define CU_STREAM_CAPTURE_STATUS_NONE                     0
#define CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS 122

/* The driver entry points libpat uses: struct field, exported symbol. */
#define CU_FUNCS(X)                                                                                \
    X(init, "cuInit", (unsigned))                                                                  \
    X(dev_count, "cuDeviceGetCount", (int *))                                                      \
    X(dev_get, "cuDeviceGet", (CUdevice *, int))                                                   \
    X(dev_uuid, "cuDeviceGetUuid_v2", (CUuuid *, CUdevice))                                        \
    X(dev_attr, "cuDeviceGetAttribute", (int *, int, CUdevice))                                    \
    X(ctx_retain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))                             \
    X(ctx_release, "cuDevicePrimaryCtxRelease_v2", (CUdevice))                                     \
    X(ctx_push, "cuCtxPushCurrent_v2", (CUcontext))                                                \
    X(ctx_pop, "cuCtxPopCurrent_v2", (CUcontext *))                                                \
    X(ipc_open, "cuIpcOpenMemHandle_v2", (CUdeviceptr *, CUipcMemHandle, unsigned))                \
    X(ipc_close, "cuIpcCloseMemHandle", (CUdeviceptr))                                             \
    X(host_register, "cuMemHostRegister_v2", (void *, size_t, unsigned))                           \
    X(host_unregister, "cuMemHostUnregister", (void *))                                            \
    X(host_devptr, "cuMemHostGetDevicePointer_v2", (CUdeviceptr *, void *, unsigned))              \
    X(write64, "cuStreamWriteValue64_v2", (CUstream, CUdeviceptr, uint64_t, unsigned))             \
    X(wait64, "cuStreamWaitValue64_v2", (CUstream, CUdeviceptr, uint64_t, unsigned))               \
    X(is_capturing, "cuStreamIsCapturing", (CUstream, int *))                                      \
    X(stream_sync, "cuStreamSynchronize", (CUstream))                                              \
    X(err_string, "cuGetErrorString", (CUresult, const char **))

typedef struct cu_api {
#define CU_FIELD(field, sym, params) CUresult(*field) params;
    CU_FUNCS(CU_FIELD)
#undef CU_FIELD
} cu_api_t;

static cu_api_t cu;
static int cu_state; /* 0 not tried, 1 loaded, < 0 -errno */
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static char cu_why[160];

static void cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cu_why, sizeof(cu_why), "cannot load the CUDA driver (libcuda.so.1): %s",
                 dlerror());
        cu_state = -ENOSYS;
        return;
    }
#define CU_SYM(field, sym, params)                                                                 \
    if (!(*(void **)&cu.field = dlsym(h, sym))) {                                                  \
        snprintf(cu_why, sizeof(cu_why), "the CUDA driver lacks %s (too old?)", sym);              \
        cu_state = -ENOSYS;                                                                        \
        return;                                                                                    \
    }
    CU_FUNCS(CU_SYM)
#undef CU_SYM
    CUresult r = cu.init(0);
    if (r != 0) {
        snprintf(cu_why, sizeof(cu_why), "cuInit failed (CUresult %d): no usable GPU", r);
        cu_state = -ENODEV;
        return;
    }
    cu_state = 1;
}

struct pat_gpu {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr ipc_base; /* the whole exported allocation */
    uint8_t *staging;     /* this session's range */
    void *sig_host;
    CUdeviceptr sig_dev;
    int sig_registered;
    char err[160];
};

static int fail(pat_gpu_t *g, const char *what, CUresult r)
{
    const char *s = NULL;
    if (cu.err_string(r, &s) != 0 || !s)
        s = "unknown error";
    snprintf(g->err, sizeof(g->err), "%s: %s (CUresult %d)", what, s, r);
    return -EIO;
}

const char *pat__gpu_error(const pat_gpu_t *g)
{
    return g ? g->err : cu_why;
}

void pat__gpu_close(pat_gpu_t *g)
{
    if (!g)
        return;
    if (g->ctx && cu.ctx_push(g->ctx) == 0) {
        if (g->sig_registered)
            cu.host_unregister(g->sig_host);
        if (g->ipc_base)
            cu.ipc_close(g->ipc_base);
        CUcontext popped;
        cu.ctx_pop(&popped);
    }
    if (g->ctx)
        cu.ctx_release(g->dev);
    free(g);
}

int pat__gpu_open(const uint8_t uuid[16], const uint8_t handle[64], uint64_t dev_off,
                  uint64_t dev_bytes, void *sig_host, uint64_t sig_bytes, pat_gpu_t **ret,
                  char *why, size_t why_len)
{
    pthread_once(&cu_once, cu_load);
    if (cu_state < 0) {
        snprintf(why, why_len, "%s", cu_why);
        return cu_state;
    }
    pat_gpu_t *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    int n = 0, found = 0, rc = -EIO;
    CUresult r = cu.dev_count(&n);
    for (int i = 0; r == 0 && i < n && !found; i++) {
        CUuuid u;
        if ((r = cu.dev_get(&g->dev, i)) == 0 && (r = cu.dev_uuid(&u, g->dev)) == 0)
            found = memcmp(u.bytes, uuid, 16) == 0;
    }
    if (r != 0) {
        rc = fail(g, "enumerating GPUs", r);
        goto out;
    }
    if (!found) {
        snprintf(g->err, sizeof(g->err),
                 "patd's GPU is not visible to this process (check CUDA_VISIBLE_DEVICES)");
        rc = -ENODEV;
        goto out;
    }
    int memops = 0;
    if ((r = cu.dev_attr(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, g->dev)) !=
        0) {
        rc = fail(g, "cuDeviceGetAttribute", r);
        goto out;
    }
    if (!memops) {
        snprintf(g->err, sizeof(g->err), "the GPU has no 64-bit stream memory operations");
        rc = -ENOTSUP;
        goto out;
    }
    if ((r = cu.ctx_retain(&g->ctx, g->dev)) != 0) {
        g->ctx = NULL;
        rc = fail(g, "retaining the primary context", r);
        goto out;
    }
    if ((r = cu.ctx_push(g->ctx)) != 0) {
        rc = fail(g, "cuCtxPushCurrent", r);
        goto out;
    }
    CUipcMemHandle h;
    memcpy(h.reserved, handle, 64);
    if ((r = cu.ipc_open(&g->ipc_base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
        g->ipc_base = 0;
        rc = fail(g, "opening patd's staging memory (cuIpcOpenMemHandle)", r);
    } else if ((r = cu.host_register(sig_host, sig_bytes,
                                     CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)) !=
               0) {
        rc = fail(g, "mapping the signal words into the GPU (cuMemHostRegister)", r);
    } else {
        g->sig_registered = 1;
        if ((r = cu.host_devptr(&g->sig_dev, sig_host, 0)) != 0)
            rc = fail(g, "cuMemHostGetDevicePointer", r);
        else
            rc = 0;
    }
    g->sig_host = sig_host;
    g->staging = (uint8_t *)(uintptr_t)(g->ipc_base + dev_off);
    (void)dev_bytes;
    CUcontext popped;
    cu.ctx_pop(&popped);
out:
    if (rc < 0) {
        snprintf(why, why_len, "%s", g->err);
        pat__gpu_close(g);
        return rc;
    }
    *ret = g;
    return 0;
}

uint8_t *pat__gpu_staging(const pat_gpu_t *g)
{
    return g->staging;
}

static CUdeviceptr dev_addr(const pat_gpu_t *g, const void *host)
{
    return g->sig_dev + (CUdeviceptr)((const uint8_t *)host - (const uint8_t *)g->sig_host);
}

int pat__gpu_handoff(pat_gpu_t *g, void *stream, uint64_t *ready, uint64_t *done, uint64_t v,
                     int last)
{
    CUstream s = stream;
    CUresult r = cu.ctx_push(g->ctx);
    if (r != 0)
        return fail(g, "cuCtxPushCurrent", r);
    const CUdeviceptr rd = dev_addr(g, ready), dn = dev_addr(g, done);
    /* the default write orders every earlier write of the stream (Q, K, V) before it */
    if ((r = cu.write64(s, rd, v, CU_STREAM_WRITE_VALUE_DEFAULT)) != 0)
        fail(g, "cuStreamWriteValue64 (ready)", r);
    else if ((r = cu.wait64(s, dn, v, CU_STREAM_WAIT_VALUE_GEQ)) != 0)
        fail(g, "cuStreamWaitValue64 (done)", r);
    else if (last && (r = cu.write64(s, dn, 0, CU_STREAM_WRITE_VALUE_DEFAULT)) != 0)
        fail(g, "cuStreamWriteValue64 (done reset)", r);
    CUcontext popped;
    cu.ctx_pop(&popped);
    return r ? -EIO : 0;
}

int pat__gpu_capturing(pat_gpu_t *g, void *stream)
{
    int st = 0;
    CUresult r = cu.ctx_push(g->ctx);
    if (r != 0)
        return fail(g, "cuCtxPushCurrent", r);
    r = cu.is_capturing((CUstream)stream, &st);
    CUcontext popped;
    cu.ctx_pop(&popped);
    if (r != 0)
        return fail(g, "cuStreamIsCapturing", r);
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int pat__gpu_sync(pat_gpu_t *g, void *stream)
{
    CUresult r = cu.ctx_push(g->ctx);
    if (r != 0)
        return fail(g, "cuCtxPushCurrent", r);
    r = cu.stream_sync((CUstream)stream);
    CUcontext popped;
    cu.ctx_pop(&popped);
    return r ? fail(g, "cuStreamSynchronize", r) : 0;
}
