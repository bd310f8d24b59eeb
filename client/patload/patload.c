/*
 * patload.c — replays a request trace against a running patd as a serving frontend would, and
 * reports how patd held up: latency percentiles, throughput, prefix reuse, KV bytes, errors.
 * For operators sizing a deployment and developers checking a change under a real request mix.
 *
 * The workload is a trace file (patload_trace.h) or SGLang's generated-shared-prefix set (--gsp,
 * patload_synth.h); requests arrive at their recorded times (scaled by --speed, or all at once)
 * or at synthetic times (--request-rate, --burstiness, as vLLM's benchmark draws them). The
 * summary gives the serving benchmarks' figures (patload_metrics.h: goodput, ITL, percentiles,
 * vLLM's JSON field names); --report-from recomputes them from a saved run without a daemon.
 *
 * One connection, one thread, continuous batching: requests arrive, wait in a FIFO, are admitted
 * while fewer than --concurrency run (pat_seq_open_pending: the prefix cache answers how much of
 * the prompt is already there, and how much more other open sequences are about to write), prefill
 * the rest in chunks of --chunk tokens, decode one token per step until the trace's output length,
 * and retire (pat_seq_close). Every step carries every decoding sequence plus as many prefill
 * tokens as fit in the batch (--max-batch-tokens). A step the daemon refuses for lack of KV blocks
 * (-ENOSPC, -EDQUOT) preempts the most recently admitted request (its KV is dropped; it is
 * re-admitted later and recomputes what the prefix cache no longer holds) and is retried, as vLLM
 * does. Turns of one session (multi-turn traces) run in order: a turn arrives no earlier than the
 * previous one finished. Around every layer's attention hand-off patload runs a stand-in for the
 * model's own compute (patload_compute.h).
 *
 * Exit status: 0 every request finished; 1 some failed, or the replay was interrupted
 * (--report-from: the saved run has failed requests, or --json could not be written); 2 usage,
 * trace or saved-file error; 3 the daemon is unreachable or went away.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc_proto.h" /* IPC_VERSION, for --version */
#include "pat.h"
#include "pat_base.h"
#include "patload_compute.h"
#include "patload_metrics.h"
#include "patload_report.h"
#include "patload_synth.h"
#include "patload_trace.h"

#define ADMIT_WATERMARK 0.95 /* share of the KV capacity admission may plan to fill */
#define TWIN_WAITS_MAX  64   /* --wait-twins: admissions of one request put off at most */

#define EXIT_FAILED 1
#define EXIT_USAGE  2
#define EXIT_DAEMON 3

/* ---------------------------------------------------------------- options (one table) */

/* O_PCT and O_SLO fill the metrics configuration (patload_metrics.h); O_SLO also takes the
 * KEY:MS words that follow its value, as vLLM's --goodput does (argparse's nargs="+": the
 * --goodput=WORD form takes that one word). */
typedef enum { O_STR, O_U32, O_F64, O_FLAG, O_PCT, O_SLO } otype_t;

static struct {
    const char *socket, *json, *csv, *steps_csv, *plot, *compute, *label, *kv_dtype;
    const char *report_from, *dump;
    double speed, scale, duration, layer_us, tflops, progress, rate, burstiness;
    uint32_t skip, limit, concurrency, batch, chunk, max_input, max_output, shared_prefix;
    uint32_t trace_block, hidden, ffn, seed, timeout_ms;
    int loop, spread, quiet, dry_run, replot, help, version, wait_twins, save_detailed;
    int gsp;
    pl_gsp_t g;
} O = {
    .speed = 1,
    .rate = INFINITY,
    .burstiness = 1,
    .g = {.num_groups = 64,
          .prompts_per_group = 16,
          .system_prompt_len = 2048,
          .question_len = 128,
          .output_len = 256,
          .range_ratio = 1},
    .scale = 1,
    .layer_us = 20,
    .tflops = 400,
    .progress = -1,
    .concurrency = 64,
    .batch = 2048,
    .chunk = 512,
    .compute = "auto",
    .label = "patload",
    .timeout_ms = 60000,
};
static pl_metrics_cfg_t M; /* --percentiles, --goodput */

