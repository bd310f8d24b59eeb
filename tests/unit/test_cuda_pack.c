/*
 * test_cuda_pack.c — the pair kernel's KV tiles (kernels/cuda/kern_cuda_pack.c) against the plan's
 * meaning, on the host (no GPU): on random forests (every policy, GQA groups 1-16, decode and
 * extend rows, with and without the long-KV split, under a tile table with the pair kernel's
 * 128-row CTAs), every q-head row of every CTA reads through the tiles exactly the KV positions
 * the plan gives it (its segments up to its causal limit), each once and from the plan's block,
 * and only in tiles its consumer warpgroup computes (the tile's live bit, which the tile before it
 * announces in `next`); `whole` holds exactly where every chunk is a whole block of the same
 * readers; the device copy lists the CTAs of more than 64 rows first, each CTA once, its tiles
 * consecutive; a batch-invariant plan's tiles hold whole segments of one window, each segment's
 * chunks in consecutive slots in position order, a row's windows in order, and are priced as the
 * layout's longer consumer chain (check_invariant, check_priced). The masks mirror
 * kern_cuda_fwd_ws.cuh: row r reads chunk k's block rows [lo, b), b = min(hi, limit - pos), where
 * r's query token is one of the chunk's readers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kern_cuda_pack.h"
#include "kern_cuda_shapes.h"
#include "sched_plan.h"
#include "tl_rng.h"
#include "tl_world.h"

#define BS 16u

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* the (position, block) pairs row r (q-head row of CTA c) reads by the plan */
static uint32_t plan_reads(const sched_plan_hdr_t *h, const kcuda_cta_t *c, uint32_t r,
                           uint64_t *out)
{
    const sched_plan_seg_t *sg = sched_plan_segs(h) + c->seg_begin;
    const sched_plan_row_t *row = sched_plan_rows(h) + c->row_begin + r / h->group;
    const uint32_t *pages = sched_plan_pages(h);
    uint32_t n = 0;
    for (uint32_t k = 0; k < c->seg_count; k++) {
        if (r / h->group < sg[k].row_lo || r / h->group >= sg[k].row_hi)
            continue;
        const uint32_t end = sg[k].kv_end < row->limit ? sg[k].kv_end : row->limit;
        for (uint32_t p = sg[k].kv_begin; p < end; p++)
            out[n++] = (uint64_t)p << 32 | pages[sg[k].page_begin + p / BS - sg[k].kv_begin / BS];
    }
    return n;
}

/* the pairs row r reads through the tiles, as the kernel masks them; fails where a row would read
 * a tile its consumer skips */
static uint32_t tile_reads(const sched_plan_hdr_t *h, const kcuda_cta_t *c, const kcuda_tile_t *t,
                           uint32_t r, uint64_t *out)
{
    const sched_plan_row_t *row = sched_plan_rows(h) + c->row_begin + r / h->group;
    const int small = c->row_count * h->group <= 64;
    const uint32_t bit = small ? 0 : r / 64, qt = r / h->group;
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_tiles; i++)
        for (int k = 0; k < 4; k++) {
            const uint32_t rg = t[i].rng[k], lo = rg & 0xffu, hi = (rg >> 8) & 0xffu;
            const uint32_t rlo = (rg >> 16) & 0xffu, rhi = rg >> 24, pos = t[i].pos[k];
            if (qt < rlo || qt >= rhi || row->limit <= pos + lo || hi <= lo)
                continue;
            assert_true((t[i].live >> bit) & 1u);
            assert_int_not_equal(t[i].blk[k], KCUDA_NO_BLOCK);
            const uint32_t b = hi < row->limit - pos ? hi : row->limit - pos;
            for (uint32_t p = lo; p < b; p++)
                out[n++] = (uint64_t)(pos + p) << 32 | t[i].blk[k];
        }
    return n;
}

/* What the scheduler's time model was told while it built a plan: every item it priced through
 * the backend's rule, by its spans (the wrapper below records them). */
#define PRICED_MAX (1u << 16)
static struct priced {
    uint64_t key;
    uint64_t tiles;
    uint32_t units, kind;
} priced[PRICED_MAX];
static uint32_t n_priced;

/* a hash of an item's tile rows and spans (as sched_item_fn hands them) */
static uint64_t spans_key(uint32_t m, uint32_t n, const void *spans, size_t stride)
{
    uint64_t k = 0xcbf29ce484222325ull ^ m ^ (uint64_t)n << 32;
    for (uint32_t i = 0; i < n; i++) {
        sched_span_t sp;
        memcpy(&sp, (const char *)spans + i * stride, sizeof(sp));
        const uint32_t w[4] = {sp.kv_begin, sp.kv_end, sp.row_lo, sp.row_hi};
        for (int j = 0; j < 4; j++)
            k = (k ^ w[j]) * 0x100000001b3ull;
    }
    return k;
}

