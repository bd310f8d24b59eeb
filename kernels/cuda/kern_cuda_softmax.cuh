/*
 * kern_cuda_softmax.cuh — the online softmax both forwards run on their accumulator rows, in the
 * log2 domain (scores times scale x log2 e), fully masked rows keeping max = -inf and giving o = 0
 * and lse = -inf, never NaN (kern_softmax.h).
 *
 * Accumulator rows (the mma.sync m16n8 C layout, which wgmma's repeats): the four lanes of a quad
 * hold one row's columns, elements 0-1 of each n8 tile are row g of the band and 2-3 row g + 8, so
 * a thread keeps the state of two rows (RowSoftmax) and a row's maximum and sum are the quad's.
 *
 * What both forwards share is RowSoftmax.rebase (the new maxima, their bases and the corrections
 * of what was summed before) and finish (the quad's sums). The exponentials and the sums' update
 * differ, and each keeps its own, because they round differently:
 *   fwd_cta (4 warps) scales scores before taking their maximum (the softcap and the mask in the
 *     same pass), exponentiates with exp2f (subnormals kept), corrects its sums first and then
 *     adds each score to them (add_exp2f), and rescales O at once;
 *   fwd_pair's consumers take the maximum of the raw scores and fold the scale into the
 *     exponent's FMA (one FFMA and one MUFU ex2.approx.ftz per score), sum the tile apart and then
 *     update l = l x c + sum (add_ex2_fma), and rescale O only once the previous tile's P.V, which
 *     is still writing it, has completed.
 */
#ifndef KERN_CUDA_SOFTMAX_CUH
#define KERN_CUDA_SOFTMAX_CUH

#include <math.h>
#include <stdint.h>

#include "kern_cuda_ptx.cuh" /* Mma<T>::pack, ex2 */
#include "kern_softmax.h"

namespace kcuda
{

/* a row's maximum and sum over its quad */
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
/* O's two rows times their softmax corrections c0 and c1 */
template <int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[DT][4], float c0, float c1)
{
#pragma unroll
    for (int i = 0; i < DT; i++) {
        o[i][0] *= c0;
        o[i][1] *= c0;
        o[i][2] *= c1;
        o[i][3] *= c1;
    }
}
/* The A fragment of one k16 step of P.V from S's n8 tiles a and b (the C layout of two n8 tiles is
 * the A layout of one k16 step) */
template <typename T>
__device__ __forceinline__ void pack_p(uint32_t (&pf)[4], const float (&a)[4], const float (&b)[4])
{
    pf[0] = Mma<T>::pack(a[0], a[1]);
    pf[1] = Mma<T>::pack(a[2], a[3]);
    pf[2] = Mma<T>::pack(b[0], b[1]);
    pf[3] = Mma<T>::pack(b[2], b[3]);
}

/* 2^x as each forward takes it: exp2f (fwd_cta), or the SFU's ex2.approx.ftz (fwd_pair: a
 * probability below 2^-126 adds nothing to a row sum of at least 1) */
struct Exp2f {
    __device__ __forceinline__ static float f(float x)
    {
        return exp2f(x);
    }
};
struct Exp2Ftz {
    __device__ __forceinline__ static float f(float x)
    {
        return ex2(x);
    }
};

/* The online softmax state of a thread's two accumulator rows r0 = g and r1 = g + 8 of its band. */
struct RowSoftmax {
    float m0 = -INFINITY, m1 = -INFINITY; /* running maxima (scaled scores); -inf: none yet */
    float l0 = 0.f, l1 = 0.f; /* running sums of 2^(s - base(m)): this thread's columns */

    /* A tile's row maxima tm (this thread's, of scores still to be scaled by k) taken over the
     * quad; the maxima become max(m, k tm); returns their bases b (kern_sm_base) and the
     * corrections c = 2^(m_old - b) of O and of the sums. */
    template <typename E>
    __device__ __forceinline__ void rebase(float tm0, float tm1, float k, float &b0, float &b1,
                                           float &c0, float &c1)
    {
        tm0 = quad_max(tm0);
        tm1 = quad_max(tm1);
        const float n0 = fmaxf(m0, tm0 * k), n1 = fmaxf(m1, tm1 * k);
        b0 = kern_sm_base(n0);
        b1 = kern_sm_base(n1);
        c0 = E::f(m0 - b0);
        c1 = E::f(m1 - b1);
        m0 = n0;
        m1 = n1;
    }
    /* fwd_cta: the sums corrected by c */
    __device__ __forceinline__ void scale_sums(float c0, float c1)
    {
        l0 *= c0;
        l1 *= c1;
    }
    /* fwd_cta: the tile's probabilities 2^(s - b) in place (s scaled), each added to the sums */
    template <int NT>
    __device__ __forceinline__ void add_exp2f(float (&s)[NT][4], float b0, float b1)
    {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = exp2f(s[j][0] - b0);
            s[j][1] = exp2f(s[j][1] - b0);
            s[j][2] = exp2f(s[j][2] - b1);
            s[j][3] = exp2f(s[j][3] - b1);
            l0 += s[j][0] + s[j][1];
            l1 += s[j][2] + s[j][3];
        }
    }
    /* fwd_pair: the tile's probabilities 2^(s k - b) in place (s still to be scaled by k), summed
     * apart; then l = l c + the tile's sum. EXP false: tests/gpu/ablate.sh's build without the
     * exponentials (p = the exponent: wrong by design). */
    template <int NT, bool EXP = true>
    __device__ __forceinline__ void add_ex2_fma(float (&s)[NT][4], float k, float b0, float b1,
                                                float c0, float c1)
    {
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int jn = 0; jn < NT; jn++) {
            auto e2 = [](float x) { return EXP ? ex2(x) : x; };
            s[jn][0] = e2(fmaf(s[jn][0], k, -b0));
            s[jn][1] = e2(fmaf(s[jn][1], k, -b0));
            s[jn][2] = e2(fmaf(s[jn][2], k, -b1));
            s[jn][3] = e2(fmaf(s[jn][3], k, -b1));
            s0 += s[jn][0] + s[jn][1];
            s1 += s[jn][2] + s[jn][3];
        }
        l0 = l0 * c0 + s0;
        l1 = l1 * c1 + s1;
    }
    /* the rows' sums over the quad, once every tile is in (the outputs' 1 / l and lse) */
    __device__ __forceinline__ void finish()
    {
        l0 = quad_sum(l0);
        l1 = quad_sum(l1);
    }
};

} // namespace kcuda

#endif
