/*
 * test_cuda_attn.cu — the cuda backend executes plans exactly. On random forests (depth 1-5,
 * fan-out 1-64, KV lengths 1-32K, partial last blocks), decode and extend rows, every head_dim,
 * fp16 and bf16, GQA groups 1-16 (non powers of two too), softcap, every scheduler policy, with
 * and without long-KV splits, the cuda backend's outputs are compared
 *   - with the cpu backend executing the same plan on the same pool contents (every element), and
 *   - with a float64 reference over each query's logical KV (every element of a sample of the
 *     queries: the reference is the slow part),
 * relative error < 1e-2; outputs are poisoned (NaN) before each run and checked fully written.
 * Also: plans mixing 32- and 1024-token queries (several tile shapes, split and unsplit), the
 * device tile table, forced serial vs multi-stream (bitwise equal), copy-on-write block copies,
 * NaN and infinity in appended K/V (stored as 0), and error codes. `--quick` runs a reduced set
 * (for compute-sanitizer), `--tree` only the TREE plans (`--tree-quick` small ones; `--tree-loop
 * N` each TREE world's forward N more times, bitwise equal to its first), `--invariant` the
 * batch-invariance tests (one probe query's bits across 50 batches, test_invariant)
 * (PATD_TEST_NO_POISON=1 leaves unused pool slots unwritten, for initcheck). Ends with "N passed, N
 * failed".
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "kern.h"
#include "kern_dtype.h"
#include "sched_plan.h"
#include "tl_ref.h"
#include "tl_rng.h"
#include "tl_world.h"
}
#include "kern_cuda.h"
#include "kern_cuda_shapes.h"
#include "kern_cuda_tool.h"

#define BS 16u

static int passed, failed;
static bool g_quick; /* --quick: small forests (compute-sanitizer is ~100x slower) */
static void verdict(const char *name, bool ok, const char *fmt = "", double v = 0)
{
    printf("%-58s %s", name, ok ? "ok" : "FAILED");
    if (*fmt)
        printf(fmt, v);
    printf("\n");
    fflush(stdout);
    (ok ? passed : failed)++;
}

struct Model {
    uint32_t q_heads, kv_heads, d;
    kern_dtype_t dt;
    float softcap;
    kern_dtype_t kv = (kern_dtype_t)0; /* the pool's: 0 = dt, or fp8 */
    float ks = 0.f;                    /* fp8: kv_scale (0 = 1) */
};

/* rounds through the dtype */
static double rt(kern_dtype_t dt, double v)
{
    uint8_t buf[4];
    kern_store(dt, buf, 0, (float)v);
    return kern_load(dt, buf, 0);
}
/* a K or V value as the pool holds it: the client's dtype, then for an fp8 pool value / kv_scale
 * in fp8, read back times kv_scale (kern.h) */
static double rt_kv(const Model &m, double v)
{
    const double x = rt(m.dt, v);
    if (!m.kv || m.kv == m.dt)
        return x;
    const float ks = m.ks > 0.f ? m.ks : 1.f;
    uint8_t b[4]; /* kern_load's widest element */
    kern_store(m.kv, b, 0, (float)x / ks);
    return (double)(kern_load(m.kv, b, 0) * ks);
}

static const char *fp8_name(kern_dtype_t kv)
{
    return kv == KERN_FP8_E4M3 ? "e4m3" : "e5m2";
}

struct Rig {
    tl_world_t w;
    Model mc;
    kern_backend_t *cpu = nullptr, *gpu = nullptr;
    sched_t *s = nullptr;
    uint64_t seed;
    std::vector<uint8_t> q, o_cpu, o_gpu;
    void *dq = nullptr, *dout = nullptr;
    uint64_t q_elems;
    double scale;
    uint32_t max_tokens;       /* of the backends' config: append in chunks of it */
    uint32_t split_factor = 0; /* the scheduler's; 0 = its default */
};

static uint32_t esz(const Rig &g)
{
    return kern_dtype_size(g.mc.dt);
}

/* Host to device, complete on return. cudaMemcpy from pageable memory may return once the bytes
 * are staged, before its DMA lands, and the backend's stream (non-blocking) does not wait for the
 * legacy stream: an append launched right after could read the buffer's previous contents. That
 * race shows as one query's KV wrong on every head, only for models with much KV per token (MHA
 * 16-32 heads), in a few runs of each: a TREE "flake" that was the test's, not a kernel's
 * (tests/bench/log/2026-11-25-tma-tree-flake.md). */
