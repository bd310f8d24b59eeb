/*
 * patload_report.c — patload's summary table, JSON and CSV outputs and plot (patload_report.h).
 *
 * Definitions (per request, over the requests that finished; patload_metrics.c has the rest):
 *   TTFT  first token - arrival (arrival: its recorded time scaled by --speed, or its synthetic
 *         time under --request-rate, or when the previous turn of its session finished,
 *         whichever is later);
 *   TPOT  (finish - first token) / (output tokens - 1), for outputs of 2 or more tokens;
 *   ITL   the gaps between successive output tokens (one per decode step it took part in; a
 *         preemption's wait and recompute fall into one gap);
 *   e2e   finish - arrival.
 * Percentiles interpolate between closest ranks (numpy's default, as vLLM). KV bytes are what the
 * daemon's plans read (its prefix-aware packing) against what query-centric attention reads for the
 * same steps (every query its whole context), summed over steps and layers. Both count what each
 * CTA of the plan loads; for prefill chunks many CTAs load the same context and the L2 serves most
 * of it, so the totals over steps with prefill are a model, not DRAM traffic; the decode-only line
 * (steps without prefill tokens) is the one to set against memory bandwidth.
 */
#include "patload_report.h"
#include "pat_base.h"      /* pat_grow, pat_xmalloc */
#include "patload_trace.h" /* pl_fail */

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

/* the errnos named in reports (clang-format does not settle on one layout for this list) */
/* clang-format off */
#define ERRNO_NAMES(X) \
    X(ENOSPC) X(EDQUOT) X(EMFILE) X(E2BIG) X(EINVAL) X(ENOENT) X(ETIMEDOUT) X(ECANCELED) \
    X(ECONNRESET) X(ESTALE) X(ESHUTDOWN) X(EBUSY) X(EIO) X(ENOMEM) X(EBADMSG) X(EPROTO) X(ENOTSUP) \
    X(EMEDIUMTYPE) X(ESRCH) X(EAGAIN) X(EINTR) X(ENOBUFS)
/* clang-format on */

const char *pl_errname(int err, char buf[PL_ERRNAME_LEN])
{
    switch (err) {
#define CASE(e)                                                                                    \
    case -e:                                                                                       \
        return #e;
        ERRNO_NAMES(CASE)
#undef CASE
    default:
        snprintf(buf, PL_ERRNAME_LEN, "E%lld", -(long long)err);
        return buf;
    }
}

void pl_report_count_err(pl_errcount_t *tab, uint32_t *n, int err)
{
    for (uint32_t i = 0; i < *n; i++)
        if (tab[i].err == err) {
            tab[i].n++;
            return;
        }
    if (*n < PL_MAX_ERR_KINDS)
        tab[(*n)++] = (pl_errcount_t){err, 1};
    else
        tab[PL_MAX_ERR_KINDS - 1].n++; /* the last slot also counts whatever did not fit */
}

void pl_rec_token(pl_rec_t *q, double t)
{
    if (q->generated == 0) {
        q->t_first = t;
    } else {
        pat_grow((void **)&q->itl, &q->itl_cap, q->n_itl + 1, sizeof(*q->itl));
        q->itl[q->n_itl++] = t - q->t_last;
    }
    q->t_last = t;
    q->generated++;
}

void pl_report_done(pl_report_t *r)
{
    for (uint32_t i = 0; i < r->n_rec; i++)
        free(r->rec[i].itl);
    free(r->rec);
    r->rec = NULL;
    r->n_rec = 0;
}

/* ---------------------------------------------------------------- derived numbers */

enum { L_TTFT, L_TPOT, L_E2E, N_LAT }; /* the requests CSV's latency columns */

typedef struct summary {
    uint32_t done, failed;
    uint64_t prompt, cached, out_tokens;
    uint64_t inflight;   /* tokens of in-flight twin blocks at admission */
    uint32_t n_inflight; /* requests admitted with some */
    pl_metrics_t m;      /* the serving figures */
    pl_errcount_t req_errs[PL_MAX_ERR_KINDS];
    uint32_t n_req_errs;
} summary_t;

