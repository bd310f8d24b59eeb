/*
 * sched_plan.c — from packs to the plan: CTA chunking by rows (one segment per CTA) or, for TREE,
 * CTAs of block-diagonal segments along the prefix tree; causal clamps, tile selection, the
 * long-KV split of segment lists, partial slots and the merge list, serialized into one flat
 * buffer (sched_plan_fmt.h). Also the traffic model every test and benchmark reports.
 *
 * Cost: linear in CTAs + segments + rows + pages + query tokens (TREE: + the path depth per
 * query); all vectors are kept across steps, so a steady-state step allocates nothing.
 */
#include "sched_int.h"

#include "pat_base.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static const sched_tiles_t default_tiles = {
    /* m: powers of two >= 16 (MMA shape rule); n: short KV favours small n (a partly filled last
     * tile is compute bubble), long KV larger n (fewer, longer CTAs shrink the tail). Until a
     * backend measures its own table (kernels/cuda), these are the PAT paper's shapes. */
    .n_m = 4,
    .m = {16, 32, 64, 128},
    .n_n = 3,
    .n = {32, 64, 128},
    .n_upto = {256, 2048, UINT32_MAX},
};

const sched_tiles_t *sched_tiles_default(void)
{
    return &default_tiles;
}

static int tiles_valid(const sched_tiles_t *t)
{
    if (t->n_m == 0 || t->n_m > SCHED_MAX_TILE_M || t->n_n == 0 || t->n_n > SCHED_MAX_TILE_N)
        return 0;
    for (uint32_t i = 0; i < t->n_m; i++)
        if (t->m[i] == 0 || (i && t->m[i] <= t->m[i - 1]))
            return 0;
    for (uint32_t i = 0; i < t->n_n; i++)
        if (t->n[i] == 0 || (i && t->n_upto[i] <= t->n_upto[i - 1]))
            return 0;
    return t->n_upto[t->n_n - 1] == UINT32_MAX;
}

/* ------------------------------------------------------------------ time model */

uint32_t sched__pick_n(const sched_tiles_t *t, uint32_t kv)
{
    for (uint32_t i = 0; i < t->n_n; i++)
        if (kv <= t->n_upto[i])
            return i;
    return t->n_n - 1;
}

uint32_t sched__pick_m(const sched_tiles_t *t, uint32_t rows)
{
    for (uint32_t i = 0; i < t->n_m; i++)
        if (t->m[i] >= rows)
            return i;
    return t->n_m - 1; /* unreachable: chunks never exceed m_max rows */
}

double sched__item_ns(const sched_t *s, uint64_t kv_tokens, uint64_t tiles, uint32_t tn, uint32_t m,
                      uint32_t rows, uint32_t partial_rows)
{
    const sched__model_t *md = &s->mdl;
    const sched_cost_t *c = &s->tiles.cost;
    double bytes = (double)kv_tokens * md->kv_tok + (double)rows * md->q_row +
                   (double)partial_rows * md->ic_row;
    if (!c->slots)
        return bytes;
    /* the tensor cores compute all m rows of a tile over its n tokens, however few read it */
    double flops = 4.0 * m * (double)tiles * tn * md->head_dim;
    /* an item of two slots gets twice the share (sched__item_units) */
    double share = (double)c->slots / sched__item_units(s, m);
    double t_mem = bytes * share / c->read_gbs;           /* GB/s = bytes per ns */
    double t_mma = flops * share / (c->mma_tflops * 1e3); /* TFLOP/s = 1e3 FLOP per ns */
    double t_chain = (double)tiles * c->tile_us * 1e3;    /* latency, not a shared rate */
    double t = t_mem > t_mma ? t_mem : t_mma;
    return (t > t_chain ? t : t_chain) + c->cta_us * 1e3;
}

uint32_t sched__item_units(const sched_t *s, uint32_t m)
{
    return s->tiles.pair_m && m > s->tiles.pair_m ? 2 : 1;
}

double sched__makespan_ns(const sched_t *s, double sum_ns, double max_ns, uint64_t n_items)
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

/* ------------------------------------------------------------------ life */

int sched_create(const sched_config_t *cfg, sched_t **ret)
{
    if (!cfg || !ret || cfg->max_queries == 0 || cfg->max_tokens == 0 || cfg->block_size == 0 ||
        cfg->q_heads == 0 || cfg->kv_heads == 0 || cfg->head_dim == 0 ||
        cfg->q_heads % cfg->kv_heads != 0 || (cfg->kv_elt_bytes != 2 && cfg->kv_elt_bytes != 4) ||
        (unsigned)cfg->policy > SCHED_POLICY_TREE)
        return -EINVAL;
    const sched_tiles_t *t = cfg->tiles ? cfg->tiles : &default_tiles;
    uint32_t group = cfg->q_heads / cfg->kv_heads;
    if (!tiles_valid(t) || group > t->m[t->n_m - 1])
        return -EINVAL;

    sched_t *s = pat_xcalloc(1, sizeof(*s));
    s->cfg = *cfg;
    s->tiles = *t;
    s->cfg.tiles = &s->tiles;
    if (s->cfg.split_factor == 0)
        s->cfg.split_factor = 2;
    int r = sched_forest_create(cfg->max_queries, cfg->block_size, &s->forest);
    if (r < 0) {
        free(s);
        return r;
    }
    sched__model_t *m = &s->mdl;
    m->bs = cfg->block_size;
    m->group = group;
    m->head_dim = cfg->head_dim;
    m->elt = cfg->kv_elt_bytes;
    m->m_max = t->m[t->n_m - 1];
    m->tok_per_chunk = m->m_max / group;
    m->kv_tok = 2ull * cfg->head_dim * cfg->kv_elt_bytes;
    m->ic_row = (cfg->head_dim + 2ull) * 4 * 2;
    m->q_row = (uint64_t)cfg->head_dim * cfg->kv_elt_bytes;
    s->tok_parts = pat_xcalloc(cfg->max_tokens, sizeof(uint32_t));
    s->node_tok = pat_xcalloc(2ull * cfg->max_queries + 1, sizeof(uint64_t));
    s->node_merged = pat_xcalloc(2ull * cfg->max_queries + 1, 1);
    s->tok_owner = pat_xcalloc(cfg->max_tokens, sizeof(uint32_t));
    s->tok_merge = pat_xcalloc(cfg->max_tokens, sizeof(uint32_t));
    s->row_map = pat_xcalloc(m->tok_per_chunk, sizeof(uint32_t));
    s->chunk_rows = pat_xcalloc(m->tok_per_chunk, sizeof(sched_plan_row_t));
    *ret = s;
    return 0;
}

