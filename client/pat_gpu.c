/*
 * pat_gpu.c — the CUDA half of a GPU session in libpat: import the session's staging allocation
 * and signal slice (CUDA virtual-memory descriptors the daemon passed beside HELLO: device memory,
 * and host memory that the device and the CPU reach at one address), and enqueue the per-layer
 * hand-off as stream memory operations on the caller's stream (ipc_shm.h, "GPU sessions").
 *
 * The driver API is reached through the shim in pat_cuda_shim.h (dlopen of libcuda.so.1), so
 * libpat builds without the CUDA toolkit and loads on machines without a driver; only a GPU
 * session needs one. Every call runs in the primary context of the daemon's GPU (pushed and
 * popped around it), the context PyTorch and the runtime API use, so streams the frontend passes
 * in are valid here.
 */
#include "pat_gpu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pat_cuda_shim.h"

struct pat_gpu {
    const pat__cu_api_t *cu; /* the driver's entry points */
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr staging; /* the session's allocation, mapped here */
    uint64_t map_bytes;
    CUdeviceptr sig; /* the signal slice (host memory), mapped here for the device and the CPU */
    uint64_t sig_bytes;
    char err[160];
};

static int fail(pat_gpu_t *g, const char *what, CUresult r)
{
    snprintf(g->err, sizeof(g->err), "%s: %s (CUresult %d)", what, pat__cu_strerror(r), r);
    return -EIO;
}

const char *pat__gpu_error(const pat_gpu_t *g)
{
    const char *why = "no GPU session";
    if (g)
        return g->err;
    pat__cu_load(NULL, &why); /* why the driver could not be loaded, if it could not */
    return why;
}

void pat__gpu_close(pat_gpu_t *g)
{
    if (!g)
        return;
    if (g->ctx && g->cu->ctx_push(g->ctx) == 0) {
        /* the caller's streams may still hold this session's hand-offs (a step cut short by the
         * daemon's end, or the last layers of one whose O nobody waited for): they must pass
         * before the memory they wait on and copy from is unmapped, or the device faults in the
         * frontend's context (the caller released every wait first) */
        g->cu->ctx_sync();
        if (g->sig) {
            g->cu->mem_unmap(g->sig, g->sig_bytes);
            g->cu->va_free(g->sig, g->sig_bytes);
        }
        if (g->staging) {
            g->cu->mem_unmap(g->staging, g->map_bytes);
            g->cu->va_free(g->staging, g->map_bytes);
        }
        CUcontext popped;
        g->cu->ctx_pop(&popped);
    }
    if (g->ctx)
        g->cu->ctx_release(g->dev);
    free(g);
}

/* Maps an allocation from descriptor fd: import (a handle of our own), reserve an address range,
 * map, grant the device read-write access (and for host memory the CPU too); the handle is
 * released once mapped (the mapping holds the memory). *ret_va: where. */
