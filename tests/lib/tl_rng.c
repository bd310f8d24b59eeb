/* tl_rng.c — see tl_rng.h. */
#include "tl_rng.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tl_rng_seed(tl_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t tl_rng_u64(tl_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

uint32_t tl_rng_below(tl_rng_t *r, uint32_t n)
{
    return (uint32_t)(((tl_rng_u64(r) >> 32) * (uint64_t)n) >> 32);
}

uint32_t tl_rng_range(tl_rng_t *r, uint32_t lo, uint32_t hi)
{
    return lo + tl_rng_below(r, hi - lo + 1);
}

double tl_rng_unit(tl_rng_t *r)
{
    return (double)(tl_rng_u64(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

uint64_t tl_test_seed(uint64_t dflt)
{
    const char *e = getenv("PATD_TEST_SEED");
    uint64_t s = e ? strtoull(e, NULL, 0) : dflt;
    fprintf(stderr, "[seed] PATD_TEST_SEED=%llu\n", (unsigned long long)s);
    return s;
}
