/*
 * sched_cost.h — the scheduler's cost model (sched_cost.c), private to scheduler/: the bytes a CTA
 * moves, the time it takes (sched_tiles_t.cost), and the one walk over the CTAs ("chunks") that a
 * pack set produces. The model (sched__packset_cost) and the plan builder (sched_plan.c) both
 * take their chunks from sched__chunks_walk, so the modelled traffic of a pack set is the traffic
 * of the plan built from it, by construction.
 *
 * Thread context: that of the sched_t (one step executor). Nothing here fails or allocates.
 */
#ifndef SCHED_COST_H
#define SCHED_COST_H

#include "sched_int.h"

/* Derives the model constants from a validated config and tile table. */
void sched__model_init(sched__model_t *m, const sched_config_t *cfg, const sched_tiles_t *t);

/* Tile choice: the index in t->m of the smallest m that holds `rows` q-head rows (the largest
 * when none does), and the index in t->n of the n the decision table gives kv_tokens. Inline:
 * they run for every CTA of every candidate plan. */
static inline uint32_t sched__pick_m(const sched_tiles_t *t, uint32_t rows)
{
    for (uint32_t i = 0; i < t->n_m; i++)
        if (t->m[i] >= rows)
            return i;
    return t->n_m - 1; /* unreachable: chunks never exceed m_max rows */
}

static inline uint32_t sched__pick_n(const sched_tiles_t *t, uint32_t kv_tokens)
{
    for (uint32_t i = 0; i < t->n_n; i++)
        if (kv_tokens <= t->n_upto[i])
            return i;
    return t->n_n - 1;
}

/* BYTES' decision for child c of a segment of acc_tokens tokens: whether merging c (tokens query
 * tokens below it) into the segment saves more partial bytes than it re-reads KV bytes. A leaf
 * whose path had no split above saves twice (its query becomes one CTA writing its output). */
int sched__merge_pays(const sched_t *s, uint64_t tokens, uint64_t acc_tokens, int leaf_direct);

/* One chunk: a CTA of a pack before any long-KV split. */
typedef struct sched__chunk {
    uint32_t pack;             /* index in the pack set */
    uint32_t kv_begin, kv_end; /* the pack's segment, clamped to its rows' largest causal limit */
    uint32_t n_rows;           /* query tokens, <= tok_per_chunk */
    const sched__row_t *rows;  /* they, in order (NULL when the visit gave no buffer) */
} sched__chunk_t;

/* What sched__chunks_walk calls once per chunk; rows: a buffer of tok_per_chunk entries the walk
 * fills with each chunk's rows, or NULL when the visitor needs only their number. */
typedef struct sched__chunk_visit {
    void (*chunk)(void *ctx, const sched__chunk_t *c);
    void *ctx;
    sched__row_t *rows;
} sched__chunk_visit_t;

/* The chunks of a pack set (not TREE): each pack's query tokens that see any of its segment, in
 * the pack's order, cut into chunks of at most tok_per_chunk tokens; each chunk reads the segment
 * up to its rows' largest causal limit. */
void sched__chunks_walk(const sched_t *s, const sched__packset_t *ps,
                        const sched__chunk_visit_t *v);

/* Models a pack set (not TREE) before any long-KV split: ps->bytes and ps->ns. Uses tok_parts. */
void sched__packset_cost(sched_t *s, sched__packset_t *ps);

/* Models the pre-split CTAs s->pre (rows prow, segments pseg) as they stand: ps->bytes and ps->ns
 * (TREE's model: sched_plan.c cuts its CTAs, then asks). Uses tok_parts. */
void sched__pre_cost(sched_t *s, sched__packset_t *ps);

/* Models the plan's CTAs s->ctas (rows, segs), cnt[] giving each query token's CTAs (a token read
 * by more than one writes partials): each CTA's time into s->cta_ns (room for n_ctas), and
 * returns the plan's, one layer. */
double sched__ctas_ns(sched_t *s, const uint32_t *cnt);

#endif
