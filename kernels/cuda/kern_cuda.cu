/*
 * kern_cuda.cu — the cuda backend behind kern.h: the device KV pool, KV append, copy-on-write
 * block copies, and the execution of a plan (forward per tile-shape group, fanned out over side
 * streams and joined with events, then the merge on the backend's stream).
 *
 * Everything is allocated at create: the pool (one allocation, [layer][block][K|V][kv_head]
 * [block_size][head_dim]), the fp32 partials, two pinned + device plan buffers (double-buffered:
 * a new plan is copied while the previous one may still be read by queued kernels; an event per
 * buffer says when its pinned side may be rewritten), the slot buffers of append, the streams and
 * events. Each forward variant is launched once at create on an empty CTA, so no module loads
 * lazily behind a queued GPU-side wait (DESIGN.md §2). Calls enqueue and return; kern_sync waits.
 *
 * A plan is uploaded only when it differs from the last one (memcmp of its bytes: the daemon calls
 * attend once per layer with the same plan). Launches are checked with cudaGetLastError; a CUDA
 * error returns -EIO with the error printed, never aborts.
 *
 * Lanes (kern.h, the GPU data path): what one step in flight needs of its own — streams, fork and
 * join events, the plan and slot buffers, the partials and a host-mapped progress word — so that
 * a step whose stream waits on its client's ready word never holds up another client's step. The
 * backend's own calls (kern_append_kv, kern_attend) run on lane 0, which never waits on a client.
 * Handshakes are 64-bit stream memory operations (cuStreamWaitValue64 / cuStreamWriteValue64,
 * taken from the driver with cudaGetDriverEntryPointByVersion: no link against libcuda).
 */
#include "kern_cuda_int.h"

#include <cuda.h>
#include <pthread.h>

extern "C" {
#include "kern_int.h"
}

#include <algorithm>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace kcuda
{

int kern_cuda_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "<3>kern_cuda: %s: %s\n", what, cudaGetErrorString(e));
    return -EIO;
}

} // namespace kcuda

using namespace kcuda;

#define CK(call, what)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return kern_cuda_fail(what, e_);                                                       \
    } while (0)

