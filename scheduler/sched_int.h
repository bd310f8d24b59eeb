/*
 * sched_int.h — scheduler internals: the types shared by sched_pack.c (packs), sched_cost.c (the
 * cost model) and sched_plan.c (the plan), and the state of a sched_t. Types and inline helpers
 * only; each file's functions are declared by its own header or section below.
 */
#ifndef SCHED_INT_H
#define SCHED_INT_H

#include <stddef.h>
#include <string.h>

#include "pat_base.h"
#include "sched_forest_int.h"
#include "sched_plan.h"

/* A pack: the queries q[q_begin, +q_count) read the KV of the path segment that starts at node
 * `top` and ends at node `bottom` (bottom a leaf: up to its query's kv_len). */
typedef struct sched__pack {
    uint32_t top, bottom;
    uint32_t q_begin, q_count;
} sched__pack_t;

typedef struct sched__packset {
    sched__pack_t *p;
    uint32_t n, cap;
    uint32_t *q;
    uint32_t nq, qcap;
    uint8_t tree;      /* TREE: no packs; q lists every query in DFS order (sched_plan.c cuts it) */
    uint32_t tree_tok; /* TREE: query tokens per CTA, the tile m the model chose / group */
    uint64_t bytes;    /* modelled bytes of one KV head, before any long-KV split: KV + Q +
                          partials (sched_cost.c), equal to those of the plan built from it */
    double ns;         /* modelled time of one layer, before any long-KV split (sched__tally_ns) */
} sched__packset_t;

/* Model constants derived once from the config. */
typedef struct sched__model {
    uint32_t bs, group, head_dim, elt;
    uint32_t m_max;         /* largest tile m */
    uint32_t tok_per_chunk; /* query tokens per CTA: m_max / group */
    uint64_t kv_tok;        /* bytes of K+V of one token of one KV head */
    uint64_t ic_row;        /* bytes of one fp32 partial row written and read back */
    uint64_t q_row;         /* bytes of one Q row (one q head) */
} sched__model_t;

/* A query token row of a CTA while the plan is built: sched_plan_row_t before its output slot
 * (dst, merge) is known. */
typedef struct sched__row {
    uint32_t q_tok; /* row of Q/O in the step */
    uint32_t limit; /* causal limit: attends to absolute positions < limit */
} sched__row_t;

/* A CTA while the plan is built (before and after the long-KV split): sched_plan_cta_t before its
 * tile shape is numbered among the plan's groups. */
typedef struct sched__cta {
    uint32_t row_begin, row_count; /* its rows in prow[] (pre-split) or rows[] */
    uint32_t seg_begin, seg_count; /* its segments in pseg[] (pre-split) or segs[] */
    uint32_t kv_tokens;            /* sum of its segments' lengths */
    uint32_t pack;                 /* pack it came from (diagnostics, split parts share it) */
    uint32_t shape;                /* emit: m index x n_n + n index in the tile table */
} sched__cta_t;

/* A KV segment of a CTA while the plan is built: sched_plan_seg_t with its pages still in their
 * source run (psrc[] index and the segment's first page within it). */
typedef struct sched__seg {
    uint32_t kv_begin, kv_end;
    uint32_t row_lo, row_hi; /* CTA rows, in query tokens */
    uint32_t psrc, poff;
} sched__seg_t;
/* the backend's item rule reads a segment as a sched_span_t (sched_tiles_t.item) */
_Static_assert(offsetof(sched__seg_t, kv_begin) == offsetof(sched_span_t, kv_begin) &&
                   offsetof(sched__seg_t, kv_end) == offsetof(sched_span_t, kv_end) &&
                   offsetof(sched__seg_t, row_lo) == offsetof(sched_span_t, row_lo) &&
                   offsetof(sched__seg_t, row_hi) == offsetof(sched_span_t, row_hi),
               "a segment starts as a span");

/* TREE: a node kept out of the CTA that reaches it, read in a CTA of its own by the rows [lo, hi)
 * of that CTA. */
typedef struct sched__apart {
    uint32_t node, lo, hi;
} sched__apart_t;

/* A run of page ids to copy into the plan: the block table of a pack's representative query. */
typedef struct sched__psrc {
    const uint32_t *src;
    uint32_t n;
    uint32_t plan_off; /* index in the plan's pages[] once laid out */
} sched__psrc_t;

