/*
 * sched_pack.c — the pack scheduler: which queries read which stretch of shared KV together.
 *
 * Policies (TreeHeuristic shape: top-down, each child merged into its parent's segment or kept
 * separate; a separate child's queries join the parent's CTA):
 *   PAPER  PAT's rule: keep child c separate iff 4 * c.size < A (A = accumulated segment length
 *          in tokens); rows, GQA and tile overflow are ignored, as in the paper;
 *   BYTES  ours: merge iff the partial bytes saved exceed the KV bytes re-read, both exact under
 *          the byte model (sched_cost.c, sched__merge_pays): saved = rows(c) * ic_row, doubled for
 *          a leaf whose path had no split above (merging it leaves the query a single CTA that
 *          writes its output directly); re-read = A * kv_tok * chunks(c). With GQA, rows are query
 *          tokens x group, so intermediates cost `group` times more than the paper assumes, and
 *          packing a short shared prefix can cost more than it saves — the paper's rule packs it
 *          anyway;
 *   QUERY  one pack per query over its whole path (the query-centric baseline);
 *   TREE   no packs: the queries in DFS order; the plan builder cuts them into CTAs of a tile's
 *          rows, each reading every node of its rows' paths once (sched_plan.c, build_tree).
 * AUTO is no policy of this file: sched_plan.c runs the four above and keeps the least modelled
 * time of their finished plans.
 *
 * Depends on sched_cost.c (BYTES' rule) and the forest; the packs it returns are modelled and cut
 * into CTAs by its caller, sched_plan.c. Each run is linear in nodes + edges + the output (every
 * query listed once per pack it is in).
 */
#include "sched_cost.h"

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
    const sched__node_t *cn = &w->s->forest->node[c];
    if (w->pol == SCHED_POLICY_PAPER)
        return 4ull * cn->size >= acc_tokens;
    return sched__merge_pays(w->s, w->tok[c], acc_tokens, sched__is_leaf(cn) && !split_above);
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

void sched__pack_run(sched_t *s, sched_policy_t pol, sched__packset_t *out)
{
    const sched_forest_t *f = s->forest;
    out->n = 0;
    out->nq = 0;
    out->tree = pol == SCHED_POLICY_TREE;
    if (out->tree) {
        /* no packs: the queries in DFS order, cut into CTAs by the plan builder */
        add_subtree(f, out, SCHED_NONE, SCHED__ROOT);
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
}
