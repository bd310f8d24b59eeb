/*
 * sched_split.c — pass 2 of plan building: the long-KV split. The pre-split CTAs of pass 1
 * (sched_plan.c) are copied to the final list, and those whose KV length is far above the step's
 * mean, or too few to fill the GPU (the tile table's min_ctas), are cut along KV into parts whose
 * partial results the merge combines.
 *
 * Cost: linear in the pre-split CTAs, segments and rows.
 */
#include "sched_cost.h"

#include "pat_base.h"

#include <errno.h>
#include <string.h>

/* Pass 2 copies the pre-split CTAs to the final list, cutting the long ones along KV: a CTA's
 * segments, end to end, are cut into near-equal parts at block boundaries; a part keeps the rows
 * that read any of its stretch (renumbered) and is dropped when none does. */

/* The split's lengths: CTAs above *ret_limit tokens are cut into parts of about *ret_target.
 * fill: apply the tile table's min_ctas rule (see sched_tiles_t). Returns whether that rule cut
 * below the outlier split's limit. */
static int split_bounds(const sched_t *s, int fill, uint64_t *ret_target, uint64_t *ret_limit)
{
    int applied = 0;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < s->n_pre; i++)
        sum += s->pre[i].kv_tokens;
    uint64_t mean = s->n_pre ? sum / s->n_pre : 0;
    uint64_t target = PAT_MAX(mean, (uint64_t)s->cfg.split_min_kv);
    uint64_t limit = target * s->cfg.split_factor; /* outliers only */
    uint64_t items = (uint64_t)s->n_pre * s->cfg.kv_heads;
    if (fill && s->tiles.min_ctas && items < s->tiles.min_ctas) {
        /* too few work items to fill the device: every CTA longer than the length that gives
         * min_ctas items is cut (never below split_min_kv) */
        uint64_t fill_len = PAT_DIV_UP(sum * s->cfg.kv_heads, s->tiles.min_ctas);
        uint64_t t = PAT_MAX(PAT_MIN(target, fill_len), (uint64_t)s->cfg.split_min_kv);
        applied = t < limit;
        target = limit = t;
    }
    *ret_target = target;
    *ret_limit = limit;
    return applied;
}

/* A pre-split CTA kept whole. */
static void split_copy(sched_t *s, const sched__cta_t *c)
{
    sched__cta_t *pc = sched__cta_push(&s->ctas, &s->n_ctas, &s->ctas_cap);
    *pc = *c;
    pc->row_begin = s->n_rows;
    pc->seg_begin = s->n_segs;
    for (uint32_t r = 0; r < c->row_count; r++)
        *sched__row_push(&s->rows, &s->n_rows, &s->rows_cap) = s->prow[c->row_begin + r];
    for (uint32_t k = 0; k < c->seg_count; k++)
        *sched__seg_push(&s->segs, &s->n_segs, &s->segs_cap) = s->pseg[c->seg_begin + k];
}

/* Appends to segs[] the stretch of CTA c's segments from (*k, *pos) on: part_len tokens, cut at
 * block boundaries; advances (*k, *pos) past it. */
static void split_stretch(sched_t *s, const sched__cta_t *c, uint32_t part_len, uint32_t *k,
                          uint32_t *pos)
{
    const sched__seg_t *sg = s->pseg + c->seg_begin;
    uint32_t bs = s->mdl.bs, acc = 0;
    while (*k < c->seg_count && acc < part_len) {
        const sched__seg_t *x = &sg[*k];
        uint32_t want = PAT_DIV_UP(*pos + (part_len - acc), bs) * bs;
        uint32_t e = PAT_MIN(x->kv_end, want);
        *sched__seg_push(&s->segs, &s->n_segs, &s->segs_cap) =
            (sched__seg_t){.kv_begin = *pos,
                           .kv_end = e,
                           .psrc = x->psrc,
                           .poff = x->poff + *pos / bs - x->kv_begin / bs,
                           .row_lo = x->row_lo,
                           .row_hi = x->row_hi};
        acc += e - *pos;
        *pos = e;
        if (*pos == x->kv_end && ++*k < c->seg_count)
            *pos = sg[*k].kv_begin;
    }
}

