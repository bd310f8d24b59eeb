/*
 * sched_plan.c — from the forest of a step to its plan: validation of the step's token rows, the
 * choice of packs (lazy: reused while the forest's structure is unchanged; AUTO: the least modelled
 * time of the finished plans of every policy), CTA chunking by rows (one segment per CTA) or, for
 * TREE, CTAs of block-diagonal segments along the prefix tree; causal clamps, the long-KV split of
 * segment lists, partial slots and the merge list, tile selection and launch order, serialized into
 * one flat buffer (sched_plan_fmt.h).
 *
 * Depends on sched_pack.c (the packs of each policy), sched_cost.c (the model that scores every
 * choice, and the chunk walk that cuts packs into CTAs) and sched_split.c (pass 2, the long-KV
 * split); none of them depends on this file.
 * TREE's model is the cost (sched__pre_cost) of the very CTAs build_tree cuts, so tree_cost, which
 * picks TREE's CTA size on it, lives here.
 *
 * Cost: linear in CTAs + segments + rows + pages + query tokens (TREE: + the path depth per
 * query); all vectors are kept across steps, so a steady-state step allocates nothing.
 */
#include "sched_cost.h"

#include "pat_base.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static const sched_tiles_t default_tiles = SCHED_TILES_DEFAULT;

static const char *const policy_names[] = {"auto", "bytes", "paper", "query", "tree"};

const char *sched_policy_name(sched_policy_t p)
{
    return (unsigned)p < PAT_ARRAY_SIZE(policy_names) ? policy_names[p] : "?";
}

int sched_policy_parse(const char *name)
{
    for (int i = 0; i < (int)PAT_ARRAY_SIZE(policy_names); i++)
        if (!strcmp(name, policy_names[i]))
            return i;
    return -1;
}

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

/* ------------------------------------------------------------------ life */

/* The tile n of a batch-invariant plan's CTAs: 1 + its index in t->n, 0 when t has none of
 * SCHED_INVARIANT_WINDOW tokens. */
static uint32_t invariant_n(const sched_tiles_t *t)
{
    for (uint32_t i = 0; i < t->n_n; i++)
        if (t->n[i] == SCHED_INVARIANT_WINDOW)
            return i + 1;
    return 0;
}