/* Error names of the records, one buffer each (unknown codes are formatted into it). */
typedef struct errnames {
    const char **name; /* per record: its error's name, or NULL */
    char (*buf)[PL_ERRNAME_LEN];
} errnames_t;

/* The records as the serving figures see them (failed ones with zero times, as vLLM saves a
 * failed request); ret_err (NULL ok) gets each one's error name, freed by errnames_done. */
static pl_timing_t *timings(const pl_report_t *r, errnames_t *ret_err)
{
    pl_timing_t *t = pat_xmalloc(((size_t)r->n_rec + 1) * sizeof(*t));
    errnames_t *err = ret_err;
    if (err) {
        err->name = pat_xmalloc(((size_t)r->n_rec + 1) * sizeof(*err->name));
        err->buf = pat_xmalloc(((size_t)r->n_rec + 1) * sizeof(*err->buf));
    }
    for (uint32_t i = 0; i < r->n_rec; i++) {
        const pl_rec_t *q = &r->rec[i];
        int ok = q->err == 0 && q->t_done >= 0;
        t[i] = (pl_timing_t){.start_s = q->t_arrive,
                             .ttft_s = ok ? q->t_first - q->t_arrive : 0,
                             .latency_s = ok ? q->t_done - q->t_arrive : 0,
                             .itl_s = q->itl,
                             .n_itl = ok ? q->n_itl : 0,
                             .input_len = q->in_len,
                             .output_len = ok ? q->generated : 0,
                             .ok = ok};
        if (err)
            err->name[i] = q->err ? pl_errname(q->err, err->buf[i]) : NULL;
    }
    return t;
}

static void errnames_done(errnames_t *e)
{
    free(e->name);
    free(e->buf);
}

static double rec_ms(const pl_rec_t *r, int which)
{
    if (r->err || r->t_done < 0)
        return NAN;
    switch (which) {
    case L_TTFT:
        return (r->t_first - r->t_arrive) * 1e3;
    case L_TPOT:
        return r->generated > 1 ? (r->t_done - r->t_first) * 1e3 / (r->generated - 1) : NAN;
    default:
        return (r->t_done - r->t_arrive) * 1e3;
    }
}

static void summarize(const pl_report_t *r, summary_t *s)
{
    memset(s, 0, sizeof(*s));
    for (uint32_t i = 0; i < r->n_rec; i++) {
        const pl_rec_t *q = &r->rec[i];
        if (q->err) {
            s->failed++;
            pl_report_count_err(s->req_errs, &s->n_req_errs, q->err);
        } else if (q->t_done >= 0) {
            s->done++;
        }
        if (q->t_admit >= 0) {
            s->prompt += q->in_len;
            s->cached += q->cached;
            s->inflight += q->inflight;
            s->n_inflight += q->inflight > 0;
        }
        s->out_tokens += q->generated;
    }
    pl_timing_t *t = timings(r, NULL);
    pl_metrics_compute(t, r->n_rec, r->wall_s > 0 ? r->wall_s : 1e-9, &r->metrics, &s->m);
    free(t);
}

static double pct(double a, double b)
{
    return b > 0 ? 100.0 * a / b : 0;
}

/* ---------------------------------------------------------------- table */