namespace
{

constexpr int kShapeM[kNumShapes] = {16, 16, 32, 32, 64, 64, 128, 128};
constexpr int kShapeN[kNumShapes] = {64, 128, 64, 128, 64, 128, 64, 128};
constexpr int kTileMs[4] = {16, 32, 64, 128};

struct PlanBuf {
    uint8_t *host; /* pinned */
    uint8_t *dev;
    cudaEvent_t copied; /* the H2D copy from host has completed */
    bool used;
};

typedef CUresult (*WaitValue64Fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*WriteValue64Fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

struct Cuda;

/* One step's private execution context (see the top of the file). */
struct Lane {
    kern_lane_t base; /* progress -> progress_host */
    Cuda *c;
    uint64_t *progress_host; /* pinned, mapped; written by the stream */
    uint64_t *progress_dev;
    float *part_o, *part_lse;
    PlanBuf plan[2];
    int cur;           /* plan[cur] holds the last uploaded plan */
    uint8_t *last;     /* host copy of it, for the unchanged test */
    uint32_t last_len; /* 0: none */
    uint32_t *slot_host, *slot_dev;
    uint32_t n_slots; /* slots of the step last begun */
    cudaEvent_t slot_copied;
    bool slot_used;
    cudaStream_t main;
    cudaStream_t side[KERN_MAX_STREAMS];
    cudaEvent_t fork, join[KERN_MAX_STREAMS];
    uint32_t n_side;
};

struct Cuda {
    kern_backend_t base;
    int device;
    void *pool;
    uint64_t block_elems; /* one block of one layer: K and V of every head */
    uint64_t layer_elems;
    uint32_t elt;
    FwdVariant var[2][kNumShapes]; /* [fp16 | bf16][shape] for the model's head_dim */
    int dt;                        /* 0 fp16, 1 bf16 */
    Lane lane0;                    /* kern_append_kv, kern_attend, kern_copy_blocks */
    WaitValue64Fn wait64;          /* NULL: the device has no 64-bit stream memory operations */
    WriteValue64Fn write64;
    pthread_mutex_t cow_mu; /* orders cow_done's record (lane 0) and the lanes' waits on it */
    cudaEvent_t cow_done;   /* recorded after each copy-on-write batch */
};

Cuda *as_cuda(kern_backend_t *b)
{
    return reinterpret_cast<Cuda *>(b);
}

/* shape index of the variant that runs a group of tile (m, n): the smallest compiled m >= m, the
 * requested n when compiled for that m, else the n = 64 variant (compiled for every head_dim) */
int variant_for(const Cuda *c, uint32_t m, uint32_t n)
{
    for (int mi = 0; mi < 4; mi++) {
        if ((uint32_t)kTileMs[mi] < m)
            continue;
        int fallback = -1;
        for (int s = 0; s < kNumShapes; s++) {
            if (kShapeM[s] != kTileMs[mi] || !c->var[c->dt][s].fn)
                continue;
            if ((uint32_t)kShapeN[s] == n)
                return s;
            if (kShapeN[s] == 64)
                fallback = s;
        }
        return fallback;
    }
    return -1;
}

/* ------------------------------------------------------------------ KV append */

template <typename T, int D>
__global__ void append_kernel(const T *__restrict__ k, const T *__restrict__ v,
                              const uint32_t *__restrict__ slots, uint32_t n, T *__restrict__ kv,
                              uint32_t kv_heads, uint64_t block_elems)
{
    constexpr uint32_t CPR = D / 8;
    const uint64_t total = (uint64_t)n * kv_heads * CPR;
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < total;
         e += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t ch = e % CPR, h = (e / CPR) % kv_heads, i = e / ((uint64_t)CPR * kv_heads);
        const uint32_t slot = slots[i], blk = slot / KERN_BLOCK_SIZE, off = slot % KERN_BLOCK_SIZE;
        T *dk = kv + blk * block_elems + ((uint64_t)h * KERN_BLOCK_SIZE + off) * D + ch * 8;
        T *dv = dk + (uint64_t)kv_heads * KERN_BLOCK_SIZE * D;
        const uint64_t src = ((uint64_t)i * kv_heads + h) * D + ch * 8;
        *reinterpret_cast<uint4 *>(dk) = *reinterpret_cast<const uint4 *>(k + src);
        *reinterpret_cast<uint4 *>(dv) = *reinterpret_cast<const uint4 *>(v + src);
    }
}

template <typename T>
int append_launch(Cuda *c, cudaStream_t st, const uint32_t *slot_dev, uint32_t layer, const void *k,
                  const void *v, uint32_t n)
{
    const kern_model_t &m = c->base.cfg.model;
    T *kv = static_cast<T *>(c->pool) + layer * c->layer_elems;
    const uint64_t total = (uint64_t)n * m.kv_heads * (m.head_dim / 8);
    const uint32_t threads = 256;
    const uint32_t blocks =
        (uint32_t)((total + threads - 1) / threads < 4096 ? (total + threads - 1) / threads : 4096);
    const T *kk = static_cast<const T *>(k), *vv = static_cast<const T *>(v);
    switch (m.head_dim) {
    case 64:
        append_kernel<T, 64>
            <<<blocks, threads, 0, st>>>(kk, vv, slot_dev, n, kv, m.kv_heads, c->block_elems);
        break;
    case 128:
        append_kernel<T, 128>
            <<<blocks, threads, 0, st>>>(kk, vv, slot_dev, n, kv, m.kv_heads, c->block_elems);
        break;
    case 256:
        append_kernel<T, 256>
            <<<blocks, threads, 0, st>>>(kk, vv, slot_dev, n, kv, m.kv_heads, c->block_elems);
        break;
    default:
        return -ENOTSUP;
    }
    CK(cudaGetLastError(), "append launch");
    return 0;
}

int append_on(Lane *L, uint32_t layer, const void *k, const void *v, uint32_t n)
{
    if (n == 0)
        return 0;
    return L->c->dt == 0 ? append_launch<__half>(L->c, L->main, L->slot_dev, layer, k, v, n)
                         : append_launch<__nv_bfloat16>(L->c, L->main, L->slot_dev, layer, k, v, n);
}

/* Checks the slots against the pool and copies them to the lane's device buffer (on its
 * stream). */
int slots_upload(Lane *L, const uint32_t *slots, uint32_t n)
{
    const kern_config_t &cfg = L->c->base.cfg;
    const uint64_t limit = (uint64_t)cfg.n_blocks * cfg.model.block_size;
    if (n > cfg.max_tokens)
        return -E2BIG;
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] >= limit)
            return -EINVAL; /* checked before anything is enqueued: nothing changes */
    L->n_slots = n;
    if (n == 0)
        return 0;
    if (L->slot_used)
        CK(cudaEventSynchronize(L->slot_copied), "append: slot buffer");
    memcpy(L->slot_host, slots, n * sizeof(uint32_t));
    CK(cudaMemcpyAsync(L->slot_dev, L->slot_host, n * sizeof(uint32_t), cudaMemcpyHostToDevice,
                       L->main),
       "append: slot upload");
    CK(cudaEventRecord(L->slot_copied, L->main), "append: event");
    L->slot_used = true;
    return 0;
}

