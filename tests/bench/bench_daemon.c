/*
 * bench_daemon.c — the cpu path's latencies through a real patd (started here with the model
 * given, cpu backend): a control round trip (PING), the per-layer hand-off (pat_attend of one
 * decode token on a tiny context: futex signal, append, attend, signal back), and whole decode
 * steps of a batch sharing a prompt (step_begin to step_end, no checks). Medians and p99 of
 * N repetitions after a warm-up; `--json` for machine-readable output. The per-step floor
 * printed beside it is the KV bytes the plan reads divided by this machine's measured memcpy
 * bandwidth (the cpu backend streams KV from DRAM/cache like the GPU does from HBM).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void pct(uint64_t *v, int n, double *med, double *p99)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_u64);
    *med = v[n / 2] / 1e3;
    *p99 = v[(n * 99) / 100] / 1e3;
}

static double memcpy_gbs(void)
{
    size_t n = 256u << 20;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = pat_now_ns();
        memcpy(b, a, n);
        best = PAT_MIN(best, pat_now_ns() - t0);
    }
    free(a);
    free(b);
    return 2.0 * n / best; /* read + write bytes per ns = GB/s */
}

int main(int argc, char **argv)
{
    int json = argc > 1 && !strcmp(argv[1], "--json");
    int reps = 200;
    static const char *const args[] = {"--layers=4",     "--q-heads=32",   "--kv-heads=8",
                                       "--head-dim=128", "--blocks=16384", NULL};
    tl_daemon_t d;
    if (tl_daemon_start(&d, args) < 0)
        return 1;
    pat_model_t m = {4, 32, 8, 128, PAT_F16, 16, 0};
    pat_connect_opts_t o = {
        .size = sizeof(o), .max_batch_tokens = 2048, .max_seqs = 256, .socket = d.sock, .model = m};
    pat_conn_t *c;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "connect: %s\n", why);
        return 1;
    }
    uint64_t *t = malloc(sizeof(uint64_t) * (size_t)reps);
    double ping_med, ping_p99, hand_med, hand_p99, step_med, step_p99;
    for (int i = 0; i < reps + 20; i++) {
        uint64_t t0 = pat_now_ns();
        pat_ping(c);
        if (i >= 20)
            t[i - 20] = pat_now_ns() - t0;
    }
    pct(t, reps, &ping_med, &ping_p99);

    /* hand-off: 1 sequence of 16 tokens, decode one token per step, time each pat_attend */
    tl_rng_t rng;
    tl_rng_seed(&rng, 1);
    tl_seq_t s;
    tl_seq_init(&s);
    for (uint32_t k = 0; k < 16; k++)
        tl_seq_push(&s, k);
    tl_seq_open(c, &s);
    tl_seq_t *one[1] = {&s};
    tl_step_result_t r;
    tl_client_step(c, &m, one, 1, &rng, 0, &r);
    int nh = 0;
    for (int i = 0; nh < reps; i++) {
        uint32_t tok = 7 + (uint32_t)i, nn = 1;
        tl_seq_push(&s, tok);
        pat_step_begin(c, &s.seq, &nn, 1, &tok);
        pat_attend(c, 0); /* collects the begin answer: not timed */
        for (uint32_t l = 1; l < m.n_layers; l++) {
            uint64_t t0 = pat_now_ns();
            pat_attend(c, l);
            if (i >= 10 && nh < reps)
                t[nh++] = pat_now_ns() - t0;
        }
        pat_step_end(c, 0, NULL);
        s.len++;
    }
    pct(t, reps, &hand_med, &hand_p99);
    pat_seq_close(c, s.seq);
    tl_seq_done(&s);

    /* decode steps: 64 sequences, a 1024-token shared prompt + 64 own tokens each */
    enum { B = 64 };
    tl_seq_t *bs = calloc(B, sizeof(tl_seq_t)), *ps[B];
    for (int i = 0; i < B; i++) {
        tl_seq_init(&bs[i]);
        for (uint32_t k = 0; k < 1024; k++)
            tl_seq_push(&bs[i], 50000 + k);
        for (uint32_t k = 0; k < 64; k++)
            tl_seq_push(&bs[i], 100000 * (uint32_t)(i + 1) + k);
        ps[i] = &bs[i];
    }
    /* the first prefills the prompt so that the others share its blocks */
    tl_seq_open(c, &bs[0]);
    if ((rc = tl_client_step(c, &m, ps, 1, &rng, 0, &r)) < 0) {
        fprintf(stderr, "prefill: %s\n", pat_strerror(rc));
        return 1;
    }
    for (int i = 1; i < B; i++)
        tl_seq_open(c, &bs[i]);
    for (int i = 1; i < B; i += 16) /* prefill the rest in batches the staging buffer holds */
        if ((rc = tl_client_step(c, &m, ps + i, PAT_MIN(16, B - i), &rng, 0, &r)) < 0) {
            fprintf(stderr, "prefill: %s\n", pat_strerror(rc));
            return 1;
        }
    int steps = 30;
    uint64_t kvb = 0;
    for (int i = 0; i < steps + 3; i++) {
        for (int j = 0; j < B; j++)
            tl_seq_push(&bs[j], 9 + (uint32_t)i);
        uint64_t t0 = pat_now_ns();
        if ((rc = tl_client_step(c, &m, ps, B, &rng, 0, &r)) < 0) {
            fprintf(stderr, "decode: %s\n", pat_strerror(rc));
            return 1;
        }
        if (i >= 3)
            t[i - 3] = pat_now_ns() - t0;
        kvb = r.info.kv_bytes;
    }
    pct(t, steps, &step_med, &step_p99);
    double bw = memcpy_gbs();
    double floor_us = kvb * m.n_layers / bw / 1e3;
    /* attention FLOPs of the step: q.k and p.v, 2 flops per multiply-add, every q head */
    double flops = 0;
    for (int j = 0; j < B; j++)
        flops += 4.0 * m.q_heads * m.head_dim * (double)bs[j].n_tok * m.n_layers;
    if (json) {
        printf("{\"ping_us\": [%.1f, %.1f], \"layer_handoff_us\": [%.1f, %.1f], "
               "\"decode_step_us\": [%.1f, %.1f], \"decode_kv_bytes\": %llu, "
               "\"memcpy_gbs\": %.1f, \"floor_us\": %.1f, \"gflop\": %.3f}\n",
               ping_med, ping_p99, hand_med, hand_p99, step_med, step_p99,
               (unsigned long long)(kvb * m.n_layers), bw, floor_us, flops / 1e9);
    } else {
        printf("patd cpu path (model 4 layers, 32/8 heads, d=128, f16; %d reps, median / p99)\n",
               reps);
        printf("  control round trip (PING)               %9.1f / %9.1f us\n", ping_med, ping_p99);
        printf("  layer hand-off, 1 decode token, 17 KV    %9.1f / %9.1f us\n", hand_med, hand_p99);
        printf("  decode step, 64 seqs x (1024 shared + 64..94 own) KV, 4 layers, client included\n"
               "                                          %9.1f / %9.1f us\n",
               step_med, step_p99);
        printf("  floor of that step: %.1f MB KV read / %.1f GB/s memcpy = %.1f us; it is "
               "compute-bound here: %.2f GFLOP = %.2f GFLOP/s achieved\n",
               kvb * m.n_layers / 1e6, bw, floor_us, flops / 1e9, flops / (step_med * 1e3));
    }
    for (int i = 0; i < B; i++) {
        pat_seq_close(c, bs[i].seq);
        tl_seq_done(&bs[i]);
    }
    free(bs);
    free(t);
    pat_close(c);
    tl_daemon_signal_wait(&d, 15, 5000);
    tl_daemon_stop(&d);
    return 0;
}
