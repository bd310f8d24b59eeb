/*
 * sched_cost.c — the scheduler's cost model: bytes and time of CTAs, pack sets and plans, and the
 * one walk over the chunks of a pack set that the model and the plan builder share. Every policy,
 * split and CTA-size decision of scheduler/ is scored here; sched_pack.c and sched_plan.c both
 * depend on this file, and it depends on neither (only on the types of sched_int.h).
 *
 * Byte model (per KV head):
 *   KV     a CTA reads each of its segments once: kv_tokens * 2 * head_dim * elt; a pack with
 *          more query tokens than the largest tile holds (tok_per_chunk = m_max / group) becomes
 *          ceil(tokens / tok_per_chunk) chunks, each re-reading its segment (clamped to its rows'
 *          causal limits);
 *   Q      each CTA loads its rows: rows * head_dim * elt (Q's: sched_config_t.q_elt_bytes);
 *   merge  a query token split over k > 1 CTAs writes k fp32 partials (o[head_dim], lse) per row
 *          and the merge reads them back: k * rows * (head_dim + 2) * 4 * 2; with k == 1 the CTA
 *          writes the output directly and pays nothing extra.
 * Outputs are written once per token under every plan, so the model leaves them out; the traffic
 * reports (sched_plan_traffic, sched_query_centric_traffic) count them.
 *
 * Time model (sched_tiles_t.cost, measured per GPU): per work item (a CTA for one KV head)
 * max(bytes / bandwidth share, FLOPs / tensor-rate share, tiles x tile_us) + its fixed cost, and a
 * makespan over the device's resident slots, plus cost.merge_us once where any row is written as a
 * partial (the merge launch's own time; the partials' bytes are in the items). How many KV tiles a
 * CTA walks, how many slots it holds and which fixed cost it pays are the backend's to say
 * (sched_tiles_t.item, the rule it lays out its plans with); without a rule every segment starts
 * its own tiles. Without a cost model (the cpu backend) the time is the bytes.
 *
 * Cost: linear in the chunks and rows walked; no allocation.
 */
#include "sched_cost.h"

#include "pat_base.h"

#include <string.h>

/* Bytes of K and V of one token of one KV head. */
static uint64_t kv_tok_bytes(uint32_t head_dim, uint32_t elt)
{
    return 2ull * head_dim * elt;
}

/* Bytes of one Q row (one q head of one token); an output row is as large. */
static uint64_t q_row_bytes(uint32_t head_dim, uint32_t elt)
{
    return (uint64_t)head_dim * elt;
}

/* Bytes of one partial row (fp32 o[head_dim] and its lse, counted as head_dim + 2 words), written
 * by a CTA and read back by the merge. */
static uint64_t ic_row_bytes(uint32_t head_dim)
{
    return (head_dim + 2ull) * 4 * 2;
}

void sched__model_init(sched__model_t *m, const sched_config_t *cfg, const sched_tiles_t *t)
{
    m->bs = cfg->block_size;
    m->group = cfg->q_heads / cfg->kv_heads;
    m->head_dim = cfg->head_dim;
    m->elt = cfg->kv_elt_bytes;
    m->m_max = t->m[t->n_m - 1];
    m->tok_per_chunk = m->m_max / m->group;
    m->kv_tok = kv_tok_bytes(cfg->head_dim, cfg->kv_elt_bytes);
    m->ic_row = ic_row_bytes(cfg->head_dim);
    m->q_row = q_row_bytes(cfg->head_dim, cfg->q_elt_bytes ? cfg->q_elt_bytes : cfg->kv_elt_bytes);
}

/* ------------------------------------------------------------------ time model */

/* Modelled ns of one work item (a CTA for one KV head) reading kv_tokens in it->tiles KV tiles of
 * tn tokens with an m-row tile for `rows` query rows, partial_rows of which write fp32 partials
 * that a merge reads back. Without a cost model the time is the bytes (1 byte = 1 ns), so every
 * comparison falls back to bytes. */
static double item_ns(const sched_t *s, uint64_t kv_tokens, const sched_item_t *it, uint32_t tn,
                      uint32_t m, uint32_t rows, uint32_t partial_rows)
{
    const sched__model_t *md = &s->mdl;
    const sched_cost_t *c = &s->tiles.cost;
    double bytes = (double)kv_tokens * md->kv_tok + (double)rows * md->q_row +
                   (double)partial_rows * md->ic_row;
    if (!c->slots)
        return bytes;
    /* the tensor cores compute all m rows of a tile over its n tokens, however few read it */
    double flops = 4.0 * m * (double)it->tiles * tn * md->head_dim;
    /* an item of two slots gets twice the share */
    double share = (double)c->slots / it->units;
    double t_mem = bytes * share / c->read_gbs;            /* GB/s = bytes per ns */
    double t_mma = flops * share / (c->mma_tflops * 1e3);  /* TFLOP/s = 1e3 FLOP per ns */
    double t_chain = (double)it->tiles * c->tile_us * 1e3; /* latency, not a shared rate */
    double t = t_mem > t_mma ? t_mem : t_mma;
    const float fixed = it->kind == 1 && c->kind1_cta_us > 0 ? c->kind1_cta_us : c->cta_us;
    return (t > t_chain ? t : t_chain) + fixed * 1e3;
}

