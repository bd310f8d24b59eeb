/*
 * kern_cuda_int.h — what the CUDA translation units of kernels/cuda share: the forward kernel's
 * POD argument block, the record of one compiled variant, the closed shape set, and the error
 * helper. CUDA C++ only; nothing here crosses into C.
 */
#ifndef KERN_CUDA_INT_H
#define KERN_CUDA_INT_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "kern_cuda.h"

namespace kcuda
{

/* Arguments of one forward launch (one tile-shape group of a plan, one layer). */
struct FwdArgs {
    const sched_plan_cta_t *ctas; /* device copy of the plan */
    const sched_plan_row_t *rows;
    const uint32_t *pages;
    uint32_t cta_begin;    /* first CTA of the group */
    const void *q;         /* [token][q_head][D] */
    void *o;               /* [token][q_head][D] */
    const void *kv;        /* this layer's first block */
    uint64_t block_stride; /* elements from one block to the next (K and V, every head) */
    uint64_t head_stride;  /* elements from one KV head to the next: block_size * D */
    uint64_t v_offset;     /* elements from K to V of a block: kv_heads * head_stride */
    float *part_o;         /* [slot][D] fp32 */
    float *part_lse;       /* [slot] */
    uint32_t q_heads, kv_heads, group;
    float scale, softcap;
};

/* One compiled (dtype, D, M, N) forward variant. */
struct FwdVariant {
    const void *fn; /* __global__ void (*)(FwdArgs) */
    int threads, smem, stage_bytes, stages;
};

/* The closed shape set (m rows x n KV tokens per tile), per head_dim. A shape is compiled when it
 * fits an sm_90 CTA's 227 KB of shared memory (checked at compile time) — the offline solver
 * (tile_solver.cu) then keeps the ones that also meet the occupancy and bytes-in-flight rules
 * on the device at hand. */
#define KCUDA_SHAPES(X)                                                                            \
    X(16, 64) X(16, 128) X(32, 64) X(32, 128) X(64, 64) X(64, 128) X(128, 64) X(128, 128)
constexpr int kMaxSmem = 232448; /* sm_90 (and sm_80: 227 KB + 1 KB reserved) opt-in per block */
constexpr int kNumShapes = 8;

/* registered per head_dim translation unit: fills v[dtype 0|1][shape index] (fn NULL when the
 * shape does not fit); 0 or a negative errno */
int fwd_register_d64(FwdVariant (*v)[kNumShapes]);
int fwd_register_d128(FwdVariant (*v)[kNumShapes]);
int fwd_register_d256(FwdVariant (*v)[kNumShapes]);

/* Prints "<3>kern_cuda: what: error" to stderr and returns -EIO. */
int kern_cuda_fail(const char *what, cudaError_t e);

template <typename T> __device__ inline void store4(T *dst, float4 v);
template <> __device__ inline void store4<float>(float *dst, float4 v)
{
    *reinterpret_cast<float4 *>(dst) = v;
}
template <> __device__ inline void store4<__half>(__half *dst, float4 v)
{
    __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&a);
    u.y = *reinterpret_cast<uint32_t *>(&b);
    *reinterpret_cast<uint2 *>(dst) = u;
}
template <> __device__ inline void store4<__nv_bfloat16>(__nv_bfloat16 *dst, float4 v)
{
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&a);
    u.y = *reinterpret_cast<uint32_t *>(&b);
    *reinterpret_cast<uint2 *>(dst) = u;
}

} // namespace kcuda

#endif
