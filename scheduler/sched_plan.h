/*
 * sched_plan.h — patd's scheduler: from the prefix forest of a step to a plan (sched_plan_fmt.h).
 *
 *   1. pack   (sched_pack.c): group queries by shared prefix into packs with a memory-centric
 *             byte model, or (TREE) list them in prefix-tree order for CTAs of block-diagonal
 *             segments; reused while the forest's structure version is unchanged (lazy update);
 *   2. tiles  (sched_plan.c): rows = query tokens x GQA group; m = smallest compiled m >= rows
 *             (a pack with more rows than the largest m becomes several CTAs, each re-reading its
 *             KV); n from a decision table on the KV length;
 *   3. split: CTAs far longer than the step's mean are cut along KV into near-equal parts, and
 *             too few CTAs to fill the device are cut further when the time model says it pays;
 *   4. plan:  CTAs in launch order (longest modelled time first), rows, pages and the merge list,
 *             in one flat buffer.
 * Decisions are scored by a time model (sched_cost.c; sched_tiles_t.cost, measured per GPU): per
 * work item max(bytes / bandwidth share, FLOPs / tensor-rate share) + a fixed cost, and a makespan
 * over the device's resident slots; without a model (the cpu backend) by bytes.
 *
 * Thread context: one step executor owns a sched_t. Host OOM aborts; everything else returns 0 or
 * a negative errno and leaves the previous plan valid.
 */
#ifndef SCHED_PLAN_H
#define SCHED_PLAN_H

#include <stdint.h>

#include "sched_forest.h"
#include "sched_plan_fmt.h"

typedef enum sched_policy {
    SCHED_POLICY_AUTO = 0,  /* least modelled time of BYTES, PAPER, QUERY, TREE (the default) */
    SCHED_POLICY_BYTES = 1, /* our rule: exact bytes per decision, GQA rows and tile overflow */
    SCHED_POLICY_PAPER = 2, /* PAT's TreeHeuristic: merge child iff 4 * child.size >= len */
    SCHED_POLICY_QUERY = 3, /* query-centric: one pack per query over its whole KV (baseline) */
    SCHED_POLICY_TREE = 4,  /* queries in prefix-tree order, up to a tile's rows per CTA, each CTA
                               reading every node of its rows' paths once (block-diagonal
                               segments): no partials unless a CTA is split along KV */
} sched_policy_t;

/* "auto", "bytes", "paper", "query", "tree" (config keys, metrics labels, reports); "?" past them
 */
const char *sched_policy_name(sched_policy_t p);
/* The policy of one of those names, or -1 */
int sched_policy_parse(const char *name);

typedef struct sched_config {
    uint32_t max_queries; /* sequences per step */
    uint32_t max_tokens;  /* query tokens per step (rows of Q/O) */
    uint32_t block_size;  /* tokens per KV block */
    uint32_t q_heads, kv_heads, head_dim;
    uint32_t kv_elt_bytes; /* bytes per K/V element: 1 (fp8), 2 (fp16/bf16) or 4 (fp32) */
    uint32_t q_elt_bytes;  /* bytes per Q/O element: 2 or 4; 0 = kv_elt_bytes */
    sched_policy_t policy;
    const sched_tiles_t *tiles; /* NULL: sched_tiles_default() */
    uint32_t split_min_kv;      /* CTAs are split only above this many tokens; 0 = never split */
    uint32_t split_factor;      /* ... and above split_factor x the step's mean CTA length */
    uint32_t max_partials;      /* partial slots the backend's workspace holds; 0 = no bound */
    uint32_t invariant_chunk;   /* 0, or batch-invariant plans (sched_invariant.c): each query
                                   token's KV cut at multiples of this many tokens (a multiple of
                                   SCHED_INVARIANT_WINDOW), policy and split unused */
    uint32_t invariant_cut;     /* 0: where such a plan's CTAs end is the time model's pick; k in
                                   1..SCHED_INVARIANT_CUTS: rule k forced (benchmarks; without a
                                   time model rules 3-5, segment budgets, act as rule 2) */
} sched_config_t;

/* The rules an invariant plan's CTAs end by (sched_invariant.c; the result is the same) */
#define SCHED_INVARIANT_CUTS 5

typedef struct sched_stats {
    uint64_t plans;        /* plans built */
    uint64_t pack_reuses;  /* plans that reused the previous pack (lazy update) */
    uint64_t chosen[5];    /* packs built per policy actually used, indexed by sched_policy_t */
    uint64_t last_pack_ns; /* CPU time of the last pack (0 when reused) */
    uint64_t last_plan_ns; /* CPU time of the last whole plan build, pack included */
    double
        last_model_ns;  /* modelled GPU time of the last plan, one layer (bytes without a model) */
    uint64_t fill_kept; /* plans whose fill split the model kept */
    uint64_t fill_dropped;  /* plans whose fill split the model found slower and dropped */
    uint32_t invariant_cut; /* the cut rule (1..SCHED_INVARIANT_CUTS) of the last invariant plan */
} sched_stats_t;

/* Bytes a plan moves, per kind. */
typedef struct sched_traffic {
    uint64_t kv;      /* K and V read from the pool */
    uint64_t q;       /* Q read (once per CTA that uses a row) */
    uint64_t partial; /* fp32 partials written by CTAs and read by the merge */
    uint64_t o;       /* outputs written */
    uint64_t total;
} sched_traffic_t;

typedef struct sched sched_t;

const sched_tiles_t *sched_tiles_default(void);

/* Returns 0 or -EINVAL (a zero or inconsistent dimension, q_heads not a multiple of kv_heads,
 * group > largest tile m, bad tile table). */
int sched_create(const sched_config_t *cfg, sched_t **ret_sched);
void sched_free(sched_t *s); /* accepts NULL */

/* The forest of this scheduler: the caller joins, grows and removes queries through it. */
sched_forest_t *sched_forest(sched_t *s);

/* Builds the plan of the current forest. *ret_plan stays valid until the next successful build
 * or free; a failed build leaves the previous plan as it was. Returns 0, -ENODATA (no query),
 * -EINVAL (token rows overlap or exceed max_tokens), -ENOSPC (more partial slots than
 * max_partials: the caller shrinks the step). */
int sched_build(sched_t *s, const sched_plan_hdr_t **ret_plan);

void sched_get_stats(const sched_t *s, sched_stats_t *ret_stats);

/* Traffic of a plan for the given model dimensions, KV elements of kv_elt bytes, Q and O of q_elt
 * (sched_cost.c, as the next). */
void sched_plan_traffic(const sched_plan_hdr_t *plan, uint32_t q_heads, uint32_t kv_heads,
                        uint32_t head_dim, uint32_t kv_elt, uint32_t q_elt, sched_traffic_t *ret);
/* Traffic of the query-centric execution of the current forest (every query reads its whole KV,
 * no partials): the baseline every plan is measured against. */
void sched_query_centric_traffic(const sched_t *s, sched_traffic_t *ret);

#endif
