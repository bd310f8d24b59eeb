/*
 * tc_client.c — a client process for the fault tests (exec'd, so that no library state is
 * shared with the test through fork).
 *
 *   tc_client SOCKET hold POINT   connect, open 3 sequences sharing a prompt with the other
 *                                 clients, prefill them, then stop at POINT and print "ready":
 *                                 0 idle between steps, 1 step begun, 2 layer 0 done (a layer
 *                                 hand-off outstanding). Then sleeps until killed.
 *   tc_client SOCKET loop         connect and run checked decode steps until an error; exit 0
 *                                 if that error is a clean one (-ESHUTDOWN, -ECONNRESET, -ESTALE,
 *                                 -ENOTCONN), 1 otherwise (the test times the exit).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"

static const pat_model_t MODEL = {4, 8, 2, 64, PAT_F16, 16, 0};

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tc_client SOCKET hold POINT | loop\n");
        return 2;
    }
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 512,
                            .max_seqs = 8,
                            .timeout_ms = 20000,
                            .socket = argv[1],
                            .label = argv[2],
                            .model = MODEL};
    pat_conn_t *c;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "tc_client: connect: %s: %s\n", pat_strerror(rc), why);
        return 1;
    }
    tl_rng_t rng;
    tl_rng_seed(&rng, (uint64_t)getpid());
    tl_seq_t s[3], *ps[3];
    for (int i = 0; i < 3; i++) {
        tl_seq_init(&s[i]);
        for (uint32_t t = 0; t < 64; t++) /* shared with every other client */
            tl_seq_push(&s[i], 3000 + t);
        for (uint32_t t = 0; t < 20; t++)
            tl_seq_push(&s[i], (uint32_t)tl_rng_below(&rng, 1u << 20));
        if ((rc = tl_seq_open(c, &s[i])) < 0)
            break;
        ps[i] = &s[i];
    }
    tl_step_result_t r;
    if (rc == 0)
        rc = tl_client_step(c, &MODEL, ps, 3, &rng, 1, &r);
    if (rc < 0) {
        fprintf(stderr, "tc_client: setup: %s: %s\n", pat_strerror(rc), pat_last_error(c));
        return 1;
    }
    if (!strcmp(argv[2], "hold")) {
        int point = argc > 3 ? atoi(argv[3]) : 0;
        if (point >= 1) {
            uint32_t sid[3], nn[3] = {1, 1, 1}, tok[3] = {1, 2, 3};
            for (int i = 0; i < 3; i++)
                sid[i] = s[i].seq;
            if ((rc = pat_step_begin(c, sid, nn, 3, tok)) < 0)
                return 1;
            if (point >= 2 && (rc = pat_attend(c, 0)) < 0)
                return 1;
        }
        printf("ready\n");
        fflush(stdout);
        for (;;)
            pause();
    }
    /* loop: decode until the daemon goes away */
    for (uint32_t k = 0;; k++) {
        for (int i = 0; i < 3; i++)
            tl_seq_push(ps[i], 100 + k);
        rc = tl_client_step(c, &MODEL, ps, 3, &rng, 1, &r);
        if (rc < 0)
            break;
        if (k == 0) {
            printf("ready\n");
            fflush(stdout);
        }
    }
    int clean = rc == -ESHUTDOWN || rc == -ECONNRESET || rc == -ESTALE || rc == -ENOTCONN;
    fprintf(stderr, "tc_client: stopped by %s (%s): %s\n", pat_strerror(rc),
            clean ? "clean" : "NOT clean", pat_last_error(c));
    pat_close(c);
    for (int i = 0; i < 3; i++)
        tl_seq_done(&s[i]);
    return clean ? 0 : 1;
}
