/*
 * test_limits.c — one client cannot hurt another at the door: real patd processes on the cpu
 * backend, and client processes exec'd from this program (`test_limits --child ROLE ...`, so that
 * no nanomsg state crosses a fork), some of them as other users (they setuid first).
 *
 *   test_burst           PATD_BURST_ROUNDS rounds (default and CI: 100, the target; about
 *                        30 s on 2 cores) of PATD_BURST_CLIENTS (default 64) client processes of
 *                        one uid released at once: each connects, pings, runs one checked step
 *                        and closes. Every connect must succeed, while a bystander session steps
 *                        with every output row checked against float64. More clients than patd
 *                        lets wait on its admin socket (PATD_BURST_CLIENTS=200) exercise libpat's
 *                        HELLO retry too.
 *   test_uid_share       the shipped systemd/patd.conf's limits: one uid opens sessions until it
 *                        is refused (-EMFILE at limits.conns_per_uid, which must not be 0), a
 *                        third uid still gets in, the bystander (a second uid) steps on; the
 *                        refusals are logged, at most one line a second with a count of the rest.
 *   test_staging_budget  limits.staging_mb (here under its old name, [gpu] staging_mb) on the cpu
 *                        backend: HELLOs past it are refused with -ENOBUFS (its own code: what
 *                        libpat prints says staging, never "KV pool out of blocks") naming the
 *                        option and the numbers, patd lives, earlier sessions step, and a closed
 *                        session's share comes back.
 *   test_cgroup_memory   patd in a cgroup with a memory limit (v2 memory.max, or v1's
 *                        memory.limit_in_bytes where only v1 has the memory controller): sessions
 *                        are opened until one is refused with -ENOMEM, and patd is alive (not
 *                        OOM-killed). Skipped, saying why, where no such cgroup can be made.
 *
 * Child processes talk to the test over two pipes: fd 3, whose end of file releases a burst
 * client or stops a bystander or hog, and fd 4, on which they write rec_t records (each one
 * write below PIPE_BUF: atomic, so many children share one pipe).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"

static const pat_model_t MODEL = {2, 8, 2, 64, PAT_F16, 16, 11};
#define MODEL_ARGS "--layers=2", "--q-heads=8", "--kv-heads=2", "--head-dim=64", "--model-id=11"

#define BURST       64   /* frontends of one uid started together (the target) */
#define BURST_MOST  256  /* PATD_BURST_CLIENTS at most (max_conns below holds them) */
#define UID_HOG     4201 /* users with no passwd entry: the kernel's uid is all patd sees */
#define UID_BYSTAND 4202
#define UID_OTHER   4203

typedef struct rec {
    char kind;        /* 'R' ready (started; a bystander or hog: working), 'D' done */
    int32_t idx, rc;  /* the child's index; its result (0 or a negative errno) */
    uint32_t n;       /* steps run (bystander), sessions opened (hog) */
    uint32_t refused; /* hog: later HELLOs refused with the same code */
    uint32_t ms;      /* since the child's first record */
    double worst;     /* largest relative error of a checked row */
    char why[200];
} rec_t;
_Static_assert(sizeof(rec_t) < 512, "one atomic pipe write (PIPE_BUF >= 512)");

static tl_daemon_t D;
static char cg_dir[256]; /* test_cgroup_memory's cgroup, "" when none */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------ the children */

