/*
 * test_cpu.c — the cpu backend executes plans exactly: attention outputs against a float64 naive
 * reference over each query's logical KV, on random forests (depth 1-5, fan-out 1-64, KV lengths
 * up to 4K, partial last blocks), decode and extend (causal) rows, every head_dim, dtypes fp16,
 * bf16 and fp32, GQA groups 1-16 (non powers of two too), per-layer scale, softcap; outputs
 * poisoned before each run and checked fully written, pool slots outside every query's KV
 * poisoned with large K and V. Also: TREE plans of many segments per CTA on 16 and 32 workers
 * (bitwise equal to one worker), the semantics of empty ranges and fully masked merges (0, never
 * NaN), copy-on-write block copies, thread-count independence, and every error code of the
 * interface.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern.h"
#include "kern_dtype.h"
#include "sched_plan.h"
#include "tl_ref.h"
#include "tl_rng.h"
#include "tl_world.h"

#define BS     16u
#define LAYERS 2u

typedef struct mcase {
    uint32_t q_heads, kv_heads, d;
    kern_dtype_t dt;
    float softcap;
} mcase_t;

static const mcase_t cases[] = {
    {8, 8, 64, KERN_F16, 0},    /* MHA */
    {32, 8, 128, KERN_BF16, 0}, /* Llama-3-8B heads */
    {12, 4, 128, KERN_F16, 30}, /* group 3, softcap */
    {16, 1, 256, KERN_F32, 0},  /* group 16 */
    {10, 2, 64, KERN_BF16, 0},  /* group 5 */
    {14, 2, 256, KERN_F16, 50}, /* group 7, softcap */
    {6, 6, 128, KERN_F32, 20},  /* fp32, softcap */
    {32, 4, 64, KERN_F16, 0},   /* group 8 */
};

static double tol(kern_dtype_t dt)
{
    return dt == KERN_F32 ? 1e-5 : 1e-2;
}

typedef struct rig {
    tl_world_t w;
    mcase_t mc;
    kern_backend_t *b;
    sched_t *s;
    uint64_t seed; /* KV contents of layer 1 */
    void *q, *o;
    uint64_t q_elems;
    double scale;
    kern_dtype_t kvt;   /* the pool's KV dtype: 0 = mc.dt; set before rig_init */
    float kvs;          /* its kv_scale (fp8) */
    uint32_t inv_chunk; /* sched_config_t.invariant_chunk; set before rig_init */
} rig_t;

static uint32_t esz(kern_dtype_t dt)
{
    return kern_dtype_size(dt);
}

/* rounds through the dtype, as the backend stores it */
static double rt(kern_dtype_t dt, double v)
{
    uint8_t buf[4];
    kern_store(dt, buf, 0, (float)v);
    return kern_load(dt, buf, 0);
}

/* a K or V element v as the pool holds it, read back: the clients' dtype, then (fp8) v / kvs in
 * fp8 (pat_fp8.h) times kvs */
static double pool_value(const rig_t *g, double v)
{
    const double c = rt(g->mc.dt, v);
    if (!g->kvt || g->kvt == g->mc.dt)
        return c;
    const float s = g->kvs > 0.0f ? g->kvs : 1.0f;
    return rt(g->kvt, (double)((float)c / s)) * (double)s;
}

static void fill_pool(rig_t *g, uint32_t layer, uint64_t seed)
{
    const mcase_t *m = &g->mc;
    for (uint32_t i = 0; i < g->w.n_q; i++) {
        const tl_query_t *q = &g->w.q[i];
        uint32_t n = q->kv_len;
        uint8_t *k = malloc((size_t)n * m->kv_heads * m->d * esz(m->dt));
        uint8_t *v = malloc((size_t)n * m->kv_heads * m->d * esz(m->dt));
        uint32_t *slots = malloc(n * sizeof(uint32_t));
        for (uint32_t t = 0; t < n; t++) {
            uint32_t blk = q->blocks[t / BS], off = t % BS;
            slots[t] = blk * BS + off;
            for (uint32_t h = 0; h < m->kv_heads; h++)
                for (uint32_t x = 0; x < m->d; x++) {
                    uint64_t e = ((uint64_t)t * m->kv_heads + h) * m->d + x;
                    kern_store(m->dt, k, e, (float)tl_kv_value(seed, blk, off, h, x, 0));
                    kern_store(m->dt, v, e, (float)tl_kv_value(seed, blk, off, h, x, 1));
                }
        }
        assert_int_equal(kern_append_kv(g->b, layer, k, v, slots, n), 0);
        free(k);
        free(v);
        free(slots);
    }
}

/* Large K and V in every slot of `layer` that no query's logical KV covers (the tails of partial
 * last blocks, blocks no query uses): a backend that lets a position outside [kv_begin,
 * min(kv_end, limit)) into a row's softmax fails the float64 check, whatever the memory held. */
static void poison_unwritten(rig_t *g, uint32_t layer)
{
    const mcase_t *m = &g->mc;
    uint32_t n_slots = g->w.next_block * BS;
    uint8_t *used = calloc(n_slots, 1);
    for (uint32_t i = 0; i < g->w.n_q; i++)
        for (uint32_t t = 0; t < g->w.q[i].kv_len; t++)
            used[g->w.q[i].blocks[t / BS] * BS + t % BS] = 1;
    uint64_t row = (uint64_t)m->kv_heads * m->d;
    uint8_t *k = malloc(row * esz(m->dt)), *v = malloc(row * esz(m->dt));
    for (uint64_t e = 0; e < row; e++) {
        kern_store(m->dt, k, e, (float)(4.0 * tl_kv_value(g->seed, (uint32_t)e, 0, 0, 0, 2)));
        kern_store(m->dt, v, e, 50.0f);
    }
    for (uint32_t slot = 0; slot < n_slots; slot++)
        if (!used[slot])
            assert_int_equal(kern_append_kv(g->b, layer, k, v, &slot, 1), 0);
    free(k);
    free(v);
    free(used);
}

/* g->b: a backend of `threads` workers (0: one per online CPU) holding the world's KV, layer 1 from
 * g->seed, its unwritten slots poisoned. */
static int g_pool_fd = -2; /* rig_backend: -2 = a pool of the heap; else pool_keep, this fd */

/* the backend config of g's world: `threads` workers (0: one per online CPU) */
static kern_config_t rig_kc(const rig_t *g, uint32_t threads)
{
    const mcase_t *mc = &g->mc;
    uint64_t parts = 8ull * g->w.n_tokens + 64; /* an invariant plan: a slot per token chunk */
    for (uint32_t i = 0; g->inv_chunk && i < g->w.n_q; i++)
        parts += (uint64_t)g->w.q[i].n_new * (g->w.q[i].kv_len / g->inv_chunk + 1);
    kern_config_t kc = {.pool_keep = g_pool_fd != -2,
                        .pool_fd = g_pool_fd,
                        .model = {.n_layers = LAYERS,
                                  .q_heads = mc->q_heads,
                                  .kv_heads = mc->kv_heads,
                                  .head_dim = mc->d,
                                  .block_size = BS,
                                  .dtype = mc->dt,
                                  .kv_dtype = g->kvt,
                                  .kv_scale = g->kvs},
                        .n_blocks = g->w.next_block,
                        .max_tokens = g->w.n_tokens,
                        .max_partials = (uint32_t)parts,
                        .n_threads = threads};
    return kc;
}

