/*
 * patload_trace.c — reads request traces for patload and derives the token ids a replay sends
 * (patload_trace.h). For operators and developers replaying shared/traces against patd.
 *
 * Formats (detected from the content, not the name):
 *   - JSON Lines, one object per request: timestamp (ms), input_length, output_length, and
 *     optionally hash_ids (prefix block hashes: Mooncake 512-token blocks, our synthetic traces
 *     16-token ones), session_id and turn (multi-turn traces). Other keys are ignored.
 *   - Azure LLM inference CSV: header TIMESTAMP,ContextTokens,GeneratedTokens, wall-clock
 *     timestamps "YYYY-MM-DD HH:MM:SS.fffffff".
 *   - BurstGPT CSV (github.com/HPMLL/BurstGPT, README "Schema"): a header naming Timestamp
 *     (seconds), Model, Request tokens, Response tokens, Total tokens, Log Type, in any order
 *     and with other columns (a later file adds Session ID and Elapsed time); only Timestamp,
 *     Request tokens and Response tokens are read, found by name (any case; each once). Rows
 *     with 0 response tokens are requests that failed in the recorded service (README, data
 *     files) and rows with 0 request tokens have nothing to replay: both are dropped and counted.
 * A UTF-8 byte order mark at the start is skipped. A trace is a user's file: every row is checked
 * and the first bad one is reported with its line and field; nothing half-read is kept. Files up
 * to PL_TRACE_MAX_BYTES after decompression (the largest bundled trace is 3 MB).
 */
#include "patload_trace.h"

#include <errno.h>
#include <json-c/json.h>
#include <lzma.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */
#include <xxhash.h>

int pl_fail(char *why, size_t why_len, int err, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return err;
}

const char *pl_format_name(pl_format_t f)
{
    switch (f) {
    case PL_FMT_JSONL:
        return "jsonl";
    case PL_FMT_AZURE_CSV:
        return "azure-csv";
    case PL_FMT_BURSTGPT_CSV:
        return "burstgpt-csv";
    case PL_FMT_GSP:
        return "gsp";
    }
    return "?";
}

/* ---------------------------------------------------------------- reading the bytes */

/* Doubles a buffer of trace text up to PL_TRACE_MAX_BYTES. 0; -EFBIG (the buffer is kept);
 * -ENOMEM (the buffer is freed and *buf is NULL). */
static int grow(char **buf, size_t *cap)
{
    if (*cap >= PL_TRACE_MAX_BYTES)
        return -EFBIG;
    char *nb = realloc(*buf, *cap * 2);
    if (!nb) {
        free(*buf);
        *buf = NULL;
        return -ENOMEM;
    }
    *buf = nb;
    *cap *= 2;
    return 0;
}

static int read_file(const char *path, char **ret, size_t *ret_len, char *why, size_t why_len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return pl_fail(why, why_len, -errno, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int rc = 0;
    for (;;) {
        if (!buf) {
            rc = pl_fail(why, why_len, -ENOMEM, "%s: out of memory", path);
            break;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f))
                rc = pl_fail(why, why_len, -EIO, "%s: read error", path);
            break;
        }
        if (len == cap && (rc = grow(&buf, &cap)) < 0) {
            rc = pl_fail(why, why_len, rc, "%s: %s than %llu bytes", path,
                         rc == -EFBIG ? "larger" : "out of memory reading more",
                         (unsigned long long)cap);
            break;
        }
    }
    fclose(f);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *ret = buf;
    *ret_len = len;
    return 0;
}

