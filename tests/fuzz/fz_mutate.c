/*
 * fz_mutate.c — corpus, dictionary, mutators and seeds of the transport-level fuzzer
 * (fz_mutate.h). The mutators are libFuzzer's usual set (bit flips, interesting values, inserts,
 * erasures, copies, splices, dictionary tokens) plus two that know the input format: a new mode
 * byte, and a run of repeated bytes (long headers, many frames). Seeds are built with the codec
 * of ipc/ (ipc_frame_*) and the prefixes of fz_wire.c, so they follow the protocol they test.
 */
#include "fz_mutate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ corpus */
static uint64_t hash64(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h ? h : 1;
}

void fz_corpus_init(fz_corpus_t *c, uint32_t max)
{
    memset(c, 0, sizeof(*c));
    c->max = max;
    c->hash_cap = 1;
    while (c->hash_cap < 4 * max)
        c->hash_cap <<= 1;
    c->hash = calloc(c->hash_cap, sizeof(*c->hash));
    c->seen = calloc((1u << FZ_SIG_BITS) / 8, 1);
    if (!c->hash || !c->seen)
        abort(); /* host OOM in a test harness */
}

void fz_corpus_done(fz_corpus_t *c)
{
    for (uint32_t i = 0; i < c->n; i++)
        free(c->e[i].data);
    free(c->e);
    free(c->hash);
    free(c->seen);
    memset(c, 0, sizeof(*c));
}

/* 1 when h was not in the set (and is now). The set only grows (a replaced entry's hash stays):
 * once 3/4 full it stops refusing duplicates rather than probe ever longer. */
static int hash_insert(fz_corpus_t *c, uint64_t h)
{
    if (4 * (uint64_t)c->hash_n >= 3 * (uint64_t)c->hash_cap)
        return 1;
    for (uint32_t i = (uint32_t)h & (c->hash_cap - 1);; i = (i + 1) & (c->hash_cap - 1)) {
        if (c->hash[i] == h)
            return 0;
        if (!c->hash[i]) {
            c->hash[i] = h;
            c->hash_n++;
            return 1;
        }
    }
}

int fz_corpus_add(fz_corpus_t *c, const uint8_t *data, size_t len, int seed)
{
    if (!hash_insert(c, hash64(data, len)))
        return 0;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        abort();
    memcpy(copy, data, len);
    uint32_t at = c->n;
    if (c->n >= c->max && c->n > c->n_seeds) {
        at = c->n_seeds + (uint32_t)(hash64(data, len) % (c->n - c->n_seeds));
        free(c->e[at].data);
    } else {
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 64;
            c->e = realloc(c->e, c->cap * sizeof(*c->e));
            if (!c->e)
                abort();
        }
        c->n++;
    }
    c->e[at] = (fz_entry_t){copy, (uint32_t)len, (uint32_t)(seed != 0)};
    if (seed)
        c->n_seeds++;
    return 1;
}

int fz_corpus_sig_new(fz_corpus_t *c, uint32_t sig)
{
    const uint32_t bit = sig & ((1u << FZ_SIG_BITS) - 1);
    const uint8_t m = (uint8_t)(1u << (bit & 7));
    if (c->seen[bit >> 3] & m)
        return 0;
    c->seen[bit >> 3] |= m;
    return 1;
}

/* ------------------------------------------------------------------ dictionary */
static void dict_add(fz_dict_t *d, const void *p, size_t n)
{
    if (n == 0 || n > sizeof(d->tok[0]))
        return;
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 128;
        d->tok = realloc(d->tok, d->cap * sizeof(d->tok[0]));
        d->len = realloc(d->len, d->cap);
        if (!d->tok || !d->len)
            abort();
    }
    memcpy(d->tok[d->n], p, n);
    d->len[d->n++] = (uint8_t)n;
}

static void dict_str(fz_dict_t *d, const char *s)
{
    dict_add(d, s, strlen(s));
}