static void rig_backend(rig_t *g, uint32_t threads)
{
    kern_config_t kc = rig_kc(g, threads);
    assert_int_equal(kern_backend_create("cpu", &kc, &g->b), 0);
    fill_pool(g, 0, g->seed ^ 0x5555); /* layer 0 holds different KV: offsets must be right */
    fill_pool(g, 1, g->seed);
    poison_unwritten(g, 1);
}

/* tiles: the scheduler's table (NULL: its default); split_factor: the scheduler's (0: its
 * default) */
static void rig_init_tiles(rig_t *g, tl_rng_t *r, const mcase_t *mc, sched_policy_t pol,
                           uint32_t split_min, uint32_t split_factor, uint32_t threads,
                           const sched_tiles_t *tiles)
{
    g->mc = *mc;
    sched_config_t sc = {.max_queries = g->w.n_q,
                         .max_tokens = g->w.n_tokens,
                         .block_size = BS,
                         .q_heads = mc->q_heads,
                         .kv_heads = mc->kv_heads,
                         .head_dim = mc->d,
                         .kv_elt_bytes = esz(g->kvt ? g->kvt : mc->dt),
                         .q_elt_bytes = esz(mc->dt),
                         .policy = pol,
                         .tiles = tiles,
                         .split_min_kv = split_min,
                         .split_factor = split_factor,
                         .invariant_chunk = g->inv_chunk};
    assert_int_equal(sched_create(&sc, &g->s), 0);
    for (uint32_t i = 0; i < g->w.n_q; i++) {
        const tl_query_t *q = &g->w.q[i];
        sched_query_t v = {q->blocks, q->n_blocks, q->kv_len, q->n_new, q->tok_off, 0};
        assert_int_equal(sched_forest_join(sched_forest(g->s), i, &v), 0);
    }
    g->seed = tl_rng_u64(r);
    rig_backend(g, threads);
    g->q_elems = (uint64_t)g->w.n_tokens * mc->q_heads * mc->d;
    g->q = malloc(g->q_elems * esz(mc->dt));
    g->o = malloc(g->q_elems * esz(mc->dt));
    double amp = 1.0 + 7.0 * (tl_rng_unit(r) + 1.0) / 2.0; /* peaky softmax sometimes */
    for (uint64_t i = 0; i < g->q_elems; i++)
        kern_store(mc->dt, g->q, i, (float)(amp * tl_rng_unit(r)));
    g->scale = 1.0 / sqrt((double)mc->d) * (0.5 + (tl_rng_unit(r) + 1.0) / 2.0);
}

static void rig_init(rig_t *g, tl_rng_t *r, const mcase_t *mc, sched_policy_t pol,
                     uint32_t split_min, uint32_t threads)
{
    rig_init_tiles(g, r, mc, pol, split_min, 0, threads, NULL);
}

static void rig_done(rig_t *g)
{
    kern_backend_free(g->b);
    sched_free(g->s);
    free(g->q);
    free(g->o);
    tl_world_free(&g->w);
}

static void run_layer1(rig_t *g)
{
    const sched_plan_hdr_t *h;
    assert_int_equal(sched_build(g->s, &h), 0);
    memset(g->o, 0xff, g->q_elems * esz(g->mc.dt)); /* poison: NaN in every dtype */
    kern_attn_params_t p = {.scale = (float)g->scale, .softcap = g->mc.softcap};
    assert_int_equal(kern_attend(g->b, 1, h, g->q, g->o, &p), 0);
}

/* Checks every output row of every token against the float64 reference; returns the worst. */
static double check_outputs(rig_t *g)
{
    const mcase_t *m = &g->mc;
    uint32_t group = m->q_heads / m->kv_heads, d = m->d;
    double worst = 0.0;
    double *qd = malloc(d * sizeof(double)), *ref = malloc(m->q_heads * d * sizeof(double));
    double *got = malloc(m->q_heads * d * sizeof(double)), *out = malloc(d * sizeof(double));
    for (uint32_t i = 0; i < g->w.n_q; i++) {
        const tl_query_t *q = &g->w.q[i];
        double *K = malloc((size_t)q->kv_len * d * sizeof(double));
        double *V = malloc((size_t)q->kv_len * d * sizeof(double));
        double **tok_ref = malloc(q->n_new * sizeof(double *));
        for (uint32_t k = 0; k < q->n_new; k++)
            tok_ref[k] = malloc(m->q_heads * d * sizeof(double));
        for (uint32_t h = 0; h < m->kv_heads; h++) {
            for (uint32_t t = 0; t < q->kv_len; t++)
                for (uint32_t x = 0; x < d; x++) {
                    uint32_t blk = q->blocks[t / BS], off = t % BS;
                    K[(uint64_t)t * d + x] = pool_value(g, tl_kv_value(g->seed, blk, off, h, x, 0));
                    V[(uint64_t)t * d + x] = pool_value(g, tl_kv_value(g->seed, blk, off, h, x, 1));
                }
            for (uint32_t k = 0; k < q->n_new; k++) {
                uint32_t tok = q->tok_off + k, limit = q->kv_len - q->n_new + k + 1;
                for (uint32_t j = 0; j < group; j++) {
                    uint32_t qh = h * group + j;
                    for (uint32_t x = 0; x < d; x++)
                        qd[x] = kern_load(m->dt, g->q, ((uint64_t)tok * m->q_heads + qh) * d + x);
                    tl_ref_attend(qd, K, V, limit, d, g->scale, m->softcap, out);
                    memcpy(tok_ref[k] + (uint64_t)qh * d, out, d * sizeof(double));
                }
            }
        }
        for (uint32_t k = 0; k < q->n_new; k++) {
            uint32_t tok = q->tok_off + k;
            for (uint64_t e = 0; e < (uint64_t)m->q_heads * d; e++) {
                got[e] = kern_load(m->dt, g->o, (uint64_t)tok * m->q_heads * d + e);
                assert_true(isfinite(got[e])); /* every element written, none NaN */
            }
            double err = tl_rel_err(got, tok_ref[k], (uint64_t)m->q_heads * d);
            if (err > worst)
                worst = err;
            free(tok_ref[k]);
        }
        free(tok_ref);
        free(K);
        free(V);
    }
    free(qd);
    free(ref);
    free(got);
    free(out);
    return worst;
}

/* A random forest whose reference cost stays within budget (CI has two cores); short: nodes of at
 * most 32 tokens (a tile of the default table) under 2- to 12-way fan-outs, which TREE reads in
 * the CTAs of their queries rather than apart. */
static void gen_bounded(tl_world_t *w, tl_rng_t *r, const mcase_t *m, int extend, int short_leaves)
{
    uint64_t budget = 6e7 / ((uint64_t)m->q_heads * m->d);
    for (;;) {
        uint32_t depth = tl_rng_range(r, 1, 5);
        tl_world_params_t p = {.bs = BS,
                               .trees = tl_rng_range(r, 1, 3),
                               .depth_lo = depth,
                               .depth_hi = depth,
                               .fanout_lo = short_leaves ? 2 : 1,
                               .fanout_hi = short_leaves ? 12 : tl_rng_range(r, 1, 64),
                               .level_tok_lo = 1,
                               .level_tok_hi = short_leaves ? 32 : tl_rng_range(r, 1, 4096 / depth),
                               .leaf_tok_lo = 1,
                               .leaf_tok_hi = short_leaves ? 32 : tl_rng_range(r, 1, 600),
                               .new_lo = 1,
                               .new_hi = extend ? tl_rng_range(r, 2, 48) : 1,
                               .max_queries = 64,
                               .spare_blocks = 2};
        tl_world_gen(w, r, &p);
        uint64_t work = 0;
        for (uint32_t i = 0; i < w->n_q; i++)
            work += (uint64_t)w->q[i].n_new * w->q[i].kv_len;
        if (work <= budget && w->n_q > 0)
            return;
        tl_world_free(w);
    }
}

