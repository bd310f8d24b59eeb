/*
 * kv_pool.h — host bookkeeping of patd's paged KV cache: the block pool, sequences and the
 * prefix cache. The memory the blocks name belongs to a backend (device or host); this module
 * only decides which block holds which tokens, and never touches sockets or kernels.
 *
 * Block states (every block is in exactly one):
 *   FREE    refcount 0, not in the prefix cache, on the free list;
 *   USED    refcount > 0 (referenced by the block tables of open sequences);
 *   CACHED  refcount 0 but published in the prefix cache, reclaimable (LRU, leaves first).
 *   n_free + n_used + n_cached == n_blocks at all times.
 *
 * A full block is published (keyed by a chained xxh3 hash of parent hash, its token ids and the
 * model id) when the commit that completes it says its KV has been written. A chain is published
 * only as a prefix: a block is published iff its predecessor in the same sequence is, so a
 * CACHED block never has a USED descendant and every CACHED block is reclaimable. Hence the
 * blocks available to a reservation are exactly n_free + n_cached, and an operation that needs
 * more returns -ENOSPC before it changes anything (cache contents included).
 *
 * Thread context: not thread-safe; the daemon calls it from one thread (its step executor).
 * Errors: every call returns 0 or a negative errno; on failure nothing has changed.
 */
#ifndef KV_POOL_H
#define KV_POOL_H

#include <stdint.h>

#define KV_NONE           UINT32_MAX
#define KV_MAX_BLOCK_SIZE 256u /* tokens per block; bounds the hash input on the stack */
#define KV_SEQ_SLOT_BITS  20u  /* sequence id = generation << 20 | slot */
#define KV_MAX_SEQS       (1u << KV_SEQ_SLOT_BITS)
#define KV_MAX_BLOCKS     (1u << 31) /* ids stay far from KV_NONE */

typedef struct kv_pool kv_pool_t;

typedef enum kv_event_type {
    KV_EVENT_STORED = 1,  /* a block was published in the prefix cache */
    KV_EVENT_EVICTED = 2, /* a cached block was reclaimed for reuse */
} kv_event_type_t;

/* Called synchronously from inside the pool; must not call back into the pool. scope: the scope
 * of the sequences the block serves (kv_seq_open_scoped), so that an event reaches only those
 * who may know of it. */
typedef void (*kv_event_fn)(void *ud, kv_event_type_t type, uint32_t block, uint64_t hash,
                            uint64_t scope, uint32_t parent);
/* (parent: STORED's published predecessor in its chain, KV_NONE for a chain root; EVICTED: the
 * one it had) */

typedef struct kv_pool_config {
    uint32_t n_blocks;    /* capacity in blocks, 1..KV_MAX_BLOCKS */
    uint32_t block_size;  /* tokens per block, 1..KV_MAX_BLOCK_SIZE */
    uint32_t max_seqs;    /* open sequences at once, 1..KV_MAX_SEQS */
    uint32_t max_seq_len; /* tokens per sequence, >= 1 */
    uint64_t model_id;    /* mixed into every chain hash: caches of two models never match */
    kv_event_fn on_event; /* optional */
    void *event_ud;
} kv_pool_config_t;

typedef struct kv_stats {
    uint32_t n_blocks, n_free, n_used, n_cached;
    uint32_t n_evictable;  /* cached blocks that are LRU leaves right now */
    uint32_t n_seqs;       /* open sequences */
    uint64_t hit_blocks;   /* prompt blocks found in the prefix cache at open */
    uint64_t miss_blocks;  /* full prompt blocks not found (and so to be prefilled) */
    uint64_t query_tokens; /* prompt tokens of every open, the tokens looked up in the cache; of
                            * those, hit_blocks x block_size were found */
    uint64_t published;    /* blocks stored in the prefix cache */
    uint64_t duplicates;   /* full blocks a twin had published first: shared, ours freed */
    uint64_t evictions;
    /* block-table entries over the open sequences: the blocks they would hold without sharing
     * (n_logical - n_used is what prefix sharing and fork save), kept as a counter */
    uint64_t n_logical;
} kv_stats_t;

/* A block copy the backend must perform before the destination is read (copy-on-write). */
typedef struct kv_copy {
    uint32_t src; /* KV_NONE when there is nothing to copy */
    uint32_t dst;
} kv_copy_t;

/* A read-only view of one sequence; pointers valid until the next call that changes it. */
typedef struct kv_seq_info {
    uint32_t len;      /* committed tokens (KV written) */
    uint32_t capacity; /* tokens the block table can hold (n_blocks * block_size) */
    uint32_t n_blocks;
    uint32_t version;       /* changes when an entry before the last one changes (kv_seq_commit
                             * sharing a twin's published copy): a cached copy of the table is stale */
    const uint32_t *blocks; /* block table: logical block i -> physical block id */
} kv_seq_info_t;

/* Creates a pool. Returns 0, -EINVAL (bad config). Aborts only on host OOM. */
int kv_pool_create(const kv_pool_config_t *cfg, kv_pool_t **ret_pool);
/* Frees the pool and every sequence still open; accepts NULL. */
void kv_pool_free(kv_pool_t *pool);

/* Verifies every invariant (refcounts equal references, state counts add up, no block in two
 * states, prefix-cache map and LRU heap consistent, chains published as prefixes). Returns 0 or
 * -EUCLEAN after printing the first violation to stderr. O(blocks + table entries). */