void pl_report_print(const pl_report_t *r, FILE *f)
{
    summary_t s;
    summarize(r, &s);
    double w = r->wall_s > 0 ? r->wall_s : 1e-9;
    char speed[48] = "as fast as possible";
    if (r->speed > 0)
        snprintf(speed, sizeof(speed), "%gx recorded", r->speed);
    fprintf(f, "\npatload summary: %s (%s, %u requests", r->trace, r->format, r->trace_requests);
    if (r->passes > 1)
        fprintf(f, ", %u passes", r->passes);
    fprintf(f, ")\n");
    fprintf(f,
            "  patd %s backend, KV pool %s; model %u layers, %u/%u heads x %u; compute stand-in "
            "%s%s%s\n"
            "  concurrency %u, batch %u tokens, prefill chunk %u, arrivals %s, scale %g (%u "
            "tokens per trace block)\n",
            r->backend, r->kv_pool ? r->kv_pool : "?", r->n_layers, r->q_heads, r->kv_heads,
            r->head_dim, r->compute, r->device && r->device[0] ? " on " : "",
            r->device ? r->device : "", r->concurrency, r->max_batch_tokens, r->chunk,
            r->arrivals ? r->arrivals : speed, r->scale, r->block_tokens);
    fputc('\n', f);
    if (r->interrupted)
        fprintf(f, "  (interrupted) requests running then count as failed (ECANCELED)\n");
    pl_metrics_print(&s.m, &r->metrics, r->not_started, f);
    fputc('\n', f);
    fprintf(f,
            "  tokens       prompt %llu (prefix cache held %llu = %.1f %%), prefill computed "
            "%llu, output %llu\n",
            (unsigned long long)s.prompt, (unsigned long long)s.cached, pct(s.cached, s.prompt),
            (unsigned long long)r->prefill_tokens, (unsigned long long)s.out_tokens);
    fprintf(f,
            "  twins        %u opened while another request prefilled their prefix: %llu tokens "
            "(%.1f %%) a wait or an attach could have cached; %llu admissions put off\n",
            s.n_inflight, (unsigned long long)s.inflight, pct(s.inflight, s.prompt),
            (unsigned long long)r->twin_waits);
    fprintf(f,
            "  steps        %llu, mean batch %.1f tokens (%.1f tok/s through attention), pack "
            "reused %.1f %%, mean step %.2f ms (daemon %.2f ms), preemptions %llu\n",
            (unsigned long long)r->steps, r->steps ? (double)r->step_tokens / r->steps : 0,
            r->step_tokens / w, pct(r->pack_reused, r->steps),
            r->steps ? r->step_wall_ms_sum / r->steps : 0,
            r->steps ? r->daemon_ms_sum / r->steps : 0, (unsigned long long)r->preemptions);
    fprintf(
        f, "\n  KV read      %.1f MB by patd vs %.1f MB query-centric: %.2fx less, %.1f %% saved\n",
        r->kv_bytes / 1e6, r->qc_bytes / 1e6, r->kv_bytes ? (double)r->qc_bytes / r->kv_bytes : 0,
        100.0 - pct(r->kv_bytes, r->qc_bytes));
    fprintf(f,
            "  KV decode    %.1f MB vs %.1f MB query-centric over the %llu steps without prefill "
            "(%.2fx less)\n",
            r->decode_kv_bytes / 1e6, r->decode_qc_bytes / 1e6, (unsigned long long)r->decode_steps,
            r->decode_kv_bytes ? (double)r->decode_qc_bytes / r->decode_kv_bytes : 0);
    if (r->kv_blocks_total > 0)
        fprintf(f, "  KV blocks    peak %lld of %lld in use (%.1f %%)\n",
                (long long)r->kv_blocks_peak, (long long)r->kv_blocks_total,
                pct(r->kv_blocks_peak, r->kv_blocks_total));
    char eb[PL_ERRNAME_LEN];
    fprintf(f, "  errors       ");
    if (!s.n_req_errs)
        fprintf(f, "none");
    for (uint32_t i = 0; i < s.n_req_errs; i++)
        fprintf(f, "%s%s %llu", i ? ", " : "", pl_errname(s.req_errs[i].err, eb),
                (unsigned long long)s.req_errs[i].n);
    fprintf(f, " (failed requests by code)\n  refusals     ");
    if (!r->n_step_errs)
        fprintf(f, "none");
    for (uint32_t i = 0; i < r->n_step_errs; i++)
        fprintf(f, "%s%s %llu", i ? ", " : "", pl_errname(r->step_errs[i].err, eb),
                (unsigned long long)r->step_errs[i].n);
    fprintf(f, " (steps the daemon refused; ENOSPC/EDQUOT preempt and retry)\n");
}

/* ---------------------------------------------------------------- JSON */

static json_object *errs_json(const pl_errcount_t *t, uint32_t n)
{
    json_object *o = json_object_new_object();
    char eb[PL_ERRNAME_LEN];
    for (uint32_t i = 0; i < n; i++) /* the key is copied */
        json_object_object_add(o, pl_errname(t[i].err, eb), json_object_new_int64((int64_t)t[i].n));
    return o;
}