/* the cuda rule, recorded */
static void recording_item(uint32_t m, uint32_t group, uint32_t tile_n, uint32_t flags,
                           const void *spans, size_t stride, uint32_t n, sched_item_t *ret)
{
    kcuda_pack_item(m, group, tile_n, flags, spans, stride, n, ret);
    if (n_priced < PRICED_MAX)
        priced[n_priced++] =
            (struct priced){spans_key(m, n, spans, stride), ret->tiles, ret->units, ret->kind};
}

/* The model priced CTA c (m-row tile) as the packer lays it out: the same tiles, where it runs on
 * fwd_pair (kind 1), and two slots above 64 rows. Items of at most KCUDA_WS_MIN_ROWS rows are
 * priced as the 4-warp kernels' (kind 0), which is what they run on in a plan of no larger CTA. */
static void check_priced(const sched_plan_hdr_t *h, const sched_plan_cta_t *pc,
                         const kcuda_cta_t *c, const kcuda_tile_t *t)
{
    const sched_plan_seg_t *sg = sched_plan_segs(h) + c->seg_begin;
    const uint32_t tm = sched_plan_groups(h)[pc->group].m;
    sched_span_t *sp = malloc((c->seg_count ? c->seg_count : 1) * sizeof(*sp));
    for (uint32_t k = 0; k < c->seg_count; k++)
        sp[k] = (sched_span_t){sg[k].kv_begin, sg[k].kv_end, sg[k].row_lo, sg[k].row_hi};
    const uint64_t key = spans_key(tm, c->seg_count, sp, sizeof(*sp));
    free(sp);
    uint32_t i = 0;
    while (i < n_priced && priced[i].key != key)
        i++;
    assert_true(i < n_priced);                              /* the model priced this very CTA */
    const int inv = (h->flags & SCHED_PLAN_INVARIANT) != 0; /* every CTA on fwd_pair */
    assert_int_equal(priced[i].kind, tm > KCUDA_WS_MIN_ROWS || inv);
    assert_int_equal(priced[i].units, tm > 64 ? 2 : 1);
    if (priced[i].kind && !inv) {
        assert_int_equal(priced[i].tiles, c->n_tiles);
    } else if (inv) {
        /* the longer consumer chain: per window (tiles in order) those both consumers read, the
         * larger of their own and a quarter of the smaller, by the tiles' live bits */
        uint64_t quarters = 0;
        for (uint32_t k = 0; k < c->n_tiles;) {
            uint64_t n[4] = {0, 0, 0, 0};
            const uint32_t win = t[k].pos[0] / 64;
            for (; k < c->n_tiles && t[k].pos[0] / 64 == win; k++)
                n[t[k].live]++;
            const uint64_t hi = n[1] > n[2] ? n[1] : n[2], lo = n[1] + n[2] - hi;
            quarters += 4 * (n[3] + hi) + lo;
        }
        assert_int_equal(priced[i].tiles, (quarters + 3) / 4);
    }
}

/* A batch-invariant plan's tiles (SCHED_PLAN_INVARIANT): each tile's blocks of one window; the
 * blocks of one readers' range in consecutive slots from the window's first block on, readers'
 * ranges disjoint; every query token reads at most one tile per window, its windows in
 * increasing order (what makes a row's bits its own); and segments of a window whose blocks fit
 * share a tile (returns how many tiles held more than one range). */
static uint32_t check_invariant(const sched_plan_hdr_t *h, const kcuda_cta_t *c,
                                const kcuda_tile_t *t)
{
    (void)h;
    assert_true(c->n_tiles <= c->seg_count);
    uint32_t last[KCUDA_MAX_M], shared = 0;
    memset(last, 0xff, sizeof(last));
    for (uint32_t k = 0; k < c->n_tiles; k++) {
        uint32_t win = UINT32_MAX, ranges = 0, first = 0;
        for (int e = 0; e < 4; e++) {
            if (t[k].blk[e] == KCUDA_NO_BLOCK)
                continue;
            assert_true(win == UINT32_MAX || win == t[k].pos[e] / 64);
            win = t[k].pos[e] / 64;
            const uint32_t readers = t[k].rng[e] >> 16;
            if (e == 0 || readers != t[k].rng[e - 1] >> 16 || t[k].blk[e - 1] == KCUDA_NO_BLOCK) {
                ranges++;
                first = (uint32_t)e;
                for (uint32_t q = readers & 0xffu; q < readers >> 8; q++) {
                    /* one tile a window, in order; ranges of a tile disjoint */
                    assert_true(last[q] == UINT32_MAX || last[q] < win);
                    last[q] = win;
                }
            }
            assert_int_equal(t[k].pos[e], win * 64 + (e - first) * BS); /* in position order */
        }
        assert_int_not_equal(win, UINT32_MAX);
        shared += ranges > 1;
    }
    return shared;
}

