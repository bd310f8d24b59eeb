/*
 * kern_cuda_pack.c — the pair kernel's KV tiles from a plan (kern_cuda_pack.h). Linear in the
 * plan's chunks; writes only the caller's buffers.
 */
#include "kern_cuda_pack.h"

#include <string.h>

#include "kern.h"
#include "kern_cuda_shapes.h"

_Static_assert(KCUDA_TILE_N == 4 * KERN_BLOCK_SIZE, "a tile is four blocks");
_Static_assert(KCUDA_MAX_M < 256, "a CTA's rows fit a chunk's 8-bit row range");
_Static_assert(sizeof(kcuda_tile_t) == 64, "a tile's record is four 16-byte loads");

/* blocks of a segment: its chunks (none for an empty one) */
static uint32_t seg_chunks(const sched_plan_seg_t *g)
{
    return g->kv_end > g->kv_begin
               ? (g->kv_end - 1) / KERN_BLOCK_SIZE - g->kv_begin / KERN_BLOCK_SIZE + 1
               : 0;
}

/* the class of a segment's chunks: 0 read by both consumers' rows (or the CTA is small: each
 * consumer reads all of them, for its own KV head), 1 by consumer 0's only (q-head rows 0..63),
 * 2 by consumer 1's only */
static int seg_class(const sched_plan_seg_t *g, int small, uint32_t group)
{
    if (small)
        return 0;
    if (g->row_hi * group <= KCUDA_SMALL_M)
        return 1;
    return g->row_lo * group >= KCUDA_SMALL_M ? 2 : 0;
}

static int cta_small(const sched_plan_cta_t *c, uint32_t group)
{
    return c->row_count * group <= KCUDA_SMALL_M;
}

/* chunks of a CTA per class */
static void class_chunks(const sched_plan_hdr_t *h, const sched_plan_cta_t *c, uint64_t n[3])
{
    const sched_plan_seg_t *sg = sched_plan_segs(h) + c->seg_begin;
    n[0] = n[1] = n[2] = 0;
    for (uint32_t k = 0; k < c->seg_count; k++)
        n[seg_class(&sg[k], cta_small(c, h->group), h->group)] += seg_chunks(&sg[k]);
}

uint32_t kcuda_pack_prepare(const sched_plan_hdr_t *h, sched_plan_hdr_t *dst, uint64_t *n_tiles)
{
    const sched_plan_cta_t *ct = sched_plan_ctas(h);
    sched_plan_cta_t *cout = (sched_plan_cta_t *)((uint8_t *)dst + h->off_ctas);
    uint32_t n_big = 0, at = 0;
    uint64_t tiles = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < h->n_ctas; i++) {
            if (cta_small(&ct[i], h->group) != (pass == 1))
                continue;
            n_big += pass == 0;
            sched_plan_cta_t *d = &cout[at++];
            *d = ct[i];
            uint64_t n[3];
            class_chunks(h, d, n);
            const uint64_t t = (n[0] + 3) / 4 + (n[1] + 3) / 4 + (n[2] + 3) / 4;
            d->reserved = (uint32_t)(t > UINT32_MAX ? UINT32_MAX : t);
            d->pack = (uint32_t)(tiles > UINT32_MAX ? UINT32_MAX : tiles);
            tiles += t;
        }
    *n_tiles = tiles;
    return n_big;
}

void kcuda_pack_fill(const sched_plan_hdr_t *h, const sched_plan_hdr_t *dst, kcuda_tile_t *out)
{
    const sched_plan_cta_t *cd = sched_plan_ctas(dst);
    const sched_plan_seg_t *src = sched_plan_segs(h);
    const uint32_t *pages = sched_plan_pages(h);
    const uint32_t group = h->group, bs = KERN_BLOCK_SIZE;
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        const sched_plan_cta_t *c = &cd[i];
        const int small = cta_small(c, group);
        kcuda_tile_t *t = out + c->pack;
        for (uint32_t k = 0; k < c->reserved; k++) {
            memset(&t[k], 0, sizeof(t[k]));
            for (int e = 0; e < 4; e++)
                t[k].blk[e] = KCUDA_NO_BLOCK;
        }
        uint64_t n[3];
        class_chunks(h, c, n);
        const uint64_t tb = (n[0] + 3) / 4, t0 = (n[1] + 3) / 4, t1 = (n[2] + 3) / 4;
        uint64_t j[3] = {0, 0, 0};
        for (uint32_t k = 0; k < c->seg_count; k++) {
            const sched_plan_seg_t *g = &src[c->seg_begin + k];
            const int cl = seg_class(g, small, group);
            const uint32_t p0 = g->kv_begin / bs, nc = seg_chunks(g);
            for (uint32_t q = 0; q < nc; q++, j[cl]++) {
                /* class 1's tile x has x of its own and min(x, t1) of class 2's before it, class
                 * 2's tile x has min(x + 1, t0) of class 1's and x of its own */
                const uint64_t x = j[cl] / 4;
                const uint64_t ti = cl == 0   ? x
                                    : cl == 1 ? tb + x + (x < t1 ? x : t1)
                                              : tb + (x + 1 < t0 ? x + 1 : t0) + x;
                const uint32_t pos = (p0 + q) * bs;
                const uint32_t lo = (g->kv_begin > pos ? g->kv_begin : pos) - pos;
                const uint32_t hi = (g->kv_end < pos + bs ? g->kv_end : pos + bs) - pos;
                const int e = (int)(j[cl] % 4);
                t[ti].blk[e] = pages[g->page_begin + q];
                t[ti].pos[e] = pos;
                t[ti].rng[e] = lo | hi << 8 | (uint32_t)g->row_lo << 16 | (uint32_t)g->row_hi << 24;
            }
        }
        for (uint32_t k = 0; k < c->reserved; k++) {
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
