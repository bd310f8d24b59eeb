/*
 * bench_mcast — what a thread-block cluster that multicasts each KV tile would give fwd_pair's
 * feed (issue 15: "consider clusters that multicast each KV tile to every CTA of the cluster, and
 * measure it"). sm_90a only.
 *
 * fwd_pair's dense plan (the tile solver's compute-bound plan: 512 queries x 64/8 heads over one
 * shared 2K-token prefix) is 256 CTAs of 128 rows, 32 per KV head, each streaming the head's 32
 * KV tiles (64 tokens x d 128, K and V: 32 KB) from L2 through a ring of shared-memory slots by the
 * tensor memory accelerator. With the products left out that feed alone measured 452-478
 * TFLOP/s-equivalent (RESULTS.md, 2026-11-25), about what the products alone reach (438), and the
 * kernel gets 345-356 with both.
 *
 * This program streams the same tiles through the same ring shape with consumers that compute
 * nothing (or spin a fixed time per tile, standing in for the products), two ways:
 *   solo   one CTA per SM, each loading every tile of its CTAs (four 8 KB boxes a tile);
 *   pair   clusters of two CTAs on two SMs, each pair running two CTAs of one head together: each
 *          CTA's producer loads two of the four boxes with .multicast::cluster into both CTAs'
 *          slots, so every tile leaves L2 once per pair; a slot is refilled once the consumers of
 *          both CTAs have released it (remote mbarrier arrivals).
 * Both run the same rows (256 CTAs x 32 tiles x 128 rows). Reported: the median time of 10 runs
 * after 3 (CUDA events), the rate as TFLOP/s-equivalent at 128 rows per tile (4 x 128 x 64 x 128
 * FLOP a tile), and the L2-to-SM bytes per second.
 *
 *   bench_mcast [--work-ns N,...]   (default 0,600,1000,1200)
 *
 * Exit 0 on success, 2 on a CUDA error or a device without clusters.
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "kern_cuda_ptx.cuh"
#include "kern_cuda_tool.h" /* CK */

