/*
 * patload_metrics.c — serving figures in the serving benchmarks' terms (patload_metrics.h), for
 * comparing a patload run with a `vllm bench serve` or SGLang bench_serving run of the same
 * workload.
 *
 * Definitions follow vLLM's vllm/benchmarks/serve.py (calculate_metrics, benchmark; read at
 * github.com/vllm-project/vllm, commit 009e6d4a) so that a figure under a vLLM field name means
 * what it means there:
 *   - completed / failed count requests; total_input_tokens and total_output_tokens sum the
 *     completed ones; request_throughput = completed / duration, output_throughput =
 *     total_output / duration, total_token_throughput = (total_input + total_output) / duration;
 *   - TTFT and E2EL per completed request; TPOT = (E2EL - TTFT) / (output tokens - 1) over
 *     requests with 2 or more output tokens; ITL pooled over every gap between successive output
 *     tokens of every completed request;
 *   - mean, median, population standard deviation and percentiles interpolated linearly between
 *     closest ranks (numpy's defaults); an empty list reports 0 (numpy over [0]);
 *   - goodput (DistServe's): a completed request is good when it meets every SLO given (TTFT,
 *     TPOT and E2EL at most the bound; TPOT counts as 0 for a single-token output);
 *     request_goodput = good / duration;
 *   - max_concurrent_requests: the most completed requests whose [start, start + E2EL)
 *     intervals overlap (a sweep, departures before arrivals at equal times);
 *     max_output_tokens_per_s: the most output tokens (at start + TTFT + the ITLs) in one
 *     1-second bucket counted from the earliest start;
 *   - percentile keys p{P}_<metric>_ms with P as Python prints it: "99", "99.9".
 * patload's start is a request's arrival (its recorded or synthetic time, or when the previous
 * turn of its session finished), so TTFT and E2EL include the wait in patload's queue, as a
 * server's own queue counts in vLLM's client-side figures.
 */
#include "patload_metrics.h"
#include "pat_base.h"      /* pat_xmalloc */
#include "patload_trace.h" /* pl_fail, PL_TRACE_MAX_REQS */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const metric_names[PL_M_N] = {"ttft", "tpot", "itl", "e2el"};
static const char *const metric_titles[PL_M_N] = {"TTFT", "TPOT", "ITL", "E2EL"};
static const char *const slo_names[PL_SLO_N] = {"ttft", "tpot", "e2el"};

/* ---------------------------------------------------------------- options */

void pl_metrics_cfg_init(pl_metrics_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->pct[0] = 90;
    cfg->pct[1] = 99;
    cfg->n_pct = 2;
    for (int k = 0; k < PL_SLO_N; k++)
        cfg->slo_ms[k] = NAN;
}

int pl_metrics_parse_percentiles(pl_metrics_cfg_t *cfg, const char *v, char *why, size_t why_len)
{
    uint32_t n = 0;
    const char *p = v;
    for (;;) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || !(x >= 0 && x <= 100) || (*end && *end != ','))
            return pl_fail(why, why_len, -EINVAL,
                           "--percentiles %s: expected numbers in [0, 100] separated by commas", v);
        if (n == PL_MAX_PCT)
            return pl_fail(why, why_len, -EINVAL, "--percentiles %s: at most %d values", v,
                           PL_MAX_PCT);
        cfg->pct[n++] = x;
        if (!*end)
            break;
        p = end + 1;
    }
    cfg->n_pct = n;
    return 0;
}

int pl_metrics_is_slo_word(const char *s)
{
    for (int k = 0; k < PL_SLO_N; k++) {
        size_t nl = strlen(slo_names[k]);
        if (!strncmp(s, slo_names[k], nl) && s[nl] == ':') {
            char *end;
            strtod(s + nl + 1, &end);
            return end != s + nl + 1;
        }
    }
    return 0;
}