void fz_dict_init(fz_dict_t *d)
{
    memset(d, 0, sizeof(*d));
    /* nanomsg: the SP header of every protocol id, the magic alone, message headers */
    static const uint16_t protos[] = {0x10, 0x20, 0x21, 0x30, 0x31, 0x50, 0x51, 0x62, 0x63, 0x70};
    for (size_t i = 0; i < sizeof(protos) / sizeof(protos[0]); i++) {
        const uint8_t sp[8] = {0, 'S', 'P', 0, (uint8_t)(protos[i] >> 8), (uint8_t)protos[i], 0, 0};
        dict_add(d, sp, sizeof(sp));
    }
    dict_add(d, "\0SP\0", 4);
    static const uint8_t types[] = {0, 1, 2, 3, 0xff};
    static const uint8_t lens[] = {0, 4, 8, 44, 48, 0xff};
    for (size_t i = 0; i < sizeof(types); i++)
        for (size_t j = 0; j < sizeof(lens); j++) {
            uint8_t m[9] = {types[i], 0, 0, 0, 0, 0, 0, 0, lens[j]};
            if (lens[j] == 0xff)
                memset(m + 1, 0xff, 8);
            dict_add(d, m, sizeof(m));
        }
    const uint8_t reqid[4] = {0x80, 0, 0, 1};
    dict_add(d, reqid, sizeof(reqid));
    /* patd frames: the magic, magic + version, a header of every opcode */
    const uint32_t magic = IPC_MAGIC;
    dict_add(d, &magic, sizeof(magic));
    for (uint32_t op = 0; op <= IPC_OP_MAX; op++) {
        ipc_hdr_t h = {
            .magic = IPC_MAGIC, .version = IPC_VERSION, .opcode = (uint16_t)op, .corr = op};
        dict_add(d, &h, sizeof(h));
    }
    const uint32_t ints[] = {IPC_MAX_FRAME, IPC_MAX_FRAME + 1, IPC_MAX_TOKENS, IPC_MAX_SEQS_STEP,
                             sizeof(ipc_hello_req_t)};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        dict_add(d, &ints[i], sizeof(ints[i]));
    /* HTTP (libmicrohttpd on the metrics port) and event lines */
    static const char *const words[] = {"GET ",
                                        "POST ",
                                        "HEAD ",
                                        "PUT ",
                                        "OPTIONS * ",
                                        "/metrics",
                                        "/",
                                        " HTTP/1.1\r\n",
                                        " HTTP/1.0\r\n",
                                        " HTTP/2.0\r\n",
                                        "\r\n",
                                        "\r\n\r\n",
                                        "\n",
                                        "Host: 127.0.0.1\r\n",
                                        "Content-Length: ",
                                        "Content-Length: 18446744073709551615\r\n",
                                        "Transfer-Encoding: chunked\r\n",
                                        "Connection: keep-alive\r\n",
                                        "Connection: close\r\n",
                                        "Expect: 100-continue\r\n",
                                        "Accept-Encoding: gzip\r\n",
                                        "0\r\n\r\n",
                                        "ffffffffffffffff\r\n",
                                        "%00",
                                        "%",
                                        "/../",
                                        "?a=b&",
                                        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                                        " \t",
                                        "stored ",
                                        "evicted ",
                                        "conn up ",
                                        "conn down "};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        dict_str(d, words[i]);
}

void fz_dict_done(fz_dict_t *d)
{
    free(d->tok);
    free(d->len);
    memset(d, 0, sizeof(*d));
}

/* ------------------------------------------------------------------ mutators */
typedef struct mut {
    tl_rng_t *r;
    const fz_corpus_t *c;
    const fz_dict_t *d;
    uint8_t *b;
    size_t len, max;
} mut_t;

static uint32_t below(mut_t *m, size_t n)
{
    return n ? tl_rng_below(m->r, (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n)) : 0;
}

/* makes room for n bytes at pos (n clipped to what max allows); returns n */
static size_t open_gap(mut_t *m, size_t pos, size_t n)
{
    if (m->len + n > m->max)
        n = m->max - m->len;
    memmove(m->b + pos + n, m->b + pos, m->len - pos);
    m->len += n;
    return n;
}

static void mut_flip_bit(mut_t *m)
{
    if (m->len)
        m->b[below(m, m->len)] ^= (uint8_t)(1u << below(m, 8));
}

