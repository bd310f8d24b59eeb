/*
 * tl_world.h — random batches of sequences that share prefixes, as block tables: the input of
 * the forest, pack and backend tests and of the scheduler benchmark.
 *
 * A world is a few trees: each internal level is a run of shared full blocks, fan-out children
 * per node, and every leaf is one query with private blocks and a partial tail. Block ids are
 * unique per node, so sharing is exactly what the tree says. The logical KV of a query at
 * position t lives in block blocks[t / bs] at offset t % bs.
 */
#ifndef TL_WORLD_H
#define TL_WORLD_H

#include <stdint.h>

#include "tl_rng.h"

typedef struct tl_world_params {
    uint32_t bs;                         /* tokens per block */
    uint32_t trees;                      /* root subtrees (>= 1) */
    uint32_t depth_lo, depth_hi;         /* shared levels above the leaves (0 = no sharing) */
    uint32_t fanout_lo, fanout_hi;       /* children per internal node */
    uint32_t level_tok_lo, level_tok_hi; /* tokens per shared level (rounded up to blocks) */
    uint32_t leaf_tok_lo, leaf_tok_hi;   /* private tokens per query (>= 1) */
    uint32_t new_lo, new_hi;             /* query tokens per query (1 = decode) */
    uint32_t max_queries;
    uint32_t spare_blocks; /* extra block-table room per query for growth */
} tl_world_params_t;

typedef struct tl_query {
    uint32_t *blocks;
    uint32_t n_blocks, cap_blocks;
    uint32_t kv_len, n_new, tok_off;
} tl_query_t;

typedef struct tl_world {
    uint32_t bs;
    uint32_t n_q;
    tl_query_t *q;
    uint32_t next_block; /* block ids used: 0 .. next_block-1 */
    uint32_t n_tokens;   /* sum of n_new (tok_off are prefix sums) */
} tl_world_t;

void tl_world_gen(tl_world_t *w, tl_rng_t *r, const tl_world_params_t *p);
void tl_world_free(tl_world_t *w);
/* Recomputes tok_off as prefix sums of n_new and n_tokens. */
void tl_world_layout(tl_world_t *w);
/* Grows query i by n tokens (new private blocks as needed); n_new becomes n. */
void tl_world_grow(tl_world_t *w, uint32_t i, uint32_t n);

/* A batch around one probe query, for batch-invariance tests: the probe's KV is blocks 0 ..
 * ceil(probe_len / bs) - 1 in every batch (kv_len probe_len, n_new probe_new); up to max_others
 * other queries, each sharing a random number of full blocks (none to all) with the probe or with
 * an earlier one of them, then 1 .. other_tok_hi private tokens in blocks numbered from
 * first_block on (ids reused from batch to batch: a pool that holds a function of the id serves
 * every batch); 1 .. other_new_hi query tokens each; the probe at a random place of the order.
 * Returns the probe's index; w->next_block is one past the largest id used. */
uint32_t tl_world_probe(tl_world_t *w, tl_rng_t *r, uint32_t bs, uint32_t probe_len,
                        uint32_t probe_new, uint32_t max_others, uint32_t other_tok_hi,
                        uint32_t other_new_hi, uint32_t first_block);

#endif