int cuda_append_kv(kern_backend_t *b, uint32_t layer, const void *k, const void *v,
                   const uint32_t *slots, uint32_t n)
{
    Cuda *c = as_cuda(b);
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    int r = slots_upload(&c->lane0, slots, n);
    return r < 0 ? r : append_on(&c->lane0, layer, k, v, n);
}

int cuda_copy_blocks(kern_backend_t *b, const uint32_t *src, const uint32_t *dst, uint32_t n)
{
    Cuda *c = as_cuda(b);
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    const uint64_t bytes = c->block_elems * c->elt;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < b->cfg.model.n_layers; l++) {
            uint8_t *base = static_cast<uint8_t *>(c->pool) + l * c->layer_elems * c->elt;
            CK(cudaMemcpyAsync(base + dst[i] * bytes, base + src[i] * bytes, bytes,
                               cudaMemcpyDeviceToDevice, c->lane0.main),
               "copy_blocks");
        }
    /* steps begun on other lanes from now on start after these copies */
    pthread_mutex_lock(&c->cow_mu);
    cudaError_t e = cudaEventRecord(c->cow_done, c->lane0.main);
    pthread_mutex_unlock(&c->cow_mu);
    CK(e, "copy_blocks event");
    return 0;
}

/* ------------------------------------------------------------------ attend */

/* Checks what only this backend needs (every CTA's rows fit its group's tile, every group has a
 * variant) and uploads the plan when it changed. */
int plan_upload(Lane *L, const sched_plan_hdr_t *h)
{
    Cuda *c = L->c;
    if (L->last_len == h->total_bytes && memcmp(L->last, h, h->total_bytes) == 0)
        return 0;
    if (h->total_bytes > c->base.cfg.max_plan_bytes)
        return -E2BIG;
    int r = kern__plan_check(&c->base.cfg, h);
    if (r < 0)
        return r;
    const sched_plan_group_t *g = sched_plan_groups(h);
    const sched_plan_cta_t *ct = sched_plan_ctas(h);
    for (uint32_t i = 0; i < h->n_groups; i++)
        if (g[i].m > kTileMs[3] || variant_for(c, g[i].m, g[i].n) < 0)
            return -EINVAL;
    for (uint32_t i = 0; i < h->n_ctas; i++)
        if (ct[i].row_count * h->group > g[ct[i].group].m)
            return -EINVAL;
    const int next = L->cur ^ 1;
    PlanBuf *pb = &L->plan[next];
    if (pb->used)
        CK(cudaEventSynchronize(pb->copied), "plan buffer");
    memcpy(pb->host, h, h->total_bytes);
    CK(cudaMemcpyAsync(pb->dev, pb->host, h->total_bytes, cudaMemcpyHostToDevice, L->main),
       "plan upload");
    CK(cudaEventRecord(pb->copied, L->main), "plan event");
    pb->used = true;
    L->cur = next;
    memcpy(L->last, h, h->total_bytes);
    L->last_len = h->total_bytes;
    return 0;
}