void sched_free(sched_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < 5; i++)
        sched__packset_done(&s->cand[i]);
    sched_forest_free(s->forest);
    free(s->tok_parts);
    free(s->node_tok);
    free(s->node_merged);
    free(s->tok_owner);
    free(s->tok_merge);
    free(s->cta_ns);
    free(s->cta_key);
    free(s->arena);
    free(s->pre);
    free(s->pseg);
    free(s->prow);
    free(s->ctas);
    free(s->segs);
    free(s->rows);
    free(s->path);
    free(s->stk_node);
    free(s->stk_lo);
    free(s->apart);
    free(s->chunk_rows);
    free(s->row_map);
    free(s->psrc);
    free(s);
}

sched_forest_t *sched_forest(sched_t *s)
{
    return s->forest;
}

void sched_get_stats(const sched_t *s, sched_stats_t *ret)
{
    *ret = s->st;
}

/* ------------------------------------------------------------------ building */

static sched_plan_row_t *row_push(sched_plan_row_t **v, uint32_t *n, uint32_t *cap)
{
    pat_grow((void **)v, cap, *n + 1, sizeof(sched_plan_row_t));
    return &(*v)[(*n)++];
}

static sched_plan_cta_t *cta_push(sched_plan_cta_t **v, uint32_t *n, uint32_t *cap)
{
    pat_grow((void **)v, cap, *n + 1, sizeof(sched_plan_cta_t));
    sched_plan_cta_t *c = &(*v)[(*n)++];
    memset(c, 0, sizeof(*c));
    return c;
}

static sched__seg_t *seg_push(sched__seg_t **v, uint32_t *n, uint32_t *cap)
{
    pat_grow((void **)v, cap, *n + 1, sizeof(sched__seg_t));
    return &(*v)[(*n)++];
}

/* Appends to the pre-split segments the stretch [b, e) of `blocks` read by the pre-split rows
 * [row_begin + lo, row_begin + hi), clamped to their largest causal limit; nothing when no row
 * reaches it. Pages are copied once, straight into the plan: the segment remembers the run. */
static void pseg_add(sched_t *s, uint32_t row_begin, uint32_t lo, uint32_t hi, uint32_t b,
                     uint32_t e, const uint32_t *blocks)
{
    uint32_t lim = 0;
    for (uint32_t r = row_begin + lo; r < row_begin + hi; r++)
        lim = PAT_MAX(lim, s->prow[r].limit);
    e = PAT_MIN(e, lim);
    if (e <= b)
        return;
    uint32_t bs = s->mdl.bs, p0 = b / bs, p1 = PAT_DIV_UP(e, bs);
    pat_grow((void **)&s->psrc, &s->psrc_cap, s->n_psrc + 1, sizeof(sched__psrc_t));
    s->psrc[s->n_psrc] = (sched__psrc_t){.src = blocks + p0, .n = p1 - p0};
    *seg_push(&s->pseg, &s->n_pseg, &s->pseg_cap) = (sched__seg_t){
        .kv_begin = b, .kv_end = e, .psrc = s->n_psrc++, .poff = 0, .row_lo = lo, .row_hi = hi};
    s->n_pages += p1 - p0;
}

/* Closes the pre-split CTA of rows [row_begin, n_prow) and segments [seg_begin, n_pseg). */
static void pre_close(sched_t *s, uint32_t pack, uint32_t row_begin, uint32_t seg_begin)
{
    if (s->n_prow == row_begin)
        return;
    if (s->n_pseg == seg_begin) {
        s->n_prow = row_begin; /* every row's causal limit ends before the KV: nothing to read */
        return;
    }
    sched_plan_cta_t *c = cta_push(&s->pre, &s->n_pre, &s->pre_cap);
    c->row_begin = row_begin;
    c->row_count = s->n_prow - row_begin;
    c->seg_begin = seg_begin;
    c->seg_count = s->n_pseg - seg_begin;
    for (uint32_t i = seg_begin; i < s->n_pseg; i++)
        c->kv_tokens += s->pseg[i].kv_end - s->pseg[i].kv_begin;
    c->pack = pack;
}

/* Pass 1 (packs): one pre-split CTA per chunk of at most tok_per_chunk query tokens of each pack,
 * one segment read by all its rows. */