/* Checks a plan's tiles; returns the invariant plan's tiles that hold more than one segment. */
static uint32_t check_tiles(const sched_plan_hdr_t *h)
{
    uint32_t shared = 0;
    kcuda_cta_t *dc = malloc((h->n_ctas ? h->n_ctas : 1) * sizeof(kcuda_cta_t));
    uint64_t n_tiles = 0;
    const uint32_t n_big = kcuda_pack_prepare(h, dc, &n_tiles);
    kcuda_tile_t *tiles = malloc((n_tiles ? n_tiles : 1) * sizeof(kcuda_tile_t));
    memset(tiles, 0xa5, (n_tiles ? n_tiles : 1) * sizeof(kcuda_tile_t)); /* no stale zeros */
    kcuda_pack_fill(h, dc, tiles);
    const sched_plan_cta_t *src = sched_plan_ctas(h);
    uint8_t *seen = calloc(h->n_rows + 1, 1);
    uint64_t at = 0, max_kv = 0;
    for (uint32_t i = 0; i < h->n_ctas; i++)
        max_kv += src[i].kv_tokens;
    uint64_t *want = malloc((max_kv + 1) * sizeof(uint64_t));
    uint64_t *got = malloc((max_kv + 1) * sizeof(uint64_t));
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        const kcuda_cta_t *c = &dc[i];
        /* a permutation of the plan's CTAs (each names its own rows), big ones first */
        assert_int_equal(seen[c->row_begin]++, 0);
        assert_int_equal(c->row_count * h->group > 64, i < n_big);
        uint32_t j = 0;
        while (src[j].row_begin != c->row_begin)
            j++;
        assert_int_equal(src[j].seg_begin, c->seg_begin);
        assert_int_equal(src[j].seg_count, c->seg_count);
        assert_int_equal(src[j].kv_tokens, c->kv_tokens);
        check_priced(h, &src[j], c, tiles + c->first_tile);
        assert_int_equal(c->first_tile, at);
        at += c->n_tiles;
        const kcuda_tile_t *t = tiles + c->first_tile;
        for (uint32_t k = 0; k < c->n_tiles; k++) {
            assert_int_equal(t[k].next, k + 1 < c->n_tiles ? t[k + 1].live : 0);
            int whole = 1;
            uint32_t end = 0;
            for (int e = 0; e < 4; e++) {
                whole = whole && t[k].blk[e] != KCUDA_NO_BLOCK &&
                        (t[k].rng[e] & 0xffffu) == BS << 8 &&
                        t[k].rng[e] >> 16 == t[k].rng[0] >> 16;
                if (t[k].pos[e] + BS > end)
                    end = t[k].pos[e] + BS;
                if (t[k].blk[e] == KCUDA_NO_BLOCK)
                    assert_int_equal(t[k].rng[e], 0);
            }
            assert_int_equal(t[k].whole, whole ? end : 0);
            /* live bit c: exactly where rows 64c.. are readers of a chunk; in a big CTA a
             * tile's chunks are all read by both consumers' rows, or all by one's only */
            uint32_t live = 0, kinds = 0;
            for (int e = 0; e < 4; e++) {
                const uint32_t rg = t[k].rng[e];
                if (((rg >> 8) & 0xffu) <= (rg & 0xffu))
                    continue;
                uint32_t b = 0;
                for (uint32_t q = (rg >> 16) & 0xffu; q < rg >> 24; q++)
                    for (uint32_t x = 0; x < h->group; x++)
                        b |= 1u << ((q * h->group + x) / 64);
                live |= b;
                kinds |= 1u << b;
            }
            assert_int_equal(t[k].live, live);
            assert_true(live != 0); /* no tile is packed that nobody reads */
            if (i < n_big)
                assert_true(kinds == 2 || kinds == 4 || kinds == 8);
        }
        if (h->flags & SCHED_PLAN_INVARIANT)
            shared += check_invariant(h, c, t);
        for (uint32_t r = 0; r < c->row_count * h->group; r++) {
            const uint32_t nw = plan_reads(h, c, r, want), ng = tile_reads(h, c, t, r, got);
            assert_int_equal(nw, ng);
            qsort(want, nw, sizeof(uint64_t), cmp_u64);
            qsort(got, ng, sizeof(uint64_t), cmp_u64);
            assert_memory_equal(want, got, nw * sizeof(uint64_t));
            for (uint32_t k = 1; k < ng; k++)
                assert_true(got[k] >> 32 != got[k - 1] >> 32); /* each position once */
        }
    }
    assert_int_equal(at, n_tiles);
    free(want);
    free(got);
    free(seen);
    free(tiles);
    free(dc);
    return shared;
}

