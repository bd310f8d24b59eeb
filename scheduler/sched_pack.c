/*
 * sched_pack.c — the pack scheduler: which queries read which stretch of shared KV together.
 *
 * Byte model (per KV head; all policies are scored with it):
 *   KV     a pack reads its segment once per CTA: seg_tokens * 2 * head_dim * elt * chunks, where
 *          chunks = ceil(tokens / (m_max / group)) — a pack with more rows than the largest tile
 *          re-reads its segment once per extra CTA;
 *   Q      each CTA loads its rows: rows * head_dim * elt;
 *   merge  a query token split over k > 1 CTAs writes k fp32 partials (o[head_dim], lse) per row
 *          and the merge reads them back: k * rows * (head_dim + 2) * 4 * 2; with k == 1 the CTA
 *          writes the output directly and pays nothing extra.
 *
 * Policies (TreeHeuristic shape: top-down, each child merged into its parent's segment or kept
 * separate; a separate child's queries join the parent's CTA):
 *   PAPER  PAT's rule: keep child c separate iff 4 * c.size < A (A = accumulated segment length
 *          in tokens); rows, GQA and tile overflow are ignored, as in the paper;
 *   BYTES  ours: merge iff the partial bytes saved exceed the KV bytes re-read, both exact under
 *          the model: saved = rows(c) * ic_row, doubled for a leaf whose path had no split above
 *          (merging it leaves the query a single CTA that writes its output directly); re-read =
 *          A * kv_tok * chunks(c). With GQA, rows are query tokens x group, so intermediates
 *          cost `group` times more than the paper assumes, and packing a short shared prefix
 *          can cost more than it saves — the paper's rule packs it anyway;
 *   QUERY  one pack per query over its whole path (the query-centric baseline);
 *   TREE   no packs: the queries in DFS order; the plan builder cuts them into CTAs of a tile's
 *          rows, each reading every node of its rows' paths once (sched_plan.c, build_tree);
 *   AUTO   runs BYTES, PAPER, QUERY and TREE and keeps the least modelled time of their
 *          finished plans (sched_plan.h: bytes and FLOPs against the device's measured rates, a
 *          fixed cost per CTA, a makespan over its resident slots), so the plan is never worse
 *          than either the paper's pack or no packing, under the model. Without a cost model
 *          (cpu) the time is the bytes.
 * Each run is linear in nodes + edges + the output (every query listed once per pack it is in).
 */
#include "sched_int.h"

#include "pat_base.h"

#include <string.h>

void sched__packset_done(sched__packset_t *ps)
{
    free(ps->p);
    free(ps->q);
    memset(ps, 0, sizeof(*ps));
}

static sched__pack_t *pack_open(sched__packset_t *ps, uint32_t top, uint32_t bottom)
{
    pat_grow((void **)&ps->p, &ps->cap, ps->n + 1, sizeof(sched__pack_t));
    sched__pack_t *p = &ps->p[ps->n++];
    p->top = top;
    p->bottom = bottom;
    p->q_begin = ps->nq;
    p->q_count = 0;
    return p;
}

/* Appends qid to the set's query list; a pack (p non-NULL) counts it. */
static inline void pack_add_query(sched__packset_t *ps, sched__pack_t *p, uint32_t qid)
{
    if (ps->nq == ps->qcap)
        pat_grow((void **)&ps->q, &ps->qcap, ps->nq + 1, sizeof(uint32_t));
    ps->q[ps->nq++] = qid;
    if (p)
        p->q_count++;
}

/* Appends every query below node id (its leaves) to pack index pi (SCHED_NONE: to the query list
 * alone, TREE's DFS order). */
static void add_subtree(const sched_forest_t *f, sched__packset_t *ps, uint32_t pi, uint32_t id)
{
    const sched__node_t *n = &f->node[id];
    if (sched__is_leaf(n)) {
        pack_add_query(ps, pi == SCHED_NONE ? NULL : &ps->p[pi], n->query);
        return;
    }
    for (uint32_t c = n->first_child; c != SCHED_NONE; c = f->node[c].next_sib)
        add_subtree(f, ps, pi, c);
}

typedef struct walk {
    sched_t *s;
    sched_policy_t pol;
    sched__packset_t *ps;
    uint64_t *tok;   /* query tokens below each node, filled once per run (BYTES only) */
    uint8_t *merged; /* per node: the decision taken for it as a child */
} walk_t;

