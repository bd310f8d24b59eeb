/*
 * kern_cuda_tiles.c — the tile table the cuda backend hands the scheduler: the compiled shape set
 * (kern_cuda_shapes.h, the one place it is written) and, per GPU, the rates of the scheduler's
 * time model as kernels/cuda/tile_solver.cu measured them on that GPU (each run's report is a
 * file under tests/bench/log/, the rows in use are tests/bench/RESULTS.md's "Tile solver"). A
 * GPU without an entry gets generic rates: a model of the right shape, untuned. A row without
 * merge_us (0) leaves the merge launch unpriced beyond its partials' bytes.
 */
#include "kern_cuda.h"
#include "kern_cuda_shapes.h"

#include <string.h>

typedef struct gpu_cost {
    const char *name_part; /* matched against the CUDA device name */
    int ws;                /* 1: the rates of the warp-specialized forward, 0: the 4-warp kernels */
    sched_cost_t cost;     /* .slots is filled by the backend (occupancy) */
} gpu_cost_t;

static const gpu_cost_t measured[] = {
    /* NVIDIA H100 80GB HBM3, patd-tile-solver on the persistent warp-specialized default with
     * packed tiles, its --sanitize run (tests/bench/log/2026-11-26-tile-pack.md); merge_us:
     * bench_attn's pat - nomerge on the plans of at most 640 merged rows, where the partials'
     * bytes are negligible (6.4-8.3 us, tests/bench/log/2026-11-28-merge-fixed-cost.md) */
    {"H100", 1, {3071.6f, 386.9f, 3.42f, 0, 2.10f, 4.85f, 7.0f}},
    /* NVIDIA H200, patd-tile-solver on the persistent warp-specialized default: the medians of
     * six runs on one H200 (tests/bench/log/2026-11-28-merge-pdl.md); merge_us: bench_attn's
     * pat - nomerge on the plans of at most 1,024 merged rows, the merge launched as the
     * forward's dependent (4.0-9.6 us, median 6.6, same entry). The solver's own merge_us, one
     * plan of 160 merged rows, measures 2.7-3.3 us, the low end of that range, and the model
     * charges merge_us once per layer whatever the rows (2026-11-28-merge-batched.md) */
    {"H200", 1, {4353.8f, 381.9f, 3.45f, 0, 2.14f, 4.97f, 6.6f}},
    /* NVIDIA H200, patd-tile-solver (tests/bench/log/2026-11-24-handoff-h200-pat.md); tile_us:
     * the H100's, no H200 measurement of it */
    {"H200", 0, {4457.3f, 154.6f, 3.60f, 0, 2.0f, 0, 0}},
    /* NVIDIA H100 80GB HBM3, patd-tile-solver (tests/bench/log/2026-11-24-one-launch-per-layer.md);
     * tile_us: the median of its runs (2.53-2.74 us:
     * tests/bench/log/2026-11-24-tree-cta-size-pair.md) */
    {"H100", 0, {3054.3f, 167.5f, 3.53f, 0, 2.64f, 0, 0}},
};

/* an sm_80-class part: half an H100's bandwidth, a quarter of its rate */
static const sched_cost_t generic = {1500.0f, 60.0f, 2.5f, 0, 2.0f, 0, 0};

int kern_cuda_tiles_for(const char *device_name, int ws, sched_tiles_t *ret)
{
    static const uint16_t ms[] = {
#define KCUDA_M(m) m,
        KCUDA_TILE_MS(KCUDA_M)
#undef KCUDA_M
    };
    memset(ret, 0, sizeof(*ret));
    ret->n_m = sizeof(ms) / sizeof(ms[0]);
    memcpy(ret->m, ms, sizeof(ms));
    ret->n_n = 1;
    ret->n[0] = KCUDA_TILE_N;
    ret->n_upto[0] = UINT32_MAX;
    ret->cost = generic;
    for (size_t i = 0; device_name && i < sizeof(measured) / sizeof(measured[0]); i++)
        if (strstr(device_name, measured[i].name_part) && measured[i].ws <= ws) {
            ret->cost = measured[i].cost;
            return 1;
        }
    return 0;
}