int sched_create(const sched_config_t *cfg, sched_t **ret)
{
    if (!cfg || !ret || cfg->max_queries == 0 || cfg->max_tokens == 0 || cfg->block_size == 0 ||
        cfg->q_heads == 0 || cfg->kv_heads == 0 || cfg->head_dim == 0 ||
        cfg->q_heads % cfg->kv_heads != 0 ||
        (cfg->kv_elt_bytes != 1 && cfg->kv_elt_bytes != 2 && cfg->kv_elt_bytes != 4) ||
        (cfg->q_elt_bytes != 0 && cfg->q_elt_bytes != 2 && cfg->q_elt_bytes != 4) ||
        (cfg->q_elt_bytes == 0 && cfg->kv_elt_bytes == 1) ||
        (unsigned)cfg->policy > SCHED_POLICY_TREE)
        return -EINVAL;
    const sched_tiles_t *t = cfg->tiles ? cfg->tiles : &default_tiles;
    uint32_t group = cfg->q_heads / cfg->kv_heads;
    if (!tiles_valid(t) || group > t->m[t->n_m - 1])
        return -EINVAL;
    if (cfg->invariant_chunk && (cfg->invariant_chunk % SCHED_INVARIANT_WINDOW ||
                                 SCHED_INVARIANT_WINDOW % cfg->block_size || !invariant_n(t)))
        return -EINVAL;
    if (cfg->invariant_cut > SCHED_INVARIANT_CUTS)
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
    sched__model_init(&s->mdl, cfg, t);
    s->tok_parts = pat_xcalloc(cfg->max_tokens, sizeof(uint32_t));
    s->node_tok = pat_xcalloc(2ull * cfg->max_queries + 1, sizeof(uint64_t));
    s->node_merged = pat_xcalloc(2ull * cfg->max_queries + 1, 1);
    s->tok_owner = pat_xcalloc(cfg->max_tokens, sizeof(uint32_t));
    s->tok_merge = pat_xcalloc(cfg->max_tokens, sizeof(uint32_t));
    s->row_map = pat_xcalloc(s->mdl.tok_per_chunk, sizeof(uint32_t));
    s->chunk_rows = pat_xcalloc(s->mdl.tok_per_chunk, sizeof(sched__row_t));
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
    free(s->inv_mem);
    free(s->inv_list);
    free(s->inv_chunk_end);
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

/* ------------------------------------------------------------------ pass 1: CTAs of the packs */

/* Appends to the pre-split segments the stretch [b, e) of `blocks`, b < e, read by the CTA's rows
 * [lo, hi). */
static void pseg_push(sched_t *s, uint32_t lo, uint32_t hi, uint32_t b, uint32_t e,
                      const uint32_t *blocks)
{
    sched__seg_add(s, &s->pseg, &s->n_pseg, &s->pseg_cap, lo, hi, b, e, blocks);
}

/* pseg_push of the stretch [b, e) read by the pre-split rows [row_begin + lo, row_begin + hi),
 * clamped to their largest causal limit; nothing when no row reaches it. */
static void pseg_add(sched_t *s, uint32_t row_begin, uint32_t lo, uint32_t hi, uint32_t b,
                     uint32_t e, const uint32_t *blocks)
{
    uint32_t lim = 0;
    for (uint32_t r = row_begin + lo; r < row_begin + hi; r++)
        lim = PAT_MAX(lim, s->prow[r].limit);
    e = PAT_MIN(e, lim);
    if (e > b)
        pseg_push(s, lo, hi, b, e, blocks);
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
    sched__cta_t *c = sched__cta_push(&s->pre, &s->n_pre, &s->pre_cap);
    c->row_begin = row_begin;
    c->row_count = s->n_prow - row_begin;
    c->seg_begin = seg_begin;
    c->seg_count = s->n_pseg - seg_begin;
    for (uint32_t i = seg_begin; i < s->n_pseg; i++)
        c->kv_tokens += s->pseg[i].kv_end - s->pseg[i].kv_begin;
    c->pack = pack;
}

typedef struct chunk_build {
    sched_t *s;
    const sched__packset_t *ps;
} chunk_build_t;

static void chunk_close(void *ctx, const sched__chunk_t *c)
{
    const chunk_build_t *b = ctx;
    sched_t *s = b->s;
    const sched_forest_t *f = s->forest;
    /* the pack's segment lies in the block table of its bottom node's representative */
    const uint32_t *blocks = f->q[f->node[b->ps->p[c->pack].bottom].rep].blocks;
    uint32_t row_begin = s->n_prow, seg_begin = s->n_pseg;
    pat_grow((void **)&s->prow, &s->prow_cap, s->n_prow + c->n_rows, sizeof(sched__row_t));
    memcpy(s->prow + row_begin, c->rows, (size_t)c->n_rows * sizeof(sched__row_t));
    s->n_prow += c->n_rows;
    pseg_push(s, 0, c->n_rows, c->kv_begin, c->kv_end, blocks); /* the walk clamped it */
    pre_close(s, c->pack, row_begin, seg_begin);
}

/* Pass 1 (packs): one pre-split CTA per chunk of each pack (sched__chunks_walk, the walk the
 * model counts), one segment read by all its rows. */
static void build_chunks(sched_t *s, const sched__packset_t *ps)
{
    chunk_build_t b = {.s = s, .ps = ps};
    const sched__chunk_visit_t v = {.chunk = chunk_close, .ctx = &b, .rows = s->chunk_rows};
    sched__chunks_walk(s, ps, &v);
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
            sched__row_t row = s->chunk_rows[r];
            if (row.limit > b) /* causal: rows that end before it read none of it */
                *sched__row_push(&s->prow, &s->n_prow, &s->prow_cap) = row;
        }
        pseg_add(s, r0, 0, s->n_prow - r0, b, e, f->q[n->rep].blocks);
        pre_close(s, pack, r0, seg0);
    }
    s->n_apart = 0;
}