struct sched {
    sched_config_t cfg;
    sched_tiles_t tiles;
    sched__model_t mdl;
    sched_forest_t *forest;
    sched__packset_t cand[5]; /* per policy; cand[0] unused */
    int chosen;               /* index into cand of the pack in use, 0 = none yet */
    uint64_t pack_version;    /* forest version the chosen pack was built for */
    uint64_t *node_tok;       /* per forest node: query tokens below (pack scratch) */
    uint8_t *node_merged;     /* per forest node: merged into its parent's segment */
    /* plan building */
    void *arena;
    uint32_t arena_cap;
    sched__cta_t *pre; /* CTAs before the long-KV split, their segments and rows */
    uint32_t n_pre, pre_cap;
    sched__seg_t *pseg;
    uint32_t n_pseg, pseg_cap;
    sched__row_t *prow;
    uint32_t n_prow, prow_cap;
    sched__cta_t *ctas; /* the plan's CTAs, segments and rows */
    uint32_t n_ctas, ctas_cap;
    sched__seg_t *segs;
    uint32_t n_segs, segs_cap;
    sched__row_t *rows;
    uint32_t n_rows, rows_cap;
    uint32_t *path; /* TREE: one query's nodes, top first */
    uint32_t path_cap;
    uint32_t *stk_node, *stk_lo; /* TREE: the open segments of a CTA (a path) */
    uint32_t stk_cap;
    sched__apart_t *apart; /* TREE: the current CTA's nodes kept apart */
    uint32_t n_apart, apart_cap;
    sched__row_t *chunk_rows; /* tok_per_chunk: the rows of one chunk (sched__chunks_walk), or
                                 TREE: of the CTA whose apart nodes are laid out */
    uint32_t *row_map;        /* split: a CTA's row -> its part's row (tok_per_chunk entries) */
    sched__psrc_t *psrc;      /* page runs of the pre-split CTAs, copied once into the plan */
    uint32_t n_psrc, psrc_cap;
    uint32_t n_pages;
    uint32_t *tok_parts; /* max_tokens: CTAs per query token, then next slot */
    uint32_t *tok_owner; /* max_tokens */
    uint32_t *tok_merge; /* max_tokens: merge entry of a split token */
    void *inv_mem;       /* invariant: the members of the CTA being built (sched_invariant.c) */
    uint32_t inv_mem_cap;
    void *inv_list; /* invariant: every chunk's members in DFS order, with their costs */
    uint32_t inv_n, inv_list_cap;
    uint32_t *inv_chunk_end; /* invariant: per chunk, one past its last member in inv_list */
    uint32_t inv_chunk_cap;
    uint32_t inv_pick; /* invariant: the cut rule (inv_cuts index) chosen for this forest version */
    uint8_t inv_packed;   /* invariant: cand[SCHED_POLICY_TREE].q is the DFS order of ... */
    uint64_t inv_version; /* ... this forest version */
    double *cta_ns;       /* modelled time per CTA of the plan being built */
    uint8_t *cta_key;     /* its launch-order key */
    uint32_t cta_ns_cap;
    sched_stats_t st;
};

/* Packs the forest under a policy (BYTES, PAPER, QUERY or TREE) into *out (sched_pack.c); the
 * caller models it (sched_cost.h; TREE: sched_plan.c, which cuts its CTAs). */
void sched__pack_run(sched_t *s, sched_policy_t pol, sched__packset_t *out);
void sched__packset_done(sched__packset_t *ps);

/* Token range of a pack's segment: [top start, bottom end) in absolute KV positions. */
static inline uint32_t sched__seg_begin(const sched_forest_t *f, const sched__pack_t *p)
{
    return f->node[p->top].start * f->bs;
}

/* One past the last KV position of node id: its end block, or its query's length for a leaf. */
static inline uint32_t sched__node_kv_end(const sched_forest_t *f, uint32_t id)
{
    const sched__node_t *n = &f->node[id];
    return sched__is_leaf(n) ? f->q[n->query].kv_len : sched__node_end(n) * f->bs;
}

static inline uint32_t sched__seg_end(const sched_forest_t *f, const sched__pack_t *p)
{
    return sched__node_kv_end(f, p->bottom);
}

/* Appends one zeroed element to a plan-building vector (host OOM aborts: pat_base.h). */
static inline sched__row_t *sched__row_push(sched__row_t **v, uint32_t *n, uint32_t *cap)
{
    pat_grow((void **)v, cap, *n + 1, sizeof(sched__row_t));
    return &(*v)[(*n)++];
}

static inline sched__cta_t *sched__cta_push(sched__cta_t **v, uint32_t *n, uint32_t *cap)
{
    pat_grow((void **)v, cap, *n + 1, sizeof(sched__cta_t));
    sched__cta_t *c = &(*v)[(*n)++];
    memset(c, 0, sizeof(*c));
    return c;
}

static inline sched__seg_t *sched__seg_push(sched__seg_t **v, uint32_t *n, uint32_t *cap)
{
    pat_grow((void **)v, cap, *n + 1, sizeof(sched__seg_t));
    return &(*v)[(*n)++];
}

/* Appends to the segment list *v the stretch [b, e) of `blocks`, b < e, read by the CTA's rows
 * [lo, hi). Pages are copied once, straight into the plan: the segment remembers the run. */
static inline void sched__seg_add(sched_t *s, sched__seg_t **v, uint32_t *n, uint32_t *cap,
                                  uint32_t lo, uint32_t hi, uint32_t b, uint32_t e,
                                  const uint32_t *blocks)
{
    const uint32_t bs = s->mdl.bs, p0 = b / bs, p1 = PAT_DIV_UP(e, bs);
    pat_grow((void **)&s->psrc, &s->psrc_cap, s->n_psrc + 1, sizeof(sched__psrc_t));
    s->psrc[s->n_psrc] = (sched__psrc_t){.src = blocks + p0, .n = p1 - p0};
    *sched__seg_push(v, n, cap) = (sched__seg_t){
        .kv_begin = b, .kv_end = e, .psrc = s->n_psrc++, .poff = 0, .row_lo = lo, .row_hi = hi};
    s->n_pages += p1 - p0;
}

/* sched_split.c: pass 2, the long-KV split of the pre-split CTAs into the final list. Returns
 * whether the min_ctas rule cut below the outlier split's limit (fill: apply that rule). */
int sched__build_split(sched_t *s, int fill);

/* sched_invariant.c: the CTAs, segments and rows of a batch-invariant plan (config
 * invariant_chunk), straight into the final lists, chunk by chunk (so that a token's partial
 * slots come in chunk order). */
void sched__build_invariant(sched_t *s, uint32_t n_tokens);

/* sched_plan.c: each of the step's n_tokens tokens' CTAs in the CTA list, into tok_parts */
void sched__count_parts(sched_t *s, uint32_t n_tokens);
/* sched_plan.c: the modelled time of the CTA list (ctas, segs, rows), each token's partial count
 * in tok_parts (sched__count_parts); fills cta_ns. */
double sched__ctas_time(sched_t *s);

#endif