int pl_metrics_parse_goodput(pl_metrics_cfg_t *cfg, const char *v, char *why, size_t why_len)
{
    const char *p = v;
    do { /* one KEY:MS per pass; an empty value or an empty pair (",,", a trailing ",") fails */
        const char *c = strchr(p, ':');
        const char *comma = strchr(p, ',');
        if (!c || (comma && comma < c))
            return pl_fail(why, why_len, -EINVAL,
                           "--goodput '%s': expected KEY:MS pairs separated by commas (KEY ttft, "
                           "tpot or e2el)",
                           v);
        int k = -1;
        for (int j = 0; j < PL_SLO_N; j++)
            if ((size_t)(c - p) == strlen(slo_names[j]) && !strncmp(p, slo_names[j], c - p))
                k = j;
        if (k < 0)
            return pl_fail(why, why_len, -EINVAL,
                           "--goodput %.*s: not an SLO patload knows (ttft, tpot, e2el)",
                           (int)(c - p), p);
        char *end;
        errno = 0;
        double ms = strtod(c + 1, &end);
        if (end == c + 1 || errno || !isfinite(ms) || ms < 0 || (*end && *end != ','))
            return pl_fail(why, why_len, -EINVAL,
                           "--goodput %s: the %s bound must be a number of ms >= 0", v,
                           slo_names[k]);
        if (!isnan(cfg->slo_ms[k]))
            return pl_fail(why, why_len, -EINVAL, "--goodput: %s given twice", slo_names[k]);
        cfg->slo_ms[k] = ms;
        p = end;
    } while (*p++ == ',');
    return 0;
}

static int have_slo(const pl_metrics_cfg_t *cfg)
{
    for (int k = 0; k < PL_SLO_N; k++)
        if (!isnan(cfg->slo_ms[k]))
            return 1;
    return 0;
}

/* ---------------------------------------------------------------- figures */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double pl_percentile_sorted(const double *v, uint32_t n, double p)
{
    if (n == 0)
        return 0;
    double h = (n - 1) * (p / 100.0);
    double lo = floor(h);
    uint32_t i = (uint32_t)lo, j = i + 1 < n ? i + 1 : n - 1;
    return v[i] + (h - lo) * (v[j] - v[i]);
}

/* Sorts the n values (ms) in place and fills s. */
static void stat_of(double *v, uint32_t n, const pl_metrics_cfg_t *cfg, pl_stat_t *s)
{
    memset(s, 0, sizeof(*s));
    s->n = n;
    if (n == 0)
        return;
    qsort(v, n, sizeof(*v), cmp_double);
    double sum = 0, sq = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += v[i];
    s->mean = sum / n;
    for (uint32_t i = 0; i < n; i++)
        sq += (v[i] - s->mean) * (v[i] - s->mean);
    s->std = sqrt(sq / n);
    s->median = pl_percentile_sorted(v, n, 50);
    for (uint32_t k = 0; k < cfg->n_pct; k++)
        s->pct[k] = pl_percentile_sorted(v, n, cfg->pct[k]);
    s->p50 = s->median;
    s->p90 = pl_percentile_sorted(v, n, 90);
    s->p99 = pl_percentile_sorted(v, n, 99);
}

static double tpot_s(const pl_timing_t *r)
{
    return r->output_len > 1 ? (r->latency_s - r->ttft_s) / (r->output_len - 1) : 0;
}

typedef struct event {
    double t;
    int delta; /* -1 a departure, +1 an arrival: sorts departures first */
} event_t;

static int cmp_event(const void *a, const void *b)
{
    const event_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return (x->delta > y->delta) - (x->delta < y->delta);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void peaks(const pl_timing_t *req, uint32_t n, uint64_t n_tokens, pl_metrics_t *m)
{
    event_t *ev = pat_xmalloc((size_t)m->completed * 2 * sizeof(*ev));
    uint32_t ne = 0;
    double t0 = INFINITY, t1 = -INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        const pl_timing_t *r = &req[i];
        if (!r->ok)
            continue;
        ev[ne++] = (event_t){r->start_s, +1};
        ev[ne++] = (event_t){r->start_s + r->latency_s, -1};
        t0 = r->start_s < t0 ? r->start_s : t0;
        t1 = r->start_s + r->latency_s > t1 ? r->start_s + r->latency_s : t1;
    }
    qsort(ev, ne, sizeof(*ev), cmp_event);
    int64_t cur = 0, most = 0;
    for (uint32_t i = 0; i < ne; i++) {
        cur += ev[i].delta;
        most = cur > most ? cur : most;
    }
    m->max_concurrent_requests = (uint32_t)most;
    free(ev);

    /* output tokens per 1-s bucket from the earliest start; ceil(span) + 1 buckets */
    int64_t *b = pat_xmalloc((size_t)n_tokens * sizeof(*b));
    uint64_t nb = 0;
    double buckets = ceil(t1 - t0) + 1;
    for (uint32_t i = 0; i < n; i++) {
        const pl_timing_t *r = &req[i];
        if (!r->ok)
            continue;
        double t = r->start_s + r->ttft_s;
        for (uint32_t k = 0;; k++) {
            double x = trunc(t - t0);                /* Python's int(): toward zero */
            if (x >= 0 && x < buckets && x < 0x1p63) /* 2^63: the cast is defined below it */
                b[nb++] = (int64_t)x;
            if (k == r->n_itl)
                break;
            t += r->itl_s[k];
        }
    }
    qsort(b, nb, sizeof(*b), cmp_i64);
    uint64_t run = 0, best = 0;
    for (uint64_t i = 0; i < nb; i++) {
        run = i > 0 && b[i] == b[i - 1] ? run + 1 : 1;
        best = run > best ? run : best;
    }
    m->max_output_tokens_per_s = (double)best;
    free(b);
}