/* Fills s->path with the nodes of query q's path, top first; returns their number. */
static uint32_t tree_path(sched_t *s, const sched__query_t *q)
{
    const sched_forest_t *f = s->forest;
    uint32_t plen = 0;
    for (uint32_t id = q->leaf; id != SCHED__ROOT; id = f->node[id].parent) {
        pat_grow((void **)&s->path, &s->path_cap, plen + 1, sizeof(uint32_t));
        s->path[plen++] = id;
    }
    for (uint32_t i = 0; i < plen / 2; i++) {
        uint32_t t = s->path[i];
        s->path[i] = s->path[plen - 1 - i];
        s->path[plen - 1 - i] = t;
    }
    return plen;
}

/* Moves the open segments of the TREE CTA at row_begin from the previous query's path to that of
 * the query whose first row is the CTA's row `at` (path in s->path, plen nodes): the nodes the
 * two share stay open, the others close (read by the rows up to `at`). Returns the new depth. */
static uint32_t tree_enter(sched_t *s, uint32_t m, uint32_t row_begin, uint32_t depth,
                           uint32_t plen, uint32_t at)
{
    uint32_t common = 0;
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
    return depth;
}

/* Pass 1 (TREE): the queries in DFS order (ps->q) cut into CTAs of at most ps->tree_tok query
 * tokens (tree_cost chose it); in DFS order the readers of every node are a run of rows, so each
 * CTA reads each node of its rows' paths once, as one segment. A stack holds the path of the
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
            uint32_t at = s->n_prow - row_begin;
            depth = tree_enter(s, m, row_begin, depth, tree_path(s, q), at);
            uint32_t take = PAT_MIN(q->n_new - tok, cap - at);
            uint32_t first_limit = q->kv_len - q->n_new + 1;
            for (uint32_t i = tok; i < tok + take; i++)
                *sched__row_push(&s->prow, &s->n_prow, &s->prow_cap) =
                    (sched__row_t){.q_tok = q->tok_off + i, .limit = first_limit + i};
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
            memcpy(s->chunk_rows, s->prow + row_begin, at * sizeof(sched__row_t));
        pre_close(s, cta, row_begin, seg_begin);
        tree_apart(s, cta++);
    }
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

/* ------------------------------------------------------------------ packs and their model */

/* AUTO's candidates, in the order ties are broken (the first listed wins). */
static const sched_policy_t auto_order[] = {SCHED_POLICY_BYTES, SCHED_POLICY_PAPER,
                                            SCHED_POLICY_QUERY, SCHED_POLICY_TREE};
#define N_AUTO (sizeof(auto_order) / sizeof(auto_order[0]))

/* TREE's model with CTAs of at most ps->tree_tok query tokens: the cost of the very CTAs pass 1
 * cuts, before any split. */
static void tree_cost_at(sched_t *s, sched__packset_t *ps)
{
    pre_build(s, ps);
    sched__pre_cost(s, ps);
}

static void tree_cost(sched_t *s, sched__packset_t *ps)
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

/* Packs the forest under pol into s->cand[pol] and models it. */
static void pack_model(sched_t *s, sched_policy_t pol)
{
    sched__packset_t *ps = &s->cand[pol];
    sched__pack_run(s, pol, ps);
    if (ps->tree)
        tree_cost(s, ps);
    else
        sched__packset_cost(s, ps);
}

/* Ensures s->cand[s->chosen] is a pack of the current forest (lazy: reused while the forest's
 * structure version is unchanged). Returns 1 when the packs were rebuilt (AUTO: every candidate,
 * chosen here on its pre-split model; build_partials then chooses again on the finished plans),
 * 0 when reused. */
