/*
 * kern_cuda_tiles.c — the tile tables the cuda backend hands the scheduler, per GPU. Each
 * measured table is the output of kernels/cuda/tile_solver.cu on that GPU (its constraint
 * report and KV-length sweep are in tests/bench/RESULTS.md); a GPU without an entry gets the
 * generic table: every compiled m, n = 64 (compiled for every head_dim; the variant lookup falls
 * back to it when an n is not compiled for a head_dim).
 */
#include "kern_cuda.h"

#include <string.h>

typedef struct gpu_tiles {
    const char *name_part; /* matched against the CUDA device name */
    sched_tiles_t t;
} gpu_tiles_t;

static const gpu_tiles_t measured[] = {
    /* NVIDIA H200, 2026-11-21: every (m, n) passed the fit and bytes-in-flight rules at d 64 and
     * 128 except (64, 128) at d 128 (spills); n = 64 was the fastest at every KV length 128 .. 32K
     * of the decode sweep (n = 128: 2-30 % slower). min_ctas: computed at run time. */
    {"H200", {4, {16, 32, 64, 128}, 1, {64}, {UINT32_MAX}, 0}},
    /* NVIDIA H100 80GB HBM3, 2026-11-21: the same drops as the H200; n = 64 fastest up to 2K, a
     * tie within 1.1 % from 4K to 32K (below the solver's 3 % margin): n = 64 throughout. */
    {"H100", {4, {16, 32, 64, 128}, 1, {64}, {UINT32_MAX}, 0}},
};

static const sched_tiles_t generic = {
    .n_m = 4,
    .m = {16, 32, 64, 128},
    .n_n = 1,
    .n = {64},
    .n_upto = {UINT32_MAX},
};

int kern_cuda_tiles_for(const char *device_name, sched_tiles_t *ret)
{
    for (size_t i = 0; device_name && i < sizeof(measured) / sizeof(measured[0]); i++)
        if (measured[i].name_part && strstr(device_name, measured[i].name_part)) {
            *ret = measured[i].t;
            return 1;
        }
    *ret = generic;
    return 0;
}
