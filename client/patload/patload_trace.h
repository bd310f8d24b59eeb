/*
 * patload_trace.h — request traces for patload: reading the formats in shared/traces (Mooncake
 * and synthetic JSON Lines with prefix block hashes, Azure LLM CSV) and BurstGPT's CSV, plain or
 * xz-compressed, and turning them into the token ids a replay sends.
 *
 * Token ids are a pure function of the trace: the tokens of a prefix block are derived from its
 * hash id (and the position inside the block), so two requests whose hash chains agree send the
 * same leading tokens and patd's prefix cache sees the sharing the trace recorded. Requests of a
 * trace without hashes (Azure, BurstGPT) get tokens of their own, after an optional shared
 * prefix; requests of a group (the generated-shared-prefix workload, patload_synth.h) start with
 * their group's prompt.
 */
#ifndef PATLOAD_TRACE_H
#define PATLOAD_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define PL_TRACE_MAX_BYTES (1ull << 30) /* largest (decompressed) trace file we read */
#define PL_TRACE_MAX_REQS  (1u << 24)
#define PL_VOCAB           128256u /* token ids in [0, PL_VOCAB), a Llama-3-sized vocabulary */

typedef enum pl_format {
    PL_FMT_JSONL = 1,
    PL_FMT_AZURE_CSV = 2,
    PL_FMT_BURSTGPT_CSV = 3,
    PL_FMT_GSP = 4 /* generated, not read (patload_synth.h) */
} pl_format_t;

typedef struct pl_req {
    double t_s;        /* recorded arrival, seconds since the trace's first request */
    uint32_t in_len;   /* recorded prompt tokens */
    uint32_t out_len;  /* recorded output tokens */
    uint32_t n_hash;   /* prefix block hashes (0: none in the trace) */
    uint32_t line;     /* 1-based line in the file */
    uint64_t hash_off; /* first hash in pl_trace_t.hash */
    int64_t session;   /* session id (-1: none) */
    uint32_t turn;     /* turn within the session (0: none) */
    int32_t next;      /* the request of the session's next turn, -1 if none */
    int32_t prev;      /* ... and of its previous turn */
    int32_t group;     /* prompt group (generated shared prefix), -1 if none */
    uint32_t prefix;   /* recorded tokens of the group's prompt (0: none) */
} pl_req_t;

typedef struct pl_trace {
    pl_format_t format;
    pl_req_t *req;
    uint32_t n;
    int64_t *hash; /* all requests' hash ids */
    uint64_t n_hash;
    uint32_t block;   /* tokens per hash block (detected, or given) */
    int has_hash;     /* every request carries hash ids */
    int has_session;  /* requests carry session_id and turn */
    uint32_t dropped; /* rows left out: BurstGPT's failed requests (0 response tokens) and
                       * empty prompts */
} pl_trace_t;

/* patload's failure convention: formats the detail into why (why_len bytes; NULL ok) and
 * returns err (a negative errno). */
int pl_fail(char *why, size_t why_len, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Reads a trace (".xz" names are decompressed). skip/limit select rows in file order, the
 * dropped ones not counted (limit 0 = all); block > 0 sets the tokens per hash block, 0 detects
 * it from the rows. Returns 0, or a negative errno with why (why_len bytes) naming the file, line
 * and field at fault. */
int pl_trace_load(pl_trace_t *t, const char *path, uint32_t skip, uint32_t limit, uint32_t block,
                  char *why, size_t why_len);
void pl_trace_done(pl_trace_t *t);
const char *pl_format_name(pl_format_t f);

/* How the replay shapes a trace's requests. */
typedef struct pl_shape {
    double scale;           /* length scale: tokens per hash block = round(block * scale) */
    uint32_t max_input;     /* cap on replayed prompt tokens (0: none) */
    uint32_t max_output;    /* cap on replayed output tokens (0: none) */
    uint32_t shared_prefix; /* traces without hashes: tokens every prompt starts with */
    uint64_t salt;          /* mixed into every token (0: the trace's own tokens) */
} pl_shape_t;

/* Tokens a hash block of the trace becomes in the replay: round(block x scale), >= 1. */
uint32_t pl_block_tokens(const pl_trace_t *t, const pl_shape_t *s);
/* Replayed prompt length of request i (>= 1). */
uint32_t pl_req_input(const pl_trace_t *t, const pl_shape_t *s, uint32_t i);
/* Replayed tokens of request i's group prompt (0: not in a group); at most its prompt. */
uint32_t pl_req_prefix(const pl_trace_t *t, const pl_shape_t *s, uint32_t i);
/* Replayed output length of request i (>= 1: a prefill always yields one token). */
uint32_t pl_req_output(const pl_trace_t *t, const pl_shape_t *s, uint32_t i);
/* Token id at position pos of request i's sequence. Positions past the prompt are its
 * generated tokens: the next turn's prompt where the trace links one (so a follow-up turn finds
 * the reply in the prefix cache), else tokens of its own. */
uint32_t pl_req_token(const pl_trace_t *t, const pl_shape_t *s, uint32_t i, uint32_t pos);

#endif
