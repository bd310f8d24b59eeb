/*
 * sched_invariant.c — batch-invariant plans (sched_config_t.invariant_chunk = C).
 *
 * What a query token's output is made of depends on that token alone: its KV [0, limit) is cut at
 * the multiples of C into chunks, each chunk read as its 64-token windows [64w, 64w + 64) in
 * order (one online-softmax step per window), and the chunks' partials merged in chunk order; a
 * token of one chunk writes its output directly. Which other tokens share a CTA, how many, in
 * which order, what the tree around it looks like: none of it enters the token's arithmetic, as
 * long as the backend keeps its side (sched_plan_fmt.h, SCHED_PLAN_INVARIANT).
 *
 * Sharing stays: the tokens of one chunk are taken in prefix-tree (DFS) order and cut into CTAs of
 * consecutive queries, in which every window whose blocks a run of its rows has in common is one
 * segment, read once for all of them. Where a CTA ends is free (it changes no token's
 * arithmetic), so it is chosen for speed: at a tile's rows and, with a time model, by the one of
 * a few cut rules whose plan the model finds fastest (kept while the forest's structure is
 * unchanged): a budget of segments (tiles) per CTA, or a CTA per run of queries that share. A
 * small budget cuts a CTA where its queries part, each part reading the shared windows again, so
 * that a chunk whose queries share little becomes many short CTAs instead of a few long ones.
 * What it costs against the default plans: a window in which queries part is read once per
 * distinct content (up to 48 shared tokens again per branch), a chunk boundary is a partial
 * whether or not a split would pay, and no CTA is split along KV within a chunk.
 */
#include "sched_int.h"

/* A chunk's query tokens [k_lo, k_hi) of query qid, in DFS order: the segments it adds to a CTA
 * after the member before it (inc) or as a CTA's first (full). */
typedef struct inv_member {
    uint32_t qid, k_lo, k_hi, inc, full;
} inv_member_t;

/* A member placed in the CTA being built: its rows [lo, hi). */
typedef struct inv_placed {
    uint32_t qid, lo, hi;
} inv_placed_t;

/* The cuts tried: a budget of segments per CTA as a fraction of (the plan's tiles x KV heads /
 * the device's slots), 0 = none; part: also end a CTA before a member that shares no window with
 * the one before it (costs no tile, adds a CTA); the second is the one without a model. */
static const struct {
    uint32_t div, part;
} inv_cuts[] = {{0, 0}, {0, 1}, {1, 1}, {2, 1}, {4, 1}};
#define INV_N_CUTS (sizeof(inv_cuts) / sizeof(inv_cuts[0]))
_Static_assert(INV_N_CUTS == SCHED_INVARIANT_CUTS, "the cut rules sched_plan.h counts");

/* Whether queries a and b hold the same KV in the window [w, e) (e: a's end there). */
static int same_window(const sched_forest_t *f, const sched__query_t *a, const sched__query_t *b,
                       uint32_t w, uint32_t e)
{
    if (PAT_MIN(b->kv_len, w + SCHED_INVARIANT_WINDOW) != e)
        return 0;
    for (uint32_t k = w / f->bs; k < PAT_DIV_UP(e, f->bs); k++)
        if (a->blocks[k] != b->blocks[k])
            return 0;
    return 1;
}

/* Closes the CTA of chunk c over the members mem[0, n) (rows [row_begin, n_rows)): its windows
 * in order, in each one segment per run of consecutive members holding the same blocks. */
static void cta_close(sched_t *s, uint32_t c, const inv_placed_t *mem, uint32_t n,
                      uint32_t row_begin)
{
    if (n == 0)
        return;
    const sched_forest_t *f = s->forest;
    const uint32_t W = SCHED_INVARIANT_WINDOW, cb = c * s->cfg.invariant_chunk;
    uint32_t end = 0;
    for (uint32_t i = 0; i < n; i++)
        end = PAT_MAX(end, f->q[mem[i].qid].kv_len);
    end = PAT_MIN(end, cb + s->cfg.invariant_chunk);
    sched__cta_t *cta = sched__cta_push(&s->ctas, &s->n_ctas, &s->ctas_cap);
    cta->row_begin = row_begin;
    cta->row_count = s->n_rows - row_begin;
    cta->seg_begin = s->n_segs;
    cta->pack = c;
    for (uint32_t w = cb; w < end; w += W) {
        for (uint32_t i = 0; i < n;) {
            const sched__query_t *q = &f->q[mem[i].qid];
            if (q->kv_len <= w) {
                i++;
                continue;
            }
            uint32_t e = PAT_MIN(q->kv_len, w + W), j = i + 1;
            while (j < n && same_window(f, q, &f->q[mem[j].qid], w, e))
                j++;
            sched__seg_add(s, &s->segs, &s->n_segs, &s->segs_cap, mem[i].lo - row_begin,
                           mem[j - 1].hi - row_begin, w, e, q->blocks);
            cta->kv_tokens += e - w;
            i = j;
        }
    }
    cta->seg_count = s->n_segs - cta->seg_begin;
}

