/*
 * kern_cuda_pack.c — a plan lowered for the cuda backend (kern_cuda_pack.h): its CTAs as the
 * device plan's records, the pair kernel's KV tiles, and the item rule the scheduler prices them
 * with. Linear in the plan's chunks; writes only the caller's buffers.
 */
#include "kern_cuda_pack.h"

#include <string.h>

#include "kern.h"
#include "kern_cuda_shapes.h"

_Static_assert(KCUDA_TILE_N == 4 * KERN_BLOCK_SIZE, "a tile is four blocks");
_Static_assert(KCUDA_MAX_M < 256, "a CTA's rows fit a chunk's 8-bit row range");
_Static_assert(sizeof(kcuda_tile_t) == 64, "a tile's record is four 16-byte loads");

_Static_assert(sizeof(kcuda_cta_t) == sizeof(sched_plan_cta_t), "the device plan's CTAs sit where "
                                                                "the plan's are");

/* blocks of a KV range: its chunks (none for an empty one) */
static uint32_t span_chunks(uint32_t kv_begin, uint32_t kv_end)
{
    return kv_end > kv_begin ? (kv_end - 1) / KERN_BLOCK_SIZE - kv_begin / KERN_BLOCK_SIZE + 1 : 0;
}

/* the class of a range's chunks, by its readers [row_lo, row_hi): 0 read by both consumers' rows
 * (or the CTA is small: each consumer reads all of them, for its own KV head), 1 by consumer 0's
 * only (q-head rows 0..63), 2 by consumer 1's only */
static int span_class(uint32_t row_lo, uint32_t row_hi, int small, uint32_t group)
{
    if (small)
        return 0;
    if (row_hi * group <= KCUDA_SMALL_M)
        return 1;
    return row_lo * group >= KCUDA_SMALL_M ? 2 : 0;
}

/* tiles of a CTA whose classes hold n[] chunks: each class four chunks to a tile */
static uint64_t class_tiles(const uint64_t n[3])
{
    return (n[0] + 3) / 4 + (n[1] + 3) / 4 + (n[2] + 3) / 4;
}

static int rows_small(uint32_t rows)
{
    return rows <= KCUDA_SMALL_M;
}

/* A batch-invariant plan's CTA (SCHED_PLAN_INVARIANT): each segment is one window's blocks
 * [0, nb), nb <= 4 (sched_plan_fmt.h). Window by window, each consumer class's segments are
 * packed in order into tiles, a segment's blocks in consecutive slots in position order, never
 * across two tiles. A row then reads its window as one tile in which its blocks stand in position
 * order; what else the tile holds (other rows' blocks, empty slots) adds exact zeros to its
 * maximum, sums and products, so its bits do not depend on it. */
static int plan_invariant(uint32_t flags)
{
    return (flags & SCHED_PLAN_INVARIANT) != 0;
}

/* One window's packing so far: per class, its tiles and the last one's slots in use. */
typedef struct inv_pack {
    uint32_t tiles[3], used[3];
} inv_pack_t;

/* Places a segment of nb blocks of class cl: its tile (counted within the class) and first slot. */
static void inv_place(inv_pack_t *p, int cl, uint32_t nb, uint32_t *tile, uint32_t *slot)
{
    if (!p->tiles[cl] || p->used[cl] + nb > 4) {
        p->tiles[cl]++;
        p->used[cl] = 0;
    }
    *tile = p->tiles[cl] - 1;
    *slot = p->used[cl];
    p->used[cl] += nb;
}

static uint32_t inv_window_tiles(const inv_pack_t *p)
{
    return p->tiles[0] + p->tiles[1] + p->tiles[2];
}

/* A window's tile steps on the longer consumer's chain, in quarters: the tiles both consumers
 * read, the larger of the two consumers' own, and a quarter of the smaller (the two consumers
 * walk their own tiles side by side; the quarter is the producer's share of loading both, fitted
 * on the PAT trees' invariant plans with every cut rule timed, H200:
 * tests/bench/log/2026-11-29-batch-invariant.md). */