static int unxz(const char *path, const char *in, size_t in_len, char **ret, size_t *ret_len,
                char *why, size_t why_len)
{
    lzma_stream s = LZMA_STREAM_INIT;
    if (lzma_stream_decoder(&s, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK)
        return pl_fail(why, why_len, -ENOMEM, "%s: cannot start the xz decoder", path);
    size_t cap = in_len * 8 + 4096;
    if (cap > PL_TRACE_MAX_BYTES)
        cap = PL_TRACE_MAX_BYTES;
    char *out = malloc(cap);
    int rc = 0;
    s.next_in = (const uint8_t *)in;
    s.avail_in = in_len;
    while (out) {
        s.next_out = (uint8_t *)out + s.total_out;
        s.avail_out = cap - s.total_out;
        lzma_ret r = lzma_code(&s, LZMA_FINISH);
        if (r == LZMA_STREAM_END)
            break;
        if (r != LZMA_OK && r != LZMA_BUF_ERROR) {
            rc = pl_fail(why, why_len, -EBADMSG, "%s: not a valid xz file (liblzma error %d)", path,
                         (int)r);
            break;
        }
        if (s.avail_out == 0) {
            if ((rc = grow(&out, &cap)) < 0) {
                rc = pl_fail(why, why_len, rc, "%s: %s than %llu bytes", path,
                             rc == -EFBIG ? "decompresses to more"
                                          : "out of memory decompressing more",
                             (unsigned long long)cap);
                break;
            }
        } else if (r == LZMA_BUF_ERROR) {
            rc = pl_fail(why, why_len, -EBADMSG, "%s: truncated xz file", path);
            break;
        }
    }
    if (!out && rc == 0)
        rc = pl_fail(why, why_len, -ENOMEM, "%s: out of memory", path);
    size_t n = s.total_out;
    lzma_end(&s);
    if (rc < 0) {
        free(out);
        return rc;
    }
    *ret = out;
    *ret_len = n;
    return 0;
}

/* ---------------------------------------------------------------- building the table */

typedef struct builder {
    pl_trace_t *t;
    uint32_t cap;
    uint64_t hash_cap;
    int col_ts, col_in, col_out, n_cols; /* BurstGPT: the columns the header names */
} builder_t;

static int push_req(builder_t *b, const pl_req_t *r)
{
    if (b->t->n == b->cap) {
        uint32_t nc = b->cap ? b->cap * 2 : 1024;
        pl_req_t *nr = realloc(b->t->req, (size_t)nc * sizeof(*nr));
        if (!nr)
            return -ENOMEM;
        b->t->req = nr;
        b->cap = nc;
    }
    b->t->req[b->t->n++] = *r;
    return 0;
}

static int push_hash(builder_t *b, int64_t h)
{
    if (b->t->n_hash == b->hash_cap) {
        uint64_t nc = b->hash_cap ? b->hash_cap * 2 : 16384;
        int64_t *nh = realloc(b->t->hash, nc * sizeof(*nh));
        if (!nh)
            return -ENOMEM;
        b->t->hash = nh;
        b->hash_cap = nc;
    }
    b->t->hash[b->t->n_hash++] = h;
    return 0;
}

/* an integer field: json int (or an integral double) within [lo, hi] */
static int json_int(json_object *o, const char *key, int64_t lo, int64_t hi, int64_t *ret)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v))
        return -ENOENT;
    if (json_object_is_type(v, json_type_int)) {
        errno = 0;
        int64_t x = json_object_get_int64(v);
        if (errno == ERANGE || x < lo || x > hi)
            return -ERANGE;
        *ret = x;
        return 0;
    }
    if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi)
            return -ERANGE;
        *ret = (int64_t)d;
        return 0;
    }
    return -EINVAL;
}