int pl_report_json(const pl_report_t *r, const char *path)
{
    summary_t s;
    summarize(r, &s);
    json_object *o = json_object_new_object(), *cfg = json_object_new_object();
#define ADD(obj, k, v) json_object_object_add(obj, k, v)
    ADD(cfg, "trace", json_object_new_string(r->trace));
    ADD(cfg, "format", json_object_new_string(r->format));
    ADD(cfg, "trace_requests", json_object_new_int64(r->trace_requests));
    ADD(cfg, "passes", json_object_new_int64(r->passes));
    ADD(cfg, "backend", json_object_new_string(r->backend));
    ADD(cfg, "kv_pool", json_object_new_string(r->kv_pool ? r->kv_pool : ""));
    ADD(cfg, "compute", json_object_new_string(r->compute));
    ADD(cfg, "device", json_object_new_string(r->device ? r->device : ""));
    ADD(cfg, "speed", pl_json_double(r->speed));
    ADD(cfg, "arrivals", json_object_new_string(r->arrivals ? r->arrivals : ""));
    ADD(cfg, "trace_dropped", json_object_new_int64(r->trace_dropped));
    ADD(cfg, "scale", pl_json_double(r->scale));
    ADD(cfg, "block_tokens", json_object_new_int64(r->block_tokens));
    ADD(cfg, "concurrency", json_object_new_int64(r->concurrency));
    ADD(cfg, "max_batch_tokens", json_object_new_int64(r->max_batch_tokens));
    ADD(cfg, "chunk", json_object_new_int64(r->chunk));
    ADD(cfg, "layers", json_object_new_int64(r->n_layers));
    ADD(cfg, "q_heads", json_object_new_int64(r->q_heads));
    ADD(cfg, "kv_heads", json_object_new_int64(r->kv_heads));
    ADD(cfg, "head_dim", json_object_new_int64(r->head_dim));
    ADD(o, "config", cfg);
    double w = r->wall_s > 0 ? r->wall_s : 1e-9;
    /* set-up fields under vLLM's --save-result names */
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y%m%d-%H%M%S", localtime(&now));
    ADD(o, "date", json_object_new_string(date));
    ADD(o, "num_prompts", json_object_new_int64(r->trace_requests));
    ADD(o, "request_rate",
        isnan(r->request_rate)   ? NULL
        : isinf(r->request_rate) ? json_object_new_string("inf")
                                 : pl_json_double(r->request_rate));
    ADD(o, "burstiness",
        isnan(r->burstiness)   ? NULL
        : isinf(r->burstiness) ? json_object_new_string("inf")
                               : pl_json_double(r->burstiness));
    ADD(o, "max_concurrency", json_object_new_int64(r->concurrency));
    pl_metrics_json(&s.m, &r->metrics, o);
    ADD(o, "requests", json_object_new_int64(r->n_rec + r->not_started));
    ADD(o, "done", json_object_new_int64(s.done));
    ADD(o, "not_started", json_object_new_int64(r->not_started));
    ADD(o, "interrupted", json_object_new_boolean(r->interrupted));
    ADD(o, "wall_s", pl_json_double(r->wall_s));
    ADD(o, "req_per_s", pl_json_double(s.done / w));
    ADD(o, "prompt_tokens", json_object_new_int64((int64_t)s.prompt));
    ADD(o, "cached_tokens", json_object_new_int64((int64_t)s.cached));
    ADD(o, "prefix_hit", pl_json_double(s.prompt ? (double)s.cached / s.prompt : 0));
    ADD(o, "inflight_tokens", json_object_new_int64((int64_t)s.inflight));
    ADD(o, "inflight_requests", json_object_new_int64((int64_t)s.n_inflight));
    ADD(o, "twin_waits", json_object_new_int64((int64_t)r->twin_waits));
    ADD(o, "prefill_tokens", json_object_new_int64((int64_t)r->prefill_tokens));
    ADD(o, "output_tokens", json_object_new_int64((int64_t)s.out_tokens));
    ADD(o, "output_tok_per_s", pl_json_double(s.out_tokens / w));
    ADD(o, "tok_per_s", pl_json_double(r->step_tokens / w));
    ADD(o, "steps", json_object_new_int64((int64_t)r->steps));
    ADD(o, "step_tokens", json_object_new_int64((int64_t)r->step_tokens));
    ADD(o, "pack_reused", json_object_new_int64((int64_t)r->pack_reused));
    ADD(o, "preemptions", json_object_new_int64((int64_t)r->preemptions));
    ADD(o, "kv_bytes", json_object_new_int64((int64_t)r->kv_bytes));
    ADD(o, "qc_bytes", json_object_new_int64((int64_t)r->qc_bytes));
    ADD(o, "decode_steps", json_object_new_int64((int64_t)r->decode_steps));
    ADD(o, "decode_kv_bytes", json_object_new_int64((int64_t)r->decode_kv_bytes));
    ADD(o, "decode_qc_bytes", json_object_new_int64((int64_t)r->decode_qc_bytes));
    ADD(o, "kv_blocks_total", json_object_new_int64(r->kv_blocks_total));
    ADD(o, "kv_blocks_peak", json_object_new_int64(r->kv_blocks_peak));
    /* patload's own latency objects (the figures above, null when there are none) */
    static const char *const keys[3] = {"ttft_ms", "tpot_ms", "e2e_ms"};
    static const pl_metric_t which[3] = {PL_M_TTFT, PL_M_TPOT, PL_M_E2EL};
    for (int k = 0; k < 3; k++) {
        const pl_stat_t *st = &s.m.stat[which[k]];
        json_object *l = json_object_new_object();
        ADD(l, "p50", pl_json_double(st->n ? st->p50 : NAN));
        ADD(l, "p90", pl_json_double(st->n ? st->p90 : NAN));
        ADD(l, "p99", pl_json_double(st->n ? st->p99 : NAN));
        ADD(l, "mean", pl_json_double(st->n ? st->mean : NAN));
        ADD(l, "n", json_object_new_int64(st->n));
        ADD(o, keys[k], l);
    }
    if (r->save_detailed) {
        errnames_t err;
        pl_timing_t *t = timings(r, &err);
        pl_metrics_json_detailed(t, err.name, r->n_rec, o);
        free(t);
        errnames_done(&err);
    }
    ADD(o, "errors_by_code", errs_json(s.req_errs, s.n_req_errs));
    ADD(o, "step_refusals", errs_json(r->step_errs, r->n_step_errs));
#undef ADD
    int rc = json_object_to_file_ext(path, o, JSON_C_TO_STRING_PRETTY) == 0 ? 0 : -EIO;
    json_object_put(o);
    return rc;
}