static const struct opt {
    const char *name;
    otype_t type;
    void *ptr;
    double lo, hi;
    const char *meta, *help;
} OPTS[] = {
    {"socket", O_STR, &O.socket, 0, 0, "PATH",
     "patd's control socket (default: $PATD_SOCKET, else patd's default)"},
    {"speed", O_F64, &O.speed, 0, 1e6, "X",
     "replay X times faster than recorded; 0 = as fast as possible (default 1)"},
    {"request-rate", O_F64, &O.rate, 1e-6, INFINITY, "R",
     "synthetic arrivals instead of the trace's times, in its order: R requests/s on average, "
     "the last at N/R s (inf = all at once; vLLM's --request-rate)"},
    {"burstiness", O_F64, &O.burstiness, 1e-3, INFINITY, "B",
     "with --request-rate: gaps drawn from a gamma distribution of shape B (default 1: a "
     "Poisson process; < 1 burstier, > 1 more even, inf evenly spaced; vLLM's --burstiness)"},
    {"spread", O_FLAG, &O.spread, 0, 0, NULL,
     "spread requests with equal timestamps evenly until the next timestamp (Mooncake's are "
     "quantised to ~3 s)"},
    {"wait-twins", O_FLAG, &O.wait_twins, 0, 0, NULL,
     "admit a request whose prompt shares whole blocks with another open sequence still "
     "prefilling them (patd's pending count at open) once they are written, so that the prefix "
     "cache gives them (a frontend's wait for a twin; the summary's twins line says what it "
     "could save)"},
    {"skip", O_U32, &O.skip, 0, 4e9, "N",
     "skip the first N requests of the file (or of --gsp's; BurstGPT's dropped rows not counted)"},
    {"limit", O_U32, &O.limit, 0, 4e9, "N", "replay at most N requests (0 = all)"},
    {"concurrency", O_U32, &O.concurrency, 1, 65536, "N",
     "requests running at once, at most (default 64; capped by the batch and the daemon's quota)"},
    {"max-batch-tokens", O_U32, &O.batch, 1, 1048576, "N",
     "tokens per step: staging rows asked of the daemon (default 2048)"},
    {"chunk", O_U32, &O.chunk, 1, 1048576, "N", "prefill chunk per request per step (default 512)"},
    {"scale", O_F64, &O.scale, 1e-6, 1e3, "F",
     "scale prompt and output lengths by F: tokens per trace block = round(block x F), so shared "
     "prefixes stay shared (default 1)"},
    {"max-input", O_U32, &O.max_input, 0, 4e9, "N", "cap replayed prompts at N tokens (0 = none)"},
    {"max-output", O_U32, &O.max_output, 0, 4e9, "N",
     "cap replayed outputs at N tokens (0 = none)"},
    {"shared-prefix", O_U32, &O.shared_prefix, 0, 1048576, "N",
     "traces without prefix hashes (Azure, BurstGPT): every prompt starts with the same N "
     "tokens"},
    {"trace-block", O_U32, &O.trace_block, 0, 1048576, "N",
     "tokens per hash block of the trace (default: detected; Mooncake 512, ours 16)"},
    {"duration", O_F64, &O.duration, 0, 1e7, "S",
     "stop admitting new requests after S seconds (0 = when the trace ends)"},
    {"loop", O_FLAG, &O.loop, 0, 0, NULL,
     "replay the trace again and again (each pass with fresh tokens) until --duration (the "
     "summary's num_prompts counts one pass)"},
    {"seed", O_U32, &O.seed, 0, 4e9, "N",
     "mixed into every token id, and seeds --request-rate's gaps and --gsp's lengths and order "
     "(default 0: the same workload on every run)"},
    {"gsp", O_FLAG, &O.gsp, 0, 0, NULL,
     "no TRACE: generate SGLang's generated-shared-prefix workload (groups of prompts sharing a "
     "system prompt, each with a question of its own; shuffled; all at once unless "
     "--request-rate)"},
    {"gsp-num-groups", O_U32, &O.g.num_groups, 1, 1 << 24, "N",
     "--gsp: groups of prompts sharing a system prompt (default 64)"},
    {"gsp-prompts-per-group", O_U32, &O.g.prompts_per_group, 1, 1 << 24, "N",
     "--gsp: prompts per group (default 16)"},
    {"gsp-system-prompt-len", O_U32, &O.g.system_prompt_len, 1, 1 << 24, "N",
     "--gsp: tokens of a group's system prompt (default 2048)"},
    {"gsp-question-len", O_U32, &O.g.question_len, 1, 1 << 24, "N",
     "--gsp: tokens of a prompt's own question (default 128)"},
    {"gsp-output-len", O_U32, &O.g.output_len, 1, 1 << 24, "N",
     "--gsp: output tokens per request (default 256)"},
    {"gsp-range-ratio", O_F64, &O.g.range_ratio, 0, 1, "F",
     "--gsp: each length uniform in [max(1, floor(len x F)), len] (default 1: exactly len)"},
    {"gsp-ordered", O_FLAG, &O.g.ordered, 0, 0, NULL,
     "--gsp: requests group by group instead of shuffled"},
    {"kv-dtype", O_STR, &O.kv_dtype, 0, 0, "NAME",
     "the KV pool the run needs: f16 | bf16 | f32 | fp8_e4m3 | fp8_e5m2; a daemon whose pool "
     "holds another refuses the session (default: whatever the daemon's holds)"},
    {"compute", O_STR, &O.compute, 0, 0, "KIND",
     "model compute stand-in: auto (gpu on a GPU session, else cpu) | cpu | gpu | none"},
    {"layer-us", O_F64, &O.layer_us, 0, 1e7, "US",
     "cpu stand-in: fixed cost per layer in µs (default 20)"},
    {"tflops", O_F64, &O.tflops, 1e-3, 1e5, "R",
     "cpu stand-in: modelled GEMM rate, TFLOP/s, for the per-token cost (default 400)"},
    {"hidden", O_U32, &O.hidden, 0, 1048576, "N",
     "model width for the stand-in (default q_heads x head_dim)"},
    {"ffn", O_U32, &O.ffn, 0, 4194304, "N",
     "MLP width for the stand-in (default 8/3 x hidden, rounded up to 256)"},
    {"timeout-ms", O_U32, &O.timeout_ms, 100, 3.6e6, "MS",
     "per request and per layer wait (default 60000)"},
    {"json", O_STR, &O.json, 0, 0, "FILE",
     "write the summary as JSON (the serving figures under `vllm bench serve --save-result` "
     "names: completed, request_goodput, mean_itl_ms, p99_ttft_ms, ...; request_rate and "
     "burstiness as --request-rate / --burstiness set them, \"inf\" and 1 for --gsp without "
     "them, null when a trace's own times are replayed; failed requests by code in "
     "errors_by_code)"},
    {"save-detailed", O_FLAG, &O.save_detailed, 0, 0, NULL,
     "with --json: add the per-request arrays of vLLM's --save-detailed: input_lens, "
     "output_lens (tokens), start_times, ttfts, itls, latencies (seconds; a failed request has "
     "0 output tokens, TTFT and latency) and errors (\"\" or the failure's name, e.g. "
     "\"E2BIG\")"},
    {"goodput", O_SLO, &M, 0, 0, "KEY:MS...",
     "count a completed request as good when it meets every bound given: ttft, tpot, e2el in ms "
     "(--goodput ttft:500 tpot:50 takes the following words that start with ttft:, tpot: or "
     "e2el: and a number; --goodput=ttft:500,tpot:50 takes that one word, comma-separated); "
     "the summary adds request_goodput (good requests/s)"},
    {"percentiles", O_PCT, &M, 0, 0, "P,P...",
     "latency percentiles to report, each in [0, 100] (default 90,99; the median is always "
     "there)"},
    {"csv", O_STR, &O.csv, 0, 0, "FILE", "write one row per request"},
    {"steps-csv", O_STR, &O.steps_csv, 0, 0, "FILE", "write one row per step"},
    {"plot", O_STR, &O.plot, 0, 0, "FILE.png",
     "draw latency and batch size over time (gnuplot); writes FILE.png.requests.csv / .steps.csv "
     "unless --csv / --steps-csv name them"},
    {"progress", O_F64, &O.progress, 0, 3600, "S",
     "progress line every S seconds (default: 0.5 on a terminal, 10 otherwise; 0 = off)"},
    {"quiet", O_FLAG, &O.quiet, 0, 0, NULL, "no progress line"},
    {"label", O_STR, &O.label, 0, 0, "TEXT",
     "connection label shown by `patctl seqs` (default patload)"},
    {"replot", O_FLAG, &O.replot, 0, 0, NULL,
     "no replay: draw --plot from the files --csv and --steps-csv name (written by an earlier run, "
     "e.g. on a machine without gnuplot)"},
    {"report-from", O_STR, &O.report_from, 0, 0, "FILE",
     "no replay: recompute the serving figures from FILE, a JSON with the per-request arrays "
     "(patload --json --save-detailed, or vllm bench serve --save-result --save-detailed); "
     "a request failed when its errors entry is not \"\", or when it has 0 output tokens and a "
     "latency of 0 (what vLLM saves for a failure, whose reason may be empty); times must lie "
     "in [0, 1e9] s and duration in [1e-6, 1e9] s; takes --goodput, --percentiles, --json and "
     "--quiet"},
    {"dry-run", O_FLAG, &O.dry_run, 0, 0, NULL,
     "read and shape the trace, print what would be replayed, exit (no daemon)"},
    {"dump", O_STR, &O.dump, 0, 0, "FILE",
     "write every request as it would be replayed (first pass) to FILE as JSON Lines: "
     "timestamp (its arrival, ms), input_length, output_length, line, group, prefix_length, "
     "tokens (the prompt's ids); with --dry-run nothing is replayed"},
    {"help", O_FLAG, &O.help, 0, 0, NULL, "this text"},
    {"version", O_FLAG, &O.version, 0, 0, NULL,
     "print patload's release and wire protocol versions and exit"},
};
#define N_OPTS (sizeof(OPTS) / sizeof(OPTS[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: patload [OPTIONS] TRACE\n"
               "       patload [OPTIONS] --gsp [--gsp-... OPTIONS]\n"
               "       patload --report-from FILE [--goodput KEY:MS...] [--percentiles P,P...]\n"
               "               [--json FILE] [--quiet]\n\n"
               "Replays TRACE (Mooncake / synthetic JSON Lines with prefix block hashes, Azure\n"
               "LLM CSV or BurstGPT CSV; .xz is read directly) or a generated workload against a\n"
               "running patd with continuous batching, and prints the serving benchmarks' figures\n"
               "(requests, goodput, throughput; TTFT, TPOT, ITL, end-to-end latency: mean,\n"
               "median, std, percentiles), prefix-cache hit rate, KV bytes read against\n"
               "query-centric attention, and errors by code.\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        char left[40];
        snprintf(left, sizeof(left), "--%s%s%s", OPTS[i].name, OPTS[i].meta ? " " : "",
                 OPTS[i].meta ? OPTS[i].meta : "");
        fprintf(f, "  %-26s %s\n", left, OPTS[i].help);
    }
    fprintf(f, "\nExit status: 0 every request finished; 1 some failed or the replay was "
               "interrupted\n(--report-from: the saved run has failed requests, or --json could "
               "not be written);\n2 usage, trace or saved-file error; 3 the daemon is unreachable "
               "or went away.\n");
}