static void h2d(void *dst, const void *src, size_t n)
{
    CK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

/* Large K and V, the same in both pools, in every slot of `layer` that no query's KV covers
 * (partial blocks' tails, spare blocks): a forward that lets a masked position into a row's
 * softmax then fails the float64 check on every launch, whatever memory held before (the cpu
 * backend is exact there: test_cpu). */
static void poison(Rig &g, uint32_t layer)
{
    if (getenv("PATD_TEST_NO_POISON")) /* compute-sanitizer initcheck: unused slots unwritten */
        return;
    const Model &m = g.mc;
    const uint32_t n_slots = g.w.next_block * BS;
    std::vector<uint8_t> used(n_slots, 0);
    for (uint32_t i = 0; i < g.w.n_q; i++)
        for (uint32_t t = 0; t < g.w.q[i].kv_len; t++)
            used[g.w.q[i].blocks[t / BS] * BS + t % BS] = 1;
    std::vector<uint32_t> slots;
    for (uint32_t sl = 0; sl < n_slots; sl++)
        if (!used[sl])
            slots.push_back(sl);
    if (slots.empty())
        return;
    const uint64_t row = (uint64_t)m.kv_heads * m.d, rb = row * esz(g);
    const uint32_t chunk = g.max_tokens < slots.size() ? g.max_tokens : (uint32_t)slots.size();
    std::vector<uint8_t> k(chunk * rb), v(chunk * rb);
    for (uint32_t t = 0; t < chunk; t++)
        for (uint64_t e = 0; e < row; e++) {
            kern_store(m.dt, k.data(), t * row + e,
                       (float)(4.0 * tl_kv_value(0x9015, (uint32_t)e, t % BS, 0, 0, 2)));
            kern_store(m.dt, v.data(), t * row + e, 50.0f);
        }
    void *dk, *dv;
    CK(cudaMalloc(&dk, k.size()));
    CK(cudaMalloc(&dv, v.size()));
    h2d(dk, k.data(), k.size());
    h2d(dv, v.data(), v.size());
    for (size_t t = 0; t < slots.size(); t += chunk) {
        const uint32_t c = slots.size() - t < chunk ? (uint32_t)(slots.size() - t) : chunk;
        REQ(kern_append_kv(g.cpu, layer, k.data(), v.data(), slots.data() + t, c));
        REQ(kern_append_kv(g.gpu, layer, dk, dv, slots.data() + t, c));
    }
    REQ(kern_sync(g.gpu));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
}

/* every query's KV of layer `layer` into both pools, through kern_append_kv, and the rest of
 * the layer's slots poisoned */
static void fill(Rig &g, uint32_t layer, uint64_t seed)
{
    const Model &m = g.mc;
    for (uint32_t i = 0; i < g.w.n_q; i++) {
        const tl_query_t *q = &g.w.q[i];
        uint32_t n = q->kv_len;
        std::vector<uint8_t> k((size_t)n * m.kv_heads * m.d * esz(g)),
            v((size_t)n * m.kv_heads * m.d * esz(g));
        std::vector<uint32_t> slots(n);
        for (uint32_t t = 0; t < n; t++) {
            uint32_t blk = q->blocks[t / BS], off = t % BS;
            slots[t] = blk * BS + off;
            for (uint32_t h = 0; h < m.kv_heads; h++)
                for (uint32_t x = 0; x < m.d; x++) {
                    uint64_t e = ((uint64_t)t * m.kv_heads + h) * m.d + x;
                    kern_store(m.dt, k.data(), e, (float)tl_kv_value(seed, blk, off, h, x, 0));
                    kern_store(m.dt, v.data(), e, (float)tl_kv_value(seed, blk, off, h, x, 1));
                }
        }
        REQ(kern_append_kv(g.cpu, layer, k.data(), v.data(), slots.data(), n));
        /* the cuda backend takes device K/V and appends in chunks of max_tokens */
        void *dk, *dv;
        CK(cudaMalloc(&dk, k.size()));
        CK(cudaMalloc(&dv, v.size()));
        h2d(dk, k.data(), k.size());
        h2d(dv, v.data(), v.size());
        const uint32_t chunk = g.max_tokens;
        const uint64_t row = (uint64_t)m.kv_heads * m.d * esz(g);
        for (uint32_t t = 0; t < n; t += chunk) {
            uint32_t c = n - t < chunk ? n - t : chunk;
            REQ(kern_append_kv(g.gpu, layer, (uint8_t *)dk + t * row, (uint8_t *)dv + t * row,
                               slots.data() + t, c));
        }
        REQ(kern_sync(g.gpu));
        CK(cudaFree(dk));
        CK(cudaFree(dv));
    }
    poison(g, layer);
}

/* kern_config_t.pair_blocks of the rigs made now (test_persistent) */
static uint32_t g_pair_blocks = 0;

static void rig_init(Rig &g, tl_rng_t *r, const Model &mc, sched_policy_t pol, uint32_t split_min,
                     const sched_tiles_t *tiles_over = nullptr,
                     kern_merge_t merge = KERN_MERGE_LAUNCH, kern_fwd_t fwd = KERN_FWD_AUTO)
{
    g.mc = mc;
    kern_config_t kc = {};
    kc.model = {2, mc.q_heads, mc.kv_heads, mc.d, BS, mc.dt, mc.kv ? mc.kv : mc.dt, mc.ks};
    kc.n_blocks = g.w.next_block;
    kc.max_tokens = g.w.n_tokens > 256 ? g.w.n_tokens : 256;
    g.max_tokens = kc.max_tokens;
    kc.max_partials = 16 * g.w.n_tokens + 64;
    kc.n_threads = 0;
    kc.merge = merge;
    kc.fwd = fwd;
    kc.pair_blocks = g_pair_blocks;
    REQ(kern_backend_create("cpu", &kc, &g.cpu));
    REQ(kern_backend_create("cuda", &kc, &g.gpu));
    sched_tiles_t tiles;
    kern_tiles(g.gpu, &tiles);
    if (tiles_over)
        tiles = *tiles_over;
    sched_config_t sc = {};
    sc.max_queries = g.w.n_q;
    sc.max_tokens = g.w.n_tokens;
    sc.block_size = BS;
    sc.q_heads = mc.q_heads;
    sc.kv_heads = mc.kv_heads;
    sc.head_dim = mc.d;
    sc.kv_elt_bytes = kern_dtype_size(kern_kv_dtype(&kc.model));
    sc.q_elt_bytes = kern_dtype_size(mc.dt);
    sc.policy = pol;
    sc.tiles = &tiles;
    sc.split_min_kv = split_min;
    sc.split_factor = g.split_factor;
    sc.max_partials = kc.max_partials;
    REQ(sched_create(&sc, &g.s));
    for (uint32_t i = 0; i < g.w.n_q; i++) {
        const tl_query_t *q = &g.w.q[i];
        sched_query_t v = {q->blocks, q->n_blocks, q->kv_len, q->n_new, q->tok_off, 0};
        REQ(sched_forest_join(sched_forest(g.s), i, &v));
    }
    g.seed = tl_rng_u64(r);
    fill(g, 0, g.seed ^ 0x5555); /* layer 0 holds other KV: layer offsets must be right */
    fill(g, 1, g.seed);
    g.q_elems = (uint64_t)g.w.n_tokens * mc.q_heads * mc.d;
    g.q.resize(g.q_elems * esz(g));
    g.o_cpu.resize(g.q_elems * esz(g));
    g.o_gpu.resize(g.q_elems * esz(g));
    double amp = 1.0 + 7.0 * (tl_rng_unit(r) + 1.0) / 2.0; /* peaky softmax sometimes */
    for (uint64_t i = 0; i < g.q_elems; i++)
        kern_store(mc.dt, g.q.data(), i, (float)(amp * tl_rng_unit(r)));
    g.scale = 1.0 / sqrt((double)mc.d) * (0.5 + (tl_rng_unit(r) + 1.0) / 2.0);
    CK(cudaMalloc(&g.dq, g.q.size()));
    CK(cudaMalloc(&g.dout, g.q.size()));
    h2d(g.dq, g.q.data(), g.q.size());
}

static void rig_done(Rig &g)
{
    kern_backend_free(g.cpu);
    kern_backend_free(g.gpu);
    sched_free(g.s);
    CK(cudaFree(g.dq));
    CK(cudaFree(g.dout));
    tl_world_free(&g.w);
}

/* runs layer 1 on both backends; returns the plan */
static const sched_plan_hdr_t *run(Rig &g)
{
    const sched_plan_hdr_t *h;
    REQ(sched_build(g.s, &h));
    kern_attn_params_t p = {(float)g.scale, g.mc.softcap};
    memset(g.o_cpu.data(), 0xff, g.o_cpu.size()); /* poison: NaN in every dtype */
    REQ(kern_attend(g.cpu, 1, h, g.q.data(), g.o_cpu.data(), &p));
    CK(cudaMemset(g.dout, 0xff, g.o_gpu.size()));
    /* the lane's stream does not wait for the legacy stream's memset: without this the poison
     * can land after the forward wrote, a flaky failure
     * (tests/bench/log/2026-11-24-tree-cta-size-pair.md) */
    CK(cudaDeviceSynchronize());
    REQ(kern_attend(g.gpu, 1, h, g.dq, g.dout, &p));
    REQ(kern_sync(g.gpu));
    CK(cudaMemcpy(g.o_gpu.data(), g.dout, g.o_gpu.size(), cudaMemcpyDeviceToHost));
    return h;
}

/* The GPU half of run() again on plan h: poisoned output, the forward, the result back. */
static void rerun_gpu(Rig &g, const sched_plan_hdr_t *h)
{
    kern_attn_params_t p = {(float)g.scale, g.mc.softcap};
    CK(cudaMemset(g.dout, 0xff, g.o_gpu.size()));
    CK(cudaDeviceSynchronize());
    REQ(kern_attend(g.gpu, 1, h, g.dq, g.dout, &p));
    REQ(kern_sync(g.gpu));
    CK(cudaMemcpy(g.o_gpu.data(), g.dout, g.o_gpu.size(), cudaMemcpyDeviceToHost));
}

/* --tree-loop N: each TREE world's forward N more times, every output bitwise the first's (which
 * was checked against float64): a race or an uninitialised read shows as a run that differs */
static int g_tree_repeat;

/* all outputs finite and close to the cpu backend's; returns the worst per-token relative error */
static double vs_cpu(const Rig &g, bool *finite)
{
    const uint64_t per = (uint64_t)g.mc.q_heads * g.mc.d;
    double worst = 0;
    *finite = true;
    std::vector<double> a(per), b(per);
    for (uint32_t t = 0; t < g.w.n_tokens; t++) {
        for (uint64_t e = 0; e < per; e++) {
            a[e] = kern_load(g.mc.dt, g.o_gpu.data(), t * per + e);
            b[e] = kern_load(g.mc.dt, g.o_cpu.data(), t * per + e);
            if (!isfinite(a[e]))
                *finite = false;
        }
        double err = tl_rel_err(a.data(), b.data(), per);
        worst = err > worst ? err : worst;
    }
    return worst;
}

/* float64 reference of up to max_q queries (all of their tokens and heads) */
static double vs_fp64(const Rig &g, tl_rng_t *r, uint32_t max_q)
{
    const Model &m = g.mc;
    const uint32_t group = m.q_heads / m.kv_heads, d = m.d;
    double worst = 0;
    std::vector<double> qd(d), out(d), ref((size_t)m.q_heads * d), got((size_t)m.q_heads * d);
    for (uint32_t n = 0; n < max_q && n < g.w.n_q; n++) {
        const uint32_t i = g.w.n_q <= max_q ? n : tl_rng_below(r, g.w.n_q);
        const tl_query_t *q = &g.w.q[i];
        std::vector<double> K((size_t)q->kv_len * d), V((size_t)q->kv_len * d);
        std::vector<std::vector<double>> tok(q->n_new, std::vector<double>((size_t)m.q_heads * d));
        for (uint32_t h = 0; h < m.kv_heads; h++) {
            for (uint32_t t = 0; t < q->kv_len; t++)
                for (uint32_t x = 0; x < d; x++) {
                    uint32_t blk = q->blocks[t / BS], off = t % BS;
                    K[(uint64_t)t * d + x] = rt_kv(m, tl_kv_value(g.seed, blk, off, h, x, 0));
                    V[(uint64_t)t * d + x] = rt_kv(m, tl_kv_value(g.seed, blk, off, h, x, 1));
                }
            for (uint32_t k = 0; k < q->n_new; k++) {
                uint32_t tk = q->tok_off + k, limit = q->kv_len - q->n_new + k + 1;
                for (uint32_t j = 0; j < group; j++) {
                    uint32_t qh = h * group + j;
                    for (uint32_t x = 0; x < d; x++)
                        qd[x] =
                            kern_load(m.dt, g.q.data(), ((uint64_t)tk * m.q_heads + qh) * d + x);
                    tl_ref_attend(qd.data(), K.data(), V.data(), limit, d, g.scale, m.softcap,
                                  out.data());
                    memcpy(tok[k].data() + (uint64_t)qh * d, out.data(), d * sizeof(double));
                }
            }
        }
        for (uint32_t k = 0; k < q->n_new; k++) {
            uint64_t base = (uint64_t)(q->tok_off + k) * m.q_heads * d;
            for (uint64_t e = 0; e < (uint64_t)m.q_heads * d; e++)
                got[e] = kern_load(m.dt, g.o_gpu.data(), base + e);
            double err = tl_rel_err(got.data(), tok[k].data(), (uint64_t)m.q_heads * d);
            worst = err > worst ? err : worst;
        }
    }
    return worst;
}

static const Model models[] = {
    {8, 8, 64, KERN_F16, 0},      /* MHA */
    {32, 8, 128, KERN_BF16, 0},   /* Llama-3-8B heads */
    {12, 4, 128, KERN_F16, 30},   /* group 3, softcap */
    {16, 1, 256, KERN_BF16, 0},   /* group 16 */
    {10, 2, 64, KERN_BF16, 0},    /* group 5 */
    {14, 2, 256, KERN_F16, 50},   /* group 7, softcap */
    {32, 32, 128, KERN_F16, 0},   /* MHA 32 heads */
    {32, 4, 64, KERN_F16, 0},     /* group 8 */
    {64, 8, 128, KERN_F16, 0},    /* group 8, 64 heads */
    {16, 16, 256, KERN_BF16, 20}, /* MHA d256 softcap */
};
static const int n_models = sizeof(models) / sizeof(models[0]);

/* a random forest whose cpu-side checking stays within budget */
static void gen(tl_world_t *w, tl_rng_t *r, const Model &m, bool extend, bool long_kv)
{
    const uint64_t budget = (g_quick ? 2e7 : long_kv ? 4e9 : 1e9) / ((uint64_t)m.q_heads * m.d);
    for (;;) {
        uint32_t depth = tl_rng_range(r, 1, 5);
        uint32_t top = g_quick ? 512 : long_kv ? 32768 : 4096;
        tl_world_params_t p = {};
        p.bs = BS;
        p.trees = tl_rng_range(r, 1, 3);
        p.depth_lo = p.depth_hi = depth;
        p.fanout_lo = 1;
        p.fanout_hi = tl_rng_range(r, 1, 64);
        p.level_tok_lo = 1;
        p.level_tok_hi = tl_rng_range(r, 1, top / depth);
        p.leaf_tok_lo = 1;
        p.leaf_tok_hi = tl_rng_range(r, 1, long_kv ? 4096 : 600);
        p.new_lo = 1;
        p.new_hi = extend ? tl_rng_range(r, 2, 48) : 1;
        p.max_queries = 64;
        p.spare_blocks = 2;
        tl_world_gen(w, r, &p);
        uint64_t work = 0;
        for (uint32_t i = 0; i < w->n_q; i++)
            work += (uint64_t)w->q[i].n_new * w->q[i].kv_len;
        if (work <= budget && w->n_q > 0)
            return;
        tl_world_free(w);
    }
}

/* whether this GPU runs the warp-specialized kernel (KERN_FWD_AUTO offers m 128): an sm_90a build
 * on sm_90 */
/* a cuda backend of a small d128 model whose pool holds kv (the default forward) */
static int small_backend(kern_dtype_t kv, kern_backend_t **b)
{
    kern_config_t kc = {};
    kc.model = {1, 8, 1, 128, BS, KERN_F16, kv, 0.f};
    kc.n_blocks = 4;
    kc.max_tokens = 4;
    kc.fwd = KERN_FWD_AUTO;
    return kern_backend_create("cuda", &kc, b);
}
static bool wide_runs()
{
    kern_backend_t *b;
    REQ(small_backend(KERN_F16, &b));
    sched_tiles_t t;
    kern_tiles(b, &t);
    kern_backend_free(b);
    return t.m[t.n_m - 1] > 64;
}

/* Random forests over every model and policy with the default forward (KERN_FWD_AUTO: on sm_90a
 * at head_dim <= 128 the warp-specialized kernel with its tile table of up to 128 rows; few random
 * forests have packs of more than 64 rows: test_wide_prefix makes them). fwd KERN_FWD_MMA: the
 * same forests' packing policies on mma.sync only, so that its multi-segment path stays tested on
 * a Hopper GPU too; KERN_FWD_LAYER: every policy on the 4-warp kernels (wgmma for TREE's CTAs of
 * 33-64 rows); KERN_FWD_TMA: the warp-specialized kernel loading KV pages by TMA, not cp.async. */
static void test_random(int rounds, uint64_t seed, kern_fwd_t fwd = KERN_FWD_AUTO,
                        const Model *ms = models, int n_ms = n_models)
{
    tl_rng_t r;
    tl_rng_seed(&r, seed);
    static const sched_policy_t all[] = {SCHED_POLICY_AUTO, SCHED_POLICY_PAPER, SCHED_POLICY_QUERY,
                                         SCHED_POLICY_BYTES, SCHED_POLICY_TREE};
    static const sched_policy_t packing[] = {SCHED_POLICY_BYTES, SCHED_POLICY_TREE,
                                             SCHED_POLICY_AUTO, SCHED_POLICY_PAPER,
                                             SCHED_POLICY_TREE};
    const sched_policy_t *pols = fwd == KERN_FWD_MMA ? packing : all;
    uint32_t merges = 0, multi_group = 0;
    for (int round = 0; round < rounds; round++) {
        const Model &mc = ms[round % n_ms];
        Rig g;
        gen(&g.w, &r, mc, round % 3 == 2, round % 4 == 1);
        /* odd rounds split; every other one of them merges inside the forward */
        rig_init(g, &r, mc, pols[round % 5], round % 2 ? 64 : 0, nullptr,
                 round % 4 == 3 ? KERN_MERGE_INSIDE : KERN_MERGE_LAUNCH, fwd);
        const sched_plan_hdr_t *h = run(g);
        merges += h->n_merges > 0;
        multi_group += h->n_groups > 1;
        bool finite;
        double ec = vs_cpu(g, &finite), ef = vs_fp64(g, &r, 6);
        uint32_t maxkv = 0;
        for (uint32_t i = 0; i < g.w.n_q; i++)
            maxkv = g.w.q[i].kv_len > maxkv ? g.w.q[i].kv_len : maxkv;
        char pool[40] = ""; /* an fp8 pool's format and factor */
        if (mc.kv && mc.kv != mc.dt)
            snprintf(pool, sizeof(pool), " fp8 %s x%g", fp8_name(mc.kv), mc.ks > 0 ? mc.ks : 1.0);
        char name[200];
        snprintf(name, sizeof(name), "%s %2d q%u/kv%u d%u %s%s cap%g: %uq kv<=%u %ug %um",
                 fwd == KERN_FWD_MMA     ? "mma"
                 : fwd == KERN_FWD_LAYER ? "layer"
                 : fwd == KERN_FWD_TMA   ? "tma"
                 : g_pair_blocks         ? "few blocks"
                                         : "random",
                 round, mc.q_heads, mc.kv_heads, mc.d, mc.dt == KERN_F16 ? "f16" : "bf16", pool,
                 mc.softcap, g.w.n_q, maxkv, h->n_groups, h->n_merges);
        printf("  (vs cpu %.2e) ", ec);
        verdict(name, finite && ec < 1e-2 && ef < 1e-2, " fp64 rel err %.2e", ef);
        rig_done(g);
    }
    if (rounds >= 20 && ms == models)
        verdict("random plans covered merges and several tile shapes",
                merges > 2 && multi_group > 2);
}

/* n_q unshared queries, query i with kv_len(i) tokens of which n_new(i) are new */
static void flat_world(tl_world_t *w, uint32_t n_q, uint32_t (*kv_len)(uint32_t),
                       uint32_t (*n_new)(uint32_t))
{
    memset(w, 0, sizeof(*w));
    w->bs = BS;
    w->n_q = n_q;
    w->q = (tl_query_t *)calloc(n_q, sizeof(tl_query_t));
    for (uint32_t i = 0; i < n_q; i++) {
        tl_query_t *q = &w->q[i];
        q->kv_len = kv_len(i);
        q->n_new = n_new(i);
        q->cap_blocks = q->n_blocks = (q->kv_len + BS - 1) / BS;
        q->blocks = (uint32_t *)malloc(q->n_blocks * sizeof(uint32_t));
        for (uint32_t b = 0; b < q->n_blocks; b++)
            q->blocks[b] = w->next_block++;
    }
    tl_world_layout(w);
}

/* unshared batch mixing 32- and 1024-token queries: several (m, n) groups, split and unsplit */
static void test_mixed(uint32_t split_min)
{
    tl_rng_t r;
    tl_rng_seed(&r, 77 + split_min);
    Rig g;
    flat_world(
        &g.w, 48, [](uint32_t i) { return i % 2 ? 32u : 1024u + i; },
        [](uint32_t i) { return i % 7 == 3 ? 8u : 1u; });
    g.split_factor = 1; /* split every CTA above the mean: the 1024s, not the 32s */
    rig_init(g, &r, models[1], SCHED_POLICY_QUERY, split_min);
    const sched_plan_hdr_t *h = run(g);
    bool finite;
    double ec = vs_cpu(g, &finite), ef = vs_fp64(g, &r, 48);
    char name[96];
    snprintf(name, sizeof(name), "mixed 32/1024-token queries, split_min %u: %u groups %u merges",
             split_min, h->n_groups, h->n_merges);
    verdict(name,
            finite && ec < 1e-2 && ef < 1e-2 && h->n_groups > 1 &&
                (split_min == 0) == (h->n_merges == 0),
            " fp64 rel err %.2e", ef);
    rig_done(g);
}

/* A plan whose every query token is split into many parts (the fill rule forced, no time model):
 * every row writes a partial, the last CTA of each (token, KV head) merges, in whatever order the
 * parts finish. Runs three times: the outputs are bitwise equal (the merge sums the parts in slot
 * order whichever CTA runs it) and match the float64 reference; the arrival counters are back at 0
 * after each launch, or the second run would merge early. Each model runs both merge modes on the
 * same data: the merge launch's output has the same bits as the merge inside the forward's (the
 * two order the parts alike, whichever blocks run them; a merge launch that read the parts in
 * another order or grouping would fail here). */
static void test_all_split()
{
    tl_rng_t r;
    std::vector<uint8_t> inside_o[3];
    for (int k = 0; k < 6; k++) {
        static const int kModels[] = {1, 8, 3}; /* GQA 4, 8 and 16 */
        const int mi = kModels[k % 3];
        tl_rng_seed(&r, 19 + k % 3); /* the same data under both merge modes */
        const kern_merge_t mode = k < 3 ? KERN_MERGE_INSIDE : KERN_MERGE_LAUNCH;
        Rig g;
        tl_world_t &w = g.w;
        flat_world(
            &w, 12, [](uint32_t i) { return 1500u + 97u * i; },
            [](uint32_t i) { return i % 4 == 1 ? 3u : 1u; });
        sched_tiles_t t;
        kern_cuda_tiles_for("", 0, &t);
        t.cost = {};         /* no model: the fill split is kept */
        t.min_ctas = 100000; /* far more items than the plan has: cut every CTA */
        rig_init(g, &r, models[mi], SCHED_POLICY_QUERY, 128, &t, mode);
        const sched_plan_hdr_t *h = run(g);
        std::vector<uint8_t> first = g.o_gpu;
        uint32_t direct = 0, most = 0;
        const sched_plan_row_t *rows = sched_plan_rows(h);
        for (uint32_t i = 0; i < h->n_rows; i++)
            direct += rows[i].merge == SCHED_ROW_DIRECT;
        for (uint32_t i = 0; i < h->n_merges; i++)
            most = std::max(most, sched_plan_merges(h)[i].part_count);
        bool same = true;
        for (int rep = 0; rep < 2; rep++) {
            run(g);
            same = same && g.o_gpu == first;
        }
        bool twin = true; /* the launch's bits are the inside merge's */
        if (mode == KERN_MERGE_INSIDE)
            inside_o[k % 3] = first;
        else
            twin = first == inside_o[k % 3];
        bool finite;
        double ec = vs_cpu(g, &finite), ef = vs_fp64(g, &r, 12);
        char name[160];
        snprintf(name, sizeof(name),
                 "every token split, group %u, merge %s: %u merges of <= %u parts, x3 equal%s",
                 models[mi].q_heads / models[mi].kv_heads,
                 mode == KERN_MERGE_INSIDE ? "inside" : "launch", h->n_merges, most,
                 mode == KERN_MERGE_INSIDE ? "" : ", inside's bits");
        verdict(name,
                finite && same && twin && direct == 0 && h->n_merges == w.n_tokens && most >= 10 &&
                    ec < 1e-2 && ef < 1e-2,
                " fp64 rel err %.2e", ef);
        rig_done(g);
    }
}

/* Short-leaf prefix trees under TREE: CTAs of up to a tile's rows that read every node of their
 * rows' paths, block-diagonally (a row reads only its own path's segments; a band of 16 rows that
 * reads none of a segment skips it). Unsplit: no partials at all; split (split_min 64, every CTA
 * cut along its segments, rows renumbered per part): merged. Both merge modes, every head_dim,
 * GQA 1-16, extend rows in some. */
/* The warp-specialized kernel (KERN_FWD_AUTO on sm_90a) on CTAs of 128 rows: one 256-token prefix,
 * 40 queries with 32 private tokens each, tile m 128 only, under TREE (several segments per CTA,
 * extend rows of 3 tokens in half the rounds) and PAPER (one segment per CTA), split and not, both
 * merge modes: d 64 and 128, GQA 1, 4 and 8. */
static void test_wide_prefix(tl_rng_t *r)
{
    if (!wide_runs())
        return;
    static const int kModels[] = {6, 7, 8, 0, 1}; /* MHA 32, GQA 8 d64, GQA 8, MHA d64, GQA 4 */
    for (int k = 0; k < 10; k++) {
        const Model &mc = models[kModels[k % 5]];
        const bool tree = k % 2 == 0, split = k % 3 == 1;
        Rig g;
        const uint32_t n_new = k % 4 == 2 ? 3 : 1;
        flat_world(
            &g.w, 40, [](uint32_t) { return 256u + 32u; },
            n_new == 3 ? +[](uint32_t) { return 3u; } : +[](uint32_t) { return 1u; });
        for (uint32_t i = 0; i < g.w.n_q; i++)
            memcpy(g.w.q[i].blocks, g.w.q[0].blocks, 16 * sizeof(uint32_t));
        sched_tiles_t t = {};
        t.n_m = 1;
        t.m[0] = 128;
        t.n_n = 1;
        t.n[0] = KCUDA_TILE_N;
        t.n_upto[0] = UINT32_MAX;
        rig_init(g, r, mc, tree ? SCHED_POLICY_TREE : SCHED_POLICY_PAPER, split ? 64 : 0, &t,
                 k % 4 == 1 ? KERN_MERGE_INSIDE : KERN_MERGE_LAUNCH, KERN_FWD_AUTO);
        const sched_plan_hdr_t *h = run(g);
        bool finite;
        double ec = vs_cpu(g, &finite), ef = vs_fp64(g, r, 40);
        char name[200];
        snprintf(name, sizeof(name), "wide %s%s q%u/kv%u d%u, %u new: %u CTAs, %u rows max",
                 tree ? "tree" : "paper", split ? " split" : "", mc.q_heads, mc.kv_heads, mc.d,
                 n_new, h->n_ctas, h->max_cta_rows);
        /* CTAs of more than 64 rows wherever 40 queries' rows exceed 64 */
        const uint32_t group = mc.q_heads / mc.kv_heads;
        verdict(name,
                finite && ec < 1e-2 && ef < 1e-2 &&
                    (h->max_cta_rows > 64) == (40 * n_new * group > 64),
                " fp64 rel err %.2e", ef);
        rig_done(g);
    }
}

/* A failing plan explained: the first tokens and q heads where the GPU differs from the cpu
 * backend (exact there: test_cpu), each with the CTA rows holding it and that CTA's segments. */
static void explain(const Rig &g, const sched_plan_hdr_t *h)
{
    const uint32_t qh = g.mc.q_heads, d = g.mc.d, group = qh / g.mc.kv_heads;
    const sched_plan_cta_t *ct = sched_plan_ctas(h);
    const sched_plan_row_t *rows = sched_plan_rows(h);
    const sched_plan_seg_t *segs = sched_plan_segs(h);
    const uint32_t *pages = sched_plan_pages(h);
    int shown = 0;
    std::vector<double> a(d), b(d);
    printf("    wrong (token: q heads):");
    for (uint32_t t = 0; t < g.w.n_tokens; t++) {
        uint32_t n_bad = 0;
        for (uint32_t x = 0; x < qh; x++) {
            for (uint32_t e = 0; e < d; e++) {
                a[e] = kern_load(g.mc.dt, g.o_gpu.data(), ((uint64_t)t * qh + x) * d + e);
                b[e] = kern_load(g.mc.dt, g.o_cpu.data(), ((uint64_t)t * qh + x) * d + e);
            }
            n_bad += tl_rel_err(a.data(), b.data(), d) >= 1e-2;
        }
        if (n_bad)
            printf(" %u:%u", t, n_bad);
    }
    printf("\n");
    for (uint32_t t = 0; t < g.w.n_tokens && shown < 1; t++)
        for (uint32_t x = 0; x < qh && shown < 1; x++) {
            for (uint32_t e = 0; e < d; e++) {
                a[e] = kern_load(g.mc.dt, g.o_gpu.data(), ((uint64_t)t * qh + x) * d + e);
                b[e] = kern_load(g.mc.dt, g.o_cpu.data(), ((uint64_t)t * qh + x) * d + e);
            }
            const double err = tl_rel_err(a.data(), b.data(), d);
            if (err < 1e-2)
                continue;
            shown++;
            printf("    token %u q head %u (kv head %u): rel err %.3f\n", t, x, x / group, err);
            for (uint32_t c = 0; c < h->n_ctas; c++)
                for (uint32_t r = 0; r < ct[c].row_count; r++) {
                    const sched_plan_row_t &rw = rows[ct[c].row_begin + r];
                    if (rw.q_tok != t)
                        continue;
                    printf(
                        "      CTA %u (%u rows, %u segs, group idx %u) row %u limit %u merge %d\n",
                        c, ct[c].row_count, ct[c].seg_count, ct[c].group, r, rw.limit,
                        rw.merge == SCHED_ROW_DIRECT ? -1 : (int)rw.merge);
                    for (uint32_t k = 0; k < ct[c].seg_count; k++) {
                        const sched_plan_seg_t &sg = segs[ct[c].seg_begin + k];
                        printf("        seg %2u [%u, %u) rows [%u, %u) pages", k, sg.kv_begin,
                               sg.kv_end, sg.row_lo, sg.row_hi);
                        for (uint32_t p = sg.kv_begin / BS; p * BS < sg.kv_end; p++)
                            printf(" %u", pages[sg.page_begin + p - sg.kv_begin / BS]);
                        printf("%s\n", r >= sg.row_lo && r < sg.row_hi ? "  <- read" : "");
                    }
                }
        }
}

static void test_tree()
{
    tl_rng_t r;
    tl_rng_seed(&r, 1234);
    uint32_t fused = 0;
    for (int k = 0; k < 2 * n_models; k++) {
        const Model &mc = models[k % n_models];
        const bool split = k >= n_models;
        Rig g;
        tl_world_params_t p = {};
        p.bs = BS;
        p.trees = 1 + k % 2;
        p.depth_lo = 1;
        p.depth_hi = 4;
        p.fanout_lo = 2;
        p.fanout_hi = 12;
        p.level_tok_lo = 1;
        p.level_tok_hi = 64; /* every node at most a tile: read in its queries' CTAs */
        p.leaf_tok_lo = 1;
        p.leaf_tok_hi = 64;
        p.new_lo = 1;
        p.new_hi = k % 3 == 2 ? 5 : 1;
        p.max_queries = g_quick ? 24 : 64;
        p.spare_blocks = 2;
        tl_world_gen(&g.w, &r, &p);
        rig_init(g, &r, mc, SCHED_POLICY_TREE, split ? 64 : 0, nullptr,
                 k % 4 == 1 ? KERN_MERGE_INSIDE : KERN_MERGE_LAUNCH);
        const sched_plan_hdr_t *h = run(g);
        bool finite;
        /* every query against float64: with a sample, a wrong GPU token outside it shows only
         * as a GPU-cpu difference, which reads as a cpu error (in such a run the cpu backend was
         * exact on every token, the GPU was not: tests/bench/log/2026-11-25-ws-persistent.md) */
        double ec = vs_cpu(g, &finite), ef = vs_fp64(g, &r, g.w.n_q);
        char name[200];
        snprintf(name, sizeof(name), "tree q%u/kv%u d%u %s%s: %uq %u CTAs %u segments %u merges",
                 mc.q_heads, mc.kv_heads, mc.d, mc.dt == KERN_F16 ? "f16" : "bf16",
                 split ? " split" : "", g.w.n_q, h->n_ctas, h->n_segs, h->n_merges);
        printf("  (vs cpu %.2e%s) ", ec, finite ? "" : ", not finite");
        verdict(name, finite && ec < 1e-2 && ef < 1e-2, " fp64 rel err %.2e", ef);
        if (!(ec < 1e-2))
            explain(g, h);
        if (g_tree_repeat) {
            const std::vector<uint8_t> first = g.o_gpu;
            int differ = 0;
            for (int i = 0; i < g_tree_repeat; i++) {
                rerun_gpu(g, h);
                differ += g.o_gpu != first;
            }
            printf("  ");
            verdict(name, differ == 0, " reruns that differ: %.0f", (double)differ);
        }
        fused += h->n_segs > h->n_ctas;
        rig_done(g);
    }
    verdict("tree plans read several nodes in one CTA (most random trees)", fused > n_models);
    /* one 256-token prefix, 40 queries with 32 private tokens each: every CTA reads the prefix
     * once and its queries' leaves block-diagonally; no token is split, so no merge */
    for (int k = 0; k < 3; k++) {
        static const int kModels[] = {1, 6, 8}; /* GQA 4, MHA 32 heads, GQA 8 */
        const Model &mc = models[kModels[k]];
        Rig g;
        flat_world(
            &g.w, 40, [](uint32_t) { return 256u + 32u; }, [](uint32_t) { return 1u; });
        for (uint32_t i = 0; i < g.w.n_q; i++) /* the prefix: query 0's first 16 blocks */
            memcpy(g.w.q[i].blocks, g.w.q[0].blocks, 16 * sizeof(uint32_t));
        rig_init(g, &r, mc, SCHED_POLICY_TREE, 0);
        const sched_plan_hdr_t *h = run(g);
        /* the CTA size is the time model's choice (tree_cost, sched_plan.c); every CTA but the last
         * is full */
        const uint32_t per_cta = h->max_cta_rows / (mc.q_heads / mc.kv_heads);
        bool finite;
        double ec = vs_cpu(g, &finite), ef = vs_fp64(g, &r, 40);
        char name[160];
        snprintf(name, sizeof(name), "shared prefix + 40 leaves, q%u/kv%u: %u CTAs %u segments",
                 mc.q_heads, mc.kv_heads, h->n_ctas, h->n_segs);
        verdict(name,
                finite && ec < 1e-2 && ef < 1e-2 && h->n_merges == 0 &&
                    h->n_ctas == (40 + per_cta - 1) / per_cta && h->n_segs == h->n_ctas + 40,
                " fp64 rel err %.2e", ef);
        rig_done(g);
    }
    test_wide_prefix(&r);
}

/* The pool slots of one token in `every` of each query's KV (query i's from token i % every),
 * sorted, each once (queries share blocks). */
static std::vector<uint32_t> kv_slots(const Rig &g, uint32_t every)
{
    std::vector<uint32_t> slots;
    for (uint32_t i = 0; i < g.w.n_q; i++)
        for (uint32_t t = i % every; t < g.w.q[i].kv_len; t += every)
            slots.push_back(g.w.q[i].blocks[t / BS] * BS + t % BS);
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    return slots;
}

/* NaN and infinity in appended K and V are stored as 0 by both backends (kern.h): tokens whose
 * K or V carried them give finite outputs equal to the cpu backend's, through the default forward,
 * its TMA loads (whole pages, masked tails included) and the 4-warp kernels (d 256). */
static void test_nonfinite_kv()
{
    tl_rng_t r;
    tl_rng_seed(&r, 77);
    const struct {
        int model;
        kern_fwd_t fwd;
    } runs[] = {{0, KERN_FWD_AUTO},
                {1, KERN_FWD_AUTO},
                {3, KERN_FWD_AUTO}, /* d 64, 128, 256 */
                {0, KERN_FWD_TMA},
                {1, KERN_FWD_TMA}};
    for (const auto &run_ : runs) {
        const Model &mc = models[run_.model];
        const kern_fwd_t fwd = run_.fwd;
        Rig g;
        gen(&g.w, &r, mc, false, false);
        rig_init(g, &r, mc, SCHED_POLICY_AUTO, 0, nullptr, KERN_MERGE_LAUNCH, fwd);
        /* one token in three of each query's KV: a NaN, +inf or -inf in K or V, every head */
        const uint64_t row = (uint64_t)mc.kv_heads * mc.d, rb = row * esz(g);
        const std::vector<uint32_t> slots = kv_slots(g, 3);
        const uint32_t n = (uint32_t)std::min<size_t>(slots.size(), g.max_tokens);
        std::vector<uint8_t> kb(n * rb), vb(n * rb);
        for (uint32_t t = 0; t < n; t++)
            for (uint64_t e = 0; e < row; e++) {
                const uint32_t blk = slots[t] / BS, off = slots[t] % BS, h = (uint32_t)(e / mc.d),
                               x = (uint32_t)(e % mc.d);
                float kv = (float)tl_kv_value(g.seed, blk, off, h, x, 0),
                      vv = (float)tl_kv_value(g.seed, blk, off, h, x, 1);
                if (x == (t * 7) % mc.d)
                    (t % 2 ? vv : kv) = t % 3 == 0 ? NAN : t % 3 == 1 ? INFINITY : -INFINITY;
                kern_store(mc.dt, kb.data(), t * row + e, kv);
                kern_store(mc.dt, vb.data(), t * row + e, vv);
            }
        void *dk, *dv;
        CK(cudaMalloc(&dk, kb.size()));
        CK(cudaMalloc(&dv, vb.size()));
        h2d(dk, kb.data(), kb.size());
        h2d(dv, vb.data(), vb.size());
        REQ(kern_append_kv(g.cpu, 1, kb.data(), vb.data(), slots.data(), n));
        REQ(kern_append_kv(g.gpu, 1, dk, dv, slots.data(), n));
        REQ(kern_sync(g.gpu));
        CK(cudaFree(dk));
        CK(cudaFree(dv));
        run(g);
        bool finite;
        const double ec = vs_cpu(g, &finite);
        char name[160];
        snprintf(name, sizeof(name), "non-finite K/V stored as 0, q%u/kv%u d%u%s: %u tokens",
                 mc.q_heads, mc.kv_heads, mc.d, fwd == KERN_FWD_TMA ? " tma" : "", n);
        verdict(name, finite && ec < 1e-2, " vs cpu %.2e", ec);
        rig_done(g);
    }
}

/* ---------------------------------------------------------------- fp8 KV (kern_model_t.kv_dtype)
 */

/* whether this GPU runs the fp8 kernels: the code that runs is sm_89 or up */
static bool fp8_runs()
{
    kern_backend_t *b;
    const int rc = small_backend(KERN_FP8_E4M3, &b);
    if (rc == 0)
        kern_backend_free(b);
    return rc == 0;
}

/* fp8 models: fwd_pair serves them (head_dim <= 128, sm_90a); both formats, both dtypes, GQA,
 * softcap, factors from 1 to 1/128 and one not a power of two */
static const Model fp8_models[] = {
    {32, 8, 128, KERN_BF16, 0, KERN_FP8_E4M3, 0.f},   /* Llama-3-8B heads */
    {8, 8, 64, KERN_F16, 0, KERN_FP8_E4M3, 0.125f},   /* MHA */
    {12, 4, 128, KERN_F16, 30, KERN_FP8_E5M2, 0.37f}, /* group 3, softcap */
    {10, 2, 64, KERN_BF16, 0, KERN_FP8_E5M2, 0.0078125f},
    {32, 4, 64, KERN_F16, 0, KERN_FP8_E4M3, 0.37f},  /* group 8 */
    {32, 32, 128, KERN_BF16, 0, KERN_FP8_E5M2, 1.f}, /* MHA 32 heads */
    {64, 8, 128, KERN_F16, 0, KERN_FP8_E4M3, 0.0078125f},
    {16, 2, 128, KERN_BF16, 20, KERN_FP8_E4M3, 0.25f}, /* group 8, softcap */
    {16, 1, 256, KERN_BF16, 0, KERN_FP8_E4M3, 0.125f}, /* d256: the 4-warp kernels */
    {14, 2, 256, KERN_F16, 50, KERN_FP8_E5M2, 0.37f},  /* d256, group 7, softcap */
};
static const int n_fp8_models = sizeof(fp8_models) / sizeof(fp8_models[0]);

/* An fp8 pool's bytes as the append writes them equal the cpu backend's rule (value / kv_scale,
 * nearest even, saturated; NaN and infinity as 0; kern_store of pat_fp8.h), element by element:
 * values around every code's midpoint (ties), past the largest finite, subnormal, non-finite. */
static void test_fp8_append_bytes()
{
    tl_rng_t r;
    tl_rng_seed(&r, 4040);
    for (int f = 0; f < 2; f++)
        for (int dt = 0; dt < 2; dt++) {
            const kern_dtype_t kv = f ? KERN_FP8_E5M2 : KERN_FP8_E4M3,
                               md = dt ? KERN_BF16 : KERN_F16;
            const float ks = f ? 0.37f : 0.0625f;
            kern_config_t kc = {};
            kc.model = {2, 4, 2, 128, BS, md, kv, ks};
            kc.n_blocks = 64;
            kc.max_tokens = 512;
            kern_backend_t *b;
            int rc = kern_backend_create("cuda", &kc, &b);
            if (rc == -ENOTSUP) {
                verdict("fp8 append: no sm_90a kernel here, refused with -ENOTSUP", true);
                return;
            }
            REQ(rc);
            const uint32_t n = 512, row = 2 * 128;
            std::vector<uint8_t> kb((size_t)n * row * 2), vb((size_t)n * row * 2);
            std::vector<uint32_t> slots(n);
            for (uint32_t t = 0; t < n; t++)
                slots[t] = (t * 7) % (64 * BS); /* scattered, each once */
            for (uint64_t e = 0; e < (uint64_t)n * row; e++) {
                /* a code's value (or the midpoint to the next), times ks, nudged or not */
                const uint8_t code[4] = {(uint8_t)tl_rng_below(&r, 256)};
                const float c0 = kern_load(kv, code, 0);
                const uint8_t nx[4] = {(uint8_t)(code[0] + 1)};
                const float c1 = kern_load(kv, nx, 0);
                float x = isfinite(c0) ? c0 : 1e6f;
                if (isfinite(c1) && tl_rng_below(&r, 2))
                    x = (c0 + c1) / 2; /* a tie (exact in fp32) */
                x *= ks;
                const uint32_t k = tl_rng_below(&r, 40);
                const float y = k == 0   ? NAN
                                : k == 1 ? INFINITY
                                : k == 2 ? -1e30f
                                : k == 3 ? 1e-30f
                                         : x;
                kern_store(md, kb.data(), e, y);
                kern_store(md, vb.data(), e, k == 4 ? -y : y * 0.5f);
            }
            void *dk, *dv;
            CK(cudaMalloc(&dk, kb.size()));
            CK(cudaMalloc(&dv, vb.size()));
            h2d(dk, kb.data(), kb.size());
            h2d(dv, vb.data(), vb.size());
            REQ(kern_append_kv(b, 1, dk, dv, slots.data(), n));
            REQ(kern_sync(b));
            uint64_t block_elems;
            const uint8_t *pool = (const uint8_t *)kern_cuda_pool(b, 1, &block_elems);
            const kern_layout_t lo = kern_layout(&kc.model, kc.n_blocks);
            std::vector<uint8_t> got(block_elems * kc.n_blocks);
            CK(cudaMemcpy(got.data(), pool, got.size(), cudaMemcpyDeviceToHost));
            uint64_t bad = 0, sat = 0;
            for (uint32_t t = 0; t < n; t++)
                for (uint32_t h = 0; h < 2; h++)
                    for (uint32_t x = 0; x < 128; x++)
                        for (int isv = 0; isv < 2; isv++) {
                            const uint64_t e = ((uint64_t)t * 2 + h) * 128 + x;
                            const float in = kern_load(md, isv ? vb.data() : kb.data(), e);
                            uint8_t w4[4];
                            kern_store(kv, w4, 0, isfinite(in) ? in / ks : 0.0f);
                            const uint8_t want = w4[0];
                            const uint8_t have =
                                got[kern_layout_at(&lo, 0, slots[t] / BS, (uint32_t)isv, h,
                                                   slots[t] % BS) +
                                    x];
                            bad += have != want;
                            sat += (want & 0x7f) == (kv == KERN_FP8_E4M3 ? 0x7e : 0x7b);
                        }
            char name[120];
            snprintf(name, sizeof(name), "fp8 append %s under %s, factor %g: %u tokens x 2 heads",
                     fp8_name(kv), dt ? "bf16" : "f16", ks, n);
            verdict(name, bad == 0 && sat > 0, " %.0f bytes differ from the cpu's rule",
                    (double)bad);
            CK(cudaFree(dk));
            CK(cudaFree(dv));
            kern_backend_free(b);
        }
}

/* Every finite fp8 code decoded by the forward exactly: one new token per query over a KV of one
 * token whose K is 0 (so p = 1 and O = V x kv_scale), V holding the codes (two KV heads, two
 * queries: all 256 over the pair, the first query's heads reversed in the second) */
static void test_fp8_codes()
{
    tl_rng_t r;
    tl_rng_seed(&r, 4141);
    for (int f = 0; f < 2; f++)
        for (int dt = 0; dt < 2; dt++)
            for (int si = 0; si < 2; si++) {
                const kern_dtype_t kv = f ? KERN_FP8_E5M2 : KERN_FP8_E4M3;
                const Model mc = {2, 2, 128, dt ? KERN_BF16 : KERN_F16, 0, kv, si ? 0.5f : 0.f};
                const float ks = si ? 0.5f : 1.f;
                Rig g;
                flat_world(
                    &g.w, 2, [](uint32_t) { return 1u; }, [](uint32_t) { return 1u; });
                rig_init(g, &r, mc, SCHED_POLICY_AUTO, 0);
                /* token i, head h, element x: code (h ^ i) * 128 + x */
                std::vector<uint8_t> kb(2 * 256 * 2, 0), vb(2 * 256 * 2);
                std::vector<float> want(2 * 256);
                std::vector<uint32_t> slots(2);
                for (uint32_t i = 0; i < 2; i++) {
                    slots[i] = g.w.q[i].blocks[0] * BS;
                    for (uint32_t h = 0; h < 2; h++)
                        for (uint32_t x = 0; x < 128; x++) {
                            const uint8_t code[4] = {(uint8_t)((h ^ i) * 128 + x)};
                            float c = kern_load(kv, code, 0);
                            c = isfinite(c) ? c : 0.f;
                            kern_store(mc.dt, vb.data(), (i * 2 + h) * 128 + x, c * ks);
                            kern_store(mc.dt, kb.data(), (i * 2 + h) * 128 + x, 0.f);
                            want[(i * 2 + h) * 128 + x] = c * ks;
                        }
                }
                void *dk, *dv;
                CK(cudaMalloc(&dk, kb.size()));
                CK(cudaMalloc(&dv, vb.size()));
                h2d(dk, kb.data(), kb.size());
                h2d(dv, vb.data(), vb.size());
                REQ(kern_append_kv(g.cpu, 1, kb.data(), vb.data(), slots.data(), 2));
                REQ(kern_append_kv(g.gpu, 1, dk, dv, slots.data(), 2));
                REQ(kern_sync(g.gpu));
                CK(cudaFree(dk));
                CK(cudaFree(dv));
                run(g);
                uint32_t bad = 0, bad_cpu = 0;
                for (uint32_t i = 0; i < 2; i++)
                    for (uint32_t e = 0; e < 256; e++) {
                        const uint64_t o = (uint64_t)g.w.q[i].tok_off * 256 + e;
                        bad += kern_load(mc.dt, g.o_gpu.data(), o) != want[i * 256 + e];
                        bad_cpu += kern_load(mc.dt, g.o_cpu.data(), o) != want[i * 256 + e];
                    }
                char name[120];
                snprintf(name, sizeof(name),
                         "fp8 %s under %s, factor %g: all 256 codes decoded exactly", fp8_name(kv),
                         dt ? "bf16" : "f16", ks);
                verdict(name, bad == 0 && bad_cpu == 0, " %.0f outputs differ", (double)bad);
                rig_done(g);
            }
}

/* Random forests over an fp8 pool on every policy: the GPU against the cpu backend (both read the
 * same fp8 values) and against float64 over the pool's values (rt_kv) */
static void test_fp8_random(int rounds, uint64_t seed, kern_fwd_t fwd = KERN_FWD_AUTO)
{
    test_random(rounds, seed, fwd, fp8_models, n_fp8_models);
}

/* The cuda backend serves an fp8 pool with every forward but KERN_FWD_MMA (mma.sync everywhere:
 * no fp8 twin) and where its code is sm_89 or up; else -ENOTSUP at create, nothing half made */
static void test_fp8_refused()
{
    struct {
        uint32_t d;
        kern_fwd_t fwd;
        bool serves;
    } c[] = {{256, KERN_FWD_AUTO, true},
             {128, KERN_FWD_LAYER, true},
             {128, KERN_FWD_MMA, false},
             {128, KERN_FWD_TMA, true},
             {64, KERN_FWD_AUTO, true}};
    const bool pair = fp8_runs();
    for (const auto &x : c) {
        kern_config_t kc = {};
        kc.model = {1, 8, 2, x.d, BS, KERN_F16, KERN_FP8_E4M3, 0.f};
        kc.n_blocks = 8;
        kc.max_tokens = 16;
        kc.fwd = x.fwd;
        kern_backend_t *b = nullptr;
        const int rc = kern_backend_create("cuda", &kc, &b);
        if (rc == 0)
            kern_backend_free(b);
        const bool want = x.serves && pair;
        char name[120];
        snprintf(name, sizeof(name), "fp8 pool, d%u fwd %d: %s", x.d, (int)x.fwd,
                 want ? "served" : "refused with -ENOTSUP");
        verdict(name, want ? rc == 0 : rc == -ENOTSUP, " rc %g", (double)rc);
    }
}

/* The test's stand-in for a slow append: lets its dependents start at once, spins `spin` clock
 * cycles, then stores n rows of K and V (row t: kv_heads x d elements) into their pool slots, in
 * kern_cuda_kv.cu's layout. One block. */
__global__ void slow_store(const uint16_t *k, const uint16_t *v, const uint32_t *slots, uint32_t n,
                           uint16_t *kv, uint32_t kv_heads, uint32_t d, uint64_t block_elems,
                           long long spin)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < spin) {
        }
    }
    __syncthreads();
    const uint64_t row = (uint64_t)kv_heads * d;
    for (uint64_t e = threadIdx.x; e < n * row; e += blockDim.x) {
        const uint64_t t = e / row, h = (e % row) / d, x = e % d;
        const uint32_t blk = slots[t] / BS, off = slots[t] % BS;
        uint16_t *dk = kv + blk * block_elems + (h * BS + off) * d + x;
        dk[0] = k[e];
        dk[(uint64_t)kv_heads * BS * d] = v[e];
    }
}

