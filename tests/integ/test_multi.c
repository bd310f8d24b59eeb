/*
 * test_multi.c — several clients at once against one patd, sharing prefixes across their
 * connections: one client prefills a system prompt, the others find it in the prefix cache
 * (cached_len > 0 at open) and all of them then decode concurrently, every output row of every
 * layer checked against float64. Clients are threads with a connection each (connections are
 * independent in libpat; each is used by one thread).
 *
 * And every reloadable limit raised and lowered by `reload` while clients decode: each new value
 * shows in pat_status and takes effect on the next HELLO, the running sessions go on without an
 * error, and a restart-only change is reported as kept back.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"

#define N_CLIENTS 4
#define N_SEQS    4
#define SYS_TOK   160 /* 10 full blocks */

static const pat_model_t MODEL = {3, 8, 2, 64, PAT_BF16, 16, 9};
static tl_daemon_t D;
static pthread_barrier_t after_first;

typedef struct worker {
    int id, rc;
    double worst;
    uint64_t rows, cached, kv_bytes, qc_bytes;
    char err[256];
} worker_t;

/* A worker's session (w->rc and w->err say how the connect went). */
static pat_conn_t *worker_connect(worker_t *w, const char *label, uint32_t max_batch_tokens)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = max_batch_tokens,
                            .max_seqs = N_SEQS,
                            .timeout_ms = 20000,
                            .socket = D.sock,
                            .label = label,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    w->rc = pat_connect(&o, &c, w->err, sizeof(w->err));
    return c;
}

static void *client_main(void *arg)
{
    worker_t *w = arg;
    tl_rng_t rng;
    tl_rng_seed(&rng, 77 + (uint64_t)w->id);
    tl_seq_t s[N_SEQS], *ps[N_SEQS];
    int n = 0;
    pat_conn_t *c = worker_connect(w, "multi", 1024);
    if (w->id != 0) /* the others open once the first has committed the system prompt */
        pthread_barrier_wait(&after_first);
    for (int i = 0; i < N_SEQS && w->rc == 0; i++, n++) {
        tl_seq_init(&s[i]);
        for (uint32_t t = 0; t < SYS_TOK; t++)
            tl_seq_push(&s[i], 40000 + t);
        for (uint32_t t = 0; t < 16 + (uint32_t)i * 5; t++) /* per-sequence question */
            tl_seq_push(&s[i], (uint32_t)tl_rng_below(&rng, 30000));
        w->rc = tl_seq_open(c, &s[i]);
        w->cached += s[i].cached;
        ps[i] = &s[i];
    }
    tl_step_result_t r;
    if (w->rc == 0)
        w->rc = tl_client_step(c, &MODEL, ps, N_SEQS, &rng, 1, &r); /* prefill the rest */
    if (w->id == 0)
        pthread_barrier_wait(&after_first);
    w->worst = r.worst;
    for (int k = 0; k < 10 && w->rc == 0; k++) {
        for (int i = 0; i < N_SEQS; i++)
            tl_seq_push(&s[i], 60000 + (uint32_t)(k * 7 + i + w->id));
        w->rc = tl_client_step(c, &MODEL, ps, N_SEQS, &rng, 1, &r);
        w->worst = PAT_MAX(w->worst, r.worst);
        w->rows += r.rows;
        w->kv_bytes += r.info.kv_bytes;
        w->qc_bytes += r.info.qc_bytes;
    }
    if (w->rc < 0 && c)
        snprintf(w->err, sizeof(w->err), "%s", pat_last_error(c));
    for (int i = 0; i < n; i++)
        tl_seq_done(&s[i]);
    pat_close(c);
    return NULL;
}

