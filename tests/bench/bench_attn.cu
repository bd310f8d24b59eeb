/*
 * bench_attn.cu — decode attention of the cuda backend on the PAT paper's synthetic trees, beside
 * the two physical floors measured in the same run.
 *
 * Tree notation B_L: nodes per level, then tokens per level; the last level is each query's own
 * tokens, so queries = its node count (e.g. 1,10_4096,416: one 4096-token prefix shared by 10
 * queries with 416 private tokens each). Every node owns distinct blocks; a query's block table
 * is its root-to-leaf path. One decode token per query, one layer, fp16, head_dim 128, block 16.
 *
 * Modes (each a plan of the same batch, executed by the same backend, one launch per layer):
 *   pat      patd's plan: pack policy auto (least modelled time), the device's tile table and
 *            time-model rates
 *   qc       query-centric: one query per CTA over its whole KV (policy query), same tiles
 *   bytes    policy bytes forced; paper: policy paper forced (auto picks among bytes, paper,
 *            query and tree by modelled time: compare_pat.py judges its pick against the best)
 *   tree     policy tree: queries in prefix-tree order, a tile's rows per CTA, each CTA reading
 *            its rows' whole paths as block-diagonal segments (auto may choose it too);
 *            tree16 / tree32: the same with CTAs of at most 16 / 32 rows
 *   wide128  TREE with tile m 128 only (the default table's largest) on the default forward
 *   fixed    pack as pat but one fixed tile (m 64; the paper's ablation)
 *   pat      runs the default forward, KERN_FWD_AUTO: on sm_90a every CTA on the warp-specialized
 *            fwd_pair (tile m up to 128, KV tiles by cp.async)
 *   tma      pat's plan on a backend with KERN_FWD_TMA (fwd_pair loading KV pages by TMA)
 *   layer    a backend with KERN_FWD_LAYER (the 4-warp kernels: wgmma for TREE CTAs of 33-64 rows,
 *            mma.sync elsewhere; the default until 2026-11-25) on the plan auto makes for its tile
 *            table (layer_rows: its largest CTA)
 *   mma      a backend whose forward uses mma.sync for every CTA (KERN_FWD_MMA), on the plan
 *            auto makes for its tile table
 *   inside   pat's plan on a backend merging split tokens inside the forward (KERN_MERGE_INSIDE,
 *            gpu.merge = inside; measured 1.17x slower than the merge launch on 2026-11-24's
 *            kernels, RESULTS.md)
 *   nomerge  pat's plan with every row made direct and the merge list dropped (outputs wrong,
 *            timing only): pat - nomerge bounds what the split and merge cost in the call
 * Latency: each call is preceded by an L2 flush (a 256 MiB read) and timed with CUDA events; 30
 * timed after 5 warm-ups, all queued behind a 20 ms spin kernel so the GPU never waits for the
 * host; the median is reported (PAT's timing, ../shared/peers/pat). Pack: CPU time of a full
 * plan build from an empty forest (join + pack + plan), median of 20.
 * Floors: distinct KV bytes / measured read bandwidth (16-byte loads over 4 GiB) and attention
 * FLOPs (4 * q_heads * kv_len * head_dim per query) / measured tensor-core rate (cuBLAS fp16 GEMM
 * 8192^3, fp32 accumulate); floor = the larger. Achieved TB/s = distinct bytes / pat latency,
 * TFLOP/s = FLOPs / pat latency; re-read = KV bytes the plan reads / distinct KV bytes; model =
 * the scheduler's modelled time of the plan.
 *
 * Output: a table on stdout; --json FILE writes one JSON object per row (tests/bench/bench_sdpa.py
 * adds PyTorch SDPA on dense per-query KV; tests/bench/compare_pat.py puts PAT's run beside it).
 * --kv fp8_e4m3|fp8_e5m2: instead of the modes above, the default forward over an fp16 pool beside
 * the same over an fp8 pool (plans auto and query; and auto on KERN_FWD_LAYER, the 4-warp
 * kernels), with each pool's floor (run_config_kv8).
 * --invariant C,...: instead, the default plan beside batch-invariant plans of each chunk C
 * (run_config_inv); with --invariant-cuts also each of those plans with every cut rule forced
 * (sched_config_t.invariant_cut: how good the time model's pick is).
 * --quick: 4 trees, one head config; --trees / --heads pick cases: --trees takes B_L specs and
 * the sets paper (the PAT paper's 20 trees, the default), own (kOwnTrees: ten shapes of our own)
 * and all, separated by ';'; every spec is checked before anything runs.
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <string>
#include <vector>

extern "C" {
#include "kern.h"
#include "sched_plan.h"
#include "tl_world.h"
}
#include "kern_cuda.h"
#include "kern_cuda_ptx.cuh" /* globaltimer */
#include "kern_cuda_tool.h"

#define BS 16u
#define D  128u

static const char *const kTrees[] = {
    "1,10_4096,416",
    "1,256_256,32",
    "1,1024_2048,32",
    "1,2,64_1024,256,256",
    "1,4,256_32,256,32",
    "1,8,512_32,512,256",
    "1,8,512_32,2048,256",
    "1,8,512_512,512,256",
    "1,4,8,256_32,256,256,32",
    "1,4,16,512_1024,256,128,32",
    "1,4,16,64,256,1024_256,32,256,64,32,256",
    "1,16,32,64,128,1024_256,128,64,32,32,32",
    "1,16,32,64,256,1024_256,128,64,32,32,32",
    "1,8,16,32,64,128,1024_256,128,64,32,32,32,32",
    "1,8,16,32,64,256,1024_256,128,64,32,32,32,32",
    "2,8,16,256_256,256,32,32",
    "4,16,256,512_512,32,128,32",
    "8,16,32,256_512,512,256,32",
    "256_1024",
    "256_4096",
};
/* Ten shared-prefix shapes of our own beyond the paper's (serving shapes it does not cover; every
 * level a multiple of 32 tokens, so that PAT runs them too): --trees own */
