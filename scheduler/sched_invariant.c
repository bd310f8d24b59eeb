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
 * Sharing stays: the tokens of one chunk are taken in prefix-tree (DFS) order, and a run of
 * queries that share the chunk's first block is one CTA (up to a tile's rows), in which every
 * window whose blocks a run of its rows has in common is one segment, read once for all of them.
 * What it costs against the default plans: a window in which queries part is read once per
 * distinct content (up to 48 shared tokens again per branch), a chunk boundary is a partial
 * whether or not a split would pay, and no CTA is split to fill the device beyond its chunks.
 */
#include "sched_int.h"

/* A query's rows in the CTA being built: rows [lo, hi) of it are query qid's. */
typedef struct inv_member {
    uint32_t qid, lo, hi;
} inv_member_t;

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
static void cta_close(sched_t *s, uint32_t c, const inv_member_t *mem, uint32_t n,
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

void sched__build_invariant(sched_t *s)
{
    const sched_forest_t *f = s->forest;
    sched__packset_t *ps = &s->cand[SCHED_POLICY_TREE]; /* unused by a policy in this mode */
    const uint64_t v = sched_forest_version(f);
    if (!s->inv_packed || s->inv_version != v) {
        sched__pack_run(s, SCHED_POLICY_TREE, ps); /* the queries in DFS order */
        s->inv_packed = 1;
        s->inv_version = v;
        s->st.last_pack_ns = 0;
    } else {
        s->st.pack_reuses++;
    }
    s->n_ctas = s->n_segs = s->n_rows = s->n_psrc = s->n_pages = 0;
    const uint32_t C = s->cfg.invariant_chunk, cap = s->mdl.tok_per_chunk;
    uint32_t longest = 0;
    for (uint32_t i = 0; i < ps->nq; i++)
        longest = PAT_MAX(longest, f->q[ps->q[i]].kv_len);
    pat_grow((void **)&s->inv_mem, &s->inv_mem_cap, cap, sizeof(inv_member_t));
    inv_member_t *mem = s->inv_mem;
    for (uint32_t c = 0; (uint64_t)c * C < longest; c++) {
        const uint32_t cb = c * C;
        uint32_t n = 0, row_begin = s->n_rows;
        for (uint32_t i = 0; i < ps->nq; i++) {
            const sched__query_t *q = &f->q[ps->q[i]];
            if (q->kv_len <= cb)
                continue;
            /* its tokens whose causal limit passes cb: token k attends to [0, lim0 + k) */
            const uint32_t lim0 = q->kv_len - q->n_new + 1;
            uint32_t k = lim0 > cb ? 0 : cb + 1 - lim0;
            /* a query that does not share the chunk's first block with the CTA's last starts a
             * CTA of its own */
            if (n && f->q[mem[n - 1].qid].blocks[cb / f->bs] != q->blocks[cb / f->bs]) {
                cta_close(s, c, mem, n, row_begin);
                n = 0;
                row_begin = s->n_rows;
            }
            while (k < q->n_new) {
                if (s->n_rows - row_begin == cap) {
                    cta_close(s, c, mem, n, row_begin);
                    n = 0;
                    row_begin = s->n_rows;
                }
                const uint32_t take = PAT_MIN(q->n_new - k, cap - (s->n_rows - row_begin));
                mem[n++] = (inv_member_t){.qid = ps->q[i], .lo = s->n_rows, .hi = s->n_rows + take};
                pat_grow((void **)&s->rows, &s->rows_cap, s->n_rows + take, sizeof(sched__row_t));
                for (uint32_t t = 0; t < take; t++, k++)
                    s->rows[s->n_rows++] =
                        (sched__row_t){.q_tok = q->tok_off + k, .limit = lim0 + k};
            }
        }
        cta_close(s, c, mem, n, row_begin);
    }
}