static void build_chunks(sched_t *s, const sched__packset_t *ps)
{
    const sched_forest_t *f = s->forest;
    for (uint32_t pi = 0; pi < ps->n; pi++) {
        const sched__pack_t *p = &ps->p[pi];
        uint32_t seg_b = sched__seg_begin(f, p), seg_e = sched__seg_end(f, p);
        if (seg_e <= seg_b)
            continue; /* a leaf with no tokens of its own (KV ends on a shared block) */
        const uint32_t *blocks = f->q[f->node[p->bottom].rep].blocks;
        uint32_t row_begin = s->n_prow, in_chunk = 0;
        for (uint32_t k = 0; k <= p->q_count; k++) {
            const sched__query_t *q = k < p->q_count ? &f->q[ps->q[p->q_begin + k]] : NULL;
            uint32_t n_new = q ? q->n_new : 1, first_limit = q ? q->kv_len - q->n_new + 1 : 0;
            for (uint32_t i = 0; i < n_new; i++) {
                if (q && first_limit + i <= seg_b)
                    continue; /* this token sees none of the segment */
                if (in_chunk == s->mdl.tok_per_chunk || (!q && in_chunk)) {
                    uint32_t seg_begin = s->n_pseg;
                    pseg_add(s, row_begin, 0, in_chunk, seg_b, seg_e, blocks);
                    pre_close(s, pi, row_begin, seg_begin);
                    row_begin = s->n_prow;
                    in_chunk = 0;
                }
                if (!q)
                    break;
                sched_plan_row_t *r = row_push(&s->prow, &s->n_prow, &s->prow_cap);
                *r = (sched_plan_row_t){
                    .q_tok = q->tok_off + i, .limit = first_limit + i, .merge = SCHED_ROW_DIRECT};
                in_chunk++;
            }
        }
    }
}

/* The segment of node `id` on a TREE CTA's stack (CTAs of m rows), read by its rows [lo, hi):
 * kept in the CTA, or deferred to a CTA of its own (tree_apart) when it is long and read by few
 * of the CTA's rows. */
static void tree_seg(sched_t *s, uint32_t m, uint32_t row_begin, uint32_t id, uint32_t lo,
                     uint32_t hi)
{
    const sched_forest_t *f = s->forest;
    const sched__node_t *n = &f->node[id];
    uint32_t b = n->start * f->bs, e = sched__node_kv_end(f, id);
    if (e <= b)
        return;
    /* Measured (H100, issue 14): a KV tile costs a CTA the time of all its m rows however few
     * read it, so 256-token leaves of one query each inside 64-row CTAs ran at 0.79x the speed
     * of the same leaves as small CTAs of their own (merged after); nodes of up to two tiles
     * (128-token nodes of two queries at GQA 8) were faster inside (no work item, no partial, no
     * merge): 202 against 354 us on 4,16,256,512_512,32,128,32 at 64/8 kept apart. */
    const uint32_t tn = s->tiles.n[0];
    if (e - b > 2 * tn && 2 * (hi - lo) * s->mdl.group < m) {
        pat_grow((void **)&s->apart, &s->apart_cap, s->n_apart + 1, sizeof(*s->apart));
        s->apart[s->n_apart++] = (sched__apart_t){.node = id, .lo = lo, .hi = hi};
        return;
    }
    pseg_add(s, row_begin, lo, hi, b, e, f->q[n->rep].blocks);
}

/* The deferred segments of the TREE CTA just closed (its rows saved in chunk_rows: the CTA itself
 * may have been dropped, every segment apart): each a CTA of its own, with copies of the rows
 * that read it. */
static void tree_apart(sched_t *s, uint32_t pack)
{
    const sched_forest_t *f = s->forest;
    for (uint32_t i = 0; i < s->n_apart; i++) {
        const sched__apart_t *x = &s->apart[i];
        const sched__node_t *n = &f->node[x->node];
        uint32_t b = n->start * f->bs, e = sched__node_kv_end(f, x->node);
        uint32_t r0 = s->n_prow, seg0 = s->n_pseg;
        for (uint32_t r = x->lo; r < x->hi; r++) {
            sched_plan_row_t row = s->chunk_rows[r];
            if (row.limit > b) /* causal: rows that end before it read none of it */
                *row_push(&s->prow, &s->n_prow, &s->prow_cap) = row;
        }
        pseg_add(s, r0, 0, s->n_prow - r0, b, e, f->q[n->rep].blocks);
        pre_close(s, pack, r0, seg0);
    }
    s->n_apart = 0;
}

/* Pass 1 (TREE): the queries in DFS order (ps->q) cut into CTAs of at most ps->tree_tok query
 * tokens (sched__tree_cost chose it); in DFS order the readers of every node are a run of rows, so
 * each CTA reads each node of its rows' paths once, as one segment. A stack holds the path of the
 * previous query: nodes it shares with the next stay open, the others close. */
