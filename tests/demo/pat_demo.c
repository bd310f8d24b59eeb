/*
 * pat_demo.c — patd's parts doing real work in one process (`make demo`): a serving loop over
 * requests that share a system prompt and per-task sub-prompts, with continuous batching.
 *
 * Each step: requests join (their prompts looked up in the prefix cache, only the uncached rest
 * prefilled), prefill or decode one token, and retire when done; kvcache reserves slots and
 * publishes full blocks; the scheduler updates its forest and builds a plan; per layer the cpu
 * backend appends the new tokens' K/V and runs the plan. Every output row of every layer is
 * checked against a float64 reference over the request's logical KV, and the program prints the
 * prefix-cache hits and the KV bytes the plans read against query-centric execution.
 *
 * K and V of a token are a deterministic function of (layer, the token ids up to it, position,
 * head): as with a real model, a shared prefix has the same KV whoever computed it, so cache hits
 * are checked for real. Exit status 0 only if every check passed.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "kern_dtype.h"
#include "kv_pool.h"
#include "pat_base.h"
#include "sched_plan.h"
#include "tl_ref.h"
#include "tl_rng.h"

#define BS        16u
#define LAYERS    2u
#define Q_HEADS   8u
#define KV_HEADS  2u
#define HEAD_DIM  64u
#define DTYPE     KERN_F16
#define N_REQ     48u  /* requests in the run */
#define MAX_BATCH 24u  /* requests decoding at once */
#define SYS_TOK   200u /* system prompt shared by all */
#define SUB_TOK   96u  /* one of 4 task prompts */
#define USER_TOK  40u  /* each request's own question (up to) */

typedef struct req {
    uint32_t seq;        /* kvcache sequence */
    uint32_t slot;       /* forest slot */
    int state;           /* 0 waiting, 1 running, 2 done */
    uint32_t *tok;       /* all token ids: prompt then generated */
    uint64_t *hash;      /* hash of tok[0..i] for each i: names the KV of position i */
    uint32_t n_tok, cap; /* tokens known */
    uint32_t prompt_len;
    uint32_t len;        /* KV tokens written */
    uint32_t gen_target; /* tokens to generate */
    uint32_t n_new;      /* this step */
    uint32_t tok_off;
} req_t;

static uint64_t mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

static void push_token(req_t *r, uint32_t t)
{
    pat_grow((void **)&r->tok, &r->cap, r->n_tok + 1, sizeof(uint32_t));
    r->hash = pat_xrealloc(r->hash, r->cap * sizeof(uint64_t));
    r->tok[r->n_tok] = t;
    r->hash[r->n_tok] = mix(r->n_tok ? r->hash[r->n_tok - 1] : 7, t);
    r->n_tok++;
}

/* KV element of a token, named by its prefix hash (independent of who computes it). */
static float kv_elem(uint32_t layer, uint64_t hash, uint32_t head, uint32_t x, int is_v)
{
    return (float)tl_kv_value(hash ^ ((uint64_t)layer << 56), (uint32_t)hash, 0, head, x, is_v);
}