static int merge_child(const walk_t *w, uint32_t c, uint64_t acc_tokens, int split_above)
{
    const sched_forest_t *f = w->s->forest;
    const sched__model_t *m = &w->s->mdl;
    const sched__node_t *cn = &f->node[c];
    if (w->pol == SCHED_POLICY_PAPER)
        return 4ull * cn->size >= acc_tokens;
    uint64_t tokens = w->tok[c];
    uint64_t rows = tokens * m->group;
    uint64_t chunks = PAT_DIV_UP(tokens, m->tok_per_chunk);
    uint64_t saved = rows * m->ic_row * ((sched__is_leaf(cn) && !split_above) ? 2 : 1);
    uint64_t reread = acc_tokens * m->kv_tok * chunks;
    return saved > reread;
}

/* Packs internal node u whose segment began at node top; acc = tokens of the segment above u. */
static void walk_node(const walk_t *w, uint32_t u, uint32_t top, uint64_t acc, int split_above)
{
    const sched_forest_t *f = w->s->forest;
    const sched__node_t *un = &f->node[u];
    uint64_t a = acc + (uint64_t)un->nblocks * f->bs;
    uint32_t own = SCHED_NONE; /* u's own pack, opened at the first separate child */
    for (uint32_t c = un->first_child; c != SCHED_NONE; c = f->node[c].next_sib) {
        const sched__node_t *cn = &f->node[c];
        w->merged[c] = (uint8_t)merge_child(w, c, a, split_above);
        if (w->merged[c]) {
            if (sched__is_leaf(cn))
                pack_add_query(w->ps, pack_open(w->ps, top, c), cn->query);
            else
                walk_node(w, c, top, a, split_above);
            continue;
        }
        if (own == SCHED_NONE) {
            pack_open(w->ps, top, u);
            own = w->ps->n - 1;
        }
        /* c starts a segment of its own; its queries also read u's segment (listed below) */
        if (sched__is_leaf(cn))
            pack_add_query(w->ps, pack_open(w->ps, c, c), cn->query);
        else
            walk_node(w, c, c, 0, 1);
    }
    if (own != SCHED_NONE) {
        /* u's pack lists the queries of every separate child, after those children's own
         * packs have appended theirs, so that its list is contiguous */
        sched__pack_t *p = &w->ps->p[own];
        p->q_begin = w->ps->nq;
        p->q_count = 0;
        for (uint32_t c = un->first_child; c != SCHED_NONE; c = f->node[c].next_sib)
            if (!w->merged[c])
                add_subtree(f, w->ps, own, c);
    }
}

static void fill_tokens(const sched_forest_t *f, uint32_t id, uint64_t *tok)
{
    const sched__node_t *n = &f->node[id];
    if (sched__is_leaf(n)) {
        tok[id] = f->q[n->query].n_new;
        return;
    }
    uint64_t t = 0;
    for (uint32_t c = n->first_child; c != SCHED_NONE; c = f->node[c].next_sib) {
        fill_tokens(f, c, tok);
        t += tok[c];
    }
    tok[id] = t;
}

/* Modelled bytes and time of a pack set (see the top of this file). Mirrors the plan builder's
 * chunking and causal clamps exactly, so for a plan without long-KV split the bytes equal the
 * plan's traffic (less the outputs, which every policy writes alike). The time is the makespan of
 * the chunks as work items (sched__item_ns); partial rows add their bytes to the sum, not to any
 * one item (they are known only once every chunk is counted). */