static const char *const kOwnTrees[] = {
    "1,128_8192,32",                         /* a long system prompt, 128 short leaves */
    "1,512_2048,64",                         /* one prompt, 512 chats behind it */
    "1,2,4,8,16,32_1024,512,256,256,128,64", /* an agent's binary tree, 6 levels */
    "1,2,4,8,16,32,64,128_512,256,256,128,128,64,64,32", /* a deeper one, 8 levels, 128 leaves */
    "1,3,9,27,81_2048,512,256,128,32",                   /* tool calls three ways at each step */
    "2,128_4096,64",                                     /* a forest of two system prompts */
    "4,16,64_2048,256,32", /* four roots, few-shot templates under each */
    "1,4_4096,32",         /* beam search, width 4, one request */
    "16,64_1024,64",       /* beam search, 16 requests x 4 beams */
    "64,128_512,32",       /* parallel sampling: 64 prompts x 2 */
};
static const uint32_t kHeads[][2] = {{32, 32}, {16, 8}, {32, 8}, {64, 8}};

/* ------------------------------------------------------------------ device helpers */

__global__ void fill_kernel(__half *p, uint64_t n, uint64_t seed)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 29;
        p[i] = __float2half((float)(x >> 40) / 8388608.0f - 1.0f); /* [-1, 1) */
    }
}

__global__ void spin_kernel(uint64_t ns)
{
    const uint64_t t0 = kcuda::globaltimer();
    for (;;) {
        const uint64_t t = kcuda::globaltimer();
        if (t - t0 >= ns)
            break;
        __nanosleep(1000);
    }
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* read bandwidth, bytes/s: 16-byte loads over 4 GiB, median of 10 */
static double measure_bw()
{
    double bw = kern_cuda_read_bandwidth(4ull << 30, 10);
    REQ((int)(bw > 0 ? 0 : bw));
    return bw;
}

/* tensor-core rate, FLOP/s: cuBLAS fp16 8192^3 with fp32 accumulation, median of 10 */
static double measure_tc()
{
    const int n = 8192;
    __half *a, *b, *c;
    CK(cudaMalloc(&a, (size_t)n * n * 2));
    CK(cudaMalloc(&b, (size_t)n * n * 2));
    CK(cudaMalloc(&c, (size_t)n * n * 2));
    fill_kernel<<<1024, 256>>>(a, (uint64_t)n * n, 1);
    fill_kernel<<<1024, 256>>>(b, (uint64_t)n * n, 2);
    CK(cudaGetLastError());
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        exit(2);
    }
    const float one = 1.f, zero = 0.f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int i = 0; i < 12; i++) {
        CK(cudaEventRecord(e0));
        if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16F, n, b,
                         CUDA_R_16F, n, &zero, c, CUDA_R_16F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx failed\n");
            exit(2);
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 2)
            t.push_back(ms);
    }
    cublasDestroy(h);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    return 2.0 * n * n * (double)n / (median(t) * 1e-3);
}

/* ------------------------------------------------------------------ trees */

struct Tree {
    std::vector<uint32_t> nodes, toks;
};

/* B_L -> its levels; false where s is not a tree (the counts and lengths differ in number, a
 * count or length is 0, or a count does not divide the next) */
static bool parse(const char *s, Tree *out)
{
    Tree t;
    const char *us = strchr(s, '_');
    if (!us)
        return false;
    for (const char *p = s; p < us;) {
        const char *e;
        t.nodes.push_back((uint32_t)strtoul(p, (char **)&e, 10));
        if (e == p || (*e != ',' && *e != '_'))
            return false;
        p = *e == ',' ? e + 1 : e;
    }
    for (const char *p = us + 1; *p;) {
        const char *e;
        t.toks.push_back((uint32_t)strtoul(p, (char **)&e, 10));
        if (e == p || (*e != ',' && *e))
            return false;
        p = *e == ',' ? e + 1 : e;
    }
    if (t.nodes.empty() || t.nodes.size() != t.toks.size())
        return false;
    for (size_t l = 0; l < t.nodes.size(); l++)
        if (!t.nodes[l] || !t.toks[l] || (l && t.nodes[l] % t.nodes[l - 1]))
            return false;
    *out = t;
    return true;
}

/* "paper" (kTrees), "own" (kOwnTrees) or "other": compare_pat.py's sets */
static const char *tree_set(const char *spec)
{
    for (const char *t : kTrees)
        if (!strcmp(t, spec))
            return "paper";
    for (const char *t : kOwnTrees)
        if (!strcmp(t, spec))
            return "own";
    return "other";
}

/* one query per last-level node; node i of level l hangs under node i / (n_l / n_{l-1}) */
static void build(tl_world_t *w, const Tree &t)
{
    memset(w, 0, sizeof(*w));
    w->bs = BS;
    const size_t L = t.nodes.size();
    std::vector<std::vector<uint32_t>> first(L); /* first block id of each node */
    for (size_t l = 0; l < L; l++)
        for (uint32_t i = 0; i < t.nodes[l]; i++) {
            first[l].push_back(w->next_block);
            w->next_block += (t.toks[l] + BS - 1) / BS;
        }
    const uint32_t nq = t.nodes[L - 1];
    w->n_q = nq;
    w->q = (tl_query_t *)calloc(nq, sizeof(tl_query_t));
    for (uint32_t i = 0; i < nq; i++) {
        tl_query_t *q = &w->q[i];
        std::vector<uint32_t> path(L);
        uint32_t node = i;
        for (size_t l = L; l-- > 0;) {
            path[l] = node;
            if (l)
                node /= t.nodes[l] / t.nodes[l - 1];
        }
        for (size_t l = 0; l < L; l++)
            q->kv_len += t.toks[l];
        q->n_blocks = q->cap_blocks = 0;
        for (size_t l = 0; l < L; l++)
            q->n_blocks += (t.toks[l] + BS - 1) / BS;
        q->cap_blocks = q->n_blocks;
        q->blocks = (uint32_t *)malloc(q->n_blocks * sizeof(uint32_t));
        uint32_t k = 0;
        for (size_t l = 0; l < L; l++)
            for (uint32_t b = 0; b < (t.toks[l] + BS - 1) / BS; b++)
                q->blocks[k++] = first[l][path[l]] + b;
        q->n_new = 1;
    }
    tl_world_layout(w);
}