static void test_clients_share_prefixes(void **state)
{
    static const char *const args[] = {"--layers=3", "--dtype=bf16", "--model-id=9", NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    pthread_barrier_init(&after_first, NULL, N_CLIENTS);
    pthread_t th[N_CLIENTS];
    worker_t w[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].id = i;
        pthread_create(&th[i], NULL, client_main, &w[i]);
    }
    for (int i = 0; i < N_CLIENTS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_CLIENTS; i++) {
        if (w[i].rc < 0)
            fail_msg("client %d: %s: %s", i, pat_strerror(w[i].rc), w[i].err);
        printf("client %d: %llu rows checked, worst %.2e, %llu prompt tokens from the cache, "
               "KV read %llu vs %llu query-centric bytes per layer\n",
               i, (unsigned long long)w[i].rows, w[i].worst, (unsigned long long)w[i].cached,
               (unsigned long long)w[i].kv_bytes, (unsigned long long)w[i].qc_bytes);
        assert_true(w[i].worst < 1e-2);
        assert_true(w[i].rows > 0);
        /* across connections: every sequence of a later client found the system prompt */
        if (i > 0)
            assert_true(w[i].cached >= (uint64_t)N_SEQS * SYS_TOK);
        /* their sequences share the cached blocks physically, so the shared prompt is read
         * once per pack, not per sequence (client 0 prefilled its four copies side by side:
         * concurrent prefills of one prompt are not deduplicated, the cache keeps one) */
        if (i > 0)
            assert_true(w[i].kv_bytes < w[i].qc_bytes);
    }
    assert_true(tl_daemon_metric(&D, "patd_prefix_hit_blocks_total") >=
                (N_CLIENTS - 1) * N_SEQS * (SYS_TOK / 16));
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&D, SIGTERM, 5000), 0);
    tl_daemon_stop(&D);
}

/* ------------------------------------------------------------------ reload under load */
static _Atomic int load_stop;

static void *load_main(void *arg)
{
    worker_t *w = arg;
    tl_rng_t rng;
    tl_rng_seed(&rng, 991 + (uint64_t)w->id);
    tl_seq_t s[N_SEQS], *ps[N_SEQS];
    int n = 0;
    pat_conn_t *c = worker_connect(w, "load", 256);
    for (int i = 0; i < N_SEQS && w->rc == 0; i++, n++) {
        tl_seq_init(&s[i]);
        for (uint32_t t = 0; t < 40 + (uint32_t)i; t++)
            tl_seq_push(&s[i], (uint32_t)tl_rng_below(&rng, 30000));
        w->rc = tl_seq_open(c, &s[i]);
        ps[i] = &s[i];
    }
    tl_step_result_t r = {0};
    for (uint32_t k = 0; w->rc == 0 && (!atomic_load(&load_stop) || k < 2); k++) {
        for (int i = 0; i < N_SEQS; i++)
            tl_seq_push(&s[i], 100 + k * 4 + (uint32_t)i);
        w->rc = tl_client_step(c, &MODEL, ps, N_SEQS, &rng, 1, &r);
        w->worst = PAT_MAX(w->worst, r.worst);
        w->rows += r.rows;
        if (s[0].len > 400) /* keep the sequences short: start them over */
            for (int i = 0; i < N_SEQS && w->rc == 0; i++) {
                pat_seq_close(c, s[i].seq);
                tl_seq_done(&s[i]);
                tl_seq_init(&s[i]);
                for (uint32_t t = 0; t < 40; t++)
                    tl_seq_push(&s[i], (uint32_t)tl_rng_below(&rng, 30000));
                w->rc = tl_seq_open(c, &s[i]);
            }
    }
    if (w->rc < 0 && c)
        snprintf(w->err, sizeof(w->err), "%s", pat_last_error(c));
    for (int i = 0; i < n; i++)
        tl_seq_done(&s[i]);
    pat_close(c);
    return NULL;
}

static char conf_path[64];

/* Writes the config with one [limits] line changed and asks the daemon to reload it. */
static void reload_with(const char *limits_line, const char *pool_line, char *out, size_t len)
{
    FILE *f = fopen(conf_path, "w");
    assert_non_null(f);
    fprintf(f, "[model]\nlayers = 3\ndtype = bf16\nmodel_id = 9\n[pool]\n%s\n[limits]\n%s\n",
            pool_line, limits_line);
    fclose(f);
    char *t = NULL;
    int rc = pat_admin(D.sock, PAT_ADMIN_RELOAD, 5000, &t);
    if (rc < 0)
        fail_msg("reload with '%s': %s: %s", limits_line, pat_strerror(rc), t ? t : "");
    snprintf(out, len, "%s", t);
    pat_free(t);
}

/* A HELLO with these wishes: its result, and the session's block quota when it opened. */
static int probe_hello(uint32_t max_seqs, uint32_t max_batch_tokens, uint32_t *ret_max_blocks)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = max_batch_tokens,
                            .max_seqs = max_seqs,
                            .timeout_ms = 5000,
                            .socket = D.sock,
                            .label = "probe",
                            .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc == 0) {
        pat_buffers_t b;
        assert_int_equal(pat_buffers(c, &b), 0);
        if (ret_max_blocks)
            *ret_max_blocks = b.max_blocks;
        pat_close(c);
    }
    return rc;
}