static uint8_t GIVEN[N_OPTS]; /* options on the command line */

static int given(const char *name)
{
    for (size_t k = 0; k < N_OPTS; k++)
        if (!strcmp(OPTS[k].name, name))
            return GIVEN[k];
    return 0;
}

static int parse_args(int argc, char **argv, const char **ret_trace)
{
    const char *trace = NULL;
    char why[256];
    int slo_eq = -1; /* argv index of a --goodput=WORD */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] != '-') {
            if (slo_eq == i - 1 && pl_metrics_is_slo_word(a)) {
                fprintf(
                    stderr, "patload: %s takes that one word: --goodput=%s,%s or --goodput %s %s\n",
                    argv[i - 1], strchr(argv[i - 1], '=') + 1, a, strchr(argv[i - 1], '=') + 1, a);
                return -1;
            }
            if (trace) {
                fprintf(stderr, "patload: one trace only ('%s' and '%s')\n", trace, a);
                return -1;
            }
            trace = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        const struct opt *o = NULL;
        for (size_t k = 0; k < N_OPTS; k++)
            if (strlen(OPTS[k].name) == nl && !strncmp(OPTS[k].name, name, nl))
                o = &OPTS[k];
        if (!o) {
            fprintf(stderr, "patload: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        GIVEN[o - OPTS] = 1;
        if (o->type == O_FLAG) {
            if (eq) {
                fprintf(stderr, "patload: --%s takes no value\n", o->name);
                return -1;
            }
            *(int *)o->ptr = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "patload: --%s needs a value (%s)\n", o->name, o->meta);
            return -1;
        }
        if (o->type == O_STR) {
            *(const char **)o->ptr = v;
            continue;
        }
        if (o->type == O_PCT || o->type == O_SLO) {
            int rc = o->type == O_PCT ? pl_metrics_parse_percentiles(o->ptr, v, why, sizeof(why))
                                      : pl_metrics_parse_goodput(o->ptr, v, why, sizeof(why));
            while (rc == 0 && o->type == O_SLO && !eq && i + 1 < argc &&
                   pl_metrics_is_slo_word(argv[i + 1]))
                rc = pl_metrics_parse_goodput(o->ptr, argv[++i], why, sizeof(why));
            if (rc < 0) {
                fprintf(stderr, "patload: %s\n", why);
                return -1;
            }
            if (o->type == O_SLO && eq)
                slo_eq = i;
            continue;
        }
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !(x >= o->lo && x <= o->hi) ||
            (o->type == O_U32 && x != floor(x))) {
            fprintf(stderr, "patload: --%s %s: expected %s in [%g, %g]\n", o->name, v,
                    o->type == O_U32 ? "an integer" : "a number", o->lo, o->hi);
            return -1;
        }
        if (o->type == O_U32)
            *(uint32_t *)o->ptr = (uint32_t)x;
        else
            *(double *)o->ptr = x;
    }
    *ret_trace = trace;
    return 0;
}

/* ---------------------------------------------------------------- small helpers */

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    g_stop = sig;
}

static double now_s(void)
{
    return pat_now_ns() / 1e9;
}

/* ---------------------------------------------------------------- the replay */

enum { R_UNSEEN = 0, R_DEFERRED, R_ACTIVE, R_FINISHED };

typedef struct running {
    uint32_t rec;
    uint32_t seq;
    uint32_t target;    /* tokens to have in KV before decoding (prompt + generated so far) */
    uint32_t prefilled; /* tokens in KV */
} running_t;

typedef struct replay {
    const pl_trace_t *t;
    pl_shape_t shape;
    pat_conn_t *conn;
    pl_compute_t *pc;
    pl_report_t rep;
    pat_buffers_t buf;
    const char *sock;
    uint32_t max_seq_len, conc, batch;
    uint32_t block;      /* tokens per KV block */
    uint64_t cap_blocks; /* blocks this connection may hold: the pool, or its quota */
    /* trace pointer and per-pass state */
    double *t_adj; /* arrival after --spread, seconds */
    uint8_t *state;
    uint32_t next_i, deferred, pass;
    double pass_t0;
    /* records, queue, running set */
    uint32_t rec_cap;
    uint32_t *queue, q_head, q_len, q_cap;
    running_t *run;
    uint32_t n_run;
    /* step scratch */
    uint32_t *seqs, *n_new, *toks, *prompt;
    int32_t *slot; /* run[k]'s index in the step's arrays, -1 if not in it */
    uint32_t prompt_cap;
    FILE *steps_f;
    double t0, next_poll, next_progress, progress_every;
    int64_t blocks_used;
    uint32_t last_seqs, last_tokens; /* the latest committed step's batch */
    int tty;
    int fatal;      /* a negative errno that ended the replay */
    int hold_admit; /* after a preemption: admit nothing until a request finishes */
} replay_t;

static double arrival(const replay_t *R, uint32_t i)
{
    return R->pass_t0 + (O.speed > 0 ? R->t_adj[i] / O.speed : 0);
}

static uint32_t new_rec(replay_t *R, uint32_t i, double t_arrive)
{
    pl_report_t *rep = &R->rep;
    pat_grow((void **)&rep->rec, &R->rec_cap, rep->n_rec + 1, sizeof(*rep->rec));
    pl_rec_t *q = &rep->rec[rep->n_rec];
    *q = (pl_rec_t){.trace_idx = i,
                    .pass = R->pass,
                    .line = R->t->req[i].line,
                    .in_len = pl_req_input(R->t, &R->shape, i),
                    .out_len = pl_req_output(R->t, &R->shape, i),
                    .t_arrive = t_arrive,
                    .t_admit = -1,
                    .t_first = -1,
                    .t_done = -1};
    R->state[i] = R_ACTIVE;
    return rep->n_rec++;
}

static void queue_push(replay_t *R, uint32_t rec, int front)
{
    if (R->q_len + 1 > R->q_cap) {
        uint32_t nc = R->q_cap ? R->q_cap * 2 : 1024;
        uint32_t *nq = pat_xmalloc((size_t)nc * sizeof(*nq));
        for (uint32_t k = 0; k < R->q_len; k++)
            nq[k] = R->queue[(R->q_head + k) % R->q_cap];
        free(R->queue);
        R->queue = nq;
        R->q_head = 0;
        R->q_cap = nc;
    }
    if (front) {
        R->q_head = (R->q_head + R->q_cap - 1) % R->q_cap;
        R->queue[R->q_head] = rec;
    } else {
        R->queue[(R->q_head + R->q_len) % R->q_cap] = rec;
    }
    R->q_len++;
}

static uint32_t queue_pop(replay_t *R)
{
    uint32_t rec = R->queue[R->q_head];
    R->q_head = (R->q_head + 1) % R->q_cap;
    R->q_len--;
    return rec;
}