static int pack_update(sched_t *s)
{
    uint64_t v = sched_forest_version(s->forest);
    if (s->chosen && s->pack_version == v) {
        s->st.pack_reuses++;
        s->st.last_pack_ns = 0;
        return 0;
    }
    uint64_t t0 = pat_now_ns();
    if (s->cfg.policy == SCHED_POLICY_AUTO) {
        int best = 0;
        for (size_t i = 0; i < N_AUTO; i++) {
            pack_model(s, auto_order[i]);
            if (!best || s->cand[auto_order[i]].ns < s->cand[best].ns)
                best = auto_order[i];
        }
        s->chosen = best;
    } else {
        pack_model(s, s->cfg.policy);
        s->chosen = s->cfg.policy;
    }
    s->pack_version = v;
    s->st.last_pack_ns = pat_now_ns() - t0;
    return 1;
}

/* ------------------------------------------------------------------ partials */

/* What a plan's CTA list adds up to, for the emit. */
typedef struct plan_sums {
    uint32_t n_tokens;   /* query token rows of the step (rows of Q and O) */
    uint32_t n_partials; /* partial slots of one KV head and q head */
    uint32_t n_merges;   /* tokens read by more than one CTA */
    double ns;           /* modelled time of one layer */
} plan_sums_t;

void sched__count_parts(sched_t *s, uint32_t n_tokens)
{
    memset(s->tok_parts, 0, (size_t)n_tokens * sizeof(uint32_t));
    for (uint32_t i = 0; i < s->n_ctas; i++)
        for (uint32_t r = 0; r < s->ctas[i].row_count; r++)
            s->tok_parts[s->rows[s->ctas[i].row_begin + r].q_tok]++;
}

/* Counts each token's CTAs (tok_parts) and gives each split token its first partial slot
 * (tok_owner): a token read by k > 1 CTAs gets k consecutive slots and a merge entry. */
static void count_partials(sched_t *s, plan_sums_t *sums)
{
    uint32_t *cnt = s->tok_parts, *next = s->tok_owner;
    sched__count_parts(s, sums->n_tokens);
    sums->n_partials = sums->n_merges = 0;
    for (uint32_t t = 0; t < sums->n_tokens; t++) {
        next[t] = sums->n_partials;
        if (cnt[t] > 1) {
            sums->n_partials += cnt[t];
            sums->n_merges++;
        }
    }
}

double sched__ctas_time(sched_t *s)
{
    if (s->n_ctas > s->cta_ns_cap) {
        s->cta_ns_cap = s->n_ctas + s->n_ctas / 2;
        free(s->cta_ns);
        free(s->cta_key);
        s->cta_ns = pat_xmalloc(s->cta_ns_cap * sizeof(double));
        s->cta_key = pat_xmalloc(s->cta_ns_cap);
    }
    return sched__ctas_ns(s, s->tok_parts);
}

/* Models each CTA's time (cta_ns) and the plan's makespan (sums->ns); after count_partials. */
static void time_ctas(sched_t *s, plan_sums_t *sums)
{
    sums->ns = sched__ctas_time(s);
}

/* Chunks, splits (fill: see build_split), counts partials and models the CTAs. Returns whether
 * the fill rule cut anything beyond the outlier split. */
static int ctas_build(sched_t *s, const sched__packset_t *ps, int fill, plan_sums_t *sums)
{
    pre_build(s, ps);
    int applied = sched__build_split(s, fill);
    count_partials(s, sums);
    time_ctas(s, sums);
    return applied;
}

/* The CTA list of a pack set with the fill split decided (see sched_build): 0, or -ENOSPC when
 * even the outlier splits need more partial slots than the backend holds. */
static int plan_ctas(sched_t *s, const sched__packset_t *ps, plan_sums_t *sums)
{
    /* The fill split is an optimization: it is kept only when it fits the backend's partial
     * slots and, with a cost model, when the model finds it faster than outlier splits alone
     * (measured: cutting 64 unshared 1K-token queries into 3 parts each was no faster and paid
     * for the merges). */
    /* TREE is never fill-split: its CTAs exist to read whole paths without partials, and cut
     * into parts they measured up to 2.4x their modelled time (H100, 256-query trees at 16/8
     * and 32/8); a TREE plan with too few work items loses to a pack plan on the model instead */
    int applied = ctas_build(s, ps, !ps->tree, sums);
    if (applied) {
        int fits = !s->cfg.max_partials || sums->n_partials <= s->cfg.max_partials;
        if (!fits || s->tiles.cost.slots) {
            double ns_fill = sums->ns;
            ctas_build(s, ps, 0, sums);
            if (fits && ns_fill < sums->ns) {
                ctas_build(s, ps, 1, sums);
                s->st.fill_kept++;
            } else {
                s->st.fill_dropped++;
            }
        } else {
            s->st.fill_kept++;
        }
    }
    return s->cfg.max_partials && sums->n_partials > s->cfg.max_partials ? -ENOSPC : 0;
}