static void send_rec(char kind, int idx, int rc, uint32_t n, uint32_t refused, double worst,
                     const char *why)
{
    static uint64_t t0;
    rec_t r;
    memset(&r, 0, sizeof(r));
    if (!t0)
        t0 = now_ms();
    r.ms = (uint32_t)(now_ms() - t0);
    r.kind = kind;
    r.idx = idx;
    r.rc = rc;
    r.n = n;
    r.refused = refused;
    r.worst = worst;
    snprintf(r.why, sizeof(r.why), "%s", why ? why : "");
    if (write(4, &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(3);
}

/* Blocks until the test closes its end of fd 3. */
static void wait_eof(void)
{
    char b;
    for (ssize_t k = 1; k != 0;)
        if ((k = read(3, &b, 1)) < 0 && errno != EINTR)
            break;
}

/* 1 when the test has closed its end of fd 3 (stop). */
static int stopped(void)
{
    struct pollfd p = {3, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

static int child_connect(const char *sock, uint32_t max_batch_tokens, const char *label,
                         pat_conn_t **ret, char *why, size_t why_len)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = max_batch_tokens,
                            .max_seqs = 4,
                            .timeout_ms = 30000,
                            .socket = sock,
                            .label = label,
                            .model = MODEL};
    return pat_connect(&o, ret, why, why_len);
}

/* One sequence of n private tokens opened and one checked step over all of them. */
static int one_step(pat_conn_t *c, uint64_t seed, uint32_t n, double *ret_worst)
{
    tl_rng_t rng;
    tl_rng_seed(&rng, seed);
    tl_seq_t s, *ps = &s;
    tl_seq_init(&s);
    for (uint32_t t = 0; t < n; t++)
        tl_seq_push(&s, (uint32_t)tl_rng_below(&rng, 1u << 20));
    tl_step_result_t r = {0};
    int rc = tl_seq_open(c, &s);
    if (rc == 0)
        rc = tl_client_step(c, &MODEL, &ps, 1, &rng, 1, &r);
    if (rc == 0)
        rc = pat_seq_close(c, s.seq);
    tl_seq_done(&s);
    *ret_worst = r.worst;
    return rc;
}

/* burst: ready, wait for the release, then connect, ping, one checked step, close. */
static int child_burst(const char *sock, int idx)
{
    send_rec('R', idx, 0, 0, 0, 0, NULL);
    wait_eof();
    char why[256] = "";
    pat_conn_t *c = NULL;
    double worst = 0;
    int rc = child_connect(sock, 32, "burst", &c, why, sizeof(why));
    if (rc == 0 && (rc = pat_ping(c)) == 0)
        rc = one_step(c, (uint64_t)getpid(), 20, &worst);
    if (rc < 0 && c)
        snprintf(why, sizeof(why), "%s", pat_last_error(c));
    if (rc == 0 && worst >= 1e-2) {
        rc = -EIO;
        snprintf(why, sizeof(why), "row error %.3g", worst);
    }
    pat_close(c);
    send_rec('D', idx, rc, 1, 0, worst, why);
    return 0;
}

/* bystander: one session, two sequences, checked decode steps until stopped (or an error). */
static int child_bystander(const char *sock, int idx)
{
    char why[256] = "";
    pat_conn_t *c = NULL;
    int rc = child_connect(sock, 128, "bystander", &c, why, sizeof(why));
    if (rc < 0) {
        send_rec('R', idx, rc, 0, 0, 0, why);
        return 0;
    }
    tl_rng_t rng;
    tl_rng_seed(&rng, 4242);
    tl_seq_t s[2], *ps[2] = {&s[0], &s[1]};
    for (int i = 0; i < 2; i++)
        tl_seq_init(&s[i]);
    uint32_t steps = 0;
    double worst = 0;
    tl_step_result_t r;
    while (rc == 0 && !(steps > 0 && stopped())) {
        if (steps % 32 == 0) { /* keep them short: start over */
            for (int i = 0; i < 2 && rc == 0; i++) {
                if (steps)
                    rc = pat_seq_close(c, s[i].seq);
                tl_seq_done(&s[i]);
                tl_seq_init(&s[i]);
                for (uint32_t t = 0; t < 30 + (uint32_t)i * 7; t++)
                    tl_seq_push(&s[i], (uint32_t)tl_rng_below(&rng, 1u << 20));
                if (rc == 0)
                    rc = tl_seq_open(c, &s[i]);
            }
        } else {
            for (int i = 0; i < 2; i++)
                tl_seq_push(&s[i], 70000 + steps * 2 + (uint32_t)i);
        }
        if (rc == 0)
            rc = tl_client_step(c, &MODEL, ps, 2, &rng, 1, &r);
        if (rc == 0) {
            worst = PAT_MAX(worst, r.worst);
            if (steps++ == 0)
                send_rec('R', idx, 0, steps, 0, worst, NULL);
        }
    }
    if (rc < 0)
        snprintf(why, sizeof(why), "%s", pat_last_error(c));
    if (steps == 0)
        send_rec('R', idx, rc, 0, 0, worst, why);
    pat_close(c);
    for (int i = 0; i < 2; i++)
        tl_seq_done(&s[i]);
    send_rec('D', idx, rc, steps, 0, worst, why);
    return 0;
}

/* hog: sessions until refused ('R': how many, the refusal), then 20 more HELLOs at once and one
 * more 1.1 s later ('D': how many of those were refused alike); holds them until stopped. */
static int child_hog(const char *sock, int idx)
{
    enum { MOST = 128 };
    pat_conn_t *c[MOST];
    char why[256] = "", why2[256];
    uint32_t n = 0, refused = 0;
    int rc = 0;
    while (n < MOST && (rc = child_connect(sock, 64, "hog", &c[n], why, sizeof(why))) == 0)
        n++;
    send_rec('R', idx, rc, n, 0, 0, why);
    for (int k = 0; k < 21; k++) {
        if (k == 20)
            usleep(1100 * 1000); /* past the refusal log's one-line-a-second window */
        pat_conn_t *x = NULL;
        int r2 = child_connect(sock, 64, "hog", &x, why2, sizeof(why2));
        refused += r2 == rc;
        pat_close(x);
    }
    send_rec('D', idx, rc, n, refused, 0, why);
    wait_eof();
    for (uint32_t i = 0; i < n; i++)
        pat_close(c[i]);
    return 0;
}

/* one: connect, one checked step, close. */
static int child_one(const char *sock, int idx)
{
    char why[256] = "";
    pat_conn_t *c = NULL;
    double worst = 0;
    int rc = child_connect(sock, 64, "other", &c, why, sizeof(why));
    if (rc == 0 && (rc = one_step(c, 99, 40, &worst)) < 0)
        snprintf(why, sizeof(why), "%s", pat_last_error(c));
    pat_close(c);
    send_rec('D', idx, rc, 1, 0, worst, why);
    return 0;
}

static const struct {
    const char *role;
    int (*fn)(const char *sock, int idx);
} roles[] = {
    {"burst", child_burst},
    {"bystander", child_bystander},
    {"hog", child_hog},
    {"one", child_one},
};

/* test_limits --child ROLE SOCKET INDEX UID */
static int child_main(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    uid_t uid = (uid_t)strtoul(argv[5], NULL, 10);
    if (uid && (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)) {
        send_rec('R', atoi(argv[4]), -errno, 0, 0, 0, "setuid failed");
        return 1;
    }
    for (size_t i = 0; i < PAT_ARRAY_SIZE(roles); i++)
        if (!strcmp(argv[2], roles[i].role))
            return roles[i].fn(argv[3], atoi(argv[4]));
    return 2;
}

/* ------------------------------------------------------------------ the test's side */

typedef struct child {
    pid_t pid;
    int go;  /* our end of its fd 3: closing it releases or stops the child */
    int rep; /* our end of its fd 4 (shared by the children of one burst) */
} child_t;

/* Starts `test_limits --child role` as uid (0: ours) with go_rd as its fd 3 and rep_wr as fd 4. */
static pid_t spawn_child(const char *role, int idx, uid_t uid, int go_rd, int rep_wr)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int g = fcntl(go_rd, F_DUPFD, 10), r = fcntl(rep_wr, F_DUPFD, 10);
        if (g < 0 || r < 0 || dup2(g, 3) < 0 || dup2(r, 4) < 0)
            _exit(127);
        close_range(5, ~0u, 0);
        char si[16], su[16];
        snprintf(si, sizeof(si), "%d", idx);
        snprintf(su, sizeof(su), "%u", (unsigned)uid);
        execl("/proc/self/exe", "test_limits", "--child", role, D.sock, si, su, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static child_t child_start(const char *role, int idx, uid_t uid)
{
    int go[2], rep[2];
    assert_int_equal(pipe2(go, O_CLOEXEC), 0);
    assert_int_equal(pipe2(rep, O_CLOEXEC), 0);
    child_t c = {spawn_child(role, idx, uid, go[0], rep[1]), go[1], rep[0]};
    close(go[0]);
    close(rep[1]);
    return c;
}

/* The next record on fd, within timeout_ms (fails the test otherwise). */
static rec_t rec_read(int fd, uint32_t timeout_ms, const char *what)
{
    rec_t r;
    size_t got = 0;
    uint64_t end = now_ms() + timeout_ms;
    while (got < sizeof(r)) {
        uint64_t now = now_ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (now >= end || poll(&p, 1, (int)(end - now)) == 0)
            fail_msg("%s: no report within %u ms", what, timeout_ms);
        ssize_t k = read(fd, (char *)&r + got, sizeof(r) - got);
        if (k == 0)
            fail_msg("%s: the child exited without reporting", what);
        if (k > 0)
            got += (size_t)k;
    }
    return r;
}

/* Stops the child (end of file on its fd 3), reads its 'D' record, reaps it. */
static rec_t child_stop(child_t *c, const char *what)
{
    close(c->go);
    rec_t r = rec_read(c->rep, 60000, what);
    close(c->rep);
    int st;
    waitpid(c->pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s exited with status %d", what, st);
    return r;
}

/* A bystander as uid, stepping (its first checked step done) when this returns. */
static child_t bystander_start(uid_t uid)
{
    child_t b = child_start("bystander", 0, uid);
    rec_t r = rec_read(b.rep, 30000, "bystander start");
    if (r.kind != 'R' || r.rc < 0)
        fail_msg("bystander: %s: %s", pat_strerror(r.rc), r.why);
    return b;
}

/* Stops the bystander and checks what it saw: no error, more steps than before, rows right. */
static void bystander_check(child_t *b)
{
    rec_t r = child_stop(b, "bystander");
    printf("bystander: %u checked steps, worst row error %.2e\n", r.n, r.worst);
    if (r.rc < 0)
        fail_msg("bystander failed after %u steps: %s: %s", r.n, pat_strerror(r.rc), r.why);
    assert_true(r.n > 1);
    assert_true(r.worst < 1e-2);
}

static void daemon_alive(void)
{
    int st;
    if (waitpid(D.pid, &st, WNOHANG) == D.pid) {
        D.pid = 0;
        fail_msg("patd is gone: %s %d (log %s)",
                 WIFSIGNALED(st) ? "killed by signal" : "exited with", st, D.log);
    }
    assert_true(tl_daemon_status(&D, "pid") == D.pid);
}

/* Lines of the daemon's log holding needle (and, if needle2, that too). */
static int log_lines(const char *needle, const char *needle2)
{
    FILE *f = fopen(D.log, "r");
    assert_non_null(f);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) && (!needle2 || strstr(line, needle2));
    fclose(f);
    return n;
}

static void daemon_done(void)
{
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&D, SIGTERM, 10000), 0);
    tl_daemon_stop(&D);
}

/* ------------------------------------------------------------------ test_burst */

static void test_burst(void **state)
{
    const char *env = getenv("PATD_BURST_ROUNDS"), *envc = getenv("PATD_BURST_CLIENTS");
    const int rounds = env ? atoi(env) : 100;
    const int n = envc ? PAT_MIN(PAT_MAX(atoi(envc), 1), BURST_MOST) : BURST;
    static const char *const args[] = {MODEL_ARGS, "--max-conns=512", NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    child_t by = bystander_start(0);
    uint32_t failed = 0;
    uint64_t t0 = now_ms(), slowest = 0;
    for (int round = 0; round < rounds; round++) {
        int go[2], rep[2];
        pid_t pid[BURST_MOST];
        assert_int_equal(pipe2(go, O_CLOEXEC), 0);
        assert_int_equal(pipe2(rep, O_CLOEXEC), 0);
        for (int i = 0; i < n; i++)
            pid[i] = spawn_child("burst", i, 0, go[0], rep[1]);
        close(go[0]);
        close(rep[1]);
        for (int i = 0; i < n; i++) /* all started and waiting */
            rec_read(rep[0], 60000, "burst client start");
        uint64_t t = now_ms();
        close(go[1]); /* released together */
        uint32_t bad = 0;
        for (int i = 0; i < n; i++) {
            rec_t r = rec_read(rep[0], 120000, "burst client");
            if (r.rc < 0 && bad++ < 3)
                printf("round %d client %d: %s: %s\n", round, r.idx, pat_strerror(r.rc), r.why);
        }
        slowest = PAT_MAX(slowest, now_ms() - t);
        for (int i = 0; i < n; i++)
            waitpid(pid[i], NULL, 0);
        close(rep[0]);
        if (bad)
            printf("round %d: %u of %d clients failed\n", round, bad, n);
        failed += bad;
    }
    printf("burst: %d rounds of %d clients of one uid: %u of %d connects+steps failed; "
           "slowest round %.2f s, all %.1f s\n",
           rounds, n, failed, rounds * n, slowest / 1e3, (now_ms() - t0) / 1e3);
    bystander_check(&by);
    assert_int_equal(failed, 0);
    assert_int_equal(tl_daemon_status(&D, "connections"), 0);
    daemon_done();
}

/* ------------------------------------------------------------------ test_uid_share */

/* The shipped config's value of [section] key, or -1. */
static long shipped_value(const char *path, const char *section, const char *key)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512], sec[64] = "";
    long v = -1;
    while (fgets(line, sizeof(line), f)) {
        char k[64], val[64];
        if (sscanf(line, " [%63[^]]]", sec) == 1)
            continue;
        if (sscanf(line, " %63[a-z_] = %63s", k, val) == 2 && !strcmp(sec, section) &&
            !strcmp(k, key))
            v = strtol(val, NULL, 0);
    }
    fclose(f);
    return v;
}