/* A request finished (done or failed): its session's next turn may now arrive. */
static void finish(replay_t *R, uint32_t rec, int err, double t)
{
    pl_rec_t *q = &R->rep.rec[rec];
    q->err = err;
    if (!err)
        q->t_done = t;
    R->hold_admit = 0;
    uint32_t i = q->trace_idx;
    R->state[i] = R_FINISHED;
    int32_t nx = R->t->req[i].next;
    if (nx >= 0 && R->state[nx] == R_DEFERRED) {
        R->deferred--;
        double ta = arrival(R, (uint32_t)nx);
        queue_push(R, new_rec(R, (uint32_t)nx, t > ta ? t : ta), 0);
    }
}

static void arrivals(replay_t *R, double t)
{
    const pl_trace_t *tr = R->t;
    while (R->next_i < tr->n && arrival(R, R->next_i) <= t) {
        if (O.duration > 0 && t >= O.duration)
            return;
        uint32_t i = R->next_i++;
        int32_t pv = tr->req[i].prev;
        if (pv >= 0 && R->state[pv] != R_FINISHED) {
            R->state[i] = R_DEFERRED;
            R->deferred++;
            continue;
        }
        queue_push(R, new_rec(R, i, arrival(R, i)), 0);
    }
}

static uint32_t *prompt_tokens(replay_t *R, uint32_t i, uint32_t n)
{
    pat_grow((void **)&R->prompt, &R->prompt_cap, n, sizeof(uint32_t));
    for (uint32_t p = 0; p < n; p++)
        R->prompt[p] = pl_req_token(R->t, &R->shape, i, p);
    return R->prompt;
}

static int is_fatal(int rc)
{
    return rc == -ECONNRESET || rc == -ESTALE || rc == -ESHUTDOWN || rc == -ETIMEDOUT ||
           rc == -EPROTO || rc == -EBADMSG || rc == -EIO || rc == -ENOMEM;
}

/* Opens sequences for queued requests while there is room. */
static void admit(replay_t *R, double t)
{
    /* Blocks the running requests hold or are about to need (shared prefixes counted once per
     * request: an over-estimate), so that admission leaves room to grow: a request is admitted
     * only while its prompt, that and one block of decode headroom per request fit in
     * ADMIT_WATERMARK of the capacity (as vLLM's can_allocate). Without it a burst of long
     * prompts fills the pool with half-done prefills that can only preempt one another. */
    if (R->hold_admit)
        return;
    uint64_t held = 0;
    for (uint32_t k = 0; k < R->n_run; k++)
        held += PAT_DIV_UP(R->run[k].target + 1, R->block);
    uint32_t passed = 0; /* queued requests moved behind the others for a twin, this call */
    while (R->q_len && R->n_run < R->conc && passed < R->q_len) {
        uint32_t rec = R->queue[R->q_head];
        pl_rec_t *q = &R->rep.rec[rec];
        uint32_t target = q->in_len + q->generated;
        uint64_t need = PAT_DIV_UP(target + 1, R->block);
        if (R->n_run > 0 &&
            (double)(held + need + R->n_run + 1) > ADMIT_WATERMARK * (double)R->cap_blocks)
            return; /* wait for room (a finishing request frees some) */
        if ((uint64_t)q->in_len + q->out_len - 1 > R->max_seq_len) {
            queue_pop(R);
            finish(R, rec, -E2BIG, t);
            continue;
        }
        uint32_t seq, cached, pending = 0;
        const uint32_t *toks = prompt_tokens(R, q->trace_idx, target);
        int rc = pat_seq_open_pending(R->conn, toks, target, &seq, &cached, &pending);
        if (rc == -EMFILE || rc == -EDQUOT || rc == -ENOSPC) {
            pl_report_count_err(R->rep.step_errs, &R->rep.n_step_errs, rc);
            if (R->n_run == 0) { /* nothing to wait for: it can never be admitted */
                queue_pop(R);
                finish(R, rec, rc, t);
                continue;
            }
            return;
        }
        if (rc < 0) {
            if (is_fatal(rc)) {
                R->fatal = rc;
                return;
            }
            queue_pop(R);
            finish(R, rec, rc, t);
            continue;
        }
        /* --wait-twins: patd says other open sequences are about to write whole blocks of this
         * prompt (a twin still prefilling it): closed again, and opened once they are written,
         * while a request of its own runs (the twin is usually one of them) and at most
         * TWIN_WAITS_MAX times (another client's twin may stall) */
        if (O.wait_twins && pending > 0 && R->n_run > 0 && q->twin_waits < TWIN_WAITS_MAX) {
            rc = pat_seq_close(R->conn, seq);
            if (rc < 0 && is_fatal(rc)) {
                R->fatal = rc;
                return;
            }
            q->twin_waits++;
            queue_pop(R);
            queue_push(R, rec, 0);
            passed++;
            R->rep.twin_waits++;
            continue;
        }
        queue_pop(R);
        if (q->t_admit < 0) {
            q->t_admit = t;
            q->cached = cached;
            q->inflight = pending;
        }
        R->run[R->n_run++] =
            (running_t){.rec = rec, .seq = seq, .target = target, .prefilled = cached};
    }
}

/* Drops the KV of the most recently admitted request and queues it again (front). */
static void preempt(replay_t *R, int err, double t)
{
    running_t e = R->run[--R->n_run];
    pat_seq_close(R->conn, e.seq);
    if (R->n_run == 0) { /* alone and still no room: it cannot run at all */
        finish(R, e.rec, err, t);
        return;
    }
    R->rep.rec[e.rec].preempted++;
    R->rep.preemptions++;
    R->hold_admit = 1;
    queue_push(R, e.rec, 1);
}

static void poll_status(replay_t *R)
{
    pat_status_t st = {.size = sizeof(st)};
    if (pat_status(R->sock, 2000, &st) == 0) {
        R->blocks_used = st.blocks_used;
        if (st.blocks_used > R->rep.kv_blocks_peak)
            R->rep.kv_blocks_peak = st.blocks_used;
        if (st.blocks_total > 0)
            R->rep.kv_blocks_total = st.blocks_total;
    }
}

static void progress(replay_t *R, double t, int final)
{
    pl_report_t *rep = &R->rep;
    uint32_t done = 0, failed = 0, prefill = 0;
    uint64_t prompt = 0, cached = 0;
    for (uint32_t k = 0; k < rep->n_rec; k++) {
        const pl_rec_t *q = &rep->rec[k];
        done += q->t_done >= 0;
        failed += q->err != 0;
        if (q->t_admit >= 0) {
            prompt += q->in_len;
            cached += q->cached;
        }
    }
    for (uint32_t k = 0; k < R->n_run; k++)
        prefill += R->run[k].prefilled < R->run[k].target;
    char total[32];
    if (O.loop)
        snprintf(total, sizeof(total), "pass %u", R->pass + 1);
    else
        snprintf(total, sizeof(total), "%u", R->t->n);
    fprintf(stderr,
            "%s[%7.1f s] done %u/%s %.1f req/s | running %u (prefill %u) queued %u | "
            "batch %u seq %u tok | KV %lld/%lld blocks | prefix hit %.1f%% | preempt %llu | "
            "failed %u%s",
            R->tty ? "\r" : "", t, done, total, t > 0 ? done / t : 0, R->n_run, prefill, R->q_len,
            R->last_seqs, R->last_tokens, (long long)R->blocks_used,
            (long long)rep->kv_blocks_total, prompt ? 100.0 * cached / prompt : 0,
            (unsigned long long)rep->preemptions, failed, R->tty && !final ? "\033[K" : "\n");
    fflush(stderr);
}

