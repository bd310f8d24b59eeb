/*
 * fuzz_sockets.c — the transport-level fuzzer: hostile bytes to every socket of a LIVE patd, the
 * control socket (<name>.sock), the event socket (.events), the admin socket (.admin) and the
 * metrics port (HTTP), one connection per input (fz_wire.h says what an input chooses: a prefix,
 * descriptors attached, how the connection ends). It holds patd to "one client cannot hurt
 * another": after any input the daemon is alive, it keeps no descriptor a client sent, it still
 * answers (a session opened before the fuzzing, a new one, STATUS) within a time bound, and it
 * does not spin when nobody talks to it. The frame decoder has its own fuzzer (fuzz_frame.c);
 * this one is for what sits under it, the transport, and for the daemon as a whole.
 *
 * How it runs, per socket: a fresh patd (PATD_BIN, cpu backend, a private runtime directory, a
 * free metrics port, killed on any exit of the fuzzer), a standing session, then batches of
 * inputs. Each batch is a child process (or --jobs of them): a seed, or up to five mutations of a
 * corpus entry; an input whose outcome signature is new joins the corpus (feedback from what the
 * daemon answers, since its coverage is out of reach in another process). A child exits at the
 * end of its batch, so sessions its inputs opened (HELLOs on the admin socket) end with it, as a
 * client's do: between batches nothing but the standing session is open, and the daemon's
 * descriptor count must be back within --fd-slack of what it was at start. After every input the
 * child polls the daemon's pidfd; a death stops the batch, the last inputs are replayed one by one
 * on a fresh daemon to find the one that kills it, and that input is printed in hex and saved.
 *
 * Reproducible: --seed fixes the inputs a batch makes from a corpus; with --no-feedback the corpus
 * never grows, and the whole sequence depends on the seed alone. A saved input replays with
 * --replay FILE. Tuned for a 2-core CI machine: ~1 ms per input where the daemon answers or
 * closes at once, --wait-ms where it keeps a connection open. Thread context: single-threaded
 * (libpat's connections add their own threads; children fork from the main thread only).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fz_live.h"
#include "fz_mutate.h"
#include "fz_wire.h"
#include "pat.h"
#include "tl_daemon.h"
#include "tl_rng.h"

#define FZ_RING     16 /* inputs a child keeps for the replay after a death */
#define FZ_MAX_JOBS 16
#define FZ_LOG_MAX  (64ull << 20) /* bytes of patd's log kept during a run */

/* ------------------------------------------------------------------ options */
typedef struct opts {
    char *targets;    /* comma-separated names of fz_targets[] */
    uint64_t inputs;  /* per target; 0: no limit */
    uint64_t seconds; /* per target; 0: no limit */
    uint64_t seed;
    char *corpus; /* directory of seed files, or NULL */
    char *crash_dir;
    uint64_t max_len; /* bytes of one input */
    uint64_t wait_ms, send_ms, connect_ms;
    uint64_t jobs;
    uint64_t batch_ms;      /* one batch: the checks run between batches */
    fz_live_opts_t live;    /* answer_ms, fd_slack, idle_cpu_pct, daemon arguments */
    uint64_t idle_check_ms; /* period of the idle CPU check */
    uint64_t max_deaths;    /* per target, then the target stops */
    uint64_t corpus_max;
    uint64_t no_feedback;
    char *replay;
    uint64_t repeat;
    char *write_seeds;
    uint64_t help;
} opts_t;

typedef enum { O_U64, O_STR, O_FLAG, O_MULTI } opt_kind_t;
static const struct {
    const char *name;
    opt_kind_t kind;
    size_t off;
    const char *dflt;
    const char *help;
} cli[] = {
#define F(x) offsetof(opts_t, x)
    {"target", O_STR, F(targets), "sock,events,admin,metrics", "sockets to fuzz, in order"},
    {"inputs", O_U64, F(inputs), "0", "inputs per socket (0: no limit; -runs=N is the same)"},
    {"seconds", O_U64, F(seconds), "20", "seconds per socket (0: no limit)"},
    {"seed", O_U64, F(seed), NULL, "random seed (default: from the clock, printed)"},
    {"corpus", O_STR, F(corpus), NULL, "directory of seeds <socket>-*.raw (wire bytes), *.in"},
    {"crash-dir", O_STR, F(crash_dir), ".", "where inputs that kill the daemon are saved"},
    {"max-len", O_U64, F(max_len), "4096", "bytes of one input at most (<= 65536)"},
    {"wait-ms", O_U64, F(wait_ms), "5", "how long an input waits for the reply or the close"},
    {"send-ms", O_U64, F(send_ms), "50", "how long the sends of one input may block"},
    {"connect-ms", O_U64, F(connect_ms), "200", "how long a connect may wait (full backlog)"},
    {"jobs", O_U64, F(jobs), "1", "child processes sending at once (1..16)"},
    {"batch-ms", O_U64, F(batch_ms), "1000", "one batch; fds and liveness are checked after it"},
    {"fd-slack", O_U64, F(live.fd_slack), "16", "fds the daemon may hold above its start's count"},
    {"answer-ms", O_U64, F(live.answer_ms), "3000", "bound on STATUS, PING and a new session"},
    {"idle-check-ms", O_U64, F(idle_check_ms), "10000", "period of the idle CPU check"},
    {"idle-cpu-pct", O_U64, F(live.idle_cpu_pct), "20", "idle CPU above this share is busy"},
    {"max-deaths", O_U64, F(max_deaths), "1", "deaths per socket before it stops"},
    {"corpus-max", O_U64, F(corpus_max), "4096", "corpus entries per socket"},
    {"no-feedback", O_FLAG, F(no_feedback), NULL, "never grow the corpus (fully seeded runs)"},
    {"replay", O_STR, F(replay), NULL, "run one saved input (.in, or .raw) against --target"},
    {"repeat", O_U64, F(repeat), "1", "with --replay: how many times"},
    {"write-seeds", O_STR, F(write_seeds), NULL, "write the built-in seeds into this directory"},
    {"daemon-arg", O_MULTI, F(live.dargs), NULL, "one more patd argument (repeatable)"},
    {"help", O_FLAG, F(help), NULL, "this text"},
#undef F
};
#define N_CLI (sizeof(cli) / sizeof(cli[0]))