/* Enqueues one layer of the plan last uploaded to L. */
int attend_on(Lane *L, uint32_t layer, const sched_plan_hdr_t *h, const void *q, void *o,
              const kern_attn_params_t *p)
{
    Cuda *c = L->c;
    const kern_model_t &m = c->base.cfg.model;
    const uint8_t *dp = L->plan[L->cur].dev;
    FwdArgs a;
    a.ctas = reinterpret_cast<const sched_plan_cta_t *>(dp + h->off_ctas);
    a.rows = reinterpret_cast<const sched_plan_row_t *>(dp + h->off_rows);
    a.pages = reinterpret_cast<const uint32_t *>(dp + h->off_pages);
    a.q = q;
    a.o = o;
    a.kv = static_cast<const uint8_t *>(c->pool) + layer * c->layer_elems * c->elt;
    a.block_stride = c->block_elems;
    a.head_stride = (uint64_t)m.block_size * m.head_dim;
    a.v_offset = a.head_stride * m.kv_heads;
    a.part_o = L->part_o;
    a.part_lse = L->part_lse;
    a.q_heads = m.q_heads;
    a.kv_heads = m.kv_heads;
    a.group = h->group;
    a.scale = p->scale;
    a.softcap = p->softcap;

    const sched_plan_group_t *g = sched_plan_groups(h);
    uint32_t live = 0;
    for (uint32_t i = 0; i < h->n_groups; i++)
        live += g[i].cta_count > 0;
    const bool fan = live > 1 && L->n_side > 1;
    uint32_t used = 0; /* side streams in use, in order */
    if (fan)
        CK(cudaEventRecord(L->fork, L->main), "fork event");
    for (uint32_t i = 0, k = 0; i < h->n_groups; i++) {
        if (g[i].cta_count == 0)
            continue;
        const FwdVariant &v = c->var[c->dt][variant_for(c, g[i].m, g[i].n)];
        cudaStream_t s = L->main;
        if (fan) {
            const uint32_t si = k++ % L->n_side;
            s = L->side[si];
            if (si >= used) {
                CK(cudaStreamWaitEvent(s, L->fork, 0), "fork wait");
                used = si + 1;
            }
        }
        a.cta_begin = g[i].cta_begin;
        void *args[] = {&a};
        CK(cudaLaunchKernel(v.fn, dim3(g[i].cta_count, m.kv_heads), dim3(v.threads), args,
                            (size_t)v.smem, s),
           "forward launch");
    }
    for (uint32_t si = 0; si < used; si++) {
        CK(cudaEventRecord(L->join[si], L->side[si]), "join event");
        CK(cudaStreamWaitEvent(L->main, L->join[si], 0), "join wait");
    }
    if (h->n_merges == 0)
        return 0;
    kern_cuda_merge_params_t mp = {};
    mp.merges = reinterpret_cast<const sched_plan_merge_t *>(dp + h->off_merges);
    mp.n_merges = h->n_merges;
    mp.part_o = L->part_o;
    mp.part_lse = L->part_lse;
    mp.o = o;
    mp.q_heads = m.q_heads;
    mp.kv_heads = m.kv_heads;
    mp.head_dim = m.head_dim;
    mp.dtype = m.dtype;
    mp.stream = L->main;
    return kern_cuda_merge_launch(&mp);
}

int cuda_attend(kern_backend_t *b, uint32_t layer, const sched_plan_hdr_t *h, const void *q,
                void *o, const kern_attn_params_t *p)
{
    Cuda *c = as_cuda(b);
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    int r = plan_upload(&c->lane0, h);
    return r < 0 ? r : attend_on(&c->lane0, layer, h, q, o, p);
}

int cuda_sync(kern_backend_t *b)
{
    Cuda *c = as_cuda(b);
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    CK(cudaStreamSynchronize(c->lane0.main), "sync");
    return 0;
}

void cuda_tiles(const kern_backend_t *b, sched_tiles_t *ret)
{
    const Cuda *c = reinterpret_cast<const Cuda *>(b);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, c->device) != cudaSuccess) {
        prop.name[0] = 0;
        prop.multiProcessorCount = 0;
    }
    kern_cuda_tiles_for(prop.name, ret);
    /* fill the device: about 4 waves of the decode variant (m 16, n 64) when a plan has fewer
     * work items, so the last, partly filled wave costs little */
    int resident = 0;
    const FwdVariant &v = c->var[c->dt][0];
    if (v.fn && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, v.fn, v.threads, v.smem) !=
                    cudaSuccess)
        resident = 0;
    if (ret->min_ctas == 0)
        ret->min_ctas = (uint32_t)(4 * prop.multiProcessorCount * resident);
}

/* ------------------------------------------------------------------ lanes */