static void build_tree(sched_t *s, const sched__packset_t *ps)
{
    const sched_forest_t *f = s->forest;
    const uint32_t cap = ps->tree_tok, m = cap * s->mdl.group;
    uint32_t k = 0, tok = 0, cta = 0; /* query in ps->q, its next token, CTAs so far */
    while (k < ps->nq) {
        uint32_t row_begin = s->n_prow, seg_begin = s->n_pseg, depth = 0;
        while (k < ps->nq && s->n_prow - row_begin < cap) {
            const sched__query_t *q = &f->q[ps->q[k]];
            /* a query of several tokens that does not fit the rest of this CTA starts the next
             * one: its chunks then fall where the query-centric plan's do, and no chunk reads its
             * path for a token or two (measured: a prefill straddling two CTAs made a TREE plan
             * read more KV than query-centric attention on azure_code_sample) */
            if (tok == 0 && s->n_prow > row_begin && q->n_new > cap - (s->n_prow - row_begin))
                break;
            uint32_t plen = 0;
            for (uint32_t id = q->leaf; id != SCHED__ROOT; id = f->node[id].parent) {
                pat_grow((void **)&s->path, &s->path_cap, plen + 1, sizeof(uint32_t));
                s->path[plen++] = id;
            }
            for (uint32_t i = 0; i < plen / 2; i++) { /* top first */
                uint32_t t = s->path[i];
                s->path[i] = s->path[plen - 1 - i];
                s->path[plen - 1 - i] = t;
            }
            uint32_t common = 0, at = s->n_prow - row_begin;
            while (common < depth && common < plen && s->stk_node[common] == s->path[common])
                common++;
            while (depth > common) {
                depth--;
                tree_seg(s, m, row_begin, s->stk_node[depth], s->stk_lo[depth], at);
            }
            if (plen > s->stk_cap) {
                s->stk_cap = plen + plen / 2;
                s->stk_node = pat_xrealloc(s->stk_node, s->stk_cap * sizeof(uint32_t));
                s->stk_lo = pat_xrealloc(s->stk_lo, s->stk_cap * sizeof(uint32_t));
            }
            for (; depth < plen; depth++) {
                s->stk_node[depth] = s->path[depth];
                s->stk_lo[depth] = at;
            }
            uint32_t take = PAT_MIN(q->n_new - tok, cap - at);
            uint32_t first_limit = q->kv_len - q->n_new + 1;
            for (uint32_t i = tok; i < tok + take; i++)
                *row_push(&s->prow, &s->n_prow, &s->prow_cap) = (sched_plan_row_t){
                    .q_tok = q->tok_off + i, .limit = first_limit + i, .merge = SCHED_ROW_DIRECT};
            tok += take;
            if (tok == q->n_new) {
                k++;
                tok = 0;
            }
        }
        uint32_t at = s->n_prow - row_begin;
        while (depth > 0) {
            depth--;
            tree_seg(s, m, row_begin, s->stk_node[depth], s->stk_lo[depth], at);
        }
        if (s->n_apart)
            memcpy(s->chunk_rows, s->prow + row_begin, at * sizeof(sched_plan_row_t));
        pre_close(s, cta, row_begin, seg_begin);
        tree_apart(s, cta++);
    }
}

/* The modelled time of a CTA of `rows` q-head rows over its segments (partial_rows of them
 * written as partials): every segment starts a KV tile of its own, and a tile costs the CTA the
 * time of the whole m-row tile however few of its 16-row bands read it (each band is one warp's;
 * a band that skips a tile leaves its tensor cores to the other CTA on the SM, not to its own). */
static double cta_ns(const sched_t *s, const sched__seg_t *sg, uint32_t n, uint32_t rows,
                     uint32_t kv_tokens, uint32_t partial_rows)
{
    const sched_tiles_t *t = &s->tiles;
    uint32_t tn = t->n[sched__pick_n(t, kv_tokens)];
    uint64_t tiles = 0;
    for (uint32_t i = 0; i < n; i++)
        tiles += PAT_DIV_UP(sg[i].kv_end - sg[i].kv_begin, tn);
    return sched__item_ns(s, kv_tokens, tiles, tn, t->m[sched__pick_m(t, rows)], rows,
                          partial_rows);
}

/* Pass 2: copy pre-split CTAs to the final list, cutting the long ones along KV: a CTA's segments,
 * end to end, are cut into near-equal parts at block boundaries; a part keeps the rows that read
 * any of its stretch (renumbered) and is dropped when none does. */
