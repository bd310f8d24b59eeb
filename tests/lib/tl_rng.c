/* tl_rng.c — see tl_rng.h. */
#include "tl_rng.h"

#include <stdio.h>
#include <stdlib.h>

void tl_rng_seed(tl_rng_t *r, uint64_t seed)
{
    pat_rng_seed(r, seed);
}

uint64_t tl_rng_u64(tl_rng_t *r)
{
    return pat_rng_u64(r);
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