static void test_random_plans(void **state)
{
    (void)state;
    static const uint32_t groups[][2] = {{8, 8}, {16, 8}, {32, 8}, {64, 8}, {64, 4}, {48, 16}};
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x7a1e));
    uint32_t inv_shared = 0;
    for (int round = 0; round < 8; round++) {
        tl_world_t w;
        tl_world_params_t p = {.bs = BS,
                               .trees = tl_rng_range(&r, 1, 3),
                               .depth_lo = 1,
                               .depth_hi = 5,
                               .fanout_lo = 1,
                               .fanout_hi = tl_rng_range(&r, 1, 64),
                               .level_tok_lo = 1,
                               .level_tok_hi = tl_rng_range(&r, 16, 600),
                               .leaf_tok_lo = 1,
                               .leaf_tok_hi = tl_rng_range(&r, 1, 300),
                               .new_lo = 1,
                               .new_hi = round % 3 == 0 ? 40 : 1,
                               .max_queries = 160,
                               .spare_blocks = 4};
        if (round % 2) { /* the paper's trees: a shared root, fan-out, short private leaves */
            p.trees = 1;
            p.depth_hi = 3;
            p.fanout_lo = 4;
            p.fanout_hi = 16;
            p.level_tok_lo = 16;
            p.level_tok_hi = 512;
            p.leaf_tok_lo = 1;
            p.leaf_tok_hi = 64;
            p.max_queries = 256;
        }
        tl_world_gen(&w, &r, &p);
        const uint32_t *g = groups[round % 6];
        /* the cuda backend's table on an H100 with the pair kernel (kern_cuda.cu) */
        sched_tiles_t tt = {.n_m = 4,
                            .m = {16, 32, 64, 128},
                            .n_n = 1,
                            .n = {64},
                            .n_upto = {UINT32_MAX},
                            .item = recording_item};
        tt.cost = (sched_cost_t){3066.0f, 381.0f, 3.41f, 132, 1.80f, 5.43f, 0};
        /* every policy, then TREE with 128-row CTAs only (leaves of both consumers' rows), then
         * batch-invariant plans (split: chunks of 256 tokens, else 1024) */
        for (int pol = 0; pol <= SCHED_POLICY_TREE + 2; pol++)
            for (int split = 0; split < 2; split++) {
                sched_tiles_t wide = tt;
                wide.n_m = 1;
                wide.m[0] = 128;
                sched_config_t sc = {
                    .max_queries = w.n_q,
                    .max_tokens = w.n_tokens,
                    .block_size = BS,
                    .q_heads = g[0],
                    .kv_heads = g[1],
                    .head_dim = 128,
                    .kv_elt_bytes = 2,
                    .policy = (sched_policy_t)(pol > SCHED_POLICY_TREE ? SCHED_POLICY_TREE : pol),
                    .split_min_kv = split ? 64 : 0,
                    .tiles = pol == SCHED_POLICY_TREE + 1 ? &wide : &tt,
                    .invariant_chunk = pol == SCHED_POLICY_TREE + 2 ? (split ? 256 : 1024) : 0,
                    /* invariant: the model's pick, then each cut rule forced */
                    .invariant_cut = (uint32_t)(2 * round + split) % (SCHED_INVARIANT_CUTS + 1)};
                sched_t *s;
                assert_int_equal(sched_create(&sc, &s), 0);
                for (uint32_t i = 0; i < w.n_q; i++) {
                    const tl_query_t *q = &w.q[i];
                    sched_query_t v = {q->blocks, q->n_blocks, q->kv_len, q->n_new, q->tok_off, 0};
                    assert_int_equal(sched_forest_join(sched_forest(s), i, &v), 0);
                }
                const sched_plan_hdr_t *h;
                n_priced = 0;
                assert_int_equal(sched_build(s, &h), 0);
                inv_shared += check_tiles(h);
                sched_free(s);
            }
        tl_world_free(&w);
    }
    assert_true(inv_shared > 0); /* invariant segments of a window did share tiles */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_plans),
    };
    return cmocka_run_group_tests_name("cuda_pack", tests, NULL, NULL);
}
