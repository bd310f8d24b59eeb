/*
 * kern_cuda.h — plain-C entry points of the CUDA kernels in kernels/cuda. No CUDA types
 * cross this header: streams are passed as void *, errors come back as negative errno.
 *
 * This release has the merge stage of a plan (sched_plan_fmt.h) on the GPU; the forward
 * kernels and the cuda backend behind kern.h are the cuda-kernels issue's work.
 */
#ifndef KERN_CUDA_H
#define KERN_CUDA_H

#include <stdint.h>

#include "kern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Merge of a plan's partials, one launch. All pointers are device memory. */
typedef struct kern_cuda_merge_params {
    const sched_plan_merge_t *merges; /* n_merges entries (the plan's merge list, on device) */
    uint32_t n_merges;
    const float *part_o;   /* [slot * kv_heads + kv_head) * group + j][head_dim] */
    const float *part_lse; /* same slots, natural log; -inf for an empty partial */
    void *o;               /* [token][q_head][head_dim] of dtype */
    uint32_t q_heads, kv_heads, head_dim;
    kern_dtype_t dtype;
    void *stream; /* cudaStream_t; NULL = the legacy default stream */
} kern_cuda_merge_params_t;

/* Returns 0 (launched; completes on the stream), -EINVAL (NULL pointer, zero or inconsistent
 * dimensions), -ENOTSUP (head_dim or dtype outside the supported set), -EIO (the launch failed:
 * the CUDA error is printed to stderr). Does not synchronize. */
int kern_cuda_merge_launch(const kern_cuda_merge_params_t *p);

#ifdef __cplusplus
}
#endif

#endif
