/*
 * kern_cuda_tool.h — error exits for the host programs around the cuda backend (GPU tests, the
 * tile solver, benchmarks): a failed CUDA call or a negative errno prints where and exits 2.
 * Never included by the backend itself, which returns errors instead.
 */
#ifndef KERN_CUDA_TOOL_H
#define KERN_CUDA_TOOL_H

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

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

#endif