static int parse_jsonl_row(builder_t *b, char *line, uint32_t lineno, pl_req_t *r, char *why,
                           size_t why_len)
{
    enum json_tokener_error jerr;
    json_object *o = json_tokener_parse_verbose(line, &jerr);
    int rc = 0;
    if (!o)
        return pl_fail(why, why_len, -EBADMSG, "line %u: not JSON (%s)", lineno,
                       json_tokener_error_desc(jerr));
    if (!json_object_is_type(o, json_type_object)) {
        rc = pl_fail(why, why_len, -EBADMSG, "line %u: not a JSON object", lineno);
        goto out;
    }
    json_object *ts;
    if (!json_object_object_get_ex(o, "timestamp", &ts) ||
        !(json_object_is_type(ts, json_type_int) || json_object_is_type(ts, json_type_double))) {
        rc = pl_fail(why, why_len, -EBADMSG, "line %u: \"timestamp\" (ms) missing or not a number",
                     lineno);
        goto out;
    }
    double ms = json_object_get_double(ts);
    if (!isfinite(ms) || ms < 0 || ms > 1e12) {
        rc = pl_fail(why, why_len, -ERANGE, "line %u: \"timestamp\" %g out of range", lineno, ms);
        goto out;
    }
    int64_t in, out_len;
    if (json_int(o, "input_length", 1, INT32_MAX, &in) < 0 ||
        json_int(o, "output_length", 0, INT32_MAX, &out_len) < 0) {
        rc = pl_fail(
            why, why_len, -EBADMSG,
            "line %u: \"input_length\" (>= 1) and \"output_length\" (>= 0) must be integers",
            lineno);
        goto out;
    }
    r->t_s = ms / 1000.0;
    r->in_len = (uint32_t)in;
    r->out_len = (uint32_t)out_len;
    r->hash_off = b->t->n_hash;
    r->n_hash = 0;
    json_object *h;
    if (json_object_object_get_ex(o, "hash_ids", &h)) {
        if (!json_object_is_type(h, json_type_array) || json_object_array_length(h) == 0 ||
            json_object_array_length(h) > (size_t)in) {
            rc = pl_fail(
                why, why_len, -EBADMSG,
                "line %u: \"hash_ids\" must be a non-empty array of at most input_length ids",
                lineno);
            goto out;
        }
        size_t n = json_object_array_length(h);
        for (size_t i = 0; i < n; i++) {
            json_object *e = json_object_array_get_idx(h, i);
            if (!json_object_is_type(e, json_type_int)) {
                rc = pl_fail(why, why_len, -EBADMSG, "line %u: hash_ids[%zu] is not an integer",
                             lineno, i);
                goto out;
            }
            if ((rc = push_hash(b, json_object_get_int64(e))) < 0) {
                rc = pl_fail(why, why_len, rc, "line %u: out of memory", lineno);
                goto out;
            }
        }
        r->n_hash = (uint32_t)n;
    }
    json_object *sid;
    r->session = -1;
    r->turn = 0;
    if (json_object_object_get_ex(o, "session_id", &sid)) {
        int64_t turn;
        if (json_object_is_type(sid, json_type_int) && json_object_get_int64(sid) >= 0) {
            r->session = json_object_get_int64(sid);
        } else if (json_object_is_type(sid, json_type_string)) {
            r->session = (int64_t)(XXH64(json_object_get_string(sid),
                                         (size_t)json_object_get_string_len(sid), 0) >>
                                   1);
        } else {
            rc = pl_fail(why, why_len, -EBADMSG,
                         "line %u: \"session_id\" must be a non-negative integer or a string",
                         lineno);
            goto out;
        }
        if (json_int(o, "turn", 1, INT32_MAX, &turn) < 0) {
            rc = pl_fail(why, why_len, -EBADMSG, "line %u: \"session_id\" needs \"turn\" (>= 1)",
                         lineno);
            goto out;
        }
        r->turn = (uint32_t)turn;
    }
out:
    json_object_put(o);
    return rc;
}

/* days since 1970-01-01 of a proleptic Gregorian date */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int parse_azure_row(char *line, uint32_t lineno, pl_req_t *r, char *why, size_t why_len)
{
    int y, mo, d, h, mi, n = 0;
    double sec;
    long long in, out;
    if (sscanf(line, "%4d-%2d-%2d %2d:%2d:%lf,%lld,%lld%n", &y, &mo, &d, &h, &mi, &sec, &in, &out,
               &n) != 8 ||
        (line[n] != '\0' && line[n] != '\r'))
        return pl_fail(
            why, why_len, -EBADMSG,
            "line %u: expected \"YYYY-MM-DD HH:MM:SS.fff,ContextTokens,GeneratedTokens\"", lineno);
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || !(sec >= 0 && sec < 61) ||
        in < 1 || in > INT32_MAX || out < 0 || out > INT32_MAX)
        return pl_fail(why, why_len, -ERANGE, "line %u: a field is out of range", lineno);
    r->t_s = (double)days_from_civil(y, mo, d) * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
    r->in_len = (uint32_t)in;
    r->out_len = (uint32_t)out;
    r->n_hash = 0;
    r->session = -1;
    r->turn = 0;
    return 0;
}