static int opts_set(opts_t *o, size_t i, const char *v)
{
    void *p = (char *)o + cli[i].off;
    char *end = NULL;
    switch (cli[i].kind) {
    case O_U64:
        if (!v || !*v)
            return -EINVAL;
        *(uint64_t *)p = strtoull(v, &end, 0);
        return *end ? -EINVAL : 0;
    case O_STR:
        *(char **)p = (char *)v;
        return v ? 0 : -EINVAL;
    case O_FLAG:
        *(uint64_t *)p = 1;
        return 0;
    case O_MULTI:
        if (!v || o->live.n_dargs >= FZ_MAX_DARGS)
            return -EINVAL;
        o->live.dargs[o->live.n_dargs++] = (char *)v;
        return 0;
    }
    return -EINVAL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: fuzz_sockets [--option=value ...]  (PATD_BIN names the daemon)\n");
    for (size_t i = 0; i < N_CLI; i++)
        fprintf(f, "  --%-14s %s%s%s%s\n", cli[i].name, cli[i].help, cli[i].dflt ? " [" : "",
                cli[i].dflt ? cli[i].dflt : "", cli[i].dflt ? "]" : "");
}

static int opts_parse(opts_t *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < N_CLI; i++)
        if (cli[i].dflt)
            opts_set(o, i, cli[i].dflt);
    o->seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    for (int a = 1; a < argc; a++) {
        const char *s = argv[a];
        if (!strncmp(s, "-runs=", 6)) { /* libFuzzer's spelling */
            o->inputs = strtoull(s + 6, NULL, 0);
            continue;
        }
        if (strncmp(s, "--", 2)) {
            fprintf(stderr, "fuzz_sockets: unexpected '%s'\n", s);
            return -EINVAL;
        }
        const char *eq = strchr(s + 2, '=');
        const size_t nl = eq ? (size_t)(eq - s - 2) : strlen(s + 2);
        size_t i = 0;
        while (i < N_CLI && (strlen(cli[i].name) != nl || strncmp(cli[i].name, s + 2, nl)))
            i++;
        if (i == N_CLI) {
            fprintf(stderr, "fuzz_sockets: unknown option '%s'\n", s);
            return -EINVAL;
        }
        const char *v = eq                      ? eq + 1
                        : cli[i].kind == O_FLAG ? NULL
                        : a + 1 < argc          ? argv[++a]
                                                : NULL;
        if (opts_set(o, i, v) < 0) {
            fprintf(stderr, "fuzz_sockets: bad value for --%s\n", cli[i].name);
            return -EINVAL;
        }
    }
    if (o->max_len < 2 || o->max_len > 65536 || !o->jobs || o->jobs > FZ_MAX_JOBS || !o->batch_ms) {
        fprintf(stderr, "fuzz_sockets: --max-len 2..65536, --jobs 1..%d, --batch-ms > 0\n",
                FZ_MAX_JOBS);
        return -EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------------ time, signals */
static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    g_stop = sig;
}

/* ------------------------------------------------------------------ batches (children) */
static pid_t g_children[FZ_MAX_JOBS]; /* the exit handler kills them */
enum { MSG_NEW = 1, MSG_RING = 2, MSG_DONE = 3 };

typedef struct msg {
    uint32_t type, len; /* len: bytes of payload after this header */
    uint32_t sig;
    uint32_t child;
    uint64_t t_us; /* MSG_RING: when the input ran (orders several children's rings) */
} msg_t;

typedef struct batch_stats {
    uint64_t inputs, seeds_run;
    uint64_t conn[5]; /* fz_conn_class_t */
    uint64_t ends[4]; /* fz_end_class_t */
    uint64_t send_err, rewritten, harness_err;
    uint32_t died;
} batch_stats_t;

