/*
 * tile_solver.cu — the offline solver of the per-GPU time-model rates (patd-tile-solver). Run it
 * on a GPU; paste its last line into kern_cuda_tiles.c and its report into a new
 * tests/bench/log/YYYY-MM-DD-topic.md, and update tests/bench/RESULTS.md's "Tile solver" rows.
 *
 * 1. Device limits: SMs, shared memory and registers per SM; measured read bandwidth (16-byte
 *    loads over 1 GiB) and DRAM latency (a dependent pointer chase over 1 GiB, one thread).
 *    Little's law gives the bytes that must be in flight per SM to cover the latency:
 *    need = bandwidth x latency / SMs.
 * 2. Every compiled forward kernel (cudaFuncGetAttributes, the occupancy API) against the
 *    paper's constraints: (a) it fits: >= 1 resident CTA per SM, no register spills; (b) bytes in
 *    flight: resident CTAs x one pipeline stage (K+V of a tile) >= need; (c) MMA shape rules —
 *    static_asserts at compile time (kern_cuda_fwd.cuh). The shape set itself is written once in
 *    kern_cuda_shapes.h.
 * 3. The rates of the scheduler's time model (sched_cost_t): the read bandwidth from 1; the
 *    kernel's sustained tensor rate on a compute-bound plan (512 queries x 64/8 heads over one
 *    shared 2K-token prefix: the default forward's largest CTAs, KV L2-resident); the fixed cost of
 * one work item from a plan of 32K one-token items (time / waves of resident slots); the time one
 * KV tile costs its CTA at the least (tile_us) from one wave of TREE CTAs that each walk 65
 * one-tile segments; the merge launch's own time (merge_us) from a plan of 160 merged rows, timed
 * as planned and with its split rows made direct (bench_attn's pat - nomerge, on one plan).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "kern.h"
#include "kern_cuda_shapes.h"
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

static float time_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms;
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* Median seconds of one layer of plan h on b's stream: 30 timed calls after 5 of warm-up. */
static double layer_median(kern_backend_t *b, const sched_plan_hdr_t *h, const void *q, void *o,
                           cudaEvent_t e0, cudaEvent_t e1)
{
    kern_attn_params_t p = {0.088f, 0};
    cudaStream_t st = static_cast<cudaStream_t>(kern_cuda_stream(b));
    std::vector<float> tt;
    for (int r = 0; r < 35; r++) {
        CK(cudaEventRecord(e0, st));
        REQ(kern_attend(b, 0, h, q, o, &p));
        CK(cudaEventRecord(e1, st));
        if (r >= 5)
            tt.push_back(time_ms(e0, e1) * 1e-3f);
    }
    std::sort(tt.begin(), tt.end());
    return tt[tt.size() / 2];
}

/* One measurement's world: a cuda backend over n_blocks blocks for nq one-token queries of
 * qh / kvh heads, d 128 fp16 (one layer, one partial), a finite Q and an O on the GPU, and a
 * scheduler of the backend's tiles under policy (only_m > 0: CTAs of only_m rows). */
struct World {
    kern_backend_t *b;
    sched_tiles_t tiles; /* the scheduler reads it through its config */
    sched_t *s;
    void *q, *o;
};

static void world_open(World *w, uint32_t nq, uint32_t qh, uint32_t kvh, uint32_t n_blocks,
                       kern_fwd_t fwd, sched_policy_t policy, uint32_t only_m,
                       uint32_t split_kv = 0)
{
    const uint32_t dd = 128;
    kern_config_t kc = {};
    kc.model = {1, qh, kvh, dd, 16, KERN_F16, KERN_F16, 0.f};
    kc.n_blocks = n_blocks;
    kc.max_tokens = nq;
    kc.max_partials = split_kv ? 64 * nq : 1;
    kc.fwd = fwd;
    REQ(kern_backend_create("cuda", &kc, &w->b));
    const size_t qo_bytes = (size_t)nq * qh * dd * 2;
    CK(cudaMalloc(&w->q, qo_bytes));
    CK(cudaMalloc(&w->o, qo_bytes));
    CK(cudaMemset(w->q, 0x3c, qo_bytes)); /* 1.0 in fp16: a finite Q */
    CK(cudaDeviceSynchronize()); /* the backend's stream does not wait for the legacy stream */
    kern_tiles(w->b, &w->tiles);
    if (only_m) {
        w->tiles.n_m = 1;
        w->tiles.m[0] = (uint16_t)only_m;
    }
    if (split_kv) { /* no time model: the fill split cuts every query into parts of split_kv */
        w->tiles.min_ctas = 1u << 20;
        w->tiles.cost = {};
    }
    sched_config_t sc = {};
    sc.max_queries = nq;
    sc.max_tokens = nq;
    sc.block_size = 16;
    sc.q_heads = qh;
    sc.kv_heads = kvh;
    sc.head_dim = dd;
    sc.kv_elt_bytes = 2;
    sc.policy = policy;
    sc.tiles = &w->tiles;
    sc.split_min_kv = split_kv;
    sc.max_partials = kc.max_partials;
    REQ(sched_create(&sc, &w->s));
}

