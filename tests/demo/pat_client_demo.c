/*
 * pat_client_demo.c — the `make demo` client: frontends in separate processes serving requests
 * through a running patd. Each client opens requests that share a system prompt (shared by all
 * clients) and one of four task prompts, prefills what the prefix cache does not already hold,
 * forks one request for a second sample, decodes, and checks every output row of every layer
 * against a float64 reference over the request's logical KV. It prints prefix-cache hits, the
 * KV bytes the daemon's plans read against query-centric attention, and the step latency the
 * daemon measured. Exit status 0 only if every check passed.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"

typedef struct result {
    int ok;
    double worst;
    uint64_t rows, steps, prompt_tok, cached_tok, kv_bytes, qc_bytes, step_ns_sum, reused;
} result_t;

typedef struct opts {
    const char *socket;
    uint32_t clients, requests, batch, decode;
    pat_model_t model;
} opts_t;

static int run_client(const opts_t *o, uint32_t id, result_t *r)
{
    char why[256];
    char label[32];
    snprintf(label, sizeof(label), "demo-client-%u", id);
    pat_connect_opts_t co = {.size = sizeof(co),
                             .max_batch_tokens = 2048,
                             .max_seqs = 2 * o->batch,
                             .socket = o->socket,
                             .label = label,
                             .model = o->model};
    pat_conn_t *c;
    int rc = pat_connect(&co, &c, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "client %u: connect: %s: %s\n", id, pat_strerror(rc), why);
        return rc;
    }
    tl_rng_t rng;
    tl_rng_seed(&rng, 1000 + id);
    tl_seq_t *seqs = pat_xcalloc(2 * o->batch, sizeof(tl_seq_t));
    tl_seq_t **act = pat_xcalloc(2 * o->batch, sizeof(tl_seq_t *));
    for (uint32_t done = 0; done < o->requests && rc == 0;) {
        uint32_t nb = PAT_MIN(o->batch, o->requests - done), na = 0;
        for (uint32_t i = 0; i < nb && rc == 0; i++) {
            tl_seq_t *s = &seqs[i];
            tl_seq_init(s);
            uint32_t req = done + i;
            for (uint32_t t = 0; t < 200; t++) /* the system prompt: every client */
                tl_seq_push(s, 1000 + t);
            for (uint32_t t = 0; t < 96; t++) /* one of 4 task prompts */
                tl_seq_push(s, 5000 + (req % 4) * 1000 + t);
            uint32_t user = tl_rng_range(&rng, 8, 40);
            for (uint32_t t = 0; t < user; t++)
                tl_seq_push(s, 100000 + (uint32_t)tl_rng_below(&rng, 50000));
            if ((rc = tl_seq_open(c, s)) < 0)
                fprintf(stderr, "client %u: open: %s: %s\n", id, pat_strerror(rc),
                        pat_last_error(c));
            r->prompt_tok += s->n_tok;
            r->cached_tok += s->cached;
            act[na++] = s;
        }
        for (uint32_t step = 0; rc == 0 && step <= o->decode; step++) {
            if (step == 1) { /* a second sample of the first request: fork after prefill */
                tl_seq_t *p = &seqs[0], *ch = &seqs[nb];
                tl_seq_init(ch);
                for (uint32_t t = 0; t < p->n_tok; t++)
                    tl_seq_push(ch, p->tok[t]);
                ch->len = p->len;
                if ((rc = pat_seq_fork(c, p->seq, &ch->seq)) < 0) {
                    fprintf(stderr, "client %u: fork: %s\n", id, pat_strerror(rc));
                    break;
                }
                act[na++] = ch;
            }
            if (step > 0) /* decode: the next token of every request */
                for (uint32_t i = 0; i < na; i++)
                    tl_seq_push(act[i], 200000 + (uint32_t)((act[i]->hash[act[i]->n_tok - 1] +
                                                             (act[i] == &seqs[nb])) %
                                                            30000));
            tl_step_result_t sr;
            rc = tl_client_step(c, &o->model, act, na, &rng, 1, &sr);
            if (rc < 0) {
                fprintf(stderr, "client %u: step: %s: %s\n", id, pat_strerror(rc),
                        pat_last_error(c));
                break;
            }
            r->worst = PAT_MAX(r->worst, sr.worst);
            r->rows += sr.rows;
            r->steps++;
            r->kv_bytes += sr.info.kv_bytes * o->model.n_layers;
            r->qc_bytes += sr.info.qc_bytes * o->model.n_layers;
            r->step_ns_sum += sr.info.step_ns;
            r->reused += sr.info.pack_reused;
        }
        for (uint32_t i = 0; i < na; i++) {
            int crc = pat_seq_close(c, act[i]->seq);
            if (crc < 0 && rc == 0)
                rc = crc;
            tl_seq_done(act[i]);
        }
        done += nb;
    }
    free(seqs);
    free(act);
    pat_close(c);
    r->ok = rc == 0 && r->worst < 1e-2;
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o = {.socket = NULL, .clients = 3, .requests = 12, .batch = 6, .decode = 8};
    o.model = (pat_model_t){.n_layers = 4,
                            .q_heads = 8,
                            .kv_heads = 2,
                            .head_dim = 64,
                            .dtype = PAT_F16,
                            .block_size = 16};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("usage: %s [--socket PATH] [--clients N] [--requests N] [--batch N] "
                   "[--decode N]\n"
                   "Client processes share a 200-token system prompt and 4 task prompts through "
                   "a running patd\n(model: 4 layers, 8/2 heads, d=64, f16: patd's defaults) and "
                   "check every output in float64.\n",
                   argv[0]);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--socket"))
            o.socket = v;
        else if (!strcmp(a, "--clients"))
            o.clients = (uint32_t)atoi(v);
        else if (!strcmp(a, "--requests"))
            o.requests = (uint32_t)atoi(v);
        else if (!strcmp(a, "--batch"))
            o.batch = (uint32_t)atoi(v);
        else if (!strcmp(a, "--decode"))
            o.decode = (uint32_t)atoi(v);
        else {
            fprintf(stderr, "unknown argument %s (try --help)\n", a);
            return 2;
        }
        i++;
    }
    if (!o.clients || o.clients > 64 || !o.batch || o.batch > 64 || !o.requests) {
        fprintf(stderr, "clients 1..64, batch 1..64, requests >= 1\n");
        return 2;
    }
    printf("patd client demo: %u client processes x %u requests (batch %u, %u decode steps) "
           "via %s\n",
           o.clients, o.requests, o.batch, o.decode, o.socket ? o.socket : pat_default_socket());
    fflush(stdout);
    int pipes[64][2];
    pid_t pids[64];
    for (uint32_t i = 0; i < o.clients; i++) {
        if (pipe(pipes[i]) < 0)
            return 1;
        pids[i] = fork();
        if (pids[i] == 0) {
            result_t r = {0};
            run_client(&o, i, &r);
            ssize_t w = write(pipes[i][1], &r, sizeof(r));
            _exit(w == (ssize_t)sizeof(r) && r.ok ? 0 : 1);
        }
        close(pipes[i][1]);
    }
    result_t t = {.ok = 1};
    for (uint32_t i = 0; i < o.clients; i++) {
        result_t r = {0};
        if (read(pipes[i][0], &r, sizeof(r)) != (ssize_t)sizeof(r))
            r.ok = 0;
        close(pipes[i][0]);
        int st;
        waitpid(pids[i], &st, 0);
        t.ok &= r.ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        t.worst = PAT_MAX(t.worst, r.worst);
        t.rows += r.rows;
        t.steps += r.steps;
        t.prompt_tok += r.prompt_tok;
        t.cached_tok += r.cached_tok;
        t.kv_bytes += r.kv_bytes;
        t.qc_bytes += r.qc_bytes;
        t.step_ns_sum += r.step_ns_sum;
        t.reused += r.reused;
        printf("client %u: %llu steps, %llu rows checked, worst error %.2e, %s\n", i,
               (unsigned long long)r.steps, (unsigned long long)r.rows, r.worst,
               r.ok ? "ok" : "FAILED");
    }
    printf("prefix cache: %llu of %llu prompt tokens were already cached (%.1f%%)\n",
           (unsigned long long)t.cached_tok, (unsigned long long)t.prompt_tok,
           t.prompt_tok ? 100.0 * t.cached_tok / t.prompt_tok : 0.0);
    printf("KV read by patd's plans: %.2f MB vs %.2f MB query-centric (%.1f%% saved); pack "
           "reused on %llu of %llu steps\n",
           t.kv_bytes / 1e6, t.qc_bytes / 1e6,
           t.qc_bytes ? 100.0 * (1.0 - (double)t.kv_bytes / t.qc_bytes) : 0.0,
           (unsigned long long)t.reused, (unsigned long long)t.steps);
    printf("daemon step latency (begin received -> last layer, includes the clients' own "
           "work between layers): mean %.2f ms\n",
           t.steps ? t.step_ns_sum / 1e6 / t.steps : 0.0);
    char *check = NULL;
    int check_ok = 0;
    if (pat_admin(o.socket, PAT_ADMIN_CHECK, 5000, &check) == 0) {
        pat_status_t st = {.size = sizeof(st)};
        check_ok = strstr(check, "pool_check ok") != NULL && pat_status(o.socket, 5000, &st) == 0 &&
                   st.sequences == 0; /* everything was closed: nothing may remain */
    }
    pat_free(check);
    printf("worst relative error vs float64: %.2e (bound 1e-2); daemon pool check %s\n", t.worst,
           check_ok ? "ok, no sequence left open" : "FAILED");
    int ok = t.ok && check_ok;
    printf("%s\n", ok ? "demo: OK" : "demo: FAILED");
    return ok ? 0 : 1;
}