#define BURST_MAX_COLS 32 /* the releases have 6 and 8 columns */

/* A BurstGPT header: finds the three columns read, by name in any order and case, splitting at
 * every comma (an empty name is a column too). 0; 1 when it names none of them (another
 * format); -EBADMSG with why when it names some but not all, one twice, or too many columns. */
static int parse_burst_header(builder_t *b, char *line, char *why, size_t why_len)
{
    static const char *const names[3] = {"Timestamp", "Request tokens", "Response tokens"};
    int *const col[3] = {&b->col_ts, &b->col_in, &b->col_out};
    int found = 0, n = 0;
    b->col_ts = b->col_in = b->col_out = -1;
    for (char *f = line;; n++) {
        char *c = strchr(f, ',');
        if (c)
            *c = '\0';
        while (*f == ' ' || *f == '\t')
            f++;
        size_t fl = strlen(f);
        while (fl && (f[fl - 1] == ' ' || f[fl - 1] == '\t'))
            f[--fl] = '\0';
        for (int k = 0; k < 3; k++) {
            if (strcasecmp(f, names[k]))
                continue;
            if (*col[k] >= 0)
                return pl_fail(why, why_len, -EBADMSG,
                               "line 1: the BurstGPT header names %s twice (columns %d and %d)",
                               names[k], *col[k] + 1, n + 1);
            *col[k] = n;
            found++;
        }
        if (!c)
            break;
        f = c + 1;
    }
    b->n_cols = n + 1;
    if (found == 0)
        return 1;
    if (found < 3 || b->n_cols > BURST_MAX_COLS)
        return pl_fail(why, why_len, -EBADMSG,
                       "line 1: a BurstGPT header names Timestamp, Request tokens and Response "
                       "tokens (and at most %d columns)",
                       BURST_MAX_COLS);
    return 0;
}

/* A BurstGPT row. 0, 1 when the row is dropped (a failed request, an empty prompt), or a negative
 * errno with why. Empty fields are kept by splitting at every comma. */
static int parse_burst_row(const builder_t *b, char *line, uint32_t lineno, pl_req_t *r, char *why,
                           size_t why_len)
{
    char *field[BURST_MAX_COLS];
    int n = 0;
    for (char *p = line;; n++) {
        if (n == b->n_cols)
            return pl_fail(why, why_len, -EBADMSG, "line %u: more than the header's %d columns",
                           lineno, b->n_cols);
        field[n] = p;
        char *c = strchr(p, ',');
        if (!c)
            break;
        *c = '\0';
        p = c + 1;
    }
    if (n + 1 != b->n_cols)
        return pl_fail(why, why_len, -EBADMSG, "line %u: %d columns, the header names %d", lineno,
                       n + 1, b->n_cols);
    char *end;
    errno = 0;
    double ts = strtod(field[b->col_ts], &end);
    if (end == field[b->col_ts] || *end || errno || !(ts >= 0 && ts <= 1e12))
        return pl_fail(why, why_len, -EBADMSG, "line %u: Timestamp \"%s\" is not seconds >= 0",
                       lineno, field[b->col_ts]);
    double tok[2];
    const int col[2] = {b->col_in, b->col_out};
    for (int k = 0; k < 2; k++) {
        errno = 0;
        tok[k] = strtod(field[col[k]], &end);
        if (end == field[col[k]] || *end || errno || !(tok[k] >= 0 && tok[k] <= INT32_MAX) ||
            tok[k] != floor(tok[k]))
            return pl_fail(why, why_len, -EBADMSG, "line %u: %s \"%s\" is not a token count",
                           lineno, k ? "Response tokens" : "Request tokens", field[col[k]]);
    }
    if (tok[0] == 0 || tok[1] == 0)
        return 1;
    r->t_s = ts;
    r->in_len = (uint32_t)tok[0];
    r->out_len = (uint32_t)tok[1];
    r->n_hash = 0;
    r->session = -1;
    r->turn = 0;
    return 0;
}

/* ---------------------------------------------------------------- after reading */

