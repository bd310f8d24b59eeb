/*
 * kv_index.c — the prefix cache's crash-consistent index (kv_index.h says what and why).
 */
#include "kv_index.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <xxhash.h>

#define KV_INDEX_MAGIC   0x5844495650544150ull /* "PATPVIDX" */
#define KV_INDEX_VERSION 1u

typedef struct kv_index_hdr {
    uint64_t magic;
    uint32_t version, entry_bytes;
    kv_index_id_t id;
    uint64_t check; /* XXH3 of everything above */
} kv_index_hdr_t;

typedef struct kv_index_ent {
    uint64_t hash, scope;
    uint32_t parent, block; /* block: its own number, so that a shifted entry never checks */
    uint64_t check;         /* 0: blank; else ent_check(): valid */
} kv_index_ent_t;

_Static_assert(sizeof(kv_index_ent_t) == 32, "an index entry is 32 bytes");

static uint64_t hdr_check(const kv_index_hdr_t *h)
{
    return XXH3_64bits(h, offsetof(kv_index_hdr_t, check));
}

static uint64_t ent_check(uint32_t block, uint64_t hash, uint64_t scope, uint32_t parent)
{
    const uint64_t w[3] = {hash, scope, (uint64_t)parent << 32 | block};
    return XXH3_64bits(w, sizeof(w)) | 1u; /* never 0, the blank mark */
}

static kv_index_ent_t *ents(void *mem)
{
    return (kv_index_ent_t *)((char *)mem + sizeof(kv_index_hdr_t));
}

uint64_t kv_index_bytes(uint32_t n_blocks)
{
    return sizeof(kv_index_hdr_t) + (uint64_t)n_blocks * sizeof(kv_index_ent_t);
}

void kv_index_format(void *mem, const kv_index_id_t *id)
{
    kv_index_hdr_t *h = mem;
    memset(mem, 0, kv_index_bytes(id->n_blocks));
    h->magic = KV_INDEX_MAGIC;
    h->version = KV_INDEX_VERSION;
    h->entry_bytes = sizeof(kv_index_ent_t);
    h->id = *id;
    h->check = hdr_check(h);
}

int kv_index_check(const void *mem, uint64_t bytes, const kv_index_id_t *id, char *why,
                   size_t why_len)
{
    const kv_index_hdr_t *h = mem;
    const char *w = NULL;
    int rc = -EPROTO;
    if (bytes < sizeof(*h) || h->magic != KV_INDEX_MAGIC)
        w = "not a patd cache index";
    else if (h->version != KV_INDEX_VERSION || h->entry_bytes != sizeof(kv_index_ent_t))
        w = "an index of another version";
    else if (h->check != hdr_check(h))
        w = "the index header's checksum fails";
    else if (bytes != kv_index_bytes(h->id.n_blocks))
        w = "the index's size does not match its header";
    else {
        rc = -ESTALE;
        if (h->id.layout != id->layout)
            w = "another KV layout version";
        else if (h->id.model_id != id->model_id)
            w = "another model (shape, dtype or id)";
        else if (h->id.block_size != id->block_size)
            w = "another block size";
        else if (h->id.n_blocks != id->n_blocks || h->id.block_bytes != id->block_bytes)
            w = "another pool geometry (blocks or bytes per block)";
        else if (memcmp(h->id.device, id->device, sizeof(id->device)))
            w = "another device";
        else if (h->id.driver != id->driver)
            w = "another driver version";
        else
            rc = 0;
    }
    if (why_len)
        snprintf(why, why_len, "%s", w ? w : "");
    return rc;
}

void kv_index_stored(void *mem, uint32_t block, uint64_t hash, uint64_t scope, uint32_t parent)
{
    kv_index_ent_t *e = &ents(mem)[block];
    __atomic_store_n(&e->check, 0, __ATOMIC_RELEASE); /* torn from here ... */
    e->hash = hash;
    e->scope = scope;
    e->parent = parent;
    e->block = block;
    __atomic_store_n(&e->check, ent_check(block, hash, scope, parent), __ATOMIC_RELEASE);
}

void kv_index_evicted(void *mem, uint32_t block)
{
    __atomic_store_n(&ents(mem)[block].check, 0, __ATOMIC_RELEASE);
}

uint32_t kv_index_entries(void *mem, kv_adopt_t *out, uint32_t *ret_torn)
{
    const kv_index_hdr_t *h = mem;
    kv_index_ent_t *e = ents(mem);
    uint32_t n = 0, torn = 0;
    for (uint32_t b = 0; b < h->id.n_blocks; b++) {
        const uint64_t c = __atomic_load_n(&e[b].check, __ATOMIC_ACQUIRE);
        if (c == 0)
            continue;
        if (e[b].block != b || c != ent_check(b, e[b].hash, e[b].scope, e[b].parent)) {
            __atomic_store_n(&e[b].check, 0, __ATOMIC_RELEASE);
            torn++;
            continue;
        }
        out[n++] = (kv_adopt_t){b, e[b].parent, e[b].hash, e[b].scope};
    }
    if (ret_torn)
        *ret_torn = torn;
    return n;
}