/* fill: apply the tile table's min_ctas rule (see sched_tiles_t) */
static int build_split(sched_t *s, int fill)
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
    uint32_t bs = s->mdl.bs;
    s->n_ctas = s->n_segs = s->n_rows = 0;
    for (uint32_t i = 0; i < s->n_pre; i++) {
        const sched_plan_cta_t c = s->pre[i];
        const sched__seg_t *sg = s->pseg + c.seg_begin;
        const sched_plan_row_t *rw = s->prow + c.row_begin;
        if (s->cfg.split_min_kv == 0 || c.kv_tokens <= limit) {
            sched_plan_cta_t *pc = cta_push(&s->ctas, &s->n_ctas, &s->ctas_cap);
            *pc = c;
            pc->row_begin = s->n_rows;
            pc->seg_begin = s->n_segs;
            for (uint32_t r = 0; r < c.row_count; r++)
                *row_push(&s->rows, &s->n_rows, &s->rows_cap) = rw[r];
            for (uint32_t k = 0; k < c.seg_count; k++)
                *seg_push(&s->segs, &s->n_segs, &s->segs_cap) = sg[k];
            continue;
        }
        uint32_t parts = (uint32_t)PAT_DIV_UP(c.kv_tokens, target);
        uint32_t part_len = (uint32_t)PAT_DIV_UP(PAT_DIV_UP(c.kv_tokens, parts), bs) * bs;
        uint32_t k = 0, pos = sg[0].kv_begin;
        while (k < c.seg_count) {
            /* the part's stretch: from (k, pos) on, part_len tokens, cut at block boundaries */
            uint32_t seg0 = s->n_segs, acc = 0;
            while (k < c.seg_count && acc < part_len) {
                uint32_t want = PAT_DIV_UP(pos + (part_len - acc), bs) * bs;
                uint32_t e = PAT_MIN(sg[k].kv_end, want);
                *seg_push(&s->segs, &s->n_segs, &s->segs_cap) =
                    (sched__seg_t){.kv_begin = pos,
                                   .kv_end = e,
                                   .psrc = sg[k].psrc,
                                   .poff = sg[k].poff + pos / bs - sg[k].kv_begin / bs,
                                   .row_lo = sg[k].row_lo,
                                   .row_hi = sg[k].row_hi};
                acc += e - pos;
                pos = e;
                if (pos == sg[k].kv_end && ++k < c.seg_count)
                    pos = sg[k].kv_begin;
            }
            /* its readers: rows of a segment whose causal limit reaches its stretch */
            uint32_t *map = s->row_map, row0 = s->n_rows;
            for (uint32_t r = 0; r < c.row_count; r++)
                map[r] = UINT32_MAX;
            for (uint32_t j = seg0; j < s->n_segs; j++)
                for (uint32_t r = s->segs[j].row_lo; r < s->segs[j].row_hi; r++)
                    if (rw[r].limit > s->segs[j].kv_begin)
                        map[r] = 0;
            for (uint32_t r = 0; r < c.row_count; r++)
                if (map[r] == 0) {
                    map[r] = s->n_rows - row0;
                    *row_push(&s->rows, &s->n_rows, &s->rows_cap) = rw[r];
                }
            /* renumber each segment's run to the kept rows; clamp it to their limits */
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
                continue;
            }
            sched_plan_cta_t *pc = cta_push(&s->ctas, &s->n_ctas, &s->ctas_cap);
            pc->row_begin = row0;
            pc->row_count = s->n_rows - row0;
            pc->seg_begin = seg0;
            pc->seg_count = s->n_segs - seg0;
            pc->kv_tokens = kv;
            pc->pack = c.pack;
        }
    }
    return applied;
}

#define KEYS 127u /* launch-order keys: 4 per octave of modelled ns */

static uint8_t time_key(double ns)
{
    int k = ns >= 1.0 ? (int)(log2(ns) * 4.0) : 0;
    return (uint8_t)(k > (int)KEYS ? (int)KEYS : k);
}

/* Pass 1 for either kind of pack set. */
static void pre_build(sched_t *s, const sched__packset_t *ps)
{
    s->n_pre = s->n_pseg = s->n_prow = s->n_pages = s->n_psrc = 0;
    if (ps->tree)
        build_tree(s, ps);
    else
        build_chunks(s, ps);
}

/* TREE's model with CTAs of at most ps->tree_tok query tokens */
static void tree_cost_at(sched_t *s, sched__packset_t *ps)
{
    /* as packset_cost models a pack set: its CTAs before any split, no partials */
    pre_build(s, ps);
    const sched__model_t *m = &s->mdl;
    uint64_t bytes = 0, units = 0;
    double sum = 0, max = 0;
    for (uint32_t i = 0; i < s->n_pre; i++) {
        const sched_plan_cta_t *c = &s->pre[i];
        uint32_t rows = c->row_count * m->group;
        double t = cta_ns(s, s->pseg + c->seg_begin, c->seg_count, rows, c->kv_tokens, 0);
        uint32_t u = sched__item_units(s, s->tiles.m[sched__pick_m(&s->tiles, rows)]);
        bytes += c->kv_tokens * m->kv_tok + rows * m->q_row;
        sum += u * t;
        units += u;
        max = t > max ? t : max;
    }
    /* rows of a token read by several CTAs (a node kept apart) write partials a merge reads */
    uint32_t *cnt = s->tok_parts;
    for (uint32_t i = 0; i < s->n_prow; i++)
        cnt[s->prow[i].q_tok] = 0;
    for (uint32_t i = 0; i < s->n_prow; i++)
        cnt[s->prow[i].q_tok]++;
    uint64_t partial_rows = 0;
    for (uint32_t i = 0; i < s->n_prow; i++)
        partial_rows += cnt[s->prow[i].q_tok] > 1 ? m->group : 0;
    bytes += partial_rows * m->ic_row;
    sum += sched__item_ns(s, 0, 0, 0, 0, 0, (uint32_t)PAT_MIN(partial_rows, UINT32_MAX)) -
           sched__item_ns(s, 0, 0, 0, 0, 0, 0);
    ps->bytes = bytes;
    ps->ns = sched__makespan_ns(s, sum * s->cfg.kv_heads, max, units * s->cfg.kv_heads);
}

void sched__tree_cost(sched_t *s, sched__packset_t *ps)
{
    /* The CTA size, chosen on the model among the tile m's that hold a query token's group: big
     * CTAs read a shared prefix fewer times, small ones walk fewer private segments one after
     * another (measured, H100: CTAs of 16 rows ran 256 queries of 32-token leaves under a
     * 256-token prefix at 32/32 in 76 us, CTAs of 64 in 159). Largest first; a smaller m must be
     * strictly faster. Without a time model only the largest: what small CTAs save is latency,
     * which bytes do not see, and they cut extend queries where query-centric chunks do not. */
    const sched_tiles_t *t = &s->tiles;
    uint32_t best = 0;
    double best_ns = INFINITY;
    uint64_t best_bytes = 0;
    for (uint32_t i = t->n_m; i-- > 0;) {
        if (t->m[i] < s->mdl.group || (i + 1 < t->n_m && !t->cost.slots))
            break;
        ps->tree_tok = t->m[i] / s->mdl.group;
        tree_cost_at(s, ps);
        if (ps->ns < best_ns) {
            best = ps->tree_tok;
            best_ns = ps->ns;
            best_bytes = ps->bytes;
        }
    }
    ps->tree_tok = best;
    ps->ns = best_ns;
    ps->bytes = best_bytes;
}

