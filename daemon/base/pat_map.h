/*
 * pat_map.h — a fixed-capacity open-addressing map from 64-bit keys to 32-bit values, shared by
 * the prefix cache (chain hash -> block) and the prefix forest ((parent, block) -> child).
 *
 * Linear probing with backward-shift deletion: no tombstones, so probe lengths never grow with
 * churn. Capacity is a power of two fixed at init to at least twice the most entries the owner
 * will ever hold (it sizes from its own bound), so a lookup stays a few probes and an insert
 * never needs to grow. The key UINT64_MAX marks an empty slot and cannot be stored.
 */
#ifndef PAT_MAP_H
#define PAT_MAP_H

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "pat_base.h"

#define PAT_MAP_EMPTY UINT64_MAX
#define PAT_MAP_NONE  UINT32_MAX

typedef struct pat_map {
    uint64_t *key;
    uint32_t *val;
    uint32_t mask;
    uint32_t count;
} pat_map_t;

static inline uint32_t pat_map__home(uint64_t k, uint32_t mask)
{
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 32;
    return (uint32_t)k & mask;
}

static inline void pat_map_clear(pat_map_t *m)
{
    memset(m->key, 0xff, ((size_t)m->mask + 1) * sizeof(uint64_t)); /* every key = EMPTY */
    m->count = 0;
}

/* Sizes the map for at most max_entries keys. Aborts on host OOM only. */
static inline void pat_map_init(pat_map_t *m, uint32_t max_entries)
{
    uint64_t cap = 16;
    while (cap < 2ull * max_entries)
        cap *= 2;
    m->key = pat_xmalloc(cap * sizeof(uint64_t));
    m->val = pat_xmalloc(cap * sizeof(uint32_t));
    m->mask = (uint32_t)(cap - 1);
    pat_map_clear(m);
}

static inline void pat_map_done(pat_map_t *m)
{
    free(m->key);
    free(m->val);
    m->key = NULL;
    m->val = NULL;
}

/* The value under k, or PAT_MAP_NONE. */
static inline uint32_t pat_map_get(const pat_map_t *m, uint64_t k)
{
    for (uint32_t i = pat_map__home(k, m->mask);; i = (i + 1) & m->mask) {
        if (m->key[i] == k)
            return m->val[i];
        if (m->key[i] == PAT_MAP_EMPTY)
            return PAT_MAP_NONE;
    }
}

/* Inserts k -> v, or overwrites the value of a present k. */
static inline void pat_map_put(pat_map_t *m, uint64_t k, uint32_t v)
{
    assert(k != PAT_MAP_EMPTY && v != PAT_MAP_NONE);
    uint32_t i = pat_map__home(k, m->mask);
    while (m->key[i] != PAT_MAP_EMPTY && m->key[i] != k)
        i = (i + 1) & m->mask;
    m->count += m->key[i] == PAT_MAP_EMPTY;
    assert(m->count <= m->mask); /* sized to twice the owner's bound: an empty slot remains */
    m->key[i] = k;
    m->val[i] = v;
}

/* Removes k, which must be present. */
static inline void pat_map_del(pat_map_t *m, uint64_t k)
{
    uint32_t i = pat_map__home(k, m->mask);
    while (m->key[i] != k) {
        assert(m->key[i] != PAT_MAP_EMPTY); /* k is present */
        i = (i + 1) & m->mask;
    }
    for (uint32_t j = (i + 1) & m->mask; m->key[j] != PAT_MAP_EMPTY; j = (j + 1) & m->mask) {
        uint32_t home = pat_map__home(m->key[j], m->mask);
        /* j may move into the hole at i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            m->key[i] = m->key[j];
            m->val[i] = m->val[j];
            i = j;
        }
    }
    m->key[i] = PAT_MAP_EMPTY;
    m->count--;
}

#endif