static void mut_rand_byte(mut_t *m)
{
    if (m->len)
        m->b[below(m, m->len)] = (uint8_t)tl_rng_u64(m->r);
}

static void mut_interesting_byte(mut_t *m)
{
    static const uint8_t v[] = {0,    1,    2,    0x7f, 0x80, 0xff, 0x20, 0x21,
                                0x30, 0x31, '\r', '\n', ' ',  ':',  '0',  '%'};
    if (m->len)
        m->b[below(m, m->len)] = v[below(m, sizeof(v))];
}

/* a 2-, 4- or 8-byte field set to an edge value, either byte order */
static void mut_interesting_int(mut_t *m)
{
    static const int widths[] = {2, 4, 8};
    const int w = widths[below(m, 3)];
    if (m->len < (size_t)w)
        return;
    const uint64_t v[] = {0,
                          1,
                          UINT64_MAX,
                          (1ull << (8 * w - 1)) - 1,
                          1ull << (8 * w - 1),
                          m->len,
                          m->len - 2,
                          sizeof(ipc_hdr_t),
                          IPC_MAX_FRAME,
                          IPC_MAX_FRAME + 1ull,
                          1ull << 32,
                          below(m, 1024)};
    uint64_t x = v[below(m, sizeof(v) / sizeof(v[0]))];
    const size_t pos = below(m, m->len - (size_t)w + 1);
    const int be = (int)below(m, 2);
    for (int i = 0; i < w; i++)
        m->b[pos + (size_t)i] = (uint8_t)(x >> (8 * (be ? w - 1 - i : i)));
}

static void mut_arith(mut_t *m)
{
    if (m->len < 4)
        return;
    const size_t pos = below(m, m->len - 3);
    uint32_t x;
    memcpy(&x, m->b + pos, 4);
    x += (uint32_t)below(m, 33) - 16u;
    memcpy(m->b + pos, &x, 4);
}

static void mut_insert_random(mut_t *m)
{
    const size_t pos = below(m, m->len + 1);
    const size_t n = open_gap(m, pos, 1 + below(m, 16));
    for (size_t i = 0; i < n; i++)
        m->b[pos + i] = (uint8_t)tl_rng_u64(m->r);
}

static void mut_erase(mut_t *m)
{
    if (m->len < 2)
        return;
    const size_t pos = below(m, m->len);
    const size_t n = 1 + below(m, (m->len - pos) < 64 ? m->len - pos : 64);
    memmove(m->b + pos, m->b + pos + n, m->len - pos - n);
    m->len -= n;
}

/* a chunk of the input copied over another place, or inserted there */
static void mut_copy(mut_t *m)
{
    if (m->len < 2)
        return;
    const size_t from = below(m, m->len);
    size_t n = 1 + below(m, m->len - from);
    const size_t to = below(m, m->len);
    uint8_t tmp[256];
    n = n < sizeof(tmp) ? n : sizeof(tmp);
    memcpy(tmp, m->b + from, n);
    if (below(m, 2)) {
        n = open_gap(m, to, n);
    } else if (to + n > m->len) {
        n = m->len - to;
    }
    memcpy(m->b + to, tmp, n);
}

/* the head of this input and the tail of another corpus entry */
static void mut_splice(mut_t *m)
{
    if (!m->c->n)
        return;
    const fz_entry_t *o = &m->c->e[below(m, m->c->n)];
    const size_t cut = below(m, m->len + 1), from = below(m, o->len + 1);
    size_t n = o->len - from;
    if (cut + n > m->max)
        n = m->max - cut;
    memcpy(m->b + cut, o->data + from, n);
    m->len = cut + n;
}

static void mut_dict(mut_t *m)
{
    if (!m->d->n)
        return;
    const uint32_t k = below(m, m->d->n);
    size_t n = m->d->len[k];
    const size_t pos = below(m, m->len + 1);
    if (below(m, 2)) {
        n = open_gap(m, pos, n);
    } else if (pos + n > m->len) {
        n = m->len - pos;
    }
    memcpy(m->b + pos, m->d->tok[k], n);
}