/* One step: every decoding sequence plus prefill chunks up to the batch budget. */
static void step(replay_t *R)
{
    const pl_trace_t *tr = R->t;
    uint32_t n = 0, T = 0, prefill_T = 0;
    for (uint32_t k = 0; k < R->n_run; k++) {
        running_t *e = &R->run[k];
        R->slot[k] = -1;
        if (e->prefilled < e->target)
            continue;
        pl_rec_t *q = &R->rep.rec[e->rec];
        R->slot[k] = (int32_t)n;
        R->seqs[n] = e->seq;
        R->n_new[n++] = 1;
        R->toks[T++] = pl_req_token(tr, &R->shape, q->trace_idx, q->in_len + q->generated - 1);
    }
    for (uint32_t k = 0; k < R->n_run && T < R->batch; k++) {
        running_t *e = &R->run[k];
        if (e->prefilled >= e->target)
            continue;
        uint32_t c = e->target - e->prefilled;
        c = c < O.chunk ? c : O.chunk;
        c = c < R->batch - T ? c : R->batch - T;
        uint32_t i = R->rep.rec[e->rec].trace_idx;
        R->slot[k] = (int32_t)n;
        R->seqs[n] = e->seq;
        R->n_new[n++] = c;
        for (uint32_t p = 0; p < c; p++)
            R->toks[T++] = pl_req_token(tr, &R->shape, i, e->prefilled + p);
        prefill_T += c;
    }
    if (n == 0)
        return;

    double t_begin = now_s() - R->t0;
    int rc = pat_step_begin(R->conn, R->seqs, R->n_new, n, R->toks);
    if (rc < 0) {
        fprintf(stderr, "patload: pat_step_begin: %s (%s)\n", pat_strerror(rc),
                pat_last_error(R->conn));
        R->fatal = rc;
        return;
    }
    int crc = pl_compute_step(R->pc, T);
    pat_step_info_t info;
    int erc = pat_step_end(R->conn, crc < 0, &info);
    rc = erc < 0 ? erc : crc;
    double t_end = now_s() - R->t0;
    if (rc == -ENOSPC || rc == -EDQUOT) {
        pl_report_count_err(R->rep.step_errs, &R->rep.n_step_errs, rc);
        preempt(R, rc, t_end);
        return;
    }
    if (rc < 0) {
        fprintf(stderr, "patload: step of %u sequences / %u tokens failed: %s (%s)\n", n, T,
                pat_strerror(rc), pat_last_error(R->conn));
        R->fatal = rc;
        return;
    }

    pl_report_t *rep = &R->rep;
    R->last_seqs = n;
    R->last_tokens = T;
    rep->steps++;
    rep->step_tokens += T;
    rep->prefill_tokens += prefill_T;
    rep->kv_bytes += info.kv_bytes * rep->n_layers;
    rep->qc_bytes += info.qc_bytes * rep->n_layers;
    if (prefill_T == 0) {
        rep->decode_steps++;
        rep->decode_kv_bytes += info.kv_bytes * rep->n_layers;
        rep->decode_qc_bytes += info.qc_bytes * rep->n_layers;
    }
    rep->pack_reused += info.pack_reused != 0;
    rep->step_wall_ms_sum += (t_end - t_begin) * 1e3;
    rep->daemon_ms_sum += info.step_ns / 1e6;
    if (R->steps_f) {
        pl_step_rec_t s = {.t_s = t_begin,
                           .seqs = n,
                           .tokens = T,
                           .prefill_tokens = prefill_T,
                           .running = R->n_run,
                           .queued = R->q_len,
                           .wall_ms = (t_end - t_begin) * 1e3,
                           .daemon_ms = info.step_ns / 1e6,
                           .kv_bytes = info.kv_bytes * rep->n_layers,
                           .qc_bytes = info.qc_bytes * rep->n_layers,
                           .pack_reused = info.pack_reused,
                           .kv_blocks_used = R->blocks_used};
        pl_step_csv_row(R->steps_f, &s);
    }

    /* advance: the k-th sequence of the step got n_new[k] tokens */
    uint32_t keep = 0;
    for (uint32_t k = 0; k < R->n_run; k++) {
        running_t *e = &R->run[k];
        pl_rec_t *q = &rep->rec[e->rec];
        int32_t j = R->slot[k];
        if (j >= 0) {
            if (e->prefilled < e->target) {
                e->prefilled += R->n_new[j];
                if (e->prefilled == e->target) /* prefill done: a token comes out */
                    pl_rec_token(q, t_end);
            } else {
                e->prefilled++;
                e->target++;
                pl_rec_token(q, t_end);
            }
        }
        if (q->generated >= q->out_len) {
            pat_seq_close(R->conn, e->seq);
            finish(R, e->rec, 0, t_end);
            continue;
        }
        R->run[keep++] = *e;
    }
    R->n_run = keep;
}

static void shape_report(replay_t *R, const char *trace_path)
{
    const char *slash = strrchr(trace_path, '/');
    R->rep.trace = slash ? slash + 1 : trace_path;
    R->rep.format = pl_format_name(R->t->format);
    R->rep.trace_requests = R->t->n;
    R->rep.speed = O.speed;
    R->rep.scale = O.scale;
    R->rep.chunk = O.chunk;
    R->rep.block_tokens = pl_block_tokens(R->t, &R->shape);
}

/* ---------------------------------------------------------------- modes and arrivals */

/* Options that fit together, checked before anything is read. 0, or -1 with the message
 * printed. */
static int check_modes(const char *trace_path)
{
    static const char *const report_ok[] = {"report-from", "json", "goodput", "percentiles",
                                            "quiet"};
    if (O.report_from) {
        if (trace_path || O.gsp) {
            fprintf(stderr, "patload: --report-from reads a saved run: no TRACE, no --gsp\n");
            return -1;
        }
        for (size_t k = 0; k < N_OPTS; k++) {
            int ok = 0;
            for (size_t j = 0; j < sizeof(report_ok) / sizeof(report_ok[0]); j++)
                ok |= !strcmp(OPTS[k].name, report_ok[j]);
            if (GIVEN[k] && !ok) {
                fprintf(stderr, "patload: --%s does not apply to --report-from\n", OPTS[k].name);
                return -1;
            }
        }
        return 0;
    }
    if (O.gsp && trace_path) {
        fprintf(stderr, "patload: --gsp generates the requests: no TRACE ('%s')\n", trace_path);
        return -1;
    }
    for (size_t k = 0; k < N_OPTS; k++)
        if (GIVEN[k] && !strncmp(OPTS[k].name, "gsp-", 4) && !O.gsp) {
            fprintf(stderr, "patload: --%s needs --gsp\n", OPTS[k].name);
            return -1;
        }
    if (O.gsp && (given("shared-prefix") || given("trace-block"))) {
        fprintf(stderr, "patload: --shared-prefix and --trace-block are for trace files, not "
                        "--gsp (whose groups share their system prompts)\n");
        return -1;
    }
    if (given("burstiness") && !given("request-rate")) {
        fprintf(stderr, "patload: --burstiness shapes the gaps of --request-rate: give both\n");
        return -1;
    }
    if (given("request-rate") && (given("speed") || O.spread)) {
        fprintf(stderr, "patload: --request-rate replaces the trace's times: --speed and "
                        "--spread do not apply\n");
        return -1;
    }
    if (O.save_detailed && !O.json) {
        fprintf(stderr, "patload: --save-detailed adds to the --json summary: give --json\n");
        return -1;
    }
    return 0;
}