/* ------------------------------------------------------------------ building */

/* The step's query token rows: inside max_tokens, no two queries on one row. Sets
 * sums->n_tokens (one past the last row used); -EINVAL otherwise. Uses tok_owner. */
static int build_validate(sched_t *s, plan_sums_t *sums)
{
    const sched_forest_t *f = s->forest;
    if (f->n_in == 0)
        return -ENODATA;
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
    sums->n_tokens = n_tokens;
    return 0;
}

/* The packs (reused or rebuilt and chosen) and the final CTA list with its partial slots. Returns
 * 0 or -ENOSPC (plan_ctas). Nothing is written to the arena. */
static int build_partials(sched_t *s, plan_sums_t *sums)
{
    int rebuilt = pack_update(s);
    if (rebuilt && s->cfg.policy == SCHED_POLICY_AUTO) {
        /* the packs' own model cannot see the long-KV split that follows them (measured: a
         * query-centric pack of 10 queries looked faster than the shared one before the split and
         * ran at 1.8x its time after it); choose on the modelled time of the finished plans (the
         * bytes without a time model: a TREE plan without partials before the split had more
         * after it than BYTES' on a shared 4K prompt) */
        double best_ns = INFINITY;
        for (size_t i = 0; i < N_AUTO; i++)
            if (plan_ctas(s, &s->cand[auto_order[i]], sums) == 0 && sums->ns < best_ns) {
                best_ns = sums->ns;
                s->chosen = auto_order[i];
            }
    }
    if (rebuilt)
        s->st.chosen[s->chosen]++;
    return plan_ctas(s, &s->cand[s->chosen], sums);
}

/* ------------------------------------------------------------------ emit */

#define KEYS 127u /* launch-order keys: 4 per octave of modelled ns */

static uint8_t time_key(double ns)
{
    int k = ns >= 1.0 ? (int)(log2(ns) * 4.0) : 0;
    return (uint8_t)(k > (int)KEYS ? (int)KEYS : k);
}

static uint32_t align16(uint32_t x)
{
    return (x + 15u) & ~15u;
}

/* The emit's plan of the buffer: tile shapes, launch order, array offsets. */
typedef struct emit {
    uint32_t n_groups, max_rows;
    uint32_t shape_cnt[SCHED_MAX_TILE_M * SCHED_MAX_TILE_N];   /* CTAs per shape */
    uint32_t shape_group[SCHED_MAX_TILE_M * SCHED_MAX_TILE_N]; /* shape -> index in groups[] */
    uint32_t key_at[KEYS + 1]; /* next launch slot per key, descending keys first */
    uint32_t off_groups, off_ctas, off_segs, off_rows, off_pages, off_merges, total;
} emit_t;

/* Tile shapes and launch order: CTAs sorted by modelled time, longest first (a counting sort on
 * a log scale: 4 keys per octave), so the long ones do not start in the last wave. */