static int cmp_time(const void *a, const void *b)
{
    const pl_req_t *x = a, *y = b;
    if (x->t_s != y->t_s)
        return x->t_s < y->t_s ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

static const pl_req_t *g_sort_req; /* qsort has no context argument; load is not reentrant */
static int cmp_session(const void *a, const void *b)
{
    const pl_req_t *x = &g_sort_req[*(const uint32_t *)a], *y = &g_sort_req[*(const uint32_t *)b];
    if (x->session != y->session)
        return x->session < y->session ? -1 : 1;
    if (x->turn != y->turn)
        return x->turn < y->turn ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

static int link_sessions(pl_trace_t *t, char *why, size_t why_len)
{
    uint32_t *ix = malloc((size_t)t->n * sizeof(*ix));
    if (!ix)
        return pl_fail(why, why_len, -ENOMEM, "out of memory");
    uint32_t m = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->req[i].session >= 0)
            ix[m++] = i;
    g_sort_req = t->req;
    qsort(ix, m, sizeof(*ix), cmp_session);
    int rc = 0;
    for (uint32_t k = 1; k < m; k++) {
        pl_req_t *a = &t->req[ix[k - 1]], *b = &t->req[ix[k]];
        if (a->session != b->session)
            continue;
        if (a->turn == b->turn) {
            rc = pl_fail(why, why_len, -EBADMSG, "lines %u and %u: session %lld has turn %u twice",
                         a->line, b->line, (long long)a->session, a->turn);
            break;
        }
        a->next = (int32_t)ix[k];
        b->prev = (int32_t)ix[k - 1];
    }
    free(ix);
    return rc;
}

/* Tokens per hash block: the power of two (else the smallest value) with
 * ceil(input_length / block) == len(hash_ids) for every row. */
static int detect_block(pl_trace_t *t, uint32_t given, char *why, size_t why_len)
{
    uint64_t lo = 1, hi = UINT32_MAX;
    for (uint32_t i = 0; i < t->n; i++) {
        const pl_req_t *r = &t->req[i];
        uint64_t n = r->n_hash, L = r->in_len;
        if (given) {
            if ((L + given - 1) / given != n)
                return pl_fail(why, why_len, -EBADMSG,
                               "line %u: %u hash ids do not cover %u tokens in %u-token blocks",
                               r->line, r->n_hash, r->in_len, given);
            continue;
        }
        uint64_t l = (L + n - 1) / n, h = n > 1 ? (L - 1) / (n - 1) : UINT32_MAX;
        lo = l > lo ? l : lo;
        hi = h < hi ? h : hi;
        if (lo > hi)
            return pl_fail(why, why_len, -EBADMSG,
                           "line %u: no block size fits every row so far (give --trace-block)",
                           r->line);
    }
    if (given) {
        t->block = given;
        return 0;
    }
    uint64_t p = 1;
    while (p * 2 <= hi)
        p *= 2;
    t->block = (uint32_t)(p >= lo ? p : lo);
    return 0;
}

int pl_trace_load(pl_trace_t *t, const char *path, uint32_t skip, uint32_t limit, uint32_t block,
                  char *why, size_t why_len)
{
    memset(t, 0, sizeof(*t));
    char *raw = NULL, *text = NULL;
    size_t raw_len = 0, len = 0;
    int rc = read_file(path, &raw, &raw_len, why, why_len);
    if (rc < 0)
        return rc;
    size_t pl = strlen(path);
    if (pl > 3 && !strcmp(path + pl - 3, ".xz")) {
        rc = unxz(path, raw, raw_len, &text, &len, why, why_len);
        free(raw);
        if (rc < 0)
            return rc;
    } else {
        text = raw;
        len = raw_len;
    }
    char *nt = realloc(text, len + 1);
    if (!nt) {
        free(text);
        return pl_fail(why, why_len, -ENOMEM, "%s: out of memory", path);
    }
    text = nt;
    text[len] = '\0';
    if (memchr(text, '\0', len)) {
        rc = pl_fail(why, why_len, -EBADMSG, "%s: binary data (a NUL byte) in a text trace", path);
        goto fail;
    }

    builder_t b = {.t = t};
    char *p = text, *end = text + len;
    if (len >= 3 && !memcmp(p, "\xef\xbb\xbf", 3))
        p += 3; /* a UTF-8 byte order mark, as spreadsheet programs write */
    uint32_t lineno = 0, rows = 0;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *line = p;
        if (nl)
            *nl = '\0';
        p = nl ? nl + 1 : end;
        lineno++;
        size_t ll = strlen(line);
        while (ll && (line[ll - 1] == '\r' || line[ll - 1] == ' ' || line[ll - 1] == '\t'))
            line[--ll] = '\0';
        while (*line == ' ' || *line == '\t')
            line++;
        if (!*line)
            continue;
        if (!t->format) {
            char w[200];
            if (line[0] == '{') {
                t->format = PL_FMT_JSONL;
            } else if (!strcmp(line, "TIMESTAMP,ContextTokens,GeneratedTokens")) {
                t->format = PL_FMT_AZURE_CSV;
                continue;
            } else if ((rc = parse_burst_header(&b, line, w, sizeof(w))) <= 0) {
                if (rc < 0) {
                    rc = pl_fail(why, why_len, rc, "%s: %s", path, w);
                    goto fail;
                }
                t->format = PL_FMT_BURSTGPT_CSV;
                continue;
            } else {
                rc = pl_fail(why, why_len, -EBADMSG,
                             "%s: line %u: neither a JSON object, the Azure CSV header "
                             "\"TIMESTAMP,ContextTokens,GeneratedTokens\" nor a BurstGPT CSV "
                             "header (Timestamp, Request tokens, Response tokens, ...)",
                             path, lineno);
                goto fail;
            }
        }
        if (t->format != PL_FMT_BURSTGPT_CSV && rows++ < skip)
            continue; /* BurstGPT rows count once they are known not to be dropped */
        if (limit && t->n >= limit)
            break;
        if (t->n >= PL_TRACE_MAX_REQS) {
            rc =
                pl_fail(why, why_len, -EFBIG, "%s: more than %u requests", path, PL_TRACE_MAX_REQS);
            goto fail;
        }
        pl_req_t r = {.line = lineno, .next = -1, .prev = -1, .group = -1};
        char w[200];
        if (t->format == PL_FMT_JSONL)
            rc = parse_jsonl_row(&b, line, lineno, &r, w, sizeof(w));
        else if (t->format == PL_FMT_AZURE_CSV)
            rc = parse_azure_row(line, lineno, &r, w, sizeof(w));
        else
            rc = parse_burst_row(&b, line, lineno, &r, w, sizeof(w));
        if (rc == 1) {
            t->dropped++;
            continue;
        }
        if (rc == 0 && t->format == PL_FMT_BURSTGPT_CSV && rows++ < skip)
            continue;
        if (rc == 0 && (rc = push_req(&b, &r)) < 0)
            snprintf(w, sizeof(w), "line %u: out of memory", lineno);
        if (rc < 0) {
            rc = pl_fail(why, why_len, rc, "%s: %s", path, w);
            goto fail;
        }
    }
    if (t->n == 0) {
        rc = pl_fail(why, why_len, -ENODATA, "%s: no requests (after skipping %u)", path, skip);
        goto fail;
    }
    free(text);
    text = NULL;

    uint32_t with_hash = 0, with_session = 0;
    double t0 = t->req[0].t_s;
    for (uint32_t i = 0; i < t->n; i++) {
        with_hash += t->req[i].n_hash > 0;
        with_session += t->req[i].session >= 0;
        t0 = t->req[i].t_s < t0 ? t->req[i].t_s : t0;
    }
    if (with_hash && with_hash != t->n) {
        rc = pl_fail(why, why_len, -EBADMSG,
                     "%s: %u of %u requests carry hash_ids; all or none must", path, with_hash,
                     t->n);
        goto fail;
    }
    t->has_hash = with_hash == t->n;
    t->has_session = with_session > 0;
    for (uint32_t i = 0; i < t->n; i++)
        t->req[i].t_s -= t0;
    qsort(t->req, t->n, sizeof(*t->req), cmp_time);
    if (t->has_hash && (rc = detect_block(t, block, why, why_len)) < 0)
        goto fail;
    if (!t->has_hash)
        t->block = block ? block : 16;
    if (t->has_session && (rc = link_sessions(t, why, why_len)) < 0)
        goto fail;
    return 0;
fail:
    free(text);
    pl_trace_done(t);
    return rc;
}