/* Makespan of n_items items (in slot units) of total sum_ns (units x time) and longest max_ns. */
static double makespan_ns(const sched_t *s, double sum_ns, double max_ns, uint64_t n_items)
{
    uint32_t slots = s->tiles.cost.slots;
    if (!slots || !n_items)
        return sum_ns;
    /* waves of equal items: ceil(n / slots) x the mean item; never below the longest item,
     * which one slot must run alone */
    double waves = (double)PAT_DIV_UP(n_items, slots);
    double t = sum_ns / (double)n_items * waves;
    return t > max_ns ? t : max_ns;
}

/* A running total of CTAs as work items of one KV head: their bytes and the makespan inputs. */
typedef struct tally {
    uint64_t bytes;        /* KV + Q + partials, one KV head */
    uint64_t units;        /* work items in slot units */
    double sum_ns;         /* sum of units x modelled time */
    double max_ns;         /* the longest item */
    uint64_t partial_rows; /* rows written as partials: any makes the layer pay cost.merge_us */
} tally_t;

/* The work item a CTA with an m-row tile over its n segments is, KV tiles of tn tokens: the
 * backend's rule, or one slot whose segments each start their own tiles. */
static inline void cta_item(const sched_t *s, const sched__seg_t *sg, uint32_t n, uint32_t m,
                            uint32_t tn, sched_item_t *it)
{
    if (s->tiles.item) {
        s->tiles.item(m, s->mdl.group, tn, s->cfg.invariant_chunk ? SCHED_PLAN_INVARIANT : 0, sg,
                      sizeof(*sg), n, it);
        return;
    }
    it->units = 1;
    it->kind = 0;
    it->tiles = sched_span_tiles(sg, sizeof(*sg), n, tn);
}

/* Adds one CTA of `rows` q-head rows over its n segments of kv_tokens in all, partial_rows of its
 * rows written as partials; returns its modelled time. */
static inline double tally_cta(const sched_t *s, tally_t *t, const sched__seg_t *sg, uint32_t n,
                               uint32_t rows, uint32_t kv_tokens, uint32_t partial_rows)
{
    const sched__model_t *md = &s->mdl;
    const uint32_t m = s->tiles.m[sched__pick_m(&s->tiles, rows)];
    const uint32_t tn = s->tiles.n[sched__pick_n(&s->tiles, kv_tokens)];
    sched_item_t it;
    cta_item(s, sg, n, m, tn, &it);
    /* a tile costs the CTA the time of the whole m-row tile however few of its 16-row bands read
     * it (each band is one warp's; a band that skips a tile leaves its tensor cores to the other
     * CTA on the SM, not to its own) */
    double ns = item_ns(s, kv_tokens, &it, tn, m, rows, partial_rows);
    t->bytes += kv_tokens * md->kv_tok + rows * md->q_row + partial_rows * md->ic_row;
    t->partial_rows += partial_rows;
    t->sum_ns += it.units * ns;
    t->units += it.units;
    t->max_ns = ns > t->max_ns ? ns : t->max_ns;
    return ns;
}

/* Adds partial_rows q-head rows written as partials and read back, counted after every CTA: their
 * bytes go to the sum, not to any one item (the fixed cost is already counted per item). */
static void tally_partials(const sched_t *s, tally_t *t, uint64_t partial_rows)
{
    t->bytes += partial_rows * s->mdl.ic_row;
    t->partial_rows += partial_rows;
    const sched_item_t none = {.tiles = 0, .units = 1, .kind = 0};
    t->sum_ns += item_ns(s, 0, &none, 0, 0, 0, (uint32_t)PAT_MIN(partial_rows, UINT32_MAX)) -
                 item_ns(s, 0, &none, 0, 0, 0, 0);
}

/* Modelled time of one layer: the makespan of the tallied items over every KV head, then the
 * merge's fixed time where any row was written as a partial. */
static double tally_ns(const sched_t *s, const tally_t *t)
{
    uint32_t kvh = s->cfg.kv_heads;
    double ns = makespan_ns(s, t->sum_ns * kvh, t->max_ns, t->units * kvh);
    if (t->partial_rows && s->tiles.cost.slots)
        ns += s->tiles.cost.merge_us * 1e3;
    return ns;
}