/* A layer as the daemon's lanes enqueue it: the KV append, then at once the forward (its plan
 * already uploaded, so nothing between the two on the stream), which on sm_90 is launched as the
 * append's programmatic dependent and must wait for it on the GPU (dep_wait). Two writers give
 * the layer's slots new values before the forward, each checked against the cpu backend over
 * the same values: kern_append_kv (the daemon's path), then slow_store, a kernel that lets the
 * forward start at once and stores only after 200 us, so that a forward which did not wait would
 * read old KV. A build without the wait (KCUDA_NO_DEP_WAIT) fails here: tests/gpu/run.sh
 * --launch shows it. */
static void test_dependent_launch()
{
    tl_rng_t r;
    tl_rng_seed(&r, 91);
    const struct {
        int model;
        kern_fwd_t fwd;
    } runs[] = {{1, KERN_FWD_AUTO}, {0, KERN_FWD_AUTO}, {3, KERN_FWD_AUTO}, {1, KERN_FWD_LAYER}};
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    for (const auto &run_ : runs) {
        const Model &mc = models[run_.model];
        Rig g;
        gen(&g.w, &r, mc, false, false);
        rig_init(g, &r, mc, SCHED_POLICY_AUTO, 0, nullptr, KERN_MERGE_LAUNCH, run_.fwd);
        const sched_plan_hdr_t *h = run(g); /* uploads the plan */
        const uint64_t row = (uint64_t)mc.kv_heads * mc.d, rb = row * esz(g);
        const std::vector<uint32_t> slots = kv_slots(g, 1);
        const uint32_t n = (uint32_t)std::min<size_t>(slots.size(), g.max_tokens);
        uint32_t *dslots;
        CK(cudaMalloc(&dslots, n * sizeof(uint32_t)));
        h2d(dslots, slots.data(), n * sizeof(uint32_t));
        for (int writer = 0; writer < 2; writer++) {
            const uint64_t seed2 = g.seed ^ (0xabcdef + (uint64_t)writer);
            std::vector<uint8_t> kb(n * rb), vb(n * rb);
            for (uint32_t t = 0; t < n; t++)
                for (uint64_t e = 0; e < row; e++) {
                    const uint32_t blk = slots[t] / BS, off = slots[t] % BS,
                                   hh = (uint32_t)(e / mc.d), x = (uint32_t)(e % mc.d);
                    kern_store(mc.dt, kb.data(), t * row + e,
                               (float)(3.0 * tl_kv_value(seed2, blk, off, hh, x, 0)));
                    kern_store(mc.dt, vb.data(), t * row + e,
                               (float)(5.0 * tl_kv_value(seed2, blk, off, hh, x, 1)));
                }
            void *dk, *dv;
            CK(cudaMalloc(&dk, kb.size()));
            CK(cudaMalloc(&dv, vb.size()));
            h2d(dk, kb.data(), kb.size());
            h2d(dv, vb.data(), vb.size());
            REQ(kern_append_kv(g.cpu, 1, kb.data(), vb.data(), slots.data(), n));
            kern_attn_params_t p = {(float)g.scale, g.mc.softcap};
            REQ(kern_attend(g.cpu, 1, h, g.q.data(), g.o_cpu.data(), &p));
            CK(cudaMemset(g.dout, 0xff, g.o_gpu.size()));
            CK(cudaDeviceSynchronize()); /* the poison and the copies land first */
            if (writer == 0) {
                REQ(kern_append_kv(g.gpu, 1, dk, dv, slots.data(), n));
            } else {
                uint64_t block_elems;
                void *pool = kern_cuda_pool(g.gpu, 1, &block_elems);
                slow_store<<<1, 256, 0, (cudaStream_t)kern_cuda_stream(g.gpu)>>>(
                    (const uint16_t *)dk, (const uint16_t *)dv, dslots, n, (uint16_t *)pool,
                    mc.kv_heads, mc.d, block_elems, (long long)clock_khz * 200 / 1000);
                CK(cudaGetLastError());
            }
            REQ(kern_attend(g.gpu, 1, h, g.dq, g.dout, &p));
            REQ(kern_sync(g.gpu));
            CK(cudaMemcpy(g.o_gpu.data(), g.dout, g.o_gpu.size(), cudaMemcpyDeviceToHost));
            CK(cudaFree(dk));
            CK(cudaFree(dv));
            bool finite;
            const double ec = vs_cpu(g, &finite);
            char name[160];
            snprintf(name, sizeof(name), "forward right after %s reads its KV, q%u/kv%u d%u%s: %u",
                     writer ? "a slow writer" : "the append", mc.q_heads, mc.kv_heads, mc.d,
                     run_.fwd == KERN_FWD_LAYER ? " layer" : "", n);
            verdict(name, finite && ec < 1e-2, " vs cpu %.2e", ec);
        }
        CK(cudaFree(dslots));
        rig_done(g);
    }
}

