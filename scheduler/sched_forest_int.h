/*
 * sched_forest_int.h — forest internals shared by the pack and plan code of scheduler/.
 */
#ifndef SCHED_FOREST_INT_H
#define SCHED_FOREST_INT_H

#include "pat_map.h"
#include "sched_forest.h"

#define SCHED__ROOT 0u

typedef struct sched__node {
    uint32_t parent, first_child, next_sib, prev_sib;
    uint32_t start;   /* first block index of the node (its depth in blocks) */
    uint32_t nblocks; /* internal: shared full blocks; leaf: unused (derived from its query) */
    uint32_t rep;     /* a query below the node: its block table holds the node's blocks */
    uint32_t size;    /* queries below */
    uint32_t query;   /* leaf: its query; internal and root: SCHED_NONE */
    uint8_t keyed;    /* present in the child map under (parent, first block) */
    uint8_t live;
} sched__node_t;

typedef struct sched__query {
    uint8_t in;
    uint32_t leaf;
    uint32_t *blocks; /* copy of the first ceil(kv_len / bs) entries */
    uint32_t blk_cap;
    uint32_t n_blocks; /* ceil(kv_len / bs) */
    uint32_t nfull;    /* kv_len / bs */
    uint32_t kv_len, n_new, tok_off;
    uint32_t table_version; /* sched_query_t.table_version when joined or last grown */
} sched__query_t;

struct sched_forest {
    uint32_t bs, max_q;
    sched__node_t *node;
    uint32_t n_node_cap;
    uint32_t *node_free;
    uint32_t n_node_free;
    uint32_t n_live; /* nodes except the root */
    sched__query_t *q;
    uint32_t n_in;
    uint32_t *in_list; /* ids of present queries, unordered; in_pos[] indexes it */
    uint32_t *in_pos;
    pat_map_t map; /* child map: (parent << 32 | first block) -> child node */
    uint64_t version;
};

static inline int sched__is_leaf(const sched__node_t *n)
{
    return n->query != SCHED_NONE;
}

/* End block index of an internal node (exclusive). */
static inline uint32_t sched__node_end(const sched__node_t *n)
{
    return n->start + n->nblocks;
}

#endif
