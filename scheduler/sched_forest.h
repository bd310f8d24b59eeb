/*
 * sched_forest.h — the prefix forest of the queries in a step, kept incrementally across steps.
 *
 * Queries that share leading physical KV blocks share a path. Internal node = a run of full
 * blocks shared by every query below it (`len` = blocks * block_size tokens, `size` = queries
 * below); leaf = one query's unshared suffix (its private full blocks and its partial last
 * block). A virtual root of length 0 holds the first-level nodes. Only full blocks are shared: a
 * block that is partial for a query is always in that query's leaf.
 *
 * Between steps the caller reports what changed: join (a query enters), leave, grow (its KV got
 * longer: decode or a prefill chunk). The structure version changes only when something the
 * pack depends on changes (internal nodes, leaf membership, a query's number of new tokens),
 * so a decode step that only lengthens leaves keeps the version and the pack is reused.
 *
 * Thread context: not thread-safe; one step executor owns it. Host OOM aborts (pat_base.h).
 */
#ifndef SCHED_FOREST_H
#define SCHED_FOREST_H

#include <stdint.h>

#define SCHED_NONE UINT32_MAX

typedef struct sched_forest sched_forest_t;

/* One query as the caller sees it this step. The block table is copied. */
typedef struct sched_query {
    const uint32_t *blocks; /* block table of the sequence */
    uint32_t n_blocks;      /* entries; >= ceil(kv_len / block_size) (reserved ones are ignored) */
    uint32_t kv_len;        /* KV tokens after this step's new tokens are written, >= 1 */
    uint32_t n_new;         /* query tokens this step: 1 for decode, more for prefill/extend */
    uint32_t tok_off;       /* index of its first query token in the step's Q/O rows */
    uint32_t table_version; /* changes when an entry of the table before its end changes
                             * (kvcache's kv_seq_info_t.version: a twin's copy shared at
                             * commit); 0 for callers whose tables only grow */
} sched_query_t;

/* Returns 0 or -EINVAL (block_size 0, max_queries 0). */
int sched_forest_create(uint32_t max_queries, uint32_t block_size, sched_forest_t **ret_forest);
void sched_forest_free(sched_forest_t *f); /* accepts NULL */

/* Query ids are the caller's slots, 0 .. max_queries-1. Errors: -EINVAL (bad id or fields:
 * kv_len 0, n_new 0 or > kv_len, too few blocks), -EEXIST (join of a present id), -ENOENT. */
int sched_forest_join(sched_forest_t *f, uint32_t qid, const sched_query_t *q);
int sched_forest_leave(sched_forest_t *f, uint32_t qid);
/* The KV grew (kv_len >= the previous one, blocks only appended); anything else is a leave and
 * a join. Errors as join, plus -EINVAL when kv_len shrank, the last full block changed or the
 * table_version differs from the one joined or grown with (an earlier entry changed). */
int sched_forest_grow(sched_forest_t *f, uint32_t qid, const sched_query_t *q);
/* 1 when sched_forest_grow(f, qid, q) would grow qid (present, kv_len not shrunk, the last full
 * block and the table_version unchanged), 0 when it would refuse with -ENOENT or -EINVAL for
 * those reasons (field errors aside): lets a caller that must not pay a join's walk of a whole
 * table ask first. Reads only. */
int sched_forest_grows(const sched_forest_t *f, uint32_t qid, const sched_query_t *q);
void sched_forest_clear(sched_forest_t *f);

uint64_t sched_forest_version(const sched_forest_t *f);
uint32_t sched_forest_n_queries(const sched_forest_t *f);
uint32_t sched_forest_n_nodes(const sched_forest_t *f); /* internal + leaves, not the root */
uint32_t sched_forest_depth(const sched_forest_t *f);   /* longest root-to-leaf node count */

/* Structural equality: same queries, same nodes (by block range, size and membership).
 * Returns 1 if equal, 0 if not (printing the first difference to stderr). */
int sched_forest_equal(const sched_forest_t *a, const sched_forest_t *b);
/* Verifies every invariant (sizes, keys, reps, shared blocks really shared). 0 or -EUCLEAN. */
int sched_forest_check(const sched_forest_t *f);

#endif