/* the same plan run again (cached upload) gives the same bytes */
static void test_repeat_equal()
{
    tl_rng_t r;
    tl_rng_seed(&r, 5);
    Rig a;
    gen(&a.w, &r, models[2], true, false);
    rig_init(a, &r, models[2], SCHED_POLICY_AUTO, 64);
    run(a);
    std::vector<uint8_t> first = a.o_gpu;
    run(a);
    verdict("repeat with the cached plan (bitwise)", first == a.o_gpu);
    rig_done(a);
}

static void test_copy_and_errors()
{
    kern_config_t kc = {};
    kc.model = {2, 8, 2, 128, BS, KERN_F16, KERN_F16, 0.f};
    kc.n_blocks = 8;
    kc.max_tokens = 32;
    kc.max_partials = 64;
    kern_backend_t *b;
    REQ(kern_backend_create("cuda", &kc, &b));
    /* block 1 <- distinct data; copy 1 -> 5; read back both through a one-token plan */
    const uint32_t n = 16;
    std::vector<uint16_t> k(n * 2 * 128), v(n * 2 * 128);
    for (size_t i = 0; i < k.size(); i++) {
        k[i] = kern_f32_to_f16((float)sin(0.37 * i));
        v[i] = kern_f32_to_f16((float)cos(0.11 * i));
    }
    std::vector<uint32_t> slots(n);
    for (uint32_t t = 0; t < n; t++)
        slots[t] = 1 * BS + t;
    void *dk, *dv;
    CK(cudaMalloc(&dk, k.size() * 2));
    CK(cudaMalloc(&dv, v.size() * 2));
    h2d(dk, k.data(), k.size() * 2);
    h2d(dv, v.data(), v.size() * 2);
    bool ok = kern_append_kv(b, 0, dk, dv, slots.data(), n) == 0 &&
              kern_append_kv(b, 1, dk, dv, slots.data(), n) == 0;
    uint32_t src = 1, dst = 5;
    ok = ok && kern_copy_blocks(b, &src, &dst, 1) == 0 && kern_sync(b) == 0;
    /* compare the two blocks' bytes in both layers through cudaMemcpy of the pool is not exposed;
     * run attention over each block with the same Q instead */
    struct {
        sched_plan_hdr_t h;
        sched_plan_group_t g;
        uint32_t pad0;
        sched_plan_cta_t c[2];
        sched_plan_seg_t sg[2];
        sched_plan_row_t r[2];
        uint32_t pages[2];
        uint32_t pad1[2];
    } plan = {};
    plan.h.magic = SCHED_PLAN_MAGIC;
    plan.h.version = SCHED_PLAN_VERSION;
    plan.h.total_bytes = sizeof(plan);
    plan.h.block_size = BS;
    plan.h.group = 4;
    plan.h.n_tokens = 2;
    plan.h.n_groups = 1;
    plan.h.n_ctas = 2;
    plan.h.n_segs = 2;
    plan.h.n_rows = 2;
    plan.h.n_pages = 2;
    plan.h.off_groups = offsetof(decltype(plan), g);
    plan.h.off_ctas = offsetof(decltype(plan), c);
    plan.h.off_segs = offsetof(decltype(plan), sg);
    plan.h.off_rows = offsetof(decltype(plan), r);
    plan.h.off_pages = offsetof(decltype(plan), pages);
    plan.h.off_merges = sizeof(plan);
    plan.h.max_cta_rows = 4;
    plan.g = {16, 64, 2, {0, 0}};
    plan.c[0] = {0, 1, 0, 1, 16, 0, 0, 0}; /* rows, segments, kv_tokens, group, pack */
    plan.c[1] = {1, 1, 1, 1, 16, 0, 1, 0};
    plan.sg[0] = {0, 16, 0, 0, 1}; /* kv range, page, rows */
    plan.sg[1] = {0, 16, 1, 0, 1};
    plan.r[0] = {0, 16, 0, SCHED_ROW_DIRECT};
    plan.r[1] = {1, 16, 1, SCHED_ROW_DIRECT};
    static_assert(sizeof(plan.r[0]) == 16, "row: q_tok, limit, dst, merge");
    plan.pages[0] = 1;
    plan.pages[1] = 5;
    std::vector<uint16_t> q(2 * 8 * 128), o(2 * 8 * 128);
    for (size_t i = 0; i < 8 * 128; i++)
        q[i] = q[i + 8 * 128] = kern_f32_to_f16((float)sin(0.05 * i));
    void *dq, *dout;
    CK(cudaMalloc(&dq, q.size() * 2));
    CK(cudaMalloc(&dout, o.size() * 2));
    h2d(dq, q.data(), q.size() * 2);
    kern_attn_params_t p = {0.088f, 0};
    ok = ok && kern_attend(b, 1, &plan.h, dq, dout, &p) == 0 && kern_sync(b) == 0;
    CK(cudaMemcpy(o.data(), dout, o.size() * 2, cudaMemcpyDeviceToHost));
    ok = ok && memcmp(o.data(), o.data() + 8 * 128, 8 * 128 * 2) == 0;
    verdict("copy-on-write block copy (attention over source == copy)", ok);

    /* errors: each refused before anything is enqueued */
    uint32_t bad_slot = 8 * BS;
    bool e = kern_append_kv(b, 0, dk, dv, &bad_slot, 1) == -EINVAL &&
             kern_append_kv(b, 2, dk, dv, slots.data(), 1) == -EINVAL &&
             kern_append_kv(b, 0, dk, dv, slots.data(), 33) == -E2BIG;
    plan.pages[1] = 8; /* out of the pool */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -EINVAL;
    plan.pages[1] = 5;
    plan.g.m = 2; /* a tile smaller than the CTA's rows */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -EINVAL;
    plan.g.m = 16;
    plan.h.max_cta_rows = KCUDA_MAX_M + 1; /* beyond the largest compiled tile */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -E2BIG;
    plan.h.max_cta_rows = 4;
    plan.r[1].merge = 0; /* a partial row naming a merge the plan does not have */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -EINVAL;
    plan.r[1].merge = SCHED_ROW_DIRECT;
    plan.c[1].row_count = 5; /* rows beyond the tile (and the row table) */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -EINVAL;
    plan.c[1].row_count = 1;
    plan.sg[1].row_hi = 2; /* a segment read by rows the CTA does not have */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -EINVAL;
    plan.sg[1].row_hi = 1;
    plan.sg[1].kv_end = 17; /* a segment past its pages (and its CTA's kv_tokens) */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -EINVAL;
    plan.sg[1].kv_end = 16;
    plan.c[1].seg_count = 2; /* segments beyond the table */
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == -EINVAL;
    plan.c[1].seg_count = 1;
    e = e && kern_attend(b, 1, &plan.h, dq, dout, &p) == 0 && kern_sync(b) == 0;
    verdict("error codes (bad slot, layer, size, page, tile, rows, segments)", e);
    kc.model.dtype = KERN_F32;
    kern_backend_t *b32 = nullptr;
    verdict("fp32 model -> -ENOTSUP on cuda", kern_backend_create("cuda", &kc, &b32) == -ENOTSUP);
    kc.model.dtype = KERN_F16;
    kc.device = 99;
    verdict("missing device -> -ENODEV", kern_backend_create("cuda", &kc, &b32) == -ENODEV);
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    kern_backend_free(b);
}