static void test_random_forests_vs_fp64(void **state)
{
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0xc0de));
    static const sched_policy_t pols[] = {SCHED_POLICY_AUTO,  SCHED_POLICY_PAPER,
                                          SCHED_POLICY_QUERY, SCHED_POLICY_BYTES,
                                          SCHED_POLICY_TREE,  SCHED_POLICY_TREE};
    uint32_t merges_seen = 0, direct_seen = 0, segs_seen = 0;
    for (int round = 0; round < 32; round++) {
        const mcase_t *mc = &cases[round % (sizeof(cases) / sizeof(cases[0]))];
        rig_t g;
        memset(&g, 0, sizeof(g));
        gen_bounded(&g.w, &r, mc, round % 3 == 2, pols[round % 6] == SCHED_POLICY_TREE);
        rig_init(&g, &r, mc, pols[round % 6], round % 2 ? 64 : 0, 2);
        run_layer1(&g);
        const sched_plan_hdr_t *h;
        sched_build(g.s, &h);
        merges_seen += h->n_merges > 0;
        direct_seen += h->n_merges < h->n_tokens;
        segs_seen += h->n_segs > h->n_ctas; /* CTAs that read several nodes block-diagonally */
        double err = check_outputs(&g);
        if (err >= tol(mc->dt))
            fprintf(stderr, "round %d: q%u kv%u d%u dt%d: rel err %.3g\n", round, mc->q_heads,
                    mc->kv_heads, mc->d, mc->dt, err);
        assert_true(err < tol(mc->dt));
        rig_done(&g);
    }
    assert_true(merges_seen > 4 && direct_seen > 4 && segs_seen > 4);
}

/* fp8 KV's error, derived. The pool holds s x fp8(x / s) for a client's element x (s =
 * kv_scale): |dx| <= u |x| + s a, where u is the format's unit roundoff (e4m3 2^-4, e5m2 2^-3,
 * plus 2^-22 for the fp32 division before the rounding) and a half its smallest subnormal
 * (e4m3 2^-10, e5m2 2^-17), while |x / s| stays within the largest finite. A row q's scores
 * (softmax scale t) then move by at most E = max_j t sum_i |q_i| (u |k_ji| + s a) (a softcap is
 * 1-Lipschitz: no more after it), so each softmax weight by a factor within e^(+-2E): |dp_j| <=
 * p_j (e^(2E) - 1). With o = sum_j p_j v_j and sum_j p~_j = 1, element x of the output moves by
 * at most B_x = (e^(2E) - 1 + u) M_x + s a, M_x = max_j |v_jx| over the row's keys. Checked in
 * float64 between the reference over the pool's values and the one over the client's, for every
 * output element (the backend's own match to the first is check_outputs'); returns the largest
 * |change| / B_x seen. */
static double fp8_bound_check(const rig_t *g)
{
    const mcase_t *m = &g->mc;
    const uint32_t group = m->q_heads / m->kv_heads, d = m->d;
    const int e4 = g->kvt == KERN_FP8_E4M3;
    const double u = (e4 ? 0x1p-4 : 0x1p-3) + 0x1p-22, s = g->kvs > 0.0f ? g->kvs : 1.0;
    const double sa = s * (e4 ? 0x1p-10 : 0x1p-17);
    double worst = 0.0;
    double *qd = malloc(d * sizeof(double)), *ou = malloc(d * sizeof(double));
    double *oq = malloc(d * sizeof(double)), *mx = malloc(d * sizeof(double));
    for (uint32_t i = 0; i < g->w.n_q; i++) {
        const tl_query_t *q = &g->w.q[i];
        const size_t n = (size_t)q->kv_len * d;
        double *ku = malloc(n * sizeof(double)), *vu = malloc(n * sizeof(double));
        double *kq = malloc(n * sizeof(double)), *vq = malloc(n * sizeof(double));
        for (uint32_t h = 0; h < m->kv_heads; h++) {
            for (uint32_t t = 0; t < q->kv_len; t++)
                for (uint32_t x = 0; x < d; x++) {
                    const uint32_t blk = q->blocks[t / BS], off = t % BS;
                    const uint64_t e = (uint64_t)t * d + x;
                    const double kv = tl_kv_value(g->seed, blk, off, h, x, 0);
                    const double vv = tl_kv_value(g->seed, blk, off, h, x, 1);
                    ku[e] = rt(m->dt, kv);
                    vu[e] = rt(m->dt, vv);
                    kq[e] = pool_value(g, kv);
                    vq[e] = pool_value(g, vv);
                    assert_true(fabs(ku[e] / s) <= (e4 ? 448.0 : 57344.0)); /* in range */
                    assert_true(fabs(vu[e] / s) <= (e4 ? 448.0 : 57344.0));
                }
            for (uint32_t k = 0; k < q->n_new; k++) {
                const uint32_t tok = q->tok_off + k, limit = q->kv_len - q->n_new + k + 1;
                for (uint32_t x = 0; x < d; x++) {
                    mx[x] = 0.0;
                    for (uint32_t t = 0; t < limit; t++)
                        mx[x] = fmax(mx[x], fabs(vu[(uint64_t)t * d + x]));
                }
                for (uint32_t j = 0; j < group; j++) {
                    const uint32_t qh = h * group + j;
                    for (uint32_t x = 0; x < d; x++)
                        qd[x] = kern_load(m->dt, g->q, ((uint64_t)tok * m->q_heads + qh) * d + x);
                    double big_e = 0.0;
                    for (uint32_t t = 0; t < limit; t++) {
                        double e = 0.0;
                        for (uint32_t x = 0; x < d; x++)
                            e += fabs(qd[x]) * (u * fabs(ku[(uint64_t)t * d + x]) + sa);
                        big_e = fmax(big_e, g->scale * e);
                    }
                    tl_ref_attend(qd, ku, vu, limit, d, g->scale, m->softcap, ou);
                    tl_ref_attend(qd, kq, vq, limit, d, g->scale, m->softcap, oq);
                    for (uint32_t x = 0; x < d; x++) {
                        const double b = (expm1(2.0 * big_e) + u) * mx[x] + sa;
                        const double moved = fabs(oq[x] - ou[x]);
                        assert_true(moved <= b * (1.0 + 1e-9));
                        worst = fmax(worst, moved / b);
                    }
                }
            }
        }
        free(ku);
        free(vu);
        free(kq);
        free(vq);
    }
    free(qd);
    free(ou);
    free(oq);
    free(mx);
    return worst;
}

/* fp8 KV (kern_model_t.kv_dtype): e4m3 and e5m2 at four kv_scales each, under fp16 and bf16, MHA
 * and GQA, a softcap, decode and extend rows: the backend matches the float64 reference over the
 * values the pool holds as closely as a 16-bit pool does, and that reference stays within the
 * derived bound of the one over the clients' values (fp8_bound_check). */