/* ------------------------------------------------------------------ byte model of packing */

int sched__merge_pays(const sched_t *s, uint64_t tokens, uint64_t acc_tokens, int leaf_direct)
{
    const sched__model_t *m = &s->mdl;
    uint64_t rows = tokens * m->group;
    uint64_t chunks = PAT_DIV_UP(tokens, m->tok_per_chunk);
    uint64_t saved = rows * m->ic_row * (leaf_direct ? 2 : 1);
    uint64_t reread = acc_tokens * m->kv_tok * chunks;
    return saved > reread;
}

/* ------------------------------------------------------------------ chunks */

/* The chunks of one pack's segment [seg_b, seg_e) read by the queries qids[0, n). */
static void walk_pack(const sched_t *s, sched__chunk_t *c, uint32_t seg_e, const uint32_t *qids,
                      uint32_t n, const sched__chunk_visit_t *v)
{
    const sched_forest_t *f = s->forest;
    const uint32_t cap = s->mdl.tok_per_chunk, seg_b = c->kv_begin;
    uint32_t hi = 0; /* largest causal limit of the chunk's rows */
    c->n_rows = 0;
    c->rows = v->rows;
    for (uint32_t k = 0; k < n; k++) {
        const sched__query_t *q = &f->q[qids[k]];
        uint32_t first_limit = q->kv_len - q->n_new + 1;
        /* tokens whose causal limit ends at or before the segment see none of it */
        uint32_t i0 = first_limit > seg_b ? 0 : seg_b - first_limit + 1;
        for (uint32_t i = i0; i < q->n_new; i++) {
            if (c->n_rows == cap) {
                c->kv_end = PAT_MIN(seg_e, hi);
                v->chunk(v->ctx, c);
                c->n_rows = 0;
                hi = 0;
            }
            hi = PAT_MAX(hi, first_limit + i);
            if (v->rows)
                v->rows[c->n_rows] =
                    (sched__row_t){.q_tok = q->tok_off + i, .limit = first_limit + i};
            c->n_rows++;
        }
    }
    if (c->n_rows) {
        c->kv_end = PAT_MIN(seg_e, hi);
        v->chunk(v->ctx, c);
    }
}

void sched__chunks_walk(const sched_t *s, const sched__packset_t *ps, const sched__chunk_visit_t *v)
{
    const sched_forest_t *f = s->forest;
    for (uint32_t pi = 0; pi < ps->n; pi++) {
        const sched__pack_t *p = &ps->p[pi];
        uint32_t seg_b = sched__seg_begin(f, p), seg_e = sched__seg_end(f, p);
        if (seg_e <= seg_b)
            continue; /* a leaf with no tokens of its own (KV ends on a shared block) */
        sched__chunk_t c = {.pack = pi, .kv_begin = seg_b};
        walk_pack(s, &c, seg_e, ps->q + p->q_begin, p->q_count, v);
    }
}

/* ------------------------------------------------------------------ pack set model */

typedef struct packset_walk {
    const sched_t *s;
    tally_t tally;
    uint32_t *cnt; /* per query token: the chunks that read it */
} packset_walk_t;

static void packset_chunk(void *ctx, const sched__chunk_t *c)
{
    packset_walk_t *w = ctx;
    for (uint32_t r = 0; r < c->n_rows; r++)
        w->cnt[c->rows[r].q_tok]++;
    sched__seg_t seg = {.kv_begin = c->kv_begin, .kv_end = c->kv_end};
    tally_cta(w->s, &w->tally, &seg, 1, c->n_rows * w->s->mdl.group, c->kv_end - c->kv_begin, 0);
}

/* The time is the makespan of the chunks as work items; their partial rows are known only once
 * every chunk is counted, so they add to the sum, not to any one item. */
void sched__packset_cost(sched_t *s, sched__packset_t *ps)
{
    const sched_forest_t *f = s->forest;
    packset_walk_t w = {.s = s, .cnt = s->tok_parts};
    for (uint32_t i = 0; i < f->n_in; i++) {
        const sched__query_t *q = &f->q[f->in_list[i]];
        memset(w.cnt + q->tok_off, 0, (size_t)q->n_new * sizeof(uint32_t));
    }
    const sched__chunk_visit_t v = {.chunk = packset_chunk, .ctx = &w, .rows = s->chunk_rows};
    sched__chunks_walk(s, ps, &v);
    uint64_t partial_rows = 0;
    for (uint32_t i = 0; i < f->n_in; i++) {
        const sched__query_t *q = &f->q[f->in_list[i]];
        for (uint32_t t = q->tok_off; t < q->tok_off + q->n_new; t++)
            if (w.cnt[t] > 1)
                partial_rows += (uint64_t)w.cnt[t] * s->mdl.group;
    }
    tally_partials(s, &w.tally, partial_rows);
    ps->bytes = w.tally.bytes;
    ps->ns = tally_ns(s, &w.tally);
}