static void test_uid_share(void **state)
{
    if (geteuid() != 0) {
        printf("test_uid_share skipped: clients of other users need root (setuid)\n");
        skip();
    }
    const char *conf =
        getenv("PATD_SHIPPED_CONF") ? getenv("PATD_SHIPPED_CONF") : "systemd/patd.conf";
    const long per_uid = shipped_value(conf, "limits", "conns_per_uid");
    const long max_conns = shipped_value(conf, "limits", "max_conns");
    printf("%s: limits.max_conns %ld, limits.conns_per_uid %ld\n", conf, max_conns, per_uid);
    if (per_uid <= 0)
        fail_msg("%s leaves limits.conns_per_uid at %ld: one user can fill the session table", conf,
                 per_uid);
    /* the shipped file as systemd starts it, but a small model and pool for this machine, the
     * cpu backend, and sockets every test user may reach (other users are the point) */
    const char *args[] = {
        "--config",        conf, MODEL_ARGS, "--backend=cpu", "--blocks=1024", "--socket-mode=0666",
        "--socket-group=", NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    assert_int_equal(chmod(D.dir, 0755), 0);
    child_t by = bystander_start(UID_BYSTAND);

    child_t hog = child_start("hog", 1, UID_HOG);
    rec_t r = rec_read(hog.rep, 60000, "hog");
    printf("uid %d: %u sessions, then %s: %s\n", UID_HOG, r.n, pat_strerror(r.rc), r.why);
    assert_int_equal(r.rc, -EMFILE);
    assert_int_equal(r.n, per_uid);
    assert_non_null(strstr(r.why, "conns_per_uid"));

    child_t other = child_start("one", 2, UID_OTHER);
    rec_t o = child_stop(&other, "a third user");
    if (o.rc < 0)
        fail_msg("uid %d was kept out while uid %d held its share: %s: %s", UID_OTHER, UID_HOG,
                 pat_strerror(o.rc), o.why);
    assert_true(o.worst < 1e-2);

    rec_t h = child_stop(&hog, "hog"); /* its later HELLOs, then it closes its sessions */
    assert_int_equal(h.refused, 21);
    bystander_check(&by);

    /* 22 refusals over about 1.1 s (h.ms): the first logged, those within a second of it
     * counted, the last logged with that count: a line a second at most */
    const int lines = log_lines("refused a HELLO (limits.conns_per_uid)", NULL);
    const int counted = log_lines("refused a HELLO (limits.conns_per_uid)", "more since");
    printf("refusal log: %d lines for 22 refusals in %.2f s, %d with a count of the ones not "
           "logged\n",
           lines, h.ms / 1e3, counted);
    assert_true(lines >= 2 && lines <= 2 + (int)(h.ms / 1000));
    assert_true(counted >= 1);
    daemon_done();
}

/* ------------------------------------------------------------------ HELLOs until refused */

typedef struct opened {
    pat_conn_t *c[64];
    uint32_t n;
    int rc; /* the refusal */
    char why[256];
} opened_t;

/* Sessions of max_batch_tokens (the test's own, uid 0) until one is refused or `most` opened. */
static void open_until_refused(opened_t *o, uint32_t max_batch_tokens, uint32_t most)
{
    memset(o, 0, sizeof(*o));
    pat_connect_opts_t opts = {.size = sizeof(opts),
                               .max_batch_tokens = max_batch_tokens,
                               .max_seqs = 4,
                               .timeout_ms = 30000,
                               .socket = D.sock,
                               .label = "until-refused",
                               .model = MODEL};
    while (o->n < most && o->n < PAT_ARRAY_SIZE(o->c) &&
           (o->rc = pat_connect(&opts, &o->c[o->n], o->why, sizeof(o->why))) == 0)
        o->n++;
    printf("%u sessions of %u batch tokens, then %s: %s\n", o->n, max_batch_tokens,
           o->rc < 0 ? pat_strerror(o->rc) : "none refused", o->why);
}

/* Every session of o runs one checked step. */
static void opened_step(opened_t *o)
{
    for (uint32_t i = 0; i < o->n; i++) {
        double worst = 1;
        int rc = one_step(o->c[i], 500 + i, 24, &worst);
        if (rc < 0)
            fail_msg("session %u after the refusal: %s: %s", i, pat_strerror(rc),
                     pat_last_error(o->c[i]));
        assert_true(worst < 1e-2);
    }
}

static void opened_close(opened_t *o)
{
    for (uint32_t i = 0; i < o->n; i++)
        pat_close(o->c[i]);
    o->n = 0;
}

/* ------------------------------------------------------------------ test_staging_budget */

static void test_staging_budget(void **state)
{
    /* 64 MiB under the budget's old name: a bystander's 64 rows and six sessions of 4096 (Q, K,
     * V and O rows of 8 and 2 heads of 64 f16: 10,489,856 bytes each) fit, the seventh not */
    char conf[] = "/tmp/patd-budget.XXXXXX";
    int fd = mkstemp(conf);
    assert_true(fd >= 0);
    static const char text[] = "[gpu]\nstaging_mb = 64\n";
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
    close(fd);
    const char *args[] = {"--config", conf, MODEL_ARGS, NULL};
    assert_int_equal(tl_daemon_start(&D, args), 0);
    child_t by = bystander_start(0);

    opened_t o;
    open_until_refused(&o, 4096, 24);
    assert_int_equal(o.rc, -ENOBUFS);
    assert_int_equal(o.n, 6);
    assert_non_null(strstr(o.why, "limits.staging_mb"));
    /* what a frontend prints (pat_strerror, then why) says staging, not the KV pool */
    const char *said = pat_strerror(o.rc);
    printf("a staging refusal prints: %s: %s\n", said, o.why);
    assert_non_null(strstr(said, "staging"));
    assert_null(strstr(said, "out of blocks"));
    assert_null(strstr(o.why, "out of blocks"));
    assert_non_null(strstr(o.why, "67108864")); /* the budget, in bytes */
    assert_non_null(strstr(o.why, "10489856")); /* what this HELLO asked for */
    daemon_alive();
    opened_step(&o);
    assert_int_equal(log_lines("refused a HELLO (limits.staging_mb)", NULL), 1);

    /* a closed session's share is free again */
    pat_close(o.c[--o.n]);
    opened_t more;
    open_until_refused(&more, 4096, 1);
    assert_int_equal(more.n, 1);
    opened_close(&more);
    opened_close(&o);
    bystander_check(&by);
    daemon_done();
    unlink(conf);
}

/* ------------------------------------------------------------------ test_cgroup_memory */

/* Where a memory limit can be set on a child cgroup: cgroup v2 (the memory controller enabled
 * for the children of its root) or v1's memory hierarchy. */
static const struct {
    const char *root;    /* the hierarchy's mount */
    const char *enabled; /* file of the root that says the memory controller is there */
    const char *needle;  /* ... when it holds this ("" : when it exists) */
    const char *limit;   /* the limit file in a child */
} cg_kinds[] = {
    {"/sys/fs/cgroup", "cgroup.subtree_control", "memory", "memory.max"},
    {"/sys/fs/cgroup/unified", "cgroup.subtree_control", "memory", "memory.max"},
    {"/sys/fs/cgroup/memory", "memory.limit_in_bytes", "", "memory.limit_in_bytes"},
};

/* Makes a child cgroup with a memory limit of `limit` bytes: 0 and its directory, or -1 and
 * why not into why. */
static int cg_make(uint64_t limit, char *dir, size_t len, char *why, size_t why_len)
{
    snprintf(why, why_len, "no cgroup hierarchy with the memory controller is mounted");
    for (size_t i = 0; i < PAT_ARRAY_SIZE(cg_kinds); i++) {
        char p[512], buf[512] = "";
        snprintf(p, sizeof(p), "%s/%s", cg_kinds[i].root, cg_kinds[i].enabled);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        size_t k = fread(buf, 1, sizeof(buf) - 1, f);
        buf[k] = 0;
        fclose(f);
        if (!strstr(buf, cg_kinds[i].needle)) {
            snprintf(why, why_len, "%.200s does not enable the memory controller ('%.100s')", p,
                     buf);
            continue;
        }
        snprintf(dir, len, "%s/patd-test-%d", cg_kinds[i].root, (int)getpid());
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
            snprintf(why, why_len, "mkdir %.300s: %s", dir, strerror(errno));
            continue;
        }
        snprintf(p, sizeof(p), "%s/%s", dir, cg_kinds[i].limit);
        f = fopen(p, "w");
        if (!f || fprintf(f, "%llu\n", (unsigned long long)limit) < 0 || fclose(f) != 0) {
            snprintf(why, why_len, "writing %.300s: %s", p, strerror(errno));
            rmdir(dir);
            continue;
        }
        printf("cgroup %s: %s = %llu\n", dir, cg_kinds[i].limit, (unsigned long long)limit);
        return 0;
    }
    return -1;
}