static void test_fp8_kv_vs_fp64(void **state)
{
    (void)state;
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0xf8f8));
    static const mcase_t fcases[] = {
        {32, 8, 128, KERN_BF16, 0},
        {8, 8, 64, KERN_F16, 0},
        {12, 4, 128, KERN_F16, 30},
        {10, 2, 64, KERN_BF16, 0},
    };
    static const struct {
        kern_dtype_t kvt;
        float kvs;
    } fmts[] = {{KERN_FP8_E4M3, 1.0f}, {KERN_FP8_E5M2, 1.0f},  {KERN_FP8_E4M3, 0.015625f},
                {KERN_FP8_E5M2, 4.0f}, {KERN_FP8_E4M3, 0.37f}, {KERN_FP8_E5M2, 0.015625f},
                {KERN_FP8_E4M3, 4.0f}, {KERN_FP8_E5M2, 0.37f}};
    double ratio = 0.0;
    /* round r: model case r % 4 and format r, so both formats run under fp16 and bf16, with
     * factors above, at and below 1 */
    for (int round = 0; round < 8; round++) {
        const mcase_t *mc = &fcases[round % 4];
        rig_t g;
        memset(&g, 0, sizeof(g));
        g.kvt = fmts[round].kvt;
        g.kvs = fmts[round].kvs;
        gen_bounded(&g.w, &r, mc, round % 3 == 2, round % 4 == 3);
        rig_init(&g, &r, mc, round % 2 ? SCHED_POLICY_TREE : SCHED_POLICY_AUTO, round % 2 ? 64 : 0,
                 2);
        run_layer1(&g);
        const double err = check_outputs(&g);
        if (err >= tol(mc->dt))
            fprintf(stderr, "fp8 round %d: kv dtype %d scale %g: rel err %.3g\n", round, g.kvt,
                    (double)g.kvs, err);
        assert_true(err < tol(mc->dt));
        ratio = fmax(ratio, fp8_bound_check(&g));
        rig_done(&g);
    }
    /* the bound is the derivation's, not a tolerance: report how close the data came to it */
    printf("fp8 KV: largest output change / derived bound %.3f\n", ratio);
    assert_true(ratio > 0.0 && ratio <= 1.0);
}

/* TREE plans of the shapes tests/gpu/test_cuda_attn.cu's test_tree() builds on an H100 (--quick):
 * MHA at d 256 and d 128, up to 24 queries of short shared nodes, CTAs of <= 16 rows reading ~15
 * segments each, unsplit and split along KV (merges), on 16 and 32 workers, each plan run 7
 * times. Every token of every run matches the float64 reference (the GPU test checks a sample of
 * 8 queries against it, every token only against this backend) and is bitwise equal to a
 * 1-worker run; the pool's unwritten slots are poisoned (rig_backend). */
static void test_tree_plans_many_threads_vs_fp64(void **state)
{
    static const mcase_t mha[] = {
        {16, 16, 256, KERN_BF16, 20}, /* test_tree's "tree q16/kv16 d256" */
        {32, 32, 128, KERN_F16, 0},   /* its "tree q32/kv32 d128" */
    };
    static const uint32_t workers[] = {16, 32};
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(1234));
    uint32_t multi_seg = 0, merged = 0;
    for (int k = 0; k < 8; k++) {
        const mcase_t *mc = &mha[k % 2];
        const int split = (k / 2) % 2;
        const uint32_t threads = workers[k / 4];
        /* CTAs of at most 16 rows (what the H100's time model picks for these worlds), 64-token
         * KV tiles */
        const sched_tiles_t tiles = {
            .n_m = 1, .m = {16}, .n_n = 1, .n = {64}, .n_upto = {UINT32_MAX}};
        rig_t g;
        memset(&g, 0, sizeof(g));
        tl_world_params_t p = {.bs = BS,
                               .trees = 1 + k % 2,
                               .depth_lo = 1,
                               .depth_hi = 4,
                               .fanout_lo = 2,
                               .fanout_hi = 12,
                               .level_tok_lo = 1,
                               .level_tok_hi = 64,
                               .leaf_tok_lo = 1,
                               .leaf_tok_hi = 64,
                               .new_lo = 1,
                               .new_hi = k % 3 == 2 ? 5 : 1,
                               .max_queries = 24,
                               .spare_blocks = 2};
        tl_world_gen(&g.w, &r, &p);
        /* split: every CTA longer than the mean (and 64 tokens) is cut along KV (TREE plans are
         * never fill-split), its parts merged */
        rig_init_tiles(&g, &r, mc, SCHED_POLICY_TREE, split ? 64 : 0, split ? 1 : 0, threads,
                       &tiles);
        const sched_plan_hdr_t *h;
        assert_int_equal(sched_build(g.s, &h), 0);
        multi_seg += h->n_segs > h->n_ctas;
        merged += h->n_merges > 0;
        const uint64_t bytes = g.q_elems * esz(mc->dt);
        run_layer1(&g);
        double err = check_outputs(&g);
        if (err >= tol(mc->dt))
            fprintf(
                stderr,
                "tree %d: q%u/kv%u d%u, %u workers, %u CTAs %u segments %u merges: rel err %.3g\n",
                k, mc->q_heads, mc->kv_heads, mc->d, threads, h->n_ctas, h->n_segs, h->n_merges,
                err);
        assert_true(err < tol(mc->dt));
        uint8_t *first = malloc(bytes);
        memcpy(first, g.o, bytes);
        for (int rep = 0; rep < 6; rep++) {
            run_layer1(&g);
            assert_memory_equal(g.o, first, bytes);
        }
        /* the same pool contents on one worker */
        kern_backend_free(g.b);
        rig_backend(&g, 1);
        run_layer1(&g);
        assert_memory_equal(g.o, first, bytes);
        free(first);
        rig_done(&g);
    }
    assert_true(multi_seg >= 6 && merged >= 1); /* seeds 1-16: 8 and >= 2 */
}

/* Same plan and inputs with 1 and 3 threads, and the plan copied elsewhere: bitwise identical
 * outputs. */
static void test_threads_and_plan_copies_do_not_change_results(void **state)
{
    tl_rng_t r1, r2;
    tl_rng_seed(&r1, 99);
    tl_rng_seed(&r2, 99);
    rig_t a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    gen_bounded(&a.w, &r1, &cases[1], 1, 0);
    gen_bounded(&b.w, &r2, &cases[1], 1, 0);
    rig_init(&a, &r1, &cases[1], SCHED_POLICY_AUTO, 64, 1);
    rig_init(&b, &r2, &cases[1], SCHED_POLICY_AUTO, 64, 3);
    run_layer1(&a);
    run_layer1(&b);
    assert_memory_equal(a.o, b.o, a.q_elems * esz(cases[1].dt));
    /* the plan is position-independent: a copy at another address runs the same */
    const sched_plan_hdr_t *h;
    assert_int_equal(sched_build(a.s, &h), 0);
    void *moved = malloc(h->total_bytes + 64);
    sched_plan_hdr_t *mh = (sched_plan_hdr_t *)((char *)moved + 16);
    memcpy(mh, h, h->total_bytes);
    void *o2 = malloc(a.q_elems * esz(cases[1].dt));
    memset(o2, 0xff, a.q_elems * esz(cases[1].dt));
    kern_attn_params_t p = {.scale = (float)a.scale, .softcap = a.mc.softcap};
    assert_int_equal(kern_attend(a.b, 1, mh, a.q, o2, &p), 0);
    assert_memory_equal(a.o, o2, a.q_elems * esz(cases[1].dt));
    free(o2);
    free(moved);
    rig_done(&a);
    rig_done(&b);
}

/* A pool that outlives its backend (issue 37): KV written through a pool_keep backend, which is
 * then freed ("the daemon dies") while another descriptor of its memfd stays open, is read back
 * by a new backend over that descriptor: the same outputs, bit for bit, and float64's; a memfd
 * of another size is refused; the heap pool has no descriptor. */
