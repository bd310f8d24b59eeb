/*
 * kern_cuda_merge.cu — the merge stage of a plan on the GPU: for every token whose attention was
 * split over several CTAs, combine the fp32 partials (o normalized, lse natural-log) with
 * log-sum-exp weights and write the output in the model dtype.
 *
 * One CTA per merge entry; its threads cover q_heads x head_dim outputs with 16-byte loads of
 * the partials (4 floats per thread). A token rarely has more than a handful of parts, so the
 * per-head weights are recomputed by each thread from the lse values (L1/L2-resident) instead
 * of a block-wide exchange. All-(-inf) parts give 0, never NaN. Memory-bound: reads
 * parts x (head_dim + 1) floats per head, writes head_dim elements.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "kern_cuda_int.h"

namespace
{

using kcuda::store4;

constexpr int kThreads = 128;

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const sched_plan_merge_t *__restrict__ merges, const float *__restrict__ part_o,
                 const float *__restrict__ part_lse, T *__restrict__ o, uint32_t q_heads,
                 uint32_t kv_heads)
{
    const sched_plan_merge_t m = merges[blockIdx.x];
    const uint32_t group = q_heads / kv_heads;
    constexpr uint32_t kVec = D / 4; /* float4 per head row */
    for (uint32_t e = threadIdx.x; e < q_heads * kVec; e += kThreads) {
        const uint32_t qh = e / kVec, v = e % kVec;
        const uint32_t head = qh / group, j = qh % group;
        float mx = -INFINITY;
        for (uint32_t k = 0; k < m.part_count; k++) {
            const uint64_t slot = ((uint64_t)(m.part_begin + k) * kv_heads + head) * group + j;
            mx = fmaxf(mx, part_lse[slot]);
        }
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float wsum = 0.f;
        if (mx > -INFINITY) {
            for (uint32_t k = 0; k < m.part_count; k++) {
                const uint64_t slot = ((uint64_t)(m.part_begin + k) * kv_heads + head) * group + j;
                const float w = __expf(part_lse[slot] - mx);
                const float4 p = reinterpret_cast<const float4 *>(part_o + slot * D)[v];
                wsum += w;
                acc.x += w * p.x;
                acc.y += w * p.y;
                acc.z += w * p.z;
                acc.w += w * p.w;
            }
        }
        const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
        acc.x *= inv;
        acc.y *= inv;
        acc.z *= inv;
        acc.w *= inv;
        store4<T>(o + ((uint64_t)m.q_tok * q_heads + qh) * D + v * 4, acc);
    }
}

template <typename T, int D> int launch(const kern_cuda_merge_params_t *p)
{
    cudaStream_t s = static_cast<cudaStream_t>(p->stream);
    merge_kernel<T, D><<<p->n_merges, kThreads, 0, s>>>(
        p->merges, p->part_o, p->part_lse, static_cast<T *>(p->o), p->q_heads, p->kv_heads);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : kcuda::kern_cuda_fail("merge launch", e);
}

/* One dispatch point over the closed set: dtype {fp16, bf16, fp32} x head_dim {64, 128, 256}. */
template <typename T> int by_dim(const kern_cuda_merge_params_t *p)
{
    switch (p->head_dim) {
    case 64:
        return launch<T, 64>(p);
    case 128:
        return launch<T, 128>(p);
    case 256:
        return launch<T, 256>(p);
    default:
        fprintf(stderr, "<3>kern_cuda_merge: head_dim %u not supported\n", p->head_dim);
        return -ENOTSUP;
    }
}

} // namespace

extern "C" int kern_cuda_merge_launch(const kern_cuda_merge_params_t *p)
{
    if (!p || !p->o || !p->part_o || !p->part_lse || (p->n_merges && !p->merges) ||
        p->kv_heads == 0 || p->q_heads % p->kv_heads != 0)
        return -EINVAL;
    if (p->n_merges == 0)
        return 0;
    switch (p->dtype) {
    case KERN_F16:
        return by_dim<__half>(p);
    case KERN_BF16:
        return by_dim<__nv_bfloat16>(p);
    case KERN_F32:
        return by_dim<float>(p);
    }
    fprintf(stderr, "<3>kern_cuda_merge: dtype %d not supported\n", (int)p->dtype);
    return -ENOTSUP;
}
