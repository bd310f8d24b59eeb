/*
 * tile_solver.cu — the offline solver of the tile table (patd-tile-solver). Run it on a GPU;
 * paste its table into kern_cuda_tiles.c and its report into tests/bench/RESULTS.md.
 *
 * 1. Device limits: SMs, shared memory and registers per SM; measured read bandwidth (16-byte
 *    loads over 1 GiB) and DRAM latency (a dependent pointer chase over 1 GiB, one thread).
 *    Little's law gives the bytes that must be in flight per SM to cover the latency:
 *    need = bandwidth x latency / SMs.
 * 2. Every compiled variant (cudaFuncGetAttributes, the occupancy API) against the paper's three
 *    constraints: (a) it fits: >= 1 resident CTA per SM, no register spills; (b) bytes in flight:
 *    resident CTAs x one pipeline stage (K+V of a tile) >= need; (c) MMA shape rules (m a
 *    multiple of 16, each warp's KV slice a multiple of 16) — static_asserts at compile time.
 * 3. n by KV length: decode batches (64 unshared queries, GQA 4, d 128, fp16, split as the daemon
 *    does) for KV lengths 128 .. 32K, timed with each n that passed for m = 16; n_upto takes the
 *    smallest n unless a larger one is faster by more than kMargin (run-to-run noise is ~1 %:
 *    a near tie must not make the table flip between n at neighbouring lengths).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "kern.h"
#include "sched_plan.h"
}
#include "kern_cuda.h"
#include "kern_cuda_tool.h"

__global__ void chase_kernel(const uint64_t *next, uint32_t steps, uint64_t *out)
{
    uint64_t i = 0;
    for (uint32_t s = 0; s < steps; s++)
        i = next[i];
    *out = i;
}

constexpr double kMargin = 0.03;

static float time_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms;
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

int main(int argc, char **argv)
{
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* 1. limits */
    const uint64_t bytes = 1ull << 30;
    void *buf;
    uint32_t *sink;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&sink, 8));
    const double bw = kern_cuda_read_bandwidth(bytes, 7);
    REQ((int)(bw > 0 ? 0 : bw));
    /* pointer chase: a random cycle over 1 GiB with a 4 KiB stride granularity (defeats L2) */
    const uint64_t slots = bytes / 4096;
    std::vector<uint64_t> order(slots), host(bytes / 8, 0);
    for (uint64_t i = 0; i < slots; i++)
        order[i] = i;
    uint64_t x = 88172645463325252ull;
    for (uint64_t i = slots - 1; i > 0; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::swap(order[i], order[x % (i + 1)]);
    }
    for (uint64_t i = 0; i < slots; i++)
        host[order[i] * 512] = order[(i + 1) % slots] * 512;
    CK(cudaMemcpy(buf, host.data(), bytes, cudaMemcpyHostToDevice));
    const uint32_t steps = 20000;
    chase_kernel<<<1, 1>>>((const uint64_t *)buf, 100, (uint64_t *)sink);
    CK(cudaEventRecord(e0));
    chase_kernel<<<1, 1>>>((const uint64_t *)buf, steps, (uint64_t *)sink);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e1));
    const double lat = time_ms(e0, e1) * 1e-3 / steps;
    CK(cudaFree(buf));
    CK(cudaFree(sink));
    const double need = bw * lat / prop.multiProcessorCount;
    printf("device: %s (sm_%d%d), %d SMs, %zu KB shared/SM, %d regs/SM\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, prop.sharedMemPerMultiprocessor / 1024,
           prop.regsPerMultiprocessor);
    printf("measured: read bandwidth %.0f GB/s, DRAM latency %.0f ns -> in flight per SM >= %.1f "
           "KB\n\n",
           bw / 1e9, lat * 1e9, need / 1024);

    /* 2. constraints per variant */
    bool ok_mn[129][129] = {}; /* [m][n] passed for every head_dim and dtype it was compiled for */
    bool seen[129][129] = {};
    printf("%4s %5s %4s %4s %7s %7s %5s %6s %9s %10s  %s\n", "d", "dtype", "m", "n", "threads",
           "smem", "regs", "CTA/SM", "stage KB", "flight KB", "verdict");
    for (uint32_t d : {64u, 128u, 256u}) {
        kern_cuda_variant_info_t v[64];
        int n = kern_cuda_variants(d, v, 64);
        REQ(n);
        for (int i = 0; i < n && i < 64; i++) {
            const kern_cuda_variant_info_t &a = v[i];
            const double flight = (double)a.blocks_per_sm * a.stage_bytes * (a.stages - 1);
            const bool fits = a.blocks_per_sm >= 1 && a.local_bytes == 0;
            const bool enough = flight >= need;
            const char *why = !fits     ? "drop: does not fit (occupancy 0 or spills)"
                              : !enough ? "drop: too few bytes in flight"
                                        : "keep";
            printf("%4u %5s %4u %4u %7d %7d %5d %6d %9.1f %10.1f  %s\n", d,
                   a.dtype == KERN_F16 ? "f16" : "bf16", a.m, a.n, a.threads, a.smem, a.regs,
                   a.blocks_per_sm, a.stage_bytes / 1024.0, flight / 1024, why);
            if (!seen[a.m][a.n]) {
                seen[a.m][a.n] = true;
                ok_mn[a.m][a.n] = true;
            }
            /* a shape stays in the table when it passes for d 64 and 128; for d 256 the backend
             * falls back to n = 64 where a larger n is not compiled */
            if (!(fits && enough) && d != 256)
                ok_mn[a.m][a.n] = false;
        }
    }

    /* 3. n by KV length (m = 16 decode rows) */
    std::vector<uint32_t> ns;
    for (uint32_t n : {64u, 128u})
        if (ok_mn[16][n])
            ns.push_back(n);
    const uint32_t lens[] = {128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
    const uint32_t nq = 64, qh = 32, kvh = 8, dd = 128;
    printf("\nn sweep: %u unshared decode queries, %u/%u heads, d %u, fp16 (median of 30, us)\n",
           nq, qh, kvh, dd);
    printf("%7s", "kv_len");
    for (uint32_t n : ns)
        printf(" %9s%-3u", "n=", n);
    printf("  best\n");
    std::vector<uint32_t> best(sizeof(lens) / sizeof(lens[0]));
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        const uint32_t L = lens[li], blocks_per = L / 16;
        kern_config_t kc = {};
        kc.model = {1, qh, kvh, dd, 16, KERN_F16};
        kc.n_blocks = nq * blocks_per;
        kc.max_tokens = nq;
        kc.max_partials = 64 * nq;
        kern_backend_t *b;
        REQ(kern_backend_create("cuda", &kc, &b));
        void *q, *o;
        CK(cudaMalloc(&q, (size_t)nq * qh * dd * 2));
        CK(cudaMalloc(&o, (size_t)nq * qh * dd * 2));
        CK(cudaMemset(q, 0x3c, (size_t)nq * qh * dd * 2)); /* 1.0 in fp16: a finite Q */
        std::vector<uint32_t> tbl(blocks_per);
        sched_tiles_t dev;
        kern_tiles(b, &dev); /* its min_ctas: split as the backend will */
        printf("%7u", L);
        double best_t = 1e30;
        for (uint32_t n : ns) {
            sched_tiles_t tiles = {4,           {16, 32, 64, 128}, 1, {(uint16_t)n}, {UINT32_MAX},
                                   dev.min_ctas};
            sched_config_t sc = {};
            sc.max_queries = nq;
            sc.max_tokens = nq;
            sc.block_size = 16;
            sc.q_heads = qh;
            sc.kv_heads = kvh;
            sc.head_dim = dd;
            sc.kv_elt_bytes = 2;
            sc.policy = SCHED_POLICY_QUERY;
            sc.tiles = &tiles;
            sc.split_min_kv = 256;
            sc.max_partials = kc.max_partials;
            sched_t *s;
            REQ(sched_create(&sc, &s));
            for (uint32_t i = 0; i < nq; i++) {
                for (uint32_t k = 0; k < blocks_per; k++)
                    tbl[k] = i * blocks_per + k;
                sched_query_t qq = {tbl.data(), blocks_per, L, 1, i};
                REQ(sched_forest_join(sched_forest(s), i, &qq));
            }
            const sched_plan_hdr_t *h;
            REQ(sched_build(s, &h));
            kern_attn_params_t p = {0.088f, 0};
            cudaStream_t st = static_cast<cudaStream_t>(kern_cuda_stream(b));
            std::vector<float> tt;
            for (int r = 0; r < 35; r++) {
                CK(cudaEventRecord(e0, st));
                REQ(kern_attend(b, 0, h, q, o, &p));
                CK(cudaEventRecord(e1, st));
                if (r >= 5)
                    tt.push_back(time_ms(e0, e1) * 1e3f);
            }
            std::sort(tt.begin(), tt.end());
            const double med = tt[tt.size() / 2];
            printf(" %12.1f", med);
            if (med < best_t * (1.0 - kMargin) || best_t == 1e30) {
                best_t = med;
                best[li] = n;
            }
            sched_free(s);
        }
        printf("  %u\n", best[li]);
        CK(cudaFree(q));
        CK(cudaFree(o));
        kern_backend_free(b);
    }

    /* 4. the table */
    printf("\n/* %s: tile_solver output */\n{\"%s\",\n {", prop.name, prop.name);
    std::vector<uint32_t> ms;
    for (uint32_t m : {16u, 32u, 64u, 128u})
        for (uint32_t n : {64u, 128u})
            if (ok_mn[m][n] && ok_mn[m][64] && std::find(ms.begin(), ms.end(), m) == ms.end())
                ms.push_back(m);
    printf("%zu, {", ms.size());
    for (size_t i = 0; i < ms.size(); i++)
        printf("%s%u", i ? ", " : "", ms[i]);
    /* runs of equal best n become (n, n_upto) entries */
    std::vector<std::pair<uint32_t, uint32_t>> runs;
    for (size_t li = 0; li < best.size(); li++) {
        if (!runs.empty() && runs.back().first == best[li])
            runs.back().second = lens[li];
        else
            runs.push_back({best[li], lens[li]});
    }
    runs.back().second = UINT32_MAX;
    printf("}, %zu, {", runs.size());
    for (size_t i = 0; i < runs.size(); i++)
        printf("%s%u", i ? ", " : "", runs[i].first);
    printf("}, {");
    for (size_t i = 0; i < runs.size(); i++)
        if (runs[i].second == UINT32_MAX)
            printf("%sUINT32_MAX", i ? ", " : "");
        else
            printf("%s%u", i ? ", " : "", runs[i].second);
    printf("}, 0}},\n");
    return 0;
}