/* The members of every chunk, chunk by chunk (*chunk_end[c]: one past chunk c's last), with
 * their costs; returns how many segments the plan would have if no CTA were ever cut (a tile's
 * rows cut some anyway, so the plans built have more: the budgets start from this count). */
static uint64_t list_members(sched_t *s, const sched__packset_t *ps, uint32_t n_chunks,
                             int *ret_any_part)
{
    const sched_forest_t *f = s->forest;
    const uint32_t C = s->cfg.invariant_chunk, W = SCHED_INVARIANT_WINDOW;
    uint64_t tiles = 0;
    s->inv_n = 0;
    for (uint32_t c = 0; c < n_chunks; c++) {
        const uint32_t cb = c * C;
        const sched__query_t *prev = NULL;
        for (uint32_t i = 0; i < ps->nq; i++) {
            const sched__query_t *q = &f->q[ps->q[i]];
            if (q->kv_len <= cb)
                continue;
            /* its tokens whose causal limit passes cb: token k attends to [0, lim0 + k) */
            const uint32_t lim0 = q->kv_len - q->n_new + 1;
            const uint32_t k = lim0 > cb ? 0 : cb + 1 - lim0;
            const uint32_t end = PAT_MIN(q->kv_len, cb + C);
            uint32_t full = 0, inc = 0;
            for (uint32_t w = cb; w < end; w += W, full++)
                inc += !prev || prev->kv_len <= w ||
                       !same_window(f, prev, q, w, PAT_MIN(prev->kv_len, w + W));
            pat_grow((void **)&s->inv_list, &s->inv_list_cap, s->inv_n + 1, sizeof(inv_member_t));
            ((inv_member_t *)s->inv_list)[s->inv_n++] = (inv_member_t){
                .qid = ps->q[i], .k_lo = k, .k_hi = q->n_new, .inc = inc, .full = full};
            tiles += inc;
            *ret_any_part |= prev && inc && inc == full; /* the part rule would cut here */
            prev = q;
        }
        s->inv_chunk_end[c] = s->inv_n;
    }
    return tiles;
}

/* The plan's CTAs, at most a tile's rows each, and at most `budget` segments where a CTA has more
 * than one member (UINT32_MAX: no budget); part: a member sharing nothing with the one before it
 * starts a CTA. A member that adds no segment never ends one. Returns the most segments a CTA
 * got (a budget at least that cuts nothing more). */
static uint32_t build_groups(sched_t *s, uint32_t n_chunks, uint32_t budget, uint32_t part)
{
    uint32_t most = 0;
    const sched_forest_t *f = s->forest;
    const inv_member_t *list = s->inv_list;
    const uint32_t cap = s->mdl.tok_per_chunk;
    s->n_ctas = s->n_segs = s->n_rows = s->n_psrc = s->n_pages = 0;
    pat_grow((void **)&s->inv_mem, &s->inv_mem_cap, cap, sizeof(inv_placed_t));
    inv_placed_t *mem = s->inv_mem;
    for (uint32_t c = 0, m = 0; c < n_chunks; c++) {
        uint32_t n = 0, row_begin = s->n_rows, cost = 0;
        for (; m < s->inv_chunk_end[c]; m++) {
            const inv_member_t *me = &list[m];
            const sched__query_t *q = &f->q[me->qid];
            const uint32_t lim0 = q->kv_len - q->n_new + 1;
            for (uint32_t k = me->k_lo; k < me->k_hi;) {
                const int over = me->inc && k == me->k_lo &&
                                 (cost + me->inc > budget || (part && me->inc == me->full));
                if (n && (s->n_rows - row_begin == cap || over)) {
                    cta_close(s, c, mem, n, row_begin);
                    most = PAT_MAX(most, cost);
                    n = cost = 0;
                    row_begin = s->n_rows;
                }
                cost += n ? me->inc : me->full;
                const uint32_t take = PAT_MIN(me->k_hi - k, cap - (s->n_rows - row_begin));
                mem[n++] = (inv_placed_t){.qid = me->qid, .lo = s->n_rows, .hi = s->n_rows + take};
                pat_grow((void **)&s->rows, &s->rows_cap, s->n_rows + take, sizeof(sched__row_t));
                for (uint32_t t = 0; t < take; t++, k++)
                    s->rows[s->n_rows++] =
                        (sched__row_t){.q_tok = q->tok_off + k, .limit = lim0 + k};
            }
        }
        cta_close(s, c, mem, n, row_begin);
        most = PAT_MAX(most, cost);
    }
    return most;
}