static void test_tiles()
{
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    sched_tiles_t t;
    int measured = kern_cuda_tiles_for(prop.name, 1, &t);
    bool ok = t.n_m >= 1 && t.m[0] == 16 && t.n_upto[t.n_n - 1] == UINT32_MAX;
    for (uint32_t i = 0; i < t.n_m; i++)
        ok = ok && t.m[i] % 16 == 0 && t.m[i] <= 128;
    char name[320];
    snprintf(name, sizeof(name), "tile table for %s (%s)", prop.name,
             measured ? "measured" : "generic");
    verdict(name, ok);
    /* the shapes the table plans with run resident and unspilled at d 64 and 128 (d 256 holds a
     * 16 x 256 fp32 accumulator per warp: some of its variants spill, see
     * tests/bench/log/2026-11-21-pat-trees-h200.md); the pair
     * warp-specialized kernel (384 threads) may spill in its producer warpgroup */
    int used = 0;
    bool vok = true;
    for (uint32_t d : {64u, 128u}) {
        kern_cuda_variant_info_t v[64];
        int n = kern_cuda_variants(d, v, 64);
        vok = vok && n > 0;
        for (int i = 0; i < n && i < 64; i++)
            for (uint32_t k = 0; k < t.n_n; k++)
                if (v[i].n == t.n[k]) {
                    used++;
                    vok = vok && v[i].blocks_per_sm >= 1 &&
                          (v[i].local_bytes == 0 || v[i].threads > 128);
                }
    }
    verdict("forward kernels (d 64, 128) resident and without spills", vok && used > 0,
            " (%g kernels)", used);
}