int main(int argc, char **argv)
{
    uint32_t steps_max = 400;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: %s\nRuns %u requests sharing a %u-token system prompt and 4 task "
                   "prompts through kvcache + scheduler + cpu backend, checking every output in "
                   "float64.\n",
                   argv[0], N_REQ, SYS_TOK);
            return 0;
        }
        fprintf(stderr, "unknown argument %s (try --help)\n", argv[i]);
        return 2;
    }
    tl_rng_t rng;
    tl_rng_seed(&rng, 1234);

    kv_pool_config_t pc = {.n_blocks = 4096,
                           .block_size = BS,
                           .max_seqs = N_REQ,
                           .max_seq_len = 4096,
                           .model_id = 0x70617464};
    kern_model_t model = {LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, BS, DTYPE, DTYPE, 0.f};
    kv_pool_t *pool;
    sched_t *sched;
    kern_backend_t *be;
    uint32_t max_tokens = MAX_BATCH * (SYS_TOK + SUB_TOK + USER_TOK);
    if (kv_pool_create(&pc, &pool) < 0)
        return 1;
    sched_config_t sc = {.max_queries = N_REQ,
                         .max_tokens = max_tokens,
                         .block_size = BS,
                         .q_heads = Q_HEADS,
                         .kv_heads = KV_HEADS,
                         .head_dim = HEAD_DIM,
                         .kv_elt_bytes = 2,
                         .split_min_kv = 256,
                         .max_partials = 8 * max_tokens};
    kern_config_t kc = {.model = model,
                        .n_blocks = pc.n_blocks,
                        .max_tokens = max_tokens,
                        .max_partials = 8 * max_tokens};
    int rc;
    if ((rc = sched_create(&sc, &sched)) < 0 || (rc = kern_backend_create("cpu", &kc, &be)) < 0) {
        fprintf(stderr, "setup failed: %s\n", strerror(-rc));
        return 1;
    }
    printf("patd demo: %u requests, system prompt %u tokens, 4 task prompts of %u, model "
           "%u layers %u/%u heads d=%u fp16, cpu backend\n",
           N_REQ, SYS_TOK, SUB_TOK, LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM);

    req_t *reqs = pat_xcalloc(N_REQ, sizeof(req_t));
    for (uint32_t i = 0; i < N_REQ; i++) {
        req_t *r = &reqs[i];
        for (uint32_t t = 0; t < SYS_TOK; t++)
            push_token(r, 1000 + t);
        for (uint32_t t = 0; t < SUB_TOK; t++)
            push_token(r, 5000 + (i % 4) * 1000 + t);
        uint32_t user = tl_rng_range(&rng, 8, USER_TOK);
        for (uint32_t t = 0; t < user; t++)
            push_token(r, 100000 + (uint32_t)tl_rng_below(&rng, 50000));
        r->prompt_len = r->n_tok;
        r->gen_target = tl_rng_range(&rng, 8, 48);
        r->slot = i;
    }

    size_t qbytes = (size_t)max_tokens * Q_HEADS * HEAD_DIM * 2;
    uint16_t *q = pat_xmalloc(qbytes), *o = pat_xmalloc(qbytes);
    uint16_t *kbuf = pat_xmalloc((size_t)max_tokens * KV_HEADS * HEAD_DIM * 2);
    uint16_t *vbuf = pat_xmalloc((size_t)max_tokens * KV_HEADS * HEAD_DIM * 2);
    uint32_t *slots = pat_xmalloc(max_tokens * sizeof(uint32_t));
    double worst = 0.0, scale = 1.0 / sqrt((double)HEAD_DIM);
    uint64_t plan_kv = 0, qc_kv = 0, steps = 0, done = 0, next_req = 0, running = 0;
    uint64_t checked_rows = 0, prefill_tok = 0, decode_tok = 0;
    sched_forest_t *forest = sched_forest(sched);

    while (done < N_REQ && steps < steps_max) {
        /* admit: continuous batching up to MAX_BATCH, at most 4 new requests a step */
        for (uint32_t admitted = 0; admitted < 4 && running < MAX_BATCH && next_req < N_REQ;
             admitted++) {
            req_t *r = &reqs[next_req++];
            uint32_t cached;
            if ((rc = kv_seq_open(pool, r->tok, r->prompt_len, &r->seq, &cached)) < 0) {
                fprintf(stderr, "open: %s\n", strerror(-rc));
                return 1;
            }
            r->len = cached;
            r->state = 1;
            running++;
        }
        /* this step's rows: prefill the rest of the prompt, or decode one token */
        uint32_t tok = 0;
        for (uint32_t i = 0; i < N_REQ; i++) {
            req_t *r = &reqs[i];
            if (r->state != 1)
                continue;
            if (r->n_tok == r->len) /* decode: sample the next token from the last output */
                push_token(r, 200000 + (uint32_t)(r->hash[r->n_tok - 1] % 30000));
            r->n_new = r->n_tok - r->len;
            r->tok_off = tok;
            tok += r->n_new;
            if ((rc = kv_seq_reserve(pool, r->seq, r->n_new)) < 0) {
                fprintf(stderr, "reserve: %s\n", strerror(-rc));
                return 1;
            }
            kv_seq_info_t info;
            kv_seq_info(pool, r->seq, &info);
            sched_query_t sq = {info.blocks, info.n_blocks, r->len + r->n_new,
                                r->n_new,    r->tok_off,    info.version};
            rc = sched_forest_grow(forest, r->slot, &sq);
            /* changed, not grown (a twin's copy shared at commit): leave and join afresh */
            if (rc == -EINVAL && sched_forest_leave(forest, r->slot) == 0)
                rc = -ENOENT;
            if (rc == -ENOENT)
                rc = sched_forest_join(forest, r->slot, &sq);
            if (rc < 0) {
                fprintf(stderr, "forest: %s\n", strerror(-rc));
                return 1;
            }
            if (r->n_new > 1)
                prefill_tok += r->n_new;
            else
                decode_tok++;
        }
        const sched_plan_hdr_t *plan;
        if ((rc = sched_build(sched, &plan)) < 0) {
            fprintf(stderr, "plan: %s\n", strerror(-rc));
            return 1;
        }
        sched_traffic_t pt, qt;
        sched_plan_traffic(plan, Q_HEADS, KV_HEADS, HEAD_DIM, 2, 2, &pt);
        sched_query_centric_traffic(sched, &qt);
        plan_kv += pt.kv * LAYERS;
        qc_kv += qt.kv * LAYERS;

        for (uint32_t layer = 0; layer < LAYERS; layer++) {
            /* the "model": new K/V from the token prefix, random Q */
            uint32_t n = 0;
            for (uint32_t i = 0; i < N_REQ; i++) {
                req_t *r = &reqs[i];
                if (r->state != 1)
                    continue;
                kv_seq_info_t info;
                kv_seq_info(pool, r->seq, &info);
                for (uint32_t k = 0; k < r->n_new; k++, n++) {
                    uint32_t pos = r->len + k;
                    slots[n] = info.blocks[pos / BS] * BS + pos % BS;
                    for (uint32_t h = 0; h < KV_HEADS; h++)
                        for (uint32_t x = 0; x < HEAD_DIM; x++) {
                            size_t e = ((size_t)n * KV_HEADS + h) * HEAD_DIM + x;
                            kbuf[e] = kern_f32_to_f16(kv_elem(layer, r->hash[pos], h, x, 0));
                            vbuf[e] = kern_f32_to_f16(kv_elem(layer, r->hash[pos], h, x, 1));
                        }
                }
            }
            for (size_t e = 0; e < (size_t)tok * Q_HEADS * HEAD_DIM; e++)
                q[e] = kern_f32_to_f16((float)(2.0 * tl_rng_unit(&rng)));
            memset(o, 0xff, (size_t)tok * Q_HEADS * HEAD_DIM * 2);
            kern_attn_params_t ap = {.scale = (float)scale};
            if ((rc = kern_append_kv(be, layer, kbuf, vbuf, slots, n)) < 0 ||
                (rc = kern_attend(be, layer, plan, q, o, &ap)) < 0) {
                fprintf(stderr, "backend: %s\n", strerror(-rc));
                return 1;
            }
            /* check every row against float64 over the logical KV */
            for (uint32_t i = 0; i < N_REQ; i++) {
                req_t *r = &reqs[i];
                if (r->state != 1)
                    continue;
                uint32_t kvn = r->len + r->n_new;
                double *K = pat_xmalloc((size_t)kvn * HEAD_DIM * sizeof(double));
                double *V = pat_xmalloc((size_t)kvn * HEAD_DIM * sizeof(double));
                double qd[HEAD_DIM], ref[HEAD_DIM], got[HEAD_DIM];
                for (uint32_t h = 0; h < KV_HEADS; h++) {
                    for (uint32_t p = 0; p < kvn; p++)
                        for (uint32_t x = 0; x < HEAD_DIM; x++) {
                            K[(size_t)p * HEAD_DIM + x] = kern_f16_to_f32(
                                kern_f32_to_f16(kv_elem(layer, r->hash[p], h, x, 0)));
                            V[(size_t)p * HEAD_DIM + x] = kern_f16_to_f32(
                                kern_f32_to_f16(kv_elem(layer, r->hash[p], h, x, 1)));
                        }
                    for (uint32_t k = 0; k < r->n_new; k++)
                        for (uint32_t j = 0; j < Q_HEADS / KV_HEADS; j++) {
                            uint32_t qh = h * (Q_HEADS / KV_HEADS) + j;
                            size_t base = ((size_t)(r->tok_off + k) * Q_HEADS + qh) * HEAD_DIM;
                            for (uint32_t x = 0; x < HEAD_DIM; x++) {
                                qd[x] = kern_f16_to_f32(q[base + x]);
                                got[x] = kern_f16_to_f32(o[base + x]);
                            }
                            tl_ref_attend(qd, K, V, r->len + k + 1, HEAD_DIM, scale, 0, ref);
                            double err = tl_rel_err(got, ref, HEAD_DIM);
                            worst = err > worst || isnan(err) ? err : worst;
                            checked_rows++;
                        }
                }
                free(K);
                free(V);
            }
        }
        /* the step's KV is written: commit (publishes full blocks), retire finished requests */
        for (uint32_t i = 0; i < N_REQ; i++) {
            req_t *r = &reqs[i];
            if (r->state != 1)
                continue;
            kv_seq_commit(pool, r->seq, r->tok + r->len, r->n_new);
            r->len += r->n_new;
            if (r->n_tok - r->prompt_len >= r->gen_target) {
                sched_forest_leave(forest, r->slot);
                kv_seq_close(pool, r->seq);
                r->state = 2;
                running--;
                done++;
            }
        }
        steps++;
    }

    kv_stats_t ks;
    kv_pool_stats(pool, &ks);
    sched_stats_t ss;
    sched_get_stats(sched, &ss);
    int pool_ok = kv_pool_check(pool) == 0 && ks.n_used == 0 && ks.n_seqs == 0;
    int ok = done == N_REQ && worst < 1e-2 && pool_ok;
    printf("steps %llu: %llu prefill tokens, %llu decode tokens, %llu output rows checked\n",
           (unsigned long long)steps, (unsigned long long)prefill_tok,
           (unsigned long long)decode_tok, (unsigned long long)checked_rows);
    printf("prefix cache: %llu blocks hit, %llu missed (%.0f%% of prompt blocks reused), "
           "%u blocks cached at the end\n",
           (unsigned long long)ks.hit_blocks, (unsigned long long)ks.miss_blocks,
           100.0 * ks.hit_blocks / (double)(ks.hit_blocks + ks.miss_blocks), ks.n_cached);
    printf("KV read by the plans: %.1f MB vs %.1f MB query-centric (%.1f%% saved); pack reused "
           "on %llu of %llu steps\n",
           plan_kv / 1e6, qc_kv / 1e6, 100.0 * (1.0 - (double)plan_kv / (double)qc_kv),
           (unsigned long long)ss.pack_reuses, (unsigned long long)ss.plans);
    printf("worst relative error vs float64: %.2e (bound 1e-2); block accounting %s\n", worst,
           pool_ok ? "clean" : "BROKEN");
    printf("%s\n", ok ? "demo: OK" : "demo: FAILED");

    for (uint32_t i = 0; i < N_REQ; i++) {
        free(reqs[i].tok);
        free(reqs[i].hash);
    }
    free(reqs);
    free(q);
    free(o);
    free(kbuf);
    free(vbuf);
    free(slots);
    kern_backend_free(be);
    sched_free(sched);
    kv_pool_free(pool);
    return ok ? 0 : 1;
}