static int map_import(pat_gpu_t *g, int fd, uint64_t map_bytes, int host, CUdeviceptr *ret_va)
{
    const char *name = host ? "the signal slice" : "the staging allocation";
    char what_buf[96];
    CUmemGenericAllocationHandle h = 0;
    CUresult r =
        g->cu->mem_import(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != 0) {
        snprintf(what_buf, sizeof(what_buf), "importing %s (cuMemImportFromShareableHandle)", name);
        return fail(g, what_buf, r);
    }
    CUdeviceptr va = 0;
    const char *what = "cuMemAddressReserve";
    if ((r = g->cu->va_reserve(&va, map_bytes, 0, 0, 0)) == 0) {
        snprintf(what_buf, sizeof(what_buf), "mapping %s (cuMemMap)", name);
        what = what_buf;
        if ((r = g->cu->mem_map(va, map_bytes, 0, h, 0)) == 0) {
            /* the host NUMA node's id is ignored in an access descriptor */
            CUmemAccessDesc a[2] = {
                {{CU_MEM_LOCATION_TYPE_DEVICE, g->dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                {{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
            what = "cuMemSetAccess";
            if ((r = g->cu->mem_access(va, map_bytes, a, host ? 2 : 1)) == 0) {
                g->cu->mem_release(h);
                *ret_va = va;
                return 0;
            }
            g->cu->mem_unmap(va, map_bytes);
        }
        g->cu->va_free(va, map_bytes);
    }
    g->cu->mem_release(h);
    return fail(g, what, r);
}

int pat__gpu_open(const uint8_t uuid[16], int staging_fd, uint64_t map_bytes, int sig_fd,
                  uint64_t sig_bytes, pat_gpu_t **ret, char *why, size_t why_len)
{
    int err = 0;
    const char *no_driver = NULL;
    const pat__cu_api_t *api = pat__cu_load(&err, &no_driver);
    if (!api) {
        snprintf(why, why_len, "%s", no_driver);
        return err;
    }
    pat_gpu_t *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->cu = api;
    int n = 0, found = 0, rc = -EIO;
    CUresult r = g->cu->dev_count(&n);
    for (int i = 0; r == 0 && i < n && !found; i++) {
        CUuuid u;
        if ((r = g->cu->dev_get(&g->dev, i)) == 0 && (r = g->cu->dev_uuid(&u, g->dev)) == 0)
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
    if ((r = g->cu->dev_attr(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, g->dev)) !=
        0) {
        rc = fail(g, "cuDeviceGetAttribute", r);
        goto out;
    }
    if (!memops) {
        snprintf(g->err, sizeof(g->err), "the GPU has no 64-bit stream memory operations");
        rc = -ENOTSUP;
        goto out;
    }
    if ((r = g->cu->ctx_retain(&g->ctx, g->dev)) != 0) {
        g->ctx = NULL;
        rc = fail(g, "retaining the primary context", r);
        goto out;
    }
    if ((r = g->cu->ctx_push(g->ctx)) != 0) {
        rc = fail(g, "cuCtxPushCurrent", r);
        goto out;
    }
    if ((rc = map_import(g, staging_fd, map_bytes, 0, &g->staging)) == 0)
        g->map_bytes = map_bytes;
    if (rc == 0 && (rc = map_import(g, sig_fd, sig_bytes, 1, &g->sig)) == 0)
        g->sig_bytes = sig_bytes;
    CUcontext popped;
    g->cu->ctx_pop(&popped);
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
    return (uint8_t *)(uintptr_t)g->staging;
}

void *pat__gpu_sig(const pat_gpu_t *g)
{
    return (void *)(uintptr_t)g->sig;
}

int pat__gpu_handoff(pat_gpu_t *g, void *stream, uint64_t *ready, uint64_t *done, uint64_t v,
                     int last)
{
    CUstream s = stream;
    CUresult r = g->cu->ctx_push(g->ctx);
    if (r != 0)
        return fail(g, "cuCtxPushCurrent", r);
    /* the slice is mapped at one address for the CPU and the device */
    const CUdeviceptr rd = (CUdeviceptr)(uintptr_t)ready, dn = (CUdeviceptr)(uintptr_t)done;
    /* the default write orders every earlier write of the stream (Q, K, V) before it */
    if ((r = g->cu->write64(s, rd, v, CU_STREAM_WRITE_VALUE_DEFAULT)) != 0)
        fail(g, "cuStreamWriteValue64 (ready)", r);
    else if ((r = g->cu->wait64(s, dn, v, CU_STREAM_WAIT_VALUE_GEQ)) != 0)
        fail(g, "cuStreamWaitValue64 (done)", r);
    else if (last && (r = g->cu->write64(s, dn, 0, CU_STREAM_WRITE_VALUE_DEFAULT)) != 0)
        fail(g, "cuStreamWriteValue64 (done reset)", r);
    CUcontext popped;
    g->cu->ctx_pop(&popped);
    return r ? -EIO : 0;
}

int pat__gpu_capturing(pat_gpu_t *g, void *stream)
{
    int st = 0;
    CUresult r = g->cu->ctx_push(g->ctx);
    if (r != 0)
        return fail(g, "cuCtxPushCurrent", r);
    r = g->cu->is_capturing((CUstream)stream, &st);
    CUcontext popped;
    g->cu->ctx_pop(&popped);
    if (r != 0)
        return fail(g, "cuStreamIsCapturing", r);
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int pat__gpu_sync(pat_gpu_t *g, void *stream)
{
    CUresult r = g->cu->ctx_push(g->ctx);
    if (r != 0)
        return fail(g, "cuCtxPushCurrent", r);
    r = g->cu->stream_sync((CUstream)stream);
    CUcontext popped;
    g->cu->ctx_pop(&popped);
    return r ? fail(g, "cuStreamSynchronize", r) : 0;
}