/* Closes the part of CTA c whose stretch is segs[seg0, n_segs): its readers are the rows of a
 * segment whose causal limit reaches it, renumbered; each segment's run of rows is renumbered to
 * them and clamped to their limits. A part no row reads is dropped. */
static void split_close(sched_t *s, const sched__cta_t *c, uint32_t seg0)
{
    const sched__row_t *rw = s->prow + c->row_begin;
    uint32_t *map = s->row_map, row0 = s->n_rows;
    for (uint32_t r = 0; r < c->row_count; r++)
        map[r] = UINT32_MAX;
    for (uint32_t j = seg0; j < s->n_segs; j++)
        for (uint32_t r = s->segs[j].row_lo; r < s->segs[j].row_hi; r++)
            if (rw[r].limit > s->segs[j].kv_begin)
                map[r] = 0;
    for (uint32_t r = 0; r < c->row_count; r++)
        if (map[r] == 0) {
            map[r] = s->n_rows - row0;
            *sched__row_push(&s->rows, &s->n_rows, &s->rows_cap) = rw[r];
        }
    uint32_t out = seg0, kv = 0;
    for (uint32_t j = seg0; j < s->n_segs; j++) {
        sched__seg_t x = s->segs[j];
        uint32_t lo = UINT32_MAX, hi = 0, lim = 0;
        for (uint32_t r = x.row_lo; r < x.row_hi; r++)
            if (map[r] != UINT32_MAX && rw[r].limit > x.kv_begin) {
                lo = PAT_MIN(lo, map[r]);
                hi = map[r] + 1;
                lim = PAT_MAX(lim, rw[r].limit);
            }
        if (hi == 0)
            continue;
        x.row_lo = lo;
        x.row_hi = hi;
        x.kv_end = PAT_MIN(x.kv_end, lim);
        kv += x.kv_end - x.kv_begin;
        s->segs[out++] = x;
    }
    s->n_segs = out;
    if (s->n_rows == row0) {
        s->n_segs = seg0;
        return;
    }
    sched__cta_t *pc = sched__cta_push(&s->ctas, &s->n_ctas, &s->ctas_cap);
    pc->row_begin = row0;
    pc->row_count = s->n_rows - row0;
    pc->seg_begin = seg0;
    pc->seg_count = s->n_segs - seg0;
    pc->kv_tokens = kv;
    pc->pack = c->pack;
}

/* A pre-split CTA cut into parts of about target tokens. */
static void split_cut(sched_t *s, const sched__cta_t *c, uint64_t target)
{
    uint32_t bs = s->mdl.bs;
    uint32_t parts = (uint32_t)PAT_DIV_UP(c->kv_tokens, target);
    uint32_t part_len = (uint32_t)PAT_DIV_UP(PAT_DIV_UP(c->kv_tokens, parts), bs) * bs;
    uint32_t k = 0, pos = s->pseg[c->seg_begin].kv_begin;
    while (k < c->seg_count) {
        uint32_t seg0 = s->n_segs;
        split_stretch(s, c, part_len, &k, &pos);
        split_close(s, c, seg0);
    }
}

/* Pass 2; returns whether the fill rule cut anything beyond the outlier split. */
int sched__build_split(sched_t *s, int fill)
{
    uint64_t target, limit;
    int applied = split_bounds(s, fill, &target, &limit);
    s->n_ctas = s->n_segs = s->n_rows = 0;
    for (uint32_t i = 0; i < s->n_pre; i++) {
        const sched__cta_t *c = &s->pre[i];
        if (s->cfg.split_min_kv == 0 || c->kv_tokens <= limit)
            split_copy(s, c);
        else
            split_cut(s, c, target);
    }
    return applied;
}