static void packset_cost(sched_t *s, sched__packset_t *ps)
{
    const sched_forest_t *f = s->forest;
    const sched__model_t *m = &s->mdl;
    uint32_t *cnt = s->tok_parts; /* CTAs per query token */
    uint64_t bytes = 0, items = 0;
    double sum_ns = 0, max_ns = 0;
    for (uint32_t i = 0; i < f->n_in; i++) {
        const sched__query_t *q = &f->q[f->in_list[i]];
        memset(cnt + q->tok_off, 0, (size_t)q->n_new * sizeof(uint32_t));
    }
    for (uint32_t pi = 0; pi < ps->n; pi++) {
        const sched__pack_t *p = &ps->p[pi];
        uint32_t seg_b = sched__seg_begin(f, p), seg_e = sched__seg_end(f, p);
        if (seg_e <= seg_b)
            continue;
        uint32_t in_chunk = 0, hi = 0;
        uint64_t rows = 0;
        for (uint32_t k = 0; k <= p->q_count; k++) {
            const sched__query_t *q = k < p->q_count ? &f->q[ps->q[p->q_begin + k]] : NULL;
            uint32_t n_new = q ? q->n_new : 1, first_limit = q ? q->kv_len - q->n_new + 1 : 0;
            for (uint32_t i = 0; i < n_new; i++) {
                if (q && first_limit + i <= seg_b)
                    continue;
                if (in_chunk == m->tok_per_chunk || (!q && in_chunk)) {
                    uint64_t kv = PAT_MIN(seg_e, hi) - seg_b;
                    uint32_t tn = s->tiles.n[sched__pick_n(&s->tiles, (uint32_t)kv)];
                    uint32_t tm = s->tiles.m[sched__pick_m(&s->tiles, in_chunk * m->group)];
                    double t =
                        sched__item_ns(s, kv, PAT_DIV_UP(kv, tn), tn, tm, in_chunk * m->group, 0);
                    uint32_t u = sched__item_units(s, tm);
                    bytes += kv * m->kv_tok;
                    sum_ns += u * t;
                    max_ns = t > max_ns ? t : max_ns;
                    items += u;
                    in_chunk = 0;
                    hi = 0;
                }
                if (!q)
                    break;
                hi = PAT_MAX(hi, first_limit + i);
                cnt[q->tok_off + i]++;
                in_chunk++;
                rows++;
            }
        }
        bytes += rows * m->group * m->q_row;
    }
    uint64_t partial_rows = 0;
    for (uint32_t i = 0; i < f->n_in; i++) {
        const sched__query_t *q = &f->q[f->in_list[i]];
        for (uint32_t t = q->tok_off; t < q->tok_off + q->n_new; t++)
            if (cnt[t] > 1)
                partial_rows += (uint64_t)cnt[t] * m->group;
    }
    bytes += partial_rows * m->ic_row;
    /* the partial bytes, spread over the items: the fixed cost is already counted per item */
    sum_ns += sched__item_ns(s, 0, 0, 0, 0, 0, (uint32_t)PAT_MIN(partial_rows, UINT32_MAX)) -
              sched__item_ns(s, 0, 0, 0, 0, 0, 0);
    ps->bytes = bytes;
    ps->ns = sched__makespan_ns(s, sum_ns * s->cfg.kv_heads, max_ns, items * s->cfg.kv_heads);
}

void sched__pack_run(sched_t *s, sched_policy_t pol, sched__packset_t *out)
{
    const sched_forest_t *f = s->forest;
    out->n = 0;
    out->nq = 0;
    out->tree = pol == SCHED_POLICY_TREE;
    if (out->tree) {
        /* no packs: the queries in DFS order, cut into CTAs by the plan builder */
        add_subtree(f, out, SCHED_NONE, SCHED__ROOT);
        sched__tree_cost(s, out);
        return;
    }
    if (pol == SCHED_POLICY_QUERY) {
        for (uint32_t i = 0; i < f->n_in; i++) {
            uint32_t qid = f->in_list[i], top = f->q[qid].leaf;
            while (f->node[top].parent != SCHED__ROOT)
                top = f->node[top].parent;
            pack_add_query(out, pack_open(out, top, f->q[qid].leaf), qid);
        }
    } else {
        uint64_t *tok = s->node_tok;
        if (pol == SCHED_POLICY_BYTES)
            fill_tokens(f, SCHED__ROOT, tok);
        walk_t w = {.s = s, .pol = pol, .ps = out, .tok = tok, .merged = s->node_merged};
        const sched__node_t *root = &f->node[SCHED__ROOT];
        for (uint32_t c = root->first_child; c != SCHED_NONE; c = f->node[c].next_sib) {
            if (sched__is_leaf(&f->node[c]))
                pack_add_query(out, pack_open(out, c, c), f->node[c].query);
            else
                walk_node(&w, c, c, 0, 0);
        }
    }
    packset_cost(s, out);
}

int sched__pack_update(sched_t *s)
{
    uint64_t v = sched_forest_version(s->forest);
    if (s->chosen && s->pack_version == v) {
        s->st.pack_reuses++;
        s->st.last_pack_ns = 0;
        return 0;
    }
    uint64_t t0 = pat_now_ns();
    if (s->cfg.policy == SCHED_POLICY_AUTO) {
        /* least modelled time; ties go to the policy listed first */
        static const sched_policy_t order[] = {SCHED_POLICY_BYTES, SCHED_POLICY_PAPER,
                                               SCHED_POLICY_QUERY, SCHED_POLICY_TREE};
        int best = 0;
        for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
            sched__pack_run(s, order[i], &s->cand[order[i]]);
            if (!best || s->cand[order[i]].ns < s->cand[best].ns)
                best = order[i];
        }
        s->chosen = best;
    } else {
        sched__pack_run(s, s->cfg.policy, &s->cand[s->cfg.policy]);
        s->chosen = s->cfg.policy;
    }
    s->pack_version = v;
    s->st.last_pack_ns = pat_now_ns() - t0;
    return 1;
}