/* ------------------------------------------------------------------ CTA lists */

/* The pre-split CTAs are modelled without partials each; rows of a token read by several CTAs (a
 * TREE node kept apart) write partials a merge reads, added to the sum as for a pack set. */
void sched__pre_cost(sched_t *s, sched__packset_t *ps)
{
    const uint32_t group = s->mdl.group;
    tally_t t = {0};
    for (uint32_t i = 0; i < s->n_pre; i++) {
        const sched__cta_t *c = &s->pre[i];
        tally_cta(s, &t, s->pseg + c->seg_begin, c->seg_count, c->row_count * group, c->kv_tokens,
                  0);
    }
    uint32_t *cnt = s->tok_parts;
    for (uint32_t i = 0; i < s->n_prow; i++)
        cnt[s->prow[i].q_tok] = 0;
    for (uint32_t i = 0; i < s->n_prow; i++)
        cnt[s->prow[i].q_tok]++;
    uint64_t partial_rows = 0;
    for (uint32_t i = 0; i < s->n_prow; i++)
        partial_rows += cnt[s->prow[i].q_tok] > 1 ? group : 0;
    tally_partials(s, &t, partial_rows);
    ps->bytes = t.bytes;
    ps->ns = tally_ns(s, &t);
}

double sched__ctas_ns(sched_t *s, const uint32_t *cnt)
{
    const uint32_t group = s->mdl.group;
    tally_t t = {0};
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        const sched__cta_t *c = &s->ctas[i];
        uint32_t partial = 0;
        for (uint32_t r = c->row_begin; r < c->row_begin + c->row_count; r++)
            partial += cnt[s->rows[r].q_tok] > 1;
        s->cta_ns[i] = tally_cta(s, &t, s->segs + c->seg_begin, c->seg_count, c->row_count * group,
                                 c->kv_tokens, partial * group);
    }
    return tally_ns(s, &t);
}

/* ------------------------------------------------------------------ traffic */

void sched_plan_traffic(const sched_plan_hdr_t *h, uint32_t q_heads, uint32_t kv_heads,
                        uint32_t head_dim, uint32_t kv_elt, uint32_t q_elt, sched_traffic_t *ret)
{
    const sched_plan_cta_t *ctas = sched_plan_ctas(h);
    uint64_t kv_tokens = 0, rows = 0;
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        kv_tokens += ctas[i].kv_tokens;
        rows += ctas[i].row_count;
    }
    uint32_t group = q_heads / kv_heads;
    memset(ret, 0, sizeof(*ret));
    ret->kv = kv_tokens * kv_heads * kv_tok_bytes(head_dim, kv_elt);
    ret->q = rows * q_heads * q_row_bytes(head_dim, q_elt);
    ret->partial = (uint64_t)h->n_partials * kv_heads * group * ic_row_bytes(head_dim);
    /* every token's output is written once: by its one direct row or by its merge */
    uint64_t tokens = 0;
    const sched_plan_row_t *r = sched_plan_rows(h);
    for (uint32_t i = 0; i < h->n_rows; i++)
        tokens += r[i].merge == SCHED_ROW_DIRECT;
    tokens += h->n_merges;
    ret->o = tokens * q_heads * q_row_bytes(head_dim, q_elt);
    ret->total = ret->kv + ret->q + ret->partial + ret->o;
}

static void qc_chunk(void *ctx, const sched__chunk_t *c)
{
    *(uint64_t *)ctx += c->kv_end - c->kv_begin;
}

/* The query-centric plan is the chunks of one pack per query over its whole KV [0, kv_len). */
void sched_query_centric_traffic(const sched_t *s, sched_traffic_t *ret)
{
    const sched_forest_t *f = s->forest;
    uint64_t kv_tokens = 0, tokens = 0;
    const sched__chunk_visit_t v = {.chunk = qc_chunk, .ctx = &kv_tokens, .rows = NULL};
    for (uint32_t i = 0; i < f->n_in; i++) {
        const sched__query_t *q = &f->q[f->in_list[i]];
        sched__chunk_t c = {.pack = i, .kv_begin = 0};
        walk_pack(s, &c, q->kv_len, &f->in_list[i], 1, &v);
        tokens += q->n_new;
    }
    uint32_t kv_heads = s->cfg.kv_heads, q_heads = s->cfg.q_heads;
    memset(ret, 0, sizeof(*ret));
    ret->kv = kv_tokens * kv_heads * s->mdl.kv_tok;
    ret->q = tokens * q_heads * s->mdl.q_row;
    ret->o = tokens * q_heads * s->mdl.q_row;
    ret->total = ret->kv + ret->q + ret->o;
}
