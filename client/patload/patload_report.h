/*
 * patload_report.h — what a replay records and how patload reports it: per-request and per-step
 * records, the summary (the serving figures of patload_metrics.h, prefix reuse, KV bytes, errors
 * by code) as a table, JSON and CSV, and the latency / batch-size plot (gnuplot, PNG).
 */
#ifndef PATLOAD_REPORT_H
#define PATLOAD_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "patload_metrics.h"

/* One replayed request. Times are seconds since the replay started; -1 = did not happen. */
typedef struct pl_rec {
    uint32_t trace_idx, pass, line;
    uint32_t in_len, out_len; /* replayed lengths */
    uint32_t cached;          /* prompt tokens the prefix cache held at (the last) admission */
    uint32_t inflight;        /* ... and the prompt tokens past them that other open sequences
                               * were about to write then, as patd reported them
                               * (pat_seq_open_pending: what waiting for or attaching to a
                               * twin's blocks could have added to cached) */
    uint32_t twin_waits;      /* --wait-twins: times its admission was put off for them */
    uint32_t generated;       /* output tokens produced */
    uint32_t preempted;       /* times it lost its KV to make room and was re-admitted */
    int err;                  /* 0, or the negative errno it failed with */
    double t_arrive, t_admit, t_first, t_done;
    double t_last; /* its latest output token */
    double *itl;   /* gaps between its successive output tokens, s (owned; freed by
                    * pl_report_done) */
    uint32_t n_itl, itl_cap;
} pl_rec_t;

/* One step, as written to the steps CSV and summed into the report. */
typedef struct pl_step_rec {
    double t_s; /* step start */
    uint32_t seqs, tokens, prefill_tokens, running, queued;
    double wall_ms;    /* begin -> end, the stand-in compute included */
    double daemon_ms;  /* the daemon's STEP_BEGIN -> last layer done */
    uint64_t kv_bytes; /* K+V the plan read, all layers */
    uint64_t qc_bytes; /* ... and what query-centric attention would have read */
    uint32_t pack_reused;
    int64_t kv_blocks_used; /* daemon-wide, last sampled (-1: not yet) */
} pl_step_rec_t;

#define PL_MAX_ERR_KINDS 32

typedef struct pl_errcount {
    int err;
    uint64_t n;
} pl_errcount_t;

typedef struct pl_report {
    /* what was replayed */
    const char *trace, *format, *compute, *device, *backend;
    const char *kv_pool;     /* the daemon's KV pool: "f16", "fp8_e4m3 x 0.125" (its factor) */
    uint32_t trace_requests; /* rows of the trace selected */
    uint32_t trace_dropped;  /* rows the reader left out (BurstGPT's failed requests) */
    uint32_t passes;
    double speed, scale;
    double request_rate, burstiness; /* --request-rate (INFINITY: all at once) and --burstiness;
                                      * NAN: the trace's own timestamps */
    const char *arrivals;            /* how requests arrive, in words */
    pl_metrics_cfg_t metrics;        /* --percentiles, --goodput */
    int save_detailed;               /* --save-detailed: per-request arrays in the JSON */
    uint32_t concurrency, max_batch_tokens, chunk, block_tokens;
    uint32_t n_layers, q_heads, kv_heads, head_dim;
    /* outcome */
    pl_rec_t *rec;
    uint32_t n_rec;
    double wall_s;
    uint64_t steps, step_tokens, prefill_tokens;
    uint64_t kv_bytes, qc_bytes;
    uint64_t decode_steps, decode_kv_bytes, decode_qc_bytes; /* steps without prefill tokens */
    uint64_t pack_reused;
    double step_wall_ms_sum, daemon_ms_sum;
    uint64_t preemptions;
    uint64_t twin_waits; /* --wait-twins: admissions put off because a twin was prefilling */
    pl_errcount_t step_errs[PL_MAX_ERR_KINDS]; /* refusals of whole steps (e.g. -ENOSPC) */
    uint32_t n_step_errs;
    uint32_t not_started; /* requests never admitted (duration ran out, interrupted) */
    int interrupted;
    int64_t kv_blocks_total, kv_blocks_peak;
} pl_report_t;

#define PL_ERRNAME_LEN 16 /* "E2147483648" and its NUL fit */

void pl_report_count_err(pl_errcount_t *tab, uint32_t *n, int err);
/* The name of a negative errno: "ENOSPC", or "E<n>" written into buf for a code the reports do
 * not name. Returns a static string or buf. */
const char *pl_errname(int err, char buf[PL_ERRNAME_LEN]);
/* A record's next output token came out at t (s): the first sets t_first, later ones add a gap
 * to itl. */
void pl_rec_token(pl_rec_t *q, double t);
/* Frees what the records own (their itl) and the records. */
void pl_report_done(pl_report_t *r);

void pl_report_print(const pl_report_t *r, FILE *f);
int pl_report_json(const pl_report_t *r, const char *path);
int pl_report_csv(const pl_report_t *r, const char *path);
void pl_step_csv_header(FILE *f);
void pl_step_csv_row(FILE *f, const pl_step_rec_t *s);
/* Latency over time (TTFT, TPOT, end-to-end per request) above batch size and KV use per step,
 * from the two CSV files, with gnuplot. Returns 0 or a negative errno with why. */
int pl_report_plot(const char *png, const char *requests_csv, const char *steps_csv,
                   const char *title, double t_max, char *why, size_t why_len);

#endif