static uint64_t inv_window_chain4(const inv_pack_t *p)
{
    const uint32_t hi = p->tiles[1] > p->tiles[2] ? p->tiles[1] : p->tiles[2];
    const uint32_t lo = p->tiles[1] + p->tiles[2] - hi;
    return 4 * ((uint64_t)p->tiles[0] + hi) + lo;
}

/* Counting an invariant CTA's tiles: the windows before the current one (tiles, and their chain
 * in quarters) and its packing. */
typedef struct inv_count {
    uint64_t tiles, chain4;
    uint32_t win;
    inv_pack_t p;
} inv_count_t;

/* Adds the CTA's next segment [kb, ke) read by its rows [rl, rh). */
static void inv_count_add(inv_count_t *c, uint32_t kb, uint32_t ke, uint32_t rl, uint32_t rh,
                          int small, uint32_t group)
{
    if (kb / KCUDA_TILE_N != c->win) {
        c->tiles += inv_window_tiles(&c->p);
        c->chain4 += inv_window_chain4(&c->p);
        c->p = (inv_pack_t){{0}, {0}};
        c->win = kb / KCUDA_TILE_N;
    }
    uint32_t x, e;
    inv_place(&c->p, span_class(rl, rh, small, group), span_chunks(kb, ke), &x, &e);
}

static uint64_t inv_count_end(const inv_count_t *c)
{
    return c->tiles + inv_window_tiles(&c->p);
}

/* the tile steps of the counted CTA's longer chain, rounded up */
static uint64_t inv_count_chain(const inv_count_t *c)
{
    return (c->chain4 + inv_window_chain4(&c->p) + 3) / 4;
}

void kcuda_pack_item(uint32_t m, uint32_t group, uint32_t tile_n, uint32_t flags, const void *spans,
                     size_t stride, uint32_t n, sched_item_t *ret)
{
    ret->units = m > KCUDA_SMALL_M ? 2 : 1;
    ret->kind = m > KCUDA_WS_MIN_ROWS || plan_invariant(flags);
    if (plan_invariant(flags)) {
        inv_count_t ic = {.win = UINT32_MAX};
        for (uint32_t i = 0; i < n; i++) {
            sched_span_t sp;
            memcpy(&sp, (const char *)spans + i * stride, sizeof(sp));
            inv_count_add(&ic, sp.kv_begin, sp.kv_end, sp.row_lo, sp.row_hi, rows_small(m), group);
        }
        ret->tiles = inv_count_chain(&ic);
        return;
    }
    if (!ret->kind) { /* a 4-warp kernel's item: each segment its own tiles */
        ret->tiles = sched_span_tiles(spans, stride, n, tile_n);
        return;
    }
    uint64_t cls[3] = {0, 0, 0};
    for (uint32_t i = 0; i < n; i++) {
        sched_span_t sp;
        memcpy(&sp, (const char *)spans + i * stride, sizeof(sp));
        cls[span_class(sp.row_lo, sp.row_hi, rows_small(m), group)] +=
            span_chunks(sp.kv_begin, sp.kv_end);
    }
    ret->tiles = class_tiles(cls);
}

/* chunks of a CTA per class */
static void class_chunks(const sched_plan_hdr_t *h, const sched_plan_seg_t *sg, uint32_t n,
                         int small, uint64_t cls[3])
{
    cls[0] = cls[1] = cls[2] = 0;
    for (uint32_t k = 0; k < n; k++)
        cls[span_class(sg[k].row_lo, sg[k].row_hi, small, h->group)] +=
            span_chunks(sg[k].kv_begin, sg[k].kv_end);
}

