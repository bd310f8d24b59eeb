/*
 * tl_client.c — the deterministic client model of tl_client.h.
 */
#include "tl_client.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_dtype.h"
#include "pat_base.h"
#include "tl_ref.h"

static uint64_t mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

void tl_seq_init(tl_seq_t *s)
{
    memset(s, 0, sizeof(*s));
}

void tl_seq_push(tl_seq_t *s, uint32_t t)
{
    pat_grow((void **)&s->tok, &s->cap, s->n_tok + 1, sizeof(uint32_t));
    s->hash = pat_xrealloc(s->hash, s->cap * sizeof(uint64_t));
    s->tok[s->n_tok] = t;
    s->hash[s->n_tok] = mix(s->n_tok ? s->hash[s->n_tok - 1] : 7, t);
    s->n_tok++;
}

void tl_seq_done(tl_seq_t *s)
{
    free(s->tok);
    free(s->hash);
    memset(s, 0, sizeof(*s));
}

int tl_seq_open(pat_conn_t *c, tl_seq_t *s)
{
    int rc = pat_seq_open(c, s->tok, s->n_tok, &s->seq, &s->cached);
    if (rc == 0)
        s->len = s->cached;
    return rc;
}

static float kv_elem(uint32_t layer, uint64_t hash, uint32_t head, uint32_t x, int is_v)
{
    return (float)tl_kv_value(hash ^ ((uint64_t)layer << 56), (uint32_t)hash, 0, head, x, is_v);
}

/* The value the daemon stores for an element: rounded through the model dtype. */
static double stored(kern_dtype_t dt, float v)
{
    uint8_t b[4];
    kern_store(dt, b, 0, v);
    return kern_load(dt, b, 0);
}

int tl_client_step(pat_conn_t *c, const pat_model_t *m, tl_seq_t **seqs, uint32_t n, tl_rng_t *rng,
                   int check, tl_step_result_t *res)
{
    return tl_client_step_hooked(c, m, seqs, n, rng, check, res, NULL, NULL);
}

int tl_client_step_hooked(pat_conn_t *c, const pat_model_t *m, tl_seq_t **seqs, uint32_t n,
                          tl_rng_t *rng, int check, tl_step_result_t *res, tl_layer_hook_t hook,
                          void *arg)
{
    pat_buffers_t buf;
    pat_buffers(c, &buf);
    kern_dtype_t dt = (kern_dtype_t)m->dtype;
    uint32_t hd = m->head_dim, g = m->q_heads / m->kv_heads;
    uint32_t *sid = pat_xmalloc(n * sizeof(uint32_t)), *nn = pat_xmalloc(n * sizeof(uint32_t));
    uint32_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += seqs[i]->n_tok - seqs[i]->len;
    uint32_t *tok = pat_xmalloc(total * sizeof(uint32_t));
    for (uint32_t i = 0, t = 0; i < n; i++) {
        sid[i] = seqs[i]->seq;
        nn[i] = seqs[i]->n_tok - seqs[i]->len;
        memcpy(tok + t, seqs[i]->tok + seqs[i]->len, nn[i] * sizeof(uint32_t));
        t += nn[i];
    }
    memset(res, 0, sizeof(*res));
    int rc = pat_step_begin(c, sid, nn, n, tok);
    double scale = 1.0 / sqrt((double)hd);
    for (uint32_t l = 0; rc == 0 && l < m->n_layers; l++) {
        for (uint32_t i = 0, row = 0; i < n; i++) {
            tl_seq_t *s = seqs[i];
            for (uint32_t k = 0; k < nn[i]; k++, row++) {
                uint64_t h = s->hash[s->len + k];
                for (uint32_t kh = 0; kh < m->kv_heads; kh++)
                    for (uint32_t x = 0; x < hd; x++) {
                        uint64_t e = ((uint64_t)row * m->kv_heads + kh) * hd + x;
                        kern_store(dt, buf.k, e, kv_elem(l, h, kh, x, 0));
                        kern_store(dt, buf.v, e, kv_elem(l, h, kh, x, 1));
                    }
                for (uint64_t e = (uint64_t)row * m->q_heads * hd;
                     e < (uint64_t)(row + 1) * m->q_heads * hd; e++)
                    kern_store(dt, buf.q, e, (float)(2.0 * tl_rng_unit(rng)));
            }
        }
        if (check)
            memset(buf.o, 0xff, (size_t)total * buf.q_row_bytes); /* poison: NaN in any dtype */
        if (hook)
            hook(arg, l);
        if ((rc = pat_attend(c, l)) < 0)
            break;
        if (!check)
            continue;
        for (uint32_t i = 0, row = 0; i < n; i++) {
            tl_seq_t *s = seqs[i];
            uint32_t kvn = s->len + nn[i];
            double *K = pat_xmalloc((size_t)kvn * hd * sizeof(double));
            double *V = pat_xmalloc((size_t)kvn * hd * sizeof(double));
            double *qd = pat_xmalloc(hd * sizeof(double)), *ref = pat_xmalloc(hd * sizeof(double));
            double *got = pat_xmalloc(hd * sizeof(double));
            for (uint32_t kh = 0; kh < m->kv_heads; kh++) {
                for (uint32_t p = 0; p < kvn; p++)
                    for (uint32_t x = 0; x < hd; x++) {
                        K[(size_t)p * hd + x] = stored(dt, kv_elem(l, s->hash[p], kh, x, 0));
                        V[(size_t)p * hd + x] = stored(dt, kv_elem(l, s->hash[p], kh, x, 1));
                    }
                for (uint32_t k = 0; k < nn[i]; k++)
                    for (uint32_t j = 0; j < g; j++) {
                        uint64_t base = ((uint64_t)(row + k) * m->q_heads + kh * g + j) * hd;
                        for (uint32_t x = 0; x < hd; x++) {
                            qd[x] = kern_load(dt, buf.q, base + x);
                            got[x] = kern_load(dt, buf.o, base + x);
                        }
                        tl_ref_attend(qd, K, V, s->len + k + 1, hd, scale, 0, ref);
                        double err = tl_rel_err(got, ref, hd);
                        if (err > res->worst || isnan(err))
                            res->worst = isnan(err) ? INFINITY : err;
                        res->rows++;
                    }
            }
            row += nn[i];
            free(K);
            free(V);
            free(qd);
            free(ref);
            free(got);
        }
    }
    if (rc == 0 || rc == -ECANCELED || rc == -ETIMEDOUT) {
        int abort = rc != 0 || (check && res->worst >= 1e-2);
        int erc = pat_step_end(c, abort, &res->info);
        if (rc == 0)
            rc = erc;
        if (rc == 0 && abort)
            rc = -EIO;
    } else if (rc != -ECONNRESET && rc != -ESHUTDOWN) {
        pat_step_end(c, 1, &res->info); /* the daemon refused it or it failed: close it out */
    }
    if (rc == 0)
        for (uint32_t i = 0; i < n; i++)
            seqs[i]->len += nn[i];
    free(sid);
    free(nn);
    free(tok);
    return rc;
}