static void test_pool_outlives_backend(void **state)
{
    (void)state;
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x9001));
    rig_t a;
    memset(&a, 0, sizeof(a));
    gen_bounded(&a.w, &r, &cases[1], 1, 0);
    g_pool_fd = -1;
    rig_init(&a, &r, &cases[1], SCHED_POLICY_AUTO, 64, 2);
    g_pool_fd = -2;
    run_layer1(&a);
    assert_true(check_outputs(&a) < tol(cases[1].dt));
    const uint64_t ob = a.q_elems * esz(cases[1].dt);
    void *first = malloc(ob);
    memcpy(first, a.o, ob);
    const int fd = dup(kern_pool_fd(a.b));
    assert_true(fd >= 0);
    kern_config_t kc = rig_kc(&a, 2);
    kern_backend_free(a.b);
    kc.pool_keep = 1;
    kc.pool_fd = fd;
    assert_int_equal(kern_backend_create("cpu", &kc, &a.b), 0);
    run_layer1(&a);
    assert_memory_equal(a.o, first, ob);
    assert_true(check_outputs(&a) < tol(cases[1].dt));
    kern_backend_t *x = NULL;
    kc.n_blocks += 1; /* a pool of another size: its memfd is not this one's */
    assert_int_equal(kern_backend_create("cpu", &kc, &x), -EINVAL);
    kc.n_blocks -= 1;
    kc.pool_keep = 0;
    assert_int_equal(kern_backend_create("cpu", &kc, &x), 0);
    assert_int_equal(kern_pool_fd(x), -1);
    kern_backend_free(x);
    close(fd);
    free(first);
    rig_done(&a);
}

/* A hand-written plan: token 0 has an empty partial (lse -inf) and a real one; token 1 is a
 * direct row with an empty range; token 2 merges two empty partials. Outputs: token 0 equals
 * its real part alone, tokens 1 and 2 are exactly 0, nothing is NaN. */
static void test_empty_ranges_and_masked_merge(void **state)
{
    kern_config_t kc = {.model = {1, 4, 4, 64, BS, KERN_F32, KERN_F32, 0.f},
                        .n_blocks = 4,
                        .max_tokens = 3,
                        .max_partials = 8,
                        .n_threads = 1};
    kern_backend_t *b;
    assert_int_equal(kern_backend_create("cpu", &kc, &b), 0);
    float kv[4 * 64];
    uint32_t slots[1];
    for (uint32_t t = 0; t < 32; t++) { /* blocks 0 and 1 */
        for (uint32_t i = 0; i < 4 * 64; i++)
            kv[i] = (float)tl_kv_value(5, t, 0, 0, i, 0);
        slots[0] = t;
        assert_int_equal(kern_append_kv(b, 0, kv, kv, slots, 1), 0);
    }
    struct {
        sched_plan_hdr_t h;
        sched_plan_group_t g[1];
        sched_plan_cta_t c[3];
        sched_plan_seg_t s[2];
        sched_plan_row_t r[6];
        uint32_t pages[2];
        sched_plan_merge_t m[2];
    } pl;
    memset(&pl, 0, sizeof(pl));
    pl.h = (sched_plan_hdr_t){.magic = SCHED_PLAN_MAGIC,
                              .version = SCHED_PLAN_VERSION,
                              .total_bytes = sizeof(pl),
                              .block_size = BS,
                              .group = 1,
                              .n_tokens = 3,
                              .n_groups = 1,
                              .n_ctas = 3,
                              .n_segs = 2,
                              .n_rows = 5,
                              .n_pages = 2,
                              .n_merges = 2,
                              .n_partials = 4,
                              .off_groups = offsetof(__typeof__(pl), g),
                              .off_ctas = offsetof(__typeof__(pl), c),
                              .off_segs = offsetof(__typeof__(pl), s),
                              .off_rows = offsetof(__typeof__(pl), r),
                              .off_pages = offsetof(__typeof__(pl), pages),
                              .off_merges = offsetof(__typeof__(pl), m),
                              .max_cta_rows = 3};
    pl.g[0] = (sched_plan_group_t){.m = 16, .n = 32, .cta_count = 3};
    /* CTA 0: positions [0, 20): token 0 partial slot 0 (real), token 2 partial slot 2 (limit 0
     * -> empty), token 1 direct (limit 0 -> empty) */
    pl.c[0] = (sched_plan_cta_t){
        .row_begin = 0, .row_count = 3, .seg_begin = 0, .seg_count = 1, .kv_tokens = 20};
    pl.s[0] = (sched_plan_seg_t){.kv_begin = 0, .kv_end = 20, .row_lo = 0, .row_hi = 3};
    pl.r[0] = (sched_plan_row_t){.q_tok = 0, .limit = 20, .dst = 0, .merge = 0};
    pl.r[1] = (sched_plan_row_t){.q_tok = 2, .limit = 0, .dst = 2, .merge = 1};
    pl.r[2] = (sched_plan_row_t){.q_tok = 1, .limit = 0, .dst = 1, .merge = SCHED_ROW_DIRECT};
    /* CTA 1: positions [16, 20), rows with limits at or below 16: both empty */
    pl.c[1] = (sched_plan_cta_t){
        .row_begin = 3, .row_count = 2, .seg_begin = 1, .seg_count = 1, .kv_tokens = 4};
    pl.s[1] =
        (sched_plan_seg_t){.kv_begin = 16, .kv_end = 20, .page_begin = 1, .row_lo = 0, .row_hi = 2};
    pl.r[3] = (sched_plan_row_t){.q_tok = 0, .limit = 16, .dst = 1, .merge = 0};
    pl.r[4] = (sched_plan_row_t){.q_tok = 2, .limit = 5, .dst = 3, .merge = 1};
    pl.c[2] = (sched_plan_cta_t){.row_begin = 5, .row_count = 0, .seg_begin = 2, .seg_count = 0};
    pl.pages[0] = 0;
    pl.pages[1] = 1;
    pl.m[0] = (sched_plan_merge_t){.q_tok = 0, .part_begin = 0, .part_count = 2};
    pl.m[1] = (sched_plan_merge_t){.q_tok = 2, .part_begin = 2, .part_count = 2};
    float q[3 * 4 * 64], o[3 * 4 * 64];
    for (uint32_t i = 0; i < 3 * 4 * 64; i++)
        q[i] = (float)tl_kv_value(6, i, 0, 0, 0, 0);
    memset(o, 0xff, sizeof(o));
    kern_attn_params_t p = {.scale = 0.125f, .softcap = 0};
    assert_int_equal(kern_attend(b, 0, &pl.h, q, o, &p), 0);
    for (uint32_t i = 4 * 64; i < 3 * 4 * 64; i++)
        assert_true(o[i] == 0.0f); /* fully masked: exactly zero, not NaN */
    /* token 0 equals attention over positions [0, 20) */
    for (uint32_t hd = 0; hd < 4; hd++) {
        double qd[64], K[20 * 64], V[20 * 64], ref[64], got[64];
        for (uint32_t x = 0; x < 64; x++)
            qd[x] = q[hd * 64 + x];
        for (uint32_t t = 0; t < 20; t++)
            for (uint32_t x = 0; x < 64; x++)
                K[t * 64 + x] = V[t * 64 + x] = (float)tl_kv_value(5, t, 0, 0, hd * 64 + x, 0);
        tl_ref_attend(qd, K, V, 20, 64, 0.125, 0, ref);
        for (uint32_t x = 0; x < 64; x++)
            got[x] = o[hd * 64 + x];
        assert_true(tl_rel_err(got, ref, 64) < 1e-5);
    }
    kern_backend_free(b);
}