/* Chunks, splits (fill: see build_split), counts each token's CTAs (tok_parts) and gives each
 * split token its first partial slot (tok_owner); models each CTA's time (cta_ns) and the plan's
 * makespan. Returns whether the fill rule cut anything beyond the outlier split. */
static int ctas_build(sched_t *s, const sched__packset_t *ps, int fill, uint32_t n_tokens,
                      uint32_t *ret_partials, uint32_t *ret_merges, double *ret_ns)
{
    uint32_t *cnt = s->tok_parts, *next = s->tok_owner;
    pre_build(s, ps);
    int applied = build_split(s, fill);

    /* partial slots: a token read by k > 1 CTAs gets k consecutive slots and a merge entry */
    memset(cnt, 0, (size_t)n_tokens * sizeof(uint32_t));
    for (uint32_t i = 0; i < s->n_ctas; i++)
        for (uint32_t r = 0; r < s->ctas[i].row_count; r++)
            cnt[s->rows[s->ctas[i].row_begin + r].q_tok]++;
    uint32_t n_partials = 0, n_merges = 0;
    for (uint32_t t = 0; t < n_tokens; t++) {
        next[t] = n_partials;
        if (cnt[t] > 1) {
            n_partials += cnt[t];
            n_merges++;
        }
    }
    if (s->n_ctas > s->cta_ns_cap) {
        s->cta_ns_cap = s->n_ctas + s->n_ctas / 2;
        free(s->cta_ns);
        free(s->cta_key);
        s->cta_ns = pat_xmalloc(s->cta_ns_cap * sizeof(double));
        s->cta_key = pat_xmalloc(s->cta_ns_cap);
    }
    double sum = 0, max = 0;
    uint64_t units = 0;
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        const sched_plan_cta_t *c = &s->ctas[i];
        uint32_t partial = 0;
        for (uint32_t r = c->row_begin; r < c->row_begin + c->row_count; r++)
            partial += cnt[s->rows[r].q_tok] > 1;
        uint32_t rows = c->row_count * s->mdl.group;
        double t = cta_ns(s, s->segs + c->seg_begin, c->seg_count, rows, c->kv_tokens,
                          partial * s->mdl.group);
        uint32_t u = sched__item_units(s, s->tiles.m[sched__pick_m(&s->tiles, rows)]);
        s->cta_ns[i] = t;
        sum += u * t;
        units += u;
        max = t > max ? t : max;
    }
    uint32_t kvh = s->cfg.kv_heads;
    *ret_ns = sched__makespan_ns(s, sum * kvh, max, units * kvh);
    *ret_partials = n_partials;
    *ret_merges = n_merges;
    return applied;
}

/* The CTA list of a pack set with the fill split decided (see sched_build): 0, or -ENOSPC when
 * even the outlier splits need more partial slots than the backend holds. */
static int plan_ctas(sched_t *s, const sched__packset_t *ps, uint32_t n_tokens,
                     uint32_t *ret_partials, uint32_t *ret_merges, double *ret_ns)
{
    /* The fill split is an optimization: it is kept only when it fits the backend's partial
     * slots and, with a cost model, when the model finds it faster than outlier splits alone
     * (measured: cutting 64 unshared 1K-token queries into 3 parts each was no faster and paid
     * for the merges). */
    /* TREE is never fill-split: its CTAs exist to read whole paths without partials, and cut
     * into parts they measured up to 2.4x their modelled time (H100, 256-query trees at 16/8
     * and 32/8); a TREE plan with too few work items loses to a pack plan on the model instead */
    int applied = ctas_build(s, ps, !ps->tree, n_tokens, ret_partials, ret_merges, ret_ns);
    if (applied) {
        int fits = !s->cfg.max_partials || *ret_partials <= s->cfg.max_partials;
        if (!fits || s->tiles.cost.slots) {
            double ns_fill = *ret_ns;
            ctas_build(s, ps, 0, n_tokens, ret_partials, ret_merges, ret_ns);
            if (fits && ns_fill < *ret_ns) {
                ctas_build(s, ps, 1, n_tokens, ret_partials, ret_merges, ret_ns);
                s->st.fill_kept++;
            } else {
                s->st.fill_dropped++;
            }
        } else {
            s->st.fill_kept++;
        }
    }
    return s->cfg.max_partials && *ret_partials > s->cfg.max_partials ? -ENOSPC : 0;
}

static uint32_t align16(uint32_t x)
{
    return (x + 15u) & ~15u;
}