void lane_done(Lane *L)
{
    if (L->main)
        cudaStreamSynchronize(L->main);
    for (uint32_t i = 0; i < KERN_MAX_STREAMS; i++) {
        if (L->side[i])
            cudaStreamDestroy(L->side[i]);
        if (L->join[i])
            cudaEventDestroy(L->join[i]);
    }
    if (L->fork)
        cudaEventDestroy(L->fork);
    if (L->main)
        cudaStreamDestroy(L->main);
    for (PlanBuf &pb : L->plan) {
        cudaFreeHost(pb.host);
        cudaFree(pb.dev);
        if (pb.copied)
            cudaEventDestroy(pb.copied);
    }
    if (L->slot_copied)
        cudaEventDestroy(L->slot_copied);
    cudaFreeHost(L->slot_host);
    cudaFree(L->slot_dev);
    cudaFree(L->part_o);
    cudaFree(L->part_lse);
    cudaFreeHost(L->progress_host);
    free(L->last);
    memset(L, 0, sizeof(*L));
}

/* Allocates what a lane needs. 0, -ENOMEM (device or pinned memory), -EIO. */
int lane_init(Cuda *c, Lane *L)
{
    const kern_config_t *cfg = &c->base.cfg;
    const kern_model_t &m = cfg->model;
    memset(L, 0, sizeof(*L));
    L->c = c;
    L->base.b = &c->base;
    const uint64_t slots = (uint64_t)(cfg->max_partials ? cfg->max_partials : 1) * m.q_heads;
    if (cudaMalloc(&L->part_o, slots * m.head_dim * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&L->part_lse, slots * sizeof(float)) != cudaSuccess)
        goto nomem; /* device memory may legitimately not suffice: -ENOMEM */
    for (PlanBuf &pb : L->plan)
        if (cudaMallocHost(&pb.host, cfg->max_plan_bytes) != cudaSuccess ||
            cudaMalloc(&pb.dev, cfg->max_plan_bytes) != cudaSuccess)
            goto nomem;
    if (cudaMallocHost(&L->slot_host, cfg->max_tokens * sizeof(uint32_t)) != cudaSuccess ||
        cudaMalloc(&L->slot_dev, cfg->max_tokens * sizeof(uint32_t)) != cudaSuccess ||
        cudaHostAlloc(&L->progress_host, 64, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&L->progress_dev, L->progress_host, 0) != cudaSuccess)
        goto nomem;
    *L->progress_host = 0;
    L->base.progress = L->progress_host;
    L->last = static_cast<uint8_t *>(malloc(cfg->max_plan_bytes));
    if (!L->last)
        goto nomem;
    if (cudaStreamCreateWithFlags(&L->main, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&L->fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&L->slot_copied, cudaEventDisableTiming) != cudaSuccess)
        goto io;
    for (PlanBuf &pb : L->plan)
        if (cudaEventCreateWithFlags(&pb.copied, cudaEventDisableTiming) != cudaSuccess)
            goto io;
    L->n_side = cfg->streams;
    for (uint32_t i = 0; i < L->n_side; i++)
        if (cudaStreamCreateWithFlags(&L->side[i], cudaStreamNonBlocking) != cudaSuccess ||
            cudaEventCreateWithFlags(&L->join[i], cudaEventDisableTiming) != cudaSuccess)
            goto io;
    return 0;
nomem:
    cudaGetLastError(); /* clear a non-sticky allocation error */
    lane_done(L);
    return -ENOMEM;
io:
    cudaGetLastError();
    lane_done(L);
    return -EIO;
}

Lane *as_lane(kern_lane_t *l)
{
    return reinterpret_cast<Lane *>(l);
}

int cuda_lane_create(kern_backend_t *b, kern_lane_t **ret)
{
    Cuda *c = as_cuda(b);
    if (!c->wait64 || !c->write64)
        return -ENOTSUP;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    Lane *L = static_cast<Lane *>(calloc(1, sizeof(Lane)));
    if (!L)
        return -ENOMEM;
    int r = lane_init(c, L);
    if (r < 0) {
        free(L);
        return r;
    }
    *ret = &L->base;
    return 0;
}

void cuda_lane_free(kern_lane_t *l)
{
    Lane *L = as_lane(l);
    cudaSetDevice(L->c->device);
    lane_done(L);
    free(L);
}