int pl_metrics_compute(const pl_timing_t *req, uint32_t n, double duration_s,
                       const pl_metrics_cfg_t *cfg, pl_metrics_t *ret)
{
    pl_metrics_t *m = ret;
    memset(m, 0, sizeof(*m));
    m->duration_s = duration_s;
    uint64_t n_itl = 0;
    for (uint32_t i = 0; i < n; i++) {
        const pl_timing_t *r = &req[i];
        if (!r->ok) {
            m->failed++;
            continue;
        }
        m->completed++;
        m->total_input += r->input_len;
        m->total_output += r->output_len;
        n_itl += r->n_itl;
    }
    double *v = pat_xmalloc((size_t)(n_itl > n ? n_itl : n) * sizeof(*v));
    for (int k = 0; k < PL_M_N; k++) {
        uint64_t c = 0;
        for (uint32_t i = 0; i < n; i++) {
            const pl_timing_t *r = &req[i];
            if (!r->ok)
                continue;
            if (k == PL_M_TTFT)
                v[c++] = r->ttft_s * 1e3;
            else if (k == PL_M_E2EL)
                v[c++] = r->latency_s * 1e3;
            else if (k == PL_M_TPOT && r->output_len > 1)
                v[c++] = tpot_s(r) * 1e3;
            else if (k == PL_M_ITL)
                for (uint32_t j = 0; j < r->n_itl; j++)
                    v[c++] = r->itl_s[j] * 1e3;
        }
        stat_of(v, (uint32_t)c, cfg, &m->stat[k]);
    }
    free(v);

    m->request_goodput = NAN;
    if (have_slo(cfg)) {
        for (uint32_t i = 0; i < n; i++) {
            const pl_timing_t *r = &req[i];
            if (!r->ok)
                continue;
            /* compared in seconds as vLLM compares them (bound / 1000 >= value) */
            const double val[PL_SLO_N] = {r->ttft_s, tpot_s(r), r->latency_s};
            int good = 1;
            for (int k = 0; k < PL_SLO_N; k++)
                if (!isnan(cfg->slo_ms[k]) && !(cfg->slo_ms[k] / 1000.0 >= val[k]))
                    good = 0;
            m->good += good;
        }
        m->request_goodput = m->good / duration_s;
    }
    m->request_throughput = m->completed / duration_s;
    m->output_throughput = m->total_output / duration_s;
    m->total_token_throughput = (m->total_input + m->total_output) / duration_s;
    if (m->completed)
        peaks(req, n, n_itl + m->completed, m);
    return 0;
}

/* ---------------------------------------------------------------- output */

/* P as Python's str() writes a float: "99" for integers, else the shortest repr ("99.9"). */
static void pct_word(double p, char *buf, size_t len)
{
    if (p == floor(p)) {
        snprintf(buf, len, "%d", (int)p);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, p);
        if (strtod(buf, NULL) == p)
            return;
    }
}