/* The replay's arrival times (seconds from a pass's start, before --speed) of the n requests. */
static void compute_arrivals(const pl_trace_t *trace, double *t_adj)
{
    uint32_t n = trace->n;
    if (given("request-rate")) {
        pl_arrivals(t_adj, n, O.rate, O.burstiness, O.seed);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        t_adj[i] = trace->req[i].t_s;
    if (O.spread)
        for (uint32_t i = 0; i < n;) {
            uint32_t j = i;
            while (j < n && trace->req[j].t_s == trace->req[i].t_s)
                j++;
            if (j < n)
                for (uint32_t k = i; k < j; k++)
                    t_adj[k] = trace->req[i].t_s +
                               (trace->req[j].t_s - trace->req[i].t_s) * (k - i) / (j - i);
            i = j;
        }
}

static void arrivals_desc(char *buf, size_t len)
{
    if (!given("request-rate")) {
        if (O.gsp)
            snprintf(buf, len, "all at once");
        else if (O.speed > 0)
            snprintf(buf, len, "%gx recorded%s", O.speed, O.spread ? ", spread" : "");
        else
            snprintf(buf, len, "as fast as possible");
    } else if (isinf(O.rate)) {
        snprintf(buf, len, "all at once");
    } else if (isinf(O.burstiness)) {
        snprintf(buf, len, "%g req/s, evenly spaced", O.rate);
    } else if (O.burstiness == 1) {
        snprintf(buf, len, "%g req/s, Poisson", O.rate);
    } else {
        snprintf(buf, len, "%g req/s, gamma gaps of burstiness %g", O.rate, O.burstiness);
    }
}

static int dry_run(const pl_trace_t *t, const pl_shape_t *s, const double *t_adj)
{
    uint64_t in = 0, out = 0, raw_in = 0, raw_out = 0;
    uint32_t most = 0, sessions = 0, groups = 0, max_group = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->req[i].group >= 0 && (uint32_t)t->req[i].group >= max_group)
            max_group = (uint32_t)t->req[i].group + 1;
    uint8_t *seen = pat_xcalloc(max_group + 1, 1); /* groups with a request selected */
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t L = pl_req_input(t, s, i), Ol = pl_req_output(t, s, i);
        in += L;
        out += Ol;
        raw_in += t->req[i].in_len;
        raw_out += t->req[i].out_len;
        most = L + Ol > most ? L + Ol : most;
        sessions += t->req[i].session >= 0 && t->req[i].prev < 0;
        if (t->req[i].group >= 0 && !seen[t->req[i].group]) {
            seen[t->req[i].group] = 1;
            groups++;
        }
    }
    free(seen);
    char arr[96];
    arrivals_desc(arr, sizeof(arr));
    double last = O.speed > 0 ? t_adj[t->n - 1] / O.speed : 0;
    printf("format %s\nrequests %u\ndropped_rows %u\nblock %u\nhas_hash %d\nsessions %u\n"
           "groups %u\nspan_s %.3f\narrivals %s\nlast_arrival_s %.6f\n"
           "trace_input_tokens %llu\ntrace_output_tokens %llu\n"
           "input_tokens %llu\noutput_tokens %llu\nlongest_sequence %u\n",
           pl_format_name(t->format), t->n, t->dropped, t->block, t->has_hash, sessions, groups,
           t->req[t->n - 1].t_s, arr, last, (unsigned long long)raw_in, (unsigned long long)raw_out,
           (unsigned long long)in, (unsigned long long)out, most);
    return 0;
}

/* --dump: one JSON object per request as the first pass replays it. 0 or a negative errno. */
static int write_dump(const char *path, const pl_trace_t *t, const pl_shape_t *s,
                      const double *t_adj)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    for (uint32_t i = 0; i < t->n; i++) {
        const pl_req_t *r = &t->req[i];
        uint32_t L = pl_req_input(t, s, i);
        fprintf(f,
                "{\"timestamp\": %.6f, \"input_length\": %u, \"output_length\": %u, "
                "\"line\": %u",
                (O.speed > 0 ? t_adj[i] / O.speed : 0) * 1e3, L, pl_req_output(t, s, i), r->line);
        if (r->session >= 0)
            fprintf(f, ", \"session_id\": %lld, \"turn\": %u", (long long)r->session, r->turn);
        if (r->group >= 0)
            fprintf(f, ", \"group\": %d, \"prefix_length\": %u", r->group, pl_req_prefix(t, s, i));
        fprintf(f, ", \"tokens\": [");
        for (uint32_t p = 0; p < L; p++)
            fprintf(f, p ? ", %u" : "%u", pl_req_token(t, s, i, p));
        fprintf(f, "]}\n");
    }
    return fclose(f) == 0 ? 0 : -EIO;
}

/* --report-from: the serving figures of a saved run. Exit status. */
static int report_from(const char *path)
{
    char why[512];
    pl_saved_t sv;
    if (pl_saved_load(&sv, path, why, sizeof(why)) < 0) {
        fprintf(stderr, "patload: --report-from %s\n", why);
        return EXIT_USAGE;
    }
    pl_metrics_t m;
    pl_metrics_compute(sv.req, sv.n, sv.duration_s, &M, &m);
    const char *slash = strrchr(path, '/');
    printf("\npatload report from %s (%u requests)\n\n", slash ? slash + 1 : path, sv.n);
    pl_metrics_print(&m, &M, -1, stdout);
    int rc = m.failed ? EXIT_FAILED : 0; /* as a replay with failed requests exits */
    if (O.json) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "report_from", json_object_new_string(path));
        /* the run's set-up, as it recorded it */
        static const char *const keep[] = {"date", "num_prompts", "request_rate", "burstiness",
                                           "max_concurrency"};
        for (size_t k = 0; k < sizeof(keep) / sizeof(keep[0]); k++) {
            json_object *v;
            if (json_object_object_get_ex(sv.root, keep[k], &v))
                json_object_object_add(o, keep[k], json_object_get(v));
        }
        pl_metrics_json(&m, &M, o);
        if (json_object_to_file_ext(
                O.json, o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE) != 0) {
            fprintf(stderr, "patload: writing %s failed\n", O.json);
            rc = EXIT_FAILED;
        }
        json_object_put(o);
    }
    pl_saved_done(&sv);
    return rc;
}

