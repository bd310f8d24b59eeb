/*
 * test_multi.c — several clients at once against one patd, sharing prefixes across their
 * connections: one client prefills a system prompt, the others find it in the prefix cache
 * (cached_len > 0 at open) and all of them then decode concurrently, every output row of every
 * layer checked against float64. Clients are threads with a connection each (connections are
 * independent in libpat; each is used by one thread).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void *client_main(void *arg)
{
    worker_t *w = arg;
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 1024,
                            .max_seqs = N_SEQS,
                            .timeout_ms = 20000,
                            .socket = D.sock,
                            .label = "multi",
                            .model = MODEL};
    pat_conn_t *c = NULL;
    tl_rng_t rng;
    tl_rng_seed(&rng, 77 + (uint64_t)w->id);
    tl_seq_t s[N_SEQS], *ps[N_SEQS];
    int n = 0;
    w->rc = pat_connect(&o, &c, w->err, sizeof(w->err));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clients_share_prefixes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