/* ---------------------------------------------------------------- CSV */

static void csv_num(FILE *f, double x, int last)
{
    if (isnan(x))
        fputs(last ? "\n" : ",", f);
    else
        fprintf(f, last ? "%.3f\n" : "%.3f,", x);
}

int pl_report_csv(const pl_report_t *r, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "line,pass,arrive_s,admit_s,first_s,done_s,input,output,cached,generated,"
               "preempted,ttft_ms,tpot_ms,e2e_ms,error\n");
    for (uint32_t i = 0; i < r->n_rec; i++) {
        const pl_rec_t *q = &r->rec[i];
        fprintf(f, "%u,%u,%.6f,", q->line, q->pass, q->t_arrive);
        csv_num(f, q->t_admit >= 0 ? q->t_admit : NAN, 0);
        csv_num(f, q->t_first >= 0 ? q->t_first : NAN, 0);
        csv_num(f, q->t_done >= 0 ? q->t_done : NAN, 0);
        fprintf(f, "%u,%u,%u,%u,%u,", q->in_len, q->out_len, q->cached, q->generated, q->preempted);
        for (int k = 0; k < N_LAT; k++)
            csv_num(f, rec_ms(q, k), 0);
        char eb[PL_ERRNAME_LEN];
        fprintf(f, "%s\n", q->err ? pl_errname(q->err, eb) : "");
    }
    return fclose(f) == 0 ? 0 : -EIO;
}

