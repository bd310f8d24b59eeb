/*
 * kern_cuda_tool.h — for the host programs around the cuda backend (GPU tests, the tile solver,
 * benchmarks): error exits (a failed CUDA call or a negative errno prints where and exits 2) and
 * the plan edit two of them time with. Never included by the backend itself, which returns errors
 * instead.
 */
#ifndef KERN_CUDA_TOOL_H
#define KERN_CUDA_TOOL_H

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

extern "C" {
#include "sched_plan.h"
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#define REQ(x)                                                                                     \
    do {                                                                                           \
        int r_ = (x);                                                                              \
        if (r_ < 0) {                                                                              \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, r_);                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* The plan h with every row made direct and the merge list dropped (outputs wrong, timing only):
 * h's time minus this one's is what its split tokens cost the call, the merge launch included
 * (bench_attn's nomerge, the tile solver's merge_us). */
static inline std::vector<uint8_t> plan_without_merges(const sched_plan_hdr_t *h)
{
    std::vector<uint8_t> v((const uint8_t *)h, (const uint8_t *)h + h->total_bytes);
    sched_plan_hdr_t *c = reinterpret_cast<sched_plan_hdr_t *>(v.data());
    sched_plan_row_t *r = reinterpret_cast<sched_plan_row_t *>(v.data() + c->off_rows);
    for (uint32_t i = 0; i < c->n_rows; i++) {
        r[i].merge = SCHED_ROW_DIRECT;
        r[i].dst = r[i].q_tok;
    }
    c->n_merges = 0;
    c->n_partials = 0;
    return v;
}

#endif