static void emit_order(sched_t *s, emit_t *e)
{
    const sched_tiles_t *tl = &s->tiles;
    const uint32_t inv_n = s->cfg.invariant_chunk ? invariant_n(tl) : 0;
    uint8_t *key = s->cta_key;
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        sched__cta_t *c = &s->ctas[i];
        uint32_t rows = c->row_count * s->mdl.group;
        e->max_rows = PAT_MAX(e->max_rows, rows);
        c->shape = sched__pick_m(tl, rows) * tl->n_n +
                   (inv_n ? inv_n - 1 : sched__pick_n(tl, c->kv_tokens));
        e->shape_cnt[c->shape]++;
        key[i] = time_key(s->cta_ns[i]);
        e->key_at[KEYS - key[i]]++; /* descending */
    }
    for (uint32_t k = 0, at = 0; k <= KEYS; k++) {
        uint32_t n = e->key_at[k];
        e->key_at[k] = at;
        at += n;
    }
    for (uint32_t k = 0; k < tl->n_m * tl->n_n; k++)
        if (e->shape_cnt[k])
            e->shape_group[k] = e->n_groups++;
}

/* Offsets of the arrays; grows the arena to hold them. */
static void emit_layout(sched_t *s, const plan_sums_t *sums, emit_t *e)
{
    e->off_groups = align16(sizeof(sched_plan_hdr_t));
    e->off_ctas = align16(e->off_groups + e->n_groups * (uint32_t)sizeof(sched_plan_group_t));
    e->off_segs = align16(e->off_ctas + s->n_ctas * (uint32_t)sizeof(sched_plan_cta_t));
    e->off_rows = align16(e->off_segs + s->n_segs * (uint32_t)sizeof(sched_plan_seg_t));
    e->off_pages = align16(e->off_rows + s->n_rows * (uint32_t)sizeof(sched_plan_row_t));
    e->off_merges = align16(e->off_pages + s->n_pages * (uint32_t)sizeof(uint32_t));
    e->total = e->off_merges + sums->n_merges * (uint32_t)sizeof(sched_plan_merge_t);
    if (e->total > s->arena_cap) {
        free(s->arena);
        s->arena_cap = e->total + e->total / 2;
        s->arena = pat_xmalloc(s->arena_cap);
    }
}

static sched_plan_hdr_t *emit_header(sched_t *s, const plan_sums_t *sums, const emit_t *e)
{
    sched_plan_hdr_t *h = s->arena;
    memset(h, 0, sizeof(*h));
    h->magic = SCHED_PLAN_MAGIC;
    h->version = SCHED_PLAN_VERSION;
    h->total_bytes = e->total;
    h->block_size = s->mdl.bs;
    h->group = s->mdl.group;
    h->n_tokens = sums->n_tokens;
    h->n_groups = e->n_groups;
    h->n_ctas = s->n_ctas;
    h->n_segs = s->n_segs;
    h->off_segs = e->off_segs;
    h->n_rows = s->n_rows;
    h->n_pages = s->n_pages;
    h->n_merges = sums->n_merges;
    h->n_partials = sums->n_partials;
    h->off_groups = e->off_groups;
    h->off_ctas = e->off_ctas;
    h->off_rows = e->off_rows;
    h->off_pages = e->off_pages;
    h->off_merges = e->off_merges;
    h->max_cta_rows = e->max_rows;
    h->flags = s->cfg.invariant_chunk ? SCHED_PLAN_INVARIANT : 0;
    return h;
}

/* groups[], pages[] (each run copied once; sets psrc[].plan_off), ctas[] in launch order and
 * segs[] with their page indices. */
