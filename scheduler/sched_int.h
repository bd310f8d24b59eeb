/*
 * sched_int.h — scheduler internals shared by sched_pack.c and sched_plan.c.
 */
#ifndef SCHED_INT_H
#define SCHED_INT_H

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
    uint64_t bytes;    /* modelled bytes (sched__packset_bytes) */
    double ns; /* modelled time of one layer, before any long-KV split (sched__makespan_ns) */
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

/* A KV segment of a CTA while the plan is built: sched_plan_seg_t with its pages still in their
 * source run (psrc[] index and the segment's first page within it). */
typedef struct sched__seg {
    uint32_t kv_begin, kv_end;
    uint32_t psrc, poff;
    uint32_t row_lo, row_hi; /* CTA rows, in query tokens */
} sched__seg_t;

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
    sched_plan_cta_t *pre; /* CTAs before the long-KV split, their segments and rows */
    uint32_t n_pre, pre_cap;
    sched__seg_t *pseg;
    uint32_t n_pseg, pseg_cap;
    sched_plan_row_t *prow;
    uint32_t n_prow, prow_cap;
    sched_plan_cta_t *ctas; /* the plan's CTAs, segments and rows */
    uint32_t n_ctas, ctas_cap;
    sched__seg_t *segs;
    uint32_t n_segs, segs_cap;
    sched_plan_row_t *rows;
    uint32_t n_rows, rows_cap;
    uint32_t *path; /* TREE: one query's nodes, top first */
    uint32_t path_cap;
    uint32_t *stk_node, *stk_lo; /* TREE: the open segments of a CTA (a path) */
    uint32_t stk_cap;
    sched__apart_t *apart; /* TREE: the current CTA's nodes kept apart */
    uint32_t n_apart, apart_cap;
    sched_plan_row_t *chunk_rows; /* TREE: the rows of the CTA whose apart nodes are laid out */
    uint32_t *row_map;            /* split: a CTA's row -> its part's row (tok_per_chunk entries) */
    sched__psrc_t *psrc;          /* page runs of the pre-split CTAs, copied once into the plan */
    uint32_t n_psrc, psrc_cap;
    uint32_t n_pages;
    uint32_t *tok_parts; /* max_tokens: CTAs per query token, then next slot */
    uint32_t *tok_owner; /* max_tokens */
    uint32_t *tok_merge; /* max_tokens: merge entry of a split token */
    double *cta_ns;      /* modelled time per CTA of the plan being built */
    uint8_t *cta_key;    /* its launch-order key */
    uint32_t cta_ns_cap;
    sched_stats_t st;
};

/* The time model (sched_tiles_t.cost; sched_plan.c): modelled ns of one work item (a CTA for one
 * KV head) reading kv_tokens in `tiles` KV tiles of tn tokens with an m-row tile for `rows` query
 * rows, partial_rows of which write fp32 partials that a merge reads back; and the makespan of
 * n_items such items of total sum_ns and longest max_ns.
 * Without a cost model both are bytes (1 byte = 1 ns), so every comparison falls back to bytes. */
double sched__item_ns(const sched_t *s, uint64_t kv_tokens, uint64_t tiles, uint32_t tn, uint32_t m,
                      uint32_t rows, uint32_t partial_rows);
/* TREE's model before any split: bytes and time of its CTAs (sched_plan.c). */
void sched__tree_cost(sched_t *s, sched__packset_t *ps);
/* slots an item with an m-row tile holds (sched_tiles_t.pair_m); makespan sums are in slot units:
 * sum_ns of units x time, n_items of units */
uint32_t sched__item_units(const sched_t *s, uint32_t m);
double sched__makespan_ns(const sched_t *s, double sum_ns, double max_ns, uint64_t n_items);
uint32_t sched__pick_m(const sched_tiles_t *t, uint32_t rows);
uint32_t sched__pick_n(const sched_tiles_t *t, uint32_t kv_tokens);

/* Packs the forest under a policy (BYTES, PAPER or QUERY) into *out and models its bytes. */
void sched__pack_run(sched_t *s, sched_policy_t pol, sched__packset_t *out);
/* Ensures s->cand[s->chosen] is a pack of the current forest (lazy: reused if still valid).
 * Returns 1 when the packs were rebuilt (AUTO: every candidate, chosen on its pre-split model;
 * sched_build then chooses again on the finished plans), 0 when reused. */
int sched__pack_update(sched_t *s);
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

#endif
