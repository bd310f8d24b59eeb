/*
 * pat_rng.h — deterministic random numbers: xoshiro256** (Blackman and Vigna) seeded through
 * splitmix64. Header-only; patload's synthetic workloads (client/patload/patload_synth.c) and
 * the tests' generator (tests/lib/tl_rng.c) draw from it, so one seed means one sequence.
 */
#ifndef PAT_RNG_H
#define PAT_RNG_H

#include <stdint.h>

typedef struct pat_rng {
    uint64_t s[4];
} pat_rng_t;

static inline uint64_t pat_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void pat_rng_seed(pat_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = pat_splitmix64(&seed);
}

static inline uint64_t pat_rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t pat_rng_u64(pat_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = pat_rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = pat_rotl64(s[3], 45);
    return out;
}

#endif