void pl_step_csv_header(FILE *f)
{
    fprintf(f, "t_s,seqs,tokens,prefill_tokens,running,queued,wall_ms,daemon_ms,kv_bytes,"
               "qc_bytes,pack_reused,kv_blocks_used\n");
}

void pl_step_csv_row(FILE *f, const pl_step_rec_t *s)
{
    fprintf(f, "%.6f,%u,%u,%u,%u,%u,%.3f,%.3f,%llu,%llu,%u,", s->t_s, s->seqs, s->tokens,
            s->prefill_tokens, s->running, s->queued, s->wall_ms, s->daemon_ms,
            (unsigned long long)s->kv_bytes, (unsigned long long)s->qc_bytes, s->pack_reused);
    if (s->kv_blocks_used >= 0)
        fprintf(f, "%lld\n", (long long)s->kv_blocks_used);
    else
        fputc('\n', f);
}

/* ---------------------------------------------------------------- plot */

/* gnuplot single-quoted string: a quote is doubled */
static void gp_str(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        if (*s != '\n')
            fputc(*s, f);
    }
    fputc('\'', f);
}

int pl_report_plot(const char *png, const char *requests_csv, const char *steps_csv,
                   const char *title, double t_max, char *why, size_t why_len)
{
    FILE *g = popen("gnuplot 2>&1", "w");
    if (!g)
        return pl_fail(why, why_len, -errno, "cannot run gnuplot: %s", strerror(errno));
    fprintf(g, "set terminal pngcairo noenhanced size 1400,1100 font 'sans,10'\nset output ");
    gp_str(g, png);
    fprintf(g, "\nset datafile separator ','\nset grid\nset key outside right top\n"
               "set lmargin 12\nset rmargin 30\n");
    if (t_max > 0)
        fprintf(g, "set xrange [0:%g]\n", t_max);
    else
        fprintf(g, "set xrange [0:*]\n");
    fprintf(g, "set multiplot layout 3,1 title ");
    gp_str(g, title);
    /* 1: per-request latencies, log scale */
    fprintf(g, "\nset logscale y\nset ylabel 'latency (ms)'\nset format y '%%g'\nplot ");
    gp_str(g, requests_csv);
    fprintf(g, " skip 1 using 6:14 with points pt 7 ps 0.5 lc rgb '#999999' title "
               "'end-to-end (at finish)', '' skip 1 using 5:12 with points pt 7 ps 0.5 lc rgb "
               "'#d62728' title 'TTFT (at first token)', '' skip 1 using 6:13 with points pt 7 "
               "ps 0.5 lc rgb '#1f77b4' title 'TPOT (at finish)'\n");
    /* 2: sequences in the step, running, queued */
    fprintf(g, "unset logscale y\nset offsets 0, 0, graph 0.1, 0\nset yrange [0:*]\n"
               "set ylabel 'requests'\nplot ");
    gp_str(g, steps_csv);
    fprintf(g, " skip 1 using 1:2 with steps lw 1.5 lc rgb '#2ca02c' title 'sequences per step', "
               "'' skip 1 using 1:6 with steps lc rgb '#8c564b' title 'queued'\n");
    /* 3: tokens per step, KV blocks in use */
    fprintf(g, "set xlabel 'time since the replay started (s)'\nset ylabel 'tokens per step'\n"
               "set y2label 'KV blocks in use'\nset ytics nomirror\nset y2tics\n"
               "set y2range [0:*]\nplot ");
    gp_str(g, steps_csv);
    fprintf(g, " skip 1 using 1:3 with steps lc rgb '#ff7f0e' title 'tokens per step', '' skip 1 "
               "using 1:12 axes x1y2 with steps lw 2 lc rgb '#9467bd' title 'KV blocks in use'\n"
               "unset multiplot\n");
    int st = pclose(g);
    if (st == -1)
        return pl_fail(why, why_len, -errno, "gnuplot: %s", strerror(errno));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        return pl_fail(why, why_len, -ENOENT,
                       "gnuplot is not installed (Debian: apt-get install gnuplot-nox); the CSV "
                       "files are written");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return pl_fail(why, why_len, -EIO, "gnuplot failed (exit %d) drawing %s", WEXITSTATUS(st),
                       png);
    return 0;
}