/* Sequence i's prompt: tokens base..base+63, then 90 + i. */
static void by_prompt(tl_bystander_t *b, int i)
{
    tl_seq_init(&b->s[i]);
    for (uint32_t t = 0; t < 64; t++)
        tl_seq_push(&b->s[i], b->base + t);
    tl_seq_push(&b->s[i], 90 + (uint32_t)i);
}

int tl_connect(const char *sock, const pat_model_t *m, const char *label, uint32_t batch_tokens,
               uint32_t timeout_ms, pat_conn_t **ret, char *why, size_t why_len)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = batch_tokens,
                            .max_seqs = 8,
                            .timeout_ms = timeout_ms,
                            .socket = sock,
                            .label = label,
                            .model = *m};
    return pat_connect(&o, ret, why, why_len);
}

int tl_by_open(tl_bystander_t *b, const char *sock, const pat_model_t *m, uint32_t base, char *why,
               size_t why_len)
{
    memset(b, 0, sizeof(*b));
    b->m = m;
    int rc = tl_connect(sock, m, "bystander", 256, 10000, &b->c, why, why_len);
    if (rc < 0)
        return rc;
    tl_rng_seed(&b->rng, base);
    b->base = base;
    for (int i = 0; i < 2; i++) {
        by_prompt(b, i);
        b->ps[i] = &b->s[i];
        if ((rc = tl_seq_open(b->c, &b->s[i])) < 0) {
            snprintf(why, why_len, "bystander open: %s", pat_last_error(b->c));
            return rc;
        }
    }
    return 0;
}

int tl_by_step(tl_bystander_t *b, char *why, size_t why_len)
{
    tl_step_result_t r;
    int rc = tl_client_step(b->c, b->m, b->ps, 2, &b->rng, 1, &r);
    if (rc < 0) {
        snprintf(why, why_len, "bystander step: %s: %s", pat_strerror(rc), pat_last_error(b->c));
        return rc;
    }
    if (!(r.worst < 1e-2)) {
        snprintf(why, why_len, "bystander step: a row off float64 by %.3g", r.worst);
        return -EDOM;
    }
    for (int i = 0; i < 2; i++)
        tl_seq_push(&b->s[i], 7 + (uint32_t)b->s[i].n_tok);
    return 0;
}

int tl_by_restart(tl_bystander_t *b, char *why, size_t why_len)
{
    for (int i = 0; i < 2; i++) {
        int rc = pat_seq_close(b->c, b->s[i].seq);
        tl_seq_done(&b->s[i]);
        by_prompt(b, i);
        if (rc == 0)
            rc = tl_seq_open(b->c, &b->s[i]);
        if (rc < 0) {
            snprintf(why, why_len, "bystander restart: %s: %s", pat_strerror(rc),
                     pat_last_error(b->c));
            return rc;
        }
    }
    return 0;
}

void tl_by_close(tl_bystander_t *b)
{
    pat_close(b->c);
    for (int i = 0; i < 2; i++)
        tl_seq_done(&b->s[i]);
}

int tl_open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) >= 0;
    return n;
}