static pat_status_t status_now(void)
{
    pat_status_t st = {.size = sizeof(st)};
    assert_int_equal(pat_status(D.sock, 5000, &st), 0);
    return st;
}

static void test_reload_limits_under_load(void **state)
{
    snprintf(conf_path, sizeof(conf_path), "/tmp/patd-reload.XXXXXX");
    int fd = mkstemp(conf_path);
    assert_true(fd >= 0);
    close(fd);
    char out[256];
    FILE *f = fopen(conf_path, "w");
    assert_non_null(f);
    fprintf(f, "[model]\nlayers = 3\ndtype = bf16\nmodel_id = 9\n[pool]\nblocks = 4096\n");
    fclose(f);
    const char *args[] = {"--config", conf_path, NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    enum { N_LOAD = 2 };
    pthread_t th[N_LOAD];
    worker_t w[N_LOAD];
    atomic_store(&load_stop, 0);
    for (int i = 0; i < N_LOAD; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].id = i;
        pthread_create(&th[i], NULL, load_main, &w[i]);
    }
    for (int ms = 0; status_now().sequences < 2 * N_SEQS; ms++) { /* both are decoding */
        if (ms > 10000)
            fail_msg("the load clients did not start: %s / %s", w[0].err, w[1].err);
        usleep(1000);
    }
    const char *pool = "blocks = 4096";

    /* max_conns: down to what is open refuses the next session, up lets it in */
    reload_with("max_conns = 2", pool, out, sizeof(out));
    assert_string_equal(out, "reloaded\n");
    assert_int_equal(status_now().max_conns, 2);
    assert_int_equal(probe_hello(4, 64, NULL), -EMFILE);
    reload_with("max_conns = 16", pool, out, sizeof(out));
    assert_int_equal(status_now().max_conns, 16);
    assert_int_equal(probe_hello(4, 64, NULL), 0);

    /* conn_max_seqs */
    reload_with("conn_max_seqs = 2", pool, out, sizeof(out));
    assert_int_equal(status_now().conn_max_seqs, 2);
    assert_int_equal(probe_hello(4, 64, NULL), -EDQUOT);
    reload_with("conn_max_seqs = 512", pool, out, sizeof(out));
    assert_int_equal(probe_hello(400, 64, NULL), 0);

    /* conn_max_staging_mb: 1 MiB cannot hold 4096 rows of 8 bf16 heads of 64 (Q+K+V+O) */
    reload_with("conn_max_staging_mb = 1", pool, out, sizeof(out));
    assert_int_equal(status_now().conn_max_staging_mb, 1);
    assert_int_equal(probe_hello(4, 4096, NULL), -EDQUOT);
    reload_with("conn_max_staging_mb = 512", pool, out, sizeof(out));
    assert_int_equal(probe_hello(4, 4096, NULL), 0);

    /* conn_max_blocks: a new session's quota follows; 0 is the whole pool */
    uint32_t mb = 0;
    reload_with("conn_max_blocks = 100", pool, out, sizeof(out));
    assert_int_equal(probe_hello(4, 64, &mb), 0);
    assert_int_equal(mb, 100);
    reload_with("conn_max_blocks = 0", pool, out, sizeof(out));
    assert_int_equal(probe_hello(4, 64, &mb), 0);
    assert_int_equal(mb, 4096);

    /* lease_ms and step_timeout_ms: shown live (the steps in flight keep running) */
    reload_with("lease_ms = 500\nstep_timeout_ms = 2000", pool, out, sizeof(out));
    assert_int_equal(status_now().lease_ms, 500);
    assert_int_equal(status_now().step_timeout_ms, 2000);
    reload_with("lease_ms = 60000\nstep_timeout_ms = 60000", pool, out, sizeof(out));
    assert_int_equal(status_now().lease_ms, 60000);
    assert_int_equal(status_now().step_timeout_ms, 60000);

    /* a restart-only change is kept back and said so; the reloadable ones still apply */
    reload_with("max_conns = 12", "blocks = 2048", out, sizeof(out));
    assert_non_null(strstr(out, "1 changes kept back"));
    assert_int_equal(status_now().max_conns, 12);
    assert_int_equal(status_now().blocks_total, 4096);

    atomic_store(&load_stop, 1);
    for (int i = 0; i < N_LOAD; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_LOAD; i++) {
        if (w[i].rc < 0)
            fail_msg("client %d under reloads: %s: %s", i, pat_strerror(w[i].rc), w[i].err);
        printf("client %d under reloads: %llu rows checked, worst %.2e\n", i,
               (unsigned long long)w[i].rows, w[i].worst);
        assert_true(w[i].rows > 0);
        assert_true(w[i].worst < 1e-2);
    }
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&D, SIGTERM, 5000), 0);
    tl_daemon_stop(&D);
    unlink(conf_path);
}