namespace
{

constexpr int D = 128, TILE = 64, HEADS = 8, TOKENS = 2048, TILES = TOKENS / TILE;
constexpr int CTAS = 256, ROWS = 128;     /* the dense plan's CTAs and rows per CTA */
constexpr int BOX_BYTES = TILE * 64 * 2;  /* 64 tokens x 64 columns of fp16 */
constexpr int SLOT_BYTES = 4 * BOX_BYTES; /* K and V, two column halves each */
constexpr int SLOTS = 6;                  /* fwd_pair's ring at d 128 holds 6 slots of 32 KB */
constexpr int THREADS = 384;              /* a producer and two consumer warpgroups */
constexpr int SMEM = SLOTS * SLOT_BYTES + 2 * SLOTS * 8 + 1024;

struct Args {
    CUtensorMap map; /* rows: head x {K, V} x token, columns: d */
    int pair;
    uint32_t work_cycles; /* each consumer's spin per tile, standing in for its products */
    uint32_t n_ctas;      /* CTAs of 128 rows (solo: one per item; pair: two per item) */
    unsigned long long *sink;
};

/* kern_cuda_ptx.cuh: the mbarrier, TMA and cluster wrappers; the device code needs sm_90
 * (KCUDA_SM90: its pass for older targets only traps) */
using namespace kcuda;

/* Items: solo, CTA c of the plan (head c % HEADS); pair, CTAs 2p and 2p + 1 on the two CTAs of a
 * cluster (head p % HEADS). Taken round-robin by block (solo) or cluster (pair). */
__global__ void __launch_bounds__(THREADS, 1) feed(const __grid_constant__ Args a)
{
#if KCUDA_SM90
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t *ring = smem + ((1024 - (smem_u32(smem) & 1023u)) & 1023u);
    const uint32_t full0 = smem_u32(ring + SLOTS * SLOT_BYTES), empty0 = full0 + 8 * SLOTS;
    const uint32_t rank = a.pair ? cluster_rank() : 0;
    const uint32_t n_units = a.pair ? gridDim.x / 2 : gridDim.x;
    const uint32_t unit = a.pair ? blockIdx.x / 2 : blockIdx.x;
    const uint32_t items = a.pair ? a.n_ctas / 2 : a.n_ctas;
    if (threadIdx.x < SLOTS) {
        mb_init(full0 + 8 * threadIdx.x, 1);
        mb_init(empty0 + 8 * threadIdx.x, a.pair ? 4 : 2);
    }
    fence_mbarrier_init();
    __syncthreads();
    if (a.pair)
        cluster_sync(); /* the peer's barriers exist before anything arrives on them */
    const int wg = threadIdx.x / 128;
    unsigned long long acc = 0;
    if (wg == 0) {
        if (threadIdx.x == 0) {
            int s = 0;
            uint32_t ph = 0, n = 0;
            for (uint32_t it = unit; it < items; it += n_units) {
                const int head = (int)(it % HEADS);
                for (int t = 0; t < TILES; t++) {
                    if (n >= SLOTS)
                        mb_wait_cluster(empty0 + 8 * s, ph ^ 1);
                    n++;
                    const uint32_t dst = smem_u32(ring + s * SLOT_BYTES), bar = full0 + 8 * s;
                    mb_arrive_expect_tx(bar, SLOT_BYTES);
                    for (int b = 0; b < 4; b++) { /* K lo, K hi, V lo, V hi */
                        const int row = (head * 2 + b / 2) * TOKENS + t * TILE, col = (b & 1) * 64;
                        if (!a.pair)
                            tma_load2(dst + b * BOX_BYTES, &a.map, bar, col, row);
                        else if ((uint32_t)(b & 1) == rank)
                            tma_load2_mc(dst + b * BOX_BYTES, &a.map, bar, col, row, 3);
                    }
                    if (++s == SLOTS) {
                        s = 0;
                        ph ^= 1;
                    }
                }
            }
        }
    } else if ((threadIdx.x & 127) == 0) { /* one thread a consumer warpgroup */
        int s = 0;
        uint32_t ph = 0;
        for (uint32_t it = unit; it < items; it += n_units)
            for (int t = 0; t < TILES; t++) {
                mb_wait_cluster(full0 + 8 * s, ph);
                acc += *reinterpret_cast<volatile uint32_t *>(ring + s * SLOT_BYTES + 64 * wg);
                if (a.work_cycles) {
                    const long long t0 = clock64();
                    while (clock64() - t0 < (long long)a.work_cycles) {
                    }
                }
                mb_arrive_release(empty0 + 8 * s);
                if (a.pair)
                    mb_arrive_rank(empty0 + 8 * s, rank ^ 1);
                if (++s == SLOTS) {
                    s = 0;
                    ph ^= 1;
                }
            }
    }
    if (a.pair)
        cluster_sync(); /* no CTA leaves while its peer may still arrive on its barriers */
    if (acc == 0x5a5a5a5a5a5a5a5aull)
        *a.sink = acc; /* keeps the reads */
#else
    __trap(); /* clusters and TMA need sm_90: main refuses older devices */
#endif
}

using EncodeFn = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                              const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                              const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

double run(Args &a, int grid, int pair)
{
    a.pair = pair;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = SMEM;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = pair ? 2 : 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 13; i++) {
        CK(cudaEventRecord(e0));
        CK(cudaLaunchKernelEx(&cfg, feed, a));
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i >= 3)
            ms.push_back(t);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return 0.5 * (ms[4] + ms[5]) * 1e-3;
}

} // namespace

