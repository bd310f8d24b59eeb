/*
 * patload_synth.h — workloads patload makes up instead of reading: synthetic arrival times at a
 * request rate with vLLM's burstiness (--request-rate, --burstiness), and SGLang's
 * generated-shared-prefix requests (--gsp). Both are pure functions of their parameters and a
 * seed.
 */
#ifndef PATLOAD_SYNTH_H
#define PATLOAD_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "pat_rng.h"
#include "patload_trace.h"

/* The generator: daemon/base's xoshiro256** (pat_rng_seed, pat_rng_u64). */
typedef pat_rng_t pl_rng_t;

/* Uniform in [0, 1) with 53 random bits. */
double pl_rng_uniform(pl_rng_t *r);
/* Gamma(shape, scale 1), shape > 0. */
double pl_rng_gamma(pl_rng_t *r, double shape);

/* Arrival times (seconds from the start) of n requests at rate req/s: gaps drawn from
 * Gamma(shape = burstiness, scale = 1 / (rate x burstiness)) (burstiness 1: a Poisson process;
 * INFINITY: even gaps of 1 / rate), the first one too, then scaled so that the last request
 * arrives at n / rate, as vLLM's get_request does. rate INFINITY: every request at 0. */
void pl_arrivals(double *t, uint32_t n, double rate, double burstiness, uint64_t seed);

/* SGLang's generated-shared-prefix dataset (bench_serving.py, --dataset-name
 * generated-shared-prefix): num_groups system prompts, each shared by prompts_per_group
 * requests that add a question of their own. */
typedef struct pl_gsp {
    uint32_t num_groups;        /* --gsp-num-groups (SGLang's default 64) */
    uint32_t prompts_per_group; /* --gsp-prompts-per-group (16) */
    uint32_t system_prompt_len; /* --gsp-system-prompt-len, tokens (2048) */
    uint32_t question_len;      /* --gsp-question-len, tokens (128) */
    uint32_t output_len;        /* --gsp-output-len, tokens (256) */
    double range_ratio;         /* --gsp-range-ratio: lengths uniform in
                                 * [max(1, floor(len x ratio)), len] (1: exactly len) */
    int ordered;                /* --gsp-ordered: group by group, else shuffled */
} pl_gsp_t;

/* Fills t with the generated requests (format PL_FMT_GSP; every timestamp 0, so arrivals come
 * from --request-rate, all at once by default as in SGLang). skip/limit select requests as for a
 * file. Returns 0, or a negative errno with why. */
int pl_gsp_make(pl_trace_t *t, const pl_gsp_t *g, uint64_t seed, uint32_t skip, uint32_t limit,
                char *why, size_t why_len);

#endif