int sched_build(sched_t *s, const sched_plan_hdr_t **ret_plan)
{
    uint64_t t0 = pat_now_ns();
    const sched_forest_t *f = s->forest;
    if (f->n_in == 0)
        return -ENODATA;

    /* query token rows: inside max_tokens, no two queries on one row */
    uint32_t n_tokens = 0;
    for (uint32_t i = 0; i < f->n_in; i++) {
        const sched__query_t *q = &f->q[f->in_list[i]];
        if ((uint64_t)q->tok_off + q->n_new > s->cfg.max_tokens)
            return -EINVAL;
        n_tokens = PAT_MAX(n_tokens, q->tok_off + q->n_new);
    }
    memset(s->tok_owner, 0xff, (size_t)n_tokens * sizeof(uint32_t));
    for (uint32_t i = 0; i < f->n_in; i++) {
        uint32_t qid = f->in_list[i];
        const sched__query_t *q = &f->q[qid];
        for (uint32_t t = q->tok_off; t < q->tok_off + q->n_new; t++) {
            if (s->tok_owner[t] != SCHED_NONE)
                return -EINVAL;
            s->tok_owner[t] = qid;
        }
    }

    int rebuilt = sched__pack_update(s);
    uint32_t n_partials = 0, n_merges = 0;
    double ns = 0;
    if (rebuilt && s->cfg.policy == SCHED_POLICY_AUTO) {
        /* the packs' own model cannot see the long-KV split that follows them (measured: a
         * query-centric pack of 10 queries looked faster than the shared one before the split and
         * ran at 1.8x its time after it); choose on the modelled time of the finished plans (the
         * bytes without a time model: a TREE plan without partials before the split had more
         * after it than BYTES' on a shared 4K prompt) */
        static const sched_policy_t order[] = {SCHED_POLICY_BYTES, SCHED_POLICY_PAPER,
                                               SCHED_POLICY_QUERY, SCHED_POLICY_TREE};
        double best_ns = INFINITY;
        for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
            if (plan_ctas(s, &s->cand[order[i]], n_tokens, &n_partials, &n_merges, &ns) == 0 &&
                ns < best_ns) {
                best_ns = ns;
                s->chosen = order[i];
            }
    }
    if (rebuilt)
        s->st.chosen[s->chosen]++;
    int rc = plan_ctas(s, &s->cand[s->chosen], n_tokens, &n_partials, &n_merges, &ns);
    if (rc < 0)
        return rc; /* nothing written to the arena yet: the previous plan stands */
    uint32_t *cnt = s->tok_parts, *next = s->tok_owner;

    /* tile shapes and launch order: CTAs sorted by modelled time, longest first (a counting sort
     * on a log scale: 4 keys per octave), so the long ones do not start in the last wave */
    const sched_tiles_t *tl = &s->tiles;
    uint32_t n_shapes = tl->n_m * tl->n_n, shape_cnt[SCHED_MAX_TILE_M * SCHED_MAX_TILE_N] = {0};
    uint32_t max_rows = 0, key_cnt[KEYS + 1] = {0};
    uint8_t *key = s->cta_key;
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        sched_plan_cta_t *c = &s->ctas[i];
        uint32_t rows = c->row_count * s->mdl.group;
        max_rows = PAT_MAX(max_rows, rows);
        c->group = sched__pick_m(tl, rows) * tl->n_n + sched__pick_n(tl, c->kv_tokens);
        shape_cnt[c->group]++;
        key[i] = time_key(s->cta_ns[i]);
        key_cnt[KEYS - key[i]]++; /* descending */
    }
    for (uint32_t k = 0, at = 0; k <= KEYS; k++) {
        uint32_t n = key_cnt[k];
        key_cnt[k] = at;
        at += n;
    }
    uint32_t n_groups = 0;
    for (uint32_t k = 0; k < n_shapes; k++)
        n_groups += shape_cnt[k] != 0;

    /* layout */
    uint32_t off_groups = align16(sizeof(sched_plan_hdr_t));
    uint32_t off_ctas = align16(off_groups + n_groups * (uint32_t)sizeof(sched_plan_group_t));
    uint32_t off_segs = align16(off_ctas + s->n_ctas * (uint32_t)sizeof(sched_plan_cta_t));
    uint32_t off_rows = align16(off_segs + s->n_segs * (uint32_t)sizeof(sched_plan_seg_t));
    uint32_t off_pages = align16(off_rows + s->n_rows * (uint32_t)sizeof(sched_plan_row_t));
    uint32_t off_merges = align16(off_pages + s->n_pages * (uint32_t)sizeof(uint32_t));
    uint32_t total = off_merges + n_merges * (uint32_t)sizeof(sched_plan_merge_t);
    if (total > s->arena_cap) {
        free(s->arena);
        s->arena_cap = total + total / 2;
        s->arena = pat_xmalloc(s->arena_cap);
    }
    char *base = s->arena;
    sched_plan_hdr_t *h = (sched_plan_hdr_t *)base;
    memset(h, 0, sizeof(*h));
    h->magic = SCHED_PLAN_MAGIC;
    h->version = SCHED_PLAN_VERSION;
    h->total_bytes = total;
    h->block_size = s->mdl.bs;
    h->group = s->mdl.group;
    h->n_tokens = n_tokens;
    h->n_groups = n_groups;
    h->n_ctas = s->n_ctas;
    h->n_segs = s->n_segs;
    h->off_segs = off_segs;
    h->n_rows = s->n_rows;
    h->n_pages = s->n_pages;
    h->n_merges = n_merges;
    h->n_partials = n_partials;
    h->off_groups = off_groups;
    h->off_ctas = off_ctas;
    h->off_rows = off_rows;
    h->off_pages = off_pages;
    h->off_merges = off_merges;
    h->max_cta_rows = max_rows;

    sched_plan_group_t *groups = (sched_plan_group_t *)(base + off_groups);
    uint32_t shape_group[SCHED_MAX_TILE_M * SCHED_MAX_TILE_N];
    for (uint32_t k = 0, g = 0; k < n_shapes; k++) {
        if (!shape_cnt[k])
            continue;
        groups[g] = (sched_plan_group_t){
            .m = tl->m[k / tl->n_n], .n = tl->n[k % tl->n_n], .cta_count = shape_cnt[k]};
        shape_group[k] = g++;
    }
    uint32_t *pages = (uint32_t *)(base + off_pages);
    for (uint32_t i = 0, at = 0; i < s->n_psrc; i++) {
        s->psrc[i].plan_off = at;
        memcpy(pages + at, s->psrc[i].src, (size_t)s->psrc[i].n * sizeof(uint32_t));
        at += s->psrc[i].n;
    }
    sched_plan_cta_t *ctas = (sched_plan_cta_t *)(base + off_ctas);
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        sched_plan_cta_t c = s->ctas[i];
        c.group = shape_group[c.group];
        ctas[key_cnt[KEYS - key[i]]++] = c;
    }
    sched_plan_seg_t *segs = (sched_plan_seg_t *)(base + off_segs);
    for (uint32_t i = 0; i < s->n_segs; i++) {
        const sched__seg_t *x = &s->segs[i];
        segs[i] = (sched_plan_seg_t){.kv_begin = x->kv_begin,
                                     .kv_end = x->kv_end,
                                     .page_begin = s->psrc[x->psrc].plan_off + x->poff,
                                     .row_lo = (uint16_t)x->row_lo,
                                     .row_hi = (uint16_t)x->row_hi};
    }
    /* merge entries in token order; rows name theirs */
    uint32_t *merge_of = s->tok_merge;
    for (uint32_t t = 0, m = 0; t < n_tokens; t++)
        merge_of[t] = cnt[t] > 1 ? m++ : SCHED_ROW_DIRECT;
    sched_plan_row_t *rows = (sched_plan_row_t *)(base + off_rows);
    memcpy(rows, s->rows, (size_t)s->n_rows * sizeof(sched_plan_row_t));
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        const sched_plan_cta_t *c = &s->ctas[i];
        for (uint32_t r = c->row_begin; r < c->row_begin + c->row_count; r++) {
            uint32_t t = rows[r].q_tok;
            if (cnt[t] == 1) {
                rows[r].dst = t;
                rows[r].merge = SCHED_ROW_DIRECT;
            } else {
                rows[r].dst = next[t]++;
                rows[r].merge = merge_of[t];
            }
        }
    }
    sched_plan_merge_t *merges = (sched_plan_merge_t *)(base + off_merges);
    for (uint32_t t = 0, m = 0; t < n_tokens; t++) {
        if (cnt[t] > 1)
            merges[m++] = (sched_plan_merge_t){
                .q_tok = t, .part_begin = next[t] - cnt[t], .part_count = cnt[t]};
    }
    s->st.last_model_ns = ns;
    s->st.plans++;
    s->st.last_plan_ns = pat_now_ns() - t0;
    *ret_plan = h;
    return 0;
}