static void test_copy_blocks(void **state)
{
    kern_config_t kc = {.model = {2, 2, 2, 64, BS, KERN_F16, KERN_F16, 0.f},
                        .n_blocks = 4,
                        .max_tokens = 1,
                        .max_partials = 4,
                        .n_threads = 1};
    kern_backend_t *b;
    assert_int_equal(kern_backend_create("cpu", &kc, &b), 0);
    uint16_t k[2 * 64], v[2 * 64];
    for (uint32_t layer = 0; layer < 2; layer++)
        for (uint32_t t = 0; t < 10; t++) { /* block 1, 10 tokens */
            for (uint32_t i = 0; i < 128; i++) {
                k[i] = kern_f32_to_f16((float)tl_kv_value(layer, t, 1, 0, i, 0));
                v[i] = kern_f32_to_f16((float)tl_kv_value(layer, t, 1, 0, i, 1));
            }
            uint32_t slot = BS + t;
            assert_int_equal(kern_append_kv(b, layer, k, v, &slot, 1), 0);
        }
    uint32_t src = 1, dst = 3, bad = 4;
    assert_int_equal(kern_copy_blocks(b, &src, &bad, 1), -EINVAL);
    assert_int_equal(kern_copy_blocks(b, &src, &dst, 1), 0);
    /* attention through block 1 and through block 3 must agree bitwise, on both layers */
    sched_config_t sc = {.max_queries = 1,
                         .max_tokens = 1,
                         .block_size = BS,
                         .q_heads = 2,
                         .kv_heads = 2,
                         .head_dim = 64,
                         .kv_elt_bytes = 2};
    for (uint32_t layer = 0; layer < 2; layer++) {
        uint16_t q[128], o1[128], o2[128];
        for (uint32_t i = 0; i < 128; i++)
            q[i] = kern_f32_to_f16((float)tl_kv_value(9, i, 0, 0, 0, 0));
        uint16_t *outs[2] = {o1, o2};
        uint32_t blocks[2] = {1, 3};
        for (int w = 0; w < 2; w++) {
            sched_t *s;
            assert_int_equal(sched_create(&sc, &s), 0);
            sched_query_t sq = {&blocks[w], 1, 10, 1, 0, 0};
            sched_forest_join(sched_forest(s), 0, &sq);
            const sched_plan_hdr_t *h;
            assert_int_equal(sched_build(s, &h), 0);
            kern_attn_params_t p = {.scale = 0.125f};
            assert_int_equal(kern_attend(b, layer, h, q, outs[w], &p), 0);
            sched_free(s);
        }
        assert_memory_equal(o1, o2, sizeof(o1));
    }
    kern_backend_free(b);
}

/* kern_append_kv stores NaN and infinity as 0 (kern.h: no pool slot holds one), for fp16, bf16
 * and fp32: attention over tokens whose K or V carried them equals float64 attention with those
 * elements 0, and is finite. */
static void test_nonfinite_kv_stored_as_zero(void **state)
{
    /* the clients' dtype and the pool's: fp8 converts instead of copying, the rule the same */
    static const kern_dtype_t dts[][2] = {{KERN_F16, KERN_F16},
                                          {KERN_BF16, KERN_BF16},
                                          {KERN_F32, KERN_F32},
                                          {KERN_F16, KERN_FP8_E4M3},
                                          {KERN_BF16, KERN_FP8_E5M2}};
    for (int di = 0; di < 5; di++) {
        const kern_dtype_t dt = dts[di][0], kvt = dts[di][1];
        const uint32_t d = 64, n = 10, esz = kern_dtype_size(dt);
        kern_config_t kc = {.model = {1, 1, 1, d, BS, dt, kvt, 0.f},
                            .n_blocks = 2,
                            .max_tokens = 1,
                            .max_partials = 4,
                            .n_threads = 1};
        kern_backend_t *b;
        assert_int_equal(kern_backend_create("cpu", &kc, &b), 0);
        double K[10 * 64], V[10 * 64];
        uint8_t k[64 * 4], v[64 * 4];
        for (uint32_t t = 0; t < n; t++) {
            for (uint32_t i = 0; i < d; i++) {
                kern_store(dt, k, i, (float)tl_kv_value(3, t, 1, 0, i, 0));
                kern_store(dt, v, i, (float)tl_kv_value(3, t, 1, 0, i, 1));
            }
            /* token 2: NaN in K; 3: +inf in V; 4: -inf in K and NaN in V */
            if (t == 2)
                kern_store(dt, k, 5, NAN);
            if (t == 3)
                kern_store(dt, v, 7, INFINITY);
            if (t == 4) {
                kern_store(dt, k, 0, -INFINITY);
                kern_store(dt, v, 63, NAN);
            }
            for (uint32_t i = 0; i < d; i++) {
                const float kf = kern_load(dt, k, i), vf = kern_load(dt, v, i);
                K[t * d + i] = isfinite(kf) ? rt(kvt, kf) : 0.0; /* kv_scale 0: 1 */
                V[t * d + i] = isfinite(vf) ? rt(kvt, vf) : 0.0;
            }
            uint32_t slot = BS + t;
            assert_int_equal(kern_append_kv(b, 0, k, v, &slot, 1), 0);
        }
        sched_config_t sc = {.max_queries = 1,
                             .max_tokens = 1,
                             .block_size = BS,
                             .q_heads = 1,
                             .kv_heads = 1,
                             .head_dim = d,
                             .kv_elt_bytes = kern_dtype_size(kvt),
                             .q_elt_bytes = esz};
        sched_t *s;
        assert_int_equal(sched_create(&sc, &s), 0);
        uint32_t block = 1;
        sched_query_t sq = {&block, 1, n, 1, 0, 0};
        assert_int_equal(sched_forest_join(sched_forest(s), 0, &sq), 0);
        const sched_plan_hdr_t *h;
        assert_int_equal(sched_build(s, &h), 0);
        uint8_t q[64 * 4], o[64 * 4];
        double qd[64], ref[64], got[64];
        for (uint32_t i = 0; i < d; i++) {
            kern_store(dt, q, i, (float)tl_kv_value(9, i, 0, 0, 0, 0));
            qd[i] = kern_load(dt, q, i);
        }
        kern_attn_params_t p = {.scale = 0.125f};
        assert_int_equal(kern_attend(b, 0, h, q, o, &p), 0);
        tl_ref_attend(qd, K, V, n, d, 0.125, 0, ref);
        for (uint32_t i = 0; i < d; i++) {
            got[i] = kern_load(dt, o, i);
            assert_true(isfinite(got[i]));
        }
        assert_true(tl_rel_err(got, ref, d) < 1e-2);
        sched_free(s);
        kern_backend_free(b);
    }
}

/* Batch invariance (sched_config_t.invariant_chunk): one probe query's output, bit for bit,
 * across 50 batches around it (tl_world_probe: 0-16 other queries sharing any prefix of it or of
 * each other, decode and extend rows, the probe anywhere in the order). With the mode on every
 * batch gives the first one's bits (and they match float64); with it off (AUTO) the same batches
 * do not all agree, so the check can fail. */
#define INV_BATCHES 50

typedef struct inv_case {
    mcase_t m;
    uint32_t chunk, probe_len, probe_new;
} inv_case_t;

