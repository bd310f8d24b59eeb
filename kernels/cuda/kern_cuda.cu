/*
 * kern_cuda.cu — the cuda backend behind kern.h: its life (the device KV pool, lane 0, the forward
 * kernel's registration and warm-up), what it tells the scheduler (the tile table and time-model
 * rates of this GPU), and the device services of the GPU data path (host mapping, allocations
 * shared with one client by descriptor, MPS and UUID, the sticky-error check). The work itself
 * lives in kern_cuda_attn.cu (plans), kern_cuda_kv.cu (KV memory) and kern_cuda_lane.cu (lanes);
 * kern_cuda_int.h maps them.
 *
 * Everything is allocated at create: the pool (one allocation, [layer][block][K|V][kv_head]
 * [block_size][head_dim]; with kern_config_t.pool_keep one of the driver's virtual memory
 * management, exported as a POSIX descriptor, or an earlier one imported from its descriptor
 * and mapped as it is) and lane 0. The forward kernel is launched once at create on an empty
 * CTA, so no module loads lazily behind a queued GPU-side wait (with lazy loading such a first
 * launch can hang for ever; patd also sets CUDA_MODULE_LOADING=EAGER). Calls enqueue and
 * return; kern_sync waits. A CUDA error returns -EIO with the error printed, never aborts.
 */
#include "kern_cuda_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

namespace kcuda
{

int kern_cuda_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "<3>kern_cuda: %s: %s\n", what, cudaGetErrorString(e));
    return -EIO;
}

int kern_cuda_fail_cu(const char *what, CUresult e)
{
    fprintf(stderr, "<3>kern_cuda: %s: CUresult %d\n", what, (int)e);
    return -EIO;
}

bool driver_entry(const char *name, void **fn)
{
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !*fn) {
        cudaGetLastError();
        return false;
    }
    return true;
}

int fwd_register(uint32_t head_dim, FwdVariant (&v)[2])
{
    switch (head_dim) { /* the closed set, KERN_HEAD_DIMS */
#define KCUDA_FWD_REGISTER_CASE(d)                                                                 \
    case d:                                                                                        \
        return fwd_register_d##d(v);
        KERN_HEAD_DIMS(KCUDA_FWD_REGISTER_CASE)
#undef KCUDA_FWD_REGISTER_CASE
    }
    return -ENOTSUP;
}

} // namespace kcuda

using namespace kcuda;

namespace
{

/* Work items of the forward kernel resident per SM (0 on an error). */
int fwd_resident(const FwdVariant &v)
{
    int resident = 0;
    if (!v.fn || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, v.fn, KCUDA_THREADS,
                                                               v.smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return resident;
}

void cuda_tiles(const kern_backend_t *b, sched_tiles_t *ret)
{
    const Cuda *c = reinterpret_cast<const Cuda *>(b);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, c->device) != cudaSuccess) {
        cudaGetLastError();
        prop.name[0] = 0;
        prop.multiProcessorCount = 0;
    }
    kern_cuda_tiles_for(prop.name, c->fwd.pair_fn != nullptr, ret);
    /* slots: the work items the device holds at once; fill: about 4 waves of them when a plan
     * has fewer items (the time model keeps the fill split only where it pays) */
    const uint32_t slots = (uint32_t)(prop.multiProcessorCount * fwd_resident(c->fwd));
    ret->cost.slots = slots;
    if (c->base.cfg.merge == KERN_MERGE_INSIDE)
        ret->cost.merge_us = 0; /* no merge launch: the last CTA of a token merges it */
    if (c->max_m > KCUDA_SMALL_M && ret->n_m < SCHED_MAX_TILE_M) {
        ret->m[ret->n_m++] = (uint16_t)c->max_m; /* the pair kernel's two warpgroups */
        ret->item = kcuda_pack_item;             /* how plan_upload lays out the CTAs */
    }
    if (ret->min_ctas == 0)
        ret->min_ctas = 4 * slots;
}