typedef struct batch {
    const opts_t *o;
    const fz_target_t *t;
    fz_live_t *L;
    fz_corpus_t *c;
    const fz_dict_t *dict;
    fz_wire_opts_t wo;
    uint64_t seed;       /* the run's, mixed with the target */
    uint64_t first;      /* index of the batch's first input in the target's sequence */
    uint64_t seeds_done; /* seeds already run (they run once each, first) */
    uint64_t budget;     /* inputs this batch, all children together */
    uint32_t ms;
} batch_t;

static int write_all(int fd, const void *p, size_t n)
{
    for (size_t d = 0; d < n;) {
        ssize_t k = write(fd, (const uint8_t *)p + d, n - d);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        d += (size_t)k;
    }
    return 0;
}

static void send_msg(int fd, uint32_t type, uint32_t child, uint32_t sig, uint64_t t_us,
                     const void *p, size_t n)
{
    msg_t m = {type, (uint32_t)n, sig, child, t_us};
    if (write_all(fd, &m, sizeof(m)) < 0 || write_all(fd, p, n) < 0)
        _exit(3);
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A child's batch: never returns. */
static void child_batch(const batch_t *b, uint32_t job, int wfd)
{
    tl_rng_t r;
    batch_stats_t s = {0};
    const size_t cap = b->o->max_len;
    uint8_t *ring = malloc(FZ_RING * cap), *in = malloc(cap);
    uint32_t ring_len[FZ_RING] = {0};
    uint64_t ring_t[FZ_RING] = {0}, n_ring = 0;
    if (!ring || !in)
        _exit(3);
    const uint64_t end = fz_now_ms() + b->ms;
    const uint64_t budget = b->budget / b->o->jobs + (job < b->budget % b->o->jobs);
    uint64_t seed_next = b->seeds_done + job;
    while (s.inputs < budget && fz_now_ms() < end && !g_stop) {
        size_t len;
        if (seed_next < b->c->n_seeds) {
            const fz_entry_t *e = &b->c->e[seed_next];
            len = e->len < cap ? e->len : cap;
            memcpy(in, e->data, len);
            seed_next += b->o->jobs;
            s.seeds_run++;
        } else {
            /* input i of the sequence draws from its own generator: with one job and a
             * corpus that does not grow (--no-feedback) the inputs are the seed's alone,
             * wherever batches happen to end */
            tl_rng_seed(&r,
                        b->seed + 0x9e3779b97f4a7c15ull * (b->first + s.inputs * b->o->jobs + job));
            const fz_entry_t *e = &b->c->e[tl_rng_below(&r, b->c->n)];
            len = fz_mutate(&r, b->c, b->dict, e->data, e->len, in, cap);
        }
        const uint32_t slot = (uint32_t)(n_ring++ % FZ_RING);
        memcpy(ring + slot * cap, in, len);
        ring_len[slot] = (uint32_t)len;
        ring_t[slot] = now_us();
        fz_outcome_t out;
        if (fz_wire_run(b->t, &b->L->ep, in, len, &b->wo, &out) < 0)
            s.harness_err++;
        s.inputs++;
        s.conn[out.conn]++;
        s.ends[out.end]++;
        s.send_err += out.send_err != 0;
        s.rewritten += out.rewritten;
        const uint32_t sig = fz_outcome_sig(b->t, len ? in[0] : 0, &out);
        if (!b->o->no_feedback && fz_corpus_sig_new(b->c, sig)) {
            fz_corpus_add(b->c, in, len, 0);
            send_msg(wfd, MSG_NEW, job, sig, 0, in, len);
        }
        /* the daemon's pidfd turns readable when it exits: one poll per input. A refused
         * connection means its listener is gone (a live patd never refuses: the socket file is
         * its own) while it may still be tearing down: wait for the exit, or inputs that run
         * after the death would push the one that caused it out of the ring. */
        struct pollfd pf = {b->L->pidfd, POLLIN, 0};
        if (poll(&pf, 1, out.conn == FZ_C_REFUSED ? 2000 : 0) > 0) {
            s.died = 1;
            break;
        }
    }
    /* the last inputs, oldest first: the parent replays them after a death, whoever noticed
     * it (this child, or a check after the batch) */
    for (uint64_t i = n_ring > FZ_RING ? n_ring - FZ_RING : 0; i < n_ring; i++) {
        const uint32_t slot = (uint32_t)(i % FZ_RING);
        send_msg(wfd, MSG_RING, job, 0, ring_t[slot], ring + slot * cap, ring_len[slot]);
    }
    send_msg(wfd, MSG_DONE, job, 0, 0, &s, sizeof(s));
    _exit(0);
}

typedef struct ring_entry {
    uint8_t *data;
    uint32_t len;
    uint64_t t_us;
} ring_entry_t;

typedef struct ring {
    ring_entry_t e[FZ_RING * FZ_MAX_JOBS];
    uint32_t n;
} ring_t;

static void stats_add(batch_stats_t *a, const batch_stats_t *b)
{
    a->inputs += b->inputs;
    a->seeds_run += b->seeds_run;
    for (int i = 0; i < 5; i++)
        a->conn[i] += b->conn[i];
    for (int i = 0; i < 4; i++)
        a->ends[i] += b->ends[i];
    a->send_err += b->send_err;
    a->rewritten += b->rewritten;
    a->harness_err += b->harness_err;
    a->died |= b->died;
}

/* Runs one batch in o->jobs children and folds what they report into the corpus, *s and *ring.
 * Returns 0, or a negative errno when the harness itself failed (a child did not finish). */
static int run_batch(batch_t *b, batch_stats_t *s, ring_t *ring)
{
    int rfd[FZ_MAX_JOBS];
    const uint32_t jobs = (uint32_t)b->o->jobs;
    fflush(NULL);
    for (uint32_t j = 0; j < jobs; j++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
            return -errno;
        pid_t pid = fork();
        if (pid < 0)
            return -errno;
        if (pid == 0) {
            close(p[0]);
            child_batch(b, j, p[1]);
        }
        close(p[1]);
        rfd[j] = p[0];
        g_children[j] = pid;
    }
    /* read every child's reports until all have closed their pipes; a child stuck past its
     * batch by much more than any deadline of fz_wire is a harness failure */
    const uint64_t limit = fz_now_ms() + b->ms + 10000u + 4 * b->o->live.answer_ms;
    uint32_t open_pipes = jobs;
    uint8_t *buf = malloc(sizeof(batch_stats_t) + b->o->max_len);
    int rc = 0;
    while (open_pipes && buf) {
        struct pollfd pf[FZ_MAX_JOBS];
        for (uint32_t j = 0; j < jobs; j++)
            pf[j] = (struct pollfd){rfd[j], POLLIN, 0};
        const uint64_t now = fz_now_ms();
        if (g_stop)
            for (uint32_t j = 0; j < jobs; j++)
                if (g_children[j] > 0)
                    kill(g_children[j], SIGTERM);
        if (now >= limit) {
            rc = -ETIMEDOUT;
            break;
        }
        if (poll(pf, jobs, (int)(limit - now)) < 0 && errno != EINTR)
            break;
        for (uint32_t j = 0; j < jobs; j++) {
            if (rfd[j] < 0 || !(pf[j].revents & (POLLIN | POLLHUP)))
                continue;
            msg_t m;
            ssize_t k = read(rfd[j], &m, sizeof(m));
            if (k != (ssize_t)sizeof(m) || m.len > sizeof(batch_stats_t) + b->o->max_len) {
                close(rfd[j]);
                rfd[j] = -1;
                pf[j].fd = -1;
                open_pipes--;
                continue;
            }
            size_t got = 0;
            while (got < m.len) {
                ssize_t r = read(rfd[j], buf + got, m.len - got);
                if (r <= 0)
                    break;
                got += (size_t)r;
            }
            if (got < m.len)
                continue;
            if (m.type == MSG_NEW && fz_corpus_sig_new(b->c, m.sig))
                fz_corpus_add(b->c, buf, m.len, 0);
            else if (m.type == MSG_DONE && m.len == sizeof(batch_stats_t))
                stats_add(s, (const batch_stats_t *)buf);
            else if (m.type == MSG_RING && ring->n < FZ_RING * FZ_MAX_JOBS) {
                ring_entry_t *e = &ring->e[ring->n++];
                e->data = malloc(m.len ? m.len : 1);
                if (!e->data)
                    abort();
                memcpy(e->data, buf, m.len);
                e->len = m.len;
                e->t_us = m.t_us;
            }
        }
    }
    free(buf);
    for (uint32_t j = 0; j < jobs; j++) {
        if (rfd[j] >= 0)
            close(rfd[j]);
        if (rc < 0)
            kill(g_children[j], SIGKILL);
        waitpid(g_children[j], NULL, 0);
        g_children[j] = 0;
    }
    return rc;
}

/* ------------------------------------------------------------------ deaths */
static void print_hex(FILE *f, const uint8_t *p, size_t n)
{
    const size_t shown = n < 512 ? n : 512;
    for (size_t i = 0; i < shown; i += 16) {
        fprintf(f, "  %04zx ", i);
        for (size_t j = i; j < i + 16; j++)
            j < shown ? fprintf(f, " %02x", p[j]) : fprintf(f, "   ");
        fprintf(f, "  |");
        for (size_t j = i; j < i + 16 && j < shown; j++)
            fputc(p[j] >= 0x20 && p[j] < 0x7f ? p[j] : '.', f);
        fprintf(f, "|\n");
    }
    if (shown < n)
        fprintf(f, "  ... %zu more bytes (whole input in the file)\n", n - shown);
}

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void save_input(const opts_t *o, const fz_target_t *t, const char *kind, const uint8_t *p,
                       size_t n, char *path, size_t pl)
{
    snprintf(path, pl, "%s/%s-%s-%016" PRIx64 ".in", o->crash_dir, kind, t->name, hash_bytes(p, n));
    const int rc = fz_file_write(path, p, n);
    if (rc < 0)
        fprintf(stderr, "fuzz_sockets: cannot write %s: %s\n", path, strerror(-rc));
}

static int ring_cmp(const void *a, const void *b)
{
    const ring_entry_t *x = a, *y = b;
    return x->t_us < y->t_us ? -1 : x->t_us > y->t_us;
}

/* The daemon died during a batch: say how, keep its log, replay the last inputs one by one on a
 * fresh daemon to find the one that kills it, print and save it. Leaves L running (the replay's
 * daemon, or a new one) unless starting one fails. Returns 0, or a negative errno. */
static int handle_death(fz_live_t *L, const opts_t *o, const fz_target_t *t, ring_t *ring,
                        char *why, size_t wl)
{
    int st = 0;
    if (L->d.pid > 0 && waitpid(L->d.pid, &st, 0) == L->d.pid) {
        L->exit_status = st;
        L->d.pid = 0;
    }
    char how[128], path[600];
    fz_describe_status(L->exit_status, how, sizeof(how));
    fprintf(stderr, "fuzz_sockets: %s: patd %s\n", t->name, how);
    fz_live_log_tail(L, 12);
    fz_live_stop(L);

    qsort(ring->e, ring->n, sizeof(ring->e[0]), ring_cmp);
    int rc = fz_live_start(L, &o->live);
    int culprit = -1;
    fz_wire_opts_t wo = {(uint32_t)o->connect_ms, (uint32_t)o->send_ms,
                         (uint32_t)(o->wait_ms > 20 ? o->wait_ms : 20), -1};
    int memfd = (int)memfd_create("fuzz-sockets", MFD_CLOEXEC);
    wo.fd = memfd;
    for (uint32_t i = 0; rc == 0 && i < ring->n && culprit < 0; i++) {
        fz_outcome_t out;
        fz_wire_run(t, &L->ep, ring->e[i].data, ring->e[i].len, &wo, &out);
        fz_sleep_ms(100);
        if (fz_live_dead(L))
            culprit = (int)i;
    }
    if (memfd >= 0)
        close(memfd);
    if (culprit >= 0) {
        const ring_entry_t *e = &ring->e[culprit];
        char mode[160];
        fz_mode_describe(t, e->data, e->len, mode, sizeof(mode));
        save_input(o, t, "crash", e->data, e->len, path, sizeof(path));
        fz_describe_status(L->exit_status, how, sizeof(how));
        fprintf(stderr,
                "fuzz_sockets: %s: CRASH, confirmed by replay on a fresh daemon (%s): input of "
                "%u bytes (%s):\n",
                t->name, how, e->len, mode);
        print_hex(stderr, e->data, e->len);
        fprintf(stderr, "  file: %s\n  replay: fuzz_sockets --target=%s --replay=%s\n", path,
                t->name, path);
        snprintf(why, wl, "death: patd %s; input %.480s", how, path);
        fz_live_log_tail(L, 6);
        fz_live_stop(L);
        rc = fz_live_start(L, &o->live);
    } else {
        fprintf(stderr,
                "fuzz_sockets: %s: the last %u inputs, replayed one by one, did not kill a fresh "
                "daemon; all saved:\n",
                t->name, ring->n);
        for (uint32_t i = 0; i < ring->n; i++) {
            save_input(o, t, "death-candidate", ring->e[i].data, ring->e[i].len, path,
                       sizeof(path));
            fprintf(stderr, "  %s\n", path);
        }
        snprintf(why, wl, "death: patd %s (not reproduced by one input; candidates saved)", how);
    }
    for (uint32_t i = 0; i < ring->n; i++)
        free(ring->e[i].data);
    ring->n = 0;
    return rc;
}

/* ------------------------------------------------------------------ one target */
typedef struct report {
    const fz_target_t *t;
    batch_stats_t s;
    double secs, send_secs;
    uint32_t deaths;
    int baseline_fds, max_fds, last_fds;
    uint32_t corpus, seeds;
    int idle_pct; /* the last idle window's share of a core, -1: not measured */
    int serving;  /* 1: the final STATUS, PING and new session were answered in time */
    int failed;
    char why[640];
} report_t;

typedef struct seed_add {
    fz_corpus_t *c;
} seed_add_t;

static void add_builtin_seed(void *ud, const char *name, const uint8_t *raw, size_t len,
                             uint8_t mode, uint8_t param, int hostile)
{
    /* hostile seeds are for the corpus directory (--write-seeds): a run without one must find
     * them by mutation */
    if (hostile)
        return;
    uint8_t *in = malloc(len + 2);
    if (!in)
        abort();
    in[0] = mode;
    in[1] = param;
    memcpy(in + 2, raw, len);
    fz_corpus_add(((seed_add_t *)ud)->c, in, len + 2, 1);
    free(in);
}

static void fail(report_t *r, const char *why)
{
    if (!r->failed)
        snprintf(r->why, sizeof(r->why), "%s", why);
    r->failed = 1;
}

/* After a failed check: whether the daemon is gone (its pidfd turns readable within 1 s). */
static int gone(fz_live_t *L)
{
    struct pollfd pf = {L->pidfd, POLLIN, 0};
    poll(&pf, 1, 1000);
    return fz_live_dead(L);
}

static void ring_clear(ring_t *ring)
{
    for (uint32_t i = 0; i < ring->n; i++)
        free(ring->e[i].data);
    ring->n = 0;
}

/* A death, noticed by a child, after a batch or at the end: counted, the fuzzed daemon's figures
 * kept, the last batch's inputs replayed (handle_death). Returns handle_death's. */
static int death(const opts_t *o, const fz_target_t *t, fz_live_t *L, ring_t *ring, report_t *r)
{
    char why[640] = "";
    r->max_fds = r->max_fds > L->max_fds ? r->max_fds : L->max_fds;
    r->deaths++;
    int rc = handle_death(L, o, t, ring, why, sizeof(why));
    fail(r, why);
    return rc;
}

static int fuzz_target(const opts_t *o, const fz_target_t *t, const fz_dict_t *dict, report_t *r)
{
    memset(r, 0, sizeof(*r));
    r->t = t;
    r->idle_pct = -1;
    r->last_fds = -1;
    fz_live_t L;
    char why[640] = "";
    if (fz_live_start(&L, &o->live) < 0) {
        fail(r, "patd did not start");
        return -ECHILD;
    }
    fz_corpus_t c;
    r->baseline_fds = L.baseline_fds;
    fz_corpus_init(&c, (uint32_t)o->corpus_max);
    seed_add_t sa = {&c};
    fz_seeds_builtin(t, &L.model, add_builtin_seed, &sa);
    const int loaded = o->corpus ? fz_seeds_load(&c, t, o->corpus, o->max_len) : 0;
    if (loaded < 0)
        fprintf(stderr, "fuzz_sockets: corpus %s: %s\n", o->corpus, strerror(-loaded));
    r->seeds = c.n_seeds;
    const int memfd = (int)memfd_create("fuzz-sockets", MFD_CLOEXEC);
    if (memfd >= 0 && ftruncate(memfd, 4096) < 0)
        perror("ftruncate");
    batch_t b = {
        .o = o,
        .t = t,
        .L = &L,
        .c = &c,
        .dict = dict,
        .wo = {(uint32_t)o->connect_ms, (uint32_t)o->send_ms, (uint32_t)o->wait_ms, memfd}};
    ring_t *ring = calloc(1, sizeof(*ring));
    const uint64_t t0 = fz_now_ms();
    uint64_t last_idle = t0;
    printf("fuzz-sockets: %s: patd pid %d, %d fds at start, %u seeds\n", t->name, (int)L.d.pid,
           L.baseline_fds, c.n_seeds);
    fflush(stdout);
    while (!g_stop && ring) {
        const uint64_t el = fz_now_ms() - t0;
        if ((o->seconds && el >= 1000 * o->seconds) || (o->inputs && r->s.inputs >= o->inputs))
            break;
        b.seed = o->seed ^ ((uint64_t)(t - fz_targets) << 56);
        b.first = r->s.inputs;
        b.seeds_done = r->s.seeds_run;
        b.budget = o->inputs ? o->inputs - r->s.inputs : UINT64_MAX;
        b.ms = (uint32_t)o->batch_ms;
        if (o->seconds && 1000 * o->seconds - el < b.ms)
            b.ms = (uint32_t)(1000 * o->seconds - el);
        batch_stats_t s = {0};
        const uint64_t bt = now_us();
        ring_clear(ring);
        int rc = run_batch(&b, &s, ring);
        r->send_secs += (double)(now_us() - bt) / 1e6;
        stats_add(&r->s, &s);
        if (rc < 0) {
            fail(r, "harness: a batch did not finish in time");
            break;
        }
        int dead = s.died || fz_live_dead(&L);
        if (!dead) {
            fz_live_log_trim(&L, FZ_LOG_MAX);
            rc = fz_check_fds(&L, &o->live, 2000, why, sizeof(why));
            if (rc == 0)
                rc = fz_check_serving(&L, &o->live, why, sizeof(why));
            if (rc < 0 && !(dead = gone(&L))) {
                fail(r, why);
                break;
            }
        }
        if (dead) {
            if (death(o, t, &L, ring, r) < 0 || r->deaths >= o->max_deaths)
                break;
            continue;
        }
        if (fz_now_ms() - last_idle >= o->idle_check_ms) {
            r->idle_pct = fz_check_idle_cpu(&L, &o->live, why, sizeof(why));
            if (r->idle_pct == -EBUSY) {
                fail(r, why);
                break;
            }
            last_idle = fz_now_ms();
        }
    }
    /* the end: the daemon the inputs went to still alive, its descriptors back, quiet, serving
     * (after a death the one running is the replay's: nothing to ask it) */
    if (!r->deaths && L.up && fz_live_dead(&L))
        death(o, t, &L, ring, r);
    if (!r->deaths && L.up) {
        if (fz_check_fds(&L, &o->live, 2000, why, sizeof(why)) < 0)
            fail(r, why);
        r->idle_pct = fz_check_idle_cpu(&L, &o->live, why, sizeof(why));
        if (r->idle_pct == -EBUSY)
            fail(r, why);
        r->serving = fz_check_serving(&L, &o->live, why, sizeof(why)) == 0;
        if (!r->serving)
            fail(r, why);
        r->last_fds = fz_fd_count(L.d.pid);
        if (!r->serving && gone(&L))
            death(o, t, &L, ring, r);
    }
    if (!r->deaths)
        r->max_fds = L.max_fds;
    r->secs = (double)(fz_now_ms() - t0) / 1000.0;
    r->corpus = c.n;
    fz_live_stop(&L);
    if (ring)
        ring_clear(ring);
    free(ring);
    if (memfd >= 0)
        close(memfd);
    fz_corpus_done(&c);
    return 0;
}

static void print_report(const report_t *r)
{
    const batch_stats_t *s = &r->s;
    char idle[16] = "n/a", last[16] = "n/a";
    if (r->idle_pct >= 0)
        snprintf(idle, sizeof(idle), "%d%%", r->idle_pct);
    if (r->last_fds >= 0)
        snprintf(last, sizeof(last), "%d", r->last_fds);
    printf("fuzz-sockets: %-7s %s  %" PRIu64 " inputs in %.1f s (%.0f/s), %u death%s, fds %d at "
           "start, max %d, end %s, idle cpu %s, at the end: %s; corpus %u (%u seeds)\n",
           r->t->name, r->failed ? "FAIL" : "ok  ", s->inputs, r->secs,
           r->send_secs > 0 ? (double)s->inputs / r->send_secs : 0.0, r->deaths,
           r->deaths == 1 ? "" : "s", r->baseline_fds, r->max_fds, last, idle,
           r->deaths    ? "died"
           : r->serving ? "serving"
                        : "NOT serving",
           r->corpus, r->seeds);
    printf("              connections: %" PRIu64 " ok, %" PRIu64 " refused, %" PRIu64
           " busy, %" PRIu64 " timed out, %" PRIu64 " failed; ended: %" PRIu64 " by us, %" PRIu64
           " closed by patd, %" PRIu64 " reset, %" PRIu64 " still open after --wait-ms; %" PRIu64
           " sends cut short; %" PRIu64 " DRAINs made STATUS\n",
           s->conn[FZ_C_OK], s->conn[FZ_C_REFUSED], s->conn[FZ_C_BUSY], s->conn[FZ_C_TIMEOUT],
           s->conn[FZ_C_ERROR], s->ends[FZ_E_NONE], s->ends[FZ_E_EOF], s->ends[FZ_E_RESET],
           s->ends[FZ_E_TIMEOUT], s->send_err, s->rewritten);
    if (r->failed)
        printf("              %s\n", r->why);
    fflush(stdout);
}

/* ------------------------------------------------------------------ other modes */
/* --replay FILE: one input, --repeat times, against a fresh daemon; 0 when it survives with its
 * descriptors back and still serving, 1 otherwise. */
static int replay(const opts_t *o, const fz_target_t *t)
{
    uint8_t *in = NULL;
    int n = fz_file_read(o->replay, o->max_len, &in);
    if (n < 0) {
        fprintf(stderr, "fuzz_sockets: %s: %s\n", o->replay, strerror(-n));
        return 2;
    }
    const size_t nl = strlen(o->replay);
    if (nl > 4 && !strcmp(o->replay + nl - 4, ".raw")) { /* raw wire bytes: the seed mode */
        uint8_t *w = malloc((size_t)n + 2);
        if (!w)
            abort();
        w[0] = FZ_MODE_SEED;
        w[1] = 0;
        memcpy(w + 2, in, (size_t)n);
        free(in);
        in = w;
        n += 2;
    }
    fz_live_t L;
    if (fz_live_start(&L, &o->live) < 0)
        return 2;
    char mode[160], why[640] = "";
    fz_mode_describe(t, in, (size_t)n, mode, sizeof(mode));
    printf("replay: %s, %d bytes (%s), %" PRIu64 " time(s); patd pid %d, %d fds\n", t->name, n,
           mode, o->repeat, (int)L.d.pid, L.baseline_fds);
    print_hex(stdout, in, (size_t)n);
    const int memfd = (int)memfd_create("fuzz-sockets", MFD_CLOEXEC);
    fz_wire_opts_t wo = {(uint32_t)o->connect_ms, (uint32_t)o->send_ms, (uint32_t)o->wait_ms,
                         memfd};
    int bad = 0;
    uint64_t i = 0;
    for (; i < o->repeat && !g_stop; i++) {
        fz_outcome_t out;
        fz_wire_run(t, &L.ep, in, (size_t)n, &wo, &out);
        if (fz_live_dead(&L))
            break;
    }
    fz_sleep_ms(200);
    if (fz_live_dead(&L)) {
        char how[128];
        fz_describe_status(L.exit_status, how, sizeof(how));
        printf("replay: patd %s after %" PRIu64 " run(s)\n", how, i + (i < o->repeat));
        fz_live_log_tail(&L, 8);
        bad = 1;
    } else {
        const int now = fz_fd_count(L.d.pid);
        printf("replay: patd alive; %d fds at start, %d now\n", L.baseline_fds, now);
        if (fz_check_fds(&L, &o->live, 2000, why, sizeof(why)) < 0 ||
            fz_check_serving(&L, &o->live, why, sizeof(why)) < 0) {
            printf("replay: %s\n", why);
            bad = 1;
        } else {
            printf("replay: descriptors back within --fd-slack, serving\n");
        }
    }
    if (memfd >= 0)
        close(memfd);
    fz_live_stop(&L);
    free(in);
    return bad;
}

typedef struct seed_write {
    const opts_t *o;
    const fz_target_t *t;
    int n;
} seed_write_t;

/* FZ_MODE_SEED seeds as raw wire bytes (<socket>-<name>.raw), others as whole inputs (.in) */
static void write_seed(void *ud, const char *name, const uint8_t *raw, size_t len, uint8_t mode,
                       uint8_t param, int hostile)
{
    seed_write_t *w = ud;
    char path[512];
    const int whole = mode != FZ_MODE_SEED || param;
    snprintf(path, sizeof(path), "%s/%s-%s.%s", w->o->write_seeds, w->t->name, name,
             whole ? "in" : "raw");
    uint8_t *in = malloc(len + 2);
    if (!in)
        abort();
    in[0] = mode;
    in[1] = param;
    memcpy(in + 2, raw, len);
    const int rc = whole ? fz_file_write(path, in, len + 2) : fz_file_write(path, raw, len);
    free(in);
    if (rc < 0)
        fprintf(stderr, "fuzz_sockets: %s: %s\n", path, strerror(-rc));
    else
        w->n++;
}

/* --write-seeds DIR: the built-in seeds, hostile ones too, as <socket>-<name>.raw (the model in
 * HELLOs is a default patd's: one is started to ask) */
static int write_seeds(const opts_t *o)
{
    if (mkdir(o->write_seeds, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz_sockets: %s: %s\n", o->write_seeds, strerror(errno));
        return 2;
    }
    fz_live_t L;
    if (fz_live_start(&L, &o->live) < 0)
        return 2;
    int n = 0;
    for (size_t i = 0; i < fz_n_targets; i++) {
        seed_write_t w = {o, &fz_targets[i], 0};
        fz_seeds_builtin(&fz_targets[i], &L.model, write_seed, &w);
        n += w.n;
    }
    fz_live_stop(&L);
    printf("fuzz-sockets: %d seeds written to %s\n", n, o->write_seeds);
    return 0;
}

/* ------------------------------------------------------------------ main */
static void at_exit(void)
{
    for (int j = 0; j < FZ_MAX_JOBS; j++)
        if (g_children[j] > 0)
            kill(g_children[j], SIGKILL);
    fz_live_cleanup(); /* kills the daemon, removes its runtime directory */
}

int main(int argc, char **argv)
{
    opts_t o;
    if (opts_parse(&o, argc, argv) < 0) {
        usage(stderr);
        return 2;
    }
    if (o.help) {
        usage(stdout);
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    atexit(at_exit);
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (o.write_seeds)
        return write_seeds(&o);
    if (o.replay) {
        const fz_target_t *t = fz_target_find(o.targets);
        if (!t) {
            fprintf(stderr, "fuzz_sockets: --replay needs one --target (sock, events, ...)\n");
            return 2;
        }
        return replay(&o, t);
    }
    if (!o.inputs && !o.seconds) {
        fprintf(stderr, "fuzz_sockets: --inputs or --seconds must bound the run\n");
        return 2;
    }
    const fz_target_t *sel[8];
    size_t n_sel = 0;
    char *list = strdup(o.targets); /* the default is a string literal */
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && n_sel < 8;
         tok = strtok_r(NULL, ",", &save)) {
        if (!(sel[n_sel++] = fz_target_find(tok))) {
            fprintf(stderr, "fuzz_sockets: no socket '%s'\n", tok);
            return 2;
        }
    }
    printf("fuzz-sockets: seed %" PRIu64 ", %s%" PRIu64 " s and %s%" PRIu64
           " inputs per socket, %" PRIu64 " job(s), wait %" PRIu64 " ms, corpus %s\n",
           o.seed, o.seconds ? "" : "no limit: ", o.seconds, o.inputs ? "" : "no limit: ", o.inputs,
           o.jobs, o.wait_ms, o.corpus ? o.corpus : "(built-in seeds only)");
    fz_dict_t dict;
    fz_dict_init(&dict);
    report_t rep[8];
    int passed = 0, failed = 0;
    for (size_t i = 0; i < n_sel && !g_stop; i++) {
        fuzz_target(&o, sel[i], &dict, &rep[i]);
        print_report(&rep[i]);
        rep[i].failed ? failed++ : passed++;
    }
    fz_dict_done(&dict);
    if (g_stop)
        printf("fuzz-sockets: stopped by signal %d\n", (int)g_stop);
    printf("fuzz-sockets: %d passed, %d failed\n", passed, failed);
    return failed || g_stop ? 1 : 0;
}