int cuda_lane_begin(kern_lane_t *l, const sched_plan_hdr_t *h, const uint32_t *slots, uint32_t n)
{
    Lane *L = as_lane(l);
    Cuda *c = L->c;
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    int r = plan_upload(L, h);
    if (r < 0 || (r = slots_upload(L, slots, n)) < 0)
        return r;
    pthread_mutex_lock(&c->cow_mu);
    cudaError_t e = cudaStreamWaitEvent(L->main, c->cow_done, 0);
    pthread_mutex_unlock(&c->cow_mu);
    CK(e, "copy-on-write wait");
    return 0;
}

#define CU_CK(call, what)                                                                          \
    do {                                                                                           \
        CUresult e_ = (call);                                                                      \
        if (e_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "<3>kern_cuda: %s: CUresult %d\n", what, (int)e_);                     \
            return -EIO;                                                                           \
        }                                                                                          \
    } while (0)

int cuda_lane_layer(kern_lane_t *l, const kern_lane_layer_t *ly)
{
    Lane *L = as_lane(l);
    Cuda *c = L->c;
    CUstream st = reinterpret_cast<CUstream>(L->main);
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    if (ly->wait_word) {
        const CUdeviceptr w = reinterpret_cast<CUdeviceptr>(ly->wait_word);
        CU_CK(c->wait64(st, w, ly->wait_value, CU_STREAM_WAIT_VALUE_GEQ), "wait value");
        /* (CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER is refused for host-mapped words: measured
         * CUDA_ERROR_INVALID_VALUE on an H200, driver 580) */
        CU_CK(c->write64(st, w, 0, CU_STREAM_WRITE_VALUE_DEFAULT), "reset value");
    }
    if (ly->compute) {
        int r = append_on(L, ly->layer, ly->k, ly->v, L->n_slots);
        if (r < 0 ||
            (r = attend_on(L, ly->layer, reinterpret_cast<const sched_plan_hdr_t *>(L->last), ly->q,
                           ly->o, &ly->params)) < 0)
            return r;
    }
    if (ly->post_word)
        CU_CK(c->write64(st, reinterpret_cast<CUdeviceptr>(ly->post_word), ly->post_value,
                         CU_STREAM_WRITE_VALUE_DEFAULT),
              "post value");
    L->base.enqueued++;
    CU_CK(c->write64(st, reinterpret_cast<CUdeviceptr>(L->progress_dev), L->base.enqueued,
                     CU_STREAM_WRITE_VALUE_DEFAULT),
          "progress");
    return 0;
}

int cuda_host_map(kern_backend_t *b, void *host, uint64_t bytes, void **ret_dev)
{
    Cuda *c = as_cuda(b);
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    CK(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
       "cudaHostRegister");
    void *dev = nullptr;
    cudaError_t e = cudaHostGetDevicePointer(&dev, host, 0);
    if (e != cudaSuccess) {
        cudaHostUnregister(host);
        return kern_cuda_fail("cudaHostGetDevicePointer", e);
    }
    *ret_dev = dev;
    return 0;
}

void cuda_host_unmap(kern_backend_t *b, void *host)
{
    cudaSetDevice(as_cuda(b)->device);
    if (cudaHostUnregister(host) != cudaSuccess)
        cudaGetLastError();
}

int cuda_ipc_alloc(kern_backend_t *b, uint64_t bytes, void **ret_dev, uint8_t ret_handle[64])
{
    static_assert(sizeof(cudaIpcMemHandle_t) == 64, "the wire carries 64 bytes");
    Cuda *c = as_cuda(b);
    CK(cudaSetDevice(c->device), "cudaSetDevice");
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return -ENOMEM;
    }
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    if (e != cudaSuccess) {
        cudaFree(p);
        return kern_cuda_fail("cudaIpcGetMemHandle", e);
    }
    memcpy(ret_handle, &h, 64);
    *ret_dev = p;
    return 0;
}

void cuda_ipc_free(kern_backend_t *b, void *dev)
{
    cudaSetDevice(as_cuda(b)->device);
    cudaFree(dev);
}

int cuda_device_info(kern_backend_t *b, int *ret_mps, uint8_t ret_uuid[16])
{
    Cuda *c = as_cuda(b);
    int mps = 0;
    CK(cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, c->device), "MPS attribute");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, c->device), "cudaGetDeviceProperties");
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
    cudaFree(c->pool);
    free(c);
}