/* Reserves an address range of size bytes, maps allocation h there and grants read-write access
 * to the device, and with host_too to this process's CPU on the NUMA node nearest it (v.numa).
 * On failure nothing is left reserved or mapped and *what names the call that failed. */
static CUresult vmm_map(const VmmApi &v, CUmemGenericAllocationHandle h, size_t size, int device,
                        bool host_too, CUdeviceptr *ret, const char **what)
{
    CUdeviceptr va = 0;
    *what = "cuMemAddressReserve";
    CUresult r = v.reserve(&va, size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        return r;
    *what = "cuMemMap";
    if ((r = v.map(va, size, 0, h, 0)) == CUDA_SUCCESS) {
        CUmemAccessDesc a[2];
        memset(a, 0, sizeof(a));
        a[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a[0].location.id = device;
        a[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        a[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        a[1].location.id = v.numa;
        a[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        *what = "cuMemSetAccess";
        if ((r = v.access(va, size, a, host_too ? 2 : 1)) == CUDA_SUCCESS) {
            *ret = va;
            return r;
        }
        v.unmap(va, size);
    }
    v.addr_free(va, size);
    return r;
}

/* A shared allocation's properties: device memory of this GPU, or pinned host memory of the NUMA
 * node nearest to it (numa; 0 where the system has no NUMA), exportable as a descriptor */
static CUmemAllocationProp share_prop(int device, bool host, int numa)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = host ? numa : device;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

/* The virtual memory management entry points and the device's allocation granularity, once at
 * create; a driver or device without them leaves vmm.granularity 0 (kern_share_alloc: -ENOTSUP) */
static void load_vmm(Cuda *c)
{
    VmmApi &v = c->vmm;
    auto entry = [](const char *name, void *fn) { return driver_entry(name, (void **)fn); };
    if (!entry("cuMemGetAllocationGranularity", &v.gran) || !entry("cuMemCreate", &v.create) ||
        !entry("cuMemExportToShareableHandle", &v.exp) ||
        !entry("cuMemImportFromShareableHandle", &v.imp) ||
        !entry("cuMemAddressReserve", &v.reserve) || !entry("cuMemMap", &v.map) ||
        !entry("cuMemSetAccess", &v.access) || !entry("cuMemUnmap", &v.unmap) ||
        !entry("cuMemRelease", &v.release) || !entry("cuMemAddressFree", &v.addr_free))
        return;
    int ok = 0;
    if (cudaDeviceGetAttribute(
            &ok, (cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            c->device) != cudaSuccess ||
        !ok) {
        cudaGetLastError();
        return;
    }
    CUmemAllocationProp p = share_prop(c->device, false, 0);
    size_t g = 0;
    if (v.gran(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS)
        v.granularity = g;
    /* host memory by the same calls (KERN_SHARE_HOST): CUDA 12.2 drivers and later */
    int host = 0, numa = -1;
    if (cudaDeviceGetAttribute(
            &host,
            (cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            c->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&numa, (cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID,
                               c->device) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    v.numa = numa < 0 ? 0 : numa;
    p = share_prop(c->device, true, v.numa);
    g = 0;
    if (host && v.gran(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS)
        v.host_granularity = g;
}

int cuda_share_alloc(kern_backend_t *b, uint64_t bytes, unsigned flags, kern_share_t *ret)
{
    Cuda *c = as_cuda(b);
    const VmmApi &v = c->vmm;
    const bool host = flags & KERN_SHARE_HOST;
    const size_t gran = host ? v.host_granularity : v.granularity;
    if (!gran)
        return -ENOTSUP;
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    const size_t size = (bytes + gran - 1) / gran * gran;
    const CUmemAllocationProp p = share_prop(c->device, host, v.numa);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = v.create(&h, size, &p, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return -ENOMEM;
    if (r != CUDA_SUCCESS)
        return kern_cuda_fail_cu("cuMemCreate", r);
    CUdeviceptr va = 0;
    int fd = -1;
    const char *what;
    if ((r = vmm_map(v, h, size, c->device, host, &va, &what)) == CUDA_SUCCESS) {
        what = "cuMemExportToShareableHandle";
        if ((r = v.exp(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) == CUDA_SUCCESS) {
            if (host) /* fresh pages from the driver; zeroed here all the same */
                memset(reinterpret_cast<void *>(va), 0, size);
            ret->dev = reinterpret_cast<void *>(va);
            ret->map_bytes = size;
            ret->fd = fd;
            ret->handle = (uint64_t)h;
            return 0;
        }
        v.unmap(va, size);
        v.addr_free(va, size);
    }
    v.release(h);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : kern_cuda_fail_cu(what, r);
}

void cuda_share_free(kern_backend_t *b, kern_share_t *s)
{
    Cuda *c = as_cuda(b);
    const VmmApi &v = c->vmm;
    const CUdeviceptr va = reinterpret_cast<CUdeviceptr>(s->dev);
    cudaSetDevice(c->device);
    /* a failure here leaves the allocation mapped in the daemon until exit: logged, not fatal */
    CUresult r = v.unmap(va, s->map_bytes);
    if (r == CUDA_SUCCESS)
        r = v.addr_free(va, s->map_bytes);
    if (r != CUDA_SUCCESS)
        kern_cuda_fail_cu("cuMemUnmap", r);
    if ((r = v.release((CUmemGenericAllocationHandle)s->handle)) != CUDA_SUCCESS)
        kern_cuda_fail_cu("cuMemRelease", r);
}

int cuda_device_info(kern_backend_t *b, int *ret_mps, uint8_t ret_uuid[16])
{
    Cuda *c = as_cuda(b);
    int mps = 0;
    KC_TRY(cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, c->device), "MPS attribute");
    cudaDeviceProp prop;
    KC_TRY(cudaGetDeviceProperties(&prop, c->device), "cudaGetDeviceProperties");
    *ret_mps = mps;
    memcpy(ret_uuid, prop.uuid.bytes, 16);
    return 0;
}

int cuda_fatal(kern_backend_t *b, char *why, uint32_t why_len)
{
    Cuda *c = as_cuda(b);
    cudaError_t e = cudaStreamQuery(c->lane0.main);
    if (e == cudaSuccess || e == cudaErrorNotReady)
        return 0;
    cudaGetLastError(); /* a non-sticky error is gone after this; a sticky one stays */
    cudaError_t again = cudaStreamQuery(c->lane0.main);
    if (again == cudaSuccess || again == cudaErrorNotReady)
        return 0;
    snprintf(why, why_len, "%s (%s)", cudaGetErrorName(again), cudaGetErrorString(again));
    return -EIO;
}

/* ------------------------------------------------------------------ lifetime */

void cuda_destroy(kern_backend_t *b)
{
    Cuda *c = as_cuda(b);
    cudaSetDevice(c->device);
    lane_done(&c->lane0);
    if (c->cow_done)
        cudaEventDestroy(c->cow_done);
    pthread_mutex_destroy(&c->cow_mu);
    if (c->pool_h) { /* the memory lives on while another process holds a descriptor of it */
        const CUdeviceptr va = reinterpret_cast<CUdeviceptr>(c->pool);
        if (c->pool) {
            c->vmm.unmap(va, c->pool_map);
            c->vmm.addr_free(va, c->pool_map);
        }
        c->vmm.release(c->pool_h);
    } else
        cudaFree(c->pool);
    if (c->pool_fd >= 0)
        close(c->pool_fd);
    free(c);
}

/* kern_config_t.pool_keep: the pool (bytes) as one allocation of the virtual memory management,
 * fd < 0: new, exported as a descriptor, zeroed; else imported from fd and mapped as it is (an
 * allocation smaller than this pool fails the map). 0, -ENOTSUP (no virtual memory management
 * with POSIX descriptors here), -ENOMEM, -EINVAL (fd names no allocation, or one too small), or
 * -EIO. */
int pool_vmm(Cuda *c, int fd, size_t bytes)
{
    const VmmApi &v = c->vmm;
    if (!v.granularity)
        return -ENOTSUP;
    const size_t size = (bytes + v.granularity - 1) / v.granularity * v.granularity;
    const CUmemAllocationProp p = share_prop(c->device, false, 0);
    CUresult r;
    if (fd < 0) {
        if ((r = v.create(&c->pool_h, size, &p, 0)) != CUDA_SUCCESS)
            return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : kern_cuda_fail_cu("cuMemCreate", r);
        if ((r = v.exp(&c->pool_fd, c->pool_h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) !=
            CUDA_SUCCESS)
            return kern_cuda_fail_cu("cuMemExportToShareableHandle (the pool)", r);
    } else {
        r = v.imp(&c->pool_h, reinterpret_cast<void *>(static_cast<uintptr_t>(fd)),
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != CUDA_SUCCESS) {
            c->pool_h = 0;
            fprintf(stderr,
                    "<4>kern_cuda: the pool's descriptor names no allocation of this "
                    "device (cuMemImportFromShareableHandle: CUresult %d)\n",
                    (int)r);
            return -EINVAL;
        }
        if ((c->pool_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0)
            return -errno;
    }
    CUdeviceptr va = 0;
    const char *what;
    if ((r = vmm_map(v, c->pool_h, size, c->device, false, &va, &what)) != CUDA_SUCCESS) {
        if (fd < 0 || strcmp(what, "cuMemMap"))
            return kern_cuda_fail_cu(what, r);
        fprintf(stderr,
                "<4>kern_cuda: the pool given back does not map as %zu bytes (CUresult "
                "%d): another pool's\n",
                size, (int)r);
        return -EINVAL;
    }
    c->pool = reinterpret_cast<void *>(va);
    c->pool_map = size;
    return 0;
}

/* One launch of the forward kernel on an empty plan CTA (no rows, no KV) and one append: loads
 * every module now. The pool is as it was after: an adopted one holds KV (its first block, which
 * the append writes, is kept aside and put back). */
int warm_kernels(Cuda *c)
{
    kcuda_cta_t *dcta;
    cudaStream_t st = c->lane0.main;
    const kern_model_t &m = c->base.cfg.model;
    /* the CTA; the merge's row of output; the first block of layer 0 */
    const size_t row = (size_t)m.q_heads * m.head_dim * sizeof(float);
    const size_t first = c->base.layout.block * c->base.layout.elt;
    KC_TRY(cudaMalloc(&dcta, sizeof(*dcta) + row + first), "warm-up alloc");
    uint8_t *o_row = reinterpret_cast<uint8_t *>(dcta) + sizeof(*dcta);
    uint8_t *kept = o_row + row;
    cudaError_t me = cudaMemsetAsync(dcta, 0, sizeof(*dcta), st);
    if (me == cudaSuccess)
        me = cudaMemcpyAsync(kept, c->pool, first, cudaMemcpyDeviceToDevice, st);
    if (me != cudaSuccess) {
        cudaFree(dcta);
        return kern_cuda_fail("warm-up memset", me);
    }
    FwdArgs a = {};
    a.ctas = dcta;
    a.q = a.kv = c->pool;
    a.o = o_row;
    a.q_heads = a.kv_heads = a.group = 1;
    a.scale = 1.f;
    void *args[] = {&a};
    int r = 0;
    cudaError_t e =
        cudaLaunchKernel(c->fwd.fn, dim3(1), dim3(KCUDA_THREADS), args, (size_t)c->fwd.smem, st);
    if (e != cudaSuccess)
        r = kern_cuda_fail("warm-up launch", e);
    /* the merge kernel, on a zero-part merge entry: writes one zero row (o_row) */
    a.merges = reinterpret_cast<const sched_plan_merge_t *>(dcta); /* 32 zero bytes */
    e = r == 0 ? cudaLaunchKernel(c->fwd.merge_fn, dim3(1), dim3(128), args, 0, st) : cudaSuccess;
    if (e != cudaSuccess)
        r = kern_cuda_fail("warm-up merge launch", e);
    /* the append kernel: one token into slot 0, then the block as it was */
    if (r == 0) {
        uint32_t slot0 = 0;
        if ((r = slots_upload(&c->lane0, &slot0, 1)) == 0)
            r = append_on(&c->lane0, 0, c->pool, c->pool, 1);
        if (r == 0 && (e = cudaMemcpyAsync(c->pool, kept, first, cudaMemcpyDeviceToDevice, st)) !=
                          cudaSuccess)
            r = kern_cuda_fail("warm-up restore", e);
    }
    e = cudaStreamSynchronize(st);
    if (r == 0 && e != cudaSuccess)
        r = kern_cuda_fail("warm-up", e);
    cudaFree(dcta);
    return r;
}

/* The pool as fwd_pair's TMA loads see it (FwdArgs.kv_map): dims, innermost first, D x 16 tokens
 * x kv_heads x K|V x (layers x blocks); a box is one page of one head, 64 columns (128 bytes, the
 * wgmma swizzle's row). 0, or -ENOTSUP where the driver has no cuTensorMapEncodeTiled (then the
 * kernel loads by cp.async). */
int encode_kv_map(Cuda *c)
{
    using EncodeFn = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static_assert(sizeof(CUtensorMap) == sizeof(c->kv_map), "the map's bytes");
    const kern_model_t &m = c->base.cfg.model;
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        cudaGetLastError();
        return -ENOTSUP;
    }
    if ((uint64_t)c->base.cfg.n_blocks * m.n_layers > INT32_MAX)
        return -ENOTSUP; /* the block coordinate is a signed 32-bit int */
    /* the pool's layout as the map's strides: token, KV head, K|V, block (across layers) */
    const kern_layout_t &lo = c->base.layout;
    const uint64_t e = lo.elt;
    const cuuint64_t dims[5] = {m.head_dim, m.block_size, m.kv_heads, 2,
                                (cuuint64_t)c->base.cfg.n_blocks * m.n_layers};
    const cuuint64_t strides[4] = {lo.token * e, lo.head * e, lo.kv * e, lo.block * e};
    const cuuint32_t box[5] = {64, m.block_size, 1, 1, 1}, unit[5] = {1, 1, 1, 1, 1};
    CUtensorMap map;
    CUresult r = reinterpret_cast<EncodeFn>(fn)(
        &map, c->dt == 0 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5,
        c->pool, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        kern_cuda_fail_cu("cuTensorMapEncodeTiled (the KV pool)", r);
        return -ENOTSUP;
    }
    memcpy(c->kv_map, &map, sizeof(map));
    return 0;
}

/* How many GPUs the NVIDIA driver has on this host, whatever CUDA_VISIBLE_DEVICES shows this
 * process: one folder per GPU under /proc/driver/nvidia/gpus (-1: no such folder). */
static int host_gpus(void)
{
    DIR *dir = opendir("/proc/driver/nvidia/gpus");
    if (!dir)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

int cuda_probe(int device, kern_probe_t *p)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    char visible[64];
    snprintf(visible, sizeof(visible), "CUDA_VISIBLE_DEVICES=%s", vis ? vis : "(unset)");
    int drv = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0) {
        cudaGetLastError();
        snprintf(p->why, sizeof(p->why),
                 "no NVIDIA driver on this host (libcuda.so.1 could not be loaded)");
        return -ENODEV;
    }
    p->driver_present = 1;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e == cudaErrorInsufficientDriver) {
        cudaGetLastError();
        snprintf(p->why, sizeof(p->why),
                 "the NVIDIA driver supports CUDA %d.%d and this build needs %d.%d or newer "
                 "(upgrade the driver)",
                 drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        return -EPROTO;
    }
    if (e != cudaSuccess && e != cudaErrorNoDevice) {
        cudaGetLastError();
        snprintf(p->why, sizeof(p->why), "the CUDA runtime cannot start: %s (%s)",
                 cudaGetErrorString(e), visible);
        return -ENODEV;
    }
    if (e != cudaSuccess || device < 0 || device >= n_dev) {
        cudaGetLastError();
        int host = host_gpus();
        snprintf(p->why, sizeof(p->why),
                 "no CUDA device %d: this process sees %d (%s; the driver has %d GPU%s on this "
                 "host)",
                 device, e == cudaSuccess ? n_dev : 0, visible, host < 0 ? 0 : host,
                 host == 1 ? "" : "s");
        return -ENODEV;
    }
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(p->why, sizeof(p->why), "CUDA device %d: %s", device, cudaGetErrorString(e));
        return -ENODEV;
    }
    snprintf(p->device, sizeof(p->device), "%.60s (cuda:%d, sm_%d%d)", prop.name, device,
             prop.major, prop.minor);
    memcpy(p->uuid, prop.uuid.bytes, sizeof(p->uuid));
    p->driver = (uint32_t)drv;
    if (prop.major < 8) { /* mma.sync m16n8k16 bf16 and cp.async need sm_80 */
        snprintf(p->why, sizeof(p->why), "%.90s is sm_%d%d; the cuda backend needs sm_80 or newer",
                 p->device, prop.major, prop.minor);
        return -ENOTSUP;
    }
    size_t free_b = 0, total_b = 0;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(p->why, sizeof(p->why), "%.90s: cannot create a context: %.80s", p->device,
                 cudaGetErrorString(e));
        return -ENODEV;
    }
    p->mem_total = total_b;
    p->mem_free = free_b;
    return 0;
}

int cuda_create(const kern_config_t *cfg, kern_backend_t **ret)
{
    const kern_model_t &m = cfg->model;
    if (m.dtype != KERN_F16 && m.dtype != KERN_BF16)
        return -ENOTSUP; /* fp32 KV is the cpu backend's (reference) only */
    if (!kern_kv_dtype_ok(&m))
        return -ENOTSUP;
    if (cfg->n_blocks > UINT32_MAX / KERN_BLOCK_SIZE)
        return -EINVAL; /* the forward keeps block * KERN_BLOCK_SIZE + offset in 32 bits */
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || cfg->device < 0 || cfg->device >= n_dev) {
        cudaGetLastError();
        return -ENODEV;
    }
    cudaDeviceProp prop;
    KC_TRY(cudaGetDeviceProperties(&prop, cfg->device), "cudaGetDeviceProperties");
    if (prop.major < 8)
        return -ENOTSUP; /* mma.sync m16n8k16 bf16 and cp.async need sm_80 */
    KC_TRY(cudaSetDevice(cfg->device), "cudaSetDevice");

    Cuda *c = static_cast<Cuda *>(calloc(1, sizeof(Cuda)));
    if (!c)
        return -ENOMEM;
    c->base.cfg = *cfg;
    c->device = cfg->device;
    c->dt = m.dtype == KERN_F16 ? 0 : 1;
    c->kv8 = kern_kv_fp8(&m) ? (int)kern_kv_dtype(&m) : 0;
    c->base.layout = kern_layout(&m, cfg->n_blocks);
    c->pool_fd = -1;
    pthread_mutex_init(&c->cow_mu, NULL);
    load_vmm(c);
    int r = -ENOMEM;
    FwdVariant v[2] = {};
    if (cfg->pool_keep) {
        if ((r = pool_vmm(c, cfg->pool_fd, kern_layout_pool_bytes(&c->base.layout))) < 0)
            goto fail;
    } else if (cudaMalloc(&c->pool, kern_layout_pool_bytes(&c->base.layout)) != cudaSuccess)
        goto fail; /* device memory may legitimately not suffice: -ENOMEM */
    r = -EIO;
    /* zero, so that every slot holds finite values before its first append: the TMA loads copy
     * whole pages, a partial block's unwritten tail too, and a masked score's 0 times a NaN of V
     * would still be NaN (a pool given back holds KV and finite values already) */
    if ((!cfg->pool_keep || cfg->pool_fd < 0) &&
        cudaMemset(c->pool, 0, kern_layout_pool_bytes(&c->base.layout)) != cudaSuccess)
        goto fail;
    r = -ENOMEM;
    if ((r = lane_init(c, &c->lane0)) < 0)
        goto fail;
    r = -EIO;
    if (cudaEventCreateWithFlags(&c->cow_done, cudaEventDisableTiming) != cudaSuccess)
        goto fail;
    if ((r = load_memops(c)) < 0 || (r = fwd_register(m.head_dim, v)) < 0)
        goto fail;
    {
        int sms = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device) !=
                cudaSuccess ||
            sms <= 0)
            goto fail;
        c->n_sms = (uint32_t)sms;
        if (cfg->pair_blocks && cfg->pair_blocks < c->n_sms)
            c->n_sms = cfg->pair_blocks;
    }
    c->fwd = v[c->dt];
    if (cfg->fwd != KERN_FWD_MMA) /* MMA: mma.sync everywhere */
        c->fwd.fn = c->fwd.wg_fn;
    if (cfg->fwd != KERN_FWD_AUTO && cfg->fwd != KERN_FWD_CPASYNC && cfg->fwd != KERN_FWD_TMA)
        c->fwd.pair_fn = nullptr; /* the 4-warp kernels: CTAs of at most 64 rows */
    if (c->kv8) {
        /* an fp8 pool: the same kernels' fp8 twins, which decode each KV tile in shared memory
         * (kern_cuda_fwd.cuh: kv8_decode); none for KERN_FWD_MMA (mma.sync everywhere) and none
         * below sm_89. KERN_FWD_TMA loads by cp.async. */
        const int k = c->kv8 == KERN_FP8_E4M3 ? 0 : 1;
        c->fwd.fn = cfg->fwd == KERN_FWD_MMA ? nullptr : v[c->dt].wg8_fn[k];
        c->fwd.pair_fn = c->fwd.pair_fn ? c->fwd.pair8_fn[k] : nullptr;
        if (!c->fwd.fn) {
            r = -ENOTSUP;
            goto fail;
        }
    }
    c->max_m = c->fwd.pair_fn ? KCUDA_BIG_M : KCUDA_SMALL_M;
    c->tma = c->fwd.pair_fn && !c->kv8 && cfg->fwd == KERN_FWD_TMA && encode_kv_map(c) == 0;
    c->pdl = c->fwd.dep && !cfg->serial_launch;
    if ((r = warm_kernels(c)) < 0)
        goto fail;
    *ret = &c->base;
    return 0;
fail:
    cudaGetLastError(); /* clear a non-sticky allocation error */
    cuda_destroy(&c->base);
    return r;
}

} // namespace

/* ------------------------------------------------------------------ C entry points */

extern "C" void *kern_cuda_stream(kern_backend_t *b)
{
    return as_cuda(b)->lane0.main;
}

extern "C" void *kern_cuda_pool(kern_backend_t *b, uint32_t layer, uint64_t *block_elems)
{
    Cuda *c = as_cuda(b);
    const kern_layout_t &lo = c->base.layout;
    *block_elems = lo.block;
    return static_cast<uint8_t *>(c->pool) + kern_layout_at(&lo, layer, 0, 0, 0, 0) * lo.elt;
}

namespace
{
int cuda_pool_fd(const kern_backend_t *b)
{
    return reinterpret_cast<const Cuda *>(b)->pool_fd;
}
} // namespace

extern "C" const kern_ops_t kern__cuda_ops = {
    "cuda",           cuda_probe,      cuda_create,     cuda_destroy,     cuda_append_kv,
    cuda_copy_blocks, cuda_attend,     cuda_sync,       cuda_tiles,       cuda_lane_create,
    cuda_lane_free,   cuda_lane_begin, cuda_lane_layer, cuda_share_alloc, cuda_share_free,
    cuda_device_info, cuda_fatal,      cuda_pack_begin, cuda_pack_layer,  cuda_lane_trim,
    cuda_pool_fd,
};