/* Runs batch w under chunk (0: the mode off) and copies the probe's output rows to out. */
static void inv_run(kern_backend_t *b, const inv_case_t *ic, const tl_world_t *w, uint32_t probe,
                    uint32_t chunk, const void *q, void *o, uint8_t *out, size_t row_bytes)
{
    const mcase_t *m = &ic->m;
    sched_config_t sc = {.max_queries = w->n_q,
                         .max_tokens = w->n_tokens,
                         .block_size = BS,
                         .q_heads = m->q_heads,
                         .kv_heads = m->kv_heads,
                         .head_dim = m->d,
                         .kv_elt_bytes = esz(m->dt),
                         .split_min_kv = 256,
                         .invariant_chunk = chunk};
    sched_t *s;
    assert_int_equal(sched_create(&sc, &s), 0);
    for (uint32_t i = 0; i < w->n_q; i++) {
        const tl_query_t *x = &w->q[i];
        sched_query_t v = {x->blocks, x->n_blocks, x->kv_len, x->n_new, x->tok_off, 0};
        assert_int_equal(sched_forest_join(sched_forest(s), i, &v), 0);
    }
    const sched_plan_hdr_t *h;
    assert_int_equal(sched_build(s, &h), 0);
    assert_int_equal(h->flags, chunk ? SCHED_PLAN_INVARIANT : 0u);
    kern_attn_params_t p = {.scale = 0.09f, .softcap = m->softcap};
    assert_int_equal(kern_attend(b, 1, h, q, o, &p), 0);
    memcpy(out, (const uint8_t *)o + (size_t)w->q[probe].tok_off * row_bytes,
           ic->probe_new * row_bytes);
    sched_free(s);
}

static void test_batch_invariance(void **state)
{
    (void)state;
    static const inv_case_t cases_inv[] = {
        {{8, 2, 64, KERN_BF16, 0}, 128, 700, 1},
        {{12, 4, 128, KERN_F16, 30}, 256, 600, 3},
    };
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x1a7));
    for (size_t ci = 0; ci < sizeof(cases_inv) / sizeof(cases_inv[0]); ci++) {
        const inv_case_t *ic = &cases_inv[ci];
        const mcase_t *m = &ic->m;
        const uint32_t max_others = 16, tok_hi = 300, new_hi = 4,
                       probe_blocks = ic->probe_len / BS + 1;
        const uint32_t n_blocks = probe_blocks + max_others * ((tok_hi + BS - 1) / BS);
        const uint32_t max_tok = ic->probe_new + max_others * new_hi;
        kern_config_t kc = {.model = {.n_layers = LAYERS,
                                      .q_heads = m->q_heads,
                                      .kv_heads = m->kv_heads,
                                      .head_dim = m->d,
                                      .block_size = BS,
                                      .dtype = m->dt},
                            .n_blocks = n_blocks,
                            .max_tokens = max_tok,
                            .max_partials = 64 * max_tok,
                            .n_threads = 2};
        kern_backend_t *b;
        assert_int_equal(kern_backend_create("cpu", &kc, &b), 0);
        /* every block of the pool holds a function of its id: the same KV in every batch */
        const uint64_t seed = tl_rng_u64(&r), row = (uint64_t)m->kv_heads * m->d;
        uint8_t *kb = malloc(row * esz(m->dt)), *vb = malloc(row * esz(m->dt));
        for (uint32_t slot = 0; slot < n_blocks * BS; slot++) {
            for (uint32_t hh = 0; hh < m->kv_heads; hh++)
                for (uint32_t x = 0; x < m->d; x++) {
                    const uint64_t e = (uint64_t)hh * m->d + x;
                    kern_store(m->dt, kb, e,
                               (float)tl_kv_value(seed, slot / BS, slot % BS, hh, x, 0));
                    kern_store(m->dt, vb, e,
                               (float)tl_kv_value(seed, slot / BS, slot % BS, hh, x, 1));
                }
            assert_int_equal(kern_append_kv(b, 1, kb, vb, &slot, 1), 0);
        }
        free(kb);
        free(vb);
        const size_t row_bytes = (size_t)m->q_heads * m->d * esz(m->dt);
        uint8_t *q = malloc(max_tok * row_bytes), *o = malloc(max_tok * row_bytes);
        uint8_t *pq = malloc(ic->probe_new * row_bytes); /* the probe's Q, the same every batch */
        for (uint64_t e = 0; e < ic->probe_new * row_bytes / esz(m->dt); e++)
            kern_store(m->dt, pq, e, (float)(3.0 * tl_rng_unit(&r)));
        uint8_t *ref[2], *got = malloc(ic->probe_new * row_bytes);
        ref[0] = malloc(ic->probe_new * row_bytes);
        ref[1] = malloc(ic->probe_new * row_bytes);
        uint32_t differ[2] = {0, 0}, others = 0;
        for (uint32_t it = 0; it < INV_BATCHES; it++) {
            tl_world_t w;
            const uint32_t probe = tl_world_probe(&w, &r, BS, ic->probe_len, ic->probe_new,
                                                  max_others, tok_hi, new_hi, probe_blocks);
            others += w.n_q - 1;
            for (uint64_t e = 0; e < (uint64_t)w.n_tokens * row_bytes / esz(m->dt); e++)
                kern_store(m->dt, q, e, (float)(3.0 * tl_rng_unit(&r)));
            memcpy(q + (size_t)w.q[probe].tok_off * row_bytes, pq, ic->probe_new * row_bytes);
            for (int mode = 0; mode < 2; mode++) {
                inv_run(b, ic, &w, probe, mode ? 0 : ic->chunk, q, o, it ? got : ref[mode],
                        row_bytes);
                if (it && memcmp(got, ref[mode], ic->probe_new * row_bytes))
                    differ[mode]++;
            }
            tl_world_free(&w);
        }
        /* the invariant bits are attention's: float64 over the probe's KV */
        const uint32_t g = m->q_heads / m->kv_heads;
        double *K = malloc((size_t)ic->probe_len * m->d * sizeof(double));
        double *V = malloc((size_t)ic->probe_len * m->d * sizeof(double));
        double *qd = malloc(m->d * sizeof(double)), *ref64 = malloc(m->d * sizeof(double));
        double *gotd = malloc(m->d * sizeof(double)), worst = 0.0;
        for (uint32_t hh = 0; hh < m->kv_heads; hh++) {
            for (uint32_t t = 0; t < ic->probe_len; t++)
                for (uint32_t x = 0; x < m->d; x++) {
                    K[(uint64_t)t * m->d + x] =
                        rt(m->dt, tl_kv_value(seed, t / BS, t % BS, hh, x, 0));
                    V[(uint64_t)t * m->d + x] =
                        rt(m->dt, tl_kv_value(seed, t / BS, t % BS, hh, x, 1));
                }
            for (uint32_t k = 0; k < ic->probe_new; k++)
                for (uint32_t j = 0; j < g; j++) {
                    const uint64_t base = ((uint64_t)k * m->q_heads + hh * g + j) * m->d;
                    for (uint32_t x = 0; x < m->d; x++) {
                        qd[x] = kern_load(m->dt, pq, base + x);
                        gotd[x] = kern_load(m->dt, ref[0], base + x);
                    }
                    tl_ref_attend(qd, K, V, ic->probe_len - ic->probe_new + 1 + k, m->d, 0.09,
                                  m->softcap, ref64);
                    const double e = tl_rel_err(gotd, ref64, m->d);
                    worst = e > worst ? e : worst;
                }
        }
        printf("invariant chunk %u, %u/%u d%u: the probe's bits differ from the first batch's in "
               "%u of %u batches (mode off: %u), %u neighbours in all; vs float64 %.2e\n",
               ic->chunk, m->q_heads, m->kv_heads, m->d, differ[0], INV_BATCHES - 1, differ[1],
               others, worst);
        assert_int_equal(differ[0], 0);
        assert_true(differ[1] > 0);
        assert_true(worst < tol(m->dt));
        free(K);
        free(V);
        free(qd);
        free(ref64);
        free(gotd);
        free(q);
        free(o);
        free(pq);
        free(got);
        free(ref[0]);
        free(ref[1]);
        kern_backend_free(b);
    }
}

