/*
 * tl_client.h — a deterministic "model" driving patd through libpat, for the demo and the
 * integration tests: sequences of token ids whose K and V are a function of the token prefix
 * (so a shared prefix has the same KV whoever computed it, and prefix-cache hits are checked
 * for real), random Q, and a float64 check of every output row of every layer.
 */
#ifndef TL_CLIENT_H
#define TL_CLIENT_H

#include <stdint.h>

#include "pat.h"
#include "tl_rng.h"

typedef struct tl_seq {
    uint32_t seq;   /* patd sequence id */
    uint32_t *tok;  /* every token id known: prompt, then generated */
    uint64_t *hash; /* hash of tok[0..i]: names the KV of position i */
    uint32_t n_tok, cap;
    uint32_t len;    /* KV tokens written (committed) */
    uint32_t cached; /* cached_len at open */
} tl_seq_t;

void tl_seq_init(tl_seq_t *s);
void tl_seq_push(tl_seq_t *s, uint32_t tok);
void tl_seq_done(tl_seq_t *s);
/* A session of model m on sock (up to 8 sequences, batch_tokens a step): pat_connect's result. */
int tl_connect(const char *sock, const pat_model_t *m, const char *label, uint32_t batch_tokens,
               uint32_t timeout_ms, pat_conn_t **ret, char *why, size_t why_len);
/* Opens s in patd with its current tokens as the prompt; sets seq, cached and len. */
int tl_seq_open(pat_conn_t *c, tl_seq_t *s);

typedef struct tl_step_result {
    double worst;  /* largest relative error of a row vs float64 */
    uint64_t rows; /* rows checked (tokens x q heads x layers) */
    pat_step_info_t info;
} tl_step_result_t;

/* One step: every sequence brings its unwritten tokens (n_tok - len, >= 1). Per layer writes
 * K, V, Q into the staging buffers, pat_attend()s and checks every row; then pat_step_end and
 * advances len. Returns 0 or the first libpat error (the step is aborted on a check failure:
 * -EIO). Checks are skipped when check == 0 (load, fault tests). */
int tl_client_step(pat_conn_t *c, const pat_model_t *m, tl_seq_t **seqs, uint32_t n, tl_rng_t *rng,
                   int check, tl_step_result_t *res);

/* Called before a layer is handed over (its Q, K, V written, pat_attend not yet called), on the
 * stepping thread: a test's way to make a client slow inside a step, or to hold clients mid-step
 * until it has looked at the daemon. */
typedef void (*tl_layer_hook_t)(void *arg, uint32_t layer);

/* tl_client_step with hook(arg, layer) before every layer's hand-over (hook may be NULL). */
int tl_client_step_hooked(pat_conn_t *c, const pat_model_t *m, tl_seq_t **seqs, uint32_t n,
                          tl_rng_t *rng, int check, tl_step_result_t *res, tl_layer_hook_t hook,
                          void *arg);

/* A bystander: a session with two sequences over one prompt (tokens base..base+63, then 90 and
 * 91), each step decoding one token of each and checking every row against float64, beside
 * whatever a test does to the daemon. */
typedef struct tl_bystander {
    pat_conn_t *c;
    const pat_model_t *m;
    tl_seq_t s[2];
    tl_seq_t *ps[2];
    tl_rng_t rng;
    uint32_t base; /* its prompt's first token id */
} tl_bystander_t;

/* Connects to sock (label "bystander") and opens its sequences: 0, or a negative errno with why. */
int tl_by_open(tl_bystander_t *b, const char *sock, const pat_model_t *m, uint32_t base, char *why,
               size_t why_len);
/* One checked step: 0, a negative errno (why holds libpat's word), or -EDOM when a row is off
 * float64 by 1e-2 or more. */
int tl_by_step(tl_bystander_t *b, char *why, size_t why_len);
/* Closes both sequences and opens them again over the same prompt (found in the prefix cache),
 * nothing generated: a step costs what the first one after tl_by_open did (its cost grows with
 * the context). 0, or a negative errno with why. */
int tl_by_restart(tl_bystander_t *b, char *why, size_t why_len);
void tl_by_close(tl_bystander_t *b);

/* This process's open descriptors below 1024: a test that counts them before and after shows
 * that a path leaks none. */
int tl_open_fds(void);

#endif
