/*
 * kv_pool_int.h — the pool's internals shared by kv_pool.c (blocks, prefix cache, LRU) and
 * kv_seq.c (sequences). Not for other modules.
 */
#ifndef KV_POOL_INT_H
#define KV_POOL_INT_H

#include "kv_pool.h"
#include "pat_map.h"

enum { KV__FREE = 0, KV__USED = 1, KV__CACHED = 2 };

typedef struct kv__block {
    uint64_t hash;     /* chain hash when published, else 0 */
    uint64_t last_use; /* pool tick when it last became CACHED (LRU key) */
    uint64_t scope;    /* published: the scope of the sequence that published it (events) */
    uint32_t refcnt;   /* block-table references */
    uint32_t parent;   /* published predecessor in the chain, KV_NONE for a chain root */
    uint32_t nchild;   /* published blocks whose parent is this one */
    uint32_t heap_pos; /* index in the LRU heap, KV_NONE when not an evictable leaf */
    uint8_t state;     /* KV__FREE / KV__USED / KV__CACHED */
    uint8_t published;
} kv__block_t;

typedef struct kv__seq {
    uint32_t gen; /* generation of this slot, part of the id */
    uint8_t open;
    uint32_t len;      /* committed tokens */
    uint32_t n_blocks; /* block-table entries (reserved capacity / block_size) */
    uint32_t version;  /* bumped when a committed entry changes (a twin's copy shared) */
    uint64_t scope;    /* its chains' root: only sequences of the same scope share blocks */
    uint32_t blk_cap;  /* allocated entries of blocks[] and hashes[] */
    uint32_t *blocks;  /* block table */
    uint64_t *hashes;  /* chain hash of each full block (valid for i < len / block_size) */
    uint32_t *tokens;  /* token ids of the committed tokens */
    uint32_t tok_cap;
    /* intents: the chain hashes of its prompt's full blocks past the cached prefix, from block
     * intent_first on, each counted in the pool's intent map until committed (or the sequence
     * truncated or closed); registration stops where the map is full */
    uint64_t *intent;
    uint32_t intent_cap;
    uint32_t intent_first;
    uint32_t n_intent;    /* registered */
    uint32_t intent_done; /* released: intent[intent_done..n_intent) are outstanding */
} kv__seq_t;

struct kv_pool {
    kv_pool_config_t cfg;
    kv__block_t *blk;

    uint32_t *free_stack; /* FREE block ids; top at n_free */
    uint32_t n_free, n_used, n_cached;
    uint64_t n_logical; /* block-table entries over open sequences (kv_stats_t) */

    pat_map_t map;    /* prefix cache: chain hash -> published block */
    pat_map_t intent; /* chain hash -> open sequences about to write that block (at most
                         n_blocks hashes): what kv_seq_open_pending reports as pending */

    /* LRU: binary min-heap on last_use over CACHED blocks with nchild == 0 */
    uint32_t *heap;
    uint32_t heap_len;
    uint64_t tick;

    kv__seq_t *seq;
    uint32_t *seq_free; /* free slot stack */
    uint32_t n_seq_free;

    kv_stats_t st;
};

/* kv_pool.c */
uint32_t kv__map_find(const kv_pool_t *p, uint64_t key);
/* Takes one block (free list first, else evicts the LRU leaf); caller checked availability. */
uint32_t kv__block_take(kv_pool_t *p);
void kv__block_ref(kv_pool_t *p, uint32_t b);
void kv__block_unref(kv_pool_t *p, uint32_t b);
/* Publishes b under hash h with the given parent (KV_NONE for a root); returns 1 if published,
 * 0 if the hash was already present (a duplicate). */
int kv__publish(kv_pool_t *p, uint32_t b, uint64_t h, uint32_t parent, uint64_t scope);
uint64_t kv__chain_hash(const kv_pool_t *p, uint64_t parent, const uint32_t *tokens);

/* kv_seq.c */
kv__seq_t *kv__seq_get(const kv_pool_t *p, uint32_t id);

#endif