/* a new mode byte: all of it, or one of its fields */
static void mut_mode(mut_t *m)
{
    if (m->len < 2) {
        open_gap(m, 0, 2 - m->len);
        m->b[0] = m->b[1] = 0;
    }
    static const uint8_t fields[] = {0x07, 0x18, 0x60, 0x80, 0xff};
    const uint8_t f = fields[below(m, sizeof(fields))];
    m->b[0] = (uint8_t)((m->b[0] & ~f) | ((uint8_t)tl_rng_u64(m->r) & f));
    if (below(m, 4) == 0)
        m->b[1] = (uint8_t)tl_rng_u64(m->r);
}

static void mut_truncate(mut_t *m)
{
    if (m->len > 2)
        m->len = 2 + below(m, m->len - 2);
}

/* one byte or a short run repeated many times: long header lines, frame after frame */
static void mut_repeat(mut_t *m)
{
    if (m->len < 3)
        return;
    const size_t from = 2 + below(m, m->len - 2);
    size_t unit = 1 + below(m, (m->len - from) < 48 ? m->len - from : 48);
    const size_t times = 2 + below(m, 256);
    uint8_t u[48];
    memcpy(u, m->b + from, unit);
    for (size_t i = 0; i < times && m->len + unit <= m->max; i++) {
        const size_t n = open_gap(m, from, unit);
        memcpy(m->b + from, u, n);
    }
}

typedef void mutator_fn(mut_t *m);
static mutator_fn *const mutators[] = {mut_flip_bit,
                                       mut_rand_byte,
                                       mut_interesting_byte,
                                       mut_interesting_int,
                                       mut_arith,
                                       mut_insert_random,
                                       mut_erase,
                                       mut_copy,
                                       mut_splice,
                                       mut_dict,
                                       mut_dict,
                                       mut_mode,
                                       mut_truncate,
                                       mut_repeat};

size_t fz_mutate(tl_rng_t *r, const fz_corpus_t *c, const fz_dict_t *d, const uint8_t *src,
                 size_t len, uint8_t *out, size_t max)
{
    mut_t m = {r, c, d, out, len < max ? len : max, max};
    memcpy(out, src, m.len);
    /* 1 to 5 mutations, fewer more often */
    const uint32_t k = 1 + (uint32_t)__builtin_ctzll(tl_rng_u64(r) | 16u);
    for (uint32_t i = 0; i < k; i++)
        mutators[tl_rng_below(r, sizeof(mutators) / sizeof(mutators[0]))](&m);
    return m.len;
}

/* ------------------------------------------------------------------ seeds */
typedef struct seed_ctx {
    const fz_target_t *t;
    fz_seed_fn *fn;
    void *ud;
    int fds_done; /* the descriptor-carrying twin of the first valid seed was made */
} seed_ctx_t;

/* Every seed runs as FZ_MODE_SEED; the first valid one of a Unix socket also with FZ_FDS_MANY
 * descriptors on each of three sends, so that the descriptor paths are tried from the start. */
static void emit(seed_ctx_t *s, const char *name, const uint8_t *raw, size_t len, int hostile)
{
    s->fn(s->ud, name, raw, len, FZ_MODE_SEED, 0, hostile);
    if (hostile || s->fds_done || s->t->family != FZ_UNIX)
        return;
    char nm[80];
    snprintf(nm, sizeof(nm), "%s-fds", name);
    s->fn(s->ud, nm, raw, len, FZ_MODE_SEED | (FZ_FDS_MANY_EACH << 5) | FZ_MODE_CHUNKED, 0x88, 0);
    s->fds_done = 1;
}

/* a frame of opcode op with body (n bytes), as raw bytes or inside one nanomsg message whose
 * type byte is nn_type (0: no nanomsg) */