static uint64_t distinct_tokens(const Tree &t)
{
    uint64_t s = 0;
    for (size_t l = 0; l < t.nodes.size(); l++)
        s += (uint64_t)t.nodes[l] * t.toks[l];
    return s;
}

/* ------------------------------------------------------------------ one configuration */

static sched_t *make_sched(const tl_world_t *w, uint32_t qh, uint32_t kvh, sched_policy_t pol,
                           const sched_tiles_t *tiles, uint32_t kv_elt = 2, uint32_t inv_chunk = 0,
                           uint32_t inv_cut = 0)
{
    sched_config_t sc = {};
    sc.max_queries = w->n_q;
    sc.max_tokens = w->n_tokens;
    sc.block_size = BS;
    sc.q_heads = qh;
    sc.kv_heads = kvh;
    sc.head_dim = D;
    sc.kv_elt_bytes = kv_elt;
    sc.q_elt_bytes = 2;
    sc.policy = pol;
    sc.tiles = tiles;
    sc.split_min_kv = 256; /* the daemon's setting */
    sc.max_partials = 64 * w->n_tokens;
    sc.invariant_chunk = inv_chunk;
    sc.invariant_cut = inv_cut;
    sched_t *s;
    REQ(sched_create(&sc, &s));
    for (uint32_t i = 0; i < w->n_q; i++) {
        const tl_query_t *q = &w->q[i];
        sched_query_t v = {q->blocks, q->n_blocks, q->kv_len, q->n_new, q->tok_off, 0};
        REQ(sched_forest_join(sched_forest(s), i, &v));
    }
    return s;
}

static double now_us()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* median CPU time of a plan built from an empty forest */
static double pack_us(const tl_world_t *w, uint32_t qh, uint32_t kvh, const sched_tiles_t *tiles)
{
    std::vector<double> t;
    for (int i = 0; i < 20; i++) {
        double t0 = now_us();
        sched_t *s = make_sched(w, qh, kvh, SCHED_POLICY_AUTO, tiles);
        const sched_plan_hdr_t *h;
        REQ(sched_build(s, &h));
        t.push_back(now_us() - t0);
        sched_free(s);
    }
    return median(t);
}

__global__ void flush_kernel(const uint4 *p, uint64_t n, uint32_t *sink)
{
    uint32_t acc = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        acc ^= p[i].x;
    if (acc == 0x12345678u)
        *sink = acc;
}

static uint4 *g_flush; /* 256 MiB, read before every timed call: L2 holds nothing of the batch */
static uint32_t *g_sink;
static const uint64_t kFlushBytes = 256ull << 20;

/* median GPU time of one layer of the plan, us */
static double time_plan(kern_backend_t *b, const sched_plan_hdr_t *h, const void *q, void *o,
                        const kern_attn_params_t *p)
{
    cudaStream_t st = static_cast<cudaStream_t>(kern_cuda_stream(b));
    for (int i = 0; i < 5; i++)
        REQ(kern_attend(b, 0, h, q, o, p));
    REQ(kern_sync(b));
    const int reps = 30;
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto &e : ev)
        CK(cudaEventCreate(&e));
    spin_kernel<<<1, 1, 0, st>>>(20000000ull);
    CK(cudaGetLastError());
    for (int i = 0; i < reps; i++) {
        flush_kernel<<<1024, 512, 0, st>>>(g_flush, kFlushBytes / 16, g_sink);
        CK(cudaGetLastError());
        CK(cudaEventRecord(ev[2 * i], st));
        REQ(kern_attend(b, 0, h, q, o, p));
        CK(cudaEventRecord(ev[2 * i + 1], st));
    }
    REQ(kern_sync(b));
    std::vector<double> t;
    for (int i = 0; i < reps; i++) {
        float ms;
        CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        t.push_back(ms * 1e3);
    }
    for (auto &e : ev)
        CK(cudaEventDestroy(e));
    return median(t);
}

static double rel_err_f16(const std::vector<__half> &a, const std::vector<__half> &b)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double x = __half2float(a[i]), y = __half2float(b[i]);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

struct Floors {
    double bw, tc;
};

/* the backends' config for a tree's world: one fp16 layer, every block, the default forward */
static kern_config_t bench_config(const tl_world_t &w, uint32_t qh, uint32_t kvh)
{
    kern_config_t kc = {};
    kc.model = {1, qh, kvh, D, BS, KERN_F16, KERN_F16, 0.f};
    kc.n_blocks = w.next_block;
    kc.max_tokens = 16384;
    kc.max_partials = 64 * w.n_tokens;
    return kc;
}

/* A run's device buffers: a staging chunk of random K and V (max_tokens tokens, the pools'
 * source) and the batch's random Q and its O; freed with it. The fills run on the legacy stream,
 * the appends on the backends' non-blocking ones: complete when made. */
struct Bufs {
    __half *dk, *dv, *dq, *dout;
    uint64_t qo_elems;
    Bufs(uint32_t max_tokens, uint32_t kvh, uint32_t qh, uint32_t n_tokens)
    {
        const uint64_t chunk = (uint64_t)max_tokens * kvh * D;
        qo_elems = (uint64_t)n_tokens * qh * D;
        CK(cudaMalloc(&dk, chunk * 2));
        CK(cudaMalloc(&dv, chunk * 2));
        CK(cudaMalloc(&dq, qo_elems * 2));
        CK(cudaMalloc(&dout, qo_elems * 2));
        fill_kernel<<<1024, 256>>>(dk, chunk, 11);
        fill_kernel<<<1024, 256>>>(dv, chunk, 12);
        fill_kernel<<<1024, 256>>>(dq, qo_elems, 13);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
    }
    ~Bufs()
    {
        CK(cudaFree(dk));
        CK(cudaFree(dv));
        CK(cudaFree(dq));
        CK(cudaFree(dout));
    }
    Bufs(const Bufs &) = delete;
    Bufs &operator=(const Bufs &) = delete;
};