static void test_cgroup_memory(void **state)
{
    /* 160 MiB for patd: its 8 MiB pool, its own heap and threads, and some 10 MiB sessions */
    char why[512], procs[300];
    if (cg_make(160ull << 20, cg_dir, sizeof(cg_dir), why, sizeof(why)) < 0) {
        printf("test_cgroup_memory skipped: %s\n", why);
        skip();
    }
    snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg_dir);
    static const char *const args[] = {MODEL_ARGS,
                                       "--blocks=512",
                                       "--staging-mb=1048576",
                                       "--conn-max-staging-mb=1024",
                                       "--max-conns=256",
                                       NULL};
    assert_int_equal(tl_daemon_start_in(&D, args, procs), 0);
    child_t by = bystander_start(0);

    opened_t o;
    open_until_refused(&o, 4096, 48);
    daemon_alive(); /* before anything else: the OOM killer is what this test is about */
    assert_int_equal(o.rc, -ENOMEM);
    assert_true(o.n >= 1);
    assert_non_null(strstr(o.why, "memory"));
    opened_step(&o);
    opened_close(&o);
    bystander_check(&by);
    assert_true(log_lines("refused a HELLO (cgroup memory)", NULL) >= 1);
    daemon_done();
}

/* After every test, passed or not: no daemon left running, no cgroup left behind. */
static int teardown(void **state)
{
    if (D.pid > 0)
        tl_daemon_stop(&D);
    for (int i = 0; cg_dir[0] && i < 100 && rmdir(cg_dir) < 0 && errno == EBUSY; i++)
        usleep(20000); /* the killed daemon is still leaving it */
    cg_dir[0] = 0;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--child"))
        return child_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_burst, teardown),
        cmocka_unit_test_teardown(test_uid_share, teardown),
        cmocka_unit_test_teardown(test_staging_budget, teardown),
        cmocka_unit_test_teardown(test_cgroup_memory, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