uint32_t kcuda_pack_prepare(const sched_plan_hdr_t *h, kcuda_cta_t *out, uint64_t *n_tiles)
{
    const sched_plan_cta_t *ct = sched_plan_ctas(h);
    uint32_t n_big = 0, at = 0;
    uint64_t tiles = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < h->n_ctas; i++) {
            const int small = rows_small(ct[i].row_count * h->group);
            if (small != (pass == 1))
                continue;
            n_big += pass == 0;
            kcuda_cta_t *d = &out[at++];
            d->row_begin = ct[i].row_begin;
            d->row_count = ct[i].row_count;
            d->seg_begin = ct[i].seg_begin;
            d->seg_count = ct[i].seg_count;
            d->kv_tokens = ct[i].kv_tokens;
            d->pad = 0;
            uint64_t t;
            if (!plan_invariant(h->flags)) {
                uint64_t n[3];
                class_chunks(h, sched_plan_segs(h) + d->seg_begin, d->seg_count, small, n);
                t = class_tiles(n);
            } else {
                const sched_plan_seg_t *sg = sched_plan_segs(h) + d->seg_begin;
                inv_count_t ic = {.win = UINT32_MAX};
                for (uint32_t k = 0; k < d->seg_count; k++)
                    inv_count_add(&ic, sg[k].kv_begin, sg[k].kv_end, sg[k].row_lo, sg[k].row_hi,
                                  small, h->group);
                t = inv_count_end(&ic);
            }
            d->n_tiles = (uint32_t)(t > UINT32_MAX ? UINT32_MAX : t);
            d->first_tile = (uint32_t)(tiles > UINT32_MAX ? UINT32_MAX : tiles);
            tiles += t;
        }
    *n_tiles = tiles;
    return n_big;
}

/* Places chunk q of segment g (its first block p0) at slot e of tile t. */
static void tile_chunk(kcuda_tile_t *t, int e, const sched_plan_seg_t *g, const uint32_t *pages,
                       uint32_t p0, uint32_t q)
{
    const uint32_t bs = KERN_BLOCK_SIZE, pos = (p0 + q) * bs;
    const uint32_t lo = (g->kv_begin > pos ? g->kv_begin : pos) - pos;
    const uint32_t hi = (g->kv_end < pos + bs ? g->kv_end : pos + bs) - pos;
    t->blk[e] = pages[g->page_begin + q];
    t->pos[e] = pos;
    t->rng[e] = lo | hi << 8 | (uint32_t)g->row_lo << 16 | (uint32_t)g->row_hi << 24;
}

/* Where tile x of class cl goes among a run of tiles holding tb of class 0 first, then n1 of
 * class 1 and n2 of class 2 alternating (class 1 first): class 1's tile x has x of its own and
 * min(x, n2) of class 2's before it, class 2's tile x has min(x + 1, n1) of class 1's and x of its
 * own. */
static uint64_t class_tile_at(int cl, uint64_t x, uint64_t tb, uint64_t n1, uint64_t n2)
{
    return cl == 0 ? x : cl == 1 ? tb + x + (x < n2 ? x : n2) : tb + (x + 1 < n1 ? x + 1 : n1) + x;
}

/* An invariant CTA's tiles (see plan_invariant), window by window: in each those read by both
 * consumers first, then the two consumers' own alternating, as the classes are elsewhere. */
static void fill_invariant(const sched_plan_hdr_t *h, const kcuda_cta_t *c, kcuda_tile_t *t)
{
    const sched_plan_seg_t *src = sched_plan_segs(h) + c->seg_begin;
    const uint32_t *pages = sched_plan_pages(h), g = h->group;
    const int small = rows_small(c->row_count * g);
    uint32_t at = 0;
    for (uint32_t k = 0, end; k < c->seg_count; k = end) {
        for (end = k + 1; end < c->seg_count &&
                          src[end].kv_begin / KCUDA_TILE_N == src[k].kv_begin / KCUDA_TILE_N;
             end++)
            ;
        inv_pack_t n = {{0}, {0}}, p = {{0}, {0}};
        uint32_t x, e;
        for (uint32_t j = k; j < end; j++)
            inv_place(&n, span_class(src[j].row_lo, src[j].row_hi, small, g),
                      span_chunks(src[j].kv_begin, src[j].kv_end), &x, &e);
        const uint32_t tb = n.tiles[0], t1 = n.tiles[1], t2 = n.tiles[2];
        for (uint32_t j = k; j < end; j++) {
            const sched_plan_seg_t *sg = &src[j];
            const int cl = span_class(sg->row_lo, sg->row_hi, small, g);
            const uint32_t nb = span_chunks(sg->kv_begin, sg->kv_end);
            inv_place(&p, cl, nb, &x, &e);
            const uint32_t ti = (uint32_t)class_tile_at(cl, x, tb, t1, t2);
            for (uint32_t q = 0; q < nb; q++)
                tile_chunk(&t[at + ti], (int)(e + q), sg, pages, sg->kv_begin / KERN_BLOCK_SIZE, q);
        }
        at += inv_window_tiles(&n);
    }
}