void pl_trace_done(pl_trace_t *t)
{
    if (!t)
        return;
    free(t->req);
    free(t->hash);
    memset(t, 0, sizeof(*t));
}

/* ---------------------------------------------------------------- shaping and tokens */

uint32_t pl_block_tokens(const pl_trace_t *t, const pl_shape_t *s)
{
    double b = floor(t->block * s->scale + 0.5);
    return b < 1 ? 1 : b > 1e6 ? 1000000 : (uint32_t)b;
}

static uint64_t scaled(uint64_t n, double scale)
{
    double l = floor(n * scale + 0.5);
    return l < 1 ? 1 : (uint64_t)l;
}

uint32_t pl_req_input(const pl_trace_t *t, const pl_shape_t *s, uint32_t i)
{
    const pl_req_t *r = &t->req[i];
    uint64_t L;
    if (r->group >= 0) { /* the group's prompt and the question scale apart: both stay >= 1 */
        L = scaled(r->prefix, s->scale) + scaled(r->in_len - r->prefix, s->scale);
    } else if (r->n_hash) {
        uint64_t br = pl_block_tokens(t, s), bt = t->block;
        uint64_t rem = r->in_len - (uint64_t)(r->n_hash - 1) * bt; /* 1..bt (checked at load) */
        uint64_t last = (rem * br + bt - 1) / bt;
        L = (uint64_t)(r->n_hash - 1) * br + (last ? last : 1);
    } else {
        L = scaled(r->in_len, s->scale) + s->shared_prefix;
    }
    if (s->max_input && L > s->max_input)
        L = s->max_input;
    return L > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)L;
}