int register_variants(Cuda *c)
{
    switch (c->base.cfg.model.head_dim) { /* the closed set: 64, 128, 256 */
    case 64:
        return fwd_register_d64(c->var);
    case 128:
        return fwd_register_d128(c->var);
    case 256:
        return fwd_register_d256(c->var);
    }
    return -ENOTSUP;
}

/* One launch of every variant on an empty CTA (no rows, no KV): loads every module now. */
int warm_variants(Cuda *c)
{
    sched_plan_cta_t *dcta;
    cudaStream_t st = c->lane0.main;
    CK(cudaMalloc(&dcta, sizeof(*dcta)), "warm-up alloc");
    cudaError_t me = cudaMemsetAsync(dcta, 0, sizeof(*dcta), st);
    if (me != cudaSuccess) {
        cudaFree(dcta);
        return kern_cuda_fail("warm-up memset", me);
    }
    FwdArgs a = {};
    a.ctas = dcta;
    a.q = a.kv = c->pool;
    a.o = c->pool;
    a.q_heads = a.kv_heads = a.group = 1;
    a.scale = 1.f;
    int r = 0;
    for (int dt = 0; dt < 2 && r == 0; dt++)
        for (int s = 0; s < kNumShapes && r == 0; s++) {
            const FwdVariant &v = c->var[dt][s];
            if (!v.fn)
                continue;
            void *args[] = {&a};
            cudaError_t e = cudaLaunchKernel(v.fn, dim3(1, 1), dim3(v.threads), args, v.smem, st);
            if (e != cudaSuccess)
                r = kern_cuda_fail("warm-up launch", e);
        }
    /* the append kernel: one token into slot 0 of the still unused pool */
    if (r == 0) {
        uint32_t slot0 = 0;
        if ((r = slots_upload(&c->lane0, &slot0, 1)) == 0)
            r = append_on(&c->lane0, 0, c->pool, c->pool, 1);
    }
    cudaError_t e = cudaStreamSynchronize(st);
    if (r == 0 && e != cudaSuccess)
        r = kern_cuda_fail("warm-up", e);
    cudaFree(dcta);
    return r;
}

/* The 64-bit stream memory operations, when the device has them (lanes need them). */
int load_memops(Cuda *c)
{
    int ok = 0;
    /* the runtime has no name for CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS */
    CK(cudaDeviceGetAttribute(
           &ok, (cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, c->device),
       "stream memory operations attribute");
    if (!ok)
        return 0;
    void *w = nullptr, *x = nullptr;
    cudaDriverEntryPointQueryResult q1, q2;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &w, 12000, cudaEnableDefault,
                                         &q1) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &x, 12000, cudaEnableDefault,
                                         &q2) != cudaSuccess ||
        q1 != cudaDriverEntryPointSuccess || q2 != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return 0;
    }
    c->wait64 = reinterpret_cast<WaitValue64Fn>(w);
    c->write64 = reinterpret_cast<WriteValue64Fn>(x);
    return 0;
}

int cuda_create(const kern_config_t *cfg, kern_backend_t **ret)
{
    const kern_model_t &m = cfg->model;
    if (m.dtype != KERN_F16 && m.dtype != KERN_BF16)
        return -ENOTSUP; /* fp32 KV is the cpu backend's (reference) only */
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || cfg->device < 0 || cfg->device >= n_dev) {
        cudaGetLastError();
        return -ENODEV;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, cfg->device), "cudaGetDeviceProperties");
    if (prop.major < 8)
        return -ENOTSUP; /* mma.sync m16n8k16 bf16 and cp.async need sm_80 */
    CK(cudaSetDevice(cfg->device), "cudaSetDevice");

    Cuda *c = static_cast<Cuda *>(calloc(1, sizeof(Cuda)));
    if (!c)
        return -ENOMEM;
    c->base.cfg = *cfg;
    c->device = cfg->device;
    c->elt = 2;
    c->dt = m.dtype == KERN_F16 ? 0 : 1;
    c->block_elems = 2ull * m.kv_heads * m.block_size * m.head_dim;
    c->layer_elems = c->block_elems * cfg->n_blocks;
    pthread_mutex_init(&c->cow_mu, NULL);
    int r = -ENOMEM;
    if (cudaMalloc(&c->pool, c->layer_elems * m.n_layers * c->elt) != cudaSuccess)
        goto fail; /* device memory may legitimately not suffice: -ENOMEM */
    if ((r = lane_init(c, &c->lane0)) < 0)
        goto fail;
    r = -EIO;
    if (cudaEventCreateWithFlags(&c->cow_done, cudaEventDisableTiming) != cudaSuccess)
        goto fail;
    if ((r = load_memops(c)) < 0 || (r = register_variants(c)) < 0 || (r = warm_variants(c)) < 0)
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