static void world_close(World *w)
{
    sched_free(w->s);
    CK(cudaFree(w->q));
    CK(cudaFree(w->o));
    kern_backend_free(w->b);
}

/* Median seconds of one layer of a plan over nq queries of kv_len tokens, q_heads / kv_heads,
 * d 128 fp16: shared = every query reads the same blocks (one pack, policy paper, no split), else
 * each its own (query-centric). Returns FLOP/s when shared, else seconds. */
static double measure_plan(cudaEvent_t e0, cudaEvent_t e1, uint32_t nq, uint32_t kv_len,
                           uint32_t qh, uint32_t kvh, bool shared, kern_fwd_t fwd = KERN_FWD_AUTO)
{
    const uint32_t dd = 128, blocks_per = (kv_len + 15) / 16;
    World w;
    world_open(&w, nq, qh, kvh, shared ? blocks_per : nq * blocks_per, fwd,
               shared ? SCHED_POLICY_PAPER : SCHED_POLICY_QUERY, 0);
    std::vector<uint32_t> tbl(blocks_per);
    for (uint32_t i = 0; i < nq; i++) {
        for (uint32_t k = 0; k < blocks_per; k++)
            tbl[k] = shared ? k : i * blocks_per + k;
        sched_query_t qq = {tbl.data(), blocks_per, kv_len, 1, i, 0};
        REQ(sched_forest_join(sched_forest(w.s), i, &qq));
    }
    const sched_plan_hdr_t *h;
    REQ(sched_build(w.s, &h));
    const double sec = layer_median(w.b, h, w.q, w.o, e0, e1);
    /* the FLOPs the tensor cores run: every CTA's m rows (padded) over its KV */
    double flops = 0;
    const sched_plan_cta_t *c = sched_plan_ctas(h);
    for (uint32_t i = 0; i < h->n_ctas; i++)
        flops += 4.0 * sched_plan_groups(h)[c[i].group].m * c[i].kv_tokens * dd * kvh;
    world_close(&w);
    return shared ? flops / sec : sec;
}

/* Median seconds of one layer of a TREE plan of CTAs of m rows (8/8 heads, d 128 fp16).
 * priv > 0 (the chain): nq queries share one 16-token block and each has a private one, priv
 * times over in its table, so every CTA of m = 64 walks 65 segments of little data: with priv = 4,
 * 65 whole tiles that read one block four times (from DRAM once, then from L2, so that the chain's
 * latency binds, not the bandwidth: kern's tile_us); with priv = 1, 65 one-page segments, 17 tiles
 * where the backend packs four pages to a tile.
 * priv = 0: each run of m queries shares a 16-token block and has nothing private: CTAs of m rows
 * and one one-tile segment, which fwd_pair runs (m > KCUDA_WS_MIN_ROWS): its cost per item. */
static double measure_tree(cudaEvent_t e0, cudaEvent_t e1, uint32_t nq, uint32_t m, uint32_t priv)
{
    const bool chain = priv > 0;
    World w;
    world_open(&w, nq, 8, 8, chain ? 1 + nq : (nq + m - 1) / m, KERN_FWD_AUTO, SCHED_POLICY_TREE,
               m);
    for (uint32_t i = 0; i < nq; i++) {
        uint32_t tbl[5] = {chain ? 0 : i / m, 1 + i, 1 + i, 1 + i, 1 + i};
        sched_query_t qq = {tbl, 1 + priv, 16 * (1 + priv), 1, i, 0};
        REQ(sched_forest_join(sched_forest(w.s), i, &qq));
    }
    const sched_plan_hdr_t *h;
    REQ(sched_build(w.s, &h));
    const double sec = layer_median(w.b, h, w.q, w.o, e0, e1);
    world_close(&w);
    return sec;
}