int main(int argc, char **argv)
{
    std::vector<double> works = {0, 600, 1000, 1200};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--work-ns") && i + 1 < argc) {
            works.clear();
            for (char *p = argv[++i]; *p;) {
                works.push_back(strtod(p, &p));
                if (*p == ',')
                    p++;
                else if (*p) {
                    fprintf(stderr, "bench_mcast: bad --work-ns list\n");
                    return 2;
                }
            }
        } else {
            fprintf(stderr, "usage: bench_mcast [--work-ns N,...]\n");
            return 2;
        }
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    if (p.major < 9) {
        fprintf(stderr, "bench_mcast: needs sm_90 (clusters, TMA multicast), found %d.%d\n",
                p.major, p.minor);
        return 2;
    }
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const size_t bytes = (size_t)HEADS * 2 * TOKENS * D * 2;
    void *kv;
    CK(cudaMalloc(&kv, bytes));
    CK(cudaMemset(kv, 0x3c, bytes));
    unsigned long long *sink;
    CK(cudaMalloc(&sink, sizeof(*sink)));

    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                        &q));
    if (q != cudaDriverEntryPointSuccess || !fn) {
        fprintf(stderr, "bench_mcast: the driver has no cuTensorMapEncodeTiled\n");
        return 2;
    }
    Args a = {};
    const cuuint64_t dims[2] = {D, (cuuint64_t)HEADS * 2 * TOKENS};
    const cuuint64_t strides[1] = {D * 2};
    const cuuint32_t box[2] = {64, TILE}, unit[2] = {1, 1};
    CUresult r = reinterpret_cast<EncodeFn>(fn)(
        &a.map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, kv, dims, strides, box, unit,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "bench_mcast: cuTensorMapEncodeTiled: %d\n", (int)r);
        return 2;
    }
    a.n_ctas = CTAS;
    a.sink = sink;
    CK(cudaFuncSetAttribute(feed, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));

    /* pairs: as many clusters of two as can be resident at once */
    cudaLaunchConfig_t cc = {};
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = 2;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    cc.gridDim = dim3(2 * p.multiProcessorCount);
    cc.blockDim = dim3(THREADS);
    cc.dynamicSmemBytes = SMEM;
    cc.attrs = &at;
    cc.numAttrs = 1;
    int n_clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&n_clusters, feed, &cc));
    if (n_clusters < 1) {
        fprintf(stderr, "bench_mcast: no cluster of two fits\n");
        return 2;
    }
    const int solo_grid = std::min(p.multiProcessorCount, CTAS);
    const int pair_grid = 2 * std::min(n_clusters, CTAS / 2);
    const double flop = (double)CTAS * TILES * 4.0 * ROWS * TILE * D;
    printf("%s, %d SMs, SM clock %.0f MHz; %d CTAs x %d tiles of 32 KB (64 tokens x d %d, K+V), "
           "%d rows each; ring of %d slots\n",
           p.name, p.multiProcessorCount, clock_khz / 1e3, CTAS, TILES, D, ROWS, SLOTS);
    printf("solo: %d blocks; pair: %d clusters of 2 (%d blocks)\n", solo_grid, pair_grid / 2,
           pair_grid);
    printf("%-8s %-5s %10s %14s %12s %14s\n", "work ns", "way", "time us", "TFLOP/s-equiv",
           "L2->SM TB/s", "us per tile/SM");
    for (double w : works) {
        a.work_cycles = (uint32_t)(w * clock_khz / 1e6);
        double t[2];
        for (int pair = 0; pair < 2; pair++) {
            t[pair] = run(a, pair ? pair_grid : solo_grid, pair);
            const int grid = pair ? pair_grid : solo_grid;
            const double moved = (double)CTAS * TILES * SLOT_BYTES / (pair ? 2 : 1);
            const double per_tile = t[pair] * grid / ((double)CTAS * TILES);
            printf("%-8.0f %-5s %10.1f %14.0f %12.2f %14.3f\n", w, pair ? "pair" : "solo",
                   t[pair] * 1e6, flop / t[pair] / 1e12, moved / t[pair] / 1e12, per_tile * 1e6);
        }
        printf("%-8.0f pair / solo time %.3f\n", w, t[1] / t[0]);
    }
    CK(cudaFree(kv));
    CK(cudaFree(sink));
    printf("1 passed, 0 failed\n");
    return 0;
}