void pl_metrics_print(const pl_metrics_t *m, const pl_metrics_cfg_t *cfg, int64_t not_started,
                      FILE *f)
{
    fprintf(f, "  requests     %u completed, %u failed", m->completed, m->failed);
    if (not_started >= 0)
        fprintf(f, ", %lld not started", (long long)not_started);
    fprintf(f, " in %.2f s: %.2f req/s; at most %u at once\n", m->duration_s, m->request_throughput,
            m->max_concurrent_requests);
    if (have_slo(cfg)) {
        fprintf(f, "  goodput      %.2f req/s: %u of %u completed met", m->request_goodput, m->good,
                m->completed);
        const char *sep = " ";
        for (int k = 0; k < PL_SLO_N; k++)
            if (!isnan(cfg->slo_ms[k])) {
                fprintf(f, "%s%s <= %g ms", sep, slo_names[k], cfg->slo_ms[k]);
                sep = " and ";
            }
        fputc('\n', f);
    }
    fprintf(f,
            "  throughput   %.1f output tok/s (peak %.0f in one second), %.1f input + output "
            "tok/s\n",
            m->output_throughput, m->max_output_tokens_per_s, m->total_token_throughput);
    fprintf(f, "\n  latency (ms)       mean     median        std");
    for (uint32_t k = 0; k < cfg->n_pct; k++) {
        char w[32], h[40];
        pct_word(cfg->pct[k], w, sizeof(w));
        snprintf(h, sizeof(h), "p%s", w);
        fprintf(f, " %10s", h);
    }
    fprintf(f, "        n\n");
    for (int k = 0; k < PL_M_N; k++) {
        const pl_stat_t *s = &m->stat[k];
        fprintf(f, "  %-12s %10.2f %10.2f %10.2f", metric_titles[k], s->mean, s->median, s->std);
        for (uint32_t j = 0; j < cfg->n_pct; j++)
            fprintf(f, " %10.2f", s->pct[j]);
        fprintf(f, " %8u\n", s->n);
    }
}

json_object *pl_json_double(double x)
{
    return isfinite(x) ? json_object_new_double(x) : NULL;
}

void pl_metrics_json(const pl_metrics_t *m, const pl_metrics_cfg_t *cfg, json_object *o)
{
#define ADD(k, v) json_object_object_add(o, k, v)
    ADD("duration", pl_json_double(m->duration_s));
    ADD("completed", json_object_new_int64(m->completed));
    ADD("failed", json_object_new_int64(m->failed));
    ADD("total_input_tokens", json_object_new_int64((int64_t)m->total_input));
    ADD("total_output_tokens", json_object_new_int64((int64_t)m->total_output));
    ADD("request_throughput", pl_json_double(m->request_throughput));
    ADD("request_goodput", pl_json_double(m->request_goodput)); /* NAN without --goodput */
    ADD("output_throughput", pl_json_double(m->output_throughput));
    ADD("total_token_throughput", pl_json_double(m->total_token_throughput));
    ADD("max_output_tokens_per_s", pl_json_double(m->max_output_tokens_per_s));
    ADD("max_concurrent_requests", json_object_new_int64(m->max_concurrent_requests));
    for (int k = 0; k < PL_M_N; k++) {
        const pl_stat_t *s = &m->stat[k];
        char key[64], w[32];
        snprintf(key, sizeof(key), "mean_%s_ms", metric_names[k]);
        ADD(key, pl_json_double(s->mean));
        snprintf(key, sizeof(key), "median_%s_ms", metric_names[k]);
        ADD(key, pl_json_double(s->median));
        snprintf(key, sizeof(key), "std_%s_ms", metric_names[k]);
        ADD(key, pl_json_double(s->std));
        for (uint32_t j = 0; j < cfg->n_pct; j++) {
            pct_word(cfg->pct[j], w, sizeof(w));
            snprintf(key, sizeof(key), "p%s_%s_ms", w, metric_names[k]);
            ADD(key, pl_json_double(s->pct[j]));
        }
    }
    json_object *slo = NULL;
    if (have_slo(cfg)) {
        slo = json_object_new_object();
        for (int k = 0; k < PL_SLO_N; k++)
            if (!isnan(cfg->slo_ms[k]))
                json_object_object_add(slo, slo_names[k], pl_json_double(cfg->slo_ms[k]));
    }
    ADD("goodput_slo_ms", slo);
    ADD("good_requests", slo ? json_object_new_int64(m->good) : NULL);
    json_object *pl = json_object_new_array();
    for (uint32_t j = 0; j < cfg->n_pct; j++)
        json_object_array_add(pl, pl_json_double(cfg->pct[j]));
    ADD("percentiles", pl);
#undef ADD
}