/* The persistent forward with 1 and 3 blocks: each block runs many items in a row, big and small
 * ones mixed, its Q buffers and ring wrapping across items, and the launch counter must be back
 * at 0 for the next layer's launch (two layers per rig, several rigs per backend config). */
static void test_persistent(int rounds, uint64_t seed)
{
    if (!wide_runs())
        return;
    for (uint32_t blocks : {1u, 3u}) {
        g_pair_blocks = blocks;
        test_random(rounds, seed + blocks);
    }
    g_pair_blocks = 0;
}

/* Batch invariance (sched_config_t.invariant_chunk, SCHED_PLAN_INVARIANT): one probe query's
 * output, bit for bit, across 50 batches around it (tl_world_probe: up to 40 other queries that
 * share any prefix of it or of each other, decode and extend rows, the probe anywhere in the
 * order), on fwd_pair (head_dim <= 128: CTAs of 1 to 128 rows, one or two KV heads an item, the
 * three consumer classes), on fwd_layer (head_dim 256, gpu.forward = layer), with the merge
 * launched or inside, over an fp8 pool; and against float64. The mode off (AUTO) gives the
 * same batches different bits, so that the check can fail. */
struct InvCase {
    Model m;
    uint32_t chunk, probe_len, probe_new;
    kern_fwd_t fwd;
    kern_merge_t merge;
    const char *what;
};