static void seed_frame(seed_ctx_t *s, const char *name, uint32_t op, uint64_t session,
                       const void *body, size_t n, int nn_type, int hostile)
{
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_frame_start(&b, op, 0, 7, session);
    if (session)
        ipc_frame_set_key(&b, ~session);
    ipc_frame_put(&b, body, n);
    ipc_frame_finish(&b);
    uint8_t *w = malloc(FZ_PREFIX_MAX + b.len);
    if (!w)
        abort();
    size_t pre = 0;
    if (nn_type >= 0)
        pre = fz_prefix_build(s->t, nn_type == 1 ? FZ_PFX_SP_MSG : FZ_PFX_SP_MSGTYPE,
                              (uint8_t)nn_type, b.len, w);
    memcpy(w + pre, b.data, b.len);
    emit(s, name, w, pre + b.len, hostile);
    free(w);
    ipc_buf_done(&b);
}

static void seed_text(seed_ctx_t *s, const char *name, const char *text, int hostile)
{
    emit(s, name, (const uint8_t *)text, strlen(text), hostile);
}

static void seeds_control(seed_ctx_t *s, const ipc_model_sig_t *model)
{
    const uint32_t open[2 + 4] = {4, 0, 1, 2, 3, 4};
    const struct {
        ipc_step_begin_req_t r;
        ipc_step_seq_t s;
        uint32_t tok;
    } begin = {{1, 1, 0, 0}, {0, 1}, 5};
    const ipc_step_end_req_t end = {1, IPC_STEP_END_ABORT, 0};
    const ipc_seq_req_t seq = {0, 0};
    const ipc_hello_req_t hello = {.model = *model, .max_batch_tokens = 16, .label = "fuzz"};
    /* nanomsg-framed (the REQ peer's messages) and bare (patd's own framing) */
    static const struct {
        const char *name;
        int nn;
    } forms[] = {{"nn", 1}, {"frame", -1}};
    for (size_t f = 0; f < 2; f++) {
        char nm[64];
#define SEED(what, op, sess, body, n)                                                              \
    snprintf(nm, sizeof(nm), "%s-%s", forms[f].name, what);                                        \
    seed_frame(s, nm, op, sess, body, n, forms[f].nn, 0)
        SEED("ping", IPC_OP_PING, 0x1234, NULL, 0);
        SEED("seq-open", IPC_OP_SEQ_OPEN, 0x1234, open, sizeof(open));
        SEED("seq-close", IPC_OP_SEQ_CLOSE, 0x1234, &seq, sizeof(seq));
        SEED("step-begin", IPC_OP_STEP_BEGIN, 0x1234, &begin, sizeof(begin));
        SEED("step-end", IPC_OP_STEP_END, 0x1234, &end, sizeof(end));
        SEED("status", IPC_OP_STATUS, 0, NULL, 0);
        SEED("hello", IPC_OP_HELLO, 0, &hello, sizeof(hello));
        SEED("bye", IPC_OP_BYE, 0x1234, NULL, 0);
#undef SEED
    }
    /* messages of every other type byte (nanomsg 1.1.5 aborts on them), an SP header alone */
    static const int types[] = {0, 2, 3, 0xff};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "nn-type%d-ping", types[i]);
        seed_frame(s, nm, IPC_OP_PING, 0x1234, NULL, 0, types[i], 1);
    }
    uint8_t sp[FZ_PREFIX_MAX];
    emit(s, "nn-sp-only", sp, fz_prefix_build(s->t, FZ_PFX_SP, 0, 0, sp), 0);
}

static void seeds_events(seed_ctx_t *s)
{
    uint8_t w[FZ_PREFIX_MAX + 16];
    emit(s, "nn-sp-only", w, fz_prefix_build(s->t, FZ_PFX_SP, 0, 0, w), 0);
    /* a SUB never sends: any message to the PUB is hostile, of type 1 too */
    static const int types[] = {1, 0, 2, 0xff};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        char nm[32];
        size_t n = fz_prefix_build(s->t, FZ_PFX_SP_MSGTYPE, (uint8_t)types[i], 6, w);
        memcpy(w + n, "hello\n", 6);
        snprintf(nm, sizeof(nm), "nn-type%d-text", types[i]);
        emit(s, nm, w, n + 6, 1);
    }
    seed_text(s, "line", "stored 1 0123456789abcdef\n", 0);
}

