/*
 * kv_index.h — the prefix cache's index in memory that outlives the daemon (issue 37): which
 * block holds which published chain block (its hash, its parent, its scope), written as blocks
 * are published and evicted, so that a daemon started again over the same pool memory adopts
 * them (kv_pool_adopt) instead of starting empty.
 *
 * Layout, in memory the caller maps (a memfd the service manager keeps): a header (magic,
 * version, the identity below, a checksum of it) and one 32-byte entry per pool block. An entry
 * is valid when its check word equals a hash of its fields and its block number; it is written
 * check = 0 first, then the fields, then the check, so that a process killed at any instant
 * leaves each entry either valid (as last written) or detectably invalid: a torn entry reads as
 * absent, and kv_pool_adopt drops every block below it in its chain. One writer at a time (the
 * pool's owner, under the pool's lock); the memory's previous owner must be gone before a new
 * one writes (the caller's fence).
 *
 * Identity: what must be equal for old blocks to mean the same thing to a new daemon (model
 * shape and dtype through model_id, block size, pool geometry, the device, the layout version);
 * not the instance or the pid. Any difference starts the cache empty (kv_index_check says why).
 */
#ifndef KV_INDEX_H
#define KV_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kv_pool.h"

#define KV_INDEX_LAYOUT 1u /* the pool memory's layout version (kern.h's "Memory layout") */

typedef struct kv_index_id {
    uint64_t model_id;    /* kv_pool_config_t.model_id (shape and dtype hashed in) */
    uint64_t block_bytes; /* backend bytes of one block, every layer */
    uint32_t n_blocks, block_size;
    uint32_t layout;    /* KV_INDEX_LAYOUT */
    uint32_t driver;    /* the CUDA driver's version; 0 on the cpu backend */
    uint8_t device[16]; /* the GPU's UUID; zeros on the cpu backend */
} kv_index_id_t;

/* Bytes an index of n_blocks takes. */
uint64_t kv_index_bytes(uint32_t n_blocks);
/* Makes mem (kv_index_bytes(id->n_blocks) bytes) an empty index of id. */
void kv_index_format(void *mem, const kv_index_id_t *id);
/* Whether mem (bytes long) is an index of id: 0; -EPROTO (not an index, another version, a
 * header whose checksum fails, a size that does not match: torn or foreign), -ESTALE (an
 * index of another identity). why (why_len > 0) says which, for the log. */
int kv_index_check(const void *mem, uint64_t bytes, const kv_index_id_t *id, char *why,
                   size_t why_len);
/* The pool's events (kv_event_fn's arguments; mem is a checked or formatted index). */
void kv_index_stored(void *mem, uint32_t block, uint64_t hash, uint64_t scope, uint32_t parent);
void kv_index_evicted(void *mem, uint32_t block);
/* The valid entries into e (room for the index's n_blocks), for kv_pool_adopt; every invalid
 * one that is not blank (torn by a kill mid-write) is cleared and counted in *ret_torn (may be
 * NULL). Returns how many were written to e. */
uint32_t kv_index_entries(void *mem, kv_adopt_t *e, uint32_t *ret_torn);

#endif