/* The merge launch's own time (merge_us), in seconds: one layer of 10 one-token queries over one
 * shared 4,096-token prefix, 16/8 heads (one pack of 20 rows: fwd_pair, as on the paper trees),
 * the prefix cut into parts of 256 tokens (160 merged rows, the fewest bench_attn's paper trees
 * merge), timed as planned and with every row made direct. The partials' bytes are negligible at
 * that size: what remains is the launch. */
static double measure_merge(cudaEvent_t e0, cudaEvent_t e1, uint32_t *merged_rows, uint32_t *parts)
{
    const uint32_t nq = 10, qh = 16, kv_len = 4096, blocks_per = kv_len / 16;
    World w;
    world_open(&w, nq, qh, 8, blocks_per, KERN_FWD_AUTO, SCHED_POLICY_PAPER, 0, 256);
    std::vector<uint32_t> tbl(blocks_per);
    for (uint32_t k = 0; k < blocks_per; k++)
        tbl[k] = k;
    for (uint32_t i = 0; i < nq; i++) {
        sched_query_t qq = {tbl.data(), blocks_per, kv_len, 1, i, 0};
        REQ(sched_forest_join(sched_forest(w.s), i, &qq));
    }
    const sched_plan_hdr_t *h;
    REQ(sched_build(w.s, &h));
    if (h->n_merges == 0) {
        fprintf(stderr, "tile_solver: the merge plan has no merges (the fill split did not cut)\n");
        exit(1);
    }
    *merged_rows = h->n_merges * qh;
    *parts = sched_plan_merges(h)[0].part_count;
    const std::vector<uint8_t> direct = plan_without_merges(h);
    const double with = layer_median(w.b, h, w.q, w.o, e0, e1);
    const double without = layer_median(
        w.b, reinterpret_cast<const sched_plan_hdr_t *>(direct.data()), w.q, w.o, e0, e1);
    world_close(&w);
    return with - without;
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

    /* 2. the compiled kernels against the constraints */
    printf("%4s %5s %5s %5s %4s %7s %7s %5s %6s %9s %10s  %s\n", "d", "dtype", "mma", "m<=", "n",
           "threads", "smem", "regs", "CTA/SM", "stage KB", "flight KB", "verdict");
    for (uint32_t d : {64u, 128u, 256u}) {
        kern_cuda_variant_info_t v[8];
        int n = kern_cuda_variants(d, v, 8);
        REQ(n);
        for (int i = 0; i < n && i < 8; i++) {
            const kern_cuda_variant_info_t &a = v[i];
            /* stages - 1 tiles are in flight while one is computed: at least one */
            const double flight = (double)a.blocks_per_sm * a.stage_bytes;
            const bool fits = a.blocks_per_sm >= 1 && a.local_bytes == 0;
            const char *why = !fits           ? "does not fit (occupancy 0 or spills)"
                              : flight < need ? "too few bytes in flight"
                                              : "ok";
            printf("%4u %5s %5s %5u %4u %7d %7d %5d %6d %9.1f %10.1f  %s\n", d,
                   a.dtype == KERN_F16 ? "f16" : "bf16", a.wgmma ? "wg" : "sync", a.m, a.n,
                   a.threads, a.smem, a.regs, a.blocks_per_sm, a.stage_bytes / 1024.0,
                   flight / 1024, why);
        }
    }

    /* 3. the time model's rates (sched_cost_t), on d 128 fp16 */
    const double mma = measure_plan(e0, e1, 512, 2048, 64, 8, true);
    /* for the report: the 4-warp kernels on the same plan (KERN_FWD_LAYER: m = 64 CTAs), and the
     * default forward over a KV four times longer (its per-CTA fill and drain amortized) */
    const double layer = measure_plan(e0, e1, 512, 2048, 64, 8, true, KERN_FWD_LAYER);
    const double tma = measure_plan(e0, e1, 512, 2048, 64, 8, true, KERN_FWD_TMA);
    const double mma8k = measure_plan(e0, e1, 512, 8192, 64, 8, true);
    const double t_small = measure_plan(e0, e1, 4096, 1, 8, 8, false);
    sched_tiles_t dev;
    {
        kern_config_t kc = {};
        kc.model = {1, 8, 8, 128, 16, KERN_F16, KERN_F16, 0.f};
        kc.n_blocks = 16;
        kc.max_tokens = 16;
        kc.max_partials = 16;
        kern_backend_t *b;
        REQ(kern_backend_create("cuda", &kc, &b));
        kern_tiles(b, &dev);
        kern_backend_free(b);
    }
    const double items = 4096.0 * 8, waves = ceil(items / dev.cost.slots);
    const double cta_us = t_small / waves;
    /* one wave of 65-tile TREE CTAs: 64 queries per CTA x 8 KV heads = slots items; and the same
     * CTAs over one-page segments, packed where the backend packs */
    const uint32_t chain_q = 64 * ((dev.cost.slots + 7) / 8);
    const double t_chain = measure_tree(e0, e1, chain_q, 64, 4);
    const double t_packed = measure_tree(e0, e1, chain_q, 64, 1);
    /* fwd_pair's own cost per item: CTAs of 32 rows (small mode: two KV heads an item), one
     * one-tile segment each, many waves */
    const uint32_t pair_q = 32 * 1024;
    const double t_pair = measure_tree(e0, e1, pair_q, 32, 0);
    const double pair_items = (pair_q / 32.0) * 8 / 2, pair_blocks = dev.cost.slots / 2.0;
    /* the chain's tiles: a 64-token segment each. The one-page segments' tiles: a segment each,
     * or as the backend's item rule lays them out (sched_tiles_t.item: 17 tiles of four). The
     * model prices every tile at the whole tile's tile_us: the packed tile's own price (below,
     * for the report) made its plans slower on the 72 cases
     * (tests/bench/log/2026-11-26-tile-pack.md) */
    const double tile_us = (t_chain - cta_us) / 65.0;
    double packed_tiles = 65.0;
    if (dev.item) {
        /* the 64 rows' shared block, then each row's private one */
        sched_span_t sp[65];
        sp[0] = {0, 16, 0, 64};
        for (uint32_t i = 1; i < 65; i++)
            sp[i] = {16 * i, 16 * i + 16, i - 1, i};
        sched_item_t it;
        dev.item(64, 1, KCUDA_TILE_N, 0, sp, sizeof(sp[0]), 65, &it);
        packed_tiles = (double)it.tiles;
    }
    const double packed_us = (t_packed - cta_us) / packed_tiles;
    printf(
        "\ntensor rate: 512 queries x 64/8 heads over one shared 2,048-token prefix (the default "
        "forward's largest CTAs, L2-resident KV): %.1f TFLOP/s (over 8,192 tokens %.1f; the "
        "4-warp kernels, m = 64: %.1f; KV pages by TMA instead of cp.async: %.1f)\n",
        mma / 1e12, mma8k / 1e12, layer / 1e12, tma / 1e12);
    printf("fixed cost: 4,096 one-token queries x 8 KV heads (%.0f items, %u slots, %.0f waves): "
           "%.1f us -> %.2f us per item\n",
           items, dev.cost.slots, waves, t_small * 1e6, cta_us * 1e6);
    printf(
        "tile chain: %u queries of a private 16-token block four times over under a shared "
        "one, TREE CTAs of 64 rows (65 whole tiles each, one wave): %.1f us -> %.2f us per tile; "
        "of a "
        "private 16-token block (65 one-page segments in %.0f tiles): %.1f us -> %.2f us per "
        "tile\n",
        chain_q, t_chain * 1e6, tile_us * 1e6, packed_tiles, t_packed * 1e6, packed_us * 1e6);
    const double pair_us = t_pair * 1e6 / (pair_items / pair_blocks);
    printf("fwd_pair's fixed cost: %u queries in runs of 32 sharing a 16-token block, TREE CTAs of "
           "32 rows (%.0f items of one tile, %.0f blocks): %.1f us -> %.2f us per item and block\n",
           pair_q, pair_items, pair_blocks, t_pair * 1e6, pair_us);
    uint32_t merged_rows, parts;
    const double merge_us = measure_merge(e0, e1, &merged_rows, &parts) * 1e6;
    printf("merge launch: 10 one-token queries x 16/8 heads over one shared 4,096-token prefix, "
           "cut in %u parts (%u merged rows): %.2f us more than the same plan without merges\n",
           parts, merged_rows, merge_us);
    printf("\n/* %s, tile_solver */\n"
           "{\"%s\", 1, {%.1ff, %.1ff, %.2ff, 0, %.2ff, %.2ff, %.1ff}},\n",
           prop.name, prop.name, bw / 1e9, mma / 1e12, cta_us * 1e6, tile_us * 1e6, pair_us,
           merge_us);
    return 0;
}