void sched__build_invariant(sched_t *s, uint32_t n_tokens)
{
    const sched_forest_t *f = s->forest;
    sched__packset_t *ps = &s->cand[SCHED_POLICY_TREE]; /* unused by a policy in this mode */
    const uint64_t v = sched_forest_version(f);
    const int fresh = !s->inv_packed || s->inv_version != v;
    if (fresh) {
        sched__pack_run(s, SCHED_POLICY_TREE, ps); /* the queries in DFS order */
        s->inv_packed = 1;
        s->inv_version = v;
        s->st.last_pack_ns = 0;
    } else {
        s->st.pack_reuses++;
    }
    const uint32_t C = s->cfg.invariant_chunk;
    uint32_t longest = 0;
    for (uint32_t i = 0; i < ps->nq; i++)
        longest = PAT_MAX(longest, f->q[ps->q[i]].kv_len);
    const uint32_t n_chunks = PAT_DIV_UP(longest, C);
    pat_grow((void **)&s->inv_chunk_end, &s->inv_chunk_cap, n_chunks, sizeof(uint32_t));
    int any_part = 0;
    const uint64_t tiles = list_members(s, ps, n_chunks, &any_part);
    const sched_cost_t *cost = &s->tiles.cost;
    if (!cost->slots && !s->cfg.invariant_cut) { /* no time model (the cpu backend): a CTA per
                                                     run of queries that share */
        (void)build_groups(s, n_chunks, UINT32_MAX, 1);
        s->st.invariant_cut = 2;
        return;
    }
    /* each cut's budget: tiles x heads / (slots x div), at least one segment */
    uint32_t budget[INV_N_CUTS];
    for (uint32_t i = 0; i < INV_N_CUTS; i++) {
        const uint64_t b =
            inv_cuts[i].div && cost->slots
                ? PAT_DIV_UP(tiles * s->cfg.kv_heads, (uint64_t)cost->slots * inv_cuts[i].div)
                : UINT32_MAX;
        budget[i] = (uint32_t)PAT_MIN(b, UINT32_MAX);
    }
    if (s->cfg.invariant_cut) /* forced */
        s->inv_pick = s->cfg.invariant_cut - 1;
    if (s->cfg.invariant_cut || (!fresh && s->inv_pick < INV_N_CUTS)) {
        s->st.invariant_cut = s->inv_pick + 1;
        (void)build_groups(s, n_chunks, budget[s->inv_pick], inv_cuts[s->inv_pick].part);
        return;
    }
    /* each rule priced, but for one that would build the plan of an earlier one: the part rule
     * where no member shares nothing with the one before it, a budget that no CTA of the part
     * rule's plan reaches (its CTAs could not be cut further) */
    double best = 0;
    uint32_t pick = 0, built = 0, most_part = UINT32_MAX;
    for (uint32_t i = 0; i < INV_N_CUTS; i++) {
        const int same = (i == 1 && !any_part) || (i >= 2 && budget[i] >= most_part);
        if (!same) {
            const uint32_t most = build_groups(s, n_chunks, budget[i], inv_cuts[i].part);
            built = i;
            if (i == 0) /* the model reads each token's partials: one per chunk, whatever rule */
                sched__count_parts(s, n_tokens);
            const double ns = sched__ctas_time(s);
            if (i == 0 || ns < best) {
                best = ns;
                pick = i;
            }
            if (i <= 1) /* rule 0's stands for rule 1's where they are the same plan */
                most_part = most;
        }
    }
    s->inv_pick = pick;
    s->st.invariant_cut = pick + 1;
    if (pick != built)
        (void)build_groups(s, n_chunks, budget[pick], inv_cuts[pick].part);
}