/* Twins through a real daemon: n_twins sessions open the same new 1,000-token prompt before any
 * of them commits it (each gets cached_len 0 and prefills all of it), then each decodes its own
 * reply, every output row of every layer checked against float64 and the pool's invariants
 * after every step. The blocks in use end at the ideal plus one partial block per twin, and a
 * follow-up turn over any twin's reply finds all of its full blocks in the cache. */
static void twins_run(uint32_t n_twins, uint32_t base)
{
    enum { PROMPT = 1000, REPLY = 20 };
    pat_conn_t *c[4];
    tl_seq_t s[4], *ps[1];
    tl_rng_t rng;
    tl_rng_seed(&rng, base);
    worker_t w;
    for (uint32_t t = 0; t < n_twins; t++) {
        memset(&w, 0, sizeof(w));
        c[t] = worker_connect(&w, "twin", 1024);
        if (w.rc < 0)
            fail_msg("twin %u: %s: %s", t, pat_strerror(w.rc), w.err);
        tl_seq_init(&s[t]);
        for (uint32_t k = 0; k < PROMPT; k++)
            tl_seq_push(&s[t], base + k);
        assert_int_equal(tl_seq_open(c[t], &s[t]), 0);
        assert_int_equal(s[t].cached, 0); /* nobody has committed it yet */
    }
    tl_step_result_t r;
    double worst = 0;
    for (uint32_t t = 0; t < n_twins; t++) { /* their prefills, one after the other */
        ps[0] = &s[t];
        assert_int_equal(tl_client_step(c[t], &MODEL, ps, 1, &rng, 1, &r), 0);
        worst = PAT_MAX(worst, r.worst);
        assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
    }
    long used = tl_daemon_status(&D, "blocks_used");
    const long ideal = (PROMPT + 15) / 16;
    for (uint32_t k = 0; k < REPLY; k++)
        for (uint32_t t = 0; t < n_twins; t++) {
            tl_seq_push(&s[t], base + 100000 + t * 1000 + k); /* each twin its own reply */
            ps[0] = &s[t];
            assert_int_equal(tl_client_step(c[t], &MODEL, ps, 1, &rng, 1, &r), 0);
            worst = PAT_MAX(worst, r.worst);
            assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
        }
    for (uint32_t t = 0; t < n_twins; t++) { /* the next turn over each twin's reply */
        tl_seq_t f;
        tl_seq_init(&f);
        for (uint32_t k = 0; k < s[t].n_tok; k++)
            tl_seq_push(&f, s[t].tok[k]);
        for (uint32_t k = 0; k < 9; k++)
            tl_seq_push(&f, base + 200000 + k);
        assert_int_equal(tl_seq_open(c[t], &f), 0);
        if (f.cached != (PROMPT + REPLY) / 16 * 16)
            fail_msg("%u twins: the turn after twin %u's reply found %u of %u tokens", n_twins, t,
                     f.cached, (PROMPT + REPLY) / 16 * 16);
        ps[0] = &f;
        assert_int_equal(tl_client_step(c[t], &MODEL, ps, 1, &rng, 1, &r), 0);
        worst = PAT_MAX(worst, r.worst);
        assert_int_equal(pat_seq_close(c[t], f.seq), 0);
        tl_seq_done(&f);
    }
    printf("%u twins: %ld blocks in use after their prefills (ideal %ld), worst row error %.2e\n",
           n_twins, used, ideal, worst);
    if (used > ideal + (long)n_twins - 1)
        fail_msg("%u twins hold %ld blocks, ideal %ld + one partial each", n_twins, used, ideal);
    assert_true(worst < 1e-2);
    for (uint32_t t = 0; t < n_twins; t++) {
        pat_close(c[t]);
        tl_seq_done(&s[t]);
    }
}

static void test_twins_share(void **state)
{
    static const char *const args[] = {"--layers=3", "--dtype=bf16", "--model-id=9", NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    twins_run(2, 1000000);
    twins_run(4, 2000000);
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&D, SIGTERM, 5000), 0);
    tl_daemon_stop(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clients_share_prefixes),
        cmocka_unit_test(test_reload_limits_under_load),
        cmocka_unit_test(test_twins_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