int kv_pool_check(const kv_pool_t *pool);

void kv_pool_stats(const kv_pool_t *pool, kv_stats_t *ret_stats);
uint32_t kv_pool_block_size(const kv_pool_t *pool);
/* Blocks a reservation can get now: free plus every cached (reclaimable) block. */
uint32_t kv_pool_available(const kv_pool_t *pool);
/* Reclaims up to n cached blocks (LRU, leaves first) to the free list; returns how many. */
uint32_t kv_pool_evict(kv_pool_t *pool, uint32_t n);

/* Opens a sequence with its prompt. The longest cached chain of full prompt blocks is reused,
 * capped so that at least one prompt token is left to compute (the frontend needs its logits);
 * *ret_cached_len tokens of KV are then already present. Returns 0, -EINVAL (n == 0 or over
 * max_seq_len, NULL tokens), -EMFILE (max_seqs open). */
int kv_seq_open(kv_pool_t *pool, const uint32_t *tokens, uint32_t n, uint32_t *ret_seq,
                uint32_t *ret_cached_len);

/* kv_seq_open in a scope: the prefix cache gives a sequence only blocks published by sequences
 * of the same scope (a block's chain hash covers it), and its own blocks only to them; twins
 * share at commit only within it. kv_seq_open is scope 0. Forks keep their parent's scope. */
int kv_seq_open_scoped(kv_pool_t *pool, uint64_t scope, const uint32_t *tokens, uint32_t n,
                       uint32_t *ret_seq, uint32_t *ret_cached_len);

/* kv_seq_open_scoped, and *ret_pending_len (if not NULL): the prompt tokens past the cached ones,
 * in whole blocks and within the eligible ones, that other open sequences of the scope are about
 * to write: their prompts hold the same chain of full blocks and they have not committed them
 * yet (twins, or a request opened while another with the same new prompt still prefills). This
 * sequence's own full prompt blocks past its cached prefix count for later openers in the same
 * way until it commits them, truncates below its length or closes. The pool never waits on another
 * sequence; a caller that waits (closes, and opens again once they are written) reuses them. */
int kv_seq_open_pending(kv_pool_t *pool, uint64_t scope, const uint32_t *tokens, uint32_t n,
                        uint32_t *ret_seq, uint32_t *ret_cached_len, uint32_t *ret_pending_len);

/* Makes room for n_new tokens after the committed ones (capacity >= len + n_new), allocating
 * blocks. Idempotent: reserving again for the same n_new allocates nothing. Returns 0, -ENOENT
 * (unknown seq), -EINVAL (over max_seq_len), -ENOSPC (not enough blocks; nothing changed). */
int kv_seq_reserve(kv_pool_t *pool, uint32_t seq, uint32_t n_new);

/* Declares the KV of the next n tokens written; publishes every block this completes.
 * Returns 0, -ENOENT, -EINVAL (n == 0, NULL tokens, or beyond the reserved capacity). */
int kv_seq_commit(kv_pool_t *pool, uint32_t seq, const uint32_t *tokens, uint32_t n);

/* Forks seq: the child shares every full block; a partial last block is copied into a fresh
 * block, reported in *ret_copy (src == KV_NONE when the length is block-aligned). The child has
 * no reserved slots beyond its length. Returns 0, -ENOENT, -EMFILE, -ENOSPC. */
int kv_seq_fork(kv_pool_t *pool, uint32_t seq, uint32_t *ret_child, kv_copy_t *ret_copy);

/* Rolls back to new_len <= len, releasing blocks (and reservations) past it. If the new last
 * block is partial and shared or published, it is first copied into a private block so later
 * writes never alter shared or cached KV; *ret_copy reports that copy. Returns 0, -ENOENT,
 * -EINVAL (new_len > len), -ENOSPC (a copy was needed and no block is available). */
int kv_seq_truncate(kv_pool_t *pool, uint32_t seq, uint32_t new_len, kv_copy_t *ret_copy);

/* Closes seq, releasing its blocks (published ones stay cached). Returns 0 or -ENOENT. */
int kv_seq_close(kv_pool_t *pool, uint32_t seq);

int kv_seq_info(const kv_pool_t *pool, uint32_t seq, kv_seq_info_t *ret_info);

/* One published block of an earlier pool over the same memory (kv_index.h keeps them). */
typedef struct kv_adopt {
    uint32_t block;
    uint32_t parent; /* its predecessor in the chain, KV_NONE for a chain root */
    uint64_t hash;   /* its chain hash */
    uint64_t scope;
} kv_adopt_t;
/* Makes a fresh pool (no sequence, nothing published yet) hold e[0..n) as CACHED blocks of its
 * prefix cache, as they were published before. A chain is adopted only as a prefix: an entry
 * whose parent is not adopted (missing, out of range, rejected, part of a cycle), whose block is
 * out of range or named twice, or whose hash is already adopted is rejected, and so is every
 * entry below it. Emits no event. *ret_adopted, *ret_rejected (either may be NULL) count them.
 * Returns 0, -EBUSY (the pool is not fresh), -EINVAL (e NULL with n > 0). */
int kv_pool_adopt(kv_pool_t *pool, const kv_adopt_t *e, uint32_t n, uint32_t *ret_adopted,
                  uint32_t *ret_rejected);

#endif
