/*
 * kern_cuda_tools.cu — probes the tools, tests and benchmarks need and the daemon does not
 * (libpatcudatools.a): the read-bandwidth floor and the report of the compiled forward kernels.
 */
#include "kern_cuda_int.h"

#include <algorithm>
#include <errno.h>

using namespace kcuda;

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
    KC_TRY(cudaGetDevice(&dev), "cudaGetDevice");
    KC_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "attribute");
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

extern "C" int kern_cuda_variants(uint32_t head_dim, kern_cuda_variant_info_t *out, uint32_t cap)
{
    FwdVariant v[2] = {};
    int r = fwd_register(head_dim, v);
    if (r < 0)
        return r;
    uint32_t n = 0;
    for (int k = 0; k < 6; k++) {
        /* fp16 and bf16 of: the mma.sync kernel, the wgmma one, the pair kernel (sm_90a) */
        const int dt = k % 2, kind = k / 2;
        const void *fn = kind == 0 ? v[dt].fn : kind == 1 ? v[dt].wg_fn : v[dt].pair_fn;
        if (!fn)
            continue;
        if (n++ >= cap)
            continue;
        kern_cuda_variant_info_t *x = &out[n - 1];
        const int threads = kind == 2 ? KCUDA_PAIR_THREADS : KCUDA_THREADS;
        const int smem = kind == 2 ? v[dt].pair_smem : v[dt].smem;
        cudaFuncAttributes fa;
        KC_TRY(cudaFuncGetAttributes(&fa, fn), "cudaFuncGetAttributes");
        int blocks = 0;
        KC_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, threads, smem),
               "occupancy");
        x->wgmma = kind > 0;
        x->head_dim = head_dim;
        x->m = kind == 2 ? KCUDA_BIG_M : KCUDA_SMALL_M;
        x->n = KCUDA_TILE_N;
        x->dtype = dt == 0 ? KERN_F16 : KERN_BF16;
        x->threads = threads;
        x->smem = smem;
        x->regs = fa.numRegs;
        x->local_bytes = (int)fa.localSizeBytes;
        x->blocks_per_sm = blocks;
        x->stage_bytes = 2 * KCUDA_TILE_N * (int)head_dim * 2;
    }
    return (int)n;
}