static void emit_ctas(sched_t *s, char *base, emit_t *e)
{
    const sched_tiles_t *tl = &s->tiles;
    sched_plan_group_t *groups = (sched_plan_group_t *)(base + e->off_groups);
    for (uint32_t k = 0; k < tl->n_m * tl->n_n; k++)
        if (e->shape_cnt[k])
            groups[e->shape_group[k]] = (sched_plan_group_t){
                .m = tl->m[k / tl->n_n], .n = tl->n[k % tl->n_n], .cta_count = e->shape_cnt[k]};
    uint32_t *pages = (uint32_t *)(base + e->off_pages);
    for (uint32_t i = 0, at = 0; i < s->n_psrc; i++) {
        s->psrc[i].plan_off = at;
        memcpy(pages + at, s->psrc[i].src, (size_t)s->psrc[i].n * sizeof(uint32_t));
        at += s->psrc[i].n;
    }
    sched_plan_cta_t *ctas = (sched_plan_cta_t *)(base + e->off_ctas);
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        const sched__cta_t *c = &s->ctas[i];
        ctas[e->key_at[KEYS - s->cta_key[i]]++] =
            (sched_plan_cta_t){.row_begin = c->row_begin,
                               .row_count = c->row_count,
                               .seg_begin = c->seg_begin,
                               .seg_count = c->seg_count,
                               .kv_tokens = c->kv_tokens,
                               .group = e->shape_group[c->shape],
                               .pack = c->pack};
    }
    sched_plan_seg_t *segs = (sched_plan_seg_t *)(base + e->off_segs);
    for (uint32_t i = 0; i < s->n_segs; i++) {
        const sched__seg_t *x = &s->segs[i];
        segs[i] = (sched_plan_seg_t){.kv_begin = x->kv_begin,
                                     .kv_end = x->kv_end,
                                     .page_begin = s->psrc[x->psrc].plan_off + x->poff,
                                     .row_lo = (uint16_t)x->row_lo,
                                     .row_hi = (uint16_t)x->row_hi};
    }
}

/* rows[] with their output (direct, or a partial slot and merge entry) and merges[] in token
 * order; after count_partials (tok_parts: CTAs per token, tok_owner: next slot per token). */
static void emit_rows(sched_t *s, char *base, const plan_sums_t *sums, const emit_t *e)
{
    const uint32_t *cnt = s->tok_parts;
    uint32_t *next = s->tok_owner, *merge_of = s->tok_merge;
    for (uint32_t t = 0, m = 0; t < sums->n_tokens; t++)
        merge_of[t] = cnt[t] > 1 ? m++ : SCHED_ROW_DIRECT;
    sched_plan_row_t *rows = (sched_plan_row_t *)(base + e->off_rows);
    for (uint32_t i = 0; i < s->n_ctas; i++) {
        const sched__cta_t *c = &s->ctas[i];
        for (uint32_t r = c->row_begin; r < c->row_begin + c->row_count; r++) {
            uint32_t t = s->rows[r].q_tok;
            int direct = cnt[t] == 1;
            rows[r] = (sched_plan_row_t){.q_tok = t,
                                         .limit = s->rows[r].limit,
                                         .dst = direct ? t : next[t]++,
                                         .merge = direct ? SCHED_ROW_DIRECT : merge_of[t]};
        }
    }
    sched_plan_merge_t *merges = (sched_plan_merge_t *)(base + e->off_merges);
    for (uint32_t t = 0, m = 0; t < sums->n_tokens; t++) {
        if (cnt[t] > 1)
            merges[m++] = (sched_plan_merge_t){
                .q_tok = t, .part_begin = next[t] - cnt[t], .part_count = cnt[t]};
    }
}

/* Serializes the CTA list into the arena (sched_plan_fmt.h). */
static const sched_plan_hdr_t *build_emit(sched_t *s, const plan_sums_t *sums)
{
    emit_t e = {0};
    emit_order(s, &e);
    emit_layout(s, sums, &e);
    sched_plan_hdr_t *h = emit_header(s, sums, &e);
    emit_ctas(s, (char *)h, &e);
    emit_rows(s, (char *)h, sums, &e);
    return h;
}

int sched_build(sched_t *s, const sched_plan_hdr_t **ret_plan)
{
    uint64_t t0 = pat_now_ns();
    plan_sums_t sums = {0};
    int r = build_validate(s, &sums);
    if (r < 0)
        return r;
    if (s->cfg.invariant_chunk) {
        sched__build_invariant(s, sums.n_tokens);
        count_partials(s, &sums);
        time_ctas(s, &sums);
        if (s->cfg.max_partials && sums.n_partials > s->cfg.max_partials)
            return -ENOSPC;
    } else if ((r = build_partials(s, &sums)) < 0) {
        return r; /* nothing written to the arena yet: the previous plan stands */
    }
    *ret_plan = build_emit(s, &sums);
    s->st.last_model_ns = sums.ns;
    s->st.plans++;
    s->st.last_plan_ns = pat_now_ns() - t0;
    return 0;
}
