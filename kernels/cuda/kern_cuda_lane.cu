/*
 * kern_cuda_lane.cu — lanes (kern.h, the GPU data path): what one step in flight needs of its own
 * — a stream, the plan and slot buffers, the partials (grown for a large plan, trimmed after it)
 * and merge arrival counters, and a host-mapped progress word — so that a step whose stream waits
 * on its client's ready word never holds up another client's step. The backend's own calls
 * (kern_append_kv, kern_attend) run on lane 0, which never waits on a client.
 *
 * A layer on a lane is, on its one stream: wait(ready) -> append -> forward and merge -> post(done)
 * [-> progress, when asked]. On sm_90 the forward is the append's programmatic dependent and the
 * merge the forward's (kern_cuda_attn.cu's launch_dep): each one's blocks are placed while the
 * kernel before it runs and wait for it on the GPU. Handshakes are 64-bit stream memory
 * operations (cuStreamWaitValue64 / cuStreamWriteValue64, taken from the driver with
 * cudaGetDriverEntryPointByVersion: no link against libcuda).
 */
#include "kern_cuda_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

namespace kcuda
{

void lane_done(Lane *L)
{
    if (L->main) {
        cudaStreamSynchronize(L->main);
        cudaStreamDestroy(L->main);
    }
    for (PlanBuf &pb : L->plan) {
        cudaFreeHost(pb.host);
        cudaFree(pb.dev);
        cudaFreeHost(pb.tl_host);
        cudaFree(pb.tl_dev);
        if (pb.copied)
            cudaEventDestroy(pb.copied);
    }
    for (uint32_t i = 0; i < L->n_retired; i++)
        cudaFreeHost(L->retired[i]);
    if (L->slot_copied)
        cudaEventDestroy(L->slot_copied);
    cudaFreeHost(L->slot_host);
    cudaFree(L->slot_dev);
    cudaFree(L->part_o);
    cudaFree(L->part_lse);
    cudaFree(L->arrivals);
    cudaFreeHost(L->progress_host);
    free(L->last);
    free(L->check);
    pack_done(L);
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
    const uint32_t max_part = cfg->max_partials ? cfg->max_partials : 1;
    L->part_cap = max_part < LANE_PARTIALS_START ? max_part : LANE_PARTIALS_START;
    const uint64_t slots = (uint64_t)L->part_cap * m.q_heads;
    const uint64_t arrivals = ((uint64_t)cfg->max_tokens * m.kv_heads + 2) * sizeof(uint32_t);
    if (cudaStreamCreateWithFlags(&L->main, cudaStreamNonBlocking) != cudaSuccess)
        goto io;
    /* stream-ordered, as partials_reserve replaces them */
    if (cudaMallocAsync(&L->part_o, slots * m.head_dim * sizeof(float), L->main) != cudaSuccess ||
        cudaMallocAsync(&L->part_lse, slots * sizeof(float), L->main) != cudaSuccess ||
        cudaMalloc(&L->arrivals, arrivals) != cudaSuccess)
        goto nomem; /* device memory may legitimately not suffice: -ENOMEM */
    if (cudaMemset(L->arrivals, 0, arrivals) != cudaSuccess)
        goto io;
    L->work = L->arrivals + (uint64_t)cfg->max_tokens * m.kv_heads;
    for (PlanBuf &pb : L->plan)
        if (cudaMallocHost(&pb.host, cfg->max_plan_bytes) != cudaSuccess ||
            cudaMalloc(&pb.dev, cfg->max_plan_bytes) != cudaSuccess ||
            cudaMallocHost(&pb.tl_host, WS_TILES_START * sizeof(WsTile)) != cudaSuccess ||
            cudaMalloc(&pb.tl_dev, WS_TILES_START * sizeof(WsTile)) != cudaSuccess)
            goto nomem;
    for (PlanBuf &pb : L->plan)
        pb.tl_cap = WS_TILES_START;
    if (cudaMallocHost(&L->slot_host, cfg->max_tokens * sizeof(uint32_t)) != cudaSuccess ||
        cudaMalloc(&L->slot_dev, cfg->max_tokens * sizeof(uint32_t)) != cudaSuccess ||
        cudaHostAlloc(&L->progress_host, 64, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&L->progress_dev, L->progress_host, 0) != cudaSuccess)
        goto nomem;
    *L->progress_host = 0;
    L->base.progress = L->progress_host;
    L->last = static_cast<uint8_t *>(malloc(cfg->max_plan_bytes));
    L->check = static_cast<uint8_t *>(malloc(kern__plan_scratch_bytes(cfg)));
    if (!L->last || !L->check)
        goto nomem;
    if (cudaEventCreateWithFlags(&L->slot_copied, cudaEventDisableTiming) != cudaSuccess)
        goto io;
    for (PlanBuf &pb : L->plan)
        if (cudaEventCreateWithFlags(&pb.copied, cudaEventDisableTiming) != cudaSuccess)
            goto io;
    if (cudaDeviceSynchronize() != cudaSuccess) /* the arrivals are zero before any launch */
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

/* The 64-bit stream memory operations, when the device has them (lanes need them). */
int load_memops(Cuda *c)
{
    int ok = 0;
    /* the runtime has no name for CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS */
    KC_TRY(cudaDeviceGetAttribute(
               &ok, (cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, c->device),
           "stream memory operations attribute");
    if (!ok)
        return 0;
    void *w = nullptr, *x = nullptr;
    if (!driver_entry("cuStreamWaitValue64", &w) || !driver_entry("cuStreamWriteValue64", &x))
        return 0;
    c->wait64 = reinterpret_cast<WaitValue64Fn>(w);
    c->write64 = reinterpret_cast<WriteValue64Fn>(x);
    return 0;
}

static Lane *as_lane(kern_lane_t *l)
{
    return reinterpret_cast<Lane *>(l);
}

int cuda_lane_create(kern_backend_t *b, kern_lane_t **ret)
{
    Cuda *c = as_cuda(b);
    if (!c->wait64 || !c->write64)
        return -ENOTSUP;
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
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
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    int r = plan_upload(L, h);
    if (r < 0 || (r = slots_upload(L, slots, n)) < 0)
        return r;
    return cow_wait(L);
}

int cow_wait(Lane *L)
{
    Cuda *c = L->c;
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&c->cow_mu);
    if (L->cow_seen != c->cow_gen) { /* a stream call saved per step begun while none came */
        e = cudaStreamWaitEvent(L->main, c->cow_done, 0);
        if (e == cudaSuccess)
            L->cow_seen = c->cow_gen;
    }
    pthread_mutex_unlock(&c->cow_mu);
    KC_TRY(e, "copy-on-write wait");
    return 0;
}

int cuda_lane_layer(kern_lane_t *l, const kern_lane_layer_t *ly)
{
    Lane *L = as_lane(l);
    Cuda *c = L->c;
    CUstream st = reinterpret_cast<CUstream>(L->main);
    KC_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    if (ly->wait_word) {
        const CUdeviceptr w = reinterpret_cast<CUdeviceptr>(ly->wait_word);
        KC_TRY_CU(c->wait64(st, w, ly->wait_value, CU_STREAM_WAIT_VALUE_GEQ), "wait value");
    }
    if (ly->compute) {
        int r = append_on(L, ly->layer, ly->k, ly->v, L->n_slots);
        if (r < 0 ||
            (r = attend_on(L, ly->layer, reinterpret_cast<const sched_plan_hdr_t *>(L->last), ly->q,
                           ly->o, &ly->params)) < 0)
            return r;
    }
    if (ly->post_word)
        KC_TRY_CU(c->write64(st, reinterpret_cast<CUdeviceptr>(ly->post_word), ly->post_value,
                             CU_STREAM_WRITE_VALUE_DEFAULT),
                  "post value");
    L->base.enqueued++;
    /* (CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER is refused for host-mapped words: measured
     * CUDA_ERROR_INVALID_VALUE on an H200, driver 580; so every write here costs a barrier) */
    if (ly->report)
        KC_TRY_CU(c->write64(st, reinterpret_cast<CUdeviceptr>(L->progress_dev), L->base.enqueued,
                             CU_STREAM_WRITE_VALUE_DEFAULT),
                  "progress");
    return 0;
}

} // namespace kcuda
