/*
 * kern_softmax.h — the online-softmax state rules every backend shares: the cpu backend, the cuda
 * forward's epilogue and its in-kernel merge. One place for the two conventions of the contract
 * (sched_plan_fmt.h): a row that saw no unmasked logit gives o = 0 and lse = -inf, never NaN;
 * partials carry a natural-log LSE whatever domain a kernel computes in. Host and device.
 *
 * A state is (m, l): the running maximum logit and the sum of exp(logit - m), in the log domain
 * of base b, where ln_b = ln(b) (1 for e, ln 2 for kernels that use exp2).
 */
#ifndef KERN_SOFTMAX_H
#define KERN_SOFTMAX_H

#include <math.h>

#if defined(__CUDACC__)
#define KERN_SM_FN static __host__ __device__ __forceinline__
#else
#define KERN_SM_FN static inline
#endif

#define KERN_LN2 0.6931471805599453f

/* What to subtract before exponentiating under a running maximum m: m itself, or 0 while the row
 * has seen no unmasked logit (m = -inf), so that exp(-inf - 0) = 0 where exp(-inf - (-inf))
 * would be NaN. */
KERN_SM_FN float kern_sm_base(float m)
{
    return m == -INFINITY ? 0.0f : m;
}

/* 1 / l to normalize the accumulator; 0 for an empty row (its accumulator is 0: o = 0). */
KERN_SM_FN float kern_sm_inv(float l)
{
    return l > 0.0f ? 1.0f / l : 0.0f;
}

/* Natural-log LSE of a state (m, l) kept in base b (ln_b = ln b); -inf for an empty row. */
KERN_SM_FN float kern_sm_lse(float m, float l, float ln_b)
{
    return l > 0.0f ? m * ln_b + logf(l) : -INFINITY;
}

/* Merge weight of a partial with natural-log LSE `lse` under the parts' maximum `mx`: 0 when
 * every part is empty (mx = -inf), so the merged row is 0, never NaN. */
KERN_SM_FN float kern_sm_weight(float lse, float mx)
{
    return mx == -INFINITY ? 0.0f : expf(lse - mx);
}

#endif
