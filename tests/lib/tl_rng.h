/*
 * tl_rng.h — deterministic random numbers for tests and benchmarks (splitmix64 seeding a
 * xoshiro256**). Every randomized test prints its seed and accepts PATD_TEST_SEED to replay.
 */
#ifndef TL_RNG_H
#define TL_RNG_H

#include <stdint.h>

#include "pat_rng.h"

typedef pat_rng_t tl_rng_t;

void tl_rng_seed(tl_rng_t *r, uint64_t seed);
uint64_t tl_rng_u64(tl_rng_t *r);
/* Uniform in [0, n); n > 0. */
uint32_t tl_rng_below(tl_rng_t *r, uint32_t n);
/* Uniform in [lo, hi] inclusive. */
uint32_t tl_rng_range(tl_rng_t *r, uint32_t lo, uint32_t hi);
/* Uniform in [-1, 1). */
double tl_rng_unit(tl_rng_t *r);
/* The seed tests use: PATD_TEST_SEED from the environment, else the given default. */
uint64_t tl_test_seed(uint64_t dflt);

#endif