static void test_invariant_case(const InvCase &ic, tl_rng_t *r)
{
    const Model &m = ic.m;
    const uint32_t max_others = 40, tok_hi = 600, new_hi = 4, probe_blocks = ic.probe_len / BS + 1;
    const uint32_t n_blocks = probe_blocks + max_others * ((tok_hi + BS - 1) / BS);
    const uint32_t max_tok = ic.probe_new + max_others * new_hi;
    kern_config_t kc = {};
    kc.model = {2, m.q_heads, m.kv_heads, m.d, BS, m.dt, m.kv ? m.kv : m.dt, m.ks};
    kc.n_blocks = n_blocks;
    kc.max_tokens = max_tok;
    kc.max_partials = 64 * max_tok;
    kc.fwd = ic.fwd;
    kc.merge = ic.merge;
    kern_backend_t *b;
    if (kern_backend_create("cuda", &kc, &b) < 0) {
        verdict(ic.what, false, " (backend refused)");
        return;
    }
    sched_tiles_t tiles;
    kern_tiles(b, &tiles);
    /* every block holds a function of its id: the same KV in every batch */
    const uint64_t seed = tl_rng_u64(r), row_kv = (uint64_t)m.kv_heads * m.d;
    const uint32_t csz = kern_dtype_size(m.dt);
    {
        const uint32_t n = n_blocks * BS;
        std::vector<uint8_t> k((size_t)n * row_kv * csz), v((size_t)n * row_kv * csz);
        std::vector<uint32_t> slots(n);
        for (uint32_t t = 0; t < n; t++) {
            slots[t] = t;
            for (uint64_t e = 0; e < row_kv; e++) {
                const uint32_t h = (uint32_t)(e / m.d), x = (uint32_t)(e % m.d);
                kern_store(m.dt, k.data(), t * row_kv + e,
                           (float)tl_kv_value(seed, t / BS, t % BS, h, x, 0));
                kern_store(m.dt, v.data(), t * row_kv + e,
                           (float)tl_kv_value(seed, t / BS, t % BS, h, x, 1));
            }
        }
        void *dk, *dv;
        CK(cudaMalloc(&dk, k.size()));
        CK(cudaMalloc(&dv, v.size()));
        h2d(dk, k.data(), k.size());
        h2d(dv, v.data(), v.size());
        for (uint32_t t = 0; t < n; t += max_tok) {
            const uint32_t c = n - t < max_tok ? n - t : max_tok;
            REQ(kern_append_kv(b, 1, (uint8_t *)dk + t * row_kv * csz,
                               (uint8_t *)dv + t * row_kv * csz, slots.data() + t, c));
        }
        REQ(kern_sync(b));
        CK(cudaFree(dk));
        CK(cudaFree(dv));
    }
    const size_t row_bytes = (size_t)m.q_heads * m.d * csz, probe_bytes = ic.probe_new * row_bytes;
    std::vector<uint8_t> q(max_tok * row_bytes), pq(probe_bytes), got(probe_bytes);
    std::vector<uint8_t> ref[2] = {std::vector<uint8_t>(probe_bytes),
                                   std::vector<uint8_t>(probe_bytes)};
    for (uint64_t e = 0; e < probe_bytes / csz; e++)
        kern_store(m.dt, pq.data(), e, (float)(3.0 * tl_rng_unit(r)));
    void *dq, *dout;
    CK(cudaMalloc(&dq, q.size()));
    CK(cudaMalloc(&dout, q.size()));
    uint32_t differ[2] = {0, 0}, others = 0, rows_max = 0;
    const float scale = 0.09f;
    for (uint32_t it = 0; it < 50; it++) {
        tl_world_t w;
        const uint32_t probe = tl_world_probe(&w, r, BS, ic.probe_len, ic.probe_new, max_others,
                                              tok_hi, new_hi, probe_blocks);
        others += w.n_q - 1;
        for (uint64_t e = 0; e < (uint64_t)w.n_tokens * row_bytes / csz; e++)
            kern_store(m.dt, q.data(), e, (float)(3.0 * tl_rng_unit(r)));
        memcpy(q.data() + (size_t)w.q[probe].tok_off * row_bytes, pq.data(), probe_bytes);
        h2d(dq, q.data(), (size_t)w.n_tokens * row_bytes);
        for (int mode = 0; mode < 2; mode++) {
            sched_config_t sc = {};
            sc.max_queries = w.n_q;
            sc.max_tokens = w.n_tokens;
            sc.block_size = BS;
            sc.q_heads = m.q_heads;
            sc.kv_heads = m.kv_heads;
            sc.head_dim = m.d;
            sc.kv_elt_bytes = kern_dtype_size(kern_kv_dtype(&kc.model));
            sc.q_elt_bytes = csz;
            sc.tiles = &tiles;
            sc.split_min_kv = 256;
            sc.max_partials = kc.max_partials;
            sc.invariant_chunk = mode ? 0 : ic.chunk;
            sched_t *s;
            REQ(sched_create(&sc, &s));
            for (uint32_t i = 0; i < w.n_q; i++) {
                const tl_query_t *x = &w.q[i];
                sched_query_t v = {x->blocks, x->n_blocks, x->kv_len, x->n_new, x->tok_off, 0};
                REQ(sched_forest_join(sched_forest(s), i, &v));
            }
            const sched_plan_hdr_t *h;
            REQ(sched_build(s, &h));
            if (!mode)
                rows_max = std::max(rows_max, h->max_cta_rows);
            kern_attn_params_t p = {scale, m.softcap};
            CK(cudaMemset(dout, 0xff, q.size()));
            CK(cudaDeviceSynchronize());
            REQ(kern_attend(b, 1, h, dq, dout, &p));
            REQ(kern_sync(b));
            CK(cudaMemcpy(it ? got.data() : ref[mode].data(),
                          (uint8_t *)dout + (size_t)w.q[probe].tok_off * row_bytes, probe_bytes,
                          cudaMemcpyDeviceToHost));
            if (it && memcmp(got.data(), ref[mode].data(), probe_bytes))
                differ[mode]++;
            sched_free(s);
        }
        tl_world_free(&w);
    }
    /* the invariant bits are attention's: float64 over the probe's KV as the pool holds it */
    const uint32_t g = m.q_heads / m.kv_heads;
    std::vector<double> K((size_t)ic.probe_len * m.d), V((size_t)ic.probe_len * m.d), qd(m.d),
        out(m.d), gd(m.d);
    double worst = 0.0;
    for (uint32_t hh = 0; hh < m.kv_heads; hh++) {
        for (uint32_t t = 0; t < ic.probe_len; t++)
            for (uint32_t x = 0; x < m.d; x++) {
                K[(size_t)t * m.d + x] = rt_kv(m, tl_kv_value(seed, t / BS, t % BS, hh, x, 0));
                V[(size_t)t * m.d + x] = rt_kv(m, tl_kv_value(seed, t / BS, t % BS, hh, x, 1));
            }
        for (uint32_t k = 0; k < ic.probe_new; k++)
            for (uint32_t j = 0; j < g; j++) {
                const uint64_t base = ((uint64_t)k * m.q_heads + hh * g + j) * m.d;
                for (uint32_t x = 0; x < m.d; x++) {
                    qd[x] = kern_load(m.dt, pq.data(), base + x);
                    gd[x] = kern_load(m.dt, ref[0].data(), base + x);
                }
                tl_ref_attend(qd.data(), K.data(), V.data(), ic.probe_len - ic.probe_new + 1 + k,
                              m.d, scale, m.softcap, out.data());
                worst = std::max(worst, tl_rel_err(gd.data(), out.data(), m.d));
            }
    }
    char name[160];
    snprintf(name, sizeof(name), "invariant %s: probe bitwise over 50 batches", ic.what);
    verdict(name, differ[0] == 0 && worst < 1e-2, "");
    printf("    %u/%u d%u chunk %u: differ in %u of 49 (mode off: %u), %u neighbours, CTAs up to "
           "%u rows, vs float64 %.2e\n",
           m.q_heads, m.kv_heads, m.d, ic.chunk, differ[0], differ[1], others, rows_max, worst);
    snprintf(name, sizeof(name), "invariant %s: the mode off differs", ic.what);
    verdict(name, differ[1] > 0);
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    kern_backend_free(b);
}