uint32_t pl_req_prefix(const pl_trace_t *t, const pl_shape_t *s, uint32_t i)
{
    const pl_req_t *r = &t->req[i];
    if (r->group < 0)
        return 0;
    uint64_t p = scaled(r->prefix, s->scale), L = pl_req_input(t, s, i);
    return (uint32_t)(p < L ? p : L);
}

uint32_t pl_req_output(const pl_trace_t *t, const pl_shape_t *s, uint32_t i)
{
    double o = floor(t->req[i].out_len * s->scale + 0.5);
    uint64_t O = o < 1 ? 1 : o > 1e9 ? 1000000000 : (uint64_t)o;
    if (s->max_output && O > s->max_output)
        O = s->max_output;
    return (uint32_t)O;
}

static uint32_t tok(uint64_t tag, uint64_t id, uint64_t pos, uint64_t salt)
{
    uint64_t key[3] = {tag, id, pos};
    return (uint32_t)(XXH64(key, sizeof(key), salt) % PL_VOCAB);
}

enum { TAG_BLOCK = 1, TAG_SYSTEM = 2, TAG_OWN = 3, TAG_REPLY = 4, TAG_GROUP = 5 };

uint32_t pl_req_token(const pl_trace_t *t, const pl_shape_t *s, uint32_t i, uint32_t pos)
{
    const pl_req_t *r = &t->req[i];
    uint32_t L = pl_req_input(t, s, i);
    if (pos >= L) {
        if (r->next >= 0 && pos < pl_req_input(t, s, (uint32_t)r->next))
            return pl_req_token(t, s, (uint32_t)r->next, pos);
        return tok(TAG_REPLY, r->line, pos, s->salt);
    }
    if (r->n_hash) {
        uint32_t br = pl_block_tokens(t, s);
        return tok(TAG_BLOCK, (uint64_t)t->hash[r->hash_off + pos / br], pos % br, s->salt);
    }
    if (r->group >= 0 && pos < pl_req_prefix(t, s, i))
        return tok(TAG_GROUP, (uint64_t)r->group, pos, s->salt);
    if (r->group < 0 && pos < s->shared_prefix)
        return tok(TAG_SYSTEM, 0, pos, s->salt);
    return tok(TAG_OWN, r->line, pos, s->salt);
}