/* every slot of a backend's pool (layer 0) from one staging chunk, in chunks of max_tokens */
static void fill_pool(kern_backend_t *be, const tl_world_t &w, uint32_t max_tokens, const void *dk,
                      const void *dv)
{
    std::vector<uint32_t> slots(max_tokens);
    const uint64_t n_slots = (uint64_t)w.next_block * BS;
    for (uint64_t s0 = 0; s0 < n_slots; s0 += max_tokens) {
        uint32_t n = (uint32_t)std::min<uint64_t>(max_tokens, n_slots - s0);
        for (uint32_t i = 0; i < n; i++)
            slots[i] = (uint32_t)(s0 + i);
        REQ(kern_append_kv(be, 0, dk, dv, slots.data(), n));
    }
    REQ(kern_sync(be));
}

static void run_config(const char *spec, const Tree &t, uint32_t qh, uint32_t kvh, const Floors &f,
                       FILE *js)
{
    tl_world_t w;
    build(&w, t);
    kern_config_t kc = bench_config(w, qh, kvh);
    /* the default forward (KERN_FWD_AUTO), mma.sync only, the 4-warp kernels (KERN_FWD_LAYER),
     * and the default with its KV pages by TMA instead of cp.async (KERN_FWD_TMA) */
    kern_backend_t *b, *b_mma, *b_layer, *b_tma;
    REQ(kern_backend_create("cuda", &kc, &b));
    kc.fwd = KERN_FWD_TMA;
    REQ(kern_backend_create("cuda", &kc, &b_tma));
    kc.fwd = KERN_FWD_MMA;
    REQ(kern_backend_create("cuda", &kc, &b_mma));
    kc.fwd = KERN_FWD_LAYER;
    REQ(kern_backend_create("cuda", &kc, &b_layer));
    kc.fwd = KERN_FWD_AUTO;
    sched_tiles_t tiles, tiles_mma, tiles_layer;
    kern_tiles(b, &tiles);
    kern_tiles(b_mma, &tiles_mma);
    kern_tiles(b_layer, &tiles_layer);

    /* pool: every slot of every block, from one random staging chunk, in every backend */
    const Bufs bf(kc.max_tokens, kvh, qh, w.n_tokens);
    __half *const dq = bf.dq, *const dout = bf.dout;
    const uint64_t qo_elems = bf.qo_elems;
    auto load_pool = [&](kern_backend_t *be) { fill_pool(be, w, kc.max_tokens, bf.dk, bf.dv); };
    for (kern_backend_t *be : {b, b_mma, b_layer, b_tma})
        load_pool(be);

    kern_attn_params_t p = {1.0f / sqrtf((float)D), 0};
    sched_t *s_pat = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles);
    sched_t *s_qc = make_sched(&w, qh, kvh, SCHED_POLICY_QUERY, &tiles);
    sched_t *s_tree = make_sched(&w, qh, kvh, SCHED_POLICY_TREE, &tiles);
    /* auto's other two forced alternatives (with query and tree: the time model's choice is
     * judged against the best of the four) */
    sched_t *s_bytes = make_sched(&w, qh, kvh, SCHED_POLICY_BYTES, &tiles);
    sched_t *s_paper = make_sched(&w, qh, kvh, SCHED_POLICY_PAPER, &tiles);
    sched_tiles_t fixed = tiles; /* one tile shape: m 64 */
    fixed.n_m = 1;
    fixed.m[0] = 64;
    sched_t *s_fix = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &fixed);
    /* mma.sync only and the 4-warp kernels, each on the plan auto makes for its tile table */
    sched_t *s_mma = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles_mma);
    sched_t *s_layer = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles_layer);
    const sched_plan_hdr_t *h_layer, *h_mma;
    REQ(sched_build(s_layer, &h_layer));
    REQ(sched_build(s_mma, &h_mma));
    /* TREE with smaller CTAs: m <= 16 and m <= 32 */
    sched_tiles_t small = tiles;
    small.n_m = 1;
    small.m[0] = 16;
    sched_t *s_t16 = make_sched(&w, qh, kvh, SCHED_POLICY_TREE, &small);
    small.n_m = 2;
    small.m[1] = 32;
    sched_t *s_t32 = make_sched(&w, qh, kvh, SCHED_POLICY_TREE, &small);
    const sched_plan_hdr_t *h_t16, *h_t32;
    REQ(sched_build(s_t16, &h_t16));
    REQ(sched_build(s_t32, &h_t32));
    /* TREE with the default table's largest CTA only (128 rows where the warp-specialized kernel
     * runs) */
    sched_tiles_t big = tiles;
    big.n_m = 1;
    big.m[0] = (uint16_t)tiles.m[tiles.n_m - 1];
    sched_t *s_w128 = make_sched(&w, qh, kvh, SCHED_POLICY_TREE, &big);
    const sched_plan_hdr_t *h_w128;
    REQ(sched_build(s_w128, &h_w128));
    sched_traffic_t tr128;
    sched_plan_traffic(h_w128, qh, kvh, D, 2, 2, &tr128);
    const sched_plan_hdr_t *h_pat, *h_qc, *h_fix, *h_tree, *h_bytes, *h_paper;
    REQ(sched_build(s_pat, &h_pat));
    REQ(sched_build(s_bytes, &h_bytes));
    REQ(sched_build(s_paper, &h_paper));
    REQ(sched_build(s_tree, &h_tree));
    REQ(sched_build(s_qc, &h_qc));
    REQ(sched_build(s_fix, &h_fix));
    sched_stats_t st;
    sched_get_stats(s_pat, &st);
    static const char *const pol_name[] = {"auto", "bytes", "paper", "query", "tree"};
    int chosen = 1;
    for (int i = 2; i < 5; i++)
        chosen = st.chosen[i] > st.chosen[chosen] ? i : chosen;
    sched_traffic_t tr;
    sched_plan_traffic(h_pat, qh, kvh, D, 2, 2, &tr);
    const std::vector<uint8_t> nomerge = plan_without_merges(h_pat);

    const double us_pat = time_plan(b, h_pat, dq, dout, &p);
    std::vector<__half> o_pat(qo_elems), o_qc(qo_elems);
    CK(cudaMemcpy(o_pat.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    const double us_qc = time_plan(b, h_qc, dq, dout, &p);
    CK(cudaMemcpy(o_qc.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    const double us_fix = time_plan(b, h_fix, dq, dout, &p);
    const double us_tree = time_plan(b, h_tree, dq, dout, &p);
    const double us_bytes = time_plan(b, h_bytes, dq, dout, &p);
    const double us_paper = time_plan(b, h_paper, dq, dout, &p);
    const double us_t16 = time_plan(b, h_t16, dq, dout, &p);
    const double us_t32 = time_plan(b, h_t32, dq, dout, &p);
    const double us_layer = time_plan(b_layer, h_layer, dq, dout, &p);
    std::vector<__half> o_layer(qo_elems);
    CK(cudaMemcpy(o_layer.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    const double us_w128 = time_plan(b, h_w128, dq, dout, &p);
    std::vector<__half> o_w128(qo_elems);
    CK(cudaMemcpy(o_w128.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    const double us_mma = time_plan(b_mma, h_mma, dq, dout, &p);
    std::vector<__half> o_mma(qo_elems);
    CK(cudaMemcpy(o_mma.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    /* the same plan as the default, its KV loaded by cp.async: the loads' own share */
    const double us_tma = time_plan(b_tma, h_pat, dq, dout, &p);
    std::vector<__half> o_tma(qo_elems);
    CK(cudaMemcpy(o_tma.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    /* the same plan, its split tokens merged inside the forward: a backend of its own, made only
     * for a plan with merges (without, both settings run the same launch) and freed at once (a
     * fifth pool beside the others did not fit an H100 at 256_4096 32/32) */
    double us_in = us_pat;
    std::vector<__half> o_in = o_pat;
    if (h_pat->n_merges) {
        kern_backend_t *b_in;
        kc.merge = KERN_MERGE_INSIDE;
        REQ(kern_backend_create("cuda", &kc, &b_in));
        kc.merge = KERN_MERGE_LAUNCH;
        load_pool(b_in);
        us_in = time_plan(b_in, h_pat, dq, dout, &p);
        CK(cudaMemcpy(o_in.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
        kern_backend_free(b_in);
    }
    const double mma_agree =
        std::max({rel_err_f16(o_mma, o_pat), rel_err_f16(o_layer, o_pat),
                  rel_err_f16(o_w128, o_pat), rel_err_f16(o_tma, o_pat), rel_err_f16(o_in, o_pat)});
    const double us_nm = h_pat->n_merges
                             ? time_plan(b, (const sched_plan_hdr_t *)nomerge.data(), dq, dout, &p)
                             : us_pat;
    const double pk = pack_us(&w, qh, kvh, &tiles);
    const double agree = rel_err_f16(o_pat, o_qc);

    const uint64_t dtok = distinct_tokens(t);
    const double bytes = (double)dtok * kvh * D * 2 * 2;
    double flops = 0;
    for (uint32_t i = 0; i < w.n_q; i++)
        flops += 4.0 * qh * w.q[i].kv_len * D;
    const double floor_bw = bytes / f.bw * 1e6, floor_tc = flops / f.tc * 1e6;
    const double floor = std::max(floor_bw, floor_tc);
    const double reread = (double)tr.kv / bytes;
    const double merge_frac = std::max(0.0, (us_pat - us_nm) / us_pat);
    printf("%-46s %2u/%-2u %4u %6u %8.1f %8.1f %8.1f %8.1f %7.1f %5.2f %6.2f %6.1f %5.2f %5.1f%% "
           "%7.1f %5.2fx %5.2fx %7.1f %d %.1e %7.1f %s %7.1f\n",
           spec, qh, kvh, w.n_q, w.q[0].kv_len, us_pat, us_qc, us_fix, us_nm, floor, us_pat / floor,
           bytes / (us_pat * 1e-6) / 1e12, flops / (us_pat * 1e-6) / 1e12, reread, 100 * merge_frac,
           st.last_model_ns / 1e3, us_qc / us_pat, us_fix / us_pat, pk, h_pat->n_ctas, agree,
           us_tree, pol_name[chosen], us_mma);
    if (js)
        fprintf(js,
                "{\"tree\":\"%s\",\"q_heads\":%u,\"kv_heads\":%u,\"queries\":%u,\"kv_len\":%u,"
                "\"pat_us\":%.2f,\"qc_us\":%.2f,\"fixed_us\":%.2f,\"nomerge_us\":%.2f,"
                "\"pack_us\":%.1f,\"distinct_bytes\":%.0f,\"flops\":%.0f,\"floor_bw_us\":%.2f,"
                "\"floor_tc_us\":%.2f,\"floor_us\":%.2f,\"eff_bw_frac\":%.4f,\"tbs\":%.3f,"
                "\"tflops\":%.2f,\"reread\":%.3f,\"merge_frac\":%.4f,\"model_us\":%.2f,"
                "\"ctas\":%u,\"merges\":%u,\"pat_vs_qc_rel_err\":%.2e,\"read_bw\":%.0f,"
                "\"mma_us\":%.2f,\"mma_vs_auto_rel_err\":%.2e,\"tree_us\":%.2f,"
                "\"tree16_us\":%.2f,\"tree32_us\":%.2f,\"layer_us\":%.2f,\"layer_rows\":%u,"
                "\"wide128_us\":%.2f,\"wide128_reread\":%.3f,\"tma_us\":%.2f,"
                "\"inside_us\":%.2f,\"policy\":\"%s\",\"bytes_us\":%.2f,\"paper_us\":%.2f,"
                "\"set\":\"%s\"}\n",
                spec, qh, kvh, w.n_q, w.q[0].kv_len, us_pat, us_qc, us_fix, us_nm, pk, bytes, flops,
                floor_bw, floor_tc, floor, bytes / (us_pat * 1e-6) / f.bw,
                bytes / (us_pat * 1e-6) / 1e12, flops / (us_pat * 1e-6) / 1e12, reread, merge_frac,
                st.last_model_ns / 1e3, h_pat->n_ctas, h_pat->n_merges, agree, f.bw, us_mma,
                mma_agree, us_tree, us_t16, us_t32, us_layer, h_layer->max_cta_rows, us_w128,
                (double)tr128.kv / bytes, us_tma, us_in, pol_name[chosen], us_bytes, us_paper,
                tree_set(spec));
    sched_free(s_pat);
    sched_free(s_layer);
    sched_free(s_mma);
    sched_free(s_qc);
    sched_free(s_tree);
    sched_free(s_bytes);
    sched_free(s_paper);
    sched_free(s_t16);
    sched_free(s_t32);
    sched_free(s_w128);
    sched_free(s_fix);
    kern_backend_free(b);
    kern_backend_free(b_mma);
    kern_backend_free(b_layer);
    kern_backend_free(b_tma);
    tl_world_free(&w);
}

/* --kv FMT: the default forward over an fp16 pool and over an fp8 pool of format kv8 (factor 1:
 * the random K and V are in [-1, 1)), each on the plan auto makes with its own KV element size, the
 * same batch and Q. Floors: distinct KV bytes of each pool / measured bandwidth (and the FLOPs'
 * floor); the fp8 output's relative error against the fp16 pool's. */
static void run_config_kv8(const char *spec, const Tree &t, uint32_t qh, uint32_t kvh,
                           const Floors &f, kern_dtype_t kv8, FILE *js)
{
    tl_world_t w;
    build(&w, t);
    kern_config_t kc = bench_config(w, qh, kvh);
    kern_backend_t *b16, *b8, *b8l;
    REQ(kern_backend_create("cuda", &kc, &b16));
    kc.model.kv_dtype = kv8;
    REQ(kern_backend_create("cuda", &kc, &b8));
    kc.fwd = KERN_FWD_LAYER;
    REQ(kern_backend_create("cuda", &kc, &b8l));
    sched_tiles_t tiles16, tiles8, tiles8l;
    kern_tiles(b16, &tiles16);
    kern_tiles(b8, &tiles8);
    kern_tiles(b8l, &tiles8l);
    const Bufs bf(kc.max_tokens, kvh, qh, w.n_tokens);
    __half *const dq = bf.dq, *const dout = bf.dout;
    const uint64_t qo_elems = bf.qo_elems;
    for (kern_backend_t *be : {b16, b8, b8l})
        fill_pool(be, w, kc.max_tokens, bf.dk, bf.dv);
    kern_attn_params_t p = {1.0f / sqrtf((float)D), 0};
    sched_t *s16 = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles16, 2);
    sched_t *s8 = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles8, 1);
    sched_t *s8q = make_sched(&w, qh, kvh, SCHED_POLICY_QUERY, &tiles8, 1);
    sched_t *s8l = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles8l, 1);
    const sched_plan_hdr_t *h16, *h8, *h8q, *h8l;
    REQ(sched_build(s8l, &h8l));
    REQ(sched_build(s16, &h16));
    REQ(sched_build(s8, &h8));
    REQ(sched_build(s8q, &h8q));
    const double us16 = time_plan(b16, h16, dq, dout, &p);
    std::vector<__half> o16(qo_elems), o8(qo_elems);
    CK(cudaMemcpy(o16.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    const double us8 = time_plan(b8, h8, dq, dout, &p);
    CK(cudaMemcpy(o8.data(), dout, qo_elems * 2, cudaMemcpyDeviceToHost));
    const double us8q = time_plan(b8, h8q, dq, dout, &p);
    const double us8l = time_plan(b8l, h8l, dq, dout, &p);
    const double err = rel_err_f16(o8, o16);
    const uint64_t dtok = distinct_tokens(t);
    const double bytes16 = (double)dtok * kvh * D * 2 * 2, bytes8 = bytes16 / 2;
    double flops = 0;
    for (uint32_t i = 0; i < w.n_q; i++)
        flops += 4.0 * qh * w.q[i].kv_len * D;
    const double ftc = flops / f.tc * 1e6;
    const double fl16 = std::max(bytes16 / f.bw * 1e6, ftc),
                 fl8 = std::max(bytes8 / f.bw * 1e6, ftc);
    printf("%-46s %2u/%-2u %4u %8.1f %8.1f %8.1f %8.1f %7.1f %7.1f %5.2fx %5.2fx %5.2fx %.1e\n",
           spec, qh, kvh, w.n_q, us16, us8, us8q, us8l, fl16, fl8, us8 / fl8, us16 / fl16,
           us16 / us8, err);
    if (js)
        fprintf(js,
                "{\"tree\":\"%s\",\"q_heads\":%u,\"kv_heads\":%u,\"queries\":%u,\"kv\":\"%s\","
                "\"f16_us\":%.2f,\"fp8_us\":%.2f,\"fp8_qc_us\":%.2f,\"fp8_layer_us\":%.2f,"
                "\"floor16_us\":%.2f,"
                "\"floor8_us\":%.2f,\"floor8_bw_us\":%.2f,\"floor_tc_us\":%.2f,"
                "\"fp8_vs_f16_rel_err\":%.2e,\"read_bw\":%.0f,\"set\":\"%s\"}\n",
                spec, qh, kvh, w.n_q, kv8 == KERN_FP8_E4M3 ? "fp8_e4m3" : "fp8_e5m2", us16, us8,
                us8q, us8l, fl16, fl8, bytes8 / f.bw * 1e6, ftc, err, f.bw, tree_set(spec));
    sched_free(s16);
    sched_free(s8);
    sched_free(s8q);
    sched_free(s8l);
    kern_backend_free(b8l);
    kern_backend_free(b16);
    kern_backend_free(b8);
    tl_world_free(&w);
}

/* --invariant C,...: the default plan (auto) beside batch-invariant plans of each chunk C
 * (sched_config_t.invariant_chunk), one backend, the same batch and Q; each invariant output's
 * relative error against the default's (both are attention; not the same bits). */
static void run_config_inv(const char *spec, const Tree &t, uint32_t qh, uint32_t kvh,
                           const Floors &f, const std::vector<uint32_t> &chunks, bool cuts,
                           FILE *js)
{
    tl_world_t w;
    build(&w, t);
    kern_config_t kc = bench_config(w, qh, kvh);
    kern_backend_t *b;
    REQ(kern_backend_create("cuda", &kc, &b));
    sched_tiles_t tiles;
    kern_tiles(b, &tiles);
    const Bufs bf(kc.max_tokens, kvh, qh, w.n_tokens);
    fill_pool(b, w, kc.max_tokens, bf.dk, bf.dv);
    kern_attn_params_t p = {1.0f / sqrtf((float)D), 0};
    sched_t *s_pat = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles);
    const sched_plan_hdr_t *h_pat;
    REQ(sched_build(s_pat, &h_pat));
    const double us_pat = time_plan(b, h_pat, bf.dq, bf.dout, &p);
    std::vector<__half> o_pat(bf.qo_elems), o_inv(bf.qo_elems);
    CK(cudaMemcpy(o_pat.data(), bf.dout, bf.qo_elems * 2, cudaMemcpyDeviceToHost));
    std::vector<double> us(chunks.size()), err(chunks.size()), reread(chunks.size());
    /* --invariant-cuts: each chunk's plan again with every cut rule forced (0: not timed) */
    std::vector<double> cut_us(chunks.size() * SCHED_INVARIANT_CUTS);
    std::vector<uint32_t> pick(chunks.size());
    const uint64_t dtok = distinct_tokens(t);
    const double bytes = (double)dtok * kvh * D * 2 * 2;
    for (size_t i = 0; i < chunks.size(); i++) {
        sched_t *s = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles, 2, chunks[i]);
        const sched_plan_hdr_t *h;
        REQ(sched_build(s, &h));
        us[i] = time_plan(b, h, bf.dq, bf.dout, &p);
        CK(cudaMemcpy(o_inv.data(), bf.dout, bf.qo_elems * 2, cudaMemcpyDeviceToHost));
        err[i] = rel_err_f16(o_inv, o_pat);
        sched_traffic_t tr;
        sched_plan_traffic(h, qh, kvh, D, 2, 2, &tr);
        reread[i] = (double)tr.kv / bytes;
        sched_stats_t st;
        sched_get_stats(s, &st);
        pick[i] = st.invariant_cut;
        sched_free(s);
        for (uint32_t k = 1; cuts && k <= SCHED_INVARIANT_CUTS; k++) {
            sched_t *sk = make_sched(&w, qh, kvh, SCHED_POLICY_AUTO, &tiles, 2, chunks[i], k);
            const sched_plan_hdr_t *hk;
            REQ(sched_build(sk, &hk));
            cut_us[i * SCHED_INVARIANT_CUTS + k - 1] = time_plan(b, hk, bf.dq, bf.dout, &p);
            sched_free(sk);
        }
    }
    double flops = 0;
    for (uint32_t i = 0; i < w.n_q; i++)
        flops += 4.0 * qh * w.q[i].kv_len * D;
    const double floor = std::max(bytes / f.bw * 1e6, flops / f.tc * 1e6);
    printf("%-46s %2u/%-2u %4u %8.1f %7.1f", spec, qh, kvh, w.n_q, us_pat, floor);
    for (size_t i = 0; i < chunks.size(); i++)
        printf(" %8.1f %5.2fx %5.2f %.0e", us[i], us[i] / us_pat, reread[i], err[i]);
    printf("\n");
    for (size_t i = 0; cuts && i < chunks.size(); i++) {
        printf("    chunk %u, model's cut %u; each cut forced:", chunks[i], pick[i]);
        for (uint32_t k = 0; k < SCHED_INVARIANT_CUTS; k++)
            printf(" %.1f", cut_us[i * SCHED_INVARIANT_CUTS + k]);
        printf(" us\n");
    }
    if (js) {
        fprintf(js,
                "{\"tree\":\"%s\",\"q_heads\":%u,\"kv_heads\":%u,\"queries\":%u,\"pat_us\":%.2f,"
                "\"floor_us\":%.2f,\"distinct_bytes\":%.0f,\"read_bw\":%.0f,\"set\":\"%s\"",
                spec, qh, kvh, w.n_q, us_pat, floor, bytes, f.bw, tree_set(spec));
        for (size_t i = 0; i < chunks.size(); i++)
            fprintf(js,
                    ",\"inv%u_us\":%.2f,\"inv%u_reread\":%.3f,\"inv%u_rel_err\":%.2e,"
                    "\"inv%u_cut\":%u",
                    chunks[i], us[i], chunks[i], reread[i], chunks[i], err[i], chunks[i], pick[i]);
        for (size_t i = 0; cuts && i < chunks.size(); i++)
            for (uint32_t k = 0; k < SCHED_INVARIANT_CUTS; k++)
                fprintf(js, ",\"inv%u_cut%u_us\":%.2f", chunks[i], k + 1,
                        cut_us[i * SCHED_INVARIANT_CUTS + k]);
        fprintf(js, "}\n");
        fflush(js); /* a run cut short keeps its rows */
    }
    sched_free(s_pat);
    kern_backend_free(b);
    tl_world_free(&w);
}

int main(int argc, char **argv)
{
    bool quick = false;
    FILE *js = nullptr;
    kern_dtype_t kv8 = (kern_dtype_t)0; /* --kv: the fp8 comparison only */
    std::vector<uint32_t> inv;          /* --invariant: the invariant comparison only */
    bool inv_cuts = false;              /* --invariant-cuts: and every cut rule forced */
    std::vector<std::string> trees(kTrees, kTrees + sizeof(kTrees) / sizeof(kTrees[0]));
    std::vector<std::pair<uint32_t, uint32_t>> heads;
    for (const auto &h : kHeads)
        heads.push_back({h[0], h[1]});
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            ++i;
            if (!strcmp(argv[i], "fp8_e4m3"))
                kv8 = KERN_FP8_E4M3;
            else if (!strcmp(argv[i], "fp8_e5m2"))
                kv8 = KERN_FP8_E5M2;
            else {
                fprintf(stderr, "bench_attn: --kv takes fp8_e4m3 or fp8_e5m2 (got '%s')\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--invariant-cuts")) {
            inv_cuts = true;
        } else if (!strcmp(argv[i], "--invariant") && i + 1 < argc) {
            for (char *tok = strtok(argv[++i], ","); tok; tok = strtok(nullptr, ",")) {
                const unsigned long c = strtoul(tok, nullptr, 10);
                if (c == 0 || c % SCHED_INVARIANT_WINDOW || c > (1u << 20)) {
                    fprintf(stderr,
                            "bench_attn: --invariant takes chunks, multiples of %u "
                            "tokens (got '%s')\n",
                            SCHED_INVARIANT_WINDOW, tok);
                    return 2;
                }
                inv.push_back((uint32_t)c);
            }
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            js = fopen(argv[++i], "w");
            if (!js) {
                perror(argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--trees") && i + 1 < argc) {
            trees.clear();
            std::string all = argv[++i];
            for (size_t at = 0; at <= all.size();) {
                size_t e = all.find(';', at);
                if (e == std::string::npos)
                    e = all.size();
                const std::string one = all.substr(at, e - at);
                const bool paper = one == "paper" || one == "all";
                const bool own = one == "own" || one == "all";
                if (paper)
                    trees.insert(trees.end(), std::begin(kTrees), std::end(kTrees));
                if (own)
                    trees.insert(trees.end(), std::begin(kOwnTrees), std::end(kOwnTrees));
                if (!paper && !own && !one.empty())
                    trees.push_back(one);
                at = e + 1;
            }
        } else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            heads.clear();
            for (char *tok = strtok(argv[++i], ","); tok; tok = strtok(nullptr, ",")) {
                unsigned a = 0, b = 0;
                if (sscanf(tok, "%u/%u", &a, &b) != 2 || !a || !b || a % b) {
                    fprintf(stderr, "bench_attn: bad head config '%s' (want Q/KV)\n", tok);
                    return 2;
                }
                heads.push_back({a, b});
            }
        } else {
            fprintf(stderr, "usage: bench_attn [--quick] [--trees 'B_L;B_L;paper;own;all'] "
                            "[--heads 32/8,...] [--kv fp8_e4m3|fp8_e5m2] [--invariant C,...] "
                            "[--invariant-cuts] [--json FILE]\n");
            return 2;
        }
    }
    if (inv_cuts && inv.empty()) {
        fprintf(stderr, "bench_attn: --invariant-cuts goes with --invariant C,...\n");
        return 2;
    }
    if (quick) {
        heads = {{32, 8}};
        std::vector<std::string> some;
        for (size_t i = 0; i < trees.size(); i += 5)
            some.push_back(trees[i]);
        trees = some;
    }
    std::vector<Tree> parsed(trees.size());
    for (size_t i = 0; i < trees.size(); i++) {
        const std::string &t = trees[i];
        if (!parse(t.c_str(), &parsed[i])) {
            fprintf(stderr,
                    "bench_attn: bad tree '%s' (want B_L: node counts per level, each "
                    "dividing the next, then as many token counts, none 0)\n",
                    t.c_str());
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    Floors f = {measure_bw(), measure_tc()};
    CK(cudaMalloc(&g_flush, kFlushBytes));
    CK(cudaMemset(g_flush, 1, kFlushBytes));
    CK(cudaMalloc(&g_sink, 4));
    printf("device: %s, %d SMs; measured read bandwidth %.0f GB/s, fp16 tensor-core rate %.0f "
           "TFLOP/s\n",
           prop.name, prop.multiProcessorCount, f.bw / 1e9, f.tc / 1e12);
    if (!inv.empty()) {
        printf("%-46s %-5s %4s %8s %7s", "tree", "heads", "q", "auto_us", "floor");
        for (uint32_t c : inv)
            printf("   inv%-5u x_auto rerd err", c);
        printf("\n");
        for (const auto &h : heads)
            for (size_t i = 0; i < trees.size(); i++)
                run_config_inv(trees[i].c_str(), parsed[i], h.first, h.second, f, inv, inv_cuts,
                               js);
        if (js)
            fclose(js);
        return 0;
    }
    if (kv8) {
        printf("%-46s %-5s %4s %8s %8s %8s %8s %7s %7s %6s %6s %6s %s\n", "tree", "heads", "q",
               "f16_us", "fp8_us", "fp8qc_us", "fp8l_us", "floor16", "floor8", "8xflr", "16xflr",
               "16/8", "fp8~f16");
        for (const auto &h : heads)
            for (size_t i = 0; i < trees.size(); i++)
                run_config_kv8(trees[i].c_str(), parsed[i], h.first, h.second, f, kv8, js);
        if (js)
            fclose(js);
        return 0;
    }
    printf("%-46s %-5s %4s %6s %8s %8s %8s %8s %7s %5s %6s %6s %5s %6s %7s %6s %6s %7s %s %s "
           "%7s %s %7s\n",
           "tree", "heads", "q", "kv", "pat_us", "qc_us", "fixed_us", "nomrg_us", "floor", "xflr",
           "TB/s", "TFLOPs", "rerd", "merge", "model", "qc/pat", "fx/pat", "pack_us", "ctas",
           "pat~qc", "tree_us", "policy", "mma_us");
    for (const auto &h : heads)
        for (size_t i = 0; i < trees.size(); i++)
            run_config(trees[i].c_str(), parsed[i], h.first, h.second, f, js);
    if (js)
        fclose(js);
    return 0;
}
