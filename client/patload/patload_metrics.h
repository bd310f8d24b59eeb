/*
 * patload_metrics.h — the serving figures of a run in the serving benchmarks' terms (vLLM's
 * `vllm bench serve`, SGLang's bench_serving): completed and failed requests, throughput,
 * goodput against latency SLOs, peak concurrency and output rate, and mean / median / standard
 * deviation / percentiles of TTFT, TPOT, ITL and end-to-end latency; printed, added to a JSON
 * summary under vLLM's field names, and recomputed from a saved per-request file
 * (patload --report-from).
 */
#ifndef PATLOAD_METRICS_H
#define PATLOAD_METRICS_H

#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>

#define PL_MAX_PCT 16 /* --percentiles values at most */

/* The latency metrics, in vLLM's names (mean_<name>_ms, p99_<name>_ms, ...). */
typedef enum pl_metric { PL_M_TTFT, PL_M_TPOT, PL_M_ITL, PL_M_E2EL, PL_M_N } pl_metric_t;

/* The SLOs --goodput may set (a subset of the metrics: no per-request ITL). */
typedef enum pl_slo { PL_SLO_TTFT, PL_SLO_TPOT, PL_SLO_E2EL, PL_SLO_N } pl_slo_t;

typedef struct pl_metrics_cfg {
    double pct[PL_MAX_PCT]; /* percentiles to report, each in [0, 100] */
    uint32_t n_pct;
    double slo_ms[PL_SLO_N]; /* --goodput bounds in ms; NAN: not set */
} pl_metrics_cfg_t;

/* One request as the figures see it (seconds; a client's view, like vLLM's RequestFuncOutput).
 * start_s is when it arrived; ttft_s and latency_s count from there; itl_s holds the gaps
 * between its successive output tokens (n_itl of them, output_len - 1 for one token per step). */
typedef struct pl_timing {
    double start_s, ttft_s, latency_s;
    const double *itl_s;
    uint32_t n_itl;
    uint32_t input_len, output_len;
    int ok; /* completed; a failed request counts only in failed */
} pl_timing_t;

typedef struct pl_stat {
    uint32_t n; /* values (0: every figure below is 0, as vLLM reports an empty list) */
    double mean, median, std; /* ms; std over the population (numpy's default) */
    double pct[PL_MAX_PCT];   /* ms, cfg->pct[k]-th percentile */
    double p50, p90, p99;     /* ms, for patload's own summary keys */
} pl_stat_t;

typedef struct pl_metrics {
    double duration_s;
    uint32_t completed, failed, good;   /* good: completed requests within every SLO set */
    uint64_t total_input, total_output; /* tokens of completed requests */
    double request_throughput, output_throughput, total_token_throughput; /* per second */
    double request_goodput;           /* good / duration; NAN without --goodput */
    double max_output_tokens_per_s;   /* most output tokens in one 1-s bucket */
    uint32_t max_concurrent_requests; /* most completed requests in [start, start + latency) */
    pl_stat_t stat[PL_M_N];
} pl_metrics_t;

/* Parses a --percentiles value ("50,90,99.9") into cfg. 0, or -EINVAL with why. */
int pl_metrics_parse_percentiles(pl_metrics_cfg_t *cfg, const char *v, char *why, size_t why_len);
/* Parses one --goodput word ("ttft:500" or "ttft:500,tpot:50") into cfg. 0, or -EINVAL with why
 * (an empty word or pair, an unknown name, a bad or negative number, a name given twice). */
int pl_metrics_parse_goodput(pl_metrics_cfg_t *cfg, const char *v, char *why, size_t why_len);
/* Whether s looks like a --goodput word: ttft:, tpot: or e2el: and a number (what may follow). */
int pl_metrics_is_slo_word(const char *s);
/* The defaults: percentiles 90 and 99, no SLO. */
void pl_metrics_cfg_init(pl_metrics_cfg_t *cfg);

/* Figures over n requests that took duration_s (> 0). Returns 0 (host allocation failures
 * abort). */
int pl_metrics_compute(const pl_timing_t *req, uint32_t n, double duration_s,
                       const pl_metrics_cfg_t *cfg, pl_metrics_t *ret);

/* The p-th percentile (0..100) of n sorted values, interpolated linearly between the closest
 * ranks (numpy.percentile's default, which vLLM and SGLang use); 0 when n == 0. */
double pl_percentile_sorted(const double *v, uint32_t n, double p);

/* The summary lines: requests, goodput, throughput, then the latency table. not_started >= 0
 * adds that count to the requests line. */
void pl_metrics_print(const pl_metrics_t *m, const pl_metrics_cfg_t *cfg, int64_t not_started,
                      FILE *f);
/* A JSON number, or NULL (JSON null) for a value that is not finite. */
json_object *pl_json_double(double x);
/* Adds the figures to o under vLLM's names (duration, completed, ..., p99_ttft_ms) and
 * patload's goodput_slo_ms, good_requests, percentiles. */
void pl_metrics_json(const pl_metrics_t *m, const pl_metrics_cfg_t *cfg, json_object *o);
/* Adds the per-request arrays of vLLM's --save-detailed: input_lens, output_lens (tokens),
 * start_times, ttfts, itls, latencies (seconds) and errors ("" or the failure's name, err[i];
 * NULL entries are ""). */
void pl_metrics_json_detailed(const pl_timing_t *req, const char *const *err, uint32_t n,
                              json_object *o);

/* A saved run read back: its requests and what it recorded of its set-up. */
typedef struct pl_saved {
    pl_timing_t *req;
    uint32_t n;
    double *itl; /* every request's gaps, one allocation */
    double duration_s;
    json_object *root; /* the file, for fields passed through (request_rate, ...) */
} pl_saved_t;

/* Reads a JSON file with duration and the per-request arrays (patload --json --save-detailed,
 * or vLLM's --save-result --save-detailed). A request failed when its "errors" entry is a
 * non-empty string (or another non-null value), or when it has 0 output tokens and a latency of
 * 0 (what vLLM saves for every failure, whose reason may be ""). Refused: a duration outside
 * [1e-6, 1e9] s, a time outside [0, 1e9] s, a token count that is not an integer in
 * [0, 2^32 - 1], anything not finite. Returns 0, or -EINVAL / -EBADMSG with why naming the field
 * at fault; nothing is kept on failure. */
int pl_saved_load(pl_saved_t *s, const char *path, char *why, size_t why_len);
void pl_saved_done(pl_saved_t *s);

#endif