static void seeds_admin(seed_ctx_t *s, const ipc_model_sig_t *model)
{
    static const struct {
        const char *name;
        uint32_t op;
    } ops[] = {{"status", IPC_OP_STATUS}, {"stats", IPC_OP_STATS}, {"seqs", IPC_OP_SEQS},
               {"info", IPC_OP_INFO},     {"check", IPC_OP_CHECK}, {"reload", IPC_OP_RELOAD},
               {"attach", IPC_OP_ATTACH}, {"ping", IPC_OP_PING}};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        seed_frame(s, ops[i].name, ops[i].op, 0, NULL, 0, -1, 0);
    ipc_hello_req_t h = {.model = *model, .max_batch_tokens = 16, .label = "fuzz"};
    seed_frame(s, "hello", IPC_OP_HELLO, 0, &h, sizeof(h), -1, 0);
    h.model.model_id ^= 1;
    seed_frame(s, "hello-other-model", IPC_OP_HELLO, 0, &h, sizeof(h), -1, 0);
    h.model.model_id ^= 1;
    /* a HELLO whose body stops halfway (the daemon waits for the rest) */
    seed_frame(s, "hello-short", IPC_OP_HELLO, 0, &h, sizeof(h) / 2, -1, 1);
}

static void seeds_metrics(seed_ctx_t *s)
{
    seed_text(s, "get", "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 0);
    seed_text(s, "get-root-1.0", "GET / HTTP/1.0\r\n\r\n", 0);
    seed_text(s, "head", "HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 0);
    seed_text(s, "post",
              "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello", 0);
    seed_text(s, "get-twice",
              "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
              "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
              0);
    seed_text(s, "chunked-bad",
              "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
              "zz\r\nabc\r\n0\r\n\r\n",
              1);
    seed_text(s, "length-huge",
              "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              "Content-Length: 18446744073709551615\r\n\r\nx",
              1);
}

void fz_seeds_builtin(const fz_target_t *t, const ipc_model_sig_t *model, fz_seed_fn *fn, void *ud)
{
    seed_ctx_t s = {t, fn, ud, 0};
    if (!strcmp(t->name, "sock"))
        seeds_control(&s, model);
    else if (!strcmp(t->name, "events"))
        seeds_events(&s);
    else if (!strcmp(t->name, "admin"))
        seeds_admin(&s, model);
    else
        seeds_metrics(&s);
}

/* ------------------------------------------------------------------ files */
int fz_file_read(const char *path, size_t max, uint8_t **ret)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    uint8_t *b = malloc(max + 1);
    size_t n = 0;
    ssize_t k;
    while (b && n < max && (k = read(fd, b + n, max - n)) > 0)
        n += (size_t)k;
    close(fd);
    if (!b)
        abort();
    *ret = b;
    return (int)n;
}

int fz_file_write(const char *path, const uint8_t *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    size_t n = 0;
    while (n < len) {
        ssize_t k = write(fd, data + n, len - n);
        if (k < 0) {
            int rc = -errno;
            close(fd);
            return rc;
        }
        n += (size_t)k;
    }
    return close(fd) < 0 ? -errno : 0;
}

int fz_seeds_load(fz_corpus_t *c, const fz_target_t *t, const char *dir, size_t max_len)
{
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    const size_t tl = strlen(t->name);
    int added = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        const size_t nl = strlen(nm);
        if (strncmp(nm, t->name, tl) || nm[tl] != '-' || nl < tl + 4)
            continue;
        const int raw = !strcmp(nm + nl - 4, ".raw"), whole = !strcmp(nm + nl - 3, ".in");
        if (!raw && !whole)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, nm);
        uint8_t *b = NULL;
        int n = fz_file_read(path, max_len, &b);
        if (n < 0)
            continue;
        if (raw) {
            uint8_t *in = malloc((size_t)n + 2);
            if (!in)
                abort();
            in[0] = FZ_MODE_SEED;
            in[1] = 0;
            memcpy(in + 2, b, (size_t)n);
            added += fz_corpus_add(c, in, (size_t)n + 2, 1);
            free(in);
        } else {
            added += fz_corpus_add(c, b, (size_t)n, 1);
        }
        free(b);
    }
    closedir(d);
    return added;
}