/* Batch-invariant plans are attention too: random forests (decode and extend rows) under chunks
 * of one window to many, against float64. */
static void test_invariant_forests_vs_fp64(void **state)
{
    (void)state;
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x1a8));
    static const uint32_t chunks[] = {64, 128, 256, 1024};
    double worst = 0.0;
    for (int round = 0; round < 8; round++) {
        const mcase_t *mc = &cases[round % (sizeof(cases) / sizeof(cases[0]))];
        rig_t g;
        memset(&g, 0, sizeof(g));
        g.inv_chunk = chunks[round % 4];
        gen_bounded(&g.w, &r, mc, round % 3 == 2, round % 2);
        rig_init(&g, &r, mc, SCHED_POLICY_AUTO, 0, 2);
        run_layer1(&g);
        const double e = check_outputs(&g);
        if (e >= tol(mc->dt))
            fail_msg("round %d (chunk %u): error %g", round, g.inv_chunk, e);
        worst = e > worst ? e : worst;
        rig_done(&g);
    }
    printf("invariant plans on 8 random forests: worst error %.2e against float64\n", worst);
}

static void test_errors(void **state)
{
    kern_config_t kc = {.model = {2, 8, 2, 128, BS, KERN_BF16, KERN_BF16, 0.f},
                        .n_blocks = 8,
                        .max_tokens = 4,
                        .max_partials = 2,
                        .n_threads = 1};
    kern_backend_t *b;
    kern_config_t bad = kc;
    bad.model.head_dim = 96;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad = kc;
    bad.model.q_heads = 34;
    bad.model.kv_heads = 2; /* group 17 */
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad = kc;
    bad.model.block_size = 32;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad = kc;
    bad.model.dtype = (kern_dtype_t)9;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    /* fp8 is the pool's only, and only under a 16-bit dtype; its factor positive and finite */
    bad = kc;
    bad.model.dtype = KERN_FP8_E4M3;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad = kc;
    bad.model.dtype = KERN_F32;
    bad.model.kv_dtype = KERN_FP8_E4M3;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad.model.dtype = KERN_BF16;
    bad.model.kv_dtype = KERN_F16; /* a 16-bit pool of another 16-bit dtype */
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad.model.kv_dtype = KERN_FP8_E5M2;
    bad.model.kv_scale = -1.0f;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad.model.kv_scale = INFINITY;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad.model.kv_scale = NAN;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -ENOTSUP);
    bad.model.kv_scale = 0.5f; /* and the same model with a good factor is served */
    assert_int_equal(kern_backend_create("cpu", &bad, &b), 0);
    kern_backend_free(b);
    assert_int_equal(kern_backend_create("tpu", &kc, &b), -ENOTSUP);
    bad = kc;
    bad.n_blocks = 0;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -EINVAL);
    bad = kc;
    bad.n_threads = KERN_MAX_THREADS + 1;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -EINVAL);
    bad = kc;
    bad.max_cta_rows = KERN_MAX_CTA_ROWS + 1;
    assert_int_equal(kern_backend_create("cpu", &bad, &b), -EINVAL);
    assert_int_equal(kern_backend_create("cpu", &kc, &b), 0);
    assert_string_equal(kern_backend_name(b), "cpu");

    uint16_t kv[2 * 128] = {0};
    uint32_t slot = 8 * BS; /* one past the pool */
    assert_int_equal(kern_append_kv(b, 0, kv, kv, &slot, 1), -EINVAL);
    slot = 0;
    assert_int_equal(kern_append_kv(b, 2, kv, kv, &slot, 1), -EINVAL);

    sched_config_t sc = {.max_queries = 2,
                         .max_tokens = 4,
                         .block_size = BS,
                         .q_heads = 8,
                         .kv_heads = 2,
                         .head_dim = 128,
                         .kv_elt_bytes = 2,
                         .policy = SCHED_POLICY_PAPER};
    sched_t *s;
    assert_int_equal(sched_create(&sc, &s), 0);
    uint32_t blocks_a[3] = {0, 1, 2}, blocks_b[3] = {0, 1, 5};
    sched_query_t qa = {blocks_a, 3, 40, 1, 0, 0}, qb = {blocks_b, 3, 40, 1, 1, 0};
    sched_forest_join(sched_forest(s), 0, &qa);
    sched_forest_join(sched_forest(s), 1, &qb);
    const sched_plan_hdr_t *h;
    assert_int_equal(sched_build(s, &h), 0);
    uint16_t q[4 * 8 * 128] = {0}, o[4 * 8 * 128];
    kern_attn_params_t p = {.scale = 0.1f};
    assert_true(h->n_partials > 2);
    assert_int_equal(kern_attend(b, 0, h, q, o, &p), -ENOSPC); /* more partials than set up */
    p.scale = 0.0f;
    assert_int_equal(kern_attend(b, 0, h, q, o, &p), -EINVAL);
    p.scale = 0.1f;
    assert_int_equal(kern_attend(b, 5, h, q, o, &p), -EINVAL);
    kern_backend_free(b);
    /* a corrupted plan is refused, not executed */
    kc.max_partials = 64;
    assert_int_equal(kern_backend_create("cpu", &kc, &b), 0);
    assert_int_equal(kern_attend(b, 0, h, q, o, &p), 0);
    uint8_t *copy = malloc(h->total_bytes);
    memcpy(copy, h, h->total_bytes);
    sched_plan_hdr_t *ch = (sched_plan_hdr_t *)copy;
    ((uint32_t *)(copy + ch->off_pages))[0] = 1000; /* page beyond the pool */
    assert_int_equal(kern_attend(b, 0, ch, q, o, &p), -EINVAL);
    memcpy(copy, h, h->total_bytes);
    ((sched_plan_row_t *)(copy + ch->off_rows))[0].q_tok = 7; /* row beyond the tokens */
    assert_int_equal(kern_attend(b, 0, ch, q, o, &p), -EINVAL);
    memcpy(copy, h, h->total_bytes);
    ch->magic = 0;
    assert_int_equal(kern_attend(b, 0, ch, q, o, &p), -EINVAL);
    memcpy(copy, h, h->total_bytes);
    ch->n_tokens = 5; /* beyond max_tokens */
    assert_int_equal(kern_attend(b, 0, ch, q, o, &p), -E2BIG);
    free(copy);
    sched_free(s);
    kern_backend_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_invariant_forests_vs_fp64),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_pool_outlives_backend),
        cmocka_unit_test(test_empty_ranges_and_masked_merge),
        cmocka_unit_test(test_copy_blocks),
        cmocka_unit_test(test_nonfinite_kv_stored_as_zero),
        cmocka_unit_test(test_threads_and_plan_copies_do_not_change_results),
        cmocka_unit_test(test_random_forests_vs_fp64),
        cmocka_unit_test(test_fp8_kv_vs_fp64),
        cmocka_unit_test(test_tree_plans_many_threads_vs_fp64),
    };
    return cmocka_run_group_tests_name("cpu backend", tests, NULL, NULL);
}
