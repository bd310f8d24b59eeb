/*
 * kern_cuda.h — plain-C entry points of the CUDA kernels in kernels/cuda. No CUDA types
 * cross this header: streams are passed as void *, errors come back as negative errno.
 *
 * The cuda backend itself is reached through kern.h (kern_backend_create("cuda", ...)); this
 * header adds what only a CUDA caller needs: the backend's stream (to order or time work with
 * events) and the per-GPU tile tables. The probes below the line live in a separate library
 * (libpatcudatools.a, kern_cuda_tools.cu) that only the tools, tests and benchmarks link.
 */
#ifndef KERN_CUDA_H
#define KERN_CUDA_H

#include <stdint.h>

#include "kern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's stream (cudaStream_t): every call of kern.h enqueues on it. */
void *kern_cuda_stream(kern_backend_t *b);

/* The device address of layer `layer`'s KV in the pool, and the elements of one block of it
 * (block b at b x block_elems: K of every KV head, KERN_BLOCK_SIZE tokens of head_dim each, then
 * V the same way). For tests that write the pool from a kernel of their own. */
void *kern_cuda_pool(kern_backend_t *b, uint32_t layer, uint64_t *block_elems);

/* The tile table for a device name as CUDA reports it ("NVIDIA H100 80GB HBM3", ...): the
 * compiled shapes (kern_cuda_shapes.h) and the time-model rates tile_solver measured on that GPU
 * (cost.slots is the backend's to fill: it depends on the occupancy of the model's kernel). ws:
 * the forward is the warp-specialized kernel (its rates where measured, else the 4-warp
 * kernels'). Returns 1 when the name has measured rates, 0 when the generic ones were used. */
int kern_cuda_tiles_for(const char *device_name, int ws, sched_tiles_t *ret_tiles);

/* ---------------------------------------------------------------- tools (libpatcudatools.a) */

/* Read bandwidth of the current device in bytes/s: 16-byte loads over `bytes` of device memory,
 * median of `reps` timed runs after 2 warm-ups (the bandwidth floor of every benchmark).
 * Returns > 0, or -ENOMEM / -EIO / -EINVAL as a negative value. */
double kern_cuda_read_bandwidth(uint64_t bytes, int reps);

/* One compiled forward kernel (one per dtype and head_dim; it runs every tile m) as the device
 * sees it. */
typedef struct kern_cuda_variant_info {
    uint32_t head_dim, m, n; /* m: the largest tile m it runs */
    kern_dtype_t dtype;
    int wgmma;         /* 1: the KERN_FWD_AUTO kernel (wgmma for some CTAs on sm_90a) */
    int threads;       /* per CTA */
    int smem;          /* dynamic shared memory bytes per CTA (the largest shape's) */
    int regs;          /* registers per thread (cudaFuncGetAttributes) */
    int local_bytes;   /* spills (local memory per thread) */
    int blocks_per_sm; /* occupancy API: resident CTAs per SM */
    int stage_bytes;   /* K+V bytes one pipeline stage loads */
} kern_cuda_variant_info_t;

/* Fills up to cap records of the kernels compiled for head_dim on the current device and
 * returns how many exist (may exceed cap), or -EIO / -ENOTSUP. */
int kern_cuda_variants(uint32_t head_dim, kern_cuda_variant_info_t *out, uint32_t cap);

#ifdef __cplusplus
}
#endif

#endif