void pl_metrics_json_detailed(const pl_timing_t *req, const char *const *err, uint32_t n,
                              json_object *o)
{
    json_object *in = json_object_new_array(), *out = json_object_new_array();
    json_object *start = json_object_new_array(), *ttft = json_object_new_array();
    json_object *itls = json_object_new_array(), *lat = json_object_new_array();
    json_object *errs = json_object_new_array();
    for (uint32_t i = 0; i < n; i++) {
        const pl_timing_t *r = &req[i];
        json_object_array_add(in, json_object_new_int64(r->input_len));
        json_object_array_add(out, json_object_new_int64(r->output_len));
        json_object_array_add(start, pl_json_double(r->start_s));
        json_object_array_add(ttft, pl_json_double(r->ttft_s));
        json_object_array_add(lat, pl_json_double(r->latency_s));
        json_object *g = json_object_new_array();
        for (uint32_t k = 0; k < r->n_itl; k++)
            json_object_array_add(g, pl_json_double(r->itl_s[k]));
        json_object_array_add(itls, g);
        json_object_array_add(errs, json_object_new_string(err[i] ? err[i] : ""));
    }
    json_object_object_add(o, "input_lens", in);
    json_object_object_add(o, "output_lens", out);
    json_object_object_add(o, "start_times", start);
    json_object_object_add(o, "ttfts", ttft);
    json_object_object_add(o, "itls", itls);
    json_object_object_add(o, "latencies", lat);
    json_object_object_add(o, "errors", errs);
}

/* ---------------------------------------------------------------- reading a saved run */

/* Bounds on what a saved file may hold: times in [0, SAVED_MAX_S] s (31 years; vLLM's start times
 * are time.perf_counter(), seconds since boot, patload's count from the replay's start), a
 * duration of at least SAVED_MIN_DURATION_S (a shorter one is no measurement, and the rates
 * divided by it would overflow). Every figure computed from such values is finite. */
#define SAVED_MAX_S          1e9
#define SAVED_MIN_DURATION_S 1e-6

/* The per-request arrays read, with the range of their numbers. */
enum { A_START, A_TTFT, A_LAT, A_ITLS, A_IN, A_OUT, A_N };
static const struct {
    const char *key;
    double lo, hi;
    int count; /* token counts: integers */
} arrays[A_N] = {
    [A_START] = {"start_times", 0, SAVED_MAX_S, 0}, [A_TTFT] = {"ttfts", 0, SAVED_MAX_S, 0},
    [A_LAT] = {"latencies", 0, SAVED_MAX_S, 0},     [A_ITLS] = {"itls", 0, SAVED_MAX_S, 0},
    [A_IN] = {"input_lens", 0, UINT32_MAX, 1},      [A_OUT] = {"output_lens", 0, UINT32_MAX, 1},
};

/* A JSON number in [lo, hi] (an integer when count): 0, or -EINVAL with why naming it as what. */
static int num_in(json_object *v, double lo, double hi, int count, double *ret, const char *what,
                  char *why, size_t why_len)
{
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return pl_fail(why, why_len, -EINVAL, "%s is not a number", what);
    double x = json_object_get_double(v);
    if (!(x >= lo && x <= hi) || (count && x != floor(x)))
        return pl_fail(why, why_len, -EINVAL, "%s = %g: expected %s in [%g, %g]", what, x,
                       count ? "a token count" : "seconds", lo, hi);
    *ret = x;
    return 0;
}

/* The array under key, of n elements when n != UINT32_MAX. NULL with why when missing. */
static json_object *array_of(json_object *root, const char *key, uint32_t n, char *why,
                             size_t why_len)
{
    json_object *a;
    if (!json_object_object_get_ex(root, key, &a) || !json_object_is_type(a, json_type_array)) {
        pl_fail(why, why_len, -EINVAL,
                "no \"%s\" array (the per-request arrays of patload --json --save-detailed or "
                "vLLM's --save-result --save-detailed are needed)",
                key);
        return NULL;
    }
    if (n != UINT32_MAX && json_object_array_length(a) != n) {
        pl_fail(why, why_len, -EINVAL, "\"%s\" has %zu entries, \"start_times\" %u", key,
                json_object_array_length(a), n);
        return NULL;
    }
    return a;
}

/* Whether request i failed: its errors entry (NULL: none) names a failure, or it has no output
 * and a latency of 0, which is what vLLM saves for every failure (its reason may be "": a non-200
 * reply with no reason phrase) and patload for its own. */
static int saved_failed(json_object *err, const double x[A_N])
{
    if (err &&
        !(json_object_is_type(err, json_type_string) && json_object_get_string_len(err) == 0))
        return 1;
    return x[A_OUT] == 0 && x[A_LAT] == 0;
}

