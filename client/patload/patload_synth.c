/*
 * patload_synth.c — synthetic arrivals and the generated-shared-prefix workload
 * (patload_synth.h), so that a patload run can be set beside a `vllm bench serve --request-rate R
 * --burstiness B` or an SGLang `bench_serving --dataset-name generated-shared-prefix` run.
 *
 * Sources of the definitions (read, not copied):
 *   - arrivals: vLLM vllm/benchmarks/serve.py, get_request (github.com/vllm-project/vllm, commit
 *     009e6d4a): every gap, the first one included, is Gamma(shape = burstiness, scale =
 *     1 / (rate x burstiness)), the cumulative times are rescaled so that the last one is
 *     n / rate, burstiness infinity gives even gaps and rate infinity sends everything at 0;
 *   - generated shared prefix: SGLang python/sglang/bench_serving.py,
 *     sample_generated_shared_prefix_requests and compute_random_lens
 *     (github.com/sgl-project/sglang): num_groups system prompts of system_prompt_len tokens,
 *     num_groups x prompts_per_group questions of question_len tokens and outputs of output_len
 *     tokens, each length drawn uniformly from [max(1, int(len x range_ratio)), len] (default
 *     ratio 1: exactly len); request g x prompts_per_group + p is system prompt g then question
 *     g x prompts_per_group + p; the list is shuffled unless --gsp-ordered.
 * SGLang's prompts are random text that its tokenizer counts; here the lengths are exact token
 * counts and the tokens are drawn by patload_trace.c from the group and the request.
 *
 * The random numbers are patload's own (pat_rng.h's xoshiro256**, Marsaglia and Tsang's
 * gamma method): a seed gives the same workload on every machine, not the same one as numpy.
 */
#include "patload_synth.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- random numbers */

double pl_rng_uniform(pl_rng_t *r)
{
    return (pat_rng_u64(r) >> 11) * 0x1.0p-53;
}

/* Standard normal (Marsaglia's polar method; the second value is dropped). */
static double normal(pl_rng_t *r)
{
    double u, v, q;
    do {
        u = 2 * pl_rng_uniform(r) - 1;
        v = 2 * pl_rng_uniform(r) - 1;
        q = u * u + v * v;
    } while (q >= 1 || q == 0);
    return u * sqrt(-2 * log(q) / q);
}

double pl_rng_gamma(pl_rng_t *r, double shape)
{
    if (shape < 1) { /* Gamma(a) = Gamma(a + 1) x U^(1/a) */
        double u;
        do
            u = pl_rng_uniform(r);
        while (u == 0);
        return pl_rng_gamma(r, shape + 1) * pow(u, 1 / shape);
    }
    /* Marsaglia and Tsang, "A simple method for generating gamma variables" (2000) */
    double d = shape - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x = normal(r), v = 1 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = pl_rng_uniform(r);
        if (u < 1 - 0.0331 * x * x * x * x)
            return d * v;
        if (u > 0 && log(u) < 0.5 * x * x + d * (1 - v + log(v)))
            return d * v;
    }
}

/* ---------------------------------------------------------------- arrivals */

/* salts that keep the streams of one --seed apart */
#define SALT_ARRIVALS 0x61727269766c73ull /* "arrivls" */
#define SALT_GSP      0x67737000ull       /* "gsp" */

void pl_arrivals(double *t, uint32_t n, double rate, double burstiness, uint64_t seed)
{
    if (n == 0)
        return;
    if (isinf(rate)) {
        memset(t, 0, (size_t)n * sizeof(*t));
        return;
    }
    pl_rng_t r;
    pat_rng_seed(&r, seed ^ SALT_ARRIVALS);
    double at = 0, theta = 1 / (rate * burstiness);
    for (uint32_t i = 0; i < n; i++) {
        at += isinf(burstiness) ? 1 / rate : pl_rng_gamma(&r, burstiness) * theta;
        t[i] = at;
    }
    if (t[n - 1] > 0) {
        double f = (n / rate) / t[n - 1];
        for (uint32_t i = 0; i < n; i++)
            t[i] *= f;
    }
}

/* ---------------------------------------------------------------- generated shared prefix */

/* A length drawn as SGLang's compute_random_lens draws it: uniform in [max(1, int(len x ratio)),
 * len]. */
static uint32_t draw_len(pl_rng_t *r, uint32_t len, double ratio)
{
    double lo_d = floor(len * ratio);
    uint64_t lo = lo_d < 1 ? 1 : (uint64_t)lo_d;
    if (lo >= len)
        return len;
    uint64_t span = len - lo + 1;
    return (uint32_t)(lo + pat_rng_u64(r) % span);
}

int pl_gsp_make(pl_trace_t *t, const pl_gsp_t *g, uint64_t seed, uint32_t skip, uint32_t limit,
                char *why, size_t why_len)
{
    memset(t, 0, sizeof(*t));
    uint64_t total = (uint64_t)g->num_groups * g->prompts_per_group;
    if (total == 0 || total > PL_TRACE_MAX_REQS)
        return pl_fail(why, why_len, -EINVAL,
                       "--gsp: %u groups x %u prompts = %llu requests (1 to %u)", g->num_groups,
                       g->prompts_per_group, (unsigned long long)total, PL_TRACE_MAX_REQS);
    if (skip >= total)
        return pl_fail(why, why_len, -ENODATA, "--gsp: no requests after skipping %u of %llu", skip,
                       (unsigned long long)total);
    pl_rng_t r;
    pat_rng_seed(&r, seed ^ SALT_GSP);
    uint32_t n = (uint32_t)total;
    uint32_t *sys = malloc((size_t)g->num_groups * sizeof(*sys));
    pl_req_t *req = malloc((size_t)n * sizeof(*req));
    if (!sys || !req) {
        free(sys);
        free(req);
        return pl_fail(why, why_len, -ENOMEM, "--gsp: out of memory for %u requests", n);
    }
    for (uint32_t k = 0; k < g->num_groups; k++)
        sys[k] = draw_len(&r, g->system_prompt_len, g->range_ratio);
    for (uint32_t i = 0; i < n; i++) { /* questions, then outputs, as SGLang draws them */
        uint32_t grp = i / g->prompts_per_group;
        req[i] = (pl_req_t){.in_len = sys[grp] + draw_len(&r, g->question_len, g->range_ratio),
                            .line = i + 1,
                            .session = -1,
                            .next = -1,
                            .prev = -1,
                            .group = (int32_t)grp,
                            .prefix = sys[grp]};
    }
    for (uint32_t i = 0; i < n; i++)
        req[i].out_len = draw_len(&r, g->output_len, g->range_ratio);
    free(sys);
    if (!g->ordered)
        for (uint32_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
            uint32_t j = (uint32_t)(pat_rng_u64(&r) % ((uint64_t)i + 1));
            pl_req_t x = req[i];
            req[i] = req[j];
            req[j] = x;
        }
    uint32_t keep = n - skip;
    if (limit && keep > limit)
        keep = limit;
    memmove(req, req + skip, (size_t)keep * sizeof(*req));
    t->format = PL_FMT_GSP;
    t->req = req;
    t->n = keep;
    t->block = 16; /* no hash blocks: the summary's tokens-per-block figure only */
    return 0;
}
