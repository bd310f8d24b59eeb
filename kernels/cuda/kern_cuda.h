/*
 * kern_cuda.h — plain-C entry points of the CUDA kernels in kernels/cuda. No CUDA types
 * cross this header: streams are passed as void *, errors come back as negative errno.
 *
 * The cuda backend itself is reached through kern.h (kern_backend_create("cuda", ...)); this
 * header adds what only a CUDA caller needs: the backend's stream (to order or time work with
 * events), the compiled variants (for the offline tile solver) and the per-GPU tile tables, and
 * the merge launcher.
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

/* The backend's stream (cudaStream_t): every call enqueues on it, side streams join it. */
void *kern_cuda_stream(kern_backend_t *b);

/* Uses at most n (>= 1, <= the streams it was created with) streams from now on: 1 = serial
 * (the multi-stream ablation of the benchmarks). Returns 0 or -EINVAL. */
int kern_cuda_set_streams(kern_backend_t *b, uint32_t n);

/* Read bandwidth of the current device in bytes/s: 16-byte loads over `bytes` of device memory,
 * median of `reps` timed runs after 2 warm-ups (the bandwidth floor of every benchmark).
 * Returns > 0, or -ENOMEM / -EIO / -EINVAL as a negative value. */
double kern_cuda_read_bandwidth(uint64_t bytes, int reps);

/* One compiled forward variant as the device sees it. */
typedef struct kern_cuda_variant_info {
    uint32_t head_dim, m, n;
    kern_dtype_t dtype;
    int threads;       /* per CTA */
    int smem;          /* dynamic shared memory bytes per CTA */
    int regs;          /* registers per thread (cudaFuncGetAttributes) */
    int local_bytes;   /* spills (local memory per thread) */
    int blocks_per_sm; /* occupancy API: resident CTAs per SM */
    int stage_bytes;   /* K+V bytes one pipeline stage loads */
    int stages;        /* pipeline depth */
} kern_cuda_variant_info_t;

/* Fills up to cap records of the variants compiled for head_dim on the current device and
 * returns how many exist (may exceed cap), or -EIO / -ENOTSUP. */
int kern_cuda_variants(uint32_t head_dim, kern_cuda_variant_info_t *out, uint32_t cap);

/* The committed tile table (tile_solver output) for a device name as CUDA reports it
 * ("NVIDIA H100 80GB HBM3", ...). Returns 1 when the name has a measured table, 0 when the
 * generic one was used. */
int kern_cuda_tiles_for(const char *device_name, sched_tiles_t *ret_tiles);

#ifdef __cplusplus
}
#endif

#endif