int main(int argc, char **argv)
{
    const char *trace_path = NULL;
    pl_metrics_cfg_init(&M);
    if (parse_args(argc, argv, &trace_path) < 0)
        return EXIT_USAGE;
    if (O.help) {
        usage(stdout);
        return 0;
    }
    if (O.version) {
        printf("patload %d.%d.%d (wire protocol %u)\n", PAT_VERSION_MAJOR, PAT_VERSION_MINOR,
               PAT_VERSION_PATCH, (unsigned)IPC_VERSION);
        return 0;
    }
    if (O.replot) {
        char w[512];
        if (!O.plot || !O.csv || !O.steps_csv) {
            fprintf(stderr, "patload: --replot needs --plot, --csv and --steps-csv\n");
            return EXIT_USAGE;
        }
        const char *tn = trace_path ? trace_path : O.csv;
        const char *sl = strrchr(tn, '/');
        char title[256];
        snprintf(title, sizeof(title), "patload: %s", sl ? sl + 1 : tn);
        if (pl_report_plot(O.plot, O.csv, O.steps_csv, title, 0, w, sizeof(w)) < 0) {
            fprintf(stderr, "patload: plot: %s\n", w);
            return EXIT_FAILED;
        }
        return 0;
    }
    if (check_modes(trace_path) < 0)
        return EXIT_USAGE;
    if (O.report_from)
        return report_from(O.report_from);
    if (!trace_path && !O.gsp) {
        fprintf(stderr, "patload: no trace given\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    pl_compute_kind_t kind;
    int kind_auto = !strcmp(O.compute, "auto");
    if (kind_auto || !strcmp(O.compute, "cpu"))
        kind = PL_COMPUTE_CPU;
    else if (!strcmp(O.compute, "gpu"))
        kind = PL_COMPUTE_GPU;
    else if (!strcmp(O.compute, "none"))
        kind = PL_COMPUTE_NONE;
    else {
        fprintf(stderr, "patload: --compute %s: expected auto, cpu, gpu or none\n", O.compute);
        return EXIT_USAGE;
    }
    if (O.loop && O.duration <= 0)
        fprintf(stderr, "patload: --loop without --duration runs until interrupted\n");

    char why[512];
    pl_trace_t trace;
    int rc =
        O.gsp ? pl_gsp_make(&trace, &O.g, O.seed, O.skip, O.limit, why, sizeof(why))
              : pl_trace_load(&trace, trace_path, O.skip, O.limit, O.trace_block, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "patload: %s\n", why);
        return EXIT_USAGE;
    }
    if (O.gsp)
        trace_path = "gsp";
    replay_t R_ = {.t = &trace, .blocks_used = -1}, *R = &R_;
    R->shape = (pl_shape_t){.scale = O.scale,
                            .max_input = O.max_input,
                            .max_output = O.max_output,
                            .shared_prefix = O.shared_prefix,
                            .salt = O.seed};
    R->t_adj = pat_xmalloc((size_t)trace.n * sizeof(double));
    compute_arrivals(&trace, R->t_adj);
    if (O.dump && (rc = write_dump(O.dump, &trace, &R->shape, R->t_adj)) < 0) {
        fprintf(stderr, "patload: --dump %s: %s\n", O.dump, strerror(-rc));
        free(R->t_adj);
        pl_trace_done(&trace);
        return EXIT_USAGE;
    }
    if (O.dry_run) {
        rc = dry_run(&trace, &R->shape, R->t_adj);
        free(R->t_adj);
        pl_trace_done(&trace);
        return rc;
    }

    /* the daemon: its model, backend and limits */
    R->sock = O.socket ? O.socket : pat_default_socket();
    pat_status_t st = {.size = sizeof(st)};
    rc = pat_status(R->sock, O.timeout_ms, &st);
    if (rc < 0) {
        fprintf(stderr, "patload: no patd at %s: %s%s\n", R->sock, pat_strerror(rc),
                rc == -EOPNOTSUPP ? " (a daemon older than 1.2: no typed status)" : "");
        free(R->t_adj);
        pl_trace_done(&trace);
        return EXIT_DAEMON;
    }
    pat_model_t model = st.model;
    static const char *const kv_names[] = {"?", "f16", "bf16", "f32", "fp8_e4m3", "fp8_e5m2"};
    uint32_t kv_want = 0;
    if (O.kv_dtype) {
        if (st.version < (1u << 16 | 11u << 8)) {
            fprintf(stderr,
                    "patload: --kv-dtype: the daemon at %s is %u.%u.%u; asking for a KV pool "
                    "needs 1.11 or newer\n",
                    R->sock, st.version >> 16, (st.version >> 8) & 0xff, st.version & 0xff);
            free(R->t_adj);
            pl_trace_done(&trace);
            return EXIT_DAEMON;
        }
        for (uint32_t i = 1; i < 6; i++)
            if (!strcmp(O.kv_dtype, kv_names[i]))
                kv_want = i;
        if (!kv_want) {
            fprintf(stderr,
                    "patload: --kv-dtype %s: not one of f16, bf16, f32, fp8_e4m3, "
                    "fp8_e5m2\n",
                    O.kv_dtype);
            free(R->t_adj);
            pl_trace_done(&trace);
            return EXIT_USAGE;
        }
    }
    /* what the daemon's pool holds (an older daemon's: model.dtype) */
    const uint32_t kv_code = st.kv_dtype ? st.kv_dtype : model.dtype;
    char kv_pool[48];
    if (kv_code == PAT_FP8_E4M3 || kv_code == PAT_FP8_E5M2)
        snprintf(kv_pool, sizeof(kv_pool), "%s x %g", kv_names[kv_code], (double)st.kv_scale);
    else
        snprintf(kv_pool, sizeof(kv_pool), "%s", kv_code < 6 ? kv_names[kv_code] : "?");
    char backend[32];
    snprintf(backend, sizeof(backend), "%s", st.backend);
    int64_t blocks_total = st.blocks_total;
    R->max_seq_len = st.max_seq_len ? st.max_seq_len : UINT32_MAX;

    pat_connect_opts_t co = {.size = sizeof(co),
                             .max_batch_tokens = O.batch,
                             .max_seqs = O.concurrency,
                             .timeout_ms = O.timeout_ms,
                             .socket = R->sock,
                             .label = O.label,
                             .model = model,
                             .kv_dtype = kv_want};
    rc = pat_connect(&co, &R->conn, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "patload: connecting to %s: %s (%s)\n", R->sock, pat_strerror(rc), why);
        free(R->t_adj);
        pl_trace_done(&trace);
        return rc == -EINVAL || rc == -EDQUOT ? EXIT_USAGE : EXIT_DAEMON;
    }
    pat_buffers(R->conn, &R->buf);
    if (kind_auto && R->buf.on_gpu)
        kind = PL_COMPUTE_GPU;
    R->batch = R->buf.max_batch_tokens;
    R->block = model.block_size ? model.block_size : 16;
    R->cap_blocks = blocks_total > 0 ? (uint64_t)blocks_total : UINT32_MAX;
    if (R->buf.max_blocks && R->buf.max_blocks < R->cap_blocks)
        R->cap_blocks = R->buf.max_blocks;
    R->conc = O.concurrency;
    if (R->buf.max_seqs && R->conc > R->buf.max_seqs)
        R->conc = R->buf.max_seqs;
    if (R->conc > R->batch)
        R->conc = R->batch; /* every running request decodes in every step */

    pl_compute_cfg_t cc = {.kind = kind,
                           .n_layers = model.n_layers,
                           .q_heads = model.q_heads,
                           .kv_heads = model.kv_heads,
                           .head_dim = model.head_dim,
                           .dtype = model.dtype,
                           .hidden = O.hidden ? O.hidden : model.q_heads * model.head_dim,
                           .max_tokens = R->batch,
                           .layer_us = O.layer_us,
                           .tflops = O.tflops};
    cc.ffn = O.ffn ? O.ffn : (uint32_t)((cc.hidden * 8 / 3 + 255) / 256 * 256);
    rc = pl_compute_create(&cc, R->conn, &R->pc, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "patload: %s\n", why);
        pat_close(R->conn);
        free(R->t_adj);
        pl_trace_done(&trace);
        return EXIT_USAGE;
    }

    /* outputs named up front so that a bad path fails before the replay, not after */
    char req_csv[1024], steps_csv[1024];
    const char *req_csv_path = O.csv, *steps_csv_path = O.steps_csv;
    if (O.plot && !req_csv_path) {
        snprintf(req_csv, sizeof(req_csv), "%s.requests.csv", O.plot);
        req_csv_path = req_csv;
    }
    if (O.plot && !steps_csv_path) {
        snprintf(steps_csv, sizeof(steps_csv), "%s.steps.csv", O.plot);
        steps_csv_path = steps_csv;
    }
    if (steps_csv_path) {
        if (!(R->steps_f = fopen(steps_csv_path, "w"))) {
            fprintf(stderr, "patload: %s: %s\n", steps_csv_path, strerror(errno));
            rc = -errno;
            goto out;
        }
        pl_step_csv_header(R->steps_f);
    }

    shape_report(R, trace_path);
    char arrivals_words[96];
    arrivals_desc(arrivals_words, sizeof(arrivals_words));
    R->rep.arrivals = arrivals_words;
    /* vLLM's set-up fields where arrivals are synthetic: --gsp without --request-rate is all at
     * once, vLLM's default (inf, burstiness 1); a trace's own times have none (null) */
    int synthetic = given("request-rate") || O.gsp;
    R->rep.request_rate = synthetic ? O.rate : NAN;
    R->rep.burstiness = synthetic ? O.burstiness : NAN;
    R->rep.metrics = M;
    R->rep.save_detailed = O.save_detailed;
    R->rep.trace_dropped = trace.dropped;
    R->rep.backend = backend;
    R->rep.kv_pool = kv_pool;
    R->rep.compute = pl_compute_name(kind);
    R->rep.device = pl_compute_device(R->pc);
    R->rep.concurrency = R->conc;
    R->rep.max_batch_tokens = R->batch;
    R->rep.n_layers = model.n_layers;
    R->rep.q_heads = model.q_heads;
    R->rep.kv_heads = model.kv_heads;
    R->rep.head_dim = model.head_dim;

    uint32_t n = trace.n;
    R->state = pat_xmalloc(n);
    R->slot = pat_xmalloc((size_t)R->conc * sizeof(int32_t));
    R->run = pat_xmalloc((size_t)R->conc * sizeof(running_t));
    R->seqs = pat_xmalloc((size_t)R->conc * sizeof(uint32_t));
    R->n_new = pat_xmalloc((size_t)R->conc * sizeof(uint32_t));
    R->toks = pat_xmalloc((size_t)R->batch * sizeof(uint32_t));
    memset(R->state, 0, n);

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    R->tty = isatty(STDERR_FILENO);
    R->progress_every = O.quiet ? 0 : O.progress >= 0 ? O.progress : R->tty ? 0.5 : 10;
    if (!O.quiet)
        fprintf(stderr,
                "patload: %u requests from %s (%s, %u-token blocks -> %u) against %s (%s "
                "backend), compute %s%s%s\n",
                n, R->rep.trace, R->rep.format, trace.block, R->rep.block_tokens, R->sock, backend,
                R->rep.compute, R->rep.device[0] ? " on " : "", R->rep.device);

    R->t0 = now_s();
    R->pass = 0;
    R->pass_t0 = 0;
    poll_status(R);
    for (;;) {
        double t = now_s() - R->t0;
        if (g_stop) {
            R->rep.interrupted = 1;
            break;
        }
        if (R->fatal)
            break;
        arrivals(R, t);
        if (R->next_i == n && R->n_run == 0 && R->q_len == 0 && R->deferred == 0) {
            R->rep.passes = R->pass + 1;
            if (!O.loop || (O.duration > 0 && t >= O.duration))
                break;
            R->pass++;
            R->shape.salt = O.seed + R->pass * 0x9e3779b9ull;
            R->pass_t0 = t;
            R->next_i = 0;
            memset(R->state, 0, n);
            continue;
        }
        if (O.duration > 0 && t >= O.duration && R->n_run == 0)
            break; /* duration over and nothing in flight: what is queued is not started */
        if (!(O.duration > 0 && t >= O.duration))
            admit(R, t);
        if (R->fatal)
            break;
        if (R->n_run) {
            step(R);
        } else {
            double next = R->next_i < n ? arrival(R, R->next_i) - t : 0.05;
            if (next > 0.05)
                next = 0.05;
            if (next > 0)
                nanosleep(&(struct timespec){0, (long)(next * 1e9)}, NULL);
        }
        t = now_s() - R->t0;
        if (t >= R->next_poll) {
            poll_status(R);
            R->next_poll = t + 0.5;
        }
        if (R->progress_every > 0 && t >= R->next_progress) {
            progress(R, t, 0);
            R->next_progress = t + R->progress_every;
        }
    }
    R->rep.wall_s = now_s() - R->t0;
    if (R->rep.passes == 0)
        R->rep.passes = R->pass + 1;
    if (R->progress_every > 0)
        progress(R, R->rep.wall_s, 1);

    /* what never finished: running / queued ones end as failed with why (interrupted: ECANCELED,
     * a lost daemon: its code); ones never admitted are counted as not started */
    int end_err = R->fatal ? R->fatal : -ECANCELED;
    for (uint32_t k = 0; k < R->n_run; k++)
        R->rep.rec[R->run[k].rec].err = end_err;
    while (R->q_len) {
        uint32_t rec = queue_pop(R);
        if (R->rep.rec[rec].t_admit >= 0 || R->fatal)
            R->rep.rec[rec].err = end_err;
        else
            R->rep.not_started++;
    }
    /* drop never-admitted records from the table (not started), keep the rest */
    uint32_t keep = 0;
    for (uint32_t k = 0; k < R->rep.n_rec; k++) {
        pl_rec_t *q = &R->rep.rec[k];
        if (q->t_admit < 0 && q->err == 0 && q->t_done < 0)
            continue;
        R->rep.rec[keep++] = *q;
    }
    R->rep.n_rec = keep;
    if (!O.loop)
        R->rep.not_started += (n - R->next_i) + R->deferred;

    if (R->rep.kv_blocks_total <= 0)
        poll_status(R);
    pl_report_print(&R->rep, stdout);
    rc = 0;
    if (O.json && pl_report_json(&R->rep, O.json) < 0) {
        fprintf(stderr, "patload: writing %s failed\n", O.json);
        rc = -EIO;
    }
    if (req_csv_path && (rc = pl_report_csv(&R->rep, req_csv_path)) < 0)
        fprintf(stderr, "patload: writing %s: %s\n", req_csv_path, strerror(-rc));
    if (R->steps_f) {
        if (fclose(R->steps_f) != 0) {
            fprintf(stderr, "patload: writing %s failed\n", steps_csv_path);
            rc = -EIO;
        }
        R->steps_f = NULL;
    }
    if (O.plot && rc == 0) {
        char title[256];
        snprintf(title, sizeof(title), "patload: %s against patd (%s backend), compute %s",
                 R->rep.trace, backend, R->rep.compute);
        if ((rc = pl_report_plot(O.plot, req_csv_path, steps_csv_path, title, R->rep.wall_s, why,
                                 sizeof(why))) < 0)
            fprintf(stderr, "patload: plot: %s\n", why);
        else if (!O.quiet)
            fprintf(stderr, "patload: plot written to %s\n", O.plot);
    }
out:;
    int failed = 0;
    for (uint32_t k = 0; k < R->rep.n_rec; k++)
        failed += R->rep.rec[k].err != 0;
    int fatal = R->fatal;
    if (R->steps_f)
        fclose(R->steps_f);
    pl_compute_free(R->pc);
    pat_close(R->conn);
    free(R->t_adj);
    free(R->state);
    free(R->slot);
    free(R->run);
    free(R->seqs);
    free(R->n_new);
    free(R->toks);
    free(R->prompt);
    free(R->queue);
    pl_report_done(&R->rep);
    pl_trace_done(&trace);
    if (fatal && is_fatal(fatal))
        return EXIT_DAEMON;
    return rc < 0 || failed || R->rep.interrupted ? EXIT_FAILED : 0;
}