int pl_saved_load(pl_saved_t *s, const char *path, char *why, size_t why_len)
{
    memset(s, 0, sizeof(*s));
    char w[256], what[64];
    int rc = 0;
    json_object *root = json_object_from_file(path);
    if (!root)
        return pl_fail(why, why_len, -EBADMSG, "%s: not a JSON file (%s)", path,
                       json_util_get_last_err());
    s->root = root;
    json_object *d, *a[A_N];
    if (!json_object_is_type(root, json_type_object) ||
        !json_object_object_get_ex(root, "duration", &d)) {
        rc = pl_fail(why, why_len, -EINVAL, "%s: no \"duration\" (seconds)", path);
        goto fail;
    }
    if ((rc = num_in(d, SAVED_MIN_DURATION_S, SAVED_MAX_S, 0, &s->duration_s, "duration", w,
                     sizeof(w))) < 0) {
        rc = pl_fail(why, why_len, rc, "%s: %s", path, w);
        goto fail;
    }
    if (!(a[A_START] = array_of(root, arrays[A_START].key, UINT32_MAX, w, sizeof(w)))) {
        rc = pl_fail(why, why_len, -EINVAL, "%s: %s", path, w);
        goto fail;
    }
    size_t n = json_object_array_length(a[A_START]);
    if (n == 0 || n > PL_TRACE_MAX_REQS) {
        rc = pl_fail(why, why_len, -EINVAL, "%s: %zu requests (1 to %u)", path, n,
                     PL_TRACE_MAX_REQS);
        goto fail;
    }
    for (int k = 1; k < A_N; k++)
        if (!(a[k] = array_of(root, arrays[k].key, (uint32_t)n, w, sizeof(w)))) {
            rc = pl_fail(why, why_len, -EINVAL, "%s: %s", path, w);
            goto fail;
        }
    /* the per-request error list, "" for a success (vLLM's and patload's "errors"); another
     * "errors" (a count by code, as some tools write) is no list: the zero rule alone applies */
    json_object *errs = NULL;
    if (!json_object_object_get_ex(root, "errors", &errs) ||
        !json_object_is_type(errs, json_type_array))
        errs = NULL;
    if (errs && json_object_array_length(errs) != n) {
        rc = pl_fail(why, why_len, -EINVAL, "%s: \"errors\" has %zu entries, \"start_times\" %zu",
                     path, json_object_array_length(errs), n);
        goto fail;
    }
    uint64_t n_itl = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *g = json_object_array_get_idx(a[A_ITLS], i);
        if (!json_object_is_type(g, json_type_array)) {
            rc = pl_fail(why, why_len, -EINVAL, "%s: itls[%zu] is not an array", path, i);
            goto fail;
        }
        n_itl += json_object_array_length(g);
    }
    s->n = (uint32_t)n;
    s->req = pat_xmalloc(n * sizeof(*s->req));
    s->itl = pat_xmalloc((size_t)n_itl * sizeof(*s->itl));
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        pl_timing_t *r = &s->req[i];
        double x[A_N] = {0};
        for (int k = 0; k < A_N; k++) {
            if (k == A_ITLS)
                continue;
            snprintf(what, sizeof(what), "%s[%zu]", arrays[k].key, i);
            if ((rc = num_in(json_object_array_get_idx(a[k], i), arrays[k].lo, arrays[k].hi,
                             arrays[k].count, &x[k], what, w, sizeof(w))) < 0) {
                rc = pl_fail(why, why_len, rc, "%s: %s", path, w);
                goto fail;
            }
        }
        json_object *e = errs ? json_object_array_get_idx(errs, i) : NULL;
        *r = (pl_timing_t){.start_s = x[A_START],
                           .ttft_s = x[A_TTFT],
                           .latency_s = x[A_LAT],
                           .itl_s = s->itl + at,
                           .input_len = (uint32_t)x[A_IN],
                           .output_len = (uint32_t)x[A_OUT],
                           .ok = !saved_failed(e, x)};
        json_object *g = json_object_array_get_idx(a[A_ITLS], i);
        r->n_itl = (uint32_t)json_object_array_length(g);
        for (uint32_t k = 0; k < r->n_itl; k++) {
            snprintf(what, sizeof(what), "itls[%zu][%u]", i, k);
            if ((rc = num_in(json_object_array_get_idx(g, k), arrays[A_ITLS].lo, arrays[A_ITLS].hi,
                             0, &s->itl[at++], what, w, sizeof(w))) < 0) {
                rc = pl_fail(why, why_len, rc, "%s: %s", path, w);
                goto fail;
            }
        }
    }
    return 0;
fail:
    pl_saved_done(s);
    return rc;
}

void pl_saved_done(pl_saved_t *s)
{
    if (!s)
        return;
    free(s->req);
    free(s->itl);
    if (s->root)
        json_object_put(s->root);
    memset(s, 0, sizeof(*s));
}