/* A CTA's tiles elsewhere: each class's chunks four to a tile, class 0's tiles first, then
 * classes 1 and 2 alternating. */
static void fill_classes(const sched_plan_hdr_t *h, const kcuda_cta_t *c, kcuda_tile_t *t)
{
    const sched_plan_seg_t *src = sched_plan_segs(h);
    const uint32_t *pages = sched_plan_pages(h);
    const uint32_t group = h->group, bs = KERN_BLOCK_SIZE;
    const int small = rows_small(c->row_count * group);
    uint64_t n[3];
    class_chunks(h, src + c->seg_begin, c->seg_count, small, n);
    const uint64_t tb = (n[0] + 3) / 4, t0 = (n[1] + 3) / 4, t1 = (n[2] + 3) / 4;
    uint64_t j[3] = {0, 0, 0};
    for (uint32_t k = 0; k < c->seg_count; k++) {
        const sched_plan_seg_t *g = &src[c->seg_begin + k];
        const int cl = span_class(g->row_lo, g->row_hi, small, group);
        const uint32_t p0 = g->kv_begin / bs, nc = span_chunks(g->kv_begin, g->kv_end);
        for (uint32_t q = 0; q < nc; q++, j[cl]++) {
            tile_chunk(&t[class_tile_at(cl, j[cl] / 4, tb, t0, t1)], (int)(j[cl] % 4), g, pages, p0,
                       q);
        }
    }
}

void kcuda_pack_fill(const sched_plan_hdr_t *h, const kcuda_cta_t *cd, kcuda_tile_t *out)
{
    const uint32_t group = h->group, bs = KERN_BLOCK_SIZE;
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        const kcuda_cta_t *c = &cd[i];
        kcuda_tile_t *t = out + c->first_tile;
        for (uint32_t k = 0; k < c->n_tiles; k++) {
            memset(&t[k], 0, sizeof(t[k]));
            for (int e = 0; e < 4; e++)
                t[k].blk[e] = KCUDA_NO_BLOCK;
        }
        if (plan_invariant(h->flags))
            fill_invariant(h, c, t);
        else
            fill_classes(h, c, t);
        for (uint32_t k = 0; k < c->n_tiles; k++) {
            int whole = 1;
            for (int e = 0; e < 4; e++) {
                const uint32_t rg = t[k].rng[e], lo = rg & 0xffu, hi = (rg >> 8) & 0xffu;
                const uint32_t rlo = (rg >> 16) & 0xffu, rhi = rg >> 24;
                whole = whole && lo == 0 && hi == bs && rg >> 16 == t[k].rng[0] >> 16;
                if (hi <= lo)
                    continue;
                for (uint32_t half = 0; half < 2; half++)
                    if (rlo * group < KCUDA_SMALL_M * (half + 1) &&
                        rhi * group > KCUDA_SMALL_M * half)
                        t[k].live |= 1u << half;
                if (t[k].pos[e] + bs > t[k].whole)
                    t[k].whole = t[k].pos[e] + bs;
            }
            if (!whole)
                t[k].whole = 0;
            if (k)
                t[k - 1].next = t[k].live;
        }
    }
}