__global__ void read_kernel(const uint4 *p, uint64_t n, uint32_t *sink)
{
    uint32_t acc = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u)
        *sink = acc; /* keeps the loads */
}

extern "C" double kern_cuda_read_bandwidth(uint64_t bytes, int reps)
{
    if (bytes < 16 || reps < 1 || reps > 64)
        return -EINVAL;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev), "cudaGetDevice");
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "attribute");
    uint4 *p = nullptr;
    uint32_t *sink = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    float t[64 + 2];
    double r = -EIO;
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMalloc(&sink, 4) != cudaSuccess) {
        r = -ENOMEM;
        goto out;
    }
    if (cudaMemset(p, 1, bytes) != cudaSuccess || cudaEventCreate(&a) != cudaSuccess ||
        cudaEventCreate(&b) != cudaSuccess)
        goto out;
    for (int i = 0; i < reps + 2; i++) {
        if (cudaEventRecord(a) != cudaSuccess)
            goto out;
        read_kernel<<<sms * 8, 512>>>(p, bytes / 16, sink);
        if (cudaEventRecord(b) != cudaSuccess || cudaEventSynchronize(b) != cudaSuccess ||
            cudaEventElapsedTime(&t[i], a, b) != cudaSuccess)
            goto out;
    }
    std::sort(t + 2, t + reps + 2);
    r = bytes / (t[2 + reps / 2] * 1e-3);
out:
    cudaGetLastError();
    if (a)
        cudaEventDestroy(a);
    if (b)
        cudaEventDestroy(b);
    cudaFree(p);
    cudaFree(sink);
    return r;
}

extern "C" int kern_cuda_set_streams(kern_backend_t *b, uint32_t n)
{
    if (n < 1 || n > b->cfg.streams)
        return -EINVAL;
    as_cuda(b)->lane0.n_side = n;
    return 0;
}

extern "C" int kern_cuda_variants(uint32_t head_dim, kern_cuda_variant_info_t *out, uint32_t cap)
{
    FwdVariant v[2][kNumShapes] = {};
    int r = head_dim == 64    ? fwd_register_d64(v)
            : head_dim == 128 ? fwd_register_d128(v)
            : head_dim == 256 ? fwd_register_d256(v)
                              : -ENOTSUP;
    if (r < 0)
        return r;
    int dev = 0;
    CK(cudaGetDevice(&dev), "cudaGetDevice");
    uint32_t n = 0;
    for (int dt = 0; dt < 2; dt++)
        for (int s = 0; s < kNumShapes; s++) {
            if (!v[dt][s].fn)
                continue;
            if (n < cap) {
                kern_cuda_variant_info_t *x = &out[n];
                cudaFuncAttributes fa;
                CK(cudaFuncGetAttributes(&fa, v[dt][s].fn), "cudaFuncGetAttributes");
                int blocks = 0;
                CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, v[dt][s].fn,
                                                                 v[dt][s].threads, v[dt][s].smem),
                   "occupancy");
                x->head_dim = head_dim;
                x->m = kShapeM[s];
                x->n = kShapeN[s];
                x->dtype = dt == 0 ? KERN_F16 : KERN_BF16;
                x->threads = v[dt][s].threads;
                x->smem = v[dt][s].smem;
                x->regs = fa.numRegs;
                x->local_bytes = (int)fa.localSizeBytes;
                x->blocks_per_sm = blocks;
                x->stage_bytes = v[dt][s].stage_bytes;
                x->stages = v[dt][s].stages;
            }
            n++;
        }
    return (int)n;
}

extern "C" const kern_ops_t kern__cuda_ops = {
    "cuda",          cuda_create,      cuda_destroy,  cuda_append_kv,   cuda_copy_blocks,
    cuda_attend,     cuda_sync,        cuda_tiles,    cuda_lane_create, cuda_lane_free,
    cuda_lane_begin, cuda_lane_layer,  cuda_host_map, cuda_host_unmap,  cuda_ipc_alloc,
    cuda_ipc_free,   cuda_device_info, cuda_fatal,
};