/* ------------------------------------------------------------------ traffic */

void sched_plan_traffic(const sched_plan_hdr_t *h, uint32_t q_heads, uint32_t kv_heads,
                        uint32_t head_dim, uint32_t elt, sched_traffic_t *ret)
{
    const sched_plan_cta_t *ctas = sched_plan_ctas(h);
    uint64_t kv_tokens = 0, rows = 0;
    for (uint32_t i = 0; i < h->n_ctas; i++) {
        kv_tokens += ctas[i].kv_tokens;
        rows += ctas[i].row_count;
    }
    uint32_t group = q_heads / kv_heads;
    memset(ret, 0, sizeof(*ret));
    ret->kv = kv_tokens * kv_heads * 2ull * head_dim * elt;
    ret->q = rows * q_heads * (uint64_t)head_dim * elt;
    ret->partial = (uint64_t)h->n_partials * kv_heads * group * (head_dim + 2ull) * 4 * 2;
    /* every token's output is written once: by its one direct row or by its merge */
    uint64_t tokens = 0;
    const sched_plan_row_t *r = sched_plan_rows(h);
    for (uint32_t i = 0; i < h->n_rows; i++)
        tokens += r[i].merge == SCHED_ROW_DIRECT;
    tokens += h->n_merges;
    ret->o = tokens * q_heads * (uint64_t)head_dim * elt;
    ret->total = ret->kv + ret->q + ret->partial + ret->o;
}

void sched_query_centric_traffic(const sched_t *s, sched_traffic_t *ret)
{
    const sched_forest_t *f = s->forest;
    const sched__model_t *m = &s->mdl;
    uint64_t kv_tokens = 0, tokens = 0;
    for (uint32_t i = 0; i < f->n_in; i++) {
        const sched__query_t *q = &f->q[f->in_list[i]];
        /* one CTA per chunk of query tokens, reading [0, its largest causal limit) */
        for (uint32_t c = 0; c < q->n_new; c += m->tok_per_chunk) {
            uint32_t last = PAT_MIN(q->n_new, c + m->tok_per_chunk) - 1;
            kv_tokens += q->kv_len - q->n_new + last + 1;
        }
        tokens += q->n_new;
    }
    uint32_t kv_heads = s->cfg.kv_heads, q_heads = s->cfg.q_heads;
    memset(ret, 0, sizeof(*ret));
    ret->kv = kv_tokens * kv_heads * m->kv_tok;
    ret->q = tokens * q_heads * m->q_row;
    ret->o = tokens * q_heads * m->q_row;
    ret->total = ret->kv + ret->q + ret->o;
}