static void test_invariant()
{
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x1aa));
    const InvCase cases_inv[] = {
        {{32, 8, 128, KERN_BF16, 0},
         256,
         1500,
         1,
         KERN_FWD_AUTO,
         KERN_MERGE_LAUNCH,
         "pair 32/8 decode"},
        {{8, 2, 64, KERN_F16, 30},
         128,
         900,
         5,
         KERN_FWD_AUTO,
         KERN_MERGE_INSIDE,
         "pair 8/2 extend, merge inside"},
        {{32, 32, 128, KERN_F16, 0},
         1024,
         2100,
         1,
         KERN_FWD_AUTO,
         KERN_MERGE_LAUNCH,
         "pair 32/32 decode"},
        {{16, 8, 256, KERN_F16, 0}, 256, 1300, 2, KERN_FWD_AUTO, KERN_MERGE_LAUNCH, "layer d256"},
        {{32, 8, 128, KERN_BF16, 0},
         256,
         1500,
         1,
         KERN_FWD_LAYER,
         KERN_MERGE_INSIDE,
         "gpu.forward = layer"},
        {{32, 8, 128, KERN_BF16, 0, KERN_FP8_E4M3, 0.25f},
         512,
         1700,
         1,
         KERN_FWD_AUTO,
         KERN_MERGE_LAUNCH,
         "fp8 e4m3 pool"},
    };
    for (const InvCase &ic : cases_inv) {
        if (ic.m.kv && !fp8_runs())
            continue;
        test_invariant_case(ic, &r);
    }
}

int main(int argc, char **argv)
{
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    g_quick = quick;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strncmp(argv[1], "--tree", 6) == 0) { /* one test; --tree-quick: small */
        g_quick = strcmp(argv[1], "--tree-quick") == 0;
        if (strcmp(argv[1], "--tree-loop") == 0) /* --tree-loop N: the worlds rerun N times */
            g_tree_repeat = argc > 2 ? atoi(argv[2]) : 200;
        test_tree();
    } else if (argc > 1 && strcmp(argv[1], "--dep") == 0) { /* one test */
        test_dependent_launch();
    } else if (argc > 1 && strcmp(argv[1], "--invariant") == 0) { /* batch invariance alone */
        test_invariant();
    } else if (argc > 1 && strcmp(argv[1], "--fp8") == 0) { /* the fp8 tests alone */
        test_fp8_refused();
        test_fp8_append_bytes();
        test_fp8_codes();
        test_fp8_random(30, tl_test_seed(0xf8f8));
        test_fp8_random(10, tl_test_seed(0xf8f9), KERN_FWD_LAYER);
    } else if (quick) {
        test_random(4, 11);
        test_random(4, 12, KERN_FWD_MMA);
        test_random(8, 13, KERN_FWD_LAYER);
        test_random(4, 16, KERN_FWD_TMA);
        test_persistent(3, 14);
        test_mixed(64);
        test_all_split();
        test_tree();
        test_nonfinite_kv();
        test_dependent_launch();
        test_copy_and_errors();
        test_fp8_refused();
        if (fp8_runs()) {
            test_fp8_append_bytes();
            test_fp8_codes();
            test_fp8_random(10, 15);
            test_fp8_random(4, 17, KERN_FWD_LAYER);
        }
    } else {
        test_tiles();
        test_random(40, tl_test_seed(0xcafe));
        test_random(20, tl_test_seed(0xbeef), KERN_FWD_MMA);
        test_random(8, tl_test_seed(0xf00d), KERN_FWD_LAYER);
        test_random(8, tl_test_seed(0xfeed), KERN_FWD_TMA);
        test_persistent(8, tl_test_seed(0xd00d));
        test_mixed(0);
        test_mixed(64);
        test_all_split();
        test_tree();
        test_repeat_equal();
        test_nonfinite_kv();
        test_dependent_launch();
        test_copy_and_errors();
        test_invariant();
        test_fp8_refused();
        if (fp8_runs()) {
            test_fp8_append_bytes();
            test_fp8_codes();
            test_fp8_random(30, tl_test_seed(0xf8f8));
            test_fp8_random(10, tl_test_seed(0xf8f9), KERN_FWD_LAYER);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
